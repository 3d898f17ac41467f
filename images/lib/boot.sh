# shellcheck shell=bash disable=SC2034 # the variables set here are used by the sourcing recipe
# Sourced by the image recipes (build-tiny.sh, build-debian.sh): the parts every image boots
# with. Debian's cloud kernel, uncompressed to its PVH ELF where possible; the virtio modules the
# agent loads with finit_module; the kernel command line; a reproducible cpio writer.
# Callers set `set -euo pipefail`, SOURCE_DATE_EPOCH and a die() function first.

# Order matters: each module needs the ones before it (finit_module does not resolve deps).
# virtio_net (after net_failover, after failover): the NIC of sessions with network (--net).
# virtio_input and evdev: the tablet and keyboard of sessions with a display, which the host
# drives (/dev/input/event*); loaded only where a virtio input device is (boot_modules_if).
boot_modules=(virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci
              virtio_console virtio_blk failover net_failover virtio_net virtio_input evdev)
# Modules the agent loads only when the virtio bus has a device of this id (18: input).
declare -A boot_modules_if=([virtio_input]=18 [evdev]=18)
# quiet loglevel=1: console output is slow under emulation. panic=-1: a kernel panic reboots at
# once, which ends the guest when run with -no-reboot (or on_reboot=destroy), instead of a hang. cryptomgr.notests: skip the crypto
# self-tests. 8250.nr_uarts=1, i8042.*: do not probe hardware the guest does not have.
# no_timer_check, tsc=reliable: skip timer sanity checks and the TSC watchdog.
# mitigations=off was measured too: no gain (the TCG CPU is an AMD model, no KPTI).
boot_cmdline="console=ttyS0 quiet loglevel=1 panic=-1 cryptomgr.notests \
8250.nr_uarts=1 i8042.noaux i8042.nokbd i8042.nopnp no_timer_check tsc=reliable"

# Sets boot_kernel (the newest /boot/vmlinuz-*-FLAVOUR, FLAVOUR cloud-amd64 unless given),
# boot_kver and boot_moddir. The desktop image takes Debian's generic kernel (amd64): the cloud
# kernel has no DRM and no framebuffer driver for the VGA.
boot_find_kernel() { # [FLAVOUR]
    local flavour=${1:-cloud-amd64} k
    boot_kernel=
    for k in $(ls /boot/vmlinuz-*-"$flavour" 2>/dev/null | sort -V); do
        # Debian's version numbers hold no "-cloud": a generic kernel's name never ends so.
        [ "$flavour" = cloud-amd64 ] || [ "${k%-cloud-amd64}" = "$k" ] || continue
        boot_kernel=$k
    done
    [ -n "$boot_kernel" ] ||
        die "no /boot/vmlinuz-*-$flavour (install linux-image-${flavour})"
    boot_kver=${boot_kernel#/boot/vmlinuz-}
    boot_moddir=/lib/modules/$boot_kver/kernel
}

# Writes the ELF inside a bzImage to $2, as the kernel's scripts/extract-vmlinux does: find a
# compressed stream by its magic and decompress it (trailing bytes make the tools complain, so
# the result is checked instead). Succeeds only for an ELF with a PVH entry note (type 0x12).
boot_extract_vmlinux() {
    local magic tool off
    for pair in '\x02\x21\x4c\x18:lz4 -dc' '\x28\xb5\x2f\xfd:zstd -qdc' \
        '\xfd\x37\x7a\x58\x5a\x00:xz -qdc' '\x1f\x8b\x08:gzip -qdc'; do
        magic=${pair%%:*} tool=${pair#*:}
        command -v "${tool%% *}" >/dev/null || continue
        for off in $(LC_ALL=C grep -obUaP "$magic" "$1" | head -n 3 | cut -d: -f1); do
            tail -c +$((off + 1)) "$1" | $tool >"$2" 2>/dev/null || true
            if readelf -n "$2" 2>/dev/null | grep -q 'Unknown note type: (0x00000012)'; then
                return 0
            fi
        done
    done
    return 1
}

# Copies boot_modules, uncompressed, into ROOT/lib/modules/KVER and lists them, in load order,
# in ROOT/etc/airlock/modules for the agent's init.
boot_install_modules() { # ROOT
    local root=$1 m src dst
    mkdir -p "$root/lib/modules/$boot_kver" "$root/etc/airlock"
    : >"$root/etc/airlock/modules"
    for m in "${boot_modules[@]}"; do
        src=$(find "$boot_moddir" \( -name "$m.ko" -o -name "$m.ko.xz" -o -name "$m.ko.zst" \) \
            -print -quit)
        [ -n "$src" ] || die "module $m not found under $boot_moddir"
        dst=$root/lib/modules/$boot_kver/$m.ko
        case $src in
        *.xz) xz -dc "$src" >"$dst" ;;
        *.zst) zstd -qdc "$src" >"$dst" ;;
        *) cp "$src" "$dst" ;;
        esac
        echo "${boot_modules_if[$m]:+virtio:${boot_modules_if[$m]} }/lib/modules/$boot_kver/$m.ko" \
            >>"$root/etc/airlock/modules"
    done
}

# Installs the kernel into OUTDIR as vmlinux (PVH ELF) or, failing that or for FORMAT bzimage,
# as vmlinuz; sets boot_kernel_file to the name written. pvh: QEMU enters the uncompressed ELF
# directly through its PVH note, skipping the bzImage's real-mode setup and self-decompression:
# boot to HELLO_ACK took 2.57 s instead of 3.10 s (median of 10 interleaved boots, TCG,
# qemu-system-x86_64 run directly).
boot_install_kernel() { # STAGE OUTDIR FORMAT
    local stage=$1 outdir=$2 format=$3
    rm -f "$outdir/vmlinux" "$outdir/vmlinuz"
    boot_kernel_file=vmlinuz
    if [ "$format" = pvh ] && boot_extract_vmlinux "$boot_kernel" "$stage/vmlinux"; then
        boot_kernel_file=vmlinux
        install -m 0644 "$stage/vmlinux" "$outdir/vmlinux"
    else
        [ "$format" = bzimage ] || echo "no PVH kernel in $boot_kernel, using the bzImage" >&2
        install -m 0644 "$boot_kernel" "$outdir/vmlinuz"
    fi
}

# Fixes modes and mtimes under ROOT, then writes it as a newc cpio to OUT, sorted, owned by
# root, compressed per COMPRESS (none or gzip): same tree, same bytes. Under TCG the kernel
# unpacked a 3 MiB uncompressed cpio in ~85 ms and the gzip -1 one in 140-235 ms; loading the
# bigger file costs QEMU nothing measurable.
boot_write_cpio() { # ROOT OUT COMPRESS
    local root=$1 out=$2
    chmod -R a+rX,go-w "$root"
    [ ! -d "$root/tmp" ] || chmod 1777 "$root/tmp"
    find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
    case $3 in
    none) (cd "$root" && find . -mindepth 1 | LC_ALL=C sort |
        cpio --quiet --reproducible -o -H newc -R 0:0) >"$out" ;;
    gzip) (cd "$root" && find . -mindepth 1 | LC_ALL=C sort |
        cpio --quiet --reproducible -o -H newc -R 0:0) | gzip -1 -n >"$out" ;;
    *) die "AIRLOCK_INITRD_COMPRESS must be none or gzip" ;;
    esac
}

#!/usr/bin/env bash
# Builds the `tiny` guest image from installed Debian packages: the cloud kernel, its virtio
# modules, busybox-static, and the airlock agent as /init. Reproducible: same inputs, same
# bytes (fixed mtimes and owners, sorted cpio, no gzip timestamps).
#
#   images/build-tiny.sh AGENT_BINARY OUTDIR
#
# Writes the kernel (OUTDIR/vmlinux, or OUTDIR/vmlinuz, see below), OUTDIR/initrd.img and
# OUTDIR/manifest.json, all world-readable: QEMU runs as libvirt-qemu and must read them.
set -euo pipefail

if [ $# -ne 2 ]; then
    echo "usage: $0 AGENT_BINARY OUTDIR" >&2
    exit 2
fi
agent=$1
outdir=$2
# Any fixed value does; overridable as usual for reproducible builds.
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-1700000000}
# none or gzip. Under TCG the kernel unpacked the 3 MiB uncompressed cpio in ~85 ms and the
# gzip -1 one in 140-235 ms; loading the bigger file costs QEMU nothing measurable.
compress=${AIRLOCK_INITRD_COMPRESS:-none}
# pvh or bzimage. pvh: the uncompressed ELF kernel, which QEMU enters directly through its PVH
# note, skipping the bzImage's real-mode setup and self-decompression: boot to HELLO_ACK took
# 2.57 s instead of 3.10 s (median of 10 interleaved boots, TCG, qemu-system-x86_64 run
# directly). Falls back to the bzImage when extraction fails.
kernel_format=${AIRLOCK_KERNEL_FORMAT:-pvh}
# Order matters: each module needs the ones before it (finit_module does not resolve deps).
modules=(virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci
         virtio_console virtio_blk)
# quiet loglevel=1: console output is slow under emulation. panic=-1: a kernel panic reboots at
# once, which ends the guest when run with -no-reboot (or on_reboot=destroy), instead of a hang. cryptomgr.notests: skip the crypto
# self-tests. 8250.nr_uarts=1, i8042.*: do not probe hardware the guest does not have.
# no_timer_check, tsc=reliable: skip timer sanity checks and the TSC watchdog.
# mitigations=off was measured too: no gain (the TCG CPU is an AMD model, no KPTI).
cmdline="console=ttyS0 quiet loglevel=1 panic=-1 cryptomgr.notests \
8250.nr_uarts=1 i8042.noaux i8042.nokbd i8042.nopnp no_timer_check tsc=reliable"

die() {
    echo "build-tiny: $*" >&2
    exit 1
}

[ -x "$agent" ] || die "agent '$agent' is not an executable"
busybox=$(command -v busybox) || die "busybox not found (install busybox-static)"
readelf -l "$busybox" | grep -q 'program interpreter' && die "$busybox is not static (install busybox-static)"
kernel=$(ls /boot/vmlinuz-*-cloud-amd64 2>/dev/null | sort -V | tail -n 1)
[ -n "$kernel" ] || die "no /boot/vmlinuz-*-cloud-amd64 (install linux-image-cloud-amd64)"
kver=${kernel#/boot/vmlinuz-}
moddir=/lib/modules/$kver/kernel
agent_version=$("$agent" --version | awk '{print $2}')
[ -n "$agent_version" ] || die "'$agent --version' printed no version"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

# Writes the ELF inside a bzImage to $2, as the kernel's scripts/extract-vmlinux does: find a
# compressed stream by its magic and decompress it (trailing bytes make the tools complain, so
# the result is checked instead). Succeeds only for an ELF with a PVH entry note (type 0x12).
extract_vmlinux() {
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

root=$stage/root
mkdir -p "$root"/{bin,dev,etc/airlock,proc,root,run,sys,tmp,workspace} "$root/lib/modules/$kver"
chmod 1777 "$root/tmp"
# Merged /usr: scripts that say #!/usr/bin/env or /sbin/... find the busybox applets.
ln -s bin "$root/sbin"
mkdir -p "$root/usr"
ln -s ../bin "$root/usr/bin"
ln -s ../bin "$root/usr/sbin"

install -m 0755 "$agent" "$root/init"
# Tests hand in shell scripts as hostile stand-ins for the agent: strip only an ELF.
if readelf -h "$root/init" >/dev/null 2>&1; then
    strip --strip-all "$root/init"
fi
install -m 0755 "$busybox" "$root/bin/busybox"
for applet in $("$busybox" --list); do
    case $applet in busybox | init | linuxrc) continue ;; esac
    ln -s busybox "$root/bin/$applet"
done

for m in "${modules[@]}"; do
    src=$(find "$moddir" \( -name "$m.ko" -o -name "$m.ko.xz" -o -name "$m.ko.zst" \) -print -quit)
    [ -n "$src" ] || die "module $m not found under $moddir"
    dst=$root/lib/modules/$kver/$m.ko
    case $src in
    *.xz) xz -dc "$src" >"$dst" ;;
    *.zst) zstd -qdc "$src" >"$dst" ;;
    *) cp "$src" "$dst" ;;
    esac
    echo "/lib/modules/$kver/$m.ko" >>"$root/etc/airlock/modules"
done

printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\n' >"$root/etc/group"
printf 'airlock\n' >"$root/etc/hostname"

chmod -R a+rX,go-w "$root"
chmod 1777 "$root/tmp"
find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +

mkdir -p "$outdir"
chmod 0755 "$outdir"
cpio_out() {
    (cd "$root" && find . -mindepth 1 | LC_ALL=C sort |
        cpio --quiet --reproducible -o -H newc -R 0:0)
}
case $compress in
none) cpio_out >"$stage/initrd.img" ;;
gzip) cpio_out | gzip -1 -n >"$stage/initrd.img" ;;
*) die "AIRLOCK_INITRD_COMPRESS must be none or gzip" ;;
esac
install -m 0644 "$stage/initrd.img" "$outdir/initrd.img"
rm -f "$outdir/vmlinux" "$outdir/vmlinuz"
kernel_file=vmlinuz
if [ "$kernel_format" = pvh ] && extract_vmlinux "$kernel" "$stage/vmlinux"; then
    kernel_file=vmlinux
    install -m 0644 "$stage/vmlinux" "$outdir/vmlinux"
else
    [ "$kernel_format" = bzimage ] || echo "build-tiny: no PVH kernel in $kernel, using the bzImage" >&2
    install -m 0644 "$kernel" "$outdir/vmlinuz"
fi

cat >"$stage/manifest.json" <<EOF
{
  "name": "tiny",
  "kernel": "$kernel_file",
  "initrd": "initrd.img",
  "disk": null,
  "cmdline": "$cmdline",
  "languages": ["sh"],
  "agent_protocol": 1,
  "agent_version": "$agent_version",
  "memory_mib": 256
}
EOF
install -m 0644 "$stage/manifest.json" "$outdir/manifest.json"

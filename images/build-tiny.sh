#!/usr/bin/env bash
# Builds the `tiny` guest image from installed Debian packages: the cloud kernel, its virtio
# modules, busybox-static, and the airlock agent as /init. Reproducible: same inputs, same
# bytes (fixed mtimes and owners, sorted cpio, no gzip timestamps).
#
#   images/build-tiny.sh AGENT_BINARY OUTDIR
#
# Writes the kernel (OUTDIR/vmlinux, or OUTDIR/vmlinuz, see lib/boot.sh), OUTDIR/initrd.img and
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
# none or gzip (see boot_write_cpio in lib/boot.sh).
compress=${AIRLOCK_INITRD_COMPRESS:-none}
# pvh or bzimage (see boot_install_kernel in lib/boot.sh).
kernel_format=${AIRLOCK_KERNEL_FORMAT:-pvh}

die() {
    echo "build-tiny: $*" >&2
    exit 1
}
# shellcheck source-path=SCRIPTDIR source=lib/boot.sh
. "$(dirname "$0")/lib/boot.sh"

[ -x "$agent" ] || die "agent '$agent' is not an executable"
busybox=$(command -v busybox) || die "busybox not found (install busybox-static)"
readelf -l "$busybox" | grep -q 'program interpreter' && die "$busybox is not static (install busybox-static)"
boot_find_kernel
agent_version=$("$agent" --version | awk '{print $2}')
agent_protocol=$("$agent" --version | awk '{print $4}')
[ -n "$agent_version" ] || die "'$agent --version' printed no version"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

root=$stage/root
mkdir -p "$root"/{bin,dev,etc/airlock,proc,root,run,sys,tmp,workspace}
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

boot_install_modules "$root"

printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\n' >"$root/etc/group"
printf 'airlock\n' >"$root/etc/hostname"

mkdir -p "$outdir"
chmod 0755 "$outdir"
boot_write_cpio "$root" "$stage/initrd.img" "$compress"
install -m 0644 "$stage/initrd.img" "$outdir/initrd.img"
boot_install_kernel "$stage" "$outdir" "$kernel_format"
kernel_file=$boot_kernel_file

cat >"$stage/manifest.json" <<EOF
{
  "name": "tiny",
  "kernel": "$kernel_file",
  "initrd": "initrd.img",
  "disk": null,
  "cmdline": "$boot_cmdline",
  "languages": ["sh"],
  "agent_protocol": $agent_protocol,
  "agent_version": "$agent_version",
  "memory_mib": 256
}
EOF
install -m 0644 "$stage/manifest.json" "$outdir/manifest.json"

#!/usr/bin/env bash
# Builds the `debian` guest image: Debian 12 with Python (numpy, pandas, matplotlib, requests),
# bash, coreutils, git, sqlite3, curl and Node on a qcow2 root disk, booted directly with the
# cloud kernel and a small initramfs whose /init is the airlock agent.
#
#   images/build-debian.sh AGENT_BINARY OUTDIR [--toolchain] [--variant=sshd]
#
# --toolchain adds build-essential (and python3-dev).
# --variant=desktop builds the `desktop` image instead (images/build-desktop.sh): the same disk
# plus desktop/packages (Xorg, openbox, a terminal, chromium) and desktop/customize.sh, booted
# with Debian's generic kernel (DRM for the VGA) and airlock.service= naming the desktop's start.
# --variant=sshd builds the `sshd` image instead (images/build-sshd.sh): the same disk plus
# sshd/packages and sshd/customize.sh, without the agent. Its initramfs still has the agent as
# /init to load modules and switch root, but airlock.init= on the command line makes that init
# run /usr/local/sbin/airlock-boot (sshd/airlock-boot: NoCloud seed, network, sshd) instead of
# the agent and keep /usr/lib/airlock out of the new root. The host reaches it over SSH.
#
# Two parts with different lives:
# - the root disk (debian/rootfs.sh: mmdebstrap, mke2fs -d, qemu-img), a few minutes, depends
#   only on the recipe, the package list and the options. It is cached under a hash of those,
#   as CACHE/debian-HASH.qcow2 (CACHE: $AIRLOCK_CACHE_DIR, else /var/cache/airlock for root,
#   else ~/.cache/airlock), and reused by every later build: a test and an ASan build share it.
# - the initramfs (about a second): the agent, the virtio modules and the language kernels
#   (guest-agent/kernels/*, installed at /usr/lib/airlock/kernels). The agent's init mounts the
#   disk named by airlock.root= on the command line, binds /usr/lib/airlock into it and
#   switches root to it.
#
# Writes OUTDIR/vmlinux (or vmlinuz), initrd.img, rootfs.qcow2 (a hard link to the cached disk
# where possible, read-only: sessions run on their own overlays) and manifest.json, last.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
variant=debian
die() {
    echo "build-$variant: $*" >&2
    exit 1
}
usage() {
    echo "usage: $0 AGENT_BINARY OUTDIR [--toolchain] [--variant=sshd]" >&2
    exit 2
}
toolchain=false
args=()
for a in "$@"; do
    case $a in
    --toolchain) toolchain=true ;;
    --variant=sshd) variant=sshd ;;
    --variant=desktop) variant=desktop ;;
    -*) usage ;;
    *) args+=("$a") ;;
    esac
done
[ ${#args[@]} -eq 2 ] || usage
agent=${args[0]}
outdir=${args[1]}
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-1700000000}
# shellcheck source-path=SCRIPTDIR source=lib/boot.sh
. "$here/lib/boot.sh"

[ -x "$agent" ] || die "agent '$agent' is not an executable"
agent_version=$("$agent" --version | awk '{print $2}')
agent_protocol=$("$agent" --version | awk '{print $4}')
[ -n "$agent_version" ] || die "'$agent --version' printed no version"
kernel_flavour=cloud-amd64
[ "$variant" != desktop ] || kernel_flavour=amd64
boot_find_kernel "$kernel_flavour"
kernels=${AIRLOCK_KERNELS_DIR:-$here/../guest-agent/kernels}
# The Debian archive as this machine's apt knows it (only Debian's own sources: others may be
# unreachable from where images are built).
sources=${AIRLOCK_DEBIAN_SOURCES:-}
if [ -z "$sources" ]; then
    for f in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list; do
        [ -s "$f" ] && sources=$f && break
    done
fi
if [ -z "$sources" ] || [ ! -r "$sources" ]; then
    die "no apt sources for Debian (set AIRLOCK_DEBIAN_SOURCES)"
fi

lists=("$here/debian/packages")
$toolchain && lists+=("$here/debian/packages-toolchain")
# What the sshd variant adds to the disk (its hook installs the other files of sshd/).
hooks=()
variant_files=()
if [ "$variant" = sshd ]; then
    lists+=("$here/sshd/packages")
    hooks=(--hook "$here/sshd/customize.sh")
    variant_files=("$here/sshd/customize.sh" "$here/sshd/airlock-boot" "$here/sshd/sshd_config")
    # The NoCloud seed's ISO 9660 file system (isofs needs cdrom); modules in Debian's cloud
    # kernel. The NIC's driver is in every image (lib/boot.sh).
    boot_modules+=(cdrom isofs)
fi
if [ "$variant" = desktop ]; then
    lists+=("$here/desktop/packages")
    hooks=(--hook "$here/desktop/customize.sh")
    variant_files=("$here/desktop/customize.sh" "$here/desktop/airlock-desktop"
                   "$here/desktop/as-user" "$here/desktop/airlock-desktop-warm"
                   "$here/desktop/xorg.conf")
    # The generic kernel has ext4 (and the checksum it needs at mount) as modules, which the
    # cloud kernel builds in; then the VGA's DRM driver and what it needs. In load order
    # (finit_module resolves nothing).
    boot_modules+=(crc32c_generic crc16 mbcache jbd2 ext4
                   drm drm_kms_helper ttm drm_ttm_helper drm_vram_helper bochs)
fi
mapfile -t packages < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' "${lists[@]}" | grep . | LC_ALL=C sort -u)

# The disk's cache key: everything that goes into it. The archive's content is not part of it
# (a cached disk keeps the package versions it was built with; rebuild with a new
# SOURCE_DATE_EPOCH or remove the cache file to refresh).
inputs=$({
    echo "recipe 1"
    [ "$variant" = debian ] || echo "variant $variant"
    cat "$here/debian/rootfs.sh" ${variant_files[@]+"${variant_files[@]}"}
    printf '%s\n' "${packages[@]}"
    echo "epoch $SOURCE_DATE_EPOCH size ${AIRLOCK_DEBIAN_FS_SIZE:-4G}"
    cat "$sources"
} | sha256sum | cut -c1-16)

if [ -n "${AIRLOCK_CACHE_DIR:-}" ]; then
    cache=$AIRLOCK_CACHE_DIR
elif [ "$(id -u)" = 0 ]; then
    cache=/var/cache/airlock
else
    cache=${XDG_CACHE_HOME:-$HOME/.cache}/airlock
fi
mkdir -p "$cache"
base=$cache/$variant-$inputs.qcow2
# Cached disks kept; older ones are removed (images already built keep theirs: hard links).
keep=3

# One builder at a time per disk (the test and ASan builds may ask together); builds of other
# disks (--toolchain) do not wait.
exec 9>"$cache/.$variant-$inputs.lock"
flock 9
if [ ! -s "$base" ]; then
    echo "build-$variant: building the root disk (mmdebstrap; a few minutes), cache $base" >&2
    tmp=$cache/.$variant-$inputs.$$.qcow2
    trap 'rm -f "$tmp"' EXIT
    bash "$here/debian/rootfs.sh" ${hooks[@]+"${hooks[@]}"} "$tmp" "$sources" "${packages[@]}"
    chmod 0444 "$tmp"
    mv "$tmp" "$base"
    trap - EXIT
    # shellcheck disable=SC2012 # names are ours: VARIANT-HEX.qcow2
    for old in $(ls -t "$cache"/"$variant"-*.qcow2 | tail -n +$((keep + 1))); do
        old=${old##*/"$variant"-}
        rm -f "$cache/$variant-$old" "$cache/.$variant-${old%.qcow2}.lock"
    done
fi
flock -u 9

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$outdir"
chmod 0755 "$outdir"
# Sessions never write the base: each gets a qcow2 overlay of its own. QEMU (another user under
# qemu:///system) only reads it.
if ! [ "$base" -ef "$outdir/rootfs.qcow2" ]; then
    ln -f "$base" "$outdir/rootfs.qcow2" 2>/dev/null ||
        cp --reflink=auto "$base" "$outdir/rootfs.qcow2"
    chmod 0444 "$outdir/rootfs.qcow2"
fi

# The initramfs: only what is needed to reach the disk, plus what changes with each airlock
# build (agent, kernels), so the disk stays cacheable.
root=$stage/root
mkdir -p "$root"/{dev,proc,sys,newroot,usr/lib/airlock}
install -m 0755 "$agent" "$root/usr/lib/airlock/airlock-agent"
if readelf -h "$agent" >/dev/null 2>&1; then
    strip --strip-all "$root/usr/lib/airlock/airlock-agent"
fi
ln -s usr/lib/airlock/airlock-agent "$root/init"
# The sshd variant never binds /usr/lib/airlock into its root: the host copies the agent and
# the kernels over SFTP.
if [ "$variant" != sshd ]; then
    mkdir -p "$root/usr/lib/airlock/kernels"
    if [ -d "$kernels" ]; then
        cp -R "$kernels/." "$root/usr/lib/airlock/kernels/"
    fi
fi
boot_install_modules "$root"
boot_write_cpio "$root" "$stage/initrd.img" "${AIRLOCK_INITRD_COMPRESS:-none}"
install -m 0644 "$stage/initrd.img" "$outdir/initrd.img"
boot_install_kernel "$stage" "$outdir" "${AIRLOCK_KERNEL_FORMAT:-pvh}"

if [ "$variant" = sshd ]; then
    # No agent_protocol/agent_version: the image has no agent; the host brings its own.
    cat >"$stage/manifest.json" <<EOF
{
  "name": "sshd",
  "kernel": "$boot_kernel_file",
  "initrd": "initrd.img",
  "disk": "rootfs.qcow2",
  "cmdline": "$boot_cmdline airlock.root=/dev/vda airlock.init=/usr/local/sbin/airlock-boot",
  "transport": "ssh",
  "ssh_user": "airlock",
  "ssh_port": 22,
  "languages": ["python", "shell", "javascript"],
  "memory_mib": 512,
  "toolchain": $toolchain,
  "inputs": "$inputs"
}
EOF
    install -m 0644 "$stage/manifest.json" "$outdir/manifest.json"
    exit 0
fi
# The images with the agent: debian, and desktop, whose sessions have a display by default,
# 1 GiB (Xorg, a browser), DISPLAY for the runs' X clients, and a warm template with the
# browser started (warm_command).
memory=512 cmdline_extra='' extra=''
if [ "$variant" = desktop ]; then
    memory=1024
    cmdline_extra=' airlock.service=/usr/local/sbin/airlock-desktop'
    extra='  "display": true,
  "warm_command": "/usr/local/sbin/airlock-desktop-warm",
  "config": {"env": ["DISPLAY=:0"]},
'
fi
cat >"$stage/manifest.json" <<EOF
{
  "name": "$variant",
  "kernel": "$boot_kernel_file",
  "initrd": "initrd.img",
  "disk": "rootfs.qcow2",
  "cmdline": "$boot_cmdline airlock.root=/dev/vda$cmdline_extra",
  "languages": ["python", "shell", "javascript"],
  "agent_protocol": $agent_protocol,
  "agent_version": "$agent_version",
  "memory_mib": $memory,
${extra}  "toolchain": $toolchain,
  "inputs": "$inputs"
}
EOF
install -m 0644 "$stage/manifest.json" "$outdir/manifest.json"

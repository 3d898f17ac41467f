#!/usr/bin/env bash
# The `debian` image's root disk: Debian 12 from the archive with mmdebstrap, then an ext4 file
# system filled with `mke2fs -d` (no loop mount) and converted to qcow2. Called by
# build-debian.sh, which caches the result under a hash of this file, the package list and the
# options: change anything here and the next build makes a new disk.
#
#   images/debian/rootfs.sh [--hook SCRIPT]... OUT.qcow2 SOURCES PACKAGE...
#
# SOURCES is an apt sources file (one-line or deb822) for the Debian archive. Each --hook SCRIPT
# runs after the common customization, as `bash SCRIPT ROOT` on the host (ROOT: the new root's
# directory): images built on this one (sshd) add their own setup there.
set -euo pipefail

hooks=()
while [ "${1:-}" = --hook ] && [ $# -ge 2 ]; do
    hooks+=(--customize-hook="bash '$2' \"\$1\"")
    shift 2
done
if [ $# -lt 3 ]; then
    echo "usage: $0 [--hook SCRIPT]... OUT.qcow2 SOURCES PACKAGE..." >&2
    exit 2
fi
out=$1
sources=$2
shift 2
packages=$(IFS=,; echo "$*")
suite=bookworm
# Apparent size of the file system: the qcow2 stores only what is written, so free room costs
# nothing on the host until a session fills it (each session's overlay holds its own writes).
size=${AIRLOCK_DEBIAN_FS_SIZE:-4G}
# Fixed, so that two builds of the same tree give the same file system identity.
uuid=6a1e0c4e-5d43-4b2a-9d1e-a1a1a1a1a1a1
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-1700000000}

die() {
    echo "build-debian: $*" >&2
    exit 1
}
command -v mmdebstrap >/dev/null || die "mmdebstrap not found (install mmdebstrap)"
command -v mke2fs >/dev/null || die "mke2fs not found (install e2fsprogs)"
command -v qemu-img >/dev/null || die "qemu-img not found (install qemu-utils)"

stage=$(mktemp -d "${TMPDIR:-/var/tmp}/airlock-debian.XXXXXX")
chmod 0755 "$stage" # apt downloads as _apt
trap 'rm -rf "$stage"' EXIT
root=$stage/root

# Inside the chroot, once the packages are in. Everything here becomes part of every session.
customize() {
    local r=$1
    printf 'airlock\n' >"$r/etc/hostname"
    printf '127.0.0.1 localhost\n127.0.1.1 airlock\n::1 localhost ip6-localhost\n' \
        >"$r/etc/hosts"
    : >"$r/etc/resolv.conf" # no network device; and not the build host's resolver
    : >"$r/etc/machine-id"
    # Where the code works; everything runs as root, but tools that drop privileges still can.
    install -d -m 0777 "$r/workspace"
    # Mount point for the agent and the language kernels, bound from the initramfs at boot.
    install -d -m 0755 "$r/usr/lib/airlock"
    # Debian marks its Python as externally managed; in a throwaway VM `pip install` should
    # simply work (where the session has a network at all).
    printf '[global]\nbreak-system-packages = true\n' >"$r/etc/pip.conf"
    # E2B's default account (airlockd's E2B API runs processes as it, docs/E2B.md): made here
    # once rather than in every sandbox.
    chroot "$r" useradd -m -s /bin/bash -u 1000 -U user || die "cannot make the user account"
    # ... who may sudo without a password, as in E2B's templates (root is a VM's anyway)
    printf 'user ALL=(ALL:ALL) NOPASSWD: ALL\n' >"$r/etc/sudoers.d/user"
    chmod 0440 "$r/etc/sudoers.d/user"
    # matplotlib builds its font cache on first import: seconds under emulation, every
    # session. Built once here instead (~/.cache is on the image, HOME is /root).
    chroot "$r" env HOME=/root MPLBACKEND=Agg python3 -c 'import matplotlib.pyplot' \
        || die "matplotlib does not import in the new root"
    rm -rf "$r"/var/log/* "$r"/var/cache/apt/*.bin "$r"/var/cache/debconf/*-old \
        "$r"/var/lib/dpkg/*-old
}

t0=$(date +%s)
# variant apt: Essential plus apt, then only the packages asked for. No recommends (the
# mmdebstrap default). Documentation and translations are left out: nobody reads them here.
mmdebstrap --variant=apt --format=directory --include="$packages" \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --customize-hook="$(declare -f customize die); customize \"\$1\"" \
    ${hooks[@]+"${hooks[@]}"} \
    "$suite" "$root" "$sources" >&2
t1=$(date +%s)
# Files made after the epoch (hooks, caches) get its time, as mmdebstrap gives the rest.
find "$root" -newermt "@$SOURCE_DATE_EPOCH" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +

# No journal: every session writes to a throwaway overlay, so crash consistency buys nothing
# and the journal's writes cost time under emulation. -m 0: no blocks reserved for root, who
# is the only user.
E2FSPROGS_FAKE_TIME=$SOURCE_DATE_EPOCH mke2fs -q -t ext4 -O ^has_journal -m 0 \
    -L airlock-root -U "$uuid" -E "hash_seed=$uuid,root_owner=0:0" \
    -d "$root" "$stage/root.img" "$size"
qemu-img convert -f raw -O qcow2 "$stage/root.img" "$stage/root.qcow2"
t2=$(date +%s)
mv "$stage/root.qcow2" "$out"
echo "build-debian: rootfs $(du -sh --apparent-size "$root" | cut -f1)," \
    "mmdebstrap $((t1 - t0)) s, mke2fs+qemu-img $((t2 - t1)) s," \
    "qcow2 $(du -h "$out" | cut -f1)" >&2

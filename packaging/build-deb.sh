#!/bin/bash
# Builds Airlock's Debian packages from this source tree:
#   packaging/build-deb.sh [OUTDIR]      (default OUTDIR: build-deb/ in the tree)
# writes airlock_*.deb, airlock-guest_*.deb, libairlock-dev_*.deb, python3-airlock_*.deb and
# the .changes and .buildinfo into OUTDIR. The tree (git's tracked and untracked files that are not ignored, so
# no build dirs) is copied to a scratch dir with packaging/debian at debian/, where
# 'dpkg-buildpackage -us -uc -b' runs; the tree itself is not written to.
# AIRLOCK_DEB_JOBS: parallel jobs (default 2).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
out=$(realpath -m "${1:-$src/build-deb}")
work=$(mktemp -d "${TMPDIR:-/tmp}/airlock-deb.XXXXXX")
trap 'rm -rf "$work"' EXIT
tree=$work/airlock
mkdir -p "$tree" "$out"
if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
    # Files deleted but not yet committed are skipped.
    git -C "$src" ls-files -z --cached --others --exclude-standard |
        (cd "$src" && while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done) |
        tar -C "$src" --null -T - -cf - | tar -C "$tree" -xf -
else
    tar -C "$src" --exclude='./build*' -cf - . | tar -C "$tree" -xf -
fi
rm -rf "$tree/debian"
cp -a "$src/packaging/debian" "$tree/debian"
(cd "$tree" && dpkg-buildpackage -us -uc -b -j"${AIRLOCK_DEB_JOBS:-2}")
# Only this build's packages in OUTDIR, so that ./OUTDIR/airlock_*.deb names one file.
rm -f "$out"/airlock*_*.deb "$out"/libairlock-dev_*.deb "$out"/python3-airlock_*.deb \
    "$out"/airlock_*.changes \
    "$out"/airlock_*.buildinfo
for f in "$work"/*.deb "$work"/*.changes "$work"/*.buildinfo; do
    mv -f "$f" "$out/"
done
ls "$out"/*.deb

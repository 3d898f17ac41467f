#!/bin/bash
# libairlock's ABI against its checked-in baseline (issue 36): abidiff (Debian's abigail-tools)
# over the public header's types. Added functions are fine (a new version node in
# libairlock.sym), and so is a member added at the end of a sized struct (SUPPRESSIONS:
# orchestrator/abi/sized.suppr); any other change to an existing function or to a type it
# reaches (a member inserted or retyped, a frozen struct that changed, an enum renumbered)
# fails: bump the soname (the major of libairlock's version in orchestrator/meson.build) and
# refresh the baseline with `ninja -C BUILD abi-baseline`, or keep the old layout.
#   check-abi.sh BASELINE LIBRARY HEADERS_DIR SUPPRESSIONS
set -uo pipefail
base=$1 lib=$2 headers=$3 suppr=$4
command -v abidiff >/dev/null || { echo "check-abi: abidiff is missing (abigail-tools)"; exit 1; }
out=$(abidiff --no-added-syms --suppressions "$suppr" --headers-dir1 "$headers" \
    --headers-dir2 "$headers" "$base" "$lib")
rc=$?
if [ "$rc" -ne 0 ]; then
    echo "$out"
    echo "check-abi: libairlock's ABI changed against $(basename "$base") (abidiff $rc): bump the soname and refresh the baseline (ninja abi-baseline), or keep the old layout"
    exit 1
fi
echo "check-abi: $(basename "$lib") matches $(basename "$base")"

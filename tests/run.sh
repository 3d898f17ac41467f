#!/bin/bash
# The whole test suite: unit, fuzz-corpus and integration tests (real guests through real
# libvirtd and QEMU), once in a normal build and once under ASan+UBSan, warnings as errors.
# Ends with one line: "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."
packaging/debian-deps.sh || { echo "0 passed, 1 failed"; exit 1; }

passed=0
failed=0
run_suite() { # name, meson options...
  local dir=build-$1
  shift
  if ! { [ -d "$dir" ] && meson setup "$dir" --reconfigure "$@" >/dev/null ||
         meson setup "$dir" "$@" >/dev/null; } || ! ninja -C "$dir"; then
    echo "tests: build $dir failed" >&2
    failed=$((failed + 1))
    return
  fi
  meson test -C "$dir" --print-errorlogs --num-processes 2 -t 1
  # Count from meson's own log, one entry per test.
  read -r p f < <(python3 - "$dir/meson-logs/testlog.json" <<'PY'
import json, sys
p = f = 0
for line in open(sys.argv[1]):
    r = json.loads(line)["result"]
    if r in ("OK", "EXPECTEDFAIL"):
        p += 1
    else:  # a skipped test is not a passed one
        f += 1
print(p, f)
PY
  ) || { p=0; f=1; }
  passed=$((passed + p))
  failed=$((failed + f))
}

run_suite test -Dwerror=true
run_suite asan -Dwerror=true -Db_sanitize=address,undefined -Db_lundef=false
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

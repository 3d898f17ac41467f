#!/bin/bash
# The heavy cases that tests/run.sh (CI) leaves out, run before a stop and reported in its note:
# the meson suite "long" (tests/meson.build), in the normal build, two at a time. Each feature
# keeps at least one case in tests/run.sh; what is here is the same feature again at size (the
# kernels' suite on restored sessions, the exec suite whole over SSH, E2B's load group).
# Ends with one line: "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.." || { echo "0 passed, 1 failed"; exit 1; }
start=$SECONDS
packaging/debian-deps.sh || { echo "0 passed, 1 failed"; exit 1; }
if ! { [ -d build-test ] && meson setup build-test --reconfigure -Dwerror=true >/dev/null ||
       meson setup build-test -Dwerror=true >/dev/null; } || ! ninja -C build-test; then
  echo "tests: build build-test failed" >&2
  echo "0 passed, 1 failed"
  exit 1
fi
log=build-test/meson-logs/long-long.json  # meson adds the setup's name
rm -f "$log"
rc=0
meson test -C build-test --no-rebuild --setup long --suite long --logbase long --print-errorlogs \
  --num-processes 2 -t 1 || rc=$?
python3 - "$log" "$rc" "$((SECONDS - start))" <<'PY'
import json, sys
log, rc, wall = sys.argv[1], int(sys.argv[2]), sys.argv[3]
try:
    runs = [json.loads(line) for line in open(log)]
except OSError:
    runs = []
p = sum(r["result"] in ("OK", "EXPECTEDFAIL") for r in runs)
f = len(runs) - p
for r in runs:
    print("  %-28s %-6s %6.0fs" % (r["name"].split(" / ")[-1], r["result"], r["duration"]))
if not runs or (rc and not f):
    f += 1
print("total: %d min %d s" % (int(wall) // 60, int(wall) % 60))
print("%d passed, %d failed" % (p, f))
sys.exit(1 if f else 0)
PY

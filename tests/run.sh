#!/bin/bash
# The whole test suite, warnings as errors: the tests that need no VM (unit, fuzz corpus, agent,
# cli, ...) in a normal build and under ASan+UBSan, the integration tests (real guests through
# real libvirtd and QEMU) once, under ASan+UBSan. Prints a table of times per build and suite.
# Ends with one line: "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
packaging/debian-deps.sh || { echo "0 passed, 1 failed"; exit 1; }

passed=0
failed=0
summary=()
# build name, meson test selection (e.g. --no-suite integration; none for all), meson options...
run_build() {
  local dir=build-$1 select=$2
  shift 2
  local t0=$SECONDS
  if ! { [ -d "$dir" ] && meson setup "$dir" --reconfigure "$@" >/dev/null ||
         meson setup "$dir" "$@" >/dev/null; } || ! ninja -C "$dir"; then
    echo "tests: build $dir failed" >&2
    failed=$((failed + 1))
    summary+=("$dir: build failed after $((SECONDS - t0)) s")
    return
  fi
  local built=$((SECONDS - t0))
  # Integration tests marked is_parallel run two at a time: one per core (each guest has one
  # vCPU), with boot waits and the host's own work filling the gaps (docs/PERFORMANCE.md).
  local log=$dir/meson-logs/testlog.json list=$dir/meson-logs/tests-selected.txt rc=0
  rm -f "$log"
  # shellcheck disable=SC2086 # $select is a list of options
  meson test -C "$dir" --no-rebuild --list $select >"$list" 2>/dev/null || : >"$list"
  # shellcheck disable=SC2086
  meson test -C "$dir" $select --print-errorlogs --num-processes 2 -t 1 || rc=$?
  # Count from meson's own log, one entry per test; a selected test missing from it (meson
  # stopped early) and a failing meson with no failed test each count as a failure.
  local out
  out=$(python3 - "$log" "$list" "$rc" "$dir" "$built" "$((SECONDS - t0 - built))" <<'PY'
import collections, json, sys
log, listed, rc, dir, built, wall = sys.argv[1:]
runs = []
try:
    runs = [json.loads(line) for line in open(log)]
except OSError:
    pass
suites = collections.OrderedDict()
p = f = 0
for r in runs:
    ok = r["result"] in ("OK", "EXPECTEDFAIL")  # a skipped test is not a passed one
    p += ok
    f += not ok
    # "project:suite / test"
    s = suites.setdefault(r["name"].split(" / ")[0].split(":", 1)[-1], [0, 0, 0.0, [], []])
    s[0] += 1
    s[1] += not ok
    s[2] += r["duration"]
    s[3].append(r["starttime"])
    s[4].append(r["starttime"] + r["duration"])
seen = {r["name"] for r in runs}
missing = [t.strip() for t in open(listed) if t.strip() and t.strip() not in seen]
for t in missing:
    print("tests: %s: %s did not run" % (dir, t), file=sys.stderr)
f += len(missing)
if int(rc) and not f:
    print("tests: %s: meson test failed (exit %s)" % (dir, rc), file=sys.stderr)
    f += 1
print("%s: built in %s s, tested in %s s" % (dir, built, wall))
print("  %-12s %5s %6s %9s %9s" % ("suite", "tests", "failed", "sum", "span"))
for name, (n, bad, secs, starts, ends) in suites.items():
    print("  %-12s %5d %6d %8.0fs %8.0fs" % (name, n, bad, secs, max(ends) - min(starts)))
print("COUNT %d %d" % (p, f))
PY
  ) || out="COUNT 0 1"
  local p f
  read -r _ p f < <(grep '^COUNT ' <<<"$out" | tail -1)
  passed=$((passed + ${p:-0}))
  failed=$((failed + ${f:-1}))
  summary+=("$(grep -v '^COUNT ' <<<"$out")")
}

run_build test "--no-suite integration" -Dwerror=true
run_build asan "" -Dwerror=true -Db_sanitize=address,undefined -Db_lundef=false
echo
echo "Times (sum: of its tests' durations; span: from its first start to its last end):"
printf '%s\n' "${summary[@]}"
echo "total: $(((SECONDS - start) / 60)) min $(((SECONDS - start) % 60)) s"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

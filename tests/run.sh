#!/bin/bash
# The whole test suite, warnings as errors: the tests that need no VM (unit, fuzz corpus, agent,
# cli, ...) in a normal build and under ASan+UBSan, the integration tests (real guests through
# real libvirtd and QEMU) once, under ASan+UBSan. Prints a table of times per build and suite.
# Ends with one line: "N passed, N failed". The heavy cases (suite "long") are tests/long.sh's.
#
# The order, for two cores: both builds; then the guest tests that must run alone (they compare
# the host's domain lists, or time what one guest does), one after the other, while the tests
# that need no VM run one at a time beside them (they start no domain); then the other guest
# tests, two at a time (one per core; each guest has one vCPU; three at a time was no faster
# here, docs/PERFORMANCE.md).
set -uo pipefail
cd "$(dirname "$0")/.." || { echo "0 passed, 1 failed"; exit 1; }
start=$SECONDS
packaging/debian-deps.sh || { echo "0 passed, 1 failed"; exit 1; }

passed=0
failed=0
summary=()
declare -A built_s tested_s

# build name, meson options...
build() {
  local dir=build-$1
  shift
  local t0=$SECONDS
  if ! { [ -d "$dir" ] && meson setup "$dir" --reconfigure "$@" >/dev/null ||
         meson setup "$dir" "$@" >/dev/null; } || ! ninja -C "$dir"; then
    echo "tests: build $dir failed" >&2
    failed=$((failed + 1))
    summary+=("$dir: build failed after $((SECONDS - t0)) s")
    return 1
  fi
  built_s[$dir]=$((SECONDS - t0))
}

# The test names of a build dir, in the order meson starts them: "alone" (guest tests that are
# not parallel), "guests" (the other guest tests) or "novm"; never the suite "long".
select_tests() {
  meson introspect --tests "$1" | python3 -c '
import json, sys
kind = sys.argv[1]
def suites(t):
    return [s.split(":", 1)[-1] for s in t["suite"]]
# the heavier first (their priority in tests/meson.build: about their seconds), so that no long
# one starts last beside an idle core
for t in sorted(json.load(sys.stdin), key=lambda t: -t["priority"]):
    if "long" in suites(t):
        continue
    guest = "integration" in suites(t)
    if (kind == "novm" and not guest or kind == "guests" and guest and t["is_parallel"] or
            kind == "alone" and guest and not t["is_parallel"]):
        print(t["name"])
' "$2"
}

# dir logbase processes: runs the names on stdin; their log is DIR/meson-logs/LOGBASE.json.
run_tests() {
  local dir=$1 logbase=$2 procs=$3 rc=0 names
  mapfile -t names
  rm -f "$dir/meson-logs/$logbase.json"
  printf '%s\n' "${names[@]}" >"$dir/meson-logs/$logbase-selected.txt"
  if ! ((${#names[@]})); then
    echo "tests: $dir: no $logbase tests found" >&2
    echo 1 >"$dir/meson-logs/$logbase-rc"
    return
  fi
  # Built above: no rebuild here (two of these run at once on one build dir, and a rebuild
  # would make the images again under the guests using them).
  meson test -C "$dir" --no-rebuild --logbase "$logbase" --print-errorlogs \
    --num-processes "$procs" -t 1 "${names[@]}" || rc=$?
  echo "$rc" >"$dir/meson-logs/$logbase-rc"
}

# Counts from meson's own logs, one entry per test; a selected test missing from them (meson
# stopped early) and a failing meson with no failed test each count as a failure.
count() {
  local dir=$1 out p f
  shift
  out=$(python3 - "$dir" "${built_s[$dir]:-0}" "${tested_s[$dir]:-0}" "$@" <<'PY'
import collections, json, sys
dir, built, wall, logbases = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
suites = collections.OrderedDict()
p = f = 0
for lb in logbases:
    base = "%s/meson-logs/%s" % (dir, lb)
    runs = []
    try:
        runs = [json.loads(line) for line in open(base + ".json")]
    except OSError:
        pass
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
    seen = {r["name"].split(" / ", 1)[-1] for r in runs}
    try:
        listed = [t.strip() for t in open(base + "-selected.txt") if t.strip()]
    except OSError:
        listed = []
    missing = [t for t in listed if t not in seen]
    for t in missing:
        print("tests: %s: %s did not run" % (dir, t), file=sys.stderr)
    f += len(missing)
    try:
        rc = int(open(base + "-rc").read())
    except (OSError, ValueError):
        rc = 1
    if rc and not runs and not missing:
        print("tests: %s: no %s tests ran" % (dir, lb), file=sys.stderr)
        f += 1
    elif rc and not any(r["result"] not in ("OK", "EXPECTEDFAIL") for r in runs) and not missing:
        print("tests: %s: meson test %s failed (exit %s)" % (dir, lb, rc), file=sys.stderr)
        f += 1
print("%s: built in %s s, tested in %s s" % (dir, built, wall))
print("  %-12s %5s %6s %9s %9s" % ("suite", "tests", "failed", "sum", "span"))
for name, (n, bad, secs, starts, ends) in suites.items():
    print("  %-12s %5d %6d %8.0fs %8.0fs" % (name, n, bad, secs, max(ends) - min(starts)))
print("COUNT %d %d" % (p, f))
PY
  ) || out="COUNT 0 1"
  read -r _ p f < <(grep '^COUNT ' <<<"$out" | tail -1)
  passed=$((passed + ${p:-0}))
  failed=$((failed + ${f:-1}))
  summary+=("$(grep -v '^COUNT ' <<<"$out")")
}

have_test=0
have_asan=0
build test -Dwerror=true && have_test=1
build asan -Dwerror=true -Db_sanitize=address,undefined -Db_lundef=false && have_asan=1
t0=$SECONDS
# Beside the guests that run alone: the tests that need no VM, of both builds, one at a time
# (their console output follows once they are done).
(
  if ((have_test)); then select_tests build-test novm | run_tests build-test novm 1; fi
  if ((have_asan)); then select_tests build-asan novm | run_tests build-asan novm 1; fi
) >"${TMPDIR:-/tmp}/airlock-tests-novm.$$" 2>&1 &
novm=$!
if ((have_asan)); then select_tests build-asan alone | run_tests build-asan alone 1; fi
wait "$novm"
cat "${TMPDIR:-/tmp}/airlock-tests-novm.$$"
rm -f "${TMPDIR:-/tmp}/airlock-tests-novm.$$"
if ((have_asan)); then select_tests build-asan guests | run_tests build-asan guests 2; fi
tested_s[build-test]=$((SECONDS - t0))
tested_s[build-asan]=$((SECONDS - t0))
((have_test)) && count build-test novm
((have_asan)) && count build-asan alone guests novm
echo
echo "Times (sum: of its tests' durations; span: from its first start to its last end):"
printf '%s\n' "${summary[@]}"
echo "total: $(((SECONDS - start) / 60)) min $(((SECONDS - start) % 60)) s"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

#!/bin/bash
# The whole test suite, warnings as errors: the tests that need no VM (unit, fuzz corpus, agent,
# cli, ...) in a normal build and under ASan+UBSan, the integration tests (real guests through
# real libvirtd and QEMU) once, under ASan+UBSan. Prints a table of times per build and suite.
# Ends with one line: "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.." || { echo "0 passed, 1 failed"; exit 1; }
start=$SECONDS
packaging/debian-deps.sh || { echo "0 passed, 1 failed"; exit 1; }

passed=0
failed=0
summary=()
# build name, "vm" to include the integration suite (guests) or "novm", meson options...
run_build() {
  local dir=build-$1 vm=$2
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
  local log=$dir/meson-logs/testlog.json list=$dir/meson-logs/tests-selected.txt rc=0
  rm -f "$log"
  # The tests to run, in the order meson starts them (it follows the order of the names given):
  # the guest tests that must run alone first, one after the other; then the other guest tests,
  # two at a time (one per core; each guest has one vCPU; three at a time was no faster here,
  # docs/PERFORMANCE.md); then the quick ones, which fill the gaps the last guest tests leave.
  meson introspect --tests "$dir" | python3 -c '
import json, sys
vm = sys.argv[1] == "vm"
tests = json.load(sys.stdin)
def guest(t):
    return "integration" in (s.split(":", 1)[-1] for s in t["suite"])
order = ([t for t in tests if guest(t) and not t["is_parallel"]] +
         [t for t in tests if guest(t) and t["is_parallel"]] if vm else [])
order += [t for t in tests if not guest(t)]
print("\n".join(t["name"] for t in order))
' "$vm" >"$list" || : >"$list"
  local names
  mapfile -t names <"$list"
  if ((${#names[@]})); then
    meson test -C "$dir" --print-errorlogs --num-processes 2 -t 1 "${names[@]}" || rc=$?
  else
    echo "tests: $dir: no tests found" >&2
    rc=1
  fi
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
seen = {r["name"].split(" / ", 1)[-1] for r in runs}
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

run_build test novm -Dwerror=true
run_build asan vm -Dwerror=true -Db_sanitize=address,undefined -Db_lundef=false
echo
echo "Times (sum: of its tests' durations; span: from its first start to its last end):"
printf '%s\n' "${summary[@]}"
echo "total: $(((SECONDS - start) / 60)) min $(((SECONDS - start) % 60)) s"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

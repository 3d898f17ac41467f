#!/usr/bin/env python3
"""The desktop image's warm template against a cold boot (issue 33's goal), ratios from one run.
Prints a table on stderr and JSON on stdout (or --json FILE).

  bench/desktop.py [--build DIR] [--image-dir DIR] [--rounds N] [--json FILE]

desktop_ready: wall time of `airlock exec --image desktop` until the browser's window is shown,
rounds alternated. Cold (AIRLOCK_WARM=off): the boot, X, then chromium started as the desktop
user and waited for (what the image's warm command does, so both reach the same point). Warm
(AIRLOCK_WARM=use): restored from the template `airlock image warm desktop` built first (its
build time is reported, not counted), where the window is already up: the run only checks it.
Both include the session's teardown. Templates live in a state dir of the benchmark's own.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import benchlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WINDOW = ("i=0; until xdotool search --onlyvisible --class chromium >/dev/null 2>&1; do "
          "i=$((i+1)); [ $i -le 600 ] || exit 1; sleep 0.5; done")


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--image-dir", default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    image_dir = args.image_dir or os.path.join(args.build, "images")
    airlock = os.path.abspath(os.path.join(args.build, "orchestrator", "airlock"))
    state = tempfile.mkdtemp(prefix="airlock-desktop-bench-", dir="/var/tmp")
    os.chmod(state, 0o755)
    env = dict(os.environ, AIRLOCK_IMAGE_DIR=image_dir, AIRLOCK_STATE_DIR=state)

    def run(argv, warm):
        t0 = time.monotonic()
        r = subprocess.run(argv, env=dict(env, AIRLOCK_WARM=warm), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
        dt = time.monotonic() - t0
        if r.returncode != 0:
            raise RuntimeError("%s failed: %s" % (argv, r.stderr))
        return dt, r

    try:
        build_s, _ = run([airlock, "-q", "image", "warm", "desktop"], "off")
        log("template built in %.1f s" % build_s)
        cold, warm = [], []
        cold_script = ("until xdpyinfo >/dev/null 2>&1; do sleep 0.1; done; "
                       "sh -c 'echo $$ > /sys/fs/cgroup/cgroup.procs && "
                       "exec setsid as-user chromium about:blank' >/dev/null 2>&1 </dev/null & "
                       + WINDOW)
        for i in range(args.rounds):
            dt, _ = run([airlock, "-q", "exec", "--image", "desktop", "--", "sh", "-c",
                         cold_script], "off")
            cold.append(dt)
            dt, r = run([airlock, "--debug", "-q", "exec", "--image", "desktop", "--", "sh",
                         "-c", WINDOW], "use")
            if "restored from a template" not in r.stderr:
                raise RuntimeError("a warm session booted cold: %s" % r.stderr)
            warm.append(dt)
            log("round %d: cold %.2f s, warm %.2f s" % (i + 1, cold[-1], warm[-1]))
        c, w = statistics.median(cold), statistics.median(warm)
        out = {"image": "desktop", "rounds": args.rounds, "template_build_s": build_s,
               "desktop_ready": {"cold_s": cold, "warm_s": warm, "cold_median_s": c,
                                 "warm_median_s": w, "ratio": w / c, "goal": 0.15},
               "machine": benchlib.machine(), "load_avg": os.getloadavg()}
        log("desktop ready: cold %.2f s, warm %.2f s, ratio %.3f (goal <= 0.15)" % (c, w, w / c))
        benchlib.emit(out, args.json, echo=False)
    finally:
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()

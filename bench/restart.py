#!/usr/bin/env python3
"""Sessions that last (issue 35), measured in one run through one airlockd, ratios against
baselines of the same run. Prints a summary on stderr and JSON on stdout (or --json FILE).

  bench/restart.py [--build DIR] [--image-dir DIR] [--image NAME] [--memory MIB] [--rounds N]
                   [--sessions N] [--json FILE]

resume: POST .../resume of a paused session until it returns and a `true` run answered,
  against the cold boot of the same image and shape (POST /v1/sessions until it returns; the
  daemon boots cold: AIRLOCK_WARM=off), rounds alternated (pause, resume, boot, ...). Goal
  <= 0.3.
pause: POST .../pause of the same session against a checkpoint of it (POST .../checkpoints,
  the session opened with checkpoints), rounds alternated. Goal <= 2.
restart: --sessions sessions open, airlockd killed (-9) and started again: from the start
  until every session answered a `true` run, against one session's cold boot (the median of
  the resume rounds' boots). Goal <= 1.
memory: the QEMU processes of a paused session (none, 0 KiB) against an idle running one's
  resident memory. Goal 0.
Each session holds x = 41 in its python kernel and a file, checked after every resume and the
restart: a measurement of a session that came back wrong is an error, not a number.
"""
import argparse
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import benchlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def med(xs):
    return statistics.median(xs) if xs else None


def qemu_rss_kib(name):
    r = subprocess.run(["pgrep", "-f", "qemu-system.*guest=%s" % name], capture_output=True,
                       text=True)
    total = 0
    for pid in r.stdout.split():
        try:
            with open("/proc/%s/status" % pid) as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--image-dir")
    ap.add_argument("--image", default="debian")
    ap.add_argument("--memory", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sessions", type=int, default=10)
    ap.add_argument("--json")
    a = ap.parse_args()
    os.environ.setdefault("AIRLOCKD_BIN", os.path.join(a.build, "daemon", "airlockd"))
    os.environ["AIRLOCK_IMAGE_DIR"] = a.image_dir or os.path.join(a.build, "images")
    os.environ["AIRLOCK_WARM"] = "off"
    state = tempfile.mkdtemp(prefix="airlock-restart-bench-", dir="/var/tmp")
    os.chmod(state, 0o755)
    os.environ["AIRLOCK_STATE_DIR"] = state
    import altest  # noqa: F401  (after the environment: it reads it)
    import test_restart
    test_restart.AIRLOCKD = os.environ["AIRLOCKD_BIN"]
    from airlock import Sandbox

    d = test_restart.Airlockd()
    with open(d.conf, "a") as f:
        f.write("max_sessions = %d\nmax_memory_mib = %d\n" %
                (a.sessions + 4, (a.sessions + 4) * a.memory))
    d.start()
    made = []

    def create(**kw):
        t0 = time.monotonic()
        sb = Sandbox(image=a.image, memory_mib=a.memory, client=d.client(), lifetime_s=3600,
                     **kw)
        dt = time.monotonic() - t0
        made.append(sb.id)
        sb.run_code("x = 41")
        sb.files.write("/workspace/kept.txt", b"kept\n")
        return sb, dt

    def answers(sb):
        r = sb.run_code("print(x + 1)")
        if r.stdout.strip() != "42" or sb.files.read("/workspace/kept.txt") != b"kept\n":
            raise RuntimeError("session %s came back without its state" % sb.id)

    def kill(sid):
        try:
            d.client().request("DELETE", "/v1/sessions/" + sid)
        except Exception:
            pass

    result = {"benchmark": "restart", "image": a.image, "memory_mib": a.memory,
              "host": platform.node(), "accel": "emulation", "rounds": a.rounds}
    try:
        sb, _ = create(checkpoints=True)
        boots, resumes, pauses, ckpts = [], [], [], []
        for i in range(a.rounds):
            t0 = time.monotonic()
            d.client().request("POST", "/v1/sessions/%s/checkpoints" % sb.id, body={})
            ckpts.append(time.monotonic() - t0)
            t0 = time.monotonic()
            sb.pause()
            pauses.append(time.monotonic() - t0)
            if i == 0:
                rss_paused = qemu_rss_kib(sb.id)
            t0 = time.monotonic()
            sb.resume()
            sb.commands.run("true")
            resumes.append(time.monotonic() - t0)
            answers(sb)
            other, dt = create()
            boots.append(dt)
            if i == 0:
                time.sleep(5)  # idle, settled
                rss_running = qemu_rss_kib(other.id)
            kill(other.id)
            log("round %d: boot %.2fs resume %.2fs pause %.2fs checkpoint %.2fs" %
                (i, boots[-1], resumes[-1], pauses[-1], ckpts[-1]))
        kill(sb.id)
        cold = med(boots)
        result["resume"] = {"resume_s": med(resumes), "cold_boot_s": cold,
                            "ratio": med(resumes) / cold, "goal": 0.3,
                            "all_resume_s": resumes, "all_boot_s": boots}
        result["pause"] = {"pause_s": med(pauses), "checkpoint_s": med(ckpts),
                           "ratio": med(pauses) / med(ckpts), "goal": 2,
                           "all_pause_s": pauses, "all_checkpoint_s": ckpts}
        result["memory"] = {"paused_qemu_rss_kib": rss_paused,
                            "running_idle_qemu_rss_kib": rss_running,
                            "ratio": rss_paused / rss_running if rss_running else None,
                            "goal": 0}

        many = [create()[0] for _ in range(a.sessions)]
        d.kill()
        t0 = time.monotonic()
        d.start()
        for s in many:
            back = Sandbox.connect(s.id, client=d.client())
            back.commands.run("true")
        took = time.monotonic() - t0
        for s in many:
            answers(Sandbox.connect(s.id, client=d.client()))
            kill(s.id)
        result["restart"] = {"sessions": a.sessions, "restart_s": took, "cold_boot_s": cold,
                             "ratio": took / cold, "goal": 1}
        log("restart of %d sessions %.2fs (one cold boot %.2fs)" % (a.sessions, took, cold))
    finally:
        for sid in made:
            kill(sid)
        d.close()
        shutil.rmtree(state, ignore_errors=True)
    benchlib.emit(result, a.json)


if __name__ == "__main__":
    main()

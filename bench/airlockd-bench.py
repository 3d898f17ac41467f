#!/usr/bin/env python3
"""airlockd's goals (issue 14), measured in one run, JSON on stdout:

- rtt: an exec of `true` through the API (unix socket, one open session: POST the run, read its
  events to the exit) against the library's own round trip (airlock-bench session);
- idle: SESSIONS idle sessions held by one daemon, each answering an exec in turn, and the
  daemon's RSS before and after;
- load: CLIENTS threads x EXECS execs spread over the idle sessions: errors, p50, p99.

Usage: airlockd-bench.py AIRLOCKD AIRLOCK_BENCH [--image tiny] [--rtt 50] [--sessions 8]
       [--clients 8] [--execs 25]
Environment: AIRLOCK_IMAGE_DIR, PYTHONPATH with clients/python.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import benchlib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients",
                                "python"))
from airlock import Client, Sandbox  # noqa: E402


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def exec_ms(sb):
    t0 = time.perf_counter()
    r = sb.commands.run(["true"])
    if r.exit_code != 0:
        raise RuntimeError("true failed: %r" % r.result)
    return (time.perf_counter() - t0) * 1000.0


def main():
    ap = benchlib.airlockd_args()
    ap.add_argument("--rtt", type=int, default=50)
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--execs", type=int, default=25)
    a = ap.parse_args()

    def lib_rtt():
        return json.loads(subprocess.run([a.airlock_bench, "session", a.image, str(a.rtt), "1"],
                                         stdout=subprocess.PIPE, check=True).stdout)

    lib = [lib_rtt()]

    tmp = tempfile.mkdtemp(prefix="airlockd-bench-")
    conf = os.path.join(tmp, "conf")
    with open(conf, "w") as f:
        f.write("socket = %s/sock\nkeys_db = %s/keys.db\nspool_dir = %s/spool\n"
                "max_sessions = %d\nmax_memory_mib = 1000000\nrequests_per_s = 0\n" %
                (tmp, tmp, tmp, a.sessions + 1))
    log = open(os.path.join(tmp, "log"), "w")
    d = subprocess.Popen([a.airlockd, "--config", conf], stderr=log)
    out = {"image": a.image}
    try:
        benchlib.wait_socket(tmp + "/sock")
        client = Client("unix:%s/sock" % tmp)
        rss0 = rss_kib(d.pid)
        sessions = [Sandbox(image=a.image, client=client)]
        sb = sessions[0]
        exec_ms(sb)  # warm
        # Alternated with the library's, so that the load of a shared machine hits both alike.
        api = [exec_ms(sb) for _ in range(a.rtt)]
        lib.append(lib_rtt())
        api += [exec_ms(sb) for _ in range(a.rtt)]
        lib_median = statistics.mean(x["rtt_ms_median"] for x in lib)
        out["rtt"] = {
            "api_ms_median": round(statistics.median(api), 3),
            "api_ms_p90": round(pct(api, 90), 3),
            "library_ms_median": round(lib_median, 3),
            "library_ms_medians": [x["rtt_ms_median"] for x in lib],
            "ratio": round(statistics.median(api) / lib_median, 2),
            "count": 2 * a.rtt,
        }
        t0 = time.time()
        while len(sessions) < a.sessions:
            sessions.append(Sandbox(image=a.image, client=client))
        boot_s = time.time() - t0
        turn = [exec_ms(s) for s in sessions]
        out["idle"] = {
            "sessions": len(sessions),
            "boot_s_total": round(boot_s, 1),
            "exec_each_ms_max": round(max(turn), 1),
            "daemon_rss_kib_before": rss0,
            "daemon_rss_kib_held": rss_kib(d.pid),
        }
        lat, errors = [], []
        lock = threading.Lock()

        def worker(i):
            for j in range(a.execs):
                s = sessions[(i + j) % len(sessions)]
                try:
                    ms = exec_ms(s)
                    with lock:
                        lat.append(ms)
                except Exception as e:  # counted, reported
                    with lock:
                        errors.append(repr(e)[:200])

        wall = benchlib.run_threads(worker, a.clients, lambda i: (i,))
        out["load"] = {
            "clients": a.clients,
            "execs_each": a.execs,
            "sessions": len(sessions),
            "errors": len(errors),
            "error_samples": errors[:3],
            "p50_ms": round(pct(lat, 50), 1) if lat else None,
            "p99_ms": round(pct(lat, 99), 1) if lat else None,
            "execs_per_s": round(len(lat) / wall, 1),
            "daemon_rss_kib_after": rss_kib(d.pid),
        }
        for s in sessions:
            s.kill()
    finally:
        d.terminate()
        d.wait(timeout=120)
        log.close()
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A terminal through airlockd (issue 30): what the API's way of carrying it (SSE out, one POST
per keystroke in) costs, measured in one run, JSON on stdout.

- rtt_true_api_ms: an exec of `true` through the API (POST the run, its events to the exit);
- keystroke_echo_api_ms: `cat` on a pty run: one byte POSTed to its stdin (a kept-alive
  connection) until its echo arrives on the run's event stream (a reader of its own);
- post_ms: the POST alone (sent until answered): what a WebSocket frame in its place could save
  at most, since the output's way (an event on an open stream) would be the same;
- keystroke_echo_lib_ms: the same keystroke through the library alone (airlock-bench pty).

Usage: pty-api.py AIRLOCKD AIRLOCK_BENCH [--image tiny] [--rounds 30]
Environment: AIRLOCK_IMAGE_DIR.
"""
import argparse
import base64
import json
import os
import shutil
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


def main():
    ap = benchlib.airlockd_args()
    ap.add_argument("--rounds", type=int, default=30)
    a = ap.parse_args()
    lib = json.loads(subprocess.run([a.airlock_bench, "pty", a.image, str(a.rounds)],
                                    stdout=subprocess.PIPE, check=True).stdout)
    tmp = tempfile.mkdtemp(prefix="airlockd-bench-")
    with open(os.path.join(tmp, "conf"), "w") as f:
        f.write("socket = %s/sock\nkeys_db = %s/keys.db\nspool_dir = %s/spool\n"
                "requests_per_s = 0\n" % (tmp, tmp, tmp))
    d = subprocess.Popen([a.airlockd, "--config", os.path.join(tmp, "conf")],
                         stderr=open(os.path.join(tmp, "log"), "w"))
    out = {"image": a.image, "rounds": a.rounds}
    try:
        benchlib.wait_socket(tmp + "/sock")
        client = Client("unix:%s/sock" % tmp)
        sb = Sandbox(image=a.image, client=client)
        sb.commands.run(["true"])
        rtt = []
        for _ in range(a.rounds):
            t0 = time.perf_counter()
            sb.commands.run(["true"])
            rtt.append((time.perf_counter() - t0) * 1000)
        run = client.request("POST", sb._path + "/runs",
                             body={"argv": ["cat"], "pty": {"rows": 24, "cols": 80}})
        base = sb._path + "/runs/" + run["id"]
        got = threading.Condition()
        echoed = bytearray()

        def reader():
            c, r = client.open("GET", base + "/events")
            for line in r:
                if line.startswith(b"data: ") and b"data_b64" in line:
                    b = base64.b64decode(json.loads(line[6:])["data_b64"])
                    with got:
                        echoed.extend(b)
                        got.notify_all()
            c.close()
        threading.Thread(target=reader, daemon=True).start()
        conn = client.connection()
        hdr = {"Content-Type": "application/octet-stream"}
        keys, posts = [], []
        for i in range(a.rounds + 3):
            ch = b"abcdefghijklmnopqrstuvwxyz"[i % 26:i % 26 + 1]
            with got:
                n = len(echoed)
            t0 = time.perf_counter()
            conn.request("POST", base + "/stdin", body=ch, headers=hdr)
            resp = conn.getresponse()
            resp.read()
            t1 = time.perf_counter()
            with got:
                got.wait_for(lambda: len(echoed) > n, timeout=30)
                if bytes(echoed[n:n + 1]) != ch:
                    raise RuntimeError("echo %r for %r" % (bytes(echoed[n:]), ch))
            t2 = time.perf_counter()
            if i >= 3:  # the first ones warm the connection and the stream
                keys.append((t2 - t0) * 1000)
                posts.append((t1 - t0) * 1000)
        conn.close()
        client.request("POST", base + "/signal", body={"signal": "KILL"})
        med = statistics.median
        out.update({
            "kvm": lib.get("kvm"),
            "rtt_true_api_ms": round(med(rtt), 2),
            "keystroke_echo_api_ms": round(med(keys), 2),
            "keystroke_vs_rtt_api": round(med(keys) / med(rtt), 3),
            "post_ms": round(med(posts), 2),
            "post_share_of_keystroke": round(med(posts) / med(keys), 3),
            "keystroke_echo_lib_ms": lib["keystroke_echo_ms"],
            "rtt_true_lib_ms": lib["rtt_true_ms"],
            "keystroke_api_vs_lib": round(med(keys) / lib["keystroke_echo_ms"], 2),
            "keystroke_echo_api_ms_sorted": sorted(round(x, 2) for x in keys),
        })
        sb.kill()
    finally:
        d.terminate()
        d.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(out))


main()

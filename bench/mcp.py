#!/usr/bin/env python3
"""The MCP server's costs (issue 31), each against its baseline measured in the same run:

tools_list: the round trip of tools/list over stdio (goal: median at most 20 ms; no baseline,
  it never reaches a VM).
start_run: start_session + run_code("1+1") from the image's warm template (AIRLOCK_WARM=use),
  against `airlock exec --kernel --lang python -c 1+1` of the same image, rounds alternated
  (goal: ratio at most 1.2; both include the python kernel's start).
run_code: a run_code("1+1") round trip in an open session against the library's own kernel
  round trip (tests/integration/kernel-driver: al_exec with kernel), rounds alternated (goal:
  ratio at most 1.5).
queued: 8 run_code("print(1)") sent at once to one kernel (they queue in the library, in the
  order sent) until the last answers, against the same 8 sent one after the other's answer
  from one client, rounds alternated (goal: ratio at most 1.1).

Usage: bench/mcp.py [--build DIR] [--image-dir DIR] [--image NAME] [--rounds N] [--json FILE]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import benchlib


def log(*a):
    print(*a, file=sys.stderr, flush=True)


class Mcp:
    def __init__(self, airlock, env, image):
        self.p = subprocess.Popen([airlock, "mcp", "--image", image], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        self.n = 0
        self.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                    "clientInfo": {"name": "bench", "version": "1"}})

    def request(self, method, params=None):
        self.n += 1
        msg = {"jsonrpc": "2.0", "id": self.n, "method": method, "params": params or {}}
        self.p.stdin.write((json.dumps(msg) + "\n").encode())
        self.p.stdin.flush()
        while True:
            r = json.loads(self.p.stdout.readline())
            if r.get("id") == self.n:
                if "error" in r:
                    raise RuntimeError("%s: %s" % (method, r["error"]))
                return r["result"]

    def calls_at_once(self, name, args_list):
        """tools/call of each args at once; waits for every answer."""
        ids = []
        for args in args_list:
            self.n += 1
            ids.append(self.n)
            msg = {"jsonrpc": "2.0", "id": self.n, "method": "tools/call",
                   "params": {"name": name, "arguments": args}}
            self.p.stdin.write((json.dumps(msg) + "\n").encode())
        self.p.stdin.flush()
        left = set(ids)
        while left:
            r = json.loads(self.p.stdout.readline())
            if r.get("id") in left:
                if "error" in r or r["result"].get("isError"):
                    raise RuntimeError("%s: %s" % (name, r))
                left.discard(r["id"])

    def tool(self, name, **args):
        r = self.request("tools/call", {"name": name, "arguments": args})
        if r.get("isError"):
            raise RuntimeError("%s: %s" % (name, r["content"][0]["text"]))
        return r

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=120)


def median_ms(xs):
    return statistics.median(xs) * 1000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build-test")
    ap.add_argument("--image-dir", default=os.environ.get("AIRLOCK_IMAGE_DIR", ""))
    ap.add_argument("--image", default="debian")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    airlock = os.path.abspath(os.path.join(a.build, "orchestrator", "airlock"))
    driver = os.path.abspath(os.path.join(a.build, "tests", "kernel-driver"))
    env = dict(os.environ, AIRLOCK_IMAGE_DIR=a.image_dir or os.path.join(a.build, "images"))
    out = {"image": a.image, "rounds": a.rounds}

    m = Mcp(airlock, env, a.image)
    lat = []
    for _ in range(200):
        t0 = time.monotonic()
        m.request("tools/list")
        lat.append(time.monotonic() - t0)
    lat.sort()
    out["tools_list"] = {"median_ms": median_ms(lat), "p95_ms": lat[int(len(lat) * 0.95)] * 1000,
                         "goal_ms": 20}
    log("tools/list: median %.2f ms" % out["tools_list"]["median_ms"])

    warm_env = dict(env, AIRLOCK_WARM="use")
    mcp_s, exec_s = [], []
    for i in range(a.rounds):
        t0 = time.monotonic()
        sid = m.tool("start_session")["structuredContent"]["session"]
        r = m.tool("run_code", session=sid, code="1+1")
        mcp_s.append(time.monotonic() - t0)
        assert "2" in r["content"][0]["text"], r
        m.tool("stop_session", session=sid)
        t0 = time.monotonic()
        p = subprocess.run([airlock, "-q", "exec", "--image", a.image, "--kernel", "--lang",
                            "python", "-c", "print(1+1)"], env=warm_env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        exec_s.append(time.monotonic() - t0)
        if p.returncode or p.stdout.strip() != b"2":
            raise RuntimeError("exec failed: %r %r" % (p.stdout, p.stderr))
        log("round %d: mcp %.2f s, exec %.2f s" % (i, mcp_s[-1], exec_s[-1]))
    out["start_run"] = {"mcp_s": mcp_s, "exec_kernel_s": exec_s,
                        "ratio": statistics.median(mcp_s) / statistics.median(exec_s),
                        "goal": 1.2,
                        "note": "the MCP server's AIRLOCK_WARM is the environment's (use, "
                                "when the template exists)"}
    m.close()

    # run_code round trips, alternated with the library's kernel round trip.
    m = Mcp(airlock, warm_env, a.image)
    sid = m.tool("start_session")["structuredContent"]["session"]
    m.tool("run_code", session=sid, code="0")  # the kernel's start, not measured
    d = subprocess.Popen([driver, a.image], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, env=warm_env, text=True)
    json.loads(d.stdout.readline())

    def lib_run():
        d.stdin.write(json.dumps({"op": "exec", "lang": "python", "code": "1+1", "kernel": True,
                                  "timeout_ms": 60000}) + "\n")
        d.stdin.flush()
        r = json.loads(d.stdout.readline())
        if r["r"] != 0:
            raise RuntimeError("kernel-driver: %s" % r)

    lib_run()
    mcp_rt, lib_rt = [], []
    for _ in range(max(20, a.rounds * 4)):
        t0 = time.monotonic()
        m.tool("run_code", session=sid, code="1+1")
        mcp_rt.append(time.monotonic() - t0)
        t0 = time.monotonic()
        lib_run()
        lib_rt.append(time.monotonic() - t0)
    d.stdin.close()
    d.wait(timeout=120)
    # 8 queued at once against 8 in a row.
    at_once, in_a_row = [], []
    eight = [{"session": sid, "code": "print(1)"}] * 8
    for _ in range(max(5, a.rounds)):
        t0 = time.monotonic()
        m.calls_at_once("run_code", eight)
        at_once.append(time.monotonic() - t0)
        t0 = time.monotonic()
        for args in eight:
            m.tool("run_code", **args)
        in_a_row.append(time.monotonic() - t0)
    out["queued"] = {"at_once_median_s": statistics.median(at_once),
                     "in_a_row_median_s": statistics.median(in_a_row),
                     "ratio": statistics.median(at_once) / statistics.median(in_a_row),
                     "goal": 1.1}
    log("queued: 8 at once %.2f s, 8 in a row %.2f s" % (out["queued"]["at_once_median_s"],
                                                           out["queued"]["in_a_row_median_s"]))
    m.close()
    out["run_code"] = {"mcp_median_ms": median_ms(mcp_rt), "library_median_ms": median_ms(lib_rt),
                       "ratio": statistics.median(mcp_rt) / statistics.median(lib_rt),
                       "goal": 1.5}
    log("run_code: mcp %.1f ms, library %.1f ms" % (out["run_code"]["mcp_median_ms"],
                                                    out["run_code"]["library_median_ms"]))
    benchlib.emit(out, a.json)


if __name__ == "__main__":
    main()

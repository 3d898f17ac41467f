#!/usr/bin/env python3
"""E2B compatibility's costs (issue 32), each against its baseline measured in the same run,
JSON on stdout:

create_run: Sandbox.create() + runCode("1+1") through @e2b/code-interpreter, from the warm pool,
  against the same through airlock's own Python client (Sandbox(image) + run_code), rounds
  alternated, the pool refilled before each (goal: ratio of medians at most 1.3). Both clients
  are long-lived processes, as an application that makes sandboxes is (an untimed round
  first for each); cold_process_ms is the SDK's round in a fresh node process (its modules
  load and its connections open inside the timing), reported beside.
run_true: commands.run("true") round trips through the e2b SDK against airlockd's own exec
  round trip (the Python client's commands.run in an open session) of `true` (goal: at most
  1.5), and of what the SDK really runs, `/bin/bash -l -c true` (same_argv_ratio).
load: SANDBOXES sandboxes x PER concurrent commands through the SDK: errors (goal 0) and the
  daemon's RSS before and after.

Usage: bench/e2b.py [--build DIR] [--image-dir DIR] [--rounds N] [--sandboxes S] [--per P]
Needs the SDKs from the npm registry (installed as tests/integration/test_e2b.py pins them).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path[:0] = [os.path.join(ROOT, "tests", "integration"), os.path.join(ROOT, "clients", "python")]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build-test"))
    ap.add_argument("--image-dir", default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sandboxes", type=int, default=20)
    ap.add_argument("--per", type=int, default=5)
    args = ap.parse_args()
    os.environ.setdefault("AIRLOCKD_BIN", os.path.join(args.build, "daemon", "airlockd"))
    os.environ.setdefault("AIRLOCK_BIN", os.path.join(args.build, "orchestrator", "airlock"))
    os.environ["AIRLOCK_IMAGE_DIR"] = args.image_dir or os.path.join(args.build, "images")
    os.environ.setdefault("AIRLOCK_NPM_DIR", os.path.join(args.build, "npm"))
    from airlock import Sandbox
    from test_e2b import SDKS, E2bDaemon
    from test_mcp import npm_install
    npm = npm_install(SDKS)
    node = os.path.join(npm, "node_modules", ".bin", "node")
    e = E2bDaemon(pool_size=1, pool_image="debian", max_sessions=64, max_memory_mib=65536,
                  max_vcpus=64)
    url = "http://127.0.0.1:%d" % e.port
    env = dict(os.environ, E2B_API_URL=url, E2B_SANDBOX_URL=url, E2B_API_KEY=e.e2b_key)

    def sdk(*a):
        p = subprocess.run([node, os.path.join(HERE, "e2b-sdk.mjs"), npm] + [str(x) for x in a],
                           stdout=subprocess.PIPE, env=env, check=True, timeout=900)
        return json.loads(p.stdout)

    def pool_ready():
        end = time.time() + 120
        while time.time() < end:
            h = e.d.unix().request("GET", "/v1/health")
            if (h.get("pool") or {}).get("ready"):
                return
            time.sleep(0.2)

    out = {"image": "debian"}
    try:
        ours, theirs, cold = [], [], []
        runs = subprocess.Popen([node, os.path.join(HERE, "e2b-sdk.mjs"), npm, "create_runs"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)

        def sdk_round():
            pool_ready()
            runs.stdin.write(b"go\n")
            runs.stdin.flush()
            return json.loads(runs.stdout.readline())["ms"]

        def our_round():
            pool_ready()
            t0 = time.monotonic()
            sb = Sandbox(image="debian", client=e.d.tcp(e.key))
            r = sb.run_code("1+1")
            ms = (time.monotonic() - t0) * 1000
            sb.kill()
            if r.text.strip() != "2":
                raise AssertionError("1+1 = %r" % r.text)
            return ms

        sdk_round(), our_round()  # untimed: each client's first round
        for i in range(args.rounds):
            theirs.append(sdk_round())
            ours.append(our_round())
            log("create_run %d: e2b %.0f ms, ours %.0f ms" % (i, theirs[-1], ours[-1]))
        runs.stdin.close()
        runs.wait(timeout=60)
        for i in range(max(3, args.rounds // 2)):
            pool_ready()
            cold.append(sdk("create_run")["ms"])
        log("create_run in a new node process: %s ms" % ["%.0f" % x for x in cold])
        out["create_run"] = {"e2b_ms": theirs, "baseline_ms": ours,
                             "ratio": statistics.median(theirs) / statistics.median(ours),
                             "cold_process_ms": cold,
                             "cold_process_ratio": statistics.median(cold) /
                             statistics.median(ours),
                             "goal": 1.3}
        n = 10 * args.rounds
        theirs = sdk("run_true", n)["ms"]
        sb = Sandbox(image="debian", client=e.d.tcp(e.key))
        sb.commands.run("true")
        ours, same = [], []
        for _ in range(n):
            t0 = time.monotonic()
            sb.commands.run(["true"])
            ours.append((time.monotonic() - t0) * 1000)
            t0 = time.monotonic()
            sb.commands.run(["/bin/bash", "-l", "-c", "true"])
            same.append((time.monotonic() - t0) * 1000)
        sb.kill()
        out["run_true"] = {"e2b_median_ms": statistics.median(theirs),
                           "baseline_median_ms": statistics.median(ours),
                           "same_argv_median_ms": statistics.median(same),
                           "ratio": statistics.median(theirs) / statistics.median(ours),
                           "same_argv_ratio": statistics.median(theirs) / statistics.median(same),
                           "goal": 1.5}
        log("run_true: e2b %.1f ms, ours %.1f ms" % (out["run_true"]["e2b_median_ms"],
                                                    out["run_true"]["baseline_median_ms"]))
        before = e.d.rss_kib()
        got = sdk("load", args.sandboxes, args.per)
        out["load"] = {"sandboxes": args.sandboxes, "per": args.per, "errors": got["errors"],
                       "ms": got["ms"], "rss_before_kib": before, "rss_after_kib": e.d.rss_kib()}
        log("load: %s" % out["load"])
    finally:
        e.stop()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Open Interpreter's Python API on Airlock (issue 53), each goal against its baseline measured
in the same run, with the project's fake model (tests/fakemodel):

chat: a one-block task (the model asks for print(6*7), then answers) through
  airlock.Interpreter().chat() from a new instance (its VM included), against `airlock run -y`
  of the same task, rounds alternated (goal: ratio of medians at most 1.1).
first_chunk: in an instance whose VM is up, the time from chat() to its first chunk, against
  the time from a direct request to the same fake model to its first byte (goal: at most 50 ms
  later).

Usage: bench/interpreter.py [--build DIR] [--image-dir DIR] [--image NAME] [--rounds N]
       [--json FILE]
"""
import argparse
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import benchlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
os.environ.setdefault("AIRLOCK_SOURCE_ROOT", ROOT)  # where altest finds tests/fakemodel
import altest  # noqa: E402  (its start_fake_model)
TASK = [{"text": "Running it.", "tool_calls": [{"name": "execute", "arguments": {
    "language": "python", "code": "print(6 * 7)"}}]}, {"text": "It printed 42."}]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def first_byte_s(port):
    """A streamed request straight to the fake model: seconds to the first byte of its body."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = json.dumps({"model": "fake", "stream": True,
                       "messages": [{"role": "user", "content": "hi"}]})
    t0 = time.monotonic()
    c.request("POST", "/v1/chat/completions", body=body,
              headers={"Content-Type": "application/json", "Authorization": "Bearer k"})
    r = c.getresponse()
    r.read(1)
    t = time.monotonic() - t0
    r.read()
    c.close()
    return t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build-test")
    ap.add_argument("--image-dir", default=os.environ.get("AIRLOCK_IMAGE_DIR", ""))
    ap.add_argument("--image", default="debian")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    airlock = os.path.abspath(os.path.join(a.build, "orchestrator", "airlock"))
    tmp = tempfile.mkdtemp(prefix="airlock-bench-oi-")
    os.environ.update(AIRLOCK_BIN=airlock, AIRLOCK_WARM="use", OPENAI_API_KEY="k",
                      AIRLOCK_IMAGE_DIR=a.image_dir or os.path.join(a.build, "images"),
                      XDG_DATA_HOME=tmp, XDG_CONFIG_HOME=tmp)
    from airlock import Interpreter
    out = {"image": a.image, "rounds": a.rounds, "machine": benchlib.machine()}
    procs = []
    try:
        # chat() from a new instance against airlock run, alternated; one fake model each
        sides = {}
        for side in ("interpreter", "run"):
            d = os.path.join(tmp, side)
            os.makedirs(d)
            p, port = altest.start_fake_model(TASK * a.rounds, d)
            procs.append(p)
            sides[side] = "http://127.0.0.1:%d/v1" % port
        oi_s, run_s = [], []
        for i in range(a.rounds):
            t0 = time.monotonic()
            it = Interpreter(image=a.image, auto_run=True)
            it.llm.model, it.llm.api, it.llm.api_base = "fake", "openai", sides["interpreter"]
            new = it.chat("what is 6 * 7?", display=False)
            oi_s.append(time.monotonic() - t0)
            assert new[-1]["content"] == "It printed 42.", new
            it.reset()
            t0 = time.monotonic()
            r = subprocess.run([airlock, "-q", "run", "-y", "--image", a.image, "--api",
                                "openai", "--api-base", sides["run"], "--model", "fake",
                                "what is 6 * 7?"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
            run_s.append(time.monotonic() - t0)
            if r.returncode:
                raise RuntimeError("airlock run: %s" % r.stderr.decode(errors="replace"))
            log("round %d: interpreter %.2f s, run %.2f s" % (i, oi_s[-1], run_s[-1]))
        out["chat"] = {"interpreter_s": oi_s, "run_s": run_s,
                       "ratio": statistics.median(oi_s) / statistics.median(run_s), "goal": 1.1}

        # first chunk, in an instance whose VM is up, against the model's own first byte
        d = os.path.join(tmp, "first")
        os.makedirs(d)
        n = max(10, a.rounds * 2)
        p, port = altest.start_fake_model([{"text": "hello there"}] * (2 * n + 1), d)
        procs.append(p)
        it = Interpreter(image=a.image, auto_run=True)
        it.llm.model, it.llm.api = "fake", "openai"
        it.llm.api_base = "http://127.0.0.1:%d/v1" % port
        it.chat("warm up", display=False)
        chunk_s, byte_s = [], []
        for _ in range(n):
            t0 = time.monotonic()
            for c in it.chat("hi", display=False, stream=True):
                if c.get("role") != "server":
                    chunk_s.append(time.monotonic() - t0)
                    break
            for _ in it.chat(display=False, stream=True):  # nothing pending: returns at once
                pass
            byte_s.append(first_byte_s(port))
        it.reset()
        later = (statistics.median(chunk_s) - statistics.median(byte_s)) * 1000
        out["first_chunk"] = {"chunk_median_ms": statistics.median(chunk_s) * 1000,
                              "model_first_byte_median_ms": statistics.median(byte_s) * 1000,
                              "later_ms": later, "goal_ms": 50,
                              "note": "a chunk stream left after its first chunk stops the "
                                      "turn (SIGINT): each round is a new turn"}
        log("first chunk %.1f ms after chat(), the model's first byte %.1f ms" % (
            out["first_chunk"]["chunk_median_ms"],
            out["first_chunk"]["model_first_byte_median_ms"]))
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    benchlib.emit(out, a.json)


if __name__ == "__main__":
    main()

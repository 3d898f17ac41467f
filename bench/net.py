#!/usr/bin/env python3
"""Network on request: what the proxy path costs. Prints JSON on stdout (or --json FILE).

  bench/net.py [--build DIR] [--image NAME] [--rounds N] [--json FILE]

Against the test internet of tests/integration/netlab.py (a network namespace on this machine,
nothing leaves it), in one run:
  download: MB/s of a 32 MiB file from the lab's HTTP server, (a) by the host directly, (b) by
    the host through the session's Squid (the proxy's own cost; with the PROXY header its relay
    sends), (c) by a program in the guest
    through the whole path (guest forwarder, QEMU's user network, the relay, Squid);
  small_request: median ms of a GET of a 29-byte file on a fresh connection, the same three ways.
The guest runs under emulation here, so (c) measures the emulated guest as much as the path.
Needs root (ip netns) and the debian image.
"""
import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time

import benchlib
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import netlab  # noqa: E402

MEASURE = r'''
import http.client, json, statistics, sys, time, urllib.request
class _First(http.client.HTTPConnection):
    first = b""  # sent before each request's bytes: the PROXY header Squid asks of its relay
    def connect(self):
        super().connect()
        self.sock.sendall(self.first)
class _FirstHandler(urllib.request.HTTPHandler):
    def http_open(self, req):
        return self.do_open(_First, req)
def measure(big, small, rounds, proxy, first=b""):
    _First.first = first
    op = urllib.request.build_opener(urllib.request.ProxyHandler(proxy), _FirstHandler)
    rates, lat = [], []
    for _ in range(rounds):
        t = time.monotonic()
        n = 0
        with op.open(big, timeout=120) as r:
            while True:
                b = r.read(1 << 16)
                if not b:
                    break
                n += len(b)
        rates.append(round(n / (time.monotonic() - t) / 1e6, 2))
    for _ in range(20):
        t = time.monotonic()
        with op.open(small, timeout=60) as r:
            r.read()
        lat.append(round((time.monotonic() - t) * 1000, 2))
    return {"download_MBps": rates, "download_MBps_median": statistics.median(rates),
            "small_request_ms_median": statistics.median(lat), "small_request_ms": lat}
'''


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--image", default="debian")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    airlock = os.path.join(a.build, "orchestrator", "airlock")
    env = dict(os.environ)
    env.setdefault("AIRLOCK_IMAGE_DIR", os.path.join(a.build, "images"))
    ns = {}
    exec(MEASURE, ns)
    lab = netlab.NetLab().start()
    try:
        big = "http://big.test/big.bin"
        small = "http://web.test/hello.txt"
        # (a) the host, directly, by address (the host resolves no test names).
        direct = ns["measure"]("http://%s/big.bin" % lab.server_ip,
                               "http://%s/hello.txt" % lab.server_ip, a.rounds, {})
        env["AIRLOCK_NET_HOSTS_FILE"] = lab.hosts
        guest = MEASURE + "print(json.dumps(measure(%r, %r, %d, {'http': 'http://127.0.0.1:3128'})))\n" \
            "sys.stdout.flush()\ntime.sleep(60)\n" % (big, small, a.rounds)
        p = subprocess.Popen([airlock, "--debug", "exec", "--image", a.image, "--net",
                              "allow=big.test,web.test", "--net-limit", str(8 << 30), "--",
                              "python3", "-c", guest], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=env)
        name = None
        for line in p.stderr:
            m = re.search(rb"airlock: session (airlock-[0-9a-f]+)", line)
            if m:
                name = m.group(1).decode()
                break
        in_guest = json.loads(p.stdout.readline())
        # (b) the host through the same session's Squid, while the guest sleeps.
        run_dir = os.environ.get("AIRLOCK_RUNTIME_DIR", "/run/airlock") + "/sessions"
        conf = open(os.path.join(run_dir, name, "net", "squid.conf")).read()
        port = int(re.search(r"^http_port 127\.0\.0\.1:(\d+)", conf, re.M).group(1))
        # Squid serves only its relay: a PROXY header with the relay's address (the conf's).
        relay = re.search(r"^acl al_relay src (\S+)", conf, re.M)
        first = ("PROXY TCP6 %s ::1 1024 3128\r\n" % relay.group(1)).encode() if relay else b""
        via_squid = ns["measure"](big, small, a.rounds, {"http": "http://127.0.0.1:%d" % port},
                                  first)
        p.terminate()  # airlock closes the session: the VM and its Squid go
        p.wait()
    finally:
        lab.stop()
    out = {
        "machine": {"cpus": os.cpu_count(), "load_average_1m": round(os.getloadavg()[0], 2)},
        "image": a.image,
        "file_bytes": netlab.BIG_BYTES,
        "host_direct": direct,
        "host_via_squid": via_squid,
        "guest_via_relay_and_squid": in_guest,
        "squid_throughput_ratio": round(via_squid["download_MBps_median"] /
                                        direct["download_MBps_median"], 3),
        "guest_throughput_ratio": round(in_guest["download_MBps_median"] /
                                        direct["download_MBps_median"], 3),
        "squid_added_latency_ms": round(via_squid["small_request_ms_median"] -
                                        direct["small_request_ms_median"], 2),
        "guest_added_latency_ms": round(in_guest["small_request_ms_median"] -
                                        direct["small_request_ms_median"], 2),
    }
    benchlib.emit(out, a.json)


if __name__ == "__main__":
    main()

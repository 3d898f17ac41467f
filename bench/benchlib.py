"""What the benchmark scripts share: writing their JSON, running threads side by side, the
arguments every airlockd benchmark takes."""
import argparse
import json
import os
import platform
import sys
import time
import threading


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def use_tests():
    """The integration tests' helpers and the Python client importable (airlockd benchmarks)."""
    for p in (os.path.join(ROOT, "tests", "integration"), os.path.join(ROOT, "clients", "python")):
        if p not in sys.path:
            sys.path.insert(0, p)


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def emit(result, path, echo=True):
    """The result as indented JSON: into path when given; on stdout when echo (always when
    there is no path)."""
    text = json.dumps(result, indent=2) + "\n"
    if path:
        with open(path, "w") as f:
            f.write(text)
    if echo or not path:
        print(text, end="")


def machine():
    """What the numbers were measured on: host, CPUs, memory, whether KVM was there, and the
    load averages at the time (a shared machine's other work shows there)."""
    model, mem_kib = "", 0
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    return {"host": platform.node(), "cpus": os.cpu_count(), "cpu": model,
            "mem_gib": round(mem_kib / (1 << 20), 1), "kernel": platform.release(),
            "dev_kvm": os.path.exists("/dev/kvm"),
            "load": [round(x, 2) for x in os.getloadavg()]}


def run_threads(target, n, args=None):
    """n threads of target (with args(i) as its arguments when given), started together and
    joined; the wall time in seconds."""
    threads = [threading.Thread(target=target, args=args(i) if args else ()) for i in range(n)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.monotonic() - t0


def wait_socket(path, seconds=30):
    """Waits until path exists (a daemon's socket); whether it came."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if os.path.exists(path):
            return True
        time.sleep(0.1)
    return False


def airlockd_args():
    """airlockd AIRLOCK_BENCH [--image IMAGE]: the arguments of the airlockd benchmarks."""
    ap = argparse.ArgumentParser()
    ap.add_argument("airlockd")
    ap.add_argument("airlock_bench")
    ap.add_argument("--image", default="tiny")
    return ap

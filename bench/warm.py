#!/usr/bin/env python3
"""Warm starts against cold boots, ratios from one run. Prints a table on stderr and JSON on
stdout (or --json FILE).

  bench/warm.py [--build DIR] [--image-dir DIR] [--image NAME] [--rounds N] [--json FILE]

session_ready: wall time of `airlock exec -- true` from the image's template (AIRLOCK_WARM=use)
against the same with a cold boot (AIRLOCK_WARM=off), rounds alternated so drift hits both alike;
the split of the warm ones from `airlock --debug`'s timing line (start: libvirt creating the
paused domain; handshake: device state loaded, resumed, agent re-handshaken).
first_plot: the first python result that uses pandas and matplotlib (`df.plot(); plt.show()` on a
4-row frame, in the python kernel), warm against cold: the time until the result's first line is
on the CLI's stdout (ratio), and until the command ended, teardown included (end_ratio).
pool: a pool of 2 (tests/pool-driver), refilled between requests: hand-out to the first exec
of `true` finished, against the exec round trip of `true` in the same, open session.
memory: the PSS and RSS of QEMU for an idle session (two sessions open at once, so pages
restored sessions share count half), restored against cold-booted.
libvirt_floor: `virsh create --paused` + `virsh destroy` of a bare domain of the same memory, which
every session pays (restored or not), over the cold session ready time.
restore: our restore (start + handshake of the timing line) against `virsh save` / `virsh
restore` of a cold session's domain.
Templates live in a state dir of the benchmark's own (AIRLOCK_STATE_DIR).
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import benchlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
READY_LINE = re.compile(r"ready in (\d+) ms: prepare (\d+), start (\d+), boot to handshake (\d+)"
                        r"(?:; restored from a template, made unique in (\d+) ms)?")
PLOT = ("import pandas as pd, matplotlib.pyplot as plt\n"
        "pd.DataFrame({'a': [1, 2, 3, 4]}).plot()\nplt.show()")
VIRSH = ["virsh", "-c", "qemu:///system"]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


class Bench:
    def __init__(self, args):
        self.args = args
        self.airlock = os.path.abspath(os.path.join(args.build, "orchestrator", "airlock"))
        self.state = tempfile.mkdtemp(prefix="airlock-warm-bench-", dir="/var/tmp")
        os.chmod(self.state, 0o755)
        self.env = dict(os.environ)
        self.env.update({"AIRLOCK_IMAGE_DIR": args.image_dir, "AIRLOCK_STATE_DIR": self.state,
                         "LD_LIBRARY_PATH": os.path.join(args.build, "orchestrator")})

    def run(self, argv, warm, **kw):
        e = dict(self.env)
        e["AIRLOCK_WARM"] = warm
        t0 = time.monotonic()
        r = subprocess.run(argv, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, **kw)
        dt = time.monotonic() - t0
        if r.returncode != 0:
            raise RuntimeError("%s failed: %s" % (argv, r.stderr))
        return dt, r

    def exec_true(self, warm):
        dt, r = self.run([self.airlock, "--debug", "-q", "exec", "--image", self.args.image, "--",
                          "true"], warm)
        m = READY_LINE.search(r.stderr)
        split = {k: int(v) for k, v in zip(("ready", "prepare", "start", "handshake", "unique"),
                                           m.groups()) if v is not None} if m else {}
        if warm == "use" and "unique" not in split:
            raise RuntimeError("a warm session booted cold: %s" % r.stderr)
        return dt, split, "unique" in split

    def session_ready(self):
        cold, warm, splits = [], [], []
        for _ in range(self.args.rounds):
            dt, _, _ = self.exec_true("off")
            cold.append(dt)
            dt, split, _ = self.exec_true("use")
            warm.append(dt)
            splits.append(split)
        c, w = statistics.median(cold), statistics.median(warm)
        return {"cold_s": cold, "warm_s": warm, "cold_median_s": c, "warm_median_s": w,
                "ratio": w / c, "goal": 0.25, "warm_split_ms": splits}

    def timed_result(self, argv, warm, cwd):
        """(seconds to the first line of the run's result on stdout, seconds to the command's
        end): the result is there before the session's teardown (libvirt's destroy, ~0.2 s)."""
        e = dict(self.env)
        e["AIRLOCK_WARM"] = warm
        t0 = time.monotonic()
        p = subprocess.Popen(argv, env=e, cwd=cwd, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        first = p.stdout.readline()
        t_result = time.monotonic() - t0
        rest, err = p.communicate()
        t_end = time.monotonic() - t0
        if p.returncode != 0 or "Figure" not in first:
            raise RuntimeError("%s failed (%d): %r %s" % (argv, p.returncode, first + rest, err))
        return t_result, t_end

    def libvirt_floor(self, cold_median):
        """What libvirt alone costs any session, restored or not: a paused start and a destroy
        of a bare domain of the same memory (no disk, no guest code runs). Over the cold
        session's time it is the ratio an instant restore would reach."""
        xml = ("<domain type='qemu'><name>airlock-bench-floor</name>"
               "<memory unit='MiB'>512</memory><vcpu>1</vcpu>"
               "<os><type arch='x86_64'>hvm</type></os><devices/></domain>")
        path = os.path.join(self.state, "floor.xml")
        with open(path, "w") as f:
            f.write(xml)
        starts, destroys = [], []
        for _ in range(self.args.rounds):
            t0 = time.monotonic()
            subprocess.run(VIRSH + ["create", "--paused", path], check=True,
                           stdout=subprocess.DEVNULL)
            t1 = time.monotonic()
            subprocess.run(VIRSH + ["destroy", "airlock-bench-floor"], check=True,
                           stdout=subprocess.DEVNULL)
            starts.append(t1 - t0)
            destroys.append(time.monotonic() - t1)
        floor = statistics.median(starts) + statistics.median(destroys)
        return {"start_paused_s": starts, "destroy_s": destroys, "floor_s": floor,
                "floor_ratio": floor / cold_median}

    def first_plot(self):
        cold, warm, cold_end, warm_end = [], [], [], []
        argv = [self.airlock, "-q", "exec", "--image", self.args.image, "--lang", "python", "--kernel",
                "-c", PLOT]
        outputs = tempfile.mkdtemp(prefix="airlock-warm-bench-out-")
        try:
            for _ in range(max(1, self.args.rounds // 2)):
                for runs, ends, w in ((cold, cold_end, "off"), (warm, warm_end, "use")):
                    r, e = self.timed_result(argv, w, outputs)
                    runs.append(r)
                    ends.append(e)
        finally:
            shutil.rmtree(outputs, ignore_errors=True)
        c, w = statistics.median(cold), statistics.median(warm)
        ce, we = statistics.median(cold_end), statistics.median(warm_end)
        return {"cold_s": cold, "warm_s": warm, "ratio": w / c, "goal": 0.1,
                "cold_end_s": cold_end, "warm_end_s": warm_end, "end_ratio": we / ce}

    def pool(self):
        e = dict(self.env)
        e.update({"POOL_SETTLE_S": "20", "POOL_GAP_S": "8", "POOL_FIRST": "true"})
        driver = os.path.join(self.args.build, "tests", "pool-driver")
        r = subprocess.run([driver, self.args.image, "2", "1", str(self.args.rounds)], env=e,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            raise RuntimeError("pool-driver failed: %s" % r.stderr)
        takes = [json.loads(l) for l in r.stdout.splitlines() if '"thread"' in l]
        first = [t["first_exec_ms"] for t in takes]
        rtt = [t["true_ms"] for t in takes]
        return {"handout_to_first_exec_ms": first, "exec_true_ms": rtt,
                "restored": [t["restored"] for t in takes],
                "ratio": statistics.median(first) / statistics.median(rtt), "goal": 3.0}

    def qemu_mem(self, name):
        with open("/run/libvirt/qemu/%s.pid" % name) as f:
            pid = int(f.read().strip())
        out = {}
        with open("/proc/%d/smaps_rollup" % pid) as f:
            for line in f:
                k, v = line.split(":", 1)
                if k in ("Rss", "Pss"):
                    out[k.lower() + "_mib"] = int(v.split()[0]) / 1024
        return out

    def open_idle(self, warm):
        e = dict(self.env)
        e["AIRLOCK_WARM"] = warm
        driver = os.path.join(self.args.build, "tests", "kernel-driver")
        p = subprocess.Popen([driver, self.args.image], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, env=e, text=True)
        hello = json.loads(p.stdout.readline())
        return p, hello

    def memory(self):
        res = {}
        for warm in ("off", "use"):
            ps = [self.open_idle(warm) for _ in range(2)]
            time.sleep(10)
            mems = [self.qemu_mem(h["session"]) for _, h in ps]
            res[warm] = {"restored": [h["restored"] for _, h in ps], "per_session": mems,
                         "pss_mib": statistics.mean(m["pss_mib"] for m in mems),
                         "rss_mib": statistics.mean(m["rss_mib"] for m in mems)}
            for p, _ in ps:
                p.stdin.close()
                p.wait(timeout=120)
        return {"cold": res["off"], "warm": res["use"],
                "pss_ratio": res["use"]["pss_mib"] / res["off"]["pss_mib"],
                "rss_ratio": res["use"]["rss_mib"] / res["off"]["rss_mib"], "goal": 0.5,
                "reductions": "none beyond sharing the template's RAM (no init_on_free, "
                              "no free page reporting, no TCG cache cap)"}

    def virsh_restore(self):
        """virsh save/restore of a cold session's domain, and our restore's split (first, so the
        domain virsh restored, which is not ours to tidy, cannot slow it)."""
        ours = [self.exec_true("use")[1] for _ in range(self.args.rounds)]
        ours_ms = statistics.median(s["start"] + s["handshake"] for s in ours if s)
        p, hello = self.open_idle("off")
        name = hello["session"]
        img = os.path.join(self.state, "virsh-save.img")
        try:
            t0 = time.monotonic()
            subprocess.run(VIRSH + ["save", name, img], check=True, stdout=subprocess.DEVNULL)
            t1 = time.monotonic()
            subprocess.run(VIRSH + ["restore", img], check=True, stdout=subprocess.DEVNULL)
            t2 = time.monotonic()
            size = os.path.getsize(img)
            subprocess.run(VIRSH + ["destroy", name], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        finally:
            p.kill()
            p.wait()
            if os.path.exists(img):
                os.unlink(img)
        return {"virsh_save_s": t1 - t0, "virsh_restore_s": t2 - t1, "save_image_bytes": size,
                "ours_restore_ms": ours_ms, "ours_split_ms": ours,
                "template_state_bytes": self.template_state_bytes()}

    def template_state_bytes(self):
        d = os.path.join(self.state, "templates")
        for t in os.listdir(d):
            if not t.startswith("."):
                return {f: os.stat(os.path.join(d, t, f)).st_blocks * 512
                        for f in ("ram", "state", "disk.qcow2")}
        return {}

    def main(self):
        try:
            t0 = time.monotonic()
            self.run([self.airlock, "-q", "image", "warm", self.args.image], "off")
            build_s = time.monotonic() - t0
            log("template built in %.1f s" % build_s)
            out = {"image": self.args.image, "rounds": self.args.rounds,
                   "template_build_s": build_s}
            for k in ("session_ready", "first_plot", "pool", "memory", "virsh_restore"):
                out[k] = getattr(self, k)()
                if k == "session_ready":
                    out["libvirt_floor"] = self.libvirt_floor(out[k]["cold_median_s"])
                log(k, json.dumps({a: b for a, b in out[k].items()
                                   if not isinstance(b, (list, dict))}))
            out["load_avg"] = os.getloadavg()
            return out
        finally:
            shutil.rmtree(self.state, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--image-dir", default=None)
    ap.add_argument("--image", default="debian")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    args.image_dir = args.image_dir or os.path.join(args.build, "images")
    out = Bench(args).main()
    benchlib.emit(out, args.json, echo=False)


if __name__ == "__main__":
    main()

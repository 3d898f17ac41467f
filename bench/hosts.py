#!/usr/bin/env python3
"""Many hosts (issue 20), measured in one run, ratios against a baseline of the same run. Prints a
summary on stderr and JSON on stdout (or --json FILE). Must run as root (a second libvirtd).

  bench/hosts.py [--build DIR] [--image-dir DIR] [--image NAME] [--start-images tiny,debian]
                 [--rtt N] [--stream-mib N] [--stream-rounds N] [--starts N] [--burst K]
                 [--rate-rounds N] [--json FILE]

The "remote" host is tests/integration/remotehost.py: a second, independent libvirtd on this
machine reached over qemu+tcp://127.0.0.2 (loopback; no network latency, and the same CPUs: it
measures the code path, not a real second machine).

channels: in one open session each, the exec round trip of `true` (median ms over --rtt rounds)
and the guest->host stream (MB/s: --stream-mib MiB of `dd` output to stdout, over the wall time
of that exec), for (a) a local session over the socket on the local disk (AIRLOCK_CHANNEL=socket,
the baseline), (b) a local session over the libvirt stream (AIRLOCK_CHANNEL=stream,
virDomainOpenChannel + virStream), (c) a session on the remote host (always the stream, through
the remote libvirtd). The three sessions are held open at once (tests/kernel-driver, one per
variant) and the rounds alternate between them, so drift and the load of the idle guests hit all
alike. Ratios b/a and c/a. airlock-bench session (the library's own benchmark: first byte to last
byte into a pipe) is run for (a) and (b) as a cross-check; it refuses a remote host (its raw
benchmark port is a socket on the local disk), which is recorded.
starts: POST /v1/sessions until it returns, through one airlockd configured with both hosts
(far = the remote one, listed first, and near = this machine's): with none open the first listed
wins the tie, so each round places one session on far, then one on near (far now holds one),
checked through GET /v1/hosts; both are deleted before the next round. The first start on far
of an image includes uploading it there as volumes: first and subsequent are reported apart.
rate: K sessions of the tiny image created from K threads at once, K / wall seconds, through a
daemon with both hosts (max_sessions=K/2 each) against one with the local host alone
(max_sessions=K); rounds alternated. Both hosts share this machine's CPUs, so this measures
placement and the daemon's concurrency, not the capacity a second machine adds.
Every session boots cold (AIRLOCK_WARM=off): templates are files on the local host and would
favour it.
"""
import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import benchlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
VIRSH = ["virsh", "-q", "-c", "qemu:///system"]
TRUE = {"op": "exec", "code": "true"}  # no lang: `true` exec'd directly, as airlock-bench does


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def med(xs):
    return statistics.median(xs) if xs else None


def rnd(x, n=3):
    return round(x, n) if isinstance(x, float) else x


class Driver:
    """tests/kernel-driver: one session held open, one JSON request per line."""

    def __init__(self, bench, name, image, env):
        self.name = name
        self.err_path = os.path.join(bench.tmp, "driver-%s.err" % name)
        self.err = open(self.err_path, "w")
        self.uri = env["LIBVIRT_DEFAULT_URI"]
        self.session = None
        self.p = subprocess.Popen([bench.kernel_driver, image], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=self.err, env=env, text=True)
        bench.drivers.append(self)
        t0 = time.monotonic()
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError("kernel-driver (%s) did not open a session: %s" %
                               (name, self.stderr()))
        self.open_s = time.monotonic() - t0
        self.session = json.loads(line)["session"]
        bench.ids.append(self.session)

    def stderr(self):
        with open(self.err_path) as f:
            return f.read()[-2000:]

    def exec(self, req):
        """The request's answer; its "ms" is the library's al_exec, timed in the driver."""
        self.p.stdin.write(json.dumps(req) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError("kernel-driver (%s) died: %s" % (self.name, self.stderr()))
        ans = json.loads(line)
        if ans.get("r") != 0 or ans.get("value") != 0:
            raise RuntimeError("%s failed in %s: %s" % (req, self.name,
                                                       {k: ans.get(k) for k in
                                                        ("r", "error", "how", "value")}))
        return ans["ms"]

    def close(self):
        """Closes the session (EOF on stdin); a driver that does not end is killed and its
        domain destroyed."""
        if self.p.poll() is None:
            try:
                self.p.stdin.close()
                self.p.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.p.kill()
                self.p.wait()
        if self.p.returncode != 0 and self.session:
            subprocess.run(["virsh", "-q", "-c", self.uri, "destroy", self.session],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.err.close()


class Bench:
    def __init__(self, args):
        self.args = args
        self.tmp = tempfile.mkdtemp(prefix="airlock-hosts-bench-")
        self.kernel_driver = os.path.join(args.build, "tests", "kernel-driver")
        self.airlock_bench = os.path.join(args.build, "bench", "airlock-bench")
        # Every session of this run boots cold, and the local ones reach qemu:///system.
        self.env = dict(os.environ, AIRLOCK_WARM="off", LIBVIRT_DEFAULT_URI="qemu:///system")
        self.env.pop("AIRLOCK_CHANNEL", None)
        self.far = None
        self.drivers = []
        self.daemons = []
        self.ids = []  # every session's domain name (a daemon's: its id), checked at the end
        self.foreign = []  # others(): what else ran, phase by phase

    # ---- helpers ----

    def others(self, phase):
        """Domains on this machine's libvirtd that are not this run's (someone else's tests
        share the CPUs): noted per phase, so a disturbed number can be told apart."""
        names = subprocess.run(VIRSH + ["list", "--name"], stdout=subprocess.PIPE,
                               text=True).stdout.split()
        n = len([x for x in names if x not in self.ids])
        self.foreign.append({"phase": phase, "other_domains": n,
                             "load_avg_1m": round(os.getloadavg()[0], 2)})
        if n:
            log("note: %d domains of someone else running (%s)" % (n, phase))

    def variant_env(self, variant):
        e = dict(self.env)
        if variant == "socket":
            e["AIRLOCK_CHANNEL"] = "socket"
        elif variant == "stream":
            e["AIRLOCK_CHANNEL"] = "stream"
        else:  # remote: always the stream, whatever AIRLOCK_CHANNEL says
            e["LIBVIRT_DEFAULT_URI"] = self.far.uri
        return e

    def daemon(self, lines):
        from test_airlockd import Daemon
        d = Daemon(env={"AIRLOCK_WARM": "off"}, lines=lines, host_check_s=1,
                   connection_timeout_s=120, max_sessions=16, max_memory_mib=65536)
        self.daemons.append(d)
        return d

    def stop_daemon(self, d):
        """SIGTERM: the daemon destroys its sessions and exits 0."""
        if d not in self.daemons:
            return
        self.daemons.remove(d)
        rc = d.stop()
        text = d.text()
        shutil.rmtree(d.dir, ignore_errors=True)
        if rc != 0:
            raise RuntimeError("airlockd exited %s: %s" % (rc, text[-2000:]))

    def host_counts(self, c):
        return {h["name"]: h["sessions"] for h in c.request("GET", "/v1/hosts")["hosts"]}

    def create(self, c, image):
        """POST /v1/sessions; (seconds until it returned, the session's info)."""
        t0 = time.monotonic()
        info = c.request("POST", "/v1/sessions", body={"image": image})
        dt = time.monotonic() - t0
        self.ids.append(info["id"])
        return dt, info

    # ---- channels ----

    def lib_bench(self, variant):
        """airlock-bench session: the library's own round trip and stream, first byte to last."""
        r = subprocess.run([self.airlock_bench, "session", self.args.image, str(self.args.rtt),
                            str(self.args.stream_mib)], env=self.variant_env(variant),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
        if r.returncode != 0:
            return {"error": r.stderr.strip()[-300:]}
        return json.loads(r.stdout)

    def channels(self):
        a = self.args
        out = {"image": a.image, "rtt_rounds": a.rtt, "stream_mib": a.stream_mib}
        # The library's benchmark, one guest at a time, before the three are held open.
        out["airlock_bench"] = {v: self.lib_bench(v) for v in ("socket", "stream", "remote")}
        variants = ("socket", "stream", "remote")
        drv = {}
        for v in variants:
            drv[v] = Driver(self, v, a.image, self.variant_env(v))
            log("channels: %s session %s open in %.1f s" % (v, drv[v].session, drv[v].open_s))
        for v in variants:  # warm up: the first exec of each pays for page faults
            drv[v].exec(TRUE)
            drv[v].exec(TRUE)
        rtt = {v: [] for v in variants}
        self.others("channels: rounds")
        for _ in range(a.rtt):
            for v in variants:
                rtt[v].append(drv[v].exec(TRUE))
        dd = {"op": "exec", "lang": "sh",
              "code": "dd if=/dev/zero bs=65536 count=%d 2>/dev/null" % (a.stream_mib * 16)}
        mbs = {v: [] for v in variants}
        for _ in range(a.stream_rounds):
            for v in variants:
                ms = drv[v].exec(dd)
                mbs[v].append((a.stream_mib << 20) / (ms / 1000.0) / 1e6)
        for v in variants:
            drv[v].close()
            self.drivers.remove(drv[v])
        for v in variants:
            out[v] = {"rtt_ms": [rnd(x) for x in rtt[v]],
                      "rtt_ms_median": rnd(med(rtt[v])),
                      "stream_mb_s": [rnd(x, 1) for x in mbs[v]],
                      "stream_mb_s_median": rnd(med(mbs[v]), 1),
                      "session_open_s": rnd(drv[v].open_s, 2)}
        base = out["socket"]
        out["ratios"] = {
            "rtt_stream_over_socket": rnd(out["stream"]["rtt_ms_median"] /
                                          base["rtt_ms_median"], 2),
            "rtt_remote_over_socket": rnd(out["remote"]["rtt_ms_median"] /
                                          base["rtt_ms_median"], 2),
            "stream_mb_s_stream_over_socket": rnd(out["stream"]["stream_mb_s_median"] /
                                                  base["stream_mb_s_median"], 2),
            "stream_mb_s_remote_over_socket": rnd(out["remote"]["stream_mb_s_median"] /
                                                  base["stream_mb_s_median"], 2),
        }
        lb = out["airlock_bench"]
        if "rtt_ms_median" in lb["socket"] and "rtt_ms_median" in lb["stream"]:
            out["ratios"]["airlock_bench_rtt_stream_over_socket"] = rnd(
                lb["stream"]["rtt_ms_median"] / lb["socket"]["rtt_ms_median"], 2)
            out["ratios"]["airlock_bench_stream_mb_s_stream_over_socket"] = rnd(
                lb["stream"]["stream_mb_s"] / lb["socket"]["stream_mb_s"], 2)
        return out

    # ---- starts ----

    def starts(self, d):
        c = d.unix()
        out = {"images": {}}
        for image in self.args.start_images:
            far, near, kvm = [], [], set()
            far_del, near_del = [], []
            for i in range(self.args.starts):
                before = self.host_counts(c)
                t_far, s1 = self.create(c, image)
                mid = self.host_counts(c)
                t_near, s2 = self.create(c, image)
                after = self.host_counts(c)
                # Where each went, from the counts: far first (the tie), then near.
                if (mid["far"] - before["far"], after["near"] - mid["near"]) != (1, 1):
                    raise RuntimeError("placement not as planned: %s %s %s" % (before, mid, after))
                far.append(t_far)
                near.append(t_near)
                kvm |= {s1["kvm"], s2["kvm"]}
                # DELETE until it returns: the session closed, its domain (and volume) gone.
                for s, dels in ((s1, far_del), (s2, near_del)):
                    t0 = time.monotonic()
                    c.request("DELETE", "/v1/sessions/" + s["id"])
                    dels.append(time.monotonic() - t0)
                self.others("starts %s %d" % (image, i))
                log("starts: %s round %d: far %.2f s, near %.2f s" % (image, i, t_far, t_near))
            out["images"][image] = {
                "remote_s": [rnd(x, 3) for x in far],
                "local_s": [rnd(x, 3) for x in near],
                "remote_first_s": rnd(far[0], 3),
                "remote_subsequent_median_s": rnd(med(far[1:]), 3),
                "local_first_s": rnd(near[0], 3),
                "local_subsequent_median_s": rnd(med(near[1:]), 3),
                "ratio_remote_first_over_local": rnd(far[0] / med(near[1:]), 2),
                "ratio_remote_subsequent_over_local": rnd(med(far[1:]) / med(near[1:]), 2),
                "remote_delete_s": [rnd(x, 3) for x in far_del],
                "local_delete_s": [rnd(x, 3) for x in near_del],
                "remote_delete_median_s": rnd(med(far_del), 3),
                "local_delete_median_s": rnd(med(near_del), 3),
                "kvm": sorted(kvm),
            }
        vols = self.far.virsh("vol-list", "airlock").stdout.decode().split()
        out["remote_image_volumes"] = sorted(v for v in vols if v.startswith("image-"))
        return out

    # ---- rate ----

    def burst(self, d, k):
        """k sessions from k threads at once: (wall seconds, how many each host holds, each
        one's seconds by host)."""
        c = d.unix()
        infos, errors = [], []
        lock = threading.Lock()

        def one():
            try:
                dt, info = self.create(c, "tiny")
                info["_s"] = dt
                with lock:
                    infos.append(info)
            except Exception as e:  # reported; the round fails below
                with lock:
                    errors.append(repr(e)[:300])

        wall = benchlib.run_threads(one, k)
        counts = self.host_counts(c)
        # Each one's own time, by host (the remote host's domains are its ids there).
        far = set(self.far.domains())
        each = {"far": [], "near": []}
        for info in infos:
            each["far" if info["id"] in far else "near"].append(rnd(info["_s"], 3))
        for info in infos:
            c.request("DELETE", "/v1/sessions/" + info["id"])
        if errors:
            raise RuntimeError("burst errors: %s" % errors)
        return wall, counts, each

    def rate(self, both):
        k = self.args.burst
        res = {"two_hosts": [], "local_only": []}
        each = {"two_hosts": [], "local_only": []}
        placed = {}
        for i in range(self.args.rate_rounds):
            # Alternated: the daemon with both hosts (already running), then the local one.
            wall, placed["two_hosts"], e = self.burst(both, k)
            res["two_hosts"].append(wall)
            each["two_hosts"].append(e)
            local = self.daemon(["host = near qemu:///system max_sessions=%d" % k])
            try:
                wall, placed["local_only"], e = self.burst(local, k)
                res["local_only"].append(wall)
                each["local_only"].append(e)
            finally:
                self.stop_daemon(local)
            self.others("rate %d" % i)
            log("rate: round %d: two hosts %.2f s, local only %.2f s for %d sessions" %
                (i, res["two_hosts"][-1], res["local_only"][-1], k))
        out = {"sessions": k, "image": "tiny", "placed": placed}
        for name, walls in res.items():
            out[name] = {"wall_s": [rnd(x, 3) for x in walls], "each_s": each[name],
                         "sessions_per_s": [rnd(k / x, 3) for x in walls],
                         "sessions_per_s_median": rnd(med([k / x for x in walls]), 3)}
        out["ratio_two_hosts_over_local_only"] = rnd(
            out["two_hosts"]["sessions_per_s_median"] /
            out["local_only"]["sessions_per_s_median"], 2)
        return out

    # ---- the run ----

    def machine(self):
        model = ""
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
        return {"cores": os.cpu_count(), "cpu": model, "kernel": platform.release(),
                "dev_kvm": os.path.exists("/dev/kvm"),
                "libvirt": subprocess.run(["virsh", "--version"], stdout=subprocess.PIPE,
                                          text=True).stdout.strip()}

    def build_stamp(self):
        """When the binaries measured were built (the tree may be rebuilt while this runs)."""
        files = ["orchestrator/libairlock.so.1.0.0", "daemon/airlockd", "tests/kernel-driver",
                 "bench/airlock-bench"]
        out = {}
        for f in files:
            try:
                out[f] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(
                    os.stat(os.path.join(self.args.build, f)).st_mtime))
            except OSError:
                out[f] = None
        return out

    def main(self):
        from remotehost import RemoteHost
        t0 = time.monotonic()
        out = {"machine": self.machine(), "args": {k: v for k, v in vars(self.args).items()
                                                  if k != "json"},
               "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "built": self.build_stamp()}
        self.far = RemoteHost().start()
        out["remote_uri"] = self.far.uri
        # starts first: the remote host has no image yet, so its first start includes the
        # upload. Then the rate (same daemon), then the channels (no daemon).
        both = self.daemon(["host = far %s max_sessions=%d" % (self.far.uri, self.args.burst // 2),
                            "host = near qemu:///system max_sessions=%d" %
                            (self.args.burst - self.args.burst // 2)])
        self.others("starts")
        out["starts"] = self.starts(both)
        self.others("rate")
        out["rate"] = self.rate(both)
        self.stop_daemon(both)
        self.others("channels")
        out["channels"] = self.channels()
        self.others("end")
        out["other_activity"] = self.foreign
        kvm = set()  # what the sessions reported: KVM or emulation
        for i in out["starts"]["images"].values():
            kvm |= set(i["kvm"])
        for v in ("socket", "stream"):
            if "kvm" in out["channels"]["airlock_bench"][v]:
                kvm.add(out["channels"]["airlock_bench"][v]["kvm"])
        out["machine"]["sessions_kvm"] = sorted(kvm)
        if self.build_stamp() != out["built"]:
            out["rebuilt_during_run"] = self.build_stamp()
            log("note: the binaries were rebuilt while this ran")
        out["load_avg"] = os.getloadavg()
        out["wall_s"] = round(time.monotonic() - t0, 1)
        return out

    def cleanup(self):
        """Everything this run started goes, whatever failed: drivers, daemons, the remote host,
        temp dirs; then no domain of ours may be left on this machine's libvirtd."""
        problems = []
        for drv in list(self.drivers):
            try:
                drv.close()
            except Exception as e:
                problems.append("driver %s: %r" % (drv.name, e))
        for d in list(self.daemons):
            try:
                self.stop_daemon(d)
            except Exception as e:
                problems.append("daemon: %r" % e)
        if self.far:
            try:
                self.far.stop()
            except Exception as e:
                problems.append("remote host: %r" % e)
        shutil.rmtree(self.tmp, ignore_errors=True)
        names = subprocess.run(VIRSH + ["list", "--all", "--name"], stdout=subprocess.PIPE,
                               text=True).stdout.split()
        for n in names:
            if n in self.ids:
                problems.append("domain left: " + n)
                subprocess.run(VIRSH + ["destroy", n], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        return problems


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--image-dir", default=None)
    ap.add_argument("--image", default="debian", help="the channels' sessions")
    ap.add_argument("--start-images", default="tiny,debian")
    ap.add_argument("--rtt", type=int, default=40)
    ap.add_argument("--stream-mib", type=int, default=64)
    ap.add_argument("--stream-rounds", type=int, default=3)
    ap.add_argument("--starts", type=int, default=3, help="rounds per image, first included")
    ap.add_argument("--burst", type=int, default=4)
    ap.add_argument("--rate-rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    args.build = os.path.abspath(args.build)
    args.image_dir = os.path.abspath(args.image_dir or os.path.join(args.build, "images"))
    args.start_images = [x for x in args.start_images.split(",") if x]
    if args.starts < 2:
        ap.error("--starts: 2 at least (first and subsequent)")
    # What tests/integration reads when imported.
    agent = os.path.join(args.build, "guest-agent", "airlock-agent")
    os.environ.setdefault("AIRLOCKD_BIN", os.path.join(args.build, "daemon", "airlockd"))
    os.environ.setdefault("AIRLOCK_BIN", os.path.join(args.build, "orchestrator", "airlock"))
    os.environ.setdefault("AIRLOCK_SOURCE_ROOT", ROOT)
    os.environ["AIRLOCK_IMAGE_DIR"] = args.image_dir
    if os.path.exists(agent):
        os.environ.setdefault("AIRLOCK_AGENT_BIN", agent)

    # SIGTERM cleans up as an exception does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    b = Bench(args)
    try:
        out = b.main()
    finally:
        problems = b.cleanup()
        if problems:
            log("cleanup: " + "; ".join(problems))
    out["cleanup_problems"] = problems
    out["notes"] = notes(out)
    benchlib.emit(out, args.json, echo=False)
    summary(out)


def notes(out):
    n = ["Both hosts are this machine (two libvirtds; the far one over qemu+tcp to 127.0.0.2): no "
         "network latency, shared CPUs, so remote/local ratios show the code path's cost only.",
         "Sessions in emulation (TCG) unless machine.sessions_kvm says otherwise; "
         "AIRLOCK_WARM=off throughout.",
         "channels: the three sessions open at once, rounds alternated; stream MB/s is bytes "
         "over the whole exec's wall time (one exec start included); airlock-bench (one guest "
         "at a time, first byte to last) is the cross-check for socket and stream, and refuses "
         "a remote host (its raw port is a local socket).",
         "starts: the near session starts while the far one of its round is open and idle; "
         "delete times include the host destroying the domain (QEMU on the far libvirtd takes "
         "1-2 s to exit after SIGTERM, 0.2 s here)."]
    busy = [x["phase"] for x in out.get("other_activity", []) if x["other_domains"]]
    if busy:
        n.append("Someone else's domains ran during: %s (other_activity)." % ", ".join(busy))
    return " ".join(n)


def summary(out):
    ch = out["channels"]
    log("channels (%s): rtt ms socket %.2f, stream %.2f, remote %.2f; MB/s socket %.1f, "
        "stream %.1f, remote %.1f; ratios %s" % (
            ch["image"], ch["socket"]["rtt_ms_median"], ch["stream"]["rtt_ms_median"],
            ch["remote"]["rtt_ms_median"], ch["socket"]["stream_mb_s_median"],
            ch["stream"]["stream_mb_s_median"], ch["remote"]["stream_mb_s_median"],
            json.dumps(ch["ratios"])))
    for image, s in out["starts"]["images"].items():
        log("starts (%s): remote first %.2f s, remote then %.2f s, local %.2f s" % (
            image, s["remote_first_s"], s["remote_subsequent_median_s"],
            s["local_subsequent_median_s"]))
    r = out["rate"]
    log("rate: %d sessions, two hosts %.2f/s, local only %.2f/s" % (
        r["sessions"], r["two_hosts"]["sessions_per_s_median"],
        r["local_only"]["sessions_per_s_median"]))
    log("took %.0f s" % out["wall_s"])


if __name__ == "__main__":
    main()

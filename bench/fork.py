#!/usr/bin/env python3
"""Forks, snapshots and volumes (issue 55), measured in one run through airlockd, each against
a baseline of the same run. Prints a summary on stderr and JSON on stdout (or --json FILE).

  bench/fork.py [--build DIR] [--image-dir DIR] [--image NAME] [--rounds N] [--json FILE]

fork: a fork of a running session (its python kernel with pandas imported) until the fork
  answers a run, against a checkpoint of the same session plus one warm start of the image
  until it answers. Goal <= 1.2. The rounds are later forks of the source (each finds the
  spare holder the last one left); its first fork, which starts its holder, is reported
  beside (first_fork_s). Each measurement starts with the host quiet (3 s apart).
fork4: a fork into 4 until all 4 answered (asked at once), against a fork into 1. Goal <= 2.5.
memory: the QEMU PSS of 4 idle forks together, against 4 idle sessions booted cold (each with
  pandas imported as well). Goal <= 0.4.
snapshot: a session from a snapshot until it answers, against a warm start. Goal <= 1.2.
volume: dd's write (fdatasync) and read (caches dropped) throughput on a read-write volume,
  against the session's own root disk, in the same guest, alternately, medians of the rounds.
  Goal >= 0.8.
"""
import argparse
import concurrent.futures
import os
import re
import shutil
import statistics
import tempfile
import time

import benchlib
from benchlib import ROOT, log

benchlib.use_tests()


def pss_mib(name, field="Pss:"):
    with open("/run/libvirt/qemu/%s.pid" % name) as f:
        pid = int(f.read().strip())
    with open("/proc/%d/smaps_rollup" % pid) as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) / 1024
    return 0.0


def shm_mib(state):
    """RAM the saves and spare holders of this state dir hold in /dev/shm, by what each dir's
    "save" link names: (saves, spares)."""
    saves = spares = 0.0
    for d in os.listdir("/dev/shm"):
        p = os.path.join("/dev/shm", d)
        try:
            if not d.startswith("airlock-fork.") or \
                    not os.readlink(os.path.join(p, "save")).startswith(state + "/"):
                continue
            mib = os.stat(os.path.join(p, "ram")).st_blocks * 512 / 2**20
        except OSError:
            continue
        if "/forks/" in os.readlink(os.path.join(p, "save")):
            saves += mib
        else:
            spares += mib
    return saves, spares


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--image-dir")
    ap.add_argument("--image", default="debian")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    os.environ.setdefault("AIRLOCKD_BIN", os.path.join(a.build, "daemon", "airlockd"))
    os.environ["AIRLOCK_IMAGE_DIR"] = a.image_dir or os.path.join(a.build, "images")
    # A state dir of its own: the template, saves, snapshots and volumes it makes go with it.
    state = tempfile.mkdtemp(prefix="airlock-fork-bench-", dir="/var/tmp")
    os.chmod(state, 0o755)
    os.environ["AIRLOCK_STATE_DIR"] = state
    import test_airlockd
    test_airlockd.AIRLOCKD = os.environ["AIRLOCKD_BIN"]
    from airlock import Sandbox

    warm = test_airlockd.Daemon(env={"AIRLOCK_WARM": "auto"}, max_sessions=12,
                                max_memory_mib=12 * 1024)
    cold = test_airlockd.Daemon(env={"AIRLOCK_WARM": "off"}, max_sessions=8,
                                max_memory_mib=8 * 1024)
    result = {"benchmark": "fork", "image": a.image, "machine": benchlib.machine(),
              "accel": "emulation", "rounds": a.rounds}
    try:
        c = warm.tcp(warm.key("bench"))
        cc = cold.tcp(cold.key("bench"))

        def answered(sb):
            r = sb.run_code("print(x + 1)")
            if r.stdout.strip() != "42":
                raise RuntimeError("session %s has not the source's state: %r" % (sb.id, r))

        def warm_answered(sb):  # the same kind of run as answered's, in the python kernel
            r = sb.run_code("print(41 + 1)")
            if r.stdout.strip() != "42":
                raise RuntimeError("session %s did not answer: %r" % (sb.id, r))

        Sandbox(image=a.image, client=c).kill()  # the warm template, built
        src = Sandbox(image=a.image, client=c, checkpoints=True, lifetime_s=3600)
        src.run_code("import pandas\nx = 41")
        forks, bases, fork4, fork1, snaps, warms, restored = [], [], [], [], [], [], []
        # A session's first fork starts its holder; later ones find the spare it left.
        time.sleep(3)
        t0 = time.monotonic()
        f = src.fork(1)[0]
        answered(f)
        first = time.monotonic() - t0
        f.kill()
        log("first fork %.2fs" % first)
        for i in range(a.rounds):
            time.sleep(3)  # the spare holder started and settled: nothing runs beside
            t0 = time.monotonic()
            f = src.fork(1)[0]
            answered(f)
            forks.append(time.monotonic() - t0)
            fork1.append(forks[-1])
            f.kill()
            time.sleep(3)
            t0 = time.monotonic()
            c.request("POST", "/v1/sessions/%s/checkpoints" % src.id, body={})
            w = Sandbox(image=a.image, client=c)
            warm_answered(w)
            bases.append(time.monotonic() - t0)
            restored.append(w.info.get("warm"))
            w.kill()
            time.sleep(3)
            t0 = time.monotonic()
            fs = src.fork(4)
            with concurrent.futures.ThreadPoolExecutor(4) as ex:  # as a harness asks them
                list(ex.map(answered, fs))
            fork4.append(time.monotonic() - t0)
            if i == a.rounds - 1:
                time.sleep(5)  # idle, settled
                fork_pss = sum(pss_mib(f.id) for f in fs)
                fork_shmem = sum(pss_mib(f.id, "Pss_Shmem:") for f in fs)
                save_shm, spare_shm = shm_mib(state)
            for f in fs:
                f.kill()
            log("round %d: fork %.2fs, checkpoint + warm start %.2fs, fork into 4 %.2fs" %
                (i, forks[-1], bases[-1], fork4[-1]))
        src.create_snapshot("bench", replace=True)
        src.kill()
        for i in range(a.rounds):
            time.sleep(3)
            t0 = time.monotonic()
            s = Sandbox(snapshot="bench", client=c)
            answered(s)
            snaps.append(time.monotonic() - t0)
            s.kill()
            time.sleep(3)
            t0 = time.monotonic()
            w = Sandbox(image=a.image, client=c)
            warm_answered(w)
            warms.append(time.monotonic() - t0)
            w.kill()
            log("round %d: from the snapshot %.2fs, warm start %.2fs" % (i, snaps[-1], warms[-1]))
        c.delete_snapshot("bench")
        colds = [Sandbox(image=a.image, client=cc) for _ in range(4)]
        for s in colds:
            s.run_code("import pandas\nx = 41")
        time.sleep(5)
        cold_pss = sum(pss_mib(s.id) for s in colds)
        for s in colds:
            s.kill()
        log("memory: 4 forks %.0f MiB PSS, 4 cold sessions %.0f MiB" % (fork_pss, cold_pss))

        # volume vs root disk, in one guest
        c.create_volume("bench-vol", 1 << 30)
        v = Sandbox(image=a.image, client=c, volumes={"/vol": "bench-vol"})
        tput = {"/vol": [], "/root": []}  # per round: [write, read]
        for i in range(a.rounds):
            for where in ("/vol", "/root"):
                r = v.commands.run("dd if=/dev/zero of=%s/f bs=1M count=256 conv=fdatasync 2>&1 | "
                                   "tail -1; sync; echo 3 > /proc/sys/vm/drop_caches; "
                                   "dd if=%s/f of=/dev/null bs=1M 2>&1 | tail -1; rm -f %s/f; sync"
                                   % (where, where, where), timeout=600)
                rates = re.findall(r"([0-9.]+) ([kMG])B/s", r.stdout)
                scale = {"k": 1e-3, "M": 1.0, "G": 1e3}
                tput[where].append([float(n) * scale[u] for n, u in rates])
                log("%s: write %.0f MB/s, read %.0f MB/s" % (where, *tput[where][-1]))
        v.kill()
        c.delete_volume("bench-vol")
        bf = statistics.median(forks)

        def med(rows, k):
            return statistics.median(row[k] for row in rows)
        result.update({
            "fork": {"fork_s": forks, "checkpoint_plus_warm_start_s": bases,
                     "warm_starts_restored": restored,
                     "ratio": bf / statistics.median(bases), "goal": 1.2,
                     "first_fork_s": first,
                     "first_fork_ratio": first / statistics.median(bases)},
            "fork4": {"fork4_s": fork4, "fork1_s": fork1,
                      "ratio": statistics.median(fork4) / statistics.median(fork1),
                      "goal": 2.5},
            "memory": {"forks_pss_mib": fork_pss, "cold_pss_mib": cold_pss,
                       "ratio": fork_pss / cold_pss, "goal": 0.4,
                       # the save's RAM file in /dev/shm, whole, in place of the forks' shares
                       # of it; and the source's spare holder, held for its next fork
                       "save_in_shm_mib": save_shm, "spare_holder_in_shm_mib": spare_shm,
                       "forks_with_whole_save_mib": fork_pss - fork_shmem + save_shm,
                       "ratio_with_whole_save":
                           (fork_pss - fork_shmem + save_shm) / cold_pss},
            "snapshot": {"from_snapshot_s": snaps, "warm_start_s": warms,
                         "ratio": statistics.median(snaps) / statistics.median(warms),
                         "goal": 1.2},
            "volume": {"volume_mb_s": tput["/vol"], "root_mb_s": tput["/root"],
                       "write_ratio": med(tput["/vol"], 0) / med(tput["/root"], 0),
                       "read_ratio": med(tput["/vol"], 1) / med(tput["/root"], 1), "goal": 0.8},
        })
    finally:
        warm.stop_and_remove()
        cold.stop_and_remove()
        shutil.rmtree(state, ignore_errors=True)
    benchlib.emit(result, a.json)


if __name__ == "__main__":
    main()

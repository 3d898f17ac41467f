#!/usr/bin/env python3
"""Airlock benchmarks. Prints a table on stderr and JSON on stdout (or --json FILE).

  bench/run.py [--build DIR] [--image-dir DIR] [--image NAME] [--rounds N] [--json FILE]
               [--ssh-image NAME | --no-ssh] [--ssh-stream-mib MIB]

session_ready: wall time of `airlock exec -- true` (boot, handshake, run, teardown) against the
same kernel and initrd booted by qemu-system-x86_64 directly to the same point (handshake and
`true`), alternated in one run so drift hits both alike.
exec_rtt: round trip of `true` in a running session.
stream: guest->host throughput through the agent against raw `dd` into a second
virtio-serial port of the same guest.

transport: when the image dir has an SSH image (--ssh-image, `sshd` by default; --no-ssh skips
it), the same three over SSH against the main image's virtio-serial figures from the same run:
its session-ready rounds alternate with the ones above, and its `airlock-bench session` runs
between two of the main image's (with --rounds 2 or more), whose figures are then the mean of
the two. `sshd` is `debian`'s root disk plus sshd, so the comparison means something only with
--image debian. Its session ready is split by the guest's console (sshd listening, login
accepted, seen as they happen) and airlock's --debug timing line.

With --checkpoint, instead: checkpoint cost and rollback time (QEMU's savevm/loadvm inside the
running process, plus the agent's re-handshake) against libvirt's internal snapshot create and
revert of the same guest in the same run, and disk per checkpoint against the MiB the guest
changed since the one before (--memory MiB guest, 512 by default).
"""
import argparse
import json
import re
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--image-dir", default=None)
    ap.add_argument("--image", default="tiny")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rtt-count", type=int, default=100)
    ap.add_argument("--stream-mib", type=int, default=256)
    ap.add_argument("--json", default=None)
    ap.add_argument("--checkpoint", action="store_true")
    ap.add_argument("--memory", type=int, default=512)
    a = ap.parse_args()
    if a.checkpoint:
        return checkpoint_bench(a)
    image_dir = os.path.abspath(a.image_dir or os.path.join(a.build, "images"))
    env = dict(os.environ, AIRLOCK_IMAGE_DIR=image_dir)
    airlock = os.path.join(a.build, "orchestrator", "airlock")
    bench = os.path.join(a.build, "bench", "airlock-bench")
    with open(os.path.join(image_dir, a.image, "manifest.json")) as f:
        m = json.load(f)
    d = os.path.join(image_dir, a.image)
    direct_cmd = [bench, "direct", "/usr/bin/qemu-system-x86_64", os.path.join(d, m["kernel"]),
                  os.path.join(d, m["initrd"]), m.get("cmdline", ""),
                  str(m.get("memory_mib", 256))]

    # Warm caches, and learn whether sessions get KVM here so QEMU direct uses the same.
    img = ["--image", a.image]
    warm = subprocess.run([airlock, "--debug", "-q", "exec"] + img + ["--", "true"], env=env,
                          check=True, stderr=subprocess.PIPE).stderr.decode()
    direct_cmd.append("kvm" if ", kvm," in warm else "tcg")
    direct_cmd.append(re.search(r"(\d+) vCPU", warm).group(1))
    scratch = None
    if m.get("disk"):
        # The direct boot gets a fresh overlay of the same base each round, as a session does.
        import tempfile
        scratch = tempfile.mkdtemp(prefix="airlock-bench-")
    airlock_s, direct_s, python_s = [], [], []
    for _ in range(a.rounds):
        t = time.monotonic()
        subprocess.run([airlock, "-q", "exec"] + img + ["--", "true"], env=env, check=True)
        airlock_s.append(time.monotonic() - t)
        cmd = list(direct_cmd)
        if scratch:
            ov = os.path.join(scratch, "overlay.qcow2")
            subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b",
                            os.path.join(d, m["disk"]), ov], check=True)
            cmd.append(ov)
        out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE).stdout
        direct_s.append(json.loads(out)["total_s"])
        if "kernel:python" in warm:
            # Time to the first python result: a session whose first run is python code in
            # the kernel, against `true` above (the difference is the kernel starting).
            t = time.monotonic()
            r = subprocess.run([airlock, "-q", "exec"] + img + ["--kernel", "--lang", "python",
                               "-c", "print(6 * 7)"], env=env, check=True,
                               stdout=subprocess.PIPE)
            python_s.append(time.monotonic() - t)
            assert r.stdout.strip() == b"42", r.stdout
    if scratch:
        import shutil
        shutil.rmtree(scratch, ignore_errors=True)

    out = subprocess.run([bench, "session", a.image, str(a.rtt_count), str(a.stream_mib)],
                         env=env, check=True, stdout=subprocess.PIPE).stdout
    sess = json.loads(out)

    ready_a, ready_d = statistics.median(airlock_s), statistics.median(direct_s)
    result = {
        "machine": {"cpus": os.cpu_count(), "kvm": sess["kvm"]},
        "image": a.image,
        "session_ready": {
            "airlock_s_median": round(ready_a, 3),
            "direct_qemu_s_median": round(ready_d, 3),
            "ratio": round(ready_a / ready_d, 3),
            "goal_ratio_max": 1.15,
            "airlock_s": [round(x, 3) for x in airlock_s],
            "direct_qemu_s": [round(x, 3) for x in direct_s],
        },
        "first_python_result": None if not python_s else {
            "airlock_s_median": round(statistics.median(python_s), 3),
            "session_true_s_median": round(ready_a, 3),
            "ratio": round(statistics.median(python_s) / ready_a, 3),
            "airlock_s": [round(x, 3) for x in python_s],
            "note": "airlock exec --kernel --lang python -c 'print(6 * 7)' against "
                    "airlock exec -- true, same image, same run",
        },
        "exec_rtt": {
            "median_ms": sess["rtt_ms_median"],
            "p90_ms": sess["rtt_ms_p90"],
            "min_ms": sess["rtt_ms_min"],
            "count": sess["rtt_count"],
            "goal_ms_max": 20,
        },
        "stream": {
            "agent_mb_s": sess["stream_mb_s"],
            "raw_port_mb_s": sess["raw_mb_s"],
            "ratio": round(sess["stream_mb_s"] / sess["raw_mb_s"], 3),
            "mib_per_run": sess["stream_mib"],
            "goal_ratio_min": 0.70,
        },
    }
    text = json.dumps(result, indent=2)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    print(text)
    sr, rt, st = result["session_ready"], result["exec_rtt"], result["stream"]
    rows = [
        ("session ready (airlock exec -- true)", "%.2f s" % sr["airlock_s_median"],
         "%.2f s direct QEMU" % sr["direct_qemu_s_median"], "%.2fx (goal <= 1.15x)" % sr["ratio"]),
        ("exec round trip of true", "%.2f ms median" % rt["median_ms"],
         "p90 %.2f ms" % rt["p90_ms"], "goal < 20 ms"),
        ("guest->host stream", "%.0f MB/s" % st["agent_mb_s"],
         "%.0f MB/s raw port" % st["raw_port_mb_s"], "%.0f%% (goal >= 70%%)" % (100 * st["ratio"])),
    ]
    fp = result["first_python_result"]
    if fp:
        rows.insert(1, ("first python result (kernel)", "%.2f s" % fp["airlock_s_median"],
                        "%.2f s for true" % fp["session_true_s_median"],
                        "%.2fx" % fp["ratio"]))
    for r in rows:
        print("%-40s %-18s %-22s %s" % r, file=sys.stderr)


def checkpoint_bench(a):
    a.build = os.path.abspath(a.build)  # libvirt opens the image files from another cwd
    image_dir = a.image_dir or os.path.join(a.build, "images")
    env = dict(os.environ, AIRLOCK_IMAGE_DIR=image_dir)
    bench = os.path.join(a.build, "bench", "airlock-bench")
    load = os.getloadavg()[0]
    out = subprocess.run([bench, "checkpoint", a.image, str(a.memory), str(a.rounds)], env=env,
                         check=True, stdout=subprocess.PIPE).stdout
    r = json.loads(out)
    changes = [dict(c, changed_bytes_on_disk=c["disk_bytes"] - c["state_bytes"])
               for c in r["disk_per_checkpoint"]]
    result = {
        "machine": {"cpus": os.cpu_count(), "kvm": r["kvm"], "load_average_1m": round(load, 2)},
        "image": r["image"],
        "memory_mib": r["memory_mib"],
        "checkpoint": {
            "airlock_ms_median": r["checkpoint_ms_median"],
            "libvirt_snapshot_create_ms_median": r["libvirt_create_ms_median"],
            "goal_ms_max": 300,
            "airlock_ms": r["checkpoint_ms"],
            "savevm_ms": r["savevm_ms"],
            "libvirt_snapshot_create_ms": r["libvirt_create_ms"],
            "state_bytes": r["state_bytes"],
            "note": "each round's checkpoint is deleted after its rollback, so the next one "
                    "reuses the freed space; checkpoints that are kept take new space and cost "
                    "more: see disk_per_checkpoint[].checkpoint_ms",
        },
        "rollback": {
            "airlock_ms_median": r["rollback_ms_median"],
            "libvirt_snapshot_revert_ms_median": r["libvirt_revert_ms_median"],
            "goal_ms_max": 1000,
            "airlock_ms": r["rollback_ms"],
            "first_exec_after_ms": r["first_exec_after_rollback_ms"],
            "libvirt_snapshot_revert_ms": r["libvirt_revert_ms"],
            "libvirt_resync_and_first_exec_ms": r["libvirt_resync_and_first_exec_ms"],
            "libvirt_revert_restarted_qemu": r["libvirt_revert_restarted_qemu"],
        },
        "disk_per_checkpoint": changes,
    }
    text = json.dumps(result, indent=2)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    print(text)
    ck, rb = result["checkpoint"], result["rollback"]
    rows = [
        ("checkpoint (memory + disk)", "%.0f ms median" % ck["airlock_ms_median"],
         "%.0f ms libvirt create" % ck["libvirt_snapshot_create_ms_median"], "goal <= 300 ms"),
        ("rollback, agent answering again", "%.0f ms median" % rb["airlock_ms_median"],
         "%.0f ms libvirt revert" % rb["libvirt_snapshot_revert_ms_median"], "goal <= 1000 ms"),
    ]
    for c in changes:
        rows.append(("disk for a checkpoint after %d MiB changed" % c["changed_mib"],
                     "%.1f MiB" % (c["disk_bytes"] / 2**20),
                     "%.1f MiB of it state" % (c["state_bytes"] / 2**20),
                     "%.1f MiB blocks, %.0f ms" % (c["changed_bytes_on_disk"] / 2**20,
                                                   c["checkpoint_ms"])))
    for row in rows:
        print("%-44s %-16s %-24s %s" % row, file=sys.stderr)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Images from containers and commits (issue 34), measured in one run, ratios against baselines
of the same run. Prints a summary on stderr and JSON on stdout (or --json FILE).

  bench/images.py [--build DIR] [--image-dir DIR] [--rounds N] [--json FILE]

oci: the debian image's root tree (its rootfs.qcow2 dumped with debugfs rdump) as an OCI
  archive of one uncompressed layer, written here by hand (no registry, no container tool);
  `airlock image build benchoci --from ARCHIVE --force` against the same tree through the two
  helpers oci.c calls, `mke2fs -d` (its options and size) and `qemu-img convert -f raw -O
  qcow2`; rounds alternated (build, baseline, ...), medians. The previous round's image is
  removed before the build, untimed, as the baseline's outputs are. Each built image must boot
  (`airlock exec --image benchoci -- cat /etc/os-release`, not timed): one that does not is an
  error, not a number. Goal <= 1.3.
commit: one debian session through airlockd; each round a fresh 100 MiB file (the previous
  one removed, `head -c 100M /dev/urandom > /root/big && sync`), then
  POST /v1/sessions/{id}/image (Sandbox.save_image, replace) and, in the other order on odd
  rounds, `qemu-img convert -U -f qcow2 -O qcow2 -B BACKING -F qcow2 OVERLAY OUT` of the
  session's overlay (its own data into a qcow2 on the same backing file). Goal <= 1.2. Also
  measured, not the goal's baseline: the flattening convert of the overlay (its whole chain into
  one qcow2, no -B), which an image that stands alone cannot skip. The last saved image is
  booted and its file checked.
Every timed step starts after a sync (untimed): none inherits the write-back of the one before.
Where the time goes: the helpers airlock and airlockd spawn (mke2fs, qemu-img, debugfs), seen
as their children by polling /proc every 20 ms; for a build also the moment the first layer
entry lands in its tree (the archive is unpacked before) and the log line that ends the
layers; and each round the same steps with plain tools (tar -x of the archive, tar -x of its
layer into a tree, the baseline's two helpers, the tree removed), and once the layer's SHA-256.
"""
import argparse
import glob
import hashlib
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))

# oci.c's root file system size: at least 4 GiB, else the data plus a quarter plus 2 GiB.
FS_SIZE_MIN = 4 << 30
FS_ROOM = 2 << 30
BIG_MIB = 100


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def med(xs):
    return statistics.median(xs) if xs else None


def sh(argv, **kw):
    """Runs argv, its output captured; raises with its stderr when it fails."""
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    if r.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(argv), r.returncode,
                                                   r.stderr.strip()[-2000:]))
    return r.stdout


def timed(argv, **kw):
    t0 = time.monotonic()
    sh(argv, **kw)
    return time.monotonic() - t0


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                return h.hexdigest()
            h.update(b)


def tree_bytes(path):
    """The bytes of the files under path (links not followed)."""
    total = 0
    for top, _, names in os.walk(path):
        for n in names:
            total += os.lstat(os.path.join(top, n)).st_size
    return total


def helper_label(argv):
    """A helper's command line in a few words: which helper, which conversion."""
    if not argv:
        return "?"
    prog = os.path.basename(argv[0])
    if prog == "qemu-img" and "convert" in argv:
        f = argv[argv.index("-f") + 1] if "-f" in argv else "?"
        o = argv[argv.index("-O") + 1] if "-O" in argv else "?"
        return "qemu-img convert %s->%s" % (f, o)
    if prog == "debugfs":
        return "debugfs -w" if "-w" in argv else "debugfs -R"
    if prog == "mke2fs":
        return "mke2fs -d"
    return prog


class Children:
    """The child processes of pid (of any of its threads), polled every 20 ms from a thread:
    each one's command line and when it was first and last seen, in seconds from the start;
    and when each of marks (name: a predicate) first held."""

    def __init__(self, pid, marks=None, t0=None):
        self.pid = pid
        self.marks = dict(marks or {})
        self.marked = {}
        self.seen = {}
        self.t0 = t0 or time.monotonic()
        self.done = threading.Event()
        self.th = threading.Thread(target=self._poll, daemon=True)
        self.th.start()

    def _poll(self):
        while not self.done.is_set():
            now = time.monotonic() - self.t0
            for task in glob.glob("/proc/%d/task/*/children" % self.pid):
                try:
                    with open(task) as f:
                        kids = f.read().split()
                except OSError:
                    continue
                for k in kids:
                    try:
                        with open("/proc/%s/cmdline" % k, "rb") as f:
                            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
                    except OSError:
                        continue
                    e = self.seen.setdefault(k, {"argv": argv, "start": now, "end": now})
                    e["end"] = now
                    if argv:  # the exec'd one, not the fork's copy; a zombie's is empty
                        e["argv"] = argv
            for name, pred in self.marks.items():
                if name not in self.marked:
                    try:
                        if pred():
                            self.marked[name] = now
                    except OSError:
                        pass
            time.sleep(0.02)

    def stop(self):
        self.done.set()
        self.th.join()

    def helpers(self):
        """The helpers seen as [label, start, end], in the order they started (the parent's
        own forks that never exec'd are left out)."""
        return sorted(([helper_label(e["argv"]), round(e["start"], 3), round(e["end"], 3)]
                       for e in self.seen.values()
                       if e["argv"] and
                       os.path.basename(e["argv"][0]) in ("mke2fs", "qemu-img", "debugfs",
                                                          "e2fsck")),
                      key=lambda h: h[1])


def spent(helpers, label):
    """(first start, last end, summed time) of the helpers of that label; Nones if none ran."""
    hs = [h for h in helpers if h[0] == label]
    if not hs:
        return None, None, None
    return hs[0][1], hs[-1][2], sum(h[2] - h[1] for h in hs)


def dump_tree(image_dir, work):
    """The debian image's root file system as a directory tree, through a raw copy of its
    disk and debugfs rdump (which does not keep set-id and sticky bits: the sticky bit of the
    world-writable dirs is put back, as the image has it)."""
    raw = os.path.join(work, "debian.raw")
    tree = os.path.join(work, "tree")
    os.mkdir(tree)
    try:
        sh(["qemu-img", "convert", "-O", "raw",
            os.path.join(image_dir, "debian", "rootfs.qcow2"), raw])
        sh(["debugfs", "-R", "rdump / %s" % tree, raw])
    finally:
        if os.path.exists(raw):
            os.unlink(raw)
    for d in ("tmp", "var/tmp"):
        p = os.path.join(tree, d)
        if os.path.isdir(p):
            os.chmod(p, 0o1777)
    entries, files = 0, 0
    for top, dirs, names in os.walk(tree):
        entries += len(dirs) + len(names)
        for n in names:
            st = os.lstat(os.path.join(top, n))
            if os.path.isfile(os.path.join(top, n)) and not os.path.islink(os.path.join(top, n)):
                files += st.st_size
    return tree, entries, files


def oci_archive(tree, work):
    """tree as an OCI image of one uncompressed layer: the layout dir (written by hand) and a
    tar archive of it. (layout, archive, the layer's sha256, its bytes)."""
    layout = os.path.join(work, "layout")
    blobs = os.path.join(layout, "blobs", "sha256")
    os.makedirs(blobs)
    layer = os.path.join(blobs, "layer.tmp")
    sh(["tar", "--numeric-owner", "-C", tree, "-cf", layer, "."])
    lhex = sha256_file(layer)
    lsize = os.path.getsize(layer)
    os.rename(layer, os.path.join(blobs, lhex))

    def blob(obj):
        data = json.dumps(obj, separators=(",", ":")).encode()
        hexd = hashlib.sha256(data).hexdigest()
        with open(os.path.join(blobs, hexd), "wb") as f:
            f.write(data)
        return {"digest": "sha256:" + hexd, "size": len(data)}

    config = blob({"architecture": "amd64", "os": "linux", "config": {},
                   "rootfs": {"type": "layers", "diff_ids": ["sha256:" + lhex]}})
    manifest = blob({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": dict(config, mediaType="application/vnd.oci.image.config.v1+json"),
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": "sha256:" + lhex, "size": lsize}]})
    with open(os.path.join(layout, "index.json"), "w") as f:
        json.dump({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                   "manifests": [dict(manifest,
                                      mediaType="application/vnd.oci.image.manifest.v1+json",
                                      platform={"architecture": "amd64", "os": "linux"})]}, f)
    with open(os.path.join(layout, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    archive = os.path.join(work, "debian-oci.tar")
    sh(["tar", "-C", layout, "-cf", archive, "oci-layout", "index.json", "blobs"])
    return layout, archive, lhex, lsize


def make_disk(tree, entries, fs, out_raw, out_qcow2):
    """tree as oci.c makes its disk (mke2fs -d with its options and size, then qemu-img into
    a qcow2); the seconds of each. Earlier outputs removed first."""
    for f in (out_raw, out_qcow2):
        if os.path.exists(f):
            os.unlink(f)
    m = timed(["mke2fs", "-q", "-t", "ext4", "-O", "^has_journal", "-m", "0",
               "-L", "airlock-root", "-N", str(entries * 2 + 65536), "-E", "root_owner=0:0",
               "-d", tree, out_raw, "%dk" % (fs >> 10)])
    q = timed(["qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2", out_raw, out_qcow2])
    os.unlink(out_raw)
    return m, q


def bench_oci(a, env, store, tree, entries, files, archive, lhex, work):
    airlock = os.path.join(a.build, "orchestrator", "airlock")
    fs = max(FS_SIZE_MIN, files + files // 4 + FS_ROOM)
    out_raw, out_qcow2 = os.path.join(work, "base.raw"), os.path.join(work, "base.qcow2")
    builds, bases, mkfs, convs, phases, helpers = [], [], [], [], [], []
    plains, plain_phases = [], []
    for i in range(a.rounds):
        subprocess.run([airlock, "image", "rm", "benchoci"], env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        os.sync()  # nothing of the last step's left to write back into this one
        t0 = time.monotonic()
        p = subprocess.Popen([airlock, "image", "build", "benchoci", "--from", archive, "--force"],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        scratch_tree = os.path.join(store, ".benchoci.from-%d" % p.pid, "tree")

        def layers_started():
            # the tree is in the scratch dir, or in RAM (/dev/shm/airlock-tree.*) when it fits
            trees = [scratch_tree] + glob.glob("/dev/shm/airlock-tree.*/tree")
            return any(os.path.isdir(t) and os.listdir(t) for t in trees)
        kids = Children(p.pid, {"layers_start": layers_started}, t0=t0)
        err, layers_done = [], None
        for line in p.stderr:
            err.append(line)
            if " entries, " in line and layers_done is None:
                layers_done = time.monotonic() - t0
        p.wait()
        took = time.monotonic() - t0
        kids.stop()
        err = "".join(err)
        if p.returncode != 0:
            raise RuntimeError("airlock image build --from failed (%d): %s" %
                               (p.returncode, err.strip()[-2000:]))
        builds.append(took)
        hs = kids.helpers()
        mark = kids.marked
        mk0, _, mks = spent(hs, "mke2fs -d")
        _, qc1, qcs = spent(hs, "qemu-img convert raw->qcow2")
        ph = {"unpack_archive_s": mark.get("layers_start"),
              "apply_layer_s": layers_done - mark["layers_start"]
              if layers_done and "layers_start" in mark else None,
              "defaults_s": mk0 - layers_done if mk0 and layers_done else None,
              "mke2fs_s": mks, "qemu_img_s": qcs,
              # the tree removed (most of it), the image assembled and moved in
              "rm_tree_finish_s": took - qc1 if qc1 else None}
        ph = {k: (round(v, 3) if v is not None else None) for k, v in ph.items()}
        helpers.append(hs)
        phases.append(ph)
        if i == 0:
            log(err.strip())
        boot = subprocess.run([airlock, "-q", "exec", "--image", "benchoci", "--",
                               "cat", "/etc/os-release"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=300)
        if boot.returncode != 0 or "Debian" not in boot.stdout:
            raise RuntimeError("the built image does not boot (%d): %s %s" %
                               (boot.returncode, boot.stdout[-500:], boot.stderr[-2000:]))

        os.sync()
        t0 = time.monotonic()
        m, q = make_disk(tree, entries, fs, out_raw, out_qcow2)
        bases.append(time.monotonic() - t0)
        mkfs.append(m)
        convs.append(q)

        # The same steps with plain tools: the archive unpacked, the layer into a tree with tar,
        # the disk, the tree removed (airlock leaves the unpacked archive: so does this).
        plain_dir = os.path.join(work, "plain")
        src, ptree = os.path.join(plain_dir, "src"), os.path.join(plain_dir, "tree")
        os.makedirs(src)
        os.makedirs(ptree)
        os.sync()
        t0 = time.monotonic()
        sh(["tar", "-C", src, "-xf", archive])
        t1 = time.monotonic()
        sh(["tar", "--numeric-owner", "-C", ptree, "-xf",
            os.path.join(src, "blobs", "sha256", lhex)])
        t2 = time.monotonic()
        m, q = make_disk(ptree, entries, fs, out_raw, out_qcow2)
        t3 = time.monotonic()
        shutil.rmtree(ptree)
        t4 = time.monotonic()
        shutil.rmtree(plain_dir)
        plains.append(t4 - t0)
        plain_phases.append({k: round(v, 3) for k, v in (
            ("unpack_archive_s", t1 - t0), ("tar_x_layer_s", t2 - t1), ("mke2fs_s", m),
            ("qemu_img_s", q), ("rm_tree_s", t4 - t3))})
        log("oci round %d: build %.2fs (%s); baseline %.2fs (mke2fs %.2fs, qemu-img %.2fs); "
            "plain tools %.2fs (%s)" %
            (i, builds[-1], " ".join("%s %s" % (k[:-2], v) for k, v in ph.items()), bases[-1],
             mkfs[-1], convs[-1], plains[-1],
             " ".join("%s %s" % (k[:-2], v) for k, v in plain_phases[-1].items())))
    ratios = [b / c for b, c in zip(builds, bases)]
    built = os.path.join(store, "benchoci", "rootfs.qcow2")
    return {"build_s": builds, "baseline_s": bases, "baseline_mke2fs_s": mkfs,
            "baseline_qemu_img_s": convs, "ratios": ratios, "ratio": med(ratios),
            "plain_tools_s": plains, "plain_tools_phases": plain_phases,
            "ratio_to_plain_tools": med(builds) / med(plains),
            "goal": 1.3, "met": med(ratios) <= 1.3, "fs_bytes": fs,
            "image_qcow2_bytes": os.path.getsize(built),
            "baseline_qcow2_bytes": os.path.getsize(out_qcow2),
            "image_dir": sorted(os.listdir(os.path.dirname(built))),
            "image_dir_bytes": tree_bytes(os.path.dirname(built)),
            "phases": phases, "helpers": helpers,
            "boot_check": "airlock exec --image benchoci -- cat /etc/os-release: Debian, "
                          "each round"}


def find_overlay(state, sid):
    found = [p for p in glob.glob(os.path.join(state, "**", "disk.qcow2"), recursive=True)
             if sid in p]
    if len(found) != 1:
        every = glob.glob(os.path.join(state, "**", "disk.qcow2"), recursive=True)
        found = every if len(every) == 1 else found
    if len(found) != 1:
        raise RuntimeError("cannot find the overlay of session %s under %s" % (sid, state))
    return found[0]


def bench_commit(a, store, state, work):
    import test_airlockd
    test_airlockd.AIRLOCKD = os.path.join(a.build, "daemon", "airlockd")
    from airlock import Sandbox

    d = test_airlockd.Daemon(env={"AIRLOCK_IMAGE_DIR": store, "AIRLOCK_STATE_DIR": state,
                                  "AIRLOCK_WARM": "off"})
    sb = None
    try:
        c = d.unix()
        sb = Sandbox(image="debian", client=c, lifetime_s=3600)
        overlay = find_overlay(state, sb.id)
        info = json.loads(sh(["qemu-img", "info", "-U", "--output=json", overlay]))
        backing = info.get("full-backing-filename") or info["backing-filename"]
        out, flat = os.path.join(work, "overlay.qcow2"), os.path.join(work, "flat.qcow2")
        base_cmd = ["qemu-img", "convert", "-U", "-f", "qcow2", "-O", "qcow2", "-B", backing,
                    "-F", "qcow2", overlay, out]
        flat_cmd = ["qemu-img", "convert", "-U", "-f", "qcow2", "-O", "qcow2", overlay, flat]
        commits, bases, flats, writes, phases, helpers, sizes = [], [], [], [], [], [], []
        digest = None
        for i in range(a.rounds):
            t0 = time.monotonic()
            r = sb.commands.run("rm -f /root/big && head -c %dM /dev/urandom > /root/big && sync"
                                % BIG_MIB, timeout=600)
            if r.exit_code != 0:
                raise RuntimeError("writing the file failed: %s" % r.stderr)
            writes.append(time.monotonic() - t0)
            if i == a.rounds - 1:
                digest = sb.commands.run("sha256sum /root/big").stdout.split()[0]
            for f in (out, flat):
                if os.path.exists(f):
                    os.unlink(f)

            def commit():
                os.sync()
                t0 = time.monotonic()
                kids = Children(d.p.pid, t0=t0)
                sb.save_image("benchsave", replace=True)
                took = time.monotonic() - t0
                kids.stop()
                hs = kids.helpers()
                f0, _, fs = spent(hs, "qemu-img convert qcow2->raw")
                _, _, ls = spent(hs, "debugfs -R")
                _, _, ws = spent(hs, "debugfs -w")
                _, c1, cs = spent(hs, "qemu-img convert raw->qcow2")
                ph = {"sync_pause_s": f0, "flatten_to_raw_s": fs,
                      "debugfs_s": (ls or 0) + (ws or 0), "convert_to_qcow2_s": cs,
                      "finish_s": took - c1 if c1 else None}
                # between the helpers: the daemon's own work, and our 20 ms polling
                ph["gaps_s"] = took - sum(v or 0 for v in ph.values())
                commits.append(took)
                helpers.append(hs)
                phases.append({k: (round(v, 3) if v is not None else None)
                               for k, v in ph.items()})

            def baseline():
                os.sync()
                bases.append(timed(base_cmd))
                os.sync()
                flats.append(timed(flat_cmd))

            for step in ((commit, baseline) if i % 2 == 0 else (baseline, commit)):
                step()
            sizes.append({"overlay_bytes": os.path.getsize(overlay),
                          "baseline_out_bytes": os.path.getsize(out),
                          "flat_out_bytes": os.path.getsize(flat)})
            log("commit round %d: write %.1fs, commit %.2fs (%s), overlay convert %.2fs, "
                "flattening convert %.2fs; overlay %d MiB" %
                (i, writes[-1], commits[-1],
                 " ".join("%s %s" % (k[:-2], v) for k, v in phases[-1].items()), bases[-1],
                 flats[-1], sizes[-1]["overlay_bytes"] >> 20))
        store_dirs = [n for n in os.listdir(store) if "benchsave" in n and not n.startswith(".")]
        saved_bytes = (os.path.getsize(os.path.join(store, store_dirs[0], "rootfs.qcow2"))
                       if len(store_dirs) == 1 else None)
        sb.kill()
        sb = None
        # The saved image boots and holds the last round's file.
        back = Sandbox(image="benchsave", client=c, lifetime_s=600)
        try:
            got = back.commands.run("sha256sum /root/big").stdout.split()[0]
        finally:
            back.kill()
        if got != digest:
            raise RuntimeError("the saved image's /root/big is not the session's (%s, %s)" %
                               (got, digest))
        ratios = [x / y for x, y in zip(commits, bases)]
        return {"changed_mib": BIG_MIB, "commit_s": commits, "baseline_s": bases,
                "ratios": ratios, "ratio": med(ratios), "goal": 1.2, "met": med(ratios) <= 1.2,
                "baseline": " ".join(base_cmd[:-2] + ["OVERLAY", "OUT"]).replace(backing,
                                                                                  "BACKING"),
                "flatten_s": flats, "ratio_to_flatten": med(commits) / med(flats),
                "write_s": writes, "sizes": sizes, "saved_qcow2_bytes": saved_bytes,
                "phases": phases, "helpers": helpers,
                "check": "the saved image booted through airlockd, /root/big's sha256 matched"}
    finally:
        if sb is not None:
            try:
                sb.kill()
            except Exception:
                pass
        d.stop_and_remove()


def load():
    """The load averages and the share of the last minute that tasks stalled on I/O (PSI): a
    shared machine's other work shows there."""
    out = {"loadavg": [round(x, 2) for x in os.getloadavg()]}
    try:
        with open("/proc/pressure/io") as f:
            out["io_some_avg60"] = float(f.readline().split()[2].split("=")[1])
    except (OSError, IndexError, ValueError):
        pass
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--image-dir")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    image_dir = os.path.abspath(a.image_dir or os.path.join(a.build, "images"))
    result = {"bench": "images", "machine": benchlib.machine(),
              "accel": "kvm" if os.path.exists("/dev/kvm") else "tcg", "rounds": a.rounds,
              "load": {"start": load()}}
    work = tempfile.mkdtemp(prefix="airlock-images-bench-", dir="/var/tmp")
    try:
        os.chmod(work, 0o755)
        store, state = os.path.join(work, "store"), os.path.join(work, "state")
        os.mkdir(store, 0o755)
        os.mkdir(state, 0o755)
        os.symlink(os.path.join(image_dir, "debian"), os.path.join(store, "debian"))
        env = dict(os.environ, AIRLOCK_IMAGE_DIR=store, AIRLOCK_STATE_DIR=state,
                   AIRLOCK_WARM="off")

        t0 = time.monotonic()
        tree, entries, files = dump_tree(image_dir, work)
        layout, archive, lhex, lsize = oci_archive(tree, work)
        prep = time.monotonic() - t0
        result["tree"] = {"entries": entries, "file_bytes": files}
        log("tree: %d entries, %d MiB of files; archive %d MiB (prepared in %.1fs)" %
            (entries, files >> 20, os.path.getsize(archive) >> 20, prep))
        # Its digest, as airlock checks it (OpenSSL's SHA-256, as Python's hashlib).
        os.sync()
        t0 = time.monotonic()
        sha256_file(os.path.join(layout, "blobs", "sha256", lhex))
        hash_s = time.monotonic() - t0

        oci = bench_oci(a, env, store, tree, entries, files, archive, lhex, work)
        result["oci"] = dict({"archive_bytes": os.path.getsize(archive), "layer_bytes": lsize,
                              "layout": "one uncompressed layer "
                                        "(application/vnd.oci.image.layer.v1.tar)",
                              "layout_bytes": tree_bytes(layout), "sha256_layer_s": hash_s},
                             **oci)
        shutil.rmtree(tree)
        shutil.rmtree(layout)
        os.unlink(archive)

        result["load"]["after_oci"] = load()
        result["commit"] = bench_commit(a, store, state, work)
        result["load"]["end"] = load()
        for k in ("oci", "commit"):
            r = result[k]
            log("%s: ratio %.2f (goal <= %s): %s" % (k, r["ratio"], r["goal"],
                                                      "met" if r["met"] else "not met"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    benchlib.emit(result, a.json)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The debian image through the real libvirtd: it boots from its qcow2 disk, runs Python and
Node, and each session writes only to its own overlay (the base never changes, two sessions
at once do not see each other's files). Also `airlock image build` / `rm` and the default
image. Needs BUILD/images/debian (tests/meson.build makes it a dependency)."""
import json
import os
import subprocess
import tempfile
import time
import unittest

import altest

DEBIAN = os.path.join(altest.IMAGE_DIR, "debian")


def base_state(path):
    st = os.stat(path)
    return (st.st_mtime_ns, st.st_size, st.st_mode & 0o777, altest.sha256(path))


class DebianTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        man = json.load(open(os.path.join(DEBIAN, "manifest.json")))
        cls.base = os.path.join(DEBIAN, man["disk"])
        cls.before = base_state(cls.base)
        # Sessions run as the image's default: a store with both images, AIRLOCK_IMAGE unset.
        cls.store = altest.Store()
        for name in ("tiny", "debian"):
            os.symlink(os.path.join(altest.IMAGE_DIR, name), os.path.join(cls.store.dir, name))
        cls.env = {"AIRLOCK_IMAGE": ""}

    @classmethod
    def tearDownClass(cls):
        cls.store.close()

    def run_default(self, args, **kw):
        return altest.run(args, image_dir=self.store.dir, env=self.env, **kw)

    def test_1_boots_python_node_workspace(self):
        code = r"""
set -e
cat /etc/debian_version
# pandas is looked up, not imported: its import alone takes ~30 s under emulation.
python3 -c 'import importlib.util as u, numpy, matplotlib.pyplot, requests; assert u.find_spec("pandas"); print("py", numpy.arange(4).sum())'
node -e 'console.log("node", [1,2,3].map(x => x * 2).join(","))'
cd /workspace && echo hi > f && cat f
echo "env $LANG $MPLBACKEND $HOME $(hostname)"
test -d /usr/lib/airlock/kernels && echo kernels-dir
test -x /usr/lib/airlock/airlock-agent && echo agent
echo "lo $(cat /sys/class/net/lo/flags)"
echo "rootfs $(stat -f -c %T /)"
# Writes all over the root disk: they land in this session's overlay only.
echo scribble > /etc/scribble && rm -rf /usr/share/zoneinfo && dd if=/dev/zero of=/big bs=1M count=20 2>/dev/null
sync
"""
        t0 = time.monotonic()
        r = self.run_default(["-q", "exec", "--lang", "sh", "-c", code])
        wall = time.monotonic() - t0
        self.assertEqual(r.returncode, 0, r.stderr)
        out = r.stdout.decode()
        self.assertRegex(out, r"^12\.")
        self.assertIn("py 6\n", out)
        self.assertIn("node 2,4,6\n", out)
        self.assertIn("hi\n", out)
        self.assertIn("env C.UTF-8 Agg /root airlock\n", out)
        self.assertIn("kernels-dir\n", out)
        self.assertIn("agent\n", out)
        self.assertIn("lo 0x9\n", out)  # IFF_UP | IFF_LOOPBACK
        self.assertIn("rootfs ext2/ext3\n", out)
        print("# debian session, python and node: %.1f s" % wall)

    def test_3_every_listed_language_runs_both_ways(self):
        """Each language `image ls` lists for debian runs as a one-shot program and in a
        kernel (javascript was 'not available' without --kernel)."""
        r = self.run_default(["image", "ls"])
        self.assertEqual(r.returncode, 0, r.stderr)
        row = [x for x in r.stdout.decode().splitlines() if x.startswith("debian ")]
        self.assertEqual(len(row), 1, r.stdout)
        langs = [x for x in row[0].split() if x in ("sh", "bash", "python", "shell", "javascript")]
        self.assertIn("javascript", langs)
        self.assertIn("python", langs)
        code = {"python": "print(6*7)", "javascript": "console.log(6*7)"}
        for lang in langs:
            for kernel in ([], ["--kernel"]):
                r = self.run_default(["-q", "exec", "--image", "debian", "--lang", lang] + kernel +
                                     ["-c", code.get(lang, "echo $((6*7))")])
                self.assertEqual((r.returncode, r.stdout), (0, b"42\n"), (lang, kernel, r.stderr))

    def test_2_sessions_at_once_are_separate(self):
        # Each writes a marker, says so, and waits for the host before looking for the other's.
        code = ("echo $1 > /whoami; touch /workspace/marker-$1; echo ready; read go; "
                "cat /whoami; ls /workspace")
        procs = [altest.popen(["--debug", "exec", "--image", "debian", "--lang", "sh", "-c",
                               code.replace("$1", n)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
                 for n in ("A", "B")]
        try:
            for p in procs:
                self.assertEqual(p.stdout.readline(), b"ready\n")
            # Both are running now: each has its overlay in its state dir, owned by QEMU.
            disks = [d for d in os.listdir(altest.state_sessions_dir())
                     if os.path.exists(os.path.join(altest.state_sessions_dir(), d,
                                                    "disk.qcow2"))]
            self.assertGreaterEqual(len(disks), 2, disks)
            for d in disks:
                info = json.loads(subprocess.run(
                    ["qemu-img", "info", "-U", "--output=json",
                     os.path.join(altest.state_sessions_dir(), d, "disk.qcow2")],
                    stdout=subprocess.PIPE, check=True).stdout)
                if info.get("backing-filename") != self.base:
                    continue  # another test's session
                self.assertEqual(info["backing-filename-format"], "qcow2")
                st = os.stat(os.path.join(altest.state_sessions_dir(), d, "disk.qcow2"))
                self.assertEqual(st.st_mode & 0o777, 0o600)
            outs = []
            for p in procs:
                out, err = p.communicate(b"go\n", timeout=altest.HANG_GUARD_S)
                self.assertEqual(p.returncode, 0, err)
                outs.append((out, err))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        self.assertEqual(outs[0][0], b"A\nmarker-A\n")
        self.assertEqual(outs[1][0], b"B\nmarker-B\n")
        # The overlays went with their session dirs.
        for _, err in outs:
            for name in altest.session_names(err):
                self.assertFalse(os.path.exists(os.path.join(altest.state_sessions_dir(),
                                                             name.decode())))

    def test_z_base_unchanged(self):
        # Runs last (name order): after every session above wrote to its root disk.
        self.assertEqual(base_state(self.base), self.before)
        self.assertEqual(self.before[2], 0o444)

    def test_default_image(self):
        r = self.run_default(["image", "ls"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout, rb"\ndebian +\d+ +virtio +python shell javascript ")
        with tempfile.TemporaryDirectory() as only_tiny:
            os.chmod(only_tiny, 0o755)  # QEMU, another user, reads the image through it
            os.symlink(os.path.join(altest.IMAGE_DIR, "tiny"), os.path.join(only_tiny, "tiny"))
            r = altest.run(["-q", "exec", "--", "sh", "-c",
                            "test -e /etc/debian_version && echo debian || echo tiny"],
                           image_dir=only_tiny, env=self.env)
            self.assertEqual(r.stdout, b"tiny\n", r.stderr)

    def test_missing_root_disk_powers_off(self):
        # tiny's initramfs told to switch to a disk the VM does not have: init says why on the
        # console and powers off, rather than serving an agent without its image.
        d = self.store.copy_image("tiny", "rootless")
        with open(os.path.join(d, "manifest.json")) as f:
            m = json.load(f)
        m["cmdline"] += " airlock.root=/dev/vda"
        with open(os.path.join(d, "manifest.json"), "w") as f:
            json.dump(m, f)
        r = altest.run(["--debug", "exec", "--image", "rootless", "--", "true"],
                       image_dir=self.store.dir)
        self.assertEqual(r.returncode, 125, r.stderr)
        self.assertIn(b"cannot mount the root disk /dev/vda", r.stderr)

    def test_image_build_and_rm(self):
        # The debian build reuses the cached root disk (a hard link to it) and redoes only the
        # initramfs: seconds, no mmdebstrap.
        with tempfile.TemporaryDirectory() as store:
            os.chmod(store, 0o755)
            t0 = time.monotonic()
            r = altest.run(["image", "build", "debian"], image_dir=store)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertLess(time.monotonic() - t0, 60, "the root disk was not reused")
            self.assertTrue(os.path.samefile(os.path.join(store, "debian", "rootfs.qcow2"),
                                             self.base))
            r = altest.run(["image", "build", "tiny"], image_dir=store)
            self.assertEqual(r.returncode, 0, r.stderr)
            r = altest.run(["image", "ls"], image_dir=store)
            self.assertRegex(r.stdout, rb"\ndebian +\d+ ")
            self.assertRegex(r.stdout, rb"\ntiny +\d+ ")
            r = altest.run(["image", "rm", "debian"], image_dir=store)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(sorted(os.listdir(store)), ["tiny"])
            self.assertTrue(os.path.exists(self.base))  # the cache and other stores keep theirs
            r = altest.run(["image", "rm", "debian"], image_dir=store)
            self.assertEqual(r.returncode, 1)
            self.assertIn(b"no image 'debian'", r.stderr)
            r = altest.run(["image", "build", "no-such-recipe"], image_dir=store)
            self.assertEqual(r.returncode, 1)
            self.assertIn(b"no recipe for image 'no-such-recipe'", r.stderr)
            r = altest.run(["image", "build", "../tiny"], image_dir=store)
            self.assertIn(b"bad image name", r.stderr)


if __name__ == "__main__":
    altest.main()

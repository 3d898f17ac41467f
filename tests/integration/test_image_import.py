#!/usr/bin/env python3
"""`airlock image import`: stock cloud images into a throwaway store, and the hostile files it
must refuse (a backing file or an external data file naming a host file, files that are no
disk, sizes over the limit), leaving nothing behind. Needs qemu-img, not libvirt: no VM boots."""
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import unittest

import altest

GIB = 1 << 30
# orchestrator/vm/import.c: IMPORT_SIZE_MAX
SIZE_MAX = 256 * GIB


def qemu_img(*args):
    subprocess.run(["qemu-img"] + list(args), check=True, stdout=subprocess.DEVNULL)


def info(path):
    out = subprocess.run(["qemu-img", "info", "--output=json", path], check=True,
                         stdout=subprocess.PIPE).stdout
    return json.loads(out)


class ImportTest(unittest.TestCase):
    def setUp(self):
        self.work = tempfile.mkdtemp(prefix="airlock-import-")
        self.store = os.path.join(self.work, "store")
        self.qcow2 = self.path("cloud.qcow2")
        qemu_img("create", "-q", "-f", "qcow2", self.qcow2, "64M")
        # A raw disk as the firmware sees one: a boot sector ending in 55 aa, then zeros.
        self.raw = self.path("cloud.raw")
        with open(self.raw, "wb") as f:
            f.truncate(64 << 20)
            f.seek(510)
            f.write(b"\x55\xaa")

    def tearDown(self):
        shutil.rmtree(self.work, ignore_errors=True)

    def path(self, name):
        return os.path.join(self.work, name)

    def airlock(self, *args):
        r = altest.run(["image"] + list(args), image_dir=self.store)
        self.assertGreaterEqual(r.returncode, 0, "killed by a signal: %r" % (r,))
        return r

    def imported(self, *args):
        r = self.airlock("import", *args)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r

    def refused(self, needle, *args):
        r = self.airlock("import", *args)
        self.assertEqual(r.returncode, 1, r)
        self.assertIn(needle, r.stderr)
        self.assertEqual(r.stderr.count(b"\n"), 1, r.stderr)  # one line, said once
        return r

    def store_entries(self):
        return sorted(os.listdir(self.store)) if os.path.isdir(self.store) else []

    def manifest(self, name):
        with open(os.path.join(self.store, name, "manifest.json")) as f:
            return json.load(f)

    def test_imports_qcow2_and_raw(self):
        self.imported(self.qcow2, "--name", "deb")
        self.imported(self.raw, "--name", "ubu", "--user", "ubuntu", "--memory", "2048")
        self.assertEqual(self.store_entries(), ["deb", "ubu"])  # no scratch dir left
        self.assertEqual(self.manifest("deb"), {
            "disk": "disk.qcow2", "transport": "ssh", "ssh_user": "debian", "ssh_port": 22,
            "memory_mib": 1024, "imported_from": "cloud.qcow2"})
        m = self.manifest("ubu")
        self.assertEqual((m["ssh_user"], m["memory_mib"], m["imported_from"]),
                         ("ubuntu", 2048, "cloud.raw"))
        for name in ("deb", "ubu"):
            d = os.path.join(self.store, name)
            i = info(os.path.join(d, "disk.qcow2"))
            self.assertEqual(i["format"], "qcow2")
            self.assertEqual(i["virtual-size"], 64 << 20)
            self.assertNotIn("backing-filename", i)
            self.assertNotIn("data-file", i["format-specific"]["data"])
            self.assertEqual(sorted(os.listdir(d)), ["disk.qcow2", "manifest.json"])
            # QEMU runs as another user and reads the base; sessions never write it.
            self.assertEqual(stat.S_IMODE(os.stat(d).st_mode), 0o755)
            self.assertEqual(stat.S_IMODE(os.stat(os.path.join(d, "disk.qcow2")).st_mode), 0o444)
            self.assertEqual(stat.S_IMODE(os.stat(os.path.join(d, "manifest.json")).st_mode),
                             0o644)

    def test_ls_shows_transport_and_user(self):
        self.imported(self.qcow2, "--name", "deb")
        self.imported(self.raw, "--name", "ubu", "--user", "ubuntu")
        # A virtio image next to them: kernel and initrd only need to be files to be listed.
        vm = os.path.join(self.store, "vm")
        os.mkdir(vm)
        for part in ("vmlinuz", "initrd.img"):
            open(os.path.join(vm, part), "w").close()
        proto = int(re.search(rb"\(protocol (\d+)\)", altest.run(["--version"]).stdout)[1])
        with open(os.path.join(vm, "manifest.json"), "w") as f:
            json.dump({"kernel": "vmlinuz", "initrd": "initrd.img", "agent_protocol": proto,
                       "languages": ["sh"]}, f)
        r = self.airlock("ls")
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.decode().splitlines()
        self.assertEqual(len(lines), 4, r.stdout)
        self.assertRegex(lines[1], r"^deb +\d+ +ssh:debian +- +/")
        self.assertRegex(lines[2], r"^ubu +\d+ +ssh:ubuntu +- +/")
        self.assertRegex(lines[3], r"^vm +%d +virtio +sh +/" % proto)
        col = lines[0].index("TRANSPORT")
        self.assertEqual([l[col:col + 3] for l in lines[1:]], ["ssh", "ssh", "vir"])
        self.assertEqual(len({l.index("/") for l in lines[1:]}), 1, "PATH column not aligned")

    def test_ls_lists_only_this_stores_templates(self):
        """The state dir's warm templates are listed with the images of the store that was
        asked about: a template of another store's image is not this store's (image ls listed
        the machine's warm debian under a private store that has no debian)."""
        state = tempfile.mkdtemp(prefix="airlock-state-")
        self.addCleanup(shutil.rmtree, state, ignore_errors=True)
        for image in ("elsewhere", "vm"):
            t = os.path.join(state, "templates", image + "-0123456789abcdef")
            os.makedirs(t)
            with open(os.path.join(t, "manifest.json"), "w") as f:
                json.dump({"image": image, "key": "0123456789abcdef", "memory_mib": 512}, f)
        proto = int(re.search(rb"\(protocol (\d+)\)", altest.run(["--version"]).stdout)[1])
        vm = os.path.join(self.store, "vm")
        os.makedirs(vm)
        for part in ("vmlinuz", "initrd.img"):
            open(os.path.join(vm, part), "w").close()
        with open(os.path.join(vm, "manifest.json"), "w") as f:
            json.dump({"kernel": "vmlinuz", "initrd": "initrd.img", "languages": ["sh"],
                       "agent_protocol": proto}, f)
        r = altest.run(["image", "ls"], image_dir=self.store, env={"AIRLOCK_STATE_DIR": state})
        out = r.stdout.decode()
        self.assertIn("TEMPLATE OF", out)
        self.assertRegex(out, r"\nvm +\d+M .* refused ")  # this store's image's template: listed
        self.assertNotIn("elsewhere", out)

    def test_refuses_a_backing_file(self):
        evil = self.path("evil.qcow2")
        qemu_img("create", "-q", "-f", "qcow2", "-b", "/etc/passwd", "-F", "raw", evil)
        self.refused(b"'%s' has a backing file ('/etc/passwd')" % evil.encode(),
                     evil, "--name", "evil")
        # Relative to the file, too: the name inside is what counts, not where it points.
        rel = self.path("rel.qcow2")
        qemu_img("create", "-q", "-f", "qcow2", "-b", "cloud.qcow2", "-F", "qcow2", rel)
        self.refused(b"has a backing file ('cloud.qcow2')", rel, "--name", "rel")
        self.assertEqual(self.store_entries(), [])

    def test_refuses_an_external_data_file(self):
        df = self.path("df.qcow2")
        qemu_img("create", "-q", "-f", "qcow2", "-o", "data_file=" + self.raw, df, "64M")
        self.refused(b"keeps its data in an external file ('%s')" % self.raw.encode(),
                     df, "--name", "df")
        self.assertEqual(self.store_entries(), [])

    def test_refuses_what_is_no_disk(self):
        # qemu-img would call any of these raw: only a qcow2, or a raw disk with a boot sector,
        # is taken, whatever the file's name says.
        text = self.path("page.qcow2")
        with open(text, "w") as f:
            f.write("<html>404 Not Found</html>\n" * 100)
        self.refused(b"'%s' is neither a qcow2 image nor a raw disk" % text.encode(),
                     text, "--name", "x")
        zeros = self.path("zeros.raw")
        with open(zeros, "wb") as f:
            f.truncate(1 << 20)
        self.refused(b"no boot signature", zeros, "--name", "x")
        empty = self.path("empty.img")
        open(empty, "w").close()
        self.refused(b"neither a qcow2 image nor a raw disk", empty, "--name", "x")
        # The qcow2 magic and nothing sane after it: qemu-img's own complaint, one line.
        broken = self.path("broken.qcow2")
        with open(broken, "wb") as f:
            f.write(b"QFI\xfb" + b"\xff" * 4000)
        self.refused(b"qemu-img cannot read '%s'" % broken.encode(), broken, "--name", "x")
        self.refused(b"is not a regular file", self.work, "--name", "x")
        fifo = self.path("fifo")
        os.mkfifo(fifo)
        self.refused(b"is not a regular file", fifo, "--name", "x")
        self.refused(b"cannot open '%s'" % self.path("missing").encode(),
                     self.path("missing"), "--name", "x")
        self.assertEqual(self.store_entries(), [])

    def test_size_limit(self):
        at = self.path("at.qcow2")
        over = self.path("over.qcow2")
        below = self.path("below.qcow2")
        qemu_img("create", "-q", "-f", "qcow2", at, str(SIZE_MAX))
        qemu_img("create", "-q", "-f", "qcow2", over, str(SIZE_MAX + 512))
        qemu_img("create", "-q", "-f", "qcow2", below, str(SIZE_MAX - 512))
        self.imported(below, "--name", "below")
        self.imported(at, "--name", "at")
        self.assertEqual(info(os.path.join(self.store, "at", "disk.qcow2"))["virtual-size"],
                         SIZE_MAX)
        self.refused(b"over the import limit of 256 GiB", over, "--name", "over")
        # A raw file over the limit is refused before anything is copied (sparse: no room used).
        big = self.path("big.raw")
        with open(big, "wb") as f:
            f.truncate(SIZE_MAX + 512)
        self.refused(b"over the import limit of 256 GiB", big, "--name", "big")
        self.assertEqual(self.store_entries(), ["at", "below"])

    def test_names_users_and_replacing(self):
        self.refused(b"bad image name '../x'", self.qcow2, "--name", "../x")
        self.refused(b"bad image name '.x'", self.qcow2, "--name", ".x")
        self.refused(b"bad SSH user name 'a b'", self.qcow2, "--name", "x", "--user", "a b")
        self.refused(b"bad SSH user name '-oProxyCommand=x'", self.qcow2, "--name", "x",
                     "--user", "-oProxyCommand=x")
        self.assertEqual(self.airlock("import", self.qcow2).returncode, 2)
        self.assertEqual(self.airlock("import", "--name", "x").returncode, 2)
        self.assertEqual(self.airlock("import", self.qcow2, "--name", "x", "--memory",
                                      "10").returncode, 2)
        self.assertEqual(self.store_entries(), [])

        self.imported(self.qcow2, "--name", "c")
        self.refused(b"image 'c' already exists (--force replaces it)", self.raw, "--name", "c")
        self.assertEqual(self.manifest("c")["imported_from"], "cloud.qcow2")
        self.imported(self.raw, "--name", "c", "--force", "--user", "ubuntu")
        m = self.manifest("c")
        self.assertEqual((m["imported_from"], m["ssh_user"]), ("cloud.raw", "ubuntu"))
        # --force on a name that is free just imports.
        self.imported(self.qcow2, "--name", "d", "--force")
        # A failed --force leaves the old image as it was.
        evil = self.path("evil.qcow2")
        qemu_img("create", "-q", "-f", "qcow2", "-b", "/etc/passwd", "-F", "raw", evil)
        self.refused(b"has a backing file", evil, "--name", "c", "--force")
        self.assertEqual(self.manifest("c")["imported_from"], "cloud.raw")
        # Only an image is replaced, never something else that has its name in the store.
        stray = os.path.join(self.store, "stray")
        os.mkdir(stray)
        open(os.path.join(stray, "keep"), "w").close()
        self.refused(b"is in the image store but is not an image", self.qcow2, "--name",
                     "stray", "--force")
        self.assertEqual(os.listdir(stray), ["keep"])
        self.assertEqual(self.store_entries(), ["c", "d", "stray"])

    def wrap_qemu_img(self, body):
        """Puts a qemu-img first in PATH that runs body (sh) before the real one."""
        bindir = self.path("bin")
        os.mkdir(bindir)
        w = os.path.join(bindir, "qemu-img")
        with open(w, "w") as f:
            f.write("#!/bin/sh\n%s\nexec %s \"$@\"\n" % (body, shutil.which("qemu-img")))
        os.chmod(w, 0o755)
        return {"PATH": bindir + ":" + os.environ["PATH"]}

    def test_qemu_img_runs_under_limits(self):
        # QEMU's advice for untrusted images: qemu-img under CPU time and address-space limits,
        # so a crafted file cannot spin or eat the host's memory (orchestrator/vm/import.c).
        seen = self.path("limits")
        env = self.wrap_qemu_img('echo "$1 $(ulimit -t) $(ulimit -v)" >> %s' % seen)
        r = altest.run(["image", "import", self.qcow2, "--name", "deb"], image_dir=self.store,
                       env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(seen) as f:
            lines = f.read().split("\n")
        self.assertEqual(lines, ["info 30 %d" % (1 << 20), "convert 600 %d" % (2 << 20), ""])

    def test_qemu_img_over_its_cpu_limit(self):
        # What the kernel sends at RLIMIT_CPU: said as such, one line, nothing left behind.
        env = self.wrap_qemu_img('[ "$1" = info ] && kill -XCPU $$')
        r = altest.run(["image", "import", self.qcow2, "--name", "deb"], image_dir=self.store,
                       env=env)
        self.assertEqual(r.returncode, 1, r)
        self.assertIn(b"qemu-img cannot read '%s': over its CPU time limit of 30 s"
                      % self.qcow2.encode(), r.stderr)
        self.assertEqual(r.stderr.count(b"\n"), 1, r.stderr)
        self.assertEqual(self.store_entries(), [])


if __name__ == "__main__":
    if not shutil.which("qemu-img"):
        print("qemu-img is not installed")
        sys.exit(77)  # meson: skipped
    altest.main()

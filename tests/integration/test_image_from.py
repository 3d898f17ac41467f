#!/usr/bin/env python3
"""`airlock image build NAME --from PATH` against hostile images, in a throwaway store: OCI
layouts whose layers python's tarfile crafts (what no builder would write), each refused with
the entry named or neutralised, nothing written outside the new tree, nothing left in the store
on failure. The result is read back with debugfs (no VM boots: test_images.py boots them)."""
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import unittest

import altest


def blob(layout, data):
    d = hashlib.sha256(data).hexdigest()
    os.makedirs(os.path.join(layout, "blobs", "sha256"), exist_ok=True)
    with open(os.path.join(layout, "blobs", "sha256", d), "wb") as f:
        f.write(data)
    return {"digest": "sha256:" + d, "size": len(data)}


def layer(entries):
    """A tar of (TarInfo fields, data) entries, as given: names and links unchecked."""
    b = io.BytesIO()
    with tarfile.open(fileobj=b, mode="w", format=tarfile.PAX_FORMAT) as t:
        for e in entries:
            info = tarfile.TarInfo(e["name"])
            info.type = e.get("type", tarfile.REGTYPE)
            info.mode = e.get("mode", 0o644 if info.type == tarfile.REGTYPE else 0o755)
            info.linkname = e.get("link", "")
            info.devmajor, info.devminor = e.get("dev", (0, 0))
            info.pax_headers = e.get("pax", {})
            data = e.get("data", b"")
            info.size = len(data) if info.type == tarfile.REGTYPE else 0
            t.addfile(info, io.BytesIO(data) if info.type == tarfile.REGTYPE else None)
    return b.getvalue()


BASE = [{"name": "bin", "type": tarfile.DIRTYPE}, {"name": "etc", "type": tarfile.DIRTYPE},
        {"name": "etc/os-release", "data": b"ID=test\n"}]


def oci(layout, layers, config=None, corrupt=None):
    """An OCI image layout of layers (lists of entries); corrupt: a layer index whose blob is
    changed after its digest was taken."""
    os.makedirs(layout, exist_ok=True)
    with open(os.path.join(layout, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    descs, diff_ids = [], []
    for i, entries in enumerate(layers):
        data = layer(entries)
        d = blob(layout, data)
        diff_ids.append(d["digest"])
        if i == corrupt:
            path = os.path.join(layout, "blobs", "sha256", d["digest"][7:])
            with open(path, "ab") as f:
                f.write(b"\0" * 1024)
        descs.append(dict(d, mediaType="application/vnd.oci.image.layer.v1.tar"))
    cfg = {"architecture": "amd64", "os": "linux", "config": config or {},
           "rootfs": {"type": "layers", "diff_ids": diff_ids}}
    c = blob(layout, json.dumps(cfg).encode())
    m = blob(layout, json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": dict(c, mediaType="application/vnd.oci.image.config.v1+json"),
        "layers": descs}).encode())
    with open(os.path.join(layout, "index.json"), "w") as f:
        json.dump({"schemaVersion": 2, "manifests": [
            dict(m, mediaType="application/vnd.oci.image.manifest.v1+json")]}, f)
    return layout


class ImageFromTest(unittest.TestCase):
    def setUp(self):
        self.work = tempfile.mkdtemp(prefix="airlock-from-")
        self.store = os.path.join(self.work, "store")
        os.makedirs(self.store)
        os.chmod(self.store, 0o755)
        # The base image's boot parts, as the real store has them (linked, never written).
        os.symlink(os.path.join(altest.IMAGE_DIR, "debian"), os.path.join(self.store, "debian"))
        # Next to the store: what a layer escaping its tree would reach.
        self.outside = os.path.join(self.work, "outside")
        os.makedirs(self.outside)
        with open(os.path.join(self.outside, "keep"), "w") as f:
            f.write("untouched\n")

    def tearDown(self):
        shutil.rmtree(self.work, ignore_errors=True)

    def build(self, name, src, *args):
        r = altest.run(["image", "build", name, "--from", src] + list(args),
                       image_dir=self.store)
        self.assertGreaterEqual(r.returncode, 0, r)
        return r

    def assert_nothing_left(self):
        self.assertEqual(sorted(os.listdir(self.store)), ["debian"])
        self.assertEqual(os.listdir(self.outside), ["keep"])
        with open(os.path.join(self.outside, "keep")) as f:
            self.assertEqual(f.read(), "untouched\n")
        self.assertFalse(os.path.exists("/etc/airlock-escaped"))

    def refused(self, entries, needle, *args, lower=None):
        layers = ([BASE] if lower is None else [BASE, lower]) + [entries]
        src = oci(os.path.join(self.work, "img"), layers)
        r = self.build("bad", src, *args)
        self.assertEqual(r.returncode, 1, r)
        self.assertIn(needle.encode(), r.stderr)
        self.assertEqual(r.stderr.count(b"\n"), r.stderr.count(b"airlock: ") or 1)
        self.assert_nothing_left()
        return r

    def debugfs(self, name, request):
        raw = os.path.join(self.work, "root.raw")
        subprocess.run(["qemu-img", "convert", "-f", "qcow2", "-O", "raw",
                        os.path.join(self.store, name, "rootfs.qcow2"), raw], check=True)
        try:
            return subprocess.run(["debugfs", "-R", request, raw], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, check=True).stdout.decode()
        finally:
            os.unlink(raw)

    def test_dotdot_refused(self):
        self.refused([{"name": "../../outside/keep", "data": b"pwned"}], "'../../outside/keep'")

    def test_absolute_refused(self):
        self.refused([{"name": "/etc/airlock-escaped", "data": b"pwned"}],
                     "'/etc/airlock-escaped'")

    def test_hardlink_out_refused(self):
        self.refused([{"name": "etc/shadow2", "type": tarfile.LNKTYPE,
                       "link": "../../outside/keep"}], "etc/shadow2")
        self.refused([{"name": "etc/passwd2", "type": tarfile.LNKTYPE, "link": "/etc/passwd"}],
                     "etc/passwd2")

    def test_digest_mismatch_refused(self):
        src = oci(os.path.join(self.work, "img"), [BASE, [{"name": "x", "data": b"x"}]],
                  corrupt=1)
        r = self.build("bad", src)
        self.assertEqual(r.returncode, 1, r)
        self.assertIn(b"layer 2", r.stderr)
        self.assertIn(b"digest", r.stderr)
        self.assert_nothing_left()

    def test_size_bound(self):
        r = self.refused([{"name": "big", "data": b"\0" * (3 << 20)}], "big", "--max-size", "2M")
        self.assertIn(b"layer 2", r.stderr)

    def test_bad_config_refused(self):
        src = oci(os.path.join(self.work, "img"), [BASE], config={"Env": ["no-equals-sign"]})
        r = self.build("bad", src)
        self.assertEqual(r.returncode, 1, r)
        self.assertIn(b"Env", r.stderr)
        self.assert_nothing_left()

    def test_an_archive_leaves_only_the_image(self):
        """From an OCI archive: the image's dir holds its parts, not the unpacked archive."""
        layout = oci(os.path.join(self.work, "img"), [BASE, [{"name": "x", "data": b"x"}]])
        archive = os.path.join(self.work, "img.tar")
        subprocess.run(["tar", "-C", layout, "-cf", archive, "oci-layout", "index.json", "blobs"],
                       check=True)
        r = self.build("arch", archive)
        self.assertEqual(r.returncode, 0, r)
        parts = sorted(os.listdir(os.path.join(self.store, "arch")))
        self.assertEqual([p for p in parts if p not in ("initrd.img", "manifest.json",
                                                         "rootfs.qcow2", "vmlinux", "vmlinuz")],
                         [], parts)
        self.assertEqual(sorted(os.listdir(self.store)), ["arch", "debian"])

    def test_member_flood_refused(self):
        with tarfile.open(os.path.join(self.work, "flood.tar"), "w") as t:
            for i in range(600):
                info = tarfile.TarInfo("blobs/sha256/%064x" % i)
                t.addfile(info, io.BytesIO(b""))
        r = self.build("bad", os.path.join(self.work, "flood.tar"))
        self.assertEqual(r.returncode, 1, r)
        self.assertIn(b"not an image archive", r.stderr)
        self.assert_nothing_left()

    def test_archives_of_each_layout(self):
        """An OCI archive with its directories' entries (as buildah writes it) and a docker
        save (skopeo's: HEX.tar layers, HEX/layer.tar links to them) are read as images, not
        as a root file system's tar."""
        layout = oci(os.path.join(self.work, "img"), [BASE])
        with tarfile.open(os.path.join(self.work, "img.oci.tar"), "w") as t:
            t.add(layout, arcname=".")
        data = layer(BASE)
        lid = hashlib.sha256(data).hexdigest()
        cfg = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Env": ["A=1"]},
                          "rootfs": {"type": "layers",
                                     "diff_ids": ["sha256:" + lid]}}).encode()
        cid = hashlib.sha256(cfg).hexdigest()
        v1 = "%064x" % 7
        manifest = json.dumps([{"Config": cid + ".json", "RepoTags": ["t:latest"],
                                "Layers": [lid + ".tar"]}]).encode()
        with open(os.path.join(self.work, "img.docker.tar"), "wb") as f:
            f.write(layer([{"name": lid + ".tar", "data": data},
                           {"name": cid + ".json", "data": cfg},
                           {"name": v1 + "/layer.tar", "type": tarfile.SYMTYPE,
                            "link": "../" + lid + ".tar"},
                           {"name": v1 + "/VERSION", "data": b"1.0"},
                           {"name": v1 + "/json", "data": b"{}"},
                           {"name": "manifest.json", "data": manifest},
                           {"name": "repositories", "data": b"{}"}]))
        for name, kind in (("o", "oci-archive"), ("d", "docker-archive")):
            r = self.build(name, os.path.join(self.work, "img.%s.tar" % kind.split("-")[0]))
            self.assertEqual(r.returncode, 0, r)
            out = altest.run(["image", "inspect", name], image_dir=self.store).stdout.decode()
            self.assertRegex(out, r"source +%s /" % kind)
            self.assertEqual(self.debugfs(name, "cat /etc/os-release"), "ID=test\n")
            shutil.rmtree(os.path.join(self.store, name))
        self.assert_nothing_left()

    def test_rootfs_tar_and_not_an_image(self):
        """A root file system's tar (docker export) is one layer, with the same checks; a tar of
        layout names without oci-layout or manifest.json is no image."""
        with open(os.path.join(self.work, "rootfs.tar"), "wb") as f:
            f.write(layer(BASE + [{"name": "dev/null", "type": tarfile.CHRTYPE, "dev": (1, 3)}]))
        r = self.build("rootfs", os.path.join(self.work, "rootfs.tar"))
        self.assertEqual(r.returncode, 0, r)
        self.assertIn(b"dev/null: device node dropped", r.stderr)
        self.assertIn("os-release", self.debugfs("rootfs", "ls /etc"))
        out = altest.run(["image", "inspect", "rootfs"], image_dir=self.store).stdout.decode()
        self.assertRegex(out, r"source +rootfs-archive /")
        r = self.build("bad", os.path.join(self.work, "rootfs.tar"), "--kernels")
        self.assertEqual(r.returncode, 1, r)
        self.assertIn(b"not a root file system's tar", r.stderr)
        with open(os.path.join(self.work, "index.tar"), "wb") as f:
            f.write(layer([{"name": "index.json", "data": b"{}"}]))
        r = self.build("bad", os.path.join(self.work, "index.tar"))
        self.assertEqual(r.returncode, 1, r)
        self.assertIn(b"neither an OCI image", r.stderr)
        shutil.rmtree(os.path.join(self.store, "rootfs"))
        self.assert_nothing_left()

    def test_neutralised(self):
        """One image with what is made safe rather than refused: a symlink out of the tree
        written through (lands inside), devices dropped, a FIFO kept, set-id cleared, xattrs
        dropped, whiteouts and an opaque directory applied, the config's defaults kept."""
        lower = [{"name": "etc/old", "data": b"old"},
                 {"name": "opq", "type": tarfile.DIRTYPE},
                 {"name": "opq/lower", "data": b"lower"},
                 {"name": "esc", "type": tarfile.SYMTYPE, "link": "/"},
                 {"name": "up", "type": tarfile.SYMTYPE, "link": "../../../.."}]
        upper = [{"name": "esc/etc/through-symlink", "data": b"inside"},
                 {"name": "up/etc/through-dotdot-link", "data": b"inside"},
                 {"name": "dev-null", "type": tarfile.CHRTYPE, "dev": (1, 3)},
                 {"name": "disk", "type": tarfile.BLKTYPE, "dev": (8, 0)},
                 {"name": "fifo", "type": tarfile.FIFOTYPE},
                 {"name": "bin/suid", "data": b"#!/bin/sh\n", "mode": 0o4755},
                 {"name": "bin/sgid", "data": b"#!/bin/sh\n", "mode": 0o2755},
                 {"name": "xattr", "data": b"x",
                  "pax": {"SCHILY.xattr.security.capability": "\x01\x00\x00\x02"}},
                 {"name": "etc/.wh.old"},
                 {"name": "opq/upper", "data": b"upper"},
                 {"name": "opq/.wh..wh..opq"}]
        src = oci(os.path.join(self.work, "img"), [BASE, lower, upper],
                  config={"Env": ["PATH=/bin", "FOO=bar"], "WorkingDir": "/srv",
                          "Cmd": ["/bin/sh", "-c", "echo one\necho two"]})
        r = self.build("ok", src)
        self.assertEqual(r.returncode, 0, r)
        for needle in (b"dev-null", b"disk", b"bin/suid", b"bin/sgid", b"xattr"):
            self.assertIn(needle, r.stderr)
        self.assertEqual(os.listdir(self.outside), ["keep"])
        self.assertFalse(os.path.exists("/etc/through-symlink"))
        ls = self.debugfs("ok", "ls -l /")
        self.assertNotIn("dev-null", ls)
        self.assertNotIn(" disk", ls)
        self.assertIn("fifo", ls)
        etc = self.debugfs("ok", "ls /etc")
        self.assertIn("through-symlink", etc)
        self.assertIn("through-dotdot-link", etc)
        self.assertNotIn("old", etc.replace("os-release", ""))
        opq = self.debugfs("ok", "ls /opq")
        self.assertIn("upper", opq)
        self.assertNotIn("lower", opq)
        suid = self.debugfs("ok", "stat /bin/suid")
        self.assertIn("Mode:  0755", suid)
        self.assertIn("Mode:  0755", self.debugfs("ok", "stat /bin/sgid"))
        inspect = altest.run(["image", "inspect", "ok"], image_dir=self.store)
        self.assertEqual(inspect.returncode, 0, inspect)
        out = inspect.stdout.decode()
        self.assertRegex(out, r"source +oci-layout /")
        self.assertRegex(out, r"digest +sha256:[0-9a-f]{64}")
        self.assertRegex(out, r"env +PATH=/bin FOO=bar")
        self.assertRegex(out, r"workdir +/srv")
        self.assertRegex(out, r"cmd +/bin/sh -c echo one\necho two")
        # Kept with --keep-setid.
        r = self.build("setid", src, "--keep-setid")
        self.assertEqual(r.returncode, 0, r)
        self.assertIn("Mode:  04755", self.debugfs("setid", "stat /bin/suid"))
        # The name is taken now; --force replaces.
        r = self.build("ok", src)
        self.assertEqual(r.returncode, 1, r)
        self.assertIn(b"already exists", r.stderr)
        self.assertEqual(self.build("ok", src, "--force").returncode, 0)


if __name__ == "__main__":
    altest.main()

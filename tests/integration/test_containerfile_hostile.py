#!/usr/bin/env python3
"""`airlock image build NAME --from Containerfile` given a hostile Containerfile and context
(buildah 1.28 is Debian 12's: it resolves a RUN --mount's source on the host, CVE-2024-1753).
Each context is FROM scratch with a static busybox, so no registry is needed. What must hold:
nothing on the host outside the build's scratch space is written or read into the image, each
refusal is one clear line, nothing is left in the store. Real buildah; no VM boots (the image's
files are read back with debugfs)."""
import http.server
import os
import shutil
import subprocess
import tempfile
import threading
import unittest

import altest

BUSYBOX = "/bin/busybox"


class ContainerfileHostileTest(unittest.TestCase):
    def setUp(self):
        self.work = tempfile.mkdtemp(prefix="airlock-cf-")
        os.chmod(self.work, 0o755)
        self.store = os.path.join(self.work, "store")
        os.makedirs(self.store)
        os.chmod(self.store, 0o755)
        os.symlink(os.path.join(altest.IMAGE_DIR, "debian"), os.path.join(self.store, "debian"))
        # What an escape would reach: a host directory with a secret, outside the context.
        self.victim = os.path.join(self.work, "victim")
        os.makedirs(self.victim)
        with open(os.path.join(self.victim, "secret"), "w") as f:
            f.write("host secret\n")
        self.ctx = os.path.join(self.work, "ctx")
        os.makedirs(self.ctx)
        shutil.copy(BUSYBOX, os.path.join(self.ctx, "busybox"))
        # buildah's containers and images before: a refused build leaves none behind.
        self.containers = self.buildah("containers", "-q")

    def tearDown(self):
        shutil.rmtree(self.work, ignore_errors=True)

    def buildah(self, *args):
        return subprocess.run(["buildah"] + list(args), stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL).stdout

    def build(self, text, name="cf"):
        with open(os.path.join(self.ctx, "Containerfile"), "w") as f:
            f.write(text)
        r = altest.run(["image", "build", name, "--from", os.path.join(self.ctx, "Containerfile")],
                       image_dir=self.store, timeout=600)
        self.assertGreaterEqual(r.returncode, 0, r)
        return r

    def assert_host_untouched(self):
        self.assertEqual(sorted(os.listdir(self.victim)), ["secret"])
        with open(os.path.join(self.victim, "secret")) as f:
            self.assertEqual(f.read(), "host secret\n")
        self.assertEqual(sorted(os.listdir(self.store)), ["debian"])
        self.assertEqual(self.buildah("containers", "-q"), self.containers)

    def refused(self, text, needle):
        r = self.build(text)
        err = r.stderr.decode(errors="replace")
        self.assertEqual(r.returncode, 1, err)
        self.assertIn(needle, err)
        # One line says why; nothing was built.
        self.assertEqual(err.count("\n"), 1, err)
        self.assertNotIn("building", err)
        self.assert_host_untouched()

    def image_file(self, name, path, request="cat"):
        raw = os.path.join(self.work, "root.raw")
        subprocess.run(["qemu-img", "convert", "-f", "qcow2", "-O", "raw",
                        os.path.join(self.store, name, "rootfs.qcow2"), raw], check=True)
        try:
            return subprocess.run(["debugfs", "-R", "%s %s" % (request, path), raw],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  check=True).stdout
        finally:
            os.unlink(raw)

    # ---- RUN --mount: the CVE and its spellings ----

    def test_cve_2024_1753_bind_mount_of_a_link_to_the_host(self):
        os.symlink(self.victim, os.path.join(self.ctx, "r"))
        os.symlink("/", os.path.join(self.ctx, "root"))
        for src in ("r", "root"):
            self.refused("FROM scratch\nCOPY busybox /bin/busybox\n"
                         "RUN --mount=type=bind,source=%s,target=/h,rw "
                         "[\"/bin/busybox\", \"touch\", \"/h/pwned\"]\n" % src, "RUN --mount")

    def test_mount_spellings(self):
        cases = [
            # a .. source, no link at all
            "RUN --mount=type=bind,source=../../..,target=/h,rw [\"/bin/busybox\", \"ls\"]\n",
            # split by a continuation, with a comment line inside it
            "RUN --mo\\\n# a comment\nunt=type=bind,source=r,target=/h [\"/bin/busybox\"]\n",
            # the other escape character
            "RUN --mou`\nnt=type=cache,target=/c [\"/bin/busybox\"]\n",
            # case, and ONBUILD
            "ONBUILD run --MOUNT=type=secret,id=x [\"/bin/busybox\"]\n",
        ]
        for body in cases:
            head = "# escape=`\n" if "`" in body else ""
            self.refused(head + "FROM scratch\nCOPY busybox /bin/busybox\n" + body, "RUN --mount")

    def test_host_network_refused(self):
        self.refused("FROM scratch\nCOPY busybox /bin/busybox\n"
                     "RUN --network=host [\"/bin/busybox\", \"true\"]\n", "host's network")

    def test_add_of_a_url_refused(self):
        # buildah would fetch it from the host: a service on the host's loopback would answer.
        hits = []

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                hits.append(self.path)
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"loopback secret\n")

            def log_message(self, *a):
                pass

        srv = http.server.HTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        try:
            url = "http://127.0.0.1:%d/meta" % srv.server_address[1]
            self.refused("FROM scratch\nADD %s /x\n" % url, "ADD names a URL")
            self.refused("FROM scratch\nARG U=%s\nADD \\\n  $U /x\n" % url, "ADD names a URL")
        finally:
            srv.shutdown()
            srv.server_close()
        self.assertEqual(hits, [])

    # ---- links in the context ----

    def test_absolute_link_left_out(self):
        # COPY and ADD of a link out of the context: the copy buildah reads has no such link.
        os.symlink(self.victim, os.path.join(self.ctx, "abs"))
        for ins in ("COPY abs/secret /stolen", "ADD abs /stolen"):
            r = self.build("FROM scratch\nCOPY busybox /bin/busybox\n%s\n" % ins)
            self.assertEqual(r.returncode, 1, r)
            self.assertIn(b"abs: symlink pointing outside the directory", r.stderr)
            self.assertNotIn(b"host secret", r.stderr)
            self.assert_host_untouched()

    def test_link_chain_out_refused(self):
        # Each link's text stays inside; resolved together they leave the context.
        os.makedirs(os.path.join(self.ctx, "sub"))
        os.symlink("..", os.path.join(self.ctx, "sub", "up"))
        os.symlink("sub/up/../victim", os.path.join(self.ctx, "r"))
        self.refused("FROM scratch\nCOPY busybox /bin/busybox\nCOPY r/secret /stolen\n",
                     "symlink 'r' leads out of the context through other links")

    def test_ignore_file_link_and_copy_from_a_stage_link(self):
        # .containerignore a link to a host file: left out, never read. A stage makes a link to
        # the host's victim; COPY --from through it reads the stage's tree, not the host's.
        os.symlink(os.path.join(self.victim, "secret"), os.path.join(self.ctx, ".containerignore"))
        os.makedirs(os.path.join(self.ctx, "data"))
        with open(os.path.join(self.ctx, "data", "file"), "w") as f:
            f.write("in the context\n")
        os.symlink("data/file", os.path.join(self.ctx, "inside"))
        r = self.build("FROM scratch AS a\nCOPY busybox /bin/busybox\n"
                       "RUN [\"/bin/busybox\", \"mkdir\", \"-p\", \"%s\"]\n"
                       "RUN [\"/bin/busybox\", \"sh\", \"-c\", \"echo stage > %s/secret\"]\n"
                       "RUN [\"/bin/busybox\", \"ln\", \"-s\", \"%s\", \"/r\"]\n"
                       "FROM scratch\nCOPY busybox /bin/busybox\n"
                       "COPY --from=a /r/secret /stolen\n"
                       "COPY . /ctx/\n"
                       % (self.victim, self.victim, self.victim))
        self.assertEqual(r.returncode, 0, r.stderr.decode(errors="replace"))
        self.assertIn(b".containerignore: symlink pointing outside the directory", r.stderr)
        self.assertEqual(self.image_file("cf", "/stolen"), b"stage\n")
        # A link inside the context is kept (as a link); the one out of it is not there.
        self.assertEqual(self.image_file("cf", "/ctx/data/file"), b"in the context\n")
        self.assertIn(b'Fast link dest: "data/file"', self.image_file("cf", "/ctx/inside", "stat"))
        self.assertNotIn(b"host secret", self.image_file("cf", "/ctx/.containerignore"))
        # The copies buildah read are no part of the image; the user's context is as it was.
        for leftover in ("context", "Containerfile"):
            self.assertFalse(os.path.exists(os.path.join(self.store, "cf", leftover)))
        self.assertEqual(sorted(os.listdir(self.ctx)),
                         [".containerignore", "Containerfile", "busybox", "data", "inside"])
        self.assertEqual(sorted(os.listdir(self.victim)), ["secret"])


if __name__ == "__main__":
    altest.main()

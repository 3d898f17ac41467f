#!/usr/bin/env python3
"""Images people bring (issue 34), booted: a Containerfile FROM the exported debian base with
a package from the archive, ENV and WORKDIR; an OCI archive and a docker-save tarball that
buildah makes from a directory (no network); a directory tree; and a session saved as an image
through airlockd (a package and a file kept, the session's machine-id not, another key's
creates not finding it). Real buildah, podman, libvirt, QEMU and agent."""
import http.client
import json
import os
import shutil
import subprocess
import tempfile
import unittest

import altest
from airlock import APIError, Sandbox
from test_airlockd import Daemon
from test_e2b import e2b_form, e2b_port


def sh(*args, **kw):
    return subprocess.run(list(args), check=True, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, **kw)


def busybox_root(path):
    """A root file system of one static busybox and its links: boots under the agent."""
    os.makedirs(os.path.join(path, "bin"))
    shutil.copy("/bin/busybox", os.path.join(path, "bin", "busybox"))
    for applet in ("sh", "cat", "echo", "pwd", "ls", "id"):
        os.symlink("busybox", os.path.join(path, "bin", applet))
    os.makedirs(os.path.join(path, "data"))
    with open(os.path.join(path, "data", "greeting"), "w") as f:
        f.write("from the tree\n")


class ImagesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.mkdtemp(prefix="airlock-images-")
        cls.store = os.path.join(cls.work, "store")
        os.makedirs(cls.store)
        os.chmod(cls.work, 0o755)
        os.chmod(cls.store, 0o755)
        # The built images, linked: the new ones take debian's kernel and initrd.
        for name in ("debian", "tiny"):
            os.symlink(os.path.join(altest.IMAGE_DIR, name), os.path.join(cls.store, name))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.work, ignore_errors=True)

    def airlock(self, *args, timeout=900):
        r = altest.run(list(args), image_dir=self.store, timeout=timeout)
        self.assertGreaterEqual(r.returncode, 0, r)
        return r

    def ok(self, *args, timeout=900):
        r = self.airlock(*args, timeout=timeout)
        self.assertEqual(r.returncode, 0, r.stderr.decode(errors="replace"))
        return r

    def test_containerfile_from_exported_base(self):
        # FROM airlock/NAME, not in podman's store yet: the build exports the store's image
        # NAME first (a name of this test's own, so nobody's airlock/debian is touched).
        base = "base%d" % os.getpid()
        os.symlink(os.path.join(altest.IMAGE_DIR, "debian"), os.path.join(self.store, base))
        ref = "airlock/" + base
        try:
            ctx = os.path.join(self.work, "ctx")
            os.makedirs(ctx)
            with open(os.path.join(ctx, "note.txt"), "w") as f:
                f.write("copied in\n")
            with open(os.path.join(ctx, "Containerfile"), "w") as f:
                f.write("FROM %s\n"
                        "RUN apt-get update && apt-get install -y --no-install-recommends cowsay"
                        " && rm -rf /var/lib/apt/lists/*\n"
                        "ENV FOO=bar PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:"
                        "/sbin:/bin:/usr/games\n"
                        "COPY note.txt /srv/app/note.txt\n"
                        "WORKDIR /srv/app\n" % ref)
            r = self.ok("image", "build", "mine", "--from", os.path.join(ctx, "Containerfile"))
            self.assertIn(b"exporting image '%s' first" % base.encode(), r.stderr)
            sh("podman", "image", "exists", ref)
            r = self.ok("exec", "--image", "mine", "--", "cowsay", "hi")
            self.assertIn(b"< hi >", r.stdout)
            r = self.ok("exec", "--image", "mine", "--", "sh", "-c", 'echo "$FOO"; pwd; cat note.txt')
            self.assertEqual(r.stdout.decode().split("\n")[:3], ["bar", "/srv/app", "copied in"])
            # A run's own env wins over the image's.
            r = self.ok("exec", "--image", "mine", "-e", "FOO=mine", "--", "sh", "-c", 'echo "$FOO"')
            self.assertEqual(r.stdout, b"mine\n")
            r = self.ok("image", "ls")
            self.assertRegex(r.stdout.decode(), r"\nmine .* containerfile@sha256:[0-9a-f]{12}")
            # A RUN that never ends is stopped at the build's deadline, leaving nothing.
            before = sh("buildah", "containers", "-q").stdout
            with open(os.path.join(ctx, "Forever"), "w") as f:
                f.write("FROM %s\nRUN sleep 100000\n" % ref)
            r = self.airlock("image", "build", "forever", "--from", os.path.join(ctx, "Forever"),
                             "--timeout", "20")
            self.assertEqual(r.returncode, 1, r)
            self.assertIn(b"ran past its 20 s limit", r.stderr)
            self.assertFalse(os.path.exists(os.path.join(self.store, "forever")))
            self.assertEqual([n for n in os.listdir(self.store) if n.startswith(".")], [])
            self.assertNotIn(b"exporting", r.stderr)  # it is there now
            self.assertEqual(sh("buildah", "containers", "-q").stdout, before)
        finally:
            subprocess.run(["podman", "rmi", "-f", ref], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)

    def test_oci_and_docker_archives_and_a_tree(self):
        tree = os.path.join(self.work, "tree")
        busybox_root(tree)
        ctr = sh("buildah", "from", "scratch").stdout.decode().strip()
        try:
            sh("buildah", "copy", ctr, tree, "/")
            sh("buildah", "config", "--env", "HELLO=world", "--workingdir", "/data",
               "--user", "1000:1000", "--cmd", '["/bin/echo", "from-cmd"]', ctr)
            oci = os.path.join(self.work, "img.oci.tar")
            dock = os.path.join(self.work, "img.docker.tar")
            sh("buildah", "commit", "--rm", ctr, "oci-archive:" + oci)
            ctr = None
        finally:
            if ctr:
                subprocess.run(["buildah", "rm", ctr], stdout=subprocess.DEVNULL)
        # The docker-save form of the same image, by skopeo (no daemon).
        sh("skopeo", "copy", "oci-archive:" + oci, "docker-archive:" + dock + ":busy:latest")
        # --kernels adds python3 and IPython with the image's apt-get: busybox has none. What
        # buildah read for it is not left in its store.
        images = sh("buildah", "images", "-q", "--all").stdout
        r = self.airlock("image", "build", "nokernels", "--from", oci, "--kernels")
        self.assertEqual(sh("buildah", "images", "-q", "--all").stdout, images)
        self.assertEqual(r.returncode, 1, r)
        self.assertIn(b"no apt-get", r.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.store, "nokernels")))
        r = self.airlock("image", "build", "nokernels", "--from", tree, "--kernels")
        self.assertEqual(r.returncode, 1, r)
        self.assertIn(b"--kernels adds packages to an image", r.stderr)
        for name, src, kind in (("fromoci", oci, "oci-archive"),
                                ("fromdocker", dock, "docker-archive"),
                                ("fromtree", tree, "directory")):
            self.ok("image", "build", name, "--from", src)
            r = self.ok("exec", "--image", name, "--", "/bin/sh", "-c",
                        'echo "[$HELLO]"; pwd; cat /data/greeting; id -u; id -g')
            if kind == "directory":  # a bare tree has no configuration
                self.assertEqual(r.stdout, b"[]\n/\nfrom the tree\n0\n0\n")
                r = self.airlock("exec", "--image", name)
                self.assertEqual(r.returncode, 2, r)
                self.assertIn(b"no CMD", r.stderr)
            else:
                # ENV, WORKDIR and USER (no /etc/passwd: uid:gid as given) are the defaults.
                self.assertEqual(r.stdout, b"[world]\n/data\nfrom the tree\n1000\n1000\n")
                r = self.ok("exec", "--image", name)
                self.assertEqual(r.stdout, b"from-cmd\n")
            r = self.ok("image", "inspect", name)
            self.assertIn(("source    " + kind).encode(), r.stdout)


# Written in a session before it is saved: neither may be anywhere in the saved disk.
SECRET = "AIRLOCK-TEST-HOST-KEY-%d" % os.getpid()
DELETED = "AIRLOCK-TEST-DELETED-%d" % os.getpid()
HISTORY = tuple("AIRLOCK-TEST-HISTORY-%s-%d" % (w, os.getpid())
                for w in ("bash", "ipython", "python", "home"))


class CliCommitTest(unittest.TestCase):
    """airlock image commit SESSION NAME: the session another airlock process holds (its
    control socket) saved into the store."""

    def test_commit_a_running_exec(self):
        work = tempfile.mkdtemp(prefix="airlock-cli-commit-")
        store = os.path.join(work, "store")
        os.makedirs(store)
        os.chmod(work, 0o755)
        os.chmod(store, 0o755)
        os.symlink(os.path.join(altest.IMAGE_DIR, "debian"), os.path.join(store, "debian"))
        holder = altest.popen(["exec", "--image", "debian", "--", "sh", "-c",
                               "echo held > /root/held && sync && echo ready && sleep 300"],
                              image_dir=store, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            self.assertEqual(holder.stdout.readline(), b"ready\n")
            ps = altest.run(["ps"], image_dir=store)
            names = [l.split()[0] for l in ps.stdout.decode().splitlines()[1:] if l.strip()]
            mine = [n for n in names if n.startswith("airlock-")]
            self.assertTrue(mine, ps)
            r = altest.run(["image", "commit", mine[-1], "held"], image_dir=store, timeout=600)
            self.assertEqual(r.returncode, 0, r.stderr)
            r = altest.run(["exec", "--image", "held", "--", "cat", "/root/held"], image_dir=store)
            self.assertEqual((r.returncode, r.stdout), (0, b"held\n"), r.stderr)
            r = altest.run(["image", "inspect", "held"], image_dir=store)
            self.assertRegex(r.stdout.decode(), r"source +commit %s" % mine[-1])
        finally:
            holder.kill()
            holder.communicate()
            shutil.rmtree(work, ignore_errors=True)


class CommitTest(unittest.TestCase):
    """POST /v1/sessions/{id}/image: the owner's session saved, then booted again."""

    def setUp(self):
        self.work = tempfile.mkdtemp(prefix="airlock-commit-")
        os.chmod(self.work, 0o755)
        self.store = os.path.join(self.work, "store")
        os.makedirs(self.store)
        os.chmod(self.store, 0o755)
        os.symlink(os.path.join(altest.IMAGE_DIR, "debian"), os.path.join(self.store, "debian"))
        # A package from the archive, installed in the session from a file (it has no network).
        sh("apt-get", "download", "hello", cwd=self.work)
        self.deb = [f for f in os.listdir(self.work) if f.endswith(".deb")][0]
        self.d = Daemon(env={"AIRLOCK_IMAGE_DIR": self.store}, e2b_listen="127.0.0.1:0",
                        lines=["e2b_template = team-stack debian"])

    def tearDown(self):
        self.d.stop_and_remove()
        shutil.rmtree(self.work, ignore_errors=True)

    def e2b_create(self, key, template):
        port = e2b_port(self.d)
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        c.request("POST", "/v2/sandboxes", json.dumps({"templateID": template, "timeout": 60}),
                  {"X-API-KEY": e2b_form(key), "Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, data

    def test_commit(self):
        alice_key, bob_key = self.d.key("alice"), self.d.key("bob")
        alice, bob = self.d.tcp(alice_key), self.d.tcp(bob_key)
        with Sandbox(image="debian", client=alice) as sb:
            with open(os.path.join(self.work, self.deb), "rb") as f:
                sb.files.write("/tmp/hello.deb", f.read())
            # What makes this machine itself: an id and a host key of its own.
            r = sb.commands.run("dpkg -i /tmp/hello.deb >/dev/null && echo kept > /root/marker && "
                                "tr -d - < /proc/sys/kernel/random/uuid > /etc/machine-id && "
                                "mkdir -p /etc/ssh && echo %s > /etc/ssh/ssh_host_ed25519_key && "
                                "echo %s > /root/deleted && sync && rm /root/deleted"
                                " && echo config > /etc/ssh/sshd_config"
                                # what programs kept of what was typed into them
                                " && echo 'curl -H \"token: %s\"' > /root/.bash_history"
                                " && mkdir -p /root/.ipython/profile_default /home/u"
                                " && echo %s > /root/.ipython/profile_default/history.sqlite"
                                " && echo %s > /root/.python_history"
                                " && echo %s > /home/u/.bash_history && sync"
                                " && cat /etc/machine-id"
                                % (SECRET, DELETED, HISTORY[0], HISTORY[1], HISTORY[2],
                                   HISTORY[3]))
            self.assertEqual(r.exit_code, 0, r.stderr)
            session_id = r.stdout.strip()
            self.assertRegex(session_id, r"^[0-9a-f]{32}$")
            saved = sb.save_image("setup")
            self.assertEqual(saved["image"], "setup")
            # Not even in the disk's free blocks: a root in its sessions reads /dev/vda.
            disk = os.path.join(self.store, saved["store_name"], "rootfs.qcow2")
            for needle in (SECRET, DELETED, session_id) + HISTORY:
                found = subprocess.run(["grep", "-a", "-c", needle, disk],
                                       stdout=subprocess.PIPE).stdout
                self.assertEqual(found, b"0\n", needle)
            # The session goes on after the copy.
            self.assertEqual(sb.commands.run("cat /root/marker").stdout, "kept\n")
            with self.assertRaises(APIError) as e:
                sb.save_image("setup")
            self.assertEqual(e.exception.status, 409)
        with Sandbox(image="setup", client=alice) as sb:
            r = sb.commands.run("hello; cat /root/marker; cat /etc/machine-id; ls /etc/ssh")
            self.assertEqual(r.exit_code, 0, r.stderr)
            self.assertEqual(r.stdout, "Hello, world!\nkept\nsshd_config\n")
        with Sandbox(image="debian", client=alice) as sb:
            r = sb.commands.run("command -v hello; test -e /root/marker; echo $?")
            self.assertEqual(r.stdout, "1\n")
        # E2B's templateID: the key's own image by its name, a config line's image by its.
        for key, template, status, image in ((alice_key, "setup", 201, saved["store_name"]),
                                             (bob_key, "setup", 404, None),
                                             (bob_key, "team-stack", 201, "debian")):
            st, data = self.e2b_create(key, template)
            self.assertEqual(st, status, data)
            if image:
                sid = json.loads(data)["sandboxID"]
                owner = alice if key is alice_key else bob
                mine = [x for x in owner.sessions() if x["id"].endswith(sid) or
                        sid in x["id"]]
                self.assertEqual([x["image"] for x in mine], [image], owner.sessions())
                for x in mine:
                    owner.request("DELETE", "/v1/sessions/" + x["id"])
        # From a checkpoint: the disk as it was then, not as it is now.
        with Sandbox(image="debian", checkpoints=True, client=alice) as sb:
            self.assertEqual(sb.commands.run("echo then > /root/then && sync").exit_code, 0)
            ck = alice.request("POST", "/v1/sessions/%s/checkpoints" % sb.id,
                               body={"name": "before"})
            self.assertEqual(sb.commands.run("echo now > /root/now && sync").exit_code, 0)
            sb.save_image("then", checkpoint="before")
            sb.save_image("now")
        for name, want in (("then", "then\nno\n"), ("now", "then\nnow\n")):
            with Sandbox(image=name, client=alice) as sb:
                r = sb.commands.run("cat /root/then; cat /root/now 2>/dev/null || echo no")
                self.assertEqual(r.stdout, want, (name, ck))
        # Another key's creates do not find it, by either name, on any front: the answer of a
        # missing image, word for word.
        answers = []
        for name in ("setup", saved["store_name"], "no-such-image"):
            with self.assertRaises(APIError) as e:
                Sandbox(image=name, client=bob)
            self.assertEqual(e.exception.status, 400)
            answers.append(str(e.exception).replace(name, "NAME"))
            answers.append(self.mcp_start(bob_key, name).replace(name, "NAME"))
        self.assertEqual(len(set(answers[0::2])), 1, answers)
        self.assertEqual(len(set(answers[1::2])), 1, answers)
        self.assertIn("unknown image 'NAME'", answers[1])
        # Through MCP, a key's own saved image by its name boots.
        self.assertIn("session", self.mcp_start(alice_key, "setup"))

    def mcp_start(self, key, image):
        """start_session through airlockd's /mcp as key: the tool result's text."""
        h = {"Authorization": "Bearer " + key, "Content-Type": "application/json",
             "Accept": "application/json, text/event-stream"}

        def post(body, sid=None):
            c = http.client.HTTPConnection("127.0.0.1", self.d.port, timeout=300)
            c.request("POST", "/mcp", json.dumps(body), dict(h, **({"Mcp-Session-Id": sid}
                                                                     if sid else {})))
            r = c.getresponse()
            data, sid = r.read().decode(), r.getheader("Mcp-Session-Id")
            c.close()
            if data.startswith("{"):
                return json.loads(data), sid
            lines = [l[5:].strip() for l in data.splitlines() if l.startswith("data:")]
            return json.loads(lines[-1]), sid
        _, sid = post({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                       "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                  "clientInfo": {"name": "t", "version": "1"}}})
        ans, _ = post({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                       "params": {"name": "start_session", "arguments": {"image": image}}}, sid)
        text = ans["result"]["content"][0]["text"]
        if not ans["result"].get("isError"):
            sess = ans["result"]["structuredContent"]["session"]
            post({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                  "params": {"name": "stop_session", "arguments": {"session": sess}}}, sid)
            return "session " + sess
        return text


if __name__ == "__main__":
    altest.main()

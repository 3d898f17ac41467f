"""The SSH transport (orchestrator/transport/ssh.c) on real VMs of the `sshd` image: an image
without the agent, reached through sshd, configured by a cloud-init NoCloud seed. Through
tests/integration/checkpoint-driver (one session, JSON lines), whose session gets checkpoints.

The foundation's exec tests also run over SSH: integration-exec-ssh (test_exec.py with
AIRLOCK_IMAGE=sshd). Usage: test_ssh.py DRIVER [unittest args].
"""
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest

import altest
# Importing it takes the DRIVER argument off sys.argv, as its own main does.
from test_checkpoint import Driver

IMAGE = "sshd"


def sh_quote(s):
    return "'" + s.replace("'", "'\\''") + "'"


def have_image():
    return os.path.exists(os.path.join(altest.IMAGE_DIR, IMAGE, "manifest.json"))


class Listener:
    """A TCP server on the host's 127.0.0.1 that records whoever connects."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.5)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.stop = False
        self.t = threading.Thread(target=self.loop, daemon=True)
        self.t.start()

    def loop(self):
        while not self.stop:
            try:
                c, _ = self.sock.accept()
                self.accepted += 1
                c.close()
            except OSError:
                pass

    def close(self):
        self.stop = True
        self.t.join()
        self.sock.close()


class SshTransport(unittest.TestCase):
    def setUp(self):
        self.d = Driver(IMAGE)

    def tearDown(self):
        name = self.d.session
        self.assertEqual(self.d.close(), 0)
        # The VM and the session dir (keys, seed) are gone with the session.
        self.assertNotIn(name, altest.virsh_names())
        self.assertFalse(os.path.exists(os.path.join(altest.runtime_sessions_dir(), name)))

    def out(self, code, **kw):
        r = self.d.call("exec", code=code, lang=kw.get("lang", "sh"), timeout=60000,
                        kernel=kw.get("kernel", False))
        if r["r"] != 0 or r.get("timed_out"):
            raise AssertionError("exec failed: %s: %s %s" % (code, r.get("error"), r))
        return r["stdout"]

    def console(self):
        path = os.path.join(altest.runtime_sessions_dir(), self.d.session, "console.log")
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")

    def test_agent_copied_in_and_runs_as_root(self):
        # The image has no agent: this session's came over SFTP, into the login user's cache.
        self.assertEqual(self.out("test -e /usr/lib/airlock/airlock-agent || echo absent"),
                         "absent\n")
        copied = self.out("ls /home/airlock/.cache/airlock/*/airlock-agent")
        self.assertRegex(copied, r"^/home/airlock/\.cache/airlock/[0-9a-f]{16}/airlock-agent\n$")
        self.assertEqual(self.out("id -u"), "0\n")
        # The seed's user key is the only way in: no password logins.
        self.assertIn("passwordauthentication no", self.out("sshd -T 2>/dev/null | tr A-Z a-z"))

    def test_kernel_state_survives_a_dropped_connection(self):
        self.out("x = 41", lang="python", kernel=True)
        # Ends the sshd process serving our connection (not the listener): the run's request
        # is lost with it, and the host says so.
        r = self.d.call("exec", code="pkill -f '^sshd: airlock'; sleep 5", lang="sh",
                        timeout=60000)
        self.assertLess(r["r"], 0, r)
        self.assertIn("SSH connection", r.get("error", ""))
        # The next request reconnects; the agent daemon and its python kernel lived on.
        self.assertEqual(self.out("print(x + 1)", lang="python", kernel=True), "42\n")

    def test_sshd_killed_mid_run_then_rollback(self):
        self.out("y = 'before'", lang="python", kernel=True)
        cid = self.d.create("ok")
        r = self.d.call("exec", code="echo started; sleep 1; pkill -9 -x sshd; sleep 30",
                        lang="sh", timeout=60000)
        self.assertLess(r["r"], 0, r)
        self.assertIn("SSH connection", r.get("error", ""))
        # Reconnecting meets no sshd: a clear error, not a hang.
        t = time.monotonic()
        r = self.d.call("exec", code="true", lang="sh", timeout=60000)
        self.assertLess(r["r"], 0, r)
        self.assertIn("reconnecting failed", r.get("error", ""))
        self.assertIn("sshd", r.get("error", ""))
        self.assertLess(time.monotonic() - t, 120)
        # Rollback needs no channel: the checkpoint's sshd and agent come back.
        self.d.rollback(cid)
        self.assertEqual(self.out("print(y)", lang="python", kernel=True), "before\n")
        self.assertEqual(self.out("pgrep -c -x sshd >/dev/null && echo up"), "up\n")

    def test_wrong_host_key_refused_before_credentials(self):
        # Swap the guest's sshd for one with another host key, logging to the console at a level
        # that shows every authentication attempt; then drop our connection.
        script = (
            "sleep 2; ssh-keygen -q -t ed25519 -N '' -f /etc/ssh/other_key; "
            # HostKey adds to the keys of the image's config: a config naming only the other.
            "printf 'HostKey /etc/ssh/other_key\\nUsePAM yes\\nPasswordAuthentication no\\n"
            "Subsystem sftp /usr/lib/openssh/sftp-server\\n' > /etc/ssh/other_config; "
            "pkill -x sshd; sleep 1; "
            "/usr/sbin/sshd -f /etc/ssh/other_config -o LogLevel=DEBUG1 -E /dev/ttyS0; "
            "pkill -f '^sshd: airlock'")
        # Moved out of the run's cgroup, which the agent empties when the run ends.
        self.out("setsid sh -c %s </dev/null >/dev/null 2>&1 & "
                 "echo $! > /sys/fs/cgroup/cgroup.procs" % sh_quote(script))
        deadline = time.monotonic() + 120
        while True:
            r = self.d.call("exec", code="true", lang="sh", timeout=60000)
            if r["r"] < 0 and "host key" in r.get("error", ""):
                break
            self.assertLess(time.monotonic(), deadline, "the swap never happened: %s" % r)
            time.sleep(1)
        self.assertRegex(r["error"], r"SSH host key \(SHA256:[A-Za-z0-9+/]+\) is not the one")
        self.assertIn("refusing", r["error"])
        # The impostor saw connections but not a single authentication request.
        con = self.console()
        self.assertRegex(con, r"debug1: (Connection from|kex: algorithm)")
        self.assertNotIn("userauth-request", con)

    def test_guest_reaches_neither_host_loopback_nor_outside(self):
        srv = Listener()
        try:
            code = (
                "import socket\n"
                "for host, port in [('10.0.2.2', %d), ('1.1.1.1', 80), ('10.0.2.3', 53)]:\n"
                "    s = socket.socket(); s.settimeout(4)\n"
                "    try:\n"
                "        s.connect((host, port)); print(host, 'open')\n"
                "    except OSError as e:\n"
                "        print(host, 'blocked')\n"
                "    s.close()\n" % srv.port)
            out = self.out(code, lang="python", kernel=True)
            # The guest does have its NIC (the SSH forward comes in through it).
            self.assertIn("10.0.2.15", self.out("ip -4 addr show"))
        finally:
            srv.close()
        self.assertEqual(out, "10.0.2.2 blocked\n1.1.1.1 blocked\n10.0.2.3 blocked\n")
        self.assertEqual(srv.accepted, 0)


class SshCli(unittest.TestCase):
    def test_virtio_refused_for_an_image_without_agent(self):
        r = altest.run(["exec", "--image", IMAGE, "--transport", "virtio", "--", "true"])
        self.assertEqual(r.returncode, 125, r.stderr)
        self.assertIn(b"no agent of its own", r.stderr)
        self.assertEqual(len(altest.strip_notices(r.stderr).splitlines()), 1, r.stderr)

    def test_ssh_refused_for_an_image_without_sshd(self):
        r = altest.run(["exec", "--image", "tiny", "--transport", "ssh", "--", "true"])
        self.assertEqual(r.returncode, 125, r.stderr)
        self.assertIn(b"has no SSH server", r.stderr)

    def test_files_and_workdir_over_ssh(self):
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "in.bin")
            data = altest.random_file(src, 3 * 1024 * 1024 + 17)
            work = os.path.join(tmp, "work")
            os.mkdir(work)
            with open(os.path.join(work, "a.txt"), "w") as f:
                f.write("one\n")
            r = altest.run(["-q", "exec", "--image", IMAGE, "--put", src + ":/tmp/in.bin",
                            "--get", "/tmp/out.bin:" + os.path.join(tmp, "out.bin"),
                            "--workdir", work, "--sync-back", "yes", "--", "sh", "-c",
                            "cp /tmp/in.bin /tmp/out.bin; cat a.txt; echo two > b.txt"])
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout, b"one\n")
            with open(os.path.join(tmp, "out.bin"), "rb") as f:
                self.assertEqual(f.read(), data)
            with open(os.path.join(work, "b.txt")) as f:
                self.assertEqual(f.read(), "two\n")

    def test_forward_is_bound_to_loopback_only(self):
        # While a session runs, its QEMU listens on 127.0.0.1 only: nothing on other addresses.
        p = altest.popen(["exec", "--image", IMAGE, "--", "sh", "-c", "echo up; sleep 30"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        try:
            self.assertEqual(p.stdout.readline(), b"up\n")
            ss = subprocess.run(["ss", "-Hltnp"], stdout=subprocess.PIPE, text=True).stdout
            qemu = [l for l in ss.splitlines() if "qemu" in l]
            self.assertTrue(qemu, ss)
            for line in qemu:
                local = line.split()[3]
                self.assertTrue(local.startswith("127.0.0.1:"), line)
        finally:
            p.send_signal(signal.SIGINT)
            p.wait(timeout=120)


if __name__ == "__main__":
    # Registered only where the image can be built: a missing image is a failure, not a skip.
    if not have_image():
        sys.exit("test_ssh: the sshd image is not built (%s)" % altest.IMAGE_DIR)
    altest.main()

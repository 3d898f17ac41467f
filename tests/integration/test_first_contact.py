#!/usr/bin/env python3
"""What a new user meets first, with real guests through libvirt: a /dev/kvm that cannot run a
guest costs one probe and is remembered; the boot notice does not share the spinner's line; a
failed --get does not hide the command's own status.

A host whose KVM "lies" (QEMU starts, libvirt says running, the guest never executes) is made
reproducible on every machine by AIRLOCK_TEST_KVM_LIE: the first attempt's guest cannot run (its
kernel finds no init and halts), so the real fallback path runs here whatever the host's KVM."""
import os
import pty
import re
import select
import shutil
import socket
import tempfile
import time
import unittest

import altest


def kvm_opens():
    try:
        os.close(os.open("/dev/kvm", os.O_RDWR))
        return True
    except OSError:
        return False


class FirstContactTest(unittest.TestCase):
    def runtime_dir(self):
        """A fresh runtime dir: no verdict about KVM recorded yet, as on a new machine."""
        d = tempfile.mkdtemp(prefix="airlock-rt-")
        os.chmod(d, 0o755)  # QEMU's user binds the agent socket in the session dir below it
        self.addCleanup(shutil.rmtree, d, True)
        return d

    def env(self, rt, **kw):
        e = {"AIRLOCK_RUNTIME_DIR": rt, "AIRLOCK_ACCEL": ""}
        e.update(kw)
        return e

    def test_a_kvm_that_cannot_run_the_guest_falls_back_once_and_is_remembered(self):
        rt = self.runtime_dir()
        t0 = time.time()
        r = altest.run(["--debug", "exec", "--image", "tiny", "--", "echo", "ran"],
                       env=self.env(rt, AIRLOCK_TEST_KVM_LIE="1", AIRLOCK_KVM_PROBE_S="4"))
        first_s = time.time() - t0
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        self.assertEqual(r.stdout, b"ran\n")
        self.assertIn(b"KVM did not run the guest (the guest did not answer within 4 s", r.stderr)
        self.assertIn(b"software emulation", r.stderr)
        # The first attempt's domain is gone, the second's too.
        names = set(n.decode() for n in altest.session_names(r.stderr))
        self.assertEqual(len(names), 1, r.stderr)
        self.assertFalse(names & altest.virsh_names())
        with open(os.path.join(rt, "kvm-verdict")) as f:
            key, verdict, evidence = f.read().splitlines()[:3]
        self.assertIn("boot=", key)
        self.assertEqual(verdict, "broken")
        self.assertIn("did not answer within 4 s", evidence)
        self.assertEqual(os.stat(os.path.join(rt, "kvm-verdict")).st_mode & 0o022, 0)

        # The next session does not pay for the probe again.
        t0 = time.time()
        r = altest.run(["exec", "--image", "tiny", "--", "echo", "again"], env=self.env(rt))
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        self.assertEqual(r.stdout, b"again\n")
        self.assertNotIn(b"KVM did not run the guest", r.stderr)
        if kvm_opens():
            self.assertIn(b"KVM could not run a guest on this boot earlier", r.stderr)
        else:
            self.assertIn(b"/dev/kvm is not usable", r.stderr)
        self.assertLess(time.time() - t0, first_s, "the second session paid for a probe again")

        # doctor says which of the three cases this is, in one line with the evidence.
        r = altest.run(["doctor"], env=self.env(rt))
        if kvm_opens():
            self.assertRegex(r.stdout, rb"warn  /dev/kvm is present but cannot run a guest \(the "
                                       rb"guest did not answer within 4 s")
        else:
            self.assertIn(b"warn  no usable /dev/kvm", r.stdout)

    def test_a_verdict_file_planted_as_a_symlink_is_not_followed(self):
        rt = self.runtime_dir()
        target = os.path.join(rt, "victim")
        with open(target, "w") as f:
            f.write("precious\n")
        os.symlink(target, os.path.join(rt, "kvm-verdict"))
        r = altest.run(["exec", "--image", "tiny", "--", "true"],
                       env=self.env(rt, AIRLOCK_TEST_KVM_LIE="1", AIRLOCK_KVM_PROBE_S="3"))
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        with open(target) as f:
            self.assertEqual(f.read(), "precious\n")
        self.assertFalse(os.path.islink(os.path.join(rt, "kvm-verdict")))

    def test_a_boot_timeout_names_the_accelerator_and_what_to_try(self):
        rt = self.runtime_dir()
        r = altest.run(["exec", "--image", "tiny", "--boot-timeout", "3", "--", "true"],
                       env=self.env(rt, AIRLOCK_TEST_KVM_LIE="1", AIRLOCK_ACCEL="tcg"))
        self.assertEqual(r.returncode, 125)
        self.assertIn(b"did not answer within 3 s under software emulation", r.stderr)
        self.assertIn(b"--boot-timeout", r.stderr)
        self.assertEqual(len(r.stderr.strip().splitlines()), 2, r.stderr)  # notice + error

    def test_the_boot_notice_gets_a_line_of_its_own_beside_the_spinner(self):
        rt = self.runtime_dir()
        env = dict(os.environ)
        env.update(self.env(rt, AIRLOCK_TEST_KVM_LIE="1", AIRLOCK_KVM_PROBE_S="3"))
        env["AIRLOCK_IMAGE_DIR"] = altest.IMAGE_DIR
        env["TERM"] = "xterm"
        env["XDG_DATA_HOME"] = os.path.join(rt, "data")
        # No model is asked: the chat boots its VM before the first question (a server that
        # takes connections and says nothing passes the check made before booting).
        srv = socket.socket()
        self.addCleanup(srv.close)
        srv.bind(("127.0.0.1", 0))
        srv.listen(4)
        base = "http://127.0.0.1:%d/v1" % srv.getsockname()[1]
        pid, fd = pty.fork()
        if pid == 0:
            os.execve(altest.AIRLOCK, [altest.AIRLOCK, "chat", "--image", "tiny", "--api-base",
                                       base, "--model", "m"], env)
        out = b""
        try:
            end = time.time() + 180
            while b"> " not in out and time.time() < end:
                if select.select([fd], [], [], 1)[0]:
                    try:
                        out += os.read(fd, 4096)
                    except OSError:
                        break
            self.assertIn(b"Starting the sandbox VM", out)  # the spinner ran
            self.assertIn(b"airlock: notice: KVM did not run the guest", out)
            for m in re.finditer(rb"airlock: notice:", out):
                before = out[max(0, m.start() - 4):m.start()]
                self.assertTrue(before.endswith(b"\r\x1b[K") or before.endswith(b"\n"),
                                "notice shares a line: %r" % out[max(0, m.start() - 80):m.end()])
            os.write(fd, b"\x04")
        finally:
            altest.reap_pty(pid, fd)

    def test_a_failed_get_keeps_the_commands_status(self):
        d = tempfile.mkdtemp(prefix="airlock-get-")
        self.addCleanup(shutil.rmtree, d, True)
        # The command failed: its status stands, the good copy is still made.
        r = altest.run(["-q", "exec", "--image", "tiny", "--get", "/nonexistent:" + d,
                        "--get", "/tmp/made:" + d, "--", "sh", "-c", "echo data > /tmp/made; exit 3"])
        self.assertEqual(r.returncode, 3, r.stderr)
        self.assertIn(b"airlock: --get failed: ", r.stderr)
        with open(os.path.join(d, "made")) as f:
            self.assertEqual(f.read(), "data\n")
        # The command succeeded: a missing result is not success.
        r = altest.run(["-q", "exec", "--image", "tiny", "--get", "/nonexistent:" + d, "--",
                        "true"])
        self.assertEqual(r.returncode, 125, r.stderr)
        self.assertIn(b"airlock: --get failed: ", r.stderr)
        # A timed-out command keeps its 124.
        r = altest.run(["-q", "exec", "--image", "tiny", "--timeout", "2", "--get",
                        "/nonexistent:" + d, "--", "sleep", "60"])
        self.assertEqual(r.returncode, 124, r.stderr)


if __name__ == "__main__":
    altest.main()

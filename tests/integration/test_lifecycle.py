#!/usr/bin/env python3
"""Session lifecycle: files in and out, nothing left behind, crashed runs reaped, the agent
dying in the guest reported as an error."""
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

import altest


class LifecycleTest(unittest.TestCase):
    def test_file_round_trip(self):
        with tempfile.TemporaryDirectory() as d:
            src = os.path.join(d, "in.bin")
            data = altest.random_file(src, 3 * 1024 * 1024 + 123, 0o640)
            r = altest.run(["-q", "exec", "--put", src + ":/tmp/in.bin",
                            "--get", "/tmp/out.bin:" + d, "--", "sh", "-c",
                            "sha256sum /tmp/in.bin; cp /tmp/in.bin /tmp/out.bin; "
                            "stat -c %a /tmp/in.bin"])
            self.assertEqual(r.returncode, 0, r.stderr)
            want = hashlib.sha256(data).hexdigest()
            lines = r.stdout.decode().split("\n")
            self.assertEqual(lines[0].split()[0], want)  # hashed in the guest
            self.assertEqual(lines[1], "640")          # mode carried in
            with open(os.path.join(d, "out.bin"), "rb") as f:
                self.assertEqual(hashlib.sha256(f.read()).hexdigest(), want)
            self.assertEqual([n for n in os.listdir(d) if n.startswith(".airlock")], [])

    def test_get_missing_file_is_an_error(self):
        with tempfile.TemporaryDirectory() as d:
            r = altest.run(["-q", "exec", "--get", "/nope:" + d, "--", "true"])
            self.assertEqual(r.returncode, 125)
            self.assertIn(b"/nope", r.stderr)
            self.assertEqual(os.listdir(d), [])

    def test_ten_sessions_leave_nothing_behind(self):
        names = []
        for _ in range(10):
            r = altest.run(["--debug", "-q", "exec", "--", "true"])
            self.assertEqual(r.returncode, 0, r.stderr)
            names += [n.decode() for n in altest.session_names(r.stderr)]
        self.assertEqual(len(set(names)), 10)
        live = altest.virsh_names()
        sessions = altest.runtime_sessions_dir()
        for n in names:
            self.assertNotIn(n, live)
            self.assertFalse(os.path.exists(os.path.join(sessions, n)), n)
            self.assertFalse(os.path.exists(os.path.join(altest.state_sessions_dir(), n)), n)

    def test_killed_airlock_is_reaped(self):
        # SIGKILL leaves no chance to clean up: libvirt's autodestroy takes the VM, and the
        # next start (or airlock gc) removes the session directory.
        p = altest.popen_sh("echo up; sleep 1000", debug=True)
        self.assertEqual(p.stdout.readline(), b"up\n")
        p.kill()
        p.wait()
        name = altest.session_names(p.stderr.read())[0].decode()
        p.stdout.close()
        p.stderr.close()
        sessions = altest.runtime_sessions_dir()
        self.assertTrue(os.path.exists(os.path.join(sessions, name)))
        # Its disk-backed half (budget.c's state dir) is left behind too, locked no more.
        state = os.path.join(altest.state_sessions_dir(), name)
        self.assertTrue(os.path.exists(state))
        deadline = time.monotonic() + 30
        while name in altest.virsh_names() and time.monotonic() < deadline:
            time.sleep(0.2)
        self.assertNotIn(name, altest.virsh_names())
        r = altest.run(["gc"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertFalse(os.path.exists(os.path.join(sessions, name)))
        self.assertFalse(os.path.exists(state))

    def test_gc_spares_a_live_session_in_another_runtime_dir(self):
        # gc finds the owner's lock through the domain's metadata, not by looking in its own
        # runtime dir, so two runtime dirs on one libvirt do not reap each other.
        other = tempfile.mkdtemp(prefix="airlock-rt-")
        os.chmod(other, 0o755)  # QEMU runs as its own user and must reach the sockets
        self.addCleanup(shutil.rmtree, other, True)
        env = dict(os.environ, AIRLOCK_RUNTIME_DIR=other)
        p = altest.popen(["--debug", "-q", "exec", "--lang", "sh", "-c",
                          "echo up; read x; echo alive"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.PIPE)
        self.assertEqual(p.stdout.readline(), b"up\n")
        r = altest.run(["gc"])
        self.assertEqual(r.returncode, 0, r.stderr)
        p.stdin.write(b"go\n")
        p.stdin.close()
        out = p.stdout.read()
        self.assertEqual(out, b"alive\n", p.stderr.read())
        self.assertEqual(p.wait(timeout=60), 0, p.stderr.read())
        p.stdout.close()
        p.stderr.close()

    def test_gc_spares_another_machines_sessions(self):
        # A libvirt host two machines share: a domain whose metadata names another machine is
        # that machine's to judge, even though its session dir is missing here; one naming this
        # machine with a missing dir is reaped (so the first survives for the right reason).
        with open("/etc/machine-id") as f:
            here = f.read().strip()
        ns = "https://airlock.invalid/xmlns/session/1"

        def domain(name, machine):
            xml = ("<domain type='qemu'><name>%s</name><memory unit='MiB'>64</memory>"
                   "<metadata><airlock:session xmlns:airlock='%s' pid='1'>"
                   "<airlock:dir>/nonexistent/%s</airlock:dir>"
                   "<airlock:machine>%s</airlock:machine></airlock:session></metadata>"
                   "<os><type arch='x86_64' machine='q35'>hvm</type></os>"
                   "<devices></devices></domain>"
                   % (name, ns, name, machine))
            path = os.path.join(tempfile.mkdtemp(prefix="airlock-dom-"), "d.xml")
            self.addCleanup(shutil.rmtree, os.path.dirname(path), True)
            with open(path, "w") as f:
                f.write(xml)
            r = subprocess.run(["virsh", "-c", "qemu:///system", "create", path, "--paused"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.addCleanup(subprocess.run, ["virsh", "-c", "qemu:///system", "destroy", name],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            return name

        theirs = domain("airlock-0ther0machine", "f" * 32 if here != "f" * 32 else "e" * 32)
        ours = domain("airlock-0ur0machine0", here)
        r = altest.run(["gc"])
        self.assertEqual(r.returncode, 0, r.stderr)
        names = altest.virsh_names()
        self.assertIn(theirs, names)
        self.assertNotIn(ours, names)

    def test_sigterm_tears_down(self):
        p = altest.popen_sh("echo up; sleep 1000", debug=True)
        self.assertEqual(p.stdout.readline(), b"up\n")
        p.send_signal(signal.SIGTERM)
        self.assertEqual(p.wait(timeout=60), 128 + signal.SIGTERM)
        name = altest.session_names(p.stderr.read())[0].decode()
        p.stdout.close()
        p.stderr.close()
        self.assertNotIn(name, altest.virsh_names())
        self.assertFalse(os.path.exists(os.path.join(altest.runtime_sessions_dir(), name)))

    def test_agent_killed_in_guest_is_a_clear_error(self):
        r = altest.run(["-q", "exec", "--", "sh", "-c",
                        "kill -KILL $(cat /run/airlock-agent.pid)"], timeout=120)
        self.assertEqual(r.returncode, 125, r.stderr)
        self.assertIn(b"agent", r.stderr)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)


if __name__ == "__main__":
    altest.main()

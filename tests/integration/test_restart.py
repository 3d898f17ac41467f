"""Sessions that last (issue 35) through airlockd, on the debian image, with the Python client:
airlockd killed (-9) and started again, stopped cleanly and started again, a second airlockd on
the same state, pause and resume, names, a tampered saved state, a session whose VM went away
while no daemon held it. The session under test holds a python variable, a file in /workspace
and a background `python3 -m http.server`: after each restart or resume all three answer.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

import altest
from airlock import APIError, Client, Sandbox

AIRLOCKD = os.environ.get("AIRLOCKD_BIN", "airlockd")
IMAGE = "debian"
STATE = None


def setUpModule():
    global STATE
    STATE = tempfile.mkdtemp(prefix="airlock-restart-test-", dir="/var/tmp")
    os.chmod(STATE, 0o755)
    os.environ["AIRLOCK_STATE_DIR"] = STATE


def tearDownModule():
    shutil.rmtree(STATE, ignore_errors=True)


class Airlockd:
    """One daemon's config and store, started, killed and started again."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="airlockd-restart-")
        os.chmod(self.dir, 0o755)
        self.sock = os.path.join(self.dir, "airlockd.sock")
        self.conf = os.path.join(self.dir, "airlockd.conf")
        with open(self.conf, "w") as f:
            f.write("socket = %s\nsocket_mode = 0666\n" % self.sock)
            f.write("keys_db = %s\n" % os.path.join(self.dir, "store", "keys.db"))
            f.write("spool_dir = %s\n" % os.path.join(self.dir, "store", "spool"))
            f.write("heartbeat_s = 1\nkeep_grace_s = 120\n")
        self.p = None
        self.logs = 0

    def start(self, expect_ready=True):
        self.logs += 1
        log = open(os.path.join(self.dir, "log%d" % self.logs), "w+")
        e = dict(os.environ)
        e["AIRLOCK_IMAGE_DIR"] = altest.IMAGE_DIR
        p = subprocess.Popen([AIRLOCKD, "--config", self.conf], stdout=subprocess.DEVNULL,
                             stderr=log, env=e)
        deadline = time.time() + 120
        while time.time() < deadline:
            text = self.text()
            if "airlockd: ready" in text or p.poll() is not None:
                break
            time.sleep(0.05)
        if expect_ready:
            if "airlockd: ready" not in self.text():
                p.kill()
                raise RuntimeError("airlockd did not get ready: " + self.text())
            self.p = p
        return p

    def text(self):
        with open(os.path.join(self.dir, "log%d" % self.logs)) as f:
            return f.read()

    def client(self):
        return Client("unix:" + self.sock)

    def kill(self, sig=signal.SIGKILL):
        self.p.send_signal(sig)
        self.p.wait(timeout=120)
        self.p = None

    def close(self):
        if self.p:
            self.kill(signal.SIGTERM)
        shutil.rmtree(self.dir, ignore_errors=True)


def qemu_running(name):
    r = subprocess.run(["pgrep", "-f", "qemu-system.*guest=%s" % name], capture_output=True)
    return bool(r.stdout.strip())


def answers(sb):
    """The three things a session holds: its python variable, its file, its server."""
    x = sb.run_code("print(x + 1)")
    f = sb.files.read("/workspace/kept.txt")
    page = sb.request_port(8000, "/kept.txt")
    return x.stdout.strip(), f, page


@unittest.skipUnless(os.path.exists(os.path.join(altest.IMAGE_DIR, IMAGE, "manifest.json")),
                     "needs the debian image")
class RestartTest(unittest.TestCase):
    def setUp(self):
        self.d = Airlockd()
        self.addCleanup(self.d.close)
        self.d.start()

    def session(self, **kw):
        sb = Sandbox(image=IMAGE, client=self.d.client(), lifetime_s=900, **kw)
        self.addCleanup(lambda: self.cleanup(sb.id))
        return sb

    def cleanup(self, sid):
        if self.d.p:
            try:
                self.d.client().request("DELETE", "/v1/sessions/" + sid)
            except APIError:
                pass

    def prepare(self, sb):
        sb.run_code("x = 41")
        sb.files.write("/workspace/kept.txt", b"kept-content\n")
        run = sb.commands.run("cd /workspace && exec python3 -m http.server 8000",
                              background=True)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if sb.request_port(8000, "/kept.txt")[0] == 200:
                    break
            except Exception:
                pass
            time.sleep(0.5)
        return run

    def check(self, sb):
        x, f, page = answers(sb)
        self.assertEqual(x, "42")
        self.assertEqual(f, b"kept-content\n")
        self.assertEqual(page[0], 200)
        self.assertEqual(page[2], b"kept-content\n")

    def test_kill9_restart_pause_resume_and_clean_restart(self):
        sb = self.session(name="dev")
        self.assertTrue(sb.info["kept"])
        self.assertEqual(sb.info["name"], "dev")
        run = self.prepare(sb)
        self.check(sb)
        # Names are unique per owner, and find the session.
        with self.assertRaises(APIError) as e:
            Sandbox(image=IMAGE, client=self.d.client(), name="dev")
        self.assertEqual(e.exception.status, 409)
        self.assertEqual(Sandbox.connect("dev", client=self.d.client()).id, sb.id)

        # kill -9: nothing of the daemon's shutdown runs; the VM does not go with it.
        self.d.kill()
        self.assertIn(sb.id, altest.virsh_names())
        self.d.start()
        sb = Sandbox.connect(sb.id, client=self.d.client())
        self.assertFalse(sb.info["lost"], sb.info)
        self.check(sb)
        # The server's run was adopted: it is running, and what it logs after the restart
        # (the requests just made) reaches its events.
        runs = {r["id"]: r for r in sb.runs()}
        self.assertEqual(runs[run.id]["state"], "running", runs)
        got = b""
        for ev in sb.commands.connect(run.id).events(timeout=10):
            if ev.type == "output":
                got += ev.bytes
            if b"GET /kept.txt" in got:
                break
        self.assertIn(b"GET /kept.txt", got)

        # A second daemon on the same state refuses, naming the first.
        p = self.d.start(expect_ready=False)
        p.wait(timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("pid %d" % self.d.p.pid, self.d.text())

        # Pause: QEMU gone, the state on disk; requests other than resume are refused.
        sb.pause()
        self.assertTrue(sb.info["paused"])
        self.assertFalse(qemu_running(sb.id))
        self.assertNotIn(sb.id, altest.virsh_names())
        with self.assertRaises(APIError) as e:
            sb.run_code("1")
        self.assertEqual(e.exception.status, 409)
        sb.resume()
        self.assertFalse(sb.info["paused"])
        self.check(sb)

        # Paused, then a clean stop and a start: still paused, and resumes.
        sb.pause()
        self.d.kill(signal.SIGTERM)
        self.d.start()
        sb = Sandbox.connect("dev", client=self.d.client())
        self.assertTrue(sb.info["paused"])
        sb.resume()
        self.check(sb)

    def test_tampered_save_and_vm_gone_are_lost(self):
        a = self.session()
        b = self.session()
        a.pause()
        saved = os.path.join(STATE, "sessions", a.id, "paused.save")
        os.chmod(saved, 0o644)  # made world-readable behind our back
        with self.assertRaises(APIError) as e:
            a.resume()
        self.assertEqual(e.exception.status, 502)
        self.assertNotIn(a.id, altest.virsh_names())  # never loaded
        self.assertTrue(a.refresh()["lost"])

        # b's VM goes while no daemon holds it: the restart reports it lost, with the reason.
        self.d.kill()
        subprocess.run(["virsh", "-c", "qemu:///system", "destroy", b.id], check=True,
                       capture_output=True)
        self.d.start()
        info = self.d.client().request("GET", "/v1/sessions/" + b.id)
        self.assertTrue(info["lost"])
        self.assertIn("gone", info["lost_why"])
        for sid in (a.id, b.id):
            self.d.client().request("DELETE", "/v1/sessions/" + sid)
            self.assertFalse(os.path.exists(os.path.join(STATE, "sessions", sid)))
            self.assertFalse(os.path.exists(os.path.join(altest.runtime_sessions_dir(), sid)))
            self.assertNotIn(sid, altest.virsh_names())

    def test_another_store_names_the_kept_sessions_and_gc_ends_them(self):
        """A daemon started on another store leaves the first store's kept VM alone and says
        so at its start, whose and how to end it; airlock gc --kept ends it on purpose."""
        a = self.session()
        self.d.kill(signal.SIGTERM)  # keep_sessions: the VM goes on
        self.assertIn(a.id, altest.virsh_names())
        # A note left by a daemon whose store is gone (a test's temporary dir): swept at the
        # next daemon's start; the first daemon's, whose store is here, stays.
        notes = os.path.join(STATE, "keepers")
        first = set(os.listdir(notes))
        self.assertEqual(len(first), 1, first)
        with open(os.path.join(notes, "airlockd-00112233445566ff"), "w") as f:
            f.write(os.path.join(self.d.dir, "gone", "keys.db"))
        other = Airlockd()
        self.addCleanup(other.close)
        other.start()
        text = other.text()
        left = set(os.listdir(notes))
        self.assertNotIn("airlockd-00112233445566ff", left)
        self.assertTrue(first < left and len(left) == 2, (first, left))
        self.assertIn("1 session kept by another airlockd (its keys_db %s)"
                      % os.path.realpath(os.path.join(self.d.dir, "store", "keys.db")), text)
        keeper = re.search(r"'airlock gc --kept (airlockd-[0-9a-f]+)'", text)
        self.assertTrue(keeper, text)
        self.assertIn(a.id, altest.virsh_names())  # left alone
        r = altest.run(["gc", "--kept", keeper.group(1)])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(b"ended 1 kept session", r.stdout)
        self.assertNotIn(a.id, altest.virsh_names())
        self.assertFalse(os.path.exists(os.path.join(STATE, "sessions", a.id)))
        other.kill(signal.SIGTERM)
        self.d.start()  # its record finds the VM gone: lost, deletable
        info = self.d.client().request("GET", "/v1/sessions/" + a.id)
        self.assertTrue(info["lost"])


if __name__ == "__main__":
    altest.main()

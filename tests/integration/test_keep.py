"""Kept sessions (orchestrator/session/keep.c) on the debian image, through real libvirt and the
real agent, driven by tests/integration/keep-driver.c (the library's API, one call per process):

- the process holding a kept session dies (_exit, nothing closed): its VM runs on, gc leaves it
  alone, a new process takes it back with the python kernel's variable, the file, and the
  background run whose output written meanwhile arrives whole (no tick missing);
- pause: the QEMU process is gone, the saved state is a private file; resume brings the same
  kernel, file and run back;
- a saved state truncated, replaced or made world-readable is refused with the reason, never
  loaded, and discard leaves nothing behind.

The tests keep their sessions in a state dir of their own (AIRLOCK_STATE_DIR).
"""
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import unittest

import altest

DRIVER = os.environ.get("AIRLOCK_KEEP_DRIVER", "")
IMAGE = "debian"
STATE = None


def setUpModule():
    global STATE
    STATE = tempfile.mkdtemp(prefix="airlock-keep-test-", dir="/var/tmp")
    os.chmod(STATE, 0o755)  # QEMU's user reaches the session disks through it
    os.environ["AIRLOCK_STATE_DIR"] = STATE
    os.environ["AIRLOCK_IMAGE_DIR"] = altest.IMAGE_DIR


def tearDownModule():
    for k in drive("list").get("kept", []):
        drive("discard", k["name"])
    shutil.rmtree(STATE, ignore_errors=True)


def drive(*args, timeout=300):
    r = subprocess.run([DRIVER] + list(args), capture_output=True, timeout=timeout)
    out = r.stdout.decode(errors="replace").strip().splitlines()
    if not out:
        raise AssertionError("keep-driver %s printed nothing: %s" %
                             (args, r.stderr.decode(errors="replace")))
    return json.loads(out[-1])


def ticks(text):
    return [int(t) for t in re.findall(r"tick(\d+)", text)]


def qemu_pids(name):
    r = subprocess.run(["pgrep", "-f", "qemu-system.*guest=%s" % name], capture_output=True)
    return r.stdout.split()


def state_dir(name):
    return os.path.join(STATE, "sessions", name)


@unittest.skipUnless(DRIVER and os.path.exists(os.path.join(altest.IMAGE_DIR, IMAGE,
                                                             "manifest.json")),
                     "needs the debian image and keep-driver")
class KeepTest(unittest.TestCase):
    def open(self):
        o = drive("open", IMAGE)
        self.assertNotIn("error", o, o)
        self.addCleanup(lambda: drive("discard", o["name"]))
        return o["name"], str(o["run"])

    def test_a_crash_reattach_pause_resume(self):
        name, run = self.open()
        # The holder is gone without closing anything: the VM runs on, and gc leaves it.
        self.assertIn(name, altest.virsh_names())
        altest.run(["gc"])
        self.assertIn(name, altest.virsh_names())
        kept = {k["name"]: k for k in drive("list")["kept"]}
        self.assertIn(name, kept)
        self.assertFalse(kept[name]["paused"])
        time.sleep(3)  # the background run goes on writing while nobody reads

        a = drive("attach", name, run)
        self.assertNotIn("error", a, a)
        self.assertEqual(a["adopted"], [int(run)])
        self.assertEqual(a["x"].strip(), "42")
        self.assertEqual(a["file"].strip(), "kept-content")
        t1 = ticks(a["ticks"])
        # What it wrote while no process held the session comes first, none missing: the run
        # printed ticks 0..4 to the first holder, and at least 15 more since (3 s at 5/s).
        self.assertTrue(t1 and t1[0] <= 5, t1)
        self.assertEqual(t1, list(range(t1[0], t1[0] + len(t1))), t1)
        self.assertGreater(len(t1), 15, t1)

        p = drive("pause", name)
        self.assertEqual(p, {"paused": True})
        self.assertNotIn(name, altest.virsh_names())
        self.assertEqual(qemu_pids(name), [])
        saved = os.path.join(state_dir(name), "paused.save")
        self.assertEqual(os.stat(saved).st_mode & 0o777, 0o600)
        self.assertTrue(drive("list")["kept"])
        self.assertTrue({k["name"]: k for k in drive("list")["kept"]}[name]["paused"])

        r = drive("resume", name, run)
        self.assertNotIn("error", r, r)
        self.assertEqual(r["x"].strip(), "42")
        self.assertEqual(r["file"].strip(), "kept-content")
        t2 = ticks(r["ticks"])
        # The same run, from where the last holder stopped reading: no gap, no repeat.
        self.assertTrue(t2, r)
        self.assertEqual(t2[0], t1[-1] + 1, (t1, t2))
        self.assertFalse(os.path.exists(saved))

    def tamper(self, how):
        name, run = self.open()
        self.assertEqual(drive("pause", name), {"paused": True})
        saved = os.path.join(state_dir(name), "paused.save")
        if how == "truncated":
            os.truncate(saved, os.path.getsize(saved) // 2)
        elif how == "replaced":
            with open(saved, "r+b") as f:
                f.seek(os.path.getsize(saved) // 2)
                f.write(b"\0" * 4096 + b"X")
        elif how == "world-readable":
            os.chmod(saved, 0o644)
        r = drive("resume", name, run)
        self.assertIn("error", r)
        self.assertNotIn(name, altest.virsh_names())  # never loaded
        return name, r["error"]

    def test_b_truncated_save_refused(self):
        _, why = self.tamper("truncated")
        self.assertIn("bytes", why)

    def test_c_replaced_save_refused(self):
        _, why = self.tamper("replaced")
        self.assertIn("SHA-256", why)

    def test_d_world_readable_save_refused_and_discard_leaves_nothing(self):
        name, why = self.tamper("world-readable")
        self.assertIn("private", why)
        self.assertEqual(drive("discard", name), {"discarded": True})
        self.assertFalse(os.path.exists(state_dir(name)))
        self.assertFalse(os.path.exists(os.path.join(altest.runtime_sessions_dir(), name)))
        self.assertNotIn(name, [k["name"] for k in drive("list")["kept"]])


if __name__ == "__main__":
    altest.main()

"""Volumes (issue 55): named disks of a key that outlive sessions, mounted in the guest where
asked, read-write in one session at a time or read-only in many; through airlockd's REST API
and the Python client, real guests of the debian image.

What each test would catch: data that does not outlive its session or a daemon killed with -9,
a second writer let in (torn file systems), a reader let in beside a writer, another key's
volume attached, a volume removed under a session, a path that escapes."""
import os
import shutil
import signal
import subprocess
import tempfile
import unittest

import altest
from airlock import APIError, Sandbox
from test_airlockd import Daemon

AIRLOCK = os.environ.get("AIRLOCK_BIN", "airlock")


def have(image):
    return os.path.exists(os.path.join(altest.IMAGE_DIR, image, "manifest.json"))


def volumes_dir():
    return os.path.join(os.path.dirname(altest.state_sessions_dir()), "volumes")


@unittest.skipUnless(have("debian"), "the debian image is not built")
class VolumeTest(unittest.TestCase):
    def test_volumes(self):
        store = tempfile.mkdtemp(prefix="airlock-vol-test-")
        keys_db = os.path.join(store, "keys.db")
        d = Daemon(keys_db=keys_db)
        try:
            key = d.key("vol", "--max-volume-bytes", str(96 << 20))
            other = d.key("other")
            c, co = d.tcp(key), d.tcp(other)
            v = c.create_volume("data", 64 << 20)
            self.assertEqual((v["name"], v["size_bytes"]), ("data", 64 << 20))
            with self.assertRaises(APIError) as e:
                c.create_volume("data", 1 << 20)
            self.assertEqual(e.exception.status, 409)
            with self.assertRaises(APIError) as e:  # 64 + 64 MiB > 96 MiB
                c.create_volume("big", 64 << 20)
            self.assertEqual((e.exception.status, e.exception.limit), (429, "max_volume_bytes"))
            self.assertEqual(co.volumes(), [])
            # Another key's volume is no volume at all.
            with self.assertRaises(APIError) as e:
                Sandbox(image="debian", client=co, volumes={"/data": "data"})
            self.assertEqual(e.exception.status, 404)
            self.assertIn("no volume", e.exception.message)
            with self.assertRaises(APIError) as e:
                Sandbox(image="debian", client=c, volumes={"/": "data"})
            self.assertEqual(e.exception.status, 400)
            # Written by one session: made, mounted where asked, the data kept.
            w = Sandbox(image="debian", client=c, volumes={"/data": "data"})
            try:
                r = w.commands.run("findmnt -n -o FSTYPE /data && echo first > /data/f && sync")
                self.assertEqual(r.stdout, "ext4\n", r.stderr)
                self.assertEqual([x["in_use"] for x in c.volumes()], [True])
                # One writer at a time, and no reader beside it.
                for ro in (False, True):
                    with self.assertRaises(APIError) as e:
                        Sandbox(image="debian", client=c,
                                volumes=[{"name": "data", "path": "/data", "read_only": ro}])
                    self.assertEqual((e.exception.status, e.exception.code), (409, "busy"))
                    self.assertIn("attached", e.exception.message)
                with self.assertRaises(APIError) as e:
                    c.delete_volume("data")
                self.assertEqual(e.exception.status, 409)
                # The guest cannot write past its size on the host.
                w.commands.run("dd if=/dev/zero of=/data/fill bs=1M count=100 2>/dev/null; sync")
                st = os.stat(os.path.join(volumes_dir(), "key-%s_data.img" % key.split("_")[1]))
                self.assertEqual(st.st_size, 64 << 20)
                self.assertLessEqual(st.st_blocks * 512, 64 << 20)
                # No sync: a session's end writes out what its guest wrote.
                w.commands.run("rm -f /data/fill; echo second > /data/f")
            finally:
                w.kill()
            # Read-only in two at once; each reads what the writer left, neither can write.
            ro = [{"name": "data", "path": "/mnt/v", "read_only": True}]
            a = Sandbox(image="debian", client=c, volumes=ro)
            b = Sandbox(image="debian", client=c, volumes=ro)
            try:
                for x in (a, b):
                    self.assertEqual(x.commands.run("cat /mnt/v/f").stdout, "second\n")
                    r = x.commands.run("echo no > /mnt/v/g")
                    self.assertNotEqual(r.exit_code, 0)
                with self.assertRaises(APIError):  # no writer while readers hold it
                    Sandbox(image="debian", client=c, volumes={"/data": "data"})
            finally:
                a.kill()
                b.kill()
            # A daemon killed with -9 under a writer: the data synced before is there after.
            w = Sandbox(image="debian", client=c, volumes={"/data": "data"})
            w.commands.run("echo after-kill > /data/f && sync")
            d.stop(sig=signal.SIGKILL)
            d = Daemon(keys_db=keys_db)
            c = d.tcp(key)
            n = Sandbox(image="debian", client=c, volumes={"/data": "data"})
            try:
                self.assertEqual(n.commands.run("cat /data/f").stdout, "after-kill\n")
                # A fork of the writer writes to its own copy of the volume as it was; so does
                # a session from a snapshot of it, after the writer is gone.
                fk = n.fork(1)[0]
                self.assertIsInstance(fk, Sandbox, fk)
                self.assertEqual(fk.commands.run("cat /data/f").stdout, "after-kill\n")
                fk.commands.run("echo fork > /data/f && sync")
                self.assertEqual(n.commands.run("cat /data/f").stdout, "after-kill\n")
                self.assertEqual(fk.commands.run("cat /data/f").stdout, "fork\n")
                fk.kill()
                n.create_snapshot("with-volume")
            finally:
                n.kill()
            sn = Sandbox(snapshot="with-volume", client=c)
            try:
                self.assertEqual(sn.commands.run("cat /data/f").stdout, "after-kill\n")
                sn.commands.run("echo snap > /data/f && sync")
                # the volume itself is free for a writer meanwhile, and untouched
                n = Sandbox(image="debian", client=c, volumes={"/data": "data"})
                self.assertEqual(n.commands.run("cat /data/f").stdout, "after-kill\n")
                n.kill()
            finally:
                sn.kill()
            self.assertTrue(c.delete_snapshot("with-volume"))
            # A fork of a reader reads the volume as the reader did, and holds it read-only.
            r1 = Sandbox(image="debian", client=c,
                         volumes=[{"name": "data", "path": "/ro", "read_only": True}])
            try:
                fr = r1.fork(1)[0]
                self.assertIsInstance(fr, Sandbox, fr)
                self.assertEqual(fr.commands.run("cat /ro/f").stdout, "after-kill\n")
                r1.kill()
                with self.assertRaises(APIError) as e:  # the fork still reads it
                    Sandbox(image="debian", client=c, volumes={"/data": "data"})
                self.assertEqual(e.exception.status, 409)
                fr.kill()
            finally:
                r1.kill()
            self.assertTrue(c.delete_volume("data"))
            self.assertFalse(c.delete_volume("data"))
            self.assertEqual(c.volumes(), [])
            # The CLI: create, ls, a session with it, rm refused while attached, then done.
            env = dict(os.environ, AIRLOCK_API_KEY=key)

            def cli(*args):
                return subprocess.run([AIRLOCK, "--server", "http://127.0.0.1:%d" % d.port]
                                      + list(args), env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, timeout=300)
            p = cli("volume", "create", "cli-vol", "--size", "8M")
            self.assertEqual(p.returncode, 0, p.stderr)
            p = cli("volume", "ls")
            self.assertRegex(p.stdout, r"(?m)^cli-vol\s+8\.0 MiB\s+\S+ \S+\s+-$")
            p = cli("session", "start", "--image", "debian", "--volume", "cli-vol:/cv")
            self.assertEqual(p.returncode, 0, p.stderr)
            sid = p.stdout.strip()
            r = Sandbox.connect(sid, client=c).commands.run("findmnt -n -o TARGET /cv")
            self.assertEqual(r.stdout, "/cv\n")
            self.assertIn("read-write", cli("volume", "ls").stdout)
            p = cli("volume", "rm", "cli-vol")
            self.assertEqual(p.returncode, 1)
            self.assertEqual(len(p.stderr.strip().splitlines()), 1, p.stderr)
            self.assertEqual(cli("session", "stop", sid).returncode, 0)
            self.assertEqual(cli("volume", "rm", "cli-vol").returncode, 0)
            self.assertEqual(c.volumes(), [])
        finally:
            d.stop_and_remove()
            shutil.rmtree(store, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()

"""Many hosts (issue 20): one airlockd placing sessions on two libvirt hosts, the machine's own
libvirtd and a second, independent one (remotehost.py) reached over qemu+tcp://, on which
everything goes through the libvirt connection: the agent's channel as a virStream, the image as
uploaded volumes, each session's disk as a volume, checkpoints through the monitor.

Also the libvirt-stream channel on the local host (AIRLOCK_CHANNEL=stream), byte for byte.
Environment: AIRLOCKD_BIN, AIRLOCK_BIN and the usual integration variables.
"""
import glob
import hashlib
import json
import os
import shutil
import subprocess
import threading
import time
import unittest

import altest
from airlock import APIError, Sandbox
from remotehost import RemoteHost
from test_airlockd import AIRLOCKD, Daemon, domain_gone, metric, parse_prometheus


def wait_for(what, fn, timeout=60):
    end = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.25)


class StreamChannelTest(unittest.TestCase):
    """The agent reached through virDomainOpenChannel instead of the socket's path."""

    def test_bytes_both_ways(self):
        env = dict(os.environ, AIRLOCK_CHANNEL="stream")
        data = os.urandom(3 << 20)
        # stdin in, the same bytes out, and a hash computed in the guest.
        r = subprocess.run([altest.AIRLOCK, "exec", "--image", "tiny", "--", "sh", "-c",
                            "tee /tmp/in | sha256sum >&2; cat /tmp/in"],
                           input=data, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           env=env, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        self.assertEqual(r.stdout, data)
        self.assertIn(hashlib.sha256(data).hexdigest().encode(), r.stderr)
        bad = subprocess.run([altest.AIRLOCK, "exec", "--image", "tiny", "--", "true"],
                             env=dict(os.environ, AIRLOCK_CHANNEL="carrier-pigeon"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn(b"AIRLOCK_CHANNEL", bad.stderr)


class StreamFloodTest(unittest.TestCase):
    """A guest that floods its channel while the host does not read (here: airlock's stdout is a
    pipe nobody reads). Over the unix socket the kernel's buffer stops it; over the libvirt
    stream, libvirt's client would queue whatever arrives (4 GiB in 20 s when unbounded), so the
    transport's own bound (64 MiB) must hold, and then the stream is aborted."""

    def rss_mib(self, pid):
        try:
            with open("/proc/%d/status" % pid) as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) // 1024
        except OSError:
            pass
        return 0

    def test_flood_is_bounded(self):
        evil = os.environ.get("AIRLOCK_EVIL_BIN", "")
        self.assertTrue(os.access(evil, os.X_OK), "AIRLOCK_EVIL_BIN not built: %r" % evil)
        env = dict(os.environ, AIRLOCK_CHANNEL="stream")
        # Under ASan, freed memory would sit in its quarantine and read as growth.
        env["ASAN_OPTIONS"] = ":".join(x for x in [env.get("ASAN_OPTIONS", ""),
                                                  "quarantine_size_mb=0"] if x)
        p = subprocess.Popen([altest.AIRLOCK, "--debug", "exec", "--image", "tiny", "--put",
                              evil + ":/tmp/evil", "--", "/tmp/evil", "flood", "2",
                              str(8 << 30)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=env)
        try:
            base, peak = 0, 0
            for _ in range(40):
                time.sleep(0.5)
                r = self.rss_mib(p.pid)
                base = base or r
                peak = max(peak, r)
            self.assertGreater(base, 0)
            self.assertLess(peak - base, 160, "airlock grew from %d to %d MiB" % (base, peak))
        finally:
            p.kill()
            _, err = p.communicate(timeout=60)
        for name in altest.session_names(err):
            wait_for("the flooding session's domain gone", lambda: domain_gone(name.decode()))

    def test_flood_read_by_airlockd_is_bounded(self):
        """The same flood while airlockd keeps reading it (a client streams the run's output):
        the pump must drain libvirt's client faster than the link takes it, or the client's
        queue grows behind it (1 GiB for 1 GiB read, before the queue stopped moving its
        contents on every read)."""
        evil = os.environ.get("AIRLOCK_EVIL_BIN", "")
        self.assertTrue(os.access(evil, os.X_OK), "AIRLOCK_EVIL_BIN not built: %r" % evil)
        d = Daemon(env={"AIRLOCK_CHANNEL": "stream"})
        try:
            with Sandbox(image="tiny", client=d.unix()) as sb:
                with open(evil, "rb") as f:
                    sb.files.write("/tmp/evil", f.read())
                sb.commands.run("chmod +x /tmp/evil")
                base = self.rss_mib(d.p.pid)
                peak = [base]
                done = []

                def sample():
                    while not done:
                        peak[0] = max(peak[0], self.rss_mib(d.p.pid))
                        time.sleep(0.25)
                t = threading.Thread(target=sample)
                t.start()
                try:
                    sb.commands.run("/tmp/evil flood 3 8589934592", timeout=8,
                                    on_stdout=lambda b: None)
                except APIError:
                    pass
                finally:
                    done.append(1)
                    t.join()
                self.assertLess(peak[0] - base, 200,
                                "airlockd grew from %d to %d MiB" % (base, peak[0]))
            self.assertTrue(domain_gone(sb.id))
        finally:
            d.stop()
            shutil.rmtree(d.dir, ignore_errors=True)


class HostsTest(unittest.TestCase):
    """One daemon, hosts 'far' (the second libvirtd, 2 sessions at most) and 'near' (this
    machine's, 1 at most), in that order: placement fills the least loaded first."""

    @classmethod
    def setUpClass(cls):
        cls.far = RemoteHost().start()
        try:
            cls.d = Daemon(lines=["host = far %s max_sessions=2" % cls.far.uri,
                                  "host = near qemu:///system max_sessions=1"],
                           host_check_s=1)
        except Exception:
            cls.far.stop()
            raise
        cls.c = cls.d.unix()

    @classmethod
    def tearDownClass(cls):
        try:
            for s in cls.c.sessions():
                cls.c.request("DELETE", "/v1/sessions/" + s["id"])
        finally:
            rc = cls.d.stop()
            cls.far.stop()
        log = cls.d.text()
        shutil.rmtree(cls.d.dir, ignore_errors=True)
        assert rc == 0, log[-3000:]

    def hosts(self):
        return {h["name"]: h for h in self.c.request("GET", "/v1/hosts")["hosts"]}

    def far_volumes(self):
        r = self.far.virsh("vol-list", "airlock")
        return sorted(l.split()[0] for l in r.stdout.decode().splitlines() if l.strip())

    def test_placement_work_loss_and_rejoin(self):
        h = self.hosts()
        self.assertEqual((h["far"]["state"], h["near"]["state"]), ("up", "up"))
        # The host list is the operator's: over TCP, with a key, it is refused.
        key = self.d.key("hosts-test")
        with self.assertRaises(APIError) as e:
            self.d.tcp(key).request("GET", "/v1/hosts")
        self.assertEqual(e.exception.status, 403)

        # Placement: far (0 of 2), near (0 of 1, now the least loaded), far again, then full.
        a = Sandbox(image="debian", client=self.c, checkpoints=True)
        b = Sandbox(image="debian", client=self.c)
        self.assertEqual({n: x["sessions"] for n, x in self.hosts().items()},
                         {"far": 1, "near": 1})
        disk = wait_for("the image on far", lambda: glob.glob(
            os.path.join(self.far.dir, "lib", "airlock", "image-debian-*.disk")))
        self.assertEqual(len(disk), 1, disk)
        uploaded = os.stat(disk[0]).st_mtime_ns
        c = Sandbox(image="debian", client=self.c)
        self.assertEqual({n: x["sessions"] for n, x in self.hosts().items()},
                         {"far": 2, "near": 1})
        with self.assertRaises(APIError) as e:
            Sandbox(image="debian", client=self.c)
        self.assertEqual((e.exception.status, e.exception.code), (503, "no_host"))
        # Uploaded once, reused by the second session there.
        self.assertEqual(os.stat(disk[0]).st_mtime_ns, uploaded)
        self.assertEqual(len([v for v in self.far_volumes() if v.endswith(".ready")]), 1)
        self.assertEqual(sorted(self.far.domains()), sorted([a.id, c.id]))
        # The CLI tells which hosts have which version.
        ls = subprocess.run([altest.AIRLOCK, "image", "ls", "--hosts", self.far.uri],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        self.assertEqual(ls.returncode, 0, ls.stderr)
        rows = [l.split() for l in ls.stdout.decode().splitlines() if l.startswith(self.far.uri)]
        self.assertEqual([(r[1], r[-1]) for r in rows], [("debian", "current")], rows)
        # Clients see no host address.
        listed = json.dumps(self.c.sessions())
        self.assertNotIn("127.0.0.2", listed)
        self.assertNotIn("qemu+tcp", listed)

        # On far, everything works as locally: exec, kernels, files, checkpoints, rollback.
        r = a.commands.run("echo out; echo err >&2; exit 3")
        self.assertEqual((r.stdout, r.stderr, r.exit_code), ("out\n", "err\n", 3))
        x = a.run_code("import json; v = 6 * 7", language="python")
        y = a.run_code("print(json.dumps(v))", language="python")
        self.assertEqual((x.exit_code, y.stdout), (0, "42\n"))
        blob = os.urandom(1 << 20)
        a.files.write("/workspace/blob", blob)
        self.assertEqual(a.files.read("/workspace/blob"), blob)
        cp = a.checkpoint("before")
        a.files.write("/workspace/later.txt", b"later")
        a.commands.run("rm /workspace/blob")
        a.rollback(cp)
        self.assertTrue(a.files.exists("/workspace/blob"))
        self.assertFalse(a.files.exists("/workspace/later.txt"))
        self.assertEqual(a.files.read("/workspace/blob"), blob)
        # Each session its own disk there: c does not see a's file.
        self.assertFalse(c.files.exists("/workspace/blob"))

        # far goes down: marked down, its sessions lost with a clear error, new ones avoid it.
        self.far.kill()
        h = wait_for("far down", lambda: (lambda h: h if h["far"]["state"] == "down" else None)(
            self.hosts()), timeout=30)
        self.assertTrue(h["far"]["last_error"])
        self.assertEqual(h["far"]["lost"], 2)
        conn, resp = self.c.open("GET", "/metrics")
        samples = parse_prometheus(resp.read().decode())
        conn.close()
        self.assertEqual(metric(samples, "airlockd_host_up", host="far"), 0.0)
        self.assertEqual(metric(samples, "airlockd_host_up", host="near"), 1.0)
        self.assertEqual(metric(samples, "airlockd_host_lost_sessions_total", host="far"), 2.0)
        with self.assertRaises(APIError) as e:
            a.commands.run("true")
        self.assertEqual((e.exception.status, e.exception.code), (502, "host_lost"))
        self.assertIn("stopped answering", e.exception.message)
        self.assertTrue(self.c.request("GET", "/v1/sessions/" + c.id)["lost"])
        b.kill()  # near's only slot, free again
        e2 = Sandbox(image="tiny", client=self.c)
        self.assertEqual(e2.commands.run("echo near").stdout, "near\n")
        self.assertEqual(self.hosts()["near"]["sessions"], 1)
        self.assertTrue(domain_gone(b.id))

        # far answers again: it rejoins; the lost sessions, once deleted, leave nothing there.
        self.far.restart()
        wait_for("far up", lambda: self.hosts()["far"]["state"] == "up", timeout=30)
        a.kill()
        c.kill()
        wait_for("far's domains gone", lambda: self.far.domains() == [], timeout=60)
        self.assertEqual([v for v in self.far_volumes() if not v.startswith("image-")], [])
        # near is full (e2): the next session goes to far again, and works.
        f = Sandbox(image="tiny", client=self.c, checkpoints=True)
        self.assertEqual(self.hosts()["far"]["sessions"], 1)
        self.assertEqual(f.commands.run("uname -s").stdout, "Linux\n")
        self.assertIn(f.id, self.far.domains())
        out = subprocess.run([AIRLOCKD, "--config", self.d.conf, "hosts"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
        self.assertEqual(out.returncode, 0, out.stderr)
        lines = out.stdout.decode().splitlines()
        self.assertTrue(any(l.split()[:2] == ["far", "up"] for l in lines), lines)
        self.assertTrue(any(l.split()[:2] == ["near", "up"] for l in lines), lines)
        f.kill()
        e2.kill()
        self.assertEqual(self.far.domains(), [])
        self.assertEqual([v for v in self.far_volumes() if not v.startswith("image-")], [])
        self.assertTrue(domain_gone(e2.id))


if __name__ == "__main__":
    unittest.main()

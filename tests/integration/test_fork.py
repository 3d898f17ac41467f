"""Forks (issue 55): a running session's whole state saved once and opened as new sessions,
through airlockd's REST API and the Python client, the CLI, and MCP's fork_session; real
libvirt, real guests of the debian image (its python kernel) and of the tiny one.

What each test would catch: a fork that boots cold or from the image (the variable, the file,
the server missing), forks that share a disk or memory (a write seen elsewhere), forks that are
copies of one another (the same randomness or identity), a source that does not go on, a quota
that a fork escapes, another key's session forked, a save's files left behind.
"""
import json
import os
import shutil
import subprocess
import tempfile
import time
import unittest

import altest
from airlock import APIError, Sandbox
from test_airlockd import NET_GUEST, Daemon
from test_warm import IDENTITY_PY, IDENTITY_SH, PROCESS_SECRETS

AIRLOCK = os.environ.get("AIRLOCK_BIN", "airlock")


def have(image):
    return os.path.exists(os.path.join(altest.IMAGE_DIR, image, "manifest.json"))


def forks_dir():
    """The library's saves: STATE/forks, beside the sessions' state dirs."""
    return os.path.join(os.path.dirname(altest.state_sessions_dir()), "forks")


def snapshots_dir():
    return os.path.join(os.path.dirname(altest.state_sessions_dir()), "snapshots")


def saves_left():
    d = forks_dir()
    return sorted(os.listdir(d)) if d and os.path.isdir(d) else []


def ram_saves():
    """/dev/shm dirs of this state dir's fork saves and spare holders (the RAM of a save lives
    there when /dev/shm has room; each dir's "save" link names what it belongs to)."""
    out = []
    for d in os.listdir("/dev/shm"):
        try:
            if d.startswith("airlock-fork.") and \
                    os.readlink(os.path.join("/dev/shm", d, "save")).startswith(STATE + "/"):
                out.append(d)
        except OSError:
            pass
    return sorted(out)


def shm_dir():
    """A dir as the library makes them in /dev/shm (mkdtemp's six characters)."""
    while True:
        p = "/dev/shm/airlock-fork." + os.urandom(3).hex()
        try:
            os.mkdir(p, 0o711)
            return p
        except FileExistsError:
            pass


def identity(sb):
    sh = sb.commands.run(IDENTITY_SH).stdout.split("\n")
    py = sb.run_code(IDENTITY_PY)
    procs = json.loads(sb.commands.run(PROCESS_SECRETS).stdout)
    return {"uuid": sh[0:2], "hostname": sh[2], "machine-id": sh[3], "boot_id": sh[5],
            "python": "".join(py.logs.stdout).split(), "self": procs["self"]}


STATE = None


def setUpModule():
    # A state dir of its own: the warm template this test builds (its sources start warm, so
    # their forks link the template's disk) is nobody else's.
    global STATE
    STATE = tempfile.mkdtemp(prefix="airlock-fork-test-", dir="/var/tmp")
    os.chmod(STATE, 0o755)
    os.environ["AIRLOCK_STATE_DIR"] = STATE


def tearDownModule():
    shutil.rmtree(STATE, ignore_errors=True)


@unittest.skipUnless(have("debian"), "the debian image is not built")
class ForkTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon(env={"AIRLOCK_WARM": "auto"})
        cls.key_a = cls.d.key("alice", "--max-sessions", "6", "--max-snapshots", "2")
        cls.key_b = cls.d.key("bob")

    @classmethod
    def tearDownClass(cls):
        cls.d.stop_and_remove()

    def test_1_forks_carry_the_state_and_then_diverge(self):
        c = self.d.tcp(self.key_a)
        before = saves_left()
        # RAM files in /dev/shm that a dead process left: one whose save is gone, one never
        # linked to a save and old; beside one whose save is there. A session's start reaps.
        orphan = shm_dir()
        os.symlink(os.path.join(STATE, "forks", "0123456789abcdef"), os.path.join(orphan, "save"))
        unlinked = shm_dir()
        os.utime(unlinked, (time.time() - 3600, time.time() - 3600))
        live = shm_dir()
        os.symlink(STATE, os.path.join(live, "save"))
        src = Sandbox(image="debian", client=c)
        self.assertFalse(os.path.exists(orphan))
        self.assertFalse(os.path.exists(unlinked))
        self.assertTrue(os.path.exists(live))
        shutil.rmtree(live)
        try:
            # State of every kind: the kernel's variable and import, a file on the disk, a file
            # in /tmp (RAM), a background server with its port open.
            r = src.run_code("import numpy\nx = 41\nseen = numpy.arange(3).sum()")
            self.assertIsNone(r.error, r)
            src.commands.run("mkdir -p /srv/www && echo served > /srv/www/page && "
                             "echo disk > /root/before && echo ram > /tmp/before && sync")
            src.commands.run("cd /srv/www && exec python3 -m http.server 8000", background=True)
            src.wait_for_port(8000)
            # A run in flight at the fork, blocked until its fifo is written, then writing far
            # past a pipe's 64 KiB: each fork takes it up under the same id.
            src.commands.run("mkfifo /tmp/go")
            gated = src.commands.run("touch /tmp/gated; read x < /tmp/go; "
                                     "head -c 200000 /dev/zero | tr '\\0' y; echo; echo \"end $x\"",
                                     background=True)
            # Running in the guest before the save (a run whose start the agent has not read
            # yet is not in the fork: the source's alone).
            deadline = time.time() + 30
            while src.commands.run("test -e /tmp/gated", timeout=30).exit_code != 0 and \
                    time.time() < deadline:
                time.sleep(0.2)
            forks = src.fork(4, name="try", labels={"trial": "yes"})
            self.assertEqual(len(forks), 4, forks)
            for f in forks:
                self.assertIsInstance(f, Sandbox, f)
            try:
                ids = [f.id for f in forks]
                self.assertEqual(len(set(ids + [src.id])), 5, ids)
                listed = {s["id"]: s for s in c.sessions()}
                for i, f in enumerate(forks):
                    self.assertEqual(listed[f.id]["forked_from"], src.id)
                    self.assertEqual(listed[f.id]["name"], "try-%d" % (i + 1))
                    self.assertEqual(listed[f.id]["labels"], {"trial": "yes"})
                seen = {}
                for f in forks:
                    r = f.run_code("x + 1, int(seen), numpy.__name__")
                    self.assertIsNone(r.error, r)
                    self.assertEqual(r.text, "(42, 3, 'numpy')")
                    self.assertEqual(f.commands.run("cat /root/before /tmp/before").stdout,
                                     "disk\nram\n")
                    st, _, body = f.request_port(8000, "/page")
                    self.assertEqual((st, body), (200, b"served\n"))
                    seen[f.id] = identity(f)
                    self.assertEqual(seen[f.id]["hostname"], f.id)
                # The inherited run: listed, its output flowing in the fork (it was held in
                # the guest, and the writer blocked, with no host reading it), and the source's
                # own goes on apart.
                f = forks[1]
                self.assertIn(gated.id, [r["id"] for r in f.commands.list()])
                f.commands.run("echo fork > /tmp/go")
                res = f.commands.connect(gated.id).result()
                self.assertEqual(res.stdout, "y" * 200000 + "\nend fork\n")
                self.assertEqual(res.exit_code, 0)
                src.commands.run("echo source > /tmp/go")
                self.assertEqual(gated.result().stdout[-12:], "\nend source\n")
                seen[src.id] = identity(src)
                # Unique, pairwise: what the warm starts' test asks of restored sessions.
                for k in ("hostname", "machine-id", "boot_id"):
                    vals = [seen[i][k] for i in seen]
                    self.assertEqual(len(set(vals)), len(vals), (k, vals))
                for i in range(2):
                    vals = [seen[s]["uuid"][i] for s in seen]
                    self.assertEqual(len(set(vals)), len(vals), vals)
                for i, what in enumerate(("os.urandom", "random.random", "numpy.random.rand",
                                          "uuid.uuid4")):
                    vals = [seen[s]["python"][i] for s in seen]
                    self.assertEqual(len(set(vals)), len(vals), (what, vals))
                canaries = [seen[s]["self"][0] for s in seen]
                self.assertNotIn(None, canaries)
                self.assertEqual(len(set(canaries)), len(canaries), "AT_RANDOM")
                # A write in one fork is in no other, nor in the source; the source goes on.
                forks[0].commands.run("echo fork0 > /root/before; echo fork0 > /tmp/before; "
                                      "sync")
                forks[0].run_code("x = 0")
                for f in forks[1:] + [src]:
                    self.assertEqual(f.commands.run("cat /root/before /tmp/before").stdout,
                                     "disk\nram\n")
                    self.assertEqual(f.run_code("x").text, "41")
                self.assertEqual(forks[0].run_code("x").text, "0")
                # A fork of a warm-started source links the template's disk: the template
                # stays usable (its ctime changed, never its content).
                self.assertTrue(src.info.get("warm"), "the source booted cold")
                if src.info.get("warm"):
                    again = Sandbox(image="debian", client=c)
                    self.assertTrue(again.info.get("warm"), "the template was refused")
                    again.kill()
                # The save's RAM is in /dev/shm (this host has room), and the source keeps a
                # spare holder for its next fork: a second fork of it has the same state.
                self.assertTrue(ram_saves(), "no save's RAM in /dev/shm")
                deadline = time.time() + 20
                while len(ram_saves()) < 2 and time.time() < deadline:
                    time.sleep(0.2)
                self.assertEqual(len(ram_saves()), 2, "the save and the source's spare holder")
                again = src.fork(1)[0]
                self.assertIsInstance(again, Sandbox, again)
                self.assertEqual(again.run_code("x").text, "41")
                self.assertEqual(again.commands.run("cat /root/before").stdout, "disk\n")
                again.kill()
                # A fork of a fork: the chain of disks and the state again.
                grand = forks[0].fork(1)[0]
                self.assertIsInstance(grand, Sandbox, grand)
                self.assertEqual(grand.commands.run("cat /root/before").stdout, "fork0\n")
                self.assertEqual(grand.run_code("x").text, "0")
                grand.kill()
            finally:
                for f in forks:
                    if isinstance(f, Sandbox):
                        f.kill()
        finally:
            src.kill()
        # Every save goes once no fork holds it, its RAM in /dev/shm and the source's spare
        # holder with it.
        deadline = time.time() + 10
        while (saves_left() != before or ram_saves()) and time.time() < deadline:
            time.sleep(0.2)
        self.assertEqual(saves_left(), before)
        self.assertEqual(ram_saves(), [])

    def test_2_quotas_and_other_keys(self):
        ca, cb = self.d.tcp(self.key_a), self.d.tcp(self.key_b)
        src = Sandbox(image="tiny", client=ca)
        try:
            src.commands.run("echo tiny > /tmp/mark")
            # Another key's session: the same answer as a missing one.
            with self.assertRaises(APIError) as e:
                cb.request("POST", "/v1/sessions/%s/fork" % src.id, body={"count": 1})
            with self.assertRaises(APIError) as missing:
                cb.request("POST", "/v1/sessions/airlock-000000000000/fork", body={"count": 1})
            self.assertEqual((e.exception.status, e.exception.code),
                             (missing.exception.status, missing.exception.code))
            with self.assertRaises(APIError) as bad:
                src.fork(17)
            self.assertEqual(bad.exception.status, 400)
            # reseed=False: each fork left as its source was (harnesses' identical streams);
            # by default each is its own.
            ident = "cat /etc/machine-id 2>/dev/null; hostname"
            for reseed in (False, True):
                two = src.fork(2, reseed=reseed)
                try:
                    seen = {x.commands.run(ident).stdout for x in two}
                    seen.add(src.commands.run(ident).stdout)
                    self.assertEqual(len(seen), 1 if not reseed else 3, (reseed, seen))
                finally:
                    for x in two:
                        x.kill()
            # alice may have 6: the source and 5 forks; the 6th and 7th fail alone, named.
            forks = src.fork(7)
            ok = [f for f in forks if isinstance(f, Sandbox)]
            failed = [f for f in forks if not isinstance(f, Sandbox)]
            try:
                self.assertEqual(len(ok), 5, forks)
                self.assertEqual(len(failed), 2, forks)
                for f in failed:
                    self.assertEqual((f.status, f.limit), (429, "max_sessions"), f)
                self.assertEqual(ok[4].commands.run("cat /tmp/mark").stdout, "tiny\n")
            finally:
                for f in ok:
                    f.kill()
        finally:
            src.kill()

    def test_3_cli(self):
        c = self.d.tcp(self.key_a)
        src = Sandbox(image="tiny", client=c)
        try:
            src.commands.run("echo cli > /tmp/mark")
            env = dict(os.environ, AIRLOCK_API_KEY=self.key_a)
            p = subprocess.run([AIRLOCK, "--server", "http://127.0.0.1:%d" % self.d.port,
                                "session", "fork", src.id, "-n", "2"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               timeout=300)
            self.assertEqual(p.returncode, 0, p.stderr)
            ids = p.stdout.split()
            self.assertEqual(len(ids), 2, p.stdout)
            for i in ids:
                f = Sandbox.connect(i, client=c)
                self.assertEqual(f.commands.run("cat /tmp/mark").stdout, "cli\n")
                f.kill()
            p = subprocess.run([AIRLOCK, "--server", "http://127.0.0.1:%d" % self.d.port,
                                "session", "fork", "airlock-000000000000"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               timeout=60)
            self.assertNotEqual(p.returncode, 0)
            self.assertEqual(len(p.stderr.strip().splitlines()), 1, p.stderr)
        finally:
            src.kill()

    def test_4_snapshots(self):
        ca, cb = self.d.tcp(self.key_a), self.d.tcp(self.key_b)
        kid = self.key_a.split("_")[1]
        before = saves_left()
        src = Sandbox(image="tiny", client=ca)
        try:
            src.commands.run("echo saved > /tmp/mark")
            info = src.create_snapshot("base")
            self.assertEqual((info["name"], info["image"]), ("base", "tiny"), info)
            self.assertGreater(info["bytes"], 1 << 20)
            with self.assertRaises(APIError) as e:
                src.create_snapshot("base")
            self.assertEqual(e.exception.status, 409)
            src.create_snapshot("base", replace=True)
            bad = src.create_snapshot("bad")
            with self.assertRaises(APIError) as e:  # alice keeps 2 at most
                src.create_snapshot("third")
            self.assertEqual((e.exception.status, e.exception.limit), (429, "max_snapshots"))
            self.assertEqual(sorted(x["name"] for x in ca.snapshots()), ["bad", "base"])
            self.assertEqual(cb.snapshots(), [])
        finally:
            src.kill()
        # The source gone, three sessions from the snapshot, each unique.
        made = [Sandbox(snapshot="base", client=ca) for _ in range(3)]
        try:
            names = set()
            for m in made:
                self.assertEqual(m.commands.run("cat /tmp/mark").stdout, "saved\n")
                names.add(m.commands.run("hostname").stdout)
            self.assertEqual(len(names), 3, names)
            # Another key's snapshot is no snapshot at all.
            with self.assertRaises(APIError) as e:
                Sandbox(snapshot="base", client=cb)
            self.assertEqual(e.exception.status, 404)
            with self.assertRaises(APIError) as e:
                Sandbox(snapshot="nosuch", client=ca)
            self.assertEqual(e.exception.status, 404)
            # A tampered snapshot is refused, with the reason.
            state = os.path.join(snapshots_dir(), "key-%s_bad" % kid, "state")
            with open(state, "ab") as f:
                f.write(b"x")
            with self.assertRaises(APIError) as e:
                Sandbox(snapshot="bad", client=ca)
            self.assertIn("not usable", e.exception.message)
            # Removed while sessions run from it: they go on; its files go with the last.
            self.assertTrue(ca.delete_snapshot("base"))
            self.assertFalse(ca.delete_snapshot("base"))
            self.assertEqual(made[0].commands.run("cat /tmp/mark").stdout, "saved\n")
        finally:
            for m in made:
                m.kill()
        self.assertTrue(ca.delete_snapshot("bad"))
        self.assertEqual(ca.snapshots(), [])
        deadline = time.time() + 10
        while saves_left() != before and time.time() < deadline:
            time.sleep(0.2)
        self.assertEqual(saves_left(), before)
        # A revoked key's snapshots go with it.
        temp = self.d.key("temp")
        ct = self.d.tcp(temp)
        sb = Sandbox(image="tiny", client=ct)
        try:
            sb.create_snapshot("mine")
        finally:
            sb.kill()
        mine = os.path.join(snapshots_dir(), "key-%s_mine" % temp.split("_")[1])
        self.assertTrue(os.path.isdir(mine))
        self.d.revoke(temp)
        self.assertFalse(os.path.exists(mine))

    @unittest.skipUnless(os.geteuid() == 0, "needs root for network namespaces")
    def test_5_network_forks_have_egress_of_their_own(self):
        import netlab
        lab = netlab.NetLab().start()
        self.addCleanup(lab.stop)
        d = Daemon(env={"AIRLOCK_NET_HOSTS_FILE": lab.hosts}, net_allow_max="web.test")
        self.addCleanup(d.stop_and_remove)
        c = d.unix()
        src = Sandbox(image="debian", client=c, net=["web.test"])
        try:
            key = "cat /run/airlock-egress.key | od -An -tx1 | tr -d ' \\n'"
            r = src.commands.run(["python3", "-c", NET_GUEST])
            self.assertEqual(json.loads(r.stdout)["web"], [200, "hello from the test internet\n"])
            src_key = src.commands.run(key).stdout
            forks = src.fork(2)
            try:
                keys = {src_key}
                for f in forks:
                    self.assertIsInstance(f, Sandbox, f)
                    self.assertEqual(f.info["net"]["allow"], ["web.test"])
                    r = f.commands.run(["python3", "-c", NET_GUEST])
                    R = json.loads(r.stdout)
                    self.assertEqual(R["web"], [200, "hello from the test internet\n"], R)
                    # its own proxy: only its own request is in its log; its own tunnel key
                    reqs, _ = f.net_requests()
                    self.assertEqual([q["host"] for q in reqs], ["web.test", "sub.wild.test"],
                                     reqs)
                    keys.add(f.commands.run(key).stdout)
                self.assertEqual(len(keys), 3, keys)
                # the source's egress goes on, its log its own
                r = src.commands.run(["python3", "-c", NET_GUEST])
                self.assertEqual(json.loads(r.stdout)["web"][0], 200)
                self.assertEqual(len([q for q in src.net_requests()[0]
                                      if q["host"] == "web.test"]), 2)
            finally:
                for f in forks:
                    if isinstance(f, Sandbox):
                        f.kill()
        finally:
            src.kill()


if __name__ == "__main__":
    unittest.main()

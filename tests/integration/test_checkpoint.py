"""Checkpoints and rollback (orchestrator/session/checkpoint.c) on real VMs, through
tests/integration/checkpoint-driver (one session, JSON lines).

Most cases share one tiny session with the scratch disk that holds the snapshots: each takes its
own checkpoint first, breaks the guest, rolls back and checks. The python-variable case boots the
debian image when it is built. Usage: test_checkpoint.py DRIVER [unittest args].
"""
import os
import re
import sys
import time
import unittest

import altest

# AL_CHECKPOINTS_MAX in orchestrator/include/airlock.h
MAX_CHECKPOINTS = 32
DRIVER = sys.argv.pop(1) if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else ""


class Driver(altest.JsonDriver):
    def __init__(self, image, memory_mib=0):
        super().__init__([DRIVER, image, str(memory_mib)], "checkpoint-driver")
        self.session = self.hello["session"]

    def sh(self, code, timeout=60000):
        return self.call("exec", code=code, lang="sh", timeout=timeout)

    def out(self, code, timeout=60000):
        r = self.sh(code, timeout)
        if r["r"] != 0 or r["timed_out"]:
            raise AssertionError("exec failed: %s: %s" % (code, r.get("error", "timed out")))
        return r["stdout"]

    def create(self, name=None):
        r = self.call("create", name=name) if name else self.call("create")
        if r["r"] <= 0:
            raise AssertionError("checkpoint failed: %s" % r.get("error"))
        return r["r"]

    def rollback(self, cid):
        r = self.call("rollback", id=cid)
        if r["r"] != 0:
            raise AssertionError("rollback to %d failed: %s" % (cid, r.get("error")))
        return r

    def close(self):
        self.p.stdin.close()
        rc = self.p.wait(timeout=60)
        self.p.stdout.close()
        return rc


class TinyCheckpoints(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Driver("tiny", 512)
        cls.d.out("mkdir -p /root")
        cls.base = cls.d.create("base")

    @classmethod
    def tearDownClass(cls):
        name = cls.d.session
        assert cls.d.close() == 0
        # Nothing left behind: not the domain, not the session dir with the snapshots.
        assert name not in altest.virsh_names(), name
        assert not os.path.exists(os.path.join(altest.runtime_sessions_dir(), name)), name

    def setUp(self):
        # Each case starts from the same clean guest, whatever the one before left behind.
        self.d.rollback(self.base)

    def agent_answers(self):
        self.assertEqual(self.d.out("echo alive"), "alive\n")

    def test_file_modified_after_checkpoint_comes_back(self):
        d = self.d
        d.out("echo v1 > /root/doc")
        c = d.create()
        d.out("echo v2 > /root/doc; echo new > /root/added")
        self.assertEqual(d.out("cat /root/doc"), "v2\n")
        d.rollback(c)
        self.assertEqual(d.out("cat /root/doc"), "v1\n")
        self.assertNotEqual(d.sh("test -e /root/added")["value"], 0)

    def test_rm_rf_root(self):
        d = self.d
        d.out("echo precious > /root/precious")
        before = d.out("ls /bin | wc -l")
        c = d.create()
        d.sh("rm -rf --no-preserve-root / 2>/dev/null; rm -rf / 2>/dev/null", timeout=120000)
        # Not even a shell is left.
        self.assertLess(d.sh("echo still here")["r"], 0)
        d.rollback(c)
        self.assertEqual(d.out("cat /root/precious"), "precious\n")
        self.assertEqual(d.out("ls /bin | wc -l"), before)
        self.agent_answers()

    def test_dd_over_the_disk(self):
        d = self.d
        d.out("printf 'airlock-marker' | dd of=/dev/vda conv=notrunc 2>/dev/null; sync")
        want = d.out("head -c 16777216 /dev/vda | md5sum")
        c = d.create()
        d.out("dd if=/dev/urandom of=/dev/vda bs=1M count=16 conv=fsync 2>/dev/null")
        self.assertNotEqual(d.out("head -c 16777216 /dev/vda | md5sum"), want)
        d.rollback(c)
        self.assertEqual(d.out("head -c 16777216 /dev/vda | md5sum"), want)
        self.assertEqual(d.out("head -c 14 /dev/vda"), "airlock-marker")

    def test_fork_bomb(self):
        d = self.d
        procs = int(d.out("ls -d /proc/[0-9]* | wc -l"))
        c = d.create()
        # Out of the request's cgroup, so neither its pids.max nor its end stops the bomb.
        # (ash will not let a function be named ':', so the bomb has a name.)
        r = d.sh("echo 'echo $$ > /sys/fs/cgroup/cgroup.procs; b(){ b|b& };b' > /root/bomb.sh; "
                 "sh /root/bomb.sh >/dev/null 2>&1 </dev/null & sleep 1; "
                 "ls -d /proc/[0-9]* | wc -l", timeout=5000)
        # The bomb went off: the guest is too busy to finish in time, or counts its children.
        self.assertTrue(r["r"] < 0 or r["timed_out"] or int(r["stdout"]) > procs + 20, r)
        d.rollback(c)
        self.agent_answers()
        after = int(d.out("ls -d /proc/[0-9]* | wc -l"))
        self.assertLessEqual(after, procs + 2)

    def test_disk_full(self):
        d = self.d
        c = d.create()
        # The root file system (the initramfs, a tmpfs) until it is full.
        dd = d.sh("dd if=/dev/zero of=/fill bs=1M", timeout=120000)
        self.assertIn("No space left on device", dd["stderr"])
        self.assertNotEqual(d.sh("echo x > /root/probe")["value"], 0)
        d.rollback(c)
        self.assertNotEqual(d.sh("test -e /fill")["value"], 0)
        self.assertEqual(d.out("echo ok > /root/after-full; cat /root/after-full"), "ok\n")

    def test_kernel_panic_recovers_by_itself(self):
        d = self.d
        d.out("echo before-crash > /root/crash")
        c = d.create()
        d.out("echo after > /root/crash")
        r = d.sh("echo c > /proc/sysrq-trigger")
        self.assertLess(r["r"], 0)  # the channel closed with QEMU
        rec = d.call("recover")
        self.assertEqual(rec["r"], 1, rec.get("error"))
        self.assertEqual(rec["restored"], c)
        self.assertEqual(d.out("cat /root/crash"), "before-crash\n")
        # A live agent needs no rollback: recover only resynchronizes.
        again = d.call("recover")
        self.assertEqual(again["r"], 0, again.get("error"))
        self.assertEqual(d.out("cat /root/crash"), "before-crash\n")

    def test_killed_agent_recovers(self):
        d = self.d
        c = d.create()
        d.out("echo doomed > /root/doomed")
        # init powers the VM off when its agent dies: QEMU exits.
        r = d.sh("kill -9 $(cat /run/airlock-agent.pid)")
        self.assertLess(r["r"], 0)
        rec = d.call("recover")
        self.assertEqual((rec["r"], rec["restored"]), (1, c), rec.get("error"))
        self.assertNotEqual(d.sh("test -e /root/doomed")["value"], 0)
        self.agent_answers()

    def test_twenty_checkpoints_then_the_third(self):
        d = self.d
        ids = []
        for i in range(20):
            d.out("echo %d > /root/counter" % i)
            ids.append(d.create())
        self.assertEqual(d.out("cat /root/counter"), "19\n")
        d.rollback(ids[2])
        self.assertEqual(d.out("cat /root/counter"), "2\n")
        listed = d.call("list")
        current = [c["id"] for c in listed["list"] if c["current"]]
        self.assertEqual(current, [ids[2]])
        # Later checkpoints are kept: rolling forward works too.
        d.rollback(ids[15])
        self.assertEqual(d.out("cat /root/counter"), "15\n")
        for cid in ids:
            self.assertEqual(d.call("delete", id=cid)["r"], 0)
        remaining = {c["id"] for c in d.call("list")["list"]}
        self.assertFalse(remaining & set(ids))

    def test_hung_agent_is_rolled_back(self):
        d = self.d
        c = d.create()
        d.out("echo doomed > /root/hung")
        # Stop the agent a moment after this run ends, from outside the run's cgroup: the VM
        # runs on, its agent answers nothing.
        d.out("echo 'echo $$ > /sys/fs/cgroup/cgroup.procs; sleep 1; "
              "kill -STOP $(cat /run/airlock-agent.pid)' > /root/freeze.sh; "
              "sh /root/freeze.sh >/dev/null 2>&1 </dev/null & "
              "while ! grep -q $! /sys/fs/cgroup/cgroup.procs; do sleep 0.05; done")
        time.sleep(3)
        rec = d.call("recover")
        self.assertEqual((rec["r"], rec["restored"]), (1, c), rec.get("error"))
        self.assertNotEqual(d.sh("test -e /root/hung")["value"], 0)
        self.agent_answers()

    def test_oldest_unnamed_checkpoint_goes_at_the_limit(self):
        d = self.d
        made = []
        while len(d.call("list")["list"]) < MAX_CHECKPOINTS:
            made.append(d.create())
        listed = [c["id"] for c in d.call("list")["list"]]
        self.assertEqual(len(listed), MAX_CHECKPOINTS)
        oldest_unnamed = [c["id"] for c in d.call("list")["list"] if not c["name"]][0]
        extra = d.create()
        after = [c["id"] for c in d.call("list")["list"]]
        self.assertEqual(len(after), MAX_CHECKPOINTS)
        self.assertNotIn(oldest_unnamed, after)
        self.assertIn(self.base, after)  # named ones stay
        self.assertIn(extra, after)
        for cid in made + [extra]:
            if cid in after:
                self.assertEqual(d.call("delete", id=cid)["r"], 0)

    def test_named_checkpoint(self):
        d = self.d
        d.out("echo named > /root/named")
        c = d.create("before-install")
        dup = d.call("create", name="before-install")
        self.assertEqual(dup["r"], -17, dup)  # EEXIST
        for bad in ("123", "has space", ""):
            self.assertEqual(d.call("create", name=bad)["r"], -22, bad)  # EINVAL
        found = d.call("find", key="before-install")
        self.assertEqual(found["r"], 0)
        self.assertEqual(found["info"]["id"], c)
        self.assertEqual(d.call("find", key=str(c))["info"]["name"], "before-install")
        self.assertEqual(d.call("find", key="nope")["r"], -2)
        d.out("echo changed > /root/named")
        d.rollback(found["info"]["id"])
        self.assertEqual(d.out("cat /root/named"), "named\n")

    def test_sizes_are_reported(self):
        d = self.d
        c = d.create()
        d.out("dd if=/dev/urandom of=/dev/vda bs=1M count=8 conv=fsync 2>/dev/null")
        c2 = d.create()
        info = {x["id"]: x for x in d.call("list")["list"]}
        self.assertGreater(info[c]["state_bytes"], 1 << 20)  # memory was saved
        # The second holds its memory state plus the 8 MiB the guest changed.
        self.assertGreaterEqual(info[c2]["disk_bytes"], info[c2]["state_bytes"] + (7 << 20))

    def test_background_writer_leaves_no_torn_file(self):
        d = self.d
        # A writer outside the request's cgroup (or it would die with the request), appending
        # fixed-size numbered records; each record says whether /root/phase2 existed when it was
        # written, so what the writer did after the checkpoint is told apart by content, not by
        # how fast a restored writer runs on a loaded machine.
        d.out("cat > /root/writer.sh <<'EOF'\n"
              "echo $$ > /sys/fs/cgroup/cgroup.procs\n"
              "echo $$ > /root/writer.pid\n"
              "i=0\n"
              "while :; do\n"
              "  if [ -e /root/phase2 ]; then p=B; else p=A; fi\n"
              "  printf '%s%08d\\n' $p $i >> /root/log; i=$((i+1))\n"
              "done\n"
              "EOF\n"
              "rm -f /root/log /root/writer.pid /root/phase2\n"
              "sh /root/writer.sh >/dev/null 2>&1 </dev/null &\n"
              # The request's leftovers die when it ends: wait until the writer left its cgroup.
              "while [ ! -s /root/writer.pid ] || [ ! -s /root/log ]; do sleep 0.05; done\n")
        c = d.create()
        d.out("touch /root/phase2; until grep -q '^B' /root/log; do sleep 0.1; done")
        d.rollback(c)
        d.out("kill -9 $(cat /root/writer.pid)")
        log = d.out("cat /root/log")
        self.assertNotEqual(d.sh("test -e /root/phase2")["value"], 0)
        self.assertTrue(log.endswith("\n"), log[-20:])
        lines = log.split("\n")[:-1]
        self.assertGreater(len(lines), 0)
        for i, line in enumerate(lines):
            # Only records from before the checkpoint and from the restored writer, none torn.
            self.assertEqual(line, "A%08d" % i)

    def test_checkpoints_need_the_option(self):
        # A plain session (airlock exec) has no scratch disk and still boots and runs.
        r = altest.run(["-q", "exec", "--", "sh", "-c", "ls /dev/vd* 2>/dev/null | wc -l"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(altest.strip_notices(r.stdout), b"0\n")


def debian_built():
    return os.path.exists(os.path.join(altest.IMAGE_DIR, "debian", "manifest.json"))


@unittest.skipUnless(debian_built(), "the debian image is not built")
class DebianCheckpoints(unittest.TestCase):
    def test_python_variable_survives_rm_rf(self):
        d = Driver("debian", 512)
        try:
            r = d.call("exec", lang="python", kernel=True, code="x = 41 + 1\nprint(x)")
            if r["r"] != 0 or r["stdout"] != "42\n":
                self.skipTest("no python kernel in this agent: %s" % r)
            d.out("echo precious > /root/precious")
            c = d.create()
            d.call("exec", lang="python", kernel=True, code="x = 0")
            d.sh("rm -rf --no-preserve-root / 2>/dev/null", timeout=300000)
            self.assertLess(d.sh("echo still here")["r"], 0)
            d.rollback(c)
            r = d.call("exec", lang="python", kernel=True, code="print(x)")
            self.assertEqual((r["r"], r["stdout"]), (0, "42\n"), r)
            self.assertEqual(d.out("cat /root/precious"), "precious\n")
            df = d.out("df / | tail -1")
            self.assertTrue(re.search(r"/dev/vda", df), df)
        finally:
            self.assertEqual(d.close(), 0)


if __name__ == "__main__":
    altest.main()

#!/usr/bin/env python3
"""Bad input and hostile guests: each gets a one-line error and a non-zero exit, never a hang,
a crash or a leaked VM. The hostile guests are tiny images whose /init is a shell script in
place of the agent."""
import json
import os
import subprocess
import tempfile
import unittest

import altest

# Loads the virtio modules and finds the agent port the way the agent does, then misbehaves.
HOSTILE_INIT = r"""#!/bin/sh
[ "$1" = --version ] && { echo hostile-agent 0 protocol %(protocol)s; exit 0; }
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
while read m; do insmod "$m"; done < /etc/airlock/modules
for p in /sys/class/virtio-ports/*; do
  [ "$(cat $p/name)" = org.airlock.agent.0 ] && port=/dev/${p##*/}
done
exec 3<>"$port"
%(body)s
sleep 100000
"""
# The manifest claims the protocol this airlock speaks (as the real agent's --version says), so
# that the host goes as far as talking to the hostile guest.
PROTOCOL = subprocess.run([altest.AGENT, "--version"], capture_output=True, text=True,
                          check=True).stdout.split()[3]

GARBAGE = "while :; do echo 'this is not a frame' >&3; sleep 1; done"
# A frame header that promises 100 payload bytes, and then only 10 of them.
STALL = r"printf 'AL\002\000\000\000\000\000\144\000\000\0000123456789' >&3"
SILENT = ":"
# A handshake answer from an agent that speaks protocol 9.
OLD_AGENT = (r"dd bs=28 count=1 <&3 >/dev/null 2>&1; "
             r"printf 'AL\002\000\000\000\000\000\034\000\000\000"
             r"\011\000\000\000\000\000\000\000\000\000\000\000\000\000\020\000"
             r"\000\000\000\000\000\000\000\000\000\000\000\000' >&3")


class BadInputTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.store = altest.Store()
        for name, body in (("garbage", GARBAGE), ("stall", STALL), ("silent", SILENT),
                           ("oldagent", OLD_AGENT)):
            init = os.path.join(cls.store.dir, name + ".init")
            with open(init, "w") as f:
                f.write(HOSTILE_INIT % {"body": body, "protocol": PROTOCOL})
            os.chmod(init, 0o755)
            altest.build_image(init, os.path.join(cls.store.dir, name))
        cls.store.copy_image("tiny", "tiny")
        d = cls.store.copy_image("tiny", "future")
        with open(os.path.join(d, "manifest.json")) as f:
            m = json.load(f)
        m["agent_protocol"] = 99
        with open(os.path.join(d, "manifest.json"), "w") as f:
            json.dump(m, f)

    @classmethod
    def tearDownClass(cls):
        cls.store.close()

    def fails_cleanly(self, args, expect, **kw):
        before = altest.virsh_names()
        r = altest.run(["-q"] + args, image_dir=self.store.dir, **kw)
        self.assertEqual(r.returncode, 125, r.stderr)
        lines = r.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertTrue(lines[0].startswith(b"airlock: "), lines[0])
        self.assertIn(expect, lines[0])
        self.assertEqual(self.leaked(before), set())
        return lines[0]

    def leaked(self, before):
        """Domains booted from this test's store that are still there: other tests and other
        users of this libvirtd start and stop their own domains meanwhile."""
        ours = set()
        for n in altest.virsh_names() - before:
            x = subprocess.run(["virsh", "-c", "qemu:///system", "dumpxml", n],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            if x.returncode == 0 and (self.store.dir + "/").encode() in x.stdout:
                ours.add(n)
        return ours

    def test_unknown_image(self):
        self.fails_cleanly(["exec", "--image", "nope", "--", "true"], b"unknown image 'nope'")

    def test_libvirt_unreachable(self):
        self.fails_cleanly(["--connect", "qemu+unix:///system?socket=/nonexistent", "exec",
                            "--image", "garbage", "--", "true"], b"cannot reach libvirt")

    def test_image_with_other_protocol_version(self):
        self.fails_cleanly(["exec", "--image", "future", "--", "true"], b"protocol 99")

    def test_agent_with_other_protocol_version(self):
        self.fails_cleanly(["exec", "--image", "oldagent", "--", "true"], b"protocol 9")

    def test_guest_sends_garbage(self):
        self.fails_cleanly(["exec", "--image", "garbage", "--", "true"], b"malformed frame")

    def test_guest_stalls_mid_frame(self):
        self.fails_cleanly(["exec", "--image", "stall", "--", "true"], b"stalled")

    def test_guest_never_answers(self):
        self.fails_cleanly(["exec", "--boot-timeout", "20", "--image", "silent", "--", "true"],
                           b"did not answer")

    def test_path_escaping_its_target(self):
        with tempfile.NamedTemporaryFile() as f:
            self.fails_cleanly(["exec", "--image", "tiny", "--put",
                                f.name + ":../../../etc/escape", "--", "true"], b"escape")

    def test_host_inputs_are_checked_before_booting(self):
        # Each is said before a VM boots: through a libvirt nobody can reach, the answer is
        # still about the input (booting first would say "cannot reach libvirt").
        nowhere = ["--connect", "qemu+unix:///system?socket=/nonexistent"]
        for args, expect in [
                (["--put", "/nonexistent/missing.csv:/tmp/x"],
                 b"--put: cannot open '/nonexistent/missing.csv': No such file"),
                (["--put", "/tmp:/tmp/x"], b"--put: '/tmp' is not a regular file"),
                (["--get", "/etc/hostname:/nonexistent/dir/h"],
                 b"--get: no such host directory: '/nonexistent/dir/'"),
                (["--workdir", "/nonexistent/proj"], b"--workdir: '/nonexistent/proj' is not")]:
            self.fails_cleanly(nowhere + ["exec", "--image", "tiny"] + args + ["--", "true"],
                               expect)
        # Too little memory for the image: refused with the least it boots in.
        line = self.fails_cleanly(["exec", "--image", "tiny", "--memory", "64", "--", "true"],
                                  b"64 MiB of memory is too little for image 'tiny'")
        self.assertRegex(line, rb"at least \d+ MiB$")

    def test_copies_into_a_directory_and_say_a_missing_file_once(self):
        with tempfile.TemporaryDirectory() as d:
            src = os.path.join(d, "data.csv")
            with open(src, "w") as f:
                f.write("a,b\n")
            # "/tmp/" and "/tmp" (which the guest says is a directory) both copy into it.
            r = altest.run(["-q", "exec", "--image", "tiny", "--put", src + ":/tmp/",
                            "--put", src + ":/root", "--", "cat", "/tmp/data.csv",
                            "/root/data.csv"], image_dir=self.store.dir)
            self.assertEqual((r.returncode, r.stdout), (0, b"a,b\na,b\n"), r.stderr)
            r = altest.run(["-q", "exec", "--image", "tiny", "--get", "/nonexist:" + d, "--",
                            "true"], image_dir=self.store.dir)
            self.assertEqual(r.returncode, 125, r.stderr)
            self.assertEqual(r.stderr.strip().splitlines(),
                             [b"airlock: --get failed: no such file in the guest: /nonexist"])
            # A guest out of room says it is the guest's (tiny's /tmp is half the memory left
            # once it is up).
            big = os.path.join(d, "big")
            with open(big, "wb") as f:
                f.truncate(64 << 20)
            line = self.fails_cleanly(["exec", "--image", "tiny", "--memory", "96", "--put",
                                       big + ":/tmp/big", "--", "true"], b"No space left")
            self.assertEqual(line, b"airlock: /tmp/big: write failed: No space left on device "
                             b"(in the guest: its disk, or /tmp, which is in its memory, is "
                             b"full)")

    def test_usage_errors(self):
        r = altest.run(["exec"])
        self.assertEqual(r.returncode, 2)
        r = altest.run(["exec", "--timeout", "soon", "--", "true"])
        self.assertEqual(r.returncode, 2)
        self.assertIn(b"--timeout", r.stderr)
        # A mistyped option or command: one line, the nearest one, where the help is.
        for args, line in [
                (["exec", "--imgae", "tiny", "--", "true"],
                 b"airlock: unknown option --imgae; did you mean --image? "
                 b"(see 'airlock exec --help')"),
                (["exce", "--", "true"],
                 b"airlock: unknown command 'exce'; did you mean 'exec'? (see 'airlock --help')"),
                (["exec", "--image"],
                 b"airlock: option --image wants a value (see 'airlock exec --help')"),
                (["exec", "--kernel=yes", "--", "true"],
                 b"airlock: option --kernel takes no value (see 'airlock exec --help')"),
                (["image", "wram", "tiny"],
                 b"airlock: unknown image command 'wram'; did you mean 'warm'? "
                 b"(see 'airlock image --help')"),
                (["run", "--modle", "x", "task"],
                 b"airlock: unknown option --modle; did you mean --model? "
                 b"(see 'airlock run --help')"),
                (["exec", "-Z"], b"airlock: unknown option -Z (see 'airlock exec --help')"),
                (["exec", "--zzzzzz"],
                 b"airlock: unknown option --zzzzzz (see 'airlock exec --help')")]:
            r = altest.run(args)
            self.assertEqual((r.returncode, r.stderr.strip().splitlines()), (2, [line]), args)


if __name__ == "__main__":
    altest.main()

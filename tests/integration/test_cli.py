#!/usr/bin/env python3
"""The CLI around exec: help, version, image ls, doctor, gc — against the real libvirtd."""
import os
import re
import tempfile
import unittest

import altest

# The protocol this tree speaks, as its header says it.
with open(os.path.join(altest.SOURCE_ROOT, "proto", "airlock-proto.h")) as f:
    PROTOCOL = int(re.search(r"#define AL_PROTO_VERSION (\d+)", f.read()).group(1))


class CliTest(unittest.TestCase):
    def test_help_for_every_subcommand(self):
        for args in (["--help"], ["exec", "--help"], ["image", "--help"], ["doctor", "--help"],
                     ["gc", "--help"], ["chat", "--help"], ["run", "--help"],
                     ["conversations", "--help"]):
            r = altest.run(args)
            self.assertEqual(r.returncode, 0, args)
            self.assertIn(b"Usage: airlock", r.stdout, args)

    def test_version(self):
        r = altest.run(["--version"])
        self.assertEqual(r.returncode, 0)
        self.assertRegex(r.stdout, rb"^airlock \d+\.\d+\.\d+ \(protocol %d\)\n$" % PROTOCOL)

    def test_unknown_command(self):
        r = altest.run(["frobnicate"])
        self.assertEqual(r.returncode, 2)
        self.assertIn(b"unknown command 'frobnicate'", r.stderr)

    def test_session_start_has_no_short_i(self):
        # exec's -i keeps stdin open (docker's); session start's -i meant --image
        r = altest.run(["--server", "unix:/nonexistent.sock", "session", "start", "-i", "debian"])
        self.assertEqual(r.returncode, 2)
        self.assertIn(b"--image NAME", r.stderr)

    def test_image_ls(self):
        r = altest.run(["image", "ls"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout, rb"\ntiny +%d +virtio +sh " % PROTOCOL)

    def test_image_ls_reports_a_broken_image(self):
        store = altest.Store()
        try:
            d = store.copy_image("tiny", "broken")
            with open(d + "/manifest.json", "w") as f:
                f.write("{not json")
            r = altest.run(["image", "ls"], image_dir=store.dir)
            self.assertEqual(r.returncode, 1)
            self.assertIn(b"broken", r.stdout)
        finally:
            store.close()

    def test_doctor(self):
        r = altest.run(["doctor"])
        self.assertEqual(r.returncode, 0, r.stdout)
        self.assertIn(b"libvirt reachable", r.stdout)
        self.assertIn(b"image tiny", r.stdout)
        with tempfile.TemporaryDirectory() as empty:
            r = altest.run(["doctor"], image_dir=empty)
            self.assertEqual(r.returncode, 1)
            self.assertIn(b"image tiny missing", r.stdout)
            self.assertIn(b"fix:", r.stdout)
        r = altest.run(["--connect", "qemu+unix:///system?socket=/nonexistent", "doctor"])
        self.assertEqual(r.returncode, 1)
        self.assertIn(b"cannot reach libvirt", r.stdout)

    def test_gc_with_nothing_to_reap_touches_nothing(self):
        before = altest.virsh_names()
        r = altest.run(["gc"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(altest.virsh_names(), before)


if __name__ == "__main__":
    altest.main()

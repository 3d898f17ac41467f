#!/usr/bin/env python3
"""airlockd past descriptor 1024 (the third hostile audit's lockout at ~90 sessions: each
session holds about 11 descriptors, and libmicrohttpd on select() refused every connection
whose descriptor was FD_SETSIZE or more). A daemon started with a soft limit of 1024 raises it
to the hard one. Stand-ins for hundreds of sessions' descriptors: the daemon is started holding
1100 inherited ones; every client still gets answers and a session works; and a daemon whose
hard limit leaves no room for one more session refuses it with a clear 503, still answering
everything else. Real airlockd, libvirtd, QEMU and agent (one tiny guest)."""
import os
import resource
import unittest

import altest
from airlock import APIError, Sandbox
from test_airlockd import Daemon

HELD = 1100  # inherited descriptors: past FD_SETSIZE (1024) before the daemon opens any


def held_fds():
    null = os.open("/dev/null", os.O_RDONLY)
    fds = [null] + [os.dup(null) for _ in range(HELD - 1)]
    return fds


def limit(soft, hard):
    def pre():
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return pre


class DaemonFdsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        cls.hard = hard  # this machine's: 4096 or more, as any CI's
        # This process must hold them to hand them down.
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
        cls.fds = held_fds()

    @classmethod
    def tearDownClass(cls):
        for fd in cls.fds:
            os.close(fd)

    def test_soft_limit_raised(self):
        d = Daemon(popen={"preexec_fn": limit(1024, self.hard)})
        try:
            self.assertIn("descriptors: up to %d open" % self.hard, d.text())
            with open("/proc/%d/limits" % d.p.pid) as f:
                line = [x for x in f if x.startswith("Max open files")][0].split()
            self.assertEqual(line[3:5], [str(self.hard)] * 2)
        finally:
            d.stop_and_remove()

    def test_answers_and_runs_past_fd_setsize(self):
        d = Daemon(popen={"pass_fds": self.fds, "preexec_fn": limit(self.hard, self.hard)})
        try:
            key = d.key("fds")
            # Every new connection's descriptor is past 1024 now: on select() each was refused.
            for _ in range(5):
                self.assertEqual(d.unix().health()["status"], "ok")
                self.assertEqual(d.tcp(key).health()["status"], "ok")
            with Sandbox(image="tiny", client=d.tcp(key)) as sb:
                r = sb.commands.run("echo past-1024")
                self.assertEqual(r.stdout, "past-1024\n")
                self.assertEqual(d.unix().health()["status"], "ok")
            self.assertNotIn("FD_SETSIZE", d.text())
        finally:
            d.stop_and_remove()

    def test_session_refused_when_descriptors_run_short(self):
        # A hard limit of 1500 with 1100 held: a session (48) plus the connections' share (two
        # listeners with the default 256 each, and 64 spare) does not fit.
        d = Daemon(popen={"pass_fds": self.fds, "preexec_fn": limit(1500, 1500)})
        try:
            with self.assertRaises(APIError) as cm:
                Sandbox(image="tiny", client=d.unix())
            self.assertEqual(cm.exception.status, 503)
            self.assertIn("RLIMIT_NOFILE", str(cm.exception))
            self.assertIn("raise LimitNOFILE", str(cm.exception))
            # Everyone else is still answered, and nothing was booted.
            self.assertEqual(d.unix().health()["status"], "ok")
            self.assertEqual(d.unix().request("GET", "/v1/sessions")["sessions"], [])
        finally:
            d.stop_and_remove()


if __name__ == "__main__":
    altest.main()

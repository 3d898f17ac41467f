#!/usr/bin/env python3
"""Terminals into the guest (issue 30): `airlock exec -it`, `airlock shell` into a session
another airlock process holds, driven as a user's terminal would drive them, through a
pseudo-terminal of the test's own. Real guests through the real libvirtd and QEMU."""
import fcntl
import os
import re
import select
import signal
import struct
import subprocess
import tempfile
import termios
import time
import unittest

import altest

DEBIAN = os.path.isfile(os.path.join(altest.IMAGE_DIR, "debian", "manifest.json"))
IMAGE = "debian" if DEBIAN else "tiny"
BOOT_S = 180


def set_size(fd, rows, cols):
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class Term:
    """airlock ARGS on a pseudo-terminal the test holds both ends of: the slave stays open here
    after airlock exits, so that the mode airlock left it in can be read."""

    def __init__(self, args, rows=30, cols=100):
        self.master, self.slave = os.openpty()
        set_size(self.slave, rows, cols)
        self.before = termios.tcgetattr(self.slave)
        env = dict(os.environ, AIRLOCK_IMAGE_DIR=altest.IMAGE_DIR, TERM="xterm")

        def ctty():
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        self.proc = subprocess.Popen([altest.AIRLOCK] + args, stdin=self.slave,
                                     stdout=self.slave, stderr=self.slave, env=env,
                                     preexec_fn=ctty)
        self.buf = b""

    def read_until(self, pattern, timeout=60):
        """Reads until pattern (a regex on bytes) matches what came since the last match;
        returns the match, or fails the test with what came."""
        rx = re.compile(pattern)
        end = time.monotonic() + timeout
        while True:
            m = rx.search(self.buf)
            if m:
                self.buf = self.buf[m.end():]
                return m
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {pattern!r} within {timeout} s; got {self.buf[-800:]!r}")
            r, _, _ = select.select([self.master], [], [], min(left, 0.5))
            if r:
                try:
                    data = os.read(self.master, 65536)
                except OSError:
                    data = b""
                if not data and self.proc.poll() is not None:
                    raise AssertionError(f"airlock ended ({self.proc.returncode}) before "
                                         f"{pattern!r}; got {self.buf[-800:]!r}")
                self.buf += data

    def send(self, data):
        os.write(self.master, data)

    def resize(self, rows, cols):
        set_size(self.slave, rows, cols)
        self.proc.send_signal(signal.SIGWINCH)

    def wait(self, timeout=60):
        end = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < end:
            r, _, _ = select.select([self.master], [], [], 0.2)
            if r:
                try:
                    self.buf += os.read(self.master, 65536)
                except OSError:
                    pass
        return self.proc.wait(timeout=5)

    def close(self):
        if self.proc.poll() is None:  # a failed test: airlock ends its VM on SIGTERM
            self.proc.terminate()
            try:
                self.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        os.close(self.master)
        os.close(self.slave)


PROMPT = rb"[#$] (\x1b\[6n)?$"


def domains_of(pids):
    """The domains that the airlock processes pids made (their metadata names the pid): other
    tests' guests, booting beside these, are not theirs."""
    mine = set()
    for name in altest.virsh_names():
        xml = subprocess.run(["virsh", "-c", "qemu:///system", "dumpxml", name],
                             capture_output=True, text=True).stdout
        m = re.search(r"<airlock:session [^>]*pid='(\d+)'", xml)
        if m and int(m.group(1)) in pids:
            mine.add(name)
    return mine


class ExecTtyTest(unittest.TestCase):
    def setUp(self):
        self.pids = set()

    def tearDown(self):
        # After airlock's own end (the test waited for it, or the cleanup does now).
        self.doCleanups()
        self.assertEqual(domains_of(self.pids), set(), "a VM was leaked")

    def term(self, args):
        t = Term(args)
        self.pids.add(t.proc.pid)
        self.addCleanup(t.close)
        return t

    def shell(self):
        t = self.term(["exec", "-it", "--image", IMAGE, "--", "sh", "-c",
                       "exec bash -l || exec sh -l"])
        t.read_until(PROMPT, BOOT_S)
        return t

    def test_a_shell_on_a_terminal(self):
        t = self.shell()
        # The size set at the start, and after a resize (SIGWINCH forwarded).
        t.send(b"stty size\r")
        t.read_until(rb"30 100\r\n")
        t.resize(40, 132)
        time.sleep(0.5)
        t.send(b"stty size\r")
        t.read_until(rb"40 132\r\n")
        # A terminal's programs: tty(1) names one, TERM is the host's.
        t.send(b"tty; echo term=$TERM\r")
        t.read_until(rb"/dev/pts/\d+\r\nterm=xterm\r\n")
        # Ctrl-C is the terminal's: it ends sleep, the shell lives on.
        t.send(b"sleep 100\r")
        time.sleep(1.5)
        t0 = time.monotonic()
        t.send(b"\x03")
        t.send(b"echo alive $((6*7))\r")
        t.read_until(rb"alive 42\r\n", 30)
        self.assertLess(time.monotonic() - t0, 30)
        if DEBIAN:
            # A REPL shows its prompt at once and evaluates as typed.
            t.send(b"python3 -q\r")
            t.read_until(rb">>> ")
            t.send(b"6*7\r")
            t.read_until(rb"42\r\n>>> ")
            t.send(b"\x04")
            t.read_until(PROMPT)
        t.send(b"exit 7\r")
        self.assertEqual(t.wait(), 7)
        # The local terminal is as it was before.
        self.assertEqual(termios.tcgetattr(t.slave), t.before)

    def test_sigterm_restores_the_terminal_and_ends_the_vm(self):
        t = self.shell()
        t.send(b"stty size\r")
        t.read_until(rb"30 100\r\n")
        self.assertNotEqual(termios.tcgetattr(t.slave), t.before, "not in raw mode")
        t.proc.send_signal(signal.SIGTERM)
        self.assertEqual(t.wait(), 128 + signal.SIGTERM)
        self.assertEqual(termios.tcgetattr(t.slave), t.before)

    def test_ctrl_bracket_leaves(self):
        t = self.shell()
        t.send(b"\x1d")
        status = t.wait()
        t.read_until(rb"left the terminal")
        self.assertEqual(status, 128 + signal.SIGHUP)
        self.assertEqual(termios.tcgetattr(t.slave), t.before)

    def test_a_flood_is_held_by_the_reader(self):
        """`yes` on a terminal nobody reads: the guest waits for the host, the host for this
        terminal; airlock's memory stays small."""
        t = self.term(["exec", "-t", "--image", "tiny", "--", "yes"])
        t.read_until(rb"y\r\ny\r\n", BOOT_S)
        time.sleep(10)  # nobody reads: the flood waits

        def rss_kib():
            with open(f"/proc/{t.proc.pid}/status") as f:
                return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))
        first = rss_kib()
        time.sleep(5)
        self.assertLess(rss_kib(), 200 * 1024)
        self.assertLess(rss_kib() - first, 16 * 1024, "airlock grew while nobody read")
        # Reading again, it flows again.
        t.buf = b""
        t.read_until(rb"(y\r\n){1000}")
        t.proc.send_signal(signal.SIGTERM)
        self.assertEqual(t.wait(), 128 + signal.SIGTERM)

    def test_escapes_that_reach_past_the_screen_are_dropped(self):
        # A guest's bytes on a terminal run: colours and the cursor query pass; the clipboard
        # write (OSC 52), the title (OSC 0), a title report (CSI 21 t), DECRQSS (a DCS) and ENQ
        # do not. With --raw everything passes, as asked.
        seq = ("A\\033]52;c;cm0gLXJmIH4=\\007B\\033[21tC\\033P$qm\\033\\\\D\\005E"
               "\\033]0;title\\033\\\\F\\033[31mG\\033[0m\\033[6nH\\n")
        for raw in (False, True):
            t = self.term(["exec", "-t"] + (["--raw"] if raw else []) +
                          ["--image", IMAGE, "--", "printf", seq])
            self.assertEqual(t.wait(BOOT_S), 0, t.buf[-800:])
            if raw:
                for bad in (b"\x1b]52;c;", b"\x1b[21t", b"\x1bP$q", b"\x05", b"\x1b]0;title"):
                    self.assertIn(bad, t.buf)
            else:
                self.assertIn(b"ABCDEF\x1b[31mG\x1b[0m\x1b[6nH\r\n", t.buf)
                for bad in (b"\x1b]", b"\x1b[21t", b"\x1bP", b"\x05"):
                    self.assertNotIn(bad, t.buf)


class UsageTest(unittest.TestCase):
    def test_old_t_is_pointed_to_timeout(self):
        for args in (["-t", "5"], ["-t5"], ["-it", "30"]):
            r = altest.run(["exec"] + args + ["--", "true"])
            self.assertEqual(r.returncode, 2, args)
            self.assertIn(b"--timeout", r.stderr)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)

    def test_old_i_is_pointed_to_image(self):
        r = altest.run(["exec", "-i", "tiny", "--", "true"])
        self.assertEqual(r.returncode, 2)
        self.assertIn(b"--image tiny", r.stderr)

    def test_no_terminal_for_a_kernel(self):
        r = altest.run(["exec", "-t", "--lang", "python", "--kernel", "-c", "1"])
        self.assertEqual(r.returncode, 2)
        self.assertIn(b"--kernel", r.stderr)


class ShellIntoSessionTest(unittest.TestCase):
    """`airlock shell NAME` into a session another airlock process holds (here an exec
    --linger; a chat's VM is served the same way, by its control socket)."""

    def test_shell_into_a_lingering_session(self):
        log = tempfile.TemporaryFile()
        self.addCleanup(log.close)
        holder = altest.popen(["exec", "--image", "tiny", "--linger", "200", "--",
                               "sh", "-c", "echo written-by-the-run > /tmp/mark"],
                              stdout=subprocess.DEVNULL, stderr=log)
        self.addCleanup(lambda: holder.poll() is None and (holder.kill(), holder.wait()))
        # Its name, as --linger says it (other tests' sessions may be in airlock ps too).
        name = None
        end = time.monotonic() + BOOT_S
        while not name and time.monotonic() < end and holder.poll() is None:
            log.seek(0)
            m = re.search(rb"airlock: session (\S+) stays up for 200 s \(airlock cp \1:PATH",
                          log.read())
            name = m and m.group(1).decode()
            time.sleep(0.5)
        self.assertTrue(name, "the lingering session never said its name")

        t = Term(["shell", name])
        self.addCleanup(t.close)
        t.read_until(PROMPT, 60)
        # The run that wrote it may still be starting: ps lists a session once it serves.
        t.send(b"until [ -e /tmp/mark ]; do sleep 0.2; done; cat /tmp/mark; "
               b"sleep 1000 & echo bg=$!\r")
        t.read_until(rb"written-by-the-run\r\n")
        bg = t.read_until(rb"bg=(\d+)\r\n").group(1).decode()
        # A second shell beside the first: the session serves both at once.
        t2 = Term(["shell", name])
        self.addCleanup(t2.close)
        t2.read_until(PROMPT, 60)
        t2.send(f"kill -0 {bg} && echo running\r".encode())
        t2.read_until(rb"\r\nrunning\r\n")
        # Through the holder too, a clipboard write never reaches this terminal; colour does.
        t2.send(b"printf 'X\\033]52;c;cm0gLXJmIH4=\\007Y\\033[32mZ\\033[0m\\n'\r")
        t2.read_until(rb"\r\nXY\x1b\[32mZ\x1b\[0m\r\n")
        # Closing the first terminal ends its shell and what it started.
        t.send(b"\x1d")
        self.assertEqual(t.wait(), 128 + signal.SIGHUP)
        self.assertEqual(termios.tcgetattr(t.slave), t.before)
        time.sleep(2)
        t2.send(f"kill -0 {bg} 2>/dev/null || echo gone\r".encode())
        t2.read_until(rb"\r\ngone\r\n", 30)
        t2.send(b"exit\r")
        self.assertEqual(t2.wait(), 0)
        holder.send_signal(signal.SIGTERM)
        holder.wait(timeout=60)


if __name__ == "__main__":
    unittest.main()

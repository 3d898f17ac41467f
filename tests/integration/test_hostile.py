#!/usr/bin/env python3
"""Host-side protections against a hostile guest and against other local users, end to end with
the real airlock binary and real guests (the tiny image): escape sequences from the guest never
reach a terminal (but a pipe gets the exact bytes), a file from the guest gets the user's umask
and no set-id bits, an --api-key in argv is scrubbed from /proc/PID/cmdline, and a runtime dir
another user made first is refused. docs/SECURITY.md lists what each covers."""
import json
import os
import pty
import select
import shutil
import socket
import subprocess
import tempfile
import time
import unittest

import altest


# OSC 52 (write the clipboard), SGR 8 (conceal), a C1 CSI as UTF-8 and as a raw byte, a title
# change, and text that must survive: UTF-8 and a tab.
HOSTILE = (b"\x1b]52;c;cm0gLXJmIH4=\x07\x1b[8mhidden\x1b[0m \xc2\x9b31m \x9b32m "
           b"\x1b]0;owned\x07 h\xc3\xa9llo \xe2\x9c\x93\tend\n")
# The same as printf arguments (octal escapes, which busybox printf knows).
HOSTILE_PRINTF = "".join("\\%03o" % b if b < 0x20 or b >= 0x7f or b in b"\\%'" else chr(b)
                         for b in HOSTILE)
# The terminal-bound bytes a terminal would obey.
OBEYED = [b"\x1b", b"\x07", b"\xc2\x9b", b"\x9b3"]


def read_pty(fd, pid, timeout=240):
    """Everything written to the pty until the child exits; and its exit status."""
    out = b""
    end = time.time() + timeout
    while time.time() < end:
        r, _, _ = select.select([fd], [], [], 0.5)
        if r:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                break
            out += chunk
    else:
        os.kill(pid, 9)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return out, os.waitstatus_to_exitcode(status)


def on_pty(argv, env=None):
    e = dict(os.environ)
    e["AIRLOCK_IMAGE_DIR"] = altest.IMAGE_DIR
    e.update(env or {})
    pid, fd = pty.fork()
    if pid == 0:
        os.execve(altest.AIRLOCK, [altest.AIRLOCK] + argv, e)
    return read_pty(fd, pid)


def fake_model(test, replies):
    """tests/fakemodel serving replies in a fresh dir: (that dir, its OpenAI base URL, the log
    of requests)."""
    d = tempfile.mkdtemp(prefix="airlock-hostile-")
    test.addCleanup(shutil.rmtree, d, True)
    fm, port = altest.start_fake_model(replies, d)
    test.addCleanup(lambda: (fm.kill(), fm.wait()))
    return d, "http://127.0.0.1:%d/v1" % port, os.path.join(d, "requests.jsonl")


class TerminalEscapes(unittest.TestCase):
    def assert_inert(self, out):
        for b in OBEYED:
            self.assertNotIn(b, out, "%r reached the terminal: %r" % (b, out))

    def test_exec_on_a_terminal_shows_escapes_instead_of_obeying_them(self):
        out, code = on_pty(["-q", "exec", "--", "printf", HOSTILE_PRINTF])
        self.assertEqual(code, 0, out)
        self.assert_inert(out)
        self.assertIn(b"^[]52;c;cm0gLXJmIH4=^G", out)  # shown, in caret notation
        self.assertIn(b"^[[8mhidden^[[0m", out)
        self.assertIn("h\u00e9llo \u2713\tend".encode(), out)  # text intact
        self.assertIn("\ufffd31m \ufffd32m".encode(), out)  # C1 CSI both ways

    def test_exec_raw_on_a_terminal_passes_the_bytes(self):
        out, code = on_pty(["-q", "exec", "--raw", "--", "printf", HOSTILE_PRINTF])
        self.assertEqual(code, 0, out)
        self.assertIn(b"\x1b]52;c;cm0gLXJmIH4=\x07", out)

    def test_exec_to_a_pipe_is_byte_exact(self):
        r = altest.run(["-q", "exec", "--", "sh", "-c",
                        "printf '%s'; printf '%s' >&2" % (HOSTILE_PRINTF, HOSTILE_PRINTF)])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, HOSTILE)
        self.assertEqual(altest.strip_notices(r.stderr), HOSTILE)

    def test_errors_quoting_the_guest_are_inert(self):
        # The guest's error text names the missing file, escape sequences and all.
        with tempfile.TemporaryDirectory() as d:
            r = altest.run(["-q", "exec", "--get", "/no/such/\x1b]52;c;AAAA\x07\x1b[8m:" + d,
                            "--", "true"])
        self.assertEqual(r.returncode, 125, r.stderr)
        self.assert_inert(r.stderr)
        self.assertIn(b"^[]52;c;AAAA^G", r.stderr)
        self.assertEqual(r.stderr.count(b"\n"), 1, r.stderr)

    def test_chat_output_and_model_text_are_inert(self):
        # The code is shown for confirmation: a raw escape in it could conceal part of it.
        code = "printf '%s' # \x1b[8mconcealed" % HOSTILE_PRINTF
        # A file name with a raw C1 CSI byte, which the chat lists in a notice.
        touch = "mkdir -p /workspace && touch \"/workspace/n$(printf '\\233')31mame\""
        d, base, _ = fake_model(self, [
            {"tool_calls": [{"name": "execute", "arguments": {"language": "sh", "code": code}}]},
            {"tool_calls": [{"name": "execute", "arguments": {"language": "sh", "code": touch}}]},
            {"text": "done \x1b]52;c;bW9kZWw=\x07 \x1b[8mmodel-hidden"}])
        env = {"OPENAI_API_KEY": "sk-test", "XDG_DATA_HOME": d, "XDG_CONFIG_HOME": d,
               "TERM": "xterm"}
        out, rc = on_pty(["run", "-y", "--image", "tiny", "--api", "openai", "--api-base", base,
                          "--model", "fake", "--retries", "1", "print it"], env)
        self.assertEqual(rc, 0, out)
        self.assertIn(b"model-hidden", out)
        self.assertIn(b"^[[8mconcealed", out)  # the code as shown
        self.assertIn("/workspace/n\ufffd31mame".encode(), out)  # the notice of files written
        self.assertIn(b"^[]52;c;cm0gLXJmIH4=^G", out)  # the run's output, shown
        self.assertIn(b"^[]52;c;bW9kZWw=^G", out)  # the model's text, shown
        # The renderer's own colours are the only escapes: none carries OSC, SGR 8 or BEL.
        self.assertNotIn(b"\x1b]", out)
        self.assertNotIn(b"\x1b[8m", out)
        self.assertNotIn(b"\x07", out)
        self.assertNotIn(b"\xc2\x9b", out)
        self.assertNotIn(b"\x9b31mame", out)


class GuestFileModes(unittest.TestCase):
    def test_get_applies_the_umask_and_drops_set_id_bits(self):
        with tempfile.TemporaryDirectory() as d:
            e = dict(os.environ)
            e["AIRLOCK_IMAGE_DIR"] = altest.IMAGE_DIR
            r = subprocess.run(
                [altest.AIRLOCK, "-q", "exec", "--get", "/tmp/f:" + d, "--get",
                 "/tmp/g:" + d, "--", "sh", "-c",
                 "echo x > /tmp/f; chmod 6777 /tmp/f; echo y > /tmp/g; chmod 1666 /tmp/g"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e, timeout=240,
                preexec_fn=lambda: os.umask(0o027))
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(os.stat(os.path.join(d, "f")).st_mode & 0o7777, 0o750)
            self.assertEqual(os.stat(os.path.join(d, "g")).st_mode & 0o7777, 0o640)


class ApiKeyInArgv(unittest.TestCase):
    def test_api_key_is_scrubbed_from_cmdline_and_warned_about(self):
        d = tempfile.mkdtemp(prefix="airlock-hostile-")
        self.addCleanup(shutil.rmtree, d, True)
        # A model endpoint that never answers (a socket nobody accepts on), so the process
        # stays alive while we look at it.
        stall = socket.socket()
        stall.bind(("127.0.0.1", 0))
        stall.listen(1)
        self.addCleanup(stall.close)
        key = "sk-argv-SECRET-4b1d"
        e = dict(os.environ)
        e.pop("OPENAI_API_KEY", None)
        e.update({"XDG_DATA_HOME": d, "XDG_CONFIG_HOME": d,
                  "AIRLOCK_IMAGE_DIR": altest.IMAGE_DIR})
        p = subprocess.Popen(
            [altest.AIRLOCK, "run", "--image", "tiny", "--api", "openai", "--api-base",
             "http://127.0.0.1:%d/v1" % stall.getsockname()[1], "--model", "fake",
             "--request-timeout", "60", "--retries", "0", "--api-key", key, "say hi"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e)
        try:
            # The VM boots first (seconds), the key was scrubbed long before.
            cmdline = b""
            end = time.time() + 120
            while time.time() < end and p.poll() is None:
                with open("/proc/%d/cmdline" % p.pid, "rb") as f:
                    cmdline = f.read()
                if b"say hi" in cmdline and b"--api-key" in cmdline:
                    time.sleep(2)
                    with open("/proc/%d/cmdline" % p.pid, "rb") as f:
                        cmdline = f.read()
                    break
                time.sleep(0.1)
            self.assertIn(b"--api-key", cmdline)
            self.assertNotIn(key.encode(), cmdline)
            self.assertNotIn(b"SECRET", cmdline)
        finally:
            p.kill()
            _, err = p.communicate(timeout=60)
        self.assertIn(b"airlock: warning: a key given with --api-key can be read by other", err)

    def test_api_key_file_reaches_the_model(self):
        d, base, log = fake_model(self, [{"text": "hello"}, {"text": "hello again"}])
        keyfile = os.path.join(d, "key")
        with open(keyfile, "w") as f:
            f.write("sk-from-file-91\n")
        env = {"OPENAI_API_KEY": "sk-from-env", "XDG_DATA_HOME": d, "XDG_CONFIG_HOME": d}
        args = ["run", "--image", "tiny", "--api", "openai", "--api-base", base, "--model",
                "fake", "--retries", "1"]
        r = altest.run(args + ["--api-key-file", keyfile, "hi"], env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn(b"warning", r.stderr)
        r = altest.run(args + ["--api-key-file", "-", "hi"], input=b"sk-from-stdin\n", env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(log) as f:
            auths = [json.loads(l)["auth"] for l in f if l.strip()]
        self.assertEqual(auths, ["Bearer sk-from-file-91", "Bearer sk-from-stdin"])
        with open(keyfile, "w") as f:
            f.write("sk-a\nX-Injected: 1\n")
        r = altest.run(args + ["--api-key-file", keyfile, "hi"], env=env)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn(b"more than one line", r.stderr)


class RuntimeDirSquatting(unittest.TestCase):
    UID = 65534  # nobody

    def test_a_runtime_dir_another_user_made_is_refused(self):
        if os.geteuid() != 0 or not shutil.which("setpriv"):
            self.skipTest("needs root and setpriv to act as another user")
        path = "/tmp/airlock-%d" % self.UID
        aside = None
        if os.path.lexists(path):
            aside = path + ".test-aside-%d" % os.getpid()
            os.rename(path, aside)
        try:
            os.mkdir(path)  # root made it first: the squatter
            os.chmod(path, 0o777)
            e = {k: v for k, v in os.environ.items()
                 if k not in ("XDG_RUNTIME_DIR", "AIRLOCK_RUNTIME_DIR")}
            r = subprocess.run(["setpriv", "--reuid", str(self.UID), "--regid", str(self.UID),
                                "--clear-groups", altest.AIRLOCK, "ps"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e,
                               timeout=60)
            self.assertNotEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertEqual(r.stderr.count(b"\n"), 1, r.stderr)
            self.assertIn(b"airlock: refusing runtime directory '%s': owned by uid 0"
                          % path.encode(), r.stderr)
            self.assertEqual(os.listdir(path), [])  # nothing made in it
            os.rmdir(path)
            # Without the squatter it is made, ours and private.
            r = subprocess.run(["setpriv", "--reuid", str(self.UID), "--regid", str(self.UID),
                                "--clear-groups", altest.AIRLOCK, "ps"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e,
                               timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            st = os.lstat(path)
            self.assertEqual((st.st_uid, st.st_mode & 0o7777), (self.UID, 0o700))
        finally:
            shutil.rmtree(path, ignore_errors=True)
            if aside:
                os.rename(aside, path)


if __name__ == "__main__":
    altest.main()

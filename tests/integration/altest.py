"""Shared helpers for the integration tests: they run the real airlock binary, which boots
real guests through the real libvirtd and QEMU.

Environment (set by tests/meson.build): AIRLOCK_BIN, AIRLOCK_IMAGE_DIR, AIRLOCK_SOURCE_ROOT,
AIRLOCK_AGENT_BIN.
"""
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

AIRLOCK = os.environ.get("AIRLOCK_BIN", "airlock")
IMAGE_DIR = os.environ.get("AIRLOCK_IMAGE_DIR", "")
SOURCE_ROOT = os.environ.get("AIRLOCK_SOURCE_ROOT", ".")
AGENT = os.environ.get("AIRLOCK_AGENT_BIN", "")
FAKEMODEL = os.path.join(SOURCE_ROOT, "tests", "fakemodel", "fakemodel.py")
# Every call gets a hang guard: a test that hangs is a failed test, not a stuck suite.
HANG_GUARD_S = 240
NOTICE = re.compile(rb"^airlock: notice: .*\n", re.M)


def strip_notices(b):
    return NOTICE.sub(b"", b)


def start_fake_model(replies, d):
    """tests/fakemodel serving replies (a script written in the dir d; its request log is
    d/requests.jsonl): (the process, which the caller ends, and its port)."""
    script, portfile = os.path.join(d, "script.json"), os.path.join(d, "port")
    with open(script, "w") as f:
        json.dump(replies, f)
    p = subprocess.Popen([sys.executable, FAKEMODEL, "--script", script, "--log",
                          os.path.join(d, "requests.jsonl"), "--port-file", portfile],
                         stdout=subprocess.DEVNULL)
    for _ in range(200):
        if os.path.exists(portfile):
            break
        time.sleep(0.05)
    with open(portfile) as f:  # written whole (fakemodel renames it into place)
        return p, int(f.read())


def run(args, input=None, env=None, timeout=HANG_GUARD_S, image_dir=None):
    e = dict(os.environ)
    e["AIRLOCK_IMAGE_DIR"] = image_dir or IMAGE_DIR
    if env:
        e.update(env)
    return subprocess.run([AIRLOCK] + args, input=input, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, env=e, timeout=timeout)


def popen(args, image_dir=None, env=None, **kw):
    e = dict(env or os.environ)
    e["AIRLOCK_IMAGE_DIR"] = image_dir or IMAGE_DIR
    return subprocess.Popen([AIRLOCK] + args, env=e, **kw)


def popen_sh(code, debug=False):
    """`airlock -q exec --lang sh -c CODE` (with --debug first when asked), its stdout and
    stderr piped, stdin closed."""
    return popen((["--debug"] if debug else []) + ["-q", "exec", "--lang", "sh", "-c", code],
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)


def reap_pty(pid, fd):
    """Ends a child forked on a pseudo-terminal (pty.fork) if it still runs, and closes the
    terminal's end."""
    try:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
    os.close(fd)


def random_file(path, size, mode=None):
    """Writes size random bytes to path (chmod mode when given); returns them."""
    data = os.urandom(size)
    with open(path, "wb") as f:
        f.write(data)
    if mode is not None:
        os.chmod(path, mode)
    return data


def sha256(path):
    """A file's SHA-256, hex, read in 1 MiB pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def rss_kib(pid, field="VmRSS"):
    """A process's resident memory in KiB (0 when gone); field="VmHWM": its peak so far."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def virsh_names():
    out = subprocess.run(["virsh", "-c", "qemu:///system", "list", "--all", "--name"],
                         stdout=subprocess.PIPE, check=True).stdout.decode()
    return {l.strip() for l in out.splitlines() if l.strip()}


def session_names(stderr):
    return re.findall(rb"airlock: session (airlock-[0-9a-f]+)", stderr)


def runtime_sessions_dir():
    return os.environ.get("AIRLOCK_RUNTIME_DIR", "/run/airlock") + "/sessions"


def state_sessions_dir():
    """Where sessions keep their disks and checkpoints (orchestrator/vm/budget.c), as root."""
    return os.environ.get("AIRLOCK_STATE_DIR", "/var/lib/airlock/state") + "/sessions"


def build_image(agent_path, outdir):
    """Builds a tiny image with the given program as /init (a hostile stand-in for the agent)."""
    subprocess.run(["bash", os.path.join(SOURCE_ROOT, "images", "build-tiny.sh"), agent_path,
                    outdir], check=True, stdout=subprocess.DEVNULL)


class Store:
    """A throwaway image store holding copies of the built images plus test-made ones."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="airlock-store-")
        os.chmod(self.dir, 0o755)

    def copy_image(self, name, new_name):
        dst = os.path.join(self.dir, new_name)
        shutil.copytree(os.path.join(IMAGE_DIR, name), dst)
        return dst

    def close(self):
        shutil.rmtree(self.dir, ignore_errors=True)


class JsonDriver:
    """A driver of the library (tests/integration/*-driver.c) holding one session: a JSON
    greeting line, then one JSON request per line in, one JSON answer per line out."""

    def __init__(self, argv, what):
        e = dict(os.environ)
        e["AIRLOCK_IMAGE_DIR"] = IMAGE_DIR
        self.what = what
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=e,
                                  text=True)
        first = self.p.stdout.readline()
        if not first:
            raise RuntimeError("%s could not open a session" % what)
        self.hello = json.loads(first)

    def call(self, op, **kw):
        kw["op"] = op
        self.p.stdin.write(json.dumps(kw) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError("%s died" % self.what)
        return json.loads(line)

    def close(self, timeout=120):
        self.p.stdin.close()
        self.p.wait(timeout=timeout)
        self.p.stdout.close()


class TimedResult(unittest.TextTestResult):
    """Each case's wall time on stderr ("# 12.3 s Class.test"), for CI's log: where the
    suite's time goes, case by case (what may go into tests/long.sh)."""

    def startTest(self, test):
        self._t0 = time.monotonic()
        super().startTest(test)

    def stopTest(self, test):
        super().stopTest(test)
        name = test.id().split(".", 1)[-1]
        sys.stderr.write("# %.1f s %s\n" % (time.monotonic() - self._t0, name))


def main():
    unittest.main(verbosity=2, testRunner=unittest.TextTestRunner(resultclass=TimedResult,
                                                                  verbosity=2))

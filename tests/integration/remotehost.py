"""A second, independent libvirtd on this machine, standing in for a remote host.

It runs in its own mount namespace (unshare -m) with its own /run/libvirt, /var/lib/libvirt, /var/cache/libvirt, /var/log/libvirt and /etc/libvirt (bind mounts of a
private temporary directory), and listens with TCP on a loopback address, test-only and without
authentication, so `qemu+tcp://127.0.0.2:PORT/system` reaches it and nothing else does. It shares
the filesystem outside those directories (images, session dirs) with the host's own libvirtd,
which is what makes one machine enough for tests; a real remote host shares nothing.

    with RemoteHost() as h:
        subprocess.run(["virsh", "-c", h.uri, "list"])

kill() ends the daemon abruptly (the host "goes down"; its guests keep running) and restart()
starts it again on the same directories, so that it finds those guests again, as libvirtd does
after a crash. stop() destroys every domain of that daemon (it is ours alone; a killed one is
started again for that), ends it and removes its directory: nothing is left behind.
"""
import os
import shutil
import socket
import subprocess
import tempfile
import time

ADDR = "127.0.0.2"

START = r"""set -e
D="$1"
mount --bind "$D/run" /run/libvirt
mount --bind "$D/lib" /var/lib/libvirt
mount --bind "$D/cache" /var/cache/libvirt
mount --bind "$D/log" /var/log/libvirt
mount --bind "$D/etc" /etc/libvirt
exec libvirtd --listen --config "$D/etc/libvirtd.conf" --pid-file "$D/libvirtd.pid"
"""


def _free_port():
    with socket.socket() as s:
        s.bind((ADDR, 0))
        return s.getsockname()[1]


class RemoteHost:
    def __init__(self):
        self.dir = None
        self.proc = None
        self.port = None
        self._in_stop = False

    @property
    def uri(self):
        return "qemu+tcp://%s:%d/system" % (ADDR, self.port)

    def virsh(self, *args, timeout=60):
        return subprocess.run(["virsh", "-q", "-c", self.uri] + list(args),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)

    def start(self, timeout=60):
        self.dir = tempfile.mkdtemp(prefix="airlock-remotehost-")
        os.chmod(self.dir, 0o755)
        for d in ("run", "lib", "cache", "log", "log/qemu", "etc"):
            os.makedirs(os.path.join(self.dir, d), mode=0o755, exist_ok=True)
        self.port = _free_port()
        with open(os.path.join(self.dir, "etc", "libvirtd.conf"), "w") as f:
            f.write('listen_tls = 0\nlisten_tcp = 1\nlisten_addr = "%s"\ntcp_port = "%d"\n'
                    'auth_tcp = "none"\nlog_outputs = "3:file:%s/log/libvirtd.log"\n'
                    % (ADDR, self.port, self.dir))
        # No virtlogd in there: QEMU's output goes to files in its own log dir.
        with open(os.path.join(self.dir, "etc", "qemu.conf"), "w") as f:
            f.write('stdio_handler = "file"\n')
        return self._launch(timeout)

    def restart(self, timeout=60):
        """Starts the daemon again after kill(), on the same directories and port."""
        return self._launch(timeout)

    def _launch(self, timeout):
        if hasattr(self, "out"):
            self.out.close()
        self.out = open(os.path.join(self.dir, "out"), "ab")
        self.proc = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c",
                                      START, "sh", self.dir], stdout=self.out,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        end = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                msg = self.log()
                if not self._in_stop:
                    self.stop()
                raise RuntimeError("the second libvirtd exited: " + msg)
            r = self.virsh("version", timeout=10)
            if r.returncode == 0:
                return self
            if time.monotonic() > end:
                msg = r.stderr.decode(errors="replace")
                if not self._in_stop:
                    self.stop()
                raise RuntimeError("the second libvirtd did not answer: " + msg)
            time.sleep(0.2)

    def log(self):
        text = ""
        for name in ("out", "log/libvirtd.log"):
            try:
                with open(os.path.join(self.dir, name), "rb") as f:
                    text += f.read().decode(errors="replace")[-2000:]
            except OSError:
                pass
        return text

    def domains(self):
        r = self.virsh("list", "--all", "--name")
        return [l for l in r.stdout.decode().split("\n") if l.strip()]

    def kill(self):
        """Ends the daemon abruptly (the host "goes down"); its guests keep running."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is not None and self.dir:
            self._in_stop = True
            try:  # killed: its guests still run; only a daemon can end them
                self._launch(60)
            except RuntimeError:
                pass
            self._in_stop = False
        if self.proc and self.proc.poll() is None:
            for d in self.domains():
                self.virsh("destroy", d)
                self.virsh("undefine", d)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self.dir:
            self.out.close() if hasattr(self, "out") else None
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

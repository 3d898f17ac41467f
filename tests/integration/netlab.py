"""A private "internet" for the network tests and the benchmark: nothing leaves this machine.

A network namespace with a veth pair (addresses in 198.18.0.0/15, the range set aside for
network benchmarks, so neither a real host nor the proxy's forbidden ranges), an HTTP and an
HTTPS server inside it (python3's http.server; the certificate is signed by a CA made here that
only the guest is told to trust), serving:

  /hello.txt            a small file
  /big.bin              BIG_BYTES of random data
  /simple/...           a PEP 503 simple index with one wheel (pip download)
  /debian/...           a flat apt repository with one package (apt-get download)

and a hosts(5) file for the session's proxy (AIRLOCK_NET_HOSTS_FILE) that maps test names to
the server, to 127.0.0.1, to a 10.x address, to 169.254.169.254 and to the host's own veth
address. Needs root (ip netns).
"""
import base64
import hashlib
import io
import os
import shutil
import socket
import subprocess
import tempfile
import time
import zipfile

BIG_BYTES = 32 << 20
SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "netlab_server.py")


def _run(*args, **kw):
    return subprocess.run(list(args), check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          **kw)


def _wheel(path, name, version):
    """A minimal wheel: pip download only fetches it and reads its metadata."""
    dist = "%s-%s.dist-info" % (name, version)
    files = {
        name + "/__init__.py": b"VALUE = 42\n",
        dist + "/METADATA": ("Metadata-Version: 2.1\nName: %s\nVersion: %s\n" %
                             (name.replace("_", "-"), version)).encode(),
        dist + "/WHEEL": b"Wheel-Version: 1.0\nGenerator: airlock-test\nRoot-Is-Purelib: true\n"
                         b"Tag: py3-none-any\n",
    }
    record = []
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for n, data in files.items():
            z.writestr(n, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            record.append("%s,sha256=%s,%d" % (n, digest.decode(), len(data)))
        record.append(dist + "/RECORD,,")
        z.writestr(dist + "/RECORD", "\n".join(record) + "\n")
    with open(path, "wb") as f:
        f.write(buf.getvalue())


def _deb(root, name, version):
    """A one-file .deb and the flat repository's Packages index around it."""
    pkg = os.path.join(root, "pkg")
    os.makedirs(os.path.join(pkg, "DEBIAN"))
    os.makedirs(os.path.join(pkg, "usr/share/doc", name))
    with open(os.path.join(pkg, "usr/share/doc", name, "README"), "w") as f:
        f.write("airlock test package\n")
    with open(os.path.join(pkg, "DEBIAN/control"), "w") as f:
        f.write("Package: %s\nVersion: %s\nArchitecture: all\nMaintainer: airlock tests "
                "<tests@airlock.invalid>\nDescription: test package\n" % (name, version))
    repo = os.path.join(root, "www", "debian")
    os.makedirs(repo)
    deb = "%s_%s_all.deb" % (name, version)
    _run("dpkg-deb", "--root-owner-group", "-Zgzip", "-b", pkg, os.path.join(repo, deb))
    with open(os.path.join(repo, deb), "rb") as f:
        data = f.read()
    with open(os.path.join(repo, "Packages"), "w") as f:
        f.write("Package: %s\nVersion: %s\nArchitecture: all\nMaintainer: airlock tests "
                "<tests@airlock.invalid>\nFilename: ./%s\nSize: %d\nSHA256: %s\n"
                "Description: test package\n\n" %
                (name, version, deb, len(data), hashlib.sha256(data).hexdigest()))
    shutil.rmtree(pkg)


class NetLab:
    def __init__(self):
        tag = "%x" % (os.getpid() & 0xfff)
        self.ns = "alnet" + tag
        self.veth_host, self.veth_ns = "alh" + tag, "aln" + tag
        octet = 1 + (os.getpid() % 250)
        self.host_ip = "198.18.%d.1" % octet
        self.server_ip = "198.18.%d.2" % octet
        self.dir = tempfile.mkdtemp(prefix="airlock-netlab-")
        os.chmod(self.dir, 0o755)
        self.procs = []
        self.up = False

    def start(self):
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self):
        www = os.path.join(self.dir, "www")
        os.makedirs(os.path.join(www, "simple", "airlock-test-pkg"))
        with open(os.path.join(www, "hello.txt"), "w") as f:
            f.write("hello from the test internet\n")
        with open(os.path.join(www, "big.bin"), "wb") as f:
            f.write(os.urandom(BIG_BYTES))
        whl = "airlock_test_pkg-1.0-py3-none-any.whl"
        _wheel(os.path.join(www, "simple", "airlock-test-pkg", whl), "airlock_test_pkg", "1.0")
        with open(os.path.join(www, "simple", "airlock-test-pkg", "index.html"), "w") as f:
            f.write('<!DOCTYPE html><html><body><a href="%s">%s</a></body></html>\n' % (whl, whl))
        with open(os.path.join(www, "simple", "index.html"), "w") as f:
            f.write('<!DOCTYPE html><html><body><a href="airlock-test-pkg/">airlock-test-pkg'
                    '</a></body></html>\n')
        _deb(self.dir, "airlock-test", "1.0")
        # The CA the guest trusts for the test, and the server's certificate for secure.test.
        self.ca = os.path.join(self.dir, "ca.pem")
        key, csr, crt = (os.path.join(self.dir, n) for n in ("srv.key", "srv.csr", "srv.pem"))
        cakey = os.path.join(self.dir, "ca.key")
        _run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", cakey,
             "-out", self.ca, "-days", "2", "-subj", "/CN=airlock test CA")
        _run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr,
             "-subj", "/CN=secure.test")
        ext = os.path.join(self.dir, "ext.cnf")
        with open(ext, "w") as f:
            f.write("subjectAltName=DNS:secure.test,DNS:big.test,DNS:web.test\n")
        _run("openssl", "x509", "-req", "-in", csr, "-CA", self.ca, "-CAkey", cakey,
             "-CAcreateserial", "-out", crt, "-days", "2", "-extfile", ext)
        os.chmod(self.ca, 0o644)
        # The namespace and its link.
        _run("ip", "netns", "add", self.ns)
        self.up = True
        _run("ip", "link", "add", self.veth_host, "type", "veth", "peer", "name", self.veth_ns)
        _run("ip", "link", "set", self.veth_ns, "netns", self.ns)
        _run("ip", "addr", "add", self.host_ip + "/30", "dev", self.veth_host)
        _run("ip", "link", "set", self.veth_host, "up")
        _run("ip", "netns", "exec", self.ns, "ip", "addr", "add", self.server_ip + "/30", "dev",
             self.veth_ns)
        _run("ip", "netns", "exec", self.ns, "ip", "link", "set", self.veth_ns, "up")
        _run("ip", "netns", "exec", self.ns, "ip", "link", "set", "lo", "up")
        for port, tls in ((80, False), (443, True)):
            args = ["ip", "netns", "exec", self.ns, "python3", SERVER, self.server_ip, str(port),
                    www]
            if tls:
                args += [crt, key]
            self.procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL))
        for port in (80, 443):
            self._wait_port(self.server_ip, port)
        self.hosts = os.path.join(self.dir, "hosts")
        with open(self.hosts, "w") as f:
            for name in ("web.test", "secure.test", "pypi.test", "repo.test", "big.test",
                         "other.test", "sub.wild.test"):
                f.write("%s %s\n" % (self.server_ip, name))
            f.write("127.0.0.1 local.test\n10.1.2.3 ten.test\n169.254.169.254 meta.test\n"
                    "%s hostaddr.test\n" % self.host_ip)
        os.chmod(self.hosts, 0o644)

    @staticmethod
    def _wait_port(ip, port):
        deadline = time.time() + 20
        while True:
            try:
                socket.create_connection((ip, port), timeout=1).close()
                return
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self):
        for p in self.procs:
            p.kill()
            p.wait()
        self.procs = []
        if self.up:
            subprocess.run(["ip", "link", "del", self.veth_host], stderr=subprocess.DEVNULL)
            subprocess.run(["ip", "netns", "del", self.ns], stderr=subprocess.DEVNULL)
            self.up = False
        shutil.rmtree(self.dir, ignore_errors=True)

"""Network on request (orchestrator/session/net.c, guest-agent/egress.c): --net allow=... through the
session's own Squid, against a private internet in a network namespace (netlab.py). No traffic
leaves this machine: the proxy resolves names only through the lab's hosts file, and the guest
has no route anywhere but the proxy.

Needs root (network namespaces), squid, openssl, dpkg-deb, and the debian image (python, pip,
apt in the guest); the --net none and start-failure cases use tiny."""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import unittest

import altest
import netlab

DRIVER = sys.argv.pop(1) if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else ""

ALLOW = ("web.test,secure.test,*.wild.test,pypi.test,repo.test,local.test,ten.test,meta.test,"
         "hostaddr.test")

# Runs in the guest; prints one JSON object. Arguments: the lab's server address and the
# host's listener port.
GUEST = r'''
import fcntl, json, os, socket, ssl, struct, subprocess, sys, time, urllib.error, urllib.request
SERVER, HOSTPORT, HOSTADDR = sys.argv[1], int(sys.argv[2]), sys.argv[3]
R = {}
def get(url, **kw):
    try:
        with urllib.request.urlopen(url, timeout=40, **kw) as r:
            return [r.status, r.read().decode(errors="replace")[:200]]
    except urllib.error.HTTPError as e:
        return [e.code, e.read().decode(errors="replace")[:2000]]
    except Exception as e:
        return [0, repr(e)[:300]]
ctx = ssl.create_default_context(cafile="/tmp/ca.pem")
R["http"] = get("http://web.test/hello.txt")
R["https"] = get("https://secure.test/hello.txt", context=ctx)
R["wild"] = get("http://sub.wild.test/hello.txt")
R["other"] = get("http://other.test/hello.txt")
R["https_other"] = get("https://other.test/hello.txt", context=ctx)
for n in ("local", "ten", "meta", "hostaddr"):
    R[n] = get("http://%s.test/hello.txt" % n)
R["by_ip"] = get("http://%s/hello.txt" % SERVER)
def raw(data, timeout=40):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=timeout)
    t0 = time.time()
    out = b""
    try:
        s.sendall(data)
        while True:
            b = s.recv(65536)
            if not b:
                break
            out += b
    except Exception as e:
        out += b" EXC " + repr(e).encode()
    s.close()
    return [out[:300].decode(errors="replace"), round(time.time() - t0, 1)]
R["connect22"] = raw(b"CONNECT web.test:22 HTTP/1.1\r\nHost: web.test:22\r\n\r\n")
R["longline"] = raw(b"GET http://web.test/" + b"a" * (1 << 20) + b" HTTP/1.1\r\nHost: web.test\r\n\r\n")
# A slowloris: headers that never end, a line every second.
s = socket.create_connection(("127.0.0.1", 3128), timeout=60)
t0 = time.time()
s.sendall(b"GET http://web.test/hello.txt HTTP/1.1\r\nHost: web.test\r\n")
s.setblocking(False)
ended = None
for i in range(45):
    try:
        if s.recv(4096) == b"":
            ended = time.time() - t0
            break
    except BlockingIOError:
        pass
    except OSError:
        ended = time.time() - t0
        break
    try:
        s.send(b"X-Slow: %d\r\n" % i)
    except OSError:
        ended = time.time() - t0
        break
    time.sleep(1)
R["slowloris_ended_s"] = ended
R["alive"] = get("http://web.test/hello.txt")
# The connection cap (16 by default): 16 unfinished requests hold every tunnel, a 17th waits.
held = []
for i in range(16):
    c = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    c.sendall(b"GET http://web.test/hello.txt HTTP/1.1\r\nHost: web.test\r\n")
    held.append(c)
time.sleep(1)
t0 = time.time()
try:
    with urllib.request.urlopen("http://web.test/hello.txt", timeout=4) as r:
        R["over_cap"] = [r.status, round(time.time() - t0, 1)]
except Exception as e:
    R["over_cap"] = [0, repr(e)[:100]]
for c in held:
    c.close()
time.sleep(1)
R["after_cap"] = get("http://web.test/hello.txt")
# A hostile guest routes around the proxy: a default route to QEMU's gateway, then direct.
def route_default():
    sa = lambda a: struct.pack("HH4s8x", socket.AF_INET, 0, socket.inet_aton(a))
    rt = struct.pack("@L16s16s16sHhLPhPLLH", 0, sa("0.0.0.0"), sa("10.0.2.2"), sa("0.0.0.0"),
                     0x3, 0, 0, 0, 0, 0, 0, 0, 0)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        fcntl.ioctl(s, 0x890B, rt)
        return "ok"
    except OSError as e:
        return repr(e)
R["route"] = route_default()
def tcp(host, port):
    try:
        socket.create_connection((host, port), timeout=5).close()
        return "connected"
    except Exception as e:
        return repr(e)[:100]
R["tcp"] = {"server": tcp(SERVER, 80), "gateway_host_listener": tcp("10.0.2.2", HOSTPORT),
            "gateway_ssh": tcp("10.0.2.2", 22), "host_listener": tcp(HOSTADDR, HOSTPORT),
            "dns_server": tcp("10.0.2.3", 53)}
def udp(host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(3)
    try:
        s.sendto(b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x03web\x04test\x00\x00\x01\x00\x01", (host, port))
        return "answer " + repr(s.recvfrom(512)[0][:20])
    except Exception as e:
        return repr(e)[:100]
R["udp"] = {"slirp_dns": udp("10.0.2.3", 53), "host_listener": udp("10.0.2.2", HOSTPORT),
            "server": udp(SERVER, 53)}
def sh(cmd):
    p = subprocess.run(cmd, shell=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)
    return [p.returncode, p.stdout.decode(errors="replace")[-600:]]
R["pip"] = sh("cd /tmp && pip download --no-deps --disable-pip-version-check --index-url "
              "http://pypi.test/simple/ --trusted-host pypi.test airlock-test-pkg -d /tmp/pipdl && "
              "ls /tmp/pipdl")
R["apt"] = sh("mkdir -p /tmp/aptl/partial /tmp/aptdl && echo 'deb [trusted=yes] http://repo.test/debian ./' > /tmp/t.list && "
              "O='-o Dir::Etc::SourceList=/tmp/t.list -o Dir::Etc::SourceParts=/nonexistent -o Dir::State::Lists=/tmp/aptl -o APT::Sandbox::User=root' && "
              "apt-get $O update && cd /tmp/aptdl && apt-get $O download airlock-test && ls /tmp/aptdl")
print(json.dumps(R))
'''

CAP_GUEST = r'''
import json, ssl, urllib.error, urllib.request
R = {}
def get(url, **kw):
    n = 0
    try:
        with urllib.request.urlopen(url, timeout=60, **kw) as r:
            while True:
                b = r.read(65536)
                if not b:
                    break
                n += len(b)
            return [r.status, n, ""]
    except urllib.error.HTTPError as e:
        return [e.code, n, e.read().decode(errors="replace")[:2000]]
    except Exception as e:
        return [0, n, repr(e)[:300]]
ctx = ssl.create_default_context(cafile="/tmp/ca.pem")
R["http_big"] = get("http://big.test/big.bin")
R["https_big"] = get("https://big.test/big.bin", context=ctx)
R["after"] = get("http://big.test/hello.txt")
print(json.dumps(R))
'''


def squids_of(name):
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmd = f.read().replace(b"\0", b" ")
        except OSError:
            continue
        if b"squid" in cmd and name.encode() in cmd:
            found.append(pid)
    return found


# A guest program that fetches three times once the test says so (the other user is ready).
LOCAL_USER_GUEST = r"""
import json, sys, urllib.request
print("ready", flush=True)
sys.stdin.readline()
R = []
for i in range(3):
    try:
        with urllib.request.urlopen("http://web.test/hello.txt", timeout=60) as r:
            R.append([r.status, r.read().decode()])
    except Exception as e:
        R.append([0, repr(e)[:300]])
print(json.dumps(R), flush=True)
"""

# Another local user (run as nobody): arguments the forward's port, Squid's, its squid.conf.
LOCAL_USER = r"""
import json, socket, sys
fwd, squid, conf = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
R = {}
try:
    open(conf).read()
    R["conf"] = "read"
except OSError as e:
    R["conf"] = e.errno
def connect_many(port, n):  # as many of n connections as are taken
    got = []
    for i in range(n):
        try:
            got.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        except OSError:
            pass
    return got
tun = connect_many(fwd, 8)
R["tunnels"] = len(tun)
def drain(s, sink):  # reads to EOF into sink; what came before an error stays there
    while True:
        b = s.recv(65536)
        if not b:
            return
        sink += b
def ask(pre):
    try:
        s = socket.create_connection(("127.0.0.1", squid), timeout=15)
        s.sendall(pre + b"GET http://web.test/hello.txt HTTP/1.1\r\nHost: web.test\r\n\r\n")
        out = bytearray()
        drain(s, out)
        s.close()
        return out.decode(errors="replace")[:300]
    except OSError as e:
        return repr(e)
R["plain"] = ask(b"")
R["proxy_header"] = ask(b"PROXY TCP4 127.0.0.1 127.0.0.1 1024 3128\r\n")
held = connect_many(squid, 40)
R["held"] = len(held)
print(json.dumps(R), flush=True)
sys.stdin.readline()
got = bytearray()
for s in tun:
    s.settimeout(0.5)
    try:
        drain(s, got)
    except OSError:
        pass
print(json.dumps({"tunnel_bytes": got.decode(errors="replace")[:500]}), flush=True)
"""


class HostListener:
    """A TCP and a UDP socket on every host address: nothing from the guest may reach them."""

    def __init__(self):
        self.tcp = socket.socket()
        self.tcp.bind(("0.0.0.0", 0))
        self.tcp.listen(8)
        self.port = self.tcp.getsockname()[1]
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("0.0.0.0", self.port))
        self.got = []
        self.tcp.settimeout(0.2)
        self.udp.settimeout(0.2)
        self.stop = False
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.stop:
            try:
                c, a = self.tcp.accept()
                self.got.append(("tcp", a))
                c.close()
            except OSError:
                pass
            try:
                _, a = self.udp.recvfrom(512)
                self.got.append(("udp", a))
            except OSError:
                pass

    def close(self):
        self.stop = True
        self.t.join()
        self.tcp.close()
        self.udp.close()


@unittest.skipUnless(os.geteuid() == 0, "needs root for network namespaces")
class NetTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not os.path.isdir(os.path.join(altest.IMAGE_DIR, "debian")):
            raise unittest.SkipTest("the debian image is not built")
        cls.lab = netlab.NetLab().start()
        cls.env = {"AIRLOCK_NET_HOSTS_FILE": cls.lab.hosts}

    @classmethod
    def tearDownClass(cls):
        cls.lab.stop()

    def exec_net(self, args, code_args, code, extra=()):
        r = altest.run(["--debug", "exec", "--image", "debian", "--put",
                        self.lab.ca + ":/tmp/ca.pem"] + list(extra) + args +
                       ["--", "python3", "-c", code] + code_args, env=self.env, timeout=600)
        err = altest.strip_notices(r.stderr).decode(errors="replace")
        names = altest.session_names(r.stderr)
        self.assertTrue(names, err[-3000:])
        name = names[0].decode()
        # Squid went with the session: no process, no dir.
        self.assertEqual(squids_of(name), [], name)
        self.assertFalse(os.path.exists(os.path.join(altest.runtime_sessions_dir(), name)))
        self.assertEqual(r.returncode, 0, err[-3000:])
        out = r.stdout.decode(errors="replace")
        return json.loads(out.strip().splitlines()[-1]), err

    def test_allowed_denied_and_confined(self):
        hl = HostListener()
        self.addCleanup(hl.close)
        R, err = self.exec_net(["--net", "allow=" + ALLOW],
                               [self.lab.server_ip, str(hl.port), self.lab.host_ip], GUEST)
        dump = json.dumps(R, indent=1) + "\n" + err[-4000:]
        hello = "hello from the test internet\n"
        # Allowed names, over HTTP and HTTPS (CONNECT, the guest checks the lab's CA), and by
        # *.suffix.
        self.assertEqual(R["http"], [200, hello], dump)
        self.assertEqual(R["https"], [200, hello], dump)
        self.assertEqual(R["wild"], [200, hello], dump)
        # Not on the list: refused, and said so on the host with what to do.
        self.assertEqual(R["other"][0], 403, dump)
        self.assertIn("403", R["https_other"][1], dump)
        self.assertIn("airlock: blocked: host other.test is not in the allowlist; ask the user "
                      "to allow it", err)
        self.assertEqual(R["by_ip"][0], 403, dump)  # no reverse lookup to an allowed name
        # Allowed names that resolve to loopback, private, metadata or the host's address.
        for n in ("local", "ten", "meta", "hostaddr"):
            self.assertEqual(R[n][0], 403, (n, dump))
            self.assertIn("blocked: host %s.test resolves to an address the proxy does not "
                          "reach" % n, err)
        # Bad input: CONNECT to ssh, a 1 MB request line, a slowloris; the proxy lives on.
        self.assertTrue(R["connect22"][0].startswith("HTTP/1.1 403"), dump)
        self.assertIn("port 22 is not allowed", err)
        self.assertRegex(R["longline"][0], r"^HTTP/1\.1 4\d\d|EXC", dump)
        self.assertIn("the proxy refused a malformed, oversized or unfinished request", err)
        self.assertIn("the proxy refused a malformed, oversized or unfinished request", err)
        self.assertIsNotNone(R["slowloris_ended_s"], dump)
        self.assertLess(R["slowloris_ended_s"], 40, dump)
        self.assertEqual(R["alive"], [200, hello], dump)
        # Connections at once: a 17th waits while 16 are held, and goes once they close.
        self.assertEqual(R["over_cap"][0], 0, dump)
        self.assertIn("timed out", R["over_cap"][1], dump)
        self.assertEqual(R["after_cap"], [200, hello], dump)
        # No way around the proxy, even with a route: TCP and UDP to the lab by address, to
        # QEMU's gateway and DNS, to the host's own address.
        self.assertEqual(R["route"], "ok", dump)
        for k, v in R["tcp"].items():
            self.assertNotEqual(v, "connected", (k, dump))
        for k, v in R["udp"].items():
            self.assertFalse(v.startswith("answer"), (k, dump))
        self.assertEqual(hl.got, [], dump)
        # Package managers through the proxy.
        self.assertEqual(R["pip"][0], 0, dump)
        self.assertIn("airlock_test_pkg-1.0-py3-none-any.whl", R["pip"][1], dump)
        self.assertEqual(R["apt"][0], 0, dump)
        self.assertIn("airlock-test_1.0_all.deb", R["apt"][1], dump)
        # --debug lists each request the proxy served.
        self.assertRegex(err, r"airlock: net: GET web\.test:80 200 \d+ bytes")
        self.assertRegex(err, r"airlock: net: CONNECT secure\.test:443 200 \d+ bytes")

    def test_byte_cap_stops_a_large_download(self):
        cap = 4000000
        R, err = self.exec_net(["--net", "allow=big.test", "--net-limit", str(cap)], [],
                               CAP_GUEST)
        dump = json.dumps(R, indent=1) + "\n" + err[-3000:]
        # Over plain HTTP the proxy refuses the reply up front (its length is known)...
        self.assertEqual(R["http_big"][0], 403, dump)
        self.assertLess(R["http_big"][1], 1 << 20, dump)
        self.assertIn("exceeds the session's byte cap", err)
        # ...over HTTPS the relay's count stops it mid-way: the hard cap (python's reader may
        # call the cut-off body complete; what matters is what came through).
        self.assertLess(R["https_big"][1], cap, dump)
        self.assertIn("blocked: the session's network byte cap (%d bytes) is used up" % cap, err)
        # And every later request gets the same answer.
        self.assertEqual(R["after"][0], 403, dump)
        self.assertIn("byte cap is used up", R["after"][2], dump)

    @unittest.skipUnless(DRIVER, "needs the checkpoint driver (run through meson)")
    def test_rollback_keeps_the_network_and_the_library_lists_requests(self):
        env = dict(os.environ, CHECKPOINT_DRIVER_NET="web.test", **self.env)
        p = subprocess.Popen([DRIVER, "debian"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             env=env)
        self.addCleanup(lambda: (p.poll() is None and p.kill(), p.wait()))
        name = json.loads(p.stdout.readline())["session"]
        net_dir = os.path.join(altest.runtime_sessions_dir(), name, "net")
        with open(os.path.join(net_dir, "squid.conf")) as f:
            port = int(re.search(r"^http_port 127\.0\.0\.1:(\d+)", f.read(), re.M).group(1))
        st = os.stat(net_dir)
        if os.geteuid() == 0:  # Squid runs as the proxy user, in a dir of its own
            import pwd
            self.assertEqual(pwd.getpwuid(st.st_uid).pw_name, "proxy")
            self.assertTrue(all(pwd.getpwuid(int(open("/proc/%s/status" % pid).read().split(
                "Uid:")[1].split()[0])).pw_name == "proxy" for pid in squids_of(name)))

        def call(req):
            p.stdin.write((json.dumps(req) + "\n").encode())
            p.stdin.flush()
            return json.loads(p.stdout.readline())

        get = ("python3 -c 'import sys, urllib.request\n"
               "try:\n print(urllib.request.urlopen(sys.argv[1], timeout=30).status)\n"
               "except Exception as e:\n print(getattr(e, \"code\", 0), repr(e))' ")
        out = call({"op": "exec", "code": get + "http://web.test/hello.txt"})
        self.assertEqual(out["stdout"].strip(), "200", out)
        self.assertGreater(call({"op": "create", "name": "before"})["r"], 0)
        out = call({"op": "exec", "code": get + "http://other.test/hello.txt"})
        self.assertEqual(out["stdout"].split()[0], "403", out)
        self.assertEqual(call({"op": "rollback", "id": 1})["r"], 0)
        # The relay's tunnels from before the rollback are stale: new ones carry the request.
        out = call({"op": "exec", "code": get + "http://web.test/hello.txt", "timeout": 60000})
        self.assertEqual(out["stdout"].strip(), "200", out)
        reqs = call({"op": "net"})["requests"]
        self.assertIn({"method": "GET", "host": "web.test", "port": 80, "status": 200,
                       "allowed": True, "why": ""},
                      [{k: v for k, v in q.items() if k != "bytes"} for q in reqs])
        denied = [q for q in reqs if not q["allowed"]]
        self.assertEqual([(q["host"], q["why"]) for q in denied],
                         [("other.test", "host other.test is not in the allowlist; ask the user "
                                         "to allow it")], reqs)
        p.stdin.close()
        self.assertEqual(p.wait(timeout=60), 0)
        # Nothing left: no Squid, no dir, its port closed.
        self.assertEqual(squids_of(name), [])
        self.assertFalse(os.path.exists(net_dir))
        with self.assertRaises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()

    def test_chat_tells_the_user_and_the_model_and_lists_requests(self):
        from test_chat import FakeModel, execute, tool_results
        fm = FakeModel([
            {"tool_calls": [execute("wget -q -O - http://web.test/hello.txt; "
                                    "wget -q -O - http://other.test/hello.txt; echo done",
                                    id="call_N")]},
            {"text": "I need other.test; please allow it."},
        ])
        self.addCleanup(fm.close)
        env = dict(fm.env, **self.env)
        pdir = os.path.join(env["XDG_CONFIG_HOME"], "airlock", "profiles")
        os.makedirs(pdir)
        with open(os.path.join(pdir, "lab.yaml"), "w") as f:
            f.write("net-preset-lab: web.test, *.wild.test\nnet: lab\n")
        r = altest.run(["chat", "--plain", "-y", "--profile", "lab"] + fm.args(),
                       input=b"fetch both\n%net\n", env=env)
        out = (r.stdout + r.stderr).decode(errors="replace")
        self.assertEqual(r.returncode, 0, out)
        system = fm.requests()[0]["body"]["messages"][0]["content"]
        self.assertIn("The VM reaches only these hosts", system)
        self.assertIn("web.test, *.wild.test", system)
        self.assertNotIn("no network access", system)
        result = tool_results(fm.requests()[1])[0]["content"]
        self.assertIn("hello from the test internet", result)
        self.assertIn("blocked: host other.test is not in the allowlist; ask the user to allow "
                      "it", result)
        self.assertIn("blocked: host other.test is not in the allowlist", out)  # the user's
        self.assertRegex(out, r"GET +web\.test:80 allowed \d+ bytes")
        self.assertRegex(out, r"GET +other\.test:80 BLOCKED \d+ bytes: host other\.test is "
                              r"not in the allowlist")

    def test_the_proxy_of_a_killed_session_goes_and_gc_cleans_up(self):
        p = altest.popen(["--debug", "exec", "--image", "tiny", "--net", "allow=web.test", "--",
                          "sleep", "120"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         env=dict(os.environ, **self.env))
        self.addCleanup(lambda: (p.poll() is None and p.kill(), p.wait(), p.stderr.close()))
        name = None
        for line in p.stderr:
            m = altest.session_names(line)
            if m:
                name = m[0].decode()
                break
        self.assertIsNotNone(name)
        self.assertTrue(squids_of(name))
        p.kill()  # no cleanup of airlock's own: libvirtd ends the VM, the keeper ends Squid
        p.wait()
        for _ in range(100):
            if not squids_of(name):
                break
            time.sleep(0.1)
        self.assertEqual(squids_of(name), [])
        # gc removes what is left (and kills a Squid whose keeper was killed too).
        r = altest.run(["gc"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertFalse(os.path.exists(os.path.join(altest.runtime_sessions_dir(), name)))

    def test_another_local_user_reaches_neither_the_tunnels_nor_the_proxy(self):
        # issue 29, 2 and 3: a local user who finds the QEMU forward's port (it is on QEMU's
        # command line) and the session's Squid port opens connections to both while the guest
        # is about to fetch: the guest's requests go through the host's own tunnels all the same,
        # none of them reaches that user, Squid serves that user nothing, and 40 connections held
        # to it do not cut the guest off.
        if not shutil.which("setpriv"):
            self.skipTest("needs setpriv to act as another user")
        p = altest.popen(["--debug", "exec", "--image", "debian", "--net", "allow=web.test",
                          "--", "python3", "-c", LOCAL_USER_GUEST],
                         env=dict(os.environ, **self.env), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        err = []
        t = threading.Thread(target=lambda: err.append(p.stderr.read()), daemon=True)
        t.start()
        attacker = None
        try:
            self.assertEqual(p.stdout.readline(), b"ready\n")
            fwd = squid = None
            for pid in os.listdir("/proc"):
                try:
                    with open("/proc/%s/cmdline" % pid, "rb") as f:
                        cmd = f.read().replace(b"\0", b" ")
                except OSError:
                    continue
                m = re.search(rb"hostfwd=tcp:127\.0\.0\.1:(\d+)-:3129", cmd)
                if m and b"qemu" in cmd:
                    fwd = int(m.group(1))
                    name = re.search(rb"guest=(airlock-[0-9a-f]+)", cmd).group(1).decode()
            self.assertIsNotNone(fwd, "no QEMU with the network forward")
            net = os.path.join(altest.runtime_sessions_dir(), name, "net")
            conf = os.path.join(net, "squid.conf")
            with open(conf) as f:
                squid = int(re.search(r"http_port 127\.0\.0\.1:(\d+)", f.read()).group(1))
            self.assertEqual(os.stat(net).st_mode & 0o777, 0o700)
            self.assertEqual(os.stat(conf).st_mode & 0o777, 0o600)
            attacker = subprocess.Popen(
                ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                 sys.executable, "-c", LOCAL_USER, str(fwd), str(squid), conf],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            seen = json.loads(attacker.stdout.readline() or b"{}")
            if not seen:
                attacker.kill()
                self.fail(attacker.stderr.read()[-2000:])
            p.stdin.write(b"go\n")
            p.stdin.flush()
            line = p.stdout.readline()
            attacker.stdin.write(b"done\n")
            attacker.stdin.flush()
            got = json.loads(attacker.stdout.readline() or b"{}")
            attacker.wait(timeout=60)
            p.stdin.close()
            self.assertEqual(p.wait(timeout=300), 0)
        finally:
            for q in (p, attacker):
                if q and q.poll() is None:
                    q.kill()
                    q.wait()
            t.join(timeout=30)
            for q in (p, attacker):
                for f in (q.stdin, q.stdout, q.stderr) if q else ():
                    f.close()
        dump = "%s\n%s\n%s\n%s" % (line, seen, got, (err or [b""])[0].decode(errors="replace")[-3000:])
        hello = "hello from the test internet\n"
        self.assertEqual(json.loads(line), [[200, hello]] * 3, dump)
        self.assertEqual(seen["conf"], 13, dump)  # EACCES
        self.assertEqual(seen["tunnels"], 8, dump)  # QEMU took its connections...
        self.assertEqual(got["tunnel_bytes"], "", dump)  # ...which carried nothing of the guest's
        self.assertNotIn("hello", seen["plain"], dump)
        self.assertNotIn("hello", seen["proxy_header"], dump)
        self.assertEqual(seen["held"], 40, dump)
        # The session's requests are the guest's three; the other user's leave no line there.
        log = (err or [b""])[0].decode(errors="replace")
        self.assertEqual(len(re.findall(r"airlock: net: GET web\.test:80 200 ", log)), 3, dump)
        self.assertNotIn("airlock: net: GET web.test:80 403", log, dump)
        self.assertNotIn("blocked:", log, dump)

    def test_net_none_has_no_nic(self):
        r = altest.run(["exec", "--image", "tiny", "--net", "none", "--", "ls", "/sys/class/net"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), [b"lo"])
        # The default is the same.
        r = altest.run(["exec", "--image", "tiny", "--", "ls", "/sys/class/net"])
        self.assertEqual(r.stdout.split(), [b"lo"])

    def test_a_proxy_that_cannot_start_is_one_clear_line(self):
        # A squid that refuses to start, first in PATH.
        import tempfile
        d = tempfile.mkdtemp(prefix="airlock-fakesquid-")
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", d]))
        with open(os.path.join(d, "squid"), "w") as f:
            f.write("#!/bin/sh\necho 'FATAL: this squid refuses to start' >&2\nexit 1\n")
        os.chmod(os.path.join(d, "squid"), 0o755)
        env = dict(self.env, PATH=d + ":" + os.environ["PATH"])
        r = altest.run(["exec", "--image", "tiny", "--net", "allow=web.test", "--", "true"],
                       env=env)
        self.assertEqual(r.returncode, 125)
        lines = altest.strip_notices(r.stderr).decode().splitlines()
        self.assertEqual(len(lines), 1, lines)
        self.assertEqual(lines[0], "airlock: the network proxy (squid) did not start: FATAL: this "
                                   "squid refuses to start")

    def test_bad_allowlists_are_usage_errors(self):
        for spec in ("allow=", "allow=a b", "allow=../x", "sometimes", "allow=*.", "allow=a..b"):
            r = altest.run(["exec", "--image", "tiny", "--net", spec, "--", "true"])
            self.assertEqual(r.returncode, 2, (spec, r.stderr))
            self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)


if __name__ == "__main__":
    altest.main()

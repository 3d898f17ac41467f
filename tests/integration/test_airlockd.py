"""airlockd against real libvirt and real guests, through the Python client (clients/python).

One daemon for the class (unix socket and TCP with API keys); the guest checks share one
session to save boots. Environment: AIRLOCKD_BIN and the usual integration variables.
"""
import atexit
import base64
import glob
import hashlib
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import tempfile
import termios
import threading
import time
import unittest

import altest
from airlock import APIError, Client, Run, Sandbox, TimeoutException

AIRLOCKD = os.environ.get("AIRLOCKD_BIN", "airlockd")
NOBODY = 65534


class Daemon:
    def __init__(self, env=None, lines=(), popen=None, **conf):
        """conf: the config's keys; lines: more config lines (keys that repeat); env: variables
        for the daemon alone; popen: more arguments for its subprocess.Popen."""
        self.dir = tempfile.mkdtemp(prefix="airlockd-test-")
        os.chmod(self.dir, 0o755)
        # Gone with the test's process at the latest (many cases stop() and read the log).
        atexit.register(shutil.rmtree, self.dir, True)
        self.sock = os.path.join(self.dir, "airlockd.sock")
        c = {
            "socket": self.sock,
            "socket_mode": "0666",
            "tcp": "127.0.0.1:0",
            # the daemon's own dir: it makes it 0700 (the socket's dir stays 0755 for nobody)
            "keys_db": os.path.join(self.dir, "store", "keys.db"),
            "spool_dir": os.path.join(self.dir, "store", "spool"),
            "heartbeat_s": 1,
            "connection_timeout_s": 4,
            "run_buffer_bytes": 262144,
            "max_upload_bytes": 8 << 20,
            "max_body_bytes": 65536,
            # SIGTERM ends the sessions (test_restart.py tests the default, keeping them)
            "keep_sessions": "false",
        }
        c.update(conf)
        self.conf = os.path.join(self.dir, "airlockd.conf")
        with open(self.conf, "w") as f:
            f.write("# test config\n")
            for k, v in c.items():
                f.write("%s = %s\n" % (k, v))
            for line in lines:
                f.write(line + "\n")
        self.log_path = os.path.join(self.dir, "log")
        self.log = open(self.log_path, "w+")
        e = dict(os.environ)
        e["AIRLOCK_IMAGE_DIR"] = altest.IMAGE_DIR
        e.update(env or {})
        # Under ASan, freed memory would sit in its quarantine and read as growth.
        e["ASAN_OPTIONS"] = ":".join(x for x in [e.get("ASAN_OPTIONS", ""),
                                                  "quarantine_size_mb=0"] if x)
        self.p = subprocess.Popen([AIRLOCKD, "--config", self.conf], stdout=subprocess.DEVNULL,
                                  stderr=self.log, env=e, **(popen or {}))
        self.port = None
        deadline = time.time() + 30
        while time.time() < deadline:
            text = self.text()
            for line in text.splitlines():
                if "listening on http" in line:
                    self.port = int(line.rsplit(" ", 1)[1])
            if "airlockd: ready" in text:
                break
            if self.p.poll() is not None:
                raise RuntimeError("airlockd exited: " + text)
            time.sleep(0.05)
        else:
            self.p.kill()
            self.p.wait()
            raise RuntimeError("airlockd did not get ready: " + self.text())

    def key(self, name, *args):
        out = subprocess.run([AIRLOCKD, "--config", self.conf, "key", "add", name] + list(args),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=True)
        return out.stdout.decode().strip()

    def revoke(self, token):
        kid = token.split("_")[1]
        subprocess.run([AIRLOCKD, "--config", self.conf, "key", "revoke", kid], check=True,
                       stderr=subprocess.DEVNULL)

    def unix(self):
        return Client("unix:" + self.sock)

    def tcp(self, key=None):
        return Client("http://127.0.0.1:%d" % self.port, api_key=key or "")

    def rss_kib(self):
        with open("/proc/%d/status" % self.p.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def stop(self, sig=signal.SIGTERM, timeout=120):
        if self.p.poll() is None:
            self.p.send_signal(sig)
        rc = self.p.wait(timeout=timeout)
        self.log.close()
        return rc

    def stop_and_remove(self):
        """stop(), then its directory goes; stop's status."""
        rc = self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
        return rc

    def text(self):
        with open(self.log_path) as f:
            return f.read()


def raw(port, data, read=True, timeout=10):
    """Sends bytes over TCP; returns what came back."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        if not read:
            return b""
        out = b""
        while True:
            try:
                b = s.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not b:
                break
            out += b
        return out
    finally:
        s.close()


def status_of(resp):
    return int(resp.split(b" ", 2)[1]) if resp.startswith(b"HTTP/1.") else 0


def domain_gone(name):
    return name not in altest.virsh_names()


class AirlockdTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon()
        try:
            cls.key_a = cls.d.key("alice")
            cls.key_b = cls.d.key("bob")
            cls.a = cls.d.tcp(cls.key_a)
            cls.sb = Sandbox(client=cls.a, labels={"test": "airlockd"})
        except BaseException:  # tearDownClass does not run: stop the daemon here
            cls.d.stop()
            shutil.rmtree(cls.d.dir, ignore_errors=True)
            raise

    @classmethod
    def tearDownClass(cls):
        # SIGTERM with sessions open: every domain goes, the daemon exits 0.
        names = [s["id"] for s in cls.a.sessions()]
        rc = cls.d.stop()
        left = [n for n in names if not domain_gone(n)]
        log = cls.d.text()[-3000:]
        shutil.rmtree(cls.d.dir, ignore_errors=True)
        if rc != 0 or left:
            raise AssertionError("SIGTERM: exit %d, domains left %s\n%s" % (rc, left, log))

    # ---- auth ----

    def test_tcp_needs_a_valid_key(self):
        with self.assertRaises(APIError) as e:
            self.d.tcp().sessions()
        self.assertEqual(e.exception.status, 401)
        for bad in ["alk_000000000000_" + "0" * 48, self.key_a[:-1] + "x", "garbage", ""]:
            with self.assertRaises(APIError) as e:
                Client("http://127.0.0.1:%d" % self.d.port, api_key=bad or " ").sessions()
            self.assertEqual(e.exception.status, 401, bad)
        self.assertEqual(self.d.tcp().health()["status"], "ok")
        temp = self.d.key("temp")
        self.assertEqual(self.d.tcp(temp).sessions(), [])
        self.d.revoke(temp)
        with self.assertRaises(APIError) as e:
            self.d.tcp(temp).sessions()
        self.assertEqual(e.exception.status, 401)

    def _as_nobody(self):
        """What uid nobody gets from the socket: "EACCES", or the HTTP status line's code."""
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(r)
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.settimeout(20)
                try:
                    s.connect(self.d.sock)
                except PermissionError:
                    os.write(w, b"EACCES")
                    os._exit(0)
                s.sendall(b"GET /v1/sessions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                os.write(w, str(status_of(s.recv(100))).encode())
            finally:
                os._exit(0)
        os.close(w)
        out = os.read(r, 100).decode()
        os.close(r)
        os.waitpid(pid, 0)
        return out

    def test_unix_socket_peer_and_mode(self):
        # Mode 0666 lets nobody connect; the peer uid check refuses it.
        self.assertEqual(self._as_nobody(), "403")
        os.chmod(self.d.sock, 0o600)
        try:
            self.assertEqual(self._as_nobody(), "EACCES")
        finally:
            os.chmod(self.d.sock, 0o666)
        # Our own uid is allowed, and sees only its own sessions (none: the class's are alice's).
        self.assertEqual(self.d.unix().sessions(), [])

    def test_keys_do_not_see_each_other(self):
        b = self.d.tcp(self.key_b)
        self.assertEqual(b.sessions(), [])
        self.assertIn(self.sb.id, [s["id"] for s in self.a.sessions()])
        path = "/v1/sessions/" + self.sb.id
        for method, p, body in [("GET", path, None), ("DELETE", path, None),
                                ("POST", path + "/runs", {"argv": ["true"]}),
                                ("GET", path + "/files?path=/etc/passwd", None),
                                ("POST", path + "/extend", {"seconds": 10})]:
            with self.assertRaises(APIError) as e:
                b.request(method, p, body=body)
            self.assertEqual(e.exception.status, 404, (method, p))
        self.assertEqual(self.sb.refresh()["id"], self.sb.id)

    def test_start_log_says_where_the_web_page_is(self):
        text = self.d.text()
        self.assertIn("web page: http://127.0.0.1:%d/" % self.d.port, text)
        self.assertIn("'ssh -L 8470:%s " % self.d.sock, text)

    def test_trailing_slash_is_the_same_path(self):
        ids = sorted(s["id"] for s in self.a.sessions())
        self.assertIn(self.sb.id, ids)
        self.assertEqual(sorted(s["id"] for s in self.a.request("GET", "/v1/sessions/")
                                ["sessions"]), ids)
        self.assertEqual(self.a.request("GET", "/v1/sessions/%s/" % self.sb.id)["id"],
                         self.sb.id)
        # ...but only one slash, and never an empty id.
        for p in ["/v1/sessions//", "/v1/sessions//%s" % self.sb.id]:
            with self.assertRaises(APIError) as e:
                self.a.request("GET", p)
            self.assertEqual(e.exception.status, 404, p)

    # ---- malformed requests ----

    def test_malformed_requests_get_clear_4xx(self):
        base = b"Host: x\r\nAuthorization: Bearer " + self.key_a.encode() + b"\r\n"
        cases = [
            (b"POST /v1/sessions HTTP/1.1\r\n" + base +
             b"Content-Type: application/json\r\nContent-Length: 5\r\n\r\n{bad!", 400),
            (b"POST /v1/sessions HTTP/1.1\r\n" + base +
             b"Content-Type: text/plain\r\nContent-Length: 2\r\n\r\n{}", 415),
            (b"POST /v1/sessions HTTP/1.1\r\n" + base +
             b"Content-Type: application/json\r\nContent-Length: 3\r\n\r\n[1]", 400),
            (b"POST /v1/sessions HTTP/1.1\r\n" + base +
             b"Content-Type: application/json\r\nContent-Length: 100000000\r\n\r\n{", 413),
            (b"GET /v1/nothing HTTP/1.1\r\n" + base + b"\r\n", 404),
            (b"PATCH /v1/sessions HTTP/1.1\r\n" + base + b"\r\n", 405),
            (b"GET /v1/sessions/..%2f..%2fetc HTTP/1.1\r\n" + base + b"\r\n", 404),
            (b"GET /v1/sessions HTTP/1.1\r\n" + base + b"X-Big: " + b"a" * 200000 + b"\r\n\r\n",
             None),
        ]
        for req, want in cases:
            resp = raw(self.d.port, req)
            st = status_of(resp)
            if want is None:
                self.assertTrue(400 <= st < 500, resp[:200])
            else:
                self.assertEqual(st, want, resp[:300])
            if want in (400, 404, 405, 413, 415):
                body = resp.split(b"\r\n\r\n", 1)[1]
                self.assertIn(b'"error"', body, resp[:300])
        # Wrong types in a create are refused before anything boots.
        for body in [{"memory_mib": "x"}, {"vcpus": 99}, {"image": "../etc"},
                     {"image": "no-such-image"}, {"labels": [1]}, {"lifetime_s": -1},
                     {"labels": {"k": "v" * 500}}, {"memory_mib": 1.5}]:
            with self.assertRaises(APIError) as e:
                self.a.request("POST", "/v1/sessions", body=body)
            self.assertEqual(e.exception.status, 400, body)
        self.assertEqual(self.a.health()["status"], "ok")

    def test_fuzzed_bodies(self):
        rnd = random.Random(14)
        seeds = [b'{"argv":["echo","x"],"timeout_s":5}', b'{"signal":"INT"}', b'{"seconds":3}',
                 b'{"code":"print(1)","language":"python","env":{"A":"b"}}']
        paths = ["/v1/sessions/no-such/runs", "/v1/sessions/no-such/extend",
                 "/v1/sessions/%s/runs/r999/signal" % self.sb.id,
                 "/v1/sessions/%s/extend" % self.sb.id]
        for i in range(1000):
            b = bytearray(rnd.choice(seeds))
            for _ in range(rnd.randint(1, 6)):
                op = rnd.randint(0, 2)
                pos = rnd.randint(0, len(b))
                if op == 0:
                    b[pos:pos] = bytes([rnd.randint(0, 255)])
                elif op == 1 and b:
                    del b[min(pos, len(b) - 1)]
                else:
                    b[pos:pos] = rnd.choice([b"{", b"}", b'"', b"[", b"-1", b"1e999", b"null",
                                             b"\\u0000", b"99999999999"])
            path = rnd.choice(paths)
            c, r = self.a.open("POST", path, body=bytes(b),
                               headers={"Content-Type": "application/json"})
            data = r.read()
            c.close()
            # 2xx only for an extend that happens to parse; never a 5xx; every error is JSON.
            self.assertLess(r.status, 500, (path, bytes(b), data))
            if r.status >= 400:
                self.assertIn("error", json.loads(data), data)
        self.assertEqual(self.a.health()["status"], "ok")

    def test_slowloris_is_cut(self):
        s = socket.create_connection(("127.0.0.1", self.d.port), timeout=30)
        try:
            s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n")
            t0 = time.time()
            self.assertEqual(self.a.health()["status"], "ok")
            got = s.recv(100)  # the daemon closes it (connection_timeout_s = 4)
            self.assertEqual(got, b"")
            self.assertLess(time.time() - t0, 15)
        finally:
            s.close()

    # ---- runs ----

    def test_exec_output_and_exit(self):
        r = self.sb.commands.run("echo hi; echo err >&2; exit 3", env={"X": "1"})
        self.assertEqual((r.stdout, r.stderr, r.exit_code), ("hi\n", "err\n", 3))
        r = self.sb.commands.run(["sh", "-c", 'echo "$X" "$PWD"'], env={"X": "y"}, cwd="/tmp")
        self.assertEqual(r.stdout, "y /tmp\n")
        r = self.sb.commands.run("cat", stdin="from stdin")
        self.assertEqual(r.stdout, "from stdin")
        seen = []
        ex = self.sb.run_code("echo $((40 + 2)); echo oops >&2", language="sh",
                              on_stdout=seen.append)
        self.assertEqual((ex.stdout, ex.stderr, ex.exit_code), ("42\n", "oops\n", 0))
        self.assertEqual("".join(seen), "42\n")
        r = self.sb.commands.run(["/no/such/program"])
        self.assertIsNotNone(r.error)
        self.assertEqual(r.error["code"], "not_found")

    def test_session_metrics_are_the_hosts(self):
        # what the VM used, from the host's counters: a busy guest shows as CPU time the host
        # measured; another key's session is 404 as for none
        idle = self.sb.metrics()[-1]
        self.assertGreaterEqual(idle["cpu_count"], 1)
        self.assertGreater(idle["mem_total"], 32 << 20)
        self.assertGreater(idle["mem_used"], 0)
        time.sleep(1.1)
        self.sb.commands.run("timeout 3 sh -c 'while :; do :; done'; true")
        busy = self.sb.metrics()[-1]
        self.assertGreater(busy["cpu_used_pct"], idle["cpu_used_pct"])
        self.assertGreater(busy["cpu_used_pct"], 10)
        self.assertGreater(busy["timestamp"], idle["timestamp"])
        self.assertEqual(self.sb.metrics(end=time.time() - 3600), [])
        with self.assertRaises(APIError) as e:
            self.d.tcp(self.key_b).request("GET", "/v1/sessions/%s/metrics" % self.sb.id)
        self.assertEqual(e.exception.status, 404)

    def test_stream_resumes_exactly_once(self):
        n = 60
        run = self.sb.commands.start(
            'i=1; while [ $i -le %d ]; do echo $i; i=$((i+1)); sleep 0.02; done' % n)
        seen, ids = [], []
        for ev in run.events():
            ids.append(ev.id)
            if ev.type == "output":
                seen.append(ev.bytes)
            if len(seen) >= 10:
                break  # drop the connection mid-stream
        self.assertEqual(run.last_event_id, ids[-1])
        time.sleep(0.5)
        for ev in run.events():  # Last-Event-ID: the last one we got
            ids.append(ev.id)
            if ev.type == "output":
                seen.append(ev.bytes)
        self.assertEqual(ids, list(range(1, len(ids) + 1)))  # no gap, no duplicate
        self.assertEqual(b"".join(seen).decode().split(), [str(i) for i in range(1, n + 1)])
        # A reader from the start gets the same again while the buffer holds it.
        again = [ev.id for ev in run.events(last_event_id=0)]
        self.assertEqual(again, ids)

    def test_heartbeats(self):
        run = self.sb.commands.start("sleep 3; echo done")
        c, r = self.a.open("GET", "/v1/sessions/%s/runs/%s/events" % (self.sb.id, run.id))
        body = r.read().decode()
        c.close()
        self.assertIn(": heartbeat", body)
        self.assertIn("event: exit", body)

    def test_stdin_and_signals(self):
        run = self.sb.commands.start("cat", stdin_open=True)
        run.send_stdin("abc")
        run.send_stdin(b"def", eof=True)
        out = b"".join(e.bytes for e in run.events() if e.type == "output")
        self.assertEqual(out, b"abcdef")
        run = self.sb.commands.start(["sleep", "100"])
        time.sleep(1.5)
        run.signal("INT")
        res = run.wait(timeout=60)["result"]
        self.assertTrue(res["interrupted"], res)
        self.assertEqual((res["how"], res["value"]), ("signaled", signal.SIGINT))
        with self.assertRaises(APIError) as e:
            run.signal("INT")
        self.assertEqual(e.exception.status, 409)
        run = self.sb.commands.start(["sleep", "100"])
        time.sleep(1.5)
        run.signal("KILL")
        res = run.wait(timeout=60)["result"]
        self.assertEqual(res["type"], "error")
        self.assertEqual(res["code"], "cancelled")
        self.assertEqual(self.sb.commands.run("echo still").stdout, "still\n")

    def test_slow_reader_keeps_memory_bounded(self):
        # A flood nobody reads: the buffer fills, the guest's writer blocks, the daemon's RSS
        # stays put.
        run = self.sb.commands.start("yes xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx")
        try:
            time.sleep(3)
            r1 = self.d.rss_kib()
            e1 = run.get()["events"]
            time.sleep(4)
            r2 = self.d.rss_kib()
            e2 = run.get()["events"]
            # 256 KiB of buffer is 3 or 4 events of 64 KiB: the run is held, not dropping
            self.assertLess(e2 - e1, 8, (e1, e2))
            self.assertLess(r2 - r1, 8192, (r1, r2))
            # A slow reader gets events, in order, and the run keeps going.
            got = 0
            last = 0
            for ev in run.events():
                self.assertEqual(ev.id, last + 1)
                last = ev.id
                got += 1
                if got % 20 == 0:
                    time.sleep(0.05)
                if got >= 200:
                    break
            self.assertGreater(run.get()["events"], e2 + 150)
            r3 = self.d.rss_kib()
            self.assertLess(r3 - r1, 24576, (r1, r2, r3))
        finally:
            run.signal("KILL")
        res = run.wait(timeout=60)
        self.assertEqual(res["state"], "done")
        self.assertEqual(self.sb.commands.run("echo alive").stdout, "alive\n")

    def test_unread_flood_still_times_out(self):
        # Output nobody streams fills the run's buffer and the daemon stops reading the guest;
        # the run's timeout still ends it (the output past its time dropped, and counted).
        t0 = time.monotonic()
        run = self.sb.commands.start("yes flood", timeout=3)
        res = run.wait(timeout=60)
        self.assertEqual(res["state"], "done", res)
        self.assertTrue(res["result"]["timed_out"], res)
        self.assertGreater(res["result"]["output_dropped_bytes"], 0, res)
        self.assertLess(time.monotonic() - t0, 45)
        self.assertEqual(self.sb.commands.run("echo alive").stdout, "alive\n")

    # ---- files ----

    def test_files_up_and_down(self):
        data = os.urandom(5 << 20)
        self.sb.files.write("/tmp/big.bin", data)
        r = self.sb.commands.run("sha256sum /tmp/big.bin")
        self.assertEqual(r.stdout.split()[0], hashlib.sha256(data).hexdigest())
        back = self.sb.files.read("/tmp/big.bin")
        self.assertEqual(hashlib.sha256(back).hexdigest(), hashlib.sha256(data).hexdigest())
        # Over max_upload_bytes: refused on the announced length, before the body.
        resp = raw(self.d.port, b"PUT /v1/sessions/%s/files?path=/tmp/too-big HTTP/1.1\r\n"
                   b"Host: x\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n" %
                   (self.sb.id.encode(), self.key_a.encode(), (8 << 20) + 1))
        self.assertEqual(status_of(resp), 413, resp[:300])
        self.assertIn(b'"too_large"', resp)
        with self.assertRaises(APIError) as e:
            self.sb.files.read("/no/such/file")
        self.assertEqual(e.exception.status, 404)
        # The API takes absolute paths only (the client makes a relative one its cwd's).
        with self.assertRaises(APIError) as e:
            self.sb.client.request("GET", self.sb._path + "/files?path=relative/path")
        self.assertEqual(e.exception.status, 400)
        # list, stat, mkdir, remove; names the guest chose come back as they are
        f = self.sb.files
        f.make_dir("/tmp/d/e/f", parents=True)
        with self.assertRaises(APIError) as e:
            f.make_dir("/tmp/d")
        self.assertEqual(e.exception.status, 409)
        f.write("/tmp/d/a file", "12345")
        self.sb.commands.run("ln -s /etc/passwd /tmp/d/link; touch '/tmp/d/new\nline'; "
                             "touch \"/tmp/d/bad$(printf '\\377')\"")
        # A name that is not UTF-8 still comes back as JSON (the client parses it strictly),
        # marked, with its exact bytes in name_b64.
        entries = {x["name"]: x for x in f.list("/tmp/d")}
        self.assertEqual(set(entries), {"a file", "e", "link", "new\nline", "bad\ufffd"})
        self.assertEqual(base64.b64decode(entries["bad\ufffd"]["name_b64"]), b"bad\xff")
        self.assertNotIn("name_b64", entries["a file"])
        self.sb.commands.run("rm \"/tmp/d/bad$(printf '\\377')\"")
        self.assertEqual((entries["a file"]["type"], entries["a file"]["size"]), ("file", 5))
        self.assertEqual(entries["e"]["type"], "dir")
        self.assertEqual(entries["link"]["type"], "symlink")
        self.assertEqual(f.stat("/tmp/d/e")["type"], "dir")
        # A ../ path is the guest's business (it reads the guest's file); the agent does not
        # follow a symlink; nothing reaches a host path but the spool's.
        self.assertEqual(f.read("/tmp/d/../../etc/passwd"),
                         self.sb.commands.run("cat /etc/passwd").stdout.encode())
        with self.assertRaises(APIError) as e:
            f.read("/tmp/d/link")
        self.assertEqual(e.exception.status, 400)
        with self.assertRaises(APIError) as e:
            f.list("/tmp/d/a file")
        self.assertEqual(e.exception.status, 400)
        with self.assertRaises(APIError) as e:
            f.remove("/tmp/d")
        self.assertEqual(e.exception.status, 409)
        f.remove("/tmp/d/a file")
        self.assertFalse(f.exists("/tmp/d/a file"))
        f.remove("/tmp/d", recursive=True)
        self.assertFalse(f.exists("/tmp/d"))
        with self.assertRaises(APIError) as e:
            f.stat("/tmp/d")
        self.assertEqual(e.exception.status, 404)
        self.assertEqual(os.listdir(os.path.join(self.d.dir, "store", "spool")), [])

    # ---- sessions ----

    def test_quota_checkpoints_and_delete(self):
        k = self.d.key("small", "--max-sessions", "1", "--max-memory-mib", "512",
                       "--max-lifetime-s", "600", "--max-exec-timeout-s", "30")
        c = self.d.tcp(k)
        listing = subprocess.run([AIRLOCKD, "--config", self.d.conf, "key", "list"],
                                 stdout=subprocess.PIPE, check=True).stdout.decode()
        line = [l for l in listing.splitlines() if " small " in l][0]
        for want in ["max_sessions=1", "max_memory_mib=512", "max_lifetime_s=600",
                     "max_exec_timeout_s=30"]:
            self.assertIn(want, line)
        bad = subprocess.run([AIRLOCKD, "--config", self.d.conf, "key", "add", "x",
                              "--max-nothing", "1"], stderr=subprocess.DEVNULL)
        self.assertEqual(bad.returncode, 2)
        # The key's own limits, before anything boots.
        with self.assertRaises(APIError) as e:
            Sandbox(client=c, lifetime_s=601)
        self.assertEqual((e.exception.status, e.exception.limit), (429, "max_lifetime_s"))
        with self.assertRaises(APIError) as e:
            Sandbox(client=c, memory_mib=1024)
        self.assertEqual((e.exception.status, e.exception.limit), (429, "max_memory_mib"))
        sb = Sandbox(client=c, checkpoints=True)
        with self.assertRaises(APIError) as e:
            Sandbox(client=c)
        self.assertEqual((e.exception.status, e.exception.limit), (429, "max_sessions"))
        self.assertEqual(len(c.sessions()), 1)
        with self.assertRaises(APIError) as e:
            sb.commands.run("true", timeout=31)
        self.assertEqual((e.exception.status, e.exception.limit), (429, "max_exec_timeout_s"))
        # checkpoints
        sb.files.write("/tmp/state", "before")
        cp = sb.checkpoint("one")
        sb.files.write("/tmp/state", "after")
        self.assertEqual(sb.files.read("/tmp/state"), b"after")
        sb.rollback(cp)
        self.assertEqual(sb.files.read("/tmp/state"), b"before")
        self.assertEqual([x["name"] for x in sb.checkpoints()], ["one"])
        sb.delete_checkpoint("one")
        self.assertEqual(sb.checkpoints(), [])
        # Sandbox.connect comes back to it; delete leaves no domain and no files.
        again = Sandbox.connect(sb.id, client=c)
        self.assertEqual(again.commands.run("echo back").stdout, "back\n")
        again.kill()
        self.assertTrue(domain_gone(sb.id))
        self.assertFalse(os.path.exists(os.path.join(altest.state_sessions_dir(), sb.id)))
        self.assertEqual(c.sessions(), [])
        with self.assertRaises(APIError) as e:
            sb.refresh()
        self.assertEqual(e.exception.status, 404)

    def test_idle_timeout_and_lifetime(self):
        u = self.d.unix()
        idle = Sandbox(client=u, idle_timeout_s=2)
        short = Sandbox(client=u, lifetime_s=4, idle_timeout_s=600)
        t0 = time.time()
        while time.time() - t0 < 3:
            short.commands.run("true")  # busy: only its lifetime ends it
        deadline = time.time() + 30
        while time.time() < deadline and u.sessions():
            time.sleep(0.5)
        self.assertEqual(u.sessions(), [])
        self.assertTrue(domain_gone(idle.id))
        self.assertTrue(domain_gone(short.id))
        log = self.d.text()
        self.assertIn("session %s of uid:%d: idle timeout" % (idle.id, os.getuid()), log)
        self.assertIn("session %s of uid:%d: lifetime over" % (short.id, os.getuid()), log)
        with self.assertRaises(APIError) as e:
            Sandbox(client=u, lifetime_s=10 ** 7)
        self.assertEqual((e.exception.status, e.exception.limit), (429, "max_lifetime_s"))

    def test_cli_remote(self):
        srv = ["--server", "unix:" + self.d.sock]
        r = altest.run(srv + ["session", "start", "--idle-timeout", "600"])
        self.assertEqual(r.returncode, 0, r.stderr)
        sid = r.stdout.decode().strip()
        try:
            r = altest.run(srv + ["exec", "--session", sid, "--", "sh", "-c",
                                  "echo out; echo err >&2; exit 7"])
            self.assertEqual((r.returncode, r.stdout, r.stderr), (7, b"out\n", b"err\n"))
            r = altest.run(srv + ["exec", "--session", sid, "--lang", "sh", "-c", "cat; echo $A",
                                  "-e", "A=b"], input=b"piped ")
            self.assertEqual((r.returncode, r.stdout), (0, b"piped b\n"), r.stderr)
            r = altest.run(srv + ["exec", "--session", sid, "--", "/no/such"])
            self.assertEqual(r.returncode, 127, r.stderr)
            # --put and --get as a local exec has them: into a directory, out to one.
            with tempfile.TemporaryDirectory() as d:
                src = os.path.join(d, "in.txt")
                with open(src, "w") as f:
                    f.write("to the guest\n")
                out = os.path.join(d, "out")
                os.mkdir(out)
                r = altest.run(srv + ["exec", "--session", sid, "--put", src + ":/tmp/",
                                      "--get", "/tmp/made.txt:" + out, "--", "sh", "-c",
                                      "tr a-z A-Z < /tmp/in.txt > /tmp/made.txt"])
                self.assertEqual(r.returncode, 0, r.stderr)
                with open(os.path.join(out, "made.txt")) as f:
                    self.assertEqual(f.read(), "TO THE GUEST\n")
                self.assertEqual(os.listdir(out), ["made.txt"])  # no temporary left
                # A missing host file is said before anything runs; a missing guest one after,
                # failing a command that succeeded.
                r = altest.run(srv + ["exec", "--session", sid, "--put", d + "/nope:/tmp/x",
                                      "--", "touch", "/tmp/ran"])
                self.assertEqual(r.returncode, 125)
                self.assertIn(b"--put: cannot open '%s/nope'" % d.encode(), r.stderr)
                r = altest.run(srv + ["exec", "--session", sid, "--get", "/tmp/none:" + out,
                                      "--", "test", "!", "-e", "/tmp/ran"])
                self.assertEqual(r.returncode, 125, r.stderr)
                self.assertIn(b"--get '/tmp/none' failed: ", r.stderr)
                self.assertEqual(os.listdir(out), ["made.txt"])
                # airlock cp reaches the daemon's sessions as a local one's.
                r = altest.run(srv + ["cp", src, sid + ":/tmp/copied.txt"])
                self.assertEqual(r.returncode, 0, r.stderr)
                r = altest.run(srv + ["cp", sid + ":/tmp/copied.txt", out])
                self.assertEqual(r.returncode, 0, r.stderr)
                with open(os.path.join(out, "copied.txt")) as f:
                    self.assertEqual(f.read(), "to the guest\n")
                # --workdir as a local exec has it: copied in, the run there, its changes back
                wd = os.path.join(d, "proj")
                os.mkdir(wd)
                with open(os.path.join(wd, "in.txt"), "w") as f:
                    f.write("hello\n")
                r = altest.run(srv + ["exec", "--session", sid, "--workdir", wd, "--sync-back",
                                      "yes", "--", "sh", "-c",
                                      "pwd; tr a-z A-Z < in.txt > out.txt; rm in.txt"])
                self.assertEqual((r.returncode, r.stdout), (0, b"/workspace\n"), r.stderr)
                self.assertIn(b"copied 1 file (", r.stderr)
                self.assertIn(b"1 added, 0 modified, 1 deleted", r.stderr)
                self.assertEqual(os.listdir(wd), ["out.txt"])
                with open(os.path.join(wd, "out.txt")) as f:
                    self.assertEqual(f.read(), "HELLO\n")
            # ps and session ls: one table, the daemon's sessions marked as its.
            for args, env in [(srv + ["ps"], None),
                              (["session", "ls"], {"AIRLOCK_HOST": "unix:" + self.d.sock})]:
                r = altest.run(args, env=env)
                self.assertEqual(r.returncode, 0, r.stderr)
                rows = [l.split() for l in r.stdout.decode().splitlines()]
                self.assertEqual(rows[0], ["NAME", "IMAGE", "AGE", "WHERE", "EXPIRES"])
                self.assertIn([sid, "airlockd"], [[x[0], x[3]] for x in rows[1:]], args)
            r = altest.run(srv + ["session", "extend", sid, "100"])
            self.assertEqual(r.returncode, 0, r.stderr)
            # EXPIRES as a person reads it
            rows = [l.split() for l in altest.run(srv + ["ps"]).stdout.decode().splitlines()]
            left = [x[4] for x in rows[1:] if x[0] == sid]
            self.assertEqual(len(left), 1, rows)
            self.assertRegex(left[0], r"^(9\d|100)s$")
            self.assertEqual(altest.run(srv + ["session", "extend", sid, "7500"]).returncode, 0)
            rows = [l.split() for l in altest.run(srv + ["ps"]).stdout.decode().splitlines()]
            self.assertRegex([x[4] for x in rows[1:] if x[0] == sid][0], r"^2h0[45]m$")
        finally:
            r = altest.run(srv + ["rm", sid])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(domain_gone(sid))
        r = altest.run(srv + ["rm", sid])
        self.assertEqual(r.returncode, 1)
        self.assertIn(b"no session", r.stderr)
        # Without --session, a fresh session over TCP with a key, ended afterwards.
        r = altest.run(["--server", "http://127.0.0.1:%d" % self.d.port, "--server-key", self.key_b,
                        "-d", "exec", "--", "echo", "fresh"])
        self.assertEqual((r.returncode, r.stdout), (0, b"fresh\n"), r.stderr)
        fresh = altest.session_names(r.stderr)
        self.assertEqual(len(fresh), 1, r.stderr)
        self.assertTrue(domain_gone(fresh[0].decode()))
        self.assertEqual(self.d.tcp(self.key_b).sessions(), [])
        r = altest.run(["--server", "http://127.0.0.1:%d" % self.d.port, "exec", "--", "true"])
        self.assertEqual(r.returncode, 125)
        self.assertIn(b"401", r.stderr)

    def test_vcpus_are_in_the_quota(self):
        # issue 29: vCPUs per owner are bounded (16 by default), checked before anything boots.
        k = self.d.key("cpus", "--max-vcpus", "3")
        with self.assertRaises(APIError) as e:
            Sandbox(client=self.d.tcp(k), vcpus=4)
        self.assertEqual((e.exception.status, e.exception.limit), (429, "max_vcpus"))
        self.assertIn("limit of 3", e.exception.message)

    def test_upload_spool_is_bounded(self):
        # issue 29, 4: an upload to a session that is not the caller's is refused before its
        # body is read; one key's uploads in flight hold at most twice max_upload_bytes (8 MiB
        # here) of the spool, refused on Content-Length.
        spool = os.path.join(self.d.dir, "store", "spool")
        size = 7 << 20

        def head(sid, key=None):
            s = socket.create_connection(("127.0.0.1", self.d.port), timeout=30)
            s.sendall(("PUT /v1/sessions/%s/files?path=/tmp/up HTTP/1.1\r\nHost: x\r\n"
                       "Authorization: Bearer %s\r\nContent-Type: application/octet-stream\r\n"
                       "Content-Length: %d\r\n\r\n" % (sid, key or self.key_a, size)).encode())
            s.sendall(b"x" * 65536)
            return s

        def status(s):
            s.settimeout(10)
            try:
                data = s.recv(4096)
            except socket.timeout:
                return 0
            return status_of(data)

        nobody = head("airlock-000000000000")
        self.assertEqual(status(nobody), 404)
        nobody.close()
        theirs = head(self.sb.id, key=self.key_b)  # another key's view of A's session
        self.assertEqual(status(theirs), 404)
        theirs.close()
        self.assertEqual(os.listdir(spool), [])
        held = [head(self.sb.id), head(self.sb.id)]  # 14 MiB of 16 held
        time.sleep(0.5)
        third = head(self.sb.id)
        self.assertEqual(status(third), 507)
        third.close()
        for s in held:
            s.close()
        time.sleep(1)
        # released with their connections: a whole upload goes through again
        self.sb.files.write("/tmp/after", os.urandom(size))
        self.assertEqual(self.sb.files.stat("/tmp/after")["size"], size)

    def test_web_sign_ins_are_bounded_per_key(self):
        # issue 29, 7: another key's many sign-ins do not sign this key's browser out.
        def login(key):
            c = http.client.HTTPConnection("127.0.0.1", self.d.port, timeout=30)
            c.request("POST", "/v1/auth/login", body=json.dumps({"api_key": key}),
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            r.read()
            c.close()
            self.assertEqual(r.status, 200)
            return r.getheader("Set-Cookie").split(";")[0]

        def works(cookie):
            c = http.client.HTTPConnection("127.0.0.1", self.d.port, timeout=30)
            c.request("GET", "/v1/sessions", headers={"Cookie": cookie})
            r = c.getresponse()
            r.read()
            c.close()
            return r.status == 200

        mine = login(self.key_a)
        theirs = [login(self.key_b) for _ in range(300)]
        self.assertTrue(works(mine), "key A's browser was signed out by key B's sign-ins")
        self.assertTrue(works(theirs[-1]))
        self.assertFalse(works(theirs[0]), "key B keeps only its newest sign-ins")

    def test_key_store_is_private(self):
        # issue 29, 11: the store's dir 0700 and keys.db 0600, made so even with umask 022;
        # a store others can read is refused at start, naming the fix.
        store = os.path.join(self.d.dir, "store")
        self.assertEqual(os.stat(store).st_mode & 0o777, 0o700)
        self.assertEqual(os.stat(os.path.join(store, "keys.db")).st_mode & 0o777, 0o600)
        self.assertEqual(os.stat(os.path.join(store, "spool")).st_mode & 0o777, 0o700)
        with tempfile.TemporaryDirectory() as t:
            os.chmod(t, 0o755)
            conf = os.path.join(t, "c.conf")
            with open(conf, "w") as f:
                f.write("keys_db = %s/keys.db\n" % t)
            p = subprocess.run([AIRLOCKD, "--config", conf, "key", "list"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            self.assertEqual(p.returncode, 1)
            self.assertIn("no other user can read or write", p.stderr)
            self.assertIn("chmod 700", p.stderr)
            self.assertFalse(os.path.exists(os.path.join(t, "keys.db")))
            os.chmod(t, 0o700)
            with open(os.path.join(t, "keys.db"), "w"):
                pass
            os.chmod(os.path.join(t, "keys.db"), 0o644)
            p = subprocess.run([AIRLOCKD, "--config", conf, "key", "list"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            self.assertEqual(p.returncode, 1)
            self.assertIn("chmod 600", p.stderr)

    def test_log_has_no_secrets(self):
        self.d.tcp(self.key_a).sessions()
        log = self.d.text()
        self.assertNotIn(self.key_a, log)
        self.assertNotIn(self.key_a.split("_")[2], log)
        self.assertIn("key:%s GET /v1/sessions 200" % self.key_a.split("_")[1], log)



# ---- /metrics: the Prometheus text format, checked by a strict parser of its rules ----

METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')


def parse_prometheus(text):
    """{(name, frozenset(labels)): value} from a text exposition (format 0.0.4), raising
    ValueError at the first line that breaks its rules: HELP/TYPE before a family's samples and
    once each, known types, well-formed names, labels and values, the histogram's buckets
    cumulative and ending in +Inf equal to _count, no sample twice."""
    if not text.endswith("\n"):
        raise ValueError("the text does not end in a newline")
    types, helps, samples, seen_families = {}, set(), {}, []
    for no, line in enumerate(text.split("\n")[:-1], 1):
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                name = parts[2]
                if not METRIC_NAME.match(name):
                    raise ValueError("%d: bad name %r" % (no, name))
                if parts[1] == "TYPE":
                    if name in types or len(parts) != 4 or parts[3] not in (
                            "counter", "gauge", "histogram", "summary", "untyped"):
                        raise ValueError("%d: bad or repeated TYPE" % no)
                    if any(f == name for f in seen_families):
                        raise ValueError("%d: TYPE after samples of %s" % (no, name))
                    types[name] = parts[3]
                else:
                    if name in helps:
                        raise ValueError("%d: HELP twice" % no)
                    helps.add(name)
            continue
        if "{" in line:
            name, rest = line.split("{", 1)
            body, _, value = rest.rpartition("} ")
            labels, pos = {}, 0
            while pos < len(body):
                m = LABEL.match(body, pos)
                if not m or m.group(1) in labels:
                    raise ValueError("%d: bad labels %r" % (no, body))
                labels[m.group(1)] = m.group(2)
                pos = m.end()
                if pos < len(body):
                    if body[pos] != ",":
                        raise ValueError("%d: bad labels %r" % (no, body))
                    pos += 1
        else:
            name, _, value = line.partition(" ")
            labels = {}
        if not METRIC_NAME.match(name):
            raise ValueError("%d: bad name %r" % (no, name))
        v = float(value)  # ValueError for anything that is not a number
        family = name
        for suffix in ("_bucket", "_sum", "_count"):
            if name.endswith(suffix) and types.get(name[:-len(suffix)]) == "histogram":
                family = name[:-len(suffix)]
        if family not in types:
            raise ValueError("%d: sample of %s without a TYPE" % (no, family))
        if types[family] == "counter" and v < 0:
            raise ValueError("%d: negative counter" % no)
        key = (name, frozenset(labels.items()))
        if key in samples:
            raise ValueError("%d: sample twice" % no)
        samples[key] = v
        seen_families.append(family)
    # histograms: per label set, buckets cumulative, +Inf == _count
    for fam, t in types.items():
        if t != "histogram":
            continue
        groups = {}
        for (name, labels), v in samples.items():
            if name == fam + "_bucket":
                rest = frozenset(kv for kv in labels if kv[0] != "le")
                le = dict(labels)["le"]
                groups.setdefault(rest, []).append((float(le), v))
        for rest, buckets in groups.items():
            buckets.sort()
            if buckets[-1][0] != float("inf"):
                raise ValueError("%s: no +Inf bucket" % fam)
            if any(b[1] > c[1] for b, c in zip(buckets, buckets[1:])):
                raise ValueError("%s: buckets not cumulative" % fam)
            if samples.get((fam + "_count", rest)) != buckets[-1][1]:
                raise ValueError("%s: +Inf bucket is not _count" % fam)
            if (fam + "_sum", rest) not in samples:
                raise ValueError("%s: no _sum" % fam)
    return samples


def metric(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())), 0.0)


class MetricsTest(unittest.TestCase):
    def scrape(self, client):
        c, r = client.open("GET", "/metrics")
        try:
            data = r.read()
        finally:
            c.close()
        self.assertEqual(r.status, 200, data[:300])
        self.assertTrue(r.getheader("Content-Type").startswith("text/plain; version=0.0.4"))
        return parse_prometheus(data.decode())

    def test_metrics_move_after_a_session_and_runs(self):
        d = Daemon()
        try:
            key = d.key("metrics")
            # Same access rule as the API: TCP needs a key, the unix socket its peer rule.
            with self.assertRaises(APIError) as e:
                d.tcp().request("GET", "/metrics")
            self.assertEqual(e.exception.status, 401)
            before = self.scrape(d.tcp(key))
            u = d.unix()
            with self.assertRaises(APIError):
                u.request("GET", "/v1/sessions/nope")
            sb = Sandbox(client=u)
            mid = self.scrape(u)
            self.assertEqual(metric(mid, "airlockd_sessions", state="ready"), 1)
            self.assertEqual(sb.commands.run("echo hi").stdout, "hi\n")
            self.assertEqual(sb.run_code("echo $((1+1))", language="sh").stdout, "2\n")
            r = sb.commands.run(["/no/such/program"])
            self.assertIsNotNone(r.error)
            sb.kill()
            after = self.scrape(u)
        finally:
            rc = d.stop()
            log = d.text()[-3000:]
            shutil.rmtree(d.dir, ignore_errors=True)
        self.assertEqual(rc, 0, log)  # a clean stop (and, sanitized, no report)

        def moved(name, by, **labels):
            self.assertEqual(metric(after, name, **labels) - metric(before, name, **labels), by,
                             "%s%s" % (name, labels))

        # one session: booted cold, or restored from a warm-start template
        kinds = [k for k in ("boot", "restore")
                 if metric(after, "airlockd_session_%ss_total" % k) -
                 metric(before, "airlockd_session_%ss_total" % k) == 1]
        self.assertEqual(len(kinds), 1, "one boot or one restore")
        for k in ("boot", "restore"):
            moved("airlockd_session_%ss_total" % k, 1 if k in kinds else 0)
            moved("airlockd_session_%s_seconds_count" % k, 1 if k in kinds else 0)
        self.assertGreater(metric(after, "airlockd_session_%s_seconds_sum" % kinds[0]), 0)
        moved("airlockd_sessions_closed_total", 1)
        moved("airlockd_runs_total", 2, kind="command")
        moved("airlockd_runs_total", 1, kind="code")
        moved("airlockd_run_seconds_count", 3)
        moved("airlockd_failures_total", 1, kind="run")
        moved("airlockd_failures_total", 1, kind="api", code="not_found")
        # the 401 came before the first scrape
        self.assertEqual(metric(after, "airlockd_failures_total", kind="api", code="unauthorized"),
                         1)
        self.assertEqual(metric(after, "airlockd_sessions", state="ready"), 0)
        self.assertEqual(metric(after, "airlockd_sessions", state="booting"), 0)
        self.assertEqual(metric(after, "airlockd_runs_active"), 0)
        moved("airlockd_requests_total", 1, method="POST", route="/v1/sessions", code="2xx")
        moved("airlockd_requests_total", 1, method="DELETE", route="/v1/sessions/{id}",
              code="2xx")
        moved("airlockd_request_seconds_count", 1, method="POST", route="/v1/sessions")
        # the scrapes themselves: `before` was answered before `after` counted it
        self.assertGreaterEqual(metric(after, "airlockd_requests_total", method="GET",
                                       route="/metrics", code="2xx"), 2)
        self.assertGreaterEqual(metric(after, "airlockd_requests_total", method="GET",
                                       route="/v1/sessions/{id}", code="4xx"), 1)

    def test_parser_is_strict(self):
        good = "# TYPE a counter\na 1\n"
        self.assertEqual(parse_prometheus(good), {("a", frozenset()): 1.0})
        for bad in ["a 1\n", "# TYPE a counter\na one\n", "# TYPE a counter\na{x=1} 1\n",
                    "# TYPE a counter\na 1", "# TYPE a counter\na 1\na 1\n",
                    "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\n"
                    "h_sum 1\nh_count 1\n"]:
            with self.assertRaises(ValueError, msg=bad):
                parse_prometheus(bad)


class AllowGroupTest(unittest.TestCase):
    """allow_group: a peer whose group is the allowed one gets in (its own owner); one whose
    group is not gets 403; a group name that does not exist stops the daemon at start."""

    def _with(self, group):
        d = Daemon(allow_group=group)
        try:
            fake = type("T", (), {"d": d})()
            return AirlockdTest._as_nobody(fake)
        finally:
            d.stop()
            shutil.rmtree(d.dir, ignore_errors=True)

    def test_allow_group(self):
        self.assertEqual(self._with("nogroup"), "200")  # nobody's primary group, by name
        self.assertEqual(self._with(str(NOBODY)), "200")  # and by gid
        self.assertEqual(self._with("root"), "403")
        with tempfile.TemporaryDirectory() as t:
            conf = os.path.join(t, "c.conf")
            with open(conf, "w") as f:
                f.write("socket = %s/s.sock\nallow_group = no-such-group-here\n" % t)
            p = subprocess.run([AIRLOCKD, "--config", conf], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, timeout=30)
        self.assertEqual(p.returncode, 1)
        self.assertIn("c.conf:2: bad value for 'allow_group'", p.stderr)


class DiskBudgetTest(unittest.TestCase):
    """The library's disk budget per session (config disk_budget_bytes) as the API's 507."""

    def test_over_budget_is_507(self):
        d = Daemon(disk_budget_bytes=16 << 20)
        try:
            sb = Sandbox(client=d.unix(), checkpoints=True)
            self.assertEqual(sb.commands.run("echo ok").stdout, "ok\n")
            codes = []
            for _ in range(6):  # each checkpoint holds the guest's memory on the host's disk
                try:
                    sb.checkpoint()
                    codes.append(201)
                except APIError as e:
                    codes.append((e.status, e.code))
                    break
            self.assertEqual(codes[-1], (507, "disk_budget"), codes)
            time.sleep(1)  # the watcher pauses the VM once the budget is passed
            r = sb.commands.run("echo no")
            if r.error:  # paused: the run is refused with the same code
                self.assertEqual(r.error["code"], "disk_budget", r.error)
            sb.kill()
            self.assertTrue(domain_gone(sb.id))
        finally:
            self.assertEqual(d.stop_and_remove(), 0)

class ChatTimeoutTest(unittest.TestCase):
    """A chat turn's code run is bounded by the owner's max_exec_timeout_s, as an exec is (the
    fake model asks for sleep 120; the daemon allows 3 s)."""

    def test_chat_run_times_out(self):
        tmp = tempfile.mkdtemp(prefix="airlockd-chat-")
        self.addCleanup(shutil.rmtree, tmp, True)
        fm, port = altest.start_fake_model([
            {"tool_calls": [{"id": "c1", "name": "execute", "arguments": {
                "language": "bash", "code": "echo started; sleep 120; echo never"}}]},
            {"text": "it timed out"}], tmp)
        self.addCleanup(lambda: (fm.kill(), fm.wait()))
        base = "http://127.0.0.1:%d/v1" % port
        d = Daemon(model_api="openai", model_api_base=base, model="fake",
                   max_exec_timeout_s=3)
        try:
            sb = Sandbox(client=d.unix())
            info = sb.client.request("POST", "/v1/sessions/%s/chat" % sb.id,
                                     {"message": "sleep", "auto_run": True})
            t0 = time.time()
            evs = list(Run(sb, info).events(timeout=120))
            took = time.time() - t0
            ends = [e.data for e in evs if e.type == "run_end"]
            out = b"".join(base64.b64decode(e.data["data_b64"]) for e in evs
                           if e.type == "output")
            self.assertEqual(len(ends), 1, evs)
            self.assertTrue(ends[0]["timed_out"], ends)
            self.assertIn(b"started", out)
            self.assertNotIn(b"never", out)
            self.assertEqual(evs[-1].type, "done", evs[-1])
            self.assertLess(took, 100)
            sb.kill()
            self.assertTrue(domain_gone(sb.id))
        finally:
            self.assertEqual(d.stop_and_remove(), 0)


class FrozenAgentTest(unittest.TestCase):
    """issue 29, 1: guest code stops the agent (SIGSTOP); a download from that session then gets
    no answer. Its lifetime still ends it (the VM goes at once, the download fails), another
    session is still reaped at its lifetime, and SIGTERM still stops the daemon."""

    def test_frozen_agent_wedges_nothing(self):
        d = Daemon()
        stopped = False
        try:
            c = d.unix()
            a = Sandbox(client=c, lifetime_s=15)
            b = Sandbox(client=c, lifetime_s=20)
            t0 = time.monotonic()
            a.commands.run("kill -STOP $(cat /run/airlock-agent.pid); sleep 1000",
                           background=True)
            time.sleep(2)
            got = {}

            def download():
                try:
                    got["data"] = a.files.read("/etc/hostname")
                except Exception as e:  # noqa: BLE001 (any clear failure will do)
                    got["error"] = e
                got["t"] = time.monotonic() - t0

            th = threading.Thread(target=download, daemon=True)
            th.start()
            # A's lifetime ends it although a download waits on its frozen agent
            for _ in range(300):
                if domain_gone(a.id):
                    break
                time.sleep(0.2)
            self.assertTrue(domain_gone(a.id), "the frozen session outlived its lifetime")
            self.assertLess(time.monotonic() - t0, 45)
            th.join(60)
            self.assertFalse(th.is_alive(), "the download never ended")
            self.assertIn("error", got, got)
            # the reaper goes on: B ends at its lifetime too
            for _ in range(300):
                if domain_gone(b.id):
                    break
                time.sleep(0.2)
            self.assertTrue(domain_gone(b.id), "the reaper stopped after the frozen session")
            t = time.monotonic()
            self.assertEqual(d.stop(timeout=60), 0)
            stopped = True
            self.assertLess(time.monotonic() - t, 30)
        finally:
            if not stopped:
                d.stop(sig=signal.SIGKILL)
            shutil.rmtree(d.dir, ignore_errors=True)


class EmptyBodyTest(unittest.TestCase):
    """A route that takes no body takes an empty JSON object as none (clients that send {} with
    every POST: pause and resume answered 413 "request body over 0 bytes"); anything more is
    refused, a body past 64 bytes before it is read."""

    def test_empty_object_is_no_body(self):
        d = Daemon()
        try:
            def post(body, ct="application/json"):
                c = http.client.HTTPConnection("127.0.0.1", d.port, timeout=30)
                c.request("POST", "/v1/auth/logout", body=body, headers={"Content-Type": ct})
                r = c.getresponse()
                data = r.read()
                c.close()
                return r.status, data
            for body in (b"", b"{}", b" { }\n"):
                st, data = post(body)
                self.assertLess(st, 300, (body, data))
            st, data = post(b'{"x": 1}')
            self.assertEqual(st, 400, data)
            self.assertIn(b"takes no body", data)
            st, data = post(b"{" + b" " * 100 + b"}")
            self.assertEqual(st, 413, data)
        finally:
            self.assertEqual(d.stop_and_remove(), 0)


class SlowClientTest(unittest.TestCase):
    """issue 29, 5: one address holding its connections with a header byte now and then does
    not lock other addresses (or the unix socket) out: TCP connections per address are
    bounded."""

    def test_slow_client_locks_out_no_one(self):
        d = Daemon(max_connections=64, max_connections_per_ip=8, connection_timeout_s=30)
        held = []
        try:
            # more than max_connections: its share is held, the rest are closed at once
            for _ in range(70):
                try:
                    s = socket.create_connection(("127.0.0.1", d.port), timeout=5)
                    held.append(s)
                    s.sendall(b"G")
                except OSError:
                    pass
            time.sleep(0.5)
            # another address on the loopback still gets answers, and so does the socket
            for _ in range(5):
                c = socket.socket()
                c.settimeout(10)
                c.bind(("127.0.0.2", 0))
                c.connect(("127.0.0.1", d.port))
                c.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                got = b""
                while True:
                    try:
                        b = c.recv(4096)
                    except socket.timeout:
                        break
                    if not b:
                        break
                    got += b
                c.close()
                self.assertEqual(status_of(got), 200, got[:200])
            self.assertEqual(d.unix().health()["status"], "ok")
        finally:
            for s in held:
                s.close()
            self.assertEqual(d.stop_and_remove(), 0)

    def test_slow_heads_on_the_e2b_listener(self):
        # E2B's listener has no per-address bound (its SDKs hold many streams from one host):
        # there one address may still hold only 16 new connections that wait for their first
        # head longer than 2 s, so 100 of them leave the rest of max_connections to others.
        d = Daemon(e2b_listen="127.0.0.1:0", connection_timeout_s=30)
        port = int(re.search(r"E2B's API on .* port (\d+)", d.text()).group(1))
        held = []
        try:
            for _ in range(100):
                try:
                    s = socket.create_connection(("127.0.0.1", port), timeout=5)
                    held.append(s)
                    s.sendall(b"G")
                except OSError:
                    pass
            time.sleep(4)  # the cut waits 2 s; the watcher looks each second
            ss = subprocess.run(["ss", "-Htn", "state", "established", "( sport = :%d )" % port],
                                stdout=subprocess.PIPE, check=True).stdout.decode()
            self.assertLessEqual(len(ss.splitlines()), 16, ss)
            for _ in range(5):
                c = socket.socket()
                c.settimeout(10)
                c.bind(("127.0.0.2", 0))
                c.connect(("127.0.0.1", port))
                c.sendall(b"GET /sandboxes HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                self.assertEqual(status_of(c.recv(4096)), 401)
                c.close()
        finally:
            for s in held:
                s.close()
            self.assertEqual(d.stop_and_remove(), 0)

    def test_a_trickled_head_is_cut_at_its_deadline(self):
        # One byte of the head every second keeps libmicrohttpd's idle timer (30 s) from
        # firing; the head's own deadline (3 s here) closes the connection all the same. A
        # request whose head comes at once, on a connection kept alive, is answered.
        d = Daemon(connection_timeout_s=30, head_timeout_s=3)
        try:
            s = socket.create_connection(("127.0.0.1", d.port), timeout=30)
            t0 = time.time()
            head = b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 40
            cut_at = None
            for b in head:
                try:
                    s.sendall(bytes([b]))
                    s.settimeout(1)
                    if s.recv(1) == b"":
                        cut_at = time.time() - t0
                        break
                except socket.timeout:
                    continue
                except OSError:
                    cut_at = time.time() - t0
                    break
            s.close()
            self.assertIsNotNone(cut_at, "a trickled head was never cut")
            self.assertGreater(cut_at, 2)
            self.assertLess(cut_at, 12)
            k = socket.create_connection(("127.0.0.1", d.port), timeout=10)
            for _ in range(2):
                k.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
                got = b""
                while b"\r\n\r\n" not in got or not got.rstrip().endswith(b"}"):
                    b = k.recv(4096)
                    if not b:
                        break
                    got += b
                self.assertEqual(status_of(got), 200, got[:200])
            k.close()
        finally:
            self.assertEqual(d.stop_and_remove(), 0)


class ChatBytesTest(unittest.TestCase):
    """issue 29, 10: a file name that is not UTF-8 (and output that is not) reaches the chat's
    events, and the history, as valid UTF-8: U+FFFD for each bad byte, the exact bytes in
    paths_b64."""

    def test_non_utf8_names_in_events(self):
        tmp = tempfile.mkdtemp(prefix="airlockd-chat-")
        self.addCleanup(shutil.rmtree, tmp, True)
        fm, port = altest.start_fake_model([
            {"tool_calls": [{"id": "c1", "name": "execute", "arguments": {
                "language": "sh",
                "code": "mkdir -p /workspace && printf x > \"/workspace/bad$(printf '\\377\\376').txt\""
                        " && printf 'out\\377\\n'"}}]},
            {"text": "made it"}], tmp)
        self.addCleanup(lambda: (fm.kill(), fm.wait()))
        d = Daemon(model_api="openai", model_api_base="http://127.0.0.1:%d/v1" % port,
                   model="fake")
        try:
            sb = Sandbox(client=d.unix())
            info = sb.client.request("POST", "/v1/sessions/%s/chat" % sb.id,
                                     {"message": "make a file", "auto_run": True})
            evs = list(Run(sb, info).events(timeout=120))  # raised on bytes that are not UTF-8
            self.assertEqual(evs[-1].type, "done", evs[-1])
            files = [e.data for e in evs if e.type == "files"]
            self.assertEqual(len(files), 1, evs)
            self.assertEqual(files[0]["paths"], ["/workspace/bad\ufffd\ufffd.txt"])
            self.assertEqual(base64.b64decode(files[0]["paths_b64"][0]),
                             b"/workspace/bad\xff\xfe.txt")
            # the history holds text: the output's bad byte as U+FFFD
            chat = sb.client.request("GET", "/v1/sessions/%s/chat" % sb.id)
            self.assertIn("out\ufffd", json.dumps(chat, ensure_ascii=False))
            with open(os.path.join(tmp, "requests.jsonl"), "rb") as f:
                f.read().decode("utf-8")  # what the model was sent is UTF-8 too
            sb.kill()
        finally:
            self.assertEqual(d.stop_and_remove(), 0)


class DebianTest(unittest.TestCase):
    """Needs the debian image (registered only when it is built)."""

    def test_kernels_and_checkpoint_policy(self):
        d = Daemon()
        try:
            with Sandbox(image="debian", client=d.unix(), checkpoint_policy="auto") as sb:
                self.assertIn("kernel:python", sb.info["languages"].split())
                a = sb.run_code("x = 41", language="python")
                b = sb.run_code("print(x + 1)", language="python")
                self.assertEqual((a.exit_code, b.stdout, b.exit_code), (0, "42\n", 0))
                c = sb.run_code("console.log([1, 2].map(v => v * 2).join())",
                                language="javascript")
                self.assertEqual(c.stdout, "2,4\n")
                # auto: a checkpoint before each run that may change something, not before
                # print(x + 1); rolling back to the first undoes x.
                cps = sb.checkpoints()
                self.assertGreaterEqual(len(cps), 1)
                sb.rollback(cps[0]["id"])
                e = sb.run_code("print(x)", language="python")
                self.assertIn("NameError", e.stderr + e.stdout)
            self.assertTrue(domain_gone(sb.id))
        finally:
            self.assertEqual(d.stop_and_remove(), 0)


class DebianSessionTest(unittest.TestCase):
    """One daemon and one debian session (cls.sb) for the class's tests."""

    @classmethod
    def setUpClass(cls):
        cls.d = Daemon()
        try:
            cls.sb = Sandbox(image="debian", client=cls.d.unix())
        except BaseException:
            cls.d.stop()
            shutil.rmtree(cls.d.dir, ignore_errors=True)
            raise

    @classmethod
    def tearDownClass(cls):
        cls.sb.kill()
        rc = cls.d.stop()
        shutil.rmtree(cls.d.dir, ignore_errors=True)
        if rc != 0:
            raise AssertionError("airlockd exited %d" % rc)


class ResultsTest(DebianSessionTest):
    """A kernel run's results through the API and the Python client (issue 26): values,
    display()s, figures and errors as result events, refusals as refused events, resumable with
    Last-Event-ID like output. One debian session for all."""

    def test_value_text(self):
        ex = self.sb.run_code("1 + 1")
        self.assertEqual(ex.text, "2", ex)
        self.assertEqual(len(ex.results), 1)
        self.assertTrue(ex.results[0].is_main_result)
        self.assertIsNone(ex.error)
        self.assertEqual(ex.stdout, "")
        self.assertIsInstance(ex.execution_count, int)
        self.assertEqual(ex.results[0].execution_count, ex.execution_count)
        self.assertEqual(ex.result["results"], 1)

    def test_dataframe_html(self):
        ex = self.sb.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})")
        self.assertEqual(len(ex.results), 1, ex)
        self.assertIn("<table", ex.results[0].html)
        self.assertIn("a", ex.results[0].text)

    def test_figure_png(self):
        seen = []
        ex = self.sb.run_code(
            "import matplotlib.pyplot as plt\n"
            "fig = plt.figure(figsize=(4, 3), dpi=100)\n"
            "plt.plot([0, 1, 2], [0, 1, 4])\n"
            "plt.show()", on_result=seen.append)
        figs = [r for r in ex.results if r.png]
        self.assertEqual(len(figs), 1, ex)
        png = figs[0].png
        self.assertEqual(png[:8], b"\x89PNG\r\n\x1a\n")
        w, h = struct.unpack(">II", png[16:24])
        self.assertEqual((w, h), (400, 300))
        self.assertEqual((figs[0].width, figs[0].height), (400, 300))
        self.assertFalse(figs[0].is_main_result)
        self.assertEqual([r.kind for r in seen], [r.kind for r in ex.results])

    def test_displays_then_value_in_order(self):
        ex = self.sb.run_code("display('first')\ndisplay({'k': 2})\n'third'")
        self.assertEqual([(r.kind, r.text) for r in ex.results],
                         [("display", "'first'"), ("display", "{'k': 2}"), ("value", "'third'")])
        self.assertEqual(ex.text, "'third'")

    def test_error(self):
        errors = []
        ex = self.sb.run_code("def f():\n    return 1 / 0\nf()", on_error=errors.append)
        self.assertIsNotNone(ex.error)
        self.assertEqual(ex.error.name, "ZeroDivisionError")
        self.assertIn("division by zero", ex.error.value)
        self.assertIn("ZeroDivisionError", ex.error.traceback)
        self.assertIn("f()", ex.error.traceback)
        self.assertEqual(len(errors), 1)
        self.assertTrue(ex.result["raised"])
        self.assertEqual(ex.results, [])

    def test_huge_repr_is_refused_and_the_kernel_lives(self):
        self.sb.run_code("kept = 'before the big one'")
        ex = self.sb.run_code("class Big:\n"
                              "    def __repr__(self):\n"
                              "        return 'x' * (50 << 20)\n"
                              "Big()", timeout=300)
        self.assertEqual(len(ex.refused), 1, ex)
        self.assertIn("over the limit", ex.refused[0])
        self.assertEqual(ex.results, [])
        self.assertEqual(ex.result["refused"], 1)
        after = self.sb.run_code("kept")
        self.assertEqual(after.text, "'before the big one'")

    def test_results_resume_exactly_once(self):
        run = self.sb.commands.start(None, language="python", kernel=True, code=(
            "import time\n"
            "for i in range(8):\n"
            "    display(i)\n"
            "    time.sleep(0.3)\n"
            "'end'"))
        got = []
        for ev in run.events():  # cut after the second result
            if ev.type == "result":
                got.append(ev.data["data"]["text/plain"])
                if len(got) == 2:
                    break
        self.assertEqual(got, ["0", "1"])
        time.sleep(1)
        ids = []
        for ev in run.events():  # from the last event seen, by Last-Event-ID
            ids.append(ev.id)
            if ev.type == "result":
                got.append(ev.data["data"]["text/plain"])
        self.assertEqual(got, [str(i) for i in range(8)] + ["'end'"])
        self.assertEqual(len(ids), len(set(ids)))
        # and from the start, the whole run again
        again = [ev.data["data"]["text/plain"] for ev in run.events(last_event_id=0)
                 if ev.type == "result"]
        self.assertEqual(again, got)


class ProcessesTest(DebianSessionTest):
    """One session, many processes (issue 27): runs of one session run at once, each with its
    own timeout and signals; a kill takes the run's whole tree; a run nobody reads holds no
    other. One debian session for all."""

    def ps(self, regex):
        """Processes in the guest whose command line matches regex (anchored at its start, so
        that neither this grep nor the shell around it counts)."""
        out = self.sb.commands.run("ps -eo args | grep -cE '^%s' || true" % regex).stdout
        return int(out.strip() or 0)

    def test_client_first_hour(self):
        # The caller's sessions, whichever way they were started; a live one runs.
        client = self.sb.client
        self.assertIn(self.sb.id, [x["id"] for x in Sandbox.list(client=client)])
        self.assertTrue(self.sb.is_running())
        self.assertFalse(Sandbox(client=client, _info={"id": "s-nobody"}).is_running())
        # set_timeout: the session now ends that long from now.
        self.sb.set_timeout(3000)
        left = self.sb.refresh()["expires"] - time.time()
        self.assertTrue(2900 < left <= 3001, left)
        # Relative paths are the sandbox's cwd's, and a write makes the directories it lacks.
        there = Sandbox.connect(self.sb.id, client=client, cwd="/tmp/first-hour")
        there.files.write("deep/er/f.txt", "hi\n")
        self.assertEqual(self.sb.files.read("/tmp/first-hour/deep/er/f.txt"), b"hi\n")
        self.assertEqual(there.files.read("deep/er/f.txt"), b"hi\n")
        self.assertEqual(there.commands.run("cat deep/er/f.txt; pwd").stdout,
                         "hi\n/tmp/first-hour\n")
        self.assertEqual([e["name"] for e in there.files.list("deep")], ["er"])
        # A session without network says so where a run wanted a host.
        r = self.sb.commands.run("curl -sS https://pypi.org/simple/")
        self.assertEqual(r.exit_code, 6, r.stderr)
        self.assertIn("no network", r.result["offline"])
        self.assertIn("pypi.org,files.pythonhosted.org", r.result["offline"])
        self.assertNotIn("offline", self.sb.commands.run("false").result)
        # A run past its timeout raises, with what it printed.
        with self.assertRaises(TimeoutException) as e:
            self.sb.commands.run("echo before; sleep 60", timeout=2)
        self.assertEqual(e.exception.result.stdout, "before\n")

    def test_background_server_and_tree_kill(self):
        server = self.sb.commands.run("cd /tmp && exec python3 -m http.server 8731",
                                      background=True)
        self.assertTrue(server.running)
        # a foreground run reaches it while it runs
        self.addCleanup(server.kill)
        got = self.sb.commands.run(
            "for i in $(seq 100); do curl -sf -o /dev/null http://127.0.0.1:8731/ && "
            "echo reached && exit 0; sleep 0.2; done; exit 1", timeout=60)
        self.assertEqual((got.exit_code, got.stdout), (0, "reached\n"), got.stderr)
        self.assertIn(server.id, [r["id"] for r in self.sb.commands.list()])
        self.assertEqual(self.ps("python3 -m http.server 8731"), 1)
        # a kill ends it and everything of its tree; the next request finds nobody
        self.assertTrue(self.sb.commands.kill(server.id))
        self.assertNotEqual(server.wait(timeout=30)["state"], "running")
        self.assertEqual(self.ps("python3 -m http.server 8731"), 0)
        after = self.sb.commands.run("curl -s -m 5 http://127.0.0.1:8731/; echo $?")
        self.assertNotEqual(after.stdout.strip(), "0")
        # a tree: a shell whose children outlive it unless the kill takes them all
        tree = self.sb.commands.run("sleep 301 & sleep 302 & (sleep 303 &) ; wait",
                                    background=True)
        self.addCleanup(tree.kill)
        for _ in range(50):
            if self.ps("sleep 30") == 3:
                break
            time.sleep(0.2)
        self.assertEqual(self.ps("sleep 30"), 3)
        tree.kill()
        tree.wait(timeout=30)
        self.assertEqual(self.ps("sleep 30"), 0)

    def test_foreground_timeout_while_background_runs(self):
        bg = self.sb.commands.run("sleep 40; echo bg-done", background=True)
        self.addCleanup(bg.kill)
        t = time.monotonic()
        with self.assertRaises(TimeoutException):
            self.sb.commands.run("sleep 30", timeout=2)
        self.assertLess(time.monotonic() - t, 20)  # not held by the background run
        self.assertTrue(bg.running)
        fg = self.sb.commands.run("echo fg", timeout=10)
        self.assertEqual(fg.stdout, "fg\n")
        bg.kill()

    def test_kernel_and_command_overlap(self):
        self.sb.run_code("1")  # the kernel started first: its start (seconds) is not the run's
        py = self.sb.commands.start(None, language="python", kernel=True, code=(
            "import time\na = time.time()\ntime.sleep(4)\nprint(a, time.time())"))
        sh = self.sb.commands.run("a=$(date +%s.%N); sleep 4; echo $a $(date +%s.%N)",
                                  background=True)
        p0, p1 = map(float, py.result().stdout.split())
        s0, s1 = map(float, sh.result().stdout.split())
        # both ran at once: each started before the other ended
        self.assertLess(p0, s1)
        self.assertLess(s0, p1)

    def test_unread_run_does_not_hold_another(self):
        # nobody reads it: its replay buffer (256 KiB here) fills, the agent runs out of credit
        flood = self.sb.commands.start("yes flood", timeout=120)
        self.addCleanup(flood.kill)
        time.sleep(3)
        t = time.monotonic()
        quick = self.sb.commands.run("echo quick", timeout=60)
        self.assertEqual(quick.stdout, "quick\n")
        self.assertLess(time.monotonic() - t, 30)
        self.assertTrue(flood.running)
        flood.kill()
        self.assertEqual(flood.wait(timeout=60)["state"], "done")
        self.assertEqual(self.ps("yes flood"), 0)

    def test_background_output_attached_later(self):
        run = self.sb.commands.run("for i in 1 2 3 4 5; do echo line-$i; sleep 0.3; done",
                                   background=True)
        time.sleep(3)  # it ran (and ended) while nobody read it
        again = self.sb.commands.connect(run.id)
        res = again.result()
        self.assertEqual(res.stdout.split(), ["line-%d" % i for i in range(1, 6)])
        self.assertEqual(res.exit_code, 0)

    def test_many_at_once(self):
        # up to the session's limit of unfinished runs (16), then 429 with the limit's name
        runs = []
        with self.assertRaises(APIError) as e:
            for i in range(40):
                runs.append(self.sb.commands.start("sleep 2; echo run-%d" % i))
        self.assertEqual((e.exception.status, e.exception.limit), (429, "active_runs"))
        self.assertGreaterEqual(len(runs), 12)
        outs = [r.result().stdout for r in runs]
        self.assertEqual(outs, ["run-%d\n" % i for i in range(len(runs))])

    def test_cli_detach_and_proc(self):
        srv = ["--server", "unix:" + self.d.sock]
        sid = self.sb.id
        r = altest.run(srv + ["exec", "--session", sid, "--detach", "--", "sh", "-c",
                              "for i in 1 2 3; do echo p-$i; sleep 0.5; done; exit 3"])
        self.assertEqual(r.returncode, 0, r.stderr)
        rid = r.stdout.decode().strip()
        self.assertRegex(rid, r"^r[0-9]+$")
        r = altest.run(srv + ["proc", "ls", sid])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(rid, r.stdout.decode())
        r = altest.run(srv + ["proc", "wait", sid, rid])
        self.assertEqual(r.returncode, 3, r.stderr)
        r = altest.run(srv + ["proc", "logs", sid, rid])
        self.assertEqual((r.returncode, r.stdout), (3, b"p-1\np-2\np-3\n"), r.stderr)
        r = altest.run(srv + ["exec", "--session", sid, "--detach", "--", "sleep", "300"])
        rid = r.stdout.decode().strip()
        r = altest.run(srv + ["proc", "kill", sid, rid])
        self.assertEqual(r.returncode, 0, r.stderr)
        r = altest.run(srv + ["proc", "wait", sid, rid])
        self.assertNotEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.ps("sleep 300"), 0)
        # a kernel run's value prints as a local one's does
        r = altest.run(srv + ["exec", "--session", sid, "--lang", "python", "--kernel", "-c",
                              "6 * 7"])
        self.assertEqual((r.returncode, r.stdout), (0, b"42\n"), r.stderr)
        r = altest.run(srv + ["exec", "--detach", "--", "true"])
        self.assertEqual(r.returncode, 2)
        self.assertIn(b"--detach needs --session", r.stderr)

    def test_proc_logs_watches_and_never_touches(self):
        """proc logs prints what the run has said and returns while the run lives; -n, --since
        and -f as docker's logs; leaving the viewer (Ctrl-C, SIGTERM) leaves the run."""
        from test_terminal import Term
        srv = ["--server", "unix:" + self.d.sock]
        sid = self.sb.id
        r = altest.run(srv + ["exec", "--session", sid, "--detach", "--", "sh", "-c",
                              "i=0; while :; do i=$((i+1)); echo tick-$i; sleep 0.2; done"])
        self.assertEqual(r.returncode, 0, r.stderr)
        rid = r.stdout.decode().strip()

        def ticks(out):
            return [int(x[5:]) for x in out.decode().split()]
        time.sleep(2)
        r = altest.run(srv + ["proc", "logs", sid, rid], timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)  # the run lives: it has no status yet
        seen = ticks(r.stdout)
        self.assertGreaterEqual(len(seen), 3)
        self.assertEqual(seen, list(range(1, len(seen) + 1)))
        r = altest.run(srv + ["proc", "logs", "--tail", "2", sid, rid], timeout=30)
        last = ticks(r.stdout)
        self.assertEqual((r.returncode, len(last)), (0, 2), r.stderr)
        self.assertEqual(last[1], last[0] + 1)
        self.assertGreaterEqual(last[1], seen[-1])  # the end of what is held, at least
        since = time.time()
        time.sleep(1.5)
        r = altest.run(srv + ["proc", "logs", "--since", "%.3f" % since, sid, rid], timeout=30)
        newer = ticks(r.stdout)
        self.assertTrue(newer and newer[0] > last[1], (newer, last))
        self.assertLessEqual(len(newer), 12)
        r = altest.run(srv + ["proc", "logs", "--since", "yesterday", sid, rid])
        self.assertEqual(r.returncode, 2)
        self.assertIn(b"--since wants", r.stderr)
        # -f on a terminal, left by Ctrl-C and by SIGTERM: the run goes on
        for leave in ("ctrl-c", "term"):
            t = Term(srv + ["proc", "logs", "-f", "-n", "1", sid, rid])
            try:
                first = int(t.read_until(rb"tick-(\d+)").group(1))
                t.read_until(rb"tick-%d" % (first + 2))
                if leave == "ctrl-c":
                    t.send(b"\x03")
                else:
                    t.proc.terminate()
                t.wait(timeout=30)
            finally:
                t.close()
            self.assertIsNotNone(t.proc.returncode)
            self.assertNotIn(b"signal", t.buf)
            time.sleep(1)
            st = self.sb.client.request("GET", "/v1/sessions/%s/runs/%s" % (sid, rid))
            self.assertEqual(st["state"], "running", (leave, st))
        r = altest.run(srv + ["proc", "logs", sid, "r999"])
        self.assertEqual(r.returncode, 125)
        self.assertIn(b"r999", r.stderr)
        altest.run(srv + ["proc", "kill", sid, rid])

    def test_client_waits_for_a_port(self):
        """The client's README: a server started in the background is reached after
        wait_for_port; get_host over the socket says how to get a TCP address."""
        with self.assertRaises(TimeoutError):
            self.sb.wait_for_port(8765, timeout=2)
        srv = self.sb.commands.run("sleep 2; cd /tmp && exec python3 -m http.server 8765",
                                   background=True)
        self.addCleanup(srv.kill)
        self.sb.wait_for_port(8765, timeout=120)
        st, _, _ = self.sb.request_port(8765, "/")
        self.assertEqual(st, 200)
        with self.assertRaises(ValueError) as e:
            self.sb.get_host(8765)
        self.assertIn("airlockd key add", str(e.exception))

    def test_cli_commit_of_a_daemon_session(self):
        """airlock image commit on a session airlockd holds saves it as the caller's image
        there (it was 'no running session' though ps listed it)."""
        srv = ["--server", "unix:" + self.d.sock]

        def drop():  # the daemon's images are the build's image directory's
            for d in glob.glob(os.path.join(altest.IMAGE_DIR, "own-*-cli-commit")):
                shutil.rmtree(d, ignore_errors=True)
        self.addCleanup(drop)
        r = altest.run(srv + ["image", "commit", self.sb.id, "cli-commit"], timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(b"saved from session", r.stderr)
        r = altest.run(srv + ["image", "commit", self.sb.id, "cli-commit"], timeout=300)
        self.assertEqual(r.returncode, 1)
        self.assertIn(b"exists", r.stderr)  # the first one made it
        r = altest.run(srv + ["image", "commit", "--force", self.sb.id, "cli-commit"],
                       timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = altest.run(srv + ["image", "commit", "s-nonesuch", "x"], timeout=60)
        self.assertEqual(r.returncode, 1)
        self.assertIn(b"s-nonesuch", r.stderr)

    def test_file_copy_while_a_run_runs(self):
        bg = self.sb.commands.run("sleep 60", background=True)
        self.addCleanup(bg.kill)
        data = os.urandom(3 << 20)
        self.sb.files.write("/tmp/during.bin", data)
        self.assertEqual(self.sb.files.read("/tmp/during.bin"), data)
        bg.kill()


NET_GUEST = r"""
import json, urllib.error, urllib.request
R = {}
for k, url in (("web", "http://web.test/hello.txt"), ("wild", "http://sub.wild.test/hello.txt")):
    try:
        with urllib.request.urlopen(url, timeout=40) as r:
            R[k] = [r.status, r.read().decode(errors="replace")]
    except urllib.error.HTTPError as e:
        R[k] = [e.code, ""]
    except Exception as e:
        R[k] = [0, repr(e)]
print(json.dumps(R))
"""


@unittest.skipUnless(os.geteuid() == 0, "needs root for network namespaces")
class PtyTest(DebianSessionTest):
    """Terminals through the API (issue 30): a pty run (POST /runs with pty) through the Python
    client's sb.pty and through an SSE + POST client of the test's own; the CLI's shell into a
    session of airlockd; sizes refused; floods bounded; closing ends the shell's tree; another
    owner sees nothing. One debian session for all."""

    def until(self, pty, pattern, timeout=60):
        """Waits until the terminal's output since the last match matches pattern (bytes)."""
        rx = re.compile(pattern)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            m = rx.search(pty.output, getattr(pty, "seen", 0))
            if m:
                pty.seen = m.end()
                return m
            if pty._end is not None:
                break
            time.sleep(0.05)
        raise AssertionError("no %r within %d s; got %r" % (pattern, timeout,
                                                            bytes(pty.output[-600:])))

    def ps(self, regex):
        out = self.sb.commands.run("ps -eo args | grep -cE '^%s' || true" % regex).stdout
        return int(out.strip() or 0)

    def test_client_shell(self):
        chunks = []
        t = self.sb.pty.create((24, 80), on_data=chunks.append)
        self.assertEqual(t.get()["pty"], {"rows": 24, "cols": 80})
        self.until(t, rb"[#$] $")
        t.send_input("stty size; echo $TERM; tty; pwd\n")
        self.until(t, rb"\r24 80\r\nxterm-256color\r\n/dev/pts/\d+\r\n/workspace\r\n")
        t.resize(30, 100)
        self.assertEqual(t.get()["pty"], {"rows": 30, "cols": 100})
        t.send_input("stty size\n")
        self.until(t, rb"\r30 100\r\n")
        # escape sequences reach the terminal as they are (it is a terminal)
        t.send_input("printf '\\033[31mred\\033[0m\\n'\n")
        self.until(t, rb"\x1b\[31mred\x1b\[0m")
        # a REPL: its prompt without a newline, evaluated at Enter
        t.send_input("python3 -q\n")
        self.until(t, rb">>> $")
        t.send_input("6*7\n")
        self.until(t, rb"42\r\n>>> $")
        t.send_input(b"\x04")
        self.until(t, rb"[#$] $")
        # Ctrl-C is the terminal's: it interrupts the foreground job, the shell lives on
        t.send_input("sleep 100\n")
        self.until(t, rb"sleep 100\r\n")
        time.sleep(1)
        t0 = time.monotonic()
        t.send_input(b"\x03")
        self.until(t, rb"[#$] $", timeout=30)  # the prompt again, long before 100 s
        self.assertLess(time.monotonic() - t0, 30)
        t.send_input("echo alive $((6*7))\n")
        self.until(t, rb"alive 42")
        t.send_input("exit 7\n")
        res = t.wait(60)
        self.assertEqual(res.exit_code, 7, res.result)
        self.assertEqual(b"".join(chunks), bytes(t.output))
        self.assertIn("alive 42", res.stdout)
        # its events again, from the start (a terminal reattached)
        again = self.sb.pty.connect(t.id)
        self.assertEqual(again.wait(30).exit_code, 7)
        self.assertEqual(bytes(again.output), bytes(t.output))

    def test_own_sse_client(self):
        # The wire as a client of its own speaks it: JSON to start, SSE out, raw bytes in.
        c = self.d.unix()
        base = "/v1/sessions/%s/runs" % self.sb.id
        run = c.request("POST", base, body={"argv": ["cat"], "pty": {"rows": 5, "cols": 40}})
        self.assertEqual(run["pty"], {"rows": 5, "cols": 40})
        conn, r = c.open("GET", base + "/%s/events" % run["id"], headers={"Last-Event-ID": "0"})
        self.assertEqual(r.getheader("Content-Type"), "text/event-stream")
        got = b""
        sent = False
        seen = []
        while True:
            line = r.readline()
            seen.append(line)
            self.assertTrue(line, "the stream ended early: %r" % seen[-12:])
            if line.startswith(b"event: start") and not sent:
                c.request("POST", base + "/%s/stdin" % run["id"], body=b"abc\r",
                          headers={"Content-Type": "application/octet-stream"})
                sent = True
            if line.startswith(b"data: ") and b"data_b64" in line:
                got += base64.b64decode(json.loads(line[6:])["data_b64"])
                if got.count(b"abc\r\n") >= 2:  # the echo, then cat's own line
                    break
        self.assertEqual(got, b"abc\r\nabc\r\n")
        # EOF is the terminal closing: cat ends (SIGHUP)
        c.request("POST", base + "/%s/stdin?eof=1" % run["id"], body=b"",
                  headers={"Content-Type": "application/octet-stream"})
        rest = r.read()
        conn.close()
        self.assertIn(b"event: exit", rest)
        end = c.request("GET", base + "/%s/wait?timeout_s=30" % run["id"])["result"]
        self.assertIn((end["how"], end["value"]), [("signaled", signal.SIGHUP), ("exited", 0)])

    def test_bad_sizes_and_requests(self):
        c = self.d.unix()
        base = "/v1/sessions/%s/runs" % self.sb.id
        for pty in ({"rows": 0, "cols": 0}, {"rows": 100000, "cols": 100000}, {"rows": 24},
                    {"rows": 2.5, "cols": 80}, [24, 80], "24x80", {"rows": -1, "cols": 80}):
            with self.assertRaises(APIError) as e:
                c.request("POST", base, body={"pty": pty})
            self.assertEqual(e.exception.status, 400, pty)
        with self.assertRaises(APIError) as e:
            c.request("POST", base, body={"code": "1", "language": "python", "kernel": True,
                                          "pty": {"rows": 24, "cols": 80}})
        self.assertEqual(e.exception.status, 400)
        t = self.sb.pty.create((24, 80), cmd="sleep 60")
        for size in ({"rows": 0, "cols": 0}, {"rows": 100000, "cols": 100000}, {}):
            with self.assertRaises(APIError) as e:
                c.request("POST", base + "/%s/resize" % t.id, body=size)
            self.assertEqual(e.exception.status, 400, size)
        self.assertEqual(t.get()["pty"], {"rows": 24, "cols": 80})
        self.assertTrue(t.kill())
        self.assertEqual(t.wait(30).error["code"], "cancelled")
        # a run without a terminal has no size to change
        plain = self.sb.commands.start("sleep 30")
        with self.assertRaises(APIError) as e:
            c.request("POST", base + "/%s/resize" % plain.id, body={"rows": 5, "cols": 5})
        self.assertEqual((e.exception.status, e.exception.code), (409, "no_pty"))
        plain.kill()
        # another owner: nothing of it is there
        key = self.d.key("pty-other")
        other = Sandbox(client=self.d.tcp(key), _info={"id": self.sb.id})
        t = self.sb.pty.create((24, 80), cmd="cat")
        for call in (lambda: other.pty.send_input(t.id, b"x"),
                     lambda: other.pty.resize(t.id, (5, 5)),
                     lambda: other.pty.create((24, 80)),
                     lambda: other.pty.connect(t.id)):
            with self.assertRaises(APIError) as e:
                call()
            self.assertEqual(e.exception.status, 404)
        t.kill()
        t.wait(30)

    def test_close_ends_the_tree(self):
        t = self.sb.pty.create((24, 80))
        self.until(t, rb"[#$] $")
        t.send_input("sleep 1001 & sh -c 'sleep 1002' & echo started\n")
        self.until(t, rb"started\r\n")
        self.assertEqual(self.ps("sleep 100[12]"), 2)
        t.close()
        res = t.wait(30)
        self.assertIsNotNone(res.result.get("how"), res.result)
        deadline = time.time() + 10
        while self.ps("sleep 100[12]") and time.time() < deadline:
            time.sleep(0.5)
        self.assertEqual(self.ps("sleep 100[12]"), 0)

    def test_z_flood_is_bounded(self):
        # Nobody reads: the daemon holds its run buffer and no more, the guest's writer waits,
        # and the session's other requests are answered meanwhile.
        before = self.d.rss_kib()
        floods = [self.sb.client.request("POST", self.sb._path + "/runs", body={
            "argv": ["sh", "-c", cmd], "pty": {"rows": 24, "cols": 80}})
            for cmd in ("yes", "cat /dev/urandom")]
        time.sleep(8)
        t0 = time.monotonic()
        self.assertEqual(self.sb.commands.run("echo beside", timeout=30).stdout, "beside\n")
        beside_s = time.monotonic() - t0
        grown = self.d.rss_kib() - before

        def events():
            return [self.sb.client.request("GET", self.sb._path + "/runs/" + f["id"])
                    for f in floods]
        first = events()
        time.sleep(2)
        # the guest's writers wait: no event more is made while the buffer is full
        self.assertEqual([(x["state"], x["events"]) for x in events()],
                         [("running", x["events"]) for x in first])
        self.assertLess(grown, 24 * 1024, "airlockd grew %d KiB" % grown)
        print("# pty floods unread: airlockd +%d KiB; a run beside them %.2f s"
              % (grown, beside_s))
        for f in floods:
            self.assertTrue(Run(self.sb, f).kill())
            self.assertEqual(Run(self.sb, f).wait(60)["state"], "done")

    def test_cli_shell_into_daemon_session(self):
        from test_terminal import Term
        srv = ["--server", "unix:" + self.d.sock]
        self.sb.files.write("/workspace/from-api.txt", b"written through the API\n")
        t = Term(srv + ["shell", self.sb.id], rows=27, cols=91)
        self.addCleanup(t.close)
        t.read_until(rb"[#$] $")
        t.send(b"pwd; cat from-api.txt; stty size\r")
        t.read_until(rb"/workspace\r\nwritten through the API\r\n27 91\r\n")
        t.resize(33, 120)
        time.sleep(1)
        t.send(b"stty size\r")
        t.read_until(rb"33 120\r\n")
        t.send(b"exit 5\r")
        self.assertEqual(t.wait(60), 5)
        self.assertEqual(termios.tcgetattr(t.slave), t.before, "the terminal's mode")
        # exec -it into the session: docker's way
        t = Term(srv + ["exec", "-it", "--session", self.sb.id, "--", "sh", "-c",
                        "tty; read x; echo got $x"])
        self.addCleanup(t.close)
        t.read_until(rb"/dev/pts/\d+\r\n")
        t.send(b"hello\r")
        t.read_until(rb"got hello\r\n")
        self.assertEqual(t.wait(60), 0)


ECHO_SERVER = r"""
import http.server, json, sys, time
class H(http.server.BaseHTTPRequestHandler):
    def reply(self, head_only=False):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n).decode("latin-1")
        out = json.dumps({"method": self.command, "path": self.path,
                          "headers": {k.lower(): v for k, v in self.headers.items()},
                          "body": body}).encode()
        self.send_response(201 if self.command == "POST" else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-From-Guest", "yes")
        self.send_header("Set-Cookie", "app=1; Path=/")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        if not head_only:
            self.wfile.write(out)
    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = lambda self: self.reply()
    def do_HEAD(self):
        self.reply(True)
    def log_message(self, *a):
        pass
class Slow(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        while True:
            self.wfile.write(b"tick\n")
            self.wfile.flush()
            time.sleep(0.5)
    def log_message(self, *a):
        pass
class WS(http.server.BaseHTTPRequestHandler):
    # A WebSocket server of the test's own (RFC 6455, stdlib): its first message is what it
    # was asked (path, headers); then it echoes each message, or floods at /flood.
    def do_GET(self):
        import base64, hashlib, struct
        if self.path.startswith("/refuse"):
            self.send_response(403)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        key = self.headers["Sec-WebSocket-Key"]
        acc = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11")
                                            .encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", acc)
        if self.headers.get("Sec-WebSocket-Protocol"):
            self.send_header("Sec-WebSocket-Protocol", "chat")
        self.end_headers()
        def send(op, data):
            n = len(data)
            head = bytes([0x80 | op]) + (bytes([n]) if n < 126 else
                   b"\x7e" + struct.pack(">H", n) if n < 65536 else b"\x7f" + struct.pack(">Q", n))
            self.wfile.write(head + data)
            self.wfile.flush()
        send(1, json.dumps({"path": self.path, "headers": {k.lower(): v for k, v in
                            self.headers.items()}}).encode())
        if self.path.startswith("/flood"):
            while True:
                send(2, b"x" * 65536)
        r = self.rfile
        while True:
            h = r.read(2)
            if len(h) < 2:
                return
            op, n = h[0] & 15, h[1] & 127
            if n == 126:
                n = struct.unpack(">H", r.read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", r.read(8))[0]
            mask = r.read(4)
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(r.read(n)))
            if op == 8:
                send(8, data)
                return
            send(op, data)
    def log_message(self, *a):
        pass
cls = {"slow": Slow, "ws": WS}.get(sys.argv[1], H)
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[2])), cls).serve_forever()
"""


class WsConn:
    """A socket and the bytes read past what was parsed."""

    def __init__(self, s, rest):
        self.s, self.rest = s, rest
        self.sendall, self.recv, self.close = s.sendall, s.recv, s.close


class PortsTest(DebianSessionTest):
    """A session's ports through airlockd (issue 30): the reverse proxy at
    /v1/sessions/{id}/ports/{port}/ and host-routed at PORT-ID.localhost, the open-port link's
    cookie, owners, what reaches the guest and what does not, bounds. One debian session."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.key = cls.d.key("ports-owner")
        cls.other = cls.d.key("ports-other")
        cls.sbk = Sandbox(image="debian", client=cls.d.tcp(cls.key))
        cls.sbk.files.write("/tmp/echo.py", ECHO_SERVER.encode())
        cls.sbk.commands.run("mkdir -p /tmp/www && head -c 67108864 /dev/urandom > /tmp/www/big"
                             " && sha256sum /tmp/www/big | cut -c1-64 > /tmp/www/big.sum")
        cls.servers = [cls.sbk.commands.run(cmd, background=True) for cmd in (
            "exec python3 /tmp/echo.py echo 8000",
            "cd /tmp/www && exec python3 -m http.server 8001",
            "exec python3 /tmp/echo.py slow 8002",
            "exec python3 /tmp/echo.py ws 8003")]
        end = time.time() + 120
        while time.time() < end:
            st, _, _ = cls.get(cls, "/v1/sessions/%s/ports/8000/" % cls.sbk.id)
            st1, _, _ = cls.get(cls, "/v1/sessions/%s/ports/8001/big.sum" % cls.sbk.id)
            if st == 200 and st1 == 200:
                break
            time.sleep(1)

    @classmethod
    def tearDownClass(cls):
        if cls.d.p.poll() is not None:
            print(cls.d.text()[-3000:])
        cls.sbk.kill()
        super().tearDownClass()

    def get(self, path, headers=None, method="GET", body=None, key=True, stream=False):
        h = {"Authorization": "Bearer " + (self.key if key is True else key)} if key else {}
        h.update(headers or {})
        c = http.client.HTTPConnection("127.0.0.1", self.d.port, timeout=60)
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        if stream:
            return r.status, r, c
        data = r.read()
        c.close()
        return r.status, r, data

    def echo(self, path, **kw):
        st, r, data = self.get("/v1/sessions/%s/ports/8000%s" % (self.sbk.id, path), **kw)
        return st, r, json.loads(data) if data.startswith(b"{\"method") else data

    def test_cli_port_forwards_through_the_daemon(self):
        """airlock port on a session airlockd holds: a host port whose connections are byte
        streams through the daemon (GET .../tcp/PORT, Upgrade: airlock-tcp), as the key's."""
        env = dict(os.environ, AIRLOCK_API_KEY=self.key)
        srv = ["--server", "http://127.0.0.1:%d" % self.d.port]
        p = altest.popen(srv + ["port", self.sbk.id, "8001:0"], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            line = p.stderr.readline().decode()
            m = re.search(r"forwarding 127\.0\.0\.1:(\d+) to port 8001", line)
            self.assertTrue(m, line)
            host_port = int(m.group(1))
            want = self.sbk.files.read("/tmp/www/big.sum").decode().strip()
            c = http.client.HTTPConnection("127.0.0.1", host_port, timeout=60)
            c.request("GET", "/big")
            r = c.getresponse()
            self.assertEqual(r.status, 200)
            self.assertEqual(hashlib.sha256(r.read()).hexdigest(), want)  # 64 MiB both ways
            c.close()
            # a raw exchange, the request half-closed: the answer still comes back
            s = socket.create_connection(("127.0.0.1", host_port), timeout=60)
            s.sendall(b"GET /big.sum HTTP/1.0\r\n\r\n")
            s.shutdown(socket.SHUT_WR)
            got = b""
            while True:
                b = s.recv(65536)
                if not b:
                    break
                got += b
            s.close()
            self.assertIn(want.encode(), got)
            p.send_signal(signal.SIGINT)
            self.assertEqual(p.wait(timeout=30), 0)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            p.stderr.close()
        # another key's session is not there for this key; nor is a made-up one
        for who, sid in ((self.other, self.sbk.id), (self.key, "s-nonesuch")):
            r = altest.run(srv + ["port", sid, "8001:0"], timeout=30,
                           env={"AIRLOCK_API_KEY": who})
            self.assertEqual(r.returncode, 125, r.stderr)
            self.assertIn(sid.encode(), r.stderr)
        # the route itself: an upgrade only, never a browser's
        st, _, data = self.get("/v1/sessions/%s/tcp/8001" % self.sbk.id)
        self.assertEqual(st, 400, data)
        st, _, data = self.get("/v1/sessions/%s/tcp/8001" % self.sbk.id, headers={
            "Upgrade": "airlock-tcp", "Connection": "Upgrade", "Origin": "http://evil.test"})
        self.assertEqual(st, 403, data)

    def test_path_proxy(self):
        st, r, j = self.echo("/a/b%20c?x=1&y=two%20words",
                             headers={"Cookie": "airlock_token=secret; theirs=1",
                                      "X-Custom": "kept", "X-Airlock-CSRF": "1"})
        self.assertEqual(st, 200, j)
        self.assertEqual(j["method"], "GET")
        self.assertEqual(j["path"], "/a/b%20c?x=1&y=two%20words")
        hd = j["headers"]
        self.assertEqual(hd["host"], "localhost:8000")
        self.assertEqual(hd["x-custom"], "kept")
        self.assertEqual(hd.get("cookie"), "theirs=1")  # ours stay here
        for k in ("authorization", "x-airlock-csrf"):
            self.assertNotIn(k, hd)
        self.assertNotIn(self.key, json.dumps(j))
        self.assertEqual(r.getheader("X-From-Guest"), "yes")
        self.assertEqual(r.getheader("Set-Cookie"), "app=1; Path=/")
        # on the daemon's own origin a guest's page runs sandboxed (an opaque origin)
        self.assertTrue(r.getheader("Content-Security-Policy").startswith("sandbox"))
        # a body, another method
        st, r, j = self.echo("/post", method="POST", body=b"a=1&b=2",
                             headers={"Content-Type": "application/x-www-form-urlencoded"})
        self.assertEqual((st, j["method"], j["body"]), (201, "POST", "a=1&b=2"))
        st, r, data = self.echo("/", method="HEAD")
        self.assertEqual((st, data), (200, b""))
        # the unix socket needs no key
        c = self.d.unix()
        conn, resp = c.open("GET", "/v1/sessions/%s/ports/8000/unix" % self.sbk.id)
        self.assertEqual(resp.status, 404)  # the unix caller is another owner than this key
        conn.close()
        conn, resp = c.open("GET", "/v1/sessions/%s/ports/8000/unix" % self.sb.id)
        self.assertEqual(resp.status, 502)  # its own session: nothing listens there
        conn.close()

    def test_owners(self):
        st, _, _ = self.echo("/", key=self.other)
        self.assertEqual(st, 404)
        st, _, _ = self.echo("/", key=False)
        self.assertEqual(st, 401)
        st, _, _ = self.get("/v1/sessions/airlock-000000000000/ports/8000/")
        self.assertEqual(st, 404)
        host = {"Host": "8000-%s.localhost:%d" % (self.sbk.id, self.d.port)}
        st, _, _ = self.get("/", headers=host, key=self.other)
        self.assertEqual(st, 404)
        st, _, _ = self.get("/", headers=host, key=False)
        self.assertEqual(st, 401)
        for bad in ("0", "65536", "x", "-1"):
            st, _, _ = self.get("/v1/sessions/%s/ports/%s/" % (self.sbk.id, bad))
            self.assertIn(st, (400, 404), bad)

    def test_host_routing_and_the_link(self):
        host = "8000-%s.localhost:%d" % (self.sbk.id, self.d.port)
        st, r, data = self.get("/deep/path?q=1", headers={"Host": host})
        self.assertEqual(st, 200, data)
        j = json.loads(data)
        self.assertEqual(j["path"], "/deep/path?q=1")
        self.assertIsNone(r.getheader("Content-Security-Policy"))  # an origin of its own
        # the page's link: a token for this port alone, then a cookie of that host
        st, r, _ = self.get("/v1/sessions/%s/open-port/8000" % self.sbk.id,
                            headers={"Host": "localhost:%d" % self.d.port})
        self.assertEqual(st, 303)
        loc = r.getheader("Location")
        m = re.match(r"http://8000-%s\.localhost:%d/\?airlock_port_token=([0-9a-f]{64})$"
                     % (re.escape(self.sbk.id), self.d.port), loc)
        self.assertTrue(m, loc)
        token = m.group(1)
        st, r, _ = self.get("/?airlock_port_token=" + token, headers={"Host": host}, key=False)
        self.assertEqual(st, 303)
        self.assertEqual(r.getheader("Location"), "/")
        cookie = r.getheader("Set-Cookie")
        self.assertIn("HttpOnly", cookie)
        self.assertIn("SameSite=Lax", cookie)
        cv = cookie.split(";")[0]
        st, r, data = self.get("/x", headers={"Host": host, "Cookie": cv}, key=False)
        self.assertEqual(st, 200, data)
        self.assertNotIn("airlock_port", json.loads(data)["headers"].get("cookie", ""))
        self.assertNotIn(token, data.decode())
        # its state-changing requests need no CSRF header (the cookie is SameSite)
        st, _, _ = self.get("/form", method="POST", body=b"x",
                            headers={"Host": host, "Cookie": cv, "Origin": "http://" + host},
                            key=False)
        self.assertEqual(st, 201)
        # for that port of that session only
        for other in ("8001-%s.localhost:%d" % (self.sbk.id, self.d.port),
                      "8000-%s.localhost:%d" % (self.sb.id, self.d.port)):
            st, _, _ = self.get("/", headers={"Host": other, "Cookie": cv}, key=False)
            self.assertEqual(st, 401, other)
            st, _, _ = self.get("/?airlock_port_token=" + token, headers={"Host": other},
                                key=False)
            self.assertEqual(st, 401, other)
        # nor for the API
        st, _, _ = self.get("/v1/sessions", headers={"Cookie": "airlock_token=" + token},
                            key=False)
        self.assertEqual(st, 401)
        # another owner's link is no link
        st, _, _ = self.get("/v1/sessions/%s/open-port/8000" % self.sbk.id, key=self.other)
        self.assertEqual(st, 404)

    def test_client(self):
        st, h, body = self.sbk.request_port(8000, "/via/client?z=1", method="PUT", body=b"hi")
        self.assertEqual((st, json.loads(body)["path"], json.loads(body)["body"]),
                         (200, "/via/client?z=1", "hi"))
        host = self.sbk.get_host(8000)
        self.assertEqual(host, "8000-%s.localhost:%d" % (self.sbk.id, self.d.port))
        st, _, data = self.get("/", headers={"Host": host})
        self.assertEqual(st, 200, data)

    def test_nothing_listening(self):
        st, _, data = self.get("/v1/sessions/%s/ports/8009/" % self.sbk.id)
        self.assertEqual(st, 502)
        self.assertIn(b"nothing answers on 127.0.0.1:8009 in the guest", data)

    def test_download_and_a_slow_reader(self):
        import hashlib
        before = self.d.rss_kib()
        st, r, c = self.get("/v1/sessions/%s/ports/8001/big" % self.sbk.id, stream=True)
        self.assertEqual(st, 200)
        h = hashlib.sha256()
        first = r.read(1 << 20)
        h.update(first)
        time.sleep(3)  # a reader that stops (under connection_timeout_s): a window, not the file
        grown = self.d.rss_kib() - before
        n = len(first)
        while True:
            b = r.read(1 << 20)
            if not b:
                break
            h.update(b)
            n += len(b)
        c.close()
        self.assertEqual(n, 64 << 20)
        st, _, want = self.get("/v1/sessions/%s/ports/8001/big.sum" % self.sbk.id)
        self.assertEqual(h.hexdigest().encode() + b"\n", want)
        self.assertLess(grown, 32 * 1024, "airlockd grew %d KiB" % grown)
        print("# proxy: 64 MiB, a reader paused 3 s: airlockd +%d KiB" % grown)

    def ws(self, path, headers=None, key=True, early=b"", host=None):
        """A WebSocket client of the test's own: the handshake (its accept checked against the
        key), then (sock, status, head). early: bytes sent with the request's head at once."""
        k = base64.b64encode(os.urandom(16)).decode()
        h = {"Host": host or "127.0.0.1:%d" % self.d.port, "Upgrade": "websocket",
             "Connection": "keep-alive, Upgrade", "Sec-WebSocket-Key": k,
             "Sec-WebSocket-Version": "13"}
        if key:
            h["Authorization"] = "Bearer " + (self.key if key is True else key)
        h.update(headers or {})
        s = socket.create_connection(("127.0.0.1", self.d.port), timeout=60)
        s.sendall(("GET %s HTTP/1.1\r\n" % path + "".join("%s: %s\r\n" % kv for kv in h.items())
                   + "\r\n").encode() + early)
        buf = b""
        while b"\r\n\r\n" not in buf:
            b = s.recv(4096)
            if not b:
                break
            buf += b
        head, _, rest = buf.partition(b"\r\n\r\n")
        status = int(head.split()[1])
        if status == 101:
            want = base64.b64encode(hashlib.sha1((k + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11")
                                                 .encode()).digest())
            fields = dict(l.split(b": ", 1) for l in head.split(b"\r\n")[1:] if b": " in l)
            fields = {k.lower(): v for k, v in fields.items()}
            self.assertEqual(fields.get(b"sec-websocket-accept"), want, head)
        return WsConn(s, rest), status, head.decode("latin-1")

    @staticmethod
    def ws_frame(op, data):
        mask = os.urandom(4)
        n = len(data)
        head = bytes([0x80 | op]) + (bytes([0x80 | n]) if n < 126 else
                                     bytes([0xfe]) + struct.pack(">H", n) if n < 65536 else
                                     bytes([0xff]) + struct.pack(">Q", n))
        return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data))

    @staticmethod
    def ws_read(s):
        def take(n):
            while len(s.rest) < n:
                b = s.recv(65536)
                if not b:
                    raise EOFError("the WebSocket closed")
                s.rest += b
            out, s.rest = s.rest[:n], s.rest[n:]
            return out
        h = take(2)
        n = h[1] & 127
        if n == 126:
            n = struct.unpack(">H", take(2))[0]
        elif n == 127:
            n = struct.unpack(">Q", take(8))[0]
        return h[0] & 15, take(n)

    def test_websocket(self):
        path = "/v1/sessions/%s/ports/8003/sock?x=1" % self.sbk.id
        s, st, head = self.ws(path, headers={"Sec-WebSocket-Protocol": "chat, other",
                                             "Cookie": "airlock_token=secret; theirs=1"},
                              early=self.ws_frame(1, b"early bird"))
        self.assertEqual(st, 101, head)
        self.assertIn("sec-websocket-protocol: chat", head.lower())
        op, first = self.ws_read(s)
        asked = json.loads(first)
        self.assertEqual(asked["path"], "/sock?x=1")
        hd = asked["headers"]
        self.assertEqual((hd["host"], hd["upgrade"].lower()), ("localhost:8003", "websocket"))
        self.assertEqual(hd.get("cookie"), "theirs=1")
        self.assertNotIn("authorization", hd)
        self.assertNotIn(self.key, first.decode())
        # the bytes sent with the head (MHD read them past it) came through first
        self.assertEqual(self.ws_read(s), (1, b"early bird"))
        big = os.urandom(300000)
        s.sendall(self.ws_frame(1, b"hello") + self.ws_frame(2, big))
        self.assertEqual(self.ws_read(s), (1, b"hello"))
        self.assertEqual(self.ws_read(s), (2, big))
        s.sendall(self.ws_frame(8, b"\x03\xe8"))
        self.assertEqual(self.ws_read(s), (8, b"\x03\xe8"))
        s.close()
        # a service that refuses the upgrade: its status, our reason
        s, st, head = self.ws("/v1/sessions/%s/ports/8003/refuse" % self.sbk.id)
        self.assertEqual(st, 403, head)
        self.assertIn("upgrade_refused", s.rest.decode() + s.recv(4096).decode())
        s.close()
        # nothing listening; another owner; no key
        for port, key, want in ((8009, True, 502), (8003, self.other, 404), (8003, False, 401)):
            s, st, head = self.ws("/v1/sessions/%s/ports/%d/" % (self.sbk.id, port), key=key)
            self.assertEqual(st, want, head)
            s.close()

    def test_websocket_host_routed_and_origins(self):
        host = "8003-%s.localhost:%d" % (self.sbk.id, self.d.port)
        st, r, _ = self.get("/v1/sessions/%s/open-port/8003" % self.sbk.id,
                            headers={"Host": "localhost:%d" % self.d.port})
        token = r.getheader("Location").split("airlock_port_token=")[1]
        st, r, _ = self.get("/?airlock_port_token=" + token, headers={"Host": host}, key=False)
        cv = r.getheader("Set-Cookie").split(";")[0]
        # the page of that origin: its cookie opens the socket
        s, st, head = self.ws("/", host=host, key=False,
                              headers={"Cookie": cv, "Origin": "http://" + host})
        self.assertEqual(st, 101, head)
        op, first = self.ws_read(s)
        self.assertNotIn("airlock_port", json.loads(first)["headers"].get("cookie", ""))
        s.sendall(self.ws_frame(1, b"routed"))
        self.assertEqual(self.ws_read(s), (1, b"routed"))
        s.close()
        # another site's page, or a guest's page sandboxed on the daemon's origin: refused,
        # even with the cookie
        for origin, h in (("http://evil.example", host), ("null", host),
                          ("null", "127.0.0.1:%d" % self.d.port)):
            path = "/" if h == host else "/v1/sessions/%s/ports/8003/" % self.sbk.id
            s, st, head = self.ws(path, host=h, key=h != host,
                                  headers={"Cookie": cv, "Origin": origin})
            self.assertEqual(st, 403, (origin, h, head))
            s.close()

    def test_websocket_flood_is_bounded(self):
        before = self.d.rss_kib()
        s, st, head = self.ws("/v1/sessions/%s/ports/8003/flood" % self.sbk.id)
        self.assertEqual(st, 101, head)
        self.ws_read(s)
        self.assertEqual(self.ws_read(s)[1], b"x" * 65536)
        time.sleep(3)  # a client that stops reading a guest that floods
        grown = self.d.rss_kib() - before
        n = 0
        for _ in range(200):
            n += len(self.ws_read(s)[1])
        self.assertEqual(n, 200 * 65536)  # it goes on when read again
        s.close()
        self.assertLess(grown, 32 * 1024, "airlockd grew %d KiB" % grown)
        print("# websocket flood, a reader paused 3 s: airlockd +%d KiB" % grown)

    def test_z_session_end_ends_its_streams(self):
        sb = Sandbox(image="debian", client=self.d.tcp(self.key))
        sb.files.write("/tmp/echo.py", ECHO_SERVER.encode())
        sb.commands.run("exec python3 /tmp/echo.py slow 8002", background=True)
        sb.commands.run("exec python3 /tmp/echo.py ws 8003", background=True)
        end = time.time() + 60
        while True:
            st, r, c = self.get("/v1/sessions/%s/ports/8002/" % sb.id, stream=True)
            if st == 200 or time.time() > end:
                break
            c.close()
            time.sleep(1)
        self.assertEqual(st, 200)
        self.assertEqual(r.readline(), b"tick\n")
        # Two floods whose callers stopped reading: every buffer between them and the guest
        # fills, and each tunnel's writer waits on a full socket. One caller hangs up (the relay
        # ends: its end may not wait on the writer); the other stays, not reading, while its
        # session is deleted (the delete may not wait on it, nor on the WebSocket's stall limit).
        # Each waited forever before.
        floods = []
        for _ in range(2):
            s, st, head = self.ws("/v1/sessions/%s/ports/8003/flood" % sb.id)
            self.assertEqual(st, 101, head)
            self.ws_read(s)
            self.assertEqual(self.ws_read(s)[1], b"x" * 65536)
            floods.append(s)
        time.sleep(3)  # the buffers fill
        floods[0].close()
        time.sleep(1)
        t0 = time.time()
        sb.client.timeout = 60
        sb.kill()
        self.assertLess(time.time() - t0, 30, "the session's end waited for a stalled caller")
        while r.readline():
            self.assertLess(time.time() - t0, 30, "the stream outlived its session")
        c.close()
        self.assertLess(time.time() - t0, 30)
        floods[1].close()


class NetTest(unittest.TestCase):
    """Network on request through the API (issue 18): net_allow_max bounds what a create may
    allow, the session's proxy reaches the lab (netlab.py, a network namespace) and its requests
    come back from GET .../net; a session without net has no NIC."""

    def test_net_policy_requests_and_no_nic(self):
        import netlab
        # The config's keys are checked with the library's allowlist syntax.
        with tempfile.TemporaryDirectory() as t:
            for line, bad in (("net_allow_max = web.test,a b", "net_allow_max"),
                              ("net_bytes_max = 0", "net_bytes_max")):
                conf = os.path.join(t, "c.conf")
                with open(conf, "w") as f:
                    f.write("keys_db = %s/k.db\n%s\n" % (t, line))
                p = subprocess.run([AIRLOCKD, "--config", conf, "key", "list"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                self.assertEqual(p.returncode, 1)
                self.assertIn("c.conf:2: bad value for '%s'" % bad, p.stderr)
        lab = netlab.NetLab().start()
        self.addCleanup(lab.stop)
        # the daemon's proxies resolve the lab
        d = Daemon(env={"AIRLOCK_NET_HOSTS_FILE": lab.hosts},
                   net_allow_max="web.test,*.wild.test", net_bytes_max=50000000)
        c = d.unix()
        try:
            # Outside the policy: 403 naming the host, before anything boots. A pattern wider
            # than the policy's is outside it too.
            for allow, host in ((["web.test", "other.test"], "other.test"),
                                (["*.test"], "*.test")):
                with self.assertRaises(APIError) as e:
                    Sandbox(image="debian", client=c, net=allow)
                self.assertEqual((e.exception.status, e.exception.code),
                                 (403, "net_host_forbidden"))
                self.assertIn("host %s is outside" % host, str(e.exception.args))
            with self.assertRaises(APIError) as e:
                Sandbox(image="debian", client=c, net={"allow": ["web.test"],
                                                       "bytes_max": 50000001})
            self.assertEqual((e.exception.status, e.exception.limit), (429, "net_bytes_max"))
            # A key's own cap replaces the config's.
            key = d.key("netkey", "--net-bytes-max", "1000")
            with self.assertRaises(APIError) as e:
                Sandbox(image="debian", client=d.tcp(key), net={"allow": ["web.test"],
                                                                "bytes_max": 1001})
            self.assertEqual((e.exception.status, e.exception.limit), (429, "net_bytes_max"))
            listing = subprocess.run([AIRLOCKD, "--config", d.conf, "key", "list"],
                                     stdout=subprocess.PIPE, check=True, text=True).stdout
            self.assertIn("net_bytes_max=1000", listing)
            for bad in (["-x"], [""], ["a b"], "web.test", [1], {"allow": ["web.test"],
                                                                 "bytes_max": -1}):
                with self.assertRaises(APIError) as e:
                    Sandbox(image="debian", client=c,
                            net=bad if isinstance(bad, dict) else {"allow": bad})
                self.assertEqual(e.exception.status, 400, bad)
            self.assertEqual(c.sessions(), [])

            # Allowed: the lab answers through the guest's proxy env; the policy's other
            # pattern was not asked for, so the session's proxy refuses it.
            with Sandbox(image="debian", client=c, net=["web.test"]) as sb:
                self.assertEqual(sb.info["net"]["allow"], ["web.test"])
                self.assertEqual(sb.info["net"]["bytes_max"], 50000000)
                r = sb.commands.run(["python3", "-c", NET_GUEST])
                self.assertEqual(r.exit_code, 0, r.stderr)
                R = json.loads(r.stdout.strip().splitlines()[-1])
                self.assertEqual(R["web"], [200, "hello from the test internet\n"], R)
                self.assertEqual(R["wild"][0], 403, R)
                reqs, cur = sb.net_requests()
                by_host = {q["host"]: q for q in reqs}
                self.assertEqual(set(by_host), {"web.test", "sub.wild.test"}, reqs)
                w = by_host["web.test"]
                self.assertEqual((w["method"], w["port"], w["status"], w["allowed"]),
                                 ("GET", 80, 200, True), w)
                self.assertGreater(w["bytes"], 0)
                self.assertLess(abs(w["time_ms"] / 1000 - time.time()), 600)
                x = by_host["sub.wild.test"]
                self.assertFalse(x["allowed"], x)
                self.assertIn("not in the allowlist", x["why"])
                self.assertEqual(cur, 2)
                self.assertEqual(sb.net_requests(cursor=cur), ([], 2))
                one, c1 = sb.net_requests(limit=1)
                self.assertEqual((one, c1), (reqs[:1], 1))
                self.assertEqual(sb.net_requests(cursor=c1)[0], reqs[1:])
                with self.assertRaises(APIError) as e:
                    sb.net_requests(limit=1001)
                self.assertEqual(e.exception.status, 400)

            # Without net (the default): no NIC, and no requests to list.
            with Sandbox(client=c) as sb:
                self.assertIsNone(sb.info["net"])
                self.assertEqual(sb.commands.run("ls /sys/class/net").stdout.split(), ["lo"])
                with self.assertRaises(APIError) as e:
                    sb.net_requests()
                self.assertEqual((e.exception.status, e.exception.code), (409, "no_network"))
        finally:
            self.assertEqual(d.stop_and_remove(), 0)


class PoolTest(unittest.TestCase):
    """The warm pool (pool_image, pool_size) on the debian image. The daemon builds the template
    itself (in a state dir of the test's own, so no other suite restores from it), then keeps two
    sessions ready; a create of the pool's shape gets one, any other boots as before."""

    def test_pool_hands_out_distinct_warm_sessions_and_refills(self):
        state = tempfile.mkdtemp(prefix="airlockd-pool-test-", dir="/var/tmp")
        os.chmod(state, 0o755)  # QEMU's user reaches the templates and session disks
        d = Daemon(env={"AIRLOCK_STATE_DIR": state}, pool_image="debian", pool_size=2)
        c = d.unix()
        stopped = False
        try:
            pool = c.health()["pool"]
            self.assertEqual((pool["image"], pool["memory_mib"], pool["size"]), ("debian", 512, 2))

            def wait_ready(n, timeout=900):
                deadline = time.time() + timeout
                while time.time() < deadline:
                    if c.health()["pool"]["ready"] >= n:
                        return
                    time.sleep(0.5)
                self.fail("the pool never held %d ready: %s\n%s" % (n, c.health(),
                                                                    d.text()[-3000:]))

            wait_ready(2)  # the template built in the background, then two restores
            # /metrics reports the same depth as health (the pool is full: nothing taken yet)
            mc, mr = c.open("GET", "/metrics")
            try:
                samples = parse_prometheus(mr.read().decode())
            finally:
                mc.close()
            self.assertEqual(metric(samples, "airlockd_pool_depth", image="debian"), 2.0)
            a = Sandbox(image="debian", client=c)
            b = Sandbox(client=c, image="debian")
            self.assertEqual((a.info["pooled"], a.info["warm"]), (True, True), a.info)
            self.assertEqual((b.info["pooled"], b.info["warm"]), (True, True), b.info)
            self.assertNotEqual(a.id, b.id)
            ra = a.commands.run("cat /proc/sys/kernel/random/boot_id; hostname")
            rb = b.commands.run("cat /proc/sys/kernel/random/boot_id; hostname")
            self.assertEqual((ra.exit_code, rb.exit_code), (0, 0), (ra.stderr, rb.stderr))
            ida, hosta = ra.stdout.split()
            idb, hostb = rb.stdout.split()
            self.assertNotEqual(ida, idb, "two pooled sessions share a boot id")
            self.assertNotEqual(hosta, hostb, "two pooled sessions share a hostname")
            # The python kernel warmed in the template answers too.
            self.assertEqual(a.run_code("print(6 * 7)").stdout, "42\n")
            # A pooled session was opened without the daemon's signal pipe: it got it at the
            # hand-out, so a run's signal reaches the guest.
            run = b.commands.start(["sleep", "100"])
            time.sleep(1.5)
            run.signal("INT")
            res = run.wait(timeout=60)["result"]
            self.assertTrue(res["interrupted"], res)
            self.assertEqual((res["how"], res["value"]), ("signaled", signal.SIGINT))
            # Another shape never comes from the pool; it boots (or restores) as before.
            cold = Sandbox(image="debian", memory_mib=384, client=c)
            self.assertFalse(cold.info["pooled"], cold.info)
            self.assertEqual(cold.commands.run("echo ok").stdout, "ok\n")
            cold.kill()
            # Handed-out sessions are the caller's: killing one does not return it; the pool
            # refills with new sessions on its own.
            a.kill()
            self.assertTrue(domain_gone(a.id))
            wait_ready(2, timeout=300)
            c2 = Sandbox(image="debian", client=c)
            self.assertTrue(c2.info["pooled"], c2.info)
            self.assertNotIn(c2.id, (a.id, b.id))
            self.assertEqual(c2.commands.run("echo ok").stdout, "ok\n")
            wait_ready(2, timeout=300)
            # SIGTERM: the sessions handed out and the two still ready all go, domains and
            # session files (the state dir is this test's: every session in it is ours); only
            # the template stays.
            sdir = os.path.join(state, "sessions")
            ours = [n for n in os.listdir(sdir) if n.startswith("airlock-")]
            self.assertEqual(len(ours), 4, ours)  # b, c2 and two ready
            self.assertIn(b.id, ours)
            rc = d.stop()
            stopped = True
            self.assertEqual(rc, 0, d.text()[-3000:])
            left = set(ours) & altest.virsh_names()
            self.assertEqual(left, set(), "domains left after SIGTERM")
            self.assertEqual([n for n in os.listdir(sdir) if n.startswith("airlock-")], [],
                             "session files left after SIGTERM")
            self.assertTrue(os.listdir(os.path.join(state, "templates")), "no template built")
        finally:
            if not stopped:
                d.stop()
            shutil.rmtree(d.dir, ignore_errors=True)
            shutil.rmtree(state, ignore_errors=True)


class CrashTest(unittest.TestCase):
    def test_killed_daemon_leaves_no_domain(self):
        # SIGKILL: no cleanup runs; libvirt destroys the domains it started with AUTODESTROY
        # when the daemon's connection goes, and the next session start's gc removes the files.
        d = Daemon()
        try:
            sb = Sandbox(client=d.unix())
            self.assertFalse(domain_gone(sb.id))
            d.stop(signal.SIGKILL)
            deadline = time.time() + 30
            while time.time() < deadline and not domain_gone(sb.id):
                time.sleep(0.5)
            self.assertTrue(domain_gone(sb.id))
            r = altest.run(["gc"])
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertFalse(os.path.exists(os.path.join(altest.state_sessions_dir(), sb.id)))
            self.assertFalse(os.path.exists(os.path.join(altest.runtime_sessions_dir(), sb.id)))
        finally:
            if d.p.poll() is None:
                d.stop(signal.SIGKILL)
            shutil.rmtree(d.dir, ignore_errors=True)

class TlsAndRateTest(unittest.TestCase):
    """A daemon with TLS on TCP and a request rate; no guest."""

    def test_tls_and_requests_per_second(self):
        tmp = tempfile.mkdtemp(prefix="airlockd-tls-")
        cert, key = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                        "-out", cert, "-days", "1", "-subj", "/CN=localhost", "-addext",
                        "subjectAltName=IP:127.0.0.1"], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        d = Daemon(tls_cert=cert, tls_key=key, requests_per_s=5)
        try:
            k = d.key("tls")
            self.assertIn("listening on https", d.text())
            ctx = ssl.create_default_context(cafile=cert)
            c = Client("https://127.0.0.1:%d" % d.port, api_key=k, ssl_context=ctx)
            self.assertEqual(c.health()["status"], "ok")
            # Plain HTTP on the TLS port gets no answer an HTTP client could take.
            self.assertEqual(status_of(raw(d.port, b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")),
                             0)
            # A client that does not trust the certificate is refused by its own TLS.
            with self.assertRaises(ssl.SSLError):
                Client("https://127.0.0.1:%d" % d.port, api_key=k).sessions()
            # 5 requests a second, bursts of 10: 30 at once are cut, with the limit named.
            codes = []
            t0 = time.time()
            for _ in range(30):
                try:
                    c.sessions()
                    codes.append(200)
                except APIError as e:
                    codes.append((e.status, e.limit))
            took = time.time() - t0
            self.assertIn((429, "requests_per_s"), codes)
            # the burst, and what the rate refilled meanwhile (TLS handshakes take a while)
            self.assertLessEqual(codes.count(200), 10 + 5 * took + 1, (took, codes))
            self.assertGreaterEqual(codes.count(200), 8)
            time.sleep(1.5)
            self.assertEqual(c.sessions(), [])
            # The unix socket's owner has a bucket of its own.
            self.assertEqual(d.unix().sessions(), [])
        finally:
            self.assertEqual(d.stop_and_remove(), 0)
            shutil.rmtree(tmp, ignore_errors=True)

    def test_config_errors_name_the_line(self):
        tmp = tempfile.mkdtemp(prefix="airlockd-conf-")
        try:
            for text, want in [("# ok\nsockett = /x\n", ":2: unknown key 'sockett'"),
                               ("max_sessions = lots\n", ":1: bad value for 'max_sessions'"),
                               ("socket_mode = 777\n", ":1: bad value for 'socket_mode'"),
                               ("pool_size = 65\n", ":1: bad value for 'pool_size'"),
                               ("tls_cert = /a.pem\n", "tls_cert and tls_key go together"),
                               ("just words\n", ":1: expected 'key = value'"),
                               ("heartbeat_s = 60\nconnection_timeout_s = 30\n",
                                "heartbeat_s must be below connection_timeout_s")]:
                conf = os.path.join(tmp, "c")
                with open(conf, "w") as f:
                    f.write(text)
                r = subprocess.run([AIRLOCKD, "--config", conf], stderr=subprocess.PIPE,
                                   timeout=30)
                self.assertEqual(r.returncode, 1, text)
                self.assertIn(want, r.stderr.decode(), text)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

if __name__ == "__main__":
    altest.main()

#!/usr/bin/env python3
"""E2B compatibility (issue 32, daemon/e2b.c): E2B's own SDKs, from the npm registry at pinned
versions, against airlockd's e2b listener with real debian guests; and the listener's own
protocol checks with raw HTTP (no VM).

    test_e2b.py [ProtocolTest | SdkTest ...]
"""
import gzip
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import time
import unittest

import altest
from airlock import APIError, Client, Sandbox
from test_airlockd import AIRLOCKD, Daemon
from test_mcp import npm_install

HERE = os.path.dirname(os.path.abspath(__file__))
# The SDKs as their users install them, and a Node they support (>= 20.18.1).
SDKS = ["e2b@2.51.0", "@e2b/code-interpreter@2.8.0", "node@22.23.3"]
# .ci/e2b-latest: the newest the registry has instead (the API moves month by month).
if os.environ.get("AIRLOCK_E2B_SDKS"):
    SDKS = os.environ["AIRLOCK_E2B_SDKS"].split()


def e2b_form(key):
    p = subprocess.run([AIRLOCKD, "key", "e2b"], input=key.encode(), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, check=True)
    return p.stdout.decode().strip()


def native_of(e2b):
    """An e2b_ key back in airlockd's own form (alk_ID_SECRET)."""
    return "alk_%s_%s" % (e2b[4:16], e2b[16:])


def e2b_port(d):
    for line in d.text().splitlines():
        if "E2B's API on" in line:
            return int(line.split(" port ")[1].split()[0])
    raise AssertionError("no e2b listener: " + d.text())


class E2bDaemon:
    """airlockd with its e2b listener, two keys (each in both forms)."""

    def stop(self):
        """SIGTERM: the daemon exits 0 (under ASan: no error, no leak), its log says nothing
        of a token."""
        rc = self.d.stop()
        log = self.d.text()
        shutil.rmtree(self.d.dir, ignore_errors=True)
        if rc != 0 or "Sanitizer" in log:
            raise AssertionError("airlockd: exit %d\n%s" % (rc, log[-4000:]))
        return log

    def __init__(self, **conf):
        conf.setdefault("e2b_listen", "127.0.0.1:0")
        self.d = Daemon(**conf)
        self.key = self.d.key("e2b-owner")
        self.other = self.d.key("e2b-other")
        self.e2b_key, self.e2b_other = e2b_form(self.key), e2b_form(self.other)
        self.port = e2b_port(self.d)

    def request(self, method, path, body=None, headers=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, r, data


class ProtocolTest(unittest.TestCase):
    """The listener without a guest: keys, routing, errors in E2B's shapes."""

    @classmethod
    def setUpClass(cls):
        cls.e = E2bDaemon()

    @classmethod
    def tearDownClass(cls):
        cls.e.d.stop()

    def test_key_forms(self):
        self.assertRegex(self.e.e2b_key, r"^e2b_[0-9a-f]{60}$")
        # the two forms name one key: both are taken, anything else is not
        for k, want in ((self.e.e2b_key, 200), (self.e.key, 200), ("e2b_" + "0" * 60, 401),
                        ("e2b_zz", 401), (None, 401)):
            st, _, data = self.e.request("GET", "/v2/sandboxes",
                                         headers={"X-API-KEY": k} if k else {})
            self.assertEqual(st, want, (k, data))
            if want == 401:
                j = json.loads(data)
                self.assertEqual(j["code"], 401)
                self.assertTrue(j["message"])
        # key e2b refuses what is not a key
        p = subprocess.run([AIRLOCKD, "key", "e2b"], input=b"nonsense\n",
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.assertEqual(p.returncode, 1)
        self.assertIn(b"not an airlockd key", p.stderr)

    def test_unknown_sandbox_and_routes(self):
        h = {"X-API-KEY": self.e.e2b_key}
        for method, path in (("GET", "/sandboxes/abc123"), ("DELETE", "/sandboxes/abc123"),
                             ("POST", "/sandboxes/abc123/timeout"),
                             ("GET", "/sandboxes/UPPER-case")):
            st, _, data = self.e.request(method, path, body=b"{}" if method == "POST" else None,
                                         headers=dict(h, **{"Content-Type": "application/json"}))
            self.assertEqual(st, 404 if "timeout" not in path else 404, (path, data))
            self.assertEqual(json.loads(data)["code"], 404)
        st, _, _ = self.e.request("GET", "/nothing", headers=h)
        self.assertEqual(st, 404)
        st, _, _ = self.e.request("PUT", "/sandboxes", headers=h)
        self.assertEqual(st, 405)
        # the data plane: an unknown sandbox is 502 (the SDK's "not running")
        st, _, data = self.e.request("POST", "/filesystem.Filesystem/Stat", body=b'{"path":"/"}',
                                     headers={"E2b-Sandbox-Id": "abc123",
                                              "E2b-Sandbox-Port": "49983",
                                              "X-Access-Token": "x",
                                              "Content-Type": "application/json"})
        self.assertEqual(st, 502, data)
        # our own API is not on this listener, nor E2B's on ours
        st, _, _ = self.e.request("GET", "/v1/sessions", headers=h)
        self.assertEqual(st, 404)
        c = http.client.HTTPConnection("127.0.0.1", self.e.d.port, timeout=30)
        c.request("GET", "/v2/sandboxes", headers={"Authorization": "Bearer " + self.e.key})
        self.assertEqual(c.getresponse().status, 404)
        c.close()

    def test_create_bounds(self):
        h = {"X-API-KEY": self.e.e2b_key, "Content-Type": "application/json"}
        for body, want in (({"templateID": 5}, 400), ({"timeout": -1}, 400),
                           ({"envVars": {"A=B": "x"}}, 400), ({"envVars": {"A": 1}}, 400),
                           ({"metadata": "x"}, 400), ({"autoPause": True}, 400),
                           ({"templateID": "no/such"}, 404), ({"templateID": "nosuchimage"}, 404)):
            st, _, data = self.e.request("POST", "/v2/sandboxes", json.dumps(body).encode(), h)
            self.assertEqual(st, want, (body, data))
            self.assertEqual(json.loads(data)["code"], want)
        st, _, data = self.e.request("POST", "/v2/sandboxes", b"{not json", h)
        self.assertEqual(st, 400)


class SpoolTest(unittest.TestCase):
    """Every byte airlockd writes to its spool for a request is held against spool_max_bytes
    first: a gzip body's inflated copy, a multipart part's copy, a download's file (the third
    audit: six gzip writes of 32 MiB of zeros, 31 KiB bodies each, put 192 MiB in a 64 MiB
    spool). A spool of 600000 bytes, a key allowed 800000 a transfer."""

    @classmethod
    def setUpClass(cls):
        cls.e = E2bDaemon(spool_max_bytes=600000)
        cls.key = e2b_form(cls.e.d.key("spool", "--max-upload-bytes", "800000"))
        st, _, data = cls.e.request("POST", "/v2/sandboxes", b'{"timeout": 300}',
                                    {"X-API-KEY": cls.key, "Content-Type": "application/json"})
        assert st == 201, data
        sb = json.loads(data)
        cls.sid = sb["sandboxID"]
        cls.h = {"E2b-Sandbox-Id": sb["sandboxID"], "E2b-Sandbox-Port": "49983",
                 "X-Access-Token": sb["envdAccessToken"]}

    @classmethod
    def tearDownClass(cls):
        cls.e.stop()

    def post(self, path, body, **headers):
        return self.e.request("POST", "/files?path=" + path, body, dict(self.h, **headers))

    def when_room(self, send):
        """A transfer that fits an empty spool. What the case before held is given back when
        airlockd finishes that request, which may come just after its client has the answer."""
        deadline = time.monotonic() + 20
        while True:
            st, hd, data = send()
            if st != 507 or time.monotonic() > deadline:
                return st, hd, data
            time.sleep(0.2)

    def test_gzip_inflated_copy_is_held(self):
        octet = {"Content-Type": "application/octet-stream", "Content-Encoding": "gzip"}
        st, _, data = self.when_room(
            lambda: self.post("/tmp/small", gzip.compress(b"\0" * 200000), **octet))
        self.assertEqual(st, 200, data)
        # under max_upload_bytes, but the inflated copy does not fit the spool
        st, _, data = self.post("/tmp/big", gzip.compress(b"\0" * 700000), **octet)
        self.assertEqual(st, 507, data)
        self.assertIn(b"spool has no room", data)

    def test_multipart_part_copy_is_held(self):
        def form(n):
            return (b"--b0\r\nContent-Disposition: form-data; name=\"file\"; "
                    b"filename=\"/tmp/part\"\r\nContent-Type: application/octet-stream\r\n\r\n"
                    + b"x" * n + b"\r\n--b0--\r\n")
        ct = {"Content-Type": "multipart/form-data; boundary=b0"}
        st, _, data = self.when_room(lambda: self.post("/tmp/part", form(200000), **ct))
        self.assertEqual(st, 200, data)
        # the body (400000) fits; it and its part's copy (800000 together) do not
        st, _, data = self.post("/tmp/part", form(400000), **ct)
        self.assertEqual(st, 507, data)

    def test_download_is_held(self):
        native = Client("http://127.0.0.1:%d" % self.e.d.port, api_key=native_of(self.key))
        sb = Sandbox.connect("airlock-" + self.sid, client=native)
        r = sb.commands.run("head -c 200000 /dev/zero > /tmp/d1; head -c 700000 /dev/zero > /tmp/d2")
        self.assertEqual(r.exit_code, 0)
        st, _, data = self.when_room(
            lambda: self.e.request("GET", "/files?path=/tmp/d1", None, self.h))
        self.assertEqual((st, len(data)), (200, 200000))
        st, _, data = self.e.request("GET", "/files?path=/tmp/d2", None, self.h)
        self.assertEqual(st, 507, data[:200])
        # the same bound on airlockd's own API
        with self.assertRaises(APIError) as cm:
            sb.files.read("/tmp/d2")
        self.assertEqual(cm.exception.status, 507)


class SdkTest(unittest.TestCase):
    """E2B's SDKs as their users call them, one group of cases per test."""

    @classmethod
    def setUpClass(cls):
        cls.npm = npm_install(SDKS)
        for name in ("e2b", "@e2b/code-interpreter"):  # which versions these are, in the log
            with open(os.path.join(cls.npm, "node_modules", name, "package.json")) as f:
                print("e2b-sdk: %s@%s" % (name, json.load(f)["version"]), file=sys.stderr)
        cls.node = os.path.join(cls.npm, "node_modules", ".bin", "node")
        # sessions kept: E2B's pause and connect (resume) work
        cls.e = E2bDaemon(keep_sessions="true", keep_grace_s=30)

    @classmethod
    def tearDownClass(cls):
        log = cls.e.stop()
        # tokens are never logged (each is 64 hex; the keys' secrets 48)
        leaked = re.findall(r"[0-9a-f]{48,}", log)
        if leaked:
            raise AssertionError("secrets in the log: %s" % leaked[:3])

    def group(self, name, want, env=None):
        url = "http://127.0.0.1:%d" % self.e.port
        e = dict(os.environ, E2B_API_URL=url, E2B_SANDBOX_URL=url, E2B_API_KEY=self.e.e2b_key,
                 OTHER_KEY=self.e.e2b_other)
        e.update(env or {})
        p = subprocess.run([self.node, os.path.join(HERE, "e2b_sdk.mjs"), self.npm, name],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e, timeout=900)
        cases = []
        for line in p.stdout.decode().splitlines():
            try:
                cases.append(json.loads(line))
            except ValueError:
                pass
        bad = [c for c in cases if not c["ok"]]
        self.assertEqual(bad, [], "\n".join(c["detail"] for c in bad) + p.stderr.decode()[-2000:]
                         + self.e.d.text()[-2000:])
        self.assertEqual(len(cases), want, p.stdout.decode() + p.stderr.decode()[-2000:])
        self.assertEqual(p.returncode, 0, p.stderr.decode()[-2000:])

    def test_commands(self):
        self.group("commands", 19)

    def test_files(self):
        self.group("files", 15)

    def test_interpreter(self):
        self.group("interpreter", 13)

    def test_security(self):
        self.group("security", 7)

    def test_killed_under_a_stream(self):
        self.group("killed", 2)

    def test_key_limits_and_revocation(self):
        """The data plane holds to the key that made the sandbox: its limits (an upload over
        its max_upload_bytes is refused), and its revocation (then nothing answers)."""
        key = e2b_form(self.e.d.key("e2b-limited", "--max-upload-bytes", "1000"))
        st, _, data = self.e.request("POST", "/v2/sandboxes", b'{"timeout": 300}',
                                     {"X-API-KEY": key, "Content-Type": "application/json"})
        self.assertEqual(st, 201, data)
        sb = json.loads(data)
        for k in ("sandboxID", "templateID", "clientID", "envdVersion", "envdAccessToken",
                  "trafficAccessToken"):
            self.assertTrue(sb.get(k), (k, sb))
        self.assertRegex(sb["sandboxID"], r"^[a-z0-9]+$")
        self.assertRegex(sb["envdAccessToken"], r"^[0-9a-f]{64}$")
        h = {"E2b-Sandbox-Id": sb["sandboxID"], "E2b-Sandbox-Port": "49983",
             "X-Access-Token": sb["envdAccessToken"]}

        def upload(n):
            body = (b"--b0\r\nContent-Disposition: form-data; name=\"file\"; "
                    b"filename=\"/tmp/up\"\r\nContent-Type: application/octet-stream\r\n\r\n"
                    + b"x" * n + b"\r\n--b0--\r\n")
            return self.e.request("POST", "/files?path=/tmp/up", body,
                                  dict(h, **{"Content-Type": "multipart/form-data; boundary=b0"}))
        st, _, data = upload(500)
        self.assertEqual(st, 200, data)
        st, _, data = upload(5000)
        self.assertEqual(st, 413, data)
        st, _, data = self.e.request("GET", "/files?path=/tmp/up", None, h)
        self.assertEqual((st, len(data)), (200, 500))
        self.e.d.revoke(native_of(key))
        st, _, data = self.e.request("POST", "/filesystem.Filesystem/Stat", b'{"path":"/"}',
                                     dict(h, **{"Content-Type": "application/json"}))
        self.assertEqual(st, 401, data)
        st, _, _ = self.e.request("GET", "/sandboxes/" + sb["sandboxID"], None,
                                  {"X-API-KEY": key})
        self.assertEqual(st, 401)

    def test_live_and_unknown_ids_answer_alike(self):
        """Without its token, a live sandbox's id gets what an unknown id gets (502, the SDKs'
        "not running"), word for word: nobody learns which ids are live."""
        key = e2b_form(self.e.d.key("e2b-probe"))
        st, _, data = self.e.request("POST", "/v2/sandboxes", b'{"timeout": 300}',
                                     {"X-API-KEY": key, "Content-Type": "application/json"})
        self.assertEqual(st, 201, data)
        sb = json.loads(data)
        live = sb["sandboxID"]
        unknown = live[:-1] + ("0" if live[-1] != "0" else "1")
        try:
            def probe(sid, tok):
                h = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49983",
                     "Content-Type": "application/json"}
                if tok is not None:
                    h["X-Access-Token"] = tok
                st, _, data = self.e.request("POST", "/filesystem.Filesystem/Stat",
                                             b'{"path":"/"}', h)
                return st, data.replace(sid.encode(), b"ID")
            for tok in ("wrong", None, sb["envdAccessToken"][:-1]):
                self.assertEqual(probe(live, tok), probe(unknown, tok))
                self.assertEqual(probe(live, tok)[0], 502)
            self.assertEqual(probe(live, sb["envdAccessToken"])[0], 200)
        finally:
            self.e.request("DELETE", "/sandboxes/" + live, None, {"X-API-KEY": key})

    def test_polled_watchers_and_gzip_bounds(self):
        """CreateWatcher / GetWatcherEvents / RemoveWatcher as E2B's Python SDK polls them
        (PyPI is out of reach here: the calls are made as it makes them), and a gzip upload
        bounded by what it inflates to, not by its compressed size."""
        key = e2b_form(self.e.d.key("e2b-gzip", "--max-upload-bytes", "100000"))
        st, _, data = self.e.request("POST", "/v2/sandboxes", b'{"timeout": 300}',
                                     {"X-API-KEY": key, "Content-Type": "application/json"})
        self.assertEqual(st, 201, data)
        sb = json.loads(data)
        self.assertEqual(sb["envdVersion"], "0.5.7")
        h = {"E2b-Sandbox-Id": sb["sandboxID"], "E2b-Sandbox-Port": "49983",
             "X-Access-Token": sb["envdAccessToken"]}
        j = dict(h, **{"Content-Type": "application/json"})

        def rpc(method, body):
            st, _, data = self.e.request("POST", "/filesystem.Filesystem/" + method,
                                         json.dumps(body).encode(), j)
            return st, json.loads(data or b"{}")

        st, out = rpc("MakeDir", {"path": "/tmp/pw"})
        self.assertEqual(st, 200, out)
        st, out = rpc("CreateWatcher", {"path": "/tmp/pw", "recursive": True})
        self.assertEqual(st, 200, out)
        wid = out["watcherId"]
        self.assertRegex(wid, r"^[0-9a-f]{32}$")
        st, out = rpc("GetWatcherEvents", {"watcherId": wid})
        self.assertEqual((st, out.get("events", [])), (200, []))
        st, _, data = self.e.request("POST", "/files?path=/tmp/pw/sub/one.txt", b"one",
                                     dict(h, **{"Content-Type": "application/octet-stream"}))
        self.assertEqual(st, 200, data)
        seen = []
        deadline = time.time() + 30
        while time.time() < deadline and ["EVENT_TYPE_WRITE", "sub/one.txt"] not in seen:
            st, out = rpc("GetWatcherEvents", {"watcherId": wid})
            self.assertEqual(st, 200, out)
            seen += [[e["type"], e["name"]] for e in out.get("events", [])]
            time.sleep(0.2)
        self.assertIn(["EVENT_TYPE_CREATE", "sub"], seen)
        self.assertIn(["EVENT_TYPE_WRITE", "sub/one.txt"], seen)
        # each event once: a second poll has none of them again
        st, out = rpc("GetWatcherEvents", {"watcherId": wid})
        self.assertEqual((st, out.get("events", [])), (200, []))
        # not in envd's process list; gone from the guest once removed
        st, _, data = self.e.request("POST", "/process.Process/List", b"{}", j)
        self.assertNotIn("--watch", data.decode())
        st, out = rpc("RemoveWatcher", {"watcherId": wid})
        self.assertEqual(st, 200, out)
        st, out = rpc("GetWatcherEvents", {"watcherId": wid})
        self.assertEqual((st, out["code"]), (404, "not_found"))
        st, out = rpc("GetWatcherEvents", {"watcherId": "0" * 32})
        self.assertEqual((st, out["code"]), (404, "not_found"))
        st, out = rpc("CreateWatcher", {"path": "/tmp/pw/missing"})
        self.assertEqual((st, out["code"]), (404, "not_found"), out)
        st, out = rpc("CreateWatcher", {"path": "/tmp/pw/sub/one.txt"})
        self.assertEqual((st, out["code"]), (400, "invalid_argument"), out)
        # gzip: inflated as sent; a bomb past max_upload_bytes refused however small it is
        octet = dict(h, **{"Content-Type": "application/octet-stream",
                           "Content-Encoding": "gzip"})
        text = b"line of text\n" * 5000
        st, _, data = self.e.request("POST", "/files?path=/tmp/pw/z.txt", gzip.compress(text),
                                     octet)
        self.assertEqual(st, 200, data)
        st, _, data = self.e.request("GET", "/files?path=/tmp/pw/z.txt", None, h)
        self.assertEqual((st, data), (200, text))
        bomb = gzip.compress(b"\0" * 10_000_000)
        self.assertLess(len(bomb), 100000)
        st, _, data = self.e.request("POST", "/files?path=/tmp/pw/bomb", bomb, octet)
        self.assertEqual(st, 413, data)
        st, _, data = self.e.request("POST", "/files?path=/tmp/pw/notgz", b"plain", octet)
        self.assertEqual(st, 400, data)
        self.assertIn(b"not gzip", data)
        st, _, data = self.e.request("POST", "/files?path=/tmp/pw/br", b"x",
                                     dict(octet, **{"Content-Encoding": "br"}))
        self.assertEqual(st, 415, data)
        st, _, data = self.e.request("GET", "/files?path=/tmp/pw/bomb", None, h)
        self.assertEqual(st, 404, data)
        st, _, _ = self.e.request("DELETE", "/sandboxes/" + sb["sandboxID"], None,
                                  {"X-API-KEY": key})
        self.assertEqual(st, 204)

    def test_z_load(self):
        self.group("load", 1, {"SANDBOXES": "4", "PER": "5"})


if __name__ == "__main__":
    altest.main()

#!/usr/bin/env python3
"""`airlock mcp` (orchestrator/mcp, docs/MCP.md), the MCP server on stdio.

ProtocolTest speaks raw JSON-RPC to it and boots nothing: version negotiation, errors
(-32700, -32600, -32601, -32602), batches, notifications unanswered, an oversized line, the
tool schemas valid JSON Schema 2020-12, stdout nothing but MCP, the argument checks.
SdkTest drives it with the official TypeScript SDK (@modelcontextprotocol/sdk, pinned, from
the npm registry at test time) through a debian guest: state across run_code calls, a figure
that decodes, files both ways, checkpoint and rollback, a cancelled run interrupted, a server in
the background, run_output, resources; then the domain is gone once the client has closed.
LifecycleTest boots tiny guests: SIGINT and SIGHUP end the server and its VMs, the sessions
bound. HttpProtocolTest speaks raw HTTP to airlockd's /mcp (no VM): Origin, media types,
Mcp-Session-Id, MCP-Protocol-Version, the 2026-07-28 generation's headers and 404s. HttpSdkTest
runs the SDK's Streamable HTTP client against it with two API keys (a tiny guest).
Usage: test_mcp.py [unittest args].
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import altest
from airlock import APIError, Sandbox

HAVE_DAEMON = bool(os.environ.get("AIRLOCKD_BIN"))
if HAVE_DAEMON:
    from test_airlockd import Daemon

SDK = "@modelcontextprotocol/sdk@1.32.2"
# The v2 client, for the 2026-07-28 generation.
SDK_V2 = "@modelcontextprotocol/client@2.4.0"
# Agents' own MCP clients, which need Node 22 (from the npm registry too): the Inspector's CLI,
# Claude Code and Gemini CLI; their handshakes need no API key.
CLIENTS = ["@modelcontextprotocol/inspector@2.12.0", "@anthropic-ai/claude-code@2.1.332",
           "@google/gemini-cli@0.61.0", "node@22.23.3"]
# The conformance suite needs Node 22, which the npm registry serves as a package.
CONFORMANCE = ["@modelcontextprotocol/conformance@0.2.0-alpha.12", "node@22.23.3"]
HERE = os.path.dirname(os.path.abspath(__file__))
AIRLOCK_ABS = os.path.abspath(altest.AIRLOCK) if os.sep in altest.AIRLOCK else altest.AIRLOCK
HAVE_DEBIAN = os.path.exists(os.path.join(altest.IMAGE_DIR, "debian", "manifest.json"))


# What a 2026-07-28 request carries in its params.
META = {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                  "io.modelcontextprotocol/clientCapabilities": {}}}


def npm_install(spec):
    """Installs npm packages (pinned; a spec or a list of them) into a directory of the build's;
    npm's own cache makes a second install quick. Returns the directory."""
    specs = [spec] if isinstance(spec, str) else list(spec)
    root = os.environ.get("AIRLOCK_NPM_DIR") or os.path.join(tempfile.gettempdir(), "airlock-npm")
    d = os.path.join(root, re.sub(r"[^A-Za-z0-9.]+", "_", "+".join(specs)))
    if not os.path.exists(os.path.join(d, "node_modules", ".package-lock.json")):
        os.makedirs(d, exist_ok=True)
        p = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", d] + specs,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
        if p.returncode:
            raise AssertionError("npm install %s failed: %s" % (spec, p.stdout.decode()[-2000:]))
    return d


class Server:
    """airlock mcp as a child: JSON lines in, JSON lines out, stderr kept."""

    def __init__(self, *args, image_dir=None):
        self.err = tempfile.TemporaryFile()
        self.p = altest.popen(["mcp"] + list(args), image_dir=image_dir, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=self.err)
        self.n = 0
        self.notes = []

    def send(self, obj):
        data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
        self.p.stdin.write(data + b"\n")
        self.p.stdin.flush()

    def read(self, timeout=240):
        line = self.p.stdout.readline()
        if not line:
            raise AssertionError("the server closed stdout; stderr: %s" % self.stderr())
        return json.loads(line)  # every line of stdout is JSON, or this raises

    def request(self, method, params=None, **kw):
        self.n += 1
        msg = {"jsonrpc": "2.0", "id": self.n, "method": method}
        if params is not None:
            msg["params"] = params
        self.send(msg)
        return self.wait_id(self.n)

    def wait_id(self, rid):
        while True:
            m = self.read()
            if m.get("id") == rid and ("result" in m or "error" in m):
                return m
            self.notes.append(m)

    def tool(self, tool_name, **args):
        r = self.request("tools/call", {"name": tool_name, "arguments": args})
        if "error" in r:
            raise AssertionError("%s: %s" % (tool_name, r["error"]))
        return r["result"]

    def initialize(self, version="2025-06-18"):
        r = self.request("initialize", {"protocolVersion": version, "capabilities": {},
                                        "clientInfo": {"name": "test", "version": "1"}})
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return r

    def stderr(self):
        if self.err.closed:
            return self.saved
        self.err.seek(0)
        return self.err.read().decode(errors="replace")

    def close(self, timeout=120):
        if self.p.stdin and not self.p.stdin.closed:
            self.p.stdin.close()
        rc = self.p.wait(timeout=timeout)
        self.p.stdout.close()
        self.saved = self.stderr()
        self.err.close()
        return rc


def domains_of(stderr):
    return set(re.findall(r"domain (airlock-[0-9a-f]+)", stderr))


class ProtocolTest(unittest.TestCase):
    def setUp(self):
        self.s = Server()

    def tearDown(self):
        self.s.close()

    def test_version_negotiation(self):
        for v in ("2025-11-25", "2025-06-18", "2025-03-26"):
            r = self.s.request("initialize", {"protocolVersion": v, "capabilities": {}})
            self.assertEqual(r["result"]["protocolVersion"], v)
        # One it does not know: the latest it does.
        r = self.s.request("initialize", {"protocolVersion": "2031-01-01", "capabilities": {}})
        res = r["result"]
        self.assertEqual(res["protocolVersion"], "2025-11-25")
        self.assertEqual(res["serverInfo"]["name"], "airlock")
        self.assertIn("tools", res["capabilities"])
        self.assertIn("start_session", res["instructions"])
        r = self.s.request("initialize", {"capabilities": {}})
        self.assertEqual(r["error"]["code"], -32602)
        # The stateless generation's discovery, without initialize.
        d = self.s.request("server/discover", {})["result"]
        self.assertIn("2026-07-28", d["supportedVersions"])
        self.assertIn("2025-11-25", d["supportedVersions"])

    def test_a_call_never_starts_a_session_by_itself(self):
        self.s.initialize()
        r = self.s.request("tools/call", {"name": "run_code",
                                          "arguments": {"language": "python", "code": "1"}})
        self.assertEqual(r["error"]["code"], -32602)
        self.assertIn("start_session", r["error"]["message"])
        self.assertEqual(domains_of(self.s.stderr()), set())

    def test_stateless_generation_on_stdio(self):
        meta = {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                          "io.modelcontextprotocol/clientCapabilities": {}}}
        d = self.s.request("server/discover", meta)["result"]
        self.assertEqual(d["resultType"], "complete")
        self.assertEqual(d["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "airlock")
        t = self.s.request("tools/list", meta)["result"]
        self.assertEqual((t["resultType"], t["cacheScope"]), ("complete", "private"))
        self.assertGreater(t["ttlMs"], 0)
        r = self.s.request("tools/call", dict(meta, name="list_sessions", arguments={}))["result"]
        self.assertEqual(r["resultType"], "complete")
        # The legacy generation's results carry none of it.
        self.assertNotIn("resultType", self.s.request("tools/list")["result"])
        # A version it does not speak: -32022 with the ones it does.
        bad = {"_meta": {"io.modelcontextprotocol/protocolVersion": "2099-01-01"}}
        e = self.s.request("tools/list", bad)["error"]
        self.assertEqual(e["code"], -32022)
        self.assertEqual(e["data"]["supported"], ["2026-07-28"])

    def test_errors(self):
        self.s.send(b'{"jsonrpc": "2.0", "id": 1, "method": ')
        r = self.s.read()
        self.assertEqual((r["id"], r["error"]["code"]), (None, -32700))
        self.s.send({"jsonrpc": "1.0", "id": 2, "method": "ping"})
        self.assertEqual(self.s.read()["error"]["code"], -32600)
        self.s.send({"jsonrpc": "2.0", "id": None, "method": "ping"})
        self.assertEqual(self.s.read()["error"]["code"], -32600)
        self.s.send(b"[]")
        self.assertEqual(self.s.read()["error"]["code"], -32600)
        self.s.send(b"42")
        self.assertEqual(self.s.read()["error"]["code"], -32600)
        r = self.s.request("no/such/method")
        self.assertEqual(r["error"]["code"], -32601)
        r = self.s.request("tools/call", {"name": "no_such_tool", "arguments": {}})
        self.assertEqual(r["error"]["code"], -32602)
        self.assertIn("no_such_tool", r["error"]["message"])
        r = self.s.request("tools/list", [1, 2])
        self.assertEqual(r["error"]["code"], -32602)
        # Still serving, and the ping answers with an empty result.
        self.assertEqual(self.s.request("ping")["result"], {})

    def test_notifications_and_responses_unanswered_batches_answered(self):
        self.s.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        self.s.send({"jsonrpc": "2.0", "method": "notifications/cancelled",
                     "params": {"requestId": 99}})
        self.s.send({"jsonrpc": "2.0", "id": 77, "result": {}})
        self.s.send([{"jsonrpc": "2.0", "id": "a", "method": "ping"},
                     {"jsonrpc": "2.0", "method": "notifications/initialized"},
                     {"jsonrpc": "2.0", "id": "b", "method": "nope"}])
        got = [self.s.read(), self.s.read()]
        self.assertEqual(sorted(m["id"] for m in got), ["a", "b"])
        self.assertEqual({m["id"]: ("result" in m) for m in got}, {"a": True, "b": False})
        # Nothing else came: the next answer is the next request's.
        self.assertEqual(self.s.request("ping")["id"], self.s.n)

    def test_oversized_line_is_refused_and_skipped(self):
        big = b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"' + b"a" * (17 << 20) + b'"}}'
        self.s.send(big)
        r = self.s.read()
        self.assertEqual(r["error"]["code"], -32600)
        self.assertIn("too large", r["error"]["message"])
        self.assertEqual(self.s.request("ping")["result"], {})

    def test_tool_schemas(self):
        import jsonschema
        tools = self.s.request("tools/list")["result"]["tools"]
        names = [t["name"] for t in tools]
        for want in ("start_session", "run_code", "run_output", "run_command", "start_process",
                     "process_output", "kill_process", "read_file", "write_file", "list_files",
                     "checkpoint", "rollback", "list_checkpoints", "stop_session",
                     "fork_session", "snapshot_session", "list_snapshots", "delete_snapshot"):
            self.assertIn(want, names)
        for t in tools:
            jsonschema.Draft202012Validator.check_schema(t["inputSchema"])
            jsonschema.Draft202012Validator.check_schema(t["outputSchema"])
            self.assertEqual(t["inputSchema"]["type"], "object")
            self.assertIs(t["inputSchema"]["additionalProperties"], False)
            self.assertTrue(t["description"])
        ann = {t["name"]: t["annotations"] for t in tools}
        self.assertTrue(ann["rollback"]["destructiveHint"])
        self.assertTrue(ann["stop_session"]["destructiveHint"])
        self.assertTrue(ann["read_file"]["readOnlyHint"])
        self.assertFalse(ann["run_code"]["openWorldHint"])  # no --allow-network
        # Without --allow-network start_session offers no network, and refuses one.
        start = next(t for t in tools if t["name"] == "start_session")
        self.assertNotIn("network", start["inputSchema"]["properties"])
        r = self.s.request("tools/call", {"name": "start_session",
                                          "arguments": {"network": ["pypi.org"]}})
        self.assertEqual(r["error"]["code"], -32602)

    def test_arguments_checked_before_anything_runs(self):
        bad = [
            ("run_code", {"session": "sb_x"}),  # no code
            ("run_code", {"session": "sb_x", "code": "1", "language": "cobol"}),
            ("run_code", {"session": "sb_x", "code": "1", "timeout_s": "10"}),
            ("run_code", {"session": "sb_x", "code": "1", "timeout_s": 1.5}),
            ("run_code", {"session": "sb_x", "code": "1", "extra": 1}),
            ("start_session", {"memory_mib": 1 << 30}),
            ("start_session", {"image": "../../etc"}),
            ("run_command", {"session": "sb_x", "command": "ls", "env": {"A=B": "c"}}),
            ("run_output", {"run": "r", "wait_s": 51}),
            ("write_file", {"session": "sb_x", "path": "/a", "content": "x", "parents": "yes"}),
            ("rollback", {"session": "sb_x", "checkpoint": -1}),
        ]
        for name, args in bad:
            r = self.s.request("tools/call", {"name": name, "arguments": args})
            self.assertEqual(r.get("error", {}).get("code"), -32602, (name, args, r))
        # Well-formed but naming no session: a tool error the model can read, not a protocol one.
        r = self.s.request("tools/call", {"name": "run_code",
                                          "arguments": {"session": "sb_nope", "code": "1"}})
        self.assertTrue(r["result"]["isError"])
        self.assertIn("no such session", r["result"]["content"][0]["text"])
        r = self.s.request("tools/call", {"name": "list_sessions", "arguments": {}})
        self.assertEqual(r["result"]["structuredContent"], {"sessions": []})

    def test_allow_network_offers_it(self):
        s = Server("--allow-network", "--memory-max", "512")
        try:
            tools = s.request("tools/list")["result"]["tools"]
            start = next(t for t in tools if t["name"] == "start_session")
            self.assertIn("network", start["inputSchema"]["properties"])
            self.assertEqual(start["inputSchema"]["properties"]["memory_mib"]["maximum"], 512)
            run = next(t for t in tools if t["name"] == "run_code")
            self.assertTrue(run["annotations"]["openWorldHint"])
            r = s.request("tools/call", {"name": "start_session",
                                         "arguments": {"network": ["not a host!"]}})
            self.assertTrue(r["result"]["isError"], r)
        finally:
            s.close()

    def test_bad_options(self):
        p = altest.run(["mcp", "--sessions", "0"])
        self.assertEqual(p.returncode, 2)
        self.assertIn(b"--sessions", p.stderr)
        p = altest.run(["mcp", "--bogus"])
        self.assertEqual(p.returncode, 2)


class ClientsTest(unittest.TestCase):
    """The clients people register `airlock mcp` with, each in a fresh HOME: the Inspector's
    CLI lists the tools and calls one; `claude mcp list` and `gemini mcp list` start the server,
    handshake and report it connected. No VM."""

    @classmethod
    def setUpClass(cls):
        cls.dir = npm_install(CLIENTS)
        cls.bin = os.path.join(cls.dir, "node_modules", ".bin")

    def run_client(self, argv, home, timeout=180):
        env = dict(os.environ, HOME=home, PATH=self.bin + os.pathsep + os.environ["PATH"],
                   AIRLOCK_IMAGE_DIR=altest.IMAGE_DIR, DISABLE_AUTOUPDATER="1",
                   CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", NO_COLOR="1")
        p = subprocess.run(argv, env=env, cwd=home, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=timeout)
        return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")

    def test_inspector_cli(self):
        with tempfile.TemporaryDirectory() as home:
            rc, out, err = self.run_client(["mcp-inspector", "--cli", AIRLOCK_ABS, "mcp",
                                            "--method", "tools/list"], home)
            self.assertEqual(rc, 0, err[-2000:])
            names = [t["name"] for t in json.loads(out)["tools"]]
            self.assertIn("run_code", names)
            self.assertIn("rollback", names)
            rc, out, err = self.run_client(["mcp-inspector", "--cli", AIRLOCK_ABS, "mcp",
                                            "--method", "tools/call", "--tool-name",
                                            "list_sessions"], home)
            self.assertEqual(rc, 0, err[-2000:])
            self.assertEqual(json.loads(out)["structuredContent"], {"sessions": []})
            # A tool error reaches it as one (it exits non-zero on isError).
            rc, out, err = self.run_client(["mcp-inspector", "--cli", AIRLOCK_ABS, "mcp",
                                            "--method", "tools/call", "--tool-name", "run_code",
                                            "--tool-arg", "session=sb_nope",
                                            "--tool-arg", "code=print(1)"], home)
            self.assertNotEqual(rc, 0)
            self.assertIn("isError", out + err)

    def test_claude_code_connects(self):
        with tempfile.TemporaryDirectory() as home:
            rc, out, err = self.run_client(["claude", "mcp", "add", "airlock", "--",
                                            AIRLOCK_ABS, "mcp"], home)
            self.assertEqual(rc, 0, out + err)
            rc, out, err = self.run_client(["claude", "mcp", "list"], home)
            line = [l for l in out.splitlines() if l.startswith("airlock:")]
            self.assertTrue(line and "Connected" in line[0], out + err)

    def test_gemini_cli_connects(self):
        with tempfile.TemporaryDirectory() as home:
            rc, out, err = self.run_client(["gemini", "mcp", "add", "--scope", "user", "airlock",
                                            AIRLOCK_ABS, "mcp"], home)
            self.assertEqual(rc, 0, out + err)
            # Gemini CLI starts no server in a folder it does not trust.
            with open(os.path.join(home, ".gemini", "trustedFolders.json"), "w") as f:
                json.dump({home: "TRUST_FOLDER"}, f)
            rc, out, err = self.run_client(["gemini", "mcp", "list"], home)
            line = [l for l in (out + err).splitlines() if "airlock:" in l]
            self.assertTrue(line and "Connected" in line[0], out + err)


@unittest.skipUnless(HAVE_DEBIAN, "the debian image is not built")
class SdkTest(unittest.TestCase):
    """The TypeScript SDK's Client over its StdioClientTransport, as Claude Code and the
    Inspector use it; the SDK checks each structuredContent against the tool's outputSchema."""

    def test_sdk_client(self):
        sdk = npm_install(SDK)
        before = altest.virsh_names()
        env = dict(os.environ, AIRLOCK_IMAGE_DIR=altest.IMAGE_DIR)
        p = subprocess.run(["node", os.path.join(HERE, "mcp_sdk_client.mjs"), sdk, altest.AIRLOCK,
                            "--image", "debian"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           env=env, timeout=900)
        err = p.stderr.decode(errors="replace")
        self.assertEqual(p.returncode, 0, err[-4000:])
        rep = json.loads(p.stdout)
        st = rep["steps"]
        self.assertEqual(rep["server"]["name"], "airlock")
        self.assertIn("run_code", rep["tools"])
        self.assertTrue(rep["annotations"]["rollback"]["destructiveHint"])
        # A boot takes seconds: progress came for the token the SDK gave.
        self.assertFalse(st["start"]["isError"], st["start"])
        self.assertTrue(st["start"]["session"].startswith("sb_"))
        self.assertGreaterEqual(st["start"]["progress"], 1, st["start"])
        self.assertEqual(st["state"]["value"], "42")
        self.assertIn("42", st["state"]["text"])
        fig = st["figure"]["png"]
        self.assertIsNotNone(fig, st["figure"])
        self.assertEqual(fig["magic"], "89504e470d0a1a0a")
        # 2000 x 1000 drawn, cut to 1568 on the longer side.
        self.assertEqual((fig["width"], fig["height"]), (1568, 784))
        self.assertTrue(st["raise"]["isError"])
        self.assertEqual(st["raise"]["name"], "ZeroDivisionError")
        self.assertIn("division by zero", st["raise"]["text"])
        f = st["files"]
        self.assertTrue(f["same"] and f["binary_same"], f)
        self.assertEqual(f["encoding"], "utf-8")
        self.assertEqual(f["written"], len("héllo wörld\nline 2\n".encode()))
        self.assertEqual(f["names"], ["blob.bin", "notes"])
        rb = st["rollback"]
        self.assertEqual(rb["checkpoint"]["name"], "before-rm")
        self.assertEqual(rb["rm_exit"], 0)
        self.assertTrue(rb["gone_isError"])
        self.assertFalse(rb["rollback_isError"])
        self.assertTrue(rb["back_same"])
        c = st["cancel"]
        self.assertIsNotNone(c["abortError"])
        # The guest run was interrupted (a sleep of 120 s), not left running; SIGINT, so the
        # kernel kept its state.
        self.assertIsNotNone(c["ended_ms"], c)
        self.assertLess(c["ended_ms"], 2000, c)
        self.assertEqual(c["kept_state"], "42")
        pr = st["process"]
        self.assertEqual(pr["curl_exit"], 0, pr)
        self.assertIn("200", pr["curl"])
        self.assertIn("GET / HTTP/1.1", pr["log"])
        self.assertEqual(pr["killed_state"], "done")
        self.assertNotEqual(pr["after_kill_exit"], 0)  # the server is gone
        w = st["wait"]
        self.assertEqual((w["first_state"], w["final_state"]), ("running", "done"))
        self.assertEqual(w["stdout"], "".join("step %d\n" % i for i in range(4)))
        e = st["errors"]
        self.assertTrue(e["bad_isError"])
        self.assertEqual(e["unknown"]["code"], -32602)
        self.assertIn("notes/hello.txt", st["resources"]["names"])
        self.assertEqual(st["resources"]["text"], "héllo wörld\nline 2\n")
        # The client closed: the server ended its session; the domain is gone.
        doms = domains_of(err)
        self.assertEqual(len(doms), 1, err[-2000:])
        self.assertFalse(doms & altest.virsh_names(), doms)
        self.assertFalse((altest.virsh_names() - before) & doms)


class LifecycleTest(unittest.TestCase):
    """Sessions belong to the process: SIGINT (how Claude Code stops a server) and SIGHUP end
    them, VMs included; --sessions bounds them."""

    def boot(self, s):
        r = s.tool("start_session")
        self.assertFalse(r["isError"], r)
        return r["structuredContent"]["session"]

    def end_by(self, sig):
        s = Server()
        try:
            s.initialize()
            sid = self.boot(s)
            doms = domains_of(s.stderr())
            self.assertEqual(len(doms), 1, s.stderr())
            self.assertTrue(doms <= altest.virsh_names())
            # A run in flight when the signal comes.
            s.n += 1
            s.send({"jsonrpc": "2.0", "id": s.n, "method": "tools/call",
                    "params": {"name": "run_command",
                               "arguments": {"session": sid, "command": "sleep 300"}}})
            time.sleep(1)
            s.p.send_signal(sig)
            rc = s.p.wait(timeout=120)
            self.assertEqual(rc, 0, s.stderr())
            self.assertFalse(doms & altest.virsh_names(), s.stderr())
            self.assertIn("ending", s.stderr())
        finally:
            if s.p.poll() is None:
                s.p.kill()
            s.close()

    def test_a_killed_client_ends_its_sessions(self):
        # The client dies during a 600 s run: both its pipes close. The VM goes at once, not
        # when the run would have ended (it waited for it, 116 s with the default timeout).
        s = Server()
        try:
            s.initialize()
            sid = self.boot(s)
            doms = domains_of(s.stderr())
            s.n += 1
            s.send({"jsonrpc": "2.0", "id": s.n, "method": "tools/call",
                    "params": {"name": "run_command",
                               "arguments": {"session": sid, "command": "sleep 600",
                                             "timeout_s": 700}}})
            time.sleep(1)
            s.p.stdin.close()
            s.p.stdout.close()
            t0 = time.monotonic()
            while doms & altest.virsh_names() and time.monotonic() - t0 < 10:
                time.sleep(0.2)
            self.assertFalse(doms & altest.virsh_names(), s.stderr())
            self.assertEqual(s.p.wait(timeout=30), 0)
            self.assertIn("the client is gone", s.stderr())
        finally:
            if s.p.poll() is None:
                s.p.kill()
            s.p.wait()
            s.err.close()

    def test_sigint_ends_sessions(self):
        self.end_by(signal.SIGINT)

    def test_sighup_ends_sessions(self):
        self.end_by(signal.SIGHUP)

    def test_fork_session(self):
        """fork_session: each fork a session of its own with the source's state; a fork past
        --sessions fails alone; the forks' VMs end with the server."""
        s = Server("--sessions", "3")
        try:
            s.initialize()
            sid = self.boot(s)
            r = s.tool("run_command", session=sid, command="echo before > /tmp/mark")
            self.assertFalse(r["isError"], r)
            r = s.tool("fork_session", session=sid, count=3)
            self.assertFalse(r["isError"], r)
            forks = r["structuredContent"]["forks"]
            self.assertEqual(len(forks), 3, forks)
            ok = [f["session"] for f in forks if "session" in f]
            self.assertEqual(len(ok), 2, forks)
            self.assertIn("3 sessions are open", forks[2]["error"])
            s.tool("run_command", session=ok[0], command="echo fork > /tmp/mark")
            for sess, want in ((ok[0], "fork\n"), (ok[1], "before\n"), (sid, "before\n")):
                r = s.tool("run_command", session=sess, command="cat /tmp/mark")
                self.assertEqual(r["structuredContent"]["stdout"], want, sess)
            listed = s.tool("list_sessions")["structuredContent"]["sessions"]
            self.assertEqual(len(listed), 3, listed)
            doms = domains_of(s.stderr())
            self.assertEqual(len(doms), 3, s.stderr())
        finally:
            self.assertEqual(s.close(), 0)
        self.assertFalse(domains_of(s.stderr()) & altest.virsh_names())

    def test_snapshots(self):
        """snapshot_session, start_session from it after its source stopped, list, delete."""
        name = "mcp-test-%d" % os.getpid()
        s = Server("--sessions", "2")
        try:
            s.initialize()
            sid = self.boot(s)
            s.tool("run_command", session=sid, command="echo kept > /tmp/mark")
            r = s.tool("snapshot_session", session=sid, name=name)
            self.assertFalse(r["isError"], r)
            self.assertGreater(r["structuredContent"]["bytes"], 0)
            s.tool("stop_session", session=sid)
            listed = s.tool("list_snapshots")["structuredContent"]["snapshots"]
            self.assertIn(name, [x["name"] for x in listed])
            r = s.tool("start_session", snapshot=name)
            self.assertFalse(r["isError"], r)
            new = r["structuredContent"]["session"]
            r = s.tool("run_command", session=new, command="cat /tmp/mark")
            self.assertEqual(r["structuredContent"]["stdout"], "kept\n")
            r = s.tool("start_session", snapshot="no-such-snapshot")
            self.assertTrue(r["isError"])
            self.assertIn("no snapshot", r["content"][0]["text"])
            self.assertTrue(s.tool("delete_snapshot", name=name)["structuredContent"]["deleted"])
            self.assertFalse(s.tool("delete_snapshot", name=name)["structuredContent"]["deleted"])
        finally:
            self.assertEqual(s.close(), 0)
        self.assertFalse(domains_of(s.stderr()) & altest.virsh_names())

    def test_sessions_bounded_and_stop(self):
        s = Server("--sessions", "1")
        try:
            s.initialize()
            sid = self.boot(s)
            r = s.tool("start_session")
            self.assertTrue(r["isError"])
            self.assertIn("stop one", r["content"][0]["text"])
            # The shell fallback on an image without a bash kernel, and a failing command.
            r = s.tool("run_code", session=sid, code="echo hi; (exit 3)", language="bash")
            self.assertTrue(r["isError"])
            self.assertEqual(r["structuredContent"]["exit_code"], 3)
            self.assertEqual(r["structuredContent"]["stdout"], "hi\n")
            doms = domains_of(s.stderr())
            r = s.tool("stop_session", session=sid)
            self.assertTrue(r["structuredContent"]["stopped"])
            self.assertFalse(doms & altest.virsh_names())
            r = s.tool("run_command", session=sid, command="true")
            self.assertTrue(r["isError"])
            self.assertIn("no such session", r["content"][0]["text"])
            # The slot is free again.
            sid2 = self.boot(s)
            self.assertNotEqual(sid, sid2)
        finally:
            self.assertEqual(s.close(), 0)
        self.assertFalse(domains_of(s.stderr()) & altest.virsh_names())


@unittest.skipUnless(HAVE_DEBIAN, "needs the debian image (python kernel)")
class KernelQueueTest(unittest.TestCase):
    """Claude Code, Codex and Gemini CLI call tools in parallel: run_code calls sent at once to
    one python context queue in the order they came, each with its own output; one cancelled
    while it waits never runs."""

    def test_parallel_run_code_in_order(self):
        s = Server("--image", "debian")
        try:
            s.initialize()
            r = s.tool("start_session")
            self.assertFalse(r["isError"], r)
            sid = r["structuredContent"]["session"]
            r = s.tool("run_code", session=sid, code="order = []")
            self.assertFalse(r["isError"], r)
            first = s.n + 1
            for i in range(8):
                s.n += 1
                s.send({"jsonrpc": "2.0", "id": s.n, "method": "tools/call",
                        "params": {"name": "run_code", "arguments": {
                            "session": sid,
                            "code": "import time\ntime.sleep(0.2)\norder.append(%d)\n"
                                    "print('run', %d)" % (i, i)}}})
            s.n += 1
            never = s.n
            s.send({"jsonrpc": "2.0", "id": never, "method": "tools/call",
                    "params": {"name": "run_code",
                               "arguments": {"session": sid, "code": "order.append('never')"}}})
            s.send({"jsonrpc": "2.0", "method": "notifications/cancelled",
                    "params": {"requestId": never, "reason": "test"}})
            for i in range(8):
                a = s.wait_id(first + i)
                self.assertFalse(a["result"]["isError"], a)
                self.assertEqual(a["result"]["structuredContent"]["stdout"], "run %d\n" % i)
            r = s.tool("run_code", session=sid, code="print(order)")
            self.assertEqual(r["structuredContent"]["stdout"], "[0, 1, 2, 3, 4, 5, 6, 7]\n", r)
            self.assertNotIn(never, [m.get("id") for m in s.notes])
        finally:
            s.p.stdin.close()
            s.p.wait(timeout=120)
            s.close()


def http(port, method, body=None, headers=None, path="/mcp"):
    """One request to the daemon's TCP port: (status, headers, body bytes)."""
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    h.update(headers or {})
    h = {k: v for k, v in h.items() if v is not None}
    c.request(method, path, body=json.dumps(body).encode() if isinstance(body, (dict, list))
              else body, headers=h)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, data


def mcp_http_session(port, key):
    """initialize through airlockd's /mcp as key: a function calling a tool there (the
    result object)."""
    h = {"Authorization": "Bearer " + key}
    st, hh, b = http(port, "POST", {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                    "params": {"protocolVersion": "2025-06-18",
                                               "capabilities": {},
                                               "clientInfo": {"name": "t", "version": "1"}}}, h)
    assert st == 200, b
    h["Mcp-Session-Id"] = hh["mcp-session-id"]
    n = [1]

    def call(tool_name, **args):
        n[0] += 1
        st, _, b = http(port, "POST", {"jsonrpc": "2.0", "id": n[0], "method": "tools/call",
                                       "params": {"name": tool_name, "arguments": args}}, h)
        assert st == 200, b
        text = b.decode()
        if not text.startswith("{"):
            text = [l[5:] for l in text.splitlines() if l.startswith("data:")][-1]
        return json.loads(text)["result"]
    return call


@unittest.skipUnless(HAVE_DAEMON, "AIRLOCKD_BIN is not set")
class RegistryTest(unittest.TestCase):
    """MCP's sandboxes on airlockd are the registry's like every other: listed in
    /v1/sessions, counted against the key's quotas with its REST and E2B sessions, ended by
    a DELETE there (the MCP client's next call says so, nothing hangs)."""

    def test_one_registry(self):
        d = Daemon()
        try:
            key = d.key("reg", "--max-sessions", "2")
            rest = d.tcp(key)
            call = mcp_http_session(d.port, key)
            r = call("start_session")
            self.assertFalse(r.get("isError"), r)
            handle = r["structuredContent"]["session"]
            listed = rest.sessions()
            self.assertEqual(len(listed), 1, listed)
            self.assertEqual(listed[0]["labels"], {"front": "mcp"})
            mine = listed[0]["id"]
            self.assertEqual(call("run_command", session=handle,
                                  command="echo hi")["structuredContent"]["stdout"], "hi\n")
            # The key's max_sessions holds across the fronts together.
            with Sandbox(client=rest) as sb:
                r = call("start_session")
                self.assertTrue(r.get("isError"), r)
                self.assertIn("max_sessions", r["content"][0]["text"])
                with self.assertRaises(APIError) as e:
                    Sandbox(client=rest)
                self.assertEqual((e.exception.status, e.exception.limit), (429, "max_sessions"))
                self.assertEqual(len(rest.sessions()), 2)
            # Ended through REST: the MCP client hears it on its next call; the VM is gone.
            rest.request("DELETE", "/v1/sessions/" + mine)
            self.assertEqual(rest.sessions(), [])
            r = call("run_command", session=handle, command="echo hi")
            self.assertTrue(r.get("isError"), r)
            # MCP's own stop gives it back: gone from the list.
            r = call("start_session")
            self.assertFalse(r.get("isError"), r)
            self.assertEqual(len(rest.sessions()), 1)
            # Its forks and snapshots are the key's too: counted, listed, usable over REST.
            h = r["structuredContent"]["session"]
            call("run_command", session=h, command="echo mcp > /tmp/mark")
            f = call("fork_session", session=h, count=2)["structuredContent"]["forks"]
            self.assertEqual(len([x for x in f if "session" in x]), 1, f)
            self.assertIn("max_sessions", [x for x in f if "error" in x][0]["error"])
            call("stop_session", session=[x for x in f if "session" in x][0]["session"])
            self.assertFalse(call("snapshot_session", session=h, name="via-mcp").get("isError"))
            self.assertEqual([x["name"] for x in rest.snapshots()], ["via-mcp"])
            with Sandbox(snapshot="via-mcp", client=rest) as sb:
                self.assertEqual(sb.commands.run("cat /tmp/mark").stdout, "mcp\n")
            self.assertTrue(call("delete_snapshot", name="via-mcp")["structuredContent"]["deleted"])
            self.assertEqual(rest.snapshots(), [])
            # Volumes too: the key's, made over REST, mounted by start_session, kept after it.
            rest.create_volume("mcpvol", 64 << 20)
            try:
                r = call("start_session", volumes=["mcpvol:/data"])
                self.assertFalse(r.get("isError"), r)
                v = r["structuredContent"]["session"]
                # no sync: the end writes it out
                call("run_command", session=v, command="echo kept > /data/f")
                call("stop_session", session=v)
                with Sandbox(client=rest, volumes={"/vol": "mcpvol"}) as sb:
                    self.assertEqual(sb.commands.run("cat /vol/f").stdout, "kept\n")
                for bad in (["mcpvol"], ["mcpvol:data"], ["nosuchvol:/data"]):
                    r = call("start_session", volumes=bad)
                    self.assertTrue(r.get("isError"), (bad, r))
                self.assertEqual(len(rest.sessions()), 1)
            finally:
                rest.delete_volume("mcpvol")
            call("stop_session", session=h)
            self.assertEqual(rest.sessions(), [])
            # One left running when the daemon stops: it goes with the daemon, no hang.
            self.assertFalse(call("start_session").get("isError"))
            left = [x["id"] for x in rest.sessions()]
            self.assertEqual(len(left), 1)
        finally:
            self.assertEqual(d.stop_and_remove(), 0)
        self.assertFalse(set(left) & altest.virsh_names())


@unittest.skipUnless(HAVE_DAEMON, "AIRLOCKD_BIN is not set")
class HttpProtocolTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon()
        cls.key = cls.d.key("mcp")
        cls.auth = {"Authorization": "Bearer " + cls.key}

    @classmethod
    def tearDownClass(cls):
        rc = cls.d.stop()
        if rc:
            raise AssertionError("airlockd exited %d: %s" % (rc, cls.d.text()[-3000:]))

    def post(self, body, **headers):
        h = dict(self.auth)
        h.update({k.replace("_", "-"): v for k, v in headers.items()})
        return http(self.d.port, "POST", body, h)

    def init(self, version="2025-06-18"):
        st, h, b = self.post({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                              "params": {"protocolVersion": version, "capabilities": {},
                                         "clientInfo": {"name": "t", "version": "1"}}})
        self.assertEqual(st, 200, b)
        self.assertEqual(json.loads(b)["result"]["protocolVersion"], version)
        return h["mcp-session-id"]

    def test_session_lifecycle(self):
        sid = self.init()
        self.assertRegex(sid, r"^[\x21-\x7e]+$")  # visible ASCII, as the transport says
        st, h, b = self.post({"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
                             Mcp_Session_Id=sid, MCP_Protocol_Version="2025-06-18")
        self.assertEqual(st, 200, b)
        self.assertEqual(h["content-type"], "application/json")
        self.assertIn("run_code", [t["name"] for t in json.loads(b)["result"]["tools"]])
        # No version header: read as 2025-03-26, still served.
        st, _, b = self.post({"jsonrpc": "2.0", "id": 3, "method": "ping"}, Mcp_Session_Id=sid)
        self.assertEqual((st, json.loads(b)["result"]), (200, {}))
        # A version nobody speaks: 400.
        st, _, _ = self.post({"jsonrpc": "2.0", "id": 4, "method": "ping"}, Mcp_Session_Id=sid,
                             MCP_Protocol_Version="1999-01-01")
        self.assertEqual(st, 400)
        # Notifications alone: 202, no body.
        st, _, b = self.post({"jsonrpc": "2.0", "method": "notifications/initialized"},
                             Mcp_Session_Id=sid)
        self.assertEqual((st, b), (202, b""))
        # A session of another key is unknown to this one (404), as is a made-up one.
        other = {"Authorization": "Bearer " + self.d.key("other")}
        st, _, _ = http(self.d.port, "POST", {"jsonrpc": "2.0", "id": 5, "method": "tools/list"},
                        dict(other, **{"Mcp-Session-Id": sid}))
        self.assertEqual(st, 404)
        st, _, _ = self.post({"jsonrpc": "2.0", "id": 6, "method": "tools/list"},
                             Mcp_Session_Id="mcp-0000")
        self.assertEqual(st, 404)
        # DELETE ends it; then 404.
        st, _, _ = http(self.d.port, "DELETE", None, dict(self.auth, **{"Mcp-Session-Id": sid}))
        self.assertEqual(st, 204)
        st, _, b = self.post({"jsonrpc": "2.0", "id": 7, "method": "tools/list"},
                             Mcp_Session_Id=sid)
        self.assertEqual(st, 404)
        self.assertEqual(json.loads(b)["id"], 7)

    def test_one_key_never_signs_another_out(self):
        # 300 initializes of key B (its own bound is 64: its oldest make room for its newest)
        # leave key A's session answering; so do 30 web sign-ins of B (its bound 16).
        sid = self.init()
        other = {"Authorization": "Bearer " + self.d.key("crowd")}
        body = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                           "clientInfo": {"name": "crowd", "version": "1"}}}
        theirs = []
        for _ in range(300):
            st, h, b = http(self.d.port, "POST", body, other)
            self.assertEqual(st, 200, b)
            theirs.append(h["mcp-session-id"])
        st, _, b = self.post({"jsonrpc": "2.0", "id": 2, "method": "ping"}, Mcp_Session_Id=sid)
        self.assertEqual((st, json.loads(b)["result"]), (200, {}))
        # B's own newest still answer, its oldest made room
        for old, want in ((theirs[0], 404), (theirs[-1], 200)):
            st, _, _ = http(self.d.port, "POST", {"jsonrpc": "2.0", "id": 3, "method": "ping"},
                            dict(other, **{"Mcp-Session-Id": old}))
            self.assertEqual(st, want)
        # The web page's sign-ins likewise: 65 keys signing in 16 times each fill the table
        # (1024); the last are refused (503), key A's sign-in still works.
        st, h, b = http(self.d.port, "POST", {"api_key": self.key}, path="/v1/auth/login")
        self.assertEqual(st, 200, b)
        mine = h["set-cookie"].split(";")[0]
        answers = []
        for k in range(65):
            crowd = {"api_key": self.d.key("crowd%d" % k)}
            for _ in range(16):
                answers.append(http(self.d.port, "POST", crowd, path="/v1/auth/login")[0])
        self.assertEqual(sorted(set(answers)), [200, 503])
        self.assertEqual(answers.count(200), 1023)
        st, _, b = http(self.d.port, "GET", None, {"Cookie": mine}, path="/v1/sessions")
        self.assertEqual(st, 200, b)

    def test_refusals(self):
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        # No key over TCP.
        st, h, _ = http(self.d.port, "POST", body)
        self.assertEqual(st, 401)
        # Another site's page (DNS rebinding and the like): 403, whatever the key.
        st, _, _ = self.post(body, Origin="http://evil.example")
        self.assertEqual(st, 403)
        st, _, _ = self.post(dict(body, params=META), Origin="http://localhost:6274",
                             MCP_Protocol_Version="2026-07-28", Mcp_Method="tools/list")
        self.assertEqual(st, 200)
        st, _, _ = http(self.d.port, "POST", b"{}", dict(self.auth, **{"Content-Type": "text/plain"}))
        self.assertEqual(st, 415)
        st, _, b = self.post(b'{"jsonrpc": "2.0", ')
        self.assertEqual((st, json.loads(b)["error"]["code"]), (400, -32700))
        # A request of the initialize generation without its session.
        st, _, _ = self.post(body)
        self.assertEqual(st, 400)
        st, h, _ = http(self.d.port, "GET", None, self.auth)
        self.assertEqual(st, 405)
        st, _, _ = http(self.d.port, "DELETE", None, self.auth)
        self.assertEqual(st, 405)

    def test_stateless_generation(self):
        v = {"MCP_Protocol_Version": "2026-07-28"}

        def req(i, method, **params):
            return {"jsonrpc": "2.0", "id": i, "method": method, "params": dict(META, **params)}
        st, _, b = self.post(req(1, "server/discover"), Mcp_Method="server/discover", **v)
        self.assertEqual(st, 200, b)
        self.assertIn("2026-07-28", json.loads(b)["result"]["supportedVersions"])
        # Without Mcp-Method, or a tool call without Mcp-Name: 400 (-32020).
        st, _, b = self.post(req(1, "server/discover"), **v)
        self.assertEqual((st, json.loads(b)["error"]["code"]), (400, -32020))
        st, _, b = self.post(req(1, "tools/call", name="list_sessions", arguments={}),
                             Mcp_Method="tools/call", **v)
        self.assertEqual((st, json.loads(b)["error"]["code"]), (400, -32020))
        st, _, b = self.post(req(2, "tools/list"), Mcp_Method="tools/list", **v)
        self.assertEqual(st, 200, b)
        # The headers must say what the body does (blanks around a value are not part of it).
        st, _, _ = self.post(req(3, "tools/list"), Mcp_Method="tools/call", **v)
        self.assertEqual(st, 400)
        st, _, _ = self.post(req(4, "tools/call", name="list_sessions", arguments={}),
                             Mcp_Method="tools/call", Mcp_Name="run_code", **v)
        self.assertEqual(st, 400)
        st, _, b = self.post(req(4, "tools/list"), Mcp_Method="  tools/list ", **v)
        self.assertEqual(st, 200, b)
        # ... and the header's version the _meta's
        st, _, b = self.post(dict(req(4, "tools/list"), params={"_meta": dict(
            META["_meta"], **{"io.modelcontextprotocol/protocolVersion": "2025-11-25"})}),
            Mcp_Method="tools/list", **v)
        self.assertEqual((st, json.loads(b)["error"]["code"]), (400, -32020))
        # A request of this generation carries its version and capabilities in _meta.
        for params in ({}, {"_meta": {"io.modelcontextprotocol/clientCapabilities": {}}},
                       {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}):
            st, _, b = self.post({"jsonrpc": "2.0", "id": 7, "method": "server/discover",
                                  "params": params}, Mcp_Method="server/discover", **v)
            self.assertEqual((st, json.loads(b)["error"]["code"]), (400, -32602), params)
        # A version this server does not speak: the ones it does, and the one asked.
        st, _, b = self.post(req(8, "tools/list"), Mcp_Method="tools/list",
                             MCP_Protocol_Version="2099-01-01")
        err = json.loads(b)["error"]
        self.assertEqual(st, 400)
        self.assertIn("2026-07-28", err["data"]["supported"])
        self.assertEqual(err["data"]["requested"], "2099-01-01")
        # A notification's Mcp-Method names it.
        st, _, b = self.post({"jsonrpc": "2.0", "method": "notifications/initialized"},
                             Mcp_Method="notifications/initialized", **v)
        self.assertEqual(st, 202, b)
        st, h, b = self.post(req(5, "tools/call", name="list_sessions", arguments={}),
                             Mcp_Method="tools/call", Mcp_Name="list_sessions", **v)
        self.assertEqual(st, 200, b)
        # A call answers as an SSE stream when the client takes one: its last event the answer.
        self.assertEqual(h["content-type"], "text/event-stream")
        events = [json.loads(l[6:]) for l in b.decode().splitlines() if l.startswith("data: ")]
        self.assertEqual(events[-1]["id"], 5)
        self.assertEqual(events[-1]["result"]["structuredContent"], {"sessions": []})
        # Unknown methods, and those this generation removed: 404 with -32601.
        for method in ("no/such", "initialize", "ping"):
            st, _, b = self.post(req(6, method), Mcp_Method=method, **v)
            self.assertEqual((st, json.loads(b)["error"]["code"]), (404, -32601), method)


@unittest.skipUnless(HAVE_DAEMON, "AIRLOCKD_BIN is not set")
class ConformanceTest(unittest.TestCase):
    """@modelcontextprotocol/conformance's server scenarios against /mcp, with the baseline of
    those that do not apply (mcp-conformance-baseline.yml says why). The suite sends no API key:
    bearer_proxy.py adds it."""

    def test_conformance(self):
        d_npm = npm_install(CONFORMANCE)
        # Scenarios that start a sandbox (a tools/call of start_session with header checks) boot
        # the tiny image: a second, where debian's boot under a loaded machine's emulation can
        # pass the suite's 30 s per scenario
        d = Daemon(env={"AIRLOCK_IMAGE": "tiny"})
        px = None
        try:
            px = subprocess.Popen([sys.executable, os.path.join(HERE, "bearer_proxy.py"),
                                   str(d.port), d.key("conformance")], stdout=subprocess.PIPE,
                                  text=True)
            port = int(px.stdout.readline())
            bin_dir = os.path.join(d_npm, "node_modules", ".bin")
            env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"])
            with tempfile.TemporaryDirectory() as out:
                p = subprocess.run(["conformance", "server", "--suite", "all", "--timeout",
                                    "120000", "--url",
                                    "http://127.0.0.1:%d/mcp" % port, "--expected-failures",
                                    os.path.join(HERE, "mcp-conformance-baseline.yml"),
                                    "-o", out], env=env, cwd=out, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, timeout=600)
            summary = p.stdout[p.stdout.find("=== SUMMARY ==="):]
            self.assertEqual(p.returncode, 0, summary or p.stdout[-4000:])
            # What does apply passes: the handshake, ping, tools/list, streams, the Origin check.
            # 2026-07-28: the headers (trimmed, a notification's Mcp-Method too), the
            # removed methods, an unsupported version's data
            for s in ("server-initialize", "ping", "tools-list", "resources-list",
                      "dns-rebinding-protection", "http-header-validation",
                      "sep-2164-resource-not-found", "server-sse-multiple-streams"):
                self.assertRegex(summary, r"✓ %s: \d+ passed, 0 failed" % re.escape(s), summary)
        finally:
            if px:
                px.kill()
                px.wait()
                px.stdout.close()
            self.assertEqual(d.stop(), 0, d.text()[-3000:])


@unittest.skipUnless(HAVE_DAEMON, "AIRLOCKD_BIN is not set")
class SdkV2Test(unittest.TestCase):
    """@modelcontextprotocol/client v2 pinned to 2026-07-28 (server/discover instead of
    initialize, resultType and cache hints on results, the version and the Mcp-Method/Mcp-Name
    headers on each request), over stdio and over HTTP, a tiny guest each."""

    def test_v2_client_pinned_to_2026(self):
        sdk = npm_install(SDK_V2)
        d = Daemon()
        try:
            p = subprocess.run(["node", os.path.join(HERE, "mcp_sdk_v2.mjs"), sdk, altest.AIRLOCK,
                                "http://127.0.0.1:%d/mcp" % d.port, d.key("v2")],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600)
            self.assertEqual(p.returncode, 0, p.stderr.decode()[-3000:] + d.text()[-2000:])
            rep = json.loads(p.stdout)
            for front in ("stdio", "http"):
                r = rep[front]
                self.assertEqual(r["version"], "2026-07-28", r)
                self.assertIn("run_code", r["tools"])
                self.assertGreaterEqual(r["progress"], 1, r)
                self.assertEqual(r["stdout"], "v2-42\n", r)
                self.assertFalse(r["isError"])
                self.assertTrue(r["bad"])
                self.assertTrue(r["stopped"])
        finally:
            self.assertEqual(d.stop(), 0, d.text()[-3000:])


@unittest.skipUnless(HAVE_DAEMON, "AIRLOCKD_BIN is not set")
class HttpSdkTest(unittest.TestCase):
    def test_sdk_over_http(self):
        sdk = npm_install(SDK)
        d = Daemon()
        try:
            ka, kb = d.key("a"), d.key("b")
            p = subprocess.run(["node", os.path.join(HERE, "mcp_sdk_http.mjs"), sdk,
                                "http://127.0.0.1:%d/mcp" % d.port, ka, kb],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600)
            self.assertEqual(p.returncode, 0, p.stderr.decode()[-3000:] + d.text()[-3000:])
            rep = json.loads(p.stdout)
            self.assertTrue(rep["session_id"].startswith("mcp-"))
            self.assertIn("start_session", rep["tools"])
            self.assertFalse(rep["start"]["isError"])
            self.assertGreaterEqual(rep["start"]["progress"], 1)
            self.assertEqual(rep["run"], {"stdout": "hello-42\n", "exit_code": 0})
            self.assertEqual(rep["file"], "über\n")
            self.assertTrue(rep["other_key"]["isError"])
            self.assertIn("no such session", rep["other_key"]["text"])
            self.assertEqual(rep["other_key"]["sessions"], 0)
            self.assertEqual(rep["same_key_sessions"], [rep["start"]["session"]])
            self.assertTrue(rep["stopped"])
            self.assertEqual(rep["after_delete"], 404)
            doms = set(re.findall(r"domain (airlock-[0-9a-f]+)", d.text()))
            self.assertEqual(len(doms), 1, d.text()[-3000:])
            self.assertFalse(doms & altest.virsh_names())
        finally:
            self.assertEqual(d.stop(), 0, d.text()[-3000:])


if __name__ == "__main__":
    unittest.main()

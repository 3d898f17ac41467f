"""Open Interpreter's server protocol on airlockd's oi_listen (daemon/oi.c), driven by a client
of this test's own that speaks the protocol as Open Interpreter describes it (`interpreter
--server`: a WebSocket at /, LMC chunks framed by start and end flags, {"auth": KEY},
{"role": "server", "type": "status", "content": "complete"}, the stop and go commands; HTTP
/heartbeat, /settings, /run), with the project's fake model and real guests.
"""
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

try:
    import websockets
except ImportError:  # Debian's python3-websockets lives beside the system python
    if sys.executable != "/usr/bin/python3" and os.path.exists("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    raise

import altest
from test_airlockd import Daemon

IMAGE = "debian"
HAVE_DEBIAN = os.path.exists(os.path.join(altest.IMAGE_DIR, IMAGE, "manifest.json"))
WAIT_S = 120  # a reply of the fake model, a run in an emulated guest


def execute(code, lang="python"):
    return {"name": "execute", "arguments": {"language": lang, "code": code}}


def message(text, role="user", type="message"):
    """A message as Open Interpreter's clients send one: start, content, end."""
    return [{"role": role, "type": type, "start": True},
            {"role": role, "type": type, "content": text},
            {"role": role, "type": type, "end": True}]


class Client:
    """One WebSocket connection: send chunks, read chunks until the server says complete."""

    def __init__(self, ws):
        self.ws = ws

    async def send(self, chunks):
        for c in chunks:
            await self.ws.send(json.dumps(c))

    async def recv(self, timeout=WAIT_S):
        return json.loads(await asyncio.wait_for(self.ws.recv(), timeout))

    async def until_complete(self, timeout=WAIT_S, on_chunk=None):
        out = []
        deadline = time.monotonic() + timeout
        while True:
            c = await self.recv(max(1, deadline - time.monotonic()))
            if c.get("role") == "server" and c.get("type") == "status" and \
                    c.get("content") == "complete":
                return out, c
            out.append(c)
            if on_chunk:
                await on_chunk(c)


@unittest.skipUnless(HAVE_DEBIAN, "needs the debian image")
class OIServerTest(unittest.TestCase):
    def start(self, script, **conf):
        tmp = tempfile.mkdtemp(prefix="airlockd-oi-server-")
        self.addCleanup(shutil.rmtree, tmp, True)
        fm, port = altest.start_fake_model(script, tmp)
        self.addCleanup(lambda: (fm.kill(), fm.wait()))
        self.requests_log = os.path.join(tmp, "requests.jsonl")
        d = Daemon(env={"AIRLOCK_IMAGE": IMAGE}, model_api="openai",
                   model_api_base="http://127.0.0.1:%d/v1" % port, model="fake",
                   oi_listen="127.0.0.1:0", **conf)
        self.addCleanup(d.stop)
        self.d = d
        for line in d.text().splitlines():
            if "Open Interpreter's server protocol on" in line:
                self.port = int(line.split(" port ")[1].split()[0])
        self.url = "ws://127.0.0.1:%d/" % self.port
        return d

    def requests(self):
        with open(self.requests_log) as f:
            return [json.loads(l) for l in f if l.strip()]

    def http(self, method, path, body=None, key=None):
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (self.port, path), method=method,
                                     data=json.dumps(body).encode() if body is not None else None)
        if body is not None:
            req.add_header("Content-Type", "application/json")
        if key:
            req.add_header("X-API-KEY", key)
        try:
            with urllib.request.urlopen(req, timeout=WAIT_S) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def sessions(self, key):
        return self.d.tcp(key).request("GET", "/v1/sessions")["sessions"]

    def run_async(self, coro):
        return asyncio.run(asyncio.wait_for(coro, 600))

    async def signed_in(self, key, stack):
        ws = await stack.enter_async_context(websockets.connect(self.url, max_size=None))
        c = Client(ws)
        await c.send([{"auth": key}])
        self.assertEqual(await c.recv(), {"auth": True})
        return c

    def test_a_task_then_a_stop(self):
        self.start([{"text": "Running it.", "tool_calls": [execute("print(6 * 7)")]},
                    {"text": "It printed 42."},
                    {"text": "Sleeping.", "tool_calls": [execute("import time; time.sleep(300)")]},
                    {"text": "should never be asked"}])
        key = self.d.key("oi")
        self.assertEqual(self.http("POST", "/settings", {"auto_run": True}, key),
                         (200, {"status": "success"}))

        async def go():
            from contextlib import AsyncExitStack
            async with AsyncExitStack() as stack:
                c = await self.signed_in(key, stack)
                # the connection is a session of the key, listed with the others
                listed = self.sessions(key)
                self.assertEqual(len(listed), 1)
                self.assertEqual(listed[0]["labels"].get("front"), "open-interpreter")

                await c.send(message("what is 6 * 7?"))
                chunks, done = await c.until_complete()
                # each message framed by start and end; code, then its console output
                kinds = [(x["role"], x["type"]) for x in chunks]
                self.assertEqual(kinds[0], ("assistant", "message"))
                self.assertTrue(chunks[0].get("start"))
                code = [x for x in chunks if x["type"] == "code" and "content" in x]
                self.assertEqual([(x["format"], x["content"]) for x in code],
                                 [("python", "print(6 * 7)")])
                out = "".join(x.get("content", "") for x in chunks
                              if x["type"] == "console" and x.get("format") == "output")
                self.assertIn("42", out)
                self.assertLess(kinds.index(("assistant", "code")),
                                kinds.index(("computer", "console")))
                said = "".join(x.get("content", "") for x in chunks
                               if x["role"] == "assistant" and x["type"] == "message")
                self.assertIn("It printed 42.", said)
                for role, type in set(kinds):  # every message opened is closed
                    opened = sum(1 for x in chunks if (x["role"], x["type"]) == (role, type)
                                 and x.get("start"))
                    closed = sum(1 for x in chunks if (x["role"], x["type"]) == (role, type)
                                 and x.get("end"))
                    self.assertEqual(opened, closed, (role, type))
                self.assertEqual(done.get("outcome"), "done")

                # a task that sleeps, stopped once its code runs
                started = asyncio.Event()

                async def watch(x):
                    if x["type"] == "code" and x.get("end"):
                        started.set()
                await c.send(message("now sleep"))

                async def stop_when_running():
                    await asyncio.wait_for(started.wait(), WAIT_S)
                    await asyncio.sleep(1)
                    await c.send(message("stop", type="command"))
                stopper = asyncio.ensure_future(stop_when_running())
                t0 = time.monotonic()
                await c.until_complete(timeout=WAIT_S, on_chunk=watch)
                await stopper
                self.assertLess(time.monotonic() - t0, 200)  # not the 300 s sleep
                # the kernel is free again: code through /run answers at once
                st, body = self.http("POST", "/run", {"language": "python",
                                                      "code": "print(2 + 3)"}, key)
                self.assertEqual(st, 200, body)
                self.assertIn("5", body["output"][0]["content"])
                # the model was not asked again after the stop
                self.assertEqual(len(self.requests()), 3)
                # the conversation, as LMC
                st, body = self.http("GET", "/settings/messages", key=key)
                self.assertEqual(st, 200)
                self.assertEqual(body["messages"][0],
                                 {"role": "user", "type": "message", "content": "what is 6 * 7?"})
            # the connection's end is the session's
            deadline = time.time() + 60
            while self.sessions(key) and time.time() < deadline:
                await asyncio.sleep(0.2)
            self.assertEqual(self.sessions(key), [])
        self.run_async(go())

    def test_confirmation_then_go(self):
        self.start([{"text": "Running it.", "tool_calls": [execute("print(6 * 7)")]},
                    {"text": "Done."}])
        key = self.d.key("oi")

        async def go():
            from contextlib import AsyncExitStack
            async with AsyncExitStack() as stack:
                c = await self.signed_in(key, stack)
                # auto_run is off, as Open Interpreter's default: the code waits
                await c.send(message("what is 6 * 7?"))
                chunks, _ = await c.until_complete()
                conf = [x for x in chunks if x["type"] == "confirmation"]
                self.assertEqual(len(conf), 1)
                self.assertEqual(conf[0]["content"],
                                 {"type": "code", "format": "python", "content": "print(6 * 7)"})
                self.assertFalse([x for x in chunks if x["type"] == "console"])
                await c.send(message("go", type="command"))
                chunks, _ = await c.until_complete()
                out = "".join(x.get("content", "") for x in chunks
                              if x["type"] == "console" and x.get("format") == "output")
                self.assertIn("42", out)
                # a second go has nothing to run
                await c.send(message("go", type="command"))
                chunks, _ = await c.until_complete()
                self.assertEqual(chunks[-1]["type"], "error")
                # the daemon stops with the connection open: the client is told, the VM ends
                t0 = time.monotonic()
                self.assertEqual(await asyncio.get_running_loop().run_in_executor(
                    None, self.d.stop), 0)
                self.assertLess(time.monotonic() - t0, 60)
                chunks, _ = await c.until_complete(timeout=10)
                self.assertIn("stopping", chunks[-1]["content"])
                with self.assertRaises(websockets.ConnectionClosed):
                    await c.recv(timeout=10)
        self.run_async(go())

    def test_sign_in_and_settings(self):
        self.start([{"text": "Hello."}], lines=())
        key = self.d.key("oi")
        other = self.d.key("other", "--max-sessions", "1")
        # heartbeat needs no key; everything else does
        self.assertEqual(self.http("GET", "/heartbeat"), (200, {"status": "alive"}))
        self.assertEqual(self.http("POST", "/settings", {"auto_run": True})[0], 403)
        self.assertEqual(self.http("POST", "/settings", {"auto_run": True}, "alk_wrong")[0], 403)
        # the endpoint and its key are the daemon's; unknown settings are said
        st, body = self.http("POST", "/settings", {"llm": {"api_base": "http://x"}}, key)
        self.assertEqual(st, 403)
        self.assertIn("api_base", body["detail"])
        self.assertEqual(self.http("POST", "/settings", {"llm": {"api_key": "k"}}, key)[0], 403)
        self.assertEqual(self.http("POST", "/settings", {"nope": 1}, key)[0], 404)
        # nothing applied from a refused body
        self.assertEqual(self.http("POST", "/settings",
                                   {"auto_run": True, "llm": {"api_base": "x"}}, key)[0], 403)
        self.assertEqual(self.http("GET", "/settings/auto_run", key=key),
                         (200, {"auto_run": False}))
        st, _ = self.http("POST", "/settings", {
            "auto_run": True, "custom_instructions": "Always answer in French.",
            "llm": {"model": "other-model", "temperature": 0.25, "context_window": 64000}}, key)
        self.assertEqual(st, 200)
        self.assertEqual(self.http("GET", "/settings/llm", key=key)[1]["llm"]["model"],
                         "other-model")
        # another key's settings are its own
        self.assertEqual(self.http("GET", "/settings/llm", key=other)[1]["llm"]["model"], "fake")
        # no connection yet: /run has nowhere to run
        self.assertEqual(self.http("POST", "/run", {"language": "python", "code": "1"}, key)[0],
                         409)

        async def go():
            from contextlib import AsyncExitStack
            async with AsyncExitStack() as stack:
                ws = await stack.enter_async_context(websockets.connect(self.url))
                c = Client(ws)
                # before the sign-in, and with a wrong key: {"auth": false}
                await c.send([{"role": "user", "type": "message", "content": "hi"}])
                self.assertEqual(await c.recv(), {"auth": False})
                await c.send([{"auth": "alk_nothing_valid"}])
                self.assertEqual(await c.recv(), {"auth": False})
                await c.send([{"auth": key}])
                self.assertEqual(await c.recv(), {"auth": True})
                await c.send(message("bonjour?"))
                chunks, _ = await c.until_complete()
                said = "".join(x.get("content", "") for x in chunks if x["role"] == "assistant")
                self.assertIn("Hello.", said)
                sent = self.requests()[-1]["body"]
                self.assertEqual(sent["model"], "other-model")
                self.assertEqual(sent["temperature"], 0.25)
                self.assertIn("Always answer in French.", sent["messages"][0]["content"])
                # a conversation set through /settings is the next turn's
                st, _ = self.http("POST", "/settings", {"messages": [
                    {"role": "user", "type": "message", "content": "remember 1234"},
                    {"role": "assistant", "type": "message", "content": "noted"}]}, key)
                self.assertEqual(st, 200)
                await c.send(message("what did I say?"))
                await c.until_complete()
                said = [(m["role"], m["content"]) for m in self.requests()[-1]["body"]["messages"]
                        if m["role"] != "system"]
                self.assertEqual(said, [("user", "remember 1234"), ("assistant", "noted"),
                                        ("user", "what did I say?")])

            # the X-API-KEY header signs the upgrade in; a key's quota holds here as on REST
            async with AsyncExitStack() as stack:
                ws = await stack.enter_async_context(
                    websockets.connect(self.url, extra_headers={"X-API-KEY": other}))
                c = Client(ws)
                deadline = time.time() + 60
                while not self.sessions(other) and time.time() < deadline:
                    await asyncio.sleep(0.2)
                self.assertEqual(len(self.sessions(other)), 1)
                ws2 = await stack.enter_async_context(
                    websockets.connect(self.url, extra_headers={"X-API-KEY": other}))
                c2 = Client(ws2)
                chunks, done = await c2.until_complete()
                self.assertEqual(chunks[-1]["type"], "error")
                self.assertIn("max_sessions", chunks[-1]["content"])
                with self.assertRaises(websockets.ConnectionClosed):
                    await c2.recv(timeout=30)
            # a wrong key on the upgrade is refused before it
            with self.assertRaises(websockets.InvalidStatusCode) as e:
                async with websockets.connect(self.url, extra_headers={"X-API-KEY": "alk_no"}):
                    pass
            self.assertEqual(e.exception.status_code, 403)
            # another site's page cannot drive it from a browser
            with self.assertRaises(websockets.InvalidStatusCode) as e:
                async with websockets.connect(self.url, origin="http://evil.example"):
                    pass
            self.assertEqual(e.exception.status_code, 403)
        self.run_async(go())


if __name__ == "__main__":
    altest.main()

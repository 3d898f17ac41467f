#!/usr/bin/env python3
"""al_model_chat against the fake model server, for both APIs: streaming edge cases, errors,
retries, cancellation, and the requests as the server received them.

Runs tests/unit/model-probe (one al_model_chat per run, its outcome as JSON) against
tests/fakemodel/fakemodel.py. Paths come from $MODEL_PROBE and $FAKEMODEL (meson sets them)."""

import errno
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import unittest

PROBE = os.environ.get("MODEL_PROBE", "build/tests/model-probe")
FAKEMODEL = os.environ.get("FAKEMODEL", os.path.join(os.path.dirname(__file__), "..",
                                                     "fakemodel", "fakemodel.py"))
APIS = ("openai", "anthropic", "responses")
KEY = "sk-test-0123456789"
TOOLS = [{"name": "execute", "description": "Run code in the sandbox VM.",
          "parameters": {"type": "object",
                         "properties": {"language": {"type": "string", "enum": ["python", "sh"]},
                                        "code": {"type": "string"}},
                         "required": ["language", "code"]}}]
HELLO = [{"role": "system", "content": "You are a test."}, {"role": "user", "content": "hi"}]
# Streams that say "first words" and then more, for each API: (first part, rest).
STARTS = {
    "openai": ('data: {"choices":[{"index":0,"delta":{"content":"first words"}}]}\n\n',
               'data: {"choices":[{"index":0,"delta":{"content":" and more"}}]}\n\n'
               'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
               'data: [DONE]\n\n'),
    "anthropic": ('event: content_block_start\ndata: {"type":"content_block_start","index":0,'
                  '"content_block":{"type":"text","text":"first words"}}\n\n',
                  'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
                  '"delta":{"type":"text_delta","text":" and more"}}\n\n'
                  'event: message_stop\ndata: {"type":"message_stop"}\n\n'),
}
STARTS["responses"] = (
    'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
    '"output_index":0,"content_index":0,"delta":"first words"}\n\n',
    'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
    '"output_index":0,"content_index":0,"delta":" and more"}\n\n'
    'event: response.completed\ndata: {"type":"response.completed","response":'
    '{"status":"completed","output":[]}}\n\n')
UNICODE = "Grüße, 世界! Emoji 🎉🧪 and ✓ done."


class Fake:
    """A fakemodel process serving one script; a context manager."""

    def __init__(self, replies):
        self.dir = tempfile.TemporaryDirectory(prefix="fakemodel-")
        self.script = os.path.join(self.dir.name, "script.json")
        self.log = os.path.join(self.dir.name, "requests.jsonl")
        with open(self.script, "w", encoding="utf-8") as f:
            json.dump(replies, f)

    def __enter__(self):
        self.proc = subprocess.Popen([sys.executable, FAKEMODEL, "--script", self.script,
                                      "--log", self.log], stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline())
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(10)
        self.proc.stdout.close()
        self.dir.cleanup()

    def base(self, api):
        return "http://127.0.0.1:%d%s" % (self.port, "" if api == "anthropic" else "/v1")

    def requests(self):
        with open(self.log, encoding="utf-8") as f:
            return [json.loads(line) for line in f]


def probe(api, base, messages=HELLO, tools=None, key=KEY, args=(), stderr=None):
    with tempfile.TemporaryDirectory(prefix="probe-") as d:
        mp = os.path.join(d, "messages.json")
        with open(mp, "w", encoding="utf-8") as f:
            json.dump(messages, f)
        cmd = [PROBE, "--api", api, "--base", base, "--model", "fake-model", "--messages", mp]
        if tools is not None:
            tp = os.path.join(d, "tools.json")
            with open(tp, "w", encoding="utf-8") as f:
                json.dump(tools, f)
            cmd += ["--tools", tp]
        if key:
            cmd += ["--key", key]
        cmd += list(args)
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        if stderr is not None:
            stderr.append(p.stderr.decode("utf-8", "replace"))
        if p.returncode != 0:
            raise AssertionError("model-probe failed: %s" % p.stderr.decode())
        return json.loads(p.stdout.decode("utf-8", "surrogateescape"))


def run(api, replies, **kw):
    with Fake(replies) as fake:
        t0 = time.monotonic()
        out = probe(api, fake.base(api), **kw)
        out["elapsed"] = time.monotonic() - t0
        out["requests"] = fake.requests()
        return out


class Streaming(unittest.TestCase):
    def ok(self, out):
        self.assertEqual(out["rc"], 0, out["msg"])
        self.assertTrue(out["pieces_whole_utf8"], out["pieces"])
        return out["reply"]

    def test_text_with_characters_cut_across_chunks(self):
        for api in APIS:
            for size in (1, 2, 3, 5):
                with self.subTest(api=api, chunk_size=size):
                    out = run(api, [{"text": UNICODE, "chunk_size": size,
                                     "usage": {"input": 42, "output": 7}}])
                    r = self.ok(out)
                    self.assertEqual(r["text"], UNICODE)
                    self.assertEqual("".join(out["pieces"]), UNICODE)
                    self.assertGreater(len(out["pieces"]), 5)
                    self.assertEqual(r["calls"], [])
                    self.assertEqual(r["finish"], "end_turn" if api == "anthropic" else "stop")
                    self.assertEqual((r["input_tokens"], r["output_tokens"]), (42, 7))
                    msg = dict(out["message"])
                    kept = msg.pop("responses_output", None)
                    self.assertEqual(msg, {"role": "assistant", "content": UNICODE})
                    # The Responses API's output items are kept to be sent back as they came.
                    self.assertEqual(kept and kept[0]["content"][0]["text"],
                                     UNICODE if api == "responses" else None)

    def test_tool_call_arguments_over_many_chunks(self):
        args = {"language": "python", "code": "print('héllo, 世界')\nfor i in range(3):\n    print(i)"}
        for api in APIS:
            with self.subTest(api=api):
                out = run(api, [{"tool_calls": [{"id": "call_A", "name": "execute",
                                                 "arguments": args}], "chunk_size": 2}],
                          tools=TOOLS)
                r = self.ok(out)
                self.assertEqual(r["text"], "")
                self.assertEqual(len(r["calls"]), 1)
                self.assertEqual(r["calls"][0]["id"], "call_A")
                self.assertEqual(r["calls"][0]["name"], "execute")
                self.assertEqual(json.loads(r["calls"][0]["arguments"]), args)
                self.assertEqual(out["tool_starts"], ["execute"])
                self.assertEqual(r["finish"], "tool_use" if api == "anthropic" else "tool_calls")
                self.assertEqual(out["message"]["tool_calls"],
                                 [{"id": "call_A", "name": "execute", "arguments": args}])

    def test_text_and_two_tool_calls(self):
        calls = [{"id": "c1", "name": "execute", "arguments": {"language": "sh", "code": "ls"}},
                 {"id": "c2", "name": "execute",
                  "arguments": {"language": "python", "code": "print(2)"}}]
        for api in APIS:
            with self.subTest(api=api):
                out = run(api, [{"text": "Two things:", "tool_calls": calls, "chunk_size": 3}],
                          tools=TOOLS)
                r = self.ok(out)
                self.assertEqual(r["text"], "Two things:")
                self.assertEqual([c["id"] for c in r["calls"]], ["c1", "c2"])
                self.assertEqual([json.loads(c["arguments"]) for c in r["calls"]],
                                 [c["arguments"] for c in calls])
                self.assertEqual(out["tool_starts"], ["execute", "execute"])
                self.assertEqual(out["message"]["tool_calls"], calls)

    def test_invalid_arguments_kept_raw(self):
        for api in APIS:
            with self.subTest(api=api):
                out = run(api, [{"tool_calls": [{"id": "c", "name": "execute",
                                                 "arguments": "{\"code\": \"x"}]}], tools=TOOLS)
                r = self.ok(out)
                self.assertEqual(r["calls"][0]["arguments"], "{\"code\": \"x")
                self.assertEqual(out["message"]["tool_calls"][0]["arguments"],
                                 {"_raw": "{\"code\": \"x"})

    def test_events_split_across_reads(self):
        for api in APIS:
            for ending in ("\n", "\r\n", "\r"):
                with self.subTest(api=api, line_ending=ending):
                    # One byte per write: every event and every "\r\n" is cut across reads.
                    out = run(api, [{"text": "Split ✓ reads", "chunk_size": 4,
                                     "line_ending": ending, "write_size": 1}])
                    self.assertEqual(self.ok(out)["text"], "Split ✓ reads")
                    out = run(api, [{"text": "Slow ✓ reads", "chunk_size": 4,
                                     "line_ending": ending, "write_size": 7, "delay_ms": 2}])
                    self.assertEqual(self.ok(out)["text"], "Slow ✓ reads")

    def test_comments_and_keepalives(self):
        for api in APIS:
            with self.subTest(api=api):
                out = run(api, [{"text": "alive", "keepalive": True, "chunk_size": 2,
                                 "tool_calls": [{"id": "k", "name": "execute",
                                                 "arguments": {"code": "1"}}]}], tools=TOOLS)
                r = self.ok(out)
                self.assertEqual(r["text"], "alive")
                self.assertEqual(json.loads(r["calls"][0]["arguments"]), {"code": "1"})

    def test_done_ends_the_stream(self):
        # Whatever follows [DONE] is never read (here: garbage, and a connection held open).
        raw = ('data: {"choices":[{"index":0,"delta":{"content":"end"}}]}\n\n'
               'data: [DONE]\n\ndata: {not json\n\n')
        out = run("openai", [{"raw": raw, "drop_after": None}])
        self.assertEqual(self.ok(out)["text"], "end")
        out = run("openai", [{"raw": raw + ": waiting", "split": [len(raw)], "delay_ms": 5000}])
        self.assertEqual(self.ok(out)["text"], "end")
        self.assertLess(out["elapsed"], 3)

    def test_finish_without_done(self):
        # Some servers close after the finish chunk without [DONE]: the reply is whole.
        for framing in ("chunked", "close"):
            with self.subTest(framing=framing):
                out = run("openai", [{"text": "fine", "done": False, "framing": framing}])
                self.assertEqual(self.ok(out)["text"], "fine")

    def test_anthropic_events_by_data_type(self):
        # No "event:" lines: the data's own "type" is enough.
        raw = "".join("data: %s\n\n" % json.dumps(e) for e in [
            {"type": "message_start", "message": {"usage": {"input_tokens": 3,
                                                            "cache_read_input_tokens": 4}}},
            {"type": "content_block_start", "index": 0,
             "content_block": {"type": "thinking", "thinking": ""}},
            {"type": "content_block_delta", "index": 0,
             "delta": {"type": "thinking_delta", "thinking": "hmm"}},
            {"type": "content_block_start", "index": 1,
             "content_block": {"type": "text", "text": "Hi"}},
            {"type": "content_block_delta", "index": 1,
             "delta": {"type": "text_delta", "text": " there"}},
            {"type": "content_block_start", "index": 2,
             "content_block": {"type": "tool_use", "id": "t1", "name": "execute", "input": {}}},
            {"type": "content_block_stop", "index": 2},
            {"type": "message_delta", "delta": {"stop_reason": "tool_use"},
             "usage": {"output_tokens": 9}},
            {"type": "message_stop"}])
        out = run("anthropic", [{"raw": raw}], tools=TOOLS)
        r = self.ok(out)
        self.assertEqual(r["text"], "Hi there")
        self.assertEqual(r["calls"], [{"id": "t1", "name": "execute", "arguments": "{}"}])
        self.assertEqual((r["input_tokens"], r["output_tokens"]), (7, 9))


    def test_server_that_does_not_stream(self):
        # A server (or proxy) that ignores "stream": true and answers with one JSON object.
        args = {"language": "sh", "code": "id"}
        bodies = {
            "openai": {"id": "x", "object": "chat.completion", "choices": [{
                "index": 0, "finish_reason": "tool_calls", "message": {
                    "role": "assistant", "content": "Whole ✓", "tool_calls": [
                        {"id": "w1", "type": "function",
                         "function": {"name": "execute", "arguments": json.dumps(args)}},
                        {"id": "w2", "type": "function",
                         "function": {"name": "execute", "arguments": "{}"}}]}}],
                "usage": {"prompt_tokens": 11, "completion_tokens": 12}},
            "anthropic": {"id": "m", "type": "message", "role": "assistant", "content": [
                {"type": "text", "text": "Whole ✓"},
                {"type": "tool_use", "id": "w1", "name": "execute", "input": args},
                {"type": "tool_use", "id": "w2", "name": "execute", "input": {}}],
                "stop_reason": "tool_use", "usage": {"input_tokens": 11, "output_tokens": 12}},
            "responses": {"id": "resp_w", "object": "response", "status": "completed", "output": [
                {"type": "message", "id": "msg_w", "role": "assistant", "status": "completed",
                 "content": [{"type": "output_text", "text": "Whole ✓", "annotations": []}]},
                {"type": "function_call", "id": "fc_1", "call_id": "w1", "name": "execute",
                 "arguments": json.dumps(args), "status": "completed"},
                {"type": "function_call", "id": "fc_2", "call_id": "w2", "name": "execute",
                 "arguments": "{}", "status": "completed"}],
                "usage": {"input_tokens": 11, "output_tokens": 12}},
        }
        for api in APIS:
            with self.subTest(api=api):
                out = run(api, [{"status": 200, "body": bodies[api]}], tools=TOOLS)
                r = self.ok(out)
                self.assertEqual(out["pieces"], ["Whole ✓"])
                self.assertEqual(out["tool_starts"], ["execute", "execute"])
                self.assertEqual([(c["id"], json.loads(c["arguments"])) for c in r["calls"]],
                                 [("w1", args), ("w2", {})])
                self.assertEqual((r["input_tokens"], r["output_tokens"]), (11, 12))


class Errors(unittest.TestCase):
    def err(self, out, name, *words):
        self.assertEqual(-out["rc"], getattr(errno, name), out["msg"])
        self.assertNotIn("\n", out["msg"])
        for w in words:
            self.assertIn(w, out["msg"])

    def test_error_event(self):
        for api in APIS:
            with self.subTest(api=api):
                out = run(api, [{"text": "partial", "error": "Overloaded, try later"}],
                          args=["--retries", "2"])
                self.err(out, "EPROTO", "Overloaded, try later")
                self.assertEqual(len(out["requests"]), 1)

    def test_error_event_before_any_content_is_retried(self):
        for api in APIS:
            with self.subTest(api=api):
                out = run(api, [{"error": "Overloaded"}, {"text": "better now"}],
                          args=["--retries", "1"])
                self.assertEqual(out["rc"], 0, out["msg"])
                self.assertEqual(out["reply"]["text"], "better now")
                self.assertEqual(len(out["requests"]), 2)
                out = run(api, [{"error": "Overloaded"}, {"text": "better now"}])
                self.err(out, "EPROTO", "Overloaded")

    def test_connection_dropped_mid_stream(self):
        for api in APIS:
            for framing in ("chunked", "close"):
                with self.subTest(api=api, framing=framing):
                    # Enough bytes for some text to have been shown: never retried.
                    # (The Responses API's events are wordier: its text starts later.)
                    cut = 1600 if api == "responses" else 900
                    out = run(api, [{"text": "This reply will be cut off " * 4, "chunk_size": 8,
                                     "drop_after": cut, "framing": framing}, {"text": "again"}],
                              args=["--retries", "2"])
                    self.err(out, "EPROTO", "closed the connection mid-reply")
                    self.assertTrue(out["pieces"])
                    self.assertEqual(len(out["requests"]), 1)

    def test_dropped_before_any_reply_is_retried(self):
        for api in APIS:
            for first in ({"hangup": True}, {"text": "x", "drop_after": 0}):
                with self.subTest(api=api, first=first):
                    out = run(api, [first, {"text": "second try"}], args=["--retries", "1"])
                    self.assertEqual(out["rc"], 0, out["msg"])
                    self.assertEqual(out["reply"]["text"], "second try")
                    self.assertEqual(len(out["requests"]), 2)
                    out = run(api, [first, {"text": "second try"}])
                    self.err(out, "EPROTO")

    def test_429_then_success(self):
        limited = {"status": 429, "body": {"error": {"message": "slow down"}}}
        for api in APIS:
            with self.subTest(api=api, retry_after=True):
                out = run(api, [dict(limited, headers={"Retry-After": "1"}), {"text": "ok"}],
                          args=["--retries", "1"])
                self.assertEqual(out["rc"], 0, out["msg"])
                t = [r["time"] for r in out["requests"]]
                self.assertEqual(len(t), 2)
                self.assertGreaterEqual(t[1] - t[0], 0.95)
            with self.subTest(api=api, retry_after=False):
                out = run(api, [limited, {"text": "ok"}], args=["--retries", "3"])
                self.assertEqual(out["rc"], 0, out["msg"])
                t = [r["time"] for r in out["requests"]]
                self.assertGreaterEqual(t[1] - t[0], 0.45)  # the first backoff, 0.5 s
                self.assertLess(t[1] - t[0], 0.95)

    def test_500_exhausts_retries(self):
        for api in APIS:
            with self.subTest(api=api):
                e = {"status": 500, "body": {"error": {"message": "boom"}}}
                out = run(api, [e, e, e, {"text": "never"}], args=["--retries", "2"])
                self.err(out, "EIO", "HTTP 500", "boom")
                t = [r["time"] for r in out["requests"]]
                self.assertEqual(len(t), 3)
                self.assertGreaterEqual(t[2] - t[1], 0.95)  # the backoff doubled

    def test_401_is_eacces(self):
        for api, env in (("openai", "OPENAI_API_KEY"), ("anthropic", "ANTHROPIC_API_KEY")):
            with self.subTest(api=api):
                out = run(api, [{"status": 401, "body": {"error": {"message": "bad key"}}}],
                          args=["--retries", "2"])
                self.err(out, "EACCES", "401", "bad key", env)
                self.assertNotIn(KEY, out["msg"])
                self.assertEqual(len(out["requests"]), 1)

    def test_unreachable_port(self):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()  # nothing listens there now
        for api in APIS:
            with self.subTest(api=api):
                t0 = time.monotonic()
                out = probe(api, "http://127.0.0.1:%d" % port, args=["--retries", "1"])
                self.err(out, "ECONNREFUSED", "127.0.0.1")
                self.assertGreaterEqual(time.monotonic() - t0, 0.45)  # it did retry

    def test_cancel(self):
        for api in APIS:
            with self.subTest(api=api, when="mid-stream"):
                # The first words, then a long wait before the rest.
                first, rest = STARTS[api]
                out = run(api, [{"raw": first + rest, "split": [len(first)], "delay_ms": 3000}],
                          args=["--cancel-on-text", "--retries", "2"])
                self.err(out, "ECANCELED")
                self.assertLess(out["elapsed"], 2.5)
                self.assertEqual(out["pieces"], ["first words"])
            with self.subTest(api=api, when="waiting for the reply"):
                out = run(api, [{"text": "late", "delay_before_ms": 4000}],
                          args=["--cancel-after-ms", "300"])
                self.err(out, "ECANCELED")
                self.assertLess(out["elapsed"], 2.5)
            with self.subTest(api=api, when="in the backoff"):
                e = {"status": 503, "body": "busy", "headers": {"Retry-After": "20"}}
                out = run(api, [e, {"text": "x"}], args=["--cancel-after-ms", "400",
                                                         "--retries", "1"])
                self.err(out, "ECANCELED")
                self.assertLess(out["elapsed"], 3)

    def test_timeout(self):
        out = run("openai", [{"text": "late", "delay_before_ms": 4000}], args=["--timeout", "1"])
        self.err(out, "ETIMEDOUT")
        self.assertLess(out["elapsed"], 3.5)

    def test_400_about_tools_is_enotsup(self):
        body = {"error": {"message": "this model does not support tools",
                          "type": "invalid_request_error"}}
        for api in APIS:
            with self.subTest(api=api):
                out = run(api, [{"status": 400, "body": body}], tools=TOOLS)
                self.err(out, "ENOTSUP", "does not support tools")
                # Without tools in the request the same answer is just an error.
                out = run(api, [{"status": 400, "body": body}])
                self.err(out, "EIO", "HTTP 400")

    def test_malformed_json_chunk(self):
        for api in APIS:
            with self.subTest(api=api):
                out = run(api, [{"raw": "data: {\"choices\": [{\"delta\": {\"content\": \"a\"\n\n"}],
                          args=["--retries", "2"])
                self.err(out, "EPROTO", "malformed JSON")
                self.assertEqual(len(out["requests"]), 1)

    def test_event_over_the_limit(self):
        big = "data: " + "x" * ((4 << 20) + 1) + "\n\n"
        out = run("openai", [{"raw": big}])
        self.err(out, "EMSGSIZE", "4 MiB")

    def test_hosted_endpoint_without_key(self):
        for api, base, env in (("openai", "https://api.openai.com/v1", "OPENAI_API_KEY"),
                               ("anthropic", "https://api.anthropic.com", "ANTHROPIC_API_KEY")):
            with self.subTest(api=api):
                out = probe(api, base, key=None)
                self.err(out, "EACCES", env, base)

    def test_script_exhausted(self):
        out = run("openai", [])
        self.err(out, "EIO", "HTTP 500", "script exhausted")


class Requests(unittest.TestCase):
    CONV = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "List files."},
        {"role": "assistant", "content": "",
         "tool_calls": [{"id": "c1", "name": "execute",
                         "arguments": {"language": "sh", "code": "ls"}},
                        {"id": "c2", "name": "execute", "arguments": {"_raw": "{oops"}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "execute", "content": "a.txt\nb.txt"},
        {"role": "tool", "tool_call_id": "c2", "name": "execute", "content": "bad arguments"},
        {"role": "user", "content": "And now?"},
        {"role": "assistant", "content": "Done."},
    ]

    def test_openai_request(self):
        out = run("openai", [{"text": "ok"}], messages=self.CONV, tools=TOOLS,
                  args=["--temperature", "0.25", "--max-tokens", "100"])
        self.assertEqual(out["rc"], 0, out["msg"])
        (req,) = out["requests"]
        self.assertEqual(req["path"], "/v1/chat/completions")
        self.assertEqual(req["auth"], "Bearer " + KEY)
        self.assertEqual(req["headers"]["content-type"], "application/json")
        b = req["body"]
        self.assertEqual(b["model"], "fake-model")
        self.assertIs(b["stream"], True)
        self.assertEqual(b["stream_options"], {"include_usage": True})
        self.assertEqual(b["temperature"], 0.25)
        self.assertEqual(b["max_tokens"], 100)
        self.assertEqual(b["tools"], [{"type": "function", "function": TOOLS[0]}])
        self.assertEqual(b["messages"], [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "List files."},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "execute",
                              "arguments": json.dumps({"language": "sh", "code": "ls"},
                                                      separators=(",", ":"))}},
                {"id": "c2", "type": "function",
                 "function": {"name": "execute", "arguments": "{oops"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "a.txt\nb.txt"},
            {"role": "tool", "tool_call_id": "c2", "content": "bad arguments"},
            {"role": "user", "content": "And now?"},
            {"role": "assistant", "content": "Done."}])

    def test_anthropic_request(self):
        conv = [{"role": "system", "content": "Part two."}] + self.CONV
        out = run("anthropic", [{"text": "ok"}], messages=conv, tools=TOOLS,
                  args=["--temperature", "0.5"])
        self.assertEqual(out["rc"], 0, out["msg"])
        (req,) = out["requests"]
        self.assertEqual(req["path"], "/v1/messages")
        self.assertEqual(req["auth_header"], "x-api-key")
        self.assertEqual(req["auth"], KEY)
        self.assertNotIn("authorization", req["headers"])
        self.assertEqual(req["headers"]["anthropic-version"], "2023-06-01")
        b = req["body"]
        self.assertIs(b["stream"], True)
        self.assertEqual(b["max_tokens"], 4096)
        self.assertEqual(b["temperature"], 0.5)
        self.assertEqual(b["system"], "Part two.\n\nBe brief.")
        self.assertEqual(b["tools"], [{"name": "execute", "description": TOOLS[0]["description"],
                                       "input_schema": TOOLS[0]["parameters"]}])
        self.assertEqual(b["messages"], [
            {"role": "user", "content": [{"type": "text", "text": "List files."}]},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "c1", "name": "execute",
                 "input": {"language": "sh", "code": "ls"}},
                {"type": "tool_use", "id": "c2", "name": "execute", "input": {"_raw": "{oops"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "c1", "content": "a.txt\nb.txt"},
                {"type": "tool_result", "tool_use_id": "c2", "content": "bad arguments"},
                {"type": "text", "text": "And now?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Done."}]}])

    def test_reply_message_round_trips(self):
        # The neutral message for a reply, sent back, makes the same wire message again.
        args = {"language": "python", "code": "print(1)"}
        for api in APIS:
            with self.subTest(api=api):
                out = run(api, [{"text": "Running.", "tool_calls": [
                    {"id": "r1", "name": "execute", "arguments": args}]}], tools=TOOLS)
                conv = HELLO + [out["message"], {"role": "tool", "tool_call_id": "r1",
                                                 "name": "execute", "content": "1\n"}]
                out = run(api, [{"text": "It printed 1."}], messages=conv, tools=TOOLS)
                self.assertEqual(out["rc"], 0, out["msg"])
                body = out["requests"][0]["body"]
                if api == "responses":
                    # The reply's output items go back as they came, the result after them.
                    self.assertEqual(body["instructions"], "You are a test.")
                    self.assertEqual(body["input"][0], {"role": "user", "content": "hi"})
                    self.assertEqual(body["input"][1:3], conv[2]["responses_output"])
                    self.assertEqual(body["input"][3], {"type": "function_call_output",
                                                        "call_id": "r1", "output": "1\n"})
                    continue
                sent = body["messages"]
                if api == "openai":
                    self.assertEqual(sent[2]["tool_calls"][0]["function"]["name"], "execute")
                    self.assertEqual(json.loads(sent[2]["tool_calls"][0]["function"]["arguments"]),
                                     args)
                    self.assertEqual(sent[3], {"role": "tool", "tool_call_id": "r1",
                                               "content": "1\n"})
                else:
                    self.assertEqual(sent[1]["content"][1]["input"], args)
                    self.assertEqual(sent[2]["content"][0]["tool_use_id"], "r1")

    def test_no_key_for_a_local_server(self):
        for api in APIS:
            with self.subTest(api=api):
                out = run(api, [{"text": "ok"}], key=None)
                self.assertEqual(out["rc"], 0, out["msg"])
                self.assertIsNone(out["requests"][0]["auth"])

    def test_no_tools_sends_none(self):
        for api in APIS:
            with self.subTest(api=api):
                out = run(api, [{"text": "ok"}], tools=[])
                self.assertNotIn("tools", out["requests"][0]["body"])

    def test_anthropic_base_with_v1(self):
        with Fake([{"text": "ok"}]) as fake:
            out = probe("anthropic", fake.base("anthropic") + "/v1/")
            self.assertEqual(out["rc"], 0, out["msg"])
            self.assertEqual(fake.requests()[0]["path"], "/v1/messages")

    def test_verbose_never_shows_the_key(self):
        for api in APIS:
            with self.subTest(api=api):
                with Fake([{"status": 500, "body": "x"}, {"text": "ok"}]) as fake:
                    err = []
                    out = probe(api, fake.base(api), args=["--verbose", "--retries", "1"],
                                stderr=err)
                    self.assertEqual(out["rc"], 0, out["msg"])
                    self.assertIn("127.0.0.1:%d" % fake.port, err[0])
                    self.assertIn("HTTP 500", err[0])
                    self.assertNotIn(KEY, err[0])

COMPUTER = [{"name": "computer", "description": "The screen.",
             "parameters": {"type": "object", "properties": {"action": {"type": "string"}}},
             "anthropic": {"type": "computer_20250124", "name": "computer",
                           "display_width_px": 720, "display_height_px": 400},
             "openai": {"type": "computer"}}]
ACTIONS = [{"type": "click", "button": "left", "x": 3, "y": 4}, {"type": "type", "text": "hi"}]
CHECKS = [{"id": "sc_1", "code": "malicious_instructions", "message": "Odd page."}]


class Responses(unittest.TestCase):
    """OpenAI's Responses API: its request items, its computer calls, its own ends."""

    def test_request(self):
        out = run("responses", [{"text": "ok"}], messages=Requests.CONV, tools=TOOLS,
                  args=["--temperature", "0.25", "--max-tokens", "100"])
        self.assertEqual(out["rc"], 0, out["msg"])
        (req,) = out["requests"]
        self.assertEqual(req["path"], "/v1/responses")
        self.assertEqual(req["auth"], "Bearer " + KEY)
        b = req["body"]
        self.assertIs(b["stream"], True)
        self.assertEqual(b["temperature"], 0.25)
        self.assertEqual(b["max_output_tokens"], 100)
        self.assertEqual(b["instructions"], "Be brief.")
        self.assertNotIn("truncation", b)
        self.assertEqual(b["tools"], [dict(type="function", **TOOLS[0])])
        # Messages rebuilt as items when the reply's own items were not kept.
        self.assertEqual(b["input"], [
            {"role": "user", "content": "List files."},
            {"type": "function_call", "call_id": "c1", "name": "execute",
             "arguments": json.dumps({"language": "sh", "code": "ls"}, separators=(",", ":"))},
            {"type": "function_call", "call_id": "c2", "name": "execute", "arguments": "{oops"},
            {"type": "function_call_output", "call_id": "c1", "output": "a.txt\nb.txt"},
            {"type": "function_call_output", "call_id": "c2", "output": "bad arguments"},
            {"role": "user", "content": "And now?"},
            {"role": "assistant", "content": "Done."}])

    def test_computer_call_and_its_output(self):
        out = run("responses", [{"reasoning": True, "computer_calls": [
            {"call_id": "cc1", "actions": ACTIONS, "pending_safety_checks": CHECKS}]}],
            tools=COMPUTER)
        self.assertEqual(out["rc"], 0, out["msg"])
        self.assertEqual(out["requests"][0]["body"]["tools"], [{"type": "computer"}])
        r = out["reply"]
        self.assertEqual(r["finish"], "tool_calls")
        self.assertEqual(out["tool_starts"], ["computer"])
        (call,) = r["calls"]
        self.assertEqual((call["id"], call["name"], call["kind"]), ("cc1", "computer", "computer_call"))
        self.assertEqual(json.loads(call["arguments"]),
                         {"actions": ACTIONS, "pending_safety_checks": CHECKS})
        msg = out["message"]
        self.assertEqual(msg["tool_calls"][0]["kind"], "computer_call")
        self.assertEqual([i["type"] for i in msg["responses_output"]], ["reasoning", "computer_call"])
        png = {"media_type": "image/png", "data": "iVBORw0KGgo="}
        url = "data:image/png;base64,iVBORw0KGgo="
        result = {"role": "tool", "tool_call_id": "cc1", "name": "computer", "kind": "computer_call",
                  "content": "Done.", "images": [png], "acknowledged_safety_checks": CHECKS}
        # Sent back: the reasoning and the call as they came, then the screenshot, acknowledged.
        out = run("responses", [{"text": "ok"}], messages=HELLO + [msg, result], tools=COMPUTER)
        inp = out["requests"][0]["body"]["input"]
        self.assertEqual(inp[1:3], msg["responses_output"])
        self.assertEqual(inp[1]["encrypted_content"], "opaque")
        self.assertEqual(inp[3], {"type": "computer_call_output", "call_id": "cc1",
                                  "output": {"type": "computer_screenshot", "image_url": url},
                                  "acknowledged_safety_checks": CHECKS})
        self.assertEqual(len(inp), 4)
        # A failed call: the screenshot still answers it, and its text follows for the model.
        failed = dict(result, content="error: out of the screen", is_error=True)
        del failed["acknowledged_safety_checks"]
        rebuilt = dict(msg)
        del rebuilt["responses_output"]
        out = run("responses", [{"text": "ok"}], messages=HELLO + [rebuilt, failed],
                  tools=COMPUTER)
        inp = out["requests"][0]["body"]["input"]
        self.assertEqual(inp[1], {"type": "computer_call", "id": "cc1", "call_id": "cc1",
                                  "status": "completed", "actions": ACTIONS,
                                  "pending_safety_checks": CHECKS})
        self.assertEqual(inp[2], {"type": "computer_call_output", "call_id": "cc1",
                                  "output": {"type": "computer_screenshot", "image_url": url}})
        self.assertEqual(inp[3], {"role": "user",
                                  "content": "The computer call cc1: error: out of the screen"})

    def test_preview_tool_asks_for_truncation(self):
        tools = [dict(COMPUTER[0], openai={"type": "computer_use_preview", "display_width": 720,
                                            "display_height": 400, "environment": "linux"})]
        out = run("responses", [{"computer_calls": [
            {"call_id": "p1", "action": {"type": "screenshot"}}]}], tools=tools)
        self.assertEqual(out["rc"], 0, out["msg"])
        b = out["requests"][0]["body"]
        self.assertEqual(b["truncation"], "auto")
        self.assertEqual(b["tools"], [tools[0]["openai"]])
        self.assertEqual(json.loads(out["reply"]["calls"][0]["arguments"]),
                         {"action": {"type": "screenshot"}})

    def test_incomplete_and_failed(self):
        out = run("responses", [{"text": "cut", "finish": "length"}])
        self.assertEqual(out["rc"], 0, out["msg"])
        self.assertEqual(out["reply"]["finish"], "length")
        failed = ('event: response.failed\ndata: {"type":"response.failed","response":'
                  '{"status":"failed","error":{"code":"server_error","message":"it broke"}}}\n\n')
        out = run("responses", [{"raw": failed}])
        self.assertEqual(-out["rc"], errno.EPROTO)
        self.assertIn("it broke", out["msg"])
        out = run("responses", [{"text": "x", "error": "overloaded now"}])
        self.assertEqual(-out["rc"], errno.EPROTO)
        self.assertIn("overloaded now", out["msg"])


if __name__ == "__main__":
    unittest.main(verbosity=2)

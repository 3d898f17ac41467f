#!/usr/bin/env python3
"""fakemodel: a test-only model server speaking the real wire formats, replaying a script.

    fakemodel.py --script SCRIPT.json --log REQUESTS.jsonl [--port-file FILE] [--port N]

It listens on 127.0.0.1 (port 0 by default: the kernel picks one), prints the port on stdout
(one line, flushed) and, with --port-file, also writes it to FILE (atomically, so a reader that
sees the file sees the whole number). It serves until killed.

Endpoints
  POST .../chat/completions   OpenAI Chat Completions, streamed (SSE chunks, "data: [DONE]")
  POST .../messages           Anthropic Messages API, streamed (message_start ... message_stop)
  POST .../responses          OpenAI Responses API, streamed (response.created ...
                              response.completed, each output item added, its deltas, done)
  GET  .../models             a one-model list (does not use the script)
Every POST to any of them takes the NEXT reply from the script, whatever its path: the same
script works for every API, each reply being rendered in the format of the request that takes it.
When the script is used up, the server answers 500 with
  {"error": {"message": "fakemodel: script exhausted after N replies", ...}}.

The request log (--log) gets one JSON line per request, written before the reply is sent:
  {"n": 0, "time": 1700000000.123, "method": "POST", "path": "/v1/chat/completions",
   "headers": {"content-type": "application/json", ...},     (all of them, names lowercased)
   "auth": "Bearer sk-test" | "sk-ant-test" | null,   (Authorization, else x-api-key, value)
   "auth_header": "authorization" | "x-api-key" | null,
   "body": {...parsed JSON...} | null, "body_text": "..." (only when the body is not JSON)}
"n" counts POSTs to the model endpoints (the index of the script reply they were given).

The script: a JSON list of replies (or {"replies": [...]}), used in order. Each reply is one of:

1. Content, turned into realistic streamed chunks of the requesting API:
   {"text": "Hello, wörld",                       optional assistant text
    "tool_calls": [{"id": "call_1", "name": "execute",
                    "arguments": {"language": "python", "code": "print(1)"}}],
                       arguments: an object (sent as its JSON text) or a string sent verbatim
                       (so a test can send invalid JSON); "id" optional (made up)
    "chunk_size": 8,   bytes of text / argument JSON per delta; pieces are cut at byte
                       positions, so a multi-byte UTF-8 character can be cut across deltas
                       (as llama.cpp does); "split_chars": true cuts at characters instead
    "finish": "...",   finish_reason / stop_reason (default stop|tool_calls, end_turn|tool_use)
    "usage": {"input": 12, "output": 34},          token counts reported (defaults 10 / 5)
    "keepalive": true, a ": keep-alive" comment (OpenAI) / a ping event (Anthropic) between
                       events, and a comment before the first
    "done": false,     OpenAI: leave out the final "data: [DONE]" (default true)
    "error": "text",   after the content, an error in the stream instead of the finish:
                       OpenAI: data: {"error": {"message": text}}; Anthropic: event: error;
                       Responses: event: error
    Responses only:
    "computer_calls": [{"call_id": "call_1", "actions": [{"type": "click", ...}],
                        "pending_safety_checks": [{"id": ..., "code": ..., "message": ...}]}]
                       computer_call items after the function calls ("action": {...} instead of
                       "actions" for the preview model's shape)
    "reasoning": true  a reasoning item (with encrypted_content) before the message
   plus any of the transport controls below.

2. An HTTP error or any non-streamed reply:
   {"status": 429, "headers": {"Retry-After": "1"},
    "body": {"error": {"message": "rate limited"}}}   body: an object (sent as JSON) or a string

3. Raw SSE bytes, sent as they are:
   {"raw": "data: {...}\\n\\ndata: [DONE]\\n\\n"}     (or "raw_b64": base64 of the bytes)
   plus any transport controls.

Transport controls (for 1 and 3):
    "status": 200, "headers": {...}     the status line and extra headers
    "line_ending": "\\r\\n"             "\\n" (default), "\\r\\n" or "\\r" after each SSE line (1 only)
    "split": [5, 17]                    write the body in pieces cut at these byte offsets...
    "write_size": 3                     ...or in pieces of this many bytes (default: one write
                                        per event for 1, one write for 3)
    "delay_ms": 20                      pause between writes (each write is flushed and sent
                                        with TCP_NODELAY, so the client sees separate reads)
    "delay_before_ms": 3000             pause before the status line (timeouts, cancellation)
    "drop_after": 120                   close the connection after this many body bytes
    "hangup": true                      close the connection without answering at all
    "framing": "chunked" | "close"      HTTP/1.1 chunked body (default), or a body ended by
                                        closing the connection (then a drop looks like an end)

Example: a reply that streams text and then asks for code, then one that finishes:
  [{"text": "Let me check.", "tool_calls": [{"name": "execute",
      "arguments": {"language": "sh", "code": "uname -a"}}], "chunk_size": 4},
   {"text": "It is Linux."}]
"""

import argparse
import base64
import json
import os
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def pieces(data: bytes, size: int, by_chars: bool):
    """data cut into pieces of about size bytes, each returned as a str that may hold lone
    surrogates standing for the bytes of a cut character (see sse_json)."""
    size = max(1, size)
    if by_chars:
        s = data.decode("utf-8")
        return [s[i:i + size] for i in range(0, len(s), size)] or [""]
    return [data[i:i + size].decode("utf-8", "surrogateescape")
            for i in range(0, len(data), size)] or [""]


def sse_json(obj) -> bytes:
    # ensure_ascii=False keeps the lone surrogates, which surrogateescape turns back into the
    # raw bytes of a cut character: the JSON then carries half a UTF-8 sequence, on purpose.
    return json.dumps(obj, ensure_ascii=False).encode("utf-8", "surrogateescape")


def args_text(args) -> bytes:
    if isinstance(args, str):
        return args.encode("utf-8")
    return json.dumps(args if args is not None else {}, ensure_ascii=False).encode("utf-8")


class Script:
    def __init__(self, path):
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        self.replies = data["replies"] if isinstance(data, dict) else data
        self.next = 0
        self.lock = threading.Lock()

    def take(self):
        with self.lock:
            n = self.next
            self.next += 1
            return n, (self.replies[n] if n < len(self.replies) else None)


class Log:
    def __init__(self, path):
        self.path = path
        self.lock = threading.Lock()
        open(path, "a").close()

    def write(self, rec):
        with self.lock, open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
            f.flush()


def content_params(reply, req):
    """A content reply's settings, with their defaults: model, chunk size, whether to cut at
    characters, tool calls, usage."""
    model = req.get("model", "fake") if isinstance(req, dict) else "fake"
    return (model, reply.get("chunk_size", 8), reply.get("split_chars", False),
            reply.get("tool_calls") or [], reply.get("usage", {}))


def openai_events(reply, req):
    """The SSE events (lists of (event, data bytes)) of an OpenAI streamed reply."""
    model, size, by_chars, calls, usage = content_params(reply, req)

    def chunk(delta, finish=None, **extra):
        c = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1700000000,
             "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        c.update(extra)
        return (None, sse_json(c))

    ev = [chunk({"role": "assistant", "content": ""})]
    if reply.get("text"):
        for p in pieces(reply["text"].encode("utf-8"), size, by_chars):
            ev.append(chunk({"content": p}))
    for i, call in enumerate(calls):
        ev.append(chunk({"tool_calls": [{
            "index": i, "id": call.get("id", "call_fake_%d" % i), "type": "function",
            "function": {"name": call["name"], "arguments": ""}}]}))
        for p in pieces(args_text(call.get("arguments")), size, by_chars):
            ev.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": p}}]}))
    if reply.get("error"):
        ev.append((None, sse_json({"error": {"message": reply["error"], "type": "server_error"}})))
        return ev
    finish = reply.get("finish", "tool_calls" if calls else "stop")
    ev.append(chunk({}, finish))
    opts = req.get("stream_options") if isinstance(req, dict) else None
    if isinstance(opts, dict) and opts.get("include_usage"):
        u = {"prompt_tokens": usage.get("input", 10), "completion_tokens": usage.get("output", 5)}
        u["total_tokens"] = u["prompt_tokens"] + u["completion_tokens"]
        ev.append((None, sse_json({"id": "chatcmpl-fake", "object": "chat.completion.chunk",
                                   "created": 1700000000, "model": model, "choices": [],
                                   "usage": u})))
    if reply.get("done", True):
        ev.append((None, b"[DONE]"))
    return ev


def anthropic_events(reply, req):
    model, size, by_chars, calls, usage = content_params(reply, req)

    def e(name, obj):
        obj = dict(type=name, **obj)
        return (name, sse_json(obj))

    ev = [e("message_start", {"message": {
        "id": "msg_fake", "type": "message", "role": "assistant", "model": model,
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": usage.get("input", 10), "output_tokens": 1}}})]
    ev.append(e("ping", {}))
    index = 0
    if reply.get("text"):
        ev.append(e("content_block_start", {"index": index,
                                            "content_block": {"type": "text", "text": ""}}))
        for p in pieces(reply["text"].encode("utf-8"), size, by_chars):
            ev.append(e("content_block_delta", {"index": index,
                                                "delta": {"type": "text_delta", "text": p}}))
        ev.append(e("content_block_stop", {"index": index}))
        index += 1
    for i, call in enumerate(calls):
        ev.append(e("content_block_start", {"index": index, "content_block": {
            "type": "tool_use", "id": call.get("id", "toolu_fake_%d" % i),
            "name": call["name"], "input": {}}}))
        for p in pieces(args_text(call.get("arguments")), size, by_chars):
            ev.append(e("content_block_delta", {"index": index, "delta": {
                "type": "input_json_delta", "partial_json": p}}))
        ev.append(e("content_block_stop", {"index": index}))
        index += 1
    if reply.get("error"):
        ev.append(e("error", {"error": {"type": "overloaded_error", "message": reply["error"]}}))
        return ev
    finish = reply.get("finish", "tool_use" if calls else "end_turn")
    ev.append(e("message_delta", {"delta": {"stop_reason": finish, "stop_sequence": None},
                                  "usage": {"output_tokens": usage.get("output", 5)}}))
    ev.append(e("message_stop", {}))
    return ev


def responses_events(reply, req):
    """The SSE events of a Responses API streamed reply."""
    model, size, by_chars, calls, usage = content_params(reply, req)
    seq = [0]

    def e(name, obj):
        obj = dict(type=name, sequence_number=seq[0], **obj)
        seq[0] += 1
        return (name, sse_json(obj))

    resp = {"id": "resp_fake", "object": "response", "created_at": 1700000000,
            "status": "in_progress", "model": model, "output": [], "usage": None}
    ev = [e("response.created", {"response": resp}), e("response.in_progress", {"response": resp})]
    output = []

    def item(added, done, deltas=()):
        i = len(output)
        ev.append(e("response.output_item.added", {"output_index": i, "item": added}))
        for name, obj in deltas:
            ev.append(e(name, dict(item_id=added["id"], output_index=i, **obj)))
        ev.append(e("response.output_item.done", {"output_index": i, "item": done}))
        output.append(done)

    if reply.get("reasoning"):
        r = {"id": "rs_fake", "type": "reasoning", "summary": [], "encrypted_content": "opaque"}
        item(r, r)
    text = reply.get("text")
    if text:
        part = {"type": "output_text", "text": text, "annotations": []}
        deltas = [("response.content_part.added",
                   {"content_index": 0, "part": dict(part, text="")})]
        deltas += [("response.output_text.delta", {"content_index": 0, "delta": p})
                   for p in pieces(text.encode("utf-8"), size, by_chars)]
        deltas += [("response.output_text.done", {"content_index": 0, "text": text}),
                   ("response.content_part.done", {"content_index": 0, "part": part})]
        m = {"id": "msg_fake", "type": "message", "role": "assistant"}
        item(dict(m, status="in_progress", content=[]),
             dict(m, status="completed", content=[part]), deltas)
    for i, call in enumerate(calls):
        args = args_text(call.get("arguments"))
        fc = {"id": "fc_fake_%d" % i, "type": "function_call", "name": call["name"],
              "call_id": call.get("id", "call_fake_%d" % i)}
        deltas = [("response.function_call_arguments.delta", {"delta": p})
                  for p in pieces(args, size, by_chars)]
        deltas.append(("response.function_call_arguments.done",
                       {"arguments": args.decode("utf-8")}))
        item(dict(fc, status="in_progress", arguments=""),
             dict(fc, status="completed", arguments=args.decode("utf-8")), deltas)
    for i, cc in enumerate(reply.get("computer_calls") or []):
        cu = {"id": "cu_fake_%d" % i, "type": "computer_call",
              "call_id": cc.get("call_id", "call_cu_%d" % i),
              "pending_safety_checks": cc.get("pending_safety_checks", [])}
        for k in ("actions", "action"):
            if k in cc:
                cu[k] = cc[k]
        item(dict(cu, status="in_progress"), dict(cu, status="completed"))
    if reply.get("error"):
        ev.append(e("error", {"code": "server_error", "message": reply["error"], "param": None}))
        return ev
    u = {"input_tokens": usage.get("input", 10), "output_tokens": usage.get("output", 5)}
    u["total_tokens"] = u["input_tokens"] + u["output_tokens"]
    final = dict(resp, status="completed", output=output, usage=u)
    if reply.get("finish") == "length":
        final.update(status="incomplete", incomplete_details={"reason": "max_output_tokens"})
        ev.append(e("response.incomplete", {"response": final}))
    else:
        ev.append(e("response.completed", {"response": final}))
    return ev


def render(events, reply, keepalive_line):
    """The SSE bytes of the events, and where one event's bytes end (the natural writes)."""
    nl = reply.get("line_ending", "\n").encode()
    out, ends = b"", []
    if reply.get("keepalive"):
        out += keepalive_line + nl + nl
    for i, (name, data) in enumerate(events):
        if name:
            out += b"event: " + name.encode() + nl
        for line in data.split(b"\n"):
            out += b"data: " + line + nl
        out += nl
        if reply.get("keepalive") and i + 1 < len(events):
            out += keepalive_line + nl + nl
        ends.append(len(out))
    return out, ends


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fakemodel/1"

    def log_message(self, fmt, *args):  # quiet: the request log is the record
        pass

    def handle(self):
        # A client that stops reading once it has what it needs ([DONE], message_stop) or that
        # cancels closes the connection under us: that is normal, not a server error.
        try:
            super().handle()
        except (ConnectionResetError, BrokenPipeError):
            pass

    def send_json(self, status, obj, headers=None):
        body = json.dumps(obj).encode() if not isinstance(obj, (str, bytes)) else (
            obj.encode() if isinstance(obj, str) else obj)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, str(v))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def do_GET(self):
        if self.path.rstrip("/").endswith("/models"):
            self.send_json(200, {"object": "list", "data": [
                {"id": "fake-model", "object": "model", "owned_by": "fakemodel"}]})
        else:
            self.send_json(404, {"error": {"message": "fakemodel: no such path " + self.path}})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        path = self.path.split("?")[0].rstrip("/")
        if path.endswith("/chat/completions"):
            api = "openai"
        elif path.endswith("/messages"):
            api = "anthropic"
        elif path.endswith("/responses"):
            api = "responses"
        else:
            self.send_json(404, {"error": {"message": "fakemodel: no such path " + self.path}})
            return
        n, reply = self.server.script.take()
        headers = {k.lower(): v for k, v in self.headers.items()}
        auth_header = ("authorization" if "authorization" in headers else
                       "x-api-key" if "x-api-key" in headers else None)
        rec = {"n": n, "time": time.time(), "method": "POST", "path": self.path,
               "headers": headers, "auth": headers.get(auth_header) if auth_header else None,
               "auth_header": auth_header}
        try:
            body = json.loads(raw)
            rec["body"] = body
        except ValueError:
            body = None
            rec["body"] = None
            rec["body_text"] = raw.decode("utf-8", "replace")
        self.server.log.write(rec)

        if reply is None:
            self.send_json(500, {"error": {
                "message": "fakemodel: script exhausted after %d replies" % n,
                "type": "fakemodel_script_exhausted"}})
            return
        if reply.get("delay_before_ms"):
            time.sleep(reply["delay_before_ms"] / 1000)
        if reply.get("hangup"):
            self.hang_up()
            return
        if "body" in reply:
            self.send_json(reply.get("status", 200), reply["body"], reply.get("headers"))
            return
        if "raw" in reply or "raw_b64" in reply:
            data = (reply["raw"].encode("utf-8") if "raw" in reply
                    else base64.b64decode(reply["raw_b64"]))
            ends = [len(data)]
        elif api == "openai":
            data, ends = render(openai_events(reply, body), reply, b": keep-alive")
        elif api == "responses":
            data, ends = render(responses_events(reply, body), reply, b": keep-alive")
        else:
            ka = b"event: ping" + reply.get("line_ending", "\n").encode() + b'data: {"type": "ping"}'
            data, ends = render(anthropic_events(reply, body), reply, ka)
        self.stream(reply, data, ends)

    def hang_up(self):
        self.close_connection = True
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def stream(self, reply, data, ends):
        if "split" in reply:
            cuts = sorted(c for c in reply["split"] if 0 < c < len(data))
        elif reply.get("write_size"):
            cuts = list(range(reply["write_size"], len(data), reply["write_size"]))
        else:
            cuts = [e for e in ends if e < len(data)]
        bounds = [0] + cuts + [len(data)]
        drop = reply.get("drop_after")
        chunked = reply.get("framing", "chunked") == "chunked"

        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.send_response(reply.get("status", 200))
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Connection", "close")
            self.close_connection = True
        for k, v in (reply.get("headers") or {}).items():
            self.send_header(k, str(v))
        self.end_headers()
        self.wfile.flush()

        sent = 0
        try:
            for a, b in zip(bounds, bounds[1:]):
                piece = data[a:b]
                if drop is not None and sent + len(piece) > drop:
                    piece = piece[:drop - sent]
                if piece:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
                    self.wfile.flush()
                    sent += len(piece)
                if drop is not None and sent >= drop:
                    self.hang_up()
                    return
                if reply.get("delay_ms") and b < len(data):
                    time.sleep(reply["delay_ms"] / 1000)
            if chunked:
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away (cancelled): fine


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--script", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--port-file")
    ap.add_argument("--port", type=int, default=0)
    a = ap.parse_args()

    server = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    server.daemon_threads = True
    server.script = Script(a.script)
    server.log = Log(a.log)
    port = server.server_address[1]
    if a.port_file:
        tmp = a.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write("%d\n" % port)
        os.rename(tmp, a.port_file)
    print(port, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())

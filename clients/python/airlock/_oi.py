"""Open Interpreter's Python API on Airlock: `from airlock import interpreter`.

An Interpreter drives `airlock chat --jsonl` (the chat loop of the C library, its VM this
process's own: no daemon to set up), or with server=URL airlockd's chat API (the daemon's
model and key, a session of the caller's key), and speaks Open Interpreter's LMC format: chunks
{"role", "type", "format", "content"} with "start"/"end" flags around each message. Settings
are read when a chat starts its VM (the first chat(), or the first after reset() or after a
setting changed: the conversation is carried over, the VM is new).
"""
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

__all__ = ["Interpreter", "LLM"]

# How long a stop waits for the chat to say its turn is over before it ends the process.
_STOP_WAIT_S = 30


class LLM:
    """The model: as Open Interpreter's interpreter.llm."""

    def __init__(self):
        self.model = None          # e.g. "gpt-4o", "claude-sonnet-4-5"; None: airlock's default
        self.api_base = None       # an OpenAI-compatible or Anthropic endpoint
        self.api_key = None        # given to the chat in its environment, never its arguments
        self.api = None            # "openai" or "anthropic"; None: from the model's name
        self.temperature = None
        self.context_window = None
        self.max_tokens = None
        self.supports_vision = None
        self.supports_functions = None

    def _args(self):
        a = []
        for flag, v in (("--model", self.model), ("--api-base", self.api_base),
                        ("--api", self.api), ("--temperature", self.temperature),
                        ("--context-window", self.context_window),
                        ("--max-tokens", self.max_tokens)):
            if v is not None:
                a += [flag, str(v)]
        if self.supports_vision is not None:
            a.append("--vision" if self.supports_vision else "--no-vision")
        if self.supports_functions is False:
            a.append("--no-tools")
        return a


class _Display:
    def __init__(self, computer):
        self._c = computer

    def view(self):
        """The screen now, as PNG bytes (a session with a screen: image="desktop")."""
        return self._c._screen()

    screenshot = view


class _Mouse:
    def __init__(self, computer):
        self._c = computer

    def click(self, x, y, button="left"):
        self._c._input([{"action": "left_click" if button == "left" else "right_click",
                         "coordinate": [int(x), int(y)]}])

    def move(self, x, y):
        self._c._input([{"action": "mouse_move", "coordinate": [int(x), int(y)]}])

    def scroll(self, clicks, x=None, y=None):
        a = {"action": "scroll", "scroll_direction": "down" if clicks > 0 else "up",
             "scroll_amount": abs(int(clicks))}
        if x is not None:
            a["coordinate"] = [int(x), int(y)]
        self._c._input([a])


class _Keyboard:
    def __init__(self, computer):
        self._c = computer

    def write(self, text):
        self._c._input([{"action": "type", "text": str(text)}])

    def hotkey(self, *keys):
        self._c._input([{"action": "key", "text": "+".join(keys)}])


class _Clipboard:
    """The desktop's X clipboard, inside the guest (there is no host path for it)."""

    def __init__(self, computer):
        self._c = computer

    def view(self):
        """The clipboard's text ("" when it holds none)."""
        out = self._c.run("python", _CLIPBOARD_VIEW)
        text = "".join(c.get("content", "") for c in out if c.get("format") == "output")
        if "\x00no-xclip" in text:
            raise RuntimeError("this image has no xclip (the desktop image has it)")
        return text

    def copy(self, text):
        # xclip stays in the background to own the selection: its output goes nowhere, so that
        # the run ends
        out = self._c.run("python", _CLIPBOARD_COPY % (str(text),))
        if any("\x00no-xclip" in c.get("content", "") for c in out):
            raise RuntimeError("this image has no xclip (the desktop image has it)")


_CLIPBOARD_VIEW = """import os, subprocess, sys
try:
    r = subprocess.run(["xclip", "-o", "-selection", "clipboard"], capture_output=True,
                       env=dict(os.environ, DISPLAY=os.environ.get("DISPLAY", ":0")))
    sys.stdout.write(r.stdout.decode("utf-8", "replace"))
except FileNotFoundError:
    sys.stdout.write("\\x00no-xclip")
sys.stdout.flush()
"""

_CLIPBOARD_COPY = """import os, subprocess, sys
try:
    subprocess.run(["xclip", "-selection", "clipboard"], input=%r.encode(),
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env=dict(os.environ, DISPLAY=os.environ.get("DISPLAY", ":0")))
except FileNotFoundError:
    sys.stdout.write("\\x00no-xclip")
    sys.stdout.flush()
"""


class _Computer:
    """interpreter.computer: code run in the VM without the model, the screen and input."""

    def __init__(self, interp):
        self._i = interp
        self.display = _Display(self)
        self.mouse = _Mouse(self)
        self.keyboard = _Keyboard(self)
        self.clipboard = _Clipboard(self)

    def run(self, language, code, stream=False, display=False):
        """Runs code in the session's kernel of that language; its chunks (console output,
        images), or, without stream, the list of them."""
        gen = self._i._request({"role": "computer", "type": "code", "format": language,
                                "content": code}, display)
        return gen if stream else list(gen)

    def _shell_output(self, cmd):
        out = [c.get("content", "") for c in self.run("shell", cmd)
               if c.get("type") == "console" and c.get("format") == "output"]
        return "".join(out)

    def _airlock(self, *args):
        r = subprocess.run([self._i._binary()] + list(args), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, env=self._i._env())
        if r.returncode:
            raise RuntimeError(r.stderr.decode(errors="replace").strip())
        return r.stdout

    def _screen(self):
        for c in self._i._request({"role": "user", "type": "command", "content": "screenshot"},
                                  False):
            if c.get("type") == "image":
                return base64.b64decode(c["content"])
            if c.get("type") == "error":
                raise RuntimeError(str(c.get("content")))
        raise RuntimeError("no screen came back")

    def _input(self, actions):
        for c in self._i._request({"role": "user", "type": "command", "content": "input",
                                   "actions": actions}, False):
            if c.get("type") == "error":
                raise RuntimeError(str(c.get("content")))


class Interpreter:
    """One chat and its own VM. `chat()` as Open Interpreter's; `messages` as its list of LMC
    messages (assign one to restore a conversation); `reset()` for a fresh VM."""

    def __init__(self, image=None, server=None, api_key=None, session=None, **settings):
        self.llm = LLM()
        self.messages = []
        self.auto_run = False
        self.system_message = None
        self.custom_instructions = None
        self.max_output = None
        self.loop = False
        self.max_turns = None
        self.image = image
        self.workdir = None
        self.sync_back = "no"
        self.net = None
        self.checkpoints = False
        self.computer_use = False  # a screen, mouse and keyboard: the model's computer tool too
        self.profile = None
        self.verbose = False
        self.computer = _Computer(self)
        self.server = server
        self.api_key = api_key
        for k, v in settings.items():
            if not hasattr(self, k):
                raise TypeError("unknown setting %r" % k)
            setattr(self, k, v)
        self._p = None
        self._log = None
        self._started_with = None
        self._sent_messages = None  # the list object the VM's conversation was built from
        self.session = None
        self._lock = threading.Lock()
        self._pending_confirmation = False
        self._thread = None
        self._thread_result = None
        self._sb = None   # on airlockd: the Sandbox
        self._run = None  # on airlockd: the turn in progress
        # on airlockd: a session of the caller's to chat in (Sandbox.connect), not this
        # Interpreter's to end
        self._attach = session
        if session and not server:
            raise ValueError("session= attaches to a session of airlockd: give server= too")

    # ---- the chat process ----

    @staticmethod
    def _binary():
        return os.environ.get("AIRLOCK_BIN") or shutil.which("airlock") or "/usr/bin/airlock"

    def _env(self):
        e = dict(os.environ)
        if self.llm.api_key:
            e["OPENAI_API_KEY"] = e["ANTHROPIC_API_KEY"] = str(self.llm.api_key)
        return e

    def _args(self):
        a = ["chat", "--jsonl"] + self.llm._args()
        if self.auto_run:
            a.append("--auto-run")
        for flag, v in (("--image", self.image), ("--system-message", self.system_message),
                        ("--instructions", self.custom_instructions),
                        ("--max-output", self.max_output), ("--max-turns", self.max_turns),
                        ("--workdir", self.workdir), ("--net", self.net),
                        ("--profile", self.profile)):
            if v is not None:
                a += [flag, str(v)]
        if self.workdir is not None:
            a += ["--sync-back", self.sync_back]
        if self.checkpoints:
            a += ["--checkpoint", "auto"]
        if self.computer_use:
            a.append("--computer")
        return a

    def _ensure(self):
        """The chat process for the settings as they are now, with the conversation in
        `messages` (a fresh VM when anything changed)."""
        if self.server:
            return self._remote_ensure()
        args = self._args()
        if self._p and self._p.poll() is None and args == self._started_with:
            if self.messages is not self._sent_messages and self._sent_messages is not None:
                self._restore()
            return
        self._close()
        self._log = tempfile.TemporaryFile()
        self._p = subprocess.Popen([self._binary()] + args, stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=self._log, env=self._env(),
                                   start_new_session=True)
        self._started_with = args
        ready = self._read()
        if not ready or ready.get("content") != "ready":
            raise RuntimeError("airlock chat did not start: " + self._stderr())
        self.session = ready.get("session")
        if self.messages:
            self._restore()
        self._sent_messages = self.messages

    def _restore(self):
        self._send({"role": "user", "type": "messages", "content": _plain(self.messages)})
        for c in self._until_complete():
            pass
        self._sent_messages = self.messages

    def _stderr(self):
        if not self._log:
            return ""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-2000:]

    def _send(self, obj):
        self._p.stdin.write((json.dumps(obj) + "\n").encode())
        self._p.stdin.flush()

    def _read(self):
        line = self._p.stdout.readline()
        if not line:
            return None
        return json.loads(line.decode("utf-8", errors="replace"))

    def _until_complete(self):
        while True:
            c = self._read()
            if c is None:
                raise RuntimeError("airlock chat ended: " + self._stderr())
            if c.get("role") == "server" and c.get("type") == "status":
                if c.get("content") == "complete":
                    return
                continue
            yield c

    def _close(self):
        if self._p and self._p.poll() is None:
            try:
                self._p.stdin.close()
                self._p.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self._p.kill()
                self._p.wait()
        if self._p:
            self._p.stdout.close()
        if self._log:
            self._log.close()
        self._p = self._log = None
        self.session = None
        self._pending_confirmation = False

    def _stop(self):
        """Stops the model and the running code (SIGINT, as Ctrl-C), then waits for the turn's
        end; a chat that does not end is killed (the VM with it)."""
        if self.server:
            run, self._run = self._run, None
            if run is not None:
                try:
                    run.signal("INT")
                    for _ in self._remote_events(run):
                        pass
                except Exception:  # the turn had ended, or the daemon went away
                    pass
            return
        if not self._p or self._p.poll() is not None:
            return
        self._p.send_signal(signal.SIGINT)
        done = threading.Event()

        def drain():
            try:
                for _ in self._until_complete():
                    pass
            except (RuntimeError, ValueError, OSError):
                pass
            done.set()
        t = threading.Thread(target=drain, daemon=True)
        t.start()
        if not done.wait(_STOP_WAIT_S):
            self._p.kill()
            self._close()

    # ---- on airlockd: the daemon's chat API (docs/API.md, "Chat"), its model and key ----

    def _remote_ensure(self):
        if self._sb is not None:
            return
        from . import Sandbox  # the client of the same package
        kw = {"url": self.server}
        if self.api_key:
            kw["api_key"] = self.api_key
        if self.image:
            kw["image"] = self.image
        if self.checkpoints:
            kw["checkpoints"] = True
        if self._attach:
            self._sb = Sandbox.connect(self._attach, url=self.server, api_key=self.api_key)
        else:
            self._sb = Sandbox(**kw)
        self.session = self._sb.id
        if self.messages:
            self._remote_restore()
        self._sent_messages = self.messages

    def _remote_restore(self):
        """The conversation in `messages` replaces the daemon's (PUT .../chat/messages)."""
        self._sb.client.request("PUT", "/v1/sessions/%s/chat/messages" % self._sb.id,
                                {"messages": _plain(self.messages)})
        self._sent_messages = self.messages

    def _remote_events(self, run):
        """The turn's events as LMC chunks, until its end or a confirmation."""
        text = console = False
        for ev in run.events():
            t, d = ev.type, ev.data
            if t == "text":
                if not text:
                    yield {"role": "assistant", "type": "message", "start": True}
                    text = True
                yield {"role": "assistant", "type": "message", "content": d.get("text", "")}
                continue
            if text and t != "thinking":
                yield {"role": "assistant", "type": "message", "end": True}
                text = False
            if t == "code":
                lang = d.get("language")
                yield {"role": "assistant", "type": "code", "format": lang, "start": True}
                yield {"role": "assistant", "type": "code", "format": lang,
                       "content": d.get("code", "")}
                yield {"role": "assistant", "type": "code", "format": lang, "end": True}
            elif t == "confirm":
                yield {"role": "computer", "type": "confirmation", "format": "execution",
                       "content": {"type": "code", "format": d.get("language"),
                                   "content": d.get("code", "")}}
                return
            elif t == "output":
                if not console:
                    yield {"role": "computer", "type": "console", "start": True}
                    console = True
                yield {"role": "computer", "type": "console", "format": "output",
                       "content": ev.bytes.decode("utf-8", errors="replace")}
            elif t == "result":
                png = (d.get("data") or {}).get("image/png")
                if png:
                    yield {"role": "computer", "type": "image", "format": "base64.png",
                           "content": png}
            elif t == "run_end":
                if not console:
                    yield {"role": "computer", "type": "console", "start": True}
                yield {"role": "computer", "type": "console", "end": True}
                console = False
            elif t == "notice":
                yield {"role": "server", "type": "notice", "content": d.get("message")}
            elif t == "error":
                yield {"role": "server", "type": "error", "content": d.get("message")}
            elif t == "done":
                yield {"role": "server", "type": "status", "content": "complete",
                       "outcome": d.get("outcome")}
        if text:
            yield {"role": "assistant", "type": "message", "end": True}

    def _remote_chat(self, message, display):
        self._remote_ensure()
        sb = self._sb
        if self.messages is not self._sent_messages and self._run is None:
            self._remote_restore()
        if self._run is not None and self._pending_confirmation:
            self._pending_confirmation = False
            sb.client.request("POST", "/v1/sessions/%s/chat/confirm" % sb.id,
                              {"run": message is None})
            yield from self._absorb(self._remote_until(self._run), display)
            if message is None:
                return
        elif message is None:
            return
        self.messages.append({"role": "user", "type": "message", "content": message})
        self._sent_messages = self.messages
        body = {"message": message, "auto_run": bool(self.auto_run)}
        if self.llm.model:
            body["model"] = self.llm.model
        # within the daemon's endpoint: its api_base and key are never the client's
        for k, v in (("temperature", self.llm.temperature),
                     ("context_window", self.llm.context_window),
                     ("max_tokens", self.llm.max_tokens), ("max_output", self.max_output),
                     ("system_message", self.system_message),
                     ("custom_instructions", self.custom_instructions)):
            if v not in (None, ""):
                body[k] = v
        info = sb.client.request("POST", "/v1/sessions/%s/chat" % sb.id, body)
        from . import Run
        self._run = Run(sb, info)
        yield from self._absorb(self._remote_until(self._run), display)

    def _remote_request(self, obj):
        if obj.get("type") == "code":
            yield from self._remote_run(obj["format"], obj["content"])
            return
        self._remote_ensure()
        if obj.get("content") == "screenshot":
            yield {"role": "computer", "type": "image", "format": "base64.png",
                   "content": base64.b64encode(self._sb.screenshot()).decode()}
        elif obj.get("content") == "input":
            self._sb.input(obj["actions"])

    def _remote_run(self, language, code):
        self._remote_ensure()
        ex = self._sb.run_code(code, language=language)
        yield {"role": "computer", "type": "console", "start": True}
        text = "".join(ex.logs.stdout) + "".join(ex.logs.stderr)
        if text:
            yield {"role": "computer", "type": "console", "format": "output", "content": text}
        for r in ex.results:
            if r.png:
                yield {"role": "computer", "type": "image", "format": "base64.png",
                       "content": base64.b64encode(r.png).decode()}
        yield {"role": "computer", "type": "console", "end": True}

    def _remote_until(self, run):
        for c in self._remote_events(run):
            if c.get("role") == "server" and c.get("type") == "status":
                self._run = None
                return
            yield c

    # ---- Open Interpreter's API ----

    def chat(self, message=None, display=True, stream=False, blocking=True):
        """message: a string (or an LMC message dict, or a list of them); None continues (runs
        the code a confirmation waits for). Returns the new messages; with stream, a generator
        of chunks; with blocking=False, at once (wait() returns the new messages)."""
        if not blocking:
            self._thread_result = None

            def bg():
                self._thread_result = self.chat(message, display=False)
            self._thread = threading.Thread(target=bg, daemon=True)
            self._thread.start()
            return None
        gen = self._chat(message, display)
        if stream:
            return gen
        before = len(self.messages)
        for _ in gen:
            pass
        return self.messages[before:]

    def wait(self):
        if self._thread:
            self._thread.join()
            self._thread = None
        return self._thread_result

    def _chat(self, message, display):
        if isinstance(message, list):
            for m in message[:-1]:
                self.messages.append(dict(m))
            message = message[-1] if message else None
        if isinstance(message, dict):
            message = message.get("content")
        if self.server:
            with self._lock:
                yield from self._remote_chat(message, display)
            return
        with self._lock:
            self._ensure()
            if self._pending_confirmation:
                self._pending_confirmation = False
                self._send({"role": "user", "type": "confirmation", "content": message is None})
                if message is not None:  # declined: the turn ends, then the new message
                    for c in self._absorb(self._until_complete(), display):
                        yield c
            elif message is None:
                return
            if message is not None:
                self.messages.append({"role": "user", "type": "message", "content": message})
                self._send({"role": "user", "type": "message", "content": message})
            yield from self._absorb(self._until_complete(), display)
            self._sent_messages = self.messages

    def _request(self, obj, display):
        if self.server:
            yield from self._remote_request(obj)
            return
        with self._lock:
            self._ensure()
            self._send(obj)
            yield from self._absorb(self._until_complete(), display)
            self._sent_messages = self.messages

    def _absorb(self, chunks, display):
        """Each chunk to the caller, kept in messages; a confirmation ends the chat() call
        (chat() again runs the code, chat(TEXT) declines it). A generator left early stops the
        model and the code."""
        finished = False
        try:
            for c in chunks:
                if c.get("role") == "server":
                    if c.get("type") == "error":
                        self.messages.append({"role": "computer", "type": "console",
                                              "format": "output",
                                              "content": "airlock: " + str(c.get("content"))})
                    yield c
                    continue
                self._keep(c)
                if display:
                    _show(c)
                yield c
                if c.get("type") == "confirmation":
                    self._pending_confirmation = True
                    finished = True
                    return
            finished = True
        finally:
            if not finished:
                self._stop()
                self._sent_messages = self.messages

    def _keep(self, c):
        if c.get("start") or c.get("type") == "confirmation":
            m = {k: v for k, v in c.items() if k not in ("start", "end")}
            if c.get("start"):
                m["content"] = ""
            self.messages.append(m)
            return
        if c.get("end"):
            return
        last = self.messages[-1] if self.messages else None
        if (last and last.get("role") == c.get("role") and last.get("type") == c.get("type")
                and isinstance(last.get("content"), str) and c.get("type") != "image"):
            if c.get("format") and not last.get("format"):
                last["format"] = c["format"]
            last["content"] += c.get("content", "")
        else:
            self.messages.append(dict(c))

    def reset(self):
        """A fresh VM and an empty conversation."""
        with self._lock:
            self._close()
            if self._sb is not None and not self._attach:
                try:
                    self._sb.kill()
                except Exception:
                    pass
                self._sb = self._run = None
                self.session = None
            self.messages = []
            self._sent_messages = None

    def undo(self):
        """The last exchange undone: the VM back to its checkpoint (checkpoints=True)."""
        with self._lock:
            self._ensure()
            if self.server:
                self._sb.client.request("POST", "/v1/sessions/%s/chat/undo" % self._sb.id)
            else:
                self._send({"role": "user", "type": "command", "content": "undo"})
                list(self._until_complete())
            while self.messages and self.messages[-1].get("role") != "user":
                self.messages.pop()
            if self.messages:
                self.messages.pop()
            self._sent_messages = self.messages

    def __del__(self):
        try:
            self._close()
        except Exception:
            pass


def _plain(messages):
    """LMC messages as the chat takes them back: text content only (images named)."""
    out = []
    for m in messages:
        if m.get("type") == "confirmation":
            continue
        m = dict(m)
        if not isinstance(m.get("content"), str):
            m["content"] = json.dumps(m.get("content"))
        out.append(m)
    return out


def _show(c):
    """A chunk on this process's terminal, plainly."""
    t = c.get("type")
    if c.get("start") and t == "code":
        sys.stdout.write("\n```%s\n" % (c.get("format") or ""))
    elif c.get("end") and t == "code":
        sys.stdout.write("\n```\n")
    elif t == "image":
        sys.stdout.write("[an image, %d bytes]\n" % len(base64.b64decode(c.get("content", ""))))
    elif t == "confirmation":
        sys.stdout.write("[waiting: chat() runs it, chat(TEXT) declines it]\n")
    elif isinstance(c.get("content"), str):
        sys.stdout.write(c["content"])
    sys.stdout.flush()

"""A client for airlockd (docs/API.md), standard library only.

    from airlock import Sandbox
    with Sandbox(image="debian") as sb:
        r = sb.commands.run("echo hi")
        print(r.stdout, r.exit_code)
        ex = sb.run_code("x = 1\\nprint(x + 1)", language="python")
        sb.files.write("/tmp/a.txt", b"data")
        cp = sb.checkpoint()
        sb.rollback(cp)

Where the daemon is: the `url` argument, else $AIRLOCK_HOST, else the unix socket
/run/airlock/airlockd.sock. A URL is "unix:/path/to.sock", a path, "http://host:port" or
"https://host:port"; over TCP an API key is needed ($AIRLOCK_API_KEY or `api_key`).
"""
import base64
import codecs
import http.client
import json
import os
import posixpath
import socket
import ssl
import threading
import time
import urllib.parse

__all__ = ["Client", "Sandbox", "Run", "Event", "APIError", "CommandResult", "Execution",
           "Result", "ExecutionError", "Logs", "TimeoutException", "Pty", "PtySize",
           "Interpreter", "interpreter"]

DEFAULT_SOCKET = "/run/airlock/airlockd.sock"


class APIError(Exception):
    """An error answer: status (HTTP), code (e.g. "quota_exceeded"), limit (a quota's name)."""

    def __init__(self, status, code, message, limit=None):
        super().__init__("%s (%d %s)" % (message, status, code))
        self.status = status
        self.code = code
        self.message = message
        self.limit = limit


class TimeoutException(Exception):
    """A run that went past its timeout (it was killed); result is what it returned so far."""

    def __init__(self, message, result=None):
        super().__init__(message)
        self.result = result


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self._path)
        self.sock = s


class Client:
    """One daemon. Each request opens its own connection, so a Client is safe across threads."""

    def __init__(self, url=None, api_key=None, timeout=600, ssl_context=None):
        url = url or os.environ.get("AIRLOCK_HOST") or DEFAULT_SOCKET
        self.api_key = api_key or os.environ.get("AIRLOCK_API_KEY")
        self.timeout = timeout
        self._ssl = ssl_context
        if url.startswith("unix:"):
            url = url[5:]
        if url.startswith("/"):
            self._unix = url
        else:
            u = urllib.parse.urlsplit(url)
            if u.scheme not in ("http", "https") or not u.hostname:
                raise ValueError("airlockd URL: unix:/path, http://host:port or https://host:port")
            self._unix = None
            self._scheme, self._host, self._port = u.scheme, u.hostname, u.port

    def connection(self, timeout=None):
        t = self.timeout if timeout is None else timeout
        if self._unix:
            return _UnixConnection(self._unix, t)
        if self._scheme == "https":
            return http.client.HTTPSConnection(self._host, self._port, timeout=t,
                                               context=self._ssl or ssl.create_default_context())
        return http.client.HTTPConnection(self._host, self._port, timeout=t)

    def _headers(self, extra=None):
        h = {}
        if self.api_key:
            h["Authorization"] = "Bearer " + self.api_key
        if extra:
            h.update(extra)
        return h

    def open(self, method, path, body=None, headers=None, timeout=None):
        """Sends a request; returns (connection, response) with the body unread."""
        c = self.connection(timeout)
        h = self._headers(headers)
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            h["Content-Type"] = "application/json"
        try:
            c.request(method, path, body=body, headers=h)
        except (BrokenPipeError, ConnectionResetError):
            # Refused before the whole body went (413): the answer is there to read.
            pass
        return c, c.getresponse()

    def request(self, method, path, body=None, headers=None, timeout=None):
        """Sends a request; returns the decoded JSON answer (None when empty); raises APIError."""
        c, r = self.open(method, path, body, headers, timeout)
        try:
            data = r.read()
        finally:
            c.close()
        return _decode(r, data)

    def sessions(self):
        return self.request("GET", "/v1/sessions")["sessions"]

    def snapshots(self):
        """The caller's snapshots: {"name", "image", "memory_mib", "bytes", "created"} each."""
        return self.request("GET", "/v1/snapshots")["snapshots"]

    def create_volume(self, name, size_bytes=1 << 30):
        """A volume of the caller's: a disk that outlives sessions (Sandbox(volumes=...))."""
        return self.request("POST", "/v1/volumes", body={"name": name,
                                                         "size_bytes": int(size_bytes)})

    def volumes(self):
        """The caller's volumes: {"name", "size_bytes", "bytes", "created", "in_use", ...}."""
        return self.request("GET", "/v1/volumes")["volumes"]

    def delete_volume(self, name):
        """Removes a volume (refused while a session has it attached); False when none."""
        return self._delete("/v1/volumes/" + _q(name))

    def _delete(self, path):
        try:
            self.request("DELETE", path)
            return True
        except APIError as e:
            if e.status == 404:
                return False
            raise

    def delete_snapshot(self, name):
        """Removes a snapshot (sessions started from it go on); False when there was none."""
        return self._delete("/v1/snapshots/" + _q(name))

    def health(self):
        return self.request("GET", "/v1/health")


def _decode(r, data):
    if r.status >= 400:
        try:
            e = json.loads(data)["error"]
        except (ValueError, KeyError, TypeError):
            raise APIError(r.status, "http_error", data.decode(errors="replace")[:200])
        raise APIError(r.status, e.get("code", "?"), e.get("message", ""), e.get("limit"))
    if not data:
        return None
    return json.loads(data)


def _q(s):
    return urllib.parse.quote(s, safe="")


class Event:
    """One event of a run: id (its sequence number), type ("start", "output", "checkpoint",
    "result", "refused", "exit", "error"; a chat turn's others) and data (a dict; output's
    bytes are in .bytes)."""

    def __init__(self, id, type, data):
        self.id = id
        self.type = type
        self.data = data

    @property
    def stream(self):
        return self.data.get("stream")

    @property
    def bytes(self):
        return base64.b64decode(self.data.get("data_b64", ""))

    def __repr__(self):
        return "Event(%r, %r, %r)" % (self.id, self.type, self.data)


class Run:
    """A run in a session: its events as a stream (resumable), its stdin, signals, its end."""

    def __init__(self, sandbox, info):
        self.sandbox = sandbox
        self.id = info["id"]
        self.info = info
        self.last_event_id = 0

    @property
    def _path(self):
        return "/v1/sessions/%s/runs/%s" % (self.sandbox.id, _q(self.id))

    def events(self, last_event_id=None, timeout=None):
        """Yields Events after last_event_id (default: the last one this object yielded), until
        the run's end. A dropped connection can be resumed by calling this again."""
        last = self.last_event_id if last_event_id is None else last_event_id
        c, r = self.sandbox.client.open("GET", self._path + "/events",
                                        headers={"Last-Event-ID": str(last)}, timeout=timeout)
        try:
            if r.status != 200:
                _decode(r, r.read())
            ev_id, ev_type, data = None, "message", []
            while True:
                line = r.readline()
                if not line:
                    return
                line = line.rstrip(b"\r\n").decode()
                if not line:
                    if ev_id is not None:
                        self.last_event_id = ev_id
                        yield Event(ev_id, ev_type, json.loads("\n".join(data)))
                    ev_id, ev_type, data = None, "message", []
                    continue
                if line.startswith(":"):
                    continue
                k, _, v = line.partition(":")
                v = v[1:] if v.startswith(" ") else v
                if k == "id":
                    ev_id = int(v)
                elif k == "event":
                    ev_type = v
                elif k == "data":
                    data.append(v)
        finally:
            c.close()

    def wait(self, timeout=600):
        """The run's state once it ended (or after timeout seconds): its "result" holds the exit."""
        while True:
            step = min(timeout, 600)
            o = self.sandbox.client.request("GET", self._path + "/wait?timeout_s=%d" % step,
                                            timeout=step + 30)
            timeout -= step
            if o["state"] == "done" or timeout <= 0:
                return o

    def send_stdin(self, data, eof=False):
        if isinstance(data, str):
            data = data.encode()
        self.sandbox.client.request("POST", self._path + "/stdin" + ("?eof=1" if eof else ""),
                                    body=data,
                                    headers={"Content-Type": "application/octet-stream"})

    def signal(self, sig="INT"):
        self.sandbox.client.request("POST", self._path + "/signal", body={"signal": sig})

    def kill(self):
        """Kills the run and everything it started (its cgroup in the guest). True when it was
        running, False when it had ended already."""
        try:
            self.signal("KILL")
            return True
        except APIError as e:
            if e.status in (404, 409):  # ended (and perhaps no longer kept)
                return False
            raise

    def result(self, on_stdout=None, on_stderr=None):
        """Reads the run's events from where this object left off to the end: a CommandResult
        (a run started in the background, attached again with commands.connect, included)."""
        return self.sandbox._collect(self, on_stdout, on_stderr, CommandResult)

    @property
    def running(self):
        return self.get()["state"] != "done"

    def get(self):
        return self.sandbox.client.request("GET", self._path)


class CommandResult:
    def __init__(self, stdout, stderr, result):
        self.stdout = stdout
        self.stderr = stderr
        self.result = result or {}
        self.error = self.result if self.result.get("type") == "error" else None
        self.exit_code = self.result.get("value") if self.result.get("how") == "exited" else None
        self.signal = self.result.get("value") if self.result.get("how") == "signaled" else None

    def __repr__(self):
        return "CommandResult(exit_code=%r, stdout=%r, stderr=%r)" % (self.exit_code,
                                                                      self.stdout, self.stderr)


class Result:
    """One result of a kernel run: the value of the cell's last expression (is_main_result) or
    one display() (a figure shown by matplotlib is one). Each MIME type of the bundle is an
    attribute: text, html, markdown, svg, latex (str), png, jpeg (bytes), json (the value);
    None when absent. data is the bundle as sent (images base64)."""

    _TYPES = (("text", "text/plain"), ("html", "text/html"), ("markdown", "text/markdown"),
              ("svg", "image/svg+xml"), ("latex", "text/latex"), ("json", "application/json"))

    def __init__(self, event):
        self.kind = event.get("kind")
        self.is_main_result = self.kind == "value"
        self.execution_count = event.get("execution_count")
        self.data = event.get("data") or {}
        self.width = event.get("width")
        self.height = event.get("height")
        for attr, mime in self._TYPES:
            setattr(self, attr, self.data.get(mime))
        self.png = self._bytes("image/png")
        self.jpeg = self._bytes("image/jpeg")

    def _bytes(self, mime):
        v = self.data.get(mime)
        return base64.b64decode(v) if isinstance(v, str) else None

    def formats(self):
        """The MIME types it carries."""
        return list(self.data)

    def __repr__(self):
        return "Result(%s: %s)" % (self.kind, ", ".join(self.formats()))


class ExecutionError:
    """Why a run did not complete: the exception a cell raised (name "ZeroDivisionError", value
    its message, traceback the text), or the run's own failure (name the error code, e.g.
    "cancelled", value its message, traceback "")."""

    def __init__(self, name, value, traceback=""):
        self.name = name
        self.value = value
        self.traceback = traceback

    def __repr__(self):
        return "ExecutionError(%r, %r)" % (self.name, self.value)


class Logs:
    """stdout and stderr of a run as the chunks that came."""

    def __init__(self):
        self.stdout = []
        self.stderr = []

    def __repr__(self):
        return "Logs(stdout=%r, stderr=%r)" % (self.stdout, self.stderr)


class Execution(CommandResult):
    """What run_code returns: results (Result objects, in order), text (the main result's text),
    error (an ExecutionError, or None), logs (Logs), stdout and stderr (text), exit_code,
    execution_count, refused (why each result the host refused was refused), run_error (the run's
    error event's data, when it failed)."""

    def __init__(self, stdout, stderr, result, results=(), logs=None, refused=(), raised=None):
        super().__init__(stdout, stderr, result)
        self.run_error = self.error
        self.results = list(results)
        self.logs = logs or Logs()
        self.refused = list(refused)
        self.execution_count = self.result.get("execution_count")
        if raised is not None:
            self.error = raised
        elif self.run_error:
            self.error = ExecutionError(self.run_error.get("code", "error"),
                                        self.run_error.get("message", ""))
        else:
            self.error = None

    @property
    def text(self):
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None

    def __repr__(self):
        return "Execution(results=%r, error=%r, exit_code=%r)" % (self.results, self.error,
                                                                  self.exit_code)


class _Commands:
    def __init__(self, sb):
        self._sb = sb

    def start(self, cmd, env=None, cwd=None, stdin=None, stdin_open=False, timeout=None,
              code=None, language=None, kernel=False):
        body = {}
        if code is not None:
            body.update(code=code, language=language, kernel=kernel)
        else:
            body["argv"] = ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        if env:
            body["env"] = env
        cwd = cwd or self._sb.cwd
        if cwd:
            body["cwd"] = cwd
        if stdin is not None:
            body["stdin"] = stdin
        if stdin_open:
            body["stdin_open"] = True
        if timeout:
            body["timeout_s"] = int(timeout)
        return Run(self._sb, self._sb.client.request("POST", self._sb._path + "/runs", body=body))

    def run(self, cmd, on_stdout=None, on_stderr=None, background=False, **kw):
        """Runs cmd (a string for sh -c, or an argv list) to its end and returns a
        CommandResult; one past its timeout raises TimeoutException. With background=True it
        returns the Run at once: the command goes on beside the session's other runs (until
        its timeout, a kill or the session's end), whoever reads it; .result() reads it to its
        end, .kill() ends it and what it started, .send_stdin() (with stdin_open=True)."""
        run = self.start(cmd, **kw)
        if background:
            return run
        res = self._sb._collect(run, on_stdout, on_stderr, CommandResult)
        if res.result.get("timed_out"):
            raise TimeoutException("the command exceeded its timeout of %s s" % kw.get("timeout"),
                                   res)
        return res

    def list(self, all=False):
        """The session's runs (id, state, started, ...) that are not finished; all=True: the
        finished ones it keeps too."""
        runs = self._sb.runs()
        return runs if all else [r for r in runs if r["state"] != "done"]

    def connect(self, run_id):
        """The Run of that id, to read its output from the start (its replay buffer) or to
        signal it."""
        return Run(self._sb, self._sb.client.request(
            "GET", self._sb._path + "/runs/" + _q(run_id)))

    def kill(self, run_id):
        return self.connect(run_id).kill()


class PtySize(tuple):
    """A terminal's size: PtySize(rows, cols), or any (rows, cols) pair."""

    def __new__(cls, rows, cols):
        return tuple.__new__(cls, (int(rows), int(cols)))

    rows = property(lambda self: self[0])
    cols = property(lambda self: self[1])


class Pty(Run):
    """A run on a terminal in the guest (a shell unless a command was given). Its output, the
    terminal's bytes escape sequences and all, goes to on_data(bytes) from a thread of its own
    as it comes, and is kept in .output; send_input() types, resize() changes the size (the
    program gets SIGWINCH), close() closes the terminal (the guest hangs it up: SIGHUP to its
    programs), kill() kills them, wait() waits for the end."""

    def __init__(self, sandbox, info, on_data=None):
        super().__init__(sandbox, info)
        self.on_data = on_data
        self.output = bytearray()
        self._end = None
        self._failure = None
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self):
        try:
            for attempt in range(5):
                try:
                    for ev in self.events():
                        if ev.type == "output":
                            b = ev.bytes
                            self.output += b
                            if self.on_data:
                                self.on_data(b)
                        elif ev.type in ("exit", "error"):
                            self._end = dict(ev.data, type=ev.type)
                    if self._end is not None:
                        return
                except (OSError, http.client.HTTPException):
                    pass  # the stream broke: resume after the last event (Last-Event-ID)
            self._end = self.wait().get("result")
        except Exception as e:  # noqa: BLE001 - handed to wait()
            self._failure = e

    def send_input(self, data):
        """Types data (str or bytes) into the terminal: b"\x03" is Ctrl-C, b"\x04" Ctrl-D."""
        self.send_stdin(data)

    def resize(self, rows, cols=None):
        """The terminal's new size: resize(rows, cols) or resize(PtySize(rows, cols))."""
        if cols is None:
            rows, cols = rows
        self.sandbox.client.request("POST", self._path + "/resize",
                                    body={"rows": int(rows), "cols": int(cols)})

    def close(self):
        """Closes the terminal, as closing a terminal window does."""
        try:
            self.send_stdin(b"", eof=True)
        except APIError as e:
            if e.status not in (404, 409):
                raise

    def wait(self, timeout=None):
        """Waits for the end (timeout seconds at most: then TimeoutException) and returns a
        CommandResult: exit_code or signal, stdout the terminal's output as text."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutException("the terminal's program is still running")
        if self._failure:
            raise self._failure
        return CommandResult(self.output.decode("utf-8", "replace"), "", self._end)


class _Pty:
    def __init__(self, sb):
        self._sb = sb

    def create(self, size=(24, 80), on_data=None, cmd=None, cwd=None, env=None, timeout=None):
        """Opens a terminal of size (rows, cols) running cmd (a string for sh -c, or an argv
        list), by default the login shell (bash -l, else sh -l, in /workspace if there is one).
        Returns a Pty; on_data(bytes) gets its output as it comes."""
        rows, cols = size
        body = {"pty": {"rows": int(rows), "cols": int(cols)}}
        if cmd is not None:
            body["argv"] = ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        if env:
            body["env"] = env
        if cwd or (cmd is not None and self._sb.cwd):  # the shell's own: /workspace, else ~
            body["cwd"] = cwd or self._sb.cwd
        if timeout:
            body["timeout_s"] = int(timeout)
        info = self._sb.client.request("POST", self._sb._path + "/runs", body=body)
        return Pty(self._sb, info, on_data)

    def connect(self, run_id, on_data=None):
        """The Pty of that id (its output again from the start, as far as the daemon holds it)."""
        return Pty(self._sb, self._sb.client.request(
            "GET", self._sb._path + "/runs/" + _q(run_id)), on_data)

    # E2B's shapes: by id
    def send_input(self, run_id, data):
        Run(self._sb, {"id": run_id}).send_stdin(data)

    def resize(self, run_id, size):
        rows, cols = size
        self._sb.client.request("POST", self._sb._path + "/runs/%s/resize" % _q(run_id),
                                body={"rows": int(rows), "cols": int(cols)})

    def kill(self, run_id):
        return Run(self._sb, {"id": run_id}).kill()


class _Files:
    def __init__(self, sb):
        self._sb = sb

    def write(self, path, data):
        """Writes bytes, text or a binary file object to path in the guest (relative: to the
        sandbox's cwd), making the directories it lacks."""
        if isinstance(data, str):
            data = data.encode()
        path = self._sb._abs(path)

        def put():
            return self._sb.client.request(
                "PUT", self._sb._path + "/files?path=" + _q(path), body=data,
                headers={"Content-Type": "application/octet-stream"})
        try:
            return put()
        except APIError as e:
            parent = posixpath.dirname(path)
            if e.status != 404 or parent in ("", "/") or hasattr(data, "read"):
                raise
            self.make_dir(parent, parents=True)
            return put()

    def read(self, path, to=None):
        """The file's bytes; with `to` (a binary file object) streamed into it instead."""
        c, r = self._sb.client.open("GET", self._sb._path + "/files?path=" + _q(self._sb._abs(path)))
        try:
            if r.status != 200:
                _decode(r, r.read())
            if to is None:
                return r.read()
            while True:
                b = r.read(1 << 16)
                if not b:
                    return None
                to.write(b)
        finally:
            c.close()

    def stat(self, path):
        """{"name", "type" (file, dir, symlink, other), "size", "mode", "mtime"}; a name that is
        not UTF-8 has U+FFFD for each bad byte and its exact bytes base64 in "name_b64"."""
        return self._sb.client.request("GET", self._sb._path + "/files/stat?path=" +
                                       _q(self._sb._abs(path)))

    def exists(self, path):
        try:
            self.stat(path)
            return True
        except APIError as e:
            if e.status == 404:
                return False
            raise

    def list(self, path):
        """The directory's entries, as stat() describes them."""
        return self._sb.client.request(
            "GET", self._sb._path + "/files/list?path=" + _q(self._sb._abs(path)))["entries"]

    def remove(self, path, recursive=False):
        self._sb.client.request("DELETE", self._sb._path + "/files?path=" + _q(self._sb._abs(path)) +
                                ("&recursive=1" if recursive else ""))

    def make_dir(self, path, parents=False):
        self._sb.client.request("POST", self._sb._path + "/files/mkdir?path=" +
                                _q(self._sb._abs(path)) +
                                ("&parents=1" if parents else ""))


class Sandbox:
    """A session in airlockd. Sandbox(...) or Sandbox.create(...) starts one;
    Sandbox.connect(id) comes back to one; Sandbox.list() lists the caller's."""

    def __init__(self, image=None, memory_mib=None, vcpus=None, transport=None,
                 checkpoint_policy=None, checkpoints=None, idle_timeout_s=None, lifetime_s=None,
                 labels=None, net=None, display=None, name=None, auto_pause_s=None,
                 snapshot=None, volumes=None, client=None, url=None, api_key=None, cwd="/",
                 _info=None):
        """net: None (no network, the default), a list of hosts and "*.suffix" patterns the
        session's proxy lets through, or a dict {"allow": [...], "bytes_max": N}. cwd: where
        commands run and what relative file paths are relative to. display: a screen and input
        devices the host drives (screenshot(), left_click(), type(), press(), ...): True for
        1280x800, or (width, height); the desktop image's sessions have one anyway. name: the
        session's name, unique per key (Sandbox.connect takes it as the id); auto_pause_s:
        paused to disk after that long idle instead of ending (pause(), resume()). snapshot: start
        from a snapshot of the caller's (create_snapshot()) instead of an image: its memory,
        processes and files as they were saved. volumes: {"/path": "name"} or a list of
        {"name", "path", "read_only"}: volumes of the caller's (Client.create_volume) mounted
        in the guest."""
        self.client = client or Client(url, api_key)
        self.cwd = cwd
        if isinstance(net, (list, tuple)):
            net = {"allow": list(net)}
        size = {}
        if isinstance(display, (list, tuple)):
            size = {"display_width": int(display[0]), "display_height": int(display[1])}
            display = True
        if _info is None:
            body = {k: v for k, v in dict(
                image=image, memory_mib=memory_mib, vcpus=vcpus, transport=transport,
                checkpoint_policy=checkpoint_policy, checkpoints=checkpoints,
                idle_timeout_s=idle_timeout_s, lifetime_s=lifetime_s,
                labels=labels, net=net, display=display, name=name,
                auto_pause_s=auto_pause_s, snapshot=snapshot).items() if v is not None}
            if isinstance(volumes, dict):
                volumes = [{"name": n, "path": p} for p, n in volumes.items()]
            if volumes:
                body["volumes"] = list(volumes)
            body.update(size)
            _info = self.client.request("POST", "/v1/sessions", body=body)
        self.info = _info
        self.id = _info["id"]
        self.commands = _Commands(self)
        self.files = _Files(self)
        self.pty = _Pty(self)

    @classmethod
    def create(cls, image=None, timeout=None, **kw):
        """As Sandbox(...); timeout: the session's lifetime in seconds (lifetime_s)."""
        if timeout is not None:
            kw.setdefault("lifetime_s", int(timeout))
        return cls(image=image, **kw)

    @classmethod
    def connect(cls, id, client=None, url=None, api_key=None, cwd="/"):
        client = client or Client(url, api_key)
        return cls(client=client, cwd=cwd,
                   _info=client.request("GET", "/v1/sessions/" + _q(id)))

    @classmethod
    def list(cls, client=None, url=None, api_key=None):
        """The caller's sessions (those of its API key or uid, whichever front started them),
        as the API describes them (id, image, state, created, expires, ...)."""
        return (client or Client(url, api_key)).sessions()

    @property
    def _path(self):
        return "/v1/sessions/" + _q(self.id)

    def _abs(self, path):
        return path if path.startswith("/") else posixpath.join(self.cwd or "/", path)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()

    def refresh(self):
        self.info = self.client.request("GET", self._path)
        return self.info

    def kill(self):
        """Ends the session (the VM is destroyed). Ending one already gone is not an error."""
        try:
            self.client.request("DELETE", self._path)
        except APIError as e:
            if e.status != 404:
                raise

    def extend(self, seconds):
        """The session now ends seconds from now (within the daemon's max_lifetime_s)."""
        self.info = self.client.request("POST", self._path + "/extend",
                                        body={"seconds": int(seconds)})
        return self.info

    set_timeout = extend

    def metrics(self, start=None, end=None):
        """What the VM used, from the host's counters (never the guest's word): a list of
        {"timestamp" (unix ms), "cpu_used_pct", "cpu_count", "mem_used", "mem_total",
        "disk_used", "disk_total"}, oldest first; a sample is taken when asked (one a second at
        most). start, end: unix seconds bounding what is returned."""
        q = "&".join("%s=%d" % (k, int(v)) for k, v in (("from", start), ("to", end))
                     if v is not None)
        return self.client.request("GET", self._path + "/metrics" + ("?" + q if q else ""))[
            "metrics"]

    def create_snapshot(self, name=None, replace=False):
        """Saves the session's whole state (memory, processes, files) as a snapshot of the
        caller's, which outlives the session: Sandbox(snapshot=name) starts from it. Returns
        {"name", "image", "memory_mib", "bytes", "created"}."""
        body = {"replace": bool(replace)}
        if name is not None:
            body["name"] = name
        return self.client.request("POST", self._path + "/snapshots", body=body)

    def fork(self, n=1, name=None, labels=None, lifetime_s=None, idle_timeout_s=None,
             reseed=True):
        """n new sessions with this one's whole state: memory, running kernels (variables,
        imports), background processes, open ports and disk, as they are now; this one stands
        still for the save only and goes on. Each fork is made unique (entropy, hostname,
        machine-id, the python kernel's generators reseeded; reseed=False leaves each as the
        source was, for harnesses that need identical streams). Returns a list with a Sandbox
        for each fork, or, where one failed alone (a quota), the APIError saying why."""
        body = {k: v for k, v in dict(count=int(n), name=name, labels=labels, reseed=reseed,
                                      lifetime_s=lifetime_s,
                                      idle_timeout_s=idle_timeout_s).items() if v is not None}
        forks = self.client.request("POST", self._path + "/fork", body=body)["forks"]
        out = []
        for f in forks:
            e = f.get("error")
            if e:
                out.append(APIError(e.get("status", 500), e.get("code", ""), e.get("message", ""),
                                    e.get("limit")))
            else:
                out.append(Sandbox(client=self.client, cwd=self.cwd, _info=f))
        return out

    def pause(self):
        """Pauses the session to disk: its memory, devices and running processes saved, its
        VM's memory freed. Runs in flight are suspended, and go on after resume()."""
        self.info = self.client.request("POST", self._path + "/pause")
        return self.info

    def resume(self):
        """Brings a paused session back as it was (files, kernels' variables, processes)."""
        self.info = self.client.request("POST", self._path + "/resume")
        return self.info

    def save_image(self, name, checkpoint=None, replace=False):
        """Saves the session's disk (as it is now, or as checkpoint left it) as an image of the
        caller's own: Sandbox(image=name) then starts from it. The session's SSH keys and
        machine-id are not in it. Returns {"image": name, ...}."""
        body = {"name": name}
        if checkpoint is not None:
            body["checkpoint"] = str(checkpoint)
        if replace:
            body["replace"] = True
        return self.client.request("POST", self._path + "/image", body=body)

    def is_paused(self):
        return bool(self.refresh().get("paused"))

    def is_running(self):
        """Whether the session is still there and its VM up (not ended, not lost)."""
        try:
            return not self.refresh().get("lost")
        except APIError as e:
            if e.status == 404:
                return False
            raise

    def _events(self, run, on_stdout, on_stderr, on_event=None):
        """Reads the run to its end: (stdout, stderr, the end event's data, the Logs)."""
        out, err = [], []
        result = None
        logs = Logs()
        # bytes of a stream decoded across chunks (a character may span two)
        dec = {s: codecs.getincrementaldecoder("utf-8")("replace") for s in ("stdout", "stderr")}
        for ev in run.events():
            if ev.type == "output":
                stream = "stderr" if ev.stream == "stderr" else "stdout"
                text = dec[stream].decode(ev.bytes)
                (err if stream == "stderr" else out).append(text)
                getattr(logs, stream).append(text)
                cb = on_stdout if stream == "stdout" else on_stderr
                if cb and text:
                    cb(text)
            elif ev.type in ("exit", "error"):
                result = dict(ev.data, type=ev.type)
            elif on_event:
                on_event(ev)
        for stream, parts in (("stdout", out), ("stderr", err)):
            tail = dec[stream].decode(b"", final=True)
            if tail:
                parts.append(tail)
        if result is None:
            result = run.wait().get("result")
        return "".join(out), "".join(err), result, logs

    def _collect(self, run, on_stdout, on_stderr, kind):
        out, err, result, _ = self._events(run, on_stdout, on_stderr)
        return kind(out, err, result)

    def run_code(self, code, language="python", on_stdout=None, on_stderr=None, on_result=None,
                 on_error=None, timeout=None, kernel=None):
        """Runs code in language; in the session's kernel for it (state kept between calls)
        when the image has one, unless kernel=False. Returns an Execution; on_result gets each
        Result as it comes, on_error the ExecutionError of an exception the code raised."""
        if kernel is None:
            kernel = ("kernel:" + language) in self.info.get("languages", "").split()
        run = self.commands.start(None, code=code, language=language, kernel=kernel,
                                  timeout=timeout)
        results, refused, raised = [], [], []

        def on_event(ev):
            if ev.type == "refused":
                refused.append(ev.data.get("why", ""))
            elif ev.type == "result" and ev.data.get("kind") == "error":
                e = ExecutionError(ev.data.get("name", ""), ev.data.get("value", ""),
                                   ev.data.get("traceback", ""))
                raised.append(e)
                if on_error:
                    on_error(e)
            elif ev.type == "result":
                r = Result(ev.data)
                results.append(r)
                if on_result:
                    on_result(r)

        out, err, result, logs = self._events(run, on_stdout, on_stderr, on_event)
        ex = Execution(out, err, result, results, logs, refused, raised[-1] if raised else None)
        if ex.result.get("timed_out"):
            raise TimeoutException("the code exceeded its timeout of %s s" % timeout, ex)
        return ex

    def runs(self):
        return self.client.request("GET", self._path + "/runs")["runs"]

    def get_host(self, port):
        """E2B's get_host: the host[:port] that reaches what the session serves on `port` (an
        origin of its own, PORT-ID.localhost, at /; send the client's key as Bearer, or open
        sb.port_url(port) signed in)."""
        c = self.client
        if c._unix:
            raise ValueError(
                "get_host needs the daemon's TCP address: connect with "
                "Sandbox(url='http://127.0.0.1:8470', api_key=KEY) (airlockd's 'listen' in "
                "/etc/airlock/airlockd.conf; a key from 'airlockd key add NAME'); over the "
                "socket use sb.request_port(port, path) or sb.port_url(port)")
        return "%d-%s.localhost:%d" % (int(port), self.id, c._port or
                                       (443 if c._scheme == "https" else 80))

    def wait_for_port(self, port, timeout=30.0, interval=0.2):
        """Waits until something in the session takes connections on `port` (a server started
        with background=True needs a moment before it listens); raises TimeoutError after
        `timeout` seconds. Asks through the daemon's proxy: any answer but its "nothing answers"
        means the port is open."""
        end = time.monotonic() + timeout
        while True:
            try:
                st, _, body = self.request_port(port, "/", timeout=timeout)
            except (OSError, http.client.HTTPException):
                st, body = 0, b""
            if st and not (st == 502 and b"nothing answers" in body):
                return
            if time.monotonic() >= end:
                raise TimeoutError("nothing listens on port %d in %s after %g s"
                                   % (int(port), self.id, timeout))
            time.sleep(interval)

    def port_url(self, port, path="/"):
        """The daemon's proxy address of `port` in the session: its path, for this client."""
        return "/v1/sessions/%s/ports/%d/%s" % (_q(self.id), int(port), path.lstrip("/"))

    def request_port(self, port, path="/", method="GET", body=None, headers=None, timeout=None):
        """An HTTP request to what the session serves on `port` through the daemon's proxy:
        (status, headers, body bytes)."""
        c, r = self.client.open(method, self.port_url(port, path), body, headers, timeout)
        try:
            return r.status, dict(r.getheaders()), r.read()
        finally:
            c.close()

    def net_requests(self, cursor=0, limit=None):
        """The requests the session's proxy saw from cursor on (time_ms, method, host, port,
        status, bytes, allowed, why), and the cursor for the next call: (requests, cursor)."""
        path = self._path + "/net?cursor=%d" % int(cursor)
        if limit is not None:
            path += "&limit=%d" % int(limit)
        page = self.client.request("GET", path)
        return page["requests"], page["next_cursor"]

    # ---- the screen and input (a session with display=True), shaped like E2B Desktop's ----

    def screenshot(self, max_edge=None, region=None):
        """The screen now as PNG bytes, taken by the host; max_edge scales it down so that its
        longer side is at most that; region=(x, y, w, h) crops it first (zoom). The mode's size
        is in self.screen_size afterwards."""
        q = {}
        if max_edge:
            q["max_edge"] = int(max_edge)
        if region:
            q.update(zip(("x", "y", "w", "h"), (int(v) for v in region)))
        path = self._path + "/screen" + ("?" + urllib.parse.urlencode(q) if q else "")
        c, r = self.client.open("GET", path)
        try:
            data = r.read()
        finally:
            c.close()
        if r.status >= 400:
            _decode(r, data)
        self.screen_size = (int(r.getheader("X-Screen-Width")),
                            int(r.getheader("X-Screen-Height")))
        return data

    def input(self, actions, size=None):
        """Runs input actions in order (docs/API.md: {"action": "left_click", "coordinate":
        [x, y]}, ...); size=(w, h): the image the coordinates are pixels of (a scaled
        screenshot), else the screen. Returns {"done": N, "cursor": [x, y]}."""
        body = {"actions": list(actions)}
        if size:
            body["width"], body["height"] = int(size[0]), int(size[1])
        return self.client.request("POST", self._path + "/input", body=body)

    def _click(self, action, x, y, hold=None):
        a = {"action": action}
        if x is not None:
            a["coordinate"] = [x, y]
        if hold:
            a["text"] = hold
        return self.input([a])

    def move_mouse(self, x, y):
        return self.input([{"action": "mouse_move", "coordinate": [x, y]}])

    def left_click(self, x=None, y=None, hold=None):
        return self._click("left_click", x, y, hold)

    def right_click(self, x=None, y=None, hold=None):
        return self._click("right_click", x, y, hold)

    def middle_click(self, x=None, y=None, hold=None):
        return self._click("middle_click", x, y, hold)

    def double_click(self, x=None, y=None, hold=None):
        return self._click("double_click", x, y, hold)

    def drag(self, start, end):
        return self.input([{"action": "left_click_drag", "start_coordinate": list(start),
                            "coordinate": list(end)}])

    def scroll(self, direction="down", amount=1, x=None, y=None):
        a = {"action": "scroll", "scroll_direction": direction, "scroll_amount": amount}
        if x is not None:
            a["coordinate"] = [x, y]
        return self.input([a])

    def write(self, text):
        """Types text (newline is Return): ASCII as keys, other characters through the guest's
        xdotool (the desktop image has it)."""
        return self.input([{"action": "type", "text": text}])

    type = write

    def press(self, keys):
        """Presses keys: "Return", "ctrl+c", or a list of names pressed together."""
        if isinstance(keys, (list, tuple)):
            keys = "+".join(keys)
        return self.input([{"action": "key", "text": keys}])

    def cursor_position(self):
        return tuple(self.input([{"action": "cursor_position"}])["cursor"])

    def checkpoint(self, name=None):
        """Takes a checkpoint (needs checkpoints=True or a checkpoint_policy); returns its id."""
        body = {"name": name} if name else {}
        return self.client.request("POST", self._path + "/checkpoints", body=body)["id"]

    def checkpoints(self):
        return self.client.request("GET", self._path + "/checkpoints")["checkpoints"]

    def rollback(self, checkpoint):
        return self.client.request(
            "POST", self._path + "/checkpoints/%s/rollback" % _q(str(checkpoint)))

    def delete_checkpoint(self, checkpoint):
        self.client.request("DELETE", self._path + "/checkpoints/%s" % _q(str(checkpoint)))


# Open Interpreter's Python API (_oi.py): `from airlock import interpreter`, a default instance
# (its VM starts at its first chat), or airlock.Interpreter() for more.
from ._oi import LLM, Interpreter  # noqa: E402

interpreter = Interpreter()

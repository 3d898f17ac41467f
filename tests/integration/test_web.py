"""airlockd's web page (daemon/web) in a real browser: headless Chromium driven by Selenium,
against a real airlockd (TCP, API keys), real guests and the fake model server (tests/fakemodel).

One daemon, one debian guest for everything (guest boots are the cost): sign in (a wrong key
refused first), start a session from the page, chat a task whose code prints and plots (the
text and an <img> with a natural size appear), a shell command through the %% box, a chat turn
that deletes a file and Undo (the file back, checked through the API), upload then download
byte-identical, hostile output and model text (nothing runs, a window marker stays unset, the
page still answers), Stop on a `sleep 100`. Screenshots go to $AIRLOCK_WEB_SHOTS (default:
build dir's web-screenshots). Environment: AIRLOCKD_BIN and the usual integration variables.
"""
import base64
import json
import os
import re
import http.client
import io
import shutil
import socket
import tarfile
import sys
import tempfile
import threading
import time
import unittest

import altest
from test_airlockd import Daemon
from airlock import APIError, Sandbox
from test_screen import BTN_LEFT, EV_ABS, EV_KEY, event_count, events_since, start_reader, typed

try:
    from selenium import webdriver
except ImportError:  # Debian's python3-selenium lives beside the system python
    if sys.executable != "/usr/bin/python3" and os.path.exists("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    raise
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

SHOTS = os.environ.get("AIRLOCK_WEB_SHOTS") or os.path.join(
    os.path.dirname(os.environ.get("AIRLOCKD_BIN", ".")), "..", "web-screenshots")
BOOT_S = 300

# A port on the host where guest HTML would make the browser connect (resource hints, images,
# links): nothing may arrive there.
BAIT = socket.socket()
BAIT.bind(("127.0.0.1", 0))
BAIT.listen(16)
BAIT_PORT = BAIT.getsockname()[1]

PLOT = """import matplotlib.pyplot as plt
print("hello from the guest", 6 * 7)
plt.plot([0, 1, 2, 3], [0, 1, 4, 9])
plt.savefig("/workspace/plot.png")
plt.close()
open("/workspace/report.html", "w").write(
    "<p id=r>report</p><script>parent.__pwned = 9; document.body.append('ran')</script>")
"""
# IPython's own figure (plt.show() on the kernel's inline backend) and an HTML result, each a
# result event.
SHOW = """import matplotlib.pyplot as plt
from IPython.display import HTML, display
plt.figure(figsize=(5, 3), dpi=100)
plt.plot([0, 1, 2], [2, 0, 1])
plt.show()
display(HTML("<table id=t><tr><td>cell-ok</td></tr></table>"
             "<script>document.body.append('RAN-SCRIPT'); top.__pwned = 10</script>"
             "<img src=x onerror=\\"document.body.append('RAN-ONERROR'); top.__pwned = 11\\">"
             "<link rel=preconnect href='http://127.0.0.1:%(p)d'>"
             "<link rel=dns-prefetch href='http://127.0.0.1:%(p)d'>"
             "<link rel=prefetch href='http://127.0.0.1:%(p)d/prefetch'>"
             "<img src='http://127.0.0.1:%(p)d/img'>"
             "<div style='background: url(http://127.0.0.1:%(p)d/bg)'>styled</div>"
             "<a href='http://127.0.0.1:%(p)d/a'>link</a>"))
""" % {"p": BAIT_PORT}
HOSTILE_TEXT = ('**Done.**\n\nHere: <img src=x onerror="window.__pwned=1"> and '
                '</script><script>window.__pwned=2</script> done')
HOSTILE_SH = ("printf '<img src=x onerror=\"window.__pwned=3\">\\n</script>"
              "<script>window.__pwned=4</script>\\n\\033[31mRED\\033[0m\\n'; "
              "python3 -c 'print(\"A\" * 10000000)'; echo after-the-long-line")


def call(name, args):
    return {"tool_calls": [{"id": "c_" + name, "name": "execute", "arguments": args}]}


REPLIES = [
    call("plot", {"language": "python", "code": PLOT}),
    call("show", {"language": "python", "code": SHOW}),
    {"text": HOSTILE_TEXT},
    call("rm", {"language": "bash", "code": "rm /workspace/keep.txt"}),
    {"text": "deleted it"},
    call("ask", {"language": "bash", "code": "echo original"}),
    {"text": "ran what you chose"},
    call("sleep", {"language": "bash", "code": "sleep 100"}),
    {"text": "stopped"},
    {"text": "spare"},
]


class Forward:
    """A TCP port on 127.0.0.1 relaying to a unix socket (as ssh -L would) or a TCP port;
    cut() drops every connection open through it (a network that fails)."""

    def __init__(self, unix=None, port=None):
        self.unix, self.to = unix, port
        self.conns = []
        self.lock = threading.Lock()
        self.ls = socket.socket()
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(64)
        self.port = self.ls.getsockname()[1]
        threading.Thread(target=self.serve, daemon=True).start()

    def pipe(self, a, b):
        try:
            while True:
                d = a.recv(65536)
                if not d:
                    break
                b.sendall(d)
        except OSError:
            pass
        finally:
            for x in (a, b):
                try:
                    x.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def serve(self):
        while True:
            try:
                c, _ = self.ls.accept()
            except OSError:
                return
            if self.unix:
                u = socket.socket(socket.AF_UNIX)
                u.connect(self.unix)
            else:
                u = socket.create_connection(("127.0.0.1", self.to))
            with self.lock:
                self.conns += [c, u]
            threading.Thread(target=self.pipe, args=(c, u), daemon=True).start()
            threading.Thread(target=self.pipe, args=(u, c), daemon=True).start()

    def cut(self):
        with self.lock:
            conns, self.conns = self.conns, []
        for x in conns:
            try:
                x.shutdown(socket.SHUT_RDWR)
                x.close()
            except OSError:
                pass

    def close(self):
        self.ls.close()
        self.cut()


class WebTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        os.makedirs(SHOTS, exist_ok=True)
        cls.tmp = tempfile.mkdtemp(prefix="airlock-web-")
        cls.fm, port = altest.start_fake_model(REPLIES, cls.tmp)
        base = "http://127.0.0.1:%d/v1" % port
        os.environ["WEB_TEST_MODEL_KEY"] = "sk-web-test"
        # The daemon's home: it must write nothing there (figures reach the page as events).
        cls.home = os.path.join(cls.tmp, "home")
        os.makedirs(cls.home)
        cls.d = Daemon(model_api="openai", model_api_base=base, model="fake",
                       model_api_key_env="WEB_TEST_MODEL_KEY", max_upload_bytes=16 << 20,
                       run_buffer_bytes=1048576, connection_timeout_s=30,
                       env={"HOME": cls.home,
                            "XDG_DATA_HOME": os.path.join(cls.home, ".local", "share"),
                            "XDG_STATE_HOME": os.path.join(cls.home, ".local", "state"),
                            "XDG_CACHE_HOME": os.path.join(cls.home, ".cache")})
        cls.key = cls.d.key("web")
        # the browser reaches the daemon through a forward the test can cut
        cls.fwd = Forward(port=cls.d.port)
        cls.url = "http://127.0.0.1:%d/" % cls.fwd.port
        o = webdriver.ChromeOptions()
        for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                  "--window-size=1400,900", "--disable-gpu"):
            o.add_argument(a)
        o.binary_location = "/usr/bin/chromium"
        cls.b = webdriver.Chrome(options=o,
                                 service=Service("/usr/bin/chromedriver"))
        cls.b.set_script_timeout(60)

    @classmethod
    def tearDownClass(cls):
        try:
            cls.b.quit()
            cls.fwd.close()
        finally:
            cls.d.stop()
            cls.fm.kill()
            cls.fm.wait()
            shutil.rmtree(cls.tmp, True)

    # ---- helpers ----

    def wait(self, fn, timeout=60, what="condition"):
        return WebDriverWait(self.b, timeout, poll_frequency=0.2).until(
            lambda b: fn(), message=what)

    def q(self, css):
        return self.b.find_element(By.CSS_SELECTOR, css)

    def qs(self, css):
        return self.b.find_elements(By.CSS_SELECTOR, css)

    def shot(self, name):
        self.b.save_screenshot(os.path.join(SHOTS, name + ".png"))

    def last_turn(self):
        return self.qs("#transcript .turn")[-1]

    def chat(self, text):
        n = len(self.qs("#transcript .turn"))
        box = self.q("#chat-input")
        box.clear()
        box.send_keys(text)
        self.q("#send").click()
        self.wait(lambda: len(self.qs("#transcript .turn")) > n, 10, "the turn shows")
        return self.last_turn()

    def wait_done(self, turn, timeout=BOOT_S):
        self.wait(lambda: turn.get_attribute("data-done"), timeout, "the run ends")
        return turn.get_attribute("data-done")

    def sandbox(self, sid):
        return Sandbox.connect(sid, url="http://127.0.0.1:%d" % self.d.port, api_key=self.key)

    def session_id(self):
        return self.q("#sessions li.current").get_attribute("data-id")

    def assert_alive(self):
        self.assertEqual(self.b.execute_script("return 1 + 1"), 2)
        self.assertIsNone(self.b.execute_script("return window.__pwned"))

    # ---- the story, in order: one guest ----

    def test_page(self):
        b = self.b
        b.get(self.url)
        self.wait(lambda: self.q("#login").is_displayed(), 10, "the sign-in form")
        self.shot("01-sign-in")
        # a new user learns where a key comes from on the sign-in page itself
        self.assertIn("airlockd key add", self.q("#login-help").text)
        # a wrong key is refused
        self.q("#api-key").send_keys("alk_nope_0123456789")
        self.q("#login-btn").click()
        self.wait(lambda: "refused" in self.q("#login-error").text, 10, "refusal")
        self.assertFalse(self.q("#app").is_displayed())
        # the right one; the cookie is HttpOnly (the page's script cannot read it)
        self.q("#api-key").clear()
        self.q("#api-key").send_keys(self.key)
        self.q("#login-btn").click()
        self.wait(lambda: self.q("#app").is_displayed(), 10, "signed in")
        self.wait(lambda: self.q("#logout").is_displayed(), 10, "Sign out, once signed in")
        self.assertFalse(self.q("#model-notice").is_displayed())  # this daemon has a model
        # the image field's placeholder shows whole
        room, text = b.execute_script(
            "const i = document.getElementById('new-image'), cs = getComputedStyle(i);"
            "const c = document.createElement('canvas').getContext('2d'); c.font = cs.font;"
            "return [i.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight),"
            "        c.measureText(i.placeholder).width];")
        self.assertGreaterEqual(room, text)
        self.assertNotIn("airlock_token", b.execute_script("return document.cookie"))
        self.assertTrue(any(c["name"] == "airlock_token" and c["httpOnly"]
                            and c.get("sameSite") == "Strict" for c in b.get_cookies()))

        # start a session (debian: python, matplotlib)
        self.q("#new-image").send_keys("debian")
        self.q("#start-session").click()
        self.wait(lambda: self.qs("#sessions li.current"), BOOT_S, "a session starts")
        sid = self.session_id()
        # ending a session is not the chat's Stop (which stops a run)
        self.assertEqual(self.q("#sessions li.current .stop-session").text, "End")
        sb = self.sandbox(sid)

        # chat: code that prints and plots; model text that is hostile
        t0 = time.time()
        turn = self.chat("print something and plot y = x^2")
        self.assertEqual(self.wait_done(turn), "done")
        self.wait(lambda: "hello from the guest 42" in turn.text, 10, "the run's output")
        # code, its output and the model's words each look their own
        looks = b.execute_script(
            "const f = (s) => { const e = arguments[0].querySelector(s); if (!e) return null;"
            "  const c = getComputedStyle(e); return c.backgroundColor + ' ' + c.borderLeftColor; };"
            "return [f('pre.code'), f('pre.out'), f('.msg.model')]", turn)
        self.assertTrue(all(looks), looks)
        self.assertEqual(len(set(looks)), 3, looks)
        label = b.execute_script("return getComputedStyle(arguments[0].querySelector('pre.code'),"
                                 " '::before').content", turn)
        self.assertIn("code", label)
        self.wait(lambda: turn.find_elements(By.CSS_SELECTOR, ".result[data-kind=file] img"), 30,
                  "the figure")
        img = turn.find_element(By.CSS_SELECTOR, ".result[data-kind=file] img")
        self.wait(lambda: b.execute_script("return arguments[0].naturalWidth", img) > 0, 10,
                  "the figure loads")
        # the HTML result: in a sandboxed frame (no scripts, not the page's origin)
        frame = self.wait(lambda: turn.find_elements(
            By.CSS_SELECTOR, ".result[data-kind=file] iframe"), 30, "the HTML file")[0]
        self.assertEqual(frame.get_attribute("sandbox"), "")
        b.switch_to.frame(frame)
        self.wait(lambda: "report" in b.find_element(By.TAG_NAME, "body").text, 10, "its text")
        self.assertNotIn("ran", b.find_element(By.TAG_NAME, "body").text)
        b.switch_to.default_content()
        # plt.show(): an <img> from the result event (a blob, not a file) of the figure's size
        shown = self.wait(lambda: turn.find_elements(
            By.CSS_SELECTOR, ".result[data-kind=display] img"), 30, "the shown figure")[0]
        self.wait(lambda: b.execute_script("return arguments[0].naturalWidth", shown) > 0, 10,
                  "the shown figure loads")
        self.assertEqual(b.execute_script(
            "return [arguments[0].naturalWidth, arguments[0].naturalHeight]", shown), [500, 300])
        self.assertTrue(shown.get_attribute("src").startswith("blob:"))
        # its HTML result: the table shows; no script or handler ran, nothing connected out
        frames = self.wait(lambda: [f for f in turn.find_elements(
            By.CSS_SELECTOR, ".result[data-kind=display] iframe")], 30, "the HTML result")
        self.assertEqual(frames[0].get_attribute("sandbox"), "")
        b.switch_to.frame(frames[0])
        self.wait(lambda: "cell-ok" in b.find_element(By.TAG_NAME, "body").text, 10, "the table")
        time.sleep(2)  # time for a handler or a resource hint to act
        body = b.find_element(By.TAG_NAME, "body").text
        b.switch_to.default_content()
        self.assertNotIn("RAN-SCRIPT", body)
        self.assertNotIn("RAN-ONERROR", body)
        BAIT.settimeout(0.5)
        with self.assertRaises(socket.timeout, msg="guest HTML made the browser connect"):
            BAIT.accept()[0].close()
        # model text as Markdown, built from text: the hostile tags are text, not elements
        self.assertEqual([e.text for e in turn.find_elements(By.CSS_SELECTOR, ".msg.model strong")],
                         ["Done."])
        self.assertIn('<img src=x onerror="window.__pwned=1">', turn.text)  # shown as text
        self.assertIn("</script><script>window.__pwned=2</script>", turn.text)
        self.assertEqual(turn.find_elements(By.CSS_SELECTOR, ".msg.model img, .msg.model script"),
                         [])
        self.assert_alive()
        # nothing under the daemon's home: no figure file, nothing else
        left = [os.path.join(r, f) for r, _, fs in os.walk(self.home) for f in fs]
        self.assertEqual(left, [])
        print("chat turn with a plot: %.1f s" % (time.time() - t0), file=sys.stderr)
        self.shot("02-chat-figure")

        # the %% box: make the file the next turn deletes
        n = len(self.qs("#transcript .turn"))
        self.q("#shell-input").send_keys("echo precious > /workspace/keep.txt && echo made")
        self.q("#shell-run").click()
        self.wait(lambda: len(self.qs("#transcript .turn")) > n, 10, "the command shows")
        turn = self.last_turn()
        self.assertEqual(self.wait_done(turn, 60), "exit")
        self.assertIn("made", turn.text)
        self.assertEqual(sb.files.read("/workspace/keep.txt"), b"precious\n")

        # a turn deletes it; Undo brings it back
        turn = self.chat("delete keep.txt")
        self.assertEqual(self.wait_done(turn, 120), "done")
        self.assertFalse(sb.files.exists("/workspace/keep.txt"))
        self.wait(lambda: self.qs("#timeline li"), 10, "the timeline shows checkpoints")
        self.shot("03-timeline")
        self.q("#undo").click()
        self.wait(lambda: any("undone" in e.text for e in self.qs(".msg.notice")), 120, "undone")
        self.assertIn("rolled back", self.qs(".msg.notice")[-1].text)
        self.assertEqual(sb.files.read("/workspace/keep.txt"), b"precious\n")

        # upload (the file input the drop zone shares), then download from the page's link;
        # a file with a long name beside it
        long_name = "a-very-long-file-name-" * 10 + ".csv"
        sb.files.write("/workspace/" + long_name, "x\n")
        data = os.urandom(300000) + b"<script>window.__pwned=5</script>"
        up = os.path.join(self.tmp, "up<b>load.bin")
        with open(up, "wb") as f:
            f.write(data)
        self.q("#upload").send_keys(up)
        # (read in one script: the list is rebuilt while the page refreshes it)
        find = ("return [...document.querySelectorAll('#files a.download')]"
                ".filter(a => a.textContent === arguments[0]).map(a => a.href)[0] || null")
        href = self.wait(lambda: b.execute_script(find, "up<b>load.bin"), 60,
                         "the upload is listed")
        got = b.execute_async_script(
            "const done = arguments[1];"
            "fetch(arguments[0]).then(r => r.arrayBuffer()).then(buf => {"
            "  let s = ''; const u = new Uint8Array(buf);"
            "  for (let i = 0; i < u.length; i++) s += String.fromCharCode(u[i]);"
            "  done(btoa(s)); }, e => done('ERR ' + e));", href)
        self.assertEqual(base64.b64decode(got), data)
        self.wait(lambda: b.execute_script(find, long_name), 60, "the long name is listed")
        # no pane scrolls sideways, whatever the names and lines in it
        for pane in ("#side-pane", "#chat-pane", "#sessions-pane"):
            w = b.execute_script(
                "const e = document.querySelector(arguments[0]);"
                "const right = e.getBoundingClientRect().right;"
                "const wide = [...e.querySelectorAll('*')].filter("
                "  x => x.getBoundingClientRect().right > right + 1).slice(0, 3)"
                "  .map(x => x.tagName + '#' + x.id + '.' + x.className);"
                "return [e.scrollWidth, e.clientWidth, wide]", pane)
            self.assertLessEqual(w[0], w[1], (pane, w[2]))
        self.shot("04-files")

        # the whole folder as a tar
        self.q("#archive").click()
        self.wait(lambda: self.q("#archive-link").is_displayed(), 60, "the archive")
        got = b.execute_async_script(
            "const done = arguments[1];"
            "fetch(arguments[0]).then(r => r.arrayBuffer()).then(buf => {"
            "  let s = ''; const u = new Uint8Array(buf);"
            "  for (let i = 0; i < u.length; i++) s += String.fromCharCode(u[i]);"
            "  done(btoa(s)); }, e => done('ERR ' + e));",
            self.q("#archive-link").get_attribute("href"))
        with tarfile.open(fileobj=io.BytesIO(base64.b64decode(got))) as t:
            names = {os.path.normpath(n) for n in t.getnames()}
            self.assertLessEqual({"keep.txt", "plot.png", "up<b>load.bin"}, names)
            self.assertEqual(t.extractfile("./up<b>load.bin").read(), data)

        # the connection drops mid-run: the page reconnects with Last-Event-ID, and every line
        # shows exactly once
        n = len(self.qs("#transcript .turn"))
        self.q("#shell-input").send_keys(
            "for i in $(seq 1 400); do echo line-$i; sleep 0.02; done")
        self.q("#shell-run").click()
        self.wait(lambda: len(self.qs("#transcript .turn")) > n, 10, "the command shows")
        turn = self.last_turn()
        self.wait(lambda: "line-40\n" in turn.text + "\n", 60, "output flows")
        self.fwd.cut()
        self.assertEqual(self.wait_done(turn, 120), "exit")
        text = b.execute_script("return arguments[0].querySelector('pre.out').textContent", turn)
        self.assertEqual(text.split(), ["line-%d" % i for i in range(1, 401)])
        self.assertGreaterEqual(int(turn.get_attribute("data-reconnects") or 0), 1)
        print("cut at about line-40: %d lines, each once" % len(text.split()), file=sys.stderr)

        # hostile output through the %% box: tags, ANSI, a 10 MB line
        n = len(self.qs("#transcript .turn"))
        self.q("#shell-input").send_keys(HOSTILE_SH)
        self.q("#shell-run").click()
        self.wait(lambda: len(self.qs("#transcript .turn")) > n, 10, "the command shows")
        turn = self.last_turn()
        self.assertEqual(self.wait_done(turn, 180), "exit")
        out = turn.find_element(By.CSS_SELECTOR, "pre.out")
        text = b.execute_script("return arguments[0].textContent", out)
        self.assertIn('<img src=x onerror="window.__pwned=3">', text)
        self.assertIn("</script><script>window.__pwned=4</script>", text)
        self.assertIn("RED", text)
        self.assertNotIn("\x1b", text)
        self.assertLessEqual(len(text), 65536)  # capped
        more = turn.find_element(By.CSS_SELECTOR, "button.more")
        self.assertIn("show more", more.text)
        self.assertEqual(turn.find_elements(By.CSS_SELECTOR, ".output img, script"), [])
        t = time.time()
        self.assert_alive()
        self.assertLess(time.time() - t, 5)
        self.shot("05-hostile")

        # auto-run off: the code waits; Edit, then Run runs the edited code
        self.q("#auto-run").click()
        turn = self.chat("echo something")
        self.wait(lambda: turn.find_elements(By.CSS_SELECTOR, ".confirm .edit"), 60, "Run/Edit/Skip")
        self.assertIn("echo original", turn.text)
        turn.find_element(By.CSS_SELECTOR, ".confirm .edit").click()
        ed = turn.find_element(By.CSS_SELECTOR, "textarea.edit")
        ed.clear()
        ed.send_keys("echo edited-$((6 * 7))")
        self.shot("06-confirm-edit")
        turn.find_element(By.CSS_SELECTOR, ".confirm .run").click()
        self.assertEqual(self.wait_done(turn, 120), "done")
        out = turn.find_element(By.CSS_SELECTOR, "pre.out").text
        self.assertEqual(out.strip(), "edited-42")
        self.q("#auto-run").click()

        # Stop interrupts sleep 100
        turn = self.chat("sleep a while")
        self.wait(lambda: "sleep 100" in turn.text, 60, "the code shows")
        # one turn at a time: the API says so (the model's key never in any answer)
        with self.assertRaises(APIError) as e:
            sb.client.request("POST", "/v1/sessions/%s/chat" % sid, {"message": "again"})
        self.assertEqual((e.exception.status, e.exception.code), (409, "busy"))
        state = sb.client.request("GET", "/v1/sessions/%s/chat" % sid)
        self.assertTrue(state["busy"])
        self.assertNotIn("sk-web-test", json.dumps(state))
        time.sleep(2)
        t = time.time()
        self.q("#stop").click()
        self.wait_done(turn, 60)
        self.assertLess(time.time() - t, 30)
        self.assertIn("interrupted", turn.text)
        self.assert_alive()
        # the history through the API, without the key; the model got it on every request
        state = sb.client.request("GET", "/v1/sessions/%s/chat" % sid)
        self.assertFalse(state["busy"])
        self.assertTrue(any(m["role"] == "user" for m in state["messages"]))
        self.assertNotIn("sk-web-test", json.dumps(state))
        with open(os.path.join(self.tmp, "requests.jsonl")) as f:
            reqs = [json.loads(line) for line in f]
        self.assertTrue(reqs and all(r["auth"] == "Bearer sk-web-test" for r in reqs))
        self.shot("07-stopped")

        # the terminal tab: a login shell in the session through xterm.js, typed into
        self.q("#tab-terminal").click()
        self.assertFalse(self.q("#transcript").is_displayed())
        self.wait(lambda: self.qs("#terminals .terminal[data-run]"), 60, "a shell starts")
        term = self.q("#terminals .terminal[data-session='%s']" % sid)
        rid = term.get_attribute("data-run")

        def screen():
            return b.execute_script(
                "return [...arguments[0].querySelectorAll('.xterm-rows > div')]"
                ".map(r => r.textContent).join('\\n')", term)
        self.wait(lambda: "/workspace#" in screen(), 60, "the shell's prompt")
        keys = term.find_element(By.CSS_SELECTOR, "textarea.xterm-helper-textarea")
        keys.send_keys("echo hi-$((6*7)); printf '\\033[31mRED\\033[0m\\n'\n")
        self.wait(lambda: re.search(r"^hi-42", screen(), re.M), 30, "the command's output")
        self.wait(lambda: re.search(r"^RED", screen(), re.M), 30, "the coloured line")
        self.assertNotIn("\x1b", screen())
        red = term.find_elements(By.XPATH, ".//span[text()='RED']")
        self.assertTrue(red and "xterm-fg-1" in red[0].get_attribute("class"), "RED in red")
        self.shot("08-terminal")
        # its size is the pane's, and follows the window
        before = sb.client.request("GET", "/v1/sessions/%s/runs/%s" % (sid, rid))["pty"]
        b.set_window_size(1000, 700)
        self.wait(lambda: sb.client.request("GET", "/v1/sessions/%s/runs/%s" % (sid, rid))
                  ["pty"] != before, 20, "a resize")
        after = sb.client.request("GET", "/v1/sessions/%s/runs/%s" % (sid, rid))["pty"]
        self.assertLess(after["cols"], before["cols"])
        keys.send_keys("stty size\n")
        self.wait(lambda: re.search(r"^%d %d" % (after["rows"], after["cols"]), screen(), re.M),
                  30, "stty size %s" % after)
        b.set_window_size(1400, 900)
        keys.send_keys("exit 3\n")
        self.wait(lambda: term.get_attribute("data-ended"), 30, "the shell ends")
        self.assertIn("exited 3", self.q("#terminal-status").text)
        self.assertFalse(self.q("#terminal-new").get_attribute("hidden"))
        self.assert_alive()
        self.q("#tab-chat").click()
        self.assertTrue(self.q("#transcript").is_displayed())

        # a port the session serves, opened from the page at an origin of its own
        sb.files.write("/tmp/site/index.html", b"<title>served</title><p>web-port-ok</p>")
        sb.commands.run("cd /tmp/site && exec python3 -m http.server 8000", background=True)
        time.sleep(3)
        main = b.current_window_handle
        self.q("#port-input").send_keys("8000")
        self.q("#port-open").click()
        self.wait(lambda: len(b.window_handles) > 1, 20, "the port's window")
        b.switch_to.window([h for h in b.window_handles if h != main][0])
        for _ in range(30):  # the server may still be starting: the page again
            if "web-port-ok" in b.page_source:
                break
            time.sleep(1)
            b.refresh()
        self.assertIn("web-port-ok", b.page_source)
        self.assertTrue(re.match(r"http://8000-%s\.localhost:\d+/$" % re.escape(sid),
                                 b.current_url), b.current_url)
        self.assertNotIn("airlock_port", b.execute_script("return document.cookie"))
        # that origin is not the page's: the page's cookie and API are not its
        self.assertEqual(b.execute_script(
            "return fetch('/v1/sessions').then(r => r.status)"), 404)  # the guest's server
        self.shot("09-port")
        b.close()
        b.switch_to.window(main)

    # ---- the screen of a session started with one, taken over ----

    def sign_in(self):
        self.b.get(self.url)
        self.wait(lambda: self.q("#login").is_displayed() or self.q("#app").is_displayed(), 20,
                  "the page")
        if self.q("#login").is_displayed():
            self.q("#api-key").send_keys(self.key)
            self.q("#login-btn").click()
            self.wait(lambda: self.q("#app").is_displayed(), 10, "signed in")

    def guest_events(self, sb, before, want, timeout=30):
        """The guest's events after `before` once `want` of them have come."""
        deadline = time.time() + timeout
        while True:
            ev = events_since(sb, before)
            if len(ev) >= want or time.time() > deadline:
                return ev
            time.sleep(0.3)

    def test_screen_take_over(self):
        """A session started with a screen: its Screen tab shows the host's screenshots,
        refreshed; with "take over" the person's clicks land on the guest's tablet at the pixel
        clicked and their keys on its keyboard (read back from the guest's evdev devices).
        Without "take over" nothing is sent; a session without a screen has no such tab."""
        b = self.b
        self.sign_in()
        self.q("#new-image").clear()
        self.q("#new-image").send_keys("debian")
        if not self.q("#new-display").is_selected():
            self.q("#new-display").click()
        self.q("#start-session").click()
        self.wait(lambda: self.qs("#sessions li.current"), BOOT_S, "a session starts")
        sid = self.session_id()
        sb = self.sandbox(sid)
        self.addCleanup(sb.kill)
        self.assertTrue(sb.refresh()["display"])
        ranges = start_reader(sb)
        self.wait(lambda: self.q("#tab-screen").is_displayed(), 20, "the Screen tab")
        self.q("#tab-screen").click()
        img = self.q("#screen-img")
        frames = lambda: int(img.get_attribute("data-frames") or 0)
        self.wait(lambda: frames() >= 2, 60, "screenshots")
        # VGA's text mode until a desktop sets one; the <img> is the screenshot, not scaled.
        self.assertEqual(b.execute_script(
            "return [arguments[0].naturalWidth, arguments[0].naturalHeight]", img), [720, 400])
        self.assertIn("720×400", self.q("#screen-status").text)
        n = frames()
        self.wait(lambda: frames() > n + 2, 30, "the screen refreshed")
        self.shot("10-screen")

        # Not taken over: a click on the picture sends nothing.
        before = event_count(sb)
        ActionChains(b).move_to_element_with_offset(img, 0, 0).click().perform()
        time.sleep(1.5)
        self.assertEqual(events_since(sb, before), [])

        self.q("#take-over").click()
        rect = b.execute_script("const r = arguments[0].getBoundingClientRect();"
                                "return [r.left, r.top, r.width, r.height]", img)
        amin, amax = ranges[0], ranges[1]
        for px, py in ((100, 50), (650, 370)):
            # Selenium's offsets are from the element's centre, in CSS pixels.
            dx = round(rect[0] + (px + 0.5) * rect[2] / 720 - (rect[0] + rect[2] / 2))
            dy = round(rect[1] + (py + 0.5) * rect[3] / 400 - (rect[1] + rect[3] / 2))
            before = event_count(sb)
            ActionChains(b).move_to_element_with_offset(img, dx, dy).click().perform()
            ev = self.guest_events(sb, before, 4)
            self.assertEqual([(c, v) for d, t, c, v in ev if t == EV_KEY],
                             [(BTN_LEFT, 1), (BTN_LEFT, 0)],
                             (ev, self.q("#screen-status").text, img.get_attribute("data-sent")))
            ax = [v for d, t, c, v in ev if t == EV_ABS and c == 0]
            ay = [v for d, t, c, v in ev if t == EV_ABS and c == 1]
            self.assertTrue(ax and ay, ev)
            # where the guest's X server would put the pointer: the pixel clicked (give or
            # take the browser's rounding of the offset)
            self.assertLessEqual(abs((ax[-1] - amin) * 720 // (amax - amin + 1) - px), 1, ev)
            self.assertLessEqual(abs((ay[-1] - amin) * 400 // (amax - amin + 1) - py), 1, ev)
        # Keys while the picture has the focus: typed text, Enter, a chord.
        before = event_count(sb)
        img.send_keys("Hi, 42!")
        img.send_keys(Keys.ENTER)
        ActionChains(b).key_down(Keys.CONTROL).send_keys_to_element(img, "c").key_up(
            Keys.CONTROL).perform()
        ev = self.guest_events(sb, before, 30)
        ctrl = 29  # KEY_LEFTCTRL
        self.assertEqual(typed([e for e in ev if e[2] != ctrl]), "Hi, 42!\nc", ev)
        keys = [(c, v) for d, t, c, v in ev if t == EV_KEY]
        self.assertLess(keys.index((ctrl, 1)), keys.index((46, 1)), keys)  # held over KEY_C
        self.assertLess(keys.index((46, 0)), keys.index((ctrl, 0)), keys)
        self.assertEqual(b.find_elements(By.CSS_SELECTOR, ".error:not(:empty)"), [])
        self.shot("11-screen-take-over")

        # A session without a screen: no Screen tab; the chat tab comes back.
        plain = Sandbox(url="http://127.0.0.1:%d" % self.d.port, api_key=self.key,
                        image="tiny")
        self.addCleanup(plain.kill)
        self.wait(lambda: b.execute_script(
            "for (const li of document.querySelectorAll('#sessions li'))"
            "  if (li.dataset.id === arguments[0]) { li.click(); return true; }"
            "return false", plain.id), 40, "the other session listed (refreshed every 15 s)")
        self.wait(lambda: not self.q("#tab-screen").is_displayed(), 10, "no Screen tab")
        self.assertTrue(self.q("#transcript").is_displayed())

    # ---- the unix socket through a local forward: no key ----

    def test_unix_socket_forward_needs_no_key(self):
        fwd = Forward(unix=self.d.sock)
        self.addCleanup(fwd.close)
        port = fwd.port
        self.b.get("http://localhost:%d/" % port)
        self.wait(lambda: self.q("#app").is_displayed(), 20, "the page without signing in")
        self.assertFalse(self.q("#login").is_displayed())
        time.sleep(1)  # what /v1/me says is applied
        self.assertFalse(self.q("#logout").is_displayed())  # nobody signed in to sign out
        # a page of another name resolved to 127.0.0.1 (DNS rebinding) is refused
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("GET", "/v1/sessions", headers={"Host": "rebound.example:%d" % port,
                                                   "Sec-Fetch-Mode": "cors"})
        r = c.getresponse()
        self.assertEqual(r.status, 403, r.read())
        c.close()
        # another site's state-changing request without the CSRF header is refused
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("POST", "/v1/sessions", body="{}",
                  headers={"Origin": "http://evil.example", "Content-Type": "application/json"})
        r = c.getresponse()
        self.assertEqual(r.status, 403, r.read())
        c.close()
        self.assertIsNone(self.b.execute_script("return window.__pwned"))

    def test_no_model_said_up_front(self):
        """A daemon without a model says so when the page opens, with the keys to set (it said
        so only after the first message)."""
        d = Daemon()
        self.addCleanup(d.stop)
        fwd = Forward(unix=d.sock)
        self.addCleanup(fwd.close)
        self.b.get("http://localhost:%d/" % fwd.port)
        self.wait(lambda: self.q("#app").is_displayed(), 20, "the page")
        self.wait(lambda: self.q("#model-notice").is_displayed(), 10, "the model notice")
        self.assertIn("model_api_base", self.q("#model-notice").text)
        self.shot("90-no-model")


if __name__ == "__main__":
    altest.main()

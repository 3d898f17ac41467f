"""The desktop image (issue 33): Xorg on the guest's VGA, driven by the host's screen and input,
through airlockd and the Python client. No model.

A fullscreen Tk program in the guest (APP below, run as the unprivileged `user` on the image's X
server) has a button at a known rectangle that turns the background from one known colour to
another, a text entry, and a canvas that logs where each click landed, in X's own root
coordinates. Every assertion compares what the host sent with what the guest's X clients
received, or what the host's screenshot shows with the colours the program drew.
Environment: AIRLOCKD_BIN and the usual integration variables.
"""
import base64
import json
import os
import shutil
import tempfile
import time
import unittest

import altest
from airlock import APIError, Run, Sandbox
from test_airlockd import Daemon
from test_chat import tool_results
from test_screen import computer, pixel, png_pixels, png_size

RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)
BUTTON = (100, 100, 240, 80)  # x, y, w, h on the screen
ENTRY = (100, 300, 600, 40)

APP = r'''
import sys, tkinter as tk
log = open("/tmp/app.log", "w", buffering=1)
root = tk.Tk()
root.attributes("-fullscreen", True)
root.configure(bg="#ff0000", cursor="crosshair")
canvas = tk.Canvas(root, bg="#ff0000", highlightthickness=0, bd=0)
canvas.place(x=0, y=0, relwidth=1, relheight=1)
def pressed():
    canvas.configure(bg="#00ff00")
    root.configure(bg="#00ff00")
    log.write("button\n")
b = tk.Button(root, text="Press", command=pressed, bg="#0000ff", activebackground="#0000ff",
              bd=0, highlightthickness=0)
b.place(x=%d, y=%d, width=%d, height=%d)
entry = tk.Entry(root, font=("DejaVu Sans Mono", 14))
entry.place(x=%d, y=%d, width=%d, height=%d)
entry.bind("<Return>", lambda e: log.write("entry %%r\n" %% entry.get()))
entry.bind("<Button-1>", lambda e: entry.focus_force())
entry.bind("<FocusIn>", lambda e: log.write("focus\n"))
canvas.bind("<Button-1>", lambda e: log.write("click %%d %%d\n" %% (e.x_root, e.y_root)))
canvas.bind("<Button-3>", lambda e: log.write("right %%d %%d\n" %% (e.x_root, e.y_root)))
canvas.bind("<Double-Button-1>", lambda e: log.write("double %%d %%d\n" %% (e.x_root, e.y_root)))
for b in (4, 5):  # X's wheel buttons: up, down
    canvas.bind("<Button-%%d>" %% b,
                lambda e: log.write("wheel %%d %%d %%d\n" %% (e.num, e.x_root, e.y_root)))
tries = [0]
def ready():
    # Mapped, then made fullscreen by the window manager: ready once it covers the screen (or,
    # after 60 s, at whatever size it has, for the test to report).
    root.update_idletasks()
    w, h = root.winfo_width(), root.winfo_height()
    tries[0] += 1
    if (w, h) != (root.winfo_screenwidth(), root.winfo_screenheight()) and tries[0] < 600:
        root.after(100, ready)
        return
    log.write("ready %%d %%d\n" %% (w, h))
root.after(100, ready)
root.mainloop()
''' % (BUTTON + ENTRY)


def wait_for(fn, what, timeout=180):
    deadline = time.time() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.time() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.3)


def start_app(sb):
    """Waits for X, starts APP as the desktop's user; the size of its window once shown."""
    # The desktop started at boot (airlock.service): X answers on DISPLAY, which the image's
    # configuration gives every run.
    wait_for(lambda: sb.commands.run("xdpyinfo >/dev/null 2>&1 && echo up || true")
             .stdout == "up\n", "the X server")
    sb.commands.run("cat > /tmp/app.py && chmod 644 /tmp/app.py", stdin=APP)
    sb.commands.run("as-user python3 /tmp/app.py 2>/tmp/app.err", background=True)
    return tuple(int(v) for v in wait_for(
        lambda: sb.commands.run("grep '^ready' /tmp/app.log 2>/dev/null || true")
        .stdout.split()[1:], "the test program's window"))


def app_log(sb, prefix):
    return sb.commands.run("grep '^%s' /tmp/app.log || true" % prefix).stdout.splitlines()


class DesktopTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # The fake model (the real OpenAI wire format) for the chat test: a screenshot, then a
        # click on the program's canvas.
        cls.tmp = tempfile.mkdtemp(prefix="airlock-desktop-chat-")
        cls.fm, port = altest.start_fake_model([
            {"tool_calls": [computer("screenshot", id="c1")]},
            {"tool_calls": [computer("left_click", id="c2", coordinate=[777, 555])]},
            {"text": "clicked"}], cls.tmp)
        # keep_sessions: pause and resume (sessions are killed at the end, never left kept).
        cls.d = Daemon(model_api="openai", model_api_base="http://127.0.0.1:%d/v1" % port,
                       model="fake", keep_sessions="true")
        try:
            # No display asked for: the desktop image's sessions have one anyway.
            cls.sb = Sandbox(image="desktop", client=cls.d.unix())
            cls.size = start_app(cls.sb)
        except BaseException:
            cls.d.stop_and_remove()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.sb.kill()
        cls.fm.kill()
        cls.fm.wait()
        shutil.rmtree(cls.tmp, ignore_errors=True)
        if cls.d.stop_and_remove() != 0:
            raise AssertionError("airlockd exited badly")

    def log_lines(self, prefix):
        return app_log(self.sb, prefix)

    def shot(self):
        return png_pixels(self.sb.screenshot())

    def test_a_the_desktop_is_xorg_at_the_default_mode(self):
        bx, by, bw, bh = BUTTON
        probes = ((640, 700), (1279, 799), (bx + 5, by + 5))

        def drawn():  # Tk draws its widgets after the window is mapped, as it gets to it
            i = self.shot()
            seen = [pixel(i, x, y) for x, y in probes]
            return i if seen == [RED, RED, BLUE] else None
        img = wait_for(drawn, "the program's colours on the screenshot", 60)
        self.assertEqual(img[:2], (1280, 800))
        self.assertEqual(self.sb.screen_size, (1280, 800))
        # The program's window covers the screen: X and the host agree on the size.
        self.assertEqual(self.size, (1280, 800))
        # The X server runs as root, the desktop's programs as the unprivileged user.
        ps = self.sb.commands.run("ps -o user=,args= -C openbox,xterm,python3").stdout
        self.assertRegex(ps, r"(?m)^user +openbox")
        self.assertRegex(ps, r"(?m)^user +python3 /tmp/app.py")

    def test_b_calibration_lands_exactly(self):
        points = [(0, 0), (1279, 0), (0, 799), (1279, 799), (640, 400), (801, 613), (33, 777)]
        before = len(self.log_lines("click"))
        for x, y in points:
            self.sb.left_click(x, y)
        got = wait_for(lambda: self.log_lines("click")[before:] if
                       len(self.log_lines("click")) >= before + len(points) else None,
                       "the clicks in the program's log", 60)
        self.assertEqual(got, ["click %d %d" % p for p in points])

    def test_c_the_button_changes_the_colour(self):
        bx, by, bw, bh = BUTTON
        self.sb.move_mouse(bx + bw // 2, by + bh // 2)
        self.sb.left_click()
        wait_for(lambda: self.log_lines("button"), "the button's press", 60)
        img = wait_for(lambda: (lambda i: i if pixel(i, 640, 700) == GREEN else None)(
            self.shot()), "the new colour on the host's screenshot", 30)
        self.assertEqual(pixel(img, 10, 790), GREEN)

    def test_d_typing_reaches_the_entry(self):
        ex, ey, ew, eh = ENTRY
        self.sb.left_click(ex + 20, ey + eh // 2)
        # Keys go where the focus is when X handles them: the program takes it on the click.
        wait_for(lambda: self.log_lines("focus"), "the entry's focus", 60)
        text = "Hello, World! 123 ~|"
        self.sb.write(text)
        self.sb.press("Return")
        got = wait_for(lambda: self.log_lines("entry"), "the entry's text", 60)
        self.assertEqual(got[-1], "entry %r" % text)
        # What the US keyboard's keys do not make is typed by the guest's xdotool, in order.
        self.sb.press("ctrl+a")  # Tk's entry: to the line's start, then delete to its end
        self.sb.press("ctrl+k")
        more = "naïve ✓ 世界 Grüße"
        self.sb.write(more)
        self.sb.press("Return")
        got = wait_for(lambda: (lambda g: g if len(g) >= 2 else None)(self.log_lines("entry")),
                       "the entry's second text", 60)
        self.assertEqual(got[-1], "entry %r" % more)

    def test_e_wheel_right_and_double_click(self):
        before = {k: len(self.log_lines(k)) for k in ("wheel", "right", "double")}
        self.sb.scroll("down", 2, 700, 600)
        self.sb.scroll("up", 1, 701, 601)
        self.sb.right_click(702, 602)
        self.sb.double_click(703, 603)
        want = {"wheel": ["wheel 5 700 600", "wheel 5 700 600", "wheel 4 701 601"],
                "right": ["right 702 602"], "double": ["double 703 603"]}
        for k, lines in want.items():
            got = wait_for(lambda: (lambda g: g if len(g) >= len(lines) else None)(
                self.log_lines(k)[before[k]:]), "the program's %s events" % k, 60)
            self.assertEqual(got, lines)

    def test_g_a_display_of_another_size(self):
        with self.assertRaises(APIError) as e:
            Sandbox(image="desktop", display=(1000, 700), client=self.d.unix())
        self.assertEqual(e.exception.status, 400)
        self.assertIn("multiple of 8", str(e.exception))
        sb = Sandbox(image="desktop", display=(1024, 768), client=self.d.unix())
        try:
            # X takes the mode the VGA offers as its preferred one; the host's screenshot has it.
            wait_for(lambda: sb.commands.run("xdpyinfo 2>/dev/null | grep dimensions || true")
                     .stdout, "the X server")
            self.assertIn(" 1024x768 pixels", sb.commands.run("xdpyinfo | grep dimensions")
                          .stdout)
            self.assertEqual(png_pixels(sb.screenshot())[:2], (1024, 768))
            self.assertEqual(sb.screen_size, (1024, 768))
        finally:
            sb.kill()

    def test_h_the_daemons_chat_drives_the_desktop(self):
        # A session with a display (here without asking: the desktop image's) chats with the
        # computer tool: each action is an event, its screenshot goes back to the model, and
        # the click reaches the program through X.
        sb = self.sb
        before = len(self.log_lines("click"))
        info = sb.client.request("POST", "/v1/sessions/%s/chat" % sb.id,
                                 {"message": "click it", "auto_run": True})
        evs = list(Run(sb, info).events(timeout=300))
        self.assertEqual(evs[-1].type, "done", evs[-1])
        acts = [json.loads(e.data["code"]) for e in evs
                if e.type == "code" and e.data["language"] == "computer"]
        # The screenshot only reads: the actions shown (and asked about) are those that act.
        self.assertEqual([a["action"] for a in acts], ["left_click"])
        self.assertEqual(acts[0]["coordinate"], [777, 555])
        self.assertEqual(self.log_lines("click")[before:], ["click 777 555"])
        with open(os.path.join(self.tmp, "requests.jsonl")) as f:
            reqs = [json.loads(line) for line in f if line.strip()]
        self.assertEqual(len(reqs), 3)
        tools = {t["function"]["name"]: t["function"] for t in reqs[0]["body"]["tools"]}
        self.assertIn("1280x800 pixels", tools["computer"]["description"])
        for n, call in ((1, "c1"), (2, "c2")):
            self.assertEqual(tool_results(reqs[n])[-1]["tool_call_id"], call)
            self.assertIn("the screen now (1280x800)", tool_results(reqs[n])[-1]["content"])
            urls = [p["image_url"]["url"] for p in reqs[n]["body"]["messages"][-1]["content"]
                    if p["type"] == "image_url"]
            self.assertEqual(len(urls), 1)
            self.assertEqual(png_size(base64.b64decode(urls[0].split(",", 1)[1])), (1280, 800))

    def test_j_the_clipboard_through_the_interpreter(self):
        # Open Interpreter's computer.clipboard, attached to this session on airlockd: the X
        # clipboard in the guest (xclip), what one side copies the other reads
        from airlock import Interpreter
        i = Interpreter(server="unix:" + self.d.sock, session=self.sb.id)
        self.addCleanup(i.reset)  # attached: the session stays
        i.computer.clipboard.copy("airlock clipboard \u2713")
        self.assertEqual(i.computer.clipboard.view(), "airlock clipboard \u2713")
        # a program of the desktop's user sees the same selection
        got = self.sb.commands.run("as-user xclip -o -selection clipboard").stdout
        self.assertEqual(got, "airlock clipboard \u2713")
        # the desktop user's program holds the selection (until one paste: -loops 1) while a
        # command of its own runs
        self.sb.commands.run("printf 'from the guest' | as-user xclip -quiet -loops 1 "
                             "-selection clipboard", background=True)
        deadline = time.time() + 30
        while i.computer.clipboard.view() != "from the guest" and time.time() < deadline:
            time.sleep(0.5)
        self.assertLess(time.time(), deadline)
        self.assertEqual(self.sb.commands.run("echo alive").stdout, "alive\n")

    def test_i_pause_and_resume(self):
        # The VGA, the tablet, the keyboard and X come back from the saved state: the program
        # is on the screen and a click reaches it.
        sb = self.sb
        sb.pause()
        sb.resume()
        img = png_pixels(sb.screenshot())
        self.assertEqual(img[:2], (1280, 800))
        self.assertEqual(pixel(img, 640, 700), GREEN)  # the button of test_c was pressed
        before = len(self.log_lines("click"))
        sb.left_click(555, 444)
        got = wait_for(lambda: (lambda g: g if g else None)(self.log_lines("click")[before:]),
                       "the click after the resume", 60)
        self.assertEqual(got, ["click 555 444"])

    def test_z_when_x_dies_the_screen_still_works(self):
        # Last: it ends this session's desktop. The host reads the VGA, not X: with the X
        # server gone the screenshot shows what the kernel's console left there.
        self.sb.commands.run("pkill -KILL -x Xorg; while pgrep -x Xorg >/dev/null; do "
                             "sleep 0.1; done")
        img = png_pixels(self.sb.screenshot())
        self.assertGreaterEqual(img[0], 640)
        self.assertNotEqual(pixel(img, 640, 700), RED)
        self.assertNotEqual(pixel(img, 640, 700), GREEN)

    def test_f_a_scaled_screenshot(self):
        data = self.sb.screenshot(max_edge=640)
        w, h = png_pixels(data)[:2]
        self.assertEqual((w, h), (640, 400))
        self.assertEqual(self.sb.screen_size, (1280, 800))


class DesktopTemplateTest(unittest.TestCase):
    """The desktop image's warm template (`airlock image warm desktop`, whose warm command starts
    chromium) and a session airlockd restores from it: the browser's window is there at once,
    and the screen, the tablet and the keyboard work after the restore and the uniqueness
    refresh."""

    @classmethod
    def setUpClass(cls):
        cls.state = tempfile.mkdtemp(prefix="airlock-desktop-warm-", dir="/var/tmp")
        os.chmod(cls.state, 0o755)
        cls.d = None
        try:
            env = {"AIRLOCK_STATE_DIR": cls.state}
            r = altest.run(["-q", "image", "warm", "desktop"], env=env, timeout=900)
            if r.returncode != 0:
                raise AssertionError("image warm desktop: %s" % r.stderr.decode())
            cls.d = Daemon(env=env)
            cls.sb = Sandbox(image="desktop", client=cls.d.unix())
        except BaseException:
            cls.cleanup()
            raise

    @classmethod
    def cleanup(cls):
        if cls.d and cls.d.stop_and_remove() != 0:
            raise AssertionError("airlockd exited badly")
        shutil.rmtree(cls.state, ignore_errors=True)

    @classmethod
    def tearDownClass(cls):
        cls.sb.kill()
        cls.cleanup()

    def test_restored_with_the_browser_and_working_input(self):
        sb = self.sb
        info = sb.client.request("GET", sb._path)
        self.assertTrue(info["warm"], info)  # restored, not booted
        self.assertTrue(info["display"], info)
        # The browser the template started is up, and its page is on the host's screenshot:
        # white where a bare desktop shows its background colour.
        self.assertEqual(sb.commands.run(
            "xdotool search --onlyvisible --class chromium >/dev/null && echo shown").stdout,
            "shown\n")
        data = sb.screenshot()
        if os.environ.get("AIRLOCK_DESKTOP_SHOT"):
            with open(os.environ["AIRLOCK_DESKTOP_SHOT"], "wb") as f:
                f.write(data)
        img = png_pixels(data)
        self.assertEqual(img[:2], (1280, 800))
        self.assertEqual(pixel(img, 900, 600), (255, 255, 255))
        # The tablet and the keyboard, through a program started after the restore.
        self.assertEqual(start_app(sb), (1280, 800))
        sb.left_click(801, 613)
        self.assertEqual(wait_for(lambda: app_log(sb, "click"), "the click", 60),
                         ["click 801 613"])
        ex, ey, ew, eh = ENTRY
        sb.left_click(ex + 20, ey + eh // 2)
        wait_for(lambda: app_log(sb, "focus"), "the entry's focus", 60)
        sb.write("restored ~ok")
        sb.press("Return")
        self.assertEqual(wait_for(lambda: app_log(sb, "entry"), "the entry's text", 60),
                         ["entry 'restored ~ok'"])


if __name__ == "__main__":
    altest.main()

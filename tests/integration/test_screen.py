"""The screen and input of a session, from the host (issue 33's first part): airlockd's
GET .../screen and POST .../input through the Python client, on a debian guest with a display.

What the guest sees is read inside it, from the kernel's evdev devices of the virtio tablet and
keyboard (a reader started in the background), so every assertion is about events the guest
really received; what the host sees is decoded here from the PNG (a small decoder below, no
imaging library). Environment: AIRLOCKD_BIN and the usual integration variables.
"""
import base64
import json
import os
import shlex
import shutil
import struct
import subprocess
import tempfile
import time
import unittest
import zlib

import altest
from airlock import APIError, Run, Sandbox
from test_airlockd import Daemon
from test_chat import ChatPty, FakeModel, execute, tool_results
from test_mcp import SDK, npm_install

# In the guest: the tablet's and keyboard's events as lines "TYPE CODE VALUE" in /tmp/ev.log,
# after a first line with the tablet's axis ranges (EVIOCGABS). Linux's struct input_event on
# x86-64 is 24 bytes: a timeval, then u16 type, u16 code, s32 value.
READER = r'''
import fcntl, os, select, struct, sys
devs = {}
for e in sorted(os.listdir("/sys/class/input")):
    if not e.startswith("event"):
        continue
    name = open("/sys/class/input/%s/device/name" % e).read().strip()
    devs[name] = os.open("/dev/input/" + e, os.O_RDONLY)
tab, kbd = devs["QEMU Virtio Tablet"], devs["QEMU Virtio Keyboard"]
def absinfo(fd, axis):
    buf = bytearray(24)
    fcntl.ioctl(fd, 0x80184540 + axis, buf)  # EVIOCGABS(axis)
    return struct.unpack("6i", buf)[1:3]     # minimum, maximum
out = open("/tmp/ev.log", "w", buffering=1)
out.write("ready %d %d %d %d\n" % (absinfo(tab, 0) + absinfo(tab, 1)))
while True:
    for fd in select.select([tab, kbd], [], [])[0]:
        data = os.read(fd, 24 * 64)
        for i in range(0, len(data) - 23, 24):
            t, c, v = struct.unpack("HHi", data[i + 16:i + 24])
            if t != 0:  # EV_SYN lines left out
                out.write("%s %d %d %d\n" % ("tab" if fd == tab else "kbd", t, c, v))
'''

EV_KEY, EV_REL, EV_ABS = 1, 2, 3
BTN_LEFT, BTN_RIGHT, BTN_MIDDLE = 272, 273, 274
REL_WHEEL, REL_HWHEEL = 8, 6
KEY_LEFTSHIFT, KEY_LEFTCTRL, KEY_T = 42, 29, 20
# Linux key codes of the US keyboard, for decoding what was typed.
US = {2: "1!", 3: "2@", 4: "3#", 5: "4$", 6: "5%", 7: "6^", 8: "7&", 9: "8*", 10: "9(",
      11: "0)", 12: "-_", 13: "=+", 26: "[{", 27: "]}", 39: ";:", 40: "'\"", 41: "`~", 43: "\\|",
      51: ",<", 52: ".>", 53: "/?", 57: "  ", 28: "\n\n"}
for row, first in (("qwertyuiop", 16), ("asdfghjkl", 30), ("zxcvbnm", 44)):
    for i, ch in enumerate(row):
        US[first + i] = ch + ch.upper()


def png_pixels(data):
    """(width, height, rows of RGB(A) tuples' bytes, bytes per pixel) of a non-interlaced
    8-bit RGB or RGBA PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, ihdr = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    w, h, depth, color, _, _, interlace = ihdr
    assert depth == 8 and color in (2, 6) and interlace == 0, ihdr
    bpp = 3 if color == 2 else 4
    raw, stride, rows, prev = zlib.decompress(idat), w * bpp, [], bytearray(w * bpp)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return w, h, rows, bpp


def start_reader(sb):
    """Starts READER in the guest; the tablet's axis ranges (x min, max, y min, max)."""
    sb.commands.run("cat > /tmp/reader.py", stdin=READER)
    sb.commands.run("python3 /tmp/reader.py", background=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        first = sb.commands.run("head -n1 /tmp/ev.log 2>/dev/null || true").stdout
        if first.startswith("ready"):
            break
        time.sleep(0.2)
    return [int(v) for v in first.split()[1:]]


def event_count(sb):
    return int(sb.commands.run("wc -l < /tmp/ev.log").stdout)


def events_since(sb, before):
    """The guest's events after the first `before` lines, as (dev, type, code, value)."""
    out = sb.commands.run("tail -n +%d /tmp/ev.log" % (before + 1)).stdout
    return [(p[0], int(p[1]), int(p[2]), int(p[3])) for p in
            (line.split() for line in out.splitlines())]


def typed(ev):
    """The text the keyboard's presses among the events typed (US layout, shift held)."""
    text, shift = "", False
    for d, t, c, v in ev:
        if d != "kbd" or t != EV_KEY:
            continue
        if c == KEY_LEFTSHIFT:
            shift = v == 1
        elif v == 1:
            text += US[c][1 if shift else 0]
    return text


def pixel(img, x, y):
    w, h, rows, bpp = img
    return tuple(rows[y][x * bpp:x * bpp + 3])


class ScreenTest(unittest.TestCase):
    """One daemon, one debian session with a display, one without."""

    @classmethod
    def setUpClass(cls):
        cls.d = Daemon()
        try:
            cls.sb = Sandbox(image="debian", display=True, client=cls.d.unix())
            cls.ranges = start_reader(cls.sb)
        except BaseException:
            cls.d.stop_and_remove()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.sb.kill()
        if cls.d.stop_and_remove() != 0:
            raise AssertionError("airlockd exited badly")

    def events(self, act, size=None, settle=0.3):
        """Runs the actions; the guest's events they caused, as (dev, type, code, value)."""
        before = event_count(self.sb)
        self.last = self.sb.input(act, size=size)
        time.sleep(settle)
        return events_since(self.sb, before)

    def test_a_screenshot_is_the_modes_png(self):
        png = self.sb.screenshot()
        img = png_pixels(png)
        # The mode's size, said apart in the headers, is the PNG's: VGA's text mode here.
        self.assertEqual((img[0], img[1]), self.sb.screen_size)
        self.assertEqual(self.sb.screen_size, (720, 400))
        # Scaled down to a longest edge, the aspect kept; a region (zoom) of its own size.
        small = png_pixels(self.sb.screenshot(max_edge=360))
        self.assertEqual((small[0], small[1]), (360, 200))
        zoom = png_pixels(self.sb.screenshot(region=(0, 0, 90, 32)))
        self.assertEqual((zoom[0], zoom[1]), (90, 32))
        with self.assertRaises(APIError) as e:
            self.sb.screenshot(region=(700, 0, 40, 10))
        self.assertEqual(e.exception.status, 400)
        self.assertIn("not inside the 720x400 screen", e.exception.message)

    def test_b_what_the_guest_draws_the_host_sees(self):
        # The guest paints the text screen's first cells white on white (VGA text memory at
        # 0xb8000: a character and its attribute per cell); the host's screenshot shows them.
        before = png_pixels(self.sb.screenshot())
        self.sb.commands.run(
            "python3 -c \"import mmap,os; f=os.open('/dev/mem', os.O_RDWR|os.O_SYNC); "
            "m=mmap.mmap(f, 4096, offset=0xb8000); m[0:160]=b'\\xdb\\xff'*80\"")
        after = png_pixels(self.sb.screenshot())
        self.assertLess(sum(pixel(before, 4, 8)), 100)   # a dark cell before
        self.assertGreater(sum(pixel(after, 4, 8)), 600)  # white now, the whole first row
        self.assertGreater(sum(pixel(after, 715, 8)), 600)
        self.assertEqual(pixel(after, 4, 24), pixel(before, 4, 24))  # the second row as it was

    def test_c_coordinates_land_exactly(self):
        amin, amax = self.ranges[0], self.ranges[1]
        self.assertEqual((amin, amax), (self.ranges[2], self.ranges[3]))
        w, h = 720, 400
        for x, y in [(0, 0), (w - 1, h - 1), (w - 1, 0), (0, h - 1), (1, 1), (359, 199),
                     (360, 200), (717, 3), (123, 321)]:
            ev = self.events([{"action": "mouse_move", "coordinate": [x, y]}])
            got = {c: v for d, t, c, v in ev if d == "tab" and t == EV_ABS}
            # What a guest's X server makes of the value (v - min) * size / (max - min + 1)
            # is the pixel asked for; a repeat of the last position sends nothing.
            if 0 in got:
                self.assertEqual((got[0] - amin) * w // (amax - amin + 1), x, (x, y, got))
            if 1 in got:
                self.assertEqual((got[1] - amin) * h // (amax - amin + 1), y, (x, y, got))
            self.assertTrue(got, (x, y))
            self.assertEqual(self.last["cursor"], [x, y])
        # In the pixels of a scaled screenshot (360x200, each of its pixels 2x2 of the
        # screen's): its (359, 199) lands on one of the four screen pixels it shows.
        ev = self.events([{"action": "mouse_move", "coordinate": [359, 199]}], size=(360, 200))
        got = {c: v for d, t, c, v in ev if d == "tab" and t == EV_ABS}
        self.assertIn((got[0] - amin) * w // (amax - amin + 1), (718, 719))
        self.assertIn((got[1] - amin) * h // (amax - amin + 1), (398, 399))
        self.assertEqual(self.last["cursor"], [359, 199])

    def test_d_out_of_range_is_an_error_not_a_clamp(self):
        for bad in ([720, 10], [10, 400], [-1, 0], [1.5, 2], "x"):
            before = event_count(self.sb)
            with self.assertRaises(APIError) as e:
                self.sb.input([{"action": "left_click", "coordinate": bad}])
            self.assertEqual(e.exception.status, 400)
            self.assertIn("action 1 (left_click)", e.exception.message)
            time.sleep(0.3)
            after = event_count(self.sb)
            self.assertEqual(before, after, "nothing reached the guest for %r" % (bad,))
        # The actions before a bad one ran, and the answer says how many.
        c, r = self.sb.client.open("POST", self.sb._path + "/input", body={"actions": [
            {"action": "mouse_move", "coordinate": [5, 5]},
            {"action": "frobnicate"}]})
        body = json.loads(r.read())
        c.close()
        self.assertEqual(r.status, 400)
        self.assertEqual(body["done"], 1)
        self.assertIn("action 2 (frobnicate): unknown action", body["error"]["message"])

    def test_e_buttons_and_wheel(self):
        ev = self.events([{"action": "left_click", "coordinate": [100, 100]}])
        keys = [(c, v) for d, t, c, v in ev if t == EV_KEY]
        self.assertEqual(keys, [(BTN_LEFT, 1), (BTN_LEFT, 0)])
        ev = self.events([{"action": "right_click"}, {"action": "middle_click"}])
        self.assertEqual([(c, v) for d, t, c, v in ev if t == EV_KEY],
                         [(BTN_RIGHT, 1), (BTN_RIGHT, 0), (BTN_MIDDLE, 1), (BTN_MIDDLE, 0)])
        ev = self.events([{"action": "double_click", "coordinate": [50, 60]}])
        self.assertEqual([(c, v) for d, t, c, v in ev if t == EV_KEY], [(BTN_LEFT, 1),
                         (BTN_LEFT, 0)] * 2)
        ev = self.events([{"action": "scroll", "coordinate": [300, 200],
                           "scroll_direction": "down", "scroll_amount": 3}])
        self.assertEqual([v for d, t, c, v in ev if t == EV_REL and c == REL_WHEEL], [-1] * 3)
        ev = self.events([{"action": "scroll", "scroll_direction": "up"}])
        self.assertEqual([v for d, t, c, v in ev if t == EV_REL and c == REL_WHEEL], [1])
        # A drag: down at the start, moves on the way, up at the end.
        ev = self.events([{"action": "left_click_drag", "start_coordinate": [10, 10],
                           "coordinate": [600, 300]}])
        btn = [i for i, e in enumerate(ev) if e[1] == EV_KEY]
        self.assertEqual([ev[i][3] for i in btn], [1, 0])
        moves = [e for e in ev[btn[0]:btn[1]] if e[1] == EV_ABS]
        self.assertGreaterEqual(len(moves), 8)
        self.assertEqual(self.last["cursor"], [600, 300])

    def test_f_keys_and_typing(self):
        text = "Hello, World! 123 ~|"
        ev = self.events([{"action": "type", "text": text}], settle=1.0)
        self.assertEqual(typed(ev), text)
        # A chord: pressed in order, released in reverse.
        ev = self.events([{"action": "key", "text": "ctrl+shift+t"}])
        self.assertEqual([(c, v) for d, t, c, v in ev if t == EV_KEY],
                         [(KEY_LEFTCTRL, 1), (KEY_LEFTSHIFT, 1), (KEY_T, 1), (KEY_T, 0),
                          (KEY_LEFTSHIFT, 0), (KEY_LEFTCTRL, 0)])
        ev = self.events([{"action": "key", "text": "Return", "repeat": 2}])
        self.assertEqual([(c, v) for d, t, c, v in ev if t == EV_KEY], [(28, 1), (28, 0)] * 2)
        # What cannot be typed is refused whole, before anything is typed.
        # (The debian image has no xdotool, which the desktop image types the rest with.)
        for bad, why in (({"action": "type", "text": "naïve"}, "the guest has no xdotool"),
                         ({"action": "key", "text": "ctrl+nosuchkey"}, "unknown key"),
                         ({"action": "hold_key", "text": "a", "duration": 61}, "duration")):
            before = event_count(self.sb)
            with self.assertRaises(APIError) as e:
                self.sb.input([bad])
            self.assertIn(why, e.exception.message)
            time.sleep(0.3)
            self.assertEqual(event_count(self.sb), before)

    def test_g_a_session_without_a_display(self):
        plain = Sandbox(image="debian", client=self.d.unix())
        try:
            self.assertFalse(plain.info["display"])
            for call in (plain.screenshot, lambda: plain.left_click(1, 1)):
                with self.assertRaises(APIError) as e:
                    call()
                self.assertEqual((e.exception.status, e.exception.code), (409, "no_display"))
        finally:
            plain.kill()

    def test_h_screenshots_at_once_with_runs(self):
        # Screenshots are taken while a command runs (not after it), and a flood of them is
        # paced, not failed.
        run = self.sb.commands.run("sleep 60", background=True)
        try:
            for _ in range(10):
                self.assertEqual(self.sb.screenshot()[:8], b"\x89PNG\r\n\x1a\n")
            self.assertTrue(run.running, "the screenshots waited for the run's end")
        finally:
            run.kill()


    def test_i_a_wait_action_holds_no_screenshot(self):
        # Another caller's long wait (or held key) lets screenshots through meanwhile.
        import threading
        waiter = threading.Thread(target=self.sb.input,
                                  args=([{"action": "wait", "duration": 20}],))
        waiter.start()
        try:
            time.sleep(1)
            self.assertEqual(self.sb.screenshot()[:8], b"\x89PNG\r\n\x1a\n")
            self.assertTrue(waiter.is_alive(), "the screenshot waited for the wait's end")
        finally:
            waiter.join()


    def test_z_a_hostile_mode_change(self):
        # Last: it leaves the display in a huge mode. Root in the guest programs the VGA's VBE
        # registers itself (port I/O, as no driver would): 16000 pixels wide, 12000 high. The
        # device the host configured fits the mode to its 16 MiB of video memory (16000x262
        # here), so the host's screenshot stays bounded; it is taken, scaled on request, and
        # the session goes on.
        r = self.sb.commands.run("python3 -c %s" % shlex.quote(VBE_MODE % (16000, 12000)))
        self.assertEqual(r.stdout, "set\n", r.stderr)
        deadline = time.time() + 60
        while True:
            img = png_pixels(self.sb.screenshot())
            if img[0] != 720 or time.time() > deadline:
                break
            time.sleep(0.5)
        w, h = img[:2]
        self.assertEqual(w, 16000)
        self.assertLessEqual(w * h * 4, 16 << 20)
        self.assertEqual(self.sb.screen_size, (w, h))
        small = png_pixels(self.sb.screenshot(max_edge=1280))
        self.assertEqual(small[0], 1280)
        # Coordinates are checked against the new mode, and the session still runs code.
        with self.assertRaises(APIError):
            self.sb.input([{"action": "mouse_move", "coordinate": [16000, 0]}])
        self.sb.input([{"action": "mouse_move", "coordinate": [15999, h - 1]}])
        self.assertEqual(self.sb.commands.run("echo alive").stdout, "alive\n")


# In the guest, as root: the VGA's Bochs VBE registers (index port 0x1ce, data 0x1cf) written
# with 16-bit port I/O from a few bytes of machine code, to set an XxY 32-bit linear mode.
VBE_MODE = r"""
import ctypes, mmap
libc = ctypes.CDLL(None, use_errno=True)
if libc.ioperm(0x1ce, 3, 1) != 0:  # 16 bits at 0x1cf reach 0x1d0
    raise SystemExit("ioperm: errno %%d" %% ctypes.get_errno())
# mov dx,0x1ce; mov ax,di; out dx,ax; mov dx,0x1cf; mov ax,si; out dx,ax; ret
code = bytes([0x66, 0xba, 0xce, 0x01, 0x66, 0x89, 0xf8, 0x66, 0xef,
              0x66, 0xba, 0xcf, 0x01, 0x66, 0x89, 0xf0, 0x66, 0xef, 0xc3])
buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
buf.write(code)
out = ctypes.CFUNCTYPE(None, ctypes.c_uint16, ctypes.c_uint16)(
    ctypes.addressof(ctypes.c_char.from_buffer(buf)))
for index, value in ((4, 0), (1, %d), (2, %d), (3, 32), (4, 0x41)):
    out(index, value)
print("set")
"""


class CliTest(unittest.TestCase):
    """airlock session start --display, screenshot and input against airlockd (a tiny guest)."""

    def test_cli(self):
        d = Daemon()
        try:
            srv = ["--server", "unix:" + d.sock]
            r = altest.run(srv + ["session", "start", "--image", "tiny", "--display"])
            self.assertEqual(r.returncode, 0, r.stderr)
            sid = r.stdout.decode().strip()
            with tempfile.TemporaryDirectory() as tmp:
                out = os.path.join(tmp, "screen.png")
                r = altest.run(srv + ["session", "screenshot", sid, out, "--max-edge", "360"])
                self.assertEqual(r.returncode, 0, r.stderr)
                with open(out, "rb") as f:
                    img = png_pixels(f.read())
                self.assertEqual((img[0], img[1]), (360, 200))
                self.assertEqual(oct(os.stat(out).st_mode & 0o777), oct(0o666 & ~get_umask()))
                r = altest.run(srv + ["session", "screenshot", sid, "-"])
                self.assertEqual(r.stdout[:8], b"\x89PNG\r\n\x1a\n")
            r = altest.run(srv + ["session", "input", sid,
                                  '[{"action": "left_click", "coordinate": [700, 390]}]'])
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(json.loads(r.stdout), {"done": 1, "cursor": [700, 390]})
            r = altest.run(srv + ["session", "input", sid,
                                  '[{"action": "left_click", "coordinate": [720, 0]}]'])
            self.assertEqual(r.returncode, 1)
            self.assertIn(b"outside the 720x400 screen", r.stderr)
            self.assertEqual(r.stderr.count(b"\n"), 1, r.stderr)
            r = altest.run(srv + ["session", "input", sid, "not json"])
            self.assertEqual(r.returncode, 2)
            self.assertIn(b"not a JSON array", r.stderr)
            altest.run(srv + ["session", "stop", sid])
        finally:
            d.stop_and_remove()


def get_umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


# A run that starts READER in the guest and prints its first line once it is ready.
START_READER = (
    "import os, subprocess, time\nopen('/tmp/reader.py', 'w').write(%r)\n"
    "subprocess.Popen(['python3', '/tmp/reader.py'], start_new_session=True)\n"
    "for _ in range(300):\n"
    "    if os.path.exists('/tmp/ev.log') and open('/tmp/ev.log').read(5) == 'ready':\n"
    "        break\n"
    "    time.sleep(0.1)\n"
    "print(open('/tmp/ev.log').readline())" % READER)


def computer(action, id=None, **kw):
    c = {"name": "computer", "arguments": dict(action=action, **kw)}
    if id:
        c["id"] = id
    return c


def png_size(data):
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


class ChatComputerTest(unittest.TestCase):
    """airlock run --computer against the fake model (the real wire formats): the computer tool
    as each API takes it, each action's screenshot going back as an image, the actions reaching
    the guest's input devices, and the user's confirmation."""

    def fake(self, replies):
        fm = FakeModel(replies)
        self.addCleanup(fm.close)
        return fm

    def test_openai_function_and_what_the_guest_received(self):
        fm = self.fake([
            {"tool_calls": [execute(START_READER, lang="python")]},
            {"tool_calls": [computer("screenshot", id="c1")]},
            {"tool_calls": [computer("left_click", id="c2", coordinate=[100, 50])]},
            {"tool_calls": [computer("type", id="c3", text="hi")]},
            {"tool_calls": [computer("left_click", id="c4", coordinate=[720, 5])]},
            {"tool_calls": [execute("tail -n +2 /tmp/ev.log", lang="shell")]},
            {"text": "done"},
        ])
        args = [a if a != "tiny" else "debian" for a in fm.args("--computer")]
        r = altest.run(["run", "-y"] + args + ["click it"], env=fm.env, timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr)
        reqs = fm.requests()
        self.assertEqual(len(reqs), 7)
        tools = {t["function"]["name"]: t["function"] for t in reqs[0]["body"]["tools"]}
        self.assertIn("720x400 pixels", tools["computer"]["description"])
        self.assertIn("left_click", tools["computer"]["parameters"]["properties"]["action"]["enum"])
        self.assertIn("computer", reqs[0]["body"]["messages"][0]["content"])
        self.assertIn("ready", tool_results(reqs[1])[-1]["content"])
        for n, call in ((2, "c1"), (3, "c2"), (4, "c3")):
            res = tool_results(reqs[n])[-1]
            self.assertEqual(res["tool_call_id"], call)
            self.assertIn("the screen now (720x400)", res["content"])
            # The screenshot follows as an image the model sees.
            msgs = reqs[n]["body"]["messages"]
            urls = [p["image_url"]["url"] for p in msgs[-1]["content"]
                    if p["type"] == "image_url"]
            self.assertEqual(len(urls), 1, msgs[-1])
            self.assertEqual(png_size(base64.b64decode(urls[0].split(",", 1)[1])), (720, 400))
        bad = tool_results(reqs[5])[-1]["content"]
        self.assertIn("outside the 720x400 screen", bad)
        ev = [tuple(int(v) for v in line.split()[1:]) for line in
              tool_results(reqs[6])[-1]["content"].splitlines()
              if line[:4] in ("tab ", "kbd ")]
        keys = [(c, v) for t, c, v in ev if t == EV_KEY]
        # the click at (100, 50), then h (35) and i (23); nothing of the refused click
        self.assertEqual(keys, [(BTN_LEFT, 1), (BTN_LEFT, 0), (35, 1), (35, 0), (23, 1), (23, 0)])
        absx = [v for t, c, v in ev if t == EV_ABS and c == 0]
        self.assertEqual(absx[-1] * 720 // 0x8000, 100)

    def test_undo_takes_back_a_click(self):
        # The exchange that clicks takes a checkpoint before its first action; %undo goes back
        # to it, so the reader in the guest never saw the click.
        fm = self.fake([
            {"tool_calls": [execute(START_READER, lang="python")]}, {"text": "started"},
            {"tool_calls": [computer("left_click", id="c1", coordinate=[100, 50])]},
            {"text": "clicked"},
            {"tool_calls": [execute("tail -n +2 /tmp/ev.log", lang="shell")]}, {"text": "read"},
        ])
        args = [a if a != "tiny" else "debian" for a in fm.args("--computer")]
        r = altest.run(["chat", "-y", "--plain"] + args,
                       input=b"start\nclick\n%undo\nread\n", env=fm.env, timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(b"Rolled the VM back and dropped the last exchange", r.stdout)
        reqs = fm.requests()
        self.assertEqual(len(reqs), 6)
        clicked = tool_results(reqs[3])[-1]["content"]
        self.assertRegex(clicked, r"the screen now \(720x400\)\. \[checkpoint \d+ was taken")
        users = [m["content"] for m in reqs[4]["body"]["messages"]
                 if m["role"] == "user" and isinstance(m["content"], str)]
        self.assertEqual(users, ["start", "read"])
        ev = [tuple(int(v) for v in line.split()[1:]) for line in
              tool_results(reqs[5])[-1]["content"].splitlines()
              if line[:4] in ("tab ", "kbd ")]
        self.assertNotIn((EV_KEY, BTN_LEFT, 1), ev)

    def test_anthropic_computer_tool_and_confirmation(self):
        fm = self.fake([
            {"tool_calls": [computer("screenshot", id="toolu_1")]},
            {"tool_calls": [computer("left_click", id="toolu_2", coordinate=[10, 10])]},
            {"tool_calls": [computer("key", id="toolu_3", text="Return")]},
            {"text": "done"},
        ])
        # Asked before each action that touches the VM: yes to the click, no to the key.
        r = altest.run(["run"] + fm.args("--computer", api="anthropic") + ["go"],
                       input=b"y\nn\n", env=fm.env, timeout=300)
        self.assertEqual(r.returncode, 4, r.stderr)
        reqs = fm.requests()
        self.assertEqual(len(reqs), 3)  # the loop stopped at the declined action
        body = reqs[0]["body"]
        comp = [t for t in body["tools"] if t.get("name") == "computer"]
        self.assertEqual(comp, [{"type": "computer_20250124", "name": "computer",
                                 "display_width_px": 720, "display_height_px": 400}])
        self.assertEqual(reqs[0]["headers"].get("anthropic-beta"), "computer-use-2025-01-24")
        for n, tid in ((1, "toolu_1"), (2, "toolu_2")):
            blocks = [b for m in reqs[n]["body"]["messages"] if isinstance(m["content"], list)
                      for b in m["content"]]
            res = [b for b in blocks if b.get("type") == "tool_result"][-1]
            self.assertEqual(res["tool_use_id"], tid)
            imgs = [b for b in res["content"] if b.get("type") == "image"]
            self.assertEqual(len(imgs), 1, res)
            self.assertEqual(png_size(base64.b64decode(imgs[0]["source"]["data"])), (720, 400))
        self.assertEqual(r.stderr.count(b"Run this in the sandbox?"), 2, r.stderr)
        # Each action is shown as a run's code is.
        shown = r.stdout.replace(b" ", b"")
        self.assertIn(b'"action":"left_click","coordinate":[10,10]', shown)
        self.assertIn(b'"action":"key","text":"Return"', shown)
        conv = fm.conversations()[0]
        self.assertIn("declined", json.dumps(conv["messages"][-1]))


    def test_anthropic_newer_tool_and_zoom(self):
        # Claude Opus 4.5 gets Anthropic's newer computer tool, with zoom: a region at the
        # screen's resolution, the coordinates after it still those of the screenshots.
        fm = self.fake([
            {"tool_calls": [computer("zoom", id="toolu_1", region=[360, 200, 720, 400])]},
            {"tool_calls": [computer("zoom", id="toolu_2", region=[0, 0, 721, 10])]},
            {"tool_calls": [computer("mouse_move", id="toolu_3", coordinate=[700, 390])]},
            {"text": "done"},
        ])
        args = fm.args("--computer", api="anthropic")
        args[args.index("fake-model")] = "claude-opus-4-5"
        r = altest.run(["run", "-y"] + args + ["look closer"], env=fm.env, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        reqs = fm.requests()
        self.assertEqual(len(reqs), 4)
        comp = [t for t in reqs[0]["body"]["tools"] if t.get("name") == "computer"]
        self.assertEqual(comp, [{"type": "computer_20251124", "name": "computer",
                                 "display_width_px": 720, "display_height_px": 400,
                                 "enable_zoom": True}])
        self.assertEqual(reqs[0]["headers"].get("anthropic-beta"), "computer-use-2025-11-24")

        def result(n):
            blocks = [b for m in reqs[n]["body"]["messages"] if isinstance(m["content"], list)
                      for b in m["content"]]
            return [b for b in blocks if b.get("type") == "tool_result"][-1]
        res = result(1)
        self.assertEqual(res["tool_use_id"], "toolu_1")
        imgs = [b for b in res["content"] if b.get("type") == "image"]
        self.assertEqual(png_size(base64.b64decode(imgs[0]["source"]["data"])), (360, 200))
        self.assertIn("stay those of the 720x400 screenshots", res["content"][0]["text"])
        res = result(2)
        self.assertIn("not inside the 720x400 screen", json.dumps(res["content"]))
        # The move after the zoom is in the screenshots' space: in the zoom's 360x200 it would
        # be outside and refused (no screenshot after it).
        res = result(3)
        self.assertIn("Done: the screen now (720x400)", res["content"][0]["text"])
        imgs = [b for b in res["content"] if b.get("type") == "image"]
        self.assertEqual(png_size(base64.b64decode(imgs[0]["source"]["data"])), (720, 400))

    def test_responses_computer_calls_batches_and_safety_checks(self):
        # OpenAI's Responses API with its own computer tool: batched actions, the screenshot as
        # each call's output, a batch refused whole, and safety checks a person acknowledges
        # (asked even with -y: yes to the first, no to the second).
        def cu(call_id, *actions, checks=None):
            c = {"call_id": call_id, "actions": list(actions)}
            if checks:
                c["pending_safety_checks"] = checks
            return {"computer_calls": [c]}

        check = lambda n, code: [{"id": "sc_%d" % n, "code": code, "message": "Look at %s." % code}]
        fm = self.fake([
            {"tool_calls": [execute(START_READER, lang="python", id="f1")], "reasoning": True},
            cu("cu1", {"type": "screenshot"}),
            cu("cu2", {"type": "click", "button": "left", "x": 100, "y": 50},
               {"type": "type", "text": "hi"}, {"type": "keypress", "keys": ["CTRL", "A"]}),
            cu("cu3", {"type": "click", "button": "left", "x": 100, "y": 50},
               {"type": "click", "button": "left", "x": 720, "y": 5}),
            cu("cu4", {"type": "click", "button": "left", "x": 10, "y": 10},
               checks=check(1, "malicious_instructions")),
            {"tool_calls": [execute("tail -n +2 /tmp/ev.log", id="f2")]},
            cu("cu5", {"type": "click", "button": "left", "x": 20, "y": 20},
               checks=check(2, "sensitive_domain")),
            {"text": "never asked for"},
        ])
        args = [a if a != "tiny" else "debian" for a in fm.args("--computer", api="responses")]
        r = altest.run(["run", "-y"] + args + ["click it"], input=b"y\nn\n", env=fm.env,
                       timeout=600)
        self.assertEqual(r.returncode, 4, r.stderr)  # the second check was not acknowledged
        reqs = fm.requests()
        self.assertEqual(len(reqs), 7)
        self.assertTrue(reqs[0]["path"].endswith("/responses"))
        body = reqs[0]["body"]
        self.assertIn({"type": "computer"}, body["tools"])
        self.assertIn("computer", body["instructions"])
        # The reasoning item goes back as it came, before the call and its output.
        inp = reqs[1]["body"]["input"]
        self.assertEqual([i.get("type") for i in inp[-3:]],
                         ["reasoning", "function_call", "function_call_output"])
        self.assertEqual(inp[-3]["encrypted_content"], "opaque")
        self.assertIn("ready", inp[-1]["output"])

        def output(n, call_id):
            outs = [i for i in reqs[n]["body"]["input"] if i.get("type") == "computer_call_output"]
            self.assertEqual(outs[-1]["call_id"], call_id)
            url = outs[-1]["output"]["image_url"]
            self.assertEqual(outs[-1]["output"]["type"], "computer_screenshot")
            self.assertEqual(png_size(base64.b64decode(url.split(",", 1)[1])), (720, 400))
            return outs[-1], reqs[n]["body"]["input"][-1]

        for n, call_id in ((2, "cu1"), (3, "cu2")):
            out, last = output(n, call_id)
            self.assertNotIn("acknowledged_safety_checks", out)
            self.assertEqual(last, out)  # nothing for the model to read besides the screen
        out, last = output(4, "cu3")
        self.assertIn("outside the 720x400 screen", last["content"])
        self.assertIn("nothing was done", last["content"])
        out, last = output(5, "cu4")
        self.assertEqual(out["acknowledged_safety_checks"], check(1, "malicious_instructions"))
        self.assertEqual(r.stderr.count(b"Acknowledge it and go on?"), 2, r.stderr)
        self.assertIn(b"malicious_instructions", r.stderr)
        self.assertIn(b"sensitive_domain", r.stderr)
        self.assertNotIn(b"Run this in the sandbox?", r.stderr)  # -y: actions not confirmed
        ev = [tuple(int(v) for v in line.split()[1:]) for line in
              [i for i in reqs[6]["body"]["input"]
               if i.get("type") == "function_call_output"][-1]["output"].splitlines()
              if line[:4] in ("tab ", "kbd ")]
        keys = [(c, v) for t, c, v in ev if t == EV_KEY]
        # cu2: the click, h (35), i (23), ctrl (29) + a (30); nothing of cu3; cu4's click
        self.assertEqual(keys, [(BTN_LEFT, 1), (BTN_LEFT, 0), (35, 1), (35, 0), (23, 1), (23, 0),
                                (29, 1), (30, 1), (30, 0), (29, 0), (BTN_LEFT, 1), (BTN_LEFT, 0)])
        absx = [v for t, c, v in ev if t == EV_ABS and c == 0]
        self.assertEqual(absx[-1] * 720 // 0x8000, 10)
        conv = fm.conversations()[0]
        self.assertIn("did not acknowledge", json.dumps(conv["messages"][-1]))
        self.assertEqual(conv["api"], "responses")

    def test_screenshot_in_the_chat_with_the_profile_key(self):
        # A profile's computer: true gives the chat's session a display; %screenshot saves it.
        fm = self.fake([])
        prof = os.path.join(fm.env["XDG_CONFIG_HOME"], "airlock", "profiles")
        os.makedirs(prof)
        with open(os.path.join(prof, "default.yaml"), "w") as f:
            f.write("computer: true\n")
        out = os.path.join(fm.dir, "screen.png")
        c = ChatPty(self, fm)
        try:
            c.say(("%%screenshot %s" % out).encode())
            c.expect(b"saved to " + out.encode())
            mark = len(c.out)
            c.say(b"%screenshot")
            c.expect(b"saved to ", since=mark)
            c.expect(b"> ", since=mark)
        finally:
            altest.reap_pty(c.pid, c.fd)
        with open(out, "rb") as f:
            self.assertEqual(png_size(f.read()), (720, 400))
        outs = os.path.join(fm.env["XDG_DATA_HOME"], "airlock", "outputs")
        pngs = os.listdir(outs)
        self.assertEqual(len(pngs), 1)
        with open(os.path.join(outs, pngs[0]), "rb") as f:
            self.assertEqual(png_size(f.read()), (720, 400))


class DaemonResponsesChatTest(unittest.TestCase):
    """airlockd's chat with model_api = responses in a session with a display: OpenAI's computer
    tool, and a safety check OpenAI attaches to a call asked as a confirm of its own, auto_run
    or not, which only the owner's yes acknowledges."""

    def test_safety_checks_wait_for_the_owner(self):
        tmp = tempfile.mkdtemp(prefix="airlock-responses-chat-")
        self.addCleanup(shutil.rmtree, tmp, True)
        ck1 = [{"id": "sc_1", "code": "malicious_instructions", "message": "Odd page."}]
        ck2 = [{"id": "sc_2", "code": "sensitive_domain", "message": "A bank."}]
        fm, port = altest.start_fake_model([
            {"computer_calls": [{"call_id": "cu1", "pending_safety_checks": ck1, "actions": [
                {"type": "click", "button": "left", "x": 30, "y": 40}]}]},
            {"computer_calls": [{"call_id": "cu2", "pending_safety_checks": ck2,
                                 "actions": [{"type": "type", "text": "x"}]}]},
            {"text": "never asked for"}], tmp)
        self.addCleanup(fm.wait)
        self.addCleanup(fm.kill)
        d = Daemon(model_api="responses", model_api_base="http://127.0.0.1:%d/v1" % port,
                   model="fake")
        try:
            sb = Sandbox(image="debian", display=True, client=d.unix())
            try:
                info = sb.client.request("POST", "/v1/sessions/%s/chat" % sb.id,
                                         {"message": "go", "auto_run": True})
                answers, confirms, evs = iter([True, False]), [], []
                for e in Run(sb, info).events(timeout=300):
                    evs.append(e)
                    if e.type == "confirm":
                        confirms.append(e.data)
                        sb.client.request("POST", "/v1/sessions/%s/chat/confirm" % sb.id,
                                          {"run": next(answers)})
            finally:
                sb.kill()
        finally:
            self.assertEqual(d.stop_and_remove(), 0)
        self.assertEqual(confirms, [
            {"language": "safety_check", "code": "malicious_instructions: Odd page."},
            {"language": "safety_check", "code": "sensitive_domain: A bank."}])
        self.assertEqual((evs[-1].type, evs[-1].data.get("outcome")), ("done", "declined"))
        # The acknowledged call ran (its batch shown); the declined one did not.
        acts = [json.loads(e.data["code"]) for e in evs
                if e.type == "code" and e.data["language"] == "computer"]
        self.assertEqual(acts, [[{"type": "click", "button": "left", "x": 30, "y": 40}]])
        with open(os.path.join(tmp, "requests.jsonl")) as f:
            reqs = [json.loads(line) for line in f if line.strip()]
        self.assertEqual(len(reqs), 2)
        self.assertIn({"type": "computer"}, reqs[0]["body"]["tools"])
        out = [i for i in reqs[1]["body"]["input"] if i.get("type") == "computer_call_output"]
        self.assertEqual(out[-1]["call_id"], "cu1")
        self.assertEqual(out[-1]["acknowledged_safety_checks"], ck1)
        url = out[-1]["output"]["image_url"]
        self.assertEqual(png_size(base64.b64decode(url.split(",", 1)[1])), (720, 400))


class McpTest(unittest.TestCase):
    """The screenshot and computer tools of `airlock mcp` through the MCP SDK (pinned, from the
    npm registry), which checks each structuredContent against the tool's outputSchema."""

    def test_screenshot_and_computer(self):
        sdk = npm_install(SDK)
        with tempfile.NamedTemporaryFile("w", suffix=".py") as reader:
            reader.write(READER)
            reader.flush()
            env = dict(os.environ, AIRLOCK_IMAGE_DIR=altest.IMAGE_DIR)
            p = subprocess.run(["node", os.path.join(os.path.dirname(__file__),
                                                     "mcp_sdk_screen.mjs"), sdk, altest.AIRLOCK,
                                reader.name, "--image", "debian"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                               timeout=900)
        self.assertEqual(p.returncode, 0, p.stderr.decode(errors="replace")[-4000:])
        rep = json.loads(p.stdout)
        self.assertIn("screenshot", rep["tools"])
        self.assertIn("computer", rep["tools"])
        self.assertTrue(rep["plain_screenshot"]["isError"])  # a session without a display
        shot = rep["screenshot"]
        self.assertFalse(shot["isError"])
        self.assertEqual(shot["images"], [{"mime": "image/png", "magic": "89504e470d0a1a0a",
                                           "width": 720, "height": 400}])
        self.assertEqual((shot["st"]["screen_width"], shot["st"]["width"]), (720, 720))
        self.assertEqual([(i["width"], i["height"]) for i in rep["small"]["images"]], [(360, 200)])
        act = rep["computer"]
        self.assertFalse(act["isError"], act)
        self.assertEqual(act["st"]["done"], 2)
        # In the last screenshot's pixels (360x200), and its screenshot at that size again.
        self.assertEqual(act["st"]["cursor"], [180, 100])
        self.assertEqual([(i["width"], i["height"]) for i in act["images"]], [(360, 200)])
        self.assertTrue(rep["bad"]["isError"])
        self.assertIn("outside the 360x200 screen", rep["bad"]["text"])
        ev = [line.split() for line in rep["events"].splitlines()]
        keys = [(int(c), int(v)) for d, t, c, v in ev if int(t) == EV_KEY]
        # the click at the centre, then "o" (24) and "k" (37); nothing from the refused click
        self.assertEqual(keys, [(BTN_LEFT, 1), (BTN_LEFT, 0), (24, 1), (24, 0), (37, 1), (37, 0)])
        absx = [int(v) for d, t, c, v in ev if int(t) == EV_ABS and int(c) == 0]
        self.assertEqual(absx[-1] * 720 // 0x8000, 360)
        # The desktop image: a display without asking, at the size asked for, or the default.
        self.assertFalse(rep["desktop"]["isError"], rep["desktop"])
        self.assertEqual([(i["width"], i["height"]) for i in rep["desktop"]["images"]],
                         [(1024, 768)])
        self.assertFalse(rep["desktop_default"]["isError"], rep["desktop_default"])
        self.assertEqual([(i["width"], i["height"]) for i in rep["desktop_default"]["images"]],
                         [(1280, 800)])
        self.assertTrue(rep["bad_size"]["isError"])
        self.assertIn("multiple of 8", rep["bad_size"]["text"])


if __name__ == "__main__":
    altest.main()

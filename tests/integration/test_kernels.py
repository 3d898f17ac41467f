#!/usr/bin/env python3
"""The language kernels (guest-agent/kernel.c) in a real debian guest, through
tests/integration/kernel-driver (one session, JSON lines, so that runs share the kernels):
python state across runs, a traceback then recovery, an interrupt that keeps the variables, a
program waiting for input detected and interrupted, a timeout that lands in the driver's own
work (python and javascript), a plot file that comes back; shell cwd and status; node state. Plus the CLI's --kernel and --input-wait. One boot for the driver, one for
the CLI. Usage: test_kernels.py DRIVER [unittest args].
"""
import base64
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

import altest

DRIVER = sys.argv.pop(1) if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else ""
IMAGE = "debian"
HAVE_IMAGE = os.path.exists(os.path.join(altest.IMAGE_DIR, IMAGE, "manifest.json"))


class Driver(altest.JsonDriver):
    def __init__(self, image):
        super().__init__([DRIVER, image], "kernel-driver")

    def run(self, lang, code, **kw):
        r = self.call("exec", lang=lang, code=code, kernel=True, timeout_ms=120000, **kw)
        if r["r"] != 0:
            raise AssertionError("run failed: %r: %s" % (code, r.get("error")))
        return r


@unittest.skipUnless(HAVE_IMAGE and DRIVER, "the debian image is not built")
class KernelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Driver(IMAGE)

    @classmethod
    def tearDownClass(cls):
        cls.d.close()

    def ok(self, r, value=0):
        self.assertEqual((r["how"], r["value"]), (0, value), r)

    def value(self, r):
        """The text/plain of the run's value (its execute_result), or None."""
        vals = [x["data"].get("text/plain") for x in r["results"]
                if x["type"] == "result" and x["kind"] == "value"]
        self.assertLessEqual(len(vals), 1, r)
        return vals[0] if vals else None

    def test_announced(self):
        for k in ("kernel:python", "kernel:shell", "kernel:javascript"):
            self.assertIn(k, self.d.hello["languages"].split())

    def test_python(self):
        d = self.d
        self.ok(d.run("python", "import math\nx = 41\ndef twice(v):\n    return 2 * v\n"))
        r = d.run("python", "x + 1")
        self.ok(r)
        self.assertEqual((r["stdout"], self.value(r)), ("", "42"))
        # A traceback, then the kernel lives on.
        r = d.run("python", "print(twice(x))\n1 / 0")
        self.ok(r, 1)
        self.assertEqual(r["stdout"], "82\n")
        self.assertIn("ZeroDivisionError", r["stderr"])
        # ...and as a structured error, with no result.
        self.assertTrue(r["raised"], r)
        self.assertEqual([(x["type"], x["name"], x["value"]) for x in r["results"]],
                         [("error", "ZeroDivisionError", "division by zero")])
        self.assertIn("1 / 0", r["results"][0]["traceback"])
        self.assertNotIn("python.py", r["stderr"])
        # An interrupt during a busy loop keeps the kernel and its variables.
        r = d.run("python", "x = 5\nwhile True: pass", sigint_after_ms=1500)
        self.ok(r, 130)
        self.assertIn("KeyboardInterrupt", r["stderr"])
        r = d.run("python", "print(x, math.pi > 3)")
        self.ok(r)
        self.assertEqual(r["stdout"], "5 True\n")
        # A timeout that comes while the driver itself works (IPython transforming and parsing
        # 2000 statements takes about 1 s under emulation, within the 2 s before a kernel that
        # ignores the interrupt is killed) never interrupts the driver: the block stops (before
        # its first statement, or in the loop where the driver was quicker than the timeout, as
        # on a faster host), and the kernel and its variables survive. The timeout leaves the
        # driver time to take the request: an interrupt before that belongs to the run before.
        big = "y=1\n" * 2000 + "while True: pass\n"
        r = d.call("exec", lang="python", code=big, kernel=True, timeout_ms=250)
        self.assertEqual(r["r"], 0, r)
        self.assertEqual((r["how"], r["value"], r["timed_out"]), (0, 130, True), r)
        self.assertIn("KeyboardInterrupt", r["stderr"])
        self.assertNotIn("Traceback", r["stderr"])
        r = d.run("python", "print(x, globals().get('y', 1))")
        self.ok(r)
        self.assertEqual(r["stdout"], "5 1\n")
        # input() gets the run's stdin.
        r = d.run("python", "print(input().upper())", stdin="hello\n")
        self.ok(r)
        self.assertEqual(r["stdout"], "HELLO\n")

    def test_python_waiting_for_input(self):
        r = self.d.run("python", "name = input('name? ')\nprint(name)", input_wait_ms=1500,
                       interrupt_on_wait=True)
        self.assertTrue(r["waited_input"], r)
        self.ok(r, 130)
        self.assertIn("name? ", r["stdout"])
        # A quiet sleep is no wait for input.
        r = self.d.run("python", "import time\ntime.sleep(3)", input_wait_ms=1000,
                       interrupt_on_wait=True)
        self.ok(r)
        self.assertFalse(r["waited_input"], r)

    def test_python_notebook(self):
        # IPython in the guest: rich results in order, figures as PNG results, magics and shell
        # escapes, the run's own env, and bad results that leave the kernel alive.
        d = self.d
        r = d.run("python", "import pandas as pd\n"
                  "display(pd.DataFrame({'a': [1, 2]}))\nprint('mid')\ndisplay('two')\n"
                  "pd.DataFrame({'b': [3]})")
        self.ok(r)
        res = r["results"]
        self.assertEqual([(x["type"], x.get("kind")) for x in res],
                         [("result", "display"), ("result", "display"), ("result", "value")], r)
        self.assertIn("<table", res[0]["data"]["text/html"])
        self.assertIn("a", res[0]["data"]["text/plain"])
        self.assertEqual(res[1]["data"], {"text/plain": "'two'"})
        self.assertIn("<table", res[2]["data"]["text/html"])
        self.assertEqual(res[2]["execution_count"], r["execution_count"])
        self.assertEqual(r["stdout"], "mid\n")
        # A figure: an image/png result of the size asked for, no file needed.
        r = d.run("python", "import matplotlib.pyplot as plt\n"
                  "plt.figure(figsize=(4, 3), dpi=50)\nplt.plot([1, 3, 2])\nplt.show()")
        self.ok(r)
        pngs = [x for x in r["results"] if "image/png" in x.get("data", {})]
        self.assertEqual(len(pngs), 1, r)
        png = base64.b64decode(pngs[0]["data"]["image/png"])
        self.assertEqual(png[:8], b"\x89PNG\r\n\x1a\n")
        self.assertEqual(struct.unpack(">II", png[16:24]), (200, 150))
        self.assertEqual((pngs[0]["width"], pngs[0]["height"]), (200, 150))
        # A cell that switched to Agg (as model-written code often does) and left its figure
        # open: the figure still comes back; the kernel's figures work after it (plt.show(),
        # %matplotlib inline).
        r = d.run("python", "import matplotlib\nmatplotlib.use('Agg')\n"
                  "import matplotlib.pyplot as plt\nplt.figure(figsize=(2, 2), dpi=50)\n"
                  "plt.plot([1, 2])\nmatplotlib.get_backend()")
        self.ok(r)
        self.assertIn("agg", self.value(r).lower(), r)
        pngs = [base64.b64decode(x["data"]["image/png"]) for x in r["results"]
                if "image/png" in x.get("data", {})]
        self.assertEqual([struct.unpack(">II", p[16:24]) for p in pngs], [(100, 100)], r)
        r = d.run("python", "%matplotlib inline\nplt.figure(figsize=(3, 2), dpi=50)\n"
                  "plt.plot([2, 1])\nplt.show()")
        self.ok(r)
        pngs = [base64.b64decode(x["data"]["image/png"]) for x in r["results"]
                if "image/png" in x.get("data", {})]
        self.assertEqual([struct.unpack(">II", p[16:24]) for p in pngs], [(150, 100)], r)
        # Top-level await, shell escapes and %cd.
        r = d.run("python", "import asyncio\nawait asyncio.sleep(0.01)\n!pwd\n%cd /tmp\n!pwd")
        self.ok(r)
        self.assertEqual(r["stdout"].splitlines()[-2:], ["/tmp", "/tmp"], r)
        self.assertNotEqual(r["stdout"].splitlines()[0], "/tmp", r)
        # The run's environment reaches the run (and its commands) only, in each language.
        r = d.run("python", "import os\n!echo $ONLY\nos.environ['ONLY']", env=["ONLY=here"])
        self.assertEqual((r["stdout"], self.value(r)), ("here\n", "'here'"), r)
        r = d.run("python", "os.environ.get('ONLY', 'gone')")
        self.assertEqual(self.value(r), "'gone'", r)
        r = d.run("shell", "echo ${ONLY:-gone}", env=["ONLY=here"])
        self.assertEqual(r["stdout"], "here\n", r)
        r = d.run("shell", "echo ${ONLY:-gone}")
        self.assertEqual(r["stdout"], "gone\n", r)
        r = d.run("javascript", "process.env.ONLY", env=["ONLY=here"])
        self.assertEqual(self.value(r), "'here'", r)
        r = d.run("javascript", "process.env.ONLY || 'gone'")
        self.assertEqual(self.value(r), "'gone'", r)
        # A 50 MiB result is refused by the host with a clear reason; the kernel lives on.
        r = d.run("python", "class Big:\n    def _repr_html_(self):\n"
                  "        return 'x' * (50 << 20)\nBig()")
        self.ok(r)
        self.assertEqual([x["type"] for x in r["results"]], ["refused"], r)
        self.assertIn("over the limit of 16 MiB", r["results"][0]["why"])
        self.assertEqual(self.value(d.run("python", "x * 2")), "10")
        # A repr that raises: reported, no value, the kernel lives on.
        r = d.run("python", "class Bad:\n    def __repr__(self):\n        raise OSError('no')\n"
                  "Bad()")
        self.assertIn("OSError", r["stderr"])
        self.assertIsNone(self.value(r), r)
        # A repr that never returns: the run's timeout interrupts it; the kernel lives on.
        r = d.call("exec", lang="python", code="class Slow:\n    def __repr__(self):\n"
                   "        while True: pass\nSlow()", kernel=True, timeout_ms=3000)
        self.assertEqual((r["r"], r["timed_out"], r["value"]), (0, True, 130), r)
        # Binary garbage on stdout comes through as bytes; the kernel lives on.
        r = d.run("python", "import sys\nsys.stdout.buffer.write(bytes(range(256)))\n"
                  "sys.stdout.flush()\n7")
        self.ok(r)
        self.assertEqual(self.value(r), "7", r)
        self.assertEqual(self.value(d.run("python", "x + 1")), "6")

    def test_contexts(self):
        # Contexts of a language are kernels of their own: state and cwd not shared; listed;
        # stopped (restart and remove) one at a time.
        d = self.d
        d.run("python", "v = 'one'\nimport os\nos.chdir('/tmp')", context="one")
        d.run("python", "v = 'two'", context="two")
        self.assertEqual(self.value(d.run("python", "v, os.getcwd()", context="one")),
                         "('one', '/tmp')")
        self.assertEqual(self.value(d.run("python", "import os\nv, os.getcwd() == '/tmp'",
                                          context="two")), "('two', False)")
        self.assertNotIn("'one'", str(self.value(d.run("python", "globals().get('v')"))))
        l = d.call("list")
        self.assertEqual(l["r"], l["list"].count("\n"), l)
        self.assertIn("python one running\n", l["list"])
        self.assertIn("python two running\n", l["list"])
        self.assertEqual(d.call("stop", lang="python", context="one")["r"], 0)
        self.assertNotIn("python one", d.call("list")["list"])
        r = d.call("exec", lang="python", code="v", kernel=True, context="one", timeout_ms=120000)
        self.assertEqual((r["how"], r["value"]), (0, 1), r)
        self.assertIn("NameError", r["stderr"])
        self.assertEqual(self.value(d.run("python", "v", context="two")), "'two'")
        self.assertEqual(d.call("stop", lang="python", context="two")["r"], 0)
        self.assertEqual(d.call("stop", lang="python", context="one")["r"], 0)

    def test_shell(self):
        d = self.d
        r = d.run("shell", "cd /tmp && v=7 && greet() { echo \"hi $1\"; }; false")
        self.ok(r, 1)
        r = d.run("shell", "pwd; echo $v; greet there")
        self.ok(r)
        self.assertEqual(r["stdout"], "/tmp\n7\nhi there\n")
        r = d.run("shell", "while :; do :; done", sigint_after_ms=1500)
        self.ok(r, 130)
        r = d.run("shell", "read line", input_wait_ms=1500, interrupt_on_wait=True)
        self.assertTrue(r["waited_input"], r)
        r = d.run("shell", "echo $v; exit 3")
        self.ok(r, 3)
        r = d.run("shell", "echo ${v:-gone}")
        self.ok(r)
        self.assertEqual(r["stdout"], "gone\n")
        self.assertIn("kernel restarted; state lost", r["stderr"])

    def test_javascript(self):
        d = self.d
        self.ok(d.run("javascript", "var a = 3; let b = 4; function f() { return a * b; }"))
        r = d.run("javascript", "f() + b")
        self.ok(r)
        self.assertEqual(self.value(r), "16")
        r = d.run("javascript", "null.x")
        self.ok(r, 1)
        self.assertIn("TypeError", r["stderr"])
        self.assertEqual([(x["type"], x["name"]) for x in r["results"]], [("error", "TypeError")])
        r = d.run("javascript", "a = 9; while (true) {}", sigint_after_ms=2000)
        self.ok(r, 130)
        r = d.run("javascript", "a")
        self.ok(r)
        self.assertEqual(self.value(r), "9")
        # A timeout while the driver reads and compiles a big block (about 0.4 s under
        # emulation), before node's own SIGINT watch is armed: held, it stops the block before
        # it starts; the kernel lives on.
        big = "var y=1;\n" * 25000 + "while (true) {}\n"
        r = d.call("exec", lang="javascript", code=big, kernel=True, timeout_ms=200)
        self.assertEqual(r["r"], 0, r)
        self.assertEqual((r["how"], r["value"], r["timed_out"]), (0, 130, True), r)
        r = d.run("javascript", "a")
        self.ok(r)
        self.assertEqual(self.value(r), "9")

    def test_javascript_timeouts_never_kill_the_kernel(self):
        """A timeout interrupts a javascript block, wherever it lands (the driver reading the
        request, compiling, node's SIGINT watch being armed, the loop), and never kills the
        kernel: 20 in a row, their times spread over the block's start."""
        d = self.d
        self.ok(d.run("javascript", "var kept = 'alive'"))
        for i in range(20):
            r = d.call("exec", lang="javascript", code="while (true) {}", kernel=True,
                       timeout_ms=30 + 25 * i)
            self.assertEqual(r["r"], 0, r)
            self.assertEqual((r["how"], r["value"], r["timed_out"]), (0, 130, True), (i, r))
        r = d.run("javascript", "kept")
        self.ok(r)
        self.assertEqual(self.value(r), "'alive'")

    def test_notebook_cells(self):
        # Blocks are taken as notebook cells: an indented python block runs dedented; node 18's
        # blocks may await at the top, import, and declare a let or const again.
        d = self.d
        r = d.run("python", "    z = 1\n    print(z + 1)\n")
        self.ok(r)
        self.assertEqual(r["stdout"], "2\n")
        r = d.run("javascript", "await Promise.resolve(1)")
        self.ok(r)
        self.assertEqual(self.value(r), "1")
        r = d.run("javascript", "import { readFileSync } from 'fs'\nimport os from 'os'\n"
                  "const k = await new Promise(r => setTimeout(() => r(os.platform()), 10));\n"
                  "readFileSync('/proc/version', 'utf8').startsWith('Linux') && k")
        self.ok(r)
        self.assertEqual(self.value(r), "'linux'")
        self.ok(d.run("javascript", "let n = 1; const k = 2;"))
        r = d.run("javascript", "let n = 3; const k = n + 1; [n, k]")
        self.ok(r)
        self.assertEqual(self.value(r), "[ 3, 4 ]")


@unittest.skipUnless(HAVE_IMAGE, "the debian image is not built")
class CliTest(unittest.TestCase):
    def test_kernel_and_input_wait(self):
        # stdin stays open and empty: the program waits, is reported and interrupted.
        with altest.popen(["-q", "exec", "--image", IMAGE, "--lang", "python", "--kernel",
                           "--json", "--input-wait", "2", "-c",
                           "print(6 * 7)\ndisplay(6)\ninput()"],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as p:
            # Not communicate(): that would close stdin, and input() would see EOF.
            out, err = p.stdout.read(), p.stderr.read()
            p.stdin.close()
            self.assertEqual(p.wait(timeout=altest.HANG_GUARD_S), 130, err)
        # --json: one object per event, in order.
        events = [json.loads(l) for l in out.splitlines()]
        self.assertEqual("".join(e["text"] for e in events if e["type"] == "stdout"), "42\n")
        self.assertIn("KeyboardInterrupt",
                      "".join(e["text"] for e in events if e["type"] == "stderr"))
        events = [e for e in events if e["type"] not in ("stdout", "stderr")]
        self.assertEqual([e["type"] for e in events], ["result", "error", "end"], out)
        self.assertEqual(events[0]["data"], {"text/plain": "6"})
        self.assertEqual(events[1]["name"], "KeyboardInterrupt")
        self.assertEqual((events[2]["status"], events[2]["waited_input"], events[2]["error"]),
                         (130, True, True), events[2])
        self.assertIn(b"waited for input", err)

    def test_kernel_text_saves_figures(self):
        # Without --json: the value as text, a figure as a file in the outputs dir named on
        # stderr (not its "<Figure size ...>" text).
        data = tempfile.mkdtemp(prefix="airlock-outputs-")
        self.addCleanup(shutil.rmtree, data, True)
        r = altest.run(["-q", "exec", "--image", IMAGE, "--lang", "python", "--kernel", "-c",
                        "import matplotlib.pyplot as plt\n"
                        "plt.figure(figsize=(3, 2), dpi=100)\n"
                        "plt.plot([1, 2])\n"
                        "plt.show()\n"
                        "1 + 1"], env={"XDG_DATA_HOME": data})
        err = r.stderr.decode()
        self.assertEqual((r.returncode, r.stdout), (0, b"2\n"), err)
        m = re.search(r"^airlock: figure 300x200 saved: (.+)$", err, re.M)
        self.assertTrue(m, err)
        path = m.group(1)
        self.assertEqual(os.path.dirname(path), os.path.join(data, "airlock", "outputs"))
        with open(path, "rb") as f:
            png = f.read()
        self.assertEqual(png[:8], b"\x89PNG\r\n\x1a\n")
        self.assertEqual(struct.unpack(">II", png[16:24]), (300, 200))


if __name__ == "__main__":
    altest.main()

"""Open Interpreter's Python API on Airlock (clients/python/airlock/_oi.py over `airlock chat
--jsonl`), against the project's fake model and real guests: the behaviour Open Interpreter's
own tests/test_interpreter.py checks, re-expressed here (the streamed chunk schema, a
non-blocking chat, trimming to the context window, independent instances, a generator left
early stopping the code, files, reset, images), and Airlock's own (a confirmation when auto_run
is off, a conversation restored by assigning messages). One VM per Interpreter.
"""
import base64
import json
import os
import shutil
import struct
import tempfile
import time
import unittest

import altest
from test_chat import FakeModel, KEY

from airlock import Interpreter, interpreter as default_interpreter

IMAGE = "debian"
HAVE_DEBIAN = os.path.exists(os.path.join(altest.IMAGE_DIR, IMAGE, "manifest.json"))


def setUpModule():
    global DATA
    DATA = tempfile.mkdtemp(prefix="airlock-interpreter-test-")
    os.environ["XDG_DATA_HOME"] = DATA  # the chats' saved conversations
    os.environ["XDG_CONFIG_HOME"] = DATA


def tearDownModule():
    shutil.rmtree(DATA, ignore_errors=True)


def execute(code, lang="python"):
    return {"name": "execute", "arguments": {"language": lang, "code": code}}


@unittest.skipUnless(HAVE_DEBIAN, "needs the debian image")
class InterpreterTest(unittest.TestCase):
    def make(self, replies, **settings):
        fm = FakeModel(replies)
        self.addCleanup(fm.close)
        i = Interpreter(image=IMAGE, **settings)
        i.llm.model = "fake-model"
        i.llm.api = "openai"
        i.llm.api_base = fm.base
        i.llm.api_key = KEY
        i.auto_run = settings.get("auto_run", True)
        self.addCleanup(i.reset)
        return i, fm

    def test_stream_chunk_schema(self):
        i, fm = self.make([{"text": "Running it.", "tool_calls": [execute("print(6 * 7)")]},
                           {"text": "It printed 42."}])
        chunks = list(i.chat("what is 6 * 7?", display=False, stream=True))
        seen = [(c["role"], c["type"], c.get("start", False), c.get("end", False))
                for c in chunks if c["role"] != "server"]
        # every message is framed by start and end, with content between
        kinds = [(r, t) for r, t, s, e in seen if s]
        self.assertEqual(kinds, [("assistant", "message"), ("assistant", "code"),
                                 ("computer", "console"), ("assistant", "message")])
        self.assertEqual(sum(1 for x in seen if x[2]), sum(1 for x in seen if x[3]))
        code = [c for c in chunks if c["type"] == "code" and "content" in c]
        self.assertEqual((code[0]["format"], code[0]["content"]), ("python", "print(6 * 7)"))
        out = "".join(c["content"] for c in chunks
                      if c["type"] == "console" and c.get("format") == "output")
        self.assertEqual(out.strip(), "42")
        # code comes before its output; the messages kept are whole
        self.assertLess(chunks.index(code[0]), next(n for n, c in enumerate(chunks)
                                                      if c.get("format") == "output"))
        self.assertEqual([(m["role"], m["type"]) for m in i.messages],
                         [("user", "message"), ("assistant", "message"), ("assistant", "code"),
                          ("computer", "console"), ("assistant", "message")])
        self.assertEqual(i.messages[-1]["content"], "It printed 42.")
        self.assertTrue(i.session and i.session.startswith("airlock-"))

    def test_non_blocking_then_wait(self):
        i, fm = self.make([{"tool_calls": [execute("import time; time.sleep(2); print('slow')")]},
                           {"text": "done"}])
        t0 = time.monotonic()
        self.assertIsNone(i.chat("go", display=False, blocking=False))
        self.assertLess(time.monotonic() - t0, 2)
        new = i.wait()
        self.assertEqual(new[-1]["content"], "done")
        self.assertIn("slow", "".join(m["content"] for m in new if m["type"] == "console"))

    def test_context_window_keeps_the_system_message_and_the_last_turn(self):
        i, fm = self.make([{"text": "one"}, {"text": "two"}])
        i.llm.context_window = 3000
        i.system_message = "SYSTEM-MARK you run code in a VM."
        i.chat("FIRST " + "word " * 6000, display=False)
        i.chat("LAST question", display=False)
        body = fm.requests()[-1]["body"]
        msgs = body["messages"]
        text = " ".join(m["content"] if isinstance(m["content"], str) else str(m["content"])
                        for m in msgs)
        self.assertIn("SYSTEM-MARK", msgs[0]["content"])
        self.assertEqual(msgs[-1]["content"], "LAST question")
        self.assertNotIn("word " * 6000, text)  # the long turn was trimmed away

    def test_two_instances_keep_their_own_state(self):
        a, _ = self.make([{"tool_calls": [execute("x = 'from a'")]}, {"text": "set"}])
        b, _ = self.make([{"tool_calls": [execute("print(globals().get('x', 'unset'))")]},
                          {"text": "read"}])
        a.chat("set x", display=False)
        out = b.chat("read x", display=False)
        self.assertEqual("".join(m["content"] for m in out if m["type"] == "console").strip(),
                         "unset")
        self.assertNotEqual(a.session, b.session)
        self.assertEqual(len(a.messages), len(b.messages))

    def test_leaving_the_generator_stops_the_code(self):
        i, fm = self.make([{"tool_calls": [execute(
            "import time\nprint('started', flush=True)\ntime.sleep(300)")]},
            {"text": "never reached"}])
        for c in i.chat("sleep", display=False, stream=True):
            if c.get("content") == "started\n" or "started" in str(c.get("content", "")):
                break
        # the kernel's block was interrupted: a run in the same kernel is not queued behind a
        # 300 s sleep, and the model was not asked again
        t0 = time.monotonic()
        r = i.computer.run("python", "print('alive')")
        self.assertIn("alive", "".join(c.get("content", "") for c in r))
        self.assertLess(time.monotonic() - t0, 120)
        self.assertEqual(len(fm.requests()), 1)
        self.assertEqual(i.messages[-1]["role"], "computer")

    def test_stops_in_quick_succession_keep_the_chat(self):
        # each left generator is a stop (SIGINT), never the terminal's "twice to leave"
        i, fm = self.make([{"text": "one " * 50}, {"text": "two " * 50}, {"text": "three"}])
        for msg in ("first", "second"):
            for c in i.chat(msg, display=False, stream=True):
                if c.get("role") == "assistant":
                    break
        out = i.chat("third", display=False)
        self.assertEqual(out[-1]["content"], "three")

    def test_a_file_written_then_read_back(self):
        i, fm = self.make([{"tool_calls": [execute(
            "open('/workspace/note.txt', 'w').write('kept 1234')")]}, {"text": "written"},
            {"tool_calls": [execute("print(open('/workspace/note.txt').read())")]},
            {"text": "read"}])
        i.chat("write a file", display=False)
        out = i.chat("read it", display=False)
        self.assertIn("kept 1234", "".join(m["content"] for m in out if m["type"] == "console"))

    def test_reset_clears_messages_and_the_vm(self):
        i, fm = self.make([{"tool_calls": [execute("y = 5")]}, {"text": "set"}])
        i.chat("set y", display=False)
        first = i.session
        i.reset()
        self.assertEqual(i.messages, [])
        r = i.computer.run("python", "print(globals().get('y', 'gone'))")
        self.assertIn("gone", "".join(c.get("content", "") for c in r))
        self.assertNotEqual(i.session, first)

    def test_images_come_as_base64_png(self):
        i, fm = self.make([{"tool_calls": [execute(
            "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()")]},
            {"text": "plotted"}])
        chunks = list(i.chat("plot", display=False, stream=True))
        images = [c for c in chunks if c["type"] == "image"]
        self.assertEqual(len(images), 1, [c["type"] for c in chunks])
        self.assertEqual(images[0]["format"], "base64.png")
        self.assertTrue(base64.b64decode(images[0]["content"]).startswith(b"\x89PNG\r\n\x1a\n"))

    def test_confirmation_without_auto_run(self):
        i, fm = self.make([{"tool_calls": [execute("open('/tmp/ran', 'w').write('1')")]},
                           {"text": "done"}], auto_run=False)
        out = i.chat("make /tmp/ran", display=False)
        self.assertEqual(out[-1]["type"], "confirmation")
        self.assertEqual(out[-1]["content"]["content"], "open('/tmp/ran', 'w').write('1')")
        self.assertEqual(len(fm.requests()), 1)
        # nothing ran: the VM has no /tmp/ran (asked of the VM itself)
        self.assertNotIn("yes", "".join(
            c.get("content", "") for c in i.computer.run("shell", "test -e /tmp/ran && echo yes")))
        out = i.chat(display=False)  # continue: runs it
        self.assertEqual(out[-1]["content"], "done")
        self.assertIn("yes", "".join(
            c.get("content", "") for c in i.computer.run("shell", "test -e /tmp/ran && echo yes")))

    def test_messages_assigned_restore_the_conversation(self):
        i, fm = self.make([{"text": "you said 1234"}])
        i.messages = [{"role": "user", "type": "message", "content": "remember 1234"},
                      {"role": "assistant", "type": "message", "content": "noted"}]
        i.chat("what did I say?", display=False)
        sent = fm.requests()[-1]["body"]["messages"]
        said = [(m["role"], m["content"]) for m in sent if m["role"] != "system"]
        self.assertEqual(said, [("user", "remember 1234"), ("assistant", "noted"),
                                ("user", "what did I say?")])

    def test_computer_screen_mouse_and_keyboard(self):
        # a session with a display: the screen as PNG, input through the host's tablet and
        # keyboard (tiny: a framebuffer console, no X)
        i, fm = self.make([{"text": "unused"}], computer_use=True)
        i.image = "tiny"
        png = i.computer.display.view()
        self.assertTrue(png.startswith(b"\x89PNG\r\n\x1a\n"))
        w, h = struct.unpack(">II", png[16:24])
        self.assertGreater(w * h, 0)
        i.computer.mouse.move(10, 10)
        i.computer.mouse.click(w - 1, h - 1)
        i.computer.keyboard.write("a")
        with self.assertRaises(RuntimeError) as e:
            i.computer.mouse.click(w + 100, 5)  # off the screen: refused, said
        self.assertIn("action", str(e.exception))

    def test_the_default_instance_is_lazy(self):
        # importing it boots nothing; it is an Interpreter like the others
        self.assertIsInstance(default_interpreter, Interpreter)
        self.assertIsNone(default_interpreter.session)


@unittest.skipUnless(HAVE_DEBIAN, "needs the debian image")
class ServerTest(unittest.TestCase):
    """The same script against airlockd (Interpreter(server=...), the daemon's model and key)
    and locally gives the same messages."""

    def test_same_messages_local_and_on_airlockd(self):
        from test_airlockd import Daemon
        script = [{"text": "Running it.", "tool_calls": [execute("print(6 * 7)")]},
                  {"text": "It printed 42."}, {"text": "You said 1234."}]
        local_fm = FakeModel(script)
        self.addCleanup(local_fm.close)
        local = Interpreter(image=IMAGE, auto_run=True)
        local.llm.model, local.llm.api, local.llm.api_base = "fake-model", "openai", local_fm.base
        local.llm.api_key = KEY
        self.addCleanup(local.reset)
        local.chat("what is 6 * 7?", display=False)

        tmp = tempfile.mkdtemp(prefix="airlockd-oi-")
        self.addCleanup(shutil.rmtree, tmp, True)
        fm, port = altest.start_fake_model(script, tmp)
        self.addCleanup(lambda: (fm.kill(), fm.wait()))
        d = Daemon(model_api="openai", model_api_base="http://127.0.0.1:%d/v1" % port,
                   model="fake")
        self.addCleanup(d.stop)
        remote = Interpreter(image=IMAGE, auto_run=True, server="unix:" + d.sock)
        self.addCleanup(remote.reset)
        remote.chat("what is 6 * 7?", display=False)

        def shape(msgs):
            return [(m["role"], m["type"], m.get("format"), m["content"].strip()) for m in msgs]
        self.assertEqual(shape(remote.messages), shape(local.messages))
        self.assertTrue(remote.session)
        # code without the model, in the daemon's session's kernel
        out = remote.computer.run("python", "print(2 + 2)")
        self.assertIn("4", "".join(c.get("content", "") for c in out
                                   if c.get("format") == "output"))
        # assigned messages replace the daemon's conversation; llm settings go with the turn
        remote.messages = [{"role": "user", "type": "message", "content": "remember 1234"},
                           {"role": "assistant", "type": "message", "content": "noted"}]
        remote.llm.temperature = 0.5
        remote.chat("what did I say?", display=False)
        with open(os.path.join(tmp, "requests.jsonl")) as f:
            sent = [json.loads(l) for l in f if l.strip()][-1]["body"]
        said = [(m["role"], m["content"]) for m in sent["messages"] if m["role"] != "system"]
        self.assertEqual(said, [("user", "remember 1234"), ("assistant", "noted"),
                                ("user", "what did I say?")])
        self.assertEqual(sent["temperature"], 0.5)


if __name__ == "__main__":
    altest.main()

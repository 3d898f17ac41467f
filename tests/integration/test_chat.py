#!/usr/bin/env python3
"""The model loop end to end: the real airlock binary, real VMs (the tiny image) through libvirt,
and a fake model server (tests/fakemodel) that speaks the OpenAI and Anthropic wire formats,
replays a script and records every request it gets."""
import base64
import json
import struct
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
import unittest

import altest

KEY = "sk-test-DO-NOT-LEAK-7f3a"


class FakeModel:
    def __init__(self, replies):
        self.dir = tempfile.mkdtemp(prefix="airlock-chat-test-")
        self.log = os.path.join(self.dir, "requests.jsonl")
        self.proc, self.port = altest.start_fake_model(replies, self.dir)
        self.base = "http://127.0.0.1:%d/v1" % self.port
        # Each test gets its own data and config dirs: conversations, history, profiles.
        self.env = {"XDG_DATA_HOME": os.path.join(self.dir, "data"),
                    "XDG_CONFIG_HOME": os.path.join(self.dir, "config"),
                    "OPENAI_API_KEY": KEY, "ANTHROPIC_API_KEY": KEY}

    def requests(self):
        if not os.path.exists(self.log):
            return []
        with open(self.log) as f:
            return [json.loads(l) for l in f if l.strip()]

    def args(self, *extra, api="openai"):
        base = self.base if api != "anthropic" else "http://127.0.0.1:%d" % self.port
        return ["--image", "tiny", "--api", api, "--api-base", base, "--model", "fake-model",
                "--retries", "1"] + list(extra)

    def conversations(self):
        d = os.path.join(self.env["XDG_DATA_HOME"], "airlock", "conversations")
        out = []
        for n in sorted(os.listdir(d)) if os.path.isdir(d) else []:
            with open(os.path.join(d, n)) as f:
                out.append(json.load(f))
        return out

    def close(self):
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def execute(code, lang="sh", id=None):
    c = {"name": "execute", "arguments": {"language": lang, "code": code}}
    if id:
        c["id"] = id
    return c


def pty_env(fm):
    """The environment of an airlock run on a pseudo-terminal for fake model fm."""
    env = dict(os.environ)
    env.update(fm.env)
    env["AIRLOCK_IMAGE_DIR"] = altest.IMAGE_DIR
    env["TERM"] = "xterm"
    return env


class ChatPty:
    """airlock chat -y on a pseudo-terminal for fake model fm; .out is what it showed so far."""

    def __init__(self, test, fm, yes=True):
        self.test = test
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execve(altest.AIRLOCK, [altest.AIRLOCK, "chat"] + (["-y"] if yes else []) +
                      fm.args(), pty_env(fm))
        self.out = b""

    def say(self, line):
        """Waits for the prompt and types line (Enter included)."""
        self.expect(b"> ")
        os.write(self.fd, line + b"\r")

    def expect(self, needle, timeout=120, since=0):
        """Reads until needle is in what came from since on."""
        end = time.time() + timeout
        while needle not in self.out[since:]:
            left = end - time.time()
            if left <= 0:
                self.test.fail("timed out waiting for %r; got %r" % (needle, self.out[-2000:]))
            if select.select([self.fd], [], [], left)[0]:
                try:
                    self.out += os.read(self.fd, 4096)
                except OSError:
                    self.test.fail("chat ended early; got %r" % self.out[-2000:])


def tool_results(req):
    """The tool results in an OpenAI request body, in order."""
    return [m for m in req["body"]["messages"] if m.get("role") == "tool"]


def process_report(pid):
    """Where a stuck process is: its state, each thread's kernel wait channel and, when gdb is
    there, every thread's stack."""
    lines = []
    try:
        with open("/proc/%d/status" % pid) as f:
            lines += [l.strip() for l in f if l.startswith(("State", "SigPnd", "ShdPnd"))]
        for tid in sorted(os.listdir("/proc/%d/task" % pid)):
            with open("/proc/%d/task/%s/wchan" % (pid, tid)) as f:
                lines.append("thread %s waits in %s" % (tid, f.read().strip() or "-"))
    except OSError as e:
        lines.append("no /proc entry: %s" % e)
    if shutil.which("gdb"):
        try:
            bt = subprocess.run(["gdb", "-batch", "-p", str(pid), "-ex", "thread apply all bt"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                timeout=60).stdout
            lines += [l for l in bt.splitlines() if l.startswith(("#", "Thread"))]
        except (OSError, subprocess.TimeoutExpired) as e:
            lines.append("gdb failed: %s" % e)
    return "\n".join(lines)


class ChatTest(unittest.TestCase):
    def fake(self, replies):
        fm = FakeModel(replies)
        self.addCleanup(fm.close)
        return fm

    def fake_with_workdir(self, replies, files):
        """A fake model and a host directory (fm.dir/work) holding files {name: text}."""
        fm = self.fake(replies)
        wd = os.path.join(fm.dir, "work")
        os.mkdir(wd)
        for name, text in files.items():
            with open(os.path.join(wd, name), "w") as f:
                f.write(text)
        return fm, wd

    def run_airlock(self, fm, args, input=None, timeout=240):
        return altest.run(args, input=input, env=fm.env, timeout=timeout)

    def test_tool_call_runs_in_the_guest_and_output_goes_back(self):
        fm = self.fake([
            {"text": "Let me compute.", "chunk_size": 3,
             "tool_calls": [execute("echo $((6 * 7)); uname -s; echo oops >&2; exit 3",
                                    id="call_A")]},
            {"text": "The answer is 42."},
        ])
        r = self.run_airlock(fm, ["run", "-y"] + fm.args() + ["what is 6*7?"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(b"The answer is 42.", r.stdout)
        reqs = fm.requests()
        self.assertEqual(len(reqs), 2)
        first = reqs[0]["body"]
        self.assertTrue(first["stream"])
        self.assertEqual(reqs[0]["auth"], "Bearer " + KEY)
        tool = first["tools"][0]["function"]
        self.assertEqual(tool["name"], "execute")
        # The language enum is what the session's image offers.
        self.assertIn("sh", tool["parameters"]["properties"]["language"]["enum"])
        self.assertEqual(first["messages"][0]["role"], "system")
        self.assertIn("virtual machine", first["messages"][0]["content"])
        results = tool_results(reqs[1])
        self.assertEqual(len(results), 1)
        self.assertEqual(results[0]["tool_call_id"], "call_A")
        # uname in the guest: the code ran in the VM, and both streams came back.
        self.assertIn("42\nLinux\n", results[0]["content"])
        self.assertIn("oops", results[0]["content"])
        self.assertIn("[exit status 3]", results[0]["content"])
        self.assertIn("[checkpoint 1 was taken before this run]", results[0]["content"])

    def test_stream_edge_cases_end_to_end(self):
        """429 then success, events split across reads, CRLF, keep-alive comments, UTF-8 cut
        mid-character, a tool call whose arguments arrive a byte at a time."""
        text = "Résultat: ✓ — ünïcödé 🙂"
        fm = self.fake([
            {"status": 429, "headers": {"Retry-After": "0"},
             "body": {"error": {"message": "slow down"}}},
            {"tool_calls": [execute("printf 'caf\\303\\251\\n'", id="c1")], "chunk_size": 1,
             "keepalive": True, "line_ending": "\r\n", "write_size": 3},
            {"text": text, "chunk_size": 1, "keepalive": True, "write_size": 5},
        ])
        r = self.run_airlock(fm, ["run", "-y", "--plain"] + fm.args() + ["t"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(text.encode(), r.stdout)
        reqs = fm.requests()
        self.assertEqual(len(reqs), 3)
        self.assertIn("café", tool_results(reqs[2])[0]["content"])

    def test_model_rolls_back_its_own_mistake(self):
        fm = self.fake([
            {"tool_calls": [execute("echo precious > /root/keep; cat /root/keep")]},
            {"tool_calls": [execute("rm -rf /root/keep; ls /root")]},
            {"tool_calls": [{"name": "rollback", "arguments": {"checkpoint": 2}}]},
            {"tool_calls": [execute("cat /root/keep")]},
            {"text": "restored"},
        ])
        r = self.run_airlock(fm, ["run", "-y"] + fm.args() + ["t"])
        self.assertEqual(r.returncode, 0, r.stderr)
        reqs = fm.requests()
        names = [t["function"]["name"] for t in reqs[0]["body"]["tools"]]
        self.assertEqual(names, ["execute", "rollback"])
        self.assertIn("undo your own mistakes", reqs[0]["body"]["messages"][0]["content"])
        self.assertIn("checkpoint 2 was taken before this run", tool_results(reqs[2])[-1]["content"])
        self.assertIn("Rolled the VM back to checkpoint 2", tool_results(reqs[3])[-1]["content"])
        self.assertIn("precious", tool_results(reqs[4])[-1]["content"])
        self.assertIn(b"Rolled the VM back to checkpoint 2", r.stderr)  # the user is told too

    def test_a_crashed_guest_is_rolled_back_and_everyone_is_told(self):
        fm = self.fake([
            {"tool_calls": [execute("echo before > /root/state")]},
            {"tool_calls": [execute("echo after > /root/state; echo c > /proc/sysrq-trigger")]},
            {"tool_calls": [execute("cat /root/state")]},
            {"text": "ok"},
        ])
        r = self.run_airlock(fm, ["run", "-y"] + fm.args() + ["t"])
        self.assertEqual(r.returncode, 0, r.stderr)
        reqs = fm.requests()
        crash = tool_results(reqs[2])[-1]["content"]
        self.assertIn("rolled the VM back to checkpoint 2", crash)
        self.assertIn(b"rolled it back to checkpoint 2", r.stderr)
        self.assertIn("before", tool_results(reqs[3])[-1]["content"])

    def test_undo_reverts_the_vm_and_the_history(self):
        fm = self.fake([
            {"tool_calls": [execute("echo one > /root/f")]}, {"text": "wrote"},
            {"tool_calls": [execute("rm /root/f")]}, {"text": "deleted"},
            {"tool_calls": [execute("cat /root/f")]}, {"text": "read"},
        ])
        r = self.run_airlock(fm, ["chat", "-y", "--plain"] + fm.args(),
                             input=b"write\ndelete\n%undo\n%checkpoints\nread\n")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(b"Rolled the VM back and dropped the last exchange", r.stdout)
        reqs = fm.requests()
        self.assertIn("one", tool_results(reqs[5])[-1]["content"])
        users = [m["content"] for m in reqs[4]["body"]["messages"] if m["role"] == "user"]
        self.assertEqual(users, ["write", "read"])

    def test_anthropic_wire_format(self):
        fm = self.fake([
            {"tool_calls": [execute("echo from-anthropic", id="toolu_1")], "chunk_size": 5},
            {"text": "Done."},
        ])
        r = self.run_airlock(fm, ["run", "-y"] + fm.args(api="anthropic") + ["go"])
        self.assertEqual(r.returncode, 0, r.stderr)
        reqs = fm.requests()
        self.assertEqual(reqs[0]["path"], "/v1/messages")
        self.assertEqual(reqs[0]["auth"], KEY)
        body = reqs[1]["body"]
        self.assertIn("virtual machine", body["system"] if isinstance(body["system"], str)
                      else json.dumps(body["system"]))
        blocks = [b for m in body["messages"] if isinstance(m["content"], list)
                  for b in m["content"]]
        res = [b for b in blocks if b.get("type") == "tool_result"]
        self.assertEqual(res[0]["tool_use_id"], "toolu_1")
        text = res[0]["content"] if isinstance(res[0]["content"], str) else json.dumps(res[0]["content"])
        self.assertIn("from-anthropic", text)

    def test_text_mode_fallback(self):
        fm = self.fake([
            {"text": "Here:\n```sh\necho fenced-$((40 + 2))\n```\nthat is all", "chunk_size": 7},
            {"text": "It printed fenced-42."},
        ])
        r = self.run_airlock(fm, ["run", "-y", "--no-tools"] + fm.args() + ["task"])
        self.assertEqual(r.returncode, 0, r.stderr)
        reqs = fm.requests()
        self.assertNotIn("tools", reqs[0]["body"])
        self.assertIn("fenced code block", reqs[0]["body"]["messages"][0]["content"])
        last = reqs[1]["body"]["messages"][-1]
        self.assertEqual(last["role"], "user")
        self.assertIn("fenced-42", last["content"])

    def test_endpoint_rejecting_tools_switches_to_text_mode(self):
        fm = self.fake([
            {"status": 400, "body": {"error": {"message": "this model does not support tools"}}},
            {"text": "```sh\necho switched\n```"},
            {"text": "ok"},
        ])
        r = self.run_airlock(fm, ["run", "-y"] + fm.args() + ["task"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(b"switching to code blocks", r.stderr)
        reqs = fm.requests()
        self.assertIn("tools", reqs[0]["body"])
        self.assertNotIn("tools", reqs[1]["body"])
        self.assertIn("switched", reqs[2]["body"]["messages"][-1]["content"])

    def test_declined_confirmation_runs_nothing(self):
        fm = self.fake([
            {"tool_calls": [execute("echo should-not-run")]},
            {"text": "never asked"},
        ])
        r = self.run_airlock(fm, ["run"] + fm.args() + ["task"], input=b"n\n")
        self.assertEqual(r.returncode, 4, r.stderr)
        self.assertIn(b"Run this in the sandbox?", r.stderr)
        self.assertNotIn(b"should-not-run\n", r.stdout.replace(b"echo should-not-run", b""))
        self.assertEqual(len(fm.requests()), 1)  # the loop stopped; the model was not asked
        conv = fm.conversations()[0]
        self.assertIn("declined", conv["messages"][-1]["content"])

    def test_confirm_takes_the_key_at_once(self):
        """On a terminal the [y/n/e] prompt takes the key as it is typed (it waited for Enter
        and looked dead); y and Enter together are one answer."""
        fm = self.fake([
            {"tool_calls": [execute("echo ran-$((6*7))")]},
            {"tool_calls": [execute("echo again-$((6*7))")]},
            {"text": "done"},
        ])
        c = ChatPty(self, fm, yes=False)
        self.addCleanup(altest.reap_pty, c.pid, c.fd)
        c.say(b"go")
        c.expect(b"[y/n/e] ")
        at = len(c.out)
        os.write(c.fd, b"y")  # no Enter
        c.expect(b"ran-42", since=at)
        at = len(c.out)
        c.expect(b"[y/n/e] ", since=at)
        os.write(c.fd, b"y\r")
        c.expect(b"again-42", since=at)
        c.expect(b"done", since=at)
        at = len(c.out)
        c.expect(b"> ", since=at)  # the Enter went with the y, not to this prompt
        self.assertNotIn(b"[y/n/e]", c.out[at:])
        self.assertEqual(len(fm.requests()), 3)
        os.write(c.fd, b"\x04")

    def test_leaving_offers_the_workspace(self):
        """Without --workdir, files the chat made in /workspace are not dropped without a word:
        %get copies one out, and Ctrl-D says what /workspace holds and offers to copy it."""
        fm = self.fake([{"text": "unused"}])
        here = tempfile.mkdtemp(prefix="airlock-chat-cwd-")
        self.addCleanup(shutil.rmtree, here, ignore_errors=True)
        pid, fd = pty.fork()
        if pid == 0:
            os.chdir(here)
            os.execve(altest.AIRLOCK, [altest.AIRLOCK, "chat", "--plain"] + fm.args(),
                      pty_env(fm))
        self.addCleanup(altest.reap_pty, pid, fd)
        c = ChatPty.__new__(ChatPty)
        c.test, c.pid, c.fd, c.out = self, pid, fd, b""
        c.say(b"%help")
        c.expect(b"airlock cp")
        c.say(b"%% mkdir -p /workspace/sub && echo precious > /workspace/report.txt && "
              b"echo deep > /workspace/sub/d.txt")
        c.say(b"%get /workspace/report.txt " + here.encode())
        c.expect(b"Copied /workspace/report.txt")
        with open(os.path.join(here, "report.txt")) as f:
            self.assertEqual(f.read(), "precious\n")
        # the prompt after it, as a person waits for it (a key typed while the line editor
        # sets the terminal up may be flushed)
        c.expect(b"> ", since=c.out.rfind(b"Copied /workspace/report.txt"))
        time.sleep(0.5)
        at = len(c.out)
        os.write(fd, b"\x04")
        c.expect(b"/workspace holds 2 entries", since=at)
        c.expect(b"[d]rop them? ", since=at)
        os.write(fd, b"c")
        c.expect(b"Copied /workspace to airlock-", since=at)
        got = [b""]
        self.assertEqual(self.wait_exit(pid, fd, got), 0, (c.out + got[0])[-2000:])
        kept = [d for d in os.listdir(here) if d.startswith("airlock-")]
        self.assertEqual(len(kept), 1, os.listdir(here))
        with open(os.path.join(here, kept[0], "sub", "d.txt")) as f:
            self.assertEqual(f.read(), "deep\n")

    def test_max_turns(self):
        fm = self.fake([{"tool_calls": [execute("echo turn %d" % i)]} for i in range(5)])
        r = self.run_airlock(fm, ["run", "-y", "--max-turns", "2"] + fm.args() + ["loop"])
        self.assertEqual(r.returncode, 3, r.stderr)
        self.assertIn(b"max-turns", r.stderr)
        self.assertEqual(len(fm.requests()), 2)

    def test_repeated_code_with_same_result_stops(self):
        fm = self.fake([{"tool_calls": [execute("echo same")]} for _ in range(6)])
        r = self.run_airlock(fm, ["run", "-y"] + fm.args() + ["loop"])
        self.assertEqual(r.returncode, 3, r.stderr)
        self.assertIn(b"same code again with the same result", r.stderr)
        self.assertEqual(len(fm.requests()), 2)

    def test_truncation_below_at_and_above_the_limit(self):
        limit = 1000
        sizes = [limit - 1, limit, limit + 1, 5 * limit]
        # Each run prints exactly n bytes: a known pattern whose head and tail we can predict.
        calls = [execute("i=0; while [ $i -lt %d ]; do printf '%%09d\\n' $i; i=$((i+1)); done"
                         " | head -c %d" % (n, n), id="c%d" % n) for n in sizes]
        fm = self.fake([{"tool_calls": calls}, {"text": "done"}])
        r = self.run_airlock(fm, ["run", "-y", "--max-output", str(limit)] + fm.args() + ["t"])
        self.assertEqual(r.returncode, 0, r.stderr)
        results = tool_results(fm.requests()[1])
        self.assertEqual(len(results), 4)
        for n, res in zip(sizes, results):
            full = "".join("%09d\n" % i for i in range(n))[:n]
            body = res["content"].rsplit("[exit status", 1)[0]
            if n <= limit:
                self.assertEqual(body.rstrip("\n"), full.rstrip("\n"), n)
                self.assertNotIn("omitted", res["content"])
            else:
                self.assertTrue(body.startswith(full[:limit // 2]), n)
                self.assertIn("[... %d bytes omitted ...]" % (n - limit), body)
                self.assertTrue(body.rstrip("\n").endswith(full[-(limit // 2):].rstrip("\n")), n)

    def test_unknown_language_and_bad_arguments_go_back_to_the_model(self):
        fm = self.fake([
            {"tool_calls": [{"name": "execute", "arguments": {"language": "cobol", "code": "x"}},
                            {"name": "execute", "arguments": "{not json"},
                            {"name": "execute", "arguments": {"language": "sh"}}]},
            {"text": "sorry"},
        ])
        r = self.run_airlock(fm, ["run", "-y"] + fm.args() + ["t"])
        self.assertEqual(r.returncode, 0, r.stderr)
        res = [m["content"] for m in tool_results(fm.requests()[1])]
        self.assertIn("unknown language 'cobol'", res[0])
        self.assertIn("not a JSON object", res[1])
        self.assertIn("no code given", res[2])

    def test_a_program_waiting_for_input_is_stopped_and_the_model_told(self):
        fm = self.fake([{"tool_calls": [execute("echo asking; read answer; echo got $answer")]},
                        {"text": "I see, no input."}])
        r = self.run_airlock(fm, ["run", "-y"] + fm.args() + ["t"])
        self.assertEqual(r.returncode, 0, r.stderr)
        res = tool_results(fm.requests()[1])[0]["content"]
        self.assertIn("asking", res)
        self.assertIn("waited for input", res)
        self.assertNotIn("got", res)

    def test_key_never_reaches_the_vm_or_the_saved_conversation(self):
        fm = self.fake([{"tool_calls": [execute("env; cat /proc/cmdline")]}, {"text": "ok"}])
        r = self.run_airlock(fm, ["run", "-y", "--json"] + fm.args() + ["show env"])
        self.assertEqual(r.returncode, 0, r.stderr)
        out = tool_results(fm.requests()[1])[0]["content"]
        self.assertIn("PATH=", out)  # env did run
        self.assertNotIn(KEY, out)
        self.assertNotIn(KEY.encode(), r.stdout + r.stderr)
        d = os.path.join(fm.env["XDG_DATA_HOME"], "airlock")
        for root, _, files in os.walk(d):
            for f in files:
                with open(os.path.join(root, f), "rb") as fh:
                    self.assertNotIn(KEY.encode(), fh.read(), f)

    def test_run_to_a_pipe_keeps_each_part_on_its_lines(self):
        # The model's text, its code, the run's output (without a final newline) and the
        # closing text: each begins on a line of its own, and the end has its newline.
        fm = self.fake([{"text": "Let me look.", "tool_calls": [execute("printf hi")]},
                        {"text": "It printed hi."}])
        r = self.run_airlock(fm, ["run", "-y"] + fm.args() + ["look"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, b"Let me look.\n```sh\nprintf hi\n```\nhi\nIt printed hi.\n")

    def test_no_network_is_said_to_the_user_and_the_model(self):
        fm = self.fake([{"tool_calls": [execute("wget -q http://pypi.org/simple/")]},
                        {"text": "no network"}])
        r = self.run_airlock(fm, ["run", "-y"] + fm.args() + ["fetch it"])
        self.assertEqual(r.returncode, 0, r.stderr)
        said = ("this session has no network (no NIC, no resolver): nothing outside the VM can "
                "be reached; only the user can allow hosts (airlock: --net allow=HOST,...; pip "
                "needs --net allow=pypi.org,files.pythonhosted.org)")
        self.assertIn(said.encode(), r.stderr + r.stdout)
        res = tool_results(fm.requests()[1])[0]["content"]
        self.assertIn("[exit status 1]\n[" + said + "]", res)

    def test_workdir_in_and_changes_synced_back(self):
        fm, wd = self.fake_with_workdir(
            [{"tool_calls": [execute("cd /workspace && cat in.txt && "
                                     "tr a-z A-Z < in.txt > out.txt && rm in.txt")]},
             {"text": "converted"}],
            {"in.txt": "hello workdir\n"})
        r = self.run_airlock(fm, ["run", "-y", "--workdir", wd, "--sync-back", "yes"] +
                             fm.args() + ["convert"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("hello workdir", tool_results(fm.requests()[1])[0]["content"])
        self.assertIn(b"added", r.stderr)
        # The run's new file is listed for the user and the model.
        self.assertIn("files written by this run:\n/workspace/out.txt\n]",
                      tool_results(fm.requests()[1])[0]["content"])
        self.assertEqual(sorted(os.listdir(wd)), ["out.txt"])
        with open(os.path.join(wd, "out.txt")) as f:
            self.assertEqual(f.read(), "HELLO WORKDIR\n")

    def test_runs_start_in_workspace_and_list_only_their_own_files(self):
        # Relative paths: the run starts where the user's files are. The files copied in are
        # not the run's, even though they landed a moment before it.
        fm, wd = self.fake_with_workdir(
            [{"tool_calls": [execute("pwd; cat sales.csv; wc -l < sales.csv > count.txt")]},
             {"text": "counted"}],
            {"sales.csv": "region,amount\nnorth,10\nsouth,20\n", "notes.txt": "untouched\n"})
        r = self.run_airlock(fm, ["run", "-y", "--workdir", wd, "--sync-back", "yes"] +
                             fm.args() + ["count the sales"])
        self.assertEqual(r.returncode, 0, r.stderr)
        res = tool_results(fm.requests()[1])[0]["content"]
        self.assertIn("/workspace\nregion,amount\nnorth,10", res)
        self.assertIn("[exit status 0]", res)
        self.assertIn("[files written by this run:\n/workspace/count.txt\n]", res)
        self.assertIn("Every run starts in /workspace",
                      fm.requests()[0]["body"]["messages"][0]["content"])
        self.assertEqual(sorted(os.listdir(wd)), ["count.txt", "notes.txt", "sales.csv"])
        with open(os.path.join(wd, "count.txt")) as f:
            self.assertEqual(f.read().strip(), "3")

    def test_chat_runs_start_in_workspace(self):
        fm, wd = self.fake_with_workdir(
            [{"tool_calls": [execute("cat sales.csv; echo done > done.txt")]},
             {"text": "read it"}],
            {"sales.csv": "north,10\n"})
        r = self.run_airlock(fm, ["chat", "-y", "--plain", "--workdir", wd, "--sync-back", "yes"]
                             + fm.args(), input=b"read the sales\n")
        self.assertEqual(r.returncode, 0, r.stderr)
        res = tool_results(fm.requests()[1])[0]["content"]
        self.assertTrue(res.startswith("north,10\n[exit status 0]"), res)
        self.assertIn("[files written by this run:\n/workspace/done.txt\n]", res)
        self.assertEqual(sorted(os.listdir(wd)), ["done.txt", "sales.csv"])

    def test_runs_start_in_workspace_without_workdir(self):
        fm = self.fake([{"tool_calls": [execute("pwd; echo hi > rel.txt")]}, {"text": "ok"}])
        r = self.run_airlock(fm, ["run", "-y"] + fm.args() + ["t"])
        self.assertEqual(r.returncode, 0, r.stderr)
        res = tool_results(fm.requests()[1])[0]["content"]
        self.assertTrue(res.startswith("/workspace\n"), res)
        self.assertIn("[files written by this run:\n/workspace/rel.txt\n]", res)

    def test_json_lines(self):
        fm = self.fake([{"text": "Running.", "tool_calls": [execute("echo hi")]},
                        {"text": "Said hi."}])
        r = self.run_airlock(fm, ["run", "-y", "--json"] + fm.args() + ["say hi"])
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = [json.loads(l) for l in r.stdout.splitlines()]
        kinds = [(l["role"], l["type"]) for l in lines]
        self.assertEqual(kinds, [("user", "message"), ("assistant", "message"),
                                 ("assistant", "code"), ("computer", "output"),
                                 ("assistant", "message"), ("airlock", "end")])
        self.assertEqual(lines[2]["language"], "sh")
        self.assertIn("hi\n", lines[3]["content"])
        self.assertEqual(lines[-1]["content"], "done")

    def test_no_key_for_a_hosted_model(self):
        fm = self.fake([])
        env = dict(fm.env)
        env["OPENAI_API_KEY"] = ""
        r = altest.run(["run", "-y", "--image", "tiny", "--model", "gpt-4o", "task"], env=env)
        self.assertEqual(r.returncode, 1)
        self.assertIn(b"OPENAI_API_KEY", r.stderr)

    def test_model_checked_before_booting(self):
        # Each said in one line with what to do, before a VM boots (through a libvirt nobody
        # can reach, booting first would say "cannot reach libvirt").
        fm = self.fake([])
        env = dict(fm.env, OPENAI_API_KEY="", ANTHROPIC_API_KEY="")
        nowhere = ["--connect", "qemu+unix:///system?socket=/nonexistent"]
        for args, said in [
                (["run", "-y", "--image", "tiny", "task"],
                 b"airlock: no API key for the hosted model API at https://api.openai.com/v1: "
                 b"set OPENAI_API_KEY; or --api-key-file FILE; or --local for a server on this "
                 b"machine (ollama); or --api-base URL"),
                (["run", "-y", "--image", "tiny", "--local", "task"],
                 b"airlock: no model server answers at http://localhost:11434/v1 (Couldn't "
                 b"connect to server); start it ('ollama serve', then 'ollama pull MODEL'), or "
                 b"use --local llamacpp|lmstudio or --api-base URL"),
                (["chat", "--image", "tiny", "--api-base", "http://127.0.0.1:9/v1"],
                 b"airlock: no model server answers at http://127.0.0.1:9/v1 (Couldn't connect "
                 b"to server); is the server at --api-base running?")]:
            r = altest.run(nowhere + args, env=env)
            self.assertEqual((r.returncode, r.stderr.strip().splitlines()), (1, [said]), args)

    def test_unreachable_endpoint(self):
        fm = self.fake([])
        r = self.run_airlock(fm, ["run", "-y", "--image", "tiny", "--api-base",
                                  "http://127.0.0.1:9/v1", "--retries", "0", "task"])
        self.assertEqual(r.returncode, 1)
        self.assertEqual(len(r.stderr.strip().splitlines()[-1:]), 1)
        self.assertIn(b"127.0.0.1:9", r.stderr)

    def test_context_window_too_small(self):
        fm = self.fake([{"text": "unreachable"}])
        r = self.run_airlock(fm, ["run", "-y", "--context-window", "20"] + fm.args() + ["t"])
        self.assertEqual(r.returncode, 1)
        self.assertIn(b"context window (20 tokens) is too small", r.stderr)
        self.assertEqual(fm.requests(), [])

    def test_chat_errors_keep_the_session_and_conversation(self):
        """In a chat, a malformed model reply is one message; the next message works in the
        same VM (the file written before is still there) and the saved history kept both."""
        fm = self.fake([
            {"tool_calls": [execute("echo kept > /tmp/state")]},
            {"text": "wrote it"},
            {"raw": "data: {not json\n\n"},
            {"tool_calls": [execute("cat /tmp/state")]},
            {"text": "read it"},
        ])
        r = self.run_airlock(fm, ["chat", "-y", "--plain"] + fm.args("--retries", "0"),
                             input=b"write\nbroken\nread\n")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(b"airlock: ", r.stderr)
        reqs = fm.requests()
        self.assertEqual(len(reqs), 5)
        self.assertIn("kept", tool_results(reqs[4])[-1]["content"])
        conv = fm.conversations()
        self.assertEqual(len(conv), 1)
        users = [m["content"] for m in conv[0]["messages"] if m["role"] == "user"]
        self.assertEqual(users, ["write", "broken", "read"])

    def test_magic_commands_and_resume(self):
        fm = self.fake([{"text": "first answer"}, {"text": "second answer"},
                        {"text": "resumed answer"}])
        r = self.run_airlock(fm, ["chat", "--plain"] + fm.args(),
                             input=b"one\ntwo\n%undo\n%tokens\n%% echo direct-$((1+1))\n"
                                   b"%markdown\n%help\n")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(b"Dropped the last exchange", r.stdout)
        self.assertIn(b"Tokens this session: 20 in, 10 out", r.stdout)
        self.assertIn(b"direct-2", r.stdout)
        self.assertIn(b"## User\n\none", r.stdout)
        self.assertNotIn(b"## User\n\ntwo", r.stdout)
        convs = fm.conversations()
        self.assertEqual(len(convs), 1)
        cid = convs[0]["id"]
        ls = self.run_airlock(fm, ["conversations"])
        self.assertIn(cid.encode(), ls.stdout)
        r = self.run_airlock(fm, ["--resume", cid, "--plain"] + fm.args(), input=b"three\n")
        self.assertEqual(r.returncode, 0, r.stderr)
        # Where the conversation ended, before the first question.
        self.assertIn(b"Where it ended:\n  you:   one\n  model: first answer\n", r.stdout)
        msgs = fm.requests()[2]["body"]["messages"]
        self.assertEqual([m["content"] for m in msgs if m["role"] == "user"], ["one", "three"])
        self.assertEqual(len(fm.conversations()), 1)  # continued in the same file

    def test_profile_and_flags_override_it(self):
        fm = self.fake([{"text": "a"}, {"text": "b"}])
        pdir = os.path.join(fm.env["XDG_CONFIG_HOME"], "airlock", "profiles")
        os.makedirs(pdir)
        with open(os.path.join(pdir, "work.yaml"), "w") as f:
            f.write("# hand-written\nmodel: profile-model\napi_base: %s\ntemperature: 0.25\n"
                    "instructions: |\n  Always answer in French.\n" % fm.base)
        r = self.run_airlock(fm, ["run", "--image", "tiny", "--profile", "work", "q"])
        self.assertEqual(r.returncode, 0, r.stderr)
        r = self.run_airlock(fm, ["run", "--image", "tiny", "--profile", "work", "--model",
                                  "flag-model", "q"])
        self.assertEqual(r.returncode, 0, r.stderr)
        b0, b1 = (q["body"] for q in fm.requests())
        self.assertEqual(b0["model"], "profile-model")
        self.assertEqual(b0["temperature"], 0.25)
        self.assertIn("Always answer in French.", b0["messages"][0]["content"])
        self.assertEqual(b1["model"], "flag-model")

    def test_debian_kernels_keep_state_and_figures_come_back(self):
        # A figure is an image/png result: saved to the outputs directory, named in the tool
        # result, and with --vision sent to the model as an image, scaled to 1024 px a side.
        fig = ("import matplotlib.pyplot as plt\nplt.figure(figsize=(24, 12), dpi=100)\n"
               "plt.plot([1, 2, 3], [x, x + 1, x + 2])\nplt.show()")
        fm = self.fake([
            {"tool_calls": [execute("x = 41", lang="python")]},
            {"tool_calls": [execute("x + 1", lang="python")]},
            {"tool_calls": [execute(fig, lang="python")]},
            {"tool_calls": [execute("cd /tmp && export V=7", lang="shell")]},
            {"tool_calls": [execute("echo $PWD $V", lang="shell")]},
            {"tool_calls": [execute("def f():\n    return 1 / 0\nf()", lang="python")]},
            {"text": "done"},
        ])
        args = [a if a != "tiny" else "debian" for a in fm.args("--vision")]
        r = self.run_airlock(fm, ["run", "-y", "--json"] + args + ["t"], timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr)
        reqs = fm.requests()
        enum = reqs[0]["body"]["tools"][0]["function"]["parameters"]["properties"]["language"]["enum"]
        self.assertEqual(sorted(enum), ["javascript", "python", "shell"])
        self.assertIn("42", tool_results(reqs[2])[-1]["content"])
        outs = os.path.join(fm.env["XDG_DATA_HOME"], "airlock", "outputs")
        pngs = os.listdir(outs)
        self.assertEqual(len(pngs), 1)
        content = tool_results(reqs[3])[-1]["content"]
        self.assertIn("[image/png 2400x1200 saved: %s" % os.path.join(outs, pngs[0]), content)
        self.assertIn("attached as an image, 1024x512", content)
        with open(os.path.join(outs, pngs[0]), "rb") as f:
            self.assertEqual(f.read(24)[16:24], struct.pack(">II", 2400, 1200))
        # The image follows the tool result as a user message with a data URL, scaled down.
        msgs = reqs[3]["body"]["messages"]
        self.assertEqual(msgs[-1]["role"], "user", msgs[-1])
        urls = [p["image_url"]["url"] for p in msgs[-1]["content"] if p["type"] == "image_url"]
        self.assertEqual(len(urls), 1)
        self.assertTrue(urls[0].startswith("data:image/png;base64,"))
        sent = base64.b64decode(urls[0].split(",", 1)[1])
        self.assertEqual(sent[:8], b"\x89PNG\r\n\x1a\n")
        self.assertEqual(struct.unpack(">II", sent[16:24]), (1024, 512))
        # Not again in the next request's new messages: only that run's result carries it.
        self.assertEqual(sum(1 for m in reqs[4]["body"]["messages"]
                             if isinstance(m.get("content"), list)), 1)
        self.assertIn("/tmp 7", tool_results(reqs[5])[-1]["content"])
        # An exception: "name: value" and the traceback's end, for the model.
        self.assertIn("[error] ZeroDivisionError: division by zero\n",
                      tool_results(reqs[6])[-1]["content"])
        self.assertIn("return 1 / 0", tool_results(reqs[6])[-1]["content"])
        # run --json carries the structured results.
        events = [json.loads(l) for l in r.stdout.splitlines() if l.strip()]
        results = [e["content"] for e in events if e["type"] == "result"]
        self.assertIn({"type": "result", "kind": "value", "data": {"text/plain": "42"}},
                      [{k: v for k, v in x.items() if k != "execution_count"} for x in results])
        self.assertIn("ZeroDivisionError", [x.get("name") for x in results])

    def test_figures_are_bounded_and_checked(self):
        # What a run leaves in the figures directory comes out only as a real image of its
        # kind, at most 20 MiB each and 100 MiB per session (orchestrator/chat/figures.c).
        # Sparse files: the guest's tmpfs holds none of the zeros, the copy sends them all.
        png = r"printf '\211PNG\r\n\032\n' > "
        first = ("mkdir -p /tmp/airlock-outputs && cd /tmp/airlock-outputs && " + png + "ok.png"
                 " && head -c 1000 /dev/zero >> ok.png && chmod 755 ok.png && " + png + "big.png"
                 " && truncate -s 21M big.png && echo 'not an image' > fake.png && "
                 "printf '#!/bin/sh\\necho hi\\n' > run.svg && sleep 2")
        # (busybox's find compares whole seconds: the sleep keeps these out of the next list)
        second = ("cd /tmp/airlock-outputs && for i in 1 2 3 4 5 6; do " + png + "f$i.png && "
                  "truncate -s 19M f$i.png; done; echo done")
        fm = self.fake([{"tool_calls": [execute(first)]}, {"tool_calls": [execute(second)]},
                        {"text": "ok"}])
        r = self.run_airlock(fm, ["run", "-y"] + fm.args() + ["plot"])
        self.assertEqual(r.returncode, 0, r.stderr)
        err = r.stderr.decode()
        self.assertIn("figure /tmp/airlock-outputs/big.png not copied: over the limit of 20 MiB "
                      "per figure", err)
        self.assertIn("figure /tmp/airlock-outputs/fake.png not copied: its bytes are not a png "
                      "image", err)
        self.assertIn("figure /tmp/airlock-outputs/run.svg not copied: its bytes are not a svg "
                      "image", err)
        self.assertEqual(err.count(".png not copied: over what is left of this session's "
                                   "100 MiB of figures"), 1, err)
        # The model is told too.
        reqs = fm.requests()
        self.assertIn("(figure not copied: over the limit of 20 MiB per figure)",
                      tool_results(reqs[1])[-1]["content"])
        self.assertIn("(figure not copied: over what is left",
                      tool_results(reqs[2])[-1]["content"])
        outs = os.path.join(fm.env["XDG_DATA_HOME"], "airlock", "outputs")
        files = sorted(os.listdir(outs))
        self.assertEqual(len(files), 6, files)  # ok.png and five of the six; no temporaries
        sizes = sorted(os.path.getsize(os.path.join(outs, f)) for f in files)
        self.assertEqual(sizes, [1008] + [19 << 20] * 5)
        for f in files:
            self.assertTrue(f.startswith("airlock-") and f.endswith(".png"), f)
            path = os.path.join(outs, f)
            self.assertEqual(os.stat(path).st_mode & 0o777, 0o644)
            with open(path, "rb") as fh:
                self.assertEqual(fh.read(8), b"\x89PNG\r\n\x1a\n")

    def test_debian_kernels_start_in_workspace_and_a_timeout_is_the_models_to_handle(self):
        # The shell run makes every later python start take 5 s, more than --run-timeout: a
        # kernel's start must not count against the run. A block that exceeds the timeout is
        # interrupted, the model gets its output and the note, the loop goes on, and the next
        # run still sees the kernel's variables. Every kernel starts in /workspace.
        slow = ("echo 'import time; time.sleep(5)' > "
                "/usr/lib/python3/dist-packages/airlock-slow-start.pth; pwd")
        first = ("import os\nprint(os.getcwd())\nprint(open('sales.csv').read().strip())\n"
                 "open('out.txt', 'w').write('from python\\n')\nx = 5")
        fm, wd = self.fake_with_workdir([
            {"tool_calls": [execute(slow, lang="shell")]},
            {"tool_calls": [execute(first, lang="python")]},
            {"tool_calls": [execute("print('looping', flush=True)\nwhile True: pass",
                                    lang="python")]},
            {"tool_calls": [execute("print(x + 1)", lang="python")]},
            {"tool_calls": [execute("process.cwd()", lang="javascript")]},
            {"text": "done"},
        ], {"sales.csv": "north,10\n"})
        args = [a if a != "tiny" else "debian" for a in fm.args()]
        r = self.run_airlock(fm, ["run", "-y", "--run-timeout", "3", "--workdir", wd,
                                  "--sync-back", "yes"] + args + ["t"], timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr)
        reqs = fm.requests()
        self.assertEqual(len(reqs), 6, r.stderr)
        res = [tool_results(q)[-1]["content"] for q in reqs[1:]]
        self.assertTrue(res[0].startswith("/workspace\n"), res[0])
        self.assertIn("/workspace\nnorth,10\n", res[1])
        self.assertIn("[exit status 0]", res[1])
        self.assertIn("[files written by this run:\n/workspace/out.txt\n]", res[1])
        self.assertIn("looping", res[2])
        self.assertIn("KeyboardInterrupt", res[2])
        self.assertIn("[stopped: the run exceeded 3 s]", res[2])
        self.assertNotIn("python.py", res[2])
        self.assertIn("6\n[exit status 0]", res[3])
        self.assertIn("'/workspace'", res[4])
        self.assertIn("interrupted after 3 s", reqs[0]["body"]["messages"][0]["content"])
        with open(os.path.join(wd, "out.txt")) as f:
            self.assertEqual(f.read(), "from python\n")

    def test_chat_over_ssh_keeps_kernel_state(self):
        # The sshd image has no agent: the chat reaches it over SSH
        # (orchestrator/transport/ssh.c), and the languages the model is offered come from the
        # agent copied in.
        fm = self.fake([
            {"tool_calls": [execute("x = 41", lang="python")]},
            {"tool_calls": [execute("print(x + 1)", lang="python")]},
            {"tool_calls": [execute("cd /tmp && export V=7", lang="shell")]},
            {"tool_calls": [execute("echo $PWD $V", lang="shell")]},
            {"text": "done"},
        ])
        args = [a if a != "tiny" else "sshd" for a in fm.args()]
        r = self.run_airlock(fm, ["run", "-y", "--transport", "ssh"] + args + ["t"],
                             timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr)
        reqs = fm.requests()
        enum = reqs[0]["body"]["tools"][0]["function"]["parameters"]["properties"]["language"]["enum"]
        self.assertEqual(sorted(enum), ["javascript", "python", "shell"])
        self.assertIn("42", tool_results(reqs[2])[-1]["content"])
        self.assertIn("/tmp 7", tool_results(reqs[4])[-1]["content"])

    def test_debian_image_results_shown_inline_on_kitty(self):
        # On a terminal that says it is kitty, a PNG result is shown inline (the graphics
        # protocol, base64 only) before the line that names where it was saved.
        png = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU"
               "5ErkJggg==")
        code = ("import base64\nfrom IPython.display import Image\n"
                "display(Image(data=base64.b64decode('%s')))" % png)
        fm = self.fake([{"tool_calls": [execute(code, lang="python")]}, {"text": "done"}])
        env = dict(os.environ)
        env.update(fm.env)
        env["AIRLOCK_IMAGE_DIR"] = altest.IMAGE_DIR
        env.update(TERM="xterm-kitty", KITTY_WINDOW_ID="1")
        env.pop("TMUX", None)
        args = [a if a != "tiny" else "debian" for a in fm.args()]
        pid, fd = pty.fork()
        if pid == 0:
            os.execve(altest.AIRLOCK, [altest.AIRLOCK, "run", "-y"] + args + ["t"], env)
        out, status = b"", None
        try:
            end = time.time() + 300
            while time.time() < end:
                if select.select([fd], [], [], 1)[0]:
                    try:
                        b = os.read(fd, 65536)
                    except OSError:
                        break
                    if not b:
                        break
                    out += b
            _, status = os.waitpid(pid, 0)
        finally:
            altest.reap_pty(pid, fd)
        self.assertEqual(os.waitstatus_to_exitcode(status), 0, out[-2000:])
        # The kernel's first start is not silence: the spinner says what is waited for.
        self.assertIn(b"Starting the python kernel (its first run in this session)", out)
        shown = out.find(b"\x1b_Gf=100,a=T,m=0;" + png.encode() + b"\x1b\\")
        saved = out.find(b"[image/png 1x1 saved: ")
        self.assertGreaterEqual(shown, 0, out[-2000:])
        self.assertGreater(saved, shown, out[-2000:])

    def chat_on_pty(self, fm, wd):
        """airlock chat --workdir wd on a pseudo-terminal, after one turn whose run wrote
        out.txt in /workspace: (pid, fd, expect, output so far)."""
        env = pty_env(fm)
        pid, fd = pty.fork()
        if pid == 0:
            os.execve(altest.AIRLOCK, [altest.AIRLOCK, "chat", "-y", "--plain", "--workdir", wd]
                      + fm.args(), env)
        self.addCleanup(altest.reap_pty, pid, fd)
        got = [b""]

        def expect(needle, timeout=120):
            end = time.time() + timeout
            while needle not in got[0]:
                left = end - time.time()
                if left <= 0:
                    self.fail("timed out waiting for %r; got %r" % (needle, got[0][-2000:]))
                if select.select([fd], [], [], left)[0]:
                    try:
                        b = os.read(fd, 4096)
                    except OSError:
                        b = b""
                    if not b:
                        self.fail("chat ended waiting for %r; got %r" % (needle, got[0][-2000:]))
                    got[0] += b
        expect(b"> ")
        os.write(fd, b"write it\r")
        expect(b"written")
        expect(b"> ")
        return pid, fd, expect, got

    def workdir_fake(self):
        return self.fake_with_workdir(
            [{"tool_calls": [execute("echo result > /workspace/out.txt")]}, {"text": "written"}],
            {"in.txt": "x\n"})

    def wait_exit(self, pid, fd, got, timeout=120):
        end = time.time() + timeout
        while time.time() < end:
            wpid, status = os.waitpid(pid, os.WNOHANG)
            if wpid:
                return os.waitstatus_to_exitcode(status)
            try:
                if select.select([fd], [], [], 0.2)[0]:
                    got[0] += os.read(fd, 4096)
            except OSError:
                pass
        self.fail("chat did not exit; got %r" % got[0][-2000:])

    def kept_file(self, got, wd, why):
        """The tar the chat said it kept the changes in (why: its reason), checked private;
        the bytes of out.txt in it."""
        m = re.search(rb"changes not applied to (\S+) \(%s\); the guest's /workspace is kept "
                      rb"in (\S+) " % re.escape(why), got)
        self.assertTrue(m, got[-2000:])
        self.assertEqual(m.group(1), wd.encode())
        kept = m.group(2).decode()
        self.addCleanup(os.unlink, kept)
        self.assertEqual(os.stat(kept).st_mode & 0o777, 0o600)
        self.assertEqual(os.stat(os.path.dirname(kept)).st_mode & 0o777, 0o700)
        with tarfile.open(kept) as t:
            names = [n.lstrip("./") for n in t.getnames()]
            self.assertIn("out.txt", names)
            return t.extractfile(t.getmember(t.getnames()[names.index("out.txt")])).read()

    def test_ctrl_c_twice_offers_the_review(self):
        # The documented way out: the second Ctrl-C no longer reaches the guest's tar; the
        # review is offered, and the run's file reaches the directory.
        fm, wd = self.workdir_fake()
        pid, fd, expect, got = self.chat_on_pty(fm, wd)
        os.write(fd, b"\x03")
        time.sleep(0.2)
        os.write(fd, b"\x03")
        expect(b"Apply these changes to %s? [y/N] " % wd.encode())
        self.assertIn(b"added     out.txt", got[0])
        self.assertNotIn(b"tar in the guest failed", got[0])
        os.write(fd, b"y\r")
        # left by Ctrl-C twice: 130, as a shell reports SIGINT
        self.assertEqual(self.wait_exit(pid, fd, got), 130, got[0][-2000:])
        with open(os.path.join(wd, "out.txt")) as f:
            self.assertEqual(f.read(), "result\n")

    def test_more_ctrl_c_on_the_way_out_loses_nothing(self):
        # Ctrl-C pressed on while the chat copies the changes back, or at the question: the
        # copy is never cut (the signal never reaches the guest's tar), and the changes end
        # either applied (the question answered) or kept (Ctrl-C was the answer).
        fm, wd = self.workdir_fake()
        pid, fd, expect, got = self.chat_on_pty(fm, wd)
        for _ in range(5):
            os.write(fd, b"\x03")
            time.sleep(0.15)
        expect(b"Apply these changes to %s? [y/N] " % wd.encode())
        time.sleep(0.5)
        os.write(fd, b"y\r")
        self.assertEqual(self.wait_exit(pid, fd, got), 130, got[0][-2000:])
        self.assertNotIn(b"tar in the guest failed", got[0])
        if os.path.exists(os.path.join(wd, "out.txt")):
            with open(os.path.join(wd, "out.txt")) as f:
                self.assertEqual(f.read(), "result\n")
        else:
            self.assertEqual(self.kept_file(got[0], wd, b"no answer"), b"result\n")

    def test_sigterm_keeps_the_changes_it_cannot_ask_about(self):
        fm, wd = self.workdir_fake()
        pid, fd, expect, got = self.chat_on_pty(fm, wd)
        os.kill(pid, signal.SIGTERM)
        self.wait_exit(pid, fd, got)
        self.assertNotIn(b"Apply these changes", got[0])
        self.assertEqual(self.kept_file(got[0], wd, b"ended by a signal, nobody to ask"),
                         b"result\n")
        self.assertEqual(sorted(os.listdir(wd)), ["in.txt"])  # nothing applied

    def test_shell_into_the_chats_vm(self):
        # %shell in the chat, and airlock shell NAME from another terminal, see what the chat's
        # code wrote; leaving the shell returns to the chat.
        from test_terminal import PROMPT, Term
        fm = self.fake([
            {"tool_calls": [execute("echo chat-wrote > /root/by-chat")]},
            {"text": "written"},
        ])
        env = pty_env(fm)
        c = ChatPty(self, fm)
        pid, fd, expect = c.pid, c.fd, c.expect
        try:
            c.say(b"write a file")
            expect(b"written")
            expect(b"> ", since=c.out.index(b"written"))
            # another terminal into the chat's VM, by its session name
            ps = subprocess.run([altest.AIRLOCK, "ps"], capture_output=True, text=True,
                                env=env).stdout
            names = [l.split()[0] for l in ps.splitlines()[1:] if str(pid) in l.split()]
            self.assertEqual(len(names), 1, ps)
            t = Term(["shell", names[0]])
            self.addCleanup(t.close)
            t.read_until(PROMPT, 60)
            t.send(b"cat /root/by-chat\r")
            t.read_until(rb"chat-wrote\r\n")
            t.send(b"exit 3\r")
            self.assertEqual(t.wait(), 3)
            # the chat's own %shell
            mark = len(c.out)
            os.write(fd, b"%shell\r")
            expect(b"# ", since=mark)
            os.write(fd, b"cat /root/by-chat; echo shell-$((6*7))\r")
            expect(b"chat-wrote\r\nshell-42", since=mark)
            mark = len(c.out)
            os.write(fd, b"exit\r")  # the shell ends: back to the chat's prompt
            expect(b"back in the chat]\r\n> ", since=mark)
            time.sleep(1)  # libedit switching modes may drop a key typed at once
            os.write(fd, b"\x04")
            # By time, not by count: once the chat closed its terminal (it is exiting) the
            # master reads EIO at once, and a count of reads ran out before the exit was seen.
            start, again = time.time(), False
            while True:
                wpid, status = os.waitpid(pid, os.WNOHANG)
                if wpid:
                    break
                if time.time() - start > 120:
                    self.fail("chat did not exit on Ctrl-D; got %r" % c.out[-600:])
                if not again and time.time() - start > 20:
                    again = True
                    try:
                        os.write(fd, b"\x04")  # as a user would, again
                    except OSError:
                        pass
                if select.select([fd], [], [], 0.2)[0]:
                    try:
                        c.out += os.read(fd, 4096)
                    except OSError:
                        time.sleep(0.2)
            self.assertEqual(os.waitstatus_to_exitcode(status), 0, c.out[-600:])
        finally:
            altest.reap_pty(pid, fd)

    def test_ctrl_c_interrupts_the_guest_and_returns_to_the_prompt(self):
        fm = self.fake([
            {"tool_calls": [execute("echo started; sleep 100; echo not-reached")]},
            {"tool_calls": [execute("echo second-run-ok")]},
            {"text": "all good"},
        ])
        c = ChatPty(self, fm)
        pid, fd, expect = c.pid, c.fd, c.expect
        try:
            c.say(b"start a long job")
            # The run's own line, not the code shown before it ("echo started; ..."): under load
            # the run may start seconds after the code is shown.
            expect(b"\nstarted\r\n")
            time.sleep(1)
            t0 = time.time()
            os.write(fd, b"\x03")
            expect(b"Interrupted.")
            self.assertLess(time.time() - t0, 30)
            mark = c.out.index(b"Interrupted.")
            expect(b"> ", since=mark)
            os.write(fd, b"next\r")
            expect(b"second-run-ok")
            expect(b"all good")
            expect(b"> ", since=c.out.index(b"all good"))
            self.assertNotIn(b"\nnot-reached", c.out)  # the code shows it; the output must not
            os.write(fd, b"\x04")  # Ctrl-D leaves
            start = time.time()
            resent = False
            while True:
                wpid, status = os.waitpid(pid, os.WNOHANG)
                if wpid:
                    break
                if not resent and time.time() > start + 15:
                    # A key typed while libedit switches terminal modes can be dropped by the
                    # terminal; a user would press it again.
                    os.write(fd, b"\x04")
                    resent = True
                if time.time() > start + 75:
                    self.fail("chat did not exit on Ctrl-D; last output %r\n%s"
                              % (c.out[-600:], process_report(pid)))
                try:
                    if select.select([fd], [], [], 0.2)[0]:
                        c.out += os.read(fd, 4096)
                except OSError:
                    pass
            self.assertEqual(os.waitstatus_to_exitcode(status), 0, c.out[mark:])
        finally:
            altest.reap_pty(pid, fd)
        reqs = fm.requests()
        self.assertEqual(len(reqs), 3)
        interrupted = tool_results(reqs[1])[0]["content"]
        self.assertIn("started", interrupted)
        self.assertIn("interrupted", interrupted)


if __name__ == "__main__":
    altest.main()

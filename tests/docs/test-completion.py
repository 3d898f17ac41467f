#!/usr/bin/env python3
"""The bash completion (packaging/completion/airlock.bash), driven through bash itself (TAP):
the function 'complete -p airlock' names is called with COMP_WORDS and COMP_CWORD set, as bash
does on Tab. Each command's flags must be exactly those of its getopt table in the sources (a
flag added or dropped there fails until the completion follows); image names come from a
scratch store through 'airlock image ls', session names from 'airlock ps' over a scratch
runtime dir holding one live (locked) session.

    test-completion.py SOURCE_ROOT COMPLETION_FILE      (AIRLOCK_BIN: the built airlock)
"""
import fcntl
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cliflags  # noqa: E402

results = []


def check(ok, what, detail=""):
    results.append((ok, what, detail))


def complete(script, binary, words, env):
    """What the completion offers for words (the last one is the word being completed)."""
    words = [binary] + words
    prog = """
set -u
source %s
spec=$(complete -p airlock) || exit 3
fn=$(sed -n 's/.*-F \\([^ ]*\\) .*/\\1/p' <<<"$spec")
[ -n "$fn" ] || exit 4
COMP_WORDS=(%s)
COMP_CWORD=%d
COMP_LINE="${COMP_WORDS[*]}"
COMP_POINT=${#COMP_LINE}
"$fn" airlock "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
printf '%%s\\n' "${COMPREPLY[@]}"
""" % (shlex.quote(script), " ".join(shlex.quote(w) for w in words), len(words) - 1)
    p = subprocess.run(["bash", "--norc", "--noprofile", "-c", prog], env=env,
                       capture_output=True, text=True, timeout=60)
    if p.returncode:
        return None, p.stderr
    return [w for w in p.stdout.split("\n") if w], p.stderr


def expect_set(script, binary, env, words, want, what):
    got, err = complete(script, binary, words, env)
    if got is None:
        check(False, what, "bash failed: " + err.strip()[:300])
        return
    g = set(got)
    check(g == want and len(got) == len(g), what,
          "missing: %s; extra: %s; duplicates: %s" % (
              " ".join(sorted(want - g)), " ".join(sorted(g - want)),
              " ".join(sorted({w for w in got if got.count(w) > 1}))))


def main():
    src, script = sys.argv[1], sys.argv[2]
    binary = os.environ["AIRLOCK_BIN"]
    tmp = tempfile.mkdtemp(prefix="airlock-completion-")
    store = os.path.join(tmp, "images")
    run = os.path.join(tmp, "run")
    for name in ("alpha", "beta-2"):
        os.makedirs(os.path.join(store, name))
        with open(os.path.join(store, name, "manifest.json"), "w") as f:
            f.write("{}")
    # A live session as 'airlock ps' sees one: its lock held, its info file readable.
    sess = os.path.join(run, "sessions", "airlock-compl0001")
    os.makedirs(sess)
    os.chmod(run, 0o700)
    lock = open(os.path.join(sess, "lock"), "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    with open(os.path.join(sess, "info.json"), "w") as f:
        json.dump({"image": "alpha", "started": int(time.time()), "pid": os.getpid()}, f)
    env = dict(os.environ, AIRLOCK_IMAGE_DIR=store, AIRLOCK_RUNTIME_DIR=run, HOME=tmp,
               XDG_CONFIG_HOME=os.path.join(tmp, "cfg"), XDG_DATA_HOME=os.path.join(tmp, "data"))

    spec = subprocess.run(["bash", "--norc", "-c", "source %s; complete -p airlock" %
                           shlex.quote(script)], capture_output=True, text=True)
    check(spec.returncode == 0 and "-F " in spec.stdout, "complete -p airlock names a function",
          spec.stdout + spec.stderr)

    main_c = open(os.path.join(src, "orchestrator", "cli", "cli_main.c")).read()
    commands = set(re.findall(r'!strcmp\(cmd, "([a-z]+)"\)', main_c))
    chat = cliflags.table_of(src, "chatopts.c")
    # The CLI refuses --json for chat, --resume and --jsonl for run (chatopts.c, chat_opts_parse).
    expect_set(script, binary, env, [""], commands, "airlock <Tab>: the commands cli_main.c runs")
    expect_set(script, binary, env, ["--"], cliflags.table_of(src, "cli_main.c") | (chat - {"--json"}),
               "airlock --<Tab>: the global flags and the chat's (airlock --model X chats)")
    expect_set(script, binary, env, ["exec", "--"], cliflags.table_of(src, "cli_exec.c"),
               "airlock exec --<Tab>: exactly cli_exec.c's getopt table")
    expect_set(script, binary, env, ["chat", "--"], chat - {"--json"},
               "airlock chat --<Tab>: exactly chatopts.c's table but --json")
    expect_set(script, binary, env, ["run", "--"], chat - {"--resume", "--jsonl"},
               "airlock run --<Tab>: exactly chatopts.c's table but --resume and --jsonl")
    # image.c holds a table per subcommand, each in its function.
    image_c = open(os.path.join(src, "orchestrator", "cli", "cli_image.c")).read()
    tables = {}
    for m in re.finditer(r"\nstatic int (image_\w+)\(.*?\n\}\n", image_c, re.S):
        flags = {"--" + f for f in re.findall(r'\{"([a-z-]+)", +(?:no|required|optional)_argument',
                                                m.group(0))}
        if flags:
            tables[m.group(1)] = flags
    for sub, words, fn in (("import", ["f.qcow2"], "image_import"),
                           ("warm", ["debian"], "image_warm"),
                           ("build", ["debian"], "image_build"),
                           ("export-base", [], "image_export"),
                           ("commit", ["s", "n"], "image_commit")):
        expect_set(script, binary, env, ["image", sub] + words + ["--"], tables.get(fn, set()),
                   "airlock image %s --<Tab>: exactly image.c's %s table" % (sub, fn))
    expect_set(script, binary, env, ["image", "ls", "--"], {"--hosts"},
               "airlock image ls --<Tab>: its one flag")
    expect_set(script, binary, env, ["exec", "--image", ""], {"alpha", "beta-2"},
               "airlock exec --image <Tab>: the store's images (airlock image ls)")
    expect_set(script, binary, env, ["image", "rm", "b"], {"beta-2"},
               "airlock image rm b<Tab>: images matching the prefix")
    expect_set(script, binary, env, ["-q", "exec", "--sync-back", ""], {"ask", "yes", "no"},
               "airlock -q exec --sync-back <Tab>: its values")
    got, err = complete(script, binary, ["cp", ""], env)
    check(got is not None and "airlock-compl0001:/" in got,
          "airlock cp <Tab>: the running session from airlock ps", "got: %r %s" % (got, err))
    got, err = complete(script, binary, ["exec", "--", ""], env)
    check(got == [], "airlock exec -- <Tab>: nothing (the guest's command)", "got: %r" % got)

    lock.close()
    subprocess.run(["rm", "-rf", tmp])
    print("1..%d" % len(results))
    for i, (ok, what, detail) in enumerate(results, 1):
        print("%s %d - %s" % ("ok" if ok else "not ok", i, what))
        if not ok and detail:
            print("# " + detail.replace("\n", "\n# "))
    return 0 if all(r[0] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

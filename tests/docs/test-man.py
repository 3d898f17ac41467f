#!/usr/bin/env python3
"""The man pages against the CLI (TAP): every long flag and short option the CLI accepts is
described in airlock(1), under its command's section, and the page names no long flag the CLI
does not accept;
the ENVIRONMENT section lists exactly the AIRLOCK_* variables the code and the image recipes
read; airlock-profiles(5) lists as keys exactly the chat options a profile accepts (asked of the
built binary, one key at a time) and as refused the ones it refuses.

    test-man.py SOURCE_ROOT        (AIRLOCK_BIN: the built airlock)
"""
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cliflags  # noqa: E402

# Where each CLI source's flags are described in airlock(1): a level-1 heading, or
# "COMMANDS/<command>". A source not named here that accepts more than --help fails the test
# until it is given its section (and the page describes its flags).
SECTIONS = {
    "cli_main.c": ["GLOBAL OPTIONS"],
    "cli_exec.c": ["COMMANDS/exec"],
    "cli_image.c": ["COMMANDS/image"],
    "chatopts.c": ["CHAT OPTIONS", "COMMANDS/chat", "COMMANDS/run"],
    "remote.c": ["COMMANDS/exec", "COMMANDS/session", "COMMANDS/snapshot", "COMMANDS/volume", "COMMANDS/proc"],
    "port.c": ["COMMANDS/port"],
    "cli_mcp.c": ["COMMANDS/mcp"],
    "cli_gc.c": ["COMMANDS/gc"],
}
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
SHORT = re.compile(r"(?<![\w-])-[a-zA-Z0-9](?![\w-])")

results = []


def check(ok, what, detail=""):
    results.append((ok, what, detail))


def parse_scd(path):
    """(terms, text): terms maps (h1, h2) to the flags and names on its definition lines (a line
    followed by a tab-indented one), text is the whole page."""
    lines = open(path, encoding="utf-8").read().split("\n")
    terms = {}
    h1 = h2 = ""
    for i, line in enumerate(lines):
        if line.startswith("## "):
            h2 = line[3:].strip()
        elif line.startswith("# "):
            h1, h2 = line[2:].strip(), ""
        elif line and not line.startswith("\t") and i + 1 < len(lines) and \
                lines[i + 1].startswith("\t"):
            terms.setdefault((h1, h2), []).append(line)
    return terms, "\n".join(lines)


def defined_in(terms, section, pattern=FLAG):
    h1, _, h2 = section.partition("/")
    out = set()
    for (a, b), ls in terms.items():
        if a == h1 and (not h2 or b == h2):
            for line in ls:
                out |= set(pattern.findall(line))
    return out


def profile_verdicts(binary, names):
    """{name: True if a profile may set it} from the built airlock itself."""
    verdict = {}
    with tempfile.TemporaryDirectory() as home:
        prof = os.path.join(home, "p.yaml")
        env = dict(os.environ, HOME=home, XDG_CONFIG_HOME=os.path.join(home, "cfg"))
        for name in sorted(names):
            with open(prof, "w") as f:
                f.write("%s: x\n" % name)
            p = subprocess.run([binary, "run", "--profile", prof, "--help"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               timeout=60)
            verdict[name] = "unknown setting" not in p.stderr
    return verdict


def daemon_flags(src):
    """(long flags, short options) airlockd accepts: its getopt table and optstring in
    daemon/main.c, and `key add`'s limit flags, made from the limit names in daemon/keys.c the
    way main.c makes them (underscores to dashes)."""
    main_c = open(os.path.join(src, "daemon", "main.c"), encoding="utf-8").read()
    table = re.search(r"struct option opts\[\] = \{(.*?)\n\s*\};", main_c, re.S).group(1)
    longs = {"--" + n for n in re.findall(r'\{"([a-z][a-z0-9-]*)",', table)}
    optstring = re.search(r'getopt_long\(argc, argv, "([^"]*)"', main_c).group(1)
    shorts = {"-" + ch for ch in optstring if ch.isalnum()}
    keys_c = open(os.path.join(src, "daemon", "keys.c"), encoding="utf-8").read()
    fields = re.search(r"ad_limit_fields\[\] = \{(.*?)\n\};", keys_c, re.S).group(1)
    limits = {"--" + n.replace("_", "-") for n in re.findall(r'\{"([a-z_]+)",', fields)}
    return longs, shorts, limits


def config_keys(src):
    """The keys daemon/config.c's parser accepts (each a strcmp of k in set())."""
    text = open(os.path.join(src, "daemon", "config.c"), encoding="utf-8").read()
    body = re.search(r"static int set\(struct ad_config \*c.*?\n\}\n", text, re.S).group(0)
    return set(re.findall(r'!strcmp\(k, "([a-z_]+)"\)', body))


def check_daemon(src, man):
    longs, shorts, limits = daemon_flags(src)
    check(len(longs) >= 3 and len(limits) >= 8, "daemon/main.c and keys.c are read",
          "found %s %s" % (sorted(longs), sorted(limits)))
    terms, text = parse_scd(os.path.join(man, "airlockd.8.scd"))
    opts = defined_in(terms, "OPTIONS")
    cmds = defined_in(terms, "COMMANDS")
    check(longs <= opts, "airlockd(8) OPTIONS describes every flag of airlockd",
          "missing: " + " ".join(sorted(longs - opts)))
    sh = defined_in(terms, "OPTIONS", SHORT)
    check(shorts <= sh, "airlockd(8) OPTIONS describes every short option of airlockd",
          "missing: " + " ".join(sorted(shorts - sh)))
    check(limits <= cmds, "airlockd(8) COMMANDS describes every flag of key add",
          "missing: " + " ".join(sorted(limits - cmds)))
    named = set(FLAG.findall(text))
    check(named <= longs | limits, "airlockd(8) names only flags airlockd accepts",
          "not accepted: " + " ".join(sorted(named - longs - limits)))
    named = set(FLAG.findall(open(os.path.join(man, "airlockd.conf.5.scd"),
                                  encoding="utf-8").read()))
    check(named <= longs | limits, "airlockd.conf(5) names only flags airlockd accepts",
          "not accepted: " + " ".join(sorted(named - longs - limits)))

    keys = config_keys(src)
    check(len(keys) >= 20, "daemon/config.c's keys are read", "found %s" % sorted(keys))
    cterms, _ = parse_scd(os.path.join(man, "airlockd.conf.5.scd"))
    described = set()
    for (h1, _h2), lines in cterms.items():
        if h1 == "KEYS":
            for line in lines:
                described |= set(re.findall(r"^\*([a-z_]+)\*$", line))
    check(keys <= described, "airlockd.conf(5) KEYS describes every key the parser accepts",
          "missing: " + " ".join(sorted(keys - described)))
    check(described <= keys, "airlockd.conf(5) KEYS describes only keys the parser accepts",
          "unknown: " + " ".join(sorted(described - keys)))
    sample = open(os.path.join(src, "packaging", "airlockd.conf"), encoding="utf-8").read()
    in_sample = set(re.findall(r"^#?([a-z_]+) = ", sample, re.M))
    check(in_sample == keys, "packaging/airlockd.conf shows exactly the keys the parser accepts",
          "missing: %s; unknown: %s" % (" ".join(sorted(keys - in_sample)),
                                       " ".join(sorted(in_sample - keys))))


def help_of(binary, *args):
    with tempfile.TemporaryDirectory() as home:
        env = dict(os.environ, HOME=home, XDG_CONFIG_HOME=os.path.join(home, "cfg"))
        p = subprocess.run([binary, *args, "--help"], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=60)
    return p.returncode, p.stdout


def check_help(src, binary):
    """--help against the sources: airlock's names every command main.c dispatches and every
    image subcommand; each command's names every flag of its getopt table."""
    cli = cliflags.cli_dir(src)
    main_c = open(os.path.join(cli, "cli_main.c"), encoding="utf-8").read()
    image_c = open(os.path.join(cli, "cli_image.c"), encoding="utf-8").read()
    commands = set(re.findall(r'!strcmp\(cmd, "([a-z]+)"\)', main_c)) - {"help"}
    subs = set(re.findall(r'!strcmp\(sub, "([a-z]+)"\)', image_c))
    rc, top = help_of(binary)
    words = set(re.findall(r"[a-z]+", top))
    check(rc == 0 and len(commands) > 10 and not commands - words,
          "airlock --help names every command", "missing: " + " ".join(sorted(commands - words)))
    check(len(subs) >= 5 and not subs - words, "airlock --help names every image subcommand",
          "missing: " + " ".join(sorted(subs - words)))
    rc, image = help_of(binary, "image")
    check(rc == 0 and not subs - set(re.findall(r"[a-z]+", image)),
          "airlock image --help names every image subcommand")
    # The remote exec's table is the second one of remote.c (after the session's).
    wanted = [
        (("exec",), cliflags.table_of(src, "cli_exec.c") | {"--session", "--detach"}),
        (("exec", "--session", "x"), set(re.findall(
            r'\{\s*"([a-z][a-z0-9-]*)"\s*,', open(os.path.join(cli, "remote.c")).read().split(
                "int cli_remote_exec", 1)[1].split("getopt_long", 1)[0]))),
        (("chat",), cliflags.table_of(src, "chatopts.c") - {"--json"}),
        (("run",), cliflags.table_of(src, "chatopts.c") - {"--resume"}),
        (("image",), cliflags.table_of(src, "cli_image.c")),
    ]
    for args, flags in wanted:
        flags = {f if f.startswith("--") else "--" + f for f in flags} - {"--help"}
        rc, text = help_of(binary, *args)
        missing = sorted(flags - set(FLAG.findall(text)))
        check(rc == 0 and len(flags) > 1 and not missing,
              "airlock %s --help names every flag it accepts" % " ".join(args),
              "missing: " + " ".join(missing))


def main():
    src = sys.argv[1]
    man = os.path.join(src, "docs", "man")
    by_file = cliflags.flags_by_file(src)
    accepted = set().union(*by_file.values())
    terms, text = parse_scd(os.path.join(man, "airlock.1.scd"))

    for name, flags in sorted(by_file.items()):
        sections = SECTIONS.get(name)
        if sections is None:
            check(flags <= {"--help"}, "orchestrator/cli/%s has a section in airlock(1)" % name,
                  "it accepts %s: add it to SECTIONS in %s and describe them" %
                  (" ".join(sorted(flags)), sys.argv[0]))
            continue
        described = set().union(*(defined_in(terms, s) for s in sections))
        missing = sorted(flags - described)
        check(not missing, "airlock(1) describes every flag of %s under %s" %
              (name, " or ".join(sections)), "missing: " + " ".join(missing))
        shorts = cliflags.short_of(src, name)
        described = set().union(*(defined_in(terms, s, SHORT) for s in sections))
        missing = sorted(shorts - described)
        check(not missing, "airlock(1) describes every short option of %s under %s" %
              (name, " or ".join(sections)), "missing: " + " ".join(missing))

    # airlockd's pages are checked against the daemon's own sources below.
    pages = sorted(f for f in os.listdir(man) if f.endswith(".scd") and
                   not f.startswith("airlockd"))
    for page in pages:
        named = set(FLAG.findall(open(os.path.join(man, page), encoding="utf-8").read()))
        unknown = sorted(named - accepted)
        check(not unknown, "%s names only flags the CLI accepts" % page,
              "not accepted by any getopt table or comparison in orchestrator/cli: " +
              " ".join(unknown))

    env_terms = set()
    for line in terms.get(("ENVIRONMENT", ""), []):
        env_terms |= set(re.findall(r"AIRLOCK_[A-Z0-9_]+", line))
    read = cliflags.env_vars(src)
    check(not read - env_terms, "airlock(1) ENVIRONMENT lists every AIRLOCK_* variable read",
          "missing: " + " ".join(sorted(read - env_terms)))
    check(not env_terms - read, "airlock(1) ENVIRONMENT lists only variables that are read",
          "read nowhere: " + " ".join(sorted(env_terms - read)))

    # Profiles: the chat table's names, each tried in a profile with the built binary.
    binary = os.environ.get("AIRLOCK_BIN")
    names = {f[2:] for f in cliflags.table_of(src, "chatopts.c")}
    if not binary:
        check(False, "AIRLOCK_BIN is set", "the profile keys are asked of the built airlock")
    else:
        verdict = profile_verdicts(binary, names)
        pterms, ptext = parse_scd(os.path.join(man, "airlock-profiles.5.scd"))
        keys_part = ptext.split("\n# KEYS\n", 1)[-1].split("\n# KEYS REFUSED\n", 1)[0]
        listed = set(re.findall(r"\*([a-z][a-z0-9-]*)\*", keys_part)) & names
        refused_listed = set()
        for line in pterms.get(("KEYS REFUSED", ""), []):
            refused_listed |= set(re.findall(r"\*([a-z][a-z0-9-]*)\*", line)) & names
        ok_keys = {n for n in names if verdict[n]}
        check(listed == ok_keys, "airlock-profiles(5) KEYS lists exactly what a profile accepts",
              "not listed: %s; listed but refused: %s" % (
                  " ".join(sorted(ok_keys - listed)), " ".join(sorted(listed - ok_keys))))
        check(refused_listed == names - ok_keys,
              "airlock-profiles(5) KEYS REFUSED lists exactly what a profile refuses",
              "expected: %s; listed: %s" % (" ".join(sorted(names - ok_keys)),
                                           " ".join(sorted(refused_listed))))
        check(len(ok_keys) > 20 and verdict.get("model"), "the binary accepts profile keys",
              "accepted only: " + " ".join(sorted(ok_keys)))

    if binary:
        check_help(src, binary)
    check_daemon(src, man)

    print("1..%d" % len(results))
    for i, (ok, what, detail) in enumerate(results, 1):
        print("%s %d - %s" % ("ok" if ok else "not ok", i, what))
        if not ok and detail:
            print("# " + detail)
    return 0 if all(r[0] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

"""The flags the airlock CLI accepts, read from its sources (orchestrator/cli/*.c): the long
options of every getopt table ({"name", ..._argument, ...}) and every whole string literal
"--name" the code compares arguments with (image build's --toolchain, the --help of commands
without a table). What getopt is given is what the CLI accepts, so this cannot drift from it;
the docs tests compare the man page and the bash completion with it."""
import os
import re

TABLE_ENTRY = re.compile(r'\{\s*"([a-z][a-z0-9-]*)"\s*,\s*(?:no|required|optional)_argument\b')
LITERAL = re.compile(r'"(--[a-z][a-z0-9-]*)"')
# A whole string literal naming a variable: getenv's argument, or a helper's that calls it.
# getopt's short options: the string given to getopt_long, inline or through a named constant,
# or the letters of a table's rows it is made from.
SHORT_INLINE = re.compile(r'getopt_long\([^,]+,[^,]+,\s*"([^"]*)"')
SHORT_CONST = re.compile(r'char\s+short_opts\[\]\s*=\s*"([^"]*)"')
# A table the getopt tables are made from (cli/cli_exec.c): {"name", x_argument, 'c', ...}.
SHORT_ROW = re.compile(r'\{\s*"[a-z][a-z0-9-]*"\s*,\s*(?:no|required|optional)_argument\s*,\s*\'([a-zA-Z0-9])\'')
GETENV = re.compile(r'"(AIRLOCK_[A-Z0-9_]+)"')
SHELL_ENV = re.compile(r'\$\{?(AIRLOCK_[A-Z0-9_]+)')


def cli_dir(source_root):
    return os.path.join(source_root, "orchestrator", "cli")


def flags_by_file(source_root):
    """{file name: set of '--flag'} for each CLI source that accepts long flags."""
    out = {}
    d = cli_dir(source_root)
    for name in sorted(os.listdir(d)):
        if not name.endswith(".c"):
            continue
        text = open(os.path.join(d, name), encoding="utf-8").read()
        flags = {"--" + m for m in TABLE_ENTRY.findall(text)} | set(LITERAL.findall(text))
        if flags:
            out[name] = flags
    return out


def table_of(source_root, name):
    """The long options of the getopt table(s) in one CLI source, as '--flag'."""
    text = open(os.path.join(cli_dir(source_root), name), encoding="utf-8").read()
    return {"--" + m for m in TABLE_ENTRY.findall(text)}


def env_vars(source_root):
    """AIRLOCK_* variables the library and CLI read (named in a string literal) and the image
    recipes read."""
    found = set()
    for sub, pattern, exts in (("orchestrator", GETENV, (".c",)),
                               ("images", SHELL_ENV, (".sh",))):
        for dirpath, _, files in os.walk(os.path.join(source_root, sub)):
            for f in files:
                if f.endswith(exts):
                    text = open(os.path.join(dirpath, f), encoding="utf-8").read()
                    found |= set(pattern.findall(text))
    return found


def short_of(source_root, name):
    """The short options getopt is given in one CLI source, as '-x'."""
    text = open(os.path.join(cli_dir(source_root), name), encoding="utf-8").read()
    out = set()
    for spec in SHORT_INLINE.findall(text) + SHORT_CONST.findall(text):
        out |= {"-" + c for c in spec if c.isalnum()}
    out |= {"-" + c for c in SHORT_ROW.findall(text)}
    return out

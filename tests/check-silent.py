#!/usr/bin/env python3
"""The library never prints (issue 36): no source of libairlock, its model clients, the chat
loop or the MCP server names stdout or stderr, or calls printf, puts, perror or putchar, once
comments and string literals are set aside. What the library has to say goes to its caller
(al_error, notice callbacks, a FILE * the caller hands in).

    check-silent.py SOURCE_ROOT
"""
import glob
import os
import re
import sys

DIRS = ["orchestrator/" + d for d in ("base", "link", "vm", "transport", "session", "model",
                                       "chat", "mcp")]
BAD = re.compile(r"\b(stdout|stderr)\b|\b(printf|puts|perror|putchar|vprintf)\s*\(")
# comments, string and character literals (escapes inside kept whole)
STRIP = re.compile(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)


def blank(m):
    return re.sub(r"[^\n]", " ", m.group(0))


def main():
    root = sys.argv[1]
    bad = []
    files = 0
    for d in DIRS:
        for path in sorted(glob.glob(os.path.join(root, d, "*.c"))):
            files += 1
            code = STRIP.sub(blank, open(path, encoding="utf-8").read())
            for n, line in enumerate(code.splitlines(), 1):
                if BAD.search(line):
                    bad.append("%s:%d: %s" % (os.path.relpath(path, root), n, line.strip()))
    for b in bad:
        print("check-silent: prints: " + b)
    print("check-silent: %d library sources, %s" % (files, "ok" if not bad else "FAILED"))
    return 1 if bad or not files else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Fails when the library's files call each other in a cycle, or a layer calls one above it.

The library's folders are its layers, lowest first: base/ (errors, paths, text, host programs,
the result and tar readers), link/ (the channel and the requests on it), vm/ (the machine:
libvirt, disks, volumes, images, the budget), transport/ (how the agent is reached), session/
(sessions and what runs on them). A file may call the functions of its own folder and of the
folders below it, never of one above; base/ and link/ call no libvirt function (vir...) and
their headers include no libvirt header. Within a folder, a file may call the functions of
files below it, never of one that (through others) calls it back. This reads the sources as
text: a function is defined where its name and '(' start a line's declarator and the line ends
with ')' and the next line is '{'; a call is any other 'name(' of a function defined in
another file. Headers must not include each other in a cycle either.

Run: tests/check-cycles.py [ROOT]; prints the file graph with -v.
"""
import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "-v" else
                       os.path.join(os.path.dirname(__file__), ".."))
VERBOSE = "-v" in sys.argv
LAYERS = ["base", "link", "vm", "transport", "session"]
LIB_DIRS = ["orchestrator/" + d for d in LAYERS]
NO_LIBVIRT = {"base", "link"}
VIRCALL = re.compile(r"\bvir[A-Z]\w*\s*\(")

DEF = re.compile(r"^(?:static\s+)?(?:[A-Za-z_][\w\s\*]*?[\s\*])?(al_\w+)\s*\([^;]*$")
CALL = re.compile(r"\b(al_\w+)\s*\(")
INCLUDE = re.compile(r'^#include\s+"([^"]+)"')


def strip(text):
    """Comments and string literals out, so neither counts as a call."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r'"(?:\\.|[^"\\\n])*"', '""', text)


def sources(ext):
    out = []
    for d in LIB_DIRS:
        full = os.path.join(ROOT, d)
        if not os.path.isdir(full):
            continue
        for name in sorted(os.listdir(full)):
            if name.endswith(ext):
                out.append(os.path.join(d, name))
    return out


def sccs(graph):
    """Tarjan's strongly connected components with more than one node."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main():
    files = sources(".c")
    text = {f: strip(open(os.path.join(ROOT, f), encoding="utf-8").read()) for f in files}
    owner = {}
    for f in files:
        lines = text[f].split("\n")
        for i, line in enumerate(lines):
            m = DEF.match(line)
            if not m or line.startswith((" ", "\t", "#")):
                continue
            # The declarator may wrap; the body's brace starts a later line.
            j = i
            while j < len(lines) and ";" not in lines[j] and not lines[j].startswith("{"):
                j += 1
            if j < len(lines) and lines[j].startswith("{"):
                owner.setdefault(m.group(1), f)
    calls = {f: set() for f in files}
    why = {}
    for f in files:
        for m in CALL.finditer(text[f]):
            g = owner.get(m.group(1))
            if g and g != f:
                calls[f].add(g)
                why.setdefault((f, g), m.group(1))

    headers = sources(".h") + files
    includes = {}
    for h in headers:
        for line in open(os.path.join(ROOT, h), encoding="utf-8"):
            m = INCLUDE.match(line)
            if m:
                # as the compiler finds it: beside the file, then in each layer's folder
                for d in [os.path.dirname(h)] + LIB_DIRS:
                    target = os.path.normpath(os.path.join(d, m.group(1)))
                    if target in headers:
                        includes.setdefault(h, set()).add(target)
                        break

    if VERBOSE:
        for f in files:
            print(f"{f} -> " + ", ".join(f"{g} ({why[(f, g)]})" for g in sorted(calls[f])))
    bad = 0
    for comp in sccs(calls):
        bad += 1
        print("call cycle among: " + ", ".join(comp))
        for f in comp:
            for g in sorted(calls[f] & set(comp)):
                print(f"  {f} calls {why[(f, g)]} in {g}")
    for comp in sccs(includes):
        bad += 1
        print("include cycle among: " + ", ".join(comp))
    layer = {f: LAYERS.index(f.split("/")[1]) for f in headers}
    for f in files:
        for g in sorted(calls[f]):
            if layer[g] > layer[f]:
                bad += 1
                print(f"layer: {f} ({LAYERS[layer[f]]}/) calls {why[(f, g)]} in {g}, a layer above")
        if f.split("/")[1] in NO_LIBVIRT:
            for m in VIRCALL.finditer(text[f]):
                bad += 1
                print(f"layer: {f} calls libvirt ({m.group(0).rstrip('( ')})")
    for h in sources(".h"):
        if h.split("/")[1] in NO_LIBVIRT and "<libvirt/" in open(os.path.join(ROOT, h)).read():
            bad += 1
            print(f"layer: {h} includes libvirt")
    if not owner:
        print("check-cycles: no library functions found under " + ROOT)
        return 1
    if bad == 0:
        print(f"check-cycles: {len(files)} files, {len(owner)} functions, no cycles, layers "
              + " < ".join(LAYERS) + " kept")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

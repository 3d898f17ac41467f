#!/usr/bin/env python3
"""libairlock exports exactly what its headers declare (issue 36): the functions airlock.h
and airlock/*.h declare, the globals of the version script (orchestrator/libairlock.sym) and the built
library's dynamic symbols are one set, every one in a LIBAIRLOCK_ version node; the header's
version macros, al_version() at run time and the project's version agree.

    check-exports.py HEADER SYMFILE LIBRARY PROJECT_VERSION [--no-load]

--no-load: al_version() is not called (a sanitized library cannot be loaded into python
without its runtime preloaded); the normal build's run calls it.
"""
import ctypes
import re
import subprocess
import sys


def declared(header):
    """The functions of airlock.h and of the headers beside it (include/airlock/*.h)."""
    import glob
    import os
    paths = [header] + sorted(glob.glob(os.path.join(os.path.dirname(header), "airlock", "*.h")))
    text = "".join(open(p).read() for p in paths)
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)          # comments
    text = re.sub(r"(?m)^\s*#.*(\\\n.*)*$", " ", text)            # preprocessor lines
    return set(re.findall(r"\b(al_\w+)\s*\(", text))


def script(symfile):
    text = re.sub(r"/\*.*?\*/", " ", open(symfile).read(), flags=re.S)
    names = set()
    for m in re.finditer(r"global:(.*?)(?:local:|\})", text, flags=re.S):
        names |= {n.strip() for n in m.group(1).split(";") if n.strip()}
    return names


def exported(lib):
    out = subprocess.run(["objdump", "-T", lib], check=True, stdout=subprocess.PIPE).stdout
    funcs, unversioned = set(), []
    for line in out.decode().splitlines():
        f = line.split()
        # "ADDR g DF .text SIZE VERSION NAME" for a defined function
        if len(f) >= 7 and f[3] == ".text":
            funcs.add(f[-1])
            if not f[-2].startswith("LIBAIRLOCK_"):
                unversioned.append(f[-1])
    return funcs, unversioned


def main():
    header, symfile, lib, version = sys.argv[1:5]
    failures = []
    d, s = declared(header), script(symfile)
    e, unversioned = exported(lib)
    if d != s:
        failures.append("airlock.h and libairlock.sym differ: only in the header %s, only in "
                        "the script %s" % (sorted(d - s), sorted(s - d)))
    if e != d:
        failures.append("the library exports other than the header declares: not declared %s,"
                        " not exported %s" % (sorted(e - d), sorted(d - e)))
    if unversioned:
        failures.append("exported without a LIBAIRLOCK_ version: %s" % unversioned[:10])
    macros = dict(re.findall(r"#define AIRLOCK_VERSION_(MAJOR|MINOR|MICRO) (\d+)",
                             open(header).read()))
    hv = "%s.%s.%s" % (macros.get("MAJOR"), macros.get("MINOR"), macros.get("MICRO"))
    if hv != version:
        failures.append("the header says %s, the project %s" % (hv, version))
    if "--no-load" not in sys.argv[5:]:
        check_runtime(ctypes.CDLL(lib), version, failures)
    for f in failures:
        print("check-exports: " + f)
    print("check-exports: %d functions, %s" % (len(e), "ok" if not failures else "FAILED"))
    return 1 if failures else 0


def check_runtime(al, version, failures):
    al.al_version.restype = ctypes.c_char_p
    al.al_version.argtypes = [ctypes.POINTER(ctypes.c_uint)]
    n = ctypes.c_uint(0)
    got = al.al_version(ctypes.byref(n)).decode()
    major, minor, micro = (int(x) for x in version.split("."))
    if got != version or n.value != major * 10000 + minor * 100 + micro:
        failures.append("al_version() says %s (%d), the project %s" % (got, n.value, version))


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Writes the seed corpus of fuzz-layers: an image layer as builders write it, and what a hostile
layer could hold instead (escapes, whiteouts, devices, set-id bits, limits).
Run: python3 tests/fuzz/gen-layers-corpus.py tests/fuzz/corpus/layers"""
import gzip
import io
import os
import sys
import tarfile

F, D, L, H = tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE
C, B, P = tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE


def tar(entries, fmt=tarfile.PAX_FORMAT):
    """entries: (name, type, data or link target[, mode[, pax headers]])."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as t:
        for e in entries:
            name, kind, payload = e[:3]
            ti = tarfile.TarInfo(name)
            ti.mtime = 1700000000
            ti.type = kind
            ti.mode = e[3] if len(e) > 3 else (0o755 if kind == D else 0o644)
            if len(e) > 4:
                ti.pax_headers = e[4]
            if kind == F:
                ti.size = len(payload)
                t.addfile(ti, io.BytesIO(payload))
                continue
            if kind in (L, H):
                ti.linkname = payload
            if kind in (C, B):
                ti.devmajor, ti.devminor = payload
            t.addfile(ti)
    return out.getvalue()


def gz(data):
    return gzip.compress(data, mtime=0)


SEEDS = {
    "valid-rootfs": tar([("./", D, None), ("./etc/", D, None), ("./etc/hostname", F, b"box\n"),
                         ("./bin/", D, None), ("./bin/sh", F, b"\x7fELF" + b"\0" * 60, 0o755),
                         ("./bin/bash", H, "./bin/sh"), ("./etc/mtab", L, "/proc/mounts"),
                         ("./run/initctl", P, None, 0o600)]),
    "valid-gzip": gz(tar([("usr/", D, None), ("usr/lib/", D, None),
                          ("usr/lib/os-release", F, b"ID=debian\n")], tarfile.GNU_FORMAT)),
    "valid-trailing": tar([("a", F, b"a")]) + b"trailing bytes after the end",
    "whiteouts": tar([("etc/", D, None), ("etc/a", F, b"a"), ("etc/.wh.b", F, b""),
                      ("etc/.wh..wh..opq", F, b""), ("etc/c", F, b"c"), ("gone", C, (0, 0)),
                      ("x/.wh.y/z", F, b""), (".wh..wh.plnk/1", F, b"")]),
    "whiteout-bad": tar([("d/.wh..", F, b"")]),
    "devices": tar([("dev/null", C, (1, 3)), ("dev/sda", B, (8, 0))]),
    "setid": tar([("bin/su", F, b"x", 0o4755), ("bin/wall", F, b"x", 0o2755),
                  ("var/mail/", D, None, 0o2775), ("noperm/", D, None, 0o000),
                  ("noperm/f", F, b"f", 0o000)]),
    "xattrs": tar([("cap", F, b"x", 0o755, {"SCHILY.xattr.security.capability": "\x01\x00"}),
                   ("u", F, b"y", 0o644, {"SCHILY.xattr.user.test": "v"})]),
    "escape-dotdot": tar([("../x", F, b"x")], tarfile.GNU_FORMAT),
    "escape-absolute": tar([("/etc/x", F, b"x")], tarfile.GNU_FORMAT),
    "escape-symlink-root": tar([("evil", L, "/"), ("evil/etc/x", F, b"x"),
                                ("evil/sentinel", F, b"pwned"), ("evil/.wh.sentinel", F, b"")]),
    "escape-symlink-up": tar([("esc", L, "../../.."), ("esc/x", F, b"x"),
                              ("esc/sentinel", F, b"pwned"), ("d/", D, None),
                              ("d/up", L, "../../sentinel"), ("d/up/x", F, b"x"),
                              ("esc/.wh..wh..opq", F, b"")]),
    "hardlinks": tar([("a", F, b"a"), ("b", H, "a"), ("c", H, "../outside"),
                      ("d", H, "/etc/passwd")]),
    "hardlink-dir": tar([("dir/", D, None), ("l", H, "dir")]),
    "hardlink-through-symlink": tar([("evil", L, "/"), ("l", H, "evil/etc/passwd")]),
    "replace": tar([("x/", D, None), ("x/in", F, b"i"), ("x", F, b"file"), ("y", F, b"y"),
                    ("y/", D, None), ("z", L, "/tmp"), ("z/", D, None), ("z/f", F, b"f"),
                    ("f", F, b"f"), ("f/g", F, b"g")]),
    "dots": tar([(".", D, None, 0o750), (".//a//b/./c", F, b"abc"), ("././d//e/", D, None)],
                tarfile.GNU_FORMAT),
    "over-entries": tar([("f%03d" % i, F, b"") for i in range(80)]),
    "over-bytes": gz(tar([("big", F, b"z" * (300 * 1024))])),
    "long-name": tar([("x" * 4000, F, b"x")]),
    "deep": tar([("/".join(["d"] * 40) + "/f", F, b"deep")]),
}


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    valid = SEEDS["valid-rootfs"]
    with open(os.path.join(out, "truncated"), "wb") as f:
        f.write(valid[:len(valid) // 2 + 100])
    with open(os.path.join(out, "not-tar"), "wb") as f:
        f.write(b"this is not a tar stream at all\n" * 20)
    with open(os.path.join(out, "gzip-garbage"), "wb") as f:
        f.write(gz(b"this is not a tar stream at all\n" * 20))


main()

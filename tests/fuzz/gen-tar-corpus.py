#!/usr/bin/env python3
"""Writes the seed corpus of fuzz-tar: what busybox and GNU tar send back, and what a hostile
guest could send instead. Run: python3 tests/fuzz/gen-tar-corpus.py tests/fuzz/corpus/tar"""
import io
import os
import sys
import tarfile


def tar(entries, fmt=tarfile.GNU_FORMAT):
    """entries: (name, type, data or link target)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as t:
        for name, kind, payload in entries:
            ti = tarfile.TarInfo(name)
            ti.mtime = 1700000000
            ti.type = kind
            if kind == tarfile.REGTYPE:
                ti.size = len(payload)
                t.addfile(ti, io.BytesIO(payload))
            else:
                if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                    ti.linkname = payload
                if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
                    ti.devmajor, ti.devminor = 1, 3
                t.addfile(ti)
    return out.getvalue()


F, D, L, H = tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE
SEEDS = {
    "valid-workspace": tar([("./", D, None), ("./a.txt", F, b"hello\n"), ("./sub/", D, None),
                            ("./sub/b.md", F, b"x" * 1500), ("./sub/link", L, "../a.txt")]),
    "valid-pax-long-utf8": tar([("./" + "d" * 120 + "/", D, None),
                                ("./" + "d" * 120 + "/" + "n" * 150, F, b"long"),
                                ("./caf\u00e9.txt", F, b"utf8")], tarfile.PAX_FORMAT),
    "valid-ustar-empty-files": tar([(".", D, None)] + [("f%d" % i, F, b"") for i in range(10)],
                                   tarfile.USTAR_FORMAT),
    "valid-newline-name": tar([("./line\nbreak", F, b"n")]),
    "bad-absolute": tar([("/etc/passwd", F, b"root::0:0::/:/bin/sh\n")]),
    "bad-dotdot": tar([("./../../etc/cron.d/x", F, b"* * * * * root sh\n")]),
    "bad-dotdot-middle": tar([("a/../../b", F, b"x")]),
    "bad-empty-component": tar([("a//b", F, b"x")]),
    "bad-root-file": tar([("./", F, b"x")]),
    "odd-hardlink": tar([("a", F, b"x"), ("b", H, "a"), ("c", H, "/etc/shadow")]),
    "odd-devices-fifo": tar([("null", tarfile.CHRTYPE, None), ("disk", tarfile.BLKTYPE, None),
                             ("pipe", tarfile.FIFOTYPE, None)]),
    "symlink-escape": tar([("a.txt", L, "/etc/passwd"), ("d", L, "/etc"), ("d/passwd", F, b"x")]),
    "duplicate": tar([("a", F, b"first"), ("a", L, "/etc/passwd")]),
    "over-entries": tar([("f%03d" % i, F, b"") for i in range(80)]),
    "over-bytes": tar([("big", F, b"z" * 70000)]),
    "over-total": tar([("b%d" % i, F, b"z" * 20000) for i in range(4)]),
    "long-name-over-bound": tar([("x" * 4000, F, b"x")], tarfile.PAX_FORMAT),
}


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    valid = SEEDS["valid-workspace"]
    # A stream cut inside a file's data, and one cut inside a header.
    with open(os.path.join(out, "truncated-data"), "wb") as f:
        f.write(valid[:512 * 3 + 100])
    with open(os.path.join(out, "truncated-header"), "wb") as f:
        f.write(valid[:700])
    # A header whose size field claims far more than follows.
    hdr = bytearray(tar([("claims-huge", F, b"x")])[:512])
    hdr[124:136] = b"77777777777\0"
    hdr[148:156] = b"        "
    hdr[148:156] = b"%06o\0 " % sum(hdr)
    with open(os.path.join(out, "huge-size-claim"), "wb") as f:
        f.write(bytes(hdr) + b"x" * 512)
    with open(os.path.join(out, "not-tar"), "wb") as f:
        f.write(b"this is not a tar stream at all\n" * 20)


main()

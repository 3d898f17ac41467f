#!/usr/bin/env python3
"""Fetches the web terminal's emulator, xterm.js and its fit addon, at the pinned versions from
the npm registry (npm pack: npm's own cache serves a second build offline), checks each tarball
against the integrity pinned here, and writes the files the page serves into OUTDIR:
xterm.mjs, xterm.css, addon-fit.mjs and xterm-LICENSE.txt (MIT, shipped with the package).
Usage: xterm.py OUTDIR"""
import base64
import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile

# name@version: (sha512 integrity as the registry publishes it, {file in the tarball: output})
PINNED = {
    "@xterm/xterm@6.0.0": (
        "TQwDdQGtwwDt+2cgKDLn0IRaSxYu1tSUjgKarSDkUM0ZNiSRXFpjxEsvc/Zgc5kq5omJ+V0a8/kIM2WD3sMOYg==",
        {"package/lib/xterm.mjs": "xterm.mjs", "package/css/xterm.css": "xterm.css",
         "package/LICENSE": "xterm-LICENSE.txt"}),
    "@xterm/addon-fit@0.11.0": (
        "jYcgT6xtVYhnhgxh3QgYDnnNMYTcf8ElbxxFzX0IZo+vabQqSPAjC3c1wJrKB5E19VwQei89QCiZZP86DCPF7g==",
        {"package/lib/addon-fit.mjs": "addon-fit.mjs"}),
}


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for spec, (integrity, files) in PINNED.items():
            p = subprocess.run(["npm", "pack", "--silent", "--pack-destination", tmp, spec],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if p.returncode:
                sys.exit("xterm.py: npm pack %s failed: %s (the web terminal needs the npm "
                         "registry or npm's cache; -Dweb_terminal=disabled builds without it)"
                         % (spec, (p.stderr.strip().splitlines() or ["?"])[-1]))
            tgz = os.path.join(tmp, p.stdout.strip().splitlines()[-1])
            got = base64.b64encode(hashlib.sha512(open(tgz, "rb").read()).digest()).decode()
            if got != integrity:
                sys.exit("xterm.py: %s: sha512 %s, not the pinned %s" % (spec, got, integrity))
            with tarfile.open(tgz) as t:
                for name, dest in files.items():
                    data = t.extractfile(t.getmember(name)).read()
                    with open(os.path.join(out, dest), "wb") as f:
                        f.write(data)


main()

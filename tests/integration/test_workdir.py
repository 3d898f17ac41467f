#!/usr/bin/env python3
"""The user's files in and out of real guests: --workdir, --sync-back, airlock cp and ps."""
import hashlib
import os
import pty
import re
import stat
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

import altest

IMAGE = ["--image", "tiny"]  # busybox tar; the debian image has GNU tar and behaves the same


def tree_hash(root):
    """Every entry's relative path, type, mode and content (symlinks: their target)."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            h.update(os.fsencode(os.path.relpath(p, root)) + b"\0%o\0" % st.st_mode)
            if os.path.islink(p):
                h.update(os.fsencode(os.readlink(p)))
            elif os.path.isfile(p):
                with open(p, "rb") as f:
                    h.update(f.read())
    return h.hexdigest()


def file_hash(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


class WorkdirTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="airlock-wd-")
        self.dir = os.path.join(self.tmp, "work")
        os.mkdir(self.dir)

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def make_files(self, n):
        for i in range(n):
            with open(os.path.join(self.dir, "file-%03d.txt" % i), "wb") as f:
                f.write(b"content of %d\n" % i * (i % 7 + 1))

    def exec_wd(self, code, sync, extra=(), stdin=subprocess.DEVNULL):
        return altest.run(["exec"] + IMAGE + ["--workdir", self.dir, "--sync-back", sync] +
                          list(extra) + ["--lang", "sh", "-c", code],
                          input=None if stdin is subprocess.DEVNULL else stdin)

    RENAME = 'for f in *.txt; do mv "$f" "${f%.txt}.md"; done; echo made > report.out'

    def test_rename_400_synced_back(self):
        self.make_files(400)
        before = {n: file_hash(os.path.join(self.dir, n)) for n in os.listdir(self.dir)}
        r = self.exec_wd(self.RENAME, "yes")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(b"401 added, 0 modified, 400 deleted", r.stderr)
        # The list is cut for the terminal, with a count.
        self.assertIn(b"  added     file-000.md (13 B)\n  deleted   file-000.txt (13 B)\n",
                      r.stderr)
        self.assertIn(b"  ... and 601 more\n", r.stderr)
        # All of it in a file, named before anything is applied.
        m = re.search(rb"airlock: the full list of 801 changes is in (\S+)\n", r.stderr)
        self.assertTrue(m, r.stderr)
        self.assertLess(m.start(), r.stderr.index(b"applied 801 changes"))
        with open(m[1], "rb") as f:
            full = f.read()
        os.remove(m[1])
        self.assertEqual(full.count(b"\n"), 801)
        self.assertTrue(full.endswith(b"  deleted   file-399.txt (15 B)\n"
                                      b"  added     report.out (5 B)\n"))
        self.assertIn(b"applied 801 changes", r.stderr)
        after = sorted(os.listdir(self.dir))
        self.assertEqual(after, sorted([n[:-4] + ".md" for n in before] + ["report.out"]))
        for n, h in before.items():
            self.assertEqual(file_hash(os.path.join(self.dir, n[:-4] + ".md")), h)
        # No temporary files left behind.
        self.assertFalse([n for n in after if n.startswith(".airlock")])

    def test_rename_declined_leaves_host_untouched(self):
        self.make_files(400)
        before = tree_hash(self.dir)
        # ask with stdin not a terminal: no, and it says so.
        r = self.exec_wd(self.RENAME, "ask")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(b"401 added, 0 modified, 400 deleted", r.stderr)
        self.assertIn(b"not a terminal", r.stderr)
        self.assertIn(b"changes not applied", r.stderr)
        self.assertEqual(tree_hash(self.dir), before)

    def test_guest_symlinks_refused_and_outward_links_not_followed(self):
        outside = os.path.join(self.tmp, "outside-secret")
        with open(outside, "w") as f:
            f.write("host secret\n")
        for n in ("a.txt", "b.txt"):
            with open(os.path.join(self.dir, n), "w") as f:
                f.write("original %s\n" % n)
        os.symlink(outside, os.path.join(self.dir, "out-abs"))
        os.symlink("../outside-secret", os.path.join(self.dir, "out-rel"))
        os.symlink("a.txt", os.path.join(self.dir, "in-link"))
        # Names are bytes: a UTF-8 one and a Latin-1 one make the round trip.
        for n in ("caf\u00e9.txt".encode(), b"latin-\xe9.txt"):
            with open(os.path.join(self.dir.encode(), n), "w") as f:
                f.write("plain\n")
        with open(os.path.join(self.dir, "n" * 150), "w") as f:
            f.write("long in\n")
        passwd = file_hash("/etc/passwd")
        before = tree_hash(self.dir)
        code = ('ls -a; cat in-link %s; ' % ("n" * 150) +
                'ln -sf /etc/passwd a.txt; ln -sf %s b.txt; ln -s /etc/shadow c; '
                'mkdir d; ln -s /etc d/e; echo fine > ok.txt; echo more >> caf\u00e9.txt; '
                'echo more >> "$(printf \'latin-\\351.txt\')"; '
                'mkdir -p %s; echo deep > %s/f' % (outside, "l" * 120, "l" * 120))
        r = self.exec_wd(code, "yes")
        self.assertEqual(r.returncode, 0, r.stderr)
        # Push: outward links skipped with a warning, never followed; the inward one kept.
        for gone in (b"out-abs", b"out-rel", b"host secret"):
            self.assertNotIn(gone, r.stdout)
        for kept in (b"original a.txt", b"long in"):
            self.assertIn(kept, r.stdout)
        self.assertIn(b"out-abs: symlink pointing outside the directory, not followed",
                      r.stderr)
        self.assertIn(b"out-rel: symlink pointing outside the directory", r.stderr)
        # Pull: every guest-made symlink refused, the rest applied.
        for name in (b"a.txt", b"b.txt", b"c", b"d/e"):
            self.assertRegex(r.stderr, rb"\n  \w+ +" + name + rb" \(symlink\)  REFUSED: a "
                             rb"symlink made in the guest")
        self.assertEqual(file_hash("/etc/passwd"), passwd)
        with open(outside) as f:
            self.assertEqual(f.read(), "host secret\n")
        for n in ("a.txt", "b.txt"):
            p = os.path.join(self.dir, n)
            self.assertFalse(os.path.islink(p))
            with open(p) as f:
                self.assertEqual(f.read(), "original %s\n" % n)
        self.assertFalse(os.path.lexists(os.path.join(self.dir, "c")))
        self.assertFalse(os.path.lexists(os.path.join(self.dir, "d", "e")))
        self.assertTrue(os.path.isdir(os.path.join(self.dir, "d")))
        with open(os.path.join(self.dir, "ok.txt")) as f:
            self.assertEqual(f.read(), "fine\n")
        # The host's own outward links are still there, untouched.
        self.assertEqual(os.readlink(os.path.join(self.dir, "out-abs")), outside)
        for n in ("caf\u00e9.txt".encode(), b"latin-\xe9.txt"):
            with open(os.path.join(self.dir.encode(), n)) as f:
                self.assertEqual(f.read(), "plain\nmore\n")
            with open(os.path.join(self.dir.encode(), n), "w") as f:
                f.write("plain\n")
        self.assertIn("modified  caf\u00e9.txt (6 B -> 11 B)".encode(), r.stderr)
        self.assertIn(b"modified  latin-\\xe9.txt (6 B -> 11 B)", r.stderr)
        # A long name (over ustar's 100 bytes) both ways.
        with open(os.path.join(self.dir, "l" * 120, "f")) as f:
            self.assertEqual(f.read(), "deep\n")
        shutil.rmtree(os.path.join(self.dir, "l" * 120))
        os.remove(os.path.join(self.dir, "ok.txt"))
        os.rmdir(os.path.join(self.dir, "d"))
        self.assertEqual(tree_hash(self.dir), before)

    # What a run may plant for the host to run: git's config (core.fsmonitor runs on every
    # `git status`) and a hook, an executable, a Makefile.
    PLANT = (r'printf "\tfsmonitor = touch %s\n" >> .git/config; '
             r'printf "#!/bin/sh\ntouch %s\n" > .git/hooks/post-commit; '
             'chmod +x .git/hooks/post-commit; printf "#!/bin/sh\necho hi\n" > run.sh; '
             'chmod +x run.sh; printf "all:\n\ttrue\n" > Makefile')

    def plant(self, sync, extra=()):
        subprocess.run(["git", "init", "-q", self.dir], check=True)
        self.marker = os.path.join(self.tmp, "ran-on-host")
        with open(os.path.join(self.dir, ".git", "config"), "rb") as f:
            self.config = f.read()
        return self.exec_wd(self.PLANT % (self.marker, self.marker), sync, extra)

    def git_status_runs_nothing(self):
        subprocess.run(["git", "-C", self.dir, "status", "--short"], check=True,
                       stdout=subprocess.DEVNULL)
        self.assertFalse(os.path.exists(self.marker), "git on the host ran the guest's command")

    def mode(self, rel):
        return stat.S_IMODE(os.stat(os.path.join(self.dir, rel)).st_mode)

    def test_sync_back_yes_holds_git_and_exec_bits(self):
        r = self.plant("yes")
        self.assertEqual(r.returncode, 0, r.stderr)
        # What lands: nothing under .git/, no exec bit, the rest as written.
        with open(os.path.join(self.dir, ".git", "config"), "rb") as f:
            self.assertEqual(f.read(), self.config)
        self.assertFalse(os.path.exists(os.path.join(self.dir, ".git/hooks/post-commit")))
        self.git_status_runs_nothing()
        self.assertEqual(self.mode("run.sh") & 0o111, 0)
        self.assertTrue(os.path.isfile(os.path.join(self.dir, "Makefile")))
        # What is said, prominently, before and after.
        err = r.stderr.decode()
        self.assertIn("  modified  .git/config (", err)
        self.assertIn("[GIT: runs on this host]", err)
        self.assertIn("airlock: WARNING: 2 changes under .git/", err)
        self.assertIn("airlock: WARNING: 2 files the guest made executable", err)
        self.assertIn("airlock: note: 1 changed file that tools run or load", err)
        self.assertIn("airlock: applied 2 changes to %s\n" % self.dir, err)
        self.assertIn("airlock: not applied: 2 changes under .git/ (--sync-back-git", err)
        self.assertIn("airlock: 1 file written without the exec bit", err)

    def test_sync_back_git_and_exec_flags_apply_them(self):
        r = self.plant("yes", ["--sync-back-git", "--sync-back-exec"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(b"airlock: applied 4 changes", r.stderr)
        self.assertNotIn(b"not applied", r.stderr)
        with open(os.path.join(self.dir, ".git", "config"), "rb") as f:
            self.assertIn(b"fsmonitor = touch " + self.marker.encode(), f.read())
        self.assertEqual(self.mode(".git/hooks/post-commit") & 0o111, 0o111)
        self.assertEqual(self.mode("run.sh") & 0o111, 0o111)
        # --sync-back-git alone: the hook comes, but not as a program.
        shutil.rmtree(self.dir)
        r = self.plant("yes", ["--sync-back-git"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.mode(".git/hooks/post-commit") & 0o111, 0)
        self.assertEqual(self.mode("run.sh") & 0o111, 0)

    def test_ask_wants_a_separate_yes_for_git(self):
        # On a terminal, each question answered when asked: "y" to the changes, "y" to .git/
        # (which wants the word, so a stray y plants nothing), "y" to the exec bits.
        subprocess.run(["git", "init", "-q", self.dir], check=True)
        self.marker = os.path.join(self.tmp, "ran-on-host")
        with open(os.path.join(self.dir, ".git", "config"), "rb") as f:
            self.config = f.read()
        master, slave = pty.openpty()
        p = altest.popen(["exec"] + IMAGE + ["--workdir", self.dir, "--lang", "sh", "-c",
                                             self.PLANT % (self.marker, self.marker)],
                         stdin=slave, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        os.close(slave)
        err = b""
        prompts = [b"? [y/N] ", b"Type 'yes' to apply: ", b"? [y/N] "]
        deadline = time.monotonic() + altest.HANG_GUARD_S
        try:
            while time.monotonic() < deadline:
                chunk = os.read(p.stderr.fileno(), 4096)
                if not chunk:
                    break
                err += chunk
                if prompts and err.endswith(prompts[0]):
                    prompts.pop(0)
                    os.write(master, b"y\n")
        finally:
            if p.poll() is None and time.monotonic() >= deadline:
                p.kill()
            status = p.wait(timeout=60)
            os.close(master)
            p.stderr.close()
        self.assertEqual(status, 0, err)
        self.assertEqual(prompts, [], err)
        self.assertIn(b"Apply these changes to %s? [y/N] " % self.dir.encode(), err)
        self.assertIn(b"Also apply the 2 changes under .git/", err)
        # The hook is not written, so only run.sh's exec bit is in question.
        self.assertIn(b"Keep the exec bit on the 1 file the guest", err)
        self.assertIn(b"not applied: 2 changes under .git/", err)
        with open(os.path.join(self.dir, ".git", "config"), "rb") as f:
            self.assertEqual(f.read(), self.config)
        self.assertEqual(self.mode("run.sh") & 0o111, 0o111)
        self.git_status_runs_nothing()

    def test_consents_are_not_profile_settings(self):
        # A profile is a file kept and shared; a consent to apply .git/ or exec bits is given
        # for one run, on its command line. Refused before anything starts.
        pdir = os.path.join(self.tmp, "config", "airlock", "profiles")
        os.makedirs(pdir)
        for key in ("sync_back_git", "sync-back-exec"):
            with open(os.path.join(pdir, "default.yaml"), "w") as f:
                f.write("%s: true\n" % key)
            r = altest.run(["run", "--image", "tiny", "task"],
                           env={"XDG_CONFIG_HOME": os.path.join(self.tmp, "config")})
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(b"profile: unknown setting '%s' (a consent for one run: give it on "
                          b"the command line)" % key.encode(), r.stderr)

    def test_size_limits(self):
        with open(os.path.join(self.dir, "big"), "wb") as f:
            f.write(b"x" * 3000)
        # Over the limit on the way in: refused before anything is sent.
        r = self.exec_wd("echo ran", "yes", extra=["--workdir-limit", "2000"])
        self.assertEqual(r.returncode, 125, r.stderr)
        self.assertNotIn(b"ran", r.stdout)
        self.assertIn(b"holds 3000 bytes of files, over the limit of 2000", r.stderr)
        # Within it on the way in, over it on the way back: nothing applied.
        before = tree_hash(self.dir)
        r = self.exec_wd("head -c 9000 /dev/zero > more", "yes",
                         extra=["--workdir-limit", "8000"])
        self.assertEqual(r.returncode, 125, r.stderr)
        self.assertIn(b"the limit of 8000 bytes", r.stderr)
        self.assertEqual(tree_hash(self.dir), before)


class CpTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="airlock-cp-")
        self.holder = None

    def tearDown(self):
        if self.holder and self.holder.poll() is None:
            self.holder.kill()
            self.holder.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def sessions(self):
        ps = altest.run(["ps"])
        self.assertEqual(ps.returncode, 0, ps.stderr)
        return [l.split() for l in ps.stdout.decode().splitlines()[1:]]

    def session_up(self):
        """Starts a session held by another airlock process; returns its name."""
        self.holder = altest.popen(["exec"] + IMAGE + ["--linger", "200", "--", "true"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            self.assertIsNone(self.holder.poll(), self.holder.stderr.read() if
                              self.holder.poll() is not None else "")
            for fields in self.sessions():
                if fields[3] == str(self.holder.pid):
                    self.assertEqual(fields[1], "tiny")
                    return fields[0]
            time.sleep(0.5)
        self.fail("the session never showed in airlock ps")

    def test_cp_in_and_out_of_a_running_session(self):
        name = self.session_up()
        # Only its owner may talk to the session.
        sock = os.path.join(altest.runtime_sessions_dir(), name, "control.sock")
        self.assertEqual(os.stat(sock).st_mode & 0o777, 0o600)
        src = os.path.join(self.tmp, "in.bin")
        data = os.urandom(200000)
        with open(src, "wb") as f:
            f.write(data)
        tree = os.path.join(self.tmp, "tree")
        os.makedirs(os.path.join(tree, "sub"))
        with open(os.path.join(tree, "sub", "x.txt"), "w") as f:
            f.write("x\n")
        os.symlink("sub/x.txt", os.path.join(tree, "link"))
        # A file to a new name, then a directory into an existing guest directory.
        r = altest.run(["cp", src, name + ":/tmp/copied.bin"])
        self.assertEqual(r.returncode, 0, r.stderr)
        r = altest.run(["cp", tree, name + ":/tmp/"])
        self.assertEqual(r.returncode, 0, r.stderr)
        # Back out: the file, and the directory as a new one (its symlink left out).
        out = os.path.join(self.tmp, "out.bin")
        r = altest.run(["cp", name + ":/tmp/copied.bin", out])
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(out, "rb") as f:
            self.assertEqual(f.read(), data)
        back = os.path.join(self.tmp, "back")
        # ":" names the only session; with others running (other tests, other users of this
        # host's libvirt) it asks for a name instead.
        before = len(self.sessions())
        r = altest.run(["cp", ":/tmp/tree", back])
        if r.returncode != 0:
            self.assertIn(b"sessions are running: name one", r.stderr)
            self.assertGreater(max(before, len(self.sessions())), 1)
            r = altest.run(["cp", name + ":/tmp/tree", back])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(b"1 entries left out", r.stderr)
        with open(os.path.join(back, "sub", "x.txt")) as f:
            self.assertEqual(f.read(), "x\n")
        self.assertFalse(os.path.lexists(os.path.join(back, "link")))
        # Into an existing directory: inside it, and never merged into one there.
        r = altest.run(["cp", name + ":/tmp/tree", back])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(os.path.isfile(os.path.join(back, "tree", "sub", "x.txt")))
        r = altest.run(["cp", name + ":/tmp/tree", back])
        self.assertEqual(r.returncode, 1)
        self.assertIn(b"File exists", r.stderr)
        # Errors are one clear line.
        r = altest.run(["cp", name + ":/no/such/file", os.path.join(self.tmp, "nothing")])
        self.assertEqual(r.returncode, 1)
        self.assertIn(b"cannot read '/no/such/file'", r.stderr)
        r = altest.run(["cp", src, "airlock-000000000000:/tmp/x"])
        self.assertEqual(r.returncode, 1)
        self.assertIn(b"no running session", r.stderr)
        # The holder ends on a signal, cleanly, and the session is gone.
        self.holder.send_signal(signal.SIGTERM)
        self.assertEqual(self.holder.wait(timeout=60), 0)
        self.assertNotIn(name.encode(), altest.run(["ps"]).stdout)


if __name__ == "__main__":
    altest.main()

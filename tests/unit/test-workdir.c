/* Applying a hostile guest's tree to a host directory, without a VM: a stand-in for the guest
 * answers "tar -c" with crafted streams no real tar would write (the integration tests cover
 * what real guests send). Nothing may be written outside the directory, nothing followed. TAP. */
#include "tar.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tap.h"

/* ---- crafted streams ---- */

struct blob {
    char *buf;
    size_t len;
};

struct ent {
    const char *path;
    int type;         /* AE_IF* */
    const char *data; /* file content, or link target */
    bool hardlink;
    unsigned mode; /* 0: 0644 */
};

static struct blob make_tar(const struct ent *v)
{
    static char buf[1 << 20];
    size_t used = 0;
    struct archive *a = archive_write_new();
    archive_write_set_format_gnutar(a);
    archive_write_open_memory(a, buf, sizeof(buf), &used);
    for (; v->path; v++) {
        struct archive_entry *e = archive_entry_new();
        archive_entry_set_pathname(e, v->path);
        archive_entry_set_filetype(e, v->type);
        archive_entry_set_perm(e, v->mode ? v->mode : 0644);
        if (v->hardlink)
            archive_entry_set_hardlink(e, v->data);
        else if (v->type == AE_IFLNK)
            archive_entry_set_symlink(e, v->data);
        size_t n = v->type == AE_IFREG && !v->hardlink ? strlen(v->data) : 0;
        archive_entry_set_size(e, (la_int64_t)n);
        archive_write_header(a, e);
        if (n)
            archive_write_data(a, v->data, n);
        archive_entry_free(e);
    }
    archive_write_close(a);
    archive_write_free(a);
    return (struct blob){buf, used};
}

/* The stand-in guest: "tar -c" writes the blob to stdout. */
static int fake_exec(void *ctx, const al_exec_opts *o, al_exec_result *out, al_error *err)
{
    (void)err;
    const struct blob *b = ctx;
    if (strcmp(o->argv[0], "tar") || strcmp(o->argv[1], "-c"))
        return -ENOSYS;
    if (write(o->stdout_fd, b->buf, b->len) != (ssize_t)b->len)
        return -EIO;
    *out = (al_exec_result){0};
    return 0;
}

/* ---- host fixtures ---- */

static char root[256], dir[300], outside[300];

static void put(const char *rel, const char *text)
{
    char p[600];
    snprintf(p, sizeof(p), "%s/%s", dir, rel);
    FILE *f = fopen(p, "w");
    fputs(text, f);
    fclose(f);
}

static bool has(const char *path, const char *text)
{
    char buf[256] = {0};
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    return !strcmp(buf, text);
}

static bool has_rel(const char *rel, const char *text)
{
    char p[600];
    snprintf(p, sizeof(p), "%s/%s", dir, rel);
    return has(p, text);
}

static void fresh(void)
{
    char cmd[1400];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s' '%s' && mkdir '%s' '%s'", dir, outside, dir, outside);
    if (system(cmd) != 0)
        abort();
}

static al_workdir_diff *diff_of(const struct ent *v, al_error *err)
{
    struct blob b = make_tar(v);
    struct al_runner run = {.exec = fake_exec, .ctx = &b, .spool_dir = root};
    al_workdir_diff *d = NULL;
    if (al_workdir_diff_run(&run, dir, NULL, &d, err) < 0)
        return NULL;
    return d;
}

static mode_t mode_of(const char *rel)
{
    char p[600];
    struct stat st;
    snprintf(p, sizeof(p), "%s/%s", dir, rel);
    return lstat(p, &st) < 0 ? (mode_t)-1 : st.st_mode & 07777;
}

static void mkdir_rel(const char *rel)
{
    char p[600];
    snprintf(p, sizeof(p), "%s/%s", dir, rel);
    if (mkdir(p, 0755) < 0)
        abort();
}

static void chmod_rel(const char *rel, mode_t m)
{
    char p[600];
    snprintf(p, sizeof(p), "%s/%s", dir, rel);
    if (chmod(p, m) < 0)
        abort();
}

static const al_change *change(al_workdir_diff *d, const char *path)
{
    for (size_t i = 0; i < al_workdir_diff_count(d); i++)
        if (!strcmp(al_workdir_diff_at(d, i)->path, path))
            return al_workdir_diff_at(d, i);
    return NULL;
}

int main(void)
{
    snprintf(root, sizeof(root), "/tmp/test-workdir-XXXXXX");
    if (!mkdtemp(root))
        return 1;
    snprintf(dir, sizeof(dir), "%s/dir", root);
    snprintf(outside, sizeof(outside), "%s/outside", root);
    al_error err = {0};
    char p[700];

    /* Ordinary changes: added, modified, deleted, each file replaced by a rename. */
    fresh();
    put("keep", "same\n");
    put("mod", "old\n");
    put("gone", "bye\n");
    const struct ent normal[] = {{"./", AE_IFDIR, NULL, false},
                                 {"./keep", AE_IFREG, "same\n", false},
                                 {"./mod", AE_IFREG, "new text\n", false},
                                 {"./new/", AE_IFDIR, NULL, false},
                                 {"./new/f", AE_IFREG, "f\n", false},
                                 {NULL, 0, NULL, false}};
    al_workdir_diff *d = diff_of(normal, &err);
    ok(d && al_workdir_diff_count(d) == 4, "a plain diff has 4 changes (%s)", err.msg);
    ok(d && change(d, "mod") && change(d, "mod")->kind == AL_CHANGE_MODIFIED &&
           change(d, "mod")->old_size == 4 && change(d, "mod")->new_size == 9,
       "a modified file, with both sizes");
    ok(d && change(d, "gone") && change(d, "gone")->kind == AL_CHANGE_DELETED, "a deletion");
    ok(d && !change(d, "keep"), "an unchanged file is not listed");
    ok(d && al_workdir_apply(d, 0, &err) == 4, "all 4 applied (%s)", err.msg);
    snprintf(p, sizeof(p), "%s/gone", dir);
    ok(has_rel("mod", "new text\n") && has_rel("new/f", "f\n") && access(p, F_OK) < 0,
       "the directory holds the guest's tree");
    al_workdir_diff_free(d);

    /* A file replaced by a symlink to /etc/passwd, and one into the host's own dir. */
    fresh();
    put("a.txt", "mine\n");
    const struct ent links[] = {{"a.txt", AE_IFLNK, "/etc/passwd", false},
                                {"b", AE_IFLNK, outside, false},
                                {NULL, 0, NULL, false}};
    d = diff_of(links, &err);
    ok(d && change(d, "a.txt") && change(d, "a.txt")->refused && change(d, "b") &&
           change(d, "b")->refused,
       "guest symlinks are refused");
    ok(d && al_workdir_apply(d, 0, &err) == 0, "nothing applied");
    struct stat st;
    snprintf(p, sizeof(p), "%s/b", dir);
    ok(has_rel("a.txt", "mine\n") && lstat(p, &st) < 0, "the host files are as they were");
    al_workdir_diff_free(d);

    /* A symlink the guest made, then a file "through" it: never written outside. */
    fresh();
    const struct ent through[] = {{"d", AE_IFLNK, outside, false},
                                  {"d/planted", AE_IFREG, "evil\n", false},
                                  {NULL, 0, NULL, false}};
    d = diff_of(through, &err);
    ok(d != NULL, "a diff of a stream going through a guest symlink (%s)", err.msg);
    if (d)
        al_workdir_apply(d, 0, &err);
    snprintf(p, sizeof(p), "%s/planted", outside);
    ok(access(p, F_OK) < 0, "nothing planted outside through a guest symlink");
    ok(d && change(d, "d/planted") && change(d, "d/planted")->result < 0,
       "the file through the symlink failed to apply");
    al_workdir_diff_free(d);

    /* The host's own symlink leading out (never pushed): a guest file under its name. */
    fresh();
    snprintf(p, sizeof(p), "%s/out", dir);
    if (symlink(outside, p) < 0)
        return 1;
    const struct ent under[] = {{"out/", AE_IFDIR, NULL, false},
                                {"out/planted", AE_IFREG, "evil\n", false},
                                {NULL, 0, NULL, false}};
    d = diff_of(under, &err);
    ok(d && change(d, "out/planted") && change(d, "out/planted")->refused,
       "a path through a host symlink is refused");
    if (d)
        al_workdir_apply(d, 0, &err);
    snprintf(p, sizeof(p), "%s/planted", outside);
    ok(access(p, F_OK) < 0, "nothing planted through the host's own symlink");
    al_workdir_diff_free(d);

    /* Hard links and devices listed, refused; a duplicate name fails the whole diff. */
    fresh();
    const struct ent odd[] = {{"h", AE_IFREG, "/etc/shadow", true},
                              {"null", AE_IFCHR, "", false},
                              {NULL, 0, NULL, false}};
    d = diff_of(odd, &err);
    ok(d && change(d, "h") && change(d, "h")->refused && change(d, "null") &&
           change(d, "null")->refused,
       "hard links and devices are refused");
    al_workdir_diff_free(d);
    const struct ent dup[] = {{"a", AE_IFREG, "one", false},
                              {"a", AE_IFLNK, "/etc/passwd", false},
                              {NULL, 0, NULL, false}};
    err = (al_error){0};
    d = diff_of(dup, &err);
    ok(!d && strstr(err.msg, "twice"), "a name sent twice fails the diff: %s", err.msg);
    const struct ent bad[] = {{"../escape", AE_IFREG, "x", false}, {NULL, 0, NULL, false}};
    err = (al_error){0};
    d = diff_of(bad, &err);
    ok(!d && strstr(err.msg, "unsafe path"), "'..' fails the diff: %s", err.msg);

    /* The host changed meanwhile: the file is left alone. */
    fresh();
    put("mod", "old\n");
    const struct ent later[] = {{"mod", AE_IFREG, "new\n", false}, {NULL, 0, NULL, false}};
    err = (al_error){0};
    d = diff_of(later, &err);
    snprintf(p, sizeof(p), "%s/mod", dir);
    unlink(p);
    if (symlink("/etc/passwd", p) < 0)
        return 1;
    if (d)
        al_workdir_apply(d, 0, &err);
    char target[64] = {0};
    ok(d && change(d, "mod")->result == -EEXIST && readlink(p, target, sizeof(target) - 1) > 0 &&
           !strcmp(target, "/etc/passwd"),
       "a file the user replaced meanwhile is not written (nor through)");
    al_workdir_diff_free(d);

    /* What makes the host run code: a planted core.fsmonitor and hook, exec bits, a Makefile.
     * The first is held without its consent; exec bits are dropped without theirs. */
    umask(022);
    for (int consent = 0; consent < 2; consent++) {
        fresh();
        mkdir_rel(".git");
        mkdir_rel(".git/hooks");
        put(".git/config", "[core]\n");
        put(".git/hooks/pre-commit", "#!/bin/sh\nrun-checks\n");
        put("tool", "#!/bin/sh\nold\n");
        put("x-already", "#!/bin/sh\nold\n");
        chmod_rel("x-already", 0755);
        mkdir_rel("sub");
        const struct ent planted[] = {
            {".git/", AE_IFDIR, NULL, false, 0755},
            {".git/config", AE_IFREG, "[core]\n\tfsmonitor = touch /tmp/pwned\n", false, 0},
            {".git/hooks/", AE_IFDIR, NULL, false, 0755},
            {".git/hooks/post-commit", AE_IFREG, "#!/bin/sh\nevil\n", false, 0755},
            {"sub/", AE_IFDIR, NULL, false, 0755},
            {"sub/.GIT", AE_IFREG, "gitdir: /tmp/evil\n", false, 0},
            {"run.sh", AE_IFREG, "#!/bin/sh\nnew\n", false, 0755},
            {"tool", AE_IFREG, "#!/bin/sh\nnew\n", false, 0755},
            {"x-already", AE_IFREG, "#!/bin/sh\nnew\n", false, 0755},
            {"Makefile", AE_IFREG, "all:\n\tevil\n", false, 0},
            {".vscode/", AE_IFDIR, NULL, false, 0755},
            {".vscode/tasks.json", AE_IFREG, "{}\n", false, 0},
            {"plain.txt", AE_IFREG, "text\n", false, 0},
            {NULL, 0, NULL, false, 0}};
        err = (al_error){0};
        d = diff_of(planted, &err);
        ok(d != NULL, "a diff of a tree planting code (%s)", err.msg);
        if (!d)
            continue;
        const al_change *cfg = change(d, ".git/config"),
                        *hook = change(d, ".git/hooks/post-commit"),
                        *pre = change(d, ".git/hooks/pre-commit"), *gitfile = change(d, "sub/.GIT"),
                        *run = change(d, "run.sh"), *tool = change(d, "tool"),
                        *xa = change(d, "x-already"), *mk = change(d, "Makefile"),
                        *vs = change(d, ".vscode/tasks.json"), *txt = change(d, "plain.txt");
        if (!consent) {
            ok(cfg && cfg->kind == AL_CHANGE_MODIFIED && cfg->flags == AL_CHANGE_VCS && hook &&
                   hook->flags == (AL_CHANGE_VCS | AL_CHANGE_EXEC) && pre &&
                   pre->kind == AL_CHANGE_DELETED && pre->flags == AL_CHANGE_VCS && gitfile &&
                   gitfile->flags == AL_CHANGE_VCS,
               ".git/ changes (modified, added, deleted, any depth, any case) are flagged");
            ok(run && run->flags == AL_CHANGE_EXEC && tool && tool->flags == AL_CHANGE_EXEC && xa &&
                   xa->flags == 0,
               "exec bits the guest added are flagged; a host file already executable is not");
            ok(mk && mk->flags == AL_CHANGE_RUNS && vs && vs->flags == AL_CHANGE_RUNS && txt &&
                   txt->flags == 0,
               "Makefile and editor tasks are flagged as run by tools, a text file is not");
        }
        unsigned allow = consent ? AL_APPLY_VCS | AL_APPLY_EXEC : 0;
        int applied = al_workdir_apply(d, allow, &err);
        snprintf(p, sizeof(p), "%s/.git/hooks/post-commit", dir);
        if (!consent) {
            ok(applied == 7, "the other 7 are applied (%d, %s)", applied, err.msg);
            ok(has_rel(".git/config", "[core]\n") && access(p, F_OK) < 0 &&
                   has_rel(".git/hooks/pre-commit", "#!/bin/sh\nrun-checks\n") &&
                   mode_of("sub/.GIT") == (mode_t)-1,
               "without consent nothing under .git/ is touched");
            ok(cfg && cfg->held && hook && hook->held && pre && pre->held && !txt->held &&
                   cfg->result == 0,
               ".git/ changes are marked held");
            ok(has_rel("run.sh", "#!/bin/sh\nnew\n") && mode_of("run.sh") == 0644 &&
                   has_rel("tool", "#!/bin/sh\nnew\n") && mode_of("tool") == 0644,
               "without consent files come without exec bits (run.sh %o, tool %o)",
               mode_of("run.sh"), mode_of("tool"));
            ok(mode_of("x-already") == 0755, "a host file's own exec bit is kept");
            ok(has_rel("Makefile", "all:\n\tevil\n") && has_rel(".vscode/tasks.json", "{}\n") &&
                   has_rel("plain.txt", "text\n"),
               "flagged project files are applied with the rest");
        } else {
            ok(applied == 11, "with consent all 11 changes are applied (%d, %s)", applied, err.msg);
            ok(has_rel(".git/config", "[core]\n\tfsmonitor = touch /tmp/pwned\n") &&
                   mode_of(".git/hooks/post-commit") == 0755 &&
                   mode_of(".git/hooks/pre-commit") == (mode_t)-1 && cfg && !cfg->held,
               "with consent .git/ changes are applied, the hook executable");
            ok(mode_of("run.sh") == 0755 && mode_of("tool") == 0755,
               "with consent exec bits are kept (run.sh %o, tool %o)", mode_of("run.sh"),
               mode_of("tool"));
        }
        al_workdir_diff_free(d);
    }
    /* Modes: set-id and sticky bits never reach the host, and new entries get the umask. */
    fresh();
    mode_t old_umask = umask(027);
    const struct ent modes[] = {{"./", AE_IFDIR, NULL, false, 0755},
                                {"./suid", AE_IFREG, "x", false, 06777},
                                {"./plain", AE_IFREG, "y", false, 01666},
                                {"./sub/", AE_IFDIR, NULL, false, 07777},
                                {NULL, 0, NULL, false, 0}};
    err = (al_error){0};
    d = diff_of(modes, &err);
    ok(d && al_workdir_apply(d, AL_APPLY_EXEC, &err) == 3,
       "files with set-id modes applied, exec bits consented (%s)", err.msg);
    struct stat s1, s2, s3;
    char p2[700], p3[700];
    snprintf(p, sizeof(p), "%s/suid", dir);
    snprintf(p2, sizeof(p2), "%s/plain", dir);
    snprintf(p3, sizeof(p3), "%s/sub", dir);
    bool st1 = stat(p, &s1) == 0, st2 = stat(p2, &s2) == 0, st3 = stat(p3, &s3) == 0;
    ok(st1 && (s1.st_mode & 07777) == 0750, "06777 from the guest: 0750 (%04o)",
       (unsigned)(s1.st_mode & 07777));
    ok(st2 && (s2.st_mode & 07777) == 0640, "01666 from the guest: 0640 (%04o)",
       (unsigned)(s2.st_mode & 07777));
    ok(st3 && (s3.st_mode & 07777) == 0750, "a 07777 dir: 0750 (%04o)",
       (unsigned)(s3.st_mode & 07777));
    umask(old_umask);
    al_workdir_diff_free(d);

    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
    if (system(cmd) != 0)
        return 1;
    return tap_done();
}

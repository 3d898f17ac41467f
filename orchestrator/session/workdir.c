/* The user's directory in and out of the guest: pushed into /workspace as a tar stream at the
 * start, pulled back as one at the end, compared with the host directory, and applied to it
 * only beneath it, never through a symlink, one atomic rename per file. */
#include "session.h"
#include "tar.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Room for tar's own bytes around the file data: a header block and padding per entry, and
 * long-name records. Bounds the spool file; the reader enforces the exact limits. */
#define TAR_OVERHEAD_MAX (256ull << 20)
/* The least time our own commands in the guest (tar, mkdir) get before the host gives up. */
#define GUEST_RUN_TIMEOUT_MS 60000u
/* What is kept of the guest tar's stderr, to quote its first line in an error. */
#define TAR_STDERR_MAX (64 * 1024)
/* Tries at a fresh temporary name before giving up. */
#define TMP_NAME_TRIES 16

/* ---- running tar in the guest ---- */

static int spool_open(const char *dir, al_error *err)
{
    int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0)
        return fd;
    char tmpl[AL_PATH_MAX];
    if (al_pathf(tmpl, sizeof(tmpl), "%s/.spool-XXXXXX", dir) < 0)
        return al_err(err, -ENAMETOOLONG, "spool path too long");
    fd = mkostemp(tmpl, O_CLOEXEC);
    if (fd < 0)
        return al_err(err, -errno, "cannot create a spool file in '%s': %s", dir, strerror(errno));
    unlink(tmpl);
    return fd;
}

/* The first line of what tar said, printable. */
static void first_line(int fd, char *out, size_t len)
{
    char buf[256];
    ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
    buf[n > 0 ? n : 0] = '\0';
    buf[strcspn(buf, "\n")] = '\0';
    al_path_escape(buf[0] ? buf : "no message", out, len);
}

static int guest_run(const struct al_runner *run, const char *const *argv, int in_fd, int out_fd,
                     uint64_t out_cap, bool *truncated, al_error *err)
{
    _cleanup_close_ int efd = spool_open(run->spool_dir, err);
    if (efd < 0)
        return efd;
    al_exec_opts o = {
        .struct_size = sizeof(al_exec_opts),
        .argv = argv,
        .stdin_fd = in_fd,
        .stdout_fd = out_fd >= 0 ? out_fd : efd,
        .stderr_fd = efd,
        .output_cap = out_cap,
        /* Our own tar and mkdir: a guest that never answers must not hold us forever. A minute,
         * plus a second per MB the copy may carry (TCG guests move tens of MB/s). */
        .timeout_ms =
            (unsigned)(GUEST_RUN_TIMEOUT_MS +
                       (out_cap > (uint64_t)INT32_MAX * 1000u ? INT32_MAX : out_cap / 1000u)),
    };
    al_exec_result res = AL_EXEC_RESULT_INIT;
    int r = run->exec(run->ctx, &o, &res, err);
    if (r == -ENOENT)
        return al_err(err, r, "the image has no %s to copy files with", argv[0]);
    if (r < 0)
        return r;
    *truncated = res.truncated_stdout;
    if (res.how != AL_EXEC_EXITED || res.value != 0) {
        char line[300];
        first_line(efd, line, sizeof(line));
        return al_err(err, -EIO, "%s in the guest failed (%s %d): %s", argv[0],
                      res.how == AL_EXEC_EXITED ? "status" : "signal", res.value, line);
    }
    return 0;
}

struct put_writer {
    int fd, dirfd, file_fd;
    const struct al_tree *t;
    const char *prefix;
    al_error err;
    int r;
};

static void *put_thread(void *p)
{
    struct put_writer *w = p;
    w->r = w->file_fd >= 0 ? al_tar_write_file(w->fd, w->file_fd, w->prefix, &w->err)
                           : al_tar_write_tree(w->fd, w->dirfd, w->t, w->prefix, &w->err);
    shutdown(w->fd, SHUT_WR);
    return NULL;
}

int al_tree_put(const struct al_runner *run, int dirfd, const struct al_tree *t, int file_fd,
                const char *prefix, const char *guest_dir, al_error *err)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        return al_err(err, -errno, "socketpair: %s", strerror(errno));
    _cleanup_close_ int rd = sv[0], wr = sv[1];
    struct put_writer w = {.fd = wr, .dirfd = dirfd, .file_fd = file_fd, .t = t, .prefix = prefix};
    pthread_t th;
    int e = pthread_create(&th, NULL, put_thread, &w);
    if (e)
        return al_err(err, -e, "cannot start a thread: %s", strerror(e));
    /* -m: the files are dated by the guest's clock as they land, like anything written there,
     * so that "newer than" in the guest (the chat's list of files a run wrote) holds for them. */
    const char *argv[] = {"tar", "-x", "-m", "-f", "-", "-C", guest_dir, NULL};
    bool trunc = false;
    int r = guest_run(run, argv, rd, -1, TAR_STDERR_MAX, &trunc, err);
    /* A writer still sending learns the reader is gone. */
    shutdown(rd, SHUT_RDWR);
    pthread_join(th, NULL);
    if (w.r < 0 && r >= 0)
        r = al_err(err, w.r, "%s", w.err.msg);
    return r;
}

static int session_exec(void *ctx, const al_exec_opts *o, al_exec_result *out, al_error *err)
{
    return al_exec(ctx, o, out, err);
}

const char *al_spool_dir(void)
{
    const char *t = getenv("TMPDIR");
    return t && t[0] == '/' ? t : "/var/tmp";
}

static struct al_runner session_runner(al_session *s)
{
    return (struct al_runner){.exec = session_exec, .ctx = s, .spool_dir = al_spool_dir()};
}

static uint64_t bytes_max(const al_workdir_opts *o)
{
    return o && o->bytes_max ? o->bytes_max : AL_WORKDIR_BYTES_MAX_DEFAULT;
}

static const char *guest_dir(const al_workdir_opts *o)
{
    return o && o->guest_dir ? o->guest_dir : AL_WORKDIR_GUEST_DIR;
}

/* ---- push ---- */

int al_workdir_push(al_session *s, const char *dir, const al_workdir_opts *o,
                    al_workdir_push_result *out, al_error *err)
{
    struct al_runner run = session_runner(s);
    return al_workdir_push_run(&run, dir, o, out, err);
}

int al_workdir_push_run(const struct al_runner *run, const char *dir, const al_workdir_opts *in,
                        al_workdir_push_result *out, al_error *err)
{
    al_workdir_opts taken = AL_WORKDIR_OPTS_INIT;
    const al_workdir_opts *o = in ? &taken : NULL;
    int r0 = in ? AL_SIZED_IN(&taken, in, "al_workdir_opts", err) : 0;
    if (r0 == 0)
        r0 = AL_SIZED_OUT(out, "al_workdir_push_result", err);
    if (r0 < 0)
        return r0;
    _cleanup_close_ int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return al_err(err, -errno, "cannot open directory '%s': %s", dir, strerror(errno));
    struct al_tar_limits lim = {.bytes_max = bytes_max(o)};
    struct al_tree t = {0};
    int r = al_tree_walk(dfd, &lim, &t, err);
    if (r == 0 && t.bytes > lim.bytes_max)
        r = al_err(err, -EFBIG, "'%s' holds %llu bytes of files, over the limit of %llu", dir,
                   (unsigned long long)t.bytes, (unsigned long long)lim.bytes_max);
    const char *mkdir_argv[] = {"mkdir", "-p", guest_dir(o), NULL};
    bool trunc;
    if (r == 0)
        r = guest_run(run, mkdir_argv, -1, -1, TAR_STDERR_MAX, &trunc, err);
    if (r == 0)
        r = al_tree_put(run, dfd, &t, -1, "", guest_dir(o), err);
    if (r < 0) {
        al_tree_free(&t);
        return r;
    }
    al_workdir_push_result res = {
        .struct_size = sizeof res, .bytes = t.bytes, .skipped = t.skipped, .nskipped = t.nskipped};
    for (size_t i = 0; i < t.n; i++) {
        res.files += t.v[i].type == AL_ENTRY_FILE;
        res.dirs += t.v[i].type == AL_ENTRY_DIR;
        res.symlinks += t.v[i].type == AL_ENTRY_SYMLINK;
    }
    t.skipped = NULL;
    t.nskipped = 0;
    al_tree_free(&t);
    *out = res;
    return 0;
}

void al_workdir_push_result_free(al_workdir_push_result *r)
{
    for (size_t i = 0; i < r->nskipped; i++)
        free(r->skipped[i]);
    free(r->skipped);
    *r = (al_workdir_push_result){0};
}

/* ---- diff ---- */

struct change {
    al_change pub;
    char *path;
    bool done; /* applied or tried: never twice */
};

struct al_workdir_diff {
    char *dir; /* NULL: a listing, nothing to apply to */
    int spool; /* the guest's tar stream, unnamed */
    struct al_tar_limits lim;
    struct change *v;
    size_t n, cap;
};

void al_workdir_diff_free(al_workdir_diff *d)
{
    if (!d)
        return;
    for (size_t i = 0; i < d->n; i++)
        free(d->v[i].path);
    free(d->v);
    free(d->dir);
    al_closep(&d->spool);
    free(d);
}

size_t al_workdir_diff_count(const al_workdir_diff *d)
{
    return d->n;
}

const al_change *al_workdir_diff_at(const al_workdir_diff *d, size_t i)
{
    return i < d->n ? &d->v[i].pub : NULL;
}

/* Does some component of path equal one of names (ASCII case ignored: a case-insensitive
 * filesystem takes .GIT for .git)? */
static bool has_component(const char *path, const char *const *names)
{
    for (const char *p = path; *p;) {
        size_t n = strcspn(p, "/");
        for (const char *const *x = names; *x; x++)
            if (strlen(*x) == n && !strncasecmp(p, *x, n))
                return true;
        p += n + (p[n] == '/');
    }
    return false;
}

/* Version-control metadata: the host's tools read its config and run its hooks. */
static const char *const vcs_dirs[] = {".git", ".hg", NULL};
/* Files and directories that tools on the host load or run when the user works in the
 * directory: direnv, make and its kin, editors' tasks, package managers' scripts, Python's
 * startup and test hooks. Flagged for the user's eye, not held back: they are ordinary project
 * files too. */
static const char *const runs_dirs[] = {".vscode", ".idea", ".devcontainer", ".cargo", NULL};
static const char *const runs_files[] = {
    ".envrc",           ".env",           "Makefile",       "makefile",
    "GNUmakefile",      "justfile",       "Justfile",       "Rakefile",
    "Taskfile.yml",     ".gitattributes", ".gitmodules",    ".pre-commit-config.yaml",
    "package.json",     ".npmrc",         "setup.py",       "conftest.py",
    "noxfile.py",       "tox.ini",        "pyproject.toml", "sitecustomize.py",
    "usercustomize.py", "build.rs",       "CMakeLists.txt", "meson.build",
    ".bashrc",          ".profile",       ".zshrc",         NULL,
};

static unsigned classify(const char *path)
{
    if (has_component(path, vcs_dirs))
        return AL_CHANGE_VCS;
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    for (const char *const *x = runs_files; *x; x++)
        if (!strcmp(base, *x))
            return AL_CHANGE_RUNS;
    return has_component(path, runs_dirs) ? AL_CHANGE_RUNS : 0;
}

static struct change *change_add(al_workdir_diff *d, int kind, int type, const char *path,
                                 const char *refused)
{
    if (al_grow(&d->v, &d->cap, d->n, sizeof(*d->v), 64) < 0)
        return NULL;
    struct change *c = &d->v[d->n];
    *c = (struct change){.path = strdup(path)};
    if (!c->path)
        return NULL;
    c->pub = (al_change){.struct_size = sizeof(al_change),
                         .kind = kind,
                         .type = type,
                         .refused = refused,
                         .flags = classify(path)};
    d->n++;
    return c;
}

static int host_type(mode_t m)
{
    return S_ISREG(m)   ? AL_ENTRY_FILE
           : S_ISDIR(m) ? AL_ENTRY_DIR
           : S_ISLNK(m) ? AL_ENTRY_SYMLINK
                        : AL_ENTRY_OTHER;
}

/* Does the guest entry's data differ from the host file at fd? Reads all of the entry. */
static int data_differs(struct al_tar_reader *rd, int fd, al_error *err)
{
    char a[16384], b[sizeof(a)];
    int differs = 0;
    for (;;) {
        ssize_t n = al_tar_read(rd, a, sizeof(a), err);
        if (n <= 0)
            return n < 0 ? (int)n : differs;
        if (differs)
            continue;
        for (ssize_t off = 0; off < n;) {
            ssize_t m = read(fd, b + off, (size_t)(n - off));
            if (m < 0 && errno == EINTR)
                continue;
            if (m <= 0) { /* shorter on the host now */
                differs = 1;
                break;
            }
            off += m;
        }
        if (!differs && memcmp(a, b, (size_t)n))
            differs = 1;
    }
}

/* Compares one guest entry with what the host has at its path. */
static int diff_entry(al_workdir_diff *d, int dirfd, struct al_tar_reader *rd,
                      const struct al_tree_entry *e, al_error *err)
{
    static const char guest_link[] = "a symlink made in the guest; not applied";
    struct stat st;
    int r = -ENOENT;
    if (dirfd >= 0) {
        _cleanup_close_ int fd = al_beneath_open(dirfd, e->path, O_PATH);
        r = fd < 0 ? fd : fstat(fd, &st) < 0 ? -errno : 0;
    }
    const char *odd = e->odd ? e->odd : e->type == AL_ENTRY_SYMLINK ? guest_link : NULL;
    struct change *c = NULL;
    if (r == -ENOENT) {
        c = change_add(d, AL_CHANGE_ADDED, e->type, e->path, odd);
        if (c)
            c->pub.new_size = e->size;
        if (c && e->type == AL_ENTRY_FILE && (e->mode & 0111))
            c->pub.flags |= AL_CHANGE_EXEC;
        return c ? 0 : al_err(err, -ENOMEM, "out of memory");
    }
    if (r < 0) {
        c = change_add(d, AL_CHANGE_ADDED, e->type, e->path,
                       "its host path leads through a symlink or a file; not applied");
        return c ? 0 : al_err(err, -ENOMEM, "out of memory");
    }
    int ht = host_type(st.st_mode);
    bool modified = false;
    const char *why = odd;
    if (e->type == AL_ENTRY_OTHER) {
        modified = true;
    } else if (ht != e->type) {
        modified = true;
        why = ht == AL_ENTRY_DIR        ? "a directory the guest replaced; not applied"
              : e->type == AL_ENTRY_DIR ? "a file the guest replaced with a directory; not applied"
                                        : why;
        if (!why)
            why = "its type changed; not applied";
    } else if (ht == AL_ENTRY_FILE) {
        modified = e->size != (uint64_t)st.st_size;
        if (!modified) {
            _cleanup_close_ int fd = al_beneath_open(dirfd, e->path, O_RDONLY);
            if (fd < 0)
                return al_err(err, fd, "cannot read '%s': %s", e->path, strerror(-fd));
            r = data_differs(rd, fd, err);
            if (r < 0)
                return r;
            modified = r;
        }
    } else if (ht == AL_ENTRY_SYMLINK) {
        char target[AL_TREE_PATH_MAX + 1];
        _cleanup_close_ int fd = al_beneath_open(dirfd, e->path, O_PATH);
        ssize_t n = fd < 0 ? -1 : readlinkat(fd, "", target, sizeof(target) - 1);
        modified = n < 0 || (target[n] = '\0', strcmp(target, e->link) != 0);
    }
    if (!modified)
        return 0;
    c = change_add(d, AL_CHANGE_MODIFIED, e->type, e->path, why);
    if (!c)
        return al_err(err, -ENOMEM, "out of memory");
    c->pub.old_size = ht == AL_ENTRY_FILE ? (uint64_t)st.st_size : 0;
    c->pub.new_size = e->size;
    if (ht == AL_ENTRY_FILE && e->type == AL_ENTRY_FILE && (e->mode & 0111) && !(st.st_mode & 0111))
        c->pub.flags |= AL_CHANGE_EXEC;
    return 0;
}

static int change_cmp(const void *a, const void *b)
{
    return strcmp(((const struct change *)a)->path, ((const struct change *)b)->path);
}

static int diff_build(al_workdir_diff *d, al_error *err)
{
    _cleanup_close_ int dirfd = -1;
    if (d->dir && (dirfd = open(d->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
        return al_err(err, -errno, "cannot open directory '%s': %s", d->dir, strerror(errno));
    struct al_tar_reader *rd = NULL;
    int r = al_tar_reader_fd(d->spool, &d->lim, &rd, err);
    if (r < 0)
        return r;
    struct al_tree guest = {0}, host = {0};
    struct al_tree_entry e;
    while ((r = al_tar_next(rd, &e, err)) > 0) {
        if (!e.path[0])
            continue;
        if (al_tree_add(&guest, &e) < 0) {
            r = al_err(err, -ENOMEM, "out of memory");
            break;
        }
        r = diff_entry(d, dirfd, rd, &e, err);
        if (r < 0)
            break;
    }
    al_tar_reader_free(rd);
    if (r == 0)
        r = al_tree_sort(&guest, err);
    if (r == 0 && dirfd >= 0)
        r = al_tree_walk(dirfd, &d->lim, &host, err);
    for (size_t i = 0; r == 0 && i < host.n; i++) {
        const struct al_tree_entry *h = &host.v[i];
        if (al_tree_find(&guest, h->path))
            continue;
        struct change *c =
            change_add(d, AL_CHANGE_DELETED, h->type, h->path,
                       h->type == AL_ENTRY_SYMLINK ? "a symlink; not deleted" : NULL);
        if (!c)
            r = al_err(err, -ENOMEM, "out of memory");
        else
            c->pub.old_size = h->size;
    }
    al_tree_free(&guest);
    al_tree_free(&host);
    if (r < 0)
        return r;
    if (d->n)
        qsort(d->v, d->n, sizeof(*d->v), change_cmp);
    for (size_t i = 0; i < d->n; i++)
        d->v[i].pub.path = d->v[i].path;
    return 0;
}

int al_workdir_diff_run(const struct al_runner *run, const char *dir, const al_workdir_opts *in,
                        al_workdir_diff **out, al_error *err)
{
    al_workdir_opts taken = AL_WORKDIR_OPTS_INIT;
    const al_workdir_opts *o = in ? &taken : NULL;
    int r0 = in ? AL_SIZED_IN(&taken, in, "al_workdir_opts", err) : 0;
    if (r0 < 0)
        return r0;
    al_workdir_diff *d = calloc(1, sizeof(*d));
    if (!d)
        return al_err(err, -ENOMEM, "out of memory");
    d->spool = -1;
    d->lim.bytes_max = bytes_max(o);
    int r = 0;
    if (dir && !(d->dir = strdup(dir)))
        r = al_err(err, -ENOMEM, "out of memory");
    if (r == 0)
        r = d->spool = spool_open(run->spool_dir, err);
    if (r >= 0) {
        const char *argv[] = {"tar", "-c", "-f", "-", "-C", guest_dir(o), ".", NULL};
        bool trunc = false;
        r = guest_run(run, argv, -1, d->spool, d->lim.bytes_max + TAR_OVERHEAD_MAX, &trunc, err);
        if (r == 0 && trunc)
            r = al_err(err, -EFBIG, "the guest's %s holds more than the limit of %llu bytes",
                       guest_dir(o), (unsigned long long)d->lim.bytes_max);
    }
    if (r == 0 && lseek(d->spool, 0, SEEK_SET) < 0)
        r = al_err(err, -errno, "cannot rewind the spool: %s", strerror(errno));
    if (r == 0)
        r = diff_build(d, err);
    if (r < 0) {
        al_workdir_diff_free(d);
        return r;
    }
    *out = d;
    return 0;
}

int al_workdir_diff_new(al_session *s, const char *dir, const al_workdir_opts *o,
                        al_workdir_diff **out, al_error *err)
{
    struct al_runner run = session_runner(s);
    return al_workdir_diff_run(&run, dir, o, out, err);
}

/* ---- apply ---- */

static struct change *change_find(al_workdir_diff *d, const char *path)
{
    struct change key = {.path = (char *)path};
    return d->n ? bsearch(&key, d->v, d->n, sizeof(*d->v), change_cmp) : NULL;
}

/* A fresh name next to the target, created with O_EXCL. */
static int tmp_create(int pfd, char name[32], mode_t mode)
{
    for (int i = 0; i < TMP_NAME_TRIES; i++) {
        uint32_t rnd;
        if (getrandom(&rnd, sizeof(rnd), 0) != sizeof(rnd))
            rnd = (uint32_t)al_now_us();
        snprintf(name, 32, ".airlock-%08x", rnd);
        int fd = openat(pfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
        if (fd >= 0 || errno != EEXIST)
            return fd < 0 ? -errno : fd;
    }
    return -EEXIST;
}

/* Writes the current entry's data to c's path: a temporary file in the same directory, synced,
 * then renamed over the old file (a modification) or into a free name (an addition). */
static int apply_file(int dirfd, struct change *c, struct al_tar_reader *rd, bool exec,
                      al_error *err)
{
    const char *base;
    _cleanup_close_ int pfd = al_beneath_parent(dirfd, c->path, &base);
    if (pfd < 0)
        return pfd;
    struct stat st;
    bool exists = fstatat(pfd, base, &st, AT_SYMLINK_NOFOLLOW) == 0;
    if (c->pub.kind == AL_CHANGE_MODIFIED ? !exists || !S_ISREG(st.st_mode) : exists)
        return -EEXIST; /* the host changed under us: leave it */
    char tmp[32];
    /* The umask trims either. */
    _cleanup_close_ int fd = tmp_create(pfd, tmp, exec ? 0777 : 0666);
    if (fd < 0)
        return fd;
    int r = 0;
    char buf[65536];
    ssize_t n;
    while (r == 0 && (n = al_tar_read(rd, buf, sizeof(buf), err)) != 0) {
        if (n < 0) {
            r = (int)n;
            break;
        }
        for (ssize_t off = 0; r == 0 && off < n;) {
            ssize_t m = write(fd, buf + off, (size_t)(n - off));
            if (m < 0 && errno != EINTR)
                r = -errno;
            off += m > 0 ? m : 0;
        }
    }
    if (r == 0 && c->pub.kind == AL_CHANGE_MODIFIED) {
        /* The host's mode; with consent, exec for whoever may read (the guest's wish). */
        mode_t m = st.st_mode & 0777;
        if (exec)
            m |= (m & 0444) >> 2;
        if (fchmod(fd, m) < 0)
            r = -errno;
        if (r == 0 && geteuid() == 0)
            (void)!fchown(fd, st.st_uid, st.st_gid);
    }
    if (r == 0 && fsync(fd) < 0)
        r = -errno;
    if (r == 0 &&
        renameat2(pfd, tmp, pfd, base, c->pub.kind == AL_CHANGE_ADDED ? RENAME_NOREPLACE : 0) < 0)
        r = -errno;
    if (r < 0)
        unlinkat(pfd, tmp, 0);
    else
        fsync(pfd);
    return r;
}

static int apply_dir(int dirfd, struct change *c)
{
    const char *base;
    _cleanup_close_ int pfd = al_beneath_parent(dirfd, c->path, &base);
    if (pfd < 0)
        return pfd;
    if (mkdirat(pfd, base, 0777) < 0)
        return -errno;
    return 0;
}

static int apply_delete(int dirfd, struct change *c)
{
    const char *base;
    _cleanup_close_ int pfd = al_beneath_parent(dirfd, c->path, &base);
    if (pfd < 0)
        return pfd;
    struct stat st;
    if (fstatat(pfd, base, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return -errno;
    if (host_type(st.st_mode) != c->pub.type)
        return -EEXIST;
    if (unlinkat(pfd, base, c->pub.type == AL_ENTRY_DIR ? AT_REMOVEDIR : 0) < 0)
        return -errno;
    return 0;
}

static bool applicable(const struct change *c, int kind)
{
    return !c->pub.refused && !c->done && !c->pub.held && c->pub.kind == kind;
}

int al_workdir_diff_keep(al_workdir_diff *d, char *path, size_t len, al_error *err)
{
    if (d->spool < 0)
        return al_err(err, -EINVAL, "nothing to keep");
    char dir[AL_PATH_MAX];
    int r = al_state_dir(dir, sizeof(dir), err);
    if (r < 0)
        return r;
    size_t n = strlen(dir);
    if (snprintf(dir + n, sizeof(dir) - n, "/kept") >= (int)(sizeof(dir) - n))
        return al_err(err, -ENAMETOOLONG, "state directory path too long");
    struct stat st;
    if (mkdir(dir, 0700) < 0 && errno != EEXIST)
        return al_err(err, -errno, "cannot create '%s': %s", dir, strerror(errno));
    if (lstat(dir, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077))
        return al_err(err, -EPERM, "refusing '%s': not a private directory of ours", dir);
    char stamp[32];
    time_t now = time(NULL);
    struct tm tm;
    strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", localtime_r(&now, &tm));
    if (al_pathf(path, len, "%s/workspace-%s-XXXXXX.tar", dir, stamp) < 0)
        return al_err(err, -ENAMETOOLONG, "kept file's path too long");
    _cleanup_close_ int fd = mkostemps(path, 4, O_CLOEXEC); /* 0600 */
    if (fd < 0)
        return al_err(err, -errno, "cannot create '%s': %s", path, strerror(errno));
    off_t off = 0;
    if (fstat(d->spool, &st) < 0)
        r = -errno;
    while (r == 0 && off < st.st_size) {
        ssize_t k = copy_file_range(d->spool, &off, fd, NULL, (size_t)(st.st_size - off), 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            r = k < 0 ? -errno : -EIO;
    }
    if (r == 0 && fsync(fd) < 0)
        r = -errno;
    if (r < 0) {
        unlink(path);
        return al_err(err, r, "cannot write '%s': %s", path, strerror(-r));
    }
    return 0;
}

int al_workdir_apply(al_workdir_diff *d, unsigned allow, al_error *err)
{
    if (!d->dir)
        return al_err(err, -EINVAL, "a listing has no directory to apply to");
    _cleanup_close_ int dirfd = open(d->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dirfd < 0)
        return al_err(err, -errno, "cannot open directory '%s': %s", d->dir, strerror(errno));
    int applied = 0;
    /* What the host would run without asking waits for its own consent. */
    for (size_t i = 0; i < d->n; i++) {
        struct change *c = &d->v[i];
        c->pub.held = !c->pub.refused && !c->done && (c->pub.flags & AL_CHANGE_VCS) &&
                      !(allow & AL_APPLY_VCS);
    }
    /* Directories first, parents before children (the list is sorted). */
    for (size_t i = 0; i < d->n; i++) {
        struct change *c = &d->v[i];
        if (applicable(c, AL_CHANGE_ADDED) && c->pub.type == AL_ENTRY_DIR) {
            c->done = true;
            c->pub.result = apply_dir(dirfd, c);
            applied += c->pub.result == 0;
        }
    }
    /* Then file data, in the order the stream holds it. */
    if (lseek(d->spool, 0, SEEK_SET) < 0)
        return al_err(err, -errno, "cannot rewind the spool: %s", strerror(errno));
    struct al_tar_reader *rd = NULL;
    int r = al_tar_reader_fd(d->spool, &d->lim, &rd, err);
    if (r < 0)
        return r;
    struct al_tree_entry e;
    while ((r = al_tar_next(rd, &e, err)) > 0) {
        struct change *c = e.path[0] ? change_find(d, e.path) : NULL;
        if (!c || c->pub.type != AL_ENTRY_FILE || e.type != AL_ENTRY_FILE ||
            !(applicable(c, AL_CHANGE_ADDED) || applicable(c, AL_CHANGE_MODIFIED)))
            continue;
        c->done = true;
        al_error ferr = {0};
        bool exec = (c->pub.flags & AL_CHANGE_EXEC) && (allow & AL_APPLY_EXEC);
        c->pub.result = apply_file(dirfd, c, rd, exec, &ferr);
        if (ferr.code) { /* the stream itself broke: stop */
            r = al_err(err, ferr.code, "%s", ferr.msg);
            break;
        }
        applied += c->pub.result == 0;
    }
    al_tar_reader_free(rd);
    if (r < 0)
        return r;
    /* Deletions last, children before parents. */
    for (size_t i = d->n; i-- > 0;) {
        struct change *c = &d->v[i];
        if (applicable(c, AL_CHANGE_DELETED) &&
            (c->pub.type == AL_ENTRY_FILE || c->pub.type == AL_ENTRY_DIR)) {
            c->done = true;
            c->pub.result = apply_delete(dirfd, c);
            applied += c->pub.result == 0;
        }
    }
    return applied;
}

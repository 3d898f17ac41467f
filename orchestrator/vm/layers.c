/* An image's layers applied onto a host directory (layers.h). A layer is hostile: each path is
 * normalised and refused when it would leave the tree; parent directories are resolved by the
 * kernel inside the tree (openat2 RESOLVE_IN_ROOT), so a symlink a layer planted means what it
 * would in the guest and never leads out; the last component is never followed. One pass over
 * the stream: whiteouts take effect at once, and what this layer made itself is remembered so
 * that a whiteout listed after it leaves it alone (OCI lets a layer list them in any order). */
#include "layers.h"
#include "tar.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>

/* Reads of the layer file: big enough that a multi-GiB layer is few system calls. */
#define READ_CHUNK (128 * 1024)
/* openat2 asks for a retry when a rename raced with the lookup. */
#define OPENAT2_TRIES 8
/* A path as quoted in a message or a note: enough to recognise it, not a screenful. */
#define SHOW_MAX 200

#define WH_PREFIX ".wh."
#define WH_META ".wh..wh." /* reserved (aufs' own files): never made */
#define WH_OPAQUE ".wh..wh..opq"

/* A set of paths as 64-bit hashes (FNV-1a) in an open-addressed table: the strings themselves
 * (up to entries_max of up to 3 KiB) could be gigabytes. A collision can only keep a lower
 * layer's file that a whiteout meant to remove, or skip a whiteout: the layer's author spoils
 * nothing but the image it wrote. */
struct pathset {
    uint64_t *v; /* 0: an empty slot */
    size_t cap, n;
};

struct layer {
    int root;             /* the tree (caller's fd) */
    int fd;               /* the layer (caller's fd) */
    struct archive *a;    /* reading the layer through layer_read */
    EVP_MD_CTX *md;       /* SHA-256 of every byte read from fd */
    unsigned char *buf;   /* READ_CHUNK bytes: what layer_read hands libarchive */
    int read_errno;       /* why reading fd failed, or 0 */
    uint64_t entries_max; /* lim's, 0 made AL_LAYER_ENTRIES_MAX */
    uint64_t headers;     /* entries listed in this layer, whatever became of them */
    struct al_layer_limits lim;
    struct al_layer_stats st; /* the caller's, written back on success */
    struct pathset made;      /* paths this layer made (or kept as its directories) */
    struct pathset gone;      /* paths this layer whited out */
    struct pathset emptied;   /* directories this layer made opaque */
    void (*note)(void *ctx, const char *line);
    void *note_ctx;
    char path[AL_TREE_PATH_MAX + 1]; /* the current entry, normalised */
    char show[SHOW_MAX];             /* the current entry as the layer names it, printable */
};

/* ---- paths ---- */

/* Printable ASCII copy of p (the rest '?'), cut with "..." when long: for messages. */
static const char *show_path(const char *p, char *out, size_t len)
{
    size_t n = 0;
    for (; p[n] && n + 1 < len; n++)
        out[n] = p[n] >= 0x20 && p[n] < 0x7f ? p[n] : '?';
    out[n] = '\0';
    if (p[n] && len > 4)
        memcpy(out + len - 4, "...", 4);
    return out;
}

/* Normalises a path of the layer into out (AL_TREE_PATH_MAX + 1 bytes): empty and "."
 * components dropped ("./a", "a//b/", "a/./b" are "a" and "a/b": tar writers differ, the file is
 * the same), no slash at either end; "" is the tree's root. NULL, or why it is refused. */
static const char *path_normalize(const char *in, char *out)
{
    if (strlen(in) > AL_TREE_PATH_MAX)
        return "path too long";
    if (in[0] == '/')
        return "absolute path";
    size_t n = 0;
    for (const char *c = in; *c;) {
        size_t len = strcspn(c, "/");
        if (len == 2 && c[0] == '.' && c[1] == '.')
            return "path with a '..' component";
        if (len && !(len == 1 && c[0] == '.')) {
            if (n)
                out[n++] = '/';
            memcpy(out + n, c, len);
            n += len;
        }
        c += len;
        if (*c == '/')
            c++;
    }
    out[n] = '\0';
    return NULL;
}

/* ---- path sets ---- */

static uint64_t path_hash(const char *p)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *p; p++)
        h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    return h ? h : 1;
}

static bool set_has(const struct pathset *s, const char *p)
{
    if (!s->cap)
        return false;
    uint64_t h = path_hash(p);
    for (size_t i = h & (s->cap - 1); s->v[i]; i = (i + 1) & (s->cap - 1))
        if (s->v[i] == h)
            return true;
    return false;
}

static void set_put(struct pathset *s, uint64_t h)
{
    size_t i = h & (s->cap - 1);
    while (s->v[i] && s->v[i] != h)
        i = (i + 1) & (s->cap - 1);
    s->n += !s->v[i];
    s->v[i] = h;
}

static int set_add(struct pathset *s, const char *p)
{
    if ((s->n + 1) * 2 > s->cap) {
        /* Kept at most half full, so that a probe ends soon. */
        struct pathset bigger = {.cap = s->cap ? s->cap * 2 : 256};
        bigger.v = calloc(bigger.cap, sizeof(*bigger.v));
        if (!bigger.v)
            return -ENOMEM;
        for (size_t i = 0; i < s->cap; i++)
            if (s->v[i])
                set_put(&bigger, s->v[i]);
        free(s->v);
        *s = bigger;
    }
    set_put(s, path_hash(p));
    return 0;
}

/* Whether a whiteout of x (opaque: of x's children) is already done by this layer: x or an
 * ancestor whited out, or an ancestor (x itself when opaque) made opaque. The lower layers' files
 * are then gone already and only this layer's are left, which whiteouts keep: skipping it bounds
 * the work a layer of repeated whiteouts can cause. */
static bool whiteout_done(const struct layer *l, const char *x, bool opaque)
{
    if (set_has(&l->gone, x) || (opaque && set_has(&l->emptied, x)))
        return true;
    if (set_has(&l->emptied, ""))
        return x[0] != '\0';
    char up[AL_TREE_PATH_MAX + 1];
    size_t n = strlen(x);
    memcpy(up, x, n + 1);
    for (char *s = strrchr(up, '/'); s; s = strrchr(up, '/')) {
        *s = '\0';
        if (set_has(&l->gone, up) || set_has(&l->emptied, up))
            return true;
    }
    return false;
}

/* ---- messages ---- */

__attribute__((format(printf, 4, 5))) static int refuse(struct layer *l, al_error *err, int code,
                                                        const char *fmt, ...)
{
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    return al_err(err, code, "entry '%s': %s", l->show, why);
}

__attribute__((format(printf, 2, 3))) static void note(struct layer *l, const char *fmt, ...)
{
    if (!l->note)
        return;
    char why[256], line[SHOW_MAX + sizeof(why) + 2];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    snprintf(line, sizeof(line), "%s: %s", l->show, why);
    l->note(l->note_ctx, line);
}

/* ---- the tree ---- */

/* Opens path (relative, normalised) resolved inside the tree: ".." and absolute symlinks stop at
 * its root, /proc's magic links and mount points are refused. */
static int open_in_root(int root, const char *path, uint64_t flags)
{
    struct open_how how = {.flags = flags | O_CLOEXEC,
                           .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV};
    for (int i = 0; i < OPENAT2_TRIES; i++) {
        long fd = syscall(SYS_openat2, root, path[0] ? path : ".", &how, sizeof(how));
        if (fd >= 0)
            return (int)fd;
        if (errno != EAGAIN)
            return -errno;
    }
    return -EAGAIN;
}

static int count_entry(struct layer *l, al_error *err)
{
    if (l->st.entries >= l->entries_max)
        return refuse(l, err, -E2BIG, "over the limit of %llu entries",
                      (unsigned long long)l->entries_max);
    l->st.entries++;
    return 0;
}

/* Makes the missing directories of dir (a copy of the parent's path, changed in place and put
 * back), one component at a time, each looked up in the one before without following it; a
 * symlink is resolved again from the root, as the guest would. Returns an O_PATH fd of dir. */
static int parent_make(struct layer *l, char *dir, al_error *err)
{
    char shown[SHOW_MAX];
    _cleanup_close_ int cur = open_in_root(l->root, "", O_PATH | O_DIRECTORY);
    if (cur < 0)
        return refuse(l, err, cur, "cannot open the tree: %s", strerror(-cur));
    for (char *comp = dir;;) {
        char *end = comp + strcspn(comp, "/");
        char saved = *end;
        *end = '\0';
        _cleanup_close_ int next = openat(cur, comp, O_PATH | O_NOFOLLOW | O_CLOEXEC);
        struct stat st;
        if (next >= 0 && fstat(next, &st) < 0)
            return refuse(l, err, -errno, "cannot stat '%s': %s",
                          show_path(dir, shown, sizeof(shown)), strerror(errno));
        if (next < 0 && errno == ENOENT) {
            int r = count_entry(l, err);
            if (r < 0)
                return r;
            if (mkdirat(cur, comp, 0755) < 0)
                return refuse(l, err, -errno, "cannot make directory '%s': %s",
                              show_path(dir, shown, sizeof(shown)), strerror(errno));
            if (set_add(&l->made, dir) < 0)
                return al_err(err, -ENOMEM, "out of memory");
            next = openat(cur, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        } else if (next >= 0 && S_ISLNK(st.st_mode)) {
            al_closep(&next);
            next = open_in_root(l->root, dir, O_PATH | O_DIRECTORY);
            if (next == -ENOENT || next == -ENOTDIR)
                return refuse(l, err, -ENOTDIR, "'%s' is a symlink to no directory",
                              show_path(dir, shown, sizeof(shown)));
            if (next < 0)
                return refuse(l, err, next, "cannot resolve '%s': %s",
                              show_path(dir, shown, sizeof(shown)), strerror(-next));
        } else if (next >= 0 && !S_ISDIR(st.st_mode)) {
            return refuse(l, err, -ENOTDIR, "'%s' is not a directory",
                          show_path(dir, shown, sizeof(shown)));
        }
        if (next < 0)
            return refuse(l, err, -errno, "cannot open '%s': %s",
                          show_path(dir, shown, sizeof(shown)), strerror(errno));
        al_closep(&cur);
        cur = al_take_fd(&next);
        *end = saved;
        if (!saved)
            return al_take_fd(&cur);
        comp = end + 1;
    }
}

/* Opens the directory that holds path (O_PATH), resolved inside the tree, and points *base at
 * path's last component. With make, missing directories are made (0755, each an entry) and a
 * failure is explained in err; without, a failure is only the negative errno (-ENOENT: a
 * directory is missing, -ENOTDIR: something else is in the way). */
static int parent_open(struct layer *l, const char *path, bool make, const char **base,
                       al_error *err)
{
    const char *slash = strrchr(path, '/');
    *base = slash ? slash + 1 : path;
    char dir[AL_TREE_PATH_MAX + 1];
    size_t n = slash ? (size_t)(slash - path) : 0;
    memcpy(dir, path, n);
    dir[n] = '\0';
    int fd = open_in_root(l->root, dir, O_PATH | O_DIRECTORY);
    if (fd >= 0 || !make)
        return fd;
    if (!dir[0])
        return refuse(l, err, fd, "cannot open the tree: %s", strerror(-fd));
    return parent_make(l, dir, err);
}

static int remove_at(struct layer *l, int dirfd, const char *name, char *rel, size_t len);

/* Removes what the directory fd (taken) holds; see remove_at for rel. *stayed is set when
 * something of this layer's stayed. */
static int empty_dir(struct layer *l, int fd, char *rel, size_t len, bool *stayed)
{
    DIR *d = fdopendir(fd);
    if (!d) {
        int e = errno;
        close(fd);
        return -e;
    }
    int r = 0;
    struct dirent *de;
    while (r >= 0 && (errno = 0, de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        /* Below the longest path an entry may have, nothing is this layer's. */
        size_t n = strlen(de->d_name), sub = len + !!len + n;
        bool named = rel && sub <= AL_TREE_PATH_MAX;
        if (named) {
            if (len)
                rel[len] = '/';
            memcpy(rel + len + !!len, de->d_name, n + 1);
        }
        r = remove_at(l, dirfd(d), de->d_name, named ? rel : NULL, sub);
        if (rel)
            rel[len] = '\0';
        if (r > 0)
            *stayed = true;
    }
    if (r >= 0 && errno)
        r = -errno;
    closedir(d);
    return r < 0 ? r : 0;
}

/* Removes name beneath dirfd, a directory with all it holds, never following a symlink. With rel
 * (a whiteout), rel is name's path in the tree (len bytes, in a buffer of AL_TREE_PATH_MAX + 1)
 * and what this layer made stays, with the directories on the way to it. 1 when something
 * stayed, 0 when nothing is left, or a negative errno. */
static int remove_at(struct layer *l, int dirfd, const char *name, char *rel, size_t len)
{
    struct stat st;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return errno == ENOENT ? 0 : -errno;
    bool keep = rel && set_has(&l->made, rel);
    if (!S_ISDIR(st.st_mode)) {
        if (keep)
            return 1;
        return unlinkat(dirfd, name, 0) < 0 && errno != ENOENT ? -errno : 0;
    }
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    bool stayed = false;
    int r = empty_dir(l, fd, rel, len, &stayed);
    if (r < 0)
        return r;
    if (keep || stayed)
        return 1;
    return unlinkat(dirfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT ? -errno : 0;
}

/* ---- entries ---- */

/* Owner, mode and times of what was just made: fd open on it (a file, a directory), or base in
 * pfd (a FIFO, a symlink: never followed). */
static int set_meta(struct layer *l, struct archive_entry *ae, int fd, int pfd, const char *base,
                    bool is_symlink, al_error *err)
{
    if (l->lim.chown) {
        la_int64_t uid = archive_entry_uid(ae), gid = archive_entry_gid(ae);
        /* (uid_t)-1 would mean "leave it" */
        if (uid < 0 || uid >= UINT32_MAX || gid < 0 || gid >= UINT32_MAX)
            return refuse(l, err, -EINVAL, "owner %lld:%lld out of range", (long long)uid,
                          (long long)gid);
        /* before the mode: chown clears the set-id bits */
        if ((fd >= 0 ? fchown(fd, (uid_t)uid, (gid_t)gid)
                     : fchownat(pfd, base, (uid_t)uid, (gid_t)gid, AT_SYMLINK_NOFOLLOW)) < 0)
            return refuse(l, err, -errno, "cannot change owner: %s", strerror(errno));
    }
    if (!is_symlink) {
        mode_t mode = archive_entry_perm(ae) & 07777;
        if ((mode & (S_ISUID | S_ISGID)) && !l->lim.keep_setid) {
            note(l, "%s cleared",
                 (mode & S_ISUID) && (mode & S_ISGID) ? "set-uid and set-gid bits"
                 : mode & S_ISUID                     ? "set-uid bit"
                                                      : "set-gid bit");
            l->st.setid++;
            mode &= ~(mode_t)(S_ISUID | S_ISGID);
        }
        /* fchmodat follows a symlink, but base is the FIFO just made in a directory held open */
        if ((fd >= 0 ? fchmod(fd, mode) : fchmodat(pfd, base, mode, 0)) < 0)
            return refuse(l, err, -errno, "cannot change mode: %s", strerror(errno));
    }
    time_t t = archive_entry_mtime(ae);
    long ns = archive_entry_mtime_nsec(ae);
    if (t < 0 || (uint64_t)t > UINT32_MAX || ns < 0 || ns > 999999999)
        ns = 0;
    t = t < 0 ? 0 : (uint64_t)t > UINT32_MAX ? (time_t)UINT32_MAX : t;
    struct timespec ts[2] = {{.tv_sec = t, .tv_nsec = ns}, {.tv_sec = t, .tv_nsec = ns}};
    if ((fd >= 0 ? futimens(fd, ts) : utimensat(pfd, base, ts, AT_SYMLINK_NOFOLLOW)) < 0)
        return refuse(l, err, -errno, "cannot set times: %s", strerror(errno));
    return 0;
}

static int archive_fail(struct layer *l, al_error *err)
{
    if (l->read_errno)
        return al_err(err, -l->read_errno, "cannot read the layer: %s", strerror(l->read_errno));
    const char *why = archive_error_string(l->a);
    return refuse(l, err, -EPROTO, "malformed layer: %s", why ? why : "unknown error");
}

static int pwrite_all(int fd, const char *p, size_t len, off_t off)
{
    while (len) {
        ssize_t n = pwrite(fd, p, len, off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return n < 0 ? -errno : -EIO;
        p += n, len -= (size_t)n, off += n;
    }
    return 0;
}

static bool all_zero(const char *p, size_t len)
{
    return len == 0 || (p[0] == 0 && !memcmp(p, p + 1, len - 1));
}

static int make_file(struct layer *l, struct archive_entry *ae, int pfd, const char *base,
                     al_error *err)
{
    la_int64_t size = archive_entry_size(ae);
    if (size < 0)
        return refuse(l, err, -EPROTO, "negative size");
    /* counted before any byte is written: a layer cannot fill the disk first */
    if ((uint64_t)size > l->lim.bytes_max - l->st.bytes)
        return refuse(l, err, -EFBIG, "over the limit of %llu bytes of file data",
                      (unsigned long long)l->lim.bytes_max);
    l->st.bytes += (uint64_t)size;
    _cleanup_close_ int fd =
        openat(pfd, base, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return refuse(l, err, -errno, "cannot create: %s", strerror(errno));
    for (;;) {
        const void *buf;
        size_t len;
        la_int64_t off;
        int ar = archive_read_data_block(l->a, &buf, &len, &off);
        if (ar == ARCHIVE_EOF)
            break;
        if (ar != ARCHIVE_OK && ar != ARCHIVE_WARN)
            return archive_fail(l, err);
        if (off < 0 || off > size || len > (uint64_t)(size - off))
            return refuse(l, err, -EPROTO, "data past the entry's size");
        /* A hole stays a hole, and a block of zeros becomes one: the same bytes when read. */
        if (all_zero(buf, len))
            continue;
        int r = pwrite_all(fd, buf, len, (off_t)off);
        if (r < 0)
            return refuse(l, err, r, "cannot write: %s", strerror(-r));
    }
    if (ftruncate(fd, (off_t)size) < 0)
        return refuse(l, err, -errno, "cannot set size: %s", strerror(errno));
    return set_meta(l, ae, fd, -1, NULL, false, err);
}

static int make_dir(struct layer *l, struct archive_entry *ae, int pfd, const char *base,
                    bool exists, al_error *err)
{
    if (!exists && mkdirat(pfd, base, 0700) < 0)
        return refuse(l, err, -errno, "cannot make directory: %s", strerror(errno));
    _cleanup_close_ int fd = openat(pfd, base, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return refuse(l, err, -errno, "cannot open directory: %s", strerror(errno));
    return set_meta(l, ae, fd, -1, NULL, false, err);
}

/* Opens the hard link's target (O_PATH, never followed) after the same checks as any path. */
static int link_target(struct layer *l, const char *raw, al_error *err)
{
    char target[AL_TREE_PATH_MAX + 1], shown[SHOW_MAX];
    show_path(raw, shown, sizeof(shown));
    const char *why = path_normalize(raw, target);
    if (why)
        return refuse(l, err, -EINVAL, "hard link target '%s': %s", shown, why);
    if (!target[0])
        return refuse(l, err, -EINVAL, "hard link to the root directory");
    const char *tbase;
    _cleanup_close_ int tp = parent_open(l, target, false, &tbase, err);
    _cleanup_close_ int fd = tp < 0 ? tp : openat(tp, tbase, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return refuse(l, err, tp < 0 ? tp : -errno, "hard link target '%s' is missing", shown);
    struct stat st;
    if (fstat(fd, &st) < 0)
        return refuse(l, err, -errno, "cannot stat '%s': %s", shown, strerror(errno));
    if (S_ISDIR(st.st_mode))
        return refuse(l, err, -EPERM, "hard link to a directory ('%s')", shown);
    return al_take_fd(&fd);
}

static int make_link(struct layer *l, int target, int pfd, const char *base, al_error *err)
{
    if (linkat(target, "", pfd, base, AT_EMPTY_PATH) == 0)
        return 0;
    /* AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH; the fd's /proc link does the same without. */
    int e = errno;
    char proc[64];
    snprintf(proc, sizeof(proc), "/proc/self/fd/%d", target);
    if (e == ENOENT || e == EPERM) {
        if (linkat(AT_FDCWD, proc, pfd, base, AT_SYMLINK_FOLLOW) == 0)
            return 0;
        e = errno;
    }
    return refuse(l, err, -e, "cannot make hard link: %s", strerror(e));
}

/* Removes path of the lower layers: .wh.NAME, or a character device 0:0, at path. */
static int whiteout(struct layer *l, const char *path)
{
    l->st.whiteouts++;
    if (whiteout_done(l, path, false))
        return 0;
    const char *base;
    _cleanup_close_ int pfd = parent_open(l, path, false, &base, NULL);
    if (pfd == -ENOENT || pfd == -ENOTDIR)
        return set_add(&l->gone, path); /* nothing there to remove */
    if (pfd < 0)
        return pfd;
    char rel[AL_TREE_PATH_MAX + 1];
    size_t len = strlen(path);
    memcpy(rel, path, len + 1);
    int r = remove_at(l, pfd, base, rel, len);
    return r < 0 ? r : set_add(&l->gone, path);
}

/* Empties dir of what the lower layers put there: .wh..wh..opq in it. */
static int opaque(struct layer *l, const char *dir)
{
    l->st.whiteouts++;
    if (whiteout_done(l, dir, true))
        return 0;
    int fd = open_in_root(l->root, dir, O_RDONLY | O_DIRECTORY);
    if (fd == -ENOENT || fd == -ENOTDIR)
        return set_add(&l->emptied, dir);
    if (fd < 0)
        return fd;
    char rel[AL_TREE_PATH_MAX + 1];
    size_t len = strlen(dir);
    memcpy(rel, dir, len + 1);
    bool stayed = false;
    int r = empty_dir(l, fd, rel, len, &stayed);
    return r < 0 ? r : set_add(&l->emptied, dir);
}

/* A path whose name begins with ".wh.": a whiteout (1 when done), or 0 when it is none. */
static int whiteout_entry(struct layer *l, struct archive_entry *ae, al_error *err)
{
    char *base = strrchr(l->path, '/');
    base = base ? base + 1 : l->path;
    for (const char *c = l->path; c < base; c += strcspn(c, "/") + 1)
        if (!strncmp(c, WH_PREFIX, strlen(WH_PREFIX))) {
            note(l, "beneath a whiteout name, skipped");
            return 1;
        }
    int r;
    if (!strcmp(base, WH_OPAQUE)) {
        /* the marker's directory: the path less its last component */
        if (base > l->path)
            base[-1] = '\0';
        else
            base[0] = '\0';
        r = opaque(l, l->path);
    } else if (!strncmp(base, WH_META, strlen(WH_META))) {
        note(l, "reserved whiteout name, skipped");
        return 1;
    } else if (!strncmp(base, WH_PREFIX, strlen(WH_PREFIX))) {
        const char *name = base + strlen(WH_PREFIX);
        if (!name[0] || !strcmp(name, ".") || !strcmp(name, ".."))
            return refuse(l, err, -EINVAL, "a whiteout that names nothing");
        memmove(base, name, strlen(name) + 1);
        r = whiteout(l, l->path);
    } else if (archive_entry_filetype(ae) == AE_IFCHR && !archive_entry_hardlink(ae) &&
               archive_entry_rdev(ae) == 0) {
        if (!l->path[0])
            return refuse(l, err, -EINVAL, "the root must be a directory");
        r = whiteout(l, l->path);
    } else {
        return 0;
    }
    if (r == -ENOMEM)
        return al_err(err, r, "out of memory");
    return r < 0 ? refuse(l, err, r, "cannot apply the whiteout: %s", strerror(-r)) : 1;
}

static int apply_root(struct layer *l, struct archive_entry *ae, al_error *err)
{
    if (archive_entry_filetype(ae) != AE_IFDIR || archive_entry_hardlink(ae))
        return refuse(l, err, -EINVAL, "the root must be a directory");
    _cleanup_close_ int fd = openat(l->root, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return refuse(l, err, -errno, "cannot open the tree: %s", strerror(errno));
    return set_meta(l, ae, fd, -1, NULL, false, err);
}

static int apply_entry(struct layer *l, struct archive_entry *ae, al_error *err)
{
    const char *raw = archive_entry_pathname(ae);
    if (!raw)
        raw = archive_entry_pathname_utf8(ae);
    show_path(raw ? raw : "", l->show, sizeof(l->show));
    if (!raw)
        return refuse(l, err, -EPROTO, "no path");
    const char *why = path_normalize(raw, l->path);
    if (why)
        return refuse(l, err, strlen(raw) > AL_TREE_PATH_MAX ? -ENAMETOOLONG : -EINVAL, "%s", why);
    /* Whiteouts and dropped entries make nothing, but each costs a little: a layer longer than
     * a whole image may be is refused all the same. */
    if (++l->headers > l->entries_max)
        return refuse(l, err, -E2BIG, "the layer lists over %llu entries",
                      (unsigned long long)l->entries_max);
    if (archive_entry_xattr_count(ae) > 0) {
        note(l, "extended attributes dropped");
        l->st.xattrs++;
    }
    int r = whiteout_entry(l, ae, err);
    if (r != 0)
        return r < 0 ? r : 0;
    if (!l->path[0])
        return apply_root(l, ae, err);

    const char *hardlink = archive_entry_hardlink(ae);
    if (!hardlink)
        hardlink = archive_entry_hardlink_utf8(ae);
    mode_t type = archive_entry_filetype(ae);
    const char *linkto = NULL;
    if (!hardlink) {
        switch (type) {
        case AE_IFREG:
        case AE_IFDIR:
        case AE_IFIFO:
            break;
        case AE_IFLNK:
            linkto = archive_entry_symlink(ae);
            if (!linkto)
                linkto = archive_entry_symlink_utf8(ae);
            if (!linkto || !linkto[0])
                return refuse(l, err, -EPROTO, "symlink without a target");
            if (strlen(linkto) > AL_TREE_PATH_MAX)
                return refuse(l, err, -ENAMETOOLONG, "symlink target too long");
            break;
        case AE_IFCHR:
        case AE_IFBLK:
        case AE_IFSOCK:
            /* the guest's /dev is its own devtmpfs; a node in the tree is only a way in */
            note(l, type == AE_IFSOCK ? "socket dropped" : "device node dropped");
            l->st.devices++;
            return 0;
        default:
            return refuse(l, err, -EPROTO, "entry of unknown type 0%o", (unsigned)type);
        }
    }

    _cleanup_close_ int target = -1;
    if (hardlink && (target = link_target(l, hardlink, err)) < 0)
        return target;
    r = count_entry(l, err);
    if (r < 0)
        return r;
    const char *base;
    _cleanup_close_ int pfd = parent_open(l, l->path, true, &base, err);
    if (pfd < 0)
        return pfd;
    if (set_add(&l->made, l->path) < 0)
        return al_err(err, -ENOMEM, "out of memory");

    /* What is there is replaced (a directory stays for a directory), never followed. */
    struct stat st, tst;
    bool exists = fstatat(pfd, base, &st, AT_SYMLINK_NOFOLLOW) == 0;
    if (!exists && errno != ENOENT)
        return refuse(l, err, -errno, "cannot stat: %s", strerror(errno));
    if (hardlink && exists && fstat(target, &tst) == 0 && tst.st_dev == st.st_dev &&
        tst.st_ino == st.st_ino)
        return 0; /* a link to itself: already so */
    if (exists && !(!hardlink && type == AE_IFDIR && S_ISDIR(st.st_mode))) {
        r = remove_at(l, pfd, base, NULL, 0);
        if (r < 0)
            return refuse(l, err, r, "cannot replace what is there: %s", strerror(-r));
        exists = false;
    }

    if (hardlink)
        return make_link(l, target, pfd, base, err);
    switch (type) {
    case AE_IFREG:
        return make_file(l, ae, pfd, base, err);
    case AE_IFDIR:
        return make_dir(l, ae, pfd, base, exists, err);
    case AE_IFLNK:
        if (symlinkat(linkto, pfd, base) < 0)
            return refuse(l, err, -errno, "cannot make symlink: %s", strerror(errno));
        return set_meta(l, ae, -1, pfd, base, true, err);
    default: /* AE_IFIFO */
        if (mkfifoat(pfd, base, 0600) < 0)
            return refuse(l, err, -errno, "cannot make FIFO: %s", strerror(errno));
        return set_meta(l, ae, -1, pfd, base, false, err);
    }
}

/* ---- the stream ---- */

/* libarchive's reader: every byte read from the layer goes through the digest, once. */
static la_ssize_t layer_read(struct archive *a, void *ctx, const void **out)
{
    struct layer *l = ctx;
    ssize_t n;
    do
        n = read(l->fd, l->buf, READ_CHUNK);
    while (n < 0 && errno == EINTR);
    if (n < 0 || (n > 0 && EVP_DigestUpdate(l->md, l->buf, (size_t)n) != 1)) {
        l->read_errno = n < 0 ? errno : ENOMEM;
        archive_set_error(a, l->read_errno, "cannot read the layer");
        return -1;
    }
    *out = l->buf;
    return n;
}

static void layer_free(struct layer *l)
{
    if (!l)
        return;
    if (l->a)
        archive_read_free(l->a);
    EVP_MD_CTX_free(l->md);
    free(l->buf);
    free(l->made.v);
    free(l->gone.v);
    free(l->emptied.v);
    free(l);
}
AL_DEFINE_CLEANUP(layer_freep, struct layer *, layer_free)

int al_layer_apply(int rootfd, int layer_fd, const struct al_layer_limits *lim,
                   struct al_layer_stats *st, void (*note_fn)(void *ctx, const char *line),
                   void *note_ctx, char sha256[65], al_error *err)
{
    if (!lim)
        return al_err(err, -EINVAL, "no limits for the layer");
    _cleanup_(layer_freep) struct layer *l = calloc(1, sizeof(*l));
    if (!l)
        return al_err(err, -ENOMEM, "out of memory");
    l->root = rootfd;
    l->fd = layer_fd;
    l->lim = *lim;
    l->entries_max = lim->entries_max ? lim->entries_max : AL_LAYER_ENTRIES_MAX;
    if (st)
        l->st = *st;
    l->note = note_fn;
    l->note_ctx = note_ctx;
    l->buf = malloc(READ_CHUNK);
    l->md = EVP_MD_CTX_new();
    l->a = archive_read_new();
    if (!l->buf || !l->md || !l->a || EVP_DigestInit_ex(l->md, EVP_sha256(), NULL) != 1)
        return al_err(err, -ENOMEM, "out of memory");
    /* Stats over the limit from an earlier call: none left, rather than an overflow. */
    if (l->st.bytes > l->lim.bytes_max)
        l->st.bytes = l->lim.bytes_max;
    /* tar (ustar, pax, GNU) only; any compression, as an image's media types allow several */
    /* Built-in filters only: _all would run external programs (lzop, lrzip) on hostile input. */
    archive_read_support_filter_gzip(l->a);
    archive_read_support_filter_bzip2(l->a);
    archive_read_support_filter_xz(l->a);
    archive_read_support_filter_zstd(l->a);
    archive_read_support_filter_lz4(l->a);
    archive_read_support_format_tar(l->a);
    if (archive_read_open(l->a, l, NULL, layer_read, NULL) != ARCHIVE_OK)
        return l->read_errno ? archive_fail(l, err)
                             : al_err(err, -EPROTO, "the layer is not a tar stream: %s",
                                      archive_error_string(l->a) ? archive_error_string(l->a)
                                                                 : "unknown format");
    for (;;) {
        struct archive_entry *ae;
        int ar = archive_read_next_header(l->a, &ae);
        if (ar == ARCHIVE_EOF)
            break;
        if (ar != ARCHIVE_OK && ar != ARCHIVE_WARN) {
            if (l->read_errno || l->headers)
                return archive_fail(l, err);
            const char *why = archive_error_string(l->a);
            return al_err(err, -EPROTO, "the layer is not a tar stream: %s",
                          why ? why : "unknown format");
        }
        int r = apply_entry(l, ae, err);
        if (r < 0)
            return r;
    }
    /* The digest is of the whole blob: what follows the tar's end counts too. */
    for (;;) {
        ssize_t n = read(layer_fd, l->buf, READ_CHUNK);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return al_err(err, -errno, "cannot read the layer: %s", strerror(errno));
        if (n == 0)
            break;
        if (EVP_DigestUpdate(l->md, l->buf, (size_t)n) != 1)
            return al_err(err, -ENOMEM, "out of memory");
    }
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned mdlen = 0;
    if (EVP_DigestFinal_ex(l->md, md, &mdlen) != 1 || mdlen != 32)
        return al_err(err, -EIO, "cannot compute the layer's digest");
    if (sha256)
        al_hexify(md, mdlen, sha256);
    if (st)
        *st = l->st;
    return 0;
}

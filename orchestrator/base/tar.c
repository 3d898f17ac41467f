/* Trees of files as tar streams. The host writes its side with libarchive; what the guest sends
 * is read with libarchive too, but every entry passes our own checks first: a bounded count, a
 * bounded total, a relative path without "..", and nothing but files, directories and symlinks
 * taken as such. Host paths are only ever opened beneath a directory fd, never through a
 * symlink. */
#include "tar.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>

/* openat2 asks for a retry when a rename raced with the lookup. */
#define OPENAT2_TRIES 8
/* Read and write in pieces of this size: one tar block run, small on the stack. */
#define IO_CHUNK 65536

/* ---- paths ---- */

int al_tree_path_check(char *p)
{
    while (p[0] == '.' && p[1] == '/') {
        size_t skip = 2;
        while (p[skip] == '/')
            skip++;
        memmove(p, p + skip, strlen(p + skip) + 1);
    }
    if (!strcmp(p, "."))
        p[0] = '\0';
    size_t n = strlen(p);
    while (n > 0 && p[n - 1] == '/')
        p[--n] = '\0';
    if (n == 0)
        return 0;
    if (p[0] == '/')
        return -EINVAL;
    for (const char *c = p; *c;) {
        size_t len = strcspn(c, "/");
        if (len == 0 || (len == 1 && c[0] == '.') || (len == 2 && c[0] == '.' && c[1] == '.'))
            return -EINVAL;
        c += len;
        if (*c == '/')
            c++;
    }
    return 0;
}

/* The length of a UTF-8 sequence at p worth showing as is, or 0: control characters (C1),
 * line separators and the bidirectional overrides that can make a name read as another. */
static size_t utf8_printable(const unsigned char *p)
{
    unsigned cp;
    size_t n;
    if (p[0] >= 0xc2 && p[0] <= 0xdf)
        cp = p[0] & 0x1fu, n = 2;
    else if (p[0] >= 0xe0 && p[0] <= 0xef)
        cp = p[0] & 0x0fu, n = 3;
    else if (p[0] >= 0xf0 && p[0] <= 0xf4)
        cp = p[0] & 0x07u, n = 4;
    else
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (p[i] & 0x3fu);
    }
    if (cp < 0xa0 || (n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
        (cp >= 0xd800 && cp <= 0xdfff) || (cp >= 0x2028 && cp <= 0x202e) ||
        (cp >= 0x2066 && cp <= 0x2069) || cp == 0x200e || cp == 0x200f)
        return 0;
    return n;
}

const char *al_path_escape(const char *path, char *buf, size_t len)
{
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)path; *p && o + 5 < len;) {
        size_t u = *p >= 0x80 ? utf8_printable(p) : 0;
        if (u) {
            memcpy(buf + o, p, u);
            o += u;
            p += u;
        } else if (*p >= 0x20 && *p < 0x7f && *p != '\\') {
            buf[o++] = (char)*p++;
        } else {
            o += (size_t)snprintf(buf + o, len - o, "\\x%02x", *p++);
        }
    }
    if (len)
        buf[o < len ? o : len - 1] = '\0';
    return buf;
}

/* ---- host directories, beneath a dirfd ---- */

static int walk_open(int dirfd, const char *rel, int flags)
{
    char buf[AL_TREE_PATH_MAX + 1];
    if (snprintf(buf, sizeof(buf), "%s", rel) >= (int)sizeof(buf))
        return -ENAMETOOLONG;
    int fd = openat(dirfd, ".", O_PATH | O_DIRECTORY | O_CLOEXEC);
    char *save, *c = strtok_r(buf, "/", &save);
    while (fd >= 0 && c) {
        char *next = strtok_r(NULL, "/", &save);
        if (!strcmp(c, "..")) {
            close(fd);
            return -EXDEV;
        }
        int nfd = next ? openat(fd, c, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                       : openat(fd, c, flags | O_NOFOLLOW | O_CLOEXEC);
        al_closep(&fd);
        fd = nfd;
        c = next;
    }
    return fd < 0 ? -errno : fd;
}

int al_beneath_open(int dirfd, const char *rel, int flags)
{
    if (!rel[0]) {
        int fd = openat(dirfd, ".", (flags & ~O_NOFOLLOW) | O_CLOEXEC);
        return fd < 0 ? -errno : fd;
    }
    struct open_how how = {
        .flags = (uint64_t)(flags | O_NOFOLLOW | O_CLOEXEC),
        .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
    };
    for (int i = 0; i < OPENAT2_TRIES; i++) {
        long fd = syscall(SYS_openat2, dirfd, rel, &how, sizeof(how));
        if (fd >= 0)
            return (int)fd;
        if (errno == ENOSYS)
            return walk_open(dirfd, rel, flags);
        if (errno != EAGAIN)
            return -errno;
    }
    return -EAGAIN;
}

int al_beneath_parent(int dirfd, const char *rel, const char **base)
{
    const char *slash = strrchr(rel, '/');
    if (!slash) {
        *base = rel;
        int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        return fd < 0 ? -errno : fd;
    }
    char parent[AL_TREE_PATH_MAX + 1];
    size_t n = (size_t)(slash - rel);
    if (n >= sizeof(parent))
        return -ENAMETOOLONG;
    memcpy(parent, rel, n);
    parent[n] = '\0';
    *base = slash + 1;
    return al_beneath_open(dirfd, parent, O_RDONLY | O_DIRECTORY);
}

/* ---- trees ---- */

void al_tree_free(struct al_tree *t)
{
    for (size_t i = 0; i < t->n; i++) {
        free(t->v[i].path);
        free(t->v[i].link);
    }
    free(t->v);
    for (size_t i = 0; i < t->nskipped; i++)
        free(t->skipped[i]);
    free(t->skipped);
    *t = (struct al_tree){0};
}

int al_tree_add(struct al_tree *t, const struct al_tree_entry *e)
{
    if (al_grow(&t->v, &t->cap, t->n, sizeof(*t->v), 64) < 0)
        return -ENOMEM;
    struct al_tree_entry c = *e;
    c.path = strdup(e->path);
    c.link = e->link ? strdup(e->link) : NULL;
    if (!c.path || (e->link && !c.link)) {
        free(c.path);
        free(c.link);
        return -ENOMEM;
    }
    t->v[t->n++] = c;
    return 0;
}

static int skip_add(struct al_tree *t, const char *path, const char *why)
{
    char **v = realloc(t->skipped, (t->nskipped + 1) * sizeof(*v));
    if (!v)
        return -ENOMEM;
    t->skipped = v;
    if (asprintf(&v[t->nskipped], "%s: %s", path, why) < 0)
        return -ENOMEM;
    t->nskipped++;
    return 0;
}

static int entry_cmp(const void *a, const void *b)
{
    return strcmp(((const struct al_tree_entry *)a)->path, ((const struct al_tree_entry *)b)->path);
}

int al_tree_sort(struct al_tree *t, al_error *err)
{
    if (t->n)
        qsort(t->v, t->n, sizeof(*t->v), entry_cmp);
    for (size_t i = 1; i < t->n; i++)
        if (!strcmp(t->v[i - 1].path, t->v[i].path)) {
            char esc[256];
            return al_err(err, -EPROTO, "the tree names '%s' twice",
                          al_path_escape(t->v[i].path, esc, sizeof(esc)));
        }
    return 0;
}

const struct al_tree_entry *al_tree_find(const struct al_tree *t, const char *path)
{
    struct al_tree_entry key = {.path = (char *)path};
    return t->n ? bsearch(&key, t->v, t->n, sizeof(*t->v), entry_cmp) : NULL;
}

/* Does a symlink at depth (components of its directory) stay in the tree when resolved by its
 * text alone? The target is never followed on the host; this only decides what the guest sees. */
static bool link_stays_inside(const char *target, size_t depth)
{
    if (target[0] == '/' || !target[0])
        return false;
    long d = (long)depth;
    for (const char *c = target; *c;) {
        size_t len = strcspn(c, "/");
        if (len == 2 && c[0] == '.' && c[1] == '.')
            d--;
        else if (len && !(len == 1 && c[0] == '.'))
            d++;
        if (d < 0)
            return false;
        c += len;
        if (*c == '/')
            c++;
    }
    return true;
}

struct walk {
    const struct al_tar_limits *lim;
    struct al_tree *t;
    al_error *err;
    char path[AL_TREE_PATH_MAX + 1];
};

static int walk_dir(struct walk *w, int dfd, size_t plen, unsigned depth)
{
    if (depth > AL_TREE_DEPTH_MAX)
        return al_err(w->err, -ELOOP, "'%s' is nested deeper than %d directories", w->path,
                      AL_TREE_DEPTH_MAX);
    int dup_fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = dup_fd < 0 ? NULL : fdopendir(dup_fd);
    if (!d) {
        int e = errno;
        al_closep(&dup_fd);
        return al_err(w->err, -e, "cannot read directory '%s': %s", plen ? w->path : ".",
                      strerror(e));
    }
    int r = 0;
    struct dirent *de;
    while (r == 0 && (errno = 0, de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        size_t nlen = strlen(de->d_name);
        if (plen + (plen ? 1 : 0) + nlen > AL_TREE_PATH_MAX) {
            r = skip_add(w->t, de->d_name, "path too long, not copied");
            continue;
        }
        size_t at = plen;
        if (plen)
            w->path[at++] = '/';
        memcpy(w->path + at, de->d_name, nlen + 1);
        struct stat st;
        struct al_tree_entry e = {.path = w->path};
        char target[AL_TREE_PATH_MAX + 1];
        if (fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
            r = al_err(w->err, -errno, "cannot stat '%s': %s", w->path, strerror(errno));
        } else if (w->t->n >= (w->lim->entries_max ? w->lim->entries_max : AL_TREE_ENTRIES_MAX)) {
            r = al_err(w->err, -E2BIG, "the directory has more than %llu entries",
                       (unsigned long long)(w->lim->entries_max ? w->lim->entries_max
                                                                : AL_TREE_ENTRIES_MAX));
        } else if (S_ISREG(st.st_mode)) {
            e.type = AL_ENTRY_FILE;
            e.size = (uint64_t)st.st_size;
            e.mode = st.st_mode & 0777;
            w->t->bytes += e.size;
            r = al_tree_add(w->t, &e);
        } else if (S_ISDIR(st.st_mode)) {
            e.type = AL_ENTRY_DIR;
            e.mode = st.st_mode & 0777;
            r = al_tree_add(w->t, &e);
            int cfd =
                r < 0 ? -1
                      : openat(dfd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (r == 0 && cfd < 0)
                r = al_err(w->err, -errno, "cannot open directory '%s': %s", w->path,
                           strerror(errno));
            if (r == 0)
                r = walk_dir(w, cfd, at + nlen, depth + 1);
            al_closep(&cfd);
        } else if (S_ISLNK(st.st_mode)) {
            ssize_t n = readlinkat(dfd, de->d_name, target, sizeof(target) - 1);
            if (n < 0 || (size_t)n >= sizeof(target) - 1) {
                r = skip_add(w->t, w->path, "unreadable symlink, not copied");
            } else {
                target[n] = '\0';
                size_t depth_here = 0;
                for (const char *c = w->path; *c; c++)
                    depth_here += *c == '/';
                if (link_stays_inside(target, depth_here)) {
                    e.type = AL_ENTRY_SYMLINK;
                    e.link = target;
                    r = al_tree_add(w->t, &e);
                } else {
                    r = skip_add(w->t, w->path,
                                 "symlink pointing outside the directory, "
                                 "not followed, not copied");
                }
            }
        } else {
            r = skip_add(w->t, w->path, "special file, not copied");
        }
        if (r == -ENOMEM)
            r = al_err(w->err, -ENOMEM, "out of memory");
        w->path[plen] = '\0';
    }
    if (r == 0 && errno)
        r = al_err(w->err, -errno, "cannot read directory '%s': %s", plen ? w->path : ".",
                   strerror(errno));
    closedir(d);
    return r;
}

int al_tree_walk(int dirfd, const struct al_tar_limits *lim, struct al_tree *t, al_error *err)
{
    struct walk w = {.lim = lim, .t = t, .err = err};
    int r = walk_dir(&w, dirfd, 0, 0);
    if (r == 0)
        r = al_tree_sort(t, err);
    return r;
}

/* ---- writing ---- */

static la_ssize_t write_cb(struct archive *a, void *ctx, const void *buf, size_t len)
{
    int fd = *(int *)ctx;
    for (size_t off = 0; off < len;) {
        ssize_t n = send(fd, (const char *)buf + off, len - off, MSG_NOSIGNAL);
        if (n < 0 && errno == ENOTSOCK)
            n = write(fd, (const char *)buf + off, len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            archive_set_error(a, errno, "%s", strerror(errno));
            return -1;
        }
        off += (size_t)n;
    }
    return (la_ssize_t)len;
}

AL_DEFINE_CLEANUP(archive_writep, struct archive *, archive_write_free)
AL_DEFINE_CLEANUP(archive_entryp, struct archive_entry *, archive_entry_free)
#define _cleanup_archive_write_ __attribute__((cleanup(archive_writep)))
#define _cleanup_archive_entry_ __attribute__((cleanup(archive_entryp)))

static int writer_open(int *fdp, struct archive **out, al_error *err)
{
    struct archive *a = archive_write_new();
    if (!a)
        return al_err(err, -ENOMEM, "out of memory");
    /* GNU tar's format: names go as bytes, whatever the locale (pax would convert them to UTF-8
     * and mangle the rest), long ones as GNU long-name records, which busybox tar reads too. */
    if (archive_write_set_format_gnutar(a) != ARCHIVE_OK ||
        archive_write_set_bytes_in_last_block(a, 1) != ARCHIVE_OK ||
        archive_write_open(a, fdp, NULL, write_cb, NULL) != ARCHIVE_OK) {
        int r = al_err(err, -EIO, "cannot start a tar stream: %s", archive_error_string(a));
        archive_write_free(a);
        return r;
    }
    *out = a;
    return 0;
}

/* Copies exactly size bytes of fd into the current entry. */
static int write_data(struct archive *a, int fd, uint64_t size, const char *name, al_error *err)
{
    char buf[IO_CHUNK];
    uint64_t done = 0;
    while (done < size) {
        size_t want = size - done < sizeof(buf) ? (size_t)(size - done) : sizeof(buf);
        ssize_t n = read(fd, buf, want);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return al_err(err, -errno, "cannot read '%s': %s", name, strerror(errno));
        if (n == 0)
            return al_err(err, -EIO, "'%s' shrank while being copied", name);
        if (archive_write_data(a, buf, (size_t)n) != n)
            return al_err(err, -EPIPE, "cannot send '%s': %s", name, archive_error_string(a));
        done += (uint64_t)n;
    }
    return 0;
}

static int write_header(struct archive *a, const char *name, int type, unsigned mode, uint64_t size,
                        const char *link, al_error *err)
{
    _cleanup_archive_entry_ struct archive_entry *ae = archive_entry_new();
    if (!ae)
        return al_err(err, -ENOMEM, "out of memory");
    archive_entry_set_pathname(ae, name);
    archive_entry_set_filetype(ae, type == AL_ENTRY_DIR       ? AE_IFDIR
                                   : type == AL_ENTRY_SYMLINK ? AE_IFLNK
                                                              : AE_IFREG);
    archive_entry_set_perm(ae, type == AL_ENTRY_SYMLINK ? 0777 : mode & 0777);
    archive_entry_set_size(ae, type == AL_ENTRY_FILE ? (la_int64_t)size : 0);
    if (link)
        archive_entry_set_symlink(ae, link);
    /* Owned by the guest's root, whoever owns them here. */
    archive_entry_set_uid(ae, 0);
    archive_entry_set_gid(ae, 0);
    archive_entry_set_mtime(ae, time(NULL), 0);
    /* A warning: a name that is not text in this locale, written as bytes (pax hdrcharset). */
    int ar = archive_write_header(a, ae);
    if (ar != ARCHIVE_OK && ar != ARCHIVE_WARN)
        return al_err(err, -EPIPE, "cannot send '%s': %s", name, archive_error_string(a));
    return 0;
}

static int writer_close(struct archive *a, al_error *err)
{
    if (archive_write_close(a) != ARCHIVE_OK)
        return al_err(err, -EPIPE, "cannot end the tar stream: %s", archive_error_string(a));
    return 0;
}

int al_tar_write_tree(int fd, int dirfd, const struct al_tree *t, const char *prefix, al_error *err)
{
    _cleanup_archive_write_ struct archive *a = NULL;
    int r = writer_open(&fd, &a, err);
    if (r < 0)
        return r;
    size_t plen = strlen(prefix);
    if (plen) { /* the tree's root itself, as a directory named by the prefix */
        char top[AL_TREE_PATH_MAX + 2];
        snprintf(top, sizeof(top), "%.*s", (int)(plen - 1), prefix);
        r = write_header(a, top, AL_ENTRY_DIR, 0755, 0, NULL, err);
        if (r < 0)
            return r;
    }
    for (size_t i = 0; i < t->n; i++) {
        const struct al_tree_entry *e = &t->v[i];
        char name[2 * AL_TREE_PATH_MAX + 2];
        snprintf(name, sizeof(name), "%s%s", prefix, e->path);
        _cleanup_close_ int ffd = -1;
        if (e->type == AL_ENTRY_FILE) {
            ffd = al_beneath_open(dirfd, e->path, O_RDONLY);
            struct stat st;
            if (ffd < 0)
                return al_err(err, ffd, "cannot open '%s': %s", e->path, strerror(-ffd));
            if (fstat(ffd, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != e->size)
                return al_err(err, -EIO, "'%s' changed while being copied", e->path);
        }
        r = write_header(a, name, e->type, e->mode, e->size, e->link, err);
        if (r == 0 && ffd >= 0)
            r = write_data(a, ffd, e->size, e->path, err);
        if (r < 0)
            return r;
    }
    return writer_close(a, err);
}

int al_tar_write_file(int fd, int file_fd, const char *name, al_error *err)
{
    struct stat st;
    if (fstat(file_fd, &st) < 0 || !S_ISREG(st.st_mode))
        return al_err(err, -EINVAL, "'%s' is not a regular file", name);
    _cleanup_archive_write_ struct archive *a = NULL;
    int r = writer_open(&fd, &a, err);
    if (r == 0)
        r = write_header(a, name, AL_ENTRY_FILE, st.st_mode & 0777, (uint64_t)st.st_size, NULL,
                         err);
    if (r == 0)
        r = write_data(a, file_fd, (uint64_t)st.st_size, name, err);
    return r < 0 ? r : writer_close(a, err);
}

/* ---- reading what the guest sent ---- */

struct al_tar_reader {
    struct archive *a;
    struct al_tar_limits lim;
    uint64_t entries, bytes;
    uint64_t left; /* data of the current entry still to come */
    char path[AL_TREE_PATH_MAX + 1];
    char link[AL_TREE_PATH_MAX + 1];
};

static int reader_new(const struct al_tar_limits *lim, struct al_tar_reader **out, al_error *err)
{
    struct al_tar_reader *r = calloc(1, sizeof(*r));
    if (!r || !(r->a = archive_read_new())) {
        free(r);
        return al_err(err, -ENOMEM, "out of memory");
    }
    r->lim = *lim;
    if (!r->lim.entries_max)
        r->lim.entries_max = AL_TREE_ENTRIES_MAX;
    /* tar only (ustar, pax, GNU), no compression: nothing else is asked of the guest. */
    archive_read_support_format_tar(r->a);
    *out = r;
    return 0;
}

/* Opens a reader on an fd (fd >= 0) or on a buffer. */
static int reader_open(int fd, const void *buf, size_t len, const struct al_tar_limits *lim,
                       struct al_tar_reader **out, al_error *err)
{
    struct al_tar_reader *r = NULL;
    int ret = reader_new(lim, &r, err);
    if (ret < 0)
        return ret;
    if ((fd >= 0 ? archive_read_open_fd(r->a, fd, IO_CHUNK)
                 : archive_read_open_memory(r->a, buf, len)) != ARCHIVE_OK) {
        ret = al_err(err, -EPROTO, "not a tar stream: %s", archive_error_string(r->a));
        al_tar_reader_free(r);
        return ret;
    }
    *out = r;
    return 0;
}

int al_tar_reader_fd(int fd, const struct al_tar_limits *lim, struct al_tar_reader **out,
                     al_error *err)
{
    return reader_open(fd, NULL, 0, lim, out, err);
}

int al_tar_reader_mem(const void *buf, size_t len, const struct al_tar_limits *lim,
                      struct al_tar_reader **out, al_error *err)
{
    return reader_open(-1, buf, len, lim, out, err);
}

void al_tar_reader_free(struct al_tar_reader *r)
{
    if (!r)
        return;
    archive_read_free(r->a);
    free(r);
}

static int copy_name(const char *s, char *out, size_t len, const char *what, al_error *err)
{
    if (!s)
        return al_err(err, -EPROTO, "a tar entry from the guest has no %s", what);
    size_t n = strnlen(s, len);
    if (n >= len)
        return al_err(err, -ENAMETOOLONG,
                      "a tar entry from the guest has a %s longer than %zu "
                      "bytes",
                      what, len - 1);
    memcpy(out, s, n + 1);
    return 0;
}

int al_tar_next(struct al_tar_reader *r, struct al_tree_entry *e, al_error *err)
{
    struct archive_entry *ae;
    int ar = archive_read_next_header(r->a, &ae);
    if (ar == ARCHIVE_EOF)
        return 0;
    /* A warning is a name that did not convert to this locale: the UTF-8 one is used, and
     * checked like any other. */
    if (ar != ARCHIVE_OK && ar != ARCHIVE_WARN)
        return al_err(err, -EPROTO, "malformed tar stream from the guest: %s",
                      archive_error_string(r->a) ? archive_error_string(r->a) : "unknown");
    if (++r->entries > r->lim.entries_max)
        return al_err(err, -E2BIG, "the guest's tree has more than %llu entries",
                      (unsigned long long)r->lim.entries_max);
    const char *p = archive_entry_pathname(ae);
    int ret =
        copy_name(p ? p : archive_entry_pathname_utf8(ae), r->path, sizeof(r->path), "path", err);
    if (ret < 0)
        return ret;
    char esc[256];
    if (al_tree_path_check(r->path) < 0)
        return al_err(err, -EPERM, "the guest sent an unsafe path '%s'",
                      al_path_escape(r->path, esc, sizeof(esc)));
    *e = (struct al_tree_entry){.path = r->path, .mode = archive_entry_perm(ae) & 0777};
    la_int64_t size = archive_entry_size(ae);
    if (size < 0)
        return al_err(err, -EPROTO, "the guest sent a negative size for '%s'",
                      al_path_escape(r->path, esc, sizeof(esc)));
    if (archive_entry_hardlink(ae)) {
        e->type = AL_ENTRY_OTHER;
        e->odd = "a hard link";
    } else {
        switch (archive_entry_filetype(ae)) {
        case AE_IFREG:
            e->type = AL_ENTRY_FILE;
            e->size = (uint64_t)size;
            break;
        case AE_IFDIR:
            e->type = AL_ENTRY_DIR;
            break;
        case AE_IFLNK:
            e->type = AL_ENTRY_SYMLINK;
            p = archive_entry_symlink(ae);
            ret = copy_name(p ? p : archive_entry_symlink_utf8(ae), r->link, sizeof(r->link),
                            "symlink target", err);
            if (ret < 0)
                return ret;
            e->link = r->link;
            break;
        default:
            e->type = AL_ENTRY_OTHER;
            e->odd = "a device or special file";
            break;
        }
    }
    if (!r->path[0] && e->type != AL_ENTRY_DIR)
        return al_err(err, -EPROTO, "the guest's tree root is not a directory");
    if (e->size > r->lim.bytes_max || r->bytes + e->size > r->lim.bytes_max)
        return al_err(err, -EFBIG, "the guest's files exceed the limit of %llu bytes",
                      (unsigned long long)r->lim.bytes_max);
    r->bytes += e->size;
    r->left = e->size;
    return 1;
}

ssize_t al_tar_read(struct al_tar_reader *r, void *buf, size_t len, al_error *err)
{
    if (r->left == 0)
        return 0;
    if (len > r->left)
        len = (size_t)r->left;
    la_ssize_t n = archive_read_data(r->a, buf, len);
    if (n < 0)
        return al_err(err, -EPROTO, "malformed tar stream from the guest: %s",
                      archive_error_string(r->a) ? archive_error_string(r->a) : "unknown");
    if (n == 0 || (size_t)n > len)
        return al_err(err, -EPROTO, "the guest's tar stream ends inside '%s'", r->path);
    r->left -= (uint64_t)n;
    return n;
}

int al_tar_scan(struct al_tar_reader *r, struct al_tree *t, al_error *err)
{
    struct al_tree_entry e;
    int ret;
    while ((ret = al_tar_next(r, &e, err)) > 0) {
        if (!e.path[0])
            continue;
        if (e.type == AL_ENTRY_FILE)
            t->bytes += e.size;
        if (al_tree_add(t, &e) < 0)
            return al_err(err, -ENOMEM, "out of memory");
    }
    return ret < 0 ? ret : al_tree_sort(t, err);
}

/* What a Containerfile build hands buildah, checked first (al_build_check): buildah runs as root
 * on the host, and Debian 12's 1.28 resolves a RUN --mount's source on the host (CVE-2024-1753:
 * a context holding `r -> /` and `RUN --mount=type=bind,source=r,target=/h,rw` writes the host).
 * So buildah never sees the user's files: it gets a copy of the Containerfile, refused when it
 * asks for what reaches the host (a --mount, the host's network, a URL fetched by buildah), and a
 * copy of the context in the build's scratch dir, in which every symlink resolves inside the
 * copy. docs/SECURITY.md says why this and not a builder VM. */
#include "tar.h"
#include "vm.h"

#include <ctype.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/syscall.h>

/* A Containerfile is a few KiB; a megabyte is not one. */
#define CONTAINERFILE_MAX (1 << 20)

static char *read_bounded(const char *path, size_t max, size_t *len, al_error *err)
{
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        al_err(err, -errno, "cannot read '%s': %s", path, strerror(errno));
        return NULL;
    }
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > max) {
        al_err(err, -EINVAL, "'%s' is not a Containerfile of at most %zu bytes", path, max);
        return NULL;
    }
    _cleanup_free_ char *buf = malloc(max + 1);
    if (!buf) {
        al_err(err, -ENOMEM, "out of memory");
        return NULL;
    }
    size_t have = 0;
    for (;;) {
        ssize_t n = read(fd, buf + have, max + 1 - have);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            al_err(err, -errno, "cannot read '%s': %s", path, strerror(errno));
            return NULL;
        }
        if (n == 0)
            break;
        if ((have += (size_t)n) > max) {
            al_err(err, -EINVAL, "'%s' is not a Containerfile of at most %zu bytes", path, max);
            return NULL;
        }
    }
    buf[have] = '\0';
    if (memchr(buf, '\0', have)) {
        al_err(err, -EINVAL, "'%s' is not a Containerfile (it holds a NUL byte)", path);
        return NULL;
    }
    *len = have;
    return TAKE_PTR(buf);
}

static bool comment_line(const char *line, size_t len)
{
    size_t i = 0;
    while (i < len && (line[i] == ' ' || line[i] == '\t'))
        i++;
    return i < len && line[i] == '#';
}

/* The text with comment lines dropped, then every blank and both escape characters dropped,
 * lowercased: whatever buildah's parser joins into a flag (continuations, comments inside
 * them, either escape directive), this holds it whole, so a search in it cannot miss one. */
static char *squeezed(const char *text, size_t len)
{
    char *out = malloc(len + 1), *o = out;
    if (!out)
        return NULL;
    for (const char *p = text, *end = text + len; p < end;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t l = nl ? (size_t)(nl - p) : (size_t)(end - p);
        if (!comment_line(p, l))
            for (size_t i = 0; i < l; i++)
                if (!isspace((unsigned char)p[i]) && p[i] != '\\' && p[i] != '`')
                    *o++ = (char)tolower((unsigned char)p[i]);
        p += l + (nl ? 1 : 0);
    }
    *o = '\0';
    return out;
}

/* The escape character of the parser directive at the top ("# escape=`"), '\\' otherwise. */
static char escape_char(const char *text)
{
    for (const char *p = text; *p == '#';) {
        const char *nl = strchr(p, '\n');
        size_t l = nl ? (size_t)(nl - p) : strlen(p);
        char d[64];
        size_t n = 0;
        for (size_t i = 1; i < l && n < sizeof(d) - 1; i++)
            if (!isspace((unsigned char)p[i]))
                d[n++] = (char)tolower((unsigned char)p[i]);
        d[n] = '\0';
        if (!strncmp(d, "escape=", 7) && (d[7] == '`' || d[7] == '\\') && !d[8])
            return d[7];
        if (!strchr(d, '=') || !nl)
            break;
        p = nl + 1;
    }
    return '\\';
}

/* Calls check on each instruction, its continuation lines joined (comment lines inside them
 * dropped, as buildah's parser does). */
static int each_instruction(const char *text, size_t len,
                            int (*check)(const char *ins, al_error *err), al_error *err)
{
    char esc = escape_char(text);
    _cleanup_free_ char *ins = malloc(len + 1);
    if (!ins)
        return al_err(err, -ENOMEM, "out of memory");
    size_t n = 0;
    for (const char *line = text, *end = text + len; line < end;) {
        const char *nl = memchr(line, '\n', (size_t)(end - line));
        size_t l = nl ? (size_t)(nl - line) : (size_t)(end - line);
        const char *next = nl ? nl + 1 : end;
        if (n && comment_line(line, l)) {
            line = next;
            continue;
        }
        while (l && isspace((unsigned char)line[l - 1]))
            l--;
        bool more = l && line[l - 1] == esc;
        memcpy(ins + n, line, more ? l - 1 : l);
        n += more ? l - 1 : l;
        ins[n] = '\0';
        line = next;
        if (more && line < end)
            continue;
        int r = n ? check(ins, err) : 0;
        if (r < 0)
            return r;
        n = 0;
    }
    return 0;
}

/* The word at *p (skipping blanks), lowercased into w; advances *p. */
static void next_word(const char **p, char *w, size_t len)
{
    while (isspace((unsigned char)**p))
        (*p)++;
    size_t n = 0;
    for (; **p && !isspace((unsigned char)**p); (*p)++)
        if (n < len - 1)
            w[n++] = (char)tolower((unsigned char)**p);
    w[n] = '\0';
}

/* ADD fetches a URL (or a git repository) with the host's network, from buildah's process on
 * the host: the host's loopback services and the cloud's metadata address would answer. A
 * source that is a variable may be one. */
static int check_add(const char *ins, al_error *err)
{
    const char *p = ins;
    char w[16];
    next_word(&p, w, sizeof(w));
    if (!strcmp(w, "onbuild"))
        next_word(&p, w, sizeof(w));
    if (strcmp(w, "add"))
        return 0;
    if (strstr(p, "://") || strchr(p, '$') || strstr(p, "git@"))
        return al_err(err, -EPERM,
                      "the Containerfile's ADD names a URL or a variable, which buildah would "
                      "fetch with the host's network: refused (fetch it in a RUN instead)");
    return 0;
}

int al_build_check_containerfile(const char *file, const char *copy, al_error *err)
{
    size_t len = 0;
    _cleanup_free_ char *text = read_bounded(file, CONTAINERFILE_MAX, &len, err);
    if (!text)
        return -EINVAL;
    _cleanup_free_ char *sq = squeezed(text, len);
    if (!sq)
        return al_err(err, -ENOMEM, "out of memory");
    /* Every --mount kind reaches the host in buildah 1.28: bind and cache sources resolve there,
     * a cache lives in the host's /var/tmp, a secret is a host file. */
    if (strstr(sq, "--mount"))
        return al_err(err, -EPERM,
                      "the Containerfile uses RUN --mount, whose sources buildah resolves on the "
                      "host (CVE-2024-1753): refused; COPY the files in instead");
    if (strstr(sq, "--network=host") || strstr(sq, "--network=container") ||
        strstr(sq, "--network=ns:"))
        return al_err(err, -EPERM,
                      "the Containerfile asks for the host's network in a RUN: refused");
    int r = each_instruction(text, len, check_add, err);
    if (r < 0)
        return r;
    _cleanup_close_ int fd = open(copy, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return al_err(err, -errno, "cannot write '%s': %s", copy, strerror(errno));
    if (al_write_all(fd, text, len) < 0)
        return al_err(err, -errno, "cannot write '%s': %s", copy, strerror(errno));
    return 0;
}

/* ---- the context ---- */

static int copy_file(int src_dir, int dst_dir, const struct al_tree_entry *e, uint64_t *left,
                     al_error *err)
{
    _cleanup_close_ int in = al_beneath_open(src_dir, e->path, O_RDONLY | O_NOCTTY | O_NONBLOCK);
    struct stat st;
    if (in < 0 || fstat(in, &st) < 0 || !S_ISREG(st.st_mode))
        return al_err(err, in < 0 ? in : -EINVAL,
                      "the build context's '%s' changed while it was copied", e->path);
    const char *base;
    _cleanup_close_ int dir = al_beneath_parent(dst_dir, e->path, &base);
    _cleanup_close_ int out =
        dir < 0 ? dir
                : openat(dir, base, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (out < 0)
        return al_err(err, out == -1 ? -errno : out, "cannot copy the build context's '%s': %s",
                      e->path, strerror(out == -1 ? errno : -out));
    /* What the walk counted, no more: a file that grows meanwhile cannot pass the bound. */
    uint64_t size = e->size;
    if (size > *left)
        return al_err(err, -EFBIG, "the build context holds more than the image's size limit");
    *left -= size;
    while (size) {
        ssize_t n = copy_file_range(in, NULL, out, NULL, size > (1 << 30) ? 1 << 30 : size, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return al_err(err, n < 0 ? -errno : -EIO, "cannot copy the build context's '%s': %s",
                          e->path, n < 0 ? strerror(errno) : "it shrank");
        size -= (uint64_t)n;
    }
    struct timespec times[2] = {st.st_atim, st.st_mtim};
    if (fchmod(out, e->mode & 0777) < 0 || futimens(out, times) < 0)
        return al_err(err, -errno, "cannot copy the build context's '%s': %s", e->path,
                      strerror(errno));
    return 0;
}

/* Does the symlink at rel, resolved inside dir (the copy), stay there? A link's own text can
 * stay inside while a link it goes through does not (`up -> ..` in a subdirectory, then
 * `r -> sub/up/..`): the kernel resolves it, bounded beneath dir. A link to nothing is harmless
 * (the copy never changes). */
static bool resolves_inside(int dir, const char *rel)
{
    struct open_how how = {.flags = O_PATH | O_CLOEXEC,
                           .resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS};
    long fd = syscall(SYS_openat2, dir, rel, &how, sizeof(how));
    if (fd >= 0) {
        close((int)fd);
        return true;
    }
    return errno == ENOENT || errno == ENOTDIR;
}

int al_build_copy_context(const char *src, const char *dst, uint64_t bytes_max, int log_fd,
                          al_error *err)
{
    _cleanup_close_ int sfd = open(src, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (sfd < 0)
        return al_err(err, -errno, "cannot open the build context '%s': %s", src, strerror(errno));
    if (mkdir(dst, 0700) < 0)
        return al_err(err, -errno, "cannot create '%s': %s", dst, strerror(errno));
    _cleanup_close_ int dfd = open(dst, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0)
        return al_err(err, -errno, "cannot open '%s': %s", dst, strerror(errno));
    struct al_tar_limits lim = {.bytes_max = bytes_max, .entries_max = AL_TREE_ENTRIES_MAX};
    struct al_tree t = {0};
    int r = al_tree_walk(sfd, &lim, &t, err);
    if (r == 0 && t.bytes > bytes_max)
        r = al_err(err, -EFBIG, "the build context '%s' holds more than %llu MiB", src,
                   (unsigned long long)(bytes_max >> 20));
    /* Left out, never followed: symlinks leading out of the context, special files. */
    for (size_t i = 0; r == 0 && i < t.nskipped; i++)
        if (log_fd > 0)
            dprintf(log_fd, "airlock: build context: %s\n", t.skipped[i]);
    uint64_t left = bytes_max;
    for (size_t i = 0; r == 0 && i < t.n; i++) {
        const struct al_tree_entry *e = &t.v[i];
        if (!e->path[0])
            continue;
        const char *base;
        _cleanup_close_ int dir = -1;
        if (e->type == AL_ENTRY_FILE) {
            r = copy_file(sfd, dfd, e, &left, err);
        } else if ((dir = al_beneath_parent(dfd, e->path, &base)) < 0) {
            r = al_err(err, dir, "cannot copy the build context's '%s': %s", e->path,
                       strerror(-dir));
        } else if (e->type == AL_ENTRY_DIR) {
            if (mkdirat(dir, base, 0700) < 0)
                r = al_err(err, -errno, "cannot copy the build context's '%s': %s", e->path,
                           strerror(errno));
        } else if (e->type == AL_ENTRY_SYMLINK) {
            if (symlinkat(e->link, dir, base) < 0)
                r = al_err(err, -errno, "cannot copy the build context's '%s': %s", e->path,
                           strerror(errno));
        }
    }
    /* Every link in place, each resolved as buildah's host would; the directories' modes last,
     * from the deepest (one without write permission is filled first). */
    for (size_t i = 0; r == 0 && i < t.n; i++)
        if (t.v[i].type == AL_ENTRY_SYMLINK && !resolves_inside(dfd, t.v[i].path))
            r = al_err(err, -EPERM,
                       "the build context's symlink '%s' leads out of the context through other "
                       "links: refused",
                       t.v[i].path);
    for (size_t i = t.n; r == 0 && i-- > 0;)
        if (t.v[i].type == AL_ENTRY_DIR &&
            fchmodat(dfd, t.v[i].path[0] ? t.v[i].path : ".", t.v[i].mode & 0777, 0) < 0)
            r = al_err(err, -errno, "cannot copy the build context's '%s': %s", t.v[i].path,
                       strerror(errno));
    al_tree_free(&t);
    return r;
}

/* Figures a run saves in the guest, copied to the user's outputs directory: only image kinds,
 * each bounded in size, the session's total bounded, each checked to be the image its name
 * says, and the directory kept to a quota. The guest chooses the bytes, never the host name. */
#include "chat.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

struct kind {
    const char *ext;   /* with the dot, compared without case */
    const char *magic; /* the first bytes; NULL: an SVG, checked as text */
    size_t len;
    size_t at; /* where the magic starts */
};

static const struct kind kinds[] = {
    {".png", "\x89PNG\r\n\x1a\n", 8, 0},
    {".jpg", "\xff\xd8\xff", 3, 0},
    {".jpeg", "\xff\xd8\xff", 3, 0},
    {".gif", "GIF8", 4, 0},  /* GIF87a, GIF89a */
    {".webp", "WEBP", 4, 8}, /* RIFF, a length, WEBP */
    {".pdf", "%PDF-", 5, 0},
    {".svg", NULL, 0, 0},
};

static const struct kind *kind_of(const char *ext)
{
    for (size_t i = 0; ext && i < sizeof(kinds) / sizeof(kinds[0]); i++)
        if (!strcasecmp(ext, kinds[i].ext))
            return &kinds[i];
    return NULL;
}

bool al_figure_ext_ok(const char *ext)
{
    return kind_of(ext) != NULL;
}

bool al_figure_magic_ok(int fd, const char *ext)
{
    const struct kind *k = kind_of(ext);
    unsigned char buf[256];
    ssize_t n = k ? pread(fd, buf, sizeof(buf), 0) : -1;
    if (n <= 0)
        return false;
    if (k->magic) {
        if (!strcmp(k->ext, ".webp") && (n < 4 || memcmp(buf, "RIFF", 4)))
            return false;
        return (size_t)n >= k->at + k->len && !memcmp(buf + k->at, k->magic, k->len);
    }
    /* SVG: XML text, after an optional byte order mark and blanks. */
    size_t i = n >= 3 && !memcmp(buf, "\xef\xbb\xbf", 3) ? 3 : 0;
    while (i < (size_t)n && strchr(" \t\r\n", buf[i]))
        i++;
    size_t rest = (size_t)n - i;
    return (rest >= 4 && !memcmp(buf + i, "<svg", 4)) ||
           (rest >= 5 && !memcmp(buf + i, "<?xml", 5));
}

struct outfile {
    char name[256];
    struct timespec mtime;
    uint64_t size;
};

static int newest_first(const void *a, const void *b)
{
    const struct outfile *x = a, *y = b;
    if (x->mtime.tv_sec != y->mtime.tv_sec)
        return x->mtime.tv_sec < y->mtime.tv_sec ? 1 : -1;
    if (x->mtime.tv_nsec != y->mtime.tv_nsec)
        return x->mtime.tv_nsec < y->mtime.tv_nsec ? 1 : -1;
    return strcmp(y->name, x->name);
}

int al_outputs_prune(const char *dir, size_t keep_files, uint64_t keep_bytes, al_error *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return al_err(err, -errno, "cannot open '%s': %s", dir, strerror(errno));
    struct outfile *v = NULL;
    size_t n = 0, cap = 0;
    int r = 0;
    for (struct dirent *e; (e = readdir(d));) {
        struct stat st;
        /* Only what airlock wrote there (SESSION-N.ext): the user's own files stay. */
        if (strncmp(e->d_name, "airlock-", 8) || strlen(e->d_name) >= sizeof(v->name) ||
            fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
            continue;
        if (al_grow(&v, &cap, n, sizeof(*v), 64) < 0) {
            r = al_err(err, -ENOMEM, "out of memory");
            break;
        }
        snprintf(v[n].name, sizeof(v[n].name), "%s", e->d_name);
        v[n].mtime = st.st_mtim;
        v[n].size = (uint64_t)st.st_size;
        n++;
    }
    if (r == 0 && n)
        qsort(v, n, sizeof(*v), newest_first);
    uint64_t bytes = 0;
    for (size_t i = 0; r == 0 && i < n; i++) {
        bytes += v[i].size;
        /* The newest is always kept: it is the one just copied. */
        if (i > 0 && (i >= keep_files || bytes > keep_bytes) &&
            unlinkat(dirfd(d), v[i].name, 0) < 0 && errno != ENOENT)
            r = al_err(err, -errno, "cannot remove '%s/%s': %s", dir, v[i].name, strerror(errno));
    }
    free(v);
    closedir(d);
    return r;
}

/* The host path of the session's next output file (ext: ".png"...) in the outputs dir, which
 * goes to dir. */
static int output_path(const al_figures *f, const char *ext, char *dir, size_t dlen, char *host,
                       size_t len, al_error *err)
{
    int r = al_data_dir("outputs", dir, dlen, err);
    if (r < 0)
        return r;
    if (snprintf(host, len, "%s/%s-%u%s", dir, al_session_name(f->session), f->saved + 1, ext) >=
        (int)len)
        return al_err(err, -ENAMETOOLONG, "host path too long");
    return 0;
}

int al_figure_get(al_figures *f, const char *guest_path, char *host, size_t len, al_error *err)
{
    const char *ext = strrchr(guest_path, '.');
    if (!al_figure_ext_ok(ext) || strchr(ext, '/'))
        return al_err(err, -ENOTSUP, "'%s' is not a figure", guest_path);
    if (f->bytes >= AL_FIGURES_SESSION_BYTES_MAX)
        return al_err(err, -EDQUOT, "this session's figures reached the limit of %llu MiB",
                      AL_FIGURES_SESSION_BYTES_MAX >> 20);
    uint64_t left = AL_FIGURES_SESSION_BYTES_MAX - f->bytes;
    uint64_t max = left < AL_FIGURE_BYTES_MAX ? left : AL_FIGURE_BYTES_MAX;
    char dir[AL_PATH_MAX];
    int r = output_path(f, ext, dir, sizeof(dir), host, len, err);
    if (r < 0)
        return r;
    al_error ge = {0};
    r = al_file_get_max(f->session, guest_path, host, max, &ge);
    if (r == -EFBIG && max < AL_FIGURE_BYTES_MAX)
        return al_err(err, -EDQUOT, "over what is left of this session's %llu MiB of figures",
                      AL_FIGURES_SESSION_BYTES_MAX >> 20);
    if (r == -EFBIG)
        return al_err(err, r, "over the limit of %llu MiB per figure", AL_FIGURE_BYTES_MAX >> 20);
    if (r < 0)
        return al_err(err, r, "%s", ge.msg);
    f->saved++;
    int fd = open(host, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    struct stat st;
    /* Data, never a program, whatever mode the guest gave it. */
    bool ok =
        fd >= 0 && fstat(fd, &st) == 0 && fchmod(fd, 0644) == 0 && al_figure_magic_ok(fd, ext);
    if (fd >= 0)
        close(fd);
    if (!ok) {
        unlink(host);
        return al_err(err, -EINVAL, "its bytes are not a %s image", ext + 1);
    }
    f->bytes += (uint64_t)st.st_size;
    al_error pe = {0};
    al_outputs_prune(dir, AL_OUTPUTS_KEEP_FILES, AL_OUTPUTS_KEEP_BYTES, &pe);
    return 0;
}

int al_figure_save(al_figures *f, const al_mime *m, char *host, size_t len, al_error *err)
{
    const char *ext = !strcmp(m->type, "image/png")       ? ".png"
                      : !strcmp(m->type, "image/jpeg")    ? ".jpg"
                      : !strcmp(m->type, "image/svg+xml") ? ".svg"
                                                          : NULL;
    if (!ext)
        return al_err(err, -ENOTSUP, "a %s result is not a figure", m->type);
    if (m->len > AL_FIGURE_BYTES_MAX)
        return al_err(err, -EFBIG, "over the limit of %llu MiB per figure",
                      AL_FIGURE_BYTES_MAX >> 20);
    if (f->bytes + m->len > AL_FIGURES_SESSION_BYTES_MAX)
        return al_err(err, -EDQUOT, "over what is left of this session's %llu MiB of figures",
                      AL_FIGURES_SESSION_BYTES_MAX >> 20);
    char dir[AL_PATH_MAX];
    int r = output_path(f, ext, dir, sizeof(dir), host, len, err);
    if (r < 0)
        return r;
    /* The name is ours; the bytes were checked to be of their kind by the result reader. */
    int fd = open(host, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0)
        return al_err(err, -errno, "cannot create '%s': %s", host, strerror(errno));
    r = al_write_all(fd, m->data, m->len);
    close(fd);
    if (r < 0) {
        unlink(host);
        return al_err(err, r, "cannot write '%s': %s", host, strerror(-r));
    }
    f->saved++;
    f->bytes += m->len;
    al_error pe = {0};
    al_outputs_prune(dir, AL_OUTPUTS_KEEP_FILES, AL_OUTPUTS_KEEP_BYTES, &pe);
    return 0;
}

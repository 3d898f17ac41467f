/* Image layers applied onto a host directory (orchestrator/vm/layers.c), without a VM: crafted
 * tar streams, written in memory with libarchive (hostile ones no image builder would make),
 * applied to a scratch ROOT. Next to ROOT lies a sentinel directory: after every hostile layer,
 * nothing beside ROOT may have changed. TAP. */
#include "layers.h"
#include "tar.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>

#include "tap.h"

/* ---- crafted layers ---- */

struct ent {
    const char *path;
    int type;         /* AE_IF*; 0 ends a list */
    const char *data; /* file content, or symlink or hard link target */
    unsigned mode;    /* 0: 0644 (0755 for a directory) */
    bool hardlink;
    unsigned major, minor; /* device numbers */
    const char *xattr;     /* an extended attribute's name (value "v") */
    uint64_t sparse;       /* a sparse file of this size: data at its middle, holes around */
    unsigned uid;
};

#define SPARSE_DATA "hello"

struct blob {
    char *buf;
    size_t len;
};

static struct blob layer_of(const struct ent *v, bool gzip)
{
    size_t cap = 8 << 20, used = 0;
    char *buf = malloc(cap);
    static char zeros[1 << 20];
    struct archive *a = archive_write_new();
    archive_write_set_format_pax(a);
    if (gzip)
        archive_write_add_filter_gzip(a);
    archive_write_open_memory(a, buf, cap, &used);
    for (; v->type; v++) {
        struct archive_entry *e = archive_entry_new();
        archive_entry_set_pathname(e, v->path);
        archive_entry_set_filetype(e, (unsigned)v->type);
        archive_entry_set_perm(e, v->mode ? v->mode : v->type == AE_IFDIR ? 0755 : 0644);
        archive_entry_set_mtime(e, 1700000000, 0);
        archive_entry_set_uid(e, v->uid);
        archive_entry_set_gid(e, v->uid);
        if (v->hardlink)
            archive_entry_set_hardlink(e, v->data);
        else if (v->type == AE_IFLNK)
            archive_entry_set_symlink(e, v->data);
        if (v->type == AE_IFCHR || v->type == AE_IFBLK) {
            archive_entry_set_rdevmajor(e, v->major);
            archive_entry_set_rdevminor(e, v->minor);
        }
        if (v->xattr)
            archive_entry_xattr_add_entry(e, v->xattr, "v", 1);
        size_t n = v->type == AE_IFREG && !v->hardlink && v->data ? strlen(v->data) : 0;
        if (v->sparse) {
            archive_entry_set_size(e, (la_int64_t)v->sparse);
            archive_entry_sparse_add_entry(e, (la_int64_t)v->sparse / 2, sizeof(SPARSE_DATA) - 1);
        } else {
            archive_entry_set_size(e, (la_int64_t)n);
        }
        archive_write_header(a, e);
        if (v->sparse) {
            /* the whole logical content: the writer skips the holes */
            for (uint64_t off = 0; off < v->sparse / 2; off += sizeof(zeros))
                archive_write_data(a, zeros, sizeof(zeros));
            archive_write_data(a, SPARSE_DATA, sizeof(SPARSE_DATA) - 1);
            for (uint64_t off = v->sparse / 2 + sizeof(SPARSE_DATA) - 1; off < v->sparse;) {
                size_t k = v->sparse - off < sizeof(zeros) ? v->sparse - off : sizeof(zeros);
                archive_write_data(a, zeros, k);
                off += k;
            }
        } else if (n) {
            archive_write_data(a, v->data, n);
        }
        archive_entry_free(e);
    }
    archive_write_close(a);
    archive_write_free(a);
    return (struct blob){buf, used};
}

/* ---- the scratch dir: ROOT and the sentinel beside it ---- */

static char scratch[256], root[300], sentinel[300], canary[340];
static int rootfd = -1;
static struct al_layer_limits lim;
static struct al_layer_stats st;
static al_error err;
static char notes[16384];
static char sha[65];

static void note_cb(void *ctx, const char *line)
{
    (void)ctx;
    size_t n = strlen(notes);
    snprintf(notes + n, sizeof(notes) - n, "%s\n", line);
}

static void fresh(void)
{
    char cmd[800];
    if (rootfd >= 0)
        close(rootfd);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s' && mkdir '%s'", root, root);
    if (system(cmd) != 0)
        abort();
    rootfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (rootfd < 0)
        abort();
    lim = (struct al_layer_limits){.bytes_max = 64 << 20};
    st = (struct al_layer_stats){0};
}

/* Applies the blob (then freed) as a layer onto ROOT: al_layer_apply's return. */
static int apply_blob(struct blob b)
{
    int fd = memfd_create("layer", MFD_CLOEXEC);
    if (fd < 0 || write(fd, b.buf, b.len) != (ssize_t)b.len || lseek(fd, 0, SEEK_SET) != 0)
        abort();
    free(b.buf);
    err = (al_error){0};
    notes[0] = '\0';
    memset(sha, 0, sizeof(sha));
    int r = al_layer_apply(rootfd, fd, &lim, &st, note_cb, NULL, sha, &err);
    close(fd);
    return r;
}

static int apply(const struct ent *v)
{
    return apply_blob(layer_of(v, false));
}

/* The scratch dir holds ROOT and the sentinel, the sentinel its canary alone, unchanged, and no
 * hostile layer wrote the host's /etc/x. */
static bool outside_untouched(void)
{
    DIR *d = opendir(scratch);
    int n = 0;
    bool other = false;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            n++;
            other |= strcmp(e->d_name, "root") && strcmp(e->d_name, "sentinel");
        }
    if (d)
        closedir(d);
    d = opendir(sentinel);
    int m = 0;
    while (d && (e = readdir(d)))
        m += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    if (d)
        closedir(d);
    char buf[64] = {0};
    FILE *f = fopen(canary, "r");
    if (f) {
        if (!fgets(buf, sizeof(buf), f))
            buf[0] = '\0';
        fclose(f);
    }
    struct stat s;
    return n == 2 && !other && m == 1 && !strcmp(buf, "canary\n") && lstat("/etc/x", &s) < 0;
}

static int lstat_rel(const char *rel, struct stat *s)
{
    char p[700];
    snprintf(p, sizeof(p), "%s/%s", root, rel);
    return lstat(p, s);
}

static bool exists(const char *rel)
{
    struct stat s;
    return lstat_rel(rel, &s) == 0;
}

static bool is_type(const char *rel, mode_t type)
{
    struct stat s;
    return lstat_rel(rel, &s) == 0 && (s.st_mode & S_IFMT) == type;
}

static mode_t mode_of(const char *rel)
{
    struct stat s;
    return lstat_rel(rel, &s) < 0 ? (mode_t)-1 : s.st_mode & 07777;
}

static bool has(const char *rel, const char *text)
{
    char p[700], buf[256] = {0};
    snprintf(p, sizeof(p), "%s/%s", root, rel);
    FILE *f = fopen(p, "r");
    if (!f)
        return false;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    return !strcmp(buf, text);
}

static int children(const char *rel)
{
    char p[700];
    snprintf(p, sizeof(p), "%s/%s", root, rel);
    DIR *d = opendir(p);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    if (d)
        closedir(d);
    return d ? n : -1;
}

static bool hex_sha256(const void *p, size_t n, const char *hex)
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned len = 0;
    char out[65];
    EVP_Digest(p, n, md, &len, EVP_sha256(), NULL);
    for (unsigned i = 0; i < len; i++)
        snprintf(out + 2 * i, 3, "%02x", md[i]);
    return len == 32 && !strcmp(out, hex);
}

#define F(p, d)                                                                                    \
    {                                                                                              \
        .path = p, .type = AE_IFREG, .data = d                                                     \
    }
#define D(p)                                                                                       \
    {                                                                                              \
        .path = p, .type = AE_IFDIR                                                                \
    }
#define L(p, t)                                                                                    \
    {                                                                                              \
        .path = p, .type = AE_IFLNK, .data = t                                                     \
    }
#define H(p, t)                                                                                    \
    {                                                                                              \
        .path = p, .type = AE_IFREG, .data = t, .hardlink = true                                   \
    }
#define END                                                                                        \
    {                                                                                              \
        .type = 0                                                                                  \
    }

static void hostile(void)
{
    fresh();
    const struct ent dotdot[] = {F("../x", "x"), END};
    ok(apply(dotdot) == -EINVAL && strstr(err.msg, "entry '../x'") && strstr(err.msg, ".."),
       "'../x' refused, the entry named (%s)", err.msg);
    ok(outside_untouched(), "nothing outside ROOT after '../x'");

    const struct ent deep[] = {F("a/b/../../../x", "x"), END};
    ok(apply(deep) == -EINVAL, "'a/b/../../../x' refused (%s)", err.msg);

    const struct ent abs[] = {F("/etc/x", "x"), END};
    ok(apply(abs) == -EINVAL && strstr(err.msg, "entry '/etc/x'") && strstr(err.msg, "absolute"),
       "'/etc/x' refused (%s)", err.msg);
    ok(outside_untouched() && !exists("etc"), "nothing made for '/etc/x'");

    char longname[AL_TREE_PATH_MAX + 10];
    memset(longname, 'n', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    const struct ent toolong[] = {F(longname, "x"), END};
    ok(apply(toolong) == -ENAMETOOLONG && strstr(err.msg, "too long"),
       "a path over AL_TREE_PATH_MAX refused (%s)", err.msg);

    /* A symlink to the host's / then a file through it: the kernel resolves it in ROOT. */
    fresh();
    const struct ent evil[] = {L("evil", "/"), F("evil/etc/x", "inside\n"), END};
    ok(apply(evil) == 0, "evil -> / then evil/etc/x applied (%s)", err.msg);
    ok(has("etc/x", "inside\n") && is_type("evil", S_IFLNK), "it landed at ROOT/etc/x");
    ok(outside_untouched(), "nothing outside ROOT after evil -> /");

    fresh();
    const struct ent esc[] = {L("esc", "../../.."), F("esc/x", "in\n"), END};
    ok(apply(esc) == 0 && has("x", "in\n"), "esc -> ../../.. then esc/x lands at ROOT/x (%s)",
       err.msg);
    ok(outside_untouched(), "nothing outside ROOT after esc -> ../../..");

    /* A symlink to the sentinel (by ".." and by its host path): a directory it names is looked
     * for in ROOT, where there is none. */
    fresh();
    char host_sentinel[400];
    snprintf(host_sentinel, sizeof(host_sentinel), "%s", sentinel);
    const struct ent sent[] = {D("d"), L("d/s", "../../sentinel"), L("h", host_sentinel),
                               F("d/s/canary", "pwned\n"), END};
    ok(apply(sent) == -ENOTDIR && strstr(err.msg, "entry 'd/s/canary'"),
       "a file through a symlink to nothing in ROOT refused (%s)", err.msg);
    const struct ent sent2[] = {F("h/canary", "pwned\n"), END};
    ok(apply(sent2) == -ENOTDIR, "a file through a symlink to the sentinel's host path refused");
    ok(outside_untouched(), "the sentinel is untouched");

    /* Hard links out, to nothing, to a directory. */
    fresh();
    const struct ent hl_out[] = {H("l", "../outside"), END};
    ok(apply(hl_out) == -EINVAL && strstr(err.msg, "entry 'l'") && strstr(err.msg, ".."),
       "a hard link to ../outside refused (%s)", err.msg);
    const struct ent hl_abs[] = {H("l", "/etc/passwd"), END};
    ok(apply(hl_abs) == -EINVAL && strstr(err.msg, "absolute"),
       "a hard link to /etc/passwd refused (%s)", err.msg);
    const struct ent hl_evil[] = {L("evil", "/"), H("l", "evil/etc/passwd"), END};
    ok(apply(hl_evil) == -ENOENT && strstr(err.msg, "missing"),
       "a hard link through evil -> / finds no /etc/passwd in ROOT (%s)", err.msg);
    const struct ent hl_dir[] = {D("dir"), H("l", "dir"), END};
    ok(apply(hl_dir) == -EPERM && strstr(err.msg, "directory"),
       "a hard link to a directory refused (%s)", err.msg);
    ok(outside_untouched() && !exists("l"), "nothing linked");

    fresh();
    const struct ent hl_ok[] = {F("a/f", "data\n"), H("b/g", "./a//f"), END};
    struct stat s1, s2;
    ok(apply(hl_ok) == 0 && lstat_rel("a/f", &s1) == 0 && lstat_rel("b/g", &s2) == 0 &&
           s1.st_ino == s2.st_ino && s1.st_nlink == 2,
       "a hard link within ROOT is the same inode (%s)", err.msg);

    /* Parents that are not directories. */
    fresh();
    const struct ent notdir[] = {F("f", "x"), F("f/g", "y"), END};
    ok(apply(notdir) == -ENOTDIR && strstr(err.msg, "entry 'f/g'") &&
           strstr(err.msg, "not a directory"),
       "a file beneath a file refused (%s)", err.msg);

    /* Not a tar at all. */
    fresh();
    char junk[640];
    for (size_t i = 0; i < sizeof(junk); i++)
        junk[i] = "this is not a tar stream\n"[i % 25];
    char *copy = malloc(sizeof(junk));
    memcpy(copy, junk, sizeof(junk));
    ok(apply_blob((struct blob){copy, sizeof(junk)}) == -EPROTO && strstr(err.msg, "not a tar") &&
           sha[0] == '\0',
       "a non-tar input refused, no digest given (%s)", err.msg);
    ok(outside_untouched() && children("") == 0, "nothing made of it");
}

static void special(void)
{
    fresh();
    const struct ent devs[] = {{.path = "dev/sda", .type = AE_IFBLK, .major = 8},
                               {.path = "dev/mem", .type = AE_IFCHR, .major = 1, .minor = 1},
                               {.path = "fifo", .type = AE_IFIFO, .mode = 0640},
                               END};
    ok(apply(devs) == 0 && !exists("dev/sda") && !exists("dev/mem") && st.devices == 2,
       "block and char devices dropped, counted (%s)", err.msg);
    ok(strstr(notes, "dev/sda: device node dropped") && strstr(notes, "dev/mem: device node"),
       "and noted");
    ok(is_type("fifo", S_IFIFO) && mode_of("fifo") == 0640, "a FIFO made as a FIFO");

    /* chardev 0:0 removes the lower layer's file */
    const struct ent lower[] = {F("etc/gone", "x"), F("etc/kept", "y"), END};
    ok(apply(lower) == 0 && exists("etc/gone"), "lower layer applied");
    const struct ent wh[] = {{.path = "etc/gone", .type = AE_IFCHR}, END};
    unsigned devices = st.devices;
    ok(apply(wh) == 0 && !exists("etc/gone") && exists("etc/kept") && st.whiteouts == 1 &&
           st.devices == devices,
       "a char device 0:0 is a whiteout (%s)", err.msg);

    /* set-id bits */
    fresh();
    const struct ent setid[] = {{.path = "bin/su", .type = AE_IFREG, .data = "x", .mode = 04755},
                                {.path = "bin/wall", .type = AE_IFREG, .data = "x", .mode = 02755},
                                {.path = "sgid", .type = AE_IFDIR, .mode = 02775},
                                END};
    ok(apply(setid) == 0 && mode_of("bin/su") == 0755 && mode_of("bin/wall") == 0755 &&
           mode_of("sgid") == 0775 && st.setid == 3,
       "set-uid and set-gid cleared, counted (%s)", err.msg);
    ok(strstr(notes, "bin/su: set-uid bit cleared") && strstr(notes, "bin/wall: set-gid bit"),
       "and noted");
    fresh();
    lim.keep_setid = true;
    ok(apply(setid) == 0 && mode_of("bin/su") == 04755 && mode_of("bin/wall") == 02755 &&
           st.setid == 0 && !strstr(notes, "cleared"),
       "kept with keep_setid (%s)", err.msg);

    /* owners */
    if (geteuid() == 0) {
        fresh();
        lim.chown = true;
        const struct ent own[] = {
            {.path = "home/u/f", .type = AE_IFREG, .data = "x", .uid = 1234, .mode = 04755},
            {.path = "home/u/l", .type = AE_IFLNK, .data = "/nowhere", .uid = 1235},
            END};
        struct stat s1, s2;
        ok(apply(own) == 0 && lstat_rel("home/u/f", &s1) == 0 && s1.st_uid == 1234 &&
               s1.st_gid == 1234 && (s1.st_mode & 07777) == 0755 &&
               lstat_rel("home/u/l", &s2) == 0 && s2.st_uid == 1235,
           "chown gives the layer's ids, the symlink its own (%s)", err.msg);
    }

    /* extended attributes */
    fresh();
    const struct ent xa[] = {
        {.path = "cap", .type = AE_IFREG, .data = "x", .xattr = "security.capability"},
        {.path = "u", .type = AE_IFREG, .data = "y", .xattr = "user.test"},
        END};
    char p[700], v[16];
    snprintf(p, sizeof(p), "%s/u", root);
    ok(apply(xa) == 0 && st.xattrs == 2 && strstr(notes, "cap: extended attributes dropped") &&
           lgetxattr(p, "user.test", v, sizeof(v)) < 0,
       "extended attributes dropped, counted, noted (%s)", err.msg);

    /* times, clamped */
    fresh();
    struct stat ts;
    const struct ent t[] = {F("t", "x"), END};
    ok(apply(t) == 0 && lstat_rel("t", &ts) == 0 && ts.st_mtime == 1700000000, "the entry's mtime");
}

static void whiteouts(void)
{
    fresh();
    const struct ent lower[] = {F("etc/f", "x"),       D("etc/d"),      F("etc/d/in", "y"),
                                F("etc/keep", "k"),    F("o/a", "a"),   F("o/b", "b"),
                                F("o/sub/old", "old"), F("o2/a", "a"),  L("o2/l", "/"),
                                F("r/x", "x"),         F("r/y/z", "z"), END};
    ok(apply(lower) == 0, "lower layer (%s)", err.msg);
    const struct ent upper[] = {F("o/early", "1"),        F("o/sub/new", "n"),
                                F("etc/.wh.f", ""),       F("etc/.wh.d", ""),
                                F("etc/.wh.missing", ""), F("o/.wh..wh..opq", ""),
                                F("o/late", "2"),         D("o2/"),
                                F("o2/.wh..wh..opq", ""), END};
    ok(apply(upper) == 0, "upper layer with whiteouts (%s)", err.msg);
    ok(!exists("etc/f") && !exists("etc/d") && has("etc/keep", "k"),
       ".wh.NAME removes a lower file and a lower directory");
    ok(!exists("etc/.wh.f") && !exists("o/.wh..wh..opq"), "whiteouts are never made");
    ok(children("o") == 3 && has("o/early", "1") && has("o/late", "2") && has("o/sub/new", "n") &&
           !exists("o/sub/old"),
       "opaque: the lower children gone, the layer's own kept, before or after the marker");
    ok(children("o2") == 0 && is_type("o2", S_IFDIR), "opaque on a listed directory empties it");
    ok(st.whiteouts == 5, "whiteouts counted (%u)", st.whiteouts);

    /* a whiteout listed after what the same layer made, for a file and a directory */
    const struct ent same[] = {F("r/x", "new"), F("r/y/w", "w"), F("r/.wh.x", ""), F("r/.wh.y", ""),
                               END};
    ok(apply(same) == 0 && has("r/x", "new") && has("r/y/w", "w") && !exists("r/y/z"),
       "a whiteout after the layer's own entry keeps it, and removes the lower rest (%s)", err.msg);

    /* opaque root */
    const struct ent root_opq[] = {F("top", "t"), F(".wh..wh..opq", ""), END};
    ok(apply(root_opq) == 0 && children("") == 1 && has("top", "t"),
       "an opaque root keeps only the layer's own (%s)", err.msg);
    ok(outside_untouched(), "nothing outside ROOT after whiteouts");

    /* a whiteout cannot reach outside: .wh. of a name through evil -> / */
    fresh();
    const struct ent evil[] = {L("evil", "/"),
                               F("evil/sentinel/.wh.canary", ""),
                               L("esc", "../../.."),
                               F("esc/.wh.sentinel", ""),
                               F("esc/.wh..wh..opq", ""),
                               END};
    ok(apply(evil) == 0 && outside_untouched(), "whiteouts through evil -> / touch nothing (%s)",
       err.msg);
    const struct ent evil2[] = {F("x/../../.wh.sentinel", ""), END};
    ok(apply(evil2) == -EINVAL && outside_untouched(), "a whiteout with '..' refused");

    const struct ent bad[] = {F("d/.wh..", ""), END};
    ok(apply(bad) == -EINVAL, "a whiteout of '.' refused (%s)", err.msg);
}

static void replace(void)
{
    fresh();
    char host_sentinel[400];
    snprintf(host_sentinel, sizeof(host_sentinel), "%s", sentinel);
    const struct ent lower[] = {
        D("x"),    F("x/in", "i"),    F("y", "y"), L("z", host_sentinel), L("w", "../../sentinel"),
        D("keep"), F("keep/in", "i"), END};
    ok(apply(lower) == 0, "lower layer (%s)", err.msg);
    const struct ent upper[] = {F("x", "file now"),
                                D("y"),
                                D("z"),
                                F("z/canary", "mine\n"),
                                F("w", "plain\n"),
                                {.path = "keep", .type = AE_IFDIR, .mode = 0700},
                                END};
    ok(apply(upper) == 0, "upper layer (%s)", err.msg);
    ok(is_type("x", S_IFREG) && has("x", "file now"), "a file replaces a directory");
    ok(is_type("y", S_IFDIR), "a directory replaces a file");
    ok(is_type("z", S_IFDIR) && has("z/canary", "mine\n"), "a directory replaces a symlink");
    ok(is_type("w", S_IFREG) && has("w", "plain\n"), "a file replaces a symlink, not followed");
    ok(is_type("keep", S_IFDIR) && has("keep/in", "i") && mode_of("keep") == 0700,
       "a directory over a directory stays, with its new mode");
    ok(outside_untouched(), "nothing outside ROOT after replacements");

    /* "//" and "./" collapse; the root entry */
    fresh();
    const struct ent dots[] = {{.path = "./", .type = AE_IFDIR, .mode = 0750},
                               F(".//a//b/./c", "abc"),
                               {.path = "././d//e/", .type = AE_IFDIR, .mode = 0700},
                               END};
    ok(apply(dots) == 0 && has("a/b/c", "abc") && mode_of("") == 0750 && mode_of("d/e") == 0700,
       "'.//a//b/./c' is a/b/c, '././d//e/' d/e, './' the root (%s)", err.msg);
    ok(st.entries == 5, "entries: c, e and their parents, not the root (%llu)",
       (unsigned long long)st.entries);
}

static void limits(void)
{
    /* bytes */
    fresh();
    lim.bytes_max = 10;
    const struct ent at[] = {F("a", "12345"), F("b", "67890"), END};
    ok(apply(at) == 0 && st.bytes == 10, "bytes at the limit (%s)", err.msg);
    struct al_layer_stats before = st;
    const struct ent over[] = {F("c", "x"), END};
    ok(apply(over) == -EFBIG && strstr(err.msg, "entry 'c'"), "one byte over refused (%s)",
       err.msg);
    ok(!memcmp(&before, &st, sizeof(st)), "the stats untouched on failure");
    ok(!exists("c"), "nothing written before the check");

    /* entries */
    fresh();
    lim.entries_max = 3;
    const struct ent three[] = {F("a", ""), F("b", ""), F("c", ""), END};
    ok(apply(three) == 0 && st.entries == 3, "entries at the limit (%s)", err.msg);
    const struct ent four[] = {F("d", ""), END};
    ok(apply(four) == -E2BIG && strstr(err.msg, "entry 'd'"),
       "one entry over, across calls, refused (%s)", err.msg);
    fresh();
    lim.entries_max = 3;
    const struct ent parents[] = {F("a/b/c", ""), END};
    ok(apply(parents) == 0 && st.entries == 3, "made parents count (%s)", err.msg);
    fresh();
    lim.entries_max = 2;
    ok(apply(parents) == -E2BIG, "and are refused over the limit (%s)", err.msg);

    /* a sparse GiB: counted at its logical size, written as holes */
    fresh();
    lim.bytes_max = 2ull << 30;
    const struct ent sparse[] = {{.path = "big", .type = AE_IFREG, .sparse = 1ull << 30}, END};
    struct blob b = layer_of(sparse, false);
    ok(b.len < (1 << 20), "the sparse layer is small (%zu bytes)", b.len);
    struct stat s;
    ok(apply_blob(b) == 0 && lstat_rel("big", &s) == 0 && s.st_size == (off_t)(1ull << 30) &&
           st.bytes == 1ull << 30,
       "a sparse 1 GiB file counted at 1 GiB (%s)", err.msg);
    ok(s.st_blocks * 512 < (1 << 20), "and written as holes (%lld blocks)", (long long)s.st_blocks);
    char p[700], buf[8] = {0};
    snprintf(p, sizeof(p), "%s/big", root);
    int fd = open(p, O_RDONLY);
    ok(fd >= 0 && pread(fd, buf, 5, 1 << 29) == 5 && !strcmp(buf, SPARSE_DATA),
       "its data at its offset");
    if (fd >= 0)
        close(fd);
    fresh();
    lim.bytes_max = 1ull << 29;
    ok(apply(sparse) == -EFBIG && strstr(err.msg, "entry 'big'") && !exists("big"),
       "a sparse 1 GiB over a 512 MiB limit refused (%s)", err.msg);
}

static void streams(void)
{
    /* gzip */
    fresh();
    const struct ent v[] = {D("etc"), F("etc/hostname", "box\n"), L("etc/mtab", "/proc/mounts"),
                            END};
    struct blob gz = layer_of(v, true);
    ok(gz.len > 2 && (unsigned char)gz.buf[0] == 0x1f && (unsigned char)gz.buf[1] == 0x8b,
       "a gzip layer");
    ok(apply_blob(gz) == 0 && has("etc/hostname", "box\n") && is_type("etc/mtab", S_IFLNK),
       "applied (%s)", err.msg);

    /* digest over the whole blob, with bytes after the tar's end */
    fresh();
    struct blob b = layer_of(v, false);
    const char tail[] = "trailing bytes after the end-of-archive";
    char *whole = malloc(b.len + sizeof(tail) + (300 << 10));
    memcpy(whole, b.buf, b.len);
    memcpy(whole + b.len, tail, sizeof(tail));
    size_t n = b.len + sizeof(tail);
    /* more than one read's worth of trailing bytes */
    memset(whole + n, 'z', 300 << 10);
    n += 300 << 10;
    free(b.buf);
    char *copy = malloc(n);
    memcpy(copy, whole, n);
    ok(apply_blob((struct blob){copy, n}) == 0 && hex_sha256(whole, n, sha),
       "sha256 of the blob, trailing bytes included (%s)", err.msg);

    /* from the fd's offset on */
    fresh();
    int fd = memfd_create("layer", MFD_CLOEXEC);
    if (fd < 0 || write(fd, "skip", 4) != 4 || write(fd, whole, n) != (ssize_t)n ||
        lseek(fd, 4, SEEK_SET) != 4)
        abort();
    err = (al_error){0};
    ok(al_layer_apply(rootfd, fd, &lim, NULL, NULL, NULL, sha, &err) == 0 &&
           hex_sha256(whole, n, sha),
       "read from the fd's offset, without stats or notes (%s)", err.msg);
    close(fd);
    free(whole);

    /* a cut stream */
    fresh();
    const struct ent big[] = {F("f", "0123456789012345678901234567890123456789"), END};
    b = layer_of(big, false);
    char *data = memmem(b.buf, b.len, "0123456789", 10);
    b.len = data ? (size_t)(data - b.buf) + 20 : 0;
    ok(apply_blob(b) == -EPROTO && strstr(err.msg, "entry 'f'"),
       "a stream cut inside a file refused (%s)", err.msg);
}

int main(void)
{
    snprintf(scratch, sizeof(scratch), "/tmp/test-layers-XXXXXX");
    if (!mkdtemp(scratch))
        return 1;
    snprintf(root, sizeof(root), "%s/root", scratch);
    snprintf(sentinel, sizeof(sentinel), "%s/sentinel", scratch);
    snprintf(canary, sizeof(canary), "%s/canary", sentinel);
    if (mkdir(sentinel, 0755) < 0)
        return 1;
    FILE *f = fopen(canary, "w");
    if (!f)
        return 1;
    fputs("canary\n", f);
    fclose(f);
    struct stat etc_x;
    bool etc_x_before = lstat("/etc/x", &etc_x) == 0;

    if (etc_x_before) {
        ok(false, "/etc/x exists on this host: the escape checks cannot tell");
    } else {
        hostile();
        special();
        whiteouts();
        replace();
        limits();
        streams();
        ok(outside_untouched(), "nothing outside ROOT at the end");
    }

    if (rootfd >= 0)
        close(rootfd);
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", scratch);
    if (system(cmd) != 0)
        ok(false, "scratch dir removed");
    return tap_done();
}

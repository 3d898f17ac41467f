/* Images from what container tools make (al_image_from): a Containerfile built by buildah, an
 * OCI image layout or archive, a `docker save` tarball or a directory tree. Their layers are
 * applied (layers.c) into a tree in a scratch dir of the store, the tree becomes an ext4 root
 * disk (mke2fs -d, qemu-img), and the base image's kernel and initrd boot it. And the other
 * way (al_image_export_base): an image's root disk as a local container image to build FROM. */
#include "layers.h"
#include "tar.h"
#include "vm.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>

/* index.json, manifests and configs are a few KiB; a megabyte is not one of them. */
#define JSON_MAX (1 << 20)
/* Layers of one image: Docker's own limit is 127. */
#define LAYERS_MAX 128
/* Files kept from an image archive: its layers, manifests, configs, index, a few over. */
#define ARCHIVE_MEMBERS_MAX (4 * LAYERS_MAX + 64)
/* The configuration's defaults: bounded, they go into every run of the image's sessions. */
#define CONFIG_ENV_MAX 64
#define CONFIG_STR_MAX 1024
#define CONFIG_CMD_MAX 64
/* The file system's apparent size: at least this (the qcow2 stores only what is written), and
 * room over the data for the guest's own writes and ext4's metadata. */
#define FS_SIZE_MIN (4ull << 30)
#define FS_ROOM (2ull << 30)
/* Helpers that read what the image holds run bounded, like qemu-img on an imported disk. */
static const struct al_spawn_limits MKFS_LIMITS = {.cpu_s = 1800, .as_bytes = 4ul << 30};
/* Pushing the built image out of buildah's store, removing its tag: seconds. */
#define PUSH_TIMEOUT_S 600

AL_DEFINE_CLEANUP(rmtree_scratch, char *, al_rmtree)
AL_DEFINE_CLEANUP(evp_free, EVP_MD_CTX *, EVP_MD_CTX_free)

struct from_job {
    const al_image_from_opts *o;
    char scratch[AL_PATH_MAX]; /* STORE/.NAME.from-PID */
    int tree_fd;               /* tree: the root file system being made; -1 until made */
    char tree[AL_PATH_MAX];    /* scratch/tree, or SHM/airlock-tree.XXXXXX/tree */
    char shm[AL_PATH_MAX];     /* the tmpfs dir holding the tree, "" when on disk */
    struct al_layer_limits lim;
    struct al_layer_stats st;
    const char *kind; /* the source's kind, as al_image.source has it */
    char digest[80];  /* of the image manifest (OCI) or config (docker) */
    cJSON *config;    /* the image configuration's "config" object, in config_doc */
    cJSON *config_doc;
    unsigned layer; /* the layer being applied, from 1, for messages */
    unsigned notes; /* lines logged about entries */
};

static void job_log(struct from_job *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void job_log(struct from_job *j, const char *fmt, ...)
{
    if (j->o->log_fd <= 0)
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    dprintf(j->o->log_fd, "airlock: %s\n", line);
}

/* Every neutralised entry is logged, up to a bound (a layer of a million devices must not
 * flood the log); the totals come at the end. */
#define NOTES_MAX 200
static void layer_note(void *ctx, const char *line)
{
    struct from_job *j = ctx;
    if (j->notes++ < NOTES_MAX)
        job_log(j, "layer %u: %s", j->layer, line);
}

/* ---- reading the source's metadata ---- */

/* A small file beneath dirfd (no symlink on the way), NUL-terminated, with its SHA-256. */
static char *read_small(int dirfd, const char *rel, size_t max, char sha[65], al_error *err)
{
    _cleanup_close_ int fd = al_beneath_open(dirfd, rel, O_RDONLY | O_NOFOLLOW);
    if (fd < 0) {
        al_err(err, fd, "cannot open '%s' of the image: %s", rel, strerror(-fd));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > max) {
        al_err(err, -EINVAL, "'%s' of the image is not a file of at most %zu bytes", rel, max);
        return NULL;
    }
    _cleanup_free_ char *buf = malloc((size_t)st.st_size + 1);
    if (!buf) {
        al_err(err, -ENOMEM, "out of memory");
        return NULL;
    }
    size_t have = 0;
    while (have < (size_t)st.st_size) {
        ssize_t n = read(fd, buf + have, (size_t)st.st_size - have);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            al_err(err, -EIO, "cannot read '%s' of the image", rel);
            return NULL;
        }
        have += (size_t)n;
    }
    buf[have] = '\0';
    if (sha) {
        unsigned char d[32];
        EVP_Digest(buf, have, d, NULL, EVP_sha256(), NULL);
        al_hexify(d, 32, sha);
    }
    return TAKE_PTR(buf);
}

/* "sha256:HEX" with 64 lowercase hex digits: the only digests read (a blob's name is its hex). */
static const char *digest_hex(const cJSON *digest)
{
    if (!cJSON_IsString(digest) || strncmp(digest->valuestring, "sha256:", 7) != 0)
        return NULL;
    const char *h = digest->valuestring + 7;
    return strlen(h) == 64 && strspn(h, "0123456789abcdef") == 64 ? h : NULL;
}

/* A JSON blob of an OCI layout, checked against its digest. */
static cJSON *read_blob_json(int layout_fd, const cJSON *digest, al_error *err)
{
    const char *hex = digest_hex(digest);
    if (!hex) {
        al_err(err, -EINVAL, "the image names a digest that is not sha256:HEX");
        return NULL;
    }
    char rel[128], sha[65];
    snprintf(rel, sizeof(rel), "blobs/sha256/%s", hex);
    _cleanup_free_ char *text = read_small(layout_fd, rel, JSON_MAX, sha, err);
    if (!text)
        return NULL;
    if (strcmp(sha, hex) != 0) {
        al_err(err, -EINVAL, "blob sha256:%.12s... does not match its digest", hex);
        return NULL;
    }
    cJSON *j = cJSON_Parse(text);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        al_err(err, -EINVAL, "blob sha256:%.12s... is not a JSON object", hex);
        return NULL;
    }
    return j;
}

static bool media_is(const cJSON *desc, const char *a, const char *b)
{
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(desc, "mediaType");
    return cJSON_IsString(m) && (!strcmp(m->valuestring, a) || (b && !strcmp(m->valuestring, b)));
}

#define OCI_MANIFEST "application/vnd.oci.image.manifest.v1+json"
#define DOCKER_MANIFEST "application/vnd.docker.distribution.manifest.v2+json"
#define OCI_INDEX "application/vnd.oci.image.index.v1+json"
#define DOCKER_LIST "application/vnd.docker.distribution.manifest.list.v2+json"

/* The descriptor of the image manifest in an index: the first one for linux/amd64 or with no
 * platform; a nested index is followed once. */
static const cJSON *pick_manifest(const cJSON *index)
{
    const cJSON *d;
    cJSON_ArrayForEach(d, cJSON_GetObjectItemCaseSensitive(index, "manifests"))
    {
        const cJSON *plat = cJSON_GetObjectItemCaseSensitive(d, "platform");
        const cJSON *arch = cJSON_GetObjectItemCaseSensitive(plat, "architecture");
        const cJSON *os = cJSON_GetObjectItemCaseSensitive(plat, "os");
        if (plat && ((cJSON_IsString(arch) && strcmp(arch->valuestring, "amd64")) ||
                     (cJSON_IsString(os) && strcmp(os->valuestring, "linux"))))
            continue;
        if (media_is(d, OCI_MANIFEST, DOCKER_MANIFEST) || media_is(d, OCI_INDEX, DOCKER_LIST))
            return d;
    }
    return NULL;
}

/* ---- applying layers ---- */

/* A tree is written once, read once by mke2fs and removed: in RAM (tmpfs) that is several times
 * faster than on the disk, which writes it back meanwhile. One that fits well goes there. */
/* Makes the tree, in RAM when expected bytes (0: not known) leave room twice over in both the
 * tmpfs and the memory available, else in the scratch dir. */
static int tree_make(struct from_job *j, uint64_t expected, al_error *err)
{
    if (j->tree_fd >= 0)
        return 0;
    bool ram = al_shm_mkdtemp("airlock-tree", expected, j->shm, sizeof(j->shm)) == 0;
    if (al_pathf(j->tree, sizeof(j->tree), "%s/tree", ram ? j->shm : j->scratch) < 0)
        return al_err(err, -ENAMETOOLONG, "image path too long");
    if (mkdir(j->tree, 0755) < 0 ||
        (j->tree_fd = open(j->tree, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
        return al_err(err, -errno, "cannot create '%s': %s", j->tree, strerror(errno));
    return 0;
}

/* What a layer descriptor's blob holds once unpacked, roughly: compressed ones four times. */
static uint64_t layer_estimate(const cJSON *desc)
{
    const cJSON *size = cJSON_GetObjectItemCaseSensitive(desc, "size");
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(desc, "mediaType");
    uint64_t n = cJSON_IsNumber(size) && size->valuedouble > 0 ? (uint64_t)size->valuedouble : 0;
    bool packed =
        cJSON_IsString(mt) && (strstr(mt->valuestring, "gzip") || strstr(mt->valuestring, "zstd"));
    return packed ? n * 4 : n + n / 8;
}

static int apply_layer_fd(struct from_job *j, int fd, const char *want_hex, al_error *err)
{
    char sha[65];
    al_error e = {0};
    int r =
        al_layer_apply(j->tree_fd, fd, &j->lim, &j->st, layer_note, j, want_hex ? sha : NULL, &e);
    if (r < 0)
        return al_err(err, r, "layer %u: %s", j->layer, e.msg);
    if (want_hex && strcmp(sha, want_hex) != 0)
        return al_err(err, -EINVAL,
                      "layer %u: its content does not match its digest sha256:%.12s...", j->layer,
                      want_hex);
    return 0;
}

/* The layer file rel beneath dirfd (no symlink on the way), whose SHA-256 must be want_hex. */
static int apply_layer_at(struct from_job *j, int dirfd, const char *rel, const char *want_hex,
                          al_error *err)
{
    _cleanup_close_ int fd = al_beneath_open(dirfd, rel, O_RDONLY | O_NOFOLLOW);
    if (fd < 0)
        return al_err(err, fd, "layer %u: cannot open %s: %s", j->layer, rel, strerror(-fd));
    return apply_layer_fd(j, fd, want_hex, err);
}

/* The image configuration (a blob or a docker file), kept for its defaults. */
static int take_config(struct from_job *j, cJSON *doc, al_error *err)
{
    if (!cJSON_IsObject(doc)) {
        cJSON_Delete(doc);
        return al_err(err, -EINVAL, "the image's configuration is not a JSON object");
    }
    const cJSON *os = cJSON_GetObjectItemCaseSensitive(doc, "os");
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(doc, "architecture");
    if ((cJSON_IsString(os) && strcmp(os->valuestring, "linux")) ||
        (cJSON_IsString(arch) && strcmp(arch->valuestring, "amd64"))) {
        al_err(err, -EINVAL, "the image is for %s/%s; sessions run linux/amd64",
               cJSON_IsString(os) ? os->valuestring : "?",
               cJSON_IsString(arch) ? arch->valuestring : "?");
        cJSON_Delete(doc);
        return err->code;
    }
    j->config_doc = doc;
    j->config = cJSON_GetObjectItemCaseSensitive(doc, "config");
    return 0;
}

static int from_layout(struct from_job *j, int layout_fd, al_error *err)
{
    _cleanup_free_ char *text = read_small(layout_fd, "index.json", JSON_MAX, NULL, err);
    if (!text)
        return err->code;
    _cleanup_cjson_ cJSON *index = cJSON_Parse(text);
    const cJSON *desc = pick_manifest(index);
    _cleanup_cjson_ cJSON *nested = NULL;
    if (desc && media_is(desc, OCI_INDEX, DOCKER_LIST)) {
        nested = read_blob_json(layout_fd, cJSON_GetObjectItemCaseSensitive(desc, "digest"), err);
        if (!nested)
            return err->code;
        desc = pick_manifest(nested);
        if (desc && !media_is(desc, OCI_MANIFEST, DOCKER_MANIFEST))
            desc = NULL;
    }
    if (!desc)
        return al_err(err, -EINVAL, "the image's index.json names no linux/amd64 image manifest");
    const cJSON *mdigest = cJSON_GetObjectItemCaseSensitive(desc, "digest");
    _cleanup_cjson_ cJSON *manifest = read_blob_json(layout_fd, mdigest, err);
    if (!manifest)
        return err->code;
    snprintf(j->digest, sizeof(j->digest), "%s", mdigest->valuestring);
    const cJSON *cdesc = cJSON_GetObjectItemCaseSensitive(manifest, "config");
    cJSON *config =
        read_blob_json(layout_fd, cJSON_GetObjectItemCaseSensitive(cdesc, "digest"), err);
    if (!config)
        return err->code;
    int r = take_config(j, config, err);
    if (r < 0)
        return r;
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(manifest, "layers");
    if (!cJSON_IsArray(layers) || cJSON_GetArraySize(layers) > LAYERS_MAX)
        return al_err(err, -EINVAL, "the image manifest has no list of at most %d layers",
                      LAYERS_MAX);
    const cJSON *l;
    uint64_t expected = 0;
    cJSON_ArrayForEach(l, layers)
    {
        expected += layer_estimate(l);
    }
    if ((r = tree_make(j, expected, err)) < 0)
        return r;
    cJSON_ArrayForEach(l, layers)
    {
        j->layer++;
        const char *hex = digest_hex(cJSON_GetObjectItemCaseSensitive(l, "digest"));
        if (!hex)
            return al_err(err, -EINVAL, "layer %u: no sha256 digest", j->layer);
        /* Foreign layers (Windows' base layers) live elsewhere: not for a Linux guest. */
        const cJSON *urls = cJSON_GetObjectItemCaseSensitive(l, "urls");
        if (urls)
            return al_err(err, -EINVAL, "layer %u: a foreign layer (fetched from elsewhere)",
                          j->layer);
        char rel[128];
        snprintf(rel, sizeof(rel), "blobs/sha256/%s", hex);
        r = apply_layer_at(j, layout_fd, rel, hex, err);
        if (r < 0)
            return r;
    }
    return 0;
}

/* A path docker's manifest.json names, inside the archive's directory. */
static int docker_path(const cJSON *v, char *out, size_t len)
{
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= len)
        return -EINVAL;
    snprintf(out, len, "%s", v->valuestring);
    return al_tree_path_check(out) < 0 || !out[0] ? -EINVAL : 0;
}

static int from_docker(struct from_job *j, int dir_fd, al_error *err)
{
    _cleanup_free_ char *text = read_small(dir_fd, "manifest.json", JSON_MAX, NULL, err);
    if (!text)
        return err->code;
    _cleanup_cjson_ cJSON *list = cJSON_Parse(text);
    const cJSON *m = cJSON_GetArrayItem(list, 0);
    char rel[512], sha[65];
    if (!cJSON_IsObject(m) ||
        docker_path(cJSON_GetObjectItemCaseSensitive(m, "Config"), rel, sizeof(rel)) < 0)
        return al_err(err, -EINVAL, "the archive's manifest.json names no image configuration");
    _cleanup_free_ char *ctext = read_small(dir_fd, rel, JSON_MAX, sha, err);
    if (!ctext)
        return err->code;
    snprintf(j->digest, sizeof(j->digest), "sha256:%s", sha);
    int r = take_config(j, cJSON_Parse(ctext), err);
    if (r < 0)
        return r;
    /* docker save's layers are the uncompressed tars the config's diff_ids are digests of. */
    const cJSON *rootfs = cJSON_GetObjectItemCaseSensitive(j->config_doc, "rootfs");
    const cJSON *diff_ids = cJSON_GetObjectItemCaseSensitive(rootfs, "diff_ids");
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(m, "Layers");
    if (!cJSON_IsArray(layers) || cJSON_GetArraySize(layers) > LAYERS_MAX ||
        cJSON_GetArraySize(layers) != cJSON_GetArraySize(diff_ids))
        return al_err(err, -EINVAL,
                      "the archive's layers do not match its configuration's diff_ids (or are "
                      "more than %d)",
                      LAYERS_MAX);
    uint64_t expected = 0;
    for (int i = 0; i < cJSON_GetArraySize(layers); i++) {
        _cleanup_close_ int fd = docker_path(cJSON_GetArrayItem(layers, i), rel, sizeof(rel)) < 0
                                     ? -1
                                     : al_beneath_open(dir_fd, rel, O_RDONLY | O_NOFOLLOW);
        struct stat st;
        if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode))
            expected += (uint64_t)st.st_size + (uint64_t)st.st_size / 8;
    }
    if ((r = tree_make(j, expected, err)) < 0)
        return r;
    for (int i = 0; i < cJSON_GetArraySize(layers); i++) {
        j->layer++;
        if (docker_path(cJSON_GetArrayItem(layers, i), rel, sizeof(rel)) < 0)
            return al_err(err, -EINVAL, "layer %u: not a path inside the archive", j->layer);
        const char *hex = digest_hex(cJSON_GetArrayItem(diff_ids, i));
        if (!hex)
            return al_err(err, -EINVAL, "layer %u: no sha256 diff_id", j->layer);
        r = apply_layer_at(j, dir_fd, rel, hex, err);
        if (r < 0)
            return r;
    }
    return 0;
}

/* A directory tree: read by tar as a layer of its own (the same checks: devices dropped,
 * set-id bits cleared), so nothing of the host's is copied that a layer could not carry. */
static int from_tree(struct from_job *j, const char *dir, al_error *err)
{
    int made = tree_make(j, 0, err);
    if (made < 0)
        return made;
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0)
        return al_err(err, -errno, "cannot make a pipe: %s", strerror(errno));
    _cleanup_close_ int rd = p[0];
    _cleanup_close_ int wr = p[1];
    _cleanup_close_ int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
    int log = j->o->log_fd > 0 ? j->o->log_fd : null;
    const char *argv[] = {"tar", "--numeric-owner", "-C", dir, "-cf", "-", ".", NULL};
    pid_t pid;
    int r = al_spawn_start(argv, -1, wr, log, &pid);
    if (r < 0)
        return al_err(err, r, "cannot run tar: %s", strerror(-r));
    al_closep(&wr);
    j->layer = 1;
    r = apply_layer_fd(j, rd, NULL, err);
    al_closep(&rd); /* tar, if stopped halfway, gets EPIPE */
    int st = 0;
    int w = al_spawn_reap(pid, 0, &st);
    if (r < 0)
        return r;
    if (w < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        return al_err(err, -EIO, "tar could not read all of '%s' (see its messages)", dir);
    return 0;
}

/* ---- archives: the members the formats use, copied into scratch/src ---- */

/* A blob's file name: its digest in hex, 32 to 128 digits. */
static bool blob_name(const char *p)
{
    size_t len = strlen(p);
    return strspn(p, "0123456789abcdef") == len && len >= 32 && len <= 128;
}

/* A name of the OCI layout or of docker save's (p checked by al_tree_path_check): the only
 * members an image archive has, and the only ones taken from it. */
static bool member_ok(const char *p)
{
    static const char *const top[] = {"oci-layout",   "index.json", "manifest.json",
                                      "repositories", "blobs",      NULL};
    for (const char *const *t = top; *t; t++)
        if (!strcmp(p, *t))
            return true;
    if (!strncmp(p, "blobs/", 6)) { /* blobs/ALG[/HEX] */
        const char *alg = p + 6;
        size_t an = strcspn(alg, "/");
        if (an == 0 || an > 16 || strspn(alg, "abcdefghijklmnopqrstuvwxyz0123456789") < an)
            return false;
        return !alg[an] || blob_name(alg + an + 1);
    }
    size_t n = strspn(p, "0123456789abcdef");
    if (n != 64) /* docker: HEX, HEX.json, HEX.tar, HEX/{layer.tar,json,VERSION} */
        return false;
    const char *rest = p + n;
    return !*rest || !strcmp(rest, ".json") || !strcmp(rest, ".tar") ||
           !strcmp(rest, "/layer.tar") || !strcmp(rest, "/json") || !strcmp(rest, "/VERSION");
}

/* The tar archive at path opened for reading into *out (built-in filters only: no external
 * programs on an archive from anywhere). */
static int tar_open(const char *path, struct archive **out, al_error *err)
{
    struct archive *a = archive_read_new();
    if (!a)
        return al_err(err, -ENOMEM, "out of memory");
    archive_read_support_filter_gzip(a);
    archive_read_support_filter_bzip2(a);
    archive_read_support_filter_xz(a);
    archive_read_support_filter_zstd(a);
    archive_read_support_format_tar(a);
    if (archive_read_open_filename(a, path, 1 << 16) != ARCHIVE_OK) {
        int r = al_err(err, -EINVAL, "cannot read '%s': %s", path, archive_error_string(a));
        archive_read_free(a);
        return r;
    }
    *out = a;
    return 0;
}

/* The member's name, checked, in rel: 1 a name of the image layouts, 0 the archive's top
 * ("./"), -1 a name no image has. */
static int member_rel(struct archive_entry *e, char rel[static AL_TREE_PATH_MAX + 1])
{
    const char *name = archive_entry_pathname(e);
    if (!name || strlen(name) > AL_TREE_PATH_MAX)
        return -1;
    snprintf(rel, AL_TREE_PATH_MAX + 1, "%s", name);
    if (al_tree_path_check(rel) < 0)
        return -1;
    return !rel[0] ? 0 : member_ok(rel) ? 1 : -1;
}

/* Whether the tar archive at path is an image (only names of the layouts: 1, and unpack_archive
 * then says which, or that it is neither) or a root file system's tar, as `docker export` writes
 * (0). Stops at the first name no image has. */
static int archive_is_image(const char *path, al_error *err)
{
    struct archive *a;
    int r = tar_open(path, &a, err);
    if (r < 0)
        return r;
    struct archive_entry *e;
    int ar;
    char rel[AL_TREE_PATH_MAX + 1];
    while ((ar = archive_read_next_header(a, &e)) == ARCHIVE_OK)
        if (member_rel(e, rel) < 0)
            goto out; /* no image names such a member: a root file system's */
    if (ar != ARCHIVE_EOF)
        r = al_err(err, -EINVAL, "'%s' is not a readable tar archive: %s", path,
                   archive_error_string(a));
    else
        r = 1;
out:
    archive_read_free(a);
    return r;
}

static int mkdirs_beneath(int dirfd, const char *rel)
{
    char path[AL_TREE_PATH_MAX + 1];
    snprintf(path, sizeof(path), "%s", rel);
    for (char *s = strchr(path, '/'); s; s = strchr(s + 1, '/')) {
        *s = '\0';
        if (mkdirat(dirfd, path, 0700) < 0 && errno != EEXIST)
            return -errno;
        *s = '/';
    }
    return 0;
}

static int unpack_archive(struct from_job *j, const char *path, int src_fd, al_error *err)
{
    struct archive *a;
    int r = tar_open(path, &a, err);
    if (r < 0)
        return r;
    uint64_t total = 0, bound = j->lim.bytes_max + ((uint64_t)AL_LAYER_ENTRIES_MAX << 10);
    unsigned kept = 0;
    struct archive_entry *e;
    int ar;
    char rel[AL_TREE_PATH_MAX + 1];
    while ((ar = archive_read_next_header(a, &e)) == ARCHIVE_OK) {
        if (member_rel(e, rel) <= 0 || archive_entry_filetype(e) != AE_IFREG) {
            if (archive_entry_filetype(e) != AE_IFDIR)
                job_log(j, "archive member '%.200s' left out (not a file of an image layout)",
                        archive_entry_pathname(e) ? archive_entry_pathname(e) : "");
            continue;
        }
        /* A layout is an index, a manifest, a config and its layers: a flood of members is
         * not one (each would be a file in the scratch dir). */
        if (++kept > ARCHIVE_MEMBERS_MAX) {
            r = al_err(err, -E2BIG, "'%s' holds more than %d files: not an image archive", path,
                       ARCHIVE_MEMBERS_MAX);
            goto out;
        }
        int64_t size = archive_entry_size(e);
        if (size < 0 || (total += (uint64_t)size) > bound) {
            r = al_err(err, -EFBIG, "'%s' holds more than the image's size limit", path);
            goto out;
        }
        _cleanup_close_ int fd = -1;
        if (mkdirs_beneath(src_fd, rel) < 0 ||
            (fd = openat(src_fd, rel, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600)) <
                0) {
            r = al_err(err, -errno, "cannot unpack member '%s' of '%s': %s", rel, path,
                       strerror(errno));
            goto out;
        }
        if (archive_read_data_into_fd(a, fd) != ARCHIVE_OK) {
            r = al_err(err, -EIO, "cannot unpack member '%s' of '%s': %s", rel, path,
                       archive_error_string(a));
            goto out;
        }
    }
    if (ar != ARCHIVE_EOF)
        r = al_err(err, -EINVAL, "'%s' is not a readable tar archive: %s", path,
                   archive_error_string(a));
out:
    archive_read_free(a);
    return r;
}

/* ---- Containerfiles ---- */

/* buildah's default OCI runtime (crun) refuses a host whose cgroups are not cgroup v2 alone;
 * runc runs there. $AIRLOCK_BUILDAH_RUNTIME chooses. */
static const char *build_runtime(void)
{
    const char *env = getenv("AIRLOCK_BUILDAH_RUNTIME");
    if (env && *env)
        return env;
    struct statfs fs;
    if (statfs("/sys/fs/cgroup", &fs) == 0 && fs.f_type == CGROUP2_SUPER_MAGIC)
        return NULL;
    return access("/usr/sbin/runc", X_OK) == 0 || access("/usr/bin/runc", X_OK) == 0 ? "runc"
                                                                                     : NULL;
}

static int run_helper(struct from_job *j, const char *const *argv, unsigned timeout_s,
                      const char *what, al_error *err)
{
    _cleanup_close_ int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
    int log = j->o->log_fd > 0 ? j->o->log_fd : null;
    pid_t pid;
    int r = al_spawn_start(argv, -1, log, log, &pid);
    if (r < 0)
        return al_err(err, r, "cannot run %s: %s", argv[0], strerror(-r));
    int st = 0;
    r = al_spawn_reap(pid, timeout_s, &st);
    if (r == -ETIMEDOUT)
        return al_err(err, r, "%s ran past its %u s limit and was stopped", what, timeout_s);
    if (r < 0)
        return al_err(err, r, "cannot wait for %s: %s", argv[0], strerror(-r));
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        return al_err(err, -EIO, "%s failed (%s %d; its output is in the build log)", what,
                      WIFEXITED(st) ? "status" : "signal",
                      WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    return 0;
}

/* The first line argv prints (bounded), into out; "" when it fails. */
static void capture_line(struct from_job *j, const char *const *argv, char *out, size_t len)
{
    out[0] = '\0';
    char path[AL_PATH_MAX];
    if (al_pathf(path, sizeof(path), "%s/captured", j->scratch) < 0)
        return;
    _cleanup_close_ int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    _cleanup_close_ int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
    pid_t pid;
    int st = 0;
    if (fd < 0 || null < 0 || al_spawn_start(argv, -1, fd, null, &pid) < 0)
        return;
    if (al_spawn_reap(pid, PUSH_TIMEOUT_S, &st) == 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0) {
        ssize_t n = pread(fd, out, len - 1, 0);
        out[n > 0 ? n : 0] = '\0';
        out[strcspn(out, "\n")] = '\0';
    }
    unlink(path);
}

/* What --kernels installs: the python kernel's interpreter and IPython (the shell kernel needs
 * bash, which Debian's images have). */
static const char KERNELS_SCRIPT[] =
    "command -v apt-get >/dev/null || exit 100; "
    "export DEBIAN_FRONTEND=noninteractive; apt-get update -q && "
    "apt-get install -y -q --no-install-recommends python3 python3-ipython bash && "
    "rm -rf /var/lib/apt/lists/*";

/* The image ref (a buildah transport: "oci:DIR", "oci-archive:FILE", "docker-archive:FILE" or a
 * tag) with the kernels' packages added in a buildah container (its RUN's confinement, under
 * the build's deadline), written as an OCI layout to out. */
static int add_kernels(struct from_job *j, const char *ref, const char *out, al_error *err)
{
    char dest[AL_PATH_MAX + 8], ctr[160];
    if (al_pathf(dest, sizeof(dest), "oci:%s", out) < 0)
        return al_err(err, -ENAMETOOLONG, "path too long");
    snprintf(ctr, sizeof(ctr), "airlock-kernels-%ld-%s", (long)getpid(), j->o->name);
    unsigned timeout = j->o->timeout_s ? j->o->timeout_s : AL_IMAGE_FROM_TIMEOUT_DEFAULT_S;
    const char *runtime = build_runtime();
    const char *from[] = {"buildah", "from", "--quiet", "--name", ctr, ref, NULL};
    job_log(j, "adding python3 and IPython for the language kernels (apt-get, limit %u s)",
            timeout);
    int r = run_helper(j, from, PUSH_TIMEOUT_S, "buildah from", err);
    if (r < 0)
        return r;
    /* An archive or layout buildah read stays in its store, untagged: its id, to remove it
     * after (a tag, the caller removes). */
    char image_id[80] = "";
    bool pulled = strncmp(ref, "localhost/", 10) != 0;
    if (pulled) {
        const char *inspect[] = {"buildah", "inspect", "--format", "{{.FromImageID}}", ctr, NULL};
        capture_line(j, inspect, image_id, sizeof(image_id));
    }
    const char *run[10];
    int n = 0;
    run[n++] = "buildah";
    run[n++] = "run";
    if (runtime) {
        run[n++] = "--runtime";
        run[n++] = runtime;
    }
    run[n++] = ctr;
    run[n++] = "--";
    run[n++] = "sh";
    run[n++] = "-c";
    run[n++] = KERNELS_SCRIPT;
    run[n] = NULL;
    al_error why = {0};
    r = run_helper(j, run, timeout, "adding the kernels' packages", &why);
    if (r < 0 && r != -EIO)
        r = al_err(err, r, "%s", why.msg);
    else if (r < 0)
        r = al_err(err, -EIO,
                   "cannot add python3 and IPython: the image has no apt-get, or it failed (see "
                   "the build log); build it without --kernels and see which languages it has");
    const char *commit[] = {"buildah", "commit", "--quiet", "--rm", "--disable-compression",
                            ctr,       dest,     NULL};
    const char *rm[] = {"buildah", "rm", ctr, NULL};
    al_error ignored = {0};
    if (r == 0)
        r = run_helper(j, commit, PUSH_TIMEOUT_S, "buildah commit", err);
    else
        run_helper(j, rm, PUSH_TIMEOUT_S, "buildah rm", &ignored);
    const char *rmi[] = {"buildah", "rmi", image_id, NULL};
    if (image_id[0] && strspn(image_id, "0123456789abcdef") == strlen(image_id))
        run_helper(j, rmi, PUSH_TIMEOUT_S, "buildah rmi", &ignored);
    return r;
}

/* A Containerfile is a few KiB; reading it only to find its FROMs. */
#define CONTAINERFILE_MAX (1 << 20)

/* The FROMs of file that name an airlock image ("airlock/NAME", "localhost/airlock/NAME",
 * ":latest" or no tag) missing from the container store are exported from the image store
 * first (al_image_export_base), so that FROM airlock/debian works on the first try. */
static int export_missing_bases(struct from_job *j, const char *file, al_error *err)
{
    FILE *f = fopen(file, "re");
    if (!f)
        return al_err(err, -errno, "cannot read '%s': %s", file, strerror(errno));
    char line[1024];
    size_t total = 0;
    int r = 0;
    while (r == 0 && fgets(line, sizeof(line), f) && (total += strlen(line)) < CONTAINERFILE_MAX) {
        char *w = line + strspn(line, " \t");
        if (strncasecmp(w, "FROM", 4) != 0 || !strchr(" \t", w[4]))
            continue;
        char *ref = NULL;
        for (char *t = strtok(w + 4, " \t\r\n"); t && !ref; t = strtok(NULL, " \t\r\n"))
            if (t[0] != '-') /* --platform=... */
                ref = t;
        if (!ref)
            continue;
        const char *name = !strncmp(ref, "localhost/", 10) ? ref + 10 : ref;
        if (strncmp(name, "airlock/", 8) != 0)
            continue;
        char image[64];
        snprintf(image, sizeof(image), "%.*s", (int)strcspn(name + 8, ":@"), name + 8);
        const char *tag = name + 8 + strlen(image);
        if ((*tag && strcmp(tag, ":latest")) || !al_image_name_ok(image))
            continue;
        const char *exists[] = {"podman", "image", "exists", ref, NULL};
        al_error missing = {0};
        if (run_helper(j, exists, PUSH_TIMEOUT_S, "podman image exists", &missing) == 0)
            continue;
        job_log(j, "FROM %s: not in the container store; exporting image '%s' first", ref, image);
        al_image_export_opts eo = AL_IMAGE_EXPORT_OPTS_INIT;
        eo.image = image;
        eo.ref = ref;
        eo.log_fd = j->o->log_fd;
        r = al_image_export_base(&eo, err);
    }
    fclose(f);
    return r;
}

static int from_containerfile(struct from_job *j, const char *file, const char *src, al_error *err)
{
    /* buildah reads copies, checked (buildctx.c): never the user's files. */
    char given_ctx[AL_PATH_MAX], ctx[AL_PATH_MAX], checked[AL_PATH_MAX], tag[128],
        dest[AL_PATH_MAX + 8];
    if (j->o->context) {
        if (!realpath(j->o->context, given_ctx))
            return al_err(err, -errno, "cannot find the build context '%s': %s", j->o->context,
                          strerror(errno));
    } else {
        if (al_pathf(given_ctx, sizeof(given_ctx), "%s", file) < 0)
            return al_err(err, -ENAMETOOLONG, "path too long");
        char *slash = strrchr(given_ctx, '/');
        if (slash)
            *(slash == given_ctx ? slash + 1 : slash) = '\0';
        else
            snprintf(given_ctx, sizeof(given_ctx), ".");
    }
    if (al_pathf(ctx, sizeof(ctx), "%s/context", j->scratch) < 0 ||
        al_pathf(checked, sizeof(checked), "%s/Containerfile", j->scratch) < 0)
        return al_err(err, -ENAMETOOLONG, "path too long");
    int r0 = al_build_check_containerfile(file, checked, err);
    if (r0 == 0)
        r0 = al_build_copy_context(given_ctx, ctx, j->lim.bytes_max, j->o->log_fd, err);
    if (r0 == 0)
        r0 = export_missing_bases(j, checked, err);
    if (r0 < 0)
        return r0;
    /* A tag of this build only, removed once the image is out of buildah's store. */
    snprintf(tag, sizeof(tag), "localhost/airlock-build:b%ld-%s", (long)getpid(), j->o->name);
    if (al_pathf(dest, sizeof(dest), "oci:%s", src) < 0)
        return al_err(err, -ENAMETOOLONG, "path too long");
    const char *runtime = build_runtime();
    unsigned timeout = j->o->timeout_s ? j->o->timeout_s : AL_IMAGE_FROM_TIMEOUT_DEFAULT_S;
    const char *bud[16];
    int n = 0;
    bud[n++] = "buildah";
    bud[n++] = "bud";
    if (runtime) {
        bud[n++] = "--runtime";
        bud[n++] = runtime;
    }
    bud[n++] = "-f";
    bud[n++] = checked;
    bud[n++] = "-t";
    bud[n++] = tag;
    bud[n++] = ctx;
    bud[n] = NULL;
    job_log(j, "building %s with buildah%s%s (limit %u s)", file, runtime ? " --runtime " : "",
            runtime ? runtime : "", timeout);
    int r = run_helper(j, bud, timeout, "the build", err);
    /* The copies are no part of the image. */
    al_rmtree(ctx);
    unlink(checked);
    if (r < 0)
        return r;
    /* Uncompressed: the layers are read once, right here. */
    if (j->o->kernels)
        r = add_kernels(j, tag, src, err);
    else {
        const char *push[] = {"buildah", "push", "--quiet", "--disable-compression",
                              tag,       dest,   NULL};
        r = run_helper(j, push, PUSH_TIMEOUT_S, "buildah push", err);
    }
    const char *rmi[] = {"buildah", "rmi", tag, NULL};
    al_error ignored = {0};
    run_helper(j, rmi, PUSH_TIMEOUT_S, "buildah rmi", &ignored);
    return r;
}

/* ---- what the source is ---- */

static bool is_archive(const char *path)
{
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    unsigned char b[512];
    ssize_t n = fd < 0 ? -1 : pread(fd, b, sizeof(b), 0);
    if (n < 6)
        return false;
    if ((b[0] == 0x1f && b[1] == 0x8b) || !memcmp(b, "\x28\xb5\x2f\xfd", 4) ||
        !memcmp(b,
                "\xfd"
                "7zXZ",
                6))
        return true;
    return n == 512 && !memcmp(b + 257, "ustar", 5);
}

/* --kernels on an image buildah reads (transport:path): the packages added into a layout of
 * its own (src/kernels), which is then read as any layout. The digest stays the source's. */
static int with_kernels(struct from_job *j, const char *transport, const char *path,
                        const char *src, al_error *err)
{
    char ref[AL_PATH_MAX + 32], out[AL_PATH_MAX];
    if (al_pathf(ref, sizeof(ref), "%s:%s", transport, path) < 0 ||
        al_pathf(out, sizeof(out), "%s.kernels", src) < 0)
        return al_err(err, -ENAMETOOLONG, "path too long");
    int r = add_kernels(j, ref, out, err);
    if (r < 0)
        return r;
    _cleanup_close_ int fd = open(out, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return al_err(err, -errno, "buildah wrote no image layout: %s", strerror(errno));
    char digest[sizeof(j->digest)];
    snprintf(digest, sizeof(digest), "%s", j->digest);
    r = from_layout(j, fd, err);
    if (digest[0])
        snprintf(j->digest, sizeof(j->digest), "%s", digest);
    return r;
}

static int read_source(struct from_job *j, al_error *err)
{
    const char *from = j->o->from;
    char src[AL_PATH_MAX], abs[AL_PATH_MAX];
    if (!realpath(from, abs))
        return al_err(err, -errno, "cannot find '%s': %s", from, strerror(errno));
    if (al_pathf(src, sizeof(src), "%s/src", j->scratch) < 0)
        return al_err(err, -ENAMETOOLONG, "path too long");
    struct stat st;
    if (stat(abs, &st) < 0)
        return al_err(err, -errno, "cannot read '%s': %s", from, strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        _cleanup_close_ int dfd = open(abs, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
            return al_err(err, -errno, "cannot open '%s': %s", from, strerror(errno));
        if (faccessat(dfd, "oci-layout", F_OK, AT_SYMLINK_NOFOLLOW) == 0) {
            j->kind = "oci-layout";
            return j->o->kernels ? with_kernels(j, "oci", abs, src, err) : from_layout(j, dfd, err);
        }
        if (j->o->kernels)
            return al_err(err, -EINVAL,
                          "--kernels adds packages to an image: give a Containerfile, an OCI "
                          "layout or archive, or a docker save tarball, not '%s'",
                          from);
        if (faccessat(dfd, "manifest.json", F_OK, AT_SYMLINK_NOFOLLOW) == 0 &&
            faccessat(dfd, "repositories", F_OK, AT_SYMLINK_NOFOLLOW) == 0) {
            j->kind = "docker-archive";
            return from_docker(j, dfd, err);
        }
        j->kind = "directory";
        return from_tree(j, abs, err);
    }
    if (!S_ISREG(st.st_mode))
        return al_err(err, -EINVAL, "'%s' is neither a file nor a directory", from);
    if (mkdir(src, 0700) < 0)
        return al_err(err, -errno, "cannot create '%s': %s", src, strerror(errno));
    _cleanup_close_ int sfd = open(src, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (sfd < 0)
        return al_err(err, -errno, "cannot open '%s': %s", src, strerror(errno));
    int r;
    if (is_archive(abs)) {
        r = archive_is_image(abs, err);
        if (r == 0 && j->o->kernels)
            return al_err(err, -EINVAL,
                          "--kernels adds packages to an image: give a Containerfile, an OCI "
                          "layout or archive, or a docker save tarball, not a root file "
                          "system's tar");
        if (r == 0) {
            /* A root file system's tar: one layer, read where it is. */
            j->kind = "rootfs-archive";
            _cleanup_close_ int fd = open(abs, O_RDONLY | O_CLOEXEC | O_NOCTTY);
            if (fd < 0)
                return al_err(err, -errno, "cannot open '%s': %s", from, strerror(errno));
            uint64_t size = (uint64_t)st.st_size;
            if ((r = tree_make(j, size * 4, err)) < 0)
                return r;
            j->layer = 1;
            return apply_layer_fd(j, fd, NULL, err);
        }
        if (r < 0)
            return r;
        r = unpack_archive(j, abs, sfd, err);
        if (r < 0)
            return r;
    } else {
        j->kind = "containerfile";
        /* buildah makes src itself. */
        rmdir(src);
        r = from_containerfile(j, abs, src, err);
        if (r < 0)
            return r;
        al_closep(&sfd);
        sfd = open(src, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (sfd < 0)
            return al_err(err, -errno, "buildah wrote no image layout: %s", strerror(errno));
        return from_layout(j, sfd, err);
    }
    if (faccessat(sfd, "oci-layout", F_OK, AT_SYMLINK_NOFOLLOW) == 0) {
        j->kind = "oci-archive";
        return j->o->kernels ? with_kernels(j, "oci-archive", abs, src, err)
                             : from_layout(j, sfd, err);
    }
    if (faccessat(sfd, "manifest.json", F_OK, AT_SYMLINK_NOFOLLOW) == 0) {
        j->kind = "docker-archive";
        return j->o->kernels ? with_kernels(j, "docker-archive", abs, src, err)
                             : from_docker(j, sfd, err);
    }
    return al_err(err, -EINVAL,
                  "'%s' is a tar archive of an image's files but neither an OCI image (no "
                  "oci-layout) nor a docker save (no manifest.json)",
                  from);
}

/* ---- the image around the tree ---- */

/* Whether rel names something in the tree, as the guest would resolve it. */
static bool tree_has(int tree_fd, const char *rel)
{
    struct open_how how = {.flags = O_PATH | O_CLOEXEC,
                           .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV};
    int fd = (int)syscall(SYS_openat2, tree_fd, rel, &how, sizeof(how));
    if (fd < 0)
        return false;
    close(fd);
    return true;
}

/* The languages the image's programs offer (its sessions' kernels need them: python's needs
 * IPython too). */
static void languages(struct from_job *j, cJSON *list)
{
    if (tree_has(j->tree_fd, "bin/sh"))
        cJSON_AddItemToArray(list, cJSON_CreateString("shell"));
    if (tree_has(j->tree_fd, "usr/bin/python3") || tree_has(j->tree_fd, "usr/local/bin/python3")) {
        cJSON_AddItemToArray(list, cJSON_CreateString("python"));
        if (!tree_has(j->tree_fd, "usr/lib/python3/dist-packages/IPython"))
            job_log(j, "python3 is there but not IPython (Debian: ipython3): 'python' runs work, "
                       "python kernels may not");
    }
    if (tree_has(j->tree_fd, "usr/bin/node") || tree_has(j->tree_fd, "usr/local/bin/node"))
        cJSON_AddItemToArray(list, cJSON_CreateString("javascript"));
}

static bool config_str_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > CONFIG_STR_MAX)
        return false;
    for (const char *p = s; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            return false;
    return true;
}

/* ENV, WORKDIR, USER and ENTRYPOINT + CMD, bounded and checked (they go into every run). */
static int config_defaults(struct from_job *j, cJSON *out, al_error *err)
{
    const cJSON *c = j->config;
    const cJSON *v;
    cJSON *env = cJSON_AddArrayToObject(out, "env");
    cJSON *cmd = cJSON_AddArrayToObject(out, "cmd");
    if (!env || !cmd)
        return al_err(err, -ENOMEM, "out of memory");
    int n = 0;
    cJSON_ArrayForEach(v, cJSON_GetObjectItemCaseSensitive(c, "Env"))
    {
        if (!cJSON_IsString(v) || !config_str_ok(v->valuestring) || !strchr(v->valuestring, '=') ||
            v->valuestring[0] == '=')
            return al_err(err, -EINVAL, "the image's Env has an entry that is not KEY=VALUE");
        if (++n > CONFIG_ENV_MAX)
            return al_err(err, -EINVAL, "the image's Env has more than %d entries", CONFIG_ENV_MAX);
        cJSON_AddItemToArray(env, cJSON_CreateString(v->valuestring));
    }
    n = 0;
    static const char *const parts[] = {"Entrypoint", "Cmd"};
    for (size_t i = 0; i < 2; i++)
        cJSON_ArrayForEach(v, cJSON_GetObjectItemCaseSensitive(c, parts[i]))
        {
            if (!cJSON_IsString(v) || strlen(v->valuestring) > CONFIG_STR_MAX ||
                ++n > CONFIG_CMD_MAX)
                return al_err(err, -EINVAL, "the image's %s is not a list of at most %d strings",
                              parts[i], CONFIG_CMD_MAX);
            cJSON_AddItemToArray(cmd, cJSON_CreateString(v->valuestring));
        }
    v = cJSON_GetObjectItemCaseSensitive(c, "WorkingDir");
    if (cJSON_IsString(v) && v->valuestring[0]) {
        if (v->valuestring[0] != '/' || !config_str_ok(v->valuestring))
            return al_err(err, -EINVAL, "the image's WorkingDir is not an absolute path");
        cJSON_AddStringToObject(out, "workdir", v->valuestring);
    }
    v = cJSON_GetObjectItemCaseSensitive(c, "User");
    if (cJSON_IsString(v) && v->valuestring[0]) {
        if (strlen(v->valuestring) > 64 ||
            strspn(v->valuestring, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                   "0123456789._-:") != strlen(v->valuestring))
            return al_err(err, -EINVAL, "the image's User is not a user name or uid[:gid]");
        cJSON_AddStringToObject(out, "user", v->valuestring);
    }
    return 0;
}

/* What airlock's agent needs in any root: mount points (it makes them too, but a read-only
 * image would not let it) and a /tmp. */
static void add_airlock_dirs(int tree_fd)
{
    static const struct {
        const char *path;
        mode_t mode;
    } dirs[] = {{"usr", 0755},  {"usr/lib", 0755},  {"usr/lib/airlock", 0755},
                {"proc", 0555}, {"sys", 0555},      {"dev", 0755},
                {"tmp", 01777}, {"workspace", 0777}};
    for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++)
        if (!tree_has(tree_fd, dirs[i].path) && mkdirat(tree_fd, dirs[i].path, dirs[i].mode) == 0)
            fchmodat(tree_fd, dirs[i].path, dirs[i].mode, 0);
}

int al_image_make_disk(const char *tree, uint64_t bytes, uint64_t entries, const char *out,
                       int log_fd, al_error *err)
{
    char img[AL_PATH_MAX], size[32], inodes[32];
    if (al_pathf(img, sizeof(img), "%s.raw", out) < 0)
        return al_err(err, -ENAMETOOLONG, "path too long");
    uint64_t fs = bytes + bytes / 4 + FS_ROOM;
    if (fs < FS_SIZE_MIN)
        fs = FS_SIZE_MIN;
    /* Enough inodes for the tree and as many again for what sessions write. */
    uint64_t n = entries * 2 + 65536;
    snprintf(size, sizeof(size), "%lluk", (unsigned long long)(fs >> 10));
    snprintf(inodes, sizeof(inodes), "%llu", (unsigned long long)n);
    _cleanup_close_ int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
    int log = log_fd > 0 ? log_fd : null;
    /* As the debian recipe makes its disk: no journal (sessions write to throwaway overlays),
     * nothing reserved for root. */
    const char *mkfs[] = {
        "mke2fs", "-q",           "-t", "ext4", "-O", "^has_journal",   "-m", "0",
        "-L",     "airlock-root", "-N", inodes, "-E", "root_owner=0:0", "-d", tree,
        img,      size,           NULL};
    int st = 0;
    /* Its stdout only says what it creates. */
    int r = al_spawn_wait_limited(mkfs, null, log, &MKFS_LIMITS, &st);
    if (r < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        unlink(img);
        return al_err(err, r < 0 ? r : -EIO, "mke2fs could not make the root file system%s",
                      log_fd > 0 ? " (see its messages)" : "");
    }
    const char *conv[] = {"qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2", img, out, NULL};
    r = al_spawn_wait_limited(conv, log, log, &MKFS_LIMITS, &st);
    unlink(img);
    if (r < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        return al_err(err, r < 0 ? r : -EIO, "qemu-img could not convert the root disk");
    return 0;
}

/* The base image's kernel and initrd, linked (or copied) into the new image's dir. */
static int link_part(const char *from, const char *dir, char *name, size_t len, al_error *err)
{
    const char *base = strrchr(from, '/');
    base = base ? base + 1 : from;
    char to[AL_PATH_MAX];
    if (snprintf(name, len, "%s", base) >= (int)len ||
        al_pathf(to, sizeof(to), "%s/%s", dir, base) < 0)
        return al_err(err, -ENAMETOOLONG, "path too long");
    if (link(from, to) == 0)
        return 0;
    const char *cp[] = {"cp", "--reflink=auto", from, to, NULL};
    return al_spawn_quiet(cp, "copy the base image's boot files", err);
}

int al_image_assemble(const char *scratch, const al_image *base, const char *name, cJSON *extra,
                      al_error *err)
{
    char kernel[128], initrd[128];
    if (!base->kernel[0] || !base->initrd[0] || base->transport != AL_TRANSPORT_VIRTIO)
        return al_err(err, -EINVAL,
                      "image '%s' cannot be a base: it has no kernel and initrd with the agent",
                      base->name);
    int r = link_part(base->kernel, scratch, kernel, sizeof(kernel), err);
    if (r == 0)
        r = link_part(base->initrd, scratch, initrd, sizeof(initrd), err);
    if (r < 0)
        return r;
    cJSON *j = extra;
    cJSON_AddStringToObject(j, "name", name);
    cJSON_AddStringToObject(j, "kernel", kernel);
    cJSON_AddStringToObject(j, "initrd", initrd);
    cJSON_AddStringToObject(j, "disk", "rootfs.qcow2");
    cJSON_AddStringToObject(j, "cmdline", base->cmdline);
    cJSON_AddNumberToObject(j, "agent_protocol", base->agent_protocol);
    if (base->memory_mib)
        cJSON_AddNumberToObject(j, "memory_mib", base->memory_mib);
    cJSON_AddStringToObject(j, "base", base->name);
    r = al_manifest_write(scratch, j, err);
    if (r < 0)
        return r;
    char disk[AL_PATH_MAX];
    if (al_pathf(disk, sizeof(disk), "%s/rootfs.qcow2", scratch) < 0)
        return al_err(err, -ENAMETOOLONG, "path too long");
    /* Sessions never write the base, each has an overlay; QEMU, another user, reads it. */
    if (chmod(disk, 0444) < 0 || chmod(scratch, 0755) < 0)
        return al_err(err, -errno, "cannot chmod '%s': %s", scratch, strerror(errno));
    return 0;
}

int al_image_from(const al_image_from_opts *given, al_error *err)
{
    al_image_from_opts taken = AL_IMAGE_FROM_OPTS_INIT;
    int r0 = AL_SIZED_IN(&taken, given, "al_image_from_opts", err);
    if (r0 < 0)
        return r0;
    const al_image_from_opts *o = &taken;
    if (!o->from || !*o->from)
        return al_err(err, -EINVAL, "no source to make the image from");
    al_image base = AL_IMAGE_INIT;
    int r = al_image_load(o->base ? o->base : "debian", &base, err);
    if (r < 0)
        return r;
    struct from_job j = {.o = o, .tree_fd = -1};
    char dst[AL_PATH_MAX], disk[AL_PATH_MAX];
    _cleanup_cjson_ cJSON *m = NULL;
    r = al_image_scratch(o->name, o->force, "from", dst, sizeof(dst), j.scratch, sizeof(j.scratch),
                         err);
    if (r < 0) {
        al_image_free(&base);
        return r;
    }
    __attribute__((cleanup(rmtree_scratch))) char *scratch = j.scratch;
    j.lim = (struct al_layer_limits){.bytes_max =
                                         o->max_size ? o->max_size : AL_IMAGE_FROM_SIZE_DEFAULT,
                                     .keep_setid = o->keep_setid,
                                     .chown = geteuid() == 0};
    if (al_pathf(disk, sizeof(disk), "%s/rootfs.qcow2", j.scratch) < 0) {
        r = al_err(err, -ENAMETOOLONG, "image path too long");
        goto out;
    }
    r = read_source(&j, err);
    if (r == 0 && j.tree_fd < 0)
        r = al_err(err, -EINVAL, "the image has no layers");
    if (r < 0)
        goto out;
    /* What the source was unpacked to (archives, buildah's layouts) is no part of the image. */
    char unpacked[AL_PATH_MAX + 16];
    snprintf(unpacked, sizeof(unpacked), "%s/src", j.scratch);
    al_rmtree(unpacked);
    snprintf(unpacked, sizeof(unpacked), "%s/src.kernels", j.scratch);
    al_rmtree(unpacked);
    if (j.notes > NOTES_MAX)
        job_log(&j, "%u more entries changed (not listed)", j.notes - NOTES_MAX);
    job_log(&j,
            "%llu entries, %llu MiB of files; %u device nodes dropped, %u set-id bits cleared, "
            "%u entries' extended attributes dropped, %u whiteouts",
            (unsigned long long)j.st.entries, (unsigned long long)(j.st.bytes >> 20), j.st.devices,
            j.st.setid, j.st.xattrs, j.st.whiteouts);
    add_airlock_dirs(j.tree_fd);
    m = cJSON_CreateObject();
    cJSON *src = cJSON_AddObjectToObject(m, "source");
    cJSON *cfg = cJSON_AddObjectToObject(m, "config");
    cJSON *langs = cJSON_AddArrayToObject(m, "languages");
    char abs[AL_PATH_MAX];
    if (!src || !cfg || !langs || !realpath(o->from, abs)) {
        r = al_err(err, -ENOMEM, "out of memory");
        goto out;
    }
    cJSON_AddStringToObject(src, "kind", j.kind);
    cJSON_AddStringToObject(src, "path", abs);
    if (j.digest[0])
        cJSON_AddStringToObject(src, "digest", j.digest);
    r = config_defaults(&j, cfg, err);
    if (r < 0)
        goto out;
    languages(&j, langs);
    r = al_image_make_disk(j.tree, j.st.bytes, j.st.entries, disk, o->log_fd, err);
    if (r < 0)
        goto out;
    al_closep(&j.tree_fd);
    al_rmtree(j.tree);
    r = al_image_assemble(j.scratch, &base, o->name, m, err);
    if (r < 0)
        goto out;
    r = al_image_swap_in(j.scratch, dst, o->name, o->force, err);
out:
    al_closep(&j.tree_fd);
    if (j.shm[0])
        al_rmtree(j.shm);
    cJSON_Delete(j.config_doc);
    al_image_free(&base);
    return r;
}

/* ---- an image's root disk as a container image ---- */

int al_image_export_base(const al_image_export_opts *given, al_error *err)
{
    al_image_export_opts taken = AL_IMAGE_EXPORT_OPTS_INIT;
    int r0 = AL_SIZED_IN(&taken, given, "al_image_export_opts", err);
    if (r0 < 0)
        return r0;
    const al_image_export_opts *o = &taken;
    const char *name = o->image ? o->image : "debian";
    char ref[160];
    if (o->ref)
        snprintf(ref, sizeof(ref), "%s", o->ref);
    else
        snprintf(ref, sizeof(ref), "airlock/%s", name);
    if (!ref[0] || strspn(ref, "abcdefghijklmnopqrstuvwxyz0123456789._-/:") != strlen(ref))
        return al_err(err, -EINVAL,
                      "'%s' is not a container image name (lowercase letters, digits, . _ - / :)",
                      ref);
    al_image img = AL_IMAGE_INIT;
    int r = al_image_load(name, &img, err);
    if (r < 0)
        return r;
    if (!img.disk[0]) {
        al_image_free(&img);
        return al_err(err, -EINVAL, "image '%s' has no root disk to export", name);
    }
    char tmpl[] = "/var/tmp/airlock-export.XXXXXX";
    char *dir = mkdtemp(tmpl);
    if (!dir) {
        al_image_free(&img);
        return al_err(err, -errno, "cannot make a scratch dir: %s", strerror(errno));
    }
    __attribute__((cleanup(rmtree_scratch))) char *scratch = dir;
    char raw[AL_PATH_MAX], tree[AL_PATH_MAX], tarball[AL_PATH_MAX], rdump[AL_PATH_MAX + 16];
    if (al_pathf(raw, sizeof(raw), "%s/root.raw", dir) < 0 ||
        al_pathf(tree, sizeof(tree), "%s/tree", dir) < 0 ||
        al_pathf(tarball, sizeof(tarball), "%s/root.tar", dir) < 0 ||
        al_pathf(rdump, sizeof(rdump), "rdump / %s", tree) < 0 || mkdir(tree, 0755) < 0) {
        al_image_free(&img);
        return al_err(err, -ENAMETOOLONG, "path too long");
    }
    /* The disk is read as a file system by debugfs, never mounted. */
    const char *conv[] = {"qemu-img", "convert", "-q",     "-U", "-f", "qcow2",
                          "-O",       "raw",     img.disk, raw,  NULL};
    const char *dump[] = {"debugfs", "-R", rdump, raw, NULL};
    const char *tar[] = {"tar", "--numeric-owner", "-C", tree, "-cf", tarball, ".", NULL};
    const char *imp[] = {"podman", "import", "--change", "CMD=/bin/bash", tarball, ref, NULL};
    struct from_job j = {.o = &(al_image_from_opts){.log_fd = o->log_fd}};
    r = run_helper(&j, conv, 600, "qemu-img convert", err);
    if (r == 0)
        r = run_helper(&j, dump, 600, "debugfs rdump", err);
    unlink(raw);
    if (r == 0)
        r = run_helper(&j, tar, 600, "tar", err);
    al_rmtree(tree);
    if (r == 0)
        r = run_helper(&j, imp, 600, "podman import", err);
    al_image_free(&img);
    return r;
}

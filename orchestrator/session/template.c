/* Warm starts: templates of an already booted guest, and sessions restored from them.
 *
 * Mechanism (measured, docs/ARCHITECTURE.md and docs/PERFORMANCE.md): the template's guest RAM
 * is a file. While the template is built, QEMU maps it shared (memory-backend-file, share=on),
 * so the guest's memory is the file's content; once the guest is warm it is paused and only the
 * device state goes out, as a migration stream with QEMU's x-ignore-shared capability (a few
 * hundred KiB, in ~50 ms). A session maps the same file privately (share=off): it starts on the
 * template's pages, shares them with every other session in the host's page cache, and copies
 * only the pages its guest writes. Its QEMU starts paused with `-incoming defer`, takes the
 * device state from an fd (QMP getfd + migrate-incoming), and resumes. libvirt 9.0 exposes
 * neither the RAM file nor x-ignore-shared, so the RAM backend comes through
 * <qemu:commandline> (vm.c) and the QMP commands through libvirt's monitor passthrough, which
 * passes the fd too; the domain is otherwise libvirt's like any other: transient,
 * AUTODESTROY, in libvirt's cgroups, run as QEMU's unprivileged user, found by gc.
 *
 * The disk: the template's guest ran on an overlay of the image's base; frozen when the state
 * was saved, it becomes the middle layer of each session's own overlay, read-only to QEMU.
 *
 * Files (STATE/templates/NAME/): ram, state, disk.qcow2, owned by QEMU's user, 0600 (QEMU opens
 * ram read-write even when it maps it privately); manifest.json, ours, 0600: the key and, for
 * each file, its size, inode, owner, mode, mtime and ctime, and the SHA-256 of state and
 * disk.qcow2 (checked on every restore) and of ram (checked by al_template_list). A write to
 * any file changes its ctime, which nobody but root can set back, so a file changed behind our
 * back is refused (notice, cold boot, the template removed) without reading the RAM file on
 * every restore. */
#include "template.h"
#include "checkpoint.h"
#include "exec.h"
#include "link.h"

#include <openssl/evp.h>

#include <dirent.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define TEMPLATES_DIR "templates"
#define MANIFEST "manifest.json"
#define FORKS_DIR "forks"
/* In a fork's state dir: a hard link of its save's state file, which the save's link count
 * counts. */
#define FORK_REF "fork.ref"
/* Bumped when what a template holds changes meaning. */
#define TEMPLATE_FORMAT 1
/* Saving the device state of a paused guest takes ~50 ms; loading it ~100 ms. */
#define MIGRATE_MS 60000
/* The agent's re-handshake after the restore: its first instructions run slowly under
 * emulation (its translated code is gone). */
#define RESYNC_MS 15000
/* The warm-up's imports take 20-30 s under emulation on a busy host. */
#define WARM_EXEC_MS 300000
/* The agent's REFRESH after the restore: a few syscalls, ~1 ms; the rest is a loaded host. */
#define REFRESH_MS 15000
/* What the python kernel imports (and draws once) in the template, inside a function so the
 * user's namespace stays empty: later imports are then lookups in sys.modules. The kernel
 * starts in /workspace, as chat runs ask. */
static const char WARM_PYTHON[] =
    "def _airlock_warm():\n"
    "    import io, random, tempfile, uuid\n"
    "    try:\n"
    "        import numpy, pandas, matplotlib.pyplot as plt\n"
    "    except ImportError:\n"
    "        return  # an image without them: the kernel is still warm\n"
    "    pandas.DataFrame({'a': [1, 2, 3, 4]}).plot()\n"
    "    plt.gcf().savefig(io.BytesIO(), format='png')\n"
    "    plt.close('all')\n"
    "_airlock_warm()\n"
    "del _airlock_warm\n";
static const char *const FILES[] = {"ram", "state", "disk.qcow2"};
enum { F_RAM, F_STATE, F_DISK, NFILES };

struct al_template {
    char dir[AL_PATH_MAX];
    char path[NFILES][AL_PATH_MAX];
    bool python;
    bool fork; /* a fork's save (fork.c): a failed restore is an error, not a cold boot */
    uint64_t disk_size;
    /* The disk's middle layers, top first: the template's disk; a fork's copy of its source's
     * overlay and the source's own middle layers. */
    char mid[AL_DISK_MIDS_MAX][AL_PATH_MAX];
    const char *mids[AL_DISK_MIDS_MAX + 1];
};

const char *const *al_template_mids(const struct al_template *t)
{
    return t && t->mids[0] ? t->mids : NULL;
}

bool al_template_is_fork(const struct al_template *t)
{
    return t && t->fork;
}

uint64_t al_template_disk_size(const struct al_template *t)
{
    return t ? t->disk_size : 0;
}

void al_image_identity(const al_image *img, char *buf, size_t len)
{
    size_t at = 0;
    const char *parts[] = {img->disk, img->kernel, img->initrd};
    buf[0] = '\0';
    for (size_t i = 0; i < 3 && at < len; i++) {
        struct stat st = {0};
        if (parts[i] && parts[i][0])
            stat(parts[i], &st);
        int n = snprintf(buf + at, len - at, "%s%llu:%lld:%lld.%09ld", i ? " " : "",
                         (unsigned long long)st.st_ino, (long long)st.st_size,
                         (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
        at += n > 0 ? (size_t)n : 0;
    }
}

int al_template_of_fork(al_session *s, const struct al_fork_save *fs, al_error *err)
{
    char image_id[AL_PATH_MAX], qemu[200];
    al_image_identity(&s->img, image_id, sizeof(image_id));
    al_qemu_identity(s->conn, qemu, sizeof(qemu));
    if (strcmp(s->img.disk, fs->image_disk) || strcmp(image_id, fs->image_id))
        return al_err(err, -ESTALE, "image '%s' changed since the save: it cannot be restored",
                      fs->image);
    if (strcmp(qemu, fs->qemu))
        return al_err(err, -ESTALE,
                      "the save was made by another QEMU or libvirt (%s; now %s): it cannot be "
                      "restored",
                      fs->qemu, qemu);
    if (s->kvm != fs->kvm)
        return al_err(err, -EINVAL, "the fork was saved under %s and would run under %s",
                      fs->kvm ? "KVM" : "emulation", s->kvm ? "KVM" : "emulation");
    if (fs->nmids + 1 > AL_DISK_MIDS_MAX)
        return al_err(err, -E2BIG, "a fork of a fork this deep has too many disk layers (%d)",
                      AL_DISK_MIDS_MAX);
    char from[AL_PATH_MAX], ref[AL_PATH_MAX];
    if (al_pathf(from, sizeof(from), "%s/state", fs->dir) < 0 ||
        al_pathf(ref, sizeof(ref), "%s/" FORK_REF, s->state_dir) < 0)
        return al_err(err, -ENAMETOOLONG, "fork path too long");
    if (link(from, ref) < 0)
        return al_err(err, -errno, "cannot hold the fork's save: %s", strerror(errno));
    struct al_template *t = calloc(1, sizeof(*t));
    if (!t)
        return al_err(err, -ENOMEM, "out of memory");
    int bad = al_pathf(t->dir, sizeof(t->dir), "%s", fs->dir);
    for (int i = 0; i < NFILES; i++)
        bad |= al_pathf(t->path[i], sizeof(t->path[i]), "%s/%s", fs->dir, FILES[i]);
    for (size_t i = 0; fs->disk && i <= fs->nmids; i++) {
        bad |= i == 0 ? al_pathf(t->mid[i], sizeof(t->mid[i]), "%s/disk.qcow2", fs->dir)
                      : al_pathf(t->mid[i], sizeof(t->mid[i]), "%s/mid%zu.qcow2", fs->dir, i);
        t->mids[i] = t->mid[i];
    }
    if (bad < 0) {
        free(t);
        return al_err(err, -ENAMETOOLONG, "fork path too long");
    }
    t->fork = true;
    t->disk_size = fs->disk_size;
    s->tmpl = t;
    return 0;
}

/* ---- forks' saves (fork.c makes them) ---- */

int al_forks_dir(char *buf, size_t len, al_error *err)
{
    return al_state_subdir(FORKS_DIR, buf, len, err);
}

/* Removes dir when no handle holds its lock and no fork links its state file. */
void al_fork_reap_dir(const char *dir)
{
    char lock[AL_PATH_MAX], state[AL_PATH_MAX];
    if (al_pathf(lock, sizeof(lock), "%s/lock", dir) < 0 ||
        al_pathf(state, sizeof(state), "%s/state", dir) < 0)
        return;
    _cleanup_close_ int fd = open(lock, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) < 0)
        return; /* a handle holds it, or a save is under way */
    struct stat st;
    if (lstat(state, &st) == 0 && st.st_nlink > 1)
        return;
    /* A RAM file in /dev/shm (fork.c) goes with its save. */
    char ram[AL_PATH_MAX], shm[AL_PATH_MAX];
    ssize_t n = -1;
    if (al_pathf(ram, sizeof(ram), "%s/ram", dir) == 0)
        n = readlink(ram, shm, sizeof(shm) - 1);
    if (n > 0) {
        shm[n] = '\0';
        char *slash = strrchr(shm, '/');
        if (slash)
            *slash = '\0';
        if (al_shm_dir_ours(AL_FORK_SHM_PREFIX, shm))
            al_rmtree(shm);
    }
    al_rmtree(dir);
}

/* RAM files in /dev/shm whose save is gone (a process that died between the two). */
static void reap_shm_orphans(void)
{
    DIR *d = opendir("/dev/shm");
    if (!d)
        return;
    for (struct dirent *e; (e = readdir(d));) {
        char path[AL_PATH_MAX], link[AL_PATH_MAX], save[AL_PATH_MAX];
        if (al_pathf(path, sizeof(path), "/dev/shm/%s", e->d_name) < 0 ||
            !al_shm_dir_ours(AL_FORK_SHM_PREFIX, path) ||
            al_pathf(link, sizeof(link), "%s/save", path) < 0)
            continue;
        ssize_t n = readlink(link, save, sizeof(save) - 1);
        struct stat st;
        if (n > 0) {
            save[n] = '\0';
            if (lstat(save, &st) < 0 && errno == ENOENT)
                al_rmtree(path);
        } else if (lstat(path, &st) == 0 && st.st_mtime + 600 < time(NULL)) {
            al_rmtree(path); /* never linked to a save: one that failed midway */
        }
    }
    closedir(d);
}

void al_fork_reap(void)
{
    char dir[AL_PATH_MAX];
    al_error ignored = {0};
    if (al_forks_dir(dir, sizeof(dir), &ignored) < 0)
        return;
    DIR *d = opendir(dir);
    if (!d)
        return;
    for (struct dirent *e; (e = readdir(d));) {
        char path[AL_PATH_MAX];
        if (e->d_name[0] == '.' || al_pathf(path, sizeof(path), "%s/%s", dir, e->d_name) < 0)
            continue;
        al_fork_reap_dir(path);
    }
    closedir(d);
    reap_shm_orphans();
}

void al_template_free(struct al_template *t)
{
    free(t);
}

AL_DEFINE_CLEANUP(evp_freep, EVP_MD_CTX *, EVP_MD_CTX_free)

/* SHA-256 of a file's bytes, in hex. */
int al_sha256_file(const char *path, char out[65])
{
    _cleanup_close_ int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    __attribute__((cleanup(evp_freep))) EVP_MD_CTX *md = EVP_MD_CTX_new();
    if (!md || !EVP_DigestInit_ex(md, EVP_sha256(), NULL))
        return -ENOMEM;
    static __thread unsigned char buf[1 << 16];
    ssize_t n;
    while ((n = read(fd, buf, sizeof(buf))) > 0)
        EVP_DigestUpdate(md, buf, (size_t)n);
    if (n < 0)
        return -errno;
    unsigned char d[32];
    EVP_DigestFinal_ex(md, d, NULL);
    al_hexify(d, 32, out);
    return 0;
}

/* ---- the key ---- */

static void key_add(EVP_MD_CTX *md, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void key_add(EVP_MD_CTX *md, const char *fmt, ...)
{
    char buf[8192];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (n > 0)
        EVP_DigestUpdate(md, buf, (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf) - 1);
    EVP_DigestUpdate(md, "\n", 1);
}

static void key_add_stat(EVP_MD_CTX *md, const char *path)
{
    struct stat st = {0};
    if (path[0])
        stat(path, &st);
    key_add(md, "%s %lld %llu %lld.%09ld", path, (long long)st.st_size,
            (unsigned long long)st.st_ino, (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
}

/* The content of a file that the build rewrites with the same bytes (kernel, initrd): its
 * SHA-256, cached in tdir beside the templates under its identity (inode, size, times), so it
 * is read once per rewrite, not on every session (the kernel: ~40 ms). */
static void key_add_content(EVP_MD_CTX *md, const char *tdir, const char *path)
{
    struct stat st;
    char sha[65] = "", cache[AL_PATH_MAX], want[200], line[300];
    unsigned char d[32];
    char tag[17];
    if (!path[0] || stat(path, &st) < 0) {
        key_add(md, "%s missing", path);
        return;
    }
    EVP_Digest(path, strlen(path), d, NULL, EVP_sha256(), NULL);
    al_hexify(d, 8, tag);
    snprintf(want, sizeof(want), "%llu %lld %lld.%09ld %lld.%09ld ", (unsigned long long)st.st_ino,
             (long long)st.st_size, (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec,
             (long long)st.st_ctim.tv_sec, st.st_ctim.tv_nsec);
    if (al_pathf(cache, sizeof(cache), "%s/.hash-%s", tdir, tag) < 0)
        return;
    int fd = open(cache, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    struct stat cst;
    if (fd >= 0 && fstat(fd, &cst) == 0 && cst.st_uid == geteuid() && !(cst.st_mode & 022)) {
        ssize_t n = read(fd, line, sizeof(line) - 1);
        line[n > 0 ? n : 0] = '\0';
        size_t wl = strlen(want);
        if (!strncmp(line, want, wl) && strlen(line + wl) >= 64)
            snprintf(sha, sizeof(sha), "%.64s", line + wl);
    }
    if (fd >= 0)
        close(fd);
    if (!sha[0]) {
        if (al_sha256_file(path, sha) < 0) {
            key_add(md, "%s unreadable", path);
            return;
        }
        char tmp[AL_PATH_MAX];
        fd = al_pathf(tmp, sizeof(tmp), "%s.%ld", cache, (long)getpid()) < 0
                 ? -1
                 : open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd >= 0) {
            dprintf(fd, "%s%s\n", want, sha);
            close(fd);
            if (rename(tmp, cache) < 0)
                unlink(tmp);
        }
    }
    key_add(md, "%s sha256 %s", path, sha);
}

/* What a template depends on: the image (its manifest and files: kernel, initrd with the agent
 * and the kernels' drivers, base disk), this airlock and its protocol, QEMU's and libvirt's
 * versions, the accelerator, memory, vCPUs and transport. prefix names the image and shape (the
 * image's directory hashed in: worktrees with an image of the same name keep apart); key is
 * the whole. */
static int template_key(al_session *s, enum al_transport kind, const char *tdir, unsigned mem,
                        unsigned vcpus, char *prefix, size_t plen, char key[65])
{
    __attribute__((cleanup(evp_freep))) EVP_MD_CTX *md = EVP_MD_CTX_new();
    if (!md || !EVP_DigestInit_ex(md, EVP_sha256(), NULL))
        return -ENOMEM;
    unsigned char d[32];
    char dirhash[65];
    EVP_DigestUpdate(md, s->img.dir, strlen(s->img.dir));
    EVP_DigestFinal_ex(md, d, NULL);
    al_hexify(d, 8, dirhash);
    if (snprintf(prefix, plen, "%s-%s-%um%uc%s-", s->img.name, dirhash, mem, vcpus,
                 s->kvm ? "-kvm" : "") >= (int)plen)
        return -ENAMETOOLONG;
    EVP_DigestInit_ex(md, EVP_sha256(), NULL);
    key_add(md, "airlock-template %d %s proto %d", TEMPLATE_FORMAT, AIRLOCK_VERSION,
            AL_PROTO_VERSION);
    key_add(md, "%s", prefix);
    char manifest[AL_PATH_MAX];
    if (al_pathf(manifest, sizeof(manifest), "%s/manifest.json", s->img.dir) < 0)
        return -ENAMETOOLONG;
    char msha[65] = "";
    al_sha256_file(manifest, msha);
    key_add(md, "manifest %s", msha);
    key_add_content(md, tdir, s->img.kernel);
    key_add_content(md, tdir, s->img.initrd);
    key_add_stat(md, s->img.disk); /* cached by its inputs' hash, never rewritten */
    key_add(md, "cmdline %s transport %d", s->img.cmdline, (int)kind);
    unsigned long qemu = 0, lib = 0;
    virConnectGetVersion(s->conn, &qemu);
    virConnectGetLibVersion(s->conn, &lib);
    key_add(md, "qemu %lu libvirt %lu accel %s", qemu, lib, s->kvm ? "kvm" : "tcg");
    key_add_stat(md, "/usr/bin/qemu-system-x86_64");
    EVP_DigestFinal_ex(md, d, NULL);
    al_hexify(d, 32, key);
    return 0;
}

void al_qemu_identity(virConnectPtr conn, char *buf, size_t len)
{
    unsigned long qemu = 0, lib = 0;
    virConnectGetVersion(conn, &qemu);
    virConnectGetLibVersion(conn, &lib);
    struct stat st = {0};
    stat("/usr/bin/qemu-system-x86_64", &st);
    snprintf(buf, len, "qemu %lu libvirt %lu binary %lld %lld.%09ld", qemu, lib,
             (long long)st.st_size, (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
}

static int templates_dir(char *buf, size_t len, al_error *err)
{
    return al_state_subdir(TEMPLATES_DIR, buf, len, err);
}

/* ---- the manifest ---- */

int al_file_record(const char *path, bool hash, struct al_file_rec *f)
{
    struct stat st;
    if (lstat(path, &st) < 0)
        return -errno;
    *f = (struct al_file_rec){
        .size = (uint64_t)st.st_size,
        .ino = (uint64_t)st.st_ino,
        .uid = st.st_uid,
        .mode = st.st_mode,
        .mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec,
        .ctime_ns = (int64_t)st.st_ctim.tv_sec * 1000000000 + st.st_ctim.tv_nsec,
    };
    return hash ? al_sha256_file(path, f->sha) : 0;
}

void al_manifest_file_add(cJSON *files, const char *name, const struct al_file_rec *r)
{
    cJSON *f = cJSON_AddObjectToObject(files, name);
    cJSON_AddNumberToObject(f, "size", (double)r->size);
    cJSON_AddNumberToObject(f, "ino", (double)r->ino);
    cJSON_AddNumberToObject(f, "uid", r->uid);
    cJSON_AddNumberToObject(f, "mode", r->mode);
    char ns[32];
    snprintf(ns, sizeof(ns), "%lld", (long long)r->mtime_ns);
    cJSON_AddStringToObject(f, "mtime_ns", ns);
    snprintf(ns, sizeof(ns), "%lld", (long long)r->ctime_ns);
    cJSON_AddStringToObject(f, "ctime_ns", ns);
    cJSON_AddStringToObject(f, "sha256", r->sha);
}

int al_manifest_write_private(const char *dir, const cJSON *j, al_error *err)
{
    _cleanup_free_ char *text = cJSON_Print(j);
    char path[AL_PATH_MAX];
    if (!text || al_pathf(path, sizeof(path), "%s/" MANIFEST, dir) < 0)
        return al_err(err, -ENOMEM, "cannot write the manifest");
    _cleanup_close_ int fd = al_file_create_private(path, O_WRONLY);
    if (fd < 0)
        return al_err(err, fd, "cannot create '%s': %s", path, strerror(-fd));
    size_t n = strlen(text);
    if (write(fd, text, n) != (ssize_t)n || fsync(fd) < 0)
        return al_err(err, -EIO, "cannot write '%s'", path);
    return 0;
}

static int manifest_write(const char *dir, const char *key, const al_session *s, unsigned mem,
                          unsigned vcpus, bool python, const struct al_file_rec *recs,
                          al_error *err)
{
    _cleanup_cjson_ cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "format", TEMPLATE_FORMAT);
    cJSON_AddStringToObject(j, "key", key);
    cJSON_AddStringToObject(j, "image", s->img.name);
    cJSON_AddNumberToObject(j, "memory_mib", mem);
    cJSON_AddNumberToObject(j, "vcpus", vcpus);
    cJSON_AddBoolToObject(j, "kvm", s->kvm);
    cJSON_AddBoolToObject(j, "python", python);
    cJSON_AddNumberToObject(j, "created", (double)time(NULL));
    cJSON *files = cJSON_AddObjectToObject(j, "files");
    for (int i = 0; i < NFILES; i++)
        al_manifest_file_add(files, FILES[i], &recs[i]);
    return al_manifest_write_private(dir, j, err);
}

/* Reads DIR/manifest.json: ours (owner, 0600, no symlink), at most 64 KiB. */
cJSON *al_manifest_read(const char *dir, al_error *why)
{
    char path[AL_PATH_MAX];
    if (al_pathf(path, sizeof(path), "%s/" MANIFEST, dir) < 0)
        return NULL;
    _cleanup_close_ int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        al_err(why, -ESTALE, "no manifest");
        return NULL;
    }
    if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 0777) != 0600 ||
        st.st_size > 65536) {
        al_err(why, -ESTALE, "its manifest's owner, mode or size changed");
        return NULL;
    }
    char buf[65537];
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    if (n <= 0) {
        al_err(why, -ESTALE, "its manifest cannot be read");
        return NULL;
    }
    buf[n] = '\0';
    cJSON *j = cJSON_Parse(buf);
    if (!j)
        al_err(why, -ESTALE, "its manifest is not JSON");
    return j;
}

static const char *jstr(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static double jnum(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

bool al_manifest_files_intact(const char *dir, const cJSON *j, const char *const *names, size_t n,
                              unsigned hash_mask, unsigned ctime_mask, al_error *why)
{
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(j, "files");
    for (size_t i = 0; i < n; i++) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(files, names[i]);
        char path[AL_PATH_MAX];
        struct al_file_rec have;
        if (!f || al_pathf(path, sizeof(path), "%s/%s", dir, names[i]) < 0 ||
            al_file_record(path, false, &have) < 0) {
            al_err(why, -ESTALE, "its %s is missing", names[i]);
            return false;
        }
        char mt[32], ct[32];
        snprintf(mt, sizeof(mt), "%lld", (long long)have.mtime_ns);
        snprintf(ct, sizeof(ct), "%lld", (long long)have.ctime_ns);
        if (!S_ISREG(have.mode) || (have.mode & 0777) != 0600 ||
            (double)have.uid != jnum(f, "uid") || (double)have.mode != jnum(f, "mode")) {
            al_err(why, -ESTALE, "its %s's owner or mode changed", names[i]);
            return false;
        }
        if ((double)have.size != jnum(f, "size") || (double)have.ino != jnum(f, "ino") ||
            strcmp(mt, jstr(f, "mtime_ns")) ||
            ((ctime_mask & (1u << i)) && strcmp(ct, jstr(f, "ctime_ns")))) {
            al_err(why, -ESTALE, "its %s was changed after it was made", names[i]);
            return false;
        }
        if (hash_mask & (1u << i)) {
            char sha[65];
            if (al_sha256_file(path, sha) < 0 || strcmp(sha, jstr(f, "sha256"))) {
                al_err(why, -ESTALE, "its %s's checksum differs", names[i]);
                return false;
            }
        }
    }
    return true;
}

/* Whether the template's files are the ones recorded: owner, mode, size, inode, mtime, and the
 * SHA-256 of each file whose hash is asked for (bit i of hash_mask), else its ctime: a fork of a
 * restored session hard-links the template's disk (fork.c), which changes its ctime, never its
 * content. why says what differs. */
static bool files_intact(const char *dir, const cJSON *j, unsigned hash_mask, al_error *why)
{
    return al_manifest_files_intact(dir, j, FILES, NFILES, hash_mask, ~hash_mask, why);
}

/* ---- picking one for a session ---- */

enum al_warm al_warm_mode(const al_session_opts *opts)
{
    if (opts->warm != AL_WARM_DEFAULT)
        return (enum al_warm)opts->warm;
    const char *e = getenv("AIRLOCK_WARM");
    if (e && !strcmp(e, "off"))
        return AL_WARM_OFF;
    if (e && !strcmp(e, "auto"))
        return AL_WARM_AUTO;
    return AL_WARM_USE;
}

/* Removes the templates of this image and shape other than keep (stale ones). Returns how many
 * were there. */
static int remove_others(const char *tdir, const char *prefix, const char *keep)
{
    DIR *d = opendir(tdir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) || (keep && !strcmp(e->d_name, keep)))
            continue;
        char path[AL_PATH_MAX];
        if (al_pathf(path, sizeof(path), "%s/%s", tdir, e->d_name) == 0) {
            al_rmtree(path);
            n++;
        }
    }
    if (d)
        closedir(d);
    return n;
}

/* Loads the template in dir when it is intact: 0, or -1 with why set (-ESTALE: what differs). */
static int template_load(const char *dir, const char *key, struct al_template **out, al_error *why)
{
    _cleanup_cjson_ cJSON *j = al_manifest_read(dir, why);
    if (!j)
        return -1;
    if (strcmp(jstr(j, "key"), key)) {
        al_err(why, -ESTALE, "its manifest names another key");
        return -1;
    }
    if (!files_intact(dir, j, (1u << F_STATE) | (1u << F_DISK), why))
        return -1;
    struct al_template *t = calloc(1, sizeof(*t));
    if (!t) {
        al_err(why, -ESTALE, "out of memory");
        return -1;
    }
    int bad = al_pathf(t->dir, sizeof(t->dir), "%s", dir);
    for (int i = 0; i < NFILES; i++)
        bad |= al_pathf(t->path[i], sizeof(t->path[i]), "%s/%s", dir, FILES[i]);
    if (bad < 0) {
        free(t);
        al_err(why, -ESTALE, "its path is too long");
        return -1;
    }
    t->python = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "python"));
    snprintf(t->mid[0], sizeof(t->mid[0]), "%s", t->path[F_DISK]);
    t->mids[0] = t->mid[0];
    *out = t;
    return 0;
}

/* Serializes builds of one template between processes: a lock file beside it. */
static int build_lock(const char *tdir, const char *prefix)
{
    char path[AL_PATH_MAX];
    if (al_pathf(path, sizeof(path), "%s/.%slock", tdir, prefix) < 0)
        return -ENAMETOOLONG;
    return al_lock_file(path);
}

bool al_template_applies(const al_session *s, const al_session_opts *opts, enum al_transport kind)
{
    /* SSH sessions (their keys are per session), images that boot through firmware, a
     * benchmark port, a scratch disk, a NIC for network on request or a display on an image
     * without one (devices the template lacks; an image with a display, the desktop, has it
     * in its template too) always boot cold, and so do kept sessions (pause saves a VM libvirt
     * started as its own, keep.c). */
    /* Nor do sessions on a remote host: templates are files on this one. */
    return al_warm_mode(opts) != AL_WARM_OFF && kind == AL_TRANSPORT_VIRTIO && s->img.kernel[0] &&
           !s->remote && !s->raw_port[0] && !(opts->checkpoints && !s->img.disk[0]) &&
           !(opts->net.allow && opts->net.allow[0]) &&
           !(opts->display && !al_image_has_display(&s->img)) && !opts->display_width &&
           !(AL_HAS(opts, volumes) && opts->volumes && opts->volumes[0]) && !opts->keep &&
           !getenv("AIRLOCK_TEST_KVM_LIE");
}

int al_template_id_of(al_session *s, enum al_transport kind, unsigned mem, unsigned vcpus,
                      struct al_template_id *id, al_error *err)
{
    int r = templates_dir(id->tdir, sizeof(id->tdir), err);
    if (r < 0)
        return r;
    if (template_key(s, kind, id->tdir, mem, vcpus, id->prefix, sizeof(id->prefix), id->key) < 0 ||
        al_pathf(id->dir, sizeof(id->dir), "%s/%s%.16s", id->tdir, id->prefix, id->key) < 0)
        return al_err(err, -ENAMETOOLONG, "template path too long");
    id->mem = mem;
    id->vcpus = vcpus;
    return 0;
}

int al_template_find(al_session *s, const struct al_template_id *id, al_error *why)
{
    struct stat st;
    bool exists = lstat(id->dir, &st) == 0;
    if (exists && template_load(id->dir, id->key, &s->tmpl, why) == 0)
        return AL_TEMPLATE_FOUND;
    if (exists) {
        al_rmtree(id->dir);
        remove_others(id->tdir, id->prefix, NULL);
        return AL_TEMPLATE_REFUSED;
    }
    return remove_others(id->tdir, id->prefix, NULL) ? AL_TEMPLATE_STALE : AL_TEMPLATE_NONE;
}

/* ---- building ---- */

/* Runs code in the python kernel; its output is dropped, a failure is an error. */
static int python_run(al_session *s, const char *code, const char *cwd, unsigned timeout_ms,
                      const char *what, al_error *err)
{
    const char *argv[] = {code, NULL};
    al_exec_opts o = {.struct_size = sizeof(al_exec_opts),
                      .argv = argv,
                      .lang = "python",
                      .kernel = true,
                      .cwd = cwd,
                      .timeout_ms = timeout_ms};
    return al_exec_quiet(s, o, what, err);
}

static bool has_python_kernel(const al_session *s)
{
    char langs[sizeof(s->langs) + 2];
    snprintf(langs, sizeof(langs), " %s ", s->langs);
    return strstr(langs, " kernel:python ") != NULL;
}

/* Makes the template's files QEMU's, 0600 (al_disk_give), and records them. */
static int seal_files(al_session *s, const char *dir, struct al_file_rec *recs, al_error *err)
{
    for (int i = 0; i < NFILES; i++) {
        char path[AL_PATH_MAX];
        if (al_pathf(path, sizeof(path), "%s/%s", dir, FILES[i]) < 0)
            return al_err(err, -ENAMETOOLONG, "template path too long");
        int r = al_disk_give(s->conn, s->kvm, path, err);
        if (r < 0)
            return r;
        r = al_file_record(path, true, &recs[i]);
        if (r < 0)
            return al_err(err, r, "cannot read '%s': %s", path, strerror(-r));
    }
    return 0;
}

/* Boots the guest for the template with its RAM in staging/ram, warms it, and saves it:
 * staging/state (device state), staging/disk.qcow2 (its overlay, frozen). */
int al_template_stage(virConnectPtr conn, bool kvm, const struct al_template_id *id, char *staging,
                      size_t slen, char *ram, size_t rlen, int *lock_fd, al_error *err)
{
    uint8_t rnd[6];
    if (getrandom(rnd, sizeof(rnd), 0) != sizeof(rnd))
        return al_err(err, -EIO, "getrandom failed");
    if (al_pathf(staging, slen, "%s/.build-%s%02x%02x%02x%02x%02x%02x", id->tdir, id->prefix,
                 rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5]) < 0 ||
        al_pathf(ram, rlen, "%s/ram", staging) < 0)
        return al_err(err, -ENAMETOOLONG, "template path too long");
    if (strchr(ram, ','))
        return al_err(err, -EINVAL,
                      "the state dir's path has a comma, which QEMU's options cannot carry");
    int lock = build_lock(id->tdir, id->prefix);
    if (lock < 0)
        return al_err(err, lock, "cannot lock the template: %s", strerror(-lock));
    struct stat st;
    if (lstat(id->dir, &st) == 0) {
        close(lock);
        return 1; /* another process built it while we waited for the lock */
    }
    /* What a build that died (SIGKILL, a host crash) left: under the lock, nobody's. */
    char leftover[300];
    snprintf(leftover, sizeof(leftover), ".build-%s", id->prefix);
    remove_others(id->tdir, leftover, NULL);
    int r = mkdir(staging, 0711) < 0
                ? al_err(err, -errno, "cannot create '%s': %s", staging, strerror(errno))
                : 0;
    if (r == 0) {
        _cleanup_close_ int fd = al_file_create_private(ram, O_RDWR);
        if (fd < 0)
            r = al_err(err, fd, "cannot create '%s': %s", ram, strerror(-fd));
        else if (ftruncate(fd, (off_t)id->mem << 20) < 0)
            r = al_err(err, -errno, "cannot size '%s': %s", ram, strerror(errno));
    }
    /* QEMU maps it shared and writes it: QEMU's user owns it. */
    if (r == 0)
        r = al_disk_give(conn, kvm, ram, err);
    if (r < 0) {
        al_rmtree(staging);
        close(lock);
        return r;
    }
    *lock_fd = lock;
    return 0;
}

int al_template_save(al_session *s, const struct al_template_id *id, const char *staging,
                     al_error *err)
{
    int r = 0;
    bool python = has_python_kernel(s);
    if (python) {
        const char *mk[] = {"mkdir", "-p", "/workspace", NULL};
        al_exec_opts eo = {.struct_size = sizeof(al_exec_opts), .argv = mk, .timeout_ms = 30000};
        r = al_exec_quiet(s, eo, "making /workspace", err);
    }
    if (r == 0 && python)
        r = python_run(s, WARM_PYTHON, "/workspace", WARM_EXEC_MS,
                       "warming the template's python kernel", err);
    /* The image's own warm-up: the desktop's browser started, its window up. */
    char warm_cmd[256];
    if (r == 0 && al_image_warm_command(&s->img, warm_cmd, sizeof(warm_cmd))) {
        const char *argv[] = {warm_cmd, NULL};
        al_exec_opts eo = {
            .struct_size = sizeof(al_exec_opts), .argv = argv, .timeout_ms = WARM_EXEC_MS};
        r = al_exec_quiet(s, eo, "running the image's warm command", err);
    }
    if (r == 0)
        r = al_session_barrier(s, err);
    if (r == 0 && virDomainSuspend(s->dom) < 0)
        r = al_err_virt(err, -EIO, "cannot pause the template's VM");
    char state[AL_PATH_MAX], disk[AL_PATH_MAX], from[AL_PATH_MAX];
    if (r == 0 && (al_pathf(state, sizeof(state), "%s/state", staging) < 0 ||
                   al_pathf(disk, sizeof(disk), "%s/disk.qcow2", staging) < 0 ||
                   al_pathf(from, sizeof(from), "%s/disk.qcow2", s->state_dir) < 0))
        r = al_err(err, -ENAMETOOLONG, "template path too long");
    if (r == 0)
        r = al_vm_ignore_shared(s->dom, true, "save the template", err);
    if (r == 0) {
        _cleanup_close_ int fd = al_file_create_private(state, O_WRONLY);
        if (fd < 0)
            r = al_err(err, fd, "cannot create '%s': %s", state, strerror(-fd));
        else
            r = al_vm_getfd(s->dom, "airlock-state", fd, err);
    }
    if (r == 0)
        r = al_vm_qmp(s->dom, "save the template",
                      "{\"execute\":\"migrate\",\"arguments\":{\"uri\":\"fd:airlock-state\"}}", -1,
                      NULL, err);
    if (r == 0)
        r = al_vm_migrate_wait(s->dom, "save the template", MIGRATE_MS, err);
    if (r == 0) {
        /* QEMU flushed the disk when the migration completed; it must be gone before the
         * overlay moves out of the session's dir, which closing removes. */
        virDomainDestroy(s->dom);
        if (rename(from, disk) < 0)
            r = al_err(err, -errno, "cannot keep the template's disk: %s", strerror(errno));
    }
    struct al_file_rec recs[NFILES];
    if (r == 0)
        r = seal_files(s, staging, recs, err);
    if (r == 0)
        r = manifest_write(staging, id->key, s, id->mem, id->vcpus, python, recs, err);
    return r;
}

int al_template_commit(const struct al_template_id *id, const char *staging, al_error *err)
{
    remove_others(id->tdir, id->prefix, NULL);
    if (rename(staging, id->dir) < 0)
        return al_err(err, -errno, "cannot move the template into place: %s", strerror(errno));
    return 0;
}

int al_template_replace(const struct al_template_id *id, al_error *err)
{
    char old[AL_PATH_MAX];
    struct stat st;
    if (lstat(id->dir, &st) < 0)
        return 0;
    if (al_pathf(old, sizeof(old), "%s/.old-%s%.16s", id->tdir, id->prefix, id->key) < 0)
        return al_err(err, -ENAMETOOLONG, "template path too long");
    al_rmtree(old);
    if (rename(id->dir, old) < 0)
        return al_err(err, -errno, "cannot replace '%s': %s", id->dir, strerror(errno));
    al_rmtree(old);
    return 0;
}

/* ---- restoring ---- */

static int refresh_request(al_session *s, uint32_t rid, uint8_t *seed, const uint8_t *id,
                           const struct timespec *t, al_error *err);

/* Makes the restored guest its own: host entropy into its kernel RNG, the host's clock, the
 * session's name as hostname, a fresh machine-id, in one REFRESH the agent applies in its own
 * process (guest-agent/refresh.c). */
int al_session_make_unique(al_session *s, al_error *err)
{
    if (!(s->caps & AL_CAP_REFRESH))
        return al_err(err, -ENOTSUP, "the template's agent cannot refresh a restored guest");
    uint8_t seed[AL_REFRESH_SEED], id[AL_MACHINE_ID];
    if (getrandom(seed, sizeof(seed), 0) != sizeof(seed) ||
        getrandom(id, sizeof(id), 0) != sizeof(id))
        return al_err(err, -EIO, "getrandom failed");
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    int r = al_link_ready(s, err);
    uint32_t rid = 0;
    if (r == 0)
        r = al_link_begin(s, -1, &rid, err);
    if (r < 0) {
        explicit_bzero(seed, sizeof(seed));
        return r;
    }
    r = refresh_request(s, rid, seed, id, &now, err);
    al_link_end(s, rid);
    explicit_bzero(seed, sizeof(seed));
    return r;
}

/* The REFRESH frame as request rid, and its answer. */
static int refresh_request(al_session *s, uint32_t rid, uint8_t *seed, const uint8_t *id,
                           const struct timespec *t, al_error *err)
{
    struct timespec now = *t;
    struct al_msg m = {.type = AL_REFRESH, .id = rid};
    m.u.refresh.seed = seed;
    m.u.refresh.sec = (uint64_t)now.tv_sec;
    m.u.refresh.nsec = (uint32_t)now.tv_nsec;
    m.u.refresh.machine_id = id;
    m.u.refresh.hostname = al_str_cstr(s->name);
    int r = al_channel_send(&s->ch, &m, err);
    explicit_bzero(seed, AL_REFRESH_SEED);
    if (r < 0)
        return r;
    r = al_link_recv_until(s, rid, &m, -1, -1, al_now_ms() + REFRESH_MS, err);
    if (r == -ETIMEDOUT && err->code == 0)
        return al_err(err, -ETIMEDOUT, "the agent did not refresh the restored guest in time");
    if (r == 0)
        return al_err(err, -ECANCELED, "cancelled while refreshing the restored guest");
    if (r < 0)
        return r;
    if (m.type == AL_ERROR)
        return al_channel_guest_error(&m, "the restored guest", err);
    if (m.type != AL_OK)
        return al_err(err, -EPROTO, "guest answered a refresh with a %s frame",
                      al_type_name(m.type));
    /* The python kernel reseeds its generators itself before its next block, once it sees the
     * new machine-id (guest-agent/kernels/python.py, reseed_if_restored). */
    return 0;
}

/* A guest that crashes is started again from its live description to load a checkpoint
 * (checkpoint.c): that QEMU boots nothing and waits for no migration, so the restore's
 * -incoming goes. */
static int keep_restart_xml(al_session *s, al_error *err)
{
    char *xml = virDomainGetXMLDesc(s->dom, 0);
    if (!xml)
        return al_err_virt(err, -EIO, "cannot read the VM's description");
    static const char *const args[] = {"<qemu:arg value='-incoming'/>",
                                       "<qemu:arg value='defer'/>"};
    for (size_t i = 0; i < 2; i++) {
        char *at = strstr(xml, args[i]);
        if (!at) {
            free(xml);
            return al_err(err, -EIO, "the restored VM's description lacks %s", args[i]);
        }
        memmove(at, at + strlen(args[i]), strlen(at + strlen(args[i])) + 1);
    }
    return al_checkpoints_set_xml(s, xml);
}

int al_template_restore(al_session *s, struct al_vm_config *cfg, al_error *err)
{
    struct al_template *t = s->tmpl;
    uint64_t t0 = al_now_ms();
    cfg->ram_file = t->path[F_RAM];
    cfg->ram_shared = false;
    cfg->incoming = true;
    _cleanup_free_ char *xml = al_vm_xml(cfg);
    if (!xml)
        return al_err(err, -ENOMEM, "cannot build the domain description");
    s->dom =
        virDomainCreateXML(s->conn, xml, VIR_DOMAIN_START_AUTODESTROY | VIR_DOMAIN_START_PAUSED);
    if (!s->dom)
        return al_err_virt(err, -EIO, "cannot start the VM");
    uint64_t started = al_now_ms();
    /* Connected before the guest runs, so the restored port never sees its host missing. */
    int r = al_link_connect(s, al_now_ms() + RESYNC_MS, err);
    if (r == 0)
        r = al_vm_ignore_shared(s->dom, true, "restore the template", err);
    if (r == 0) {
        _cleanup_close_ int fd = open(t->path[F_STATE], O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
            r = al_err(err, -errno, "cannot open '%s': %s", t->path[F_STATE], strerror(errno));
        else
            r = al_vm_getfd(s->dom, "airlock-state", fd, err);
    }
    if (r == 0)
        r = al_vm_qmp(
            s->dom, "restore the template",
            "{\"execute\":\"migrate-incoming\",\"arguments\":{\"uri\":\"fd:airlock-state\"}}", -1,
            NULL, err);
    if (r == 0)
        r = al_vm_migrate_wait(s->dom, "restore the template", MIGRATE_MS, err);
    /* Off again: a checkpoint's savevm records the capability, and a QEMU started again to load
     * it (crash recovery, checkpoint.c) refuses a stream that says it is on. */
    if (r == 0)
        r = al_vm_ignore_shared(s->dom, false, "restore the template", err);
    if (r == 0 && virDomainResume(s->dom) < 0)
        r = al_err_virt(err, -EIO, "cannot resume the restored VM");
    /* A fork's guest runs what its source ran: the agent keeps those runs (adopted, their
     * output held in the guest) instead of ending them at the handshake. */
    if (t->fork)
        s->hello_flags = AL_HELLO_ADOPT;
    if (r == 0)
        r = al_link_resync(s, RESYNC_MS, err);
    s->hello_flags = 0;
    uint64_t answered = al_now_ms();
    if (r == 0)
        r = t->fork && s->keep_identity ? 0 : al_session_make_unique(s, err);
    if (r == 0 && s->ckpt)
        r = keep_restart_xml(s, err);
    if (r < 0)
        return r;
    s->restored = true;
    s->timing.restore_ms = (unsigned)(al_now_ms() - t0);
    s->timing.start_ms = (unsigned)(started - t0);
    s->timing.handshake_ms = (unsigned)(answered - started);
    return 0;
}

/* ---- listing ---- */

static uint64_t dir_bytes(const char *dir)
{
    uint64_t total = 0;
    for (int i = 0; i <= NFILES; i++) {
        char path[AL_PATH_MAX];
        struct stat st;
        if (al_pathf(path, sizeof(path), "%s/%s", dir, i < NFILES ? FILES[i] : MANIFEST) == 0 &&
            lstat(path, &st) == 0)
            total += (uint64_t)st.st_blocks * 512u;
    }
    return total;
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int al_template_list(void (*fn)(void *ctx, const al_template_info *t), void *ctx, al_error *err)
{
    char tdir[AL_PATH_MAX];
    int r = templates_dir(tdir, sizeof(tdir), err);
    if (r < 0)
        return r;
    DIR *d = opendir(tdir);
    if (!d)
        return al_err(err, -errno, "cannot list '%s': %s", tdir, strerror(errno));
    char **names = NULL;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char **grown = realloc(names, (n + 1) * sizeof(*names));
        if (!grown)
            break;
        names = grown;
        if ((names[n] = strdup(e->d_name)))
            n++;
    }
    closedir(d);
    qsort(names, n, sizeof(*names), name_cmp);
    for (size_t i = 0; i < n; i++) {
        al_template_info info = AL_TEMPLATE_INFO_INIT;
        al_error why = {0};
        if (al_pathf(info.path, sizeof(info.path), "%s/%s", tdir, names[i]) < 0) {
            free(names[i]);
            continue;
        }
        _cleanup_cjson_ cJSON *j = al_manifest_read(info.path, &why);
        if (j) {
            snprintf(info.image, sizeof(info.image), "%s", jstr(j, "image"));
            info.memory_mib = (unsigned)jnum(j, "memory_mib");
            info.vcpus = (unsigned)jnum(j, "vcpus");
            info.kvm = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "kvm"));
            info.python = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "python"));
            info.created = (long long)jnum(j, "created");
            const char *key = jstr(j, "key");
            size_t nl = strlen(names[i]);
            /* The directory is named after its key: a manifest moved between templates is
             * not theirs. Everything is hashed here, the RAM too. */
            if (nl < 16 || strncmp(names[i] + nl - 16, key, 16))
                al_err(&why, -ESTALE, "its manifest names another key");
            else
                files_intact(info.path, j, ~0u, &why);
        } else {
            snprintf(info.image, sizeof(info.image), "%.*s", (int)strcspn(names[i], "-"), names[i]);
        }
        info.bytes = dir_bytes(info.path);
        info.why = why.code ? why.msg : NULL;
        fn(ctx, &info);
        free(names[i]);
    }
    free(names);
    return (int)n;
}

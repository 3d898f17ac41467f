/* Volumes: named disks that outlive sessions, attached to a session's VM and mounted in its
 * guest.
 *
 * A volume is a raw, sparse file in the state dir (volumes/NAME.img, QEMU's, 0600; its record
 * NAME.json, ours). Its size is fixed at creation: the guest cannot make it grow past that on
 * the host. The host never mounts it or reads its file system (the guest's, hostile to the
 * host): the guest's agent makes an ext4 on it the first time it is mounted read-write, and
 * mounts it at the path asked for (volume_mount_script). Who may attach it: read-write one
 * session at a time, read-only any number while none has it read-write. Two locks hold that:
 * ours, a flock on NAME.lock held by the session's handle (exclusive read-write, shared
 * read-only), which answers a refusal with the reason before anything starts; and QEMU's own
 * image locks, which outlive a process of ours that dies (kept sessions). Sessions with
 * volumes boot cold (a template has no such disks). cache=none (writeback on tmpfs), not the
 * root disk's unsafe: a guest's sync must reach the file, since the volume outlives the VM; and
 * a session's end (al_session_stop, the close) unmounts them first, so what it wrote does. */
#include "vols.h"
#include "exec.h"
#include "session.h"
#include "template.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define VOLUMES_DIR "volumes"
#define VOL_SIZE_MIN (1ull << 20)
#define VOL_SIZE_MAX (16ull << 40)
/* mkfs and mount in an emulated guest */
#define MOUNT_MS 120000

static int vol_paths(const char *name, char *img, size_t ilen, char *lock, size_t llen, char *rec,
                     size_t rlen, al_error *err)
{
    if (!al_store_name_ok(name, AL_VOL_NAME_MAX))
        return al_err(err, -EINVAL,
                      "a volume's name is 1 to %d of [A-Za-z0-9._-], not starting with a dot",
                      AL_VOL_NAME_MAX);
    char dir[AL_PATH_MAX];
    int r = al_state_subdir(VOLUMES_DIR, dir, sizeof(dir), err);
    if (r < 0)
        return r;
    if ((img && al_pathf(img, ilen, "%s/%s.img", dir, name) < 0) ||
        (lock && al_pathf(lock, llen, "%s/%s.lock", dir, name) < 0) ||
        (rec && al_pathf(rec, rlen, "%s/%s.json", dir, name) < 0))
        return al_err(err, -ENAMETOOLONG, "state dir path too long");
    return 0;
}

int al_vol_create(const char *name, uint64_t size, al_error *err)
{
    char img[AL_PATH_MAX], lock[AL_PATH_MAX], rec[AL_PATH_MAX];
    int r = vol_paths(name, img, sizeof(img), lock, sizeof(lock), rec, sizeof(rec), err);
    if (r < 0)
        return r;
    if (size < VOL_SIZE_MIN || size > VOL_SIZE_MAX)
        return al_err(err, -EINVAL, "a volume's size is 1 MiB to 16 TiB");
    size = (size + VOL_SIZE_MIN - 1) & ~(VOL_SIZE_MIN - 1);
    /* The record first, created exclusively: it is the name's claim. */
    _cleanup_close_ int rfd = al_file_create_private(rec, O_WRONLY | O_EXCL);
    if (rfd == -EEXIST)
        return al_err(err, -EEXIST, "a volume named '%s' exists", name);
    if (rfd < 0)
        return al_err(err, rfd, "cannot create '%s': %s", rec, strerror(-rfd));
    _cleanup_cjson_ cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "name", name);
    cJSON_AddNumberToObject(j, "size", (double)size);
    cJSON_AddNumberToObject(j, "created", (double)time(NULL));
    _cleanup_free_ char *text = cJSON_PrintUnformatted(j);
    _cleanup_virconn_ virConnectPtr conn = NULL;
    if (!text || write(rfd, text, strlen(text)) != (ssize_t)strlen(text))
        r = al_err(err, -EIO, "cannot write '%s'", rec);
    if (r == 0)
        r = al_vm_connect(NULL, &conn, err);
    if (r == 0) {
        unlink(img);
        _cleanup_close_ int fd = al_file_create_private(img, O_RDWR | O_EXCL);
        if (fd < 0)
            r = al_err(err, fd, "cannot create '%s': %s", img, strerror(-fd));
        else if (ftruncate(fd, (off_t)size) < 0)
            r = al_err(err, -errno, "cannot size '%s': %s", img, strerror(errno));
    }
    /* An empty ext4 made here, on a file nobody else has had: the guests only mount it, so an
     * image without mkfs works too. Lazy: the file stays sparse. */
    if (r == 0) {
        const char *argv[] = {"mkfs.ext4",
                              "-q",
                              "-F",
                              "-m",
                              "0",
                              "-E",
                              "lazy_itable_init=1,lazy_journal_init=1,nodiscard",
                              img,
                              NULL};
        r = al_spawn_quiet(argv, "make the volume's file system", err);
    }
    if (r == 0)
        r = al_disk_give(conn, false, img, err);
    if (r < 0) {
        unlink(img);
        unlink(rec);
    }
    return r;
}

/* Whether the volume's lock is held, and how: 2 read-write, 1 read-only, 0 free. */
static int vol_held(const char *lock)
{
    _cleanup_close_ int fd = open(lock, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return 0;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0)
        return 0;
    return flock(fd, LOCK_SH | LOCK_NB) == 0 ? 1 : 2;
}

int al_vol_list(const char *prefix, void (*fn)(void *ctx, const al_vol_info *v), void *ctx,
                al_error *err)
{
    char dir[AL_PATH_MAX];
    int r = al_state_subdir(VOLUMES_DIR, dir, sizeof(dir), err);
    if (r < 0)
        return r;
    DIR *d = opendir(dir);
    if (!d)
        return al_err(err, -errno, "cannot list '%s': %s", dir, strerror(errno));
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (len < 6 || strcmp(e->d_name + len - 5, ".json") ||
            (prefix && strncmp(e->d_name, prefix, strlen(prefix))))
            continue;
        char name[AL_VOL_NAME_MAX + 1], img[AL_PATH_MAX], lock[AL_PATH_MAX], rec[AL_PATH_MAX];
        snprintf(name, sizeof(name), "%.*s", (int)(len - 5), e->d_name);
        al_error why = {0};
        struct stat st;
        if (vol_paths(name, img, sizeof(img), lock, sizeof(lock), rec, sizeof(rec), &why) < 0 ||
            lstat(img, &st) < 0 || !S_ISREG(st.st_mode))
            continue;
        al_vol_info v = AL_VOL_INFO_INIT;
        snprintf(v.name, sizeof(v.name), "%s", name);
        v.size = (uint64_t)st.st_size;
        v.bytes = (uint64_t)st.st_blocks * 512u;
        v.created = st.st_mtim.tv_sec;
        char buf[512];
        _cleanup_close_ int fd = open(rec, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        ssize_t k = fd >= 0 ? read(fd, buf, sizeof(buf) - 1) : -1;
        if (k > 0) {
            buf[k] = '\0';
            _cleanup_cjson_ cJSON *j = cJSON_Parse(buf);
            const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "created");
            if (cJSON_IsNumber(c))
                v.created = (int64_t)c->valuedouble;
        }
        int held = vol_held(lock);
        v.writer = held == 2;
        v.in_use = held != 0;
        fn(ctx, &v);
        n++;
    }
    closedir(d);
    return n;
}

int al_vol_remove(const char *name, al_error *err)
{
    char img[AL_PATH_MAX], lock[AL_PATH_MAX], rec[AL_PATH_MAX];
    int r = vol_paths(name, img, sizeof(img), lock, sizeof(lock), rec, sizeof(rec), err);
    if (r < 0)
        return r;
    struct stat st;
    if (lstat(rec, &st) < 0)
        return al_err(err, -ENOENT, "no volume named '%s'", name);
    /* Held while removed: nobody attaches it meanwhile. */
    _cleanup_close_ int fd = al_file_create_private(lock, O_RDWR);
    if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) < 0)
        return al_err(err, -EBUSY, "volume '%s' is attached to a session", name);
    unlink(rec);
    unlink(img);
    unlink(lock);
    return 0;
}

/* "NAME:/PATH[:ro|:rw]" into v; the path absolute, normal (no "." or ".." parts, no "//", not
 * "/"), of printable characters, at most 255 bytes. */
static int vol_spec(const char *spec, struct al_vol_att *v, al_error *err)
{
    const char *colon = spec ? strchr(spec, ':') : NULL;
    if (!colon || (size_t)(colon - spec) > AL_VOL_NAME_MAX)
        return al_err(err, -EINVAL, "a volume is NAME:/PATH[:ro], not '%s'", spec ? spec : "");
    snprintf(v->name, sizeof(v->name), "%.*s", (int)(colon - spec), spec);
    const char *path = colon + 1, *mode = strrchr(path, ':');
    size_t plen = strlen(path);
    v->read_only = false;
    if (mode && (!strcmp(mode, ":ro") || !strcmp(mode, ":rw"))) {
        v->read_only = !strcmp(mode, ":ro");
        plen = (size_t)(mode - path);
    }
    if (plen < 2 || plen > 255 || path[0] != '/' || path[plen - 1] == '/')
        return al_err(err, -EINVAL, "volume '%s': its path is absolute, not '/'", v->name);
    snprintf(v->path, sizeof(v->path), "%.*s", (int)plen, path);
    for (const char *p = v->path; *p; p++)
        if ((unsigned char)*p < 0x21 || *p == 0x7f || *p == ':')
            return al_err(err, -EINVAL,
                          "volume '%s': its path has a space, a control "
                          "character or a colon",
                          v->name);
    if (strstr(v->path, "//") || strstr(v->path, "/./") || strstr(v->path, "/../") ||
        !strcmp(v->path + plen - 2, "/.") || !strcmp(v->path + plen - 3, "/.."))
        return al_err(err, -EINVAL, "volume '%s': its path is not normal", v->name);
    return 0;
}

/* The volume's lock, taken as v asks (-EBUSY: held otherwise). */
static int vol_lock(struct al_vol_att *v, al_error *err)
{
    char lock[AL_PATH_MAX];
    int r = vol_paths(v->name, NULL, 0, lock, sizeof(lock), NULL, 0, err);
    if (r < 0)
        return r;
    v->lock_fd = al_file_create_private(lock, O_RDWR);
    if (v->lock_fd < 0)
        return al_err(err, v->lock_fd, "cannot lock volume '%s'", v->name);
    if (flock(v->lock_fd, (v->read_only ? LOCK_SH : LOCK_EX) | LOCK_NB) < 0)
        return al_err(err, -EBUSY,
                      v->read_only ? "volume '%s' is attached read-write to another session"
                                   : "volume '%s' is attached to another session",
                      v->name);
    return 0;
}

int al_vols_attach(al_session *s, enum al_transport kind, const char *const *specs, al_error *err)
{
    size_t n = 0;
    while (specs && specs[n])
        n++;
    if (!n)
        return 0;
    if (n > AL_VOLS_MAX)
        return al_err(err, -E2BIG, "at most %d volumes", AL_VOLS_MAX);
    if (s->remote || kind != AL_TRANSPORT_VIRTIO)
        return al_err(err, -EOPNOTSUPP,
                      "volumes are this host's, for sessions over virtio-serial here");
    for (size_t i = 0; i < n; i++) {
        struct al_vol_att *v = &s->vols[i];
        v->lock_fd = -1;
        int r = vol_spec(specs[i], v, err);
        if (r < 0)
            return r;
        for (size_t k = 0; k < i; k++)
            if (!strcmp(s->vols[k].name, v->name) || !strcmp(s->vols[k].path, v->path))
                return al_err(err, -EINVAL, "volume '%s' or path '%s' twice", v->name, v->path);
        char rec[AL_PATH_MAX], lock[AL_PATH_MAX];
        struct stat st;
        r = vol_paths(v->name, v->disk, sizeof(v->disk), lock, sizeof(lock), rec, sizeof(rec), err);
        if (r < 0)
            return r;
        if (lstat(rec, &st) < 0 || lstat(v->disk, &st) < 0)
            return al_err(err, -ENOENT, "no volume named '%s'", v->name);
        s->nvols = i + 1;
        r = vol_lock(v, err);
        if (r < 0)
            return r;
        v->size = (uint64_t)st.st_size;
        /* Read-only: a throwaway overlay of its own over it, which QEMU opens read-only (so
         * QEMU's lock keeps a writer out too); a journal a writer's crash left is replayed
         * into the overlay, never into the volume. */
        if (v->read_only) {
            snprintf(v->backing, sizeof(v->backing), "%s", v->disk);
            if (al_pathf(v->disk, sizeof(v->disk), "%s/vol-%zu.qcow2", s->state_dir, i) < 0)
                return al_err(err, -ENAMETOOLONG, "session path too long");
            r = al_disk_overlay_sized(s->conn, s->kvm, v->backing, "raw", v->size, v->disk, err);
            if (r < 0)
                return r;
        }
    }
    return 0;
}

int al_vols_of_fork(al_session *s, const struct al_fork_save *fs, al_error *err)
{
    for (size_t i = 0; i < fs->nvols; i++) {
        const struct al_fork_vol *fv = &fs->vols[i];
        struct al_vol_att *v = &s->vols[i];
        *v = (struct al_vol_att){.read_only = fv->read_only, .size = fv->size, .lock_fd = -1};
        snprintf(v->name, sizeof(v->name), "%s", fv->name);
        snprintf(v->path, sizeof(v->path), "%s", fv->path);
        s->nvols = i + 1;
        char copy[AL_PATH_MAX];
        if (al_pathf(copy, sizeof(copy), "%s/vol%zu.%s", fs->dir, i,
                     fv->read_only ? "qcow2" : "raw") < 0 ||
            al_pathf(v->disk, sizeof(v->disk), "%s/vol-%zu.qcow2", s->state_dir, i) < 0)
            return al_err(err, -ENAMETOOLONG, "session path too long");
        int r;
        if (fv->read_only) { /* still a reader of the volume itself */
            r = vol_paths(v->name, v->backing, sizeof(v->backing), NULL, 0, NULL, 0, err);
            if (r == 0)
                r = vol_lock(v, err);
            if (r < 0)
                return r;
            snprintf(v->mid, sizeof(v->mid), "%s", copy);
            r = al_disk_overlay_sized(s->conn, s->kvm, v->mid, "qcow2", v->size, v->disk, err);
        } else { /* its own copy-on-write copy of the source's as it was */
            snprintf(v->backing, sizeof(v->backing), "%s", copy);
            r = al_disk_overlay_sized(s->conn, s->kvm, v->backing, "raw", v->size, v->disk, err);
        }
        if (r < 0)
            return r;
    }
    return 0;
}

void al_vols_release(al_session *s)
{
    for (size_t i = 0; i < s->nvols; i++)
        if (s->vols[i].lock_fd >= 0) {
            close(s->vols[i].lock_fd);
            s->vols[i].lock_fd = -1;
        }
    s->nvols = 0;
}

/* Whether path's file system takes O_DIRECT (tmpfs does not); "" or NULL: nothing to ask. */
static bool direct_ok(const char *path)
{
    if (!path || !path[0])
        return true;
    int fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return false;
    close(fd);
    return true;
}

void al_vols_config(al_session *s, struct al_vm_config *cfg)
{
    cfg->nvols = s->nvols;
    for (size_t i = 0; i < s->nvols; i++) {
        cfg->vols[i].disk = s->vols[i].disk;
        cfg->vols[i].mid = s->vols[i].mid[0] ? s->vols[i].mid : NULL;
        cfg->vols[i].backing = s->vols[i].backing[0] ? s->vols[i].backing : NULL;
        cfg->vols[i].read_only = s->vols[i].read_only;
        cfg->vols[i].direct = direct_ok(s->vols[i].disk) && direct_ok(s->vols[i].mid) &&
                              direct_ok(s->vols[i].backing);
    }
}

/* Finds the disk by its serial and mounts it (read-only: mounted so; its journal replayed into
 * the session's own overlay). */
static const char MOUNT_SH[] =
    "set -e; want=airlock-vol-$1; dev=;"
    " for b in /sys/block/vd*; do"
    "  [ \"$(cat \"$b/serial\" 2>/dev/null)\" = \"$want\" ] && dev=/dev/${b##*/};"
    " done;"
    " [ -n \"$dev\" ] || { echo \"the volume's disk is not in the guest\" >&2; exit 1; };"
    " mkdir -p \"$2\"; mount -t ext4 -o \"$3\" \"$dev\" \"$2\" 2>/dev/null ||"
    " { echo \"cannot mount it: $(dmesg 2>/dev/null | tail -n 1)\" >&2; exit 1; }";

static const char UMOUNT_SH[] = "sync; umount \"$1\" 2>/dev/null || true";

void al_vols_unmount(al_session *s)
{
    for (size_t i = 0; i < s->nvols; i++) {
        if (s->vols[i].read_only)
            continue;
        const char *argv[] = {"/bin/sh", "-c", UMOUNT_SH, "sh", s->vols[i].path, NULL};
        al_exec_opts o = {.struct_size = sizeof(al_exec_opts), .argv = argv, .timeout_ms = 5000};
        al_error ignored = {0};
        al_exec_quiet(s, o, "unmounting a volume", &ignored);
    }
}

int al_vols_mount(al_session *s, al_error *err)
{
    for (size_t i = 0; i < s->nvols; i++) {
        struct al_vol_att *v = &s->vols[i];
        char idx[24];
        snprintf(idx, sizeof(idx), "%zu", i);
        const char *argv[] = {
            "/bin/sh", "-c", MOUNT_SH, "sh", idx, v->path, v->read_only ? "ro" : "rw", NULL};
        al_exec_opts o = {
            .struct_size = sizeof(al_exec_opts), .argv = argv, .timeout_ms = MOUNT_MS};
        char what[200];
        snprintf(what, sizeof(what), "mounting volume '%s' at %s", v->name, v->path);
        int r = al_exec_quiet(s, o, what, err);
        if (r < 0)
            return r;
    }
    return 0;
}

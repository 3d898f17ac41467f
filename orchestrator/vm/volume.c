/* Storage on a remote host (a session whose libvirt connection reaches another machine): nothing
 * of the domain may live on our disk there, so everything QEMU opens is a volume in one storage
 * pool, "airlock" (a dir pool at POOL_PATH on that host), made and filled through the libvirt
 * connection alone:
 *
 * - the image's parts (kernel, initrd, root disk base), uploaded once per host and version with
 *   virStorageVolUpload, then read back with virStorageVolDownload and checked against the
 *   SHA-256 taken while sending. A "<image>-<version>.ready" marker volume, made last, says the
 *   set is complete; a set without it (a crash mid-upload) is uploaded again. The version is a
 *   hash of the image's manifest and its files' sizes and modification times, so a rebuilt image
 *   gets new volumes and old ones stay until somebody removes them;
 * - each session's overlay (and scratch disk for checkpoints), a qcow2 volume on the base volume,
 *   owned by QEMU's user on that host, mode 0600, deleted at close, reaped by gc when its session
 *   is gone (al_volume_reap).
 *
 * Uploads by the processes of this machine take turns on a flock in the state dir; two machines
 * uploading the same image to one host at once are not coordinated. */
#include "session.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#define POOL_NAME "airlock"
#define POOL_PATH "/var/lib/libvirt/airlock"
#define CHUNK (1u << 20)
/* Image volumes are named IMAGE_PREFIX<image>-<version>.<part>; gc never touches them. */
#define IMAGE_PREFIX "image-"

bool al_conn_remote(virConnectPtr conn)
{
    _cleanup_free_ char *uri = conn ? virConnectGetURI(conn) : NULL;
    if (!uri)
        return false;
    /* qemu+tcp://HOST/system names a host; qemu:///system and qemu+unix:///system do not. */
    const char *p = strstr(uri, "://");
    return p && p[3] && p[3] != '/';
}

AL_DEFINE_CLEANUP(evp_freep, EVP_MD_CTX *, EVP_MD_CTX_free)

AL_DEFINE_CLEANUP(vol_freep, virStorageVolPtr, virStorageVolFree)

AL_DEFINE_CLEANUP(pool_freep, virStoragePoolPtr, virStoragePoolFree)

AL_DEFINE_CLEANUP(stream_freep, virStreamPtr, virStreamFree)

/* The host's pool, defined (autostarted) and started when it is not. */
static int pool_get(virConnectPtr conn, virStoragePoolPtr *out, al_error *err)
{
    virStoragePoolPtr p = virStoragePoolLookupByName(conn, POOL_NAME);
    if (!p) {
        static const char xml[] =
            "<pool type='dir'><name>" POOL_NAME "</name><target><path>" POOL_PATH
            "</path><permissions><mode>0711</mode></permissions></target>"
            "</pool>";
        p = virStoragePoolDefineXML(conn, xml, 0);
        if (p) {
            virStoragePoolBuild(p, 0); /* the dir; it may exist already */
            virStoragePoolSetAutostart(p, 1);
        } else if (!(p = virStoragePoolLookupByName(conn, POOL_NAME))) { /* not a race either */
            return al_err_virt(err, -EIO, "cannot define the storage pool '" POOL_NAME "'");
        }
    }
    if (virStoragePoolIsActive(p) != 1 && virStoragePoolCreate(p, 0) < 0 &&
        virStoragePoolIsActive(p) != 1) {
        int r = al_err_virt(err, -EIO, "cannot start the storage pool '" POOL_NAME "'");
        virStoragePoolFree(p);
        return r;
    }
    *out = p;
    return 0;
}

/* The image's version: what identifies its content without reading it all. */
static int image_version(const al_image *img, char out[17], al_error *err)
{
    char manifest[AL_PATH_MAX];
    if (al_pathf(manifest, sizeof(manifest), "%s/manifest.json", img->dir) < 0)
        return al_err(err, -ENAMETOOLONG, "image path too long");
    __attribute__((cleanup(evp_freep))) EVP_MD_CTX *md = EVP_MD_CTX_new();
    if (!md || !EVP_DigestInit_ex(md, EVP_sha256(), NULL))
        return al_err(err, -ENOMEM, "out of memory");
    _cleanup_close_ int fd = open(manifest, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return al_err(err, -errno, "cannot read '%s': %s", manifest, strerror(errno));
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof(buf))) > 0)
        EVP_DigestUpdate(md, buf, (size_t)n);
    const char *parts[] = {img->kernel, img->initrd, img->disk};
    for (size_t i = 0; i < 3; i++) {
        struct stat st = {0};
        if (*parts[i] && stat(parts[i], &st) < 0)
            return al_err(err, -errno, "cannot stat '%s': %s", parts[i], strerror(errno));
        int len = snprintf(buf, sizeof(buf), "|%s|%lld|%lld.%09ld", strrchr(parts[i], '/') ?: "",
                           (long long)st.st_size, (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
        EVP_DigestUpdate(md, buf, (size_t)len);
    }
    unsigned char d[32];
    EVP_DigestFinal_ex(md, d, NULL);
    al_hexify(d, 8, out);
    return 0;
}

/* The bytes of a volume as its host sees them, into a SHA-256. */
static int download_hash(virConnectPtr conn, virStorageVolPtr vol, uint64_t size, char out[65],
                         al_error *err)
{
    __attribute__((cleanup(stream_freep))) virStreamPtr st = virStreamNew(conn, 0);
    __attribute__((cleanup(evp_freep))) EVP_MD_CTX *md = EVP_MD_CTX_new();
    if (!st || !md || !EVP_DigestInit_ex(md, EVP_sha256(), NULL))
        return al_err(err, -ENOMEM, "out of memory");
    _cleanup_free_ char *buf = malloc(CHUNK);
    if (!buf)
        return al_err(err, -ENOMEM, "out of memory");
    if (virStorageVolDownload(vol, st, 0, size, 0) < 0)
        return al_err_virt(err, -EIO, "cannot read back volume '%s'", virStorageVolGetName(vol));
    int n;
    while ((n = virStreamRecv(st, buf, CHUNK)) > 0)
        EVP_DigestUpdate(md, buf, (size_t)n);
    if (n < 0 || virStreamFinish(st) < 0) {
        virStreamAbort(st);
        return al_err_virt(err, -EIO, "cannot read back volume '%s'", virStorageVolGetName(vol));
    }
    unsigned char d[32];
    EVP_DigestFinal_ex(md, d, NULL);
    al_hexify(d, 32, out);
    return 0;
}

/* One file into a new volume of that name (an old one is replaced), checked by reading it
 * back. Called with the upload lock held. */
static int upload(virConnectPtr conn, virStoragePoolPtr pool, const char *volname, const char *path,
                  al_error *err)
{
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0)
        return al_err(err, -errno, "cannot read '%s': %s", path, strerror(errno));
    __attribute__((cleanup(vol_freep))) virStorageVolPtr old =
        virStorageVolLookupByName(pool, volname);
    if (old)
        virStorageVolDelete(old, 0);
    char xml[512];
    snprintf(xml, sizeof(xml),
             "<volume><name>%s</name><capacity unit='bytes'>%lld</capacity>"
             "<allocation>0</allocation><target><format type='raw'/><permissions>"
             "<mode>0644</mode></permissions></target></volume>",
             volname, (long long)st.st_size);
    __attribute__((cleanup(vol_freep))) virStorageVolPtr vol = virStorageVolCreateXML(pool, xml, 0);
    if (!vol)
        return al_err_virt(err, -EIO, "cannot create volume '%s'", volname);
    __attribute__((cleanup(stream_freep))) virStreamPtr s = virStreamNew(conn, 0);
    __attribute__((cleanup(evp_freep))) EVP_MD_CTX *md = EVP_MD_CTX_new();
    _cleanup_free_ char *buf = malloc(CHUNK);
    if (!s || !md || !buf || !EVP_DigestInit_ex(md, EVP_sha256(), NULL))
        return al_err(err, -ENOMEM, "out of memory");
    if (virStorageVolUpload(vol, s, 0, (unsigned long long)st.st_size, 0) < 0)
        return al_err_virt(err, -EIO, "cannot upload '%s'", path);
    ssize_t n;
    while ((n = read(fd, buf, CHUNK)) > 0) {
        EVP_DigestUpdate(md, buf, (size_t)n);
        for (ssize_t off = 0; off < n;) {
            int w = virStreamSend(s, buf + off, (size_t)(n - off));
            if (w < 0) {
                virStreamAbort(s);
                return al_err_virt(err, -EIO, "cannot upload '%s'", path);
            }
            off += w;
        }
    }
    if (n < 0 || virStreamFinish(s) < 0) {
        virStreamAbort(s);
        return n < 0 ? al_err(err, -errno, "cannot read '%s': %s", path, strerror(errno))
                     : al_err_virt(err, -EIO, "cannot upload '%s'", path);
    }
    unsigned char d[32];
    char sent[65], got[65];
    EVP_DigestFinal_ex(md, d, NULL);
    al_hexify(d, 32, sent);
    int r = download_hash(conn, vol, (uint64_t)st.st_size, got, err);
    if (r == 0 && strcmp(sent, got) != 0)
        r = al_err(err, -EIO, "the upload of '%s' did not verify (sha256 %s sent, %s stored)", path,
                   sent, got);
    if (r < 0)
        virStorageVolDelete(vol, 0);
    return r;
}

static int vol_path(virStoragePoolPtr pool, const char *name, char **out, al_error *err)
{
    __attribute__((cleanup(vol_freep))) virStorageVolPtr v = virStorageVolLookupByName(pool, name);
    *out = v ? virStorageVolGetPath(v) : NULL;
    if (!*out)
        return al_err_virt(err, -ENOENT, "cannot find volume '%s'", name);
    return 0;
}

/* The upload lock: one per machine, in the state dir. */
static int upload_lock(al_error *err)
{
    char state[AL_PATH_MAX], path[AL_PATH_MAX];
    int r = al_state_dir(state, sizeof(state), err);
    if (r < 0)
        return r;
    if (al_pathf(path, sizeof(path), "%s/upload.lock", state) < 0)
        return al_err(err, -ENAMETOOLONG, "state path too long");
    int fd = al_lock_file(path);
    if (fd < 0)
        return al_err(err, fd, "cannot lock '%s': %s", path, strerror(-fd));
    return fd;
}

int al_volume_image(virConnectPtr conn, const al_image *img, al_image *out, bool *uploaded,
                    al_error *err)
{
    *uploaded = false;
    char ver[17], base[128], ready[160];
    int r = image_version(img, ver, err);
    if (r < 0)
        return r;
    snprintf(base, sizeof(base), IMAGE_PREFIX "%s-%s", img->name, ver);
    snprintf(ready, sizeof(ready), "%s.ready", base);
    __attribute__((cleanup(pool_freep))) virStoragePoolPtr pool = NULL;
    r = pool_get(conn, &pool, err);
    if (r < 0)
        return r;
    const char *suffix[] = {".kernel", ".initrd", ".disk"};
    const char *src[] = {img->kernel, img->initrd, img->disk};
    __attribute__((cleanup(vol_freep))) virStorageVolPtr mark =
        virStorageVolLookupByName(pool, ready);
    if (!mark) {
        _cleanup_close_ int lock = upload_lock(err);
        if (lock < 0)
            return lock;
        virStoragePoolRefresh(pool, 0);
        mark = virStorageVolLookupByName(pool, ready);
        for (size_t i = 0; !mark && i < 3; i++) {
            char name[200];
            snprintf(name, sizeof(name), "%s%s", base, suffix[i]);
            if (*src[i] && (r = upload(conn, pool, name, src[i], err)) < 0)
                return r;
        }
        if (!mark) {
            char xml[300];
            snprintf(xml, sizeof(xml),
                     "<volume><name>%s</name><capacity>0</capacity><target><format "
                     "type='raw'/></target></volume>",
                     ready);
            mark = virStorageVolCreateXML(pool, xml, 0);
            if (!mark)
                return al_err_virt(err, -EIO, "cannot create volume '%s'", ready);
            *uploaded = true;
        }
    }
    *out = *img;
    out->dir = out->kernel = out->initrd = out->disk = NULL;
    /* The defaults are the same on every host: copies of the local image's. */
    out->env = img->env ? al_strv_dup((const char *const *)img->env) : NULL;
    out->cmd = img->cmd ? al_strv_dup((const char *const *)img->cmd) : NULL;
    out->workdir = strdup(img->workdir ? img->workdir : "");
    out->user = strdup(img->user ? img->user : "");
    bool oom = (img->env && !out->env) || (img->cmd && !out->cmd) || !out->workdir || !out->user;
    char *paths[3] = {NULL, NULL, NULL};
    for (size_t i = 0; i < 3; i++) {
        char name[200];
        snprintf(name, sizeof(name), "%s%s", base, suffix[i]);
        if (*src[i] ? (r = vol_path(pool, name, &paths[i], err)) < 0 : !(paths[i] = strdup("")))
            break;
    }
    out->kernel = paths[0];
    out->initrd = paths[1];
    out->disk = paths[2];
    out->dir = strdup(POOL_PATH);
    if (r == 0 && (oom || !out->dir || !out->kernel || !out->initrd || !out->disk))
        r = al_err(err, -ENOMEM, "out of memory");
    if (r < 0)
        al_image_free(out);
    return r;
}

int al_host_images(const char *uri, void (*fn)(void *ctx, const al_host_image *hi), void *ctx,
                   al_error *err)
{
    _cleanup_virconn_ virConnectPtr conn = NULL;
    int r = al_vm_connect(uri, &conn, err);
    if (r < 0)
        return r;
    __attribute__((cleanup(pool_freep))) virStoragePoolPtr pool =
        virStoragePoolLookupByName(conn, POOL_NAME);
    if (!pool)
        return 0; /* nothing was ever uploaded there */
    virStoragePoolRefresh(pool, 0);
    virStorageVolPtr *vols = NULL;
    int n = virStoragePoolListAllVolumes(pool, &vols, 0);
    if (n < 0)
        return al_err_virt(err, -EIO, "cannot list the volumes of pool '" POOL_NAME "'");
    int found = 0;
    for (int i = 0; i < n; i++) {
        /* image-NAME-VERSION.ready: NAME may hold '-', VERSION is the 16 hex digits before. */
        const char *name = virStorageVolGetName(vols[i]);
        size_t len = name ? strlen(name) : 0, pre = strlen(IMAGE_PREFIX), suf = strlen(".ready");
        if (len < pre + 1 + 1 + 16 + suf || strncmp(name, IMAGE_PREFIX, pre) ||
            strcmp(name + len - suf, ".ready") || name[len - suf - 17] != '-' ||
            len - pre - suf - 17 >= 64)
            continue;
        char image[64], version[17], base[200];
        snprintf(image, sizeof(image), "%.*s", (int)(len - pre - suf - 17), name + pre);
        snprintf(version, sizeof(version), "%.16s", name + len - suf - 16);
        snprintf(base, sizeof(base), "%.*s", (int)(len - suf), name);
        al_host_image hi = {
            .struct_size = sizeof(al_host_image), .image = image, .version = version};
        const char *suffix[] = {".kernel", ".initrd", ".disk"};
        for (size_t k = 0; k < 3; k++) {
            char part[220];
            snprintf(part, sizeof(part), "%s%s", base, suffix[k]);
            __attribute__((cleanup(vol_freep))) virStorageVolPtr v =
                virStorageVolLookupByName(pool, part);
            virStorageVolInfo info;
            if (v && virStorageVolGetInfo(v, &info) == 0)
                hi.bytes += info.allocation;
        }
        al_image local = AL_IMAGE_INIT;
        char have[17];
        al_error ignored = {0};
        hi.current = al_image_load(image, &local, &ignored) == 0 &&
                     image_version(&local, have, &ignored) == 0 && !strcmp(have, version);
        al_image_free(&local);
        fn(ctx, &hi);
        found++;
    }
    for (int i = 0; i < n; i++)
        virStorageVolFree(vols[i]);
    free(vols);
    return found;
}

/* A qcow2's virtual size, from its header (big-endian, at offset 24). */
static int qcow2_size(const char *path, uint64_t *out, al_error *err)
{
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
    unsigned char h[32];
    if (fd < 0 || pread(fd, h, sizeof(h), 0) != (ssize_t)sizeof(h) || memcmp(h, "QFI\xfb", 4))
        return al_err(err, -EINVAL, "'%s' is not a qcow2 image", path);
    uint64_t v = 0;
    for (int i = 24; i < 32; i++)
        v = v << 8 | h[i];
    *out = v;
    return 0;
}

int al_volume_create(virConnectPtr conn, bool kvm, const char *name, uint64_t size,
                     const char *backing_local, const char *backing, char **path, al_error *err)
{
    __attribute__((cleanup(pool_freep))) virStoragePoolPtr pool = NULL;
    int r = pool_get(conn, &pool, err);
    if (r < 0)
        return r;
    if (backing_local && (r = qcow2_size(backing_local, &size, err)) < 0)
        return r;
    uid_t uid;
    gid_t gid;
    r = al_qemu_owner(conn, kvm, &uid, &gid, err);
    if (r < 0)
        return r;
    char *xml = NULL;
    if (asprintf(&xml,
                 "<volume><name>%s</name><capacity unit='bytes'>%llu</capacity><target><format "
                 "type='qcow2'/><permissions><owner>%lu</owner><group>%lu</group><mode>0600</mode>"
                 "</permissions></target>%s%s%s</volume>",
                 name, (unsigned long long)size, (unsigned long)uid, (unsigned long)gid,
                 backing ? "<backingStore><path>" : "", backing ? backing : "",
                 backing ? "</path><format type='qcow2'/></backingStore>" : "") < 0)
        return al_err(err, -ENOMEM, "out of memory");
    __attribute__((cleanup(vol_freep))) virStorageVolPtr v = virStorageVolCreateXML(pool, xml, 0);
    free(xml);
    if (!v)
        return al_err_virt(err, -EIO, "cannot create volume '%s'", name);
    *path = virStorageVolGetPath(v);
    if (!*path) {
        virStorageVolDelete(v, 0);
        return al_err_virt(err, -EIO, "cannot find volume '%s'", name);
    }
    return 0;
}

void al_volume_delete(virConnectPtr conn, const char *name)
{
    __attribute__((cleanup(pool_freep))) virStoragePoolPtr pool =
        virStoragePoolLookupByName(conn, POOL_NAME);
    __attribute__((cleanup(vol_freep))) virStorageVolPtr v =
        pool ? virStorageVolLookupByName(pool, name) : NULL;
    if (v)
        virStorageVolDelete(v, 0);
}

uint64_t al_volume_allocation(virConnectPtr conn, const char *name)
{
    __attribute__((cleanup(pool_freep))) virStoragePoolPtr pool =
        virStoragePoolLookupByName(conn, POOL_NAME);
    __attribute__((cleanup(vol_freep))) virStorageVolPtr v =
        pool ? virStorageVolLookupByName(pool, name) : NULL;
    virStorageVolInfo info;
    return v && virStorageVolGetInfo(v, &info) == 0 ? info.allocation : 0;
}

int al_volume_reap(virConnectPtr conn, bool (*dead)(void *ctx, const char *session), void *ctx)
{
    __attribute__((cleanup(pool_freep))) virStoragePoolPtr pool =
        virStoragePoolLookupByName(conn, POOL_NAME);
    virStorageVolPtr *vols = NULL;
    int n = pool ? virStoragePoolListAllVolumes(pool, &vols, 0) : 0;
    int reaped = 0;
    for (int i = 0; i < n; i++) {
        const char *name = virStorageVolGetName(vols[i]);
        char session[64];
        size_t len = name ? strcspn(name, ".") : 0;
        /* airlock-<12 hex>.qcow2 and airlock-<12 hex>.scratch.qcow2: a session's. */
        if (len && len < sizeof(session) &&
            !strncmp(name, AL_DOMAIN_PREFIX, strlen(AL_DOMAIN_PREFIX))) {
            memcpy(session, name, len);
            session[len] = '\0';
            virDomainPtr d = virDomainLookupByName(conn, session);
            if (d)
                virDomainFree(d);
            else if (dead(ctx, session) && virStorageVolDelete(vols[i], 0) == 0)
                reaped++;
        }
        virStorageVolFree(vols[i]);
    }
    free(vols);
    return reaped;
}

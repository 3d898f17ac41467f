/* Sessions that outlive their process (al_session_opts.keep): a daemon restarted,
 * upgraded or killed takes its sessions back, and a session can be paused to disk and resumed.
 *
 * A kept session's domain is started without AUTODESTROY; both its dirs carry a mark (keep,
 * AL_KEEP_MARK) that gc respects until the session's lifetime ends; its state dir holds the
 * record (kept.json, 0600) of what a new handle needs: the keeper, the image, the transport, the
 * disk budget, whether it has a display or checkpoints, and, while paused, the saved state's size,
 * SHA-256 and the QEMU it was saved by. Everything else comes back from libvirt (the domain by
 * name) and the agent (a handshake with AL_HELLO_ADOPT, which hands over the runs it kept while
 * no host was connected: guest-agent/agent_loop.c, requests_orphan). Pausing is libvirt's save
 * (virDomainSaveFlags: memory and device state into one file, the QEMU process gone); resuming
 * checks that file against the record before libvirt reads a byte of it. */
#include "keep.h"

#include "budget.h"
#include "checkpoint.h"
#include "link.h"
#include "proc.h"
#include "screen.h"
#include "template.h"
#include "transport.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define RECORD_MAX (64 * 1024)
#define SAVED "paused.save"
/* The handshake with a VM taken back or resumed (the resync of link.c: stale bytes dropped, a
 * fresh HELLO every few seconds); a restored guest under emulation runs its first instructions
 * slowly. */
#define REATTACH_MS 30000
/* A pause waits this long for the requests in flight to let go of the channel. */
#define PAUSE_WAIT_MS 5000

/* A session's name as al_session_open makes it: AL_DOMAIN_PREFIX and 12 hex digits. */
static bool name_ok(const char *name)
{
    size_t p = strlen(AL_DOMAIN_PREFIX);
    if (!name || strncmp(name, AL_DOMAIN_PREFIX, p) != 0 || strlen(name) != p + 12)
        return false;
    for (size_t i = p; name[i]; i++)
        if (!isxdigit((unsigned char)name[i]))
            return false;
    return true;
}

/* A file of ours in dir: a regular file this user owns, nobody else may write or (mode_max
 * 0600) read, not larger than max; its fd. */
static int open_ours(const char *path, mode_t forbidden, off_t max, struct stat *st, al_error *err)
{
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return al_err(err, -errno, "cannot open '%s': %s", path, strerror(errno));
    if (fstat(fd, st) < 0 || !S_ISREG(st->st_mode) || st->st_uid != geteuid() ||
        (st->st_mode & forbidden) || st->st_nlink != 1 || (max && st->st_size > max)) {
        close(fd);
        return al_err(err, -EBADMSG,
                      "'%s' is not this user's private file (changed behind our back?)", path);
    }
    return fd;
}

static int record_read(const char *state_dir, cJSON **out, al_error *err)
{
    char path[AL_PATH_MAX];
    if (al_pathf(path, sizeof(path), "%s/" AL_KEEP_RECORD, state_dir) < 0)
        return al_err(err, -ENAMETOOLONG, "session path too long");
    struct stat st;
    _cleanup_close_ int fd = open_ours(path, 022, RECORD_MAX, &st, err);
    if (fd < 0)
        return fd;
    char buf[RECORD_MAX + 1];
    ssize_t n = read(fd, buf, RECORD_MAX);
    if (n < 0)
        return al_err(err, -errno, "cannot read '%s': %s", path, strerror(errno));
    buf[n] = '\0';
    *out = cJSON_Parse(buf);
    if (!*out || !cJSON_IsObject(*out)) {
        cJSON_Delete(*out);
        *out = NULL;
        return al_err(err, -EBADMSG, "'%s' is not a session record", path);
    }
    return 0;
}

static const char *jstr(const cJSON *j, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static double jnum(const cJSON *j, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

static bool jbool(const cJSON *j, const char *key)
{
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, key));
}

/* Takes the lock of an existing session dir: -EBUSY when a live process holds it. */
static int lock_dir(const char *dir, int *lock_fd, al_error *err)
{
    char lock[AL_PATH_MAX];
    if (al_pathf(lock, sizeof(lock), "%s/lock", dir) < 0)
        return al_err(err, -ENAMETOOLONG, "session path too long");
    int fd = open(lock, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return al_err(err, -errno, "cannot open '%s': %s", lock, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        close(fd);
        return al_err(err, -EBUSY, "the session is held by another process");
    }
    *lock_fd = fd;
    return 0;
}

static int saved_path(const al_session *s, char *buf, size_t len, al_error *err)
{
    if (al_pathf(buf, len, "%s/" SAVED, s->state_dir) < 0)
        return al_err(err, -ENAMETOOLONG, "session path too long");
    return 0;
}

/* The agent of a running VM, taken back: a new connection, the handshake that adopts the runs
 * it kept, the guest made its own again when it was restored (resume). */
static int attach_agent(al_session *s, bool restored, al_error *err)
{
    s->hello_flags = AL_HELLO_ADOPT;
    int r = al_link_connect(s, al_now_ms() + REATTACH_MS, err);
    if (r == 0)
        r = al_link_resync(s, REATTACH_MS, err);
    s->hello_flags = 0;
    if (r == 0 && restored)
        r = al_session_make_unique(s, err);
    if (r == 0 && s->ckpt) {
        char *xml = virDomainGetXMLDesc(s->dom, 0);
        if (xml)
            al_checkpoints_set_xml(s, xml);
    }
    if (r == 0)
        r = al_budget_start(s, err);
    return r;
}

/* The rest of a handle for the session whose dirs s holds, from its record. */
static int reattach_from(al_session *s, const cJSON *rec, const char *connect_uri, al_error *err)
{
    snprintf(s->keeper, sizeof(s->keeper), "%s", jstr(rec, "keeper"));
    s->keep_expires = (int64_t)jnum(rec, "expires");
    s->kind = (enum al_transport)(int)jnum(rec, "transport");
    s->disk_budget = (uint64_t)jnum(rec, "disk_budget");
    s->kvm = jbool(rec, "kvm");
    if (s->kind != AL_TRANSPORT_VIRTIO)
        return al_err(err, -EBADMSG, "the session's record names another transport");
    if (s->keep_expires) {
        int64_t left = s->keep_expires - (int64_t)time(NULL);
        s->expires_ms = al_now_ms() + (uint64_t)(left > 0 ? left : 0) * 1000u;
    }
    s->img.struct_size = sizeof(s->img);
    al_error ignored = {0};
    if (al_image_load(jstr(rec, "image"), &s->img, &ignored) < 0)
        al_session_notice(s, "image '%s' of the session is gone from the store",
                          jstr(rec, "image"));
    if (jbool(rec, "display") && !(s->screen = al_screen_new()))
        return al_err(err, -ENOMEM, "out of memory");
    const char *ck = jstr(rec, "checkpoint_disk");
    if (ck[0]) {
        /* Only the session's own: a record pointing elsewhere is not believed. */
        size_t n = strlen(s->state_dir);
        if (strncmp(ck, s->state_dir, n) != 0 || ck[n] != '/' || strchr(ck + n + 1, '/'))
            return al_err(err, -EBADMSG, "the session's record names a disk outside it");
        int r = al_checkpoints_reattach(s, ck, err);
        if (r < 0)
            return r;
    }
    int r = al_vm_connect(connect_uri, &s->conn, err);
    if (r < 0)
        return r;
    r = al_session_transport_new(s, s->kind, err);
    if (r < 0)
        return r;
    s->paused = cJSON_GetObjectItemCaseSensitive(rec, "paused") != NULL;
    if (s->paused)
        return 0;
    s->dom = virDomainLookupByName(s->conn, s->name);
    if (!s->dom || virDomainIsActive(s->dom) != 1)
        return al_err(err, -ESRCH,
                      "the VM of session %s is gone (it ended while no process held it)", s->name);
    return attach_agent(s, false, err);
}

int al_session_reattach(const al_reattach_opts *in, al_session **out, al_error *err)
{
    al_reattach_opts o = AL_REATTACH_OPTS_INIT;
    int r = AL_SIZED_IN(&o, in, "al_reattach_opts", err);
    if (r < 0)
        return r;
    if (!name_ok(o.name))
        return al_err(err, -EINVAL, "'%s' is not a session's name", o.name ? o.name : "");
    if (!o.keeper || !al_keeper_ok(o.keeper))
        return al_err(err, -EINVAL, "a keeper's name is 1 to 63 of [A-Za-z0-9._-]");
    al_session_opts so = {.struct_size = sizeof(so),
                          .cancel_fd = o.cancel_fd,
                          .quiet = o.quiet,
                          .on_notice = o.on_notice,
                          .notice_ctx = o.notice_ctx};
    al_session *s = al_session_new(&so);
    if (!s)
        return al_err(err, -ENOMEM, "out of memory");
    snprintf(s->name, sizeof(s->name), "%s", o.name);
    char sessions[AL_PATH_MAX];
    r = al_sessions_dir(sessions, sizeof(sessions), true, err);
    if (r == 0 && al_pathf(s->state_dir, sizeof(s->state_dir), "%s/%s", sessions, s->name) < 0)
        r = al_err(err, -ENAMETOOLONG, "session path too long");
    struct stat st;
    if (r == 0 && lstat(s->state_dir, &st) < 0)
        r = al_err(err, -ENOENT, "no session %s is kept", s->name);
    if (r == 0)
        r = lock_dir(s->state_dir, &s->state_lock_fd, err);
    _cleanup_cjson_ cJSON *rec = NULL;
    if (r == 0)
        r = record_read(s->state_dir, &rec, err);
    if (r == 0 && strcmp(jstr(rec, "keeper"), o.keeper) != 0)
        r = al_err(err, -ENOENT, "no session %s is kept for %s", s->name, o.keeper);
    /* The runtime dir: gone with a reboot of the host (then made again), else locked. */
    if (r == 0) {
        r = al_sessions_dir(sessions, sizeof(sessions), false, err);
        if (r == 0 && al_pathf(s->dir, sizeof(s->dir), "%s/%s", sessions, s->name) < 0)
            r = al_err(err, -ENAMETOOLONG, "session path too long");
        if (r == 0 && lstat(s->dir, &st) == 0)
            r = lock_dir(s->dir, &s->lock_fd, err);
        else if (r == 0)
            r = al_session_dir_make(false, s->name, s->dir, sizeof(s->dir), &s->lock_fd, err);
    }
    if (r == 0 && (al_pathf(s->sock, sizeof(s->sock), "%s/agent.sock", s->dir) < 0 ||
                   al_pathf(s->console, sizeof(s->console), "%s/console.log", s->dir) < 0))
        r = al_err(err, -ENAMETOOLONG, "session path too long");
    if (r < 0) {
        al_session_release(s, true); /* nothing of it is ours to remove */
        return r;
    }
    r = reattach_from(s, rec, o.connect_uri, err);
    if (r == 0)
        r = al_keep_marks(s, err);
    if (r < 0) {
        /* A VM that is gone leaves nothing to come back to; anything else stays for a later
         * try, or for al_session_discard. */
        s->dir_created = s->state_created = r == -ESRCH;
        al_session_release(s, r != -ESRCH);
        return r;
    }
    s->dir_created = s->state_created = true;
    r = al_keep_lease_start(s, err);
    if (r < 0) {
        al_session_release(s, true);
        return r;
    }
    *out = s;
    return 0;
}

void al_session_detach(al_session *s)
{
    if (s)
        al_session_release(s, s->keeper[0] != '\0');
}

size_t al_session_adopted(const al_session *s, uint32_t *ids, size_t max)
{
    for (size_t i = 0; i < s->nadopted && i < max; i++)
        ids[i] = s->adopted[i];
    return s->nadopted;
}

bool al_session_paused(const al_session *s)
{
    return s->paused;
}

int al_session_pause(al_session *s, al_error *err)
{
    if (!s->keeper[0])
        return al_err(err, -EINVAL, "only a kept session can be paused");
    AL_SESSION_LOCKED(s);
    if (s->paused)
        return al_err(err, -EALREADY, "the session is paused already");
    if (!s->dom)
        return al_err(err, -ESHUTDOWN, "the session's VM is gone");
    char path[AL_PATH_MAX];
    int r = saved_path(s, path, sizeof(path), err);
    if (r < 0)
        return r;
    /* Room for the whole memory above the floor, else no pause: the session runs on. */
    virDomainInfo info;
    if (virDomainGetInfo(s->dom, &info) < 0)
        return al_err_virt(err, -EIO, "cannot read the VM's memory size");
    al_error why = {0};
    r = al_check_free_space(s->state_dir, al_free_floor() + (uint64_t)info.maxMem * 1024u, &why);
    if (r < 0)
        return al_err(err, r, "cannot pause: %s", why.msg);
    /* The runs in flight end here (the agent keeps them for the resume), and the channel is
     * ours alone while the VM's state goes out. */
    al_link_fail_all(s, -ESTALE, "the session was paused");
    al_procs_end(s);
    al_link_drop_unclaimed(s);
    r = al_link_exclusive(s, PAUSE_WAIT_MS, err);
    if (r < 0)
        return r;
    al_budget_stop(s);
    al_link_detach(s);
    unlink(path);
    if (virDomainSaveFlags(s->dom, path, NULL, VIR_DOMAIN_SAVE_RUNNING) < 0) {
        r = al_err_virt(err, -EIO, "cannot save the VM's state");
        unlink(path);
        al_error ignored = {0};
        /* libvirt left it running: it goes on as before */
        if (al_link_connect(s, al_now_ms() + REATTACH_MS, &ignored) == 0)
            al_link_resync(s, REATTACH_MS, &ignored);
        al_budget_start(s, &ignored);
        al_link_exclusive_end(s);
        return r;
    }
    virDomainFree(s->dom);
    s->dom = NULL;
    s->paused = true;
    al_link_exclusive_end(s);
    /* libvirt wrote it as the daemon's user: ours alone from now, and recorded. */
    struct stat st;
    char sha[65], qemu[200];
    if (chmod(path, 0600) < 0 || lstat(path, &st) < 0 || al_sha256_file(path, sha) < 0)
        return al_err(err, -EIO, "cannot seal the saved state '%s': %s", path, strerror(errno));
    al_qemu_identity(s->conn, qemu, sizeof(qemu));
    _cleanup_cjson_ cJSON *p = cJSON_CreateObject();
    cJSON_AddNumberToObject(p, "size", (double)st.st_size);
    cJSON_AddStringToObject(p, "sha256", sha);
    cJSON_AddStringToObject(p, "qemu", qemu);
    cJSON_AddNumberToObject(p, "at", (double)time(NULL));
    return al_keep_record_write(s, p, err);
}

/* The saved state as the record says it was left: refused with the reason otherwise. */
static int check_saved(al_session *s, const char *path, al_error *err)
{
    _cleanup_cjson_ cJSON *rec = NULL;
    int r = record_read(s->state_dir, &rec, err);
    if (r < 0)
        return r;
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(rec, "paused");
    if (!p)
        return al_err(err, -EBADMSG, "the session's record has no paused state");
    char qemu[200];
    al_qemu_identity(s->conn, qemu, sizeof(qemu));
    if (strcmp(jstr(p, "qemu"), qemu) != 0)
        return al_err(err, -ESTALE,
                      "the session was paused by another QEMU (%s; now %s): its state cannot be "
                      "loaded",
                      jstr(p, "qemu"), qemu);
    struct stat st;
    int fd = open_ours(path, 077, 0, &st, err);
    if (fd < 0)
        return al_err(err, fd == -ENOENT ? -EBADMSG : fd, "the paused state is not usable: %s",
                      err->msg);
    close(fd);
    if ((double)st.st_size != jnum(p, "size"))
        return al_err(err, -EBADMSG, "the paused state has %lld bytes, %.0f were saved",
                      (long long)st.st_size, jnum(p, "size"));
    char sha[65];
    if (al_sha256_file(path, sha) < 0 || strcmp(sha, jstr(p, "sha256")) != 0)
        return al_err(err, -EBADMSG, "the paused state is not the one saved (its SHA-256 differs)");
    return 0;
}

int al_session_resume(al_session *s, al_error *err)
{
    AL_SESSION_LOCKED(s);
    if (!s->paused)
        return al_err(err, -EINVAL, "the session is not paused");
    char path[AL_PATH_MAX];
    int r = saved_path(s, path, sizeof(path), err);
    if (r == 0)
        r = check_saved(s, path, err);
    if (r < 0)
        return r;
    if (virDomainRestoreFlags(s->conn, path, NULL, VIR_DOMAIN_SAVE_RUNNING) < 0)
        return al_err_virt(err, -EIO, "cannot restore the paused VM");
    s->dom = virDomainLookupByName(s->conn, s->name);
    if (!s->dom)
        return al_err_virt(err, -EIO, "the restored VM is not there");
    s->paused = false;
    unlink(path);
    r = al_keep_record_write(s, NULL, err);
    if (r == 0)
        r = attach_agent(s, true, err);
    return r;
}

struct kept_walk {
    const char *keeper;
    void (*fn)(void *ctx, const al_kept_info *k);
    void *ctx;
    int n;
};

/* Whether a live process holds the lock of dir (without taking it for long). */
static bool held(const char *dir)
{
    char lock[AL_PATH_MAX];
    if (al_pathf(lock, sizeof(lock), "%s/lock", dir) < 0)
        return false;
    _cleanup_close_ int fd = open(lock, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return false;
    if (flock(fd, LOCK_EX | LOCK_NB) < 0)
        return true;
    flock(fd, LOCK_UN);
    return false;
}

int al_session_kept(const char *keeper, void (*fn)(void *ctx, const al_kept_info *k), void *ctx,
                    al_error *err)
{
    if (keeper && !al_keeper_ok(keeper))
        return al_err(err, -EINVAL, "a keeper's name is 1 to 63 of [A-Za-z0-9._-]");
    char sessions[AL_PATH_MAX];
    int r = al_sessions_dir(sessions, sizeof(sessions), true, err);
    if (r < 0)
        return r;
    DIR *d = opendir(sessions);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char dir[AL_PATH_MAX];
        if (!name_ok(e->d_name) || al_pathf(dir, sizeof(dir), "%s/%s", sessions, e->d_name) < 0)
            continue;
        _cleanup_cjson_ cJSON *rec = NULL;
        al_error ignored = {0};
        if (record_read(dir, &rec, &ignored) < 0 || !*jstr(rec, "keeper") ||
            (keeper && strcmp(jstr(rec, "keeper"), keeper) != 0))
            continue;
        al_kept_info k = {.struct_size = sizeof(k),
                          .paused = cJSON_GetObjectItemCaseSensitive(rec, "paused") != NULL,
                          .held = held(dir),
                          .expires = (int64_t)jnum(rec, "expires")};
        snprintf(k.name, sizeof(k.name), "%.63s", e->d_name);
        snprintf(k.keeper, sizeof(k.keeper), "%.63s", jstr(rec, "keeper"));
        n++;
        if (fn)
            fn(ctx, &k);
    }
    closedir(d);
    return n;
}

int al_session_discard(const char *keeper, const char *name, al_error *err)
{
    al_reattach_opts o = {.struct_size = sizeof(o), .name = name, .keeper = keeper, .quiet = true};
    if (!name_ok(name))
        return al_err(err, -EINVAL, "'%s' is not a session's name", name ? name : "");
    /* Taken back without talking to its agent: the dirs locked and the record checked, then
     * the whole of it ended as al_session_close ends any session. */
    al_session *s = NULL;
    al_error why = {0};
    int r = al_session_reattach(&o, &s, &why);
    if (r == -ESRCH)
        return 0; /* gone already, and removed */
    if (r == 0) {
        al_session_close(s);
        return 0;
    }
    if (r == -EBUSY || r == -ENOENT || r == -EINVAL)
        return al_err(err, r, "%s", why.msg);
    /* Its agent did not answer (or its record is damaged): end it without it. */
    char sessions[AL_PATH_MAX], dir[AL_PATH_MAX];
    _cleanup_virconn_ virConnectPtr conn = NULL;
    if (al_vm_connect(NULL, &conn, err) == 0) {
        virDomainPtr d = virDomainLookupByName(conn, name);
        if (d) {
            virDomainDestroy(d);
            virDomainFree(d);
        }
    }
    for (int state = 0; state < 2; state++) {
        int lock_fd = -1;
        if (al_sessions_dir(sessions, sizeof(sessions), state, err) < 0 ||
            al_pathf(dir, sizeof(dir), "%s/%s", sessions, name) < 0)
            continue;
        if (lock_dir(dir, &lock_fd, &why) == 0) {
            al_rmtree(dir);
            close(lock_fd);
        }
    }
    return 0;
}

int al_session_usage(al_session *s, al_usage *out, al_error *err)
{
    int r = AL_SIZED_OUT(out, "al_usage", err);
    if (r < 0)
        return r;
    AL_SESSION_LOCKED(s);
    if (!s->dom || s->paused)
        return al_err(err, -ESHUTDOWN, "the session's VM is %s", s->paused ? "paused" : "gone");
    virDomainInfo info;
    if (virDomainGetInfo(s->dom, &info) < 0)
        return al_err_virt(err, -EIO, "cannot read the VM's counters");
    al_usage u = AL_USAGE_INIT;
    u.cpu_ns = info.cpuTime;
    u.vcpus = info.nrVirtCpu;
    u.mem_total = (uint64_t)info.maxMem * 1024u;
    virDomainMemoryStatStruct st[VIR_DOMAIN_MEMORY_STAT_NR];
    int n = virDomainMemoryStats(s->dom, st, VIR_DOMAIN_MEMORY_STAT_NR, 0);
    for (int i = 0; i < n; i++)
        if (st[i].tag == VIR_DOMAIN_MEMORY_STAT_RSS)
            u.mem_used = st[i].val * 1024u;
    u.disk_used = al_session_disk_usage(s);
    u.disk_total = s->disk_budget;
    *out = u;
    return 0;
}

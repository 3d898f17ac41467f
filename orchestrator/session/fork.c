/* Forks: a running session's whole state saved once, and opened as new sessions.
 *
 * A session's RAM is anonymous memory (or a template's file mapped privately), so it cannot be
 * shared with forks as it is. The save starts a second QEMU, the holder, whose RAM is a new
 * file mapped shared (as a template being built, template.c) and which waits for a migration.
 * The source is paused and migrated into it over a socket pair (its whole RAM, once); the
 * migration's end flushed the source's disk overlay, which is copied then, and the source
 * resumes: it stood still for the migration and the copy only. The holder, never run, then
 * saves its device state alone (x-ignore-shared), as a template is saved, and goes. What is
 * left is a template in all but name: ram, state, disk.qcow2 (the source's overlay as it was)
 * and the source's own middle layers hard-linked beside it (mid1.qcow2 ...). Forks are restored
 * from it as warm starts are (al_template_restore: the RAM file mapped privately, its pages
 * shared in the page cache; the guest made unique by REFRESH).
 *
 * Files: STATE/forks/ID/, QEMU's, 0600. The handle holds ID/lock; each fork hard-links the
 * state file into its own state dir (fork.ref), so the state file's link count says whether a
 * fork of it lives; the dir goes once neither holds it (al_fork_free, a fork's close, gc:
 * al_fork_reap). Forks restored from a fork's save spell the whole disk chain out in their
 * domain's description (vm.c), so no header's path is trusted or needed. */
#include "budget.h"
#include "checkpoint.h"
#include "net.h"
#include "template.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* The whole RAM over a socket pair: ~1 GB/s; the device state alone ~50 ms. */
#define FORK_MIGRATE_MS 120000

/* A holder: a paused QEMU with the source's devices, its RAM a file mapped shared, waiting for
 * a migration. Its runtime dir (agent socket, lock: gc leaves it alone) holds its throwaway
 * disks; its RAM is in a dir of its own in /dev/shm when that has room and the save is not
 * meant to last, else the save's dir/ram. A migration into a file in RAM runs at memory speed
 * (into a disk-backed one it took twice as long and more: each page's first write there is a
 * block to allocate, then to write back); forks map it privately either way, its pages shared. */
struct al_holder {
    virDomainPtr dom;
    char dir[AL_PATH_MAX]; /* its runtime dir */
    int lock;
    char shm[AL_PATH_MAX]; /* /dev/shm/airlock-fork.XXXXXX, or "": the RAM is in the save's dir */
    char ram[AL_PATH_MAX];
};

struct al_fork {
    char dir[AL_PATH_MAX];
    int lock_fd;
    char image[sizeof(((al_image *)0)->name)];
    char image_disk[AL_PATH_MAX]; /* the image's base the chain ends on ("" none) */
    unsigned mem, vcpus, display_w, display_h;
    bool kvm, display, disk, scratch;
    bool net; /* the source's NIC (each fork gets its own proxy, key and rules) */
    size_t nmids;
    uint64_t disk_size;
    unsigned pause_ms, save_ms;           /* the source stood still; the whole save */
    char qemu[200];                       /* al_qemu_identity of the save's host */
    char image_id[AL_PATH_MAX];           /* al_image_identity of its image */
    struct al_fork_vol vols[AL_VOLS_MAX]; /* the source's volumes */
    size_t nvols;
    struct al_holder holder; /* the save's, ended with the handle: off the forks' way */
};

static void holder_end(struct al_holder *h);

void al_fork_free(al_fork *f)
{
    if (!f)
        return;
    holder_end(&f->holder);
    if (f->lock_fd >= 0)
        close(f->lock_fd);
    if (f->dir[0]) /* "": moved to the snapshots (al_snapshot_save) */
        al_fork_reap_dir(f->dir);
    free(f);
}

/* What a fork of s must have to take s's device state: refused with the reason otherwise. */
static int forkable(const al_session *s, al_error *err)
{
    if (!s->dom)
        return al_err(err, -ESHUTDOWN, "the session's VM is gone");
    if (s->paused)
        return al_err(err, -EINVAL, "the session is paused: resume it before forking it");
    if (s->remote)
        return al_err(err, -EOPNOTSUPP,
                      "a session on another host cannot be forked (its memory is there)");
    if (s->kind != AL_TRANSPORT_VIRTIO)
        return al_err(err, -EOPNOTSUPP,
                      "only sessions over virtio-serial can be forked (an SSH session's keys "
                      "are its own)");
    if (s->raw_port[0])
        return al_err(err, -EOPNOTSUPP, "a session with a benchmark port cannot be forked");
    if (s->budget_over)
        return al_err(err, -EINVAL, "the session is paused over its disk budget: %s",
                      s->budget_why);
    size_t nmids = 0;
    for (const char *const *m = al_template_mids(s->tmpl); m && *m; m++)
        nmids++;
    if (nmids + 1 > AL_DISK_MIDS_MAX)
        return al_err(err, -E2BIG, "a fork of a fork this deep has too many disk layers (%d)",
                      AL_DISK_MIDS_MAX);
    return 0;
}

static int file_for_qemu(al_session *s, const char *path, uint64_t size, bool alloc, al_error *err)
{
    _cleanup_close_ int fd = al_file_create_private(path, O_RDWR);
    if (fd < 0)
        return al_err(err, fd, "cannot create '%s': %s", path, strerror(-fd));
    if (size && ftruncate(fd, (off_t)size) < 0)
        return al_err(err, -errno, "cannot size '%s': %s", path, strerror(errno));
    /* The RAM file's blocks allocated now, in one go: the migration then writes into it at
     * memory speed instead of allocating a block at each page's first write. */
    if (alloc && fallocate(fd, 0, 0, (off_t)size) < 0 && errno != EOPNOTSUPP)
        return al_err(err, -errno, "cannot allocate '%s': %s", path, strerror(errno));
    return al_disk_give(s->conn, s->kvm, path, err);
}

enum ram_where { RAM_SHM, RAM_SHM_OR_SAVE, RAM_SAVE };

/* The holder's RAM file, per where. In /dev/shm, its dir's "save" links to the source's state
 * dir until a save takes it, then to the save's dir (template.c reaps it once that is gone). */
static int holder_ram(al_session *s, const struct al_fork *f, enum ram_where where,
                      struct al_holder *h, al_error *err)
{
    uint64_t bytes = (uint64_t)f->mem << 20;
    char back[AL_PATH_MAX];
    if (where != RAM_SAVE &&
        al_shm_mkdtemp(AL_FORK_SHM_PREFIX, bytes, h->shm, sizeof(h->shm)) == 0) {
        /* QEMU's user traverses it, as the state dir's */
        if (chmod(h->shm, 0711) < 0 || al_pathf(back, sizeof(back), "%s/save", h->shm) < 0 ||
            symlink(s->state_dir[0] ? s->state_dir : h->dir, back) < 0 ||
            al_pathf(h->ram, sizeof(h->ram), "%s/ram", h->shm) < 0)
            return al_err(err, -errno, "cannot make the fork's RAM file in '%s': %s", h->shm,
                          strerror(errno));
        return file_for_qemu(s, h->ram, bytes, true, err);
    }
    if (where == RAM_SHM)
        return al_err(err, -ENOSPC, "no room in /dev/shm for a holder's RAM");
    if (al_pathf(h->ram, sizeof(h->ram), "%s/ram", f->dir) < 0)
        return al_err(err, -ENAMETOOLONG, "fork path too long");
    if (strchr(h->ram, ','))
        return al_err(err, -EINVAL,
                      "the state dir's path has a comma, which QEMU's options cannot carry");
    return file_for_qemu(s, h->ram, bytes, true, err);
}

/* Ends the holder's QEMU: told to quit in a thread of its own, since libvirt's answer to that
 * (as to a destroy) takes ~0.2 s and nothing waits on it (the domain is transient). Its dir
 * and lock go after it, so that a gc meanwhile does not take it for a crashed run's. */
struct holder_gone {
    virDomainPtr dom;
    char dir[AL_PATH_MAX];
    int lock;
};

static void holder_gone(virDomainPtr dom, char *dir, int *lock)
{
    al_error ignored = {0};
    if (dom &&
        al_vm_qmp(dom, "end the fork's holder", "{\"execute\":\"quit\"}", -1, NULL, &ignored) < 0)
        virDomainDestroy(dom);
    if (dom)
        virDomainFree(dom);
    if (dir[0])
        al_rmtree(dir);
    al_closep(lock);
}

static void *holder_quit(void *arg)
{
    struct holder_gone *g = arg;
    holder_gone(g->dom, g->dir, &g->lock);
    free(g);
    return NULL;
}

/* Ends h; its RAM's dir too unless a save took it (holder_adopt). */
static void holder_end(struct al_holder *h)
{
    if (h->shm[0])
        al_rmtree(h->shm);
    h->shm[0] = '\0';
    struct holder_gone *g = h->dom ? malloc(sizeof(*g)) : NULL;
    pthread_attr_t attr;
    pthread_t t;
    bool handed = false;
    if (g && pthread_attr_init(&attr) == 0) {
        *g = (struct holder_gone){.dom = h->dom, .lock = h->lock};
        memcpy(g->dir, h->dir, sizeof(g->dir));
        handed = pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED) == 0 &&
                 pthread_create(&t, &attr, holder_quit, g) == 0;
        pthread_attr_destroy(&attr);
    }
    if (handed) {
        h->lock = -1;
    } else {
        free(g);
        holder_gone(h->dom, h->dir, &h->lock);
    }
    h->dom = NULL;
    h->dir[0] = '\0';
}

/* Starts a holder for a save of f's shape (f->dir is used only with RAM_SAVE, or
 * RAM_SHM_OR_SAVE when /dev/shm has no room). */
static int holder_start(al_session *s, const struct al_fork *f, enum ram_where where,
                        struct al_holder *h, al_error *err)
{
    *h = (struct al_holder){.lock = -1};
    uint8_t rnd[6];
    if (getrandom(rnd, sizeof(rnd), 0) != sizeof(rnd))
        return al_err(err, -EIO, "getrandom failed");
    char name[64], sock[AL_PATH_MAX], disk[AL_PATH_MAX], scratch[AL_PATH_MAX];
    snprintf(name, sizeof(name), AL_DOMAIN_PREFIX "%02x%02x%02x%02x%02x%02x", rnd[0], rnd[1],
             rnd[2], rnd[3], rnd[4], rnd[5]);
    int r = al_session_dir_make(false, name, h->dir, sizeof(h->dir), &h->lock, err);
    if (r < 0) {
        h->dir[0] = '\0';
        return r;
    }
    if (al_pathf(sock, sizeof(sock), "%s/agent.sock", h->dir) < 0 ||
        al_pathf(disk, sizeof(disk), "%s/holder.qcow2", h->dir) < 0 ||
        al_pathf(scratch, sizeof(scratch), "%s/holder-scratch.qcow2", h->dir) < 0)
        r = al_err(err, -ENAMETOOLONG, "fork path too long");
    if (r == 0)
        r = holder_ram(s, f, where, h, err);
    /* The holder never runs: its disks only have to be the source's devices. */
    if (r == 0 && f->disk)
        r = al_disk_overlay(s->conn, s->kvm, s->img.disk, disk, err);
    if (r == 0 && f->scratch)
        r = al_disk_scratch(s->conn, s->kvm, scratch, AL_SCRATCH_BYTES, err);
    /* its volumes: empty files of their sizes, the same devices */
    char vol[AL_VOLS_MAX][AL_PATH_MAX];
    for (size_t i = 0; r == 0 && i < f->nvols; i++) {
        if (al_pathf(vol[i], sizeof(vol[i]), "%s/holder-vol%zu.raw", h->dir, i) < 0)
            r = al_err(err, -ENAMETOOLONG, "fork path too long");
        else
            r = file_for_qemu(s, vol[i], f->vols[i].size, false, err);
    }
    struct al_vm_config cfg = {
        .name = name,
        .session_dir = h->dir,
        .image = &s->img,
        .memory_mib = f->mem,
        .vcpus = f->vcpus,
        .kvm = f->kvm,
        .agent_sock = sock,
        .disk = f->disk ? disk : NULL,
        .scratch = f->scratch ? scratch : NULL,
        .display = f->display,
        .display_w = f->display_w,
        .display_h = f->display_h,
        .ram_file = h->ram,
        .ram_shared = true,
        .ram_prealloc = h->shm[0] != 0,
        .incoming = true,
        .nvols = f->nvols,
    };
    /* The source's NIC; a forward of its own, to nothing (the holder never runs) */
    if (r == 0 && f->net) {
        r = al_free_port(&cfg.net_port, err);
        cfg.net_guest_port = AL_NET_GUEST_TUNNEL_PORT;
    }
    for (size_t i = 0; r == 0 && i < f->nvols; i++)
        cfg.vols[i].disk = vol[i];
    _cleanup_free_ char *xml = r == 0 ? al_vm_xml(&cfg) : NULL;
    if (r == 0 && !xml)
        r = al_err(err, -ENOMEM, "cannot build the domain description");
    if (r == 0) {
        h->dom = virDomainCreateXML(s->conn, xml,
                                    VIR_DOMAIN_START_AUTODESTROY | VIR_DOMAIN_START_PAUSED);
        if (!h->dom)
            r = al_err_virt(err, -EIO, "cannot start the fork's holder");
    }
    if (r < 0)
        holder_end(h);
    return r;
}

/* h's RAM made the save's: f->dir/ram links to it and its dir's "save" to f->dir. */
static int holder_adopt(struct al_holder *h, const struct al_fork *f, al_error *err)
{
    if (!h->shm[0])
        return 0;
    char link[AL_PATH_MAX], back[AL_PATH_MAX], tmp[AL_PATH_MAX];
    if (al_pathf(link, sizeof(link), "%s/ram", f->dir) < 0 ||
        al_pathf(back, sizeof(back), "%s/save", h->shm) < 0 ||
        al_pathf(tmp, sizeof(tmp), "%s/save.new", h->shm) < 0)
        return al_err(err, -ENAMETOOLONG, "fork path too long");
    if (symlink(h->ram, link) < 0 || symlink(f->dir, tmp) < 0 || rename(tmp, back) < 0)
        return al_err(err, -errno, "cannot link the fork's RAM file: %s", strerror(errno));
    h->shm[0] = '\0'; /* the save's now: reaped with it */
    return 0;
}

/* A session's spare holder: started in the background after a save, for its next one. A
 * holder's start is ~0.4 s of a fork's, and a spare's RAM is allocated and mapped before it is
 * needed (fallocate, QEMU's prealloc: the migration then only copies, 0.14 s instead of 0.5 s
 * here). That is memory held for a fork that may not come: the spare ends after SPARE_KEEP_S
 * unused, with its session, and is not made without twice its RAM free. */
struct al_fork_spare {
    pthread_t thread;
    bool running;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool now, stop;       /* under mu: start without waiting, or give the holder up; end */
    struct al_holder h;   /* ready once the thread ended with h.dom set */
    struct al_fork shape; /* what it was started for */
    al_session *s;
};

/* A spare waits this long before it starts: the forks just opened are restoring, and a QEMU
 * starting beside them takes a share of a small host's CPUs. */
#define SPARE_DELAY_MS 1000
#define SPARE_KEEP_S 120

/* Waits under sp->mu until now or stop, or ms have passed; true when they have. */
static bool spare_wait(struct al_fork_spare *sp, unsigned ms)
{
    struct timespec until;
    al_deadline_in(&until, ms);
    int r = 0;
    while (!sp->now && !sp->stop && r != ETIMEDOUT)
        r = pthread_cond_timedwait(&sp->cv, &sp->mu, &until);
    return !sp->now && !sp->stop;
}

static void *spare_run(void *arg)
{
    struct al_fork_spare *sp = arg;
    pthread_mutex_lock(&sp->mu);
    spare_wait(sp, SPARE_DELAY_MS);
    bool go = !sp->stop;
    pthread_mutex_unlock(&sp->mu);
    al_error ignored = {0};
    if (go)
        holder_start(sp->s, &sp->shape, RAM_SHM, &sp->h, &ignored);
    if (!sp->h.dom)
        return NULL;
    pthread_mutex_lock(&sp->mu);
    bool unused = spare_wait(sp, SPARE_KEEP_S * 1000);
    pthread_mutex_unlock(&sp->mu);
    if (unused)
        holder_end(&sp->h);
    return NULL;
}

/* Waits for s's spare thread (now: hurried), leaving its holder, if any, in sp->h. */
static void spare_join(struct al_fork_spare *sp, bool stop)
{
    if (!sp->running)
        return;
    pthread_mutex_lock(&sp->mu);
    sp->now = true;
    sp->stop = stop;
    pthread_cond_signal(&sp->cv);
    pthread_mutex_unlock(&sp->mu);
    pthread_join(sp->thread, NULL);
    sp->running = false;
}

static bool same_shape(const struct al_fork *a, const struct al_fork *b)
{
    if (a->mem != b->mem || a->vcpus != b->vcpus || a->display != b->display ||
        a->display_w != b->display_w || a->display_h != b->display_h || a->disk != b->disk ||
        a->scratch != b->scratch || a->net != b->net || a->nvols != b->nvols)
        return false;
    for (size_t i = 0; i < a->nvols; i++)
        if (a->vols[i].size != b->vols[i].size)
            return false;
    return true;
}

/* The spare, when it is ready and fits f; else a holder started now. */
static int holder_get(al_session *s, const struct al_fork *f, enum ram_where where,
                      struct al_holder *h, al_error *err)
{
    struct al_fork_spare *sp = s->fork_spare;
    if (sp && where != RAM_SAVE) {
        spare_join(sp, false);
        if (sp->h.dom && same_shape(&sp->shape, f)) {
            *h = sp->h;
            sp->h = (struct al_holder){.lock = -1};
            return 0;
        }
        holder_end(&sp->h);
    }
    return holder_start(s, f, where, h, err);
}

static void spare_end(al_session *s);

/* After a save whose RAM went to /dev/shm: a spare for the next one. */
static void spare_start(al_session *s, const struct al_fork *f)
{
    struct al_fork_spare *sp = s->fork_spare;
    if (!sp) {
        sp = calloc(1, sizeof(*sp));
        if (!sp)
            return;
        pthread_mutex_init(&sp->mu, NULL);
        pthread_cond_init(&sp->cv, NULL);
        sp->h.lock = -1;
        sp->s = s;
        s->fork_spare = sp;
        s->fork_spare_end = spare_end;
    }
    if (sp->running || sp->h.dom)
        return;
    sp->shape = *f;
    sp->shape.lock_fd = -1;
    sp->shape.holder = (struct al_holder){.lock = -1}; /* f's own, not the spare's */
    sp->now = sp->stop = false;
    sp->running = pthread_create(&sp->thread, NULL, spare_run, sp) == 0;
}

static void spare_end(al_session *s)
{
    struct al_fork_spare *sp = s->fork_spare;
    if (!sp)
        return;
    spare_join(sp, true);
    holder_end(&sp->h);
    pthread_mutex_destroy(&sp->mu);
    pthread_cond_destroy(&sp->cv);
    free(sp);
    s->fork_spare = NULL;
}

/* The source's RAM and devices into the holder over a socket pair; both wait for the end. */
static int migrate_into(al_session *s, virDomainPtr holder, al_error *err)
{
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0)
        return al_err(err, -errno, "socketpair: %s", strerror(errno));
    int r = al_vm_getfd(holder, "airlock-fork", sp[1], err);
    if (r == 0)
        r = al_vm_qmp(holder, "take the session's state",
                      "{\"execute\":\"migrate-incoming\",\"arguments\":{\"uri\":\"fd:airlock-"
                      "fork\"}}",
                      -1, NULL, err);
    /* QEMU caps a migration at 128 MiB/s by default, for live ones over a network; this one
     * is between two processes here, the source paused: as fast as they go. */
    if (r == 0)
        r = al_vm_qmp(s->dom, "save the session's state",
                      "{\"execute\":\"migrate-set-parameters\",\"arguments\":"
                      "{\"max-bandwidth\":1099511627776}}",
                      -1, NULL, err);
    if (r == 0)
        r = al_vm_getfd(s->dom, "airlock-fork", sp[0], err);
    close(sp[0]);
    close(sp[1]);
    if (r == 0)
        r = al_vm_qmp(s->dom, "save the session's state",
                      "{\"execute\":\"migrate\",\"arguments\":{\"uri\":\"fd:airlock-fork\"}}", -1,
                      NULL, err);
    if (r == 0)
        r = al_vm_migrate_wait(s->dom, "save the session's state", FORK_MIGRATE_MS, err);
    if (r == 0)
        r = al_vm_migrate_wait(holder, "take the session's state", FORK_MIGRATE_MS, err);
    return r;
}

/* The source's overlay as the migration left it (flushed, QEMU's locks let go) into
 * f->dir/disk.qcow2, on f->dir's own links of the source's middle layers (link_mids). A copy of
 * the file, unless it holds checkpoints: their RAM is in it too (QEMU's savevm, ~0.4 GiB each
 * here), which a fork has no use for, so only the disk's present content is taken then. */
static int copy_disk(al_session *s, struct al_fork *f, al_error *err)
{
    char from[AL_PATH_MAX], to[AL_PATH_MAX], below[AL_PATH_MAX];
    if (al_pathf(from, sizeof(from), "%s/disk.qcow2", s->state_dir) < 0 ||
        al_pathf(to, sizeof(to), "%s/disk.qcow2", f->dir) < 0)
        return al_err(err, -ENAMETOOLONG, "fork path too long");
    if (f->nmids ? al_pathf(below, sizeof(below), "%s/mid1.qcow2", f->dir) < 0
                 : al_pathf(below, sizeof(below), "%s", s->img.disk) < 0)
        return al_err(err, -ENAMETOOLONG, "fork path too long");
    _cleanup_close_ int in = open(from, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    struct stat st;
    if (in < 0 || fstat(in, &st) < 0)
        return al_err(err, -errno, "cannot read the session's disk: %s", strerror(errno));
    uint8_t hdr[64];
    if (pread(in, hdr, sizeof(hdr), 0) != (ssize_t)sizeof(hdr) || memcmp(hdr, "QFI\xfb", 4))
        return al_err(err, -EIO, "the session's disk is not a qcow2");
    f->disk_size = 0;
    for (int i = 24; i < 32; i++) /* the virtual size, big-endian */
        f->disk_size = f->disk_size << 8 | hdr[i];
    uint32_t nsnap =
        (uint32_t)hdr[60] << 24 | (uint32_t)hdr[61] << 16 | (uint32_t)hdr[62] << 8 | hdr[63];
    int r;
    if (nsnap) {
        r = al_disk_flatten(from, to, "qcow2", below, "qcow2", err);
    } else {
        r = al_copy_sparse(in, st.st_size, to);
        if (r < 0)
            return al_err(err, r, "cannot copy the session's disk: %s", strerror(-r));
        /* the copy's header pointed at the first of f->dir's layers */
        if (f->nmids)
            r = al_disk_rebase(to, below, err);
    }
    if (r == 0)
        r = al_disk_give(s->conn, s->kvm, to, err);
    return r;
}

/* The source's middle layers linked into f->dir (mid1.qcow2 ...), so the save outlives
 * whatever they belong to (a template replaced, another fork's save reaped). */
static int link_mids(al_session *s, struct al_fork *f, al_error *err)
{
    const char *const *mids = al_template_mids(s->tmpl);
    f->nmids = 0;
    for (size_t i = 0; mids && mids[i]; i++) {
        char to[AL_PATH_MAX];
        if (al_pathf(to, sizeof(to), "%s/mid%zu.qcow2", f->dir, i + 1) < 0)
            return al_err(err, -ENAMETOOLONG, "fork path too long");
        if (link(mids[i], to) < 0)
            return al_err(err, -errno, "cannot keep the disk layer '%s': %s", mids[i],
                          strerror(errno));
        f->nmids++;
    }
    return 0;
}

/* The source's volumes as the migration left them (flushed), into f->dir: a read-write one
 * whole (volI.raw: the forks' copy-on-write base), a read-only one by its overlay over the
 * volume (volI.qcow2). What a source that is a fork itself has over several files is flattened
 * into one. */
static int copy_vols(al_session *s, struct al_fork *f, al_error *err)
{
    for (size_t i = 0; i < f->nvols; i++) {
        const struct al_vol_att *v = &s->vols[i];
        char to[AL_PATH_MAX];
        if (al_pathf(to, sizeof(to), "%s/vol%zu.%s", f->dir, i, v->read_only ? "qcow2" : "raw") < 0)
            return al_err(err, -ENAMETOOLONG, "fork path too long");
        int r;
        if (v->read_only ? v->mid[0] != 0 : v->backing[0] != 0) {
            r = al_disk_flatten(v->disk, to, v->read_only ? "qcow2" : "raw",
                                v->read_only ? v->backing : NULL, "raw", err);
        } else {
            _cleanup_close_ int in = open(v->disk, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
            struct stat st;
            if (in < 0 || fstat(in, &st) < 0)
                return al_err(err, -errno, "cannot read volume '%s': %s", v->name, strerror(errno));
            r = al_copy_sparse(in, st.st_size, to);
            if (r < 0)
                return al_err(err, r, "cannot copy volume '%s': %s", v->name, strerror(-r));
        }
        if (r == 0)
            r = al_disk_give(s->conn, s->kvm, to, err);
        if (r < 0)
            return r;
    }
    return 0;
}

/* The holder's device state alone into f->dir/state; the holder goes. */
static int holder_save(al_session *s, struct al_fork *f, virDomainPtr holder, al_error *err)
{
    char state[AL_PATH_MAX];
    if (al_pathf(state, sizeof(state), "%s/state", f->dir) < 0)
        return al_err(err, -ENAMETOOLONG, "fork path too long");
    int r = al_vm_ignore_shared(holder, true, "save the fork's state", err);
    if (r == 0) {
        _cleanup_close_ int fd = al_file_create_private(state, O_WRONLY);
        if (fd < 0)
            r = al_err(err, fd, "cannot create '%s': %s", state, strerror(-fd));
        else
            r = al_vm_getfd(holder, "airlock-state", fd, err);
    }
    if (r == 0)
        r = al_vm_qmp(holder, "save the fork's state",
                      "{\"execute\":\"migrate\",\"arguments\":{\"uri\":\"fd:airlock-state\"}}", -1,
                      NULL, err);
    if (r == 0)
        r = al_vm_migrate_wait(holder, "save the fork's state", FORK_MIGRATE_MS, err);
    if (r == 0)
        r = al_disk_give(s->conn, s->kvm, state, err);
    return r;
}

/* A new save's path among the forks' saves (forks: STATE/forks): forks/RANDOM, into to. */
static int save_path(const char *forks, char *to, size_t len, al_error *err)
{
    uint8_t rnd[8];
    char hex[17];
    if (getrandom(rnd, sizeof(rnd), 0) != sizeof(rnd))
        return al_err(err, -EIO, "getrandom failed");
    al_hexify(rnd, sizeof(rnd), hex);
    if (al_pathf(to, len, "%s/%s", forks, hex) < 0)
        return al_err(err, -ENAMETOOLONG, "fork path too long");
    return 0;
}

static int fork_save(al_session *s, bool on_disk, al_fork **out, al_error *err)
{
    if (!s || !out)
        return al_err(err, -EINVAL, "no session");
    AL_SESSION_LOCKED(s);
    int r = forkable(s, err);
    if (r < 0)
        return r;
    virDomainInfo info;
    if (virDomainGetInfo(s->dom, &info) < 0)
        return al_err_virt(err, -EIO, "cannot read the VM's memory size");
    struct al_fork *f = calloc(1, sizeof(*f));
    if (!f)
        return al_err(err, -ENOMEM, "out of memory");
    f->lock_fd = -1;
    f->holder.lock = -1;
    snprintf(f->image, sizeof(f->image), "%s", s->img.name);
    snprintf(f->image_disk, sizeof(f->image_disk), "%s", s->img.disk);
    f->mem = (unsigned)(info.maxMem / 1024);
    f->vcpus = s->vcpus;
    f->kvm = s->kvm;
    f->display = s->screen != NULL;
    f->display_w = s->display_w;
    f->display_h = s->display_h;
    f->disk = s->img.disk[0] != 0;
    f->scratch = s->ckpt && !f->disk;
    f->net = s->net != NULL;
    al_qemu_identity(s->conn, f->qemu, sizeof(f->qemu));
    al_image_identity(&s->img, f->image_id, sizeof(f->image_id));
    f->nvols = s->nvols;
    for (size_t i = 0; i < s->nvols; i++) {
        snprintf(f->vols[i].name, sizeof(f->vols[i].name), "%s", s->vols[i].name);
        snprintf(f->vols[i].path, sizeof(f->vols[i].path), "%s", s->vols[i].path);
        f->vols[i].read_only = s->vols[i].read_only;
        f->vols[i].size = s->vols[i].size;
    }
    /* Room for the RAM file and the disk's copy above the floor, else no fork. */
    char forks[AL_PATH_MAX];
    al_error why = {0};
    r = al_forks_dir(forks, sizeof(forks), err);
    if (r == 0 && al_check_free_space(forks, al_free_floor() + ((uint64_t)f->mem << 20), &why) < 0)
        r = al_err(err, -ENOSPC, "cannot fork: %s", why.msg);
    if (r == 0)
        r = save_path(forks, f->dir, sizeof(f->dir), err);
    char lock[AL_PATH_MAX];
    if (r == 0 && al_pathf(lock, sizeof(lock), "%s/lock", f->dir) < 0)
        r = al_err(err, -ENAMETOOLONG, "fork path too long");
    if (r == 0 && mkdir(f->dir, 0711) < 0)
        r = al_err(err, -errno, "cannot create '%s': %s", f->dir, strerror(errno));
    if (r == 0 && (f->lock_fd = al_lock_file(lock)) < 0)
        r = al_err(err, f->lock_fd, "cannot lock '%s': %s", lock, strerror(-f->lock_fd));
    if (r < 0) {
        if (f->dir[0])
            al_rmtree(f->dir);
        if (f->lock_fd >= 0)
            close(f->lock_fd);
        free(f);
        return r;
    }

    struct al_holder h;
    uint64_t t0 = al_now_ms();
    r = holder_get(s, f, on_disk ? RAM_SAVE : RAM_SHM_OR_SAVE, &h, err);
    bool in_shm = r == 0 && h.shm[0]; /* holder_adopt makes it the save's */
    if (r == 0)
        r = holder_adopt(&h, f, err);
    if (r == 0 && f->disk)
        r = link_mids(s, f, err);
    /* The source stands still from here until its disk is copied. */
    bool suspended = false;
    if (r == 0) {
        if (virDomainSuspend(s->dom) < 0)
            r = al_err_virt(err, -EIO, "cannot pause the session for the fork");
        else
            suspended = true;
    }
    uint64_t t_pause = al_now_ms();
    if (r == 0)
        r = migrate_into(s, h.dom, err);
    if (r == 0 && f->disk)
        r = copy_disk(s, f, err);
    if (r == 0)
        r = copy_vols(s, f, err);
    if (suspended && virDomainResume(s->dom) < 0 && r == 0)
        r = al_err_virt(err, -EIO, "cannot resume the session after the fork's save");
    f->pause_ms = (unsigned)(al_now_ms() - t_pause);
    if (r == 0)
        r = holder_save(s, f, h.dom, err);
    /* Ended with the handle (libvirt holds the domain's lock ~0.2 s while QEMU quits, and
     * the forks' starts list the domains), or now when the save failed. */
    if (r == 0)
        f->holder = h;
    else
        holder_end(&h);
    f->save_ms = (unsigned)(al_now_ms() - t0);
    if (r < 0) {
        al_rmtree(f->dir);
        close(f->lock_fd);
        free(f);
        return r;
    }
    if (in_shm)
        spare_start(s, f);
    *out = f;
    return 0;
}

int al_session_fork_save(al_session *s, al_fork **out, al_error *err)
{
    return fork_save(s, false, out, err);
}

int al_fork_open(const al_fork *f, const al_session_opts *opts, al_session **out, al_error *err)
{
    if (!f || !out)
        return al_err(err, -EINVAL, "no fork");
    al_session_opts o;
    int r = AL_SIZED_IN_SINCE(&o, opts, "al_session_opts", display, err);
    if (r < 0)
        return r;
    if (o.image && o.image[0] && strcmp(o.image, f->image))
        return al_err(err, -EINVAL, "a fork runs its source's image '%s', not '%s'", f->image,
                      o.image);
    if (o.keep)
        return al_err(err, -EOPNOTSUPP, "a fork cannot be kept past its process yet");
    /* The NIC is the source's device: a fork has network exactly when its source had, through
     * a proxy, a key and rules of its own (o.net's: its caller's decision). */
    bool net = o.net.allow && o.net.allow[0];
    if (f->net && !net)
        return al_err(err, -EINVAL,
                      "the session had network on request: its fork needs an allowlist of its own");
    if (!f->net && net)
        return al_err(err, -EINVAL, "the session had no network: neither can its fork");
    if (o.connect_uri && o.connect_uri[0])
        return al_err(err, -EOPNOTSUPP, "a fork runs on the host of its source's save");
    /* The source's shape: the device state fits nothing else. */
    o.image = f->image;
    o.memory_mib = f->mem;
    o.vcpus = f->vcpus;
    o.display = f->display;
    o.display_width = f->display_w;
    o.display_height = f->display_h;
    o.transport = AL_TRANSPORT_VIRTIO;
    o.volumes = NULL; /* the source's, from the save */
    if (!f->disk)
        o.checkpoints = f->scratch;
    struct al_fork_save save = {.dir = f->dir,
                                .image = f->image,
                                .image_disk = f->image_disk,
                                .qemu = f->qemu,
                                .image_id = f->image_id,
                                .kvm = f->kvm,
                                .disk = f->disk,
                                .nmids = f->nmids,
                                .disk_size = f->disk_size,
                                .vols = f->vols,
                                .nvols = f->nvols};
    return al_session_open_fork(&o, &save, out, err);
}

void al_fork_timing(const al_fork *f, unsigned *pause_ms, unsigned *save_ms)
{
    if (pause_ms)
        *pause_ms = f ? f->pause_ms : 0;
    if (save_ms)
        *save_ms = f ? f->save_ms : 0;
}

/* ---- snapshots: saves kept under a name, sealed ---- */

#define SNAPSHOTS_DIR "snapshots"
#define SNAPSHOT_FORMAT 1
#define SNAPSHOT_FILES_MAX (3 + AL_DISK_MIDS_MAX + AL_VOLS_MAX)

bool al_snapshot_name_ok(const char *n)
{
    return al_store_name_ok(n, AL_SNAPSHOT_NAME_MAX);
}

static int snapshot_path(const char *name, char *buf, size_t len, al_error *err)
{
    if (!al_snapshot_name_ok(name))
        return al_err(err, -EINVAL,
                      "a snapshot's name is 1 to %d of [A-Za-z0-9._-], not starting with a dot",
                      AL_SNAPSHOT_NAME_MAX);
    char dir[AL_PATH_MAX];
    int r = al_state_subdir(SNAPSHOTS_DIR, dir, sizeof(dir), err);
    if (r < 0)
        return r;
    if (al_pathf(buf, len, "%s/%s", dir, name) < 0)
        return al_err(err, -ENAMETOOLONG, "state dir path too long");
    return 0;
}

/* A save or a snapshot's dir moved among the forks' saves (STATE/forks/RANDOM, into to): the
 * sessions started from it keep it until they end (al_fork_reap). */
static int move_to_forks(const char *dir, char *to, size_t len, al_error *err)
{
    char forks[AL_PATH_MAX];
    int r = al_forks_dir(forks, sizeof(forks), err);
    if (r == 0)
        r = save_path(forks, to, len, err);
    if (r < 0)
        return r;
    if (rename(dir, to) < 0)
        return al_err(err, -errno, "cannot move '%s' aside: %s", dir, strerror(errno));
    return 0;
}

/* The save's files: ram, state, with a disk disk.qcow2, mid1.qcow2 ..., and its volumes'
 * copies (vol0.raw, vol1.qcow2 ...: after all the others; *first_vol says where they start). */
static size_t save_files(const struct al_fork *f, char names[][16], size_t *first_vol)
{
    size_t n = 0;
    snprintf(names[n++], 16, "ram");
    snprintf(names[n++], 16, "state");
    if (f->disk) {
        snprintf(names[n++], 16, "disk.qcow2");
        for (size_t i = 1; i <= f->nmids && i < 100; i++)
            snprintf(names[n++], 16, "mid%u.qcow2", (unsigned)i);
    }
    *first_vol = n;
    for (size_t i = 0; i < f->nvols && i < 10; i++)
        snprintf(names[n++], 16, "vol%u.%s", (unsigned)i, f->vols[i].read_only ? "qcow2" : "raw");
    return n;
}

/* The manifest: what a fork of the save must be, and each file as it was (the SHA-256 of all but
 * the RAM file and the volumes' copies, whose ctime stands for their content: only root can set
 * one back; the others' ctime changes as forks and later saves link them). */
static int snapshot_seal(const struct al_fork *f, const char *name, const char *source,
                         al_error *err)
{
    _cleanup_cjson_ cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "format", SNAPSHOT_FORMAT);
    cJSON_AddStringToObject(j, "name", name);
    cJSON_AddStringToObject(j, "source", source);
    cJSON_AddStringToObject(j, "image", f->image);
    cJSON_AddStringToObject(j, "image_disk", f->image_disk);
    cJSON_AddStringToObject(j, "image_id", f->image_id);
    cJSON_AddStringToObject(j, "qemu", f->qemu);
    cJSON_AddNumberToObject(j, "memory_mib", f->mem);
    cJSON_AddNumberToObject(j, "vcpus", f->vcpus);
    cJSON_AddNumberToObject(j, "display_width", f->display_w);
    cJSON_AddNumberToObject(j, "display_height", f->display_h);
    cJSON_AddBoolToObject(j, "kvm", f->kvm);
    cJSON_AddBoolToObject(j, "display", f->display);
    cJSON_AddBoolToObject(j, "disk", f->disk);
    cJSON_AddBoolToObject(j, "scratch", f->scratch);
    cJSON_AddBoolToObject(j, "net", f->net);
    cJSON_AddNumberToObject(j, "mids", (double)f->nmids);
    cJSON_AddNumberToObject(j, "disk_size", (double)f->disk_size);
    cJSON_AddNumberToObject(j, "created", (double)time(NULL));
    cJSON *vols = cJSON_AddArrayToObject(j, "volumes");
    for (size_t i = 0; i < f->nvols; i++) {
        cJSON *v = cJSON_CreateObject();
        cJSON_AddStringToObject(v, "name", f->vols[i].name);
        cJSON_AddStringToObject(v, "path", f->vols[i].path);
        cJSON_AddBoolToObject(v, "read_only", f->vols[i].read_only);
        cJSON_AddNumberToObject(v, "size", (double)f->vols[i].size);
        cJSON_AddItemToArray(vols, v);
    }
    cJSON *files = cJSON_AddObjectToObject(j, "files");
    char names[SNAPSHOT_FILES_MAX][16];
    size_t first_vol;
    size_t n = save_files(f, names, &first_vol);
    for (size_t i = 0; i < n; i++) {
        char path[AL_PATH_MAX];
        struct al_file_rec rec;
        if (al_pathf(path, sizeof(path), "%s/%s", f->dir, names[i]) < 0)
            return al_err(err, -ENAMETOOLONG, "snapshot path too long");
        int r = al_file_record(path, i != 0 && i < first_vol, &rec);
        if (r < 0)
            return al_err(err, r, "cannot seal '%s': %s", path, strerror(-r));
        al_manifest_file_add(files, names[i], &rec);
    }
    return al_manifest_write_private(f->dir, j, err);
}

static const char *mstr(const cJSON *j, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static double mnum(const cJSON *j, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

static uint64_t dir_bytes(const char *dir)
{
    uint64_t total = 0;
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    for (struct dirent *e; (e = readdir(d));) {
        struct stat st;
        if (e->d_name[0] != '.' && fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
            S_ISREG(st.st_mode))
            total += (uint64_t)st.st_blocks * 512u;
    }
    closedir(d);
    return total;
}

static void snapshot_info_of(const char *dir, const cJSON *j, al_snapshot_info *out)
{
    snprintf(out->name, sizeof(out->name), "%s", mstr(j, "name"));
    snprintf(out->image, sizeof(out->image), "%s", mstr(j, "image"));
    snprintf(out->source, sizeof(out->source), "%s", mstr(j, "source"));
    out->memory_mib = mnum(j, "memory_mib") > 0 ? (unsigned)mnum(j, "memory_mib") : 0;
    out->created = (int64_t)mnum(j, "created");
    out->bytes = dir_bytes(dir);
}

int al_snapshot_save(al_session *s, const char *name, bool replace, al_snapshot_info *out,
                     al_error *err)
{
    if (out && AL_SIZED_OUT(out, "al_snapshot_info", err) < 0)
        return err->code;
    char dst[AL_PATH_MAX];
    int r = snapshot_path(name, dst, sizeof(dst), err);
    if (r < 0)
        return r;
    struct stat st;
    if (!replace && lstat(dst, &st) == 0)
        return al_err(err, -EEXIST, "a snapshot named '%s' exists", name);
    al_fork *f = NULL;
    r = fork_save(s, true, &f, err);
    if (r < 0)
        return r;
    r = snapshot_seal(f, name, s->name, err);
    /* One in its place is moved among the forks' saves: the sessions started from it keep
     * it until they end (al_fork_reap). */
    char old[AL_PATH_MAX] = "";
    if (r == 0 && replace && lstat(dst, &st) == 0 &&
        (r = move_to_forks(dst, old, sizeof(old), err)) < 0)
        old[0] = '\0';
    if (r == 0 && renameat2(AT_FDCWD, f->dir, AT_FDCWD, dst, RENAME_NOREPLACE) < 0)
        r = al_err(err, -errno,
                   errno == EEXIST ? "a snapshot named '%s' exists"
                                   : "cannot keep snapshot '%s': %s",
                   name, strerror(errno));
    if (r == 0)
        f->dir[0] = '\0'; /* it is the snapshot's now */
    al_fork_free(f);
    if (old[0])
        al_fork_reap_dir(old);
    if (r < 0)
        return r;
    if (out) {
        al_error why = {0};
        _cleanup_cjson_ cJSON *j = al_manifest_read(dst, &why);
        snapshot_info_of(dst, j, out);
    }
    return 0;
}

int al_snapshot_open(const char *name, const al_session_opts *opts, al_session **out, al_error *err)
{
    char dir[AL_PATH_MAX];
    int r = snapshot_path(name, dir, sizeof(dir), err);
    if (r < 0)
        return r;
    struct stat st;
    if (lstat(dir, &st) < 0 || !S_ISDIR(st.st_mode))
        return al_err(err, -ENOENT, "no snapshot named '%s'", name);
    al_error why = {0};
    _cleanup_cjson_ cJSON *j = al_manifest_read(dir, &why);
    if (!j || mnum(j, "format") != SNAPSHOT_FORMAT || strcmp(mstr(j, "name"), name))
        return al_err(err, -EBADMSG, "snapshot '%s' is not usable: %s", name,
                      j ? "its manifest is not one of this airlock's" : why.msg);
    struct al_fork f = {.lock_fd = -1};
    snprintf(f.dir, sizeof(f.dir), "%s", dir);
    snprintf(f.image, sizeof(f.image), "%s", mstr(j, "image"));
    snprintf(f.image_disk, sizeof(f.image_disk), "%s", mstr(j, "image_disk"));
    snprintf(f.image_id, sizeof(f.image_id), "%s", mstr(j, "image_id"));
    snprintf(f.qemu, sizeof(f.qemu), "%s", mstr(j, "qemu"));
    f.mem = (unsigned)mnum(j, "memory_mib");
    f.vcpus = (unsigned)mnum(j, "vcpus");
    f.display_w = (unsigned)mnum(j, "display_width");
    f.display_h = (unsigned)mnum(j, "display_height");
    f.kvm = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "kvm"));
    f.display = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "display"));
    f.disk = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "disk"));
    f.scratch = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "scratch"));
    f.net = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "net"));
    double nm = mnum(j, "mids");
    if (nm < 0 || nm >= AL_DISK_MIDS_MAX || f.mem < 16 || f.vcpus < 1 || !f.image[0])
        return al_err(err, -EBADMSG, "snapshot '%s' is not usable: its manifest is damaged", name);
    f.nmids = (size_t)nm;
    f.disk_size = (uint64_t)mnum(j, "disk_size");
    const cJSON *v;
    cJSON_ArrayForEach(v, cJSON_GetObjectItemCaseSensitive(j, "volumes"))
    {
        if (f.nvols == AL_VOLS_MAX || mnum(v, "size") <= 0)
            return al_err(err, -EBADMSG, "snapshot '%s' is not usable: its manifest is damaged",
                          name);
        struct al_fork_vol *fv = &f.vols[f.nvols++];
        snprintf(fv->name, sizeof(fv->name), "%s", mstr(v, "name"));
        snprintf(fv->path, sizeof(fv->path), "%s", mstr(v, "path"));
        fv->read_only = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(v, "read_only"));
        fv->size = (uint64_t)mnum(v, "size");
    }
    char names[SNAPSHOT_FILES_MAX][16];
    const char *list[SNAPSHOT_FILES_MAX];
    size_t first_vol;
    size_t n = save_files(&f, names, &first_vol);
    for (size_t i = 0; i < n; i++)
        list[i] = names[i];
    unsigned vols_mask = ((1u << n) - 1) & ~((1u << first_vol) - 1);
    if (!al_manifest_files_intact(dir, j, list, n, ~1u & ~vols_mask, 1u | vols_mask, &why))
        return al_err(err, -EBADMSG, "snapshot '%s' is not usable: %s", name, why.msg);
    return al_fork_open(&f, opts, out, err);
}

int al_snapshot_list(const char *prefix, void (*fn)(void *ctx, const al_snapshot_info *s),
                     void *ctx, al_error *err)
{
    char dir[AL_PATH_MAX];
    int r = al_state_subdir(SNAPSHOTS_DIR, dir, sizeof(dir), err);
    if (r < 0)
        return r;
    DIR *d = opendir(dir);
    if (!d)
        return al_err(err, -errno, "cannot list '%s': %s", dir, strerror(errno));
    int count = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (!al_snapshot_name_ok(e->d_name) ||
            (prefix && strncmp(e->d_name, prefix, strlen(prefix))))
            continue;
        char path[AL_PATH_MAX];
        al_error why = {0};
        if (al_pathf(path, sizeof(path), "%s/%s", dir, e->d_name) < 0)
            continue;
        _cleanup_cjson_ cJSON *j = al_manifest_read(path, &why);
        if (!j || strcmp(mstr(j, "name"), e->d_name))
            continue;
        al_snapshot_info info = {.struct_size = sizeof(info)};
        snapshot_info_of(path, j, &info);
        fn(ctx, &info);
        count++;
    }
    closedir(d);
    return count;
}

int al_snapshot_remove(const char *name, al_error *err)
{
    char dir[AL_PATH_MAX], to[AL_PATH_MAX];
    int r = snapshot_path(name, dir, sizeof(dir), err);
    if (r < 0)
        return r;
    struct stat st;
    if (lstat(dir, &st) < 0 || !S_ISDIR(st.st_mode))
        return al_err(err, -ENOENT, "no snapshot named '%s'", name);
    /* Among the forks' saves: gone now, or when the last session started from it ends. */
    r = move_to_forks(dir, to, sizeof(to), err);
    if (r < 0)
        return r;
    al_fork_reap_dir(to);
    return 0;
}

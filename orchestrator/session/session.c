/* A session: one disposable VM, its runtime directory and the agent channel into it. */
#include "budget.h"
#include "checkpoint.h"
#include "control.h"
#include "gc.h"
#include "keep.h"
#include "link.h"
#include "net.h"
#include "proc.h"
#include "screen.h"
#include "template.h"
#include "transport.h"
#include "vols.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>

#define BOOT_TIMEOUT_MS_DEFAULT 60000
#define MEMORY_MIB_DEFAULT 256

/* One vCPU by default. Two stream faster under emulation (guest->host 80 -> 126 MB/s in one
 * paired airlock-bench run), but one boot in about a hundred with two vCPUs never reached the
 * agent, and none with one; until that is understood, --cpus 2 is opt-in. */
#define VCPUS_DEFAULT 1

/* Makes SESSIONS/NAME (al_sessions_dir), 0755 (QEMU runs as another user under qemu:///system
 * and must traverse it), holding a lock file flocked for the session's life: made under a
 * hidden name gc ignores and renamed once locked, so gc never sees it unlocked. The path goes
 * to out. */
static int locked_dir_create(const char *sessions, const char *name, char *out, size_t outlen,
                             int *lock_fd, al_error *err)
{
    char tmp[AL_PATH_MAX], lock[AL_PATH_MAX];
    if (al_pathf(out, outlen, "%s/%s", sessions, name) < 0 ||
        al_pathf(tmp, sizeof(tmp), "%s/.%s", sessions, name) < 0 ||
        al_pathf(lock, sizeof(lock), "%s/lock", tmp) < 0)
        return al_err(err, -ENAMETOOLONG, "session path too long");
    if (mkdir(sessions, 0755) < 0 && errno != EEXIST)
        return al_err(err, -errno, "cannot create '%s': %s", sessions, strerror(errno));
    if (mkdir(tmp, 0755) < 0)
        return al_err(err, -errno, "cannot create session dir '%s': %s", tmp, strerror(errno));
    chmod(tmp, 0755); /* whatever the umask */
    *lock_fd = al_file_create_private(lock, O_RDWR);
    if (*lock_fd < 0)
        errno = -*lock_fd;
    if (*lock_fd < 0 || flock(*lock_fd, LOCK_EX | LOCK_NB) < 0 || rename(tmp, out) < 0) {
        int e = errno;
        al_rmtree(tmp);
        return al_err(err, -e, "cannot set up session dir '%s': %s", out, strerror(e));
    }
    return 0;
}

/* The session's two dirs: the runtime one (sockets, console, lock) and the disk-backed state
 * one for its root disk overlay and checkpoints, which may grow to gigabytes and so never live
 * in the runtime dir (tmpfs: the host's RAM). No session starts below the free-space floor. */
int al_session_dir_make(bool state, const char *name, char *out, size_t outlen, int *lock_fd,
                        al_error *err)
{
    char sessions[AL_PATH_MAX];
    int r = al_sessions_dir(sessions, sizeof(sessions), state, err);
    return r < 0 ? r : locked_dir_create(sessions, name, out, outlen, lock_fd, err);
}

static int session_dir_create(al_session *s, al_error *err)
{
    char sessions[AL_PATH_MAX], state[AL_PATH_MAX];
    int r = al_sessions_dir(sessions, sizeof(sessions), false, err);
    if (r == 0)
        r = locked_dir_create(sessions, s->name, s->dir, sizeof(s->dir), &s->lock_fd, err);
    if (r < 0)
        return r;
    s->dir_created = true;
    r = al_state_dir(state, sizeof(state), err);
    if (r < 0)
        return r;
    al_error why = {0};
    r = al_check_free_space(state, al_free_floor(), &why);
    if (r < 0)
        return al_err(err, r, "cannot start a session: %s", why.msg);
    r = al_sessions_dir(sessions, sizeof(sessions), true, err);
    if (r == 0)
        r = locked_dir_create(sessions, s->name, s->state_dir, sizeof(s->state_dir),
                              &s->state_lock_fd, err);
    if (r < 0)
        return r;
    s->state_created = true;
    if (al_pathf(s->sock, sizeof(s->sock), "%s/agent.sock", s->dir) < 0 ||
        al_pathf(s->console, sizeof(s->console), "%s/console.log", s->dir) < 0 ||
        (s->raw_port[0] && al_pathf(s->raw_sock, sizeof(s->raw_sock), "%s/raw.sock", s->dir) < 0))
        return al_err(err, -ENAMETOOLONG, "session path too long");
    return 0;
}

/* Notices to the caller's FILE (al_session_opts.notice). */
static void notice_to_file(void *f, const char *msg)
{
    fprintf(f, "airlock: notice: %s\n", msg);
}

void al_notice_route(const al_session_opts *o, const char *fmt, va_list ap)
{
    if (o->quiet)
        return;
    /* The library never prints on its own: the caller's callback, else the caller's FILE. */
    if (o->on_notice)
        al_vnotify(o->on_notice, o->notice_ctx, fmt, ap);
    else
        al_vnotify(o->notice ? notice_to_file : NULL, o->notice, fmt, ap);
}

#define session_notice al_session_notice
void al_session_notice(al_session *s, const char *fmt, ...)
{
    al_session_opts o = {.quiet = s->quiet,
                         .on_notice = s->on_notice,
                         .notice_ctx = s->notice_ctx,
                         .notice = s->notice};
    va_list ap;
    va_start(ap, fmt);
    al_notice_route(&o, fmt, ap);
    va_end(ap);
}

static bool accel_forced(void)
{
    const char *accel = getenv("AIRLOCK_ACCEL");
    return accel && *accel;
}

/* The part of libvirt's error that says why QEMU refused KVM: QEMU's own "error: ..." when it
 * is there ("failed to set MSR 0x10a to 0x69"), else the start of the message. */
static void kvm_start_evidence(const char *msg, char *out, size_t len)
{
    const char *e = strstr(msg, "qemu-system-x86_64: error: ");
    if (e)
        e = strstr(e, "error: ");
    if (!e) {
        snprintf(out, len, "QEMU: %.120s", msg);
        return;
    }
    e += strlen("error: ");
    const char *end = strstr(e, " qemu-system");
    int n = end ? (int)(end - e) : (int)strlen(e);
    snprintf(out, len, "QEMU: %.*s", n > 120 ? 120 : n, e);
}

/* Records what KVM did: this machine's verdict file, or, for a session on another host, that
 * host's verdict in this process. */
static void kvm_verdict(al_session *s, bool works, const char *evidence)
{
    if (s->remote)
        al_kvm_remote_record(s->conn, works);
    else
        al_kvm_record(works, evidence);
}

/* Starts the domain. A start that failed for the transport's reasons (a forwarded port taken
 * since it was picked) is tried again as it says. A KVM that QEMU refuses ("failed to set
 * MSR") falls back to emulation, and the verdict is kept for later sessions. */
static int vm_start(al_session *s, struct al_vm_config *cfg, al_error *err)
{
    int r = al_vm_start(s->conn, cfg, &s->dom, err);
    const struct al_transport_ops *ops = s->tport->ops;
    for (int i = 0; i < 3 && r < 0 && ops->retry_start; i++) {
        al_error why = *err;
        *err = (al_error){0};
        r = ops->retry_start(s->tport, cfg, why.msg, err);
        if (r == 0) {
            *err = why;
            r = why.code;
            break;
        }
        if (r > 0)
            r = al_vm_start(s->conn, cfg, &s->dom, err);
    }
    if (r < 0 && cfg->kvm && !accel_forced()) {
        char why[200];
        kvm_start_evidence(err->msg, why, sizeof(why));
        *err = (al_error){0};
        cfg->kvm = s->kvm = false;
        r = al_vm_start(s->conn, cfg, &s->dom, err);
        if (r == 0) {
            kvm_verdict(s, false, why);
            session_notice(s, "KVM failed (%s); running the VM in software emulation (slower)",
                           why);
        }
    }
    return r;
}

/* Whether the domain stopped on its own (QEMU pauses the guest on a KVM internal error; a guest
 * that crashed or reset is gone), described into ev. */
static bool domain_stopped(al_session *s, char *ev, size_t len)
{
    int state = 0, reason = 0;
    if (virDomainGetState(s->dom, &state, &reason, 0) < 0) {
        snprintf(ev, len, "the VM is gone");
        return true;
    }
    if (state == VIR_DOMAIN_RUNNING)
        return false;
    snprintf(ev, len, "the VM %s (libvirt state %d, reason %d)",
             state == VIR_DOMAIN_PAUSED ? "was paused by QEMU" : "stopped", state, reason);
    return true;
}

/* Connects to the agent and handshakes. When probing a KVM no guest has run with yet, the guest
 * gets until probe_deadline to answer while the domain is watched: a domain QEMU stopped, or
 * silence, is taken as KVM unable to run it (-EAGAIN, evidence in ev). */
static int wait_guest(al_session *s, uint64_t deadline, uint64_t probe_deadline, unsigned probe_s,
                      char *ev, size_t evlen, al_error *err)
{
    if (!probe_deadline) {
        int r = al_link_connect(s, deadline, err);
        return r < 0 ? r : al_link_handshake(s, deadline, err);
    }
    if (probe_deadline > deadline)
        probe_deadline = deadline;
    if (s->tport->ops->guest_side) {
        /* Connecting succeeds only once the guest runs: the connection is the proof. */
        int r = al_link_connect(s, probe_deadline, err);
        if (r < 0 && r != -ECANCELED &&
            (domain_stopped(s, ev, evlen) || al_now_ms() + 500 >= probe_deadline)) {
            if (!ev[0])
                snprintf(ev, evlen, "the guest's %s did not answer within %u s",
                         s->tport->ops->peer, probe_s);
            *err = (al_error){0};
            return -EAGAIN;
        }
        return r < 0 ? r : al_link_handshake(s, deadline, err);
    }
    /* QEMU's socket answers before the guest runs: the handshake is the proof. */
    int r = al_link_connect(s, deadline, err);
    uint64_t nonce = 0;
    if (r == 0)
        r = al_link_send_hello(s, &nonce, err);
    if (r < 0)
        return r;
    for (;;) {
        uint64_t slice = al_now_ms() + 250;
        r = al_link_hello_wait(s, nonce, slice < probe_deadline ? slice : probe_deadline, err);
        if (r == 0)
            return 0;
        bool timed_out = r == -ETIMEDOUT && err->code == 0;
        if (!timed_out && r != -ECONNRESET)
            return r;
        if (domain_stopped(s, ev, evlen)) {
            *err = (al_error){0};
            return -EAGAIN;
        }
        if (!timed_out)
            return r;
        if (al_now_ms() >= probe_deadline) {
            snprintf(ev, evlen, "the guest did not answer within %u s", probe_s);
            return -EAGAIN;
        }
    }
}

/* KVM did not run the guest: destroys the domain and starts it again under emulation, on a
 * fresh overlay (the first guest may have written to its disk) and console. */
static int fall_back_to_emulation(al_session *s, struct al_vm_config *cfg, const char *why,
                                  al_error *err)
{
    char qemu[300], ev[600];
    al_vm_kvm_log_evidence(s->conn, s->name, qemu, sizeof(qemu));
    snprintf(ev, sizeof(ev), "%s%s%s", why, qemu[0] ? "; " : "", qemu);
    virDomainDestroy(s->dom);
    virDomainFree(s->dom);
    s->dom = NULL;
    al_link_detach(s);
    kvm_verdict(s, false, ev);
    session_notice(s,
                   "KVM did not run the guest (%s); running it in software emulation (slower). "
                   "Later sessions on this %s go straight to emulation",
                   ev, s->remote ? "host" : "boot");
    cfg->kvm = s->kvm = false;
    cfg->image = s->remote ? &s->rimg : &s->img;
    unlink(s->console);
    if (cfg->disk && s->remote) { /* a fresh overlay volume there */
        char vol[80];
        _cleanup_free_ char *path = NULL;
        al_session_volume(s, false, vol);
        al_volume_delete(s->conn, vol);
        s->vol_made = false;
        int r = al_volume_create(s->conn, false, vol, 0, s->img.disk, s->rimg.disk, &path, err);
        if (r < 0)
            return r;
        s->vol_made = true;
        if (strcmp(path, cfg->disk))
            return al_err(err, -EIO, "volume '%s' moved to '%s'", vol, path);
    } else if (cfg->disk) {
        unlink(cfg->disk);
        int r = al_disk_overlay(s->conn, false, s->img.disk, cfg->disk, err);
        if (r < 0)
            return r;
    }
    return vm_start(s, cfg, err);
}

/* Boots the guest to the agent's handshake. Where KVM is not proven on this boot, the first
 * attempt is watched (wait_guest) and falls back to emulation when the guest does not run: a
 * host whose /dev/kvm opens but cannot execute a guest costs the probe window once, after which
 * the recorded verdict sends every session straight to emulation. AIRLOCK_KVM_PROBE_S sets the
 * window (default 6 s; 20 s for images reached over SSH, which boot further before answering).
 * AIRLOCK_TEST_KVM_LIE (tests only) makes the first attempt a guest that cannot run (its kernel
 * finds no init and halts, as if its vCPU never ran), under emulation on any host, so the
 * fallback is exercised everywhere. */
static int boot_guest(al_session *s, struct al_vm_config *cfg, bool probe, uint64_t *start,
                      uint64_t *started, al_error *err)
{
    al_image lie = AL_IMAGE_INIT;
    bool test_lie = getenv("AIRLOCK_TEST_KVM_LIE") && s->img.kernel[0];
    if (test_lie) {
        lie = s->img;
        if (al_pathf(lie.cmdline, sizeof(lie.cmdline), "%s panic=0 rdinit=/airlock-test-kvm-lie",
                     s->img.cmdline) < 0)
            return al_err(err, -ENAMETOOLONG, "kernel command line too long");
        cfg->image = &lie;
        cfg->kvm = false;
    }
    int r = vm_start(s, cfg, err);
    if (r < 0)
        return r;
    *started = al_now_ms();
    probe = probe && (cfg->kvm || test_lie); /* a KVM refused at start fell back already */
    /* An image booted by its own boot loader gets longer, as does a transport that needs more
     * of the guest up before it answers. */
    uint64_t probe_ms = !s->img.kernel[0] ? 20000 : s->tport->ops->probe_ms;
    const char *env = getenv("AIRLOCK_KVM_PROBE_S");
    if (env && atoi(env) > 0)
        probe_ms = (uint64_t)atoi(env) * 1000u;
    char ev[300] = "";
    /* The evidence names the window (counted from the domain's start), not what was left of it. */
    r = wait_guest(s, *start + s->boot_timeout_ms, probe ? *start + probe_ms : 0,
                   (unsigned)((probe_ms + 999) / 1000), ev, sizeof(ev), err);
    if (r == -EAGAIN) {
        *start = al_now_ms();
        r = fall_back_to_emulation(s, cfg, ev, err);
        if (r < 0)
            return r;
        *started = al_now_ms();
        r = wait_guest(s, *start + s->boot_timeout_ms, 0, 0, ev, sizeof(ev), err);
    } else if (r == 0 && probe && s->kvm) {
        kvm_verdict(s, true, NULL);
    }
    return r;
}

static bool vm_gone(const al_session *s)
{
    return s->dom && !virDomainIsActive(s->dom);
}

/* A session not yet booted: its fields from opts, nothing acquired; NULL when out of memory. */
al_session *al_session_new(const al_session_opts *opts)
{
    al_session *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->vm_gone = vm_gone;
    s->mux = al_link_mux_new();
    if (!s->mux) {
        free(s);
        return NULL;
    }
    s->lock_fd = -1;
    s->state_lock_fd = -1;
    s->ch.fd = -1;
    s->ch.alarm_fd = -1;
    s->budget_stop[0] = s->budget_stop[1] = s->budget_alarm[0] = s->budget_alarm[1] = -1;
    s->lease_stop[0] = s->lease_stop[1] = -1;
    /* Recursive: a request made of several (a workdir copy) may hold it around its parts. */
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&s->lock, &ma);
    pthread_mutexattr_destroy(&ma);
    s->cancel_fd = opts->cancel_fd > 0 ? opts->cancel_fd : -1;
    s->quiet = opts->quiet;
    s->notice = opts->notice;
    s->on_notice = opts->on_notice;
    s->notice_ctx = opts->notice_ctx;
    s->console_to = opts->console_to;
    s->stall_ms = opts->stall_timeout_ms;
    s->boot_timeout_ms = opts->boot_timeout_ms ? opts->boot_timeout_ms : BOOT_TIMEOUT_MS_DEFAULT;
    s->next_id = 1;
    if (opts->raw_port)
        snprintf(s->raw_port, sizeof(s->raw_port), "%s", opts->raw_port);
    return s;
}

/* The least memory a session of img boots in: the kernel and what unpacking its initrd takes (80
 * MiB and twice the initrd's size; measured with tiny and debian under emulation: 64 MiB ends
 * in the kernel killing the agent, 80 boots), rounded up to 16 MiB; an image booted by its
 * firmware from its disk (imported cloud images) needs 256. */
static unsigned image_min_memory_mib(const al_image *img)
{
    struct stat st;
    if (!img->kernel[0])
        return 256;
    uint64_t initrd = img->initrd[0] && stat(img->initrd, &st) == 0 ? (uint64_t)st.st_size : 0;
    uint64_t mib = 80 + (2 * initrd + (1u << 20) - 1) / (1u << 20);
    return (unsigned)((mib + 15) / 16 * 16);
}

/* Loads the image and settles the transport (into kind): the image's, or the one asked for if
 * it has it. */
static int session_load_image(al_session *s, const al_session_opts *opts, enum al_transport *kind,
                              al_error *err)
{
    s->img.struct_size = sizeof(s->img);
    int r = al_image_load(opts->image ? opts->image : al_image_default(), &s->img, err);
    if (r < 0)
        return r;
    *kind = s->img.transport;
    if (!s->screen && al_image_has_display(&s->img) && !(s->screen = al_screen_new()))
        return al_err(err, -ENOMEM, "out of memory");
    if (opts->transport != AL_TRANSPORT_IMAGE && opts->transport != AL_TRANSPORT_VIRTIO &&
        opts->transport != AL_TRANSPORT_SSH)
        return al_err(err, -EINVAL, "unknown transport %d (virtio or ssh)", (int)opts->transport);
    if (opts->transport == AL_TRANSPORT_VIRTIO && s->img.transport == AL_TRANSPORT_SSH)
        return al_err(err, -EINVAL,
                      "image '%s' has no agent of its own to serve virtio-serial; use "
                      "--transport ssh",
                      s->img.name);
    if (opts->transport == AL_TRANSPORT_SSH && s->img.transport != AL_TRANSPORT_SSH)
        return al_err(err, -EINVAL,
                      "image '%s' has no SSH server; use an SSH image ('airlock image build "
                      "sshd', or 'airlock image import')",
                      s->img.name);
    unsigned min = image_min_memory_mib(&s->img);
    if (opts->memory_mib && opts->memory_mib < min)
        return al_err(err, -EINVAL,
                      "%u MiB of memory is too little for image '%s': it needs at "
                      "least %u MiB",
                      opts->memory_mib, s->img.name, min);
    return 0;
}

/* Names the session (a random domain name) and creates its directories. */
static int session_name_and_dirs(al_session *s, al_error *err)
{
    uint8_t rnd[6];
    if (getrandom(rnd, sizeof(rnd), 0) != sizeof(rnd))
        return al_err(err, -errno, "getrandom: %s", strerror(errno));
    snprintf(s->name, sizeof(s->name), AL_DOMAIN_PREFIX "%02x%02x%02x%02x%02x%02x", rnd[0], rnd[1],
             rnd[2], rnd[3], rnd[4], rnd[5]);
    return session_dir_create(s, err);
}

/* Sets s->kvm and says why when there is none; whether the first boot is a KVM probe. */
static bool session_choose_accel(al_session *s)
{
    if (s->remote) {
        /* Another host: KVM when libvirt there offers it and no session of this process found
         * it broken there; the first boot under it is watched as here (boot_guest). */
        const char *accel = getenv("AIRLOCK_ACCEL");
        int verdict = al_kvm_remote_verdict(s->conn);
        bool offered = !(accel && !strcmp(accel, "tcg")) && al_kvm_remote_offered(s->conn);
        s->kvm = (accel && !strcmp(accel, "kvm")) || (offered && verdict != 0);
        if (!s->kvm)
            session_notice(s, "%s; running the VM in software emulation there (slower)",
                           accel && !strcmp(accel, "tcg") ? "AIRLOCK_ACCEL=tcg"
                           : verdict == 0 ? "KVM could not run a guest on that host earlier"
                                          : "the remote host offers no usable KVM");
        return s->kvm && !accel_forced() && verdict == -1;
    }
    /* Read once: /dev/kvm opened and the recorded verdict read. */
    enum al_kvm_state ks = al_kvm_state();
    s->kvm = al_kvm_state_usable(ks);
    /* A KVM no guest has run with yet on this boot is tried, and watched (boot_guest). */
    bool probe = s->kvm && !accel_forced() && ks == AL_KVM_UNPROVEN;
    if (getenv("AIRLOCK_TEST_KVM_LIE") && s->img.kernel[0] && !accel_forced())
        probe = true; /* tests: the first attempt's guest cannot run (boot_guest) */
    if (!s->kvm) {
        char ev[300] = "";
        al_kvm_evidence(ev, sizeof(ev));
        session_notice(s, "%s%s%s; running the VM in software emulation (slower)",
                       ks == AL_KVM_FAILED ? "KVM could not run a guest on this boot earlier"
                       : ks == AL_KVM_OFF  ? "AIRLOCK_ACCEL=tcg"
                                           : "/dev/kvm is not usable",
                       ev[0] ? ": " : "", ev);
    }
    return probe;
}

static unsigned session_memory_mib(const al_session *s, const al_session_opts *opts)
{
    return opts->memory_mib    ? opts->memory_mib
           : s->img.memory_mib ? s->img.memory_mib
                               : MEMORY_MIB_DEFAULT;
}

/* A session on a remote host: the image's parts and the overlay are volumes there, the console
 * a pty nobody reads (no file of ours is on that host). */
static int session_prepare_remote(al_session *s, const al_session_opts *opts,
                                  struct al_vm_config *cfg, al_error *err)
{
    if (s->raw_port[0])
        return al_err(err, -EOPNOTSUPP, "a benchmark port works on the local host only");
    if (opts->net.allow && opts->net.allow[0])
        return al_err(err, -EOPNOTSUPP,
                      "network on request works on the local host only (its proxy runs here)");
    bool uploaded = false;
    int r = al_volume_image(s->conn, &s->img, &s->rimg, &uploaded, err);
    if (r < 0)
        return r;
    if (uploaded)
        session_notice(s, "image '%s' uploaded to the remote host", s->img.name);
    if (s->img.disk[0]) {
        char vol[80];
        _cleanup_free_ char *disk = NULL;
        al_session_volume(s, false, vol);
        r = al_volume_create(s->conn, s->kvm, vol, 0, s->img.disk, s->rimg.disk, &disk, err);
        if (r < 0)
            return r;
        s->vol_made = true;
        if (al_pathf(s->rdisk, sizeof(s->rdisk), "%s", disk) < 0)
            return al_err(err, -ENAMETOOLONG, "volume path too long");
    }
    *cfg = (struct al_vm_config){
        .name = s->name,
        .session_dir = s->dir,
        .image = &s->rimg,
        .memory_mib = session_memory_mib(s, opts),
        .vcpus = opts->vcpus ? opts->vcpus : VCPUS_DEFAULT,
        .kvm = s->kvm,
        .disk = s->rdisk[0] ? s->rdisk : NULL,
        .display = s->screen != NULL,
        .display_w = s->display_w,
        .display_h = s->display_h,
    };
    r = s->tport->ops->prepare(s->tport, cfg, s->kvm, err);
    if (r == 0 && opts->checkpoints)
        r = al_checkpoints_prepare(s, cfg, err);
    return r;
}

int al_session_transport_new(al_session *s, enum al_transport kind, al_error *err)
{
    struct al_transport_env env = {
        .name = s->name,
        .dir = s->dir,
        .agent_sock = s->sock,
        .console = s->console,
        .img = &s->img,
        .conn = s->conn,
        .cancel_fd = s->cancel_fd,
        .remote = s->remote,
    };
    return al_transport_new(kind, &env, &s->tport, err);
}

/* The disk overlay (into disk, which cfg then points at) and the domain's configuration, with
 * what the transport (of kind) and checkpoints add to it. */
static int session_prepare_vm(al_session *s, const al_session_opts *opts, enum al_transport kind,
                              char *disk, size_t disklen, struct al_vm_config *cfg, al_error *err)
{
    int r = al_session_transport_new(s, kind, err);
    if (r < 0)
        return r;
    if (s->remote)
        return session_prepare_remote(s, opts, cfg, err);
    /* Restored from a template: the overlay lies on the template's frozen disk. */
    const char *const *mids = al_template_mids(s->tmpl);
    if (s->img.disk[0]) {
        /* In the session dir: removed with it, by close or by gc after a crash. */
        if (al_pathf(disk, disklen, "%s/disk.qcow2", s->state_dir) < 0)
            return al_err(err, -ENAMETOOLONG, "session path too long");
        /* A fork's chain is spelled out in the domain's description; its headers may name
         * paths long gone (a save reaped), so they are not opened. */
        r = al_template_is_fork(s->tmpl)
                ? al_disk_overlay_sized(s->conn, s->kvm, mids[0], "qcow2",
                                        al_template_disk_size(s->tmpl), disk, err)
                : al_disk_overlay(s->conn, s->kvm, mids ? mids[0] : s->img.disk, disk, err);
        if (r < 0)
            return r;
    }
    *cfg = (struct al_vm_config){
        .name = s->name,
        .session_dir = s->dir,
        .image = &s->img,
        .memory_mib = session_memory_mib(s, opts),
        .vcpus = opts->vcpus ? opts->vcpus : VCPUS_DEFAULT,
        .disk_mids = s->img.disk[0] ? mids : NULL,
        .kvm = s->kvm,
        .console_path = s->console,
        .disk = s->img.disk[0] ? disk : NULL,
        .raw_sock = s->raw_port[0] ? s->raw_sock : NULL,
        .raw_port_name = s->raw_port,
        .display = s->screen != NULL,
        .display_w = s->display_w,
        .display_h = s->display_h,
    };
    r = s->tport->ops->prepare(s->tport, cfg, s->kvm, err);
    if (r < 0)
        return r;
    if (opts->checkpoints) {
        r = al_checkpoints_prepare(s, cfg, err);
        if (r < 0)
            return r;
    }
    return al_net_prepare(s, opts, cfg, err); /* network on request: the proxy, the NIC */
}

/* ---- warm starts (template.c) ---- */
/* A template that failed to restore: the domain goes, and the session boots cold on a fresh
 * overlay of the image's base. */
static int warm_fall_back(al_session *s, struct al_vm_config *cfg, const al_error *why,
                          al_error *err)
{
    session_notice(s, "the warm template could not be restored (%s); booting cold", why->msg);
    if (s->dom) {
        virDomainDestroy(s->dom);
        virDomainFree(s->dom);
        s->dom = NULL;
    }
    al_link_detach(s);
    al_template_free(s->tmpl);
    s->tmpl = NULL;
    s->restored = false;
    cfg->disk_mids = NULL;
    cfg->ram_file = NULL;
    cfg->incoming = false;
    unlink(s->console);
    if (!cfg->disk)
        return 0;
    unlink(cfg->disk);
    return al_disk_overlay(s->conn, s->kvm, s->img.disk, cfg->disk, err);
}

/* The template this session restores (s->tmpl), when there is one and it is intact; one notice
 * when one was refused. Built beforehand, for AL_WARM_AUTO, by al_session_open (warm.c). */
static void session_pick_template(al_session *s, const al_session_opts *opts,
                                  enum al_transport kind)
{
    struct al_template_id id;
    al_error ignored = {0}, why = {0};
    if (!al_template_applies(s, opts, kind) ||
        al_template_id_of(s, kind, session_memory_mib(s, opts),
                          opts->vcpus ? opts->vcpus : VCPUS_DEFAULT, &id, &ignored) < 0)
        return;
    switch (al_template_find(s, &id, &why)) {
    case AL_TEMPLATE_REFUSED:
        session_notice(s,
                       "the warm template of image '%s' is not usable (%s); removed, booting "
                       "cold",
                       s->img.name, why.msg);
        break;
    case AL_TEMPLATE_STALE:
        session_notice(s,
                       "the warm template of image '%s' is stale (the image, the agent or QEMU "
                       "changed); removed, booting cold ('airlock image warm %s' rebuilds it)",
                       s->img.name, s->img.name);
        break;
    }
}

/* The guest: restored from the template when there is one (falling back to a cold boot when
 * that fails), else booted. */
static int session_start_guest(al_session *s, struct al_vm_config *cfg, bool probe, uint64_t *start,
                               uint64_t *started, al_error *err)
{
    if (s->tmpl) {
        al_error why = {0};
        int r = al_template_restore(s, cfg, &why);
        *started = al_now_ms();
        if (r == 0)
            return 0;
        if (al_template_is_fork(s->tmpl)) /* a fork is its source's state or nothing */
            return al_err(err, r, "cannot restore the fork: %s", why.msg);
        r = warm_fall_back(s, cfg, &why, err);
        if (r < 0)
            return r;
        *start = al_now_ms();
    }
    return boot_guest(s, cfg, probe, start, started, err);
}
/* ---- */

static int session_open(const al_session_opts *opts, const char *build_ram,
                        const struct al_fork_save *fork, al_session **out, al_error *err)
{
    uint64_t t_open = al_now_ms();
    al_session *s = al_session_new(opts);
    if (!s)
        return al_err(err, -ENOMEM, "out of memory");
    int r0 = al_display_size_check(opts->display_width, opts->display_height, err);
    if (r0 < 0) {
        al_session_close(s);
        return r0;
    }
    s->display_w = opts->display_width;
    s->display_h = opts->display_height;
    if ((opts->display || s->display_w) && !(s->screen = al_screen_new())) {
        al_session_close(s);
        return al_err(err, -ENOMEM, "out of memory");
    }

    enum al_transport kind;
    int r = session_load_image(s, opts, &kind, err);
    if (r < 0)
        goto fail;
    r = al_vm_connect(opts->connect_uri, &s->conn, err);
    if (r < 0)
        goto fail;
    s->remote = al_conn_remote(s->conn);
    /* Every start reaps what crashed runs left behind; a failure here is not ours to report. */
    al_error gc_err = {0};
    al_gc_conn(s->conn, &gc_err);
    r = al_keep_check(s, opts, kind, err);
    if (r < 0)
        goto fail;
    r = session_name_and_dirs(s, err);
    if (r < 0)
        goto fail;
    if (opts->volumes && opts->volumes[0]) {
        r = opts->keep ? al_err(err, -EOPNOTSUPP, "a session with volumes cannot be kept yet")
                       : al_vols_attach(s, kind, opts->volumes, err);
        if (r < 0)
            goto fail;
    }
    bool probe = session_choose_accel(s);
    /* Warm starts: never while KVM is being probed, never for a template being built. A fork
     * restores its save (fork.c), under the accelerator it was saved with. */
    if (fork) {
        probe = false;
        s->keep_identity = opts->fork_keep_identity;
        r = al_template_of_fork(s, fork, err);
        if (r == 0)
            r = al_vols_of_fork(s, fork, err);
        if (r < 0)
            goto fail;
    } else if (!probe && !build_ram) {
        session_pick_template(s, opts, kind);
    }
    char disk[AL_PATH_MAX];
    struct al_vm_config cfg;
    r = session_prepare_vm(s, opts, kind, disk, sizeof(disk), &cfg, err);
    if (r < 0)
        goto fail;
    cfg.ram_file = build_ram;
    cfg.ram_shared = build_ram != NULL;
    al_vols_config(s, &cfg);
    s->kind = kind;
    s->disk_budget = opts->disk_budget_bytes ? opts->disk_budget_bytes : AL_DISK_BUDGET_DEFAULT;
    if (s->keeper[0]) {
        cfg.keep = true;
        r = al_keep_record(s, err); /* before the domain: gc must see the marks first */
        if (r < 0)
            goto fail;
    }

    s->timing.prepare_ms = al_now_ms() - t_open;
    uint64_t start = al_now_ms();
    if (opts->lifetime_s)
        s->expires_ms = start + (uint64_t)opts->lifetime_s * 1000u;
    uint64_t started = 0;
    r = session_start_guest(s, &cfg, probe, &start, &started, err);
    if (r < 0)
        goto fail;
    r = al_net_start(s, err);
    if (r == 0 && !s->restored) /* a restored guest has them mounted already */
        r = al_vols_mount(s, err);
    if (r < 0)
        goto fail;
    r = al_budget_start(s, err);
    if (r == 0)
        r = al_keep_lease_start(s, err);
    if (r < 0)
        goto fail;
    if (!s->restored) { /* a restore keeps its own figures (template.c) */
        s->timing.start_ms = started - start;
        s->timing.handshake_ms = al_now_ms() - started;
    }
    s->vcpus = cfg.vcpus;
    *out = s;
    return 0;
fail:
    al_session_close(s);
    return r;
}

int al_session_open_for(const al_session_opts *opts, const char *build_ram, al_session **out,
                        al_error *err)
{
    return session_open(opts, build_ram, NULL, out, err);
}

int al_session_open_fork(const al_session_opts *opts, const struct al_fork_save *f,
                         al_session **out, al_error *err)
{
    return session_open(opts, NULL, f, out, err);
}

int al_session_open_peer(const char *const *argv, const al_session_opts *opts, al_session **out,
                         al_error *err)
{
    al_session *s = al_session_new(opts);
    if (!s)
        return al_err(err, -ENOMEM, "out of memory");
    snprintf(s->name, sizeof(s->name), "airlock-peer");
    int r = al_transport_peer(argv, &s->tport, err);
    uint64_t deadline = al_now_ms() + s->boot_timeout_ms;
    if (r == 0)
        r = al_link_connect(s, deadline, err);
    if (r == 0)
        r = al_link_handshake(s, deadline, err);
    if (r < 0) {
        al_session_close(s);
        return r;
    }
    if (opts->lifetime_s)
        s->expires_ms = al_now_ms() + (uint64_t)opts->lifetime_s * 1000u;
    *out = s;
    return 0;
}

void al_session_stop(al_session *s)
{
    al_link_fail_all(s, -ESHUTDOWN, "the session is being ended");
    /* Its volumes outlive it: what the guest wrote to them is written out first (a few
     * seconds at most each, however the guest behaves), as a close does. */
    if (s->nvols && s->dom && !s->stopped)
        al_vols_unmount(s);
    s->stopped = true;
    if (s->dom)
        virDomainDestroy(s->dom);
}

void al_session_close(al_session *s)
{
    al_session_release(s, false);
}

void al_session_release(al_session *s, bool keep)
{
    if (!s)
        return;
    if (keep) { /* the requests in flight end here, their processes go on in the guest */
        al_link_fail_all(s, -ESHUTDOWN, "the session was detached");
        al_link_drop_unclaimed(s);
        /* their threads let go of the channel before it is freed */
        al_error ignored = {0};
        al_link_exclusive(s, 10000, &ignored);
    }
    if (!keep && s->nvols && s->dom && !s->stopped) /* a volume left clean for the next one */
        al_vols_unmount(s);
    al_procs_end(s);
    if (s->fork_spare_end)
        s->fork_spare_end(s);
    al_budget_stop(s);
    al_keep_lease_stop(s);
    al_control_stop(s);
    al_link_detach(s);
    al_transport_free(s->tport);
    if (s->dom) {
        if (!keep)
            virDomainDestroy(s->dom);
        virDomainFree(s->dom);
    }
    /* A kept session's VM and dirs stay for its keeper: only this process's parts go. */
    if (!keep) {
        al_net_stop(s); /* after the VM: its tunnels end with it */
        char vol[80];
        for (int scratch = 0; scratch < 2; scratch++) {
            if (scratch ? s->scratch_made : s->vol_made) {
                al_session_volume(s, scratch, vol);
                al_volume_delete(s->conn, vol); /* a host that is down: its gc reaps it */
            }
        }
    }
    al_image_free(&s->rimg);
    if (s->conn)
        virConnectClose(s->conn);
    if (!keep && s->console_to && s->dir_created) {
        FILE *f = fopen(s->console, "r");
        char line[1024], safe[sizeof(line) * 3];
        /* The guest writes the console: no escape sequence of its reaches the terminal. */
        while (f && fgets(line, sizeof(line), f)) {
            line[strcspn(line, "\n")] = '\0';
            fprintf(s->console_to, "console| %s\n", al_term_escape(line, safe, sizeof(safe)));
        }
        if (f)
            fclose(f);
    }
    al_checkpoints_free(s); /* the snapshots themselves live in the session dir */
    al_vols_release(s);
    bool forked = al_template_is_fork(s->tmpl);
    al_template_free(s->tmpl);
    al_screen_free(s->screen);
    if (!keep && s->dir_created)
        al_rmtree(s->dir);
    if (!keep && s->state_created)
        al_rmtree(s->state_dir);
    if (forked && !keep) /* its link to the save went with the state dir */
        al_fork_reap();
    al_closep(&s->lock_fd);
    al_closep(&s->state_lock_fd);
    al_image_free(&s->img);
    pthread_mutex_destroy(&s->lock);
    al_link_drop_unclaimed(s); /* runs handed over that nobody took */
    al_link_mux_free(s->mux);
    free(s);
}

void al_session_timing(const al_session *s, al_session_timing_t *out)
{
    al_error ignored = {0};
    if (AL_SIZED_OUT(out, "al_session_timing_t", &ignored) < 0)
        return; /* an unsized struct is left as it is */
    *out = s->timing;
    out->struct_size = sizeof(*out);
}

const char *al_session_name(const al_session *s)
{
    return s->name;
}

const char *al_session_console_path(const al_session *s)
{
    return s->console;
}

const char *al_session_raw_port_path(const al_session *s)
{
    return s->raw_sock[0] ? s->raw_sock : NULL;
}

const char *al_session_agent_version(const al_session *s)
{
    return s->agent_version;
}

const char *al_session_languages(const al_session *s)
{
    return s->langs;
}

unsigned al_session_vcpus(const al_session *s)
{
    return s->vcpus;
}

bool al_session_has_display(const al_session *s)
{
    return s->screen != NULL;
}

int al_display_size_check(unsigned width, unsigned height, al_error *err)
{
    if (!width && !height)
        return 0;
    if (width % 8 || height % 8 || width < AL_DISPLAY_MIN_W || width > AL_DISPLAY_MAX_W ||
        height < AL_DISPLAY_MIN_H || height > AL_DISPLAY_MAX_H)
        return al_err(err, -EINVAL,
                      "display size %ux%u: width and height each a multiple of 8, from %ux%u to "
                      "%ux%u",
                      width, height, AL_DISPLAY_MIN_W, AL_DISPLAY_MIN_H, AL_DISPLAY_MAX_W,
                      AL_DISPLAY_MAX_H);
    return 0;
}

bool al_session_restored(const al_session *s)
{
    return s->restored;
}

void al_session_set_cancel_fd(al_session *s, int fd)
{
    s->cancel_fd = fd > 0 ? fd : -1;
    if (s->have_ch)
        s->ch.wake_fd = s->cancel_fd;
}

bool al_session_kvm(const al_session *s)
{
    return s->kvm;
}

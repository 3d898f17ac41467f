/* A session: one disposable VM, its runtime directory and the agent channel into it. */
#include "session.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#define BOOT_TIMEOUT_MS_DEFAULT 60000
#define MEMORY_MIB_DEFAULT 256

/* One vCPU by default. Two stream faster under emulation (guest->host 80 -> 126 MB/s in one
 * paired airlock-bench run), but one boot in about a hundred with two vCPUs never reached the
 * agent, and none with one; until that is understood, --cpus 2 is opt-in. */
#define VCPUS_DEFAULT 1

/* Makes PARENT/sessions/NAME, 0755 (QEMU runs as another user under qemu:///system and must
 * traverse it), holding a lock file flocked for the session's life: made under a hidden name gc
 * ignores and renamed once locked, so gc never sees it unlocked. The path goes to out. */
static int locked_dir_create(const char *parent, const char *name, char *out, size_t outlen,
                             int *lock_fd, al_error *err)
{
    char sessions[4200], tmp[4300], lock[4400];
    if (al_pathf(sessions, sizeof(sessions), "%s/sessions", parent) < 0 ||
        al_pathf(out, outlen, "%s/%s", sessions, name) < 0 ||
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
static int session_dir_create(al_session *s, al_error *err)
{
    char run[4096], state[4096], why[400];
    int r = al_runtime_dir(run, sizeof(run), err);
    if (r == 0)
        r = locked_dir_create(run, s->name, s->dir, sizeof(s->dir), &s->lock_fd, err);
    if (r < 0)
        return r;
    s->dir_created = true;
    r = al_state_dir(state, sizeof(state), err);
    if (r < 0)
        return r;
    r = al_check_free_space(state, al_free_floor(), why, sizeof(why));
    if (r < 0)
        return al_err(err, r, "cannot start a session: %s", why);
    r = locked_dir_create(state, s->name, s->state_dir, sizeof(s->state_dir), &s->state_lock_fd,
                          err);
    if (r < 0)
        return r;
    s->state_created = true;
    snprintf(s->sock, sizeof(s->sock), "%s/agent.sock", s->dir);
    snprintf(s->console, sizeof(s->console), "%s/console.log", s->dir);
    if (s->raw_port[0])
        snprintf(s->raw_sock, sizeof(s->raw_sock), "%s/raw.sock", s->dir);
    return 0;
}

int al_session_channel_init(al_session *s, int fd, al_error *err)
{
    int r = al_channel_init(&s->ch, fd, s->stall_ms, s->cancel_fd, err);
    if (r < 0)
        return r;
    s->ch.alarm_fd = s->budget_alarm[0];
    s->ch.alarm_msg = s->budget_why;
    return 0;
}

int al_session_connect_agent(al_session *s, uint64_t deadline, al_error *err)
{
    if (s->transport == AL_TRANSPORT_SSH)
        return al_ssh_connect(s, deadline, err);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(s->sock) >= sizeof(sa.sun_path))
        return al_err(err, -ENAMETOOLONG, "socket path too long: %s", s->sock);
    strcpy(sa.sun_path, s->sock);
    for (;;) {
        _cleanup_close_ int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return al_err(err, -errno, "socket: %s", strerror(errno));
        if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
            int r = al_session_channel_init(s, fd, err);
            if (r < 0)
                return r;
            fd = -1; /* the channel owns it now */
            s->have_ch = true;
            return 0;
        }
        if ((errno != ENOENT && errno != ECONNREFUSED) || al_now_ms() >= deadline)
            return al_err(err, -errno, "cannot connect to the agent socket: %s", strerror(errno));
        usleep(5000);
    }
}

/* The session dir goes away with the session, so a boot failure quotes the console itself:
 * its last non-empty line, printable characters only. */
void al_session_console_tail(const al_session *s, char *out, size_t len)
{
    snprintf(out, len, "(empty)");
    FILE *f = fopen(s->console, "r");
    char line[1024];
    while (f && fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\r\n")] = '\0';
        if (!line[0])
            continue;
        al_printable(line);
        size_t n = strlen(line) < len - 1 ? strlen(line) : len - 1; /* cut, on purpose */
        memcpy(out, line, n);
        out[n] = '\0';
    }
    if (f)
        fclose(f);
}

int al_session_send_hello(al_session *s, uint64_t *nonce, al_error *err)
{
    uint64_t n = 0;
    if (getrandom(&n, sizeof(n), 0) != sizeof(n))
        n = al_now_us();
    struct al_msg m = {.type = AL_HELLO};
    m.u.hello.version = AL_PROTO_VERSION;
    m.u.hello.nonce = n;
    m.u.hello.window = AL_WINDOW_DEFAULT;
    int r = al_channel_send(&s->ch, &m, err);
    if (r < 0)
        return r;
    *nonce = n;
    return 0;
}

/* Waits for the HELLO_ACK to the HELLO that carried nonce until deadline; -ETIMEDOUT with err
 * untouched when the deadline passed. */
static int handshake_wait(al_session *s, uint64_t nonce, uint64_t deadline, al_error *err)
{
    struct al_msg m;
    int r = al_channel_recv(&s->ch, &m, deadline, s->cancel_fd, -1, err);
    if (r < 0)
        return r;
    if (r == 0)
        return al_err(err, -ECANCELED, "cancelled while the VM was booting");
    if (m.type == AL_ERROR && m.id == 0)
        return al_channel_guest_error(&m, "the guest agent refused the handshake", err);
    if (m.type != AL_HELLO_ACK)
        return al_err(err, -EPROTO, "guest sent a %s frame before its handshake",
                      al_type_name(m.type));
    return al_session_hello_ack(s, &m, nonce, err);
}

static int boot_timed_out(al_session *s, al_error *err)
{
    char last[160];
    al_session_console_tail(s, last, sizeof(last));
    return al_err(err, -ETIMEDOUT,
                  "the guest agent did not answer within %u s under %s (console's last line: "
                  "%s); %s",
                  s->boot_timeout_ms / 1000, s->kvm ? "KVM" : "software emulation", last,
                  s->kvm ? "try AIRLOCK_ACCEL=tcg" : "a slow host may need --boot-timeout");
}

int al_session_handshake(al_session *s, uint64_t deadline, al_error *err)
{
    uint64_t nonce = 0;
    int r = al_session_send_hello(s, &nonce, err);
    if (r < 0)
        return r;
    r = handshake_wait(s, nonce, deadline, err);
    if (r == -ETIMEDOUT && err->code == 0)
        return boot_timed_out(s, err);
    return r;
}

/* Checks the agent's HELLO_ACK against the HELLO that carried nonce and takes in what it
 * announces; also after a checkpoint restore (checkpoint.c). */
int al_session_hello_ack(al_session *s, const struct al_msg *m, uint64_t nonce, al_error *err)
{
    const typeof(m->u.hello_ack) *a = &m->u.hello_ack;
    if (a->version != AL_PROTO_VERSION)
        return al_err(err, -EPROTONOSUPPORT,
                      "the guest agent speaks protocol %u, this airlock speaks %u; rebuild the "
                      "image",
                      a->version, AL_PROTO_VERSION);
    if (a->nonce != nonce)
        return al_err(err, -EPROTO, "guest answered the handshake with a wrong nonce");
    if (a->window < AL_WINDOW_MIN || a->window > AL_WINDOW_MAX)
        return al_err(err, -EPROTO, "guest announced a window of %u bytes, out of range",
                      a->window);
    s->agent_window = a->window;
    s->caps = a->caps;
    snprintf(s->agent_version, sizeof(s->agent_version), "%.*s", (int)a->agent_version.len,
             a->agent_version.p);
    s->langs[0] = '\0';
    for (uint32_t i = 0; i < a->nlangs; i++) {
        size_t have = strlen(s->langs);
        snprintf(s->langs + have, sizeof(s->langs) - have, "%s%.*s", have ? " " : "",
                 (int)a->langs[i].len, a->langs[i].p);
    }
    /* Printable only: these strings end up on the user's terminal. */
    al_printable(s->agent_version);
    al_printable(s->langs);
    return 0;
}

static void session_notice(al_session *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void session_notice(al_session *s, const char *fmt, ...)
{
    if (s->quiet)
        return;
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    /* The library never prints on its own: the caller's callback, else the caller's FILE. */
    if (s->on_notice)
        s->on_notice(s->notice_ctx, msg);
    else if (s->notice)
        fprintf(s->notice, "airlock: notice: %s\n", msg);
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

/* Starts the domain. The SSH forward's port was free when picked, but someone may have taken
 * it since: another is tried. A KVM that QEMU refuses ("failed to set MSR") falls back to
 * emulation, and the verdict is kept for later sessions. */
static int vm_start(al_session *s, struct al_vm_config *cfg, al_error *err)
{
    int r = al_vm_start(s->conn, cfg, &s->dom, err);
    for (int i = 0; i < 3 && r < 0 && cfg->host_port && strstr(err->msg, "forwarding"); i++) {
        *err = (al_error){0};
        r = al_ssh_pick_port(s, err);
        cfg->host_port = s->host_port;
        if (r == 0)
            r = al_vm_start(s->conn, cfg, &s->dom, err);
    }
    if (r < 0 && cfg->kvm && !accel_forced()) {
        char why[200];
        kvm_start_evidence(err->msg, why, sizeof(why));
        *err = (al_error){0};
        cfg->kvm = s->kvm = false;
        r = al_vm_start(s->conn, cfg, &s->dom, err);
        if (r == 0) {
            al_kvm_record(false, why);
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
static int wait_guest(al_session *s, uint64_t deadline, uint64_t probe_deadline, char *ev,
                      size_t evlen, al_error *err)
{
    if (!probe_deadline) {
        int r = al_session_connect_agent(s, deadline, err);
        return r < 0 ? r : al_session_handshake(s, deadline, err);
    }
    if (probe_deadline > deadline)
        probe_deadline = deadline;
    unsigned probe_s = (unsigned)((probe_deadline - al_now_ms() + 999) / 1000);
    if (s->transport == AL_TRANSPORT_SSH) {
        int r = al_ssh_connect(s, probe_deadline, err);
        if (r < 0 && r != -ECANCELED &&
            (domain_stopped(s, ev, evlen) || al_now_ms() + 500 >= probe_deadline)) {
            if (!ev[0])
                snprintf(ev, evlen, "the guest's sshd did not answer within %u s", probe_s);
            *err = (al_error){0};
            return -EAGAIN;
        }
        return r < 0 ? r : al_session_handshake(s, deadline, err);
    }
    int r = al_session_connect_agent(s, deadline, err);
    uint64_t nonce = 0;
    if (r == 0)
        r = al_session_send_hello(s, &nonce, err);
    if (r < 0)
        return r;
    for (;;) {
        uint64_t slice = al_now_ms() + 250;
        r = handshake_wait(s, nonce, slice < probe_deadline ? slice : probe_deadline, err);
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
    al_ssh_disconnect(s);
    if (s->have_ch) {
        al_channel_destroy(&s->ch);
        s->have_ch = false;
    }
    al_kvm_record(false, ev);
    session_notice(s,
                   "KVM did not run the guest (%s); running it in software emulation (slower). "
                   "Later sessions on this boot go straight to emulation",
                   ev);
    cfg->kvm = s->kvm = false;
    cfg->image = &s->img;
    unlink(s->console);
    if (cfg->disk) {
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
    al_image lie;
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
    uint64_t probe_ms = (s->transport == AL_TRANSPORT_SSH || !s->img.kernel[0] ? 20000 : 6000);
    const char *env = getenv("AIRLOCK_KVM_PROBE_S");
    if (env && atoi(env) > 0)
        probe_ms = (uint64_t)atoi(env) * 1000u;
    char ev[300] = "";
    r = wait_guest(s, *start + s->boot_timeout_ms, probe ? *start + probe_ms : 0, ev, sizeof(ev),
                   err);
    if (r == -EAGAIN) {
        *start = al_now_ms();
        r = fall_back_to_emulation(s, cfg, ev, err);
        if (r < 0)
            return r;
        *started = al_now_ms();
        r = wait_guest(s, *start + s->boot_timeout_ms, 0, ev, sizeof(ev), err);
    } else if (r == 0 && probe && s->kvm) {
        al_kvm_record(true, NULL);
    }
    return r;
}

/* A session not yet booted: its fields from opts, nothing acquired; NULL when out of memory. */
static al_session *session_new(const al_session_opts *opts)
{
    al_session *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->lock_fd = -1;
    s->state_lock_fd = -1;
    s->ch.fd = -1;
    s->ch.alarm_fd = -1;
    s->budget_stop[0] = s->budget_stop[1] = s->budget_alarm[0] = s->budget_alarm[1] = -1;
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

/* Loads the image and settles the transport: the image's, or the one asked for if it has it. */
static int session_load_image(al_session *s, const al_session_opts *opts, al_error *err)
{
    int r = al_image_load(opts->image ? opts->image : al_image_default(), &s->img, err);
    if (r < 0)
        return r;
    s->transport = s->img.transport;
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

/* The disk overlay (into disk, which cfg then points at) and the domain's configuration, with
 * what the transport and checkpoints add to it. */
static int session_prepare_vm(al_session *s, const al_session_opts *opts, char *disk,
                              size_t disklen, struct al_vm_config *cfg, al_error *err)
{
    int r;
    if (s->img.disk[0]) {
        /* In the session dir: removed with it, by close or by gc after a crash. */
        if (al_pathf(disk, disklen, "%s/disk.qcow2", s->state_dir) < 0)
            return al_err(err, -ENAMETOOLONG, "session path too long");
        r = al_disk_overlay(s->conn, s->kvm, s->img.disk, disk, err);
        if (r < 0)
            return r;
    }
    *cfg = (struct al_vm_config){
        .name = s->name,
        .session_dir = s->dir,
        .image = &s->img,
        .memory_mib = opts->memory_mib    ? opts->memory_mib
                      : s->img.memory_mib ? s->img.memory_mib
                                          : MEMORY_MIB_DEFAULT,
        .vcpus = opts->vcpus ? opts->vcpus : VCPUS_DEFAULT,
        .kvm = s->kvm,
        .agent_sock = s->sock,
        .console_path = s->console,
        .disk = s->img.disk[0] ? disk : NULL,
        .raw_sock = s->raw_port[0] ? s->raw_sock : NULL,
        .raw_port_name = s->raw_port,
    };
    if (s->transport == AL_TRANSPORT_SSH) {
        r = al_ssh_prepare(s, cfg, err);
        if (r < 0)
            return r;
    }
    if (opts->checkpoints) {
        r = al_checkpoints_prepare(s, cfg, err);
        if (r < 0)
            return r;
    }
    return al_net_prepare(s, opts, cfg, err); /* network on request: the proxy, the NIC */
}

int al_session_open(const al_session_opts *opts, al_session **out, al_error *err)
{
    uint64_t t_open = al_now_ms();
    al_session *s = session_new(opts);
    if (!s)
        return al_err(err, -ENOMEM, "out of memory");

    int r = session_load_image(s, opts, err);
    if (r < 0)
        goto fail;
    r = al_vm_connect(opts->connect_uri, &s->conn, err);
    if (r < 0)
        goto fail;
    /* Every start reaps what crashed runs left behind; a failure here is not ours to report. */
    al_error gc_err = {0};
    al_gc_conn(s->conn, &gc_err);
    r = session_name_and_dirs(s, err);
    if (r < 0)
        goto fail;
    bool probe = session_choose_accel(s);
    char disk[4300];
    struct al_vm_config cfg;
    r = session_prepare_vm(s, opts, disk, sizeof(disk), &cfg, err);
    if (r < 0)
        goto fail;

    s->timing.prepare_ms = al_now_ms() - t_open;
    uint64_t start = al_now_ms();
    if (opts->lifetime_s)
        s->expires_ms = start + (uint64_t)opts->lifetime_s * 1000u;
    uint64_t started = 0;
    r = boot_guest(s, &cfg, probe, &start, &started, err);
    if (r < 0)
        goto fail;
    r = al_net_start(s, err);
    if (r < 0)
        goto fail;
    s->disk_budget = opts->disk_budget_bytes ? opts->disk_budget_bytes : AL_DISK_BUDGET_DEFAULT;
    r = al_budget_start(s, err);
    if (r < 0)
        goto fail;
    s->timing.start_ms = started - start;
    s->timing.handshake_ms = al_now_ms() - started;
    s->vcpus = cfg.vcpus;
    *out = s;
    return 0;
fail:
    al_session_close(s);
    return r;
}

void al_session_close(al_session *s)
{
    if (!s)
        return;
    al_budget_stop(s);
    al_control_stop(s);
    al_ssh_disconnect(s);
    if (s->have_ch)
        al_channel_destroy(&s->ch);
    if (s->dom) {
        virDomainDestroy(s->dom);
        virDomainFree(s->dom);
    }
    al_net_stop(s); /* after the VM: its tunnels end with it */
    if (s->conn)
        virConnectClose(s->conn);
    if (s->console_to && s->dir_created) {
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
    if (s->dir_created)
        al_rmtree(s->dir);
    if (s->state_created)
        al_rmtree(s->state_dir);
    al_closep(&s->lock_fd);
    al_closep(&s->state_lock_fd);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

void al_session_timing(const al_session *s, al_session_timing_t *out)
{
    *out = s->timing;
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

bool al_session_kvm(const al_session *s)
{
    return s->kvm;
}

int al_session_check(al_session *s, int r, const al_error *err)
{
    if ((r == -EPROTO || r == -EMSGSIZE) && !s->poisoned) {
        s->poisoned = true;
        snprintf(s->poison_why, sizeof(s->poison_why), "%.200s", err->msg);
    }
    return r;
}

int al_session_ready(al_session *s, al_error *err)
{
    int r = al_budget_refuse(s, err);
    if (r < 0)
        return r;
    if (s->poisoned)
        return al_err(err, -EPROTO,
                      "the guest broke the protocol earlier (%s); the session takes no more "
                      "requests",
                      s->poison_why);
    if (s->transport != AL_TRANSPORT_SSH || !al_ssh_lost(s))
        return 0;
    return al_ssh_reconnect(s, err);
}

int al_session_next_id(al_session *s)
{
    return (int)(s->next_id++ & 0x7fffffff);
}

int al_session_stray_frame(al_session *s, const struct al_msg *m, const char *when, al_error *err)
{
    if (m->type == AL_ERROR && m->id == 0)
        return al_channel_guest_error(m, "guest agent reported a protocol error", err);
    /* Late frames of a request that already ended (the agent answering stray data) are
     * dropped. */
    if (m->id != 0 && m->id < s->next_id)
        return 0;
    if (when)
        return al_err(err, -EPROTO, "guest sent a %s frame %s", al_type_name(m->type), when);
    return al_err(err, -EPROTO, "guest sent a %s frame for unknown request %u",
                  al_type_name(m->type), m->id);
}

int al_session_recv(al_session *s, uint32_t id, struct al_msg *m, int extra_fd, al_error *err)
{
    return al_session_recv_until(s, id, m, extra_fd, 0, err);
}

int al_session_recv_until(al_session *s, uint32_t id, struct al_msg *m, int extra_fd,
                          uint64_t deadline, al_error *err)
{
    for (;;) {
        bool ours = deadline && (!s->expires_ms || deadline < s->expires_ms);
        int r = al_channel_recv(&s->ch, m, ours ? deadline : s->expires_ms, s->cancel_fd, extra_fd,
                                err);
        if (r == -ETIMEDOUT && err->code == 0 && ours)
            return r;
        if (r == -ETIMEDOUT && err->code == 0)
            return al_err(err, -ETIME, "session lifetime exceeded");
        if (r <= 0)
            return r;
        if (m->id == id && !(m->type == AL_ERROR && m->id == 0))
            return 1;
        if ((r = al_session_stray_frame(s, m, NULL, err)) < 0)
            return r;
    }
}

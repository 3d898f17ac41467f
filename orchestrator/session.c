/* A session: one disposable VM, its runtime directory and the agent channel into it. */
#include "session.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
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

static int session_dir_create(al_session *s, al_error *err)
{
    char run[4096];
    int r = al_runtime_dir(run, sizeof(run), err);
    if (r < 0)
        return r;
    char sessions[4200];
    snprintf(sessions, sizeof(sessions), "%s/sessions", run);
    if (mkdir(sessions, 0755) < 0 && errno != EEXIST)
        return al_err(err, -errno, "cannot create '%s': %s", sessions, strerror(errno));
    if (snprintf(s->dir, sizeof(s->dir), "%s/%s", sessions, s->name) >= (int)sizeof(s->dir))
        return al_err(err, -ENAMETOOLONG, "session path too long");
    /* Made under a name gc ignores and renamed once locked, so gc never sees it unlocked. */
    char tmp[4200];
    if (al_pathf(tmp, sizeof(tmp), "%s/.%s", sessions, s->name) < 0)
        return al_err(err, -ENAMETOOLONG, "session path too long");
    if (mkdir(tmp, 0755) < 0)
        return al_err(err, -errno, "cannot create session dir '%s': %s", tmp, strerror(errno));
    /* QEMU runs as another user under qemu:///system and must traverse the directory. */
    chmod(tmp, 0755);
    char lock[4300];
    snprintf(lock, sizeof(lock), "%s/lock", tmp);
    s->lock_fd = al_file_create_private(lock, O_RDWR);
    if (s->lock_fd < 0)
        errno = -s->lock_fd;
    if (s->lock_fd < 0 || flock(s->lock_fd, LOCK_EX | LOCK_NB) < 0 || rename(tmp, s->dir) < 0) {
        int e = errno;
        al_rmtree(tmp);
        return al_err(err, -e, "cannot set up session dir: %s", strerror(e));
    }
    s->dir_created = true;
    snprintf(s->sock, sizeof(s->sock), "%s/agent.sock", s->dir);
    snprintf(s->console, sizeof(s->console), "%s/console.log", s->dir);
    if (s->raw_port[0])
        snprintf(s->raw_sock, sizeof(s->raw_sock), "%s/raw.sock", s->dir);
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
            int r = al_channel_init(&s->ch, fd, s->stall_ms, err);
            if (r < 0)
                return r;
            fd = -1; /* the channel owns it now */
            s->have_ch = true;
            return 0;
        }
        if ((errno != ENOENT && errno != ECONNREFUSED) || al_now_ms() >= deadline)
            return al_err(err, -errno, "cannot connect to the agent socket: %s",
                          strerror(errno));
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
        for (char *p = line; *p; p++)
            if (*p < 0x20 || *p > 0x7e)
                *p = '?';
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

int al_session_handshake(al_session *s, uint64_t deadline, al_error *err)
{
    uint64_t nonce = 0;
    struct al_msg m;
    int r = al_session_send_hello(s, &nonce, err);
    if (r < 0)
        return r;
    for (;;) {
        r = al_channel_recv(&s->ch, &m, deadline, s->cancel_fd, -1, err);
        if (r == -ETIMEDOUT && err->code == 0) {
            char last[160];
            al_session_console_tail(s, last, sizeof(last));
            return al_err(err, -ETIMEDOUT,
                          "the guest agent did not answer within %u s (console's last line: %s)",
                          s->boot_timeout_ms / 1000, last);
        }
        if (r < 0)
            return r;
        if (r == 0)
            return al_err(err, -ECANCELED, "cancelled while the VM was booting");
        if (m.type == AL_ERROR && m.id == 0)
            return al_channel_guest_error(&m, "the guest agent refused the handshake", err);
        if (m.type != AL_HELLO_ACK)
            return al_err(err, -EPROTO, "guest sent a %s frame before its handshake",
                          al_type_name(m.type));
        break;
    }
    return al_session_hello_ack(s, &m, nonce, err);
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
    for (char *p = s->agent_version; *p; p++)
        if (*p < 0x20 || *p > 0x7e)
            *p = '?';
    for (char *p = s->langs; *p; p++)
        if (*p < 0x20 || *p > 0x7e)
            *p = '?';
    return 0;
}

int al_session_open(const al_session_opts *opts, al_session **out, al_error *err)
{
    uint64_t t_open = al_now_ms();
    al_session *s = calloc(1, sizeof(*s));
    if (!s)
        return al_err(err, -ENOMEM, "out of memory");
    s->lock_fd = -1;
    s->ch.fd = -1;
    /* Recursive: a request made of several (a workdir copy) may hold it around its parts. */
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&s->lock, &ma);
    pthread_mutexattr_destroy(&ma);
    s->cancel_fd = opts->cancel_fd > 0 ? opts->cancel_fd : -1;
    s->console_to = opts->console_to;
    s->stall_ms = opts->stall_timeout_ms;
    s->boot_timeout_ms = opts->boot_timeout_ms ? opts->boot_timeout_ms : BOOT_TIMEOUT_MS_DEFAULT;
    s->next_id = 1;
    if (opts->raw_port)
        snprintf(s->raw_port, sizeof(s->raw_port), "%s", opts->raw_port);

    int r = al_image_load(opts->image ? opts->image : al_image_default(), &s->img, err);
    if (r < 0)
        goto fail;
    s->transport = s->img.transport;
    if (opts->transport && !strcmp(opts->transport, "virtio") &&
        s->img.transport == AL_TRANSPORT_SSH) {
        r = al_err(err, -EINVAL,
                   "image '%s' has no agent of its own to serve virtio-serial; use --transport "
                   "ssh",
                   s->img.name);
        goto fail;
    }
    if (opts->transport && !strcmp(opts->transport, "ssh") &&
        s->img.transport != AL_TRANSPORT_SSH) {
        r = al_err(err, -EINVAL,
                   "image '%s' has no SSH server; use an SSH image ('airlock image build sshd', "
                   "or 'airlock image import')",
                   s->img.name);
        goto fail;
    }
    if (opts->transport && strcmp(opts->transport, "ssh") && strcmp(opts->transport, "virtio")) {
        r = al_err(err, -EINVAL, "unknown transport '%s' (virtio or ssh)", opts->transport);
        goto fail;
    }
    r = al_vm_connect(opts->connect_uri, &s->conn, err);
    if (r < 0)
        goto fail;
    /* Every start reaps what crashed runs left behind; a failure here is not ours to report. */
    al_error gc_err = {0};
    al_gc_conn(s->conn, &gc_err);

    uint8_t rnd[6];
    if (getrandom(rnd, sizeof(rnd), 0) != sizeof(rnd)) {
        r = al_err(err, -errno, "getrandom: %s", strerror(errno));
        goto fail;
    }
    snprintf(s->name, sizeof(s->name), AL_DOMAIN_PREFIX "%02x%02x%02x%02x%02x%02x", rnd[0],
             rnd[1], rnd[2], rnd[3], rnd[4], rnd[5]);
    r = session_dir_create(s, err);
    if (r < 0)
        goto fail;

    FILE *notice = opts->quiet ? NULL : opts->notice ? opts->notice : stderr;
    s->kvm = al_kvm_usable();
    if (!s->kvm && notice) {
        enum al_kvm_state ks = al_kvm_state();
        fprintf(notice, "airlock: notice: %s; running the VM in software emulation (slower)\n",
                ks == AL_KVM_FAILED ? "KVM failed on this host earlier"
                : ks == AL_KVM_OFF  ? "AIRLOCK_ACCEL=tcg"
                                    : "/dev/kvm is not usable");
    }
    char disk[4300];
    if (s->img.disk[0]) {
        /* In the session dir: removed with it, by close or by gc after a crash. */
        if (al_pathf(disk, sizeof(disk), "%s/disk.qcow2", s->dir) < 0) {
            r = al_err(err, -ENAMETOOLONG, "session path too long");
            goto fail;
        }
        r = al_disk_overlay(s->conn, s->kvm, s->img.disk, disk, err);
        if (r < 0)
            goto fail;
    }
    struct al_vm_config cfg = {
        .name = s->name,
        .session_dir = s->dir,
        .image = &s->img,
        .memory_mib = opts->memory_mib   ? opts->memory_mib
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
        r = al_ssh_prepare(s, &cfg, err);
        if (r < 0)
            goto fail;
    }
    if (opts->checkpoints) {
        r = al_checkpoints_prepare(s, &cfg, err);
        if (r < 0)
            goto fail;
    }
    s->timing.prepare_ms = al_now_ms() - t_open;
    uint64_t start = al_now_ms();
    if (opts->lifetime_s)
        s->expires_ms = start + (uint64_t)opts->lifetime_s * 1000u;
    r = al_vm_start(s->conn, &cfg, &s->dom, err);
    /* The forward's port was free when picked; someone may have taken it since. */
    for (int i = 0; i < 3 && r < 0 && cfg.host_port && strstr(err->msg, "forwarding"); i++) {
        *err = (al_error){0};
        r = al_ssh_pick_port(s, err);
        cfg.host_port = s->host_port;
        if (r == 0)
            r = al_vm_start(s->conn, &cfg, &s->dom, err);
    }
    if (r < 0 && s->kvm && !getenv("AIRLOCK_ACCEL")) {
        /* /dev/kvm opened but QEMU could not use it: try emulation before giving up. */
        al_error kvm_err = *err;
        *err = (al_error){0};
        cfg.kvm = s->kvm = false;
        r = al_vm_start(s->conn, &cfg, &s->dom, err);
        if (r == 0) {
            al_kvm_mark_broken();
            if (notice)
                fprintf(notice,
                        "airlock: notice: KVM failed (%.160s); running the VM in software "
                        "emulation (slower)\n",
                        kvm_err.msg);
        }
    }
    if (r < 0)
        goto fail;
    uint64_t deadline = start + s->boot_timeout_ms;
    r = al_session_connect_agent(s, deadline, err);
    if (r < 0)
        goto fail;
    uint64_t started = al_now_ms();
    r = al_session_handshake(s, deadline, err);
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
    al_control_stop(s);
    al_ssh_disconnect(s);
    if (s->have_ch)
        al_channel_destroy(&s->ch);
    if (s->dom) {
        virDomainDestroy(s->dom);
        virDomainFree(s->dom);
    }
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
    al_closep(&s->lock_fd);
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

int al_session_ready(al_session *s, al_error *err)
{
    if (s->transport != AL_TRANSPORT_SSH || !al_ssh_lost(s))
        return 0;
    return al_ssh_reconnect(s, err);
}

int al_session_next_id(al_session *s)
{
    return (int)(s->next_id++ & 0x7fffffff);
}

int al_session_recv(al_session *s, uint32_t id, struct al_msg *m, int extra_fd, al_error *err)
{
    for (;;) {
        int r = al_channel_recv(&s->ch, m, s->expires_ms, s->cancel_fd, extra_fd, err);
        if (r == -ETIMEDOUT && err->code == 0)
            return al_err(err, -ETIME, "session lifetime exceeded");
        if (r <= 0)
            return r;
        if (m->type == AL_ERROR && m->id == 0)
            return al_channel_guest_error(m, "guest agent reported a protocol error", err);
        if (m->id == id)
            return 1;
        /* Late frames of a request that already ended (the agent answering stray data) are
         * dropped; anything else is a guest speaking out of turn. */
        if (m->id == 0 || m->id >= s->next_id)
            return al_err(err, -EPROTO, "guest sent a %s frame for unknown request %u",
                          al_type_name(m->type), m->id);
    }
}

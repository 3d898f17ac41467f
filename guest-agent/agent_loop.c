/* The agent's poll loop: channel I/O, frame dispatch, the bounded output queue, request table. */
#include "agent.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/reboot.h>
#include <sys/signalfd.h>
#include <time.h>

#define DATA_FRAME_MAX (AL_FRAME_HEADER_SIZE + 1 + AL_DATA_CHUNK_MAX)
/* Room reserved for one control frame: HELLO_ACK with 16 languages is the largest, ~1.2 KiB. */
#define CONTROL_FRAME_MAX 2048

uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

void agent_log(const char *fmt, ...)
{
    char buf[512];
    int n = snprintf(buf, sizeof(buf), "airlock-agent: ");
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, sizeof(buf) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof(buf) - 2)
        len = sizeof(buf) - 2;
    buf[len++] = '\n';
    /* One write per line, so lines from the agent never interleave mid-line. */
    if (write(STDERR_FILENO, buf, len) < 0) {
        /* Nowhere left to complain. */
    }
}

const char *printable(struct al_str s, char *buf, size_t cap)
{
    size_t n = s.len < cap - 1 ? s.len : cap - 1;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s.p[i];
        buf[i] = (c < 0x20 || c >= 0x7f) ? '?' : (char)c;
    }
    buf[n] = '\0';
    return buf;
}

uint16_t errno_class(int err)
{
    switch (err) {
    case ENOENT:
    case ENOTDIR:
        return AL_ERR_NOT_FOUND;
    case EACCES:
    case EPERM:
    case EROFS:
        return AL_ERR_PERMISSION;
    case EINVAL:
    case EISDIR:
    case ELOOP:
    case ENAMETOOLONG:
    case EXDEV:
    case EEXIST:
        return AL_ERR_INVALID;
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
    case EMFILE:
    case ENFILE:
    case ENOMEM:
    case EAGAIN:
        return AL_ERR_LIMIT;
    case EIO:
        return AL_ERR_IO;
    default:
        return AL_ERR_INTERNAL;
    }
}

int write_file(int dir, const char *path, const char *s)
{
    _cleanup_close_ int fd = openat(dir, path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    size_t len = strlen(s);
    return write(fd, s, len) == (ssize_t)len ? 0 : -errno;
}

/* The output queue is a bip buffer: data is [head, tail), or [head, wrap) then [0, tail) once
 * writing wrapped to the start. Frames are built in place, so pipe reads land in the queue. */
static size_t outq_len(const struct agent *a)
{
    if (a->oq_wrap)
        return a->oq_wrap - a->oq_head + a->oq_tail;
    return a->oq_tail - a->oq_head;
}

static uint8_t *outq_reserve(struct agent *a, size_t n)
{
    if (!a->oq_wrap) {
        if (a->oq_head == a->oq_tail)
            a->oq_head = a->oq_tail = 0;
        if (AGENT_OUTQ_CAP - a->oq_tail >= n)
            return a->outq + a->oq_tail;
        if (a->oq_head <= n)
            return NULL;
        /* Wrapping with nothing committed yet is harmless: the second region is empty. */
        a->oq_wrap = a->oq_tail;
        a->oq_tail = 0;
        return a->outq;
    }
    return a->oq_head - a->oq_tail > n ? a->outq + a->oq_tail : NULL;
}

static void outq_commit(struct agent *a, size_t n)
{
    a->oq_tail += n;
}

static void outq_reset(struct agent *a)
{
    a->oq_head = a->oq_tail = a->oq_wrap = 0;
}

static int outq_flush(struct agent *a)
{
    while (outq_len(a)) {
        size_t end = a->oq_wrap ? a->oq_wrap : a->oq_tail;
        ssize_t n = write(a->ch.out_fd, a->outq + a->oq_head, end - a->oq_head);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno == EAGAIN ? 0 : -errno;
        }
        a->oq_head += (size_t)n;
        if (a->oq_wrap && a->oq_head == a->oq_wrap)
            a->oq_head = a->oq_wrap = 0;
    }
    return 0;
}

void agent_send(struct agent *a, const struct al_msg *m)
{
    if (!a->connected)
        return;
    uint8_t *p = outq_reserve(a, CONTROL_FRAME_MAX);
    int n = p ? al_msg_encode(m, p, CONTROL_FRAME_MAX) : -ENOBUFS;
    if (n < 0) {
        /* Unreachable while every producer respects the high-water mark; dropping a whole
         * frame at least keeps the stream framed. */
        agent_log("cannot queue %s frame: %s", al_type_name(m->type), strerror(-n));
        return;
    }
    outq_commit(a, (size_t)n);
}

void agent_send_error(struct agent *a, uint32_t id, uint16_t klass, int err, const char *fmt, ...)
{
    char msg[AL_MESSAGE_MAX + 1];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    struct al_msg m = {.type = AL_ERROR, .id = id};
    m.u.error.klass = klass;
    m.u.error.err = (uint32_t)err;
    m.u.error.message.p = msg;
    m.u.error.message.len = n < 0 ? 0 : (uint32_t)strnlen(msg, AL_MESSAGE_MAX);
    agent_log("error id=%u %s: %s", id, al_error_class_name(klass), msg);
    agent_send(a, &m);
}

void agent_send_credit(struct agent *a, uint32_t id, uint8_t stream, uint32_t bytes)
{
    struct al_msg m = {.type = AL_CREDIT, .id = id};
    m.u.credit.stream = stream;
    m.u.credit.bytes = bytes;
    agent_send(a, &m);
}

struct req *req_find(struct agent *a, uint32_t id)
{
    for (size_t i = 0; i < AGENT_REQ_MAX; i++)
        if (a->reqs[i].used && a->reqs[i].id == id)
            return &a->reqs[i];
    return NULL;
}

struct req *req_new(struct agent *a, uint32_t id, enum req_kind kind)
{
    if (id == 0) {
        agent_send_error(a, id, AL_ERR_INVALID, 0, "request id 0 is reserved");
        return NULL;
    }
    if (req_find(a, id)) {
        agent_send_error(a, id, AL_ERR_INVALID, 0, "request id %u already in use", id);
        return NULL;
    }
    for (size_t i = 0; i < AGENT_REQ_MAX; i++) {
        struct req *r = &a->reqs[i];
        if (r->used)
            continue;
        memset(r, 0, sizeof(*r));
        r->used = true;
        r->id = id;
        r->kind = kind;
        r->in_fd = r->dir_fd = r->out[0].fd = r->out[1].fd = r->out[2].fd = -1;
        r->stdin_hold[0] = r->stdin_hold[1] = r->pty_fd = -1;
        return r;
    }
    agent_send_error(a, id, AL_ERR_LIMIT, 0, "too many requests (at most %d)", AGENT_REQ_MAX);
    return NULL;
}

void req_free(struct agent *a, struct req *r)
{
    for (int i = 0; i < REQ_OUTS; i++)
        if (!r->out[i].borrowed)
            al_closep(&r->out[i].fd);
    if (r->kernel)
        r->kernel->run = NULL;
    al_closep(&r->stdin_hold[0]);
    al_closep(&r->stdin_hold[1]);
    al_closep(&r->in_fd);
    al_closep(&r->pty_fd);
    if (r->tmp[0])
        unlinkat(r->dir_fd, r->tmp, 0); /* a FILE_PUT that did not finish */
    al_closep(&r->dir_fd);
    cgroup_remove(a, r->cgroup);
    free(r->inq.p);
    r->used = false;
}

/* Kills and forgets a request without telling the host (session reset). */
static void req_abort(struct agent *a, struct req *r)
{
    if (r->kind == REQ_EXEC && !r->reaped)
        exec_kill(a, r);
    req_free(a, r);
}

/* A host is connected and has handshaken: frames of requests may go out. */
static bool host_ready(const struct agent *a)
{
    return a->connected && a->hello;
}

static bool ostream_ready(struct agent *a, struct ostream *o)
{
    /* No host, or one that has not said HELLO yet: the output waits in its pipe for one that
     * adopts the run (on_disconnect, requests_adopt). */
    if (o->fd < 0 || o->paused || !host_ready(a))
        return false;
    if (o->capped)
        return true;
    return o->credit && outq_len(a) < AGENT_OUTQ_HIGH && outq_reserve(a, DATA_FRAME_MAX);
}

void ostream_close(struct agent *a, struct req *r, struct ostream *o)
{
    uint8_t *p = outq_reserve(a, AL_FRAME_HEADER_SIZE + 1);
    if (p) {
        al_data_header(p, r->id, o->stream, AL_FLAG_EOF, 0);
        outq_commit(a, AL_FRAME_HEADER_SIZE + 1);
    } else {
        agent_log("cannot queue EOF of request %u", r->id);
    }
    if (!o->borrowed)
        close(o->fd);
    o->fd = -1;
}

void ostream_inject(struct agent *a, struct req *r, struct ostream *o, const char *s)
{
    size_t len = strlen(s);
    uint8_t *p = outq_reserve(a, AL_FRAME_HEADER_SIZE + 1 + len);
    if (!p || len > o->credit)
        return; /* a notice is not worth breaking flow control for */
    al_data_header(p, r->id, o->stream, 0, (uint32_t)len);
    memcpy(p + AL_FRAME_HEADER_SIZE + 1, s, len);
    outq_commit(a, AL_FRAME_HEADER_SIZE + 1 + len);
    o->sent += len;
    o->credit -= len;
}

int ostream_pump(struct agent *a, struct req *r, struct ostream *o)
{
    /* Where bytes beyond an exec's output cap go: read, so the child never blocks, then lost. */
    static uint8_t sink[AL_DATA_CHUNK_MAX];
    bool file = r->kind == REQ_GET;

    while (o->fd >= 0 && !o->paused) {
        ssize_t n;
        /* A kernel's pipe stays open: the run's share of it ends at stop_at, not at EOF. */
        uint64_t left = o->stop_at ? o->stop_at - o->nread : UINT64_MAX;
        if (!left) {
            n = 0;
        } else if (o->capped) {
            n = read(o->fd, sink, left < sizeof(sink) ? (size_t)left : sizeof(sink));
            if (n > 0) {
                o->nread += (uint64_t)n;
                r->active = true;
                continue;
            }
        } else {
            if (!ostream_ready(a, o))
                return 0;
            uint8_t *p = outq_reserve(a, DATA_FRAME_MAX);
            size_t want = o->credit < AL_DATA_CHUNK_MAX ? (size_t)o->credit : AL_DATA_CHUNK_MAX;
            if (file && o->limit - o->sent < want)
                want = (size_t)(o->limit - o->sent);
            if (left < want)
                want = (size_t)left;
            n = want ? read(o->fd, p + AL_FRAME_HEADER_SIZE + 1, want) : 0;
            if (n > 0) {
                size_t keep = (size_t)n;
                o->nread += (uint64_t)n;
                r->active = true;
                if (!file && o->limit && o->sent + keep > o->limit) {
                    keep = (size_t)(o->limit - o->sent);
                    o->capped = true;
                    r->exit_flags |=
                        o->stream == AL_STREAM_STDOUT ? AL_EXIT_TRUNC_STDOUT : AL_EXIT_TRUNC_STDERR;
                }
                if (keep) {
                    al_data_header(p, r->id, o->stream, 0, (uint32_t)keep);
                    outq_commit(a, AL_FRAME_HEADER_SIZE + 1 + keep);
                    o->sent += keep;
                    o->credit -= keep;
                }
                if (!file || o->sent < o->limit)
                    continue;
                n = 0; /* a file stops at the size announced in FILE_INFO */
            }
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return 0;
        int err = n < 0 ? errno : 0;
        ostream_close(a, r, o);
        return err ? -err : 1;
    }
    return 1;
}

/* Drops every request (a kernel in the middle of a run goes with it); used on HELLO. Idle
 * kernels stay: a HELLO on a live connection is the host handshaking again, as after it
 * restored a checkpoint (orchestrator/session/checkpoint.c), and the kernels are state it restored.
 */
static void requests_reset(struct agent *a)
{
    for (size_t i = 0; i < AGENT_REQ_MAX; i++)
        if (a->reqs[i].used)
            req_abort(a, &a->reqs[i]);
}

/* Requests and kernels: on the way out, and on disconnect except from a unix socket. */
static void session_reset(struct agent *a)
{
    requests_reset(a);
    kernel_reset_all(a);
}

static void on_connect(struct agent *a)
{
    a->connected = true;
    a->hello = false;
    a->resyncing = false;
    a->skip = 0;
    outq_reset(a);
    al_decoder_init(&a->dec, a->inbuf, sizeof(a->inbuf));
    agent_log("host connected");
}

/* A host that left (a daemon restarting, killed, upgraded) may come back and adopt the runs it
 * had (HELLO with AL_HELLO_ADOPT): processes and kernel runs are kept, frozen, their output
 * waiting in their pipes (past a pipe's 64 KiB the process blocks on its write until a host
 * adopts it), their deadlines running. What cannot wait for a host (a file transfer, a tunnel
 * whose other end was the host's) ends now. Kernels stay: they are the VM's state. */
static void requests_orphan(struct agent *a)
{
    for (size_t i = 0; i < AGENT_REQ_MAX; i++) {
        struct req *r = &a->reqs[i];
        if (r->used && (r->kind != REQ_EXEC || r->tunnel || r->pty_fd >= 0))
            req_abort(a, r);
    }
}

/* why: NULL when the host simply left. */
static void on_disconnect(struct agent *a, const char *why)
{
    /* On a unix socket the agent is the daemon behind --relay, one SSH session per connection:
     * a dropped link, or a host reconnecting after a snapshot restore, must find the idle
     * kernels it left, as a new HELLO does. On the VM's own port the host that left may come
     * back for its runs (requests_orphan). */
    if (a->ch.kind == CHANNEL_UNIX)
        requests_reset(a);
    else if (a->ch.kind == CHANNEL_STDIO)
        session_reset(a);
    else
        requests_orphan(a);
    a->connected = false;
    a->hello = false;
    if (a->ch.kind == CHANNEL_STDIO) {
        a->stop = true;
        return;
    }
    channel_drop(&a->ch);
    agent_log("host disconnected%s%s", why ? ": " : "", why ? why : "");
}

/* HELLO with AL_HELLO_ADOPT: the runs kept since the last host left are this host's (their ids
 * into ack), with no credit on any stream (what the old host was owed is forgotten with it): the
 * output waits for the host that takes the run over to credit it, so a host that only looks
 * (lists, pauses) takes none of it away. */
static void requests_adopt(struct agent *a, struct al_msg *ack)
{
    for (size_t i = 0; i < AGENT_REQ_MAX; i++) {
        struct req *r = &a->reqs[i];
        if (!r->used)
            continue;
        if (r->kind != REQ_EXEC || r->tunnel || r->pty_fd >= 0 ||
            ack->u.hello_ack.nadopted >= AL_ADOPT_MAX) {
            req_abort(a, r);
            continue;
        }
        for (int j = 0; j < REQ_OUTS; j++)
            r->out[j].credit = 0;
        /* Its input came from the host that left: it ends here (EOF), and no credit for it is
         * owed to the new one. */
        r->inq.head = r->inq.len = 0;
        r->in_unacked = 0;
        if (r->in_fd >= 0 && !r->kernel) {
            close(r->in_fd);
            r->in_fd = -1;
        }
        ack->u.hello_ack.adopted[ack->u.hello_ack.nadopted++] = r->id;
        agent_log("adopted id=%u", r->id);
    }
}

static void on_hello(struct agent *a, const struct al_msg *m)
{
    struct al_msg ack = {.type = AL_HELLO_ACK, .id = m->id};
    bool adopt = (m->u.hello.flags & AL_HELLO_ADOPT) && m->u.hello.version == AL_PROTO_VERSION &&
                 m->u.hello.window >= AL_WINDOW_MIN && m->u.hello.window <= AL_WINDOW_MAX;
    if (adopt)
        requests_adopt(a, &ack);
    else
        requests_reset(a);
    a->hello = false;
    if (m->u.hello.version != AL_PROTO_VERSION) {
        agent_send_error(a, 0, AL_ERR_PROTOCOL, 0,
                         "protocol version %u not supported (agent speaks %d)", m->u.hello.version,
                         AL_PROTO_VERSION);
        return;
    }
    if (m->u.hello.window < AL_WINDOW_MIN || m->u.hello.window > AL_WINDOW_MAX) {
        agent_send_error(a, 0, AL_ERR_PROTOCOL, 0, "window %u out of range", m->u.hello.window);
        return;
    }
    a->hello = true;
    a->window = m->u.hello.window;
    /* A HELLO on a live agent may follow a checkpoint restore: the network forwarder's
     * connections lead into the host's past, so they go (the host opens new ones). */
    egress_flush();
    ack.u.hello_ack.version = AL_PROTO_VERSION;
    ack.u.hello_ack.nonce = m->u.hello.nonce;
    ack.u.hello_ack.window = AL_WINDOW_DEFAULT;
    ack.u.hello_ack.caps =
        AL_CAP_EXEC | AL_CAP_FILES | AL_CAP_SIGNAL | (a->can_shutdown ? AL_CAP_SHUTDOWN : 0) |
        (a->cgroup ? AL_CAP_CGROUP : 0) | (a->can_refresh ? AL_CAP_REFRESH : 0) | AL_CAP_CONNECT;
    ack.u.hello_ack.agent_version = al_str_cstr(AIRLOCK_VERSION);
    ack.u.hello_ack.nlangs = (uint32_t)exec_langs(a, ack.u.hello_ack.langs, AL_LANGS_MAX);
    agent_send(a, &ack);
    agent_log("hello window=%u nonce=%llx", a->window, (unsigned long long)m->u.hello.nonce);
}

static void on_data(struct agent *a, const struct al_msg *m)
{
    struct req *r = req_find(a, m->id);
    if (!r)
        return; /* the request ended while the host was still sending: not an error */
    if (m->u.data.stream == AL_STREAM_STDIN && r->kind == REQ_EXEC)
        exec_stdin(a, r, m);
    else if (m->u.data.stream == AL_STREAM_FILE && r->kind == REQ_PUT)
        file_put_data(a, r, m);
    else
        agent_send_error(a, m->id, AL_ERR_PROTOCOL, 0, "no input stream %u on this request",
                         m->u.data.stream);
}

static void on_credit(struct agent *a, const struct al_msg *m)
{
    struct req *r = req_find(a, m->id);
    if (!r)
        return; /* credit for output sent before the request ended */
    uint8_t s = m->u.credit.stream;
    struct ostream *o = NULL;
    if (r->kind == REQ_EXEC && (s == AL_STREAM_STDOUT || s == AL_STREAM_STDERR))
        o = &r->out[s - AL_STREAM_STDOUT];
    else if (r->kind == REQ_EXEC && s == AL_STREAM_RESULT && r->kernel)
        o = &r->out[2];
    else if (r->kind == REQ_EXEC && s == AL_STREAM_RESULT)
        return; /* a host taking over a run credits every stream it may have (requests_adopt) */
    else if (r->kind == REQ_GET && s == AL_STREAM_FILE)
        o = &r->out[0];
    if (!o) {
        agent_send_error(a, m->id, AL_ERR_PROTOCOL, 0, "no output stream %u on this request", s);
        return;
    }
    o->credit += m->u.credit.bytes;
    if (o->credit > a->window) {
        agent_send_error(a, m->id, AL_ERR_PROTOCOL, 0, "credit beyond the window");
        o->credit = a->window;
    }
}

/* Writes out what is queued, for at most ms milliseconds: SHUTDOWN's OK must leave first. */
static void outq_drain(struct agent *a, int ms)
{
    uint64_t end = now_us() + (uint64_t)ms * 1000;
    while (a->connected && outq_len(a) && outq_flush(a) == 0 && outq_len(a)) {
        uint64_t now = now_us();
        if (now >= end)
            break;
        struct pollfd p = {a->ch.out_fd, POLLOUT, 0};
        poll(&p, 1, (int)((end - now) / 1000 + 1));
    }
}

static void on_shutdown(struct agent *a, const struct al_msg *m)
{
    if (!a->can_shutdown) {
        agent_send_error(a, m->id, AL_ERR_UNSUPPORTED, 0, "shutdown not supported here");
        return;
    }
    bool reboot_instead = m->u.shutdown.how == AL_SHUTDOWN_REBOOT;
    agent_log("shutdown (%s)", reboot_instead ? "reboot" : "power off");
    session_reset(a);
    struct al_msg ok = {.type = AL_OK, .id = m->id};
    agent_send(a, &ok);
    outq_drain(a, AGENT_SHUTDOWN_FLUSH_MS);
    init_power_off(reboot_instead);
    agent_send_error(a, m->id, errno_class(errno), errno, "power off failed: %s", strerror(errno));
}

static void on_ping(struct agent *a, const struct al_msg *m)
{
    struct al_msg pong = {.type = AL_PONG, .id = m->id};
    pong.u.ping.cookie = m->u.ping.cookie;
    agent_send(a, &pong);
}

static void dispatch(struct agent *a, const struct al_msg *m)
{
    char buf[AL_MESSAGE_MAX + 1];

    a->resyncing = false;
    if (m->type == AL_ERROR) {
        /* Never answered: two peers replying to each other's errors would loop forever. */
        agent_log("host error id=%u %s: %s", m->id, al_error_class_name(m->u.error.klass),
                  printable(m->u.error.message, buf, sizeof(buf)));
        return;
    }
    if (m->type == AL_HELLO) {
        on_hello(a, m);
        return;
    }
    if (!a->hello) {
        agent_send_error(a, m->id, AL_ERR_PROTOCOL, 0, "%s before hello", al_type_name(m->type));
        return;
    }
    switch (m->type) {
    case AL_EXEC:
        exec_start(a, m);
        break;
    case AL_DATA:
        on_data(a, m);
        break;
    case AL_CREDIT:
        on_credit(a, m);
        break;
    case AL_SIGNAL:
        exec_signal(a, m);
        break;
    case AL_RESIZE:
        exec_resize(a, m);
        break;
    case AL_CONNECT:
        exec_connect(a, m);
        break;
    case AL_FILE_PUT:
        file_put_start(a, m);
        break;
    case AL_FILE_GET:
        file_get_start(a, m);
        break;
    case AL_PING:
        on_ping(a, m);
        break;
    case AL_SHUTDOWN:
        on_shutdown(a, m);
        break;
    case AL_REFRESH:
        refresh_apply(a, m);
        break;
    default:
        agent_send_error(a, m->id, AL_ERR_PROTOCOL, 0, "%s is not a host-to-guest frame",
                         al_type_name(m->type));
    }
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Drops up to a->skip buffered bytes of a rejected frame. */
static void decoder_skip(struct agent *a)
{
    size_t held = a->dec.len - a->dec.used;
    size_t n = a->skip < held ? a->skip : held;
    a->dec.used += n;
    a->skip -= n;
}

static void frame_reject(struct agent *a, int err, const char *why)
{
    struct al_decoder *d = &a->dec;
    /* al_decoder_next compacted the buffer: the offending frame starts at buf[0]. A frame whose
     * header is sound (unknown type, bad flags, bad payload) is skipped alone and answered
     * with its own id; anything else is garbage and costs the whole buffer. */
    if (err != -EBADMSG && err != -EMSGSIZE && d->len >= AL_FRAME_HEADER_SIZE) {
        agent_send_error(a, le32(d->buf + 4), AL_ERR_PROTOCOL, 0, "%s", why);
        a->skip = AL_FRAME_HEADER_SIZE + (size_t)le32(d->buf + 8);
        decoder_skip(a);
        return;
    }
    if (!a->resyncing)
        agent_send_error(a, 0, AL_ERR_PROTOCOL, 0, "%s", why);
    a->resyncing = true;
    al_decoder_init(d, a->inbuf, sizeof(a->inbuf));
}

static void channel_dispatch(struct agent *a)
{
    while (a->connected && !a->stop && !a->skip && outq_len(a) < AGENT_OUTQ_HIGH) {
        struct al_msg m;
        const char *why = "malformed frame";
        int r = al_decoder_next(&a->dec, &m, &why);
        if (r == 0)
            return;
        if (r > 0)
            dispatch(a, &m);
        else
            frame_reject(a, r, why);
    }
}

/* Reads what the host sent; <0: the host is gone. */
static int channel_read(struct agent *a)
{
    for (;;) {
        size_t avail;
        uint8_t *p = al_decoder_space(&a->dec, &avail);
        if (!avail)
            return 0;
        ssize_t n = read(a->ch.in_fd, p, avail);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno == EAGAIN ? 0 : -errno;
        }
        if (n == 0)
            return -ENOTCONN;
        al_decoder_commit(&a->dec, (size_t)n);
        if (a->skip)
            decoder_skip(a);
    }
}

static void handle_signals(struct agent *a)
{
    struct signalfd_siginfo si[8];
    ssize_t n = read(a->sig_fd, si, sizeof(si));
    for (ssize_t i = 0; i < n / (ssize_t)sizeof(si[0]); i++) {
        if (si[i].ssi_signo == SIGCHLD)
            a->reap = true;
        else if (si[i].ssi_signo == SIGTERM || si[i].ssi_signo == SIGINT) {
            agent_log("stopping on signal %u", si[i].ssi_signo);
            a->stop = true;
        }
        /* SIGIO only wakes the loop: the virtio port's host connected or went away. */
    }
}

static int timeout_ms(uint64_t next, uint64_t now)
{
    if (next == UINT64_MAX)
        return -1;
    if (next <= now)
        return 0;
    uint64_t ms = (next - now + 999) / 1000;
    return ms > INT32_MAX ? INT32_MAX : (int)ms;
}

enum poll_role {
    ROLE_SIGNAL,
    ROLE_CHANNEL_IN,
    ROLE_CHANNEL_OUT,
    ROLE_LISTEN,
    ROLE_OUT0,
    ROLE_OUT1,
    ROLE_OUT2,
    ROLE_STDIN,
    ROLE_KERNEL_CTL,
    ROLE_KERNEL_OUT0,
    ROLE_KERNEL_OUT1,
    ROLE_KERNEL_OUT2,
};

/* Slots in the poll set: signals, the channel (two fds, or one socket and the listening one),
 * per request its outputs and stdin, per kernel its control socket and outputs. */
#define POLL_MAX (3 + (REQ_OUTS + 1) * AGENT_REQ_MAX + (REQ_OUTS + 1) * KERNEL_MAX)

/* The poll set of one round, each slot tagged with what it is for. */
struct poll_set {
    struct pollfd pfd[POLL_MAX];
    struct {
        struct req *r;
        struct kernel *k;
        enum poll_role role;
    } tag[POLL_MAX];
    size_t n;
};

static void poll_add(struct poll_set *ps, int fd, int ev, struct req *r, struct kernel *k,
                     enum poll_role role)
{
    ps->pfd[ps->n] = (struct pollfd){fd, (short)ev, 0};
    ps->tag[ps->n].r = r;
    ps->tag[ps->n].k = k;
    ps->tag[ps->n].role = role;
    ps->n++;
}

/* The channel's fds: in while there is room for input and the output queue is not too long,
 * out while it holds something. */
static void poll_add_channel(struct agent *a, struct poll_set *ps)
{
    size_t avail;
    al_decoder_space(&a->dec, &avail);
    bool want_in = avail > 0 && outq_len(a) < AGENT_OUTQ_HIGH;
    short out_ev = outq_len(a) ? POLLOUT : 0;
    if (a->ch.in_fd == a->ch.out_fd) {
        poll_add(ps, a->ch.in_fd, (want_in ? POLLIN : 0) | out_ev, NULL, NULL, ROLE_CHANNEL_IN);
    } else {
        /* Left out rather than polled for nothing: a hung-up pipe would spin. */
        if (want_in)
            poll_add(ps, a->ch.in_fd, POLLIN, NULL, NULL, ROLE_CHANNEL_IN);
        if (out_ev)
            poll_add(ps, a->ch.out_fd, out_ev, NULL, NULL, ROLE_CHANNEL_OUT);
    }
}

/* A request's fds and timers; next is lowered to its earliest timer. */
static void poll_add_req(struct agent *a, struct poll_set *ps, struct req *r, uint64_t now,
                         uint64_t *next)
{
    if (r->kind == REQ_GET) {
        if (ostream_ready(a, &r->out[0]))
            *next = now; /* a regular file is always readable: no poll */
        return;
    }
    if (r->kind != REQ_EXEC)
        return;
    if (!host_ready(a)) { /* orphaned: only its deadlines run */
        if (r->deadline_us && !r->reaped && r->deadline_us < *next)
            *next = r->deadline_us;
        if (r->kill_us && !r->reaped && r->kill_us < *next)
            *next = r->kill_us;
        return;
    }
    if (ostream_ready(a, &r->out[0]))
        poll_add(ps, r->out[0].fd, POLLIN, r, NULL, ROLE_OUT0);
    if (ostream_ready(a, &r->out[1]))
        poll_add(ps, r->out[1].fd, POLLIN, r, NULL, ROLE_OUT1);
    if (ostream_ready(a, &r->out[2]))
        poll_add(ps, r->out[2].fd, POLLIN, r, NULL, ROLE_OUT2);
    if (r->in_fd >= 0 && r->inq.len > r->inq.head && outq_len(a) < AGENT_OUTQ_HIGH)
        poll_add(ps, r->in_fd, POLLOUT, r, NULL, ROLE_STDIN);
    if (r->deadline_us && !r->reaped && r->deadline_us < *next)
        *next = r->deadline_us;
    if (r->grace_us && r->grace_us < *next)
        *next = r->grace_us;
    if (r->kill_us && !r->reaped && r->kill_us < *next)
        *next = r->kill_us;
    if (r->input_wait_ms && r->stdin_ino && !r->reaped && r->wait_next_us < *next)
        *next = r->wait_next_us;
}

/* Fills the poll set for this round; the time (us) by which the loop must wake, or
 * UINT64_MAX. */
static uint64_t poll_build(struct agent *a, struct poll_set *ps, uint64_t now)
{
    uint64_t next = UINT64_MAX;
    ps->n = 0;
    poll_add(ps, a->sig_fd, POLLIN, NULL, NULL, ROLE_SIGNAL);
    if (a->connected)
        poll_add_channel(a, ps);
    /* Also while connected: the newest connection wins (see ROLE_LISTEN). */
    if (a->ch.kind == CHANNEL_UNIX) {
        poll_add(ps, a->ch.listen_fd, POLLIN, NULL, NULL, ROLE_LISTEN);
    } else if (!a->connected) {
        next = now + AGENT_HOST_POLL_MS * 1000;
    }
    for (size_t i = 0; i < AGENT_REQ_MAX; i++)
        if (a->reqs[i].used)
            poll_add_req(a, ps, &a->reqs[i], now, &next);
    for (size_t i = 0; i < KERNEL_MAX; i++) {
        struct kernel *k = &a->kernels[i];
        /* A run's end would make frames no host reads: it waits for one (on_disconnect). */
        if (k->ctl_fd >= 0 && (host_ready(a) || !k->run))
            poll_add(ps, k->ctl_fd, POLLIN | (k->wbuf && k->ready ? POLLOUT : 0), NULL, k,
                     ROLE_KERNEL_CTL);
        /* Output no run is reading (between runs, or past a run's share) is dropped. */
        for (int j = 0; j < REQ_OUTS; j++)
            if (k->out_fd[j] >= 0 && !(k->run && k->run->out[j].fd == k->out_fd[j]))
                poll_add(ps, k->out_fd[j], POLLIN, NULL, k, ROLE_KERNEL_OUT0 + j);
    }
    if (a->reap)
        next = now;
    if (a->ndead && a->dead_next_us < next)
        next = a->dead_next_us;
    uint64_t held = kernel_tick(a, now); /* SIGINTs held for a handler */
    if (held < next)
        next = held;
    return next;
}

/* Serves the fds poll found ready; a negative errno when the host connection is lost, and
 * *replaced when a newer connection is waiting. */
static int poll_serve(struct agent *a, struct poll_set *ps, int pr, bool *replaced)
{
    int lost = 0;
    for (size_t i = 0; pr > 0 && i < ps->n; i++) {
        short re = ps->pfd[i].revents;
        if (!re)
            continue;
        struct req *r = ps->tag[i].r;
        struct kernel *k = ps->tag[i].k;
        enum poll_role role = ps->tag[i].role;
        switch (role) {
        case ROLE_SIGNAL:
            handle_signals(a);
            break;
        case ROLE_CHANNEL_IN:
            /* On a virtio port POLLHUP means the host left: nothing to read first. */
            if ((re & POLLHUP) && a->ch.kind == CHANNEL_VIRTIO)
                lost = -ENOTCONN;
            if (re & (POLLIN | POLLHUP | POLLERR))
                lost = lost ? lost : channel_read(a);
            if (!lost && (re & POLLOUT))
                lost = outq_flush(a);
            break;
        case ROLE_CHANNEL_OUT:
            lost = lost ? lost : outq_flush(a);
            break;
        case ROLE_LISTEN:
            /* A host connecting again (after a snapshot restore the old connection is a
             * stale TCP link that may take minutes to time out) must not wait behind the
             * old one: it is dropped as if the host had left. channel_accept at the top of
             * the loop takes the new one. */
            *replaced = a->connected;
            break;
        case ROLE_OUT0:
        case ROLE_OUT1:
        case ROLE_OUT2:
            if (r->used)
                ostream_pump(a, r, &r->out[role - ROLE_OUT0]);
            break;
        case ROLE_STDIN:
            if (r->used)
                exec_flush_stdin(a, r);
            break;
        case ROLE_KERNEL_CTL:
            kernel_ctl_io(a, k, re);
            break;
        case ROLE_KERNEL_OUT0:
        case ROLE_KERNEL_OUT1:
        case ROLE_KERNEL_OUT2:
            /* The fd may have been handed to a run by the control line just handled. */
            if (!k->run || k->run->out[role - ROLE_KERNEL_OUT0].fd != ps->pfd[i].fd)
                kernel_drain(k, role - ROLE_KERNEL_OUT0);
            break;
        }
    }
    return lost;
}

/* After the fds are served: frames, children, the requests' timers, the replies. */
static void agent_tick(struct agent *a)
{
    channel_dispatch(a);
    if (a->reap)
        a->reap = exec_reap(a);
    uint64_t now = now_us();
    for (size_t i = 0; i < AGENT_REQ_MAX; i++) {
        struct req *r = &a->reqs[i];
        if (!r->used)
            continue;
        if (r->kind == REQ_EXEC && !host_ready(a))
            exec_timers(a, r, now);
        else if (r->kind == REQ_EXEC)
            exec_tick(a, r, now);
        else if (r->kind == REQ_GET)
            file_get_tick(a, r);
    }
    /* Write now rather than after another poll: latency of small replies. */
    if (a->connected && outq_len(a)) {
        int err = outq_flush(a);
        if (err)
            on_disconnect(a, strerror(-err));
    }
    cgroup_housekeeping(a, now_us());
}

int agent_run(struct agent *a)
{
    struct poll_set ps;

    al_decoder_init(&a->dec, a->inbuf, sizeof(a->inbuf));
    kernel_init(a);
    while (!a->stop) {
        if (!a->connected) {
            int c = channel_accept(&a->ch);
            if (c < 0)
                return c;
            if (c > 0)
                on_connect(a);
        }
        /* Frames held back while the output queue was above its high-water mark. */
        channel_dispatch(a);

        uint64_t now = now_us();
        uint64_t next = poll_build(a, &ps, now);
        int pr = poll(ps.pfd, ps.n, timeout_ms(next, now));
        if (pr < 0 && errno != EINTR)
            return -errno;

        bool replaced = false;
        int lost = poll_serve(a, &ps, pr, &replaced);
        if (lost || replaced) {
            on_disconnect(a, replaced            ? "a newer connection replaces it"
                             : lost == -ENOTCONN ? NULL
                                                 : strerror(-lost));
            continue;
        }
        agent_tick(a);
    }
    session_reset(a);
    return 0;
}

/* Encoding and bounded decoding of Airlock frames. See airlock-proto.h and docs/PROTOCOL.md. */
#include "airlock-proto.h"

#include <errno.h>
#include <string.h>

struct writer {
    uint8_t *p;
    size_t cap;
    size_t len;
    bool overflow;
};

struct reader {
    const uint8_t *p;
    size_t left;
    const char *why; /* first failure, NULL while all is well */
};

static void put(struct writer *w, const void *src, size_t n)
{
    if (w->overflow || n > w->cap - w->len) {
        w->overflow = true;
        return;
    }
    if (n)
        memcpy(w->p + w->len, src, n);
    w->len += n;
}

static void put_u8(struct writer *w, uint8_t v)
{
    put(w, &v, 1);
}

static void put_u16(struct writer *w, uint16_t v)
{
    uint8_t b[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
    put(w, b, 2);
}

static void put_u32(struct writer *w, uint32_t v)
{
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put(w, b, 4);
}

static void put_u64(struct writer *w, uint64_t v)
{
    put_u32(w, (uint32_t)v);
    put_u32(w, (uint32_t)(v >> 32));
}

static void put_str(struct writer *w, struct al_str s)
{
    put_u32(w, s.len);
    put(w, s.p, s.len);
}

static void put_strlist(struct writer *w, const struct al_str *v, uint32_t n)
{
    put_u32(w, n);
    for (uint32_t i = 0; i < n; i++)
        put_str(w, v[i]);
}

static bool take(struct reader *r, size_t n, const char *what)
{
    if (r->why)
        return false;
    if (n > r->left) {
        r->why = what;
        return false;
    }
    return true;
}

static uint8_t get_u8(struct reader *r, const char *what)
{
    if (!take(r, 1, what))
        return 0;
    uint8_t v = r->p[0];
    r->p += 1;
    r->left -= 1;
    return v;
}

static uint16_t get_u16(struct reader *r, const char *what)
{
    if (!take(r, 2, what))
        return 0;
    uint16_t v = (uint16_t)(r->p[0] | r->p[1] << 8);
    r->p += 2;
    r->left -= 2;
    return v;
}

static uint32_t get_u32(struct reader *r, const char *what)
{
    if (!take(r, 4, what))
        return 0;
    uint32_t v = (uint32_t)r->p[0] | (uint32_t)r->p[1] << 8 | (uint32_t)r->p[2] << 16 |
                 (uint32_t)r->p[3] << 24;
    r->p += 4;
    r->left -= 4;
    return v;
}

static uint64_t get_u64(struct reader *r, const char *what)
{
    uint64_t lo = get_u32(r, what);
    uint64_t hi = get_u32(r, what);
    return lo | hi << 32;
}

static struct al_str get_str(struct reader *r, uint32_t max, const char *what)
{
    struct al_str s = {NULL, 0};
    uint32_t n = get_u32(r, what);
    if (r->why)
        return s;
    if (n > max) {
        r->why = what;
        return s;
    }
    if (!take(r, n, what))
        return s;
    s.p = (const char *)r->p;
    s.len = n;
    r->p += n;
    r->left -= n;
    return s;
}

/* n raw bytes, in place. */
static const uint8_t *get_bytes(struct reader *r, size_t n, const char *what)
{
    if (!take(r, n, what))
        return NULL;
    const uint8_t *p = r->p;
    r->p += n;
    r->left -= n;
    return p;
}

static bool hostname_ok(struct al_str s)
{
    if (s.len == 0 || s.len > AL_HOSTNAME_MAX)
        return false;
    for (uint32_t i = 0; i < s.len; i++) {
        char c = s.p[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-'))
            return false;
    }
    return true;
}

static uint32_t get_strlist(struct reader *r, struct al_str *v, uint32_t max_count,
                            uint32_t max_len, const char *what)
{
    uint32_t n = get_u32(r, what);
    if (r->why)
        return 0;
    if (n > max_count) {
        r->why = what;
        return 0;
    }
    for (uint32_t i = 0; i < n; i++)
        v[i] = get_str(r, max_len, what);
    return r->why ? 0 : n;
}

static bool pty_dims_ok(uint16_t rows, uint16_t cols)
{
    return rows >= 1 && rows <= AL_PTY_DIM_MAX && cols >= 1 && cols <= AL_PTY_DIM_MAX;
}

static bool stream_ok(uint8_t s)
{
    return s < AL_STREAM_COUNT;
}

int al_header_decode(const uint8_t *buf, size_t len, struct al_header *out, const char **why)
{
    if (len < AL_FRAME_HEADER_SIZE) {
        *why = "truncated frame header";
        return -EPROTO;
    }
    if (buf[0] != AL_FRAME_MAGIC0 || buf[1] != AL_FRAME_MAGIC1) {
        *why = "bad frame magic";
        return -EBADMSG;
    }
    struct reader r = {buf + 2, len - 2, NULL};
    struct al_header h;
    h.type = get_u8(&r, "");
    h.flags = get_u8(&r, "");
    h.id = get_u32(&r, "");
    h.len = get_u32(&r, "");
    if (h.len > AL_FRAME_PAYLOAD_MAX) {
        *why = "frame larger than the maximum";
        return -EMSGSIZE;
    }
    if (h.type == 0 || h.type > AL_TYPE_MAX_) {
        *why = "unknown frame type";
        return -EPROTONOSUPPORT;
    }
    if (h.flags & ~AL_FLAGS_KNOWN) {
        *why = "unknown frame flags";
        return -EPROTO;
    }
    *out = h;
    return 0;
}

int al_msg_decode(const struct al_header *h, const uint8_t *payload, struct al_msg *out,
                  const char **why)
{
    struct reader r = {payload, h->len, NULL};
    struct al_msg m;
    memset(&m, 0, sizeof(m));
    m.type = h->type;
    m.flags = h->flags;
    m.id = h->id;

    if (h->flags && h->type != AL_DATA) {
        *why = "flags on a frame that takes none";
        return -EPROTO;
    }
    switch (h->type) {
    case AL_HELLO:
        m.u.hello.version = get_u32(&r, "truncated hello");
        m.u.hello.nonce = get_u64(&r, "truncated hello");
        m.u.hello.window = get_u32(&r, "truncated hello");
        if (!r.why && r.left)
            m.u.hello.flags = get_u32(&r, "truncated hello flags");
        break;
    case AL_HELLO_ACK:
        m.u.hello_ack.version = get_u32(&r, "truncated hello-ack");
        m.u.hello_ack.nonce = get_u64(&r, "truncated hello-ack");
        m.u.hello_ack.window = get_u32(&r, "truncated hello-ack");
        m.u.hello_ack.caps = get_u32(&r, "truncated hello-ack");
        m.u.hello_ack.agent_version = get_str(&r, AL_SHORT_STR_MAX, "bad agent version");
        m.u.hello_ack.nlangs = get_strlist(&r, m.u.hello_ack.langs, AL_LANGS_MAX, AL_SHORT_STR_MAX,
                                           "bad language list");
        if (!r.why && r.left) {
            m.u.hello_ack.nadopted = get_u32(&r, "truncated adopted list");
            if (m.u.hello_ack.nadopted > AL_ADOPT_MAX && !r.why)
                r.why = "too many adopted requests";
            for (uint32_t i = 0; !r.why && i < m.u.hello_ack.nadopted; i++)
                m.u.hello_ack.adopted[i] = get_u32(&r, "truncated adopted list");
        }
        break;
    case AL_EXEC:
        m.u.exec.flags = get_u32(&r, "truncated exec");
        m.u.exec.timeout_ms = get_u32(&r, "truncated exec");
        m.u.exec.input_wait_ms = get_u32(&r, "truncated exec");
        m.u.exec.output_cap = get_u64(&r, "truncated exec");
        m.u.exec.rows = get_u16(&r, "truncated exec");
        m.u.exec.cols = get_u16(&r, "truncated exec");
        m.u.exec.lang = get_str(&r, AL_SHORT_STR_MAX, "bad exec language");
        m.u.exec.cwd = get_str(&r, AL_GUEST_PATH_MAX, "bad exec cwd");
        m.u.exec.argc =
            get_strlist(&r, m.u.exec.argv, AL_ARGV_MAX, AL_FRAME_PAYLOAD_MAX, "bad exec argv");
        m.u.exec.envc =
            get_strlist(&r, m.u.exec.env, AL_ENV_MAX, AL_FRAME_PAYLOAD_MAX, "bad exec env");
        if (!r.why && m.u.exec.argc == 0)
            r.why = "exec without argv";
        if (!r.why && (m.u.exec.flags & ~AL_EXEC_FLAGS_KNOWN))
            r.why = "unknown exec flags";
        if (!r.why && (m.u.exec.flags & AL_EXEC_KERNEL) && m.u.exec.lang.len == 0)
            r.why = "kernel exec without a language";
        if (!r.why && (m.u.exec.flags & AL_EXEC_KERNEL_OP) && !(m.u.exec.flags & AL_EXEC_KERNEL))
            r.why = "kernel operation without the kernel flag";
        if (!r.why && m.u.exec.input_wait_ms > AL_INPUT_WAIT_MAX_MS)
            r.why = "input wait too long";
        if (!r.why && (m.u.exec.flags & AL_EXEC_PTY) &&
            (m.u.exec.flags & AL_EXEC_KERNEL || !pty_dims_ok(m.u.exec.rows, m.u.exec.cols)))
            r.why = "bad terminal for an exec";
        if (!r.why && !(m.u.exec.flags & AL_EXEC_PTY) && (m.u.exec.rows || m.u.exec.cols))
            r.why = "terminal size without a terminal";
        break;
    case AL_STARTED:
        m.u.started.pid = get_u32(&r, "truncated started");
        break;
    case AL_DATA:
        m.u.data.stream = get_u8(&r, "truncated data");
        if (!r.why && !stream_ok(m.u.data.stream))
            r.why = "bad stream number";
        if (!r.why && r.left > AL_DATA_CHUNK_MAX)
            r.why = "data chunk larger than the maximum";
        if (!r.why) {
            m.u.data.data = r.p;
            m.u.data.len = (uint32_t)r.left;
            r.left = 0;
        }
        break;
    case AL_CREDIT:
        m.u.credit.stream = get_u8(&r, "truncated credit");
        m.u.credit.bytes = get_u32(&r, "truncated credit");
        if (!r.why && !stream_ok(m.u.credit.stream))
            r.why = "bad stream number";
        if (!r.why && m.u.credit.bytes > AL_WINDOW_MAX)
            r.why = "credit larger than any window";
        break;
    case AL_SIGNAL:
        m.u.signal.signo = get_u32(&r, "truncated signal");
        if (!r.why && (m.u.signal.signo == 0 || m.u.signal.signo > 64))
            r.why = "bad signal number";
        break;
    case AL_EXIT:
        m.u.exit.how = get_u8(&r, "truncated exit");
        m.u.exit.value = (int32_t)get_u32(&r, "truncated exit");
        m.u.exit.duration_us = get_u64(&r, "truncated exit");
        m.u.exit.flags = get_u32(&r, "truncated exit");
        if (!r.why && m.u.exit.how == AL_EXIT_CODE && (m.u.exit.value < 0 || m.u.exit.value > 255))
            r.why = "exit status out of range";
        if (!r.why && m.u.exit.how == AL_EXIT_SIGNAL && (m.u.exit.value < 1 || m.u.exit.value > 64))
            r.why = "exit signal out of range";
        if (!r.why && m.u.exit.how > AL_EXIT_SIGNAL)
            r.why = "bad exit kind";
        break;
    case AL_ERROR:
        m.u.error.klass = get_u16(&r, "truncated error");
        m.u.error.err = get_u32(&r, "truncated error");
        m.u.error.message = get_str(&r, AL_MESSAGE_MAX, "bad error message");
        if (!r.why && (m.u.error.klass == 0 || m.u.error.klass > AL_ERR_CLASS_MAX_))
            r.why = "bad error class";
        break;
    case AL_FILE_PUT:
        m.u.file_put.mode = get_u32(&r, "truncated file-put");
        m.u.file_put.size = get_u64(&r, "truncated file-put");
        m.u.file_put.path = get_str(&r, AL_GUEST_PATH_MAX, "bad file-put path");
        if (!r.why && (m.u.file_put.mode & ~07777u))
            r.why = "bad file mode";
        break;
    case AL_FILE_GET:
        m.u.file_get.path = get_str(&r, AL_GUEST_PATH_MAX, "bad file-get path");
        break;
    case AL_FILE_INFO:
        m.u.file_info.mode = get_u32(&r, "truncated file-info");
        m.u.file_info.size = get_u64(&r, "truncated file-info");
        if (!r.why && (m.u.file_info.mode & ~07777u))
            r.why = "bad file mode";
        break;
    case AL_OK:
        m.u.ok.value = get_u64(&r, "truncated ok");
        break;
    case AL_PING:
    case AL_PONG:
        m.u.ping.cookie = get_u64(&r, "truncated ping");
        break;
    case AL_SHUTDOWN:
        m.u.shutdown.how = get_u32(&r, "truncated shutdown");
        if (!r.why && m.u.shutdown.how > AL_SHUTDOWN_REBOOT)
            r.why = "bad shutdown kind";
        break;
    case AL_WAITING:
        m.u.waiting.waited_ms = get_u32(&r, "truncated waiting");
        break;
    case AL_RESIZE:
        m.u.resize.rows = get_u16(&r, "truncated resize");
        m.u.resize.cols = get_u16(&r, "truncated resize");
        if (!r.why && !pty_dims_ok(m.u.resize.rows, m.u.resize.cols))
            r.why = "bad terminal size";
        break;
    case AL_CONNECT:
        m.u.connect.port = get_u16(&r, "truncated connect");
        if (!r.why && !m.u.connect.port)
            r.why = "bad port";
        break;
    case AL_REFRESH:
        m.u.refresh.seed = get_bytes(&r, AL_REFRESH_SEED, "truncated refresh");
        m.u.refresh.sec = get_u64(&r, "truncated refresh");
        m.u.refresh.nsec = get_u32(&r, "truncated refresh");
        m.u.refresh.machine_id = get_bytes(&r, AL_MACHINE_ID, "truncated refresh");
        m.u.refresh.hostname = get_str(&r, AL_HOSTNAME_MAX, "bad refresh hostname");
        if (!r.why && m.u.refresh.nsec >= 1000000000u)
            r.why = "bad refresh clock";
        if (!r.why && m.u.refresh.sec > INT64_MAX)
            r.why = "bad refresh clock";
        if (!r.why && !hostname_ok(m.u.refresh.hostname))
            r.why = "bad refresh hostname";
        break;
    default:
        *why = "unknown frame type";
        return -EPROTONOSUPPORT;
    }
    if (!r.why && r.left)
        r.why = "trailing bytes in frame";
    if (r.why) {
        *why = r.why;
        return -EPROTO;
    }
    *out = m;
    return 0;
}

int al_msg_encode(const struct al_msg *m, uint8_t *out, size_t cap)
{
    struct writer w = {out, cap, 0, false};
    if (cap < AL_FRAME_HEADER_SIZE)
        return -EMSGSIZE;
    w.len = AL_FRAME_HEADER_SIZE;

    switch (m->type) {
    case AL_HELLO:
        put_u32(&w, m->u.hello.version);
        put_u64(&w, m->u.hello.nonce);
        put_u32(&w, m->u.hello.window);
        if (m->u.hello.flags) /* absent when 0: a HELLO as before */
            put_u32(&w, m->u.hello.flags);
        break;
    case AL_HELLO_ACK:
        if (m->u.hello_ack.nlangs > AL_LANGS_MAX)
            return -EINVAL;
        put_u32(&w, m->u.hello_ack.version);
        put_u64(&w, m->u.hello_ack.nonce);
        put_u32(&w, m->u.hello_ack.window);
        put_u32(&w, m->u.hello_ack.caps);
        put_str(&w, m->u.hello_ack.agent_version);
        put_strlist(&w, m->u.hello_ack.langs, m->u.hello_ack.nlangs);
        if (m->u.hello_ack.nadopted > AL_ADOPT_MAX)
            return -EINVAL;
        if (m->u.hello_ack.nadopted) {
            put_u32(&w, m->u.hello_ack.nadopted);
            for (uint32_t i = 0; i < m->u.hello_ack.nadopted; i++)
                put_u32(&w, m->u.hello_ack.adopted[i]);
        }
        break;
    case AL_EXEC:
        if (m->u.exec.argc == 0 || m->u.exec.argc > AL_ARGV_MAX || m->u.exec.envc > AL_ENV_MAX)
            return -EINVAL;
        put_u32(&w, m->u.exec.flags);
        put_u32(&w, m->u.exec.timeout_ms);
        put_u32(&w, m->u.exec.input_wait_ms);
        put_u64(&w, m->u.exec.output_cap);
        put_u16(&w, m->u.exec.rows);
        put_u16(&w, m->u.exec.cols);
        put_str(&w, m->u.exec.lang);
        put_str(&w, m->u.exec.cwd);
        put_strlist(&w, m->u.exec.argv, m->u.exec.argc);
        put_strlist(&w, m->u.exec.env, m->u.exec.envc);
        break;
    case AL_STARTED:
        put_u32(&w, m->u.started.pid);
        break;
    case AL_DATA:
        if (m->u.data.len > AL_DATA_CHUNK_MAX || !stream_ok(m->u.data.stream))
            return -EINVAL;
        put_u8(&w, m->u.data.stream);
        put(&w, m->u.data.data, m->u.data.len);
        break;
    case AL_CREDIT:
        put_u8(&w, m->u.credit.stream);
        put_u32(&w, m->u.credit.bytes);
        break;
    case AL_SIGNAL:
        put_u32(&w, m->u.signal.signo);
        break;
    case AL_EXIT:
        put_u8(&w, m->u.exit.how);
        put_u32(&w, (uint32_t)m->u.exit.value);
        put_u64(&w, m->u.exit.duration_us);
        put_u32(&w, m->u.exit.flags);
        break;
    case AL_ERROR: {
        struct al_str msg = m->u.error.message;
        if (msg.len > AL_MESSAGE_MAX)
            msg.len = AL_MESSAGE_MAX; /* a message is one phrase; cut rather than fail */
        put_u16(&w, m->u.error.klass);
        put_u32(&w, m->u.error.err);
        put_str(&w, msg);
        break;
    }
    case AL_FILE_PUT:
        put_u32(&w, m->u.file_put.mode);
        put_u64(&w, m->u.file_put.size);
        put_str(&w, m->u.file_put.path);
        break;
    case AL_FILE_GET:
        put_str(&w, m->u.file_get.path);
        break;
    case AL_FILE_INFO:
        put_u32(&w, m->u.file_info.mode);
        put_u64(&w, m->u.file_info.size);
        break;
    case AL_OK:
        put_u64(&w, m->u.ok.value);
        break;
    case AL_PING:
    case AL_PONG:
        put_u64(&w, m->u.ping.cookie);
        break;
    case AL_SHUTDOWN:
        put_u32(&w, m->u.shutdown.how);
        break;
    case AL_WAITING:
        put_u32(&w, m->u.waiting.waited_ms);
        break;
    case AL_RESIZE:
        if (!pty_dims_ok(m->u.resize.rows, m->u.resize.cols))
            return -EINVAL;
        put_u16(&w, m->u.resize.rows);
        put_u16(&w, m->u.resize.cols);
        break;
    case AL_CONNECT:
        if (!m->u.connect.port)
            return -EINVAL;
        put_u16(&w, m->u.connect.port);
        break;
    case AL_REFRESH:
        if (!m->u.refresh.seed || !m->u.refresh.machine_id)
            return -EINVAL;
        put(&w, m->u.refresh.seed, AL_REFRESH_SEED);
        put_u64(&w, m->u.refresh.sec);
        put_u32(&w, m->u.refresh.nsec);
        put(&w, m->u.refresh.machine_id, AL_MACHINE_ID);
        put_str(&w, m->u.refresh.hostname);
        break;
    default:
        return -EINVAL;
    }
    if (w.overflow)
        return -EMSGSIZE;
    size_t plen = w.len - AL_FRAME_HEADER_SIZE;
    if (plen > AL_FRAME_PAYLOAD_MAX)
        return -EMSGSIZE;
    struct writer hw = {out, AL_FRAME_HEADER_SIZE, 0, false};
    put_u8(&hw, AL_FRAME_MAGIC0);
    put_u8(&hw, AL_FRAME_MAGIC1);
    put_u8(&hw, m->type);
    put_u8(&hw, m->type == AL_DATA ? m->flags : 0);
    put_u32(&hw, m->id);
    put_u32(&hw, (uint32_t)plen);
    /* The decoder holds every range rule; an encoder that emitted what the peer must reject
     * would turn a caller's mistake into a protocol error far away. */
    struct al_header h = {m->type, m->type == AL_DATA ? m->flags : 0, m->id, (uint32_t)plen};
    struct al_msg check;
    const char *why;
    if ((m->flags & ~AL_FLAGS_KNOWN) ||
        al_msg_decode(&h, out + AL_FRAME_HEADER_SIZE, &check, &why) < 0)
        return -EINVAL;
    return (int)w.len;
}

void al_data_header(uint8_t out[AL_FRAME_HEADER_SIZE + 1], uint32_t id, uint8_t stream,
                    uint8_t flags, uint32_t len)
{
    struct writer w = {out, AL_FRAME_HEADER_SIZE + 1, 0, false};
    put_u8(&w, AL_FRAME_MAGIC0);
    put_u8(&w, AL_FRAME_MAGIC1);
    put_u8(&w, AL_DATA);
    put_u8(&w, flags);
    put_u32(&w, id);
    put_u32(&w, len + 1);
    put_u8(&w, stream);
}

void al_decoder_init(struct al_decoder *d, uint8_t *buf, size_t cap)
{
    d->buf = buf;
    d->cap = cap;
    d->len = 0;
    d->used = 0;
}

static void decoder_compact(struct al_decoder *d)
{
    if (d->used) {
        memmove(d->buf, d->buf + d->used, d->len - d->used);
        d->len -= d->used;
        d->used = 0;
    }
}

uint8_t *al_decoder_space(struct al_decoder *d, size_t *avail)
{
    decoder_compact(d);
    *avail = d->cap - d->len;
    return d->buf + d->len;
}

void al_decoder_commit(struct al_decoder *d, size_t n)
{
    d->len += n;
}

int al_decoder_next(struct al_decoder *d, struct al_msg *out, const char **why)
{
    decoder_compact(d);
    if (d->len < AL_FRAME_HEADER_SIZE) {
        /* Reject garbage as soon as the magic is wrong, without waiting for a header. */
        if ((d->len >= 1 && d->buf[0] != AL_FRAME_MAGIC0) ||
            (d->len >= 2 && d->buf[1] != AL_FRAME_MAGIC1)) {
            *why = "bad frame magic";
            return -EBADMSG;
        }
        return 0;
    }
    struct al_header h;
    int r = al_header_decode(d->buf, d->len, &h, why);
    if (r < 0)
        return r;
    if (AL_FRAME_HEADER_SIZE + (size_t)h.len > d->cap) {
        *why = "frame larger than the receive buffer";
        return -EMSGSIZE;
    }
    if (d->len < AL_FRAME_HEADER_SIZE + (size_t)h.len)
        return 0;
    r = al_msg_decode(&h, d->buf + AL_FRAME_HEADER_SIZE, out, why);
    if (r < 0)
        return r;
    d->used = AL_FRAME_HEADER_SIZE + h.len;
    return 1;
}

bool al_decoder_partial(const struct al_decoder *d)
{
    return d->len > d->used;
}

const char *al_type_name(uint8_t type)
{
    static const char *const names[] = {
        [AL_HELLO] = "hello",
        [AL_HELLO_ACK] = "hello-ack",
        [AL_EXEC] = "exec",
        [AL_STARTED] = "started",
        [AL_DATA] = "data",
        [AL_CREDIT] = "credit",
        [AL_SIGNAL] = "signal",
        [AL_EXIT] = "exit",
        [AL_ERROR] = "error",
        [AL_FILE_PUT] = "file-put",
        [AL_FILE_GET] = "file-get",
        [AL_FILE_INFO] = "file-info",
        [AL_OK] = "ok",
        [AL_PING] = "ping",
        [AL_PONG] = "pong",
        [AL_SHUTDOWN] = "shutdown",
        [AL_WAITING] = "waiting",
        [AL_REFRESH] = "refresh",
        [AL_RESIZE] = "resize",
        [AL_CONNECT] = "connect",
    };
    if (type == 0 || type > AL_TYPE_MAX_)
        return "unknown";
    return names[type];
}

const char *al_error_class_name(uint16_t klass)
{
    static const char *const names[] = {
        [AL_ERR_PROTOCOL] = "protocol",     [AL_ERR_NOT_FOUND] = "not-found",
        [AL_ERR_PERMISSION] = "permission", [AL_ERR_INVALID] = "invalid",
        [AL_ERR_LIMIT] = "limit",           [AL_ERR_IO] = "io",
        [AL_ERR_INTERNAL] = "internal",     [AL_ERR_UNSUPPORTED] = "unsupported",
    };
    if (klass == 0 || klass > AL_ERR_CLASS_MAX_)
        return "unknown";
    return names[klass];
}

bool al_str_eq(struct al_str s, const char *lit)
{
    size_t n = strlen(lit);
    return s.len == n && (n == 0 || memcmp(s.p, lit, n) == 0);
}

struct al_str al_str_cstr(const char *s)
{
    struct al_str r = {s, s ? (uint32_t)strlen(s) : 0};
    return r;
}

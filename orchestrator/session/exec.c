/* Running one command in the guest: send EXEC, stream stdin in and stdout/stderr out, collect
 * the exit. */
#include "exec.h"
#include "link.h"
#include "result.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

static size_t count(const char *const *v)
{
    size_t n = 0;
    while (v && v[n])
        n++;
    return n;
}

/* The host's own deadline for a run with a timeout: the agent's timeout plus this much (a kernel
 * run also covers the kernel's start, seconds under emulation), then SIGKILL, then this long for
 * the exit before the agent is given up on. Nothing here trusts the guest to keep time. */
#define HOST_GRACE_MS 5000u
#define HOST_GRACE_KERNEL_MS 60000u
#define HOST_KILL_WAIT_MS 3000u

_Static_assert(AL_PTY_ROWS_COLS_MAX == AL_PTY_DIM_MAX, "the public bound is the wire's");
/* A pty run whose terminal closed (EOF on its stdin) is hung up by the agent; this long later
 * whatever still runs of it is killed, as a terminal's hangup leaves nothing behind. */
#define PTY_HANGUP_KILL_MS 3000u
#define PTY_TERM_DEFAULT "TERM=xterm-256color"
/* Where a virtio image's agent is in the guest (bound from the initramfs: guest-agent/init.c). */
#define AL_GUEST_AGENT_PATH "/usr/lib/airlock/airlock-agent"

/* Longer than any message offline_says holds. */
#define OFFLINE_TAIL 64

struct exec_state {
    al_session *s;
    uint32_t id;
    int cancel_fd;                 /* its signal pipe: the run's own or the session's */
    int stdin_fd;                  /* -1 once EOF was sent */
    uint64_t stdin_credit;         /* bytes the agent still accepts on stdin */
    bool out_broken[3];            /* host stdout/stderr went away: discard */
    uint64_t got[AL_STREAM_COUNT]; /* bytes received per stream: the host's count */
    al_result_reader *results;     /* a kernel run's result records */
    bool results_eof;
    bool started;
    bool waited_input; /* the guest reported the program waiting for input */
    bool killed;       /* the host deadline passed and SIGKILL was sent */
    bool interrupted;  /* a signal from the cancel fd was passed on to the program */
    bool offline;      /* the output said a host could not be reached (no network) */
    bool scan;         /* look for that: a session without network */
    bool pty;          /* the run is on a pseudo-terminal: its output is stream 1 alone */
    unsigned port;     /* a tunnel (CONNECT) to this guest port, not a run; 0: a run */
    uint64_t sent;     /* a tunnel's bytes sent to the guest */
    int resize_fd;     /* a pty run's new sizes; -1: none */
    uint64_t hup_ms;   /* a pty run's terminal closed: when its tree is killed; 0: not */
    bool hup_killed;   /* and it was */
    /* The end of each stream's last chunk: a message cut between two chunks is still seen. */
    char tail[AL_STREAM_COUNT][OFFLINE_TAIL];
    size_t tail_len[AL_STREAM_COUNT];
};

/* What programs print when no host can be reached: resolvers (glibc, curl, Python, Node, Go)
 * and connects. Looked for only in sessions without network, where they mean just that. */
static const char *const offline_says[] = {
    "Temporary failure in name resolution",
    "Name or service not known",
    "Could not resolve host",
    "No address associated with hostname",
    "Network is unreachable",
    "getaddrinfo EAI_AGAIN",
    "getaddrinfo ENOTFOUND",
    "server misbehaving",
    "no such host",
    "bad address '", /* busybox */
};

static bool says_offline(const char *p, size_t n)
{
    for (size_t i = 0; i < sizeof(offline_says) / sizeof(offline_says[0]); i++)
        if (memmem(p, n, offline_says[i], strlen(offline_says[i])))
            return true;
    return false;
}

/* Looks at one chunk of stdout or stderr (with what ended the stream's last one). */
static void scan_offline(struct exec_state *st, uint8_t stream, const uint8_t *data, size_t n)
{
    if (!st->scan || st->offline || !n)
        return;
    char buf[2 * OFFLINE_TAIL];
    size_t t = st->tail_len[stream];
    size_t head = n < OFFLINE_TAIL ? n : OFFLINE_TAIL;
    memcpy(buf, st->tail[stream], t);
    memcpy(buf + t, data, head);
    st->offline = says_offline(buf, t + head) || says_offline((const char *)data, n);
    size_t keep = n < OFFLINE_TAIL ? n : OFFLINE_TAIL;
    if (t + keep > OFFLINE_TAIL) { /* slide: the newest OFFLINE_TAIL bytes */
        size_t old = OFFLINE_TAIL - keep;
        memmove(st->tail[stream], st->tail[stream] + t - old, old);
        t = old;
    }
    memcpy(st->tail[stream] + t, data + n - keep, keep);
    st->tail_len[stream] = t + keep;
}

static int send_signal(struct exec_state *st, int signo, al_error *err)
{
    struct al_msg m = {.type = AL_SIGNAL, .id = st->id};
    m.u.signal.signo = (uint8_t)signo;
    return al_channel_send(&st->s->ch, &m, err);
}

static int pump_stdin(struct exec_state *st, al_error *err)
{
    uint8_t buf[AL_DATA_CHUNK_MAX];
    size_t want = st->stdin_credit < sizeof(buf) ? (size_t)st->stdin_credit : sizeof(buf);
    ssize_t n;
    do
        n = read(st->stdin_fd, buf, want);
    while (n < 0 && errno == EINTR);
    if (n < 0 && errno == EAGAIN)
        return 0;
    if (n <= 0) { /* EOF, or an unreadable stdin, ends the guest's stdin */
        st->stdin_fd = -1;
        /* A terminal has no end of input (^D is a byte): for a pty run this is its hangup (the
         * agent closes the terminal), and a run that outlives it is killed. */
        if (st->pty)
            st->hup_ms = al_now_ms() + PTY_HANGUP_KILL_MS;
        return al_channel_send_data(&st->s->ch, st->id, AL_STREAM_STDIN, AL_FLAG_EOF, NULL, 0, err);
    }
    st->stdin_credit -= (uint64_t)n;
    st->sent += (uint64_t)n;
    return al_channel_send_data(&st->s->ch, st->id, AL_STREAM_STDIN, 0, buf, (size_t)n, err);
}

static int send_credit(struct exec_state *st, uint8_t stream, uint32_t n, al_error *err)
{
    struct al_msg c = {.type = AL_CREDIT, .id = st->id};
    c.u.credit.stream = stream;
    c.u.credit.bytes = n;
    return al_channel_send(&st->s->ch, &c, err);
}

/* Result records: read as they come, each checked and handed on; the bytes are credited as
 * read, since the reader keeps at most one record (what it skips it never keeps). */
static int on_results(struct exec_state *st, const al_exec_opts *o, const struct al_msg *m,
                      al_error *err)
{
    if (!o->kernel || st->results_eof)
        return al_err(err, -EPROTO, "guest sent results %s",
                      o->kernel ? "after their end" : "for a command");
    st->got[AL_STREAM_RESULT] += m->u.data.len;
    int r = al_result_reader_feed(st->results, m->u.data.data, m->u.data.len, o->result,
                                  o->result_ctx, err);
    if (r == 0 && (m->flags & AL_FLAG_EOF)) {
        st->results_eof = true;
        r = al_result_reader_end(st->results, o->result, o->result_ctx, err);
    }
    if (r < 0 || m->u.data.len == 0)
        return r;
    return send_credit(st, AL_STREAM_RESULT, m->u.data.len, err);
}

static int on_cancel(struct exec_state *st, al_error *err);

/* A tunnel's bytes to its host-side socket: never blocked past the tunnel's cancel byte or the
 * end of its request (a host-side reader that stopped reading would hold the tunnel, and what
 * holds it, forever). Negative with err set when cancelled or failed; -EPIPE when the reader is
 * gone. */
static int tunnel_write(struct exec_state *st, int fd, const uint8_t *p, size_t len, al_error *err)
{
    while (len) {
        ssize_t n = send(fd, p, len, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == ENOTSOCK)
            return al_write_all(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return -errno;
        int r = al_link_wait_writable(st->s, st->id, fd, err);
        if (r < 0)
            return r;
        if (r == 1) {
            r = on_cancel(st, err);
            if (r < 0)
                return r;
        }
    }
    return 0;
}

static int on_data(struct exec_state *st, const al_exec_opts *o, const struct al_msg *m,
                   al_error *err)
{
    uint8_t stream = m->u.data.stream;
    if (stream == AL_STREAM_RESULT)
        return on_results(st, o, m, err);
    if (stream != AL_STREAM_STDOUT && (stream != AL_STREAM_STDERR || st->pty))
        return al_err(err, -EPROTO, "guest sent data on stream %u of %s", stream,
                      st->pty ? "a terminal's run" : "an exec");
    int fd = stream == AL_STREAM_STDOUT ? o->stdout_fd : o->stderr_fd;
    /* The agent stops at the cap; more is a guest speaking for it. Nothing past the cap is
     * written, and the run is killed. */
    if (o->output_cap && m->u.data.len > o->output_cap - st->got[stream]) {
        al_error ignored = {0};
        send_signal(st, SIGKILL, &ignored);
        return al_err(err, -EMSGSIZE,
                      "the guest sent more than the %llu-byte output cap on %s; the run was "
                      "killed",
                      (unsigned long long)o->output_cap,
                      stream == AL_STREAM_STDOUT ? "stdout" : "stderr");
    }
    st->got[stream] += m->u.data.len;
    scan_offline(st, stream, m->u.data.data, m->u.data.len);
    if (m->u.data.len && !st->out_broken[stream] && (o->output || fd >= 0)) {
        int r = o->output  ? o->output(o->output_ctx, stream, m->u.data.data, m->u.data.len)
                : st->port ? tunnel_write(st, fd, m->u.data.data, m->u.data.len, err)
                           : al_write_all(fd, m->u.data.data, m->u.data.len);
        if (st->port && r < 0 && r != -EPIPE && err->code)
            return r; /* the tunnel was cancelled or its request failed: err says why */
        if (r == -EPIPE) {
            /* Like a local pipeline: the writer learns its reader is gone; a tunnel whose host
             * side is gone ends. */
            st->out_broken[stream] = true;
            r = send_signal(st, st->port ? SIGKILL : SIGPIPE, err);
            if (r < 0)
                return r;
        } else if (r < 0) {
            return al_err(err, r, "cannot write command output: %s", strerror(-r));
        }
    }
    /* The guest's side of a tunnel sent its last byte: the host's side learns it (FIN). */
    if (st->port && (m->flags & AL_FLAG_EOF))
        shutdown(fd, SHUT_WR);
    if (m->u.data.len == 0)
        return 0;
    return send_credit(st, stream, m->u.data.len, err);
}

static int on_cancel(struct exec_state *st, al_error *err)
{
    uint8_t sig = 0;
    ssize_t n = read(st->cancel_fd, &sig, 1);
    if (n != 1)
        return 0;
    if (sig == SIGINT || sig == SIGQUIT) {
        st->interrupted = true;
        return send_signal(st, sig, err);
    }
    /* What the run started goes with it (the agent kills its cgroup), unless the guest is not
     * reading: the caller is not kept waiting for that. */
    struct al_msg kill = {.type = AL_SIGNAL, .id = st->id};
    kill.u.signal.signo = SIGKILL;
    al_channel_send_nowait(&st->s->ch, &kill);
    return al_err(err, -ECANCELED, "cancelled by signal %u", sig);
}

int al_pty_resize(int fd, unsigned rows, unsigned cols)
{
    if (!rows || !cols)
        return -EINVAL;
    rows = al_pty_dim(rows);
    cols = al_pty_dim(cols);
    uint8_t b[4] = {(uint8_t)rows, (uint8_t)(rows >> 8), (uint8_t)cols, (uint8_t)(cols >> 8)};
    ssize_t n;
    do
        n = write(fd, b, sizeof(b));
    while (n < 0 && errno == EINTR);
    return n == (ssize_t)sizeof(b) ? 0 : n < 0 ? -errno : -EIO;
}

/* The terminal's newest size (older ones queued behind it are skipped) to the guest. A writer
 * gone ends the resizes, not the run. */
static int on_resize(struct exec_state *st, al_error *err)
{
    uint8_t b[64 * 4];
    ssize_t n = read(st->resize_fd, b, sizeof(b));
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return 0;
    if (n <= 0) {
        st->resize_fd = -1;
        return 0;
    }
    if (n < 4)
        return 0; /* not al_pty_resize's: dropped */
    const uint8_t *p = b + (n / 4 - 1) * 4;
    unsigned rows = p[0] | (unsigned)p[1] << 8, cols = p[2] | (unsigned)p[3] << 8;
    if (!rows || !cols || rows > AL_PTY_DIM_MAX || cols > AL_PTY_DIM_MAX)
        return 0;
    struct al_msg m = {.type = AL_RESIZE, .id = st->id};
    m.u.resize.rows = (uint16_t)rows;
    m.u.resize.cols = (uint16_t)cols;
    return al_channel_send(&st->s->ch, &m, err);
}

/* A second after a pty run's hangup: its tree is killed; a while after that, a run still not
 * ended means an agent that is not ours. */
static int on_hangup(struct exec_state *st, al_error *err)
{
    if (st->hup_killed)
        return al_err(err, -ETIMEDOUT,
                      "the guest did not end the run after its terminal closed; the guest agent "
                      "is not answering");
    st->hup_killed = true;
    st->hup_ms = al_now_ms() + HOST_KILL_WAIT_MS;
    return send_signal(st, SIGKILL, err);
}

/* A Ctrl-C that arrived while a write waited for the guest (channel.c kept it). */
static int forward_pending(struct exec_state *st, al_error *err)
{
    int sig = st->s->ch.pending_sig;
    st->s->ch.pending_sig = 0;
    if (sig)
        st->interrupted = true;
    return sig ? send_signal(st, sig, err) : 0;
}

/* The run's host deadline passed: SIGKILL first; if even that brings no exit, the agent is not
 * ours any more (stopped, or a guest speaking for it). */
static int on_host_deadline(struct exec_state *st, const al_exec_opts *o, uint64_t *deadline,
                            al_error *err)
{
    if (!st->killed) {
        st->killed = true;
        *deadline = al_now_ms() + HOST_KILL_WAIT_MS;
        return send_signal(st, SIGKILL, err);
    }
    return al_err(err, -ETIMEDOUT,
                  "the guest did not end the run in time (its timeout was %u s, and it was "
                  "told to kill it); the guest agent is not answering",
                  o->timeout_ms / 1000);
}

/* The image's env entries whose names env does not set (into v, at most AL_ENV_MAX). */
static size_t image_env(const al_session *s, const char *const *env, const char **v)
{
    size_t n = 0;
    for (char **e = s->img.env; e && *e && n < AL_ENV_MAX; e++) {
        size_t klen = strcspn(*e, "=") + 1;
        bool set = false;
        for (size_t i = 0; env && env[i] && !set; i++)
            set = !strncmp(env[i], *e, klen);
        if (!set)
            v[n++] = *e;
    }
    return n;
}

static int exec_run(al_session *s, const al_exec_opts *o, al_exec_result *out,
                    al_result_reader *results, uint32_t op, uint32_t id, al_error *err);
static int exec_loop(struct exec_state *st, const al_exec_opts *o, al_exec_result *out,
                     al_error *err);

/* Each exec is a request of its own on the channel: others run beside it (link.c). */
/* A run the agent kept while no host was connected, taken over (al_exec_opts.adopt): no EXEC,
 * the loop from its next frame; its input was closed by the agent. */
static int exec_adopted(al_session *s, const al_exec_opts *o, al_exec_result *out,
                        al_result_reader *results, uint32_t id, al_error *err)
{
    struct exec_state st = {.s = s,
                            .id = id,
                            .cancel_fd = al_link_cancel_fd(s, id),
                            .stdin_fd = -1,
                            .results = results,
                            .scan = !al_session_net(s),
                            .started = true,
                            .resize_fd = -1};
    /* The agent holds its output until credited (requests_adopt in guest-agent/agent_loop.c): a
     * whole window on each stream it may have, as a new run starts with. */
    static const uint8_t streams[] = {AL_STREAM_STDOUT, AL_STREAM_STDERR, AL_STREAM_RESULT};
    for (size_t i = 0; i < sizeof(streams); i++) {
        struct al_msg c = {.type = AL_CREDIT, .id = id};
        c.u.credit.stream = streams[i];
        c.u.credit.bytes = AL_WINDOW_DEFAULT;
        int r = al_channel_send(&s->ch, &c, err);
        if (r < 0)
            return r;
    }
    return exec_loop(&st, o, out, err);
}

/* A language the image does not run: the ones it does (its agent's word at the handshake),
 * and the nearest to what was asked, added to err's message. */
static void lang_near(const al_session *s, const char *lang, bool kernel, al_error *err)
{
    char words[sizeof(s->langs)], list[sizeof(s->langs)] = "";
    const char *names[AL_LANGS_MAX + 1];
    size_t n = 0;
    snprintf(words, sizeof(words), "%s", s->langs);
    char *save = NULL;
    for (char *w = strtok_r(words, " ", &save); w && n < AL_LANGS_MAX;
         w = strtok_r(NULL, " ", &save)) {
        bool k = !strncmp(w, "kernel:", 7);
        if (k != kernel)
            continue;
        names[n++] = k ? w + 7 : w;
        size_t used = strlen(list);
        snprintf(list + used, sizeof(list) - used, "%s%s", used ? ", " : "", names[n - 1]);
    }
    names[n] = NULL;
    if (!n)
        return;
    const char *near = al_nearest(lang, strlen(lang), names);
    size_t used = strlen(err->msg);
    snprintf(err->msg + used, sizeof(err->msg) - used, " (this image runs%s: %s%s%s%s)",
             kernel ? " as kernels" : "", list, near ? "; did you mean '" : "", near ? near : "",
             near ? "'?" : "");
}

static int exec_with(al_session *s, const al_exec_opts *o, al_exec_result *out, uint32_t op,
                     al_error *err)
{
    al_result_reader *results = NULL;
    uint32_t id = 0;
    /* Ready first: a reconnect ends the requests in flight, and this one is not yet. */
    int r = al_link_ready(s, err);
    if (r == 0 && o->kernel)
        r = al_result_reader_new(&results, err);
    if (r == 0 && o->adopt) {
        id = o->adopt;
        r = al_link_claim(s, id, o->cancel_fd, err);
        if (r == 0) {
            r = exec_adopted(s, o, out, results, id, err);
            al_link_end(s, id);
        }
    } else if (r == 0) {
        r = al_link_begin(s, o->cancel_fd, &id, err);
        if (r == 0) {
            if (o->request_id)
                *o->request_id = id;
            r = exec_run(s, o, out, results, op, id, err);
            al_link_end(s, id);
        }
    }
    al_result_reader_free(results);
    return al_link_check(s, r, err);
}

/* A descriptor field as the library uses it: -1 for none (0 or negative), fd 0 for
 * AL_FD_STDIN where that is allowed. */
static int fd_field(int fd, bool stdin_ok)
{
    if (fd == AL_FD_STDIN && stdin_ok)
        return 0;
    return fd > 0 ? fd : -1;
}

int al_exec_take(al_exec_opts *dst, const al_exec_opts *src, al_exec_result *out, al_error *err)
{
    /* Callers built before the queue callback (LIBAIRLOCK_1.4) pass the smaller struct. */
    int r = AL_SIZED_IN_SINCE(dst, src, "al_exec_opts", queued, err);
    if (r == 0)
        r = AL_SIZED_OUT(out, "al_exec_result", err);
    if (r < 0)
        return r;
    if (!dst->adopt && (!dst->argv || !dst->argv[0]))
        return al_err(err, -EINVAL, "al_exec_opts.argv names nothing to run");
    if (dst->adopt && dst->stdin_fd >= 0)
        return al_err(err, -EINVAL, "a run taken over has no input (al_exec_opts.stdin_fd)");
    dst->stdin_fd = fd_field(dst->stdin_fd, true);
    dst->stdout_fd = fd_field(dst->stdout_fd, false);
    dst->stderr_fd = fd_field(dst->stderr_fd, false);
    dst->cancel_fd = fd_field(dst->cancel_fd, false);
    dst->resize_fd = fd_field(dst->resize_fd, false);
    return 0;
}

int al_exec(al_session *s, const al_exec_opts *opts, al_exec_result *out, al_error *err)
{
    al_exec_opts o = AL_EXEC_OPTS_INIT;
    int r = al_exec_take(&o, opts, out, err);
    if (r < 0)
        return r;
    return al_exec_taken(s, &o, out, err);
}

int al_exec_taken(al_session *s, const al_exec_opts *o, al_exec_result *out, al_error *err)
{
    return exec_with(s, o, out, 0, err);
}

struct text_buf {
    char *buf;
    size_t len, cap;
};

static int to_buf(void *ctx, int stream, const uint8_t *data, size_t n)
{
    struct text_buf *t = ctx;
    if (stream != 1 || !t->cap)
        return 0;
    size_t take = t->cap - 1 - t->len < n ? t->cap - 1 - t->len : n;
    memcpy(t->buf + t->len, data, take);
    t->len += take;
    t->buf[t->len] = '\0';
    return 0;
}

/* A kernel operation (AL_EXEC_KERNEL_OP): stop or list, answered at once by the agent. */
static int kernel_op(al_session *s, const char *lang, const char *context, const char *op,
                     struct text_buf *t, al_error *err)
{
    const char *argv[] = {op, NULL};
    al_exec_opts o = {.struct_size = sizeof(al_exec_opts),
                      .argv = argv,
                      .lang = lang,
                      .kernel = true,
                      .context = context,
                      .stdin_fd = -1,
                      .stdout_fd = -1,
                      .stderr_fd = -1,
                      .output = to_buf,
                      .output_ctx = t};
    al_exec_result res = AL_EXEC_RESULT_INIT;
    int r = exec_with(s, &o, &res, AL_EXEC_KERNEL_OP, err);
    if (r == 0 && (res.how != AL_EXEC_EXITED || res.value != 0))
        return al_err(err, -EPROTO, "the guest answered a kernel %s with status %d", op, res.value);
    return r;
}

int al_kernel_stop(al_session *s, const char *lang, const char *context, al_error *err)
{
    struct text_buf t = {0};
    return kernel_op(s, lang, context, "stop", &t, err);
}

int al_kernel_list(al_session *s, char *buf, size_t len, al_error *err)
{
    struct text_buf t = {buf, 0, len};
    if (len)
        buf[0] = '\0';
    int r = kernel_op(s, "python", NULL, "list", &t, err);
    if (r < 0)
        return r;
    int lines = 0;
    for (size_t i = 0; i < t.len; i++)
        lines += buf[i] == '\n';
    return lines;
}

/* EXEC.lang for a kernel run: "LANG", or "LANG@CONTEXT" for a context other than the default. */
static int kernel_lang(const al_exec_opts *o, char *out, size_t cap, al_error *err)
{
    const char *c = o->context;
    if (!c || !strcmp(c, "default") || !o->kernel) {
        snprintf(out, cap, "%s", o->lang ? o->lang : "");
        return 0;
    }
    size_t n = strlen(c);
    if (n == 0 || n > AL_CONTEXT_MAX ||
        strspn(c, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                  "0123456789_-.") != n)
        return al_err(err, -EINVAL, "a context name is 1 to %d letters, digits, '_', '-' or '.'",
                      AL_CONTEXT_MAX);
    if (snprintf(out, cap, "%s@%s", o->lang, c) >= (int)cap)
        return al_err(err, -EINVAL, "language name too long");
    return 0;
}

static int exec_run(al_session *s, const al_exec_opts *o, al_exec_result *out,
                    al_result_reader *results, uint32_t op, uint32_t id, al_error *err)
{
    /* The image's defaults (its ENV, WORKDIR), less what the run sets itself. */
    const char *ienv[AL_ENV_MAX];
    size_t ienvc = image_env(s, o->env, ienv);
    size_t argc = count(o->argv), envc = ienvc + count(o->env);
    if (argc == 0 || argc > AL_ARGV_MAX)
        return al_err(err, -EINVAL, "a command needs 1 to %d arguments", AL_ARGV_MAX);
    if (envc > AL_ENV_MAX)
        return al_err(err, -EINVAL, "at most %d environment entries (the image sets %zu)",
                      AL_ENV_MAX, ienvc);
    if (o->kernel && !o->lang)
        return al_err(err, -EINVAL, "a kernel run needs a language");
    if (o->input_wait_ms > AL_INPUT_WAIT_MAX_MS)
        return al_err(err, -EINVAL, "the input wait is at most %d s", AL_INPUT_WAIT_MAX_MS / 1000);
    bool pty = o->pty_rows > 0;
    if (pty && (o->kernel || op))
        return al_err(err, -EINVAL, "a kernel run has no terminal");
    if (pty && !o->pty_cols)
        return al_err(err, -EINVAL, "a terminal needs rows and columns");
    bool term_set = false;
    for (size_t i = 0; pty && i < envc - ienvc; i++)
        term_set |= !strncmp(o->env[i], "TERM=", 5);
    if (pty && !term_set && envc + 1 > AL_ENV_MAX)
        return al_err(err, -EINVAL, "at most %d environment entries with TERM", AL_ENV_MAX - 1);

    char lang[AL_SHORT_STR_MAX + AL_CONTEXT_MAX + 2];
    int lr = kernel_lang(o, lang, sizeof(lang), err);
    if (lr < 0)
        return lr;
    /* A kernel runs one request at a time: the others sent to it wait their turn here, in
     * arrival order, instead of being refused by a busy kernel. */
    if (o->kernel && !op) {
        char what[AL_SHORT_STR_MAX + AL_CONTEXT_MAX + 40];
        snprintf(what, sizeof(what), "the %s kernel%s%s", o->lang,
                 strchr(lang, '@') ? " of context " : "",
                 strchr(lang, '@') ? strchr(lang, '@') + 1 : "");
        lr = al_link_queue(s, id, lang, AL_KERNEL_QUEUE_MAX, what, o->queued, o->output_ctx, err);
        if (lr < 0)
            return lr;
    }
    struct exec_state st = {.s = s,
                            .id = id,
                            .cancel_fd = al_link_cancel_fd(s, id),
                            .stdin_fd = -1,
                            .results = results,
                            .scan = !al_session_net(s),
                            .pty = pty,
                            .resize_fd = pty && o->resize_fd > 0 ? o->resize_fd : -1};
    struct al_msg m = {.type = AL_EXEC, .id = st.id};
    m.u.exec.flags = (o->stdin_fd >= 0 ? AL_EXEC_STDIN : 0) | (o->kernel ? AL_EXEC_KERNEL : 0) |
                     op | (pty ? AL_EXEC_PTY : 0);
    if (pty) {
        m.u.exec.rows = (uint16_t)al_pty_dim(o->pty_rows);
        m.u.exec.cols = (uint16_t)al_pty_dim(o->pty_cols);
    }
    m.u.exec.timeout_ms = o->timeout_ms;
    m.u.exec.input_wait_ms = o->input_wait_ms;
    m.u.exec.output_cap = o->output_cap;
    m.u.exec.lang = al_str_cstr(lang);
    m.u.exec.cwd = al_str_cstr(o->cwd                              ? o->cwd
                               : s->img.workdir && *s->img.workdir ? s->img.workdir
                                                                   : "");
    /* The image's USER: a command runs through the agent's --run-as (kernels and code runs
     * stay root's, as the agent runs them). */
    const char *user = s->img.user;
    size_t wrap = 0;
    if (!o->lang && user && *user && strcmp(user, "root") && strcmp(user, "0") &&
        strncmp(user, "0:", 2) && strncmp(user, "root:", 5) && s->kind == AL_TRANSPORT_VIRTIO) {
        if (argc + 4 > AL_ARGV_MAX)
            return al_err(err, -EINVAL, "a command needs 1 to %d arguments", AL_ARGV_MAX - 4);
        static const char agent[] = AL_GUEST_AGENT_PATH;
        const char *pre[] = {agent, "--run-as", user, "--"};
        for (; wrap < 4; wrap++)
            m.u.exec.argv[wrap] = al_str_cstr(pre[wrap]);
    }
    m.u.exec.argc = (uint32_t)(argc + wrap);
    for (size_t i = 0; i < argc; i++)
        m.u.exec.argv[wrap + i] = al_str_cstr(o->argv[i]);
    m.u.exec.envc = (uint32_t)envc;
    for (size_t i = 0; i < envc; i++)
        m.u.exec.env[i] = al_str_cstr(i < ienvc ? ienv[i] : o->env[i - ienvc]);
    if (pty && !term_set)
        m.u.exec.env[m.u.exec.envc++] = al_str_cstr(PTY_TERM_DEFAULT);
    int r = al_channel_send(&s->ch, &m, err);
    if (r == -EMSGSIZE)
        return al_err(err, -E2BIG, "command and arguments exceed %d bytes", AL_FRAME_PAYLOAD_MAX);
    if (r < 0)
        return r;
    if (o->stdin_fd >= 0) {
        st.stdin_fd = o->stdin_fd;
        st.stdin_credit = s->agent_window;
    }
    return exec_loop(&st, o, out, err);
}

/* A request sent: its frames until its exit. */
static int exec_loop(struct exec_state *st, const al_exec_opts *o, al_exec_result *out,
                     al_error *err)
{
    al_session *s = st->s;
    al_result_reader *results = st->results;
    struct al_msg m;
    int r;
    uint64_t sent_ms = al_now_ms(), deadline = 0;
    unsigned grace = o->kernel ? HOST_GRACE_KERNEL_MS : HOST_GRACE_MS;
    for (;;) {
        if (s->ch.pending_sig && (r = forward_pending(st, err)) < 0)
            return r;
        if (o->timeout_ms && !st->killed)
            deadline = sent_ms + o->timeout_ms + grace;
        uint64_t wake = deadline;
        if (st->hup_ms && (!wake || st->hup_ms < wake))
            wake = st->hup_ms;
        int extra = st->started && st->stdin_fd >= 0 && st->stdin_credit > 0 ? st->stdin_fd : -1;
        int resize = st->started ? st->resize_fd : -1;
        r = al_link_recv_until(s, st->id, &m, extra, resize, wake, err);
        if (r == -ETIMEDOUT && err->code == 0 && st->hup_ms && al_now_ms() >= st->hup_ms) {
            r = on_hangup(st, err);
            if (r < 0)
                return r;
            continue;
        }
        if (r == -ETIMEDOUT && err->code == 0) {
            r = on_host_deadline(st, o, &deadline, err);
            if (r < 0)
                return r;
            continue;
        }
        if (r < 0)
            return r;
        if (r == 0) {
            /* Woken by the cancel pipe or stdin: find out which without blocking. */
            struct pollfd pfd[3] = {
                {st->cancel_fd, POLLIN, 0}, {extra, POLLIN, 0}, {resize, POLLIN, 0}};
            if (poll(pfd, 3, 0) < 0 && errno != EINTR)
                return al_err(err, -errno, "poll failed: %s", strerror(errno));
            if (pfd[2].revents) {
                r = on_resize(st, err);
                if (r < 0)
                    return r;
            }
            if (pfd[0].revents) {
                r = on_cancel(st, err);
                if (r < 0)
                    return r;
            }
            if (pfd[1].revents) {
                r = pump_stdin(st, err);
                if (r < 0)
                    return r;
            }
            continue;
        }
        switch (m.type) {
        case AL_STARTED:
            if (!st->started) {
                sent_ms = al_now_ms(); /* the timeout runs from here, a kernel's start aside */
                if (o->started)
                    o->started(o->output_ctx, m.u.started.pid);
            }
            st->started = true;
            break;
        case AL_DATA:
            r = on_data(st, o, &m, err);
            if (r < 0)
                return r;
            break;
        case AL_CREDIT:
            if (m.u.credit.stream != AL_STREAM_STDIN ||
                st->stdin_credit + m.u.credit.bytes > s->agent_window)
                return al_err(err, -EPROTO, "guest sent a credit it does not owe");
            st->stdin_credit += m.u.credit.bytes;
            break;
        case AL_ERROR: {
            char port[32];
            snprintf(port, sizeof(port), "port %u", st->port);
            const char *what = st->port  ? port
                               : o->lang ? "cannot run code"
                               : o->argv ? o->argv[0]
                                         : "the run";
            int gr = al_channel_guest_error(&m, what, err);
            if (gr == -ENOTSUP && o->lang)
                lang_near(s, o->lang, o->kernel, err);
            return gr;
        }
        case AL_WAITING:
            /* The guest never reports a wait that was not asked for. */
            if (!o->input_wait_ms)
                return al_err(err, -EPROTO, "guest sent an unexpected waiting frame");
            if (!st->waited_input && o->interrupt_on_wait) {
                struct al_msg sig = {.type = AL_SIGNAL, .id = st->id};
                sig.u.signal.signo = SIGINT;
                r = al_channel_send(&s->ch, &sig, err);
                if (r < 0)
                    return r;
            }
            st->waited_input = true;
            break;
        case AL_EXIT: {
            al_exec_result res = {
                .struct_size = sizeof res,
                .how = m.u.exit.how == AL_EXIT_SIGNAL ? AL_EXEC_SIGNALED : AL_EXEC_EXITED,
                .value = m.u.exit.value,
                .duration_us = m.u.exit.duration_us,
                .timed_out = (m.u.exit.flags & AL_EXIT_TIMED_OUT) || st->killed,
                /* Counted here: output that reached the cap was cut (the agent drops the
                 * rest); the guest's own flags are not believed. */
                .truncated_stdout = o->output_cap && st->got[AL_STREAM_STDOUT] >= o->output_cap,
                .truncated_stderr = o->output_cap && st->got[AL_STREAM_STDERR] >= o->output_cap,
                .waited_input = st->waited_input,
                .interrupted = st->interrupted,
                .offline = st->offline,
            };
            if (results)
                al_result_reader_stats(results, &res.results);
            *out = res;
            return 0;
        }
        default:
            return al_err(err, -EPROTO, "guest sent an unexpected %s frame during an exec",
                          al_type_name(m.type));
        }
    }
}

/* The tail of a quiet run's stderr, for its error message (guest text: bounded, made
 * printable before use). */
struct quiet_tail {
    char buf[160];
    size_t len;
};

static int quiet_output(void *ctx, int stream, const uint8_t *data, size_t len)
{
    struct quiet_tail *t = ctx;
    const size_t cap = sizeof(t->buf) - 1;
    if (stream != 2)
        return 0;
    if (len >= cap) {
        data += len - cap;
        len = cap;
        t->len = 0;
    } else if (t->len + len > cap) { /* keep the newest bytes before these */
        memmove(t->buf, t->buf + t->len + len - cap, cap - len);
        t->len = cap - len;
    }
    memcpy(t->buf + t->len, data, len);
    t->len += len;
    t->buf[t->len] = '\0';
    return 0;
}

int al_exec_quiet(al_session *s, al_exec_opts o, const char *what, al_error *err)
{
    struct quiet_tail tail = {0};
    o.stdin_fd = o.stdout_fd = o.stderr_fd = -1;
    o.output = quiet_output;
    o.output_ctx = &tail;
    al_exec_result res = AL_EXEC_RESULT_INIT;
    int r = al_exec(s, &o, &res, err);
    if (r < 0)
        return r;
    if (res.how != AL_EXEC_EXITED || res.value != 0) {
        /* Its last line of stderr, if any, says why. */
        while (tail.len && (tail.buf[tail.len - 1] == '\n' || tail.buf[tail.len - 1] == '\r'))
            tail.buf[--tail.len] = '\0';
        char *last = strrchr(tail.buf, '\n');
        last = last ? last + 1 : tail.buf;
        al_printable(last);
        return al_err(err, -EIO, "%s: ended with status %d%s%s%s", what, res.value,
                      res.timed_out ? " (timed out)" : "", *last ? ": " : "", last);
    }
    return 0;
}

/* ---- tunnels: a connection to a port in the guest (CONNECT), relayed as a run's streams ---- */

static int port_run(al_session *s, unsigned port, int fd, uint32_t id, al_port_counts *counts,
                    al_error *err)
{
    al_exec_opts o = {
        .struct_size = sizeof(al_exec_opts), .stdin_fd = fd, .stdout_fd = fd, .stderr_fd = -1};
    struct exec_state st = {.s = s,
                            .id = id,
                            .cancel_fd = al_link_cancel_fd(s, id),
                            .stdin_fd = fd,
                            .stdin_credit = s->agent_window,
                            .resize_fd = -1,
                            .port = port};
    struct al_msg m = {.type = AL_CONNECT, .id = id};
    m.u.connect.port = (uint16_t)port;
    int r = al_channel_send(&s->ch, &m, err);
    al_exec_result res = AL_EXEC_RESULT_INIT;
    if (r == 0)
        r = exec_loop(&st, &o, &res, err);
    if (r == 0 && counts)
        *counts = (al_port_counts){.struct_size = sizeof(*counts),
                                   .to_guest = st.sent,
                                   .from_guest = st.got[AL_STREAM_STDOUT]};
    return r;
}

int al_port_args(unsigned port, al_port_counts *counts, al_error *err)
{
    if (port < 1 || port > 65535)
        return al_err(err, -EINVAL, "a port is 1 to 65535, not %u", port);
    return counts ? AL_SIZED_OUT(counts, "al_port_counts", err) : 0;
}

int al_port_relay(al_session *s, unsigned port, int fd, int cancel_fd, al_port_counts *counts,
                  al_error *err)
{
    int r0 = al_port_args(port, counts, err);
    if (r0 < 0)
        return r0;
    uint32_t id = 0;
    int r = al_link_ready(s, err);
    if (r == 0 && !(s->caps & AL_CAP_CONNECT))
        r = al_err(err, -EOPNOTSUPP,
                   "the guest's agent forwards no ports (an image older "
                   "than protocol %d: build it again)",
                   AL_PROTO_VERSION);
    if (r == 0)
        r = al_link_begin(s, cancel_fd, &id, err);
    if (r == 0) {
        r = port_run(s, port, fd, id, counts, err);
        al_link_end(s, id);
    }
    return al_link_check(s, r, err);
}

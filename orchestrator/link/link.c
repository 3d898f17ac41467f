/* The link to the agent, whatever carries it: connecting through the session's transport, the
 * handshake (at boot, after a dropped connection, after a checkpoint restore), request ids and
 * the frames that belong to no request. */
#include "link.h"

#include "transport.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* The handshake after a reconnect. */
#define RECONNECT_HANDSHAKE_MS 8000
/* How long a reconnect waits for the requests on the lost connection to end. */
#define RECONNECT_WAIT_MS 5000
/* One HELLO's wait for its answer after a restore; then another HELLO with a fresh nonce, in
 * case the first reached an agent whose input was mid-frame. The restored guest runs its first
 * instructions slowly under emulation (its translated code is gone): about 0.3 s. */
#define RESYNC_ATTEMPT_MS 3000

/* Sets up s->ch on conn (the agent's socket, or the SSH pump's end) for this session: its
 * cancel pipe wakes a waiting write, its disk budget watcher (budget.c) fails a waiting read. */
static int link_attach(al_session *s, const struct al_transport_conn *conn, al_error *err)
{
    int r = al_channel_init(&s->ch, conn->fd, s->stall_ms, s->cancel_fd, err);
    if (r < 0)
        return r;
    s->ch.alarm_fd = s->budget_alarm[0];
    s->ch.alarm_msg = s->budget_why;
    s->ch.eof_msg = conn->eof_msg;
    s->have_ch = true;
    return 0;
}

void al_link_detach(al_session *s)
{
    if (s->tport)
        s->tport->ops->disconnect(s->tport);
    if (s->have_ch) {
        al_channel_destroy(&s->ch);
        s->have_ch = false;
    }
}

/* Takes conn onto the session's channel; the connection is dropped when that fails. */
static int link_take(al_session *s, struct al_transport_conn *conn, al_error *err)
{
    int r = link_attach(s, conn, err);
    if (r < 0) {
        al_closep(&conn->fd);
        s->tport->ops->disconnect(s->tport);
    }
    return r;
}

int al_link_connect(al_session *s, uint64_t deadline, al_error *err)
{
    al_link_detach(s);
    struct al_transport_conn conn = {.fd = -1};
    int r = s->tport->ops->connect(s->tport, s->dom, deadline, &conn, err);
    return r < 0 ? r : link_take(s, &conn, err);
}

int al_link_send_hello(al_session *s, uint64_t *nonce, al_error *err)
{
    uint64_t n = 0;
    if (getrandom(&n, sizeof(n), 0) != sizeof(n))
        n = al_now_us();
    struct al_msg m = {.type = AL_HELLO};
    m.u.hello.version = AL_PROTO_VERSION;
    m.u.hello.nonce = n;
    m.u.hello.window = AL_WINDOW_DEFAULT;
    m.u.hello.flags = s->hello_flags;
    int r = al_channel_send(&s->ch, &m, err);
    if (r < 0)
        return r;
    *nonce = n;
    return 0;
}

static int adopt(al_session *s, const uint32_t *ids, uint32_t n, al_error *err);

/* Checks the agent's HELLO_ACK against the HELLO that carried nonce and takes in what it
 * announces; also after a checkpoint restore. */
static int hello_ack(al_session *s, const struct al_msg *m, uint64_t nonce, al_error *err)
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
    return adopt(s, a->adopted, a->nadopted, err);
}

int al_link_hello_wait(al_session *s, uint64_t nonce, uint64_t deadline, al_error *err)
{
    struct al_msg m;
    int r = al_channel_recv(&s->ch, &m, deadline, s->cancel_fd, -1, -1, -1, err);
    if (r < 0)
        return r;
    if (r == 0)
        return al_err(err, -ECANCELED, "cancelled while the VM was booting");
    if (m.type == AL_ERROR && m.id == 0)
        return al_channel_guest_error(&m, "the guest agent refused the handshake", err);
    if (m.type != AL_HELLO_ACK)
        return al_err(err, -EPROTO, "guest sent a %s frame before its handshake",
                      al_type_name(m.type));
    return hello_ack(s, &m, nonce, err);
}

static int boot_timed_out(al_session *s, al_error *err)
{
    char last[160];
    al_console_tail(s->console, last, sizeof(last));
    return al_err(err, -ETIMEDOUT,
                  "the guest agent did not answer within %u s under %s (console's last line: "
                  "%s); %s",
                  s->boot_timeout_ms / 1000, s->kvm ? "KVM" : "software emulation", last,
                  s->kvm ? "try AIRLOCK_ACCEL=tcg" : "a slow host may need --boot-timeout");
}

int al_link_handshake(al_session *s, uint64_t deadline, al_error *err)
{
    uint64_t nonce = 0;
    int r = al_link_send_hello(s, &nonce, err);
    if (r < 0)
        return r;
    r = al_link_hello_wait(s, nonce, deadline, err);
    if (r == -ETIMEDOUT && err->code == 0)
        return boot_timed_out(s, err);
    return r;
}

/* Reconnects after the transport lost its connection, with growing waits, and handshakes
 * again. */
static int link_reconnect(al_session *s, al_error *err)
{
    const struct al_transport_ops *ops = s->tport->ops;
    al_error last = {0};
    for (size_t i = 0; i < ops->reconnect_tries; i++) {
        struct pollfd p = {s->cancel_fd, POLLIN, 0};
        if (poll(&p, 1, (int)ops->reconnect_wait_ms[i]) > 0)
            return al_err(err, -ECANCELED, "cancelled while reconnecting to the guest");
        if (s->vm_gone && s->vm_gone(s))
            return al_err(err, -ECONNRESET, "the VM is gone");
        last = (al_error){0};
        al_link_detach(s);
        struct al_transport_conn conn = {.fd = -1};
        int r = ops->reconnect(s->tport, (unsigned)i, &conn, &last);
        if (r == 0)
            r = link_take(s, &conn, &last);
        if (r == 0)
            r = al_link_handshake(s, al_now_ms() + RECONNECT_HANDSHAKE_MS, &last);
        if (r == 0)
            return 0;
        /* A wrong host key or a refused login will not get better by asking again. */
        if (r == -EKEYREJECTED || r == -EACCES)
            break;
    }
    return al_err(err, last.code ? last.code : -ECONNRESET,
                  "the %s connection to the guest was lost and reconnecting failed: %s", ops->label,
                  last.msg);
}

int al_budget_refuse(const al_session *s, al_error *err)
{
    /* The flag the budget watcher (vm/budget.c) sets once it paused the VM: requests stop here,
     * below the session and without libvirt. */
    if (!__atomic_load_n(&s->budget_over, __ATOMIC_ACQUIRE))
        return 0;
    return al_err(err, -ENOSPC, "%s", s->budget_why);
}

int al_link_ready(al_session *s, al_error *err)
{
    int r = al_budget_refuse(s, err);
    if (r < 0)
        return r;
    if (s->poisoned)
        return al_err(err, -EPROTO,
                      "the guest broke the protocol earlier (%s); the session takes no more "
                      "requests",
                      s->poison_why);
    const struct al_transport_ops *ops = s->tport->ops;
    if (!ops->lost || !ops->lost(s->tport))
        return 0;
    /* The requests on the lost connection end; the new one is made with the channel alone
     * (it replaces the channel they would read). */
    al_link_fail_all(s, -ECONNRESET, "the connection to the guest was lost");
    r = al_link_exclusive(s, RECONNECT_WAIT_MS, err);
    if (r < 0)
        return r;
    r = ops->lost(s->tport) ? link_reconnect(s, err) : 0; /* another request may have done it */
    al_link_exclusive_end(s);
    return r;
}

/* Runs the handshake again with whatever agent the VM now holds: drops stale bytes, sends
 * HELLOs with fresh nonces and ignores everything but the HELLO_ACK echoing the last one. */
static int resync(al_session *s, unsigned total_ms, al_error *err)
{
    uint64_t end = al_now_ms() + total_ms;
    al_channel_discard(&s->ch);
    while (al_now_ms() < end) {
        uint64_t nonce = 0;
        struct al_msg m;
        int r = al_link_send_hello(s, &nonce, err);
        if (r < 0)
            return r;
        uint64_t attempt_end = al_now_ms() + RESYNC_ATTEMPT_MS;
        if (attempt_end > end)
            attempt_end = end;
        for (;;) {
            al_error ignored = {0};
            r = al_channel_recv(&s->ch, &m, attempt_end, -1, -1, -1, -1, &ignored);
            if (r == 1 && m.type == AL_HELLO_ACK && m.u.hello_ack.nonce == nonce)
                return hello_ack(s, &m, nonce, err);
            if (r == 1)
                continue; /* the past's frames, or the agent's complaint about them */
            if (r == -ETIMEDOUT && ignored.code == 0)
                break;
            if (r == -ECONNRESET)
                return al_err(err, r, "the guest channel closed after the restore");
            /* Garbage or a stalled half frame: drop it and ask again. */
            al_channel_discard(&s->ch);
            break;
        }
    }
    return al_err(err, -ETIMEDOUT, "the guest agent did not answer after the restore");
}

int al_link_resync(al_session *s, unsigned total_ms, al_error *err)
{
    /* A connection into the guest belongs to the guest's abandoned future (or to a QEMU that
     * is gone): always a new one, to the restored guest. */
    if (s->tport->ops->guest_side) {
        int r = al_link_connect(s, al_now_ms() + total_ms, err);
        return r < 0 ? r : resync(s, total_ms, err);
    }
    /* QEMU's socket: connected again only when our end of it is gone while QEMU runs
     * (someone else, libvirt's own snapshot revert for one, started a new QEMU). */
    al_error first = {0};
    int r = s->have_ch ? resync(s, total_ms, &first) : -ENOTCONN;
    if (r != -ECONNRESET && r != -EPIPE && r != -ENOTCONN) {
        if (r < 0)
            return al_err(err, r, "%s", first.msg);
        return r;
    }
    r = al_link_connect(s, al_now_ms() + total_ms, err);
    return r < 0 ? r : resync(s, total_ms, err);
}

int al_link_check(al_session *s, int r, const al_error *err)
{
    if ((r == -EPROTO || r == -EMSGSIZE) && !s->poisoned) {
        s->poisoned = true;
        snprintf(s->poison_why, sizeof(s->poison_why), "%.200s", err->msg);
        /* whatever else runs on this agent's word ends too */
        al_link_fail_all(s, -EPROTO, err->msg);
    }
    return r;
}

int al_link_next_id(al_session *s)
{
    return (int)(s->next_id++ & 0x7fffffff);
}

int al_link_stray_frame(al_session *s, const struct al_msg *m, const char *when, al_error *err)
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

int al_link_recv(al_session *s, uint32_t id, struct al_msg *m, int extra_fd, al_error *err)
{
    return al_link_recv_until(s, id, m, extra_fd, -1, 0, err);
}

/* ---- many requests at once on one channel ----
 *
 * Each request in flight has an entry here. No thread of its own reads the channel: whichever
 * request waits first while nobody reads becomes the reader (the others wait on their wake
 * pipes); it hands each frame it reads to the request it belongs to, as a copy in that
 * request's bounded queue, until one of its own comes, its deadline passes, or its cancel pipe
 * or stdin wakes it; then it leaves the reading to another waiter. So a request waits only for
 * its own frames, and one whose caller is slow to take them (a client that stops reading its
 * output) holds nothing but its queue: the agent sends it no more than its credit. */

/* A request's queue: the credit the host gives the agent on each of its streams (stdout,
 * stderr, results, a file: AL_WINDOW_DEFAULT each, link_send_hello) and a few small frames; an
 * agent that sends more is not honouring credit. */
#define QUEUE_MAX (4ull * AL_WINDOW_DEFAULT + 256 * 1024)

struct qframe {
    struct qframe *next;
    size_t len;
    uint8_t buf[]; /* the frame, encoded again */
};

struct al_link_req {
    struct al_link_req *next;
    uint32_t id;
    int wake[2];   /* a byte: a frame is queued, the reading is free, or the request failed */
    int cancel_fd; /* its signal pipe: its own, or the session's */
    struct qframe *head, *tail;
    size_t queued; /* bytes in the queue */
    int fail;      /* negative: it failed while another request read (fail_msg) */
    char fail_msg[sizeof(((al_error *)0)->msg)];
    struct qframe *cur; /* the frame handed out last, kept until the next receive */
    struct qframe *own; /* where its own frames are copied as they are read (one buffer for the
                           request's life, not one allocation per frame), or NULL */
    bool waiting;       /* its thread waits for the reading or a frame */
    bool unclaimed;     /* handed over by the agent (adopt), not yet taken by al_link_claim */
    char queue[80];     /* al_link_queue: the key it runs in turn under; "" for none */
    uint64_t ticket;    /* its place in that key's line */
};

struct al_link_mux {
    pthread_mutex_t mu;
    uint64_t tickets;    /* al_link_queue's, in arrival order */
    pthread_cond_t idle; /* exclusive use ended, or the last request ended */
    struct al_link_req *reqs;
    unsigned n;       /* requests in flight */
    bool reading;     /* a request's thread is reading the channel */
    bool exclusive;   /* a checkpoint, a restore or a reconnect has the channel alone */
    uint8_t *scratch; /* the reader's, to copy frames */
};

struct al_link_mux *al_link_mux_new(void)
{
    struct al_link_mux *x = calloc(1, sizeof(*x));
    if (!x)
        return NULL;
    x->scratch = malloc(AL_FRAME_HEADER_SIZE + AL_FRAME_PAYLOAD_MAX);
    if (!x->scratch) {
        free(x);
        return NULL;
    }
    pthread_mutex_init(&x->mu, NULL);
    pthread_cond_init(&x->idle, NULL);
    return x;
}

void al_link_mux_free(struct al_link_mux *x)
{
    if (!x)
        return;
    pthread_mutex_destroy(&x->mu);
    pthread_cond_destroy(&x->idle);
    free(x->scratch);
    free(x);
}

static struct al_link_req *req_find(struct al_link_mux *x, uint32_t id)
{
    for (struct al_link_req *q = x->reqs; q; q = q->next)
        if (q->id == id)
            return q;
    return NULL;
}

static void req_kick(struct al_link_req *q)
{
    uint8_t b = 1;
    if (write(q->wake[1], &b, 1) < 0) {
        /* full: it is woken already */
    }
}

static void req_drain(struct al_link_req *q)
{
    uint8_t buf[64];
    while (read(q->wake[0], buf, sizeof(buf)) > 0)
        ;
}

/* The reading is free: one waiter that has nothing queued takes it. Called with mu held. */
static void pass_reading(struct al_link_mux *x, const struct al_link_req *self)
{
    for (struct al_link_req *q = x->reqs; q; q = q->next)
        if (q != self && q->waiting && !q->head && !q->fail) {
            req_kick(q);
            return;
        }
}

static void req_fail(struct al_link_req *q, int code, const char *msg)
{
    if (q->fail)
        return;
    q->fail = code;
    snprintf(q->fail_msg, sizeof(q->fail_msg), "%s", msg);
    req_kick(q);
}

/* Fails every request in flight but self (the channel broke, the guest broke the protocol, the
 * session is being restored). */
static void fail_others(struct al_link_mux *x, const struct al_link_req *self, int code,
                        const char *msg)
{
    for (struct al_link_req *q = x->reqs; q; q = q->next)
        if (q != self)
            req_fail(q, code, msg);
}

int al_link_begin(al_session *s, int cancel_fd, uint32_t *id, al_error *err)
{
    struct al_link_mux *x = s->mux;
    struct al_link_req *q = calloc(1, sizeof(*q));
    if (!q)
        return al_err(err, -ENOMEM, "out of memory");
    if (pipe2(q->wake, O_CLOEXEC | O_NONBLOCK) < 0) {
        free(q);
        return al_err(err, -errno, "pipe: %s", strerror(errno));
    }
    q->cancel_fd = cancel_fd > 0 ? cancel_fd : s->cancel_fd;
    pthread_mutex_lock(&x->mu);
    while (x->exclusive)
        pthread_cond_wait(&x->idle, &x->mu);
    if (x->n >= AL_LINK_REQUESTS_MAX) {
        pthread_mutex_unlock(&x->mu);
        close(q->wake[0]);
        close(q->wake[1]);
        free(q);
        return al_err(err, -EBUSY, "%d requests of this session are running already",
                      AL_LINK_REQUESTS_MAX);
    }
    q->id = (uint32_t)al_link_next_id(s);
    q->next = x->reqs;
    x->reqs = q;
    x->n++;
    pthread_mutex_unlock(&x->mu);
    *id = q->id;
    return 0;
}

static void qframes_free(struct qframe *f)
{
    while (f) {
        struct qframe *n = f->next;
        free(f);
        f = n;
    }
}

/* f becomes q's current frame; the one before goes, unless it is q's own buffer. */
static void make_current(struct al_link_req *q, struct qframe *f)
{
    if (q->cur != q->own)
        free(q->cur);
    q->cur = f;
}

void al_link_end(al_session *s, uint32_t id)
{
    struct al_link_mux *x = s->mux;
    pthread_mutex_lock(&x->mu);
    struct al_link_req **pp = &x->reqs;
    while (*pp && (*pp)->id != id)
        pp = &(*pp)->next;
    struct al_link_req *q = *pp;
    if (q) {
        *pp = q->next;
        x->n--;
        if (x->n == 0)
            pthread_cond_broadcast(&x->idle);
        /* Its line moves: the ones waiting in it look again. */
        for (struct al_link_req *o = q->queue[0] ? x->reqs : NULL; o; o = o->next)
            if (!strcmp(o->queue, q->queue))
                (void)!write(o->wake[1], "q", 1);
    }
    pthread_mutex_unlock(&x->mu);
    if (!q)
        return;
    qframes_free(q->head);
    make_current(q, NULL);
    free(q->own);
    close(q->wake[0]);
    close(q->wake[1]);
    free(q);
}

/* Under x->mu: requests of q's line before it, and in the line at all. */
static unsigned line_ahead(struct al_link_mux *x, const struct al_link_req *q, unsigned *all)
{
    unsigned ahead = 0;
    *all = 0;
    for (struct al_link_req *o = x->reqs; o; o = o->next)
        if (o->queue[0] && !strcmp(o->queue, q->queue)) {
            (*all)++;
            ahead += o->ticket < q->ticket;
        }
    return ahead;
}

int al_link_queue(al_session *s, uint32_t id, const char *key, unsigned max, const char *what,
                  void (*on_wait)(void *ctx, unsigned ahead), void *ctx, al_error *err)
{
    struct al_link_mux *x = s->mux;
    pthread_mutex_lock(&x->mu);
    struct al_link_req *q = req_find(x, id);
    if (!q) {
        pthread_mutex_unlock(&x->mu);
        return al_err(err, -ENOENT, "no request %u", id);
    }
    snprintf(q->queue, sizeof(q->queue), "%s", key);
    q->ticket = ++x->tickets;
    unsigned all, ahead = line_ahead(x, q, &all);
    if (all > max) {
        q->queue[0] = '\0';
        pthread_mutex_unlock(&x->mu);
        return al_err(err, -EBUSY, "%u runs wait for %s already (at most %u): try again later",
                      all - 1, what, max);
    }
    pthread_mutex_unlock(&x->mu);
    /* Its place taken: said at once, and again each time it moves. */
    if (on_wait)
        on_wait(ctx, ahead);
    unsigned told = ahead;
    bool waited = false;
    for (;;) {
        pthread_mutex_lock(&x->mu);
        ahead = line_ahead(x, q, &all);
        int fail = q->fail;
        char msg[sizeof(q->fail_msg)];
        snprintf(msg, sizeof(msg), "%s", q->fail_msg);
        pthread_mutex_unlock(&x->mu);
        if (fail)
            return al_err(err, fail, "%s", msg);
        if (!ahead)
            break;
        if (ahead != told && on_wait)
            on_wait(ctx, ahead);
        told = ahead;
        waited = true;
        struct pollfd p[2] = {{q->wake[0], POLLIN, 0}, {q->cancel_fd, POLLIN, 0}};
        int n = poll(p, q->cancel_fd >= 0 ? 2 : 1, -1);
        if (n < 0 && errno != EINTR)
            return al_err(err, -errno, "poll: %s", strerror(errno));
        char buf[64];
        if (n > 0 && p[0].revents)
            (void)!read(q->wake[0], buf, sizeof(buf));
        if (p[1].revents) {
            /* Its cancel before it ran: it never runs (the signal is taken, not forwarded). */
            (void)!read(q->cancel_fd, buf, 1);
            return al_err(err, -ECANCELED, "cancelled while it waited for %s (%u ahead)", what,
                          ahead);
        }
    }
    char buf[64];
    while (read(q->wake[0], buf, sizeof(buf)) > 0) {
    }
    if (waited && on_wait)
        on_wait(ctx, 0); /* its turn */
    return 0;
}

int al_link_exclusive(al_session *s, unsigned wait_ms, al_error *err)
{
    struct al_link_mux *x = s->mux;
    pthread_mutex_lock(&x->mu);
    uint64_t end = al_now_ms() + wait_ms;
    while (x->exclusive || x->n) {
        uint64_t now = al_now_ms();
        if (now >= end) {
            unsigned n = x->n;
            pthread_mutex_unlock(&x->mu);
            return al_err(err, -EBUSY,
                          "%u request%s of this session %s running (background processes); "
                          "this needs the session idle",
                          n, n == 1 ? "" : "s", n == 1 ? "is" : "are");
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + (end - now) * 1000000ull;
        ts.tv_sec += (time_t)(ns / 1000000000ull);
        ts.tv_nsec = (long)(ns % 1000000000ull);
        pthread_cond_timedwait(&x->idle, &x->mu, &ts);
    }
    x->exclusive = true;
    pthread_mutex_unlock(&x->mu);
    return 0;
}

void al_link_exclusive_end(al_session *s)
{
    struct al_link_mux *x = s->mux;
    pthread_mutex_lock(&x->mu);
    x->exclusive = false;
    pthread_cond_broadcast(&x->idle);
    pthread_mutex_unlock(&x->mu);
}

/* The runs a HELLO_ACK hands over (AL_HELLO_ADOPT): each gets its entry now, so that its frames
 * queue (within the credit the agent was given afresh) until al_link_claim; ids come from the
 * guest: only when asked for, each once, new, within the request limit. */
static int adopt(al_session *s, const uint32_t *ids, uint32_t n, al_error *err)
{
    s->nadopted = 0;
    if (n && !(s->hello_flags & AL_HELLO_ADOPT))
        return al_err(err, -EPROTO, "guest handed over runs nobody asked for");
    struct al_link_mux *x = s->mux;
    for (uint32_t i = 0; i < n; i++) {
        if (ids[i] == 0 || ids[i] > 0x7fffffffu)
            return al_err(err, -EPROTO, "guest handed over a run with id %u", ids[i]);
        for (uint32_t j = 0; j < i; j++)
            if (ids[j] == ids[i])
                return al_err(err, -EPROTO, "guest handed over run %u twice", ids[i]);
    }
    pthread_mutex_lock(&x->mu);
    for (uint32_t i = 0; i < n; i++)
        if (req_find(x, ids[i])) {
            pthread_mutex_unlock(&x->mu);
            return al_err(err, -EPROTO, "guest handed over run %u, which runs here", ids[i]);
        }
    if (x->n + n > AL_LINK_REQUESTS_MAX) {
        pthread_mutex_unlock(&x->mu);
        return al_err(err, -EPROTO, "guest handed over more runs than a session holds");
    }
    for (uint32_t i = 0; i < n; i++) {
        struct al_link_req *q = calloc(1, sizeof(*q));
        if (!q || pipe2(q->wake, O_CLOEXEC | O_NONBLOCK) < 0) {
            free(q);
            pthread_mutex_unlock(&x->mu);
            return al_err(err, -ENOMEM, "cannot take over the guest's runs");
        }
        q->id = ids[i];
        q->cancel_fd = s->cancel_fd;
        q->unclaimed = true;
        q->next = x->reqs;
        x->reqs = q;
        x->n++;
        s->adopted[s->nadopted++] = ids[i];
        if (ids[i] >= s->next_id)
            s->next_id = ids[i] + 1;
    }
    pthread_mutex_unlock(&x->mu);
    return 0;
}

void al_link_drop_unclaimed(al_session *s)
{
    struct al_link_mux *x = s->mux;
    for (;;) {
        uint32_t id = 0;
        pthread_mutex_lock(&x->mu);
        for (struct al_link_req *q = x->reqs; q && !id; q = q->next)
            if (q->unclaimed)
                id = q->id;
        pthread_mutex_unlock(&x->mu);
        if (!id)
            return;
        al_link_end(s, id);
    }
}

int al_link_claim(al_session *s, uint32_t id, int cancel_fd, al_error *err)
{
    struct al_link_mux *x = s->mux;
    pthread_mutex_lock(&x->mu);
    struct al_link_req *q = req_find(x, id);
    bool ok = q && q->unclaimed;
    if (ok) {
        q->unclaimed = false;
        if (cancel_fd > 0)
            q->cancel_fd = cancel_fd;
    }
    pthread_mutex_unlock(&x->mu);
    if (!ok)
        return al_err(err, -ENOENT, "no run %u was handed over by the guest (or it is taken)", id);
    return 0;
}

void al_link_fail_all(al_session *s, int code, const char *msg)
{
    struct al_link_mux *x = s->mux;
    pthread_mutex_lock(&x->mu);
    fail_others(x, NULL, code, msg);
    pthread_mutex_unlock(&x->mu);
}

int al_link_cancel_fd(al_session *s, uint32_t id)
{
    struct al_link_mux *x = s->mux;
    pthread_mutex_lock(&x->mu);
    struct al_link_req *q = req_find(x, id);
    int fd = q ? q->cancel_fd : s->cancel_fd;
    pthread_mutex_unlock(&x->mu);
    return fd;
}

/* A copy of the frame m (which points into the channel's buffer), or NULL. */
static struct qframe *frame_copy(struct al_link_mux *x, const struct al_msg *m)
{
    int n = al_msg_encode(m, x->scratch, AL_FRAME_HEADER_SIZE + AL_FRAME_PAYLOAD_MAX);
    struct qframe *f = n < 0 ? NULL : malloc(sizeof(*f) + (size_t)n);
    if (!f)
        return NULL;
    f->next = NULL;
    f->len = (size_t)n;
    memcpy(f->buf, x->scratch, (size_t)n);
    return f;
}

/* The frame m read for another request: a copy into its queue. 0, or -ENOMEM. */
static int enqueue(struct al_link_mux *x, struct al_link_req *q, const struct al_msg *m)
{
    if (q->fail)
        return 0; /* it ends without reading more */
    struct qframe *f = frame_copy(x, m);
    if (!f)
        return -ENOMEM;
    if (q->queued + f->len > QUEUE_MAX) {
        free(f);
        req_fail(q, -EPROTO, "the guest sent a request more than its credit allows");
        return 0;
    }
    if (q->tail)
        q->tail->next = f;
    else
        q->head = f;
    q->tail = f;
    q->queued += f->len;
    req_kick(q);
    return 0;
}

/* The frame f, now q's current one, into *m (pointing into it). */
static int take(struct al_link_req *q, struct qframe *f, struct al_msg *m, al_error *err)
{
    make_current(q, f);
    struct al_header h;
    const char *why = "?";
    if (al_header_decode(f->buf, f->len, &h, &why) < 0 ||
        al_msg_decode(&h, f->buf + AL_FRAME_HEADER_SIZE, m, &why) < 0)
        return al_err(err, -EPROTO, "a queued frame does not decode: %s", why);
    return 1;
}

/* The frame m (in the channel's buffer), q's own, into q's own buffer and *m. */
static int own_copy(struct al_link_req *q, struct al_msg *m, al_error *err)
{
    const size_t cap = AL_FRAME_HEADER_SIZE + AL_FRAME_PAYLOAD_MAX;
    if (!q->own && !(q->own = malloc(sizeof(*q->own) + cap)))
        return al_err(err, -ENOMEM, "out of memory for a frame");
    if (m->type == AL_DATA) {
        /* The hot path (a stream's chunks): the payload alone, one memcpy. */
        make_current(q, q->own);
        memcpy(q->own->buf, m->u.data.data, m->u.data.len);
        m->u.data.data = q->own->buf;
        return 1;
    }
    int n = al_msg_encode(m, q->own->buf, cap);
    if (n < 0)
        return al_err(err, n, "cannot copy a %s frame", al_type_name(m->type));
    q->own->len = (size_t)n;
    q->own->next = NULL;
    return take(q, q->own, m, err);
}

/* The queue's first frame into *m. */
static int dequeue(struct al_link_req *q, struct al_msg *m, al_error *err)
{
    struct qframe *f = q->head;
    q->head = f->next;
    if (!q->head)
        q->tail = NULL;
    q->queued -= f->len;
    return take(q, f, m, err);
}

/* Reads the channel for q, handing others their frames, until a frame of q's (1, *m), a wake
 * (0), or a failure. Called and returns with mu held; unlocks around the read. */
static int read_for(al_session *s, struct al_link_req *q, struct al_msg *m, int extra_fd,
                    int extra2_fd, uint64_t until, al_error *err)
{
    struct al_link_mux *x = s->mux;
    x->reading = true;
    int r;
    for (;;) {
        pthread_mutex_unlock(&x->mu);
        r = al_channel_recv(&s->ch, m, until, q->cancel_fd, extra_fd, extra2_fd, q->wake[0], err);
        pthread_mutex_lock(&x->mu);
        if (r <= 0)
            break;
        if (m->id == q->id && !(m->type == AL_ERROR && m->id == 0)) {
            /* Ours, copied: the next reader reuses the channel's buffer at once. */
            r = own_copy(q, m, err);
            break;
        }
        struct al_link_req *o = m->id ? req_find(x, m->id) : NULL;
        if (o) {
            if ((r = enqueue(x, o, m)) < 0) {
                r = al_err(err, r, "out of memory for a frame");
                break;
            }
            continue;
        }
        if ((r = al_link_stray_frame(s, m, NULL, err)) < 0)
            break;
    }
    x->reading = false;
    /* The channel itself failed: every request on it fails the same way. A deadline of q's, a
     * wake or a frame of its own concern q alone. */
    if (r < 0 && !(r == -ETIMEDOUT && err->code == 0))
        fail_others(x, q, r, err->msg);
    pass_reading(x, q);
    return r;
}

/* Locks x and finds request id in it: the request with x->mu held, or NULL with err set
 * (-EINVAL) and x->mu not held. */
static struct al_link_req *req_lock(struct al_link_mux *x, uint32_t id, al_error *err)
{
    pthread_mutex_lock(&x->mu);
    struct al_link_req *q = req_find(x, id);
    if (!q) {
        pthread_mutex_unlock(&x->mu);
        al_err(err, -EINVAL, "request %u is not in flight", id);
    }
    return q;
}

int al_link_wait_writable(al_session *s, uint32_t id, int fd, al_error *err)
{
    struct al_link_mux *x = s->mux;
    struct al_link_req *q = req_lock(x, id, err);
    if (!q)
        return -EINVAL;
    int r;
    for (;;) {
        if (q->fail) {
            r = al_err(err, q->fail, "%s", q->fail_msg);
            break;
        }
        /* A wake drained here is not lost: its cause stays in the queue, the fail or the
         * reading, and the next receive looks at those first. */
        req_drain(q);
        pthread_mutex_unlock(&x->mu);
        struct pollfd p[3] = {{fd, POLLOUT, 0}, {q->cancel_fd, POLLIN, 0}, {q->wake[0], POLLIN, 0}};
        int pr = poll(p, 3, -1);
        int saved = errno;
        pthread_mutex_lock(&x->mu);
        if (pr < 0 && saved != EINTR) {
            r = al_err(err, -saved, "poll failed: %s", strerror(saved));
            break;
        }
        if (pr > 0 && p[1].revents) {
            r = 1;
            break;
        }
        if (pr > 0 && p[0].revents) {
            r = 0; /* writable, or broken: the write says which */
            break;
        }
    }
    pthread_mutex_unlock(&x->mu);
    return r;
}

int al_link_recv_until(al_session *s, uint32_t id, struct al_msg *m, int extra_fd, int extra2_fd,
                       uint64_t deadline, al_error *err)
{
    struct al_link_mux *x = s->mux;
    bool ours = deadline && (!s->expires_ms || deadline < s->expires_ms);
    uint64_t until = ours ? deadline : s->expires_ms;
    struct al_link_req *q = req_lock(x, id, err);
    if (!q)
        return -EINVAL;
    int r;
    for (;;) {
        if (q->head) {
            r = dequeue(q, m, err);
            break;
        }
        if (q->fail) {
            r = al_err(err, q->fail, "%s", q->fail_msg);
            break;
        }
        if (!x->reading) {
            req_drain(q);
            r = read_for(s, q, m, extra_fd, extra2_fd, until, err);
            if (r == 0 && q->fail)
                continue; /* woken to fail */
            if (r == 0) {
                /* Woken by its own pipe (a frame or the reading passed to it): read on. */
                struct pollfd p[3] = {
                    {q->cancel_fd, POLLIN, 0}, {extra_fd, POLLIN, 0}, {extra2_fd, POLLIN, 0}};
                if (poll(p, 3, 0) <= 0)
                    continue;
            }
            break;
        }
        /* Another request reads: wait for a frame, the reading, a wake of our own. */
        q->waiting = true;
        pthread_mutex_unlock(&x->mu);
        uint64_t now = al_now_ms();
        int timeout = -1;
        if (until)
            timeout = now >= until ? 0 : (int)(until - now);
        struct pollfd p[4] = {{q->wake[0], POLLIN, 0},
                              {q->cancel_fd, POLLIN, 0},
                              {extra_fd, POLLIN, 0},
                              {extra2_fd, POLLIN, 0}};
        int pr = poll(p, 4, timeout);
        int saved = errno;
        pthread_mutex_lock(&x->mu);
        q->waiting = false;
        if (pr < 0 && saved != EINTR) {
            r = al_err(err, -saved, "poll failed: %s", strerror(saved));
            break;
        }
        if (pr == 0 && until && al_now_ms() >= until) {
            r = -ETIMEDOUT;
            break;
        }
        if (pr > 0 && (p[1].revents || p[2].revents || p[3].revents)) {
            r = 0;
            break;
        }
        if (pr > 0 && p[0].revents)
            req_drain(q);
    }
    /* Leaving without the reading: another waiter may need it. */
    if (!x->reading)
        pass_reading(x, q);
    pthread_mutex_unlock(&x->mu);
    if (r == -ETIMEDOUT && err->code == 0 && ours)
        return r;
    if (r == -ETIMEDOUT && err->code == 0)
        return al_err(err, -ETIME, "session lifetime exceeded");
    return r;
}

/* The link to the agent, whatever carries it: connecting through the session's transport, the
 * handshake (at boot, after a dropped connection, after a checkpoint restore), request ids and
 * the frames that belong to no request. */
#include "link.h"

#include "transport/transport.h"

#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

/* The handshake after a reconnect. */
#define RECONNECT_HANDSHAKE_MS 8000
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
    int r = al_channel_send(&s->ch, &m, err);
    if (r < 0)
        return r;
    *nonce = n;
    return 0;
}

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
    return 0;
}

int al_link_hello_wait(al_session *s, uint64_t nonce, uint64_t deadline, al_error *err)
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
        if (s->dom && !virDomainIsActive(s->dom))
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
    return link_reconnect(s, err);
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
            r = al_channel_recv(&s->ch, &m, attempt_end, -1, -1, &ignored);
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
    return al_link_recv_until(s, id, m, extra_fd, 0, err);
}

int al_link_recv_until(al_session *s, uint32_t id, struct al_msg *m, int extra_fd,
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
        if ((r = al_link_stray_frame(s, m, NULL, err)) < 0)
            return r;
    }
}

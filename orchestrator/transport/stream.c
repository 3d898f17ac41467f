/* The libvirt-stream transport: the same virtio-serial port and agent as transport/virtio.c, but
 * the host reaches QEMU's socket through the libvirt connection (virDomainOpenChannel and a
 * virStream) instead of opening the socket on the local disk, so it works where the domain runs
 * on another host (qemu+tcp://, qemu+ssh://, qemu+tls://). libvirtd on that host connects to the
 * socket; its end is QEMU's, so like virtio.c it survives a restore and never drops while the VM
 * runs.
 *
 * The link wants one stream socket, so a pump moves bytes between a non-blocking virStream and
 * one end of a socketpair; the link gets the other end and keeps its own semantics on it (bounded
 * writes, deadlines, cancel). The pump is event callbacks on libvirt's event loop (the library
 * runs it in a thread of its own, al_libvirt_events), one for the stream and one for our end of
 * the pair, both run by that one thread: a blocking virStreamRecv in one thread and virStreamSend
 * in another can deadlock inside libvirt's client, which is why nothing here blocks.
 *
 * Guest to host: whatever the stream has is read at once into a queue, which is written into the
 * pair as fast as the link reads. The queue holds at most PENDING_MAX: a guest that sends more
 * than the host has read by then is flooding (an honest agent sends at most its credit window per
 * stream unasked), and the unix socket's kernel buffer would have stopped it, while libvirt's
 * client would queue the rest of the flood in this process; so the stream is aborted and the pair
 * ended. The stream's end (or error) ends the pair for writing once the queue is out, which the
 * link reads as the channel's end. Host to guest: one buffer read from the pair at a time, sent
 * with virStreamSend; the pair is not read again until it is out, so the link's writes wait on
 * the guest as they do on a socket. The link's close ends it: the stream is aborted.
 *
 * Chosen by al_transport_new for a remote host or AIRLOCK_CHANNEL=stream; local sessions keep the
 * unix socket, which is cheaper (bench/hosts.py). */
#include "transport.h"

#include <fcntl.h>
#include <libvirt/virterror.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

/* Between tries while QEMU's socket does not exist yet. */
#define OPEN_RETRY_US 20000
#define PUMP_BUF 65536
/* Reads of the stream per callback, so that the pair's side gets its turn in a flood. */
#define READS_PER_EVENT 16
/* Bytes from the guest the link has not taken yet (see above). */
#define PENDING_MAX (64u << 20)

/* The pump's state, shared with the event loop's callbacks: freed by whoever drops the last
 * reference: the transport's, the pair's handle's (dropped by its free function, which the event
 * loop calls once the handle can no longer fire) and the barrier's. The stream's callback holds
 * none: libvirt 9.0's remote driver never calls a stream callback's free function. So
 * disconnect removes it, then waits for a timeout it adds to the same event loop to have run
 * (the barrier): the loop dispatches one thing at a time, so by then any dispatch of the stream
 * callback under way at the removal has returned, and no later one calls it. */
struct pump {
    pthread_mutex_t mu;  /* recursive: a removal inside a callback may drop a reference */
    pthread_cond_t gone; /* a reference was dropped */
    unsigned refs;
    bool stopping; /* disconnect: callbacks return at once */
    virStreamPtr st;
    int pair;  /* ours, non-blocking */
    int watch; /* the pair's handle on the event loop, -1: none */
    bool st_cb;
    char *in; /* guest to host, not yet in the pair */
    size_t inlen, incap;
    char out[PUMP_BUF]; /* host to guest, not yet sent */
    size_t outlen, outoff;
    bool st_end;   /* the stream ended (or failed, or was aborted) */
    bool pair_end; /* the link closed its end (or it failed) */
    bool shut;     /* the pair was ended for writing */
};

struct stream_tport {
    struct al_tport t;
    struct pump *p;
};

static struct stream_tport *stream_of(struct al_tport *t)
{
    return (struct stream_tport *)t;
}

static void pump_unref(void *opaque)
{
    struct pump *p = opaque;
    pthread_mutex_lock(&p->mu);
    bool last = --p->refs == 0;
    pthread_cond_broadcast(&p->gone);
    pthread_mutex_unlock(&p->mu);
    if (!last)
        return;
    if (p->st)
        virStreamFree(p->st);
    if (p->pair >= 0)
        close(p->pair);
    free(p->in);
    pthread_cond_destroy(&p->gone);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

/* The stream is over from our side: aborted (a flood, the link's close, a failed send), its
 * callback removed first (libvirt drops it with no word once the stream is aborted). With mu
 * held. */
static void end_stream(struct pump *p)
{
    if (p->st_end)
        return;
    p->st_end = true;
    if (p->st_cb) {
        p->st_cb = false;
        virStreamEventRemoveCallback(p->st);
    }
    virStreamAbort(p->st);
}

/* What each side waits for now; with mu held. */
static void update(struct pump *p)
{
    if (p->stopping)
        return;
    if (p->st_cb) {
        int ev = 0;
        if (!p->st_end) {
            ev |= VIR_STREAM_EVENT_READABLE;
            if (p->outoff < p->outlen)
                ev |= VIR_STREAM_EVENT_WRITABLE;
        }
        virStreamEventUpdateCallback(p->st, ev);
    }
    if (p->st_end && !p->inlen && !p->shut) {
        shutdown(p->pair, SHUT_WR);
        p->shut = true;
    }
    if (p->watch >= 0) {
        int ev = 0;
        if (p->inlen && !p->shut)
            ev |= VIR_EVENT_HANDLE_WRITABLE;
        if (!p->pair_end && p->outoff == p->outlen)
            ev |= VIR_EVENT_HANDLE_READABLE;
        virEventUpdateHandle(p->watch, ev);
    }
}

/* The queue into the pair, as much as it takes now. */
static void flush_in(struct pump *p)
{
    size_t off = 0;
    while (off < p->inlen) {
        ssize_t w = send(p->pair, p->in + off, p->inlen - off, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (w <= 0) { /* the link is gone: nobody reads what is left */
            p->inlen = off = 0;
            p->pair_end = true;
            end_stream(p);
            break;
        }
        off += (size_t)w;
    }
    if (off) {
        memmove(p->in, p->in + off, p->inlen - off);
        p->inlen -= off;
    }
}

/* The pending host-to-guest buffer into the stream, as much as it takes now. */
static void flush_out(struct pump *p)
{
    while (p->outoff < p->outlen && !p->st_end) {
        int w = virStreamSend(p->st, p->out + p->outoff, p->outlen - p->outoff);
        if (w == -2)
            return;
        if (w < 0) {
            end_stream(p);
            break;
        }
        p->outoff += (size_t)w;
    }
    if (p->outoff >= p->outlen || p->st_end)
        p->outoff = p->outlen = 0;
}

static void read_stream(struct pump *p)
{
    char buf[PUMP_BUF];
    for (int i = 0; i < READS_PER_EVENT && !p->st_end; i++) {
        int n = virStreamRecv(p->st, buf, sizeof(buf));
        if (n == -2)
            return;
        if (n < 0) { /* an error: the guest's side is gone */
            end_stream(p);
            return;
        }
        if (n == 0) { /* its end */
            p->st_end = true;
            return;
        }
        if (p->inlen + (size_t)n > PENDING_MAX) { /* a flood: see above */
            p->inlen = 0;
            end_stream(p);
            return;
        }
        if (p->inlen + (size_t)n > p->incap) {
            size_t cap = p->incap ? p->incap : PUMP_BUF * 4;
            while (cap < p->inlen + (size_t)n)
                cap *= 2;
            char *q = realloc(p->in, cap);
            if (!q) {
                p->inlen = 0;
                end_stream(p);
                return;
            }
            p->in = q;
            p->incap = cap;
        }
        memcpy(p->in + p->inlen, buf, (size_t)n);
        p->inlen += (size_t)n;
        flush_in(p);
    }
}

static void on_stream(virStreamPtr st, int events, void *opaque)
{
    (void)st;
    struct pump *p = opaque;
    pthread_mutex_lock(&p->mu);
    if (!p->stopping) {
        if (events & VIR_STREAM_EVENT_WRITABLE)
            flush_out(p);
        if (events & (VIR_STREAM_EVENT_READABLE | VIR_STREAM_EVENT_HANGUP | VIR_STREAM_EVENT_ERROR))
            read_stream(p);
        update(p);
    }
    pthread_mutex_unlock(&p->mu);
}

static void on_pair(int watch, int fd, int events, void *opaque)
{
    (void)watch;
    (void)fd;
    struct pump *p = opaque;
    pthread_mutex_lock(&p->mu);
    if (!p->stopping) {
        if (events & VIR_EVENT_HANDLE_WRITABLE)
            flush_in(p);
        if ((events &
             (VIR_EVENT_HANDLE_READABLE | VIR_EVENT_HANDLE_HANGUP | VIR_EVENT_HANDLE_ERROR)) &&
            !p->pair_end && p->outoff == p->outlen) {
            ssize_t n = read(p->pair, p->out, sizeof(p->out));
            if (n > 0) {
                p->outlen = (size_t)n;
                p->outoff = 0;
                flush_out(p);
            } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
                p->pair_end = true; /* the link closed: the channel is over */
                end_stream(p);
            }
        }
        update(p);
    }
    pthread_mutex_unlock(&p->mu);
}

static void on_barrier(int timer, void *opaque)
{
    (void)opaque;
    virEventRemoveTimeout(timer); /* its free function drops the barrier's reference */
}

static struct al_tport *stream_create(void)
{
    return calloc(1, sizeof(struct stream_tport));
}

static int stream_prepare(struct al_tport *t, struct al_vm_config *cfg, bool kvm, al_error *err)
{
    (void)kvm;
    (void)err;
    (void)t;
    /* The same virtio-serial port on a unix socket, which only libvirtd opens: "" lets libvirt
     * choose its path on the domain's host. */
    cfg->agent_sock = "";
    return 0;
}

static void stream_disconnect(struct al_tport *t)
{
    struct stream_tport *s = stream_of(t);
    struct pump *p = s->p;
    if (!p)
        return;
    s->p = NULL;
    pthread_mutex_lock(&p->mu);
    p->stopping = true;
    /* Each removal drops its callback's reference once it can no longer run: at once, or on
     * the event loop's next round. */
    if (p->st_cb) {
        p->st_cb = false;
        virStreamEventRemoveCallback(p->st);
    }
    if (p->watch >= 0) {
        virEventRemoveHandle(p->watch);
        p->watch = -1;
    }
    end_stream(p);
    p->refs++;
    if (virEventAddTimeout(0, on_barrier, p, pump_unref) < 0)
        p->refs--;
    /* The pump goes with the session, not later on the event loop's thread. */
    uint64_t until = al_now_ms() + 5000;
    while (p->refs > 1 && al_now_ms() < until) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&p->gone, &p->mu, &ts);
    }
    pthread_mutex_unlock(&p->mu);
    pump_unref(p);
}

static void stream_destroy(struct al_tport *t)
{
    free(stream_of(t));
}

static int stream_connect(struct al_tport *t, virDomainPtr dom, uint64_t deadline,
                          struct al_transport_conn *out, al_error *err)
{
    struct stream_tport *s = stream_of(t);
    stream_disconnect(t);
    virConnectPtr conn = virDomainGetConnect(dom);
    virStreamPtr st = NULL;
    for (;;) {
        st = virStreamNew(conn, VIR_STREAM_NONBLOCK);
        if (!st)
            return al_err_virt(err, -ENOMEM, "cannot create a libvirt stream");
        if (virDomainOpenChannel(dom, "org.airlock.agent.0", st, VIR_DOMAIN_CHANNEL_FORCE) == 0)
            break;
        if (al_now_ms() >= deadline) {
            int r = al_err_virt(err, -ECONNREFUSED, "cannot open the agent's channel");
            virStreamFree(st);
            return r;
        }
        virStreamFree(st);
        usleep(OPEN_RETRY_US);
    }
    int sp[2];
    struct pump *p = calloc(1, sizeof(*p));
    if (!p || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sp) < 0) {
        int r = p ? al_err(err, -errno, "socketpair: %s", strerror(errno))
                  : al_err(err, -ENOMEM, "out of memory");
        free(p);
        virStreamAbort(st);
        virStreamFree(st);
        return r;
    }
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&p->mu, &ma);
    pthread_mutexattr_destroy(&ma);
    pthread_cond_init(&p->gone, NULL);
    p->refs = 1;
    p->st = st;
    p->pair = sp[1];
    p->watch = -1;
    /* The link's end blocks, as a socket's does; deadlines are the link's own. */
    int fl = fcntl(sp[0], F_GETFL);
    fcntl(sp[0], F_SETFL, fl & ~O_NONBLOCK);
    s->p = p;
    pthread_mutex_lock(&p->mu);
    if (virStreamEventAddCallback(st, VIR_STREAM_EVENT_READABLE, on_stream, p, NULL) == 0)
        p->st_cb = true;
    p->refs++;
    p->watch = p->st_cb
                   ? virEventAddHandle(p->pair, VIR_EVENT_HANDLE_READABLE, on_pair, p, pump_unref)
                   : -1;
    if (p->watch < 0)
        p->refs--;
    bool ok = p->st_cb && p->watch >= 0;
    pthread_mutex_unlock(&p->mu);
    if (!ok) {
        int r = al_err_virt(err, -EIO, "cannot watch the agent's channel (no libvirt event loop)");
        close(sp[0]);
        stream_disconnect(t);
        return r;
    }
    *out = (struct al_transport_conn){
        .fd = sp[0],
        .eof_msg = "the agent's channel ended (the guest stopped, its host stopped answering, "
                   "or it sent more than 64 MiB the host had not read)",
    };
    return 0;
}

const struct al_transport_ops al_transport_stream = {
    .kind = AL_TRANSPORT_VIRTIO,
    .label = "libvirt stream",
    .peer = "agent",
    .guest_side = false,
    .probe_ms = 6000,
    .create = stream_create,
    .destroy = stream_destroy,
    .prepare = stream_prepare,
    .connect = stream_connect,
    .disconnect = stream_disconnect,
};

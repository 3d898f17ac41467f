/* The libvirt-stream transport: the same virtio-serial port and agent as transport/virtio.c, but
 * the host reaches QEMU's socket through libvirt (virDomainOpenChannel and a virStream) instead
 * of opening the socket on the local disk, so it works where the domain runs on another host
 * (qemu+tcp://, qemu+ssh://, qemu+tls://). libvirtd on that host connects to the socket; its end
 * is QEMU's, so like virtio.c it survives a restore and never drops while the VM runs.
 *
 * The link wants one stream socket, so a pump moves bytes between the virStream and one end of a
 * socketpair; the link gets the other end and keeps its own semantics on it (bounded writes,
 * deadlines, cancel). Three things shaped the pump, each found the hard way:
 *
 * - The stream has a libvirt connection of its own. A virStreamSend waits until libvirtd takes
 *   the data, and libvirtd stops taking it while the guest does not read; every later call on
 *   that connection queues behind it. On the session's connection that would hold up the
 *   virDomainDestroy that ends a session whose guest stopped reading.
 * - Host to guest is one thread (pump_tx) doing blocking reads of the pair and blocking
 *   virStreamSend. Guest to host is a callback on libvirt's event loop (the library runs it in a
 *   thread, al_libvirt_events) doing non-blocking virStreamRecv: a blocking virStreamRecv in one
 *   thread and a virStreamSend in another deadlocked inside libvirt's client.
 * - Whatever arrives is read at once into a queue of at most PENDING_MAX bytes, written into the
 *   pair as fast as the link reads it. An honest agent sends at most its credit window per stream
 *   unasked; past the bound the guest is flooding, which the unix socket's kernel buffer would
 *   have stopped, while libvirt's client would queue the rest in this process. So the stream is
 *   aborted and the pair ended (the link reads the channel's end).
 *
 * Ending: the link's close (or disconnect's shutdown of the pair) ends pump_tx's read; pump_tx
 * aborts the stream and, once the others let go, frees the pump and closes the connection. A
 * pump_tx stuck in virStreamSend (a guest that stopped reading) is left to finish by itself:
 * destroying the domain, on the session's connection, ends the stream under it.
 *
 * Chosen by al_transport_new for a remote host or AIRLOCK_CHANNEL=stream; local sessions keep the
 * unix socket, which needs no second connection, no thread and no queue (bench/hosts.py: the two
 * cost the same there). */
#include "transport.h"

#include <fcntl.h>
#include <libvirt/virterror.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

/* Between tries while QEMU's socket does not exist yet. */
#define OPEN_RETRY_US 20000
#define PUMP_BUF 65536
/* Bytes from the guest the link has not taken yet (see above). */
#define PENDING_MAX (64u << 20)

/* The pump's state, shared by the transport, pump_tx and the event loop's callbacks. References:
 * the transport's (dropped by disconnect), the pair handle's (dropped by its free function, which
 * the event loop calls once the handle can no longer fire), the barrier's (below), and pump_tx,
 * which frees everything once it is the last. The stream callback holds none: libvirt 9.0's
 * remote driver never calls a stream callback's free function. So disconnect removes it, then
 * adds a timeout to the same event loop and lets it drop the barrier's reference: the loop
 * dispatches one thing at a time, so by then a dispatch of the stream callback under way at the
 * removal has returned, and no later one calls it. */
struct pump {
    pthread_mutex_t mu;  /* recursive: a removal inside a callback may drop a reference */
    pthread_cond_t gone; /* a reference was dropped */
    unsigned refs;
    bool stopping; /* disconnect: callbacks return at once */
    virConnectPtr conn;
    virDomainPtr dom; /* the session's domain, through conn */
    virStreamPtr st;
    int pair;  /* ours, non-blocking */
    int watch; /* the pair's handle on the event loop, -1: none */
    bool st_cb;
    pthread_t tx;
    char *in; /* guest to host, not yet in the pair: in[inoff, inlen) */
    size_t inoff, inlen, incap;
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
    p->refs--;
    pthread_cond_broadcast(&p->gone);
    pthread_mutex_unlock(&p->mu);
}

/* pump_tx's end, with the last reference: nothing else can touch p. */
static void pump_free(struct pump *p)
{
    if (p->st)
        virStreamFree(p->st);
    if (p->dom)
        virDomainFree(p->dom);
    if (p->conn)
        virConnectClose(p->conn);
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

/* What the event loop waits for now; with mu held. */
static void update(struct pump *p)
{
    if (p->stopping)
        return;
    if (p->st_end && !p->inlen && !p->shut) {
        shutdown(p->pair, SHUT_WR);
        p->shut = true;
    }
    if (p->st_cb)
        virStreamEventUpdateCallback(p->st, p->st_end ? 0 : VIR_STREAM_EVENT_READABLE);
    if (p->watch >= 0)
        virEventUpdateHandle(p->watch, p->inlen && !p->shut ? VIR_EVENT_HANDLE_WRITABLE : 0);
}

/* The queue into the pair, as much as it takes now. */
static void flush_in(struct pump *p)
{
    while (p->inoff < p->inlen) {
        ssize_t w =
            send(p->pair, p->in + p->inoff, p->inlen - p->inoff, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (w <= 0) { /* the link is gone: nobody reads what is left */
            p->inoff = p->inlen = 0;
            p->pair_end = true;
            end_stream(p);
            break;
        }
        p->inoff += (size_t)w;
    }
    if (p->inoff == p->inlen)
        p->inoff = p->inlen = 0;
}

/* Room for one more read at the queue's end: the pending bytes moved to its start when that
 * frees at least half the buffer (so each byte moves a bounded number of times), or a bigger
 * buffer, at most twice the bound. */
static bool make_room(struct pump *p)
{
    if (p->inlen + PUMP_BUF <= p->incap)
        return true;
    if (p->inoff && (p->inoff >= p->incap / 2 || p->incap >= 2 * PENDING_MAX)) {
        memmove(p->in, p->in + p->inoff, p->inlen - p->inoff);
        p->inlen -= p->inoff;
        p->inoff = 0;
        if (p->inlen + PUMP_BUF <= p->incap)
            return true;
    }
    size_t cap = p->incap ? p->incap : PUMP_BUF * 4;
    while (cap < p->inlen + PUMP_BUF)
        cap *= 2;
    char *q = realloc(p->in, cap);
    if (!q)
        return false;
    p->in = q;
    p->incap = cap;
    return true;
}

static void read_stream(struct pump *p)
{
    /* Everything libvirt's client holds: it reads the socket into its own queue while this
     * does not, so this takes all there is each time, straight into the pump's queue. */
    while (!p->st_end) {
        if (p->inlen - p->inoff + PUMP_BUF > PENDING_MAX || !make_room(p)) {
            /* a flood (see above), or no memory for it: the same end */
            p->inoff = p->inlen = 0;
            end_stream(p);
            return;
        }
        int n = virStreamRecv(p->st, p->in + p->inlen, PUMP_BUF);
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
        p->inlen += (size_t)n;
        flush_in(p);
    }
}

static void on_stream(virStreamPtr st, int events, void *opaque)
{
    (void)st;
    (void)events; /* readable, hangup or error: virStreamRecv tells which */
    struct pump *p = opaque;
    pthread_mutex_lock(&p->mu);
    if (!p->stopping) {
        read_stream(p);
        update(p);
    }
    pthread_mutex_unlock(&p->mu);
}

static void on_pair(int watch, int fd, int events, void *opaque)
{
    (void)watch;
    (void)fd;
    (void)events;
    struct pump *p = opaque;
    pthread_mutex_lock(&p->mu);
    if (!p->stopping) {
        flush_in(p);
        update(p);
    }
    pthread_mutex_unlock(&p->mu);
}

static void on_barrier(int timer, void *opaque)
{
    (void)opaque;
    virEventRemoveTimeout(timer); /* its free function drops the barrier's reference */
}

/* Host to guest: blocking, in a thread of its own (see above); the pump's last owner. */
static void *pump_tx(void *arg)
{
    struct pump *p = arg;
    char buf[PUMP_BUF];
    for (;;) {
        struct pollfd pfd = {.fd = p->pair, .events = POLLIN};
        if (poll(&pfd, 1, -1) < 0 && errno != EINTR)
            break;
        ssize_t n = read(p->pair, buf, sizeof(buf));
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n <= 0)
            break; /* the link closed, or disconnect shut the pair */
        bool ok = true;
        for (ssize_t off = 0; ok && off < n;) {
            int w = virStreamSend(p->st, buf + off, (size_t)(n - off));
            if (w == -2) { /* libvirt's client is busy: a moment, then again */
                usleep(1000);
                continue;
            }
            ok = w >= 0;
            off += ok ? w : 0;
        }
        if (!ok)
            break;
    }
    pthread_mutex_lock(&p->mu);
    p->pair_end = true;
    end_stream(p);
    while (p->refs > 1)
        pthread_cond_wait(&p->gone, &p->mu);
    pthread_mutex_unlock(&p->mu);
    pump_free(p);
    return NULL;
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
    if (p->st_cb) {
        p->st_cb = false;
        virStreamEventRemoveCallback(p->st);
    }
    /* Even when end_stream removed the callback (from another thread, maybe mid-dispatch). */
    p->refs++;
    if (virEventAddTimeout(0, on_barrier, p, pump_unref) < 0)
        p->refs--;
    if (p->watch >= 0) {
        virEventRemoveHandle(p->watch);
        p->watch = -1;
    }
    /* pump_tx's read ends; it aborts the stream and frees the pump when the rest let go. */
    shutdown(p->pair, SHUT_RDWR);
    pthread_mutex_unlock(&p->mu);
    pump_unref(p);
}

static void stream_destroy(struct al_tport *t)
{
    free(stream_of(t));
}

/* A connection of the stream's own to the session's host, and the domain through it. */
static int open_own(virDomainPtr dom, struct pump *p, al_error *err)
{
    _cleanup_free_ char *uri = virConnectGetURI(virDomainGetConnect(dom));
    unsigned char uuid[VIR_UUID_BUFLEN];
    if (!uri || virDomainGetUUID(dom, uuid) < 0)
        return al_err_virt(err, -EIO, "cannot read the session's connection");
    al_libvirt_events();
    p->conn = virConnectOpen(uri);
    if (!p->conn)
        return al_err_virt(err, -ECONNREFUSED, "cannot open a connection for the agent's channel");
    p->dom = virDomainLookupByUUID(p->conn, uuid);
    if (!p->dom)
        return al_err_virt(err, -ENOENT, "cannot find the session's domain");
    return 0;
}

static int stream_connect(struct al_tport *t, virDomainPtr dom, uint64_t deadline,
                          struct al_transport_conn *out, al_error *err)
{
    struct stream_tport *s = stream_of(t);
    stream_disconnect(t);
    struct pump *p = calloc(1, sizeof(*p));
    if (!p)
        return al_err(err, -ENOMEM, "out of memory");
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&p->mu, &ma);
    pthread_mutexattr_destroy(&ma);
    pthread_cond_init(&p->gone, NULL);
    p->pair = -1;
    p->watch = -1;
    p->refs = 1; /* pump_tx's, or this function's until it runs */
    int sp[2] = {-1, -1};
    int r = open_own(dom, p, err);
    while (r == 0) {
        p->st = virStreamNew(p->conn, VIR_STREAM_NONBLOCK);
        if (!p->st) {
            r = al_err_virt(err, -ENOMEM, "cannot create a libvirt stream");
            break;
        }
        if (virDomainOpenChannel(p->dom, "org.airlock.agent.0", p->st, VIR_DOMAIN_CHANNEL_FORCE) ==
            0)
            break;
        if (al_now_ms() >= deadline)
            r = al_err_virt(err, -ECONNREFUSED, "cannot open the agent's channel");
        virStreamFree(p->st);
        p->st = NULL;
        if (r == 0)
            usleep(OPEN_RETRY_US);
    }
    if (r == 0 && socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0)
        r = al_err(err, -errno, "socketpair: %s", strerror(errno));
    if (r < 0) {
        if (p->st)
            virStreamAbort(p->st);
        pump_free(p);
        return r;
    }
    p->pair = sp[1];
    /* Ours is non-blocking (pump_tx polls); the link's blocks, as a socket's does. */
    fcntl(sp[1], F_SETFL, fcntl(sp[1], F_GETFL) | O_NONBLOCK);
    pthread_mutex_lock(&p->mu);
    p->refs++; /* the transport's */
    if (virStreamEventAddCallback(p->st, VIR_STREAM_EVENT_READABLE, on_stream, p, NULL) == 0)
        p->st_cb = true;
    p->refs++;
    p->watch = virEventAddHandle(p->pair, 0, on_pair, p, pump_unref);
    if (p->watch < 0)
        p->refs--;
    bool ok = p->st_cb && p->watch >= 0;
    pthread_mutex_unlock(&p->mu);
    s->p = p;
    if (ok && (r = -pthread_create(&p->tx, NULL, pump_tx, p)) == 0) {
        pthread_detach(p->tx);
        *out = (struct al_transport_conn){
            .fd = sp[0],
            .eof_msg = "the agent's channel ended (the guest stopped, its host stopped answering, "
                       "or it sent more than 64 MiB the host had not read)",
        };
        return 0;
    }
    r = ok ? al_err(err, r, "cannot start the channel's pump: %s", strerror(-r))
           : al_err_virt(err, -EIO, "cannot watch the agent's channel (no libvirt event loop)");
    close(sp[0]);
    stream_disconnect(t); /* drops the transport's reference; this function's is pump_tx's */
    pthread_mutex_lock(&p->mu);
    end_stream(p);
    while (p->refs > 1)
        pthread_cond_wait(&p->gone, &p->mu);
    pthread_mutex_unlock(&p->mu);
    pump_free(p);
    return r;
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

/* Port forwarding: a listening socket on the host (127.0.0.1 unless told otherwise) whose every
 * connection goes, in a thread of its own, to a port in the guest: al_port_relay for a session of
 * this process, al_attach_port (the holder relays) for one another airlock process holds, the
 * caller's relay for one airlockd holds (a tunnel through the daemon). A
 * forward's close stops listening and ends its connections both ways (shutdown of their sockets,
 * and a kill through each relay's cancel pipe), then waits for their threads. A connection from
 * another user of this host is closed unserved (al_tcp_peer_uid): the guest's ports are its
 * user's, not every local account's. */
#include "session.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

struct conn {
    struct al_forward *f;
    int fd;        /* the accepted connection; -1: a free slot */
    int cancel[2]; /* a byte ends its relay (al_port_relay's cancel_fd) */
    pthread_t thread;
    bool joinable;
};

struct al_forward {
    al_forward_opts o;
    int listen_fd;
    int stop[2];
    unsigned port;
    bool loopback; /* listening on a loopback address: every peer is a socket of this host */
    atomic_bool stopping;
    atomic_ulong accepted;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t freed;
    struct conn conns[AL_FORWARD_CONNS_MAX];
};

static void conn_error(struct al_forward *f, const al_error *err)
{
    if (f->o.on_error && !atomic_load(&f->stopping))
        f->o.on_error(f->o.ctx, err->msg);
}

static void *relay(void *p)
{
    struct conn *c = p;
    struct al_forward *f = c->f;
    al_error err = {0};
    int r = f->o.session
                ? al_port_relay(f->o.session, f->o.guest_port, c->fd, c->cancel[0], NULL, &err)
            : f->o.attach
                ? al_attach_port(f->o.attach, f->o.guest_port, c->fd, c->cancel[0], NULL, &err)
                : f->o.relay(f->o.ctx, c->fd, c->cancel[0], &err);
    if (r < 0 && r != -ECANCELED)
        conn_error(f, &err);
    pthread_mutex_lock(&f->mu);
    al_closep(&c->fd);
    for (int i = 0; i < 2; i++)
        al_closep(&c->cancel[i]);
    pthread_cond_signal(&f->freed);
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

/* A free slot (its last thread joined), waiting for one while all are busy; NULL: stopping. */
static struct conn *take_slot(struct al_forward *f)
{
    pthread_mutex_lock(&f->mu);
    for (;;) {
        if (atomic_load(&f->stopping)) {
            pthread_mutex_unlock(&f->mu);
            return NULL;
        }
        for (size_t i = 0; i < AL_FORWARD_CONNS_MAX; i++) {
            struct conn *c = &f->conns[i];
            if (c->fd >= 0)
                continue;
            pthread_mutex_unlock(&f->mu);
            if (c->joinable) {
                pthread_join(c->thread, NULL);
                c->joinable = false;
            }
            return c;
        }
        pthread_cond_wait(&f->freed, &f->mu);
    }
}

/* Whether the connection's other end may use the forward: this process's user or root when
 * it is on this host; someone elsewhere only when the forward was bound to a non-loopback
 * address on purpose (--bind). A lookup that fails refuses. */
static bool peer_allowed(struct al_forward *f, int fd)
{
    uid_t uid = (uid_t)-1;
    int r = al_tcp_peer_uid(fd, &uid);
    if (r == -ENOENT && !f->loopback)
        return true;
    if (r == 0 && (uid == geteuid() || uid == 0))
        return true;
    al_error err = {0};
    if (r == 0)
        al_err(&err, -EPERM, "a connection from uid %u refused: a forward serves only its own user",
               (unsigned)uid);
    else
        al_err(&err, r, "a connection refused: cannot tell whose it is: %s", strerror(-r));
    conn_error(f, &err);
    return false;
}

static void *serve(void *p)
{
    struct al_forward *f = p;
    for (;;) {
        struct conn *c = take_slot(f);
        if (!c)
            break;
        struct pollfd pfd[2] = {{f->listen_fd, POLLIN, 0}, {f->stop[0], POLLIN, 0}};
        if (poll(pfd, 2, -1) < 0 && errno != EINTR)
            break;
        if (pfd[1].revents)
            break;
        if (!pfd[0].revents)
            continue;
        int fd = accept4(f->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue; /* the peer gave up already, or out of fds for now */
        if (!peer_allowed(f, fd)) {
            close(fd);
            continue;
        }
        if (pipe2(c->cancel, O_CLOEXEC | O_NONBLOCK) < 0) {
            close(fd);
            continue;
        }
        pthread_mutex_lock(&f->mu);
        c->fd = fd;
        c->f = f;
        pthread_mutex_unlock(&f->mu);
        atomic_fetch_add(&f->accepted, 1);
        if (pthread_create(&c->thread, NULL, relay, c) != 0) {
            pthread_mutex_lock(&f->mu);
            al_closep(&c->fd);
            for (int i = 0; i < 2; i++)
                al_closep(&c->cancel[i]);
            pthread_mutex_unlock(&f->mu);
            continue;
        }
        c->joinable = true;
    }
    return NULL;
}

static int listen_on(const char *addr, unsigned port, int *out, unsigned *bound, bool *loopback,
                     al_error *err)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICHOST | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    char service[8];
    snprintf(service, sizeof(service), "%u", port);
    int g = getaddrinfo(addr, service, &hints, &ai);
    if (g != 0)
        return al_err(err, -EINVAL,
                      "cannot listen on '%s': %s (an address such as 127.0.0.1, "
                      "::1 or 0.0.0.0)",
                      addr, gai_strerror(g));
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    int r = 0;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
        bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 64) < 0)
        r = al_err(err, -errno, "cannot listen on %s port %u: %s", addr, port, strerror(errno));
    freeaddrinfo(ai);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (r == 0 && getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
        *bound = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                : ((struct sockaddr_in *)&ss)->sin_port);
        *loopback = ss.ss_family == AF_INET6
                        ? IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6 *)&ss)->sin6_addr)
                        : (ntohl(((struct sockaddr_in *)&ss)->sin_addr.s_addr) >> 24) == 127;
    }
    if (r < 0) {
        if (fd >= 0)
            close(fd);
        return r;
    }
    *out = fd;
    return 0;
}

int al_forward_open(const al_forward_opts *in, al_forward **out, al_error *err)
{
    al_forward_opts taken = AL_FORWARD_OPTS_INIT;
    const al_forward_opts *o = &taken;
    int r0 = AL_SIZED_IN_SINCE(&taken, in, "al_forward_opts", relay, err);
    if (r0 < 0)
        return r0;
    if (!!o->session + !!o->attach + !!o->relay != 1)
        return al_err(err, -EINVAL, "a forward is to a session, a remote one or a relay: one");
    if (o->guest_port < 1 || o->guest_port > 65535 || o->host_port > 65535)
        return al_err(err, -EINVAL, "a port is 1 to 65535");
    al_forward *f = calloc(1, sizeof(*f));
    if (!f)
        return al_err(err, -ENOMEM, "out of memory");
    f->o = *o;
    f->listen_fd = f->stop[0] = f->stop[1] = -1;
    for (size_t i = 0; i < AL_FORWARD_CONNS_MAX; i++)
        f->conns[i] = (struct conn){.fd = -1, .cancel = {-1, -1}};
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->freed, NULL);
    const char *addr = o->bind && *o->bind ? o->bind : "127.0.0.1";
    int r = listen_on(addr, o->host_port, &f->listen_fd, &f->port, &f->loopback, err);
    if (r == 0 && pipe2(f->stop, O_CLOEXEC) < 0)
        r = al_err(err, -errno, "cannot make a pipe: %s", strerror(errno));
    if (r == 0 && (r = -pthread_create(&f->thread, NULL, serve, f)) < 0)
        al_err(err, r, "cannot start the forward's thread: %s", strerror(-r));
    if (r < 0) {
        al_closep(&f->listen_fd);
        al_closep(&f->stop[0]);
        al_closep(&f->stop[1]);
        pthread_mutex_destroy(&f->mu);
        pthread_cond_destroy(&f->freed);
        free(f);
        return r;
    }
    *out = f;
    return 0;
}

unsigned al_forward_host_port(const al_forward *f)
{
    return f->port;
}

unsigned long al_forward_accepted(const al_forward *f)
{
    return atomic_load(&f->accepted);
}

void al_forward_close(al_forward *f)
{
    if (!f)
        return;
    pthread_mutex_lock(&f->mu);
    atomic_store(&f->stopping, true);
    pthread_cond_broadcast(&f->freed);
    pthread_mutex_unlock(&f->mu);
    (void)!write(f->stop[1], "x", 1);
    pthread_join(f->thread, NULL);
    al_closep(&f->listen_fd);
    /* Each connection's socket shut both ways (its relay, local or the holder's, sees its end),
     * and a kill to a local relay that waits on the guest. */
    pthread_mutex_lock(&f->mu);
    for (size_t i = 0; i < AL_FORWARD_CONNS_MAX; i++) {
        struct conn *c = &f->conns[i];
        if (c->fd < 0)
            continue;
        shutdown(c->fd, SHUT_RDWR);
        uint8_t kill = SIGKILL;
        (void)!write(c->cancel[1], &kill, 1);
    }
    pthread_mutex_unlock(&f->mu);
    for (size_t i = 0; i < AL_FORWARD_CONNS_MAX; i++)
        if (f->conns[i].joinable)
            pthread_join(f->conns[i].thread, NULL);
    al_closep(&f->stop[0]);
    al_closep(&f->stop[1]);
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->freed);
    free(f);
}

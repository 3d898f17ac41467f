/* Network on request, the guest's half. A session opened with an allowlist (--net allow=...)
 * gets a NIC on QEMU's user-mode network with restrict=on: the guest can open no connection
 * anywhere. The only connections are the ones the host opens into it (a QEMU host forward to
 * EGRESS_TUNNEL_PORT), each of which leads to the session's proxy on the host. This forwarder
 * accepts those as idle tunnels and pairs each program that connects to 127.0.0.1:3128 (the
 * http_proxy every process gets) with one of them. Nothing here is trusted by the host: the
 * proxy enforces the allowlist; a guest that kills or rewrites this only loses its network.
 *
 * The host forward listens on the host's loopback, where any local user can connect too, and
 * such a connection would arrive here like the host's. So a tunnel is only a tunnel once it has
 * sent the session's key (AL_EGRESS_KEY_PATH, which the host wrote over the agent's channel)
 * within EGRESS_AUTH_MS; until then it is pending and sees nothing of a program's. */
#include "agent.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>

/* The guest's address on QEMU's user network (its default), where the host forward lands. */
#define EGRESS_ADDR "10.0.2.15"
#define EGRESS_NETMASK "255.255.255.0"
#define EGRESS_PROXY_PORT 3128  /* programs' proxy, on 127.0.0.1 */
#define EGRESS_TUNNEL_PORT 3129 /* the host's tunnels arrive here */
#define EGRESS_IFACE "eth0"     /* no udev: the kernel's name for the only NIC */
/* Connections carried at once; the host caps them lower (its proxy's connection limit). */
#define EGRESS_PAIRS_MAX 64
/* Idle tunnels and programs waiting for one, at most: the host keeps a few tunnels ready. */
#define EGRESS_IDLE_MAX 32
#define EGRESS_WAITING_MAX 64
#define EGRESS_BUF 16384
/* Tunnels that have not sent the key yet, and how long one may take: connections a local user
 * opens to the forward land here; the oldest goes when a new one comes and there is no room. */
#define EGRESS_PENDING_MAX 16
#define EGRESS_AUTH_MS 3000

bool egress_present(void)
{
    struct stat st;
    return stat("/sys/class/net/" EGRESS_IFACE, &st) == 0;
}

static int if_set_addr(int s, unsigned long req, const char *addr)
{
    struct ifreq ifr = {.ifr_name = EGRESS_IFACE};
    struct sockaddr_in *sa = (struct sockaddr_in *)&ifr.ifr_addr;
    sa->sin_family = AF_INET;
    inet_pton(AF_INET, addr, &sa->sin_addr);
    return ioctl(s, req, &ifr);
}

void egress_setup(void)
{
    _cleanup_close_ int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct ifreq ifr = {.ifr_name = EGRESS_IFACE};
    if (s < 0 || if_set_addr(s, SIOCSIFADDR, EGRESS_ADDR) < 0 ||
        if_set_addr(s, SIOCSIFNETMASK, EGRESS_NETMASK) < 0 || ioctl(s, SIOCGIFFLAGS, &ifr) < 0) {
        agent_log("cannot configure %s: %s", EGRESS_IFACE, strerror(errno));
        return;
    }
    ifr.ifr_flags |= IFF_UP;
    if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0)
        agent_log("cannot bring up %s: %s", EGRESS_IFACE, strerror(errno));
    /* Every process the agent starts inherits these: curl, pip, apt and python's urllib read
     * the lower-case ones, some tools only the upper-case. No DNS in the guest: the proxy
     * resolves names. */
    static const char *const vars[] = {"http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
        setenv(vars[i], "http://127.0.0.1:3128", 1);
    setenv("no_proxy", "localhost,127.0.0.1,::1", 1);
    setenv("NO_PROXY", "localhost,127.0.0.1,::1", 1);
}

struct half {
    int from, to;
    char buf[EGRESS_BUF];
    size_t len, off;
    bool eof, done;
};

struct pair {
    bool used;
    int fd[2];        /* the program, the tunnel */
    struct half h[2]; /* program to tunnel, tunnel to program */
};

struct pending {
    int fd;
    uint64_t deadline_ms;
    size_t got;
    unsigned char key[AL_EGRESS_KEY_LEN];
};

static struct pair pairs[EGRESS_PAIRS_MAX];
static struct pending pending[EGRESS_PENDING_MAX];
static int npending;
static unsigned char key[AL_EGRESS_KEY_LEN];
static bool have_key;
static int idle[EGRESS_IDLE_MAX], nidle;
static int waiting[EGRESS_WAITING_MAX], nwaiting;
static void pair_close(struct pair *p);
static int flush_pipe[2] = {-1, -1}; /* SIGUSR1 (egress_flush) wakes the loop through it */

static void on_flush(int sig)
{
    (void)sig;
    int e = errno;
    if (write(flush_pipe[1], "f", 1) < 0) {
        /* full: a flush is pending already */
    }
    errno = e;
}

/* Every connection goes: programs' (their peers are gone after a restore) and tunnels. */
static void flush_all(void)
{
    char buf[64];
    while (read(flush_pipe[0], buf, sizeof(buf)) > 0) {
    }
    for (int i = 0; i < nidle; i++)
        close(idle[i]);
    nidle = 0;
    for (int i = 0; i < npending; i++)
        close(pending[i].fd);
    npending = 0;
    for (int i = 0; i < nwaiting; i++)
        close(waiting[i]);
    nwaiting = 0;
    for (size_t i = 0; i < EGRESS_PAIRS_MAX; i++)
        if (pairs[i].used)
            pair_close(&pairs[i]);
    /* A fork of the session has a key of its own, written after its handshake: read anew. */
    explicit_bzero(key, sizeof(key));
    have_key = false;
}

/* The agent is forked after the forwarder, so it holds its pid here (none on the host's test
 * agents, which never start one). */
static pid_t egress_pid;

void egress_flush(void)
{
    if (egress_pid > 0)
        kill(egress_pid, SIGUSR1);
}

static int listen_on(const char *addr, int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, addr, &sa.sin_addr);
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
        bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 64) < 0) {
        agent_log("egress: cannot listen on %s:%d: %s", addr, port, strerror(errno));
        _exit(1);
    }
    return fd;
}

static void pair_close(struct pair *p)
{
    close(p->fd[0]);
    close(p->fd[1]);
    p->used = false;
}

static void pair_start(int prog, int tunnel)
{
    for (size_t i = 0; i < EGRESS_PAIRS_MAX; i++) {
        if (pairs[i].used)
            continue;
        struct pair *p = &pairs[i];
        *p = (struct pair){.used = true, .fd = {prog, tunnel}};
        p->h[0].from = prog, p->h[0].to = tunnel;
        p->h[1].from = tunnel, p->h[1].to = prog;
        return;
    }
    close(prog);
    close(tunnel);
}

/* Moves what it can in one direction; false when the pair is broken. */
static bool half_step(struct half *h, short rev_from, short rev_to)
{
    if (h->done)
        return true;
    if (h->len == 0 && !h->eof && (rev_from & (POLLIN | POLLHUP | POLLERR))) {
        ssize_t n = read(h->from, h->buf, sizeof(h->buf));
        if (n < 0 && errno != EAGAIN && errno != EINTR)
            return false;
        if (n == 0)
            h->eof = true;
        if (n > 0)
            h->len = (size_t)n, h->off = 0;
    }
    if (h->len > 0 && (rev_to & (POLLOUT | POLLERR | POLLHUP))) {
        ssize_t n = send(h->to, h->buf + h->off, h->len, MSG_NOSIGNAL);
        if (n < 0 && errno != EAGAIN && errno != EINTR)
            return false;
        if (n > 0)
            h->off += (size_t)n, h->len -= (size_t)n;
    }
    if (h->eof && h->len == 0) {
        shutdown(h->to, SHUT_WR);
        h->done = true;
    }
    return true;
}

static int accept_nb(int lfd)
{
    return accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
}

static uint64_t now_ms(void)
{
    return now_us() / 1000;
}

/* The key the host wrote before it opened the first tunnel; read once it is needed. */
static bool key_load(void)
{
    if (have_key)
        return true;
    _cleanup_close_ int fd = open(AL_EGRESS_KEY_PATH, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return false;
    have_key = read(fd, key, sizeof(key)) == (ssize_t)sizeof(key);
    return have_key;
}

static void pending_drop(int i)
{
    close(pending[i].fd);
    pending[i] = pending[--npending];
}

static void pending_add(int fd)
{
    if (npending == EGRESS_PENDING_MAX) { /* the oldest goes */
        int oldest = 0;
        for (int i = 1; i < npending; i++)
            if (pending[i].deadline_ms < pending[oldest].deadline_ms)
                oldest = i;
        pending_drop(oldest);
    }
    pending[npending++] = (struct pending){.fd = fd, .deadline_ms = now_ms() + EGRESS_AUTH_MS};
}

/* Reads what a pending tunnel sent of the key. True when it is done with (became idle, or was
 * dropped): the caller removes it from the pending list then. */
static bool pending_step(struct pending *p)
{
    ssize_t n = read(p->fd, p->key + p->got, sizeof(p->key) - p->got);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return false;
    if (n <= 0) {
        close(p->fd);
        return true;
    }
    p->got += (size_t)n;
    if (p->got < sizeof(p->key))
        return false;
    unsigned char diff = 0;
    bool known = key_load();
    for (size_t i = 0; i < sizeof(key); i++)
        diff |= (unsigned char)(p->key[i] ^ key[i]);
    if (!known || diff != 0 || nidle == EGRESS_IDLE_MAX)
        close(p->fd);
    else
        idle[nidle++] = p->fd;
    return true;
}

static _Noreturn void egress_run(void)
{
    prctl(PR_SET_NAME, "airlock-egress");
    signal(SIGPIPE, SIG_IGN);
    int lprog = listen_on("127.0.0.1", EGRESS_PROXY_PORT);
    int ltun = listen_on(EGRESS_ADDR, EGRESS_TUNNEL_PORT);
    if (pipe2(flush_pipe, O_CLOEXEC | O_NONBLOCK) < 0)
        _exit(1);
    /* SIGUSR1 was blocked across the fork (egress_start): a flush asked for before now is
     * delivered here, to the handler, instead of killing us. */
    struct sigaction sa = {.sa_handler = on_flush};
    sigaction(SIGUSR1, &sa, NULL);
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    sigprocmask(SIG_UNBLOCK, &usr1, NULL);
    static struct pollfd pfd[3 + EGRESS_PENDING_MAX + EGRESS_IDLE_MAX + 2 * EGRESS_PAIRS_MAX];
    for (;;) {
        /* First come, first served: the host caps the tunnels, so programs queue here. */
        while (nidle > 0 && nwaiting > 0) {
            pair_start(waiting[0], idle[--nidle]);
            memmove(waiting, waiting + 1, (size_t)--nwaiting * sizeof(waiting[0]));
        }
        size_t n = 0;
        pfd[n++] =
            (struct pollfd){.fd = nwaiting < EGRESS_WAITING_MAX ? lprog : -1, .events = POLLIN};
        pfd[n++] = (struct pollfd){.fd = ltun, .events = POLLIN};
        pfd[n++] = (struct pollfd){.fd = flush_pipe[0], .events = POLLIN};
        size_t pending_at = n;
        int npolled = npending, timeout = -1;
        uint64_t now = now_ms();
        for (int i = 0; i < npending; i++) {
            pfd[n++] = (struct pollfd){.fd = pending[i].fd, .events = POLLIN};
            uint64_t left = pending[i].deadline_ms > now ? pending[i].deadline_ms - now : 0;
            if (timeout < 0 || left < (uint64_t)timeout)
                timeout = (int)left;
        }
        size_t idle_at = n;
        for (int i = 0; i < nidle; i++)
            pfd[n++] = (struct pollfd){.fd = idle[i], .events = POLLIN}; /* closed by the host */
        size_t pairs_at = n;
        for (size_t i = 0; i < EGRESS_PAIRS_MAX; i++) {
            struct pair *p = &pairs[i];
            for (int k = 0; k < 2; k++) {
                short ev = 0;
                if (p->used && !p->h[k].done && p->h[k].len == 0 && !p->h[k].eof)
                    ev |= POLLIN;
                if (p->used && !p->h[1 - k].done && p->h[1 - k].len > 0)
                    ev |= POLLOUT;
                pfd[pairs_at + 2 * i + k] =
                    (struct pollfd){.fd = p->used ? p->fd[k] : -1, .events = ev};
            }
        }
        n = pairs_at + 2 * EGRESS_PAIRS_MAX;
        if (poll(pfd, n, timeout) < 0)
            continue;
        if (pfd[2].revents) {
            flush_all();
            continue;
        }
        if (pfd[0].revents & POLLIN) {
            int fd = accept_nb(lprog);
            if (fd >= 0)
                waiting[nwaiting++] = fd;
        }
        /* Pending tunnels first (backwards, as removal moves the last into the gap), then the
         * new ones, which join them. */
        now = now_ms();
        for (int i = npolled - 1; i >= 0; i--) {
            if (!pfd[pending_at + (size_t)i].revents) {
                if (now >= pending[i].deadline_ms)
                    pending_drop(i); /* never sent the key in time */
            } else if (pending_step(&pending[i])) {
                pending[i] = pending[--npending]; /* its fd is idle now, or closed */
            }
        }
        if (pfd[1].revents & POLLIN) {
            int fd = accept_nb(ltun);
            if (fd >= 0)
                pending_add(fd);
        }
        /* An idle tunnel that becomes readable was closed by the host (it never speaks
         * first): drop it. Walk backwards so removal keeps the indices below valid. */
        for (int i = (int)(pairs_at - idle_at) - 1; i >= 0; i--) {
            if (!pfd[idle_at + (size_t)i].revents)
                continue;
            close(idle[i]);
            idle[i] = idle[--nidle];
        }
        for (size_t i = 0; i < EGRESS_PAIRS_MAX; i++) {
            struct pair *p = &pairs[i];
            if (!p->used)
                continue;
            short r0 = pfd[pairs_at + 2 * i].revents, r1 = pfd[pairs_at + 2 * i + 1].revents;
            if (!half_step(&p->h[0], r0, r1) || !half_step(&p->h[1], r1, r0) ||
                (p->h[0].done && p->h[1].done))
                pair_close(p);
        }
    }
}

void egress_start(void)
{
    sigset_t usr1, old;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    sigprocmask(SIG_BLOCK, &usr1, &old);
    pid_t pid = fork();
    if (pid == 0)
        egress_run();
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (pid < 0) {
        agent_log("cannot start the egress forwarder: %s", strerror(errno));
        return;
    }
    egress_pid = pid;
}

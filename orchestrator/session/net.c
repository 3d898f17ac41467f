/* Network on request: a session opened with an allowlist reaches the HTTP(S) hosts on it, and
 * nothing else, through a Squid of its own on the host.
 *
 *   guest program ─► 127.0.0.1:3128 (guest-agent/egress.c) ─► a tunnel the host opened into the
 *   guest (QEMU user network, restrict=on, one host forward) ─► the relay thread here, which
 *   counts bytes ─► Squid on 127.0.0.1 (allowlist by name, forbidden addresses after DNS,
 *   ports 80/443, connection and size caps) ─► the host.
 *
 * The guest cannot open a connection anywhere (restrict=on): QEMU's guestfwd carries one stream
 * per rule and its cmd: form needs a fork that libvirt's seccomp sandbox forbids, so the host
 * opens the connections (a few kept idle) and the guest's forwarder hands each to a program.
 * Squid runs unprivileged (as the proxy user when we are root), one per session, with its
 * configuration, logs and pid in the session's runtime dir; its access log is read back, with
 * bounds, into the session's list of requests.
 *
 * Both host-side hops are TCP on the host's loopback, which every local user can reach, so each
 * is authenticated. The forward: the host writes a random key into the guest over the agent's
 * channel (AL_EGRESS_KEY_PATH) and sends it first on each tunnel; the guest's forwarder uses no
 * tunnel that did not. Squid: it takes only connections that start with a PROXY protocol header
 * (require-proxy-header), and serves only the source address that header claims, a random
 * IPv6 address known to this process and the session's 0600 squid.conf. */
#include "net.h"
#include "session.h"
#include "transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Where the guest's forwarder accepts the host's tunnels (guest-agent/egress.c). */
#define NET_GUEST_TUNNEL_PORT AL_NET_GUEST_TUNNEL_PORT
/* Tunnels kept open and idle in the guest, ready for a program's next connection. */
#define NET_IDLE_TUNNELS 4
#define NET_BUF (64 * 1024)
/* Requests kept per session; older ones are dropped (and counted). */
#define NET_REQUESTS_MAX 4096
/* An access-log line longer than this is not one Squid wrote for our format: skipped. */
#define NET_LOG_LINE_MAX 4096
/* Squid's start under emulation's load: usually under a second. */
#define NET_START_TIMEOUT_MS 20000
/* After SIGTERM (shutdown_lifetime 0), then SIGKILL. */
#define NET_STOP_GRACE_MS 3000
/* How often the keeper looks whether Squid ended by itself. */
#define NET_KEEPER_TICK_MS 200
/* Backoff between tunnel attempts while the guest's forwarder is not listening yet. */
#define NET_RETRY_MIN_MS 20
#define NET_RETRY_MAX_MS 500
/* A tunnel the guest held this long was accepted by its forwarder. */
#define NET_SETTLED_MS 1000

struct half {
    char buf[NET_BUF];
    size_t len, off;
    bool eof, done;
};

struct tunnel {
    int g, p; /* QEMU's forward (the guest), Squid; -1 when unused / not yet */
    bool active;
    uint64_t opened_ms; /* when the relay connected it */
    struct half h[2];   /* guest to proxy, proxy to guest */
};

struct al_net {
    char dir[AL_PATH_MAX]; /* the session's runtime dir /net */
    char conf[AL_PATH_MAX], log[AL_PATH_MAX], out[AL_PATH_MAX];
    pid_t squid; /* the keeper, whose child Squid is */
    int life;    /* the keeper's stdin: Squid lives while this is open */
    unsigned squid_port, fwd_port;
    unsigned char key[AL_EGRESS_KEY_LEN]; /* sent first on each tunnel into the guest */
    char relay_addr[INET6_ADDRSTRLEN];    /* the source the PROXY header claims to Squid */
    unsigned char relay_in6[16];
    char proxy_hdr[128];
    size_t proxy_hdr_len;
    uint64_t bytes_max;
    unsigned conns_max;
    char **allow;
    size_t nallow;
    pthread_t relay;
    bool relay_running;
    int stop[2];
    struct tunnel *tun; /* conns_max + NET_IDLE_TUNNELS */
    size_t ntun;
    pthread_mutex_t mu; /* guards what follows: the relay and the readers of requests */
    uint64_t bytes;
    bool capped;
    al_net_request *req; /* ring of NET_REQUESTS_MAX */
    size_t nreq_total;   /* ever recorded; the ring holds the last NET_REQUESTS_MAX */
    off_t log_off;
    uint64_t resets_asked, resets_done; /* al_net_reset waits for the relay to catch up */
    pthread_cond_t reset_cv;
};

/* ---- allowlists ---- */

bool al_net_host_pattern_ok(const char *p)
{
    const char *name = !strncmp(p, "*.", 2) ? p + 2 : p;
    size_t n = strlen(name);
    if (n == 0 || n > 253 || name[0] == '.' || name[n - 1] == '.' || name[0] == '-')
        return false;
    for (const char *c = name; *c; c++) {
        bool ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
                  (*c >= '0' && *c <= '9') || *c == '-' || *c == '.';
        if (!ok || (c[0] == '.' && c[1] == '.'))
            return false;
    }
    return true;
}

void al_net_allow_free(char **allow)
{
    for (char **a = allow; a && *a; a++)
        free(*a);
    free(allow);
}

int al_net_allow_parse(const char *list, char ***out, al_error *err)
{
    size_t cap = 1;
    for (const char *c = list; *c; c++)
        cap += *c == ',';
    if (cap > AL_NET_ALLOW_MAX)
        return al_err(err, -E2BIG, "more than %d hosts in the allowlist", AL_NET_ALLOW_MAX);
    char **v = calloc(cap + 1, sizeof(char *));
    _cleanup_free_ char *copy = strdup(list);
    if (!v || !copy) {
        free(v);
        return al_err(err, -ENOMEM, "out of memory");
    }
    size_t n = 0;
    char *save = NULL;
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        while (*t == ' ')
            t++;
        for (size_t e = strlen(t); e > 0 && t[e - 1] == ' ';)
            t[--e] = '\0';
        if (!*t)
            continue;
        if (!al_net_host_pattern_ok(t)) {
            char safe[128];
            al_net_allow_free(v);
            return al_err(err, -EINVAL,
                          "'%s' is not a host name or *.suffix pattern for the allowlist",
                          al_term_escape(t, safe, sizeof(safe)));
        }
        for (char *c = t; *c; c++)
            if (*c >= 'A' && *c <= 'Z')
                *c = (char)(*c - 'A' + 'a');
        if (!(v[n++] = strdup(t))) {
            al_net_allow_free(v);
            return al_err(err, -ENOMEM, "out of memory");
        }
    }
    if (n == 0) {
        al_net_allow_free(v);
        return al_err(err, -EINVAL, "the allowlist is empty (for no network use --net none)");
    }
    *out = v;
    return 0;
}

int al_net_spec_parse(const char *spec, char ***out, al_error *err)
{
    if (!strcmp(spec, "none")) {
        *out = NULL;
        return 0;
    }
    if (strncmp(spec, "allow=", 6) != 0)
        return al_err(err, -EINVAL, "unknown network setting '%s' (none, allow=HOST[,HOST...])",
                      spec);
    return al_net_allow_parse(spec + 6, out, err);
}

static bool host_allowed(char *const *allow, const char *host)
{
    size_t hl = strlen(host);
    for (size_t i = 0; allow && allow[i]; i++) {
        const char *a = allow[i];
        if (!strncmp(a, "*.", 2)) {
            /* Squid's .suffix matches the suffix itself and every name under it. */
            size_t sl = strlen(a + 1);
            if (!strcasecmp(host, a + 2) || (hl > sl && !strcasecmp(host + hl - sl, a + 1)))
                return true;
        } else if (!strcasecmp(host, a)) {
            return true;
        }
    }
    return false;
}

/* ---- the requests ---- */

static void record(struct al_net *n, const al_net_request *r)
{
    n->req[n->nreq_total % NET_REQUESTS_MAX] = *r;
    n->nreq_total++;
}

static void copy_field(char *dst, size_t len, const char *src)
{
    snprintf(dst, len, "%s", src);
    for (char *c = dst; *c; c++)
        if ((unsigned char)*c < 0x21 || (unsigned char)*c > 0x7e)
            *c = '?';
}

/* One line of our logformat, after its client address: "%ts.%03tu %rm %>rd %>rP %>Hs %<st %>st %Ss
 * %err_code". Squid writes it, but the host and method are the guest's words: printable ASCII only,
 * bounded. Squid 5.7 keeps no space in them (it drops those of "CONNECT [a b]:443"), but a proxy
 * that did must not shift the fields after the host (a forged "200 ... TCP_TUNNEL" in it): the host
 * is whatever lies between the method and Squid's own last six words. */
int al_net_log_line(char *const *allow, char *line, al_net_request *out)
{
    char *w[NET_LOG_LINE_MAX / 2 + 1], *save = NULL;
    size_t k = 0;
    for (char *t = strtok_r(line, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
        if (k == sizeof(w) / sizeof(w[0]))
            return 0;
        w[k++] = t;
    }
    if (k < 9)
        return 0;
    /* The host's words joined again: the NUL strtok_r put after each was a space. */
    for (size_t i = 2; i + 7 < k; i++)
        w[i][strlen(w[i])] = ' ';
    char *f[9] = {w[0], w[1], w[2], w[k - 6], w[k - 5], w[k - 4], w[k - 3], w[k - 2], w[k - 1]};
    al_net_request r = AL_NET_REQUEST_INIT;
    double t = strtod(f[0], NULL);
    r.time_ms = t > 0 && t < 1e12 ? (int64_t)(t * 1000.0) : 0; /* no float-to-int overflow */
    copy_field(r.method, sizeof(r.method), f[1]);
    copy_field(r.host, sizeof(r.host), f[2]);
    r.port = (unsigned)strtoul(f[3], NULL, 10);
    r.status = (unsigned)strtoul(f[4], NULL, 10);
    r.bytes = strtoull(f[5], NULL, 10) + strtoull(f[6], NULL, 10);
    const char *code = f[8];
    bool no_request = !strcmp(f[1], "-");
    /* A connection that ended before it carried a request (an idle keep-alive, the relay
     * closing at the byte cap): not a request. */
    if (no_request && (!strcmp(code, "ERR_CLIENT_GONE") || !strcmp(code, "-")))
        return 0;
    bool denied = strstr(f[7], "DENIED") || !strcmp(code, "ERR_TOO_BIG") ||
                  !strcmp(code, "ERR_ACCESS_DENIED") || no_request;
    r.allowed = !denied;
    if (!strcmp(code, "ERR_TOO_BIG"))
        snprintf(r.why, sizeof(r.why),
                 "the request or reply from %s exceeds the session's byte cap or size limits",
                 r.host);
    else if (no_request)
        snprintf(r.why, sizeof(r.why),
                 "the proxy refused a malformed, oversized or unfinished request (%s, status %u)",
                 code, r.status);
    else if (denied && r.port != 80 && r.port != 443)
        snprintf(r.why, sizeof(r.why), "port %u is not allowed (only 80 and 443)", r.port);
    else if (denied && !host_allowed(allow, r.host))
        snprintf(r.why, sizeof(r.why), "host %s is not in the allowlist; ask the user to allow it",
                 r.host);
    else if (denied)
        snprintf(r.why, sizeof(r.why),
                 "host %s resolves to an address the proxy does not reach (loopback, private, "
                 "link-local, multicast or this host's)",
                 r.host);
    else if (strcmp(code, "-") != 0)
        snprintf(r.why, sizeof(r.why), "the request to %s failed (%s)", r.host, code);
    al_printable(r.why); /* code and status are Squid's, but the line is only a file */
    *out = r;
    return 1;
}

/* Reads what Squid appended since the last call. Caller holds mu. */
static void log_read(struct al_net *n)
{
    int fd = open(n->log, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return;
    FILE *f = fdopen(fd, "r");
    if (!f) {
        close(fd);
        return;
    }
    if (fseeko(f, n->log_off, SEEK_SET) == 0) {
        char line[NET_LOG_LINE_MAX];
        bool skipping = false;
        while (fgets(line, sizeof(line), f)) {
            size_t len = strlen(line);
            if (len == 0 || line[len - 1] != '\n') {
                if (feof(f))
                    break;       /* a line Squid is still writing: read it next time */
                skipping = true; /* too long: skip to its end */
                n->log_off += (off_t)len;
                continue;
            }
            n->log_off += (off_t)len;
            if (skipping) {
                skipping = false;
                continue;
            }
            line[len - 1] = '\0';
            /* Our format puts the client first: only the relay's lines are the guest's (another
             * local user's connections to the port are 127.0.0.1's, and refused). */
            char *rest = strchr(line, ' ');
            struct in6_addr a;
            if (!rest)
                continue;
            *rest++ = '\0';
            if (inet_pton(AF_INET6, line, &a) != 1 || memcmp(&a, n->relay_in6, sizeof(a)) != 0)
                continue;
            al_net_request r = AL_NET_REQUEST_INIT;
            if (al_net_log_line(n->allow, rest, &r) > 0)
                record(n, &r);
        }
    }
    fclose(f);
}

int al_net_requests(al_session *s, size_t *cursor, void (*fn)(void *ctx, const al_net_request *r),
                    void *ctx, al_error *err)
{
    struct al_net *n = s->net;
    if (!n)
        return al_err(err, -ENOTSUP, "the session has no network (--net none)");
    pthread_mutex_lock(&n->mu);
    log_read(n);
    size_t from = cursor ? *cursor : 0;
    if (n->nreq_total > NET_REQUESTS_MAX && from < n->nreq_total - NET_REQUESTS_MAX)
        from = n->nreq_total - NET_REQUESTS_MAX;
    size_t count = 0;
    for (size_t i = from; i < n->nreq_total; i++, count++) {
        al_net_request r = n->req[i % NET_REQUESTS_MAX];
        fn(ctx, &r);
    }
    if (cursor)
        *cursor = n->nreq_total;
    pthread_mutex_unlock(&n->mu);
    return (int)(count > INT32_MAX ? INT32_MAX : count);
}

bool al_session_net(const al_session *s)
{
    return s->net != NULL;
}

/* ---- the relay: tunnels into the guest, each spliced to Squid once the guest speaks ---- */

static int connect_local(unsigned port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        close(fd);
        return -1;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
}

/* A fresh connection's first bytes, all at once: a socket's empty send buffer takes them. */
static bool send_first(int fd, const void *buf, size_t len)
{
    return send(fd, buf, len, MSG_NOSIGNAL) == (ssize_t)len;
}

/* A tunnel into the guest: QEMU's forward, then the key that makes the guest's forwarder use
 * it. */
static int tunnel_open(struct al_net *n)
{
    int fd = connect_local(n->fwd_port);
    if (fd >= 0 && !send_first(fd, n->key, sizeof(n->key))) {
        close(fd);
        return -1;
    }
    return fd;
}

/* A connection to Squid, which serves it only after the PROXY header with the relay's address. */
static int proxy_open(struct al_net *n)
{
    int fd = connect_local(n->squid_port), one = 1;
    /* No Nagle: the guest's first bytes follow the header at once, not after Squid's ACK. */
    if (fd >= 0)
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (fd >= 0 && !send_first(fd, n->proxy_hdr, n->proxy_hdr_len)) {
        close(fd);
        return -1;
    }
    return fd;
}

static void fd_close(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

static void tunnel_close(struct tunnel *t)
{
    fd_close(&t->g);
    fd_close(&t->p);
    t->active = false;
}

/* How many of up to want bytes may still pass under the session's byte cap (0: none). */
static size_t net_allowance(struct al_net *n, size_t want)
{
    pthread_mutex_lock(&n->mu);
    uint64_t left = n->bytes < n->bytes_max ? n->bytes_max - n->bytes : 0;
    pthread_mutex_unlock(&n->mu);
    return left < want ? (size_t)left : want;
}

/* Moves what it can one way; counts the bytes. False when the tunnel is broken. */
static bool half_step(struct al_net *n, struct half *h, int from, int to, short rev_from,
                      short rev_to)
{
    if (h->done)
        return true;
    if (h->len == 0 && !h->eof && (rev_from & (POLLIN | POLLHUP | POLLERR))) {
        /* Never more than the cap leaves: a read takes at most what is still allowed, and at
         * the cap one byte is read and dropped, which puts the count past it (the relay then
         * closes every tunnel). */
        size_t want = net_allowance(n, sizeof(h->buf));
        ssize_t r = read(from, h->buf, want ? want : 1);
        if (r < 0 && errno != EAGAIN && errno != EINTR)
            return false;
        if (r == 0)
            h->eof = true;
        if (r > 0) {
            if (want)
                h->len = (size_t)r, h->off = 0;
            pthread_mutex_lock(&n->mu);
            n->bytes += (uint64_t)r;
            pthread_mutex_unlock(&n->mu);
        }
    }
    if (h->len > 0 && (rev_to & (POLLOUT | POLLERR | POLLHUP))) {
        ssize_t w = send(to, h->buf + h->off, h->len, MSG_NOSIGNAL);
        if (w < 0 && errno != EAGAIN && errno != EINTR)
            return false;
        if (w > 0)
            h->off += (size_t)w, h->len -= (size_t)w;
    }
    if (h->eof && h->len == 0) {
        shutdown(to, SHUT_WR);
        h->done = true;
    }
    return true;
}

/* Past the byte cap: every tunnel is closed, the event recorded once, and each later
 * connection gets this answer instead of the proxy. */
static void cap_reached(struct al_net *n)
{
    pthread_mutex_lock(&n->mu);
    if (!n->capped) {
        n->capped = true;
        al_net_request r = {.struct_size = sizeof(al_net_request),
                            .time_ms = (int64_t)time(NULL) * 1000,
                            .bytes = n->bytes};
        snprintf(r.method, sizeof(r.method), "-");
        snprintf(r.host, sizeof(r.host), "-");
        snprintf(r.why, sizeof(r.why),
                 "the session's network byte cap (%llu bytes) is used up: transfers stopped",
                 (unsigned long long)n->bytes_max);
        log_read(n); /* what came before, first */
        record(n, &r);
    }
    pthread_mutex_unlock(&n->mu);
}

static void answer_capped(struct al_net *n, int fd)
{
    char msg[512];
    int len = snprintf(msg, sizeof(msg),
                       "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: "
                       "close\r\nContent-Length: %zu\r\nX-Airlock-Blocked: byte-cap\r\n\r\n%s",
                       strlen("airlock: the session's network byte cap is used up\n"),
                       "airlock: the session's network byte cap is used up\n");
    (void)n;
    if (send(fd, msg, (size_t)len, MSG_NOSIGNAL) < 0)
        return;
}

static void *relay_main(void *arg)
{
    struct al_net *n = arg;
    unsigned backoff = NET_RETRY_MIN_MS;
    uint64_t retry_at = 0;
    struct pollfd *pfd = calloc(1 + 2 * n->ntun, sizeof(*pfd));
    if (!pfd)
        return NULL;
    for (;;) {
        size_t idle = 0, active = 0;
        for (size_t i = 0; i < n->ntun; i++) {
            idle += n->tun[i].g >= 0 && !n->tun[i].active;
            active += n->tun[i].active;
        }
        uint64_t now = al_now_ms();
        /* Keep a few tunnels ready, within the connection cap. */
        while (idle < NET_IDLE_TUNNELS && idle + active < n->ntun && now >= retry_at) {
            size_t i = 0;
            while (i < n->ntun && n->tun[i].g >= 0)
                i++;
            if (i == n->ntun)
                break;
            int fd = tunnel_open(n);
            if (fd < 0) { /* QEMU not listening yet */
                retry_at = now + backoff;
                backoff = backoff * 2 > NET_RETRY_MAX_MS ? NET_RETRY_MAX_MS : backoff * 2;
                break;
            }
            n->tun[i] = (struct tunnel){.g = fd, .p = -1, .opened_ms = now};
            idle++;
        }
        pfd[0] = (struct pollfd){.fd = n->stop[0], .events = POLLIN};
        for (size_t i = 0; i < n->ntun; i++) {
            struct tunnel *t = &n->tun[i];
            short eg = 0, ep = 0;
            if (t->g >= 0 && !t->active)
                eg = POLLIN;
            if (t->active) {
                if (!t->h[0].done && t->h[0].len == 0 && !t->h[0].eof)
                    eg |= POLLIN;
                if (t->h[0].len > 0)
                    ep |= POLLOUT;
                if (!t->h[1].done && t->h[1].len == 0 && !t->h[1].eof)
                    ep |= POLLIN;
                if (t->h[1].len > 0)
                    eg |= POLLOUT;
            }
            pfd[1 + 2 * i] = (struct pollfd){.fd = t->g, .events = eg};
            pfd[2 + 2 * i] = (struct pollfd){.fd = t->p, .events = ep};
        }
        int timeout = -1;
        if (idle < NET_IDLE_TUNNELS && idle + active < n->ntun)
            timeout = retry_at > now ? (int)(retry_at - now) : 0;
        if (poll(pfd, 1 + 2 * n->ntun, timeout) < 0 && errno != EINTR)
            break;
        if (pfd[0].revents) {
            char cmd = 'x';
            if (read(n->stop[0], &cmd, 1) == 1 && cmd == 'r') {
                /* A restored guest: every tunnel from before leads nowhere now. */
                for (size_t i = 0; i < n->ntun; i++)
                    tunnel_close(&n->tun[i]);
                backoff = NET_RETRY_MIN_MS;
                retry_at = 0;
                pthread_mutex_lock(&n->mu);
                n->resets_done++;
                pthread_cond_broadcast(&n->reset_cv);
                pthread_mutex_unlock(&n->mu);
                continue;
            }
            break;
        }
        for (size_t i = 0; i < n->ntun; i++) {
            struct tunnel *t = &n->tun[i];
            short rg = pfd[1 + 2 * i].revents, rp = pfd[2 + 2 * i].revents;
            if (t->g < 0 || !(rg | rp))
                continue;
            if (!t->active) {
                /* The guest speaks first: a program's request. EOF: QEMU's forward found
                 * nobody listening in the guest yet (or the guest dropped the tunnel). */
                size_t want = net_allowance(n, sizeof(t->h[0].buf));
                ssize_t r = read(t->g, t->h[0].buf, want ? want : 1);
                if (r <= 0) {
                    if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
                        /* Dropped at once: nobody listens in the guest yet, back off. Dropped
                         * after a while: the guest's forwarder flushed (a HELLO), replace it. */
                        bool settled = al_now_ms() - t->opened_ms > NET_SETTLED_MS;
                        tunnel_close(t);
                        if (settled)
                            backoff = NET_RETRY_MIN_MS;
                        retry_at = al_now_ms() + (settled ? 0 : backoff);
                        if (!settled)
                            backoff =
                                backoff * 2 > NET_RETRY_MAX_MS ? NET_RETRY_MAX_MS : backoff * 2;
                    }
                    continue;
                }
                backoff = NET_RETRY_MIN_MS;
                pthread_mutex_lock(&n->mu);
                n->bytes += (uint64_t)r;
                bool capped = n->capped || n->bytes > n->bytes_max;
                pthread_mutex_unlock(&n->mu);
                if (capped || (t->p = proxy_open(n)) < 0) {
                    if (capped)
                        answer_capped(n, t->g);
                    tunnel_close(t);
                    continue;
                }
                fcntl(t->g, F_SETFL, fcntl(t->g, F_GETFL) | O_NONBLOCK);
                t->active = true;
                t->h[0].len = (size_t)r, t->h[0].off = 0;
                t->h[0].eof = t->h[0].done = false;
                t->h[1] = (struct half){0};
                continue;
            }
            if (!half_step(n, &t->h[0], t->g, t->p, rg, rp) ||
                !half_step(n, &t->h[1], t->p, t->g, rp, rg) || (t->h[0].done && t->h[1].done))
                tunnel_close(t);
        }
        pthread_mutex_lock(&n->mu);
        bool over = !n->capped && n->bytes > n->bytes_max;
        pthread_mutex_unlock(&n->mu);
        if (over) {
            cap_reached(n);
            for (size_t i = 0; i < n->ntun; i++)
                if (n->tun[i].active)
                    tunnel_close(&n->tun[i]);
        }
    }
    free(pfd);
    return NULL;
}

/* ---- Squid ---- */

/* The host's own addresses: a name that resolves to one of them is refused like loopback. */
static void write_host_addrs(FILE *f)
{
    struct ifaddrs *ifa = NULL;
    if (getifaddrs(&ifa) < 0)
        return;
    for (struct ifaddrs *i = ifa; i; i = i->ifa_next) {
        char a[INET6_ADDRSTRLEN];
        if (!i->ifa_addr)
            continue;
        if (i->ifa_addr->sa_family == AF_INET)
            inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, a, sizeof(a));
        else if (i->ifa_addr->sa_family == AF_INET6)
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr, a, sizeof(a));
        else
            continue;
        if (!strchr(a, '%'))
            fprintf(f, " %s", a);
    }
    freeifaddrs(ifa);
}

static int write_conf(struct al_net *n, const char *hosts, const char *user, al_error *err)
{
    int fd = open(n->conf, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return al_err(err, -e, "cannot write the proxy's configuration: %s", strerror(e));
    }
    /* Paths are the session dir's, which airlock names: no spaces or quotes in them. */
    fprintf(
        f,
        "# Generated by airlock for one session (orchestrator/session/net.c).\n"
        /* Only the relay: connections that open with a PROXY header (any other is closed),
         * served only for the address it claims (al_relay below). */
        "http_port 127.0.0.1:%u require-proxy-header\n"
        "proxy_protocol_access allow localhost\n"
        "proxy_protocol_access deny all\n"
        "acl al_relay src %s\n"
        "pid_filename %s/squid.pid\n"
        "cache_log %s/cache.log\n"
        "logformat airlock %%>a %%ts.%%03tu %%rm %%>rd %%>rP %%>Hs %%<st %%>st %%Ss %%err_code\n"
        "access_log stdio:%s logformat=airlock\n"
        "logfile_rotate 0\n"
        "coredump_dir %s\n"
        "cache deny all\n"
        "cache_mem 0 MB\n"
        "netdb_filename none\n"
        "pinger_enable off\n"
        "icp_port 0\n"
        "htcp_port 0\n"
        "shutdown_lifetime 0 seconds\n"
        "max_filedescriptors 1024\n"
        "forwarded_for delete\n"
        "via off\n"
        "httpd_suppress_version_string on\n"
        /* Caps: the relay holds the connections at once to the session's cap (Squid's own
         * per-address cap would count other local users' connections from 127.0.0.1
         * against the guest); a reply or request body over the session's byte cap is
         * refused up front when its length is known (the relay's count is the hard cap).
         * Slow or stuck clients, and connections that never send their PROXY header. */
        "reply_body_max_size %llu KB\n"
        "request_body_max_size %llu KB\n"
        "request_header_max_size 64 KB\n"
        "request_start_timeout 10 seconds\n"
        "request_timeout 10 seconds\n"
        "client_idle_pconn_timeout 10 seconds\n"
        "read_timeout 60 seconds\n"
        "connect_timeout 15 seconds\n"
        "client_lifetime 1 hour\n",
        n->squid_port, n->relay_addr, n->dir, n->dir, n->log, n->dir,
        (unsigned long long)(n->bytes_max / 1024 + 1),
        (unsigned long long)(n->bytes_max / 1024 + 1));
    if (user)
        fprintf(f, "cache_effective_user %s\n", user);
    if (hosts)
        /* A test resolver: only the names in this file resolve (no DNS server answers). */
        fprintf(f, "hosts_file %s\ndns_nameservers 127.0.0.1\n", hosts);
    /* -n: a URL with an address is not looked up backwards to a name that would match. */
    fputs("acl al_allowed dstdomain -n", f);
    for (size_t i = 0; i < n->nallow; i++)
        fprintf(f, " %s", !strncmp(n->allow[i], "*.", 2) ? n->allow[i] + 1 : n->allow[i]);
    fputs("\n"
          "acl al_ports port 80 443\n"
          "acl al_tls port 443\n"
          "acl al_connect method CONNECT\n"
          /* After resolution: loopback, this-network, private (RFC 1918, CGNAT, ULA),
           * link-local (cloud metadata), multicast, reserved, v4-mapped; the host's own. */
          "acl al_forbidden dst 0.0.0.0/8 10.0.0.0/8 100.64.0.0/10 127.0.0.0/8 169.254.0.0/16"
          " 172.16.0.0/12 192.0.0.0/24 192.168.0.0/16 224.0.0.0/4 240.0.0.0/4 ::/128 ::1"
          " ::ffff:0:0/96 fc00::/7 fe80::/10 ff00::/8",
          f);
    write_host_addrs(f);
    fputs("\n"
          "http_access deny !al_relay\n"
          "http_access deny !al_ports\n"
          "http_access deny al_connect !al_tls\n"
          "http_access deny !al_allowed\n"
          "http_access deny al_forbidden\n"
          "http_access allow al_allowed\n"
          "http_access deny all\n",
          f);
    if (fclose(f) != 0)
        return al_err(err, -EIO, "cannot write the proxy's configuration");
    return 0;
}

/* The last "FATAL" (or else last) line Squid wrote, printable only, for a failed start. */
static void squid_why(const struct al_net *n, char *out, size_t len)
{
    out[0] = '\0';
    const char *files[] = {n->out, NULL};
    char cache[AL_PATH_MAX];
    if (al_pathf(cache, sizeof(cache), "%s/cache.log", n->dir) == 0)
        files[1] = cache;
    for (size_t k = 0; k < 2 && files[k]; k++) {
        FILE *f = fopen(files[k], "re");
        char line[256];
        while (f && fgets(line, sizeof(line), f)) {
            line[strcspn(line, "\r\n")] = '\0';
            char *fatal = strstr(line, "FATAL");
            if (fatal || (!out[0] && line[0]))
                snprintf(out, len, "%s", fatal ? fatal : line);
        }
        if (f)
            fclose(f);
    }
    al_printable(out);
}

/* squid's path: from PATH, then the sbin dirs a user's PATH often lacks (Debian installs it in
 * /usr/sbin). A missing one is said before the VM boots, not after. */
static bool squid_find(char *out, size_t len)
{
    const char *path = getenv("PATH");
    char dirs[8192];
    snprintf(dirs, sizeof(dirs), "%s:/usr/sbin:/sbin", path ? path : "/usr/bin:/bin");
    for (const char *p = dirs; *p;) {
        size_t dl = strcspn(p, ":");
        if (dl > 0 && (size_t)snprintf(out, len, "%.*s/squid", (int)dl, p) < len &&
            access(out, X_OK) == 0)
            return true;
        p += dl + (p[dl] == ':');
    }
    return false;
}

/* The keeper: a child of ours that starts Squid and ends it when we end, however we end: its
 * stdin is a pipe whose only write end is ours, so EOF there is al_net_stop or our death, even by
 * SIGKILL (PR_SET_PDEATHSIG would not do: Squid drops privileges, which clears it). It exits
 * when Squid does, so waiting for it is waiting for Squid. We may have threads: between fork and
 * exec only async-signal-safe calls. */
static _Noreturn void keeper_main(int life, int out, const char *exe, const char *conf)
{
    /* Its own process group, Squid's too: the terminal's Ctrl-C is airlock's to handle. */
    setpgid(0, 0);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (dup2(life, 0) < 0 || dup2(out, 1) < 0 || dup2(out, 2) < 0)
        _exit(127);
    syscall(SYS_close_range, 3u, ~0u, 0u); /* none of airlock's fds stay open in here */
    pid_t squid = fork();
    if (squid == 0) {
        int in = open("/dev/null", O_RDONLY);
        if (in < 0 || dup2(in, 0) < 0)
            _exit(127);
        execl(exe, "squid", "-N", "-f", conf, (char *)NULL);
        dprintf(2, "FATAL: cannot run squid (install the squid package)\n");
        _exit(127);
    }
    if (squid < 0)
        _exit(127);
    int st;
    for (;;) {
        if (waitpid(squid, &st, WNOHANG) == squid)
            _exit(1); /* Squid ended by itself: a failed start, or a crash */
        struct pollfd p = {.fd = 0, .events = POLLIN};
        if (poll(&p, 1, NET_KEEPER_TICK_MS) > 0)
            break; /* EOF: airlock is done with it */
    }
    kill(squid, SIGTERM);
    for (int i = 0; i < NET_STOP_GRACE_MS / 10; i++) {
        if (waitpid(squid, &st, WNOHANG) == squid)
            _exit(0);
        poll(NULL, 0, 10);
    }
    kill(squid, SIGKILL);
    waitpid(squid, &st, 0);
    _exit(0);
}

static int squid_start(struct al_net *n, al_error *err)
{
    char exe[AL_PATH_MAX];
    if (!squid_find(exe, sizeof(exe)))
        return al_err(err, -ENOENT,
                      "the network proxy (squid) did not start: no squid in PATH or /usr/sbin "
                      "(install the squid package)");
    int life[2];
    if (pipe2(life, O_CLOEXEC) < 0)
        return al_err(err, -errno, "cannot start the network proxy: %s", strerror(errno));
    int out = open(n->out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (out < 0) {
        int e = errno;
        close(life[0]);
        close(life[1]);
        return al_err(err, -e, "cannot start the network proxy: %s", strerror(e));
    }
    pid_t pid = fork();
    if (pid == 0)
        keeper_main(life[0], out, exe, n->conf);
    int e = errno;
    close(out);
    close(life[0]);
    if (pid < 0) {
        close(life[1]);
        return al_err(err, -e, "cannot start the network proxy: %s", strerror(e));
    }
    n->squid = pid;
    n->life = life[1];
    return 0;
}

static int squid_wait_ready(struct al_net *n, al_error *err)
{
    uint64_t deadline = al_now_ms() + NET_START_TIMEOUT_MS;
    for (;;) {
        int st;
        if (waitpid(n->squid, &st, WNOHANG) == n->squid) {
            n->squid = 0;
            char why[300];
            squid_why(n, why, sizeof(why));
            return al_err(err, -EIO, "the network proxy (squid) did not start: %s",
                          why[0] ? why : "it exited");
        }
        int fd = proxy_open(n);
        if (fd >= 0) {
            close(fd);
            return 0;
        }
        if (al_now_ms() > deadline)
            return al_err(err, -ETIMEDOUT, "the network proxy (squid) did not start within %d s",
                          NET_START_TIMEOUT_MS / 1000);
        usleep(20 * 1000);
    }
}

/* Closing our end of the keeper's pipe makes it end Squid (SIGTERM, then SIGKILL after the
 * grace) and exit; a keeper that outlasts that is killed with its process group. */
static void squid_stop(struct al_net *n)
{
    fd_close(&n->life);
    if (n->squid <= 0)
        return;
    uint64_t deadline = al_now_ms() + NET_STOP_GRACE_MS + 2000;
    int st;
    while (waitpid(n->squid, &st, WNOHANG) == 0) {
        if (al_now_ms() > deadline) {
            kill(-n->squid, SIGKILL);
            waitpid(n->squid, &st, 0);
            break;
        }
        usleep(10 * 1000);
    }
    n->squid = 0;
}

/* Squid, when started by root, drops to this user; it must own the dir it writes in. */
static const char *proxy_user(uid_t *uid, gid_t *gid)
{
    static const char *const users[] = {"proxy", "nobody"};
    for (size_t i = 0; i < 2; i++) {
        struct passwd *pw = getpwnam(users[i]);
        if (pw) {
            *uid = pw->pw_uid;
            *gid = pw->pw_gid;
            return users[i];
        }
    }
    return NULL;
}

int al_net_prepare(al_session *s, const al_session_opts *opts, struct al_vm_config *cfg,
                   al_error *err)
{
    const al_net_opts *o = &opts->net;
    if (!o->allow || !o->allow[0])
        return 0;
    /* Images reached over SSH do not run our init, so nothing in them would carry programs'
     * connections to the tunnels. */
    if (s->tport && s->tport->ops->kind == AL_TRANSPORT_SSH)
        return al_err(err, -ENOTSUP, "--net allow=... is not available over the SSH transport");
    struct al_net *n = calloc(1, sizeof(*n));
    if (!n)
        return al_err(err, -ENOMEM, "out of memory");
    n->stop[0] = n->stop[1] = n->life = -1;
    pthread_mutex_init(&n->mu, NULL);
    pthread_cond_init(&n->reset_cv, NULL);
    s->net = n;
    for (const char *const *a = o->allow; *a; a++)
        n->nallow++;
    if (n->nallow > AL_NET_ALLOW_MAX)
        return al_err(err, -E2BIG, "more than %d hosts in the allowlist", AL_NET_ALLOW_MAX);
    n->allow = calloc(n->nallow + 1, sizeof(char *));
    if (!n->allow)
        return al_err(err, -ENOMEM, "out of memory");
    for (size_t i = 0; i < n->nallow; i++) {
        if (!al_net_host_pattern_ok(o->allow[i]))
            return al_err(err, -EINVAL, "'%s' is not a host name or *.suffix pattern", o->allow[i]);
        if (!(n->allow[i] = strdup(o->allow[i])))
            return al_err(err, -ENOMEM, "out of memory");
    }
    const char *hosts = o->hosts_file ? o->hosts_file : getenv("AIRLOCK_NET_HOSTS_FILE");
    if (hosts && !*hosts)
        hosts = NULL;
    if (hosts && strpbrk(hosts, " \t\n\"'"))
        return al_err(err, -EINVAL, "the proxy's hosts file path has spaces or quotes");
    n->bytes_max = o->bytes_max ? o->bytes_max : AL_NET_BYTES_MAX_DEFAULT;
    n->conns_max = o->conns_max ? o->conns_max : AL_NET_CONNS_MAX_DEFAULT;
    if (n->conns_max > AL_NET_CONNS_MAX_LIMIT)
        n->conns_max = AL_NET_CONNS_MAX_LIMIT;
    n->ntun = n->conns_max;
    n->tun = calloc(n->ntun, sizeof(*n->tun));
    n->req = calloc(NET_REQUESTS_MAX, sizeof(*n->req));
    if (!n->tun || !n->req)
        return al_err(err, -ENOMEM, "out of memory");
    for (size_t i = 0; i < n->ntun; i++)
        n->tun[i].g = n->tun[i].p = -1;
    if (al_pathf(n->dir, sizeof(n->dir), "%s/net", s->dir) < 0 ||
        al_pathf(n->conf, sizeof(n->conf), "%s/squid.conf", n->dir) < 0 ||
        al_pathf(n->log, sizeof(n->log), "%s/access.log", n->dir) < 0 ||
        al_pathf(n->out, sizeof(n->out), "%s/squid.out", n->dir) < 0)
        return al_err(err, -ENAMETOOLONG, "session path too long");
    if (strpbrk(n->dir, " \t\n\"'"))
        return al_err(err, -EINVAL, "the session dir's path has spaces or quotes");
    /* The secrets: the tunnels' key, and the relay's address (a random ULA) in its header. */
    if (getrandom(n->key, sizeof(n->key), 0) != (ssize_t)sizeof(n->key) ||
        getrandom(n->relay_in6, sizeof(n->relay_in6), 0) != (ssize_t)sizeof(n->relay_in6))
        return al_err(err, -EIO, "getrandom: %s", strerror(errno));
    n->relay_in6[0] = 0xfd;
    inet_ntop(AF_INET6, n->relay_in6, n->relay_addr, sizeof(n->relay_addr));
    n->proxy_hdr_len = (size_t)snprintf(n->proxy_hdr, sizeof(n->proxy_hdr),
                                        "PROXY TCP6 %s ::1 1024 3128\r\n", n->relay_addr);
    /* 0700: Squid's files (its configuration names the relay's address) are nobody else's. */
    if (mkdir(n->dir, 0700) < 0)
        return al_err(err, -errno, "cannot make %s: %s", n->dir, strerror(errno));
    const char *user = NULL;
    if (geteuid() == 0) {
        uid_t uid;
        gid_t gid;
        user = proxy_user(&uid, &gid);
        if (!user)
            return al_err(err, -ENOENT, "no 'proxy' or 'nobody' user to run the network proxy as");
        if (chown(n->dir, uid, gid) < 0)
            return al_err(err, -errno, "cannot hand %s to the proxy: %s", n->dir, strerror(errno));
    }
    int r = al_free_port(&n->squid_port, err);
    if (r < 0 || (r = al_free_port(&n->fwd_port, err)) < 0)
        return r;
    r = write_conf(n, hosts, user, err);
    if (r < 0)
        return r;
    r = squid_start(n, err);
    if (r < 0)
        return r;
    cfg->net_port = n->fwd_port;
    cfg->net_guest_port = NET_GUEST_TUNNEL_PORT;
    return 0;
}

/* The tunnels' key, into the guest over the agent's channel (a file copy through a 0600 file of
 * the session's own dir), before the relay opens the first tunnel. */
static int key_to_guest(al_session *s, struct al_net *n, al_error *err)
{
    char tmp[AL_PATH_MAX];
    if (al_pathf(tmp, sizeof(tmp), "%s/egress.key", s->dir) < 0)
        return al_err(err, -ENAMETOOLONG, "session path too long");
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return al_err(err, -errno, "cannot write the network key: %s", strerror(errno));
    bool ok = write(fd, n->key, sizeof(n->key)) == (ssize_t)sizeof(n->key);
    ok = close(fd) == 0 && ok;
    int r = ok ? al_file_put(s, tmp, AL_EGRESS_KEY_PATH, err)
               : al_err(err, -EIO, "cannot write the network key");
    unlink(tmp);
    return r;
}

int al_net_start(al_session *s, al_error *err)
{
    struct al_net *n = s->net;
    if (!n)
        return 0;
    int r = squid_wait_ready(n, err);
    if (r < 0 || (r = key_to_guest(s, n, err)) < 0)
        return r;
    if (pipe2(n->stop, O_CLOEXEC) < 0)
        return al_err(err, -errno, "cannot make a pipe: %s", strerror(errno));
    r = pthread_create(&n->relay, NULL, relay_main, n);
    if (r != 0)
        return al_err(err, -r, "cannot start the network relay: %s", strerror(r));
    n->relay_running = true;
    return 0;
}

void al_net_reset(al_session *s)
{
    struct al_net *n = s->net;
    if (!n || !n->relay_running)
        return;
    pthread_mutex_lock(&n->mu);
    uint64_t want = n->resets_asked + 1;
    if (write(n->stop[1], "r", 1) == 1) {
        /* Done before the restored guest's next request: a tunnel the relay opened for it must
         * not be one it then closes as stale. A relay that does not answer in 5 s is stuck
         * anyway; the session's requests find that out. */
        n->resets_asked = want;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 5;
        while (n->resets_done < want)
            if (pthread_cond_timedwait(&n->reset_cv, &n->mu, &ts) == ETIMEDOUT)
                break;
    }
    pthread_mutex_unlock(&n->mu);
}

void al_net_stop(al_session *s)
{
    struct al_net *n = s->net;
    if (!n)
        return;
    if (n->relay_running) {
        if (write(n->stop[1], "x", 1) < 0) {
            /* a full pipe already wakes the thread */
        }
        pthread_join(n->relay, NULL);
        n->relay_running = false;
    }
    for (size_t i = 0; n->tun && i < n->ntun; i++)
        tunnel_close(&n->tun[i]);
    squid_stop(n);
    fd_close(&n->stop[0]);
    fd_close(&n->stop[1]);
    al_net_allow_free(n->allow);
    free(n->tun);
    free(n->req);
    pthread_cond_destroy(&n->reset_cv);
    pthread_mutex_destroy(&n->mu);
    free(n);
    s->net = NULL;
}

/* gc: the Squid a crashed session left running, found by the pid file in its dir and checked
 * to be that session's Squid (its command line names the dir's configuration). */
void al_net_reap(const char *session_dir)
{
    char pidf[AL_PATH_MAX], conf[AL_PATH_MAX], cmdf[64], cmd[AL_PATH_MAX + 512];
    if (al_pathf(pidf, sizeof(pidf), "%s/net/squid.pid", session_dir) < 0 ||
        al_pathf(conf, sizeof(conf), "%s/net/squid.conf", session_dir) < 0)
        return;
    FILE *f = fopen(pidf, "re");
    long pid = 0;
    if (!f)
        return;
    if (fscanf(f, "%ld", &pid) != 1)
        pid = 0;
    fclose(f);
    if (pid <= 1 || snprintf(cmdf, sizeof(cmdf), "/proc/%ld/cmdline", pid) >= (int)sizeof(cmdf))
        return;
    int fd = open(cmdf, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t len = read(fd, cmd, sizeof(cmd) - 1);
    close(fd);
    if (len <= 0)
        return;
    cmd[len] = '\0';
    for (ssize_t i = 0; i < len; i++)
        if (cmd[i] == '\0')
            cmd[i] = ' ';
    if (strstr(cmd, "squid") && strstr(cmd, conf))
        kill((pid_t)pid, SIGKILL);
}

/* A session's guest ports over HTTP: a reverse proxy to 127.0.0.1:PORT in the guest, reached at
 * /v1/sessions/{id}/ports/{port}/PATH, or at http://PORT-ID.localhost:DAEMONPORT/PATH (host-name
 * routing, for apps that must sit at /).
 *
 * Each request is one tunnel (al_port_relay over the agent's channel) from a unix socket libcurl
 * connects to (abstract, a random name, and only this process's own connection accepted: its
 * SO_PEERCRED pid), so that libcurl speaks HTTP/1.1 to the guest's service and parses its
 * answer, not code of ours. The answer's body goes through a pipe to the
 * MHD response: a reader that does not read stops curl, curl stops the tunnel's credit, the
 * guest's writer waits. Nothing of the caller's credentials (Authorization, airlock's cookies,
 * the CSRF header) reaches the guest; what the guest answers is served with hop-by-hop and
 * length headers dropped, and, on the daemon's own origin, under `Content-Security-Policy:
 * sandbox`, so that a guest's page never runs as the daemon's page.
 *
 * A WebSocket upgrade (Upgrade: websocket) goes another way, as libcurl (7.88) has no WebSocket:
 * the request's head is written to the tunnel by us, the guest's answer's head is parsed by
 * http-parser (httphead.c, bounded), and a 101 becomes libmicrohttpd's upgrade; from then on
 * the bytes are relayed both ways as they are (the handshake's key and accept are the client's
 * and the guest's: end to end). A browser's upgrade must come from the page's own origin.
 *
 * Every proxy, of either kind, is on one list: the daemon's stop ends them all first. */
#include "airlockd.h"
#include "httphead.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>

/* A list of what a stop must end: each proxy's cancel pipe. */
struct live {
    int cancel_wr;
    struct live *next;
};

/* How long the guest's service has to send its answer's headers. */
#define HEADERS_WAIT_MS 60000
/* Headers of the guest's answer passed on at most (curl bounds each one's size). */
#define HEADERS_MAX 100
/* Proxied requests at once, all sessions together: each holds three threads. */
#define PROXIES_MAX 256

struct proxy {
    struct ad_session *sess;
    unsigned port;
    int sp[2];          /* [0] the listening socket curl connects to, [1] the tunnel's end */
    char sock_name[40]; /* its abstract name (without the NUL that starts it) */
    int body[2];        /* the answer's body: curl writes [1], the response reads [0] */
    int cancel[2];      /* a byte ends the tunnel */
    pthread_t tunnel, client;
    bool tunnel_up, client_up;
    CURL *curl;
    struct curl_slist *req_headers;
    char *req_body;
    size_t req_len;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool headers_done, failed, finished;
    long status;
    char why[512];
    struct curl_slist *resp_headers; /* "Name: value", filtered */
    struct live live;
};

static pthread_mutex_t count_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t count_cv = PTHREAD_COND_INITIALIZER;
static unsigned proxies;
static struct live *lives;
static bool stopping;

/* A place among the PROXIES_MAX, its cancel pipe on the list; false when there is none. */
static bool slot_take(struct live *l, int cancel_wr)
{
    pthread_mutex_lock(&count_lock);
    bool room = proxies < PROXIES_MAX && !stopping;
    if (room) {
        proxies++;
        l->cancel_wr = cancel_wr;
        l->next = lives;
        lives = l;
    }
    pthread_mutex_unlock(&count_lock);
    return room;
}

static void slot_give(struct live *l)
{
    pthread_mutex_lock(&count_lock);
    for (struct live **p = &lives; *p; p = &(*p)->next)
        if (*p == l) {
            *p = l->next;
            proxies--;
            break;
        }
    pthread_cond_broadcast(&count_cv);
    pthread_mutex_unlock(&count_lock);
}

/* A proxy's cancel pipe and its place among the PROXIES_MAX; on failure the reply to give
 * (the caller frees what it set up). */
static enum MHD_Result slot_open(struct MHD_Connection *c, struct ad_req *q, int cancel[2],
                                 struct live *l, bool *ok)
{
    *ok = false;
    if (pipe2(cancel, O_CLOEXEC | O_NONBLOCK) < 0)
        return ad_reply_error(c, q, 500, "internal", "cannot set up the proxy: %s",
                              strerror(errno));
    if (!slot_take(l, cancel[1]))
        return ad_reply_error(c, q, 503, "busy", "%d proxied requests at once already",
                              PROXIES_MAX);
    *ok = true;
    return MHD_YES;
}

void ad_ports_shutdown(void)
{
    pthread_mutex_lock(&count_lock);
    stopping = true;
    uint8_t kill = SIGKILL;
    for (struct live *l = lives; l; l = l->next)
        (void)!write(l->cancel_wr, &kill, 1);
    /* each tunnel ends at once on its cancel byte; what holds on past that is left */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 10;
    while (proxies && pthread_cond_timedwait(&count_cv, &count_lock, &ts) == 0)
        ;
    if (proxies)
        ad_log("%u proxied connections did not end within 10 s", proxies);
    pthread_mutex_unlock(&count_lock);
}

static const char *const hop_by_hop[] = {"connection",
                                         "keep-alive",
                                         "proxy-authenticate",
                                         "proxy-authorization",
                                         "te",
                                         "trailer",
                                         "transfer-encoding",
                                         "upgrade",
                                         "content-length",
                                         NULL};

static void closefd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

static bool is_hop(const char *name)
{
    for (const char *const *h = hop_by_hop; *h; h++)
        if (!strcasecmp(name, *h))
            return true;
    return false;
}

/* ---- the tunnel ---- */

/* curl's connection: the first one to the listening socket that comes from this process. */
static int accept_curl(struct proxy *x)
{
    for (;;) {
        struct pollfd pfd[2] = {{x->sp[0], POLLIN, 0}, {x->cancel[0], POLLIN, 0}};
        int n = poll(pfd, 2, HEADERS_WAIT_MS);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0 || pfd[1].revents)
            return -ECANCELED;
        int fd = accept4(x->sp[0], NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        struct ucred cr;
        socklen_t len = sizeof(cr);
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) == 0 && cr.pid == getpid())
            return fd;
        close(fd); /* another process found the name: never its tunnel */
    }
}

static void *tunnel_main(void *p)
{
    struct proxy *x = p;
    al_error err = {0};
    int r = x->sp[1] = accept_curl(x);
    if (r >= 0)
        r = al_port_relay(x->sess->s, x->port, x->sp[1], x->cancel[0], NULL, &err);
    else
        snprintf(err.msg, sizeof(err.msg), "the proxy's own connection did not come");
    pthread_mutex_lock(&x->mu);
    if (r < 0 && !x->headers_done) {
        x->failed = true;
        snprintf(x->why, sizeof(x->why), "%s", err.msg);
    }
    pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->mu);
    /* curl learns the end (its reads see EOF) */
    if (x->sp[1] >= 0)
        shutdown(x->sp[1], SHUT_RDWR);
    /* The session is let go with the tunnel, not with the answer: a caller that stops reading
     * holds its connection, never the session's end (proxy_free joins this thread first). */
    ad_session_put(x->sess);
    x->sess = NULL;
    return NULL;
}

/* ---- curl over the socketpair ---- */

/* The guest's headers, parsed by curl, once the final (non-1xx) status line's block ended. */
static void headers_ready(struct proxy *x)
{
    long code = 0;
    curl_easy_getinfo(x->curl, CURLINFO_RESPONSE_CODE, &code);
    if (code < 200)
        return; /* an interim answer (100, 103): the real one follows */
    struct curl_header *h = NULL, *prev = NULL;
    unsigned n = 0;
    while (n < HEADERS_MAX && (h = curl_easy_nextheader(x->curl, CURLH_HEADER, -1, prev))) {
        prev = h;
        if (is_hop(h->name) || !strcasecmp(h->name, "set-cookie2"))
            continue;
        char line[8192];
        if (snprintf(line, sizeof(line), "%s: %s", h->name, h->value) >= (int)sizeof(line))
            continue;
        x->resp_headers = curl_slist_append(x->resp_headers, line);
        n++;
    }
    pthread_mutex_lock(&x->mu);
    x->status = code;
    x->headers_done = true;
    pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->mu);
}

static size_t on_header(char *p, size_t size, size_t n, void *ctx)
{
    struct proxy *x = ctx;
    size_t len = size * n;
    if ((len == 2 && p[0] == '\r' && p[1] == '\n') || (len == 1 && p[0] == '\n'))
        headers_ready(x);
    return len;
}

static size_t on_body(char *p, size_t size, size_t n, void *ctx)
{
    struct proxy *x = ctx;
    size_t len = size * n;
    for (size_t done = 0; done < len;) {
        ssize_t w = write(x->body[1], p + done, len - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return 0; /* the reader went away: curl stops */
        done += (size_t)w;
    }
    return len;
}

static void *client_main(void *p)
{
    struct proxy *x = p;
    CURLcode cc = curl_easy_perform(x->curl);
    pthread_mutex_lock(&x->mu);
    if (!x->headers_done) {
        x->failed = true;
        if (!x->why[0])
            snprintf(x->why, sizeof(x->why), "port %u answered no HTTP: %s", x->port,
                     curl_easy_strerror(cc));
    }
    x->finished = true;
    pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->mu);
    closefd(&x->body[1]); /* the response's EOF */
    return NULL;
}

/* ---- the request ---- */

/* A request header that is not passed on to the guest: the caller's credentials, hop-by-hop
 * ones, and those the proxy sets itself (Host, the length, X-Forwarded-*). */
static bool stays_here(const char *k)
{
    return is_hop(k) || !strcasecmp(k, "host") || !strcasecmp(k, "authorization") ||
           !strcasecmp(k, "cookie") || !strcasecmp(k, "x-airlock-csrf") ||
           !strcasecmp(k, "expect") || !strncasecmp(k, "x-forwarded-", 12);
}

static bool printable(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            return false;
    return true;
}

static enum MHD_Result add_header(void *cls, enum MHD_ValueKind kind, const char *k, const char *v)
{
    (void)kind;
    struct proxy *x = cls;
    if (stays_here(k)) /* curl sets Host and the length */
        return MHD_YES;
    char line[8192];
    if (snprintf(line, sizeof(line), "%s: %s", k, v ? v : "") < (int)sizeof(line))
        x->req_headers = curl_slist_append(x->req_headers, line);
    return MHD_YES;
}

/* The caller's cookies but airlock's own, as one Cookie header's value ("a=1; b=2"). */
struct cookies {
    char *p;
    size_t cap;
    bool printable_only; /* a cookie with a control byte is dropped */
};

static enum MHD_Result add_cookie(void *cls, enum MHD_ValueKind kind, const char *k, const char *v)
{
    (void)kind;
    struct cookies *ck = cls;
    if (!strcmp(k, "airlock_token") || !strcmp(k, "airlock_port") ||
        (ck->printable_only && (!printable(k) || (v && !printable(v)))))
        return MHD_YES;
    size_t n = strlen(ck->p);
    snprintf(ck->p + n, ck->cap - n, "%s%s=%s", n ? "; " : "", k, v ? v : "");
    return MHD_YES;
}

static void proxy_free(struct proxy *x)
{
    uint8_t kill = SIGKILL;
    if (x->cancel[1] >= 0)
        (void)!write(x->cancel[1], &kill, 1);
    closefd(&x->body[0]); /* curl's writes fail: it stops */
    if (x->client_up)
        pthread_join(x->client, NULL);
    if (x->tunnel_up)
        pthread_join(x->tunnel, NULL);
    for (int i = 0; i < 2; i++) {
        closefd(&x->sp[i]);
        closefd(&x->body[i]);
    }
    if (x->curl)
        curl_easy_cleanup(x->curl);
    curl_slist_free_all(x->req_headers);
    curl_slist_free_all(x->resp_headers);
    free(x->req_body);
    pthread_mutex_destroy(&x->mu);
    pthread_cond_destroy(&x->cv);
    if (x->sess)
        ad_session_put(x->sess);
    if (x->live.cancel_wr >= 0)
        slot_give(&x->live); /* off the list before its cancel pipe closes */
    closefd(&x->cancel[0]);
    closefd(&x->cancel[1]);
    free(x);
}

static ssize_t read_body(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    struct proxy *x = cls;
    for (;;) {
        ssize_t n = read(x->body[0], buf, max);
        if (n > 0)
            return n;
        if (n < 0 && errno == EINTR)
            continue;
        return n == 0 ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

static void free_body(void *cls)
{
    proxy_free(cls);
}

/* ---- WebSocket ---- */

/* How long one direction's bytes may wait for the other end to take them before the
 * connection is ended: a WebSocket's peer that stops reading holds nothing forever. */
#define WS_STALL_MS 60000
#define WS_BUF 65536

struct ad_ws {
    struct ad_session *sess;
    unsigned port;
    int sv[2];     /* [0] ours, [1] the tunnel's */
    int cancel[2]; /* a byte ends the tunnel (and the relay) */
    pthread_t tunnel, relay;
    bool tunnel_up;
    pthread_mutex_t mu;
    char why[512]; /* the tunnel's failure */
    struct live live;
    /* the request's head going out, then the guest's answer coming in */
    char head[AD_HEAD_MAX];
    size_t head_len, head_used; /* bytes read, bytes of them the answer's head */
    struct ad_http_head answer;
    /* the client's end, once upgraded */
    MHD_socket sock;
    struct MHD_UpgradeResponseHandle *urh;
    char *early; /* the client's bytes MHD read past its request's head */
    size_t early_len;
};

bool ad_wants_websocket(struct MHD_Connection *c)
{
    const char *u = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Upgrade");
    const char *conn = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Connection");
    if (!u || strcasecmp(u, "websocket") || !conn)
        return false;
    char tokens[256];
    snprintf(tokens, sizeof(tokens), "%s", conn);
    char *save = NULL;
    for (char *t = strtok_r(tokens, ", \t", &save); t; t = strtok_r(NULL, ", \t", &save))
        if (!strcasecmp(t, "upgrade"))
            return true;
    return false;
}

bool ad_same_origin(struct MHD_Connection *c)
{
    const char *o = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    if (!o)
        return true;
    if (!host)
        return false;
    const char *scheme = ad_cfg.tls_cert[0] ? "https://" : "http://";
    size_t sl = strlen(scheme);
    return !strncasecmp(o, scheme, sl) && !strcasecmp(o + sl, host);
}

static void ws_free(struct ad_ws *w)
{
    uint8_t kill = SIGKILL;
    if (w->cancel[1] >= 0)
        (void)!write(w->cancel[1], &kill, 1);
    if (w->sv[0] >= 0)
        shutdown(w->sv[0], SHUT_RDWR); /* a tunnel's write waiting on us fails */
    if (w->tunnel_up)
        pthread_join(w->tunnel, NULL);
    closefd(&w->sv[0]);
    closefd(&w->sv[1]);
    if (w->sess)
        ad_session_put(w->sess);
    if (w->live.cancel_wr >= 0)
        slot_give(&w->live); /* off the list before its cancel pipe closes */
    closefd(&w->cancel[0]);
    closefd(&w->cancel[1]);
    pthread_mutex_destroy(&w->mu);
    free(w->early);
    free(w);
}

static void *ws_tunnel_main(void *p)
{
    struct ad_ws *w = p;
    al_error err = {0};
    if (al_port_relay(w->sess->s, w->port, w->sv[1], w->cancel[0], NULL, &err) < 0) {
        pthread_mutex_lock(&w->mu);
        snprintf(w->why, sizeof(w->why), "%s", err.msg);
        pthread_mutex_unlock(&w->mu);
    }
    shutdown(w->sv[1], SHUT_RDWR); /* our end reads EOF */
    ad_session_put(w->sess);       /* as tunnel_main: ws_free joins this thread first */
    w->sess = NULL;
    return NULL;
}

/* The request's head as the guest's service gets it: the path, a Host of its own port, the
 * caller's headers but its credentials and hop-by-hop ones, the upgrade. */
static enum MHD_Result ws_add_header(void *cls, enum MHD_ValueKind kind, const char *k,
                                     const char *v)
{
    (void)kind;
    struct ad_ws *w = cls;
    v = v ? v : "";
    if (stays_here(k) || !printable(k) || !printable(v)) /* written as they are: no controls */
        return MHD_YES;
    size_t room = sizeof(w->head) - w->head_len;
    int n = snprintf(w->head + w->head_len, room, "%s: %s\r\n", k, v);
    if (n > 0 && (size_t)n < room)
        w->head_len += (size_t)n;
    return MHD_YES;
}

/* All of buf to fd (non-blocking) by deadline; false when it could not. */
static bool send_all(int fd, const char *buf, size_t len, uint64_t deadline)
{
    while (len) {
        ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);
        if (n > 0) {
            buf += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EINTR)
            return false;
        uint64_t now = ad_now_ms();
        if (now >= deadline)
            return false;
        struct pollfd p = {fd, POLLOUT, 0};
        poll(&p, 1, (int)(deadline - now));
    }
    return true;
}

/* Bytes both ways until both ends close (one end's close half-closes the other: a TCP
 * tunnel's client may end its request so), the tunnel is cancelled, or one side's bytes wait
 * WS_STALL_MS for the other to take them. Each direction holds one buffer: a reader that does
 * not read stops the other side's reads, and so the tunnel's credit. */
static void *ws_relay_main(void *p)
{
    struct ad_ws *w = p;
    struct dir {
        int from, to;
        char buf[WS_BUF];
        size_t len, off;
        bool eof, shut; /* from closed; to told so (its write half shut) */
        uint64_t since; /* when its bytes began to wait */
    } *d = calloc(2, sizeof(*d));
    if (!d)
        goto out;
    d[0].from = w->sock, d[0].to = w->sv[0]; /* client to guest */
    d[1].from = w->sv[0], d[1].to = w->sock; /* guest to client */
    fcntl(w->sock, F_SETFL, fcntl(w->sock, F_GETFL) | O_NONBLOCK);
    /* what came past the heads: the client's early bytes, the guest's after its 101 */
    if (!send_all(w->sv[0], w->early, w->early_len, ad_now_ms() + WS_STALL_MS))
        goto out;
    memcpy(d[1].buf, w->head + w->head_used, d[1].len = w->head_len - w->head_used);
    for (int i = 0; i < 2; i++)
        d[i].since = ad_now_ms();
    for (;;) {
        for (int i = 0; i < 2; i++) {
            struct dir *x = &d[i];
            while (x->off < x->len) {
                ssize_t n = send(x->to, x->buf + x->off, x->len - x->off, MSG_NOSIGNAL);
                if (n > 0)
                    x->off += (size_t)n;
                else if (n < 0 && (errno == EAGAIN || errno == EINTR))
                    break;
                else
                    goto out;
            }
            if (x->off == x->len) {
                x->off = x->len = 0;
                if (x->eof && !x->shut) { /* all it sent went on: the other end reads its end */
                    shutdown(x->to, SHUT_WR);
                    x->shut = true;
                }
            }
        }
        if (d[0].shut && d[1].shut)
            goto out; /* both ends closed */
        struct pollfd pf[5];
        int np = 0, idx[4];
        for (int i = 0; i < 2; i++) {
            if (!d[i].len && !d[i].eof) {
                idx[np] = i;
                pf[np++] = (struct pollfd){d[i].from, POLLIN, 0};
            } else if (d[i].len) {
                idx[np] = 2 + i;
                pf[np++] = (struct pollfd){d[i].to, POLLOUT, 0};
            }
        }
        pf[np++] = (struct pollfd){w->cancel[0], POLLIN, 0};
        uint64_t now = ad_now_ms(), wake = now + WS_STALL_MS;
        for (int i = 0; i < 2; i++)
            if (d[i].len && d[i].since + WS_STALL_MS < wake)
                wake = d[i].since + WS_STALL_MS;
        if (wake <= now)
            goto out; /* a peer that stopped reading */
        int r = poll(pf, (nfds_t)np, (int)(wake - now));
        if (r < 0 && errno != EINTR)
            goto out;
        if (pf[np - 1].revents)
            goto out;
        for (int k = 0; k < np - 1; k++) {
            if (!pf[k].revents || idx[k] >= 2)
                continue;
            struct dir *x = &d[idx[k]];
            ssize_t n = recv(x->from, x->buf, sizeof(x->buf), 0);
            if (n > 0) {
                x->len = (size_t)n;
                x->since = ad_now_ms();
            } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
                x->eof = true;
            }
        }
    }
out:
    free(d);
    /* the client's end first (MHD's to close), then the tunnel and the slot */
    MHD_upgrade_action(w->urh, MHD_UPGRADE_ACTION_CLOSE);
    ws_free(w);
    return NULL;
}

static void on_upgrade(void *cls, struct MHD_Connection *c, void *con_cls, const char *extra_in,
                       size_t extra_in_size, MHD_socket sock, struct MHD_UpgradeResponseHandle *urh)
{
    (void)c;
    struct ad_ws *w = cls;
    struct ad_req *q = con_cls;
    w->sock = sock;
    w->urh = urh;
    if (extra_in_size && !(w->early = malloc(extra_in_size))) {
        MHD_upgrade_action(urh, MHD_UPGRADE_ACTION_CLOSE);
        return; /* not upgraded: the request's end frees it */
    }
    if (extra_in_size)
        memcpy(w->early, extra_in, extra_in_size);
    w->early_len = extra_in_size;
    /* The relay thread owns it from now on: the request forgets it first (the relay may end
     * and free it before the request's end is told). Not in this thread: with TLS, MHD
     * forwards the bytes only once this returns. */
    q->ws = NULL;
    q->upgraded = true;
    if (pthread_create(&w->relay, NULL, ws_relay_main, w) == 0) {
        pthread_detach(w->relay);
        return;
    }
    q->ws = w;
    q->upgraded = false;
    MHD_upgrade_action(urh, MHD_UPGRADE_ACTION_CLOSE);
}

void ad_port_ws_done(struct ad_ws *w)
{
    /* MHD calls the upgrade handler before the request's end, in this same thread (one per
     * connection): one still here was never upgraded, and never will be. */
    if (w)
        ws_free(w);
}

/* A relay's start for q to port: the session's reference taken from q, a proxy slot, the
 * socketpair the tunnel gets; NULL with the answer in *ret. */
static struct ad_ws *ws_new(struct MHD_Connection *c, struct ad_req *q, unsigned port,
                            enum MHD_Result *ret)
{
    struct ad_ws *w = calloc(1, sizeof(*w));
    if (!w) {
        *ret = ad_reply_error(c, q, 500, "internal", "out of memory");
        return NULL;
    }
    pthread_mutex_init(&w->mu, NULL);
    w->sv[0] = w->sv[1] = w->cancel[0] = w->cancel[1] = -1;
    w->live.cancel_wr = -1;
    w->port = port;
    w->sess = q->sess; /* the reference moves here */
    q->sess = NULL;
    bool slot_ok;
    *ret = slot_open(c, q, w->cancel, &w->live, &slot_ok);
    if (!slot_ok) {
        ws_free(w);
        return NULL;
    }
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, w->sv) < 0) {
        ws_free(w);
        *ret =
            ad_reply_error(c, q, 500, "internal", "cannot set up the relay: %s", strerror(errno));
        return NULL;
    }
    fcntl(w->sv[0], F_SETFL, O_NONBLOCK);
    return w;
}

static enum MHD_Result ws_proxy(struct MHD_Connection *c, struct ad_req *q, unsigned port,
                                const char *path)
{
    if (strcmp(q->method, "GET"))
        return ad_reply_error(c, q, 400, "invalid", "a WebSocket upgrade is a GET");
    if (!ad_same_origin(c))
        return ad_reply_error(c, q, 403, "forbidden",
                              "a browser's WebSocket must come from the page of its own origin");
    if (!printable(path) || strchr(path, ' '))
        return ad_reply_error(c, q, 400, "invalid", "the path has spaces or controls");
    enum MHD_Result ret;
    struct ad_ws *w = ws_new(c, q, port, &ret);
    if (!w)
        return ret;
    int n =
        snprintf(w->head, sizeof(w->head), "GET %s HTTP/1.1\r\nHost: localhost:%u\r\n", path, port);
    if (n < 0 || (size_t)n >= sizeof(w->head) - 1024) {
        ws_free(w);
        return ad_reply_error(c, q, 414, "too_large", "the path is too long");
    }
    w->head_len = (size_t)n;
    MHD_get_connection_values(c, MHD_HEADER_KIND, ws_add_header, w);
    char cookie[4096] = "";
    struct cookies ck = {cookie, sizeof(cookie), true};
    MHD_get_connection_values(c, MHD_COOKIE_KIND, add_cookie, &ck);
    size_t room = sizeof(w->head) - w->head_len;
    n = snprintf(w->head + w->head_len, room,
                 "%s%s%sUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 "X-Forwarded-Proto: %s\r\n\r\n",
                 cookie[0] ? "Cookie: " : "", cookie, cookie[0] ? "\r\n" : "",
                 ad_cfg.tls_cert[0] ? "https" : "http");
    if (n < 0 || (size_t)n >= room) {
        ws_free(w);
        return ad_reply_error(c, q, 431, "too_large", "the request's headers are too long");
    }
    w->head_len += (size_t)n;
    if (pthread_create(&w->tunnel, NULL, ws_tunnel_main, w) == 0)
        w->tunnel_up = true;
    uint64_t deadline = ad_now_ms() + HEADERS_WAIT_MS;
    if (!w->tunnel_up || !send_all(w->sv[0], w->head, w->head_len, deadline)) {
        ws_free(w);
        return ad_reply_error(c, q, 502, "bad_gateway", "port %u took no request", port);
    }
    /* the guest's answer's head, within its bounds and its time */
    char why[512] = "";
    w->head_len = 0;
    ad_http_head_init(&w->answer);
    while (!w->answer.done) {
        uint64_t now = ad_now_ms();
        if (w->head_len == sizeof(w->head)) {
            snprintf(why, sizeof(why), "its answer's head is over %d bytes", AD_HEAD_MAX);
            break;
        }
        if (now >= deadline) {
            ws_free(w);
            return ad_reply_error(c, q, 504, "timeout",
                                  "port %u did not answer the upgrade within %d s", port,
                                  HEADERS_WAIT_MS / 1000);
        }
        struct pollfd pf = {w->sv[0], POLLIN, 0};
        if (poll(&pf, 1, (int)(deadline - now)) <= 0)
            continue;
        ssize_t got = recv(w->sv[0], w->head + w->head_len, sizeof(w->head) - w->head_len, 0);
        if (got < 0 && (errno == EAGAIN || errno == EINTR))
            continue;
        if (got <= 0) {
            pthread_join(w->tunnel, NULL); /* it ended: its reason is set */
            w->tunnel_up = false;
            pthread_mutex_lock(&w->mu);
            snprintf(why, sizeof(why), "%s",
                     w->why[0] ? w->why : "it closed the connection without an answer");
            pthread_mutex_unlock(&w->mu);
            break;
        }
        long used =
            ad_http_head_feed(&w->answer, w->head + w->head_len, (size_t)got, why, sizeof(why));
        if (used < 0)
            break;
        w->head_used = w->head_len + (size_t)used;
        w->head_len += (size_t)got;
    }
    const char *up = w->answer.done ? ad_http_head_get(&w->answer, "upgrade") : NULL;
    if (!w->answer.done || !w->answer.upgrade || !up || strcasecmp(up, "websocket")) {
        unsigned st = w->answer.done && w->answer.status >= 400 && w->answer.status <= 599
                          ? w->answer.status
                          : 502;
        if (w->answer.done && !why[0])
            snprintf(why, sizeof(why), "it answered %u", w->answer.status);
        ws_free(w);
        return ad_reply_error(c, q, st, "upgrade_refused",
                              "port %u did not take the WebSocket upgrade: %s", port, why);
    }
    struct MHD_Response *r = MHD_create_response_for_upgrade(on_upgrade, w);
    if (!r) {
        ws_free(w);
        return ad_reply_error(c, q, 500, "internal", "out of memory");
    }
    MHD_add_response_header(r, "Upgrade", "websocket");
    for (size_t i = 0; i < w->answer.nfields; i++) {
        const struct ad_head_field *f = &w->answer.fields[i];
        if (!is_hop(f->name) && strcasecmp(f->name, "set-cookie2") && printable(f->value))
            MHD_add_response_header(r, f->name, f->value);
    }
    q->ws = w; /* the request's end frees it unless upgraded (on_upgrade, ad_port_ws_done) */
    return ad_reply(c, q, 101, r);
}

enum MHD_Result ad_port_tcp(struct MHD_Connection *c, struct ad_req *q, unsigned port)
{
    const char *u = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Upgrade");
    if (!u || strcasecmp(u, AD_TCP_UPGRADE))
        return ad_reply_error(c, q, 400, "invalid",
                              "a TCP tunnel is an upgrade: 'Upgrade: " AD_TCP_UPGRADE "'");
    if (MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin"))
        return ad_reply_error(c, q, 403, "forbidden", "a TCP tunnel is not for a browser");
    enum MHD_Result ret;
    struct ad_ws *w = ws_new(c, q, port, &ret);
    if (!w)
        return ret;
    if (pthread_create(&w->tunnel, NULL, ws_tunnel_main, w) == 0)
        w->tunnel_up = true;
    struct MHD_Response *r = w->tunnel_up ? MHD_create_response_for_upgrade(on_upgrade, w) : NULL;
    if (!r) {
        ws_free(w);
        return ad_reply_error(c, q, 500, "internal", "cannot set up the tunnel");
    }
    /* The guest's port is connected by the tunnel: one that nobody listens on ends the
     * connection after the upgrade (the relay sees the tunnel's end), as a refused connect. */
    MHD_add_response_header(r, "Upgrade", AD_TCP_UPGRADE);
    q->ws = w;
    return ad_reply(c, q, 101, r);
}

enum MHD_Result ad_port_proxy(struct MHD_Connection *c, struct ad_req *q, unsigned port,
                              const char *path, bool host_routed)
{
    if (port < 1 || port > 65535)
        return ad_reply_error(c, q, 400, "invalid", "a port is 1 to 65535");
    if (ad_wants_websocket(c))
        return ws_proxy(c, q, port, path);
    struct proxy *x = calloc(1, sizeof(*x));
    if (!x)
        return ad_reply_error(c, q, 500, "internal", "out of memory");
    pthread_mutex_init(&x->mu, NULL);
    pthread_cond_init(&x->cv, NULL);
    x->sp[0] = x->sp[1] = x->body[0] = x->body[1] = x->cancel[0] = x->cancel[1] = -1;
    x->live.cancel_wr = -1;
    bool slot_ok;
    enum MHD_Result ret = slot_open(c, q, x->cancel, &x->live, &slot_ok);
    if (!slot_ok) {
        proxy_free(x);
        return ret;
    }
    x->port = port;
    x->sess = q->sess; /* the reference moves here */
    q->sess = NULL;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    char rnd[17];
    if (ad_random_hex(rnd, 8) == 0) {
        snprintf(x->sock_name, sizeof(x->sock_name), "airlockd-proxy-%s", rnd);
        memcpy(sa.sun_path + 1, x->sock_name, strlen(x->sock_name));
    }
    socklen_t sl = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(x->sock_name));
    if (!x->sock_name[0] || (x->sp[0] = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 ||
        bind(x->sp[0], (struct sockaddr *)&sa, sl) < 0 || listen(x->sp[0], 1) < 0 ||
        pipe2(x->body, O_CLOEXEC) < 0 || !(x->curl = curl_easy_init())) {
        proxy_free(x);
        return ad_reply_error(c, q, 500, "internal", "cannot set up the proxy: %s",
                              strerror(errno));
    }
    /* The request as the guest's service gets it: the path, the caller's headers but its
     * credentials, a Host of its own port, and who asked. */
    char url[8192 + 64];
    if (snprintf(url, sizeof(url), "http://localhost:%u%s", port, path) >= (int)sizeof(url)) {
        proxy_free(x);
        return ad_reply_error(c, q, 414, "too_large", "the path is too long");
    }
    MHD_get_connection_values(c, MHD_HEADER_KIND, add_header, x);
    char cookie[8192] = "Cookie: ";
    struct cookies ck = {cookie + 8, sizeof(cookie) - 8, false};
    MHD_get_connection_values(c, MHD_COOKIE_KIND, add_cookie, &ck);
    if (cookie[8])
        x->req_headers = curl_slist_append(x->req_headers, cookie);
    x->req_headers = curl_slist_append(x->req_headers, "Expect:");
    x->req_headers = curl_slist_append(x->req_headers, "X-Forwarded-Proto: http");
    const char *method_s = q->method;
    CURL *h = x->curl;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_ABSTRACT_UNIX_SOCKET, x->sock_name);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, x->req_headers);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(h, CURLOPT_HTTP_CONTENT_DECODING, 0L); /* bytes as the guest encoded them */
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http");
    curl_easy_setopt(h, CURLOPT_HTTP_VERSION, CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(h, CURLOPT_FORBID_REUSE, 1L);
    if (!strcmp(method_s, "HEAD")) {
        curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    } else if (strcmp(method_s, "GET")) {
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method_s);
        x->req_body = q->body; /* taken */
        x->req_len = q->body_len;
        q->body = NULL;
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, x->req_body ? x->req_body : "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)x->req_len);
    }
    if (pthread_create(&x->tunnel, NULL, tunnel_main, x) == 0)
        x->tunnel_up = true;
    if (x->tunnel_up && pthread_create(&x->client, NULL, client_main, x) == 0)
        x->client_up = true;
    if (!x->client_up) {
        proxy_free(x);
        return ad_reply_error(c, q, 500, "internal", "cannot start the proxy's threads");
    }
    /* The guest's headers, or its failure, or its time. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += HEADERS_WAIT_MS / 1000;
    pthread_mutex_lock(&x->mu);
    int w = 0;
    while (!x->headers_done && !x->failed && !x->finished && w == 0)
        w = pthread_cond_timedwait(&x->cv, &x->mu, &ts);
    bool ok = x->headers_done;
    char why[512];
    snprintf(why, sizeof(why), "%s", x->why[0] ? x->why : "the guest's service did not answer");
    long status = x->status;
    pthread_mutex_unlock(&x->mu);
    if (!ok) {
        proxy_free(x);
        return ad_reply_error(c, q, w ? 504 : 502, w ? "timeout" : "bad_gateway", "%s", why);
    }
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 65536, read_body, x, free_body);
    if (!r) {
        proxy_free(x);
        return ad_reply_error(c, q, 500, "internal", "out of memory");
    }
    for (struct curl_slist *l = x->resp_headers; l; l = l->next) {
        char *colon = strchr(l->data, ':');
        if (!colon)
            continue;
        *colon = '\0';
        const char *v = colon + 1 + (colon[1] == ' ');
        /* a header MHD refuses (bad characters) is dropped, not the answer */
        MHD_add_response_header(r, l->data, v);
        *colon = ':';
    }
    /* On the daemon's own origin a guest's page is sandboxed: an opaque origin, our cookies
     * never sent with what it asks. Host-routed it is an origin of its own. */
    if (!host_routed)
        MHD_add_response_header(r, "Content-Security-Policy",
                                "sandbox allow-scripts allow-forms "
                                "allow-popups allow-downloads");
    return ad_reply(c, q, status >= 200 && status <= 599 ? (unsigned)status : 502, r);
}

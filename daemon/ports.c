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
 * sandbox`, so that a guest's page never runs as the daemon's page. */
#include "airlockd.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/rand.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>

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
};

static pthread_mutex_t count_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned proxies;

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

static enum MHD_Result add_header(void *cls, enum MHD_ValueKind kind, const char *k, const char *v)
{
    (void)kind;
    struct proxy *x = cls;
    /* the caller's credentials and our own headers stay here; curl sets Host and the length */
    if (is_hop(k) || !strcasecmp(k, "host") || !strcasecmp(k, "authorization") ||
        !strcasecmp(k, "cookie") || !strcasecmp(k, "x-airlock-csrf") || !strcasecmp(k, "expect") ||
        !strncasecmp(k, "x-forwarded-", 12))
        return MHD_YES;
    char line[8192];
    if (snprintf(line, sizeof(line), "%s: %s", k, v ? v : "") < (int)sizeof(line))
        x->req_headers = curl_slist_append(x->req_headers, line);
    return MHD_YES;
}

/* The cookies but airlock's own, as one Cookie header. */
static enum MHD_Result add_cookie(void *cls, enum MHD_ValueKind kind, const char *k, const char *v)
{
    (void)kind;
    char *line = cls;
    if (!strcmp(k, "airlock_token") || !strcmp(k, "airlock_port"))
        return MHD_YES;
    size_t n = strlen(line);
    snprintf(line + n, 8192 - n, "%s%s=%s", n > 8 ? "; " : "", k, v ? v : "");
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
        closefd(&x->cancel[i]);
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
    free(x);
    pthread_mutex_lock(&count_lock);
    proxies--;
    pthread_mutex_unlock(&count_lock);
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

enum MHD_Result ad_port_proxy(struct MHD_Connection *c, struct ad_req *q, unsigned port,
                              const char *path, bool host_routed)
{
    if (port < 1 || port > 65535)
        return ad_reply_error(c, q, 400, "invalid", "a port is 1 to 65535");
    pthread_mutex_lock(&count_lock);
    bool room = proxies < PROXIES_MAX;
    proxies += room;
    pthread_mutex_unlock(&count_lock);
    if (!room)
        return ad_reply_error(c, q, 503, "busy", "%d proxied requests at once already",
                              PROXIES_MAX);
    struct proxy *x = calloc(1, sizeof(*x));
    if (!x) {
        pthread_mutex_lock(&count_lock);
        proxies--;
        pthread_mutex_unlock(&count_lock);
        return ad_reply_error(c, q, 500, "internal", "out of memory");
    }
    pthread_mutex_init(&x->mu, NULL);
    pthread_cond_init(&x->cv, NULL);
    x->sp[0] = x->sp[1] = x->body[0] = x->body[1] = x->cancel[0] = x->cancel[1] = -1;
    x->port = port;
    x->sess = q->sess; /* the reference moves here */
    q->sess = NULL;
    unsigned char rnd[16];
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (RAND_bytes(rnd, sizeof(rnd)) == 1) {
        snprintf(x->sock_name, sizeof(x->sock_name), "airlockd-proxy-");
        for (size_t i = 0; i < 8; i++)
            snprintf(x->sock_name + strlen(x->sock_name), 3, "%02x", rnd[i]);
        memcpy(sa.sun_path + 1, x->sock_name, strlen(x->sock_name));
    }
    socklen_t sl = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(x->sock_name));
    if (!x->sock_name[0] || (x->sp[0] = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 ||
        bind(x->sp[0], (struct sockaddr *)&sa, sl) < 0 || listen(x->sp[0], 1) < 0 ||
        pipe2(x->body, O_CLOEXEC) < 0 || pipe2(x->cancel, O_CLOEXEC | O_NONBLOCK) < 0 ||
        !(x->curl = curl_easy_init())) {
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
    MHD_get_connection_values(c, MHD_COOKIE_KIND, add_cookie, cookie);
    if (strlen(cookie) > 8)
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

/* The CLI as a client of airlockd (docs/API.md): `airlock session start|ls|stop|extend`,
 * `airlock exec --session ID`, and exec/ps against a daemon named by --server or $AIRLOCK_HOST.
 * HTTP through libcurl (a unix socket or TCP), events through the model client's SSE parser. */
#include "cli.h"
#include "model.h"
#include "tar.h" /* al_runner */

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <openssl/evp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_SOCKET "/run/airlock/airlockd.sock"
/* An answer that is not an event stream: a session, a list of them. */
#define BODY_MAX (4u << 20)
/* Reconnects of one event stream before giving up. */
#define STREAM_RETRIES 5

struct remote {
    char base[512];        /* "http://localhost" for a socket, else the URL */
    const char *unix_path; /* NULL over TCP */
    char auth[600];        /* "Authorization: Bearer ..." or "" */
    bool quiet;            /* call() says nothing of failures (a daemon asked on the side) */
};

static int remote_init(struct remote *r, const struct cli_globals *g)
{
    const char *url = g->server ? g->server : getenv("AIRLOCK_HOST");
    const char *key = g->api_key ? g->api_key : getenv("AIRLOCK_API_KEY");
    if (!url || !*url)
        url = DEFAULT_SOCKET;
    if (!strncmp(url, "unix:", 5))
        url += 5;
    memset(r, 0, sizeof(*r));
    if (url[0] == '/') {
        r->unix_path = url;
        snprintf(r->base, sizeof(r->base), "http://localhost");
    } else if (!strncmp(url, "http://", 7) || !strncmp(url, "https://", 8)) {
        snprintf(r->base, sizeof(r->base), "%s", url);
        size_t n = strlen(r->base);
        while (n && r->base[n - 1] == '/')
            r->base[--n] = 0;
    } else {
        fprintf(stderr,
                "airlock: --server wants unix:/path, http://host:port or "
                "https://host:port, not '%s'\n",
                url);
        return -EINVAL;
    }
    if (key && *key)
        snprintf(r->auth, sizeof(r->auth), "Authorization: Bearer %s", key);
    return 0;
}

struct body {
    char *buf;
    size_t len;
};

/* A body up to max bytes (to_body: BODY_MAX). */
static size_t body_grow(struct body *b, const char *p, size_t k, size_t max)
{
    if (b->len + k > max)
        return 0;
    char *nb = realloc(b->buf, b->len + k + 1);
    if (!nb)
        return 0;
    memcpy(nb + b->len, p, k);
    b->buf = nb;
    b->len += k;
    b->buf[b->len] = 0;
    return k;
}

/* A screenshot: as much as the library lets a screenshot be. */
static size_t to_body_large(char *p, size_t size, size_t n, void *ctx)
{
    return body_grow(ctx, p, size * n, AL_SCREENSHOT_BYTES_MAX);
}

static size_t to_body(char *p, size_t size, size_t n, void *ctx)
{
    return body_grow(ctx, p, size * n, BODY_MAX);
}

static CURL *handle(const struct remote *r, const char *method, const char *path,
                    struct curl_slist **hdrs)
{
    CURL *c = curl_easy_init();
    if (!c)
        return NULL;
    char url[1024];
    snprintf(url, sizeof(url), "%s%s", r->base, path);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    if (r->unix_path)
        curl_easy_setopt(c, CURLOPT_UNIX_SOCKET_PATH, r->unix_path);
    if (r->auth[0])
        *hdrs = curl_slist_append(*hdrs, r->auth);
    return c;
}

/* Sends the request c (made by handle) with hdrs, the answer's body to write(data); frees
 * both. The HTTP status in *status (0: none came). */
static CURLcode perform(CURL *c, struct curl_slist *hdrs, curl_write_callback write, void *data,
                        long *status)
{
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, data);
    CURLcode cc = curl_easy_perform(c);
    *status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, status);
    curl_easy_cleanup(c);
    curl_slist_free_all(hdrs);
    return cc;
}

/* One request with a JSON body (or none); the answer's JSON in *out (NULL when empty). Prints
 * the daemon's error and returns -EIO on an error status. */
static int call(const struct remote *r, const char *method, const char *path, cJSON *in,
                cJSON **out, long *status_out)
{
    struct curl_slist *hdrs = NULL;
    CURL *c = handle(r, method, path, &hdrs);
    if (!c)
        return -ENOMEM;
    char *text = NULL;
    if (in) {
        text = cJSON_PrintUnformatted(in);
        hdrs = curl_slist_append(hdrs, "Content-Type: application/json");
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, text);
    }
    struct body b = {0};
    long status;
    CURLcode cc = perform(c, hdrs, to_body, &b, &status);
    free(text);
    int rc = 0;
    if (cc != CURLE_OK) {
        if (!r->quiet)
            fprintf(stderr,
                    "airlock: cannot reach airlockd at %s: %s; this needs airlockd running "
                    "('systemctl start airlockd', or 'airlockd' as root), or another with "
                    "--server URL\n",
                    r->unix_path ? r->unix_path : r->base, curl_easy_strerror(cc));
        rc = -ECONNREFUSED;
    } else if (status >= 400 && r->quiet) {
        rc = -EIO;
    } else if (status >= 400) {
        cJSON *j = b.buf ? cJSON_Parse(b.buf) : NULL;
        cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
        const char *msg = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "message"));
        char safe[512];
        fprintf(stderr, "airlock: airlockd: %s (%ld)\n",
                al_term_escape(msg ? msg : "error", safe, sizeof(safe)), status);
        cJSON_Delete(j);
        rc = -EIO;
    } else if (out) {
        *out = b.len ? cJSON_Parse(b.buf) : NULL;
    }
    if (status_out)
        *status_out = status;
    free(b.buf);
    return rc;
}

/* ---- exec over the API ---- */

/* Output kept rather than written (proc logs --tail): each piece with its stream. */
struct kept {
    struct kept_piece {
        int stream;
        size_t len;
        unsigned char *p;
    } * v;
    size_t n, cap;
};

struct stream {
    struct cli_termout *tty;
    bool raw;
    al_sse *parser; /* the stream's, for its events' ids */
    uint64_t seen;  /* the last event's id: the stream's ids are 1, 2, ... */
    bool ended;
    int exit_code;
    const char *query; /* added to the events route: "" or "?follow=false..." */
    struct kept *keep; /* NULL: output is written as it comes */
    /* A run of our own (a runner's, below): output to fd[1] and fd[2] (-1: dropped), at most
     * cap bytes each (0: no cap); its end recorded, not printed. */
    bool to_fds;
    int fd[3];
    uint64_t cap, got[3];
    bool truncated[3], signaled, timed_out, failed, not_found;
    int value;
    char why[256];
};

/* One stream's bytes to its fd, within the cap. */
static void to_fd(struct stream *s, int stream, const unsigned char *p, size_t n)
{
    if (s->cap && n > s->cap - s->got[stream]) {
        n = (size_t)(s->cap - s->got[stream]);
        s->truncated[stream] = true;
    }
    s->got[stream] += n;
    if (s->cap && s->got[stream] >= s->cap)
        s->truncated[stream] = true;
    if (s->fd[stream] >= 0 && n && al_write_all(s->fd[stream], p, n) < 0)
        s->fd[stream] = -1; /* the reader went away: the rest is dropped */
}

static void keep_piece(struct kept *k, int stream, const unsigned char *p, size_t n)
{
    if (k->n == k->cap) {
        size_t cap = k->cap ? 2 * k->cap : 64;
        struct kept_piece *v = realloc(k->v, cap * sizeof(*v));
        if (!v)
            return;
        k->v = v;
        k->cap = cap;
    }
    unsigned char *copy = malloc(n ? n : 1);
    if (!copy)
        return;
    memcpy(copy, p, n);
    k->v[k->n++] = (struct kept_piece){stream, n, copy};
}

/* The last lines pieces of k hold (a last line without its newline counts), written as the
 * stream writes output; k is emptied. */
static void kept_tail(struct kept *k, unsigned long lines, struct cli_termout *tty)
{
    size_t from = k->n, off = 0;
    unsigned long seen = 0;
    bool last_byte = true;
    for (size_t i = k->n; i-- > 0 && seen < lines;) {
        for (size_t j = k->v[i].len; j-- > 0;) {
            bool nl = k->v[i].p[j] == '\n';
            if (nl && !last_byte && ++seen == lines) {
                from = i, off = j + 1;
                break;
            }
            last_byte = false;
            from = i, off = j;
        }
    }
    if (!lines)
        from = k->n;
    for (size_t i = from; i < k->n; i++) {
        const unsigned char *p = k->v[i].p + (i == from ? off : 0);
        size_t n = k->v[i].len - (i == from ? off : 0);
        if (tty)
            cli_termout_write(tty, k->v[i].stream, p, n);
        else if (n && al_write_all(k->v[i].stream, p, n) < 0)
            break;
    }
    for (size_t i = 0; i < k->n; i++)
        free(k->v[i].p);
    free(k->v);
    *k = (struct kept){0};
}

static int on_event(void *ctx, const char *event, const char *data, size_t len)
{
    (void)len;
    struct stream *s = ctx;
    const char *id = s->parser ? al_sse_last_id(s->parser) : "";
    s->seen = *id ? strtoull(id, NULL, 10) : s->seen + 1;
    cJSON *j = cJSON_Parse(data);
    if (!j)
        return 0;
    if (!strcmp(event, "output")) {
        const char *b64 = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "data_b64"));
        const char *st = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "stream"));
        size_t n = b64 ? strlen(b64) : 0;
        unsigned char *bytes = malloc(n / 4 * 3 + 3);
        int k =
            bytes && n % 4 == 0 ? EVP_DecodeBlock(bytes, (const unsigned char *)b64, (int)n) : -1;
        if (k >= 0) {
            k -= n >= 1 && b64[n - 1] == '=' ? 1 : 0; /* DecodeBlock counts padding as zeros */
            k -= n >= 2 && b64[n - 2] == '=' ? 1 : 0;
            int stream = st && !strcmp(st, "stderr") ? 2 : 1;
            if (s->keep)
                keep_piece(s->keep, stream, bytes, (size_t)k);
            else if (s->to_fds)
                to_fd(s, stream, bytes, (size_t)k);
            else if (s->tty)
                cli_termout_write(s->tty, stream, bytes, (size_t)k);
            else if (write(stream, bytes, (size_t)k) < 0) {
                /* the reader went away: nothing to tell */
            }
        }
        free(bytes);
    } else if (s->to_fds && !strcmp(event, "exit")) {
        const char *how = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "how"));
        s->signaled = how && !strcmp(how, "signaled");
        s->value = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "value"));
        s->timed_out = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "timed_out"));
        s->ended = true;
    } else if (s->to_fds && !strcmp(event, "error")) {
        const char *code = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "code"));
        const char *msg = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "message"));
        al_term_escape(msg ? msg : "run failed", s->why, sizeof(s->why));
        s->not_found = code && !strcmp(code, "not_found");
        s->failed = s->ended = true;
    } else if (s->to_fds) {
        /* a run of our own has no results to show */
    } else if (!strcmp(event, "result")) {
        /* A kernel run's value or display(), as a local `exec --kernel` prints it: its text;
         * an error's traceback is on stderr already. */
        const cJSON *bundle = cJSON_GetObjectItemCaseSensitive(j, "data");
        const char *text =
            cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(bundle, "text/plain"));
        const char *kind = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "kind"));
        bool image = cJSON_GetObjectItemCaseSensitive(bundle, "image/png") ||
                     cJSON_GetObjectItemCaseSensitive(bundle, "image/jpeg") ||
                     cJSON_GetObjectItemCaseSensitive(bundle, "image/svg+xml");
        if (image)
            fprintf(stderr, "airlock: an image result (fetch figures with the API)\n");
        else if (text && kind && strcmp(kind, "error")) {
            size_t n = strlen(text);
            if (s->tty) {
                cli_termout_write(s->tty, 1, (const uint8_t *)text, n);
                cli_termout_write(s->tty, 1, (const uint8_t *)"\n", 1);
            } else if (write(1, text, n) < 0 || write(1, "\n", 1) < 0) {
                /* the reader went away */
            }
        }
    } else if (!strcmp(event, "refused")) {
        const char *why = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "why"));
        char safe[512];
        fprintf(stderr, "airlock: %s\n",
                al_term_escape(why ? why : "result refused", safe, sizeof(safe)));
    } else if (!strcmp(event, "exit")) {
        const char *how = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "how"));
        int v = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "value"));
        bool timed_out = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "timed_out"));
        s->exit_code = timed_out ? EXIT_TIMED_OUT : how && !strcmp(how, "signaled") ? 128 + v : v;
        s->ended = true;
    } else if (!strcmp(event, "error")) {
        const char *code = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "code"));
        const char *msg = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "message"));
        char safe[512];
        fprintf(stderr, "airlock: %s\n",
                al_term_escape(msg ? msg : "run failed", safe, sizeof(safe)));
        s->exit_code = code && !strcmp(code, "not_found") ? EXIT_NOT_FOUND : EXIT_AIRLOCK_FAILED;
        s->ended = true;
    }
    cJSON_Delete(j);
    return 0;
}

static size_t to_sse(char *p, size_t size, size_t n, void *ctx)
{
    return al_sse_feed(ctx, p, size * n) == 0 ? size * n : 0;
}

struct signal_ctx {
    const struct remote *r;
    char path[300]; /* the run's signal route */
    int cancel_fd;
};

/* Polled by libcurl while the stream waits: a Ctrl-C becomes a signal request. */
static int on_progress(void *ctx, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d)
{
    (void)a, (void)b, (void)c, (void)d;
    struct signal_ctx *sc = ctx;
    uint8_t sig;
    if (sc->cancel_fd < 0 || read(sc->cancel_fd, &sig, 1) != 1)
        return 0;
    cJSON *in = cJSON_CreateObject();
    cJSON_AddNumberToObject(in, "signal", sig == SIGINT || sig == SIGQUIT ? sig : SIGKILL);
    call(sc->r, "POST", sc->path, in, NULL, NULL);
    cJSON_Delete(in);
    return 0;
}

struct stdin_ctx {
    const struct remote *r;
    char path[300]; /* the run's stdin route */
    int fd;         /* what is sent: this process's stdin (0), or a runner's */
};

/* n bytes of buf to the run's stdin route (n <= 0: its EOF); false when the run takes no more. */
static bool post_stdin(const struct remote *r, const char *route, const char *buf, ssize_t n)
{
    struct curl_slist *hdrs = NULL;
    char path[320];
    snprintf(path, sizeof(path), "%s%s", route, n <= 0 ? "?eof=1" : "");
    CURL *c = handle(r, "POST", path, &hdrs);
    if (!c)
        return false;
    hdrs = curl_slist_append(hdrs, "Content-Type: application/octet-stream");
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, buf);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)(n > 0 ? n : 0));
    struct body b = {0};
    long status;
    CURLcode cc = perform(c, hdrs, to_body, &b, &status);
    free(b.buf);
    return n > 0 && cc == CURLE_OK && status < 400;
}

/* Sends fd to the run in pieces, then EOF. */
static void *pump_stdin(void *arg)
{
    struct stdin_ctx *sc = arg;
    char buf[65536];
    for (;;) {
        ssize_t n = read(sc->fd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR)
            continue;
        if (!post_stdin(sc->r, sc->path, buf, n))
            break;
    }
    return NULL;
}

/* A terminal's side in airlockd (exec -t): the keys (cli_tty's pipe) as stdin, its EOF as the
 * terminal closing, and the local terminal's size after each SIGWINCH as a resize. */
struct pty_ctx {
    const struct remote *r;
    char stdin_path[300], resize_path[300];
    int keys_fd, resize_fd, size_fd; /* keys_fd -1: no input (-t without -i) */
    int stop_fd;                     /* readable: the run ended */
};

static void *pump_pty(void *arg)
{
    struct pty_ctx *pc = arg;
    char buf[4096];
    for (;;) {
        struct pollfd pfd[3] = {
            {pc->stop_fd, POLLIN, 0}, {pc->resize_fd, POLLIN, 0}, {pc->keys_fd, POLLIN, 0}};
        if (poll(pfd, pc->keys_fd >= 0 ? 3 : 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (pfd[0].revents)
            break;
        if (pfd[1].revents) { /* sizes queued by the SIGWINCH handler: the newest is the tty's */
            while (read(pc->resize_fd, buf, sizeof(buf)) > 0)
                ;
            struct winsize ws;
            if (pc->size_fd >= 0 && ioctl(pc->size_fd, TIOCGWINSZ, &ws) == 0 && ws.ws_row &&
                ws.ws_col) {
                cJSON *in = cJSON_CreateObject();
                cJSON_AddNumberToObject(in, "rows", ws.ws_row);
                cJSON_AddNumberToObject(in, "cols", ws.ws_col);
                struct remote q = *pc->r;
                q.quiet = true; /* the run may have just ended */
                call(&q, "POST", pc->resize_path, in, NULL, NULL);
                cJSON_Delete(in);
            }
        }
        if (pc->keys_fd < 0 || !pfd[2].revents)
            continue;
        ssize_t n = read(pc->keys_fd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR)
            continue;
        if (!post_stdin(pc->r, pc->stdin_path, buf, n))
            pc->keys_fd = -1; /* the terminal closed (or the run ended): sizes may still go */
    }
    return NULL;
}

static int stream_events(const struct remote *r, const char *sid, const char *rid,
                         struct stream *st, int cancel_fd)
{
    struct signal_ctx sc = {.r = r, .cancel_fd = cancel_fd};
    snprintf(sc.path, sizeof(sc.path), "/v1/sessions/%s/runs/%s/signal", sid, rid);
    for (int attempt = 0; attempt <= STREAM_RETRIES && !st->ended; attempt++) {
        if (attempt)
            sleep(1);
        char path[300], last[64];
        snprintf(path, sizeof(path), "/v1/sessions/%s/runs/%s/events%s", sid, rid,
                 st->query ? st->query : "");
        snprintf(last, sizeof(last), "Last-Event-ID: %llu", (unsigned long long)st->seen);
        struct curl_slist *hdrs = NULL;
        CURL *c = handle(r, "GET", path, &hdrs);
        if (!c)
            return -ENOMEM;
        hdrs = curl_slist_append(hdrs, last);
        al_sse *p = al_sse_new(on_event, st);
        st->parser = p;
        curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
        curl_easy_setopt(c, CURLOPT_XFERINFODATA, &sc);
        long status;
        CURLcode cc = perform(c, hdrs, to_sse, p, &status);
        al_sse_free(p);
        st->parser = NULL;
        if (status >= 400) { /* the daemon's own words: no such session or run, or others */
            char rp[300];
            snprintf(rp, sizeof(rp), "/v1/sessions/%s/runs/%s", sid, rid);
            cJSON *o = NULL;
            if (call(r, "GET", rp, NULL, &o, NULL) == 0)
                fprintf(stderr, "airlock: airlockd refused the run's events (%ld)\n", status);
            cJSON_Delete(o);
            return status == 404 ? -ENOENT : -EIO;
        }
        if (st->query && cc == CURLE_OK && status == 200) /* what was held, all of it */
            return 0;
    }
    if (!st->ended) {
        fprintf(stderr, "airlock: lost the run's events\n");
        return -EIO;
    }
    return 0;
}

/* ---- --put and --get over the files API ---- */

#define REMOTE_COPIES_MAX 32

struct copies {
    char *put[REMOTE_COPIES_MAX][2], *get[REMOTE_COPIES_MAX][2]; /* {source, destination} */
    size_t nput, nget;
};

/* HOST:GUEST (put) or GUEST:HOST (get), split at the first ':'. */
static int copy_add(struct copies *cp, bool put, char *spec)
{
    size_t *n = put ? &cp->nput : &cp->nget;
    char *(*slot)[2] = put ? &cp->put[*n] : &cp->get[*n];
    if (*n >= REMOTE_COPIES_MAX || !cli_split_pair(spec, &(*slot)[0], &(*slot)[1])) {
        fprintf(stderr, "airlock: --%s wants SOURCE:DEST (at most %d)\n", put ? "put" : "get",
                REMOTE_COPIES_MAX);
        return -EINVAL;
    }
    (*n)++;
    return 0;
}

/* The host's side of each copy, before anything is asked of the daemon. */
static int copies_check(const struct copies *cp)
{
    for (size_t i = 0; i < cp->nput; i++)
        if (cli_check_put(cp->put[i][0]) < 0)
            return -EINVAL;
    for (size_t i = 0; i < cp->nget; i++)
        if (cli_check_get(cp->get[i][1]) < 0)
            return -EINVAL;
    return 0;
}

/* /v1/sessions/SID/files?path=GUEST, the path escaped. */
static int files_path(char *out, size_t len, const char *sid, const char *guest)
{
    char *q = curl_easy_escape(NULL, guest, 0);
    if (!q)
        return -ENOMEM;
    int n = snprintf(out, len, "/v1/sessions/%s/files?path=%s", sid, q);
    curl_free(q);
    return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

/* A transfer's failure in one line: the daemon's message, or curl's. */
static int copy_failed(const char *what, const char *name, CURLcode cc, const struct body *b)
{
    cJSON *j = b && b->buf ? cJSON_Parse(b->buf) : NULL;
    const char *msg = cJSON_GetStringValue(
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "error"), "message"));
    char safe[512], n[256];
    fprintf(stderr, "airlock: %s '%s' failed: %s\n", what, al_term_escape(name, n, sizeof(n)),
            cc != CURLE_OK ? curl_easy_strerror(cc)
                           : al_term_escape(msg ? msg : "error", safe, sizeof(safe)));
    cJSON_Delete(j);
    return -EIO;
}

static int copies_put(const struct remote *r, const char *sid, const struct copies *cp)
{
    for (size_t i = 0; i < cp->nput; i++) {
        const char *host = cp->put[i][0], *guest = cp->put[i][1];
        char path[AL_PATH_MAX + 300];
        /* A directory as the target: the file under its own name, as cp does. */
        const char *base = strrchr(host, '/');
        char into[AL_PATH_MAX + 1];
        if (guest[strlen(guest) - 1] == '/') {
            snprintf(into, sizeof(into), "%s%s", guest, base ? base + 1 : host);
            guest = into;
        }
        FILE *f = fopen(host, "rb");
        struct stat st;
        if (!f || fstat(fileno(f), &st) < 0 || files_path(path, sizeof(path), sid, guest) < 0) {
            fprintf(stderr, "airlock: --put: cannot read '%s': %s\n", host, strerror(errno));
            if (f)
                fclose(f);
            return -EIO;
        }
        struct curl_slist *hdrs = curl_slist_append(NULL, "Content-Type: application/octet-stream");
        CURL *c = handle(r, "PUT", path, &hdrs);
        if (!c) {
            fclose(f);
            curl_slist_free_all(hdrs);
            return -ENOMEM;
        }
        curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(c, CURLOPT_READDATA, f);
        curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, (curl_off_t)st.st_size);
        struct body b = {0};
        long status;
        CURLcode cc = perform(c, hdrs, to_body, &b, &status);
        fclose(f);
        int k = cc != CURLE_OK || status >= 400 ? copy_failed("--put", host, cc, &b) : 0;
        free(b.buf);
        if (k < 0)
            return k;
    }
    return 0;
}

static size_t to_file(char *p, size_t size, size_t n, void *ctx)
{
    return fwrite(p, size, n, ctx);
}

/* Each --get, to HOST (or HOST/NAME when HOST is a directory), written to a temporary file and
 * renamed into place; a copy that fails is said and the others are still made. */
static int copies_get(const struct remote *r, const char *sid, const struct copies *cp)
{
    int rc = 0;
    mode_t mask = umask(077);
    umask(mask);
    for (size_t i = 0; i < cp->nget; i++) {
        const char *guest = cp->get[i][0], *host = cp->get[i][1];
        char target[AL_PATH_MAX], tmp[AL_PATH_MAX + 16], path[AL_PATH_MAX + 300];
        struct stat st;
        const char *base = strrchr(guest, '/');
        base = base ? base + 1 : guest;
        if (stat(host, &st) == 0 && S_ISDIR(st.st_mode) && *base && strcmp(base, "..") &&
            strcmp(base, "."))
            snprintf(target, sizeof(target), "%s/%s", host, base);
        else
            snprintf(target, sizeof(target), "%s", host);
        snprintf(tmp, sizeof(tmp), "%s.XXXXXX", target);
        int fd = files_path(path, sizeof(path), sid, guest) < 0 ? -1 : mkostemp(tmp, O_CLOEXEC);
        FILE *f = fd < 0 ? NULL : fdopen(fd, "wb");
        if (!f) {
            fprintf(stderr, "airlock: --get: cannot write next to '%s': %s\n", target,
                    strerror(errno));
            if (fd >= 0)
                close(fd), unlink(tmp);
            rc = -EIO;
            continue;
        }
        struct curl_slist *hdrs = NULL;
        CURL *c = handle(r, "GET", path, &hdrs);
        long status = 0;
        CURLcode cc = c ? perform(c, hdrs, to_file, f, &status) : CURLE_OUT_OF_MEMORY;
        bool ok = cc == CURLE_OK && status == 200;
        if (fclose(f) != 0)
            ok = false;
        if (ok && (chmod(tmp, 0666 & ~mask) < 0 || rename(tmp, target) < 0))
            ok = false;
        if (!ok) {
            /* The error's body went to the file: read it back for its message. */
            struct body b = {0};
            FILE *e = fopen(tmp, "rb");
            char buf[4096];
            size_t k = e ? fread(buf, 1, sizeof(buf) - 1, e) : 0;
            if (e)
                fclose(e);
            buf[k] = '\0';
            b.buf = buf;
            unlink(tmp);
            copy_failed("--get", guest, cc, &b);
            rc = -EIO;
        }
    }
    return rc;
}

/* ---- our own commands in a session of airlockd: the workdir's tar, as for a local one ---- */

struct remote_runner {
    const struct remote *r;
    const char *sid;
};

/* An al_runner's exec (tar.h) through the runs API: stdin from o->stdin_fd, output to its fds
 * within o->output_cap, the end as al_exec would give it. */
static int runner_exec(void *ctx, const al_exec_opts *o, al_exec_result *out, al_error *err)
{
    struct remote_runner *rr = ctx;
    struct remote q = *rr->r;
    q.quiet = true;
    cJSON *in = cJSON_CreateObject();
    cJSON *argv = cJSON_AddArrayToObject(in, "argv");
    for (const char *const *p = o->argv; *p; p++)
        cJSON_AddItemToArray(argv, cJSON_CreateString(*p));
    if (o->cwd)
        cJSON_AddStringToObject(in, "cwd", o->cwd);
    if (o->timeout_ms)
        cJSON_AddNumberToObject(in, "timeout_s", (double)((o->timeout_ms + 999) / 1000));
    if (o->stdin_fd >= 0)
        cJSON_AddBoolToObject(in, "stdin_open", true);
    char path[300], rid[64] = "";
    snprintf(path, sizeof(path), "/v1/sessions/%s/runs", rr->sid);
    cJSON *run = NULL;
    long status = 0;
    int k = call(&q, "POST", path, in, &run, &status);
    cJSON_Delete(in);
    const char *id = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(run, "id"));
    if (id)
        snprintf(rid, sizeof(rid), "%s", id);
    cJSON_Delete(run);
    if (k < 0 || !rid[0])
        return al_err(err, -EIO, "airlockd did not start %s (%ld)", o->argv[0], status);
    pthread_t th;
    struct stdin_ctx sc = {.r = rr->r, .fd = o->stdin_fd};
    snprintf(sc.path, sizeof(sc.path), "/v1/sessions/%s/runs/%s/stdin", rr->sid, rid);
    bool pumping = o->stdin_fd >= 0 && pthread_create(&th, NULL, pump_stdin, &sc) == 0;
    struct stream st = {
        .to_fds = true, .fd = {-1, o->stdout_fd, o->stderr_fd}, .cap = o->output_cap};
    int r = stream_events(rr->r, rr->sid, rid, &st, -1);
    if (pumping)
        pthread_join(th, NULL);
    if (r < 0)
        return al_err(err, -EIO, "lost the run of %s in airlockd", o->argv[0]);
    if (st.failed)
        return al_err(err, st.not_found ? -ENOENT : -EIO, "%s", st.why);
    *out = (al_exec_result){.struct_size = sizeof(al_exec_result),
                            .how = st.signaled ? AL_EXEC_SIGNALED : AL_EXEC_EXITED,
                            .value = st.value,
                            .timed_out = st.timed_out,
                            .truncated_stdout = st.truncated[1],
                            .truncated_stderr = st.truncated[2]};
    return 0;
}

static void usage_exec(FILE *f)
{
    fputs("Usage: airlock [--server URL] exec [--session ID] [OPTIONS] -- CMD [ARGS...]\n"
          "       airlock [--server URL] exec [--session ID] --lang LANG [-k] -c CODE\n"
          "\n"
          "Runs in a session of airlockd: ID, or a fresh one ended afterwards.\n"
          "  --session ID        the session (airlock session start)\n"
          "  --image NAME        a fresh session's image\n"
          "  -i, --interactive   keep stdin open (it is streamed to the run)\n"
          "  -t, --tty           a terminal: the run on a pty of this one's size, this one raw\n"
          "                      " CLI_TTY_LEAVE_HELP "\n"
          "  -m, --memory MIB    a fresh session's memory\n"
          "  -l, --lang LANG     run code in LANG;  -k, --kernel  in its kernel\n"
          "  -c, --code CODE     the code\n"
          "  -e, --env K=V       -w, --cwd DIR    --timeout SECONDS\n"
          "  --raw               guest output to a terminal byte for byte\n"
          "  --put HOST:GUEST    copy a host file into the session before the run\n"
          "  --get GUEST:HOST    copy a file out after it (HOST may be a directory)\n"
          "  --workdir DIR       copy DIR into /workspace (the run's cwd), and afterwards\n"
          "                      show what changed there; --sync-back ask|yes|no applies it\n"
          "  -D, --detach        with --session: start the run, print its id and return; it\n"
          "                      runs beside the session's others ('airlock proc')\n"
          "Server: --server (or $AIRLOCK_HOST) unix:/path, http(s)://host:port; "
          "default " DEFAULT_SOCKET "; --server-key (or $AIRLOCK_API_KEY) for TCP.\n",
          f);
}

int cli_remote_exec(struct cli_globals *g, int argc, char **argv)
{
    enum {
        OPT_SESSION = 1000,
        OPT_RAW,
        OPT_DETACH,
        OPT_PUT,
        OPT_GET,
        OPT_WORKDIR,
        OPT_SYNC,
        OPT_IMAGE,
        OPT_TIMEOUT
    };
    static const struct option opts[] = {
        {"session", required_argument, NULL, OPT_SESSION},
        {"put", required_argument, NULL, OPT_PUT},
        {"workdir", required_argument, NULL, OPT_WORKDIR},
        {"sync-back", required_argument, NULL, OPT_SYNC},
        {"get", required_argument, NULL, OPT_GET},
        {"image", required_argument, NULL, OPT_IMAGE},
        {"interactive", no_argument, NULL, 'i'},
        {"tty", no_argument, NULL, 't'},
        {"memory", required_argument, NULL, 'm'},
        {"lang", required_argument, NULL, 'l'},
        {"code", required_argument, NULL, 'c'},
        {"kernel", no_argument, NULL, 'k'},
        {"env", required_argument, NULL, 'e'},
        {"cwd", required_argument, NULL, 'w'},
        {"timeout", required_argument, NULL, OPT_TIMEOUT},
        {"raw", no_argument, NULL, OPT_RAW},
        {"detach", no_argument, NULL, 'D'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *sid = NULL, *image = NULL, *lang = NULL, *code = NULL, *cwd = NULL;
    struct copies cp = {0};
    const char *workdir = NULL;
    enum cli_sync sync = CLI_SYNC_ASK;
    unsigned long memory = 0, timeout = 0;
    bool kernel = false, raw = false, detach = false, interactive = false, tty = false;
    cJSON *env = cJSON_CreateObject();
    int c;
    while ((c = getopt_long(argc, argv, "+itm:l:c:ke:w:Dh", opts, NULL)) != -1) {
        switch (c) {
        case 'D':
            detach = true;
            break;
        case OPT_WORKDIR:
            workdir = optarg;
            break;
        case OPT_SYNC:
            sync = !strcmp(optarg, "yes")   ? CLI_SYNC_YES
                   : !strcmp(optarg, "no")  ? CLI_SYNC_NO
                   : !strcmp(optarg, "ask") ? CLI_SYNC_ASK
                                            : (enum cli_sync) - 1;
            if ((int)sync < 0) {
                fprintf(stderr, "airlock: --sync-back wants ask, yes or no, not '%s'\n", optarg);
                cJSON_Delete(env);
                return 2;
            }
            break;
        case OPT_PUT:
        case OPT_GET:
            if (copy_add(&cp, c == OPT_PUT, optarg) < 0) {
                cJSON_Delete(env);
                return 2;
            }
            break;
        case OPT_SESSION:
            sid = optarg;
            break;
        case OPT_IMAGE:
            image = optarg;
            break;
        case 'i': /* stdin is streamed to the run as it is; with -t, the terminal's keys */
            interactive = true;
            break;
        case 't':
            tty = true;
            break;
        case 'm':
            memory = cli_number("--memory", optarg, 65536);
            break;
        case 'l':
            lang = optarg;
            break;
        case 'c':
            code = optarg;
            break;
        case 'k':
            kernel = true;
            break;
        case 'e': {
            const char *eq = strchr(optarg, '=');
            if (!eq || eq == optarg) {
                fprintf(stderr, "airlock: --env wants KEY=VALUE, not '%s'\n", optarg);
                cJSON_Delete(env);
                return 2;
            }
            char name[256];
            snprintf(name, sizeof(name), "%.*s", (int)(eq - optarg), optarg);
            cJSON_AddStringToObject(env, name, eq + 1);
            break;
        }
        case 'w':
            cwd = optarg;
            break;
        case OPT_TIMEOUT:
            timeout = cli_number("--timeout", optarg, 4000000);
            break;
        case OPT_RAW:
            raw = true;
            break;
        case 'h':
            usage_exec(stdout);
            cJSON_Delete(env);
            return 0;
        default:
            cJSON_Delete(env);
            return cli_bad_option("exec", argc, argv, "+itm:l:c:ke:w:Dh", opts);
        }
    }
    if (optind < argc && !strcmp(argv[optind], "--"))
        optind++;
    if ((code == NULL) == (optind >= argc) || (code && !lang)) {
        usage_exec(stderr);
        cJSON_Delete(env);
        return 2;
    }
    if (detach && !sid) {
        fprintf(stderr, "airlock: --detach needs --session ID (a fresh session would end with "
                        "the command)\n");
        cJSON_Delete(env);
        return 2;
    }
    if (detach && cp.nget) {
        fprintf(stderr, "airlock: --get needs the run's end: not with --detach\n");
        cJSON_Delete(env);
        return 2;
    }
    if (tty && (kernel || detach || workdir)) {
        fprintf(stderr, "airlock: -t (a terminal) is not for %s\n",
                kernel   ? "a kernel run"
                : detach ? "--detach"
                         : "--workdir");
        cJSON_Delete(env);
        return 2;
    }
    if (copies_check(&cp) < 0) {
        cJSON_Delete(env);
        return EXIT_AIRLOCK_FAILED;
    }
    struct stat wst;
    if (workdir && (stat(workdir, &wst) < 0 || !S_ISDIR(wst.st_mode))) {
        fprintf(stderr, "airlock: --workdir: '%s' is not a directory\n", workdir);
        cJSON_Delete(env);
        return EXIT_AIRLOCK_FAILED;
    }
    if (workdir && detach) {
        fprintf(stderr, "airlock: --workdir needs the run's end: not with --detach\n");
        cJSON_Delete(env);
        return 2;
    }
    struct remote r;
    if (remote_init(&r, g) < 0) {
        cJSON_Delete(env);
        return 2;
    }
    /* the run */
    cJSON *in = cJSON_CreateObject();
    if (code) {
        cJSON_AddStringToObject(in, "code", code);
        cJSON_AddStringToObject(in, "language", lang);
        cJSON_AddBoolToObject(in, "kernel", kernel);
    } else {
        cJSON *a = cJSON_AddArrayToObject(in, "argv");
        for (int i = optind; i < argc; i++)
            cJSON_AddItemToArray(a, cJSON_CreateString(argv[i]));
    }
    cJSON_AddItemToObject(in, "env", env);
    if (cwd)
        cJSON_AddStringToObject(in, "cwd", cwd);
    if (timeout)
        cJSON_AddNumberToObject(in, "timeout_s", (double)timeout);
    bool feed = !isatty(0) && !detach && !tty;
    if (feed)
        cJSON_AddBoolToObject(in, "stdin_open", true);
    /* A terminal: the local one raw (with -i its keys are the run's), its size and TERM. */
    struct cli_tty t = {.relaying = false};
    al_exec_opts teo = AL_EXEC_OPTS_INIT;
    bool tty_open = false;
    if (tty) {
        al_error terr = {0};
        if (cli_tty_open(&t, interactive, &teo, &terr) < 0) {
            cli_error(&terr);
            cJSON_Delete(in);
            return EXIT_AIRLOCK_FAILED;
        }
        tty_open = true;
        cJSON *p = cJSON_AddObjectToObject(in, "pty");
        cJSON_AddNumberToObject(p, "rows", teo.pty_rows);
        cJSON_AddNumberToObject(p, "cols", teo.pty_cols);
        for (size_t i = 0; teo.env && teo.env[i]; i++)
            if (!strncmp(teo.env[i], "TERM=", 5) && !cJSON_GetObjectItemCaseSensitive(env, "TERM"))
                cJSON_AddStringToObject(env, "TERM", teo.env[i] + 5);
    }

    int cancel_fd = cli_cancel_pipe(NULL);
    char own[128] = "";
    int rc = EXIT_AIRLOCK_FAILED;
    cJSON *sess = NULL, *run = NULL;
    al_workdir_diff *diff = NULL;
    if (!sid) { /* a fresh session, ended below */
        cJSON *sin = cJSON_CreateObject();
        if (image)
            cJSON_AddStringToObject(sin, "image", image);
        if (memory)
            cJSON_AddNumberToObject(sin, "memory_mib", (double)memory);
        int k = call(&r, "POST", "/v1/sessions", sin, &sess, NULL);
        cJSON_Delete(sin);
        const char *id = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(sess, "id"));
        if (k < 0 || !id)
            goto out;
        snprintf(own, sizeof(own), "%s", id);
        sid = own;
        if (g->debug)
            fprintf(stderr, "airlock: session %s\n", sid);
    }
    char path[300];
    if (copies_put(&r, sid, &cp) < 0)
        goto out;
    /* The workdir goes in and comes back through our own tar runs, as for a local session. */
    struct remote_runner rr = {&r, sid};
    struct al_runner runner = {.exec = runner_exec, .ctx = &rr, .spool_dir = al_spool_dir()};
    al_workdir_opts wo = AL_WORKDIR_OPTS_INIT;
    al_error werr = {0};
    if (workdir) {
        al_workdir_push_result pr = AL_WORKDIR_PUSH_RESULT_INIT;
        if (al_workdir_push_run(&runner, workdir, &wo, &pr, &werr) < 0) {
            cli_error(&werr);
            goto out;
        }
        cli_workdir_pushed(&pr, AL_WORKDIR_GUEST_DIR, g->quiet);
        al_workdir_push_result_free(&pr);
        if (!cwd)
            cJSON_AddStringToObject(in, "cwd", AL_WORKDIR_GUEST_DIR);
    }
    snprintf(path, sizeof(path), "/v1/sessions/%s/runs", sid);
    const char *rid = NULL;
    if (call(&r, "POST", path, in, &run, NULL) < 0 ||
        !(rid = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(run, "id"))))
        goto out;
    if (detach) {
        char safe[64];
        printf("%s\n", al_term_escape(rid, safe, sizeof(safe)));
        rc = 0;
        goto out;
    }
    pthread_t th;
    struct stdin_ctx sc = {.r = &r};
    snprintf(sc.path, sizeof(sc.path), "/v1/sessions/%s/runs/%s/stdin", sid, rid);
    bool pumping = feed && pthread_create(&th, NULL, pump_stdin, &sc) == 0;
    struct pty_ctx pc = {.r = &r,
                         .keys_fd = interactive ? teo.stdin_fd : -1,
                         .resize_fd = teo.resize_fd,
                         .size_fd = isatty(1)   ? 1
                                    : isatty(0) ? 0
                                                : -1};
    int pty_stop[2] = {-1, -1};
    bool pty_pumping = false;
    if (tty && pipe2(pty_stop, O_CLOEXEC) == 0) {
        pc.stop_fd = pty_stop[0];
        snprintf(pc.stdin_path, sizeof(pc.stdin_path), "/v1/sessions/%s/runs/%s/stdin", sid, rid);
        snprintf(pc.resize_path, sizeof(pc.resize_path), "/v1/sessions/%s/runs/%s/resize", sid,
                 rid);
        pty_pumping = pthread_create(&th, NULL, pump_pty, &pc) == 0;
    }
    struct cli_termout termout;
    cli_termout_init(&termout, false);
    /* A terminal run's bytes go out filtered for the terminal (t.out), with --raw as they are;
     * other output made inert on a terminal. */
    struct stream st = {.tty = raw                         ? NULL
                               : tty                       ? &t.out
                               : cli_termout_any(&termout) ? &termout
                                                           : NULL};
    if (stream_events(&r, sid, rid, &st, cancel_fd) == 0) {
        rc = st.exit_code;
        /* As a local exec: a failed --get keeps a failed command's status, and fails one that
         * succeeded. */
        if (copies_get(&r, sid, &cp) < 0 && rc == 0)
            rc = EXIT_AIRLOCK_FAILED;
        if (workdir && al_workdir_diff_run(&runner, workdir, &wo, &diff, &werr) < 0) {
            cli_error(&werr);
            rc = EXIT_AIRLOCK_FAILED;
        }
    }
    if (st.tty == &termout)
        cli_termout_end(&termout);
    if (pumping)
        pthread_detach(th); /* it ends with the run, or with the process */
    if (pty_pumping) {
        (void)!write(pty_stop[1], "x", 1);
        pthread_join(th, NULL);
    }
    for (int i = 0; i < 2; i++)
        al_closep(&pty_stop[i]);
out:
    if (tty_open) {
        cli_tty_close(&t);
        int left = cli_tty_left(&t, rc); /* a failure of airlock's own stays one */
        rc = rc == EXIT_AIRLOCK_FAILED ? rc : left;
    }
    if (own[0]) {
        snprintf(path, sizeof(path), "/v1/sessions/%s", own);
        call(&r, "DELETE", path, NULL, NULL, NULL);
    }
    /* A fresh session is gone before the question: nothing waits on the user's answer. */
    if (diff) {
        cli_changes_print(diff, "changes in " AL_WORKDIR_GUEST_DIR);
        al_error serr = {0};
        if (cli_workdir_sync(diff, workdir, sync, 0, false, &serr) < 0) {
            if (serr.code)
                cli_error(&serr);
            rc = EXIT_AIRLOCK_FAILED;
        }
        al_workdir_diff_free(diff);
    }
    cJSON_Delete(in);
    cJSON_Delete(sess);
    cJSON_Delete(run);
    return rc;
}

/* airlock shell SESSION for a session of airlockd: exec --session SESSION -i -t, the login
 * shell. */
int cli_remote_shell(struct cli_globals *g, const char *name)
{
    char *args[] = {"exec",    "--session", (char *)name,           "-i", "-t", "--",
                    "/bin/sh", "-c",        (char *)AL_LOGIN_SHELL, NULL};
    optind = 0;
    return cli_remote_exec(g, (int)(sizeof(args) / sizeof(args[0])) - 1, args);
}

/* ---- sessions ---- */

static void usage_session(FILE *f)
{
    fputs("Usage: airlock [--server URL] session start [--image NAME] [--memory MIB] [--cpus N]\n"
          "                 [--idle-timeout S] [--lifetime S] [--checkpoints]\n"
          "                 [--display[=WxH]]\n"
          "                 [--name NAME] [--auto-pause S] [--snapshot NAME]\n"
          "                 [--volume NAME:/PATH[:ro]]...\n"
          "       airlock [--server URL] session ls\n"
          "       airlock [--server URL] session pause|resume ID...\n"
          "       airlock [--server URL] session screenshot ID FILE [--max-edge N]\n"
          "       airlock [--server URL] session input ID ACTIONS-JSON\n"
          "       airlock [--server URL] session stop ID...\n"
          "       airlock [--server URL] session extend ID SECONDS\n"
          "       airlock [--server URL] session fork ID [-n N] [--name NAME]\n"
          "\n"
          "Sessions of airlockd that outlive a command: start prints the id for\n"
          "'airlock exec --session ID'. A session started with --display has a screen\n"
          "(1280x800, or --display=WxH; the desktop image's sessions always have one):\n"
          "screenshot saves it as PNG (FILE - for stdout), input runs mouse and keyboard\n"
          "actions ('[{\"action\": \"left_click\", \"coordinate\": [100, 200]}]', docs/API.md).\n"
          "Sessions outlive restarts of airlockd. pause saves one to disk (its memory freed),\n"
          "resume brings it back as it was; --auto-pause S pauses it after S seconds idle.\n"
          "A session's NAME (unique per key) stands for its ID everywhere. fork starts N\n"
          "sessions (default 1; NAME-1 ...) with the session's whole state as it is now, its\n"
          "processes and kernels with it, and prints their ids. start --snapshot NAME starts\n"
          "one from a snapshot ('airlock snapshot save') instead of an image; --volume mounts\n"
          "a volume ('airlock volume create') at PATH in it.\n"
          "Server: --server (or $AIRLOCK_HOST), default " DEFAULT_SOCKET ".\n",
          f);
}

static int session_start(const struct remote *r, int argc, char **argv)
{
    static const struct option opts[] = {
        {"image", required_argument, NULL, 'I' + 256},
        {"memory", required_argument, NULL, 'm'},
        {"cpus", required_argument, NULL, 'C'},
        {"idle-timeout", required_argument, NULL, 'I'},
        {"lifetime", required_argument, NULL, 'L'},
        {"checkpoints", no_argument, NULL, 'K'},
        {"display", optional_argument, NULL, 'D'},
        {"name", required_argument, NULL, 'N'},
        {"auto-pause", required_argument, NULL, 'P'},
        {"snapshot", required_argument, NULL, 'S' + 256},
        {"volume", required_argument, NULL, 'V' + 256},
        {NULL, 0, NULL, 0},
    };
    cJSON *in = cJSON_CreateObject();
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "im:", opts, NULL)) != -1) {
        switch (c) {
        case 'I' + 256:
            cJSON_AddStringToObject(in, "image", optarg);
            break;
        case 'i': /* exec's -i keeps stdin open, as docker's: here it would mean another thing */
            fprintf(stderr, "airlock: session start has no -i (exec's -i keeps stdin open); "
                            "name the image with --image NAME\n");
            cJSON_Delete(in);
            return 2;
        case 'm':
            cJSON_AddNumberToObject(in, "memory_mib",
                                    (double)cli_number("--memory", optarg, 65536));
            break;
        case 'C':
            cJSON_AddNumberToObject(in, "vcpus", (double)cli_number("--cpus", optarg, 64));
            break;
        case 'I':
            cJSON_AddNumberToObject(in, "idle_timeout_s",
                                    (double)cli_number("--idle-timeout", optarg, 4000000000u));
            break;
        case 'L':
            cJSON_AddNumberToObject(in, "lifetime_s",
                                    (double)cli_number("--lifetime", optarg, 4000000000u));
            break;
        case 'K':
            cJSON_AddBoolToObject(in, "checkpoints", true);
            break;
        case 'D': {
            cJSON_AddBoolToObject(in, "display", true);
            if (!optarg)
                break;
            unsigned w = 0, h = 0;
            char tail;
            al_error derr = {0};
            if (sscanf(optarg, "%ux%u%c", &w, &h, &tail) != 2 || !w || !h ||
                al_display_size_check(w, h, &derr) < 0) {
                fprintf(stderr, "airlock: --display wants WIDTHxHEIGHT%s%s, not '%s'\n",
                        derr.msg[0] ? ": " : "", derr.msg, optarg);
                cJSON_Delete(in);
                return 2;
            }
            cJSON_AddNumberToObject(in, "display_width", w);
            cJSON_AddNumberToObject(in, "display_height", h);
            break;
        }
        case 'N':
            cJSON_AddStringToObject(in, "name", optarg);
            break;
        case 'P':
            cJSON_AddNumberToObject(in, "auto_pause_s",
                                    (double)cli_number("--auto-pause", optarg, 4000000000u));
            break;
        case 'S' + 256:
            cJSON_AddStringToObject(in, "snapshot", optarg);
            break;
        case 'V' + 256: { /* NAME:/PATH[:ro] */
            const char *colon = strchr(optarg, ':');
            size_t plen = colon ? strlen(colon + 1) : 0;
            bool ro = plen > 3 && !strcmp(colon + 1 + plen - 3, ":ro");
            if (!colon || colon == optarg || plen < 2 || colon[1] != '/') {
                fprintf(stderr, "airlock: --volume wants NAME:/PATH[:ro], not '%s'\n", optarg);
                cJSON_Delete(in);
                return 2;
            }
            cJSON *vols = cJSON_GetObjectItemCaseSensitive(in, "volumes");
            if (!vols)
                vols = cJSON_AddArrayToObject(in, "volumes");
            cJSON *v = cJSON_CreateObject();
            char name[200], path[300];
            snprintf(name, sizeof(name), "%.*s", (int)(colon - optarg), optarg);
            snprintf(path, sizeof(path), "%.*s", (int)(ro ? plen - 3 : plen), colon + 1);
            cJSON_AddStringToObject(v, "name", name);
            cJSON_AddStringToObject(v, "path", path);
            cJSON_AddBoolToObject(v, "read_only", ro);
            cJSON_AddItemToArray(vols, v);
            break;
        }
        default:
            cJSON_Delete(in);
            return cli_bad_option("session", argc, argv, "im:", opts);
        }
    }
    cJSON *out = NULL;
    int k = call(r, "POST", "/v1/sessions", in, &out, NULL);
    cJSON_Delete(in);
    const char *id = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(out, "id"));
    if (k == 0 && id)
        printf("%s\n", id);
    cJSON_Delete(out);
    return k == 0 && id ? 0 : 1;
}

/* airlock session screenshot ID FILE [--max-edge N]: the PNG written beside FILE and renamed
 * into place (or to stdout for -); the daemon's refusal said in one line. */
static int session_screenshot(const struct remote *r, int argc, char **argv)
{
    static const struct option opts[] = {
        {"max-edge", required_argument, NULL, 'E'},
        {NULL, 0, NULL, 0},
    };
    unsigned long long edge = 0;
    int c;
    optind = 0; /* 0: glibc starts afresh, permuting ID and FILE after the options */
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c != 'E')
            return cli_bad_option("session", argc, argv, "", opts);
        edge = cli_number("--max-edge", optarg, 65535);
    }
    if (argc - optind != 2) {
        usage_session(stderr);
        return 2;
    }
    const char *sid = argv[optind], *file = argv[optind + 1];
    char path[400];
    snprintf(path, sizeof(path), "/v1/sessions/%s/screen", sid);
    if (edge)
        snprintf(path + strlen(path), sizeof(path) - strlen(path), "?max_edge=%llu", edge);
    struct curl_slist *hdrs = NULL;
    CURL *h = handle(r, "GET", path, &hdrs);
    struct body b = {0};
    long status = 0;
    CURLcode cc = h ? perform(h, hdrs, to_body_large, &b, &status) : CURLE_OUT_OF_MEMORY;
    int rc = 0;
    if (cc != CURLE_OK || status != 200) {
        copy_failed("screenshot of", sid, cc, &b);
        rc = 1;
    } else if (!strcmp(file, "-")) {
        rc = fwrite(b.buf, 1, b.len, stdout) != b.len || fflush(stdout) != 0;
    } else {
        char tmp[AL_PATH_MAX + 16];
        snprintf(tmp, sizeof(tmp), "%s.XXXXXX", file);
        int fd = mkostemp(tmp, O_CLOEXEC);
        bool ok = fd >= 0 && write(fd, b.buf, b.len) == (ssize_t)b.len;
        mode_t mask = umask(077);
        umask(mask);
        if (fd >= 0 && close(fd) != 0)
            ok = false;
        if (ok && (chmod(tmp, 0666 & ~mask) < 0 || rename(tmp, file) < 0))
            ok = false;
        if (!ok) {
            char n[256];
            fprintf(stderr, "airlock: cannot write '%s': %s\n", al_term_escape(file, n, sizeof(n)),
                    strerror(errno));
            if (fd >= 0)
                unlink(tmp);
            rc = 1;
        }
    }
    free(b.buf);
    return rc;
}

/* airlock session input ID ACTIONS-JSON: the daemon's answer printed as it came. */
static int session_input(const struct remote *r, const char *sid, const char *json)
{
    cJSON *acts = cJSON_Parse(json);
    if (!cJSON_IsArray(acts)) {
        cJSON_Delete(acts);
        fprintf(stderr, "airlock: the actions are not a JSON array (docs/API.md: "
                        "'[{\"action\": \"left_click\", \"coordinate\": [100, 200]}]')\n");
        return 2;
    }
    cJSON *in = cJSON_CreateObject();
    cJSON_AddItemToObject(in, "actions", acts);
    char path[300];
    snprintf(path, sizeof(path), "/v1/sessions/%s/input", sid);
    cJSON *out = NULL;
    int k = call(r, "POST", path, in, &out, NULL);
    cJSON_Delete(in);
    char *text = out ? cJSON_PrintUnformatted(out) : NULL;
    if (k == 0 && text)
        printf("%s\n", text);
    free(text);
    cJSON_Delete(out);
    return k == 0 ? 0 : 1;
}

/* ---- the sessions one sees: airlock ps, airlock session ls ---- */

static void print_local(void *ctx, const al_session_info *info)
{
    time_t now = *(time_t *)ctx;
    long age = (long)(now - info->started);
    char name[64], image[64];
    printf("%-22s %-12s %6lds %-9ld %s\n", al_term_escape(info->name, name, sizeof(name)),
           al_term_escape(info->image, image, sizeof(image)), age > 0 ? age : 0, info->pid, "-");
}

/* The daemon's (r's) sessions as rows of the table; -1 when it did not answer. */
static int print_daemon(const struct remote *r)
{
    cJSON *out = NULL;
    if (call(r, "GET", "/v1/sessions", NULL, &out, NULL) < 0)
        return -1;
    time_t now = time(NULL);
    cJSON *s;
    cJSON_ArrayForEach(s, cJSON_GetObjectItemCaseSensitive(out, "sessions"))
    {
        char id[64], image[64], expires[24] = "-";
        al_term_escape(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(s, "id")) ?: "?", id,
                       sizeof(id));
        al_term_escape(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(s, "image")) ?: "?",
                       image, sizeof(image));
        time_t created =
            (time_t)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(s, "created"));
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(s, "expires");
        if (cJSON_IsNumber(e))
            cli_duration(difftime((time_t)e->valuedouble, now), expires, sizeof(expires));
        printf("%-22s %-12s %6.0fs %-9s %s\n", id, image, difftime(now, created), "airlockd",
               expires);
    }
    cJSON_Delete(out);
    return 0;
}

bool cli_daemon_here(void)
{
    return access(DEFAULT_SOCKET, F_OK) == 0;
}

int cli_sessions_table(struct cli_globals *g)
{
    /* A daemon named (--server, $AIRLOCK_HOST) must answer; the default one is asked only when
     * its socket is there, and quietly (it may not let this user in). */
    bool named = cli_remote_wanted(g);
    time_t now = time(NULL);
    printf("%-22s %-12s %7s %-9s %s\n", "NAME", "IMAGE", "AGE", "WHERE", "EXPIRES");
    al_error err = {0};
    int rc = 0;
    if (al_session_list(print_local, &now, &err) < 0) {
        cli_error(&err);
        rc = 1;
    }
    struct remote r;
    if (!named && !cli_daemon_here())
        return rc;
    if (remote_init(&r, g) < 0)
        return 2;
    r.quiet = !named;
    if (print_daemon(&r) < 0 && named)
        rc = 1;
    return rc;
}

int cli_remote_cp(struct cli_globals *g, const char *session, const char *src, const char *dst,
                  bool to_guest)
{
    struct remote r;
    if (remote_init(&r, g) < 0)
        return 2;
    struct copies cp = {0};
    char *pair[2] = {(char *)src, (char *)dst};
    if (to_guest) {
        memcpy(cp.put[0], pair, sizeof(pair));
        cp.nput = 1;
    } else {
        memcpy(cp.get[0], pair, sizeof(pair));
        cp.nget = 1;
    }
    if (copies_check(&cp) < 0)
        return 1;
    return (to_guest ? copies_put(&r, session, &cp) : copies_get(&r, session, &cp)) < 0;
}

int cli_remote_commit(struct cli_globals *g, const char *session, const char *name,
                      const char *checkpoint, bool force)
{
    struct remote r;
    if (remote_init(&r, g) < 0)
        return 2;
    char path[300];
    snprintf(path, sizeof(path), "/v1/sessions/%s/image", session);
    cJSON *in = cJSON_CreateObject();
    cJSON_AddStringToObject(in, "name", name);
    if (checkpoint)
        cJSON_AddStringToObject(in, "checkpoint", checkpoint);
    if (force)
        cJSON_AddBoolToObject(in, "replace", true);
    int k = call(&r, "POST", path, in, NULL, NULL);
    cJSON_Delete(in);
    if (k < 0)
        return 1;
    char n[128], sid[128];
    fprintf(stderr,
            "airlock: image '%s' saved from session %s (an image of airlockd's, yours there: "
            "start sessions of it through airlockd)\n",
            al_term_escape(name, n, sizeof(n)), al_term_escape(session, sid, sizeof(sid)));
    return 0;
}

/* ---- airlock port: a byte stream to a guest port through the daemon ---- */

struct cli_tunnel {
    struct remote r;
    char route[300]; /* GET .../tcp/PORT */
    char host[256];  /* the Host header */
};

struct cli_tunnel *cli_tunnel_new(struct cli_globals *g, const char *session, unsigned guest_port)
{
    struct cli_tunnel *t = calloc(1, sizeof(*t));
    if (!t || remote_init(&t->r, g) < 0) {
        free(t);
        return NULL;
    }
    char path[300];
    snprintf(path, sizeof(path), "/v1/sessions/%s", session);
    cJSON *out = NULL;
    if (call(&t->r, "GET", path, NULL, &out, NULL) < 0) { /* said: no such session */
        free(t);
        return NULL;
    }
    cJSON_Delete(out);
    snprintf(t->route, sizeof(t->route), "/v1/sessions/%s/tcp/%u", session, guest_port);
    const char *h = strstr(t->r.base, "://");
    snprintf(t->host, sizeof(t->host), "%s", h ? h + 3 : "localhost");
    return t;
}

void cli_tunnel_free(struct cli_tunnel *t)
{
    free(t);
}

/* Waits for sock (events) or a byte on cancel_fd; false on the cancel or an error. */
static bool tunnel_wait(curl_socket_t sock, short events, int cancel_fd)
{
    struct pollfd p[2] = {{sock, events, 0}, {cancel_fd, POLLIN, 0}};
    int n = poll(p, cancel_fd >= 0 ? 2 : 1, 30000);
    return n > 0 && !p[1].revents;
}

static bool tunnel_send(CURL *c, curl_socket_t sock, const char *p, size_t len, int cancel_fd)
{
    while (len) {
        size_t n = 0;
        CURLcode cc = curl_easy_send(c, p, len, &n);
        if (cc == CURLE_AGAIN) {
            if (!tunnel_wait(sock, POLLOUT, cancel_fd))
                return false;
            continue;
        }
        if (cc != CURLE_OK)
            return false;
        p += n;
        len -= n;
    }
    return true;
}

/* Bytes both ways between fd and the upgraded connection, as al_port_relay: fd's end shuts the
 * tunnel's write half (over plain sockets; TLS has no half-close), the tunnel's end shuts fd's
 * and ends the relay. */
static int tunnel_pump(CURL *c, curl_socket_t sock, bool tls, int fd, int cancel_fd, char *buf,
                       size_t size)
{
    bool fd_open = true;
    for (;;) {
        /* what TLS holds decrypted is not seen by poll: take it first */
        for (;;) {
            size_t n = 0;
            CURLcode cc = curl_easy_recv(c, buf, size, &n);
            if (cc == CURLE_AGAIN)
                break;
            if (cc != CURLE_OK || n == 0) {
                shutdown(fd, SHUT_WR);
                return 0;
            }
            if (al_write_all(fd, buf, n) < 0)
                return 0; /* fd's peer is gone */
        }
        struct pollfd p[3] = {{sock, POLLIN, 0}, {cancel_fd, POLLIN, 0}, {fd, POLLIN, 0}};
        if (poll(p, fd_open ? 3 : 2, -1) < 0 && errno != EINTR)
            return -errno;
        if (p[1].revents)
            return -ECANCELED;
        if (!fd_open || !p[2].revents)
            continue;
        ssize_t n = read(fd, buf, size);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            fd_open = false;
            if (!tls)
                shutdown(sock, SHUT_WR);
            continue;
        }
        if (!tunnel_send(c, sock, buf, (size_t)n, cancel_fd))
            return 0;
    }
}

int cli_tunnel_relay(void *tunnel, int fd, int cancel_fd, al_error *err)
{
    struct cli_tunnel *t = tunnel;
    CURL *c = curl_easy_init();
    if (!c)
        return al_err(err, -ENOMEM, "out of memory");
    curl_easy_setopt(c, CURLOPT_URL, t->r.base);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_CONNECT_ONLY, 1L);
    if (t->r.unix_path)
        curl_easy_setopt(c, CURLOPT_UNIX_SOCKET_PATH, t->r.unix_path);
    CURLcode cc = curl_easy_perform(c);
    curl_socket_t sock = CURL_SOCKET_BAD;
    if (cc == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_ACTIVESOCKET, &sock);
    if (cc != CURLE_OK || sock == CURL_SOCKET_BAD) {
        curl_easy_cleanup(c);
        return al_err(err, -ECONNREFUSED, "cannot reach airlockd: %s", curl_easy_strerror(cc));
    }
    size_t size = 65536;
    char *buf = malloc(size);
    int n = buf ? snprintf(buf, size,
                           "GET %s HTTP/1.1\r\nHost: %s\r\n%s%sConnection: Upgrade\r\n"
                           "Upgrade: airlock-tcp\r\n\r\n",
                           t->route, t->host, t->r.auth, t->r.auth[0] ? "\r\n" : "")
                : -1;
    int r = 0;
    if (n < 0 || (size_t)n >= size || !tunnel_send(c, sock, buf, (size_t)n, cancel_fd)) {
        r = al_err(err, -EIO, "airlockd took no tunnel request");
        goto out;
    }
    /* the answer's head: 101, or an error whose JSON follows */
    size_t got = 0;
    char *end = NULL;
    while (!end) {
        size_t k = 0;
        cc = curl_easy_recv(c, buf + got, size - 1 - got, &k);
        if (cc == CURLE_AGAIN) {
            if (!tunnel_wait(sock, POLLIN, cancel_fd)) {
                r = al_err(err, -ETIMEDOUT, "airlockd did not answer the tunnel request");
                goto out;
            }
            continue;
        }
        if (cc != CURLE_OK || k == 0 || got + k >= size - 1) {
            r = al_err(err, -EIO, "airlockd ended the tunnel request without an answer");
            goto out;
        }
        got += k;
        buf[got] = '\0';
        end = strstr(buf, "\r\n\r\n");
    }
    int status = 0;
    if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1 || status != 101) {
        cJSON *j = cJSON_Parse(end + 4);
        const char *msg = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(j, "error"), "message"));
        r = al_err(err, status == 404 ? -ENOENT : -EIO, "airlockd refused the tunnel (%d)%s%s",
                   status, msg ? ": " : "", msg ? msg : "");
        cJSON_Delete(j);
        goto out;
    }
    size_t early = got - (size_t)(end + 4 - buf);
    if (early && al_write_all(fd, end + 4, early) < 0)
        goto out;
    r = tunnel_pump(c, sock, !strncmp(t->r.base, "https:", 6), fd, cancel_fd, buf, size);
    if (r < 0 && r != -ECANCELED)
        al_err(err, r, "the tunnel failed: %s", strerror(-r));
out:
    free(buf);
    curl_easy_cleanup(c);
    return r;
}

/* session fork ID [-n N] [--name NAME]: each fork's id on a line; one that failed alone is a
 * line on stderr and exit 1. */
static int session_fork(const struct remote *r, int argc, char **argv)
{
    static const struct option opts[] = {
        {"count", required_argument, NULL, 'n'},
        {"name", required_argument, NULL, 'N'},
        {NULL, 0, NULL, 0},
    };
    cJSON *in = cJSON_CreateObject();
    int c;
    optind = 0; /* anew: the options may follow the id */
    while ((c = getopt_long(argc, argv, "n:", opts, NULL)) != -1) {
        if (c == 'n')
            cJSON_AddNumberToObject(in, "count", (double)cli_number("N", optarg, 16));
        else if (c == 'N')
            cJSON_AddStringToObject(in, "name", optarg);
        else {
            cJSON_Delete(in);
            usage_session(stderr);
            return 2;
        }
    }
    if (optind != argc - 1) {
        cJSON_Delete(in);
        usage_session(stderr);
        return 2;
    }
    char path[300];
    snprintf(path, sizeof(path), "/v1/sessions/%s/fork", argv[optind]);
    cJSON *out = NULL;
    int k = call(r, "POST", path, in, &out, NULL);
    cJSON_Delete(in);
    if (k < 0)
        return 1;
    int rc = 0;
    cJSON *x;
    cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(out, "forks"))
    {
        char safe[600];
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(x, "error");
        if (e) {
            const char *msg = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "message"));
            fprintf(stderr, "airlock: a fork failed: %s\n",
                    al_term_escape(msg ? msg : "no reason given", safe, sizeof(safe)));
            rc = 1;
            continue;
        }
        const char *id = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(x, "id"));
        printf("%s\n", al_term_escape(id ? id : "?", safe, sizeof(safe)));
    }
    cJSON_Delete(out);
    return rc;
}

int cli_remote_session(struct cli_globals *g, int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage_session(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    struct remote r;
    if (remote_init(&r, g) < 0)
        return 2;
    const char *sub = argv[1];
    if (!strcmp(sub, "start"))
        return session_start(&r, argc - 1, argv + 1);
    if (!strcmp(sub, "ls") && argc == 2)
        return cli_sessions_table(g);
    if (!strcmp(sub, "screenshot"))
        return session_screenshot(&r, argc - 1, argv + 1);
    if (!strcmp(sub, "input") && argc == 4)
        return session_input(&r, argv[2], argv[3]);
    bool pause = !strcmp(sub, "pause"), resume = !strcmp(sub, "resume");
    if ((!strcmp(sub, "stop") || !strcmp(sub, "rm") || pause || resume) && argc >= 3) {
        int rc = 0;
        for (int i = 2; i < argc; i++) {
            char path[300];
            snprintf(path, sizeof(path), "/v1/sessions/%s%s", argv[i],
                     pause    ? "/pause"
                     : resume ? "/resume"
                              : "");
            if (call(&r, pause || resume ? "POST" : "DELETE", path, NULL, NULL, NULL) < 0)
                rc = 1;
        }
        return rc;
    }
    if (!strcmp(sub, "fork") && argc >= 3)
        return session_fork(&r, argc - 1, argv + 1);
    if (!strcmp(sub, "extend") && argc == 4) {
        char path[300];
        snprintf(path, sizeof(path), "/v1/sessions/%s/extend", argv[2]);
        cJSON *in = cJSON_CreateObject();
        cJSON_AddNumberToObject(in, "seconds", (double)cli_number("SECONDS", argv[3], 4000000000u));
        int k = call(&r, "POST", path, in, NULL, NULL);
        cJSON_Delete(in);
        return k < 0;
    }
    usage_session(stderr);
    return 2;
}

/* ---- snapshots: airlock snapshot ---- */

/* DELETE base + each name; 1 when any failed (each said why on a line). */
static int delete_each(const struct remote *r, const char *base, int n, char **names)
{
    int rc = 0;
    for (int i = 0; i < n; i++) {
        char path[300];
        snprintf(path, sizeof(path), "%s%s", base, names[i]);
        if (call(r, "DELETE", path, NULL, NULL, NULL) < 0)
            rc = 1;
    }
    return rc;
}

static void usage_snapshot(FILE *f)
{
    fputs("Usage: airlock [--server URL] snapshot save SESSION NAME [--replace]\n"
          "       airlock [--server URL] snapshot ls\n"
          "       airlock [--server URL] snapshot rm NAME...\n"
          "\n"
          "Snapshots of airlockd: a session's whole state (memory, processes, kernels, files)\n"
          "saved under a NAME of this user's or this key's, outliving the session; start\n"
          "sessions from one with 'airlock session start --snapshot NAME'. save keeps the\n"
          "session running (it stands still for the save); --replace saves over a snapshot\n"
          "of that name; ls lists them with their size; rm removes them (sessions started\n"
          "from one go on).\n",
          f);
}

static void human_bytes(double b, char *buf, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    size_t u = 0;
    while (b >= 1024 && u + 1 < sizeof(units) / sizeof(units[0]))
        b /= 1024, u++;
    snprintf(buf, len, u ? "%.1f %s" : "%.0f %s", b, units[u]);
}

int cli_remote_snapshot(struct cli_globals *g, int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage_snapshot(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    struct remote r;
    if (remote_init(&r, g) < 0)
        return 2;
    const char *sub = argv[1];
    if (!strcmp(sub, "save") && (argc == 4 || (argc == 5 && !strcmp(argv[4], "--replace")))) {
        char path[300];
        snprintf(path, sizeof(path), "/v1/sessions/%s/snapshots", argv[2]);
        cJSON *in = cJSON_CreateObject(), *out = NULL;
        cJSON_AddStringToObject(in, "name", argv[3]);
        cJSON_AddBoolToObject(in, "replace", argc == 5);
        int k = call(&r, "POST", path, in, &out, NULL);
        cJSON_Delete(in);
        if (k < 0)
            return 1;
        char size[32], safe[200];
        human_bytes(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(out, "bytes")), size,
                    sizeof(size));
        printf("%s\t%s\n",
               al_term_escape(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(out, "name"))
                                  ?: "?",
                              safe, sizeof(safe)),
               size);
        cJSON_Delete(out);
        return 0;
    }
    if (!strcmp(sub, "ls") && argc == 2) {
        cJSON *out = NULL;
        if (call(&r, "GET", "/v1/snapshots", NULL, &out, NULL) < 0)
            return 1;
        printf("%-32s %-16s %10s %s\n", "NAME", "IMAGE", "SIZE", "CREATED");
        cJSON *x;
        cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(out, "snapshots"))
        {
            char name[200], image[80], size[32], when[32];
            al_term_escape(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(x, "name")) ?: "?",
                           name, sizeof(name));
            al_term_escape(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(x, "image"))
                               ?: "?",
                           image, sizeof(image));
            human_bytes(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(x, "bytes")), size,
                        sizeof(size));
            time_t t = (time_t)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(x, "created"));
            struct tm tm;
            strftime(when, sizeof(when), "%Y-%m-%d %H:%M", localtime_r(&t, &tm));
            printf("%-32s %-16s %10s %s\n", name, image, size, when);
        }
        cJSON_Delete(out);
        return 0;
    }
    if (!strcmp(sub, "rm") && argc >= 3)
        return delete_each(&r, "/v1/snapshots/", argc - 2, argv + 2);
    usage_snapshot(stderr);
    return 2;
}

/* ---- volumes: airlock volume ---- */

static void usage_volume(FILE *f)
{
    fputs("Usage: airlock [--server URL] volume create NAME [--size BYTES]\n"
          "       airlock [--server URL] volume ls\n"
          "       airlock [--server URL] volume rm NAME...\n"
          "\n"
          "Volumes of airlockd: disks of this user's or this key's that outlive sessions.\n"
          "'airlock session start --volume NAME:/PATH' mounts one read-write in a session\n"
          "(one at a time), ':ro' read-only (any number while none writes). create makes an\n"
          "empty one (--size: 1 GiB by default; K, M, G, T suffixes); rm removes one no\n"
          "session has attached.\n",
          f);
}

int cli_remote_volume(struct cli_globals *g, int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage_volume(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    struct remote r;
    if (remote_init(&r, g) < 0)
        return 2;
    const char *sub = argv[1];
    if (!strcmp(sub, "create") && (argc == 3 || (argc == 5 && !strcmp(argv[3], "--size")))) {
        cJSON *in = cJSON_CreateObject();
        cJSON_AddStringToObject(in, "name", argv[2]);
        if (argc == 5) {
            char *end = NULL;
            double v = strtod(argv[4], &end);
            const char *units = "KMGT", *u = end && *end ? strchr(units, *end) : NULL;
            if (!end || end == argv[4] || v <= 0 || (*end && (!u || end[1]))) {
                fprintf(stderr, "airlock: --size wants bytes (K, M, G, T suffixes), not '%s'\n",
                        argv[4]);
                cJSON_Delete(in);
                return 2;
            }
            for (const char *p = units; u && p <= u; p++)
                v *= 1024;
            cJSON_AddNumberToObject(in, "size_bytes", v);
        }
        int k = call(&r, "POST", "/v1/volumes", in, NULL, NULL);
        cJSON_Delete(in);
        return k < 0;
    }
    if (!strcmp(sub, "ls") && argc == 2) {
        cJSON *out = NULL;
        if (call(&r, "GET", "/v1/volumes", NULL, &out, NULL) < 0)
            return 1;
        printf("%-32s %10s %10s %s\n", "NAME", "SIZE", "USED", "ATTACHED");
        cJSON *x;
        cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(out, "volumes"))
        {
            char name[200], size[32], used[32];
            al_term_escape(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(x, "name")) ?: "?",
                           name, sizeof(name));
            human_bytes(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(x, "size_bytes")),
                        size, sizeof(size));
            human_bytes(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(x, "bytes")), used,
                        sizeof(used));
            bool in_use = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(x, "in_use"));
            bool rw = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(x, "read_write"));
            printf("%-32s %10s %10s %s\n", name, size, used,
                   !in_use ? "-"
                   : rw    ? "read-write"
                           : "read-only");
        }
        cJSON_Delete(out);
        return 0;
    }
    if (!strcmp(sub, "rm") && argc >= 3)
        return delete_each(&r, "/v1/volumes/", argc - 2, argv + 2);
    usage_volume(stderr);
    return 2;
}

/* ---- a session's runs: airlock proc ---- */

static void usage_proc(FILE *f)
{
    fputs("Usage: airlock [--server URL] proc ls SESSION\n"
          "       airlock [--server URL] proc logs [-f] [-n N] [--since T] SESSION RUN\n"
          "       airlock [--server URL] proc kill SESSION RUN\n"
          "       airlock [--server URL] proc wait SESSION RUN\n"
          "\n"
          "The runs of a session of airlockd, which run at once (start one in the background\n"
          "with 'airlock exec --session ID --detach -- CMD'): ls lists them; logs prints the\n"
          "run's output so far (as far as its buffer holds) and exits, with the run's status\n"
          "once it has ended; -f (--follow) goes on to the run's end, -n N (--tail N) starts\n"
          "at the last N lines, --since T leaves out output older than T (unix seconds, 30s,\n"
          "5m, 2h, 1d ago, or 2026-12-07T10:00:00 UTC). Leaving logs (Ctrl-C) leaves the run\n"
          "running. kill ends it and everything it started; wait waits for its end and exits\n"
          "with its status.\n",
          f);
}

static int proc_ls(const struct remote *r, const char *sid)
{
    char path[300];
    snprintf(path, sizeof(path), "/v1/sessions/%s/runs", sid);
    cJSON *out = NULL;
    if (call(r, "GET", path, NULL, &out, NULL) < 0)
        return 1;
    time_t now = time(NULL);
    printf("%-8s %-8s %6s %s\n", "RUN", "STATE", "AGE", "RESULT");
    cJSON *x;
    cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(out, "runs"))
    {
        char id[32], state[32];
        al_term_escape(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(x, "id")) ?: "?", id,
                       sizeof(id));
        al_term_escape(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(x, "state")) ?: "?",
                       state, sizeof(state));
        double started = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(x, "started"));
        const cJSON *res = cJSON_GetObjectItemCaseSensitive(x, "result");
        const char *how = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(res, "how"));
        const char *code = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(res, "code"));
        double v = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(res, "value"));
        char result[64] = "";
        if (how)
            snprintf(result, sizeof(result), "%s %.0f", how, v);
        else if (code)
            al_term_escape(code, result, sizeof(result));
        printf("%-8s %-8s %5.0fs %s\n", id, state, difftime(now, started), result);
    }
    cJSON_Delete(out);
    return 0;
}

/* --since's value: unix seconds, a time ago (30s, 5m, 2h, 1d) or a UTC date and time
 * (2026-12-07T10:00:00, a trailing Z allowed); -1 when it is none of them. */
static double since_value(const char *v)
{
    char *end;
    errno = 0;
    double n = strtod(v, &end);
    if (!errno && end != v && n >= 0) {
        double unit = !*end               ? 0
                      : !strcmp(end, "s") ? 1
                      : !strcmp(end, "m") ? 60
                      : !strcmp(end, "h") ? 3600
                      : !strcmp(end, "d") ? 86400
                                          : -1;
        if (unit == 0)
            return n;
        if (unit > 0) {
            double t = (double)time(NULL) - n * unit;
            return t > 0 ? t : 0;
        }
    }
    struct tm tm = {0};
    const char *rest = strptime(v, "%Y-%m-%dT%H:%M:%S", &tm);
    if (rest && (!*rest || !strcmp(rest, "Z")))
        return (double)timegm(&tm);
    return -1;
}

/* airlock proc logs [-f] [-n N] [--since T] SESSION RUN: what the run's buffer holds, as
 * docker logs shows a container's; with -f, then what comes until the run ends. Leaving it
 * (Ctrl-C) leaves the run as it is: no signal reaches it from here. */
static int proc_logs(const struct remote *r, int argc, char **argv)
{
    static const struct option opts[] = {
        {"follow", no_argument, NULL, 'f'},
        {"tail", required_argument, NULL, 'n'},
        {"since", required_argument, NULL, 'S'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    bool follow = false;
    long tail = -1; /* all */
    double since = 0;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "+fn:h", opts, NULL)) != -1) {
        switch (c) {
        case 'f':
            follow = true;
            break;
        case 'n':
            tail = strcmp(optarg, "all") ? (long)cli_number("--tail", optarg, 100000000) : -1;
            break;
        case 'S':
            since = since_value(optarg);
            if (since < 0) {
                fprintf(stderr,
                        "airlock: --since wants unix seconds, a time ago (30s, 5m, 2h, 1d) or "
                        "a UTC time (2026-12-07T10:00:00), not '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case 'h':
            usage_proc(stdout);
            return 0;
        default:
            return cli_bad_option("proc logs", argc, argv, "+fn:h", opts);
        }
    }
    if (argc - optind != 2) {
        usage_proc(stderr);
        return 2;
    }
    const char *sid = argv[optind], *rid = argv[optind + 1];
    signal(SIGPIPE, SIG_IGN); /* | head: a write fails and the viewer ends */
    struct cli_termout tty;
    cli_termout_init(&tty, false);
    struct kept keep = {0};
    char query[96] = "?follow=false";
    if (since > 0)
        snprintf(query, sizeof(query), "?follow=false&since=%.3f", since);
    struct stream st = {.tty = cli_termout_any(&tty) ? &tty : NULL,
                        .query = query,
                        .keep = tail >= 0 ? &keep : NULL};
    /* What is held now, all of it (then the tail of it); then, with -f, the rest as it comes. */
    int k = stream_events(r, sid, rid, &st, -1);
    if (st.keep)
        kept_tail(&keep, (unsigned long)tail, st.tty);
    st.keep = NULL;
    if (k == 0 && follow && !st.ended) {
        st.query = NULL; /* events after the last one seen: all newer than --since */
        k = stream_events(r, sid, rid, &st, -1);
    }
    if (st.tty)
        cli_termout_end(&tty);
    if (k < 0)
        return EXIT_AIRLOCK_FAILED;
    return st.ended ? st.exit_code : 0;
}

int cli_remote_proc(struct cli_globals *g, int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage_proc(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    struct remote r;
    if (remote_init(&r, g) < 0)
        return 2;
    const char *sub = argv[1];
    if (!strcmp(sub, "ls") && argc == 3)
        return proc_ls(&r, argv[2]);
    if (!strcmp(sub, "logs"))
        return proc_logs(&r, argc - 1, argv + 1);
    if (argc != 4) {
        usage_proc(stderr);
        return 2;
    }
    const char *sid = argv[2], *rid = argv[3];
    char path[300];
    if (!strcmp(sub, "kill")) {
        snprintf(path, sizeof(path), "/v1/sessions/%s/runs/%s/signal", sid, rid);
        cJSON *in = cJSON_CreateObject();
        cJSON_AddStringToObject(in, "signal", "KILL");
        int k = call(&r, "POST", path, in, NULL, NULL);
        cJSON_Delete(in);
        return k < 0;
    }
    if (!strcmp(sub, "wait")) {
        for (;;) {
            snprintf(path, sizeof(path), "/v1/sessions/%s/runs/%s/wait?timeout_s=300", sid, rid);
            cJSON *out = NULL;
            if (call(&r, "GET", path, NULL, &out, NULL) < 0)
                return EXIT_AIRLOCK_FAILED;
            const char *state =
                cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(out, "state"));
            if (!state || strcmp(state, "done")) {
                cJSON_Delete(out);
                continue;
            }
            const cJSON *res = cJSON_GetObjectItemCaseSensitive(out, "result");
            const char *how = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(res, "how"));
            int v = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(res, "value"));
            bool timed_out = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(res, "timed_out"));
            if (!how) { /* it ended without an exit of its own: say how (125 promises a line) */
                const char *code =
                    cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(res, "code"));
                const char *msg =
                    cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(res, "message"));
                char c[64], m[512];
                fprintf(stderr, "airlock: run %s ended without an exit status: %s%s%s\n", rid,
                        al_term_escape(code ? code : "error", c, sizeof(c)), msg ? ": " : "",
                        msg ? al_term_escape(msg, m, sizeof(m)) : "");
            }
            int rc = !how                       ? EXIT_AIRLOCK_FAILED
                     : timed_out                ? EXIT_TIMED_OUT
                     : !strcmp(how, "signaled") ? 128 + v
                                                : v;
            cJSON_Delete(out);
            return rc;
        }
    }
    usage_proc(stderr);
    return 2;
}

bool cli_remote_wanted(const struct cli_globals *g)
{
    const char *h = getenv("AIRLOCK_HOST");
    return g->server || (h && *h);
}

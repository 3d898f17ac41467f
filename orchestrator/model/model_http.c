/* One streaming chat request over libcurl: the endpoint and key checks, the request, the
 * response fed through the SSE parser into the API's event handler, retries with backoff, and
 * cancellation through cancel_fd. */
#include "model-internal.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#define DEFAULT_TIMEOUT_S 600
#define DEFAULT_CONNECT_TIMEOUT_S 10
/* Backoff between attempts: from half a second, doubling, never longer than this. */
#define BACKOFF_FIRST_MS 500
#define BACKOFF_MAX_MS 8000
/* A server's Retry-After is followed up to this long; a longer wait is better seen as failure. */
#define RETRY_AFTER_MAX_S 30
/* An error reply's body is kept up to this size, for its message. */
#define ERROR_BODY_MAX (64u << 10)
/* How long curl_multi_poll waits before looking again when nothing happens. */
#define POLL_MS 1000

AL_DEFINE_CLEANUP(cleanup_curl, CURL *, curl_easy_cleanup)
AL_DEFINE_CLEANUP(cleanup_slist, struct curl_slist *, curl_slist_free_all)
AL_DEFINE_CLEANUP(cleanup_sse, al_sse *, al_sse_free)
AL_DEFINE_CLEANUP(cleanup_url, CURLU *, curl_url_cleanup)
AL_DEFINE_CLEANUP(cleanup_curlstr, char *, curl_free)

/* A line for the caller's notice callback, if it gave one. */
static void model_notice(const al_model_cfg *cfg, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void model_notice(const al_model_cfg *cfg, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    al_vnotify(cfg->notice, cfg->notice_ctx, fmt, ap);
    va_end(ap);
}

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_rc = CURLE_FAILED_INIT;
static void global_init(void)
{
    global_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

static const char *key_env(enum al_api api)
{
    return al_provider_hosted(api)->key_env;
}

/* Whether host is this machine or a private network, where servers run without keys. */
static bool host_is_local(const char *host)
{
    size_t n = strlen(host);
    if (strcasecmp(host, "localhost") == 0 ||
        (n > 10 && strcasecmp(host + n - 10, ".localhost") == 0) ||
        (n > 6 && strcasecmp(host + n - 6, ".local") == 0))
        return true;
    char h[64];
    if (n >= sizeof(h))
        return false;
    /* curl gives IPv6 literals in brackets. */
    if (host[0] == '[' && host[n - 1] == ']') {
        memcpy(h, host + 1, n - 2);
        h[n - 2] = '\0';
    } else {
        memcpy(h, host, n + 1);
    }
    unsigned char a[16];
    if (inet_pton(AF_INET, h, a) == 1)
        return a[0] == 127 || a[0] == 10 || (a[0] == 172 && (a[1] & 0xF0) == 16) ||
               (a[0] == 192 && a[1] == 168);
    if (inet_pton(AF_INET6, h, a) == 1) {
        static const unsigned char loop6[16] = {[15] = 1};
        return memcmp(a, loop6, 16) == 0 || (a[0] & 0xFE) == 0xFC;
    }
    return false;
}

/* How long al_model_check waits for a local server to take the connection. */
#define MODEL_CHECK_CONNECT_MS 2000L

static int endpoint_url(const al_model_cfg *cfg, char **out, bool *local, al_error *err)
{
    const char *base = cfg->api_base;
    size_t n = strlen(base);
    while (n && base[n - 1] == '/')
        n--;
    /* Anthropic's base is given without /v1, but one given with it is understood too. */
    const char *path = cfg->api == AL_API_RESPONSES ? "/responses" : "/chat/completions";
    if (cfg->api == AL_API_ANTHROPIC)
        path = n >= 3 && memcmp(base + n - 3, "/v1", 3) == 0 ? "/messages" : "/v1/messages";
    _cleanup_free_ char *url = NULL;
    if (asprintf(&url, "%.*s%s", (int)n, base, path) < 0)
        return al_err(err, -ENOMEM, "out of memory for the model request");
    __attribute__((cleanup(cleanup_url))) CURLU *u = curl_url();
    __attribute__((cleanup(cleanup_curlstr))) char *host = NULL;
    __attribute__((cleanup(cleanup_curlstr))) char *scheme = NULL;
    if (!u || curl_url_set(u, CURLUPART_URL, url, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK)
        return al_err(err, -EINVAL, "the model API base '%s' is not an http:// or https:// URL",
                      cfg->api_base);
    if (strcasecmp(scheme, "http") != 0 && strcasecmp(scheme, "https") != 0)
        return al_err(err, -EINVAL, "the model API base '%s' is not an http(s) URL", cfg->api_base);
    *local = host_is_local(host);
    *out = TAKE_PTR(url);
    return 0;
}

/* One attempt's transfer state. */
struct xfer {
    const al_model_cfg *cfg;
    CURL *h;
    al_sse *sse;
    struct al_model_acc *acc;
    long status;        /* 0 until the first body byte */
    bool whole;         /* a 2xx reply in JSON, not streamed: kept in body */
    struct al_buf body; /* an error reply's body (up to ERROR_BODY_MAX), or a whole one */
    int rc;             /* what stopped the parser: AL_SSE_DONE or a negative errno */
};

static void xfer_done(struct xfer *x)
{
    al_buf_free(&x->body);
}

static size_t on_write(char *ptr, size_t size, size_t nmemb, void *ud)
{
    struct xfer *x = ud;
    size_t n = size * nmemb;
    if (!x->status) {
        const char *type = NULL;
        curl_easy_getinfo(x->h, CURLINFO_RESPONSE_CODE, &x->status);
        curl_easy_getinfo(x->h, CURLINFO_CONTENT_TYPE, &type);
        x->whole = type && strncasecmp(type, "application/json", 16) == 0;
    }
    if (x->status / 100 == 2 && x->whole) {
        if (n > AL_MODEL_REPLY_MAX - x->body.len) {
            x->rc = al_err(&x->acc->err, -EMSGSIZE, "the model's reply exceeds %u MiB",
                           AL_MODEL_REPLY_MAX >> 20);
            return 0;
        }
        return al_buf_add(&x->body, ptr, n) < 0 ? 0 : n;
    }
    if (x->status / 100 != 2) {
        size_t room = ERROR_BODY_MAX - x->body.len;
        if (al_buf_add(&x->body, ptr, n < room ? n : room) < 0)
            return 0;
        return n;
    }
    int r = al_sse_feed(x->sse, ptr, n);
    if (r != 0) {
        x->rc = r;
        /* The handler has said why it stopped; the parser's own failures are said here. */
        if (r == -EMSGSIZE)
            al_err(&x->acc->err, r, "an event in the model's stream exceeds %u MiB",
                   AL_SSE_EVENT_MAX >> 20);
        else if (r < 0)
            al_err(&x->acc->err, r, "out of memory for the model's reply");
        return 0; /* stops the transfer: the reply is complete, or broken */
    }
    return n;
}

/* The message in an error reply's body: JSON error.message (OpenAI, Anthropic), a JSON
 * "error" string (Ollama), else the body's start, on one line. */
static void error_message(const struct al_buf *body, char *buf, size_t len)
{
    _cleanup_cjson_ cJSON *j = body->len ? cJSON_ParseWithLength(body->p, body->len) : NULL;
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    const cJSON *m = cJSON_IsString(e) ? e : cJSON_GetObjectItemCaseSensitive(e, "message");
    if (!cJSON_IsString(m))
        m = cJSON_GetObjectItemCaseSensitive(j, "message");
    if (!cJSON_IsString(m))
        m = cJSON_GetObjectItemCaseSensitive(j, "detail");
    if (cJSON_IsString(m))
        snprintf(buf, len, "%s", m->valuestring);
    else
        snprintf(buf, len, "%.*s", (int)(body->len < 200 ? body->len : 200),
                 body->len ? body->p : "");
    for (char *p = buf; *p; p++)
        if (iscntrl((unsigned char)*p))
            *p = ' ';
    if (!*buf)
        snprintf(buf, len, "(no message)");
}

static bool mentions_tools(const struct al_buf *body)
{
    if (!body->len)
        return false;
    for (const char *w = body->p; (w = strpbrk(w, "tTfF")); w++)
        if (strncasecmp(w, "tool", 4) == 0 || strncasecmp(w, "function", 8) == 0)
            return true;
    return false;
}

/* What an HTTP error status means; *retry says whether another attempt may help. */
static int http_error(const al_model_cfg *cfg, const struct xfer *x, bool sent_tools, bool *retry,
                      al_error *err)
{
    char msg[300];
    error_message(&x->body, msg, sizeof(msg));
    long s = x->status;
    *retry = s == 429 || s >= 500;
    if (s == 401 || s == 403)
        return al_err(err, -EACCES, "the model API refused the request (HTTP %ld: %s); check %s", s,
                      msg, key_env(cfg->api));
    if (s == 400 && sent_tools && mentions_tools(&x->body))
        return al_err(err, -ENOTSUP, "the model server does not take tools (HTTP 400: %s)", msg);
    return al_err(err, -EIO, "the model API answered HTTP %ld: %s", s, msg);
}

/* Waits for the transfer, or for cancel_fd; returns the transfer's curl code. */
static int run_transfer(const al_model_cfg *cfg, CURL *h, CURLcode *rc, al_error *err)
{
    CURLM *m = curl_multi_init();
    if (!m || curl_multi_add_handle(m, h) != CURLM_OK) {
        if (m)
            curl_multi_cleanup(m);
        return al_err(err, -ENOMEM, "cannot start the model request");
    }
    int r = 0, running = 1;
    while (running) {
        CURLMcode mc = curl_multi_perform(m, &running);
        if (mc != CURLM_OK) {
            r = al_err(err, -EIO, "model request: %s", curl_multi_strerror(mc));
            break;
        }
        if (!running)
            break;
        struct curl_waitfd w = {.fd = cfg->cancel_fd, .events = CURL_WAIT_POLLIN};
        mc =
            curl_multi_poll(m, cfg->cancel_fd >= 0 ? &w : NULL, cfg->cancel_fd >= 0, POLL_MS, NULL);
        if (mc != CURLM_OK) {
            r = al_err(err, -EIO, "model request: %s", curl_multi_strerror(mc));
            break;
        }
        if (w.revents) {
            r = al_err(err, -ECANCELED, "model request cancelled");
            break;
        }
    }
    if (r == 0) {
        int left;
        CURLMsg *msg;
        *rc = CURLE_FAILED_INIT;
        while ((msg = curl_multi_info_read(m, &left)))
            if (msg->msg == CURLMSG_DONE && msg->easy_handle == h)
                *rc = msg->data.result;
    }
    curl_multi_remove_handle(m, h);
    curl_multi_cleanup(m);
    return r;
}

struct request {
    const al_model_cfg *cfg;
    const char *url;
    const char *body;
    struct curl_slist *headers;
    bool sent_tools;
};

/* One attempt. *retry says whether another may help; *retry_after_s is the server's wish
 * (-1: none). */
static int attempt(const struct request *q, struct al_model_acc *acc, bool *retry,
                   long *retry_after_s, al_error *err)
{
    const al_model_cfg *cfg = q->cfg;
    *retry = false;
    *retry_after_s = -1;
    __attribute__((cleanup(cleanup_curl))) CURL *h = curl_easy_init();
    __attribute__((cleanup(cleanup_sse))) al_sse *sse =
        al_sse_new(cfg->api == AL_API_ANTHROPIC   ? al_anthropic_event
                   : cfg->api == AL_API_RESPONSES ? al_responses_event
                                                  : al_openai_event,
                   acc);
    if (!h || !sse)
        return al_err(err, -ENOMEM, "cannot start the model request");
    __attribute__((cleanup(xfer_done))) struct xfer x = {
        .cfg = cfg, .h = h, .sse = sse, .acc = acc};
    char curl_err[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(h, CURLOPT_URL, q->url);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, q->body);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, q->headers);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &x);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, curl_err);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT,
                     (long)(cfg->timeout_s ? cfg->timeout_s : DEFAULT_TIMEOUT_S));
    curl_easy_setopt(
        h, CURLOPT_CONNECTTIMEOUT,
        (long)(cfg->connect_timeout_s ? cfg->connect_timeout_s : DEFAULT_CONNECT_TIMEOUT_S));
    curl_easy_setopt(h, CURLOPT_USERAGENT, "airlock/" AIRLOCK_VERSION);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    model_notice(cfg, "model: POST %s", q->url);

    CURLcode rc = CURLE_FAILED_INIT;
    int r = run_transfer(cfg, h, &rc, err);
    if (r < 0)
        return r;
    if (!x.status)
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &x.status);
    if (x.status)
        model_notice(cfg, "model: HTTP %ld", x.status);
    if (acc->err.code) {
        *retry = acc->server_error;
        return al_err(err, acc->err.code, "%s", acc->err.msg);
    }
    if (x.rc == AL_SSE_DONE)
        return 0;
    if (x.status / 100 == 2 && x.whole && rc == CURLE_OK) {
        /* A server that does not stream: the whole reply at once, passed on as one piece. */
        r = cfg->api == AL_API_ANTHROPIC   ? al_anthropic_response(acc, x.body.p, x.body.len)
            : cfg->api == AL_API_RESPONSES ? al_responses_response(acc, x.body.p, x.body.len)
                                           : al_openai_response(acc, x.body.p, x.body.len);
        return r < 0 ? al_err(err, r, "%s", acc->err.msg) : 0;
    }
    if (x.status && x.status / 100 != 2) {
        curl_off_t ra = -1;
        /* curl reports 0 for no header; "Retry-After: 0" then means the usual backoff. */
        if (curl_easy_getinfo(h, CURLINFO_RETRY_AFTER, &ra) == CURLE_OK && ra > 0)
            *retry_after_s = ra > RETRY_AFTER_MAX_S ? RETRY_AFTER_MAX_S : (long)ra;
        return http_error(cfg, &x, q->sent_tools, retry, err);
    }
    switch (rc) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_CONNECT:
        *retry = true;
        return al_err(err, -ECONNREFUSED, "cannot reach the model API at %s: %s", q->url,
                      curl_err[0] ? curl_err : curl_easy_strerror(rc));
    case CURLE_OPERATION_TIMEDOUT:
        return al_err(err, -ETIMEDOUT, "the model request timed out: %s",
                      curl_err[0] ? curl_err : curl_easy_strerror(rc));
    case CURLE_OK:
    case CURLE_PARTIAL_FILE:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
        break;
    default:
        return al_err(err, -EIO, "model request to %s failed: %s", q->url,
                      curl_err[0] ? curl_err : curl_easy_strerror(rc));
    }
    /* The stream ended: enough if the reply was finished, else it was cut. */
    if (x.status && al_model_acc_complete(acc))
        return 0;
    *retry = true;
    return al_err(err, -EPROTO, "the model server closed the connection mid-reply");
}

static int wait_ms(int cancel_fd, long ms, al_error *err)
{
    struct pollfd p = {.fd = cancel_fd, .events = POLLIN};
    int n = poll(&p, cancel_fd >= 0 ? 1 : 0, (int)ms);
    if (n > 0)
        return al_err(err, -ECANCELED, "model request cancelled");
    return 0;
}

static int add_header(struct curl_slist **l, const char *h)
{
    struct curl_slist *n = curl_slist_append(*l, h);
    if (!n)
        return -ENOMEM;
    *l = n;
    return 0;
}

static int headers(const al_model_cfg *cfg, struct curl_slist **out)
{
    bool key = cfg->api_key && *cfg->api_key;
    int r = add_header(out, "Content-Type: application/json");
    if (r == 0)
        r = add_header(out, "Accept: text/event-stream");
    /* No "Expect: 100-continue" on large bodies: some servers never answer it. */
    if (r == 0)
        r = add_header(out, "Expect:");
    if (r == 0 && cfg->api == AL_API_ANTHROPIC)
        r = add_header(out, "anthropic-version: 2023-06-01");
    if (r == 0 && cfg->api == AL_API_ANTHROPIC && cfg->anthropic_beta) {
        _cleanup_free_ char *h = NULL;
        if (asprintf(&h, "anthropic-beta: %s", cfg->anthropic_beta) < 0)
            return -ENOMEM;
        r = add_header(out, h);
    }
    if (r == 0 && key) {
        _cleanup_free_ char *h = NULL;
        int n = asprintf(&h, "%s%s",
                         cfg->api == AL_API_ANTHROPIC ? "x-api-key: " : "Authorization: Bearer ",
                         cfg->api_key);
        if (n < 0)
            return -ENOMEM;
        r = add_header(out, h);
        explicit_bzero(h, (size_t)n);
    }
    return r;
}

/* What every request needs first: a whole configuration, libcurl, the endpoint's URL (into
 * *url) and, for a hosted API, a key. */
static int model_prepare(const al_model_cfg *cfg, char **url, bool *local, al_error *err)
{
    if (!cfg->api_base || !*cfg->api_base)
        return al_err(err, -EINVAL, "no model API base URL");
    if (!cfg->model || !*cfg->model)
        return al_err(err, -EINVAL, "no model name");
    if (cfg->api != AL_API_OPENAI && cfg->api != AL_API_ANTHROPIC && cfg->api != AL_API_RESPONSES)
        return al_err(err, -EINVAL, "unknown model API %d", (int)cfg->api);
    pthread_once(&global_once, global_init);
    if (global_rc != CURLE_OK)
        return al_err(err, -ENOMEM, "cannot initialise libcurl: %s", curl_easy_strerror(global_rc));

    int r = endpoint_url(cfg, url, local, err);
    if (r < 0)
        return r;
    if (!*local && !(cfg->api_key && *cfg->api_key)) {
        free(*url);
        *url = NULL;
        return al_err(err, -EACCES, "no API key for the hosted model API at %s: set %s",
                      cfg->api_base, key_env(cfg->api));
    }
    return 0;
}

int al_model_check(const al_model_cfg *cfg, al_error *err)
{
    _cleanup_free_ char *url = NULL;
    bool local = false;
    int r = model_prepare(cfg, &url, &local, err);
    if (r < 0 || !local)
        return r;
    /* A server on this machine answers at once or not at all: connect, send nothing. */
    CURL *h = curl_easy_init();
    if (!h)
        return al_err(err, -ENOMEM, "cannot initialise libcurl");
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_CONNECT_ONLY, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, MODEL_CHECK_CONNECT_MS);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_NOPROXY, "*");
    CURLcode c = curl_easy_perform(h);
    curl_easy_cleanup(h);
    if (c != CURLE_OK)
        return al_err(err, -ECONNREFUSED, "no model server answers at %s (%s)", cfg->api_base,
                      curl_easy_strerror(c));
    return 0;
}

int al_model_chat(const al_model_cfg *cfg, const cJSON *messages, const cJSON *tools,
                  const al_model_stream_cb *cb, al_model_reply *out, al_error *err)
{
    _cleanup_free_ char *url = NULL;
    bool local = false;
    int r = model_prepare(cfg, &url, &local, err);
    if (r < 0)
        return r;

    _cleanup_free_ char *body = NULL;
    r = cfg->api == AL_API_ANTHROPIC   ? al_anthropic_body(cfg, messages, tools, &body, err)
        : cfg->api == AL_API_RESPONSES ? al_responses_body(cfg, messages, tools, &body, err)
                                       : al_openai_body(cfg, messages, tools, &body, err);
    if (r < 0)
        return r;
    __attribute__((cleanup(cleanup_slist))) struct curl_slist *hdrs = NULL;
    if (headers(cfg, &hdrs) < 0)
        return al_err(err, -ENOMEM, "out of memory for the model request");
    struct request q = {.cfg = cfg,
                        .url = url,
                        .body = body,
                        .headers = hdrs,
                        .sent_tools = cJSON_GetArraySize(tools) > 0};

    long backoff = BACKOFF_FIRST_MS;
    for (unsigned n = 0;; n++) {
        struct al_model_acc acc;
        al_model_acc_init(&acc, cfg->api, cb);
        al_error aerr = {0};
        bool retry;
        long retry_after;
        r = attempt(&q, &acc, &retry, &retry_after, &aerr);
        if (r == 0)
            r = al_model_acc_take(&acc, out, &aerr);
        /* Nothing may be retried once the user has seen part of the reply. */
        bool again = r < 0 && retry && n < cfg->retries && !acc.started && !acc.passed;
        al_model_acc_free(&acc);
        if (r == 0)
            return 0;
        if (!again)
            return al_err(err, r, "%s", aerr.msg);
        long ms = retry_after >= 0 ? retry_after * 1000 : backoff;
        backoff = backoff * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : backoff * 2;
        model_notice(cfg, "model: %s; retrying in %.1f s", aerr.msg, (double)ms / 1000);
        if ((r = wait_ms(cfg->cancel_fd, ms, err)) < 0)
            return r;
    }
}

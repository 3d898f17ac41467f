/* The HTTP side: listeners (a unix socket, optionally TCP with TLS), routing against the route
 * table, who is asking (peer uid or API key), bounded request bodies, one log line per request.
 * libmicrohttpd runs a thread per connection, so a handler or an event stream may block. */
#include "airlockd.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <netdb.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <poll.h>
#include <pthread.h>
#include <pwd.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>

struct listener {
    bool is_unix;
    bool e2b; /* E2B's API (e2b.c), not ours */
    bool oi;  /* Open Interpreter's server protocol (oi.c) */
    struct MHD_Daemon *d;
};
static struct listener unix_l = {.is_unix = true}, tcp_l, e2b_l = {.e2b = true},
                       oi_l = {.oi = true};

/* Headers and the request line together: anything larger is refused by libmicrohttpd (431). */
#define CONNECTION_MEMORY 65536

uint64_t ad_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

void ad_log(const char *fmt, ...)
{
    char buf[1024], ts[32];
    time_t now = time(NULL);
    struct tm tm;
    strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s airlockd: %s\n", ts, buf);
}

/* ---- replies ---- */

enum MHD_Result ad_reply(struct MHD_Connection *c, struct ad_req *q, unsigned status,
                         struct MHD_Response *r)
{
    if (!r)
        return MHD_NO;
    q->status = status;
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

enum MHD_Result ad_reply_json(struct MHD_Connection *c, struct ad_req *q, unsigned status,
                              cJSON *body)
{
    char *text = body ? cJSON_PrintUnformatted(body) : NULL;
    cJSON_Delete(body);
    if (!text)
        return MHD_NO;
    size_t n = strlen(text);
    char *grown = realloc(text, n + 2);
    if (!grown) {
        free(text);
        return MHD_NO;
    }
    text = grown;
    text[n] = '\n';
    struct MHD_Response *r = MHD_create_response_from_buffer(n + 1, text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    return ad_reply(c, q, status, r);
}

int ad_random_hex(char *out, size_t bytes)
{
    unsigned char b[64];
    out[0] = 0;
    if (bytes > sizeof(b) || RAND_bytes(b, (int)bytes) != 1)
        return -EIO;
    for (size_t i = 0; i < bytes; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
    return 0;
}

static enum MHD_Result reply_error_v(struct MHD_Connection *c, struct ad_req *q, unsigned status,
                                     const char *code, const char *limit, const char *msg)
{
    ad_metrics_error(code);
    cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(e, "code", code);
    ad_json_add_text(e, "message", msg);
    if (limit)
        cJSON_AddStringToObject(e, "limit", limit);
    return ad_reply_json(c, q, status, o);
}

enum MHD_Result ad_reply_error(struct MHD_Connection *c, struct ad_req *q, unsigned status,
                               const char *code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return reply_error_v(c, q, status, code, NULL, msg);
}

enum MHD_Result ad_reply_fail(struct MHD_Connection *c, struct ad_req *q, const struct ad_fail *f)
{
    return reply_error_v(c, q, (unsigned)f->status, f->code, f->limit, f->msg);
}

void ad_failf(struct ad_fail *f, int status, const char *code, const char *fmt, ...)
{
    f->status = status;
    f->code = code;
    f->limit = NULL;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->msg, sizeof(f->msg), fmt, ap);
    va_end(ap);
}

void ad_fail_from(struct ad_fail *f, int r, const al_error *err)
{
    const char *msg = err && err->code ? err->msg : strerror(-r);
    switch (r) {
    case -ENOENT:
        ad_failf(f, 404, "not_found", "%s", msg);
        break;
    case -EINVAL:
    case -E2BIG:
    case -ENAMETOOLONG:
        ad_failf(f, 400, "invalid", "%s", msg);
        break;
    case -EEXIST:
        ad_failf(f, 409, "exists", "%s", msg);
        break;
    case -EBUSY:
        /* A volume attached elsewhere; the agent's channel held by a checkpoint. */
        ad_failf(f, 409, "busy", "%s", msg);
        break;
    case -ENOTDIR:
        ad_failf(f, 400, "not_a_directory", "%s", msg);
        break;
    case -ENOTEMPTY:
    case -EISDIR:
        ad_failf(f, 409, "not_empty", "%s", msg);
        break;
    case -EFBIG:
        ad_failf(f, 413, "too_large", "%s", msg);
        break;
    case -ENOTSUP:
        ad_failf(f, 409, "not_supported", "%s", msg);
        break;
    case -ENODEV:
        /* A screen call on a session opened without a display. */
        ad_failf(f, 409, "no_display", "%s", msg);
        break;
    case -ENOSPC:
        /* The library's disk budget (or the host's free-space floor) paused the VM. */
        ad_failf(f, 507, "disk_budget", "%s", msg);
        break;
    case -EPROTO:
    case -EMSGSIZE:
        /* al_session_check poisoned the session: its agent broke the protocol. */
        ad_failf(f, 502, "session_poisoned", "%s", msg);
        break;
    case -EACCES:
    case -EPERM:
        ad_failf(f, 403, "forbidden", "%s", msg);
        break;
    case -ETIMEDOUT:
        ad_failf(f, 504, "timeout", "%s", msg);
        break;
    default:
        ad_failf(f, 500, "internal", "%s", msg);
    }
}

/* ---- routing ---- */

static bool seg_ok(const char *s, size_t n)
{
    if (n == 0 || n >= 128)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!(s[i] == '-' || s[i] == '_' || s[i] == '.' || (s[i] >= '0' && s[i] <= '9') ||
              (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z')))
            return false;
    return true;
}

/* Matches url against pattern, filling params ("/v1/sessions/" is "/v1/sessions"); with tail,
 * the pattern is a prefix of the url at a '/', and *tail the rest ("" or from that '/'). */
static bool match(const char *pattern, const char *url, char params[AD_PARAMS_MAX][128],
                  const char **tail)
{
    const char *p = pattern, *u = url;
    size_t np = 0;
    while (*p && *u) {
        if (*p != '/' || *u != '/')
            return false;
        p++, u++;
        size_t pl = strcspn(p, "/"), ul = strcspn(u, "/");
        if (p[0] == '{') {
            if (np == AD_PARAMS_MAX || !seg_ok(u, ul))
                return false;
            memcpy(params[np], u, ul);
            params[np++][ul] = 0;
        } else if (pl != ul || memcmp(p, u, pl)) {
            return false;
        }
        p += pl, u += ul;
    }
    if (tail && !*p && (!*u || *u == '/')) {
        *tail = u;
        return true;
    }
    return !*p && (!*u || !strcmp(u, "/")); /* one trailing slash is the same path */
}

/* Host-name routing of a session's port: "PORT-ID.localhost[:N]" (PORT 1..65535, ID a session
 * name); fills params as the ports route has them ({id}, {port}). */
static bool port_host(const char *h, char params[AD_PARAMS_MAX][128])
{
    if (!h)
        return false;
    size_t digits = strspn(h, "0123456789");
    if (!digits || digits > 5 || h[digits] != '-')
        return false;
    const char *id = h + digits + 1;
    const char *dot = strchr(id, '.');
    if (!dot || strncasecmp(dot, ".localhost", 10) || (dot[10] && dot[10] != ':') ||
        !seg_ok(id, (size_t)(dot - id)))
        return false;
    if (dot[10] == ':' && (!dot[11] || strspn(dot + 11, "0123456789") != strlen(dot + 11)))
        return false;
    unsigned port = (unsigned)atoi(h);
    if (port < 1 || port > 65535)
        return false;
    snprintf(params[0], sizeof(params[0]), "%.*s", (int)(dot - id), id);
    snprintf(params[1], sizeof(params[1]), "%u", port);
    return true;
}

/* ---- who asks ---- */

static int peer_cred(struct MHD_Connection *c, uid_t *uid, gid_t *gid)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci)
        return -EIO;
    struct ucred cr;
    socklen_t len = sizeof(cr);
    if (getsockopt(ci->connect_fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0)
        return -errno;
    *uid = cr.uid;
    *gid = cr.gid;
    return 0;
}

/* A browser reaching the unix socket through a local forward (ssh -L) is signed in by nothing
 * but its being on this machine; a page of another site whose name was made to resolve to
 * 127.0.0.1 (DNS rebinding) would be same-origin with it. Its Host header still carries that
 * name, so the socket takes only loopback names from a browser (one that sends Fetch Metadata,
 * as current browsers do, or Origin); other clients may name any host. */
bool ad_loopback_host(const char *h)
{
    if (!h)
        return true;
    static const char *const names[] = {"localhost", "127.0.0.1", "[::1]"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        size_t n = strlen(names[i]);
        if (!strncasecmp(h, names[i], n) && (h[n] == '\0' || h[n] == ':'))
            return true;
    }
    return false;
}

/* Whether the peer is in allow_group: its primary group, or the supplementary groups of its
 * user as the group database says (SO_PEERCRED carries only the primary one). */
static bool in_allowed_group(uid_t uid, gid_t gid)
{
    if (!ad_cfg.has_allow_gid)
        return false;
    if (gid == ad_cfg.allow_gid)
        return true;
    char buf[4096];
    struct passwd pw, *res = NULL;
    if (getpwuid_r(uid, &pw, buf, sizeof(buf), &res) != 0 || !res)
        return false;
    gid_t groups[256];
    int n = (int)(sizeof(groups) / sizeof(groups[0]));
    if (getgrouplist(res->pw_name, res->pw_gid, groups, &n) < 0)
        return false;
    for (int i = 0; i < n; i++)
        if (groups[i] == ad_cfg.allow_gid)
            return true;
    return false;
}

static enum MHD_Result authenticate(struct MHD_Connection *c, struct ad_req *q, bool *ok)
{
    *ok = false;
    q->lim = ad_cfg.limits;
    if (q->is_unix) {
        uid_t uid = (uid_t)-1;
        gid_t gid = (gid_t)-1;
        if (peer_cred(c, &uid, &gid) < 0)
            return ad_reply_error(c, q, 403, "forbidden", "cannot read the peer's credentials");
        bool allowed = uid == getuid();
        for (size_t i = 0; i < ad_cfg.nallow; i++)
            allowed |= ad_cfg.allow_uids[i] == uid;
        allowed = allowed || in_allowed_group(uid, gid);
        if (!allowed)
            return ad_reply_error(c, q, 403, "forbidden", "uid %u may not use this socket",
                                  (unsigned)uid);
        /* a browser's request (Fetch Metadata or Origin): see ad_loopback_host */
        bool browser = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Sec-Fetch-Mode") ||
                       MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
        if (browser && !q->host_routed &&
            !ad_loopback_host(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host")))
            return ad_reply_error(c, q, 403, "forbidden",
                                  "on the unix socket, Host must be localhost, 127.0.0.1 or [::1]");
        snprintf(q->owner, sizeof(q->owner), "uid:%u", (unsigned)uid);
        *ok = true;
        return MHD_YES;
    }
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    /* A host-routed port takes only its own cookie (ports.c's open route made it, for this
     * session's port alone); the page's cookie is never sent there anyway (another site). */
    char scope[300] = "";
    if (q->host_routed)
        snprintf(scope, sizeof(scope), "%s:%s", q->params[0], q->params[1]);
    const char *cookie = MHD_lookup_connection_value(
        c, MHD_COOKIE_KIND, q->host_routed ? "airlock_port" : "airlock_token");
    struct ad_key k;
    char web_key[256];
    if (!h && cookie && ad_web_key(cookie, scope, web_key, sizeof(web_key)) &&
        ad_keys_check(web_key, &k) == 0) {
        snprintf(q->owner, sizeof(q->owner), "key:%s", k.id);
        ad_limits_apply(&q->lim, &k.lim);
        *ok = true;
        return MHD_YES;
    }
    /* The open-port link's token, once: made a cookie of this host by the proxy's answer. */
    const char *link =
        q->host_routed && !h && !cookie
            ? MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "airlock_port_token")
            : NULL;
    if (link && strlen(link) < sizeof(q->port_token) &&
        ad_web_key(link, scope, web_key, sizeof(web_key)) && ad_keys_check(web_key, &k) == 0) {
        snprintf(q->owner, sizeof(q->owner), "key:%s", k.id);
        snprintf(q->port_token, sizeof(q->port_token), "%s", link);
        ad_limits_apply(&q->lim, &k.lim);
        *ok = true;
        return MHD_YES;
    }
    if (!h || strncasecmp(h, "Bearer ", 7) || ad_keys_check(h + 7, &k) < 0) {
        struct MHD_Response *r;
        q->status = 401;
        ad_metrics_error("unauthorized");
        cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(e, "code", "unauthorized");
        cJSON_AddStringToObject(e, "message",
                                h ? "API key not valid" : "an API key is needed (Bearer)");
        char *text = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        r = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
        MHD_add_response_header(r, "Content-Type", "application/json");
        MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
        return ad_reply(c, q, 401, r);
    }
    snprintf(q->owner, sizeof(q->owner), "key:%s", k.id);
    ad_limits_apply(&q->lim, &k.lim);
    *ok = true;
    return MHD_YES;
}

/* ---- requests per second, per owner: a token bucket each ---- */

#define BUCKETS_MAX 1024 /* owners tracked at once; the least recently seen makes room */

struct bucket {
    char owner[40];
    double tokens;
    uint64_t last_ms;
};
static struct bucket buckets[BUCKETS_MAX];
static pthread_mutex_t buckets_lock = PTHREAD_MUTEX_INITIALIZER;

static bool rate_ok(const char *owner, unsigned per_s)
{
    if (!per_s)
        return true;
    uint64_t now = ad_now_ms();
    pthread_mutex_lock(&buckets_lock);
    struct bucket *b = NULL, *oldest = &buckets[0];
    for (size_t i = 0; i < BUCKETS_MAX && !b; i++) {
        if (!strcmp(buckets[i].owner, owner))
            b = &buckets[i];
        else if (buckets[i].last_ms < oldest->last_ms)
            oldest = &buckets[i];
    }
    if (!b) {
        b = oldest;
        snprintf(b->owner, sizeof(b->owner), "%s", owner);
        b->tokens = 2.0 * per_s;
        b->last_ms = now;
    }
    b->tokens += (double)(now - b->last_ms) * per_s / 1000.0;
    if (b->tokens > 2.0 * per_s)
        b->tokens = 2.0 * per_s;
    b->last_ms = now;
    bool ok = b->tokens >= 1.0;
    if (ok)
        b->tokens -= 1.0;
    pthread_mutex_unlock(&buckets_lock);
    return ok;
}

/* ---- the access handler ---- */

/* The request's {id}: the caller's session, referenced, or the answer (404, 502). */
static bool find_session(struct MHD_Connection *c, struct ad_req *q, enum MHD_Result *r)
{
    q->sess = ad_session_get(q->owner, q->params[0]);
    if (!q->sess) /* or by its name (unique per owner) */
        q->sess = ad_session_by_name(q->owner, q->params[0]);
    if (!q->sess) {
        *r = ad_reply_error(c, q, 404, "not_found", "no session '%s'", q->params[0]);
        return false;
    }
    ad_session_touch(q->sess);
    if (q->sess->lost && !(q->route->flags & AD_LOST_OK)) {
        *r = ad_reply_error(c, q, 502, "host_lost",
                            "the host this session ran on stopped answering (%s); the session "
                            "is lost: delete it and start another",
                            q->sess->lost_why);
        return false;
    }
    if (q->sess->paused && !(q->route->flags & AD_PAUSED_OK)) {
        *r = ad_reply_error(c, q, 409, "paused",
                            "the session is paused: resume it first (POST "
                            "/v1/sessions/%s/resume)",
                            q->sess->id);
        return false;
    }
    return true;
}

/* ---- the upload spool's bounds: what all uploads in flight hold, and each owner's ---- */

/* All uploads at once: the spool's files are the host's disk. Each owner: twice its
 * max_upload_bytes, so that one key's many uploads at once cannot take the spool from others. */
#define SPOOL_OWNERS_MAX 1024

static pthread_mutex_t spool_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t spool_total;
static struct spool_owner {
    char owner[40];
    uint64_t held;
} spool_owners[SPOOL_OWNERS_MAX];

static struct spool_owner *spool_owner(const char *owner, bool make)
{
    struct spool_owner *free_slot = NULL;
    for (size_t i = 0; i < SPOOL_OWNERS_MAX; i++) {
        if (spool_owners[i].held && !strcmp(spool_owners[i].owner, owner))
            return &spool_owners[i];
        if (!spool_owners[i].held && !free_slot)
            free_slot = &spool_owners[i];
    }
    if (make && free_slot)
        snprintf(free_slot->owner, sizeof(free_slot->owner), "%s", owner);
    return make ? free_slot : NULL;
}

bool ad_spool_reserve(struct ad_req *q, uint64_t want)
{
    if (want <= q->spool_held)
        return true;
    uint64_t more = want - q->spool_held;
    uint64_t owner_max =
        q->lim.max_upload_bytes > UINT64_MAX / 2 ? UINT64_MAX : 2 * q->lim.max_upload_bytes;
    pthread_mutex_lock(&spool_lock);
    struct spool_owner *o = spool_owner(q->owner, true);
    bool ok = o && spool_total + more <= ad_cfg.spool_max_bytes && o->held + more <= owner_max;
    if (ok) {
        spool_total += more;
        o->held += more;
        q->spool_held = want;
    }
    pthread_mutex_unlock(&spool_lock);
    return ok;
}

static void spool_release(struct ad_req *q)
{
    if (!q->spool_held)
        return;
    pthread_mutex_lock(&spool_lock);
    struct spool_owner *o = spool_owner(q->owner, false);
    if (o)
        o->held -= q->spool_held < o->held ? q->spool_held : o->held;
    spool_total -= q->spool_held < spool_total ? q->spool_held : spool_total;
    pthread_mutex_unlock(&spool_lock);
    q->spool_held = 0;
}

int ad_spool_download(struct ad_req *q, const char *guest_path, uint64_t *max, al_error *err)
{
    al_file_info st = AL_FILE_INFO_INIT;
    int r = al_file_stat(q->sess->s, guest_path, &st, err);
    if (r < 0)
        return r;
    /* The guest's word for the size is only what is held: the copy stops at it. */
    uint64_t size = st.size < q->lim.max_upload_bytes ? st.size : q->lim.max_upload_bytes;
    if (!size) /* al_file_get_max's 0 is no bound at all */
        size = 1;
    if (!ad_spool_reserve(q, q->spool_held + size))
        return -ENOSPC;
    *max = size;
    return 0;
}

void ad_spool_full_why(char *why, size_t len)
{
    snprintf(why, len,
             "the spool has no room for this transfer now (uploads, their inflated and parted "
             "copies and downloads in flight hold it: at most %llu bytes in all, twice "
             "max_upload_bytes per key); try again later",
             (unsigned long long)ad_cfg.spool_max_bytes);
}

static enum MHD_Result spool_full(struct MHD_Connection *c, struct ad_req *q)
{
    char why[400];
    ad_spool_full_why(why, sizeof(why));
    return ad_reply_error(c, q, 507, "spool_full", "%s", why);
}

/* What a route that takes no body reads of one: room for an empty JSON object and blanks. */
#define EMPTY_BODY_MAX 64

static enum MHD_Result body_checks(struct MHD_Connection *c, struct ad_req *q);

/* A request to the e2b listener: e2b.c routes and authenticates it; the rest is as ours. */
static enum MHD_Result first_call_e2b(struct MHD_Connection *c, struct ad_req *q, const char *url,
                                      const char *method)
{
    bool ok;
    enum MHD_Result r = ad_e2b_route(c, q, url, method, &ok);
    if (!ok)
        return r;
    if (!rate_ok(q->owner, q->lim.requests_per_s)) {
        ad_metrics_error("quota_exceeded");
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "code", 429);
        cJSON_AddStringToObject(o, "message", "too many requests per second");
        return ad_reply_json(c, q, 429, o);
    }
    return body_checks(c, q);
}

/* A request to the Open Interpreter listener: oi.c routes and authenticates it. */
static enum MHD_Result first_call_oi(struct MHD_Connection *c, struct ad_req *q, const char *url,
                                     const char *method)
{
    bool ok;
    enum MHD_Result r = ad_oi_route(c, q, url, method, &ok);
    if (!ok)
        return r;
    if (q->owner[0] && !rate_ok(q->owner, q->lim.requests_per_s)) {
        ad_metrics_error("quota_exceeded");
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "error", "too many requests per second");
        return ad_reply_json(c, q, 429, o);
    }
    return body_checks(c, q);
}

static enum MHD_Result first_call(struct MHD_Connection *c, struct ad_req *q, const char *url,
                                  const char *method)
{
    bool path_known = false;
    char hp[AD_PARAMS_MAX][128];
    if (port_host(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host"), hp)) {
        q->route = &ad_port_route;
        memcpy(q->params, hp, sizeof(hp));
        q->tail = url;
        q->host_routed = true;
    }
    for (size_t i = 0; i < ad_nroutes && !q->route; i++) {
        char params[AD_PARAMS_MAX][128];
        const char *tail = NULL;
        if (!match(ad_routes[i].pattern, url, params,
                   ad_routes[i].flags & AD_ANY_METHOD ? &tail : NULL))
            continue;
        q->tail = tail;
        path_known = true;
        if (strcmp(ad_routes[i].method, method) && !(ad_routes[i].flags & AD_ANY_METHOD))
            continue;
        q->route = &ad_routes[i];
        memcpy(q->params, params, sizeof(params));
        break;
    }
    if (!q->route && !strcmp(method, "GET")) {
        size_t len;
        const char *type;
        const char *body = ad_web_file(url, &len, &type);
        if (body) {
            struct MHD_Response *r =
                MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_PERSISTENT);
            MHD_add_response_header(r, "Content-Type", type);
            MHD_add_response_header(r, "Cache-Control", "no-cache");
            MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
            MHD_add_response_header(r, "X-Frame-Options", "DENY");
            MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
            MHD_add_response_header(
                r, "Content-Security-Policy",
                "default-src 'none'; script-src 'self'; style-src 'self'; "
                /* xterm.js writes its theme and sizes as <style> elements (not attributes) */
                "style-src-elem 'self' 'unsafe-inline'; "
                "img-src 'self' blob:; connect-src 'self' blob:; frame-src blob:; "
                "base-uri 'none'; form-action 'none'; frame-ancestors 'none'");
            return ad_reply(c, q, 200, r);
        }
    }
    if (!q->route)
        return path_known ? ad_reply_error(c, q, 405, "method_not_allowed",
                                           "%s is not allowed here", method)
                          : ad_reply_error(c, q, 404, "not_found", "no such route");
    /* A browser's state-changing request (it carries Origin, or a cookie signs it in) must
     * carry X-Airlock-CSRF: a header another site's page cannot add without a CORS preflight,
     * which this daemon never allows. Clients that are not browsers send no Origin. */
    if (strcmp(method, "GET") && strcmp(method, "HEAD") && !q->host_routed &&
        !(q->route->flags & AD_OWN_ORIGIN) &&
        (MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin") ||
         MHD_lookup_connection_value(c, MHD_COOKIE_KIND, "airlock_token")) &&
        !MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Airlock-CSRF"))
        return ad_reply_error(c, q, 403, "csrf", "a browser's request needs X-Airlock-CSRF");
    /* Health says only that the daemon answers, sign-in takes the key: no key needed. */
    if (!(q->route->flags & AD_NO_AUTH)) {
        bool ok;
        enum MHD_Result r = authenticate(c, q, &ok);
        if (!ok)
            return r;
        if (!rate_ok(q->owner, q->lim.requests_per_s)) {
            ad_metrics_error("quota_exceeded");
            cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
            cJSON_AddStringToObject(e, "code", "quota_exceeded");
            cJSON_AddStringToObject(e, "message", "too many requests per second");
            cJSON_AddStringToObject(e, "limit", "requests_per_s");
            return ad_reply_json(c, q, 429, o);
        }
    }
    return body_checks(c, q);
}

/* The body's bounds and kind, and the session, before a byte of the body is read. */
static enum MHD_Result body_checks(struct MHD_Connection *c, struct ad_req *q)
{
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    uint64_t bound = q->route->flags & AD_BODY_SPOOL                  ? q->lim.max_upload_bytes
                     : q->route->flags & (AD_BODY_JSON | AD_BODY_RAW) ? ad_cfg.max_body_bytes
                                                                      : EMPTY_BODY_MAX;
    if (cl && strtoull(cl, NULL, 10) > bound)
        return ad_reply_error(c, q, 413, "too_large", "request body over %llu bytes",
                              (unsigned long long)bound);
    if (q->route->flags & AD_BODY_JSON) {
        const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
        bool has_body = (cl && strcmp(cl, "0")) ||
                        MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Transfer-Encoding");
        if (has_body && (!ct || strncasecmp(ct, "application/json", 16) ||
                         (ct[16] && ct[16] != ';' && ct[16] != ' ')))
            return ad_reply_error(c, q, 415, "unsupported_media_type",
                                  "the body must be application/json");
    }
    /* The session first: a body for a session that is not the caller's is never read. */
    if (!(q->route->flags & AD_NO_SESSION)) {
        enum MHD_Result r;
        if (!find_session(c, q, &r))
            return r;
    }
    if (q->route->flags & AD_BODY_SPOOL) {
        /* A declared length is held against the spool's bounds before a byte is read. */
        if (cl && !ad_spool_reserve(q, strtoull(cl, NULL, 10)))
            return spool_full(c, q);
        q->spool_fd = open(ad_cfg.spool_dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
        if (q->spool_fd < 0)
            return ad_reply_error(c, q, 500, "internal", "cannot make a spool file: %s",
                                  strerror(errno));
    }
    return MHD_YES;
}

static int take_body(struct ad_req *q, const char *data, size_t n)
{
    if (q->route->flags & AD_BODY_SPOOL) {
        if (q->spool_len + n > q->lim.max_upload_bytes) {
            q->body_over = true;
            return 0;
        }
        if (!ad_spool_reserve(q, q->spool_len + n)) {
            q->spool_over = true;
            return 0;
        }
        for (size_t done = 0; done < n;) {
            ssize_t w = write(q->spool_fd, data + done, n - done);
            if (w < 0 && errno == EINTR)
                continue;
            if (w < 0)
                return -errno;
            done += (size_t)w;
        }
        q->spool_len += n;
        return 0;
    }
    uint64_t max =
        q->route->flags & (AD_BODY_JSON | AD_BODY_RAW) ? ad_cfg.max_body_bytes : EMPTY_BODY_MAX;
    if (q->body_len + n > max) {
        q->body_over = true;
        return 0;
    }
    char *b = realloc(q->body, q->body_len + n + 1);
    if (!b)
        return -ENOMEM;
    q->body = b;
    memcpy(b + q->body_len, data, n);
    q->body_len += n;
    b[q->body_len] = 0;
    return 0;
}

/* Whether a body is nothing but an empty JSON object (blanks aside): what a client that sends
 * {} with every POST sends a route that takes no body. */
static bool empty_object(const char *b, size_t n)
{
    size_t k = 0; /* of "{}" seen */
    for (size_t i = 0; i < n; i++) {
        if (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n')
            continue;
        if (k == 2 || b[i] != "{}"[k])
            return false;
        k++;
    }
    return k == 0 || k == 2;
}

static enum MHD_Result last_call(struct MHD_Connection *c, struct ad_req *q)
{
    if (q->spool_over)
        return spool_full(c, q);
    if (!(q->route->flags & (AD_BODY_SPOOL | AD_BODY_JSON | AD_BODY_RAW)) && !q->body_over &&
        q->body_len && !empty_object(q->body, q->body_len))
        return ad_reply_error(c, q, 400, "invalid", "this route takes no body (at most {})");
    if (q->body_over) {
        uint64_t bound =
            q->route->flags & AD_BODY_SPOOL ? q->lim.max_upload_bytes : ad_cfg.max_body_bytes;
        if (!(q->route->flags & (AD_BODY_SPOOL | AD_BODY_JSON | AD_BODY_RAW)))
            return ad_reply_error(c, q, 400, "invalid", "this route takes no body");
        return ad_reply_error(c, q, 413, "too_large", "request body over %llu bytes",
                              (unsigned long long)bound);
    }
    if (q->route->flags & AD_BODY_JSON) {
        if (q->body_len) {
            q->json = cJSON_ParseWithLength(q->body, q->body_len);
            if (!q->json)
                return ad_reply_error(c, q, 400, "bad_json", "the body is not valid JSON");
        } else {
            q->json = cJSON_CreateObject();
        }
        if (!cJSON_IsObject(q->json))
            return ad_reply_error(c, q, 400, "bad_json", "the body must be a JSON object");
    }
    return q->route->fn(c, q);
}

/* ---- request heads: a deadline for each ----
 *
 * libmicrohttpd's timeout is an idle one: a client that sends a byte of its head every few
 * seconds keeps a connection, and a thread, forever. Each connection is watched from its start,
 * and again from the end of each request it made, until its next request's head is complete
 * (handle() runs); one that takes longer than head_timeout_s is shut down (not closed: the fd
 * stays libmicrohttpd's, which closes it after it hears of the end, and after it told us it
 * closes, so the fd here is never another connection's). Being idle between requests counts as
 * waiting for a head: keep-alive lasts head_timeout_s. */
struct watch {
    struct watch *prev, *next;
    int fd;
    uint64_t since_ms;            /* 0: a request is under way, not waiting for a head */
    bool served;                  /* a request of it was answered: a client's, kept alive */
    const struct listener *l;     /* whose connection */
    struct sockaddr_storage peer; /* a TCP peer's address; AF_UNSPEC on the unix socket */
};

static pthread_mutex_t watch_mu = PTHREAD_MUTEX_INITIALIZER;
static struct watch *watched;

/* New connections of one TCP address that may wait for their first head at once, on each
 * listener: past it, the one that waited longest is cut once it waited HEAD_CUT_MIN_MS. A slow
 * client's bound where libmicrohttpd's per-address limit is off (the E2B listener, whose SDKs
 * hold many streams and a pool of kept-alive connections from one host: a stream's head is
 * complete and a kept-alive one was served, so neither counts), below it on the API's. A burst
 * of new connections sends its heads within milliseconds: none is cut for being many at once. */
#define HEAD_WAITING_PER_ADDRESS 16
#define HEAD_CUT_MIN_MS 2000

static bool same_address(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
    if (a->ss_family != b->ss_family)
        return false;
    if (a->ss_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
               ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (a->ss_family == AF_INET6)
        return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                       &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr));
    return false;
}

/* Under watch_mu: while w's address holds more new connections waiting for their first head
 * than the bound, the one that waited longest is cut (shut down, as the deadline does), as long
 * as it waited HEAD_CUT_MIN_MS. On each new connection, and each second (the watcher). */
static void head_bound(const struct watch *w, uint64_t now)
{
    if (w->peer.ss_family == AF_UNSPEC)
        return;
    for (;;) {
        unsigned n = 0;
        struct watch *oldest = NULL;
        for (struct watch *o = watched; o; o = o->next)
            if (o->since_ms && !o->served && o->l == w->l && same_address(&o->peer, &w->peer)) {
                n++;
                if (!oldest || o->since_ms <= oldest->since_ms)
                    oldest = o;
            }
        if (n <= HEAD_WAITING_PER_ADDRESS || !oldest || now - oldest->since_ms < HEAD_CUT_MIN_MS)
            return;
        shutdown(oldest->fd, SHUT_RDWR);
        oldest->since_ms = 0;
    }
}

static pthread_t watcher;
static bool watcher_running;
static int watcher_stop[2] = {-1, -1};

static void notify_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                              enum MHD_ConnectionNotificationCode code)
{
    const struct listener *l = cls;
    pthread_mutex_lock(&watch_mu);
    struct watch *w = *socket_context;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        const union MHD_ConnectionInfo *ai =
            l->is_unix ? NULL : MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        w = ci ? calloc(1, sizeof(*w)) : NULL;
        if (w) {
            w->fd = ci->connect_fd;
            w->since_ms = ad_now_ms();
            w->l = l;
            w->peer.ss_family = AF_UNSPEC;
            if (ai && ai->client_addr &&
                (ai->client_addr->sa_family == AF_INET || ai->client_addr->sa_family == AF_INET6))
                memcpy(&w->peer, ai->client_addr,
                       ai->client_addr->sa_family == AF_INET ? sizeof(struct sockaddr_in)
                                                             : sizeof(struct sockaddr_in6));
            w->next = watched;
            if (watched)
                watched->prev = w;
            watched = w;
            head_bound(w, w->since_ms);
        }
        *socket_context = w;
    } else if (w) { /* closed */
        if (w->prev)
            w->prev->next = w->next;
        else
            watched = w->next;
        if (w->next)
            w->next->prev = w->prev;
        free(w);
        *socket_context = NULL;
    }
    pthread_mutex_unlock(&watch_mu);
}

/* A request's head is complete (waiting: false), or its request ended (true). */
static void head_mark(struct MHD_Connection *c, bool waiting)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    pthread_mutex_lock(&watch_mu);
    struct watch *w = ci ? ci->socket_context : NULL;
    if (w) {
        w->since_ms = waiting ? ad_now_ms() : 0;
        w->served |= waiting; /* waiting again: a request of it ended */
    }
    pthread_mutex_unlock(&watch_mu);
}

static void *watch_heads(void *arg)
{
    (void)arg;
    struct pollfd p = {.fd = watcher_stop[0], .events = POLLIN};
    while (poll(&p, 1, 1000) == 0 || (p.revents == 0 && errno == EINTR)) {
        uint64_t now = ad_now_ms(), max = (uint64_t)ad_cfg.head_timeout_s * 1000;
        pthread_mutex_lock(&watch_mu);
        for (struct watch *w = watched; w; w = w->next)
            if (w->since_ms && now - w->since_ms > max) {
                shutdown(w->fd, SHUT_RDWR);
                w->since_ms = 0; /* once */
            }
        for (struct watch *w = watched; w; w = w->next)
            if (w->since_ms && !w->served)
                head_bound(w, now);
        pthread_mutex_unlock(&watch_mu);
    }
    return NULL;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **con_cls)
{
    (void)version;
    struct listener *l = cls;
    struct ad_req *q = *con_cls;
    if (!q) {
        q = calloc(1, sizeof(*q));
        if (!q)
            return MHD_NO;
        *con_cls = q;
        q->start_ms = ad_now_ms();
        q->spool_fd = -1;
        q->is_unix = l->is_unix;
        snprintf(q->method, sizeof(q->method), "%s", method);
        q->started = true;
        head_mark(c, false);
        return l->e2b  ? first_call_e2b(c, q, url, method)
               : l->oi ? first_call_oi(c, q, url, method)
                       : first_call(c, q, url, method);
    }
    if (q->status) { /* answered already: drop the rest of the body */
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        int r = take_body(q, upload, *upload_size);
        *upload_size = 0;
        if (r < 0)
            return ad_reply_error(c, q, 500, "internal", "cannot take the body: %s", strerror(-r));
        return MHD_YES;
    }
    return last_call(c, q);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    struct ad_req *q = *con_cls;
    /* the next request's head, from now; an upgraded connection has no next request */
    head_mark(c, !(q && q->upgraded));
    if (!q)
        return;
    ad_port_ws_done(q->ws);
    ad_oi_done(q->oi);
    *con_cls = NULL;
    uint64_t ms = ad_now_ms() - q->start_ms;
    ad_metrics_request(q->route, q->status, ms);
    ad_log("%s %s %s %u %llums%s", q->owner[0] ? q->owner : "-", q->method,
           q->route ? q->route->pattern : "?", q->status, (unsigned long long)ms,
           toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (cut)");
    if (q->sess)
        ad_session_put(q->sess);
    if (q->spool_fd >= 0)
        close(q->spool_fd);
    spool_release(q);
    cJSON_Delete(q->json);
    free(q->body);
    free(q);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char buf[512];
    vsnprintf(buf, sizeof(buf), fmt, ap);
    buf[strcspn(buf, "\n")] = 0;
    ad_log("http: %s", buf);
}

/* ---- listeners ---- */

static bool inherited; /* the unix socket came from systemd: it is not ours to unlink */

/* Socket activation (sd_listen_fds(3), by hand: the protocol is three environment variables):
 * LISTEN_PID is this process and LISTEN_FDS counts descriptors from 3. The first must be a
 * listening unix stream socket; it replaces the configured path. The variables are cleared so
 * that nothing the daemon starts inherits them. Returns the fd, 0 for none, or -errno. */
static int inherited_socket(char *why, size_t len)
{
    const char *pid = getenv("LISTEN_PID"), *fds = getenv("LISTEN_FDS");
    if (!pid || !fds)
        return 0;
    char *end;
    unsigned long p = strtoul(pid, &end, 10), n = 0;
    bool mine = !*end && p == (unsigned long)getpid();
    if (mine)
        n = strtoul(fds, &end, 10);
    unsetenv("LISTEN_PID");
    unsetenv("LISTEN_FDS");
    unsetenv("LISTEN_FDNAMES");
    if (!mine || *end || n == 0)
        return 0;
    int fd = 3, type = 0, acc = 0;
    struct sockaddr_un a;
    socklen_t tl = sizeof(type), al = sizeof(acc), sl = sizeof(a);
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) < 0 ||
        getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &al) < 0 ||
        getsockname(fd, (struct sockaddr *)&a, &sl) < 0 || a.sun_family != AF_UNIX ||
        type != SOCK_STREAM || !acc) {
        snprintf(why, len, "LISTEN_FDS: descriptor 3 is not a listening unix stream socket");
        return -EINVAL;
    }
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    for (unsigned long i = 1; i < n && i < 64; i++) /* not ours to use: not passed on either */
        fcntl(3 + (int)i, F_SETFD, FD_CLOEXEC);
    if (sl > offsetof(struct sockaddr_un, sun_path) && a.sun_path[0])
        snprintf(ad_cfg.socket_path, sizeof(ad_cfg.socket_path), "%.*s",
                 (int)(sl - offsetof(struct sockaddr_un, sun_path)), a.sun_path);
    inherited = true;
    return fd;
}

static int listen_unix(char *why, size_t len)
{
    int got = inherited_socket(why, len);
    if (got != 0)
        return got;
    const char *path = ad_cfg.socket_path;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(a.sun_path)) {
        snprintf(why, len, "socket path '%s' too long", path);
        return -ENAMETOOLONG;
    }
    memcpy(a.sun_path, path, strlen(path));
    char dir[sizeof(ad_cfg.socket_path)];
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        *slash = 0;
        if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
            snprintf(why, len, "cannot make '%s': %s", dir, strerror(errno));
            return -errno;
        }
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    /* A socket left by a daemon that died is replaced; one a live daemon answers is not. */
    struct stat st;
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            close(fd);
            snprintf(why, len, "'%s' exists and is not a socket", path);
            return -EEXIST;
        }
        if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0) {
            close(fd);
            snprintf(why, len, "another airlockd answers on '%s'", path);
            return -EADDRINUSE;
        }
        unlink(path);
    }
    mode_t old = umask(0177);
    int r = bind(fd, (struct sockaddr *)&a, sizeof(a));
    umask(old);
    if (r < 0 || chmod(path, ad_cfg.socket_mode) < 0 || listen(fd, 128) < 0) {
        int e = errno;
        close(fd);
        snprintf(why, len, "cannot listen on '%s': %s", path, strerror(e));
        return -e;
    }
    return fd;
}

static int listen_tcp(const char *spec, const struct listener *l, char *why, size_t len)
{
    char host[128];
    snprintf(host, sizeof(host), "%s", spec);
    char *colon = strrchr(host, ':');
    if (!colon) {
        snprintf(why, len, "tcp '%s': expected HOST:PORT", spec);
        return -EINVAL;
    }
    *colon = 0;
    char *h = host;
    if (h[0] == '[' && h[strlen(h) - 1] == ']') {
        h++;
        h[strlen(h) - 1] = 0;
    }
    struct addrinfo hints = {.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE,
                             .ai_socktype = SOCK_STREAM},
                    *ai;
    int g = getaddrinfo(h, colon + 1, &hints, &ai);
    if (g) {
        snprintf(why, len, "tcp '%s': %s", spec, gai_strerror(g));
        return -EINVAL;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 128) < 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        freeaddrinfo(ai);
        snprintf(why, len, "cannot listen on '%s': %s", spec, strerror(e));
        return -e;
    }
    freeaddrinfo(ai);
    struct sockaddr_storage ss = {0};
    socklen_t sl = sizeof(ss);
    char addr[INET6_ADDRSTRLEN] = "?";
    unsigned port = 0;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET) {
            struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
            inet_ntop(AF_INET, &s4->sin_addr, addr, sizeof(addr));
            port = ntohs(s4->sin_port);
        } else {
            struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
            inet_ntop(AF_INET6, &s6->sin6_addr, addr, sizeof(addr));
            port = ntohs(s6->sin6_port);
        }
    }
    if (l->e2b) {
        ad_log("E2B's API on %s %s port %u (E2B_API_URL and E2B_SANDBOX_URL)",
               ad_cfg.tls_cert[0] ? "https" : "http", addr, port);
        /* getHost's names: PORT-ID.localhost:N reaches this listener on this machine */
        bool loopback = ss.ss_family == AF_INET
                            ? ntohl(((struct sockaddr_in *)&ss)->sin_addr.s_addr) >> 24 == 127
                            : IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6 *)&ss)->sin6_addr);
        if (!ad_cfg.e2b_domain[0] && loopback)
            snprintf(ad_cfg.e2b_domain, sizeof(ad_cfg.e2b_domain), "localhost:%u", port);
        return fd;
    }
    if (l->oi) {
        ad_log("Open Interpreter's server protocol on %s %s port %u (a WebSocket at /)",
               ad_cfg.tls_cert[0] ? "wss" : "ws", addr, port);
        return fd;
    }
    ad_log("listening on %s %s port %u", ad_cfg.tls_cert[0] ? "https" : "http", addr, port);
    bool v6 = ss.ss_family == AF_INET6;
    ad_log("web page: %s://%s%s%s:%u/ (sign in with an API key)",
           ad_cfg.tls_cert[0] ? "https" : "http", v6 ? "[" : "", addr, v6 ? "]" : "", port);
    return fd;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            if (cap > (1 << 20)) { /* a PEM file is small */
                free(buf);
                fclose(f);
                return NULL;
            }
            cap = cap ? 2 * cap : 8192;
            char *b = realloc(buf, cap);
            if (!b) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = b;
        }
        size_t k = fread(buf + n, 1, 4096, f);
        n += k;
        if (k == 0)
            break;
    }
    fclose(f);
    buf[n] = 0;
    return buf;
}

static char *tls_cert, *tls_key;

static struct MHD_Daemon *start(struct listener *l, int fd, bool tls)
{
    /* poll(), not select(): select() refuses every descriptor past FD_SETSIZE (1024), which
     * about 90 sessions' descriptors reach; libmicrohttpd has no epoll with a thread per
     * connection, and the connections' threads are what lets a handler block on a guest. */
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_ERROR_LOG | MHD_USE_ITC | MHD_ALLOW_UPGRADE | MHD_USE_POLL |
                     (tls ? MHD_USE_TLS : 0);
    /* Over TCP one address may hold only so many connections, so that a slow client cannot
     * take them all from the others (the unix socket's peers share no address: its budget is
     * its own listener's). */
    unsigned per_ip = l->is_unix ? 0 : ad_cfg.max_connections_per_ip;
    /* E2B's SDKs hold a stream per command from one host (often this one): that listener has
     * max_connections alone as its bound */
    if (l->e2b)
        per_ip = 0;
    if (tls)
        return MHD_start_daemon(
            flags, 0, NULL, NULL, handle, l, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
            MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_CONNECTION_TIMEOUT,
            ad_cfg.connection_timeout_s, MHD_OPTION_CONNECTION_LIMIT, ad_cfg.max_connections,
            MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_ip, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
            (size_t)CONNECTION_MEMORY, MHD_OPTION_NOTIFY_COMPLETED, completed, NULL,
            MHD_OPTION_NOTIFY_CONNECTION, notify_connection, l, MHD_OPTION_HTTPS_MEM_CERT, tls_cert,
            MHD_OPTION_HTTPS_MEM_KEY, tls_key, MHD_OPTION_END);
    return MHD_start_daemon(flags, 0, NULL, NULL, handle, l, MHD_OPTION_EXTERNAL_LOGGER, mhd_log,
                            NULL, MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_CONNECTION_TIMEOUT,
                            ad_cfg.connection_timeout_s, MHD_OPTION_CONNECTION_LIMIT,
                            ad_cfg.max_connections, MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_ip,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)CONNECTION_MEMORY,
                            MHD_OPTION_NOTIFY_COMPLETED, completed, NULL,
                            MHD_OPTION_NOTIFY_CONNECTION, notify_connection, l, MHD_OPTION_END);
}

int ad_http_start(char *why, size_t len)
{
    if (MHD_is_feature_supported(MHD_FEATURE_POLL) != MHD_YES) {
        snprintf(why, len,
                 "this libmicrohttpd has no poll() support: it would stop taking "
                 "connections at descriptor 1024");
        return -ENOTSUP;
    }
    if (pipe2(watcher_stop, O_CLOEXEC) < 0 ||
        pthread_create(&watcher, NULL, watch_heads, NULL) != 0) {
        snprintf(why, len, "cannot start the request watcher: %s", strerror(errno));
        return -EIO;
    }
    watcher_running = true;
    int fd = listen_unix(why, len);
    if (fd < 0)
        return fd;
    unix_l.d = start(&unix_l, fd, false);
    if (!unix_l.d) {
        close(fd);
        snprintf(why, len, "cannot start the HTTP server on '%s'", ad_cfg.socket_path);
        return -EIO;
    }
    if (inherited)
        ad_log("listening on %s (from systemd)", ad_cfg.socket_path);
    else
        ad_log("listening on %s (mode %04o)", ad_cfg.socket_path, ad_cfg.socket_mode);
    ad_log("web page through the socket, no key needed: from your own machine 'ssh -L "
           "8470:%s THIS-HOST', then http://127.0.0.1:8470/",
           ad_cfg.socket_path);
    if (!ad_cfg.tcp_listen[0] && !ad_cfg.e2b_listen[0] && !ad_cfg.oi_listen[0])
        return 0;
    bool tls = ad_cfg.tls_cert[0];
    if (tls) {
        tls_cert = slurp(ad_cfg.tls_cert);
        tls_key = slurp(ad_cfg.tls_key);
        if (!tls_cert || !tls_key) {
            snprintf(why, len, "cannot read tls_cert '%s' or tls_key '%s'", ad_cfg.tls_cert,
                     ad_cfg.tls_key);
            return -EIO;
        }
    }
    struct {
        struct listener *l;
        const char *spec;
    } tcps[] = {
        {&tcp_l, ad_cfg.tcp_listen}, {&e2b_l, ad_cfg.e2b_listen}, {&oi_l, ad_cfg.oi_listen}};
    for (size_t i = 0; i < sizeof(tcps) / sizeof(tcps[0]); i++) {
        if (!tcps[i].spec[0])
            continue;
        fd = listen_tcp(tcps[i].spec, tcps[i].l, why, len);
        if (fd < 0)
            return fd;
        tcps[i].l->d = start(tcps[i].l, fd, tls);
        if (!tcps[i].l->d) {
            close(fd);
            snprintf(why, len, "cannot start the HTTP server on '%s'%s", tcps[i].spec,
                     tls ? " (TLS: is the key and certificate pair valid?)" : "");
            return -EIO;
        }
    }
    return 0;
}

void ad_http_stop(void)
{
    /* Quiesce first: no new connections while the open ones finish. */
    struct listener *all[] = {&oi_l, &e2b_l, &tcp_l, &unix_l};
    size_t n = sizeof(all) / sizeof(all[0]);
    for (size_t i = 0; i < n; i++)
        if (all[i]->d)
            MHD_quiesce_daemon(all[i]->d);
    for (size_t i = 0; i < n; i++) {
        if (all[i]->d)
            MHD_stop_daemon(all[i]->d);
        all[i]->d = NULL;
    }
    if (watcher_running) {
        close(watcher_stop[1]);
        pthread_join(watcher, NULL);
        close(watcher_stop[0]);
        watcher_running = false;
    }
    if (!inherited)
        unlink(ad_cfg.socket_path);
    free(tls_cert);
    free(tls_key);
}

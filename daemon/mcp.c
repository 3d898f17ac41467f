/* The MCP server (orchestrator/mcp) over Streamable HTTP at /mcp (docs/MCP.md): POST carries
 * JSON-RPC; the answer is JSON, or an SSE stream (progress, then the answer) for the calls that
 * take time. One MCP server per owner (an API key, a unix peer), so that its sessions are that
 * owner's alone and bounded by the owner's limits, whichever MCP session or connection names
 * them; Mcp-Session-Id says only which initialize a client's requests follow (404 once it is
 * deleted). The 2026-07-28 generation comes without initialize: its requests carry their
 * version, and their Mcp-Method and Mcp-Name headers are checked against the body. */
#include "airlockd.h"

#include "mcp.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>

#define STATELESS "2026-07-28"
/* Protocol sessions held at once, all owners; one owner holds at most MCP_SESSIONS_PER_OWNER,
 * its own oldest making room for its next: one owner's initializes never end another's. When
 * the table is full of live sessions of others, a new one is refused (503). */
#define MCP_SESSIONS_MAX 1024
#define MCP_SESSIONS_PER_OWNER 64
#define MCP_SESSION_IDLE_MS (24ull * 3600 * 1000)
#define KEEPALIVE_MS 15000
#define HEADER_MISMATCH -32020 /* 2026-07-28: the headers do not say what the body does */

static const char *const versions[] = AL_MCP_VERSIONS;

/* ---- the owners' servers and the protocol sessions ---- */

struct server {
    struct server *next;
    char owner[40];
    struct ad_limits lim; /* the owner's, when the server was made */
    al_mcp *m;
};

struct psess {
    struct psess *next;
    char id[40];
    char owner[40];
    char version[16];
    uint64_t used_ms;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct server *servers;
static struct psess *psessions;
static unsigned npsessions;
static bool stopping;
/* Held (read) across each al_mcp_message, so that shutdown frees no server in use. */
static pthread_rwlock_t using = PTHREAD_RWLOCK_INITIALIZER;
/* Every server is freed: answers still due never come (atomic). */
static bool freed;

static void log_line(void *ctx, const char *line)
{
    ad_log("mcp %s: %s", (const char *)ctx, line);
}

static const char *image_for(void *ctx, const char *name, char *buf, size_t len)
{
    return ad_image_resolve(ctx, name, buf, len);
}

/* ---- the MCP servers' sessions are the registry's (sessions.c) ----
 *
 * start_session creates through ad_session_create, as REST and E2B do: the owner's quotas,
 * the pool, placement, the list, the reaper's rules. The server keeps the creator's reference
 * until it gives the session back; when the daemon ends one itself, the server is told first
 * (on_end) and lets go. */

static bool servers_freed(void);

static void sess_ended(void *ctx, struct ad_session *s)
{
    struct server *sv = ctx;
    /* Not while the servers are being freed (that is what gives the sessions back). */
    if (pthread_rwlock_tryrdlock(&using) != 0)
        return;
    if (!servers_freed())
        al_mcp_session_ended(sv->m, s);
    pthread_rwlock_unlock(&using);
}

static int sess_open(void *ctx, const al_session_opts *o, const al_fork *fork, const char *snapshot,
                     al_session **out, void **handle, al_error *err)
{
    struct server *sv = ctx;
    cJSON *labels = cJSON_CreateObject();
    cJSON_AddStringToObject(labels, "front", "mcp");
    struct ad_create c = {
        .image = o->image,
        .memory_mib = o->memory_mib,
        .vcpus = o->vcpus,
        .lifetime_s = o->lifetime_s,
        .checkpoints = o->checkpoints,
        .display = o->display,
        .display_width = o->display_width,
        .display_height = o->display_height,
        .labels = labels,
        .front_held = true,
        .on_end = sess_ended,
        .on_end_ctx = sv,
        .fork = fork, /* its image is the source's as stored */
    };
    /* Volumes: the owner's names as start_session got them (NAME:/PATH[:ro]) */
    cJSON *vols = NULL;
    for (size_t i = 0; o->volumes && o->volumes[i]; i++) {
        const char *colon = strchr(o->volumes[i], ':');
        if (!colon)
            continue;
        cJSON *v = cJSON_CreateObject();
        char name[64];
        snprintf(name, sizeof(name), "%.*s", (int)(colon - o->volumes[i]), o->volumes[i]);
        cJSON_AddStringToObject(v, "name", name);
        size_t plen = strlen(colon + 1);
        bool ro = plen > 3 && !strcmp(colon + 1 + plen - 3, ":ro");
        char path[300];
        snprintf(path, sizeof(path), "%.*s", (int)(ro ? plen - 3 : plen), colon + 1);
        cJSON_AddStringToObject(v, "path", path);
        cJSON_AddBoolToObject(v, "read_only", ro);
        if (!vols)
            vols = cJSON_CreateArray();
        cJSON_AddItemToArray(vols, v);
    }
    c.volumes = vols;
    char lib[160];
    if (snapshot) { /* the owner's snapshot: its image, memory and devices */
        if (ad_snapshot_name(sv->owner, snapshot, lib, sizeof(lib)) < 0) {
            cJSON_Delete(labels);
            cJSON_Delete(vols);
            err->code = -ENOENT;
            snprintf(err->msg, sizeof(err->msg), "no snapshot '%.200s'", snapshot);
            return -ENOENT;
        }
        c.snapshot = lib;
        c.image = NULL;
        c.memory_mib = c.vcpus = 0;
        c.display = false;
    }
    struct ad_session *s = NULL;
    struct ad_fail f = {0};
    int r = ad_session_create(sv->owner, &sv->lim, &c, &s, &f);
    cJSON_Delete(labels);
    cJSON_Delete(vols);
    if (r < 0) {
        err->code = r;
        snprintf(err->msg, sizeof(err->msg), "%.32s%s%.400s (%d %.32s)", f.limit ? f.limit : "",
                 f.limit ? ": " : "", f.msg, f.status, f.code ? f.code : "");
        return r;
    }
    *out = s->s;
    *handle = s;
    return 0;
}

static int snap_save(void *ctx, void *handle, al_session *s, const char *name, bool replace,
                     al_snapshot_info *out, al_error *err)
{
    struct server *sv = ctx;
    (void)s;
    struct ad_fail f = {0};
    int r = ad_snapshot_save(handle, sv->owner, &sv->lim, name, replace, out, &f);
    if (r < 0) {
        err->code = r;
        snprintf(err->msg, sizeof(err->msg), "%.32s%s%.400s", f.limit ? f.limit : "",
                 f.limit ? ": " : "", f.msg);
    }
    return r;
}

static void snap_list(void *ctx, void (*fn)(void *fctx, const al_snapshot_info *si), void *fctx)
{
    struct server *sv = ctx;
    ad_snapshot_list(sv->owner, fn, fctx);
}

static int snap_remove(void *ctx, const char *name, al_error *err)
{
    struct server *sv = ctx;
    struct ad_fail f = {0};
    int r = ad_snapshot_remove(sv->owner, name, &f);
    if (r < 0) {
        err->code = r;
        snprintf(err->msg, sizeof(err->msg), "%.400s", f.msg);
    }
    return r;
}

static void sess_touch(void *ctx, void *handle)
{
    (void)ctx;
    ad_session_touch(handle);
}

static bool sess_ending(void *ctx, void *handle)
{
    (void)ctx;
    return ad_session_ending(handle);
}

static void sess_close(void *ctx, void *handle)
{
    (void)ctx;
    ad_session_delete(handle); /* its reference, and the session with it */
}

/* The owner's MCP server, made on first use with the owner's limits. */
static al_mcp *server_of(const char *owner, const struct ad_limits *lim, struct ad_fail *f)
{
    pthread_mutex_lock(&lock);
    for (struct server *s = servers; s; s = s->next)
        if (!strcmp(s->owner, owner)) {
            pthread_mutex_unlock(&lock);
            return s->m;
        }
    struct server *s = stopping ? NULL : calloc(1, sizeof(*s));
    if (!s) {
        pthread_mutex_unlock(&lock);
        ad_failf(f, 503, "stopping", "the daemon is stopping");
        return NULL;
    }
    snprintf(s->owner, sizeof(s->owner), "%s", owner);
    s->lim = *lim;
    /* The owner's quotas, lifetimes and idle times are the registry's (sess_open): counted
     * with its sessions of every front, one meaning each. */
    al_mcp_opts o = {
        .image = ad_cfg.pool_image[0] ? ad_cfg.pool_image : NULL,
        .sessions_max = AL_MCP_SESSIONS_MAX,
        .memory_max_mib = lim->max_memory_mib,
        .vcpus_max = lim->max_vcpus,
        .log = log_line,
        .log_ctx = s->owner,
        .image_for = image_for,
        .image_ctx = s->owner,
        .session_open = sess_open,
        .snapshot_save = snap_save,
        .snapshot_list = snap_list,
        .snapshot_remove = snap_remove,
        .session_touch = sess_touch,
        .session_ending = sess_ending,
        .session_close = sess_close,
        .session_ctx = s,
    };
    al_error err = {0};
    if (al_mcp_new(&o, &s->m, &err) < 0) {
        pthread_mutex_unlock(&lock);
        free(s);
        ad_failf(f, 500, "internal", "%s", err.msg);
        return NULL;
    }
    s->next = servers;
    servers = s;
    pthread_mutex_unlock(&lock);
    return s->m;
}

/* Under the lock: the protocol session of owner by id, or NULL. */
static struct psess *psess_find(const char *owner, const char *id)
{
    for (struct psess *p = psessions; p; p = p->next)
        if (!strcmp(p->id, id) && !strcmp(p->owner, owner))
            return p;
    return NULL;
}

static int psess_new(const char *owner, const char *version, char *id, size_t len)
{
    unsigned char rnd[16];
    if (getrandom(rnd, sizeof(rnd), 0) != sizeof(rnd))
        return -EIO;
    pthread_mutex_lock(&lock);
    /* Idle too long: gone. The owner at its bound: its own oldest makes room (the list is
     * oldest first). */
    uint64_t now = ad_now_ms();
    unsigned own = 0;
    for (struct psess *p = psessions; p; p = p->next)
        own += !strcmp(p->owner, owner);
    for (struct psess **pp = &psessions; *pp;) {
        bool mine = !strcmp((*pp)->owner, owner);
        if (now - (*pp)->used_ms > MCP_SESSION_IDLE_MS || (mine && own >= MCP_SESSIONS_PER_OWNER)) {
            struct psess *old = *pp;
            *pp = old->next;
            free(old);
            npsessions--;
            own -= mine;
        } else {
            pp = &(*pp)->next;
        }
    }
    if (npsessions >= MCP_SESSIONS_MAX) {
        pthread_mutex_unlock(&lock);
        return -EBUSY;
    }
    struct psess *p = calloc(1, sizeof(*p));
    if (!p) {
        pthread_mutex_unlock(&lock);
        return -ENOMEM;
    }
    memcpy(p->id, "mcp-", 4);
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < sizeof(rnd); i++)
        p->id[4 + 2 * i] = hex[rnd[i] >> 4], p->id[5 + 2 * i] = hex[rnd[i] & 15];
    snprintf(p->owner, sizeof(p->owner), "%s", owner);
    snprintf(p->version, sizeof(p->version), "%s", version);
    p->used_ms = now;
    /* newest last: the eviction above takes the oldest first */
    struct psess **tail = &psessions;
    while (*tail)
        tail = &(*tail)->next;
    *tail = p;
    npsessions++;
    snprintf(id, len, "%s", p->id);
    pthread_mutex_unlock(&lock);
    return 0;
}

void ad_mcp_shutdown(void)
{
    pthread_mutex_lock(&lock);
    stopping = true;
    struct server *all = servers;
    servers = NULL;
    while (psessions) {
        struct psess *p = psessions;
        psessions = p->next;
        free(p);
    }
    pthread_mutex_unlock(&lock);
    pthread_rwlock_wrlock(&using);
    while (all) {
        struct server *s = all;
        all = s->next;
        al_mcp_free(s->m); /* its sessions' VMs go */
        free(s);
    }
    __atomic_store_n(&freed, true, __ATOMIC_SEQ_CST);
    pthread_rwlock_unlock(&using);
}

static bool servers_freed(void)
{
    return __atomic_load_n(&freed, __ATOMIC_SEQ_CST);
}

/* ---- one POST's answers: a queue between the server's threads and the response ---- */

struct answer {
    struct answer *next;
    char *json;
    bool final;
};

struct exchange {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned refs;     /* the response's, and the server's until the last final answer */
    unsigned finals;   /* final answers that came */
    unsigned expected; /* how many will, once known */
    bool known;
    bool batch;
    struct answer *head, **tail;
    size_t off; /* of the head answer's SSE text already written */
    char *sse;  /* the head answer as SSE */
};

static void exchange_unref(struct exchange *x)
{
    pthread_mutex_lock(&x->mu);
    bool last = --x->refs == 0;
    pthread_mutex_unlock(&x->mu);
    if (!last)
        return;
    while (x->head) {
        struct answer *a = x->head;
        x->head = a->next;
        free(a->json);
        free(a);
    }
    free(x->sse);
    pthread_mutex_destroy(&x->mu);
    pthread_cond_destroy(&x->cv);
    free(x);
}

/* Under x->mu: whether every final answer came. */
static bool all_in(const struct exchange *x)
{
    return x->known && x->finals >= x->expected;
}

static void on_send(void *ctx, const char *json, bool final)
{
    struct exchange *x = ctx;
    struct answer *a = json ? calloc(1, sizeof(*a)) : NULL;
    if (a && !(a->json = strdup(json))) {
        free(a);
        a = NULL;
    }
    pthread_mutex_lock(&x->mu);
    if (a) {
        a->final = final;
        *x->tail = a;
        x->tail = &a->next;
    }
    bool done = false;
    if (final) {
        x->finals++;
        done = all_in(x);
    }
    pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->mu);
    if (done)
        exchange_unref(x); /* the server's */
}

static struct exchange *exchange_new(void)
{
    struct exchange *x = calloc(1, sizeof(*x));
    if (!x)
        return NULL;
    pthread_mutex_init(&x->mu, NULL);
    pthread_cond_init(&x->cv, NULL);
    x->refs = 2;
    x->tail = &x->head;
    return x;
}

/* After al_mcp_message returned n. */
static void exchange_expect(struct exchange *x, unsigned n)
{
    pthread_mutex_lock(&x->mu);
    x->expected = n;
    x->known = true;
    bool done = all_in(x);
    pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->mu);
    if (done)
        exchange_unref(x);
}

static ssize_t read_sse(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    struct exchange *x = cls;
    pthread_mutex_lock(&x->mu);
    /* within half the connection's idle timeout, or libmicrohttpd cuts a long call's stream */
    uint64_t beat = (uint64_t)ad_cfg.connection_timeout_s * 500;
    uint64_t until = ad_now_ms() + (beat && beat < KEEPALIVE_MS ? beat : KEEPALIVE_MS);
    while (!x->sse && !x->head && !all_in(x) && !servers_freed() && ad_now_ms() < until) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&x->cv, &x->mu, &ts);
    }
    if (!x->sse && x->head) {
        struct answer *a = x->head;
        if (!(x->head = a->next))
            x->tail = &x->head;
        if (asprintf(&x->sse, "event: message\ndata: %s\n\n", a->json) < 0)
            x->sse = NULL;
        x->off = 0;
        free(a->json);
        free(a);
    }
    ssize_t n;
    if (x->sse) {
        size_t left = strlen(x->sse + x->off);
        n = (ssize_t)(left < max ? left : max);
        memcpy(buf, x->sse + x->off, (size_t)n);
        x->off += (size_t)n;
        if (!x->sse[x->off]) {
            free(x->sse);
            x->sse = NULL;
        }
    } else if (all_in(x) || servers_freed()) {
        n = MHD_CONTENT_READER_END_OF_STREAM;
    } else {
        /* a comment keeps proxies and idle timeouts from cutting a long call */
        static const char ka[] = ": keepalive\n\n";
        n = (ssize_t)(sizeof(ka) - 1 < max ? sizeof(ka) - 1 : max);
        memcpy(buf, ka, (size_t)n);
    }
    pthread_mutex_unlock(&x->mu);
    return n;
}

/* The server's reference too when its answers will never come (shutdown). */
static void exchange_done(struct exchange *x)
{
    pthread_mutex_lock(&x->mu);
    bool orphan = servers_freed() && !all_in(x);
    pthread_mutex_unlock(&x->mu);
    if (orphan)
        exchange_unref(x);
    exchange_unref(x);
}

static void free_sse(void *cls)
{
    exchange_done(cls);
}

/* ---- the route ---- */

/* A JSON-RPC error as the body of an HTTP error. */
static enum MHD_Result rpc_http_error(struct MHD_Connection *c, struct ad_req *q, unsigned status,
                                      const cJSON *id, int code, const char *msg)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "jsonrpc", "2.0");
    cJSON_AddItemToObject(o, "id", id ? cJSON_Duplicate(id, true) : cJSON_CreateNull());
    cJSON *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddNumberToObject(e, "code", code);
    cJSON_AddStringToObject(e, "message", msg);
    q->status = status;
    return ad_reply_json(c, q, status, o);
}

/* 400 for a version this server does not speak: the versions it does, and the one asked. */
static enum MHD_Result unsupported_version(struct MHD_Connection *c, struct ad_req *q,
                                           const cJSON *id, const char *asked)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "jsonrpc", "2.0");
    cJSON_AddItemToObject(o, "id", id ? cJSON_Duplicate(id, true) : cJSON_CreateNull());
    cJSON *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddNumberToObject(e, "code", -32600);
    cJSON_AddStringToObject(e, "message", "unsupported MCP-Protocol-Version");
    cJSON *data = cJSON_AddObjectToObject(e, "data");
    cJSON *sup = cJSON_AddArrayToObject(data, "supported");
    cJSON_AddItemToArray(sup, cJSON_CreateString(STATELESS));
    for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]); i++)
        cJSON_AddItemToArray(sup, cJSON_CreateString(versions[i]));
    cJSON_AddStringToObject(data, "requested", asked);
    q->status = 400;
    return ad_reply_json(c, q, 400, o);
}

/* A header's value without the blanks around it (RFC 9110's OWS), into buf. */
static const char *trimmed(const char *v, char *buf, size_t len)
{
    if (!v)
        return NULL;
    v += strspn(v, " \t");
    size_t n = strlen(v);
    while (n && (v[n - 1] == ' ' || v[n - 1] == '\t'))
        n--;
    snprintf(buf, len, "%.*s", (int)n, v);
    return buf;
}

static bool version_known(const char *v)
{
    if (!strcmp(v, STATELESS))
        return true;
    for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]); i++)
        if (!strcmp(v, versions[i]))
            return true;
    return false;
}

/* Origin: absent (not a browser), or a page of this machine. Anything else is another site's
 * page reaching a local server (DNS rebinding among them). */
static bool origin_ok(const char *origin)
{
    if (!origin)
        return true;
    const char *p = strstr(origin, "://");
    if (!p)
        return false;
    char host[256];
    snprintf(host, sizeof(host), "%.*s", (int)strcspn(p + 3, "/"), p + 3);
    return host[0] && ad_loopback_host(host);
}

static bool accepts(const char *accept, const char *type)
{
    return !accept || strstr(accept, type) || strstr(accept, "*/*");
}

/* What one message asks: its first request's method and id, whether it holds an initialize,
 * a call that takes time, or requests at all; the 2026 version in a request's _meta. */
struct shape {
    const cJSON *id;
    const char *method, *name;
    const char *notification; /* the first notification's method (what Mcp-Method may name) */
    const char *meta_version; /* the first request's _meta version, when a string */
    bool meta_incomplete;     /* a request without _meta's version or client capabilities */
    bool initialize, slow, requests, stateless, known;
};

static void shape_one(const cJSON *m, struct shape *s)
{
    const cJSON *method = cJSON_GetObjectItemCaseSensitive(m, "method");
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(m, "id");
    if (!cJSON_IsString(method))
        return;
    const char *name = method->valuestring;
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(m, "params");
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(params, "_meta");
    const cJSON *v =
        cJSON_GetObjectItemCaseSensitive(meta, "io.modelcontextprotocol/protocolVersion");
    if (!v)
        v = cJSON_GetObjectItemCaseSensitive(meta, "protocolVersion");
    if (cJSON_IsString(v) && !strcmp(v->valuestring, STATELESS))
        s->stateless = true;
    if (!id) {
        if (!s->notification)
            s->notification = name;
        return;
    }
    if (!s->meta_version && cJSON_IsString(v))
        s->meta_version = v->valuestring;
    if (!cJSON_IsString(v) || !cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(
                                  meta, "io.modelcontextprotocol/clientCapabilities")))
        s->meta_incomplete = true;
    if (!s->method) {
        s->method = name;
        s->id = id;
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(
            params, !strcmp(name, "resources/read") ? "uri" : "name");
        s->name = cJSON_IsString(n) ? n->valuestring : NULL;
        /* 2026-07-28's methods: initialize and ping are gone from it */
        static const char *const known[] = {"tools/list",      "tools/call",
                                            "resources/list",  "resources/read",
                                            "server/discover", "resources/templates/list"};
        s->known = false;
        for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
            s->known |= !strcmp(name, known[i]);
    }
    s->requests = true;
    s->initialize |= !strcmp(name, "initialize");
    s->slow |= !strcmp(name, "tools/call") || !strncmp(name, "resources/", 10);
}

static enum MHD_Result mcp_post(struct MHD_Connection *c, struct ad_req *q)
{
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (!origin_ok(origin))
        return rpc_http_error(c, q, 403, NULL, -32600, "Origin not allowed");
    const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
    if (!ct || strncasecmp(ct, "application/json", 16))
        return rpc_http_error(c, q, 415, NULL, -32600, "the body must be application/json");
    const char *accept = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Accept");
    if (!accepts(accept, "application/json") && !accepts(accept, "text/event-stream"))
        return rpc_http_error(c, q, 406, NULL, -32600,
                              "Accept must allow application/json or text/event-stream");
    _cleanup_cjson_ cJSON *msg = cJSON_ParseWithLength(q->body ? q->body : "", q->body_len);
    if (!msg)
        return rpc_http_error(c, q, 400, NULL, -32700, "parse error: the body is not JSON");
    struct shape sh = {0};
    if (cJSON_IsArray(msg)) {
        const cJSON *el;
        cJSON_ArrayForEach(el, msg) shape_one(el, &sh);
    } else {
        shape_one(msg, &sh);
    }
    const char *hv = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "MCP-Protocol-Version");
    const char *hsid = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Mcp-Session-Id");
    if (hv && !version_known(hv))
        return unsupported_version(c, q, sh.id, hv);
    bool stateless = sh.stateless || (hv && !strcmp(hv, STATELESS));
    /* The 2026 headers, when given, say what the body does. */
    char hmb[256], hnb[512];
    const char *hm =
        trimmed(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Mcp-Method"), hmb, sizeof(hmb));
    const char *hn =
        trimmed(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Mcp-Name"), hnb, sizeof(hnb));
    /* A 2026-07-28 request says its version and method in headers too (Mcp-Name for the
     * methods that name a tool or a resource), and they must agree with the body. */
    bool named =
        sh.method && (!strcmp(sh.method, "tools/call") || !strcmp(sh.method, "resources/read"));
    if (stateless && sh.method && (!hv || !hm || (named && !hn)))
        return rpc_http_error(c, q, 400, sh.id, HEADER_MISMATCH,
                              "a 2026-07-28 request needs MCP-Protocol-Version and Mcp-Method "
                              "(and Mcp-Name for a tool or a resource)");
    /* the request's method, or a lone notification's (notifications/initialized) */
    const char *said = sh.method ? sh.method : sh.notification;
    if ((hm && (!said || strcmp(hm, said))) || (hn && (!sh.name || strcmp(hn, sh.name))))
        return rpc_http_error(c, q, 400, sh.id, HEADER_MISMATCH,
                              "Mcp-Method or Mcp-Name does not match the body");
    if (hv && sh.meta_version && strcmp(hv, sh.meta_version))
        return rpc_http_error(c, q, 400, sh.id, HEADER_MISMATCH,
                              "MCP-Protocol-Version and the request's _meta name other versions");
    if (stateless && sh.method && !sh.known)
        return rpc_http_error(c, q, 404, sh.id, -32601, "method not found");
    /* A 2026-07-28 request carries its version and the client's capabilities in _meta. */
    if (hv && !strcmp(hv, STATELESS) && sh.method && sh.meta_incomplete)
        return rpc_http_error(c, q, 400, sh.id, -32602,
                              "invalid params: a 2026-07-28 request's _meta needs "
                              "io.modelcontextprotocol/protocolVersion and clientCapabilities");
    struct ad_fail f = {0};
    al_mcp *m = server_of(q->owner, &q->lim, &f);
    if (!m)
        return ad_reply_fail(c, q, &f);
    char sid[40] = "";
    if (sh.initialize) {
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(
            cJSON_IsArray(msg) ? cJSON_GetArrayItem(msg, 0) : msg, "params");
        const cJSON *pv = cJSON_GetObjectItemCaseSensitive(params, "protocolVersion");
        int r = psess_new(q->owner, cJSON_IsString(pv) ? pv->valuestring : "", sid, sizeof(sid));
        if (r == -EBUSY)
            return rpc_http_error(c, q, 503, sh.id, -32603,
                                  "too many MCP sessions open on this daemon; try again later");
        if (r < 0)
            return rpc_http_error(c, q, 500, sh.id, -32603, "cannot make a session");
    } else if (hsid) {
        pthread_mutex_lock(&lock);
        struct psess *p = psess_find(q->owner, hsid);
        if (p)
            p->used_ms = ad_now_ms();
        pthread_mutex_unlock(&lock);
        if (!p)
            return rpc_http_error(c, q, 404, sh.id, -32001, "no such MCP session (it ended)");
    } else if (!stateless && sh.requests && !(sh.method && !strcmp(sh.method, "ping")) &&
               !(sh.method && !strcmp(sh.method, "server/discover"))) {
        return rpc_http_error(c, q, 400, sh.id, -32600,
                              "Mcp-Session-Id is needed (initialize first)");
    }
    struct exchange *x = exchange_new();
    if (!x)
        return rpc_http_error(c, q, 500, sh.id, -32603, "out of memory");
    x->batch = cJSON_IsArray(msg);
    pthread_rwlock_rdlock(&using);
    if (servers_freed()) {
        pthread_rwlock_unlock(&using);
        exchange_unref(x);
        exchange_unref(x);
        return rpc_http_error(c, q, 503, sh.id, -32603, "the daemon is stopping");
    }
    unsigned n = al_mcp_message(m, q->body, q->body_len, on_send, x);
    pthread_rwlock_unlock(&using);
    exchange_expect(x, n);
    if (!n) {
        /* notifications and responses only */
        exchange_unref(x);
        struct MHD_Response *r = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
        return ad_reply(c, q, 202, r);
    }
    struct MHD_Response *r;
    if (sh.slow && accepts(accept, "text/event-stream") &&
        (!accept || strstr(accept, "text/event-stream"))) {
        r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, read_sse, x, free_sse);
        if (!r) {
            exchange_unref(x);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
    } else {
        /* Every final answer, then one JSON body (an array for a batch). */
        pthread_mutex_lock(&x->mu);
        while (!all_in(x) && !servers_freed()) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 1;
            pthread_cond_timedwait(&x->cv, &x->mu, &ts);
        }
        cJSON *out = x->batch ? cJSON_CreateArray() : NULL;
        for (struct answer *a = x->head; a; a = a->next) {
            if (!a->final)
                continue;
            cJSON *j = cJSON_Parse(a->json);
            if (x->batch)
                cJSON_AddItemToArray(out, j);
            else if (!out)
                out = j;
            else
                cJSON_Delete(j);
        }
        pthread_mutex_unlock(&x->mu);
        exchange_done(x);
        if (!out) /* a cancelled request's only answer was none */
            return ad_reply(c, q, 202,
                            MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT));
        char *text = cJSON_PrintUnformatted(out);
        cJSON_Delete(out);
        if (!text)
            return MHD_NO;
        r = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
        MHD_add_response_header(r, "Content-Type", "application/json");
    }
    if (sid[0])
        MHD_add_response_header(r, "Mcp-Session-Id", sid);
    return ad_reply(c, q, 200, r);
}

static enum MHD_Result mcp_delete(struct MHD_Connection *c, struct ad_req *q)
{
    const char *hsid = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Mcp-Session-Id");
    if (!origin_ok(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin")))
        return rpc_http_error(c, q, 403, NULL, -32600, "Origin not allowed");
    if (!hsid) {
        struct MHD_Response *r = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
        MHD_add_response_header(r, "Allow", "POST");
        return ad_reply(c, q, 405, r);
    }
    pthread_mutex_lock(&lock);
    bool found = false;
    for (struct psess **pp = &psessions; *pp; pp = &(*pp)->next)
        if (!strcmp((*pp)->id, hsid) && !strcmp((*pp)->owner, q->owner)) {
            struct psess *p = *pp;
            *pp = p->next;
            free(p);
            npsessions--;
            found = true;
            break;
        }
    pthread_mutex_unlock(&lock);
    if (!found)
        return rpc_http_error(c, q, 404, NULL, -32001, "no such MCP session");
    return ad_reply(c, q, 204, MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT));
}

/* No stream the server opens on its own: GET is 405, as the transport allows. */
static enum MHD_Result mcp_get(struct MHD_Connection *c, struct ad_req *q)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(r, "Allow", "POST, DELETE");
    return ad_reply(c, q, 405, r);
}

enum MHD_Result ad_mcp_route(struct MHD_Connection *c, struct ad_req *q)
{
    if (!strcmp(q->method, "POST"))
        return mcp_post(c, q);
    if (!strcmp(q->method, "DELETE"))
        return mcp_delete(c, q);
    return mcp_get(c, q);
}

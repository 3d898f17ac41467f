/* The route table and its handlers: each reads its request, calls the library (or sessions.c,
 * runs.c) and answers. docs/openapi.yaml describes the same table; tests/integration compares
 * the two (airlockd routes). */
#include "airlockd.h"

#include <curl/curl.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* ---- reading a JSON body: every field checked for its type ---- */

/* Field k of the body; NULL when it is absent or null (the default applies). */
static cJSON *field(struct ad_req *q, const char *k)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(q->json, k);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static int wrong_type(const char *k, const char *what, char *why, size_t len)
{
    snprintf(why, len, "%s: %s", k, what);
    return -EINVAL;
}

static int get_str(struct ad_req *q, const char *k, const char **out, char *why, size_t len)
{
    cJSON *v = field(q, k);
    if (v && !cJSON_IsString(v))
        return wrong_type(k, "a string", why, len);
    if (v)
        *out = v->valuestring;
    return 0;
}

static int get_uint(struct ad_req *q, const char *k, unsigned *out, char *why, size_t len)
{
    cJSON *v = field(q, k);
    if (v && (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 4e9 ||
              v->valuedouble != (double)(unsigned)v->valuedouble))
        return wrong_type(k, "a whole number from 0 to 4000000000", why, len);
    if (v)
        *out = (unsigned)v->valuedouble;
    return 0;
}

/* A number from lo to hi; *has says whether it was given. */
static int get_number(struct ad_req *q, const char *k, double lo, double hi, double *out, bool *has,
                      char *why, size_t len)
{
    cJSON *v = field(q, k);
    if (v && (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi))) {
        snprintf(why, len, "%s: a number from %g to %g", k, lo, hi);
        return -EINVAL;
    }
    if (v) {
        *out = v->valuedouble;
        *has = true;
    }
    return 0;
}

static int get_bool(struct ad_req *q, const char *k, bool *out, char *why, size_t len)
{
    cJSON *v = field(q, k);
    if (v && !cJSON_IsBool(v))
        return wrong_type(k, "true or false", why, len);
    if (v)
        *out = cJSON_IsTrue(v);
    return 0;
}

/* A terminal's size: {"rows": R, "cols": C} at o's key k (k NULL: o itself), each from 1 to
 * AL_PTY_ROWS_COLS_MAX; both left 0 when k is absent. */
static int get_size(cJSON *o, const char *k, unsigned *rows, unsigned *cols, char *why, size_t len)
{
    cJSON *v = k ? cJSON_GetObjectItemCaseSensitive(o, k) : o;
    if (k && (!v || cJSON_IsNull(v)))
        return 0;
    cJSON *r = cJSON_GetObjectItemCaseSensitive(v, "rows");
    cJSON *c = cJSON_GetObjectItemCaseSensitive(v, "cols");
    if (!cJSON_IsObject(v) || !cJSON_IsNumber(r) || !cJSON_IsNumber(c) || r->valuedouble < 1 ||
        c->valuedouble < 1 || r->valuedouble > AL_PTY_ROWS_COLS_MAX ||
        c->valuedouble > AL_PTY_ROWS_COLS_MAX || r->valuedouble != (int)r->valuedouble ||
        c->valuedouble != (int)c->valuedouble) {
        snprintf(why, len, "%s%s{\"rows\": R, \"cols\": C}, each a whole number from 1 to %d",
                 k ? k : "", k ? ": " : "", AL_PTY_ROWS_COLS_MAX);
        return -EINVAL;
    }
    *rows = (unsigned)r->valuedouble;
    *cols = (unsigned)c->valuedouble;
    return 0;
}

static const char *query(struct MHD_Connection *c, const char *k)
{
    return MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, k);
}

/* ---- health ---- */

static enum MHD_Result health(struct MHD_Connection *c, struct ad_req *q)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", "ok");
    cJSON_AddStringToObject(o, "version", AIRLOCK_VERSION);
    cJSON *pool = ad_pool_json();
    cJSON_AddItemToObject(o, "pool", pool ? pool : cJSON_CreateNull());
    return ad_reply_json(c, q, 200, o);
}

/* ---- who the caller is to the daemon: what a page shows before anything else ---- */

static enum MHD_Result me_get(struct MHD_Connection *c, struct ad_req *q)
{
    cJSON *o = cJSON_CreateObject();
    /* a page over the unix socket (its local forward) has nobody signed in: no "Sign out" */
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    cJSON_AddStringToObject(o, "via", q->is_unix ? "socket" : auth ? "key" : "cookie");
    cJSON *m = cJSON_AddObjectToObject(o, "model");
    bool configured = ad_cfg.model_api_base[0] && ad_cfg.model[0];
    cJSON_AddBoolToObject(m, "configured", configured);
    if (configured)
        cJSON_AddStringToObject(m, "name", ad_cfg.model);
    else
        cJSON_AddStringToObject(m, "why",
                                "this daemon has no model configured: set model_api_base and "
                                "model (and model_api_key_env) in airlockd.conf, then restart it; "
                                "sessions, terminals and %% commands work without one");
    return ad_reply_json(c, q, 200, o);
}

/* ---- hosts: for the operator on this machine (a unix socket peer); they are the daemon's, and
 * a key's holder never learns where sessions run ---- */

static enum MHD_Result hosts_get(struct MHD_Connection *c, struct ad_req *q)
{
    if (!q->is_unix)
        return ad_reply_error(c, q, 403, "forbidden",
                              "the hosts are listed on the unix socket only");
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "hosts", ad_hosts_json());
    return ad_reply_json(c, q, 200, o);
}

/* ---- metrics: the Prometheus text format, the daemon's counters (not one owner's) ---- */

static enum MHD_Result metrics(struct MHD_Connection *c, struct ad_req *q)
{
    size_t len = 0;
    char *text = ad_metrics_text(&len);
    if (!text)
        return ad_reply_error(c, q, 500, "internal", "out of memory");
    struct MHD_Response *r = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
    return ad_reply(c, q, 200, r);
}

/* ---- sessions ---- */

static enum MHD_Result session_create(struct MHD_Connection *c, struct ad_req *q)
{
    struct ad_create cr = {0};
    const char *snap = NULL;
    char why[256] = "";
    if (get_str(q, "image", &cr.image, why, sizeof(why)) < 0 ||
        get_uint(q, "memory_mib", &cr.memory_mib, why, sizeof(why)) < 0 ||
        get_uint(q, "vcpus", &cr.vcpus, why, sizeof(why)) < 0 ||
        get_str(q, "transport", &cr.transport, why, sizeof(why)) < 0 ||
        get_str(q, "checkpoint_policy", &cr.checkpoint_policy, why, sizeof(why)) < 0 ||
        get_bool(q, "checkpoints", &cr.checkpoints, why, sizeof(why)) < 0 ||
        get_bool(q, "display", &cr.display, why, sizeof(why)) < 0 ||
        get_uint(q, "display_width", &cr.display_width, why, sizeof(why)) < 0 ||
        get_uint(q, "display_height", &cr.display_height, why, sizeof(why)) < 0 ||
        get_uint(q, "idle_timeout_s", &cr.idle_s, why, sizeof(why)) < 0 ||
        get_uint(q, "lifetime_s", &cr.lifetime_s, why, sizeof(why)) < 0 ||
        get_str(q, "name", &cr.name, why, sizeof(why)) < 0 ||
        get_uint(q, "auto_pause_s", &cr.auto_pause_s, why, sizeof(why)) < 0 ||
        get_str(q, "snapshot", &snap, why, sizeof(why)) < 0)
        return ad_reply_error(c, q, 400, "invalid", "%s", why);
    char lib[160];
    if (snap) {
        if (cr.image || cr.memory_mib || cr.vcpus || cr.transport || cr.display)
            return ad_reply_error(c, q, 400, "invalid",
                                  "snapshot: its image, memory, vCPUs and devices are the "
                                  "snapshot's (no image, memory_mib, vcpus, transport, display)");
        if (ad_snapshot_name(q->owner, snap, lib, sizeof(lib)) < 0)
            return ad_reply_error(c, q, 404, "not_found", "no snapshot named '%s'", snap);
        cr.snapshot = lib;
    }
    if (cr.name && !ad_session_name_ok(cr.name))
        return ad_reply_error(c, q, 400, "invalid",
                              "name: 1 to 63 of [A-Za-z0-9._-], not starting with 'airlock-'");
    cr.labels = cJSON_GetObjectItemCaseSensitive(q->json, "labels");
    cr.net = cJSON_GetObjectItemCaseSensitive(q->json, "net");
    cr.volumes = cJSON_GetObjectItemCaseSensitive(q->json, "volumes");
    if (cr.volumes && !cJSON_IsArray(cr.volumes))
        return ad_reply_error(c, q, 400, "invalid",
                              "volumes: a list of {\"name\", \"path\", \"read_only\"}");
    if (cr.volumes && !cJSON_GetArraySize(cr.volumes))
        cr.volumes = NULL;
    if (cr.image && (!cr.image[0] || strchr(cr.image, '/') || strlen(cr.image) >= 64))
        return ad_reply_error(c, q, 400, "invalid", "image: a name in the store");
    struct ad_session *s;
    struct ad_fail f;
    if (ad_session_create(q->owner, &q->lim, &cr, &s, &f) < 0)
        return ad_reply_fail(c, q, &f);
    cJSON *o = ad_session_json(s);
    ad_session_put(s);
    return ad_reply_json(c, q, 201, o);
}

/* The create's options a fork may set too (session_create's, less what the source fixes). */
static int fork_opts(struct ad_req *q, struct ad_create *cr, char *why, size_t wlen)
{
    if (get_str(q, "checkpoint_policy", &cr->checkpoint_policy, why, wlen) < 0 ||
        get_uint(q, "idle_timeout_s", &cr->idle_s, why, wlen) < 0 ||
        get_uint(q, "lifetime_s", &cr->lifetime_s, why, wlen) < 0 ||
        get_str(q, "name", &cr->name, why, wlen) < 0)
        return -1;
    cr->labels = cJSON_GetObjectItemCaseSensitive(q->json, "labels");
    return 0;
}

/* A fork's entry: the session, or {"error": {"status", "code", "message", "limit"}}. */
static void fork_one(void *ctx, struct ad_session *s, const struct ad_fail *why)
{
    if (s) {
        cJSON_AddItemToArray(ctx, ad_session_json(s));
        return;
    }
    cJSON *one = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(one, "error");
    cJSON_AddNumberToObject(e, "status", why->status);
    cJSON_AddStringToObject(e, "code", why->code ? why->code : "internal");
    cJSON_AddStringToObject(e, "message", why->msg);
    if (why->limit)
        cJSON_AddStringToObject(e, "limit", why->limit);
    cJSON_AddItemToArray(ctx, one);
}

static enum MHD_Result session_fork(struct MHD_Connection *c, struct ad_req *q)
{
    struct ad_fork_req fr = {.count = 1};
    char why[256] = "";
    bool reseed = true;
    if (get_uint(q, "count", &fr.count, why, sizeof(why)) < 0 ||
        get_bool(q, "reseed", &reseed, why, sizeof(why)) < 0 ||
        fork_opts(q, &fr.c, why, sizeof(why)) < 0)
        return ad_reply_error(c, q, 400, "invalid", "%s", why);
    if (fr.c.name && !ad_session_name_ok(fr.c.name))
        return ad_reply_error(c, q, 400, "invalid",
                              "name: 1 to 59 of [A-Za-z0-9._-], not starting with 'airlock-'");
    if (fr.c.labels && !cJSON_IsObject(fr.c.labels))
        return ad_reply_error(c, q, 400, "invalid", "labels: an object");
    fr.keep_identity = !reseed;
    cJSON *o = cJSON_CreateObject();
    cJSON *forks = cJSON_AddArrayToObject(o, "forks");
    struct ad_fail f;
    if (ad_session_fork(q->sess, q->owner, &q->lim, &fr, fork_one, forks, &f) < 0) {
        cJSON_Delete(o);
        return ad_reply_fail(c, q, &f);
    }
    return ad_reply_json(c, q, 201, o);
}

static cJSON *snapshot_json(const al_snapshot_info *si)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", si->name);
    cJSON_AddStringToObject(o, "image", si->image);
    cJSON_AddNumberToObject(o, "memory_mib", si->memory_mib);
    cJSON_AddNumberToObject(o, "bytes", (double)si->bytes);
    cJSON_AddNumberToObject(o, "created", (double)si->created);
    return o;
}

static enum MHD_Result snapshot_create(struct MHD_Connection *c, struct ad_req *q)
{
    const char *name = NULL;
    bool replace = false;
    char why[256], gen[32];
    if (get_str(q, "name", &name, why, sizeof(why)) < 0 ||
        get_bool(q, "replace", &replace, why, sizeof(why)) < 0)
        return ad_reply_error(c, q, 400, "invalid", "%s", why);
    if (!name) {
        char hex[17];
        if (ad_random_hex(hex, 4) < 0)
            return ad_reply_error(c, q, 500, "internal", "no random bytes");
        snprintf(gen, sizeof(gen), "snap-%s", hex);
        name = gen;
    }
    al_snapshot_info si = AL_SNAPSHOT_INFO_INIT;
    struct ad_fail f;
    if (ad_snapshot_save(q->sess, q->owner, &q->lim, name, replace, &si, &f) < 0)
        return ad_reply_fail(c, q, &f);
    return ad_reply_json(c, q, 201, snapshot_json(&si));
}

static void snapshot_one(void *ctx, const al_snapshot_info *si)
{
    cJSON_AddItemToArray(ctx, snapshot_json(si));
}

static enum MHD_Result snapshot_list(struct MHD_Connection *c, struct ad_req *q)
{
    cJSON *o = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(o, "snapshots");
    ad_snapshot_list(q->owner, snapshot_one, a);
    return ad_reply_json(c, q, 200, o);
}

static enum MHD_Result snapshot_delete(struct MHD_Connection *c, struct ad_req *q)
{
    struct ad_fail f;
    if (ad_snapshot_remove(q->owner, q->params[0], &f) < 0)
        return ad_reply_fail(c, q, &f);
    return ad_reply(c, q, 204, MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT));
}

static cJSON *volume_json(const al_vol_info *v)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", v->name);
    cJSON_AddNumberToObject(o, "size_bytes", (double)v->size);
    cJSON_AddNumberToObject(o, "bytes", (double)v->bytes);
    cJSON_AddNumberToObject(o, "created", (double)v->created);
    cJSON_AddBoolToObject(o, "in_use", v->in_use);
    cJSON_AddBoolToObject(o, "read_write", v->writer);
    return o;
}

static enum MHD_Result volume_create(struct MHD_Connection *c, struct ad_req *q)
{
    const char *name = NULL;
    double size = 1 << 30;
    bool has = false;
    char why[256];
    if (get_str(q, "name", &name, why, sizeof(why)) < 0 ||
        get_number(q, "size_bytes", 1 << 20, 16.0 * (1ull << 40), &size, &has, why, sizeof(why)) <
            0)
        return ad_reply_error(c, q, 400, "invalid", "%s", why);
    if (!name)
        return ad_reply_error(c, q, 400, "invalid", "name: needed");
    al_vol_info v;
    struct ad_fail f;
    if (ad_volume_create(q->owner, &q->lim, name, (uint64_t)size, &v, &f) < 0)
        return ad_reply_fail(c, q, &f);
    return ad_reply_json(c, q, 201, volume_json(&v));
}

static void volume_one(void *ctx, const al_vol_info *v)
{
    cJSON_AddItemToArray(ctx, volume_json(v));
}

static enum MHD_Result volume_list(struct MHD_Connection *c, struct ad_req *q)
{
    cJSON *o = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(o, "volumes");
    ad_volume_list(q->owner, volume_one, a);
    return ad_reply_json(c, q, 200, o);
}

static enum MHD_Result volume_delete(struct MHD_Connection *c, struct ad_req *q)
{
    struct ad_fail f;
    if (ad_volume_remove(q->owner, q->params[0], &f) < 0)
        return ad_reply_fail(c, q, &f);
    return ad_reply(c, q, 204, MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT));
}

static void list_one(void *ctx, struct ad_session *s)
{
    cJSON_AddItemToArray(ctx, ad_session_json(s));
}

static enum MHD_Result session_list(struct MHD_Connection *c, struct ad_req *q)
{
    cJSON *o = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(o, "sessions");
    ad_session_list(q->owner, list_one, a);
    return ad_reply_json(c, q, 200, o);
}

static enum MHD_Result session_get(struct MHD_Connection *c, struct ad_req *q)
{
    return ad_reply_json(c, q, 200, ad_session_json(q->sess));
}

static enum MHD_Result session_delete(struct MHD_Connection *c, struct ad_req *q)
{
    struct ad_session *s = q->sess;
    q->sess = NULL; /* freed by the delete */
    ad_session_delete(s);
    return ad_reply(c, q, 204, MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT));
}

static enum MHD_Result session_extend(struct MHD_Connection *c, struct ad_req *q)
{
    unsigned secs = 0;
    char why[256];
    if (get_uint(q, "seconds", &secs, why, sizeof(why)) < 0 || secs == 0)
        return ad_reply_error(c, q, 400, "invalid", "seconds: a whole number above 0");
    struct ad_fail f;
    if (ad_session_extend(q->sess, secs, &q->lim, &f) < 0)
        return ad_reply_fail(c, q, &f);
    return ad_reply_json(c, q, 200, ad_session_json(q->sess));
}

static enum MHD_Result session_pause(struct MHD_Connection *c, struct ad_req *q)
{
    struct ad_fail f;
    if (ad_session_pause(q->sess, &f) < 0)
        return ad_reply_fail(c, q, &f);
    return ad_reply_json(c, q, 200, ad_session_json(q->sess));
}

static enum MHD_Result session_resume(struct MHD_Connection *c, struct ad_req *q)
{
    struct ad_fail f;
    if (ad_session_resume(q->sess, &f) < 0)
        return ad_reply_fail(c, q, &f);
    return ad_reply_json(c, q, 200, ad_session_json(q->sess));
}

/* ---- network requests: the session's proxy log, a page at a time ---- */

#define NET_PAGE_DEFAULT 100
#define NET_PAGE_MAX 1000

struct net_page {
    cJSON *arr;
    unsigned n, limit;
};

static void net_one(void *ctx, const al_net_request *r)
{
    struct net_page *p = ctx;
    if (p->n >= p->limit)
        return;
    p->n++;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "time_ms", (double)r->time_ms);
    cJSON_AddStringToObject(o, "method", r->method);
    cJSON_AddStringToObject(o, "host", r->host);
    cJSON_AddNumberToObject(o, "port", r->port);
    cJSON_AddNumberToObject(o, "status", r->status);
    cJSON_AddNumberToObject(o, "bytes", (double)r->bytes);
    cJSON_AddBoolToObject(o, "allowed", r->allowed);
    if (r->allowed)
        cJSON_AddNullToObject(o, "why");
    else
        cJSON_AddStringToObject(o, "why", r->why);
    cJSON_AddItemToArray(p->arr, o);
}

static int query_u64(struct MHD_Connection *c, const char *k, uint64_t max, uint64_t *out)
{
    const char *v = query(c, k);
    if (!v)
        return 0;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (!*v || *v == '-' || *end || errno || x > max)
        return -EINVAL;
    *out = x;
    return 0;
}

/* A library call's failure as the API's error reply. */
static enum MHD_Result lib_fail(struct MHD_Connection *c, struct ad_req *q, int r,
                                const al_error *err)
{
    struct ad_fail f;
    ad_fail_from(&f, r, err);
    return ad_reply_fail(c, q, &f);
}

static enum MHD_Result net_list(struct MHD_Connection *c, struct ad_req *q)
{
    uint64_t cursor = 0, limit = NET_PAGE_DEFAULT;
    if (query_u64(c, "cursor", SIZE_MAX, &cursor) < 0)
        return ad_reply_error(c, q, 400, "invalid", "cursor: a number from next_cursor");
    if (query_u64(c, "limit", NET_PAGE_MAX, &limit) < 0 || !limit)
        return ad_reply_error(c, q, 400, "invalid", "limit: 1 to %d", NET_PAGE_MAX);
    if (!al_session_net(q->sess->s))
        return ad_reply_error(c, q, 409, "no_network", "the session was created without net");
    cJSON *o = cJSON_CreateObject();
    struct net_page p = {cJSON_AddArrayToObject(o, "requests"), 0, (unsigned)limit};
    size_t cur = (size_t)cursor;
    al_error err = {0};
    int r = al_net_requests(q->sess->s, &cur, net_one, &p, &err);
    if (r < 0) {
        cJSON_Delete(o);
        return lib_fail(c, q, r, &err);
    }
    /* the first one seen was number cur - r; the page ends after p.n of them */
    cJSON_AddNumberToObject(o, "next_cursor", (double)(cur - (size_t)r + p.n));
    cJSON_AddBoolToObject(o, "more", p.n < (unsigned)r);
    return ad_reply_json(c, q, 200, o);
}

/* ---- runs ---- */

static enum MHD_Result run_start(struct MHD_Connection *c, struct ad_req *q)
{
    struct ad_exec_req r = {0};
    char why[256] = "";
    r.argv = cJSON_GetObjectItemCaseSensitive(q->json, "argv");
    r.env = cJSON_GetObjectItemCaseSensitive(q->json, "env");
    if (cJSON_IsNull(r.argv))
        r.argv = NULL;
    if (cJSON_IsNull(r.env))
        r.env = NULL;
    if (get_str(q, "code", &r.code, why, sizeof(why)) < 0 ||
        get_str(q, "language", &r.language, why, sizeof(why)) < 0 ||
        get_bool(q, "kernel", &r.kernel, why, sizeof(why)) < 0 ||
        get_str(q, "cwd", &r.cwd, why, sizeof(why)) < 0 ||
        get_str(q, "stdin", &r.stdin_data, why, sizeof(why)) < 0 ||
        get_bool(q, "stdin_open", &r.stdin_open, why, sizeof(why)) < 0 ||
        get_uint(q, "timeout_s", &r.timeout_s, why, sizeof(why)) < 0 ||
        get_size(q->json, "pty", &r.pty_rows, &r.pty_cols, why, sizeof(why)) < 0)
        return ad_reply_error(c, q, 400, "invalid", "%s", why);
    cJSON *out;
    struct ad_fail f;
    if (ad_run_start(q->sess, &r, &q->lim, &out, &f) < 0)
        return ad_reply_fail(c, q, &f);
    return ad_reply_json(c, q, 201, out);
}

/* ---- chat ---- */

static enum MHD_Result chat_post(struct MHD_Connection *c, struct ad_req *q)
{
    struct ad_chat_req r = {.auto_run = true};
    char why[256] = "";
    if (get_str(q, "message", &r.message, why, sizeof(why)) < 0 ||
        get_str(q, "model", &r.model, why, sizeof(why)) < 0 ||
        get_bool(q, "auto_run", &r.auto_run, why, sizeof(why)) < 0 ||
        get_number(q, "temperature", 0, 2, &r.temperature, &r.has_temperature, why, sizeof(why)) <
            0 ||
        get_uint(q, "context_window", &r.context_window, why, sizeof(why)) < 0 ||
        get_uint(q, "max_tokens", &r.max_tokens, why, sizeof(why)) < 0 ||
        get_uint(q, "max_output", &r.max_output, why, sizeof(why)) < 0 ||
        get_str(q, "custom_instructions", &r.instructions, why, sizeof(why)) < 0 ||
        get_str(q, "system_message", &r.system_message, why, sizeof(why)) < 0)
        return ad_reply_error(c, q, 400, "invalid", "%s", why);
    cJSON *out;
    struct ad_fail f;
    if (ad_chat_turn(q->sess, &r, &q->lim, &out, &f) < 0)
        return ad_reply_fail(c, q, &f);
    return ad_reply_json(c, q, 201, out);
}

static enum MHD_Result chat_get(struct MHD_Connection *c, struct ad_req *q)
{
    return ad_reply_json(c, q, 200, ad_chat_json(q->sess));
}

static enum MHD_Result chat_confirm(struct MHD_Connection *c, struct ad_req *q)
{
    bool run = false;
    const char *code = NULL;
    char why[256] = "";
    if (get_bool(q, "run", &run, why, sizeof(why)) < 0 ||
        get_str(q, "code", &code, why, sizeof(why)) < 0)
        return ad_reply_error(c, q, 400, "invalid", "%s", why);
    struct ad_fail f;
    if (ad_chat_confirm(q->sess, run, code, &f) < 0)
        return ad_reply_fail(c, q, &f);
    return ad_reply(c, q, 204, MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT));
}

/* ---- metrics: the host's counters of the session's VM ---- */

static enum MHD_Result session_metrics(struct MHD_Connection *c, struct ad_req *q)
{
    const char *from = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "from");
    const char *to = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "to");
    char *e1 = NULL, *e2 = NULL;
    long long a = from ? strtoll(from, &e1, 10) : 0, b = to ? strtoll(to, &e2, 10) : 0;
    if ((from && (!*from || *e1 || a < 0)) || (to && (!*to || *e2 || b < 0)))
        return ad_reply_error(c, q, 400, "invalid", "from, to: unix seconds");
    cJSON *m;
    struct ad_fail f;
    if (ad_session_metrics(q->sess, a, b, &m, &f) < 0)
        return ad_reply_fail(c, q, &f);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "metrics", m);
    return ad_reply_json(c, q, 200, o);
}

static enum MHD_Result chat_messages_put(struct MHD_Connection *c, struct ad_req *q)
{
    struct ad_fail f;
    if (ad_chat_restore(q->sess, field(q, "messages"), &f) < 0)
        return ad_reply_fail(c, q, &f);
    return ad_reply_json(c, q, 200, ad_chat_json(q->sess));
}

static enum MHD_Result chat_undo(struct MHD_Connection *c, struct ad_req *q)
{
    cJSON *out;
    struct ad_fail f;
    if (ad_chat_undo(q->sess, &out, &f) < 0)
        return ad_reply_fail(c, q, &f);
    return ad_reply_json(c, q, 200, out);
}

/* ---- the web page's sign-in ---- */

#define COOKIE "airlock_token"

static enum MHD_Result auth_login(struct MHD_Connection *c, struct ad_req *q)
{
    const char *key = NULL;
    char why[256] = "", token[80];
    if (get_str(q, "api_key", &key, why, sizeof(why)) < 0 || !key)
        return ad_reply_error(c, q, 400, "invalid", "%s", why[0] ? why : "api_key: a string");
    int in = ad_web_login(key, "", token, sizeof(token));
    if (in == -EBUSY)
        return ad_reply_error(c, q, 503, "busy",
                              "too many browsers signed in to this daemon; try again later");
    if (in < 0)
        return ad_reply_error(c, q, 401, "unauthorized", "API key not valid");
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "signed_in", true);
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    char cookie[200];
    snprintf(cookie, sizeof(cookie), COOKIE "=%s; Path=/; HttpOnly; SameSite=Strict%s", token,
             ad_cfg.tls_cert[0] ? "; Secure" : "");
    MHD_add_response_header(r, "Content-Type", "application/json");
    MHD_add_response_header(r, "Set-Cookie", cookie);
    return ad_reply(c, q, 200, r);
}

static enum MHD_Result auth_logout(struct MHD_Connection *c, struct ad_req *q)
{
    const char *t = MHD_lookup_connection_value(c, MHD_COOKIE_KIND, COOKIE);
    if (t)
        ad_web_logout(t);
    struct MHD_Response *r = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(r, "Set-Cookie",
                            COOKIE "=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
    return ad_reply(c, q, 204, r);
}

static enum MHD_Result run_list(struct MHD_Connection *c, struct ad_req *q)
{
    cJSON *o = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(o, "runs");
    ad_run_list(q->sess, a);
    return ad_reply_json(c, q, 200, o);
}

/* The run {run} of the session, or a 404 answered. */
static struct ad_run *find_run(struct MHD_Connection *c, struct ad_req *q, enum MHD_Result *ret)
{
    struct ad_run *r = ad_run_get(q->sess, q->params[1]);
    if (!r)
        *ret = ad_reply_error(c, q, 404, "not_found", "no run '%s'", q->params[1]);
    return r;
}

static enum MHD_Result run_get(struct MHD_Connection *c, struct ad_req *q)
{
    enum MHD_Result ret;
    struct ad_run *r = find_run(c, q, &ret);
    if (!r)
        return ret;
    cJSON *o = ad_run_json(r);
    ad_run_put(r);
    return ad_reply_json(c, q, 200, o);
}

static enum MHD_Result run_events(struct MHD_Connection *c, struct ad_req *q)
{
    enum MHD_Result ret;
    struct ad_run *r = find_run(c, q, &ret);
    if (!r)
        return ret;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Last-Event-ID");
    if (!h)
        h = query(c, "last_event_id");
    unsigned long long last = 0;
    if (h) {
        char *end;
        errno = 0;
        last = strtoull(h, &end, 10);
        if (errno || *end || !*h || h[0] == '-') {
            ad_run_put(r);
            return ad_reply_error(c, q, 400, "invalid", "Last-Event-ID: an event number");
        }
    }
    const char *fw = query(c, "follow"), *since = query(c, "since");
    bool follow = !fw || !strcmp(fw, "1") || !strcmp(fw, "true");
    double since_s = 0;
    if (since) {
        char *end;
        errno = 0;
        since_s = strtod(since, &end);
        if (errno || *end || !*since || !(since_s >= 0) || since_s > 1e11) {
            ad_run_put(r);
            return ad_reply_error(c, q, 400, "invalid", "since: unix time in seconds");
        }
    }
    if (fw && !follow && strcmp(fw, "0") && strcmp(fw, "false")) {
        ad_run_put(r);
        return ad_reply_error(c, q, 400, "invalid", "follow: true or false");
    }
    struct ad_fail f;
    struct MHD_Response *resp = ad_run_events(r, last, follow, (uint64_t)(since_s * 1000), &f);
    ad_run_put(r);
    if (!resp)
        return ad_reply_fail(c, q, &f);
    /* The stream does not hold the session: delete and reaping end it (the run ends). */
    ad_session_put(q->sess);
    q->sess = NULL;
    return ad_reply(c, q, 200, resp);
}

static enum MHD_Result run_wait(struct MHD_Connection *c, struct ad_req *q)
{
    enum MHD_Result ret;
    struct ad_run *r = find_run(c, q, &ret);
    if (!r)
        return ret;
    const char *t = query(c, "timeout_s");
    unsigned long secs = t ? strtoul(t, NULL, 10) : 60;
    if (secs > 600)
        secs = 600;
    ad_session_put(q->sess);
    q->sess = NULL;
    cJSON *o = ad_run_wait(r, (unsigned)secs * 1000u);
    ad_run_put(r);
    return ad_reply_json(c, q, 200, o);
}

static enum MHD_Result run_stdin(struct MHD_Connection *c, struct ad_req *q)
{
    enum MHD_Result ret;
    struct ad_run *r = find_run(c, q, &ret);
    if (!r)
        return ret;
    const char *eof = query(c, "eof");
    ad_session_put(q->sess);
    q->sess = NULL;
    struct ad_fail f;
    int rc = ad_run_stdin(r, q->body ? q->body : "", q->body_len,
                          eof && (!strcmp(eof, "1") || !strcmp(eof, "true")), &f);
    ad_run_put(r);
    if (rc < 0)
        return ad_reply_fail(c, q, &f);
    return ad_reply(c, q, 204, MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT));
}

static enum MHD_Result run_resize(struct MHD_Connection *c, struct ad_req *q)
{
    unsigned rows = 0, cols = 0;
    char why[256] = "";
    if (get_size(q->json, NULL, &rows, &cols, why, sizeof(why)) < 0 || !rows)
        return ad_reply_error(c, q, 400, "invalid", "%s", why[0] ? why : "rows and cols");
    enum MHD_Result ret;
    struct ad_run *r = find_run(c, q, &ret);
    if (!r)
        return ret;
    struct ad_fail f;
    int rc = ad_run_resize(r, rows, cols, &f);
    ad_run_put(r);
    if (rc < 0)
        return ad_reply_fail(c, q, &f);
    return ad_reply(c, q, 204, MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT));
}

static int signal_number(const char *s)
{
    static const struct {
        const char *name;
        int no;
    } names[] = {{"INT", SIGINT}, {"QUIT", SIGQUIT}, {"TERM", SIGTERM}, {"KILL", SIGKILL},
                 {"HUP", SIGHUP}, {"USR1", SIGUSR1}, {"USR2", SIGUSR2}};
    if (!strncmp(s, "SIG", 3))
        s += 3;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (!strcmp(s, names[i].name))
            return names[i].no;
    return -1;
}

static enum MHD_Result run_signal(struct MHD_Connection *c, struct ad_req *q)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(q->json, "signal");
    int signo = -1;
    if (cJSON_IsString(v))
        signo = signal_number(v->valuestring);
    else if (cJSON_IsNumber(v) && v->valuedouble >= 1 && v->valuedouble <= 64)
        signo = (int)v->valuedouble;
    if (signo < 1 || signo > 64)
        return ad_reply_error(c, q, 400, "invalid",
                              "signal: a name (INT, TERM, KILL...) or number");
    enum MHD_Result ret;
    struct ad_run *r = find_run(c, q, &ret);
    if (!r)
        return ret;
    struct ad_fail f;
    int rc = ad_run_signal(r, signo, &f);
    ad_run_put(r);
    if (rc < 0)
        return ad_reply_fail(c, q, &f);
    return ad_reply(c, q, 202, MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT));
}

/* ---- files ---- */

static const char *guest_path(struct MHD_Connection *c, struct ad_req *q, enum MHD_Result *ret)
{
    const char *p = query(c, "path");
    if (!p || p[0] != '/' || strlen(p) >= 4096) {
        *ret = ad_reply_error(c, q, 400, "invalid", "path: an absolute path in the guest");
        return NULL;
    }
    return p;
}

static enum MHD_Result file_put(struct MHD_Connection *c, struct ad_req *q)
{
    enum MHD_Result ret;
    const char *p = guest_path(c, q, &ret);
    if (!p)
        return ret;
    char src[64];
    snprintf(src, sizeof(src), "/proc/self/fd/%d", q->spool_fd);
    al_error err = {0};
    int r = al_file_put(q->sess->s, src, p, &err);
    if (r < 0) {
        return lib_fail(c, q, r, &err);
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "path", p);
    cJSON_AddNumberToObject(o, "size", (double)q->spool_len);
    return ad_reply_json(c, q, 201, o);
}

static enum MHD_Result file_get(struct MHD_Connection *c, struct ad_req *q)
{
    enum MHD_Result ret;
    const char *p = guest_path(c, q, &ret);
    if (!p)
        return ret;
    static unsigned counter;
    char tmp[600];
    snprintf(tmp, sizeof(tmp), "%s/get-%ld-%u", ad_cfg.spool_dir, (long)getpid(),
             __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
    al_error err = {0};
    uint64_t max = 0;
    int r = ad_spool_download(q, p, &max, &err);
    if (r == -ENOSPC) {
        char why[400];
        ad_spool_full_why(why, sizeof(why));
        return ad_reply_error(c, q, 507, "spool_full", "%s", why);
    }
    if (r == 0)
        r = al_file_get_max(q->sess->s, p, tmp, max, &err);
    if (r < 0) {
        return lib_fail(c, q, r, &err);
    }
    int fd = open(tmp, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    unlink(tmp);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        if (fd >= 0)
            close(fd);
        return ad_reply_error(c, q, 500, "internal", "cannot read the spooled copy");
    }
    /* Streamed from the spool file by libmicrohttpd, never held whole in memory. */
    struct MHD_Response *resp = MHD_create_response_from_fd((uint64_t)st.st_size, fd);
    if (!resp) {
        close(fd);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "application/octet-stream");
    return ad_reply(c, q, 200, resp);
}

static const char *type_name(int t)
{
    return t == AL_ENTRY_FILE      ? "file"
           : t == AL_ENTRY_DIR     ? "dir"
           : t == AL_ENTRY_SYMLINK ? "symlink"
                                   : "other";
}

static cJSON *stat_json(const al_file_info *st)
{
    cJSON *o = cJSON_CreateObject();
    /* The guest's bytes: not always UTF-8, which JSON must be. The exact name then comes in
     * name_b64 too. */
    if (ad_json_add_text(o, "name", st->name)) {
        char *b64 = ad_base64(st->name, strlen(st->name));
        if (b64)
            cJSON_AddStringToObject(o, "name_b64", b64);
        free(b64);
    }
    cJSON_AddStringToObject(o, "type", type_name(st->type));
    cJSON_AddNumberToObject(o, "size", (double)st->size);
    cJSON_AddNumberToObject(o, "mode", st->mode);
    cJSON_AddNumberToObject(o, "mtime", (double)st->mtime);
    return o;
}

static bool flag(struct MHD_Connection *c, const char *k)
{
    const char *v = query(c, k);
    return v && (!strcmp(v, "1") || !strcmp(v, "true"));
}

static enum MHD_Result file_stat(struct MHD_Connection *c, struct ad_req *q)
{
    enum MHD_Result ret;
    const char *p = guest_path(c, q, &ret);
    if (!p)
        return ret;
    al_file_info st = AL_FILE_INFO_INIT;
    al_error err = {0};
    int r = al_file_stat(q->sess->s, p, &st, &err);
    if (r < 0) {
        return lib_fail(c, q, r, &err);
    }
    return ad_reply_json(c, q, 200, stat_json(&st));
}

static void list_entry(void *ctx, const al_file_info *st)
{
    cJSON_AddItemToArray(ctx, stat_json(st));
}

static enum MHD_Result file_list(struct MHD_Connection *c, struct ad_req *q)
{
    enum MHD_Result ret;
    const char *p = guest_path(c, q, &ret);
    if (!p)
        return ret;
    cJSON *o = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(o, "entries");
    al_error err = {0};
    int r = al_file_list(q->sess->s, p, list_entry, a, &err);
    if (r < 0) {
        cJSON_Delete(o);
        return lib_fail(c, q, r, &err);
    }
    return ad_reply_json(c, q, 200, o);
}

/* DELETE of a path (?recursive) and its mkdir (?parents): no body either way. */
static enum MHD_Result file_change(struct MHD_Connection *c, struct ad_req *q, bool mkdir)
{
    enum MHD_Result ret;
    const char *p = guest_path(c, q, &ret);
    if (!p)
        return ret;
    al_error err = {0};
    int r = mkdir ? al_file_mkdir(q->sess->s, p, flag(c, "parents"), &err)
                  : al_file_remove(q->sess->s, p, flag(c, "recursive"), &err);
    if (r < 0)
        return lib_fail(c, q, r, &err);
    return ad_reply(c, q, mkdir ? 201 : 204,
                    MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT));
}

static enum MHD_Result file_delete(struct MHD_Connection *c, struct ad_req *q)
{
    return file_change(c, q, false);
}

static enum MHD_Result file_mkdir(struct MHD_Connection *c, struct ad_req *q)
{
    return file_change(c, q, true);
}

/* ---- the screen and input (computer use, screen.c in the library) ---- */

/* GET .../screen[?max_edge=N][&x=&y=&w=&h=]: the screen now as PNG, its mode's size in
 * X-Screen-Width and X-Screen-Height. */
static enum MHD_Result screen_get(struct MHD_Connection *c, struct ad_req *q)
{
    al_screenshot_opts o = AL_SCREENSHOT_OPTS_INIT;
    static const char *const keys[] = {"max_edge", "x", "y", "w", "h"};
    unsigned *fields[] = {&o.max_edge, &o.x, &o.y, &o.w, &o.h};
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        uint64_t v = 0;
        if (query_u64(c, keys[i], 65535, &v) < 0)
            return ad_reply_error(c, q, 400, "invalid", "%s: a whole number up to 65535", keys[i]);
        *fields[i] = (unsigned)v;
    }
    al_screenshot shot = AL_SCREENSHOT_INIT;
    al_error err = {0};
    int r = al_screen_capture(q->sess->s, &o, &shot, &err);
    if (r < 0)
        return lib_fail(c, q, r, &err);
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(shot.len, shot.png, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(shot.png);
        return MHD_NO;
    }
    char num[16];
    MHD_add_response_header(resp, "Content-Type", "image/png");
    MHD_add_response_header(resp, "Cache-Control", "no-store");
    snprintf(num, sizeof(num), "%u", shot.screen_width);
    MHD_add_response_header(resp, "X-Screen-Width", num);
    snprintf(num, sizeof(num), "%u", shot.screen_height);
    MHD_add_response_header(resp, "X-Screen-Height", num);
    return ad_reply(c, q, 200, resp);
}

/* POST .../input {"actions": [...], "width": W, "height": H}: the actions in order
 * (al_screen_input's vocabulary); width and height the size of the image the coordinates refer to
 * (a scaled screenshot), else the screen's. */
static enum MHD_Result screen_input(struct MHD_Connection *c, struct ad_req *q)
{
    unsigned w = 0, h = 0;
    char why[256];
    const cJSON *acts = cJSON_GetObjectItemCaseSensitive(q->json, "actions");
    if (get_uint(q, "width", &w, why, sizeof(why)) < 0 ||
        get_uint(q, "height", &h, why, sizeof(why)) < 0)
        return ad_reply_error(c, q, 400, "invalid", "%s", why);
    if (!cJSON_IsArray(acts))
        return ad_reply_error(c, q, 400, "invalid", "actions: a list of actions");
    _cleanup_free_ char *text = cJSON_PrintUnformatted(acts);
    if (!text)
        return ad_reply_error(c, q, 500, "internal", "out of memory");
    unsigned done = 0;
    int x = -1, y = -1;
    al_error err = {0};
    int r = al_screen_input(q->sess->s, text, w, h, &done, &x, &y, &err);
    if (r < 0 && done == 0)
        return lib_fail(c, q, r, &err);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "done", done);
    cJSON *cur = cJSON_AddArrayToObject(o, "cursor");
    cJSON_AddItemToArray(cur, cJSON_CreateNumber(x));
    cJSON_AddItemToArray(cur, cJSON_CreateNumber(y));
    if (r < 0) {
        /* Some ran: the caller learns which failed, and that the ones before it did run. */
        struct ad_fail f;
        ad_fail_from(&f, r, &err);
        cJSON *e = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(e, "code", f.code);
        cJSON_AddStringToObject(e, "message", f.msg);
        return ad_reply_json(c, q, f.status, o);
    }
    return ad_reply_json(c, q, 200, o);
}

/* ---- checkpoints ---- */

static cJSON *checkpoint_json(const al_checkpoint_info *ci)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", ci->id);
    cJSON_AddStringToObject(o, "name", ci->name);
    cJSON_AddNumberToObject(o, "created", (double)ci->created);
    cJSON_AddNumberToObject(o, "state_bytes", (double)ci->state_bytes);
    cJSON_AddNumberToObject(o, "disk_bytes", (double)ci->disk_bytes);
    cJSON_AddBoolToObject(o, "current", ci->current);
    return o;
}

static enum MHD_Result checkpoint_create(struct MHD_Connection *c, struct ad_req *q)
{
    const char *name = NULL;
    char why[256];
    if (get_str(q, "name", &name, why, sizeof(why)) < 0)
        return ad_reply_error(c, q, 400, "invalid", "%s", why);
    al_checkpoint_info ci = AL_CHECKPOINT_INFO_INIT;
    al_error err = {0};
    int r = al_checkpoint_create(q->sess->s, name, &ci, &err);
    if (r < 0)
        return lib_fail(c, q, r, &err);
    return ad_reply_json(c, q, 201, checkpoint_json(&ci));
}

static void checkpoint_one(void *ctx, const al_checkpoint_info *ci)
{
    cJSON_AddItemToArray(ctx, checkpoint_json(ci));
}

static enum MHD_Result checkpoint_list(struct MHD_Connection *c, struct ad_req *q)
{
    cJSON *o = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(o, "checkpoints");
    al_error err = {0};
    int r = al_checkpoint_list(q->sess->s, checkpoint_one, a, &err);
    if (r < 0) {
        cJSON_Delete(o);
        return lib_fail(c, q, r, &err);
    }
    return ad_reply_json(c, q, 200, o);
}

static enum MHD_Result checkpoint_find(struct MHD_Connection *c, struct ad_req *q,
                                       al_checkpoint_info *ci, bool *ok)
{
    al_error err = {0};
    int r = al_checkpoint_find(q->sess->s, q->params[1], ci, &err);
    *ok = r >= 0;
    return r < 0 ? lib_fail(c, q, r, &err) : MHD_YES;
}

static enum MHD_Result checkpoint_rollback(struct MHD_Connection *c, struct ad_req *q)
{
    al_checkpoint_info ci = AL_CHECKPOINT_INFO_INIT;
    bool ok;
    enum MHD_Result ret = checkpoint_find(c, q, &ci, &ok);
    if (!ok)
        return ret;
    al_error err = {0};
    int r = al_checkpoint_rollback(q->sess->s, ci.id, &err);
    if (r < 0)
        return lib_fail(c, q, r, &err);
    return ad_reply_json(c, q, 200, checkpoint_json(&ci));
}

static enum MHD_Result checkpoint_delete(struct MHD_Connection *c, struct ad_req *q)
{
    al_checkpoint_info ci = AL_CHECKPOINT_INFO_INIT;
    bool ok;
    enum MHD_Result ret = checkpoint_find(c, q, &ci, &ok);
    if (!ok)
        return ret;
    al_error err = {0};
    int r = al_checkpoint_delete(q->sess->s, ci.id, &err);
    if (r < 0)
        return lib_fail(c, q, r, &err);
    return ad_reply(c, q, 204, MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT));
}

/* The session's disk as an image of the owner's own (al_image_commit): the body names it and
 * may name a checkpoint; an image of that name is replaced only with "replace": true. */
static enum MHD_Result session_image(struct MHD_Connection *c, struct ad_req *q)
{
    const char *name = NULL, *ck = NULL;
    bool replace = false;
    char why[256], store[64];
    if (get_str(q, "name", &name, why, sizeof(why)) < 0 ||
        get_str(q, "checkpoint", &ck, why, sizeof(why)) < 0 ||
        get_bool(q, "replace", &replace, why, sizeof(why)) < 0)
        return ad_reply_error(c, q, 400, "invalid", "%s", why);
    if (!name ||
        strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") !=
            strlen(name) ||
        !name[0] || name[0] == '.' || ad_owner_image(q->owner, name, store, sizeof(store)) < 0)
        return ad_reply_error(c, q, 400, "invalid", "name: 1 to %d of [A-Za-z0-9._-]",
                              AD_OWN_IMAGE_NAME_MAX);
    al_image_commit_opts o = AL_IMAGE_COMMIT_OPTS_INIT;
    o.name = store;
    o.force = replace;
    al_error err = {0};
    if (ck) {
        al_checkpoint_info ci = AL_CHECKPOINT_INFO_INIT;
        int r = al_checkpoint_find(q->sess->s, ck, &ci, &err);
        if (r < 0)
            return lib_fail(c, q, r, &err);
        o.checkpoint = ci.id;
    }
    int r = al_image_commit(q->sess->s, &o, &err);
    if (r == -EEXIST)
        return ad_reply_error(c, q, 409, "exists",
                              "an image of yours named '%s' exists "
                              "(\"replace\": true replaces it)",
                              name);
    if (r < 0)
        return lib_fail(c, q, r, &err);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "image", name);
    cJSON_AddStringToObject(j, "store_name", store);
    return ad_reply_json(c, q, 201, j);
}

// clang-format off
/* ---- a session's guest ports (ports.c) ---- */

static bool port_param(const char *s, unsigned *port)
{
    size_t n = strlen(s);
    if (!n || n > 5 || strspn(s, "0123456789") != n)
        return false;
    *port = (unsigned)atoi(s);
    return *port >= 1 && *port <= 65535;
}

struct query_buf {
    char *p;
    size_t len, cap;
    bool drop_token;
};

/* The query again, percent-encoded (MHD decoded it), without the open-port link's token. */
static enum MHD_Result add_arg(void *cls, enum MHD_ValueKind kind, const char *k, const char *v)
{
    (void)kind;
    struct query_buf *b = cls;
    if (b->drop_token && !strcmp(k, "airlock_port_token"))
        return MHD_YES;
    char *ek = curl_easy_escape(NULL, k, 0), *ev = v ? curl_easy_escape(NULL, v, 0) : NULL;
    if (ek) {
        int n = snprintf(b->p + b->len, b->cap - b->len, "%c%s%s%s", b->len ? '&' : '?', ek,
                         v ? "=" : "", ev ? ev : "");
        if (n > 0 && (size_t)n < b->cap - b->len)
            b->len += (size_t)n;
    }
    curl_free(ek);
    curl_free(ev);
    return MHD_YES;
}

/* The path again, percent-encoded but its '/'s (MHD decoded it). */
static void encode_path(const char *path, char *out, size_t cap)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    if (!*path)
        path = "/";
    for (const unsigned char *p = (const unsigned char *)path; *p && o + 4 < cap; p++) {
        if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
            strchr("/-._~!$&'()*+,;=:@", *p)) {
            out[o++] = (char)*p;
        } else {
            out[o++] = '%';
            out[o++] = hex[*p >> 4];
            out[o++] = hex[*p & 15];
        }
    }
    out[o] = '\0';
}

static enum MHD_Result port_proxy(struct MHD_Connection *c, struct ad_req *q)
{
    unsigned port;
    if (!port_param(q->params[1], &port))
        return ad_reply_error(c, q, 400, "invalid", "a port is 1 to 65535");
    static char empty[] = "";
    char path[8192], query[8192];
    struct query_buf qb = {query, 0, sizeof(query), q->host_routed};
    query[0] = '\0';
    MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, add_arg, &qb);
    encode_path(q->tail ? q->tail : empty, path, sizeof(path));
    if (q->port_token[0]) {
        /* Signed in by the link: the token becomes this host's cookie, and the address loses it. */
        char cookie[200], where[sizeof(path) + sizeof(query)];
        snprintf(cookie, sizeof(cookie),
                 "airlock_port=%s; Path=/; HttpOnly; SameSite=Lax%s", q->port_token,
                 ad_cfg.tls_cert[0] ? "; Secure" : "");
        snprintf(where, sizeof(where), "%s%s", path, query);
        struct MHD_Response *r = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
        MHD_add_response_header(r, "Set-Cookie", cookie);
        MHD_add_response_header(r, "Location", where);
        MHD_add_response_header(r, "Cache-Control", "no-store");
        return ad_reply(c, q, 303, r);
    }
    char where[sizeof(path) + sizeof(query)];
    snprintf(where, sizeof(where), "%s%s", path, query);
    return ad_port_proxy(c, q, port, where, q->host_routed);
}

static enum MHD_Result port_tcp(struct MHD_Connection *c, struct ad_req *q)
{
    unsigned port;
    if (!port_param(q->params[1], &port))
        return ad_reply_error(c, q, 400, "invalid", "a port is 1 to 65535");
    return ad_port_tcp(c, q, port);
}

/* The page's "open port N" link: a token for that port alone (a cookie of its own host, made
 * by its first answer), and a redirect to http(s)://PORT-ID.localhost:N/. Only for a key (a
 * cookie or Bearer); over the unix socket the host-routed address needs no sign-in. */
static enum MHD_Result port_open(struct MHD_Connection *c, struct ad_req *q)
{
    unsigned port;
    if (!port_param(q->params[1], &port))
        return ad_reply_error(c, q, 400, "invalid", "a port is 1 to 65535");
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    const char *colon = host ? strrchr(host, ':') : NULL;
    if (colon && (strchr(colon, ']') || strspn(colon + 1, "0123456789") != strlen(colon + 1)))
        colon = NULL;
    char token[80] = "", scope[300], where[512];
    snprintf(scope, sizeof(scope), "%s:%u", q->sess->id, port);
    if (!q->is_unix) {
        const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
        const char *ck = MHD_lookup_connection_value(c, MHD_COOKIE_KIND, "airlock_token");
        char key[256];
        const char *k = h && !strncasecmp(h, "Bearer ", 7) ? h + 7
                        : ck ? ad_web_key(ck, "", key, sizeof(key))
                             : NULL;
        if (!k || ad_web_login(k, scope, token, sizeof(token)) < 0)
            return ad_reply_error(c, q, 401, "unauthorized", "sign in first");
    }
    snprintf(where, sizeof(where), "%s://%u-%s.localhost%s/%s%s",
             ad_cfg.tls_cert[0] ? "https" : "http", port, q->sess->id, colon ? colon : "",
             token[0] ? "?airlock_port_token=" : "", token);
    struct MHD_Response *r = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(r, "Location", where);
    MHD_add_response_header(r, "Cache-Control", "no-store");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    return ad_reply(c, q, 303, r);
}

const struct ad_route ad_port_route = {"*", "PORT-ID.localhost", AD_ANY_METHOD | AD_BODY_RAW,
                                       port_proxy, "a session's port, host-routed"};

const struct ad_route ad_routes[] = {
    {"GET",    "/v1/health", AD_NO_SESSION | AD_NO_AUTH, health, "the daemon answers"},
    {"POST",   "/mcp", AD_NO_SESSION | AD_BODY_RAW | AD_OWN_ORIGIN, ad_mcp_route, "MCP over Streamable HTTP (docs/MCP.md)"},
    {"GET",    "/mcp", AD_NO_SESSION | AD_OWN_ORIGIN, ad_mcp_route, "MCP: no server-opened stream (405)"},
    {"DELETE", "/mcp", AD_NO_SESSION | AD_OWN_ORIGIN, ad_mcp_route, "MCP: end the protocol session"},
    {"POST",   "/v1/auth/login", AD_NO_SESSION | AD_BODY_JSON | AD_NO_AUTH, auth_login, "sign in (a cookie)"},
    {"POST",   "/v1/auth/logout", AD_NO_SESSION | AD_NO_AUTH, auth_logout, "sign out"},
    {"GET",    "/metrics", AD_NO_SESSION, metrics, "the daemon's counters (Prometheus text)"},
    {"POST",   "/v1/sessions", AD_NO_SESSION | AD_BODY_JSON, session_create, "start a session"},
    {"GET",    "/v1/sessions", AD_NO_SESSION, session_list, "the caller's sessions"},
    {"GET",    "/v1/me", AD_NO_SESSION, me_get, "how the caller is signed in, and whether a model is configured"},
    {"GET",    "/v1/hosts", AD_NO_SESSION, hosts_get, "the hosts sessions run on (local callers)"},
    {"GET",    "/v1/sessions/{id}", AD_LOST_OK | AD_PAUSED_OK, session_get, "one session"},
    {"DELETE", "/v1/sessions/{id}", AD_LOST_OK | AD_PAUSED_OK, session_delete, "end a session"},
    {"POST",   "/v1/sessions/{id}/extend", AD_BODY_JSON | AD_PAUSED_OK, session_extend, "move the end of its lifetime"},
    {"POST",   "/v1/sessions/{id}/pause", 0, session_pause, "pause it to disk (memory and QEMU freed)"},
    {"POST",   "/v1/sessions/{id}/fork", AD_BODY_JSON, session_fork, "fork it into new sessions (memory, processes, disk)"},
    {"POST",   "/v1/sessions/{id}/snapshots", AD_BODY_JSON, snapshot_create, "save its whole state as a snapshot to start sessions from"},
    {"GET",    "/v1/snapshots", AD_NO_SESSION, snapshot_list, "the caller's snapshots"},
    {"DELETE", "/v1/snapshots/{name}", AD_NO_SESSION, snapshot_delete, "remove a snapshot"},
    {"POST",   "/v1/volumes", AD_NO_SESSION | AD_BODY_JSON, volume_create, "make a volume: a disk that outlives sessions"},
    {"GET",    "/v1/volumes", AD_NO_SESSION, volume_list, "the caller's volumes"},
    {"DELETE", "/v1/volumes/{name}", AD_NO_SESSION, volume_delete, "remove a volume (not while attached)"},
    {"POST",   "/v1/sessions/{id}/resume", AD_PAUSED_OK, session_resume, "bring a paused session back"},
    {"GET",    "/v1/sessions/{id}/net", 0, net_list, "the session's network requests"},
    {"POST",   "/v1/sessions/{id}/runs", AD_BODY_JSON, run_start, "start a command or code run"},
    {"GET",    "/v1/sessions/{id}/runs", AD_PAUSED_OK, run_list, "the session's runs"},
    {"GET",    "/v1/sessions/{id}/runs/{run}", AD_PAUSED_OK, run_get, "one run"},
    {"GET",    "/v1/sessions/{id}/runs/{run}/events", AD_PAUSED_OK, run_events, "the run's events (SSE)"},
    {"GET",    "/v1/sessions/{id}/runs/{run}/wait", AD_PAUSED_OK, run_wait, "wait for the run's end"},
    {"POST",   "/v1/sessions/{id}/runs/{run}/stdin", AD_BODY_RAW, run_stdin, "write to the run's stdin"},
    {"POST",   "/v1/sessions/{id}/runs/{run}/signal", AD_BODY_JSON, run_signal, "signal the run"},
    {"POST",   "/v1/sessions/{id}/runs/{run}/resize", AD_BODY_JSON, run_resize, "a pty run's new terminal size"},
    {"POST",   "/v1/sessions/{id}/chat", AD_BODY_JSON, chat_post, "a chat turn: a user message (a run)"},
    {"GET",    "/v1/sessions/{id}/chat", 0, chat_get, "the chat's history and checkpoints"},
    {"POST",   "/v1/sessions/{id}/chat/undo", 0, chat_undo, "undo the last exchange"},
    {"GET",    "/v1/sessions/{id}/metrics", AD_PAUSED_OK, session_metrics, "what the VM used: the host's counters, sampled when asked"},
    {"PUT",    "/v1/sessions/{id}/chat/messages", AD_BODY_JSON, chat_messages_put, "replace the conversation (LMC messages)"},
    {"POST",   "/v1/sessions/{id}/chat/confirm", AD_BODY_JSON, chat_confirm, "run, edit or skip the code block that waits"},
    {"PUT",    "/v1/sessions/{id}/files", AD_BODY_SPOOL, file_put, "upload a file"},
    {"GET",    "/v1/sessions/{id}/files", 0, file_get, "download a file"},
    {"DELETE", "/v1/sessions/{id}/files", 0, file_delete, "remove a file or directory"},
    {"GET",    "/v1/sessions/{id}/files/stat", 0, file_stat, "a path's type, size, mode, mtime"},
    {"GET",    "/v1/sessions/{id}/files/list", 0, file_list, "a directory's entries"},
    {"POST",   "/v1/sessions/{id}/files/mkdir", 0, file_mkdir, "make a directory"},
    {"GET",    "/v1/sessions/{id}/open-port/{port}", 0, port_open, "a link to the port, host-routed (PORT-ID.localhost)"},
    {"GET",    "/v1/sessions/{id}/tcp/{port}", 0, port_tcp, "a byte stream to the session's port (Upgrade: airlock-tcp)"},
    {"*",      "/v1/sessions/{id}/ports/{port}", AD_ANY_METHOD | AD_BODY_RAW, port_proxy, "a reverse proxy to the session's port"},
    {"GET",    "/v1/sessions/{id}/screen", 0, screen_get, "the screen now (PNG)"},
    {"POST",   "/v1/sessions/{id}/input", AD_BODY_JSON, screen_input, "mouse and keyboard actions"},
    {"POST",   "/v1/sessions/{id}/image", AD_BODY_JSON, session_image, "save its disk as an image of yours"},
    {"POST",   "/v1/sessions/{id}/checkpoints", AD_BODY_JSON, checkpoint_create, "take a checkpoint"},
    {"GET",    "/v1/sessions/{id}/checkpoints", 0, checkpoint_list, "the session's checkpoints"},
    {"POST",   "/v1/sessions/{id}/checkpoints/{cp}/rollback", 0, checkpoint_rollback, "roll back to it"},
    {"DELETE", "/v1/sessions/{id}/checkpoints/{cp}", 0, checkpoint_delete, "delete it"},
};
// clang-format on
const size_t ad_nroutes = sizeof(ad_routes) / sizeof(ad_routes[0]);

void ad_routes_print(void)
{
    static const char *const any[] = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"};
    for (size_t i = 0; i < ad_nroutes; i++) {
        if (!(ad_routes[i].flags & AD_ANY_METHOD)) {
            printf("%s %s\n", ad_routes[i].method, ad_routes[i].pattern);
            continue;
        }
        for (size_t m = 0; m < sizeof(any) / sizeof(any[0]); m++)
            printf("%s %s/{path}\n", any[m], ad_routes[i].pattern);
    }
}

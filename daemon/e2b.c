/* E2B compatibility (docs/E2B.md): the official E2B SDKs run against airlockd unchanged, with
 * E2B_API_URL and E2B_SANDBOX_URL set to the e2b_listen address.
 *
 * One listener serves both of E2B's planes, told apart as the SDKs tell them: a request with
 * an E2b-Sandbox-Id header is for that sandbox (its port in E2b-Sandbox-Port: 49983 is envd,
 * any other port is the sandbox's own service, through the port proxy), one without is the
 * control plane. The control plane takes X-API-KEY: an airlockd key in its e2b_ form
 * ("e2b_" + the key's id and secret in hex); a sandbox is a session of that key's, with its
 * quotas and limits. The data plane takes the sandbox's own access token (X-Access-Token),
 * made at create (256 random bits), compared in constant time, never logged; the API key is
 * never taken in its place.
 *
 * envd speaks Connect RPC in JSON (connectrpc.com/docs/protocol): unary calls are a POST of
 * application/json answered with JSON; a server-streaming call's request and answer are
 * envelopes (a flags byte, a 4-byte big-endian length, JSON), its last one flagged 0x02 and
 * carrying {} or {"error": ...}. A process is a run (runs.c) of the session: its events, in
 * the run's replay buffer, are written as envelopes (ad_run_stream with fmt_process); its pid
 * is the run's number. Files go through the library's file calls. */
#include "airlockd.h"
#include "e2bwire.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

/* The envd version claimed: the SDK's own version gates then ask only for what is here
 * (watching from 0.1.4, closeStdin from 0.5.2, octet-stream and gzip uploads from 0.5.7; file
 * metadata, 0.6.2, and entries in watch events, 0.6.3, are not). */
#define ENVD_VERSION "0.5.7"
#define ENVD_PORT 49983
#define HOME_DIR "/home/user"
/* Entries ListDir reports at most, all depths together. */
#define LIST_MAX 10000

/* What a process of E2B's user runs under: setpriv (util-linux) changes uid, gid and groups
 * with no PAM session (runuser's costs 200 ms under emulation); the environment is set here. */
static const char *const as_user[] = {"setpriv", "--reuid=user", "--regid=user", "--init-groups",
                                      "--"};
#define AS_USER_N (sizeof(as_user) / sizeof(*as_user))

/* Guards a session's code interpreter contexts and its watchers. */
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- keys and ids ---- */

bool ad_e2b_key_to_native(const char *e2b, char *out, size_t len)
{
    /* e2b_ + 12 hex (the id) + 48 hex (the secret) */
    if (!e2b || strncmp(e2b, "e2b_", 4) || strlen(e2b) != 4 + 60 || len < 4 + 61 + 1)
        return false;
    for (const char *p = e2b + 4; *p; p++)
        if (!strchr("0123456789abcdef", *p))
            return false;
    snprintf(out, len, "alk_%.12s_%s", e2b + 4, e2b + 16);
    return true;
}

void ad_e2b_key_from_native(const char *alk, char *out, size_t len)
{
    /* alk_ID_SECRET */
    if (strlen(alk) == 4 + 12 + 1 + 48 && !strncmp(alk, "alk_", 4))
        snprintf(out, len, "e2b_%.12s%s", alk + 4, alk + 17);
    else
        snprintf(out, len, "?");
}

#define ID_PREFIX "airlock-"

/* A session's E2B id: its name without the prefix (lowercase hex, no hyphen). */
static const char *sandbox_id(const struct ad_session *s)
{
    size_t n = strlen(ID_PREFIX);
    return strncmp(s->id, ID_PREFIX, n) ? s->id : s->id + n;
}

static bool id_ok(const char *id)
{
    size_t n = strlen(id);
    if (!n || n > 40)
        return false;
    for (; *id; id++)
        if (!((*id >= '0' && *id <= '9') || (*id >= 'a' && *id <= 'z')))
            return false;
    return true;
}

static void native_id(const char *id, char *out, size_t len)
{
    snprintf(out, len, ID_PREFIX "%s", id);
}

/* ---- replies ---- */

/* The control plane's and envd's HTTP errors: {"code": STATUS, "message"}. */
static enum MHD_Result e2b_error(struct MHD_Connection *c, struct ad_req *q, unsigned status,
                                 const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static enum MHD_Result e2b_error(struct MHD_Connection *c, struct ad_req *q, unsigned status,
                                 const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "code", status);
    ad_json_add_text(o, "message", msg);
    return ad_reply_json(c, q, status, o);
}

static enum MHD_Result e2b_fail(struct MHD_Connection *c, struct ad_req *q, const struct ad_fail *f)
{
    return e2b_error(c, q, (unsigned)f->status, "%s", f->msg);
}

/* Connect's error codes and the HTTP status each is sent with. */
static const char *connect_code(int r, unsigned *status)
{
    switch (r) {
    case -ENOENT:
        *status = 404;
        return "not_found";
    case -EEXIST:
        *status = 409;
        return "already_exists";
    case -EINVAL:
    case -ENOTDIR:
    case -EISDIR:
    case -ENOTEMPTY:
        *status = 400;
        return "invalid_argument";
    case -EACCES:
    case -EPERM:
        *status = 403;
        return "permission_denied";
    case -ETIMEDOUT:
    case -ETIME:
        *status = 504;
        return "deadline_exceeded";
    case -E2BIG:
    case -EFBIG:
        *status = 429;
        return "resource_exhausted";
    default:
        *status = 500;
        return "internal";
    }
}

static enum MHD_Result rpc_error(struct MHD_Connection *c, struct ad_req *q, int r, const char *fmt,
                                 ...) __attribute__((format(printf, 4, 5)));
static enum MHD_Result rpc_error(struct MHD_Connection *c, struct ad_req *q, int r, const char *fmt,
                                 ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    unsigned status;
    const char *code = connect_code(r, &status);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "code", code);
    ad_json_add_text(o, "message", msg);
    return ad_reply_json(c, q, status, o);
}

/* ---- the control plane ---- */

static const char *query(struct MHD_Connection *c, const char *k)
{
    return MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, k);
}

static int64_t session_end(const struct ad_session *s)
{
    uint64_t now = ad_now_ms();
    return (int64_t)time(NULL) +
           (int64_t)((s->deadline_ms > now ? s->deadline_ms - now : 0) / 1000);
}

static void add_time(cJSON *o, const char *k, int64_t t)
{
    char buf[32];
    time_t tt = (time_t)t;
    struct tm tm;
    gmtime_r(&tt, &tm);
    strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
    cJSON_AddStringToObject(o, k, buf);
}

/* A sandbox as GET /sandboxes/{id} and the lists answer it. */
static cJSON *sandbox_json(struct ad_session *s)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "sandboxID", sandbox_id(s));
    cJSON_AddStringToObject(o, "templateID", s->e2b_template[0] ? s->e2b_template : s->image);
    cJSON_AddStringToObject(o, "clientID", "airlock");
    cJSON_AddStringToObject(o, "envdVersion", ENVD_VERSION);
    add_time(o, "startedAt", s->created);
    add_time(o, "endAt", session_end(s));
    cJSON_AddNumberToObject(o, "cpuCount", s->vcpus);
    cJSON_AddNumberToObject(o, "memoryMB", s->memory_mib);
    cJSON_AddNumberToObject(o, "diskSizeMB", 0);
    cJSON_AddStringToObject(o, "state", s->paused ? "paused" : "running");
    cJSON *md = s->labels ? cJSON_Duplicate(s->labels, true) : cJSON_CreateObject();
    cJSON_AddItemToObject(o, "metadata", md);
    cJSON *vm = cJSON_AddArrayToObject(o, "volumeMounts"), *v;
    cJSON_ArrayForEach(v, s->volumes)
    {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddItemToObject(m, "name",
                              cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(v, "name"), true));
        cJSON_AddItemToObject(m, "path",
                              cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(v, "path"), true));
        cJSON_AddItemToArray(vm, m);
    }
    return o;
}

/* create's and connect's answer: the sandbox and its tokens. */
static cJSON *sandbox_tokens_json(struct ad_session *s)
{
    cJSON *o = sandbox_json(s);
    cJSON_AddStringToObject(o, "envdAccessToken", s->e2b_token);
    cJSON_AddStringToObject(o, "trafficAccessToken", s->e2b_traffic);
    /* getHost(port) is PORT-ID.DOMAIN: names this listener routes by Host (host_route) */
    if (ad_cfg.e2b_domain[0])
        cJSON_AddStringToObject(o, "domain", ad_cfg.e2b_domain);
    else
        cJSON_AddNullToObject(o, "domain");
    return o;
}

/* The image a template name stands for: E2B's default names are e2b_image; a name of an
 * e2b_template line its image; any other name the owner's own image of that name (saved from
 * a session), else the store's. */
static const char *template_image(const char *owner, const char *t, char *buf, size_t len)
{
    static const char *const defaults[] = {"base", "code-interpreter-v1", "code-interpreter",
                                           "code-interpreter-beta", NULL};
    if (!t || !t[0])
        return ad_cfg.e2b_image;
    for (size_t i = 0; i < ad_cfg.ne2b_templates; i++)
        if (!strcmp(t, ad_cfg.e2b_templates[i].name))
            return ad_cfg.e2b_templates[i].image;
    for (const char *const *d = defaults; *d; d++)
        if (!strcmp(t, *d))
            return ad_cfg.e2b_image;
    return ad_image_for(owner, t, buf, len);
}

/* Runs argv in the session as root, its output dropped; its status, or a library error. */
static int run_quiet(al_session *s, const char *const *argv, al_error *err)
{
    int devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
    al_exec_opts o = {.struct_size = sizeof(al_exec_opts),
                      .argv = argv,
                      .stdin_fd = -1,
                      .stdout_fd = devnull,
                      .stderr_fd = devnull,
                      .timeout_ms = 60000};
    al_exec_result res = AL_EXEC_RESULT_INIT;
    int r = al_exec(s, &o, &res, err);
    if (devnull >= 0)
        close(devnull);
    if (r < 0)
        return r;
    return res.how == AL_EXEC_EXITED ? res.value : 128 + res.value;
}

/* The same for a short shell script. */
static int sh(al_session *s, const char *script, al_error *err)
{
    const char *argv[] = {"/bin/sh", "-c", script, NULL};
    return run_quiet(s, argv, err);
}

/* Whether an image version has E2B's account and setpriv (1, 0; -1: not known yet): found out
 * once per image version (its first sandbox), not in every create. A guest that removes the
 * account in its own session breaks only that session. */
#define IMAGES_KNOWN 16
static struct {
    char version[128];
    bool has_user;
} images_known[IMAGES_KNOWN];
static unsigned images_next;
static pthread_mutex_t images_lock = PTHREAD_MUTEX_INITIALIZER;

static int image_has_user(const char *version)
{
    int r = -1;
    pthread_mutex_lock(&images_lock);
    for (size_t i = 0; version[0] && i < IMAGES_KNOWN && r < 0; i++)
        if (!strcmp(images_known[i].version, version))
            r = images_known[i].has_user;
    pthread_mutex_unlock(&images_lock);
    return r;
}

static void image_has_user_set(const char *version, bool has)
{
    pthread_mutex_lock(&images_lock);
    size_t i = images_next++ % IMAGES_KNOWN;
    snprintf(images_known[i].version, sizeof(images_known[i].version), "%s", version);
    images_known[i].has_user = has;
    pthread_mutex_unlock(&images_lock);
}

/* ---- snapshots (ad_snapshot_*): E2B's snapshotID is the snapshot's name ---- */

/* A snapshotID or templateID as the SDK sends it: "NAME" or "NAME:TAG" (E2B's tags; only
 * "default" here), into buf. */
static bool snapshot_id(const char *id, char *buf, size_t len)
{
    const char *colon = id ? strchr(id, ':') : NULL;
    if (!id || (colon && strcmp(colon, ":default")))
        return false;
    snprintf(buf, len, "%.*s", colon ? (int)(colon - id) : (int)strlen(id), id);
    return buf[0] != '\0';
}

static cJSON *snapshot_e2b(const char *name)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "snapshotID", name);
    cJSON *names = cJSON_AddArrayToObject(o, "names");
    cJSON_AddItemToArray(names, cJSON_CreateString(name));
    return o;
}

struct snap_names {
    char (*v)[AL_SNAPSHOT_NAME_MAX + 1];
    size_t n, cap;
    const char *source; /* only those saved from this session (its id), or NULL */
};

static void snap_name(void *ctx, const al_snapshot_info *si)
{
    struct snap_names *l = ctx;
    if (l->source && strcmp(si->source, l->source))
        return;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        void *v = realloc(l->v, cap * sizeof(*l->v));
        if (!v)
            return;
        l->v = v;
        l->cap = cap;
    }
    snprintf(l->v[l->n++], sizeof(l->v[0]), "%s", si->name);
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(a, b);
}

static enum MHD_Result sandbox_create(struct MHD_Connection *c, struct ad_req *q)
{
    cJSON *t = cJSON_GetObjectItemCaseSensitive(q->json, "templateID");
    cJSON *timeout = cJSON_GetObjectItemCaseSensitive(q->json, "timeout");
    cJSON *md = cJSON_GetObjectItemCaseSensitive(q->json, "metadata");
    cJSON *env = cJSON_GetObjectItemCaseSensitive(q->json, "envVars");
    cJSON *pause = cJSON_GetObjectItemCaseSensitive(q->json, "autoPause");
    if (t && !cJSON_IsString(t))
        return e2b_error(c, q, 400, "templateID: a string");
    if (timeout && !cJSON_IsNull(timeout) &&
        (!cJSON_IsNumber(timeout) || timeout->valuedouble < 0 || timeout->valuedouble > 1e7))
        return e2b_error(c, q, 400, "timeout: seconds");
    if (md && !cJSON_IsNull(md) && !cJSON_IsObject(md))
        return e2b_error(c, q, 400, "metadata: an object of strings");
    if (env && !cJSON_IsNull(env) && !cJSON_IsObject(env))
        return e2b_error(c, q, 400, "envVars: an object of strings");
    cJSON *x, *envs = cJSON_IsObject(env) ? env : NULL;
    cJSON_ArrayForEach(x, envs)
    {
        if (!cJSON_IsString(x) || !x->string[0] || strchr(x->string, '='))
            return e2b_error(c, q, 400, "envVars: an object of strings");
    }
    cJSON *mounts = cJSON_GetObjectItemCaseSensitive(q->json, "volumeMounts");
    if (mounts && !cJSON_IsNull(mounts) && !cJSON_IsArray(mounts))
        return e2b_error(c, q, 400, "volumeMounts: a list of {name, path}");
    if (cJSON_IsArray(mounts) && cJSON_GetArraySize(mounts) && cJSON_IsTrue(pause))
        return e2b_error(c, q, 400, "autoPause: a sandbox with volumes cannot be paused here");
    if (cJSON_IsTrue(pause) && !ad_cfg.keep_sessions)
        return e2b_error(c, q, 400,
                         "autoPause: pausing is off on this server (airlockd's keep_sessions); "
                         "sandboxes end at their timeout");
    char own[64], snap[80], lib[160];
    const char *image =
        template_image(q->owner, cJSON_IsString(t) ? t->valuestring : NULL, own, sizeof(own));
    struct ad_create cr = {.image = image};
    /* A snapshot of the caller's (createSnapshot's id) is a template too. */
    struct snap_names sn = {0};
    if (cJSON_IsString(t) && snapshot_id(t->valuestring, snap, sizeof(snap)) &&
        ad_snapshot_name(q->owner, snap, lib, sizeof(lib)) == 0) {
        ad_snapshot_list(q->owner, snap_name, &sn);
        for (size_t i = 0; i < sn.n && !cr.snapshot; i++)
            if (!strcmp(sn.v[i], snap))
                cr.snapshot = lib;
        free(sn.v);
    }
    if (cr.snapshot)
        image = cr.image = NULL;
    else if (!image[0] || strchr(image, '/') || strlen(image) >= 64)
        return e2b_error(c, q, 404, "template '%s' not found", image);
    cr.lifetime_s = cJSON_IsNumber(timeout) ? (unsigned)timeout->valuedouble : 300;
    if (!cr.lifetime_s)
        cr.lifetime_s = 300;
    if (q->lim.max_lifetime_s && cr.lifetime_s > q->lim.max_lifetime_s)
        return e2b_error(c, q, 400, "timeout: at most %u seconds here", q->lim.max_lifetime_s);
    cr.labels = cJSON_IsObject(md) ? md : NULL;
    /* no idle timeout of its own: an E2B sandbox lives until its timeout */
    cr.idle_s =
        q->lim.max_idle_s && cr.lifetime_s > q->lim.max_idle_s ? q->lim.max_idle_s : cr.lifetime_s;
    char token[65], traffic[65];
    if (ad_random_hex(token, 32) < 0 || ad_random_hex(traffic, 32) < 0)
        return e2b_error(c, q, 500, "no random bytes for the sandbox's tokens");
    cr.e2b_token = token;
    cr.e2b_traffic = traffic;
    cr.e2b_template = cJSON_IsString(t) && t->valuestring[0] ? t->valuestring : "base";
    cr.e2b_env = cJSON_IsObject(env) ? env : NULL;
    cr.pause_at_end = cJSON_IsTrue(pause); /* E2B's autoPause: paused, not killed, at timeout */
    cr.volumes = cJSON_IsArray(mounts) && cJSON_GetArraySize(mounts) ? mounts : NULL;
    /* an image's version: its disk's identity (a rebuilt image is a new file); "" for a
     * snapshot (its user is checked each time) */
    char version[128] = "";
    if (image) {
        al_image img = AL_IMAGE_INIT;
        al_error ierr = {0};
        if (al_image_load(image, &img, &ierr) < 0)
            return e2b_error(c, q, 404, "template '%s' not found",
                             cJSON_IsString(t) ? t->valuestring : image);
        struct stat ds;
        if (img.disk[0] && stat(img.disk, &ds) == 0)
            snprintf(version, sizeof(version), "%s:%llu:%llu:%lld", image,
                     (unsigned long long)ds.st_dev, (unsigned long long)ds.st_ino,
                     (long long)ds.st_mtime);
        al_image_free(&img);
    }
    struct ad_session *s;
    struct ad_fail f;
    if (ad_session_create(q->owner, &q->lim, &cr, &s, &f) < 0)
        return e2b_fail(c, q, &f);
    /* E2B's default user: `user`, home /home/user. One exec where the image has it (the
     * debian image does); made where it lacks it; root where it cannot be made. Set before
     * the answer: nothing reaches the sandbox without its token. */
    al_error err = {0};
    int r = image_has_user(version);
    if (r < 0) {
        const char *check[] = {as_user[0], as_user[1], as_user[2], as_user[3],
                               as_user[4], "true",     NULL};
        r = run_quiet(s->s, check, &err);
        if (version[0] && r >= 0)
            image_has_user_set(version, r == 0);
    } else {
        r = r ? 0 : 1;
    }
    if (r != 0)
        r = sh(s->s,
               "id -u user >/dev/null 2>&1 || useradd -m -s /bin/bash user >/dev/null 2>&1 || "
               "adduser -D -s /bin/sh user >/dev/null 2>&1; id -u user >/dev/null 2>&1 && "
               "mkdir -p " HOME_DIR " && chown user:user " HOME_DIR " && "
               "command -v setpriv >/dev/null",
               &err);
    s->e2b_user = r == 0;
    ad_session_save(s);
    cJSON *o = sandbox_tokens_json(s);
    ad_session_put(s);
    return ad_reply_json(c, q, 201, o);
}

static enum MHD_Result sandbox_get(struct MHD_Connection *c, struct ad_req *q)
{
    struct ad_session *s = q->sess;
    return ad_reply_json(c, q, 200, sandbox_json(s));
}

static enum MHD_Result sandbox_connect(struct MHD_Connection *c, struct ad_req *q)
{
    struct ad_session *s = q->sess;
    cJSON *timeout = cJSON_GetObjectItemCaseSensitive(q->json, "timeout");
    struct ad_fail f;
    /* E2B's connect and resume bring a paused sandbox back */
    if (s->paused && ad_session_resume(s, &f) < 0)
        return e2b_fail(c, q, &f);
    /* E2B keeps the later end: a connect with a shorter timeout than the sandbox has left
     * does not shorten it */
    if (cJSON_IsNumber(timeout) && timeout->valuedouble >= 1 && timeout->valuedouble < 1e7 &&
        (int64_t)time(NULL) + (int64_t)timeout->valuedouble > session_end(s) &&
        ad_session_extend(s, (unsigned)timeout->valuedouble, &q->lim, &f) < 0)
        return e2b_fail(c, q, &f);
    return ad_reply_json(c, q, 200, sandbox_tokens_json(s));
}

static enum MHD_Result sandbox_delete(struct MHD_Connection *c, struct ad_req *q)
{
    struct ad_session *s = q->sess;
    q->sess = NULL; /* freed by the delete */
    ad_session_delete(s);
    return ad_reply(c, q, 204, MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT));
}

static enum MHD_Result sandbox_timeout(struct MHD_Connection *c, struct ad_req *q)
{
    struct ad_session *s = q->sess;
    cJSON *timeout = cJSON_GetObjectItemCaseSensitive(q->json, "timeout");
    if (!cJSON_IsNumber(timeout) || timeout->valuedouble < 1 || timeout->valuedouble > 1e7)
        return e2b_error(c, q, 400, "timeout: seconds, at least 1");
    struct ad_fail f;
    if (ad_session_extend(s, (unsigned)timeout->valuedouble, &q->lim, &f) < 0)
        return e2b_fail(c, q, &f);
    return ad_reply(c, q, 204, MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT));
}

static enum MHD_Result sandbox_pause(struct MHD_Connection *c, struct ad_req *q)
{
    struct ad_fail f;
    if (q->sess->paused) /* E2B answers 409 for a sandbox paused already */
        return e2b_error(c, q, 409, "sandbox '%s' is already paused", q->params[0]);
    if (ad_session_pause(q->sess, &f) < 0) {
        /* 409 is what the SDK reads, silently, as "already paused": a pause this daemon
         * refuses is an error the SDK raises */
        if (f.status == 409)
            f.status = 400;
        return e2b_fail(c, q, &f);
    }
    return ad_reply(c, q, 204, MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT));
}

/* A fork's entry as the SDK reads it: {"sandbox": create's answer} or {"error": {"code": the
 * HTTP status, "message"}}. */
static void fork_one(void *ctx, struct ad_session *s, const struct ad_fail *why)
{
    cJSON *one = cJSON_CreateObject();
    if (s) {
        cJSON_AddItemToObject(one, "sandbox", sandbox_tokens_json(s));
    } else {
        cJSON *e = cJSON_AddObjectToObject(one, "error");
        cJSON_AddNumberToObject(e, "code", why->status);
        cJSON_AddStringToObject(e, "message", why->msg);
    }
    cJSON_AddItemToArray(ctx, one);
}

/* Sandbox.fork: count new sandboxes from this one's state (ad_session_fork); timeout: theirs,
 * in seconds (E2B's default 15). */
static enum MHD_Result sandbox_fork(struct MHD_Connection *c, struct ad_req *q)
{
    cJSON *count = cJSON_GetObjectItemCaseSensitive(q->json, "count");
    cJSON *timeout = cJSON_GetObjectItemCaseSensitive(q->json, "timeout");
    if (count && !cJSON_IsNull(count) &&
        (!cJSON_IsNumber(count) || count->valuedouble < 1 || count->valuedouble > AD_FORK_MAX ||
         count->valuedouble != (double)(int)count->valuedouble))
        return e2b_error(c, q, 400, "count: 1 to %d", AD_FORK_MAX);
    if (timeout && !cJSON_IsNull(timeout) &&
        (!cJSON_IsNumber(timeout) || timeout->valuedouble < 0 || timeout->valuedouble > 1e7))
        return e2b_error(c, q, 400, "timeout: seconds");
    if (q->sess->paused)
        return e2b_error(c, q, 409, "sandbox '%s' is paused: resume it before forking it",
                         q->params[0]);
    struct ad_fork_req fr = {.count = cJSON_IsNumber(count) ? (unsigned)count->valuedouble : 1};
    fr.c.lifetime_s =
        cJSON_IsNumber(timeout) && timeout->valuedouble >= 1 ? (unsigned)timeout->valuedouble : 15;
    if (q->lim.max_lifetime_s && fr.c.lifetime_s > q->lim.max_lifetime_s)
        return e2b_error(c, q, 400, "timeout: at most %u seconds here", q->lim.max_lifetime_s);
    fr.c.idle_s = q->lim.max_idle_s && fr.c.lifetime_s > q->lim.max_idle_s ? q->lim.max_idle_s
                                                                           : fr.c.lifetime_s;
    cJSON *a = cJSON_CreateArray();
    struct ad_fail f;
    if (ad_session_fork(q->sess, q->owner, &q->lim, &fr, fork_one, a, &f) < 0) {
        cJSON_Delete(a);
        return e2b_fail(c, q, &f);
    }
    return ad_reply_json(c, q, 201, a);
}

/* getMetrics: the host's counters of the VM (ad_session_metrics), in E2B's names. */
static enum MHD_Result sandbox_metrics(struct MHD_Connection *c, struct ad_req *q)
{
    const char *from = query(c, "start"), *to = query(c, "end");
    char *e1 = NULL, *e2 = NULL;
    long long a = from ? strtoll(from, &e1, 10) : 0, b = to ? strtoll(to, &e2, 10) : 0;
    if ((from && (!*from || *e1 || a < 0)) || (to && (!*to || *e2 || b < 0)))
        return e2b_error(c, q, 400, "start, end: unix seconds");
    cJSON *m;
    struct ad_fail f;
    if (ad_session_metrics(q->sess, a, b, &m, &f) < 0)
        return e2b_fail(c, q, &f);
    cJSON *out = cJSON_CreateArray(), *x;
    cJSON_ArrayForEach(x, m)
    {
        double ms = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(x, "timestamp"));
        char ts[40];
        time_t t = (time_t)(ms / 1000);
        struct tm tm;
        gmtime_r(&t, &tm);
        size_t n = strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
        snprintf(ts + n, sizeof(ts) - n, ".%03dZ", (int)((long long)ms % 1000));
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "timestamp", ts);
        cJSON_AddNumberToObject(o, "timestampUnix", (double)t);
        static const char *const names[][2] = {
            {"cpu_used_pct", "cpuUsedPct"}, {"cpu_count", "cpuCount"}, {"mem_used", "memUsed"},
            {"mem_total", "memTotal"},      {"disk_used", "diskUsed"}, {"disk_total", "diskTotal"}};
        for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
            cJSON_AddNumberToObject(
                o, names[i][1],
                cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(x, names[i][0])));
        cJSON_AddNumberToObject(o, "memCache", 0);
        cJSON_AddItemToArray(out, o);
    }
    cJSON_Delete(m);
    return ad_reply_json(c, q, 200, out);
}

/* GET /v2/sandboxes: what matches the query, then one page of it, newest first unless
 * order=asc; the next page's token (x-next-token) names the last item given. */
#define LIST_LIMIT_MAX 100

struct listed {
    uint64_t created_ms;
    char id[64];
    cJSON *json;
};

struct list_ctx {
    struct listed *v;
    size_t n, cap;
    cJSON *want; /* metadata filter: every key=value given must match */
    bool paused_only;
    bool running_too;  /* paused ones listed beside the running (state=running,paused) */
    int64_t after;     /* startedAfter (unix seconds), or INT64_MIN */
    const char *templ; /* template=, or NULL */
};

static void list_one(void *ctx, struct ad_session *s)
{
    struct list_ctx *l = ctx;
    if (!s->e2b_token[0] || (l->paused_only && !s->paused) ||
        (!l->paused_only && !l->running_too && s->paused) || s->lost || s->created < l->after)
        return;
    if (l->templ && strcmp(l->templ, s->e2b_template[0] ? s->e2b_template : s->image))
        return;
    cJSON *w;
    cJSON_ArrayForEach(w, l->want)
    {
        cJSON *v = s->labels ? cJSON_GetObjectItemCaseSensitive(s->labels, w->string) : NULL;
        if (!cJSON_IsString(v) || strcmp(v->valuestring, w->valuestring))
            return;
    }
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        struct listed *v = realloc(l->v, cap * sizeof(*v));
        if (!v)
            return;
        l->v = v;
        l->cap = cap;
    }
    struct listed *e = &l->v[l->n++];
    e->created_ms = s->created_ms;
    snprintf(e->id, sizeof(e->id), "%s", sandbox_id(s));
    e->json = sandbox_json(s);
}

static int newest_first(const void *x, const void *y)
{
    const struct listed *a = x, *b = y;
    if (a->created_ms != b->created_ms)
        return a->created_ms > b->created_ms ? -1 : 1;
    return strcmp(a->id, b->id);
}

/* An ISO 8601 time in UTC ("2026-12-07T13:00:00Z", fractions ignored) as unix seconds. */
static bool iso_time(const char *s, int64_t *out)
{
    struct tm tm = {0};
    const char *rest = s ? strptime(s, "%Y-%m-%dT%H:%M:%S", &tm) : NULL;
    if (!rest)
        return false;
    if (*rest == '.')
        rest += 1 + strspn(rest + 1, "0123456789");
    if (strcmp(rest, "Z") && strcmp(rest, "") && strcmp(rest, "+00:00"))
        return false;
    *out = (int64_t)timegm(&tm);
    return true;
}

/* metadata=k1%3Dv1%26k2%3Dv2 (the SDK's form: URL-encoded pairs, decoded once by MHD). */
static cJSON *metadata_filter(const char *m)
{
    cJSON *o = cJSON_CreateObject();
    if (!m)
        return o;
    char *dup = strdup(m), *save = NULL;
    for (char *kv = dup ? strtok_r(dup, "&", &save) : NULL; kv; kv = strtok_r(NULL, "&", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq)
            continue;
        *eq = 0;
        MHD_http_unescape(kv);
        MHD_http_unescape(eq + 1);
        cJSON_AddStringToObject(o, kv, eq + 1);
    }
    free(dup);
    return o;
}

/* A list's page (arr, taken) with the next page's token, when there is one. */
static enum MHD_Result reply_page(struct MHD_Connection *c, struct ad_req *q, cJSON *arr,
                                  const char *next)
{
    char *text = cJSON_PrintUnformatted(arr);
    cJSON_Delete(arr);
    if (!text)
        return MHD_NO;
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", "application/json");
    if (next[0])
        MHD_add_response_header(r, "x-next-token", next);
    return ad_reply(c, q, 200, r);
}

static enum MHD_Result sandbox_list(struct MHD_Connection *c, struct ad_req *q)
{
    const char *state = query(c, "state"), *order = query(c, "order");
    const char *lim = query(c, "limit"), *token = query(c, "nextToken");
    const char *after = query(c, "startedAfter");
    struct list_ctx l = {.want = metadata_filter(query(c, "metadata")),
                         .paused_only = state && !strstr(state, "running"),
                         .running_too = !state || strstr(state, "paused"),
                         .after = INT64_MIN,
                         .templ = query(c, "template")};
    char *end = NULL;
    unsigned long limit = lim ? strtoul(lim, &end, 10) : LIST_LIMIT_MAX;
    if ((lim && (!*lim || *end || limit < 1 || limit > LIST_LIMIT_MAX)) ||
        (order && strcmp(order, "asc") && strcmp(order, "desc")) ||
        (after && !iso_time(after, &l.after))) {
        cJSON_Delete(l.want);
        return e2b_error(c, q, 400,
                         "limit: 1 to %d; order: asc or desc; startedAfter: an RFC 3339 time",
                         LIST_LIMIT_MAX);
    }
    ad_session_list(q->owner, list_one, &l);
    cJSON_Delete(l.want);
    qsort(l.v, l.n, sizeof(*l.v), newest_first);
    bool asc = order && !strcmp(order, "asc");
    /* the token: the last item given, "CREATED_MS.ID"; the page starts after it */
    size_t first = 0;
    if (token) {
        unsigned long long ms = strtoull(token, &end, 10);
        bool found = false;
        for (size_t k = 0; end && *end == '.' && k < l.n && !found; k++) {
            size_t i = asc ? l.n - 1 - k : k;
            if (l.v[i].created_ms == ms && !strcmp(l.v[i].id, end + 1)) {
                first = k + 1;
                found = true;
            }
        }
        if (!found) {
            for (size_t i = 0; i < l.n; i++)
                cJSON_Delete(l.v[i].json);
            free(l.v);
            return e2b_error(c, q, 400,
                             "nextToken: not a token of this list (or its sandbox ended)");
        }
    }
    cJSON *arr = cJSON_CreateArray();
    char next[128] = "";
    for (size_t k = 0; k < l.n; k++) {
        size_t i = asc ? l.n - 1 - k : k;
        if (k >= first && k < first + limit) {
            cJSON_AddItemToArray(arr, l.v[i].json);
            l.v[i].json = NULL;
            if (k + 1 == first + limit && k + 1 < l.n)
                snprintf(next, sizeof(next), "%llu.%s", (unsigned long long)l.v[i].created_ms,
                         l.v[i].id);
        }
        cJSON_Delete(l.v[i].json);
    }
    free(l.v);
    return reply_page(c, q, arr, next);
}

static enum MHD_Result snapshot_create(struct MHD_Connection *c, struct ad_req *q)
{
    cJSON *n = cJSON_GetObjectItemCaseSensitive(q->json, "name");
    if (n && !cJSON_IsNull(n) && !cJSON_IsString(n))
        return e2b_error(c, q, 400, "name: a string");
    char name[80];
    if (cJSON_IsString(n) && n->valuestring[0]) {
        if (!snapshot_id(n->valuestring, name, sizeof(name)))
            return e2b_error(c, q, 400, "name: 1 to 63 of [A-Za-z0-9._-]");
    } else {
        char hex[17];
        if (ad_random_hex(hex, 6) < 0)
            return e2b_error(c, q, 500, "no random bytes");
        snprintf(name, sizeof(name), "snap-%s", hex);
    }
    if (q->sess->paused)
        return e2b_error(c, q, 409, "sandbox '%s' is paused: resume it first", q->params[0]);
    al_snapshot_info si = AL_SNAPSHOT_INFO_INIT;
    struct ad_fail f;
    /* E2B: a name that exists gets the new state */
    if (ad_snapshot_save(q->sess, q->owner, &q->lim, name, true, &si, &f) < 0)
        return e2b_fail(c, q, &f);
    return ad_reply_json(c, q, 201, snapshot_e2b(name));
}

/* listSnapshots: by name; the next page's token is the last name given. */
static enum MHD_Result snapshot_list(struct MHD_Connection *c, struct ad_req *q)
{
    const char *lim = query(c, "limit"), *token = query(c, "nextToken");
    const char *want = query(c, "name"), *from = query(c, "sandboxID");
    char *end = NULL, only[80] = "", source[80] = "";
    unsigned long limit = lim ? strtoul(lim, &end, 10) : LIST_LIMIT_MAX;
    if (lim && (!*lim || *end || limit < 1 || limit > LIST_LIMIT_MAX))
        return e2b_error(c, q, 400, "limit: 1 to %d", LIST_LIMIT_MAX);
    if (want && !snapshot_id(want, only, sizeof(only)))
        return ad_reply_json(c, q, 200, cJSON_CreateArray());
    /* sandboxID: the snapshots saved from that sandbox (its session's id) */
    if (from)
        snprintf(source, sizeof(source), "%s%s",
                 strncmp(from, ID_PREFIX, strlen(ID_PREFIX)) ? ID_PREFIX : "", from);
    struct snap_names l = {.source = from ? source : NULL};
    ad_snapshot_list(q->owner, snap_name, &l);
    if (l.n)
        qsort(l.v, l.n, sizeof(*l.v), name_cmp);
    cJSON *arr = cJSON_CreateArray();
    char next[AL_SNAPSHOT_NAME_MAX + 1] = "";
    size_t given = 0;
    for (size_t i = 0; i < l.n; i++) {
        if ((token && strcmp(l.v[i], token) <= 0) || (only[0] && strcmp(l.v[i], only)))
            continue;
        if (given == limit) {
            snprintf(next, sizeof(next), "%s", l.v[i - 1]);
            break;
        }
        cJSON_AddItemToArray(arr, snapshot_e2b(l.v[i]));
        given++;
    }
    free(l.v);
    return reply_page(c, q, arr, next);
}

/* ---- volumes (ad_volume_*): E2B's volumeID is the volume's name; its token (for E2B's
 * volume content API, which this listener does not serve) a fresh random one each time ---- */

static cJSON *volume_e2b(const char *name, bool token)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "volumeID", name);
    cJSON_AddStringToObject(o, "name", name);
    char hex[65];
    if (token && ad_random_hex(hex, 32) == 0)
        cJSON_AddStringToObject(o, "token", hex);
    return o;
}

static enum MHD_Result volume_create(struct MHD_Connection *c, struct ad_req *q)
{
    const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(q->json, "name"));
    if (!name)
        return e2b_error(c, q, 400, "name: a string");
    al_vol_info v;
    struct ad_fail f;
    if (ad_volume_create(q->owner, &q->lim, name, 1ull << 30, &v, &f) < 0)
        return e2b_fail(c, q, &f);
    return ad_reply_json(c, q, 201, volume_e2b(name, true));
}

static void volume_one(void *ctx, const al_vol_info *v)
{
    cJSON_AddItemToArray(ctx, volume_e2b(v->name, false));
}

static enum MHD_Result volume_list(struct MHD_Connection *c, struct ad_req *q)
{
    cJSON *a = cJSON_CreateArray();
    ad_volume_list(q->owner, volume_one, a);
    return ad_reply_json(c, q, 200, a);
}

struct vol_find {
    const char *name;
    bool found;
};

static void volume_found(void *ctx, const al_vol_info *v)
{
    struct vol_find *f = ctx;
    f->found |= !strcmp(v->name, f->name);
}

static enum MHD_Result volume_get(struct MHD_Connection *c, struct ad_req *q)
{
    struct vol_find vf = {.name = q->params[0]};
    ad_volume_list(q->owner, volume_found, &vf);
    if (!vf.found)
        return e2b_error(c, q, 404, "volume '%s' not found", q->params[0]);
    return ad_reply_json(c, q, 200, volume_e2b(q->params[0], true));
}

static enum MHD_Result volume_delete(struct MHD_Connection *c, struct ad_req *q)
{
    struct ad_fail f;
    if (ad_volume_remove(q->owner, q->params[0], &f) < 0)
        return e2b_fail(c, q, &f);
    return ad_reply(c, q, 204, MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT));
}

/* deleteSnapshot (DELETE /templates/{id}): a snapshot of the caller's; anything else 404. */
static enum MHD_Result snapshot_delete(struct MHD_Connection *c, struct ad_req *q)
{
    char name[80];
    struct ad_fail f;
    if (!snapshot_id(q->params[0], name, sizeof(name)) ||
        ad_snapshot_remove(q->owner, name, &f) < 0)
        return e2b_error(c, q, 404, "template '%s' not found", q->params[0]);
    return ad_reply(c, q, 204, MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT));
}

/* ---- the data plane: which sandbox, and its token ---- */

/* ---- Connect requests (their envelopes: e2bwire.c) ---- */

/* A streaming call's request message: its one envelope's JSON object, or NULL. */
static cJSON *stream_request(struct ad_req *q)
{
    return ad_e2b_envelope_parse(q->body, q->body_len);
}

/* A unary call's request: its JSON object, or NULL. */
static cJSON *unary_request(struct ad_req *q)
{
    cJSON *o = q->body_len ? cJSON_ParseWithLength(q->body, q->body_len) : cJSON_CreateObject();
    if (o && !cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* A streaming call's answer that is only its end (an error before any message). */
static enum MHD_Result stream_error(struct MHD_Connection *c, struct ad_req *q, int r,
                                    const char *msg)
{
    unsigned status;
    cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(e, "code", connect_code(r, &status));
    ad_json_add_text(e, "message", msg);
    size_t len;
    char *b = ad_e2b_envelope_json(2, o, &len);
    if (!b)
        return MHD_NO;
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, b, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(resp, "Content-Type", "application/connect+json");
    return ad_reply(c, q, 200, resp);
}

/* ---- processes ---- */

/* A process's pid is its program's pid in the guest (what `kill PID` in the sandbox takes),
 * as envd's; the guest's word, used only to show and to find the run by. */
#define START_WAIT_MS 30000

static unsigned json_pid(cJSON *run)
{
    cJSON *p = cJSON_GetObjectItemCaseSensitive(run, "guest_pid");
    return cJSON_IsNumber(p) && p->valuedouble >= 1 && p->valuedouble < 4294967296.0
               ? (unsigned)p->valuedouble
               : 0;
}

static struct MHD_Response *process_stream(struct ad_run *r, unsigned pid, bool pty, bool start_due,
                                           uint64_t from, struct ad_fail *f)
{
    struct ad_e2b_pfmt *p = calloc(1, sizeof(*p));
    if (!p) {
        ad_failf(f, 500, "internal", "out of memory");
        return NULL;
    }
    p->pid = pid;
    p->pty = pty;
    p->start_due = start_due;
    struct MHD_Response *resp = ad_run_stream(r, from, ad_e2b_fmt_process, p, free, 0, f);
    if (resp)
        MHD_add_response_header(resp, "Content-Type", "application/connect+json");
    return resp;
}

/* The user a call runs as: Authorization: Basic base64("NAME:"), E2B's way; the default is the
 * sandbox's `user` where it has one. root and user are known. */
static bool as_root(struct MHD_Connection *c, struct ad_session *s)
{
    if (!s->e2b_user)
        return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    /* "cm9vdDo=" is base64("root:"); a file URL names its user (signed with it) */
    const char *u = query(c, "username");
    return h ? !strncasecmp(h, "Basic ", 6) && !strcmp(h + 6, "cm9vdDo=") : u && !strcmp(u, "root");
}

static const char *home_of(bool root)
{
    return root ? "/root" : HOME_DIR;
}

static enum MHD_Result process_start(struct MHD_Connection *c, struct ad_req *q)
{
    _cleanup_cjson_ cJSON *m = stream_request(q);
    if (!m)
        return stream_error(c, q, -EINVAL, "the request is not one JSON envelope");
    cJSON *pc = cJSON_GetObjectItemCaseSensitive(m, "process");
    cJSON *cmd = cJSON_GetObjectItemCaseSensitive(pc, "cmd");
    cJSON *args = cJSON_GetObjectItemCaseSensitive(pc, "args");
    cJSON *envs = cJSON_GetObjectItemCaseSensitive(pc, "envs");
    cJSON *cwd = cJSON_GetObjectItemCaseSensitive(pc, "cwd");
    cJSON *pty = cJSON_GetObjectItemCaseSensitive(m, "pty");
    cJSON *tag = cJSON_GetObjectItemCaseSensitive(m, "tag");
    cJSON *stdin_on = cJSON_GetObjectItemCaseSensitive(m, "stdin");
    if (!cJSON_IsString(cmd) || !cmd->valuestring[0] || (args && !cJSON_IsArray(args)) ||
        (envs && !cJSON_IsObject(envs)) || (cwd && !cJSON_IsString(cwd)) ||
        (tag && !cJSON_IsString(tag)))
        return stream_error(c, q, -EINVAL, "process: cmd, args, envs, cwd");
    struct ad_session *s = q->sess;
    bool root = as_root(c, s);
    _cleanup_cjson_ cJSON *argv = cJSON_CreateArray();
    for (size_t i = 0; !root && i < AS_USER_N; i++) /* as E2B's user */
        cJSON_AddItemToArray(argv, cJSON_CreateString(as_user[i]));
    cJSON_AddItemToArray(argv, cJSON_CreateString(cmd->valuestring));
    cJSON *a;
    cJSON_ArrayForEach(a, args)
    {
        if (!cJSON_IsString(a))
            return stream_error(c, q, -EINVAL, "process.args: strings");
        cJSON_AddItemToArray(argv, cJSON_CreateString(a->valuestring));
    }
    /* the sandbox's envVars, then the call's own; HOME and USER as E2B sets them */
    _cleanup_cjson_ cJSON *env =
        s->e2b_env ? cJSON_Duplicate(s->e2b_env, true) : cJSON_CreateObject();
    cJSON_ArrayForEach(a, envs)
    {
        if (!cJSON_IsString(a))
            return stream_error(c, q, -EINVAL, "process.envs: strings");
        cJSON_DeleteItemFromObjectCaseSensitive(env, a->string);
        cJSON_AddStringToObject(env, a->string, a->valuestring);
    }
    if (!cJSON_GetObjectItemCaseSensitive(env, "HOME"))
        cJSON_AddStringToObject(env, "HOME", home_of(root));
    if (!cJSON_GetObjectItemCaseSensitive(env, "USER"))
        cJSON_AddStringToObject(env, "USER", root ? "root" : "user");
    if (!cJSON_GetObjectItemCaseSensitive(env, "LOGNAME"))
        cJSON_AddStringToObject(env, "LOGNAME", root ? "root" : "user");
    struct ad_exec_req er = {.argv = argv, .env = env};
    er.cwd = cJSON_IsString(cwd) && cwd->valuestring[0] ? cwd->valuestring : home_of(root);
    er.stdin_open = cJSON_IsTrue(stdin_on) || pty;
    er.stdin_data = er.stdin_open ? NULL : "";
    er.tag = cJSON_IsString(tag) ? tag->valuestring : NULL;
    cJSON *size = cJSON_GetObjectItemCaseSensitive(pty, "size");
    if (pty) {
        cJSON *rows = cJSON_GetObjectItemCaseSensitive(size, "rows");
        cJSON *cols = cJSON_GetObjectItemCaseSensitive(size, "cols");
        er.pty_rows = cJSON_IsNumber(rows) && rows->valueint > 0 ? (unsigned)rows->valueint : 24;
        er.pty_cols = cJSON_IsNumber(cols) && cols->valueint > 0 ? (unsigned)cols->valueint : 80;
    }
    /* Connect's deadline is the process's: killed at it */
    const char *dl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Connect-Timeout-Ms");
    if (dl) {
        unsigned long ms = strtoul(dl, NULL, 10);
        er.timeout_s = ms ? (unsigned)((ms + 999) / 1000) : 0;
    }
    cJSON *out;
    struct ad_fail f;
    if (ad_run_start(s, &er, &q->lim, &out, &f) < 0)
        return stream_error(c, q, f.status == 429 ? -E2BIG : -EIO, f.msg);
    cJSON *rid = cJSON_GetObjectItemCaseSensitive(out, "id");
    struct ad_run *r = cJSON_IsString(rid) ? ad_run_get(s, rid->valuestring) : NULL;
    cJSON_Delete(out);
    if (!r)
        return stream_error(c, q, -EIO, "the process ended at once");
    /* the start event carries the guest's pid: once the program runs (0 if it never did) */
    unsigned pid = ad_run_guest_pid(r, START_WAIT_MS);
    struct MHD_Response *resp = process_stream(r, pid, pty != NULL, false, 0, &f);
    ad_run_put(r);
    if (!resp)
        return stream_error(c, q, -EIO, f.msg);
    return ad_reply(c, q, 200, resp);
}

/* The run a ProcessSelector names ({"pid": N} or {"tag": T}), referenced, or NULL. */
static struct ad_run *selected(struct ad_session *s, cJSON *m)
{
    cJSON *sel = cJSON_GetObjectItemCaseSensitive(m, "process");
    cJSON *pid = cJSON_GetObjectItemCaseSensitive(sel, "pid");
    cJSON *tag = cJSON_GetObjectItemCaseSensitive(sel, "tag");
    char rid[24] = "";
    if (cJSON_IsNumber(pid) && pid->valuedouble >= 1 && pid->valuedouble < 4294967296.0)
        ad_run_find(s, NULL, (uint32_t)pid->valuedouble, rid, sizeof(rid));
    else if (cJSON_IsString(tag))
        ad_run_find(s, tag->valuestring, 0, rid, sizeof(rid));
    return rid[0] ? ad_run_get(s, rid) : NULL;
}

static bool run_running(struct ad_run *r, bool *pty)
{
    cJSON *j = ad_run_json(r);
    cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "state");
    bool running = cJSON_IsString(st) && strcmp(st->valuestring, "done");
    if (pty)
        *pty = cJSON_GetObjectItemCaseSensitive(j, "pty") != NULL;
    cJSON_Delete(j);
    return running;
}

static enum MHD_Result process_connect(struct MHD_Connection *c, struct ad_req *q)
{
    _cleanup_cjson_ cJSON *m = stream_request(q);
    if (!m)
        return stream_error(c, q, -EINVAL, "the request is not one JSON envelope");
    struct ad_run *r = selected(q->sess, m);
    bool pty = false;
    if (!r || !run_running(r, &pty)) {
        if (r)
            ad_run_put(r);
        return stream_error(c, q, -ENOENT, "no such process running");
    }
    cJSON *j = ad_run_json(r);
    cJSON *events = cJSON_GetObjectItemCaseSensitive(j, "events");
    unsigned pid = json_pid(j);
    uint64_t from = cJSON_IsNumber(events) ? (uint64_t)events->valuedouble : 0;
    cJSON_Delete(j);
    struct ad_fail f;
    struct MHD_Response *resp = process_stream(r, pid, pty, true, from, &f);
    ad_run_put(r);
    if (!resp)
        return stream_error(c, q, -EIO, f.msg);
    return ad_reply(c, q, 200, resp);
}

static enum MHD_Result reply_empty(struct MHD_Connection *c, struct ad_req *q)
{
    return ad_reply_json(c, q, 200, cJSON_CreateObject());
}

static enum MHD_Result process_list(struct MHD_Connection *c, struct ad_req *q)
{
    _cleanup_cjson_ cJSON *runs = cJSON_CreateArray();
    ad_run_list(q->sess, runs);
    cJSON *o = cJSON_CreateObject(), *ps = cJSON_AddArrayToObject(o, "processes");
    cJSON *r;
    cJSON_ArrayForEach(r, runs)
    {
        cJSON *st = cJSON_GetObjectItemCaseSensitive(r, "state");
        cJSON *argv = cJSON_GetObjectItemCaseSensitive(r, "argv");
        if (!cJSON_IsString(st) || !strcmp(st->valuestring, "done") || !cJSON_IsArray(argv) ||
            cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "hidden")))
            continue;
        cJSON *p = cJSON_CreateObject(), *cfg = cJSON_AddObjectToObject(p, "config");
        /* the command as it was asked: without what runs it as `user` */
        int skip = 0, n = cJSON_GetArraySize(argv);
        cJSON *a0 = cJSON_GetArrayItem(argv, 0);
        if (n > (int)AS_USER_N && cJSON_IsString(a0) && !strcmp(a0->valuestring, as_user[0]))
            skip = (int)AS_USER_N;
        cJSON *cmd = cJSON_GetArrayItem(argv, skip);
        cJSON_AddStringToObject(cfg, "cmd", cJSON_IsString(cmd) ? cmd->valuestring : "");
        cJSON *args = cJSON_AddArrayToObject(cfg, "args");
        for (int i = skip + 1; i < n; i++)
            cJSON_AddItemToArray(args, cJSON_Duplicate(cJSON_GetArrayItem(argv, i), false));
        cJSON_AddObjectToObject(cfg, "envs");
        cJSON *cwd = cJSON_GetObjectItemCaseSensitive(r, "cwd");
        if (cJSON_IsString(cwd))
            cJSON_AddStringToObject(cfg, "cwd", cwd->valuestring);
        cJSON_AddNumberToObject(p, "pid", json_pid(r));
        cJSON *tag = cJSON_GetObjectItemCaseSensitive(r, "tag");
        if (cJSON_IsString(tag))
            cJSON_AddStringToObject(p, "tag", tag->valuestring);
        cJSON_AddItemToArray(ps, p);
    }
    return ad_reply_json(c, q, 200, o);
}

/* SendInput, CloseStdin, SendSignal, Update: a selected process and one action. */
enum pact { ACT_INPUT, ACT_CLOSE, ACT_SIGNAL, ACT_UPDATE };

static enum MHD_Result process_act(struct MHD_Connection *c, struct ad_req *q, enum pact act)
{
    _cleanup_cjson_ cJSON *m = unary_request(q);
    if (!m)
        return rpc_error(c, q, -EINVAL, "the body is not a JSON object");
    struct ad_run *r = selected(q->sess, m);
    if (!r || !run_running(r, NULL)) {
        if (r)
            ad_run_put(r);
        return rpc_error(c, q, -ENOENT, "no such process running");
    }
    struct ad_fail f = {0};
    int rc = 0;
    if (act == ACT_INPUT) {
        cJSON *in = cJSON_GetObjectItemCaseSensitive(m, "input");
        cJSON *b = cJSON_GetObjectItemCaseSensitive(in, "stdin");
        if (!b)
            b = cJSON_GetObjectItemCaseSensitive(in, "pty");
        size_t n = 0;
        uint8_t *data = cJSON_IsString(b) ? ad_base64_decode(b->valuestring, &n) : NULL;
        if (!data) {
            ad_run_put(r);
            return rpc_error(c, q, -EINVAL, "input: stdin or pty, base64");
        }
        rc = ad_run_stdin(r, data, n, false, &f);
        free(data);
    } else if (act == ACT_CLOSE) {
        rc = ad_run_stdin(r, "", 0, true, &f);
    } else if (act == ACT_SIGNAL) {
        cJSON *sg = cJSON_GetObjectItemCaseSensitive(m, "signal");
        int signo = cJSON_IsString(sg) && !strcmp(sg->valuestring, "SIGNAL_SIGTERM") ? 15
                    : cJSON_IsNumber(sg) && sg->valueint == 15                       ? 15
                                                                                     : 9;
        rc = ad_run_signal(r, signo, &f);
    } else {
        cJSON *size =
            cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(m, "pty"), "size");
        cJSON *rows = cJSON_GetObjectItemCaseSensitive(size, "rows");
        cJSON *cols = cJSON_GetObjectItemCaseSensitive(size, "cols");
        if (!cJSON_IsNumber(rows) || !cJSON_IsNumber(cols) || rows->valueint < 1 ||
            cols->valueint < 1) {
            ad_run_put(r);
            return rpc_error(c, q, -EINVAL, "pty.size: rows and cols");
        }
        rc = ad_run_resize(r, (unsigned)rows->valueint, (unsigned)cols->valueint, &f);
    }
    ad_run_put(r);
    if (rc < 0)
        return rpc_error(c, q,
                         f.status == 404   ? -ENOENT
                         : f.status == 400 ? -EINVAL
                                           : -EIO,
                         "%s", f.msg);
    return reply_empty(c, q);
}

/* ---- the filesystem ---- */

/* A path as envd takes it: absolute, or relative to the user's home. NULL when unusable. */
static char *guest_path(struct MHD_Connection *c, struct ad_session *s, const char *p)
{
    if (!p || !p[0] || strlen(p) >= 4000 || strchr(p, '\n'))
        return NULL;
    char *out = NULL;
    if (p[0] == '/')
        out = strdup(p);
    else if (asprintf(&out, "%s/%s", home_of(as_root(c, s)), p) < 0)
        out = NULL;
    return out;
}

static const char *file_type(int t)
{
    return t == AL_ENTRY_FILE      ? "FILE_TYPE_FILE"
           : t == AL_ENTRY_DIR     ? "FILE_TYPE_DIRECTORY"
           : t == AL_ENTRY_SYMLINK ? "FILE_TYPE_SYMLINK"
                                   : "FILE_TYPE_UNSPECIFIED";
}

static cJSON *entry_json(const al_file_info *st, const char *path)
{
    cJSON *o = cJSON_CreateObject();
    ad_json_add_text(o, "name", st->name);
    cJSON_AddStringToObject(o, "type", file_type(st->type));
    ad_json_add_text(o, "path", path);
    char size[32];
    snprintf(size, sizeof(size), "%llu", (unsigned long long)st->size);
    cJSON_AddStringToObject(o, "size", size); /* int64: a string in protobuf's JSON */
    cJSON_AddNumberToObject(o, "mode", st->mode);
    char perm[11] = "----------";
    perm[0] = st->type == AL_ENTRY_DIR ? 'd' : st->type == AL_ENTRY_SYMLINK ? 'l' : '-';
    for (int i = 0; i < 9; i++)
        if (st->mode & (0400u >> i))
            perm[1 + i] = "rwxrwxrwx"[i];
    cJSON_AddStringToObject(o, "permissions", perm);
    cJSON_AddStringToObject(o, "owner", st->owner);
    cJSON_AddStringToObject(o, "group", st->group);
    add_time(o, "modifiedTime", st->mtime);
    if (st->type == AL_ENTRY_SYMLINK && st->link_target[0])
        ad_json_add_text(o, "symlinkTarget", st->link_target);
    return o;
}

/* A unary filesystem call's JSON and its path ("path", or another key), or the reply. */
static cJSON *fs_request(struct MHD_Connection *c, struct ad_req *q, const char *key, char **path,
                         enum MHD_Result *ret)
{
    cJSON *m = unary_request(q);
    cJSON *p = cJSON_GetObjectItemCaseSensitive(m, key);
    *path = cJSON_IsString(p) ? guest_path(c, q->sess, p->valuestring) : NULL;
    if (!*path) {
        cJSON_Delete(m);
        *ret = rpc_error(c, q, -EINVAL, "%s: a path", key);
        return NULL;
    }
    return m;
}

static enum MHD_Result entry_reply(struct MHD_Connection *c, struct ad_req *q, const char *path)
{
    al_file_info st = AL_FILE_INFO_INIT;
    al_error err = {0};
    int r = al_file_stat(q->sess->s, path, &st, &err);
    if (r < 0)
        return rpc_error(c, q, r, "%s", err.msg);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "entry", entry_json(&st, path));
    return ad_reply_json(c, q, 200, o);
}

static enum MHD_Result fs_stat(struct MHD_Connection *c, struct ad_req *q)
{
    enum MHD_Result ret;
    _cleanup_free_ char *path = NULL;
    _cleanup_cjson_ cJSON *m = fs_request(c, q, "path", &path, &ret);
    if (!m)
        return ret;
    return entry_reply(c, q, path);
}

/* The user's ownership for what a call made as `user` (the library writes as root). */
static void give_to_user(struct MHD_Connection *c, struct ad_session *s, const char *path,
                         bool recursive)
{
    if (as_root(c, s))
        return;
    const char *argv[6], **a = argv;
    *a++ = "chown";
    if (recursive)
        *a++ = "-R";
    *a++ = "user:user";
    *a++ = "--";
    *a++ = path;
    *a = NULL;
    al_error err = {0};
    run_quiet(s->s, argv, &err);
}

/* dir (missing) and its missing parents made, as E2B's calls make them: for the user, every
 * directory made is theirs (the topmost made and what is beneath it: only what was just
 * made). 0, or -errno with err. */
static int make_dirs(struct MHD_Connection *c, struct ad_session *s, const char *dir, al_error *err)
{
    _cleanup_free_ char *top = strdup(dir), *up = strdup(dir);
    if (!top || !up) {
        err->code = -ENOMEM;
        snprintf(err->msg, sizeof(err->msg), "out of memory");
        return -ENOMEM;
    }
    al_file_info st = AL_FILE_INFO_INIT;
    for (char *slash; (slash = strrchr(up, '/')) && slash != up;) {
        *slash = 0;
        al_error e2 = {0};
        if (al_file_stat(s->s, up, &st, &e2) != -ENOENT)
            break;
        strcpy(top, up);
    }
    int r = al_file_mkdir(s->s, dir, true, err);
    if (r == 0)
        give_to_user(c, s, top, true);
    return r;
}

struct lister {
    cJSON *arr;
    const char *dir;
    char **subdirs; /* for the next depth */
    size_t nsub, capsub;
    size_t total;
};

static void list_one_entry(void *ctx, const al_file_info *st)
{
    struct lister *l = ctx;
    if (l->total >= LIST_MAX)
        return;
    l->total++;
    char *p = NULL;
    if (asprintf(&p, "%s%s%s", l->dir, strcmp(l->dir, "/") ? "/" : "", st->name) < 0)
        return;
    cJSON_AddItemToArray(l->arr, entry_json(st, p));
    if (st->type == AL_ENTRY_DIR) {
        if (l->nsub == l->capsub) {
            size_t cap = l->capsub ? 2 * l->capsub : 16;
            char **v = realloc(l->subdirs, cap * sizeof(*v));
            if (!v) {
                free(p);
                return;
            }
            l->subdirs = v;
            l->capsub = cap;
        }
        l->subdirs[l->nsub++] = p;
        return;
    }
    free(p);
}

/* Paths in the order of a walk that goes depth first, each directory's names sorted (envd's
 * filepath.WalkDir): component by component, so "a/x" comes before "a-b". */
static int path_order(const void *x, const void *y)
{
    const char *a =
        cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(*(const cJSON *const *)x, "path"));
    const char *b =
        cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(*(const cJSON *const *)y, "path"));
    a = a ? a : "";
    b = b ? b : "";
    for (; *a && *a == *b; a++, b++)
        ;
    if (*a == *b)
        return 0;
    if (!*a || !*b) /* a directory before what is in it */
        return !*a ? -1 : 1;
    if (*a == '/' || *b == '/') /* the end of a name sorts before any other byte */
        return *a == '/' ? -1 : 1;
    return (unsigned char)*a < (unsigned char)*b ? -1 : 1;
}

static void sort_by_path(cJSON *arr)
{
    size_t n = (size_t)cJSON_GetArraySize(arr);
    if (n < 2)
        return;
    cJSON **v = malloc(n * sizeof(*v));
    if (!v)
        return;
    for (size_t i = 0; i < n; i++)
        v[i] = cJSON_DetachItemFromArray(arr, 0);
    qsort(v, n, sizeof(*v), path_order);
    for (size_t i = 0; i < n; i++)
        cJSON_AddItemToArray(arr, v[i]);
    free(v);
}

static enum MHD_Result fs_list(struct MHD_Connection *c, struct ad_req *q)
{
    enum MHD_Result ret;
    _cleanup_free_ char *path = NULL;
    _cleanup_cjson_ cJSON *m = fs_request(c, q, "path", &path, &ret);
    if (!m)
        return ret;
    cJSON *d = cJSON_GetObjectItemCaseSensitive(m, "depth");
    unsigned depth = cJSON_IsNumber(d) && d->valueint > 0 ? (unsigned)d->valueint : 1;
    if (depth > 32)
        depth = 32;
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, "entries");
    char **level = malloc(sizeof(char *));
    size_t nlevel = 0;
    if (!level || !(level[0] = strdup(path))) {
        free(level);
        cJSON_Delete(o);
        return rpc_error(c, q, -ENOMEM, "out of memory");
    }
    nlevel = 1;
    int rc = 0;
    al_error err = {0};
    size_t total = 0;
    for (unsigned lv = 0; lv < depth && nlevel && rc >= 0; lv++) {
        char **next = NULL;
        size_t nnext = 0, capnext = 0;
        for (size_t i = 0; i < nlevel; i++) {
            struct lister l = {.arr = arr, .dir = level[i], .total = total};
            int r = al_file_list(q->sess->s, level[i], list_one_entry, &l, &err);
            total = l.total;
            if (r < 0 && lv == 0)
                rc = r;
            for (size_t k = 0; k < l.nsub; k++) {
                if (lv + 1 < depth && nnext == capnext) {
                    capnext = capnext ? 2 * capnext : 16;
                    char **v = realloc(next, capnext * sizeof(*v));
                    if (v)
                        next = v;
                }
                if (lv + 1 < depth && nnext < capnext)
                    next[nnext++] = l.subdirs[k];
                else
                    free(l.subdirs[k]);
            }
            free(l.subdirs);
            free(level[i]);
        }
        free(level);
        level = next;
        nlevel = nnext;
    }
    for (size_t i = 0; i < nlevel; i++)
        free(level[i]);
    free(level);
    if (rc < 0) {
        cJSON_Delete(o);
        return rpc_error(c, q, rc, "%s", err.msg);
    }
    sort_by_path(arr);
    return ad_reply_json(c, q, 200, o);
}

static enum MHD_Result fs_mkdir(struct MHD_Connection *c, struct ad_req *q)
{
    enum MHD_Result ret;
    _cleanup_free_ char *path = NULL;
    _cleanup_cjson_ cJSON *m = fs_request(c, q, "path", &path, &ret);
    if (!m)
        return ret;
    al_file_info st = AL_FILE_INFO_INIT;
    al_error err = {0};
    if (al_file_stat(q->sess->s, path, &st, &err) == 0)
        return rpc_error(c, q, -EEXIST, "%s already exists", path);
    err = (al_error){0};
    int r = make_dirs(c, q->sess, path, &err);
    if (r < 0)
        return rpc_error(c, q, r, "%s", err.msg);
    return entry_reply(c, q, path);
}

static enum MHD_Result fs_remove(struct MHD_Connection *c, struct ad_req *q)
{
    enum MHD_Result ret;
    _cleanup_free_ char *path = NULL;
    _cleanup_cjson_ cJSON *m = fs_request(c, q, "path", &path, &ret);
    if (!m)
        return ret;
    al_error err = {0};
    int r = al_file_remove(q->sess->s, path, true, &err);
    if (r < 0 && r != -ENOENT) /* envd: removing what is not there is no error */
        return rpc_error(c, q, r, "%s", err.msg);
    return reply_empty(c, q);
}

static enum MHD_Result fs_move(struct MHD_Connection *c, struct ad_req *q)
{
    enum MHD_Result ret;
    _cleanup_free_ char *src = NULL;
    _cleanup_cjson_ cJSON *m = fs_request(c, q, "source", &src, &ret);
    if (!m)
        return ret;
    cJSON *d = cJSON_GetObjectItemCaseSensitive(m, "destination");
    _cleanup_free_ char *dst = cJSON_IsString(d) ? guest_path(c, q->sess, d->valuestring) : NULL;
    if (!dst)
        return rpc_error(c, q, -EINVAL, "destination: a path");
    al_file_info st = AL_FILE_INFO_INIT;
    al_error err = {0};
    int r = al_file_stat(q->sess->s, src, &st, &err);
    if (r < 0)
        return rpc_error(c, q, r, "%s", err.msg);
    /* mv by argv, no shell: the paths are the caller's */
    const char *argv[] = {"mv", "-T", "--", src, dst, NULL};
    r = run_quiet(q->sess->s, argv, &err);
    if (r < 0)
        return rpc_error(c, q, r, "%s", err.msg);
    if (r)
        return rpc_error(c, q, -EINVAL, "cannot move %s to %s", src, dst);
    return entry_reply(c, q, dst);
}

/* ---- watching a directory: WatchDir (a stream), CreateWatcher and its polls ----
 *
 * A watcher is a run of the guest agent's own --watch (guest-agent/watch.c), started as
 * /proc/self/exe: between fork and exec the run's process is the agent, so the path names the
 * agent's binary in any image. It runs as root (its output is all the caller sees); its lines
 * are read with bounds (e2bwire.c). The run is hidden from envd's List. */

#define WATCHERS_MAX 8
#define WATCH_PENDING_MAX 4096
#define WATCH_START_MS 30000
/* A WatchDir stream's keepalives: a caller that stopped watching is seen (and the guest's
 * watcher ended) at the next write, so they come often; each is 18 bytes. */
#define WATCH_BEAT_MS 2000

struct ad_e2b_watcher {
    struct ad_e2b_watcher *next;
    char id[33];
    char rid[24];
    uint64_t seq;   /* the run's last event read */
    cJSON *pending; /* events read, not yet asked for */
    struct ad_e2b_watch w;
};

static struct ad_run *watch_start(struct MHD_Connection *c, struct ad_req *q, cJSON *m,
                                  unsigned timeout_s, struct ad_fail *f)
{
    cJSON *p = cJSON_GetObjectItemCaseSensitive(m, "path");
    cJSON *rec = cJSON_GetObjectItemCaseSensitive(m, "recursive");
    _cleanup_free_ char *path = cJSON_IsString(p) ? guest_path(c, q->sess, p->valuestring) : NULL;
    if (!path) {
        ad_failf(f, 400, "invalid_argument", "path: a path");
        return NULL;
    }
    _cleanup_cjson_ cJSON *argv = cJSON_CreateArray();
    cJSON_AddItemToArray(argv, cJSON_CreateString("/proc/self/exe"));
    cJSON_AddItemToArray(argv, cJSON_CreateString("--watch"));
    cJSON_AddItemToArray(argv, cJSON_CreateString(path));
    if (cJSON_IsTrue(rec))
        cJSON_AddItemToArray(argv, cJSON_CreateString("--recursive"));
    struct ad_exec_req er = {.argv = argv, .cwd = "/", .stdin_data = "", .hidden = true};
    er.timeout_s = timeout_s;
    cJSON *out;
    if (ad_run_start(q->sess, &er, &q->lim, &out, f) < 0)
        return NULL;
    cJSON *rid = cJSON_GetObjectItemCaseSensitive(out, "id");
    struct ad_run *r = cJSON_IsString(rid) ? ad_run_get(q->sess, rid->valuestring) : NULL;
    cJSON_Delete(out);
    if (!r)
        ad_failf(f, 500, "internal", "the watcher ended at once");
    return r;
}

static void watch_stop(struct ad_run *r)
{
    struct ad_fail f;
    if (run_running(r, NULL))
        ad_run_signal(r, 9, &f);
}

/* A Connect code of e2bwire.c's as the errno connect_code takes. */
static int watch_errno(const struct ad_e2b_watch *w)
{
    return !strcmp(w->code, "not_found")           ? -ENOENT
           : !strcmp(w->code, "invalid_argument")  ? -ENOTDIR
           : !strcmp(w->code, "permission_denied") ? -EACCES
                                                   : -EIO;
}

static void watch_stream_done(void *ctx)
{
    struct ad_e2b_wfmt *x = ctx;
    watch_stop(x->run); /* the caller hung up or the stream ended: the watching ends */
    ad_run_put(x->run);
    free(x);
}

static enum MHD_Result fs_watch_dir(struct MHD_Connection *c, struct ad_req *q)
{
    _cleanup_cjson_ cJSON *m = stream_request(q);
    if (!m)
        return stream_error(c, q, -EINVAL, "the request is not one JSON envelope");
    /* Connect's deadline ends the watching (the SDK's default is 60 s) */
    unsigned timeout_s = 0;
    const char *dl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Connect-Timeout-Ms");
    if (dl) {
        unsigned long ms = strtoul(dl, NULL, 10);
        timeout_s = ms ? (unsigned)((ms + 999) / 1000) : 0;
    }
    struct ad_fail f;
    struct ad_run *r = watch_start(c, q, m, timeout_s, &f);
    if (!r)
        return stream_error(c, q,
                            f.status == 400   ? -EINVAL
                            : f.status == 429 ? -E2BIG
                                              : -EIO,
                            f.msg);
    struct ad_e2b_wfmt *x = calloc(1, sizeof(*x));
    if (!x) {
        watch_stop(r);
        ad_run_put(r);
        return stream_error(c, q, -ENOMEM, "out of memory");
    }
    x->run = r; /* given back by watch_stream_done */
    struct MHD_Response *resp =
        ad_run_stream(r, 0, ad_e2b_fmt_watch, x, watch_stream_done, WATCH_BEAT_MS, &f);
    if (!resp)
        return stream_error(c, q, -EIO, f.msg);
    MHD_add_response_header(resp, "Content-Type", "application/connect+json");
    return ad_reply(c, q, 200, resp);
}

static void watcher_take(void *ctx, const char *type, const char *json, size_t json_len)
{
    struct ad_e2b_watcher *w = ctx;
    ad_e2b_watch_event(&w->w, type, json, json_len, w->pending);
}

/* Reads what w's run has (bounded by WATCH_PENDING_MAX); *done: the run ended. */
static void watcher_read(struct ad_e2b_watcher *w, struct ad_run *r, bool *done)
{
    *done = false;
    if (cJSON_GetArraySize(w->pending) < WATCH_PENDING_MAX)
        w->seq = ad_run_read(r, w->seq, watcher_take, w, done);
}

static void watcher_free(struct ad_e2b_watcher *w)
{
    cJSON_Delete(w->pending);
    free(w);
}

void ad_e2b_session_free(struct ad_session *s)
{
    for (struct ad_e2b_watcher *w = s->e2b_watchers, *n; w; w = n) {
        n = w->next;
        watcher_free(w);
    }
    s->e2b_watchers = NULL;
}

static enum MHD_Result fs_watcher_create(struct MHD_Connection *c, struct ad_req *q)
{
    _cleanup_cjson_ cJSON *m = unary_request(q);
    if (!m)
        return rpc_error(c, q, -EINVAL, "the body is not a JSON object");
    struct ad_session *s = q->sess;
    pthread_mutex_lock(&ctx_lock);
    unsigned n = 0;
    for (struct ad_e2b_watcher *w = s->e2b_watchers; w; w = w->next)
        n++;
    pthread_mutex_unlock(&ctx_lock);
    if (n >= WATCHERS_MAX)
        return rpc_error(c, q, -E2BIG, "a sandbox has at most %d watchers", WATCHERS_MAX);
    struct ad_e2b_watcher *w = calloc(1, sizeof(*w));
    if (!w || !(w->pending = cJSON_CreateArray()) || ad_random_hex(w->id, 16) < 0) {
        if (w)
            watcher_free(w);
        return rpc_error(c, q, -EIO, "cannot make a watcher");
    }
    struct ad_fail f;
    struct ad_run *r = watch_start(c, q, m, 0, &f);
    if (!r) {
        watcher_free(w);
        return rpc_error(c, q,
                         f.status == 400   ? -EINVAL
                         : f.status == 429 ? -E2BIG
                                           : -EIO,
                         "%s", f.msg);
    }
    cJSON *j = ad_run_json(r);
    cJSON *rid = cJSON_GetObjectItemCaseSensitive(j, "id");
    snprintf(w->rid, sizeof(w->rid), "%s", cJSON_IsString(rid) ? rid->valuestring : "");
    cJSON_Delete(j);
    /* its answer once it watches (or cannot), as envd's */
    bool done = false;
    uint64_t until = ad_now_ms() + WATCH_START_MS;
    for (;;) {
        watcher_read(w, r, &done);
        if (w->w.started || w->w.failed || done || ad_now_ms() >= until)
            break;
        usleep(20000);
    }
    if (!w->w.started) {
        if (!w->w.failed)
            snprintf(w->w.msg, sizeof(w->w.msg), "the guest's watcher did not start");
        int e = w->w.failed ? watch_errno(&w->w) : -ETIMEDOUT;
        watch_stop(r);
        ad_run_put(r);
        enum MHD_Result ret = rpc_error(c, q, e, "%s", w->w.msg);
        watcher_free(w);
        return ret;
    }
    ad_run_put(r);
    pthread_mutex_lock(&ctx_lock);
    w->next = s->e2b_watchers;
    s->e2b_watchers = w;
    pthread_mutex_unlock(&ctx_lock);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "watcherId", w->id);
    return ad_reply_json(c, q, 200, o);
}

/* The watcher a request names ({"watcherId": ID}), with ctx_lock held; NULL (unlocked) when
 * there is none. */
static struct ad_e2b_watcher *watcher_locked(struct ad_session *s, cJSON *m,
                                             struct ad_e2b_watcher ***link)
{
    cJSON *id = cJSON_GetObjectItemCaseSensitive(m, "watcherId");
    pthread_mutex_lock(&ctx_lock);
    for (struct ad_e2b_watcher **p = &s->e2b_watchers; cJSON_IsString(id) && *p; p = &(*p)->next)
        if (strlen(id->valuestring) == strlen((*p)->id) &&
            CRYPTO_memcmp((*p)->id, id->valuestring, strlen((*p)->id)) == 0) {
            if (link)
                *link = p;
            return *p;
        }
    pthread_mutex_unlock(&ctx_lock);
    return NULL;
}

static enum MHD_Result fs_watcher_events(struct MHD_Connection *c, struct ad_req *q)
{
    _cleanup_cjson_ cJSON *m = unary_request(q);
    struct ad_e2b_watcher *w = m ? watcher_locked(q->sess, m, NULL) : NULL;
    if (!w)
        return rpc_error(c, q, -ENOENT, "no such watcher");
    struct ad_run *r = ad_run_get(q->sess, w->rid);
    bool done = true;
    if (r) {
        watcher_read(w, r, &done);
        ad_run_put(r);
    }
    if (w->w.failed || (done && !cJSON_GetArraySize(w->pending))) {
        char msg[256];
        snprintf(msg, sizeof(msg), "%s", w->w.failed ? w->w.msg : "the watching ended");
        int e = w->w.failed ? watch_errno(&w->w) : -ENOENT;
        pthread_mutex_unlock(&ctx_lock);
        return rpc_error(c, q, e, "%s", msg);
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "events", w->pending);
    w->pending = cJSON_CreateArray();
    pthread_mutex_unlock(&ctx_lock);
    return ad_reply_json(c, q, 200, o);
}

static enum MHD_Result fs_watcher_remove(struct MHD_Connection *c, struct ad_req *q)
{
    _cleanup_cjson_ cJSON *m = unary_request(q);
    struct ad_e2b_watcher **link = NULL;
    struct ad_e2b_watcher *w = m ? watcher_locked(q->sess, m, &link) : NULL;
    if (!w)
        return rpc_error(c, q, -ENOENT, "no such watcher");
    *link = w->next;
    pthread_mutex_unlock(&ctx_lock);
    struct ad_run *r = ad_run_get(q->sess, w->rid);
    if (r) {
        watch_stop(r);
        ad_run_put(r);
    }
    watcher_free(w);
    return reply_empty(c, q);
}

/* ---- /files ---- */

static enum MHD_Result files_get(struct MHD_Connection *c, struct ad_req *q)
{
    _cleanup_free_ char *path = guest_path(c, q->sess, query(c, "path"));
    if (!path)
        return e2b_error(c, q, 400, "path: a path in the sandbox");
    static unsigned counter;
    char tmp[600];
    snprintf(tmp, sizeof(tmp), "%s/e2b-get-%ld-%u", ad_cfg.spool_dir, (long)getpid(),
             __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
    al_error err = {0};
    uint64_t max = 0;
    int r = ad_spool_download(q, path, &max, &err);
    if (r == -ENOSPC) {
        char why[400];
        ad_spool_full_why(why, sizeof(why));
        return e2b_error(c, q, 507, "%s", why);
    }
    if (r == 0)
        r = al_file_get_max(q->sess->s, path, tmp, max, &err);
    if (r < 0) {
        unlink(tmp);
        unsigned st;
        connect_code(r, &st);
        return e2b_error(c, q, st == 409 ? 400 : st, "%s", err.msg);
    }
    int fd = open(tmp, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    unlink(tmp);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) < 0) {
        if (fd >= 0)
            close(fd);
        return e2b_error(c, q, 500, "cannot read the spooled copy");
    }
    struct MHD_Response *resp = MHD_create_response_from_fd((uint64_t)sb.st_size, fd);
    if (!resp) {
        close(fd);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "application/octet-stream");
    return ad_reply(c, q, 200, resp);
}

/* multipart/form-data, parsed by libmicrohttpd's post processor from the spooled body: each
 * "file" part into a file of its own, put into the sandbox at its end. */
struct upload {
    struct MHD_Connection *c;
    struct ad_req *q;
    const char *path; /* ?path=, for a part without a file name */
    int fd;           /* the part being received */
    char *name;       /* its file name */
    uint64_t len;
    cJSON *out;
    int rc;
    char why[512];
};

static void upload_finish(struct upload *u)
{
    if (u->fd < 0)
        return;
    _cleanup_free_ char *dst =
        guest_path(u->c, u->q->sess, u->name && u->name[0] ? u->name : u->path);
    if (!dst) {
        u->rc = -EINVAL;
        snprintf(u->why, sizeof(u->why), "a file without a usable path");
    } else if (u->rc == 0) {
        /* its parents made, as E2B's write makes them (theirs, for the user) */
        char *slash = strrchr(dst, '/');
        if (slash && slash != dst) {
            *slash = 0;
            al_file_info st = AL_FILE_INFO_INIT;
            al_error e2 = {0};
            if (al_file_stat(u->q->sess->s, dst, &st, &e2) == -ENOENT) {
                e2 = (al_error){0};
                make_dirs(u->c, u->q->sess, dst, &e2);
            }
            *slash = '/';
        }
        /* envd's mode: a file's own when it is there, else 0644 (0666 under umask 022); the
         * put gives the guest's file the spool file's */
        al_file_info was = AL_FILE_INFO_INIT;
        al_error e3 = {0};
        fchmod(u->fd, al_file_stat(u->q->sess->s, dst, &was, &e3) == 0 && was.type == AL_ENTRY_FILE
                          ? (mode_t)was.mode
                          : 0644);
        char src[64];
        snprintf(src, sizeof(src), "/proc/self/fd/%d", u->fd);
        al_error err = {0};
        int r = al_file_put(u->q->sess->s, src, dst, &err);
        if (r < 0) {
            u->rc = r;
            snprintf(u->why, sizeof(u->why), "%s", err.msg);
        } else {
            give_to_user(u->c, u->q->sess, dst, false);
            const char *base = strrchr(dst, '/');
            cJSON *o = cJSON_CreateObject();
            ad_json_add_text(o, "name", base ? base + 1 : dst);
            cJSON_AddStringToObject(o, "type", "file");
            ad_json_add_text(o, "path", dst);
            cJSON_AddItemToArray(u->out, o);
        }
    }
    close(u->fd);
    u->fd = -1;
    free(u->name);
    u->name = NULL;
    u->len = 0;
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static enum MHD_Result upload_part(void *cls, enum MHD_ValueKind kind, const char *key,
                                   const char *filename, const char *type, const char *enc,
                                   const char *data, uint64_t off, size_t size)
{
    (void)kind, (void)type, (void)enc;
    struct upload *u = cls;
    if (strcmp(key, "file"))
        return MHD_YES;
    if (off == 0) { /* a new part */
        upload_finish(u);
        if (u->rc)
            return MHD_NO;
        u->fd = open(ad_cfg.spool_dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
        u->name = filename ? strdup(filename) : NULL;
        if (u->fd < 0) {
            u->rc = -errno;
            snprintf(u->why, sizeof(u->why), "cannot make a spool file: %s", strerror(errno));
            return MHD_NO;
        }
    }
    if (u->fd < 0)
        return MHD_NO;
    /* A part is a second copy of its bytes on the spool's disk: held as the body is. */
    if (size && !ad_spool_reserve(u->q, u->q->spool_len + u->len + size)) {
        u->rc = -ENOSPC;
        ad_spool_full_why(u->why, sizeof(u->why));
        return MHD_NO;
    }
    if (size && write_all(u->fd, data, size) < 0) {
        u->rc = -EIO;
        snprintf(u->why, sizeof(u->why), "cannot spool the upload");
        return MHD_NO;
    }
    u->len += size;
    return MHD_YES;
}

/* A gzip body (Content-Encoding: gzip, envd 0.5.7) inflated by libarchive into a spool file of
 * its own, at most max bytes (a small body may inflate to anything). Its fd, or -errno with
 * why. */
static int gunzip_spool(struct ad_req *q, int in, uint64_t max, char *why, size_t why_len)
{
    int out = open(ad_cfg.spool_dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (out < 0) {
        snprintf(why, why_len, "cannot make a spool file: %s", strerror(errno));
        return -EIO;
    }
    struct archive *a = archive_read_new();
    struct archive_entry *e;
    int rc = 0;
    lseek(in, 0, SEEK_SET);
    if (!a || archive_read_support_filter_gzip(a) != ARCHIVE_OK ||
        archive_read_support_format_raw(a) != ARCHIVE_OK ||
        archive_read_open_fd(a, in, 65536) != ARCHIVE_OK ||
        archive_read_next_header(a, &e) != ARCHIVE_OK ||
        archive_filter_code(a, 0) != ARCHIVE_FILTER_GZIP) {
        rc = -EINVAL;
        snprintf(why, why_len, "the body is not gzip: %s",
                 a && archive_error_string(a) ? archive_error_string(a) : "no gzip header");
    }
    char buf[65536];
    uint64_t total = 0;
    la_ssize_t n;
    while (rc == 0 && (n = archive_read_data(a, buf, sizeof(buf))) != 0) {
        if (n < 0) {
            rc = -EINVAL;
            snprintf(why, why_len, "the gzip body is damaged: %s", archive_error_string(a));
        } else if ((total += (uint64_t)n) > max) {
            rc = -EFBIG;
            snprintf(why, why_len, "the file inflates past the upload limit (%llu bytes)",
                     (unsigned long long)max);
        } else if (!ad_spool_reserve(q, q->spool_len + total)) {
            /* the inflated copy is on the spool's disk beside the body */
            rc = -ENOSPC;
            ad_spool_full_why(why, why_len);
        } else if (write_all(out, buf, (size_t)n) < 0) {
            rc = -EIO;
            snprintf(why, why_len, "cannot spool the upload");
        }
    }
    if (a)
        archive_read_free(a);
    if (rc < 0) {
        close(out);
        return rc;
    }
    return out;
}

static enum MHD_Result files_post(struct MHD_Connection *c, struct ad_req *q)
{
    const char *path = query(c, "path");
    struct upload u = {.c = c, .q = q, .path = path, .fd = -1, .out = cJSON_CreateArray()};
    const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
    const char *ce = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Encoding");
    bool gzip = ce && !strcasecmp(ce, "gzip");
    if (ce && !gzip && strcasecmp(ce, "identity")) {
        cJSON_Delete(u.out);
        return e2b_error(c, q, 415, "Content-Encoding: gzip or identity");
    }
    if (gzip && !(ct && !strncasecmp(ct, "application/octet-stream", 24))) {
        cJSON_Delete(u.out);
        return e2b_error(c, q, 415, "a gzip body is application/octet-stream");
    }
    if (ct && !strncasecmp(ct, "application/octet-stream", 24)) {
        /* the body is the file */
        u.fd = gzip ? gunzip_spool(q, q->spool_fd, q->lim.max_upload_bytes, u.why, sizeof(u.why))
                    : dup(q->spool_fd);
        if (u.fd < 0)
            u.rc = gzip ? u.fd : -EIO;
        else
            upload_finish(&u);
    } else {
        struct MHD_PostProcessor *pp = MHD_create_post_processor(c, 65536, upload_part, &u);
        if (!pp) {
            cJSON_Delete(u.out);
            return e2b_error(c, q, 400, "the body must be multipart/form-data or octet-stream");
        }
        char buf[65536];
        ssize_t n;
        lseek(q->spool_fd, 0, SEEK_SET);
        while (u.rc == 0 && (n = read(q->spool_fd, buf, sizeof(buf))) > 0)
            if (MHD_post_process(pp, buf, (size_t)n) != MHD_YES && u.rc == 0) {
                u.rc = -EINVAL;
                snprintf(u.why, sizeof(u.why), "the multipart body is malformed");
            }
        MHD_destroy_post_processor(pp);
        upload_finish(&u);
    }
    if (u.fd >= 0)
        close(u.fd);
    free(u.name);
    if (u.rc < 0) {
        cJSON_Delete(u.out);
        unsigned st;
        connect_code(u.rc, &st);
        if (u.rc == -EFBIG)
            st = 413;
        if (u.rc == -ENOSPC)
            st = 507;
        return e2b_error(c, q, st == 409 ? 400 : st, "%s", u.why);
    }
    if (!cJSON_GetArraySize(u.out)) {
        cJSON_Delete(u.out);
        return e2b_error(c, q, 400, "no file in the body");
    }
    return ad_reply_json(c, q, 200, u.out);
}

static enum MHD_Result envd_health(struct MHD_Connection *c, struct ad_req *q)
{
    return ad_reply(c, q, 204, MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT));
}

/* ---- the code interpreter (port 49999): /execute, /contexts ---- */

#define CI_PORT 49999
#define CONTEXTS_MAX 32

/* E2B's language names and the library's. NULL: none of ours. */
static const char *kernel_lang(const char *l)
{
    if (!l || !l[0] || !strcmp(l, "python") || !strcmp(l, "python3"))
        return "python";
    if (!strcmp(l, "js") || !strcmp(l, "javascript") || !strcmp(l, "node"))
        return "javascript";
    if (!strcmp(l, "bash") || !strcmp(l, "sh") || !strcmp(l, "shell"))
        return "shell";
    return NULL;
}

static const char *e2b_lang(const char *lang)
{
    return !strcmp(lang, "javascript") ? "javascript" : !strcmp(lang, "shell") ? "bash" : lang;
}

/* The kernel language of a default context's id ("python", "javascript", as E2B lists them),
 * or NULL. */
static const char *default_context(const char *id)
{
    return !strcmp(id, "python") ? "python" : !strcmp(id, "javascript") ? "javascript" : NULL;
}

/* The context id's entry (a copy, under the lock), false when there is none. */
static bool context_find(struct ad_session *s, const char *id, char lang[16], char cwd[512])
{
    bool found = false;
    pthread_mutex_lock(&ctx_lock);
    cJSON *x;
    cJSON_ArrayForEach(x, s->e2b_contexts)
    {
        cJSON *i = cJSON_GetObjectItemCaseSensitive(x, "id");
        if (cJSON_IsString(i) && !strcmp(i->valuestring, id)) {
            cJSON *l = cJSON_GetObjectItemCaseSensitive(x, "language");
            cJSON *c = cJSON_GetObjectItemCaseSensitive(x, "cwd");
            snprintf(lang, 16, "%s", cJSON_IsString(l) ? kernel_lang(l->valuestring) : "python");
            snprintf(cwd, 512, "%s", cJSON_IsString(c) ? c->valuestring : HOME_DIR);
            found = true;
            break;
        }
    }
    pthread_mutex_unlock(&ctx_lock);
    return found;
}

/* The stream's end: a run its caller left is interrupted, as a notebook's would be. */
static void execute_done(void *ctx)
{
    struct ad_e2b_cifmt *x = ctx;
    if (run_running(x->run, NULL)) {
        struct ad_fail f;
        ad_run_signal(x->run, 2, &f);
    }
    ad_run_put(x->run);
    ad_e2b_cifmt_clear(x);
    free(x);
}

static enum MHD_Result ci_execute(struct MHD_Connection *c, struct ad_req *q)
{
    _cleanup_cjson_ cJSON *m = unary_request(q);
    cJSON *code = cJSON_GetObjectItemCaseSensitive(m, "code");
    cJSON *cid = cJSON_GetObjectItemCaseSensitive(m, "context_id");
    cJSON *lang = cJSON_GetObjectItemCaseSensitive(m, "language");
    cJSON *envs = cJSON_GetObjectItemCaseSensitive(m, "env_vars");
    if (!m || !cJSON_IsString(code))
        return e2b_error(c, q, 400, "code: a string");
    char klang[16] = "python", cwd[512] = HOME_DIR;
    const char *context = NULL;
    if (cJSON_IsString(cid) && default_context(cid->valuestring)) {
        snprintf(klang, sizeof(klang), "%s", default_context(cid->valuestring));
    } else if (cJSON_IsString(cid) && cid->valuestring[0]) {
        if (!context_find(q->sess, cid->valuestring, klang, cwd))
            return e2b_error(c, q, 404, "context '%s' not found", cid->valuestring);
        context = cid->valuestring;
    } else if (cJSON_IsString(lang)) {
        const char *k = kernel_lang(lang->valuestring);
        if (!k)
            return e2b_error(c, q, 400,
                             "language '%s' is not supported here (python, "
                             "javascript, bash)",
                             lang->valuestring);
        snprintf(klang, sizeof(klang), "%s", k);
    }
    /* One block at a time in a context, as a notebook's: this one waits for the one before
     * (a caller that hung up interrupted it) */
    for (uint64_t end = ad_now_ms() + 30000;
         ad_now_ms() < end && ad_runs_kernel_busy(q->sess, klang, context);)
        usleep(50 * 1000);
    struct ad_exec_req er = {.code = code->valuestring,
                             .language = klang,
                             .kernel = true,
                             .cwd = cwd,
                             .context = context,
                             .stdin_data = ""};
    _cleanup_cjson_ cJSON *env = q->sess->e2b_env ? cJSON_Duplicate(q->sess->e2b_env, true) : NULL;
    if (cJSON_IsObject(envs)) {
        if (!env)
            env = cJSON_CreateObject();
        cJSON *a;
        cJSON_ArrayForEach(a, envs)
        {
            if (!cJSON_IsString(a))
                return e2b_error(c, q, 400, "env_vars: strings");
            cJSON_DeleteItemFromObjectCaseSensitive(env, a->string);
            cJSON_AddStringToObject(env, a->string, a->valuestring);
        }
    }
    er.env = env;
    cJSON *out;
    struct ad_fail f;
    if (ad_run_start(q->sess, &er, &q->lim, &out, &f) < 0)
        return e2b_fail(c, q, &f);
    cJSON *rid = cJSON_GetObjectItemCaseSensitive(out, "id");
    struct ad_run *r = cJSON_IsString(rid) ? ad_run_get(q->sess, rid->valuestring) : NULL;
    cJSON_Delete(out);
    struct ad_e2b_cifmt *x = r ? calloc(1, sizeof(*x)) : NULL;
    if (!x) {
        if (r)
            ad_run_put(r);
        return e2b_error(c, q, 500, "the run did not start");
    }
    x->run = r; /* its reference given back by execute_done */
    struct MHD_Response *resp = ad_run_stream(r, 0, ad_e2b_fmt_execute, x, execute_done, 0, &f);
    if (!resp)
        return e2b_fail(c, q, &f);
    MHD_add_response_header(resp, "Content-Type", "application/x-ndjson");
    return ad_reply(c, q, 200, resp);
}

static cJSON *context_json(const char *id, const char *lang, const char *cwd)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "language", lang);
    cJSON_AddStringToObject(o, "cwd", cwd);
    return o;
}

static enum MHD_Result ci_context_create(struct MHD_Connection *c, struct ad_req *q)
{
    _cleanup_cjson_ cJSON *m = unary_request(q);
    cJSON *lang = cJSON_GetObjectItemCaseSensitive(m, "language");
    cJSON *cwd = cJSON_GetObjectItemCaseSensitive(m, "cwd");
    const char *k = kernel_lang(cJSON_IsString(lang) ? lang->valuestring : NULL);
    if (!m || !k)
        return e2b_error(c, q, 400, "language: python, javascript or bash");
    if (cwd && !cJSON_IsNull(cwd) &&
        (!cJSON_IsString(cwd) || cwd->valuestring[0] != '/' || strlen(cwd->valuestring) >= 500))
        return e2b_error(c, q, 400, "cwd: an absolute path");
    char id[33];
    if (ad_random_hex(id, 16) < 0)
        return e2b_error(c, q, 500, "no random bytes for the context's id");
    cJSON *o = context_json(id, e2b_lang(k), cJSON_IsString(cwd) ? cwd->valuestring : HOME_DIR);
    pthread_mutex_lock(&ctx_lock);
    if (!q->sess->e2b_contexts)
        q->sess->e2b_contexts = cJSON_CreateArray();
    bool room = cJSON_GetArraySize(q->sess->e2b_contexts) < CONTEXTS_MAX;
    if (room)
        cJSON_AddItemToArray(q->sess->e2b_contexts, cJSON_Duplicate(o, true));
    pthread_mutex_unlock(&ctx_lock);
    if (!room) {
        cJSON_Delete(o);
        return e2b_error(c, q, 429, "at most %d contexts", CONTEXTS_MAX);
    }
    return ad_reply_json(c, q, 200, o);
}

static enum MHD_Result ci_context_list(struct MHD_Connection *c, struct ad_req *q)
{
    cJSON *a = cJSON_CreateArray();
    /* the defaults first, as E2B lists them */
    cJSON_AddItemToArray(a, context_json("python", "python", HOME_DIR));
    cJSON_AddItemToArray(a, context_json("javascript", "javascript", HOME_DIR));
    pthread_mutex_lock(&ctx_lock);
    cJSON *x;
    cJSON_ArrayForEach(x, q->sess->e2b_contexts) cJSON_AddItemToArray(a, cJSON_Duplicate(x, true));
    pthread_mutex_unlock(&ctx_lock);
    return ad_reply_json(c, q, 200, a);
}

/* DELETE /contexts/{id} and POST /contexts/{id}/restart: its kernel ends (and, removed, the
 * context goes). */
static enum MHD_Result ci_context_end(struct MHD_Connection *c, struct ad_req *q, bool remove)
{
    char lang[16], cwd[512];
    const char *id = q->params[1], *dflt = default_context(id);
    if (dflt && remove)
        return e2b_error(c, q, 400, "the default context '%s' stays", id);
    if (dflt)
        snprintf(lang, sizeof(lang), "%s", dflt);
    else if (!context_find(q->sess, id, lang, cwd))
        return e2b_error(c, q, 404, "context '%s' not found", id);
    al_error err = {0};
    int r = al_kernel_stop(q->sess->s, lang, dflt ? NULL : id, &err);
    if (r < 0 && r != -ENOENT)
        return e2b_error(c, q, r == -EBUSY ? 409 : 500, "%s", err.msg);
    if (remove) {
        pthread_mutex_lock(&ctx_lock);
        int i = 0;
        cJSON *x;
        cJSON_ArrayForEach(x, q->sess->e2b_contexts)
        {
            cJSON *xi = cJSON_GetObjectItemCaseSensitive(x, "id");
            if (cJSON_IsString(xi) && !strcmp(xi->valuestring, id))
                break;
            i++;
        }
        cJSON_DeleteItemFromArray(q->sess->e2b_contexts, i);
        pthread_mutex_unlock(&ctx_lock);
    }
    return ad_reply(c, q, 204, MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT));
}

static enum MHD_Result ci_context_remove(struct MHD_Connection *c, struct ad_req *q)
{
    return ci_context_end(c, q, true);
}

static enum MHD_Result ci_context_restart(struct MHD_Connection *c, struct ad_req *q)
{
    return ci_context_end(c, q, false);
}

static enum MHD_Result ci_health(struct MHD_Connection *c, struct ad_req *q)
{
    return ad_reply_json(c, q, 200, cJSON_CreateString("OK"));
}

/* ---- routing ---- */

#define RPC_PROCESS "/process.Process/"
#define RPC_FS "/filesystem.Filesystem/"

static enum MHD_Result p_input(struct MHD_Connection *c, struct ad_req *q)
{
    return process_act(c, q, ACT_INPUT);
}
static enum MHD_Result p_close(struct MHD_Connection *c, struct ad_req *q)
{
    return process_act(c, q, ACT_CLOSE);
}
static enum MHD_Result p_signal(struct MHD_Connection *c, struct ad_req *q)
{
    return process_act(c, q, ACT_SIGNAL);
}
static enum MHD_Result p_update(struct MHD_Connection *c, struct ad_req *q)
{
    return process_act(c, q, ACT_UPDATE);
}

static enum MHD_Result e2b_proxy(struct MHD_Connection *c, struct ad_req *q)
{
    return ad_port_proxy(c, q, (unsigned)strtoul(q->params[1], NULL, 10), q->tail, false);
}

#define E AD_NO_SESSION | AD_NO_AUTH
static const struct ad_route control_routes[] = {
    {"POST", "/sandboxes", E | AD_BODY_JSON, sandbox_create, "E2B: create a sandbox"},
    {"POST", "/v2/sandboxes", E | AD_BODY_JSON, sandbox_create, "E2B: create a sandbox"},
    {"GET", "/sandboxes", E, sandbox_list, "E2B: list sandboxes"},
    {"GET", "/v2/sandboxes", E, sandbox_list, "E2B: list sandboxes"},
    {"GET", "/sandboxes/{id}", E, sandbox_get, "E2B: a sandbox"},
    {"DELETE", "/sandboxes/{id}", E, sandbox_delete, "E2B: kill a sandbox"},
    {"POST", "/sandboxes/{id}/timeout", E | AD_BODY_JSON, sandbox_timeout, "E2B: set timeout"},
    {"POST", "/sandboxes/{id}/connect", E | AD_BODY_JSON, sandbox_connect, "E2B: connect"},
    {"POST", "/v2/sandboxes/{id}/connect", E | AD_BODY_JSON, sandbox_connect, "E2B: connect"},
    {"POST", "/sandboxes/{id}/resume", E | AD_BODY_JSON, sandbox_connect, "E2B: resume"},
    {"POST", "/sandboxes/{id}/pause", E | AD_BODY_JSON, sandbox_pause, "E2B: pause"},
    {"POST", "/sandboxes/{id}/fork", E | AD_BODY_JSON, sandbox_fork, "E2B: fork"},
    {"POST", "/sandboxes/{id}/snapshots", E | AD_BODY_JSON, snapshot_create, "E2B: createSnapshot"},
    {"GET", "/snapshots", E, snapshot_list, "E2B: listSnapshots"},
    {"DELETE", "/templates/{id}", E | AD_ID_NOT_SESSION, snapshot_delete, "E2B: deleteSnapshot"},
    {"POST", "/volumes", E | AD_BODY_JSON, volume_create, "E2B: Volume.create"},
    {"GET", "/volumes", E, volume_list, "E2B: Volume.list"},
    {"GET", "/volumes/{id}", E | AD_ID_NOT_SESSION, volume_get, "E2B: Volume.getInfo"},
    {"DELETE", "/volumes/{id}", E | AD_ID_NOT_SESSION, volume_delete, "E2B: Volume.destroy"},
    {"GET", "/sandboxes/{id}/metrics", E, sandbox_metrics, "E2B: metrics"},
};
static const struct ad_route envd_routes[] = {
    {"GET", "/health", E, envd_health, "envd: health"},
    {"GET", "/files", E, files_get, "envd: read a file"},
    {"POST", "/files", E | AD_BODY_SPOOL, files_post, "envd: write files"},
    {"POST", RPC_PROCESS "Start", E | AD_BODY_RAW, process_start, "envd: start a process"},
    {"POST", RPC_PROCESS "Connect", E | AD_BODY_RAW, process_connect, "envd: connect"},
    {"POST", RPC_PROCESS "List", E | AD_BODY_RAW, process_list, "envd: processes"},
    {"POST", RPC_PROCESS "SendInput", E | AD_BODY_RAW, p_input, "envd: stdin"},
    {"POST", RPC_PROCESS "CloseStdin", E | AD_BODY_RAW, p_close, "envd: close stdin"},
    {"POST", RPC_PROCESS "SendSignal", E | AD_BODY_RAW, p_signal, "envd: signal"},
    {"POST", RPC_PROCESS "Update", E | AD_BODY_RAW, p_update, "envd: pty size"},
    {"POST", RPC_FS "Stat", E | AD_BODY_RAW, fs_stat, "envd: stat"},
    {"POST", RPC_FS "ListDir", E | AD_BODY_RAW, fs_list, "envd: list a directory"},
    {"POST", RPC_FS "MakeDir", E | AD_BODY_RAW, fs_mkdir, "envd: make a directory"},
    {"POST", RPC_FS "Move", E | AD_BODY_RAW, fs_move, "envd: move"},
    {"POST", RPC_FS "Remove", E | AD_BODY_RAW, fs_remove, "envd: remove"},
    {"POST", RPC_FS "WatchDir", E | AD_BODY_RAW, fs_watch_dir, "envd: watch a directory"},
    {"POST", RPC_FS "CreateWatcher", E | AD_BODY_RAW, fs_watcher_create, "envd: a watcher"},
    {"POST", RPC_FS "GetWatcherEvents", E | AD_BODY_RAW, fs_watcher_events,
     "envd: a watcher's events"},
    {"POST", RPC_FS "RemoveWatcher", E | AD_BODY_RAW, fs_watcher_remove, "envd: remove a watcher"},
};
static const struct ad_route ci_routes[] = {
    {"GET", "/health", E, ci_health, "code interpreter: health"},
    {"POST", "/execute", E | AD_BODY_RAW, ci_execute, "code interpreter: run code"},
    {"POST", "/contexts", E | AD_BODY_RAW, ci_context_create, "code interpreter: a context"},
    {"GET", "/contexts", E, ci_context_list, "code interpreter: contexts"},
    {"DELETE", "/contexts/{id}", E, ci_context_remove, "code interpreter: remove a context"},
    {"POST", "/contexts/{id}/restart", E, ci_context_restart, "code interpreter: restart"},
};
static const struct ad_route proxy_route = {"*", "(a sandbox's port)",
                                            E | AD_ANY_METHOD | AD_BODY_RAW, e2b_proxy,
                                            "E2B: a sandbox's own port"};
#undef E

/* Path-only match of "/a/{id}/b" against url (no query), {id} into param. */
static bool e2b_match(const char *pattern, const char *url, char param[128])
{
    param[0] = 0;
    while (*pattern && *url) {
        if (!strncmp(pattern, "{id}", 4)) {
            size_t n = strcspn(url, "/?");
            if (!n || n >= 128)
                return false;
            memcpy(param, url, n);
            param[n] = 0;
            url += n;
            pattern += 4;
            continue;
        }
        if (*pattern != *url)
            return false;
        pattern++, url++;
    }
    return !*pattern && (!*url || *url == '?');
}

static const struct ad_route *find_route(const struct ad_route *t, size_t n, const char *url,
                                         const char *method, char param[128], bool *known)
{
    for (size_t i = 0; i < n; i++) {
        if (!e2b_match(t[i].pattern, url, param))
            continue;
        *known = true;
        if (!strcmp(t[i].method, method))
            return &t[i];
    }
    return NULL;
}

/* "PORT-ID.DOMAIN[:N]" (getHost's form; PORT 1 to 65535, ID a sandbox id's form): its id and
 * port, as E2b-Sandbox-Id and E2b-Sandbox-Port would give them. */
static bool host_route(const char *h, char sid[48], char port[8])
{
    if (!h)
        return false;
    size_t digits = strspn(h, "0123456789");
    if (!digits || digits > 5 || h[digits] != '-')
        return false;
    const char *id = h + digits + 1, *dot = strchr(id, '.');
    if (!dot || dot == id || (size_t)(dot - id) >= 48)
        return false;
    snprintf(sid, 48, "%.*s", (int)(dot - id), id);
    for (char *p = sid; *p; p++) /* a host name's case is not its own */
        if (*p >= 'A' && *p <= 'Z')
            *p = (char)(*p - 'A' + 'a');
    unsigned long n = strtoul(h, NULL, 10);
    if (!id_ok(sid) || n < 1 || n > 65535)
        return false;
    snprintf(port, 8, "%lu", n);
    return true;
}

/* A signed file URL (the SDK's downloadUrl and uploadUrl): no header names the sandbox, the
 * signature does: "v1_" and the unpadded base64 of SHA-256 over "PATH:OPERATION:USER:TOKEN"
 * (":EXPIRY" after it when the URL expires), TOKEN the sandbox's envd access token. Only a
 * holder of the token can make one; each is compared in constant time. */
struct signed_url {
    const char *path, *op, *user, *expiry, *sig;
};

static bool signed_by(void *ctx, const struct ad_session *s)
{
    const struct signed_url *u = ctx;
    if (!s->e2b_token[0] || s->paused || s->lost)
        return false;
    _cleanup_free_ char *raw = NULL;
    if (asprintf(&raw, "%s:%s:%s:%s%s%s", u->path, u->op, u->user, s->e2b_token,
                 u->expiry ? ":" : "", u->expiry ? u->expiry : "") < 0)
        return false;
    unsigned char sha[EVP_MAX_MD_SIZE];
    unsigned n = 0;
    char want[64] = "v1_";
    if (!EVP_Digest(raw, strlen(raw), sha, &n, EVP_sha256(), NULL) ||
        EVP_EncodeBlock((unsigned char *)want + 3, sha, (int)n) <= 0)
        return false;
    want[strcspn(want, "=")] = 0;
    return strlen(u->sig) == strlen(want) && !CRYPTO_memcmp(u->sig, want, strlen(want));
}

/* The sandbox of a signed /files request, referenced, or NULL with why. */
static struct ad_session *signed_sandbox(struct MHD_Connection *c, const char *method,
                                         const char **why)
{
    struct signed_url u = {.path = query(c, "path"),
                           .op = !strcmp(method, "GET") ? "read" : "write",
                           .user = query(c, "username"),
                           .expiry = query(c, "signature_expiration"),
                           .sig = query(c, "signature")};
    u.path = u.path ? u.path : "";
    u.user = u.user ? u.user : "";
    char *end = NULL;
    long long exp = u.expiry ? strtoll(u.expiry, &end, 10) : 0;
    if (u.expiry && (!*u.expiry || *end || exp < (long long)time(NULL))) {
        *why = "signature is already expired"; /* envd's words */
        return NULL;
    }
    if (strlen(u.sig) > 80 || strlen(u.path) > 4000 || strlen(u.user) > 64) {
        *why = "invalid signature";
        return NULL;
    }
    struct ad_session *s = ad_session_find(signed_by, &u);
    if (!s)
        *why = "invalid signature";
    return s;
}

/* A data-plane request of sandbox s (referenced; its token or signature checked): the key
 * that made it must still be valid (a revoked key's sandboxes answer nothing), and its limits
 * are this request's, as on the native API. */
static enum MHD_Result sandbox_request(struct MHD_Connection *c, struct ad_req *q,
                                       struct ad_session *s, bool *ok)
{
    struct ad_key k;
    if (strncmp(s->owner, "key:", 4) || ad_keys_get(s->owner + 4, &k) < 0) {
        ad_session_put(s);
        ad_metrics_error("unauthorized");
        return e2b_error(c, q, 401, "the key that made this sandbox is no longer valid");
    }
    ad_limits_apply(&q->lim, &k.lim);
    snprintf(q->owner, sizeof(q->owner), "%s", s->owner);
    ad_session_touch(s);
    q->sess = s;
    snprintf(q->params[0], sizeof(q->params[0]), "%s", s->id);
    *ok = true;
    return MHD_YES;
}

enum MHD_Result ad_e2b_route(struct MHD_Connection *c, struct ad_req *q, const char *url,
                             const char *method, bool *ok)
{
    *ok = false;
    q->lim = ad_cfg.limits;
    const char *sid = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "E2b-Sandbox-Id");
    bool known = false;
    char param[128];
    if (!sid && query(c, "signature") && !strncmp(url, "/files", 6) && (!url[6] || url[6] == '?') &&
        (!strcmp(method, "GET") || !strcmp(method, "POST"))) {
        const char *why = NULL;
        struct ad_session *s = signed_sandbox(c, method, &why);
        if (!s) {
            ad_metrics_error("unauthorized");
            return e2b_error(c, q, 401, "%s", why);
        }
        q->route = find_route(envd_routes, sizeof(envd_routes) / sizeof(*envd_routes), "/files",
                              method, param, &known);
        return sandbox_request(c, q, s, ok);
    }
    /* getHost(port)'s name, PORT-ID.DOMAIN, in Host: that sandbox's port, as the headers
     * would say */
    char host_sid[48], host_port[8];
    const char *port_s = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "E2b-Sandbox-Port");
    if (!sid &&
        host_route(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host"), host_sid, host_port)) {
        sid = host_sid;
        port_s = host_port;
    }
    if (!sid) { /* the control plane */
        q->route = find_route(control_routes, sizeof(control_routes) / sizeof(*control_routes), url,
                              method, param, &known);
        if (!q->route)
            return e2b_error(c, q, known ? 405 : 404, known ? "%s is not allowed here" : "%s",
                             known ? method : "no such route");
        const char *key = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-API-KEY");
        char native[80];
        struct ad_key k;
        /* the e2b_ form (the Python SDK takes no other), or the key as airlockd made it */
        if (key && !strncmp(key, "alk_", 4))
            snprintf(native, sizeof(native), "%s", key);
        else if (!key || !ad_e2b_key_to_native(key, native, sizeof(native)))
            native[0] = 0;
        if (!native[0] || ad_keys_check(native, &k) < 0) {
            ad_metrics_error("unauthorized");
            return e2b_error(c, q, 401, key ? "Invalid API key" : "X-API-KEY is needed");
        }
        snprintf(q->owner, sizeof(q->owner), "key:%s", k.id);
        ad_limits_apply(&q->lim, &k.lim);
        snprintf(q->params[0], sizeof(q->params[0]), "%s", param);
        if (param[0] && !(q->route->flags & AD_ID_NOT_SESSION)) {
            /* the key's own sandbox, or 404 as for one that never was */
            char id[160];
            native_id(param, id, sizeof(id));
            q->sess = id_ok(param) ? ad_session_get(q->owner, id) : NULL;
            if (q->sess && !q->sess->e2b_token[0]) {
                ad_session_put(q->sess);
                q->sess = NULL;
            }
            if (!q->sess)
                return e2b_error(c, q, 404, "sandbox '%s' not found", param);
            ad_session_touch(q->sess);
        }
        *ok = true;
        return MHD_YES;
    }
    /* the data plane: the sandbox, by its token */
    unsigned long port = port_s ? strtoul(port_s, NULL, 10) : ENVD_PORT;
    if (port == ENVD_PORT) {
        q->route = find_route(envd_routes, sizeof(envd_routes) / sizeof(*envd_routes), url, method,
                              param, &known);
        if (!q->route)
            return e2b_error(c, q, known ? 405 : 404, known ? "%s is not allowed here" : "%s",
                             known ? method : "no such route");
    } else if (port == CI_PORT) {
        q->route = find_route(ci_routes, sizeof(ci_routes) / sizeof(*ci_routes), url, method, param,
                              &known);
        if (!q->route)
            return e2b_error(c, q, known ? 405 : 404, known ? "%s is not allowed here" : "%s",
                             known ? method : "no such route");
        snprintf(q->params[1], sizeof(q->params[1]), "%s", param);
    } else if (port >= 1 && port <= 65535) {
        q->route = &proxy_route;
        q->tail = url;
        snprintf(q->params[1], sizeof(q->params[1]), "%lu", port);
    } else {
        return e2b_error(c, q, 400, "E2b-Sandbox-Port: 1 to 65535");
    }
    char id[160];
    struct ad_session *s = NULL;
    if (id_ok(sid)) {
        native_id(sid, id, sizeof(id));
        s = ad_session_get_any(id);
    }
    /* the SDK reads 502 as "the sandbox is not running" (a paused one is not) */
    if (!s || !s->e2b_token[0] || s->paused || s->lost) {
        if (s)
            ad_session_put(s);
        return e2b_error(c, q, 502, "sandbox '%s' is not running", sid);
    }
    const char *tok = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Access-Token");
    if (port != ENVD_PORT && !tok)
        tok = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "e2b-traffic-access-token");
    const char *want = port != ENVD_PORT && tok && strlen(tok) == strlen(s->e2b_traffic) &&
                               !CRYPTO_memcmp(tok, s->e2b_traffic, strlen(tok))
                           ? s->e2b_traffic
                           : s->e2b_token;
    if (!tok || strlen(tok) != strlen(want) || CRYPTO_memcmp(tok, want, strlen(want))) {
        ad_session_put(s);
        ad_metrics_error("unauthorized");
        /* Word for word the answer for an id that is not there: without the token, nobody
         * learns which sandbox ids are live. */
        return e2b_error(c, q, 502, "sandbox '%s' is not running", sid);
    }
    return sandbox_request(c, q, s, ok);
}

/* The MCP server's protocol half (docs/MCP.md): JSON-RPC 2.0 messages parsed with bounds,
 * version negotiation, the light methods answered from memory, every tools/call and resource
 * read on a worker thread of its own, and a ticker that sends progress and turns a cancellation
 * into SIGINT, then a kill. */
#include "mcpint.h"

#include "util.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

static const char *const versions[] = AL_MCP_VERSIONS;
#define NVERSIONS (sizeof(versions) / sizeof(versions[0]))
/* The stateless generation: no initialize, server/discover, the version in each request. */
#define VERSION_STATELESS "2026-07-28"

/* JSON-RPC's codes (and MCP's). */
#define RPC_PARSE -32700
#define RPC_INVALID -32600
#define RPC_NO_METHOD -32601
#define RPC_PARAMS -32602
#define RPC_INTERNAL -32603
#define RPC_BUSY -32000
#define RPC_VERSION -32022 /* 2026-07-28: a version the server does not speak */
#define META_VERSION "io.modelcontextprotocol/protocolVersion"

#define CANCEL_KILL_MS 2000 /* after SIGINT, a cancelled call's run is killed */
#define PROGRESS_MS 3000    /* a call with a progress token hears from us this often */
#define PROGRESS_FIRST_MS 1000

void mcp_log(al_mcp *m, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    al_vnotify(m->o.log, m->o.log_ctx, fmt, ap);
    va_end(ap);
}

int mcp_handle(char *out, size_t len, const char *prefix, size_t nbytes)
{
    unsigned char rnd[32];
    size_t pl = strlen(prefix);
    if (nbytes > sizeof(rnd) || len < pl + 2 * nbytes + 1)
        return -EINVAL;
    if (getrandom(rnd, nbytes, 0) != (ssize_t)nbytes)
        return -EIO;
    memcpy(out, prefix, pl);
    al_hexify(rnd, nbytes, out + pl);
    out[pl + 2 * nbytes] = '\0';
    return 0;
}

/* ---- sending ---- */

/* Under m->mu: one message out, unless the server is closing. */
static void send_json(al_mcp *m, al_mcp_send_fn send, void *ctx, cJSON *msg, bool final)
{
    if (m->closing)
        return;
    char *s = cJSON_PrintUnformatted(msg);
    if (s)
        send(ctx, s, final);
    free(s);
}

static cJSON *envelope(const cJSON *id)
{
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "jsonrpc", "2.0");
    cJSON_AddItemToObject(r, "id", id ? cJSON_Duplicate(id, true) : cJSON_CreateNull());
    return r;
}

static void reply_error(al_mcp *m, al_mcp_send_fn send, void *ctx, const cJSON *id, int code,
                        const char *msg)
{
    _cleanup_cjson_ cJSON *r = envelope(id);
    cJSON *e = cJSON_AddObjectToObject(r, "error");
    cJSON_AddNumberToObject(e, "code", code);
    cJSON_AddStringToObject(e, "message", msg);
    pthread_mutex_lock(&m->mu);
    send_json(m, send, ctx, r, true);
    pthread_mutex_unlock(&m->mu);
}

/* A result as the request's era wants it: the 2026-07-28 generation's resultType on every
 * result, and the cache hints its list and read results must carry. */
static void stamp(cJSON *result, const char *method, bool modern)
{
    if (!modern || !cJSON_IsObject(result))
        return;
    cJSON_AddStringToObject(result, "resultType", "complete");
    static const char *const cacheable[] = {"tools/list", "resources/list",
                                            "resources/templates/list", "resources/read",
                                            "server/discover"};
    for (size_t i = 0; i < sizeof(cacheable) / sizeof(cacheable[0]); i++)
        if (!strcmp(method, cacheable[i])) {
            /* The tool list changes only with the server's options; the rest at any time. */
            cJSON_AddNumberToObject(result, "ttlMs", !strcmp(method, "tools/list") ? 60000 : 0);
            cJSON_AddStringToObject(result, "cacheScope", "private");
        }
}

static void reply_result(al_mcp *m, al_mcp_send_fn send, void *ctx, const cJSON *id,
                         const char *method, bool modern, cJSON *result)
{
    stamp(result, method, modern);
    _cleanup_cjson_ cJSON *r = envelope(id);
    cJSON_AddItemToObject(r, "result", result);
    pthread_mutex_lock(&m->mu);
    send_json(m, send, ctx, r, true);
    pthread_mutex_unlock(&m->mu);
}

/* ---- calls on workers ---- */

void mcp_call_phase(struct mcp_call *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&c->m->mu);
    vsnprintf(c->phase, sizeof(c->phase), fmt, ap);
    pthread_mutex_unlock(&c->m->mu);
    va_end(ap);
}

void mcp_call_target(struct mcp_call *c, int fd)
{
    pthread_mutex_lock(&c->m->mu);
    c->target_fd = fd;
    /* A cancellation that came first reaches the new target at once. */
    if (fd >= 0 && c->cancelled) {
        unsigned char b = c->killed ? SIGKILL : SIGINT;
        if (write(fd, &b, 1) < 0) {
        }
    }
    pthread_mutex_unlock(&c->m->mu);
}

bool mcp_call_cancelled(struct mcp_call *c)
{
    pthread_mutex_lock(&c->m->mu);
    bool v = c->cancelled || c->m->closing;
    pthread_mutex_unlock(&c->m->mu);
    return v;
}

static void call_free(struct mcp_call *c)
{
    if (!c)
        return;
    free(c->id);
    free(c->method);
    cJSON_Delete(c->params);
    cJSON_Delete(c->progress);
    free(c);
}

/* Under the lock: the byte to the call's target, if it has one. */
static void call_signal(struct mcp_call *c, int sig)
{
    if (c->target_fd < 0)
        return;
    unsigned char b = (unsigned char)sig;
    if (write(c->target_fd, &b, 1) < 0) {
    }
}

static void *worker(void *arg)
{
    struct mcp_call *c = arg;
    al_mcp *m = c->m;
    cJSON *id = cJSON_Parse(c->id);
    cJSON *result = NULL;
    int code = 0;
    char msg[512] = "";
    const char *missing = NULL; /* a resource not found: its uri, the error's data */
    if (!strcmp(c->method, "tools/call")) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(c->params, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(c->params, "arguments");
        result = mcp_tools_call(m, c, name->valuestring, args);
        if (!result)
            code = RPC_INTERNAL, snprintf(msg, sizeof(msg), "out of memory");
    } else if (!strcmp(c->method, "resources/list")) {
        result = mcp_resources_list(m, c, &code, msg, sizeof(msg));
    } else {
        const cJSON *uri = cJSON_GetObjectItemCaseSensitive(c->params, "uri");
        result = mcp_resources_read(m, c, uri->valuestring, &code, msg, sizeof(msg));
        if (!result && code == -32002)
            missing = uri->valuestring;
        /* The 2026-07-28 generation says a missing resource is invalid params. */
        if (!result && c->modern && code == -32002)
            code = RPC_PARAMS;
    }
    stamp(result, c->method, c->modern);
    _cleanup_cjson_ cJSON *r = envelope(id);
    if (result) {
        cJSON_AddItemToObject(r, "result", result);
    } else {
        cJSON *e = cJSON_AddObjectToObject(r, "error");
        cJSON_AddNumberToObject(e, "code", code ? code : RPC_INTERNAL);
        cJSON_AddStringToObject(e, "message", msg[0] ? msg : "failed");
        if (missing)
            cJSON_AddStringToObject(cJSON_AddObjectToObject(e, "data"), "uri", missing);
    }
    cJSON_Delete(id);
    pthread_mutex_lock(&m->mu);
    for (struct mcp_call **p = &m->calls; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            break;
        }
    /* A cancelled request gets no answer (the client has forgotten it), only the NULL that
     * tells the transport it is over. */
    if (!c->cancelled)
        send_json(m, c->send, c->ctx, r, true);
    else if (!m->closing)
        c->send(c->ctx, NULL, true);
    m->ncalls--;
    pthread_mutex_unlock(&m->mu);
    call_free(c);
    pthread_mutex_lock(&m->mu);
    m->live--;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

/* Hands a request to a worker thread; the answer comes from there. */
static void dispatch(al_mcp *m, const cJSON *id, const char *method, const cJSON *params,
                     bool modern, al_mcp_send_fn send, void *ctx)
{
    struct mcp_call *c = calloc(1, sizeof(*c));
    if (!c || !(c->id = cJSON_PrintUnformatted(id)) || !(c->method = strdup(method)) ||
        !(c->params = params ? cJSON_Duplicate(params, true) : cJSON_CreateObject())) {
        call_free(c);
        reply_error(m, send, ctx, id, RPC_INTERNAL, "out of memory");
        return;
    }
    c->m = m;
    c->modern = modern;
    c->send = send;
    c->ctx = ctx;
    c->target_fd = -1;
    c->t_start_ms = c->t_progress_ms = al_now_ms();
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(params, "_meta");
    const cJSON *tok = cJSON_GetObjectItemCaseSensitive(meta, "progressToken");
    if (cJSON_IsString(tok) || cJSON_IsNumber(tok))
        c->progress = cJSON_Duplicate(tok, true);
    snprintf(c->phase, sizeof(c->phase), "working");
    pthread_mutex_lock(&m->mu);
    if (m->ncalls >= AL_MCP_CALLS_MAX) {
        pthread_mutex_unlock(&m->mu);
        call_free(c);
        reply_error(m, send, ctx, id, RPC_BUSY,
                    "too many calls in flight ("
                    "64"
                    "): wait for one to end");
        return;
    }
    c->next = m->calls;
    m->calls = c;
    m->ncalls++;
    m->live++;
    c->arrival = ++m->arrivals;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    int rc = pthread_create(&t, &at, worker, c);
    pthread_attr_destroy(&at);
    if (rc) {
        m->calls = c->next;
        m->ncalls--;
        m->live--;
        pthread_mutex_unlock(&m->mu);
        call_free(c);
        reply_error(m, send, ctx, id, RPC_INTERNAL, "cannot start a thread for the call");
        return;
    }
    pthread_mutex_unlock(&m->mu);
}

/* notifications/cancelled: SIGINT now, the kill later (the ticker); no answer will come. */
static void cancel(al_mcp *m, const cJSON *params)
{
    const cJSON *rid = cJSON_GetObjectItemCaseSensitive(params, "requestId");
    if (!cJSON_IsString(rid) && !cJSON_IsNumber(rid))
        return;
    _cleanup_free_ char *key = cJSON_PrintUnformatted(rid);
    if (!key)
        return;
    pthread_mutex_lock(&m->mu);
    for (struct mcp_call *c = m->calls; c; c = c->next)
        if (!c->cancelled && !strcmp(c->id, key)) {
            c->cancelled = true;
            c->t_cancel_ms = al_now_ms();
            call_signal(c, SIGINT);
            mcp_log(m, "call %s (%s) cancelled by the client", key, c->phase);
            break;
        }
    pthread_mutex_unlock(&m->mu);
}

static void *ticker(void *arg)
{
    al_mcp *m = arg;
    for (;;) {
        struct pollfd p = {.fd = m->tick_pipe[0], .events = POLLIN};
        if (poll(&p, 1, 500) != 0)
            break;
        uint64_t now = al_now_ms();
        pthread_mutex_lock(&m->mu);
        for (struct mcp_call *c = m->calls; c; c = c->next) {
            if (c->cancelled && !c->killed && now - c->t_cancel_ms >= CANCEL_KILL_MS) {
                c->killed = true;
                call_signal(c, SIGKILL);
            }
            /* The first a second in, then every few seconds. */
            if (c->progress && !c->cancelled &&
                now - c->t_progress_ms >= (c->nprogress ? PROGRESS_MS : PROGRESS_FIRST_MS)) {
                c->t_progress_ms = now;
                c->nprogress++;
                _cleanup_cjson_ cJSON *n = cJSON_CreateObject();
                cJSON_AddStringToObject(n, "jsonrpc", "2.0");
                cJSON_AddStringToObject(n, "method", "notifications/progress");
                cJSON *pp = cJSON_AddObjectToObject(n, "params");
                cJSON_AddItemToObject(pp, "progressToken", cJSON_Duplicate(c->progress, true));
                /* Seconds so far: it only grows, and there is no total to give. */
                cJSON_AddNumberToObject(pp, "progress", (double)(now - c->t_start_ms) / 1000.0);
                char text[192];
                snprintf(text, sizeof(text), "%s (%llu s)", c->phase,
                         (unsigned long long)((now - c->t_start_ms) / 1000));
                cJSON_AddStringToObject(pp, "message", text);
                send_json(m, c->send, c->ctx, n, false);
            }
        }
        pthread_mutex_unlock(&m->mu);
        mcp_sessions_reap(m);
    }
    return NULL;
}

/* ---- the light methods ---- */

static cJSON *capabilities(void)
{
    cJSON *caps = cJSON_CreateObject();
    cJSON_AddFalseToObject(cJSON_AddObjectToObject(caps, "tools"), "listChanged");
    cJSON *res = cJSON_AddObjectToObject(caps, "resources");
    cJSON_AddFalseToObject(res, "subscribe");
    cJSON_AddFalseToObject(res, "listChanged");
    return caps;
}

static cJSON *server_info(void)
{
    cJSON *info = cJSON_CreateObject();
    cJSON_AddStringToObject(info, "name", "airlock");
    cJSON_AddStringToObject(info, "title", "Airlock: code runs in a disposable VM");
    cJSON_AddStringToObject(info, "version", AIRLOCK_VERSION);
    return info;
}

static const char instructions[] =
    "Airlock runs code in disposable virtual machines, never on this computer. Call "
    "start_session once and pass its session handle to every other tool; state (variables, "
    "files, processes) lives in the session until stop_session. run_code keeps Python, bash "
    "and JavaScript state between calls. Take a checkpoint before something risky; rollback "
    "puts the whole VM back. Long runs: give run_code wait_s and pick the run up with "
    "run_output; servers and watchers: start_process, process_output, kill_process. Files "
    "live in /workspace.";

static cJSON *initialize(al_mcp *m, const cJSON *params)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(params, "protocolVersion");
    const char *chosen = versions[0];
    for (size_t i = 0; i < NVERSIONS; i++)
        if (!strcmp(v->valuestring, versions[i]))
            chosen = versions[i];
    const cJSON *ci = cJSON_GetObjectItemCaseSensitive(params, "clientInfo");
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(ci, "name");
    const cJSON *cv = cJSON_GetObjectItemCaseSensitive(ci, "version");
    pthread_mutex_lock(&m->mu);
    snprintf(m->version, sizeof(m->version), "%s", chosen);
    pthread_mutex_unlock(&m->mu);
    char cname[64] = "?", cver[32] = "?";
    /* Client strings go to the log escaped. */
    if (cJSON_IsString(cn))
        al_term_escape(cn->valuestring, cname, sizeof(cname));
    if (cJSON_IsString(cv))
        al_term_escape(cv->valuestring, cver, sizeof(cver));
    char asked[40];
    al_term_escape(v->valuestring, asked, sizeof(asked));
    mcp_log(m, "client %s %s asked for protocol %s, speaking %s", cname, cver, asked, chosen);
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "protocolVersion", chosen);
    cJSON_AddItemToObject(r, "capabilities", capabilities());
    cJSON_AddItemToObject(r, "serverInfo", server_info());
    cJSON_AddStringToObject(r, "instructions", instructions);
    return r;
}

static cJSON *discover(void)
{
    cJSON *r = cJSON_CreateObject();
    cJSON *sv = cJSON_AddArrayToObject(r, "supportedVersions");
    cJSON_AddItemToArray(sv, cJSON_CreateString(VERSION_STATELESS));
    for (size_t i = 0; i < NVERSIONS; i++)
        cJSON_AddItemToArray(sv, cJSON_CreateString(versions[i]));
    cJSON_AddItemToObject(r, "capabilities", capabilities());
    cJSON_AddItemToObject(r, "serverInfo", server_info());
    cJSON_AddStringToObject(r, "instructions", instructions);
    /* Where the 2026-07-28 generation looks for it. */
    cJSON_AddItemToObject(cJSON_AddObjectToObject(r, "_meta"), "io.modelcontextprotocol/serverInfo",
                          server_info());
    return r;
}

static cJSON *resource_templates(void)
{
    cJSON *r = cJSON_CreateObject();
    cJSON *a = cJSON_AddArrayToObject(r, "resourceTemplates");
    cJSON *t = cJSON_CreateObject();
    cJSON_AddStringToObject(t, "uriTemplate", "airlock://{session}/workspace/{+path}");
    cJSON_AddStringToObject(t, "name", "workspace-file");
    cJSON_AddStringToObject(t, "title", "A file in a session's /workspace");
    cJSON_AddStringToObject(t, "description",
                            "A file under /workspace in a session start_session opened");
    cJSON_AddItemToArray(a, t);
    return r;
}

/* One request or notification, already known to be an object with "jsonrpc": "2.0". */
static unsigned handle(al_mcp *m, const cJSON *msg, al_mcp_send_fn send, void *ctx)
{
    const cJSON *method = cJSON_GetObjectItemCaseSensitive(msg, "method");
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(msg, "id");
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(msg, "params");
    if (!method) {
        /* A response to us: we send no requests, so there is nothing to match. */
        if (id && (cJSON_GetObjectItemCaseSensitive(msg, "result") ||
                   cJSON_GetObjectItemCaseSensitive(msg, "error")))
            return 0;
        reply_error(m, send, ctx, cJSON_IsString(id) || cJSON_IsNumber(id) ? id : NULL, RPC_INVALID,
                    "invalid request: no method");
        return 1;
    }
    if (!cJSON_IsString(method)) {
        reply_error(m, send, ctx, cJSON_IsString(id) || cJSON_IsNumber(id) ? id : NULL, RPC_INVALID,
                    "invalid request: the method is not a string");
        return 1;
    }
    const char *name = method->valuestring;
    if (!id) {
        /* A notification: never answered. */
        if (!strcmp(name, "notifications/cancelled") && cJSON_IsObject(params))
            cancel(m, params);
        return 0;
    }
    if (!cJSON_IsString(id) &&
        !(cJSON_IsNumber(id) && id->valuedouble == (double)(int64_t)id->valuedouble)) {
        reply_error(m, send, ctx, NULL, RPC_INVALID,
                    "invalid request: the id must be a string or an integer");
        return 1;
    }
    if (params && !cJSON_IsObject(params)) {
        reply_error(m, send, ctx, id, RPC_PARAMS, "invalid params: not an object");
        return 1;
    }
    /* The 2026-07-28 generation names its version in each request's _meta. */
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(params, "_meta");
    const cJSON *pv = cJSON_GetObjectItemCaseSensitive(meta, META_VERSION);
    bool modern = false;
    if (pv) {
        if (!cJSON_IsString(pv) || strcmp(pv->valuestring, VERSION_STATELESS)) {
            _cleanup_cjson_ cJSON *r = envelope(id);
            cJSON *e = cJSON_AddObjectToObject(r, "error");
            cJSON_AddNumberToObject(e, "code", RPC_VERSION);
            cJSON_AddStringToObject(e, "message", "unsupported protocol version");
            cJSON *data = cJSON_AddObjectToObject(e, "data");
            cJSON *sup = cJSON_AddArrayToObject(data, "supported");
            cJSON_AddItemToArray(sup, cJSON_CreateString(VERSION_STATELESS));
            cJSON_AddItemToObject(data, "requested", cJSON_Duplicate(pv, true));
            pthread_mutex_lock(&m->mu);
            send_json(m, send, ctx, r, true);
            pthread_mutex_unlock(&m->mu);
            return 1;
        }
        modern = true;
    }
    if (!strcmp(name, "initialize")) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(params, "protocolVersion");
        if (!cJSON_IsString(v)) {
            reply_error(m, send, ctx, id, RPC_PARAMS,
                        "invalid params: initialize needs a protocolVersion string");
            return 1;
        }
        reply_result(m, send, ctx, id, name, modern, initialize(m, params));
    } else if (!strcmp(name, "ping")) {
        reply_result(m, send, ctx, id, name, modern, cJSON_CreateObject());
    } else if (!strcmp(name, "server/discover")) {
        reply_result(m, send, ctx, id, name, modern, discover());
    } else if (!strcmp(name, "tools/list")) {
        reply_result(m, send, ctx, id, name, modern, cJSON_Duplicate(m->tools, true));
    } else if (!strcmp(name, "resources/templates/list")) {
        reply_result(m, send, ctx, id, name, modern, resource_templates());
    } else if (!strcmp(name, "tools/call")) {
        const cJSON *tool = cJSON_GetObjectItemCaseSensitive(params, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(params, "arguments");
        char why[384];
        if (!cJSON_IsString(tool)) {
            reply_error(m, send, ctx, id, RPC_PARAMS, "invalid params: tools/call needs a name");
            return 1;
        }
        if (mcp_tools_check(m, tool->valuestring, args, why, sizeof(why)) < 0) {
            reply_error(m, send, ctx, id, RPC_PARAMS, why);
            return 1;
        }
        dispatch(m, id, name, params, modern, send, ctx);
    } else if (!strcmp(name, "resources/list")) {
        dispatch(m, id, name, params, modern, send, ctx);
    } else if (!strcmp(name, "resources/read")) {
        const cJSON *uri = cJSON_GetObjectItemCaseSensitive(params, "uri");
        if (!cJSON_IsString(uri)) {
            reply_error(m, send, ctx, id, RPC_PARAMS, "invalid params: resources/read needs a uri");
            return 1;
        }
        dispatch(m, id, name, params, modern, send, ctx);
    } else {
        char text[160], esc[96];
        snprintf(text, sizeof(text), "method not found: %s",
                 al_term_escape(name, esc, sizeof(esc)));
        reply_error(m, send, ctx, id, RPC_NO_METHOD, text);
    }
    return 1;
}

static unsigned handle_any(al_mcp *m, const cJSON *msg, al_mcp_send_fn send, void *ctx)
{
    if (!cJSON_IsObject(msg)) {
        reply_error(m, send, ctx, NULL, RPC_INVALID, "invalid request: not an object");
        return 1;
    }
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(msg, "jsonrpc");
    if (!cJSON_IsString(v) || strcmp(v->valuestring, "2.0")) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(msg, "id");
        reply_error(m, send, ctx, cJSON_IsString(id) || cJSON_IsNumber(id) ? id : NULL, RPC_INVALID,
                    "invalid request: jsonrpc must be \"2.0\"");
        return 1;
    }
    return handle(m, msg, send, ctx);
}

unsigned al_mcp_message(al_mcp *m, const char *text, size_t len, al_mcp_send_fn send, void *ctx)
{
    if (len > AL_MCP_MESSAGE_MAX) {
        reply_error(m, send, ctx, NULL, RPC_INVALID, "message too large (over 16 MiB)");
        return 1;
    }
    const char *end = NULL;
    _cleanup_cjson_ cJSON *msg = cJSON_ParseWithLengthOpts(text, len, &end, false);
    bool trailing = false;
    if (msg && end)
        for (const char *p = end; p < text + len; p++)
            if (*p != ' ' && *p != '\t' && *p != '\r' && *p != '\n')
                trailing = true;
    if (!msg || trailing) {
        reply_error(m, send, ctx, NULL, RPC_PARSE, "parse error: not one JSON value");
        return 1;
    }
    if (cJSON_IsArray(msg)) {
        /* A batch (2025-03-26): each element on its own, answered on its own. */
        if (!cJSON_GetArraySize(msg)) {
            reply_error(m, send, ctx, NULL, RPC_INVALID, "invalid request: an empty batch");
            return 1;
        }
        const cJSON *el;
        unsigned n = 0;
        cJSON_ArrayForEach(el, msg) n += handle_any(m, el, send, ctx);
        return n;
    }
    return handle_any(m, msg, send, ctx);
}

unsigned al_mcp_pending(al_mcp *m)
{
    pthread_mutex_lock(&m->mu);
    unsigned n = m->ncalls;
    pthread_mutex_unlock(&m->mu);
    return n;
}

int al_mcp_new(const al_mcp_opts *o, al_mcp **out, al_error *err)
{
    al_mcp *m = calloc(1, sizeof(*m));
    if (!m)
        return al_err(err, -ENOMEM, "out of memory");
    m->o = *o;
    m->tick_pipe[0] = m->tick_pipe[1] = -1;
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->cv, NULL);
    if (!m->o.sessions_max)
        m->o.sessions_max = AL_MCP_SESSIONS_DEFAULT;
    if (!m->o.memory_max_mib)
        m->o.memory_max_mib = 4096;
    if (!m->o.vcpus_max)
        m->o.vcpus_max = 4;
    if ((o->connect_uri && !(m->connect_uri = strdup(o->connect_uri))) ||
        (o->image && !(m->image = strdup(o->image)))) {
        al_mcp_free(m);
        return al_err(err, -ENOMEM, "out of memory");
    }
    m->o.connect_uri = m->connect_uri;
    m->o.image = m->image;
    int rc = mcp_tools_build(m, err);
    if (rc < 0) {
        al_mcp_free(m);
        return rc;
    }
    if (pipe2(m->tick_pipe, O_CLOEXEC) < 0) {
        rc = al_err(err, -errno, "pipe: %s", strerror(errno));
        al_mcp_free(m);
        return rc;
    }
    if (pthread_create(&m->ticker, NULL, ticker, m)) {
        al_mcp_free(m);
        return al_err(err, -EAGAIN, "cannot start the MCP server's ticker thread");
    }
    m->have_ticker = true;
    *out = m;
    return 0;
}

void al_mcp_free(al_mcp *m)
{
    if (!m)
        return;
    pthread_mutex_lock(&m->mu);
    m->closing = true;
    for (struct mcp_call *c = m->calls; c; c = c->next)
        call_signal(c, SIGKILL);
    pthread_mutex_unlock(&m->mu);
    if (m->have_ticker) {
        if (write(m->tick_pipe[1], "x", 1) < 0) {
        }
        pthread_join(m->ticker, NULL);
    }
    /* Stops every session (the calls on them fail at once), waits for the threads, closes. */
    mcp_sessions_end(m);
    if (m->tick_pipe[0] >= 0)
        close(m->tick_pipe[0]), close(m->tick_pipe[1]);
    cJSON_Delete(m->tools);
    free(m->connect_uri);
    free(m->image);
    pthread_mutex_destroy(&m->mu);
    pthread_cond_destroy(&m->cv);
    free(m);
}

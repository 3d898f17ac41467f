/* Open Interpreter's server protocol (`interpreter --server`: its async_core.py) on a listener
 * of its own (oi_listen), so that Open Interpreter's clients drive a sandboxed interpreter.
 *
 * A WebSocket at "/" (frames by libwslay): LMC chunks both ways, each message framed by "start"
 * and "end" flags (a whole message in one chunk is taken too). The first message {"auth": KEY}
 * (or X-API-KEY on the upgrade) signs in with an airlockd key, answered {"auth": true|false};
 * the connection is then a session of that key (its quotas, the pool, placement, the list),
 * ended with the connection. A user message is a turn of the daemon's chat (chat.c): its run's
 * events become LMC chunks here, then {"role": "server", "type": "status", "content":
 * "complete"}. {"role": "user", "type": "command", "content": "stop"} stops the turn, "go" runs
 * the code a confirmation waits for, and a new message while a turn runs stops it first.
 *
 * HTTP beside it: GET /heartbeat (no key), POST /settings and GET /settings/NAME (the key's:
 * the next turns of its connections), POST /run (code in the VM of the key's newest
 * connection). The model's endpoint and key stay the daemon's: a client may name a model, a
 * temperature, a context window, never api_base or api_key. */
#include "airlockd.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <wslay/wslay.h>

#include "chat.h"

#define OI_MSG_MAX (8u << 20)        /* one message from a client */
#define OI_QUEUE_MAX (16u << 20)     /* bytes queued for a client: past it, its run's events wait */
#define OI_AUTH_TRIES 5              /* wrong keys before the connection is closed */
#define OI_TEXT_MAX (64u << 10)      /* a setting's text (instructions, a system message) */
#define OI_CONSOLE_KEEP (64u << 10)  /* console text one message of the transcript keeps */
#define OI_RUN_OUTPUT_MAX (1u << 20) /* POST /run's output kept */
#define OI_CLOSE_WAIT_MS 2000        /* for the client's close frame after ours */

static const char ws_guid[] = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/* What a key set with POST /settings: its connections' next turns. */
struct oi_settings {
    bool auto_run;
    char model[128];
    double temperature;
    bool has_temperature;
    unsigned context_window, max_tokens, max_output;
    char *system_message, *custom_instructions;
};

struct oi_owner {
    struct oi_owner *next;
    char owner[40];
    struct oi_settings set;
    cJSON *messages; /* a conversation for the key's next connection (none was live) */
};

struct oi_conn {
    struct oi_conn *next; /* every connection, newest first (under lock) */
    char owner[40];       /* "" until signed in */
    struct ad_limits lim;
    MHD_socket sock;
    struct MHD_UpgradeResponseHandle *urh;
    char *early; /* the client's bytes read past its upgrade's head */
    size_t early_len, early_off;
    wslay_event_context_ptr ws;
    int efd; /* the turn's events (ad_run_notify) and the session's end */
    unsigned auth_fails;
    bool want_session;       /* signed in: the session is made in the loop, not in a callback */
    bool ended;              /* the daemon ended its session (under lock) */
    uint16_t close_code;     /* to send once what was queued before it is sent (wslay sends its
                                control frames first) */
    bool closing;            /* the close frame was queued */
    uint64_t close_ms;       /* when close_code was set */
    struct ad_session *sess; /* set under lock */
    struct ad_run *run;      /* the turn in flight */
    uint64_t last;           /* its last event read */
    bool asking;             /* its code waits for "go" */
    bool quiet;              /* a declined turn ends unheard: the message after it answers */
    cJSON *incoming;         /* the message being received (after its start) */
    cJSON *queued;           /* a user message that waits for the turn in flight to end */
    bool in_text, in_console;
    cJSON *messages; /* the conversation in LMC (GET /settings/messages), under lock */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gone_cv = PTHREAD_COND_INITIALIZER;
static struct oi_owner *owners;
static struct oi_conn *conns;
static unsigned nconns;
static bool stopping;

/* The connection ends once what was queued is sent: then a close frame of code, and the
 * client's, within OI_CLOSE_WAIT_MS. */
static void close_soon(struct oi_conn *k, uint16_t code)
{
    if (k->close_code)
        return;
    k->close_code = code;
    k->close_ms = ad_now_ms();
}

/* ---- the key's settings ---- */

/* Under lock: the owner's record, made on first use. */
static struct oi_owner *owner_of(const char *owner)
{
    for (struct oi_owner *o = owners; o; o = o->next)
        if (!strcmp(o->owner, owner))
            return o;
    struct oi_owner *o = calloc(1, sizeof(*o));
    if (!o)
        return NULL;
    snprintf(o->owner, sizeof(o->owner), "%s", owner);
    o->set.auto_run = false; /* Open Interpreter's default: code waits for "go" */
    o->next = owners;
    owners = o;
    return o;
}

/* ---- chunks out ---- */

static void send_json(struct oi_conn *k, cJSON *j)
{
    char *s = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!s)
        return;
    struct wslay_event_msg m = {WSLAY_TEXT_FRAME, (const uint8_t *)s, strlen(s)};
    wslay_event_queue_msg(k->ws, &m); /* copied */
    free(s);
}

/* A chunk; flag 1: "start", 2: "end", 0: content (NULL: none), made valid UTF-8. */
static void chunk(struct oi_conn *k, const char *role, const char *type, const char *format,
                  const char *content, size_t len, int flag)
{
    send_json(k, al_lmc_chunk(role, type, format, content, len, flag));
}

static void server_says(struct oi_conn *k, const char *type, const char *content)
{
    chunk(k, "server", type, NULL, content, strlen(content), 0);
}

static void complete(struct oi_conn *k, const char *outcome)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "role", "server");
    cJSON_AddStringToObject(j, "type", "status");
    cJSON_AddStringToObject(j, "content", "complete");
    if (outcome)
        cJSON_AddStringToObject(j, "outcome", outcome);
    send_json(k, j);
}

/* An error the client caused or must hear of, and the end of what it asked. */
static void error_complete(struct oi_conn *k, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void error_complete(struct oi_conn *k, const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    server_says(k, "error", msg);
    complete(k, "error");
}

/* ---- the conversation in LMC (what GET /settings/messages shows) ---- */

/* Appends content to the last message when it is role/type/format's (and append), else adds
 * one; a console message keeps its first OI_CONSOLE_KEEP bytes. */
static void transcript_add(struct oi_conn *k, const char *role, const char *type,
                           const char *format, const char *content, size_t len, bool append)
{
    char *t = al_utf8_repair((const uint8_t *)content, len, NULL);
    if (!t)
        return;
    pthread_mutex_lock(&lock);
    cJSON *last = cJSON_GetArrayItem(k->messages, cJSON_GetArraySize(k->messages) - 1);
    const char *lr = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(last, "role"));
    const char *lt = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(last, "type"));
    const char *lf = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(last, "format"));
    if (append && last && lr && lt && !strcmp(lr, role) && !strcmp(lt, type) &&
        !strcmp(lf ? lf : "", format ? format : "")) {
        const char *was = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(last, "content"));
        size_t wl = was ? strlen(was) : 0;
        if (strcmp(type, "console") || wl < OI_CONSOLE_KEEP) {
            char *both = NULL;
            if (asprintf(&both, "%s%s", was ? was : "", t) >= 0) {
                cJSON_ReplaceItemInObject(last, "content", cJSON_CreateString(both));
                free(both);
            }
        }
    } else if (k->messages) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", role);
        cJSON_AddStringToObject(m, "type", type);
        if (format)
            cJSON_AddStringToObject(m, "format", format);
        cJSON_AddStringToObject(m, "content", t);
        cJSON_AddItemToArray(k->messages, m);
    }
    pthread_mutex_unlock(&lock);
    free(t);
}

/* ---- a turn's events as chunks ---- */

static void text_close(struct oi_conn *k)
{
    if (k->in_text)
        chunk(k, "assistant", "message", NULL, NULL, 0, 2);
    k->in_text = false;
}

static void console_open(struct oi_conn *k)
{
    if (!k->in_console)
        chunk(k, "computer", "console", NULL, NULL, 0, 1);
    k->in_console = true;
}

static void on_event(void *ctx, const char *type, const char *json, size_t len)
{
    struct oi_conn *k = ctx;
    if (k->quiet && strcmp(type, "done") && strcmp(type, "error"))
        return;
    cJSON *d = cJSON_ParseWithLength(json, len);
    const char *s;
    if (!strcmp(type, "thinking")) {
        /* nothing to say */
    } else if (!strcmp(type, "text")) {
        s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(d, "text"));
        if (!k->in_text)
            chunk(k, "assistant", "message", NULL, NULL, 0, 1);
        k->in_text = true;
        chunk(k, "assistant", "message", NULL, s ? s : "", s ? strlen(s) : 0, 0);
        transcript_add(k, "assistant", "message", NULL, s ? s : "", s ? strlen(s) : 0, true);
    } else {
        text_close(k);
    }
    if (!strcmp(type, "code")) {
        const char *lang = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(d, "language"));
        s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(d, "code"));
        lang = lang ? lang : "";
        s = s ? s : "";
        chunk(k, "assistant", "code", lang, NULL, 0, 1);
        chunk(k, "assistant", "code", lang, s, strlen(s), 0);
        chunk(k, "assistant", "code", lang, NULL, 0, 2);
        transcript_add(k, "assistant", "code", lang, s, strlen(s), false);
    } else if (!strcmp(type, "confirm")) {
        /* Open Interpreter's: the reply ends here; "go" runs the code, a message declines it */
        const char *lang = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(d, "language"));
        s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(d, "code"));
        cJSON *j = cJSON_CreateObject(), *c = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "role", "computer");
        cJSON_AddStringToObject(j, "type", "confirmation");
        cJSON_AddStringToObject(j, "format", "execution");
        cJSON_AddStringToObject(c, "type", "code");
        cJSON_AddStringToObject(c, "format", lang ? lang : "");
        cJSON_AddStringToObject(c, "content", s ? s : "");
        cJSON_AddItemToObject(j, "content", c);
        send_json(k, j);
        complete(k, "confirmation");
        k->asking = true;
    } else if (!strcmp(type, "output")) {
        s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(d, "data_b64"));
        size_t n = 0;
        uint8_t *bytes = s ? ad_base64_decode(s, &n) : NULL;
        console_open(k);
        if (bytes && n) {
            chunk(k, "computer", "console", "output", (const char *)bytes, n, 0);
            transcript_add(k, "computer", "console", "output", (const char *)bytes, n, true);
        }
        free(bytes);
    } else if (!strcmp(type, "result")) {
        cJSON *data = cJSON_GetObjectItemCaseSensitive(d, "data");
        static const char *const kinds[][2] = {{"image/png", "base64.png"},
                                               {"image/jpeg", "base64.jpeg"}};
        for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
            s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(data, kinds[i][0]));
            if (!s)
                continue;
            console_open(k);
            chunk(k, "computer", "image", kinds[i][1], s, strlen(s), 0);
            transcript_add(k, "computer", "image", kinds[i][1], s, strlen(s), false);
            break;
        }
    } else if (!strcmp(type, "run_end")) {
        console_open(k);
        chunk(k, "computer", "console", NULL, NULL, 0, 2);
        k->in_console = false;
    } else if (!strcmp(type, "notice")) {
        s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(d, "message"));
        if (s)
            server_says(k, "notice", s);
    } else if (!strcmp(type, "error")) {
        s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(d, "message"));
        if (!k->quiet) {
            server_says(k, "error", s ? s : "the turn failed");
            complete(k, "error");
        }
    } else if (!strcmp(type, "done")) {
        s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(d, "outcome"));
        if (!k->quiet)
            complete(k, s);
    }
    cJSON_Delete(d);
}

/* ---- turns ---- */

static void turn_start(struct oi_conn *k, const char *text);

static void turn_over(struct oi_conn *k)
{
    ad_run_notify(k->run, -1);
    ad_run_put(k->run);
    k->run = NULL;
    k->asking = k->quiet = k->in_text = k->in_console = false;
    cJSON *q = k->queued;
    k->queued = NULL;
    if (q)
        turn_start(k, cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(q, "content")));
    cJSON_Delete(q);
}

/* The turn's events held now, while the client reads what it was sent. */
static void pump(struct oi_conn *k)
{
    if (!k->run || wslay_event_get_queued_msg_length(k->ws) > OI_QUEUE_MAX)
        return;
    bool done = false;
    k->last = ad_run_read(k->run, k->last, on_event, k, &done);
    if (done)
        turn_over(k);
}

static void turn_stop(struct oi_conn *k)
{
    struct ad_fail f;
    if (k->run)
        ad_run_signal(k->run, SIGINT, &f); /* the model and the code; a confirmation skips */
}

static void turn_start(struct oi_conn *k, const char *text)
{
    if (!k->sess) {
        error_complete(k, "no session: sign in first ({\"auth\": KEY})");
        return;
    }
    struct ad_chat_req q = {.message = text};
    char model[128] = "";
    char *system_message = NULL, *instructions = NULL;
    pthread_mutex_lock(&lock);
    struct oi_owner *o = owner_of(k->owner);
    if (o) {
        q.auto_run = o->set.auto_run;
        snprintf(model, sizeof(model), "%s", o->set.model);
        q.temperature = o->set.temperature;
        q.has_temperature = o->set.has_temperature;
        q.context_window = o->set.context_window;
        q.max_tokens = o->set.max_tokens;
        q.max_output = o->set.max_output;
        system_message = o->set.system_message ? strdup(o->set.system_message) : NULL;
        instructions = o->set.custom_instructions ? strdup(o->set.custom_instructions) : NULL;
    }
    pthread_mutex_unlock(&lock);
    q.model = model[0] ? model : NULL;
    q.system_message = system_message;
    q.instructions = instructions;
    cJSON *out = NULL;
    struct ad_fail f;
    int rc = ad_chat_turn(k->sess, &q, &k->lim, &out, &f);
    free(system_message);
    free(instructions);
    if (rc < 0) {
        error_complete(k, "%s", f.msg);
        return;
    }
    const char *rid = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(out, "id"));
    k->run = rid ? ad_run_get(k->sess, rid) : NULL;
    cJSON_Delete(out);
    if (!k->run) {
        error_complete(k, "the turn's run is gone");
        return;
    }
    k->last = 0;
    ad_run_notify(k->run, k->efd);
    pump(k);
}

/* A whole message from the client. */
static void take_message(struct oi_conn *k, cJSON *m)
{
    const char *role = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "role"));
    const char *type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "type"));
    const char *content = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "content"));
    struct ad_fail f;
    if (!role || strcmp(role, "user")) {
        error_complete(k, "only the user's messages are taken (role \"user\")");
    } else if (type && !strcmp(type, "command")) {
        if (content && !strcmp(content, "stop")) {
            cJSON_Delete(k->queued);
            k->queued = NULL;
            if (k->run)
                turn_stop(k); /* its end says complete */
            else
                complete(k, "stopped");
        } else if (content && !strcmp(content, "go")) {
            if (k->asking && ad_chat_confirm(k->sess, true, NULL, &f) == 0)
                k->asking = false;
            else
                error_complete(k, "no code waits for \"go\"");
        } else {
            error_complete(k, "unknown command '%.64s' (stop, go)", content ? content : "");
        }
    } else if ((!type || !strcmp(type, "message")) && content) {
        transcript_add(k, "user", "message", NULL, content, strlen(content), false);
        if (!k->run) {
            turn_start(k, content);
            cJSON_Delete(m);
            return;
        }
        /* Open Interpreter stops its reply for a new message: a confirmation is declined (and
         * that turn's end unheard), a turn in flight stopped; the message is taken after it. */
        if (k->asking) {
            ad_chat_confirm(k->sess, false, NULL, &f);
            k->asking = false;
        } else {
            turn_stop(k);
        }
        k->quiet = true;
        cJSON_Delete(k->queued);
        k->queued = m;
        return;
    } else {
        error_complete(k, "'%.32s' messages are not taken here (a text message, a command)",
                       type ? type : "?");
    }
    cJSON_Delete(m);
}

/* A chunk: a message's start, its content, its end (Open Interpreter's accumulation), or a
 * whole message in one. */
static void take_chunk(struct oi_conn *k, cJSON *j)
{
    bool start = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "start"));
    bool end = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "end"));
    cJSON *content = cJSON_GetObjectItemCaseSensitive(j, "content");
    cJSON_DeleteItemFromObjectCaseSensitive(j, "start");
    cJSON_DeleteItemFromObjectCaseSensitive(j, "end");
    if (start) {
        const char *type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "type"));
        if (k->run && !k->asking && !(type && !strcmp(type, "command"))) {
            turn_stop(k); /* the user starts something: the reply stops, unheard */
            k->quiet = true;
        }
        cJSON_Delete(k->incoming);
        k->incoming = j;
        if (!content)
            cJSON_AddStringToObject(j, "content", "");
        j = NULL;
    } else if (content && k->incoming) {
        cJSON *was = cJSON_GetObjectItemCaseSensitive(k->incoming, "content");
        if (cJSON_IsString(content) && cJSON_IsString(was)) {
            char *both = NULL;
            if (strlen(was->valuestring) + strlen(content->valuestring) > OI_MSG_MAX) {
                error_complete(k, "a message over %u bytes", OI_MSG_MAX);
                cJSON_Delete(k->incoming);
                k->incoming = NULL;
            } else if (asprintf(&both, "%s%s", was->valuestring, content->valuestring) >= 0) {
                cJSON_ReplaceItemInObject(k->incoming, "content", cJSON_CreateString(both));
                free(both);
            }
        } else {
            cJSON_ReplaceItemInObject(k->incoming, "content", cJSON_Duplicate(content, true));
        }
        const char *type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "type"));
        if (k->incoming && type && !cJSON_GetObjectItemCaseSensitive(k->incoming, "type"))
            cJSON_AddStringToObject(k->incoming, "type", type);
    } else if (content && !end) {
        take_message(k, j); /* a whole message in one chunk */
        return;
    }
    if (end) {
        cJSON *m = k->incoming;
        k->incoming = NULL;
        if (!m && content) { /* an end that carries the whole message */
            m = j;
            j = NULL;
        }
        if (m)
            take_message(k, m);
        else
            error_complete(k, "an \"end\" without a message started");
    }
    cJSON_Delete(j);
}

/* ---- the connection ---- */

static bool key_ok(const char *token, struct ad_key *out)
{
    return token && strlen(token) < 256 && ad_keys_check(token, out) == 0;
}

static void sign_in(struct oi_conn *k, const struct ad_key *key)
{
    pthread_mutex_lock(&lock); /* newest_live reads it */
    snprintf(k->owner, sizeof(k->owner), "key:%s", key->id);
    pthread_mutex_unlock(&lock);
    k->lim = ad_cfg.limits;
    ad_limits_apply(&k->lim, &key->lim);
    k->want_session = true;
}

static void on_msg(wslay_event_context_ptr ctx, const struct wslay_event_on_msg_recv_arg *arg,
                   void *user)
{
    (void)ctx;
    struct oi_conn *k = user;
    if (arg->opcode != WSLAY_TEXT_FRAME) {
        if (arg->opcode == WSLAY_BINARY_FRAME)
            error_complete(k, "binary messages are not taken here (text LMC chunks are)");
        return; /* close, ping and pong are wslay's */
    }
    cJSON *j = cJSON_ParseWithLength((const char *)arg->msg, arg->msg_length);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        error_complete(k, "a message is a JSON object (an LMC chunk)");
        return;
    }
    cJSON *auth = cJSON_GetObjectItemCaseSensitive(j, "auth");
    if (!k->owner[0] || auth) {
        struct ad_key key;
        bool ok = key_ok(cJSON_GetStringValue(auth), &key);
        char owner[40];
        snprintf(owner, sizeof(owner), "key:%s", ok ? key.id : "");
        if (ok && k->owner[0] && strcmp(owner, k->owner))
            ok = false; /* one key per connection */
        if (ok && !k->owner[0])
            sign_in(k, &key);
        cJSON *a = cJSON_CreateObject();
        cJSON_AddBoolToObject(a, "auth", ok);
        send_json(k, a);
        if (!ok && ++k->auth_fails >= OI_AUTH_TRIES)
            close_soon(k, 1008); /* policy: not signed in */
        cJSON_Delete(j);
        return;
    }
    if (cJSON_GetObjectItemCaseSensitive(j, "ack")) { /* acknowledgements: nothing waits on them */
        cJSON_Delete(j);
        return;
    }
    take_chunk(k, j);
}

static ssize_t recv_cb(wslay_event_context_ptr ctx, uint8_t *buf, size_t len, int flags, void *user)
{
    (void)flags;
    struct oi_conn *k = user;
    if (k->early_off < k->early_len) {
        size_t n = k->early_len - k->early_off < len ? k->early_len - k->early_off : len;
        memcpy(buf, k->early + k->early_off, n);
        k->early_off += n;
        return (ssize_t)n;
    }
    ssize_t n;
    do
        n = recv(k->sock, buf, len, 0);
    while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
        return -1;
    }
    if (n <= 0) {
        wslay_event_set_error(ctx, WSLAY_ERR_CALLBACK_FAILURE);
        return -1;
    }
    return n;
}

static ssize_t send_cb(wslay_event_context_ptr ctx, const uint8_t *data, size_t len, int flags,
                       void *user)
{
    (void)flags;
    struct oi_conn *k = user;
    ssize_t n;
    do
        n = send(k->sock, data, len, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n < 0) {
        wslay_event_set_error(ctx, errno == EAGAIN || errno == EWOULDBLOCK
                                       ? WSLAY_ERR_WOULDBLOCK
                                       : WSLAY_ERR_CALLBACK_FAILURE);
        return -1;
    }
    return n;
}

/* The daemon ends the session (DELETE, its lifetime, its idle time, the key revoked, the
 * daemon's stop): the connection lets go of it and closes. */
static void sess_ended(void *ctx, struct ad_session *s)
{
    (void)s;
    pthread_mutex_lock(&lock);
    for (struct oi_conn *k = conns; k; k = k->next)
        if (k == ctx) {
            k->ended = true;
            ad_eventfd_wake(k->efd);
        }
    pthread_mutex_unlock(&lock);
}

/* After the sign-in: the key's session (its quotas), and a conversation set for it before. */
static void session_start(struct oi_conn *k)
{
    k->want_session = false;
    cJSON *labels = cJSON_CreateObject();
    cJSON_AddStringToObject(labels, "front", "open-interpreter");
    struct ad_create cr = {
        .labels = labels, .front_held = true, .on_end = sess_ended, .on_end_ctx = k};
    struct ad_session *s = NULL;
    struct ad_fail f = {0};
    int rc = ad_session_create(k->owner, &k->lim, &cr, &s, &f);
    cJSON_Delete(labels);
    if (rc < 0) {
        error_complete(k, "%s%s%s", f.limit ? f.limit : "", f.limit ? ": " : "", f.msg);
        ad_log("open-interpreter: no session for %s: %s", k->owner, f.msg);
        close_soon(k, f.status == 429 ? 1013 : 1011);
        return;
    }
    pthread_mutex_lock(&lock);
    k->sess = s;
    struct oi_owner *o = owner_of(k->owner);
    cJSON *restore = o ? o->messages : NULL;
    if (o)
        o->messages = NULL;
    pthread_mutex_unlock(&lock);
    if (restore && ad_chat_restore(s, restore, &f) == 0) {
        pthread_mutex_lock(&lock);
        cJSON_Delete(k->messages);
        k->messages = restore;
        restore = NULL;
        pthread_mutex_unlock(&lock);
    }
    cJSON_Delete(restore);
    ad_log("open-interpreter: session %s of %s", s->id, k->owner);
}

static void conn_free(struct oi_conn *k)
{
    pthread_mutex_lock(&lock);
    for (struct oi_conn **p = &conns; *p; p = &(*p)->next)
        if (*p == k) {
            *p = k->next;
            break;
        }
    struct ad_session *s = k->sess;
    k->sess = NULL;
    pthread_mutex_unlock(&lock);
    if (k->run) {
        turn_stop(k);
        ad_run_notify(k->run, -1);
        ad_run_put(k->run);
    }
    if (s)
        ad_session_delete(s); /* the client is gone: so is its VM */
    if (k->ws)
        wslay_event_context_free(k->ws);
    if (k->urh)
        MHD_upgrade_action(k->urh, MHD_UPGRADE_ACTION_CLOSE);
    if (k->efd >= 0)
        close(k->efd);
    cJSON_Delete(k->incoming);
    cJSON_Delete(k->queued);
    cJSON_Delete(k->messages);
    free(k->early);
    free(k);
    pthread_mutex_lock(&lock);
    nconns--;
    pthread_cond_broadcast(&gone_cv);
    pthread_mutex_unlock(&lock);
}

static void *conn_main(void *p)
{
    struct oi_conn *k = p;
    fcntl(k->sock, F_SETFL, fcntl(k->sock, F_GETFL) | O_NONBLOCK);
    struct wslay_event_callbacks cb = {
        .recv_callback = recv_cb, .send_callback = send_cb, .on_msg_recv_callback = on_msg};
    if (wslay_event_context_server_init(&k->ws, &cb, k) != 0) {
        k->ws = NULL;
        conn_free(k);
        return NULL;
    }
    wslay_event_config_set_max_recv_msg_length(k->ws, OI_MSG_MAX);
    for (;;) {
        pthread_mutex_lock(&lock);
        bool ended = k->ended || stopping;
        pthread_mutex_unlock(&lock);
        if (ended && !k->close_code) {
            if (k->run) { /* the session's end ended its runs */
                ad_run_notify(k->run, -1);
                ad_run_put(k->run);
                k->run = NULL;
            }
            pthread_mutex_lock(&lock);
            struct ad_session *s = k->sess;
            k->sess = NULL;
            pthread_mutex_unlock(&lock);
            if (s)
                ad_session_put(s); /* the daemon ends it: its reference back */
            error_complete(k, stopping ? "airlockd is stopping" : "the session ended");
            close_soon(k, 1001);
        }
        if (k->want_session && !k->close_code)
            session_start(k);
        if (k->early_off < k->early_len && wslay_event_recv(k->ws) != 0)
            break;
        pump(k);
        if (wslay_event_want_write(k->ws) && wslay_event_send(k->ws) != 0)
            break;
        if (k->close_code && !k->closing && !wslay_event_get_queued_msg_count(k->ws)) {
            wslay_event_queue_close(k->ws, k->close_code, NULL, 0);
            k->closing = true;
            if (wslay_event_send(k->ws) != 0)
                break;
        }
        short ev = (short)((wslay_event_want_read(k->ws) ? POLLIN : 0) |
                           (wslay_event_want_write(k->ws) ? POLLOUT : 0));
        if (!ev || (k->close_code && ad_now_ms() - k->close_ms > OI_CLOSE_WAIT_MS))
            break;
        struct pollfd pf[2] = {{k->sock, ev, 0}, {k->efd, POLLIN, 0}};
        int n = poll(pf, 2, 1000);
        if (n < 0 && errno != EINTR)
            break;
        if (pf[1].revents & POLLIN) {
            uint64_t v;
            if (read(k->efd, &v, sizeof(v)) < 0) {
            }
        }
        if (pf[0].revents & (POLLERR | POLLNVAL))
            break;
        if ((pf[0].revents & (POLLIN | POLLHUP)) && wslay_event_recv(k->ws) != 0)
            break;
    }
    conn_free(k);
    return NULL;
}

static void on_upgrade(void *cls, struct MHD_Connection *c, void *con_cls, const char *extra_in,
                       size_t extra_in_size, MHD_socket sock, struct MHD_UpgradeResponseHandle *urh)
{
    (void)c;
    struct oi_conn *k = cls;
    struct ad_req *q = con_cls;
    k->sock = sock;
    k->urh = urh;
    if (extra_in_size && !(k->early = malloc(extra_in_size))) {
        MHD_upgrade_action(urh, MHD_UPGRADE_ACTION_CLOSE);
        return; /* not upgraded: the request's end frees it */
    }
    if (extra_in_size)
        memcpy(k->early, extra_in, extra_in_size);
    k->early_len = extra_in_size;
    q->oi = NULL; /* the connection's thread owns it now */
    q->upgraded = true;
    pthread_mutex_lock(&lock);
    k->next = conns;
    conns = k;
    nconns++;
    pthread_mutex_unlock(&lock);
    pthread_t t;
    if (pthread_create(&t, NULL, conn_main, k) == 0) {
        pthread_detach(t);
        return;
    }
    k->urh = NULL;
    MHD_upgrade_action(urh, MHD_UPGRADE_ACTION_CLOSE);
    conn_free(k);
}

void ad_oi_done(struct oi_conn *k)
{
    if (!k)
        return;
    if (k->efd >= 0)
        close(k->efd);
    cJSON_Delete(k->messages);
    free(k);
}

/* ---- HTTP ---- */

static enum MHD_Result detail(struct MHD_Connection *c, struct ad_req *q, unsigned status,
                              const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static enum MHD_Result detail(struct MHD_Connection *c, struct ad_req *q, unsigned status,
                              const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, status == 403 ? "detail" : "error", msg);
    return ad_reply_json(c, q, status, o);
}

static enum MHD_Result heartbeat(struct MHD_Connection *c, struct ad_req *q)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", "alive");
    return ad_reply_json(c, q, 200, o);
}

static enum MHD_Result root(struct MHD_Connection *c, struct ad_req *q)
{
    if (!ad_wants_websocket(c)) {
        static const char text[] =
            "airlockd: Open Interpreter's server protocol. Connect a WebSocket here, send "
            "{\"auth\": KEY} (an airlockd API key), then LMC messages.\n";
        struct MHD_Response *r =
            MHD_create_response_from_buffer(sizeof(text) - 1, (void *)text, MHD_RESPMEM_PERSISTENT);
        MHD_add_response_header(r, "Content-Type", "text/plain; charset=utf-8");
        return ad_reply(c, q, 200, r);
    }
    const char *key = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Sec-WebSocket-Key");
    const char *ver = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Sec-WebSocket-Version");
    if (!key || strlen(key) != 24 || !ver || strcmp(ver, "13"))
        return detail(c, q, 400, "a WebSocket upgrade needs Sec-WebSocket-Key and version 13");
    if (!ad_same_origin(c))
        return detail(c, q, 403, "a browser's WebSocket must come from this listener's origin");
    pthread_mutex_lock(&lock);
    bool room = !stopping && nconns < ad_cfg.max_connections;
    pthread_mutex_unlock(&lock);
    if (!room)
        return detail(c, q, 503, "no room for another connection");
    char both[128];
    unsigned char sha[EVP_MAX_MD_SIZE];
    unsigned shalen = 0;
    char accept[64];
    snprintf(both, sizeof(both), "%s%s", key, ws_guid);
    if (!EVP_Digest(both, strlen(both), sha, &shalen, EVP_sha1(), NULL) ||
        EVP_EncodeBlock((unsigned char *)accept, sha, (int)shalen) <= 0)
        return detail(c, q, 500, "cannot answer the upgrade");
    struct oi_conn *k = calloc(1, sizeof(*k));
    if (!k)
        return MHD_NO;
    k->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    k->messages = cJSON_CreateArray();
    if (k->efd < 0 || !k->messages) {
        ad_oi_done(k);
        return detail(c, q, 500, "cannot take the connection");
    }
    if (q->owner[0]) { /* signed in by its header */
        snprintf(k->owner, sizeof(k->owner), "%s", q->owner);
        k->lim = q->lim;
        k->want_session = true;
    }
    struct MHD_Response *r = MHD_create_response_for_upgrade(on_upgrade, k);
    if (!r) {
        ad_oi_done(k);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Upgrade", "websocket");
    MHD_add_response_header(r, "Sec-WebSocket-Accept", accept);
    q->oi = k; /* the request's end frees it unless upgraded */
    return ad_reply(c, q, 101, r);
}

/* Under lock: the key's newest connection with a live session, or NULL. */
static struct oi_conn *newest_live(const char *owner)
{
    for (struct oi_conn *k = conns; k; k = k->next)
        if (!strcmp(k->owner, owner) && k->sess && !k->ended)
            return k;
    return NULL;
}

static bool text_setting(const cJSON *v)
{
    return cJSON_IsNull(v) || (cJSON_IsString(v) && strlen(v->valuestring) <= OI_TEXT_MAX);
}

static bool whole(const cJSON *v)
{
    return cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble <= 4e9 &&
           v->valuedouble == (double)(unsigned)v->valuedouble;
}

/* The settings body checked whole before any of it applies: 0, or the answer's status with
 * why. */
static unsigned settings_check(const cJSON *body, char *why, size_t len)
{
    const cJSON *v;
    cJSON_ArrayForEach(v, body)
    {
        const char *k = v->string;
        if (!strcmp(k, "auto_run")) {
            if (!cJSON_IsBool(v))
                return snprintf(why, len, "auto_run: true or false"), 400;
        } else if (!strcmp(k, "custom_instructions") || !strcmp(k, "system_message")) {
            if (!text_setting(v))
                return snprintf(why, len, "%s: a text of at most %u bytes, or null", k,
                                OI_TEXT_MAX),
                       400;
        } else if (!strcmp(k, "max_output")) {
            if (!whole(v))
                return snprintf(why, len, "max_output: a whole number of bytes"), 400;
        } else if (!strcmp(k, "messages")) {
            char w[160] = "";
            cJSON *conv = cJSON_IsArray(v) ? al_chat_from_lmc(v, w, sizeof(w)) : NULL;
            cJSON_Delete(conv);
            if (!conv)
                return snprintf(why, len, "messages: %s", w[0] ? w : "a list of LMC messages"), 400;
        } else if (!strcmp(k, "llm")) {
            if (!cJSON_IsObject(v))
                return snprintf(why, len, "llm: an object"), 400;
            const cJSON *s;
            cJSON_ArrayForEach(s, v)
            {
                const char *n = s->string;
                if (!strcmp(n, "api_base") || !strcmp(n, "api_key") || !strcmp(n, "api_version"))
                    return snprintf(why, len,
                                    "llm.%s cannot be changed through the server: the model's "
                                    "endpoint and key are airlockd's",
                                    n),
                           403;
                if (!strcmp(n, "model")) {
                    if (!cJSON_IsString(s) || !s->valuestring[0] || strlen(s->valuestring) >= 128)
                        return snprintf(why, len, "llm.model: a model name"), 400;
                } else if (!strcmp(n, "temperature")) {
                    if (!cJSON_IsNull(s) &&
                        (!cJSON_IsNumber(s) || s->valuedouble < 0 || s->valuedouble > 2))
                        return snprintf(why, len, "llm.temperature: a number from 0 to 2"), 400;
                } else if (!strcmp(n, "context_window") || !strcmp(n, "max_tokens")) {
                    if (!cJSON_IsNull(s) && !whole(s))
                        return snprintf(why, len, "llm.%s: a whole number of tokens", n), 400;
                } else if (strcmp(n, "supports_vision") && strcmp(n, "supports_functions")) {
                    return snprintf(why, len, "Sub-setting %.64s not found in llm", n), 404;
                }
            }
        } else {
            return snprintf(why, len, "Setting %.64s not found", k), 404;
        }
    }
    return 0;
}

static void set_text(char **slot, const cJSON *v)
{
    free(*slot);
    *slot = cJSON_IsString(v) && v->valuestring[0] ? strdup(v->valuestring) : NULL;
}

static enum MHD_Result settings_post(struct MHD_Connection *c, struct ad_req *q)
{
    char why[256];
    unsigned st = settings_check(q->json, why, sizeof(why));
    if (st)
        return detail(c, q, st, "%s", why);
    struct ad_session *target = NULL;
    cJSON *messages = NULL;
    pthread_mutex_lock(&lock);
    struct oi_owner *o = owner_of(q->owner);
    if (!o) {
        pthread_mutex_unlock(&lock);
        return detail(c, q, 500, "out of memory");
    }
    const cJSON *v;
    cJSON_ArrayForEach(v, q->json)
    {
        const char *k = v->string;
        if (!strcmp(k, "auto_run"))
            o->set.auto_run = cJSON_IsTrue(v);
        else if (!strcmp(k, "custom_instructions"))
            set_text(&o->set.custom_instructions, v);
        else if (!strcmp(k, "system_message"))
            set_text(&o->set.system_message, v);
        else if (!strcmp(k, "max_output"))
            o->set.max_output = (unsigned)v->valuedouble;
        else if (!strcmp(k, "messages"))
            messages = cJSON_Duplicate(v, true);
        else if (!strcmp(k, "llm")) {
            const cJSON *s;
            cJSON_ArrayForEach(s, v)
            {
                if (!strcmp(s->string, "model"))
                    snprintf(o->set.model, sizeof(o->set.model), "%s", s->valuestring);
                else if (!strcmp(s->string, "temperature")) {
                    o->set.has_temperature = cJSON_IsNumber(s);
                    o->set.temperature = cJSON_IsNumber(s) ? s->valuedouble : 0;
                } else if (!strcmp(s->string, "context_window"))
                    o->set.context_window = cJSON_IsNumber(s) ? (unsigned)s->valuedouble : 0;
                else if (!strcmp(s->string, "max_tokens"))
                    o->set.max_tokens = cJSON_IsNumber(s) ? (unsigned)s->valuedouble : 0;
            }
        }
    }
    /* A conversation: the newest live connection's now, else the next connection's. */
    struct oi_conn *live = messages ? newest_live(q->owner) : NULL;
    if (live)
        target = ad_session_get(q->owner, live->sess->id);
    if (messages && !target) {
        cJSON_Delete(o->messages);
        o->messages = messages;
        messages = NULL;
    }
    pthread_mutex_unlock(&lock);
    if (target) {
        struct ad_fail f;
        int rc = ad_chat_restore(target, messages, &f);
        if (rc == 0) {
            pthread_mutex_lock(&lock);
            for (struct oi_conn *k = conns; k; k = k->next)
                if (k->sess == target) {
                    cJSON_Delete(k->messages);
                    k->messages = messages;
                    messages = NULL;
                }
            pthread_mutex_unlock(&lock);
        }
        ad_session_put(target);
        cJSON_Delete(messages);
        if (rc < 0)
            return detail(c, q, (unsigned)f.status, "%s", f.msg);
    }
    cJSON *ok = cJSON_CreateObject();
    cJSON_AddStringToObject(ok, "status", "success");
    return ad_reply_json(c, q, 200, ok);
}

static enum MHD_Result settings_get(struct MHD_Connection *c, struct ad_req *q)
{
    const char *name = q->params[0];
    cJSON *o = cJSON_CreateObject(), *v = NULL;
    pthread_mutex_lock(&lock);
    struct oi_owner *w = owner_of(q->owner);
    if (w && !strcmp(name, "auto_run")) {
        v = cJSON_CreateBool(w->set.auto_run);
    } else if (w && (!strcmp(name, "custom_instructions") || !strcmp(name, "system_message"))) {
        const char *t = name[0] == 'c' ? w->set.custom_instructions : w->set.system_message;
        v = cJSON_CreateString(t ? t : "");
    } else if (w && !strcmp(name, "max_output")) {
        v = cJSON_CreateNumber(w->set.max_output ? w->set.max_output : AL_CHAT_MAX_OUTPUT_DEFAULT);
    } else if (w && !strcmp(name, "llm")) {
        v = cJSON_CreateObject();
        cJSON_AddStringToObject(v, "model", w->set.model[0] ? w->set.model : ad_cfg.model);
        if (w->set.has_temperature)
            cJSON_AddNumberToObject(v, "temperature", w->set.temperature);
        else
            cJSON_AddNullToObject(v, "temperature");
        cJSON_AddNumberToObject(v, "context_window", w->set.context_window);
        cJSON_AddNumberToObject(v, "max_tokens", w->set.max_tokens);
    } else if (w && !strcmp(name, "messages")) {
        struct oi_conn *k = newest_live(q->owner);
        v = k && k->messages ? cJSON_Duplicate(k->messages, true)
            : w->messages    ? cJSON_Duplicate(w->messages, true)
                             : cJSON_CreateArray();
    }
    pthread_mutex_unlock(&lock);
    if (!v) {
        cJSON_Delete(o);
        return detail(c, q, 404, "Setting not found");
    }
    cJSON_AddItemToObject(o, name, v);
    return ad_reply_json(c, q, 200, o);
}

/* POST /run's output: console text (bounded) and images, as Open Interpreter's computer.run. */
struct run_out {
    char *text;
    size_t len;
    bool cut;
    cJSON *images;
    char error[300];
};

static void run_event(void *ctx, const char *type, const char *json, size_t len)
{
    struct run_out *o = ctx;
    cJSON *d = cJSON_ParseWithLength(json, len);
    if (!strcmp(type, "output")) {
        const char *s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(d, "data_b64"));
        size_t n = 0;
        uint8_t *b = s ? ad_base64_decode(s, &n) : NULL;
        if (b && o->len + n > OI_RUN_OUTPUT_MAX) {
            n = OI_RUN_OUTPUT_MAX - o->len;
            o->cut = true;
        }
        char *grown = b && n ? realloc(o->text, o->len + n + 1) : NULL;
        if (grown) {
            memcpy(grown + o->len, b, n);
            o->len += n;
            grown[o->len] = 0;
            o->text = grown;
        }
        free(b);
    } else if (!strcmp(type, "result")) {
        const char *png = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(d, "data"), "image/png"));
        if (png && o->images) {
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", "computer");
            cJSON_AddStringToObject(m, "type", "image");
            cJSON_AddStringToObject(m, "format", "base64.png");
            cJSON_AddStringToObject(m, "content", png);
            cJSON_AddItemToArray(o->images, m);
        }
    } else if (!strcmp(type, "error")) {
        const char *s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(d, "message"));
        snprintf(o->error, sizeof(o->error), "%s", s ? s : "the run failed");
    }
    cJSON_Delete(d);
}

static enum MHD_Result run_post(struct MHD_Connection *c, struct ad_req *q)
{
    const char *lang = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(q->json, "language"));
    const char *code = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(q->json, "code"));
    if (!lang || !code)
        return detail(c, q, 400, "Both 'language' and 'code' are required.");
    pthread_mutex_lock(&lock);
    struct oi_conn *k = newest_live(q->owner);
    char id[64] = "";
    if (k)
        snprintf(id, sizeof(id), "%s", k->sess->id);
    pthread_mutex_unlock(&lock);
    struct ad_session *s = id[0] ? ad_session_get(q->owner, id) : NULL;
    if (!s)
        return detail(c, q, 409,
                      "no interpreter of this key is connected: open the WebSocket "
                      "first (its session is where code runs)");
    struct ad_exec_req er = {.code = code, .language = lang, .kernel = true};
    cJSON *out = NULL;
    struct ad_fail f;
    if (ad_run_start(s, &er, &q->lim, &out, &f) < 0) {
        ad_session_put(s);
        return detail(c, q, (unsigned)f.status, "%s", f.msg);
    }
    const char *rid = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(out, "id"));
    struct ad_run *r = rid ? ad_run_get(s, rid) : NULL;
    cJSON_Delete(out);
    ad_session_put(s);
    if (!r)
        return detail(c, q, 500, "the run is gone");
    int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    struct run_out o = {.images = cJSON_CreateArray()};
    if (efd >= 0)
        ad_run_notify(r, efd);
    uint64_t last = 0;
    bool done = false;
    for (;;) {
        last = ad_run_read(r, last, run_event, &o, &done);
        if (done)
            break;
        struct pollfd p = {efd, POLLIN, 0};
        if (poll(&p, 1, 1000) > 0) {
            uint64_t v;
            if (read(efd, &v, sizeof(v)) < 0) {
            }
        }
    }
    ad_run_notify(r, -1);
    if (efd >= 0)
        close(efd);
    ad_run_put(r);
    cJSON *body = cJSON_CreateObject(), *list = cJSON_AddArrayToObject(body, "output");
    if (o.len || !cJSON_GetArraySize(o.images)) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "computer");
        cJSON_AddStringToObject(m, "type", "console");
        cJSON_AddStringToObject(m, "format", "output");
        char *t = al_utf8_repair((const uint8_t *)(o.text ? o.text : ""), o.len, NULL);
        cJSON_AddStringToObject(m, "content", t ? t : "");
        free(t);
        cJSON_AddItemToArray(list, m);
    }
    cJSON *img;
    while ((img = cJSON_DetachItemFromArray(o.images, 0)))
        cJSON_AddItemToArray(list, img);
    if (o.cut)
        cJSON_AddBoolToObject(body, "truncated", true);
    free(o.text);
    cJSON_Delete(o.images);
    if (o.error[0]) {
        cJSON_Delete(body);
        return detail(c, q, 500, "%s", o.error);
    }
    return ad_reply_json(c, q, 200, body);
}

static const struct ad_route routes[] = {
    {"GET", "/heartbeat", AD_NO_SESSION | AD_NO_AUTH, heartbeat, "alive"},
    {"GET", "/", AD_NO_SESSION, root, "the WebSocket (LMC chunks)"},
    {"POST", "/settings", AD_NO_SESSION | AD_BODY_JSON, settings_post, "the key's settings"},
    {"GET", "/settings/{name}", AD_NO_SESSION, settings_get, "one setting"},
    {"POST", "/run", AD_NO_SESSION | AD_BODY_JSON, run_post, "code in the newest session"},
};

enum MHD_Result ad_oi_route(struct MHD_Connection *c, struct ad_req *q, const char *url,
                            const char *method, bool *ok)
{
    *ok = false;
    q->lim = ad_cfg.limits;
    size_t ul = strcspn(url, "?");
    bool known = false;
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]) && !q->route; i++) {
        const char *p = routes[i].pattern, *brace = strchr(p, '{');
        size_t pl = brace ? (size_t)(brace - p) : strlen(p);
        bool hit = brace ? ul > pl && !strncmp(url, p, pl) && !memchr(url + pl, '/', ul - pl) &&
                               ul - pl < sizeof(q->params[0])
                         : ul == pl && !strncmp(url, p, pl);
        if (!hit)
            continue;
        known = true;
        if (strcmp(routes[i].method, method))
            continue;
        q->route = &routes[i];
        if (brace)
            snprintf(q->params[0], sizeof(q->params[0]), "%.*s", (int)(ul - pl), url + pl);
    }
    if (!q->route)
        return detail(c, q, known ? 405 : 404, known ? "%s is not allowed here" : "Not Found",
                      method);
    if (!(q->route->flags & AD_NO_AUTH)) {
        /* Open Interpreter's X-API-KEY, or a Bearer header; the WebSocket may sign in later */
        const char *key = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-API-KEY");
        const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
        if (!key && h && !strncasecmp(h, "Bearer ", 7))
            key = h + 7;
        struct ad_key k;
        if (key && key_ok(key, &k)) {
            snprintf(q->owner, sizeof(q->owner), "key:%s", k.id);
            ad_limits_apply(&q->lim, &k.lim);
        } else if (key || q->route->fn != root) {
            ad_metrics_error("unauthorized");
            return detail(c, q, 403, "Authentication failed");
        }
    }
    *ok = true;
    return MHD_YES;
}

void ad_oi_shutdown(void)
{
    pthread_mutex_lock(&lock);
    stopping = true;
    for (struct oi_conn *k = conns; k; k = k->next)
        ad_eventfd_wake(k->efd);
    while (nconns)
        pthread_cond_wait(&gone_cv, &lock);
    while (owners) {
        struct oi_owner *o = owners;
        owners = o->next;
        free(o->set.system_message);
        free(o->set.custom_instructions);
        cJSON_Delete(o->messages);
        free(o);
    }
    pthread_mutex_unlock(&lock);
}

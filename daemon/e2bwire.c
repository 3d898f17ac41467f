/* E2B's wire forms (e2bwire.h): Connect envelopes, events as envd's and the interpreter's,
 * and the guest's directory watcher read with bounds. No HTTP here. */
#include "e2bwire.h"

#include "airlockd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- Connect envelopes ---- */

char *ad_e2b_envelope(unsigned flags, const char *json, size_t n, size_t *len)
{
    char *b = malloc(5 + n);
    if (!b)
        return NULL;
    b[0] = (char)flags;
    b[1] = (char)(n >> 24), b[2] = (char)(n >> 16), b[3] = (char)(n >> 8), b[4] = (char)n;
    memcpy(b + 5, json, n);
    *len = 5 + n;
    return b;
}

char *ad_e2b_envelope_json(unsigned flags, cJSON *o, size_t *len)
{
    char *j = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!j)
        return NULL;
    char *b = ad_e2b_envelope(flags, j, strlen(j), len);
    free(j);
    return b;
}

cJSON *ad_e2b_envelope_parse(const char *body, size_t len)
{
    if (len < 5 || (body[0] & 0x01)) /* compressed: never asked for */
        return NULL;
    const unsigned char *b = (const unsigned char *)body;
    uint64_t n = ((uint64_t)b[1] << 24) | ((uint64_t)b[2] << 16) | ((uint64_t)b[3] << 8) | b[4];
    if (n > len - 5)
        return NULL;
    cJSON *o = cJSON_ParseWithLength(body + 5, (size_t)n);
    if (o && !cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* ---- processes ---- */

/* An event that ended a run with its session (runs.c's "session_ended"). */
static bool ended_with_session(const cJSON *d)
{
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(d, "session_ended"));
}

char *ad_e2b_fmt_process(void *ctx, const char *type, const char *json, size_t json_len,
                         size_t *len, bool *last)
{
    struct ad_e2b_pfmt *p = ctx;
    (void)last;
    cJSON *o = NULL, *ev = NULL;
    char *pre = NULL;
    size_t pre_len = 0;
    if (p->start_due) {
        p->start_due = false;
        cJSON *s = cJSON_CreateObject();
        cJSON *st = cJSON_AddObjectToObject(cJSON_AddObjectToObject(s, "event"), "start");
        cJSON_AddNumberToObject(st, "pid", p->pid);
        pre = ad_e2b_envelope_json(0, s, &pre_len);
    }
    cJSON *d = json ? cJSON_ParseWithLength(json, json_len) : NULL;
    if (ended_with_session(d)) { /* E2B's clients see the stream drop: "sandbox was killed" */
        cJSON_Delete(d);
        free(pre);
        *len = AD_RUN_FMT_ABORT;
        *last = true;
        return NULL;
    }
    if (!strcmp(type, "heartbeat")) {
        o = cJSON_CreateObject();
        cJSON_AddObjectToObject(cJSON_AddObjectToObject(o, "event"), "keepalive");
    } else if (!strcmp(type, "")) { /* the end of the stream */
        o = cJSON_CreateObject();
    } else if (!strcmp(type, "start")) {
        o = cJSON_CreateObject();
        ev = cJSON_AddObjectToObject(cJSON_AddObjectToObject(o, "event"), "start");
        cJSON_AddNumberToObject(ev, "pid", p->pid);
    } else if (!strcmp(type, "output") && d) {
        cJSON *st = cJSON_GetObjectItemCaseSensitive(d, "stream");
        cJSON *b64 = cJSON_GetObjectItemCaseSensitive(d, "data_b64");
        if (cJSON_IsString(st) && cJSON_IsString(b64)) {
            o = cJSON_CreateObject();
            ev = cJSON_AddObjectToObject(cJSON_AddObjectToObject(o, "event"), "data");
            cJSON_AddStringToObject(ev,
                                    p->pty                               ? "pty"
                                    : !strcmp(st->valuestring, "stderr") ? "stderr"
                                                                         : "stdout",
                                    b64->valuestring);
        }
    } else if (!strcmp(type, "exit") && d) {
        cJSON *how = cJSON_GetObjectItemCaseSensitive(d, "how");
        cJSON *v = cJSON_GetObjectItemCaseSensitive(d, "value");
        bool sig = cJSON_IsString(how) && !strcmp(how->valuestring, "signaled");
        int value = cJSON_IsNumber(v) ? v->valueint : -1;
        o = cJSON_CreateObject();
        ev = cJSON_AddObjectToObject(cJSON_AddObjectToObject(o, "event"), "end");
        cJSON_AddNumberToObject(ev, "exitCode", sig ? -1 : value);
        cJSON_AddBoolToObject(ev, "exited", !sig);
        char status[64];
        snprintf(status, sizeof(status), "exit status %d", value);
        if (sig)
            snprintf(status, sizeof(status), "signal: %s",
                     value == 9    ? "killed"
                     : value == 15 ? "terminated"
                                   : "signaled");
        cJSON_AddStringToObject(ev, "status", status);
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(d, "timed_out")))
            cJSON_AddStringToObject(ev, "error", "the process ran past its deadline");
    } else if (!strcmp(type, "error") && d) {
        cJSON *m = cJSON_GetObjectItemCaseSensitive(d, "message");
        o = cJSON_CreateObject();
        ev = cJSON_AddObjectToObject(cJSON_AddObjectToObject(o, "event"), "end");
        cJSON_AddNumberToObject(ev, "exitCode", -1);
        cJSON_AddBoolToObject(ev, "exited", false);
        cJSON_AddStringToObject(ev, "status", "error");
        cJSON_AddStringToObject(ev, "error", cJSON_IsString(m) ? m->valuestring : "failed");
    }
    cJSON_Delete(d);
    size_t n = 0;
    char *b = o ? ad_e2b_envelope_json(!strcmp(type, "") ? 2 : 0, o, &n) : NULL;
    if (pre) {
        char *both = malloc(pre_len + n);
        if (both) {
            memcpy(both, pre, pre_len);
            if (b)
                memcpy(both + pre_len, b, n);
        }
        free(pre);
        free(b);
        *len = pre_len + n;
        return both;
    }
    *len = n;
    return b;
}

/* ---- the code interpreter ---- */

struct out {
    char *p;
    size_t n;
};

static void out_line(struct out *b, cJSON *o)
{
    char *j = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    size_t n = j ? strlen(j) : 0;
    char *g = j ? realloc(b->p, b->n + n + 1) : NULL;
    if (g) {
        memcpy(g + b->n, j, n);
        g[b->n + n] = '\n';
        b->p = g;
        b->n += n + 1;
    }
    free(j);
}

static void flush_held(struct ad_e2b_cifmt *x, int i, struct out *b)
{
    if (!x->held_len[i])
        return;
    char *text = al_utf8_repair((const uint8_t *)x->held[i], x->held_len[i], NULL);
    x->held_len[i] = 0;
    if (!text)
        return;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", i ? "stderr" : "stdout");
    cJSON_AddStringToObject(o, "text", text);
    cJSON_AddNumberToObject(o, "timestamp", (double)time(NULL) * 1e6);
    free(text);
    out_line(b, o);
}

static const struct {
    const char *mime, *key;
} mime_keys[] = {{"text/plain", "text"},        {"text/html", "html"},
                 {"text/markdown", "markdown"}, {"image/svg+xml", "svg"},
                 {"image/png", "png"},          {"image/jpeg", "jpeg"},
                 {"application/json", "json"},  {"text/latex", "latex"},
                 {"application/pdf", "pdf"},    {"application/javascript", "javascript"}};

static cJSON *error_line(const char *name, const char *value, const char *tb)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "error");
    cJSON_AddStringToObject(o, "name", name);
    cJSON_AddStringToObject(o, "value", value);
    cJSON_AddStringToObject(o, "traceback", tb);
    return o;
}

char *ad_e2b_fmt_execute(void *ctx, const char *type, const char *json, size_t json_len,
                         size_t *len, bool *last)
{
    struct ad_e2b_cifmt *x = ctx;
    (void)last;
    struct out b = {0};
    cJSON *d = json ? cJSON_ParseWithLength(json, json_len) : NULL;
    if (ended_with_session(d)) { /* the SDK's runCode raises, as on E2B, instead of a result */
        cJSON_Delete(d);
        *len = AD_RUN_FMT_ABORT;
        *last = true;
        return NULL;
    }
    if (!strcmp(type, "output") && d) {
        cJSON *st = cJSON_GetObjectItemCaseSensitive(d, "stream");
        cJSON *b64 = cJSON_GetObjectItemCaseSensitive(d, "data_b64");
        int i = cJSON_IsString(st) && !strcmp(st->valuestring, "stderr");
        size_t n = 0;
        uint8_t *raw = cJSON_IsString(b64) ? ad_base64_decode(b64->valuestring, &n) : NULL;
        /* never realloc to 0 bytes: that frees (glibc) and would leave held[i] dangling */
        char *g = raw && n ? realloc(x->held[i], x->held_len[i] + n) : NULL;
        if (g) {
            memcpy(g + x->held_len[i], raw, n);
            x->held[i] = g;
            x->held_len[i] += n;
        }
        free(raw);
        if (x->held_len[i] &&
            (x->held[i][x->held_len[i] - 1] == '\n' || x->held_len[i] >= AD_E2B_HELD_MAX))
            flush_held(x, i, &b);
        cJSON_Delete(d);
        *len = b.n;
        return b.p;
    }
    flush_held(x, 0, &b); /* anything else: what was held goes first */
    flush_held(x, 1, &b);
    if (!strcmp(type, "heartbeat")) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "type", "keepalive");
        out_line(&b, o);
    } else if (!strcmp(type, "result") && d) {
        cJSON *t = cJSON_GetObjectItemCaseSensitive(d, "type");
        if (cJSON_IsString(t) && !strcmp(t->valuestring, "error")) {
            cJSON *n = cJSON_GetObjectItemCaseSensitive(d, "name");
            cJSON *v = cJSON_GetObjectItemCaseSensitive(d, "value");
            cJSON *tb = cJSON_GetObjectItemCaseSensitive(d, "traceback");
            out_line(&b, error_line(cJSON_IsString(n) ? n->valuestring : "",
                                    cJSON_IsString(v) ? v->valuestring : "",
                                    cJSON_IsString(tb) ? tb->valuestring : ""));
        } else if (cJSON_IsString(t) && !strcmp(t->valuestring, "result")) {
            cJSON *kind = cJSON_GetObjectItemCaseSensitive(d, "kind");
            cJSON *data = cJSON_GetObjectItemCaseSensitive(d, "data");
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "type", "result");
            for (size_t i = 0; i < sizeof(mime_keys) / sizeof(*mime_keys); i++) {
                cJSON *v = cJSON_GetObjectItemCaseSensitive(data, mime_keys[i].mime);
                if (!v)
                    continue;
                size_t n = cJSON_IsString(v) ? strlen(v->valuestring) : 0;
                /* E2B's server gives a string value's text without its quotes ('bar' is
                 * bar): its code interpreter's result.py does so */
                if (i == 0 && n >= 2 && (v->valuestring[0] == '\'' || v->valuestring[0] == '"') &&
                    v->valuestring[n - 1] == v->valuestring[0]) {
                    char *bare = strndup(v->valuestring + 1, n - 2);
                    cJSON_AddStringToObject(o, mime_keys[i].key, bare ? bare : "");
                    free(bare);
                    continue;
                }
                cJSON_AddItemToObject(o, mime_keys[i].key, cJSON_Duplicate(v, true));
            }
            cJSON_AddBoolToObject(o, "is_main_result",
                                  cJSON_IsString(kind) && !strcmp(kind->valuestring, "value"));
            out_line(&b, o);
        }
    } else if (!strcmp(type, "exit") && d) {
        cJSON *n = cJSON_GetObjectItemCaseSensitive(d, "execution_count");
        cJSON *a = cJSON_CreateObject();
        cJSON_AddStringToObject(a, "type", "number_of_executions");
        cJSON_AddNumberToObject(a, "execution_count", cJSON_IsNumber(n) ? n->valuedouble : 0);
        out_line(&b, a);
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(d, "timed_out")))
            out_line(&b, error_line("TimeoutError", "the execution ran past its timeout", ""));
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "type", "end_of_execution");
        out_line(&b, e);
    } else if (!strcmp(type, "error") && d) {
        cJSON *m = cJSON_GetObjectItemCaseSensitive(d, "message");
        out_line(&b,
                 error_line("ExecutionError", cJSON_IsString(m) ? m->valuestring : "failed", ""));
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "type", "end_of_execution");
        out_line(&b, e);
    }
    cJSON_Delete(d);
    *len = b.n;
    return b.p;
}

void ad_e2b_cifmt_clear(struct ad_e2b_cifmt *x)
{
    free(x->held[0]);
    free(x->held[1]);
    x->held[0] = x->held[1] = NULL;
    x->held_len[0] = x->held_len[1] = 0;
}

/* ---- the directory watcher (guest-agent/watch.c) ---- */

static const struct {
    const char *word, *type;
} watch_kinds[] = {{"create", "EVENT_TYPE_CREATE"},
                   {"write", "EVENT_TYPE_WRITE"},
                   {"remove", "EVENT_TYPE_REMOVE"},
                   {"rename", "EVENT_TYPE_RENAME"},
                   {"chmod", "EVENT_TYPE_CHMOD"}};

static void watch_fail(struct ad_e2b_watch *w, const char *code, const char *msg)
{
    w->failed = true;
    snprintf(w->code, sizeof(w->code), "%s", code);
    snprintf(w->msg, sizeof(w->msg), "%s", msg);
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* One whole line (no newline, NUL-terminated). */
static void watch_line(struct ad_e2b_watch *w, char *line, size_t n, cJSON *events)
{
    if (!w->started) {
        if (!strcmp(line, "ok")) {
            w->started = true;
        } else if (!strcmp(line, "err not_found")) {
            watch_fail(w, "not_found", "no such directory");
        } else if (!strcmp(line, "err not_dir")) {
            watch_fail(w, "invalid_argument", "the path is not a directory");
        } else if (!strcmp(line, "err denied")) {
            watch_fail(w, "permission_denied", "the directory cannot be watched: denied");
        } else if (!strncmp(line, "err ", 4)) {
            watch_fail(w, "internal", "the directory cannot be watched");
        } else {
            watch_fail(w, "internal", "the guest's watcher did not start as it should");
        }
        return;
    }
    if (!strcmp(line, "overflow")) { /* the guest's queue overflowed: events were lost */
        w->overflows++;
        return;
    }
    const char *sp = memchr(line, ' ', n);
    size_t kind_len = sp ? (size_t)(sp - line) : n;
    const char *type = NULL;
    for (size_t i = 0; i < sizeof(watch_kinds) / sizeof(*watch_kinds); i++)
        if (strlen(watch_kinds[i].word) == kind_len && !memcmp(line, watch_kinds[i].word, kind_len))
            type = watch_kinds[i].type;
    const char *hex = sp ? sp + 1 : NULL;
    size_t hex_len = hex ? n - kind_len - 1 : 0;
    if (!type || !hex || !hex_len || hex_len % 2 || hex_len / 2 > AD_E2B_WATCH_NAME_MAX) {
        watch_fail(w, "internal", "the guest's watcher sent a line that is not an event");
        return;
    }
    char name[AD_E2B_WATCH_NAME_MAX + 1];
    size_t len = hex_len / 2;
    for (size_t i = 0; i < len; i++) {
        int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0 || (hi << 4 | lo) == 0) { /* a name holds no NUL */
            watch_fail(w, "internal", "the guest's watcher sent a name that is not hex");
            return;
        }
        name[i] = (char)(hi << 4 | lo);
    }
    name[len] = 0;
    cJSON *ev = cJSON_CreateObject();
    ad_json_add_text(ev, "name", name); /* any bytes: made valid UTF-8 */
    cJSON_AddStringToObject(ev, "type", type);
    cJSON_AddItemToArray(events, ev);
}

void ad_e2b_watch_feed(struct ad_e2b_watch *w, const uint8_t *data, size_t n, cJSON *events)
{
    for (size_t i = 0; i < n && !w->failed; i++) {
        if (data[i] != '\n') {
            if (w->len == sizeof(w->line) - 1) {
                watch_fail(w, "internal", "the guest's watcher sent a line past its bound");
                return;
            }
            w->line[w->len++] = (char)data[i];
            continue;
        }
        w->line[w->len] = 0;
        if (strlen(w->line) != w->len)
            watch_fail(w, "internal", "the guest's watcher sent a NUL byte");
        else
            watch_line(w, w->line, w->len, events);
        w->len = 0;
    }
}

void ad_e2b_watch_event(struct ad_e2b_watch *w, const char *type, const char *json, size_t json_len,
                        cJSON *events)
{
    if (w->failed)
        return;
    bool end = !strcmp(type, "exit") || !strcmp(type, "error") || !strcmp(type, "");
    if (end) {
        if (!w->started)
            watch_fail(w, "internal", "the guest's watcher ended before it watched");
        return;
    }
    if (strcmp(type, "output") || !json)
        return;
    cJSON *d = cJSON_ParseWithLength(json, json_len);
    cJSON *st = cJSON_GetObjectItemCaseSensitive(d, "stream");
    cJSON *b64 = cJSON_GetObjectItemCaseSensitive(d, "data_b64");
    size_t n = 0;
    uint8_t *raw = cJSON_IsString(st) && !strcmp(st->valuestring, "stdout") && cJSON_IsString(b64)
                       ? ad_base64_decode(b64->valuestring, &n)
                       : NULL;
    if (raw)
        ad_e2b_watch_feed(w, raw, n, events);
    free(raw);
    cJSON_Delete(d);
}

cJSON *ad_e2b_watch_end(const struct ad_e2b_watch *w)
{
    cJSON *o = cJSON_CreateObject();
    if (w->failed) {
        cJSON *e = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(e, "code", w->code);
        cJSON_AddStringToObject(e, "message", w->msg);
    }
    return o;
}

/* Appends an envelope of o (taken) to *b. */
static void append_envelope(struct out *b, unsigned flags, cJSON *o)
{
    size_t n;
    char *e = ad_e2b_envelope_json(flags, o, &n);
    char *g = e ? realloc(b->p, b->n + n) : NULL;
    if (g) {
        memcpy(g + b->n, e, n);
        b->p = g;
        b->n += n;
    }
    free(e);
}

char *ad_e2b_fmt_watch(void *ctx, const char *type, const char *json, size_t json_len, size_t *len,
                       bool *last)
{
    struct ad_e2b_wfmt *x = ctx;
    struct out b = {0};
    if (!strcmp(type, "heartbeat")) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddObjectToObject(o, "keepalive");
        append_envelope(&b, 0, o);
    } else {
        cJSON *events = cJSON_CreateArray();
        ad_e2b_watch_event(&x->w, type, json, json_len, events);
        if (x->w.started && !x->start_sent) {
            x->start_sent = true;
            cJSON *o = cJSON_CreateObject();
            cJSON_AddObjectToObject(o, "start");
            append_envelope(&b, 0, o);
        }
        cJSON *ev;
        while ((ev = cJSON_DetachItemFromArray(events, 0))) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddItemToObject(o, "filesystem", ev);
            append_envelope(&b, 0, o);
        }
        cJSON_Delete(events);
        bool end = !strcmp(type, "exit") || !strcmp(type, "error") || !strcmp(type, "");
        if (x->w.failed || end) {
            append_envelope(&b, 2, ad_e2b_watch_end(&x->w));
            *last = true;
        }
    }
    *len = b.n;
    return b.p;
}

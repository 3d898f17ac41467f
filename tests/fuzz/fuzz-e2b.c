/* Fuzz target for E2B's wire forms (daemon/e2bwire.c). The first input byte picks what the rest
 * is:
 *   0  a streaming call's request body (a client's envelope): parsed or refused; what parses is
 *      an object that survives being written as an envelope and parsed again;
 *   1  a guest watcher's stdout (guest-agent/watch.c prints it; a hostile guest prints
 *      anything), its second byte where it is cut: fed whole and in two pieces, the events,
 *      the start and the failure are the same; every event is of a known type with a name
 *      within bounds, valid UTF-8;
 *   2  a run's events (type byte, length byte, bytes) through the watch, process and
 *      interpreter formatters: each answer is whole envelopes of JSON objects (JSON lines for
 *      the interpreter), the watch stream ends once, with an end envelope last.
 * Any violation aborts. */
#include "../../daemon/airlockd.h"
#include "../../daemon/e2bwire.h"
#include "fuzz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void fail(const char *what)
{
    fprintf(stderr, "fuzz-e2b: %s\n", what);
    abort();
}

/* Valid UTF-8 with no NUL (what the SDK's JSON parser takes as it is). */
static bool utf8_ok(const char *s)
{
    bool lossy = false;
    char *r = al_utf8_repair((const uint8_t *)s, strlen(s), &lossy);
    bool same = r && !strcmp(r, s) && !lossy;
    free(r);
    return same;
}

/* buf is whole envelopes, each a JSON object; the flags of the last in *last_flags. */
static size_t check_envelopes(const char *buf, size_t len, unsigned *last_flags)
{
    size_t at = 0, count = 0;
    while (at < len) {
        if (len - at < 5)
            fail("a cut envelope header");
        const unsigned char *b = (const unsigned char *)buf + at;
        size_t n = ((size_t)b[1] << 24) | ((size_t)b[2] << 16) | ((size_t)b[3] << 8) | b[4];
        if (n > len - at - 5)
            fail("an envelope longer than the bytes");
        if (b[0] != 0 && b[0] != 2)
            fail("envelope flags other than 0 and 2");
        cJSON *o = cJSON_ParseWithLength(buf + at + 5, n);
        if (!cJSON_IsObject(o))
            fail("an envelope that is not a JSON object");
        cJSON_Delete(o);
        *last_flags = b[0];
        at += 5 + n;
        count++;
    }
    return count;
}

static void check_event(cJSON *ev)
{
    static const char *const types[] = {"EVENT_TYPE_CREATE", "EVENT_TYPE_WRITE",
                                        "EVENT_TYPE_REMOVE", "EVENT_TYPE_RENAME",
                                        "EVENT_TYPE_CHMOD"};
    cJSON *name = cJSON_GetObjectItemCaseSensitive(ev, "name");
    cJSON *type = cJSON_GetObjectItemCaseSensitive(ev, "type");
    if (!cJSON_IsString(name) || !cJSON_IsString(type))
        fail("an event without its name and type");
    bool known = false;
    for (size_t i = 0; i < sizeof(types) / sizeof(*types); i++)
        known |= !strcmp(type->valuestring, types[i]);
    if (!known)
        fail("an event of an unknown type");
    /* each byte of the name at most 3 bytes once repaired */
    if (!name->valuestring[0] || strlen(name->valuestring) > 3 * AD_E2B_WATCH_NAME_MAX ||
        !utf8_ok(name->valuestring))
        fail("an event name empty, too long or not UTF-8");
}

static char *watch_run(const uint8_t *in, size_t n, size_t cut, struct ad_e2b_watch *w)
{
    memset(w, 0, sizeof(*w));
    cJSON *events = cJSON_CreateArray();
    ad_e2b_watch_feed(w, in, cut, events);
    ad_e2b_watch_feed(w, in + cut, n - cut, events);
    cJSON *ev;
    cJSON_ArrayForEach(ev, events) check_event(ev);
    if (w->len >= sizeof(w->line))
        fail("a held line past its buffer");
    if (w->failed && (!w->code[0] || !w->msg[0]))
        fail("a failure without its code and sentence");
    if (cJSON_GetArraySize(events) && !w->started)
        fail("events before the start");
    char *s = cJSON_PrintUnformatted(events);
    cJSON_Delete(events);
    return s;
}

static void fuzz_watch(const uint8_t *in, size_t n)
{
    if (!n)
        return;
    size_t cut = in[0] % n;
    in++, n--;
    cut = cut > n ? n : cut;
    static struct ad_e2b_watch a, b;
    char *whole = watch_run(in, n, 0, &a);
    char *split = watch_run(in, n, cut, &b);
    /* a failure stops the reading: what came before it is the same either way */
    if (!whole || !split || strcmp(whole, split) || a.started != b.started ||
        a.failed != b.failed || strcmp(a.code, b.code))
        fail("the stream cut in two read differently");
    free(whole);
    free(split);
}

static void fuzz_envelope(const uint8_t *in, size_t n)
{
    cJSON *o = ad_e2b_envelope_parse((const char *)in, n);
    if (!o)
        return;
    if (!cJSON_IsObject(o))
        fail("a request that is not an object");
    cJSON *copy = cJSON_Duplicate(o, true);
    size_t len;
    char *env = ad_e2b_envelope_json(0, copy, &len);
    cJSON *back = env ? ad_e2b_envelope_parse(env, len) : NULL;
    if (!back || !cJSON_Compare(o, back, true))
        fail("a request written as an envelope reads back otherwise");
    cJSON_Delete(back);
    free(env);
    cJSON_Delete(o);
}

/* The events: [type][len][bytes]; output bytes are base64'd into an output event as runs.c
 * makes them, the rest is taken as the event's JSON as it is. */
static void fuzz_formatters(const uint8_t *in, size_t n)
{
    static const char *const types[] = {"output",    "exit",  "error",  "result",
                                        "heartbeat", "start", "stderr", ""};
    struct ad_e2b_wfmt *wf = calloc(1, sizeof(*wf));
    struct ad_e2b_pfmt pf = {.pid = 7, .pty = n & 1, .start_due = true};
    struct ad_e2b_cifmt cf = {0};
    bool watch_ended = false;
    size_t at = 0;
    while (at + 2 <= n) {
        const char *type = types[in[at] % (sizeof(types) / sizeof(*types))];
        size_t len = in[at + 1];
        at += 2;
        len = len > n - at ? n - at : len;
        char *json = NULL;
        if (!strcmp(type, "output") || !strcmp(type, "stderr")) {
            char *b64 = ad_base64(in + at, len);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "stream", !strcmp(type, "stderr") ? "stderr" : "stdout");
            cJSON_AddStringToObject(o, "data_b64", b64 ? b64 : "");
            free(b64);
            json = cJSON_PrintUnformatted(o);
            cJSON_Delete(o);
            type = "output";
        } else {
            json = malloc(len + 1);
            memcpy(json, in + at, len);
            json[len] = 0;
        }
        at += len;
        const char *jarg = type[0] && strcmp(type, "heartbeat") ? json : NULL;
        size_t jlen = jarg ? strlen(jarg) : 0;
        size_t out_len = 0;
        unsigned flags = 0;
        bool last = false;
        if (!watch_ended) {
            char *out = ad_e2b_fmt_watch(wf, type, jarg, jlen, &out_len, &last);
            size_t k = check_envelopes(out, out ? out_len : 0, &flags);
            if (last && (!k || flags != 2))
                fail("a watch stream that ends without an end envelope last");
            if (!last && k && flags == 2)
                fail("an end envelope in a watch stream that goes on");
            watch_ended = last;
            free(out);
        }
        last = false;
        char *out = ad_e2b_fmt_process(&pf, type, jarg, jlen, &out_len, &last);
        check_envelopes(out, out ? out_len : 0, &flags);
        free(out);
        out = ad_e2b_fmt_execute(&cf, type, jarg, jlen, &out_len, &last);
        for (size_t i = 0; out && i < out_len;) {
            const char *nl = memchr(out + i, '\n', out_len - i);
            if (!nl)
                fail("an interpreter line without its newline");
            cJSON *o = cJSON_ParseWithLength(out + i, (size_t)(nl - (out + i)));
            if (!cJSON_IsObject(o))
                fail("an interpreter line that is not a JSON object");
            cJSON_Delete(o);
            i = (size_t)(nl - out) + 1;
        }
        free(out);
        free(json);
    }
    ad_e2b_cifmt_clear(&cf);
    free(wf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!size)
        return 0;
    switch (data[0] % 3) {
    case 0:
        fuzz_envelope(data + 1, size - 1);
        break;
    case 1:
        fuzz_watch(data + 1, size - 1);
        break;
    default:
        fuzz_formatters(data + 1, size - 1);
    }
    return 0;
}

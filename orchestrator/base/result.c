/* Results of a kernel run: the records the guest sends on stream AL_STREAM_RESULT, read as
 * hostile. Each record is a u32 length and that many bytes of JSON (docs/PROTOCOL.md,
 * "Results"). The reader holds one record at a time, never more than AL_RESULT_RECORD_MAX
 * bytes: a bigger one is skipped as it streams by and reported as refused, and so is one that
 * does not parse, names no known MIME type, carries text that is not UTF-8 or an image whose
 * bytes are not of its kind. Fuzzed by tests/fuzz/fuzz-result.c. */
#include "result.h"
#include "airlock-proto.h"
#include "util.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct al_result_reader {
    uint8_t head[4];    /* the length being read */
    uint32_t head_got;  /* bytes of head so far */
    uint32_t want;      /* the record's length */
    uint32_t got;       /* bytes of the record so far (kept or skipped) */
    bool skipping;      /* over the limit: counted, not kept */
    uint8_t *buf;       /* the record, grown as it arrives */
    size_t cap;         /* buf's size */
    unsigned records;   /* records seen in this run */
    bool have_count;    /* a count record came */
    unsigned count;     /* its execution_count */
    bool error;         /* an error record came */
    unsigned delivered; /* results handed to the callback */
    unsigned refused;   /* records refused */
};

// clang-format off
static const char *const mime_types[] = {
    "text/plain", "text/html", "text/markdown", "image/png", "image/jpeg", "image/svg+xml",
    "application/json", "text/latex",
};
// clang-format on

int al_result_reader_new(al_result_reader **out, al_error *err)
{
    al_result_reader *rd = calloc(1, sizeof(*rd));
    if (!rd)
        return al_err(err, -ENOMEM, "out of memory");
    *out = rd;
    return 0;
}

void al_result_reader_free(al_result_reader *rd)
{
    if (!rd)
        return;
    free(rd->buf);
    free(rd);
}

void al_result_reader_stats(const al_result_reader *rd, al_result_stats *out)
{
    *out = (al_result_stats){.have_count = rd->have_count,
                             .execution_count = rd->count,
                             .error = rd->error,
                             .results = rd->delivered,
                             .refused = rd->refused};
}

const al_mime *al_result_mime(const al_result *r, const char *type)
{
    for (size_t i = 0; i < r->nmime; i++)
        if (!strcmp(r->mime[i].type, type))
            return &r->mime[i];
    return NULL;
}

bool al_utf8_valid(const uint8_t *p, size_t n)
{
    for (size_t i = 0, k; i < n; i += k)
        if (!(k = al_utf8_len(p + i, n - i)))
            return false;
    return true;
}

/* One record parsed: the al_result handed out points into json and into the decoded images. */
struct parsed {
    al_result r;
    uint8_t *owned[AL_MIME_MAX]; /* decoded images, printed JSON */
    size_t nowned;
};

static void parsed_free(struct parsed *p)
{
    for (size_t i = 0; i < p->nowned; i++)
        free(p->owned[i]);
    p->nowned = 0;
}

static int base64_decode(const char *s, uint8_t **out, size_t *len)
{
    size_t n = strlen(s);
    if (n == 0 || n % 4)
        return -1;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        bool pad_ok = c == '=' && i >= n - 2 && (i == n - 1 || s[n - 1] == '=');
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '+' || c == '/' || pad_ok))
            return -1;
    }
    uint8_t *b = malloc(n / 4 * 3 + 1);
    if (!b)
        return -1;
    int got = EVP_DecodeBlock(b, (const unsigned char *)s, (int)n);
    if (got < 0) {
        free(b);
        return -1;
    }
    size_t pads = (s[n - 1] == '=') + (s[n - 2] == '=');
    *out = b;
    *len = (size_t)got - pads;
    return 0;
}

/* The bytes are an image of their kind; a PNG's size comes from its IHDR. */
static const char *image_check(const char *type, const uint8_t *p, size_t n, al_result *r)
{
    if (!strcmp(type, "image/png")) {
        static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
        if (n < 24 || memcmp(p, sig, 8) || memcmp(p + 12, "IHDR", 4))
            return "its image/png is not a PNG";
        r->width = (unsigned)p[16] << 24 | (unsigned)p[17] << 16 | (unsigned)p[18] << 8 | p[19];
        r->height = (unsigned)p[20] << 24 | (unsigned)p[21] << 16 | (unsigned)p[22] << 8 | p[23];
        return NULL;
    }
    if (n < 3 || p[0] != 0xff || p[1] != 0xd8 || p[2] != 0xff)
        return "its image/jpeg is not a JPEG";
    return NULL;
}

static const char *text_field(const cJSON *o, const char *key, bool required, const char **out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v) {
        *out = "";
        return required ? "a field is missing" : NULL;
    }
    if (!cJSON_IsString(v) || !v->valuestring)
        return "a field is not a string";
    if (!al_utf8_valid((const uint8_t *)v->valuestring, strlen(v->valuestring)))
        return "its text is not UTF-8";
    *out = v->valuestring;
    return NULL;
}

static const char *parse_bundle(const cJSON *data, struct parsed *p)
{
    if (!cJSON_IsObject(data))
        return "its data is not an object";
    const cJSON *item;
    cJSON_ArrayForEach(item, data)
    {
        const char *type = NULL;
        for (size_t i = 0; i < sizeof(mime_types) / sizeof(mime_types[0]); i++)
            if (item->string && !strcmp(item->string, mime_types[i]))
                type = mime_types[i];
        if (!type || al_result_mime(&p->r, type))
            continue; /* unknown types are left out; a repeated key counts once */
        al_mime *m = &p->r.mime[p->r.nmime];
        m->type = type;
        if (!strcmp(type, "application/json")) {
            char *json = cJSON_PrintUnformatted(item);
            if (!json)
                return "out of memory";
            p->owned[p->nowned++] = (uint8_t *)json;
            m->data = (const uint8_t *)json;
            m->len = strlen(json);
        } else if (!cJSON_IsString(item) || !item->valuestring) {
            return "a MIME value is not a string";
        } else if (!strncmp(type, "image/", 6) && strcmp(type, "image/svg+xml")) {
            uint8_t *b;
            size_t n;
            if (base64_decode(item->valuestring, &b, &n) < 0)
                return "an image is not base64";
            p->owned[p->nowned++] = b;
            const char *why = image_check(type, b, n, &p->r);
            if (why)
                return why;
            m->data = b;
            m->len = n;
        } else {
            size_t n = strlen(item->valuestring);
            if (!al_utf8_valid((const uint8_t *)item->valuestring, n))
                return "its text is not UTF-8";
            m->data = (const uint8_t *)item->valuestring;
            m->len = n;
        }
        p->r.nmime++;
    }
    return p->r.nmime ? NULL : "it has no known MIME type";
}

static const char *parse_count(const cJSON *o, unsigned *out)
{
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(o, "execution_count");
    if (!cJSON_IsNumber(c) || c->valuedouble < 0 || c->valuedouble > 4294967295.0 ||
        c->valuedouble != (double)(unsigned)c->valuedouble)
        return "its execution_count is not a count";
    *out = (unsigned)c->valuedouble;
    return NULL;
}

/* A record's body: a result for the caller (1), the count (0), or why it is refused. */
static const char *record_parse(al_result_reader *rd, const cJSON *o, struct parsed *p, int *kind)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "type");
    if (!cJSON_IsObject(o) || !cJSON_IsString(t) || !t->valuestring)
        return "it is not a typed object";
    if (!strcmp(t->valuestring, "count")) {
        unsigned c;
        const char *why = parse_count(o, &c);
        if (why)
            return why;
        rd->count = c;
        rd->have_count = true;
        *kind = -1;
        return NULL;
    }
    if (!strcmp(t->valuestring, "error")) {
        const char *why;
        if ((why = text_field(o, "name", true, &p->r.name)) ||
            (why = text_field(o, "value", false, &p->r.value)) ||
            (why = text_field(o, "traceback", false, &p->r.traceback)))
            return why;
        *kind = p->r.kind = AL_RESULT_ERROR;
        return NULL;
    }
    bool value = !strcmp(t->valuestring, "execute_result");
    if (!value && strcmp(t->valuestring, "display_data"))
        return "its type is unknown";
    p->r.kind = *kind = value ? AL_RESULT_VALUE : AL_RESULT_DISPLAY;
    if (value && cJSON_GetObjectItemCaseSensitive(o, "execution_count")) {
        const char *why = parse_count(o, &p->r.execution_count);
        if (why)
            return why;
    }
    return parse_bundle(cJSON_GetObjectItemCaseSensitive(o, "data"), p);
}

static int refuse(al_result_reader *rd, al_result_fn fn, void *ctx, const char *why)
{
    rd->refused++;
    if (!fn)
        return 0;
    al_result r = {.struct_size = sizeof(al_result), .kind = AL_RESULT_REFUSED, .why = why};
    return fn(ctx, &r);
}

static int record_done(al_result_reader *rd, al_result_fn fn, void *ctx)
{
    char why[160];
    rd->records++;
    if (rd->records > AL_RESULTS_PER_RUN_MAX) {
        if (rd->records > AL_RESULTS_PER_RUN_MAX + 1)
            return 0; /* said once */
        snprintf(why, sizeof(why), "more than %d results in one run: the rest are dropped",
                 AL_RESULTS_PER_RUN_MAX);
        return refuse(rd, fn, ctx, why);
    }
    if (rd->skipping) {
        snprintf(why, sizeof(why), "a result of %u bytes is over the limit of %d MiB", rd->want,
                 AL_RESULT_RECORD_MAX >> 20);
        return refuse(rd, fn, ctx, why);
    }
    cJSON *o = cJSON_ParseWithLength((const char *)rd->buf, rd->want);
    if (!o)
        return refuse(rd, fn, ctx, "a result is not JSON");
    struct parsed p = {.r = AL_RESULT_INIT};
    int kind = 0, r = 0;
    const char *bad = record_parse(rd, o, &p, &kind);
    if (bad) {
        snprintf(why, sizeof(why), "a result was refused: %s", bad);
        r = refuse(rd, fn, ctx, why);
    } else if (kind >= 0) {
        if (kind == AL_RESULT_ERROR)
            rd->error = true;
        rd->delivered++;
        r = fn ? fn(ctx, &p.r) : 0;
    }
    parsed_free(&p);
    cJSON_Delete(o);
    return r;
}

int al_result_reader_feed(al_result_reader *rd, const uint8_t *data, size_t len, al_result_fn fn,
                          void *ctx, al_error *err)
{
    while (len) {
        if (rd->head_got < 4) {
            rd->head[rd->head_got++] = *data++;
            len--;
            if (rd->head_got < 4)
                continue;
            rd->want = (uint32_t)rd->head[0] | (uint32_t)rd->head[1] << 8 |
                       (uint32_t)rd->head[2] << 16 | (uint32_t)rd->head[3] << 24;
            rd->got = 0;
            rd->skipping = rd->want > AL_RESULT_RECORD_MAX || rd->records >= AL_RESULTS_PER_RUN_MAX;
        }
        size_t take = rd->want - rd->got < len ? rd->want - rd->got : len;
        if (!rd->skipping && take) {
            /* Grown as bytes arrive, not as announced: a length costs the guest its bytes. */
            if (rd->got + take > rd->cap) {
                size_t cap = rd->cap ? rd->cap : 4096;
                while (cap < rd->got + take)
                    cap *= 2;
                if (cap > AL_RESULT_RECORD_MAX)
                    cap = AL_RESULT_RECORD_MAX;
                uint8_t *b = realloc(rd->buf, cap);
                if (!b)
                    return al_err(err, -ENOMEM, "out of memory for a result");
                rd->buf = b;
                rd->cap = cap;
            }
            memcpy(rd->buf + rd->got, data, take);
        }
        rd->got += (uint32_t)take;
        data += take;
        len -= take;
        if (rd->got == rd->want) {
            rd->head_got = 0;
            int r = record_done(rd, fn, ctx);
            if (r < 0)
                return al_err(err, r, "cannot take a result: %s", strerror(-r));
        }
    }
    /* Memory goes back once a big record is through. */
    if (rd->head_got == 0 && rd->cap > 65536) {
        free(rd->buf);
        rd->buf = NULL;
        rd->cap = 0;
    }
    return 0;
}

int al_result_reader_end(al_result_reader *rd, al_result_fn fn, void *ctx, al_error *err)
{
    if (rd->head_got == 0)
        return 0;
    rd->head_got = 0;
    int r = refuse(rd, fn, ctx, "the results ended inside a record");
    return r < 0 ? al_err(err, r, "cannot take a result: %s", strerror(-r)) : 0;
}

static char *base64_encode(const uint8_t *p, size_t n)
{
    char *out = malloc((n + 2) / 3 * 4 + 1);
    if (out)
        EVP_EncodeBlock((unsigned char *)out, p, (int)n);
    return out;
}

static const char *kind_name(int kind)
{
    switch (kind) {
    case AL_RESULT_VALUE:
        return "value";
    case AL_RESULT_DISPLAY:
        return "display";
    case AL_RESULT_ERROR:
        return "error";
    default:
        return "refused";
    }
}

char *al_result_json(const al_result *r)
{
    cJSON *o = cJSON_CreateObject();
    bool ok = o != NULL;
    if (ok && (r->kind == AL_RESULT_VALUE || r->kind == AL_RESULT_DISPLAY)) {
        ok = cJSON_AddStringToObject(o, "type", "result") &&
             cJSON_AddStringToObject(o, "kind", kind_name(r->kind));
        if (ok && r->kind == AL_RESULT_VALUE && r->execution_count)
            ok = cJSON_AddNumberToObject(o, "execution_count", r->execution_count);
        cJSON *data = ok ? cJSON_AddObjectToObject(o, "data") : NULL;
        ok = data != NULL;
        for (size_t i = 0; ok && i < r->nmime; i++) {
            const al_mime *m = &r->mime[i];
            if (!strcmp(m->type, "application/json")) {
                cJSON *v = cJSON_ParseWithLength((const char *)m->data, m->len);
                ok = v && cJSON_AddItemToObject(data, m->type, v);
            } else if (!strncmp(m->type, "image/", 6) && strcmp(m->type, "image/svg+xml")) {
                char *b64 = base64_encode(m->data, m->len);
                ok = b64 && cJSON_AddStringToObject(data, m->type, b64);
                free(b64);
            } else {
                ok = cJSON_AddStringToObject(data, m->type, (const char *)m->data) != NULL;
            }
        }
        if (ok && r->width)
            ok = cJSON_AddNumberToObject(o, "width", r->width) &&
                 cJSON_AddNumberToObject(o, "height", r->height);
    } else if (ok && r->kind == AL_RESULT_ERROR) {
        ok = cJSON_AddStringToObject(o, "type", "error") &&
             cJSON_AddStringToObject(o, "kind", "error") &&
             cJSON_AddStringToObject(o, "name", r->name ? r->name : "") &&
             cJSON_AddStringToObject(o, "value", r->value ? r->value : "") &&
             cJSON_AddStringToObject(o, "traceback", r->traceback ? r->traceback : "");
    } else if (ok) {
        ok = cJSON_AddStringToObject(o, "type", "refused") &&
             cJSON_AddStringToObject(o, "kind", "refused") &&
             cJSON_AddStringToObject(o, "why", r->why ? r->why : "");
    }
    char *text = ok ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return text;
}

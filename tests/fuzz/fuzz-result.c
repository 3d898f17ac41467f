/* Fuzz target for the result reader (orchestrator/base/result.c): the bytes a hostile guest sends
 * on a kernel run's result stream. The first input byte picks where the stream is cut in two;
 * the rest is the stream. Whatever the input: every result handed out is of a known kind, has
 * 1..AL_MIME_MAX MIME entries of the known types with UTF-8 text and images of their kind (a
 * refusal carries a reason); the stream fed whole and fed in two pieces gives the same results.
 * Any violation aborts. With no argument it also checks the per-record size limit at, below
 * and above its bound (from replay's run, once). */
#include "airlock-proto.h"
#include "airlock.h"
#include "airlock/policy.h"
#include "airlock/text.h"
#include "fuzz.h"
#include "result.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void fail(const char *what)
{
    fprintf(stderr, "fuzz-result: %s\n", what);
    abort();
}

struct seen {
    char sig[4096]; /* kinds, types and lengths in order */
    size_t len;
};

static int check(void *ctx, const al_result *r)
{
    struct seen *s = ctx;
    if (r->kind < AL_RESULT_VALUE || r->kind > AL_RESULT_REFUSED)
        fail("unknown kind");
    if (r->kind == AL_RESULT_REFUSED && (!r->why || !*r->why))
        fail("a refusal without a reason");
    if (r->kind == AL_RESULT_ERROR &&
        (!r->name || !al_utf8_valid((const uint8_t *)r->name, strlen(r->name))))
        fail("an error without a UTF-8 name");
    if (r->kind == AL_RESULT_VALUE || r->kind == AL_RESULT_DISPLAY) {
        if (r->nmime == 0 || r->nmime > AL_MIME_MAX)
            fail("MIME count out of range");
        for (size_t i = 0; i < r->nmime; i++) {
            const al_mime *m = &r->mime[i];
            if (!strcmp(m->type, "image/png")) {
                if (m->len < 24 || memcmp(m->data, "\x89PNG\r\n\x1a\n", 8))
                    fail("image/png that is not a PNG");
            } else if (!strcmp(m->type, "image/jpeg")) {
                if (m->len < 3 || memcmp(m->data, "\xff\xd8\xff", 3))
                    fail("image/jpeg that is not a JPEG");
            } else if (!al_utf8_valid(m->data, m->len)) {
                fail("text that is not UTF-8");
            }
        }
    }
    int n = snprintf(s->sig + s->len, sizeof(s->sig) - s->len, "%d:%zu;", r->kind, r->nmime);
    if (n > 0 && s->len + (size_t)n < sizeof(s->sig))
        s->len += (size_t)n;
    return 0;
}

static void feed(const uint8_t *p, size_t n, size_t cut, struct seen *s)
{
    al_result_reader *rd = NULL;
    al_error err = {0};
    if (al_result_reader_new(&rd, &err) < 0)
        fail("reader_new");
    if (al_result_reader_feed(rd, p, cut, check, s, &err) < 0 ||
        al_result_reader_feed(rd, p + cut, n - cut, check, s, &err) < 0 ||
        al_result_reader_end(rd, check, s, &err) < 0)
        fail("feed failed");
    al_result_reader_free(rd);
}

/* One display_data record of exactly total bytes of JSON (text/plain padded with 'x'). */
static uint8_t *record_of(size_t total, size_t *len)
{
    static const char pre[] = "{\"type\":\"display_data\",\"data\":{\"text/plain\":\"";
    static const char post[] = "\"}}";
    size_t pad = total - (sizeof(pre) - 1) - (sizeof(post) - 1);
    uint8_t *b = malloc(4 + total);
    if (!b)
        fail("malloc");
    b[0] = (uint8_t)total, b[1] = (uint8_t)(total >> 8), b[2] = (uint8_t)(total >> 16);
    b[3] = (uint8_t)(total >> 24);
    memcpy(b + 4, pre, sizeof(pre) - 1);
    memset(b + 4 + sizeof(pre) - 1, 'x', pad);
    memcpy(b + 4 + total - (sizeof(post) - 1), post, sizeof(post) - 1);
    *len = 4 + total;
    return b;
}

static void limits_once(void)
{
    static int done;
    if (done++)
        return;
    /* AL_RESULT_RECORD_MAX - 1 and AL_RESULT_RECORD_MAX pass; one byte more is refused. */
    const size_t sizes[] = {AL_RESULT_RECORD_MAX - 1, AL_RESULT_RECORD_MAX,
                            AL_RESULT_RECORD_MAX + 1};
    const char *want[] = {"1:1;", "1:1;", "3:0;"};
    for (size_t i = 0; i < 3; i++) {
        size_t len;
        uint8_t *b = record_of(sizes[i], &len);
        struct seen s = {{0}, 0};
        feed(b, len, len / 3, &s);
        free(b);
        if (strcmp(s.sig, want[i])) {
            fprintf(stderr, "fuzz-result: a record of %zu bytes gave %s\n", sizes[i], s.sig);
            abort();
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    limits_once();
    if (size < 1)
        return 0;
    size_t n = size - 1, cut = n ? data[0] % (n + 1) : 0;
    struct seen whole = {{0}, 0}, split = {{0}, 0};
    feed(data + 1, n, n, &whole);
    feed(data + 1, n, cut, &split);
    if (whole.len != split.len || memcmp(whole.sig, split.sig, whole.len))
        fail("the stream cut in two reads differently");
    return 0;
}

/* Fuzz target for the head of a guest's answer to a WebSocket upgrade (daemon/httphead.c): the
 * bytes a hostile guest's service sends back through a forwarded port. The first input byte picks
 * where the stream is cut; the rest is the stream. Whatever the input: a feed never claims more
 * bytes than it was given; once the head ended, the kept headers stay within their bounds and
 * are NUL-terminated; the stream cut in two gives the same status, upgrade flag, headers and head
 * length as the whole (or fails as the whole does). Any violation aborts. */
#include "../../daemon/httphead.h"
#include "fuzz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void fail(const char *what)
{
    fprintf(stderr, "fuzz-httphead: %s\n", what);
    abort();
}

/* Feeds in at most two pieces (cut at cut); the head's length in *used, -1 on failure. */
static void run(struct ad_http_head *h, const uint8_t *in, size_t n, size_t cut, long *used)
{
    char why[200];
    ad_http_head_init(h);
    *used = 0;
    size_t at = 0;
    for (int piece = 0; piece < 2 && !h->done; piece++) {
        size_t len = piece == 0 ? cut : n - cut;
        long r = ad_http_head_feed(h, (const char *)in + at, len, why, sizeof(why));
        if (r < 0) {
            if (!why[0] || strlen(why) >= sizeof(why))
                fail("a failure without its sentence");
            *used = -1;
            return;
        }
        if ((size_t)r > len)
            fail("a feed took more bytes than it had");
        *used += r;
        if (!h->done && (size_t)r != len)
            fail("a feed stopped short before the head's end");
        at += len;
    }
}

/* Once its head ended (before, the field being read may still be over its bound, to be dropped
 * at its end). */
static void check(const struct ad_http_head *h)
{
    if (!h->done)
        return;
    if (h->nfields > AD_HEAD_HEADERS_MAX)
        fail("more headers than kept at most");
    for (size_t i = 0; i < h->nfields; i++) {
        const struct ad_head_field *f = &h->fields[i];
        if (f->bad || f->name_len >= AD_HEAD_NAME_MAX || f->value_len >= AD_HEAD_VALUE_MAX)
            fail("a header past its bounds was kept");
        if (strlen(f->name) != f->name_len || strlen(f->value) != f->value_len)
            fail("a header's length is not its text's");
    }
    if (h->upgrade && h->status != 101)
        fail("an upgrade that is not a 101");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const uint8_t *in = data + 1;
    size_t n = size - 1;
    if (n > AD_HEAD_MAX)
        n = AD_HEAD_MAX; /* the caller never feeds more */
    size_t cut = n ? data[0] % (n + 1) : 0;
    struct ad_http_head *whole = malloc(sizeof(*whole)), *split = malloc(sizeof(*split));
    if (!whole || !split)
        fail("out of memory");
    long used_whole, used_split;
    run(whole, in, n, n, &used_whole);
    run(split, in, n, cut, &used_split);
    check(whole);
    check(split);
    if ((used_whole < 0) != (used_split < 0))
        fail("cut in two, the stream fails where the whole did not (or the other way)");
    if (used_whole >= 0) {
        if (whole->done != split->done || (whole->done && used_whole != used_split))
            fail("cut in two, the head ends elsewhere");
        if (whole->done && (whole->status != split->status || whole->upgrade != split->upgrade ||
                            whole->nfields != split->nfields))
            fail("cut in two, the head reads otherwise");
        for (size_t i = 0; whole->done && i < whole->nfields; i++)
            if (strcmp(whole->fields[i].name, split->fields[i].name) ||
                strcmp(whole->fields[i].value, split->fields[i].value))
                fail("cut in two, a header reads otherwise");
    }
    free(whole);
    free(split);
    return 0;
}

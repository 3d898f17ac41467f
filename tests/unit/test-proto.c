/* Tests of the wire protocol (proto/): every frame type round-trips through al_msg_encode and the
 * stream decoder, the bytes match the layout in docs/PROTOCOL.md, and every malformed or
 * over-limit frame is refused with the documented errno. Each limit is tried at, below and above
 * its bound.
 *
 * TAP output. A "# TODO" test is a known bug in proto/ (see the reason after TODO): it does not
 * fail the run while the bug stands, and meson reports it as an unexpected pass once fixed, which
 * is the cue to drop the TODO. */
#include "airlock-proto.h"
#include "proto-fixtures.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define HDR AL_FRAME_HEADER_SIZE

/* ---- TAP ---- */

static unsigned tap_count;
static unsigned tap_failed;

static bool tap(bool pass, const char *todo, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static bool tap(bool pass, const char *todo, const char *fmt, ...)
{
    va_list ap;
    printf("%sok %u - ", pass ? "" : "not ", ++tap_count);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    if (todo)
        printf(" # TODO %s", todo);
    putchar('\n');
    if (!pass && !todo)
        tap_failed++;
    return pass;
}

#define OK(cond, ...) tap((cond), NULL, __VA_ARGS__)

static void diag(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void diag(const char *fmt, ...)
{
    va_list ap;
    fputs("# ", stdout);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
}

/* ---- helpers ---- */

static uint8_t dbuf[HDR + AL_FRAME_PAYLOAD_MAX]; /* the decoder's buffer, as large as allowed */
static uint8_t frame[FIX_FRAME_ROOM];            /* the frame under test */
static uint8_t other[FIX_FRAME_ROOM];            /* a second encoding to compare with */

static uint64_t xorshift(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static size_t raw_frame(uint8_t *buf, const struct al_msg *m)
{
    struct raw r;
    raw_init(&r, buf, FIX_FRAME_ROOM);
    return raw_msg(&r, m);
}

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

#define LEFTOVER (-1000) /* decode_one: a frame came out but bytes were left behind */

/* Feeds n bytes (or as many as fit) to a fresh decoder at once and returns al_decoder_next's
 * answer; on 1, *out is the frame and the decoder must hold nothing more. */
static int decode_one(const uint8_t *bytes, size_t n, struct al_msg *out, const char **why)
{
    struct al_decoder d;
    size_t avail;
    al_decoder_init(&d, dbuf, sizeof(dbuf));
    uint8_t *space = al_decoder_space(&d, &avail);
    if (n > avail)
        n = avail; /* a frame over the buffer: what fits is enough to refuse it */
    memcpy(space, bytes, n);
    al_decoder_commit(&d, n);
    *why = NULL;
    int r = al_decoder_next(&d, out, why);
    if (r == 1 && al_decoder_partial(&d))
        return LEFTOVER;
    return r;
}

static const char *errname(int r)
{
    switch (r) {
    case 1:
        return "a frame";
    case 0:
        return "need more";
    case -EBADMSG:
        return "-EBADMSG";
    case -EMSGSIZE:
        return "-EMSGSIZE";
    case -EPROTO:
        return "-EPROTO";
    case -EPROTONOSUPPORT:
        return "-EPROTONOSUPPORT";
    case -EINVAL:
        return "-EINVAL";
    case LEFTOVER:
        return "a frame with bytes left over";
    default:
        return r > 0 ? "success (a byte count)" : "another error";
    }
}

/* One decode that must fail with want, with a reason. */
static bool expect_reject(const uint8_t *bytes, size_t n, int want, const char *todo,
                          const char *name)
{
    struct al_msg m;
    const char *why;
    int r = decode_one(bytes, n, &m, &why);
    bool pass = r == want && why && *why;
    if (!pass)
        diag("got %s (%s), want %s", errname(r), why ? why : "no reason", errname(want));
    return tap(pass, todo, "%s is %s", name, errname(want));
}

/* ---- stream decoding against a known sequence of frames ---- */

enum feed {
    FEED_ALL,    /* as much as the decoder has room for */
    FEED_BYTES,  /* one byte at a time */
    FEED_RANDOM, /* pieces of random size */
};

struct expect {
    const uint8_t *bytes;
    size_t len;
    const struct al_msg *const *msgs; /* frame k decodes to *msgs[k] */
    const size_t *ends;               /* and ends at byte ends[k] */
    size_t n;
};

/* Feeds e->bytes to a decoder and drains it after every piece. Checks that each frame equals
 * its message, that it comes out as soon as its last byte is in and not before, and that
 * al_decoder_partial is true exactly when a frame has begun but not all of it is in. */
static bool decode_expect(const struct expect *e, enum feed how, char *err, size_t errlen)
{
    struct al_decoder d;
    uint64_t rng = 0x9e3779b97f4a7c15ULL;
    size_t fed = 0, got = 0;

    al_decoder_init(&d, dbuf, sizeof(dbuf));
    if (al_decoder_partial(&d)) {
        snprintf(err, errlen, "fresh decoder is partial");
        return false;
    }
    while (fed < e->len) {
        size_t avail, n = e->len - fed;
        uint8_t *space = al_decoder_space(&d, &avail);
        if (how == FEED_BYTES) {
            n = 1;
        } else if (how == FEED_RANDOM) {
            uint64_t x = xorshift(&rng);
            n = x & 1 ? 1 + (x >> 8) % 16 : 1 + (x >> 8) % 100000;
        }
        if (n > e->len - fed)
            n = e->len - fed;
        if (n > avail)
            n = avail;
        if (n == 0) {
            snprintf(err, errlen, "decoder full at byte %zu", fed);
            return false;
        }
        memcpy(space, e->bytes + fed, n);
        al_decoder_commit(&d, n);
        fed += n;
        for (;;) {
            struct al_msg m;
            const char *why = NULL, *field = NULL;
            int r = al_decoder_next(&d, &m, &why);
            if (r < 0) {
                snprintf(err, errlen, "frame %zu: %s (%s) at byte %zu", got, errname(r), why, fed);
                return false;
            }
            if (r == 0)
                break;
            if (got == e->n) {
                snprintf(err, errlen, "an extra frame at byte %zu", fed);
                return false;
            }
            if (fed < e->ends[got]) {
                snprintf(err, errlen, "frame %zu out at byte %zu, before its end", got, fed);
                return false;
            }
            if (!fix_msg_same(e->msgs[got], &m, &field)) {
                snprintf(err, errlen, "frame %zu: %s differs", got, field);
                return false;
            }
            got++;
        }
        if (got < e->n && fed >= e->ends[got]) {
            snprintf(err, errlen, "frame %zu complete at byte %zu but not out", got, fed);
            return false;
        }
        bool want = fed > (got ? e->ends[got - 1] : 0);
        if (al_decoder_partial(&d) != want) {
            snprintf(err, errlen, "partial is %d at byte %zu, want %d", !want, fed, want);
            return false;
        }
    }
    if (got != e->n) {
        snprintf(err, errlen, "%zu frames of %zu", got, e->n);
        return false;
    }
    return true;
}

static const char *const feed_names[] = {"whole", "byte by byte", "in random pieces"};

/* ---- per sample: layout, round trip, truncation, trailing bytes, flags, short buffer ---- */

static void test_sample(const struct sample *s)
{
    const struct al_msg *m = &s->msg;
    char err[160];

    int n = al_msg_encode(m, frame, sizeof(frame));
    if (!OK(n > 0, "encode %s", s->name)) {
        diag("al_msg_encode: %s", errname(n));
        return;
    }
    size_t rn = raw_frame(other, m);
    OK((size_t)n == rn && memcmp(frame, other, rn) == 0, "%s has the layout of PROTOCOL.md",
       s->name);

    const struct al_msg *msgs[] = {m};
    size_t ends[] = {(size_t)n};
    struct expect e = {frame, (size_t)n, msgs, ends, 1};
    for (enum feed f = FEED_ALL; f <= FEED_BYTES; f++) {
        bool pass = decode_expect(&e, f, err, sizeof(err));
        if (!OK(pass, "round trip %s, %s", s->name, feed_names[f]))
            diag("%s", err);
    }

    /* Every shorter declared length, with just that many payload bytes. DATA is the exception:
     * any non-empty prefix is a valid shorter chunk, so only the empty payload is short. */
    uint32_t plen = (uint32_t)n - HDR, bad = 0, last = m->type == AL_DATA ? 1 : plen;
    for (uint32_t l = 0; l < last; l++) {
        struct al_header h;
        struct al_msg out;
        const char *why = NULL;
        put_le32(frame + 8, l);
        int r = al_header_decode(frame, HDR, &h, &why);
        if (r == 0)
            r = al_msg_decode(&h, frame + HDR, &out, &why);
        if (r != -EPROTO) {
            if (!bad)
                diag("payload cut to %u bytes: %s", l, errname(r));
            bad++;
        }
    }
    put_le32(frame + 8, plen);
    OK(bad == 0, "%s cut short: all %u shorter lengths are -EPROTO", s->name, last);

    char name[96];
    if (m->type != AL_DATA) {
        /* One more payload byte than the fields take; past the maximum, the header says so. */
        frame[n] = 0;
        put_le32(frame + 8, plen + 1);
        snprintf(name, sizeof(name), "%s with a trailing byte", s->name);
        expect_reject(frame, (size_t)n + 1, plen < AL_FRAME_PAYLOAD_MAX ? -EPROTO : -EMSGSIZE, NULL,
                      name);
        put_le32(frame + 8, plen);

        frame[3] = AL_FLAG_EOF;
        snprintf(name, sizeof(name), "%s with the EOF flag", s->name);
        expect_reject(frame, (size_t)n, -EPROTO, NULL, name);
        frame[3] = 0;

        /* Asked to, the encoder may refuse flags here or drop them, but never send them. */
        static struct al_msg flagged;
        struct al_msg got;
        const char *why;
        flagged = *m;
        flagged.flags = AL_FLAG_EOF;
        int r = al_msg_encode(&flagged, other, sizeof(other));
        OK(r == -EINVAL || (r == n && decode_one(other, (size_t)r, &got, &why) == 1),
           "encode of %s with the EOF flag sends no flags", s->name);
    }

    /* Exact-size heap buffers so that the sanitizers see any write past the end. */
    uint8_t *exact = malloc((size_t)n);
    uint8_t *shorter = malloc((size_t)n - 1);
    if (!exact || !shorter)
        abort();
    int r1 = al_msg_encode(m, exact, (size_t)n);
    int r2 = al_msg_encode(m, shorter, (size_t)n - 1);
    OK(r1 == n && r2 == -EMSGSIZE, "%s: encodes into exactly %d bytes, not into %d", s->name, n,
       n - 1);
    free(exact);
    free(shorter);
}

/* All samples back to back in one stream. */
static void test_back_to_back(const struct sample *samples, size_t count)
{
    size_t total = 0;
    for (size_t i = 0; i < count; i++)
        total += raw_frame(frame, &samples[i].msg);
    uint8_t *bytes = malloc(total);
    const struct al_msg **msgs = calloc(count, sizeof(*msgs));
    size_t *ends = calloc(count, sizeof(*ends));
    if (!bytes || !msgs || !ends)
        abort();
    size_t at = 0;
    for (size_t i = 0; i < count; i++) {
        int n = al_msg_encode(&samples[i].msg, bytes + at, total - at);
        if (n < 0)
            abort();
        at += (size_t)n;
        msgs[i] = &samples[i].msg;
        ends[i] = at;
    }
    struct expect e = {bytes, total, msgs, ends, count};
    char err[160];
    for (enum feed f = FEED_ALL; f <= FEED_RANDOM; f++) {
        bool pass = decode_expect(&e, f, err, sizeof(err));
        if (!OK(pass, "%zu frames (%zu bytes) back to back, %s", count, total, feed_names[f]))
            diag("%s", err);
    }
    free(bytes);
    free(msgs);
    free(ends);
}

/* ---- pinned bytes ---- */

static void test_golden(void)
{
    static const uint8_t hello[] = {
        'A',  'L',  0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, /* header */
        0x02, 0x00, 0x00, 0x00,                                                 /* version 2 */
        0xef, 0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01,                         /* nonce */
        0x00, 0x00, 0x10, 0x00,                                                 /* 1 MiB */
    };
    struct al_msg m = {.type = AL_HELLO};
    m.u.hello.version = 2;
    m.u.hello.nonce = 0x0123456789abcdefULL;
    m.u.hello.window = 1024 * 1024;
    int n = al_msg_encode(&m, frame, sizeof(frame));
    OK(n == (int)sizeof(hello) && memcmp(frame, hello, sizeof(hello)) == 0,
       "hello encodes to the bytes in PROTOCOL.md");

    static const uint8_t data[] = {
        'A', 'L', 0x05, 0x01, 0x04, 0x03, 0x02, 0x01, 0x03, 0x00, 0x00, 0x00, 0x01, 'h', 'i',
    };
    m = (struct al_msg){.type = AL_DATA, .flags = AL_FLAG_EOF, .id = 0x01020304};
    m.u.data.stream = AL_STREAM_STDOUT;
    m.u.data.data = (const uint8_t *)"hi";
    m.u.data.len = 2;
    n = al_msg_encode(&m, frame, sizeof(frame));
    OK(n == (int)sizeof(data) && memcmp(frame, data, sizeof(data)) == 0,
       "data encodes to the bytes in PROTOCOL.md");
}

/* al_data_header writes what al_msg_encode writes before the chunk. */
static void test_data_header(void)
{
    static const uint32_t lens[] = {0, 1, 12, AL_DATA_CHUNK_MAX};
    static const uint32_t ids[] = {0, 7, UINT32_MAX};
    unsigned tried = 0, bad = 0;
    for (uint8_t s = 0; s < AL_STREAM_COUNT; s++) {
        for (uint8_t flags = 0; flags <= AL_FLAG_EOF; flags++) {
            for (size_t i = 0; i < ARRAY_SIZE(lens); i++) {
                uint32_t id = ids[(s + i) % ARRAY_SIZE(ids)];
                struct al_msg m = {.type = AL_DATA, .flags = flags, .id = id};
                m.u.data.stream = s;
                m.u.data.data = (const uint8_t *)fix_str(lens[i]).p;
                m.u.data.len = lens[i];
                uint8_t h[HDR + 1];
                al_data_header(h, id, s, flags, lens[i]);
                int n = al_msg_encode(&m, frame, sizeof(frame));
                tried++;
                if (n != (int)(HDR + 1 + lens[i]) || memcmp(h, frame, sizeof(h)) != 0) {
                    diag("stream %u flags %u len %u differs", s, flags, lens[i]);
                    bad++;
                }
            }
        }
    }
    OK(bad == 0, "al_data_header matches al_msg_encode (%u streams, flags, lengths)", tried);
}

/* ---- header: magic, length, type, flags ---- */

static void header(uint8_t *h, uint8_t type, uint8_t flags, uint32_t id, uint32_t len)
{
    h[0] = 'A';
    h[1] = 'L';
    h[2] = type;
    h[3] = flags;
    put_le32(h + 4, id);
    put_le32(h + 8, len);
}

static void test_magic(void)
{
    struct al_header h;
    const char *why;
    uint8_t b[HDR];

    struct al_msg m;
    unsigned bad = 0;
    for (int c = 0; c < 256; c++) {
        b[0] = (uint8_t)c;
        if (c != AL_FRAME_MAGIC0 && decode_one(b, 1, &m, &why) != -EBADMSG)
            bad++;
    }
    OK(bad == 0, "every first byte but 'A' is -EBADMSG as soon as it arrives");
    bad = 0;
    for (int c = 0; c < 256; c++) {
        b[0] = 'A';
        b[1] = (uint8_t)c;
        if (c != AL_FRAME_MAGIC1 && decode_one(b, 2, &m, &why) != -EBADMSG)
            bad++;
    }
    OK(bad == 0, "every second byte but 'L' is -EBADMSG as soon as it arrives");

    header(b, AL_PING, 0, 0, 8);
    OK(decode_one(b, 1, &m, &why) == 0 && decode_one(b, 2, &m, &why) == 0 &&
           decode_one(b, 3, &m, &why) == 0,
       "'A', 'AL' and 'AL' plus a type byte need more");

    b[0] = 'L';
    b[1] = 'A';
    OK(al_header_decode(b, HDR, &h, &why) == -EBADMSG,
       "al_header_decode: swapped magic is -EBADMSG");
    header(b, AL_PING, 0, 0, 8);
    OK(al_header_decode(b, HDR - 1, &h, &why) == -EPROTO,
       "al_header_decode: 11 bytes are -EPROTO (truncated header)");

    /* A valid frame, then garbage: the frame comes out, then the error. */
    struct al_msg ping = {.type = AL_PING};
    int n = al_msg_encode(&ping, frame, sizeof(frame));
    frame[n] = 'Z';
    struct al_decoder d;
    size_t avail;
    al_decoder_init(&d, dbuf, sizeof(dbuf));
    memcpy(al_decoder_space(&d, &avail), frame, (size_t)n + 1);
    al_decoder_commit(&d, (size_t)n + 1);
    int r1 = al_decoder_next(&d, &m, &why);
    int r2 = al_decoder_next(&d, &m, &why);
    OK(r1 == 1 && r2 == -EBADMSG, "a good frame then a bad byte: the frame, then -EBADMSG");
}

static void test_length(void)
{
    uint8_t b[HDR];
    struct al_msg m;
    const char *why;
    char name[96];

    static const uint32_t ok_lens[] = {AL_FRAME_PAYLOAD_MAX - 1, AL_FRAME_PAYLOAD_MAX};
    for (size_t i = 0; i < ARRAY_SIZE(ok_lens); i++) {
        struct al_header h;
        header(b, AL_EXEC, 0, 1, ok_lens[i]);
        int r = al_header_decode(b, HDR, &h, &why);
        OK(r == 0 && h.len == ok_lens[i] && decode_one(b, HDR, &m, &why) == 0,
           "declared length %u (AL_FRAME_PAYLOAD_MAX%s): header accepted, decoder waits",
           ok_lens[i], i ? "" : " - 1");
    }
    static const uint32_t bad_lens[] = {AL_FRAME_PAYLOAD_MAX + 1, UINT32_MAX};
    for (size_t i = 0; i < ARRAY_SIZE(bad_lens); i++) {
        header(b, AL_EXEC, 0, 1, bad_lens[i]);
        snprintf(name, sizeof(name), "declared length %u, from the header alone", bad_lens[i]);
        expect_reject(b, HDR, -EMSGSIZE, NULL, name);
        /* The limit itself, not just the size of the decoder's buffer, must refuse it. */
        struct al_header h;
        OK(al_header_decode(b, HDR, &h, &why) == -EMSGSIZE,
           "al_header_decode: declared length %u is -EMSGSIZE", bad_lens[i]);
    }

    /* A receive buffer smaller than the maximum bounds what the decoder accepts. */
    struct al_decoder d;
    size_t avail;
    al_decoder_init(&d, dbuf, HDR + 100);
    header(al_decoder_space(&d, &avail), AL_DATA, 0, 1, 100);
    al_decoder_commit(&d, HDR);
    int r1 = al_decoder_next(&d, &m, &why);
    al_decoder_init(&d, dbuf, HDR + 100);
    header(al_decoder_space(&d, &avail), AL_DATA, 0, 1, 101);
    al_decoder_commit(&d, HDR);
    int r2 = al_decoder_next(&d, &m, &why);
    OK(r1 == 0 && r2 == -EMSGSIZE,
       "a frame that fits the receive buffer waits, one over is -EMSGSIZE");

    /* The encoder: a payload of exactly the maximum is sample exec-payload-max; one more byte. */
    struct al_msg big = {.type = AL_EXEC, .id = 1};
    big.u.exec.argc = 1;
    big.u.exec.argv[0] = fix_str(AL_FRAME_PAYLOAD_MAX - FIX_EXEC_OVERHEAD + 1);
    OK(al_msg_encode(&big, frame, sizeof(frame)) == -EMSGSIZE,
       "encode of a payload of AL_FRAME_PAYLOAD_MAX + 1 is -EMSGSIZE");
    size_t n = raw_frame(frame, &big);
    expect_reject(frame, HDR, -EMSGSIZE, NULL, "that frame's header");
    big.u.exec.argv[0] = fix_str(AL_FRAME_PAYLOAD_MAX - FIX_EXEC_OVERHEAD - 1);
    n = raw_frame(frame, &big);
    OK(decode_one(frame, n, &m, &why) == 1 && al_msg_encode(&big, other, sizeof(other)) == (int)n,
       "a payload of AL_FRAME_PAYLOAD_MAX - 1 encodes and decodes");

    int r = al_msg_encode(&big, frame, HDR - 1);
    OK(r == -EMSGSIZE, "encode into fewer than %d bytes is -EMSGSIZE", HDR);
}

static void test_type_and_flags(void)
{
    uint8_t b[HDR + 8] = {0};
    char name[96];

    static const uint8_t bad_types[] = {0, AL_TYPE_MAX_ + 1, 255};
    for (size_t i = 0; i < ARRAY_SIZE(bad_types); i++) {
        header(b, bad_types[i], 0, 0, 8);
        snprintf(name, sizeof(name), "type %u, from the header alone", bad_types[i]);
        expect_reject(b, HDR, -EPROTONOSUPPORT, NULL, name);
        snprintf(name, sizeof(name), "type %u with its payload", bad_types[i]);
        expect_reject(b, sizeof(b), -EPROTONOSUPPORT, NULL, name);
    }
    /* al_msg_decode alone, given a header it did not check */
    struct al_header h = {.type = AL_TYPE_MAX_ + 1, .len = 0};
    struct al_msg m;
    const char *why = NULL;
    OK(al_msg_decode(&h, b, &m, &why) == -EPROTONOSUPPORT && why,
       "al_msg_decode of type %d is -EPROTONOSUPPORT", AL_TYPE_MAX_ + 1);

    static const uint8_t bad_flags[] = {1u << 1, 1u << 7, 0xff};
    for (size_t i = 0; i < ARRAY_SIZE(bad_flags); i++) {
        header(b, AL_DATA, bad_flags[i], 1, 2);
        snprintf(name, sizeof(name), "data with flags 0x%02x, from the header alone", bad_flags[i]);
        expect_reject(b, HDR, -EPROTO, NULL, name);
    }

    static const uint8_t unknown[] = {0, AL_TYPE_MAX_ + 1};
    for (size_t i = 0; i < ARRAY_SIZE(unknown); i++) {
        struct al_msg bad = {.type = unknown[i]};
        OK(al_msg_encode(&bad, frame, sizeof(frame)) == -EINVAL, "encode of type %u is -EINVAL",
           unknown[i]);
    }
    struct al_msg d = {.type = AL_DATA, .flags = 1u << 1, .id = 1};
    d.u.data.data = (const uint8_t *)"x";
    d.u.data.len = 1;
    int r = al_msg_encode(&d, frame, sizeof(frame));
    if (!tap(r == -EINVAL, NULL, "encode of data with unknown flag 0x02 is -EINVAL"))
        diag("got %s", errname(r));
}

/* ---- limits: each at, below and above its bound ---- */

struct bound {
    const char *what;
    int64_t lo, hi; /* the accepted range */
    bool test_lo;   /* lo - 1 exists on the wire and must be refused */
    void (*set)(struct al_msg *m, int64_t v);
    const char *encode_todo; /* al_msg_encode does not yet refuse values outside */
    bool encode_cuts;        /* the encoder cuts over-long values rather than refusing */
    bool octal;              /* a file mode */
};

/* A message of this type on request 1, the rest as the setter makes it. */
static void begin(struct al_msg *m, enum al_type type)
{
    m->type = type;
    m->id = 1;
}

static void set_langs(struct al_msg *m, int64_t v)
{
    m->type = AL_HELLO_ACK;
    m->u.hello_ack.version = AL_PROTO_VERSION;
    m->u.hello_ack.window = AL_WINDOW_DEFAULT;
    m->u.hello_ack.nlangs = (uint32_t)v;
    for (int64_t i = 0; i < v && i < AL_LANGS_MAX; i++)
        m->u.hello_ack.langs[i] = fix_str((uint32_t)i + 1);
}

static void set_lang_len(struct al_msg *m, int64_t v)
{
    set_langs(m, 1);
    m->u.hello_ack.langs[0] = fix_str((uint32_t)v);
}

static void set_agent_version_len(struct al_msg *m, int64_t v)
{
    set_langs(m, 0);
    m->u.hello_ack.agent_version = fix_str((uint32_t)v);
}

static void set_argc(struct al_msg *m, int64_t v)
{
    begin(m, AL_EXEC);
    m->u.exec.argc = (uint32_t)v;
    for (int64_t i = 0; i < v && i < AL_ARGV_MAX; i++)
        m->u.exec.argv[i] = fix_str(2);
}

static void set_envc(struct al_msg *m, int64_t v)
{
    set_argc(m, 1);
    m->u.exec.envc = (uint32_t)v;
    for (int64_t i = 0; i < v && i < AL_ENV_MAX; i++)
        m->u.exec.env[i] = fix_str(3);
}

static void set_exec_lang_len(struct al_msg *m, int64_t v)
{
    set_argc(m, 1);
    m->u.exec.lang = fix_str((uint32_t)v);
}

static void set_exec_cwd_len(struct al_msg *m, int64_t v)
{
    set_argc(m, 1);
    m->u.exec.cwd = fix_str((uint32_t)v);
}

static void set_exec_flags(struct al_msg *m, int64_t v)
{
    set_argc(m, 1);
    m->u.exec.flags = (uint32_t)v;
    if (v & AL_EXEC_KERNEL)
        m->u.exec.lang = al_str_cstr("python"); /* a kernel needs a language */
}

static void set_exec_input_wait(struct al_msg *m, int64_t v)
{
    set_argc(m, 1);
    m->u.exec.input_wait_ms = (uint32_t)v;
}

static void set_data_len(struct al_msg *m, int64_t v)
{
    begin(m, AL_DATA);
    m->u.data.stream = AL_STREAM_STDOUT;
    m->u.data.data = (const uint8_t *)fix_str((uint32_t)v).p;
    m->u.data.len = (uint32_t)v;
}

static void set_data_stream(struct al_msg *m, int64_t v)
{
    set_data_len(m, 5);
    m->u.data.stream = (uint8_t)v;
}

static void set_credit_stream(struct al_msg *m, int64_t v)
{
    begin(m, AL_CREDIT);
    m->u.credit.stream = (uint8_t)v;
    m->u.credit.bytes = 4096;
}

static void set_credit_bytes(struct al_msg *m, int64_t v)
{
    set_credit_stream(m, AL_STREAM_STDOUT);
    m->u.credit.bytes = (uint32_t)v;
}

static void set_signal(struct al_msg *m, int64_t v)
{
    begin(m, AL_SIGNAL);
    m->u.signal.signo = (uint32_t)v;
}

static void set_exit_code(struct al_msg *m, int64_t v)
{
    begin(m, AL_EXIT);
    m->u.exit.how = AL_EXIT_CODE;
    m->u.exit.value = (int32_t)v;
}

static void set_exit_signal(struct al_msg *m, int64_t v)
{
    set_exit_code(m, 0);
    m->u.exit.how = AL_EXIT_SIGNAL;
    m->u.exit.value = (int32_t)v;
}

static void set_exit_how(struct al_msg *m, int64_t v)
{
    set_exit_code(m, 1);
    m->u.exit.how = (uint8_t)v;
}

static void set_error_class(struct al_msg *m, int64_t v)
{
    begin(m, AL_ERROR);
    m->u.error.klass = (uint16_t)v;
    m->u.error.message = fix_str(10);
}

static void set_error_len(struct al_msg *m, int64_t v)
{
    set_error_class(m, AL_ERR_IO);
    m->u.error.message = fix_str((uint32_t)v);
}

static void set_put_mode(struct al_msg *m, int64_t v)
{
    begin(m, AL_FILE_PUT);
    m->u.file_put.mode = (uint32_t)v;
    m->u.file_put.path = fix_str(8);
}

static void set_put_path_len(struct al_msg *m, int64_t v)
{
    set_put_mode(m, 0644);
    m->u.file_put.path = fix_str((uint32_t)v);
}

static void set_get_path_len(struct al_msg *m, int64_t v)
{
    begin(m, AL_FILE_GET);
    m->u.file_get.path = fix_str((uint32_t)v);
}

static void set_info_mode(struct al_msg *m, int64_t v)
{
    begin(m, AL_FILE_INFO);
    m->u.file_info.mode = (uint32_t)v;
}

static void set_shutdown(struct al_msg *m, int64_t v)
{
    m->type = AL_SHUTDOWN;
    m->u.shutdown.how = (uint32_t)v;
}

static void set_refresh(struct al_msg *m)
{
    begin(m, AL_REFRESH);
    m->u.refresh.seed = (const uint8_t *)fix_str(AL_REFRESH_SEED).p;
    m->u.refresh.machine_id = (const uint8_t *)fix_str(AL_MACHINE_ID).p;
    m->u.refresh.hostname = al_str_cstr("airlock-1");
}

static void set_refresh_nsec(struct al_msg *m, int64_t v)
{
    set_refresh(m);
    m->u.refresh.nsec = (uint32_t)v;
}

static void set_refresh_sec(struct al_msg *m, int64_t v)
{
    set_refresh(m);
    m->u.refresh.sec = (uint64_t)v;
}

static char hostname_buf[AL_HOSTNAME_MAX + 2];

static void set_refresh_hostname_len(struct al_msg *m, int64_t v)
{
    set_refresh(m);
    memset(hostname_buf, 'h', sizeof(hostname_buf));
    m->u.refresh.hostname = (struct al_str){hostname_buf, (uint32_t)v};
}

/* Not here: the HELLO / HELLO_ACK window. Frames carry any value; each side's handshake checks
 * the peer's against AL_WINDOW_MIN..AL_WINDOW_MAX (samples hello-window-min and -max). */
static const struct bound bounds[] = {
    {"hello-ack language count", 0, AL_LANGS_MAX, false, set_langs},
    {"hello-ack language name length", 0, AL_SHORT_STR_MAX, false, set_lang_len, NULL},
    {"hello-ack agent version length", 0, AL_SHORT_STR_MAX, false, set_agent_version_len, NULL},
    {"exec argc", 1, AL_ARGV_MAX, true, set_argc},
    {"exec envc", 0, AL_ENV_MAX, false, set_envc},
    {"exec language length", 0, AL_SHORT_STR_MAX, false, set_exec_lang_len, NULL},
    {"exec cwd length", 0, AL_GUEST_PATH_MAX, false, set_exec_cwd_len, NULL},
    /* Every flag but the pty's, which needs a size and no kernel (test_bounds' own cases). */
    {"exec flags", 0, AL_EXEC_FLAGS_KNOWN & ~AL_EXEC_PTY, false, set_exec_flags, NULL},
    {"exec input wait", 0, AL_INPUT_WAIT_MAX_MS, false, set_exec_input_wait, NULL},
    {"data chunk length", 0, AL_DATA_CHUNK_MAX, false, set_data_len},
    {"data stream", 0, AL_STREAM_COUNT - 1, false, set_data_stream},
    {"credit stream", 0, AL_STREAM_COUNT - 1, false, set_credit_stream, NULL},
    {"credit bytes", 0, AL_WINDOW_MAX, false, set_credit_bytes, NULL},
    {"signal number", 1, 64, true, set_signal, NULL},
    {"exit status", 0, 255, true, set_exit_code, NULL},
    {"exit signal", 1, 64, true, set_exit_signal, NULL},
    {"exit kind", 0, AL_EXIT_SIGNAL, false, set_exit_how, NULL},
    {"error class", 1, AL_ERR_CLASS_MAX_, true, set_error_class, NULL},
    {"error message length", 0, AL_MESSAGE_MAX, false, set_error_len, .encode_cuts = true},
    {"file-put mode", 0, 07777, false, set_put_mode, NULL, .octal = true},
    {"file-put path length", 0, AL_GUEST_PATH_MAX, false, set_put_path_len, NULL},
    {"file-get path length", 0, AL_GUEST_PATH_MAX, false, set_get_path_len, NULL},
    {"file-info mode", 0, 07777, false, set_info_mode, NULL, .octal = true},
    {"shutdown kind", 0, AL_SHUTDOWN_REBOOT, false, set_shutdown, NULL},
    {"refresh clock nanoseconds", 0, 999999999, false, set_refresh_nsec, NULL},
    {"refresh clock seconds", 0, INT64_MAX, false, set_refresh_sec, NULL},
    {"refresh hostname length", 1, AL_HOSTNAME_MAX, true, set_refresh_hostname_len, NULL},
};

static struct al_msg bound_msg; /* large: kept off the stack */

static const struct bound *find_bound(const char *what)
{
    for (size_t i = 0; i < ARRAY_SIZE(bounds); i++) {
        if (!strcmp(bounds[i].what, what))
            return &bounds[i];
    }
    abort();
}

/* Sets bound_msg to b's message with value v, writes it raw into frame and names the case. */
static size_t bound_frame(const struct bound *b, int64_t v, const char *where, char *name,
                          size_t namelen)
{
    memset(&bound_msg, 0, sizeof(bound_msg));
    b->set(&bound_msg, v);
    snprintf(name, namelen, b->octal ? "%s %#llo (%s)" : "%s %lld (%s)", b->what, (long long)v,
             where);
    return raw_frame(frame, &bound_msg);
}

static void bound_accepts(const struct bound *b, int64_t v, const char *where)
{
    const char *why, *field = "";
    struct al_msg got;
    char name[128];
    size_t n = bound_frame(b, v, where, name, sizeof(name));
    int r = decode_one(frame, n, &got, &why);
    bool same = r == 1 && fix_msg_same(&bound_msg, &got, &field);
    int e = al_msg_encode(&bound_msg, other, sizeof(other));
    bool encoded = e == (int)n && memcmp(frame, other, n) == 0;
    if (!OK(same && encoded, "%s is accepted", name))
        diag("decode: %s (%s) %s, encode: %s", errname(r), r < 0 ? why : "", field, errname(e));
}

static void bound_refuses(const struct bound *b, int64_t v, const char *where)
{
    char name[128];
    size_t n = bound_frame(b, v, where, name, sizeof(name));
    expect_reject(frame, n, -EPROTO, NULL, name);
    if (b->encode_cuts)
        return;
    int e = al_msg_encode(&bound_msg, other, sizeof(other));
    if (!tap(e == -EINVAL, b->encode_todo, "encode of %s is -EINVAL", name))
        diag("got %s", errname(e));
}

static void test_bounds(void)
{
    for (size_t i = 0; i < ARRAY_SIZE(bounds); i++) {
        const struct bound *b = &bounds[i];
        if (b->test_lo) {
            bound_refuses(b, b->lo - 1, "below the minimum");
            bound_accepts(b, b->lo, "the minimum");
            bound_accepts(b, b->lo + 1, "above the minimum");
        } else {
            bound_accepts(b, b->lo, "the least");
        }
        bound_accepts(b, b->hi - 1, "below the maximum");
        bound_accepts(b, b->hi, "the maximum");
        bound_refuses(b, b->hi + 1, "above the maximum");
    }

    /* Values far beyond, where a sign or width mistake would let them through. */
    bound_refuses(find_bound("exit status"), INT32_MIN, "far below the minimum");
    bound_refuses(find_bound("file-put mode"), 0x80000000u | 0644, "a high bit set");
    struct raw w;
    raw_init(&w, frame, sizeof(frame));
    raw_begin(&w, AL_EXEC, 0, 1);
    raw_u32(&w, 0);
    raw_u32(&w, 0);
    raw_u32(&w, 0);
    raw_u64(&w, 0);
    raw_u16(&w, 0);
    raw_u16(&w, 0);
    raw_str(&w, fix_str(0));
    raw_str(&w, fix_str(0));
    raw_u32(&w, UINT32_MAX); /* argc, and no entries: the count alone must stop it */
    expect_reject(frame, raw_end(&w), -EPROTO, NULL, "exec argc 4294967295");
    raw_init(&w, frame, sizeof(frame));
    raw_begin(&w, AL_FILE_GET, 0, 1);
    raw_u32(&w, UINT32_MAX);
    expect_reject(frame, raw_end(&w), -EPROTO, NULL, "file-get path length 4294967295");

    /* The encoder cuts an over-long error message to the limit: a message is one phrase. */
    struct al_msg m;
    const char *why;
    set_error_len(&bound_msg, AL_MESSAGE_MAX + 100);
    int n = al_msg_encode(&bound_msg, frame, sizeof(frame));
    OK(n > 0 && decode_one(frame, (size_t)n, &m, &why) == 1 &&
           m.u.error.message.len == AL_MESSAGE_MAX &&
           memcmp(m.u.error.message.p, fix_str(AL_MESSAGE_MAX).p, AL_MESSAGE_MAX) == 0,
       "encode cuts an error message of %d bytes to AL_MESSAGE_MAX", AL_MESSAGE_MAX + 100);

    set_argc(&bound_msg, 0);
    OK(al_msg_encode(&bound_msg, frame, sizeof(frame)) == -EINVAL,
       "encode of exec argc 0 is -EINVAL");

    /* A REFRESH's hostname is one label of letters, digits and '-': sethostname takes any
     * bytes, the guest's tools do not. */
    static const char *const bad_names[] = {"a.b", "a/b", "a b", "a\nb", "a\0b", "\xc3\xa9"};
    for (size_t i = 0; i < ARRAY_SIZE(bad_names); i++) {
        memset(&bound_msg, 0, sizeof(bound_msg));
        set_refresh(&bound_msg);
        bound_msg.u.refresh.hostname =
            (struct al_str){bad_names[i], i == 4 ? 3 : (uint32_t)strlen(bad_names[i])};
        char name[64];
        snprintf(name, sizeof(name), "refresh hostname #%zu outside [A-Za-z0-9-]", i);
        expect_reject(frame, raw_frame(frame, &bound_msg), -EPROTO, NULL, name);
        OK(al_msg_encode(&bound_msg, other, sizeof(other)) == -EINVAL, "encode of %s is -EINVAL",
           name);
    }
    memset(&bound_msg, 0, sizeof(bound_msg));
    set_refresh(&bound_msg);
    bound_msg.u.refresh.seed = NULL;
    OK(al_msg_encode(&bound_msg, other, sizeof(other)) == -EINVAL,
       "encode of a refresh without its seed is -EINVAL");

    /* A kernel run names its kernel: the flag without a language is refused both ways. */
    memset(&bound_msg, 0, sizeof(bound_msg));
    set_exec_flags(&bound_msg, AL_EXEC_KERNEL);
    bound_msg.u.exec.lang = fix_str(0);
    expect_reject(frame, raw_frame(frame, &bound_msg), -EPROTO, NULL,
                  "exec with the kernel flag and no language");
    OK(al_msg_encode(&bound_msg, other, sizeof(other)) == -EINVAL,
       "encode of an exec with the kernel flag and no language is -EINVAL");
    bound_msg.u.exec.lang = fix_str(1);
    OK(decode_one(frame, raw_frame(frame, &bound_msg), &m, &why) == 1 &&
           m.u.exec.flags == AL_EXEC_KERNEL && m.u.exec.lang.len == 1,
       "exec with the kernel flag and a one-byte language decodes");
    /* A kernel operation is an operation on a kernel: without the kernel flag it is refused. */
    set_exec_flags(&bound_msg, AL_EXEC_KERNEL_OP);
    expect_reject(frame, raw_frame(frame, &bound_msg), -EPROTO, NULL,
                  "exec with the kernel operation flag alone");
    OK(al_msg_encode(&bound_msg, other, sizeof(other)) == -EINVAL,
       "encode of an exec with the kernel operation flag alone is -EINVAL");
    set_exec_flags(&bound_msg, AL_EXEC_KERNEL | AL_EXEC_KERNEL_OP);
    OK(decode_one(frame, raw_frame(frame, &bound_msg), &m, &why) == 1 &&
           m.u.exec.flags == (AL_EXEC_KERNEL | AL_EXEC_KERNEL_OP),
       "exec with the kernel and kernel operation flags decodes");

    /* The flag past every known one is refused; the pty's flag with a size decodes. */
    memset(&bound_msg, 0, sizeof(bound_msg));
    set_exec_flags(&bound_msg, AL_EXEC_FLAGS_KNOWN + 1);
    expect_reject(frame, raw_frame(frame, &bound_msg), -EPROTO, NULL, "exec flags past the known");
    memset(&bound_msg, 0, sizeof(bound_msg));
    set_exec_flags(&bound_msg, AL_EXEC_PTY | AL_EXEC_STDIN);
    bound_msg.u.exec.rows = AL_PTY_DIM_MAX;
    bound_msg.u.exec.cols = 1;
    OK(decode_one(frame, raw_frame(frame, &bound_msg), &m, &why) == 1 &&
           m.u.exec.rows == AL_PTY_DIM_MAX && m.u.exec.cols == 1,
       "a pty exec of %dx1 decodes", AL_PTY_DIM_MAX);
    /* A terminal has 1..AL_PTY_DIM_MAX rows and columns; only a process gets one, and only a
     * terminal has a size. */
    static const uint16_t dims[][2] = {
        {0, 80}, {24, 0}, {0, 0}, {AL_PTY_DIM_MAX + 1, 80}, {24, UINT16_MAX}};
    for (size_t i = 0; i < ARRAY_SIZE(dims); i++) {
        memset(&bound_msg, 0, sizeof(bound_msg));
        set_exec_flags(&bound_msg, AL_EXEC_PTY);
        bound_msg.u.exec.rows = dims[i][0];
        bound_msg.u.exec.cols = dims[i][1];
        char name[64];
        snprintf(name, sizeof(name), "pty exec of %ux%u", dims[i][0], dims[i][1]);
        expect_reject(frame, raw_frame(frame, &bound_msg), -EPROTO, NULL, name);
        OK(al_msg_encode(&bound_msg, other, sizeof(other)) == -EINVAL, "encode of %s is -EINVAL",
           name);
        struct al_msg rs = {.type = AL_RESIZE, .id = 1};
        rs.u.resize.rows = dims[i][0];
        rs.u.resize.cols = dims[i][1];
        snprintf(name, sizeof(name), "resize to %ux%u", dims[i][0], dims[i][1]);
        expect_reject(frame, raw_frame(frame, &rs), -EPROTO, NULL, name);
        OK(al_msg_encode(&rs, other, sizeof(other)) == -EINVAL, "encode of %s is -EINVAL", name);
    }
    memset(&bound_msg, 0, sizeof(bound_msg));
    set_exec_flags(&bound_msg, AL_EXEC_PTY | AL_EXEC_KERNEL);
    bound_msg.u.exec.lang = fix_str(1);
    bound_msg.u.exec.rows = 24;
    bound_msg.u.exec.cols = 80;
    expect_reject(frame, raw_frame(frame, &bound_msg), -EPROTO, NULL, "a kernel run on a pty");
    memset(&bound_msg, 0, sizeof(bound_msg));
    set_exec_flags(&bound_msg, 0);
    bound_msg.u.exec.rows = 24;
    bound_msg.u.exec.cols = 80;
    expect_reject(frame, raw_frame(frame, &bound_msg), -EPROTO, NULL,
                  "a terminal size without the pty flag");
    /* A tunnel to port 0 is no tunnel: refused both ways. */
    struct al_msg cn = {.type = AL_CONNECT, .id = 1};
    expect_reject(frame, raw_frame(frame, &cn), -EPROTO, NULL, "connect to port 0");
    OK(al_msg_encode(&cn, other, sizeof(other)) == -EINVAL, "encode of connect to 0 is -EINVAL");
}

/* ---- outputs untouched on failure, reasons given ---- */

static void test_untouched(void)
{
    struct al_msg m, pattern;
    struct al_header h, hpattern;
    const char *why;
    memset(&pattern, 0xa5, sizeof(pattern));
    memset(&hpattern, 0xa5, sizeof(hpattern));

    memset(&bound_msg, 0, sizeof(bound_msg));
    set_error_class(&bound_msg, 0);
    size_t n = raw_frame(frame, &bound_msg);
    m = pattern;
    int r = al_header_decode(frame, HDR, &h, &why);
    why = NULL;
    r = r ? r : al_msg_decode(&h, frame + HDR, &m, &why);
    OK(r == -EPROTO && why && memcmp(&m, &pattern, sizeof(m)) == 0,
       "al_msg_decode leaves its output untouched on failure");

    frame[0] = 'X';
    h = hpattern;
    r = al_header_decode(frame, n, &h, &why);
    OK(r == -EBADMSG && memcmp(&h, &hpattern, sizeof(h)) == 0,
       "al_header_decode leaves its output untouched on failure");

    struct al_decoder d;
    size_t avail;
    al_decoder_init(&d, dbuf, sizeof(dbuf));
    memcpy(al_decoder_space(&d, &avail), "AL", 2);
    al_decoder_commit(&d, 2);
    m = pattern;
    r = al_decoder_next(&d, &m, &why);
    OK(r == 0 && memcmp(&m, &pattern, sizeof(m)) == 0,
       "al_decoder_next leaves its output untouched while it needs more");
}

/* ---- al_decoder_partial at chosen points ---- */

static void test_partial(void)
{
    struct al_decoder d;
    struct al_msg m;
    const char *why;
    size_t avail;
    struct al_msg ping = {.type = AL_PING};
    int n = al_msg_encode(&ping, frame, sizeof(frame));
    memcpy(frame + n, frame, (size_t)n); /* two pings */

    al_decoder_init(&d, dbuf, sizeof(dbuf));
    bool fresh = al_decoder_partial(&d);
    memcpy(al_decoder_space(&d, &avail), frame, 1);
    al_decoder_commit(&d, 1);
    int r1 = al_decoder_next(&d, &m, &why);
    bool one = al_decoder_partial(&d);
    memcpy(al_decoder_space(&d, &avail), frame + 1, HDR - 1);
    al_decoder_commit(&d, HDR - 1);
    int r2 = al_decoder_next(&d, &m, &why);
    bool hdr = al_decoder_partial(&d);
    memcpy(al_decoder_space(&d, &avail), frame + HDR, (size_t)n - HDR + 3);
    al_decoder_commit(&d, (size_t)n - HDR + 3);
    int r3 = al_decoder_next(&d, &m, &why);
    int r4 = al_decoder_next(&d, &m, &why);
    bool next3 = al_decoder_partial(&d);
    memcpy(al_decoder_space(&d, &avail), frame + n + 3, (size_t)n - 3);
    al_decoder_commit(&d, (size_t)n - 3);
    int r5 = al_decoder_next(&d, &m, &why);
    bool boundary = al_decoder_partial(&d);
    int r6 = al_decoder_next(&d, &m, &why);
    bool empty = al_decoder_partial(&d);

    OK(!fresh, "partial: false on a fresh decoder");
    OK(r1 == 0 && one, "partial: true after one byte");
    OK(r2 == 0 && hdr, "partial: true after a whole header");
    OK(r3 == 1 && r4 == 0 && next3, "partial: true with 3 bytes of the next frame");
    OK(r5 == 1 && !boundary, "partial: false once the last frame is out");
    OK(r6 == 0 && !empty, "partial: false when drained");
}

/* ---- random garbage ---- */

/* Payload sizes of the fixed-size frames, so that made-up headers often declare a size the
 * payload decoder accepts and the field checks get exercised. */
static const uint8_t fixed_len[AL_TYPE_MAX_ + 1] = {
    [AL_HELLO] = 16,   [AL_STARTED] = 4,    [AL_DATA] = 9,   [AL_CREDIT] = 5,  [AL_SIGNAL] = 4,
    [AL_EXIT] = 17,    [AL_FILE_INFO] = 12, [AL_OK] = 8,     [AL_PING] = 8,    [AL_PONG] = 8,
    [AL_SHUTDOWN] = 4, [AL_WAITING] = 4,    [AL_RESIZE] = 4, [AL_CONNECT] = 2,
};

/* A third pure noise; a third a made-up header over small field values; a third a sample frame
 * with a few bytes changed and noise after it. */
static size_t garbage(uint8_t *buf, size_t cap, int kind, uint64_t *s, const struct sample *samples,
                      size_t count)
{
    size_t len = 1 + xorshift(s) % 512;
    for (size_t k = 0; k < len; k++)
        buf[k] = (uint8_t)xorshift(s);
    uint64_t x = xorshift(s);
    if (kind == 1 && len >= HDR) {
        uint8_t type = (uint8_t)(x % (AL_TYPE_MAX_ + 2));
        uint32_t plen = type <= AL_TYPE_MAX_ && fixed_len[type] && (x >> 8) % 4
                            ? fixed_len[type]
                            : (uint32_t)((x >> 16) % (len - HDR + 1));
        header(buf, type, (x >> 40) % 4 ? 0 : (uint8_t)(x >> 48) % 3, (uint32_t)(x >> 24), plen);
        for (size_t k = HDR; k < len; k++)
            buf[k] &= (x >> 56) % 2 ? 0x03 : 0xff;
    } else if (kind == 2) {
        const struct sample *sm = &samples[x % count];
        if (sm->big)
            return len; /* noise instead */
        int n = al_msg_encode(&sm->msg, buf, cap);
        for (int k = 0; k < 1 + (int)((x >> 32) % 4); k++)
            buf[xorshift(s) % (size_t)n] = (uint8_t)xorshift(s);
        len = (size_t)n + (x >> 40) % 64;
        for (size_t k = (size_t)n; k < len; k++)
            buf[k] = (uint8_t)xorshift(s);
    }
    return len;
}

static void test_garbage(const struct sample *samples, size_t count)
{
    static uint8_t buf[8192];
    uint64_t s = 0x243f6a8885a308d3ULL;
    size_t frames = 0, no_magic = 0, not_canonical = 0, errors = 0;

    for (int i = 0; i < 10000; i++) {
        size_t len = garbage(buf, sizeof(buf), i % 3, &s, samples, count);
        struct al_decoder d;
        size_t avail, at = 0;
        al_decoder_init(&d, dbuf, sizeof(dbuf));
        memcpy(al_decoder_space(&d, &avail), buf, len);
        al_decoder_commit(&d, len);
        for (;;) {
            struct al_msg m;
            const char *why;
            int r = al_decoder_next(&d, &m, &why);
            if (r < 0)
                errors++;
            if (r <= 0)
                break;
            frames++;
            if (buf[at] != 'A' || buf[at + 1] != 'L')
                no_magic++;
            size_t flen = raw_frame_size(buf + at);
            int n = al_msg_encode(&m, other, sizeof(other));
            if (n != (int)flen || memcmp(other, buf + at, flen) != 0)
                not_canonical++;
            at += flen;
        }
    }
    diag("random buffers: %zu frames decoded, %zu errors", frames, errors);
    OK(no_magic == 0, "10000 random buffers: no frame without its magic");
    OK(frames > 0 && not_canonical == 0,
       "10000 random buffers: every frame decoded re-encodes to its own bytes");
}

/* ---- names and strings ---- */

static void test_names(void)
{
    bool types = true, classes = true;
    for (int t = 1; t <= AL_TYPE_MAX_; t++) {
        for (int u = 1; u < t; u++)
            types = types && strcmp(al_type_name((uint8_t)t), al_type_name((uint8_t)u)) != 0;
        types = types && strcmp(al_type_name((uint8_t)t), "unknown") != 0;
    }
    for (uint16_t k = 1; k <= AL_ERR_CLASS_MAX_; k++)
        classes = classes && strcmp(al_error_class_name(k), "unknown") != 0;
    OK(types && !strcmp(al_type_name(0), "unknown") &&
           !strcmp(al_type_name(AL_TYPE_MAX_ + 1), "unknown"),
       "al_type_name: distinct names for 1..%d, unknown for 0 and %d", AL_TYPE_MAX_,
       AL_TYPE_MAX_ + 1);
    OK(classes && !strcmp(al_error_class_name(0), "unknown") &&
           !strcmp(al_error_class_name(9), "unknown"),
       "al_error_class_name: names for 1..8, unknown for 0 and 9");
    struct al_str none = al_str_cstr(NULL);
    OK(none.len == 0 && al_str_eq(none, "") && al_str_eq(al_str_cstr("sh"), "sh") &&
           !al_str_eq(al_str_cstr("sh"), "s") && !al_str_eq(al_str_cstr("sh"), "shh"),
       "al_str_cstr and al_str_eq");
}

int main(void)
{
    const struct sample *samples;
    size_t count = fix_samples(&samples);

    setvbuf(stdout, NULL, _IOLBF, 0);
    for (size_t i = 0; i < count; i++)
        test_sample(&samples[i]);
    test_back_to_back(samples, count);
    test_golden();
    test_data_header();
    test_magic();
    test_length();
    test_type_and_flags();
    test_bounds();
    test_untouched();
    test_partial();
    test_garbage(samples, count);
    test_names();

    printf("1..%u\n", tap_count);
    if (tap_failed)
        diag("%u of %u failed", tap_failed, tap_count);
    return tap_failed ? 1 : 0;
}

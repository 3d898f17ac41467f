/* Fuzz target for the frame decoder: the bytes a hostile guest could write on the channel.
 *
 * The input is decoded twice: as much at a time as the decoder takes, then in pieces whose sizes
 * come from the input itself. Both passes must yield the same frames and end the same way. Each
 * frame must re-encode to exactly the bytes it came from, and decoding that re-encoding must give
 * the same fields. Any difference aborts. */
#include "airlock-proto.h"
#include "fuzz.h"
#include "proto-fixtures.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HDR AL_FRAME_HEADER_SIZE

static uint8_t dbuf[HDR + AL_FRAME_PAYLOAD_MAX];
static uint8_t enc[HDR + AL_FRAME_PAYLOAD_MAX];

static void fail(const char *what, size_t at)
{
    fprintf(stderr, "fuzz-frame: %s (frame at byte %zu)\n", what, at);
    abort();
}

/* Checks the frame m decoded from bytes + at; returns its size. */
static size_t check_frame(const struct al_msg *m, const uint8_t *bytes, size_t size, size_t at)
{
    if (size - at < HDR || bytes[at] != AL_FRAME_MAGIC0 || bytes[at + 1] != AL_FRAME_MAGIC1)
        fail("a frame without its magic", at);
    size_t flen = raw_frame_size(bytes + at);
    if (flen > size - at)
        fail("a frame longer than the input", at);

    int n = al_msg_encode(m, enc, sizeof(enc));
    if (n < 0)
        fail("a decoded frame does not encode", at);
    if ((size_t)n != flen || memcmp(enc, bytes + at, flen) != 0)
        fail("a decoded frame re-encodes to other bytes", at);

    struct al_header h;
    struct al_msg again;
    const char *why, *field;
    if (al_header_decode(enc, (size_t)n, &h, &why) < 0 ||
        al_msg_decode(&h, enc + HDR, &again, &why) < 0)
        fail("a re-encoded frame does not decode", at);
    if (!fix_msg_same(m, &again, &field)) {
        fprintf(stderr, "fuzz-frame: field %s\n", field);
        fail("a field differs after re-encoding and decoding", at);
    }
    return flen;
}

struct outcome {
    size_t frames;
    size_t consumed; /* bytes of the frames taken out */
    int last;        /* al_decoder_next's last answer: 0 or an error */
};

/* Piece sizes come from the input: the byte at the feed position picks 1..32 bytes, or with its
 * top bits set a large piece, so that headers and payloads are split at every place. */
static size_t piece_at(const uint8_t *data, size_t size, size_t fed, bool whole)
{
    if (whole)
        return size - fed;
    uint8_t b = data[fed];
    return b >= 0xf0 ? (size_t)(b - 0xef) * 1024 : (size_t)(b & 31) + 1;
}

static struct outcome run(const uint8_t *data, size_t size, bool whole)
{
    struct al_decoder d;
    struct outcome o = {0, 0, 0};
    size_t fed = 0;

    al_decoder_init(&d, dbuf, sizeof(dbuf));
    while (fed < size) {
        size_t avail, n = piece_at(data, size, fed, whole);
        uint8_t *space = al_decoder_space(&d, &avail);
        if (n > size - fed)
            n = size - fed;
        if (n > avail)
            n = avail;
        if (n == 0)
            fail("the decoder is full but wants more", o.consumed); /* a frame fits its buffer */
        memcpy(space, data + fed, n);
        al_decoder_commit(&d, n);
        fed += n;
        for (;;) {
            struct al_msg m;
            const char *why;
            o.last = al_decoder_next(&d, &m, &why);
            if (o.last < 0)
                return o;
            if (o.last == 0)
                break;
            o.consumed += check_frame(&m, data, size, o.consumed);
            o.frames++;
        }
        if (al_decoder_partial(&d) != (fed > o.consumed))
            fail("al_decoder_partial disagrees with the bytes held", o.consumed);
    }
    return o;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct outcome a = run(data, size, true);
    struct outcome b = run(data, size, false);
    if (a.frames != b.frames || a.last != b.last || a.consumed != b.consumed)
        fail("piece sizes changed what was decoded", b.consumed);
    return 0;
}

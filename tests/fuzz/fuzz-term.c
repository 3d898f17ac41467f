/* Fuzz target for the terminal sanitizer (orchestrator/base/term.c): the bytes a hostile guest
 * writes to its stdout. The first input byte picks where the stream is cut; the rest is the
 * stream. Whatever the input: the output holds no C0 control but newline and tab, no DEL, and is
 * valid UTF-8 with no C1 control; it fits AL_TERM_OUT_MAX; the stream cut in pieces renders as
 * the whole; valid UTF-8 without controls passes unchanged; al_term_escape stays within its
 * buffer. And al_term_pass (a terminal run's filter) lets through no string sequence, request,
 * window operation, stray control or bad UTF-8, and renders a stream in pieces as the whole.
 * Any violation aborts. */
#include "airlock.h"
#include "airlock/policy.h"
#include "airlock/text.h"
#include "fuzz.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void fail(const char *what)
{
    fprintf(stderr, "fuzz-term: %s\n", what);
    abort();
}

/* Written apart from term.c on purpose: a second reading of UTF-8. Returns false on any
 * invalid sequence; *controls is set when a C0 (but \n, \t), DEL, CR or C1 appears. */
static bool utf8_ok(const uint8_t *p, size_t n, bool *controls)
{
    *controls = false;
    for (size_t i = 0; i < n;) {
        uint32_t c = p[i], need, min;
        if (c < 0x80) {
            if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f)
                *controls = true;
            i++;
            continue;
        }
        if ((c & 0xe0) == 0xc0)
            need = 1, min = 0x80, c &= 0x1f;
        else if ((c & 0xf0) == 0xe0)
            need = 2, min = 0x800, c &= 0x0f;
        else if ((c & 0xf8) == 0xf0)
            need = 3, min = 0x10000, c &= 0x07;
        else
            return false;
        if (i + need >= n)
            return false;
        for (uint32_t k = 1; k <= need; k++) {
            if ((p[i + k] & 0xc0) != 0x80)
                return false;
            c = c << 6 | (p[i + k] & 0x3f);
        }
        if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))
            return false;
        if (c <= 0x9f)
            *controls = true;
        i += need + 1;
    }
    return true;
}

/* What al_term_pass let through, read again: no string introducer (OSC, DCS, SOS, PM, APC), no
 * C1 control, no C0 control a terminal run does not need, no window operation (CSI t), no
 * CSI with a $ (requests) or an = marker (DA3), valid UTF-8 apart from the escapes. */
static void pass_check(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint8_t c = p[i];
        if (c == 0x1b) {
            if (i + 1 >= n)
                fail("al_term_pass let a lone ESC end the output");
            if (strchr("]PX^_", p[i + 1]))
                fail("al_term_pass let a string sequence through");
            if (p[i + 1] != '[')
                continue;
            size_t j = i + 2;
            while (j < n && (p[j] < 0x40 || p[j] > 0x7e)) {
                if (p[j] == '$' || (j == i + 2 && p[j] == '='))
                    fail("al_term_pass let a request through");
                j++;
            }
            if (j >= n)
                fail("al_term_pass let a CSI through without its end");
            if (p[j] == 't')
                fail("al_term_pass let a window operation through");
            i = j;
        } else if ((c < 0x20 && !(c == 0x07 || (c >= 0x08 && c <= 0x0d))) || c == 0x7f) {
            fail("al_term_pass let a control through");
        }
    }
    /* Without the escape sequences, valid UTF-8 with no C1. */
    bool controls;
    uint8_t *text = malloc(n + 1);
    size_t t = 0;
    if (!text)
        fail("out of memory");
    for (size_t i = 0; i < n; i++) {
        if (p[i] == 0x1b) {
            i++;
            if (i < n && p[i] == '[')
                while (++i < n && (p[i] < 0x40 || p[i] > 0x7e))
                    ;
            else
                while (i < n && p[i] >= 0x20 && p[i] <= 0x2f)
                    i++;
            continue;
        }
        if (p[i] >= 0x20)
            text[t++] = p[i];
    }
    if (!utf8_ok(text, t, &controls) || controls)
        fail("al_term_pass let bad UTF-8 or a C1 control through");
    free(text);
}

static void pass_fuzz(uint8_t seed, const uint8_t *in, size_t n)
{
    char *whole = malloc(AL_TERM_PASS_OUT_MAX(n)), *cut = malloc(AL_TERM_PASS_OUT_MAX(n) * 2);
    if (!whole || !cut)
        fail("out of memory");
    al_term_pass_state st = {0};
    size_t wlen = al_term_pass(&st, in, n, whole);
    if (wlen > AL_TERM_PASS_OUT_MAX(n))
        fail("output over AL_TERM_PASS_OUT_MAX");
    pass_check((const uint8_t *)whole, wlen);
    size_t step = 1 + seed % 7, clen = 0;
    st = (al_term_pass_state){0};
    for (size_t off = 0; off < n; off += step)
        clen += al_term_pass(&st, in + off, off + step <= n ? step : n - off, cut + clen);
    if (clen != wlen || memcmp(cut, whole, wlen))
        fail("al_term_pass: the stream in pieces differs from the whole");
    free(whole);
    free(cut);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t seed = data[0];
    const uint8_t *in = data + 1;
    size_t n = size - 1;
    pass_fuzz(seed, in, n);
    char *whole = malloc(AL_TERM_OUT_MAX(n) + 3);
    char *cut = malloc(AL_TERM_OUT_MAX(n) * 2 + 12);
    if (!whole || !cut)
        fail("out of memory");

    al_term_state st = {0};
    size_t wlen = al_term_sanitize(&st, in, n, whole);
    if (wlen > AL_TERM_OUT_MAX(n))
        fail("output over AL_TERM_OUT_MAX");
    wlen += al_term_sanitize_end(&st, whole + wlen);
    bool controls;
    if (!utf8_ok((const uint8_t *)whole, wlen, &controls))
        fail("output is not valid UTF-8");
    if (controls)
        fail("a control character came out");

    /* The same stream in pieces of 1 + (seed % 7) bytes, then cut at seed. */
    size_t step = 1 + seed % 7, clen = 0;
    st = (al_term_state){0};
    for (size_t off = 0; off < n; off += step)
        clen += al_term_sanitize(&st, in + off, off + step <= n ? step : n - off, cut + clen);
    clen += al_term_sanitize_end(&st, cut + clen);
    if (clen != wlen || memcmp(cut, whole, wlen))
        fail("the stream in pieces renders differently from the whole");
    size_t at = n ? seed % (n + 1) : 0;
    st = (al_term_state){0};
    clen = al_term_sanitize(&st, in, at, cut);
    clen += al_term_sanitize(&st, in + at, n - at, cut + clen);
    clen += al_term_sanitize_end(&st, cut + clen);
    if (clen != wlen || memcmp(cut, whole, wlen))
        fail("the stream cut in two renders differently from the whole");

    /* Text with no control characters and no CR is left as it is. */
    if (utf8_ok(in, n, &controls) && !controls && !memchr(in, '\r', n) &&
        (wlen != n || memcmp(whole, in, n)))
        fail("valid text was changed");

    /* One line into a small buffer. */
    char *s = malloc(n + 1), line[1 + 37];
    if (!s)
        fail("out of memory");
    memcpy(s, in, n);
    s[n] = '\0';
    size_t len = 1 + seed % 37;
    al_term_escape(s, line, len);
    size_t got = strnlen(line, len);
    if (got >= len)
        fail("al_term_escape ran past its buffer");
    if (!utf8_ok((const uint8_t *)line, got, &controls) || controls || memchr(line, '\n', got) ||
        memchr(line, '\t', got))
        fail("al_term_escape left a control or cut a character");
    free(s);
    free(whole);
    free(cut);
    return 0;
}

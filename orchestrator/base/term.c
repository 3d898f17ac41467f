/* Bytes from the guest made safe for a terminal. Guest output, guest error text and anything
 * the model repeats of them may hold escape sequences (OSC 52 writes the clipboard, SGR 8 hides
 * text, CSI moves the cursor over what was shown); here every control character becomes
 * visible text, and valid UTF-8 passes unchanged. One pure function over a small state, so a
 * stream cut anywhere renders the same as the whole (tests/fuzz/fuzz-term.c checks that). */
#include "util.h"

#include <string.h>

static const char replacement[] = "\xef\xbf\xbd"; /* U+FFFD */

/* Decodes the UTF-8 sequence at p (n bytes available, p[0] >= 0x80). Returns its length with
 * *cp set; -1 when the n bytes are a valid start of a longer sequence (only when !final); 0 when
 * invalid, with *bad the bytes to show as one U+FFFD (the longest valid start, at least 1). */
static int utf8_decode(const unsigned char *p, size_t n, bool final, uint32_t *cp, size_t *bad)
{
    unsigned char c = p[0];
    size_t len;
    unsigned char lo = 0x80, hi = 0xbf; /* the second byte's range */
    *bad = 1;
    if (c >= 0xc2 && c <= 0xdf)
        len = 2;
    else if (c >= 0xe0 && c <= 0xef)
        len = 3;
    else if (c >= 0xf0 && c <= 0xf4)
        len = 4;
    else
        return 0;
    /* No overlong forms, no surrogates, nothing past U+10FFFF. */
    if (c == 0xe0)
        lo = 0xa0;
    else if (c == 0xed)
        hi = 0x9f;
    else if (c == 0xf0)
        lo = 0x90;
    else if (c == 0xf4)
        hi = 0x8f;
    uint32_t v = c & (len == 2 ? 0x1fu : len == 3 ? 0x0fu : 0x07u);
    for (size_t i = 1; i < len; i++) {
        if (i >= n) {
            *bad = i;
            return final ? 0 : -1;
        }
        unsigned char b = p[i];
        if (i == 1 ? b < lo || b > hi : b < 0x80 || b > 0xbf) {
            *bad = i;
            return 0;
        }
        v = v << 6 | (b & 0x3fu);
    }
    *cp = v;
    return (int)len;
}

size_t al_utf8_len(const uint8_t *p, size_t n)
{
    if (!n)
        return 0;
    if (p[0] < 0x80)
        return 1;
    uint32_t cp;
    size_t bad;
    int len = utf8_decode(p, n, true, &cp, &bad);
    return len > 0 ? (size_t)len : 0;
}

char *al_utf8_repair(const uint8_t *p, size_t n, bool *lossy)
{
    char *out = malloc(3 * n + 1); /* a bad byte becomes U+FFFD, 3 bytes */
    if (!out)
        return NULL;
    size_t o = 0;
    bool bad = false;
    for (size_t i = 0, k; i < n; i += k) {
        k = p[i] ? al_utf8_len(p + i, n - i) : 1;
        if (k && p[i]) {
            memcpy(out + o, p + i, k);
            o += k;
        } else {
            memcpy(out + o, "\xef\xbf\xbd", 3);
            o += 3;
            bad = true;
            k = 1;
        }
    }
    out[o] = '\0';
    if (lossy)
        *lossy = bad;
    return out;
}

/* One unit at in[0..n): writes its rendering to out (at most 4 bytes) and returns the bytes
 * it took, or 0 when in holds only the start of a UTF-8 sequence (never when final). */
static size_t term_step(const unsigned char *in, size_t n, bool final, bool oneline, bool *cr,
                        char *out, size_t *olen)
{
    unsigned char c = in[0];
    bool after_cr = *cr;
    *cr = false;
    *olen = 0;
    if (c == '\n' && after_cr)
        return 1; /* the CR of a CRLF already ended the line */
    if (c == '\n' || c == '\t' || c == '\r') {
        /* A lone CR starts a new line rather than going back over this one: nothing the guest
         * wrote can be written over on screen. */
        out[(*olen)++] = oneline ? ' ' : c == '\t' ? '\t' : '\n';
        *cr = c == '\r';
        return 1;
    }
    if (c < 0x20 || c == 0x7f) { /* caret notation: ESC is ^[, DEL ^? */
        out[(*olen)++] = '^';
        out[(*olen)++] = (char)(c ^ 0x40);
        return 1;
    }
    if (c < 0x80) {
        out[(*olen)++] = (char)c;
        return 1;
    }
    uint32_t cp = 0;
    size_t bad;
    int len = utf8_decode(in, n, final, &cp, &bad);
    if (len < 0)
        return 0;
    if (len == 0 || cp <= 0x9f) { /* not UTF-8, or a C1 control (0x9b is CSI) */
        memcpy(out, replacement, 3);
        *olen = 3;
        return len == 0 ? bad : (size_t)len;
    }
    memcpy(out, in, (size_t)len);
    *olen = (size_t)len;
    return (size_t)len;
}

size_t al_term_sanitize(al_term_state *st, const void *data, size_t n, char *out)
{
    const unsigned char *in = data;
    size_t o = 0, i = 0, olen;
    bool cr = st->cr;
    /* First the sequence the last chunk cut, completed from this one a byte at a time. */
    while (st->npart && i < n) {
        st->part[st->npart++] = in[i++];
        size_t took = term_step(st->part, st->npart, false, false, &cr, out + o, &olen);
        if (took == 0)
            continue; /* still a valid start, and npart < 4 */
        o += olen;
        /* Anything the unit did not take was the byte just added: read it again below. */
        i -= st->npart - took;
        st->npart = 0;
    }
    while (i < n) {
        size_t took = term_step(in + i, n - i, false, false, &cr, out + o, &olen);
        if (took == 0) {
            memcpy(st->part, in + i, n - i); /* fewer than 4 bytes */
            st->npart = (unsigned char)(n - i);
            break;
        }
        o += olen;
        i += took;
    }
    st->cr = cr;
    return o;
}

size_t al_term_sanitize_end(al_term_state *st, char *out)
{
    size_t o = 0;
    if (st->npart) {
        memcpy(out, replacement, 3);
        o = 3;
    }
    *st = (al_term_state){0};
    return o;
}

const char *al_term_escape(const char *s, char *buf, size_t len)
{
    const unsigned char *in = (const unsigned char *)s;
    size_t n = strlen(s), o = 0;
    bool cr = false;
    if (!len)
        return buf;
    for (size_t i = 0; i < n;) {
        char unit[4];
        size_t olen;
        i += term_step(in + i, n - i, true, true, &cr, unit, &olen);
        if (o + olen >= len)
            break; /* cut between characters, never inside one */
        memcpy(buf + o, unit, olen);
        o += olen;
    }
    buf[o] = '\0';
    return buf;
}

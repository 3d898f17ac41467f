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

/* ---- a terminal run's bytes on the user's terminal (al_term_pass) ----
 *
 * A terminal run is interactive: a shell and full-screen programs need colours, the cursor,
 * the alternate screen, bracketed paste and mouse reporting. What they never need, and a
 * hostile guest would use, is anything that reaches past the screen (OSC 52 writes the
 * clipboard, OSC 0 the window's title) or makes the terminal type an answer back into the
 * session, or into the host's shell once the run is over (CSI 21 t reports the title, DECRQSS
 * and other DCS strings, ENQ's answerback, palette and font queries). The sequences are read
 * as a VT parser reads them (ECMA-48's shapes: ESC, CSI, the strings); each passes whole or is
 * dropped whole, so nothing half-read can start a sequence in the terminal. */

enum {
    PASS_GROUND,
    PASS_ESC,
    PASS_ESC_INTER,
    PASS_CSI,
    PASS_CSI_DROP,
    PASS_STRING,
    PASS_STRING_ESC
};

/* The C0 controls a terminal run uses: BEL, BS, HT, LF, VT, FF, CR. Not ENQ (answerback), not
 * SO/SI (a character set swapped under the user's prompt), not the rest. */
static bool pass_control(unsigned char c)
{
    return c == 0x07 || (c >= 0x08 && c <= 0x0d);
}

/* An escape sequence without CSI, its intermediates in seq[1..n-1), final f. */
static bool pass_esc(const char *seq, size_t n, unsigned char f)
{
    if (n == 1) /* DECSC, DECRC, keypad modes, IND, NEL, HTS, RI, RIS */
        return f == '7' || f == '8' || f == '=' || f == '>' || f == 'D' || f == 'E' || f == 'H' ||
               f == 'M' || f == 'c';
    if (n != 2)
        return false;
    /* a character set designated (G0..G3), a line's width or DECALN */
    if (strchr("()*+", seq[1]))
        return f == 'B' || f == '0' || f == 'A' || f == 'U';
    return seq[1] == '#' && strchr("34568", f);
}

/* A CSI sequence: seq[2..n) its parameter and intermediate bytes, f its final byte. */
static bool pass_csi(const char *seq, size_t n, unsigned char f)
{
    const char *p = seq + 2, *end = seq + n;
    char marker = p < end && strchr("<=>?", *p) ? *p++ : 0;
    const char *inter = p;
    while (inter < end && *inter >= 0x30 && *inter <= 0x3f)
        inter++; /* parameters */
    for (const char *i = inter; i < end; i++)
        if (*i < 0x20 || *i > 0x2f)
            return false; /* a parameter after an intermediate: no sequence of any terminal */
    size_t plen = (size_t)(inter - p), ilen = (size_t)(end - inter);
    if (ilen) /* DECSCUSR (cursor shape), DECSTR (soft reset), DECSCA; no request ($) */
        return ilen == 1 && !marker &&
               ((inter[0] == ' ' && f == 'q') || (inter[0] == '!' && f == 'p') ||
                (inter[0] == '"' && f == 'q'));
    switch (marker) {
    case '?': /* DEC private modes set, reset, saved, restored; selective erase; DSR ?6 */
        return strchr("hlrsJK", f) || (f == 'n' && plen == 1 && p[0] == '6');
    case '>': /* DA2 (its answer is the terminal's kind and version), modifyOtherKeys */
        return f == 'c' || f == 'm';
    case 0:
        break;
    default: /* DA3 answers the terminal's unit id; the rest are queries or input */
        return false;
    }
    if (f == 'n') /* DSR: status ("OK") and the cursor's position, nothing else */
        return plen == 1 && (p[0] == '5' || p[0] == '6');
    /* Cursor, erase, insert and delete, scrolling, tabs, modes, SGR, the scroll region, save and
     * restore, DA1. Not t (window operations: title and size reports, iconify, resize), not x
     * (DECREQTPARM), i (the printer), y (tests), q (LEDs). */
    return f != 0 && strchr("@ABCDEFGHIJKLMPSTXZ`abcdefghlmrsu", f) != NULL;
}

static void pass_emit(char *out, size_t *o, const void *p, size_t n)
{
    memcpy(out + *o, p, n);
    *o += n;
}

/* One byte of a UTF-8 sequence in ground state. */
static void pass_utf8(al_term_pass_state *st, unsigned char c, char *out, size_t *o)
{
    if (st->npart && (c & 0xc0) != 0x80) { /* a sequence cut short: shown as U+FFFD */
        pass_emit(out, o, replacement, 3);
        st->npart = 0;
    }
    if (!st->npart && c < 0xc2) { /* a stray continuation byte, an overlong or a bad lead */
        pass_emit(out, o, replacement, 3);
        return;
    }
    st->part[st->npart++] = c;
    uint32_t cp;
    size_t bad;
    int len = utf8_decode(st->part, st->npart, false, &cp, &bad);
    if (len < 0)
        return; /* more to come */
    if (len > 0 && cp > 0x9f)
        pass_emit(out, o, st->part, (size_t)len);
    else if (len == 0)
        pass_emit(out, o, replacement, 3);
    /* else a C1 control (U+0080..U+009F; U+009B is CSI to some terminals): dropped */
    size_t used = len > 0 ? (size_t)len : bad;
    unsigned char rest[4];
    size_t nrest = st->npart - used;
    memcpy(rest, st->part + used, nrest);
    st->npart = 0;
    for (size_t i = 0; i < nrest; i++)
        pass_utf8(st, rest[i], out, o);
}

static void pass_byte(al_term_pass_state *st, unsigned char c, char *out, size_t *o)
{
    /* CAN and SUB end any sequence; ESC starts a new one (and ends a string) */
    if (st->state != PASS_GROUND && st->state != PASS_STRING && st->state != PASS_STRING_ESC &&
        (c == 0x18 || c == 0x1a)) {
        st->state = PASS_GROUND;
        return;
    }
    switch (st->state) {
    case PASS_GROUND:
        if (c >= 0x80 || st->npart) {
            if (c < 0x80) { /* ASCII after a cut sequence */
                pass_emit(out, o, replacement, 3);
                st->npart = 0;
                pass_byte(st, c, out, o);
                return;
            }
            pass_utf8(st, c, out, o);
        } else if (c == 0x1b) {
            st->state = PASS_ESC;
            st->seq[0] = 0x1b;
            st->nseq = 1;
        } else if (c >= 0x20 && c < 0x7f) {
            out[(*o)++] = (char)c;
        } else if (pass_control(c)) {
            out[(*o)++] = (char)c;
        }
        return;
    case PASS_ESC:
    case PASS_ESC_INTER:
        if (c == 0x1b) {
            st->nseq = 1;
            st->state = PASS_ESC;
        } else if (c < 0x20) {
            st->state = PASS_GROUND; /* a control inside: the sequence is dropped */
            pass_byte(st, c, out, o);
        } else if (st->state == PASS_ESC && c == '[') {
            st->seq[st->nseq++] = (char)c;
            st->state = PASS_CSI;
        } else if (st->state == PASS_ESC &&
                   (c == ']' || c == 'P' || c == 'X' || c == '^' || c == '_')) {
            st->state = PASS_STRING; /* OSC, DCS, SOS, PM, APC: dropped whole */
        } else if (c < 0x30) {
            if (st->nseq < sizeof(st->seq))
                st->seq[st->nseq++] = (char)c;
            st->state = PASS_ESC_INTER;
        } else {
            if (c < 0x7f && st->nseq < sizeof(st->seq) && pass_esc(st->seq, st->nseq, c)) {
                pass_emit(out, o, st->seq, st->nseq);
                out[(*o)++] = (char)c;
            }
            st->state = PASS_GROUND;
        }
        return;
    case PASS_CSI:
    case PASS_CSI_DROP:
        if (c == 0x1b) {
            st->nseq = 1;
            st->state = PASS_ESC;
        } else if (c < 0x20) {
            st->state = PASS_GROUND;
            pass_byte(st, c, out, o);
        } else if (c >= 0x40 && c <= 0x7e) {
            if (st->state == PASS_CSI && pass_csi(st->seq, st->nseq, c)) {
                pass_emit(out, o, st->seq, st->nseq);
                out[(*o)++] = (char)c;
            }
            st->state = PASS_GROUND;
        } else if (c >= 0x7f || st->nseq >= sizeof(st->seq)) {
            st->state = PASS_CSI_DROP; /* too long, or not a CSI byte: read to its end */
        } else {
            st->seq[st->nseq++] = (char)c;
        }
        return;
    case PASS_STRING:
        if (c == 0x1b)
            st->state = PASS_STRING_ESC;
        else if (c == 0x07 || c == 0x18 || c == 0x1a)
            st->state = PASS_GROUND;
        return;
    case PASS_STRING_ESC:
        if (c == '\\') {
            st->state = PASS_GROUND;
        } else { /* ESC ends the string and starts a sequence */
            st->state = PASS_ESC;
            st->seq[0] = 0x1b;
            st->nseq = 1;
            pass_byte(st, c, out, o);
        }
        return;
    }
}

size_t al_term_pass(al_term_pass_state *st, const void *data, size_t n, char *out)
{
    const unsigned char *in = data;
    size_t o = 0;
    for (size_t i = 0; i < n; i++)
        pass_byte(st, in[i], out, &o);
    return o;
}

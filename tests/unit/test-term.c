/* Text from the guest on a terminal (orchestrator/base/term.c) and the error messages that quote it
 * (error.c): escape sequences shown, not obeyed; UTF-8 intact; a stream cut anywhere renders
 * as the whole does. TAP. */
#include "util.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "tap.h"

/* The whole input in one call, then the end. */
static const char *whole(const char *in, size_t n)
{
    static char out[AL_TERM_OUT_MAX(256) + 4];
    al_term_state st = {0};
    size_t len = al_term_sanitize(&st, in, n, out);
    len += al_term_sanitize_end(&st, out + len);
    out[len] = '\0';
    return out;
}

static bool same(const char *in, const char *want)
{
    const char *got = whole(in, strlen(in));
    if (strcmp(got, want))
        printf("# got '%s', want '%s'\n", got, want);
    return !strcmp(got, want);
}

/* No byte a terminal obeys: C0 but \n and \t, DEL, ESC; and no C1 control in UTF-8 or raw. */
static bool inert(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f ||
            (c >= 0x80 && c <= 0x9f && (i == 0 || (unsigned char)s[i - 1] == 0xc2)))
            return false;
    }
    return true;
}

static void test_controls(void)
{
    ok(same("plain text, 100%\n", "plain text, 100%\n"), "printable ASCII passes");
    ok(same("a\tb\n", "a\tb\n"), "tab and newline pass");
    /* OSC 52: sets the clipboard of the user's terminal. */
    ok(same("\033]52;c;cm0gLXJmIH4=\007", "^[]52;c;cm0gLXJmIH4=^G"), "OSC 52 made visible");
    /* SGR 8: conceals text. */
    ok(same("\033[8mhidden\033[0m", "^[[8mhidden^[[0m"), "SGR 8 made visible");
    ok(same("\033]0;title\033\\", "^[]0;title^[\\"), "OSC title with ST made visible");
    ok(same("x\by\x7f", "x^Hy^?"), "backspace and DEL in caret notation");
    ok(same(whole("\0", 1), "^@"), "NUL shown");
    ok(same("crlf\r\nnext", "crlf\nnext"), "CRLF is one newline");
    ok(same("safe\rEVIL", "safe\nEVIL"), "a lone CR starts a new line, overwrites nothing");
    ok(same("\r\r\n", "\n\n"), "CR CR LF: two newlines");
}

static void test_utf8(void)
{
    ok(same("héllo ✓ 𝄞 日本", "héllo ✓ 𝄞 日本"), "valid UTF-8 passes unchanged");
    ok(same("\xc2\x9b\x33\x31m", "\xef\xbf\xbd\x33\x31m"),
       "C1 CSI (U+009B) as UTF-8 becomes U+FFFD");
    ok(same("\x9b\x33\x31m", "\xef\xbf\xbd\x33\x31m"), "a raw 0x9b byte becomes U+FFFD");
    ok(same("\xc2\x85", "\xef\xbf\xbd"), "NEL (U+0085) becomes U+FFFD");
    ok(same("\xc2\xa0", "\xc2\xa0"), "U+00A0, the first code point after C1, passes");
    ok(same("\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd"), "overlong form refused");
    ok(same("\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"), "surrogate refused");
    ok(same("\xf4\x90\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"),
       "past U+10FFFF refused");
    ok(same("\xe2\x82\x41", "\xef\xbf\xbd\x41"),
       "a cut sequence is one U+FFFD, the next byte kept");
    ok(same("ab\xe2\x82", "ab\xef\xbf\xbd"), "a sequence cut by the end of the stream is shown");
    ok(same("\xff\xfe", "\xef\xbf\xbd\xef\xbf\xbd"), "bytes never in UTF-8 refused");
}

/* al_utf8_len and al_utf8_valid (results, the daemon's JSON text): the same reading. */
static void test_utf8_len(void)
{
    static const struct {
        const char *s;
        size_t n, len;
    } cases[] = {
        {"A", 1, 1},
        {"\xc3\xa9", 2, 2},
        {"\xe2\x9c\x93", 3, 3},
        {"\xf0\x9d\x84\x9e", 4, 4},
        {"\xc0\xaf", 2, 0},
        {"\xe0\x80\xaf", 3, 0},
        {"\xed\xa0\x80", 3, 0},
        {"\xf4\x90\x80\x80", 4, 0},
        {"\xe2\x9c", 2, 0},
        {"\x80", 1, 0},
        {"\xff", 1, 0},
        {"", 0, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        ok(al_utf8_len((const uint8_t *)cases[i].s, cases[i].n) == cases[i].len,
           "al_utf8_len case %zu is %zu", i, cases[i].len);
    ok(al_utf8_len((const uint8_t *)"\xe2\x9c\x93", 2) == 0, "a sequence past n is cut: 0");
    const char *good = "h\xc3\xa9llo \xe2\x9c\x93 \xf0\x9d\x84\x9e";
    ok(al_utf8_valid((const uint8_t *)good, strlen(good)), "al_utf8_valid: valid text");
    ok(!al_utf8_valid((const uint8_t *)"ok\xe2\x9c", 4), "al_utf8_valid: cut at the end");
    ok(!al_utf8_valid((const uint8_t *)"a\xc0\xaf"
                                       "b",
                      4),
       "al_utf8_valid: overlong inside");
}

/* Every split of each sample into two and three pieces renders as the whole. */
static void test_streaming(void)
{
    static const char *const samples[] = {
        "a\r\nb",
        "x\xe2\x9c\x93y",
        "\xf0\x9d\x84\x9ez",
        "\xe2\x82"
        "A",
        "\xc2\x9b[1m",
        "\033]52;c;AA==\007",
        "\r",
        "\xf0\x9d\x84",
        "é\r\n\xed\xa0\x80\xc3",
    };
    bool all = true;
    for (size_t k = 0; k < sizeof(samples) / sizeof(*samples); k++) {
        const char *in = samples[k];
        size_t n = strlen(in);
        char want[AL_TERM_OUT_MAX(256) + 4];
        snprintf(want, sizeof(want), "%s", whole(in, n));
        for (size_t a = 0; a <= n; a++)
            for (size_t b = a; b <= n; b++) {
                char out[AL_TERM_OUT_MAX(64) * 3];
                al_term_state st = {0};
                size_t len = al_term_sanitize(&st, in, a, out);
                len += al_term_sanitize(&st, in + a, b - a, out + len);
                len += al_term_sanitize(&st, in + b, n - b, out + len);
                len += al_term_sanitize_end(&st, out + len);
                out[len] = '\0';
                if (strcmp(out, want)) {
                    printf("# sample %zu split at %zu,%zu: '%s' not '%s'\n", k, a, b, out, want);
                    all = false;
                }
            }
    }
    ok(all, "a stream cut anywhere renders as the whole");
}

static void test_bounds(void)
{
    /* The worst case: every byte a U+FFFD of its own. */
    char in[256], out[AL_TERM_OUT_MAX(256)];
    memset(in, 0x80, sizeof(in));
    al_term_state st = {.part = {0xe2}, .npart = 1};
    size_t len = al_term_sanitize(&st, in, sizeof(in), out);
    ok(len <= AL_TERM_OUT_MAX(sizeof(in)) && inert(out, len), "output within AL_TERM_OUT_MAX");
    char all[256];
    for (int i = 0; i < 256; i++)
        all[i] = (char)i;
    st = (al_term_state){0};
    len = al_term_sanitize(&st, all, sizeof(all), out);
    ok(inert(out, len), "all 256 byte values: nothing a terminal obeys comes out");
}

static void test_escape(void)
{
    char buf[64];
    ok(!strcmp(al_term_escape("one\ntwo\r\nthree\tfour", buf, sizeof(buf)), "one two three four"),
       "al_term_escape: one line");
    ok(!strcmp(al_term_escape("\033[2J", buf, sizeof(buf)), "^[[2J"), "al_term_escape: ESC");
    char small[4];
    ok(!strcmp(al_term_escape("aé", small, sizeof(small)), "aé"), "fits exactly");
    ok(!strcmp(al_term_escape("ab\xe2\x9c\x93", small, sizeof(small)), "ab"),
       "cut before a character that does not fit, never inside it");
    ok(!strcmp(al_term_escape("\033", small, 2), ""), "a caret pair is not split");
}

static void test_errors(void)
{
    al_error e = {0};
    al_err(&e, -EIO, "guest said: %s", "\033]52;c;cm0gLXJmIH4=\007\033[8mhidden\nline");
    ok(!strchr(e.msg, '\033') && !strchr(e.msg, '\007') && !strchr(e.msg, '\n'),
       "al_err: a quoted guest string loses its controls (%s)", e.msg);
    ok(strstr(e.msg, "^[]52;c;") != NULL, "al_err: and shows them");
    al_error big = {0};
    char longmsg[2000];
    memset(longmsg, 'x', sizeof(longmsg) - 1);
    longmsg[sizeof(longmsg) - 1] = '\0';
    longmsg[509] = '\033';
    al_err(&big, -EIO, "%s", longmsg);
    ok(strlen(big.msg) < sizeof(big.msg) && !strchr(big.msg, '\033'),
       "al_err: long message cut safely");
}

/* ---- al_term_pass: a terminal run's bytes ---- */

static const char *passed(const char *in, size_t n)
{
    static char out[AL_TERM_PASS_OUT_MAX(512) + 1];
    al_term_pass_state st = {0};
    size_t len = al_term_pass(&st, in, n, out);
    out[len] = '\0';
    return out;
}

static bool pass_is(const char *in, const char *want)
{
    const char *got = passed(in, strlen(in));
    if (strcmp(got, want)) {
        char a[600], b[600];
        printf("# got '%s', want '%s'\n", al_term_escape(got, a, sizeof(a)),
               al_term_escape(want, b, sizeof(b)));
    }
    return !strcmp(got, want);
}

static void test_pass(void)
{
    /* What a shell and full-screen programs need passes as it is. */
    ok(pass_is("\033[1;31mred\033[0m\r\n", "\033[1;31mred\033[0m\r\n"), "SGR and CRLF pass");
    ok(pass_is("\033[?1049h\033[H\033[2J\033[?25l", "\033[?1049h\033[H\033[2J\033[?25l"),
       "alternate screen, cursor home, erase, hidden cursor pass");
    ok(pass_is("\033[?2004h\033[?1000h\033[?1006h", "\033[?2004h\033[?1000h\033[?1006h"),
       "bracketed paste and mouse reporting pass");
    ok(pass_is("\033[6n\033[?6n\033[5n\033[c\033[>c", "\033[6n\033[?6n\033[5n\033[c\033[>c"),
       "cursor position, status and device attribute queries pass");
    ok(pass_is("\0337\0338\033(B\033)0\033M\033[2 q\033[3;20r",
               "\0337\0338\033(B\033)0\033M\033[2 q\033[3;20r"),
       "save/restore, charsets, reverse index, cursor shape, scroll region pass");
    ok(pass_is("na\xc3\xafve \xe4\xb8\x96\x07\x08\t", "na\xc3\xafve \xe4\xb8\x96\x07\x08\t"),
       "UTF-8, BEL, BS, HT pass");
    /* What reaches past the screen or types an answer back is dropped whole. */
    ok(pass_is("a\033]52;c;cm0gLXJmIH4=\007b", "ab"), "OSC 52 (clipboard write) dropped");
    ok(pass_is("a\033]0;evil title\033\\b", "ab"), "OSC 0 (title) dropped, ST form");
    ok(pass_is("a\033]11;?\007b\033]4;1;?\033\\c", "abc"), "colour queries dropped");
    ok(pass_is("a\033[21tb\033[14t\033[8;100;200t", "ab"), "window reports and resizes dropped");
    ok(pass_is("a\033P$qm\033\\b", "ab"), "DECRQSS (DCS) dropped");
    ok(pass_is("a\033_Gf=100;AAAA\033\\b\033^pm\033\\\033Xsos\033\\", "ab"),
       "APC, PM and SOS dropped");
    ok(pass_is("a\005b\016c\017de\177", "abcde"), "ENQ, SO, SI, DEL dropped");
    ok(!strcmp(passed("a\000b", 3), "ab"), "NUL dropped");
    ok(pass_is("a\033[=cb\033[?1$pc\033[xd\033Ze", "abcde"),
       "DA3, DECRQM, DECREQTPARM, DECID dropped");
    ok(pass_is("a\xc2\x9b"
               "31mb\x9b",
               "a31mb\xef\xbf\xbd"),
       "C1 CSI (UTF-8 or raw) not a CSI");
    /* A string without its end swallows what follows, never shows it or lets it start. */
    ok(pass_is("\033]52;c;AAAA and the rest", ""), "an unended OSC swallows the rest");
    ok(pass_is("\033]52;\033[31mx", "\033[31mx"), "ESC ends a string and starts a sequence");
    char longcsi[200] = "\033[";
    memset(longcsi + 2, '1', 150);
    strcpy(longcsi + 152, "mz");
    ok(pass_is(longcsi, "z"), "a CSI past 64 bytes is read to its end and dropped");
    /* Cut anywhere, the same as whole. */
    const char *mix = "x\033[1;32mgr\xc3\xbcn\033]52;c;QUJD\007\033[6n\033P1$r\033\\\xe4\xb8\x96!";
    size_t n = strlen(mix);
    char whole_out[AL_TERM_PASS_OUT_MAX(128)];
    snprintf(whole_out, sizeof(whole_out), "%s", passed(mix, n));
    bool all = true;
    for (size_t cut = 0; cut <= n; cut++) {
        char out[AL_TERM_PASS_OUT_MAX(128)];
        al_term_pass_state st = {0};
        size_t len = al_term_pass(&st, mix, cut, out);
        len += al_term_pass(&st, mix + cut, n - cut, out + len);
        out[len] = '\0';
        all &= !strcmp(out, whole_out);
    }
    ok(all, "a stream cut at any byte passes as the whole");
}

int main(void)
{
    test_controls();
    test_utf8();
    test_utf8_len();
    test_streaming();
    test_bounds();
    test_escape();
    test_errors();
    test_pass();
    return tap_done();
}

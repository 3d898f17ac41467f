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

int main(void)
{
    test_controls();
    test_utf8();
    test_utf8_len();
    test_streaming();
    test_bounds();
    test_escape();
    test_errors();
    return tap_done();
}

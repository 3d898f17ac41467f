/* The host side of a session's screen and input (orchestrator/session/screen.c) without a VM:
 * the tablet's coordinate mapping against what a guest's X server makes of it, key names to
 * QEMU's qcodes, the refusals of a session without a display, and older callers' session options
 * (the struct grew by `display`). argv[1]: airlock-agent, spoken to with --stdio. */
#include "screen.h"
#include "tap.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* What X's input drivers make of a tablet value: v * size / (max - min + 1), min 0, max 0x7fff. */
static unsigned x_of(int v, unsigned size)
{
    return (unsigned)((unsigned long long)v * size / 0x8000);
}

static void mapping(void)
{
    static const unsigned sizes[] = {1, 2, 3, 640, 720, 1024, 1280, 1366, 1920, 2560, 4095, 8192};
    bool exact = true, bounded = true;
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        unsigned w = sizes[i];
        for (unsigned x = 0; x < w; x++) {
            int v = al_screen_abs(x, w);
            bounded &= v >= 0 && v <= 0x7fff;
            exact &= x_of(v, w) == x;
        }
    }
    ok(bounded, "every pixel maps into the tablet's 0..0x7fff");
    ok(exact, "every pixel of each width maps back onto itself (corners and odd sizes too)");
    ok(al_screen_abs(0, 1280) > 0 && al_screen_abs(1279, 1280) < 0x7fff,
       "a pixel maps to its centre, not an edge of the range");
}

static void qcodes(void)
{
    static const struct {
        const char *name, *qcode;
        bool shift;
    } cases[] = {
        {"a", "a", false},
        {"A", "a", true},
        {"Return", "ret", false},
        {"enter", "ret", false},
        {"ctrl", "ctrl", false},
        {"Control_L", "ctrl", false},
        {"super", "meta_l", false},
        {"F5", "f5", false},
        {"f12", "f12", false},
        {"Page_Down", "pgdn", false},
        {"~", "grave_accent", true},
        {"|", "backslash", true},
        {"/", "slash", false},
        {"?", "slash", true},
        {" ", "spc", false},
        {"1", "1", false},
        {"!", "1", true},
        {"BackSpace", "backspace", false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        bool shift = !cases[i].shift;
        const char *q = al_screen_qcode(cases[i].name, &shift);
        ok(q && !strcmp(q, cases[i].qcode) && shift == cases[i].shift, "key '%s' is %s%s",
           cases[i].name, cases[i].shift ? "shift+" : "", cases[i].qcode);
    }
    static const char *const unknown[] = {
        "f13", "f0", "nosuchkey", "é", "", "ctrl+a", "a-very-long-name-that-no-key-has-at-all"};
    for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
        bool shift;
        ok(al_screen_qcode(unknown[i], &shift) == NULL, "'%s' is no key", unknown[i]);
    }
}

static void no_display(const char *agent)
{
    const char *argv[] = {agent, "--stdio", NULL};
    for (int display = 0; display < 2; display++) {
        al_session_opts so = {.struct_size = sizeof(al_session_opts), .quiet = true};
        so.display = display;
        al_session *s = NULL;
        al_error err = {0};
        if (al_session_open_peer(argv, &so, &s, &err) < 0) {
            ok(false, "open a peer session: %s", err.msg);
            continue;
        }
        /* A display asked of a session with no VM (the peer) has nothing to show either. */
        if (display)
            s->screen = al_screen_new();
        al_screenshot shot = AL_SCREENSHOT_INIT;
        al_error e1 = {0}, e2 = {0};
        unsigned done = 7;
        ok(al_screen_capture(s, NULL, &shot, &e1) == -ENODEV && !shot.png && e1.msg[0],
           "a screenshot of a session %s: -ENODEV (%s)",
           display ? "without a VM" : "without a display", e1.msg);
        ok(al_screen_input(s, "[{\"action\": \"left_click\"}]", 0, 0, &done, NULL, NULL, &e2) ==
                   -ENODEV &&
               done == 7,
           "input to it: -ENODEV, nothing done (%s)", e2.msg);
        al_session_close(s);
    }
}

/* An older caller's al_session_opts, without `display`, is taken with it zero (the open then
 * fails on the image, which does not exist: not on the struct); one smaller than the struct's
 * first exported size is not. */
static void older_caller(void)
{
    al_session_opts so = {.struct_size = offsetof(al_session_opts, display),
                          .quiet = true,
                          .image = "no-such-image-here"};
    al_session *s = NULL;
    al_error err = {0};
    int r = al_session_open(&so, &s, &err);
    ok(r < 0 && !strstr(err.msg, "struct_size") && strstr(err.msg, "no-such-image-here"),
       "options of the size before `display` are taken: %s", err.msg);
    so.struct_size = offsetof(al_session_opts, net);
    memset(&err, 0, sizeof(err));
    r = al_session_open(&so, &s, &err);
    ok(r == -EINVAL && strstr(err.msg, "struct_size"), "smaller ones are refused: %s", err.msg);
}

int main(int argc, char **argv)
{
    mapping();
    qcodes();
    older_caller();
    if (argc > 1) {
        no_display(argv[1]);
    } else {
        ok(false, "usage: test-screen AGENT");
    }
    return tap_done();
}

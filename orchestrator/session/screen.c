/* The screen and input of a session with a display, from the host: the screenshot is QEMU's
 * screendump of the VGA as PNG (into a memfd of ours here, libvirt's screenshot stream for a
 * remote host), the input QEMU's input-send-event into a virtio tablet and keyboard, both sent
 * through libvirt's monitor passthrough (al_vm_qmp). Nothing passes
 * through the guest, so a guest that took over our agent can neither forge a screenshot nor
 * stop the input; what it controls is what is on its screen and the mode (size), which are
 * bounded here: the bytes QEMU hands over, the pixels decoded, the rate of screenshots. */
#include "screen.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "exec.h"
#include "pngio.h"

/* QEMU's absolute axes run 0..INPUT_EVENT_ABS_MAX (0x7fff); X's drivers scale a value v back to
 * v * w / 0x8000. */
#define ABS_SPAN 0x8000
/* Input commands are paced: QEMU's virtio-input drops an event batch when the guest has not yet
 * given it buffers back (its queue holds 64 events, a command is up to 5), which a busy emulated
 * guest can be slow to do. A burst of INPUT_BURST commands goes at once (a click, a chord), then
 * one per INPUT_PACE_US (typing). */
#define INPUT_PACE_US 4000
#define INPUT_BURST 8
/* A button press goes no sooner than this after the last release: libinput (the X and Wayland
 * desktops' input library) takes a release followed by a press within 25 ms for a switch's
 * bounce and drops both, so back-to-back clicks and double clicks would lose all but the first.
 * Far below any toolkit's double-click time (400 ms and more). */
#define BUTTON_GAP_US 40000
/* What one action may ask: clicks, notches, repeats; text typed; seconds held or waited. */
#define CLICKS_MAX 3
#define REPEAT_MAX 100
#define TYPE_MAX 4096
#define DURATION_MAX_S 60.0
/* One action's keys at once ("ctrl+shift+alt+t"). */
#define CHORD_MAX 8

struct al_screen {
    pthread_mutex_t mu; /* one screenshot or batch of actions at a time */
    uint64_t shot_ms;   /* monotonic time of the last screenshot, 0: none */
    unsigned w, h;      /* the mode as last seen, 0: not yet */
    int ax, ay;        /* the pointer where the host last put it, on the tablet's axes; -1: never */
    uint64_t paced_us; /* the pacing's clock: a command may go once it is no later than now */
    uint64_t released_us; /* when a button was last released (BUTTON_GAP_US), 0: never */
};

struct al_screen *al_screen_new(void)
{
    struct al_screen *sc = calloc(1, sizeof(*sc));
    if (!sc)
        return NULL;
    pthread_mutex_init(&sc->mu, NULL);
    sc->ax = sc->ay = -1;
    return sc;
}

void al_screen_free(struct al_screen *sc)
{
    if (!sc)
        return;
    pthread_mutex_destroy(&sc->mu);
    free(sc);
}

int al_screen_abs(unsigned x, unsigned w)
{
    uint64_t v = ((uint64_t)2 * x + 1) * ABS_SPAN / ((uint64_t)2 * w);
    return v > ABS_SPAN - 1 ? ABS_SPAN - 1 : (int)v;
}

static int screen_of(al_session *s, al_error *err)
{
    if (!s->screen)
        return al_err(err, -ENODEV, "this session has no display (start it with one)");
    if (!s->dom)
        return al_err(err, -ENODEV, "this session has no VM to show");
    return 0;
}

static void sleep_us(uint64_t us)
{
    struct timespec ts = {.tv_sec = (time_t)(us / 1000000), .tv_nsec = (long)(us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* ---- the screenshot ---- */

/* QEMU's screendump into a memfd of ours that libvirt passes it (add-fd): half the time of
 * libvirt's screenshot (bench screen), which has QEMU write a file of libvirt's and streams it
 * over libvirt's RPC. QEMU's VGA memory (16 MiB, vm.c) bounds what the guest's mode can make
 * QEMU write; at most AL_SCREENSHOT_BYTES_MAX of it is read. */
static int grab_local(al_session *s, uint8_t **out, size_t *outlen, al_error *err)
{
    _cleanup_close_ int mfd = memfd_create("airlock-screen", MFD_CLOEXEC);
    if (mfd < 0)
        return al_err(err, -errno, "cannot take a screenshot: memfd: %s", strerror(errno));
    /* QEMU opens it write-only, and an fd set's fd must have that very access mode. */
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", mfd);
    _cleanup_close_ int wfd = open(path, O_WRONLY | O_CLOEXEC);
    if (wfd < 0)
        return al_err(err, -errno, "cannot take a screenshot: %s", strerror(errno));
    char *reply = NULL;
    int r = al_vm_qmp(s->dom, "take a screenshot", "{\"execute\":\"add-fd\"}", wfd, &reply, err);
    if (r < 0)
        return r;
    _cleanup_free_ char *owned = reply;
    _cleanup_cjson_ cJSON *j = cJSON_Parse(reply);
    const cJSON *set =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "return"), "fdset-id");
    if (!cJSON_IsNumber(set) || set->valuedouble < 0 || set->valuedouble > INT32_MAX)
        return al_err(err, -EIO, "cannot take a screenshot: QEMU gave no fd set");
    int id = (int)set->valuedouble;
    char cmd[160];
    snprintf(cmd, sizeof(cmd),
             "{\"execute\":\"screendump\",\"arguments\":{\"filename\":\"/dev/fdset/%d\","
             "\"format\":\"png\"}}",
             id);
    r = al_vm_qmp(s->dom, "take a screenshot", cmd, -1, NULL, err);
    snprintf(cmd, sizeof(cmd), "{\"execute\":\"remove-fd\",\"arguments\":{\"fdset-id\":%d}}", id);
    al_error e2 = {0};
    al_vm_qmp(s->dom, "take a screenshot", cmd, -1, NULL, &e2); /* its fd only: no more to do */
    if (r < 0)
        return r;
    struct stat st;
    if (fstat(mfd, &st) < 0)
        return al_err(err, -errno, "cannot take a screenshot: %s", strerror(errno));
    if ((uint64_t)st.st_size > AL_SCREENSHOT_BYTES_MAX)
        return al_err(err, -EFBIG, "the screenshot is over %u MiB", AL_SCREENSHOT_BYTES_MAX >> 20);
    size_t len = (size_t)st.st_size;
    _cleanup_free_ uint8_t *buf = malloc(len ? len : 1);
    if (!buf)
        return al_err(err, -ENOMEM, "out of memory for a screenshot");
    for (size_t got = 0; got < len;) {
        ssize_t n = pread(mfd, buf + got, len - got, (off_t)got);
        if (n <= 0)
            return al_err(err, -EIO, "cannot read the screenshot");
        got += (size_t)n;
    }
    *out = TAKE_PTR(buf);
    *outlen = len;
    return 0;
}

/* The screen as PNG bytes, at most AL_SCREENSHOT_BYTES_MAX, into *out: through an fd of ours
 * here, through libvirt's stream for a remote host (whose QEMU cannot take our fds). */
static int grab(al_session *s, uint8_t **out, size_t *outlen, al_error *err)
{
    struct al_screen *sc = s->screen;
    uint64_t now = al_now_ms();
    if (sc->shot_ms && now < sc->shot_ms + AL_SCREENSHOT_INTERVAL_MS)
        sleep_us((sc->shot_ms + AL_SCREENSHOT_INTERVAL_MS - now) * 1000);
    sc->shot_ms = al_now_ms();
    if (!s->remote)
        return grab_local(s, out, outlen, err);
    virStreamPtr st = virStreamNew(s->conn, 0);
    if (!st)
        return al_err_virt(err, -EIO, "cannot take a screenshot");
    _cleanup_free_ char *mime = virDomainScreenshot(s->dom, st, 0, 0);
    if (!mime) {
        virStreamFree(st);
        return al_err_virt(err, -EIO, "cannot take a screenshot");
    }
    _cleanup_free_ uint8_t *buf = NULL;
    size_t cap = 0, len = 0;
    int r = 0;
    for (;;) {
        if (len == cap) {
            if (cap >= AL_SCREENSHOT_BYTES_MAX) {
                r = al_err(err, -EFBIG, "the screenshot is over %u MiB",
                           AL_SCREENSHOT_BYTES_MAX >> 20);
                break;
            }
            if (al_grow(&buf, &cap, len, 1, 256 * 1024) < 0) {
                r = al_err(err, -ENOMEM, "out of memory for a screenshot");
                break;
            }
            if (cap > AL_SCREENSHOT_BYTES_MAX)
                cap = AL_SCREENSHOT_BYTES_MAX;
        }
        int n = virStreamRecv(st, (char *)buf + len, cap - len);
        if (n < 0) {
            r = al_err_virt(err, -EIO, "cannot read the screenshot");
            break;
        }
        if (n == 0)
            break;
        len += (size_t)n;
    }
    if (r < 0)
        virStreamAbort(st);
    else if (virStreamFinish(st) < 0)
        r = al_err_virt(err, -EIO, "cannot read the screenshot");
    virStreamFree(st);
    if (r < 0)
        return r;
    if (strcmp(mime, "image/png") != 0)
        return al_err(err, -EOPNOTSUPP, "the screenshot came as %.40s, not PNG (QEMU before 7.1)",
                      mime);
    *out = TAKE_PTR(buf);
    *outlen = len;
    return 0;
}

/* The screen's size, from a screenshot taken for it, when none was seen yet. */
static int learn_size(al_session *s, al_error *err)
{
    struct al_screen *sc = s->screen;
    if (sc->w)
        return 0;
    _cleanup_free_ uint8_t *png = NULL;
    size_t len = 0;
    int r = grab(s, &png, &len, err);
    if (r < 0)
        return r;
    return al_png_size(png, len, &sc->w, &sc->h, err);
}

/* The region of px (w x h RGBA) as its own pixels, scaled to fit max_edge (0: as is), as PNG. */
static int crop_scale(const uint8_t *px, unsigned w, const al_screenshot_opts *o, unsigned rw,
                      unsigned rh, al_screenshot *out, al_error *err)
{
    _cleanup_free_ uint8_t *region = malloc((size_t)rw * rh * 4);
    if (!region)
        return al_err(err, -ENOMEM, "out of memory");
    for (unsigned y = 0; y < rh; y++)
        memcpy(region + (size_t)y * rw * 4, px + ((size_t)(o->y + y) * w + o->x) * 4,
               (size_t)rw * 4);
    return al_png_fit_rgba(region, rw, rh, o->max_edge, 0, &out->png, &out->len, &out->width,
                           &out->height, err);
}

int al_screen_capture(al_session *s, const al_screenshot_opts *opts, al_screenshot *out,
                      al_error *err)
{
    al_screenshot_opts o = AL_SCREENSHOT_OPTS_INIT;
    int r = opts ? AL_SIZED_IN(&o, opts, "al_screenshot_opts", err) : 0;
    if (r < 0 || (r = AL_SIZED_OUT(out, "al_screenshot", err)) < 0 || (r = screen_of(s, err)) < 0)
        return r;
    struct al_screen *sc = s->screen;
    pthread_mutex_lock(&sc->mu);
    _cleanup_free_ uint8_t *png = NULL;
    size_t len = 0;
    unsigned w = 0, h = 0;
    r = grab(s, &png, &len, err);
    if (r == 0)
        r = al_png_size(png, len, &w, &h, err);
    if (r == 0)
        sc->w = w, sc->h = h;
    pthread_mutex_unlock(&sc->mu);
    if (r < 0)
        return r;
    bool region = o.w && o.h;
    if (!region)
        o.x = o.y = 0, o.w = w, o.h = h;
    if (o.x >= w || o.y >= h || o.w > w - o.x || o.h > h - o.y)
        return al_err(err, -EINVAL, "the region %ux%u at (%u, %u) is not inside the %ux%u screen",
                      o.w, o.h, o.x, o.y, w, h);
    al_screenshot res = {.struct_size = out->struct_size, .screen_width = w, .screen_height = h};
    if (!region && (!o.max_edge || (w <= o.max_edge && h <= o.max_edge))) {
        res.png = TAKE_PTR(png), res.len = len, res.width = w, res.height = h;
    } else {
        /* Decoded again with libpng's own checks: the pixels are the guest's. */
        _cleanup_free_ uint8_t *px = NULL;
        unsigned dw, dh;
        if ((r = al_png_decode(png, len, &px, &dw, &dh, err)) < 0)
            return r;
        if ((r = crop_scale(px, dw, &o, o.w, o.h, &res, err)) < 0)
            return r;
    }
    *out = res;
    return 0;
}

/* ---- input ---- */

/* QEMU's qcodes for xdotool's key names (and a few aliases); letters, digits and the US
 * keyboard's punctuation come from chars below. */
static const struct {
    const char *name, *qcode;
} key_names[] = {
    {"return", "ret"},
    {"enter", "ret"},
    {"kp_enter", "kp_enter"},
    {"escape", "esc"},
    {"esc", "esc"},
    {"tab", "tab"},
    {"backspace", "backspace"},
    {"delete", "delete"},
    {"del", "delete"},
    {"insert", "insert"},
    {"home", "home"},
    {"end", "end"},
    {"page_up", "pgup"},
    {"prior", "pgup"},
    {"pageup", "pgup"},
    {"page_down", "pgdn"},
    {"next", "pgdn"},
    {"pagedown", "pgdn"},
    {"up", "up"},
    {"down", "down"},
    {"left", "left"},
    {"right", "right"},
    {"space", "spc"},
    {"ctrl", "ctrl"},
    {"control", "ctrl"},
    {"control_l", "ctrl"},
    {"control_r", "ctrl_r"},
    {"ctrl_r", "ctrl_r"},
    {"alt", "alt"},
    {"alt_l", "alt"},
    {"alt_r", "alt_r"},
    {"option", "alt"},
    {"shift", "shift"},
    {"shift_l", "shift"},
    {"shift_r", "shift_r"},
    {"super", "meta_l"},
    {"super_l", "meta_l"},
    {"super_r", "meta_r"},
    {"meta", "meta_l"},
    {"meta_l", "meta_l"},
    {"meta_r", "meta_r"},
    {"cmd", "meta_l"},
    {"win", "meta_l"},
    {"menu", "menu"},
    {"print", "print"},
    {"caps_lock", "caps_lock"},
    {"num_lock", "num_lock"},
    {"scroll_lock", "scroll_lock"},
    {"pause", "pause"},
    {"minus", "minus"},
    {"equal", "equal"},
    {"comma", "comma"},
    {"period", "dot"},
    {"slash", "slash"},
    {"backslash", "backslash"},
    {"semicolon", "semicolon"},
    {"apostrophe", "apostrophe"},
    {"grave", "grave_accent"},
    {"bracketleft", "bracket_left"},
    {"bracketright", "bracket_right"},
};

/* The US keyboard: each printable ASCII character's key, and whether shift makes it. */
static const char *const shifted = "~!@#$%^&*()_+{}|:\"<>?";
static const char *const unshifted = "`1234567890-=[]\\;',./";
static const char *const punct_qcode[] = {"grave_accent",
                                          "1",
                                          "2",
                                          "3",
                                          "4",
                                          "5",
                                          "6",
                                          "7",
                                          "8",
                                          "9",
                                          "0",
                                          "minus",
                                          "equal",
                                          "bracket_left",
                                          "bracket_right",
                                          "backslash",
                                          "semicolon",
                                          "apostrophe",
                                          "comma",
                                          "dot",
                                          "slash"};

static const char *char_qcode(char c, bool *shift)
{
    static const char letters[26][2] = {"a", "b", "c", "d", "e", "f", "g", "h", "i",
                                        "j", "k", "l", "m", "n", "o", "p", "q", "r",
                                        "s", "t", "u", "v", "w", "x", "y", "z"};
    *shift = false;
    if (c >= 'a' && c <= 'z')
        return letters[c - 'a'];
    if (c >= 'A' && c <= 'Z') {
        *shift = true;
        return letters[c - 'A'];
    }
    if (c == ' ')
        return "spc";
    if (c == '\n')
        return "ret";
    if (c == '\t')
        return "tab";
    const char *p = c ? strchr(unshifted, c) : NULL;
    if (p)
        return punct_qcode[p - unshifted];
    if (c && (p = strchr(shifted, c))) {
        *shift = true;
        return punct_qcode[p - shifted];
    }
    return NULL;
}

const char *al_screen_qcode(const char *name, bool *shift)
{
    *shift = false;
    if (name[0] && !name[1])
        return char_qcode(name[0], shift);
    char low[32];
    size_t n = strlen(name);
    if (n >= sizeof(low))
        return NULL;
    for (size_t i = 0; i <= n; i++)
        low[i] = (char)tolower((unsigned char)name[i]);
    for (size_t i = 0; i < sizeof(key_names) / sizeof(key_names[0]); i++)
        if (!strcmp(low, key_names[i].name))
            return key_names[i].qcode;
    if (low[0] == 'f' && low[1] >= '1' && low[1] <= '9') {
        char *end;
        long f = strtol(low + 1, &end, 10);
        static const char fkeys[12][4] = {"f1", "f2", "f3", "f4",  "f5",  "f6",
                                          "f7", "f8", "f9", "f10", "f11", "f12"};
        if (!*end && f >= 1 && f <= 12)
            return fkeys[f - 1];
    }
    return NULL;
}

/* One action being run: its number and name for messages, the space its coordinates are in. */
struct act {
    al_session *s;
    unsigned n;
    const char *name;
    unsigned sw, sh; /* the coordinate space */
    al_error *err;
};

static int act_err(struct act *a, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int act_err(struct act *a, int code, const char *fmt, ...)
{
    char msg[sizeof(a->err->msg)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return al_err(a->err, code, "action %u (%s): %s", a->n, a->name, msg);
}

/* Whether btn is a pointer button (wheel "buttons" are motion to the guest, never debounced). */
static bool real_button(const char *btn)
{
    return btn && strncmp(btn, "wheel-", 6) != 0;
}

/* Before a press: the gap since the last release (BUTTON_GAP_US). */
static void button_gap(struct al_screen *sc, const char *btn, bool down)
{
    uint64_t now = al_now_us();
    if (real_button(btn) && down && sc->released_us && now - sc->released_us < BUTTON_GAP_US)
        sleep_us(BUTTON_GAP_US - (now - sc->released_us));
}

static void button_sent(struct al_screen *sc, const char *btn, bool down)
{
    if (real_button(btn) && !down)
        sc->released_us = al_now_us();
}

/* Sends events (a JSON list's items, comma-separated) as one input-send-event: QEMU delivers
 * them and then one sync. */
static int send_events(struct act *a, const char *events)
{
    size_t n = strlen(events) + 96;
    _cleanup_free_ char *cmd = malloc(n);
    if (!cmd)
        return act_err(a, -ENOMEM, "out of memory");
    snprintf(cmd, n, "{\"execute\":\"input-send-event\",\"arguments\":{\"events\":[%s]}}", events);
    struct al_screen *sc = a->s->screen;
    uint64_t now = al_now_us();
    /* A token bucket: paced_us runs ahead of now by one pace per command sent, at most a burst
     * ahead before a command waits. */
    uint64_t floor = now > (uint64_t)INPUT_BURST * INPUT_PACE_US
                         ? now - (uint64_t)INPUT_BURST * INPUT_PACE_US
                         : 0;
    if (sc->paced_us < floor)
        sc->paced_us = floor;
    if (sc->paced_us > now)
        sleep_us(sc->paced_us - now);
    sc->paced_us += INPUT_PACE_US;
    al_error e = {0};
    int r = al_vm_qmp(a->s->dom, "send the input", cmd, -1, NULL, &e);
    return r < 0 ? act_err(a, r, "%s", e.msg) : 0;
}

/* The pointer to (ax, ay), and with it a button down or up when btn is not NULL: one batch, so
 * that a click costs no command of its own for the move (the guest sees the motion and the
 * button in one frame, the motion first). */
static int move_abs_button(struct act *a, int ax, int ay, const char *btn, bool down)
{
    char ev[256];
    int n = snprintf(ev, sizeof(ev),
                     "{\"type\":\"abs\",\"data\":{\"axis\":\"x\",\"value\":%d}},"
                     "{\"type\":\"abs\",\"data\":{\"axis\":\"y\",\"value\":%d}}",
                     ax, ay);
    if (btn)
        snprintf(ev + n, sizeof(ev) - (size_t)n,
                 ",{\"type\":\"btn\",\"data\":{\"down\":%s,\"button\":\"%s\"}}",
                 down ? "true" : "false", btn);
    button_gap(a->s->screen, btn, down);
    int r = send_events(a, ev);
    if (r == 0) {
        a->s->screen->ax = ax, a->s->screen->ay = ay;
        button_sent(a->s->screen, btn, down);
    }
    return r;
}

static int move_abs(struct act *a, int ax, int ay)
{
    return move_abs_button(a, ax, ay, NULL, false);
}

/* The action's coordinate field (key) onto the tablet: 1 and *ax, *ay; 0 when absent. */
static int coordinate(struct act *a, const cJSON *act, const char *key, int *ax, int *ay)
{
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(act, key);
    if (!c || cJSON_IsNull(c))
        return 0;
    const cJSON *x = cJSON_GetArrayItem(c, 0), *y = cJSON_GetArrayItem(c, 1);
    if (!cJSON_IsArray(c) || cJSON_GetArraySize(c) != 2 || !cJSON_IsNumber(x) ||
        !cJSON_IsNumber(y) || x->valuedouble != (double)(long long)x->valuedouble ||
        y->valuedouble != (double)(long long)y->valuedouble)
        return act_err(a, -EINVAL, "%s must be [x, y], two whole numbers", key);
    double fx = x->valuedouble, fy = y->valuedouble;
    if (fx < 0 || fy < 0 || fx >= a->sw || fy >= a->sh)
        return act_err(a, -EINVAL, "%s [%.0f, %.0f] is outside the %ux%u screen", key, fx, fy,
                       a->sw, a->sh);
    *ax = al_screen_abs((unsigned)fx, a->sw);
    *ay = al_screen_abs((unsigned)fy, a->sh);
    return 1;
}

static int move_to(struct act *a, const cJSON *act, const char *key, bool required)
{
    int ax, ay, r = coordinate(a, act, key, &ax, &ay);
    if (r == 0 && required)
        return act_err(a, -EINVAL, "%s is missing", key);
    return r > 0 ? move_abs(a, ax, ay) : r;
}

static int button(struct act *a, const char *b, bool down)
{
    char ev[96];
    snprintf(ev, sizeof(ev), "{\"type\":\"btn\",\"data\":{\"down\":%s,\"button\":\"%s\"}}",
             down ? "true" : "false", b);
    button_gap(a->s->screen, b, down);
    int r = send_events(a, ev);
    if (r == 0)
        button_sent(a->s->screen, b, down);
    return r;
}

/* A chord's keys ("ctrl+shift+t") as qcodes, in order; shift added where a key needs it. */
static int chord_parse(struct act *a, const char *chord, const char **q, size_t *n)
{
    char buf[256];
    if (snprintf(buf, sizeof(buf), "%s", chord) >= (int)sizeof(buf))
        return act_err(a, -EINVAL, "the key chord is too long");
    *n = 0;
    bool shift_needed = false;
    char *save = NULL;
    for (char *k = strtok_r(buf, "+", &save); k; k = strtok_r(NULL, "+", &save)) {
        bool shift;
        const char *qc = al_screen_qcode(k, &shift);
        if (!qc)
            return act_err(a, -EINVAL, "unknown key '%.40s'", k);
        if (*n >= CHORD_MAX)
            return act_err(a, -EINVAL, "more than %d keys at once", CHORD_MAX);
        q[(*n)++] = qc;
        shift_needed |= shift;
    }
    if (!*n)
        return act_err(a, -EINVAL, "no key named");
    if (shift_needed) {
        if (*n >= CHORD_MAX)
            return act_err(a, -EINVAL, "more than %d keys at once", CHORD_MAX);
        memmove(q + 1, q, *n * sizeof(*q));
        q[0] = "shift";
        (*n)++;
    }
    return 0;
}

/* The keys q[0..n) pressed in order, or released in reverse, as one batch. */
static int keys(struct act *a, const char *const *q, size_t n, bool down)
{
    char ev[CHORD_MAX * 96] = "";
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        const char *k = q[down ? i : n - 1 - i];
        off += (size_t)snprintf(ev + off, sizeof(ev) - off,
                                "%s{\"type\":\"key\",\"data\":{\"down\":%s,\"key\":{\"type\":"
                                "\"qcode\",\"data\":\"%s\"}}}",
                                i ? "," : "", down ? "true" : "false", k);
    }
    return send_events(a, ev);
}

/* The keys q[0..n) pressed, then released. */
static int tap(struct act *a, const char *const *q, size_t n)
{
    int r = keys(a, q, n, true);
    return r < 0 ? r : keys(a, q, n, false);
}

static int chord_tap(struct act *a, const char *chord)
{
    const char *q[CHORD_MAX];
    size_t n;
    int r = chord_parse(a, chord, q, &n);
    return r < 0 ? r : tap(a, q, n);
}

static const char *text_of(const cJSON *act)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(act, "text");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

/* A wait or a held key: the screen's lock is let go meanwhile, so that another caller's
 * screenshot (or actions) of the session never waits the up to DURATION_MAX_S for it. */
static void act_sleep(struct act *a, double secs)
{
    struct al_screen *sc = a->s->screen;
    pthread_mutex_unlock(&sc->mu);
    sleep_us((uint64_t)(secs * 1e6));
    pthread_mutex_lock(&sc->mu);
}

/* A whole number field in 1..max, dflt when absent. */
static int count_of(struct act *a, const cJSON *act, const char *key, int dflt, int max, int *out)
{
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(act, key);
    if (!c || cJSON_IsNull(c)) {
        *out = dflt;
        return 0;
    }
    if (!cJSON_IsNumber(c) || c->valuedouble < 1 || c->valuedouble > max ||
        c->valuedouble != (double)(int)c->valuedouble)
        return act_err(a, -EINVAL, "%s must be a whole number from 1 to %d", key, max);
    *out = (int)c->valuedouble;
    return 0;
}

static int duration_of(struct act *a, const cJSON *act, double *out)
{
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(act, "duration");
    if (!cJSON_IsNumber(d) || d->valuedouble < 0 || d->valuedouble > DURATION_MAX_S)
        return act_err(a, -EINVAL, "duration must be seconds from 0 to %.0f", DURATION_MAX_S);
    *out = d->valuedouble;
    return 0;
}

/* clicks of btn at the action's coordinate (if any; the first press carries the move), with
 * the keys of its text held (a shift-click). */
static int click(struct act *a, const cJSON *act, const char *btn, int clicks)
{
    int ax, ay;
    int r = coordinate(a, act, "coordinate", &ax, &ay);
    if (r < 0)
        return r;
    bool move = r > 0;
    const char *held = text_of(act);
    const char *q[CHORD_MAX];
    size_t n = 0;
    if (held && *held && ((r = chord_parse(a, held, q, &n)) < 0 || (r = keys(a, q, n, true)) < 0))
        return r;
    r = 0;
    for (int i = 0; i < clicks && r == 0; i++)
        if ((r = move && i == 0 ? move_abs_button(a, ax, ay, btn, true) : button(a, btn, true)) ==
            0)
            r = button(a, btn, false);
    if (n) {
        int r2 = keys(a, q, n, false);
        r = r ? r : r2;
    }
    return r;
}

/* Text with characters the US keyboard's keys do not make (é, 世, ✓): typed by xdotool in the
 * guest, which maps each to a spare keycode of the guest's X server; the text is its argument,
 * never a shell's. The screen's lock is let go meanwhile, as for a wait. */
static int type_in_guest(struct act *a, const char *text, size_t at)
{
    if (!al_utf8_valid((const uint8_t *)text, strlen(text)))
        return act_err(a, -EINVAL, "the text is not valid UTF-8");
    for (const char *p = text; *p; p++)
        if ((unsigned char)*p < 0x20 && *p != '\n' && *p != '\t')
            return act_err(a, -EINVAL, "control character %u at offset %zu cannot be typed",
                           (unsigned char)*p, (size_t)(p - text));
    const char *argv[] = {"xdotool", "type", "--delay", "12", "--", text, NULL};
    al_exec_opts o = {.struct_size = sizeof(al_exec_opts),
                      .argv = argv,
                      .timeout_ms = 10000 + 50 * (unsigned)strlen(text)};
    al_error e = {0};
    struct al_screen *sc = a->s->screen;
    pthread_mutex_unlock(&sc->mu);
    int r = al_exec_quiet(a->s, o, "xdotool", &e);
    pthread_mutex_lock(&sc->mu);
    if (r == -ENOENT)
        return act_err(a, -ENOTSUP,
                       "the character at offset %zu is not on the US keyboard, and the guest "
                       "has no xdotool to type it (the desktop image has it)",
                       at);
    if (r < 0)
        return act_err(a, r,
                       "the character at offset %zu is not on the US keyboard, and xdotool in "
                       "the guest could not type it (is X on the session's DISPLAY?): %s",
                       at, e.msg);
    return 0;
}

static int act_type(struct act *a, const char *text)
{
    if (!text)
        return act_err(a, -EINVAL, "text is missing");
    if (strlen(text) > TYPE_MAX)
        return act_err(a, -EINVAL, "more than %d bytes at once", TYPE_MAX);
    /* Checked whole first: all of it goes one way, keys or the guest's xdotool. */
    for (const char *p = text; *p; p++) {
        bool shift;
        if (!char_qcode(*p, &shift))
            return type_in_guest(a, text, (size_t)(p - text));
    }
    for (const char *p = text; *p; p++) {
        bool shift;
        const char *q[2];
        const char *k = char_qcode(*p, &shift);
        size_t n = 0;
        if (shift)
            q[n++] = "shift";
        q[n++] = k;
        int r = tap(a, q, n);
        if (r < 0)
            return r;
    }
    return 0;
}

static int act_key(struct act *a, const cJSON *act)
{
    const char *text = text_of(act);
    int repeat, r;
    if (!text || !*text)
        return act_err(a, -EINVAL, "text (the keys) is missing");
    if ((r = count_of(a, act, "repeat", 1, REPEAT_MAX, &repeat)) < 0)
        return r;
    /* xdotool's form: chords separated by spaces, each pressed and released in turn. */
    char buf[1024];
    if (snprintf(buf, sizeof(buf), "%s", text) >= (int)sizeof(buf))
        return act_err(a, -EINVAL, "the keys are too long");
    for (int i = 0; i < repeat; i++) {
        char copy[sizeof(buf)], *save = NULL;
        memcpy(copy, buf, sizeof(buf));
        for (char *c = strtok_r(copy, " ", &save); c; c = strtok_r(NULL, " ", &save))
            if ((r = chord_tap(a, c)) < 0)
                return r;
    }
    return 0;
}

static int act_scroll(struct act *a, const cJSON *act)
{
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(act, "scroll_direction");
    const char *dir = cJSON_IsString(d) ? d->valuestring : "";
    const char *btn = !strcmp(dir, "up")      ? "wheel-up"
                      : !strcmp(dir, "down")  ? "wheel-down"
                      : !strcmp(dir, "left")  ? "wheel-left"
                      : !strcmp(dir, "right") ? "wheel-right"
                                              : NULL;
    if (!btn)
        return act_err(a, -EINVAL, "scroll_direction must be up, down, left or right");
    int amount, r = count_of(a, act, "scroll_amount", 1, REPEAT_MAX, &amount);
    return r < 0 ? r : click(a, act, btn, amount);
}

static int act_drag(struct act *a, const cJSON *act)
{
    int sx, sy, ex, ey;
    int r = coordinate(a, act, "start_coordinate", &sx, &sy);
    if (r < 0)
        return r;
    if (r == 0 && a->s->screen->ax < 0)
        return act_err(a, -EINVAL, "start_coordinate is missing (and the pointer was never set)");
    if (r == 0)
        sx = a->s->screen->ax, sy = a->s->screen->ay;
    if ((r = coordinate(a, act, "coordinate", &ex, &ey)) <= 0)
        return r < 0 ? r : act_err(a, -EINVAL, "coordinate is missing");
    if ((r = move_abs(a, sx, sy)) < 0 || (r = button(a, "left", true)) < 0)
        return r;
    /* In steps, as a hand moves: toolkits start a drag only past a threshold of motion. */
    for (int i = 1; i <= 8 && r == 0; i++)
        r = move_abs(a, sx + (ex - sx) * i / 8, sy + (ey - sy) * i / 8);
    int r2 = button(a, "left", false);
    return r ? r : r2;
}

static int act_hold(struct act *a, const cJSON *act)
{
    const char *text = text_of(act);
    double secs;
    const char *q[CHORD_MAX];
    size_t n;
    int r;
    if (!text || !*text)
        return act_err(a, -EINVAL, "text (the keys) is missing");
    if ((r = duration_of(a, act, &secs)) < 0 || (r = chord_parse(a, text, q, &n)) < 0 ||
        (r = keys(a, q, n, true)) < 0)
        return r;
    act_sleep(a, secs);
    return keys(a, q, n, false);
}

static int act_run(struct act *a, const cJSON *act)
{
    const char *name = a->name;
    int r;
    double secs;
    if (!strcmp(name, "mouse_move"))
        return move_to(a, act, "coordinate", true);
    if (!strcmp(name, "left_click"))
        return click(a, act, "left", 1);
    if (!strcmp(name, "right_click"))
        return click(a, act, "right", 1);
    if (!strcmp(name, "middle_click"))
        return click(a, act, "middle", 1);
    if (!strcmp(name, "double_click"))
        return click(a, act, "left", 2);
    if (!strcmp(name, "triple_click"))
        return click(a, act, "left", CLICKS_MAX);
    if (!strcmp(name, "left_mouse_down") || !strcmp(name, "left_mouse_up")) {
        int ax, ay;
        bool down = !strcmp(name, "left_mouse_down");
        if ((r = coordinate(a, act, "coordinate", &ax, &ay)) < 0)
            return r;
        return r ? move_abs_button(a, ax, ay, "left", down) : button(a, "left", down);
    }
    if (!strcmp(name, "left_click_drag"))
        return act_drag(a, act);
    if (!strcmp(name, "scroll"))
        return act_scroll(a, act);
    if (!strcmp(name, "key"))
        return act_key(a, act);
    if (!strcmp(name, "hold_key"))
        return act_hold(a, act);
    if (!strcmp(name, "type"))
        return act_type(a, text_of(act));
    if (!strcmp(name, "wait")) {
        if ((r = duration_of(a, act, &secs)) < 0)
            return r;
        act_sleep(a, secs);
        return 0;
    }
    if (!strcmp(name, "cursor_position"))
        return 0;
    if (!strcmp(name, "screenshot") || !strcmp(name, "zoom"))
        return act_err(a, -EINVAL, "not an input action: take the screen with al_screen_capture");
    return act_err(a, -EINVAL, "unknown action");
}

int al_screen_input(al_session *s, const char *actions_json, unsigned space_w, unsigned space_h,
                    unsigned *done, int *x, int *y, al_error *err)
{
    int r = screen_of(s, err);
    if (r < 0)
        return r;
    if (!actions_json)
        return al_err(err, -EINVAL, "no actions");
    _cleanup_cjson_ cJSON *list = cJSON_Parse(actions_json);
    if (!cJSON_IsArray(list))
        return al_err(err, -EINVAL, "the actions are not a JSON array");
    if ((space_w == 0) != (space_h == 0))
        return al_err(err, -EINVAL, "the coordinate space needs both a width and a height");
    struct al_screen *sc = s->screen;
    pthread_mutex_lock(&sc->mu);
    unsigned n = 0;
    if (!space_w && (r = learn_size(s, err)) == 0)
        space_w = sc->w, space_h = sc->h;
    const cJSON *act;
    cJSON_ArrayForEach(act, list)
    {
        if (r < 0)
            break;
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(act, "action");
        struct act a = {.s = s,
                        .n = n + 1,
                        .name = cJSON_IsString(name) ? name->valuestring : "?",
                        .sw = space_w,
                        .sh = space_h,
                        .err = err};
        if (!cJSON_IsObject(act) || !cJSON_IsString(name)) {
            r = act_err(&a, -EINVAL, "not an object with an \"action\"");
            break;
        }
        if ((r = act_run(&a, act)) == 0)
            n++;
    }
    int ax = sc->ax, ay = sc->ay;
    pthread_mutex_unlock(&sc->mu);
    if (done)
        *done = n;
    if (x)
        *x = ax < 0 || !space_w ? -1 : (int)((uint64_t)ax * space_w / ABS_SPAN);
    if (y)
        *y = ay < 0 || !space_h ? -1 : (int)((uint64_t)ay * space_h / ABS_SPAN);
    return r;
}

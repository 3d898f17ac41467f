/* OpenAI's computer actions (the Responses API's computer_call: click, double_click, drag,
 * keypress, move, screenshot, scroll, type, wait) mapped onto the library's own action set
 * (al_screen_input). Everything is checked before anything runs: a batch either maps whole or
 * is refused, so a bad coordinate in its third action never leaves the first one's button
 * pressed. */
#include "chat.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "screen.h"
#include "util.h"

/* A scroll's pixels per wheel notch: what X toolkits and browsers scroll for one notch, near
 * enough (Chromium ~100, GTK ~50-100). */
#define SCROLL_PX_PER_NOTCH 100
/* At most this many notches one way per action (al_screen_input's own bound). */
#define SCROLL_NOTCHES_MAX 100
/* A wait action has no length: this is what OpenAI's own harnesses wait. */
#define WAIT_S 1.0
/* Points of one drag path. */
#define DRAG_POINTS_MAX 256
/* Keys of one keypress or held during one action. */
#define KEYS_MAX 8

struct map {
    unsigned w, h; /* the coordinate space (the screenshots the model saw) */
    unsigned n;    /* the OpenAI action being mapped, from 1 */
    const char *type;
    cJSON *out;
    char *why;
    size_t whylen;
};

static int fail(struct map *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(struct map *m, const char *fmt, ...)
{
    int k = snprintf(m->why, m->whylen, "action %u (%.20s): ", m->n, m->type ? m->type : "?");
    va_list ap;
    va_start(ap, fmt);
    if (k >= 0 && (size_t)k < m->whylen)
        vsnprintf(m->why + k, m->whylen - (size_t)k, fmt, ap);
    va_end(ap);
    return -EINVAL;
}

/* One OpenAI key name as the library's (xdotool's) name: "ENTER", "CTRL", "ARROWLEFT", "A". */
static int key_name(struct map *m, const char *k, char *out, size_t len)
{
    if (!k || !*k || strlen(k) >= len)
        return fail(m, "a key name is empty or too long");
    if (!k[1]) {
        /* "A" in a chord is the key, not a capital: ctrl+A is ctrl+a. */
        out[0] = (char)tolower((unsigned char)k[0]);
        out[1] = '\0';
    } else if (!strncasecmp(k, "arrow", 5) && k[5]) {
        snprintf(out, len, "%s", k + 5);
    } else if (!strcasecmp(k, "capslock")) {
        snprintf(out, len, "caps_lock");
    } else {
        snprintf(out, len, "%s", k);
    }
    bool shift;
    if (!al_screen_qcode(out, &shift))
        return fail(m, "unknown key '%.40s'", k);
    return 0;
}

/* The keys of a list as one chord ("ctrl+shift+t"); "" for none. */
static int chord(struct map *m, const cJSON *keys, char *out, size_t len)
{
    out[0] = '\0';
    if (!keys || cJSON_IsNull(keys))
        return 0;
    if (!cJSON_IsArray(keys) || cJSON_GetArraySize(keys) > KEYS_MAX)
        return fail(m, "keys must be a list of at most %d key names", KEYS_MAX);
    size_t off = 0;
    const cJSON *k;
    cJSON_ArrayForEach(k, keys)
    {
        char name[32];
        int r = key_name(m, cJSON_GetStringValue(k), name, sizeof(name));
        if (r < 0)
            return r;
        int n = snprintf(out + off, len - off, "%s%s", off ? "+" : "", name);
        if (n < 0 || (size_t)n >= len - off)
            return fail(m, "too many keys");
        off += (size_t)n;
    }
    return 0;
}

/* A point of the screenshot the model saw: whole pixels inside it, never clamped. */
static int point(struct map *m, const cJSON *o, int *x, int *y)
{
    const cJSON *vx = cJSON_GetObjectItemCaseSensitive(o, "x");
    const cJSON *vy = cJSON_GetObjectItemCaseSensitive(o, "y");
    if (!cJSON_IsNumber(vx) || !cJSON_IsNumber(vy))
        return fail(m, "x and y must be numbers");
    double dx = vx->valuedouble, dy = vy->valuedouble;
    if (dx != (double)(long)dx || dy != (double)(long)dy)
        return fail(m, "x and y must be whole pixels");
    if (dx < 0 || dy < 0 || dx >= m->w || dy >= m->h)
        return fail(m, "(%.0f, %.0f) is outside the %ux%u screen", dx, dy, m->w, m->h);
    *x = (int)dx, *y = (int)dy;
    return 0;
}

/* Appends {"action": name, "coordinate": [x, y] (when x >= 0), "text": text (when any)}. */
static cJSON *emit(struct map *m, const char *name, int x, int y, const char *text)
{
    cJSON *a = cJSON_CreateObject();
    if (!a || !cJSON_AddItemToArray(m->out, a)) {
        cJSON_Delete(a);
        return NULL;
    }
    if (!cJSON_AddStringToObject(a, "action", name))
        return NULL;
    if (x >= 0) {
        int xy[2] = {x, y};
        cJSON *c = cJSON_CreateIntArray(xy, 2);
        if (!c || !cJSON_AddItemToObject(a, "coordinate", c))
            return cJSON_Delete(c), NULL;
    }
    if (text && *text && !cJSON_AddStringToObject(a, "text", text))
        return NULL;
    return a;
}

#define EMIT(...)                                                                                  \
    do {                                                                                           \
        if (!emit(__VA_ARGS__))                                                                    \
            return -ENOMEM;                                                                        \
    } while (0)

static int map_click(struct map *m, const cJSON *act, int x, int y, const char *held)
{
    const char *button = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(act, "button"));
    if (!button)
        button = "left";
    if (!strcmp(button, "left") || !strcmp(button, "right")) {
        EMIT(m, !strcmp(button, "left") ? "left_click" : "right_click", x, y, held);
    } else if (!strcmp(button, "wheel") || !strcmp(button, "middle")) {
        EMIT(m, "middle_click", x, y, held);
    } else if (!strcmp(button, "back") || !strcmp(button, "forward")) {
        /* The side buttons do what X programs bind them to: history back and forward. */
        if (*held)
            return fail(m, "keys held during a back or forward click are not supported");
        EMIT(m, "mouse_move", x, y, NULL);
        EMIT(m, "key", -1, -1, !strcmp(button, "back") ? "alt+Left" : "alt+Right");
    } else {
        return fail(m, "button must be left, right, wheel, back or forward");
    }
    return 0;
}

static int map_scroll(struct map *m, const cJSON *act, int x, int y, const char *held)
{
    static const char *const axes[2][3] = {{"scroll_y", "down", "up"},
                                           {"scroll_x", "right", "left"}};
    bool any = false;
    for (int i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(act, axes[i][0]);
        if (!v || cJSON_IsNull(v))
            continue;
        if (!cJSON_IsNumber(v) || v->valuedouble != v->valuedouble)
            return fail(m, "%s must be a number of pixels", axes[i][0]);
        double px = v->valuedouble;
        if (px == 0)
            continue;
        double mag = px < 0 ? -px : px;
        double notches = (mag + SCROLL_PX_PER_NOTCH - 1) / SCROLL_PX_PER_NOTCH;
        int n = notches > SCROLL_NOTCHES_MAX ? SCROLL_NOTCHES_MAX : (int)notches;
        cJSON *a = emit(m, "scroll", x, y, held);
        if (!a || !cJSON_AddStringToObject(a, "scroll_direction", axes[i][px > 0 ? 1 : 2]) ||
            !cJSON_AddNumberToObject(a, "scroll_amount", n < 1 ? 1 : n))
            return -ENOMEM;
        any = true;
    }
    if (!any) /* no distance: the pointer still goes there, as the model asked */
        EMIT(m, "mouse_move", x, y, NULL);
    return 0;
}

static int map_drag(struct map *m, const cJSON *act, const char *held)
{
    const cJSON *path = cJSON_GetObjectItemCaseSensitive(act, "path"), *p;
    int n = cJSON_GetArraySize(path);
    if (!cJSON_IsArray(path) || n < 2 || n > DRAG_POINTS_MAX)
        return fail(m, "path must be a list of 2 to %d points", DRAG_POINTS_MAX);
    if (*held)
        return fail(m, "keys held during a drag are not supported");
    int i = 0, x, y, r;
    cJSON_ArrayForEach(p, path)
    {
        if ((r = point(m, p, &x, &y)) < 0)
            return r;
        EMIT(m,
             i == 0       ? "left_mouse_down"
             : i == n - 1 ? "left_mouse_up"
                          : "mouse_move",
             x, y, NULL);
        i++;
    }
    return 0;
}

static int map_one(struct map *m, const cJSON *act)
{
    const char *t = m->type;
    char held[256];
    int x = -1, y = -1, r;
    if ((r = chord(m, cJSON_GetObjectItemCaseSensitive(act, "keys"), held, sizeof(held))) < 0)
        return r;
    bool at = !strcmp(t, "click") || !strcmp(t, "double_click") || !strcmp(t, "move") ||
              !strcmp(t, "scroll");
    if (at && (r = point(m, act, &x, &y)) < 0)
        return r;
    if (!strcmp(t, "click"))
        return map_click(m, act, x, y, held);
    if (!strcmp(t, "double_click")) {
        EMIT(m, "double_click", x, y, held);
        return 0;
    }
    if (!strcmp(t, "move")) {
        if (*held)
            return fail(m, "keys held during a move are not supported");
        EMIT(m, "mouse_move", x, y, NULL);
        return 0;
    }
    if (!strcmp(t, "scroll"))
        return map_scroll(m, act, x, y, held);
    if (!strcmp(t, "drag"))
        return map_drag(m, act, held);
    if (!strcmp(t, "keypress")) {
        if (!*held)
            return fail(m, "keys are missing");
        EMIT(m, "key", -1, -1, held);
        return 0;
    }
    if (!strcmp(t, "type")) {
        const char *text = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(act, "text"));
        if (!text)
            return fail(m, "text is missing");
        if (*text)
            EMIT(m, "type", -1, -1, text);
        return 0;
    }
    if (!strcmp(t, "wait")) {
        cJSON *a = emit(m, "wait", -1, -1, NULL);
        return a && cJSON_AddNumberToObject(a, "duration", WAIT_S) ? 0 : -ENOMEM;
    }
    if (!strcmp(t, "screenshot"))
        return 0; /* every call ends with one */
    return fail(m, "unknown action type");
}

cJSON *al_cua_openai_actions(const cJSON *actions, unsigned w, unsigned h, char *why, size_t whylen)
{
    struct map m = {.w = w, .h = h, .why = why, .whylen = whylen};
    if (whylen)
        why[0] = '\0';
    if (!cJSON_IsArray(actions)) {
        snprintf(why, whylen, "the actions are not a list");
        return NULL;
    }
    if (!(m.out = cJSON_CreateArray())) {
        snprintf(why, whylen, "out of memory");
        return NULL;
    }
    const cJSON *act;
    cJSON_ArrayForEach(act, actions)
    {
        m.n++;
        m.type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(act, "type"));
        int r = !cJSON_IsObject(act) || !m.type ? fail(&m, "not an object with a \"type\"")
                                                : map_one(&m, act);
        if (r < 0) {
            if (r == -ENOMEM)
                snprintf(why, whylen, "out of memory");
            cJSON_Delete(m.out);
            return NULL;
        }
    }
    return m.out;
}

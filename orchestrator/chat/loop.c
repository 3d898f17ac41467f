/* The loop: user message -> model -> code -> VM -> output -> model, until the model answers
 * without code, the user declines or interrupts, or a limit stops it. */
#include "chat.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util.h"

/* Screenshots go to the model at most this big on their longer side: Anthropic's computer tool
 * works best near 1280x800 and scales larger ones down itself (costing tokens). */
#define COMPUTER_EDGE 1280
/* After an action, before its screenshot: the guest's programs redraw. */
#define COMPUTER_SETTLE_MS 300
/* Anthropic's computer tool in the version Claude 3.7, 4 and Sonnet 4.5 take, and the newer one
 * (with zoom) of Claude Opus 4.5 and the 4.6 models on, as Anthropic's documentation pairs them. */
#define COMPUTER_TOOL "computer_20250124"
#define COMPUTER_BETA "computer-use-2025-01-24"
#define COMPUTER_TOOL_ZOOM "computer_20251124"
#define COMPUTER_BETA_ZOOM "computer-use-2025-11-24"

/* Whether an Anthropic model takes the newer computer tool: claude-FAMILY-MAJOR[-MINOR][-DATE]
 * at 4.6 or later, or Opus 4.5. */
bool al_chat_computer_zoom_tool(const char *model)
{
    if (!model || strncmp(model, "claude-", 7) != 0)
        return false;
    const char *fam = model + 7, *dash = strchr(fam, '-');
    if (!dash || dash == fam || dash - fam > 15)
        return false;
    for (const char *p = fam; p < dash; p++)
        if (*p < 'a' || *p > 'z') /* claude-3-7-sonnet: the old naming */
            return false;
    unsigned maj = 0, min = 0;
    if (sscanf(dash + 1, "%u-%u", &maj, &min) < 1)
        return false;
    if (min > 99) /* claude-opus-4-20250514: a date, not a minor version */
        min = 0;
    bool opus = dash - fam == 4 && !strncmp(fam, "opus", 4);
    return maj > 4 || (maj == 4 && (min >= 6 || (min == 5 && opus)));
}

const char *al_chat_outcome_str(enum al_chat_outcome o)
{
    switch (o) {
    case AL_CHAT_DONE:
        return "done";
    case AL_CHAT_MAX_TURNS:
        return "max-turns";
    case AL_CHAT_REPEATED:
        return "repeated";
    case AL_CHAT_BUDGET:
        return "token-budget";
    case AL_CHAT_DECLINED:
        return "declined";
    case AL_CHAT_CANCELLED:
        return "cancelled";
    }
    return "?";
}

static void notice(al_chat *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void notice(al_chat *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    al_vnotify(c->ui.notice, c->ui.ctx, fmt, ap);
    va_end(ap);
}

int al_chat_init(al_chat *c, const al_chat_cfg *cfg, const al_chat_ui *ui, al_session *s,
                 const char *langs, al_error *err)
{
    memset(c, 0, sizeof(*c));
    c->cfg = *cfg;
    if (ui)
        c->ui = *ui;
    if (c->cfg.computer)
        c->cfg.model.anthropic_beta =
            al_chat_computer_zoom_tool(c->cfg.model.model) ? COMPUTER_BETA_ZOOM : COMPUTER_BETA;
    if (!c->cfg.max_turns)
        c->cfg.max_turns = AL_CHAT_MAX_TURNS_DEFAULT;
    if (!c->cfg.max_output)
        c->cfg.max_output = AL_CHAT_MAX_OUTPUT_DEFAULT;
    if (c->cfg.max_output < AL_CHAT_MAX_OUTPUT_MIN)
        c->cfg.max_output = AL_CHAT_MAX_OUTPUT_MIN;
    c->session = s;
    c->figures.session = s;
    c->cancel_fd = cfg->model.cancel_fd;
    /* The session says "kernel:python" for languages with a long-lived interpreter; where there
     * are such, only they are offered, so the model does not pick between sh and shell. */
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", langs && *langs ? langs : "sh");
    bool any_kernel = strstr(buf, "kernel:") != NULL;
    for (char *save = NULL, *w = strtok_r(buf, " ", &save); w; w = strtok_r(NULL, " ", &save)) {
        bool k = !strncmp(w, "kernel:", 7);
        if (k != any_kernel)
            continue;
        const char *name = k ? w + 7 : w;
        size_t used = strlen(c->langs);
        snprintf(c->langs + used, sizeof(c->langs) - used, "%s%s", used ? " " : "", name);
    }
    c->kernels = any_kernel;
    c->messages = cJSON_CreateArray();
    c->system = al_chat_system_prompt(&c->cfg, c->langs, c->cfg.tools);
    c->created = (int64_t)time(NULL);
    if (!c->messages || !c->system) {
        al_chat_free(c);
        return al_err(err, -ENOMEM, "out of memory");
    }
    return 0;
}

void al_chat_free(al_chat *c)
{
    cJSON_Delete(c->images);
    c->images = NULL;
    cJSON_Delete(c->messages);
    free(c->system);
    free(c->save_path);
    c->messages = NULL;
    c->system = NULL;
    c->save_path = NULL;
}

void al_chat_reset(al_chat *c)
{
    cJSON_Delete(c->messages);
    c->messages = cJSON_CreateArray();
}

static const char *role_of(const cJSON *m)
{
    const char *r = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "role"));
    return r ? r : "";
}

/* A message the user typed, as opposed to run output sent in the user role (text mode). */
static bool is_user_turn(const cJSON *m)
{
    return !strcmp(role_of(m), "user") && !cJSON_GetObjectItemCaseSensitive(m, "kind");
}

int al_chat_undo(al_chat *c)
{
    int n = cJSON_GetArraySize(c->messages);
    int last_user = -1;
    for (int i = 0; i < n; i++)
        if (is_user_turn(cJSON_GetArrayItem(c->messages, i)))
            last_user = i;
    if (last_user < 0)
        return -ENOENT;
    while (cJSON_GetArraySize(c->messages) > last_user)
        cJSON_DeleteItemFromArray(c->messages, last_user);
    return 0;
}

/* ---- context window ---- */

/* What an API bills for an image of at most 1024 px a side: OpenAI 765 tokens for 1024x1024 at
 * high detail, Anthropic width x height / 750, about 1400; rounded up. */
#define VISION_IMAGE_TOKENS 1600

unsigned al_chat_estimate(const cJSON *msg)
{
    const cJSON *images = cJSON_GetObjectItemCaseSensitive(msg, "images");
    int nimg = cJSON_GetArraySize(images);
    cJSON *text_only = NULL;
    if (nimg > 0) { /* their base64 is not text the model reads */
        text_only = cJSON_Duplicate(msg, true);
        cJSON_DeleteItemFromObjectCaseSensitive(text_only, "images");
    }
    char *s = cJSON_PrintUnformatted(text_only ? text_only : msg);
    size_t n = s ? strlen(s) : 0;
    free(s);
    cJSON_Delete(text_only);
    /* ~4 bytes a token in English and code, plus framing */
    return (unsigned)(n / 4 + 4) + (unsigned)nimg * VISION_IMAGE_TOKENS;
}

cJSON *al_chat_fit(const cJSON *messages, const char *system, unsigned window, al_error *err)
{
    int n = cJSON_GetArraySize(messages);
    int keep_from = 0;
    if (window) {
        unsigned used = (unsigned)(strlen(system) / 4 + 4);
        int last_user = n;
        for (int i = 0; i < n; i++)
            if (is_user_turn(cJSON_GetArrayItem(messages, i)))
                last_user = i;
        for (int i = last_user; i < n; i++)
            used += al_chat_estimate(cJSON_GetArrayItem(messages, i));
        if (used > window)
            return al_err(err, -E2BIG,
                          "the context window (%u tokens) is too small for the system prompt "
                          "and the latest message (about %u tokens)",
                          window, used),
                   NULL;
        /* Older messages join newest first while they fit. A tool result never stays
         * without the assistant message that asked for it. */
        keep_from = last_user;
        for (int i = last_user - 1; i >= 0; i--) {
            unsigned e = al_chat_estimate(cJSON_GetArrayItem(messages, i));
            if (used + e > window)
                break;
            used += e;
            keep_from = i;
        }
        while (keep_from < last_user && !is_user_turn(cJSON_GetArrayItem(messages, keep_from)))
            keep_from++;
    }
    cJSON *out = cJSON_CreateArray();
    if (!out)
        return al_err(err, -ENOMEM, "out of memory"), NULL;
    for (int i = keep_from; i < n; i++)
        cJSON_AddItemReferenceToArray(out, cJSON_GetArrayItem(messages, i));
    return out;
}

/* ---- running code ---- */

static const char *canonical_lang(const char *langs, const char *want)
{
    static const char *const alias[][2] = {
        {"python3", "python"},    {"py", "python"},      {"bash", "shell"},
        {"sh", "shell"},          {"zsh", "shell"},      {"shell", "sh"},
        {"bash", "sh"},           {"js", "javascript"},  {"node", "javascript"},
        {"nodejs", "javascript"}, {"python", "python3"},
    };
    char buf[256];
    snprintf(buf, sizeof(buf), " %s ", langs);
    char w[80];
    snprintf(w, sizeof(w), " %s ", want);
    if (strstr(buf, w))
        return want;
    for (size_t i = 0; i < sizeof(alias) / sizeof(alias[0]); i++) {
        if (strcmp(alias[i][0], want))
            continue;
        snprintf(w, sizeof(w), " %s ", alias[i][1]);
        if (strstr(buf, w))
            return alias[i][1];
    }
    return NULL;
}

struct run_ctx {
    al_chat *c;
    al_capture cap;
};

static int on_output(void *ctx, int stream, const uint8_t *data, size_t n)
{
    struct run_ctx *rc = ctx;
    al_capture_add(&rc->cap, data, n);
    if (rc->c->ui.output)
        return rc->c->ui.output(rc->c->ui.ctx, stream, data, n);
    return 0;
}

/* A PNG result for the model to see, within AL_VISION_IMAGES_MAX per run; note says so. */
static void vision_add(al_chat *c, const al_mime *img, char *note, size_t cap)
{
    if (!c->images)
        c->images = cJSON_CreateArray();
    if (!c->images || cJSON_GetArraySize(c->images) >= AL_VISION_IMAGES_MAX)
        return;
    char *b64 = NULL;
    unsigned w, h;
    al_error e = {0};
    if (al_vision_png(img->data, img->len, &b64, &w, &h, &e) < 0) {
        snprintf(note, cap, "; not sent as an image: %.48s", e.msg);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    if (o && cJSON_AddStringToObject(o, "media_type", "image/png") &&
        cJSON_AddStringToObject(o, "data", b64) && cJSON_AddItemToArray(c->images, o))
        snprintf(note, cap, "; attached as an image, %ux%u", w, h);
    else
        cJSON_Delete(o);
    free(b64);
}

/* The run's images go with the message that carries its result. */
static cJSON *with_images(al_chat *c, cJSON *m)
{
    if (m && c->images && cJSON_GetArraySize(c->images) > 0) {
        cJSON_AddItemToObject(m, "images", c->images);
        c->images = NULL;
    }
    cJSON_Delete(c->images);
    c->images = NULL;
    return m;
}

/* Lines of a traceback the model gets after "name: value": its end says where it failed. */
#define TRACEBACK_TAIL_LINES 12

/* A result as text, for the model (inside the capture's head+tail bound) and for the user's
 * terminal (as output, unless results_to_ui: the front shows the result itself): text/plain
 * as the value; an image saved to the outputs directory and named (with results_to_ui only
 * named); HTML and the rest as a short note; an error as "name: value" and the traceback's
 * tail (stderr showed the user the whole of it). */
static int on_result(void *ctx, const al_result *r)
{
    struct run_ctx *rc = ctx;
    al_chat *c = rc->c;
    char *text = NULL;
    if (c->ui.result)
        c->ui.result(c->ui.ctx, r);
    if (r->kind == AL_RESULT_REFUSED) {
        if (asprintf(&text, "[result refused: %s]\n", r->why) < 0)
            text = NULL;
    } else if (r->kind == AL_RESULT_ERROR) {
        const char *tb = r->traceback ? r->traceback : "";
        const char *end = tb + strlen(tb), *tail = end;
        for (int lines = 0; tail > tb; tail--)
            if (tail[-1] == '\n' && tail != end && ++lines >= TRACEBACK_TAIL_LINES)
                break;
        if (asprintf(&text, "[error] %s: %s\n%s%s", r->name, r->value, tail > tb ? "..." : "",
                     tail) < 0)
            text = NULL;
        if (text) {
            al_capture_add(&rc->cap, text, strlen(text));
            free(text);
        }
        return 0; /* the terminal has the traceback from stderr */
    } else {
        const al_mime *img = al_result_mime(r, "image/png");
        if (!img)
            img = al_result_mime(r, "image/jpeg");
        if (!img)
            img = al_result_mime(r, "image/svg+xml");
        const al_mime *plain = al_result_mime(r, "text/plain");
        char host[4200], sent[96] = "";
        al_error fe = {0};
        if (img && c->cfg.vision && !strcmp(img->type, "image/png"))
            vision_add(c, img, sent, sizeof(sent));
        if (img && c->cfg.results_to_ui) { /* the front shows it from the result */
            if (asprintf(&text, "[%s %ux%u shown to the user%s]\n", img->type, r->width, r->height,
                         sent) < 0)
                text = NULL;
        } else if (img && al_figure_save(&c->figures, img, host, sizeof(host), &fe) == 0) {
            if (asprintf(&text, "[%s %ux%u saved: %s%s]\n", img->type, r->width, r->height, host,
                         sent) < 0)
                text = NULL;
        } else if (img) {
            if (asprintf(&text, "[%s not saved: %s]\n", img->type, fe.msg) < 0)
                text = NULL;
        } else if (plain) {
            if (asprintf(&text, "%s\n", (const char *)plain->data) < 0)
                text = NULL;
        } else if (asprintf(&text, "[%s result, %zu bytes]\n", r->mime[0].type, r->mime[0].len) <
                   0) {
            text = NULL;
        }
    }
    if (!text)
        return -ENOMEM;
    int ret = 0;
    if (c->cfg.results_to_ui) /* the front shows the result itself: the text is the model's */
        al_capture_add(&rc->cap, text, strlen(text));
    else
        ret = on_output(rc, 1, (const uint8_t *)text, strlen(text));
    free(text);
    return ret;
}

/* Runs code and returns the text the model gets; *cancelled when Ctrl-C stopped it. */
static char *run_code(al_chat *c, const char *lang, const char *code, bool *cancelled, bool *broken,
                      al_error *err)
{
    struct run_ctx rc = {.c = c};
    if (al_capture_init(&rc.cap, c->cfg.max_output) < 0)
        return al_err(err, -ENOMEM, "out of memory"), NULL;
    const char *argv[] = {code, NULL};
    al_exec_opts o = {
        .struct_size = sizeof(al_exec_opts),
        .argv = argv,
        .lang = lang,
        .timeout_ms = c->cfg.run_timeout_s * 1000u,
        /* Where the user's files are and where relative paths should land (a kernel starts
         * there and keeps its own cwd afterwards); report_files made it. */
        .cwd = AL_WORKDIR_GUEST_DIR,
        .stdin_fd = -1,
        .stdout_fd = -1,
        .stderr_fd = -1,
        .output = on_output,
        .output_ctx = &rc,
        .result = on_result,
        .result_ctx = &rc,
        .kernel = c->kernels,
        /* A program waiting for input would hang the loop: nobody types into it. */
        .input_wait_ms = AL_CHAT_INPUT_WAIT_MS,
        .interrupt_on_wait = true,
    };
    al_exec_result r = AL_EXEC_RESULT_INIT;
    al_error e = {0};
    int ret = al_exec(c->session, &o, &r, &e);
    /* Not found and not executable are answers; anything else means the channel broke. */
    *broken = ret < 0 && ret != -ENOENT && ret != -EACCES;
    char status[700];
    if (ret < 0) {
        /* A failure to run is the model's business too: say why instead of ending the chat. */
        snprintf(status, sizeof(status), "[could not run: %s]", e.msg);
    } else if (r.interrupted) {
        snprintf(status, sizeof(status), "[interrupted by the user]");
    } else if (r.waited_input) {
        snprintf(status, sizeof(status),
                 "[stopped: the program waited for input, which nobody can type here; pass data "
                 "as arguments or files instead]");
    } else if (r.timed_out && c->kernels && r.how == AL_EXEC_SIGNALED) {
        snprintf(status, sizeof(status),
                 "[stopped: the run exceeded %u s; the %s kernel did not stop when interrupted "
                 "and was killed, so its variables are gone]",
                 c->cfg.run_timeout_s, lang);
    } else if (r.timed_out) {
        /* The model's problem to solve, not the user's: the loop goes on. */
        snprintf(status, sizeof(status), "[stopped: the run exceeded %u s]", c->cfg.run_timeout_s);
    } else if (r.how == AL_EXEC_SIGNALED) {
        snprintf(status, sizeof(status), "[killed by signal %d (%s)]", r.value, strsignal(r.value));
    } else {
        snprintf(status, sizeof(status), "[exit status %d]", r.value);
    }
    /* Only the user's Ctrl-C (the cancel pipe, passed on to the guest) ends the task; a timeout
     * or an exit status of 130 is the run's result like any other. */
    *cancelled = ret == 0 && r.interrupted;
    /* What the model gets is text: the guest's bytes that are not UTF-8 become U+FFFD (the
     * user saw them made visible as they came). */
    char *raw = al_capture_text(&rc.cap);
    char *out = raw ? al_utf8_repair((const uint8_t *)raw, strlen(raw), NULL) : NULL;
    free(raw);
    al_capture_free(&rc.cap);
    if (!out)
        return al_err(err, -ENOMEM, "out of memory"), NULL;
    if (c->ui.run_end)
        c->ui.run_end(c->ui.ctx, ret == 0 ? &r : NULL, status);
    /* The model hears why as the user does, rather than retrying installs that cannot work. */
    static const char offline_how[] =
        "; only the user can allow hosts (airlock: --net allow=HOST,...; pip needs "
        "--net allow=" AL_OFFLINE_PIP_HOSTS ")";
    if (ret == 0 && r.offline)
        notice(c, AL_OFFLINE_HINT "%s", offline_how);
    char *text = NULL;
    size_t ol = strlen(out);
    if (asprintf(&text, "%s%s%s%s%s%s", out, ol && out[ol - 1] != '\n' ? "\n" : "", status,
                 ret == 0 && r.offline ? "\n[" AL_OFFLINE_HINT : "",
                 ret == 0 && r.offline ? offline_how : "", ret == 0 && r.offline ? "]" : "") < 0)
        text = NULL;
    free(out);
    if (!text)
        return al_err(err, -ENOMEM, "out of memory"), NULL;
    return text;
}

/* ---- what a run left behind ---- */

#define OUTPUTS_GUEST_DIR "/tmp/airlock-outputs" /* where the python kernel saves figures */
#define FILES_LISTED_MAX 20 /* a run that writes thousands of files gets a count, not a list */
#define LISTING_BYTES_MAX 16384

struct listing {
    char buf[LISTING_BYTES_MAX];
    size_t len;
};

static int on_listing(void *ctx, int stream, const uint8_t *data, size_t n)
{
    struct listing *l = ctx;
    if (stream != 1)
        return 0;
    size_t room = sizeof(l->buf) - 1 - l->len;
    if (n > room)
        n = room; /* the guest may say more; we read no further than the bound */
    memcpy(l->buf + l->len, data, n);
    l->len += n;
    return 0;
}

/* Files the run wrote in /workspace or as figures, found with a stamp file touched after each
 * listing; the first call, before the first run, makes /workspace (every run starts there) and
 * the first stamp. GNU find compares the files' ctime with the stamp in nanoseconds: ctime is
 * the guest's clock at the last change, which neither tar (the files copied in carry the host's
 * time) nor touch can set, so a file copied in is never taken for the run's. busybox's find
 * compares mtimes in whole seconds: the copy is extracted with the guest's time (tar -m), the
 * first stamp waits for the next second so that nothing copied before it looks newer, and later
 * stamps are dated a second back, at the price of sometimes listing a file twice. The listing
 * comes from the guest: only plain paths under the two directories are taken, and the copies of
 * figures are named here, never by the guest. Returns true when the user's Ctrl-C reached it. */
static bool report_files(al_chat *c, char **text)
{
    static const char script[] =
        "s=/tmp/.airlock-stamp; if find --version >/dev/null 2>&1; then g=1; else g=; fi; "
        "if [ -e $s ]; then "
        "find /workspace " OUTPUTS_GUEST_DIR " -xdev -type f -${g:+c}newer $s 2>/dev/null | "
        "head -n 21; "
        "if [ \"$g\" ]; then touch $s; else touch -d @$(($(date +%s) - 1)) $s; fi; "
        "else mkdir -p /workspace; "
        "if [ \"$g\" ]; then touch $s; "
        "else t=$(date +%s); touch -d @$t $s; while [ \"$(date +%s)\" = $t ]; do sleep 0.1; done; "
        "fi; fi";
    const char *argv[] = {"/bin/sh", "-c", script, NULL};
    struct listing *l = calloc(1, sizeof(*l));
    if (!l)
        return false;
    al_exec_opts o = {.struct_size = sizeof(al_exec_opts),
                      .argv = argv,
                      .stdin_fd = -1,
                      .stdout_fd = -1,
                      .stderr_fd = -1,
                      .output = on_listing,
                      .output_ctx = l,
                      .timeout_ms = 10000};
    al_exec_result r = AL_EXEC_RESULT_INIT;
    al_error e = {0};
    if (al_exec(c->session, &o, &r, &e) < 0 || !l->len) {
        free(l);
        return r.interrupted;
    }
    l->buf[l->len] = '\0';
    char *list = NULL;
    size_t list_len = 0;
    FILE *f = open_memstream(&list, &list_len);
    unsigned n = 0;
    for (char *save = NULL, *line = strtok_r(l->buf, "\n", &save); f && line;
         line = strtok_r(NULL, "\n", &save)) {
        bool ok_path = !strncmp(line, "/workspace/", 11) ||
                       !strncmp(line, OUTPUTS_GUEST_DIR "/", sizeof(OUTPUTS_GUEST_DIR));
        for (const char *p = line; ok_path && *p; p++)
            ok_path = (unsigned char)*p >= 0x20 && *p != 0x7f;
        if (!ok_path || strstr(line, "/../"))
            continue;
        if (++n > FILES_LISTED_MAX) {
            fputs("(and more)\n", f);
            break;
        }
        fprintf(f, "%s\n", line);
        /* Without files of its own (airlockd), the front fetches the figures it lists. */
        if (c->cfg.results_to_ui || strncmp(line, OUTPUTS_GUEST_DIR "/", sizeof(OUTPUTS_GUEST_DIR)))
            continue;
        char host[AL_PATH_MAX];
        al_error fe = {0};
        /* bounded, checked: figures.c */
        int fr = al_figure_get(&c->figures, line, host, sizeof(host), &fe);
        if (fr == 0)
            notice(c, "figure copied to %s", host);
        else if (fr != -ENOTSUP) { /* the user and the model both learn why */
            notice(c, "figure %s not copied: %s", line, fe.msg);
            fprintf(f, "(figure not copied: %s)\n", fe.msg);
        }
    }
    if (f)
        fclose(f);
    free(l);
    if (n && list) {
        notice(c, "files written by the run:\n%s", list);
        char *t = NULL, *names = al_utf8_repair((const uint8_t *)list, strlen(list), NULL);
        if (*text && names &&
            asprintf(&t, "%s\n[files written by this run:\n%s]", *text, names) >= 0) {
            free(*text);
            *text = t;
        }
        free(names);
    }
    free(list);
    return r.interrupted;
}

/* ---- the model ---- */

/* Adds {"name", "description", "parameters": {"type": "object", "properties": {}, "required": []}}
 * to tools; returns the parameters object for param(). */
static cJSON *tool(cJSON *tools, const char *name, const char *description)
{
    cJSON *t = cJSON_CreateObject();
    cJSON_AddItemToArray(tools, t);
    cJSON_AddStringToObject(t, "name", name);
    cJSON_AddStringToObject(t, "description", description);
    cJSON *p = cJSON_AddObjectToObject(t, "parameters");
    cJSON_AddStringToObject(p, "type", "object");
    cJSON_AddObjectToObject(p, "properties");
    cJSON_AddArrayToObject(p, "required");
    return p;
}

/* A required parameter of a tool; returns its schema for additions such as an enum. */
static cJSON *param(cJSON *params, const char *name, const char *type, const char *description)
{
    cJSON *v =
        cJSON_AddObjectToObject(cJSON_GetObjectItemCaseSensitive(params, "properties"), name);
    cJSON_AddStringToObject(v, "type", type);
    cJSON_AddStringToObject(v, "description", description);
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(params, "required"),
                         cJSON_CreateString(name));
    return v;
}

/* How a reply's calls went: run, or stopped (and why) before the rest. */
enum step { STEP_RAN, STEP_DECLINED, STEP_CANCELLED, STEP_REPEATED };

/* ---- computer use: the session's screen (session/screen.c) ---- */

static cJSON *last_user_turn(al_chat *c);
/* A checkpoint now, in the chat's list, the exchange's first for %undo; 0 when none. */
static uint32_t take_checkpoint(al_chat *c, const char *code);

/* Before the first actions (list, the library's action set; text, as printed) of an exchange
 * that act on the VM (not only waits or the cursor's position), with checkpoints on: a
 * checkpoint, so that %undo and the rollback tool bring back the screen and all it changed as
 * for code (one an exchange: a checkpoint is a snapshot of the whole VM, too much for every
 * click). The note for the model, when one was taken, in *note. */
static void computer_checkpoint(al_chat *c, const cJSON *list, const char *text,
                                char note[static 64])
{
    note[0] = '\0';
    bool acts = false;
    const cJSON *m;
    cJSON_ArrayForEach(m, list)
    {
        const char *n = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "action"));
        acts |= !n || (strcmp(n, "wait") != 0 && strcmp(n, "cursor_position") != 0);
    }
    cJSON *u = last_user_turn(c);
    if (!acts || c->cfg.checkpoint == AL_CHECKPOINT_NEVER || !u ||
        cJSON_GetObjectItemCaseSensitive(u, "checkpoint"))
        return;
    uint32_t id = take_checkpoint(c, text);
    if (id)
        snprintf(note, 64, " [checkpoint %u was taken before this action]", id);
}

/* A PNG (base64) for the model, attached to the message in progress (c->images). */
static int attach_png(al_chat *c, const char *b64, al_error *err)
{
    if (!c->images && !(c->images = cJSON_CreateArray()))
        return al_err(err, -ENOMEM, "out of memory");
    cJSON *img = cJSON_CreateObject();
    if (!img || !cJSON_AddStringToObject(img, "media_type", "image/png") ||
        !cJSON_AddStringToObject(img, "data", b64) || !cJSON_AddItemToArray(c->images, img)) {
        cJSON_Delete(img);
        return al_err(err, -ENOMEM, "out of memory");
    }
    return 0;
}

/* A screenshot for the model, its size the space of the model's coordinates from now on. */
static int computer_shot(al_chat *c, al_error *err)
{
    _cleanup_free_ char *b64 = NULL;
    al_screenshot shot = AL_SCREENSHOT_INIT;
    int r = al_vision_screen(c->session, COMPUTER_EDGE, &b64, &shot, err);
    if (r < 0)
        return r;
    c->shot_w = shot.width, c->shot_h = shot.height;
    c->screen_w = shot.screen_width, c->screen_h = shot.screen_height;
    return attach_png(c, b64, err);
}

/* The screen's size as screenshots are sent (the model's coordinate space), from one taken
 * for it when none was yet; its image is not sent. */
static int computer_size(al_chat *c, al_error *err)
{
    if (c->shot_w)
        return 0;
    int r = computer_shot(c, err);
    cJSON_Delete(c->images);
    c->images = NULL;
    return r;
}

/* An action (or a batch) that acts on the VM: the user sees it as a run's code and, without
 * auto-run, confirms it, and may edit its JSON in *json. false when declined. */
static bool offer_action(al_chat *c, char **json)
{
    if (c->ui.code)
        c->ui.code(c->ui.ctx, "computer", *json);
    return c->cfg.auto_run || !c->ui.confirm || c->ui.confirm(c->ui.ctx, "computer", json) == 1;
}

/* The zoom action: the region [x0, y0, x1, y1) of the screenshots' space (x1, y1 excluded), cut
 * from a fresh screenshot at the screen's own resolution (at most COMPUTER_EDGE on its longer
 * side); the model's coordinates stay those of the screenshots. */
static char *computer_zoom(al_chat *c, const cJSON *args)
{
    char *text = NULL;
    al_error e = {0};
    if (computer_size(c, &e) < 0)
        return asprintf(&text, "error: %s", e.msg) < 0 ? NULL : text;
    const cJSON *reg = cJSON_GetObjectItemCaseSensitive(args, "region"), *v;
    double r[4];
    int n = 0;
    cJSON_ArrayForEach(v, (cJSON_IsArray(reg) ? reg : NULL))
    {
        if (n == 4 || !cJSON_IsNumber(v) || v->valuedouble != (double)(long)v->valuedouble)
            break;
        r[n++] = v->valuedouble;
    }
    if (n != 4 || cJSON_GetArraySize(reg) != 4)
        return strdup("error: region must be [x0, y0, x1, y1] in whole pixels");
    if (r[0] < 0 || r[1] < 0 || r[2] > c->shot_w || r[3] > c->shot_h || r[0] >= r[2] ||
        r[1] >= r[3])
        return asprintf(&text,
                        "error: the region [%.0f, %.0f, %.0f, %.0f] is not inside the %ux%u "
                        "screen (x0 < x1 <= %u, y0 < y1 <= %u)",
                        r[0], r[1], r[2], r[3], c->shot_w, c->shot_h, c->shot_w, c->shot_h) < 0
                   ? NULL
                   : text;
    /* Onto the screen's pixels: every screen pixel the region's pixels cover. */
    uint64_t sw = c->screen_w, sh = c->screen_h;
    al_screenshot_opts o = AL_SCREENSHOT_OPTS_INIT;
    o.x = (unsigned)((uint64_t)r[0] * sw / c->shot_w);
    o.y = (unsigned)((uint64_t)r[1] * sh / c->shot_h);
    o.w = (unsigned)(((uint64_t)r[2] * sw + c->shot_w - 1) / c->shot_w) - o.x;
    o.h = (unsigned)(((uint64_t)r[3] * sh + c->shot_h - 1) / c->shot_h) - o.y;
    o.max_edge = COMPUTER_EDGE;
    al_screenshot got = AL_SCREENSHOT_INIT;
    if (al_screen_capture(c->session, &o, &got, &e) < 0)
        return asprintf(&text, "error: %s", e.msg) < 0 ? NULL : text;
    _cleanup_free_ char *b64 = al_base64(got.png, got.len);
    free(got.png);
    if (!b64 || attach_png(c, b64, &e) < 0)
        return NULL;
    return asprintf(&text,
                    "The region [%.0f, %.0f, %.0f, %.0f] at the screen's resolution (%ux%u). "
                    "Coordinates stay those of the %ux%u screenshots.",
                    r[0], r[1], r[2], r[3], got.width, got.height, c->shot_w, c->shot_h) < 0
               ? NULL
               : text;
}

/* The model's computer call: its action run on the screen (after the user's yes, unless
 * auto-run), then a screenshot; the text it gets back. */
static char *computer_call(al_chat *c, const al_tool_call *call, enum step *step)
{
    _cleanup_free_ char *action = strdup(call->arguments ? call->arguments : "");
    _cleanup_cjson_ cJSON *args = cJSON_Parse(action ? action : "");
    const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(args, "action"));
    char *text = NULL, note[64] = "";
    if (!cJSON_IsObject(args) || !name)
        return strdup("error: pass one action as {\"action\": NAME, ...}");
    al_error e = {0};
    if (!strcmp(name, "zoom"))
        return computer_zoom(c, args);
    if (strcmp(name, "screenshot") != 0 && strcmp(name, "cursor_position") != 0) {
        if (!offer_action(c, &action)) {
            *step = STEP_DECLINED;
            return strdup("The user declined this action.");
        }
        /* What the user may have edited is what runs. */
        cJSON_Delete(args);
        args = cJSON_Parse(action ? action : "");
        name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(args, "action"));
        if (!cJSON_IsObject(args) || !name)
            return strdup("error: the action is not a JSON object with an \"action\"");
    }
    if (strcmp(name, "screenshot") != 0) {
        if (computer_size(c, &e) < 0)
            return asprintf(&text, "error: %s", e.msg) < 0 ? NULL : text;
        _cleanup_cjson_ cJSON *list = cJSON_CreateArray();
        cJSON_AddItemToArray(list, cJSON_Duplicate(args, true));
        _cleanup_free_ char *acts = cJSON_PrintUnformatted(list);
        unsigned done = 0;
        int x = -1, y = -1;
        if (!acts)
            return NULL;
        computer_checkpoint(c, list, acts, note);
        if (al_screen_input(c->session, acts, c->shot_w, c->shot_h, &done, &x, &y, &e) < 0)
            return asprintf(&text, "error: %s", e.msg) < 0 ? NULL : text;
        if (!strcmp(name, "cursor_position"))
            return asprintf(&text, "X=%d,Y=%d", x, y) < 0 ? NULL : text;
        if (strcmp(name, "wait") != 0)
            usleep(COMPUTER_SETTLE_MS * 1000);
    }
    memset(&e, 0, sizeof(e));
    if (computer_shot(c, &e) < 0)
        return asprintf(&text, "done, but no screenshot: %s", e.msg) < 0 ? NULL : text;
    if (asprintf(&text, "%s: the screen now (%ux%u).%s",
                 strcmp(name, "screenshot") ? "Done" : "Screenshot", c->shot_w, c->shot_h,
                 note) < 0)
        return NULL;
    return text;
}

/* OpenAI's computer call (the Responses API): its pending safety checks acknowledged by a
 * person (asked even with auto-run; never acknowledged automatically), its batch of actions
 * shown and confirmed as a run's code is, then run on the screen. The result message gets
 * "acknowledged_safety_checks" and "is_error" through extra; the screenshot after it is the
 * caller's. */
static char *openai_computer_call(al_chat *c, const al_tool_call *call, enum step *step,
                                  cJSON *extra)
{
    _cleanup_cjson_ cJSON *args = cJSON_Parse(call->arguments ? call->arguments : "");
    const cJSON *checks = cJSON_GetObjectItemCaseSensitive(args, "pending_safety_checks"), *chk;
    char *text = NULL;
    cJSON_AddTrueToObject(extra, "is_error"); /* until the actions ran */
    cJSON_ArrayForEach(chk, checks)
    {
        const char *code = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(chk, "code"));
        const char *msg = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(chk, "message"));
        if (!c->ui.acknowledge ||
            c->ui.acknowledge(c->ui.ctx, code ? code : "", msg ? msg : "") != 1) {
            *step = STEP_DECLINED;
            return asprintf(&text,
                            "The user did not acknowledge the safety check (%.64s): the actions "
                            "were not run.",
                            code ? code : "no code") < 0
                       ? NULL
                       : text;
        }
    }
    if (cJSON_GetArraySize(checks) > 0)
        cJSON_AddItemToObject(extra, "acknowledged_safety_checks", cJSON_Duplicate(checks, true));
    _cleanup_cjson_ cJSON *acts =
        cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(args, "actions"), true);
    const cJSON *one = cJSON_GetObjectItemCaseSensitive(args, "action");
    if (!acts && cJSON_IsObject(one) && (acts = cJSON_CreateArray()))
        cJSON_AddItemToArray(acts, cJSON_Duplicate(one, true));
    if (!cJSON_IsArray(acts))
        return strdup("error: the computer call has no actions");
    bool acting = false;
    const cJSON *a;
    cJSON_ArrayForEach(a, acts)
    {
        const char *t = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(a, "type"));
        acting |= !t || strcmp(t, "screenshot") != 0;
    }
    al_error e = {0};
    if (acting) {
        _cleanup_free_ char *shown = cJSON_PrintUnformatted(acts);
        if (!shown)
            return NULL;
        if (!offer_action(c, &shown)) {
            *step = STEP_DECLINED;
            return strdup("The user declined these actions.");
        }
        cJSON_Delete(acts);
        acts = cJSON_Parse(shown ? shown : "");
        if (!cJSON_IsArray(acts))
            return strdup("error: the actions are not a JSON list");
    }
    if (computer_size(c, &e) < 0)
        return asprintf(&text, "error: %s", e.msg) < 0 ? NULL : text;
    char why[256];
    _cleanup_cjson_ cJSON *mine =
        al_cua_openai_actions(acts, c->shot_w, c->shot_h, why, sizeof(why));
    if (!mine)
        return asprintf(&text, "error: %s; nothing was done", why) < 0 ? NULL : text;
    char note[64] = "";
    if (cJSON_GetArraySize(mine) > 0) {
        _cleanup_free_ char *list = cJSON_PrintUnformatted(mine);
        unsigned done = 0;
        if (!list)
            return NULL;
        computer_checkpoint(c, mine, list, note);
        if (al_screen_input(c->session, list, c->shot_w, c->shot_h, &done, NULL, NULL, &e) < 0)
            return asprintf(&text, "error: %s", e.msg) < 0 ? NULL : text;
        usleep(COMPUTER_SETTLE_MS * 1000);
    }
    cJSON_DeleteItemFromObject(extra, "is_error");
    return asprintf(&text, "Done: the screen now (%ux%u).%s", c->shot_w, c->shot_h, note) < 0
               ? NULL
               : text;
}

/* The computer tool: Anthropic's own (their models are trained on it), OpenAI's own on its
 * Responses API (the preview model's older tool for it), and a function of the same shape as
 * Anthropic's for other OpenAI-compatible models. */
static void computer_tool(const al_chat *c, cJSON *tools)
{
    char desc[400];
    snprintf(desc, sizeof(desc),
             "Use the sandbox VM's screen, mouse and keyboard. The screen is %ux%u pixels; "
             "coordinates are pixels of it. Every action returns a screenshot of the screen "
             "after it.",
             c->shot_w, c->shot_h);
    cJSON *p = tool(tools, "computer", desc);
    static const char *const actions[] = {
        "screenshot",      "mouse_move",   "left_click",      "right_click",   "middle_click",
        "double_click",    "triple_click", "left_mouse_down", "left_mouse_up", "left_click_drag",
        "scroll",          "key",          "hold_key",        "type",          "wait",
        "cursor_position", "zoom"};
    cJSON *en = cJSON_AddArrayToObject(param(p, "action", "string", "the action"), "enum");
    for (size_t i = 0; i < sizeof(actions) / sizeof(actions[0]); i++)
        cJSON_AddItemToArray(en, cJSON_CreateString(actions[i]));
    cJSON *props = cJSON_GetObjectItemCaseSensitive(p, "properties");
    static const char *const xy[] = {"coordinate", "start_coordinate"};
    for (int i = 0; i < 2; i++) {
        cJSON *v = cJSON_AddObjectToObject(props, xy[i]);
        cJSON_AddStringToObject(v, "type", "array");
        cJSON_AddNumberToObject(v, "minItems", 2);
        cJSON_AddNumberToObject(v, "maxItems", 2);
        cJSON_AddStringToObject(cJSON_AddObjectToObject(v, "items"), "type", "integer");
        cJSON_AddStringToObject(v, "description",
                                i ? "where a drag starts" : "[x, y] in screenshot pixels");
    }
    cJSON *v = cJSON_AddObjectToObject(props, "text");
    cJSON_AddStringToObject(v, "type", "string");
    cJSON_AddStringToObject(v, "description",
                            "text to type, or keys (\"ctrl+s\", \"Return\") for key and hold_key");
    v = cJSON_AddObjectToObject(props, "scroll_direction");
    cJSON_AddStringToObject(v, "type", "string");
    cJSON *dirs = cJSON_AddArrayToObject(v, "enum");
    static const char *const ds[] = {"up", "down", "left", "right"};
    for (int i = 0; i < 4; i++)
        cJSON_AddItemToArray(dirs, cJSON_CreateString(ds[i]));
    cJSON_AddStringToObject(cJSON_AddObjectToObject(props, "scroll_amount"), "type", "integer");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(props, "duration"), "type", "number");
    v = cJSON_AddObjectToObject(props, "region");
    cJSON_AddStringToObject(v, "type", "array");
    cJSON_AddNumberToObject(v, "minItems", 4);
    cJSON_AddNumberToObject(v, "maxItems", 4);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(v, "items"), "type", "integer");
    cJSON_AddStringToObject(v, "description",
                            "zoom: [x0, y0, x1, y1], the region to see at full resolution");
    cJSON *t = cJSON_GetArrayItem(tools, cJSON_GetArraySize(tools) - 1);
    cJSON *an = cJSON_AddObjectToObject(t, "anthropic");
    bool zoom = al_chat_computer_zoom_tool(c->cfg.model.model);
    cJSON_AddStringToObject(an, "type", zoom ? COMPUTER_TOOL_ZOOM : COMPUTER_TOOL);
    cJSON_AddStringToObject(an, "name", "computer");
    cJSON_AddNumberToObject(an, "display_width_px", c->shot_w);
    cJSON_AddNumberToObject(an, "display_height_px", c->shot_h);
    if (zoom)
        cJSON_AddTrueToObject(an, "enable_zoom");
    cJSON *oa = cJSON_AddObjectToObject(t, "openai");
    const char *model = c->cfg.model.model ? c->cfg.model.model : "";
    if (!strncmp(model, "computer-use-preview", 20)) {
        cJSON_AddStringToObject(oa, "type", "computer_use_preview");
        cJSON_AddNumberToObject(oa, "display_width", c->shot_w);
        cJSON_AddNumberToObject(oa, "display_height", c->shot_h);
        cJSON_AddStringToObject(oa, "environment", "linux");
    } else {
        cJSON_AddStringToObject(oa, "type", "computer");
    }
}

static cJSON *tools_schema(const al_chat *c)
{
    cJSON *tools = cJSON_CreateArray();
    cJSON *p = tool(tools, "execute",
                    "Run code in the sandbox VM. Returns its output (stdout and stderr as they "
                    "interleaved, long output shortened in the middle) and its exit status.");
    cJSON *en =
        cJSON_AddArrayToObject(param(p, "language", "string", "the language of the code"), "enum");
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", c->langs);
    for (char *save = NULL, *w = strtok_r(buf, " ", &save); w; w = strtok_r(NULL, " ", &save))
        cJSON_AddItemToArray(en, cJSON_CreateString(w));
    param(p, "code", "string", "the code to run");
    if (c->cfg.computer)
        computer_tool(c, tools);
    if (c->cfg.checkpoint == AL_CHECKPOINT_NEVER)
        return tools;
    p = tool(tools, "rollback",
             "Undo what runs did to the VM: restore the checkpoint named in a run's result "
             "('checkpoint N was taken before this run'). Files, processes and interpreter "
             "variables go back to how they were then.");
    param(p, "checkpoint", "integer", "the checkpoint id");
    return tools;
}

static void ui_text(void *ctx, const char *s, size_t n)
{
    al_chat *c = ctx;
    if (c->ui.thinking) {
        c->ui.thinking(c->ui.ctx, false);
    }
    if (c->ui.text)
        c->ui.text(c->ui.ctx, s, n);
}

static void add_message(al_chat *c, cJSON *m)
{
    cJSON_AddItemToArray(c->messages, m);
    if (c->ui.message)
        c->ui.message(c->ui.ctx, m);
}

static int ask_model(al_chat *c, al_model_reply *reply, al_error *err)
{
    _cleanup_cjson_ cJSON *send = al_chat_fit(c->messages, c->system, c->cfg.context_window, err);
    if (!send)
        return err->code;
    cJSON *sys = cJSON_CreateObject();
    cJSON_AddStringToObject(sys, "role", "system");
    cJSON_AddStringToObject(sys, "content", c->system);
    cJSON_InsertItemInArray(send, 0, sys);
    /* The computer tool says the screen's size (a failure is the first action's to report). */
    al_error se = {0};
    if (c->cfg.computer && c->cfg.tools)
        computer_size(c, &se);
    _cleanup_cjson_ cJSON *tools = c->cfg.tools ? tools_schema(c) : NULL;
    al_model_stream_cb cb = {.text = ui_text, .ctx = c};
    if (c->ui.thinking)
        c->ui.thinking(c->ui.ctx, true);
    al_error e = {0};
    int r = al_model_chat(&c->cfg.model, send, tools, &cb, reply, &e);
    if (r == -ENOTSUP && c->cfg.tools) {
        /* The endpoint does not do tool calls: switch this session to fenced blocks. */
        notice(c, "the model endpoint rejected tool calls; switching to code blocks in text");
        c->cfg.tools = false;
        free(c->system);
        c->system = al_chat_system_prompt(&c->cfg, c->langs, false);
        if (!c->system)
            return al_err(err, -ENOMEM, "out of memory");
        cJSON_ReplaceItemInObject(sys, "content", cJSON_CreateString(c->system));
        memset(&e, 0, sizeof(e));
        r = al_model_chat(&c->cfg.model, send, NULL, &cb, reply, &e);
    }
    if (c->ui.thinking)
        c->ui.thinking(c->ui.ctx, false);
    if (r < 0) {
        *err = e;
        return r;
    }
    c->input_tokens += reply->input_tokens;
    c->output_tokens += reply->output_tokens;
    if (c->ui.text_end)
        c->ui.text_end(c->ui.ctx);
    return 0;
}

/* Sets *why to a formatted reason (NULL when out of memory); returns -1 for parse_call. */
static int refuse_call(char **why, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int refuse_call(char **why, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(why, fmt, ap) < 0)
        *why = NULL;
    va_end(ap);
    return -1;
}

/* What the model asked for in one tool call: language and code, or why it cannot run. */
static int parse_call(al_chat *c, const al_tool_call *call, char **lang, char **code, char **why)
{
    *lang = *code = *why = NULL;
    if (!call->name || strcmp(call->name, "execute"))
        return refuse_call(why, "error: unknown tool '%s'; the tools are 'execute' and 'rollback'",
                           call->name ? call->name : "");
    _cleanup_cjson_ cJSON *args = cJSON_Parse(call->arguments ? call->arguments : "");
    if (!cJSON_IsObject(args))
        return refuse_call(why, "error: the arguments are not a JSON object: %.200s",
                           call->arguments ? call->arguments : "");
    const char *l = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(args, "language"));
    const char *k = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(args, "code"));
    if (!k || !*k)
        return refuse_call(why, "error: no code given; pass the code in \"code\"");
    const char *cl = l ? canonical_lang(c->langs, l) : NULL;
    if (!cl)
        return refuse_call(why, "error: unknown language '%.64s'; available: %s", l ? l : "",
                           c->langs);
    *lang = strdup(cl);
    *code = strdup(k);
    return 0;
}

static char *do_rollback(al_chat *c, const char *id_or_name, al_error *err);

/* The model's rollback(checkpoint) call; the text it gets back. */
static char *rollback_call(al_chat *c, const al_tool_call *call)
{
    _cleanup_cjson_ cJSON *args = cJSON_Parse(call->arguments ? call->arguments : "");
    cJSON *id = cJSON_GetObjectItemCaseSensitive(args, "checkpoint");
    char buf[32], *text = NULL;
    if (cJSON_IsNumber(id) && id->valuedouble >= 1 && id->valuedouble < 4294967296.0)
        snprintf(buf, sizeof(buf), "%u", (unsigned)id->valuedouble);
    else if (cJSON_IsString(id) && strlen(id->valuestring) < sizeof(buf))
        snprintf(buf, sizeof(buf), "%s", id->valuestring);
    else
        return strdup("error: pass the checkpoint id as {\"checkpoint\": N}");
    al_error e = {0};
    text = do_rollback(c, buf, &e);
    if (!text && asprintf(&text, "error: could not roll back to checkpoint %s: %s", buf, e.msg) < 0)
        text = NULL;
    return text;
}

static cJSON *tool_result(const al_tool_call *call, const char *text)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "tool");
    cJSON_AddStringToObject(m, "tool_call_id", call->id ? call->id : "");
    cJSON_AddStringToObject(m, "name", call->name ? call->name : "");
    cJSON_AddStringToObject(m, "content", text);
    return m;
}

static cJSON *user_msg(const char *text)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "user");
    cJSON_AddStringToObject(m, "content", text);
    return m;
}

/* FNV-1a: enough to notice the model running the same code to the same result. */
static uint64_t hash2(const char *a, const char *b)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *s = a; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;
    for (const char *s = b; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static void append(char **text, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void append(char **text, const char *fmt, ...)
{
    char *more = NULL, *t = NULL;
    va_list ap;
    va_start(ap, fmt);
    int n = vasprintf(&more, fmt, ap);
    va_end(ap);
    if (n >= 0 && asprintf(&t, "%s\n%s", *text, more) >= 0) {
        free(*text);
        *text = t;
    }
    free(more);
}

const char *al_chat_checkpoint_code(const al_chat *c, uint32_t id)
{
    for (unsigned i = 0; i < c->nckpts; i++)
        if (c->ckpts[i].id == id)
            return c->ckpts[i].code;
    return "";
}

static cJSON *last_user_turn(al_chat *c)
{
    cJSON *last = NULL, *m;
    cJSON_ArrayForEach(m, c->messages)
    {
        if (is_user_turn(m))
            last = m;
    }
    return last;
}

/* Takes a checkpoint before a run when the policy asks for one; 0 when none was taken. */
static uint32_t checkpoint_before(al_chat *c, const char *lang, const char *code)
{
    if (c->cfg.checkpoint == AL_CHECKPOINT_NEVER ||
        !al_checkpoint_policy_wants(lang, code, c->cfg.checkpoint))
        return 0;
    return take_checkpoint(c, code);
}

static uint32_t take_checkpoint(al_chat *c, const char *code)
{
    al_error e = {0};
    int id = al_checkpoint_create(c->session, NULL, NULL, &e);
    if (id <= 0) {
        notice(c, "no checkpoint before this run: %s", e.msg);
        return 0;
    }
    if (c->nckpts == AL_CHECKPOINTS_MAX) {
        /* The library pruned its oldest unnamed checkpoint to make room: forget the one that
         * is gone (named ones, taken with %checkpoint, are not in this list). */
        unsigned keep = 0;
        for (unsigned i = 0; i < c->nckpts; i++) {
            char idbuf[16];
            al_checkpoint_info ci = AL_CHECKPOINT_INFO_INIT;
            al_error fe = {0};
            snprintf(idbuf, sizeof(idbuf), "%u", c->ckpts[i].id);
            if (al_checkpoint_find(c->session, idbuf, &ci, &fe) == 0)
                c->ckpts[keep++] = c->ckpts[i];
        }
        if (keep == AL_CHECKPOINTS_MAX) { /* none of ours went: make room all the same */
            memmove(c->ckpts, c->ckpts + 1, sizeof(c->ckpts[0]) * (AL_CHECKPOINTS_MAX - 1));
            keep--;
        }
        c->nckpts = keep;
    }
    struct al_chat_ckpt *k = &c->ckpts[c->nckpts++];
    k->id = (uint32_t)id;
    snprintf(k->code, sizeof(k->code), "%.*s", (int)strcspn(code, "\n"), code);
    /* The exchange's first checkpoint is what %undo goes back to. */
    cJSON *u = last_user_turn(c);
    if (u && !cJSON_GetObjectItemCaseSensitive(u, "checkpoint"))
        cJSON_AddNumberToObject(u, "checkpoint", id);
    return (uint32_t)id;
}

/* After a run broke the channel (agent killed, kernel panic, VM gone): roll back on our own. */
static void recover(al_chat *c, char **result)
{
    uint32_t id = 0;
    al_error e = {0};
    int r = c->cfg.checkpoint == AL_CHECKPOINT_NEVER ? -ENOTSUP
                                                     : al_checkpoint_recover(c->session, &id, &e);
    if (r == 1) {
        notice(c, "the run broke the VM; rolled it back to checkpoint %u (before: %s)", id,
               al_chat_checkpoint_code(c, id));
        append(result,
               "[the run crashed the VM or its agent; Airlock rolled the VM back to checkpoint "
               "%u, taken before: %s. Everything done since then is undone.]",
               id, al_chat_checkpoint_code(c, id));
    } else if (r == 0) {
        append(result, "[the connection to the VM was reset; nothing was undone]");
    } else {
        notice(c, "the VM cannot be used any more (%s); %%reset starts a fresh one",
               r == -ENOTSUP ? "checkpoints are off" : e.msg);
        append(result, "[the VM is no longer usable and could not be rolled back]");
    }
}

/* Offers one block of code, runs it, and returns the text for the model. */
/* What the session's proxy refused during a run: each told to the user, and to the model in
 * the run's result, so it can ask the user to allow a host instead of retrying. */
#define NET_DENIALS_REPORTED_MAX 8
struct net_denials {
    al_chat *c;
    char **result;
    unsigned n, more;
};

static void on_net_request(void *ctx, const al_net_request *r)
{
    struct net_denials *d = ctx;
    if (r->allowed)
        return;
    if (d->n >= NET_DENIALS_REPORTED_MAX) {
        d->more++;
        return;
    }
    d->n++;
    notice(d->c, "blocked: %s", r->why);
    append(d->result, "blocked: %s", r->why);
}

static void report_net(al_chat *c, char **result)
{
    if (!al_session_net(c->session))
        return;
    struct net_denials d = {.c = c, .result = result};
    al_error ignored = {0};
    al_net_requests(c->session, &c->net_seen, on_net_request, &d, &ignored);
    if (d.more)
        append(result, "(%u more requests blocked)", d.more);
}

static int one_run(al_chat *c, const char *lang, char **code, uint64_t *seen, size_t *nseen,
                   size_t seen_cap, char **result, enum step *step, al_error *err)
{
    if (c->ui.code)
        c->ui.code(c->ui.ctx, lang, *code);
    if (!c->cfg.auto_run && c->ui.confirm && c->ui.confirm(c->ui.ctx, lang, code) != 1) {
        *result = strdup("The user declined to run this code.");
        *step = STEP_DECLINED;
        return *result ? 0 : al_err(err, -ENOMEM, "out of memory");
    }
    bool cancelled = false, broken = false;
    if (!c->stamped) {
        /* The first listing needs a stamp older than the run, and the run needs /workspace. */
        char *none = NULL;
        cancelled = report_files(c, &none);
        c->stamped = true;
    }
    if (cancelled) {
        *result = strdup("[interrupted by the user before the run started]");
        *step = STEP_CANCELLED;
        return *result ? 0 : al_err(err, -ENOMEM, "out of memory");
    }
    uint32_t ckpt = checkpoint_before(c, lang, *code);
    if (c->ui.run_start) {
        char word[sizeof(c->warm_langs)];
        snprintf(word, sizeof(word), " %s ", lang);
        size_t have = strlen(c->warm_langs);
        bool cold = c->kernels && !strstr(c->warm_langs, word);
        if (cold && have + strlen(word) < sizeof(c->warm_langs))
            snprintf(c->warm_langs + have, sizeof(c->warm_langs) - have, "%s", word + (have > 0));
        c->ui.run_start(c->ui.ctx, lang, cold);
    }
    *result = run_code(c, lang, *code, &cancelled, &broken, err);
    if (!*result)
        return err->code;
    if (broken)
        recover(c, result);
    else if (report_files(c, result))
        cancelled = true;
    report_net(c, result);
    uint64_t h = hash2(*code, *result);
    *step = cancelled ? STEP_CANCELLED : STEP_RAN;
    for (size_t i = 0; i < *nseen; i++)
        if (seen[i] == h && !cancelled)
            *step = STEP_REPEATED;
    if (*nseen < seen_cap)
        seen[(*nseen)++] = h;
    if (ckpt)
        append(result, "[checkpoint %u was taken before this run]", ckpt);
    return 0;
}

/* Restores a checkpoint and says what was undone, for the user and the model. */
static char *do_rollback(al_chat *c, const char *id_or_name, al_error *err)
{
    al_checkpoint_info ci = AL_CHECKPOINT_INFO_INIT;
    int r = al_checkpoint_find(c->session, id_or_name, &ci, err);
    if (r < 0)
        return NULL;
    r = al_checkpoint_rollback(c->session, ci.id, err);
    if (r < 0)
        return NULL;
    const char *code = al_chat_checkpoint_code(c, ci.id);
    char *text = NULL;
    if (asprintf(&text,
                 "Rolled the VM back to checkpoint %u%s%s%s: files, processes and interpreter "
                 "state are as they were then; everything later runs did is undone.",
                 ci.id, *code ? " (taken before: " : "", code, *code ? ")" : "") < 0)
        return al_err(err, -ENOMEM, "out of memory"), NULL;
    notice(c, "%s", text);
    return text;
}

int al_chat_rollback(al_chat *c, const char *id_or_name, al_error *err)
{
    char *text = do_rollback(c, id_or_name, err);
    if (!text)
        return err->code;
    /* The model learns it with the next message. */
    char *note = NULL;
    if (asprintf(&note, "[Airlock, at the user's request: %s]", text) >= 0) {
        cJSON *m = user_msg(note);
        cJSON_AddStringToObject(m, "kind", "note");
        add_message(c, m);
    }
    free(note);
    free(text);
    return 0;
}

int al_chat_undo_vm(al_chat *c, bool *rolled_back, al_error *err)
{
    *rolled_back = false;
    cJSON *u = last_user_turn(c);
    if (!u)
        return -ENOENT;
    cJSON *ck = cJSON_GetObjectItemCaseSensitive(u, "checkpoint");
    if (cJSON_IsNumber(ck) && c->cfg.checkpoint != AL_CHECKPOINT_NEVER) {
        int r = al_checkpoint_rollback(c->session, (uint32_t)ck->valuedouble, err);
        if (r < 0)
            return r;
        *rolled_back = true;
    }
    return al_chat_undo(c);
}

/* The repeats a turn looks out for: a hash of each code run with its result. */
struct seen_runs {
    uint64_t h[64];
    size_t n;
};

#define _cleanup_reply_ __attribute__((cleanup(al_model_reply_free)))

/* Whether a limit stops the turn before the next model reply (noticed, *outcome set). */
static bool turn_limit_reached(al_chat *c, unsigned turn, enum al_chat_outcome *outcome)
{
    if (turn >= c->cfg.max_turns) {
        notice(c, "stopped after %u model replies (--max-turns)", c->cfg.max_turns);
        *outcome = AL_CHAT_MAX_TURNS;
        return true;
    }
    if (c->cfg.token_budget && c->input_tokens + c->output_tokens >= c->cfg.token_budget) {
        notice(c, "the session's token budget (%llu) is spent",
               (unsigned long long)c->cfg.token_budget);
        *outcome = AL_CHAT_BUDGET;
        return true;
    }
    return false;
}

/* One tool call of a reply, answered with its result message. */
static int tool_call_step(al_chat *c, const al_tool_call *call, struct seen_runs *seen,
                          enum step *step, bool *ran, al_error *err)
{
    _cleanup_free_ char *result = NULL;
    _cleanup_cjson_ cJSON *extra = cJSON_CreateObject();
    bool native = call->kind && !strcmp(call->kind, "computer_call") && c->cfg.computer;
    if (!extra)
        return al_err(err, -ENOMEM, "out of memory");
    if (*step != STEP_RAN) {
        result = strdup("Not run: an earlier call in this reply was stopped.");
        cJSON_AddTrueToObject(extra, "is_error");
    } else if (native) {
        result = openai_computer_call(c, call, step, extra);
        *ran = true;
    } else if (call->name && !strcmp(call->name, "rollback") &&
               c->cfg.checkpoint != AL_CHECKPOINT_NEVER) {
        result = rollback_call(c, call);
        *ran = true;
    } else if (call->name && !strcmp(call->name, "computer") && c->cfg.computer) {
        result = computer_call(c, call, step);
        *ran = true;
    } else {
        _cleanup_free_ char *lang = NULL, *code = NULL;
        char *why;
        *ran = true;
        if (parse_call(c, call, &lang, &code, &why) < 0) {
            notice(c, "the model's tool call was not usable: %s", why ? why : "?");
            result = why;
        } else {
            int r = one_run(c, lang, &code, seen->h, &seen->n, 64, &result, step, err);
            if (r < 0)
                return r;
        }
    }
    cJSON *m = tool_result(call, result ? result : "");
    if (m && call->kind) {
        /* OpenAI's computer call is answered with a screenshot, whatever became of it. */
        al_error se = {0};
        if (native && !c->images && computer_shot(c, &se) < 0) {
            cJSON_DeleteItemFromObject(extra, "is_error");
            cJSON_AddTrueToObject(extra, "is_error");
        }
        cJSON_AddStringToObject(m, "kind", call->kind);
        for (cJSON *x = extra->child; x; x = x->next)
            cJSON_AddItemToObject(m, x->string, cJSON_Duplicate(x, true));
    }
    add_message(c, with_images(c, m));
    return 0;
}

/* A reply's tool calls: every call gets a result, even those not run, or the API rejects the
 * history. */
static int tool_calls_step(al_chat *c, const al_model_reply *reply, struct seen_runs *seen,
                           enum step *step, bool *ran, al_error *err)
{
    for (size_t i = 0; i < reply->ncalls; i++) {
        int r = tool_call_step(c, &reply->calls[i], seen, step, ran, err);
        if (r < 0)
            return r;
    }
    return 0;
}

/* A reply's first fenced code block, if any, run and its output sent back as a user message. */
static int fenced_step(al_chat *c, const char *text, struct seen_runs *seen, enum step *step,
                       bool *ran, al_error *err)
{
    _cleanup_free_ char *lang = NULL, *code = NULL, *result = NULL, *msg = NULL;
    if (al_fence_first(text, &lang, &code) != 1)
        return 0;
    const char *cl = canonical_lang(c->langs, *lang ? lang : "sh");
    if (!cl) {
        if (asprintf(&result, "error: unknown language '%.64s'; available: %s", lang, c->langs) < 0)
            result = NULL;
    } else {
        int r = one_run(c, cl, &code, seen->h, &seen->n, 64, &result, step, err);
        if (r < 0)
            return r;
    }
    if (asprintf(&msg, "Output of the code:\n```\n%s\n```", result ? result : "") < 0)
        msg = NULL;
    cJSON *om = with_images(c, user_msg(msg ? msg : ""));
    cJSON_AddStringToObject(om, "kind", "run-output");
    add_message(c, om);
    *ran = true;
    return 0;
}

/* How a turn ends after a reply whose code ran with this step; false to go on. */
static bool step_ends_turn(al_chat *c, enum step step, enum al_chat_outcome *outcome)
{
    switch (step) {
    case STEP_RAN:
        return false;
    case STEP_DECLINED:
        *outcome = AL_CHAT_DECLINED;
        return true;
    case STEP_CANCELLED:
        *outcome = AL_CHAT_CANCELLED;
        return true;
    case STEP_REPEATED:
        notice(c, "stopped: the model ran the same code again with the same result");
        *outcome = AL_CHAT_REPEATED;
        return true;
    }
    return false;
}

int al_chat_turn(al_chat *c, const char *user_text, enum al_chat_outcome *outcome, al_error *err)
{
    add_message(c, user_msg(user_text));
    struct seen_runs seen = {.n = 0};
    for (unsigned turn = 0;; turn++) {
        if (turn_limit_reached(c, turn, outcome))
            return 0;
        _cleanup_reply_ al_model_reply reply = {0};
        int r = ask_model(c, &reply, err);
        if (r == -ECANCELED) {
            *outcome = AL_CHAT_CANCELLED;
            memset(err, 0, sizeof(*err));
            return 0;
        }
        if (r < 0)
            return r;
        cJSON *am = al_model_reply_message(&reply);
        if (!am)
            return al_err(err, -ENOMEM, "out of memory");
        add_message(c, am);

        enum step step = STEP_RAN;
        bool ran = false;
        r = c->cfg.tools ? tool_calls_step(c, &reply, &seen, &step, &ran, err)
                         : fenced_step(c, reply.text, &seen, &step, &ran, err);
        if (r < 0)
            return r;
        if (!ran) {
            *outcome = AL_CHAT_DONE;
            return 0;
        }
        if (step_ends_turn(c, step, outcome))
            return 0;
    }
}

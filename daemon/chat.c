/* The chat API: a user message drives the library's chat loop (orchestrator/chat) in the
 * session's VM (and, in a session with a display, its screen: the computer tool) as a run of its
 * own, so that its events (model text, code, live output, the end
 * of each run, notices) use the same numbered buffer, SSE stream, Last-Event-ID replay and
 * signal route as any run. No chat logic here: the loop's UI callbacks become events.
 *
 * The model endpoint and its key come from the config (the key from an environment variable,
 * read when the first turn starts); a request may name another model, never another endpoint,
 * so that the key is only ever sent where the operator pointed it. */
#include "airlockd.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "chat.h"

struct ad_chat {
    al_chat c;
    bool ready; /* c initialised */
    bool busy;  /* a turn is running */
    char model[128];
    /* what replaces the built-in system prompt, what is appended to it (c.cfg's point here) */
    char *system_message, *instructions;
    char *key;
    struct ad_session *s;
    struct ad_run *run; /* the turn's, while busy */
    bool auto_run;      /* this turn's */
    char *pending;      /* the user message, handed to the turn's thread */
    /* without auto_run: a code block waits for POST .../chat/confirm */
    bool asking;
    int answer;   /* -1 none yet, 0 skip, 1 run */
    char *edited; /* the code to run instead, or NULL */
};

static pthread_cond_t chat_cv = PTHREAD_COND_INITIALIZER;

/* The chat states of every session: busy and ready change under this. */
static pthread_mutex_t chat_lock = PTHREAD_MUTEX_INITIALIZER;

/* Every string of an event is valid UTF-8 (the guest's bytes in a file name, the model's in its
 * text): a bad byte is U+FFFD. */
static void ev_str(struct ad_chat *ch, const char *type, const char *k, const char *v, size_t n)
{
    cJSON *o = cJSON_CreateObject();
    char *t = al_utf8_repair((const uint8_t *)v, n, NULL);
    cJSON_AddStringToObject(o, k, t ? t : "");
    free(t);
    ad_run_push(ch->run, type, o);
    cJSON_Delete(o);
}

static void ui_thinking(void *ctx, bool on)
{
    struct ad_chat *ch = ctx;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "on", on);
    ad_run_push(ch->run, "thinking", o);
    cJSON_Delete(o);
}

static void ui_text(void *ctx, const char *s, size_t n)
{
    ev_str(ctx, "text", "text", s, n);
}

static void ui_text_end(void *ctx)
{
    struct ad_chat *ch = ctx;
    cJSON *o = cJSON_CreateObject();
    ad_run_push(ch->run, "text_end", o);
    cJSON_Delete(o);
}

static void ui_code(void *ctx, const char *lang, const char *code)
{
    struct ad_chat *ch = ctx;
    cJSON *o = cJSON_CreateObject();
    ad_json_add_text(o, "language", lang ? lang : "");
    ad_json_add_text(o, "code", code ? code : "");
    ad_run_push(ch->run, "code", o);
    cJSON_Delete(o);
}

/* Without auto_run: a "confirm" event, then the answer of POST .../chat/confirm. Stop (a byte
 * in the cancel pipe, left there for the loop to see), the session's end or the daemon's end
 * answer "skip". */
static int ui_confirm(void *ctx, const char *lang, char **code)
{
    struct ad_chat *ch = ctx;
    cJSON *o = cJSON_CreateObject();
    ad_json_add_text(o, "language", lang ? lang : "");
    ad_json_add_text(o, "code", *code ? *code : "");
    pthread_mutex_lock(&chat_lock);
    ch->asking = true;
    ch->answer = -1;
    pthread_mutex_unlock(&chat_lock);
    ad_run_push(ch->run, "confirm", o);
    cJSON_Delete(o);
    pthread_mutex_lock(&chat_lock);
    while (ch->answer < 0) {
        struct pollfd p = {ch->s->cancel_rd, POLLIN, 0};
        if (poll(&p, 1, 0) > 0 || ad_run_cancelled(ch->run))
            break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&chat_cv, &chat_lock, &ts);
    }
    int answer = ch->answer > 0;
    ch->asking = false;
    if (answer && ch->edited) {
        free(*code);
        *code = ch->edited;
        ch->edited = NULL;
    }
    free(ch->edited);
    ch->edited = NULL;
    pthread_mutex_unlock(&chat_lock);
    return answer;
}

/* A safety check the model's vendor attached to a computer action (OpenAI's): a "confirm"
 * event of language "safety_check" whose code is "CODE: MESSAGE", asked auto_run or not; only
 * POST .../chat/confirm {"run": true} acknowledges it. */
static int ui_acknowledge(void *ctx, const char *code, const char *message)
{
    _cleanup_free_ char *text = NULL;
    if (asprintf(&text, "%s: %s", code, message) < 0)
        return 0;
    return ui_confirm(ctx, "safety_check", &text);
}

int ad_chat_confirm(struct ad_session *s, bool run, const char *code, struct ad_fail *f)
{
    pthread_mutex_lock(&chat_lock);
    struct ad_chat *ch = s->chat;
    if (!ch || !ch->asking || ch->answer >= 0) {
        pthread_mutex_unlock(&chat_lock);
        ad_failf(f, 409, "not_asking", "no code block waits for an answer");
        return -ENOENT;
    }
    free(ch->edited);
    ch->edited = code ? strdup(code) : NULL;
    ch->answer = run ? 1 : 0;
    pthread_cond_broadcast(&chat_cv);
    pthread_mutex_unlock(&chat_lock);
    return 0;
}

static int ui_output(void *ctx, int stream, const uint8_t *data, size_t n)
{
    struct ad_chat *ch = ctx;
    return ad_run_output(ch->run, stream, data, n);
}

static void ui_run_end(void *ctx, const al_exec_result *r, const char *summary)
{
    struct ad_chat *ch = ctx;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "how", r->how == AL_EXEC_SIGNALED ? "signaled" : "exited");
    cJSON_AddNumberToObject(o, "value", r->value);
    cJSON_AddBoolToObject(o, "timed_out", r->timed_out);
    cJSON_AddBoolToObject(o, "interrupted", r->interrupted);
    cJSON_AddStringToObject(o, "summary", summary ? summary : "");
    if (ch->c.nckpts)
        cJSON_AddNumberToObject(o, "checkpoint", ch->c.ckpts[ch->c.nckpts - 1].id);
    ad_run_push(ch->run, "run_end", o);
    cJSON_Delete(o);
}

/* Each result of a code run (values, display()s, figures, errors) as the run's "result" event,
 * as for a kernel run of the runs API: the page shows figures from it, so that the daemon never
 * writes them to a file of its own. */
static void ui_result(void *ctx, const al_result *r)
{
    struct ad_chat *ch = ctx;
    ad_run_result(ch->run, r);
}

#define FILES_NOTICE "files written by the run:\n"

static void ui_notice(void *ctx, const char *msg)
{
    struct ad_chat *ch = ctx;
    ev_str(ch, "notice", "message", msg, strlen(msg));
    /* The files a run wrote (the loop lists plain guest paths only): as a list too, so that a
     * client can fetch the figures among them through the files API. */
    if (strncmp(msg, FILES_NOTICE, strlen(FILES_NOTICE)))
        return;
    cJSON *o = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(o, "paths");
    /* A name that is not UTF-8: U+FFFD for each bad byte in paths, its exact bytes in base64 at
     * the same place of paths_b64 (null for the others), as the files API gives names. */
    cJSON *b = cJSON_CreateArray();
    bool any_lossy = false;
    char *copy = strdup(msg + strlen(FILES_NOTICE));
    for (char *save = NULL, *l = copy ? strtok_r(copy, "\n", &save) : NULL; l;
         l = strtok_r(NULL, "\n", &save)) {
        if (l[0] != '/')
            continue;
        bool lossy = false;
        char *text = al_utf8_repair((const uint8_t *)l, strlen(l), &lossy);
        cJSON_AddItemToArray(a, cJSON_CreateString(text ? text : ""));
        free(text);
        char *b64 = lossy ? ad_base64(l, strlen(l)) : NULL;
        cJSON_AddItemToArray(b, b64 ? cJSON_CreateString(b64) : cJSON_CreateNull());
        free(b64);
        any_lossy |= lossy;
    }
    free(copy);
    if (any_lossy)
        cJSON_AddItemToObject(o, "paths_b64", b);
    else
        cJSON_Delete(b);
    ad_run_push(ch->run, "files", o);
    cJSON_Delete(o);
}

static const char *turn_body(struct ad_run *r, void *ctx, cJSON *end)
{
    struct ad_chat *ch = ctx;
    pthread_mutex_lock(&chat_lock);
    ch->run = r;
    char *msg = ch->pending;
    ch->pending = NULL;
    pthread_mutex_unlock(&chat_lock);
    enum al_chat_outcome oc = AL_CHAT_DONE;
    al_error err = {0};
    int rc = msg ? al_chat_turn(&ch->c, msg, &oc, &err) : -ENOMEM;
    free(msg);
    const char *type = "done";
    if (rc < 0) {
        type = "error";
        cJSON_AddStringToObject(end, "code", rc == -ECANCELED ? "cancelled" : "chat_failed");
        cJSON_AddStringToObject(end, "message", err.code ? err.msg : strerror(-rc));
    } else {
        cJSON_AddStringToObject(end, "outcome", al_chat_outcome_str(oc));
    }
    pthread_mutex_lock(&chat_lock);
    ch->busy = false;
    ch->run = NULL;
    pthread_mutex_unlock(&chat_lock);
    return type;
}

static int chat_ready(struct ad_session *s, struct ad_fail *f)
{
    if (!s->chat) {
        s->chat = calloc(1, sizeof(*s->chat));
        if (!s->chat) {
            ad_failf(f, 500, "internal", "out of memory");
            return -ENOMEM;
        }
    }
    struct ad_chat *ch = s->chat;
    if (ch->ready)
        return 0;
    if (!ad_cfg.model_api_base[0] || !ad_cfg.model[0]) {
        ad_failf(f, 501, "no_model", "this daemon has no model configured (model_api_base, model)");
        return -ENOTSUP;
    }
    const char *key = ad_cfg.model_api_key_env[0] ? getenv(ad_cfg.model_api_key_env) : NULL;
    free(ch->key);
    ch->key = key ? strdup(key) : NULL;
    ch->s = s;
    al_chat_cfg cfg = {
        .model =
            {
                .api = !strcmp(ad_cfg.model_api, "anthropic")   ? AL_API_ANTHROPIC
                       : !strcmp(ad_cfg.model_api, "responses") ? AL_API_RESPONSES
                                                                : AL_API_OPENAI,
                .api_base = ad_cfg.model_api_base,
                .api_key = ch->key,
                .model = ch->model,
                .cancel_fd = s->cancel_rd,
                .retries = 2,
            },
        .tools = ad_cfg.model_tools,
        .auto_run = true,
        .image = s->image,
        .checkpoint = s->checkpoints ? s->policy : AL_CHECKPOINT_NEVER,
        .results_to_ui = true,
        /* A session with a display (asked for, or the desktop image's): the model gets the
         * computer tool, each action a "code" event of language "computer" (and, without
         * auto_run, a "confirm" for it), its screenshot going back to the model; OpenAI's
         * safety checks a "confirm" of language "safety_check", auto_run or not. */
        .computer = s->display,
    };
    al_chat_ui ui = {
        .ctx = ch,
        .thinking = ui_thinking,
        .text = ui_text,
        .text_end = ui_text_end,
        .code = ui_code,
        .confirm = ui_confirm,
        .acknowledge = ui_acknowledge,
        .output = ui_output,
        .run_end = ui_run_end,
        .result = ui_result,
        .notice = ui_notice,
    };
    al_error err = {0};
    if (al_chat_init(&ch->c, &cfg, &ui, s->s, al_session_languages(s->s), &err) < 0) {
        ad_failf(f, 500, "internal", "chat: %s", err.msg);
        return -EIO;
    }
    ch->c.cancel_fd = s->cancel_rd;
    ch->ready = true;
    return 0;
}

static bool same_text(const char *a, const char *b)
{
    return !strcmp(a ? a : "", b ? b : "");
}

/* Under chat_lock, between turns: the system prompt made again when the system message that
 * replaces the built-in one or the instructions appended to it (NULL or "": none) changed. */
static int set_prompt(struct ad_chat *ch, const char *system_message, const char *instructions)
{
    if (same_text(ch->system_message, system_message) && same_text(ch->instructions, instructions))
        return 0;
    char *sm = system_message && system_message[0] ? strdup(system_message) : NULL;
    char *in = instructions && instructions[0] ? strdup(instructions) : NULL;
    if ((system_message && system_message[0] && !sm) || (instructions && instructions[0] && !in)) {
        free(sm);
        free(in);
        return -ENOMEM;
    }
    ch->c.cfg.system_message = sm;
    ch->c.cfg.instructions = in;
    char *sys = al_chat_system_prompt(&ch->c.cfg, ch->c.langs, ch->c.cfg.tools);
    if (!sys) {
        ch->c.cfg.system_message = ch->system_message;
        ch->c.cfg.instructions = ch->instructions;
        free(sm);
        free(in);
        return -ENOMEM;
    }
    free(ch->c.system);
    ch->c.system = sys;
    free(ch->system_message);
    free(ch->system_message);
    free(ch->instructions);
    ch->system_message = sm;
    ch->instructions = in;
    return 0;
}

int ad_chat_turn(struct ad_session *s, const struct ad_chat_req *q, const struct ad_limits *lim,
                 cJSON **out, struct ad_fail *f)
{
    if (!q->message || !q->message[0]) {
        ad_failf(f, 400, "invalid", "message: a non-empty string");
        return -EINVAL;
    }
    if (q->model && (!q->model[0] || strlen(q->model) >= sizeof(s->chat->model))) {
        ad_failf(f, 400, "invalid", "model: a model name");
        return -EINVAL;
    }
    pthread_mutex_lock(&chat_lock);
    int rc = chat_ready(s, f);
    if (rc < 0) {
        pthread_mutex_unlock(&chat_lock);
        return rc;
    }
    struct ad_chat *ch = s->chat;
    if (ch->busy) {
        pthread_mutex_unlock(&chat_lock);
        ad_failf(f, 409, "busy", "a chat turn of this session is running");
        return -EBUSY;
    }
    ch->busy = true;
    snprintf(ch->model, sizeof(ch->model), "%s", q->model ? q->model : ad_cfg.model);
    ch->c.cfg.model.temperature = q->temperature;
    ch->c.cfg.model.has_temperature = q->has_temperature;
    ch->c.cfg.model.max_tokens = q->max_tokens;
    ch->c.cfg.context_window = q->context_window;
    ch->c.cfg.max_output = !q->max_output                           ? AL_CHAT_MAX_OUTPUT_DEFAULT
                           : q->max_output < AL_CHAT_MAX_OUTPUT_MIN ? AL_CHAT_MAX_OUTPUT_MIN
                                                                    : q->max_output;
    if (set_prompt(ch, q->system_message, q->instructions) < 0) {
        ch->busy = false;
        pthread_mutex_unlock(&chat_lock);
        ad_failf(f, 500, "internal", "out of memory");
        return -ENOMEM;
    }
    ch->auto_run = q->auto_run;
    ch->c.cfg.auto_run = q->auto_run; /* read by the loop only while a turn runs */
    /* each code run of the turn is bounded as an exec of this owner's would be */
    ch->c.cfg.run_timeout_s = lim->max_exec_timeout_s;
    free(ch->pending);
    ch->pending = strdup(q->message);
    pthread_mutex_unlock(&chat_lock);
    struct ad_exec_req er = {.body = turn_body, .body_ctx = ch};
    rc = ad_run_start(s, &er, lim, out, f);
    if (rc < 0) {
        pthread_mutex_lock(&chat_lock);
        ch->busy = false;
        pthread_mutex_unlock(&chat_lock);
    }
    return rc;
}

int ad_chat_undo(struct ad_session *s, cJSON **out, struct ad_fail *f)
{
    pthread_mutex_lock(&chat_lock);
    struct ad_chat *ch = s->chat;
    if (!ch || !ch->ready) {
        pthread_mutex_unlock(&chat_lock);
        ad_failf(f, 409, "nothing_to_undo", "no chat exchange to undo");
        return -ENOENT;
    }
    if (ch->busy) {
        pthread_mutex_unlock(&chat_lock);
        ad_failf(f, 409, "busy", "a chat turn of this session is running");
        return -EBUSY;
    }
    ch->busy = true;
    pthread_mutex_unlock(&chat_lock);
    bool rolled = false;
    al_error err = {0};
    int rc = al_chat_undo_vm(&ch->c, &rolled, &err);
    pthread_mutex_lock(&chat_lock);
    ch->busy = false;
    pthread_mutex_unlock(&chat_lock);
    if (rc == -ENOENT) {
        ad_failf(f, 409, "nothing_to_undo", "no chat exchange to undo");
        return rc;
    }
    if (rc < 0) {
        ad_fail_from(f, rc, &err);
        return rc;
    }
    *out = cJSON_CreateObject();
    cJSON_AddBoolToObject(*out, "rolled_back", rolled);
    return 0;
}

cJSON *ad_chat_json(struct ad_session *s)
{
    cJSON *o = cJSON_CreateObject();
    pthread_mutex_lock(&chat_lock);
    struct ad_chat *ch = s->chat;
    cJSON_AddBoolToObject(o, "busy", ch && ch->busy);
    cJSON_AddBoolToObject(o, "model_configured", ad_cfg.model_api_base[0] && ad_cfg.model[0]);
    /* the history is only read between turns (a running turn changes it) */
    if (ch && ch->ready && !ch->busy) {
        cJSON_AddItemToObject(o, "messages", cJSON_Duplicate(ch->c.messages, true));
        cJSON *a = cJSON_AddArrayToObject(o, "checkpoints");
        for (unsigned i = 0; i < ch->c.nckpts; i++) {
            cJSON *x = cJSON_CreateObject();
            cJSON_AddNumberToObject(x, "id", ch->c.ckpts[i].id);
            cJSON_AddStringToObject(x, "code", ch->c.ckpts[i].code);
            cJSON_AddItemToArray(a, x);
        }
    } else {
        cJSON_AddArrayToObject(o, "messages");
        cJSON_AddArrayToObject(o, "checkpoints");
    }
    pthread_mutex_unlock(&chat_lock);
    return o;
}

int ad_chat_restore(struct ad_session *s, const cJSON *lmc, struct ad_fail *f)
{
    if (!cJSON_IsArray(lmc)) {
        ad_failf(f, 400, "invalid", "messages: a list of LMC messages");
        return -EINVAL;
    }
    char why[160] = "";
    cJSON *conv = al_chat_from_lmc(lmc, why, sizeof(why));
    if (!conv) {
        ad_failf(f, 400, "invalid", "messages: %s", why[0] ? why : "out of memory");
        return -EINVAL;
    }
    pthread_mutex_lock(&chat_lock);
    int rc = chat_ready(s, f);
    if (rc == 0 && s->chat->busy) {
        ad_failf(f, 409, "busy", "a chat turn of this session is running");
        rc = -EBUSY;
    }
    if (rc == 0) {
        cJSON_Delete(s->chat->c.messages);
        s->chat->c.messages = conv;
        conv = NULL;
    }
    pthread_mutex_unlock(&chat_lock);
    cJSON_Delete(conv);
    return rc;
}

void ad_chat_free(struct ad_session *s)
{
    struct ad_chat *ch = s->chat;
    if (!ch)
        return;
    if (ch->ready)
        al_chat_free(&ch->c);
    free(ch->key);
    free(ch->system_message);
    free(ch->instructions);
    free(ch->pending);
    free(ch->edited);
    free(ch);
    s->chat = NULL;
}

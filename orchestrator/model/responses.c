/* OpenAI's Responses API: the request body from the neutral conversation (instructions, then
 * input items: messages, function calls and their outputs, computer calls and their screenshots,
 * and the output items of earlier replies as they came), and the streamed events into a reply. */
#include "model-internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* Output items in one reply: a message, reasoning and the calls; more is a broken stream. */
#define RESPONSES_ITEMS_MAX (AL_MODEL_CALLS_MAX + 16)

static bool is_kind(const cJSON *o, const char *kind)
{
    const char *k = al_json_str(o, "kind");
    return k && !strcmp(k, kind);
}

static bool add_to(cJSON *arr, cJSON *item)
{
    if (item && cJSON_AddItemToArray(arr, item))
        return true;
    cJSON_Delete(item);
    return false;
}

/* The first image of a neutral "images" list, as a data: URL; NULL when there is none. */
static char *image_url(const cJSON *img)
{
    const char *type = al_json_str(img, "media_type"), *data = al_json_str(img, "data");
    char *url = NULL;
    if (type && data && asprintf(&url, "data:%s;base64,%s", type, data) < 0)
        url = NULL;
    return url;
}

/* Text and images as input content parts. */
static cJSON *parts(const char *text, const cJSON *images)
{
    _cleanup_cjson_ cJSON *ps = cJSON_CreateArray();
    if (!ps)
        return NULL;
    if (text && *text) {
        cJSON *t = cJSON_CreateObject();
        if (!add_to(ps, t) || !cJSON_AddStringToObject(t, "type", "input_text") ||
            !cJSON_AddStringToObject(t, "text", text))
            return NULL;
    }
    const cJSON *img;
    cJSON_ArrayForEach(img, images)
    {
        _cleanup_free_ char *url = image_url(img);
        if (!url)
            continue;
        cJSON *p = cJSON_CreateObject();
        if (!add_to(ps, p) || !cJSON_AddStringToObject(p, "type", "input_image") ||
            !cJSON_AddStringToObject(p, "image_url", url))
            return NULL;
    }
    return TAKE_PTR(ps);
}

/* A user or assistant message: its text, with its images as parts. */
static bool add_message(cJSON *input, const char *role, const cJSON *m)
{
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
    const cJSON *images = cJSON_GetObjectItemCaseSensitive(m, "images");
    const char *text = cJSON_IsString(c) ? c->valuestring : "";
    cJSON *content;
    if (c && !cJSON_IsString(c) && !cJSON_IsNull(c))
        content = cJSON_Duplicate(c, true); /* parts the caller made */
    else if (cJSON_GetArraySize(images) > 0 && strcmp(role, "assistant") != 0)
        content = parts(text, images);
    else if (*text)
        content = cJSON_CreateString(text);
    else
        return true; /* an empty message is refused */
    cJSON *o = cJSON_CreateObject();
    if (!add_to(input, o) || !cJSON_AddStringToObject(o, "role", role)) {
        cJSON_Delete(content);
        return false;
    }
    return cJSON_AddItemToObject(o, "content", content);
}

/* The calls of an assistant message whose output items were not kept, rebuilt. */
static bool add_calls(cJSON *input, const cJSON *calls)
{
    const cJSON *call;
    cJSON_ArrayForEach(call, calls)
    {
        const char *id = al_json_str(call, "id"), *name = al_json_str(call, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(call, "arguments");
        cJSON *o = cJSON_CreateObject();
        if (!add_to(input, o) || !cJSON_AddStringToObject(o, "call_id", id ? id : ""))
            return false;
        if (is_kind(call, "computer_call")) {
            static const char *const keep[] = {"actions", "action", "pending_safety_checks"};
            if (!cJSON_AddStringToObject(o, "type", "computer_call") ||
                !cJSON_AddStringToObject(o, "id", id ? id : "") ||
                !cJSON_AddStringToObject(o, "status", "completed"))
                return false;
            for (size_t i = 0; i < sizeof(keep) / sizeof(keep[0]); i++) {
                const cJSON *v = cJSON_GetObjectItemCaseSensitive(args, keep[i]);
                cJSON *d = v ? cJSON_Duplicate(v, true) : i == 2 ? cJSON_CreateArray() : NULL;
                if ((v || i == 2) && (!d || !cJSON_AddItemToObject(o, keep[i], d)))
                    return cJSON_Delete(d), false;
            }
            continue;
        }
        _cleanup_free_ char *text = al_model_args_text(args);
        if (!text || !cJSON_AddStringToObject(o, "type", "function_call") ||
            !cJSON_AddStringToObject(o, "name", name ? name : "") ||
            !cJSON_AddStringToObject(o, "arguments", text))
            return false;
    }
    return true;
}

/* An assistant message: its output items as they came, else rebuilt from its text and calls. */
static bool add_assistant(cJSON *input, const cJSON *m)
{
    const cJSON *kept = cJSON_GetObjectItemCaseSensitive(m, "responses_output"), *item;
    if (cJSON_GetArraySize(kept) > 0) {
        cJSON_ArrayForEach(item, kept)
        {
            if (!add_to(input, cJSON_Duplicate(item, true)))
                return false;
        }
        return true;
    }
    return add_message(input, "assistant", m) &&
           add_calls(input, cJSON_GetObjectItemCaseSensitive(m, "tool_calls"));
}

/* A tool result; what the model must read besides a screenshot goes into notes. */
static bool add_tool(cJSON *input, const cJSON *m, struct al_buf *notes)
{
    const char *id = al_json_str(m, "tool_call_id");
    const char *text = al_json_str(m, "content");
    const cJSON *images = cJSON_GetObjectItemCaseSensitive(m, "images");
    cJSON *o = cJSON_CreateObject(), *out;
    if (!o)
        return false;
    if (is_kind(m, "computer_call")) {
        _cleanup_free_ char *url = image_url(cJSON_GetArrayItem(images, 0));
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "is_error")) || !url) {
            char line[64];
            snprintf(line, sizeof(line), "%sThe computer call %.32s: ", notes->len ? "\n" : "",
                     id ? id : "");
            if (al_buf_add(notes, line, strlen(line)) < 0 ||
                al_buf_add(notes, text ? text : "", text ? strlen(text) : 0) < 0)
                return cJSON_Delete(o), false;
        }
        if (!url) /* no screenshot to answer with: the note is all */
            return cJSON_Delete(o), true;
        const cJSON *acks = cJSON_GetObjectItemCaseSensitive(m, "acknowledged_safety_checks");
        if (!add_to(input, o) || !cJSON_AddStringToObject(o, "type", "computer_call_output") ||
            !cJSON_AddStringToObject(o, "call_id", id ? id : "") ||
            !(out = cJSON_AddObjectToObject(o, "output")) ||
            !cJSON_AddStringToObject(out, "type", "computer_screenshot") ||
            !cJSON_AddStringToObject(out, "image_url", url))
            return false;
        return cJSON_GetArraySize(acks) == 0 ||
               cJSON_AddItemToObject(o, "acknowledged_safety_checks", cJSON_Duplicate(acks, true));
    }
    out =
        cJSON_GetArraySize(images) > 0 ? parts(text, images) : cJSON_CreateString(text ? text : "");
    if (!add_to(input, o) || !out || !cJSON_AddItemToObject(o, "output", out)) {
        cJSON_Delete(out);
        return false;
    }
    return cJSON_AddStringToObject(o, "type", "function_call_output") &&
           cJSON_AddStringToObject(o, "call_id", id ? id : "");
}

/* The notes of the tool results just added, as one user message after them. */
static bool flush_notes(cJSON *input, struct al_buf *notes)
{
    if (!notes->len)
        return true;
    cJSON *o = cJSON_CreateObject();
    bool ok = add_to(input, o) && cJSON_AddStringToObject(o, "role", "user") &&
              cJSON_AddStringToObject(o, "content", notes->p);
    notes->len = 0;
    return ok;
}

static bool has_preview_tool(const cJSON *tools)
{
    const cJSON *t;
    cJSON_ArrayForEach(t, tools)
    {
        const char *type = al_json_str(cJSON_GetObjectItemCaseSensitive(t, "openai"), "type");
        if (type && !strcmp(type, "computer_use_preview"))
            return true;
    }
    return false;
}

int al_responses_body(const al_model_cfg *cfg, const cJSON *messages, const cJSON *tools,
                      char **out, al_error *err)
{
    _cleanup_cjson_ cJSON *b = cJSON_CreateObject();
    cJSON *input;
    if (!b || !cJSON_AddStringToObject(b, "model", cfg->model) ||
        !(input = cJSON_AddArrayToObject(b, "input")) || !cJSON_AddTrueToObject(b, "stream"))
        return al_err(err, -ENOMEM, "out of memory for the model request");
    struct al_buf system = {0}, notes = {0};
    bool ok = true;
    const cJSON *m;
    cJSON_ArrayForEach(m, messages)
    {
        const char *role = al_json_str(m, "role");
        if (!role) {
            al_buf_free(&system), al_buf_free(&notes);
            return al_err(err, -EINVAL, "a conversation message has no role");
        }
        if (strcmp(role, "tool") != 0)
            ok = ok && flush_notes(input, &notes);
        if (!strcmp(role, "system")) {
            const char *c = al_json_str(m, "content");
            if (c && *c)
                ok = ok && (!system.len || al_buf_add(&system, "\n\n", 2) == 0) &&
                     al_buf_add(&system, c, strlen(c)) == 0;
        } else if (!strcmp(role, "user")) {
            ok = ok && add_message(input, "user", m);
        } else if (!strcmp(role, "assistant")) {
            ok = ok && add_assistant(input, m);
        } else if (!strcmp(role, "tool")) {
            ok = ok && add_tool(input, m, &notes);
        } else {
            al_buf_free(&system), al_buf_free(&notes);
            return al_err(err, -EINVAL, "a conversation message has an unknown role '%.32s'", role);
        }
    }
    ok = ok && flush_notes(input, &notes);
    ok = ok && (!system.len || cJSON_AddStringToObject(b, "instructions", system.p));
    al_buf_free(&system), al_buf_free(&notes);
    if (ok && cfg->max_tokens)
        ok = cJSON_AddNumberToObject(b, "max_output_tokens", cfg->max_tokens);
    /* The preview computer model refuses requests without it. */
    if (ok && has_preview_tool(tools))
        ok = cJSON_AddStringToObject(b, "truncation", "auto");
    if (!ok)
        return al_err(err, -ENOMEM, "out of memory for the model request");
    int r = al_model_body_tools(b, AL_API_RESPONSES, tools, err);
    if (r < 0)
        return r;
    return al_model_body_finish(b, cfg, out, err);
}

/* ---- the reply ---- */

/* The output index an event names. */
static int output_index(struct al_model_acc *a, const cJSON *j, long *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "output_index");
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble < 1000000))
        return al_err(&a->err, -EPROTO, "the model's stream has a bad output index");
    *out = (long)v->valuedouble;
    return 0;
}

/* A computer call's arguments as the neutral conversation keeps them. */
static int computer_args(struct al_model_acc *a, struct al_acc_call *c, const cJSON *item)
{
    static const char *const keep[] = {"actions", "action", "pending_safety_checks"};
    _cleanup_cjson_ cJSON *args = cJSON_CreateObject();
    if (!args)
        return al_err(&a->err, -ENOMEM, "out of memory for the model's reply");
    for (size_t i = 0; i < sizeof(keep) / sizeof(keep[0]); i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(item, keep[i]);
        if (!v || (i == 2 && cJSON_GetArraySize(v) == 0))
            continue;
        if (!cJSON_AddItemToObject(args, keep[i], cJSON_Duplicate(v, true)))
            return al_err(&a->err, -ENOMEM, "out of memory for the model's reply");
    }
    c->args.len = 0;
    return al_model_acc_args_json(a, c, args);
}

/* An output item: a call begun (added) or whole (done); other items carry no call. */
static int item_call(struct al_model_acc *a, const cJSON *item, long key, bool done)
{
    const char *type = al_json_str(item, "type");
    bool computer = type && !strcmp(type, "computer_call");
    if (!type || (!computer && strcmp(type, "function_call") != 0))
        return 0;
    struct al_acc_call *c;
    int r = al_model_acc_call(a, key, true, &c);
    if (r < 0)
        return r;
    c->computer = computer;
    const char *id = al_json_str(item, "call_id");
    if (id && *id && !c->id.len && al_buf_add(&c->id, id, strlen(id)) < 0)
        return al_err(&a->err, -ENOMEM, "out of memory for the model's reply");
    if ((r = al_model_acc_call_name(a, c, computer ? "computer" : al_json_str(item, "name"))) < 0)
        return r;
    if (!done)
        return 0;
    if (computer)
        return computer_args(a, c, item);
    /* The arguments came in deltas; a server that sent none has them here. */
    const char *args = al_json_str(item, "arguments");
    return !c->args.len && args ? al_model_acc_args(a, c, args, strlen(args)) : 0;
}

/* A finished item kept for the next request, counted against the reply's bound. */
static int keep_item(struct al_model_acc *a, const cJSON *item)
{
    if (!cJSON_IsObject(item))
        return 0;
    if (!a->output && !(a->output = cJSON_CreateArray()))
        return al_err(&a->err, -ENOMEM, "out of memory for the model's reply");
    if (cJSON_GetArraySize(a->output) >= RESPONSES_ITEMS_MAX)
        return al_err(&a->err, -EPROTO, "the model's reply has more than %d output items",
                      RESPONSES_ITEMS_MAX);
    _cleanup_free_ char *s = cJSON_PrintUnformatted(item);
    int r = s ? al_model_acc_grow(a, strlen(s)) : -ENOMEM;
    if (r == -ENOMEM)
        return al_err(&a->err, -ENOMEM, "out of memory for the model's reply");
    if (r < 0)
        return r;
    return add_to(a->output, cJSON_Duplicate(item, true))
               ? 0
               : al_err(&a->err, -ENOMEM, "out of memory for the model's reply");
}

/* Items that came whole (a reply not streamed, or a stream that sent no item events): their
 * text, their calls, and the items kept. */
static int whole_items(struct al_model_acc *a, const cJSON *output, bool text)
{
    const cJSON *item;
    long key = 0;
    int r;
    cJSON_ArrayForEach(item, output)
    {
        const char *type = al_json_str(item, "type");
        const cJSON *part;
        if (text && type && !strcmp(type, "message")) {
            cJSON_ArrayForEach(part, cJSON_GetObjectItemCaseSensitive(item, "content"))
            {
                const char *t = al_json_str(part, "text");
                if (!t)
                    t = al_json_str(part, "refusal");
                if (t && (r = al_model_acc_text(a, t, strlen(t))) < 0)
                    return r;
            }
        }
        if ((r = item_call(a, item, key++, true)) < 0 || (r = keep_item(a, item)) < 0)
            return r;
    }
    return 0;
}

/* The end of a response: its usage, how it finished, and its items when none came before. */
static int finished(struct al_model_acc *a, const cJSON *resp, bool streamed)
{
    const cJSON *usage = cJSON_GetObjectItemCaseSensitive(resp, "usage");
    a->input_tokens = al_json_tokens(usage, "input_tokens");
    a->output_tokens = al_json_tokens(usage, "output_tokens");
    if (!a->output) {
        int r = whole_items(a, cJSON_GetObjectItemCaseSensitive(resp, "output"),
                            !streamed || !a->text.len);
        if (r < 0)
            return r;
    }
    const char *status = al_json_str(resp, "status");
    const char *why =
        al_json_str(cJSON_GetObjectItemCaseSensitive(resp, "incomplete_details"), "reason");
    if (status && !strcmp(status, "failed"))
        return al_model_server_error(
            a, al_json_str(cJSON_GetObjectItemCaseSensitive(resp, "error"), "message"));
    if (status && !strcmp(status, "incomplete"))
        al_model_acc_finish_reason(a, why && !strcmp(why, "max_output_tokens") ? "length"
                                      : why                                    ? why
                                                                               : "incomplete");
    else
        al_model_acc_finish_reason(a, a->ncalls ? "tool_calls" : "stop");
    a->done = true;
    return 0;
}

int al_responses_event(void *ctx, const char *event, const char *data, size_t len)
{
    struct al_model_acc *a = ctx;
    const char *type;
    _cleanup_cjson_ cJSON *j = al_model_event_parse(a, event, data, len, &type);
    if (!j)
        return a->err.code;
    long key;
    int r;
    if (!strcmp(type, "response.output_text.delta") || !strcmp(type, "response.refusal.delta")) {
        const char *t = al_json_str(j, "delta");
        return t ? al_model_acc_text(a, t, strlen(t)) : 0;
    }
    if (!strcmp(type, "response.output_item.added") || !strcmp(type, "response.output_item.done")) {
        bool done = !strcmp(type, "response.output_item.done");
        const cJSON *item = cJSON_GetObjectItemCaseSensitive(j, "item");
        if ((r = output_index(a, j, &key)) < 0 || (r = item_call(a, item, key, done)) < 0)
            return r;
        return done ? keep_item(a, item) : 0;
    }
    if (!strcmp(type, "response.function_call_arguments.delta")) {
        struct al_acc_call *c;
        const char *d = al_json_str(j, "delta");
        if ((r = output_index(a, j, &key)) < 0 || (r = al_model_acc_call(a, key, false, &c)) < 0)
            return r;
        return d ? al_model_acc_args(a, c, d, strlen(d)) : 0;
    }
    if (!strcmp(type, "response.completed") || !strcmp(type, "response.incomplete") ||
        !strcmp(type, "response.failed")) {
        r = finished(a, cJSON_GetObjectItemCaseSensitive(j, "response"), true);
        return r < 0 ? r : AL_SSE_DONE;
    }
    if (!strcmp(type, "error")) {
        const char *msg = al_json_str(j, "message");
        if (!msg)
            msg = al_json_str(cJSON_GetObjectItemCaseSensitive(j, "error"), "message");
        return al_model_server_error(a, msg);
    }
    return 0; /* created, in_progress, content parts, reasoning, and events added later */
}

int al_responses_response(struct al_model_acc *a, const char *body, size_t len)
{
    _cleanup_cjson_ cJSON *j = cJSON_ParseWithLength(body, len);
    if (!cJSON_IsObject(j))
        return al_model_bad_json(a, "reply", body, len);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    if (cJSON_IsObject(e))
        return al_model_server_error(a, al_json_str(e, "message"));
    return finished(a, j, false);
}

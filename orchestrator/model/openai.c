/* OpenAI-compatible Chat Completions (OpenAI, Ollama, llama.cpp, LM Studio, vLLM, OpenRouter):
 * the request body from the neutral conversation, and the streamed chunks into a reply. */
#include "model-internal.h"

#include <errno.h>
#include <string.h>

/* Content as the neutral message has it: a string, or whatever else the caller put there. */
static bool add_content(cJSON *to, const cJSON *from, bool null_when_empty)
{
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(from, "content");
    if (cJSON_IsString(c) && !(null_when_empty && !*c->valuestring))
        return cJSON_AddStringToObject(to, "content", c->valuestring);
    if (c && !cJSON_IsString(c) && !cJSON_IsNull(c))
        return cJSON_AddItemToObject(to, "content", cJSON_Duplicate(c, true));
    return null_when_empty ? cJSON_AddNullToObject(to, "content")
                           : cJSON_AddStringToObject(to, "content", "");
}

static cJSON *tool_calls(const cJSON *calls)
{
    _cleanup_cjson_ cJSON *out = cJSON_CreateArray();
    const cJSON *c;
    cJSON_ArrayForEach(c, calls)
    {
        cJSON *o = cJSON_CreateObject();
        if (!o || !cJSON_AddItemToArray(out, o))
            return cJSON_Delete(o), NULL;
        _cleanup_free_ char *args =
            al_model_args_text(cJSON_GetObjectItemCaseSensitive(c, "arguments"));
        const char *id = al_json_str(c, "id"), *name = al_json_str(c, "name");
        cJSON *fn;
        if (!args || !cJSON_AddStringToObject(o, "id", id ? id : "") ||
            !cJSON_AddStringToObject(o, "type", "function") ||
            !(fn = cJSON_AddObjectToObject(o, "function")) ||
            !cJSON_AddStringToObject(fn, "name", name ? name : "") ||
            !cJSON_AddStringToObject(fn, "arguments", args))
            return NULL;
    }
    return TAKE_PTR(out);
}

static cJSON *message(const cJSON *m, al_error *err)
{
    const char *role = al_json_str(m, "role");
    if (!role)
        return al_err(err, -EINVAL, "a conversation message has no role"), NULL;
    _cleanup_cjson_ cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    bool has_calls = cJSON_GetArraySize(calls) > 0;
    if (strcmp(role, "tool") == 0) {
        const char *id = al_json_str(m, "tool_call_id");
        if (!cJSON_AddStringToObject(o, "role", "tool") ||
            !cJSON_AddStringToObject(o, "tool_call_id", id ? id : "") || !add_content(o, m, false))
            return NULL;
    } else if (strcmp(role, "assistant") == 0) {
        /* With tool calls and no text, content is null, as OpenAI itself sends it. */
        if (!cJSON_AddStringToObject(o, "role", "assistant") || !add_content(o, m, has_calls))
            return NULL;
        cJSON *tc = has_calls ? tool_calls(calls) : NULL;
        if (has_calls && (!tc || !cJSON_AddItemToObject(o, "tool_calls", tc)))
            return cJSON_Delete(tc), NULL;
    } else if (strcmp(role, "system") == 0 || strcmp(role, "user") == 0) {
        if (!cJSON_AddStringToObject(o, "role", role) || !add_content(o, m, false))
            return NULL;
    } else {
        return al_err(err, -EINVAL, "a conversation message has an unknown role '%.32s'", role),
               NULL;
    }
    return TAKE_PTR(o);
}

/* A run's images (a message's "images": [{"media_type", "data"}]) as image_url parts of a
 * user message: tool messages carry text only, so the images follow the tool results of the
 * same reply, as a user message. */
static bool add_images(cJSON *parts, const cJSON *images)
{
    const cJSON *img;
    cJSON_ArrayForEach(img, images)
    {
        const char *type = al_json_str(img, "media_type"), *data = al_json_str(img, "data");
        if (!type || !data)
            continue;
        _cleanup_free_ char *url = NULL;
        if (asprintf(&url, "data:%s;base64,%s", type, data) < 0)
            return false;
        cJSON *p = cJSON_CreateObject(), *iu;
        if (!p || !cJSON_AddItemToArray(parts, p) ||
            !cJSON_AddStringToObject(p, "type", "image_url") ||
            !(iu = cJSON_AddObjectToObject(p, "image_url")) ||
            !cJSON_AddStringToObject(iu, "url", url))
            return false;
    }
    return true;
}

static bool flush_images(cJSON *msgs, cJSON **parts)
{
    if (!*parts)
        return true;
    cJSON *u = cJSON_CreateObject();
    bool ok = u && cJSON_AddItemToArray(msgs, u) && cJSON_AddStringToObject(u, "role", "user") &&
              cJSON_AddItemToObject(u, "content", *parts);
    if (!ok && !u)
        cJSON_Delete(*parts);
    *parts = NULL;
    return ok;
}

static cJSON *image_parts(const char *intro)
{
    cJSON *parts = cJSON_CreateArray(), *t = cJSON_CreateObject();
    if (!parts || !t || !cJSON_AddItemToArray(parts, t) ||
        !cJSON_AddStringToObject(t, "type", "text") || !cJSON_AddStringToObject(t, "text", intro)) {
        cJSON_Delete(parts);
        return NULL;
    }
    return parts;
}

int al_openai_body(const al_model_cfg *cfg, const cJSON *messages, const cJSON *tools, char **out,
                   al_error *err)
{
    _cleanup_cjson_ cJSON *b = cJSON_CreateObject();
    cJSON *msgs, *so;
    if (!b || !cJSON_AddStringToObject(b, "model", cfg->model) ||
        !(msgs = cJSON_AddArrayToObject(b, "messages")) || !cJSON_AddTrueToObject(b, "stream") ||
        !(so = cJSON_AddObjectToObject(b, "stream_options")) ||
        !cJSON_AddTrueToObject(so, "include_usage"))
        return al_err(err, -ENOMEM, "out of memory for the model request");
    const cJSON *m;
    _cleanup_cjson_ cJSON *parts = NULL; /* images waiting for the end of the tool results */
    cJSON_ArrayForEach(m, messages)
    {
        const char *role = al_json_str(m, "role");
        if ((!role || strcmp(role, "tool")) && !flush_images(msgs, &parts))
            return al_err(err, -ENOMEM, "out of memory for the model request");
        al_error merr = {0};
        cJSON *o = message(m, &merr);
        if (!o && merr.code)
            return al_err(err, merr.code, "%s", merr.msg);
        if (!o || !cJSON_AddItemToArray(msgs, o)) {
            cJSON_Delete(o);
            return al_err(err, -ENOMEM, "out of memory for the model request");
        }
        const cJSON *images = cJSON_GetObjectItemCaseSensitive(m, "images");
        if (cJSON_GetArraySize(images) > 0) {
            if (!parts && !(parts = image_parts("Images the code returned:")))
                return al_err(err, -ENOMEM, "out of memory for the model request");
            if (!add_images(parts, images))
                return al_err(err, -ENOMEM, "out of memory for the model request");
            if ((!role || strcmp(role, "tool")) && !flush_images(msgs, &parts))
                return al_err(err, -ENOMEM, "out of memory for the model request");
        }
    }
    if (!flush_images(msgs, &parts))
        return al_err(err, -ENOMEM, "out of memory for the model request");
    if (cfg->max_tokens && !cJSON_AddNumberToObject(b, "max_tokens", cfg->max_tokens))
        return al_err(err, -ENOMEM, "out of memory for the model request");
    int tr = al_model_body_tools(b, AL_API_OPENAI, tools, err);
    if (tr < 0)
        return tr;
    return al_model_body_finish(b, cfg, out, err);
}

/* A tool call's delta; pos >= 0 for a whole reply's calls, which are keyed by position. */
static int tool_delta(struct al_model_acc *a, const cJSON *tc, int pos)
{
    /* Streamed calls are keyed by "index"; servers that omit it send each call whole. */
    const cJSON *idx = cJSON_GetObjectItemCaseSensitive(tc, "index");
    const char *id = al_json_str(tc, "id");
    long key;
    if (cJSON_IsNumber(idx) && !(idx->valuedouble >= 0 && idx->valuedouble < 1000000))
        return al_err(&a->err, -EPROTO, "the model's stream has a bad tool call index");
    if (pos >= 0)
        key = pos;
    else if (cJSON_IsNumber(idx))
        key = (long)idx->valuedouble;
    else if (id && *id)
        key = 1000000 + (long)a->ncalls; /* a new call each time an id appears */
    else
        key = a->ncalls ? a->calls[a->ncalls - 1].key : 0;
    struct al_acc_call *c;
    int r = al_model_acc_call(a, key, true, &c);
    if (r < 0)
        return r;
    if (id && *id && !c->id.len && al_buf_add(&c->id, id, strlen(id)) < 0)
        return al_err(&a->err, -ENOMEM, "out of memory for the model's reply");
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
    if ((r = al_model_acc_call_name(a, c, al_json_str(fn, "name"))) < 0)
        return r;
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
    if (cJSON_IsString(args))
        return al_model_acc_args(a, c, args->valuestring, strlen(args->valuestring));
    if (cJSON_IsObject(args)) /* some servers send the arguments already parsed */
        return al_model_acc_args_json(a, c, args);
    return 0;
}

/* One streamed chunk (its choice's "delta"), or a whole non-streamed reply ("message"). */
static int chunk(struct al_model_acc *a, const char *data, size_t len, bool whole)
{
    _cleanup_cjson_ cJSON *j = cJSON_ParseWithLength(data, len);
    if (!cJSON_IsObject(j))
        return al_model_bad_json(a, whole ? "reply" : "stream", data, len);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    if (e) {
        return al_model_server_error(a, cJSON_IsString(e) ? e->valuestring
                                                          : al_json_str(e, "message"));
    }
    const cJSON *usage = cJSON_GetObjectItemCaseSensitive(j, "usage");
    if (cJSON_IsObject(usage)) {
        a->input_tokens = al_json_tokens(usage, "prompt_tokens");
        a->output_tokens = al_json_tokens(usage, "completion_tokens");
    }
    /* One choice is asked for; a server that sends more has its first one used. */
    const cJSON *choice = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "choices"), 0);
    if (!cJSON_IsObject(choice))
        return 0;
    const cJSON *delta = cJSON_GetObjectItemCaseSensitive(choice, whole ? "message" : "delta");
    const char *text = al_json_str(delta, "content");
    int r;
    if (text && (r = al_model_acc_text(a, text, strlen(text))) < 0)
        return r;
    const cJSON *tcs = cJSON_GetObjectItemCaseSensitive(delta, "tool_calls"), *tc;
    int pos = 0;
    cJSON_ArrayForEach(tc, tcs)
    {
        if (cJSON_IsObject(tc) && (r = tool_delta(a, tc, whole ? pos : -1)) < 0)
            return r;
        pos++;
    }
    al_model_acc_finish_reason(a, al_json_str(choice, "finish_reason"));
    return 0;
}

int al_openai_event(void *ctx, const char *event, const char *data, size_t len)
{
    struct al_model_acc *a = ctx;
    (void)event;
    if (len == 6 && memcmp(data, "[DONE]", 6) == 0) {
        a->done = true;
        return AL_SSE_DONE;
    }
    return chunk(a, data, len, false);
}

int al_openai_response(struct al_model_acc *a, const char *body, size_t len)
{
    int r = chunk(a, body, len, true);
    a->done = r == 0;
    return r;
}

/* Anthropic's Messages API: the request body from the neutral conversation (system prompt at the
 * top level, tool calls and results as content blocks, alternating roles), and the streamed
 * events into a reply. */
#include "model-internal.h"

#include <errno.h>
#include <string.h>

/* The API requires max_tokens; this is what is sent when the caller sets none. */
#define ANTHROPIC_MAX_TOKENS_DEFAULT 4096

static bool add_text_block(cJSON *blocks, const char *text)
{
    /* The API refuses empty text blocks. */
    if (!text || !*text)
        return true;
    cJSON *b = cJSON_CreateObject();
    if (!b || !cJSON_AddItemToArray(blocks, b))
        return cJSON_Delete(b), false;
    return cJSON_AddStringToObject(b, "type", "text") && cJSON_AddStringToObject(b, "text", text);
}

/* The message's content as blocks: a string becomes a text block, an array is taken as blocks. */
static bool add_content(cJSON *blocks, const cJSON *m)
{
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (cJSON_IsString(c))
        return add_text_block(blocks, c->valuestring);
    const cJSON *b;
    cJSON_ArrayForEach(b, (cJSON_IsArray(c) ? c : NULL))
    {
        cJSON *d = cJSON_Duplicate(b, true);
        if (!d || !cJSON_AddItemToArray(blocks, d))
            return cJSON_Delete(d), false;
    }
    return true;
}

static bool add_tool_uses(cJSON *blocks, const cJSON *calls)
{
    const cJSON *c;
    cJSON_ArrayForEach(c, calls)
    {
        cJSON *b = cJSON_CreateObject();
        if (!b || !cJSON_AddItemToArray(blocks, b))
            return cJSON_Delete(b), false;
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(c, "arguments");
        cJSON *input;
        if (cJSON_IsObject(args))
            input = cJSON_Duplicate(args, true);
        else if (cJSON_IsString(args))
            input = al_model_args_object(args->valuestring);
        else
            input = cJSON_CreateObject(); /* the API wants an object, even an empty one */
        const char *id = al_json_str(c, "id"), *name = al_json_str(c, "name");
        if (!input || !cJSON_AddItemToObject(b, "input", input) ||
            !cJSON_AddStringToObject(b, "type", "tool_use") ||
            !cJSON_AddStringToObject(b, "id", id ? id : "") ||
            !cJSON_AddStringToObject(b, "name", name ? name : ""))
            return false;
    }
    return true;
}

/* [{"media_type", "data"}] as Anthropic image blocks with a base64 source. */
static bool add_image_blocks(cJSON *parts, const cJSON *images)
{
    const cJSON *img;
    cJSON_ArrayForEach(img, images)
    {
        const char *type = al_json_str(img, "media_type"), *data = al_json_str(img, "data");
        if (!type || !data)
            continue;
        cJSON *p = cJSON_CreateObject(), *src;
        if (!p || !cJSON_AddItemToArray(parts, p) || !cJSON_AddStringToObject(p, "type", "image") ||
            !(src = cJSON_AddObjectToObject(p, "source")) ||
            !cJSON_AddStringToObject(src, "type", "base64") ||
            !cJSON_AddStringToObject(src, "media_type", type) ||
            !cJSON_AddStringToObject(src, "data", data))
            return false;
    }
    return true;
}

static bool add_tool_result(cJSON *blocks, const cJSON *m)
{
    cJSON *b = cJSON_CreateObject();
    if (!b)
        return false;
    /* Tool results lead a user message (the API's rule), ahead of any text merged into it. */
    int at = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, blocks)
    {
        const char *t = al_json_str(x, "type");
        if (!t || strcmp(t, "tool_result") != 0)
            break;
        at++;
    }
    if (!cJSON_InsertItemInArray(blocks, at, b))
        return cJSON_Delete(b), false;
    const char *id = al_json_str(m, "tool_call_id");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
    const cJSON *is_error = cJSON_GetObjectItemCaseSensitive(m, "is_error");
    const cJSON *images = cJSON_GetObjectItemCaseSensitive(m, "images");
    const char *text = cJSON_IsString(c) ? c->valuestring : "";
    bool ok = cJSON_AddStringToObject(b, "type", "tool_result") &&
              cJSON_AddStringToObject(b, "tool_use_id", id ? id : "") &&
              (!cJSON_IsTrue(is_error) || cJSON_AddTrueToObject(b, "is_error"));
    if (!ok)
        return false;
    if (cJSON_GetArraySize(images) == 0)
        return cJSON_AddStringToObject(b, "content", text);
    /* A run's images: image blocks in the result, after its text. */
    cJSON *parts = cJSON_AddArrayToObject(b, "content"), *t = cJSON_CreateObject();
    if (!parts || !t || !cJSON_AddItemToArray(parts, t) ||
        !cJSON_AddStringToObject(t, "type", "text") || !cJSON_AddStringToObject(t, "text", text))
        return false;
    return add_image_blocks(parts, images);
}

/* The blocks of the last message when it has this role, else those of a new message. */
static cJSON *blocks_for(cJSON *msgs, const char *role)
{
    cJSON *last = cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1);
    const char *lr = al_json_str(last, "role");
    if (lr && strcmp(lr, role) == 0)
        return cJSON_GetObjectItemCaseSensitive(last, "content");
    cJSON *m = cJSON_CreateObject();
    cJSON *blocks;
    if (!m || !cJSON_AddItemToArray(msgs, m))
        return cJSON_Delete(m), NULL;
    if (!cJSON_AddStringToObject(m, "role", role) ||
        !(blocks = cJSON_AddArrayToObject(m, "content")))
        return NULL;
    return blocks;
}

static int add_message(cJSON *msgs, struct al_buf *system, const cJSON *m, al_error *err)
{
    const char *role = al_json_str(m, "role");
    if (!role)
        return al_err(err, -EINVAL, "a conversation message has no role");
    bool ok;
    if (strcmp(role, "system") == 0) {
        const char *c = al_json_str(m, "content");
        if (!c || !*c)
            return 0;
        ok = (!system->len || al_buf_add(system, "\n\n", 2) == 0) &&
             al_buf_add(system, c, strlen(c)) == 0;
    } else if (strcmp(role, "user") == 0) {
        cJSON *blocks = blocks_for(msgs, "user");
        ok = blocks && add_content(blocks, m) &&
             add_image_blocks(blocks, cJSON_GetObjectItemCaseSensitive(m, "images"));
    } else if (strcmp(role, "tool") == 0) {
        cJSON *blocks = blocks_for(msgs, "user");
        ok = blocks && add_tool_result(blocks, m);
    } else if (strcmp(role, "assistant") == 0) {
        cJSON *blocks = blocks_for(msgs, "assistant");
        ok = blocks && add_content(blocks, m) &&
             add_tool_uses(blocks, cJSON_GetObjectItemCaseSensitive(m, "tool_calls"));
    } else {
        return al_err(err, -EINVAL, "a conversation message has an unknown role '%.32s'", role);
    }
    return ok ? 0 : al_err(err, -ENOMEM, "out of memory for the model request");
}

int al_anthropic_body(const al_model_cfg *cfg, const cJSON *messages, const cJSON *tools,
                      char **out, al_error *err)
{
    _cleanup_cjson_ cJSON *b = cJSON_CreateObject();
    cJSON *msgs;
    unsigned max_tokens = cfg->max_tokens ? cfg->max_tokens : ANTHROPIC_MAX_TOKENS_DEFAULT;
    if (!b || !cJSON_AddStringToObject(b, "model", cfg->model) ||
        !cJSON_AddNumberToObject(b, "max_tokens", max_tokens) ||
        !cJSON_AddTrueToObject(b, "stream"))
        return al_err(err, -ENOMEM, "out of memory for the model request");
    struct al_buf system = {0};
    const cJSON *m;
    int r = (msgs = cJSON_AddArrayToObject(b, "messages")) ? 0 : -ENOMEM;
    cJSON_ArrayForEach(m, (r == 0 ? messages : NULL))
    {
        if ((r = add_message(msgs, &system, m, err)) < 0)
            break;
    }
    if (r == 0 && system.len && !cJSON_AddStringToObject(b, "system", system.p))
        r = -ENOMEM;
    al_buf_free(&system);
    if (r < 0)
        return al_err(err, r, "out of memory for the model request");
    /* A message whose every block was empty text would be refused: drop it. */
    for (int i = cJSON_GetArraySize(msgs) - 1; i >= 0; i--) {
        cJSON *x = cJSON_GetArrayItem(msgs, i);
        if (cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(x, "content")) == 0)
            cJSON_DeleteItemFromArray(msgs, i);
    }
    if ((r = al_model_body_tools(b, AL_API_ANTHROPIC, tools, err)) < 0)
        return r;
    return al_model_body_finish(b, cfg, out, err);
}

/* Cached prompt tokens count towards the context like the others. */
static unsigned prompt_tokens(const cJSON *usage)
{
    return al_json_tokens(usage, "input_tokens") +
           al_json_tokens(usage, "cache_creation_input_tokens") +
           al_json_tokens(usage, "cache_read_input_tokens");
}

/* The content block index an event refers to. */
static int block_index(struct al_model_acc *a, const cJSON *j, long *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "index");
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble < 1000000))
        return al_err(&a->err, -EPROTO, "the model's stream has a bad content block index");
    *out = (long)v->valuedouble;
    return 0;
}

static int block_start(struct al_model_acc *a, const cJSON *j)
{
    const cJSON *block = cJSON_GetObjectItemCaseSensitive(j, "content_block");
    const char *type = al_json_str(block, "type");
    long idx;
    int r;
    if (type && strcmp(type, "text") == 0) {
        const char *t = al_json_str(block, "text");
        return t ? al_model_acc_text(a, t, strlen(t)) : 0;
    }
    if (!type || strcmp(type, "tool_use") != 0)
        return 0; /* thinking and server-side tool blocks are not ours to run */
    struct al_acc_call *c;
    if ((r = block_index(a, j, &idx)) < 0 || (r = al_model_acc_call(a, idx, true, &c)) < 0)
        return r;
    const char *id = al_json_str(block, "id");
    if (id && !c->id.len && al_buf_add(&c->id, id, strlen(id)) < 0)
        return al_err(&a->err, -ENOMEM, "out of memory for the model's reply");
    if ((r = al_model_acc_call_name(a, c, al_json_str(block, "name"))) < 0)
        return r;
    /* The input comes as {} and then in pieces; a proxy may send it whole here instead. */
    const cJSON *input = cJSON_GetObjectItemCaseSensitive(block, "input");
    if (cJSON_IsObject(input) && input->child) {
        c->args_from_start = true;
        return al_model_acc_args_json(a, c, input);
    }
    return 0;
}

static int block_delta(struct al_model_acc *a, const cJSON *j)
{
    const cJSON *delta = cJSON_GetObjectItemCaseSensitive(j, "delta");
    const char *type = al_json_str(delta, "type");
    if (type && strcmp(type, "text_delta") == 0) {
        const char *t = al_json_str(delta, "text");
        return t ? al_model_acc_text(a, t, strlen(t)) : 0;
    }
    if (!type || strcmp(type, "input_json_delta") != 0)
        return 0;
    long idx;
    struct al_acc_call *c;
    int r;
    if ((r = block_index(a, j, &idx)) < 0 || (r = al_model_acc_call(a, idx, false, &c)) < 0)
        return r;
    if (c->args_from_start) {
        c->args_from_start = false;
        c->args.len = 0;
    }
    const char *p = al_json_str(delta, "partial_json");
    return p ? al_model_acc_args(a, c, p, strlen(p)) : 0;
}

int al_anthropic_event(void *ctx, const char *event, const char *data, size_t len)
{
    struct al_model_acc *a = ctx;
    const char *type;
    _cleanup_cjson_ cJSON *j = al_model_event_parse(a, event, data, len, &type);
    if (!j)
        return a->err.code;
    if (strcmp(type, "message_start") == 0) {
        const cJSON *usage = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(j, "message"), "usage");
        a->input_tokens = prompt_tokens(usage);
        a->output_tokens = al_json_tokens(usage, "output_tokens");
    } else if (strcmp(type, "content_block_start") == 0) {
        return block_start(a, j);
    } else if (strcmp(type, "content_block_delta") == 0) {
        return block_delta(a, j);
    } else if (strcmp(type, "message_delta") == 0) {
        const cJSON *usage = cJSON_GetObjectItemCaseSensitive(j, "usage");
        if (cJSON_GetObjectItemCaseSensitive(usage, "output_tokens"))
            a->output_tokens = al_json_tokens(usage, "output_tokens");
        al_model_acc_finish_reason(
            a, al_json_str(cJSON_GetObjectItemCaseSensitive(j, "delta"), "stop_reason"));
    } else if (strcmp(type, "message_stop") == 0) {
        a->done = true;
        return AL_SSE_DONE;
    } else if (strcmp(type, "error") == 0) {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
        return al_model_server_error(a, al_json_str(e, "message"));
    }
    return 0; /* ping, content_block_stop, and events added after this was written */
}

int al_anthropic_response(struct al_model_acc *a, const char *body, size_t len)
{
    _cleanup_cjson_ cJSON *j = cJSON_ParseWithLength(body, len);
    if (!cJSON_IsObject(j))
        return al_model_bad_json(a, "reply", body, len);
    const char *type = al_json_str(j, "type");
    if (type && strcmp(type, "error") == 0) {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
        return al_model_server_error(a, al_json_str(e, "message"));
    }
    /* Each block as if it had been streamed whole in its content_block_start. */
    const cJSON *block;
    int i = 0, r;
    cJSON_ArrayForEach(block, cJSON_GetObjectItemCaseSensitive(j, "content"))
    {
        _cleanup_cjson_ cJSON *ev = cJSON_CreateObject();
        if (!ev || !cJSON_AddNumberToObject(ev, "index", i++) ||
            !cJSON_AddItemReferenceToObject(ev, "content_block", (cJSON *)block))
            return al_err(&a->err, -ENOMEM, "out of memory for the model's reply");
        if ((r = block_start(a, ev)) < 0)
            return r;
    }
    const cJSON *usage = cJSON_GetObjectItemCaseSensitive(j, "usage");
    a->input_tokens = prompt_tokens(usage);
    a->output_tokens = al_json_tokens(usage, "output_tokens");
    al_model_acc_finish_reason(a, al_json_str(j, "stop_reason"));
    a->done = true;
    return 0;
}

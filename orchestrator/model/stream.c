/* The reply being assembled from a stream's events, shared by both APIs: text passed on in whole
 * UTF-8 characters, tool calls collected by key, bounded in size and count. */
#include "model-internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

int al_buf_add(struct al_buf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p)
            return -ENOMEM;
        b->p = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 0;
}

void al_buf_free(struct al_buf *b)
{
    free(b->p);
    *b = (struct al_buf){0};
}

char *al_buf_steal(struct al_buf *b)
{
    char *p = b->p ? b->p : strdup("");
    *b = (struct al_buf){0};
    return p;
}

void al_model_acc_init(struct al_model_acc *a, enum al_api api, const al_model_stream_cb *cb)
{
    *a = (struct al_model_acc){.api = api, .cb = cb};
}

void al_model_acc_free(struct al_model_acc *a)
{
    al_buf_free(&a->text);
    for (size_t i = 0; i < a->ncalls; i++) {
        al_buf_free(&a->calls[i].id);
        al_buf_free(&a->calls[i].name);
        al_buf_free(&a->calls[i].args);
    }
    free(a->calls);
    cJSON_Delete(a->output);
    *a = (struct al_model_acc){0};
}

int al_model_acc_grow(struct al_model_acc *a, size_t n)
{
    if (n > AL_MODEL_REPLY_MAX - a->total)
        return al_err(&a->err, -EMSGSIZE, "the model's reply exceeds %u MiB",
                      AL_MODEL_REPLY_MAX >> 20);
    a->total += n;
    a->started = true;
    return 0;
}

/* Where the text's complete characters end: a lead byte whose continuation bytes have not all
 * arrived is held back with them. Invalid sequences are passed on as they are. */
static size_t utf8_complete(const char *s, size_t from, size_t len)
{
    size_t k = len;
    int cont = 0;
    while (k > from && cont < 3 && ((unsigned char)s[k - 1] & 0xC0) == 0x80) {
        k--;
        cont++;
    }
    if (k == from)
        return len;
    unsigned char lead = (unsigned char)s[k - 1];
    size_t need = (lead & 0xE0) == 0xC0   ? 2
                  : (lead & 0xF0) == 0xE0 ? 3
                  : (lead & 0xF8) == 0xF0 ? 4
                                          : 1;
    return need > (size_t)cont + 1 ? k - 1 : len;
}

static void pass_text(struct al_model_acc *a, size_t end)
{
    if (end > a->emitted && a->cb && a->cb->text) {
        a->passed = true;
        a->cb->text(a->cb->ctx, a->text.p + a->emitted, end - a->emitted);
    }
    a->emitted = end;
}

int al_model_acc_text(struct al_model_acc *a, const char *s, size_t n)
{
    if (n == 0)
        return 0;
    int r = al_model_acc_grow(a, n);
    if (r < 0)
        return r;
    if (al_buf_add(&a->text, s, n) < 0)
        return al_err(&a->err, -ENOMEM, "out of memory for the model's reply");
    pass_text(a, utf8_complete(a->text.p, a->emitted, a->text.len));
    return 0;
}

int al_model_acc_call(struct al_model_acc *a, long key, bool create, struct al_acc_call **out)
{
    for (size_t i = a->ncalls; i > 0; i--) {
        if (a->calls[i - 1].key == key) {
            *out = &a->calls[i - 1];
            return 0;
        }
    }
    if (!create)
        return al_err(&a->err, -EPROTO, "the model's stream continues a tool call it never began");
    if (a->ncalls == AL_MODEL_CALLS_MAX)
        return al_err(&a->err, -EPROTO, "the model's reply has more than %d tool calls",
                      AL_MODEL_CALLS_MAX);
    if (al_grow(&a->calls, &a->callcap, a->ncalls, sizeof(*a->calls), 4) < 0)
        return al_err(&a->err, -ENOMEM, "out of memory for the model's reply");
    a->calls[a->ncalls] = (struct al_acc_call){.key = key};
    *out = &a->calls[a->ncalls++];
    a->started = true;
    return 0;
}

int al_model_acc_call_name(struct al_model_acc *a, struct al_acc_call *c, const char *name)
{
    /* The name comes whole in the call's first delta; later repeats change nothing. */
    if (c->name.len || !name || !*name)
        return 0;
    size_t n = strlen(name);
    int r = al_model_acc_grow(a, n);
    if (r < 0)
        return r;
    if (al_buf_add(&c->name, name, n) < 0)
        return al_err(&a->err, -ENOMEM, "out of memory for the model's reply");
    if (a->cb && a->cb->tool_start) {
        a->passed = true;
        a->cb->tool_start(a->cb->ctx, c->name.p);
    }
    return 0;
}

int al_model_acc_args(struct al_model_acc *a, struct al_acc_call *c, const char *s, size_t n)
{
    int r = al_model_acc_grow(a, n);
    if (r < 0)
        return r;
    if (al_buf_add(&c->args, s, n) < 0)
        return al_err(&a->err, -ENOMEM, "out of memory for the model's reply");
    return 0;
}

void al_model_acc_finish_reason(struct al_model_acc *a, const char *reason)
{
    if (reason && *reason)
        snprintf(a->finish, sizeof(a->finish), "%s", reason);
}

bool al_model_acc_complete(const struct al_model_acc *a)
{
    return a->done || a->finish[0];
}

int al_model_acc_take(struct al_model_acc *a, al_model_reply *out, al_error *err)
{
    /* A character cut by the end of the stream can never complete: it becomes U+FFFD. */
    if (a->emitted < a->text.len) {
        a->text.len = a->emitted;
        if (al_buf_add(&a->text, "\xEF\xBF\xBD", 3) < 0)
            return al_err(err, -ENOMEM, "out of memory for the model's reply");
        pass_text(a, a->text.len);
    }
    al_model_reply r = {0};
    r.calls = calloc(a->ncalls ? a->ncalls : 1, sizeof(*r.calls));
    if (!r.calls)
        return al_err(err, -ENOMEM, "out of memory for the model's reply");
    bool oom = false;
    for (size_t i = 0; i < a->ncalls && !oom; i++) {
        struct al_acc_call *c = &a->calls[i];
        char made[32];
        if (!c->id.len) {
            snprintf(made, sizeof(made), "call_%zu", i + 1);
            oom |= al_buf_add(&c->id, made, strlen(made)) < 0;
        }
        /* No arguments at all means none were needed. */
        if (!c->args.len)
            oom |= al_buf_add(&c->args, "{}", 2) < 0;
        r.calls[i].id = al_buf_steal(&c->id);
        r.calls[i].name = al_buf_steal(&c->name);
        r.calls[i].arguments = al_buf_steal(&c->args);
        r.calls[i].kind = c->computer ? strdup("computer_call") : NULL;
        r.ncalls = i + 1;
        oom |= !r.calls[i].id || !r.calls[i].name || !r.calls[i].arguments ||
               (c->computer && !r.calls[i].kind);
    }
    r.text = al_buf_steal(&a->text);
    if (a->output && !(r.output = cJSON_PrintUnformatted(a->output)))
        oom = true;
    if (!r.text || oom) {
        al_model_reply_free(&r);
        return al_err(err, -ENOMEM, "out of memory for the model's reply");
    }
    if (!r.ncalls) {
        free(r.calls);
        r.calls = NULL;
    }
    r.input_tokens = a->input_tokens;
    r.output_tokens = a->output_tokens;
    memcpy(r.finish, a->finish, sizeof(r.finish));
    *out = r;
    return 0;
}

int al_model_acc_args_json(struct al_model_acc *a, struct al_acc_call *c, const cJSON *args)
{
    _cleanup_free_ char *s = cJSON_PrintUnformatted(args);
    if (!s)
        return al_err(&a->err, -ENOMEM, "out of memory for the model's reply");
    return al_model_acc_args(a, c, s, strlen(s));
}

const char *al_json_str(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

unsigned al_json_tokens(const cJSON *usage, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(usage, key);
    if (!cJSON_IsNumber(v) || v->valuedouble < 0)
        return 0;
    return v->valuedouble > AL_MODEL_TOKENS_MAX ? AL_MODEL_TOKENS_MAX : (unsigned)v->valuedouble;
}

int al_model_body_tools(cJSON *body, enum al_api api, const cJSON *tools, al_error *err)
{
    if (cJSON_GetArraySize(tools) <= 0)
        return 0;
    cJSON *ts = cJSON_AddArrayToObject(body, "tools");
    if (!ts)
        return al_err(err, -ENOMEM, "out of memory for the model request");
    const cJSON *t;
    cJSON_ArrayForEach(t, tools)
    {
        const cJSON *native =
            cJSON_GetObjectItemCaseSensitive(t, api == AL_API_ANTHROPIC   ? "anthropic"
                                                : api == AL_API_RESPONSES ? "openai"
                                                                          : "");
        if (api != AL_API_OPENAI && cJSON_IsObject(native)) {
            if (!cJSON_AddItemToArray(ts, cJSON_Duplicate(native, true)))
                goto oom;
            continue;
        }
        cJSON *o = cJSON_CreateObject(), *fn = o;
        const char *name = al_json_str(t, "name"), *desc = al_json_str(t, "description");
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(t, "parameters");
        if (!o || !cJSON_AddItemToArray(ts, o))
            goto oom;
        /* OpenAI: {"type":"function","function":{name, description, parameters}};
         * Responses: {"type":"function", name, description, parameters};
         * Anthropic: {name, description, input_schema}, which it requires. */
        if (api != AL_API_ANTHROPIC && !cJSON_AddStringToObject(o, "type", "function"))
            goto oom;
        if (api == AL_API_OPENAI && !(fn = cJSON_AddObjectToObject(o, "function")))
            goto oom;
        if (!cJSON_AddStringToObject(fn, "name", name ? name : "") ||
            (desc && !cJSON_AddStringToObject(fn, "description", desc)))
            goto oom;
        if (api != AL_API_ANTHROPIC && params &&
            !cJSON_AddItemToObject(fn, "parameters", cJSON_Duplicate(params, true)))
            goto oom;
        if (api == AL_API_ANTHROPIC &&
            !cJSON_AddItemToObject(o, "input_schema",
                                   params ? cJSON_Duplicate(params, true)
                                          : cJSON_Parse("{\"type\":\"object\"}")))
            goto oom;
    }
    return 0;
oom:
    return al_err(err, -ENOMEM, "out of memory for the model request");
}

int al_model_body_finish(cJSON *body, const al_model_cfg *cfg, char **out, al_error *err)
{
    if (cfg->has_temperature && !cJSON_AddNumberToObject(body, "temperature", cfg->temperature))
        return al_err(err, -ENOMEM, "out of memory for the model request");
    char *s = cJSON_PrintUnformatted(body);
    if (!s)
        return al_err(err, -ENOMEM, "out of memory for the model request");
    *out = s;
    return 0;
}

int al_model_bad_json(struct al_model_acc *a, const char *what, const char *data, size_t len)
{
    /* Enough of it to recognise; data need not be NUL-terminated. */
    int n = len < 80 ? (int)len : 80;
    return al_err(&a->err, -EPROTO, "malformed JSON in the model's %s: %.*s", what, n, data);
}

cJSON *al_model_event_parse(struct al_model_acc *a, const char *event, const char *data, size_t len,
                            const char **type)
{
    cJSON *j = cJSON_ParseWithLength(data, len);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        al_model_bad_json(a, "stream", data, len);
        return NULL;
    }
    *type = al_json_str(j, "type");
    if (!*type)
        *type = event;
    return j;
}

int al_model_server_error(struct al_model_acc *a, const char *msg)
{
    a->server_error = true;
    return al_err(&a->err, -EPROTO, "the model server reported an error: %s",
                  msg ? msg : "(no message)");
}

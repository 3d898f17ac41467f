/* Fuzz target for the model stream parsers: the bytes a model server (or anything between it and
 * us) could send, through the SSE parser into the OpenAI, Anthropic or Responses reply
 * accumulator.
 *
 * Input: byte 0 picks the mode (bit 0: OpenAI / Anthropic, bit 3 over both: OpenAI's Responses
 * API; bit 1: the rest is a neutral
 * conversation to build a request body from; bit 2: the rest is a whole non-streamed reply;
 * else it is a stream), byte 1 seeds the sizes of the pieces the stream is fed in. The stream is
 * parsed twice, whole and in pieces: both must end the same way with the same reply. The text
 * passed to the callback must add up to the reply's text, and a finished reply must turn into a
 * neutral message. */
#include "fuzz.h"
#include "model-internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void fail(const char *what)
{
    fprintf(stderr, "fuzz-sse: %s\n", what);
    abort();
}

struct seen {
    struct al_buf text;
    unsigned starts;
};

static void on_text(void *ctx, const char *s, size_t n)
{
    struct seen *v = ctx;
    if (n == 0)
        fail("an empty text piece");
    if (al_buf_add(&v->text, s, n) < 0)
        fail("out of memory");
}

static void on_tool_start(void *ctx, const char *name)
{
    struct seen *v = ctx;
    if (!name || !*name)
        fail("a tool start without a name");
    v->starts++;
}

struct outcome {
    int rc;
    al_model_reply reply;
    bool have_reply;
    unsigned starts;
};

static void parse(enum al_api api, bool whole_reply, const uint8_t *data, size_t size, uint8_t seed,
                  struct outcome *o)
{
    struct seen v = {0};
    al_model_stream_cb cb = {on_text, on_tool_start, &v};
    struct al_model_acc acc;
    al_model_acc_init(&acc, api, &cb);
    al_sse *p = al_sse_new(api == AL_API_ANTHROPIC   ? al_anthropic_event
                           : api == AL_API_RESPONSES ? al_responses_event
                                                     : al_openai_event,
                           &acc);
    if (!p)
        fail("out of memory");
    size_t at = 0;
    int rc = 0;
    unsigned step = seed;
    if (whole_reply) {
        rc = api == AL_API_ANTHROPIC   ? al_anthropic_response(&acc, (const char *)data, size)
             : api == AL_API_RESPONSES ? al_responses_response(&acc, (const char *)data, size)
                                       : al_openai_response(&acc, (const char *)data, size);
        at = size;
    }
    while (at < size && rc == 0) {
        size_t n = seed ? (step % 17) + 1 : size - at;
        step = step * 1103515245u + 12345u;
        if (n > size - at)
            n = size - at;
        rc = al_sse_feed(p, (const char *)data + at, n);
        at += n;
    }
    al_sse_free(p);
    o->rc = rc;
    o->starts = v.starts;
    o->have_reply = false;
    if (rc >= 0 && al_model_acc_complete(&acc)) {
        al_error err = {0};
        if (al_model_acc_take(&acc, &o->reply, &err) < 0)
            fail("a complete reply cannot be taken");
        o->have_reply = true;
        if (strlen(o->reply.text) != v.text.len ||
            (v.text.len && memcmp(o->reply.text, v.text.p, v.text.len) != 0))
            fail("the text passed on does not add up to the reply's text");
        cJSON *m = al_model_reply_message(&o->reply);
        if (!m)
            fail("a reply does not make a message");
        cJSON_Delete(m);
    }
    if (rc < 0 && !acc.err.code && rc != -EMSGSIZE)
        fail("a failed stream without a reason");
    al_model_acc_free(&acc);
    al_buf_free(&v.text);
}

static void same(const struct outcome *a, const struct outcome *b)
{
    if (a->rc != b->rc || a->have_reply != b->have_reply || a->starts != b->starts)
        fail("whole and piecewise parses end differently");
    if (!a->have_reply)
        return;
    const al_model_reply *x = &a->reply, *y = &b->reply;
    if (strcmp(x->text, y->text) != 0 || x->ncalls != y->ncalls ||
        strcmp(x->finish, y->finish) != 0 || x->input_tokens != y->input_tokens ||
        x->output_tokens != y->output_tokens)
        fail("whole and piecewise parses give different replies");
    for (size_t i = 0; i < x->ncalls; i++)
        if (strcmp(x->calls[i].id, y->calls[i].id) != 0 ||
            strcmp(x->calls[i].name, y->calls[i].name) != 0 ||
            strcmp(x->calls[i].arguments, y->calls[i].arguments) != 0 ||
            !x->calls[i].kind != !y->calls[i].kind)
            fail("whole and piecewise parses give different tool calls");
}

static void body(enum al_api api, const uint8_t *data, size_t size)
{
    cJSON *conv = cJSON_ParseWithLength((const char *)data, size);
    if (!conv)
        return;
    static const char tools_json[] =
        "[{\"name\":\"execute\",\"description\":\"run\",\"parameters\":{\"type\":\"object\"}}]";
    cJSON *tools = cJSON_Parse(tools_json);
    al_model_cfg cfg = {.api = api, .model = "m", .max_tokens = 7};
    char *out = NULL;
    al_error err = {0};
    int r = api == AL_API_ANTHROPIC   ? al_anthropic_body(&cfg, conv, tools, &out, &err)
            : api == AL_API_RESPONSES ? al_responses_body(&cfg, conv, tools, &out, &err)
                                      : al_openai_body(&cfg, conv, tools, &out, &err);
    if (r == 0) {
        cJSON *back = cJSON_Parse(out);
        if (!back)
            fail("a request body that is not JSON");
        cJSON_Delete(back);
        free(out);
    } else if (!err.code || !err.msg[0]) {
        fail("a refused conversation without a reason");
    }
    cJSON_Delete(tools);
    cJSON_Delete(conv);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    enum al_api api = data[0] & 8   ? AL_API_RESPONSES
                      : data[0] & 1 ? AL_API_ANTHROPIC
                                    : AL_API_OPENAI;
    if (data[0] & 2) {
        body(api, data + 2, size - 2);
        return 0;
    }
    struct outcome whole = {0}, pieces = {0};
    if (data[0] & 4) {
        parse(api, true, data + 2, size - 2, 0, &whole);
        al_model_reply_free(&whole.reply);
        return 0;
    }
    parse(api, false, data + 2, size - 2, 0, &whole);
    parse(api, false, data + 2, size - 2, data[1] | 1, &pieces);
    same(&whole, &pieces);
    al_model_reply_free(&whole.reply);
    al_model_reply_free(&pieces.reply);
    return 0;
}

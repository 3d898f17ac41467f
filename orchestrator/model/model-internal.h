/* Private parts of the model clients, shared by their files and the fuzz target. */
#ifndef AL_MODEL_INTERNAL_H
#define AL_MODEL_INTERNAL_H

#include "model.h"
#include "util.h"

#include <stdbool.h>
#include <stddef.h>

/* One event's data may be this large: tool calls carrying a whole file as an argument stay well
 * below it, and a server that never sends a blank line cannot make us hold more. */
#define AL_SSE_EVENT_MAX (4u << 20)
/* A line holds a field name, ": " and at most an event's worth of value. */
#define AL_SSE_LINE_MAX (AL_SSE_EVENT_MAX + 64u)
/* What an event callback returns to stop the stream early (the reply is complete). */
#define AL_SSE_DONE 1

/* A whole reply (text plus tool-call arguments) is at most this large: far above any model's
 * output limit, it bounds what a runaway or hostile server can make us hold. */
#define AL_MODEL_REPLY_MAX (16u << 20)
/* Tool calls in one reply: models make a handful; more is a broken stream. */
#define AL_MODEL_CALLS_MAX 128

/* A token count above this is nonsense; clamped so that sums of a few cannot overflow. */
#define AL_MODEL_TOKENS_MAX 1000000000u

/* The string at key, or NULL when it is missing or not a string. */
const char *al_json_str(const cJSON *o, const char *key);
/* A usage count at key: 0 when missing or negative, clamped to AL_MODEL_TOKENS_MAX. */
unsigned al_json_tokens(const cJSON *usage, const char *key);

/* A growable byte buffer, always NUL-terminated when p != NULL. */
struct al_buf {
    char *p;
    size_t len, cap;
};
int al_buf_add(struct al_buf *b, const char *s, size_t n);
void al_buf_free(struct al_buf *b);
/* Hands over the bytes (a "" string when empty); the buffer is left empty. NULL on ENOMEM. */
char *al_buf_steal(struct al_buf *b);

struct al_acc_call {
    struct al_buf id;
    struct al_buf name;
    struct al_buf args;
    long key;             /* OpenAI tool_calls[].index, or Anthropic content block index */
    bool args_from_start; /* Anthropic: args came whole in content_block_start */
    bool computer;        /* the Responses API: a computer_call (arguments built from it) */
};

/* The reply being assembled from stream events, for either API. */
struct al_model_acc {
    enum al_api api;
    const al_model_stream_cb *cb; /* may be NULL */
    struct al_buf text;
    size_t emitted; /* bytes of text already passed to cb->text */
    struct al_acc_call *calls;
    size_t ncalls, callcap;
    size_t total; /* text and argument bytes, against AL_MODEL_REPLY_MAX */
    unsigned input_tokens, output_tokens;
    char finish[32];
    bool done;         /* "[DONE]" or message_stop: nothing more will come */
    bool started;      /* some content arrived: a retry would repeat what the user saw */
    bool passed;       /* something was passed to a callback */
    bool server_error; /* the server sent an error in the stream (overloaded...) */
    cJSON *output;     /* the Responses API: the output items, as each was done */
    al_error err;      /* why an event was refused */
};

void al_model_acc_init(struct al_model_acc *a, enum al_api api, const al_model_stream_cb *cb);
void al_model_acc_free(struct al_model_acc *a);
/* Counts n more bytes of the reply against AL_MODEL_REPLY_MAX: 0, or -EMSGSIZE (a->err set). */
int al_model_acc_grow(struct al_model_acc *a, size_t n);
/* Adds assistant text; passes the complete UTF-8 characters on to cb->text. */
int al_model_acc_text(struct al_model_acc *a, const char *s, size_t n);
/* The call with this key, made when new (tool_start is called once its name is known). */
int al_model_acc_call(struct al_model_acc *a, long key, bool create, struct al_acc_call **out);
int al_model_acc_call_name(struct al_model_acc *a, struct al_acc_call *c, const char *name);
int al_model_acc_args(struct al_model_acc *a, struct al_acc_call *c, const char *s, size_t n);
/* Arguments a server sent as a JSON object rather than as text. */
int al_model_acc_args_json(struct al_model_acc *a, struct al_acc_call *c, const cJSON *args);
void al_model_acc_finish_reason(struct al_model_acc *a, const char *reason);
/* Whether the stream said all it had to say (a finish reason or its end marker). */
bool al_model_acc_complete(const struct al_model_acc *a);
/* Moves the assembled reply into out. */
int al_model_acc_take(struct al_model_acc *a, al_model_reply *out, al_error *err);

/* Stream event handlers (al_sse_event_fn); ctx is a struct al_model_acc. They return 0,
 * AL_SSE_DONE at the end marker, or a negative errno with acc->err set. */
int al_openai_event(void *ctx, const char *event, const char *data, size_t len);
int al_anthropic_event(void *ctx, const char *event, const char *data, size_t len);
int al_responses_event(void *ctx, const char *event, const char *data, size_t len);

/* A whole, non-streamed reply (a server that ignored "stream": true), into acc. */
int al_openai_response(struct al_model_acc *a, const char *body, size_t len);
int al_anthropic_response(struct al_model_acc *a, const char *body, size_t len);
int al_responses_response(struct al_model_acc *a, const char *body, size_t len);

/* Request bodies in each API's wire format. */
int al_openai_body(const al_model_cfg *cfg, const cJSON *messages, const cJSON *tools, char **out,
                   al_error *err);
int al_anthropic_body(const al_model_cfg *cfg, const cJSON *messages, const cJSON *tools,
                      char **out, al_error *err);
int al_responses_body(const al_model_cfg *cfg, const cJSON *messages, const cJSON *tools,
                      char **out, al_error *err);

/* Fails the reply for an error the server put in the stream (worth retrying while nothing
 * has been passed on: servers say "overloaded" that way). */
int al_model_server_error(struct al_model_acc *a, const char *msg);
/* An event's data as a JSON object, and its type: the data's own "type" (the SSE event's name
 * says the same), else the event's name. NULL, with a->err set, when it is not an object. */
cJSON *al_model_event_parse(struct al_model_acc *a, const char *event, const char *data, size_t len,
                            const char **type);
/* Fails the reply for JSON that does not parse, quoting its start. */
int al_model_bad_json(struct al_model_acc *a, const char *what, const char *data, size_t len);

/* Adds "tools" to a request body in api's shape, from the neutral tools (model.h); nothing when
 * there are none. Shared by al_openai_body and al_anthropic_body. */
int al_model_body_tools(cJSON *body, enum al_api api, const cJSON *tools, al_error *err);
/* Adds what both APIs take alike (temperature) and prints the body into *out. */
int al_model_body_finish(cJSON *body, const al_model_cfg *cfg, char **out, al_error *err);

/* Tool-call arguments as the neutral conversation keeps them: the parsed object, or
 * {"_raw": text} when they are not a JSON object. */
cJSON *al_model_args_object(const char *text);
/* The arguments of a neutral tool call as the JSON text a model would have written. */
char *al_model_args_text(const cJSON *arguments);

#endif

/* Model clients: one streaming chat request to an OpenAI-compatible Chat Completions endpoint,
 * to OpenAI's Responses API or to Anthropic's Messages API, over libcurl, with retries and
 * cancellation.
 *
 * Conversations are kept in one neutral shape (below) and converted to each API's wire format
 * here, so the loop above never sees a provider's JSON. */
#ifndef AL_MODEL_H
#define AL_MODEL_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "airlock.h"

enum al_api {
    AL_API_OPENAI = 0,    /* POST {api_base}/chat/completions, stream: true */
    AL_API_ANTHROPIC = 1, /* POST {api_base}/v1/messages (api_base without /v1), stream: true */
    AL_API_RESPONSES = 2, /* POST {api_base}/responses, stream: true (OpenAI's Responses API,
                             whose models take its native computer tool) */
};
/* The API's name as the CLI, profiles and conversations spell it ("openai", "anthropic",
 * "responses"), and back; al_api_parse returns -1 for an unknown name. */
const char *al_api_name(enum al_api api);
int al_api_parse(const char *name);

/* Provider defaults (model/providers.c): what an endpoint, a model or a key defaults to. */
struct al_provider {
    const char *name; /* "openai", "anthropic"; local: "ollama", "llamacpp", "lmstudio" */
    enum al_api api;
    const char *api_base; /* the endpoint */
    const char *model;    /* the default model */
    const char *key_env;  /* the environment variable holding the key; NULL: none (local) */
};
/* The hosted provider of an API; never NULL. */
const struct al_provider *al_provider_hosted(enum al_api api);
/* A local server by name (ollama, llamacpp, lmstudio); NULL when there is none of that name. */
const struct al_provider *al_provider_local(const char *name);

typedef struct al_model_cfg {
    enum al_api api;
    const char *api_base; /* e.g. https://api.openai.com/v1, http://127.0.0.1:11434/v1 */
    const char *api_key;  /* NULL or "": no auth header (local servers) */
    const char *model;
    double temperature; /* used when has_temperature */
    bool has_temperature;
    unsigned max_tokens;        /* 0: not sent (OpenAI) / 4096 (Anthropic, which requires it) */
    unsigned timeout_s;         /* whole request, 0: 600 */
    unsigned connect_timeout_s; /* 0: 10 */
    unsigned retries;           /* extra attempts on 429, 5xx, dropped connection before any byte
                                   of the reply was passed on; 0 means none. Backoff 0.5 s doubling,
                                   capped at 8 s; Retry-After honoured up to 30 s. */
    int cancel_fd;              /* -1: none; readable (any byte) cancels the request: -ECANCELED */
    const char *anthropic_beta; /* Anthropic: an anthropic-beta header's value (a tool's beta:
                                   computer-use-2025-01-24), or NULL */
    /* Told each request's URL, status line and retry (never the key), one line each without
     * its newline; NULL: not told. The library prints nothing itself. */
    void (*notice)(void *ctx, const char *line);
    void *notice_ctx;
} al_model_cfg;

/* The neutral conversation: a cJSON array of message objects.
 *   {"role":"system","content":"..."}
 *   {"role":"user","content":"..."}
 *   {"role":"assistant","content":"...",                    (content may be "")
 *        "tool_calls":[{"id":"...","name":"execute","arguments":{...object...}}]}   (optional)
 *   {"role":"tool","tool_call_id":"...","name":"execute","content":"..."}
 * Tools: a cJSON array of {"name":"...","description":"...","parameters":{JSON schema}}; one
 * with an "anthropic" object goes to Anthropic as that object (a tool of its own kind: the
 * computer tool), one with an "openai" object to the Responses API as that object, and each
 * otherwise as the function it describes.
 * The Responses API adds to this:
 *   a tool call of OpenAI's computer tool has "kind":"computer_call" and its arguments are
 *       {"actions":[...]} or {"action":{...}}, with "pending_safety_checks":[...] when any;
 *   its result (a "tool" message with the same "kind") is the screenshot in "images"[0], with
 *       "acknowledged_safety_checks":[...] when a person acknowledged them; "is_error": true
 *       sends its text to the model too;
 *   an assistant message may keep the reply's output items as they came ("responses_output"),
 *       which go back verbatim (reasoning items included) instead of being rebuilt.
 * tools == NULL (or empty) sends no tools (the text-mode fallback). */

typedef struct al_tool_call {
    char *id; /* as the server gave it; made up ("call_N") when it gave none */
    char *name;
    char *arguments; /* the raw JSON text the model produced (may be invalid JSON) */
    char *kind;      /* NULL: a function call; "computer_call": OpenAI's computer tool */
} al_tool_call;

typedef struct al_model_reply {
    char *text; /* the whole assistant text, UTF-8, never NULL after success */
    al_tool_call *calls;
    size_t ncalls;
    unsigned input_tokens; /* usage as reported; 0 when the server reported none */
    unsigned output_tokens;
    char finish[32]; /* "stop", "tool_calls", "length", "end_turn", "tool_use", ... */
    char *output;    /* the Responses API: the reply's output items (a JSON array), else NULL */
} al_model_reply;

typedef struct al_model_stream_cb {
    /* Called with each piece of assistant text as it arrives; pieces are always whole UTF-8
     * characters (a character split across network chunks is held back until complete). */
    void (*text)(void *ctx, const char *s, size_t n);
    /* Called when a tool call starts arriving (name known), so a UI can say so. Optional. */
    void (*tool_start)(void *ctx, const char *name);
    void *ctx;
} al_model_stream_cb;

/* Sends the conversation and streams the reply. Errors (negative errno, err->msg one line):
 *   -EACCES       401/403, or a hosted endpoint with no key
 *   -ECONNREFUSED endpoint unreachable (connect failed, DNS failed) after retries
 *   -ETIMEDOUT    request timeout
 *   -ECANCELED    cancel_fd became readable
 *   -ENOTSUP      the server rejected the request because of tools (400 that mentions tools):
 *                 the caller may retry with tools == NULL and the text convention
 *   -EPROTO       malformed reply (bad JSON, an SSE error event, a stream cut mid-reply)
 *   -EIO          any other HTTP error; msg quotes the status and the server's message */
/* Thread-safe (it initialises libcurl once by itself; a program with threads may call
 * curl_global_init() first in main). It never reads cancel_fd: the caller drains it. The
 * timeouts apply to each attempt. A server that ignores "stream" and answers with one JSON
 * object is understood too (the text then arrives as one piece). out is the caller's to free
 * with al_model_reply_free(), and is written only on success. */
/* Whether requests could be sent, asked before a VM boots for them: the configuration whole, a
 * key for a hosted API, and a server on this machine (a local base URL) taking a connection
 * within 2 s. Sends no request; a hosted API is not contacted. 0, else a one-line reason. */
int al_model_check(const al_model_cfg *cfg, al_error *err);
int al_model_chat(const al_model_cfg *cfg, const cJSON *messages, const cJSON *tools,
                  const al_model_stream_cb *cb, al_model_reply *out, al_error *err);
void al_model_reply_free(al_model_reply *r);

/* The neutral assistant message for a reply, ready to append to the conversation. Tool-call
 * arguments that are not valid JSON are stored as {"_raw": "<text>"}. */
cJSON *al_model_reply_message(const al_model_reply *r);

/* ---- Server-Sent Events, exposed for tests and the fuzz target ---- */

typedef struct al_sse al_sse;
/* Called once per complete event; data is the event's data lines joined by '\n' (and
 * NUL-terminated: data[len] == '\0'); event is "message" when the event named none. */
typedef int (*al_sse_event_fn)(void *ctx, const char *event, const char *data, size_t len);
al_sse *al_sse_new(al_sse_event_fn fn, void *ctx);
/* Feeds bytes as they arrive (any split). Returns 0, the callback's non-zero value, or
 * -EMSGSIZE when one event outgrows the limit (4 MiB). */
int al_sse_feed(al_sse *p, const char *buf, size_t len);
void al_sse_free(al_sse *p);
/* The last "id" field seen so far ("" before any): set before the event it belongs to is
 * dispatched, so a callback reads its own event's id. */
const char *al_sse_last_id(const al_sse *p);

#endif

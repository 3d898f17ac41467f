/* The agent loop: a user message goes to the model, code the model proposes runs in the
 * session's VM, its output goes back, until the model answers without code. Also the pieces
 * around it: the system prompt, output truncation, the fenced-code convention for models without
 * tools, saved conversations and YAML profiles.
 *
 * The loop knows nothing about terminals: the front (chat REPL, one-shot run) passes callbacks. */
#ifndef AL_CHAT_H
#define AL_CHAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "airlock.h"
#include "airlock/policy.h"
#include "airlock/text.h"
#include "model.h"
#include "pngio.h" /* al_png_rgba, al_png_fit */

/* Defaults, each a judgement call documented in the README. */
#define AL_CHAT_MAX_TURNS_DEFAULT 20    /* model replies per user message */
#define AL_CHAT_MAX_OUTPUT_DEFAULT 4000 /* bytes of one run's output shown to the model */
#define AL_CHAT_MAX_OUTPUT_MIN 200      /* below this head + tail say nothing useful */
#define AL_CHAT_INPUT_WAIT_MS 3000      /* a run blocked on stdin this long is reported */

typedef struct al_chat_cfg {
    al_model_cfg model;
    bool tools;                           /* false: the fenced-code convention */
    bool auto_run;                        /* run without asking */
    unsigned max_turns;                   /* 0: AL_CHAT_MAX_TURNS_DEFAULT */
    size_t max_output;                    /* 0: AL_CHAT_MAX_OUTPUT_DEFAULT */
    unsigned context_window;              /* tokens; 0: no trimming */
    uint64_t token_budget;                /* tokens per session, input + output; 0: none */
    unsigned run_timeout_s;               /* per run; 0: none */
    const char *system_message;           /* replaces the built-in prompt */
    const char *instructions;             /* appended to it */
    const char *image;                    /* for the prompt and the saved conversation */
    enum al_checkpoint_policy checkpoint; /* when to take one before a run (needs a session
                                             opened with checkpoints unless NEVER) */
    bool vision;                  /* image/png results go back to the model as images (vision.c) */
    bool results_to_ui;           /* a kernel run's results reach the front through ui.result
                                     only (airlockd's events): their text is not also output,
                                     and no figure is written to a file on this machine;
                                     without it figures are copied to the outputs directory
                                     (figures.c) */
    const char *const *net_allow; /* the session's allowlist, for the prompt; NULL or
                                     empty: the VM has no network */
    bool computer; /* the model drives the session's screen, mouse and keyboard (a session
                      opened with a display): the computer tool */
} al_chat_cfg;

enum al_chat_outcome {
    AL_CHAT_DONE = 0,  /* the model answered without code */
    AL_CHAT_MAX_TURNS, /* --max-turns reached */
    AL_CHAT_REPEATED,  /* the model repeated the same code with the same result */
    AL_CHAT_BUDGET,    /* the session's token budget is spent */
    AL_CHAT_DECLINED,  /* the user declined to run the code */
    AL_CHAT_CANCELLED, /* Ctrl-C */
};
const char *al_chat_outcome_str(enum al_chat_outcome o);

/* What the front shows. Every callback is optional. */
typedef struct al_chat_ui {
    void *ctx;
    void (*thinking)(void *ctx, bool on);                        /* waiting for the model */
    void (*text)(void *ctx, const char *s, size_t n);            /* model text, streamed */
    void (*text_end)(void *ctx);                                 /* end of one model reply's text */
    void (*code)(void *ctx, const char *lang, const char *code); /* code about to be offered */
    /* Asks to run; 1 run, 0 decline. May replace *code (a malloc'd string) after editing. */
    int (*confirm)(void *ctx, const char *lang, char **code);
    /* A person acknowledges a safety check the model's vendor attached to a computer action
     * (code, message as the vendor gave them): 1 yes, 0 no. Asked whether or not runs are
     * confirmed; without this callback nothing is acknowledged and the actions do not run. */
    int (*acknowledge)(void *ctx, const char *code, const char *message);
    /* A run begins; cold: it starts LANG's kernel first (seconds under emulation). */
    void (*run_start)(void *ctx, const char *lang, bool cold);
    int (*output)(void *ctx, int stream, const uint8_t *data, size_t n); /* live run output */
    void (*run_end)(void *ctx, const al_exec_result *r, const char *summary);
    /* Each structured result of a kernel run, as it arrives (its text is also output). */
    void (*result)(void *ctx, const al_result *r);
    void (*notice)(void *ctx, const char *msg); /* one line for the user */
    /* The front hands the JSON of each message as it is added (for --json output). */
    void (*message)(void *ctx, const cJSON *msg);
} al_chat_ui;

/* The figures one session copied to the outputs directory (figures.c): the chat's, and those
 * of `airlock exec --kernel`. */
typedef struct al_figures {
    al_session *session; /* names the files; not owned */
    unsigned saved;      /* files written so far */
    uint64_t bytes;      /* their bytes, against AL_FIGURES_SESSION_BYTES_MAX */
} al_figures;

typedef struct al_chat {
    al_chat_cfg cfg;
    al_chat_ui ui;
    al_session *session;         /* not owned */
    cJSON *messages;             /* the neutral conversation, without the system prompt */
    char *system;                /* the system prompt in use */
    char langs[256];             /* space-separated languages the model may use */
    bool kernels;                /* they run in the session's long-lived kernels */
    bool stamped;                /* the guest's "files written since" stamp exists */
    char warm_langs[128];        /* " LANG" for each language whose kernel this chat started */
    al_figures figures;          /* figures copied out so far */
    unsigned screen_w, screen_h; /* computer use: the screen's size when the last was taken */
    unsigned shot_w, shot_h;     /* computer use: the size screenshots are sent at, which the
                                    model's coordinates are pixels of (0: none taken yet) */
    cJSON *images;        /* images of the run in progress for a vision model: [{"media_type",
                             "data"}], moved into its result message */
    struct al_chat_ckpt { /* checkpoints this chat took, for %checkpoints */
        uint32_t id;
        char code[72]; /* the first line of the code that ran after it */
    } ckpts[AL_CHECKPOINTS_MAX];
    unsigned nckpts;
    uint64_t input_tokens; /* spent this session */
    uint64_t output_tokens;
    char id[64];     /* conversation id, "" until saved once */
    char *save_path; /* NULL: not saved */
    int64_t created; /* unix seconds */
    int cancel_fd;   /* the front's Ctrl-C pipe (read end), or -1 */
    size_t net_seen; /* the session's network requests already reported (al_net_requests) */
} al_chat;

/* langs: the session's languages (al_session_languages), or a list for tests. */
int al_chat_init(al_chat *c, const al_chat_cfg *cfg, const al_chat_ui *ui, al_session *s,
                 const char *langs, al_error *err);
void al_chat_free(al_chat *c);
/* One user message and everything that follows from it. A model or network failure is
 * returned as an error with the conversation intact (the user message stays). */
int al_chat_turn(al_chat *c, const char *user_text, enum al_chat_outcome *outcome, al_error *err);
/* Drops the last exchange: the last user message and everything after it. 0, or -ENOENT. */
int al_chat_undo(al_chat *c);
/* Empties the history. */
void al_chat_reset(al_chat *c);
/* %undo with checkpoints: rolls the VM back to the state before the last exchange's first run
 * (when a checkpoint was taken then) and drops the exchange. *rolled_back says whether the VM
 * was reverted. 0, -ENOENT with nothing to undo, or the rollback's error (history kept). */
int al_chat_undo_vm(al_chat *c, bool *rolled_back, al_error *err);
/* %rollback ID: reverts the VM and tells the model what was undone in the next request. */
int al_chat_rollback(al_chat *c, const char *id_or_name, al_error *err);
/* The code that followed a checkpoint this chat took, or "". */
const char *al_chat_checkpoint_code(const al_chat *c, uint32_t id);

/* ---- system prompt ---- */
char *al_chat_system_prompt(const al_chat_cfg *cfg, const char *langs, bool tools);

/* ---- run output shown to the model: head and tail kept, the middle dropped ---- */
typedef struct al_capture {
    size_t limit; /* bytes kept: limit/2 head, the rest tail */
    char *head;
    size_t head_len;
    char *tail; /* ring of tail_cap bytes */
    size_t tail_cap;
    size_t tail_pos; /* next write position in the ring */
    uint64_t total;  /* bytes seen */
} al_capture;
int al_capture_init(al_capture *cap, size_t limit);
void al_capture_add(al_capture *cap, const void *data, size_t n);
/* The kept text, with "[... N bytes omitted ...]" where the middle was dropped; malloc'd. */
char *al_capture_text(const al_capture *cap);
void al_capture_free(al_capture *cap);

/* ---- the fenced-code convention ---- */
/* Finds the first fenced block (``` or ~~~) in text: its info string's first word and the code.
 * Returns 1 found (both malloc'd), 0 none. An unterminated block at the end counts. */
int al_fence_first(const char *text, char **lang, char **code);

/* ---- context window ---- */
/* Rough token estimate of a neutral message (bytes / 4). */
unsigned al_chat_estimate(const cJSON *msg);
/* The messages to send: the newest ones that fit in window tokens besides the system prompt,
 * keeping the latest user message and all after it, never splitting a tool call from its
 * results. Returns a new array (references copied), or NULL with err set when even the
 * system prompt and the latest turn do not fit. window 0: everything. */
cJSON *al_chat_fit(const cJSON *messages, const char *system, unsigned window, al_error *err);

/* ---- figures a run saves, copied to $XDG_DATA_HOME/airlock/outputs (figures.c) ---- */
/* A plot is kilobytes to a few MiB; more is a run filling the host's disk through us. */
#define AL_FIGURE_BYTES_MAX (20ull << 20)
/* All the figures one chat session copies out. */
#define AL_FIGURES_SESSION_BYTES_MAX (100ull << 20)
/* The outputs directory keeps the newest figures within both bounds and deletes older ones
 * after each copy (only airlock's own SESSION-N.ext files). */
#define AL_OUTPUTS_KEEP_FILES 200
#define AL_OUTPUTS_KEEP_BYTES (500ull << 20)

/* Is ext (".png", ".jpg", ".jpeg", ".gif", ".webp", ".svg", ".pdf"; any case) a figure? */
bool al_figure_ext_ok(const char *ext);
/* Do the first bytes at fd make the image kind ext names (SVG: XML text)? */
bool al_figure_magic_ok(int fd, const char *ext);
/* Deletes airlock's older files in dir beyond the newest keep_files or keep_bytes. */
int al_outputs_prune(const char *dir, size_t keep_files, uint64_t keep_bytes, al_error *err);
/* Copies the figure at guest_path to the outputs directory (its name in host) within the
 * bounds above, checks its bytes, then prunes the directory. -ENOTSUP: not a figure's name;
 * -EFBIG, -EDQUOT: over a bound; -EINVAL: not the image it claims (deleted). */
int al_figure_get(al_figures *f, const char *guest_path, char *host, size_t len, al_error *err);
/* Writes an image result (image/png, image/jpeg, image/svg+xml) to the outputs directory
 * within the same bounds; its name in host. */
int al_figure_save(al_figures *f, const al_mime *m, char *host, size_t len, al_error *err);

/* ---- images for a vision model (vision.c) ---- */
/* Vision APIs scale big images down themselves, and bill for them: 1024 px on the longer side
 * keeps a plot legible at a fraction of the tokens. */
#define AL_VISION_SIDE_MAX 1024
/* A PNG sent as is up to this size; a bigger one is re-encoded smaller. */
#define AL_VISION_PNG_MAX (768 * 1024)
/* Images one run sends the model; later ones are only named in the text. */
#define AL_VISION_IMAGES_MAX 4
/* The PNG as base64 (malloc'd) within the bounds above, and its size as sent. */
int al_vision_png(const uint8_t *png, size_t len, char **b64, unsigned *w, unsigned *h,
                  al_error *err);
/* The same with another bound on the longer side (the MCP server's images: 1568 px). */
int al_vision_png_fit(const uint8_t *png, size_t len, unsigned side_max, char **b64, unsigned *w,
                      unsigned *h, al_error *err);
/* The session's screen now as base64 PNG (malloc'd), at most max_edge on its longer side;
 * its sizes in *shot (whose png is NULL). The chat's computer tool and MCP's screenshot. */
int al_vision_screen(al_session *s, unsigned max_edge, char **b64, al_screenshot *shot,
                     al_error *err);
/* Whether a model is known to take images: gpt-4o*, gpt-4.1*, claude-*. */
bool al_vision_model(const char *model);

/* ---- conversations (saved as JSON under $XDG_DATA_HOME/airlock/conversations) ---- */
/* $XDG_DATA_HOME/airlock/SUB (outputs, history live beside the conversations), created. */
int al_data_dir(const char *sub, char *buf, size_t len, al_error *err);
int al_conv_dir(char *buf, size_t len, al_error *err);
/* Writes the conversation atomically; gives it an id on first save. */
int al_conv_save(al_chat *c, al_error *err);
/* Loads a saved conversation (id, or NULL for the newest) into c's history. */
int al_conv_load(al_chat *c, const char *id, al_error *err);
/* Loads from an explicit file path (%load FILE), or saves to one (%save FILE). */
int al_conv_load_file(al_chat *c, const char *path, al_error *err);
int al_conv_save_file(const al_chat *c, const char *path, al_error *err);
typedef struct al_conv_info {
    char id[64];
    int64_t updated;
    char model[128];
    unsigned messages;
    char title[96]; /* the first user message, one line */
} al_conv_info;
int al_conv_list(void (*fn)(void *ctx, const al_conv_info *ci), void *ctx, al_error *err);
/* Open Interpreter's LMC messages ({"role", "type", "format", "content"}) as the neutral
 * conversation: code becomes an "execute" tool call of the assistant message before it, console
 * output that call's result (an image only named). NULL with why on a message without role,
 * type or a text content. Restoring a conversation: airlock chat --jsonl, airlockd's chat. */
cJSON *al_chat_from_lmc(const cJSON *lmc, char *why, size_t len);
/* One LMC chunk {"role", "type", "format"?, ...}: flag 1 adds "start", 2 "end"; content (len
 * bytes, made valid UTF-8) when not NULL. airlock chat --jsonl's and airlockd's oi_listen's. */
cJSON *al_lmc_chunk(const char *role, const char *type, const char *format, const char *content,
                    size_t len, int flag);
/* The conversation as Markdown (%markdown). */
int al_conv_markdown(const al_chat *c, FILE *out, al_error *err);
/* The last `exchanges` exchanges, a line per message (the user's, the model's text and how many
 * blocks it ran in which languages), each cut to one terminal line (made inert), for a resumed
 * chat. */
int al_conv_recap(const al_chat *c, unsigned exchanges, FILE *out, al_error *err);

/* ---- profiles ($XDG_CONFIG_HOME/airlock/profiles/NAME.yaml) ---- */
/* Calls fn for each top-level "key: scalar" pair of the profile, in order. */
int al_profile_load(const char *name_or_path,
                    int (*fn)(void *ctx, const char *key, const char *value, al_error *err),
                    void *ctx, al_error *err);
int al_profile_dir(char *buf, size_t len, al_error *err);

/* Whether an Anthropic model takes Anthropic's newer computer tool (computer_20251124, with
 * zoom): Claude Opus 4.5, and the 4.6 models and later. */
bool al_chat_computer_zoom_tool(const char *model);

/* OpenAI's computer actions (a computer_call's "actions", each {"type": ...}) as a list of
 * al_screen_input's actions, coordinates checked against the w x h screenshot the model saw.
 * NULL, with why set to one line naming the action, when any of them cannot be run. */
cJSON *al_cua_openai_actions(const cJSON *actions, unsigned w, unsigned h, char *why,
                             size_t whylen);

#endif

/* Settings shared by 'airlock chat' and 'airlock run': from a profile first, then the flags. */
#ifndef AIRLOCK_CLI_CHATOPTS_H
#define AIRLOCK_CLI_CHATOPTS_H

#include "chat.h"
#include "cli.h"

/* Named allowlists a profile may define (net-preset-NAME: HOST,...). */
#define CHAT_NET_PRESETS_MAX 16

struct chat_opts {
    al_chat_cfg cfg;
    al_session_opts sess;
    const char *profile;
    char *model, *api_base, *api_key, *system_message, *instructions, *image, *local;
    const char *api_name; /* "openai" | "anthropic" | NULL: from the model's name */
    bool api_key_set;
    bool plain;
    bool verbose;
    int vision;          /* --vision 1, --no-vision 0, -1: by the model's name */
    bool json;           /* run: JSON lines */
    bool jsonl;          /* chat: LMC chunks as JSON lines both ways (lmc.c) */
    const char *workdir; /* --workdir: copied into /workspace, changes offered back at the end */
    enum cli_sync sync;  /* --sync-back */
    unsigned sync_allow; /* --sync-back-git, --sync-back-exec: AL_APPLY_* */
    al_workdir_opts wo;
    bool resume;     /* chat: --resume given */
    char *resume_id; /* NULL: the newest */
    char **rest;     /* non-option arguments (run: the task) */
    int nrest;
    const char *net; /* --net / the profile's net: none, allow=HOST,..., or a preset's name */
    char *net_presets[CHAT_NET_PRESETS_MAX][2]; /* profile net-preset-NAME: HOST,... (owned) */
    int nnet_presets;
    char **net_allow; /* sess.net.allow, made from net (owned) */
    char *owned[32];  /* strings from the profile, freed at the end */
    int nowned;
};

/* Parses profile + flags; prints the reason and returns 2 on a usage error, 0 on success, 1
 * when --help was printed. */
int chat_opts_parse(struct chat_opts *o, struct cli_globals *g, int argc, char **argv,
                    const char *usage, bool is_run);
void chat_opts_free(struct chat_opts *o);
/* --verbose's model notices (al_model_cfg.notice): each line to stderr. */
void chat_model_notice(void *ctx, const char *line);
/* Fills o->cfg.model from the settings and the environment; a missing key for a hosted
 * endpoint is left for the client to report when the model is first called. */
int chat_opts_finish(struct chat_opts *o);

extern const char chat_opts_help[];

#endif

/* Settings for the model loop: a profile (YAML) sets defaults, flags override it. Both go
 * through one function, so a profile key is exactly a long flag name. */
#include "chatopts.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char chat_opts_help[] =
    "Model:\n"
    "      --model NAME          model name (default: gpt-4o-mini, or claude-sonnet-4-5 when\n"
    "                            only ANTHROPIC_API_KEY is set)\n"
    "      --api openai|anthropic|responses\n"
    "                            wire format: Chat Completions, Messages or OpenAI's\n"
    "                            Responses API (default: anthropic for claude-* models)\n"
    "      --api-base URL        endpoint (default: the API's hosted one)\n"
    "      --api-key-file FILE   read the key from FILE ('-': stdin) (default:\n"
    "                            $OPENAI_API_KEY / $ANTHROPIC_API_KEY)\n"
    "      --api-key KEY         the key itself: other local users can read it while\n"
    "                            airlock starts, so prefer the two above\n"
    "      --local [SERVER]      a local server: ollama (localhost:11434, default),\n"
    "                            llamacpp (localhost:8080) or lmstudio (localhost:1234)\n"
    "      --temperature T       sampling temperature\n"
    "      --max-tokens N        longest reply\n"
    "      --context-window N    trim older turns to fit N tokens\n"
    "      --no-tools            code in fenced blocks instead of tool calls\n"
    "      --vision, --no-vision   send image/png results to the model as images (default:\n"
    "                            on for gpt-4o*, gpt-4.1*, claude-*), at most 1024 px a side\n"
    "      --computer            the model sees the VM's screen and drives its mouse and\n"
    "                            keyboard (the computer tool; the session gets a display)\n"
    "      --retries N           retries on 429/5xx/dropped connections (default 3)\n"
    "      --request-timeout S   limit on one model request (default 600)\n"
    "Loop:\n"
    "  -y, --auto-run            run code without asking\n"
    "      --max-turns N         model replies per message (default 20)\n"
    "      --max-output BYTES    output the model sees per run, head and tail (default 4000)\n"
    "      --token-budget N      stop when the session has used N tokens\n"
    "      --run-timeout S       limit on each run (default: none)\n"
    "      --checkpoint auto|always|never  checkpoint the VM before runs (auto: all but those\n"
    "                            proven read-only), so %undo and the model can roll back\n"
    "      --system-message TEXT replace the system prompt\n"
    "      --instructions TEXT   add to the system prompt\n"
    "      --profile NAME        load $XDG_CONFIG_HOME/airlock/profiles/NAME.yaml first\n"
    "                            (default.yaml when present); its keys are these flags' names\n"
    "Files:\n"
    "      --workdir DIR         copy DIR into /workspace; at the end show what changed there\n"
    "      --sync-back ask|yes|no  apply those changes back to DIR (default ask; never outside\n"
    "                            DIR, never through a symlink the guest made)\n"
    "      --sync-back-git       also apply changes under .git/ (its config and hooks run\n"
    "                            on this host; ask mode asks for them separately)\n"
    "      --sync-back-exec      keep the exec bits the guest set (else files come without)\n"
    "      --workdir-limit BYTES most file data copied either way (default 1 GiB)\n"
    "Sandbox:\n"
    "  -i, --image NAME          image (default: debian when built, else tiny)\n"
    "      --transport virtio|ssh  how to reach the guest (default: the image's)\n"
    "      --net none|allow=HOST[,HOST...]|PRESET  network: none (default: no NIC at\n"
    "                            all); HTTP(S) to these hosts (names, *.suffix) through\n"
    "                            a proxy; or a profile's net-preset-PRESET list\n"
    "      --net-limit BYTES     the session's network bytes, both ways (default 1 GiB)\n"
    "  -m, --memory MIB          guest memory\n"
    "      --cpus N              virtual CPUs\n"
    "      --disk-budget MIB     host disk for the VM's disk and checkpoints (default 6144)\n"
    "Output:\n"
    "      --plain               no colours, no spinner\n"
    "      --verbose             show requests (never the key) and run details\n"
    "      --jsonl               (chat) the chat as JSON lines both ways, in Open\n"
    "                            Interpreter's LMC format (airlock(1), CHAT OVER JSON LINES)\n"
    "      --connect URI, --debug, --quiet  as for airlock itself\n";

enum {
    O_MODEL = 256,
    O_API,
    O_API_BASE,
    O_API_KEY,
    O_API_KEY_FILE,
    O_LOCAL,
    O_TEMPERATURE,
    O_MAX_TOKENS,
    O_CONTEXT,
    O_NO_TOOLS,
    O_RETRIES,
    O_REQ_TIMEOUT,
    O_MAX_TURNS,
    O_MAX_OUTPUT,
    O_BUDGET,
    O_RUN_TIMEOUT,
    O_SYSTEM,
    O_INSTRUCTIONS,
    O_PROFILE,
    O_CPUS,
    O_DISK_BUDGET,
    O_TRANSPORT,
    O_PLAIN,
    O_VERBOSE,
    O_JSON,
    O_JSONL,
    O_RESUME,
    O_CONNECT,
    O_DEBUG,
    O_WORKDIR,
    O_SYNC,
    O_SYNC_GIT,
    O_SYNC_EXEC,
    O_WORKDIR_LIMIT,
    O_CHECKPOINT,
    O_VISION,
    O_NO_VISION,
    O_COMPUTER,
    O_NET,
    O_NET_LIMIT,
};

void chat_model_notice(void *ctx, const char *line)
{
    (void)ctx;
    fprintf(stderr, "%s\n", line);
}

static const struct option long_opts[] = {
    {"model", required_argument, NULL, O_MODEL},
    {"api", required_argument, NULL, O_API},
    {"api-base", required_argument, NULL, O_API_BASE},
    {"api-key", required_argument, NULL, O_API_KEY},
    {"api-key-file", required_argument, NULL, O_API_KEY_FILE},
    {"local", optional_argument, NULL, O_LOCAL},
    {"temperature", required_argument, NULL, O_TEMPERATURE},
    {"max-tokens", required_argument, NULL, O_MAX_TOKENS},
    {"context-window", required_argument, NULL, O_CONTEXT},
    {"no-tools", no_argument, NULL, O_NO_TOOLS},
    {"vision", no_argument, NULL, O_VISION},
    {"no-vision", no_argument, NULL, O_NO_VISION},
    {"computer", no_argument, NULL, O_COMPUTER},
    {"retries", required_argument, NULL, O_RETRIES},
    {"request-timeout", required_argument, NULL, O_REQ_TIMEOUT},
    {"auto-run", no_argument, NULL, 'y'},
    {"max-turns", required_argument, NULL, O_MAX_TURNS},
    {"max-output", required_argument, NULL, O_MAX_OUTPUT},
    {"token-budget", required_argument, NULL, O_BUDGET},
    {"run-timeout", required_argument, NULL, O_RUN_TIMEOUT},
    {"system-message", required_argument, NULL, O_SYSTEM},
    {"instructions", required_argument, NULL, O_INSTRUCTIONS},
    {"profile", required_argument, NULL, O_PROFILE},
    {"image", required_argument, NULL, 'i'},
    {"memory", required_argument, NULL, 'm'},
    {"cpus", required_argument, NULL, O_CPUS},
    {"disk-budget", required_argument, NULL, O_DISK_BUDGET},
    {"transport", required_argument, NULL, O_TRANSPORT},
    {"net", required_argument, NULL, O_NET},
    {"net-limit", required_argument, NULL, O_NET_LIMIT},
    {"plain", no_argument, NULL, O_PLAIN},
    {"verbose", no_argument, NULL, O_VERBOSE},
    {"json", no_argument, NULL, O_JSON},
    {"jsonl", no_argument, NULL, O_JSONL},
    {"resume", optional_argument, NULL, O_RESUME},
    {"workdir", required_argument, NULL, O_WORKDIR},
    {"checkpoint", required_argument, NULL, O_CHECKPOINT},
    {"sync-back", required_argument, NULL, O_SYNC},
    {"sync-back-git", no_argument, NULL, O_SYNC_GIT},
    {"sync-back-exec", no_argument, NULL, O_SYNC_EXEC},
    {"workdir-limit", required_argument, NULL, O_WORKDIR_LIMIT},
    {"connect", required_argument, NULL, O_CONNECT},
    {"debug", no_argument, NULL, O_DEBUG},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

static int opt_by_name(const char *key)
{
    char k[64];
    size_t i = 0;
    for (; key[i] && i + 1 < sizeof(k); i++)
        k[i] = key[i] == '_' ? '-' : key[i]; /* max_turns and max-turns both read naturally */
    k[i] = '\0';
    for (const struct option *o = long_opts; o->name; o++)
        if (!strcmp(o->name, k))
            return o->val;
    return -1;
}

static bool parse_uint(const char *v, unsigned long max, unsigned long *out)
{
    char *end;
    errno = 0;
    unsigned long n = strtoul(v, &end, 10);
    if (errno || end == v || *end || *v == '-' || n > max)
        return false;
    *out = n;
    return true;
}

static bool parse_bool(const char *v, bool *out)
{
    static const char *const yes[] = {"true", "yes", "on", "1"}, *const no[] = {"false", "no",
                                                                                "off", "0"};
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(v, yes[i]))
            return *out = true, true;
        if (!strcasecmp(v, no[i]))
            return *out = false, true;
    }
    return false;
}

/* An API key is a few hundred bytes; a file much bigger is the wrong file. */
#define KEY_FILE_MAX 4096

/* Keeps s (a copy) until chat_opts_free. */
static char *keep(struct chat_opts *o, const char *s)
{
    char *copy = strdup(s);
    if (!copy || o->nowned >= (int)(sizeof(o->owned) / sizeof(o->owned[0]))) {
        free(copy);
        fprintf(stderr, "airlock: too many settings\n");
        return NULL;
    }
    return o->owned[o->nowned++] = copy;
}

/* The key in path ('-': stdin), without trailing whitespace; it goes into an HTTP header, so a
 * control character anywhere in it is refused. Prints the reason and returns NULL on failure. */
static char *read_key_file(struct chat_opts *o, const char *path)
{
    bool in = !strcmp(path, "-");
    FILE *f = in ? stdin : fopen(path, "re");
    char buf[KEY_FILE_MAX + 1];
    size_t n = f ? fread(buf, 1, sizeof(buf), f) : 0;
    int e = errno;
    bool failed = !f || ferror(f);
    if (f && !in)
        fclose(f);
    if (failed) {
        fprintf(stderr, "airlock: cannot read the API key from '%s': %s\n", path, strerror(e));
        return NULL;
    }
    if (n > KEY_FILE_MAX) {
        fprintf(stderr, "airlock: '%s' is larger than %d bytes: not an API key\n", path,
                KEY_FILE_MAX);
        return NULL;
    }
    while (n &&
           (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t'))
        n--;
    buf[n] = '\0';
    bool bad = n == 0;
    for (size_t i = 0; i < n; i++)
        bad |= (unsigned char)buf[i] < 0x20 || buf[i] == 0x7f;
    char *key = bad ? NULL : keep(o, buf);
    if (bad)
        fprintf(stderr, "airlock: the API key in '%s' is %s\n", path,
                n ? "more than one line or holds control characters" : "empty");
    explicit_bzero(buf, sizeof(buf));
    return key;
}

/* What a setting group made of one setting. */
enum set_result {
    SET_DONE,     /* applied */
    SET_NOT_MINE, /* for another group */
    SET_BAD,      /* an invalid value, to be reported */
    SET_FAILED,   /* failed, the reason already printed */
};

/* The model's settings; s is the value, b a switch's. */
static enum set_result apply_model(struct chat_opts *o, int opt, char *s, bool b)
{
    unsigned long n;
    switch (opt) {
    case O_MODEL:
        o->model = s;
        return SET_DONE;
    case O_API:
        if (al_api_parse(s) < 0)
            return SET_BAD;
        o->api_name = s;
        return SET_DONE;
    case O_API_BASE:
        o->api_base = s;
        return SET_DONE;
    case O_API_KEY:
        /* Only a flag gets here (profiles refuse keys). argv is what /proc/PID/cmdline shows
         * every local user: the key is copied, and overwritten there. */
        o->api_key = keep(o, s);
        if (!o->api_key)
            return SET_FAILED;
        memset(s, '*', strlen(s));
        o->api_key_set = true;
        fprintf(stderr, "airlock: warning: a key given with --api-key can be read by other "
                        "local users; use $OPENAI_API_KEY, $ANTHROPIC_API_KEY or "
                        "--api-key-file\n");
        return SET_DONE;
    case O_API_KEY_FILE:
        o->api_key = read_key_file(o, s);
        if (!o->api_key)
            return SET_FAILED;
        o->api_key_set = true;
        return SET_DONE;
    case O_LOCAL:
        o->local = s && *s ? s : (char *)"ollama";
        if (!al_provider_local(o->local))
            return SET_BAD;
        return SET_DONE;
    case O_TEMPERATURE: {
        char *end;
        double t = strtod(s, &end);
        if (end == s || *end || t < 0 || t > 2)
            return SET_BAD;
        o->cfg.model.temperature = t;
        o->cfg.model.has_temperature = true;
        return SET_DONE;
    }
    case O_MAX_TOKENS:
        if (!parse_uint(s, 1u << 20, &n))
            return SET_BAD;
        o->cfg.model.max_tokens = (unsigned)n;
        return SET_DONE;
    case O_CONTEXT:
        if (!parse_uint(s, 100000000, &n))
            return SET_BAD;
        o->cfg.context_window = (unsigned)n;
        return SET_DONE;
    case O_NO_TOOLS:
        o->cfg.tools = !b;
        return SET_DONE;
    case O_VISION:
    case O_NO_VISION:
        o->vision = (opt == O_VISION) == b ? 1 : 0;
        return SET_DONE;
    case O_COMPUTER:
        o->cfg.computer = b;
        o->sess.display = b;
        return SET_DONE;
    case O_RETRIES:
        if (!parse_uint(s, 20, &n))
            return SET_BAD;
        o->cfg.model.retries = (unsigned)n;
        return SET_DONE;
    case O_REQ_TIMEOUT:
        if (!parse_uint(s, 86400, &n) || !n)
            return SET_BAD;
        o->cfg.model.timeout_s = (unsigned)n;
        return SET_DONE;
    }
    return SET_NOT_MINE;
}

/* The loop's settings. */
static enum set_result apply_loop(struct chat_opts *o, int opt, char *s, bool b)
{
    unsigned long n;
    switch (opt) {
    case 'y':
        o->cfg.auto_run = b;
        return SET_DONE;
    case O_MAX_TURNS:
        if (!parse_uint(s, 10000, &n) || !n)
            return SET_BAD;
        o->cfg.max_turns = (unsigned)n;
        return SET_DONE;
    case O_MAX_OUTPUT:
        if (!parse_uint(s, 1u << 24, &n) || n < AL_CHAT_MAX_OUTPUT_MIN)
            return SET_BAD;
        o->cfg.max_output = n;
        return SET_DONE;
    case O_BUDGET:
        if (!parse_uint(s, ~0ul, &n))
            return SET_BAD;
        o->cfg.token_budget = n;
        return SET_DONE;
    case O_RUN_TIMEOUT:
        if (!parse_uint(s, 86400 * 7, &n))
            return SET_BAD;
        o->cfg.run_timeout_s = (unsigned)n;
        return SET_DONE;
    case O_SYSTEM:
        o->system_message = s;
        return SET_DONE;
    case O_INSTRUCTIONS:
        o->instructions = s;
        return SET_DONE;
    }
    return SET_NOT_MINE;
}

/* The sandbox's, the files' and the output's settings, and the globals. */
static enum set_result apply_session(struct chat_opts *o, struct cli_globals *g, int opt, char *s,
                                     bool b, bool from_profile)
{
    unsigned long n;
    switch (opt) {
    case 'i':
        o->image = s;
        return SET_DONE;
    case O_TRANSPORT:
        if (al_transport_parse(s, &o->sess.transport, NULL) < 0)
            return SET_BAD;
        return SET_DONE;
    case O_NET:
        o->net = s; /* resolved once the profile's presets are all known (net_resolve) */
        return SET_DONE;
    case O_NET_LIMIT: {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(s, &end, 10);
        if (errno || end == s || *end || !v)
            return SET_BAD;
        o->sess.net.bytes_max = v;
        return SET_DONE;
    }
    case 'm':
        if (!parse_uint(s, 1u << 20, &n) || n < 64)
            return SET_BAD;
        o->sess.memory_mib = (unsigned)n;
        return SET_DONE;
    case O_CPUS:
        if (!parse_uint(s, 64, &n) || !n)
            return SET_BAD;
        o->sess.vcpus = (unsigned)n;
        return SET_DONE;
    case O_DISK_BUDGET:
        if (!parse_uint(s, 1u << 24, &n) || !n)
            return SET_BAD;
        o->sess.disk_budget_bytes = (uint64_t)n << 20;
        return SET_DONE;
    case O_PLAIN:
        o->plain = b;
        return SET_DONE;
    case O_VERBOSE:
        o->verbose = b;
        return SET_DONE;
    case O_JSON:
        o->json = b;
        return SET_DONE;
    case O_JSONL:
        o->jsonl = b;
        return SET_DONE;
    case O_RESUME:
        if (from_profile)
            return SET_BAD;
        o->resume = true;
        o->resume_id = s;
        return SET_DONE;
    case O_CONNECT:
        g->connect_uri = s;
        return SET_DONE;
    case O_WORKDIR:
        o->workdir = s;
        return SET_DONE;
    case O_CHECKPOINT: {
        al_error e = {0};
        if (al_checkpoint_policy_parse(s, &o->cfg.checkpoint, &e) < 0)
            return SET_BAD;
        return SET_DONE;
    }
    case O_SYNC:
        if (!strcmp(s, "ask"))
            o->sync = CLI_SYNC_ASK;
        else if (!strcmp(s, "yes"))
            o->sync = CLI_SYNC_YES;
        else if (!strcmp(s, "no"))
            o->sync = CLI_SYNC_NO;
        else
            return SET_BAD;
        return SET_DONE;
    case O_SYNC_GIT:
    case O_SYNC_EXEC: /* flags only: profile_setting refuses them */
        o->sync_allow |= opt == O_SYNC_GIT ? AL_APPLY_VCS : AL_APPLY_EXEC;
        return SET_DONE;
    case O_WORKDIR_LIMIT:
        if (!parse_uint(s, ~0ul >> 1, &n) || !n)
            return SET_BAD;
        o->wo.bytes_max = n;
        return SET_DONE;
    case O_DEBUG:
        g->debug = b;
        return SET_DONE;
    }
    return SET_NOT_MINE;
}

/* A profile's value is copied, to be kept until chat_opts_free; a flag's is argv's own; false
 * with the reason printed when it cannot be kept. */
static bool own_value(struct chat_opts *o, const char *v, bool from_profile, char **out)
{
    char *s = NULL;
    if (from_profile && v) {
        s = strdup(v);
        if (!s || o->nowned >= (int)(sizeof(o->owned) / sizeof(o->owned[0]))) {
            free(s);
            fprintf(stderr, "airlock: profile too large\n");
            return false;
        }
        o->owned[o->nowned++] = s;
    } else {
        s = (char *)v;
    }
    *out = s;
    return true;
}

/* --net (or the profile's net): none, allow=HOST,..., or the name of a net-preset-NAME the
 * profile defines. 0, or 2 with the reason printed. */
static int net_resolve(struct chat_opts *o)
{
    if (!o->net)
        return 0;
    const char *spec = o->net, *hosts = NULL;
    char buf[128];
    for (int i = 0; i < o->nnet_presets; i++)
        if (!strcmp(o->net_presets[i][0], spec))
            hosts = o->net_presets[i][1];
    al_error e = {0};
    int r;
    if (hosts)
        r = al_net_allow_parse(hosts, &o->net_allow, &e);
    else if (!strcmp(spec, "none") || !strncmp(spec, "allow=", 6))
        r = al_net_spec_parse(spec, &o->net_allow, &e);
    else {
        fprintf(stderr,
                "airlock: --net %s: not none, allow=HOST[,HOST...] or a preset of the profile "
                "(net-preset-NAME)\n",
                al_term_escape(spec, buf, sizeof(buf)));
        return 2;
    }
    if (r < 0) {
        cli_error(&e);
        return 2;
    }
    o->sess.net.allow = (const char *const *)o->net_allow;
    o->cfg.net_allow = o->sess.net.allow;
    return 0;
}

/* Switches: a flag means on; a profile says true or false. */
static bool is_switch(int opt)
{
    return opt == 'y' || opt == O_NO_TOOLS || opt == O_PLAIN || opt == O_VERBOSE || opt == O_JSON ||
           opt == O_JSONL || opt == O_DEBUG || opt == O_SYNC_GIT || opt == O_SYNC_EXEC ||
           opt == O_VISION || opt == O_NO_VISION || opt == O_COMPUTER;
}

/* One setting, from a flag (from_profile false) or a profile line. v may be NULL for flags
 * that take no value. Returns 0 or -EINVAL with the reason printed. */
static int apply(struct chat_opts *o, struct cli_globals *g, int opt, const char *name,
                 const char *v, bool from_profile)
{
    bool b = true;
    char *s;
    if (!own_value(o, v, from_profile, &s))
        return -EINVAL;
    enum set_result r = SET_BAD;
    if (!is_switch(opt) || !from_profile || parse_bool(s, &b)) {
        r = apply_model(o, opt, s, b);
        if (r == SET_NOT_MINE)
            r = apply_loop(o, opt, s, b);
        if (r == SET_NOT_MINE)
            r = apply_session(o, g, opt, s, b, from_profile);
    }
    if (r == SET_DONE)
        return 0;
    if (r != SET_FAILED)
        fprintf(stderr, "airlock: %s%s: invalid value '%s'\n",
                from_profile ? "profile setting " : "--", name, v ? v : "");
    return -EINVAL;
}

struct profile_ctx {
    struct chat_opts *o;
    struct cli_globals *g;
};

static int profile_setting(void *ctx, const char *key, const char *value, al_error *err)
{
    struct profile_ctx *pc = ctx;
    err->code = -EINVAL;
    if (!strncmp(key, "net-preset-", 11) && key[11]) {
        struct chat_opts *o = pc->o;
        if (o->nnet_presets >= CHAT_NET_PRESETS_MAX) {
            snprintf(err->msg, sizeof(err->msg), "profile: more than %d net presets",
                     CHAT_NET_PRESETS_MAX);
            return err->code;
        }
        char *name = strdup(key + 11), *hosts = strdup(value ? value : "");
        if (!name || !hosts) {
            free(name);
            free(hosts);
            snprintf(err->msg, sizeof(err->msg), "out of memory");
            return err->code;
        }
        o->net_presets[o->nnet_presets][0] = name;
        o->net_presets[o->nnet_presets++][1] = hosts;
        err->code = 0;
        return 0;
    }
    int opt = opt_by_name(key);
    bool consent = opt == O_SYNC_GIT || opt == O_SYNC_EXEC;
    if (opt < 0 || opt == 'h' || opt == O_PROFILE || opt == O_RESUME || opt == O_API_KEY ||
        consent) {
        /* A key in a file people share and commit is a leak waiting to happen; a consent to
         * what a run may plant is given for that run. */
        snprintf(err->msg, sizeof(err->msg), "profile: unknown setting '%.64s'%s", key,
                 opt == O_API_KEY ? " (keys belong in the environment, not in profiles)"
                 : consent        ? " (a consent for one run: give it on the command line)"
                                  : "");
        return err->code;
    }
    if (apply(pc->o, pc->g, opt, key, value, true) < 0) {
        snprintf(err->msg, sizeof(err->msg), "profile: bad value for '%.64s'", key);
        return err->code;
    }
    err->code = 0;
    return 0;
}

static const char short_opts[] = "yi:m:h";

int chat_opts_parse(struct chat_opts *o, struct cli_globals *g, int argc, char **argv,
                    const char *usage, bool is_run)
{
    memset(o, 0, sizeof(*o));
    o->sess = (al_session_opts)AL_SESSION_OPTS_INIT;
    o->wo = (al_workdir_opts)AL_WORKDIR_OPTS_INIT;
    o->cfg.tools = true;
    o->cfg.model.retries = 3;
    o->vision = -1;
    o->cfg.model.cancel_fd = -1;
    /* First pass: only --profile, so the flags can override what it sets. */
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, short_opts, long_opts, NULL)) != -1)
        if (c == O_PROFILE)
            o->profile = optarg;
    optind = 0;
    const char *profile = o->profile;
    char dflt[AL_PATH_MAX];
    if (!profile) {
        al_error e = {0};
        char dir[AL_PATH_MAX];
        if (al_profile_dir(dir, sizeof(dir), &e) == 0 &&
            al_pathf(dflt, sizeof(dflt), "%s/default.yaml", dir) == 0 && access(dflt, F_OK) == 0)
            profile = dflt;
    }
    if (profile) {
        al_error e = {0};
        struct profile_ctx pc = {o, g};
        if (al_profile_load(profile, profile_setting, &pc, &e) < 0) {
            cli_error(&e);
            return 2;
        }
    }
    while ((c = getopt_long(argc, argv, short_opts, long_opts, NULL)) != -1) {
        if (c == 'h') {
            fputs(usage, stdout);
            fputs(chat_opts_help, stdout);
            return 1;
        }
        if (c == '?' || c == ':')
            return cli_bad_option(is_run ? "run" : "chat", argc, argv, short_opts, long_opts);
        if (c == O_PROFILE)
            continue;
        if ((c == O_JSON && !is_run) || (c == O_JSONL && is_run) || (c == O_RESUME && is_run)) {
            fprintf(stderr, "airlock: that option is not for this command\n");
            return 2;
        }
        const char *name = "?";
        for (const struct option *lo = long_opts; lo->name; lo++)
            if (lo->val == c)
                name = lo->name;
        if (apply(o, g, c, name, optarg, false) < 0)
            return 2;
    }
    o->rest = argv + optind;
    o->nrest = argc - optind;
    return net_resolve(o);
}

void chat_opts_free(struct chat_opts *o)
{
    for (int i = 0; i < o->nowned; i++) {
        explicit_bzero(o->owned[i], strlen(o->owned[i])); /* a key, perhaps */
        free(o->owned[i]);
    }
    o->nowned = 0;
    for (int i = 0; i < o->nnet_presets; i++) {
        free(o->net_presets[i][0]);
        free(o->net_presets[i][1]);
    }
    o->nnet_presets = 0;
    al_net_allow_free(o->net_allow);
    o->net_allow = NULL;
}

static bool is_set(const char *s)
{
    return s && *s;
}

int chat_opts_finish(struct chat_opts *o)
{
    al_model_cfg *m = &o->cfg.model;
    const char *okey = getenv(al_provider_hosted(AL_API_OPENAI)->key_env);
    const char *akey = getenv(al_provider_hosted(AL_API_ANTHROPIC)->key_env);
    const char *model = o->model;
    enum al_api api = AL_API_OPENAI;
    if (o->api_name)
        api = (enum al_api)al_api_parse(o->api_name);
    else if (model && !strncmp(model, "claude", 6))
        api = AL_API_ANTHROPIC;
    else if (!model && !o->local && !is_set(o->api_base) && !is_set(okey) && is_set(akey))
        api = AL_API_ANTHROPIC;
    const char *base = o->api_base;
    const struct al_provider *p = o->local ? al_provider_local(o->local) : NULL;
    if (p)
        api = p->api;
    else
        p = al_provider_hosted(api);
    if (!base)
        base = p->api_base;
    if (!model)
        model = p->model;
    m->api = api;
    m->api_base = base;
    m->model = model;
    o->cfg.vision = o->vision >= 0 ? o->vision == 1 : al_vision_model(model);
    m->notice = o->verbose ? chat_model_notice : NULL;
    if (o->api_key_set)
        m->api_key = o->api_key;
    else if (!o->local)
        m->api_key = api == AL_API_ANTHROPIC ? akey : okey;
    o->cfg.system_message = o->system_message;
    o->sess.checkpoints = o->cfg.checkpoint != AL_CHECKPOINT_NEVER;
    o->cfg.instructions = o->instructions;
    return 0;
}

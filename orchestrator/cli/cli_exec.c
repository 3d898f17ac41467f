/* airlock exec: boot a fresh VM, run one command, stream its output, destroy the VM. */
#include "airlock-proto.h"
#include "chat.h"
#include "cli.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <openssl/evp.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Code read from stdin must fit in one exec frame with room for the rest of it. */
#define CODE_MAX (200 * 1024)
#define COPIES_MAX 32

static const char usage[] =
    "Usage: airlock exec [OPTIONS] -- CMD [ARGS...]\n"
    "       airlock exec [OPTIONS] --lang LANG -c CODE\n"
    "       airlock exec [OPTIONS] --lang LANG < code\n"
    "\n"
    "Boot a fresh VM, run CMD (or CODE) in it with its output streamed here, destroy the VM.\n"
    "Exits with the command's status, 128+N when signal N ended it, 124 on --timeout,\n"
    "126 when it cannot be executed, 127 when it is not found, 125 when airlock failed.\n"
    "A --get that fails after the command ran is reported; the command's status stands\n"
    "when it is not 0, else the exit status is 125.\n"
    "\n"
    "  -i, --interactive         keep stdin open (docker's -i): with -t the keys typed\n"
    "                            reach the terminal; without -t stdin is always passed\n"
    "  -t, --tty                 run CMD on a terminal of this terminal's size (docker's\n"
    "                            -t): a shell, an editor, a REPL; this terminal is raw\n"
    "                            meanwhile, Ctrl-C and Ctrl-Z are the guest's, and\n"
    "                            " CLI_TTY_LEAVE_HELP "\n"
    "      --image NAME          image to boot (default: $AIRLOCK_IMAGE, else debian\n"
    "                            when built, else tiny)\n"
    "      --transport virtio|ssh  how to reach the guest's agent (default: the image's;\n"
    "                            ssh images get the agent copied in over SFTP)\n"
    "      --net none|allow=HOST[,HOST...]  network: none (default, no NIC at all), or\n"
    "                            HTTP(S) to these hosts (names, *.suffix) through a proxy\n"
    "      --net-limit BYTES     the session's network bytes, both ways (default 1 GiB)\n"
    "  -l, --lang LANG           run code in LANG (sh, ...) instead of a program\n"
    "  -c, --code CODE           the code to run (default with --lang: read stdin)\n"
    "  -k, --kernel              run the code in LANG's stateful kernel (python, shell,\n"
    "                            javascript): a notebook cell; its value and display()\n"
    "                            results print as text; figures are saved to the\n"
    "                            outputs directory, named on stderr\n"
    "      --json                one JSON object per line for each event: stdout, stderr,\n"
    "                            result, error, refused, end (docs/PROTOCOL.md, \"airlock\n"
    "                            exec --json\")\n"
    "      --input-wait SECONDS  interrupt a program that waits this long for input\n"
    "  -e, --env KEY=VALUE       set a variable in the guest (repeatable)\n"
    "  -w, --cwd DIR             working directory in the guest (default /)\n"
    "      --timeout SECONDS     kill the command after this long (default: none)\n"
    "      --output-limit BYTES  keep at most this much of stdout and of stderr each (a\n"
    "                            cut is said on stderr, even with -q; the exit status\n"
    "                            stays the command's)\n"
    "      --put HOST:GUEST      copy a host file into the guest before running\n"
    "      --get GUEST:HOST      copy a guest file out after running (HOST may be a dir)\n"
    "      --get-limit BYTES     largest file --get accepts (default 1 GiB)\n"
    "      --workdir DIR         copy DIR into /workspace (the default cwd) before running;\n"
    "                            afterwards show what changed there\n"
    "      --sync-back ask|yes|no  apply those changes to DIR (default ask: on a terminal)\n"
    "      --sync-back-git       also apply changes under .git/ (its config and hooks run\n"
    "                            on this host; ask mode asks for them separately)\n"
    "      --sync-back-exec      keep the exec bits the guest set (else files come without)\n"
    "      --workdir-limit BYTES   most file data copied either way (default 1 GiB)\n"
    "      --linger SECONDS      keep the session this long after the command, for\n"
    "                            'airlock cp' (a signal ends it sooner)\n"
    "  -m, --memory MIB          guest memory (default: the image's, else 256)\n"
    "      --cpus N              virtual CPUs (default 1)\n"
    "      --disk-budget MIB     host disk the session's disk and checkpoints may use\n"
    "                            (default 6144); over it the VM is paused\n"
    "      --lifetime SECONDS    hard limit on the whole session\n"
    "      --boot-timeout SECONDS  limit on booting to the agent (default 60)\n"
    "  -p, --publish [ADDR:]HOSTPORT:GUESTPORT  forward HOSTPORT here (0: a free one) to\n"
    "                            GUESTPORT on 127.0.0.1 in the guest while the session lives\n"
    "                            (repeatable; docker's -p; 'airlock port' for a running one)\n"
    "      --bind ADDR           where -p listens (default 127.0.0.1: this machine only)\n"
    "      --raw                 write the guest's output to a terminal as is (by default\n"
    "                            control characters are shown, not obeyed; a pipe or a\n"
    "                            file always gets the exact bytes)\n"
    "      --session ID          run in a running session of airlockd instead ('airlock\n"
    "                            session start'; 'airlock exec --session ID --help')\n"
    "      --detach              with --session: start the run, print its id, return\n"
    "                            ('airlock proc')\n"
    "      --connect URI, --debug, -q/--quiet  as for airlock itself\n"
    "  -h, --help                this help\n";

static int cancel_fd = -1; /* cli_cancel_pipe's */

static uint64_t al_now_ms_cli(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}
static volatile sig_atomic_t last_signal;

static void note_signal(int sig)
{
    last_signal = sig;
}

static int setup_signals(void)
{
    int fd = cli_cancel_pipe(note_signal);
    if (fd < 0)
        return fd;
    cancel_fd = fd;
    return 0;
}

static char *read_code(void)
{
    char *buf = malloc(CODE_MAX + 1);
    size_t len = 0;
    if (!buf)
        return NULL;
    for (;;) {
        ssize_t n = read(0, buf + len, CODE_MAX + 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
        if (len > CODE_MAX) {
            fprintf(stderr, "airlock: code on stdin is larger than %d bytes\n", CODE_MAX);
            free(buf);
            return NULL;
        }
    }
    buf[len] = '\0';
    return buf;
}

/* Keeps the session up for airlock cp until the time is up or a signal comes. */
static void linger(unsigned seconds)
{
    uint64_t end = al_now_ms_cli() + (uint64_t)seconds * 1000u;
    for (uint64_t now; (now = al_now_ms_cli()) < end;) {
        struct pollfd p = {cancel_fd, POLLIN, 0};
        int n = poll(&p, 1, (int)(end - now));
        uint8_t sig;
        /* Taken, so that what follows (the workdir's changes) still runs. */
        if (n > 0 && read(cancel_fd, &sig, 1) == 1)
            return;
    }
}

/* Splits "A:B" at the first colon into two non-empty halves. */
/* Everything cmd_exec's options say, and what is built from them. */
struct exec_args {
    al_session_opts so;
    al_exec_opts eo;
    const char *code;
    const char *env[AL_ENV_MAX + 1]; /* NULL-terminated */
    size_t nenv;
    char *puts_[COPIES_MAX][2], *gets_[COPIES_MAX][2];
    size_t nput, nget;
    /* The guest says how big a file is: the host decides how big it may be. */
    uint64_t get_limit;
    bool debug;
    const char *workdir;
    enum cli_sync sync;
    unsigned sync_allow;
    al_workdir_opts wo;
    unsigned linger_s;
    bool raw;
    bool json;                 /* --json: one object per event on stdout */
    bool interactive;          /* -i */
    bool tty;                  /* -t: a pty run */
    struct cli_port ports[16]; /* -p */
    size_t nports;
    const char *bind; /* --bind: the ports' address unless their spec has one */
    char **cmd;       /* the operands after the options */
    int ncmd;
    char *stdin_code;         /* the code read from stdin, owned */
    char **net_allow;         /* --net allow=...: so.net.allow, owned */
    const char *code_argv[2]; /* eo.argv for --lang */
};

/* How an exec option's value is stored: most go straight into a field of exec_args. */
enum opt_kind {
    OPT_STRING, /* const char *: the value */
    OPT_TRUE,   /* bool: true */
    OPT_UINT,   /* unsigned: a number up to max, times scale */
    OPT_U64,    /* uint64_t: a number up to max, times scale */
    OPT_CALL,   /* call(a, value): -1 to go on, else the exit status */
};

struct exec_option {
    const char *name;
    int has_arg; /* getopt's no_argument or required_argument */
    char letter; /* the short form, or 0 */
    enum opt_kind kind;
    size_t off; /* offsetof(struct exec_args, FIELD) for all but OPT_CALL */
    unsigned long max;
    unsigned long scale;
    int (*call)(struct exec_args *a, char *value);
};

static int opt_transport(struct exec_args *a, char *value)
{
    al_error terr = {0};
    if (al_transport_parse(value, &a->so.transport, &terr) < 0) {
        cli_error(&terr);
        return 2;
    }
    return -1;
}

static int opt_net(struct exec_args *a, char *value)
{
    al_error nerr = {0};
    al_net_allow_free(a->net_allow);
    a->net_allow = NULL;
    if (al_net_spec_parse(value, &a->net_allow, &nerr) < 0) {
        cli_error(&nerr);
        return 2;
    }
    a->so.net.allow = (const char *const *)a->net_allow;
    return -1;
}

static int opt_input_wait(struct exec_args *a, char *value)
{
    a->eo.input_wait_ms =
        (unsigned)cli_number("--input-wait", value, AL_INPUT_WAIT_MAX_MS / 1000) * 1000u;
    a->eo.interrupt_on_wait = true;
    return -1;
}

static int opt_env(struct exec_args *a, char *value)
{
    if (!strchr(value, '=') || a->nenv >= AL_ENV_MAX) {
        fprintf(stderr, "airlock: --env wants KEY=VALUE (at most %d)\n", AL_ENV_MAX);
        return 2;
    }
    a->env[a->nenv++] = value;
    return -1;
}

static int opt_copy(const char *name, char *(*slots)[2], size_t *n, char *value)
{
    char *x, *y;
    if (*n >= COPIES_MAX || !cli_split_pair(value, &x, &y)) {
        fprintf(stderr, "airlock: --%s wants SOURCE:DEST\n", name);
        return 2;
    }
    slots[*n][0] = x;
    slots[*n][1] = y;
    (*n)++;
    return -1;
}

static int opt_put(struct exec_args *a, char *value)
{
    return opt_copy("put", a->puts_, &a->nput, value);
}

static int opt_get(struct exec_args *a, char *value)
{
    return opt_copy("get", a->gets_, &a->nget, value);
}

static int opt_sync(struct exec_args *a, char *value)
{
    if (!strcmp(value, "ask") || !strcmp(value, "yes") || !strcmp(value, "no")) {
        a->sync = value[0] == 'a' ? CLI_SYNC_ASK : value[0] == 'y' ? CLI_SYNC_YES : CLI_SYNC_NO;
        return -1;
    }
    fprintf(stderr, "airlock: --sync-back wants ask, yes or no\n");
    return 2;
}

static int opt_sync_git(struct exec_args *a, char *value)
{
    (void)value;
    a->sync_allow |= AL_APPLY_VCS;
    return -1;
}

static int opt_sync_exec(struct exec_args *a, char *value)
{
    (void)value;
    a->sync_allow |= AL_APPLY_EXEC;
    return -1;
}

static int opt_publish(struct exec_args *a, char *value)
{
    if (a->nports >= sizeof(a->ports) / sizeof(a->ports[0])) {
        fprintf(stderr, "airlock: at most %zu -p\n", sizeof(a->ports) / sizeof(a->ports[0]));
        return 2;
    }
    if (cli_publish_parse(value, &a->ports[a->nports]) < 0)
        return 2;
    a->nports++;
    return -1;
}

static int opt_help(struct exec_args *a, char *value)
{
    (void)a, (void)value;
    fputs(usage, stdout);
    return 0;
}

#define FIELD(f) offsetof(struct exec_args, f)
// clang-format off
static const struct exec_option exec_options[] = {
    {"image",          required_argument, 0,   OPT_STRING, FIELD(so.image),             0,         0,        NULL},
    {"interactive",    no_argument,       'i', OPT_TRUE,   FIELD(interactive),          0,         0,        NULL},
    {"tty",            no_argument,       't', OPT_TRUE,   FIELD(tty),                  0,         0,        NULL},
    {"transport",      required_argument, 0,   OPT_CALL,   0,                           0,         0,        opt_transport},
    {"net",            required_argument, 0,   OPT_CALL,   0,                           0,         0,        opt_net},
    {"net-limit",      required_argument, 0,   OPT_U64,    FIELD(so.net.bytes_max),     ~0ul >> 1, 1,        NULL},
    {"lang",           required_argument, 'l', OPT_STRING, FIELD(eo.lang),              0,         0,        NULL},
    {"code",           required_argument, 'c', OPT_STRING, FIELD(code),                 0,         0,        NULL},
    {"kernel",         no_argument,       'k', OPT_TRUE,   FIELD(eo.kernel),            0,         0,        NULL},
    {"input-wait",     required_argument, 0,   OPT_CALL,   0,                           0,         0,        opt_input_wait},
    {"env",            required_argument, 'e', OPT_CALL,   0,                           0,         0,        opt_env},
    {"cwd",            required_argument, 'w', OPT_STRING, FIELD(eo.cwd),               0,         0,        NULL},
    {"timeout",        required_argument, 0,   OPT_UINT,   FIELD(eo.timeout_ms),        4000000,   1000,     NULL},
    {"output-limit",   required_argument, 0,   OPT_U64,    FIELD(eo.output_cap),        ~0ul >> 1, 1,        NULL},
    {"put",            required_argument, 0,   OPT_CALL,   0,                           0,         0,        opt_put},
    {"get",            required_argument, 0,   OPT_CALL,   0,                           0,         0,        opt_get},
    {"get-limit",      required_argument, 0,   OPT_U64,    FIELD(get_limit),            ~0ul >> 1, 1,        NULL},
    {"memory",         required_argument, 'm', OPT_UINT,   FIELD(so.memory_mib),        1048576,   1,        NULL},
    {"cpus",           required_argument, 0,   OPT_UINT,   FIELD(so.vcpus),             64,        1,        NULL},
    {"lifetime",       required_argument, 0,   OPT_UINT,   FIELD(so.lifetime_s),        4000000,   1,        NULL},
    {"boot-timeout",   required_argument, 0,   OPT_UINT,   FIELD(so.boot_timeout_ms),   4000000,   1000,     NULL},
    {"disk-budget",    required_argument, 0,   OPT_U64,    FIELD(so.disk_budget_bytes), 1u << 24,  1u << 20, NULL},
    {"connect",        required_argument, 0,   OPT_STRING, FIELD(so.connect_uri),       0,         0,        NULL},
    {"debug",          no_argument,       0,   OPT_TRUE,   FIELD(debug),                0,         0,        NULL},
    {"workdir",        required_argument, 0,   OPT_STRING, FIELD(workdir),              0,         0,        NULL},
    {"sync-back",      required_argument, 0,   OPT_CALL,   0,                           0,         0,        opt_sync},
    {"sync-back-git",  no_argument,       0,   OPT_CALL,   0,                           0,         0,        opt_sync_git},
    {"sync-back-exec", no_argument,       0,   OPT_CALL,   0,                           0,         0,        opt_sync_exec},
    {"workdir-limit",  required_argument, 0,   OPT_U64,    FIELD(wo.bytes_max),         ~0ul >> 1, 1,        NULL},
    {"linger",         required_argument, 0,   OPT_UINT,   FIELD(linger_s),             4000000,   1,        NULL},
    {"raw",            no_argument,       0,   OPT_TRUE,   FIELD(raw),                  0,         0,        NULL},
    {"publish",        required_argument, 'p', OPT_CALL,   0,                           0,         0,        opt_publish},
    {"bind",           required_argument, 0,   OPT_STRING, FIELD(bind),                 0,         0,        NULL},
    {"json",           no_argument,       0,   OPT_TRUE,   FIELD(json),                 0,         0,        NULL},
    {"quiet",          no_argument,       'q', OPT_TRUE,   FIELD(so.quiet),             0,         0,        NULL},
    {"help",           no_argument,       'h', OPT_CALL,   0,                           0,         0,        opt_help},
};
// clang-format on
#define EXEC_OPTIONS (sizeof(exec_options) / sizeof(exec_options[0]))

/* Stores one option's value as its row says; -1 to go on, else the exit status. */
static int exec_option_apply(struct exec_args *a, const struct exec_option *o, char *value)
{
    char *field = (char *)a + o->off;
    char flag[32];
    snprintf(flag, sizeof(flag), "--%s", o->name);
    switch (o->kind) {
    case OPT_STRING:
        *(const char **)field = value;
        break;
    case OPT_TRUE:
        *(bool *)field = true;
        break;
    case OPT_UINT:
        *(unsigned *)field = (unsigned)cli_number(flag, value, o->max) * (unsigned)o->scale;
        break;
    case OPT_U64:
        *(uint64_t *)field = (uint64_t)cli_number(flag, value, o->max) * o->scale;
        break;
    case OPT_CALL:
        return o->call(a, value);
    }
    return -1;
}

/* Parses the options into a; -1 to go on, else the exit status to return at once. */
static int exec_parse_args(int argc, char **argv, struct exec_args *a)
{
    /* getopt_long's tables, made from exec_options: a short form returns its letter, a long
     * one 256 + its row. */
    struct option longs[EXEC_OPTIONS + 1];
    char shorts[2 * EXEC_OPTIONS + 2] = "+";
    size_t ns = 1;
    for (size_t i = 0; i < EXEC_OPTIONS; i++) {
        const struct exec_option *o = &exec_options[i];
        longs[i] = (struct option){o->name, o->has_arg, NULL, o->letter ? o->letter : 256 + (int)i};
        if (o->letter) {
            shorts[ns++] = o->letter;
            if (o->has_arg == required_argument)
                shorts[ns++] = ':';
        }
    }
    longs[EXEC_OPTIONS] = (struct option){0};
    shorts[ns] = '\0';
    int c;
    while ((c = getopt_long(argc, argv, shorts, longs, NULL)) != -1) {
        const struct exec_option *o = NULL;
        for (size_t i = 0; i < EXEC_OPTIONS && !o; i++)
            if (c == (exec_options[i].letter ? exec_options[i].letter : 256 + (int)i))
                o = &exec_options[i];
        if (!o)
            return cli_bad_option("exec", argc, argv, shorts, longs);
        int r = exec_option_apply(a, o, optarg);
        if (r >= 0)
            return r;
    }
    a->cmd = argv + optind;
    a->ncmd = argc - optind;
    return -1;
}

/* Completes a->eo: the environment, and the program or the code (read from stdin when no -c);
 * -1 to go on, else the exit status. */
static int exec_build_opts(struct exec_args *a)
{
    al_exec_opts *eo = &a->eo;
    if (a->interactive && a->ncmd >= 2 && !strcmp(a->cmd[1], "--")) {
        fprintf(stderr, "airlock: -i keeps stdin open (docker's -i); the image is --image %s\n",
                a->cmd[0]);
        return 2;
    }
    if (a->tty && (eo->kernel || a->json)) {
        fprintf(stderr, "airlock: -t runs a program on a terminal: not with %s\n",
                eo->kernel ? "--kernel" : "--json");
        return 2;
    }
    a->env[a->nenv] = NULL;
    eo->env = a->nenv ? a->env : NULL;
    if (eo->lang) {
        if (a->ncmd > 0) {
            fprintf(stderr, "airlock: give code with -c or on stdin, not as arguments\n");
            return 2;
        }
        if (!a->code) {
            a->stdin_code = read_code();
            if (!a->stdin_code)
                return 2;
            a->code = a->stdin_code;
            eo->stdin_fd = -1; /* stdin was the code */
        }
        a->code_argv[0] = a->code;
        eo->argv = a->code_argv;
    } else {
        if (a->code || eo->kernel) {
            fprintf(stderr, "airlock: %s needs --lang\n", a->code ? "-c" : "--kernel");
            return 2;
        }
        if (a->ncmd == 0) {
            /* The image's CMD (its ENTRYPOINT first), as docker run with no command. */
            static al_image img = AL_IMAGE_INIT; /* its cmd is the run's argv until exit */
            al_error ignored = {0};
            if (al_image_load(a->so.image ? a->so.image : al_image_default(), &img, &ignored) < 0 ||
                !img.cmd || !img.cmd[0]) {
                fprintf(stderr, "airlock: exec needs a command (see 'airlock exec --help'); the "
                                "image has no CMD\n");
                return 2;
            }
            eo->argv = (const char *const *)img.cmd;
            return -1;
        }
        eo->argv = (const char *const *)a->cmd;
    }
    return -1;
}

static void print_timing(al_session *s)
{
    al_session_timing_t t = AL_SESSION_TIMING_INIT;
    al_session_timing(s, &t);
    /* Restored from a template: start is libvirt's paused start, "boot to handshake" the state
     * loaded, the resume and the re-handshake; then the guest was made unique. */
    bool restored = al_session_restored(s);
    unsigned ready = t.prepare_ms + (restored ? t.restore_ms : t.start_ms + t.handshake_ms);
    fprintf(stderr,
            "airlock: session %s (agent %s, languages: %s, %s, %u vCPU); ready in %u ms: "
            "prepare %u, start %u, boot to handshake %u%s",
            al_session_name(s), al_session_agent_version(s), al_session_languages(s),
            al_session_kvm(s) ? "kvm" : "emulation", al_session_vcpus(s), ready, t.prepare_ms,
            t.start_ms, t.handshake_ms, restored ? "" : "\n");
    if (restored)
        fprintf(stderr, "; restored from a template, made unique in %u ms\n",
                t.restore_ms - t.start_ms - t.handshake_ms);
}

/* Where a kernel run's results go without --json: the text a REPL shows. */
struct text_results {
    al_exec_opts *eo;   /* its output callback and fds, as for the streams */
    al_figures figures; /* the figures saved to the outputs directory */
};

static int put_stdout(al_exec_opts *eo, const char *p, size_t n)
{
    if (eo->output)
        return eo->output(eo->output_ctx, 1, (const uint8_t *)p, n);
    while (n) {
        ssize_t w = write(eo->stdout_fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return errno == EPIPE ? 0 : -errno;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* An image saved to the outputs directory, named on stderr (as the chat does); its text/plain
 * ("<Figure size 640x480 with 1 Axes>") says nothing more. */
static bool result_figure(struct text_results *t, const al_result *r)
{
    static const char *const kinds[] = {"image/png", "image/jpeg", "image/svg+xml"};
    const al_mime *img = NULL;
    for (size_t i = 0; !img && i < sizeof(kinds) / sizeof(kinds[0]); i++)
        img = al_result_mime(r, kinds[i]);
    if (!img)
        return false;
    char host[AL_PATH_MAX], size[32] = "";
    al_error fe = {0};
    if (r->width)
        snprintf(size, sizeof(size), " %ux%u", r->width, r->height);
    if (al_figure_save(&t->figures, img, host, sizeof(host), &fe) == 0)
        fprintf(stderr, "airlock: figure%s saved: %s\n", size, host);
    else
        fprintf(stderr, "airlock: figure%s not saved: %s\n", size, fe.msg);
    return true;
}

/* text/plain on stdout as the value's line; an image to a file; HTML without text as a note. */
static int result_text(void *ctx, const al_result *r)
{
    struct text_results *t = ctx;
    if (r->kind == AL_RESULT_REFUSED) {
        fprintf(stderr, "airlock: %s\n", r->why);
        return 0;
    }
    if (r->kind == AL_RESULT_ERROR) /* its traceback is on stderr already */
        return 0;
    if (result_figure(t, r))
        return 0;
    const al_mime *m = al_result_mime(r, "text/plain");
    char note[128];
    if (m) {
        int e = put_stdout(t->eo, (const char *)m->data, m->len);
        return e < 0 ? e : put_stdout(t->eo, "\n", 1);
    }
    snprintf(note, sizeof(note), "[%s result, %zu bytes]\n", r->mime[0].type, r->mime[0].len);
    return put_stdout(t->eo, note, strlen(note));
}

/* --json: stdout and stderr chunks as objects, text when they are UTF-8, else base64. */
static int json_line(cJSON *o)
{
    char *text = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!text)
        return -ENOMEM;
    int r = printf("%s\n", text) < 0 ? -EIO : 0;
    free(text);
    fflush(stdout);
    return r;
}

static int json_output(void *ctx, int stream, const uint8_t *data, size_t n)
{
    (void)ctx;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", stream == 1 ? "stdout" : "stderr");
    if (al_utf8_valid(data, n) && !memchr(data, 0, n)) {
        char *s = strndup((const char *)data, n);
        if (!s) {
            cJSON_Delete(o);
            return -ENOMEM;
        }
        cJSON_AddStringToObject(o, "text", s);
        free(s);
    } else {
        char *b = malloc((n + 2) / 3 * 4 + 1);
        if (!b) {
            cJSON_Delete(o);
            return -ENOMEM;
        }
        EVP_EncodeBlock((unsigned char *)b, data, (int)n);
        cJSON_AddStringToObject(o, "base64", b);
        free(b);
    }
    return json_line(o);
}

static int json_result(void *ctx, const al_result *r)
{
    (void)ctx;
    char *text = al_result_json(r);
    if (!text)
        return -ENOMEM;
    printf("%s\n", text);
    free(text);
    fflush(stdout);
    return 0;
}

static void json_end(const al_exec_result *res, int status)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "end");
    cJSON_AddNumberToObject(o, "status", status);
    cJSON_AddStringToObject(o, "how", res->how == AL_EXEC_SIGNALED ? "signal" : "exit");
    cJSON_AddNumberToObject(o, "value", res->value);
    if (res->results.have_count)
        cJSON_AddNumberToObject(o, "execution_count", res->results.execution_count);
    cJSON_AddBoolToObject(o, "error", res->results.error);
    cJSON_AddBoolToObject(o, "timed_out", res->timed_out);
    cJSON_AddBoolToObject(o, "interrupted", res->interrupted);
    cJSON_AddBoolToObject(o, "waited_input", res->waited_input);
    cJSON_AddNumberToObject(o, "duration_ms", (double)res->duration_us / 1000.0);
    json_line(o);
}

/* Runs the command and sets *status from how it ended; negative when the rest is to be skipped
 * (err set, or already reported and cleared). */
static int exec_run(al_session *s, struct exec_args *a, int *status, al_error *err)
{
    al_exec_opts *eo = &a->eo;
    /* A pipe gets the guest's bytes exactly; a terminal gets them with every control
     * character made visible, since the guest may write escape sequences. */
    struct cli_termout tty;
    cli_termout_init(&tty, false);
    struct text_results tr = {eo, {.session = s}};
    if (a->json) {
        eo->output = json_output;
        eo->result = json_result;
    } else {
        if (!a->raw && cli_termout_any(&tty)) {
            eo->output = cli_termout_write;
            eo->output_ctx = &tty;
        }
        eo->result = result_text;
        eo->result_ctx = &tr;
    }
    struct cli_tty term = {.relaying = false};
    if (a->tty) {
        /* The user asked for a terminal: the guest's bytes reach it filtered (cli_tty_open),
         * or with --raw as they are. */
        if (cli_tty_open(&term, a->interactive, eo, err) < 0)
            return err->code;
        if (a->raw)
            eo->output = NULL;
    }
    al_exec_result res = AL_EXEC_RESULT_INIT;
    int r = al_exec(s, eo, &res, err), left = -1;
    if (a->tty) {
        cli_tty_close(&term);
        left = cli_tty_left(&term, -1);
    }
    if (eo->output == cli_termout_write && eo->output_ctx == &tty)
        cli_termout_end(&tty);
    if (r == -ENOENT || r == -EACCES) {
        *status = r == -ENOENT ? EXIT_NOT_FOUND : EXIT_CANNOT_EXEC;
        cli_error(err);
        err->code = 0;
        return r;
    }
    if (r == -ETIMEDOUT && eo->timeout_ms) {
        /* The host's own deadline: the guest did not end the run when it should have. */
        cli_error(err);
        err->code = 0;
        *status = EXIT_TIMED_OUT;
        return r;
    }
    if (r < 0)
        return r;
    if (res.timed_out) {
        fprintf(stderr, "airlock: command timed out after %u s\n", eo->timeout_ms / 1000);
        *status = EXIT_TIMED_OUT;
    } else {
        *status = left >= 0 ? left : res.how == AL_EXEC_SIGNALED ? 128 + res.value : res.value;
    }
    if (a->json)
        json_end(&res, *status);
    if (res.offline)
        fprintf(stderr, "airlock: " AL_OFFLINE_HINT "; allow hosts with --net allow=HOST,... "
                        "(pip: --net allow=" AL_OFFLINE_PIP_HOSTS ")\n");
    if (res.waited_input)
        fprintf(stderr, "airlock: the program waited for input for %u s and was interrupted\n",
                eo->input_wait_ms / 1000);
    /* Not a notice -q hides: what was printed is not all the command wrote. */
    if (res.truncated_stdout || res.truncated_stderr)
        fprintf(stderr,
                "airlock: output cut at %llu bytes per stream (--output-limit); the "
                "exit status is the command's\n",
                (unsigned long long)eo->output_cap);
    return 0;
}

/* The --get copies, after the command ran: a copy that fails is reported, the others are still
 * made, and the command's own status stands when it failed; only a command that succeeded turns
 * into 125 (a script must not take a missing file for success). Negative (err set) only when
 * cancelled; *failed tells whether some copy failed. */
static int exec_copy_out(al_session *s, const struct exec_args *a, int *status, bool *failed,
                         al_error *err)
{
    for (size_t i = 0; i < a->nget; i++) {
        al_error gerr = {0};
        if (al_file_get_max(s, a->gets_[i][0], a->gets_[i][1], a->get_limit, &gerr) < 0) {
            if (gerr.code == -ECANCELED) {
                *err = gerr;
                return gerr.code;
            }
            fprintf(stderr, "airlock: --get failed: %s\n", gerr.msg);
            *failed = true;
            if (*status == 0)
                *status = EXIT_AIRLOCK_FAILED;
        }
    }
    return 0;
}

/* What the run left in /workspace: the changes to DIR into *diff, or (not with -q) just a
 * listing, which an image without /workspace or tar simply does not get. */
static void exec_workdir_changes(al_session *s, struct exec_args *a, bool get_failed,
                                 al_workdir_diff **diff, int *status, al_error *err)
{
    if (a->workdir && al_workdir_diff_new(s, a->workdir, &a->wo, diff, err) < 0) {
        *status = EXIT_AIRLOCK_FAILED;
        return;
    }
    al_error list_err = {0};
    /* The listing is a courtesy: not after a copy failed (the guest may be the reason). */
    if (!a->workdir && !a->so.quiet && !get_failed &&
        al_workdir_diff_new(s, NULL, &a->wo, diff, &list_err) < 0)
        *diff = NULL;
    if (*diff && (a->workdir || al_workdir_diff_count(*diff)))
        cli_changes_print(*diff, a->workdir ? "changes in " AL_WORKDIR_GUEST_DIR
                                            : "files in " AL_WORKDIR_GUEST_DIR
                                              " (not copied out: --workdir or --get do)");
}

/* A session with network: what its proxy refused (each on a line of its own), and with --debug
 * every request. */
static void print_net_request(void *ctx, const al_net_request *r)
{
    const struct exec_args *a = ctx;
    char why[sizeof(r->why) * 3];
    if (!r->allowed)
        fprintf(stderr, "airlock: blocked: %s\n", al_term_escape(r->why, why, sizeof(why)));
    else if (a->debug)
        fprintf(stderr, "airlock: net: %s %s:%u %u %llu bytes\n", r->method, r->host, r->port,
                r->status, (unsigned long long)r->bytes);
}

/* What the host gives the run, checked before a VM boots for it: each --put a readable regular
 * file, each --get's destination a directory or in one, --workdir a directory. 0, else the
 * problem said in one line and airlock's failure status. */
static int exec_check_inputs(const struct exec_args *a)
{
    struct stat st;
    for (size_t i = 0; i < a->nput; i++)
        if (cli_check_put(a->puts_[i][0]) < 0)
            return EXIT_AIRLOCK_FAILED;
    for (size_t i = 0; i < a->nget; i++)
        if (cli_check_get(a->gets_[i][1]) < 0)
            return EXIT_AIRLOCK_FAILED;
    if (a->workdir && (stat(a->workdir, &st) < 0 || !S_ISDIR(st.st_mode))) {
        fprintf(stderr, "airlock: --workdir: '%s' is not a directory%s%s\n", a->workdir,
                errno == ENOENT ? ": " : "", errno == ENOENT ? strerror(errno) : "");
        return EXIT_AIRLOCK_FAILED;
    }
    return 0;
}

/* Boots the session, copies in, runs, copies out; the exit status. */
static int exec_session(struct exec_args *a, al_workdir_diff **diff, al_error *err)
{
    al_session *s = NULL;
    int status = EXIT_AIRLOCK_FAILED;
    bool get_failed = false;
    if (al_session_open(&a->so, &s, err) < 0 || al_session_serve_control(s, err) < 0)
        goto out;
    if (a->debug)
        print_timing(s);
    for (size_t i = 0; i < a->nput; i++)
        if (al_file_put(s, a->puts_[i][0], a->puts_[i][1], err) < 0)
            goto out;
    if (a->workdir && cli_workdir_push(s, a->workdir, &a->wo, a->so.quiet, err) < 0)
        goto out;
    for (size_t i = 0; i < a->nports; i++)
        if (!a->ports[i].bind[0] && a->bind)
            snprintf(a->ports[i].bind, sizeof(a->ports[i].bind), "%s", a->bind);
    if (cli_forwards_open(s, NULL, NULL, a->ports, a->nports, a->so.quiet, err) < 0)
        goto out;
    if (a->workdir && !a->eo.cwd)
        a->eo.cwd = AL_WORKDIR_GUEST_DIR;
    if (exec_run(s, a, &status, err) < 0) {
        /* Interrupted, the run's files are still the user's: the workdir's changes are
         * fetched (and offered, or kept) all the same. */
        if (!a->workdir || err->code != -ECANCELED)
            goto out;
        al_error werr = {0};
        al_session_set_cancel_fd(s, -1);
        exec_workdir_changes(s, a, true, diff, &status, &werr);
        if (werr.code)
            cli_error(&werr);
        goto out;
    }
    if (a->linger_s) {
        char name[64];
        fprintf(stderr,
                "airlock: session %s stays up for %u s (airlock cp %s:PATH ., airlock shell "
                "%s); Ctrl-C ends it sooner\n",
                al_term_escape(al_session_name(s), name, sizeof(name)), a->linger_s, name, name);
        linger(a->linger_s);
    }
    if (exec_copy_out(s, a, &status, &get_failed, err) < 0)
        goto out;
    /* From here on a signal never reaches the guest's tools (the changes' tar). */
    al_session_set_cancel_fd(s, -1);
    exec_workdir_changes(s, a, get_failed, diff, &status, err);
out:
    if (err->code) {
        cli_error(err);
        status = EXIT_AIRLOCK_FAILED;
        /* Cancelled by a signal: exit the way a shell expects. */
        if (last_signal && err->code == -ECANCELED)
            status = 128 + last_signal;
    }
    cli_forwards_close(a->ports, a->nports);
    al_error net_err = {0};
    if (s && al_session_net(s) && !a->so.quiet)
        al_net_requests(s, NULL, print_net_request, a, &net_err);
    al_session_close(s);
    return status;
}

int cmd_exec(struct cli_globals *g, int argc, char **argv)
{
    int shorts = cli_check_docker_shorts(argc, argv);
    if (shorts >= 0)
        return shorts;
    /* In a session of airlockd (--session ID), or in a fresh one of it (--server). */
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
        if (!strcmp(argv[i], "--session") || !strncmp(argv[i], "--session=", 10))
            return cli_remote_exec(g, argc, argv);
    if (cli_remote_wanted(g))
        return cli_remote_exec(g, argc, argv);

    struct exec_args a = {
        .so = {.struct_size = sizeof(al_session_opts),
               .image = NULL,
               .connect_uri = g->connect_uri,
               .quiet = g->quiet},
        .eo = {.struct_size = sizeof(al_exec_opts),
               .stdin_fd = AL_FD_STDIN,
               .stdout_fd = 1,
               .stderr_fd = 2},
        .wo = AL_WORKDIR_OPTS_INIT,
        .get_limit = 1ull << 30,
        .debug = g->debug,
        .sync = CLI_SYNC_ASK,
    };
    int rc = exec_parse_args(argc, argv, &a);
    if (rc >= 0)
        return rc;
    rc = exec_build_opts(&a);
    if (rc >= 0)
        return rc;
    rc = exec_check_inputs(&a);
    if (rc) {
        free(a.stdin_code);
        al_net_allow_free(a.net_allow);
        return rc;
    }

    if (setup_signals() < 0) {
        fprintf(stderr, "airlock: cannot set up signal handling: %s\n", strerror(errno));
        free(a.stdin_code);
        al_net_allow_free(a.net_allow);
        return EXIT_AIRLOCK_FAILED;
    }
    a.so.cancel_fd = cancel_fd;
    a.so.console_to = a.debug ? stderr : NULL;
    a.so.on_notice = cli_print_notice;

    al_error err = {0};
    al_workdir_diff *diff = NULL;
    int status = exec_session(&a, &diff, &err);
    /* The VM is gone before the question: nothing waits on the user's answer. */
    if (diff && a.workdir) {
        al_error serr = {0};
        bool hung_up = last_signal == SIGTERM || last_signal == SIGHUP;
        if (cli_workdir_sync(diff, a.workdir, a.sync, a.sync_allow, hung_up, &serr) < 0 &&
            serr.code) {
            cli_error(&serr);
            status = EXIT_AIRLOCK_FAILED;
        }
    }
    al_workdir_diff_free(diff);
    free(a.stdin_code);
    al_net_allow_free(a.net_allow);
    return status;
}

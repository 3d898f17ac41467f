/* airlock exec: boot a fresh VM, run one command, stream its output, destroy the VM. */
#include "airlock-proto.h"
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    "  -i, --image NAME          image to boot (default: $AIRLOCK_IMAGE, else debian\n"
    "                            when built, else tiny)\n"
    "      --transport virtio|ssh  how to reach the guest's agent (default: the image's;\n"
    "                            ssh images get the agent copied in over SFTP)\n"
    "  -l, --lang LANG           run code in LANG (sh, ...) instead of a program\n"
    "  -c, --code CODE           the code to run (default with --lang: read stdin)\n"
    "  -k, --kernel              run the code in LANG's stateful kernel (python, shell,\n"
    "                            javascript): a REPL-like run, the last value printed\n"
    "      --input-wait SECONDS  interrupt a program that waits this long for input\n"
    "  -e, --env KEY=VALUE       set a variable in the guest (repeatable)\n"
    "  -w, --cwd DIR             working directory in the guest (default /)\n"
    "  -t, --timeout SECONDS     kill the command after this long (default: none)\n"
    "      --output-limit BYTES  keep at most this much of stdout and of stderr each\n"
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
    "      --raw                 write the guest's output to a terminal as is (by default\n"
    "                            control characters are shown, not obeyed; a pipe or a\n"
    "                            file always gets the exact bytes)\n"
    "      --connect URI, --debug, -q  as for airlock itself\n"
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
static bool split_pair(char *arg, char **a, char **b)
{
    char *colon = strchr(arg, ':');
    if (!colon || colon == arg || !colon[1])
        return false;
    *colon = '\0';
    *a = arg;
    *b = colon + 1;
    return true;
}

/* The session's notices (emulation fallback), one line each, made inert for a terminal. */
static void print_notice(void *ctx, const char *msg)
{
    (void)ctx;
    char safe[1024];
    fprintf(stderr, "airlock: notice: %s\n", al_term_escape(msg, safe, sizeof(safe)));
}

int cmd_exec(struct cli_globals *g, int argc, char **argv)
{
    enum {
        OPT_OUTPUT_LIMIT = 256,
        OPT_PUT,
        OPT_GET,
        OPT_CPUS,
        OPT_LIFETIME,
        OPT_DISK_BUDGET,
        OPT_BOOT,
        OPT_CONNECT,
        OPT_DEBUG,
        OPT_WORKDIR,
        OPT_SYNC,
        OPT_WORKDIR_LIMIT,
        OPT_LINGER,
        OPT_INPUT_WAIT,
        OPT_TRANSPORT,
        OPT_SYNC_GIT,
        OPT_SYNC_EXEC,
        OPT_RAW,
        OPT_GET_LIMIT
    };
    static const struct option opts[] = {
        {"image", required_argument, NULL, 'i'},
        {"transport", required_argument, NULL, OPT_TRANSPORT},
        {"lang", required_argument, NULL, 'l'},
        {"code", required_argument, NULL, 'c'},
        {"kernel", no_argument, NULL, 'k'},
        {"input-wait", required_argument, NULL, OPT_INPUT_WAIT},
        {"env", required_argument, NULL, 'e'},
        {"cwd", required_argument, NULL, 'w'},
        {"timeout", required_argument, NULL, 't'},
        {"output-limit", required_argument, NULL, OPT_OUTPUT_LIMIT},
        {"put", required_argument, NULL, OPT_PUT},
        {"get", required_argument, NULL, OPT_GET},
        {"get-limit", required_argument, NULL, OPT_GET_LIMIT},
        {"memory", required_argument, NULL, 'm'},
        {"cpus", required_argument, NULL, OPT_CPUS},
        {"lifetime", required_argument, NULL, OPT_LIFETIME},
        {"boot-timeout", required_argument, NULL, OPT_BOOT},
        {"disk-budget", required_argument, NULL, OPT_DISK_BUDGET},
        {"connect", required_argument, NULL, OPT_CONNECT},
        {"debug", no_argument, NULL, OPT_DEBUG},
        {"workdir", required_argument, NULL, OPT_WORKDIR},
        {"sync-back", required_argument, NULL, OPT_SYNC},
        {"sync-back-git", no_argument, NULL, OPT_SYNC_GIT},
        {"sync-back-exec", no_argument, NULL, OPT_SYNC_EXEC},
        {"workdir-limit", required_argument, NULL, OPT_WORKDIR_LIMIT},
        {"linger", required_argument, NULL, OPT_LINGER},
        {"raw", no_argument, NULL, OPT_RAW},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    al_session_opts so = {.image = NULL, .connect_uri = g->connect_uri, .quiet = g->quiet};
    al_exec_opts eo = {.stdin_fd = 0, .stdout_fd = 1, .stderr_fd = 2};
    const char *code = NULL;
    const char *env[AL_ENV_MAX + 1]; /* NULL-terminated */
    size_t nenv = 0;
    char *puts_[COPIES_MAX][2], *gets_[COPIES_MAX][2];
    size_t nput = 0, nget = 0;
    /* The guest says how big a file is: the host decides how big it may be. */
    uint64_t get_limit = 1ull << 30;
    bool get_failed = false;
    bool debug = g->debug;
    const char *workdir = NULL;
    enum cli_sync sync = CLI_SYNC_ASK;
    unsigned sync_allow = 0;
    al_workdir_opts wo = {0};
    unsigned linger_s = 0;
    bool raw = false;
    int c;
    while ((c = getopt_long(argc, argv, "+i:l:c:e:w:t:m:kqh", opts, NULL)) != -1) {
        switch (c) {
        case 'i':
            so.image = optarg;
            break;
        case OPT_TRANSPORT: {
            al_error terr = {0};
            if (al_transport_parse(optarg, &so.transport, &terr) < 0) {
                cli_error(&terr);
                return 2;
            }
            break;
        }
        case 'l':
            eo.lang = optarg;
            break;
        case 'c':
            code = optarg;
            break;
        case 'k':
            eo.kernel = true;
            break;
        case OPT_INPUT_WAIT:
            eo.input_wait_ms =
                (unsigned)cli_number("--input-wait", optarg, AL_INPUT_WAIT_MAX_MS / 1000) * 1000u;
            eo.interrupt_on_wait = true;
            break;
        case 'e':
            if (!strchr(optarg, '=') || nenv >= AL_ENV_MAX) {
                fprintf(stderr, "airlock: --env wants KEY=VALUE (at most %d)\n", AL_ENV_MAX);
                return 2;
            }
            env[nenv++] = optarg;
            break;
        case 'w':
            eo.cwd = optarg;
            break;
        case 't':
            eo.timeout_ms = (unsigned)cli_number("--timeout", optarg, 4000000) * 1000u;
            break;
        case OPT_GET_LIMIT:
            get_limit = cli_number("--get-limit", optarg, ~0ul >> 1);
            break;
        case OPT_OUTPUT_LIMIT:
            eo.output_cap = cli_number("--output-limit", optarg, ~0ul >> 1);
            break;
        case OPT_PUT:
        case OPT_GET: {
            char *a, *b;
            size_t *n = c == OPT_PUT ? &nput : &nget;
            if (*n >= COPIES_MAX || !split_pair(optarg, &a, &b)) {
                fprintf(stderr, "airlock: --%s wants SOURCE:DEST\n", c == OPT_PUT ? "put" : "get");
                return 2;
            }
            char *(*slot)[2] = c == OPT_PUT ? &puts_[*n] : &gets_[*n];
            (*slot)[0] = a;
            (*slot)[1] = b;
            (*n)++;
            break;
        }
        case 'm':
            so.memory_mib = (unsigned)cli_number("--memory", optarg, 1048576);
            break;
        case OPT_CPUS:
            so.vcpus = (unsigned)cli_number("--cpus", optarg, 64);
            break;
        case OPT_LIFETIME:
            so.lifetime_s = (unsigned)cli_number("--lifetime", optarg, 4000000);
            break;
        case OPT_BOOT:
            so.boot_timeout_ms = (unsigned)cli_number("--boot-timeout", optarg, 4000000) * 1000u;
            break;
        case OPT_DISK_BUDGET:
            so.disk_budget_bytes = (uint64_t)cli_number("--disk-budget", optarg, 1u << 24) << 20;
            break;
        case OPT_CONNECT:
            so.connect_uri = optarg;
            break;
        case OPT_DEBUG:
            debug = true;
            break;
        case OPT_WORKDIR:
            workdir = optarg;
            break;
        case OPT_SYNC:
            if (!strcmp(optarg, "ask") || !strcmp(optarg, "yes") || !strcmp(optarg, "no")) {
                sync = optarg[0] == 'a'   ? CLI_SYNC_ASK
                       : optarg[0] == 'y' ? CLI_SYNC_YES
                                          : CLI_SYNC_NO;
                break;
            }
            fprintf(stderr, "airlock: --sync-back wants ask, yes or no\n");
            return 2;
        case OPT_SYNC_GIT:
            sync_allow |= AL_APPLY_VCS;
            break;
        case OPT_SYNC_EXEC:
            sync_allow |= AL_APPLY_EXEC;
            break;
        case OPT_WORKDIR_LIMIT:
            wo.bytes_max = cli_number("--workdir-limit", optarg, ~0ul >> 1);
            break;
        case OPT_LINGER:
            linger_s = (unsigned)cli_number("--linger", optarg, 4000000);
            break;
        case OPT_RAW:
            raw = true;
            break;
        case 'q':
            so.quiet = true;
            break;
        case 'h':
            fputs(usage, stdout);
            return 0;
        default:
            fputs(usage, stderr);
            return 2;
        }
    }
    env[nenv] = NULL;
    eo.env = nenv ? env : NULL;
    char **cmd = argv + optind;
    int ncmd = argc - optind;

    char *stdin_code = NULL;
    const char *code_argv[2] = {NULL, NULL};
    if (eo.lang) {
        if (ncmd > 0) {
            fprintf(stderr, "airlock: give code with -c or on stdin, not as arguments\n");
            return 2;
        }
        if (!code) {
            stdin_code = read_code();
            if (!stdin_code)
                return 2;
            code = stdin_code;
            eo.stdin_fd = -1; /* stdin was the code */
        }
        code_argv[0] = code;
        eo.argv = code_argv;
    } else {
        if (code || eo.kernel) {
            fprintf(stderr, "airlock: %s needs --lang\n", code ? "-c" : "--kernel");
            return 2;
        }
        if (ncmd == 0) {
            fprintf(stderr, "airlock: exec needs a command (see 'airlock exec --help')\n");
            return 2;
        }
        eo.argv = (const char *const *)cmd;
    }

    if (setup_signals() < 0) {
        fprintf(stderr, "airlock: cannot set up signal handling: %s\n", strerror(errno));
        free(stdin_code);
        return EXIT_AIRLOCK_FAILED;
    }
    so.cancel_fd = cancel_fd;
    so.console_to = debug ? stderr : NULL;
    so.on_notice = print_notice;

    al_error err = {0};
    al_session *s = NULL;
    al_workdir_diff *diff = NULL;
    int status = EXIT_AIRLOCK_FAILED;
    if (al_session_open(&so, &s, &err) < 0 || al_session_serve_control(s, &err) < 0)
        goto out;
    if (debug) {
        al_session_timing_t t;
        al_session_timing(s, &t);
        fprintf(stderr,
                "airlock: session %s (agent %s, languages: %s, %s, %u vCPU); ready in %u ms: "
                "prepare %u, start %u, boot to handshake %u\n",
                al_session_name(s), al_session_agent_version(s), al_session_languages(s),
                al_session_kvm(s) ? "kvm" : "emulation", al_session_vcpus(s),
                t.prepare_ms + t.start_ms + t.handshake_ms, t.prepare_ms, t.start_ms,
                t.handshake_ms);
    }
    for (size_t i = 0; i < nput; i++)
        if (al_file_put(s, puts_[i][0], puts_[i][1], &err) < 0)
            goto out;
    if (workdir && cli_workdir_push(s, workdir, &wo, so.quiet, &err) < 0)
        goto out;
    if (workdir && !eo.cwd)
        eo.cwd = AL_WORKDIR_GUEST_DIR;

    /* A pipe gets the guest's bytes exactly; a terminal gets them with every control
     * character made visible, since the guest may write escape sequences. */
    struct cli_termout tty;
    cli_termout_init(&tty, false);
    if (!raw && cli_termout_any(&tty)) {
        eo.output = cli_termout_write;
        eo.output_ctx = &tty;
    }
    al_exec_result res;
    int r = al_exec(s, &eo, &res, &err);
    if (eo.output)
        cli_termout_end(&tty);
    if (r == -ENOENT || r == -EACCES) {
        status = r == -ENOENT ? EXIT_NOT_FOUND : EXIT_CANNOT_EXEC;
        cli_error(&err);
        err.code = 0;
        goto out;
    }
    if (r == -ETIMEDOUT && eo.timeout_ms) {
        /* The host's own deadline: the guest did not end the run when it should have. */
        cli_error(&err);
        err.code = 0;
        status = EXIT_TIMED_OUT;
        goto out;
    }
    if (r < 0)
        goto out;
    if (res.timed_out) {
        fprintf(stderr, "airlock: command timed out after %u s\n", eo.timeout_ms / 1000);
        status = EXIT_TIMED_OUT;
    } else {
        status = res.how == AL_EXEC_SIGNALED ? 128 + res.value : res.value;
    }
    if (res.waited_input)
        fprintf(stderr, "airlock: the program waited for input for %u s and was interrupted\n",
                eo.input_wait_ms / 1000);
    if (!so.quiet && (res.truncated_stdout || res.truncated_stderr))
        fprintf(stderr, "airlock: notice: output truncated at %llu bytes per stream\n",
                (unsigned long long)eo.output_cap);
    if (linger_s)
        linger(linger_s);
    /* The command ran: a copy that fails now is reported, the others are still made, and the
     * command's own status stands when it failed; only a command that succeeded turns into
     * 125 (a script must not take a missing file for success). */
    for (size_t i = 0; i < nget; i++) {
        al_error gerr = {0};
        if (al_file_get_max(s, gets_[i][0], gets_[i][1], get_limit, &gerr) < 0) {
            if (gerr.code == -ECANCELED) {
                err = gerr;
                goto out;
            }
            fprintf(stderr, "airlock: --get failed: %s\n", gerr.msg);
            get_failed = true;
            if (status == 0)
                status = EXIT_AIRLOCK_FAILED;
        }
    }
    /* What the run left in /workspace: the changes to DIR, or (not with -q) just a listing,
     * which an image without /workspace or tar simply does not get. */
    if (workdir && al_workdir_diff_new(s, workdir, &wo, &diff, &err) < 0) {
        status = EXIT_AIRLOCK_FAILED;
        goto out;
    }
    al_error list_err = {0};
    /* The listing is a courtesy: not after a copy failed (the guest may be the reason). */
    if (!workdir && !so.quiet && !get_failed &&
        al_workdir_diff_new(s, NULL, &wo, &diff, &list_err) < 0)
        diff = NULL;
    if (diff && (workdir || al_workdir_diff_count(diff)))
        cli_changes_print(diff, workdir ? "changes in " AL_WORKDIR_GUEST_DIR
                                        : "files in " AL_WORKDIR_GUEST_DIR
                                          " (not copied out: --workdir or --get do)");
out:
    if (err.code) {
        cli_error(&err);
        status = EXIT_AIRLOCK_FAILED;
        /* Cancelled by a signal: exit the way a shell expects. */
        if (last_signal && err.code == -ECANCELED)
            status = 128 + last_signal;
    }
    al_session_close(s);
    /* The VM is gone before the question: nothing waits on the user's answer. */
    if (diff && workdir) {
        al_error serr = {0};
        if (cli_workdir_sync(diff, workdir, sync, sync_allow, &serr) < 0 && serr.code) {
            cli_error(&serr);
            status = EXIT_AIRLOCK_FAILED;
        }
    }
    al_workdir_diff_free(diff);
    free(stdin_code);
    return status;
}

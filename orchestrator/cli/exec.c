/* airlock exec: boot a fresh VM, run one command, stream its output, destroy the VM. */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    "\n"
    "  -i, --image NAME          image to boot (default: tiny)\n"
    "  -l, --lang LANG           run code in LANG (sh, ...) instead of a program\n"
    "  -c, --code CODE           the code to run (default with --lang: read stdin)\n"
    "  -e, --env KEY=VALUE       set a variable in the guest (repeatable)\n"
    "  -w, --cwd DIR             working directory in the guest (default /)\n"
    "  -t, --timeout SECONDS     kill the command after this long (default: none)\n"
    "      --output-limit BYTES  keep at most this much of stdout and of stderr each\n"
    "      --put HOST:GUEST      copy a host file into the guest before running\n"
    "      --get GUEST:HOST      copy a guest file out after running (HOST may be a dir)\n"
    "  -m, --memory MIB          guest memory (default: the image's, else 256)\n"
    "      --cpus N              virtual CPUs (default 1)\n"
    "      --lifetime SECONDS    hard limit on the whole session\n"
    "      --boot-timeout SECONDS  limit on booting to the agent (default 60)\n"
    "      --connect URI, --debug, -q  as for airlock itself\n"
    "  -h, --help                this help\n";

static int cancel_pipe[2] = {-1, -1};
static volatile sig_atomic_t last_signal;

static void on_signal(int sig)
{
    int saved = errno;
    last_signal = sig;
    uint8_t b = (uint8_t)sig;
    (void)!write(cancel_pipe[1], &b, 1);
    errno = saved;
}

static int setup_signals(void)
{
    if (pipe2(cancel_pipe, O_CLOEXEC | O_NONBLOCK) < 0)
        return -errno;
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
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

int cmd_exec(struct cli_globals *g, int argc, char **argv)
{
    enum { OPT_OUTPUT_LIMIT = 256, OPT_PUT, OPT_GET, OPT_CPUS, OPT_LIFETIME, OPT_BOOT, OPT_CONNECT,
           OPT_DEBUG };
    static const struct option opts[] = {
        {"image", required_argument, NULL, 'i'},
        {"lang", required_argument, NULL, 'l'},
        {"code", required_argument, NULL, 'c'},
        {"env", required_argument, NULL, 'e'},
        {"cwd", required_argument, NULL, 'w'},
        {"timeout", required_argument, NULL, 't'},
        {"output-limit", required_argument, NULL, OPT_OUTPUT_LIMIT},
        {"put", required_argument, NULL, OPT_PUT},
        {"get", required_argument, NULL, OPT_GET},
        {"memory", required_argument, NULL, 'm'},
        {"cpus", required_argument, NULL, OPT_CPUS},
        {"lifetime", required_argument, NULL, OPT_LIFETIME},
        {"boot-timeout", required_argument, NULL, OPT_BOOT},
        {"connect", required_argument, NULL, OPT_CONNECT},
        {"debug", no_argument, NULL, OPT_DEBUG},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    al_session_opts so = {.image = "tiny", .connect_uri = g->connect_uri, .quiet = g->quiet};
    al_exec_opts eo = {.stdin_fd = 0, .stdout_fd = 1, .stderr_fd = 2};
    const char *code = NULL;
    const char *env[129];
    size_t nenv = 0;
    char *puts_[COPIES_MAX][2], *gets_[COPIES_MAX][2];
    size_t nput = 0, nget = 0;
    bool debug = g->debug;
    int c;
    while ((c = getopt_long(argc, argv, "+i:l:c:e:w:t:m:qh", opts, NULL)) != -1) {
        switch (c) {
        case 'i':
            so.image = optarg;
            break;
        case 'l':
            eo.lang = optarg;
            break;
        case 'c':
            code = optarg;
            break;
        case 'e':
            if (!strchr(optarg, '=') || nenv >= 128) {
                fprintf(stderr, "airlock: --env wants KEY=VALUE (at most 128)\n");
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
        case OPT_CONNECT:
            so.connect_uri = optarg;
            break;
        case OPT_DEBUG:
            debug = true;
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
        if (code) {
            fprintf(stderr, "airlock: -c needs --lang\n");
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
    so.cancel_fd = cancel_pipe[0];
    so.console_to = debug ? stderr : NULL;

    al_error err = {0};
    al_session *s = NULL;
    int status = EXIT_AIRLOCK_FAILED;
    if (al_session_open(&so, &s, &err) < 0)
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

    al_exec_result res;
    int r = al_exec(s, &eo, &res, &err);
    if (r == -ENOENT || r == -EACCES) {
        status = r == -ENOENT ? EXIT_NOT_FOUND : EXIT_CANNOT_EXEC;
        cli_error(&err);
        err.code = 0;
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
    if (!so.quiet && (res.truncated_stdout || res.truncated_stderr))
        fprintf(stderr, "airlock: notice: output truncated at %llu bytes per stream\n",
                (unsigned long long)eo.output_cap);
    for (size_t i = 0; i < nget; i++)
        if (al_file_get(s, gets_[i][0], gets_[i][1], &err) < 0) {
            status = EXIT_AIRLOCK_FAILED;
            goto out;
        }
out:
    if (err.code) {
        cli_error(&err);
        status = EXIT_AIRLOCK_FAILED;
        /* Cancelled by a signal: exit the way a shell expects. */
        if (last_signal && err.code == -ECANCELED)
            status = 128 + last_signal;
    }
    al_session_close(s);
    free(stdin_code);
    return status;
}

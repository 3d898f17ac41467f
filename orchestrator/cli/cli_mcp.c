/* airlock mcp: the MCP server (orchestrator/mcp) on stdio, for Claude Code, Codex, Gemini CLI
 * and any MCP client that starts its servers as programs (docs/MCP.md). Newline-delimited
 * JSON-RPC in on stdin, out on stdout and nothing else there; logs on stderr. The sessions are
 * this process's: end of input, SIGINT, SIGTERM or SIGHUP ends them all, VMs included. */
#include "cli.h"

#include "mcp.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>

static const char usage[] =
    "Usage: airlock mcp [--image NAME] [--sessions N] [--memory-max MIB] [--cpus-max N]\n"
    "                   [--lifetime-max SECONDS] [--allow-network]\n"
    "\n"
    "Serves the Model Context Protocol on stdin and stdout, for an agent that runs its MCP\n"
    "servers as programs: 'claude mcp add airlock -- airlock mcp'. The agent's code runs in\n"
    "disposable VMs this process opens (start_session) and destroys when its input ends or it\n"
    "gets SIGINT, SIGTERM or SIGHUP. Tools: start_session, run_code, run_command,\n"
    "start_process, process_output, kill_process, read_file, write_file, list_files,\n"
    "checkpoint, rollback, list_checkpoints, stop_session and more (docs/MCP.md).\n"
    "\n"
    "  --image NAME          start_session's default image\n"
    "  --sessions N          sessions open at once (default 8)\n"
    "  --memory-max MIB      the most memory a session may ask for (default 4096)\n"
    "  --cpus-max N          the most vCPUs a session may ask for (default 4)\n"
    "  --lifetime-max S      every session ends after at most S seconds\n"
    "  --allow-network       let start_session give a session network to the hosts it names\n"
    "                        (HTTP and HTTPS through a proxy; default: no network at all)\n";

struct out {
    pthread_mutex_t mu;
    bool broken; /* stdout is gone */
};

static void send_line(void *ctx, const char *json, bool final)
{
    (void) final;
    struct out *o = ctx;
    if (!json)
        return; /* a cancelled request's end: nothing to write */
    pthread_mutex_lock(&o->mu);
    size_t n = strlen(json);
    if (!o->broken && (al_write_all(1, json, n) < 0 || al_write_all(1, "\n", 1) < 0))
        o->broken = true;
    pthread_mutex_unlock(&o->mu);
}

static void log_line(void *ctx, const char *line)
{
    (void)ctx;
    fprintf(stderr, "airlock mcp: %s\n", line);
}

static bool number(const char *s, unsigned long max, unsigned *out)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (!*s || *end || errno || v > max || s[0] == '-' || s[0] == '+')
        return false;
    *out = (unsigned)v;
    return true;
}

int cmd_mcp(struct cli_globals *g, int argc, char **argv)
{
    static const struct option opts[] = {
        {"image", required_argument, NULL, 'i'},
        {"sessions", required_argument, NULL, 's'},
        {"memory-max", required_argument, NULL, 'm'},
        {"cpus-max", required_argument, NULL, 'p'},
        {"lifetime-max", required_argument, NULL, 'l'},
        {"allow-network", no_argument, NULL, 'n'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    al_mcp_opts o = {.connect_uri = g->connect_uri, .log = log_line};
    int c;
    while ((c = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
        bool ok = true;
        switch (c) {
        case 'h':
            fputs(usage, stdout);
            return 0;
        case 'i':
            o.image = optarg;
            break;
        case 's':
            ok = number(optarg, AL_MCP_SESSIONS_MAX, &o.sessions_max) && o.sessions_max;
            break;
        case 'm':
            ok = number(optarg, 1u << 20, &o.memory_max_mib) && o.memory_max_mib >= 128;
            break;
        case 'p':
            ok = number(optarg, 64, &o.vcpus_max) && o.vcpus_max;
            break;
        case 'l':
            ok = number(optarg, UINT_MAX, &o.lifetime_max_s) && o.lifetime_max_s;
            break;
        case 'n':
            o.network = true;
            break;
        default:
            return cli_bad_option("mcp", argc, argv, "+h", opts);
        }
        if (!ok) {
            fprintf(stderr, "airlock: mcp: --%s: not a usable number: '%s'\n",
                    c == 's'   ? "sessions"
                    : c == 'm' ? "memory-max"
                    : c == 'p' ? "cpus-max"
                               : "lifetime-max",
                    optarg);
            return 2;
        }
    }
    if (optind != argc) {
        fputs(usage, stderr);
        return 2;
    }
    /* The signals that end us arrive on a descriptor, in the loop below; every thread the
     * server starts inherits the mask. A client that goes away closes stdout: EPIPE, not a
     * signal. */
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &mask, NULL);
    signal(SIGPIPE, SIG_IGN);
    int sfd = signalfd(-1, &mask, SFD_CLOEXEC);
    if (sfd < 0) {
        fprintf(stderr, "airlock: mcp: signalfd: %s\n", strerror(errno));
        return EXIT_AIRLOCK_FAILED;
    }
    al_mcp *m = NULL;
    al_error err = {0};
    if (al_mcp_new(&o, &m, &err) < 0) {
        cli_error(&err);
        close(sfd);
        return EXIT_AIRLOCK_FAILED;
    }
    struct out out = {.broken = false};
    pthread_mutex_init(&out.mu, NULL);
    if (!g->quiet)
        fprintf(stderr, "airlock mcp: serving MCP on stdio (airlock %s)\n", AIRLOCK_VERSION);
    /* Lines of at most AL_MCP_MESSAGE_MAX; a longer one is answered with an error and skipped
     * to its newline, without holding it. */
    size_t cap = 64 << 10, len = 0;
    char *buf = malloc(cap);
    bool skipping = false, eof = false;
    const char *why = "end of input";
    int rc = 0;
    while (buf && !eof) {
        struct pollfd p[2] = {{.fd = 0, .events = POLLIN}, {.fd = sfd, .events = POLLIN}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            why = "poll failed";
            rc = EXIT_AIRLOCK_FAILED;
            break;
        }
        if (p[1].revents) {
            struct signalfd_siginfo si;
            if (read(sfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
                why = si.ssi_signo == SIGINT    ? "SIGINT"
                      : si.ssi_signo == SIGTERM ? "SIGTERM"
                                                : "SIGHUP";
                break;
            }
        }
        if (!p[0].revents)
            continue;
        if (len == cap) {
            size_t ncap = cap * 2 > AL_MCP_MESSAGE_MAX + 1 ? AL_MCP_MESSAGE_MAX + 1 : cap * 2;
            char *nb = ncap > cap ? realloc(buf, ncap) : NULL;
            if (!nb) {
                /* Over the bound: answer once, drop what is held, skip to the newline. */
                al_mcp_message(m, buf, AL_MCP_MESSAGE_MAX + 1, send_line, &out);
                len = 0;
                skipping = true;
            } else {
                buf = nb;
                cap = ncap;
            }
        }
        ssize_t n = read(0, buf + len, cap - len);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n <= 0) {
            eof = true;
            n = 0;
        }
        len += (size_t)n;
        size_t start = 0;
        for (size_t i = len - (size_t)n; i < len; i++) {
            if (buf[i] != '\n')
                continue;
            if (!skipping && i > start)
                al_mcp_message(m, buf + start, i - start, send_line, &out);
            skipping = false;
            start = i + 1;
        }
        if (eof && start < len && !skipping)
            al_mcp_message(m, buf + start, len - start, send_line, &out);
        memmove(buf, buf + start, len - start);
        len -= start;
        pthread_mutex_lock(&out.mu);
        bool broken = out.broken;
        pthread_mutex_unlock(&out.mu);
        if (broken) {
            why = "stdout closed";
            break;
        }
    }
    free(buf);
    /* At the end of input the answers still due are given (a client that pipes its requests
     * in reads them), unless a signal says to stop now, or nobody reads them: a client that
     * died closed both ends, and its sessions end now, whatever runs in them. */
    while (eof && al_mcp_pending(m)) {
        struct pollfd p[2] = {{.fd = sfd, .events = POLLIN}, {.fd = 1, .events = 0}};
        if (poll(p, 2, 200) <= 0)
            continue;
        if (p[0].revents) {
            why = "a signal";
            break;
        }
        if (p[1].revents & (POLLERR | POLLHUP)) {
            why = "the client is gone (end of input, and nobody reads stdout)";
            break;
        }
    }
    unsigned pending = al_mcp_pending(m);
    fprintf(stderr, "airlock mcp: %s: ending %s\n", why,
            pending ? "the calls in flight and every session" : "every session");
    al_mcp_free(m);
    pthread_mutex_destroy(&out.mu);
    close(sfd);
    return rc;
}

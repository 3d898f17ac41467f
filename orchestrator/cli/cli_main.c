/* airlock: run code in a disposable VM. Dispatches to the subcommands. */
#include "airlock-proto.h"
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage[] =
    "Usage: airlock [--connect URI] [--debug] [-q] [COMMAND] [ARGS...]\n"
    "\n"
    "Let a language model run code in a disposable virtual machine.\n"
    "\n"
    "Commands:\n"
    "  chat [OPTIONS]                   chat with a model that runs code in a fresh VM (the\n"
    "                                   default when no command is given)\n"
    "  run [OPTIONS] TASK               one task, no questions asked but the y/n for code\n"
    "  conversations                    list saved conversations (continue: --resume ID)\n"
    "  exec [OPTIONS] -- CMD [ARGS...]  run a command in a fresh VM, then destroy it\n"
    "  image ls|build|import|warm|rm    the images in the store: list them, build one\n"
    "        inspect|commit|export-base from its recipe or a Containerfile or OCI image,\n"
    "                                   import a qcow2, build its warm template, remove\n"
    "                                   one, show one, save a session's disk as one\n"
    "  doctor                           check libvirt, KVM and images; say how to fix\n"
    "  gc                               reap VMs and files left by crashed runs\n"
    "  ps                               list the running sessions\n"
    "  cp SRC DST                       copy into or out of a running session\n"
    "                                   (one side SESSION:/path, or :/path)\n"
    "  shell [SESSION]                  a login shell in a running session, or a fresh one\n"
    "  port SESSION GUEST[:HOST]        forward a port of a running session to this machine\n"
    "  session start|ls|stop|extend|fork  sessions of airlockd that outlive a command;\n"
    "                                   then 'exec --session ID'; rm ID is session stop\n"
    "  snapshot save|ls|rm              a session's whole state kept, to start sessions from\n"
    "  volume create|ls|rm              disks that outlive sessions ('session start --volume')\n"
    "  proc ls|logs|kill|wait SESSION   the runs of an airlockd session, which run at\n"
    "                                   once ('exec --session ID --detach -- CMD')\n"
    "  mcp                              serve the Model Context Protocol on stdio, for\n"
    "                                   Claude Code, Codex, Gemini CLI... (docs/MCP.md)\n"
    "\n"
    "Options:\n"
    "  -c, --connect URI   libvirt URI (default: $LIBVIRT_DEFAULT_URI, else qemu:///system\n"
    "                      when reachable, else qemu:///session)\n"
    "  -d, --debug         show the session's name and the guest console\n"
    "  -q, --quiet         no notices\n"
    "  --server URL        exec, ps and session go to airlockd at URL (unix:/path,\n"
    "                      http(s)://host:port; default $AIRLOCK_HOST)\n"
    "  --server-key KEY    airlockd's API key over TCP (better: $AIRLOCK_API_KEY)\n"
    "  -h, --help          this help; 'airlock COMMAND --help' for a command's\n"
    "  -V, --version       print the version\n";

void cli_error(const al_error *err)
{
    fprintf(stderr, "airlock: %s\n", err->msg[0] ? err->msg : strerror(-err->code));
}

unsigned long cli_number(const char *opt, const char *value, unsigned long max)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(value, &end, 10);
    if (errno || end == value || *end || value[0] == '-' || v > max) {
        fprintf(stderr, "airlock: %s wants a number from 0 to %lu, not '%s'\n", opt, max, value);
        exit(2);
    }
    return v;
}

/* A closed stdin/stdout/stderr would let a socket take fd 0, 1 or 2 and be mistaken for
 * them; park /dev/null there instead. */
static void ensure_std_fds(void)
{
    for (int fd = 0; fd < 3; fd++)
        if (fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
            int n = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
            if (n >= 0 && n != fd) {
                dup2(n, fd);
                close(n);
            }
        }
}

static bool is_global_opt(const char *a, bool *takes_value)
{
    *takes_value = !strcmp(a, "-c") || !strcmp(a, "--connect") || !strcmp(a, "--server") ||
                   !strcmp(a, "--server-key");
    return *takes_value || !strncmp(a, "--connect=", 10) || !strncmp(a, "--server=", 9) ||
           !strncmp(a, "--server-key=", 13) || !strcmp(a, "-d") || !strcmp(a, "--debug") ||
           !strcmp(a, "-q") || !strcmp(a, "--quiet") || !strcmp(a, "-h") || !strcmp(a, "--help") ||
           !strcmp(a, "-V") || !strcmp(a, "--version");
}

int main(int argc, char **argv)
{
    ensure_std_fds();
    opterr = 0; /* getopt's own messages: cli_bad_option says it in one line */
    /* 'airlock' alone, or 'airlock --model X ...', is the chat: find where the global options
     * end, and if no command follows, hand the rest to it. */
    int end = 1;
    bool takes;
    while (end < argc && is_global_opt(argv[end], &takes))
        end += takes ? 2 : 1;
    bool to_chat = end >= argc || (argv[end][0] == '-' && strcmp(argv[end], "--"));
    if (to_chat && end > argc)
        to_chat = false; /* -c without its value: let getopt say so */
    int global_argc = to_chat ? (end < argc ? end : argc) : argc;
    static const struct option opts[] = {
        {"connect", required_argument, NULL, 'c'},
        {"debug", no_argument, NULL, 'd'},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {"server", required_argument, NULL, 'S'},
        {"server-key", required_argument, NULL, 'K'},
        {NULL, 0, NULL, 0},
    };
    struct cli_globals g = {0};
    int c;
    /* '+': stop at the subcommand; its options are its own. */
    while ((c = getopt_long(global_argc, argv, "+c:dqhV", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            g.connect_uri = optarg;
            break;
        case 'd':
            g.debug = true;
            break;
        case 'S':
            g.server = optarg;
            break;
        case 'K':
            g.api_key = optarg;
            break;
        case 'q':
            g.quiet = true;
            break;
        case 'h':
            fputs(usage, stdout);
            return 0;
        case 'V':
            printf("airlock %s (protocol %d)\n", AIRLOCK_VERSION, AL_PROTO_VERSION);
            return 0;
        default:
            return cli_bad_option(NULL, global_argc, argv, "+c:dqhV", opts);
        }
    }
    if (to_chat) {
        /* The chat parses from its own argv[0]: keep the program name in front. */
        int sub_argc = argc - global_argc + 1;
        char **sub_argv = argv + global_argc - 1;
        char *saved = sub_argv[0];
        sub_argv[0] = (char *)"chat";
        optind = 0;
        int r = cmd_chat(&g, sub_argc, sub_argv);
        sub_argv[0] = saved;
        return r;
    }
    const char *cmd = argv[optind];
    int sub_argc = argc - optind;
    char **sub_argv = argv + optind;
    optind = 0; /* reset getopt for the subcommand */
    if (!strcmp(cmd, "exec"))
        return cmd_exec(&g, sub_argc, sub_argv);
    if (!strcmp(cmd, "image"))
        return cmd_image(&g, sub_argc, sub_argv);
    if (!strcmp(cmd, "doctor"))
        return cmd_doctor(&g, sub_argc, sub_argv);
    if (!strcmp(cmd, "gc"))
        return cmd_gc(&g, sub_argc, sub_argv);
    if (!strcmp(cmd, "cp"))
        return cmd_cp(&g, sub_argc, sub_argv);
    if (!strcmp(cmd, "shell"))
        return cmd_shell(&g, sub_argc, sub_argv);
    if (!strcmp(cmd, "port"))
        return cmd_port(&g, sub_argc, sub_argv);
    if (!strcmp(cmd, "ps"))
        return cmd_ps(&g, sub_argc, sub_argv);
    if (!strcmp(cmd, "mcp"))
        return cmd_mcp(&g, sub_argc, sub_argv);
    if (!strcmp(cmd, "session"))
        return cli_remote_session(&g, sub_argc, sub_argv);
    if (!strcmp(cmd, "proc"))
        return cli_remote_proc(&g, sub_argc, sub_argv);
    if (!strcmp(cmd, "snapshot"))
        return cli_remote_snapshot(&g, sub_argc, sub_argv);
    if (!strcmp(cmd, "volume"))
        return cli_remote_volume(&g, sub_argc, sub_argv);
    if (!strcmp(cmd, "rm")) {
        sub_argv[0] = (char *)"stop"; /* airlock rm ID... is airlock session stop ID... */
        return cli_remote_session(&g, sub_argc + 1, sub_argv - 1);
    }
    if (!strcmp(cmd, "chat"))
        return cmd_chat(&g, sub_argc, sub_argv);
    if (!strcmp(cmd, "run"))
        return cmd_run(&g, sub_argc, sub_argv);
    if (!strcmp(cmd, "conversations"))
        return cmd_conversations(&g, sub_argc, sub_argv);
    if (!strcmp(cmd, "help")) {
        fputs(usage, stdout);
        return 0;
    }
    static const char *const commands[] = {
        "chat",  "run",  "conversations", "exec", "image", "doctor", "gc",  "ps", "cp",
        "shell", "port", "session",       "proc", "rm",    "help",   "mcp", NULL};
    const char *near = cli_nearest(cmd, strlen(cmd), commands);
    fprintf(stderr, "airlock: unknown command '%s'%s%s%s (see 'airlock --help')\n", cmd,
            near ? "; did you mean '" : "", near ? near : "", near ? "'?" : "");
    return 2;
}

/* airlock-agent: arguments, process setup, then the loop. */
#include "agent.h"

#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>

#define DEFAULT_PORT "org.airlock.agent.0"

/* Large (two frame buffers): static rather than on the stack. */
static struct agent agent;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: airlock-agent [--port NAME | --stdio | --unix PATH | --relay PATH]\n"
            "                     [--root DIR] [--allow-shutdown] [--kernels DIR]\n"
            "                     [--version] [--help]\n"
            "       airlock-agent --watch DIR [--recursive]\n"
            "       airlock-agent --run-as USER[:GROUP] -- PROGRAM [ARGS...]\n"
            "Serves Airlock frames: on the virtio-serial port NAME (default %s),\n"
            "on stdin/stdout, or on a unix socket, where the newest connection wins.\n"
            "--relay PATH copies stdin/stdout to and from the agent on the socket PATH,\n"
            "first starting it (--unix PATH, with --root, --kernels, --allow-shutdown;\n"
            "its log in PATH.log) if none answers: one per SSH session, while the agent\n"
            "and its kernels outlive them.\n"
            "File paths resolve beneath DIR (/).\n"
            "--watch DIR prints DIR's changes as lines (watch.c), for the host to read.\n"
            "--run-as runs PROGRAM as USER (a name of /etc/passwd or a uid), for an image's\n"
            "USER.\n"
            "--allow-shutdown lets SHUTDOWN power off the machine outside --port mode.\n"
            "--kernels DIR: the language kernels' driver scripts (default %s).\n",
            DEFAULT_PORT, KERNELS_DIR);
}

static int setup_signals(struct agent *a)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGIO);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    /* Blocked and read from a signalfd: no handlers, no EINTR races in the loop. */
    if (sigprocmask(SIG_BLOCK, &set, NULL) < 0)
        return -errno;
    a->sig_fd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    return a->sig_fd < 0 ? -errno : 0;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"port", required_argument, NULL, 'p'},     {"stdio", no_argument, NULL, 's'},
        {"unix", required_argument, NULL, 'u'},     {"root", required_argument, NULL, 'r'},
        {"allow-shutdown", no_argument, NULL, 'S'}, {"version", no_argument, NULL, 'V'},
        {"kernels", required_argument, NULL, 'k'},  {"relay", required_argument, NULL, 'R'},
        {"watch", required_argument, NULL, 'W'},    {"recursive", no_argument, NULL, 'c'},
        {"help", no_argument, NULL, 'h'},           {NULL, 0, NULL, 0},
    };
    struct agent *a = &agent;
    enum channel_kind kind = CHANNEL_VIRTIO;
    const char *port = DEFAULT_PORT, *path = NULL, *root = "/";
    struct relay_opts relay = {NULL, NULL, NULL, false};
    bool allow_shutdown = false, recursive = false;
    const char *watch = NULL;
    bool init = getpid() == 1;
    int c, err;

    /* Before getopt, which would take the program's own options for ours. */
    if (!init && argc >= 5 && !strcmp(argv[1], "--run-as") && !strcmp(argv[3], "--"))
        return runas_main(argv[2], argv + 4);
    /* As PID 1 the kernel hands us stray command-line words: never refuse to start on them. */
    opterr = !init;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'p': /* the channel: a virtio port, stdio, or a unix socket (tests) */
        case 's':
        case 'u':
            relay.path = NULL;
            kind = c == 'p' ? CHANNEL_VIRTIO : c == 's' ? CHANNEL_STDIO : CHANNEL_UNIX;
            if (c == 'p')
                port = optarg;
            else if (c == 'u')
                path = optarg;
            break;
        case 'R':
            relay.path = optarg;
            break;
        case 'r':
            root = relay.root = optarg;
            break;
        case 'S':
            allow_shutdown = relay.allow_shutdown = true;
            break;
        case 'k':
            a->kernels_dir = relay.kernels = optarg;
            break;
        case 'W':
            watch = optarg;
            break;
        case 'c':
            recursive = true;
            break;
        case 'V':
            printf("airlock-agent %s protocol %d\n", AIRLOCK_VERSION, AL_PROTO_VERSION);
            return 0;
        case 'h':
            usage(stdout);
            return 0;
        default:
            if (!init) {
                usage(stderr);
                return 2;
            }
        }
    }
    if (optind < argc && !init) {
        usage(stderr);
        return 2;
    }

    /* Not an agent itself: none of the agent's process setup applies. */
    if (relay.path && !init)
        return relay_main(&relay);
    if (watch && !init)
        return watch_main(watch, recursive);

    if (init) {
        init_pid1();
        init_supervise();
    }
    init_common();
    /* A relay starts us through /proc/self/exe, which would name us "exe" in ps and pgrep. */
    if (kind == CHANNEL_UNIX)
        prctl(PR_SET_NAME, "airlock-agent");
    a->root_fd = a->cg_base_fd = a->null_fd = a->sig_fd = a->spare_fd = -1;
    /* Powering off a machine from a test harness on the host would be a nasty surprise:
     * outside a VM's port it takes --allow-shutdown. */
    a->can_shutdown = geteuid() == 0 && (kind == CHANNEL_VIRTIO || allow_shutdown);
    a->can_refresh = geteuid() == 0 && kind == CHANNEL_VIRTIO;

    const char *what = root;
    if ((err = files_open_root(a, root)) == 0 && (what = "signals", err = setup_signals(a)) == 0) {
        cgroup_setup(a);
        what = kind == CHANNEL_UNIX ? path : kind == CHANNEL_STDIO ? "stdio" : port;
        err = kind == CHANNEL_UNIX    ? channel_open_unix(&a->ch, path)
              : kind == CHANNEL_STDIO ? channel_open_stdio(&a->ch)
                                      : channel_open_virtio(&a->ch, port);
    }
    /* Another agent took the socket first (relays starting together): it serves them all. */
    if (err == -EWOULDBLOCK && kind == CHANNEL_UNIX) {
        agent_log("another agent serves %s", path);
        return 0;
    }
    if (err == 0) {
        agent_log("version %s ready%s%s", AIRLOCK_VERSION, init ? " under init" : "",
                  a->cgroup ? ", cgroups" : "");
        what = "loop";
        err = agent_run(a);
    }
    if (err)
        agent_log("cannot set up %s: %s", what, strerror(-err));
    return err ? 1 : 0;
}

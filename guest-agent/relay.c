/* airlock-agent --relay PATH: the guest's end of one SSH session. The agent proper runs as a
 * daemon on the unix socket PATH, so that its kernels outlive connections (a dropped link, a
 * host reconnecting after a snapshot restore); each ssh exec runs a relay that starts the daemon
 * when none answers, then copies bytes both ways between its stdin/stdout and the socket. */
#include "agent.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>

/* Bytes in flight per direction: one read takes a whole DATA frame and then some. */
#define RELAY_BUF (64 * 1024)
/* How long to wait for a daemon just started to listen: its setup takes milliseconds, but a
 * busy guest under emulation is slow. */
#define RELAY_START_WAIT_MS 10000
/* Between connection attempts while it starts. */
#define RELAY_RETRY_MS 20

/* One direction: bytes read from `from` wait in buf[off, len) until written to `to`. */
struct relay_dir {
    int from, to;
    bool eof; /* nothing more comes from `from` */
    size_t off, len;
    uint8_t buf[RELAY_BUF];
};

/* p made absolute: the daemon runs in "/", away from whatever directory ssh left us in. */
static int abs_path(const char *p, char *out, size_t cap)
{
    char cwd[PATH_MAX];
    int n;
    if (p[0] == '/')
        n = snprintf(out, cap, "%s", p);
    else if (getcwd(cwd, sizeof(cwd)))
        n = snprintf(out, cap, "%s/%s", cwd, p);
    else
        return -errno;
    return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}

/* One connection to the daemon; an fd or -errno. Never used as a probe: every connection the
 * daemon accepts replaces the one it serves. */
static int relay_connect(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path))
        return -ENAMETOOLONG;
    strcpy(sa.sun_path, path);
    _cleanup_close_ int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
        return -errno;
    return al_take_fd(&fd);
}

/* Starts `airlock-agent --unix PATH` (this same binary) in a session of its own, with no fd of
 * the ssh session and its stderr in PATH.log: it outlives the relay and the connection. It is
 * our child only so that a start that fails is seen at once; we never have to reap it, as init
 * adopts it when we exit. Returns its pid or -errno. */
static pid_t daemon_start(const struct relay_opts *o)
{
    char dir[PATH_MAX], log[PATH_MAX + 8];
    const char *argv[9] = {"airlock-agent", "--unix", o->path};
    size_t n = 3;

    snprintf(dir, sizeof(dir), "%s", o->path);
    *strrchr(dir, '/') = '\0'; /* the path is absolute */
    if (dir[0] && mkdir(dir, 0700) < 0 && errno != EEXIST)
        return -errno;
    snprintf(log, sizeof(log), "%s.log", o->path);
    _cleanup_close_ int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null_fd < 0)
        return -errno;
    _cleanup_close_ int log_fd =
        open(log, O_WRONLY | O_CREAT | O_APPEND | O_NOCTTY | O_CLOEXEC, 0600);
    if (log_fd < 0)
        return -errno;
    if (o->kernels) {
        argv[n++] = "--kernels";
        argv[n++] = o->kernels;
    }
    if (o->root) {
        argv[n++] = "--root";
        argv[n++] = o->root;
    }
    if (o->allow_shutdown)
        argv[n++] = "--allow-shutdown";

    pid_t pid = fork();
    if (pid != 0)
        return pid < 0 ? -errno : pid;
    /* A new session: no hangup or signal meant for the ssh session's group reaches it. And
     * /proc/self/exe: wherever this binary was copied to, whatever it is called. */
    if (setsid() >= 0 && dup2(null_fd, STDIN_FILENO) >= 0 && dup2(null_fd, STDOUT_FILENO) >= 0 &&
        dup2(log_fd, STDERR_FILENO) >= 0 && chdir("/") == 0)
        execv("/proc/self/exe", (char **)argv);
    agent_log("cannot start the agent: %s", strerror(errno));
    _exit(127);
}

/* A connection to the daemon on o->path, started first when none answers; an fd or -errno
 * (-ECHILD: the daemon we started failed, its log says why). */
static int relay_open(const struct relay_opts *o)
{
    int fd = relay_connect(o->path), status;
    if (fd != -ENOENT && fd != -ECONNREFUSED)
        return fd;
    pid_t pid = daemon_start(o);
    if (pid < 0)
        return pid;
    uint64_t deadline = now_us() + RELAY_START_WAIT_MS * 1000ull;
    while ((fd = relay_connect(o->path)) == -ENOENT || fd == -ECONNREFUSED) {
        /* Exit status 0: another relay's daemon holds the path and will answer. */
        if (pid > 0 && waitpid(pid, &status, WNOHANG) == pid) {
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
                return -ECHILD;
            pid = 0;
        }
        if (now_us() > deadline)
            return fd;
        struct timespec ts = {0, RELAY_RETRY_MS * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return fd;
}

/* Reads into the empty buffer; 0 or -errno. */
static int dir_read(struct relay_dir *d)
{
    ssize_t n = read(d->from, d->buf, sizeof(d->buf));
    if (n < 0)
        return errno == EINTR || errno == EAGAIN ? 0 : -errno;
    d->eof = n == 0;
    d->off = 0;
    d->len = (size_t)n;
    return 0;
}

/* Writes what the buffer holds, or part of it; 0 or -errno. */
static int dir_write(struct relay_dir *d)
{
    ssize_t n = write(d->to, d->buf + d->off, d->len - d->off);
    if (n < 0)
        return errno == EINTR || errno == EAGAIN ? 0 : -errno;
    d->off += (size_t)n;
    if (d->off == d->len)
        d->off = d->len = 0;
    return 0;
}

/* Copies until the daemon's side ends and all it sent is out; 0 or -errno. */
static int relay_copy(int sock)
{
    static struct relay_dir up, down; /* host to agent, agent to host */
    bool shut = false;
    int err;

    up.from = STDIN_FILENO;
    up.to = down.from = sock;
    down.to = STDOUT_FILENO;
    for (;;) {
        /* The host is done: pass its EOF on (the agent then ends the connection), but keep
         * the replies coming. */
        if (up.eof && !up.len && !shut) {
            shutdown(sock, SHUT_WR);
            shut = true;
        }
        if (down.eof && !down.len)
            return 0;
        /* A buffer is either filling or draining, so each fd is polled for one thing. */
        struct pollfd p[4] = {
            {(up.eof || up.len) ? -1 : up.from, POLLIN, 0},
            {up.len ? up.to : -1, POLLOUT, 0},
            {(down.eof || down.len) ? -1 : down.from, POLLIN, 0},
            {down.len ? down.to : -1, POLLOUT, 0},
        };
        if (poll(p, 4, -1) < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        /* A host input that fails is as good as ended; so is a daemon that stopped reading
         * (it took a newer connection): what it sent before closing is still delivered. */
        if (p[0].revents && dir_read(&up) < 0)
            up.eof = true;
        if (p[1].revents && dir_write(&up) < 0) {
            up.eof = true;
            up.off = up.len = 0;
        }
        if (p[2].revents && (err = dir_read(&down)) < 0) {
            /* The daemon closed with our bytes unread: its output came first, this is its end. */
            if (err != -ECONNRESET)
                return err;
            down.eof = true;
        }
        /* EPIPE: the host is gone, nobody is left to tell. */
        if (p[3].revents && (err = dir_write(&down)) < 0)
            return err == -EPIPE ? 0 : err;
    }
}

int relay_main(const struct relay_opts *opts)
{
    char path[PATH_MAX], kernels[PATH_MAX], root[PATH_MAX];
    struct relay_opts o = *opts;
    int fd, err;

    /* Keep fds 0-2 taken, so the socket never lands on one of them. */
    for (int i = 0; i < 3; i++)
        if (fcntl(i, F_GETFD) < 0 && open("/dev/null", O_RDWR) < 0)
            break;
    /* A write to a closed peer must be an EPIPE we handle, not a silent death mid-flush. */
    signal(SIGPIPE, SIG_IGN);
    if ((err = abs_path(o.path, path, sizeof(path))) < 0 ||
        (o.kernels && (err = abs_path(o.kernels, kernels, sizeof(kernels))) < 0) ||
        (o.root && (err = abs_path(o.root, root, sizeof(root))) < 0)) {
        agent_log("cannot resolve the paths of --relay %s: %s", o.path, strerror(-err));
        return 1;
    }
    o.path = path;
    o.kernels = o.kernels ? kernels : NULL;
    o.root = o.root ? root : NULL;

    if ((fd = relay_open(&o)) < 0) {
        if (fd == -ECHILD)
            agent_log("cannot start the agent on %s: see %s.log", path, path);
        else
            agent_log("cannot reach the agent on %s: %s", path, strerror(-fd));
        return 1;
    }
    int fds[] = {STDIN_FILENO, STDOUT_FILENO, fd};
    for (size_t i = 0; i < 3; i++) {
        int fl = fcntl(fds[i], F_GETFL);
        if (fl < 0 || fcntl(fds[i], F_SETFL, fl | O_NONBLOCK) < 0) {
            agent_log("cannot relay for %s: %s", path, strerror(errno));
            return 1;
        }
    }
    if ((err = relay_copy(fd)) < 0) {
        agent_log("relay for %s: %s", path, strerror(-err));
        return 1;
    }
    return 0;
}

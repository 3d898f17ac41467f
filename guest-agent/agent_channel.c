/* The channel to the host: a virtio-serial port, stdio, or a unix socket. Only opening and
 * host presence differ; the loop reads and writes the fds the same way. */
#include "agent.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>

#define VPORT_CLASS "/sys/class/virtio-ports"
/* How often to look for the port while it is not there yet. */
#define PORT_SCAN_MS 5

/* Finds the virtio port called name; writes its device node into dev. */
static int port_find(const char *name, char *dev, size_t cap)
{
    DIR *d = opendir(VPORT_CLASS);
    if (!d)
        return -errno;
    int r = -ENOENT;
    struct dirent *e;
    while (r < 0 && (e = readdir(d))) {
        char path[320], buf[256];
        if (strncmp(e->d_name, "vport", 5))
            continue;
        snprintf(path, sizeof(path), VPORT_CLASS "/%s/name", e->d_name);
        _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
        ssize_t n = fd < 0 ? -1 : read(fd, buf, sizeof(buf) - 1);
        if (n <= 0)
            continue;
        buf[n] = '\0';
        buf[strcspn(buf, "\n")] = '\0';
        if (!strcmp(buf, name)) {
            snprintf(dev, cap, "/dev/%s", e->d_name);
            r = 0;
        }
    }
    closedir(d);
    return r;
}

int channel_open_virtio(struct channel *ch, const char *name)
{
    char dev[320];
    uint64_t deadline = now_us() + AGENT_PORT_WAIT_MS * 1000ull;
    int fd;
    /* The port shows up a little after virtio_console loads: its name arrives from the host
     * in a control message, then devtmpfs makes the node. */
    while ((fd = port_find(name, dev, sizeof(dev)) == 0
                     ? open(dev, O_RDWR | O_NONBLOCK | O_NOCTTY | O_CLOEXEC)
                     : -1) < 0) {
        if (now_us() > deadline)
            return -ENODEV;
        struct timespec ts = {0, PORT_SCAN_MS * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    /* SIGIO (through the loop's signalfd) announces the host connecting. */
    fcntl(fd, F_SETOWN, getpid());
    *ch = (struct channel){CHANNEL_VIRTIO, -1, -1, -1, fd, -1};
    agent_log("serving on %s (%s)", dev, name);
    return 0;
}

int channel_open_stdio(struct channel *ch)
{
    for (int fd = 0; fd < 2; fd++) {
        int fl = fcntl(fd, F_GETFL);
        if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
            return -errno;
    }
    *ch = (struct channel){CHANNEL_STDIO, STDIN_FILENO, STDOUT_FILENO, -1, -1, -1};
    return 0;
}

int channel_open_unix(struct channel *ch, const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    struct stat st;
    if (strlen(path) >= sizeof(sa.sun_path))
        return -ENAMETOOLONG;
    strcpy(sa.sun_path, path);
    /* Relays starting at once may start several agents: the one holding the lock serves, so
     * that no other takes the path over while it runs. */
    char lock[sizeof(sa.sun_path) + 8];
    snprintf(lock, sizeof(lock), "%s.lock", path);
    _cleanup_close_ int lock_fd = open(lock, O_RDWR | O_CREAT | O_NOCTTY | O_CLOEXEC, 0600);
    if (lock_fd < 0 || flock(lock_fd, LOCK_EX | LOCK_NB) < 0)
        return -errno;
    _cleanup_close_ int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    /* A socket left by an earlier agent would make bind fail; anything else is kept. */
    if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
        unlink(path);
    /* A backlog of a few: relays connecting together each get in, the newest last. */
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 4) < 0)
        return -errno;
    *ch = (struct channel){CHANNEL_UNIX, -1, -1, al_take_fd(&fd), -1, al_take_fd(&lock_fd)};
    agent_log("listening on %s", path);
    return 0;
}

int channel_accept(struct channel *ch)
{
    if (ch->in_fd >= 0)
        return 1;
    if (ch->kind == CHANNEL_UNIX) {
        int fd = accept4(ch->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return errno == EAGAIN || errno == EINTR || errno == ECONNABORTED ? 0 : -errno;
        ch->in_fd = ch->out_fd = fd;
        return 1;
    }
    /* virtio-serial: POLLHUP (and read() == 0) while no host is on the other end. */
    struct pollfd p = {ch->port_fd, POLLIN, 0};
    if (poll(&p, 1, 0) < 0)
        return 0;
    bool host = !(p.revents & POLLHUP);
    /* SIGIO only while waiting: with a host, the port would raise it for every packet. */
    int fl = fcntl(ch->port_fd, F_GETFL);
    if (fl >= 0 && !!(fl & O_ASYNC) == host)
        fcntl(ch->port_fd, F_SETFL, host ? fl & ~O_ASYNC : fl | O_ASYNC);
    if (!host)
        return 0;
    ch->in_fd = ch->out_fd = ch->port_fd;
    return 1;
}

void channel_drop(struct channel *ch)
{
    if (ch->kind == CHANNEL_UNIX)
        al_closep(&ch->in_fd);
    if (ch->kind != CHANNEL_STDIO)
        ch->in_fd = ch->out_fd = -1;
}

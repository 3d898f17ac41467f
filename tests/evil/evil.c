/* A hostile program for the evil-guest tests: run as root inside a guest (copied in with --put),
 * it takes over the stock agent as model-written code could — duplicates the agent's channel fd
 * with pidfd_getfd, stops the agent with SIGSTOP — and then speaks the protocol itself.
 *
 *   evil hang                 stop the agent and sleep: no exit ever comes
 *   evil flood ID BYTES       stream BYTES on stdout of request ID, ignoring credits and caps
 *   evil deaf ID              read nothing, and twice a second forge a credit for one chunk
 *                             of request ID's stdin: the host keeps sending until its writes
 *                             find no room
 *   evil getflood ID SIZE     end request ID, then answer the next FILE_GET with SIZE bytes,
 *                             announced as SIZE, sent without waiting for credit
 *   evil getlie ID SIZE       the same, but announce 16 bytes and send SIZE
 *   evil execflood ID SIZE    end request ID, then answer the next EXEC (a workdir pull's tar,
 *                             say) with SIZE bytes of stdout
 *
 * Static, like the agent, since the tiny image has no libc. */
#include "airlock-proto.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

static uint8_t buf[AL_FRAME_HEADER_SIZE + AL_FRAME_PAYLOAD_MAX];

static void die(const char *what)
{
    fprintf(stderr, "evil: %s: %s\n", what, strerror(errno));
    exit(99);
}

static void write_all(int fd, const uint8_t *p, size_t len)
{
    while (len) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            die("write");
        p += n;
        len -= (size_t)n;
    }
}

static void send_msg(int fd, const struct al_msg *m)
{
    int n = al_msg_encode(m, buf, sizeof(buf));
    if (n < 0)
        die("encode");
    write_all(fd, buf, (size_t)n);
}

/* The agent's pid, and a copy of its channel fd (the one open on a virtio port). */
static int take_over(pid_t *agent)
{
    FILE *f = fopen("/run/airlock-agent.pid", "r");
    long pid = 0;
    if (!f || fscanf(f, "%ld", &pid) != 1)
        die("agent pid");
    fclose(f);
    *agent = (pid_t)pid;
    char dir[64];
    snprintf(dir, sizeof(dir), "/proc/%ld/fd", pid);
    DIR *d = opendir(dir);
    if (!d)
        die(dir);
    int target = -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        char link[512], path[256];
        snprintf(link, sizeof(link), "%s/%s", dir, e->d_name);
        ssize_t n = readlink(link, path, sizeof(path) - 1);
        if (n <= 0)
            continue;
        path[n] = '\0';
        if (!strncmp(path, "/dev/vport", 10))
            target = atoi(e->d_name);
    }
    closedir(d);
    if (target < 0)
        die("no channel fd in the agent");
    int pidfd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
    if (pidfd < 0)
        die("pidfd_open");
    int fd = (int)syscall(SYS_pidfd_getfd, pidfd, target, 0);
    if (fd < 0)
        die("pidfd_getfd");
    if (kill((pid_t)pid, SIGSTOP) < 0)
        die("SIGSTOP");
    int fl = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return fd;
}

/* A child that reads and drops whatever the host sends (its credits), so that the flood tests
 * the host's caps rather than its stall timer. */
static void drain(int fd)
{
    if (fork() != 0)
        return;
    static uint8_t sink[65536];
    while (read(fd, sink, sizeof(sink)) > 0)
        ;
    _exit(0);
}

static void flood(int fd, uint32_t id, uint8_t stream, uint64_t bytes)
{
    static uint8_t frame[AL_FRAME_HEADER_SIZE + 1 + AL_DATA_CHUNK_MAX];
    memset(frame + AL_FRAME_HEADER_SIZE + 1, 'A', AL_DATA_CHUNK_MAX);
    while (bytes) {
        uint32_t n = bytes < AL_DATA_CHUNK_MAX ? (uint32_t)bytes : AL_DATA_CHUNK_MAX;
        al_data_header(frame, id, stream, 0, n);
        write_all(fd, frame, AL_FRAME_HEADER_SIZE + 1 + n);
        bytes -= n;
    }
}

static void send_exit(int fd, uint32_t id)
{
    struct al_msg m = {.type = AL_EXIT, .id = id};
    m.u.exit.how = AL_EXIT_CODE;
    send_msg(fd, &m);
}

/* Reads frames from the host until one of this type; returns its id. */
static uint32_t wait_type(int fd, uint8_t type)
{
    static uint8_t rbuf[AL_FRAME_HEADER_SIZE + AL_FRAME_PAYLOAD_MAX];
    struct al_decoder dec;
    al_decoder_init(&dec, rbuf, sizeof(rbuf));
    for (;;) {
        struct al_msg m;
        const char *why = NULL;
        int r = al_decoder_next(&dec, &m, &why);
        if (r < 0) {
            fprintf(stderr, "evil: bad frame from the host: %s\n", why);
            exit(98);
        }
        if (r == 1) {
            if (m.type == type)
                return m.id;
            continue;
        }
        size_t avail;
        uint8_t *space = al_decoder_space(&dec, &avail);
        ssize_t n = read(fd, space, avail);
        if (n <= 0)
            die("read");
        al_decoder_commit(&dec, (size_t)n);
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: evil hang|flood|deaf|getflood|getlie ...\n");
        return 2;
    }
    const char *mode = argv[1];
    uint32_t id = argc > 2 ? (uint32_t)strtoul(argv[2], NULL, 0) : 0;
    uint64_t size = argc > 3 ? strtoull(argv[3], NULL, 0) : 0;
    /* Detach from the run: the host's view of the request is ours to forge now. */
    pid_t agent;
    int fd = take_over(&agent);
    if (!strcmp(mode, "hang")) {
        for (;;)
            pause();
    } else if (!strcmp(mode, "deaf")) {
        /* One chunk's credit at a time: the host has at least that much unacknowledged once it
         * started sending (a larger forged credit could exceed what it sent, which it rightly
         * refuses), and each lets it send a chunk more until its writes find no room. */
        sleep(2);
        for (;;) {
            struct al_msg c = {.type = AL_CREDIT, .id = id};
            c.u.credit.stream = AL_STREAM_STDIN;
            c.u.credit.bytes = AL_DATA_CHUNK_MAX;
            send_msg(fd, &c);
            usleep(500 * 1000);
        }
    } else if (!strcmp(mode, "flood")) {
        drain(fd);
        flood(fd, id, AL_STREAM_STDOUT, size);
        send_exit(fd, id);
    } else if (!strcmp(mode, "getflood") || !strcmp(mode, "getlie")) {
        send_exit(fd, id);
        uint32_t gid = wait_type(fd, AL_FILE_GET);
        drain(fd);
        struct al_msg info = {.type = AL_FILE_INFO, .id = gid};
        info.u.file_info.mode = 0644;
        info.u.file_info.size = !strcmp(mode, "getlie") ? 16 : size;
        send_msg(fd, &info);
        flood(fd, gid, AL_STREAM_FILE, size);
        struct al_msg ok = {.type = AL_OK, .id = gid};
        send_msg(fd, &ok);
    } else if (!strcmp(mode, "execflood")) {
        send_exit(fd, id);
        uint32_t xid = wait_type(fd, AL_EXEC);
        drain(fd);
        flood(fd, xid, AL_STREAM_STDOUT, size);
        send_exit(fd, xid);
    } else {
        fprintf(stderr, "evil: unknown mode %s\n", mode);
        return 2;
    }
    for (;;)
        pause();
}

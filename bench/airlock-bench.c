/* Measurements behind bench/run.py. Prints one JSON object per run.
 *
 *   airlock-bench direct QEMU_BINARY KERNEL INITRD CMDLINE MEMORY_MIB kvm|tcg VCPUS
 *       boots the image with QEMU directly (no libvirt), handshakes with the agent, runs
 *       `true`, kills QEMU: the baseline for airlock's session-ready time.
 *   airlock-bench session [IMAGE] [RTT_COUNT] [STREAM_MIB] [VCPUS]
 *       in one airlock session: exec round trips of `true`, guest->host stream throughput
 *       through the agent, and raw `dd` throughput into a second virtio-serial port of the
 *       same guest. */
#include "airlock-proto.h"
#include "airlock.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define RAW_PORT "org.airlock.bench.raw"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what)
{
    fprintf(stderr, "airlock-bench: %s\n", what);
    exit(1);
}

static int unix_connect(const char *path, double deadline)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    for (;;) {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
            return fd;
        if (fd >= 0)
            close(fd);
        if (now_s() > deadline)
            die("cannot connect to the QEMU socket");
        usleep(2000);
    }
}

static void send_msg(int fd, const struct al_msg *m)
{
    static uint8_t buf[AL_FRAME_HEADER_SIZE + 1024];
    int n = al_msg_encode(m, buf, sizeof(buf));
    if (n < 0 || write(fd, buf, (size_t)n) != n)
        die("cannot send a frame");
}

static uint8_t rbuf[AL_FRAME_HEADER_SIZE + AL_FRAME_PAYLOAD_MAX];

static void recv_msg(int fd, struct al_decoder *d, struct al_msg *m)
{
    for (;;) {
        const char *why;
        int r = al_decoder_next(d, m, &why);
        if (r < 0)
            die(why);
        if (r == 1)
            return;
        size_t avail;
        uint8_t *p = al_decoder_space(d, &avail);
        ssize_t n = read(fd, p, avail);
        if (n <= 0)
            die("QEMU socket closed");
        al_decoder_commit(d, (size_t)n);
    }
}

static int cmd_direct(char **argv)
{
    char dir[] = "/tmp/airlock-bench-XXXXXX";
    if (!mkdtemp(dir))
        die("mkdtemp");
    char sock[200], chardev[300], mem[32];
    snprintf(sock, sizeof(sock), "%s/agent.sock", dir);
    snprintf(chardev, sizeof(chardev), "socket,id=agent,path=%s,server=on,wait=off", sock);
    snprintf(mem, sizeof(mem), "%sM", argv[4]);
    const char *smp = argv[6];
    double t0 = now_s();
    pid_t pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", O_RDWR);
        dup2(null, 0);
        dup2(null, 1);
        execl(argv[0], argv[0], "-nodefaults", "-no-user-config", "-nographic", "-M", "q35",
              "-accel", argv[5], "-smp", smp, "-m", mem,
              "-kernel", argv[1], "-initrd", argv[2], "-append", argv[3], "-serial",
              "file:/dev/null", "-device", "virtio-serial-pci", "-chardev", chardev, "-device",
              "virtserialport,chardev=agent,name=org.airlock.agent.0", (char *)NULL);
        _exit(127);
    }
    int fd = unix_connect(sock, t0 + 60);
    struct al_decoder d;
    al_decoder_init(&d, rbuf, sizeof(rbuf));
    struct al_msg m = {.type = AL_HELLO};
    m.u.hello.version = AL_PROTO_VERSION;
    m.u.hello.nonce = 42;
    m.u.hello.window = AL_WINDOW_DEFAULT;
    send_msg(fd, &m);
    recv_msg(fd, &d, &m);
    if (m.type != AL_HELLO_ACK)
        die("no handshake");
    double ready = now_s();
    struct al_msg e = {.type = AL_EXEC, .id = 1};
    e.u.exec.argc = 1;
    e.u.exec.argv[0] = al_str_cstr("true");
    send_msg(fd, &e);
    do
        recv_msg(fd, &d, &m);
    while (m.type != AL_EXIT && m.type != AL_ERROR);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    double end = now_s();
    close(fd);
    unlink(sock);
    rmdir(dir);
    printf("{\"handshake_s\": %.4f, \"total_s\": %.4f}\n", ready - t0, end - t0);
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void exec_or_die(al_session *s, const char *const *argv, const char *lang, int out)
{
    al_exec_opts o = {.argv = argv, .lang = lang, .stdin_fd = -1, .stdout_fd = out,
                      .stderr_fd = 2};
    al_exec_result r;
    al_error err = {0};
    if (al_exec(s, &o, &r, &err) < 0)
        die(err.msg);
    if (r.how != AL_EXEC_EXITED || r.value != 0)
        die("benchmark command failed in the guest");
}

/* Counts bytes from fd until `want` arrived, timing first byte to last; runs in a thread while
 * the main thread drives the exec that produces them. */
struct reader {
    int fd;
    uint64_t want;
    double seconds;
    bool ok;
};

static void *read_count(void *arg)
{
    struct reader *r = arg;
    static uint8_t buf[1 << 20];
    uint64_t got = 0;
    double t0 = 0;
    while (got < r->want) {
        ssize_t n = read(r->fd, buf, sizeof(buf));
        if (n <= 0)
            return NULL;
        if (!t0)
            t0 = now_s();
        got += (uint64_t)n;
    }
    r->seconds = now_s() - t0;
    r->ok = true;
    return NULL;
}

/* dd of `mib` MiB in the guest, into the raw port (raw_fd >= 0) or through the agent. */
static double throughput(al_session *s, int raw_fd, unsigned mib)
{
    char code[512];
    int p[2] = {-1, -1};
    if (raw_fd >= 0)
        snprintf(code, sizeof(code),
                 "for p in /sys/class/virtio-ports/*; do "
                 "[ \"$(cat $p/name)\" = %s ] && dev=/dev/${p##*/}; done; "
                 "dd if=/dev/zero of=$dev bs=65536 count=%u 2>/dev/null",
                 RAW_PORT, mib * 16);
    else
        snprintf(code, sizeof(code), "dd if=/dev/zero bs=65536 count=%u 2>/dev/null", mib * 16);
    if (raw_fd < 0 && pipe(p) < 0)
        die("pipe");
    struct reader r = {raw_fd >= 0 ? raw_fd : p[0], (uint64_t)mib << 20, 0, false};
    pthread_t th;
    if (pthread_create(&th, NULL, read_count, &r) != 0)
        die("pthread_create");
    int null = open("/dev/null", O_WRONLY);
    const char *argv[] = {code, NULL};
    exec_or_die(s, argv, "sh", raw_fd >= 0 ? null : p[1]);
    close(null);
    if (p[1] >= 0)
        close(p[1]);
    pthread_join(th, NULL);
    if (p[0] >= 0)
        close(p[0]);
    if (!r.ok)
        die("stream ended early");
    return (double)r.want / r.seconds / 1e6;
}

static int cmd_session(int argc, char **argv)
{
    const char *image = argc > 0 ? argv[0] : "tiny";
    int rtt_n = argc > 1 ? atoi(argv[1]) : 50;
    unsigned mib = argc > 2 ? (unsigned)atoi(argv[2]) : 256;
    unsigned vcpus = argc > 3 ? (unsigned)atoi(argv[3]) : 0; /* 0: airlock's default */
    if (rtt_n < 1 || rtt_n > 10000 || mib < 1 || mib > 4096)
        die("bad arguments");
    al_session_opts so = {.image = image, .quiet = true, .raw_port = RAW_PORT, .vcpus = vcpus};
    al_session *s;
    al_error err = {0};
    if (al_session_open(&so, &s, &err) < 0)
        die(err.msg);
    int raw_fd = unix_connect(al_session_raw_port_path(s), now_s() + 10);

    const char *t[] = {"true", NULL};
    int null = open("/dev/null", O_WRONLY);
    exec_or_die(s, t, NULL, null); /* warm up */
    double *rtt = calloc((size_t)rtt_n, sizeof(double));
    for (int i = 0; i < rtt_n; i++) {
        double t0 = now_s();
        exec_or_die(s, t, NULL, null);
        rtt[i] = (now_s() - t0) * 1e3;
    }
    qsort(rtt, (size_t)rtt_n, sizeof(double), cmp_double);

    /* Alternate the two throughput measurements so drift hits both alike. */
    double agent = 0, raw = 0;
    const int rounds = 3;
    for (int i = 0; i < rounds; i++) {
        raw += throughput(s, raw_fd, mib);
        agent += throughput(s, -1, mib);
    }
    agent /= rounds;
    raw /= rounds;
    printf("{\"rtt_ms_median\": %.3f, \"rtt_ms_p90\": %.3f, \"rtt_ms_min\": %.3f, "
           "\"rtt_count\": %d, \"stream_mb_s\": %.1f, \"raw_mb_s\": %.1f, "
           "\"stream_mib\": %u, \"kvm\": %s}\n",
           rtt[rtt_n / 2], rtt[rtt_n * 9 / 10], rtt[0], rtt_n, agent, raw, mib,
           al_session_kvm(s) ? "true" : "false");
    free(rtt);
    close(raw_fd);
    close(null);
    al_session_close(s);
    return 0;
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if (argc == 9 && !strcmp(argv[1], "direct"))
        return cmd_direct(argv + 2);
    if (argc >= 2 && !strcmp(argv[1], "session"))
        return cmd_session(argc - 2, argv + 2);
    fprintf(stderr,
            "usage: airlock-bench direct QEMU KERNEL INITRD CMDLINE MEMORY_MIB kvm|tcg VCPUS\n"
            "       airlock-bench session [IMAGE] [RTT_COUNT] [STREAM_MIB] [VCPUS]\n");
    return 2;
}

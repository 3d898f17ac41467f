/* Measurements behind bench/run.py. Prints one JSON object per run.
 *
 *   airlock-bench direct QEMU_BINARY KERNEL INITRD CMDLINE MEMORY_MIB kvm|tcg VCPUS
 *       boots the image with QEMU directly (no libvirt), handshakes with the agent, runs
 *       `true`, kills QEMU: the baseline for airlock's session-ready time.
 *   airlock-bench session [IMAGE] [RTT_COUNT] [STREAM_MIB] [VCPUS]
 *       in one airlock session: exec round trips of `true`, guest->host stream throughput
 *       through the agent, and raw `dd` throughput into a second virtio-serial port of the
 *       same guest.
 *   airlock-bench checkpoint [IMAGE] [MEMORY_MIB] [ROUNDS]
 *       checkpoint and rollback times against libvirt's internal snapshots of the same guest,
 *       and disk per checkpoint against the MiB changed before it.
 *   airlock-bench kernel [IMAGE] [ROUNDS]
 *       in one session, alternated: the round trip of `1+1` in the python kernel (its value
 *       comes back as a result) against `true` through exec; then a matplotlib figure (drawn
 *       and sent as an image/png result) and display() of its PNG made once (sent only)
 *       against a print of as many bytes as the figure's results.
 *   airlock-bench procs [IMAGE] [ROUNDS]
 *   airlock-bench screen [IMAGE] [ROUNDS]
 *       in one session, requests at once: 8 `sleep 1` against one (wall time), the round trip
 *       of `true` beside a run streaming output as fast as it can (read here) against alone,
 *       64 `echo` at once (each output checked) and the host RSS they cost.
 *   airlock-bench pty [IMAGE] [ROUNDS]
 *       in one session, alternated with exec round trips of `true`: a keystroke to its echo on
 *       the host (`cat` on a terminal: the guest's line discipline echoes it), and a login
 *       shell on a terminal started until its prompt shows.
 *   airlock-bench port [IMAGE] [ROUNDS]
 *       in one session, alternated: 64 MiB downloaded from a web server in the guest (busybox
 *       httpd) through a forwarded port (al_port_relay) against the same file as exec stdout
 *       (`cat`). */
#include "airlock-proto.h"
#include "airlock.h"

#include <errno.h>
#include <fcntl.h>
#include <libvirt/libvirt.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
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
        /* An image with a root disk boots on an overlay the caller made, as sessions do. */
        char drive[4200];
        snprintf(drive, sizeof(drive), "file=%s,if=virtio,format=qcow2,cache=unsafe",
                 argv[7] ? argv[7] : "");
        execl(argv[0], argv[0], "-nodefaults", "-no-user-config", "-nographic", "-M", "q35",
              "-accel", argv[5], "-smp", smp, "-m", mem, "-kernel", argv[1], "-initrd", argv[2],
              "-append", argv[3], "-serial", "file:/dev/null", "-device", "virtio-serial-pci",
              "-chardev", chardev, "-device",
              "virtserialport,chardev=agent,name=org.airlock.agent.0",
              argv[7] ? "-drive" : (char *)NULL, drive, (char *)NULL);
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
    al_exec_opts o = {.struct_size = sizeof(al_exec_opts),
                      .argv = argv,
                      .lang = lang,
                      .stdin_fd = -1,
                      .stdout_fd = out,
                      .stderr_fd = 2};
    al_exec_result r = AL_EXEC_RESULT_INIT;
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
    al_session_opts so = {.struct_size = sizeof(al_session_opts),
                          .image = image,
                          .quiet = true,
                          .raw_port = RAW_PORT,
                          .vcpus = vcpus};
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

/* One exec of sh code whose output is discarded; its duration in ms. */
static double timed_sh(al_session *s, const char *code)
{
    int null = open("/dev/null", O_WRONLY);
    const char *argv[] = {code, NULL};
    double t0 = now_s();
    exec_or_die(s, argv, "sh", null);
    close(null);
    return (now_s() - t0) * 1e3;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void print_series(const char *name, double *v, int n, bool last)
{
    printf("\"%s\": [", name);
    for (int i = 0; i < n; i++)
        printf("%s%.1f", i ? ", " : "", v[i]);
    printf("]%s", last ? "" : ", ");
}

/* Checkpoint cost and rollback time (orchestrator/session/checkpoint.c) against libvirt's internal
 * snapshot create and revert of the same guest, rounds interleaved so drift hits both alike;
 * then the disk each checkpoint takes against the MiB the guest changed before it. */
static int cmd_checkpoint(int argc, char **argv)
{
    const char *image = argc > 0 ? argv[0] : "tiny";
    unsigned memory = argc > 1 ? (unsigned)atoi(argv[1]) : 512;
    int rounds = argc > 2 ? atoi(argv[2]) : 5;
    if (rounds < 1 || rounds > 100)
        die("bad arguments");
    al_session_opts so = {.struct_size = sizeof(al_session_opts),
                          .image = image,
                          .quiet = true,
                          .memory_mib = memory,
                          .checkpoints = true};
    al_session *s;
    al_error err = {0};
    if (al_session_open(&so, &s, &err) < 0)
        die(err.msg);
    char uri[1024];
    if (al_libvirt_uri(NULL, uri, sizeof(uri), &err) < 0)
        die(err.msg);
    virConnectPtr conn = virConnectOpen(uri);
    virDomainPtr dom = conn ? virDomainLookupByName(conn, al_session_name(s)) : NULL;
    if (!dom)
        die("cannot find the session's domain in libvirt");
    /* Where changed blocks go: the scratch disk of an image without one, else a file. */
    bool scratch = !strcmp(image, "tiny");
    const char *target = scratch ? "/dev/vda" : "/var/tmp/airlock-bench-blob";
    timed_sh(s, "mkdir -p /root; echo base > /root/state");
    if (al_checkpoint_create(s, "bench-base", NULL, &err) < 0)
        die(err.msg);

    double *ck = calloc((size_t)rounds, sizeof(double)),
           *rb = calloc((size_t)rounds, sizeof(double));
    double *first = calloc((size_t)rounds, sizeof(double));
    double *lv_create = calloc((size_t)rounds, sizeof(double));
    double *lv_revert = calloc((size_t)rounds, sizeof(double));
    double *lv_first = calloc((size_t)rounds, sizeof(double));
    double *save = calloc((size_t)rounds, sizeof(double));
    int lv_restarts = 0;
    uint64_t state_bytes = 0;
    for (int i = 0; i < rounds; i++) {
        /* airlock: checkpoint, change, roll back, and the first exec after */
        al_checkpoint_info info = AL_CHECKPOINT_INFO_INIT;
        double t0 = now_s();
        int id = al_checkpoint_create(s, NULL, &info, &err);
        if (id < 0)
            die(err.msg);
        ck[i] = (now_s() - t0) * 1e3;
        save[i] = info.save_ms;
        state_bytes = info.state_bytes;
        timed_sh(s, "echo changed > /root/state");
        t0 = now_s();
        if (al_checkpoint_rollback(s, (uint32_t)id, &err) < 0)
            die(err.msg);
        rb[i] = (now_s() - t0) * 1e3;
        first[i] = timed_sh(s, "grep -qx base /root/state");
        if (al_checkpoint_delete(s, (uint32_t)id, &err) < 0)
            die(err.msg);

        /* libvirt: internal snapshot of the same running guest, change, revert */
        char xml[128];
        snprintf(xml, sizeof(xml), "<domainsnapshot><name>bench-%d</name></domainsnapshot>", i);
        unsigned domid = virDomainGetID(dom);
        t0 = now_s();
        virDomainSnapshotPtr snap = virDomainSnapshotCreateXML(dom, xml, 0);
        if (!snap)
            die("libvirt cannot take an internal snapshot");
        lv_create[i] = (now_s() - t0) * 1e3;
        timed_sh(s, "echo changed > /root/state");
        t0 = now_s();
        if (virDomainRevertToSnapshot(snap, 0) < 0)
            die("libvirt cannot revert to its snapshot");
        lv_revert[i] = (now_s() - t0) * 1e3;
        lv_restarts += virDomainGetID(dom) != domid;
        /* The agent is back in the past here too: the same re-handshake (and, when libvirt
         * started a new QEMU, a new connection), then the first exec. */
        t0 = now_s();
        uint32_t restored = 0;
        if (al_checkpoint_recover(s, &restored, &err) < 0)
            die(err.msg);
        if (restored)
            die("the agent did not come back after libvirt's revert");
        timed_sh(s, "grep -qx base /root/state");
        lv_first[i] = (now_s() - t0) * 1e3;
        virDomainSnapshotDelete(snap, 0);
        virDomainSnapshotFree(snap);
    }

    /* Disk per checkpoint against blocks changed since the one before. */
    static const unsigned change_mib[] = {0, 1, 8, 32};
    const size_t nchange = sizeof(change_mib) / sizeof(change_mib[0]);
    uint64_t disk[4], state[4];
    double kept_ms[4]; /* these are kept, so each takes new space rather than reusing freed */
    if (al_checkpoint_create(s, NULL, NULL, &err) < 0) /* the one before the first */
        die(err.msg);
    for (size_t i = 0; i < nchange; i++) {
        char code[256];
        snprintf(code, sizeof(code),
                 /* Dropping the page cache keeps the written data out of the memory state,
                  * so the disk growth shows the blocks alone. */
                 "[ %u -eq 0 ] || dd if=/dev/urandom of=%s bs=1M count=%u conv=fsync%s "
                 "2>/dev/null; sync; echo 3 > /proc/sys/vm/drop_caches",
                 change_mib[i], target, change_mib[i], scratch ? ",notrunc" : "");
        timed_sh(s, code);
        al_checkpoint_info info = AL_CHECKPOINT_INFO_INIT;
        double t0 = now_s();
        if (al_checkpoint_create(s, NULL, &info, &err) < 0)
            die(err.msg);
        kept_ms[i] = (now_s() - t0) * 1e3;
        disk[i] = info.disk_bytes;
        state[i] = info.state_bytes;
    }

    printf("{\"image\": \"%s\", \"memory_mib\": %u, \"kvm\": %s, \"rounds\": %d, ", image, memory,
           al_session_kvm(s) ? "true" : "false", rounds);
    printf("\"state_bytes\": %llu, ", (unsigned long long)state_bytes);
    print_series("checkpoint_ms", ck, rounds, false);
    print_series("savevm_ms", save, rounds, false);
    print_series("rollback_ms", rb, rounds, false);
    print_series("first_exec_after_rollback_ms", first, rounds, false);
    print_series("libvirt_create_ms", lv_create, rounds, false);
    print_series("libvirt_revert_ms", lv_revert, rounds, false);
    print_series("libvirt_resync_and_first_exec_ms", lv_first, rounds, false);
    printf("\"libvirt_revert_restarted_qemu\": %d, ", lv_restarts);
    printf("\"checkpoint_ms_median\": %.1f, \"rollback_ms_median\": %.1f, "
           "\"libvirt_create_ms_median\": %.1f, \"libvirt_revert_ms_median\": %.1f, ",
           median(ck, rounds), median(rb, rounds), median(lv_create, rounds),
           median(lv_revert, rounds));
    printf("\"disk_per_checkpoint\": [");
    for (size_t i = 0; i < nchange; i++)
        printf("%s{\"changed_mib\": %u, \"disk_bytes\": %llu, \"state_bytes\": %llu, "
               "\"checkpoint_ms\": %.1f}",
               i ? ", " : "", change_mib[i], (unsigned long long)disk[i],
               (unsigned long long)state[i], kept_ms[i]);
    printf("]}\n");
    free(ck);
    free(rb);
    free(first);
    free(lv_create);
    free(lv_revert);
    free(lv_first);
    free(save);
    virDomainFree(dom);
    virConnectClose(conn);
    al_session_close(s);
    return 0;
}

/* What a kernel run's results held (refusals and errors end the benchmark). */
struct kernel_run {
    unsigned results;
    size_t bytes; /* of its results' MIME data */
};

static int count_result(void *ctx, const al_result *r)
{
    struct kernel_run *k = ctx;
    if (r->kind == AL_RESULT_REFUSED || r->kind == AL_RESULT_ERROR)
        die(r->kind == AL_RESULT_REFUSED ? r->why : r->name);
    k->results++;
    for (size_t i = 0; i < r->nmime; i++)
        k->bytes += r->mime[i].len;
    return 0;
}

static double timed_kernel(al_session *s, const char *code, int null, struct kernel_run *k)
{
    const char *argv[] = {code, NULL};
    al_exec_opts o = {.struct_size = sizeof(al_exec_opts),
                      .argv = argv,
                      .lang = "python",
                      .kernel = true,
                      .stdin_fd = -1,
                      .stdout_fd = null,
                      .stderr_fd = 2,
                      .result = count_result,
                      .result_ctx = k};
    al_exec_result r = AL_EXEC_RESULT_INIT;
    al_error err = {0};
    double t0 = now_s();
    if (al_exec(s, &o, &r, &err) < 0)
        die(err.msg);
    if (r.how != AL_EXEC_EXITED || r.value != 0)
        die("benchmark code failed in the python kernel");
    return (now_s() - t0) * 1e3;
}

/* A quiet session of image (NULL: the default), or the benchmark dies. */
static al_session *bench_session(const char *image)
{
    al_session_opts so = {.struct_size = sizeof(al_session_opts), .image = image, .quiet = true};
    al_session *s = NULL;
    al_error err = {0};
    if (al_session_open(&so, &s, &err) < 0)
        die(err.msg);
    return s;
}

/* The python kernel's round trip against exec's, and a figure result against printing as many
 * bytes, rounds alternated so that drift hits both alike. */
static int cmd_kernel(int argc, char **argv)
{
    const char *image = argc > 0 ? argv[0] : NULL;
    int n = argc > 1 ? atoi(argv[1]) : 30;
    if (n < 1 || n > 1000)
        die("rounds must be 1..1000");
    al_session *s = bench_session(image);
    int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
    struct kernel_run k = {0};
    /* Warm: the kernel started, IPython and matplotlib imported; png: the figure's PNG, made
     * once, for a result that costs no drawing. */
    timed_kernel(s,
                 "import io\nimport matplotlib.pyplot as plt\n"
                 "from IPython.display import Image\nbuf = io.BytesIO()\n"
                 "plt.figure(figsize=(8, 6), dpi=100)\nplt.plot([1, 3, 2])\n"
                 "plt.savefig(buf, format='png')\nplt.close('all')\npng = buf.getvalue()\n1+1",
                 null, &k);
    const char *fig = "fig = plt.figure(figsize=(8, 6), dpi=100)\nplt.plot([1, 3, 2])\nplt.show()";
    k = (struct kernel_run){0};
    timed_kernel(s, fig, null, &k);
    /* A print of the figure's bytes: as much data through stdout instead of a result. */
    char print_code[128];
    snprintf(print_code, sizeof(print_code), "print('x' * %zu)", k.bytes);
    double *rtt_k = calloc((size_t)n, sizeof(double)), *rtt_e = calloc((size_t)n, sizeof(double));
    double *t_fig = calloc((size_t)n, sizeof(double)), *t_print = calloc((size_t)n, sizeof(double));
    double *t_img = calloc((size_t)n, sizeof(double));
    if (!rtt_k || !rtt_e || !t_fig || !t_print || !t_img)
        die("out of memory");
    const char *t_argv[] = {"true", NULL};
    for (int i = 0; i < n; i++) {
        struct kernel_run kr = {0};
        rtt_k[i] = timed_kernel(s, "1+1", null, &kr);
        if (kr.results != 1)
            die("1+1 gave no result");
        double t0 = now_s();
        exec_or_die(s, t_argv, NULL, null);
        rtt_e[i] = (now_s() - t0) * 1e3;
    }
    for (int i = 0; i < n; i++) {
        struct kernel_run kr = {0};
        t_fig[i] = timed_kernel(s, fig, null, &kr);
        if (kr.results != 1)
            die("the figure gave no result");
        kr = (struct kernel_run){0};
        t_print[i] = timed_kernel(s, print_code, null, &kr);
        kr = (struct kernel_run){0};
        t_img[i] = timed_kernel(s, "display(Image(data=png))", null, &kr);
        if (kr.results != 1)
            die("the image gave no result");
    }
    double mk = median(rtt_k, n), me = median(rtt_e, n), mf = median(t_fig, n),
           mp = median(t_print, n), mi = median(t_img, n);
    printf("{\"image\": \"%s\", \"rounds\": %d, \"kvm\": %s, ", image ? image : al_image_default(),
           n, al_session_kvm(s) ? "true" : "false");
    printf("\"kernel_rtt_ms\": %.2f, \"exec_rtt_ms\": %.2f, \"kernel_vs_exec\": %.3f, ", mk, me,
           mk / me);
    printf("\"figure_bytes\": %zu, \"figure_ms\": %.2f, \"print_ms\": %.2f, "
           "\"figure_vs_print\": %.3f, \"image_result_ms\": %.2f, \"image_vs_print\": %.3f, ",
           k.bytes, mf, mp, mf / mp, mi, mi / mp);
    print_series("kernel_rtt_ms_sorted", rtt_k, n, false);
    print_series("exec_rtt_ms_sorted", rtt_e, n, true);
    printf("}\n");
    free(rtt_k);
    free(rtt_e);
    free(t_fig);
    free(t_print);
    free(t_img);
    close(null);
    al_session_close(s);
    return 0;
}

/* ---- procs: many requests of one session at once (link.c's multiplexer) ---- */

struct proc_job {
    al_session *s;
    const char *code;
    int out;
    int rc;
    char text[64]; /* the stdout it got (up to its size) */
    size_t len;
};

static int to_text(void *ctx, int stream, const uint8_t *data, size_t n)
{
    struct proc_job *j = ctx;
    if (stream == 1) {
        size_t room = sizeof(j->text) - 1 - j->len;
        n = n < room ? n : room;
        memcpy(j->text + j->len, data, n);
        j->len += n;
    }
    return 0;
}

static void *proc_thread(void *arg)
{
    struct proc_job *j = arg;
    const char *argv[] = {j->code, NULL};
    al_exec_opts o = {.struct_size = sizeof(al_exec_opts),
                      .argv = argv,
                      .lang = "sh",
                      .stdin_fd = -1,
                      .stdout_fd = j->out,
                      .stderr_fd = 2,
                      .output = j->out < 0 ? to_text : NULL,
                      .output_ctx = j};
    al_exec_result r = AL_EXEC_RESULT_INIT;
    al_error err = {0};
    j->rc = al_exec(j->s, &o, &r, &err);
    if (j->rc == 0 && (r.how != AL_EXEC_EXITED || r.value != 0))
        j->rc = -EIO;
    if (j->rc < 0)
        fprintf(stderr, "airlock-bench: %s: %s\n", j->code, err.msg);
    return NULL;
}

/* n copies of code at once (each its own thread and request); wall seconds. */
static double at_once(al_session *s, const char *code, int n, struct proc_job *jobs)
{
    pthread_t th[64];
    double t0 = now_s();
    for (int i = 0; i < n; i++) {
        if (!jobs[i].s)
            jobs[i] = (struct proc_job){.s = s, .code = code, .out = -1};
        if (pthread_create(&th[i], NULL, proc_thread, &jobs[i]))
            die("pthread_create");
    }
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < n; i++)
        if (jobs[i].rc < 0)
            die("a concurrent run failed");
    return now_s() - t0;
}

static long rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof(line), f))
        if (!strncmp(line, "VmRSS:", 6))
            kib = atol(line + 6);
    if (f)
        fclose(f);
    return kib;
}

struct streamer {
    al_session *s;
    volatile bool stop;
    uint64_t bytes;
    double seconds;
    double t0;
    double mb_s; /* the rate its reader takes the stream at (MB/s), 0: as fast as it comes */
};

/* The stream's reader: counts, and holds the pace a client reading at mb_s would. */
static int count_bytes(void *ctx, int stream, const uint8_t *data, size_t n)
{
    struct streamer *st = ctx;
    (void)stream, (void)data;
    st->bytes += n;
    if (st->mb_s > 0) {
        double ahead = (double)st->bytes / (st->mb_s * 1e6) - (now_s() - st->t0);
        if (ahead > 0)
            usleep((useconds_t)(ahead * 1e6));
    }
    return st->stop ? -EPIPE : 0;
}

/* A background run that streams output as fast as it can, read (and dropped) here. */
static void *stream_thread(void *arg)
{
    struct streamer *st = arg;
    const char *argv[] = {"cat /dev/zero", NULL};
    al_exec_opts o = {.struct_size = sizeof(al_exec_opts),
                      .argv = argv,
                      .lang = "sh",
                      .stdin_fd = -1,
                      .stdout_fd = -1,
                      .stderr_fd = -1,
                      .output = count_bytes,
                      .output_ctx = st};
    al_exec_result r = AL_EXEC_RESULT_INIT;
    al_error err = {0};
    st->t0 = now_s();
    al_exec(st->s, &o, &r, &err);
    st->seconds = now_s() - st->t0;
    return NULL;
}

/* [IMAGE] [ROUNDS] (1..100, default dflt): a session of IMAGE (default tiny), and /dev/null. */
static al_session *bench_rounds(int argc, char **argv, int dflt, const char **image, int *n,
                                int *null)
{
    *image = argc > 0 ? argv[0] : "tiny";
    *n = argc > 1 ? atoi(argv[1]) : dflt;
    if (*n < 1 || *n > 100)
        die("rounds must be 1..100");
    if ((*null = open("/dev/null", O_WRONLY | O_CLOEXEC)) < 0)
        die("/dev/null");
    return bench_session(*image);
}

static void rtts(al_session *s, int n, double *out, int null)
{
    const char *argv[] = {"true", NULL};
    for (int i = 0; i < n; i++) {
        double t0 = now_s();
        exec_or_die(s, argv, NULL, null);
        out[i] = (now_s() - t0) * 1e3;
    }
}

/* Round trips of `true` beside a stream its reader takes at mb_s (0: flat out); its rate as
 * measured into *got. */
static void rtts_beside(al_session *s, double mb_s, int n, double *out, double *got, int null)
{
    struct streamer st = {.s = s, .mb_s = mb_s};
    pthread_t sth;
    if (pthread_create(&sth, NULL, stream_thread, &st))
        die("pthread_create");
    while (st.bytes < (8u << 20))
        usleep(10000);
    uint64_t b0 = st.bytes;
    double t0 = now_s();
    rtts(s, n, out, null);
    *got = (double)(st.bytes - b0) / (now_s() - t0) / 1e6;
    st.stop = true;
    pthread_join(sth, NULL);
}

static int cmd_procs(int argc, char **argv)
{
    const char *image;
    int n, null;
    al_session *s = bench_rounds(argc, argv, 5, &image, &n, &null);
    struct proc_job jobs[64];
    double one[100], eight[100];
    /* 8 sleeps at once against one, rounds alternated */
    for (int i = 0; i < n; i++) {
        memset(jobs, 0, sizeof(jobs));
        one[i] = at_once(s, "sleep 1", 1, jobs);
        memset(jobs, 0, sizeof(jobs));
        eight[i] = at_once(s, "sleep 1", 8, jobs);
    }
    /* exec round trips alone, then beside a stream read as it comes */
    enum { RTT_N = 40 };
    double alone[RTT_N], beside[RTT_N], flat[RTT_N], mbps, flat_mbps;
    rtts(s, RTT_N, alone, null);
    /* the goal's case: a client reading a stream at 100 MB/s; then one taking it flat out */
    rtts_beside(s, 100, RTT_N, beside, &mbps, null);
    rtts_beside(s, 0, RTT_N, flat, &flat_mbps, null);
    /* 64 at once, each checked, and what they cost the host */
    long rss0 = rss_kib();
    memset(jobs, 0, sizeof(jobs));
    char codes[64][32];
    for (int i = 0; i < 64; i++) {
        snprintf(codes[i], sizeof(codes[i]), "echo run-%d", i);
        jobs[i] = (struct proc_job){.s = s, .code = codes[i], .out = -1};
    }
    double t64 = at_once(s, NULL, 64, jobs);
    int correct = 0;
    for (int i = 0; i < 64; i++) {
        char want[40];
        snprintf(want, sizeof(want), "run-%d\n", i);
        correct += jobs[i].len == strlen(want) && !memcmp(jobs[i].text, want, jobs[i].len);
    }
    long rss1 = rss_kib();
    double m1 = median(one, n), m8 = median(eight, n), ma = median(alone, RTT_N),
           mb = median(beside, RTT_N);
    printf("{\"image\": \"%s\", \"rounds\": %d, \"kvm\": %s, ", image, n,
           al_session_kvm(s) ? "true" : "false");
    printf("\"sleep1_one_s\": %.3f, \"sleep1_eight_s\": %.3f, \"eight_vs_one\": %.3f, ", m1, m8,
           m8 / m1);
    double mf = median(flat, RTT_N);
    printf("\"rtt_alone_ms\": %.2f, \"rtt_beside_stream_ms\": %.2f, \"beside_vs_alone\": %.3f, "
           "\"stream_mb_s\": %.1f, \"rtt_beside_flat_out_ms\": %.2f, "
           "\"flat_out_vs_alone\": %.3f, \"flat_out_mb_s\": %.1f, ",
           ma, mb, mb / ma, mbps, mf, mf / ma, flat_mbps);
    printf("\"echo64_s\": %.3f, \"echo64_correct\": %d, \"echo64_rss_growth_kib\": %ld, ", t64,
           correct, rss1 - rss0);
    print_series("rtt_alone_ms_sorted", alone, RTT_N, false);
    print_series("rtt_beside_stream_ms_sorted", beside, RTT_N, true);
    printf("}\n");
    close(null);
    al_session_close(s);
    return correct == 64 ? 0 : 1;
}

/* ---- screen: computer use from the host (screen.c) ---- */

/* Sleeps out the library's screenshot pacing, so that it never enters a measurement. */
static void unpaced(void)
{
    usleep((AL_SCREENSHOT_INTERVAL_MS + 10) * 1000);
}

static double shot_ms(al_session *s, size_t *bytes)
{
    al_screenshot shot = AL_SCREENSHOT_INIT;
    al_error err = {0};
    double t0 = now_s();
    if (al_screen_capture(s, NULL, &shot, &err) < 0)
        die(err.msg);
    double ms = (now_s() - t0) * 1e3;
    *bytes = shot.len;
    free(shot.png);
    return ms;
}

/* [IMAGE] [ROUNDS]: a host-side screenshot alone; a click then the next screenshot; and the
 * guest's own capture copied out by exec: on the desktop image scrot's PNG of the X screen (the
 * baseline of the screenshot goal), elsewhere a read of the VGA text memory through /dev/mem, a
 * lower bound of any in-guest capture (no pixels, no PNG). Rounds alternated. */
static int cmd_screen(int argc, char **argv)
{
    const char *image = argc > 0 ? argv[0] : "tiny";
    int n = argc > 1 ? atoi(argv[1]) : 30;
    if (n < 1 || n > 100)
        die("rounds must be 1..100");
    al_session_opts so = {
        .struct_size = sizeof(al_session_opts), .image = image, .quiet = true, .display = true};
    al_session *s = NULL;
    al_error err = {0};
    if (al_session_open(&so, &s, &err) < 0)
        die(err.msg);
    int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
    bool desktop = !strcmp(image, "desktop");
    const char *guest[] = {desktop ? "scrot -o -z /tmp/s.png && cat /tmp/s.png"
                                   : "dd if=/dev/mem bs=4096 skip=184 count=1 2>/dev/null",
                           NULL};
    if (desktop) {
        /* X is started beside the agent: wait for it (and a screen with something on it). */
        const char *up[] = {"for i in $(seq 600); do xdpyinfo >/dev/null 2>&1 && exit 0; "
                            "sleep 0.1; done; exit 1",
                            NULL};
        exec_or_die(s, up, "sh", null);
    }
    double alone[100], click[100], inguest[100];
    size_t bytes = 0;
    unpaced();
    shot_ms(s, &bytes); /* the first: libvirt and QEMU warm up */
    for (int i = 0; i < n; i++) {
        unpaced();
        alone[i] = shot_ms(s, &bytes);
        unpaced();
        char act[160];
        snprintf(act, sizeof(act), "[{\"action\": \"left_click\", \"coordinate\": [%d, %d]}]",
                 10 + i, 20 + i);
        double t0 = now_s();
        if (al_screen_input(s, act, 0, 0, NULL, NULL, NULL, &err) < 0)
            die(err.msg);
        size_t b2;
        shot_ms(s, &b2);
        click[i] = (now_s() - t0) * 1e3;
        t0 = now_s();
        exec_or_die(s, guest, "sh", null);
        inguest[i] = (now_s() - t0) * 1e3;
    }
    double ma = median(alone, n), mc = median(click, n), mg = median(inguest, n);
    printf("{\"image\": \"%s\", \"rounds\": %d, \"kvm\": %s, \"png_bytes\": %zu, "
           "\"screenshot_ms\": %.2f, \"click_then_screenshot_ms\": %.2f, "
           "\"click_vs_screenshot\": %.3f, \"guest_capture\": \"%s\", "
           "\"guest_capture_ms\": %.2f, \"screenshot_vs_guest_capture\": %.3f}\n",
           image, n, al_session_kvm(s) ? "true" : "false", bytes, ma, mc, mc / ma,
           desktop ? "scrot PNG, copied out by exec" : "VGA text memory, copied out by exec", mg,
           ma / mg);
    close(null);
    al_session_close(s);
    return 0;
}

/* A pty run in a thread: what it shows lands in text (bounded), each chunk says so on a pipe. */
struct pty_job {
    al_session *s;
    const char *const *argv;
    int keys[2], note[2];
    char text[4096];
    size_t len;
    int rc;
};

static int pty_output(void *ctx, int stream, const uint8_t *data, size_t n)
{
    struct pty_job *j = ctx;
    (void)stream;
    size_t take = n < sizeof(j->text) - 1 - j->len ? n : sizeof(j->text) - 1 - j->len;
    memcpy(j->text + j->len, data, take);
    j->len += take;
    j->text[j->len] = '\0';
    (void)!write(j->note[1], "x", 1);
    return 0;
}

static void *pty_thread(void *arg)
{
    struct pty_job *j = arg;
    al_exec_opts o = {.struct_size = sizeof(al_exec_opts),
                      .argv = j->argv,
                      .stdin_fd = j->keys[0],
                      .stdout_fd = -1,
                      .stderr_fd = -1,
                      .output = pty_output,
                      .output_ctx = j,
                      .pty_rows = 24,
                      .pty_cols = 80};
    al_exec_result r = AL_EXEC_RESULT_INIT;
    al_error err = {0};
    j->rc = al_exec(j->s, &o, &r, &err);
    if (j->rc < 0)
        fprintf(stderr, "airlock-bench: %s: %s\n", j->argv[0], err.msg);
    (void)!write(j->note[1], "x", 1);
    return NULL;
}

static void pty_start(struct pty_job *j, al_session *s, const char *const *argv, pthread_t *t)
{
    *j = (struct pty_job){.s = s, .argv = argv};
    if (pipe(j->keys) < 0 || pipe(j->note) < 0 || pthread_create(t, NULL, pty_thread, j))
        die("pty job");
}

/* Waits until the job's text holds want (a chunk at a time), at most 120 s. */
static void pty_wait_for(struct pty_job *j, const char *want)
{
    double end = now_s() + 120;
    while (!strstr(j->text, want)) {
        struct pollfd p = {j->note[0], POLLIN, 0};
        char b[64];
        if (now_s() > end || poll(&p, 1, 1000) < 0)
            die("the terminal never showed what was awaited");
        if (p.revents && read(j->note[0], b, sizeof(b)) <= 0)
            die("read");
    }
}

static void pty_end(struct pty_job *j, pthread_t t)
{
    close(j->keys[1]); /* the terminal closes: the run is hung up */
    pthread_join(t, NULL);
    close(j->keys[0]);
    close(j->note[0]);
    close(j->note[1]);
}

static int cmd_pty(int argc, char **argv)
{
    const char *image;
    int n, null;
    al_session *s = bench_rounds(argc, argv, 20, &image, &n, &null);
    double key[100], rtt_k[100], prompt[100], rtt_p[100];
    /* keystrokes into one `cat`, each to its echo, alternated with round trips */
    const char *cat[] = {"cat", NULL};
    struct pty_job j;
    pthread_t t;
    pty_start(&j, s, cat, &t);
    for (int i = 0; i < n; i++) {
        rtts(s, 1, &rtt_k[i], null);
        char want[8];
        snprintf(want, sizeof(want), "%c", 'a' + i % 26);
        j.len = 0;
        j.text[0] = '\0';
        double t0 = now_s();
        if (write(j.keys[1], want, 1) != 1)
            die("write");
        pty_wait_for(&j, want);
        key[i] = (now_s() - t0) * 1e3;
    }
    pty_end(&j, t);
    /* a login shell until its prompt, alternated with round trips */
    const char *shell[] = {"/bin/sh", "-c", "PS1='ready> ' exec sh -i", NULL};
    for (int i = 0; i < n; i++) {
        rtts(s, 1, &rtt_p[i], null);
        double t0 = now_s();
        pty_start(&j, s, shell, &t);
        pty_wait_for(&j, "ready> ");
        prompt[i] = (now_s() - t0) * 1e3;
        pty_end(&j, t);
    }
    double mk = median(key, n), mrk = median(rtt_k, n), mp = median(prompt, n),
           mrp = median(rtt_p, n);
    printf("{\"image\": \"%s\", \"rounds\": %d, \"kvm\": %s, ", image, n,
           al_session_kvm(s) ? "true" : "false");
    printf("\"keystroke_echo_ms\": %.2f, \"rtt_true_ms\": %.2f, \"keystroke_vs_rtt\": %.3f, ", mk,
           mrk, mk / mrk);
    printf("\"shell_prompt_ms\": %.2f, \"rtt_true_beside_ms\": %.2f, \"prompt_vs_rtt\": %.3f, ", mp,
           mrp, mp / mrp);
    print_series("keystroke_echo_ms_sorted", key, n, true);
    printf("}\n");
    close(null);
    al_session_close(s);
    return 0;
}

static int count_output(void *ctx, int stream, const uint8_t *data, size_t n)
{
    (void)stream, (void)data;
    if (ctx)
        *(uint64_t *)ctx += n;
    return 0;
}

/* A server in the guest, in a thread of its own until the session's end. */
struct bg_job {
    al_session *s;
    const char *const *argv;
    int cancel[2];
};

static void *bg_thread(void *arg)
{
    struct bg_job *j = arg;
    al_exec_opts o = {.struct_size = sizeof(al_exec_opts),
                      .argv = j->argv,
                      .stdin_fd = -1,
                      .stdout_fd = -1,
                      .stderr_fd = -1,
                      .output = count_output,
                      .cancel_fd = j->cancel[0]};
    al_exec_result r = AL_EXEC_RESULT_INIT;
    al_error err = {0};
    al_exec(j->s, &o, &r, &err);
    return NULL;
}

struct relay_job {
    al_session *s;
    int fd;
    int rc;
    al_error err;
};

static void *relay_thread(void *arg)
{
    struct relay_job *j = arg;
    j->rc = al_port_relay(j->s, 8000, j->fd, -1, NULL, &j->err);
    return NULL;
}

/* Bytes of an HTTP download of path through a tunnel, and its MB/s. */
static double port_download(al_session *s, const char *path, uint64_t *bytes)
{
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0)
        die("socketpair");
    struct relay_job j = {.s = s, .fd = sp[1]};
    pthread_t t;
    double t0 = now_s();
    if (pthread_create(&t, NULL, relay_thread, &j))
        die("thread");
    char req[256];
    int n = snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: localhost\r\n\r\n", path);
    if (write(sp[0], req, (size_t)n) != n)
        die("write");
    static char buf[1 << 16];
    uint64_t got = 0;
    for (ssize_t k; (k = read(sp[0], buf, sizeof(buf))) > 0;)
        got += (uint64_t)k;
    double dt = now_s() - t0;
    close(sp[0]);
    pthread_join(t, NULL);
    close(sp[1]);
    if (j.rc < 0)
        fprintf(stderr, "airlock-bench: port: %s\n", j.err.msg);
    *bytes = got;
    return (double)got / dt / 1e6;
}

static int cmd_port(int argc, char **argv)
{
    const char *image;
    int n, null;
    al_session *s = bench_rounds(argc, argv, 3, &image, &n, &null);
    const char *mk[] = {"sh", "-c", "head -c 67108864 /dev/zero > /tmp/big", NULL};
    al_error err = {0};
    al_exec_result mr = AL_EXEC_RESULT_INIT;
    if (al_exec(s,
                &(al_exec_opts){.struct_size = sizeof(al_exec_opts),
                                .argv = mk,
                                .stdin_fd = -1,
                                .stdout_fd = -1,
                                .stderr_fd = -1,
                                .output = count_output},
                &mr, &err) < 0 ||
        mr.value != 0)
        die("cannot make the file in the guest");
    const char *httpd[] = {"busybox", "httpd", "-f", "-p", "127.0.0.1:8000", "-h", "/tmp", NULL};
    struct bg_job bg = {.s = s, .argv = httpd};
    pthread_t bt;
    if (pipe(bg.cancel) < 0 || pthread_create(&bt, NULL, bg_thread, &bg))
        die("server");
    /* the server listens when a request is answered */
    uint64_t got = 0;
    for (int i = 0; i < 100 && got == 0; i++) {
        port_download(s, "/nothing", &got);
        if (!got)
            sleep(1);
    }
    double port[20], exec[20];
    uint64_t pbytes = 0, ebytes = 0;
    const char *cat[] = {"cat", "/tmp/big", NULL};
    for (int i = 0; i < n && i < 20; i++) {
        port[i] = port_download(s, "/big", &pbytes);
        uint64_t c = 0;
        al_exec_opts o = {.struct_size = sizeof(al_exec_opts),
                          .argv = cat,
                          .stdin_fd = -1,
                          .stdout_fd = -1,
                          .stderr_fd = -1,
                          .output = count_output,
                          .output_ctx = &c};
        al_exec_result r = AL_EXEC_RESULT_INIT;
        double t0 = now_s();
        if (al_exec(s, &o, &r, &err) < 0)
            die(err.msg);
        exec[i] = (double)c / (now_s() - t0) / 1e6;
        ebytes = c;
    }
    uint8_t kill = SIGKILL;
    (void)!write(bg.cancel[1], &kill, 1);
    pthread_join(bt, NULL);
    double mp = median(port, n), me = median(exec, n);
    printf("{\"image\": \"%s\", \"rounds\": %d, \"kvm\": %s, ", image, n,
           al_session_kvm(s) ? "true" : "false");
    printf("\"port_download_MBps\": %.1f, \"port_bytes\": %llu, \"exec_stdout_MBps\": %.1f, "
           "\"exec_bytes\": %llu, \"port_vs_exec\": %.3f, ",
           mp, (unsigned long long)pbytes, me, (unsigned long long)ebytes, mp / me);
    print_series("port_download_MBps_sorted", port, n, false);
    print_series("exec_stdout_MBps_sorted", exec, n, true);
    printf("}\n");
    close(null);
    al_session_close(s);
    return 0;
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if ((argc == 9 || argc == 10) && !strcmp(argv[1], "direct"))
        return cmd_direct(argv + 2);
    if (argc >= 2 && !strcmp(argv[1], "session"))
        return cmd_session(argc - 2, argv + 2);
    if (argc >= 2 && !strcmp(argv[1], "checkpoint"))
        return cmd_checkpoint(argc - 2, argv + 2);
    if (argc >= 2 && !strcmp(argv[1], "kernel"))
        return cmd_kernel(argc - 2, argv + 2);
    if (argc >= 2 && !strcmp(argv[1], "procs"))
        return cmd_procs(argc - 2, argv + 2);
    if (argc >= 2 && !strcmp(argv[1], "pty"))
        return cmd_pty(argc - 2, argv + 2);
    if (argc >= 2 && !strcmp(argv[1], "port"))
        return cmd_port(argc - 2, argv + 2);
    if (argc >= 2 && !strcmp(argv[1], "screen"))
        return cmd_screen(argc - 2, argv + 2);
    fprintf(stderr,
            "usage: airlock-bench direct QEMU KERNEL INITRD CMDLINE MEMORY_MIB kvm|tcg VCPUS\n"
            "       airlock-bench session [IMAGE] [RTT_COUNT] [STREAM_MIB] [VCPUS]\n"
            "       airlock-bench checkpoint [IMAGE] [MEMORY_MIB] [ROUNDS]\n"
            "       airlock-bench kernel [IMAGE] [ROUNDS]\n"
            "       airlock-bench procs [IMAGE] [ROUNDS]\n"
            "       airlock-bench pty [IMAGE] [ROUNDS]\n"
            "       airlock-bench port [IMAGE] [ROUNDS]\n"
            "       airlock-bench screen [IMAGE] [ROUNDS]\n");
    return 2;
}

/* The link without a VM (orchestrator/link/link.c through the peer transport, transport/peer.c):
 * many requests of one session at once against the real agent (`airlock-agent --stdio`), and
 * the host's own checks against a scripted hostile peer, this program run again as
 * `test-link --peer MODE`. TAP; seconds, no libvirt.
 *
 *   test-link AGENT KERNELS_DIR     the tests
 *   test-link --peer MODE           the peer: answers the handshake, then plays MODE:
 *     reverse     takes 64 EXECs, then answers them in reverse order, each request's frames
 *                 interleaved with the others' (STARTED all, DATA all, EXIT all)
 *     unknown     answers an EXEC with DATA for a request that was never made
 *     flood       for the first EXEC, sends a chunk of stdout; once the second EXEC came
 *                 (STARTED, nothing more), stdout of the first without end and without
 *                 credit */
#include "link.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tap.h"

/* ---- the scripted peer ---- */

static uint8_t pbuf[AL_FRAME_HEADER_SIZE + AL_FRAME_PAYLOAD_MAX];
static uint8_t prbuf[AL_FRAME_HEADER_SIZE + AL_FRAME_PAYLOAD_MAX];
static struct al_decoder pdec;

static void psend(const struct al_msg *m)
{
    int n = al_msg_encode(m, pbuf, sizeof(pbuf));
    if (n < 0 || al_write_all(1, pbuf, (size_t)n) < 0)
        exit(3);
}

static void psend_data(uint32_t id, uint8_t stream, uint8_t flags, const void *p, size_t n)
{
    al_data_header(pbuf, id, stream, flags, (uint32_t)n);
    memcpy(pbuf + AL_FRAME_HEADER_SIZE + 1, p, n);
    if (al_write_all(1, pbuf, AL_FRAME_HEADER_SIZE + 1 + n) < 0)
        exit(3);
}

static void precv(struct al_msg *m)
{
    for (;;) {
        const char *why;
        int r = al_decoder_next(&pdec, m, &why);
        if (r < 0)
            exit(4);
        if (r == 1)
            return;
        size_t avail;
        uint8_t *space = al_decoder_space(&pdec, &avail);
        ssize_t n = read(0, space, avail);
        if (n <= 0)
            exit(0);
        al_decoder_commit(&pdec, (size_t)n);
    }
}

/* The next EXEC's id; other frames (credits, signals) are read past. */
static uint32_t pnext_exec(void)
{
    struct al_msg m;
    do
        precv(&m);
    while (m.type != AL_EXEC);
    return m.id;
}

static void pstarted(uint32_t id)
{
    struct al_msg m = {.type = AL_STARTED, .id = id};
    m.u.started.pid = 100 + id;
    psend(&m);
}

static void pexit(uint32_t id, int value)
{
    struct al_msg m = {.type = AL_EXIT, .id = id};
    m.u.exit.how = AL_EXIT_CODE;
    m.u.exit.value = value;
    psend(&m);
}

static int peer(const char *mode)
{
    al_decoder_init(&pdec, prbuf, sizeof(prbuf));
    struct al_msg m;
    precv(&m);
    if (m.type != AL_HELLO)
        return 5;
    struct al_msg a = {.type = AL_HELLO_ACK};
    a.u.hello_ack.version = AL_PROTO_VERSION;
    a.u.hello_ack.nonce = m.u.hello.nonce;
    a.u.hello_ack.window = AL_WINDOW_MIN;
    a.u.hello_ack.agent_version = al_str_cstr("peer");
    a.u.hello_ack.nlangs = 1;
    a.u.hello_ack.langs[0] = al_str_cstr("sh");
    psend(&a);
    if (!strcmp(mode, "reverse")) {
        uint32_t ids[64];
        for (int i = 0; i < 64; i++)
            ids[i] = pnext_exec();
        for (int i = 63; i >= 0; i--)
            pstarted(ids[i]);
        char text[32];
        for (int i = 63; i >= 0; i--) {
            int n = snprintf(text, sizeof(text), "reply-%u\n", ids[i]);
            psend_data(ids[i], AL_STREAM_STDOUT, 0, text, (size_t)n);
        }
        for (int i = 63; i >= 0; i--)
            pexit(ids[i], (int)(ids[i] % 100));
    } else if (!strcmp(mode, "unknown")) {
        uint32_t id = pnext_exec();
        pstarted(id);
        psend_data(id + 1000, AL_STREAM_STDOUT, 0, "x", 1);
    } else if (!strcmp(mode, "flood")) {
        static uint8_t chunk[AL_DATA_CHUNK_MAX];
        memset(chunk, 'f', sizeof(chunk));
        uint32_t first = pnext_exec();
        pstarted(first);
        psend_data(first, AL_STREAM_STDOUT, 0, chunk, sizeof(chunk));
        uint32_t second = pnext_exec();
        pstarted(second);
        for (;;)
            psend_data(first, AL_STREAM_STDOUT, 0, chunk, sizeof(chunk));
    }
    for (;;) /* hold the channel open, answering nothing */
        precv(&m);
}

/* ---- the tests ---- */

static const char *self_path;

static al_session *open_peer(const char *const *argv)
{
    al_session_opts so = {.struct_size = sizeof(al_session_opts), .quiet = true};
    al_session *s = NULL;
    al_error err = {0};
    if (al_session_open_peer(argv, &so, &s, &err) < 0)
        printf("# open: %s\n", err.msg);
    return s;
}

struct job {
    al_session *s;
    const char *const *argv;
    int stdin_fd;
    unsigned timeout_ms;
    int (*slow)(void *ctx, int stream, const uint8_t *data, size_t n);
    int rc;
    al_exec_result res;
    al_error err;
    char out[256];
    size_t len;
};

static int collect(void *ctx, int stream, const uint8_t *data, size_t n)
{
    struct job *j = ctx;
    if (stream == 1) {
        size_t room = sizeof(j->out) - 1 - j->len;
        n = n < room ? n : room;
        memcpy(j->out + j->len, data, n);
        j->len += n;
    }
    return 0;
}

static void *job_thread(void *arg)
{
    struct job *j = arg;
    al_exec_opts o = {.struct_size = sizeof(al_exec_opts),
                      .argv = j->argv,
                      .stdin_fd = j->stdin_fd,
                      .stdout_fd = -1,
                      .stderr_fd = -1,
                      .timeout_ms = j->timeout_ms,
                      .output = j->slow ? j->slow : collect,
                      .output_ctx = j};
    j->res = (al_exec_result)AL_EXEC_RESULT_INIT;
    j->rc = al_exec(j->s, &o, &j->res, &j->err);
    return NULL;
}

/* ---- processes by handle (proc.c) ---- */

struct listing {
    unsigned n, running;
    char commands[256];
};

static void list_one(void *ctx, const al_proc_info *info)
{
    struct listing *l = ctx;
    l->n++;
    l->running += info->running;
    size_t used = strlen(l->commands);
    snprintf(l->commands + used, sizeof(l->commands) - used, "%s[%s]", used ? " " : "",
             info->command);
}

static int to_collect(void *ctx, int stream, const uint8_t *data, size_t n)
{
    struct job *j = ctx;
    return collect(j, stream, data, n);
}

/* The language kernels' driver scripts (guest-agent/kernels in the source tree). */
static const char *kernels_dir;

/* A session on the agent, run as `AGENT --stdio --root ROOT --kernels DIR` (root: a mkdtemp
 * template). */
static al_session *agent_session(const char *agent, char *root, const char *what)
{
    if (!mkdtemp(root)) {
        ok(false, "mkdtemp");
        return NULL;
    }
    const char *argv[] = {agent, "--stdio", "--root", root, "--kernels", kernels_dir, NULL};
    al_session *s = open_peer(argv);
    ok(s != NULL, "%s", what);
    return s;
}

static void test_procs(const char *agent)
{
    char root[] = "/tmp/airlock-test-link-XXXXXX";
    al_session *s = agent_session(agent, root, "procs: a session on airlock-agent --stdio");
    if (!s)
        return;
    al_error err = {0};
    /* A background process: the handle comes at once, the run goes on beside a foreground one. */
    const char *sleeper[] = {"/bin/sh", "-c", "echo up; exec sleep 30", NULL};
    struct job out = {0};
    al_exec_opts o = AL_EXEC_OPTS_INIT;
    o.argv = sleeper;
    o.output = to_collect;
    o.output_ctx = &out;
    al_proc *p = NULL;
    uint64_t t0 = al_now_ms();
    int r = al_exec_start(s, &o, &p, &err);
    ok(r == 0 && p && al_now_ms() - t0 < 5000, "al_exec_start returns at once (%s)", err.msg);
    if (r < 0) {
        al_session_close(s);
        return;
    }
    for (int i = 0; i < 100 && !al_proc_pid(p); i++)
        usleep(50 * 1000);
    ok(al_proc_pid(p) > 0, "its guest pid comes once it started (%u)", al_proc_pid(p));
    al_exec_result res = AL_EXEC_RESULT_INIT;
    err = (al_error){0};
    ok(al_proc_wait(p, 0, &res, &err) == -EAGAIN, "a wait of 0 ms says it still runs");
    const char *echo_argv[] = {"/bin/echo", "fg", NULL};
    struct job fg = {.s = s, .argv = echo_argv, .stdin_fd = -1};
    job_thread(&fg);
    ok(fg.rc == 0 && !strcmp(fg.out, "fg\n"), "a foreground run ends while it runs");

    /* A second one, and the list of both. */
    /* Its output to a descriptor, as al_exec writes it without a callback. */
    const char *quick[] = {"/bin/sh", "-c", "echo to-fd; exit 7", NULL};
    int fdout[2];
    if (pipe2(fdout, O_CLOEXEC) < 0)
        return;
    al_exec_opts q = AL_EXEC_OPTS_INIT;
    q.argv = quick;
    q.stdout_fd = fdout[1];
    al_proc *p2 = NULL;
    err = (al_error){0};
    r = al_exec_start(s, &q, &p2, &err);
    res = (al_exec_result)AL_EXEC_RESULT_INIT;
    ok(r == 0 && al_proc_wait(p2, 30000, &res, &err) == 0 && res.how == AL_EXEC_EXITED &&
           res.value == 7,
       "a second one's status comes through al_proc_wait (%d)", res.value);
    close(fdout[1]);
    char fdtext[32] = "";
    ssize_t got = read(fdout[0], fdtext, sizeof(fdtext) - 1);
    close(fdout[0]);
    ok(got == 6 && !memcmp(fdtext, "to-fd\n", 6), "its stdout reached its descriptor (%zd)", got);
    struct listing l = {0};
    int n = al_proc_list(s, list_one, &l);
    ok(n == 2 && l.n == 2 && l.running == 1 &&
           strstr(l.commands, "[/bin/sh -c echo to-fd; exit 7]"),
       "al_proc_list: both, one running (%s)", l.commands);
    al_proc_free(p2);

    /* Its signal: KILL ends it and what it started; it reported its output first. */
    err = (al_error){0};
    r = al_proc_kill(p, &err);
    res = (al_exec_result)AL_EXEC_RESULT_INIT;
    int w = al_proc_wait(p, 30000, &res, &err);
    ok(r == 0 && (w == -ECANCELED || (w == 0 && res.how == AL_EXEC_SIGNALED)),
       "al_proc_kill ends it (wait %d: %s)", w, err.msg);
    ok(!strcmp(out.out, "up\n"), "its output reached the callback (%s)", out.out);
    err = (al_error){0};
    ok(al_proc_signal(p, SIGINT, &err) == -ESRCH, "a signal after its end: -ESRCH");
    al_proc_free(p);

    /* One still running when the session closes: the close ends it, the handle still answers. */
    al_exec_opts o3 = AL_EXEC_OPTS_INIT;
    o3.argv = sleeper;
    al_proc *p3 = NULL;
    r = al_exec_start(s, &o3, &p3, &err);
    ok(r == 0, "a third one starts");
    for (int i = 0; i < 100 && r == 0 && !al_proc_pid(p3); i++)
        usleep(50 * 1000);
    t0 = al_now_ms();
    al_session_close(s);
    err = (al_error){0};
    w = r == 0 ? al_proc_wait(p3, 0, NULL, &err) : -1;
    ok(w < 0 && w != -EAGAIN && al_now_ms() - t0 < 20000,
       "al_session_close ends a running one; its wait then answers (%d: %s)", w, err.msg);
    if (r == 0)
        al_proc_free(p3);
    al_rmtree(root);
}

static void test_agent(const char *agent)
{
    char root[] = "/tmp/airlock-test-link-XXXXXX";
    al_session *s = agent_session(agent, root, "a session on airlock-agent --stdio, no VM");
    if (!s)
        return;

    /* A run blocked on its stdin does not hold another: the second ends first. */
    int in[2];
    if (pipe2(in, O_CLOEXEC) < 0)
        return;
    const char *cat_argv[] = {"/bin/sh", "-c", "read x; echo got-$x", NULL};
    const char *echo_argv[] = {"/bin/echo", "beside", NULL};
    struct job a = {.s = s, .argv = cat_argv, .stdin_fd = in[0]};
    struct job b = {.s = s, .argv = echo_argv, .stdin_fd = -1};
    pthread_t ta, tb;
    pthread_create(&ta, NULL, job_thread, &a);
    usleep(200 * 1000);
    pthread_create(&tb, NULL, job_thread, &b);
    pthread_join(tb, NULL);
    ok(b.rc == 0 && !strcmp(b.out, "beside\n"), "a run ends while another waits for input (%.*s)",
       (int)strcspn(b.rc ? b.err.msg : b.out, "\n"), b.rc ? b.err.msg : b.out);
    if (write(in[1], "yes\n", 4) != 4)
        ok(false, "write stdin");
    close(in[1]);
    pthread_join(ta, NULL);
    close(in[0]);
    ok(a.rc == 0 && !strcmp(a.out, "got-yes\n"), "the waiting run then gets its input (%.*s)",
       (int)strcspn(a.rc ? a.err.msg : a.out, "\n"), a.rc ? a.err.msg : a.out);

    /* 64 at once, each with its own output and status. */
    enum { N = 60 };
    static struct job jobs[N];
    static char codes[N][48];
    static const char *argvs[N][4];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        snprintf(codes[i], sizeof(codes[i]), "sleep 0.$((%d %% 5)); echo run-%d; exit %d", i, i,
                 i % 7);
        argvs[i][0] = "/bin/sh", argvs[i][1] = "-c", argvs[i][2] = codes[i], argvs[i][3] = NULL;
        jobs[i] = (struct job){.s = s, .argv = argvs[i], .stdin_fd = -1};
        pthread_create(&th[i], NULL, job_thread, &jobs[i]);
    }
    int right = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        char want[32];
        snprintf(want, sizeof(want), "run-%d\n", i);
        right += jobs[i].rc == 0 && !strcmp(jobs[i].out, want) && jobs[i].res.value == i % 7;
    }
    ok(right == N, "%d runs at once: %d with their own output and status", N, right);

    /* A timeout of one run holds while another runs on. */
    const char *long_argv[] = {"/bin/sh", "-c", "sleep 3; echo long", NULL};
    const char *short_argv[] = {"/bin/sh", "-c", "sleep 30", NULL};
    struct job l = {.s = s, .argv = long_argv, .stdin_fd = -1};
    struct job t = {.s = s, .argv = short_argv, .stdin_fd = -1, .timeout_ms = 500};
    pthread_create(&ta, NULL, job_thread, &l);
    pthread_create(&tb, NULL, job_thread, &t);
    pthread_join(tb, NULL);
    pthread_join(ta, NULL);
    ok(t.rc == 0 && t.res.timed_out, "the short timeout fired (%s)", t.err.msg);
    ok(l.rc == 0 && !strcmp(l.out, "long\n") && !l.res.timed_out, "the other run went on");
    al_session_close(s);
    al_rmtree(root);
}

/* ---- kernel runs wait their turn (al_link_queue) ---- */

struct kjob {
    al_session *s;
    char code[96];
    int cancel_fd;
    size_t struct_size; /* 0: sizeof(al_exec_opts) */
    int rc;
    al_error err;
    al_exec_result res;
    char out[64];
    size_t len;
    unsigned first_ahead; /* what the queue callback said first (UINT_MAX: never called) */
};

static void kjob_queued(void *ctx, unsigned ahead)
{
    struct kjob *k = ctx;
    if (k->first_ahead == UINT_MAX)
        k->first_ahead = ahead;
}

static int kjob_collect(void *ctx, int stream, const uint8_t *data, size_t n)
{
    struct kjob *k = ctx;
    if (stream == 1 && n < sizeof(k->out) - 1 - k->len) {
        memcpy(k->out + k->len, data, n);
        k->len += n;
    }
    return 0;
}

static void *kjob_thread(void *arg)
{
    struct kjob *k = arg;
    const char *argv[] = {k->code, NULL};
    al_exec_opts o = {.struct_size = k->struct_size ? k->struct_size : sizeof(al_exec_opts),
                      .argv = argv,
                      .lang = "shell",
                      .kernel = true,
                      .stdin_fd = -1,
                      .stdout_fd = -1,
                      .stderr_fd = -1,
                      .cancel_fd = k->cancel_fd,
                      .timeout_ms = 60000,
                      .output = kjob_collect,
                      .output_ctx = k};
    if (!k->struct_size)
        o.queued = kjob_queued;
    k->res = (al_exec_result)AL_EXEC_RESULT_INIT;
    k->rc = al_exec(k->s, &o, &k->res, &k->err);
    return NULL;
}

static void test_kernel_queue(const char *agent)
{
    char root[] = "/tmp/airlock-test-link-XXXXXX";
    al_session *s = agent_session(agent, root, "kernel queue: a session on airlock-agent --stdio");
    if (!s)
        return;
    enum { N = 6 };
    static struct kjob k[N + 1];
    pthread_t th[N + 1];
    /* Six runs for one shell kernel, sent 50 ms apart while the first runs: none is refused
     * (the kernel runs one at a time), each its own output, in the order sent. The seventh is
     * cancelled while it waits: it never runs. */
    for (int i = 0; i <= N; i++) {
        k[i] = (struct kjob){.s = s, .cancel_fd = -1, .first_ahead = UINT_MAX};
        snprintf(k[i].code, sizeof(k[i].code), "sleep 0.3; echo %d >> %s/order; echo k-%d", i, root,
                 i);
    }
    int cancel[2];
    if (pipe2(cancel, O_CLOEXEC) < 0)
        return;
    k[N].cancel_fd = cancel[0];
    for (int i = 0; i <= N; i++) {
        pthread_create(&th[i], NULL, kjob_thread, &k[i]);
        usleep(50 * 1000);
    }
    uint8_t sig = SIGINT;
    if (write(cancel[1], &sig, 1) != 1)
        ok(false, "write cancel");
    int right = 0;
    for (int i = 0; i <= N; i++) {
        pthread_join(th[i], NULL);
        char want[16];
        snprintf(want, sizeof(want), "k-%d\n", i);
        right += i < N && k[i].rc == 0 && !strcmp(k[i].out, want);
    }
    ok(right == N, "%d kernel runs at once: %d ran, each with its own output (%s)", N, right,
       k[1].rc ? k[1].err.msg : "");
    ok(k[1].first_ahead >= 1, "a waiting run is told its place (%u ahead)", k[1].first_ahead);
    ok(k[N].rc == -ECANCELED, "a run cancelled while it waited never ran (%s)", k[N].err.msg);
    char path[128], order[64] = "";
    snprintf(path, sizeof(path), "%s/order", root);
    FILE *f = fopen(path, "re");
    size_t got = f ? fread(order, 1, sizeof(order) - 1, f) : 0;
    order[got] = '\0';
    if (f)
        fclose(f);
    bool in_order = !strcmp(order, "0\n1\n2\n3\n4\n5\n");
    for (char *c = order; *c; c++)
        *c = *c == '\n' ? ' ' : *c; /* one line of TAP */
    ok(in_order, "they ran in the order sent (%s)", order);
    /* A caller built before the queue callback passes the smaller struct: taken. */
    struct kjob old = {.s = s, .cancel_fd = -1, .struct_size = offsetof(al_exec_opts, queued)};
    snprintf(old.code, sizeof(old.code), "echo old");
    kjob_thread(&old);
    ok(old.rc == 0 && !strcmp(old.out, "old\n"), "an older caller's al_exec_opts is taken (%s)",
       old.err.msg);
    close(cancel[0]);
    close(cancel[1]);
    al_session_close(s);
    al_rmtree(root);
}

/* ---- a tunnel whose host-side reader stopped reading ---- */

/* A service on the host's loopback (where the agent --stdio connects) that floods each
 * connection until it is closed. */
static void *flood_service(void *arg)
{
    int lfd = *(int *)arg;
    static char chunk[65536];
    memset(chunk, 'z', sizeof(chunk));
    for (;;) {
        int c = accept(lfd, NULL, NULL);
        if (c < 0)
            return NULL;
        while (send(c, chunk, sizeof(chunk), MSG_NOSIGNAL) > 0)
            ;
        close(c);
    }
}

struct relay {
    al_session *s;
    unsigned port;
    int fd, cancel_fd;
    int rc;
    al_error err;
};

static void *relay_thread(void *arg)
{
    struct relay *r = arg;
    r->rc = al_port_relay(r->s, r->port, r->fd, r->cancel_fd, NULL, &r->err);
    return NULL;
}

/* Relays a flood into a socket nobody reads, then ends the tunnel by its cancel byte (or, with
 * stop, by the session's stop): the relay must return, not wait on its full socket. */
static void tunnel_stall(al_session *s, unsigned port, bool stop)
{
    int sv[2], cp[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0 || pipe2(cp, O_CLOEXEC) < 0) {
        ok(false, "socketpair");
        return;
    }
    struct relay r = {.s = s, .port = port, .fd = sv[1], .cancel_fd = cp[0]};
    pthread_t th;
    pthread_create(&th, NULL, relay_thread, &r);
    usleep(1500 * 1000); /* every buffer fills: the relay waits to write */
    uint8_t kill = SIGKILL;
    if (stop)
        al_session_stop(s);
    else if (write(cp[1], &kill, 1) != 1)
        ok(false, "write the cancel byte");
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 15;
    int j = pthread_timedjoin_np(th, NULL, &ts);
    ok(j == 0 && r.rc < 0, "a tunnel stalled on its host side ends on %s (%s)",
       stop ? "the session's stop" : "its cancel byte", j ? "still waiting after 15 s" : r.err.msg);
    if (j) {
        printf("Bail out! a relay thread is stuck\n");
        exit(1);
    }
    close(sv[0]);
    close(sv[1]);
    close(cp[0]);
    close(cp[1]);
}

static void test_tunnel_stall(const char *agent)
{
    char root[] = "/tmp/airlock-test-link-XXXXXX";
    if (!mkdtemp(root)) {
        ok(false, "mkdtemp");
        return;
    }
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(lfd, 4) < 0 ||
        getsockname(lfd, (struct sockaddr *)&sa, &sl) < 0) {
        ok(false, "a flooding service on the loopback");
        return;
    }
    pthread_t svc;
    pthread_create(&svc, NULL, flood_service, &lfd);
    pthread_detach(svc);
    const char *argv[] = {agent, "--stdio", "--root", root, NULL};
    for (int stop = 0; stop < 2; stop++) {
        al_session *s = open_peer(argv);
        if (!s) {
            ok(false, "a session on airlock-agent --stdio");
            break;
        }
        tunnel_stall(s, ntohs(sa.sin_port), stop);
        al_session_close(s);
    }
    al_rmtree(root);
}

static void test_reverse(void)
{
    const char *argv[] = {self_path, "--peer", "reverse", NULL};
    al_session *s = open_peer(argv);
    ok(s != NULL, "a session on the scripted peer");
    if (!s)
        return;
    static struct job jobs[64];
    static const char *one[] = {"x", NULL};
    pthread_t th[64];
    for (int i = 0; i < 64; i++) {
        jobs[i] = (struct job){.s = s, .argv = one, .stdin_fd = -1};
        pthread_create(&th[i], NULL, job_thread, &jobs[i]);
    }
    int right = 0;
    uint32_t seen = 0;
    for (int i = 0; i < 64; i++) {
        pthread_join(th[i], NULL);
        unsigned id = 0;
        if (jobs[i].rc == 0 && sscanf(jobs[i].out, "reply-%u", &id) == 1 &&
            jobs[i].res.value == (int)(id % 100) && id < 64 + 8)
            right++, seen++;
        else
            printf("# job %d: rc %d %s out '%s'\n", i, jobs[i].rc, jobs[i].err.msg, jobs[i].out);
    }
    ok(right == 64, "64 requests answered in reverse, interleaved: %d got their own frames", right);
    al_session_close(s);
}

static void test_unknown(void)
{
    const char *argv[] = {self_path, "--peer", "unknown", NULL};
    al_session *s = open_peer(argv);
    if (!s) {
        ok(false, "a session on the scripted peer");
        return;
    }
    static const char *one[] = {"x", NULL};
    struct job j = {.s = s, .argv = one, .stdin_fd = -1};
    job_thread(&j);
    ok(j.rc == -EPROTO && strstr(j.err.msg, "unknown request"),
       "a frame for a request never made fails the run (%s)", j.err.msg);
    struct job k = {.s = s, .argv = one, .stdin_fd = -1};
    job_thread(&k);
    ok(k.rc == -EPROTO && strstr(k.err.msg, "broke the protocol"),
       "and the session takes no more requests (%s)", k.err.msg);
    al_session_close(s);
}

/* The first run's caller stops taking its output; the peer floods it past its credit while the
 * second run reads the channel: the flood lands in the first's bounded queue, which fails the
 * session instead of growing. */
static volatile int slow_started;

static int slow_output(void *ctx, int stream, const uint8_t *data, size_t n)
{
    (void)ctx, (void)stream, (void)data, (void)n;
    if (!slow_started) {
        slow_started = 1;
        sleep(3);
    }
    return 0;
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

static void test_flood(void)
{
    const char *argv[] = {self_path, "--peer", "flood", NULL};
    al_session *s = open_peer(argv);
    if (!s) {
        ok(false, "a session on the scripted peer");
        return;
    }
    static const char *one[] = {"x", NULL};
    struct job a = {.s = s, .argv = one, .stdin_fd = -1, .slow = slow_output};
    struct job b = {.s = s, .argv = one, .stdin_fd = -1};
    long rss0 = rss_kib();
    pthread_t ta, tb;
    pthread_create(&ta, NULL, job_thread, &a);
    while (!slow_started)
        usleep(10000);
    pthread_create(&tb, NULL, job_thread, &b);
    pthread_join(tb, NULL);
    pthread_join(ta, NULL);
    long grown = rss_kib() - rss0;
    ok(a.rc == -EPROTO && strstr(a.err.msg, "credit"), "the flooded run fails: %s", a.err.msg);
    ok(b.rc == -EPROTO, "the other run ends with it: %s", b.err.msg);
    ok(grown < 64 * 1024, "the host grew by %ld KiB, not by the flood", grown);
    al_session_close(s);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if (argc == 3 && !strcmp(argv[1], "--peer"))
        return peer(argv[2]);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 3) {
        fprintf(stderr, "usage: test-link AGENT KERNELS_DIR | test-link --peer MODE\n");
        return 2;
    }
    kernels_dir = argv[2];
    self_path = "/proc/self/exe";
    static char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n > 0) {
        exe[n] = '\0';
        self_path = exe;
    }
    test_agent(argv[1]);
    test_procs(argv[1]);
    test_kernel_queue(argv[1]);
    test_tunnel_stall(argv[1]);
    test_reverse();
    test_unknown();
    test_flood();
    return tap_done();
}

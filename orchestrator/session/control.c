/* The control socket: lets other airlock processes of the same user (airlock cp, airlock ps,
 * airlock shell) use a session this process holds. One unix socket per session, in its runtime
 * dir, mode 0600; a thread accepts, and each connection is served by a thread of its own (at
 * most CONTROL_WORKERS_MAX at once), so a shell held open does not hold up a copy. A request is
 * one JSON line (bounded) plus the fds of the command's stdin, stdout and stderr (and a pty
 * run's resizes) passed with SCM_RIGHTS, the answer one JSON line. Each request is one of the
 * session's requests in flight beside the owner's (link.c). */
#include "control.h"
#include "exec.h"
#include "session.h"
#include "tar.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>

/* A request is an argv and a few numbers: far below this. */
#define REQUEST_MAX (64 * 1024)
/* An answer is a status or one error line. */
#define ANSWER_MAX 4096
/* A client has this long to send its request once connected; the server serves one at a time. */
#define REQUEST_TIMEOUT_S 5
/* Connections served at once; more are answered "busy". */
#define CONTROL_WORKERS_MAX 16
/* stdin, stdout, stderr and a pty run's resize pipe. */
#define CONTROL_FDS 4
/* The info file is a few fields. */
#define INFO_MAX 4096
#define CONTROL_SOCK "control.sock"
#define INFO_FILE "info.json"

struct control_worker {
    struct al_control *c;
    int fd;             /* the connection; -1: a free slot */
    int cancel_pipe[2]; /* its request's signal pipe: closing the session writes to it */
};

struct al_control {
    al_session *s;
    int listen_fd;
    int stop_pipe[2]; /* wakes the server to end */
    atomic_bool stopping;
    pthread_t thread;
    pthread_mutex_t mu; /* the workers' slots and count */
    pthread_cond_t idle;
    unsigned nworkers;
    struct control_worker workers[CONTROL_WORKERS_MAX];
    char path[AL_PATH_MAX];
};

/* Sends len bytes from off on; a peer gone is an error, not a SIGPIPE. */
static int send_all(int fd, const char *buf, size_t off, size_t len)
{
    while (off < len) {
        ssize_t n = send(fd, buf + off, len - off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        off += (size_t)n;
    }
    return 0;
}

/* ---- serving ---- */

static int send_line(int fd, const cJSON *j)
{
    _cleanup_free_ char *text = cJSON_PrintUnformatted(j);
    if (!text)
        return -ENOMEM;
    size_t len = strlen(text);
    text[len] = '\n'; /* replaces the NUL: sent with its length */
    return send_all(fd, text, 0, len + 1);
}

static void answer_error(int fd, int code, const char *msg)
{
    _cleanup_cjson_ cJSON *j = cJSON_CreateObject();
    if (!j)
        return;
    cJSON_AddBoolToObject(j, "ok", false);
    cJSON_AddNumberToObject(j, "code", code);
    cJSON_AddStringToObject(j, "error", msg);
    send_line(fd, j);
}

/* The answer to a request that returned r: NULL once a failure is answered (or out of memory),
 * else an {"ok": true} object for the caller to fill and send. */
static cJSON *answer_begin(int fd, int r, const al_error *err)
{
    if (r < 0) {
        answer_error(fd, r, err->msg);
        return NULL;
    }
    cJSON *j = cJSON_CreateObject();
    if (j)
        cJSON_AddBoolToObject(j, "ok", true);
    return j;
}

/* Reads one line into buf (NUL-terminated), taking up to nfds passed fds with the first bytes. */
static int recv_request(int fd, char *buf, size_t len, int *fds, size_t nfds)
{
    size_t have = 0;
    bool first = true;
    while (have < len - 1) {
        union {
            struct cmsghdr h;
            char b[CMSG_SPACE(CONTROL_FDS * sizeof(int))];
        } cm;
        struct iovec iov = {buf + have, len - 1 - have};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
        if (first) {
            mh.msg_control = cm.b;
            mh.msg_controllen = sizeof(cm.b);
        }
        ssize_t n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (first) {
            for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
                if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                    continue;
                size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                int got[CONTROL_FDS];
                k = k < CONTROL_FDS ? k : CONTROL_FDS; /* the buffer holds no more */
                memcpy(got, CMSG_DATA(c), k * sizeof(int));
                for (size_t i = 0; i < k; i++) {
                    if (i < nfds)
                        fds[i] = got[i];
                    else
                        close(got[i]);
                }
            }
            first = false;
        }
        if (n == 0)
            return -ECONNRESET;
        char *nl = memchr(buf + have, '\n', (size_t)n);
        have += (size_t)n;
        if (nl) {
            *nl = '\0';
            return 0;
        }
    }
    return -E2BIG;
}

static char **json_strings(const cJSON *arr, size_t max)
{
    size_t n = (size_t)cJSON_GetArraySize(arr);
    if (!cJSON_IsArray(arr) || n == 0 || n > max)
        return NULL;
    char **v = calloc(n + 1, sizeof(*v));
    size_t i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr)
    {
        if (!v || !cJSON_IsString(it)) {
            free(v);
            return NULL;
        }
        v[i++] = it->valuestring;
    }
    return v;
}

/* A number of a request in 0..max, else -1 (JSON numbers are doubles: kept in range before
 * the cast). */
static long json_uint(const cJSON *j, double max)
{
    return cJSON_IsNumber(j) && j->valuedouble >= 0 && j->valuedouble <= max ? (long)j->valuedouble
                                                                             : -1;
}

static void serve_exec(struct control_worker *w, int fd, const cJSON *req, int fds[CONTROL_FDS])
{
    struct al_control *c = w->c;
    _cleanup_free_ char **argv = json_strings(cJSON_GetObjectItem(req, "argv"), AL_ARGV_MAX);
    const cJSON *cwd = cJSON_GetObjectItem(req, "cwd");
    const cJSON *cap = cJSON_GetObjectItem(req, "output_cap");
    const cJSON *tmo = cJSON_GetObjectItem(req, "timeout_ms");
    const cJSON *pty = cJSON_GetObjectItem(req, "pty");
    long rows = pty ? json_uint(cJSON_GetArrayItem(pty, 0), AL_PTY_ROWS_COLS_MAX) : 0;
    long cols = pty ? json_uint(cJSON_GetArrayItem(pty, 1), AL_PTY_ROWS_COLS_MAX) : 0;
    if (!argv || fds[1] < 0 || fds[2] < 0 || (cwd && !cJSON_IsString(cwd)) ||
        (cap && !cJSON_IsNumber(cap)) || (tmo && !cJSON_IsNumber(tmo)) ||
        (pty && (!cJSON_IsArray(pty) || rows < 1 || cols < 1))) {
        answer_error(fd, -EINVAL, "malformed exec request");
        return;
    }
    al_exec_opts o = {
        .struct_size = sizeof(al_exec_opts),
        .argv = (const char *const *)argv,
        .cwd = cwd ? cwd->valuestring : NULL,
        /* Numbers from JSON are doubles: kept in range before the casts. */
        .output_cap = cap && cap->valuedouble > 0 && cap->valuedouble < 0x1p63
                          ? (uint64_t)cap->valuedouble
                          : 0,
        .timeout_ms = tmo && tmo->valuedouble > 0 && tmo->valuedouble < 0x1p32
                          ? (unsigned)tmo->valuedouble
                          : 0,
        .stdin_fd = pty && cJSON_IsFalse(cJSON_GetObjectItem(req, "stdin")) ? -1 : fds[0],
        .stdout_fd = fds[1],
        .stderr_fd = fds[2],
        .pty_rows = pty ? (unsigned)rows : 0,
        .pty_cols = pty ? (unsigned)cols : 0,
        .resize_fd = pty ? fds[3] : -1,
    };
    al_exec_result res = AL_EXEC_RESULT_INIT;
    al_error err = {0};
    int r;
    if (atomic_load(&c->stopping)) {
        answer_error(fd, -ESHUTDOWN, "the session is closing");
        return;
    }
    /* A request beside the owner's (link.c); the owner's signals stay the owner's, closing the
     * session cancels ours. */
    o.cancel_fd = w->cancel_pipe[0];
    r = al_exec(c->s, &o, &res, &err);
    _cleanup_cjson_ cJSON *j = answer_begin(fd, r, &err);
    if (!j)
        return;
    cJSON_AddNumberToObject(j, "how", res.how);
    cJSON_AddNumberToObject(j, "value", res.value);
    cJSON_AddNumberToObject(j, "duration_us", (double)res.duration_us);
    cJSON_AddBoolToObject(j, "timed_out", res.timed_out);
    cJSON_AddBoolToObject(j, "truncated_stdout", res.truncated_stdout);
    cJSON_AddBoolToObject(j, "truncated_stderr", res.truncated_stderr);
    send_line(fd, j);
}

struct hangup_watch {
    int conn, done, cancel; /* the client's connection; a pipe that ends the watch; a kill */
};

/* The client gone (its connection closed: its forward's end) ends its tunnel. */
static void *watch_hangup(void *p)
{
    struct hangup_watch *h = p;
    struct pollfd pfd[2] = {{h->conn, POLLRDHUP, 0}, {h->done, POLLIN, 0}};
    while (poll(pfd, 2, -1) < 0 && errno == EINTR)
        ;
    if (!pfd[1].revents && pfd[0].revents) {
        uint8_t kill = SIGKILL;
        (void)!write(h->cancel, &kill, 1);
    }
    return NULL;
}

/* A tunnel to a guest port for the connection fds[0] (airlock port): until either side ends,
 * the client goes, or the session closes. */
static void serve_port(struct control_worker *w, int fd, const cJSON *req, int fds[CONTROL_FDS])
{
    long port = json_uint(cJSON_GetObjectItem(req, "port"), 65535);
    if (port < 1 || fds[0] < 0) {
        answer_error(fd, -EINVAL, "malformed port request");
        return;
    }
    if (atomic_load(&w->c->stopping)) {
        answer_error(fd, -ESHUTDOWN, "the session is closing");
        return;
    }
    int done[2];
    if (pipe2(done, O_CLOEXEC) < 0) {
        answer_error(fd, -errno, "cannot make a pipe");
        return;
    }
    struct hangup_watch h = {fd, done[0], w->cancel_pipe[1]};
    pthread_t watcher;
    bool watching = pthread_create(&watcher, NULL, watch_hangup, &h) == 0;
    al_port_counts n = AL_PORT_COUNTS_INIT;
    al_error err = {0};
    int r = al_port_relay(w->c->s, (unsigned)port, fds[0], w->cancel_pipe[0], &n, &err);
    (void)!write(done[1], "x", 1);
    if (watching)
        pthread_join(watcher, NULL);
    close(done[0]);
    close(done[1]);
    uint8_t b; /* a kill the watcher sent that the relay did not take */
    while (read(w->cancel_pipe[0], &b, 1) == 1)
        ;
    _cleanup_cjson_ cJSON *j = answer_begin(fd, r, &err);
    if (!j)
        return;
    cJSON_AddNumberToObject(j, "to_guest", (double)n.to_guest);
    cJSON_AddNumberToObject(j, "from_guest", (double)n.from_guest);
    send_line(fd, j);
}

/* An image of the session's disk, into this process's image store (al_image_commit). */
static void serve_commit(struct control_worker *w, int fd, const cJSON *req)
{
    al_image_commit_opts o = AL_IMAGE_COMMIT_OPTS_INIT;
    const cJSON *name = cJSON_GetObjectItem(req, "name");
    const cJSON *ck = cJSON_GetObjectItem(req, "checkpoint");
    const cJSON *force = cJSON_GetObjectItem(req, "force");
    if (!cJSON_IsString(name) ||
        (ck && (!cJSON_IsNumber(ck) || ck->valuedouble < 0 || ck->valuedouble > UINT32_MAX))) {
        answer_error(fd, -EINVAL, "a commit needs an image name");
        return;
    }
    o.name = name->valuestring;
    o.checkpoint = ck ? (uint32_t)ck->valuedouble : 0;
    o.force = cJSON_IsTrue(force);
    al_error err = {0};
    int r = al_image_commit(w->c->s, &o, &err);
    _cleanup_cjson_ cJSON *j = answer_begin(fd, r, &err);
    if (j)
        send_line(fd, j);
}

static void serve_one(struct control_worker *w, int fd)
{
    struct ucred cred;
    socklen_t clen = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0 ||
        (cred.uid != geteuid() && cred.uid != 0))
        return;
    struct timeval tv = {.tv_sec = REQUEST_TIMEOUT_S};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    _cleanup_free_ char *buf = malloc(REQUEST_MAX);
    int fds[CONTROL_FDS] = {-1, -1, -1, -1};
    if (buf && recv_request(fd, buf, REQUEST_MAX, fds, CONTROL_FDS) == 0) {
        _cleanup_cjson_ cJSON *req = cJSON_Parse(buf);
        const cJSON *op = cJSON_GetObjectItem(req, "op");
        if (cJSON_IsString(op) && !strcmp(op->valuestring, "exec"))
            serve_exec(w, fd, req, fds);
        else if (cJSON_IsString(op) && !strcmp(op->valuestring, "port"))
            serve_port(w, fd, req, fds);
        else if (cJSON_IsString(op) && !strcmp(op->valuestring, "commit"))
            serve_commit(w, fd, req);
        else
            answer_error(fd, -EINVAL, "unknown request");
    }
    for (int i = 0; i < CONTROL_FDS; i++)
        al_closep(&fds[i]);
}

static void *work(void *p)
{
    struct control_worker *w = p;
    struct al_control *c = w->c;
    serve_one(w, w->fd);
    pthread_mutex_lock(&c->mu);
    al_closep(&w->fd);
    for (int i = 0; i < 2; i++)
        al_closep(&w->cancel_pipe[i]);
    if (--c->nworkers == 0)
        pthread_cond_broadcast(&c->idle);
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* Hands the connection to a thread of its own in a free slot; "busy" when there is none. */
static void dispatch(struct al_control *c, int fd)
{
    pthread_mutex_lock(&c->mu);
    struct control_worker *w = NULL;
    for (size_t i = 0; i < CONTROL_WORKERS_MAX && !w; i++)
        if (c->workers[i].fd < 0)
            w = &c->workers[i];
    pthread_t t;
    pthread_attr_t attr;
    bool started = false;
    if (w && pipe2(w->cancel_pipe, O_CLOEXEC | O_NONBLOCK) == 0) {
        w->fd = fd;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        started = pthread_create(&t, &attr, work, w) == 0;
        pthread_attr_destroy(&attr);
        if (started) {
            c->nworkers++;
        } else {
            w->fd = -1;
            for (int i = 0; i < 2; i++)
                al_closep(&w->cancel_pipe[i]);
        }
    }
    pthread_mutex_unlock(&c->mu);
    if (!started) {
        answer_error(fd, -EBUSY, "the session serves too many requests at once");
        close(fd);
    }
}

static void *serve(void *p)
{
    struct al_control *c = p;
    for (;;) {
        struct pollfd pfd[2] = {{c->listen_fd, POLLIN, 0}, {c->stop_pipe[0], POLLIN, 0}};
        if (poll(pfd, 2, -1) < 0 && errno != EINTR)
            break;
        if (pfd[1].revents || atomic_load(&c->stopping))
            break;
        if (!pfd[0].revents)
            continue;
        int fd = accept4(c->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd >= 0)
            dispatch(c, fd);
    }
    return NULL;
}

static int write_info(al_session *s, al_error *err)
{
    _cleanup_cjson_ cJSON *j = cJSON_CreateObject();
    if (!j || !cJSON_AddStringToObject(j, "name", s->name) ||
        !cJSON_AddStringToObject(j, "image", s->img.name) ||
        !cJSON_AddNumberToObject(j, "started", (double)time(NULL)) ||
        !cJSON_AddNumberToObject(j, "pid", (double)getpid()))
        return al_err(err, -ENOMEM, "out of memory");
    _cleanup_free_ char *text = cJSON_PrintUnformatted(j);
    char path[AL_PATH_MAX], tmp[AL_PATH_MAX];
    if (!text || al_pathf(path, sizeof(path), "%s/" INFO_FILE, s->dir) < 0 ||
        al_pathf(tmp, sizeof(tmp), "%s/." INFO_FILE, s->dir) < 0)
        return al_err(err, -ENOMEM, "cannot describe the session");
    int fd = al_file_create_private(tmp, O_TRUNC);
    if (fd < 0)
        errno = -fd;
    FILE *f = fd < 0 ? NULL : fdopen(fd, "w");
    if (fd >= 0 && !f)
        close(fd);
    bool ok = f && fputs(text, f) >= 0;
    if (f && fclose(f) != 0)
        ok = false;
    if (!ok || rename(tmp, path) < 0)
        return al_err(err, -errno, "cannot write '%s': %s", path, strerror(errno));
    return 0;
}

static void control_free(struct al_control *c)
{
    al_closep(&c->listen_fd);
    for (int i = 0; i < 2; i++)
        al_closep(&c->stop_pipe[i]);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->idle);
    free(c);
}

int al_session_serve_control(al_session *s, al_error *err)
{
    if (s->control)
        return 0;
    struct al_control *c = calloc(1, sizeof(*c));
    if (!c)
        return al_err(err, -ENOMEM, "out of memory");
    c->s = s;
    c->listen_fd = c->stop_pipe[0] = c->stop_pipe[1] = -1;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->idle, NULL);
    for (size_t i = 0; i < CONTROL_WORKERS_MAX; i++)
        c->workers[i] = (struct control_worker){c, -1, {-1, -1}};
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int r = 0;
    if (al_pathf(c->path, sizeof(c->path), "%s/" CONTROL_SOCK, s->dir) < 0 ||
        strlen(c->path) >= sizeof(sa.sun_path))
        r = al_err(err, -ENAMETOOLONG, "control socket path too long: %s", c->path);
    if (r == 0 && (pipe2(c->stop_pipe, O_CLOEXEC) < 0 ||
                   (c->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0))
        r = al_err(err, -errno, "cannot make the control socket: %s", strerror(errno));
    if (r == 0) {
        strcpy(sa.sun_path, c->path);
        /* Nobody can connect before listen(): the mode is set in between. */
        if (bind(c->listen_fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
            chmod(c->path, 0600) < 0 || listen(c->listen_fd, 8) < 0)
            r = al_err(err, -errno, "cannot listen on '%s': %s", c->path, strerror(errno));
    }
    if (r == 0)
        r = write_info(s, err);
    if (r == 0) {
        int e = pthread_create(&c->thread, NULL, serve, c);
        if (e)
            r = al_err(err, -e, "cannot start the control thread: %s", strerror(e));
    }
    if (r < 0) {
        if (c->listen_fd >= 0)
            unlink(c->path);
        control_free(c);
        return r;
    }
    s->control = c;
    return 0;
}

void al_control_stop(al_session *s)
{
    struct al_control *c = s->control;
    if (!c)
        return;
    atomic_store(&c->stopping, true);
    uint8_t sig = SIGTERM;
    (void)!write(c->stop_pipe[1], &sig, 1);
    pthread_join(c->thread, NULL);
    /* No new worker now; those at work are cancelled and waited for (they use the session). */
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < CONTROL_WORKERS_MAX; i++)
        if (c->workers[i].fd >= 0) {
            (void)!write(c->workers[i].cancel_pipe[1], &sig, 1);
            shutdown(c->workers[i].fd, SHUT_RD); /* a request still being read ends */
        }
    while (c->nworkers)
        pthread_cond_wait(&c->idle, &c->mu);
    pthread_mutex_unlock(&c->mu);
    unlink(c->path);
    control_free(c);
    s->control = NULL;
}

/* ---- finding sessions ---- */

/* A live session: its lock held by its owner, its info readable. */
static bool session_info(const char *sessions, const char *name, al_session_info *out)
{
    char path[AL_PATH_MAX];
    if (al_pathf(path, sizeof(path), "%s/%s/lock", sessions, name) < 0)
        return false;
    _cleanup_close_ int lfd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (lfd < 0 || flock(lfd, LOCK_SH | LOCK_NB) == 0)
        return false;
    if (al_pathf(path, sizeof(path), "%s/%s/" INFO_FILE, sessions, name) < 0)
        return false;
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    char buf[INFO_MAX + 1];
    ssize_t n = fd < 0 ? -1 : read(fd, buf, INFO_MAX);
    if (n <= 0)
        return false;
    buf[n] = '\0';
    _cleanup_cjson_ cJSON *j = cJSON_Parse(buf);
    const cJSON *img = cJSON_GetObjectItem(j, "image"), *st = cJSON_GetObjectItem(j, "started"),
                *pid = cJSON_GetObjectItem(j, "pid");
    if (!cJSON_IsString(img) || !cJSON_IsNumber(st) || !cJSON_IsNumber(pid))
        return false;
    *out = (al_session_info){.struct_size = sizeof(al_session_info),
                             .started = (int64_t)st->valuedouble,
                             .pid = (long)pid->valuedouble};
    snprintf(out->name, sizeof(out->name), "%s", name);
    al_path_escape(img->valuestring, out->image, sizeof(out->image));
    return true;
}

int al_session_list(void (*fn)(void *ctx, const al_session_info *info), void *ctx, al_error *err)
{
    char sessions[AL_PATH_MAX];
    int r = al_sessions_dir(sessions, sizeof(sessions), false, err);
    if (r < 0)
        return r;
    DIR *d = opendir(sessions);
    if (!d)
        return errno == ENOENT
                   ? 0
                   : al_err(err, -errno, "cannot read '%s': %s", sessions, strerror(errno));
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        al_session_info info = AL_SESSION_INFO_INIT;
        if (strncmp(e->d_name, AL_DOMAIN_PREFIX, strlen(AL_DOMAIN_PREFIX)) ||
            strlen(e->d_name) >= sizeof(info.name) || !session_info(sessions, e->d_name, &info))
            continue;
        fn(ctx, &info);
        n++;
    }
    closedir(d);
    return n;
}

/* ---- the client side ---- */

struct al_attach {
    char name[64];
    char sock[AL_PATH_MAX];
};

struct only_one {
    int n;
    char name[64];
};

static void count_one(void *ctx, const al_session_info *info)
{
    struct only_one *o = ctx;
    if (o->n++ == 0)
        snprintf(o->name, sizeof(o->name), "%s", info->name);
}

static bool name_ok(const char *name)
{
    size_t plen = strlen(AL_DOMAIN_PREFIX), n = strlen(name);
    if (strncmp(name, AL_DOMAIN_PREFIX, plen) || n <= plen || n >= 64)
        return false;
    return strspn(name + plen, "0123456789abcdef") == n - plen;
}

int al_attach_open(const char *name, al_attach **out, al_error *err)
{
    struct only_one one = {0};
    if (!name) {
        int r = al_session_list(count_one, &one, err);
        if (r < 0)
            return r;
        if (one.n == 0)
            return al_err(err, -ENOENT, "no airlock session is running");
        if (one.n > 1)
            return al_err(err, -EINVAL, "%d sessions are running: name one (see 'airlock ps')",
                          one.n);
        name = one.name;
    }
    if (!name_ok(name))
        return al_err(err, -EINVAL, "'%s' is not a session name (see 'airlock ps')", name);
    al_attach *r = calloc(1, sizeof(*r));
    if (!r)
        return al_err(err, -ENOMEM, "out of memory");
    char sessions[AL_PATH_MAX];
    int ret = al_sessions_dir(sessions, sizeof(sessions), false, err);
    al_session_info info = AL_SESSION_INFO_INIT;
    if (ret == 0 && !session_info(sessions, name, &info))
        ret = al_err(err, -ENOENT, "no running session '%s' (see 'airlock ps')", name);
    if (ret == 0 && al_pathf(r->sock, sizeof(r->sock), "%s/%s/" CONTROL_SOCK, sessions, name) < 0)
        ret = al_err(err, -ENAMETOOLONG, "session path too long");
    if (ret < 0) {
        free(r);
        return ret;
    }
    snprintf(r->name, sizeof(r->name), "%s", name);
    *out = r;
    return 0;
}

void al_attach_close(al_attach *r)
{
    free(r);
}

const char *al_attach_name(const al_attach *r)
{
    return r->name;
}

static int send_request(int fd, const char *text, const int *fds, size_t nfds)
{
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(CONTROL_FDS * sizeof(int))];
    } cm;
    memset(&cm, 0, sizeof(cm));
    size_t len = strlen(text);
    struct iovec iov = {(void *)text, len};
    struct msghdr mh = {.msg_iov = &iov,
                        .msg_iovlen = 1,
                        .msg_control = cm.b,
                        .msg_controllen = CMSG_SPACE(nfds * sizeof(int))};
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
    memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
    ssize_t n;
    do
        n = sendmsg(fd, &mh, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return -errno;
    return send_all(fd, text, (size_t)n, len);
}

/* Sends one request line with nfds fds to r's session and reads its answer: 0 with *out (an
 * "ok" answer), or the session's error. */
static int remote_call(al_attach *r, const char *line, const int *fds, size_t nfds, int cancel_fd,
                       cJSON **out, al_error *err)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t slen = strlen(r->sock);
    if (slen >= sizeof(sa.sun_path))
        return al_err(err, -ENAMETOOLONG, "control socket path too long: %s", r->sock);
    memcpy(sa.sun_path, r->sock, slen + 1);
    _cleanup_close_ int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
        return al_err(err, -errno, "cannot reach session %s: %s", r->name, strerror(errno));
    int ret = send_request(fd, line, fds, nfds);
    if (ret < 0)
        return al_err(err, ret, "cannot send to session %s: %s", r->name, strerror(-ret));
    char ans[ANSWER_MAX + 1];
    size_t have = 0;
    while (have < ANSWER_MAX && !memchr(ans, '\n', have)) {
        /* A byte on cancel_fd: the connection goes, and the server's side learns it. */
        struct pollfd pfd[2] = {{fd, POLLIN, 0}, {cancel_fd, POLLIN, 0}};
        if (cancel_fd >= 0 && poll(pfd, 2, -1) > 0 && pfd[1].revents && !pfd[0].revents)
            return al_err(err, -ECANCELED, "cancelled");
        ssize_t n = recv(fd, ans + have, ANSWER_MAX - have, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return al_err(err, -ECONNRESET, "session %s ended before answering", r->name);
        have += (size_t)n;
    }
    ans[have] = '\0';
    cJSON *j = cJSON_Parse(ans);
    const cJSON *ok = cJSON_GetObjectItem(j, "ok");
    if (!cJSON_IsBool(ok)) {
        cJSON_Delete(j);
        return al_err(err, -EPROTO, "session %s answered nonsense", r->name);
    }
    if (cJSON_IsFalse(ok)) {
        const cJSON *code = cJSON_GetObjectItem(j, "code"), *msg = cJSON_GetObjectItem(j, "error");
        int c = cJSON_IsNumber(code) && code->valuedouble < 0 && code->valuedouble > -4096
                    ? (int)code->valuedouble
                    : -EIO;
        al_err(err, c, "%s", cJSON_IsString(msg) ? msg->valuestring : "request failed");
        cJSON_Delete(j);
        return c;
    }
    *out = j;
    return 0;
}

int al_attach_port(al_attach *r, unsigned port, int fd, int cancel_fd, al_port_counts *counts,
                   al_error *err)
{
    int r0 = al_port_args(port, counts, err);
    if (r0 < 0)
        return r0;
    char line[64];
    snprintf(line, sizeof(line), "{\"op\":\"port\",\"port\":%u}\n", port);
    _cleanup_cjson_ cJSON *j = NULL;
    int ret = remote_call(r, line, &fd, 1, cancel_fd, &j, err);
    if (ret < 0)
        return ret;
    if (counts) {
        const cJSON *to = cJSON_GetObjectItem(j, "to_guest"),
                    *from = cJSON_GetObjectItem(j, "from_guest");
        *counts = (al_port_counts){
            .struct_size = sizeof(*counts),
            .to_guest = cJSON_IsNumber(to) && to->valuedouble >= 0 ? (uint64_t)to->valuedouble : 0,
            .from_guest =
                cJSON_IsNumber(from) && from->valuedouble >= 0 ? (uint64_t)from->valuedouble : 0};
    }
    return 0;
}

int al_attach_commit(al_attach *r, const al_image_commit_opts *given, al_error *err)
{
    al_image_commit_opts o = AL_IMAGE_COMMIT_OPTS_INIT;
    int r0 = AL_SIZED_IN(&o, given, "al_image_commit_opts", err);
    if (r0 < 0)
        return r0;
    _cleanup_cjson_ cJSON *req = cJSON_CreateObject();
    if (!req || !cJSON_AddStringToObject(req, "op", "commit") ||
        !cJSON_AddStringToObject(req, "name", o.name ? o.name : "") ||
        !cJSON_AddNumberToObject(req, "checkpoint", o.checkpoint) ||
        !cJSON_AddBoolToObject(req, "force", o.force))
        return al_err(err, -ENOMEM, "out of memory");
    _cleanup_free_ char *text = cJSON_PrintUnformatted(req);
    char *line = text ? malloc(strlen(text) + 2) : NULL;
    if (!line)
        return al_err(err, -ENOMEM, "out of memory");
    sprintf(line, "%s\n", text);
    /* One fd rides along, as with every request: nothing reads it. */
    _cleanup_close_ int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
    _cleanup_cjson_ cJSON *j = NULL;
    int ret = remote_call(r, line, &null, 1, -1, &j, err);
    free(line);
    return ret;
}

int al_attach_exec(al_attach *r, const al_exec_opts *opts, al_exec_result *out, al_error *err)
{
    al_exec_opts taken = AL_EXEC_OPTS_INIT;
    const al_exec_opts *o = &taken;
    int rt = al_exec_take(&taken, opts, out, err);
    if (rt < 0)
        return rt;
    _cleanup_cjson_ cJSON *req = cJSON_CreateObject();
    cJSON *argv = cJSON_AddArrayToObject(req, "argv");
    if (!req || !argv || !cJSON_AddStringToObject(req, "op", "exec"))
        return al_err(err, -ENOMEM, "out of memory");
    for (size_t i = 0; o->argv[i]; i++)
        cJSON_AddItemToArray(argv, cJSON_CreateString(o->argv[i]));
    if (o->cwd)
        cJSON_AddStringToObject(req, "cwd", o->cwd);
    cJSON_AddNumberToObject(req, "output_cap", (double)o->output_cap);
    cJSON_AddNumberToObject(req, "timeout_ms", o->timeout_ms);
    bool pty = o->pty_rows > 0;
    if (pty) {
        if (!o->pty_cols)
            return al_err(err, -EINVAL, "a terminal needs rows and columns");
        cJSON *size = cJSON_AddArrayToObject(req, "pty");
        cJSON_AddItemToArray(size, cJSON_CreateNumber(al_pty_dim(o->pty_rows)));
        cJSON_AddItemToArray(size, cJSON_CreateNumber(al_pty_dim(o->pty_cols)));
        /* Its end of input would be its terminal's hangup: none is none. */
        if (o->stdin_fd < 0)
            cJSON_AddBoolToObject(req, "stdin", false);
    }
    _cleanup_free_ char *text = cJSON_PrintUnformatted(req);
    _cleanup_free_ char *line = text ? malloc(strlen(text) + 2) : NULL;
    if (!line)
        return al_err(err, -ENOMEM, "out of memory");
    if (strlen(text) + 1 >= REQUEST_MAX)
        return al_err(err, -E2BIG, "the command is longer than %d bytes", REQUEST_MAX);
    sprintf(line, "%s\n", text);

    /* A pty run's resizes, when the caller has any, go as a fourth fd; without one the server's
     * run keeps its size. */
    bool resizes = pty && o->resize_fd > 0;
    _cleanup_close_ int devnull = o->stdin_fd < 0 ? open("/dev/null", O_RDONLY | O_CLOEXEC) : -1;
    int fds[CONTROL_FDS] = {o->stdin_fd >= 0 ? o->stdin_fd : devnull, o->stdout_fd, o->stderr_fd,
                            resizes ? o->resize_fd : -1};
    if (fds[0] < 0)
        return al_err(err, -errno, "cannot open /dev/null: %s", strerror(errno));
    _cleanup_cjson_ cJSON *j = NULL;
    int ret = remote_call(r, line, fds, resizes ? 4 : 3, -1, &j, err);
    if (ret < 0)
        return ret;
    al_exec_result res = {
        .struct_size = sizeof res,
        .how = cJSON_GetObjectItem(j, "how") ? cJSON_GetObjectItem(j, "how")->valueint : 0,
        .value = cJSON_GetObjectItem(j, "value") ? cJSON_GetObjectItem(j, "value")->valueint : 0,
        .timed_out = cJSON_IsTrue(cJSON_GetObjectItem(j, "timed_out")),
        .truncated_stdout = cJSON_IsTrue(cJSON_GetObjectItem(j, "truncated_stdout")),
        .truncated_stderr = cJSON_IsTrue(cJSON_GetObjectItem(j, "truncated_stderr")),
    };
    *out = res;
    return 0;
}

/* ---- cp ---- */

static int remote_runner_exec(void *ctx, const al_exec_opts *o, al_exec_result *out, al_error *err)
{
    return al_attach_exec(ctx, o, out, err);
}

static int guest_is_dir(al_attach *r, const char *path, bool *out, al_error *err)
{
    const char *argv[] = {"test", "-d", path, NULL};
    _cleanup_close_ int devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
    al_exec_opts o = {.struct_size = sizeof(al_exec_opts),
                      .argv = argv,
                      .stdin_fd = -1,
                      .stdout_fd = devnull,
                      .stderr_fd = devnull};
    al_exec_result res = AL_EXEC_RESULT_INIT;
    int ret = al_attach_exec(r, &o, &res, err);
    if (ret < 0)
        return ret;
    *out = res.how == AL_EXEC_EXITED && res.value == 0;
    return 0;
}

/* The last component of a path, without trailing slashes. */
static int last_name(const char *path, char *out, size_t len)
{
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        n--;
    size_t start = n;
    while (start > 0 && path[start - 1] != '/')
        start--;
    if (n - start == 0 || n - start >= len)
        return -EINVAL;
    memcpy(out, path + start, n - start);
    out[n - start] = '\0';
    if (!strcmp(out, ".") || !strcmp(out, "..") || !strcmp(out, "/"))
        return -EINVAL;
    return 0;
}

static int split_guest(const char *path, char *dir, size_t dlen, char *name, size_t nlen)
{
    if (path[0] != '/' || last_name(path, name, nlen) < 0)
        return -EINVAL;
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        n--;
    n -= strlen(name);
    while (n > 1 && path[n - 1] == '/')
        n--;
    if (n >= dlen)
        return -ENAMETOOLONG;
    memcpy(dir, path, n);
    dir[n] = '\0';
    return 0;
}

int al_attach_put(al_attach *r, const char *host_path, const char *guest_path, al_error *err)
{
    char src_name[256], dest_dir[AL_PATH_MAX + 1], name[256];
    if (last_name(host_path, src_name, sizeof(src_name)) < 0)
        return al_err(err, -EINVAL, "cannot tell a name for '%s'", host_path);
    bool into = false;
    int ret = guest_path[0] == '/' ? guest_is_dir(r, guest_path, &into, err)
                                   : al_err(err, -EINVAL, "the guest path must be absolute");
    if (ret < 0)
        return ret;
    if (into) {
        snprintf(dest_dir, sizeof(dest_dir), "%s", guest_path);
        snprintf(name, sizeof(name), "%s", src_name);
    } else if (split_guest(guest_path, dest_dir, sizeof(dest_dir), name, sizeof(name)) < 0) {
        return al_err(err, -EINVAL, "bad guest path '%s'", guest_path);
    }
    _cleanup_close_ int fd = open(host_path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0)
        return al_err(err, -errno, "cannot open '%s': %s", host_path, strerror(errno));
    struct al_runner run = {.exec = remote_runner_exec, .ctx = r, .spool_dir = al_spool_dir()};
    if (S_ISREG(st.st_mode))
        return al_tree_put(&run, -1, NULL, fd, name, dest_dir, err);
    if (!S_ISDIR(st.st_mode))
        return al_err(err, -EINVAL, "'%s' is not a file or a directory", host_path);
    struct al_tar_limits lim = {.bytes_max = AL_WORKDIR_BYTES_MAX_DEFAULT};
    struct al_tree t = {0};
    char prefix[260];
    snprintf(prefix, sizeof(prefix), "%s/", name);
    ret = al_tree_walk(fd, &lim, &t, err);
    if (ret == 0 && t.bytes > lim.bytes_max)
        ret = al_err(err, -EFBIG, "'%s' holds more than %llu bytes", host_path,
                     (unsigned long long)lim.bytes_max);
    if (ret == 0)
        ret = al_tree_put(&run, fd, &t, -1, prefix, dest_dir, err);
    al_tree_free(&t);
    return ret;
}

/* A guest file into a temporary file next to target, renamed over it once complete. */
static int get_file(al_attach *r, const char *guest_path, const char *target, al_error *err)
{
    char tmp[AL_PATH_MAX];
    const char *slash = strrchr(target, '/');
    int dlen = slash ? (int)(slash - target) : 1;
    if (al_pathf(tmp, sizeof(tmp), "%.*s/.airlock-cp-XXXXXX", dlen, slash ? target : ".") < 0)
        return al_err(err, -ENAMETOOLONG, "host path too long");
    if (slash == target)
        snprintf(tmp, sizeof(tmp), "/.airlock-cp-XXXXXX");
    _cleanup_close_ int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0)
        return al_err(err, -errno, "cannot create a file next to '%s': %s", target,
                      strerror(errno));
    _cleanup_close_ int efd = open("/dev/null", O_WRONLY | O_CLOEXEC);
    const char *argv[] = {"cat", "--", guest_path, NULL};
    al_exec_opts o = {.struct_size = sizeof(al_exec_opts),
                      .argv = argv,
                      .stdin_fd = -1,
                      .stdout_fd = fd,
                      .stderr_fd = efd,
                      .output_cap = AL_WORKDIR_BYTES_MAX_DEFAULT};
    al_exec_result res = AL_EXEC_RESULT_INIT;
    int ret = al_attach_exec(r, &o, &res, err);
    if (ret == 0 && res.truncated_stdout)
        ret = al_err(err, -EFBIG, "'%s' is larger than %llu bytes", guest_path,
                     (unsigned long long)AL_WORKDIR_BYTES_MAX_DEFAULT);
    else if (ret == 0 && (res.how != AL_EXEC_EXITED || res.value != 0))
        ret = al_err(err, -ENOENT, "cannot read '%s' in the guest", guest_path);
    if (ret == 0 &&
        (fchmod(fd, 0644 & ~al_umask()) < 0 || fsync(fd) < 0 || rename(tmp, target) < 0))
        ret = al_err(err, -errno, "cannot write '%s': %s", target, strerror(errno));
    if (ret < 0)
        unlink(tmp);
    return ret;
}

int al_attach_get(al_attach *r, const char *guest_path, const char *host_path, al_error *err)
{
    char name[256], target[AL_PATH_MAX];
    if (guest_path[0] != '/' || last_name(guest_path, name, sizeof(name)) < 0)
        return al_err(err, -EINVAL, "bad guest path '%s' (absolute, naming a file)", guest_path);
    struct stat st;
    if (stat(host_path, &st) == 0 && S_ISDIR(st.st_mode)) {
        if (al_pathf(target, sizeof(target), "%s/%s", host_path, name) < 0)
            return al_err(err, -ENAMETOOLONG, "host path too long");
    } else if (al_pathf(target, sizeof(target), "%s", host_path) < 0) {
        return al_err(err, -ENAMETOOLONG, "host path too long");
    }
    bool is_dir = false;
    int ret = guest_is_dir(r, guest_path, &is_dir, err);
    if (ret < 0)
        return ret;
    if (!is_dir)
        return get_file(r, guest_path, target, err);
    if (mkdir(target, 0777) < 0)
        return al_err(err, -errno, "cannot create '%s': %s", target, strerror(errno));
    struct al_runner run = {.exec = remote_runner_exec, .ctx = r, .spool_dir = al_spool_dir()};
    al_workdir_opts wo = {.struct_size = sizeof(al_workdir_opts), .guest_dir = guest_path};
    al_workdir_diff *d = NULL;
    ret = al_workdir_diff_run(&run, target, &wo, &d, err);
    if (ret == 0)
        /* As the guest wrote them but for what the host would run unasked: no .git/ (its
         * config and hooks run on the next git command) and no exec bits, as for one file. */
        ret = al_workdir_apply(d, 0, err);
    int left_out = 0;
    for (size_t i = 0; ret >= 0 && i < al_workdir_diff_count(d); i++) {
        const al_change *c = al_workdir_diff_at(d, i);
        left_out += c->refused || c->held || c->result < 0;
    }
    al_workdir_diff_free(d);
    return ret < 0 ? ret : left_out;
}

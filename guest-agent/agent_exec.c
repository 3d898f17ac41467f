/* Running processes for EXEC: spawn into a fresh cgroup and session, stream their pipes,
 * enforce timeouts, reap, report exit. */
#include "agent.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <linux/sched.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>

/* Entries of the agent's own environment passed on to a process (PATH, HOME...). */
#define ENV_INHERIT_MAX 256
/* Zombies reaped per loop iteration at most; the rest wait for the next one. */
#define REAP_BATCH 64
/* A cgroup still busy this long after its request ended is left behind. */
#define STALE_GIVEUP_US (10 * 1000 * 1000)
/* How often a busy cgroup's removal is retried when no SIGCHLD comes. */
#define STALE_RETRY_MS 100

extern char **environ;

/* Interpreters for EXEC with a language: argv[0] of the request is the code, placed where the
 * template has NULL; further argv entries follow the template. Only entries whose interpreter
 * exists are announced. */
struct lang {
    const char *name;
    const char *argv[4];
    size_t argc;
    bool alias; /* taken, not announced */
};

static const struct lang langs[] = {
    {"sh", {"/bin/sh", "-c", NULL, "sh"}, 4},
    {"bash", {"/bin/bash", "-c", NULL, "bash"}, 4},
    {"python", {"/usr/bin/python3", "-c", NULL}, 3},
    /* the kernels' other names (kernel.c), so that every language an image lists runs both ways */
    {"shell", {"/bin/bash", "-c", NULL, "bash"}, 4},
    {"javascript", {"/usr/bin/node", "-e", NULL}, 3},
    {"node", {"/usr/bin/node", "-e", NULL}, 3, true},
    {"js", {"/usr/bin/node", "-e", NULL}, 3, true},
};

int exec_langs(struct agent *a, struct al_str *out, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < sizeof(langs) / sizeof(langs[0]) && n < max; i++)
        if (!langs[i].alias && access(langs[i].argv[0], X_OK) == 0)
            out[n++] = al_str_cstr(langs[i].name);
    return (int)n + kernel_langs(a, out + n, max - n);
}

/* The exec being started, NUL-terminated copies out of the frame; one exec is built at a time
 * and the strings must survive only until execve. */
static char arena[AL_FRAME_PAYLOAD_MAX + AL_ARGV_MAX + AL_ENV_MAX + 64];
static char *argv_v[AL_ARGV_MAX + 4];
static char *env_v[ENV_INHERIT_MAX + AL_ENV_MAX + 1];

struct arena_pos {
    char *p;
    size_t left;
};

static char *arena_put(struct arena_pos *ar, struct al_str s)
{
    if ((s.len && memchr(s.p, 0, s.len)) || (size_t)s.len + 1 > ar->left)
        return NULL;
    char *r = ar->p;
    memcpy(r, s.p, s.len);
    r[s.len] = '\0';
    ar->p += s.len + 1;
    ar->left -= s.len + 1;
    return r;
}

static bool env_overridden(const char *e, char *const *extra, size_t n)
{
    size_t klen = strcspn(e, "=");
    for (size_t i = 0; i < n; i++)
        if (strncmp(e, extra[i], klen + 1) == 0)
            return true;
    return false;
}

/* Fills sp from an EXEC frame; on failure returns an error class and a message in why. */
static uint16_t spawn_build(const struct al_msg *m, struct spawn *sp, char *why, size_t cap)
{
    struct arena_pos ar = {arena, sizeof(arena)};
    char tmp[AL_SHORT_STR_MAX + 1];
    size_t argc = 0, first = 0;

    if (m->u.exec.lang.len) {
        const struct lang *l = NULL;
        for (size_t i = 0; i < sizeof(langs) / sizeof(langs[0]); i++)
            if (al_str_eq(m->u.exec.lang, langs[i].name))
                l = &langs[i];
        if (!l || access(l->argv[0], X_OK) < 0) {
            snprintf(why, cap, "language %s not available",
                     printable(m->u.exec.lang, tmp, sizeof(tmp)));
            return AL_ERR_UNSUPPORTED;
        }
        for (size_t i = 0; i < l->argc; i++)
            argv_v[argc++] = l->argv[i] ? (char *)l->argv[i] : arena_put(&ar, m->u.exec.argv[0]);
        first = 1;
    }
    for (size_t i = first; i < m->u.exec.argc; i++)
        argv_v[argc++] = arena_put(&ar, m->u.exec.argv[i]);
    argv_v[argc] = NULL;
    for (size_t i = 0; i < argc; i++)
        if (!argv_v[i]) {
            snprintf(why, cap, "argument contains a NUL byte");
            return AL_ERR_INVALID;
        }

    sp->cwd = "/";
    if (m->u.exec.cwd.len && !(sp->cwd = arena_put(&ar, m->u.exec.cwd))) {
        snprintf(why, cap, "cwd contains a NUL byte");
        return AL_ERR_INVALID;
    }

    char **extra = env_v + ENV_INHERIT_MAX;
    for (size_t i = 0; i < m->u.exec.envc; i++) {
        extra[i] = arena_put(&ar, m->u.exec.env[i]);
        if (!extra[i] || extra[i][0] == '=' || !strchr(extra[i], '=')) {
            snprintf(why, cap, "environment entry %zu is not KEY=VALUE", i);
            return AL_ERR_INVALID;
        }
    }
    sp->argv = argv_v;
    sp->envp = spawn_env(extra, m->u.exec.envc);
    return 0;
}

char **spawn_env(char *const *extra, size_t n)
{
    size_t k = 0;
    if (n > AL_ENV_MAX)
        n = AL_ENV_MAX;
    for (char **e = environ; e && *e && k < ENV_INHERIT_MAX; e++)
        if (!env_overridden(*e, extra, n))
            env_v[k++] = *e;
    memmove(env_v + k, extra, n * sizeof(char *));
    env_v[k + n] = NULL;
    return env_v;
}

void cgroup_setup(struct agent *a)
{
    struct statfs sf;
    if (statfs(CGROUP_ROOT, &sf) < 0 || sf.f_type != CGROUP2_SUPER_MAGIC)
        return;
    /* Controllers are best effort: without them requests still get cgroup.kill. */
    write_file(AT_FDCWD, CGROUP_ROOT "/cgroup.subtree_control", "+pids");
    write_file(AT_FDCWD, CGROUP_ROOT "/cgroup.subtree_control", "+memory");
    if (mkdir(CGROUP_BASE, 0755) < 0 && errno != EEXIST) {
        agent_log("cannot create %s: %s", CGROUP_BASE, strerror(errno));
        return;
    }
    int fd = open(CGROUP_BASE, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return;
    write_file(fd, "cgroup.subtree_control", "+pids");
    write_file(fd, "cgroup.subtree_control", "+memory");
    a->cg_base_fd = fd;
    a->cgroup = true;
}

/* Makes an empty cgroup with its pids limit; returns an O_PATH fd on it for CLONE_INTO_CGROUP. */
static int cgroup_make(struct agent *a, const char *name)
{
    char path[64], pids[16];
    if (mkdirat(a->cg_base_fd, name, 0755) < 0)
        return -errno;
    snprintf(path, sizeof(path), "%s/pids.max", name);
    snprintf(pids, sizeof(pids), "%d", AGENT_PIDS_MAX);
    write_file(a->cg_base_fd, path, pids);
    int fd = openat(a->cg_base_fd, name, O_PATH | O_DIRECTORY | O_CLOEXEC);
    return fd < 0 ? -errno : fd;
}

/* The request's cgroup: the spare one renamed when there is one (a rename costs much less than
 * creating a cgroup under emulation), else a new one. */
static int cgroup_create(struct agent *a, struct req *r)
{
    snprintf(r->cgroup, sizeof(r->cgroup), "req-%u-%llu", r->id, (unsigned long long)++a->counter);
    if (a->spare_fd >= 0) {
        int fd = al_take_fd(&a->spare_fd);
        if (renameat(a->cg_base_fd, a->spare, a->cg_base_fd, r->cgroup) == 0)
            return fd;
        close(fd);
        unlinkat(a->cg_base_fd, a->spare, AT_REMOVEDIR);
    }
    int fd = cgroup_make(a, r->cgroup);
    if (fd < 0)
        r->cgroup[0] = '\0';
    return fd;
}

int cgroup_new(struct agent *a, char *name, size_t cap, const char *prefix)
{
    snprintf(name, cap, "%s-%llu", prefix, (unsigned long long)++a->counter);
    int fd = cgroup_make(a, name);
    if (fd < 0)
        name[0] = '\0';
    return fd;
}

void cgroup_remove(struct agent *a, char *name)
{
    if (!name[0])
        return;
    if (a->ndead < sizeof(a->dead) / sizeof(a->dead[0])) {
        snprintf(a->dead[a->ndead].name, sizeof(a->dead[0].name), "%s", name);
        a->dead[a->ndead++].since_us = now_us();
        a->cg_due = true;
    } else if (unlinkat(a->cg_base_fd, name, AT_REMOVEDIR) < 0) {
        agent_log("cannot remove cgroup %s: %s", name, strerror(errno));
    }
    name[0] = '\0';
}

void cgroup_housekeeping(struct agent *a, uint64_t now)
{
    if (!a->cgroup)
        return;
    if (a->ndead && (a->cg_due || now >= a->dead_next_us)) {
        for (size_t i = 0; i < a->ndead;) {
            bool gone =
                unlinkat(a->cg_base_fd, a->dead[i].name, AT_REMOVEDIR) == 0 || errno == ENOENT;
            /* EBUSY: processes still dying; retried on SIGCHLD and every STALE_RETRY_MS. */
            if (!gone && now - a->dead[i].since_us < STALE_GIVEUP_US) {
                i++;
                continue;
            }
            if (!gone)
                agent_log("giving up on cgroup %s: %s", a->dead[i].name, strerror(errno));
            a->dead[i] = a->dead[--a->ndead];
        }
        a->dead_next_us = now + STALE_RETRY_MS * 1000;
    }
    a->cg_due = false;
    /* The next exec's cgroup, made while nothing runs: the host is reading our last reply. */
    for (size_t i = 0; i < AGENT_REQ_MAX; i++)
        if (a->reqs[i].used)
            return;
    if (a->spare_fd < 0) {
        snprintf(a->spare, sizeof(a->spare), "spare-%llu", (unsigned long long)++a->counter);
        int fd = cgroup_make(a, a->spare);
        a->spare_fd = fd < 0 ? -1 : fd;
    }
}

void tree_kill(struct agent *a, const char *cgroup, pid_t pid)
{
    char path[AL_CGROUP_NAME_MAX + 16];
    if (cgroup[0] && snprintf(path, sizeof(path), "%s/cgroup.kill", cgroup) < (int)sizeof(path) &&
        write_file(a->cg_base_fd, path, "1") == 0)
        return;
    kill(-pid, SIGKILL);
}

void exec_kill(struct agent *a, struct req *r)
{
    if (r->tunnel) { /* no process: its socket goes, both ways */
        al_closep(&r->in_fd);
        r->in_fd = -1;
        r->inq.head = r->inq.len = 0;
        if (r->out[0].fd >= 0)
            ostream_close(a, r, &r->out[0]);
        return;
    }
    if (r->kernel) {
        kernel_kill(a, r->kernel);
        return;
    }
    tree_kill(a, r->cgroup, r->pid);
}

enum spawn_stage {
    STAGE_SETUP,
    STAGE_CWD,
    STAGE_EXEC,
};

/* Most fds a child is given: stdin, stdout, stderr and a kernel's control socket. */
#define CHILD_FDS_MAX 5

/* The child between fork and execve. Only async-signal-safe calls: after a raw clone3 the
 * child's libc thread state is the parent's. */
static __attribute__((noreturn)) void child_run(const struct spawn *sp, const int *fds_in, int nfds,
                                                int ep, int join_cg_fd)
{
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    sigset_t none;
    int e[2] = {STAGE_SETUP, 0};
    int fds[CHILD_FDS_MAX];

    /* The only disposition the agent changes (init_common reset the rest); SIG_IGN would
     * survive execve. */
    sigaction(SIGPIPE, &dfl, NULL);
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (setsid() < 0 || (join_cg_fd >= 0 && write_file(join_cg_fd, "cgroup.procs", "0") < 0))
        goto fail;
    /* A source below nfds would be overwritten by an earlier dup2: move it out of the way. */
    for (int i = 0; i < nfds; i++) {
        fds[i] = fds_in[i];
        if (fds[i] < nfds && fds[i] != i && (fds[i] = fcntl(fds[i], F_DUPFD, nfds)) < 0)
            goto fail;
    }
    for (int i = 0; i < nfds; i++)
        if (fds[i] == i ? fcntl(i, F_SETFD, 0) < 0 : dup2(fds[i], i) < 0)
            goto fail;
    /* A new session has no terminal yet: its first one is this. */
    if (sp->ctty && ioctl(0, TIOCSCTTY, 0) < 0)
        goto fail;
    e[0] = STAGE_CWD;
    if (chdir(sp->cwd) < 0)
        goto fail;
    write_file(AT_FDCWD, "/proc/self/oom_score_adj", "0");
    e[0] = STAGE_EXEC;
    environ = sp->envp; /* so that the PATH searched is the one the process gets */
    execvp(sp->argv[0], sp->argv);
fail:
    e[1] = errno;
    if (write(ep, e, sizeof(e)) < 0) {
        /* the parent then sees a process that exited 127 */
    }
    _exit(127);
}

/* fork, or clone3 straight into the request's cgroup: no window outside it, and no write to
 * cgroup.procs (which waits for an RCU grace period). *join is set when the child must move
 * itself because clone3 is missing. */
static pid_t spawn_fork(int cg_fd, int *join)
{
    *join = -1;
    if (cg_fd >= 0) {
        struct clone_args ca = {
            .flags = CLONE_INTO_CGROUP, .exit_signal = SIGCHLD, .cgroup = (uint64_t)cg_fd};
        long pid = syscall(SYS_clone3, &ca, sizeof(ca));
        if (pid >= 0 || errno != ENOSYS)
            return (pid_t)pid;
        *join = cg_fd;
    }
    return fork();
}

void spawn_error(struct agent *a, uint32_t id, const int e[2], const struct spawn *sp)
{
    char name[80], cwd[80];
    printable(al_str_cstr(sp->argv[0]), name, sizeof(name));
    if (e[0] == STAGE_EXEC && e[1] == ENOENT)
        agent_send_error(a, id, AL_ERR_NOT_FOUND, e[1], "command not found: %s", name);
    else if (e[0] == STAGE_EXEC && (e[1] == EACCES || e[1] == EPERM))
        agent_send_error(a, id, AL_ERR_PERMISSION, e[1], "permission denied: %s", name);
    else if (e[0] == STAGE_EXEC)
        agent_send_error(a, id, AL_ERR_INTERNAL, e[1], "cannot execute %s: %s", name,
                         strerror(e[1]));
    else if (e[0] == STAGE_CWD)
        agent_send_error(a, id, errno_class(e[1]), e[1], "cannot change directory to %s: %s",
                         printable(al_str_cstr(sp->cwd), cwd, sizeof(cwd)), strerror(e[1]));
    else
        agent_send_error(a, id, AL_ERR_INTERNAL, e[1], "cannot set up the process: %s",
                         strerror(e[1]));
}

int pipe_pair(int *rd, int *wr, int nonblock_end)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0)
        return -errno;
    *rd = p[0];
    *wr = p[1];
    /* Only the agent's end is nonblocking: a child must block on a full or empty pipe. */
    return fcntl(p[nonblock_end], F_SETFL, O_NONBLOCK) < 0 ? -errno : 0;
}

pid_t spawn_process(const struct spawn *sp, const int *fds, int nfds, int cg_fd, int e[2])
{
    _cleanup_close_ int ep_r = -1, ep_w = -1;
    int join, err;

    e[0] = STAGE_SETUP;
    if (nfds > CHILD_FDS_MAX || (err = pipe_pair(&ep_r, &ep_w, 1)) < 0) {
        e[1] = nfds > CHILD_FDS_MAX ? EINVAL : -err;
        return -1;
    }
    pid_t pid = spawn_fork(cg_fd, &join);
    if (pid == 0)
        child_run(sp, fds, nfds, ep_w, join);
    e[1] = errno;
    close(al_take_fd(&ep_w));
    if (pid < 0)
        return -1;
    ssize_t n;
    do
        n = read(ep_r, e, 2 * sizeof(int));
    while (n < 0 && errno == EINTR);
    if (n != 2 * sizeof(int))
        return pid; /* execve closed the pipe: the process runs */
    waitpid(pid, NULL, 0);
    return -1;
}

void exec_stdin_identity(struct req *r, int fd)
{
    struct stat st;
    if (fstat(fd, &st) == 0) {
        r->stdin_ino = st.st_ino;
        r->stdin_dev = st.st_dev;
    }
}

/* An output stream of an exec, at the start of its credit. */
static struct ostream exec_stream(struct agent *a, int fd, uint8_t stream, uint64_t cap)
{
    return (struct ostream){.fd = fd, .stream = stream, .credit = a->window, .limit = cap};
}

/* Starts sp for r with fds as its 0, 1 and 2, in a cgroup of r's own when the guest has them;
 * 0, or sends the error itself and returns -1. */
static int spawn_req(struct agent *a, struct req *r, struct spawn *sp, const int fds[3])
{
    _cleanup_close_ int cg_fd = -1;
    int e[2];
    if (a->cgroup && (cg_fd = cgroup_create(a, r)) < 0) {
        agent_send_error(a, r->id, errno_class(-cg_fd), -cg_fd, "cannot create cgroup: %s",
                         strerror(-cg_fd));
        return -1;
    }
    r->start_us = now_us();
    pid_t pid = spawn_process(sp, fds, 3, cg_fd, e);
    if (pid < 0) {
        spawn_error(a, r->id, e, sp);
        return -1;
    }
    r->pid = pid;
    return 0;
}

/* Starts the process of r on a new pseudo-terminal: the child's stdin, stdout and stderr are its
 * slave, which is also its controlling terminal (job control, ^C ^Z ^\ as the line discipline
 * has them); the agent keeps the master, read as the STDOUT stream, written as stdin, sized by
 * RESIZE. Returns 0, or sends the error itself and returns -1. */
static int spawn_pty(struct agent *a, struct req *r, const struct al_msg *m, struct spawn *sp)
{
    _cleanup_close_ int master = -1, slave = -1, out = -1, in = -1;
    struct winsize ws = {.ws_row = m->u.exec.rows, .ws_col = m->u.exec.cols};
    bool want_stdin = m->u.exec.flags & AL_EXEC_STDIN;
    if (openpty(&master, &slave, NULL, NULL, &ws) < 0 || fcntl(master, F_SETFD, FD_CLOEXEC) < 0 ||
        fcntl(slave, F_SETFD, FD_CLOEXEC) < 0 || fcntl(master, F_SETFL, O_NONBLOCK) < 0 ||
        (out = fcntl(master, F_DUPFD_CLOEXEC, 0)) < 0 ||
        (want_stdin && (in = fcntl(master, F_DUPFD_CLOEXEC, 0)) < 0)) {
        agent_send_error(a, r->id, errno_class(errno), errno, "cannot open a terminal: %s",
                         strerror(errno));
        return -1;
    }
    int fds[3] = {slave, slave, slave};
    sp->ctty = true;
    if (spawn_req(a, r, sp, fds) < 0)
        return -1;
    /* One stream: a terminal interleaves what the program writes on stdout and stderr. */
    r->out[0] = exec_stream(a, al_take_fd(&out), AL_STREAM_STDOUT, m->u.exec.output_cap);
    r->in_fd = al_take_fd(&in);
    r->want_stdin = want_stdin;
    r->pty_fd = al_take_fd(&master);
    return 0;
}

/* Starts the process of r; returns 0, or sends the error itself and returns -1. */
static int spawn(struct agent *a, struct req *r, const struct al_msg *m, struct spawn *sp)
{
    _cleanup_close_ int out_r = -1, out_w = -1, err_r = -1, err_w = -1, in_r = -1, in_w = -1;
    bool want_stdin = m->u.exec.flags & AL_EXEC_STDIN;
    /* A read must be able to wait to be reported: without host stdin the run gets a pipe that
     * nobody writes instead of /dev/null. */
    bool held_stdin = !want_stdin && m->u.exec.input_wait_ms;
    int err = 0;

    if (!want_stdin && a->null_fd < 0 && (a->null_fd = open("/dev/null", O_RDWR | O_CLOEXEC)) < 0) {
        agent_send_error(a, r->id, AL_ERR_INTERNAL, errno, "cannot open /dev/null: %s",
                         strerror(errno));
        return -1;
    }
    if ((err = pipe_pair(&out_r, &out_w, 0)) < 0 || (err = pipe_pair(&err_r, &err_w, 0)) < 0 ||
        ((want_stdin || held_stdin) && (err = pipe_pair(&in_r, &in_w, 1)) < 0)) {
        agent_send_error(a, r->id, errno_class(-err), -err, "cannot create pipes: %s",
                         strerror(-err));
        return -1;
    }
    fcntl(out_r, F_SETPIPE_SZ, AGENT_PIPE_SIZE);
    fcntl(err_r, F_SETPIPE_SZ, AGENT_PIPE_SIZE);
    int fds[3] = {in_r >= 0 ? in_r : a->null_fd, out_w, err_w};
    if (spawn_req(a, r, sp, fds) < 0)
        return -1;
    r->out[0] = exec_stream(a, al_take_fd(&out_r), AL_STREAM_STDOUT, m->u.exec.output_cap);
    r->out[1] = exec_stream(a, al_take_fd(&err_r), AL_STREAM_STDERR, m->u.exec.output_cap);
    if (in_w >= 0)
        exec_stdin_identity(r, in_w);
    r->in_fd = want_stdin ? al_take_fd(&in_w) : -1;
    r->stdin_hold[1] = held_stdin ? al_take_fd(&in_w) : -1;
    r->want_stdin = want_stdin;
    return 0;
}

void exec_start(struct agent *a, const struct al_msg *m)
{
    char why[AL_MESSAGE_MAX], name[80];
    struct spawn sp;

    struct req *r = req_new(a, m->id, REQ_EXEC);
    if (!r)
        return;
    r->input_wait_ms = m->u.exec.input_wait_ms;
    if (m->u.exec.flags & AL_EXEC_KERNEL) {
        agent_log("exec id=%u kernel=%s", r->id, printable(m->u.exec.lang, name, sizeof(name)));
        kernel_exec(a, r, m);
        return;
    }
    uint16_t klass = spawn_build(m, &sp, why, sizeof(why));
    if (klass) {
        agent_send_error(a, m->id, klass, 0, "%s", why);
        req_free(a, r);
        return;
    }
    if (m->u.exec.lang.len)
        agent_log("exec id=%u lang=%s", r->id, printable(m->u.exec.lang, name, sizeof(name)));
    else
        agent_log("exec id=%u argv0=%s", r->id, printable(m->u.exec.argv[0], name, sizeof(name)));
    sp.ctty = false;
    if ((m->u.exec.flags & AL_EXEC_PTY ? spawn_pty(a, r, m, &sp) : spawn(a, r, m, &sp)) < 0) {
        req_free(a, r);
        return;
    }
    if (m->u.exec.timeout_ms)
        r->deadline_us = r->start_us + (uint64_t)m->u.exec.timeout_ms * 1000;
    struct al_msg started = {.type = AL_STARTED, .id = r->id};
    started.u.started.pid = (uint32_t)r->pid;
    agent_send(a, &started);
}

void exec_flush_stdin(struct agent *a, struct req *r)
{
    struct ibuf *q = &r->inq;
    size_t done = 0;
    while (r->in_fd >= 0 && q->len > q->head) {
        ssize_t n = write(r->in_fd, q->p + q->head, q->len - q->head);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            break;
        if (n < 0) {
            /* The process closed its stdin: what it did not read is dropped, but credited,
             * so the host is not left waiting. */
            n = (ssize_t)(q->len - q->head);
            close(r->in_fd);
            r->in_fd = -1;
        }
        q->head += (size_t)n;
        done += (size_t)n;
    }
    if (q->head == q->len) {
        q->head = q->len = 0;
        if (r->in_eof && r->in_fd >= 0) {
            /* A tunnel's socket is also its output: the guest's side learns the end of the
             * host's bytes (FIN) and may still answer. */
            if (r->tunnel)
                shutdown(r->in_fd, SHUT_WR);
            close(r->in_fd);
            r->in_fd = -1;
        }
    }
    if (done) {
        r->active = true;
        r->in_unacked -= done;
        agent_send_credit(a, r->id, AL_STREAM_STDIN, (uint32_t)done);
    }
}

/* A pty run's terminal closed (the host's EOF on its input): the master goes, so the kernel
 * hangs the terminal up as when a terminal emulator's window closes (SIGHUP and SIGCONT to the
 * session, EOF and EIO on the slave); what the run still had to show is dropped. */
static void pty_hangup(struct agent *a, struct req *r)
{
    agent_log("hangup id=%u", r->id);
    al_closep(&r->in_fd);
    r->in_fd = -1;
    r->inq.head = r->inq.len = 0;
    if (r->out[0].fd >= 0)
        ostream_close(a, r, &r->out[0]);
    al_closep(&r->pty_fd);
    r->pty_fd = -1;
}

void exec_stdin(struct agent *a, struct req *r, const struct al_msg *m)
{
    struct ibuf *q = &r->inq;
    uint32_t len = m->u.data.len;

    if (!r->want_stdin || r->in_eof) {
        agent_send_error(a, r->id, AL_ERR_PROTOCOL, 0,
                         r->in_eof ? "stdin data after EOF" : "stdin was not requested");
        return;
    }
    if (len > AL_WINDOW_DEFAULT - r->in_unacked) {
        agent_send_error(a, r->id, AL_ERR_PROTOCOL, 0, "stdin data beyond the window");
        return;
    }
    r->in_eof = m->flags & AL_FLAG_EOF;
    if (r->in_fd < 0) {
        if (len)
            agent_send_credit(a, r->id, AL_STREAM_STDIN, len);
        return;
    }
    if (q->head && q->len + len > q->cap) {
        memmove(q->p, q->p + q->head, q->len - q->head);
        q->len -= q->head;
        q->head = 0;
    }
    if (q->len + len > q->cap) {
        /* Bounded by the window we announced: in_unacked counts every buffered byte. */
        size_t cap = q->cap ? q->cap : AL_DATA_CHUNK_MAX;
        while (cap < q->len + len)
            cap *= 2;
        uint8_t *p = realloc(q->p, cap);
        if (!p) {
            agent_send_error(a, r->id, AL_ERR_LIMIT, ENOMEM, "no memory for stdin");
            return;
        }
        q->p = p;
        q->cap = cap;
    }
    if (len)
        memcpy(q->p + q->len, m->u.data.data, len);
    q->len += len;
    r->in_unacked += len;
    exec_flush_stdin(a, r);
    if (r->in_eof && r->pty_fd >= 0)
        pty_hangup(a, r);
}

void exec_signal(struct agent *a, const struct al_msg *m)
{
    struct req *r = req_find(a, m->id);
    int signo = (int)m->u.signal.signo;
    if (!r) {
        agent_send_error(a, m->id, AL_ERR_NOT_FOUND, 0, "no request %u", m->id);
        return;
    }
    if (r->kind != REQ_EXEC) {
        agent_send_error(a, m->id, AL_ERR_INVALID, 0, "request %u is not a process", m->id);
        return;
    }
    agent_log("signal id=%u signo=%d", r->id, signo);
    if (signo == SIGKILL)
        r->host_killed = true;
    if (r->tunnel && signo == SIGKILL)
        exec_kill(a, r); /* the host ends the tunnel */
    if (r->reaped)
        return; /* nothing left to signal: the group was killed when the process ended */
    if (r->kernel)
        kernel_signal(a, r, signo);
    else if (signo == SIGKILL)
        exec_kill(a, r);
    else if (kill(-r->pid, signo) < 0 && errno != ESRCH)
        agent_send_error(a, m->id, errno_class(errno), errno, "cannot send signal %d: %s", signo,
                         strerror(errno));
}

void exec_resize(struct agent *a, const struct al_msg *m)
{
    struct req *r = req_find(a, m->id);
    if (!r || r->kind != REQ_EXEC || r->pty_fd < 0) {
        agent_send_error(a, m->id, r ? AL_ERR_INVALID : AL_ERR_NOT_FOUND, 0,
                         r ? "request %u has no terminal" : "no request %u", m->id);
        return;
    }
    struct winsize ws = {.ws_row = m->u.resize.rows, .ws_col = m->u.resize.cols};
    if (ioctl(r->pty_fd, TIOCSWINSZ, &ws) < 0)
        agent_log("resize id=%u: %s", r->id, strerror(errno));
}

/* CONNECT: a tunnel from the host to a service listening on 127.0.0.1:port in the guest, as a
 * request of its own beside the runs. The socket's bytes are the STDOUT stream (the host's
 * credit, no cap), the host's bytes go in as stdin, its EOF half-closes the socket; the tunnel
 * ends (EXIT 0) when the guest's side has closed. Only the host opens one: nothing in the guest
 * can reach the host this way. */
void exec_connect(struct agent *a, const struct al_msg *m)
{
    struct req *r = req_new(a, m->id, REQ_EXEC);
    if (!r)
        return;
    unsigned port = m->u.connect.port;
    _cleanup_close_ int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    /* A loopback connect is answered at once; a full backlog is not waited on for long. */
    struct timeval tv = {.tv_sec = 2};
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0 ||
        connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        int e = errno;
        agent_send_error(a, r->id, e == ECONNREFUSED ? AL_ERR_NOT_FOUND : errno_class(e), e,
                         "nothing answers on 127.0.0.1:%u in the guest: %s", port, strerror(e));
        req_free(a, r);
        return;
    }
    tv.tv_sec = 0;
    int out = -1;
    if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0 ||
        fcntl(fd, F_SETFL, O_NONBLOCK) < 0 || (out = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0) {
        agent_send_error(a, r->id, AL_ERR_INTERNAL, errno, "cannot set up the tunnel: %s",
                         strerror(errno));
        req_free(a, r);
        return;
    }
    agent_log("connect id=%u port=%u", r->id, port);
    r->out[0] = exec_stream(a, out, AL_STREAM_STDOUT, 0);
    r->in_fd = al_take_fd(&fd);
    r->want_stdin = true;
    r->tunnel = true;
    r->reaped = true; /* no process to wait for: the end is the socket's */
    r->start_us = now_us();
    struct al_msg started = {.type = AL_STARTED, .id = r->id};
    agent_send(a, &started);
}

bool exec_reap(struct agent *a)
{
    int st;
    pid_t pid;
    int n = 0;
    /* Bounded: under a fork bomb, orphans reparented to us die as fast as we reap them, and an
     * unbounded loop would starve everything else, the timeout that ends the bomb included. */
    while (n++ < REAP_BATCH && (pid = waitpid(-1, &st, WNOHANG)) > 0) {
        if (kernel_reaped(a, pid, st)) {
            a->cg_due = true;
            continue;
        }
        for (size_t i = 0; i < AGENT_REQ_MAX; i++) {
            struct req *r = &a->reqs[i];
            if (!r->used || r->kind != REQ_EXEC || r->reaped || r->kernel || r->pid != pid)
                continue;
            r->reaped = true;
            a->cg_due = true;
            r->status = st;
            r->end_us = now_us();
            /* The request ends with its main process: leftovers die, and pipes still held
             * open by an escapee are closed after a grace period. */
            exec_kill(a, r);
            r->grace_us = r->end_us + AGENT_DRAIN_GRACE_MS * 1000;
            if (r->in_fd >= 0)
                close(r->in_fd);
            r->in_fd = -1;
            r->inq.head = r->inq.len = 0;
        }
        /* Anything else is an orphan reparented to us: reaping it is all there is to do. */
    }
    return n > REAP_BATCH;
}

static void exec_finish(struct agent *a, struct req *r)
{
    struct al_msg m = {.type = AL_EXIT, .id = r->id};
    bool sig = WIFSIGNALED(r->status);
    m.u.exit.how = sig ? AL_EXIT_SIGNAL : AL_EXIT_CODE;
    m.u.exit.value = sig ? WTERMSIG(r->status) : WEXITSTATUS(r->status);
    m.u.exit.duration_us = r->end_us - r->start_us;
    m.u.exit.flags = r->exit_flags;
    agent_send(a, &m);
    agent_log("exit id=%u %s=%d %.1fms%s%s", r->id, sig ? "signal" : "code", m.u.exit.value,
              (double)m.u.exit.duration_us / 1000.0,
              (r->exit_flags & AL_EXIT_TIMED_OUT) ? " timed-out" : "",
              (r->exit_flags & (AL_EXIT_TRUNC_STDOUT | AL_EXIT_TRUNC_STDERR)) ? " truncated" : "");
    req_free(a, r);
}

/* Sends WAITING once the run has been blocked reading its stdin for input_wait_ms. */
static void exec_wait_check(struct agent *a, struct req *r, uint64_t now)
{
    r->wait_next_us = now + AGENT_WAIT_POLL_MS * 1000;
    bool blocked = !r->active && stdin_blocked(a, r);
    r->active = false;
    if (!blocked) {
        r->blocked_since_us = 0;
        r->waiting_sent = false;
        return;
    }
    if (!r->blocked_since_us)
        r->blocked_since_us = now;
    uint64_t waited = (now - r->blocked_since_us) / 1000;
    if (r->waiting_sent || waited < r->input_wait_ms)
        return;
    r->waiting_sent = true;
    struct al_msg m = {.type = AL_WAITING, .id = r->id};
    m.u.waiting.waited_ms = waited > UINT32_MAX ? UINT32_MAX : (uint32_t)waited;
    agent_log("waiting id=%u for input, %llu ms", r->id, (unsigned long long)waited);
    agent_send(a, &m);
}

void exec_timers(struct agent *a, struct req *r, uint64_t now)
{
    if (!r->reaped && r->deadline_us && now >= r->deadline_us) {
        r->deadline_us = 0;
        r->exit_flags |= AL_EXIT_TIMED_OUT;
        agent_log("timeout id=%u", r->id);
        if (r->kernel && !r->kernel->ready) {
            agent_log("kernel of id=%u did not start in time: killing it", r->id);
            exec_kill(a, r);
        } else if (r->kernel) {
            /* Interrupt the block, not the kernel: its state survives a timeout if it can. */
            kernel_signal(a, r, SIGINT);
            r->kill_us = now + KERNEL_KILL_GRACE_MS * 1000;
        } else {
            exec_kill(a, r);
        }
    }
    if (!r->reaped && r->kill_us && now >= r->kill_us) {
        r->kill_us = 0;
        agent_log("kernel of id=%u ignored the interrupt: killing it", r->id);
        exec_kill(a, r);
    }
}

void exec_tick(struct agent *a, struct req *r, uint64_t now)
{
    exec_timers(a, r, now);
    if (!r->reaped && r->input_wait_ms && r->stdin_ino && now >= r->wait_next_us)
        exec_wait_check(a, r, now);
    if (r->grace_us && now >= r->grace_us) {
        r->grace_us = 0;
        for (int i = 0; i < REQ_OUTS; i++) {
            struct pollfd p = {r->out[i].fd, POLLIN, 0};
            if (p.fd < 0)
                continue;
            if (poll(&p, 1, 0) == 0)
                ostream_close(a, r, &r->out[i]); /* quiet, yet no EOF: held by an escapee */
            else
                r->grace_us = now + AGENT_DRAIN_GRACE_MS * 1000; /* still flowing */
        }
    }
    /* Killed by the host, which gave up on its output (a cancel ends the host's side at once):
     * what the pipes still hold is dropped, or a stream without credit would keep the request,
     * and its slot, forever. */
    if (r->reaped && r->host_killed && !r->kernel)
        for (int i = 0; i < REQ_OUTS; i++)
            if (r->out[i].fd >= 0 && !r->out[i].borrowed)
                ostream_close(a, r, &r->out[i]);
    if (r->reaped && r->out[0].fd < 0 && r->out[1].fd < 0 && r->out[2].fd < 0) {
        if (r->tunnel)
            r->end_us = now;
        exec_finish(a, r);
    }
}

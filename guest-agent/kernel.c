/* Language kernels: one long-lived interpreter per language per connection, so that variables,
 * functions and the working directory survive from one code block to the next.
 *
 * A kernel's stdout and stderr are pipes the agent holds for the kernel's whole life; whatever
 * arrives on them while a run is in progress is that run's output. Each code block goes to the
 * kernel over a control socket (fd 3), with the path of the run's stdin (a pipe of the agent's,
 * opened through /proc, or /dev/null). When the block is over the kernel answers
 * "done ID STATUS" on the same socket, after flushing its output: the bytes then in the pipes
 * are the run's last, and the run ends once they are forwarded. Drivers: guest-agent/kernels/. */
#include "agent.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>

/* Output read and dropped per kernel per loop iteration between runs: a kernel printing in a
 * background thread costs reads, but cannot hold the loop. */
#define DRAIN_PER_ITERATION (4 * AL_DATA_CHUNK_MAX)
/* Header of a driver request: "run ID COUNT" and one length per field, 11 bytes each. */
#define DRIVER_HEADER_MAX (32 + (4 + AL_ENV_MAX) * 11)

// clang-format off
static const struct kernel_lang table[KERNEL_LANGS] = {
    {"python", {"python3"}, KERNEL_DRIVER, "python.py", {"python3"},
     {"$interp", "$script"}, {"PYTHONUNBUFFERED=1", "MPLBACKEND=Agg"}},
    /* Interactive, so that SIGINT abandons the command being run (even a builtin loop) and
     * comes back to the prompt, whose PROMPT_COMMAND reports the status; no readline, which
     * would echo the input. */
    {"shell", {"bash", "sh"}, KERNEL_BASH, "shell.bash", {"bash"},
     {"$interp", "--noediting", "--noprofile", "--rcfile", "$script", "-i"}, {"TERM=dumb"}},
    /* --expose-internals: the driver rewrites blocks as notebook cells with node's own acorn. */
    {"javascript", {"node", "js"}, KERNEL_DRIVER, "node.js", {"node", "nodejs"},
     {"$interp", "--expose-internals", "$script"}, {NULL}, true},
};
// clang-format on

/* Interpreters come from the image, whatever PATH a run sets. */
static const char *const bin_dirs[] = {"/usr/bin", "/bin", "/usr/local/bin"};

void kernel_init(struct agent *a)
{
    if (!a->kernels_dir)
        a->kernels_dir = KERNELS_DIR;
    for (size_t i = 0; i < KERNEL_MAX; i++) {
        struct kernel *k = &a->kernels[i];
        memset(k, 0, sizeof(*k));
        k->ctl_fd = k->out_fd[0] = k->out_fd[1] = k->out_fd[2] = -1;
    }
}

static bool find_interp(const struct kernel_lang *l, char *out, size_t cap)
{
    for (size_t i = 0; i < sizeof(l->interp) / sizeof(l->interp[0]) && l->interp[i]; i++)
        for (size_t d = 0; d < sizeof(bin_dirs) / sizeof(bin_dirs[0]); d++) {
            snprintf(out, cap, "%s/%s", bin_dirs[d], l->interp[i]);
            if (access(out, X_OK) == 0)
                return true;
        }
    return false;
}

static bool find_script(struct agent *a, const struct kernel_lang *l, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%s", a->kernels_dir, l->script);
    return access(out, R_OK) == 0;
}

static bool available(struct agent *a, const struct kernel_lang *l)
{
    char path[PATH_MAX];
    return find_interp(l, path, sizeof(path)) && find_script(a, l, path, sizeof(path));
}

int kernel_langs(struct agent *a, struct al_str *out, size_t max)
{
    static char names[KERNEL_LANGS][AL_SHORT_STR_MAX];
    size_t n = 0;
    for (size_t i = 0; i < KERNEL_LANGS && n < max; i++)
        if (available(a, &table[i])) {
            snprintf(names[i], sizeof(names[i]), "kernel:%s", table[i].name);
            out[n++] = al_str_cstr(names[i]);
        }
    return (int)n;
}

static const struct kernel_lang *lang_find(struct al_str name)
{
    for (size_t i = 0; i < KERNEL_LANGS; i++) {
        const struct kernel_lang *l = &table[i];
        if (al_str_eq(name, l->name))
            return l;
        for (size_t j = 0; j < sizeof(l->aliases) / sizeof(l->aliases[0]) && l->aliases[j]; j++)
            if (al_str_eq(name, l->aliases[j]))
                return l;
    }
    return NULL;
}

/* EXEC.lang as "LANG" or "LANG@CONTEXT": the language, and the context ("default" when none)
 * in ctx; NULL for an unknown language or a bad context name. */
static const struct kernel_lang *lang_parse(struct al_str name, char ctx[AL_CONTEXT_MAX + 1])
{
    const char *at = name.len ? memchr(name.p, '@', name.len) : NULL;
    struct al_str lang = {name.p, at ? (uint32_t)(at - name.p) : name.len};
    struct al_str c =
        at ? (struct al_str){at + 1, name.len - lang.len - 1} : al_str_cstr("default");
    if (!c.len || c.len > AL_CONTEXT_MAX)
        return NULL;
    for (uint32_t i = 0; i < c.len; i++) {
        char ch = c.p[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '_' || ch == '-' || ch == '.'))
            return NULL;
    }
    memcpy(ctx, c.p, c.len);
    ctx[c.len] = '\0';
    return lang_find(lang);
}

/* The kernel of a language's context; with create, a free slot becomes it. */
static struct kernel *kernel_find(struct agent *a, const struct kernel_lang *l, const char *ctx,
                                  bool create)
{
    struct kernel *free_slot = NULL;
    for (size_t i = 0; i < KERNEL_MAX; i++) {
        struct kernel *k = &a->kernels[i];
        if (k->lang == l && !strcmp(k->ctx, ctx))
            return k;
        if (!k->lang && !free_slot)
            free_slot = k;
    }
    if (!create || !free_slot)
        return NULL;
    free_slot->lang = l;
    snprintf(free_slot->ctx, sizeof(free_slot->ctx), "%s", ctx);
    return free_slot;
}

/* Closes what the kernel holds; its process, if any, is reaped as an orphan. */
static void kernel_forget(struct agent *a, struct kernel *k)
{
    al_closep(&k->ctl_fd);
    k->ctl_fd = -1;
    for (int i = 0; i < REQ_OUTS; i++) {
        al_closep(&k->out_fd[i]);
        k->out_fd[i] = -1;
    }
    free(k->wbuf);
    k->wbuf = NULL;
    k->wlen = k->woff = k->linelen = 0;
    cgroup_remove(a, k->cgroup);
    k->pid = 0;
    k->ready = false;
}

void kernel_kill(struct agent *a, struct kernel *k)
{
    if (k->pid)
        tree_kill(a, k->cgroup, k->pid);
}

/* Starts k's interpreter for run r in cwd; returns 0, or sends the error itself and returns
 * -1. */
static int kernel_start(struct agent *a, struct kernel *k, struct req *r, struct al_str cwd)
{
    const struct kernel_lang *l = k->lang;
    char interp[PATH_MAX], script[PATH_MAX], dir[AL_GUEST_PATH_MAX + 1];
    _cleanup_close_ int out_r = -1, out_w = -1, err_r = -1, err_w = -1, cg_fd = -1;
    _cleanup_close_ int res_r = -1, res_w = -1;
    _cleanup_close_ int ctl = -1, child_ctl = -1;
    int sv[2], err = 0;

    if (!find_interp(l, interp, sizeof(interp)) || !find_script(a, l, script, sizeof(script))) {
        agent_send_error(a, r->id, AL_ERR_UNSUPPORTED, 0, "language kernel %s not available",
                         l->name);
        return -1;
    }
    if (a->null_fd < 0 && (a->null_fd = open("/dev/null", O_RDWR | O_CLOEXEC)) < 0) {
        agent_send_error(a, r->id, AL_ERR_INTERNAL, errno, "cannot open /dev/null: %s",
                         strerror(errno));
        return -1;
    }
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        err = -errno;
    else {
        ctl = sv[0];
        child_ctl = sv[1];
        if (fcntl(ctl, F_SETFL, O_NONBLOCK) < 0)
            err = -errno;
    }
    if (err < 0 || (err = pipe_pair(&out_r, &out_w, 0)) < 0 ||
        (err = pipe_pair(&err_r, &err_w, 0)) < 0 || (err = pipe_pair(&res_r, &res_w, 0)) < 0) {
        agent_send_error(a, r->id, errno_class(-err), -err, "cannot create pipes: %s",
                         strerror(-err));
        return -1;
    }
    fcntl(out_r, F_SETPIPE_SZ, AGENT_PIPE_SIZE);
    fcntl(err_r, F_SETPIPE_SZ, AGENT_PIPE_SIZE);
    fcntl(res_r, F_SETPIPE_SZ, AGENT_PIPE_SIZE);
    char prefix[AL_SHORT_STR_MAX];
    snprintf(prefix, sizeof(prefix), "kernel-%s", l->name);
    if (a->cgroup && (cg_fd = cgroup_new(a, k->cgroup, sizeof(k->cgroup), prefix)) < 0) {
        agent_send_error(a, r->id, errno_class(-cg_fd), -cg_fd, "cannot create cgroup: %s",
                         strerror(-cg_fd));
        return -1;
    }

    char *argv[sizeof(l->argv) / sizeof(l->argv[0]) + 1];
    size_t argc = 0;
    for (; argc < sizeof(l->argv) / sizeof(l->argv[0]) && l->argv[argc]; argc++)
        argv[argc] = !strcmp(l->argv[argc], "$interp")   ? interp
                     : !strcmp(l->argv[argc], "$script") ? script
                                                         : (char *)l->argv[argc];
    argv[argc] = NULL;
    size_t nenv = 0;
    while (nenv < sizeof(l->env) / sizeof(l->env[0]) && l->env[nenv])
        nenv++;
    /* The run's cwd is where the kernel starts; afterwards the kernel's own (a shell's cd)
     * persists, whatever later runs say. */
    memcpy(dir, cwd.p, cwd.len);
    dir[cwd.len] = '\0';
    struct spawn sp = {argv, spawn_env((char *const *)l->env, nenv), cwd.len ? dir : "/"};
    /* bash reads its commands on stdin; a driver gets /dev/null there between runs. */
    int fds[5] = {l->dialect == KERNEL_BASH ? child_ctl : a->null_fd, out_w, err_w, child_ctl,
                  res_w};
    int e[2];
    pid_t pid = spawn_process(&sp, fds, 5, cg_fd, e);
    if (pid < 0) {
        spawn_error(a, r->id, e, &sp);
        cgroup_remove(a, k->cgroup);
        return -1;
    }
    k->pid = pid;
    k->fresh = true;
    k->ctl_fd = al_take_fd(&ctl);
    k->out_fd[0] = al_take_fd(&out_r);
    k->out_fd[1] = al_take_fd(&err_r);
    k->out_fd[2] = al_take_fd(&res_r);
    k->linelen = 0;
    agent_log("kernel %s started, pid %d", l->name, (int)pid);
    return 0;
}

/* The bash dialect's request is a command line: every string single-quoted, so the code is
 * parsed only by the eval, and a syntax error in it is just the block's failure. */
static size_t put_quoted(char *p, struct al_str s)
{
    size_t n = 0;
    p[n++] = '\'';
    for (uint32_t i = 0; i < s.len; i++) {
        if (s.p[i] == '\'') {
            memcpy(p + n, "'\\''", 4);
            n += 4;
        } else {
            p[n++] = s.p[i];
        }
    }
    p[n++] = '\'';
    return n;
}

static size_t put_lit(char *p, const char *s)
{
    size_t n = strlen(s);
    memcpy(p, s, n);
    return n;
}

static char *request_bash(const struct req *r, const struct al_msg *m, struct al_str in,
                          size_t *len)
{
    size_t cap = 128 + 4 * ((size_t)m->u.exec.argv[0].len + in.len);
    for (uint32_t i = 0; i < m->u.exec.envc; i++)
        cap += 12 * (size_t)m->u.exec.env[i].len + 16;
    char *p = malloc(cap), head[32];
    if (!p)
        return NULL;
    size_t n = 0;
    snprintf(head, sizeof(head), "__al_id=%u; ", r->id);
    n += put_lit(p + n, head);
    if (m->u.exec.envc) {
        /* The run's environment is the run's only: the prompt evaluates __al_undo, which
         * unsets the names and declares again those that were set (even after a ^C). */
        for (int pass = 0; pass < 2; pass++) {
            n += put_lit(p + n, pass ? "; $(declare -p" : "__al_undo=\"unset -v");
            for (uint32_t i = 0; i < m->u.exec.envc; i++) {
                struct al_str e = m->u.exec.env[i];
                const char *eq = memchr(e.p, '=', e.len);
                p[n++] = ' ';
                n += put_quoted(p + n, (struct al_str){e.p, (uint32_t)(eq - e.p)});
            }
            n += put_lit(p + n, " 2>/dev/null");
        }
        n += put_lit(p + n, ")\"; export --");
        for (uint32_t i = 0; i < m->u.exec.envc; i++) {
            p[n++] = ' ';
            n += put_quoted(p + n, m->u.exec.env[i]);
        }
        n += put_lit(p + n, " && ");
    }
    /* The block's stdin is the run's; fd 3, the control socket, is not the block's business. */
    n += put_lit(p + n, "{ eval -- ");
    n += put_quoted(p + n, m->u.exec.argv[0]);
    n += put_lit(p + n, "; } 0<");
    n += put_quoted(p + n, in);
    n += put_lit(p + n, " 3>&- 4>&-\n");
    *len = n;
    return p;
}

/* A driver's request: "run ID COUNT LEN..." then the fields back to back: code, stdin path,
 * then KEY=VALUE entries. */
/* "run ID COUNT LEN..." and the fields: the code, the stdin path, the directory to change to
 * first ("" to stay: only a fresh kernel's first run moves it), the env entries. */
static char *request_driver(const struct req *r, const struct al_msg *m, struct al_str in,
                            struct al_str cwd, size_t *len)
{
    struct al_str f[3 + AL_ENV_MAX];
    uint32_t nf = 0;
    f[nf++] = m->u.exec.argv[0];
    f[nf++] = in;
    f[nf++] = cwd;
    for (uint32_t i = 0; i < m->u.exec.envc; i++)
        f[nf++] = m->u.exec.env[i];
    size_t cap = DRIVER_HEADER_MAX;
    for (uint32_t i = 0; i < nf; i++)
        cap += f[i].len;
    char *p = malloc(cap);
    if (!p)
        return NULL;
    size_t n = (size_t)snprintf(p, DRIVER_HEADER_MAX, "run %u %u", r->id, nf);
    for (uint32_t i = 0; i < nf; i++)
        n += (size_t)snprintf(p + n, DRIVER_HEADER_MAX - n, " %u", f[i].len);
    p[n++] = '\n';
    for (uint32_t i = 0; i < nf; i++) {
        if (f[i].len)
            memcpy(p + n, f[i].p, f[i].len);
        n += f[i].len;
    }
    *len = n;
    return p;
}

static bool has_nul(struct al_str s)
{
    return s.len && memchr(s.p, 0, s.len);
}

/* What a kernel run may not carry: the bash dialect cannot pass NUL bytes, and each language
 * would read them differently. */
static const char *request_invalid(const struct al_msg *m)
{
    if (m->u.exec.argc != 1)
        return "a kernel run takes exactly one code block";
    if (has_nul(m->u.exec.argv[0]))
        return "code contains a NUL byte";
    if (has_nul(m->u.exec.cwd))
        return "cwd contains a NUL byte";
    for (uint32_t i = 0; i < m->u.exec.envc; i++) {
        struct al_str e = m->u.exec.env[i];
        if (has_nul(e) || !e.len || e.p[0] == '=' || !memchr(e.p, '=', e.len))
            return "an environment entry is not KEY=VALUE";
    }
    return NULL;
}

/* The run's stdin: a pipe whose read end the kernel opens through /proc, or /dev/null. */
static int run_stdin(struct req *r, const struct al_msg *m, char *path, size_t cap)
{
    bool want = m->u.exec.flags & AL_EXEC_STDIN;
    int in_r, in_w, err;
    if (!want && !m->u.exec.input_wait_ms) {
        snprintf(path, cap, "/dev/null");
        return 0;
    }
    if ((err = pipe_pair(&in_r, &in_w, 1)) < 0)
        return err;
    exec_stdin_identity(r, in_w);
    r->stdin_hold[0] = in_r;
    if (want) {
        r->in_fd = in_w;
        r->want_stdin = true;
    } else {
        r->stdin_hold[1] = in_w; /* never written: a read waits, and is reported */
    }
    snprintf(path, cap, "/proc/%d/fd/%d", (int)getpid(), in_r);
    return 0;
}

static void ctl_flush(struct agent *a, struct kernel *k)
{
    while (k->woff < k->wlen) {
        ssize_t n = send(k->ctl_fd, k->wbuf + k->woff, k->wlen - k->woff, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        if (n < 0) {
            agent_log("kernel %s: cannot send the request: %s", k->lang->name, strerror(errno));
            kernel_kill(a, k); /* its death ends the run */
            break;
        }
        k->woff += (size_t)n;
    }
    free(k->wbuf);
    k->wbuf = NULL;
    k->wlen = k->woff = 0;
}

/* A request that ends at once: stdout text (may be empty), EOF on stdout and stderr, exit 0. */
static void answer_now(struct agent *a, struct req *r, const char *text, size_t len)
{
    struct al_msg m = {.type = AL_STARTED, .id = r->id};
    agent_send(a, &m);
    for (uint8_t s = AL_STREAM_STDOUT; s <= AL_STREAM_STDERR; s++) {
        m = (struct al_msg){.type = AL_DATA, .id = r->id, .flags = AL_FLAG_EOF};
        m.u.data.stream = s;
        m.u.data.data = (const uint8_t *)text;
        m.u.data.len = s == AL_STREAM_STDOUT ? (uint32_t)len : 0;
        agent_send(a, &m);
    }
    m = (struct al_msg){.type = AL_EXIT, .id = r->id};
    agent_send(a, &m);
    req_free(a, r);
}

/* "stop": the context's kernel is killed and the context forgotten (its next run starts a
 * fresh kernel, without the "state lost" note); "list": one line per context, "LANG CONTEXT
 * running|stopped" (stopped: its kernel died; the next run says the state was lost). */
static void kernel_op(struct agent *a, struct req *r, const struct al_msg *m,
                      const struct kernel_lang *l, const char *ctx)
{
    struct al_str op = m->u.exec.argv[0];
    if (al_str_eq(op, "list")) {
        char text[KERNEL_MAX * (AL_SHORT_STR_MAX + AL_CONTEXT_MAX + 16)];
        size_t n = 0;
        for (size_t i = 0; i < KERNEL_MAX; i++) {
            struct kernel *k = &a->kernels[i];
            if (k->lang && (k->pid || k->lost))
                n += (size_t)snprintf(text + n, sizeof(text) - n, "%s %s %s\n", k->lang->name,
                                      k->ctx, k->pid ? "running" : "stopped");
        }
        answer_now(a, r, text, n);
        return;
    }
    if (!al_str_eq(op, "stop") || m->u.exec.argc != 1) {
        agent_send_error(a, r->id, AL_ERR_INVALID, 0, "kernel operations: stop, list");
        req_free(a, r);
        return;
    }
    struct kernel *k = kernel_find(a, l, ctx, false);
    if (k && k->run) {
        agent_send_error(a, r->id, AL_ERR_LIMIT, EBUSY, "the %s kernel %s is busy with request %u",
                         l->name, ctx, k->run->id);
        req_free(a, r);
        return;
    }
    if (k) {
        agent_log("kernel %s@%s stopped by the host", l->name, ctx);
        kernel_kill(a, k);
        kernel_forget(a, k); /* its process is reaped as an orphan */
        k->lost = false;
        k->lang = NULL;
    }
    answer_now(a, r, "", 0);
}

void kernel_exec(struct agent *a, struct req *r, const struct al_msg *m)
{
    char in_path[64], tmp[AL_SHORT_STR_MAX + 1], ctx[AL_CONTEXT_MAX + 1];
    const struct kernel_lang *l = lang_parse(m->u.exec.lang, ctx);
    const char *bad = request_invalid(m);

    if (!l || bad) {
        if (l)
            agent_send_error(a, r->id, AL_ERR_INVALID, 0, "%s", bad);
        else
            agent_send_error(a, r->id, AL_ERR_UNSUPPORTED, 0, "no language kernel %s",
                             printable(m->u.exec.lang, tmp, sizeof(tmp)));
        req_free(a, r);
        return;
    }
    if (m->u.exec.flags & AL_EXEC_KERNEL_OP) {
        kernel_op(a, r, m, l, ctx);
        return;
    }
    struct kernel *k = kernel_find(a, l, ctx, true);
    if (!k) {
        agent_send_error(a, r->id, AL_ERR_LIMIT, 0, "too many kernels (at most %d)", KERNEL_MAX);
        req_free(a, r);
        return;
    }
    if (k->run) {
        agent_send_error(a, r->id, AL_ERR_LIMIT, EBUSY, "the %s kernel is busy with request %u",
                         k->lang->name, k->run->id);
        req_free(a, r);
        return;
    }
    bool restarted = false;
    if (!k->pid) {
        restarted = k->lost;
        if (kernel_start(a, k, r, m->u.exec.cwd) < 0) {
            req_free(a, r);
            return;
        }
    }
    int err = run_stdin(r, m, in_path, sizeof(in_path));
    size_t len = 0;
    char *req = NULL;
    if (err == 0) {
        struct al_str in = al_str_cstr(in_path);
        struct al_str cwd = k->fresh ? m->u.exec.cwd : al_str_cstr("");
        req = k->lang->dialect == KERNEL_BASH ? request_bash(r, m, in, &len)
                                              : request_driver(r, m, in, cwd, &len);
        err = req ? 0 : -ENOMEM;
    }
    if (err < 0) {
        agent_send_error(a, r->id, errno_class(-err), -err, "cannot set up the run: %s",
                         strerror(-err));
        req_free(a, r);
        return;
    }

    /* Output the kernel wrote between runs is nobody's: drop it before this run takes over. */
    for (int i = 0; i < REQ_OUTS; i++)
        kernel_drain(k, i);
    k->lost = false;
    k->fresh = false;
    k->run = r;
    k->wbuf = req;
    k->wlen = len;
    k->woff = 0;
    r->kernel = k;
    r->pid = k->pid;
    r->start_us = now_us();
    r->timeout_ms = m->u.exec.timeout_ms;
    /* The timeout counts from when the kernel takes the block (kernel_ready for a kernel still
     * starting); until then only a start that takes far too long ends the run. */
    if (r->timeout_ms)
        r->deadline_us =
            r->start_us + ((uint64_t)r->timeout_ms + (k->ready ? 0 : KERNEL_START_MAX_MS)) * 1000;
    for (int i = 0; i < REQ_OUTS; i++)
        r->out[i] =
            (struct ostream){.fd = k->out_fd[i],
                             .stream = (uint8_t)(i < 2 ? AL_STREAM_STDOUT + i : AL_STREAM_RESULT),
                             .credit = a->window,
                             /* results: the host bounds each record itself */
                             .limit = i < 2 ? m->u.exec.output_cap : 0,
                             .borrowed = true,
                             .paused = !k->ready};
    struct al_msg started = {.type = AL_STARTED, .id = r->id};
    started.u.started.pid = (uint32_t)k->pid;
    agent_send(a, &started);
    if (restarted) {
        char note[96];
        snprintf(note, sizeof(note), "airlock: %s kernel restarted; state lost\n", k->lang->name);
        ostream_inject(a, r, &r->out[1], note);
    }
    /* A kernel still starting gets the request once it is ready: until then, what its pipes
     * hold is its own noise. */
    if (k->ready)
        ctl_flush(a, k);
}

/* The run's stdin ends with its block: the host's further bytes are credited and dropped. */
static void run_stdin_close(struct req *r)
{
    for (int i = 0; i < 2; i++) {
        al_closep(&r->stdin_hold[i]);
        r->stdin_hold[i] = -1;
    }
    al_closep(&r->in_fd);
    r->in_fd = -1;
    r->inq.head = r->inq.len = 0;
}

static void kernel_done(struct agent *a, struct kernel *k, uint32_t id, unsigned status)
{
    struct req *r = k->run;
    if (!r || r->id != id || r->reaped)
        return; /* a late answer for a run that already ended (killed, timed out) */
    r->reaped = true;
    r->status = (int)(status & 0xff) << 8; /* as a wait status: exited with it */
    r->end_us = now_us();
    r->kill_us = 0;
    run_stdin_close(r);
    /* The kernel flushed before answering: what the pipes hold now is the rest of the block's
     * output, and what comes after belongs to no run. */
    for (int i = 0; i < REQ_OUTS; i++) {
        struct ostream *o = &r->out[i];
        int n = 0;
        if (o->fd < 0)
            continue;
        if (ioctl(o->fd, FIONREAD, &n) < 0 || n <= 0)
            ostream_close(a, r, o);
        else
            o->stop_at = o->nread + (uint64_t)n;
    }
}

/* Whatever the interpreter printed while starting (bash's complaints about job control) is
 * dropped; the run waiting for the kernel starts reading now, and its request goes out: the
 * block cannot have written anything yet. */
static void kernel_ready(struct agent *a, struct kernel *k)
{
    k->ready = true;
    for (int i = 0; i < REQ_OUTS; i++) {
        kernel_drain(k, i);
        if (k->run)
            k->run->out[i].paused = false;
    }
    struct req *r = k->run;
    if (r && !r->reaped && r->timeout_ms && r->deadline_us)
        r->deadline_us = now_us() + (uint64_t)r->timeout_ms * 1000;
    if (k->wbuf)
        ctl_flush(a, k);
}

/* "ready" once, then "done ID STATUS" per run; anything else means the kernel is broken, and
 * it is killed. */
static void kernel_line(struct agent *a, struct kernel *k, const char *line)
{
    unsigned id, status;
    char end;
    if (!k->ready && !strcmp(line, "ready")) {
        kernel_ready(a, k);
        return;
    }
    if (k->ready && sscanf(line, "done %u %u%c", &id, &status, &end) == 2 && status <= 255) {
        kernel_done(a, k, id, status);
        return;
    }
    agent_log("kernel %s said something unexpected: killing it", k->lang->name);
    kernel_kill(a, k);
}

void kernel_ctl_io(struct agent *a, struct kernel *k, short revents)
{
    if ((revents & POLLOUT) && k->wbuf && k->ready)
        ctl_flush(a, k);
    if (!(revents & (POLLIN | POLLHUP | POLLERR)) || k->ctl_fd < 0)
        return;
    char buf[256];
    ssize_t n = recv(k->ctl_fd, buf, sizeof(buf), 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (n <= 0) {
        /* The kernel let go of its control socket: it is dying or useless. */
        al_closep(&k->ctl_fd);
        k->ctl_fd = -1;
        kernel_kill(a, k);
        return;
    }
    for (ssize_t i = 0; i < n && k->ctl_fd >= 0; i++) {
        if (buf[i] != '\n') {
            if (k->linelen < sizeof(k->line) - 1) {
                k->line[k->linelen++] = buf[i];
                continue;
            }
            k->line[k->linelen] = '\0';
            k->linelen = 0;
            kernel_line(a, k, "(line too long)");
            return;
        }
        k->line[k->linelen] = '\0';
        k->linelen = 0;
        kernel_line(a, k, k->line);
    }
}

void kernel_drain(struct kernel *k, int i)
{
    static uint8_t sink[AL_DATA_CHUNK_MAX];
    for (size_t got = 0; k->out_fd[i] >= 0 && got < DRAIN_PER_ITERATION;) {
        ssize_t n = read(k->out_fd[i], sink, sizeof(sink));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return; /* EAGAIN: empty */
        if (n == 0) {
            /* No writer left: the kernel is gone; nothing more will come. */
            close(k->out_fd[i]);
            k->out_fd[i] = -1;
            return;
        }
        got += (size_t)n;
    }
}

bool kernel_reaped(struct agent *a, pid_t pid, int status)
{
    for (size_t i = 0; i < KERNEL_MAX; i++) {
        struct kernel *k = &a->kernels[i];
        if (!k->pid || k->pid != pid)
            continue;
        agent_log("kernel %s (pid %d) ended: %s %d", k->lang->name, (int)pid,
                  WIFSIGNALED(status) ? "signal" : "status",
                  WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
        kernel_kill(a, k); /* whatever it left running */
        struct req *r = k->run;
        if (r) {
            if (!r->reaped) {
                r->reaped = true;
                r->status = status;
                r->end_us = now_us();
                /* Its leftovers were killed; pipes an escapee holds close after a grace. */
                r->grace_us = r->end_us + AGENT_DRAIN_GRACE_MS * 1000;
                run_stdin_close(r);
            }
            /* The run keeps the pipes it still reads, now as its own; a kernel that died
             * starting says why there. */
            for (int j = 0; j < REQ_OUTS; j++)
                if (r->out[j].fd >= 0 && r->out[j].fd == k->out_fd[j]) {
                    r->out[j].borrowed = r->out[j].paused = false;
                    k->out_fd[j] = -1;
                }
            r->kernel = NULL;
            k->run = NULL;
        }
        /* A kernel that never said ready had no state to lose. */
        bool had_state = k->ready;
        kernel_forget(a, k);
        k->lost = had_state;
        return true;
    }
    return false;
}

/* Whether pid's SIGINT is at its default disposition (which ends the process), from
 * /proc/PID/status; false when that cannot be read. */
static bool sigint_would_kill(pid_t pid)
{
    char path[64], line[128];
    unsigned long long caught = 0, ignored = 0;
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return false;
    bool seen = false;
    while (fgets(line, sizeof(line), f)) {
        if (sscanf(line, "SigIgn: %llx", &ignored) == 1)
            continue;
        if (sscanf(line, "SigCgt: %llx", &caught) == 1)
            seen = true;
    }
    fclose(f);
    unsigned long long bit = 1ull << (SIGINT - 1);
    return seen && !((caught | ignored) & bit);
}

/* How long an interrupt waits for the interpreter to have a SIGINT handler again, in the call;
 * and how long it is held past that before it goes all the same. */
#define SIGINT_HANDLER_WAIT_MS 200
#define SIGINT_HOLD_MAX_MS 20000
/* sigint_again: a second after the first, at most this many more */
#define SIGINT_AGAIN_MS 1000
#define SIGINT_AGAIN_MAX 5

void kernel_signal(struct agent *a, struct req *r, int signo)
{
    struct kernel *k = r->kernel;
    /* The block ended (its answer came, the EXIT not yet sent): a signal now would land in the
     * driver between runs, or in the next block. */
    if (!k || k->run != r || r->reaped)
        return;
    /* A kernel still starting has no state yet and runs no block: whatever the signal, it would
     * land in the interpreter's own start-up (a traceback of the driver); end it instead. */
    if (signo == SIGKILL || !k->ready) {
        kernel_kill(a, k);
        return;
    }
    /* node's vm module lets go of the process's SIGINT handler for a moment as a block starts
     * (it removes the listeners before its own watchdog takes the signal): a SIGINT then
     * would end the kernel and its state. Wait for a handler a few milliseconds; past that (a
     * loaded machine, a restored VM whose node is slow to come back) the signal is held and
     * sent by kernel_tick once a handler is there, the run going on meanwhile. */
    for (int i = 0; signo == SIGINT && i < SIGINT_HANDLER_WAIT_MS && sigint_would_kill(k->pid); i++)
        usleep(1000);
    if (signo == SIGINT && sigint_would_kill(k->pid)) {
        if (!k->sigint_until)
            k->sigint_until = now_us() + SIGINT_HOLD_MAX_MS * 1000ull;
        k->sigint_held = r->id;
        return;
    }
    k->sigint_until = 0;
    if (signo == SIGINT && k->lang->sigint_again && r->id != k->sigint_run) {
        k->sigint_run = r->id;
        k->sigint_left = SIGINT_AGAIN_MAX;
        k->sigint_next = now_us() + SIGINT_AGAIN_MS * 1000ull;
    }
    /* The whole group, as a terminal's ^C: the interpreter and what the block started. */
    if (kill(-k->pid, signo) < 0 && errno != ESRCH)
        agent_send_error(a, r->id, errno_class(errno), errno, "cannot send signal %d: %s", signo,
                         strerror(errno));
}

uint64_t kernel_tick(struct agent *a, uint64_t now)
{
    uint64_t next = UINT64_MAX;
    for (size_t i = 0; i < KERNEL_MAX; i++) {
        struct kernel *k = &a->kernels[i];
        if (k->sigint_run && (!k->pid || !k->run || k->run->id != k->sigint_run))
            k->sigint_left = k->sigint_run = 0; /* the interrupted block ended */
        if (k->sigint_left && !k->sigint_until && now >= k->sigint_next) {
            k->sigint_left--;
            k->sigint_next = now + SIGINT_AGAIN_MS * 1000ull;
            kernel_signal(a, k->run, SIGINT); /* held like the first while no handler */
        }
        if (k->sigint_left && k->sigint_next < next)
            next = k->sigint_next;
        if (!k->sigint_until)
            continue;
        if (!k->pid || !k->run || k->run->id != k->sigint_held || k->run->reaped) {
            /* the block ended, or the kernel: nothing to interrupt (a tick may come only after
             * the next run took the kernel) */
            k->sigint_until = 0;
            continue;
        }
        if (!sigint_would_kill(k->pid) || now >= k->sigint_until) {
            k->sigint_until = 0;
            if (kill(-k->pid, SIGINT) < 0 && errno != ESRCH)
                agent_send_error(a, k->run->id, errno_class(errno), errno,
                                 "cannot send signal %d: %s", SIGINT, strerror(errno));
            continue;
        }
        uint64_t again = now + 10000; /* every 10 ms while held */
        if (again < next)
            next = again;
    }
    return next;
}

void kernel_reset_all(struct agent *a)
{
    for (size_t i = 0; i < KERNEL_MAX; i++) {
        struct kernel *k = &a->kernels[i];
        if (k->run) {
            k->run->kernel = NULL;
            k->run = NULL;
        }
        kernel_kill(a, k);
        kernel_forget(a, k);
        k->lost = false; /* a new connection starts with no state to lose, and no contexts */
        k->lang = NULL;
    }
}

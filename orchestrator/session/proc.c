/* Processes by handle: al_exec on a thread of the library, started at once and waited for,
 * signalled or killed later, listed per session. Beside the session's other requests on the
 * link (link.c): each is a request of its own, with its own signal pipe (al_exec_opts.cancel_fd),
 * so a signal reaches this process alone. */
#include "proc.h"
#include "exec.h"
#include "link.h"
#include "session.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <time.h>

struct al_proc {
    al_session *s; /* NULL once the session closed */
    struct al_proc *next;
    uint32_t serial; /* 1, 2 ... in the session */
    al_exec_opts o;  /* the caller's, its strings copied (below) */
    char **argv, **env, *lang, *cwd, *context, *command;
    int (*user_output)(void *ctx, int stream, const uint8_t *data, size_t len);
    void (*user_started)(void *ctx, uint32_t guest_pid);
    void *user_ctx;
    int sig[2]; /* the run's signal pipe: sig[0] is its cancel_fd */
    pthread_t thread;
    bool joined; /* al_procs_end joined it (under procs_mu) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t pid; /* the guest's word, 0 until started */
    int64_t started_at;
    bool done;
    int rc;
    al_exec_result res;
    al_error err;
};

/* The sessions' process lists (al_session.procs) and each process's link to its session. */
static pthread_mutex_t procs_mu = PTHREAD_MUTEX_INITIALIZER;

/* The caller's output callback, with its own context: output_ctx is the handle's, for
 * proc_started. */
static int proc_output(void *ctx, int stream, const uint8_t *data, size_t len)
{
    struct al_proc *p = ctx;
    return p->user_output(p->user_ctx, stream, data, len);
}

static void proc_started(void *ctx, uint32_t pid)
{
    struct al_proc *p = ctx;
    pthread_mutex_lock(&p->mu);
    p->pid = pid;
    pthread_mutex_unlock(&p->mu);
    if (p->user_started)
        p->user_started(p->user_ctx, pid);
}

static void *proc_main(void *arg)
{
    struct al_proc *p = arg;
    al_exec_result res = AL_EXEC_RESULT_INIT;
    al_error err = {0};
    int rc = al_exec_taken(p->s, &p->o, &res, &err);
    pthread_mutex_lock(&p->mu);
    p->rc = rc;
    p->res = res;
    p->err = err;
    p->done = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static void proc_free_parts(struct al_proc *p)
{
    al_strv_free(p->argv);
    al_strv_free(p->env);
    free(p->lang);
    free(p->cwd);
    free(p->context);
    free(p->command);
    al_closep(&p->sig[0]);
    al_closep(&p->sig[1]);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
}

/* Takes p out of its session's list, if it is still in one (under procs_mu). */
static void procs_unlink(struct al_proc *p)
{
    if (p->s)
        for (struct al_proc **q = &p->s->procs; *q; q = &(*q)->next)
            if (*q == p) {
                *q = p->next;
                break;
            }
    p->s = NULL;
}

/* The command as al_proc_info shows it: argv joined by spaces, cut to 256 bytes. */
static char *command_line(char *const *argv)
{
    char buf[257];
    size_t n = 0;
    buf[0] = '\0';
    for (size_t i = 0; argv[i] && n < sizeof(buf) - 1; i++)
        n += (size_t)snprintf(buf + n, sizeof(buf) - n, "%s%s", i ? " " : "", argv[i]);
    return strdup(buf);
}

int al_exec_start(al_session *s, const al_exec_opts *opts, al_proc **out, al_error *err)
{
    al_exec_opts o;
    al_exec_result probe = AL_EXEC_RESULT_INIT;
    int r = al_exec_take(&o, opts, &probe, err);
    if (r < 0)
        return r;
    if (o.cancel_fd >= 0)
        return al_err(err, -EINVAL,
                      "a process is signalled through its handle (al_proc_signal), "
                      "not al_exec_opts.cancel_fd");
    struct al_proc *p = calloc(1, sizeof(*p));
    if (!p)
        return al_err(err, -ENOMEM, "out of memory");
    p->sig[0] = p->sig[1] = -1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->cv, &ca);
    pthread_condattr_destroy(&ca);
    bool oom = false;
    /* A run taken over (al_exec_opts.adopt) is listed by its request id. */
    char adopted[48];
    snprintf(adopted, sizeof(adopted), "(run %u, taken over)", o.adopt);
    const char *adopted_argv[] = {adopted, NULL};
    if (o.adopt)
        o.argv = adopted_argv;
    p->lang = al_strdup_opt(o.lang, &oom);
    p->cwd = al_strdup_opt(o.cwd, &oom);
    p->context = al_strdup_opt(o.context, &oom);
    if (oom || !(p->argv = al_strv_dup(o.argv)) || (o.env && !(p->env = al_strv_dup(o.env))) ||
        !(p->command = command_line(p->argv))) {
        proc_free_parts(p);
        return al_err(err, -ENOMEM, "out of memory");
    }
    if (pipe2(p->sig, O_CLOEXEC | O_NONBLOCK) < 0) {
        int e = errno;
        proc_free_parts(p);
        return al_err(err, -e, "pipe: %s", strerror(e));
    }
    p->user_output = o.output;
    p->user_started = o.started;
    p->user_ctx = o.output_ctx;
    p->o = o;
    p->o.argv = (const char *const *)p->argv;
    p->o.env = (const char *const *)p->env;
    p->o.lang = p->lang;
    p->o.cwd = p->cwd;
    p->o.context = p->context;
    /* Without a callback al_exec writes to the descriptors itself, as it would have. */
    p->o.output = o.output ? proc_output : NULL;
    p->o.started = proc_started;
    p->o.output_ctx = p;
    p->o.cancel_fd = p->sig[0];
    p->s = s;
    p->started_at = (int64_t)time(NULL);

    pthread_mutex_lock(&procs_mu);
    p->serial = ++s->proc_serial;
    p->next = s->procs;
    s->procs = p;
    pthread_mutex_unlock(&procs_mu);
    r = pthread_create(&p->thread, NULL, proc_main, p);
    if (r != 0) {
        pthread_mutex_lock(&procs_mu);
        procs_unlink(p);
        pthread_mutex_unlock(&procs_mu);
        proc_free_parts(p);
        return al_err(err, -r, "cannot start the process's thread: %s", strerror(r));
    }
    *out = p;
    return 0;
}

int al_proc_wait(al_proc *p, int timeout_ms, al_exec_result *out, al_error *err)
{
    if (out) {
        int r0 = AL_SIZED_OUT(out, "al_exec_result", err);
        if (r0 < 0)
            return r0;
    }
    /* p->cv waits on the monotonic clock (al_exec_start): a clock step does not move it. */
    uint64_t end_us = al_now_us() + (timeout_ms > 0 ? (uint64_t)timeout_ms * 1000 : 0);
    struct timespec until = {.tv_sec = (time_t)(end_us / 1000000),
                             .tv_nsec = (long)(end_us % 1000000) * 1000};
    pthread_mutex_lock(&p->mu);
    while (!p->done && timeout_ms != 0)
        if ((timeout_ms < 0 ? pthread_cond_wait(&p->cv, &p->mu)
                            : pthread_cond_timedwait(&p->cv, &p->mu, &until)) == ETIMEDOUT)
            break;
    bool done = p->done;
    int rc = p->rc;
    al_exec_result res = p->res;
    al_error e = p->err;
    pthread_mutex_unlock(&p->mu);
    if (!done)
        return al_err(err, -EAGAIN, "process %u is still running", p->serial);
    if (rc < 0) {
        if (err && !err->code)
            *err = e;
        return rc;
    }
    if (out)
        *out = res;
    return 0;
}

int al_proc_signal(al_proc *p, int sig, al_error *err)
{
    if (sig < 1 || sig > 64)
        return al_err(err, -EINVAL, "no signal %d", sig);
    pthread_mutex_lock(&p->mu);
    bool done = p->done;
    pthread_mutex_unlock(&p->mu);
    if (done)
        return al_err(err, -ESRCH, "process %u has ended", p->serial);
    uint8_t b = (uint8_t)sig;
    if (write(p->sig[1], &b, 1) != 1)
        return al_err(err, -errno, "cannot signal process %u: %s", p->serial, strerror(errno));
    return 0;
}

int al_proc_kill(al_proc *p, al_error *err)
{
    return al_proc_signal(p, SIGKILL, err);
}

uint32_t al_proc_pid(al_proc *p)
{
    pthread_mutex_lock(&p->mu);
    uint32_t pid = p->pid;
    pthread_mutex_unlock(&p->mu);
    return pid;
}

uint32_t al_proc_serial(const al_proc *p)
{
    return p->serial;
}

static void proc_info(struct al_proc *p, al_proc_info *info)
{
    pthread_mutex_lock(&p->mu);
    *info = (al_proc_info){.struct_size = sizeof(*info),
                           .serial = p->serial,
                           .guest_pid = p->pid,
                           .command = p->command,
                           .started = p->started_at,
                           .running = !p->done,
                           .how = p->done && p->rc == 0 ? p->res.how : 0,
                           .value = p->done && p->rc == 0 ? p->res.value : 0,
                           .failed = p->done && p->rc < 0};
    pthread_mutex_unlock(&p->mu);
}

int al_proc_list(al_session *s, void (*fn)(void *ctx, const al_proc_info *info), void *ctx)
{
    int n = 0;
    pthread_mutex_lock(&procs_mu);
    for (struct al_proc *p = s->procs; p; p = p->next, n++) {
        al_proc_info info;
        proc_info(p, &info);
        fn(ctx, &info);
    }
    pthread_mutex_unlock(&procs_mu);
    return n;
}

void al_proc_free(al_proc *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    bool done = p->done;
    pthread_mutex_unlock(&p->mu);
    if (!done) {
        uint8_t b = SIGKILL;
        (void)!write(p->sig[1], &b, 1);
    }
    pthread_mutex_lock(&procs_mu);
    bool joined = p->joined;
    procs_unlink(p);
    pthread_mutex_unlock(&procs_mu);
    if (!joined)
        pthread_join(p->thread, NULL);
    proc_free_parts(p);
}

void al_procs_end(al_session *s)
{
    pthread_mutex_lock(&procs_mu);
    bool any = s->procs != NULL;
    pthread_mutex_unlock(&procs_mu);
    if (!any)
        return;
    /* Every request fails at once; the threads then return, and their handles stay the
     * callers' (waits answer, frees free), without the session. */
    al_link_fail_all(s, -ESHUTDOWN, "the session is being ended");
    for (;;) {
        pthread_mutex_lock(&procs_mu);
        struct al_proc *p = s->procs;
        if (p) {
            s->procs = p->next;
            p->s = NULL;
            p->next = NULL;
        }
        pthread_mutex_unlock(&procs_mu);
        if (!p)
            break;
        pthread_join(p->thread, NULL);
        pthread_mutex_lock(&procs_mu);
        p->joined = true; /* al_proc_free must not join again */
        pthread_mutex_unlock(&procs_mu);
    }
}

/* A pool of ready sessions restored from a template (template.c), for long-lived callers: a
 * background thread keeps `size` of them open; al_pool_take hands one out, once. */
#include "exec.h"
#include "session.h"

#include <string.h>

/* A refill waits this long after a hand-out: restoring a session (QEMU starting, the state
 * loading) takes both CPUs of a small host for a fraction of a second, and the session just
 * handed out is about to run its first request (bench/warm.py: its first exec took 2.5x as long
 * when a restore ran alongside). */
#define REFILL_DELAY_MS 1000
/* The warm-up's `true`: ~70 ms after a restore under emulation, far more only on a stuck host. */
#define WARMUP_MS 30000

struct al_pool {
    al_session_opts opts;
    char *image, *connect_uri;
    unsigned size;
    pthread_t thread;
    bool thread_running;
    pthread_mutex_t mu;
    pthread_cond_t changed; /* a session became ready, one was taken, or the pool stops */
    al_session **ready;
    unsigned nready;
    bool stopping;
    al_error last;         /* the refill's last failure, reported by a take that finds none ready */
    unsigned failures;     /* in a row: the refill backs off */
    uint64_t last_take_ms; /* monotonic time of the last hand-out */
};

/* The first process a restored guest starts pays for translating the guest kernel's fork and
 * exec again (QEMU's translated code does not survive the restore): ~60-90 ms under emulation,
 * 3x an exec's round trip (bench/warm.py, pool). A pooled session pays it here, before anyone
 * waits for it, with a `true` whose output goes nowhere. */
static int warm_up(al_session *s, al_error *err)
{
    const char *argv[] = {"true", NULL};
    al_exec_opts o = {.struct_size = sizeof(al_exec_opts), .argv = argv, .timeout_ms = WARMUP_MS};
    return al_exec_quiet(s, o, "a pooled session's first exec", err);
}

/* Refills while there is room, opening outside the lock (a restore takes a second). After a
 * failure it waits a little longer each time (up to 5 s) so a broken host is not hammered. */
static void *refill(void *arg)
{
    al_pool *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!p->stopping) {
        if (p->nready >= p->size) {
            pthread_cond_wait(&p->changed, &p->mu);
            continue;
        }
        uint64_t since = al_now_ms() - p->last_take_ms;
        if (p->last_take_ms && since < REFILL_DELAY_MS) {
            struct timespec until;
            al_deadline_in(&until, (unsigned)(REFILL_DELAY_MS - since));
            pthread_cond_timedwait(&p->changed, &p->mu, &until);
            continue;
        }
        pthread_mutex_unlock(&p->mu);
        al_session *s = NULL;
        al_error err = {0};
        int r = al_session_open(&p->opts, &s, &err);
        if (r == 0 && s->restored && (r = warm_up(s, &err)) < 0) {
            al_session_close(s);
            s = NULL;
        }
        pthread_mutex_lock(&p->mu);
        if (r == 0 && !p->stopping) {
            p->ready[p->nready++] = s;
            p->failures = 0;
            pthread_cond_broadcast(&p->changed);
            continue;
        }
        if (r == 0) {
            pthread_mutex_unlock(&p->mu);
            al_session_close(s);
            pthread_mutex_lock(&p->mu);
            continue;
        }
        p->last = err;
        p->failures++;
        pthread_cond_broadcast(&p->changed);
        unsigned wait_ms = p->failures * 500 < 5000 ? p->failures * 500 : 5000;
        struct timespec until;
        al_deadline_in(&until, wait_ms);
        if (!p->stopping)
            pthread_cond_timedwait(&p->changed, &p->mu, &until);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int al_pool_create(const al_session_opts *in, unsigned size, al_pool **out, al_error *err)
{
    al_session_opts taken = AL_SESSION_OPTS_INIT;
    const al_session_opts *opts = &taken;
    int r0 = AL_SIZED_IN_SINCE(&taken, in, "al_session_opts", display, err);
    if (r0 < 0)
        return r0;
    if (size == 0 || size > AL_POOL_SIZE_MAX)
        return al_err(err, -EINVAL, "a pool holds 1 to %d sessions", AL_POOL_SIZE_MAX);
    al_pool *p = calloc(1, sizeof(*p));
    if (!p)
        return al_err(err, -ENOMEM, "out of memory");
    p->opts = *opts;
    p->opts.warm = AL_WARM_AUTO;
    p->opts.cancel_fd = -1; /* the caller's signal pipe is for the caller's own sessions */
    p->image = opts->image ? strdup(opts->image) : NULL;
    p->connect_uri = opts->connect_uri ? strdup(opts->connect_uri) : NULL;
    p->opts.image = p->image;
    p->opts.connect_uri = p->connect_uri;
    p->opts.raw_port = NULL; /* a pooled session is restored: no benchmark port */
    p->size = size;
    p->ready = calloc(size, sizeof(*p->ready));
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->changed, NULL);
    if (!p->ready || (opts->image && !p->image) || (opts->connect_uri && !p->connect_uri)) {
        al_pool_destroy(p);
        return al_err(err, -ENOMEM, "out of memory");
    }
    int r = pthread_create(&p->thread, NULL, refill, p);
    if (r != 0) {
        al_pool_destroy(p);
        return al_err(err, -r, "cannot start the pool's thread: %s", strerror(r));
    }
    p->thread_running = true;
    *out = p;
    return 0;
}

int al_pool_take(al_pool *p, al_session **out, al_error *err)
{
    unsigned timeout_ms = p->opts.boot_timeout_ms ? p->opts.boot_timeout_ms : 60000;
    /* The first hand-out may wait for the template to be built (a boot plus the imports). */
    uint64_t end = al_now_ms() + timeout_ms + 600000;
    pthread_mutex_lock(&p->mu);
    unsigned failures_seen = p->failures;
    while (!p->nready && !p->stopping) {
        /* A refill that keeps failing is reported, not waited on forever. */
        if (p->failures >= failures_seen + 3 || al_now_ms() >= end) {
            al_error last = p->last;
            pthread_mutex_unlock(&p->mu);
            if (last.code)
                return al_err(err, last.code, "no session from the pool: %s", last.msg);
            return al_err(err, -ETIMEDOUT, "no session from the pool within %u s",
                          timeout_ms / 1000);
        }
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 1;
        pthread_cond_timedwait(&p->changed, &p->mu, &until);
    }
    if (p->stopping) {
        pthread_mutex_unlock(&p->mu);
        return al_err(err, -ESHUTDOWN, "the pool is being destroyed");
    }
    al_session *s = p->ready[--p->nready];
    p->ready[p->nready] = NULL;
    p->last_take_ms = al_now_ms();
    pthread_cond_broadcast(&p->changed);
    pthread_mutex_unlock(&p->mu);
    *out = s;
    return 0;
}

int al_pool_try_take(al_pool *p, al_session **out)
{
    pthread_mutex_lock(&p->mu);
    int r = p->stopping ? -ESHUTDOWN : p->nready ? 0 : -EAGAIN;
    if (r == 0) {
        *out = p->ready[--p->nready];
        p->ready[p->nready] = NULL;
        p->last_take_ms = al_now_ms();
        pthread_cond_broadcast(&p->changed);
    }
    pthread_mutex_unlock(&p->mu);
    return r;
}

unsigned al_pool_ready(al_pool *p)
{
    pthread_mutex_lock(&p->mu);
    unsigned n = p->nready;
    pthread_mutex_unlock(&p->mu);
    return n;
}

void al_pool_destroy(al_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stopping = true;
    pthread_cond_broadcast(&p->changed);
    pthread_mutex_unlock(&p->mu);
    if (p->thread_running)
        pthread_join(p->thread, NULL);
    for (unsigned i = 0; i < p->nready; i++)
        al_session_close(p->ready[i]);
    pthread_cond_destroy(&p->changed);
    pthread_mutex_destroy(&p->mu);
    free(p->ready);
    free(p->image);
    free(p->connect_uri);
    free(p);
}

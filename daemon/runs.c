/* Runs: one al_exec in a thread of its own, its output turned into numbered events held in a
 * bounded replay buffer and served as Server-Sent Events.
 *
 * Exactly once across reconnects: every event has a sequence number (its SSE id); a reader
 * that comes back with Last-Event-ID N gets N+1 onwards. An event leaves the buffer only once
 * it was handed to a reader and room is needed; when the buffer is full of events no reader has
 * had, the output callback waits, al_exec stops reading the channel, the agent runs out of
 * credit and the guest's writer blocks: a slow reader slows the guest, the daemon's memory
 * stays at the bound. The wait ends with the run's time (its timeout and a grace past the
 * library's own): output beyond that is dropped and counted, so that the library's timeout
 * still ends a run whose output nobody reads. */
#include "airlockd.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

struct event {
    struct event *next;
    uint64_t seq;
    uint64_t at_ms; /* when it was made (unix time, ms) */
    bool output;    /* an output event (what a reader's since_ms skips) */
    size_t len;
    char text[]; /* the whole SSE frame: "id: N\nevent: T\ndata: {...}\n\n" */
};

struct ad_run {
    struct ad_run *next; /* in the session's list, newest first */
    char id[16];
    struct ad_session *sess; /* while the thread runs; NULL after ad_runs_free */
    pthread_t thread;
    bool has_thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned refs; /* the session's list, the thread, readers and handlers */
    /* the buffer */
    struct event *head, *tail;
    uint64_t next_seq; /* the next event's number (first is 1) */
    uint64_t max_sent; /* highest number handed to a reader */
    size_t held;       /* bytes of the events held */
    bool done, cancelled, running;
    cJSON *result; /* the exit or error event's data */
    int stdin_wr;
    int cancel[2]; /* the run's own signal pipe (al_exec_opts.cancel_fd): runs of a session run
                      at once, each signalled apart; a chat turn (body) has the session's */
    /* what al_exec runs */
    char **argv, **env;
    char *lang, *cwd;
    char *tag;     /* the caller's name for it (E2B's process tag), or NULL */
    char *context; /* a kernel run's context, or NULL */
    bool kernel;
    bool hidden;        /* the daemon's own (ad_exec_req.hidden) */
    uint32_t guest_pid; /* the program's pid in the guest once it runs (the guest's word), or 0 */
    unsigned pty_rows, pty_cols; /* a terminal's size, 0 for none (its latest, under mu) */
    int resize[2];               /* a pty run's al_pty_resize pipe: [0] is al_exec's resize_fd */
    unsigned timeout_ms;
    uint64_t give_up_ms;      /* ad_now_ms() past which output waits no more for room; 0: never */
    uint64_t dropped;         /* output bytes dropped past give_up_ms */
    unsigned results_dropped; /* results dropped past give_up_ms */
    int stdin_rd;
    uint64_t started; /* unix time */
    /* Sessions that last: the run's request id in the agent (al_exec_opts.request_id);
     * suspended: its session was paused or its daemon stopped, the guest keeps it, a resume or
     * the next start takes it up again (adopt: through al_exec_opts.adopt) */
    uint32_t request_id;
    bool suspended, adopt;
    /* a run of something else than al_exec (a chat turn): its body, which fills the end
     * event's object and returns the event's type */
    const char *(*body)(struct ad_run *r, void *ctx, cJSON *end);
    void *body_ctx;
    int notify_fd; /* ad_run_notify's eventfd, or -1 */
};

static volatile bool shutting_down;
static pthread_mutex_t list_lock = PTHREAD_MUTEX_INITIALIZER;

/* Runs not yet finished per session, and bytes of stdin given in the request itself (it must
 * fit the pipe so that starting a run never blocks). */
#define ACTIVE_RUNS_MAX 16
/* Runs an agent hands over at once (the protocol's AL_ADOPT_MAX). */
#define ADOPTED_MAX 64
#define STDIN_INLINE_MAX 65536
/* Past the run's timeout: longer than the library's own grace (5 s, a kernel's 60 s) */
#define GIVE_UP_GRACE_MS 10000u
#define GIVE_UP_GRACE_KERNEL_MS 65000u

static void strv_free(char **v)
{
    for (size_t i = 0; v && v[i]; i++)
        free(v[i]);
    free(v);
}

static void run_free(struct ad_run *r)
{
    for (struct event *e = r->head, *n; e; e = n) {
        n = e->next;
        free(e);
    }
    strv_free(r->argv);
    strv_free(r->env);
    free(r->lang);
    free(r->cwd);
    free(r->tag);
    free(r->context);
    if (r->stdin_wr >= 0)
        close(r->stdin_wr);
    if (r->stdin_rd >= 0)
        close(r->stdin_rd);
    for (int i = 0; i < 2; i++) {
        if (r->cancel[i] >= 0)
            close(r->cancel[i]);
        if (r->resize[i] >= 0)
            close(r->resize[i]);
    }
    cJSON_Delete(r->result);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

void ad_run_put(struct ad_run *r)
{
    pthread_mutex_lock(&r->mu);
    bool last = --r->refs == 0;
    pthread_mutex_unlock(&r->mu);
    if (last)
        run_free(r);
}

/* ---- the buffer ---- */

/* Appends an event, waiting for room (see the top). -ECANCELED when the run is cancelled,
 * -ETIME (the event dropped) when the run's time is up. With
 * result, the run's last event: the run is done in the same step (taking result), so that no
 * reader sees the end before the run is counted as finished. */
static int push_json(struct ad_run *r, const char *type, const char *json, bool wait, cJSON *result)
{
    size_t cap = strlen(json) + strlen(type) + 64;
    struct event *e = malloc(sizeof(*e) + cap);
    if (!e)
        return -ENOMEM;
    pthread_mutex_lock(&r->mu);
    e->next = NULL;
    e->seq = r->next_seq;
    struct timespec now_ts;
    clock_gettime(CLOCK_REALTIME, &now_ts);
    e->at_ms = (uint64_t)now_ts.tv_sec * 1000u + (uint64_t)now_ts.tv_nsec / 1000000u;
    e->output = !strcmp(type, "output");
    e->len = (size_t)snprintf(e->text, cap, "id: %llu\nevent: %s\ndata: %s\n\n",
                              (unsigned long long)e->seq, type, json);
    for (;;) {
        while (r->head && r->held + e->len > ad_cfg.run_buffer_bytes &&
               r->head->seq <= r->max_sent) {
            struct event *h = r->head;
            r->head = h->next;
            if (!r->head)
                r->tail = NULL;
            r->held -= h->len;
            free(h);
        }
        if (!r->head || r->held + e->len <= ad_cfg.run_buffer_bytes || !wait)
            break;
        if (r->cancelled || shutting_down) {
            pthread_mutex_unlock(&r->mu);
            free(e);
            return -ECANCELED;
        }
        uint64_t now = ad_now_ms();
        if (r->give_up_ms && now >= r->give_up_ms) {
            pthread_mutex_unlock(&r->mu);
            free(e);
            return -ETIME;
        }
        if (!r->give_up_ms) {
            pthread_cond_wait(&r->cv, &r->mu);
            continue;
        }
        uint64_t left = r->give_up_ms - now;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += (time_t)(left / 1000);
        ts.tv_nsec += (long)(left % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&r->cv, &r->mu, &ts);
    }
    if (r->tail)
        r->tail->next = e;
    else
        r->head = e;
    r->tail = e;
    r->held += e->len;
    r->next_seq++;
    if (result) {
        r->result = result;
        r->done = true;
        r->running = false;
    }
    pthread_cond_broadcast(&r->cv);
    ad_eventfd_wake(r->notify_fd);
    pthread_mutex_unlock(&r->mu);
    return 0;
}

void ad_eventfd_wake(int fd)
{
    uint64_t one = 1; /* nonblocking: a count that is full is already a wake-up */
    if (fd >= 0 && write(fd, &one, sizeof(one)) < 0) {
    }
}

void ad_run_notify(struct ad_run *r, int fd)
{
    pthread_mutex_lock(&r->mu);
    r->notify_fd = fd;
    pthread_mutex_unlock(&r->mu);
}

static int push_ex(struct ad_run *r, const char *type, cJSON *data, bool wait, cJSON *result)
{
    char *json = cJSON_PrintUnformatted(data);
    if (!json)
        return -ENOMEM;
    int rc = push_json(r, type, json, wait, result);
    free(json);
    return rc;
}

static int push(struct ad_run *r, const char *type, cJSON *data, bool wait)
{
    return push_ex(r, type, data, wait, NULL);
}

bool ad_run_cancelled(struct ad_run *r)
{
    pthread_mutex_lock(&r->mu);
    bool c = r->cancelled || shutting_down;
    pthread_mutex_unlock(&r->mu);
    return c;
}

int ad_run_push(struct ad_run *r, const char *type, cJSON *data)
{
    return push(r, type, data, true);
}

int ad_run_output(void *ctx, int stream, const uint8_t *data, size_t len)
{
    struct ad_run *r = ctx;
    char *b64 = ad_base64(data, len); /* at most one chunk (AL_DATA_CHUNK_MAX) */
    if (!b64)
        return -ENOMEM;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "stream", stream == 2 ? "stderr" : "stdout");
    cJSON_AddStringToObject(o, "data_b64", b64);
    free(b64);
    int rc = push(r, "output", o, true);
    cJSON_Delete(o);
    if (rc == -ETIME) { /* its time is up: the library's timeout ends it on return */
        pthread_mutex_lock(&r->mu);
        r->dropped += len;
        pthread_mutex_unlock(&r->mu);
        return 0;
    }
    /* Cancelled while waiting for room: the library then sends the guest SIGPIPE and drops the
     * rest of this stream, and the cancel byte already in the pipe ends the run. */
    return rc == -ECANCELED ? -EPIPE : rc;
}

int ad_run_result(void *ctx, const al_result *res)
{
    struct ad_run *r = ctx;
    /* The library checked it (sizes, UTF-8, base64, image kinds) before this call, and its JSON
     * is the same object `airlock exec --json` prints. */
    char *json = al_result_json(res);
    if (!json)
        return -ENOMEM;
    int rc = push_json(r, res->kind == AL_RESULT_REFUSED ? "refused" : "result", json, true, NULL);
    free(json);
    if (rc == -ETIME) { /* as for output: counted, and the library's timeout ends the run */
        pthread_mutex_lock(&r->mu);
        r->results_dropped++;
        pthread_mutex_unlock(&r->mu);
        return 0;
    }
    return rc == -ECANCELED ? 0 : rc; /* cancelled: the cancel byte ends the run */
}

/* Signal bytes the run did not take (it ended first). */
static void drain_cancel(struct ad_run *r)
{
    char buf[64];
    int fd = r->cancel[0] >= 0 ? r->cancel[0] : r->sess->cancel_rd;
    while (read(fd, buf, sizeof(buf)) > 0)
        ;
}

/* Where a signal for the run goes. */
static int cancel_wr(struct ad_run *r)
{
    return r->cancel[1] >= 0 ? r->cancel[1] : r->sess->cancel_wr;
}

static void finish(struct ad_run *r, const char *type, cJSON *o);

/* Other runs of r's session are not finished. */
static bool others_active(struct ad_run *r)
{
    bool any = false;
    pthread_mutex_lock(&list_lock);
    for (struct ad_run *x = r->sess->runs; x && !any; x = x->next) {
        if (x == r)
            continue;
        pthread_mutex_lock(&x->mu);
        any = !x->done;
        pthread_mutex_unlock(&x->mu);
    }
    pthread_mutex_unlock(&list_lock);
    return any;
}

/* The program runs in the guest (al_exec_opts.started): its pid there, for callers that show
 * one (E2B's processes). */
static void run_started(void *ctx, uint32_t pid)
{
    struct ad_run *r = ctx;
    pthread_mutex_lock(&r->mu);
    r->guest_pid = pid;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    ad_session_save(r->sess); /* the store learns the run: a restart adopts it */
}

/* The run's al_exec: the program started, or (adopt) the agent's kept run taken up. */
static int run_exec(struct ad_run *r, al_exec_result *res, al_error *err)
{
    al_exec_opts o = {
        .struct_size = sizeof(al_exec_opts),
        .argv = (const char *const *)r->argv,
        .lang = r->lang,
        .kernel = r->kernel,
        .context = r->context,
        .env = (const char *const *)r->env,
        .cwd = r->cwd,
        .timeout_ms = r->adopt ? 0 : r->timeout_ms, /* the agent keeps the run's own */
        .stdin_fd = r->adopt ? -1 : r->stdin_rd,
        .stdout_fd = -1,
        .stderr_fd = -1,
        .output = ad_run_output,
        .started = run_started,
        .output_ctx = r,
        .result = ad_run_result,
        .result_ctx = r,
        .cancel_fd = r->cancel[0],
        .pty_rows = r->adopt ? 0 : r->pty_rows,
        .pty_cols = r->adopt ? 0 : r->pty_cols,
        .resize_fd = r->adopt ? -1 : r->resize[0],
        .request_id = &r->request_id,
        .adopt = r->adopt ? r->request_id : 0,
    };
    if (r->timeout_ms && !r->adopt)
        r->give_up_ms =
            ad_now_ms() + r->timeout_ms + (r->kernel ? GIVE_UP_GRACE_KERNEL_MS : GIVE_UP_GRACE_MS);
    if (r->adopt) {
        pthread_mutex_lock(&r->mu);
        r->running = !r->cancelled;
        pthread_mutex_unlock(&r->mu);
    }
    return al_exec(r->sess->s, &o, res, err);
}

static void *run_thread(void *arg)
{
    struct ad_run *r = arg;
    struct ad_session *s = r->sess;
    al_error err = {0};
    al_exec_result res = AL_EXEC_RESULT_INIT;
    int rc = 0;
    uint64_t t0 = ad_now_ms();
    ad_metrics_run_start(r->kernel ? AD_RUN_KERNEL : r->lang ? AD_RUN_CODE : AD_RUN_COMMAND);

    cJSON *st = cJSON_CreateObject();
    cJSON_AddStringToObject(st, "run", r->id);
    push(r, r->adopt ? "resumed" : "start", st, false);
    cJSON_Delete(st);

    if (r->adopt) {
        rc = run_exec(r, &res, &err);
        goto ended;
    }
    if (r->body) {
        pthread_mutex_lock(&r->mu);
        r->running = !r->cancelled;
        pthread_mutex_unlock(&r->mu);
        cJSON *o = cJSON_CreateObject();
        const char *type = r->body(r, r->body_ctx, o);
        drain_cancel(r);
        finish(r, type, o);
        return NULL;
    }

    /* A checkpoint needs the session idle (the library refuses one while other runs run: a
     * background server would hold every later run's start for nothing). */
    if (s->policy != AL_CHECKPOINT_NEVER && others_active(r)) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "skipped", "other runs of the session are running");
        push(r, "checkpoint", o, false);
        cJSON_Delete(o);
    } else if (s->policy != AL_CHECKPOINT_NEVER &&
               al_checkpoint_policy_wants(r->lang, r->lang ? r->argv[0] : NULL, s->policy)) {
        al_checkpoint_info ci = AL_CHECKPOINT_INFO_INIT;
        al_error cerr = {0};
        int c = al_checkpoint_create(s->s, NULL, &ci, &cerr);
        cJSON *o = cJSON_CreateObject();
        if (c > 0)
            cJSON_AddNumberToObject(o, "id", ci.id);
        else
            ad_json_add_text(o, "error", cerr.msg);
        push(r, "checkpoint", o, false);
        cJSON_Delete(o);
    }

    pthread_mutex_lock(&r->mu);
    bool cancelled = r->cancelled;
    r->running = !cancelled;
    pthread_mutex_unlock(&r->mu);
    if (cancelled) {
        rc = -ECANCELED;
        err.code = rc;
        snprintf(err.msg, sizeof(err.msg), "cancelled before it started");
    } else {
        rc = run_exec(r, &res, &err);
    }
ended:
    /* Paused, or the daemon stopping with the session kept: the guest keeps the run, and so
     * does the store; a resume or the next start takes it up (ad_runs_resume). */
    if (r->request_id && (rc == -ESTALE || (rc == -ESHUTDOWN && s->detaching))) {
        pthread_mutex_lock(&r->mu);
        r->suspended = true;
        r->running = false;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "run", r->id);
        cJSON_AddStringToObject(
            o, "why", rc == -ESTALE ? "the session was paused" : "the daemon is stopping");
        push(r, "suspended", o, false);
        cJSON_Delete(o);
        ad_metrics_run_end(false, ad_now_ms() - t0);
        ad_session_put(s); /* the run's reference goes back to the list's */
        ad_run_put(r);
        return NULL;
    }
    drain_cancel(r);
    ad_metrics_run_end(rc < 0, ad_now_ms() - t0);

    cJSON *o = cJSON_CreateObject();
    const char *type = "exit";
    /* Killed with its session (E2B's clients see such a stream drop, not end). */
    if (ad_session_ending(s))
        cJSON_AddBoolToObject(o, "session_ended", true);
    if (rc < 0) {
        struct ad_fail f;
        ad_fail_from(&f, rc, &err);
        type = "error";
        cJSON_AddStringToObject(o, "code", rc == -ECANCELED ? "cancelled" : f.code);
        cJSON_AddNumberToObject(o, "status", f.status);
        ad_json_add_text(o, "message", err.code ? err.msg : strerror(-rc));
    } else {
        cJSON_AddStringToObject(o, "how", res.how == AL_EXEC_SIGNALED ? "signaled" : "exited");
        cJSON_AddNumberToObject(o, "value", res.value);
        cJSON_AddNumberToObject(o, "duration_ms", (double)(res.duration_us / 1000));
        cJSON_AddBoolToObject(o, "timed_out", res.timed_out);
        cJSON_AddBoolToObject(o, "interrupted", res.interrupted);
        if (res.offline) /* the session has no network and the output says it wanted some */
            ad_json_add_text(o, "offline",
                             AL_OFFLINE_HINT "; allow hosts in the session's "
                                             "net.allow (pip: " AL_OFFLINE_PIP_HOSTS ")");
        if (r->kernel) {
            if (res.results.have_count)
                cJSON_AddNumberToObject(o, "execution_count", res.results.execution_count);
            cJSON_AddBoolToObject(o, "raised", res.results.error);
            cJSON_AddNumberToObject(o, "results", res.results.results);
            cJSON_AddNumberToObject(o, "refused", res.results.refused);
        }
    }
    finish(r, type, o);
    return NULL;
}

static void finish(struct ad_run *r, const char *type, cJSON *o)
{
    struct ad_session *s = r->sess;
    if (r->dropped) /* output nobody read before the run's time was up */
        cJSON_AddNumberToObject(o, "output_dropped_bytes", (double)r->dropped);
    if (r->results_dropped)
        cJSON_AddNumberToObject(o, "results_dropped", r->results_dropped);
    cJSON_AddStringToObject(o, "run", r->id);
    cJSON *result = cJSON_Duplicate(o, true);
    cJSON_AddStringToObject(result, "type", type);
    if (push_ex(r, type, o, false, result) < 0) { /* out of memory: end it all the same */
        pthread_mutex_lock(&r->mu);
        r->result = result;
        r->done = true;
        r->running = false;
        pthread_mutex_unlock(&r->mu);
    }
    cJSON_Delete(o);
    pthread_mutex_lock(&r->mu);
    if (r->stdin_wr >= 0) {
        close(r->stdin_wr);
        r->stdin_wr = -1;
    }
    pthread_cond_broadcast(&r->cv);
    ad_eventfd_wake(r->notify_fd); /* the end, even where its event could not be made */
    pthread_mutex_unlock(&r->mu);
    ad_session_touch(s);
    if (r->request_id)
        ad_session_save(s); /* no longer in flight in the store */
    ad_session_put(s);
    ad_run_put(r); /* the thread's reference */
}

/* ---- starting ---- */

static char **strv_from_array(cJSON *a, size_t max, const char **why)
{
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) < 1 || (size_t)cJSON_GetArraySize(a) > max) {
        *why = "argv: a non-empty array of strings";
        return NULL;
    }
    size_t n = (size_t)cJSON_GetArraySize(a);
    char **v = calloc(n + 1, sizeof(*v));
    size_t i = 0;
    cJSON *x;
    cJSON_ArrayForEach(x, a)
    {
        if (!cJSON_IsString(x) || !(v[i++] = strdup(x->valuestring))) {
            strv_free(v);
            *why = "argv: a non-empty array of strings";
            return NULL;
        }
    }
    return v;
}

static char **env_from_object(cJSON *o, const char **why)
{
    size_t n = (size_t)cJSON_GetArraySize(o), i = 0;
    if (!cJSON_IsObject(o) || n > 256) {
        *why = "env: an object of at most 256 strings";
        return NULL;
    }
    char **v = calloc(n + 1, sizeof(*v));
    cJSON *x;
    cJSON_ArrayForEach(x, o)
    {
        if (!cJSON_IsString(x) || !x->string[0] || strchr(x->string, '=') ||
            asprintf(&v[i++], "%s=%s", x->string, x->valuestring) < 0) {
            strv_free(v);
            *why = "env: names without '=', string values";
            return NULL;
        }
    }
    return v;
}

int ad_run_start(struct ad_session *s, const struct ad_exec_req *q, const struct ad_limits *lim,
                 cJSON **out, struct ad_fail *f)
{
    const char *why = NULL;
    if (!q->body && ((q->argv && q->code) || !(q->pty_rows || q->argv || q->code))) {
        ad_failf(f, 400, "invalid", "give argv or code, not both (a pty alone: the login shell)");
        return -EINVAL;
    }
    if (q->code && !q->language) {
        ad_failf(f, 400, "invalid", "code needs a language");
        return -EINVAL;
    }
    if (q->kernel && !q->code) {
        ad_failf(f, 400, "invalid", "a kernel run takes code");
        return -EINVAL;
    }
    bool pty = q->pty_rows || q->pty_cols;
    if (pty && (q->kernel || q->body)) {
        ad_failf(f, 400, "invalid", "a kernel run has no terminal");
        return -EINVAL;
    }
    if (pty && (q->pty_rows < 1 || q->pty_rows > AL_PTY_ROWS_COLS_MAX || q->pty_cols < 1 ||
                q->pty_cols > AL_PTY_ROWS_COLS_MAX)) {
        ad_failf(f, 400, "invalid", "pty: rows and cols from 1 to %d", AL_PTY_ROWS_COLS_MAX);
        return -EINVAL;
    }
    if (lim->max_exec_timeout_s && q->timeout_s > lim->max_exec_timeout_s) {
        ad_failf(f, 429, "quota_exceeded", "timeout_s over %u", lim->max_exec_timeout_s);
        f->limit = "max_exec_timeout_s";
        return -EDQUOT;
    }
    if (q->stdin_data && strlen(q->stdin_data) > STDIN_INLINE_MAX) {
        ad_failf(f, 413, "too_large", "stdin over %d bytes: send it to the run's stdin",
                 STDIN_INLINE_MAX);
        return -EFBIG;
    }
    struct ad_run *r = calloc(1, sizeof(*r));
    if (!r) {
        ad_failf(f, 500, "internal", "out of memory");
        return -ENOMEM;
    }
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->stdin_wr = r->stdin_rd = -1;
    r->cancel[0] = r->cancel[1] = -1;
    r->resize[0] = r->resize[1] = -1;
    r->notify_fd = -1;
    r->next_seq = 1;
    r->started = (uint64_t)time(NULL);
    r->body = q->body;
    r->body_ctx = q->body_ctx;
    if (q->body) {
        /* its own */
    } else if (pty && !q->argv && !q->code) {
        const char *login[] = {"/bin/sh", "-c", q->cwd ? AL_LOGIN_SHELL_HERE : AL_LOGIN_SHELL};
        r->argv = calloc(4, sizeof(char *));
        for (size_t i = 0; r->argv && i < 3; i++)
            r->argv[i] = strdup(login[i]);
    } else if (q->argv) {
        r->argv = strv_from_array(q->argv, 4096, &why);
    } else {
        r->argv = calloc(2, sizeof(char *));
        if (r->argv)
            r->argv[0] = strdup(q->code);
        r->lang = strdup(q->language);
    }
    r->kernel = q->kernel;
    r->hidden = q->hidden;
    r->pty_rows = q->pty_rows;
    r->pty_cols = q->pty_cols;
    if (q->env)
        r->env = env_from_object(q->env, &why);
    if (q->cwd)
        r->cwd = strdup(q->cwd);
    if (q->tag)
        r->tag = strdup(q->tag);
    if (q->context)
        r->context = strdup(q->context);
    unsigned t = q->timeout_s ? q->timeout_s : lim->max_exec_timeout_s;
    r->timeout_ms = t > 4000000 ? 4000000000u : t * 1000u;
    if (why || (!r->argv && !q->body) || (q->env && !r->env)) {
        ad_failf(f, 400, "invalid", "%s", why ? why : "bad request");
        run_free(r);
        return -EINVAL;
    }
    if (!q->body && pipe2(r->cancel, O_CLOEXEC | O_NONBLOCK) < 0) {
        ad_failf(f, 500, "internal", "pipe: %s", strerror(errno));
        r->cancel[0] = r->cancel[1] = -1;
        run_free(r);
        return -EIO;
    }
    if (pty && pipe2(r->resize, O_CLOEXEC | O_NONBLOCK) < 0) {
        ad_failf(f, 500, "internal", "pipe: %s", strerror(errno));
        r->resize[0] = r->resize[1] = -1;
        run_free(r);
        return -EIO;
    }
    if (q->stdin_data || q->stdin_open || pty) { /* a terminal's input is its stdin */
        int p[2];
        if (pipe2(p, O_CLOEXEC) < 0) {
            ad_failf(f, 500, "internal", "pipe: %s", strerror(errno));
            run_free(r);
            return -errno;
        }
        r->stdin_rd = p[0];
        r->stdin_wr = p[1];
        size_t n = q->stdin_data ? strlen(q->stdin_data) : 0;
        if (n && write(p[1], q->stdin_data, n) != (ssize_t)n) {
            ad_failf(f, 500, "internal", "cannot queue stdin");
            run_free(r);
            return -EIO;
        }
        if (!q->stdin_open && !pty) {
            close(r->stdin_wr);
            r->stdin_wr = -1;
        } else {
            fcntl(r->stdin_wr, F_SETFL, O_NONBLOCK);
        }
    }

    pthread_mutex_lock(&list_lock);
    unsigned active = 0, kept = 0;
    for (struct ad_run *x = s->runs; x; x = x->next) {
        pthread_mutex_lock(&x->mu);
        active += !x->done;
        pthread_mutex_unlock(&x->mu);
    }
    if (active >= ACTIVE_RUNS_MAX) {
        pthread_mutex_unlock(&list_lock);
        ad_failf(f, 429, "quota_exceeded", "%u runs of this session are not finished", active);
        f->limit = "active_runs";
        run_free(r);
        return -EDQUOT;
    }
    snprintf(r->id, sizeof(r->id), "r%u", ++s->next_run);
    r->sess = s;
    r->refs = 2; /* the list and the thread */
    r->next = s->runs;
    s->runs = r;
    /* Finished runs past runs_kept go (a reader may still hold one). */
    struct ad_run **pp = &s->runs, *drop = NULL;
    while (*pp) {
        struct ad_run *x = *pp;
        pthread_mutex_lock(&x->mu);
        bool done = x->done;
        pthread_mutex_unlock(&x->mu);
        if (done && ++kept > ad_cfg.runs_kept) {
            *pp = x->next;
            x->next = drop;
            drop = x;
            continue;
        }
        pp = &x->next;
    }
    /* the session reference the thread holds */
    struct ad_session *held = ad_session_get(s->owner, s->id);
    if (!held || pthread_create(&r->thread, NULL, run_thread, r)) {
        s->runs = r->next;
        pthread_mutex_unlock(&list_lock);
        if (held)
            ad_session_put(held);
        ad_failf(f, 503, "stopping", "the session is ending");
        run_free(r);
        return -EAGAIN;
    }
    r->has_thread = true;
    pthread_mutex_unlock(&list_lock);
    while (drop) {
        struct ad_run *x = drop;
        drop = x->next;
        if (x->has_thread)
            pthread_join(x->thread, NULL);
        ad_run_put(x);
    }
    *out = ad_run_json(r);
    return 0;
}

/* ---- looking at runs ---- */

bool ad_runs_kernel_busy(struct ad_session *s, const char *lang, const char *context)
{
    bool busy = false;
    pthread_mutex_lock(&list_lock);
    for (struct ad_run *r = s->runs; r && !busy; r = r->next) {
        pthread_mutex_lock(&r->mu);
        busy = !r->done && r->kernel && r->lang && !strcmp(r->lang, lang) &&
               (context ? r->context && !strcmp(r->context, context) : !r->context);
        pthread_mutex_unlock(&r->mu);
    }
    pthread_mutex_unlock(&list_lock);
    return busy;
}

void ad_run_find(struct ad_session *s, const char *tag, uint32_t guest_pid, char *rid, size_t len)
{
    rid[0] = 0;
    pthread_mutex_lock(&list_lock);
    for (struct ad_run *r = s->runs; r && !rid[0]; r = r->next) {
        pthread_mutex_lock(&r->mu);
        if (!r->done && (tag ? r->tag && !strcmp(r->tag, tag) : r->guest_pid == guest_pid))
            snprintf(rid, len, "%s", r->id);
        pthread_mutex_unlock(&r->mu);
    }
    pthread_mutex_unlock(&list_lock);
}

uint32_t ad_run_guest_pid(struct ad_run *r, unsigned wait_ms)
{
    uint64_t end = ad_now_ms() + wait_ms;
    pthread_mutex_lock(&r->mu);
    while (!r->guest_pid && !r->done && ad_now_ms() < end) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 20 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&r->cv, &r->mu, &ts);
    }
    uint32_t pid = r->guest_pid;
    pthread_mutex_unlock(&r->mu);
    return pid;
}

struct ad_run *ad_run_get(struct ad_session *s, const char *rid)
{
    pthread_mutex_lock(&list_lock);
    struct ad_run *r = s->runs;
    while (r && strcmp(r->id, rid))
        r = r->next;
    if (r) {
        pthread_mutex_lock(&r->mu);
        r->refs++;
        pthread_mutex_unlock(&r->mu);
    }
    pthread_mutex_unlock(&list_lock);
    return r;
}

static cJSON *run_json_locked(struct ad_run *r)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", r->id);
    cJSON_AddStringToObject(o, "state",
                            r->done        ? "done"
                            : r->suspended ? "suspended"
                            : r->running   ? "running"
                                           : "queued");
    cJSON_AddNumberToObject(o, "started", (double)r->started);
    cJSON_AddNumberToObject(o, "events", (double)(r->next_seq - 1));
    if (r->argv && !r->lang) {
        cJSON *a = cJSON_AddArrayToObject(o, "argv");
        for (size_t i = 0; r->argv[i]; i++) {
            char *t = al_utf8_repair((const uint8_t *)r->argv[i], strlen(r->argv[i]), NULL);
            cJSON_AddItemToArray(a, cJSON_CreateString(t ? t : ""));
            free(t);
        }
    }
    if (r->cwd)
        ad_json_add_text(o, "cwd", r->cwd);
    if (r->tag)
        ad_json_add_text(o, "tag", r->tag);
    if (r->hidden)
        cJSON_AddBoolToObject(o, "hidden", true);
    if (r->guest_pid)
        cJSON_AddNumberToObject(o, "guest_pid", r->guest_pid);
    if (r->pty_rows) {
        cJSON *p = cJSON_AddObjectToObject(o, "pty");
        cJSON_AddNumberToObject(p, "rows", r->pty_rows);
        cJSON_AddNumberToObject(p, "cols", r->pty_cols);
    }
    if (r->result)
        cJSON_AddItemToObject(o, "result", cJSON_Duplicate(r->result, true));
    return o;
}

cJSON *ad_run_json(struct ad_run *r)
{
    pthread_mutex_lock(&r->mu);
    cJSON *o = run_json_locked(r);
    pthread_mutex_unlock(&r->mu);
    return o;
}

void ad_run_list(struct ad_session *s, cJSON *arr)
{
    pthread_mutex_lock(&list_lock);
    for (struct ad_run *r = s->runs; r; r = r->next)
        cJSON_AddItemToArray(arr, ad_run_json(r));
    pthread_mutex_unlock(&list_lock);
}

bool ad_runs_active(struct ad_session *s)
{
    bool any = false;
    pthread_mutex_lock(&list_lock);
    for (struct ad_run *r = s->runs; r; r = r->next) {
        pthread_mutex_lock(&r->mu);
        any |= !r->done;
        pthread_mutex_unlock(&r->mu);
    }
    pthread_mutex_unlock(&list_lock);
    return any;
}

cJSON *ad_run_wait(struct ad_run *r, unsigned timeout_ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += timeout_ms / 1000;
    ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&r->mu);
    /* In slices of a second, so that shutdown (which signals no run) is seen soon. */
    while (!r->done && !shutting_down) {
        struct timespec now, slice;
        clock_gettime(CLOCK_REALTIME, &now);
        slice = now;
        slice.tv_sec += 1;
        if (slice.tv_sec > ts.tv_sec || (slice.tv_sec == ts.tv_sec && slice.tv_nsec > ts.tv_nsec))
            slice = ts;
        if (now.tv_sec > ts.tv_sec || (now.tv_sec == ts.tv_sec && now.tv_nsec >= ts.tv_nsec))
            break;
        pthread_cond_timedwait(&r->cv, &r->mu, &slice);
    }
    cJSON *o = run_json_locked(r);
    pthread_mutex_unlock(&r->mu);
    return o;
}

/* ---- acting on runs ---- */

/* How long a stdin write may wait for the guest to read (the pipe is full). */
#define STDIN_WAIT_MS 30000

int ad_run_stdin(struct ad_run *r, const void *data, size_t len, bool eof, struct ad_fail *f)
{
    pthread_mutex_lock(&r->mu);
    int fd = r->stdin_wr >= 0 ? dup(r->stdin_wr) : -1;
    bool done = r->done;
    pthread_mutex_unlock(&r->mu);
    if (fd < 0) {
        ad_failf(f, 409, "stdin_closed",
                 done ? "the run has ended" : "the run's stdin is not open (stdin_open)");
        return -EPIPE;
    }
    const char *p = data;
    uint64_t deadline = ad_now_ms() + STDIN_WAIT_MS;
    int rc = 0;
    while (len) {
        ssize_t n = write(fd, p, len);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EAGAIN) {
            uint64_t now = ad_now_ms();
            struct pollfd pfd = {fd, POLLOUT, 0};
            if (now >= deadline) {
                ad_failf(f, 504, "timeout", "the guest did not read its stdin for %d s",
                         STDIN_WAIT_MS / 1000);
                rc = -ETIMEDOUT;
                break;
            }
            poll(&pfd, 1, (int)(deadline - now));
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        ad_failf(f, 409, "stdin_closed", "the run's stdin is closed");
        rc = -EPIPE;
        break;
    }
    close(fd);
    if (rc == 0 && eof) {
        pthread_mutex_lock(&r->mu);
        if (r->stdin_wr >= 0) {
            close(r->stdin_wr);
            r->stdin_wr = -1;
        }
        pthread_mutex_unlock(&r->mu);
    }
    return rc;
}

int ad_run_signal(struct ad_run *r, int signo, struct ad_fail *f)
{
    pthread_mutex_lock(&r->mu);
    bool running = r->running && !r->done;
    if (running && signo != SIGINT && signo != SIGQUIT) {
        /* The library kills the run on any other byte; if its output callback waits for room,
         * this lets it go. */
        r->cancelled = true;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    if (!running) {
        ad_failf(f, 409, "not_running", "the run is not running");
        return -ESRCH;
    }
    uint8_t b = (uint8_t)signo;
    if (write(cancel_wr(r), &b, 1) != 1) {
        ad_failf(f, 503, "busy", "signals are queued already");
        return -EAGAIN;
    }
    return 0;
}

int ad_run_resize(struct ad_run *r, unsigned rows, unsigned cols, struct ad_fail *f)
{
    if (rows < 1 || rows > AL_PTY_ROWS_COLS_MAX || cols < 1 || cols > AL_PTY_ROWS_COLS_MAX) {
        ad_failf(f, 400, "invalid", "rows and cols from 1 to %d", AL_PTY_ROWS_COLS_MAX);
        return -EINVAL;
    }
    pthread_mutex_lock(&r->mu);
    int rc = 0;
    if (!r->pty_rows) {
        ad_failf(f, 409, "no_pty", "the run has no terminal (start it with pty)");
        rc = -ENOTTY;
    } else if (r->done) {
        ad_failf(f, 409, "not_running", "the run has ended");
        rc = -ESRCH;
    } else if ((rc = al_pty_resize(r->resize[1], rows, cols)) < 0) {
        /* the pipe is full of sizes the run has not taken yet */
        ad_failf(f, 503, "busy", "resizes are queued already");
    } else {
        r->pty_rows = rows;
        r->pty_cols = cols;
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

void ad_runs_cancel(struct ad_session *s)
{
    pthread_mutex_lock(&list_lock);
    for (struct ad_run *r = s->runs; r; r = r->next) {
        pthread_mutex_lock(&r->mu);
        if (!r->done && r->suspended) {
            /* no thread to end it: it ends here, and its readers with it */
            r->cancelled = true;
            r->done = true;
            r->result = cJSON_CreateObject();
            cJSON_AddStringToObject(r->result, "type", "error");
            cJSON_AddStringToObject(r->result, "code", "cancelled");
            cJSON_AddStringToObject(r->result, "message",
                                    "the session ended while the run was "
                                    "suspended");
            cJSON_AddStringToObject(r->result, "run", r->id);
        } else if (!r->done) {
            r->cancelled = true;
            uint8_t b = SIGKILL;
            if (r->running && write(cancel_wr(r), &b, 1) < 0) {
                /* full of bytes already: the run ends on those */
            }
        }
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
    }
    pthread_mutex_unlock(&list_lock);
}

void ad_runs_free(struct ad_session *s)
{
    pthread_mutex_lock(&list_lock);
    struct ad_run *r = s->runs;
    s->runs = NULL;
    pthread_mutex_unlock(&list_lock);
    while (r) {
        struct ad_run *n = r->next;
        if (r->has_thread)
            pthread_join(r->thread, NULL);
        pthread_mutex_lock(&r->mu);
        r->sess = NULL;
        pthread_mutex_unlock(&r->mu);
        ad_run_put(r);
        r = n;
    }
}

void ad_runs_shutdown(void)
{
    shutting_down = true;
}

/* ---- the event stream ---- */

struct reader {
    struct ad_run *r;
    uint64_t next;    /* the next event number to send */
    size_t off;       /* bytes of it already sent */
    uint64_t beat;    /* when the next heartbeat is due */
    uint64_t beat_ms; /* heartbeats this far apart */
    /* another framing than SSE (ad_run_stream): the frame being sent, made by fmt */
    ad_run_fmt fmt;
    void *fmt_ctx;
    void (*fmt_free)(void *ctx);
    char *frame;
    size_t frame_len;
    bool ended;   /* fmt's last frame was made */
    bool aborted; /* fmt dropped the stream (AD_RUN_FMT_ABORT) */
    /* an SSE reader's choices (ad_run_events): with held_only, the stream ends after event
     * stop_at (what was held when it was asked for); output events made before since_ms are
     * skipped */
    bool held_only;
    uint64_t stop_at, since_ms;
};

/* The next bytes of rd's own frame, or 0 when it has none left. */
static size_t frame_take(struct reader *rd, char *buf, size_t max)
{
    if (!rd->frame)
        return 0;
    size_t n = rd->frame_len - rd->off < max ? rd->frame_len - rd->off : max;
    memcpy(buf, rd->frame + rd->off, n);
    rd->off += n;
    if (rd->off == rd->frame_len) {
        free(rd->frame);
        rd->frame = NULL;
        rd->off = 0;
    }
    return n;
}

/* An event's type and its data's JSON (*json, *jlen) out of its SSE frame
 * "id: N\nevent: T\ndata: J\n\n". */
static void event_parts(const struct event *e, char type[32], const char **json, size_t *jlen)
{
    type[0] = 0;
    const char *t = strstr(e->text, "\nevent: "), *d = strstr(e->text, "\ndata: ");
    if (t && d && d > t + 8 && (size_t)(d - t - 8) < 32) {
        memcpy(type, t + 8, (size_t)(d - t - 8));
        type[d - t - 8] = 0;
    }
    *jlen = d ? e->len - (size_t)(d + 7 - e->text) - 2 : 0;
    *json = d ? d + 7 : "null";
}

/* An event through fmt into rd's frame. */
static void frame_make(struct reader *rd, const struct event *e)
{
    char type[32];
    const char *json;
    size_t jlen;
    event_parts(e, type, &json, &jlen);
    bool last = false;
    rd->frame = rd->fmt(rd->fmt_ctx, type, json, jlen, &rd->frame_len, &last);
    rd->off = 0;
    if (last)
        rd->ended = true;
    if (!rd->frame && rd->frame_len == AD_RUN_FMT_ABORT)
        rd->aborted = true;
}

uint64_t ad_run_read(struct ad_run *r, uint64_t last_id, ad_run_read_fn fn, void *ctx, bool *done)
{
    pthread_mutex_lock(&r->mu);
    for (struct event *e = r->head; e; e = e->next) {
        if (e->seq <= last_id)
            continue;
        char type[32];
        const char *json;
        size_t jlen;
        event_parts(e, type, &json, &jlen);
        fn(ctx, type, json, jlen);
        last_id = e->seq;
        if (e->seq > r->max_sent) {
            r->max_sent = e->seq;
            pthread_cond_broadcast(&r->cv);
        }
    }
    if (done)
        *done = r->done;
    pthread_mutex_unlock(&r->mu);
    return last_id;
}

static ssize_t read_events(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    struct reader *rd = cls;
    struct ad_run *r = rd->r;
    size_t own = frame_take(rd, buf, max);
    if (own)
        return (ssize_t)own;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        if (rd->aborted) {
            pthread_mutex_unlock(&r->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (shutting_down || rd->ended) {
            pthread_mutex_unlock(&r->mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        struct event *e = r->head;
        while (e && e->seq < rd->next)
            e = e->next;
        if (e && e->seq != rd->next) { /* dropped while another reader had it */
            pthread_mutex_unlock(&r->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (rd->held_only && rd->next > rd->stop_at && !rd->off) { /* what was held is sent */
            pthread_mutex_unlock(&r->mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        if (e && !rd->off && e->output && e->at_ms < rd->since_ms) {
            rd->next++;
            continue;
        }
        if (e && rd->fmt) {
            rd->next++;
            if (e->seq > r->max_sent) {
                r->max_sent = e->seq;
                pthread_cond_broadcast(&r->cv);
            }
            frame_make(rd, e);
            pthread_mutex_unlock(&r->mu);
            rd->beat = ad_now_ms() + rd->beat_ms;
            own = frame_take(rd, buf, max);
            if (own)
                return (ssize_t)own;
            pthread_mutex_lock(&r->mu);
            continue; /* an event fmt skips */
        }
        if (e) {
            size_t n = e->len - rd->off < max ? e->len - rd->off : max;
            memcpy(buf, e->text + rd->off, n);
            rd->off += n;
            if (rd->off == e->len) {
                rd->off = 0;
                rd->next++;
                if (e->seq > r->max_sent) {
                    r->max_sent = e->seq;
                    pthread_cond_broadcast(&r->cv);
                }
            }
            pthread_mutex_unlock(&r->mu);
            rd->beat = ad_now_ms() + rd->beat_ms;
            return (ssize_t)n;
        }
        if (r->done) {
            pthread_mutex_unlock(&r->mu);
            if (rd->fmt) { /* the framing's own end */
                rd->ended = true;
                bool last = true;
                rd->frame = rd->fmt(rd->fmt_ctx, "", NULL, 0, &rd->frame_len, &last);
                own = frame_take(rd, buf, max);
                if (own)
                    return (ssize_t)own;
            }
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        uint64_t now = ad_now_ms();
        if (now >= rd->beat) {
            pthread_mutex_unlock(&r->mu);
            rd->beat = now + rd->beat_ms;
            if (rd->fmt) {
                bool last = false;
                rd->frame = rd->fmt(rd->fmt_ctx, "heartbeat", NULL, 0, &rd->frame_len, &last);
                rd->ended = last;
                own = frame_take(rd, buf, max);
                if (own)
                    return (ssize_t)own;
                pthread_mutex_lock(&r->mu);
                continue;
            }
            static const char hb[] = ": heartbeat\n\n";
            size_t n = sizeof(hb) - 1 < max ? sizeof(hb) - 1 : max;
            memcpy(buf, hb, n);
            return (ssize_t)n;
        }
        /* Wake at the heartbeat at the latest; shutdown is seen within a second. */
        uint64_t wait = rd->beat - now < 1000 ? rd->beat - now : 1000;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)wait * 1000000L;
        while (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&r->cv, &r->mu, &ts);
    }
}

static void free_reader(void *cls)
{
    struct reader *rd = cls;
    ad_run_put(rd->r);
    if (rd->fmt_free)
        rd->fmt_free(rd->fmt_ctx);
    free(rd->frame);
    free(rd);
}

static struct MHD_Response *stream_open(struct ad_run *r, uint64_t last_id, ad_run_fmt fmt,
                                        void *ctx, void (*ctx_free)(void *ctx), unsigned beat_ms,
                                        struct reader **made, struct ad_fail *f);

struct MHD_Response *ad_run_events(struct ad_run *r, uint64_t last_id, bool follow,
                                   uint64_t since_ms, struct ad_fail *f)
{
    struct reader *rd;
    struct MHD_Response *resp = stream_open(r, last_id, NULL, NULL, NULL, 0, &rd, f);
    if (resp) { /* not read before the response is queued */
        pthread_mutex_lock(&r->mu);
        rd->held_only = !follow;
        rd->stop_at = r->next_seq - 1;
        rd->since_ms = since_ms;
        pthread_mutex_unlock(&r->mu);
    }
    return resp;
}

struct MHD_Response *ad_run_stream(struct ad_run *r, uint64_t last_id, ad_run_fmt fmt, void *ctx,
                                   void (*ctx_free)(void *ctx), unsigned beat_ms, struct ad_fail *f)
{
    struct reader *rd;
    return stream_open(r, last_id, fmt, ctx, ctx_free, beat_ms, &rd, f);
}

static struct MHD_Response *stream_open(struct ad_run *r, uint64_t last_id, ad_run_fmt fmt,
                                        void *ctx, void (*ctx_free)(void *ctx), unsigned beat_ms,
                                        struct reader **made, struct ad_fail *f)
{
    pthread_mutex_lock(&r->mu);
    uint64_t oldest = r->head ? r->head->seq : r->next_seq;
    bool gone = last_id + 1 < oldest;
    if (!gone)
        r->refs++;
    pthread_mutex_unlock(&r->mu);
    if (gone) {
        if (ctx_free)
            ctx_free(ctx);
        ad_failf(f, 410, "events_dropped",
                 "events after %llu are no longer held (the oldest is %llu)",
                 (unsigned long long)last_id, (unsigned long long)oldest);
        return NULL;
    }
    struct reader *rd = calloc(1, sizeof(*rd));
    if (!rd) {
        ad_run_put(r);
        if (ctx_free)
            ctx_free(ctx);
        ad_failf(f, 500, "internal", "out of memory");
        return NULL;
    }
    rd->r = r;
    rd->fmt = fmt;
    rd->fmt_ctx = ctx;
    rd->fmt_free = ctx_free;
    rd->next = last_id + 1;
    rd->beat_ms = beat_ms ? beat_ms : ad_cfg.heartbeat_s * 1000ull;
    rd->beat = ad_now_ms() + rd->beat_ms;
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, read_events, rd, free_reader);
    if (!resp) {
        free_reader(rd);
        ad_failf(f, 500, "internal", "out of memory");
        return NULL;
    }
    if (!fmt) {
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
    }
    *made = rd;
    return resp;
}

/* ---- sessions that last ---- */

cJSON *ad_runs_record(struct ad_session *s)
{
    cJSON *a = cJSON_CreateArray();
    pthread_mutex_lock(&list_lock);
    for (struct ad_run *r = s->runs; r; r = r->next) {
        pthread_mutex_lock(&r->mu);
        if (!r->done && r->request_id && !r->body) {
            cJSON *o = run_json_locked(r);
            cJSON_DeleteItemFromObjectCaseSensitive(o, "state");
            cJSON_DeleteItemFromObjectCaseSensitive(o, "events");
            cJSON_AddNumberToObject(o, "request", r->request_id);
            cJSON_AddBoolToObject(o, "kernel", r->kernel);
            if (r->lang)
                cJSON_AddStringToObject(o, "lang", r->lang);
            if (r->context)
                cJSON_AddStringToObject(o, "context", r->context);
            cJSON_AddItemToArray(a, o);
        }
        pthread_mutex_unlock(&r->mu);
    }
    pthread_mutex_unlock(&list_lock);
    return a;
}

static bool adopted(struct ad_session *s, uint32_t id)
{
    uint32_t ids[ADOPTED_MAX];
    size_t n = s->s ? al_session_adopted(s->s, ids, ADOPTED_MAX) : 0;
    for (size_t i = 0; i < n && i < ADOPTED_MAX; i++)
        if (ids[i] == id)
            return true;
    return false;
}

/* Takes a suspended run up again on a thread of its own, or ends it with why. Called with
 * list_lock held. */
static void resume_one(struct ad_session *s, struct ad_run *r, const char *why)
{
    if (r->has_thread) {
        pthread_join(r->thread, NULL); /* the thread that suspended it has returned */
        r->has_thread = false;
    }
    struct ad_session *held = adopted(s, r->request_id) ? ad_session_get(s->owner, s->id) : NULL;
    pthread_mutex_lock(&r->mu);
    r->suspended = false;
    r->adopt = true;
    r->refs++; /* the thread's */
    pthread_mutex_unlock(&r->mu);
    if (held && pthread_create(&r->thread, NULL, run_thread, r) == 0) {
        r->has_thread = true;
        return;
    }
    if (held)
        ad_session_put(held);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "code", "lost");
    cJSON_AddNumberToObject(o, "status", 410);
    ad_json_add_text(o, "message", why);
    cJSON_AddStringToObject(o, "run", r->id);
    cJSON *result = cJSON_Duplicate(o, true);
    cJSON_AddStringToObject(result, "type", "error");
    if (push_ex(r, "error", o, false, result) < 0) {
        pthread_mutex_lock(&r->mu);
        r->result = result;
        r->done = true;
        pthread_mutex_unlock(&r->mu);
    }
    cJSON_Delete(o);
    pthread_mutex_lock(&r->mu);
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    ad_run_put(r);
}

/* A run of the store's record, made again after a restart: what it ran (for its JSON), its
 * request, suspended; its events before the restart are gone (the buffer was memory). */
static struct ad_run *run_from_record(const cJSON *o)
{
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(o, "id");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(o, "request");
    if (!cJSON_IsString(id) || strlen(id->valuestring) >= 16 || !cJSON_IsNumber(req) ||
        req->valuedouble < 1 || req->valuedouble > 0x7fffffff)
        return NULL;
    struct ad_run *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->stdin_wr = r->stdin_rd = -1;
    r->cancel[0] = r->cancel[1] = -1;
    r->resize[0] = r->resize[1] = -1;
    r->notify_fd = -1;
    r->next_seq = 1;
    snprintf(r->id, sizeof(r->id), "%s", id->valuestring);
    r->request_id = (uint32_t)req->valuedouble;
    r->suspended = true;
    r->started = (uint64_t)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, "started"));
    r->kernel = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "kernel"));
    r->hidden = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "hidden"));
    const char *lang = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "lang"));
    const char *ctx = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "context"));
    const char *tag = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "tag"));
    const char *cwd = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "cwd"));
    r->lang = lang ? strdup(lang) : NULL;
    r->context = ctx ? strdup(ctx) : NULL;
    r->tag = tag ? strdup(tag) : NULL;
    r->cwd = cwd ? strdup(cwd) : NULL;
    const cJSON *argv = cJSON_GetObjectItemCaseSensitive(o, "argv");
    const char *why = NULL;
    r->argv = cJSON_IsArray(argv) && cJSON_GetArraySize(argv) > 0
                  ? strv_from_array((cJSON *)argv, 4096, &why)
                  : calloc(2, sizeof(char *));
    if (r->argv && !r->argv[0])
        r->argv[0] = strdup(lang ? "(code)" : "(run)");
    if (!r->argv || pipe2(r->cancel, O_CLOEXEC | O_NONBLOCK) < 0) {
        r->cancel[0] = r->cancel[1] = -1;
        run_free(r);
        return NULL;
    }
    return r;
}

/* Each run of the records made again in s, suspended, with why as its first event; with
 * only_adopted, a run the agent did not hand over is left out rather than made and lost. Called
 * with list_lock held. */
static void runs_take(struct ad_session *s, const cJSON *runs, const char *why, bool only_adopted)
{
    const cJSON *o;
    cJSON_ArrayForEach(o, runs)
    {
        struct ad_run *r = run_from_record(o);
        if (!r)
            continue;
        if (only_adopted && !adopted(s, r->request_id)) {
            run_free(r);
            continue;
        }
        unsigned n = 0;
        if (sscanf(r->id, "r%u", &n) == 1 && n > s->next_run)
            s->next_run = n;
        r->sess = s;
        r->refs = 1; /* the list's */
        r->next = s->runs;
        s->runs = r;
        cJSON *st = cJSON_CreateObject();
        cJSON_AddStringToObject(st, "run", r->id);
        cJSON_AddStringToObject(st, "why", why);
        push(r, "suspended", st, false);
        cJSON_Delete(st);
    }
}

/* Takes up every suspended run of s (resume_one), why being said of one the guest no longer has.
 * Called with list_lock held. */
static void resume_suspended(struct ad_session *s, const char *why)
{
    for (struct ad_run *r = s->runs; r; r = r->next) {
        pthread_mutex_lock(&r->mu);
        bool suspended = r->suspended && !r->done;
        pthread_mutex_unlock(&r->mu);
        if (suspended)
            resume_one(s, r, why);
    }
}

void ad_runs_resume(struct ad_session *s, const cJSON *runs)
{
    pthread_mutex_lock(&list_lock);
    runs_take(s, runs, "the daemon restarted: the events before are gone", false);
    /* A session still paused keeps its runs suspended until its resume; one not taken back
     * (no VM) keeps them as the record had them. */
    if (s->s && !s->paused)
        resume_suspended(s, "the guest no longer had this run when the session came back");
    pthread_mutex_unlock(&list_lock);
}

void ad_runs_inherit(struct ad_session *fork, const cJSON *runs, const char *source)
{
    char why[128];
    snprintf(why, sizeof(why), "forked from %s: the events before the fork are the source's",
             source);
    pthread_mutex_lock(&list_lock);
    runs_take(fork, runs, why, true);
    resume_suspended(fork, "the fork's guest no longer had this run");
    pthread_mutex_unlock(&list_lock);
}

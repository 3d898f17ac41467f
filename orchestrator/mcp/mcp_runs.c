/* The MCP server's sessions and runs: a table of sessions by unguessable handle, refcounted so
 * that a session closes only when no call and no run uses it; in each, its runs and background
 * processes, each on a thread of its own with its own signal pipe, their output kept bounded
 * (head and ring, struct mcp_buf) and their kernel results summarised. */
#include "mcpint.h"

#include "util.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define STOP_WAIT_MS 30000 /* stop_session waits this long for its users to let go */

/* ---- bounded output ---- */

void mcp_buf_append(struct mcp_buf *b, const uint8_t *p, size_t n)
{
    if (b->headlen < MCP_HEAD) {
        size_t k = MCP_HEAD - b->headlen < n ? MCP_HEAD - b->headlen : n;
        memcpy(b->head + b->headlen, p, k);
        b->headlen += k;
    }
    if (b->total + n > MCP_HEAD && !b->ring && !(b->ring = malloc(MCP_RING))) {
        b->total += n; /* counted, not kept: the reader says so */
        return;
    }
    if (b->ring) {
        const uint8_t *q = p;
        size_t m = n;
        uint64_t at = b->total;
        if (m > MCP_RING) {
            q += m - MCP_RING;
            at += m - MCP_RING;
            m = MCP_RING;
        }
        while (m) {
            size_t off = at % MCP_RING, k = MCP_RING - off < m ? MCP_RING - off : m;
            memcpy(b->ring + off, q, k);
            q += k, at += k, m -= k;
        }
    }
    b->total += n;
}

/* The oldest offset the ring holds (the head holds [0, headlen) on its own). */
static uint64_t ring_low(const struct mcp_buf *b)
{
    if (!b->ring)
        return b->headlen;
    return b->total > MCP_RING ? b->total - MCP_RING : 0;
}

/* Copies [from, from+n), all held, to dst. */
static void buf_copy(const struct mcp_buf *b, uint64_t from, size_t n, char *dst)
{
    while (n && from < b->headlen) {
        *dst++ = b->head[from++];
        n--;
    }
    while (n) {
        size_t off = from % MCP_RING, k = MCP_RING - off < n ? MCP_RING - off : n;
        memcpy(dst, b->ring + off, k);
        dst += k, from += k, n -= k;
    }
}

/* How many of the n bytes at p end before an unfinished UTF-8 sequence at its end. */
static size_t utf8_whole(const char *p, size_t n)
{
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char c = (unsigned char)p[n - back];
        if ((c & 0xC0) == 0x80)
            continue;
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > back ? n - back : n;
    }
    return n;
}

char *mcp_buf_read(const struct mcp_buf *b, uint64_t from, size_t max, uint64_t *next,
                   uint64_t *skipped)
{
    *skipped = 0;
    if (from > b->total)
        from = b->total;
    uint64_t lo = ring_low(b);
    size_t n;
    if (from < b->headlen) {
        n = b->headlen - from < max ? b->headlen - from : max;
    } else {
        if (from < lo) {
            *skipped = lo - from;
            from = lo;
        }
        if (!b->ring) {
            *skipped += b->total - from;
            from = b->total;
        }
        n = b->total - from < max ? (size_t)(b->total - from) : max;
    }
    char *raw = malloc(n + 1);
    if (!raw)
        return NULL;
    buf_copy(b, from, n, raw);
    /* A character the guest is still writing waits for its last bytes, at the live end. */
    if (from + n == b->total && utf8_whole(raw, n))
        n = utf8_whole(raw, n);
    *next = from + n;
    char *s = al_utf8_repair((const uint8_t *)raw, n, NULL);
    free(raw);
    return s;
}

char *mcp_buf_summary(const struct mcp_buf *b, size_t keep, bool *cut)
{
    *cut = false;
    uint64_t total = b->total, lo = ring_low(b);
    if (total <= 2 * (uint64_t)keep && (total <= b->headlen || lo <= b->headlen)) {
        char *raw = malloc(total + 1);
        if (!raw)
            return NULL;
        buf_copy(b, 0, total, raw);
        char *s = al_utf8_repair((const uint8_t *)raw, total, NULL);
        free(raw);
        return s;
    }
    *cut = true;
    size_t h = keep < b->headlen ? keep : b->headlen;
    uint64_t tail_from = total - keep;
    if (tail_from < lo)
        tail_from = lo;
    if (tail_from < h)
        tail_from = h;
    size_t t = total - tail_from;
    char mark[96];
    int ml = snprintf(mark, sizeof(mark), "\n[... %llu bytes cut ...]\n",
                      (unsigned long long)(tail_from - h));
    char *raw = malloc(h + (size_t)ml + t + 1);
    if (!raw)
        return NULL;
    buf_copy(b, 0, h, raw);
    memcpy(raw + h, mark, (size_t)ml);
    buf_copy(b, tail_from, t, raw + h + ml);
    char *s = al_utf8_repair((const uint8_t *)raw, h + (size_t)ml + t, NULL);
    free(raw);
    return s;
}

/* ---- runs ---- */

static void run_free(struct mcp_run *r)
{
    free(r->label);
    free(r->lang);
    free(r->code);
    free(r->context);
    free(r->cwd);
    al_strv_free(r->argv);
    al_strv_free(r->env);
    for (int i = 0; i < 2; i++)
        free(r->out[i].ring);
    for (unsigned i = 0; i < r->nimg; i++)
        free(r->img[i].data);
    cJSON_Delete(r->results);
    if (r->cancel[0] >= 0)
        close(r->cancel[0]);
    if (r->cancel[1] >= 0)
        close(r->cancel[1]);
    free(r);
}

void mcp_run_signal(struct mcp_run *r, int sig)
{
    if (r->done)
        return;
    unsigned char b = (unsigned char)sig;
    if (write(r->cancel[1], &b, 1) < 0) {
    }
    if (sig != SIGINT && sig != SIGQUIT)
        r->killed = true;
}

static int on_output(void *ctx, int stream, const uint8_t *data, size_t len)
{
    struct mcp_run *r = ctx;
    if (stream != 1 && stream != 2)
        return 0;
    pthread_mutex_lock(&r->m->mu);
    mcp_buf_append(&r->out[stream - 1], data, len);
    pthread_cond_broadcast(&r->m->cv);
    pthread_mutex_unlock(&r->m->mu);
    return 0;
}

/* At most max bytes of s, cut at a character's start. */
static cJSON *cut_string(const char *s, size_t max, bool *was_cut)
{
    size_t n = strlen(s);
    if (n <= max)
        return cJSON_CreateString(s);
    *was_cut = true;
    while (max && ((unsigned char)s[max] & 0xC0) == 0x80)
        max--;
    char *t = strndup(s, max);
    cJSON *j = t ? cJSON_CreateString(t) : NULL;
    free(t);
    return j;
}

static const char *const kind_names[] = {"value", "display", "error", "refused"};

/* One result as the client sees it: its kind and MIME types, its text forms (each cut to
 * MCP_TEXT_KEEP), an error's name, value and traceback; images are kept apart. */
static cJSON *result_summary(const al_result *res)
{
    cJSON *j = cJSON_CreateObject();
    if (!j)
        return NULL;
    bool cut = false;
    cJSON_AddStringToObject(j, "kind",
                            res->kind >= 0 && res->kind <= 3 ? kind_names[res->kind] : "refused");
    if (res->kind == AL_RESULT_ERROR) {
        cJSON_AddItemToObject(j, "name", cut_string(res->name ? res->name : "", 256, &cut));
        cJSON_AddItemToObject(j, "value",
                              cut_string(res->value ? res->value : "", MCP_TEXT_KEEP, &cut));
        cJSON_AddItemToObject(
            j, "traceback",
            cut_string(res->traceback ? res->traceback : "", 2 * MCP_TEXT_KEEP, &cut));
    } else if (res->kind == AL_RESULT_REFUSED) {
        cJSON_AddStringToObject(j, "why", res->why ? res->why : "refused");
    } else {
        if (res->execution_count)
            cJSON_AddNumberToObject(j, "execution_count", res->execution_count);
        cJSON *types = cJSON_AddArrayToObject(j, "mime_types");
        cJSON *data = cJSON_AddObjectToObject(j, "data");
        for (size_t i = 0; i < res->nmime; i++) {
            const al_mime *mm = &res->mime[i];
            cJSON_AddItemToArray(types, cJSON_CreateString(mm->type));
            if (!strncmp(mm->type, "image/", 6) && strcmp(mm->type, "image/svg+xml"))
                continue;
            if (!strcmp(mm->type, "application/json")) {
                if (mm->len <= MCP_TEXT_KEEP) {
                    cJSON *v = cJSON_ParseWithLength((const char *)mm->data, mm->len);
                    if (v)
                        cJSON_AddItemToObject(data, mm->type, v);
                } else {
                    cut = true;
                }
                continue;
            }
            cJSON_AddItemToObject(data, mm->type,
                                  cut_string((const char *)mm->data, MCP_TEXT_KEEP, &cut));
        }
        if (res->width)
            cJSON_AddNumberToObject(j, "width", res->width),
                cJSON_AddNumberToObject(j, "height", res->height);
    }
    cJSON_AddBoolToObject(j, "truncated", cut);
    return j;
}

static int on_result(void *ctx, const al_result *res)
{
    struct mcp_run *r = ctx;
    const al_mime *png = al_result_mime(res, "image/png");
    pthread_mutex_lock(&r->m->mu);
    if (cJSON_GetArraySize(r->results) < MCP_RESULTS_MAX) {
        cJSON *sum = result_summary(res);
        if (sum)
            cJSON_AddItemToArray(r->results, sum);
    } else {
        r->nresults_dropped++;
    }
    if (png && r->nimg < MCP_IMAGES_MAX) {
        uint8_t *copy = malloc(png->len);
        if (copy) {
            memcpy(copy, png->data, png->len);
            r->img[r->nimg].data = copy;
            r->img[r->nimg].len = png->len;
            r->nimg++;
        }
    } else if (png) {
        r->nimg_dropped++;
    }
    pthread_cond_broadcast(&r->m->cv);
    pthread_mutex_unlock(&r->m->mu);
    return 0;
}

/* ---- kernel runs in the order their calls came ----
 *
 * The library runs a kernel's requests in the order they reach it; the calls' threads would
 * reach it in any order. So a kernel run takes its place in the kernel's line only once every
 * run_code call read before it, to the same session and context, took its own (or ended). */

static const char *arg_of(const cJSON *args, const char *name, const char *dflt)
{
    const char *v = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(args, name));
    return v && *v ? v : dflt;
}

/* Under the lock: whether call c runs code in r's session and kernel context. */
static bool same_line(const struct mcp_call *c, const struct mcp_run *r)
{
    if (strcmp(c->method, "tools/call") || strcmp(arg_of(c->params, "name", ""), "run_code") != 0)
        return false;
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(c->params, "arguments");
    return !strcmp(arg_of(a, "session", ""), r->sess->id) &&
           !strcmp(arg_of(a, "language", "python"), r->lang ? r->lang : "python") &&
           !strcmp(arg_of(a, "context", ""), r->context ? r->context : "");
}

static void mark_entered(al_mcp *m, uint64_t arrival)
{
    for (struct mcp_call *c = m->calls; c; c = c->next)
        if (c->arrival == arrival)
            c->entered = true;
    pthread_cond_broadcast(&m->cv);
}

/* Waits (the lock held) until no earlier call of r's line is still to take its place; false
 * when r is cancelled meanwhile (it never runs). */
static bool wait_for_earlier(al_mcp *m, struct mcp_run *r)
{
    for (;;) {
        bool earlier = false;
        for (struct mcp_call *c = m->calls; c && !earlier && !m->closing; c = c->next)
            earlier = c->arrival < r->arrival && !c->entered && same_line(c, r);
        if (!earlier)
            return true;
        struct pollfd p = {r->cancel[0], POLLIN, 0};
        if (poll(&p, 1, 0) > 0)
            return false;
        struct timespec ts;
        al_deadline_in(&ts, 200);
        pthread_cond_timedwait(&m->cv, &m->mu, &ts);
    }
}

static void on_queued(void *ctx, unsigned ahead)
{
    struct mcp_run *r = ctx;
    pthread_mutex_lock(&r->m->mu);
    r->ahead = ahead;
    mark_entered(r->m, r->arrival);
    pthread_mutex_unlock(&r->m->mu);
}

static void *run_thread(void *arg)
{
    struct mcp_run *r = arg;
    al_mcp *m = r->m;
    struct mcp_sess *ss = r->sess;
    const char *code_argv[] = {r->code, NULL};
    al_exec_opts o = {
        .struct_size = sizeof(al_exec_opts),
        .argv = r->argv ? (const char *const *)r->argv : code_argv,
        .lang = r->lang,
        .kernel = r->kernel,
        .env = (const char *const *)r->env,
        .cwd = r->cwd,
        .timeout_ms = r->timeout_ms,
        .stdin_fd = -1,
        .stdout_fd = -1,
        .stderr_fd = -1,
        .output = on_output,
        .output_ctx = r,
        .result = r->kernel ? on_result : NULL,
        .result_ctx = r,
        .context = r->context,
        .cancel_fd = r->cancel[0],
        .queued = on_queued,
    };
    al_exec_result res = AL_EXEC_RESULT_INIT;
    al_error err = {0};
    int rc;
    pthread_mutex_lock(&m->mu);
    bool go = !r->kernel || !r->arrival || wait_for_earlier(m, r);
    pthread_mutex_unlock(&m->mu);
    if (go)
        rc = al_exec(ss->s, &o, &res, &err);
    else
        rc = al_err(&err, -ECANCELED, "cancelled while it waited for the runs sent before it");
    pthread_mutex_lock(&m->mu);
    if (r->arrival)
        mark_entered(m, r->arrival); /* it never will, if it did not */
    r->rc = rc;
    r->res = res;
    r->err = err;
    r->done = true;
    r->t_end_ms = ss->used_ms = al_now_ms();
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    mcp_sess_put(m, ss);
    pthread_mutex_lock(&m->mu);
    m->live--;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

static char **env_dup(const cJSON *env)
{
    size_t n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, env) n++;
    char **out = calloc(n + 1, sizeof(*out));
    if (!out)
        return NULL;
    size_t i = 0;
    cJSON_ArrayForEach(e, env)
    {
        if (asprintf(&out[i], "%s=%s", e->string, e->valuestring) < 0) {
            out[i] = NULL;
            al_strv_free(out);
            return NULL;
        }
        i++;
    }
    return out;
}

/* Under the lock: the oldest run of ss that has ended and nobody reads, taken out. */
static struct mcp_run *prune(struct mcp_sess *ss)
{
    struct mcp_run **victim = NULL;
    for (struct mcp_run **p = &ss->runs; *p; p = &(*p)->next)
        if ((*p)->done && !(*p)->refs)
            victim = p; /* the list is newest first: the last match is the oldest */
    if (!victim)
        return NULL;
    struct mcp_run *r = *victim;
    *victim = r->next;
    ss->nruns--;
    return r;
}

int mcp_run_start(al_mcp *m, struct mcp_sess *ss, const struct mcp_run_spec *sp,
                  struct mcp_run **out, al_error *err)
{
    struct mcp_run *r = calloc(1, sizeof(*r));
    if (!r)
        return al_err(err, -ENOMEM, "out of memory");
    r->cancel[0] = r->cancel[1] = -1;
    r->m = m;
    r->sess = ss;
    r->process = sp->process;
    r->kernel = sp->kernel;
    r->timeout_ms = sp->timeout_ms;
    r->arrival = sp->arrival;
    bool oom = false;
    r->lang = al_strdup_opt(sp->lang, &oom);
    r->code = al_strdup_opt(sp->code, &oom);
    r->context = al_strdup_opt(sp->context, &oom);
    r->cwd = al_strdup_opt(sp->cwd, &oom);
    r->results = cJSON_CreateArray();
    if (sp->argv && !(r->argv = al_strv_dup(sp->argv)))
        oom = true;
    if (sp->env && !(r->env = env_dup(sp->env)))
        oom = true;
    /* The label: the first line of what it runs, cut to 120 bytes at a character. */
    const char *what = sp->label ? sp->label : "";
    size_t ln = strcspn(what, "\n");
    if (ln > 120)
        ln = 120;
    while (ln && ((unsigned char)what[ln] & 0xC0) == 0x80)
        ln--;
    if (!(r->label = strndup(what, ln)) || !r->results)
        oom = true;
    if (oom) {
        run_free(r);
        return al_err(err, -ENOMEM, "out of memory");
    }
    if (pipe2(r->cancel, O_CLOEXEC) < 0 || fcntl(r->cancel[1], F_SETFL, O_NONBLOCK) < 0 ||
        mcp_handle(r->id, sizeof(r->id), sp->process ? "proc_" : "run_", 12) < 0) {
        int e = -errno;
        run_free(r);
        return al_err(err, e ? e : -EIO, "cannot set up the run: %s", strerror(-e));
    }
    pthread_mutex_lock(&m->mu);
    struct mcp_run *old = NULL;
    if (ss->nruns >= AL_MCP_RUNS_MAX && !(old = prune(ss))) {
        pthread_mutex_unlock(&m->mu);
        run_free(r);
        return al_err(err, -EBUSY,
                      "this session already has %u runs and processes going: kill one "
                      "(kill_process) or wait for one to end",
                      AL_MCP_RUNS_MAX);
    }
    if (m->closing || ss->gone) {
        pthread_mutex_unlock(&m->mu);
        if (old)
            run_free(old);
        run_free(r);
        return al_err(err, -ESHUTDOWN, "the session has been stopped");
    }
    r->next = ss->runs;
    ss->runs = r;
    ss->nruns++;
    ss->refs += 2; /* the thread's and the caller's */
    r->refs = 1;
    r->t_start_ms = al_now_ms();
    m->live++;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    int rc = pthread_create(&t, &at, run_thread, r);
    pthread_attr_destroy(&at);
    if (rc) {
        ss->runs = r->next;
        ss->nruns--;
        ss->refs -= 2;
        m->live--;
        pthread_mutex_unlock(&m->mu);
        if (old)
            run_free(old);
        run_free(r);
        return al_err(err, -EAGAIN, "cannot start a thread for the run");
    }
    pthread_mutex_unlock(&m->mu);
    if (old)
        run_free(old);
    *out = r;
    return 0;
}

struct mcp_run *mcp_run_get(al_mcp *m, const char *id)
{
    pthread_mutex_lock(&m->mu);
    for (struct mcp_sess *ss = m->sessions; ss; ss = ss->next)
        for (struct mcp_run *r = ss->runs; !ss->gone && r; r = r->next)
            if (!strcmp(r->id, id)) {
                r->refs++;
                ss->refs++;
                pthread_mutex_unlock(&m->mu);
                return r;
            }
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

void mcp_run_put(al_mcp *m, struct mcp_run *r)
{
    if (!r)
        return;
    struct mcp_sess *ss = r->sess;
    pthread_mutex_lock(&m->mu);
    r->refs--;
    pthread_mutex_unlock(&m->mu);
    mcp_sess_put(m, ss);
}

bool mcp_run_wait(al_mcp *m, struct mcp_run *r, struct mcp_call *c, uint64_t wait_ms,
                  const uint64_t since[2])
{
    uint64_t until = al_now_ms() + wait_ms;
    pthread_mutex_lock(&m->mu);
    while (!r->done && !m->closing &&
           !(since && (r->out[0].total > since[0] || r->out[1].total > since[1]))) {
        /* A cancelled wait ends: at once when it only waits, after the kill when its run is
         * the call's own. */
        if (c && c->cancelled && (c->killed || c->target_fd < 0))
            break;
        uint64_t now = al_now_ms();
        if (now >= until)
            break;
        struct timespec ts;
        al_deadline_in(&ts, until - now < 500 ? until - now : 500);
        pthread_cond_timedwait(&m->cv, &m->mu, &ts);
    }
    bool done = r->done;
    pthread_mutex_unlock(&m->mu);
    return done;
}

/* ---- sessions ---- */

struct mcp_sess *mcp_sess_get(al_mcp *m, const char *id)
{
    pthread_mutex_lock(&m->mu);
    for (struct mcp_sess *ss = m->sessions; ss; ss = ss->next)
        if (!ss->gone && !strcmp(ss->id, id)) {
            ss->refs++;
            ss->used_ms = al_now_ms();
            pthread_mutex_unlock(&m->mu);
            if (m->o.session_touch)
                m->o.session_touch(m->o.session_ctx, ss->handle);
            return ss;
        }
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

/* The session back where it came from: the host's registry, or closed here. */
static void give_back(al_mcp *m, al_session *s, void *handle)
{
    if (m->o.session_close)
        m->o.session_close(m->o.session_ctx, handle);
    else
        al_session_close(s);
}

static void sess_close(al_mcp *m, struct mcp_sess *ss)
{
    mcp_log(m, "session %s: closing (its VM goes)", ss->id);
    give_back(m, ss->s, ss->handle);
    for (struct mcp_run *r = ss->runs, *n; r; r = n) {
        n = r->next;
        run_free(r);
    }
    cJSON_Delete(ss->network);
    free(ss);
}

void mcp_sess_put(al_mcp *m, struct mcp_sess *ss)
{
    if (!ss)
        return;
    pthread_mutex_lock(&m->mu);
    bool last = --ss->refs == 0;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    if (last)
        sess_close(m, ss);
}

/* Under the lock: takes ss out of the table and kills its runs. */
static void unlink_sess(al_mcp *m, struct mcp_sess *ss)
{
    ss->gone = true;
    for (struct mcp_sess **p = &m->sessions; *p; p = &(*p)->next)
        if (*p == ss) {
            *p = ss->next;
            m->nsessions--;
            break;
        }
    for (struct mcp_run *r = ss->runs; r; r = r->next)
        mcp_run_signal(r, SIGKILL);
}

void mcp_sess_stop(al_mcp *m, struct mcp_sess *ss)
{
    pthread_mutex_lock(&m->mu);
    if (ss->gone) {
        pthread_mutex_unlock(&m->mu);
        return;
    }
    unlink_sess(m, ss);
    pthread_mutex_unlock(&m->mu);
    al_session_stop(ss->s);
    mcp_sess_put(m, ss); /* the table's */
    uint64_t until = al_now_ms() + STOP_WAIT_MS;
    pthread_mutex_lock(&m->mu);
    while (ss->refs > 1 && al_now_ms() < until) {
        struct timespec ts;
        al_deadline_in(&ts, 200);
        pthread_cond_timedwait(&m->cv, &m->mu, &ts);
    }
    pthread_mutex_unlock(&m->mu);
}

/* This process's user's snapshot name as airlockd names a local user's ("uid-UID_NAME"). */
int mcp_snapshot_name(const char *name, char *buf, size_t len, al_error *err)
{
    if (!name || strlen(name) > 63 || !al_snapshot_name_ok(name))
        return al_err(err, -EINVAL,
                      "a snapshot's name is 1 to 63 of [A-Za-z0-9._-], not starting with a dot");
    snprintf(buf, len, "uid-%lu_%s", (unsigned long)geteuid(), name);
    return 0;
}

int mcp_sess_open(al_mcp *m, struct mcp_call *c, const al_session_opts *so, const al_fork *fork,
                  const char *snapshot, struct mcp_sess **out, al_error *err)
{
    pthread_mutex_lock(&m->mu);
    if (m->closing) {
        pthread_mutex_unlock(&m->mu);
        return al_err(err, -ESHUTDOWN, "the server is closing");
    }
    if (m->nsessions + m->booting >= m->o.sessions_max) {
        pthread_mutex_unlock(&m->mu);
        return al_err(err, -EBUSY,
                      "%u sessions are open, the most this server allows: stop one "
                      "(stop_session) first",
                      m->o.sessions_max);
    }
    m->booting++;
    pthread_mutex_unlock(&m->mu);
    struct mcp_sess *ss = calloc(1, sizeof(*ss));
    int cp[2] = {-1, -1};
    int rc = 0;
    if (!ss)
        rc = al_err(err, -ENOMEM, "out of memory");
    else if (mcp_handle(ss->id, sizeof(ss->id), "sb_", 16) < 0 || pipe2(cp, O_CLOEXEC) < 0 ||
             fcntl(cp[1], F_SETFL, O_NONBLOCK) < 0)
        rc = al_err(err, -EIO, "cannot set up the session: %s", strerror(errno));
    al_session *s = NULL;
    if (!rc) {
        al_session_opts o = *so;
        o.cancel_fd = cp[0];
        mcp_call_target(c, cp[1]);
        uint64_t t0 = al_now_ms();
        char lib[160];
        rc = m->o.session_open
                 ? m->o.session_open(m->o.session_ctx, &o, fork, snapshot, &s, &ss->handle, err)
             : fork     ? al_fork_open(fork, &o, &s, err)
             : snapshot ? (mcp_snapshot_name(snapshot, lib, sizeof(lib), err) < 0
                               ? err->code
                               : al_snapshot_open(lib, &o, &s, err))
                        : al_session_open(&o, &s, err);
        mcp_call_target(c, -1);
        ss->boot_ms = al_now_ms() - t0;
        if (!rc)
            al_session_set_cancel_fd(s, -1);
    }
    if (cp[0] >= 0)
        close(cp[0]), close(cp[1]);
    pthread_mutex_lock(&m->mu);
    m->booting--;
    if (!rc && m->closing)
        rc = al_err(err, -ESHUTDOWN, "the server is closing");
    if (rc) {
        pthread_mutex_unlock(&m->mu);
        if (s)
            give_back(m, s, ss->handle);
        free(ss);
        return rc;
    }
    ss->s = s;
    ss->refs = 2; /* the table's and the caller's */
    ss->created = time(NULL);
    ss->used_ms = al_now_ms();
    ss->next = m->sessions;
    m->sessions = ss;
    m->nsessions++;
    pthread_mutex_unlock(&m->mu);
    /* Ended by the host before it was in the table (al_mcp_session_ended found nothing then). */
    if (m->o.session_ending && m->o.session_ending(m->o.session_ctx, ss->handle)) {
        mcp_sess_stop(m, ss);
        mcp_sess_put(m, ss);
        return al_err(err, -ESHUTDOWN, "the session was ended as it started");
    }
    *out = ss;
    return 0;
}

void al_mcp_session_ended(al_mcp *m, void *handle)
{
    pthread_mutex_lock(&m->mu);
    struct mcp_sess *ss = m->sessions;
    while (ss && (ss->gone || ss->handle != handle))
        ss = ss->next;
    if (ss)
        ss->refs++;
    pthread_mutex_unlock(&m->mu);
    if (!ss)
        return;
    mcp_log(m, "session %s: ended by the host", ss->id);
    mcp_sess_stop(m, ss);
    mcp_sess_put(m, ss);
}

void mcp_sessions_reap(al_mcp *m)
{
    if (!m->o.idle_max_s)
        return;
    for (;;) {
        struct mcp_sess *idle = NULL;
        uint64_t now = al_now_ms();
        pthread_mutex_lock(&m->mu);
        for (struct mcp_sess *ss = m->sessions; ss && !idle; ss = ss->next)
            if (ss->refs == 1 && now - ss->used_ms >= m->o.idle_max_s * 1000ull) {
                idle = ss;
                idle->refs++;
            }
        pthread_mutex_unlock(&m->mu);
        if (!idle)
            return;
        mcp_log(m, "session %s: idle for %u s, stopping it", idle->id, m->o.idle_max_s);
        mcp_sess_stop(m, idle);
        mcp_sess_put(m, idle);
    }
}

void mcp_sessions_end(al_mcp *m)
{
    pthread_mutex_lock(&m->mu);
    struct mcp_sess *all = m->sessions;
    m->sessions = NULL;
    m->nsessions = 0;
    for (struct mcp_sess *ss = all; ss; ss = ss->next) {
        ss->gone = true;
        for (struct mcp_run *r = ss->runs; r; r = r->next)
            mcp_run_signal(r, SIGKILL);
    }
    pthread_mutex_unlock(&m->mu);
    for (struct mcp_sess *ss = all; ss; ss = ss->next)
        al_session_stop(ss->s);
    pthread_mutex_lock(&m->mu);
    while (m->live)
        pthread_cond_wait(&m->cv, &m->mu);
    pthread_mutex_unlock(&m->mu);
    for (struct mcp_sess *ss = all, *n; ss; ss = n) {
        n = ss->next;
        mcp_sess_put(m, ss);
    }
}

/* /metrics: the daemon's counters in the Prometheus text format (version 0.0.4). Every counter is
 * a relaxed atomic bumped where the thing happens; a scrape reads them without a lock, so a
 * scrape never waits on a session and a request never waits on a scrape. Totals read during an
 * update may be one observation apart from their buckets, which Prometheus tolerates. */
#include "airlockd.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define ADD(p, v) __atomic_add_fetch((p), (v), __ATOMIC_RELAXED)
#define SUB(p, v) __atomic_sub_fetch((p), (v), __ATOMIC_RELAXED)
#define GET(p) __atomic_load_n((p), __ATOMIC_RELAXED)

/* Bucket bounds in milliseconds: from a fast request to a slow boot. */
static const uint64_t bounds_ms[] = {1,    5,    10,   25,    50,    100,   250,   500,
                                     1000, 2500, 5000, 10000, 30000, 60000, 300000};
#define NBOUNDS (sizeof(bounds_ms) / sizeof(bounds_ms[0]))

struct hist {
    uint64_t le[NBOUNDS]; /* observations <= bounds_ms[i] (not cumulative; summed on output) */
    uint64_t count;
    uint64_t sum_ms;
};

static void observe(struct hist *h, uint64_t ms)
{
    for (size_t i = 0; i < NBOUNDS; i++)
        if (ms <= bounds_ms[i]) {
            ADD(&h->le[i], 1);
            break;
        }
    ADD(&h->sum_ms, ms);
    ADD(&h->count, 1);
}

/* Requests: per route of the table (the last slot: no route matched), per status class. */
#define ROUTES_MAX 64
#define CLASSES 5 /* 1xx..5xx */
static uint64_t requests[ROUTES_MAX + 1][CLASSES];
static struct hist latency[ROUTES_MAX + 1];

/* Error replies by their JSON error code; codes not in the list count as "other". */
/* Grouped by kind: the request, the caller, the target, the session, the daemon. */
/* clang-format off */
static const char *const error_codes[] = {
    "invalid", "bad_json", "too_large", "unsupported_media_type", "method_not_allowed",
    "unauthorized", "forbidden", "quota_exceeded",
    "not_found", "not_a_directory", "exists", "not_empty",
    "stdin_closed", "not_running", "not_supported", "busy", "events_dropped", "session_poisoned",
    "boot_failed", "stopping", "timeout", "disk_budget", "internal", "other",
};
/* clang-format on */
#define NERRORS (sizeof(error_codes) / sizeof(error_codes[0]))
static uint64_t errors[NERRORS];

static uint64_t boots, boot_failures, restores, closes;
static struct hist boot_hist, restore_hist, close_hist;
static int64_t sessions_booting, sessions_ready, sessions_closing;
static uint64_t runs_by_kind[3], run_errors, runs_active;
static struct hist run_hist;
static const char *const run_kinds[3] = {"command", "code", "kernel"};

/* Pool depth per image: the pool reports through this hook when it is there. */
static ad_pool_depth_fn pool_depth;
static void *pool_ctx;

void ad_metrics_pool_hook(ad_pool_depth_fn fn, void *ctx)
{
    pool_ctx = ctx;
    pool_depth = fn;
}

void ad_metrics_request(const struct ad_route *route, unsigned status, uint64_t ms)
{
    size_t i = route ? (size_t)(route - ad_routes) : ROUTES_MAX;
    if (i > ROUTES_MAX)
        i = ROUTES_MAX;
    unsigned cls = status >= 100 && status < 600 ? status / 100 - 1 : 4;
    ADD(&requests[i][cls], 1);
    observe(&latency[i], ms);
}

void ad_metrics_error(const char *code)
{
    size_t i = 0;
    while (i < NERRORS - 1 && strcmp(error_codes[i], code ? code : ""))
        i++;
    ADD(&errors[i], 1);
}

void ad_metrics_booting(int delta)
{
    ADD(&sessions_booting, delta);
}

void ad_metrics_boot(bool ok, bool restored, uint64_t ms)
{
    if (!ok) {
        ADD(&boot_failures, 1);
        return;
    }
    ADD(&sessions_ready, 1);
    if (restored) {
        ADD(&restores, 1);
        observe(&restore_hist, ms);
    } else {
        ADD(&boots, 1);
        observe(&boot_hist, ms);
    }
}

void ad_metrics_closing(void)
{
    SUB(&sessions_ready, 1);
    ADD(&sessions_closing, 1);
}

void ad_metrics_closed(uint64_t ms)
{
    SUB(&sessions_closing, 1);
    ADD(&closes, 1);
    observe(&close_hist, ms);
}

void ad_metrics_run_start(enum ad_run_kind kind)
{
    ADD(&runs_by_kind[kind], 1);
    ADD(&runs_active, 1);
}

void ad_metrics_run_end(bool error, uint64_t ms)
{
    SUB(&runs_active, 1);
    if (error)
        ADD(&run_errors, 1);
    observe(&run_hist, ms);
}

/* ---- the text ---- */

struct out {
    char *buf;
    size_t len, cap;
    bool oom;
};

static void put(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct out *o, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = o->oom ? 0 : vsnprintf(o->buf + o->len, o->cap - o->len, fmt, ap);
        va_end(ap);
        if (o->oom || n < 0)
            return;
        if ((size_t)n < o->cap - o->len) {
            o->len += (size_t)n;
            return;
        }
        size_t cap = o->cap * 2 + (size_t)n;
        char *b = realloc(o->buf, cap);
        if (!b) {
            o->oom = true;
            return;
        }
        o->buf = b;
        o->cap = cap;
    }
}

static void head(struct out *o, const char *name, const char *type, const char *help)
{
    put(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* labels: "" or 'route="...",method="..."' (without braces). */
static void hist_lines(struct out *o, const char *name, const char *labels, const struct hist *h)
{
    uint64_t cum = 0;
    const char *sep = labels[0] ? "," : "";
    for (size_t i = 0; i < NBOUNDS; i++) {
        cum += GET(&h->le[i]);
        put(o, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels, sep, bounds_ms[i] / 1000.0,
            (unsigned long long)cum);
    }
    uint64_t count = GET(&h->count);
    if (count < cum) /* read while being updated: the total is never below a bucket */
        count = cum;
    put(o, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, sep, (unsigned long long)count);
    put(o, "%s_sum%s%s%s %.3f\n", name, labels[0] ? "{" : "", labels, labels[0] ? "}" : "",
        GET(&h->sum_ms) / 1000.0);
    put(o, "%s_count%s%s%s %llu\n", name, labels[0] ? "{" : "", labels, labels[0] ? "}" : "",
        (unsigned long long)count);
}

static void pool_line(void *ctx, const char *image, unsigned depth)
{
    put(ctx, "airlockd_pool_depth{image=\"%s\"} %u\n", image, depth);
}

struct host_lines {
    struct out *o;
    int what; /* 0: up, 1: sessions, 2: lost */
};

static void host_line(void *ctx, const char *name, bool up, unsigned sessions, unsigned lost)
{
    struct host_lines *h = ctx;
    static const char *const series[] = {"airlockd_host_up", "airlockd_host_sessions",
                                         "airlockd_host_lost_sessions_total"};
    put(h->o, "%s{host=\"%s\"} %u\n", series[h->what], name,
        h->what == 0   ? (unsigned)up
        : h->what == 1 ? sessions
                       : lost);
}

char *ad_metrics_text(size_t *len)
{
    struct out o = {.cap = 16384};
    o.buf = malloc(o.cap);
    if (!o.buf)
        return NULL;
    o.buf[0] = 0;

    head(&o, "airlockd_sessions", "gauge", "Sessions held by the daemon, by state.");
    put(&o, "airlockd_sessions{state=\"booting\"} %lld\n", (long long)GET(&sessions_booting));
    put(&o, "airlockd_sessions{state=\"ready\"} %lld\n", (long long)GET(&sessions_ready));
    put(&o, "airlockd_sessions{state=\"closing\"} %lld\n", (long long)GET(&sessions_closing));

    head(&o, "airlockd_pool_depth", "gauge",
         "Warm sessions waiting in the pool, per image (no series without a pool).");
    if (pool_depth)
        pool_depth(pool_ctx, pool_line, &o);

    /* Many hosts (hosts.c): one series per configured host, "local" when none is. */
    static const char *const host_help[][3] = {
        {"airlockd_host_up", "gauge", "Whether the host answers (1) or is down (0)."},
        {"airlockd_host_sessions", "gauge", "Sessions placed on the host, booting included."},
        {"airlockd_host_lost_sessions_total", "counter",
         "Sessions lost because their host stopped answering."},
    };
    for (int i = 0; i < 3; i++) {
        struct host_lines h = {.o = &o, .what = i};
        head(&o, host_help[i][0], host_help[i][1], host_help[i][2]);
        ad_hosts_each(host_line, &h);
    }

    head(&o, "airlockd_session_boots_total", "counter", "Sessions booted cold from an image.");
    put(&o, "airlockd_session_boots_total %llu\n", (unsigned long long)GET(&boots));
    head(&o, "airlockd_session_boot_seconds", "histogram", "Time to boot a session.");
    hist_lines(&o, "airlockd_session_boot_seconds", "", &boot_hist);
    head(&o, "airlockd_session_restores_total", "counter",
         "Sessions restored from a warm-start template (or taken from the pool) instead.");
    put(&o, "airlockd_session_restores_total %llu\n", (unsigned long long)GET(&restores));
    head(&o, "airlockd_session_restore_seconds", "histogram",
         "Time to get a restored session (request to ready).");
    hist_lines(&o, "airlockd_session_restore_seconds", "", &restore_hist);
    head(&o, "airlockd_sessions_closed_total", "counter", "Sessions ended.");
    put(&o, "airlockd_sessions_closed_total %llu\n", (unsigned long long)GET(&closes));
    head(&o, "airlockd_session_close_seconds", "histogram", "Time to end a session.");
    hist_lines(&o, "airlockd_session_close_seconds", "", &close_hist);

    head(&o, "airlockd_runs_total", "counter", "Runs started, by kind.");
    for (size_t i = 0; i < 3; i++)
        put(&o, "airlockd_runs_total{kind=\"%s\"} %llu\n", run_kinds[i],
            (unsigned long long)GET(&runs_by_kind[i]));
    head(&o, "airlockd_runs_active", "gauge", "Runs not yet ended.");
    put(&o, "airlockd_runs_active %llu\n", (unsigned long long)GET(&runs_active));
    head(&o, "airlockd_run_seconds", "histogram", "Time from a run's start to its end.");
    hist_lines(&o, "airlockd_run_seconds", "", &run_hist);

    head(&o, "airlockd_failures_total", "counter",
         "Failures by kind: boot (a session that did not start), run (a run that ended in an "
         "error instead of an exit), and API error replies by their error code.");
    put(&o, "airlockd_failures_total{kind=\"boot\"} %llu\n",
        (unsigned long long)GET(&boot_failures));
    put(&o, "airlockd_failures_total{kind=\"run\"} %llu\n", (unsigned long long)GET(&run_errors));
    for (size_t i = 0; i < NERRORS; i++)
        put(&o, "airlockd_failures_total{kind=\"api\",code=\"%s\"} %llu\n", error_codes[i],
            (unsigned long long)GET(&errors[i]));

    head(&o, "airlockd_requests_total", "counter", "Requests answered, by route and status class.");
    static const char *const cls[CLASSES] = {"1xx", "2xx", "3xx", "4xx", "5xx"};
    for (size_t i = 0; i <= ad_nroutes && i <= ROUTES_MAX; i++) {
        size_t k = i == ad_nroutes ? ROUTES_MAX : i;
        const char *m = i == ad_nroutes ? "" : ad_routes[i].method;
        const char *p = i == ad_nroutes ? "unmatched" : ad_routes[i].pattern;
        for (size_t c = 0; c < CLASSES; c++) {
            uint64_t v = GET(&requests[k][c]);
            if (v || c == 1)
                put(&o, "airlockd_requests_total{method=\"%s\",route=\"%s\",code=\"%s\"} %llu\n", m,
                    p, cls[c], (unsigned long long)v);
        }
    }
    head(&o, "airlockd_request_seconds", "histogram",
         "Time from a request's first byte to its answer sent (event streams: to their end).");
    for (size_t i = 0; i <= ad_nroutes && i <= ROUTES_MAX; i++) {
        size_t k = i == ad_nroutes ? ROUTES_MAX : i;
        char labels[256];
        snprintf(labels, sizeof(labels), "method=\"%s\",route=\"%s\"",
                 i == ad_nroutes ? "" : ad_routes[i].method,
                 i == ad_nroutes ? "unmatched" : ad_routes[i].pattern);
        hist_lines(&o, "airlockd_request_seconds", labels, &latency[k]);
    }
    if (o.oom) {
        free(o.buf);
        return NULL;
    }
    *len = o.len;
    return o.buf;
}

/* The daemon's sessions: libairlock sessions with an owner, labels, an idle timeout and a
 * lifetime. They outlive requests; a reaper ends the idle and the expired; shutdown ends all. */
#include "airlockd.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* A registry slot: a session, or a reservation while one boots (counted against quotas). */
struct slot {
    struct slot *next;
    struct ad_session *s; /* NULL while booting */
    char owner[40];
    char name[64]; /* the session's name, reserved while it boots; "" for none */
    unsigned memory_mib;
    unsigned vcpus;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static struct slot *slots;
static pthread_t reaper;
static bool stopping, reaper_started;
static unsigned enders; /* sessions being ended by threads of their own */
/* How long shutdown waits for the sessions being ended: past it the daemon exits and their VMs
 * end with its libvirt connections (AUTODESTROY), their files with the next gc. */
#define SHUTDOWN_WAIT_MS 60000

/* Labels: a few short strings for the caller's bookkeeping. */
#define LABELS_MAX 16
#define LABEL_LEN_MAX 128
/* vCPUs a session may ask for. */
#define VCPUS_MAX 16

/* ---- the warm pool ----
 * pool_size sessions of one image and shape, restored from its template by libairlock's refill
 * thread, which builds the template first when there is none (until then creates boot cold).
 * A create takes one only when it asks for exactly that shape and one is ready now; otherwise it
 * boots (or restores) as without a pool: the pool never fails nor delays a create. A session
 * handed out is the caller's and never goes back; shutdown closes the rest. */
static al_pool *pool; /* under lock */
static struct {
    char image[64];
    unsigned memory_mib, vcpus, size;
    int transport; /* enum al_transport: the image's */
    uint64_t disk_budget_bytes;
} pool_shape;

/* /metrics: the pool's depth (no series once shutdown took the pool away). */
static void pool_depth(void *ctx, void (*line)(void *out, const char *image, unsigned depth),
                       void *out)
{
    (void)ctx;
    pthread_mutex_lock(&lock);
    if (pool)
        line(out, pool_shape.image, al_pool_ready(pool));
    pthread_mutex_unlock(&lock);
}

static void pool_start(const struct ad_config *c)
{
    if (!c->pool_size)
        return;
    const char *image = c->pool_image[0] ? c->pool_image : al_image_default();
    al_error err = {0};
    al_image img = AL_IMAGE_INIT;
    if (al_image_load(image, &img, &err) < 0) {
        ad_log("no warm pool: %s", err.msg);
        return;
    }
    snprintf(pool_shape.image, sizeof(pool_shape.image), "%s", image);
    pool_shape.memory_mib = c->pool_memory_mib ? c->pool_memory_mib
                            : img.memory_mib   ? img.memory_mib
                                               : 256;
    pool_shape.vcpus = c->pool_vcpus;
    pool_shape.size = c->pool_size;
    pool_shape.transport = img.transport;
    pool_shape.disk_budget_bytes = c->limits.disk_budget_bytes;
    al_image_free(&img);
    if (pool_shape.transport == AL_TRANSPORT_SSH) {
        ad_log("no warm pool: image %s is reached over SSH (such sessions always boot cold)",
               image);
        return;
    }
    al_session_opts o = {
        .struct_size = sizeof(al_session_opts),
        .image = pool_shape.image,
        .memory_mib = pool_shape.memory_mib,
        .vcpus = pool_shape.vcpus,
        .quiet = true,
        .disk_budget_bytes = pool_shape.disk_budget_bytes,
    };
    if (al_pool_create(&o, c->pool_size, &pool, &err) < 0) {
        ad_log("no warm pool: %s", err.msg);
        pool = NULL;
        return;
    }
    ad_log("warm pool: %u sessions of %s (%u MiB), refilled in the background", c->pool_size, image,
           pool_shape.memory_mib);
    ad_metrics_pool_hook(pool_depth, NULL);
}

/* A ready session of the pool when o asks for exactly its shape, else NULL. Called with lock
 * held (shutdown takes the pool away under it); al_pool_try_take does not wait. */
static al_session *pool_take(const al_session_opts *o, uint64_t disk_budget_bytes)
{
    if (!pool || o->keep || o->net.allow || strcmp(o->image, pool_shape.image) ||
        o->memory_mib != pool_shape.memory_mib || o->vcpus != pool_shape.vcpus || o->checkpoints ||
        o->display || disk_budget_bytes != pool_shape.disk_budget_bytes ||
        (o->transport != AL_TRANSPORT_IMAGE && o->transport != pool_shape.transport))
        return NULL;
    al_session *s = NULL;
    if (al_pool_try_take(pool, &s) < 0)
        return NULL;
    al_session_set_cancel_fd(s, o->cancel_fd);
    return s;
}

cJSON *ad_pool_json(void)
{
    pthread_mutex_lock(&lock);
    cJSON *o = NULL;
    if (pool) {
        o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "image", pool_shape.image);
        cJSON_AddNumberToObject(o, "memory_mib", pool_shape.memory_mib);
        if (pool_shape.vcpus)
            cJSON_AddNumberToObject(o, "vcpus", pool_shape.vcpus);
        else
            cJSON_AddNullToObject(o, "vcpus");
        cJSON_AddNumberToObject(o, "size", pool_shape.size);
        cJSON_AddNumberToObject(o, "ready", al_pool_ready(pool));
    }
    pthread_mutex_unlock(&lock);
    return o;
}

static void *reap_loop(void *arg);

static void sessions_restore(void);

int ad_sessions_init(const struct ad_config *c)
{
    sessions_restore();
    pool_start(c);
    if (pthread_create(&reaper, NULL, reap_loop, NULL)) {
        al_pool_destroy(pool);
        pool = NULL;
        return -EAGAIN;
    }
    reaper_started = true;
    return 0;
}

/* The live session id of owner (NULL: whoever owns it), referenced, or NULL. */
static struct ad_session *get(const char *owner, const char *id)
{
    struct ad_session *found = NULL;
    pthread_mutex_lock(&lock);
    for (struct slot *sl = slots; sl; sl = sl->next)
        if (sl->s && !sl->s->gone && !strcmp(sl->s->id, id) &&
            (!owner || !strcmp(sl->s->owner, owner))) {
            found = sl->s;
            found->refs++;
            break;
        }
    pthread_mutex_unlock(&lock);
    return found;
}

struct ad_session *ad_session_get(const char *owner, const char *id)
{
    return get(owner, id);
}

struct ad_session *ad_session_get_any(const char *id)
{
    return get(NULL, id);
}

struct ad_session *ad_session_find(bool (*match)(void *ctx, const struct ad_session *s), void *ctx)
{
    struct ad_session *found = NULL;
    pthread_mutex_lock(&lock);
    for (struct slot *sl = slots; sl && !found; sl = sl->next)
        if (sl->s && !sl->s->gone && match(ctx, sl->s)) {
            found = sl->s;
            found->refs++;
        }
    pthread_mutex_unlock(&lock);
    return found;
}

void ad_session_put(struct ad_session *s)
{
    pthread_mutex_lock(&lock);
    s->refs--;
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
}

void ad_session_touch(struct ad_session *s)
{
    pthread_mutex_lock(&lock);
    s->used_ms = ad_now_ms();
    pthread_mutex_unlock(&lock);
}

static void unlink_slot(struct ad_session *s)
{
    for (struct slot **p = &slots; *p; p = &(*p)->next)
        if ((*p)->s == s) {
            struct slot *sl = *p;
            *p = sl->next;
            free(sl);
            return;
        }
}

/* Ends s once only `own` references are left (the caller's): its runs are cancelled first so
 * that their threads let go. Called with lock held, s already gone; returns with it held. */
static void finish(struct ad_session *s, unsigned own)
{
    pthread_mutex_unlock(&lock);
    uint64_t t0 = ad_now_ms();
    /* A front that holds it for its client lets go first (its reference comes back). */
    if (s->on_end)
        s->on_end(s->on_end_ctx, s);
    if (s->detaching) {
        /* Kept for the next start: the runs' host side ends (their processes go on in the
         * guest, and the store keeps them for adoption), the VM runs on. */
        al_session_detach(s->s);
        s->s = NULL;
        pthread_mutex_lock(&lock);
        while (s->refs > own)
            pthread_cond_wait(&cond, &lock);
        pthread_mutex_unlock(&lock);
        ad_log("session %s of %s kept for the next start", s->id, s->owner);
    } else {
        ad_runs_cancel(s);
        /* The VM goes first: whatever a request of this session waits for (a frozen agent, a
         * guest that stopped reading), it fails now, and the references it holds come back. */
        if (s->s)
            al_session_stop(s->s);
        pthread_mutex_lock(&lock);
        while (s->refs > own)
            pthread_cond_wait(&cond, &lock);
        pthread_mutex_unlock(&lock);
        ad_metrics_closing();
        if (s->s) {
            al_session_close(s->s);
        } else if (s->kept) { /* taken back at start, it could not be: what is left of it goes */
            al_error ignored = {0};
            al_session_discard(ad_store_keeper(), s->id, &ignored);
        }
        ad_metrics_closed(ad_now_ms() - t0);
        if (s->kept)
            ad_store_del(s->id);
        if (s->lost)
            ad_host_gc(s->host); /* when it answers again: what the close could not reach */
        ad_log("session %s of %s ended (%llums to close)", s->id, s->owner,
               (unsigned long long)(ad_now_ms() - t0));
    }
    ad_host_release(s->host, s->memory_mib);
    ad_runs_free(s);
    ad_chat_free(s);
    close(s->cancel_rd);
    close(s->cancel_wr);
    cJSON_Delete(s->labels);
    cJSON_Delete(s->volumes);
    cJSON_Delete(s->net);
    cJSON_Delete(s->e2b_env);
    cJSON_Delete(s->e2b_contexts);
    ad_e2b_session_free(s);
    free(s->metrics);
    pthread_mutex_lock(&lock);
}

bool ad_session_ending(struct ad_session *s)
{
    pthread_mutex_lock(&lock);
    bool g = s->gone;
    pthread_mutex_unlock(&lock);
    return g;
}

void ad_session_delete(struct ad_session *s)
{
    pthread_mutex_lock(&lock);
    if (s->gone) { /* the reaper ends it already; it waits for this reference */
        s->refs--;
        pthread_cond_broadcast(&cond);
        pthread_mutex_unlock(&lock);
        return;
    }
    s->gone = true;
    finish(s, 1);
    s->refs = 0;
    unlink_slot(s);
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
    free(s);
}

/* A session being ended stays in its slot, counted against its owner's quota (its VM lives
 * until the end is done), and is seen by no request. */
static void *ender(void *arg)
{
    struct ad_session *s = arg;
    pthread_mutex_lock(&lock);
    finish(s, 0);
    unlink_slot(s);
    enders--;
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
    free(s);
    return NULL;
}

/* Ends s in a thread of its own, so that the reaper and the shutdown never wait on one session.
 * Called with lock held. */
static void reap_one(struct ad_session *s, const char *why)
{
    ad_log("session %s of %s: %s", s->id, s->owner, why);
    s->gone = true;
    pthread_t th;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    enders++;
    if (pthread_create(&th, &at, ender, s)) { /* no thread: end it here */
        enders--;
        finish(s, 0);
        unlink_slot(s);
        free(s);
    }
    pthread_attr_destroy(&at);
}

/* Pauses an idle session with auto_pause_s in a thread of its own (a pause takes seconds).
 * Called with lock held. */
static void *pauser(void *arg)
{
    struct ad_session *s = arg;
    struct ad_fail f;
    if (ad_session_pause(s, &f) < 0)
        ad_log("session %s of %s: idle, but the pause failed: %s", s->id, s->owner, f.msg);
    else
        ad_log("session %s of %s: paused after %u s idle", s->id, s->owner, s->auto_pause_s);
    ad_session_put(s);
    return NULL;
}

static void auto_pause(struct ad_session *s)
{
    pthread_t th;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    s->refs++;
    s->used_ms = ad_now_ms(); /* not again before this one is done */
    if (pthread_create(&th, &at, pauser, s))
        s->refs--;
    pthread_attr_destroy(&at);
}

static void *reap_loop(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&lock);
    while (!stopping) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 500 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&cond, &lock, &ts);
        if (stopping)
            break;
        uint64_t now = ad_now_ms();
        for (struct slot *sl = slots; sl; sl = sl->next) {
            struct ad_session *s = sl->s;
            if (!s || s->gone)
                continue;
            if (now >= s->deadline_ms && s->pause_at_end && s->kept && s->s && !s->lost &&
                !s->paused && !s->refs) {
                /* E2B's autoPause: paused at its timeout, kept for the daemon's longest
                 * lifetime from now (a paused E2B sandbox waits for a resume) */
                unsigned keep_s =
                    ad_cfg.limits.max_lifetime_s ? ad_cfg.limits.max_lifetime_s : 24 * 3600;
                s->deadline_ms = now + keep_s * 1000ull;
                auto_pause(s);
                continue;
            }
            if (now >= s->deadline_ms) {
                reap_one(s, "lifetime over");
                continue; /* its slot stays until its end is done */
            }
            s->refs++; /* kept while the lock is let go: a delete waits for it */
            pthread_mutex_unlock(&lock);
            bool busy = ad_runs_active(s);
            pthread_mutex_lock(&lock);
            s->refs--;
            pthread_cond_broadcast(&cond);
            if (s->gone)
                break; /* being ended by a delete; the list changed */
            /* now again: a request may have touched it while the lock was let go */
            now = ad_now_ms();
            if (s->paused || busy || s->refs || now < s->used_ms)
                continue; /* a paused session's lifetime goes on; its idleness does not count */
            if (s->auto_pause_s && s->kept && !s->lost && s->s &&
                now - s->used_ms >= s->auto_pause_s * 1000ull)
                auto_pause(s);
            else if (s->idle_s && now - s->used_ms >= s->idle_s * 1000ull)
                reap_one(s, "idle timeout");
        }
    }
    pthread_mutex_unlock(&lock);
    return NULL;
}

void ad_sessions_shutdown(void)
{
    pthread_mutex_lock(&lock);
    stopping = true;
    al_pool *p = pool;
    pool = NULL;
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
    al_pool_destroy(p); /* its ready sessions' domains and files go */
    if (reaper_started)
        pthread_join(reaper, NULL);
    ad_runs_shutdown();
    pthread_mutex_lock(&lock);
    for (struct slot *sl = slots; sl; sl = sl->next)
        if (sl->s && !sl->s->gone) {
            /* A kept session outlives the daemon: the next start takes it back. */
            sl->s->detaching = sl->s->kept && sl->s->s && !sl->s->lost;
            reap_one(sl->s,
                     sl->s->detaching ? "daemon stopping, the session is kept" : "daemon stopping");
        }
    /* Each ends in its own thread, all at once; shutdown always ends. */
    uint64_t end = ad_now_ms() + SHUTDOWN_WAIT_MS;
    while (enders && ad_now_ms() < end) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&cond, &lock, &ts);
    }
    if (enders)
        ad_log("%u sessions did not end within %d s; leaving them to libvirt and gc", enders,
               SHUTDOWN_WAIT_MS / 1000);
    pthread_mutex_unlock(&lock);
}

unsigned ad_sessions_host_down(int host, const char *why)
{
    unsigned n = 0;
    pthread_mutex_lock(&lock);
    for (struct slot *sl = slots; sl; sl = sl->next) {
        struct ad_session *s = sl->s;
        if (s && !s->gone && !s->lost && s->host == host) {
            s->lost = true;
            snprintf(s->lost_why, sizeof(s->lost_why), "%s", why);
            ad_log("session %s of %s lost: its host went down (%s)", s->id, s->owner, why);
            n++;
        }
    }
    pthread_mutex_unlock(&lock);
    return n;
}

void ad_session_list(const char *owner, void (*fn)(void *ctx, struct ad_session *s), void *ctx)
{
    pthread_mutex_lock(&lock);
    for (struct slot *sl = slots; sl; sl = sl->next)
        if (sl->s && !sl->s->gone && !strcmp(sl->s->owner, owner))
            fn(ctx, sl->s);
    pthread_mutex_unlock(&lock);
}

static int64_t wall_of(uint64_t mono_ms)
{
    int64_t delta = (int64_t)mono_ms - (int64_t)ad_now_ms();
    return (int64_t)time(NULL) + delta / 1000;
}

/* Called with the registry lock held (list) or a reference (get). */
cJSON *ad_session_json(struct ad_session *s)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", s->id);
    cJSON_AddStringToObject(o, "image", s->image);
    cJSON_AddNumberToObject(o, "memory_mib", s->memory_mib);
    cJSON_AddNumberToObject(o, "vcpus", s->vcpus);
    cJSON_AddStringToObject(o, "transport", s->transport);
    cJSON_AddStringToObject(o, "checkpoint_policy", al_checkpoint_policy_name(s->policy));
    cJSON_AddItemToObject(o, "labels", cJSON_Duplicate(s->labels, true));
    if (s->forked_from[0])
        cJSON_AddStringToObject(o, "forked_from", s->forked_from);
    if (s->volumes)
        cJSON_AddItemToObject(o, "volumes", cJSON_Duplicate(s->volumes, true));
    cJSON_AddNumberToObject(o, "created", (double)s->created);
    cJSON_AddNumberToObject(o, "idle_timeout_s", s->idle_s);
    if (s->deadline_ms == UINT64_MAX)
        cJSON_AddNullToObject(o, "expires");
    else
        cJSON_AddNumberToObject(o, "expires", (double)wall_of(s->deadline_ms));
    cJSON_AddBoolToObject(o, "checkpoints", s->checkpoints);
    cJSON_AddBoolToObject(o, "display", s->display);
    cJSON_AddBoolToObject(o, "kvm", s->s && al_session_kvm(s->s));
    cJSON_AddBoolToObject(o, "warm", s->s && al_session_restored(s->s));
    cJSON_AddBoolToObject(o, "pooled", s->pooled);
    cJSON_AddBoolToObject(o, "lost", s->lost);
    if (s->lost)
        ad_json_add_text(o, "lost_why", s->lost_why);
    if (s->name[0])
        cJSON_AddStringToObject(o, "name", s->name);
    else
        cJSON_AddNullToObject(o, "name");
    cJSON_AddBoolToObject(o, "kept", s->kept);
    cJSON_AddBoolToObject(o, "paused", s->paused);
    cJSON_AddNumberToObject(o, "auto_pause_s", s->auto_pause_s);
    cJSON_AddStringToObject(o, "languages", s->s ? al_session_languages(s->s) : "");
    cJSON_AddItemToObject(o, "net", s->net ? cJSON_Duplicate(s->net, true) : cJSON_CreateNull());
    return o;
}

/* Descriptors one session may hold in airlockd: about 11 idle (measured: its link, libvirt's
 * stream, the budget watcher, pipes), a few more for each run, port and terminal. */
#define FDS_PER_SESSION 48
/* Kept free for the rest: each listener's connections (max_connections each), the key store,
 * logs, libvirt's connections. */
#define FDS_SPARE 64

static unsigned fds_open(void)
{
    DIR *d = opendir("/proc/self/fd");
    unsigned n = 0;
    if (!d)
        return 0;
    while (readdir(d))
        n++;
    closedir(d);
    return n > 3 ? n - 3 : 0; /* ".", ".." and the directory's own */
}

/* Whether one more session fits in the process's descriptors (RLIMIT_NOFILE, raised to its
 * hard limit at start): past it, every client would be locked out, not just this one. */
static int fds_check(struct ad_fail *f)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY)
        return 0;
    unsigned listeners =
                 1 + !!ad_cfg.tcp_listen[0] + !!ad_cfg.e2b_listen[0] + !!ad_cfg.oi_listen[0],
             held = fds_open();
    uint64_t need =
        (uint64_t)held + FDS_PER_SESSION + FDS_SPARE + (uint64_t)listeners * ad_cfg.max_connections;
    if (need <= rl.rlim_cur)
        return 0;
    ad_failf(f, 503, "no_descriptors",
             "airlockd has %u descriptors open of its %llu (RLIMIT_NOFILE): a session needs %u "
             "more, with %u kept for connections; raise LimitNOFILE",
             held, (unsigned long long)rl.rlim_cur, FDS_PER_SESSION,
             FDS_SPARE + listeners * ad_cfg.max_connections);
    f->limit = "open_files";
    return -EMFILE;
}

static int quota(const char *owner, const struct ad_limits *lim, unsigned memory_mib,
                 unsigned vcpus, const char *name, struct ad_fail *f)
{
    unsigned n = 0, mem = 0, cpus = 0;
    for (struct slot *sl = slots; name && name[0] && sl; sl = sl->next)
        if (!strcmp(sl->owner, owner) && !strcmp(sl->name, name)) {
            ad_failf(f, 409, "name_taken", "a session named '%s' exists already", name);
            return -EEXIST;
        }
    /* a session being ended counts until its VM is gone */
    for (struct slot *sl = slots; sl; sl = sl->next)
        if (!strcmp(sl->owner, owner)) {
            n++;
            mem += sl->memory_mib;
            cpus += sl->vcpus;
        }
    if (lim->max_sessions && n + 1 > lim->max_sessions) {
        ad_failf(f, 429, "quota_exceeded", "%u sessions open, the limit", n);
        f->limit = "max_sessions";
        return -EDQUOT;
    }
    if (lim->max_memory_mib && mem + memory_mib > lim->max_memory_mib) {
        ad_failf(f, 429, "quota_exceeded", "%u MiB held, %u more would pass the limit of %u", mem,
                 memory_mib, lim->max_memory_mib);
        f->limit = "max_memory_mib";
        return -EDQUOT;
    }
    if (lim->max_vcpus && cpus + vcpus > lim->max_vcpus) {
        ad_failf(f, 429, "quota_exceeded", "%u vCPUs held, %u more would pass the limit of %u",
                 cpus, vcpus, lim->max_vcpus);
        f->limit = "max_vcpus";
        return -EDQUOT;
    }
    return 0;
}

/* ---- network on request ---- */

/* Whether name ends with "." suffix, or is suffix itself (case aside). */
static bool under(const char *name, const char *suffix)
{
    size_t n = strlen(name), m = strlen(suffix);
    if (n == m)
        return !strcasecmp(name, suffix);
    return n > m && name[n - m - 1] == '.' && !strcasecmp(name + n - m, suffix);
}

/* Whether the config's net_allow_max lets a session allow pattern (a host or "*.suffix"): a
 * host by the same host or a pattern over it, a pattern only by a pattern as wide or wider. */
static bool net_permitted(const char *pattern)
{
    for (char **p = ad_cfg.net_allow_max; p && *p; p++) {
        bool wild = !strncmp(*p, "*.", 2), want_wild = !strncmp(pattern, "*.", 2);
        if (!wild && !want_wild && !strcasecmp(*p, pattern))
            return true;
        if (wild && under(want_wild ? pattern + 2 : pattern, *p + 2))
            return true;
    }
    return false;
}

/* net: {"allow": [HOST, "*.suffix", ...], "bytes_max": N}; into o (allow points into c->net),
 * *allow_out owns the array. An empty or absent allow list: no network. */
static int check_net(const struct ad_create *c, const struct ad_limits *lim, al_net_opts *o,
                     const char ***allow_out, struct ad_fail *f)
{
    *allow_out = NULL;
    if (!c->net || cJSON_IsNull(c->net))
        return 0;
    cJSON *allow = cJSON_GetObjectItemCaseSensitive(c->net, "allow");
    cJSON *bytes = cJSON_GetObjectItemCaseSensitive(c->net, "bytes_max");
    if (!cJSON_IsObject(c->net) || (allow && !cJSON_IsArray(allow)) ||
        (bytes && (!cJSON_IsNumber(bytes) || bytes->valuedouble < 1 ||
                   bytes->valuedouble > 9007199254740992.0 ||
                   bytes->valuedouble != (double)(uint64_t)bytes->valuedouble))) {
        ad_failf(f, 400, "invalid",
                 "net: {\"allow\": [host or *.suffix, ...], \"bytes_max\": a whole number > 0}");
        return -EINVAL;
    }
    int n = allow ? cJSON_GetArraySize(allow) : 0;
    if (n > AL_NET_ALLOW_MAX) {
        ad_failf(f, 400, "invalid", "net.allow: at most %d entries", AL_NET_ALLOW_MAX);
        return -EINVAL;
    }
    cJSON *h;
    cJSON_ArrayForEach(h, allow)
    {
        if (!cJSON_IsString(h) || !al_net_host_pattern_ok(h->valuestring)) {
            ad_failf(f, 400, "invalid", "net.allow: '%.200s' is not a host name or *.suffix",
                     cJSON_IsString(h) ? h->valuestring : "(not a string)");
            return -EINVAL;
        }
        if (!net_permitted(h->valuestring)) {
            ad_failf(f, 403, "net_host_forbidden",
                     "net.allow: host %.200s is outside what this daemon lets a session allow "
                     "(net_allow_max)",
                     h->valuestring);
            return -EPERM;
        }
    }
    uint64_t cap = lim->net_bytes_max ? lim->net_bytes_max : AL_NET_BYTES_MAX_DEFAULT;
    uint64_t want = bytes ? (uint64_t)bytes->valuedouble : 0;
    if (want > cap) {
        ad_failf(f, 429, "quota_exceeded", "net.bytes_max over %llu", (unsigned long long)cap);
        f->limit = "net_bytes_max";
        return -EDQUOT;
    }
    if (!n)
        return 0;
    const char **list = calloc((size_t)n + 1, sizeof(*list));
    if (!list) {
        ad_failf(f, 500, "internal", "out of memory");
        return -ENOMEM;
    }
    int i = 0;
    cJSON_ArrayForEach(h, allow) list[i++] = h->valuestring;
    o->allow = list;
    o->bytes_max = want ? want : cap < AL_NET_BYTES_MAX_DEFAULT ? cap : AL_NET_BYTES_MAX_DEFAULT;
    *allow_out = list;
    return 0;
}

static int check_create(const struct ad_create *c, const struct ad_limits *lim, struct ad_fail *f)
{
    al_error derr = {0};
    if (al_display_size_check(c->display_width, c->display_height, &derr) < 0) {
        ad_failf(f, 400, "invalid", "%s", derr.msg);
        return -EINVAL;
    }
    if (c->vcpus > VCPUS_MAX) {
        ad_failf(f, 400, "invalid", "vcpus: at most %d", VCPUS_MAX);
        return -EINVAL;
    }
    if (c->memory_mib && (c->memory_mib < 64 || c->memory_mib > 65536)) {
        ad_failf(f, 400, "invalid", "memory_mib: 64 to 65536");
        return -EINVAL;
    }
    if (lim->max_lifetime_s && c->lifetime_s > lim->max_lifetime_s) {
        ad_failf(f, 429, "quota_exceeded", "lifetime_s over %u", lim->max_lifetime_s);
        f->limit = "max_lifetime_s";
        return -EDQUOT;
    }
    if (lim->max_idle_s && c->idle_s > lim->max_idle_s) {
        ad_failf(f, 429, "quota_exceeded", "idle_timeout_s over %u", lim->max_idle_s);
        f->limit = "max_idle_s";
        return -EDQUOT;
    }
    if (c->labels) {
        if (!cJSON_IsObject(c->labels) || cJSON_GetArraySize(c->labels) > LABELS_MAX) {
            ad_failf(f, 400, "invalid", "labels: an object of at most %d strings", LABELS_MAX);
            return -EINVAL;
        }
        cJSON *l;
        cJSON_ArrayForEach(l, c->labels)
        {
            if (!cJSON_IsString(l) || strlen(l->valuestring) > LABEL_LEN_MAX ||
                strlen(l->string) > LABEL_LEN_MAX) {
                ad_failf(f, 400, "invalid", "labels: string values, %d bytes each at most",
                         LABEL_LEN_MAX);
                return -EINVAL;
            }
        }
    }
    return 0;
}

/* What a create that failed took back: its cancel pipe, its slot, the session, the host's room.
 * Returns r. */
static int create_undo(int pfd[2], struct slot *sl, struct ad_session *s, int host, unsigned mem,
                       int r)
{
    if (pfd[0] >= 0)
        close(pfd[0]);
    if (pfd[1] >= 0)
        close(pfd[1]);
    free(sl);
    free(s);
    ad_host_release(host, mem);
    return r;
}

int ad_owner_image(const char *owner, const char *name, char *out, size_t len)
{
    unsigned char d[32];
    char hex[11];
    if (strlen(name) > AD_OWN_IMAGE_NAME_MAX ||
        !EVP_Digest(owner, strlen(owner), d, NULL, EVP_sha256(), NULL))
        return -EINVAL;
    for (size_t i = 0; i < 5; i++)
        snprintf(hex + 2 * i, 3, "%02x", d[i]);
    return snprintf(out, len, AD_OWN_IMAGE_PREFIX "%.10s-%s", hex, name) < (int)len ? 0
                                                                                    : -ENAMETOOLONG;
}

static bool image_exists(const char *name)
{
    char store[AL_PATH_MAX], manifest[AL_PATH_MAX];
    struct stat st;
    al_error ignored = {0};
    return al_image_store_dir(store, sizeof(store), &ignored) == 0 &&
           snprintf(manifest, sizeof(manifest), "%s/%s/manifest.json", store, name) <
               (int)sizeof(manifest) &&
           stat(manifest, &st) == 0;
}

const char *ad_image_for(const char *owner, const char *name, char *buf, size_t len)
{
    if (ad_owner_image(owner, name, buf, len) == 0 && image_exists(buf))
        return buf;
    snprintf(buf, len, "%s", name);
    return buf;
}

const char *ad_image_resolve(const char *owner, const char *name, char *buf, size_t len)
{
    char mine[64] = "";
    ad_owner_image(owner, "", mine, sizeof(mine)); /* "own-HEX-": its own images' prefix */
    if (!strncmp(name, AD_OWN_IMAGE_PREFIX, strlen(AD_OWN_IMAGE_PREFIX)) &&
        strncmp(name, mine, strlen(mine)) != 0)
        return NULL;
    ad_image_for(owner, name, buf, len);
    return image_exists(buf) ? buf : NULL;
}

struct snap_find {
    const char *name;
    bool found;
    al_snapshot_info info;
};

static void snap_found(void *ctx, const al_snapshot_info *si)
{
    struct snap_find *sf = ctx;
    if (!strcmp(si->name, sf->name)) {
        sf->found = true;
        sf->info = *si;
    }
}

int ad_session_create(const char *owner, const struct ad_limits *lim, const struct ad_create *c,
                      struct ad_session **out, struct ad_fail *f)
{
    al_error err = {0};
    int r = check_create(c, lim, f);
    if (r < 0)
        return r;
    al_net_opts net = {0};
    _cleanup_free_ const char **net_allow = NULL;
    if ((r = check_net(c, lim, &net, &net_allow, f)) < 0)
        return r;
    int transport = AL_TRANSPORT_IMAGE; /* enum al_transport */
    if (c->transport && (r = al_transport_parse(c->transport, &transport, &err)) < 0) {
        ad_failf(f, 400, "invalid", "%s", err.msg);
        return r;
    }
    enum al_checkpoint_policy policy = AL_CHECKPOINT_NEVER;
    if (c->checkpoint_policy &&
        (r = al_checkpoint_policy_parse(c->checkpoint_policy, &policy, &err)) < 0) {
        ad_failf(f, 400, "invalid", "%s", err.msg);
        return r;
    }
    char own[64];
    const char *image = c->fork    ? c->image
                        : c->image ? ad_image_resolve(owner, c->image, own, sizeof(own))
                                   : al_image_default();
    struct snap_find sf = {.name = c->snapshot};
    if (c->snapshot) { /* its image and memory are the snapshot's */
        al_error e = {0};
        al_snapshot_list(c->snapshot, snap_found, &sf, &e);
        if (!sf.found) {
            ad_failf(f, 404, "not_found", "no snapshot '%s'", c->snapshot);
            return -ENOENT;
        }
        image = sf.info.image;
    }
    if (!image) {
        ad_failf(f, 400, "invalid", "unknown image '%s'", c->image);
        return -ENOENT;
    }
    /* The memory a session will take, for the quota, before it boots. */
    al_image img = AL_IMAGE_INIT;
    if ((r = al_image_load(image, &img, &err)) < 0) {
        ad_fail_from(f, r, &err);
        if (r == -ENOENT)
            f->status = 400;
        return r;
    }
    unsigned mem = c->snapshot      ? sf.info.memory_mib
                   : c->memory_mib  ? c->memory_mib
                   : img.memory_mib ? img.memory_mib
                                    : 256;
    enum al_transport img_transport = img.transport;
    al_image_free(&img);

    /* Network on request and SSH work on the local host only (their forwards are here). */
    bool ssh = transport == AL_TRANSPORT_SSH ||
               (transport == AL_TRANSPORT_IMAGE && img_transport == AL_TRANSPORT_SSH);
    const char *uri = NULL;
    int host = ad_host_place(mem, net.allow || ssh, &uri, f);
    if (host < 0)
        return -EAGAIN;
    struct slot *sl = calloc(1, sizeof(*sl));
    struct ad_session *s = calloc(1, sizeof(*s));
    int pfd[2] = {-1, -1};
    if (!sl || !s || pipe2(pfd, O_CLOEXEC | O_NONBLOCK) < 0) {
        ad_failf(f, 500, "internal", "out of memory or descriptors");
        return create_undo(pfd, sl, s, host, mem, -ENOMEM);
    }
    snprintf(sl->owner, sizeof(sl->owner), "%s", owner);
    sl->memory_mib = mem;
    sl->vcpus = c->vcpus ? c->vcpus : 1; /* the library's default */
    pthread_mutex_lock(&lock);
    snprintf(sl->name, sizeof(sl->name), "%s", c->name ? c->name : "");
    r = stopping ? -ESHUTDOWN : quota(owner, lim, mem, sl->vcpus, c->name, f);
    if (r == 0)
        r = fds_check(f);
    if (r == -ESHUTDOWN)
        ad_failf(f, 503, "stopping", "the daemon is stopping");
    if (r == 0) {
        sl->next = slots;
        slots = sl;
    }
    pthread_mutex_unlock(&lock);
    if (r < 0) {
        return create_undo(pfd, sl, s, host, mem, r);
    }

    /* Volumes: the owner's, as the library names them ("LIB:/PATH[:ro]"). */
    char vspec[AL_VOLS_MAX][420];
    const char *vspecs[AL_VOLS_MAX + 1] = {0};
    size_t nv = 0;
    const cJSON *vx;
    cJSON_ArrayForEach(vx, c->volumes)
    {
        const char *vn = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(vx, "name"));
        const char *vp = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(vx, "path"));
        char lib[160];
        if (nv >= AL_VOLS_MAX || !vn || !vp || strlen(vp) > 255 ||
            ad_snapshot_name(owner, vn, lib, sizeof(lib)) < 0) {
            ad_failf(f, 400, "invalid",
                     "volumes: at most %d of {\"name\", \"path\", \"read_only\"}, the names "
                     "of volumes of yours",
                     AL_VOLS_MAX);
            return create_undo(pfd, sl, s, host, mem, -EINVAL);
        }
        snprintf(vspec[nv], sizeof(vspec[nv]), "%s:%s%s", lib, vp,
                 cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(vx, "read_only")) ? ":ro" : "");
        vspecs[nv] = vspec[nv];
        nv++;
    }
    al_session_opts o = {
        .struct_size = sizeof(al_session_opts),
        .volumes = nv ? vspecs : NULL,
        .fork_keep_identity = c->fork_keep_identity,
        .connect_uri = uri,
        .image = image,
        .memory_mib = mem,
        .vcpus = c->vcpus,
        .quiet = true,
        .cancel_fd = pfd[0],
        .transport = transport,
        .checkpoints = c->checkpoints || policy != AL_CHECKPOINT_NEVER,
        .disk_budget_bytes = lim->disk_budget_bytes,
        .net = net,
        .display = c->display,
        .display_width = c->display_width,
        .display_height = c->display_height,
    };
    /* Kept by the library for the next start of this daemon (network on request, SSH and other
     * hosts' sessions cannot be: they end with it). */
    bool keep = ad_cfg.keep_sessions && !net.allow && !ssh && !uri && ad_host_local(host) &&
                !c->fork && !c->snapshot && !c->volumes;
    if (keep)
        o.keep = ad_store_keeper();
    if (c->auto_pause_s && !keep) {
        pthread_mutex_lock(&lock);
        for (struct slot **p = &slots; *p; p = &(*p)->next)
            if (*p == sl) {
                *p = sl->next;
                break;
            }
        pthread_mutex_unlock(&lock);
        ad_failf(f, 400, "invalid",
                 "auto_pause_s: this session cannot be paused (network on request, SSH, another "
                 "host, or keep_sessions off)");
        return create_undo(pfd, sl, s, host, mem, -EINVAL);
    }
    uint64_t t0 = ad_now_ms();
    pthread_mutex_lock(&lock);
    /* The pool's sessions run on the default connection, a local host. */
    al_session *as = stopping || !ad_host_local(host) || c->fork || c->snapshot || c->volumes
                         ? NULL
                         : pool_take(&o, lim->disk_budget_bytes);
    pthread_mutex_unlock(&lock);
    bool pooled = as != NULL;
    ad_metrics_booting(1);
    r = as            ? 0
        : c->fork     ? al_fork_open(c->fork, &o, &as, &err)
        : c->snapshot ? al_snapshot_open(c->snapshot, &o, &as, &err)
                      : al_session_open(&o, &as, &err);
    ad_metrics_booting(-1);
    /* restored: from a warm-start template (the pool's sessions are), else booted cold */
    ad_metrics_boot(r == 0, r == 0 && al_session_restored(as), ad_now_ms() - t0);
    pthread_mutex_lock(&lock);
    if (r < 0 || stopping) {
        for (struct slot **p = &slots; *p; p = &(*p)->next)
            if (*p == sl) {
                *p = sl->next;
                break;
            }
        pthread_mutex_unlock(&lock);
        if (r < 0) {
            ad_fail_from(f, r, &err);
            if (f->status == 500)
                ad_failf(f, 503, "boot_failed", "%s", err.msg);
        } else {
            ad_metrics_closing();
            al_session_close(as);
            ad_metrics_closed(ad_now_ms() - t0);
            ad_failf(f, 503, "stopping", "the daemon is stopping");
            r = -ESHUTDOWN;
        }
        return create_undo(pfd, sl, s, host, mem, r);
    }
    s->s = as;
    s->host = host;
    snprintf(s->id, sizeof(s->id), "%s", al_session_name(as));
    snprintf(s->owner, sizeof(s->owner), "%s", owner);
    snprintf(s->image, sizeof(s->image), "%s", image);
    snprintf(s->transport, sizeof(s->transport), "%s",
             transport == AL_TRANSPORT_IMAGE
                 ? (img_transport == AL_TRANSPORT_SSH ? "ssh" : "virtio")
                 : (transport == AL_TRANSPORT_SSH ? "ssh" : "virtio"));
    s->memory_mib = mem;
    s->vcpus = al_session_vcpus(as);
    s->policy = policy;
    s->checkpoints = o.checkpoints;
    s->display = al_session_has_display(as);
    s->pooled = pooled;
    s->labels = c->labels ? cJSON_Duplicate(c->labels, true) : cJSON_CreateObject();
    s->volumes = c->volumes ? cJSON_Duplicate(c->volumes, true) : NULL;
    if (net.allow) {
        s->net = cJSON_CreateObject();
        cJSON *a = cJSON_AddArrayToObject(s->net, "allow");
        for (const char *const *h = net.allow; *h; h++)
            cJSON_AddItemToArray(a, cJSON_CreateString(*h));
        cJSON_AddNumberToObject(s->net, "bytes_max", (double)net.bytes_max);
    }
    s->created = time(NULL);
    s->created_ms = s->used_ms = ad_now_ms();
    s->idle_s = c->idle_s ? c->idle_s : lim->max_idle_s;
    s->lifetime_s = c->lifetime_s ? c->lifetime_s : lim->max_lifetime_s;
    s->deadline_ms = s->lifetime_s ? s->created_ms + s->lifetime_s * 1000ull : UINT64_MAX;
    s->cancel_rd = pfd[0];
    s->cancel_wr = pfd[1];
    if (c->e2b_token) {
        snprintf(s->e2b_token, sizeof(s->e2b_token), "%s", c->e2b_token);
        snprintf(s->e2b_traffic, sizeof(s->e2b_traffic), "%s", c->e2b_traffic);
        snprintf(s->e2b_template, sizeof(s->e2b_template), "%s", c->e2b_template);
        s->e2b_env = c->e2b_env ? cJSON_Duplicate(c->e2b_env, true) : NULL;
    }
    s->kept = keep && !pooled && !c->front_held;
    s->auto_pause_s = c->front_held ? 0 : c->auto_pause_s;
    s->pause_at_end = c->pause_at_end && s->kept;
    s->on_end = c->on_end;
    s->on_end_ctx = c->on_end_ctx;
    snprintf(s->name, sizeof(s->name), "%s", sl->name);
    s->refs = 1;
    sl->s = s;
    pthread_mutex_unlock(&lock);
    ad_session_save(s);
    ad_log("session %s of %s started (%s, %u MiB, %llums%s)", s->id, owner, image, mem,
           (unsigned long long)(ad_now_ms() - t0),
           pooled                    ? ", from the pool"
           : al_session_restored(as) ? ", restored"
                                     : "");
    *out = s;
    return 0;
}

struct fork_job {
    struct ad_session *s; /* made, or NULL and fail says why */
    struct ad_fail fail;
};

struct fork_run {
    struct ad_session *src;
    const char *owner;
    const struct ad_limits *lim;
    const struct ad_fork_req *req;
    al_fork *fk;
    struct fork_job *jobs;
    unsigned next; /* atomic: the next fork to start */
};

/* Starts forks of run->fk, taking their numbers one at a time, until none is left. */
static void *fork_worker(void *arg)
{
    struct fork_run *run = arg;
    const struct ad_fork_req *req = run->req;
    const struct ad_session *src = run->src;
    for (;;) {
        unsigned i = __atomic_fetch_add(&run->next, 1, __ATOMIC_RELAXED);
        if (i >= req->count)
            return NULL;
        struct fork_job *job = &run->jobs[i];
        struct ad_create c = req->c;
        char name[64], token[65], traffic[65];
        if (req->c.name) {
            snprintf(name, sizeof(name), "%s-%u", req->c.name, i + 1);
            c.name = name;
        }
        c.fork = run->fk;
        c.fork_keep_identity = req->keep_identity;
        c.image = src->image;
        c.memory_mib = src->memory_mib;
        c.vcpus = src->vcpus;
        c.display = src->display;
        c.checkpoints = src->checkpoints;
        c.transport = NULL;
        c.net = src->net;         /* the same rules; a proxy, a key and a byte count of its own */
        c.volumes = src->volumes; /* listed as the source's; each fork has its own copies */
        c.labels = c.labels ? c.labels : src->labels;
        if (src->e2b_token[0]) { /* an E2B sandbox's: tokens of its own */
            if (ad_random_hex(token, 32) < 0 || ad_random_hex(traffic, 32) < 0) {
                ad_failf(&job->fail, 500, "internal", "no random bytes for the sandbox's tokens");
                continue;
            }
            c.e2b_token = token;
            c.e2b_traffic = traffic;
            c.e2b_template = src->e2b_template;
            c.e2b_env = src->e2b_env;
        }
        if (ad_session_create(run->owner, run->lim, &c, &job->s, &job->fail) < 0)
            job->s = NULL;
    }
}

int ad_session_fork(struct ad_session *src, const char *owner, const struct ad_limits *lim,
                    const struct ad_fork_req *req,
                    void (*each)(void *ctx, struct ad_session *fork, const struct ad_fail *why),
                    void *ctx, struct ad_fail *f)
{
    if (req->count < 1 || req->count > AD_FORK_MAX) {
        ad_failf(f, 400, "invalid", "count: 1 to %d", AD_FORK_MAX);
        return -EINVAL;
    }
    if (req->c.name && strlen(req->c.name) + 4 > 63) {
        ad_failf(f, 400, "invalid", "name: at most 59 characters (each fork is NAME-I)");
        return -EINVAL;
    }
    al_fork *fk = NULL;
    al_error err = {0};
    /* Taken before the save: what ran at its moment runs on in every fork. */
    cJSON *runs = ad_runs_record(src);
    int r = al_session_fork_save(src->s, &fk, &err);
    if (r < 0) {
        cJSON_Delete(runs);
        ad_fail_from(f, r, &err);
        if (f->status == 500 && (r == -EOPNOTSUPP || r == -EINVAL || r == -E2BIG))
            f->status = 400;
        return r;
    }
    unsigned pause_ms = 0;
    al_fork_timing(fk, &pause_ms, NULL);
    ad_log("session %s of %s saved for %u fork(s) (stood still %u ms)", src->id, owner, req->count,
           pause_ms);
    /* The forks start two or more at a time (one per CPU): a restore is mostly QEMU and
     * libvirt starting, which one at a time leaves a CPU idle. Their entries keep their order. */
    struct fork_job *jobs = calloc(req->count, sizeof(*jobs));
    if (!jobs) {
        cJSON_Delete(runs);
        al_fork_free(fk);
        ad_failf(f, 500, "internal", "out of memory");
        return -ENOMEM;
    }
    struct fork_run run = {
        .src = src, .owner = owner, .lim = lim, .req = req, .fk = fk, .jobs = jobs};
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned nthreads = cpus < 2 ? 2 : (unsigned)cpus;
    if (nthreads > req->count)
        nthreads = req->count;
    pthread_t threads[AD_FORK_MAX];
    unsigned started = 0;
    for (; started < nthreads; started++)
        if (pthread_create(&threads[started], NULL, fork_worker, &run) != 0)
            break;
    if (!started)
        fork_worker(&run);
    for (unsigned i = 0; i < started; i++)
        pthread_join(threads[i], NULL);
    for (unsigned i = 0; i < req->count; i++) {
        struct ad_session *s = jobs[i].s;
        if (!s) {
            each(ctx, NULL, &jobs[i].fail);
            continue;
        }
        s->e2b_user = src->e2b_user;
        snprintf(s->forked_from, sizeof(s->forked_from), "%s", src->id);
        ad_runs_inherit(s, runs, src->id);
        ad_session_save(s);
        each(ctx, s, NULL);
        ad_session_put(s);
    }
    free(jobs);
    cJSON_Delete(runs);
    al_fork_free(fk);
    return 0;
}

/* ---- snapshots: the library's (al_snapshot_*), named OWNER-TAG_NAME ---- */

int ad_snapshot_name(const char *owner, const char *name, char *buf, size_t len)
{
    char tag[64];
    size_t n = 0;
    for (const char *p = owner; *p && n + 1 < sizeof(tag); p++) {
        if (!isalnum((unsigned char)*p) && *p != ':' && *p != '-' && *p != '_')
            return -EINVAL;
        tag[n++] = *p == ':' ? '-' : *p;
    }
    tag[n] = '\0';
    if (!name)
        return snprintf(buf, len, "%s_", tag) < (int)len ? 0 : -ENAMETOOLONG;
    if (strlen(name) > 63 || !al_snapshot_name_ok(name))
        return -EINVAL;
    return snprintf(buf, len, "%s_%s", tag, name) < (int)len ? 0 : -ENAMETOOLONG;
}

struct snap_tally {
    const char *skip; /* the library name being replaced: not counted */
    unsigned n;
    uint64_t bytes;
};

static void snap_count(void *ctx, const al_snapshot_info *si)
{
    struct snap_tally *t = ctx;
    if (t->skip && !strcmp(si->name, t->skip))
        return;
    t->n++;
    t->bytes += si->bytes;
}

int ad_snapshot_save(struct ad_session *s, const char *owner, const struct ad_limits *lim,
                     const char *name, bool replace, al_snapshot_info *out, struct ad_fail *f)
{
    char lib[160], prefix[80];
    if (ad_snapshot_name(owner, name, lib, sizeof(lib)) < 0 ||
        ad_snapshot_name(owner, NULL, prefix, sizeof(prefix)) < 0) {
        ad_failf(f, 400, "invalid", "name: 1 to 63 of [A-Za-z0-9._-], not starting with a dot");
        return -EINVAL;
    }
    /* One save at a time per daemon: the quota is counted, then taken. */
    static pthread_mutex_t snap_lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&snap_lock);
    struct snap_tally t = {.skip = replace ? lib : NULL};
    al_error err = {0};
    al_snapshot_list(prefix, snap_count, &t, &err);
    int r = 0;
    if (lim->max_snapshots && t.n >= lim->max_snapshots) {
        ad_failf(f, 429, "quota_exceeded", "at most %u snapshots", lim->max_snapshots);
        f->limit = "max_snapshots";
        r = -EDQUOT;
    }
    if (r == 0 && (r = al_snapshot_save(s->s, lib, replace, out, &err)) < 0) {
        ad_fail_from(f, r, &err);
        if (r == -EEXIST)
            ad_failf(f, 409, "name_taken", "a snapshot named '%s' exists", name);
        else if (f->status == 500 && (r == -EOPNOTSUPP || r == -EINVAL || r == -E2BIG))
            f->status = 400;
    }
    if (r == 0 && lim->max_snapshot_bytes && t.bytes + out->bytes > lim->max_snapshot_bytes) {
        al_snapshot_remove(lib, &err);
        ad_failf(f, 429, "quota_exceeded",
                 "the snapshots would take %llu bytes, more than max_snapshot_bytes %llu",
                 (unsigned long long)(t.bytes + out->bytes),
                 (unsigned long long)lim->max_snapshot_bytes);
        f->limit = "max_snapshot_bytes";
        r = -EDQUOT;
    }
    pthread_mutex_unlock(&snap_lock);
    if (r == 0) {
        snprintf(out->name, sizeof(out->name), "%s", name);
        ad_log("session %s of %s saved as snapshot %s (%llu bytes)", s->id, owner, name,
               (unsigned long long)out->bytes);
    }
    return r;
}

struct snap_list {
    size_t skip;
    void (*fn)(void *ctx, const al_snapshot_info *s);
    void *ctx;
};

static void snap_strip(void *ctx, const al_snapshot_info *si)
{
    struct snap_list *l = ctx;
    al_snapshot_info mine = *si;
    snprintf(mine.name, sizeof(mine.name), "%s", si->name + l->skip);
    l->fn(l->ctx, &mine);
}

void ad_snapshot_list(const char *owner, void (*fn)(void *ctx, const al_snapshot_info *s),
                      void *ctx)
{
    char prefix[80];
    if (ad_snapshot_name(owner, NULL, prefix, sizeof(prefix)) < 0)
        return;
    struct snap_list l = {.skip = strlen(prefix), .fn = fn, .ctx = ctx};
    al_error err = {0};
    al_snapshot_list(prefix, snap_strip, &l, &err);
}

/* Removes owner's NAME (what: "snapshot", "volume") with the library's rm. */
static int owned_remove(const char *owner, const char *name, const char *what,
                        int (*rm)(const char *name, al_error *err), struct ad_fail *f)
{
    char lib[160];
    al_error err = {0};
    int r = ad_snapshot_name(owner, name, lib, sizeof(lib)) < 0 ? -ENOENT : rm(lib, &err);
    if (r == -ENOENT || r == -EINVAL)
        ad_failf(f, 404, "not_found", "no %s named '%s'", what, name);
    else if (r == -EBUSY)
        ad_failf(f, 409, "in_use", "%s '%s' is attached to a session", what, name);
    else if (r < 0)
        ad_fail_from(f, r, &err);
    return r;
}

int ad_snapshot_remove(const char *owner, const char *name, struct ad_fail *f)
{
    return owned_remove(owner, name, "snapshot", al_snapshot_remove, f);
}

static void snap_drop(void *ctx, const al_snapshot_info *si)
{
    (void)ctx;
    al_error err = {0};
    al_snapshot_remove(si->name, &err);
}

void ad_snapshots_drop(const char *owner)
{
    char prefix[80];
    al_error err = {0};
    if (ad_snapshot_name(owner, NULL, prefix, sizeof(prefix)) == 0)
        al_snapshot_list(prefix, snap_drop, NULL, &err);
}

/* ---- volumes: the library's (al_vol_*), named as snapshots are ---- */

struct vol_tally {
    uint64_t bytes;
};

static void vol_count(void *ctx, const al_vol_info *v)
{
    ((struct vol_tally *)ctx)->bytes += v->size;
}

int ad_volume_create(const char *owner, const struct ad_limits *lim, const char *name,
                     uint64_t size, al_vol_info *out, struct ad_fail *f)
{
    char lib[160], prefix[80];
    if (ad_snapshot_name(owner, name, lib, sizeof(lib)) < 0 ||
        ad_snapshot_name(owner, NULL, prefix, sizeof(prefix)) < 0) {
        ad_failf(f, 400, "invalid", "name: 1 to 63 of [A-Za-z0-9._-], not starting with a dot");
        return -EINVAL;
    }
    static pthread_mutex_t vol_lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&vol_lock);
    struct vol_tally t = {0};
    al_error err = {0};
    al_vol_list(prefix, vol_count, &t, &err);
    int r = 0;
    if (lim->max_volume_bytes && t.bytes + size > lim->max_volume_bytes) {
        ad_failf(f, 429, "quota_exceeded",
                 "the volumes would be %llu bytes, more than max_volume_bytes %llu",
                 (unsigned long long)(t.bytes + size), (unsigned long long)lim->max_volume_bytes);
        f->limit = "max_volume_bytes";
        r = -EDQUOT;
    }
    if (r == 0 && (r = al_vol_create(lib, size, &err)) < 0) {
        ad_fail_from(f, r, &err);
        if (r == -EEXIST)
            ad_failf(f, 409, "name_taken", "a volume named '%s' exists", name);
        else if (r == -EINVAL)
            f->status = 400;
    }
    pthread_mutex_unlock(&vol_lock);
    if (r == 0) {
        *out = (al_vol_info)AL_VOL_INFO_INIT;
        snprintf(out->name, sizeof(out->name), "%s", name);
        out->size = (size + (1u << 20) - 1) & ~((uint64_t)(1u << 20) - 1);
        out->created = time(NULL);
        ad_log("volume %s of %s made (%llu bytes)", name, owner, (unsigned long long)out->size);
    }
    return r;
}

struct vol_list {
    size_t skip;
    void (*fn)(void *ctx, const al_vol_info *v);
    void *ctx;
};

static void vol_strip(void *ctx, const al_vol_info *v)
{
    struct vol_list *l = ctx;
    al_vol_info mine = *v;
    snprintf(mine.name, sizeof(mine.name), "%s", v->name + l->skip);
    l->fn(l->ctx, &mine);
}

void ad_volume_list(const char *owner, void (*fn)(void *ctx, const al_vol_info *v), void *ctx)
{
    char prefix[80];
    if (ad_snapshot_name(owner, NULL, prefix, sizeof(prefix)) < 0)
        return;
    struct vol_list l = {.skip = strlen(prefix), .fn = fn, .ctx = ctx};
    al_error err = {0};
    al_vol_list(prefix, vol_strip, &l, &err);
}

int ad_volume_remove(const char *owner, const char *name, struct ad_fail *f)
{
    return owned_remove(owner, name, "volume", al_vol_remove, f);
}

int ad_session_extend(struct ad_session *s, unsigned seconds, const struct ad_limits *lim,
                      struct ad_fail *f)
{
    uint64_t want = ad_now_ms() + seconds * 1000ull;
    if (lim->max_lifetime_s && want > s->created_ms + lim->max_lifetime_s * 1000ull) {
        ad_failf(f, 429, "quota_exceeded", "a session lives at most %u s", lim->max_lifetime_s);
        f->limit = "max_lifetime_s";
        return -EDQUOT;
    }
    pthread_mutex_lock(&lock);
    s->deadline_ms = want;
    pthread_mutex_unlock(&lock);
    ad_session_save(s);
    return 0;
}

/* ---- sessions that last: the store, pause and resume, the restart ---- */

bool ad_session_name_ok(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > 63 || !strncmp(name, "airlock-", 8))
        return false;
    return strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == n;
}

struct ad_session *ad_session_by_name(const char *owner, const char *name)
{
    struct ad_session *found = NULL;
    pthread_mutex_lock(&lock);
    for (struct slot *sl = slots; sl && name[0]; sl = sl->next)
        if (sl->s && !sl->s->gone && !strcmp(sl->s->owner, owner) && !strcmp(sl->s->name, name)) {
            found = sl->s;
            found->refs++;
            break;
        }
    pthread_mutex_unlock(&lock);
    return found;
}

/* What the store keeps of s: all a restart needs to serve it as before. Called with a
 * reference. */
static cJSON *record_of(struct ad_session *s)
{
    cJSON *o = cJSON_CreateObject();
    pthread_mutex_lock(&lock);
    cJSON_AddStringToObject(o, "name", s->name);
    cJSON_AddStringToObject(o, "image", s->image);
    cJSON_AddNumberToObject(o, "memory_mib", s->memory_mib);
    cJSON_AddNumberToObject(o, "vcpus", s->vcpus);
    cJSON_AddStringToObject(o, "transport", s->transport);
    cJSON_AddStringToObject(o, "checkpoint_policy", al_checkpoint_policy_name(s->policy));
    cJSON_AddBoolToObject(o, "checkpoints", s->checkpoints);
    cJSON_AddBoolToObject(o, "display", s->display);
    cJSON_AddItemToObject(o, "labels", cJSON_Duplicate(s->labels, true));
    cJSON_AddNumberToObject(o, "created", (double)s->created);
    cJSON_AddNumberToObject(o, "idle_s", s->idle_s);
    cJSON_AddNumberToObject(o, "lifetime_s", s->lifetime_s);
    cJSON_AddNumberToObject(o, "deadline",
                            s->deadline_ms == UINT64_MAX ? 0 : (double)wall_of(s->deadline_ms));
    cJSON_AddBoolToObject(o, "paused", s->paused);
    cJSON_AddNumberToObject(o, "auto_pause_s", s->auto_pause_s);
    cJSON_AddBoolToObject(o, "pause_at_end", s->pause_at_end);
    if (s->e2b_token[0]) {
        cJSON_AddStringToObject(o, "e2b_token", s->e2b_token);
        cJSON_AddStringToObject(o, "e2b_traffic", s->e2b_traffic);
        cJSON_AddStringToObject(o, "e2b_template", s->e2b_template);
        cJSON_AddBoolToObject(o, "e2b_user", s->e2b_user);
        if (s->e2b_env)
            cJSON_AddItemToObject(o, "e2b_env", cJSON_Duplicate(s->e2b_env, true));
    }
    pthread_mutex_unlock(&lock);
    cJSON_AddItemToObject(o, "runs", ad_runs_record(s));
    return o;
}

void ad_session_save(struct ad_session *s)
{
    if (!s->kept || s->detaching || s->gone)
        return;
    _cleanup_cjson_ cJSON *rec = record_of(s);
    if (ad_store_put(s->id, s->owner, s->name, rec) < 0)
        ad_log("session %s: cannot write its record to the store", s->id);
}

int ad_session_pause(struct ad_session *s, struct ad_fail *f)
{
    if (!s->kept || !s->s) {
        ad_failf(f, 409, "not_kept",
                 "this session cannot be paused (network on request, SSH, another host, or "
                 "keep_sessions off)");
        return -EINVAL;
    }
    al_error err = {0};
    pthread_mutex_lock(&lock);
    bool already = s->paused;
    pthread_mutex_unlock(&lock);
    if (already) {
        ad_failf(f, 409, "paused", "the session is paused already");
        return -EALREADY;
    }
    uint64_t t0 = ad_now_ms();
    int r = al_session_pause(s->s, &err);
    if (r < 0) {
        ad_fail_from(f, r, &err);
        if (r == -ENOSPC || r == -EDQUOT)
            ad_failf(f, 507, "no_space", "%s", err.msg);
        return r;
    }
    pthread_mutex_lock(&lock);
    s->paused = true;
    pthread_mutex_unlock(&lock);
    ad_session_save(s);
    ad_log("session %s of %s paused (%llums)", s->id, s->owner,
           (unsigned long long)(ad_now_ms() - t0));
    return 0;
}

int ad_session_resume(struct ad_session *s, struct ad_fail *f)
{
    pthread_mutex_lock(&lock);
    bool paused = s->paused;
    pthread_mutex_unlock(&lock);
    if (!paused || !s->s) {
        ad_failf(f, 409, "not_paused", "the session is not paused");
        return -EINVAL;
    }
    al_error err = {0};
    uint64_t t0 = ad_now_ms();
    int r = al_session_resume(s->s, &err);
    if (r == -EBADMSG || r == -ESTALE) {
        /* Its saved state is not ours (or not this QEMU's): never loaded; the session is lost. */
        pthread_mutex_lock(&lock);
        s->lost = true;
        snprintf(s->lost_why, sizeof(s->lost_why), "%.250s", err.msg);
        pthread_mutex_unlock(&lock);
        ad_log("session %s of %s lost: %s", s->id, s->owner, err.msg);
    }
    if (r < 0) {
        ad_fail_from(f, r, &err);
        if (r == -EBADMSG || r == -ESTALE)
            ad_failf(f, 502, "lost", "%s", err.msg);
        return r;
    }
    pthread_mutex_lock(&lock);
    s->paused = false;
    s->used_ms = ad_now_ms();
    pthread_mutex_unlock(&lock);
    ad_runs_resume(s, NULL);
    ad_session_save(s);
    ad_log("session %s of %s resumed (%llums)", s->id, s->owner,
           (unsigned long long)(ad_now_ms() - t0));
    return 0;
}

static const char *rstr(const cJSON *j, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static double rnum(const cJSON *j, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

/* One session of the store taken back at start: its VM through the library, its runs adopted;
 * one the library cannot take back is kept as lost, with the reason, until it is deleted. */
static void restore_one(void *ctx, const char *id, const char *owner, const cJSON *rec)
{
    (void)ctx;
    struct slot *sl = calloc(1, sizeof(*sl));
    struct ad_session *s = calloc(1, sizeof(*s));
    int pfd[2] = {-1, -1};
    if (!sl || !s || pipe2(pfd, O_CLOEXEC | O_NONBLOCK) < 0) {
        free(sl);
        free(s);
        ad_log("session %s: cannot take it back: out of memory or descriptors", id);
        return;
    }
    snprintf(s->id, sizeof(s->id), "%s", id);
    snprintf(s->owner, sizeof(s->owner), "%s", owner);
    snprintf(s->name, sizeof(s->name), "%s", rstr(rec, "name"));
    snprintf(s->image, sizeof(s->image), "%s", rstr(rec, "image"));
    snprintf(s->transport, sizeof(s->transport), "%s", rstr(rec, "transport"));
    s->memory_mib = (unsigned)rnum(rec, "memory_mib");
    s->vcpus = (unsigned)rnum(rec, "vcpus");
    al_error ignored = {0};
    if (al_checkpoint_policy_parse(rstr(rec, "checkpoint_policy"), &s->policy, &ignored) < 0)
        s->policy = AL_CHECKPOINT_NEVER;
    s->checkpoints = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(rec, "checkpoints"));
    s->display = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(rec, "display"));
    const cJSON *labels = cJSON_GetObjectItemCaseSensitive(rec, "labels");
    s->labels = cJSON_IsObject(labels) ? cJSON_Duplicate(labels, true) : cJSON_CreateObject();
    s->created = (int64_t)rnum(rec, "created");
    s->idle_s = (unsigned)rnum(rec, "idle_s");
    s->lifetime_s = (unsigned)rnum(rec, "lifetime_s");
    int64_t deadline = (int64_t)rnum(rec, "deadline"), now_s = time(NULL);
    s->created_ms = s->used_ms = ad_now_ms();
    s->deadline_ms = !deadline          ? UINT64_MAX
                     : deadline > now_s ? ad_now_ms() + (uint64_t)(deadline - now_s) * 1000u
                                        : ad_now_ms();
    s->paused = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(rec, "paused"));
    s->auto_pause_s = (unsigned)rnum(rec, "auto_pause_s");
    s->pause_at_end = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(rec, "pause_at_end"));
    s->kept = true;
    s->cancel_rd = pfd[0];
    s->cancel_wr = pfd[1];
    if (rstr(rec, "e2b_token")[0]) {
        snprintf(s->e2b_token, sizeof(s->e2b_token), "%s", rstr(rec, "e2b_token"));
        snprintf(s->e2b_traffic, sizeof(s->e2b_traffic), "%s", rstr(rec, "e2b_traffic"));
        snprintf(s->e2b_template, sizeof(s->e2b_template), "%s", rstr(rec, "e2b_template"));
        s->e2b_user = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(rec, "e2b_user"));
        const cJSON *env = cJSON_GetObjectItemCaseSensitive(rec, "e2b_env");
        s->e2b_env = cJSON_IsObject(env) ? cJSON_Duplicate(env, true) : NULL;
    }
    const char *uri = NULL;
    struct ad_fail f;
    s->host = ad_host_place(s->memory_mib, true, &uri, &f);
    if (s->host < 0)
        s->host = 0;
    al_reattach_opts o = AL_REATTACH_OPTS_INIT;
    o.name = id;
    o.keeper = ad_store_keeper();
    o.cancel_fd = pfd[0];
    o.quiet = true;
    al_error err = {0};
    uint64_t t0 = ad_now_ms();
    int r = al_session_reattach(&o, &s->s, &err);
    if (r < 0) {
        s->s = NULL;
        s->lost = true;
        snprintf(s->lost_why, sizeof(s->lost_why), "not taken back after the restart: %.200s",
                 err.msg);
        ad_log("session %s of %s lost: %s", id, owner, err.msg);
    } else {
        s->paused = al_session_paused(s->s);
    }
    snprintf(sl->owner, sizeof(sl->owner), "%s", owner);
    snprintf(sl->name, sizeof(sl->name), "%s", s->name);
    sl->memory_mib = s->memory_mib;
    sl->vcpus = s->vcpus ? s->vcpus : 1;
    pthread_mutex_lock(&lock);
    s->refs = 1; /* restore_one's, until the runs are back */
    sl->s = s;
    sl->next = slots;
    slots = sl;
    pthread_mutex_unlock(&lock);
    /* Its runs: adopted where the agent kept them, else ended with the reason. */
    const cJSON *runs = cJSON_GetObjectItemCaseSensitive(rec, "runs");
    ad_runs_resume(s, cJSON_IsArray(runs) ? runs : NULL);
    ad_session_save(s);
    ad_session_put(s);
    if (r == 0)
        ad_log("session %s of %s taken back%s (%llums)", id, owner, s->paused ? ", paused" : "",
               (unsigned long long)(ad_now_ms() - t0));
}

struct reap_ctx {
    char **known;
    size_t n;
};

static void collect_id(void *ctx, const char *id, const char *owner, const cJSON *rec)
{
    (void)owner, (void)rec;
    struct reap_ctx *c = ctx;
    char **k = realloc(c->known, (c->n + 1) * sizeof(*k));
    if (!k)
        return;
    c->known = k;
    c->known[c->n] = strdup(id);
    if (c->known[c->n])
        c->n++;
}

static void reap_unknown(void *ctx, const al_kept_info *k)
{
    struct reap_ctx *c = ctx;
    for (size_t i = 0; i < c->n; i++)
        if (!strcmp(c->known[i], k->name))
            return;
    if (k->held)
        return;
    al_error err = {0};
    if (al_session_discard(ad_store_keeper(), k->name, &err) == 0)
        ad_log("session %s: kept for this daemon, in no record of it: ended", k->name);
}

/* At start: every session of the store taken back; what the library keeps for this daemon and
 * no record owns (a crash between the boot and the record) is ended. */
static void sessions_restore(void)
{
    struct reap_ctx c = {0};
    ad_store_each(collect_id, &c);
    al_error err = {0};
    al_session_kept(ad_store_keeper(), reap_unknown, &c, &err);
    for (size_t i = 0; i < c.n; i++)
        free(c.known[i]);
    free(c.known);
    int n = ad_store_each(restore_one, NULL);
    if (n > 0)
        ad_log("%d sessions in the store", n);
    ad_store_others();
}

/* ---- metrics: the host's counters of a session's VM ---- */

struct ad_metric {
    int64_t at_ms; /* unix ms */
    uint64_t at_mono_ms, cpu_ns;
    double cpu_pct;
    unsigned cpus;
    uint64_t mem_used, mem_total, disk_used, disk_total;
};

static int64_t unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A sample now; its CPU share against prev (none: against one taken 200 ms before). */
static int sample(struct ad_session *s, const struct ad_metric *prev, struct ad_metric *m,
                  al_error *err)
{
    al_usage u = AL_USAGE_INIT;
    struct ad_metric base;
    if (!prev) {
        if (al_session_usage(s->s, &u, err) < 0)
            return -1;
        base = (struct ad_metric){.at_mono_ms = ad_now_ms(), .cpu_ns = u.cpu_ns};
        prev = &base;
        usleep(200 * 1000);
    }
    if (al_session_usage(s->s, &u, err) < 0)
        return -1;
    *m = (struct ad_metric){.at_ms = unix_ms(),
                            .at_mono_ms = ad_now_ms(),
                            .cpu_ns = u.cpu_ns,
                            .cpus = u.vcpus,
                            .mem_used = u.mem_used,
                            .mem_total = u.mem_total,
                            .disk_used = u.disk_used,
                            .disk_total = u.disk_total};
    uint64_t dt = m->at_mono_ms > prev->at_mono_ms ? m->at_mono_ms - prev->at_mono_ms : 1;
    uint64_t dc = m->cpu_ns > prev->cpu_ns ? m->cpu_ns - prev->cpu_ns : 0;
    m->cpu_pct = 100.0 * (double)dc / ((double)dt * 1e6 * (u.vcpus ? u.vcpus : 1));
    if (m->cpu_pct > 100.0)
        m->cpu_pct = 100.0;
    return 0;
}

int ad_session_metrics(struct ad_session *s, int64_t from_s, int64_t to_s, cJSON **out,
                       struct ad_fail *f)
{
    pthread_mutex_lock(&lock);
    if (!s->metrics && !(s->metrics = calloc(AD_METRICS_MAX, sizeof(*s->metrics)))) {
        pthread_mutex_unlock(&lock);
        ad_failf(f, 500, "internal", "out of memory");
        return -ENOMEM;
    }
    struct ad_metric last = {0};
    bool have = s->nmetrics > 0;
    if (have)
        last = s->metrics[(s->metrics_next + AD_METRICS_MAX - 1) % AD_METRICS_MAX];
    bool due = !s->paused && (!have || ad_now_ms() - last.at_mono_ms >= 1000);
    pthread_mutex_unlock(&lock);
    struct ad_metric m;
    al_error err = {0};
    if (due && sample(s, have ? &last : NULL, &m, &err) == 0) {
        pthread_mutex_lock(&lock);
        s->metrics[s->metrics_next] = m;
        s->metrics_next = (s->metrics_next + 1) % AD_METRICS_MAX;
        if (s->nmetrics < AD_METRICS_MAX)
            s->nmetrics++;
        pthread_mutex_unlock(&lock);
    }
    cJSON *a = cJSON_CreateArray();
    pthread_mutex_lock(&lock);
    for (unsigned k = 0; k < s->nmetrics; k++) {
        const struct ad_metric *x =
            &s->metrics[(s->metrics_next + AD_METRICS_MAX - s->nmetrics + k) % AD_METRICS_MAX];
        if ((from_s && x->at_ms < from_s * 1000) || (to_s && x->at_ms > to_s * 1000 + 999))
            continue;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "timestamp", (double)x->at_ms);
        cJSON_AddNumberToObject(o, "cpu_used_pct", x->cpu_pct);
        cJSON_AddNumberToObject(o, "cpu_count", x->cpus);
        cJSON_AddNumberToObject(o, "mem_used", (double)x->mem_used);
        cJSON_AddNumberToObject(o, "mem_total", (double)x->mem_total);
        cJSON_AddNumberToObject(o, "disk_used", (double)x->disk_used);
        cJSON_AddNumberToObject(o, "disk_total", (double)x->disk_total);
        cJSON_AddItemToArray(a, o);
    }
    pthread_mutex_unlock(&lock);
    *out = a;
    return 0;
}

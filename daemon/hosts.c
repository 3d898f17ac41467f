/* Many hosts: the libvirt hosts sessions are placed on, each reached through libvirt's
 * own remote protocol (qemu+tcp://, qemu+ssh://, qemu+tls://). The library does everything on a
 * remote host through the session's connection (the agent's channel as a virStream, disks as
 * volumes, checkpoints through the monitor), so a host needs nothing of ours but libvirtd and
 * QEMU. Here: which hosts there are, which answer, how many sessions and how much guest memory
 * each holds, and where the next session goes.
 *
 * A watcher thread keeps one connection per host, with libvirt keepalive (on the library's event
 * loop thread, al_libvirt_events), and asks each host for its free memory every host_check_s. A
 * host whose connection dies or whose call fails is down: its sessions are reported lost
 * (sessions.c), placement skips it, and the watcher reconnects each round; when it answers again it
 * is up, after a gc there that reaps what its lost sessions left (domains, volumes). */
#include "airlockd.h"

#include <errno.h>
#include <libvirt/libvirt.h>
#include <libvirt/virterror.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* Keepalive: a probe every KEEPALIVE_S, the connection dead after KEEPALIVE_COUNT unanswered. */
#define KEEPALIVE_S 2
#define KEEPALIVE_COUNT 3
/* Memory a host keeps for itself beyond its sessions' guests. */
#define HOST_RESERVE_MIB 256

struct host {
    struct ad_host_cfg cfg;
    bool up;
    char last_error[256];
    int64_t changed;               /* unix time of the last change of up */
    unsigned sessions, memory_mib; /* placed on it, booting included */
    uint64_t free_mib;             /* at the last check; 0: not known */
    unsigned lost;                 /* sessions lost with it, in all */
    unsigned placed;               /* sessions placed on it, in all */
    virConnectPtr conn;            /* the watcher's; NULL while down */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static struct host hosts[AD_HOSTS_MAX];
static size_t nhosts;
static unsigned check_s;
static pthread_t watcher;
static bool watching, stopping;

static void quiet_error(void *ctx, virErrorPtr e)
{
    (void)ctx;
    (void)e;
}

static void set_down(struct host *h, const char *why)
{
    bool was = h->up;
    h->up = false;
    snprintf(h->last_error, sizeof(h->last_error), "%s", why);
    if (was) {
        h->changed = time(NULL);
        ad_log("host %s is down: %s", h->cfg.name, why);
    }
}

static const char *virt_msg(void)
{
    const char *m = virGetLastErrorMessage();
    return m && *m ? m : "no answer";
}

/* One round for host i, without the lock held for libvirt calls; the lock held on return. */
static void check(size_t i)
{
    struct host *h = &hosts[i];
    virConnectPtr c = h->conn;
    char why[256] = "";
    bool rejoined = false;
    pthread_mutex_unlock(&lock);
    if (!c) {
        c = virConnectOpen(h->cfg.uri[0] ? h->cfg.uri : NULL);
        if (c && virConnectSetKeepAlive(c, KEEPALIVE_S, KEEPALIVE_COUNT) < 0) {
            /* no event loop: the checks alone notice a dead host */
        }
        if (!c)
            snprintf(why, sizeof(why), "%s", virt_msg());
        else
            rejoined = true;
    }
    uint64_t free_mib = 0;
    if (c) {
        unsigned long long b = virNodeGetFreeMemory(c);
        if (virConnectIsAlive(c) != 1 || (b == 0 && virGetLastError())) {
            snprintf(why, sizeof(why), "%s",
                     virConnectIsAlive(c) == 1 ? virt_msg() : "the connection closed");
            virConnectClose(c);
            c = NULL;
            rejoined = false;
        } else {
            free_mib = b >> 20;
        }
    }
    if (rejoined) {
        /* What its lost sessions left there: their domains, overlays, scratch disks. */
        al_error err = {0};
        int n = al_gc(h->cfg.uri[0] ? h->cfg.uri : NULL, &err);
        if (n > 0)
            ad_log("host %s: reaped %d leftovers of ended sessions", h->cfg.name, n);
    }
    if (!c) {
        /* sessions.c's lock is taken before this file's, never after (ad_host_release). */
        unsigned lost = ad_sessions_host_down((int)i, why);
        pthread_mutex_lock(&lock);
        h->conn = NULL;
        h->lost += lost;
        set_down(h, why);
        return;
    }
    pthread_mutex_lock(&lock);
    h->conn = c;
    h->free_mib = free_mib;
    if (!h->up) {
        h->up = true;
        h->changed = time(NULL);
        ad_log("host %s is up (%s)", h->cfg.name, h->cfg.uri[0] ? h->cfg.uri : "the default");
    }
}

static void *watch(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&lock);
    while (!stopping) {
        for (size_t i = 0; i < nhosts && !stopping; i++)
            check(i);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += check_s;
        pthread_cond_timedwait(&wake, &lock, &ts);
    }
    for (size_t i = 0; i < nhosts; i++)
        if (hosts[i].conn) {
            virConnectClose(hosts[i].conn);
            hosts[i].conn = NULL;
        }
    pthread_mutex_unlock(&lock);
    return NULL;
}

int ad_hosts_init(const struct ad_config *c)
{
    /* Keepalive needs libvirt's event loop: the library's, for every connection. */
    al_libvirt_events();
    virSetErrorFunc(NULL, quiet_error);
    nhosts = c->nhosts;
    for (size_t i = 0; i < nhosts; i++)
        hosts[i].cfg = c->hosts[i];
    if (!nhosts) { /* the library's default connection, no caps of its own */
        nhosts = 1;
        snprintf(hosts[0].cfg.name, sizeof(hosts[0].cfg.name), "local");
        hosts[0].cfg.weight = 1;
        hosts[0].cfg.local = true;
    }
    check_s = c->host_check_s ? c->host_check_s : 2;
    /* The first round before serving: placement knows which hosts answer. */
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nhosts; i++)
        check(i);
    pthread_mutex_unlock(&lock);
    if (pthread_create(&watcher, NULL, watch, NULL))
        return -EAGAIN;
    watching = true;
    return 0;
}

void ad_hosts_shutdown(void)
{
    pthread_mutex_lock(&lock);
    stopping = true;
    pthread_cond_broadcast(&wake);
    pthread_mutex_unlock(&lock);
    if (watching)
        pthread_join(watcher, NULL);
    watching = false;
}

static bool has_room(const struct host *h, unsigned mem)
{
    if (!h->up)
        return false;
    if (h->cfg.max_sessions && h->sessions >= h->cfg.max_sessions)
        return false;
    if (h->cfg.max_memory_mib && h->memory_mib + mem > h->cfg.max_memory_mib)
        return false;
    /* The free memory read at the last check, less what was placed since is not known: the
     * caps are the firm bound, this only keeps sessions off a host that is already full. */
    return !h->free_mib || h->free_mib >= (uint64_t)mem + HOST_RESERVE_MIB;
}

int ad_host_place(unsigned mem, bool local_only, const char **uri, struct ad_fail *f)
{
    pthread_mutex_lock(&lock);
    int best = -1;
    double best_load = 0;
    unsigned up = 0;
    for (size_t i = 0; i < nhosts; i++) {
        struct host *h = &hosts[i];
        up += h->up;
        if (!has_room(h, mem) || (local_only && !h->cfg.local))
            continue;
        /* The least loaded for its weight; ties to the first listed. */
        double load = (double)h->sessions / (h->cfg.weight ? h->cfg.weight : 1);
        if (best < 0 || load < best_load) {
            best = (int)i;
            best_load = load;
        }
    }
    if (best >= 0) {
        hosts[best].sessions++;
        hosts[best].memory_mib += mem;
        hosts[best].placed++;
        *uri = hosts[best].cfg.uri[0] ? hosts[best].cfg.uri : NULL;
    } else if (!up) {
        ad_failf(f, 503, "no_host", "no host answers");
    } else {
        ad_failf(f, 503, "no_host", "no host has room for a session of %u MiB%s", mem,
                 local_only ? " among those where it can run (the local ones)" : "");
    }
    pthread_mutex_unlock(&lock);
    return best;
}

void ad_host_release(int i, unsigned mem)
{
    if (i < 0 || (size_t)i >= nhosts)
        return;
    pthread_mutex_lock(&lock);
    hosts[i].sessions--;
    hosts[i].memory_mib -= mem;
    pthread_mutex_unlock(&lock);
}

void ad_host_gc(int i)
{
    if (i < 0 || (size_t)i >= nhosts)
        return;
    pthread_mutex_lock(&lock);
    bool up = hosts[i].up;
    char uri[sizeof(hosts[i].cfg.uri)];
    snprintf(uri, sizeof(uri), "%s", hosts[i].cfg.uri);
    pthread_mutex_unlock(&lock);
    al_error err = {0};
    if (up && al_gc(uri[0] ? uri : NULL, &err) > 0)
        ad_log("host %s: reaped what a lost session left", hosts[i].cfg.name);
}

bool ad_host_local(int i)
{
    return i >= 0 && (size_t)i < nhosts && hosts[i].cfg.local;
}

void ad_hosts_each(void (*fn)(void *ctx, const char *name, bool up, unsigned sessions,
                              unsigned lost),
                   void *ctx)
{
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nhosts; i++)
        fn(ctx, hosts[i].cfg.name, hosts[i].up, hosts[i].sessions, hosts[i].lost);
    pthread_mutex_unlock(&lock);
}

cJSON *ad_hosts_json(void)
{
    cJSON *a = cJSON_CreateArray();
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nhosts; i++) {
        const struct host *h = &hosts[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", h->cfg.name);
        cJSON_AddStringToObject(o, "uri", h->cfg.uri[0] ? h->cfg.uri : "(default)");
        cJSON_AddStringToObject(o, "state", h->up ? "up" : "down");
        cJSON_AddNumberToObject(o, "since", (double)h->changed);
        cJSON_AddNumberToObject(o, "sessions", h->sessions);
        cJSON_AddNumberToObject(o, "memory_mib", h->memory_mib);
        cJSON_AddNumberToObject(o, "max_sessions", h->cfg.max_sessions);
        cJSON_AddNumberToObject(o, "max_memory_mib", h->cfg.max_memory_mib);
        cJSON_AddNumberToObject(o, "weight", h->cfg.weight);
        cJSON_AddNumberToObject(o, "free_mib", (double)h->free_mib);
        cJSON_AddNumberToObject(o, "placed", h->placed);
        cJSON_AddNumberToObject(o, "lost", h->lost);
        if (h->last_error[0])
            cJSON_AddStringToObject(o, "last_error", h->last_error);
        else
            cJSON_AddNullToObject(o, "last_error");
        cJSON_AddItemToArray(a, o);
    }
    pthread_mutex_unlock(&lock);
    return a;
}

/* A session's disk budget. The guest's writes and its checkpoints land in qcow2 files in the
 * session's state dir (its root disk overlay, or the scratch disk that holds checkpoints); the
 * guest is root and decides how much it writes, so the host measures those files itself and
 * pauses the VM once they hold more than the budget, or once the filesystem under them would fall
 * below a floor of free space that Airlock keeps for everyone else. */
#include "budget.h"
#include "session.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#define WATCH_MS 250

static void human(uint64_t b, char *out, size_t len)
{
    if (b >= (1ull << 30))
        snprintf(out, len, "%.1f GiB", (double)b / (double)(1ull << 30));
    else
        snprintf(out, len, "%.0f MiB", (double)b / (double)(1ull << 20));
}

static uint64_t env_mib(const char *name, uint64_t dflt)
{
    const char *v = getenv(name);
    char *end = NULL;
    unsigned long long n = v && *v ? strtoull(v, &end, 10) : 0;
    return v && *v && end && !*end && n < (1ull << 40) ? (uint64_t)n << 20 : dflt;
}

uint64_t al_free_floor(void)
{
    return env_mib("AIRLOCK_FREE_FLOOR_MB", AL_FREE_FLOOR_DEFAULT);
}

/* Bytes the session's files occupy on the host (allocated blocks, not apparent sizes). */
uint64_t al_session_disk_usage(const al_session *s)
{
    uint64_t total = 0;
    char vol[80];
    for (int scratch = 0; scratch < 2; scratch++) {
        if (scratch ? s->scratch_made : s->vol_made) {
            al_session_volume(s, scratch, vol);
            total += al_volume_allocation(s->conn, vol);
        }
    }
    int dfd = open(s->state_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
    if (!d) {
        if (dfd >= 0)
            close(dfd);
        return 0;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        struct stat st;
        if (fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
            total += (uint64_t)st.st_blocks * 512u;
    }
    closedir(d);
    return total;
}

int al_check_free_space(const char *dir, uint64_t floor, al_error *err)
{
    struct statvfs v;
    if (!floor || statvfs(dir, &v) < 0)
        return 0;
    uint64_t avail = (uint64_t)v.f_bavail * v.f_frsize;
    if (avail >= floor)
        return 0;
    char a[32], f[32];
    human(avail, a, sizeof(a));
    human(floor, f, sizeof(f));
    return al_err(err, -ENOSPC,
                  "only %s is free under %s, and Airlock keeps %s free (AIRLOCK_FREE_FLOOR_MB)", a,
                  dir, f);
}

/* -ENOSPC: "... use USED, over [PART]its budget of BUDGET[THEN]". */
static int budget_err(const al_session *s, uint64_t used, const char *part, const char *then,
                      al_error *err)
{
    char u[32], b[32];
    human(used, u, sizeof(u));
    human(s->disk_budget, b, sizeof(b));
    return al_err(err, -ENOSPC,
                  "the session's disk and checkpoints use %s, over %sits budget of %s%s", u, part,
                  b, then);
}

/* What is over, into err; 0 when nothing is. */
static int over_budget(const al_session *s, al_error *err)
{
    uint64_t used = al_session_disk_usage(s);
    if (s->disk_budget && used > s->disk_budget)
        return budget_err(s, used, "", " (--disk-budget); the VM was paused", err);
    al_error free_why = {0};
    if (al_check_free_space(s->state_dir, al_free_floor(), &free_why) < 0)
        return al_err(err, -ENOSPC, "%s; the VM was paused", free_why.msg);
    return 0;
}

static void *watch(void *arg)
{
    al_session *s = arg;
    for (;;) {
        struct pollfd p = {s->budget_stop[0], POLLIN, 0};
        if (poll(&p, 1, WATCH_MS) != 0)
            return NULL;
        al_error why = {0};
        if (over_budget(s, &why) == 0)
            continue;
        /* A handle of its own: a restore may replace the session's while this runs. */
        virDomainPtr d = virDomainLookupByName(s->conn, s->name);
        if (d) {
            virDomainSuspend(d);
            virDomainFree(d);
        }
        snprintf(s->budget_why, sizeof(s->budget_why), "%s", why.msg);
        __atomic_store_n(&s->budget_over, true, __ATOMIC_RELEASE);
        if (write(s->budget_alarm[1], "!", 1) < 0) {
            /* the flag alone still stops the next request */
        }
        return NULL;
    }
}

int al_budget_start(al_session *s, al_error *err)
{
    if (pipe2(s->budget_stop, O_CLOEXEC) < 0)
        return al_err(err, -errno, "pipe: %s", strerror(errno));
    if (pipe2(s->budget_alarm, O_CLOEXEC) < 0) {
        int e = errno;
        al_closep(&s->budget_stop[0]);
        al_closep(&s->budget_stop[1]);
        return al_err(err, -e, "pipe: %s", strerror(e));
    }
    int r = pthread_create(&s->budget_thread, NULL, watch, s);
    if (r != 0) {
        al_budget_stop(s);
        return al_err(err, -r, "cannot start the disk budget watcher: %s", strerror(r));
    }
    s->budget_running = true;
    /* The channel is up already; a later one gets these from link.c (link_attach). */
    s->ch.alarm_fd = s->budget_alarm[0];
    s->ch.alarm_msg = s->budget_why;
    return 0;
}

void al_budget_stop(al_session *s)
{
    if (s->budget_running) {
        if (write(s->budget_stop[1], "x", 1) < 0) {
            /* a full pipe still wakes the watcher */
        }
        pthread_join(s->budget_thread, NULL);
        s->budget_running = false;
    }
    al_closep(&s->budget_stop[0]);
    al_closep(&s->budget_stop[1]);
    al_closep(&s->budget_alarm[0]);
    al_closep(&s->budget_alarm[1]);
    s->ch.alarm_fd = -1;
}

/* A checkpoint stores the guest's memory in the same files: refused once they hold most of the
 * budget, rather than let the snapshot itself push the session over. */
int al_budget_room_for_checkpoint(const al_session *s, al_error *err)
{
    uint64_t used = al_session_disk_usage(s);
    if (!s->disk_budget || used <= s->disk_budget / 10 * 8)
        return 0;
    return budget_err(s, used, "80% of ", "; no checkpoint taken", err);
}

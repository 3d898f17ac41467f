/* Reaping what crashed runs left behind. A session is dead when nobody holds the flock on its
 * runtime dir; only domains carrying airlock's metadata are ever looked at. */
#include "gc.h"
#include "keep.h"
#include "net.h"
#include "session.h"
#include "template.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

/* A kept session's mark (keep.c, AL_KEEP_MARK: "KEEPER EXPIRES"): its keeper comes back for it,
 * so nobody else reaps it before its lifetime ends (EXPIRES, unix time; 0: never). */
static bool dir_kept(const char *dir)
{
    char mark[AL_PATH_MAX], buf[128];
    if (al_pathf(mark, sizeof(mark), "%s/" AL_KEEP_MARK, dir) < 0)
        return false;
    _cleanup_close_ int fd = open(mark, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return false;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    if (n <= 0)
        return false;
    buf[n] = '\0';
    const char *sp = strchr(buf, ' ');
    long long expires = sp ? strtoll(sp + 1, NULL, 10) : -1;
    return expires == 0 || (expires > 0 && (long long)time(NULL) < expires);
}

/* True when no live process holds the lock in a session dir (or the dir is gone), and it is
 * not kept for a keeper (dir_kept). */
static bool dir_dead(const char *dir)
{
    char lock[AL_PATH_MAX];
    if (al_pathf(lock, sizeof(lock), "%s/lock", dir) < 0)
        return false;
    _cleanup_close_ int fd = open(lock, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return errno == ENOENT;
    return flock(fd, LOCK_EX | LOCK_NB) == 0 && !dir_kept(dir);
}

static bool session_dead(const char *sessions, const char *name)
{
    char dir[AL_PATH_MAX];
    return al_pathf(dir, sizeof(dir), "%s/%s", sessions, name) == 0 && dir_dead(dir);
}

/* A domain of ours is dead when the lock in the session dir its metadata names is free; a
 * domain from before that element existed is judged by gc's own runtime dir. */
static bool domain_dead(virDomainPtr d, const char *sessions)
{
    const char *name = virDomainGetName(d);
    if (!name || strncmp(name, AL_DOMAIN_PREFIX, strlen(AL_DOMAIN_PREFIX)) != 0)
        return false;
    _cleanup_free_ char *md = virDomainGetMetadata(d, VIR_DOMAIN_METADATA_ELEMENT, AL_METADATA_NS,
                                                   VIR_DOMAIN_AFFECT_LIVE);
    if (!md)
        return false; /* not ours */
    /* Another machine's (a libvirt host both use): only that machine can tell whether its
     * owner lives; a path missing here says nothing. */
    char machine[40];
    al_machine_id(machine, sizeof(machine));
    const char *m = strstr(md, "<machine>");
    if (m && (!machine[0] || strncmp(m + strlen("<machine>"), machine, 32) != 0 ||
              m[strlen("<machine>") + 32] != '<'))
        return false;
    /* libvirt hands the element back without our prefix. */
    const char *open_tag = strstr(md, "<dir>");
    const char *start = open_tag ? open_tag + strlen("<dir>") : NULL;
    const char *end = start ? strchr(start, '<') : NULL;
    if (!end || end == start || *start != '/' || memchr(start, '&', (size_t)(end - start)) ||
        (size_t)(end - start) >= AL_PATH_MAX)
        return session_dead(sessions, name);
    char dir[AL_PATH_MAX];
    memcpy(dir, start, (size_t)(end - start));
    dir[end - start] = '\0';
    return dir_dead(dir);
}

static int reap_dirs(const char *sessions);

static bool volume_session_dead(void *ctx, const char *session)
{
    return session_dead(ctx, session);
}

int al_gc_conn(virConnectPtr conn, al_error *err)
{
    char sessions[AL_PATH_MAX];
    int r = al_sessions_dir(sessions, sizeof(sessions), false, err);
    if (r < 0)
        return r;
    int reaped = 0;

    if (conn) {
        virDomainPtr *doms = NULL;
        int n = virConnectListAllDomains(conn, &doms, VIR_CONNECT_LIST_DOMAINS_ACTIVE);
        for (int i = 0; i < n; i++) {
            if (domain_dead(doms[i], sessions) && virDomainDestroy(doms[i]) == 0)
                reaped++;
            virDomainFree(doms[i]);
        }
        free(doms);
        /* On a remote host, the volumes of sessions that are over (domain gone, lock free). */
        if (al_conn_remote(conn))
            reaped += al_volume_reap(conn, volume_session_dead, sessions);
    }

    reaped += reap_dirs(sessions);
    /* The disk-backed halves (budget.c's state dirs) hold the same lock. */
    char state_sessions[AL_PATH_MAX];
    al_error ignored = {0};
    if (al_sessions_dir(state_sessions, sizeof(state_sessions), true, &ignored) == 0)
        reaped += reap_dirs(state_sessions);
    al_fork_reap(); /* forks' saves no fork holds any more */
    return reaped;
}

/* Removes the session dirs under sessions whose lock is free. */
static int reap_dirs(const char *sessions)
{
    int reaped = 0;
    DIR *d = opendir(sessions);
    if (!d)
        return reaped;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, AL_DOMAIN_PREFIX, strlen(AL_DOMAIN_PREFIX)) != 0)
            continue;
        /* Check the lock again right before removing: a dir being created holds it. */
        if (session_dead(sessions, e->d_name)) {
            char path[AL_PATH_MAX];
            if (al_pathf(path, sizeof(path), "%s/%s", sessions, e->d_name) < 0)
                continue;
            al_net_reap(path); /* the proxy a crashed session with network left running */
            if (al_rmtree(path) == 0)
                reaped++;
        }
    }
    closedir(d);
    return reaped;
}

int al_gc(const char *connect_uri, al_error *err)
{
    _cleanup_virconn_ virConnectPtr conn = NULL;
    int r = al_vm_connect(connect_uri, &conn, err);
    if (r < 0)
        return r;
    return al_gc_conn(conn, err);
}

/* Reaping what crashed runs left behind. A session is dead when nobody holds the flock on its
 * runtime dir; only domains carrying airlock's metadata are ever looked at. */
#include "session.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>

/* True when no live process holds the session's lock (or its dir is gone). */
static bool session_dead(const char *sessions, const char *name)
{
    char lock[4400];
    if (al_pathf(lock, sizeof(lock), "%s/%s/lock", sessions, name) < 0)
        return false;
    _cleanup_close_ int fd = open(lock, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return errno == ENOENT;
    return flock(fd, LOCK_EX | LOCK_NB) == 0;
}

static bool is_airlock_domain(virDomainPtr d)
{
    const char *name = virDomainGetName(d);
    if (!name || strncmp(name, AL_DOMAIN_PREFIX, strlen(AL_DOMAIN_PREFIX)) != 0)
        return false;
    char *md = virDomainGetMetadata(d, VIR_DOMAIN_METADATA_ELEMENT, AL_METADATA_NS,
                                    VIR_DOMAIN_AFFECT_LIVE);
    bool ours = md != NULL;
    free(md);
    return ours;
}

int al_gc_conn(virConnectPtr conn, al_error *err)
{
    char run[4096], sessions[4200];
    int r = al_runtime_dir(run, sizeof(run), err);
    if (r < 0)
        return r;
    if (al_pathf(sessions, sizeof(sessions), "%s/sessions", run) < 0)
        return al_err(err, -ENAMETOOLONG, "runtime path too long");
    int reaped = 0;

    if (conn) {
        virDomainPtr *doms = NULL;
        int n = virConnectListAllDomains(conn, &doms, VIR_CONNECT_LIST_DOMAINS_ACTIVE);
        for (int i = 0; i < n; i++) {
            if (is_airlock_domain(doms[i]) && session_dead(sessions, virDomainGetName(doms[i])) &&
                virDomainDestroy(doms[i]) == 0)
                reaped++;
            virDomainFree(doms[i]);
        }
        free(doms);
    }

    DIR *d = opendir(sessions);
    if (!d)
        return reaped;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, AL_DOMAIN_PREFIX, strlen(AL_DOMAIN_PREFIX)) != 0)
            continue;
        /* Check the lock again right before removing: a dir being created holds it. */
        if (session_dead(sessions, e->d_name)) {
            char path[4400];
            if (al_pathf(path, sizeof(path), "%s/%s", sessions, e->d_name) == 0 &&
                al_rmtree(path) == 0)
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

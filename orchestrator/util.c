/* Small helpers: clocks, the runtime directory, recursive removal. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

uint64_t al_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

uint64_t al_now_ms(void)
{
    return al_now_us() / 1000u;
}

static int mkdir_p(const char *path, mode_t mode)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof(tmp), "%s", path) >= (int)sizeof(tmp))
        return -ENAMETOOLONG;
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(tmp, mode) < 0 && errno != EEXIST)
            return -errno;
        *p = '/';
    }
    if (mkdir(tmp, mode) < 0 && errno != EEXIST)
        return -errno;
    return 0;
}

/* Where session directories live: /run/airlock for root (QEMU, running as libvirt-qemu, only
 * needs to traverse it), else $XDG_RUNTIME_DIR/airlock, else /tmp/airlock-UID. */
int al_runtime_dir(char *buf, size_t len, al_error *err)
{
    const char *over = getenv("AIRLOCK_RUNTIME_DIR");
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    int n;
    if (over && *over)
        n = snprintf(buf, len, "%s", over);
    else if (geteuid() == 0)
        n = snprintf(buf, len, "/run/airlock");
    else if (xdg && *xdg == '/')
        n = snprintf(buf, len, "%s/airlock", xdg);
    else
        n = snprintf(buf, len, "/tmp/airlock-%u", (unsigned)geteuid());
    if (n < 0 || (size_t)n >= len)
        return al_err(err, -ENAMETOOLONG, "runtime directory path too long");
    int r = mkdir_p(buf, 0755);
    if (r < 0)
        return al_err(err, r, "cannot create runtime directory '%s': %s", buf, strerror(-r));
    return 0;
}

/* Where sessions keep their disks and checkpoints: disk-backed storage, never the runtime dir
 * (tmpfs on most hosts: a guest writing its disk would fill the host's RAM). $AIRLOCK_STATE_DIR,
 * else /var/lib/airlock/state for root, else $XDG_STATE_HOME/airlock (~/.local/state/airlock).
 * QEMU's user must traverse it, hence 0755; it must be ours and writable by nobody else. */
int al_state_dir(char *buf, size_t len, al_error *err)
{
    const char *over = getenv("AIRLOCK_STATE_DIR");
    const char *xdg = getenv("XDG_STATE_HOME");
    const char *home = getenv("HOME");
    int n;
    if (over && *over)
        n = snprintf(buf, len, "%s", over);
    else if (geteuid() == 0)
        n = snprintf(buf, len, "/var/lib/airlock/state");
    else if (xdg && *xdg == '/')
        n = snprintf(buf, len, "%s/airlock", xdg);
    else if (home && *home == '/')
        n = snprintf(buf, len, "%s/.local/state/airlock", home);
    else
        return al_err(err, -ENOENT, "no state directory: set HOME or AIRLOCK_STATE_DIR");
    if (n < 0 || (size_t)n >= len)
        return al_err(err, -ENAMETOOLONG, "state directory path too long");
    int r = mkdir_p(buf, 0755);
    if (r < 0)
        return al_err(err, r, "cannot create state directory '%s': %s", buf, strerror(-r));
    struct stat st;
    if (lstat(buf, &st) < 0)
        return al_err(err, -errno, "cannot inspect '%s': %s", buf, strerror(errno));
    if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022))
        return al_err(err, -EPERM,
                      "refusing state directory '%s': not a directory of ours, or writable by "
                      "others",
                      buf);
    return 0;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path) < 0 && errno != ENOENT ? -1 : 0;
}

int al_rmtree(const char *path)
{
    if (nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS) < 0 && errno != ENOENT)
        return -errno;
    return 0;
}

int al_pathf(char *buf, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, len, fmt, ap);
    va_end(ap);
    return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

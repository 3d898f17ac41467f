/* Is a run waiting for input? Looks at what the run's tasks are blocked in (/proc/TID/syscall)
 * and whether that call reads the run's stdin pipe: read(2) and friends on it, or poll, select
 * or epoll with it among the descriptors waited for. Generic: no help from the program. */
#include "agent.h"

#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>

/* Descriptors of one poll, select or epoll looked at: each costs a stat(2). */
#define WAIT_FDS_MAX 64
/* A task's epoll interest list as /proc shows it: ~80 bytes a line, WAIT_FDS_MAX lines. */
#define FDINFO_MAX 8192

/* Reads a small /proc or cgroup file into buf, NUL-terminated; its length or -1. */
static ssize_t read_small(int dir, const char *path, char *buf, size_t cap)
{
    _cleanup_close_ int fd = openat(dir, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t len = 0;
    while (len < cap - 1) {
        ssize_t n = read(fd, buf + len, cap - 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    buf[len] = '\0';
    return (ssize_t)len;
}

/* Is fd of task tid the run's stdin pipe? */
static bool fd_is_stdin(pid_t tid, uint64_t fd, const struct req *r)
{
    char path[64];
    struct stat st;
    if (fd > INT_MAX)
        return false;
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)tid, (int)fd);
    return stat(path, &st) == 0 && st.st_ino == r->stdin_ino && st.st_dev == r->stdin_dev;
}

static bool poll_has_stdin(pid_t tid, uint64_t addr, uint64_t nfds, const struct req *r)
{
    struct pollfd p[WAIT_FDS_MAX];
    size_t n = nfds < WAIT_FDS_MAX ? (size_t)nfds : WAIT_FDS_MAX;
    struct iovec local = {p, n * sizeof(p[0])}, remote = {(void *)(uintptr_t)addr, local.iov_len};
    if (!addr || !n || process_vm_readv(tid, &local, 1, &remote, 1, 0) != (ssize_t)local.iov_len)
        return false;
    for (size_t i = 0; i < n; i++)
        if (p[i].fd >= 0 && (p[i].events & POLLIN) && fd_is_stdin(tid, (uint64_t)p[i].fd, r))
            return true;
    return false;
}

static bool select_has_stdin(pid_t tid, uint64_t nfds, uint64_t addr, const struct req *r)
{
    uint8_t bits[FD_SETSIZE / 8];
    size_t n = nfds < FD_SETSIZE ? (size_t)nfds : FD_SETSIZE, checked = 0;
    struct iovec local = {bits, (n + 7) / 8}, remote = {(void *)(uintptr_t)addr, local.iov_len};
    if (!addr || !n || process_vm_readv(tid, &local, 1, &remote, 1, 0) != (ssize_t)local.iov_len)
        return false;
    for (size_t fd = 0; fd < n && checked < WAIT_FDS_MAX; fd++)
        if (bits[fd / 8] & (1u << (fd % 8))) {
            checked++;
            if (fd_is_stdin(tid, fd, r))
                return true;
        }
    return false;
}

/* The epoll's interest list is in /proc/TID/fdinfo/EPFD: "tfd: FD events: MASK ...". */
static bool epoll_has_stdin(pid_t tid, uint64_t epfd, const struct req *r)
{
    static char buf[FDINFO_MAX];
    char path[64];
    size_t checked = 0;
    if (epfd > INT_MAX)
        return false;
    snprintf(path, sizeof(path), "/proc/%d/fdinfo/%d", (int)tid, (int)epfd);
    if (read_small(AT_FDCWD, path, buf, sizeof(buf)) < 0)
        return false;
    for (char *p = strstr(buf, "tfd:"); p && checked < WAIT_FDS_MAX; p = strstr(p + 4, "tfd:")) {
        unsigned long long fd, events;
        if (sscanf(p, "tfd: %llu events: %llx", &fd, &events) != 2)
            continue;
        checked++;
        if ((events & EPOLLIN) && fd_is_stdin(tid, fd, r))
            return true;
    }
    return false;
}

/* Is task tid asleep in a call that waits for the run's stdin to become readable? */
static bool task_reads_stdin(pid_t tid, const struct req *r)
{
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)tid);
    if (read_small(AT_FDCWD, path, buf, sizeof(buf)) < 0)
        return false;
    char *close_paren = strrchr(buf, ')');
    if (!close_paren || close_paren[1] != ' ' || close_paren[2] != 'S')
        return false; /* running, or in an uninterruptible sleep: not waiting for a reader */
    snprintf(path, sizeof(path), "/proc/%d/syscall", (int)tid);
    if (read_small(AT_FDCWD, path, buf, sizeof(buf)) < 0)
        return false;
    long nr;
    unsigned long long a1, a2, a3;
    if (sscanf(buf, "%ld %llx %llx %llx", &nr, &a1, &a2, &a3) != 4)
        return false; /* "running", or "-1 ..." outside a system call */
    switch (nr) {
    case SYS_read:
    case SYS_readv:
    case SYS_pread64:
    case SYS_preadv:
#ifdef SYS_preadv2
    case SYS_preadv2:
#endif
        return fd_is_stdin(tid, a1, r);
#ifdef SYS_poll
    case SYS_poll:
#endif
    case SYS_ppoll:
        return poll_has_stdin(tid, a1, a2, r);
#ifdef SYS_select
    case SYS_select:
#endif
    case SYS_pselect6:
        return select_has_stdin(tid, a1, a2, r);
#ifdef SYS_epoll_wait
    case SYS_epoll_wait:
#endif
    case SYS_epoll_pwait:
#ifdef SYS_epoll_pwait2
    case SYS_epoll_pwait2:
#endif
        return epoll_has_stdin(tid, a1, r);
    default:
        return false;
    }
}

/* Thread ids of the cgroup's processes (every cgroup2 cgroup has cgroup.threads). */
static size_t tasks_of_cgroup(struct agent *a, const char *cg, pid_t *out, size_t max)
{
    char path[80], buf[AGENT_WAIT_SCAN_MAX * 12];
    size_t n = 0;
    snprintf(path, sizeof(path), "%s/cgroup.threads", cg);
    ssize_t len = read_small(a->cg_base_fd, path, buf, sizeof(buf));
    if (len < 0)
        return 0;
    /* A full buffer may end in a cut number: only whole lines count. */
    for (char *p = buf, *nl; n < max && (nl = strchr(p, '\n')); p = nl + 1)
        out[n++] = (pid_t)strtol(p, NULL, 10);
    return n;
}

/* Without a cgroup: the threads of root and of its descendants, breadth first. */
static size_t tasks_of_tree(pid_t root, pid_t *out, size_t max)
{
    pid_t procs[AGENT_WAIT_SCAN_MAX];
    size_t np = 1, n = 0;
    char path[80], buf[AGENT_WAIT_SCAN_MAX * 12];
    procs[0] = root;
    for (size_t i = 0; i < np && n < max; i++) {
        snprintf(path, sizeof(path), "/proc/%d/task", (int)procs[i]);
        DIR *d = opendir(path);
        if (!d)
            continue;
        struct dirent *de;
        while (n < max && (de = readdir(d))) {
            if (de->d_name[0] < '0' || de->d_name[0] > '9')
                continue;
            pid_t tid = (pid_t)strtol(de->d_name, NULL, 10);
            out[n++] = tid;
            snprintf(path, sizeof(path), "/proc/%d/task/%d/children", (int)procs[i], (int)tid);
            if (read_small(AT_FDCWD, path, buf, sizeof(buf)) <= 0)
                continue;
            for (char *p = buf, *end; np < AGENT_WAIT_SCAN_MAX; p = end) {
                long c = strtol(p, &end, 10);
                if (end == p)
                    break;
                procs[np++] = (pid_t)c;
            }
        }
        closedir(d);
    }
    return n;
}

bool stdin_blocked(struct agent *a, const struct req *r)
{
    pid_t tids[AGENT_WAIT_SCAN_MAX];
    const char *cg = r->kernel ? r->kernel->cgroup : r->cgroup;
    size_t n = a->cgroup && cg[0] ? tasks_of_cgroup(a, cg, tids, AGENT_WAIT_SCAN_MAX)
                                  : tasks_of_tree(r->pid, tids, AGENT_WAIT_SCAN_MAX);
    for (size_t i = 0; i < n; i++)
        if (task_reads_stdin(tids[i], r))
            return true;
    return false;
}

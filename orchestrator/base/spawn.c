/* Running a host helper program (qemu-img, an image recipe) to completion. */
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* The first executable argv0 in PATH, as execvp would find it; resolved before fork so the
 * child only makes async-signal-safe calls. */
static int path_find(const char *argv0, char *out, size_t len)
{
    if (strchr(argv0, '/'))
        return snprintf(out, len, "%s", argv0) < (int)len ? 0 : -ENAMETOOLONG;
    const char *path = getenv("PATH");
    if (!path || !*path)
        path = "/usr/local/bin:/usr/bin:/bin";
    for (const char *p = path; *p;) {
        size_t n = strcspn(p, ":");
        if (n && snprintf(out, len, "%.*s/%s", (int)n, p, argv0) < (int)len &&
            access(out, X_OK) == 0)
            return 0;
        p += n + (p[n] == ':');
    }
    return -ENOENT;
}

int al_spawn_wait_limited(const char *const *argv, int out_fd, int err_fd,
                          const struct al_spawn_limits *lim, int *status)
{
    if (!lim)
        return al_spawn_wait(argv, out_fd, err_fd, status);
    char prog[AL_PATH_MAX];
    int r = path_find(argv[0], prog, sizeof(prog));
    if (r < 0)
        return r;
    struct rlimit cpu = {lim->cpu_s, lim->cpu_s}, as = {lim->as_bytes, lim->as_bytes};
    pid_t pid = fork();
    if (pid < 0)
        return -errno;
    if (pid == 0) {
        /* Only async-signal-safe calls from here: the parent may have other threads. */
        int in = open("/dev/null", O_RDONLY);
        if (in < 0 || dup2(in, 0) < 0 || dup2(out_fd, 1) < 0 || dup2(err_fd, 2) < 0 ||
            (lim->cpu_s && setrlimit(RLIMIT_CPU, &cpu) < 0) ||
            (lim->as_bytes && setrlimit(RLIMIT_AS, &as) < 0))
            _exit(127);
        if (in > 2)
            close(in);
        execve(prog, (char *const *)argv, environ);
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return -errno;
    *status = st;
    return 0;
}

int al_spawn_wait(const char *const *argv, int out_fd, int err_fd, int *status)
{
    posix_spawn_file_actions_t fa;
    int r = posix_spawn_file_actions_init(&fa);
    if (r)
        return -r;
    /* stdin is /dev/null: helpers never ask the user anything. */
    r = posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    if (!r)
        r = posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
    if (!r)
        r = posix_spawn_file_actions_adddup2(&fa, err_fd, 2);
    pid_t pid;
    if (!r)
        r = posix_spawnp(&pid, argv[0], &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (r)
        return -r;
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return -errno;
    *status = st;
    return 0;
}

int al_spawn_quiet(const char *const *argv, const char *what, al_error *err)
{
    _cleanup_close_ int nullfd = open("/dev/null", O_WRONLY | O_CLOEXEC);
    FILE *errf = tmpfile();
    if (nullfd < 0 || !errf) {
        if (errf)
            fclose(errf);
        return al_err(err, -errno, "cannot %s: %s", what, strerror(errno));
    }
    int st = 0;
    int r = al_spawn_wait(argv, nullfd, fileno(errf), &st);
    if (r < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        char why[300] = "";
        rewind(errf);
        if (!fgets(why, sizeof(why), errf))
            snprintf(why, sizeof(why), "%s", r < 0 ? strerror(-r) : "failed");
        why[strcspn(why, "\n")] = '\0';
        fclose(errf);
        return al_err(err, r < 0 ? r : -EIO, "cannot %s with %s: %s", what, argv[0], why);
    }
    fclose(errf);
    return 0;
}

int al_spawn_start(const char *const *argv, int in_fd, int out_fd, int err_fd, pid_t *pid)
{
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    int r = posix_spawn_file_actions_init(&fa);
    if (r)
        return -r;
    r = posix_spawnattr_init(&at);
    if (r) {
        posix_spawn_file_actions_destroy(&fa);
        return -r;
    }
    if (in_fd >= 0)
        r = posix_spawn_file_actions_adddup2(&fa, in_fd, 0);
    else
        r = posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    if (!r)
        r = posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
    if (!r)
        r = posix_spawn_file_actions_adddup2(&fa, err_fd, 2);
    /* A group of its own: a deadline kills what it started too. */
    if (!r)
        r = posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP);
    if (!r)
        r = posix_spawnattr_setpgroup(&at, 0);
    if (!r)
        r = posix_spawnp(pid, argv[0], &fa, &at, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    return -r;
}

int al_spawn_reap(pid_t pid, unsigned timeout_s, int *status)
{
    uint64_t end = timeout_s ? al_now_ms() + (uint64_t)timeout_s * 1000 : 0;
    bool termed = false;
    for (;;) {
        int st;
        pid_t w = waitpid(pid, &st, end ? WNOHANG : 0);
        if (w == pid) {
            *status = st;
            /* What it left running in its group goes with it. */
            kill(-pid, SIGKILL);
            return termed ? -ETIMEDOUT : 0;
        }
        if (w < 0 && errno != EINTR)
            return -errno;
        if (end && al_now_ms() >= end) {
            /* SIGTERM first, so that a builder removes its containers; SIGKILL 10 s later. */
            kill(-pid, termed ? SIGKILL : SIGTERM);
            end = al_now_ms() + 10000;
            termed = true;
        }
        if (w == 0)
            usleep(50 * 1000);
    }
}

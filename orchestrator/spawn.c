/* Running a host helper program (qemu-img, an image recipe) to completion. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

extern char **environ;

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

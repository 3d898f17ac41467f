/* Running a host helper program (qemu-img, an image recipe) to completion. */
#include "internal.h"

#include <fcntl.h>
#include <spawn.h>
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

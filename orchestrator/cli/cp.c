/* airlock cp and airlock ps: files into and out of a session another airlock process holds. */
#include "cli.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

static const char cp_usage[] =
    "Usage: airlock cp SRC DST\n"
    "\n"
    "Copy a file or directory into or out of a running session. One side is SESSION:/path\n"
    "(SESSION as 'airlock ps' lists it, or empty, ':/path', when one session runs), the\n"
    "other a host path. A directory is copied whole; one copied out is never merged into an\n"
    "existing directory, and symlinks, special files and .git/ contents in it are left out\n"
    "(files come without exec bits).\n";

/* "SESSION:/path" or ":/path": the session part (NULL when empty) and the path. Host paths
 * are never taken for guest ones: the guest side must say ":/". */
static bool guest_arg(char *arg, char **session, char **path)
{
    char *colon = strstr(arg, ":/");
    if (!colon || strchr(arg, '/') < colon)
        return false;
    *colon = '\0';
    *session = arg[0] ? arg : NULL;
    *path = colon + 1;
    return true;
}

int cmd_cp(struct cli_globals *g, int argc, char **argv)
{
    (void)g;
    if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        fputs(cp_usage, stdout);
        return 0;
    }
    if (argc != 3) {
        fputs(cp_usage, stderr);
        return 2;
    }
    char *src_session, *src_path, *dst_session, *dst_path;
    bool src_guest = guest_arg(argv[1], &src_session, &src_path);
    bool dst_guest = guest_arg(argv[2], &dst_session, &dst_path);
    if (src_guest == dst_guest) {
        fprintf(stderr, "airlock: cp wants one side in a session (SESSION:/path or :/path)\n");
        return 2;
    }
    al_error err = {0};
    al_remote *r = NULL;
    int ret = al_remote_open(src_guest ? src_session : dst_session, &r, &err);
    if (ret == 0)
        ret = src_guest ? al_remote_get(r, src_path, argv[2], &err)
                        : al_remote_put(r, argv[1], dst_path, &err);
    al_remote_close(r);
    if (ret < 0) {
        cli_error(&err);
        return 1;
    }
    if (ret > 0)
        fprintf(stderr, "airlock: %d entries left out (symlinks, special files, .git/)\n", ret);
    return 0;
}

static void print_session(void *ctx, const al_session_info *info)
{
    time_t now = *(time_t *)ctx;
    long age = (long)(now - info->started);
    printf("%-22s %-12s %5lds %ld\n", info->name, info->image, age > 0 ? age : 0, info->pid);
}

int cmd_ps(struct cli_globals *g, int argc, char **argv)
{
    (void)g;
    if (argc > 1) {
        fputs("Usage: airlock ps\n\nList the running sessions (for airlock cp).\n",
              strcmp(argv[1], "-h") && strcmp(argv[1], "--help") ? stderr : stdout);
        return strcmp(argv[1], "-h") && strcmp(argv[1], "--help") ? 2 : 0;
    }
    time_t now = time(NULL);
    printf("%-22s %-12s %6s %s\n", "NAME", "IMAGE", "AGE", "PID");
    al_error err = {0};
    if (al_session_list(print_session, &now, &err) < 0) {
        cli_error(&err);
        return 1;
    }
    return 0;
}

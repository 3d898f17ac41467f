/* airlock cp and airlock ps: files into and out of a session another airlock process holds. */
#include "cli.h"

#include <errno.h>
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
    "(files come without exec bits). A session of airlockd (WHERE airlockd in 'airlock ps')\n"
    "takes and gives single files, through its API.\n";

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
    if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        fputs(cp_usage, stdout);
        return 0;
    }
    if (argc != 3) {
        fputs(cp_usage, stderr);
        return 2;
    }
    char *src_session = NULL, *src_path = NULL, *dst_session = NULL, *dst_path = NULL;
    bool src_guest = guest_arg(argv[1], &src_session, &src_path);
    bool dst_guest = guest_arg(argv[2], &dst_session, &dst_path);
    if (src_guest == dst_guest) {
        fprintf(stderr, "airlock: cp wants one side in a session (SESSION:/path or :/path)\n");
        return 2;
    }
    const char *session = src_guest ? src_session : dst_session;
    /* A session of airlockd: asked for with --server, or one no airlock process here holds
     * while the daemon's socket is there. */
    if (session && cli_remote_wanted(g))
        return cli_remote_cp(g, session, src_guest ? src_path : argv[1],
                             src_guest ? argv[2] : dst_path, !src_guest);
    al_error err = {0};
    al_attach *r = NULL;
    int ret = al_attach_open(session, &r, &err);
    if (ret == -ENOENT && session && cli_daemon_here())
        return cli_remote_cp(g, session, src_guest ? src_path : argv[1],
                             src_guest ? argv[2] : dst_path, !src_guest);
    if (ret == 0)
        ret = src_guest ? al_attach_get(r, src_path, argv[2], &err)
                        : al_attach_put(r, argv[1], dst_path, &err);
    al_attach_close(r);
    if (ret < 0) {
        cli_error(&err);
        return 1;
    }
    if (ret > 0)
        fprintf(stderr, "airlock: %d entries left out (symlinks, special files, .git/)\n", ret);
    return 0;
}

int cmd_ps(struct cli_globals *g, int argc, char **argv)
{
    if (argc > 1) {
        fputs("Usage: airlock ps\n\nList the running sessions: those of airlock processes "
              "here (for airlock cp) and airlockd's (WHERE airlockd).\n",
              strcmp(argv[1], "-h") && strcmp(argv[1], "--help") ? stderr : stdout);
        return strcmp(argv[1], "-h") && strcmp(argv[1], "--help") ? 2 : 0;
    }
    return cli_sessions_table(g);
}

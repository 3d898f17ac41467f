/* airlock shell: a login shell on a terminal, in a running session another airlock process
 * holds (a chat's VM, an exec --linger), or in a fresh one (airlock exec -it with the shell). */
#include "cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "Usage: airlock shell SESSION\n"
    "       airlock shell [EXEC OPTIONS]\n"
    "\n"
    "A login shell (bash -l, else sh -l) on a terminal in a running session: SESSION as\n"
    "'airlock ps' lists it (a chat's VM, an 'airlock exec --linger' session, a session of\n"
    "airlockd: --server or $AIRLOCK_HOST, else the local daemon's socket). Without\n"
    "SESSION, in a fresh session that ends with the shell: the options are airlock exec's\n"
    "(--image, --workdir, --net, --memory, ...). The shell starts in /workspace when the\n"
    "session has one. Leave with 'exit' or Ctrl-D; " CLI_TTY_LEAVE_HELP ".\n"
    "Exits with the shell's status.\n";

static int shell_in(struct cli_globals *g, const char *name)
{
    al_error err = {0};
    al_attach *r = NULL;
    if (cli_remote_wanted(g))
        return cli_remote_shell(g, name);
    if (al_attach_open(name, &r, &err) < 0) {
        if (err.code == -ENOENT && cli_daemon_here())
            return cli_remote_shell(g, name);
        cli_error(&err);
        return EXIT_AIRLOCK_FAILED;
    }
    const char *argv[] = {"/bin/sh", "-c", AL_LOGIN_SHELL, NULL};
    al_exec_opts eo = {.struct_size = sizeof(al_exec_opts),
                       .argv = argv,
                       .stdin_fd = AL_FD_STDIN,
                       .stdout_fd = 1,
                       .stderr_fd = 2};
    struct cli_tty t;
    al_exec_result res = AL_EXEC_RESULT_INIT;
    int ret = cli_tty_open(&t, true, &eo, &err);
    if (ret == 0)
        ret = cli_tty_pump(&t, &eo, &err);
    if (ret == 0)
        ret = al_attach_exec(r, &eo, &res, &err);
    cli_tty_close(&t);
    al_attach_close(r);
    int left = cli_tty_left(&t, -1);
    if (ret < 0) {
        cli_error(&err);
        return EXIT_AIRLOCK_FAILED;
    }
    return left >= 0 ? left : res.how == AL_EXEC_SIGNALED ? 128 + res.value : res.value;
}

int cmd_shell(struct cli_globals *g, int argc, char **argv)
{
    if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        fputs(usage, stdout);
        return 0;
    }
    if (argc == 2 && argv[1][0] != '-')
        return shell_in(g, argv[1]);
    /* A fresh session: airlock exec -i -t OPTIONS -- the login shell. */
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--")) {
            fprintf(stderr, "airlock: shell runs the login shell; for a command of your own "
                            "use 'airlock exec -it -- CMD'\n");
            return 2;
        }
    char **args = calloc((size_t)argc + 8, sizeof(char *));
    if (!args) {
        fprintf(stderr, "airlock: out of memory\n");
        return EXIT_AIRLOCK_FAILED;
    }
    int n = 0;
    args[n++] = "exec";
    args[n++] = "-i";
    args[n++] = "-t";
    for (int i = 1; i < argc; i++)
        args[n++] = argv[i];
    args[n++] = "--";
    args[n++] = "/bin/sh";
    args[n++] = "-c";
    args[n++] = (char *)AL_LOGIN_SHELL;
    args[n] = NULL;
    int rc = cmd_exec(g, n, args);
    free(args);
    return rc;
}

/* airlock gc: reap what crashed runs left behind. */
#include "cli.h"

#include <stdio.h>
#include <string.h>

int cmd_gc(struct cli_globals *g, int argc, char **argv)
{
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        puts("Usage: airlock gc\n\nDestroy the VMs and remove the session files that crashed\n"
             "airlock runs left behind. Live sessions are never touched; only domains\n"
             "carrying airlock's metadata are looked at.");
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "airlock: gc takes no arguments\n");
        return 2;
    }
    al_error err = {0};
    int n = al_gc(g->connect_uri, &err);
    if (n < 0) {
        cli_error(&err);
        return 1;
    }
    if (!g->quiet)
        printf("reaped %d\n", n);
    return 0;
}

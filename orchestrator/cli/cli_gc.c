/* airlock gc: reap what crashed runs left behind; with --kept KEEPER, end the sessions a daemon
 * kept (airlockd on another store says which at its start). */
#include "cli.h"

#include <getopt.h>
#include <stdio.h>
#include <string.h>

static const char usage[] =
    "Usage: airlock gc\n"
    "       airlock gc --kept KEEPER\n"
    "\n"
    "Destroy the VMs and remove the session files that crashed airlock runs left behind.\n"
    "Live sessions are never touched; only domains carrying airlock's metadata are looked\n"
    "at. With --kept, end the sessions a daemon kept for KEEPER (the name airlockd logs at\n"
    "its start for another store's sessions) that no running process holds: their VMs\n"
    "destroyed, their files removed.\n";

struct discard {
    const char *keeper;
    int ended, held, failed;
};

static void discard_one(void *ctx, const al_kept_info *k)
{
    struct discard *d = ctx;
    if (k->held) { /* its daemon runs: it is that daemon's to end */
        d->held++;
        return;
    }
    al_error err = {0};
    if (al_session_discard(d->keeper, k->name, &err) == 0) {
        d->ended++;
    } else {
        cli_error(&err);
        d->failed++;
    }
}

static int gc_kept(const char *keeper)
{
    struct discard d = {.keeper = keeper};
    al_error err = {0};
    if (al_session_kept(keeper, discard_one, &d, &err) < 0) {
        cli_error(&err);
        return 1;
    }
    printf("ended %d kept session%s of %s\n", d.ended, d.ended == 1 ? "" : "s", keeper);
    if (d.held)
        fprintf(stderr,
                "airlock: %d held by a running daemon were left alone (stop it first, or "
                "delete them through it)\n",
                d.held);
    return d.failed ? 1 : 0;
}

int cmd_gc(struct cli_globals *g, int argc, char **argv)
{
    static const struct option opts[] = {
        {"kept", required_argument, NULL, 'k'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *kept = NULL;
    int c;
    optind = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'k':
            kept = optarg;
            break;
        case 'h':
            fputs(usage, stdout);
            return 0;
        default:
            return cli_bad_option("gc", argc, argv, "h", opts);
        }
    }
    if (optind != argc) {
        fprintf(stderr, "airlock: gc takes no arguments but --kept KEEPER\n");
        return 2;
    }
    if (kept)
        return gc_kept(kept);
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

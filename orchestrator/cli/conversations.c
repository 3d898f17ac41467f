/* airlock conversations: the saved conversations, newest last. */
#include "chat.h"
#include "cli.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

static void show(void *ctx, const al_conv_info *ci)
{
    (void)ctx;
    char when[32] = "?";
    time_t t = (time_t)ci->updated;
    struct tm tm;
    if (localtime_r(&t, &tm))
        strftime(when, sizeof(when), "%Y-%m-%d %H:%M", &tm);
    printf("%-24s %-16s %-20.20s %5u  %s\n", ci->id, when, ci->model, ci->messages, ci->title);
}

int cmd_conversations(struct cli_globals *g, int argc, char **argv)
{
    (void)g;
    if (argc > 1) {
        if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
            puts("Usage: airlock conversations\n\nList saved conversations; continue one with "
                 "'airlock --resume ID'.");
            return 0;
        }
        fputs("Usage: airlock conversations\n", stderr);
        return 2;
    }
    char dir[AL_PATH_MAX];
    al_error e = {0};
    if (al_conv_dir(dir, sizeof(dir), &e) < 0) {
        cli_error(&e);
        return 1;
    }
    printf("%-24s %-16s %-20s %5s  %s\n", "ID", "UPDATED", "MODEL", "MSGS", "FIRST MESSAGE");
    int n = al_conv_list(show, NULL, &e);
    if (n < 0) {
        cli_error(&e);
        return 1;
    }
    if (n == 0)
        printf("(none yet in %s)\n", dir);
    return 0;
}

/* airlock image: the image store. */
#include "cli.h"

#include <stdio.h>
#include <string.h>

static const char usage[] = "Usage: airlock image ls\n"
                           "\n"
                           "List the images in the store ($AIRLOCK_IMAGE_DIR, else\n"
                           "/var/lib/airlock/images for root, else\n"
                           "~/.local/share/airlock/images).\n";

static void print_image(void *ctx, const al_image *img, const char *name, const char *why)
{
    int *bad = ctx;
    if (!img) {
        printf("%-16s %-8s %s\n", name, "broken", why);
        (*bad)++;
        return;
    }
    printf("%-16s %-8u %-24s %s\n", img->name, img->agent_protocol, img->languages, img->dir);
}

int cmd_image(struct cli_globals *g, int argc, char **argv)
{
    (void)g;
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "ls") != 0) {
        fprintf(stderr, "airlock: unknown image command '%s'\n", argv[1]);
        return 2;
    }
    char store[4096];
    al_error err = {0};
    if (al_image_store_dir(store, sizeof(store), &err) < 0) {
        cli_error(&err);
        return 1;
    }
    int bad = 0;
    printf("%-16s %-8s %-24s %s\n", "NAME", "PROTOCOL", "LANGUAGES", "PATH");
    int n = al_image_list(print_image, &bad, &err);
    if (n < 0) {
        cli_error(&err);
        return 1;
    }
    if (n == 0)
        fprintf(stderr, "airlock: no images in %s (build one: ./install.sh)\n", store);
    return bad ? 1 : 0;
}

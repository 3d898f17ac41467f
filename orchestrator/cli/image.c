/* airlock image: the image store. */
#include "cli.h"

#include <stdio.h>
#include <string.h>

static const char usage[] =
    "Usage: airlock image ls\n"
    "       airlock image build NAME [--toolchain]\n"
    "       airlock image rm NAME\n"
    "\n"
    "The image store ($AIRLOCK_IMAGE_DIR, else /var/lib/airlock/images for root, else\n"
    "~/.local/share/airlock/images).\n"
    "\n"
    "  ls                        list the images\n"
    "  build NAME                build an image from its recipe (images/build-NAME.sh):\n"
    "                            'debian' (the default image once built) or 'tiny'\n"
    "      --toolchain           with a C toolchain (debian: build-essential)\n"
    "  rm NAME                   remove an image (running sessions keep theirs)\n";
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

static int image_ls(void)
{
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
        fprintf(stderr, "airlock: no images in %s (build one: airlock image build debian)\n",
                store);
    return bad ? 1 : 0;
}

int cmd_image(struct cli_globals *g, int argc, char **argv)
{
    (void)g;
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *sub = argv[1];
    al_error err = {0};
    if (!strcmp(sub, "ls") && argc == 2)
        return image_ls();
    if (!strcmp(sub, "build") && (argc == 3 || (argc == 4 && !strcmp(argv[3], "--toolchain")))) {
        al_image_build_opts o = {.name = argv[2], .toolchain = argc == 4, .log_fd = 2};
        if (al_image_build(&o, &err) < 0) {
            cli_error(&err);
            return 1;
        }
        fprintf(stderr, "airlock: image '%s' built\n", argv[2]);
        return 0;
    }
    if (!strcmp(sub, "rm") && argc == 3) {
        if (al_image_remove(argv[2], &err) < 0) {
            cli_error(&err);
            return 1;
        }
        return 0;
    }
    if (strcmp(sub, "ls") && strcmp(sub, "build") && strcmp(sub, "rm"))
        fprintf(stderr, "airlock: unknown image command '%s'\n", sub);
    else
        fputs(usage, stderr);
    return 2;
}

/* airlock image: the image store. */
#include "cli.h"

#include <getopt.h>
#include <stdio.h>
#include <string.h>

static const char usage[] =
    "Usage: airlock image ls [--hosts URI[,URI...]]\n"
    "       airlock image build NAME [--toolchain]\n"
    "       airlock image import FILE --name NAME [--user USER] [--memory MIB] [--force]\n"
    "       airlock image rm NAME\n"
    "       airlock image warm NAME [--memory MIB] [--cpus N]\n"
    "\n"
    "The image store ($AIRLOCK_IMAGE_DIR, else /var/lib/airlock/images for root, else\n"
    "~/.local/share/airlock/images).\n"
    "\n"
    "  ls                        list the images, then their warm templates\n"
    "      --hosts URI,...       then the images uploaded to those libvirt hosts, and whether\n"
    "                            each is the version in this store\n"
    "  build NAME                build an image from its recipe (images/build-NAME.sh):\n"
    "                            'debian' (the default image once built) or 'tiny'\n"
    "      --toolchain           with a C toolchain (debian: build-essential)\n"
    "  import FILE               add a stock cloud image downloaded elsewhere (qcow2, or a raw\n"
    "                            disk), booted by its own bootloader, set up by cloud-init and\n"
    "                            reached over SSH; refused: backing or external data files\n"
    "      --name NAME           its name in the store\n"
    "      --user USER           its default user, who gets the session's key (default:\n"
    "                            debian; Ubuntu's images: ubuntu)\n"
    "      --memory MIB          guest memory of its sessions (default: 1024)\n"
    "      --force               replace an image of that name\n"
    "  rm NAME                   remove an image (running sessions keep theirs)\n"
    "  warm NAME                 build (or rebuild) the image's warm template: a booted guest\n"
    "                            with the python kernel's numpy, pandas and matplotlib\n"
    "                            imported, which sessions of that shape are restored from\n"
    "                            ($AIRLOCK_WARM: use (default), auto to build on first use, off)\n"
    "      --memory MIB          for sessions of this memory (default: the image's)\n"
    "      --cpus N              for sessions of N vCPUs (default: 1)\n";
static void print_image(void *ctx, const al_image *img, const char *name, const char *why)
{
    int *bad = ctx;
    if (!img) {
        printf("%-16s %-8s %s\n", name, "broken", why);
        (*bad)++;
        return;
    }
    /* One word, so scripts can split the line: "ssh:USER" says whom sessions log in as. */
    char transport[80];
    if (img->transport == AL_TRANSPORT_SSH)
        snprintf(transport, sizeof(transport), "ssh:%s", img->ssh_user);
    else
        snprintf(transport, sizeof(transport), "virtio");
    printf("%-16s %-8u %-16s %-24s %s\n", img->name, img->agent_protocol, transport,
           *img->languages ? img->languages : "-", img->dir);
}

static void print_template(void *ctx, const al_template_info *t)
{
    int *n = ctx;
    if ((*n)++ == 0)
        printf("\n%-16s %-8s %-5s %-6s %-9s %-10s %s\n", "TEMPLATE OF", "MEMORY", "CPUS", "ACCEL",
               "SIZE", "STATE", "PATH");
    char mem[32], size[32];
    snprintf(mem, sizeof(mem), "%uM", t->memory_mib);
    snprintf(size, sizeof(size), "%.1fM", (double)t->bytes / (1 << 20));
    printf("%-16s %-8s %-5u %-6s %-9s %-10s %s%s%s\n", t->image, mem, t->vcpus,
           t->kvm ? "kvm" : "tcg", size, t->why ? "refused" : "ready", t->path, t->why ? ": " : "",
           t->why ? t->why : "");
}

struct host_ctx {
    const char *uri;
    int n;
};

static void print_host_image(void *ctx, const al_host_image *hi)
{
    struct host_ctx *h = ctx;
    char size[32];
    snprintf(size, sizeof(size), "%.1fM", (double)hi->bytes / (1 << 20));
    printf("%-32s %-16s %-16s %-9s %s\n", h->uri, hi->image, hi->version, size,
           hi->current ? "current" : "old");
    h->n++;
}

/* The images on each host of a comma-separated list; 1 when a host could not be asked. */
static int image_ls_hosts(const char *list)
{
    _cleanup_free_ char *copy = strdup(list);
    if (!copy)
        return 1;
    int rc = 0;
    printf("\n%-32s %-16s %-16s %-9s %s\n", "HOST", "IMAGE", "VERSION", "SIZE", "STATE");
    char *save = NULL;
    for (char *uri = strtok_r(copy, ",", &save); uri; uri = strtok_r(NULL, ",", &save)) {
        struct host_ctx h = {.uri = uri};
        al_error err = {0};
        if (al_host_images(uri, print_host_image, &h, &err) < 0) {
            cli_error(&err);
            rc = 1;
        } else if (!h.n) {
            printf("%-32s %s\n", uri, "(none)");
        }
    }
    return rc;
}

static int image_ls(const char *hosts)
{
    char store[AL_PATH_MAX];
    al_error err = {0};
    if (al_image_store_dir(store, sizeof(store), &err) < 0) {
        cli_error(&err);
        return 1;
    }
    int bad = 0;
    printf("%-16s %-8s %-16s %-24s %s\n", "NAME", "PROTOCOL", "TRANSPORT", "LANGUAGES", "PATH");
    int n = al_image_list(print_image, &bad, &err);
    if (n < 0) {
        cli_error(&err);
        return 1;
    }
    if (n == 0)
        fprintf(stderr, "airlock: no images in %s (build one: airlock image build debian)\n",
                store);
    int ntemplates = 0;
    if (al_template_list(print_template, &ntemplates, &err) < 0) {
        cli_error(&err);
        return 1;
    }
    if (hosts && image_ls_hosts(hosts))
        return 1;
    return bad ? 1 : 0;
}

/* argv[0] is "warm". */
static int image_warm(struct cli_globals *g, int argc, char **argv)
{
    enum { OPT_MEMORY = 256, OPT_CPUS };
    static const struct option opts[] = {
        {"memory", required_argument, NULL, OPT_MEMORY},
        {"cpus", required_argument, NULL, OPT_CPUS},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    al_session_opts o = {.struct_size = sizeof(al_session_opts),
                         .connect_uri = g->connect_uri,
                         .on_notice = cli_print_notice,
                         .quiet = g->quiet};
    int c;
    optind = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case OPT_MEMORY:
            o.memory_mib = (unsigned)cli_number("--memory", optarg, 1048576);
            break;
        case OPT_CPUS:
            o.vcpus = (unsigned)cli_number("--cpus", optarg, 64);
            break;
        case 'h':
            fputs(usage, stdout);
            return 0;
        default:
            return cli_bad_option("image warm", argc, argv, "h", opts);
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "airlock: image warm wants one image NAME\n");
        return 2;
    }
    o.image = argv[optind];
    al_error err = {0};
    if (al_template_build(&o, &err) < 0) {
        cli_error(&err);
        return 1;
    }
    fprintf(stderr, "airlock: warm template of image '%s' built\n", o.image);
    return 0;
}

/* argv[0] is "import". */
static int image_import(int argc, char **argv)
{
    enum { OPT_NAME = 256, OPT_USER, OPT_MEMORY, OPT_FORCE };
    static const struct option opts[] = {
        {"name", required_argument, NULL, OPT_NAME},
        {"user", required_argument, NULL, OPT_USER},
        {"memory", required_argument, NULL, OPT_MEMORY},
        {"force", no_argument, NULL, OPT_FORCE},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    al_image_import_opts o = AL_IMAGE_IMPORT_OPTS_INIT;
    int c;
    optind = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case OPT_NAME:
            o.name = optarg;
            break;
        case OPT_USER:
            o.ssh_user = optarg;
            break;
        case OPT_MEMORY:
            o.memory_mib = (unsigned)cli_number("--memory", optarg, 1048576);
            if (o.memory_mib < 64) {
                fprintf(stderr, "airlock: --memory wants at least 64 (MiB)\n");
                return 2;
            }
            break;
        case OPT_FORCE:
            o.force = true;
            break;
        case 'h':
            fputs(usage, stdout);
            return 0;
        default:
            return cli_bad_option("image import", argc, argv, "h", opts);
        }
    }
    if (optind != argc - 1 || !o.name) {
        fprintf(stderr, "airlock: image import wants FILE and --name NAME\n");
        return 2;
    }
    o.path = argv[optind];
    al_error err = {0};
    if (al_image_import(&o, &err) < 0) {
        cli_error(&err);
        return 1;
    }
    fprintf(stderr, "airlock: image '%s' imported\n", o.name);
    return 0;
}

int cmd_image(struct cli_globals *g, int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *sub = argv[1];
    al_error err = {0};
    if (!strcmp(sub, "ls") && argc == 2)
        return image_ls(NULL);
    if (!strcmp(sub, "ls") && argc == 4 && !strcmp(argv[2], "--hosts"))
        return image_ls(argv[3]);
    if (!strcmp(sub, "build") && (argc == 3 || (argc == 4 && !strcmp(argv[3], "--toolchain")))) {
        al_image_build_opts o = {.struct_size = sizeof(al_image_build_opts),
                                 .name = argv[2],
                                 .toolchain = argc == 4,
                                 .log_fd = 2};
        if (al_image_build(&o, &err) < 0) {
            cli_error(&err);
            return 1;
        }
        fprintf(stderr, "airlock: image '%s' built\n", argv[2]);
        return 0;
    }
    if (!strcmp(sub, "import"))
        return image_import(argc - 1, argv + 1);
    if (!strcmp(sub, "warm"))
        return image_warm(g, argc - 1, argv + 1);
    if (!strcmp(sub, "rm") && argc == 3) {
        if (al_image_remove(argv[2], &err) < 0) {
            cli_error(&err);
            return 1;
        }
        return 0;
    }
    static const char *const subs[] = {"ls", "build", "rm", "import", "warm", NULL};
    if (strcmp(sub, "ls") && strcmp(sub, "build") && strcmp(sub, "rm")) {
        const char *near = cli_nearest(sub, strlen(sub), subs);
        fprintf(stderr, "airlock: unknown image command '%s'%s%s%s (see 'airlock image --help')\n",
                sub, near ? "; did you mean '" : "", near ? near : "", near ? "'?" : "");
    } else
        fputs(usage, stderr);
    return 2;
}

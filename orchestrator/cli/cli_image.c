/* airlock image: the image store. */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "Usage: airlock image ls [--hosts URI[,URI...]]\n"
    "       airlock image build NAME [--toolchain]\n"
    "       airlock image build NAME --from PATH [--context DIR] [--base IMAGE]\n"
    "                           [--max-size SIZE] [--timeout S] [--keep-setid] [--kernels]\n"
    "                           [--force]\n"
    "       airlock image inspect NAME\n"
    "       airlock image export-base [IMAGE] [--ref REF]\n"
    "       airlock image commit SESSION NAME [--checkpoint ID] [--force]\n"
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
    "  build NAME --from PATH    an image from what container tools make: a Containerfile or\n"
    "                            Dockerfile (built with buildah), an OCI image layout or archive,\n"
    "                            a 'docker save' tarball, a root file system or its tar;\n"
    "                            booted with the base image's kernel and agent; its ENV, WORKDIR\n"
    "                            and CMD become its sessions' defaults. The layers are read as\n"
    "                            hostile: '..' and absolute paths and links out of the tree are\n"
    "                            refused, device nodes dropped, set-id bits cleared\n"
    "      --context DIR         a Containerfile's build context (default: its directory)\n"
    "      --base IMAGE          whose kernel and initrd boot it (default: debian)\n"
    "      --max-size SIZE       most data its files may hold (default: 8G)\n"
    "      --timeout S           a Containerfile's build is stopped after S s (default: 1800)\n"
    "      --keep-setid          keep set-uid and set-gid bits\n"
    "      --kernels             add python3 and IPython (the language kernels' needs) with\n"
    "                            the image's apt-get, in a buildah container\n"
    "      --force               replace an image of that name\n"
    "  inspect NAME              where an image came from (source, digest) and its defaults\n"
    "  export-base [IMAGE]       make a local container image of IMAGE's root disk (default\n"
    "                            debian, as airlock/debian) for a Containerfile's FROM, with no\n"
    "                            registry (needs podman)\n"
    "      --ref REF             its name (default: airlock/IMAGE)\n"
    "  commit SESSION NAME       save a running session's disk (see 'airlock ps') as a new image,\n"
    "                            flattened, without its SSH keys and machine-id\n"
    "      --checkpoint ID       the disk as that checkpoint left it\n"
    "      --force               replace an image of that name\n"
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
/* What image ls saw of the store: broken images, and the names listed (the templates shown are
 * those of these images: the state dir's templates may be of another store's). */
struct ls_ctx {
    int bad;
    char **names;
    size_t n, cap;
    int templates;
};

static void print_image(void *ctx, const al_image *img, const char *name, const char *why)
{
    struct ls_ctx *ls = ctx;
    if (!img) {
        printf("%-16s %-8s %s\n", name, "broken", why);
        ls->bad++;
        return;
    }
    if (al_grow(&ls->names, &ls->cap, ls->n, sizeof(*ls->names), 16) == 0 &&
        (ls->names[ls->n] = strdup(img->name)))
        ls->n++;
    /* One word, so scripts can split the line: "ssh:USER" says whom sessions log in as. */
    char transport[80];
    if (img->transport == AL_TRANSPORT_SSH)
        snprintf(transport, sizeof(transport), "ssh:%s", img->ssh_user);
    else
        snprintf(transport, sizeof(transport), "virtio");
    /* Where it came from last: one word, "KIND" or "KIND@sha256:12 hex digits". */
    printf("%-16s %-8u %-16s %-24s %s  %s%s%.19s\n", img->name, img->agent_protocol, transport,
           *img->languages ? img->languages : "-", img->dir, img->source, *img->digest ? "@" : "",
           img->digest);
}

static void print_strv(const char *key, char **v)
{
    printf("%-9s", key);
    for (; v && *v; v++)
        printf(" %s", *v);
    printf("\n");
}

/* airlock image inspect NAME: one image's manifest as a person reads it. */
static int image_inspect(const char *name)
{
    al_image img = AL_IMAGE_INIT;
    al_error err = {0};
    if (al_image_load(name, &img, &err) < 0) {
        cli_error(&err);
        return 1;
    }
    printf("name      %s\ndir       %s\nsource    %s%s%s\ndigest    %s\nlanguages %s\n", img.name,
           img.dir, img.source, *img.source_path ? " " : "", img.source_path,
           *img.digest ? img.digest : "-", *img.languages ? img.languages : "-");
    print_strv("env", img.env);
    printf("workdir   %s\nuser      %s\n", *img.workdir ? img.workdir : "-",
           *img.user ? img.user : "-");
    print_strv("cmd", img.cmd);
    al_image_free(&img);
    return 0;
}

/* Sizes as 8G, 512M, 100k or bytes. */
static uint64_t parse_size(const char *opt, const char *s)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    unsigned shift = 0;
    if (*end == 'k' || *end == 'K')
        shift = 10;
    else if (*end == 'm' || *end == 'M')
        shift = 20;
    else if (*end == 'g' || *end == 'G')
        shift = 30;
    else if (*end == 't' || *end == 'T')
        shift = 40;
    if (shift)
        end++;
    if (errno || end == s || *end || v == 0 || v > (~0ull >> shift)) {
        fprintf(stderr, "airlock: %s wants a size such as 8G or 512M, not '%s'\n", opt, s);
        exit(2);
    }
    return (uint64_t)v << shift;
}

/* argv[0] is "build": a recipe, or --from what container tools make. */
static int image_build(int argc, char **argv)
{
    enum {
        OPT_TOOLCHAIN = 256,
        OPT_FROM,
        OPT_CONTEXT,
        OPT_BASE,
        OPT_MAX_SIZE,
        OPT_TIMEOUT,
        OPT_KEEP_SETID,
        OPT_FORCE,
        OPT_KERNELS
    };
    static const struct option opts[] = {
        {"toolchain", no_argument, NULL, OPT_TOOLCHAIN},
        {"from", required_argument, NULL, OPT_FROM},
        {"context", required_argument, NULL, OPT_CONTEXT},
        {"base", required_argument, NULL, OPT_BASE},
        {"max-size", required_argument, NULL, OPT_MAX_SIZE},
        {"timeout", required_argument, NULL, OPT_TIMEOUT},
        {"keep-setid", no_argument, NULL, OPT_KEEP_SETID},
        {"force", no_argument, NULL, OPT_FORCE},
        {"kernels", no_argument, NULL, OPT_KERNELS},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    al_image_from_opts f = AL_IMAGE_FROM_OPTS_INIT;
    f.log_fd = 2;
    bool toolchain = false;
    int c;
    optind = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case OPT_TOOLCHAIN:
            toolchain = true;
            break;
        case OPT_FROM:
            f.from = optarg;
            break;
        case OPT_CONTEXT:
            f.context = optarg;
            break;
        case OPT_BASE:
            f.base = optarg;
            break;
        case OPT_MAX_SIZE:
            f.max_size = parse_size("--max-size", optarg);
            break;
        case OPT_TIMEOUT:
            f.timeout_s = (unsigned)cli_number("--timeout", optarg, 7 * 86400);
            break;
        case OPT_KEEP_SETID:
            f.keep_setid = true;
            break;
        case OPT_FORCE:
            f.force = true;
            break;
        case OPT_KERNELS:
            f.kernels = true;
            break;
        case 'h':
            fputs(usage, stdout);
            return 0;
        default:
            return cli_bad_option("image build", argc, argv, "h", opts);
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "airlock: image build wants one image NAME\n");
        return 2;
    }
    bool from_opts =
        f.context || f.base || f.max_size || f.timeout_s || f.keep_setid || f.force || f.kernels;
    if ((toolchain && f.from) || (from_opts && !f.from)) {
        fprintf(stderr, "airlock: --toolchain is for recipes; --context, --base, --max-size, "
                        "--timeout, --keep-setid, --kernels and --force go with --from\n");
        return 2;
    }
    al_error err = {0};
    f.name = argv[optind];
    if (f.from) {
        if (al_image_from(&f, &err) < 0) {
            cli_error(&err);
            return 1;
        }
        fprintf(stderr, "airlock: image '%s' built from %s\n", f.name, f.from);
        return 0;
    }
    al_image_build_opts o = {.struct_size = sizeof(al_image_build_opts),
                             .name = f.name,
                             .toolchain = toolchain,
                             .log_fd = 2};
    if (al_image_build(&o, &err) < 0) {
        cli_error(&err);
        return 1;
    }
    fprintf(stderr, "airlock: image '%s' built\n", f.name);
    return 0;
}

/* argv[0] is "export-base". */
static int image_export(int argc, char **argv)
{
    static const struct option opts[] = {
        {"ref", required_argument, NULL, 'r'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    al_image_export_opts o = AL_IMAGE_EXPORT_OPTS_INIT;
    o.log_fd = 2;
    int c;
    optind = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'r':
            o.ref = optarg;
            break;
        case 'h':
            fputs(usage, stdout);
            return 0;
        default:
            return cli_bad_option("image export-base", argc, argv, "h", opts);
        }
    }
    if (optind < argc - 1) {
        fprintf(stderr, "airlock: image export-base wants at most one image NAME\n");
        return 2;
    }
    o.image = optind < argc ? argv[optind] : NULL;
    al_error err = {0};
    if (al_image_export_base(&o, &err) < 0) {
        cli_error(&err);
        return 1;
    }
    fprintf(stderr, "airlock: container image '%s' made (FROM it in a Containerfile)\n",
            o.ref ? o.ref : "airlock/debian");
    return 0;
}

/* argv[0] is "commit": asks the process that holds the session (its control socket), or
 * airlockd when it holds it. */
static int image_commit(struct cli_globals *g, int argc, char **argv)
{
    static const struct option opts[] = {
        {"checkpoint", required_argument, NULL, 'c'},
        {"force", no_argument, NULL, 'f'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    al_image_commit_opts o = AL_IMAGE_COMMIT_OPTS_INIT;
    const char *checkpoint = NULL;
    int c;
    optind = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            checkpoint = optarg; /* a number here; airlockd's ids are its own words */
            break;
        case 'f':
            o.force = true;
            break;
        case 'h':
            fputs(usage, stdout);
            return 0;
        default:
            return cli_bad_option("image commit", argc, argv, "h", opts);
        }
    }
    if (optind != argc - 2) {
        fprintf(stderr, "airlock: image commit wants SESSION and NAME\n");
        return 2;
    }
    o.name = argv[optind + 1];
    if (cli_remote_wanted(g))
        return cli_remote_commit(g, argv[optind], o.name, checkpoint, o.force);
    al_error err = {0};
    al_attach *a = NULL;
    int r = al_attach_open(argv[optind], &a, &err);
    if (r == -ENOENT && cli_daemon_here())
        return cli_remote_commit(g, argv[optind], o.name, checkpoint, o.force);
    if (checkpoint)
        o.checkpoint = (uint32_t)cli_number("--checkpoint", checkpoint, UINT32_MAX);
    if (r < 0 || al_attach_commit(a, &o, &err) < 0) {
        al_attach_close(a);
        cli_error(&err);
        return 1;
    }
    al_attach_close(a);
    fprintf(stderr, "airlock: image '%s' saved from session %s\n", o.name, argv[optind]);
    return 0;
}

static void print_template(void *ctx, const al_template_info *t)
{
    struct ls_ctx *ls = ctx;
    bool ours = false;
    for (size_t i = 0; i < ls->n && !ours; i++)
        ours = !strcmp(ls->names[i], t->image);
    if (!ours)
        return;
    if (ls->templates++ == 0)
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
    struct ls_ctx ls = {0};
    printf("%-16s %-8s %-16s %-24s %s  %s\n", "NAME", "PROTOCOL", "TRANSPORT", "LANGUAGES", "PATH",
           "SOURCE");
    int n = al_image_list(print_image, &ls, &err);
    int rc = 0;
    if (n == 0)
        fprintf(stderr, "airlock: no images in %s (build one: airlock image build debian)\n",
                store);
    if (n < 0 || al_template_list(print_template, &ls, &err) < 0) {
        cli_error(&err);
        rc = 1;
    }
    for (size_t i = 0; i < ls.n; i++)
        free(ls.names[i]);
    free(ls.names);
    if (rc || (hosts && image_ls_hosts(hosts)))
        return 1;
    return ls.bad ? 1 : 0;
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
    if (!strcmp(sub, "build"))
        return image_build(argc - 1, argv + 1);
    if (!strcmp(sub, "inspect") && argc == 3)
        return image_inspect(argv[2]);
    if (!strcmp(sub, "export-base"))
        return image_export(argc - 1, argv + 1);
    if (!strcmp(sub, "commit"))
        return image_commit(g, argc - 1, argv + 1);
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
    static const char *const subs[] = {"ls",      "build",  "rm",          "import", "warm",
                                       "inspect", "commit", "export-base", NULL};
    if (strcmp(sub, "ls") && strcmp(sub, "rm") && strcmp(sub, "inspect")) {
        const char *near = cli_nearest(sub, strlen(sub), subs);
        fprintf(stderr, "airlock: unknown image command '%s'%s%s%s (see 'airlock image --help')\n",
                sub, near ? "; did you mean '" : "", near ? near : "", near ? "'?" : "");
    } else
        fputs(usage, stderr);
    return 2;
}

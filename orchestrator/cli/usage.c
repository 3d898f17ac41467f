/* Mistakes on the command line answered in one line: what was wrong, the nearest option or
 * command when one is close, and where the help is. */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *cli_nearest(const char *word, size_t n, const char *const *names)
{
    return al_nearest(word, n, names);
}

bool cli_split_pair(char *arg, char **a, char **b)
{
    char *colon = strchr(arg, ':');
    if (!colon || colon == arg || !colon[1])
        return false;
    *colon = '\0';
    *a = arg;
    *b = colon + 1;
    return true;
}

int cli_check_put(const char *path)
{
    struct stat st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st) < 0) {
        fprintf(stderr, "airlock: --put: cannot open '%s': %s\n", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    close(fd);
    if (!S_ISREG(st.st_mode)) {
        fprintf(stderr, "airlock: --put: '%s' is not a regular file\n", path);
        return -1;
    }
    return 0;
}

int cli_check_get(const char *path)
{
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return 0;
    char dir[4096];
    const char *slash = strrchr(path, '/');
    snprintf(dir, sizeof(dir), "%.*s", slash ? (int)(slash - path) + 1 : 1, slash ? path : ".");
    if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "airlock: --get: no such host directory: '%s'\n", dir);
        return -1;
    }
    return 0;
}

int cli_bad_option(const char *cmd, int argc, char **argv, const char *shorts,
                   const struct option *longs)
{
    const char *arg = optind >= 1 && optind <= argc ? argv[optind - 1] : "";
    char see[80];
    snprintf(see, sizeof(see), "see 'airlock %s%s--help'", cmd ? cmd : "", cmd ? " " : "");
    if (!strncmp(arg, "--", 2)) {
        const char *name = arg + 2;
        size_t n = strcspn(name, "=");
        const char *names[128];
        size_t count = 0, prefixed = 0;
        const struct option *exact = NULL;
        for (const struct option *o = longs; o && o->name && count < 127; o++) {
            names[count++] = o->name;
            if (strlen(o->name) == n && !strncmp(o->name, name, n))
                exact = o;
            else if (!strncmp(o->name, name, n))
                prefixed++;
        }
        names[count] = NULL;
        if (exact)
            fprintf(stderr, "airlock: option --%s %s (%s)\n", exact->name,
                    exact->has_arg == no_argument ? "takes no value" : "wants a value", see);
        else if (prefixed > 1)
            fprintf(stderr, "airlock: option --%.*s is ambiguous (%s)\n", (int)n, name, see);
        else {
            const char *near = cli_nearest(name, n, names);
            fprintf(stderr, "airlock: unknown option --%.*s%s%s%s (%s)\n", (int)n, name,
                    near ? "; did you mean --" : "", near ? near : "", near ? "?" : "", see);
        }
        return 2;
    }
    const char *at = optopt ? strchr(shorts, optopt) : NULL;
    if (at && optopt != ':' && optopt != '+')
        fprintf(stderr, "airlock: option -%c wants a value (%s)\n", optopt, see);
    else if (optopt > 32 && optopt < 127)
        fprintf(stderr, "airlock: unknown option -%c (%s)\n", optopt, see);
    else
        fprintf(stderr, "airlock: bad option %s (%s)\n", arg, see);
    return 2;
}

static bool all_digits(const char *s)
{
    return *s && strspn(s, "0123456789") == strlen(s);
}

int cli_check_docker_shorts(int argc, char **argv)
{
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++) {
        const char *a = argv[i];
        if (a[0] != '-' || a[1] == '-' || !a[1])
            continue;
        const char *t = strchr(a + 1, 't');
        /* -t5, -t 5, -it 5: the old short form of --timeout. */
        if (t && strspn(a + 1, "it") == (size_t)(t - a) &&
            (all_digits(t + 1) || (!t[1] && i + 1 < argc && all_digits(argv[i + 1])))) {
            fprintf(stderr,
                    "airlock: -t opens a terminal (as docker's -t); for a timeout write "
                    "--timeout %s\n",
                    t[1] ? t + 1 : argv[i + 1]);
            return 2;
        }
    }
    return -1;
}

void cli_duration(double seconds, char *buf, size_t len)
{
    long s = seconds > 0 ? (long)(seconds + 0.5) : 0;
    if (s <= 0)
        snprintf(buf, len, "now");
    else if (s < 120)
        snprintf(buf, len, "%lds", s);
    else if (s < 7200)
        snprintf(buf, len, "%ldm", s / 60);
    else if (s < 172800)
        snprintf(buf, len, "%ldh%02ldm", s / 3600, s % 3600 / 60);
    else
        snprintf(buf, len, "%ldd%02ldh", s / 86400, s % 86400 / 3600);
}

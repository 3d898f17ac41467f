/* airlock-agent --watch DIR [--recursive]: a directory's changes (inotify) as lines on stdout,
 * for a host that runs it as an ordinary process (airlockd's E2B WatchDir). Not the agent:
 * no channel, no loop. The host parses what this prints with bounds (it may be anything:
 * model code runs as root here), so the format is kept trivial:
 *
 *   ok                       the watches are set; events follow
 *   err CODE                 nothing is watched (CODE: not_found, not_dir, denied, internal)
 *   KIND HEX                 one event: create, write, remove, rename, chmod, and the name
 *                            relative to DIR in hex (any bytes, never a newline)
 *   overflow                 the kernel's queue overflowed: events were lost
 *
 * Kinds follow inotify as fsnotify reports it (a move in is a create, a move out a rename).
 * The agent's own writes (a temporary name renamed over the target, files.c) are reported as
 * what they are: create and write of the target, nothing of the temporary. With --recursive,
 * directories made later are watched as they appear (WATCH_DIRS_MAX in all). It ends when DIR
 * goes, when stdout closes, or on a signal. */
#include "agent.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>

#define WATCH_DIRS_MAX 4096
#define WATCH_DEPTH_MAX 32

#define WATCH_MASK                                                                                 \
    (IN_CREATE | IN_MODIFY | IN_ATTRIB | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO |                 \
     IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW | IN_EXCL_UNLINK)

struct wdir {
    int wd;
    char *rel; /* "" for DIR itself */
};

static struct wdir dirs[WATCH_DIRS_MAX];
static size_t ndirs;
static int ifd = -1;
static char root[PATH_MAX];
static bool recursive;

static void say(const char *kind, const char *rel)
{
    fputs(kind, stdout);
    if (rel) {
        fputc(' ', stdout);
        for (const unsigned char *p = (const unsigned char *)rel; *p; p++)
            fprintf(stdout, "%02x", *p);
    }
    fputc('\n', stdout);
}

static struct wdir *find_wd(int wd)
{
    for (size_t i = 0; i < ndirs; i++)
        if (dirs[i].wd == wd)
            return &dirs[i];
    return NULL;
}

static void drop_at(size_t i)
{
    free(dirs[i].rel);
    dirs[i] = dirs[--ndirs];
}

/* rel, then "/" and name (or name alone beneath DIR): malloc'd, or NULL past PATH_MAX. */
static char *join(const char *rel, const char *name)
{
    size_t a = strlen(rel), b = strlen(name);
    if (a + b + 2 > PATH_MAX)
        return NULL;
    char *s = malloc(a + b + 2);
    if (!s)
        return NULL;
    size_t at = 0;
    if (a) {
        memcpy(s, rel, a);
        s[a] = '/';
        at = a + 1;
    }
    memcpy(s + at, name, b + 1);
    return s;
}

/* Watches DIR/rel and, recursively, what is beneath it. 0 or -errno (for rel "" only: below
 * it, what cannot be watched is skipped). */
static int watch_add(const char *rel, int depth)
{
    char path[PATH_MAX];
    if ((size_t)snprintf(path, sizeof(path), "%s%s%s", root, rel[0] ? "/" : "", rel) >=
        sizeof(path))
        return -ENAMETOOLONG;
    if (ndirs == WATCH_DIRS_MAX)
        return -ENOSPC;
    int wd = inotify_add_watch(ifd, path, WATCH_MASK);
    if (wd < 0)
        return -errno;
    if (find_wd(wd)) /* the same directory twice (a bind mount): watched once */
        return 0;
    char *copy = strdup(rel);
    if (!copy) {
        inotify_rm_watch(ifd, wd);
        return -ENOMEM;
    }
    dirs[ndirs++] = (struct wdir){wd, copy};
    if (!recursive || depth >= WATCH_DEPTH_MAX)
        return 0;
    DIR *d = opendir(path);
    if (!d)
        return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        struct stat st;
        bool dir =
            e->d_type == DT_DIR ||
            (e->d_type == DT_UNKNOWN &&
             fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode));
        char *sub = dir ? join(rel, e->d_name) : NULL;
        if (sub)
            watch_add(sub, depth + 1);
        free(sub);
    }
    closedir(d);
    return 0;
}

/* A directory moved away or removed: its watch and those beneath it go. */
static void watch_drop_tree(const char *rel)
{
    size_t n = strlen(rel);
    for (size_t i = 0; i < ndirs;) {
        const char *r = dirs[i].rel;
        if (r[0] && !strncmp(r, rel, n) && (r[n] == 0 || r[n] == '/')) {
            inotify_rm_watch(ifd, dirs[i].wd);
            drop_at(i);
        } else {
            i++;
        }
    }
}

static int depth_of(const char *rel)
{
    int d = rel[0] ? 1 : 0;
    for (; *rel; rel++)
        d += *rel == '/';
    return d;
}

/* The agent's temporary names (files.c): ".airlock-PID-N.tmp". */
static bool agent_tmp(const char *name)
{
    size_t n = strlen(name);
    return n > 13 && !strncmp(name, ".airlock-", 9) && !strcmp(name + n - 4, ".tmp");
}

/* The cookie of the last move of one of the agent's temporary names. */
static uint32_t tmp_cookie;

static void event(const struct inotify_event *ev)
{
    if (ev->mask & IN_Q_OVERFLOW) {
        say("overflow", NULL);
        return;
    }
    struct wdir *w = find_wd(ev->wd);
    if (!w)
        return;
    if (ev->mask & IN_IGNORED) { /* its watch is gone: DIR itself ends the watching */
        bool top = !w->rel[0];
        drop_at((size_t)(w - dirs));
        if (top) {
            fflush(stdout);
            exit(0);
        }
        return;
    }
    if (!ev->len) /* an event of the directory itself: its parent reported it */
        return;
    bool tmp = agent_tmp(ev->name);
    if (tmp) {
        if (ev->mask & IN_MOVED_FROM)
            tmp_cookie = ev->cookie;
        return;
    }
    char *rel = join(w->rel, ev->name);
    if (!rel)
        return;
    bool isdir = ev->mask & IN_ISDIR;
    if (isdir && (ev->mask & (IN_MOVED_FROM | IN_DELETE)))
        watch_drop_tree(rel);
    /* a new directory is watched before it is reported, so that what is made in it after the
     * report is seen */
    if (isdir && recursive && (ev->mask & (IN_CREATE | IN_MOVED_TO)))
        watch_add(rel, depth_of(rel));
    if (ev->mask & IN_CREATE)
        say("create", rel);
    if (ev->mask & IN_MOVED_TO) {
        say("create", rel);
        if (ev->cookie && ev->cookie == tmp_cookie) /* one of the agent's writes */
            say("write", rel);
    }
    if (ev->mask & IN_MODIFY)
        say("write", rel);
    if (ev->mask & IN_ATTRIB)
        say("chmod", rel);
    if (ev->mask & IN_DELETE)
        say("remove", rel);
    if (ev->mask & IN_MOVED_FROM)
        say("rename", rel);
    free(rel);
}

int watch_main(const char *dir, bool rec)
{
    signal(SIGPIPE, SIG_DFL);
    recursive = rec;
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    if (n >= sizeof(root)) {
        say("err internal", NULL);
        return 1;
    }
    memcpy(root, dir, n);
    root[n] = 0;
    struct stat st;
    int r = stat(root, &st) < 0 ? -errno : !S_ISDIR(st.st_mode) ? -ENOTDIR : 0;
    if (r == 0)
        ifd = inotify_init1(IN_CLOEXEC);
    if (r == 0)
        r = ifd < 0 ? -errno : watch_add("", 0);
    if (r < 0) {
        /* a missing parent (ENOTDIR from stat) is a missing directory too */
        bool missing = r == -ENOENT || (r == -ENOTDIR && stat(root, &st) < 0);
        say(missing                       ? "err not_found"
            : r == -ENOTDIR               ? "err not_dir"
            : r == -EACCES || r == -EPERM ? "err denied"
                                          : "err internal",
            NULL);
        return 1;
    }
    say("ok", NULL);
    fflush(stdout);
    /* whole events only: the buffer holds at least one of the longest */
    static char buf[64 * 1024] __attribute__((aligned(__alignof__(struct inotify_event))));
    for (;;) {
        ssize_t len = read(ifd, buf, sizeof(buf));
        if (len < 0 && errno == EINTR)
            continue;
        if (len <= 0)
            return 1;
        for (char *p = buf; p < buf + len;) {
            const struct inotify_event *ev = (const struct inotify_event *)p;
            event(ev);
            p += sizeof(*ev) + ev->len;
        }
        if (fflush(stdout) == EOF)
            return 0;
    }
}

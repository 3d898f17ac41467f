/* airlock-agent --run-as USER -- PROGRAM [ARGS...]: runs a program as the image's USER (its
 * Containerfile's USER: a name, a uid, or uid:gid), for images that may have no setpriv or su
 * (a busybox or distroless root). The agent is static, so names are looked up in the root's
 * /etc/passwd and /etc/group directly (no NSS). Not the agent: no channel, no loop; the host
 * puts it in front of a command run's argv. It only lowers privileges: model code runs as root
 * in the guest anyway, this is the image's wish, not a boundary. */
#include "agent.h"

#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Supplementary groups taken from /etc/group: more than anyone needs. */
#define GROUPS_MAX 64

struct who {
    uid_t uid;
    gid_t gid;
    char name[64];
    char home[256];
};

/* A decimal id, whole string; -1 when it is not one. */
static long id_of(const char *s)
{
    char *end;
    if (!*s || strspn(s, "0123456789") != strlen(s) || strlen(s) > 9)
        return -1;
    long v = strtol(s, &end, 10);
    return *end ? -1 : v;
}

/* The passwd line of name (or of uid when name is numeric). */
static bool passwd_find(const char *name, struct who *w)
{
    FILE *f = fopen("/etc/passwd", "re");
    if (!f)
        return false;
    char line[1024];
    long want = id_of(name);
    bool found = false;
    while (!found && fgets(line, sizeof(line), f)) {
        /* name:x:uid:gid:gecos:home:shell */
        char *fields[7] = {0};
        char *p = line;
        for (int i = 0; i < 7 && p; i++) {
            fields[i] = p;
            p = strchr(p, ':');
            if (p)
                *p++ = '\0';
        }
        if (!fields[3] || id_of(fields[2]) < 0 || id_of(fields[3]) < 0)
            continue;
        if (want >= 0 ? id_of(fields[2]) != want : strcmp(fields[0], name) != 0)
            continue;
        w->uid = (uid_t)id_of(fields[2]);
        w->gid = (gid_t)id_of(fields[3]);
        snprintf(w->name, sizeof(w->name), "%s", fields[0]);
        if (fields[5])
            snprintf(w->home, sizeof(w->home), "%s", fields[5]);
        found = true;
    }
    fclose(f);
    return found;
}

/* The group named (or numbered) s; -1 when there is none. */
static long group_find(const char *s)
{
    long want = id_of(s);
    if (want >= 0)
        return want;
    FILE *f = fopen("/etc/group", "re");
    if (!f)
        return -1;
    char line[4096];
    long gid = -1;
    while (gid < 0 && fgets(line, sizeof(line), f)) {
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        char *c3 = c2 ? strchr(c2 + 1, ':') : NULL;
        if (!c3)
            continue;
        *c1 = *c3 = '\0';
        if (!strcmp(line, s))
            gid = id_of(c2 + 1);
    }
    fclose(f);
    return gid;
}

/* The groups of /etc/group that list name as a member. */
static size_t member_groups(const char *name, gid_t *out, size_t max)
{
    FILE *f = fopen("/etc/group", "re");
    if (!f || !*name) {
        if (f)
            fclose(f);
        return 0;
    }
    char line[4096];
    size_t n = 0;
    while (n < max && fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = '\0';
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        char *c3 = c2 ? strchr(c2 + 1, ':') : NULL;
        if (!c3)
            continue;
        *c3 = '\0';
        long gid = id_of(c2 + 1);
        for (char *m = strtok(c3 + 1, ","); m && gid >= 0; m = strtok(NULL, ","))
            if (!strcmp(m, name)) {
                out[n++] = (gid_t)gid;
                break;
            }
    }
    fclose(f);
    return n;
}

int runas_main(const char *spec, char **argv)
{
    char user[128], *group = NULL;
    snprintf(user, sizeof(user), "%s", spec);
    if ((group = strchr(user, ':')))
        *group++ = '\0';
    struct who w = {.uid = 0, .gid = 0, .home = "/"};
    if (!passwd_find(user, &w)) {
        long uid = id_of(user);
        if (uid < 0) {
            fprintf(stderr, "airlock-agent: no user '%s' in the image's /etc/passwd\n", user);
            return 126;
        }
        /* A bare uid of no account: docker runs it with gid 0 likewise. */
        w.uid = (uid_t)uid;
    }
    if (group) {
        long gid = group_find(group);
        if (gid < 0) {
            fprintf(stderr, "airlock-agent: no group '%s' in the image's /etc/group\n", group);
            return 126;
        }
        w.gid = (gid_t)gid;
    }
    gid_t groups[GROUPS_MAX];
    size_t ng = member_groups(w.name, groups, GROUPS_MAX);
    if (setgroups(ng, groups) < 0 || setgid(w.gid) < 0 || setuid(w.uid) < 0) {
        fprintf(stderr, "airlock-agent: cannot become %s: %s\n", spec, strerror(errno));
        return 126;
    }
    setenv("HOME", w.home[0] ? w.home : "/", 1);
    if (w.name[0]) {
        setenv("USER", w.name, 1);
        setenv("LOGNAME", w.name, 1);
    }
    execvp(argv[0], argv);
    fprintf(stderr, "airlock-agent: cannot run %s: %s\n", argv[0], strerror(errno));
    return errno == ENOENT ? 127 : 126;
}

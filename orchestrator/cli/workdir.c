/* The workdir on the command line: what was left out on the way in, the change list on the way
 * out, the question, and what applying did. Shared by exec and any other front. */
#include "cli.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Longer change lists are cut with a count: the terminal is for reading. */
#define CHANGES_SHOWN_MAX 200

static const char *size_str(uint64_t n, char *buf, size_t len)
{
    if (n < 10240)
        snprintf(buf, len, "%llu B", (unsigned long long)n);
    else if (n < 10u << 20)
        snprintf(buf, len, "%.1f KiB", (double)n / 1024);
    else
        snprintf(buf, len, "%.1f MiB", (double)n / (1 << 20));
    return buf;
}

static const char *type_word(int type)
{
    return type == AL_ENTRY_SYMLINK ? "symlink" : "special";
}

int cli_workdir_push(al_session *s, const char *dir, const al_workdir_opts *o, bool quiet,
                     al_error *err)
{
    al_workdir_push_result res;
    int r = al_workdir_push(s, dir, o, &res, err);
    if (r < 0)
        return r;
    char esc[512];
    for (size_t i = 0; i < res.nskipped; i++)
        fprintf(stderr, "airlock: warning: %s\n", al_path_escape(res.skipped[i], esc, sizeof(esc)));
    if (!quiet) {
        char sz[32];
        fprintf(stderr, "airlock: copied %zu files (%s) into %s\n", res.files,
                size_str(res.bytes, sz, sizeof(sz)), o && o->guest_dir ? o->guest_dir
                                                                       : AL_WORKDIR_GUEST_DIR);
    }
    al_workdir_push_result_free(&res);
    return 0;
}

void cli_changes_print(const al_workdir_diff *d, const char *title)
{
    size_t n = al_workdir_diff_count(d), counts[3] = {0, 0, 0}, refused = 0;
    for (size_t i = 0; i < n; i++) {
        const al_change *c = al_workdir_diff_at(d, i);
        counts[c->kind]++;
        refused += c->refused != NULL;
    }
    fprintf(stderr, "airlock: %s: %zu added, %zu modified, %zu deleted", title, counts[0],
            counts[1], counts[2]);
    fprintf(stderr, refused ? ", %zu refused\n" : "\n", refused);
    static const char *const kind[] = {"added", "modified", "deleted"};
    for (size_t i = 0; i < n && i < CHANGES_SHOWN_MAX; i++) {
        const al_change *c = al_workdir_diff_at(d, i);
        char esc[1024], a[32], b[32];
        fprintf(stderr, "  %-9s %s%s", kind[c->kind], al_path_escape(c->path, esc, sizeof(esc)),
                c->type == AL_ENTRY_DIR ? "/" : "");
        if (c->type == AL_ENTRY_SYMLINK || c->type == AL_ENTRY_OTHER)
            fprintf(stderr, " (%s)", type_word(c->type));
        else if (c->type == AL_ENTRY_FILE && c->kind == AL_CHANGE_MODIFIED &&
                 c->old_size != c->new_size)
            fprintf(stderr, " (%s -> %s)", size_str(c->old_size, a, sizeof(a)),
                    size_str(c->new_size, b, sizeof(b)));
        else if (c->type == AL_ENTRY_FILE)
            fprintf(stderr, " (%s)", size_str(c->kind == AL_CHANGE_DELETED ? c->old_size
                                                                           : c->new_size,
                                              a, sizeof(a)));
        fprintf(stderr, c->refused ? "  REFUSED: %s\n" : "\n", c->refused);
    }
    if (n > CHANGES_SHOWN_MAX)
        fprintf(stderr, "  ... and %zu more\n", n - CHANGES_SHOWN_MAX);
}

static bool ask(const char *dir)
{
    if (!isatty(STDIN_FILENO)) {
        fprintf(stderr, "airlock: stdin is not a terminal: not applying the changes to %s "
                        "(--sync-back yes applies them)\n", dir);
        return false;
    }
    fprintf(stderr, "Apply these changes to %s? [y/N] ", dir);
    fflush(stderr);
    char line[64];
    if (!fgets(line, sizeof(line), stdin))
        return false;
    return line[0] == 'y' || line[0] == 'Y';
}

int cli_workdir_sync(al_workdir_diff *d, const char *dir, enum cli_sync mode, al_error *err)
{
    size_t n = al_workdir_diff_count(d), applicable = 0;
    for (size_t i = 0; i < n; i++)
        applicable += !al_workdir_diff_at(d, i)->refused;
    if (applicable == 0)
        return 0;
    if (mode == CLI_SYNC_NO || (mode == CLI_SYNC_ASK && !ask(dir))) {
        fprintf(stderr, "airlock: changes not applied; %s is as it was\n", dir);
        return 0;
    }
    int r = al_workdir_apply(d, err);
    if (r < 0)
        return r;
    size_t failed = 0;
    for (size_t i = 0; i < n; i++) {
        const al_change *c = al_workdir_diff_at(d, i);
        char esc[1024];
        if (c->result < 0 && ++failed <= CHANGES_SHOWN_MAX)
            fprintf(stderr, "airlock: cannot apply '%s': %s\n",
                    al_path_escape(c->path, esc, sizeof(esc)),
                    c->result == -EEXIST ? "it changed on the host meanwhile"
                    : c->result == -ELOOP || c->result == -EXDEV
                        ? "its path leads through a symlink"
                        : strerror(-c->result));
    }
    fprintf(stderr, "airlock: applied %d change%s to %s%s\n", r, r == 1 ? "" : "s", dir,
            failed ? "; some failed (above)" : "");
    return failed ? -EIO : 0;
}

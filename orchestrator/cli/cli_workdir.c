/* The workdir on the command line: what was left out on the way in, the change list on the way
 * out, the question, and what applying did. Shared by exec and any other front. */
#include "cli.h"

#include <errno.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* Longer change lists are cut with a count on the terminal, which is for reading; the whole
 * list goes to a file (and, when asking on a terminal, through the pager) first. */
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
    al_workdir_push_result res = AL_WORKDIR_PUSH_RESULT_INIT;
    int r = al_workdir_push(s, dir, o, &res, err);
    if (r < 0)
        return r;
    cli_workdir_pushed(&res, o && o->guest_dir ? o->guest_dir : AL_WORKDIR_GUEST_DIR, quiet);
    al_workdir_push_result_free(&res);
    return 0;
}

void cli_workdir_pushed(const al_workdir_push_result *res, const char *guest_dir, bool quiet)
{
    char esc[512];
    for (size_t i = 0; i < res->nskipped; i++)
        fprintf(stderr, "airlock: warning: %s\n",
                al_path_escape(res->skipped[i], esc, sizeof(esc)));
    if (!quiet) {
        char sz[32];
        fprintf(stderr, "airlock: copied %zu file%s (%s) into %s\n", res->files,
                res->files == 1 ? "" : "s", size_str(res->bytes, sz, sizeof(sz)), guest_dir);
    }
}

/* One change as a line: kind, path, size, what it needs. */
static void change_line(FILE *f, const al_change *c)
{
    static const char *const kind[] = {"added", "modified", "deleted"};
    char esc[1024], a[32], b[32];
    fprintf(f, "  %-9s %s%s", kind[c->kind], al_path_escape(c->path, esc, sizeof(esc)),
            c->type == AL_ENTRY_DIR ? "/" : "");
    if (c->type == AL_ENTRY_SYMLINK || c->type == AL_ENTRY_OTHER)
        fprintf(f, " (%s)", type_word(c->type));
    else if (c->type == AL_ENTRY_FILE && c->kind == AL_CHANGE_MODIFIED &&
             c->old_size != c->new_size)
        fprintf(f, " (%s -> %s)", size_str(c->old_size, a, sizeof(a)),
                size_str(c->new_size, b, sizeof(b)));
    else if (c->type == AL_ENTRY_FILE)
        fprintf(f, " (%s)",
                size_str(c->kind == AL_CHANGE_DELETED ? c->old_size : c->new_size, a, sizeof(a)));
    if (c->refused)
        fprintf(f, "  REFUSED: %s\n", c->refused);
    else
        fprintf(f, "%s%s%s\n", c->flags & AL_CHANGE_VCS ? "  [GIT: runs on this host]" : "",
                c->flags & AL_CHANGE_EXEC ? "  [EXECUTABLE]" : "",
                c->flags & AL_CHANGE_RUNS ? "  [tools run it]" : "");
}

/* Where the whole list went when the terminal got only part of it ("" when it got all). */
static char full_list[AL_PATH_MAX];

/* The whole list into a private file the user can read at leisure. */
static void full_list_write(const al_workdir_diff *d)
{
    const char *tmp = getenv("TMPDIR");
    int fd = al_pathf(full_list, sizeof(full_list), "%s/airlock-changes-XXXXXX",
                      tmp && tmp[0] == '/' ? tmp : "/tmp") < 0
                 ? -1
                 : mkstemp(full_list);
    FILE *f = fd < 0 ? NULL : fdopen(fd, "w");
    if (!f) {
        if (fd >= 0)
            close(fd);
        full_list[0] = '\0';
        return;
    }
    for (size_t i = 0; i < al_workdir_diff_count(d); i++)
        change_line(f, al_workdir_diff_at(d, i));
    if (fclose(f) != 0)
        full_list[0] = '\0';
}

/* The changes carrying flag, each named, under a heading that says what they may do. */
static size_t flagged_print(const al_workdir_diff *d, unsigned flag, const char *noun,
                            const char *rest)
{
    size_t n = al_workdir_diff_count(d), count = 0;
    for (size_t i = 0; i < n; i++) {
        const al_change *c = al_workdir_diff_at(d, i);
        count += !c->refused && (c->flags & flag);
    }
    if (!count)
        return 0;
    fprintf(stderr, "airlock: %s %zu %s%s %s\n",
            flag == AL_CHANGE_RUNS ? "note:" : "WARNING:", count, noun, count == 1 ? "" : "s",
            rest);
    size_t shown = 0;
    for (size_t i = 0; i < n && shown < CHANGES_SHOWN_MAX; i++) {
        const al_change *c = al_workdir_diff_at(d, i);
        if (c->refused || !(c->flags & flag))
            continue;
        change_line(stderr, c);
        shown++;
    }
    if (count > shown)
        fprintf(stderr, "  ... and %zu more\n", count - shown);
    return count;
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
    for (size_t i = 0; i < n && i < CHANGES_SHOWN_MAX; i++)
        change_line(stderr, al_workdir_diff_at(d, i));
    full_list[0] = '\0';
    if (n > CHANGES_SHOWN_MAX) {
        fprintf(stderr, "  ... and %zu more\n", n - CHANGES_SHOWN_MAX);
        full_list_write(d);
        if (full_list[0])
            fprintf(stderr, "airlock: the full list of %zu changes is in %s\n", n, full_list);
    }
    /* After the list, where the eye lands before the question. */
    flagged_print(d, AL_CHANGE_RUNS, "changed file",
                  "that tools run or load in this directory (.envrc, Makefile, editor tasks...): "
                  "review before use");
    flagged_print(d, AL_CHANGE_EXEC, "file",
                  "the guest made executable: written without exec bits unless you consent "
                  "(--sync-back-exec)");
    flagged_print(d, AL_CHANGE_VCS, "change",
                  "under .git/: git runs its config and hooks on this host (a planted "
                  "core.fsmonitor or hook runs on your next git status); never applied without "
                  "a separate consent (--sync-back-git)");
}

/* A line from the terminal; false at end of input. */
static bool answer(const char *question, char *line, size_t len)
{
    fputs(question, stderr);
    fflush(stderr);
    if (!fgets(line, (int)len, stdin))
        return false;
    line[strcspn(line, "\n")] = '\0';
    return true;
}

/* The changes nobody could be asked about, kept where the user is told. */
static int keep(al_workdir_diff *d, const char *dir, const char *why, al_error *err)
{
    char path[AL_PATH_MAX];
    int r = al_workdir_diff_keep(d, path, sizeof(path), err);
    if (r < 0) {
        fprintf(stderr, "airlock: changes not applied to %s (%s), and they could not be kept: %s\n",
                dir, why, err->msg);
        err->code = 0; /* said */
        return -EIO;
    }
    char esc[AL_PATH_MAX * 2];
    fprintf(stderr,
            "airlock: changes not applied to %s (%s); the guest's %s is kept in %s (the "
            "guest's files: 'tar -tvf' it before extracting; --sync-back yes applies)\n",
            dir, why, AL_WORKDIR_GUEST_DIR, al_path_escape(path, esc, sizeof(esc)));
    return 0;
}

enum answer { ANSWER_NO, ANSWER_YES, ANSWER_NONE };

static enum answer ask(const char *dir)
{
    char q[AL_PATH_MAX + 100], line[64]; /* a question quoting a path */
    snprintf(q, sizeof(q), "Apply these changes to %s? [y/N] ", dir);
    if (!answer(q, line, sizeof(line))) {
        fputc('\n', stderr);
        return ANSWER_NONE;
    }
    return line[0] == 'y' || line[0] == 'Y' ? ANSWER_YES : ANSWER_NO;
}

/* The long list through the user's pager, on a terminal, before the question. */
static void page_full_list(void)
{
    if (!full_list[0] || !isatty(STDIN_FILENO) || !isatty(STDOUT_FILENO))
        return;
    const char *argv[] = {"sh", "-c", "${PAGER:-less -R} \"$1\"", "sh", full_list, NULL};
    pid_t pid;
    if (posix_spawnp(&pid, "sh", NULL, NULL, (char *const *)argv, environ) != 0)
        return;
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
}

/* Applicable changes carrying all of flags. */
static size_t count_flag(const al_workdir_diff *d, unsigned flags)
{
    size_t count = 0;
    for (size_t i = 0; i < al_workdir_diff_count(d); i++) {
        const al_change *c = al_workdir_diff_at(d, i);
        count += !c->refused && (c->flags & flags) == flags;
    }
    return count;
}

int cli_workdir_sync(al_workdir_diff *d, const char *dir, enum cli_sync mode, unsigned allow,
                     bool hung_up, al_error *err)
{
    size_t n = al_workdir_diff_count(d), applicable = 0;
    for (size_t i = 0; i < n; i++)
        applicable += !al_workdir_diff_at(d, i)->refused;
    if (applicable == 0)
        return 0;
    if (mode == CLI_SYNC_ASK && hung_up)
        return keep(d, dir, "ended by a signal, nobody to ask", err);
    if (mode == CLI_SYNC_ASK && !isatty(STDIN_FILENO))
        return keep(d, dir, "stdin is not a terminal", err);
    enum answer said = ANSWER_NO;
    if (mode == CLI_SYNC_ASK) {
        page_full_list();
        said = ask(dir);
    }
    if (said == ANSWER_NONE)
        return keep(d, dir, "no answer", err);
    if (mode == CLI_SYNC_NO || (mode == CLI_SYNC_ASK && said == ANSWER_NO)) {
        fprintf(stderr, "airlock: changes not applied; %s is as it was\n", dir);
        return 0;
    }
    size_t vcs = count_flag(d, AL_CHANGE_VCS);
    char q[256], line[64];
    /* Each its own question, and .git/ wants the word: a stray "y" does not plant a hook. */
    if (mode == CLI_SYNC_ASK && vcs && !(allow & AL_APPLY_VCS)) {
        snprintf(q, sizeof(q),
                 "Also apply the %zu change%s under .git/ (listed above; git runs its config "
                 "and hooks)? Type 'yes' to apply: ",
                 vcs, vcs == 1 ? "" : "s");
        if (answer(q, line, sizeof(line)) && !strcmp(line, "yes"))
            allow |= AL_APPLY_VCS;
    }
    /* Exec bits matter on what is written: not on .git/ files held back. */
    size_t exec = count_flag(d, AL_CHANGE_EXEC) -
                  (allow & AL_APPLY_VCS ? 0 : count_flag(d, AL_CHANGE_EXEC | AL_CHANGE_VCS));
    if (mode == CLI_SYNC_ASK && exec && !(allow & AL_APPLY_EXEC)) {
        snprintf(q, sizeof(q),
                 "Keep the exec bit on the %zu file%s the guest made executable "
                 "(listed above)? [y/N] ",
                 exec, exec == 1 ? "" : "s");
        if (answer(q, line, sizeof(line)) && (line[0] == 'y' || line[0] == 'Y'))
            allow |= AL_APPLY_EXEC;
    }
    int r = al_workdir_apply(d, allow, err);
    if (r < 0)
        return r;
    size_t failed = 0, held = 0, no_exec = 0;
    for (size_t i = 0; i < n; i++) {
        const al_change *c = al_workdir_diff_at(d, i);
        char esc[1024];
        held += c->held;
        no_exec += (c->flags & AL_CHANGE_EXEC) && !(allow & AL_APPLY_EXEC) && !c->held &&
                   !c->refused && c->result == 0;
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
    if (held)
        fprintf(stderr,
                "airlock: not applied: %zu change%s under .git/ (--sync-back-git "
                "applies them)\n",
                held, held == 1 ? "" : "s");
    if (no_exec)
        fprintf(stderr,
                "airlock: %zu file%s written without the exec bit the guest gave %s "
                "(--sync-back-exec keeps it)\n",
                no_exec, no_exec == 1 ? "" : "s", no_exec == 1 ? "it" : "them");
    return failed ? -EIO : 0;
}

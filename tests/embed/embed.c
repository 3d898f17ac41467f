/* An embedder's program: built against the installed libairlock-dev through
 * pkg-config, with the strict warnings an embedder would use, it opens a session, runs a
 * command and reads its result with options that start from the header's initialisers, and
 * checks the rules of "Structs" in airlock.h from the outside: a zeroed struct is refused by
 * name, zero descriptors mean none, a struct from a newer header is taken only when what this
 * library lacks is zero, and filled structs say how much was filled.
 *     embed IMAGE        prints one line per check, "ok" last; exits 1 at the first failure */
#include <airlock.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int failures;

static void check(int cond, const char *what, const al_error *err)
{
    printf("%s %s", cond ? "ok" : "FAIL", what);
    if (!cond && err && err->code)
        printf(" (%d: %s)", err->code, err->msg);
    printf("\n");
    if (!cond)
        failures++;
}

struct out {
    char text[2][256];
    size_t len[2];
};

static int collect(void *ctx, int stream, const uint8_t *data, size_t len)
{
    struct out *o = ctx;
    int i = stream == 2;
    size_t room = sizeof(o->text[i]) - 1 - o->len[i];
    size_t take = len < room ? len : room;
    memcpy(o->text[i] + o->len[i], data, take);
    o->len[i] += take;
    o->text[i][o->len[i]] = '\0';
    return 0;
}

int main(int argc, char **argv)
{
    const char *image = argc > 1 ? argv[1] : "tiny";
    unsigned number = 0;
    const char *version = al_version(&number);
    check(number == AIRLOCK_VERSION_NUMBER && version && *version,
          "al_version() is this header's version", NULL);

    /* A zeroed struct: refused by name, before any VM. */
    al_session *s = NULL;
    al_session_opts zeroed;
    memset(&zeroed, 0, sizeof(zeroed));
    al_error err = {0};
    int r = al_session_open(&zeroed, &s, &err);
    check(r == -EINVAL && strstr(err.msg, "AL_SESSION_OPTS_INIT") && !s,
          "a zeroed al_session_opts is refused, naming AL_SESSION_OPTS_INIT", &err);

    al_session_opts so = AL_SESSION_OPTS_INIT;
    so.image = image;
    so.quiet = true;
    err = (al_error){0};
    r = al_session_open(&so, &s, &err);
    check(r == 0 && s, "al_session_open from AL_SESSION_OPTS_INIT", &err);
    if (r < 0)
        return 1;

    /* A command, its output through the callback, its status. stdin is none (0): cat ends at
     * once. */
    const char *cmd[] = {"sh", "-c", "cat; echo embedded $((6 * 7)); echo to-stderr >&2; exit 3",
                         NULL};
    struct out o = {0};
    al_exec_opts eo = AL_EXEC_OPTS_INIT;
    eo.argv = cmd;
    eo.output = collect;
    eo.output_ctx = &o;
    eo.timeout_ms = 120000;
    al_exec_result res = AL_EXEC_RESULT_INIT;
    err = (al_error){0};
    r = al_exec(s, &eo, &res, &err);
    check(r == 0 && res.how == AL_EXEC_EXITED && res.value == 3,
          "al_exec runs the command and reads its exit status", &err);
    check(!strcmp(o.text[0], "embedded 42\n") && !strcmp(o.text[1], "to-stderr\n"),
          "its stdout and stderr reach the callback apart", NULL);
    check(res.struct_size == sizeof(res) && AL_HAS(&res, offline),
          "al_exec_result says it was filled whole", NULL);

    /* Zero descriptors mean none: with fd 0 made a pipe's write end, a run with no output
     * callback and every fd field 0 writes nothing to it and reads nothing from it. */
    int p[2];
    if (pipe(p) < 0 || dup2(p[1], 0) < 0)
        return 1;
    fcntl(p[0], F_SETFL, O_NONBLOCK);
    const char *loud[] = {"sh", "-c", "cat; echo dropped; echo dropped too >&2", NULL};
    al_exec_opts quiet = AL_EXEC_OPTS_INIT;
    quiet.argv = loud;
    quiet.timeout_ms = 120000;
    res = (al_exec_result)AL_EXEC_RESULT_INIT;
    err = (al_error){0};
    r = al_exec(s, &quiet, &res, &err);
    char junk[64];
    check(r == 0 && res.how == AL_EXEC_EXITED && res.value == 0 &&
              read(p[0], junk, sizeof(junk)) < 0,
          "zero descriptors: nothing read from or written to fd 0", &err);

    /* A struct from a newer header: taken while what this library lacks is zero. */
    struct {
        al_exec_opts o;
        uint64_t newer_field;
    } newer = {.o = AL_EXEC_OPTS_INIT};
    newer.o.struct_size = sizeof(newer);
    newer.o.argv = (const char *[]){"true", NULL};
    res = (al_exec_result)AL_EXEC_RESULT_INIT;
    err = (al_error){0};
    r = al_exec(s, &newer.o, &res, &err);
    check(r == 0 && res.value == 0, "a larger al_exec_opts with a zero tail is taken", &err);
    newer.newer_field = 1;
    err = (al_error){0};
    r = al_exec(s, &newer.o, &res, &err);
    check(r == -E2BIG && strstr(err.msg, "does not know"),
          "a larger al_exec_opts setting an unknown field is refused (-E2BIG)", &err);

    al_file_info fi = AL_FILE_INFO_INIT;
    err = (al_error){0};
    r = al_file_stat(s, "/", &fi, &err);
    check(r == 0 && fi.type == AL_ENTRY_DIR && AL_HAS(&fi, mtime),
          "al_file_stat fills al_file_info", &err);
    al_file_info unsized = {0};
    err = (al_error){0};
    r = al_file_stat(s, "/", &unsized, &err);
    check(r == -EINVAL && strstr(err.msg, "AL_FILE_INFO_INIT"),
          "an unsized al_file_info is refused, naming AL_FILE_INFO_INIT", &err);

    al_session_close(s);
    if (failures)
        return 1;
    printf("ok\n");
    return 0;
}

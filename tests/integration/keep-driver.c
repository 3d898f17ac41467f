/* Drives kept sessions (orchestrator/session/keep.c) for tests/integration/test_keep.py:
 *
 *   keep-driver open IMAGE       a kept session (keeper "keep-test"): x = 41 in its python
 *                                kernel, /workspace/kept.txt, a background run printing a tick
 *                                every 0.2 s; prints {"name", "run"} and exits at once (_exit,
 *                                as a crash: nothing detached, nothing closed)
 *   keep-driver attach NAME RUN  reattach; {"adopted": [...], "x": "...", "file": "...",
 *                                "ticks": "..."}: the kernel's x + 1, the file, what the adopted
 *                                run printed in one second (then detached: it runs on)
 *   keep-driver pause NAME       reattach and pause; {"paused": true}
 *   keep-driver resume NAME RUN  reattach, resume, then as attach
 *   keep-driver list             {"kept": [{"name", "paused", "held"}]}
 *   keep-driver discard NAME     {"discarded": true}
 * A failure prints {"error": "...", "code": -errno} and exits 1. */
#include "airlock.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define KEEPER "keep-test"

static int fail(const al_error *err)
{
    char esc[2 * sizeof(err->msg)];
    size_t j = 0;
    for (size_t i = 0; err->msg[i] && j < sizeof(esc) - 2; i++) {
        if (err->msg[i] == '"' || err->msg[i] == '\\')
            esc[j++] = '\\';
        esc[j++] = err->msg[i] == '\n' ? ' ' : err->msg[i];
    }
    esc[j] = '\0';
    printf("{\"error\": \"%s\", \"code\": %d}\n", esc, err->code);
    return 1;
}

struct buf {
    char text[4096];
    size_t len;
};

static int collect(void *ctx, int stream, const uint8_t *data, size_t n)
{
    struct buf *b = ctx;
    (void)stream;
    for (size_t i = 0; i < n && b->len < sizeof(b->text) - 1; i++)
        b->text[b->len++] = data[i] == '\n' ? ' ' : (char)data[i];
    b->text[b->len] = '\0';
    return 0;
}

static int run(al_session *s, const char *lang, const char *code, struct buf *out, al_error *err)
{
    const char *argv[] = {code, NULL}, *sh[] = {"sh", "-c", code, NULL};
    al_exec_opts o = AL_EXEC_OPTS_INIT;
    o.argv = lang ? argv : sh;
    o.lang = lang;
    o.kernel = lang != NULL;
    o.output = collect;
    o.output_ctx = out;
    o.stdin_fd = -1;
    al_exec_result res = AL_EXEC_RESULT_INIT;
    return al_exec(s, &o, &res, err);
}

static uint32_t bg_id;
static al_session *bg_s;

static void *background(void *arg)
{
    (void)arg;
    const char *argv[] = {"sh", "-c", "i=0; while :; do echo tick$i; i=$((i+1)); sleep 0.2; done",
                          NULL};
    struct buf b = {0};
    al_exec_opts o = AL_EXEC_OPTS_INIT;
    o.argv = argv;
    o.stdin_fd = -1;
    o.output = collect;
    o.output_ctx = &b;
    o.request_id = &bg_id;
    al_exec_result res = AL_EXEC_RESULT_INIT;
    al_error err = {0};
    al_exec(bg_s, &o, &res, &err);
    return NULL;
}

static int cmd_open(const char *image)
{
    al_session_opts o = AL_SESSION_OPTS_INIT;
    o.image = image;
    o.keep = KEEPER;
    o.quiet = true;
    o.lifetime_s = 900;
    al_session *s = NULL;
    al_error err = {0};
    if (al_session_open(&o, &s, &err) < 0)
        return fail(&err);
    struct buf b = {0};
    if (run(s, "python", "x = 41", &b, &err) < 0 ||
        run(s, NULL, "mkdir -p /workspace && echo kept-content > /workspace/kept.txt", &b, &err) <
            0)
        return fail(&err);
    bg_s = s;
    pthread_t t;
    pthread_create(&t, NULL, background, NULL);
    struct timespec ts = {1, 0};
    nanosleep(&ts, NULL);
    printf("{\"name\": \"%s\", \"run\": %u}\n", al_session_name(s), bg_id);
    fflush(stdout);
    _exit(0);
}

static int reattach(const char *name, al_session **s, al_error *err)
{
    al_reattach_opts o = AL_REATTACH_OPTS_INIT;
    o.name = name;
    o.keeper = KEEPER;
    o.quiet = true;
    return al_session_reattach(&o, s, err);
}

static int check(al_session *s, uint32_t runid)
{
    al_error err = {0};
    uint32_t ids[64];
    size_t n = al_session_adopted(s, ids, 64);
    struct buf x = {0}, f = {0}, ticks = {0};
    if (run(s, "python", "print(x + 1)", &x, &err) < 0 ||
        run(s, NULL, "cat /workspace/kept.txt", &f, &err) < 0)
        return fail(&err);
    al_proc *p = NULL;
    if (runid) {
        /* Taken over on a thread of the library's, read for a second, and left running: the
         * detach below ends only the host's side of it. */
        al_exec_opts o = AL_EXEC_OPTS_INIT;
        o.adopt = runid;
        o.stdin_fd = -1;
        o.output = collect;
        o.output_ctx = &ticks;
        if (al_exec_start(s, &o, &p, &err) < 0)
            return fail(&err);
        struct timespec ts = {1, 0};
        nanosleep(&ts, NULL);
    }
    al_session_detach(s); /* joins the run's thread: ticks is whole from here */
    al_proc_free(p);
    printf("{\"adopted\": [");
    for (size_t i = 0; i < n && i < 64; i++)
        printf("%s%u", i ? ", " : "", ids[i]);
    printf("], \"x\": \"%s\", \"file\": \"%s\", \"ticks\": \"%s\"}\n", x.text, f.text, ticks.text);
    return 0;
}

static void list_one(void *ctx, const al_kept_info *k)
{
    int *n = ctx;
    printf("%s{\"name\": \"%s\", \"paused\": %s, \"held\": %s}", (*n)++ ? ", " : "", k->name,
           k->paused ? "true" : "false", k->held ? "true" : "false");
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    al_error err = {0};
    al_session *s = NULL;
    if (argc == 3 && !strcmp(argv[1], "open"))
        return cmd_open(argv[2]);
    if (argc == 4 && !strcmp(argv[1], "attach")) {
        if (reattach(argv[2], &s, &err) < 0)
            return fail(&err);
        return check(s, (uint32_t)atoi(argv[3]));
    }
    if (argc == 3 && !strcmp(argv[1], "pause")) {
        if (reattach(argv[2], &s, &err) < 0 || al_session_pause(s, &err) < 0)
            return fail(&err);
        printf("{\"paused\": %s}\n", al_session_paused(s) ? "true" : "false");
        al_session_detach(s);
        return 0;
    }
    if (argc == 4 && !strcmp(argv[1], "resume")) {
        if (reattach(argv[2], &s, &err) < 0 || al_session_resume(s, &err) < 0)
            return fail(&err);
        return check(s, (uint32_t)atoi(argv[3]));
    }
    if (argc == 2 && !strcmp(argv[1], "list")) {
        int n = 0;
        printf("{\"kept\": [");
        if (al_session_kept(KEEPER, list_one, &n, &err) < 0)
            return fail(&err);
        printf("]}\n");
        return 0;
    }
    if (argc == 3 && !strcmp(argv[1], "discard")) {
        if (al_session_discard(KEEPER, argv[2], &err) < 0)
            return fail(&err);
        printf("{\"discarded\": true}\n");
        return 0;
    }
    fprintf(stderr, "usage: keep-driver open IMAGE | attach NAME RUN | pause NAME | "
                    "resume NAME RUN | list | discard NAME\n");
    return 2;
}

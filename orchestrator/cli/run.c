/* airlock run "task": one user message, the loop until the model is done, then exit. */
#include "loopui.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TASK_MAX (256 * 1024)

static const char usage[] =
    "Usage: airlock run [OPTIONS] TASK...\n"
    "       airlock run [OPTIONS] < task\n"
    "\n"
    "Give the model one task, let it run code in a fresh VM until it is done, then destroy\n"
    "the VM. Exits 0 when the model finished, 1 when the model could not be reached or\n"
    "failed, 3 when a limit stopped it (--max-turns, repeated code, --token-budget), 4 when\n"
    "code was declined, 130 when interrupted (Ctrl-C: a run past --run-timeout is only\n"
    "interrupted, and the model goes on), 125 when the VM failed. Runs start in /workspace.\n"
    "\n"
    "      --json                the whole exchange as JSON lines on stdout:\n"
    "                            {\"role\", \"type\", \"content\"}; a kernel run's results as\n"
    "                            type \"result\" with the result's object as content\n";

static char *read_task(struct chat_opts *o)
{
    if (o->nrest && strcmp(o->rest[0], "-")) {
        size_t len = 0;
        for (int i = 0; i < o->nrest; i++)
            len += strlen(o->rest[i]) + 1;
        char *t = malloc(len + 1);
        if (!t)
            return NULL;
        t[0] = '\0';
        for (int i = 0; i < o->nrest; i++) {
            strcat(t, o->rest[i]);
            if (i + 1 < o->nrest)
                strcat(t, " ");
        }
        return t;
    }
    char *buf = malloc(TASK_MAX + 1);
    size_t len = 0;
    ssize_t n;
    while (buf && len <= TASK_MAX && (n = read(0, buf + len, TASK_MAX + 1 - len)) > 0)
        len += (size_t)n;
    if (!buf || len > TASK_MAX) {
        fprintf(stderr, "airlock: the task is longer than %d bytes\n", TASK_MAX);
        free(buf);
        return NULL;
    }
    buf[len] = '\0';
    return buf;
}

int cmd_run(struct cli_globals *g, int argc, char **argv)
{
    struct chat_opts o;
    int r = chat_opts_parse(&o, g, argc, argv, usage, true);
    if (r)
        return r == 1 ? 0 : r;
    char *task = read_task(&o);
    if (!task || !task[strspn(task, " \t\n")]) {
        if (task)
            fprintf(stderr, "airlock: no task given (as arguments or on stdin)\n");
        free(task);
        chat_opts_free(&o);
        return 2;
    }
    if (loopui_signals() < 0) {
        free(task);
        chat_opts_free(&o);
        return EXIT_AIRLOCK_FAILED;
    }
    struct loopui u = {.json = o.json};
    /* Answers come from the terminal; stdin may have carried the task. */
    u.confirm_fd = open("/dev/tty", O_RDONLY | O_CLOEXEC);
    if (u.confirm_fd < 0 && o.nrest)
        u.confirm_fd = 0;
    r = loopui_open(&u, &o, g);
    if (r) {
        free(task);
        chat_opts_free(&o);
        return r;
    }
    enum al_chat_outcome out = AL_CHAT_DONE;
    al_error e = {0};
    r = al_chat_turn(&u.chat, task, &out, &e);
    al_error se = {0};
    if (al_conv_save(&u.chat, &se) < 0)
        cli_error(&se);
    int status;
    if (r < 0) {
        if (o.json)
            loopui_json_event("airlock", "error", e.msg);
        cli_error(&e);
        status = 1;
    } else {
        static const int codes[] = {
            [AL_CHAT_DONE] = 0,   [AL_CHAT_MAX_TURNS] = 3, [AL_CHAT_REPEATED] = 3,
            [AL_CHAT_BUDGET] = 3, [AL_CHAT_DECLINED] = 4,  [AL_CHAT_CANCELLED] = 130};
        status = codes[out];
        if (o.json)
            loopui_json_event("airlock", "end", al_chat_outcome_str(out));
        else if (out != AL_CHAT_DONE)
            fprintf(stderr, "airlock: not finished: %s\n", al_chat_outcome_str(out));
    }
    free(task);
    if (u.confirm_fd > 0)
        close(u.confirm_fd);
    if (loopui_close(&u) && status == 0)
        status = 1;
    chat_opts_free(&o);
    return status;
}

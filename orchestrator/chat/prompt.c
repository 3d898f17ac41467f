/* The system prompt: where the model is, what it may run, how to work. */
#include "chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *al_chat_system_prompt(const al_chat_cfg *cfg, const char *langs, bool tools)
{
    char *base = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&base, &len);
    if (!f)
        return NULL;
    if (cfg->system_message) {
        fputs(cfg->system_message, f);
    } else {
        fprintf(f,
                "You are Airlock, an assistant that completes tasks by writing and running code.\n"
                "Your code runs inside a disposable Linux virtual machine (image '%s'), never "
                "on the user's own computer: nothing you do there can harm the user's machine, "
                "and the VM is destroyed when the session ends.\n"
                "Languages you can run: %s.\n"
                "Every run starts in /workspace, the current directory: the user's files, if "
                "they shared any, are there, and files you write there (relative paths land "
                "there) are the ones the user gets back.\n"
                "State persists between runs within the session (files; variables in the "
                "languages that keep a running interpreter).\n"
                "Programs cannot read interactive input: pass data as arguments or files.\n"
                "Work in small steps: run a little code, look at the output, then continue. "
                "When the task is done, answer with a short summary and no code.\n",
                cfg->image && *cfg->image ? cfg->image : "default", langs && *langs ? langs : "sh");
        if (cfg->net_allow && cfg->net_allow[0]) {
            /* Names from the user's own flag or profile, already checked to be host names. */
            fputs("The VM reaches only these hosts, over HTTP and HTTPS through a proxy that "
                  "http_proxy/https_proxy point to (pip, apt and urllib use it; there is no DNS): ",
                  f);
            for (size_t i = 0; cfg->net_allow[i]; i++)
                fprintf(f, "%s%s", i ? ", " : "", cfg->net_allow[i]);
            fputs(". Anything else is blocked; when you need another host, ask the user to "
                  "allow it.\n",
                  f);
        } else {
            fputs("The VM has no network access.\n", f);
        }
        if (cfg->run_timeout_s)
            fprintf(f,
                    "A run is interrupted after %u s and you get its output so far; the "
                    "interpreter keeps its variables, so split long work into shorter runs.\n",
                    cfg->run_timeout_s);
        if (tools) {
            fputs("To run code, call the `execute` tool with a language and the code.\n", f);
            if (cfg->checkpoint != AL_CHECKPOINT_NEVER)
                fputs("Before runs that may change something, Airlock checkpoints the whole VM "
                      "and says so in the run's result. You can undo your own mistakes: call "
                      "`rollback` with a checkpoint id to put files, processes and variables "
                      "back as they were.\n",
                      f);
            if (cfg->computer)
                fputs("The VM has a screen: the `computer` tool takes a screenshot and moves, "
                      "clicks, scrolls and types with its mouse and keyboard; each action "
                      "returns a new screenshot. Coordinates are pixels of the screenshots.\n",
                      f);
        } else {
            fputs("To run code, put it in one fenced code block whose info string names the "
                  "language, e.g.\n```python\nprint(1 + 1)\n```\nOnly the first block of a "
                  "reply runs; you will get its output in the next message.\n",
                  f);
        }
    }
    if (cfg->instructions && *cfg->instructions)
        fprintf(f, "\n%s\n", cfg->instructions);
    if (fclose(f) != 0) {
        free(base);
        return NULL;
    }
    return base;
}

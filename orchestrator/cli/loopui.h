/* What 'airlock chat' and 'airlock run' share: Ctrl-C handling, the session, the loop's
 * callbacks for a terminal or for JSON lines. */
#ifndef AIRLOCK_CLI_LOOPUI_H
#define AIRLOCK_CLI_LOOPUI_H

#include "chatopts.h"
#include "render.h"

struct loopui {
    struct chat_opts *opts;
    struct render render;
    struct cli_termout out; /* the runs' output, sanitized */
    al_session *session;
    al_chat chat;
    int confirm_fd; /* where y/n/e answers are read, -1: cannot ask */
    bool json;      /* JSON lines on stdout instead of the terminal view */
    bool lmc;       /* chat --jsonl: LMC chunks (lmc.c) */
    bool chat_ready;
    char spin_label[160]; /* the spinner's words while a run starts */
    bool line_open[2];    /* the run's stdout, stderr ended without a newline so far */
};

/* Ctrl-C: each press writes SIGINT to the cancel pipe, which the session (forwarding it to the
 * guest) and the model client (abandoning the request) watch. */
int loopui_signals(void);
int loopui_cancel_fd(void);
void loopui_drain(void);
/* True when Ctrl-C was pressed twice within a second, or SIGTERM/SIGHUP arrived. */
bool loopui_quit(void);
/* From now on SIGINT only interrupts, however often (chat --jsonl: each is a program's stop). */
void loopui_sigint_stays(void);
/* The signal that made loopui_quit true (SIGINT twice, SIGTERM, SIGHUP), else 0. */
int loopui_quit_signal(void);
/* Whether a SIGTERM or SIGHUP came: nobody is there to answer a question. */
bool loopui_hung_up(void);
/* Seconds-based stamp of the last Ctrl-C, 0 if none since the last drain. */
bool loopui_interrupted(void);

/* Opens the session and the chat; prints the reason and returns 125 (EXIT_AIRLOCK_FAILED). */
int loopui_open(struct loopui *u, struct chat_opts *o, struct cli_globals *g);
/* Destroys the VM; with --workdir, first takes what changed in /workspace and, once the VM is
 * gone, shows it and applies it per --sync-back. Returns 0, or 1 when the sync failed. */
int loopui_close(struct loopui *u);
/* A JSON line {"role":..,"type":..,"content":..} on stdout (run --json). */
void loopui_json_event(const char *role, const char *type, const char *content);
/* chat --jsonl (lmc.c): the loop's callbacks as LMC chunks on stdout; the loop reading
 * requests from stdin until its end (the exit status); an error line. */
void lmc_ui(al_chat_ui *ui);
int lmc_serve(struct loopui *u);
void lmc_error(const char *msg);
/* Reads one line from fd into buf (no newline). Returns length, -1 on EOF, -2 on Ctrl-C. */
int loopui_read_line(int fd, char *buf, size_t len);
/* One answer to a question with one-key answers: on a terminal the key as it is typed (echoed),
 * elsewhere a line's first character ('?' for a longer line but yes and no). The key in *key
 * ('\0' for Enter); 0, -1 at the end of input, -2 on Ctrl-C. */
int loopui_read_key(int fd, char *key);

#endif

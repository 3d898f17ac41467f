/* The airlock command line: one file per subcommand, all thin callers of libairlock. */
#ifndef AIRLOCK_CLI_H
#define AIRLOCK_CLI_H

#include "airlock.h"
#include "airlock/policy.h"
#include "airlock/text.h"
#include "util.h" /* al_pathf */

#include <pthread.h>

/* Exit statuses of airlock itself, chosen not to collide with a command's own (as timeout(1)
 * and container runtimes do): the command's status passes through otherwise. */
#define EXIT_AIRLOCK_FAILED 125 /* airlock could not run the command */
#define EXIT_CANNOT_EXEC 126    /* found but not executable */
#define EXIT_NOT_FOUND 127      /* command not found in the guest */
#define EXIT_TIMED_OUT 124      /* --timeout expired */

struct cli_globals {
    const char *connect_uri;
    const char *server;  /* --server: airlockd's URL (else $AIRLOCK_HOST) */
    const char *api_key; /* --server-key (else $AIRLOCK_API_KEY) */
    bool debug;
    bool quiet;
};

int cmd_exec(struct cli_globals *g, int argc, char **argv);
int cmd_image(struct cli_globals *g, int argc, char **argv);
int cmd_doctor(struct cli_globals *g, int argc, char **argv);
int cmd_gc(struct cli_globals *g, int argc, char **argv);
int cmd_cp(struct cli_globals *g, int argc, char **argv);
int cmd_shell(struct cli_globals *g, int argc, char **argv);
int cmd_port(struct cli_globals *g, int argc, char **argv);
int cmd_ps(struct cli_globals *g, int argc, char **argv);
int cmd_chat(struct cli_globals *g, int argc, char **argv);
int cmd_run(struct cli_globals *g, int argc, char **argv);
int cmd_conversations(struct cli_globals *g, int argc, char **argv);
int cmd_mcp(struct cli_globals *g, int argc, char **argv);

/* airlockd's client (cli/remote.c): exec in a session of the daemon, `airlock session ...`; and
 * whether exec and ps go to a daemon (--server or $AIRLOCK_HOST). */
int cli_remote_exec(struct cli_globals *g, int argc, char **argv);
int cli_remote_shell(struct cli_globals *g, const char *name);
int cli_remote_session(struct cli_globals *g, int argc, char **argv);
int cli_remote_snapshot(struct cli_globals *g, int argc, char **argv);
int cli_remote_volume(struct cli_globals *g, int argc, char **argv);
int cli_remote_proc(struct cli_globals *g, int argc, char **argv);
bool cli_remote_wanted(const struct cli_globals *g);
/* The sessions this user sees, in one table: those of airlock processes here, and airlockd's
 * (the one --server or $AIRLOCK_HOST names, else the default socket's when it is there):
 * airlock ps and airlock session ls. The exit status. */
int cli_sessions_table(struct cli_globals *g);
/* Whether airlockd's default socket is there. */
bool cli_daemon_here(void);
/* airlock cp with an airlockd session: src into session's dst (to_guest) or its src out to dst,
 * over the files API. The exit status. */
int cli_remote_cp(struct cli_globals *g, const char *session, const char *src, const char *dst,
                  bool to_guest);
/* airlock image commit with an airlockd session: its disk as the caller's image name there
 * (checkpoint: a checkpoint's id, or NULL). The exit status. */
int cli_remote_commit(struct cli_globals *g, const char *session, const char *name,
                      const char *checkpoint, bool force);
/* airlock port with an airlockd session: each connection a tunnel through the daemon (GET
 * .../tcp/PORT, Upgrade: airlock-tcp). cli_tunnel_new checks that the daemon has the session
 * (said in one line; NULL); cli_tunnel_relay is an al_forward_opts.relay. */
struct cli_tunnel *cli_tunnel_new(struct cli_globals *g, const char *session, unsigned guest_port);
int cli_tunnel_relay(void *tunnel, int fd, int cancel_fd, al_error *err);
void cli_tunnel_free(struct cli_tunnel *t);

/* The workdir (cli/cli_workdir.c): copy in with warnings, print the change list, ask and apply. */
enum cli_sync { CLI_SYNC_ASK, CLI_SYNC_YES, CLI_SYNC_NO };
int cli_workdir_push(al_session *s, const char *dir, const al_workdir_opts *o, bool quiet,
                     al_error *err);
void cli_changes_print(const al_workdir_diff *d, const char *title);
/* What a push left out (warnings) and, unless quiet, what it copied. */
void cli_workdir_pushed(const al_workdir_push_result *res, const char *guest_dir, bool quiet);
/* Applies per mode (ask: on a terminal only); -EIO when some change failed (printed). allow
 * (AL_APPLY_*) holds the consents given as flags (--sync-back-git, --sync-back-exec); in ask
 * mode the missing ones are asked for, each on its own, after the main question. Where ask mode
 * has nobody to ask (hung_up: a SIGTERM or SIGHUP ended the run; stdin not a terminal; the
 * question answered by end of input or a signal), the changes are kept
 * (al_workdir_diff_keep), never dropped, and where they are is said in one line. */
int cli_workdir_sync(al_workdir_diff *d, const char *dir, enum cli_sync mode, unsigned allow,
                     bool hung_up, al_error *err);

/* Guest output for a terminal (cli/termout.c): stream 1 to fd 1 and 2 to fd 2, each through
 * al_term_sanitize when on (force, or that fd is a terminal), else byte for byte; or, for a
 * terminal run (pass), through al_term_pass. */
struct cli_termout {
    bool on[2];
    bool pass;
    al_term_state st[2];
    al_term_pass_state ps[2];
};
void cli_termout_init(struct cli_termout *t, bool force);
/* A terminal run's output: what a terminal needs passes, what reaches past it does not. */
void cli_termout_init_pass(struct cli_termout *t);
bool cli_termout_any(const struct cli_termout *t);
/* An al_exec_opts.output callback (ctx: the cli_termout); 0 or a negative errno. */
int cli_termout_write(void *ctx, int stream, const uint8_t *data, size_t n);
/* The end of both streams: what a cut UTF-8 sequence left, shown. */
void cli_termout_end(struct cli_termout *t);

/* SIGINT, SIGTERM and SIGHUP each write their number (one byte) to a non-blocking pipe whose
 * read end it returns (a cancel_fd), or -errno; SIGPIPE is ignored. hook, when not NULL, runs
 * first in the handler (async-signal-safe calls only). No SA_RESTART: reads see EINTR. Once per
 * process (cli/signals.c). */
int cli_cancel_pipe(void (*hook)(int sig));

/* A terminal into a pty run (cli/tty.c): cli_tty_open sizes eo's pty from the local terminal
 * (24x80 when there is none) and sends it the local terminal's new sizes (SIGWINCH); with input,
 * the keys typed reach eo->stdin_fd through a thread, the local terminal in raw mode until
 * cli_tty_close (and at exit), and Ctrl-] leaves (the guest's side hangs up: left is set).
 * The local TERM is the guest's unless eo->env has one; eo->env then points into t.
 * Without input the run gets no stdin. One at a time per process. */
#define CLI_TTY_ENV_MAX 130 /* AL_ENV_MAX entries, TERM and the NULL */
struct cli_tty {
    int in_fd, out_fd;
    const char *env[CLI_TTY_ENV_MAX]; /* eo->env with TERM= added when it had none */
    char term[128];
    int keys[2];   /* the relayed keys: [0] is eo->stdin_fd */
    int resize[2]; /* al_pty_resize messages: [0] is eo->resize_fd */
    int stop[2];
    unsigned rows, cols;
    bool raw;               /* the local terminal was put in raw mode */
    struct cli_termout out; /* the run's output, filtered (eo->output); --raw takes it off */
    int out_pipe[2];        /* cli_tty_pump: the run's stdout, read into out by out_thread */
    int stop_out[2];
    bool pumping;
    pthread_t out_thread;
    bool relaying;
    bool left; /* the user pressed Ctrl-] */
    pthread_t thread;
};
#define CLI_TTY_LEAVE_HELP "Ctrl-] leaves (the shell gets SIGHUP, as when a terminal closes)"
int cli_tty_open(struct cli_tty *t, bool input, al_exec_opts *eo, al_error *err);
void cli_tty_close(struct cli_tty *t);
/* After cli_tty_open, for a run that takes fds and not a callback (al_attach_exec): its stdout
 * becomes a pipe read through the filter by a thread, until cli_tty_close. */
int cli_tty_pump(struct cli_tty *t, al_exec_opts *eo, al_error *err);
/* After cli_tty_close: when the user left, says so and gives 128 + SIGHUP, what the hangup means
 * whatever the guest's program made of it (a shell that reads the hangup's EOF before its
 * SIGHUP exits 0); status otherwise. */
int cli_tty_left(const struct cli_tty *t, int status);

/* Prints "airlock: MESSAGE" once, for the outermost caller. */
void cli_error(const al_error *err);
/* A session's notice (al_session_opts.on_notice; ctx unused) as one line on stderr, made inert
 * for a terminal. */
void cli_print_notice(void *ctx, const char *msg);
/* The name in names (NULL-terminated) nearest to word's first n bytes, or NULL when none is
 * close enough to suggest (cli/usage.c). */
const char *cli_nearest(const char *word, size_t n, const char *const *names);
/* On getopt_long's '?' (with opterr 0, as main sets it): says in one line what was wrong with
 * the option just read (unknown, with the nearest one; missing its value; ambiguous) and points
 * to 'airlock CMD --help' (cmd NULL: airlock's own); returns 2, the usage error's status. */
/* "A:B" split at its first ':' into two non-empty halves (arg is cut there); false when it is
 * not one (--put, --get, local or through airlockd). */
bool cli_split_pair(char *arg, char **a, char **b);
/* A forwarded port (exec -p, airlock port): where it listens, what it reaches, its forward. */
struct cli_port {
    char bind[64]; /* "" for 127.0.0.1 */
    unsigned host, guest;
    al_forward *f;
};
/* docker's -p: GUEST, HOST:GUEST or ADDR:HOST:GUEST; 0, or -1 having said why. */
int cli_publish_parse(const char *spec, struct cli_port *out);
/* Opens a forward for each port to s, r or t (one of them: a session of this process, another
 * airlock process's, airlockd's), each said on stderr unless quiet. */
struct cli_tunnel;
int cli_forwards_open(al_session *s, al_attach *r, struct cli_tunnel *t, struct cli_port *ports,
                      size_t n, bool quiet, al_error *err);
void cli_forwards_close(struct cli_port *ports, size_t n);
/* A --put source, before anything boots: a regular file we can open; else said in one line
 * and -1. */
int cli_check_put(const char *path);
/* A --get destination: a directory, or a name in one; else said in one line and -1. */
int cli_check_get(const char *path);
struct option;
int cli_bad_option(const char *cmd, int argc, char **argv, const char *shorts,
                   const struct option *longs);
/* airlock exec's -i and -t are docker's (stdin kept open, a terminal): an old "-t N" (a timeout)
 * is said in one line pointing to --timeout N, returning 2; else -1. */
int cli_check_docker_shorts(int argc, char **argv);
/* A time left as a person reads it: "45s", "12m", "3h05m", "2d04h", "now". */
void cli_duration(double seconds, char *buf, size_t len);
/* Parses a non-negative integer option; exits with a usage error when it is not one. */
unsigned long cli_number(const char *opt, const char *value, unsigned long max);

#endif

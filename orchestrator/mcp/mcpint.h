/* The MCP server's insides, shared by its three files: server.c (JSON-RPC, calls, cancellation
 * and progress), tools.c (the tool table, argument checks, the tools themselves) and runs.c
 * (sessions and the runs in them, with their bounded output). One mutex, al_mcp.mu, guards
 * every table and every run's output; one condition, al_mcp.cv, is broadcast on any change. */
#ifndef AL_MCP_INT_H
#define AL_MCP_INT_H

#include "mcp.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdint.h>

/* A run's output kept per stream: its first MCP_HEAD bytes and its last MCP_RING bytes, with
 * absolute offsets (process_output reads from an offset; what fell out of the ring is skipped,
 * and said so). */
#define MCP_HEAD (32u << 10)
#define MCP_RING (256u << 10)
/* What a result shows of each stream: in the text block, and in structuredContent. */
#define MCP_TEXT_KEEP (8u << 10)
#define MCP_STRUCT_KEEP (32u << 10)
#define MCP_RESULTS_MAX 32      /* kernel results kept per run */
#define MCP_IMAGES_MAX 4        /* figures a run returns as image content */
#define MCP_IMAGE_SIDE_MAX 1568 /* px, the longer side of an image sent */
#define MCP_WAIT_MAX_S 50       /* run_output and process_output wait at most this */

struct mcp_buf {
    uint64_t total;
    size_t headlen;
    char head[MCP_HEAD];
    char *ring; /* MCP_RING bytes, allocated on the first byte past the head */
};

struct mcp_sess;

struct mcp_run {
    struct mcp_run *next;
    al_mcp *m;
    struct mcp_sess *sess;
    char id[40];   /* "run_" or "proc_" and 24 hex digits */
    bool process;  /* start_process: output read by offset, never waited on by its call */
    bool kernel;   /* run_code in a kernel: results and figures */
    char *label;   /* what it runs, for list_processes (its first line, cut) */
    unsigned refs; /* callers reading it; it is pruned only when ended and unreferenced */
    int cancel[2]; /* the run's signal pipe (al_exec_opts.cancel_fd) */
    struct mcp_buf out[2];
    /* the run's work, copied in */
    char *lang, *code, *context, *cwd;
    char **argv, **env;
    unsigned timeout_ms;
    unsigned ahead;   /* runs of its kernel context before it, while it waits its turn */
    uint64_t arrival; /* its call's */
    /* its end */
    bool done;
    int rc; /* al_exec's */
    al_error err;
    al_exec_result res;
    bool killed; /* kill_process or a cancellation sent it a kill */
    uint64_t t_start_ms, t_end_ms;
    cJSON *results; /* array of what the kernel returned (summaries, no image data) */
    unsigned nresults_dropped;
    struct {
        uint8_t *data;
        size_t len;
    } img[MCP_IMAGES_MAX];
    unsigned nimg, nimg_dropped;
};

struct mcp_sess {
    struct mcp_sess *next;
    char id[40]; /* "sb_" and 32 hex digits: the handle the client passes */
    al_session *s;
    void *handle;  /* the host's (al_mcp_opts.session_open), or NULL */
    unsigned refs; /* the table's, and one per caller and run using it */
    bool gone;     /* stopped: no longer found */
    char image[64];
    unsigned memory_mib, cpus;
    cJSON *network; /* the hosts it may reach, an array (empty: none) */
    int64_t created;
    uint64_t boot_ms;
    uint64_t used_ms; /* the last call that named it, or its last run's end */
    struct mcp_run *runs;
    unsigned nruns;
    bool display; /* started with one: screenshot and computer work */
    /* The size the last screenshot was sent at (atomic): the computer tool's coordinates are its
     * pixels; 0 before the first (the screen's own). */
    unsigned shot_w, shot_h;
};

/* One request being answered on a worker thread. */
struct mcp_call {
    struct mcp_call *next;
    al_mcp *m;
    char *id; /* the request's id as compact JSON, to match a cancellation */
    char *method;
    cJSON *params;   /* the request's params (owned) */
    cJSON *progress; /* the progressToken the client gave, or NULL */
    al_mcp_send_fn send;
    void *ctx;
    bool modern;   /* a 2026-07-28 request: its result says resultType */
    int target_fd; /* where cancellation's signals go while a guest waits on it, or -1 */
    bool cancelled, killed;
    uint64_t t_start_ms, t_cancel_ms, t_progress_ms;
    unsigned nprogress;
    char phase[128];  /* what it is doing, for progress */
    uint64_t arrival; /* its place among the calls, in the order they were read */
    bool entered;     /* its kernel run took its place in the kernel's line (or never will) */
};

struct al_mcp {
    al_mcp_opts o;
    char *connect_uri, *image;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned live; /* worker and run threads not yet finished */
    unsigned ncalls;
    uint64_t arrivals; /* calls read so far */
    struct mcp_call *calls;
    struct mcp_sess *sessions;
    unsigned nsessions, booting;
    bool closing;
    pthread_t ticker;
    bool have_ticker;
    int tick_pipe[2];
    char version[16]; /* negotiated by initialize, "" before */
    cJSON *tools;     /* tools/list's result, built once */
};

/* server.c, for the tools: under m->mu unless said otherwise. */
void mcp_call_phase(struct mcp_call *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void mcp_call_target(struct mcp_call *c, int fd); /* takes the lock */
bool mcp_call_cancelled(struct mcp_call *c);      /* takes the lock */
void mcp_log(al_mcp *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A random handle: prefix and hex digits of getrandom, NUL-terminated in out (len >= 4 + 2n). */
int mcp_handle(char *out, size_t len, const char *prefix, size_t nbytes);

/* tools.c */
int mcp_tools_build(al_mcp *m, al_error *err);
/* Checks a tools/call's name and arguments against the table: 0, or -1 with msg (the JSON-RPC
 * error's, -32602). */
int mcp_tools_check(al_mcp *m, const char *name, const cJSON *args, char *msg, size_t len);
/* Runs the call (on its worker thread): the tools/call result object (malloc'd). */
cJSON *mcp_tools_call(al_mcp *m, struct mcp_call *c, const char *name, const cJSON *args);
/* resources/list and resources/read: the result, or NULL with *code and msg set. */
cJSON *mcp_resources_list(al_mcp *m, struct mcp_call *c, int *code, char *msg, size_t len);
cJSON *mcp_resources_read(al_mcp *m, struct mcp_call *c, const char *uri, int *code, char *msg,
                          size_t len);

/* runs.c */
/* Finds a session by handle and takes a reference (NULL: none, or stopped). Takes the lock. */
struct mcp_sess *mcp_sess_get(al_mcp *m, const char *id);
/* Drops a reference; the last one closes the session (its VM goes). Takes the lock. */
void mcp_sess_put(al_mcp *m, struct mcp_sess *ss);
/* Opens a session (the call's cancellation cancels the boot) and puts it in the table: the
 * caller holds a reference. Bounded by sessions_max. Takes the lock. */
/* The library's name of this process's user's snapshot name (stdio: no host keeps them). */
int mcp_snapshot_name(const char *name, char *buf, size_t len, al_error *err);
int mcp_sess_open(al_mcp *m, struct mcp_call *c, const al_session_opts *so, const al_fork *fork,
                  const char *snapshot, struct mcp_sess **out, al_error *err);
/* Stops it: no longer found, its runs killed, its VM ended; waits (up to 30 s) for its users to
 * let go, then the caller's reference closes it. Takes the lock. */
void mcp_sess_stop(al_mcp *m, struct mcp_sess *ss);
/* A new run in ss (the caller holds a reference to ss), started on its own thread; run holds a
 * reference the caller drops with mcp_run_put. The strings are copied. */
struct mcp_run_spec {
    bool process, kernel;
    const char *lang, *code, *context, *cwd, *label;
    const char *const *argv;
    const cJSON *env; /* object of strings, or NULL */
    unsigned timeout_ms;
    uint64_t arrival; /* the call's (mcp_call.arrival): kernel runs take their turns in it */
};
int mcp_run_start(al_mcp *m, struct mcp_sess *ss, const struct mcp_run_spec *sp,
                  struct mcp_run **out, al_error *err);
/* Finds a run by id (in any live session), with a reference to it and to its session. */
struct mcp_run *mcp_run_get(al_mcp *m, const char *id);
void mcp_run_put(al_mcp *m, struct mcp_run *r);
/* Waits until r ends, wait_ms pass, c is cancelled (its signals then go to the run) or, with
 * since, either stream has bytes past since[0] / since[1]. true when it ended. Takes the
 * lock. */
bool mcp_run_wait(al_mcp *m, struct mcp_run *r, struct mcp_call *c, uint64_t wait_ms,
                  const uint64_t since[2]);
/* Sends the run a signal byte (SIGINT is passed on; any other kills its process tree). */
void mcp_run_signal(struct mcp_run *r, int sig);
/* Keeps n more bytes of a stream (the guest's: any bytes at all). Under the lock. */
void mcp_buf_append(struct mcp_buf *b, const uint8_t *p, size_t n);
/* The bytes [from, from+max) of a stream that are still held, as valid UTF-8 (malloc'd); *next
 * the offset after them, *skipped what was before from but no longer held. Under the lock. */
char *mcp_buf_read(const struct mcp_buf *b, uint64_t from, size_t max, uint64_t *next,
                   uint64_t *skipped);
/* Head and tail of a stream, keep bytes each, with a line naming what was cut between
 * (malloc'd, valid UTF-8); *cut says whether anything was. Under the lock. */
char *mcp_buf_summary(const struct mcp_buf *b, size_t keep, bool *cut);
/* Stops the sessions idle longer than idle_max_s (the ticker, without the lock). */
void mcp_sessions_reap(al_mcp *m);
/* Ends every session (al_mcp_free). */
void mcp_sessions_end(al_mcp *m);

#endif

/* airlockd: libairlock behind an HTTP/1.1 + JSON API (libmicrohttpd). A thin front like the CLI:
 * sessions, runs, files and checkpoints are the library's; this holds who owns what, how long it
 * lives, and the event buffers between a run and its readers. */
#ifndef AIRLOCKD_H
#define AIRLOCKD_H

#include <airlock.h>
#include <airlock/policy.h>
#include <airlock/text.h>
#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "cleanup.h" /* after cJSON.h: _cleanup_cjson_ */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

/* ---- small helpers (cleanup attributes: proto/cleanup.h) ---- */

uint64_t ad_now_ms(void);
/* One log line on stderr, prefixed with the time; never a secret. */
void ad_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- config (config.c; the format is documented in packaging/airlockd.conf) ---- */

#define AD_ALLOW_UIDS_MAX 16

/* e2b_template lines in the config: a handful of an organisation's templates. */
#define AD_E2B_TEMPLATES_MAX 64
/* What one owner (an API key, or a unix peer uid) may hold at once. 0: no limit where noted. */
struct ad_limits {
    unsigned max_sessions;       /* concurrent sessions */
    unsigned max_memory_mib;     /* total guest memory of those sessions */
    unsigned max_vcpus;          /* total vCPUs of those sessions */
    unsigned max_lifetime_s;     /* a session's lifetime, also the default */
    unsigned max_idle_s;         /* a session's idle timeout, also the default */
    unsigned max_exec_timeout_s; /* a run's timeout, also the default */
    uint64_t max_upload_bytes;   /* one file upload */
    uint64_t disk_budget_bytes;  /* each session's disk budget (the library's) */
    unsigned requests_per_s;     /* requests per second, bursts up to twice that */
    uint64_t net_bytes_max;      /* a session's network bytes, also the default cap
                                    up to the library's 1 GiB */
    unsigned max_snapshots;      /* snapshots kept (POST .../snapshots) */
    uint64_t max_snapshot_bytes; /* their files on disk together */
    uint64_t max_volume_bytes;   /* volumes' sizes together (POST /v1/volumes) */
};

/* A libvirt host sessions are placed on (hosts.c): "host = NAME URI [max_sessions=N]
 * [max_memory_mib=N] [weight=N]" in the config. */
#define AD_HOSTS_MAX 16
struct ad_host_cfg {
    char name[64];
    char uri[512];                         /* "": the library's default connection */
    unsigned max_sessions, max_memory_mib; /* 0: no cap */
    unsigned weight;                       /* its share of the load, 1 by default */
    bool local; /* the URI names no other machine: network, SSH and warm starts work there */
};

struct ad_config {
    char socket_path[512];
    unsigned socket_mode;
    uid_t allow_uids[AD_ALLOW_UIDS_MAX]; /* unix peers allowed besides the daemon's own uid */
    size_t nallow;
    gid_t allow_gid; /* unix peers in this group (primary or supplementary) too */
    bool has_allow_gid;
    char tcp_listen[128]; /* "HOST:PORT", "" for none */
    char tls_cert[512];   /* PEM files; both or neither */
    char tls_key[512];
    char keys_db[512];
    char spool_dir[512]; /* uploads and downloads pass through here, never memory */
    struct ad_limits limits;
    uint64_t run_buffer_bytes; /* a run's event replay buffer */
    uint64_t spool_max_bytes;  /* what all uploads in flight may hold in spool_dir */
    unsigned runs_kept;        /* finished runs kept per session for late readers */
    unsigned heartbeat_s;
    unsigned connection_timeout_s;
    unsigned head_timeout_s; /* a request's head (line and headers) arrives within this */
    uint64_t max_body_bytes; /* a JSON request body */
    unsigned max_connections;
    unsigned max_connections_per_ip; /* TCP connections one address may hold; 0: no bound */
    /* the chat's model: the key is read from the environment variable model_api_key_env at
     * start and never leaves the daemon */
    char model_api[16]; /* "openai" or "anthropic" */
    char model_api_base[256];
    char model[128];
    char model_api_key_env[64];
    bool model_tools;
    /* The warm pool (sessions.c): pool_size sessions of pool_image restored ahead of demand;
     * 0: none. */
    char pool_image[64];                             /* "": the default image */
    unsigned pool_size, pool_memory_mib, pool_vcpus; /* 0 memory, vCPUs: the image's */
    /* Network on request: the hosts and *.suffix patterns any session may allow
     * at most (NULL: none, no session gets a network); the byte cap is limits.net_bytes_max. */
    char **net_allow_max;
    /* Many hosts: none configured is one, the library's default connection. */
    struct ad_host_cfg hosts[AD_HOSTS_MAX];
    size_t nhosts;
    unsigned host_check_s; /* how often each host is asked whether it answers */
    /* E2B compatibility (e2b.c): its listener ("HOST:PORT", "" for none) and the image E2B's
     * default templates (base, code-interpreter-v1) stand for */
    /* Sessions that last (store.c): sessions are kept by the library, so that a restart takes
     * them back, and may be paused (true by default); false: a stop ends them all, and the warm
     * pool serves creates. */
    bool keep_sessions;
    unsigned keep_grace_s; /* how long kept sessions wait for a daemon that stopped; 0: the
                              library's default (AIRLOCK_KEEP_GRACE_S) */
    char e2b_listen[128];
    /* Open Interpreter's server protocol (oi.c): its listener ("HOST:PORT", "" for none) */
    char oi_listen[128];
    /* e2b_template lines: a templateID that names an image of the store */
    struct ad_e2b_template {
        char name[64], image[64];
    } e2b_templates[AD_E2B_TEMPLATES_MAX];
    size_t ne2b_templates;
    char e2b_image[64];
    /* the sandboxes' domain E2B's getHost names (PORT-ID.DOMAIN); "": "localhost:PORT" of the
     * E2B listener when it listens on loopback (http.c fills it), else none */
    char e2b_domain[128];
};

void ad_config_defaults(struct ad_config *c);
/* Reads path over c; on failure returns -errno with "path:line: why" in why. */
int ad_config_load(struct ad_config *c, const char *path, char *why, size_t len);

/* ---- hosts (hosts.c) ---- */

/* Starts watching the configured hosts (one round done before it returns). */
int ad_hosts_init(const struct ad_config *c);
void ad_hosts_shutdown(void);
struct ad_fail;
/* A host with room for a session of mem MiB (local_only: one whose URI names no other machine),
 * reserved for it: its index and its URI (NULL: the default), or -1 with f filled (503). */
int ad_host_place(unsigned mem, bool local_only, const char **uri, struct ad_fail *f);
/* Gives back what ad_host_place reserved (the session ended, or never started). */
void ad_host_release(int host, unsigned mem);
bool ad_host_local(int host);
/* Reaps on the host what ended sessions left there, when it answers (after a lost session). */
void ad_host_gc(int host);
/* GET /v1/hosts: every host, its state, capacity, sessions and last error. */
cJSON *ad_hosts_json(void);
/* /metrics: fn for each host (names are [A-Za-z0-9._-]), under the hosts' lock. */
void ad_hosts_each(void (*fn)(void *ctx, const char *name, bool up, unsigned sessions,
                              unsigned lost),
                   void *ctx);
/* sessions.c: marks the sessions on a host that went down lost; how many were newly lost. */
unsigned ad_sessions_host_down(int host, const char *why);

/* ---- API keys (keys.c): sqlite, WAL, only SHA-256 hashes of secrets stored ---- */

struct ad_key {
    char id[24];
    char name[64];
    int64_t created;
    bool revoked;
    struct ad_limits lim; /* this key's own; a 0 field: the config's */
};

int ad_keys_open(const char *path, char *why, size_t len);
void ad_keys_close(void);
/* Makes a key; secret (>= 80 bytes) gets the whole token, shown once. */
int ad_keys_add(const char *name, const struct ad_limits *lim, struct ad_key *out, char *secret,
                size_t len);
/* The limits a key may carry: their names (as in the config and --max-... flags) and where
 * each lives in struct ad_limits. */
struct ad_limit_field {
    const char *name;
    size_t offset;
    bool wide; /* uint64_t, else unsigned */
};
extern const struct ad_limit_field ad_limit_fields[];
extern const size_t ad_nlimit_fields;
uint64_t ad_limit_get(const struct ad_limits *l, const struct ad_limit_field *f);
void ad_limit_set(struct ad_limits *l, const struct ad_limit_field *f, uint64_t v);
/* Fields of over that are not 0 replace those of base. */
void ad_limits_apply(struct ad_limits *base, const struct ad_limits *over);
int ad_keys_list(void (*fn)(void *ctx, const struct ad_key *k), void *ctx);
int ad_keys_revoke(const char *id);
/* 0 and *out for a valid, unrevoked token; -EACCES otherwise. */
int ad_keys_check(const char *token, struct ad_key *out);
/* The key of that id: 0 and *out, -EACCES when it was revoked, -ENOENT when there is none. */
int ad_keys_get(const char *id, struct ad_key *out);

/* ---- sessions (sessions.c) ---- */

struct ad_run;

struct ad_session {
    char id[64];    /* the library's session name */
    char owner[40]; /* "key:ID" or "uid:N" */
    char image[64];
    unsigned memory_mib, vcpus;
    char transport[16];
    enum al_checkpoint_policy policy;
    bool checkpoints; /* opened with checkpoints allowed */
    bool display;     /* opened with a display (GET .../screen, POST .../input) */
    bool pooled;      /* handed out by the warm pool (never returned to it) */
    cJSON *labels;
    int64_t created; /* unix time */
    uint64_t created_ms, used_ms;
    unsigned idle_s, lifetime_s;
    uint64_t deadline_ms; /* created + lifetime, moved by extend */
    al_session *s;
    int host;  /* hosts.c's index of the host it runs on */
    bool lost; /* that host went down: every request but GET and DELETE fails */
    char lost_why[256];
    int cancel_wr; /* the session's cancel pipe (al_session_opts.cancel_fd) */
    int cancel_rd;
    /* under the registry lock: */
    unsigned refs;
    bool gone;            /* out of the registry; closed when refs drop to 0 */
    struct ad_run *runs;  /* newest first */
    struct ad_chat *chat; /* the chat's state, made by the first chat turn (chat.c) */
    unsigned next_run;
    cJSON *net; /* {"allow": [...], "bytes_max": N}, or NULL: no network */
    /* made by E2B's create (e2b.c), set before the session is seen by others; "" otherwise */
    char e2b_token[65];    /* envd's access token (hex) */
    char e2b_traffic[65];  /* the sandbox's ports' traffic token (hex) */
    char e2b_template[64]; /* the template name asked for */
    cJSON *e2b_env;        /* envVars: every process's environment, or NULL */
    cJSON *e2b_contexts;   /* the code interpreter's contexts (e2b.c, under its lock) */
    struct ad_e2b_watcher *e2b_watchers; /* envd's CreateWatcher's (e2b.c, the same lock) */
    bool e2b_user;        /* the guest has E2B's `user` and runuser: processes run as it */
    char forked_from[64]; /* the session it was forked from (ad_session_fork), or "" */
    cJSON *volumes;       /* the volumes asked for at create ([{"name", "path", ...}]), or NULL */
    /* Sessions that last (store.c): kept by the library for this daemon (restarts take
     * it back), its name (unique per owner, "" for none), paused to disk, pausing when idle this
     * long instead of ending (0: never); set at create or restore, paused under the lock. */
    bool kept;
    char name[64];
    bool paused;
    unsigned auto_pause_s;
    bool pause_at_end; /* E2B's autoPause: paused, not ended, at the end of its lifetime */
    bool detaching;    /* shutdown: the VM is left running for the next start */
    /* ad_create.front_held's: told before the daemon ends it */
    void (*on_end)(void *ctx, struct ad_session *s);
    void *on_end_ctx;
    /* ad_session_metrics' samples (a ring, under the registry lock) */
    struct ad_metric *metrics;
    unsigned nmetrics, metrics_next;
};

int ad_sessions_init(const struct ad_config *c);
/* Ends every session (shutdown): runs cancelled, VMs destroyed. */
void ad_sessions_shutdown(void);
/* The warm pool's shape and how many sessions it holds ready now; NULL when there is none. */
cJSON *ad_pool_json(void);
/* A referenced session of owner, or NULL (404: another owner's look the same as none). */
struct ad_session *ad_session_get(const char *owner, const char *id);
/* The same whoever owns it (E2B's data plane, where the sandbox's token says who may). */
struct ad_session *ad_session_get_any(const char *id);
/* The first live session match says yes to (called under the registry lock: quick, no
 * blocking), referenced, or NULL. */
struct ad_session *ad_session_find(bool (*match)(void *ctx, const struct ad_session *s), void *ctx);
void ad_session_put(struct ad_session *s);
void ad_session_touch(struct ad_session *s);
/* Takes it out of the registry, cancels its runs and closes it once the caller's reference is
 * the last; the caller's reference is gone either way (the reaper may be ending it already). */
void ad_session_delete(struct ad_session *s);
void ad_session_list(const char *owner, void (*fn)(void *ctx, struct ad_session *s), void *ctx);
cJSON *ad_session_json(struct ad_session *s);

struct ad_create {
    const char *name; /* unique per owner, or NULL */
    unsigned auto_pause_s;
    bool pause_at_end; /* paused instead of ended when its lifetime is over (E2B's autoPause) */
    const char *image;
    unsigned memory_mib, vcpus;
    const char *transport;
    const char *checkpoint_policy;
    bool checkpoints; /* allow checkpoints without a policy that takes them */
    bool display;     /* a screen and input devices the host drives (computer use) */
    unsigned display_width, display_height; /* its mode; 0: 1280x800 */
    unsigned idle_s, lifetime_s;
    cJSON *labels; /* borrowed; copied */
    cJSON *net;    /* borrowed: {"allow": [...], "bytes_max": N}, or NULL */
    /* E2B's (e2b.c), copied before the session is seen: its tokens, template, envVars */
    const char *e2b_token, *e2b_traffic, *e2b_template;
    const cJSON *e2b_env;
    /* Held by a front of this process for its client (MCP's start_session): never kept across
     * restarts nor paused; when the daemon ends it (DELETE, its lifetime, its idle time, the
     * key revoked), on_end(on_end_ctx, s) is told first, so that the front lets go. */
    bool front_held;
    void (*on_end)(void *ctx, struct ad_session *s);
    void *on_end_ctx;
    /* A fork of another session's save (ad_session_fork): image is the source's as stored. */
    const al_fork *fork;
    bool fork_keep_identity; /* with fork: left as its source was */
    /* Started from the owner's snapshot of that name (the library's, ad_snapshot_name). */
    const char *snapshot;
    /* Volumes: [{"name", "path", "read_only"}] (borrowed), the owner's, or NULL. */
    const cJSON *volumes;
};
/* Forks of src (ad_session_fork): each like create c (name: each fork's "NAME-I"; image,
 * memory, vCPUs, display and checkpoints are the source's). */
struct ad_fork_req {
    unsigned count;     /* 1 to AD_FORK_MAX */
    bool keep_identity; /* not made unique (al_session_opts.fork_keep_identity) */
    struct ad_create c;
};
#define AD_FORK_MAX 16
/* The HTTP status and error code on failure. */
struct ad_fail;
/* Snapshots (sessions.c): the library's name of owner's snapshot name (its owner's prefix, then
 * the name: 1 to 63 of [A-Za-z0-9._-], not starting with a dot), into buf[128]; -EINVAL for a
 * bad name. The prefix alone: name NULL. */
int ad_snapshot_name(const char *owner, const char *name, char *buf, size_t len);
/* s saved as owner's snapshot name, within the owner's max_snapshots and max_snapshot_bytes. */
int ad_snapshot_save(struct ad_session *s, const char *owner, const struct ad_limits *lim,
                     const char *name, bool replace, al_snapshot_info *out, struct ad_fail *f);
/* The owner's snapshots (their names without the prefix), each to fn. */
void ad_snapshot_list(const char *owner, void (*fn)(void *ctx, const al_snapshot_info *s),
                      void *ctx);
int ad_snapshot_remove(const char *owner, const char *name, struct ad_fail *f);
/* Every snapshot of owner removed (its key revoked). */
void ad_snapshots_drop(const char *owner);
/* Volumes (sessions.c): the owner's, named as snapshots are (ad_snapshot_name); sizes within
 * its max_volume_bytes. */
int ad_volume_create(const char *owner, const struct ad_limits *lim, const char *name,
                     uint64_t size, al_vol_info *out, struct ad_fail *f);
void ad_volume_list(const char *owner, void (*fn)(void *ctx, const al_vol_info *v), void *ctx);
int ad_volume_remove(const char *owner, const char *name, struct ad_fail *f);
struct ad_fail {
    int status;
    const char *code;
    const char *limit; /* a quota's name for 429 */
    char msg[512];
};
/* What a session's VM used, sampled from the host's counters (al_session_usage) when asked, at
 * most one sample a second, the last AD_METRICS_MAX kept: a JSON array of {"timestamp" (unix
 * ms), "cpu_used_pct", "cpu_count", "mem_used", "mem_total", "disk_used", "disk_total"}
 * taken from from_s to to_s (unix seconds; 0: no bound), oldest first. A paused session gives
 * what was sampled before. */
#define AD_METRICS_MAX 120
int ad_session_metrics(struct ad_session *s, int64_t from_s, int64_t to_s, cJSON **out,
                       struct ad_fail *f);
/* src's state saved once and count sessions of owner opened from it, each told to each in
 * order: the fork (a reference each() may keep with ad_session_get) or NULL and why (a fork
 * past a quota fails alone). An E2B sandbox's forks get tokens of their own and its template,
 * envVars and user. Fails whole (f, each never called) when the save does. */
int ad_session_fork(struct ad_session *src, const char *owner, const struct ad_limits *lim,
                    const struct ad_fork_req *req,
                    void (*each)(void *ctx, struct ad_session *fork, const struct ad_fail *why),
                    void *ctx, struct ad_fail *f);
/* Whether s is being ended (deleted, reaped, killed): a run that ends now ended with it. */
bool ad_session_ending(struct ad_session *s);
int ad_session_create(const char *owner, const struct ad_limits *lim, const struct ad_create *c,
                      struct ad_session **out, struct ad_fail *f);
/* Pauses a kept session to disk (its memory and QEMU process freed; its runs suspended, taken
 * up again by the resume) and brings it back. */
int ad_session_pause(struct ad_session *s, struct ad_fail *f);
int ad_session_resume(struct ad_session *s, struct ad_fail *f);
/* The session's record written to the store (a kept one's; no-op otherwise), after a change. */
void ad_session_save(struct ad_session *s);
/* A session's name: 1 to 63 of [A-Za-z0-9._-], not "airlock-..." (an id's form). */
bool ad_session_name_ok(const char *name);
/* Images an owner saved from its sessions (POST /v1/sessions/{id}/image) are its own: in the
 * store as "own-" + 10 hex digits of the owner's hash + "-" + NAME, found under NAME by that
 * owner's creates before the store's images, never by another's. */
#define AD_OWN_IMAGE_PREFIX "own-"
#define AD_OWN_IMAGE_NAME_MAX 48
int ad_owner_image(const char *owner, const char *name, char *out, size_t len);
/* The store's name of the image owner's creates mean by name: its own of that name when there
 * is one, else name itself (into buf, which is returned). */
const char *ad_image_for(const char *owner, const char *name, char *buf, size_t len);
/* The image a create of owner's names, every front's one way: ad_image_for, or NULL when it is
 * not in the store or is another owner's saved image (one answer for both: "unknown image"). */
const char *ad_image_resolve(const char *owner, const char *name, char *buf, size_t len);
/* The live session of owner named name, referenced, or NULL. */
struct ad_session *ad_session_by_name(const char *owner, const char *name);

/* ---- the sessions' store (store.c): the key store's file, table sessions ---- */

int ad_store_open(const char *keys_db, char *why, size_t len);
void ad_store_close(void);
/* The keeper name of this daemon's kept sessions (al_session_opts.keep). */
const char *ad_store_keeper(void);
/* Says at start which kept sessions of other daemons' stores run on this machine (left alone:
 * each daemon reaps only its own) and the command that ends them. */
void ad_store_others(void);
int ad_store_put(const char *id, const char *owner, const char *name, const cJSON *record);
void ad_store_del(const char *id);
int ad_store_each(void (*fn)(void *ctx, const char *id, const char *owner, const cJSON *record),
                  void *ctx);

/* Moves the end of its lifetime to seconds from now, within lim's max_lifetime_s of its start. */
int ad_session_extend(struct ad_session *s, unsigned seconds, const struct ad_limits *lim,
                      struct ad_fail *f);

/* ---- runs (runs.c) ---- */

struct ad_exec_req {
    cJSON *argv;      /* array of strings, or NULL with code */
    const char *code; /* code in language */
    const char *language;
    bool kernel;
    cJSON *env; /* object of strings */
    const char *cwd;
    const char *stdin_data; /* written then closed, unless stdin_open */
    bool stdin_open;
    unsigned timeout_s;
    /* > 0: on a terminal of this size (1..AL_PTY_ROWS_COLS_MAX each), stdin open; with neither
     * argv nor code, the login shell (AL_LOGIN_SHELL) */
    unsigned pty_rows, pty_cols;
    /* instead of argv or code: a run whose thread calls body (a chat turn), which fills the
     * end event's object and returns its type ("done", "error") */
    const char *(*body)(struct ad_run *r, void *ctx, cJSON *end);
    void *body_ctx;
    const char *tag;     /* a name the caller finds it by (E2B's process tag), or NULL */
    const char *context; /* a kernel run's context (al_exec_opts.context), or NULL */
    bool hidden;         /* the daemon's own (E2B's watchers): "hidden" in its JSON */
};
int ad_run_start(struct ad_session *s, const struct ad_exec_req *r, const struct ad_limits *lim,
                 cJSON **out, struct ad_fail *f);
/* An unfinished kernel run of s in lang and context (NULL: the default) holds that kernel. */
bool ad_runs_kernel_busy(struct ad_session *s, const char *lang, const char *context);
/* The id of the newest unfinished run of s tagged tag (or, with tag NULL, whose program has
 * guest_pid in the guest) into rid ("" when none). */
void ad_run_find(struct ad_session *s, const char *tag, uint32_t guest_pid, char *rid, size_t len);
/* The run's program's pid in the guest, waiting up to wait_ms for it to start; 0 when it
 * ended first or the time ran out. */
uint32_t ad_run_guest_pid(struct ad_run *r, unsigned wait_ms);
/* The run rid of s with a reference (ad_run_put), or NULL. */
struct ad_run *ad_run_get(struct ad_session *s, const char *rid);
void ad_run_put(struct ad_run *r);
cJSON *ad_run_json(struct ad_run *r);
void ad_run_list(struct ad_session *s, cJSON *arr);
/* An SSE response from after event last_id (0: from the first): with follow, to the run's end;
 * without, to the last event held now. Output events made before since_ms (unix ms) are left
 * out. NULL with f set when those events were already dropped. */
struct MHD_Response *ad_run_events(struct ad_run *r, uint64_t last_id, bool follow,
                                   uint64_t since_ms, struct ad_fail *f);
/* Another framing of the same events (E2B's Connect envelopes): fmt makes each event's bytes
 * (malloc'd, *len; NULL to send nothing for it) from its type and its data's JSON (json_len
 * bytes); a heartbeat is type "heartbeat", the stream's end type "" (both with json NULL).
 * fmt sets *last to end the stream after its bytes (a framing's own end). Heartbeats come
 * beat_ms apart (0: heartbeat_s): a caller that left is seen at the next write. ctx_free (if given)
 * frees ctx with the stream; on failure too. */
/* What a fmt sets *len to (returning NULL) to drop the stream: the connection closes without
 * the framing's end, as a peer's clients expect of a sandbox killed under a stream. */
#define AD_RUN_FMT_ABORT SIZE_MAX
typedef char *(*ad_run_fmt)(void *ctx, const char *type, const char *json, size_t json_len,
                            size_t *len, bool *last);
struct MHD_Response *ad_run_stream(struct ad_run *r, uint64_t last_id, ad_run_fmt fmt, void *ctx,
                                   void (*ctx_free)(void *ctx), unsigned beat_ms,
                                   struct ad_fail *f);
/* The events held after last_id, each to fn (type and data JSON as for ad_run_fmt), as one
 * reader that keeps no stream (E2B's polled watchers); returns the last event's number, with
 * *done (if given) whether the run has ended. */
typedef void (*ad_run_read_fn)(void *ctx, const char *type, const char *json, size_t json_len);
uint64_t ad_run_read(struct ad_run *r, uint64_t last_id, ad_run_read_fn fn, void *ctx, bool *done);
/* Each new event of r (its end too) adds 1 to the eventfd fd (nonblocking), so that one reader
 * waits in its own poll(); -1 stops it (before fd is closed). One such reader at a time. */
void ad_run_notify(struct ad_run *r, int fd);
/* Adds 1 to the eventfd fd (nonblocking; -1: nothing): wakes its reader. */
void ad_eventfd_wake(int fd);
int ad_run_stdin(struct ad_run *r, const void *data, size_t len, bool eof, struct ad_fail *f);
int ad_run_signal(struct ad_run *r, int signo, struct ad_fail *f);
/* A pty run's new terminal size (1..AL_PTY_ROWS_COLS_MAX each). */
int ad_run_resize(struct ad_run *r, unsigned rows, unsigned cols, struct ad_fail *f);
/* Waits up to timeout_ms for the end; returns the run's JSON (done or not). */
cJSON *ad_run_wait(struct ad_run *r, unsigned timeout_ms);
/* Cancels every run of s (delete, reaping, shutdown) and waits for their threads. */
void ad_runs_cancel(struct ad_session *s);
/* Sessions that last: the runs in flight as the store keeps them (id, request id, what runs);
 * after a resume or a restart, each suspended run whose request the agent handed over
 * (al_session_adopted) is taken up again, the others end with an error event; runs is the
 * store's array at a restart (NULL after a resume in this daemon's life). */
cJSON *ad_runs_record(struct ad_session *s);
void ad_runs_resume(struct ad_session *s, const cJSON *runs);
/* The runs of source's record (ad_runs_record, taken before the save) that fork's guest still
 * runs, taken up in the fork under the same ids: their output flows on, and they can be waited
 * for, signalled, and given stdin there. */
void ad_runs_inherit(struct ad_session *fork, const cJSON *runs, const char *source);
void ad_runs_free(struct ad_session *s);
bool ad_runs_active(struct ad_session *s);
/* For a body: appends an event (waiting for a reader when the buffer is full), and the
 * output callback al_exec takes (ctx: the run). */
int ad_run_push(struct ad_run *r, const char *type, cJSON *data);
int ad_run_output(void *ctx, int stream, const uint8_t *data, size_t len);
/* A kernel run's result as a "result" event (a refused one as "refused"), with the same wait for
 * room as output; its data is al_result_json's object. An al_result_fn. */
int ad_run_result(void *ctx, const al_result *r);
/* Cancelled (the session ends) or the daemon stopping. */
bool ad_run_cancelled(struct ad_run *r);
/* Set on shutdown: event streams end. */
void ad_runs_shutdown(void);

/* ---- chat (chat.c): the library's chat loop, a turn as a run ---- */

struct ad_chat_req {
    const char *message;
    const char *model; /* NULL: the config's */
    bool auto_run;     /* false: nothing runs (the page shows the code) */
    /* within the daemon's endpoint (Open Interpreter's llm settings): 0 / false: the default */
    double temperature;
    bool has_temperature;
    unsigned context_window, max_tokens;
    unsigned max_output;        /* bytes of a run's output the model sees (the library's bounds) */
    const char *system_message; /* replaces the built-in system prompt, or NULL */
    const char *instructions;   /* appended to it (custom_instructions), or NULL */
};
int ad_chat_turn(struct ad_session *s, const struct ad_chat_req *q, const struct ad_limits *lim,
                 cJSON **out, struct ad_fail *f);
/* Undo: rolls the VM back to before the last exchange (when a checkpoint was taken) and drops
 * it from the history. */
int ad_chat_undo(struct ad_session *s, cJSON **out, struct ad_fail *f);
/* Without auto_run: the answer to the code block that waits (a "confirm" event): run it (as
 * code, when given: edited) or skip it. */
int ad_chat_confirm(struct ad_session *s, bool run, const char *code, struct ad_fail *f);
cJSON *ad_chat_json(struct ad_session *s);
/* Replaces the conversation with lmc (Open Interpreter's LMC messages, al_chat_from_lmc),
 * between turns. */
int ad_chat_restore(struct ad_session *s, const cJSON *lmc, struct ad_fail *f);
void ad_chat_free(struct ad_session *s);

/* ---- web sessions (web.c): the page's sign-in, an HttpOnly cookie holding a token ---- */

/* A new token for a valid API key (the key is kept in memory only, checked again on each
 * request so that a revoked key ends its web sessions); -EBUSY when the table is full of
 * other keys' live sign-ins, -EACCES for a key not valid. */
int ad_web_login(const char *api_key, const char *scope, char *token, size_t len);
void ad_web_logout(const char *token);
/* The API key behind a token, or NULL. Copies it into buf. */
const char *ad_web_key(const char *token, const char *scope, char *buf, size_t len);
/* The embedded page: a file by its URL path ("/", "/app.js"), or NULL. */
const char *ad_web_file(const char *path, size_t *len, const char **type);

/* ---- E2B compatibility (e2b.c) ---- */

struct ad_req;
/* The route of a request to the e2b listener, its caller (the key's, or the sandbox token's)
 * and its session; *ok false: the reply was given. */
enum MHD_Result ad_e2b_route(struct MHD_Connection *c, struct ad_req *q, const char *url,
                             const char *method, bool *ok);
/* An airlockd key in E2B's form ("e2b_" and hex) and back. */
bool ad_e2b_key_to_native(const char *e2b, char *out, size_t len);
void ad_e2b_key_from_native(const char *alk, char *out, size_t len);
/* Frees what e2b.c keeps on a session (its watchers' state; their runs end with it). */
void ad_e2b_session_free(struct ad_session *s);

/* ---- HTTP (http.c, routes.c) ---- */

struct ad_req;
typedef enum MHD_Result (*ad_handler)(struct MHD_Connection *c, struct ad_req *q);

enum ad_route_flags {
    AD_BODY_JSON = 1 << 0,  /* a JSON body, at most max_body_bytes, in memory */
    AD_BODY_RAW = 1 << 1,   /* raw bytes, at most max_body_bytes, in memory (stdin) */
    AD_BODY_SPOOL = 1 << 2, /* streamed to a spool file, at most max_upload_bytes */
    AD_NO_SESSION = 1 << 3, /* no {id} to resolve */
    AD_NO_AUTH = 1 << 4,    /* no key needed (health, sign-in) */
    AD_LOST_OK = 1 << 5,    /* served for a session whose host went down (get, delete) */
    AD_ANY_METHOD = 1 << 6, /* any method, and the path's rest past the pattern (a proxy) */
    AD_OWN_ORIGIN = 1 << 7, /* checks Origin itself (/mcp): no X-Airlock-CSRF asked */
    AD_PAUSED_OK = 1 << 8,  /* served for a paused session (get, delete, resume, runs' events) */
    AD_ID_NOT_SESSION = 1 << 9, /* E2B's: the path's {id} names no sandbox (a template) */
};

struct ad_route {
    const char *method;
    const char *pattern; /* "/v1/sessions/{id}/runs/{run}" */
    unsigned flags;
    ad_handler fn;
    const char *summary;
};
extern const struct ad_route ad_routes[];
/* The route of a host-routed port (PORT-ID.localhost): the proxy, any method. */
extern const struct ad_route ad_port_route;
extern const size_t ad_nroutes;

#define AD_PARAMS_MAX 2
struct ad_req {
    const struct ad_route *route;
    char params[AD_PARAMS_MAX][128];
    char owner[40];
    struct ad_limits lim;
    bool is_unix;
    /* body */
    char *body;
    size_t body_len;
    bool body_over;
    int spool_fd;
    uint64_t spool_len;
    uint64_t spool_held; /* bytes of the spool's bounds this upload holds */
    bool spool_over;     /* the spool's bounds refused more */
    cJSON *json;
    struct ad_session *sess; /* resolved {id}, referenced */
    /* log */
    uint64_t start_ms;
    unsigned status;
    char method[8];
    bool started;
    /* a proxied request (ports.c): the path past the route's pattern, from the url */
    const char *tail;
    bool host_routed;    /* reached as PORT-ID.localhost */
    char port_token[80]; /* signed in by the link's token: the cookie to set */
    struct ad_ws *ws;    /* a WebSocket upgrade answered, not yet upgraded (ports.c) */
    struct oi_conn *oi;  /* the same on the Open Interpreter listener (oi.c) */
    bool upgraded;       /* it was: the connection is the relay's */
};

/* The spool (http.c): every byte airlockd writes to its disk for a request is held against
 * spool_max_bytes (all requests) and twice the key's max_upload_bytes (each key) first. Raises
 * what q holds to want bytes in all (its body, copies made of it, a download's file), released
 * when the request ends; false when a bound says no (ad_spool_full_why says so). */
bool ad_spool_reserve(struct ad_req *q, uint64_t want);
void ad_spool_full_why(char *why, size_t len);
/* Before a file of q's session is copied to the spool for a download: its size (the guest's
 * stat, at most max_upload_bytes) held, and the copy's bound in *max. -ENOSPC when the spool
 * has no room; the stat's error otherwise. */
int ad_spool_download(struct ad_req *q, const char *guest_path, uint64_t *max, al_error *err);

extern struct ad_config ad_cfg;

/* ---- Open Interpreter's server protocol (oi.c), on oi_listen ---- */

/* Routes and authenticates a request of that listener (*ok: go on as ours do). */
enum MHD_Result ad_oi_route(struct MHD_Connection *c, struct ad_req *q, const char *url,
                            const char *method, bool *ok);
/* A WebSocket answered but never upgraded (the request's end). */
void ad_oi_done(struct oi_conn *k);
/* Closes every connection (their sessions end) and refuses new ones. */
void ad_oi_shutdown(void);

enum MHD_Result ad_reply_json(struct MHD_Connection *c, struct ad_req *q, unsigned status,
                              cJSON *body);
enum MHD_Result ad_reply_error(struct MHD_Connection *c, struct ad_req *q, unsigned status,
                               const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* Adds s as a JSON string of valid UTF-8: each byte not part of a well-formed sequence (a guest's
 * file name, a guest's error text) becomes U+FFFD. True when one did. */
bool ad_json_add_text(cJSON *o, const char *key, const char *s);
/* len bytes as base64 (malloc'd, NUL-terminated), or NULL when out of memory. */
char *ad_base64(const void *data, size_t len);
/* bytes (at most 64) random bytes as lowercase hex into out (2 * bytes + 1 long); -EIO (out "")
 * when the random source fails. */
int ad_random_hex(char *out, size_t bytes);
/* Standard base64 decoded (malloc'd, *len bytes), or NULL when it is not base64. */
uint8_t *ad_base64_decode(const char *b64, size_t *len);
enum MHD_Result ad_reply_fail(struct MHD_Connection *c, struct ad_req *q, const struct ad_fail *f);
enum MHD_Result ad_reply(struct MHD_Connection *c, struct ad_req *q, unsigned status,
                         struct MHD_Response *r);
/* A library error as an API error: status and code by errno. */
void ad_fail_from(struct ad_fail *f, int r, const al_error *err);
void ad_failf(struct ad_fail *f, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ports.c: the request q (its session resolved) to port of its session, path (with query) as
 * the guest's service gets it; host_routed: reached as PORT-ID.localhost (its own origin). */
/* The request of a WebSocket upgrade ended without the upgrade: ws (NULL: none) is freed. */
void ad_port_ws_done(struct ad_ws *ws);
/* Upgrade: websocket, with the upgrade token in Connection (RFC 6455 4.1). */
bool ad_wants_websocket(struct MHD_Connection *c);
/* A browser's upgrade (it sends Origin) comes from the origin it goes to: another site's page,
 * or a guest's page sandboxed on the daemon's origin ("null"), never rides the user's cookie
 * nor drives a key's sandbox from the user's browser. True without Origin (not a browser). */
bool ad_same_origin(struct MHD_Connection *c);
/* Ends every proxied request and WebSocket (before the HTTP server stops). */
void ad_ports_shutdown(void);
enum MHD_Result ad_port_proxy(struct MHD_Connection *c, struct ad_req *q, unsigned port,
                              const char *path, bool host_routed);
/* The request q (an upgrade to AD_TCP_UPGRADE, not a browser's) becomes a byte stream to port
 * of its session: airlock port's forwarding of an airlockd session. */
#define AD_TCP_UPGRADE "airlock-tcp"
enum MHD_Result ad_port_tcp(struct MHD_Connection *c, struct ad_req *q, unsigned port);

/* ---- MCP (mcp.c): the MCP server at /mcp, one per owner ---- */

enum MHD_Result ad_mcp_route(struct MHD_Connection *c, struct ad_req *q);
/* Ends every owner's MCP server and its sessions (before the HTTP server stops). */
void ad_mcp_shutdown(void);

/* A Host (or an Origin's host) naming this machine: localhost, 127.0.0.1 or [::1], with or
 * without a port; NULL counts as one (no header). */
bool ad_loopback_host(const char *h);
int ad_http_start(char *why, size_t len);
void ad_http_stop(void);

/* ---- metrics (metrics.c): relaxed atomics, read without a lock by GET /metrics ---- */

enum ad_run_kind { AD_RUN_COMMAND, AD_RUN_CODE, AD_RUN_KERNEL };
void ad_metrics_request(const struct ad_route *route, unsigned status, uint64_t ms);
/* An error reply with this JSON error code. */
void ad_metrics_error(const char *code);
void ad_metrics_booting(int delta);
/* A session open ended: ok, and whether it was restored (a warm start) or booted cold. */
void ad_metrics_boot(bool ok, bool restored, uint64_t ms);
void ad_metrics_closing(void);
void ad_metrics_closed(uint64_t ms);
void ad_metrics_run_start(enum ad_run_kind kind);
void ad_metrics_run_end(bool error, uint64_t ms);
/* The pool reports its depth per image through this: fn calls line once per image. */
typedef void (*ad_pool_depth_fn)(void *ctx,
                                 void (*line)(void *out, const char *image, unsigned depth),
                                 void *out);
void ad_metrics_pool_hook(ad_pool_depth_fn fn, void *ctx);
/* The whole exposition, malloc'd; NULL when out of memory. */
char *ad_metrics_text(size_t *len);

/* The route table as text (airlockd routes): "METHOD PATTERN" lines. */
void ad_routes_print(void);

#endif

/* The Model Context Protocol server (docs/MCP.md): JSON-RPC 2.0 messages in, answers out, the
 * sandbox's tools (sessions, code, processes, files, checkpoints) behind them. It knows no
 * transport: `airlock mcp` feeds it lines of stdio (cli/cli_mcp.c); a server over HTTP feeds it
 * request bodies. Every session it opens belongs to the al_mcp object and goes with it.
 *
 * Light methods (initialize, ping, tools/list, server/discover) answer at once from memory, on
 * the caller's thread; a tools/call runs on a worker thread of its own, so a client may have many
 * calls in flight, cancel one (notifications/cancelled) and get progress for one (a
 * progressToken in its _meta). */
#ifndef AL_MCP_H
#define AL_MCP_H

#include <stdbool.h>
#include <stddef.h>

#include "airlock.h"
#include "airlock/policy.h"
#include "airlock/text.h"

/* The protocol versions it speaks, newest first (the initialize generation). */
#define AL_MCP_VERSIONS                                                                            \
    {                                                                                              \
        "2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"                                     \
    }
#define AL_MCP_VERSION_LATEST "2025-11-25"

/* Bounds. A message is one line of JSON: 16 MiB holds a write_file of 10 MiB in base64. */
#define AL_MCP_MESSAGE_MAX (16u << 20)
#define AL_MCP_CALLS_MAX 64       /* tools/call in flight at once (the agent link's 64) */
#define AL_MCP_FORK_MAX 16        /* fork_session's count at most */
#define AL_MCP_SESSIONS_DEFAULT 8 /* sessions of one client at once */
#define AL_MCP_SESSIONS_MAX 64    /* what sessions_max may be (a host's quotas may be lower) */
#define AL_MCP_RUNS_MAX 64        /* runs and processes one session keeps (oldest ended go) */

typedef struct al_mcp al_mcp;

/* Where a message goes: json is one compact JSON-RPC message, without a newline; final is true
 * for the answer to a request (false for a notification sent while it runs). Called from any of
 * the server's threads, one call at a time. */
typedef void (*al_mcp_send_fn)(void *ctx, const char *json, bool final);

typedef struct al_mcp_opts {
    const char *connect_uri; /* libvirt URI; NULL: the library's default */
    const char *image;       /* start_session's default image; NULL: al_image_default() */
    unsigned sessions_max;   /* 0: AL_MCP_SESSIONS_DEFAULT */
    unsigned memory_max_mib; /* what start_session may ask; 0: 4096 */
    unsigned vcpus_max;      /* 0: 4 */
    unsigned lifetime_max_s; /* 0: none; else every session's lifetime is at most this */
    unsigned idle_max_s;     /* 0: none; else a session no call has used this long ends */
    bool network;            /* start_session may give a session network (an allowlist) */
    /* One line (no newline) for the operator's log, from any thread; NULL: none. */
    void (*log)(void *ctx, const char *line);
    void *log_ctx;
    /* The image start_session asked for, as the caller's owner may have it (into buf), or NULL
     * when it is not there for that owner ("unknown image"); NULL: every image is. */
    const char *(*image_for)(void *ctx, const char *name, char *buf, size_t len);
    void *image_ctx;
    /* Where start_session's sessions come from and go back to, where not NULL (airlockd: its
     * registry, so that they are its owner's like every other, listed, counted against its
     * quotas and reaped by its rules): open boots one from o and hands back the session and the
     * host's handle for it (-errno and err on failure: err names the limit); touch says a call
     * used it; ending says whether the host is ending it already; close gives it back (its VM
     * goes). A session the host ends itself is told with al_mcp_session_ended. NULL:
     * al_session_open and al_session_close. With fork, a fork of that save (fork_session,
     * al_fork_open) rather than a boot; with snapshot, a session from the caller's snapshot of
     * that name (start_session's snapshot). */
    int (*session_open)(void *ctx, const al_session_opts *o, const al_fork *fork,
                        const char *snapshot, al_session **s, void **handle, al_error *err);
    void (*session_touch)(void *ctx, void *handle);
    bool (*session_ending)(void *ctx, void *handle);
    void (*session_close)(void *ctx, void *handle);
    void *session_ctx;
    /* The caller's snapshots (snapshot_session, list_snapshots, delete_snapshot; names as the
     * caller gives them), where not NULL (airlockd: the owner's, within its quotas), with
     * session_ctx; save gets the session's handle. NULL: the library's, named as airlockd names
     * the snapshots of this process's user ("uid-UID_NAME"). */
    int (*snapshot_save)(void *ctx, void *handle, al_session *s, const char *name, bool replace,
                         al_snapshot_info *out, al_error *err);
    void (*snapshot_list)(void *ctx, void (*fn)(void *fctx, const al_snapshot_info *si),
                          void *fctx);
    int (*snapshot_remove)(void *ctx, const char *name, al_error *err);
} al_mcp_opts;

int al_mcp_new(const al_mcp_opts *o, al_mcp **out, al_error *err);
/* The host ended the session of handle (al_mcp_opts.session_open's) itself: its calls fail, it
 * is no longer found, and it is given back (session_close) once no call holds it. */
void al_mcp_session_ended(al_mcp *m, void *handle);
/* One message as received: a request, a notification, a response or a batch of them. Answers go
 * to send(ctx), now or later from a worker thread; ctx stays the caller's until every request of
 * the message has had its final answer, or al_mcp_free returned. Returns how many final answers
 * the message gets (some may have been sent already): 0 for notifications and responses alone.
 * A request cancelled by notifications/cancelled gets none: its count is given back by a final
 * call of send with json NULL. */
unsigned al_mcp_message(al_mcp *m, const char *text, size_t len, al_mcp_send_fn send, void *ctx);
/* Calls that have not had their answer yet. */
unsigned al_mcp_pending(al_mcp *m);
/* Ends every run, closes every session (their VMs go), waits for the workers; answers still due
 * are not sent. Safe on NULL. */
void al_mcp_free(al_mcp *m);

#endif

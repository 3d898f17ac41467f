/* The link to the agent: a transport's connection with the session's channel on it, the
 * handshake, requests' ids and frames, and the resync after a checkpoint restore. The same for
 * every transport; session.c, checkpoint.c, exec.c and files.c use it, and it calls none of
 * them. */
#ifndef AIRLOCK_LINK_H
#define AIRLOCK_LINK_H

#include "session.h"

/* Connects to the agent through the session's transport before deadline and sets up s->ch on
 * the connection (its cancel pipe wakes a waiting write, its disk budget watcher fails a
 * waiting read). Any earlier connection is dropped first. */
int al_link_connect(al_session *s, uint64_t deadline, al_error *err);
/* Drops the connection and the channel on it, if any. */
void al_link_detach(al_session *s);
/* Sends HELLO and waits for the HELLO_ACK until deadline (a boot's: its timeout says so). */
int al_link_handshake(al_session *s, uint64_t deadline, al_error *err);
/* The handshake in two steps, for a boot that watches the domain between waits: a HELLO with
 * a fresh random nonce (into *nonce), then the wait for its HELLO_ACK until deadline: -ETIMEDOUT
 * with err untouched when the deadline passed. */
int al_link_send_hello(al_session *s, uint64_t *nonce, al_error *err);
int al_link_hello_wait(al_session *s, uint64_t nonce, uint64_t deadline, al_error *err);
/* After a checkpoint restore: the handshake again with whatever agent the VM now holds, within
 * total_ms, over a new connection where the old one cannot serve (see guest_side in
 * transport/transport.h). */
int al_link_resync(al_session *s, unsigned total_ms, al_error *err);

/* Before a request: refuses a session whose guest broke the protocol or whose disk budget
 * paused it; reconnects (with backoff) when the transport lost its connection. */
int al_link_ready(al_session *s, al_error *err);
int al_link_next_id(al_session *s);

/* Many requests at once (link.c, "many requests at once"): each request in flight is begun
 * (its id, its signal pipe: cancel_fd when > 0, else the session's) and ended on every path;
 * its frames reach only its own al_link_recv. At most AL_LINK_REQUESTS_MAX at once, as many as
 * the agent runs (its AGENT_REQ_MAX). */
#define AL_LINK_REQUESTS_MAX 64
struct al_link_mux *al_link_mux_new(void);
void al_link_mux_free(struct al_link_mux *x);
int al_link_begin(al_session *s, int cancel_fd, uint32_t *id, al_error *err);
void al_link_end(al_session *s, uint32_t id);
/* Request id (begun) runs in turn with the others queued under key: waits until those before it
 * ended, telling on_wait (when not NULL) how many are ahead as it takes its place, each time
 * that changes, and 0 once its turn came when it had to wait. -EBUSY at
 * once when more than max are in the line, naming what ("the python kernel"); -ECANCELED when
 * its cancel fd speaks while it waits (it never runs); its failure (the session ending). */
int al_link_queue(al_session *s, uint32_t id, const char *key, unsigned max, const char *what,
                  void (*on_wait)(void *ctx, unsigned ahead), void *ctx, al_error *err);
/* Takes over run id, which the agent handed over at the handshake (AL_HELLO_ADOPT, listed in
 * s->adopted): it is then this caller's as if begun here; -ENOENT when it was not handed over
 * or is taken already. */
int al_link_claim(al_session *s, uint32_t id, int cancel_fd, al_error *err);
/* Forgets the runs handed over and not claimed (a pause: the agent keeps them, and hands them
 * over again at the resume). */
void al_link_drop_unclaimed(al_session *s);
/* The signal pipe of request id. */
int al_link_cancel_fd(al_session *s, uint32_t id);
/* The channel alone, for what talks to the agent outside any request (a checkpoint's barrier, a
 * restore's handshake, a reconnect): waits up to wait_ms for the requests in flight to end
 * (-EBUSY after that), and holds new ones back until al_link_exclusive_end. */
int al_link_exclusive(al_session *s, unsigned wait_ms, al_error *err);
void al_link_exclusive_end(al_session *s);
/* Every request in flight fails with code and msg (the session was poisoned or restored). */
void al_link_fail_all(al_session *s, int code, const char *msg);
/* Returns r; when r says the guest broke the protocol (-EPROTO, or -EMSGSIZE for data past a
 * cap), the session takes no more requests until a checkpoint restore: its agent is not ours. */
int al_link_check(al_session *s, int r, const al_error *err);
/* A frame that is not the one awaited: the agent's protocol error (id 0) fails; a late frame of a
 * request that already ended (or was abandoned) is dropped (0: read on); anything else is the
 * guest speaking out of turn: -EPROTO, "guest sent a TYPE frame " and when (NULL: "for unknown
 * request ID"). */
int al_link_stray_frame(al_session *s, const struct al_msg *m, const char *when, al_error *err);
/* The next frame for request id (begun), dropping late frames of finished requests. 0 when its
 * signal pipe or extra_fd became readable. */
int al_link_recv(al_session *s, uint32_t id, struct al_msg *m, int extra_fd, al_error *err);
/* The same with a second fd that wakes it (a pty run's resizes) and a deadline of the caller's
 * (0: none): -ETIMEDOUT with err untouched when it passes before the session's lifetime ends. */
int al_link_recv_until(al_session *s, uint32_t id, struct al_msg *m, int extra_fd, int extra2_fd,
                       uint64_t deadline, al_error *err);
/* Waits until fd takes bytes (0) or request id's signal pipe is readable (1), or fails as the
 * request fails (the session ended, the channel broke): a writer to a host-side reader that
 * stopped reading is never stuck past its session. */
int al_link_wait_writable(al_session *s, uint32_t id, int fd, al_error *err);

/* -ENOSPC once the disk budget's watcher (vm/budget.c) paused the VM: every request asks first
 * (al_link_ready), and so does a checkpoint. */
int al_budget_refuse(const al_session *s, al_error *err);

#endif

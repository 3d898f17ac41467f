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
/* Returns r; when r says the guest broke the protocol (-EPROTO, or -EMSGSIZE for data past a
 * cap), the session takes no more requests until a checkpoint restore: its agent is not ours. */
int al_link_check(al_session *s, int r, const al_error *err);
/* A frame that is not the one awaited: the agent's protocol error (id 0) fails; a late frame of a
 * request that already ended (or was abandoned) is dropped (0: read on); anything else is the
 * guest speaking out of turn: -EPROTO, "guest sent a TYPE frame " and when (NULL: "for unknown
 * request ID"). */
int al_link_stray_frame(al_session *s, const struct al_msg *m, const char *when, al_error *err);
/* The next frame for request id, dropping late frames of finished requests. 0 when cancel_fd
 * or extra_fd became readable. */
int al_link_recv(al_session *s, uint32_t id, struct al_msg *m, int extra_fd, al_error *err);
/* The same with a deadline of the caller's (0: none): -ETIMEDOUT with err untouched when it
 * passes before the session's lifetime ends. */
int al_link_recv_until(al_session *s, uint32_t id, struct al_msg *m, int extra_fd,
                       uint64_t deadline, al_error *err);

#endif

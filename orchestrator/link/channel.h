/* The channel (link/channel.c): frames over a connected socket to the agent, each send and
 * receive with a deadline; no libvirt. What link.c builds the link on. */
#ifndef AIRLOCK_CHANNEL_H
#define AIRLOCK_CHANNEL_H

#include "airlock-proto.h"
#include "airlock.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

struct al_channel {
    int fd;
    unsigned stall_ms; /* a frame half-received longer than this fails */
    struct al_decoder dec;
    uint8_t *rbuf;         /* AL_FRAME_HEADER_SIZE + AL_FRAME_PAYLOAD_MAX */
    uint8_t *wbuf;         /* the same size, for encoding */
    const char *eof_msg;   /* what the end of the stream means on this transport, or NULL */
    int wake_fd;           /* -1, or the session's cancel pipe: also watched while a write
                              waits for the guest to read */
    int pending_sig;       /* SIGINT/SIGQUIT read from wake_fd during a write, to forward */
    bool broken;           /* a write was abandoned mid-frame: nothing more can be sent */
    int alarm_fd;          /* -1, or readable once the session must stop (its disk budget) */
    const char *alarm_msg; /* why, for the error */
    pthread_mutex_t wlock; /* one frame at a time onto the channel (requests run at once) */
};

/* Takes fd (made non-blocking: every write has a deadline, stall_ms without progress, and ends
 * early when wake_fd delivers a signal other than SIGINT/SIGQUIT). */
int al_channel_init(struct al_channel *ch, int fd, unsigned stall_ms, int wake_fd, al_error *err);
void al_channel_destroy(struct al_channel *ch);
int al_channel_send(struct al_channel *ch, const struct al_msg *m, al_error *err);
int al_channel_send_data(struct al_channel *ch, uint32_t id, uint8_t stream, uint8_t flags,
                         const void *data, size_t len, al_error *err);
/* Waits for one frame until deadline_ms (monotonic; 0: forever). Also wakes when wake_fd
 * (if >= 0) is readable. Returns 1 with *m set, 0 when woken by wake_fd, extra_fd, extra2_fd or
 * kick_fd, -ETIMEDOUT at the deadline, other negatives on failure. extra_fd, extra2_fd and
 * kick_fd (if >= 0) are polled for POLLIN too. */
int al_channel_recv(struct al_channel *ch, struct al_msg *m, uint64_t deadline_ms, int wake_fd,
                    int extra_fd, int extra2_fd, int kick_fd, al_error *err);
/* Sends a small frame only if it goes at once (-EAGAIN otherwise: nothing was sent, unless half
 * of it, which leaves the channel unusable): a kill on the way out of a cancelled request. */
int al_channel_send_nowait(struct al_channel *ch, const struct al_msg *m);
/* Describes an AL_ERROR frame from the guest into err and returns a matching negative errno. */
int al_channel_guest_error(const struct al_msg *m, const char *what, al_error *err);
/* Forgets every byte received and not yet decoded, and whatever the socket holds right now:
 * after a snapshot restore these come from the guest's abandoned future. */
void al_channel_discard(struct al_channel *ch);

#endif

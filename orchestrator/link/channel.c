/* The host end of the agent channel: whole frames in and out of a socket, with every byte
 * from the guest decoded under the protocol's bounds. */
#include "channel.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define CHANNEL_BUF (AL_FRAME_HEADER_SIZE + AL_FRAME_PAYLOAD_MAX)

int al_channel_init(struct al_channel *ch, int fd, unsigned stall_ms, int wake_fd, al_error *err)
{
    memset(ch, 0, sizeof(*ch));
    ch->fd = -1;
    ch->wake_fd = wake_fd;
    ch->alarm_fd = -1;
    ch->rbuf = malloc(CHANNEL_BUF);
    ch->wbuf = malloc(CHANNEL_BUF);
    int fl = fcntl(fd, F_GETFL);
    if (!ch->rbuf || !ch->wbuf || fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        free(ch->rbuf);
        free(ch->wbuf);
        return al_err(err, -ENOMEM, "cannot set up the guest channel");
    }
    al_decoder_init(&ch->dec, ch->rbuf, CHANNEL_BUF);
    ch->fd = fd;
    ch->stall_ms = stall_ms ? stall_ms : 10000;
    pthread_mutex_init(&ch->wlock, NULL);
    return 0;
}

void al_channel_destroy(struct al_channel *ch)
{
    if (ch->rbuf)
        pthread_mutex_destroy(&ch->wlock);
    al_closep(&ch->fd);
    ch->fd = -1;
    free(ch->rbuf);
    free(ch->wbuf);
    ch->rbuf = ch->wbuf = NULL;
}

/* A guest that stops reading (a stopped or hijacked agent) must not hang us: the socket is
 * non-blocking, each wait for room is bounded by stall_ms without progress, and a signal on the
 * wake pipe (SIGTERM, a second Ctrl-C) ends it at once; SIGINT/SIGQUIT are kept for the caller
 * to forward. A frame abandoned half-written leaves the channel unusable. */
static int write_all(struct al_channel *ch, const void *buf, size_t len, al_error *err)
{
    if (ch->broken)
        return al_err(err, -EPIPE, "the guest channel is unusable after an abandoned write");
    const uint8_t *p = buf;
    size_t total = len;
    uint64_t since = al_now_ms();
    while (len) {
        ssize_t n = send(ch->fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN) {
            uint64_t now = al_now_ms();
            if (now - since >= ch->stall_ms) {
                ch->broken = len != total;
                return al_err(err, -ETIMEDOUT, "the guest stopped reading its channel for %u s",
                              ch->stall_ms / 1000);
            }
            struct pollfd pfd[2] = {{ch->fd, POLLOUT, 0}, {ch->wake_fd, POLLIN, 0}};
            int r = poll(pfd, ch->wake_fd >= 0 && !ch->pending_sig ? 2 : 1,
                         (int)(ch->stall_ms - (now - since)));
            if (r < 0 && errno != EINTR)
                return al_err(err, -errno, "poll failed: %s", strerror(errno));
            if (r > 0 && pfd[1].revents) {
                uint8_t sig = 0;
                if (read(ch->wake_fd, &sig, 1) == 1) {
                    if (sig == SIGINT || sig == SIGQUIT) {
                        ch->pending_sig = sig;
                    } else {
                        ch->broken = len != total;
                        return al_err(err, -ECANCELED, "cancelled by signal %u", sig);
                    }
                }
            }
            continue;
        }
        if (n < 0) {
            ch->broken = len != total;
            return al_err(err, -errno, "cannot write to the guest channel: %s", strerror(errno));
        }
        p += n;
        len -= (size_t)n;
        since = al_now_ms();
    }
    return 0;
}

int al_channel_send(struct al_channel *ch, const struct al_msg *m, al_error *err)
{
    pthread_mutex_lock(&ch->wlock);
    int n = al_msg_encode(m, ch->wbuf, CHANNEL_BUF);
    int r = n < 0
                ? al_err(err, n, "cannot encode %s frame: %s", al_type_name(m->type), strerror(-n))
                : write_all(ch, ch->wbuf, (size_t)n, err);
    pthread_mutex_unlock(&ch->wlock);
    return r;
}

int al_channel_send_data(struct al_channel *ch, uint32_t id, uint8_t stream, uint8_t flags,
                         const void *data, size_t len, al_error *err)
{
    if (len > AL_DATA_CHUNK_MAX)
        return al_err(err, -EMSGSIZE, "data chunk too large");
    pthread_mutex_lock(&ch->wlock);
    al_data_header(ch->wbuf, id, stream, flags, (uint32_t)len);
    if (len)
        memcpy(ch->wbuf + AL_FRAME_HEADER_SIZE + 1, data, len);
    int r = write_all(ch, ch->wbuf, AL_FRAME_HEADER_SIZE + 1 + len, err);
    pthread_mutex_unlock(&ch->wlock);
    return r;
}

int al_channel_send_nowait(struct al_channel *ch, const struct al_msg *m)
{
    uint8_t buf[256];
    int n = al_msg_encode(m, buf, sizeof(buf));
    if (n < 0)
        return n;
    if (pthread_mutex_trylock(&ch->wlock))
        return -EAGAIN;
    ssize_t w = ch->broken ? -1 : send(ch->fd, buf, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
    int r = w == n ? 0 : -EAGAIN;
    if (w > 0 && w < n)
        ch->broken = true; /* half a frame: nothing more can follow */
    pthread_mutex_unlock(&ch->wlock);
    return r;
}

int al_channel_recv(struct al_channel *ch, struct al_msg *m, uint64_t deadline_ms, int wake_fd,
                    int extra_fd, int extra2_fd, int kick_fd, al_error *err)
{
    uint64_t partial_since = 0;
    for (;;) {
        const char *why = NULL;
        int r = al_decoder_next(&ch->dec, m, &why);
        if (r < 0)
            return al_err(err, -EPROTO, "guest sent a malformed frame: %s", why);
        if (r == 1)
            return 1;

        uint64_t now = al_now_ms();
        if (al_decoder_partial(&ch->dec)) {
            if (!partial_since)
                partial_since = now;
            else if (now - partial_since >= ch->stall_ms)
                return al_err(err, -ETIMEDOUT, "guest stalled in the middle of a frame");
        } else {
            partial_since = 0;
        }
        int timeout = -1;
        if (deadline_ms) {
            if (now >= deadline_ms)
                return -ETIMEDOUT;
            timeout = (int)(deadline_ms - now);
        }
        if (partial_since) {
            int left = (int)(partial_since + ch->stall_ms - now);
            if (timeout < 0 || left < timeout)
                timeout = left;
        }
        struct pollfd pfd[6] = {{ch->fd, POLLIN, 0},   {wake_fd, POLLIN, 0},
                                {extra_fd, POLLIN, 0}, {ch->alarm_fd, POLLIN, 0},
                                {kick_fd, POLLIN, 0},  {extra2_fd, POLLIN, 0}};
        int pr = poll(pfd, 6, timeout);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr < 0)
            return al_err(err, -errno, "poll failed: %s", strerror(errno));
        if (pfd[3].revents)
            return al_err(err, -ENOSPC, "%s", ch->alarm_msg ? ch->alarm_msg : "session stopped");
        if (pfd[1].revents || pfd[2].revents || pfd[4].revents || pfd[5].revents)
            return 0;
        if (!pfd[0].revents)
            continue;
        size_t avail;
        uint8_t *space = al_decoder_space(&ch->dec, &avail);
        ssize_t n = recv(ch->fd, space, avail, MSG_DONTWAIT);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n < 0)
            return al_err(err, -errno, "cannot read the guest channel: %s", strerror(errno));
        if (n == 0 && ch->eof_msg)
            return al_err(err, -ECONNRESET, "%s", ch->eof_msg);
        if (n == 0)
            return al_err(err, -ECONNRESET,
                          al_decoder_partial(&ch->dec)
                              ? "guest channel closed in the middle of a frame"
                              : "guest channel closed (agent or VM gone)");
        al_decoder_commit(&ch->dec, (size_t)n);
    }
}

int al_channel_guest_error(const struct al_msg *m, const char *what, al_error *err)
{
    static const int codes[] = {
        [AL_ERR_PROTOCOL] = EPROTO, [AL_ERR_NOT_FOUND] = ENOENT,    [AL_ERR_PERMISSION] = EACCES,
        [AL_ERR_INVALID] = EINVAL,  [AL_ERR_LIMIT] = ENOSPC,        [AL_ERR_IO] = EIO,
        [AL_ERR_INTERNAL] = EFAULT, [AL_ERR_UNSUPPORTED] = ENOTSUP,
    };
    /* klass was range-checked by the decoder */
    int code = codes[m->u.error.klass];
    if (code == EINVAL && m->u.error.err == EISDIR)
        code = EISDIR; /* a copy's target is a directory: al_file_put copies into it */
    /* The agent's message often begins with the path (cut to its length): say it once, ours. */
    const char *t = m->u.error.message.p;
    size_t len = m->u.error.message.len, n = strlen(what);
    const char *colon = memmem(t, len, ": ", 2);
    size_t head = colon ? (size_t)(colon - t) : 0;
    if (head && head <= n && !memcmp(t, what, head)) {
        t += head + 2;
        len -= head + 2;
    } else if (n && len > n + 2 && !memcmp(t + len - n, what, n) &&
               !memcmp(t + len - n - 2, ": ", 2)) {
        len -= n + 2; /* "command not found: NAME" after our "NAME: " */
    }
    /* "No space left" from the guest is the guest's disk or its memory-backed /tmp, never the
     * host's (whose own limits say so in words of their own, budget.c). */
    return al_err(err, -code, "%s: %.*s%s", what, (int)len, t,
                  m->u.error.err == ENOSPC ? " (in the guest: its disk, or /tmp, which is in its "
                                             "memory, is full)"
                                           : "");
}

void al_channel_discard(struct al_channel *ch)
{
    uint8_t sink[4096];
    while (recv(ch->fd, sink, sizeof(sink), MSG_DONTWAIT) > 0)
        ;
    al_decoder_init(&ch->dec, ch->rbuf, CHANNEL_BUF);
}

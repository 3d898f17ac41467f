/* Keeping a run's output for the integration drivers; see capture.h. */
#include "capture.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int capture_output(void *ctx, int stream, const uint8_t *data, size_t len)
{
    struct capture *c = ctx;
    if (stream < 1 || stream > 2)
        return 0;
    size_t room = CAPTURE_MAX - c->len[stream];
    if (len > room)
        len = room;
    char *p = realloc(c->buf[stream], c->len[stream] + len + 1);
    if (!p)
        return -ENOMEM;
    memcpy(p + c->len[stream], data, len);
    c->len[stream] += len;
    p[c->len[stream]] = '\0';
    c->buf[stream] = p;
    return 0;
}

void capture_free(struct capture *c)
{
    for (int i = 0; i < 3; i++) {
        free(c->buf[i]);
        c->buf[i] = NULL;
        c->len[i] = 0;
    }
}

double capture_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

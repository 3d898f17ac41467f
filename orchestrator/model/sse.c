/* Server-Sent Events: the subset of the WHATWG event-stream grammar that model APIs use.
 *
 * Lines end with "\n", "\r\n" or "\r", and a feed may end anywhere, even between "\r" and
 * "\n". "data" lines are joined with "\n", "event" names the event, lines starting with ':' are
 * comments (keep-alives), "id" is kept (al_sse_last_id), "retry" is ignored, a blank line
 * dispatches the event. Memory grows geometrically (never per byte) and is bounded by
 * AL_SSE_EVENT_MAX. */
#include "model-internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct al_sse {
    al_sse_event_fn fn;
    void *ctx;
    struct al_buf line;  /* the line being received, without its terminator */
    struct al_buf data;  /* the event's data lines so far, joined by '\n' */
    struct al_buf event; /* the event's name; empty: "message" */
    bool has_data;       /* a data line was seen (data may still be empty) */
    char last_id[64];    /* the last "id" field's value (kept across events, as the spec says) */
    bool skip_lf;        /* the last line ended with '\r': a '\n' right after belongs to it */
    int failed;          /* sticky: the error or callback value that stopped the parser */
};

al_sse *al_sse_new(al_sse_event_fn fn, void *ctx)
{
    al_sse *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->fn = fn;
    p->ctx = ctx;
    return p;
}

void al_sse_free(al_sse *p)
{
    if (!p)
        return;
    al_buf_free(&p->line);
    al_buf_free(&p->data);
    al_buf_free(&p->event);
    free(p);
}

static int dispatch(al_sse *p)
{
    int r = 0;
    /* A blank line with no data line before it dispatches nothing (the spec's rule). */
    if (p->has_data) {
        const char *event = p->event.len ? p->event.p : "message";
        r = p->fn(p->ctx, event, p->data.len ? p->data.p : "", p->data.len);
    }
    p->data.len = 0;
    p->event.len = 0;
    p->has_data = false;
    return r;
}

static int field(al_sse *p, const char *name, size_t nlen, const char *value, size_t vlen)
{
    if (nlen == 4 && memcmp(name, "data", 4) == 0) {
        size_t add = vlen + (p->has_data ? 1 : 0);
        if (p->data.len + add > AL_SSE_EVENT_MAX)
            return -EMSGSIZE;
        if (p->has_data && al_buf_add(&p->data, "\n", 1) < 0)
            return -ENOMEM;
        if (al_buf_add(&p->data, value, vlen) < 0)
            return -ENOMEM;
        p->has_data = true;
    } else if (nlen == 5 && memcmp(name, "event", 5) == 0) {
        p->event.len = 0;
        if (al_buf_add(&p->event, value, vlen) < 0)
            return -ENOMEM;
    } else if (nlen == 2 && memcmp(name, "id", 2) == 0 && vlen < sizeof(p->last_id) &&
               !memchr(value, '\0',
                       vlen)) { /* the spec ignores an id with a NUL; ours, a long one */
        memcpy(p->last_id, value, vlen);
        p->last_id[vlen] = '\0';
    }
    return 0;
}

const char *al_sse_last_id(const al_sse *p)
{
    return p->last_id;
}

static int line(al_sse *p, const char *s, size_t len)
{
    if (len == 0)
        return dispatch(p);
    if (s[0] == ':')
        return 0; /* a comment: servers send these as keep-alives */
    const char *colon = memchr(s, ':', len);
    if (!colon)
        return field(p, s, len, "", 0);
    size_t nlen = (size_t)(colon - s);
    const char *v = colon + 1;
    size_t vlen = len - nlen - 1;
    if (vlen && *v == ' ') {
        v++;
        vlen--;
    }
    return field(p, s, nlen, v, vlen);
}

int al_sse_feed(al_sse *p, const char *buf, size_t len)
{
    if (p->failed)
        return p->failed;
    size_t i = 0;
    while (i < len) {
        if (p->skip_lf) {
            p->skip_lf = false;
            if (buf[i] == '\n') {
                i++;
                continue;
            }
        }
        /* The run of bytes up to the next terminator, copied at once. */
        size_t j = i;
        while (j < len && buf[j] != '\n' && buf[j] != '\r')
            j++;
        if (p->line.len + (j - i) > AL_SSE_LINE_MAX) {
            p->failed = -EMSGSIZE;
            return p->failed;
        }
        if (j == len) {
            if (al_buf_add(&p->line, buf + i, j - i) < 0)
                return p->failed = -ENOMEM;
            break;
        }
        int r;
        if (p->line.len == 0) {
            r = line(p, buf + i, j - i); /* the whole line is in this feed: no copy */
        } else if (al_buf_add(&p->line, buf + i, j - i) < 0) {
            r = -ENOMEM;
        } else {
            r = line(p, p->line.p, p->line.len);
            p->line.len = 0;
        }
        p->skip_lf = buf[j] == '\r';
        i = j + 1;
        if (r != 0) {
            p->failed = r;
            return r;
        }
    }
    return 0;
}

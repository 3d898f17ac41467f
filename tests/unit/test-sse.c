/* The SSE parser: every split of a stream gives the same events; line endings, comments,
 * multi-line data, event names, and the per-event limit at, below and above it. TAP output. */
#include "model-internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures, count;

__attribute__((format(printf, 2, 3))) static void ok(int cond, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("%sok %d - ", cond ? "" : "not ", ++count);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    if (!cond)
        failures++;
}

/* A TAP comment showing s with its line ends escaped. */
static void diag(const char *what, const char *s)
{
    printf("# %s: '", what);
    for (; *s; s++)
        printf(*s == '\n' ? "\\n" : *s == '\r' ? "\\r" : "%c", *s);
    printf("'\n");
}

/* The events seen, as "name=data|" strings, one after another. */
struct seen {
    struct al_buf log;
    size_t events;
    size_t last_len;
    int stop_after; /* return 7 from this event on (0: never) */
};

static int on_event(void *ctx, const char *event, const char *data, size_t len)
{
    struct seen *s = ctx;
    s->events++;
    s->last_len = len;
    if (data[len] != '\0')
        return -EFAULT; /* data is NUL-terminated for the JSON parser */
    if (len < 1000) {
        al_buf_add(&s->log, event, strlen(event));
        al_buf_add(&s->log, "=", 1);
        al_buf_add(&s->log, data, len);
        al_buf_add(&s->log, "|", 1);
    }
    if (s->stop_after && s->events >= (size_t)s->stop_after)
        return 7;
    return 0;
}

static int parse(const char *in, size_t len, const size_t *cuts, size_t ncuts, struct seen *s)
{
    al_sse *p = al_sse_new(on_event, s);
    if (!p)
        return -ENOMEM;
    size_t at = 0;
    int r = 0;
    for (size_t i = 0; i <= ncuts && r == 0; i++) {
        size_t end = i < ncuts ? cuts[i] : len;
        r = al_sse_feed(p, in + at, end - at);
        at = end;
    }
    al_sse_free(p);
    return r;
}

static const char *log_of(struct seen *s)
{
    return s->log.p ? s->log.p : "";
}

/* Parses in one piece, then split at every position, then at every pair of positions (short
 * inputs), byte by byte, and checks the events are always `want`. */
static void check_splits(const char *name, const char *in, const char *want)
{
    size_t len = strlen(in);
    struct seen s = {0};
    int r = parse(in, len, NULL, 0, &s);
    ok(r == 0 && strcmp(log_of(&s), want) == 0, "%s: whole", name);
    if (strcmp(log_of(&s), want) != 0)
        diag("got", log_of(&s));
    al_buf_free(&s.log);

    int bad = 0;
    for (size_t i = 0; i <= len; i++) {
        for (size_t j = i; j <= len; j++) {
            if (len > 80 && j != i)
                break;
            size_t cuts[2] = {i, j};
            struct seen t = {0};
            r = parse(in, len, cuts, 2, &t);
            if (r != 0 || strcmp(log_of(&t), want) != 0)
                bad++;
            al_buf_free(&t.log);
        }
    }
    ok(bad == 0, "%s: every split gives the same events (%d differ)", name, bad);

    al_sse *p = al_sse_new(on_event, &s);
    r = 0;
    for (size_t i = 0; i < len && r == 0; i++)
        r = al_sse_feed(p, in + i, 1);
    al_sse_free(p);
    ok(r == 0 && strcmp(log_of(&s), want) == 0, "%s: byte by byte", name);
    al_buf_free(&s.log);
}

/* One event of `n` data bytes, in one line or in `lines` lines. */
static char *big_event(size_t n, size_t lines, size_t *len)
{
    size_t per = n / lines; /* data bytes per line, the joins included */
    char *s = malloc(n + lines * 8 + 8);
    size_t at = 0, left = n;
    for (size_t l = 0; l < lines; l++) {
        size_t take = l + 1 == lines ? left : per - 1;
        memcpy(s + at, "data: ", 6);
        at += 6;
        memset(s + at, 'x', take);
        at += take;
        s[at++] = '\n';
        left -= take + (l + 1 == lines ? 0 : 1);
    }
    s[at++] = '\n';
    *len = at;
    return s;
}

static void check_limit(void)
{
    size_t sizes[3] = {AL_SSE_EVENT_MAX - 1, AL_SSE_EVENT_MAX, AL_SSE_EVENT_MAX + 1};
    for (int lines = 1; lines <= 4; lines += 3) {
        for (int i = 0; i < 3; i++) {
            size_t len;
            char *in = big_event(sizes[i], (size_t)lines, &len);
            struct seen s = {0};
            size_t cuts[2] = {len / 3, len / 2};
            int r = parse(in, len, cuts, 2, &s);
            if (i < 2)
                ok(r == 0 && s.events == 1 && s.last_len == sizes[i],
                   "%zu data bytes in %d line(s) pass (limit %s)", sizes[i], lines,
                   i ? "at" : "below");
            else
                ok(r == -EMSGSIZE && s.events == 0,
                   "%zu data bytes in %d line(s): -EMSGSIZE (above the limit)", sizes[i], lines);
            al_buf_free(&s.log);
            free(in);
        }
    }
    /* A line with no end at all is refused once past the line limit, however it is fed. */
    size_t n = AL_SSE_LINE_MAX + 1;
    char *junk = malloc(n);
    memset(junk, ':', n);
    struct seen s = {0};
    al_sse *p = al_sse_new(on_event, &s);
    int r = al_sse_feed(p, junk, AL_SSE_LINE_MAX);
    ok(r == 0, "a comment line of exactly the line limit is held");
    r = al_sse_feed(p, junk, 1);
    ok(r == -EMSGSIZE, "one byte more: -EMSGSIZE");
    r = al_sse_feed(p, "\n\ndata: x\n\n", 11);
    ok(r == -EMSGSIZE && s.events == 0, "the parser stays failed");
    al_sse_free(p);
    free(junk);
}

static void check_stop(void)
{
    const char *in = "data: 1\n\ndata: 2\n\ndata: 3\n\n";
    struct seen s = {.stop_after = 2};
    int r = parse(in, strlen(in), NULL, 0, &s);
    ok(r == 7 && s.events == 2, "a callback's non-zero value stops the feed and is returned");
    al_buf_free(&s.log);
}

int main(void)
{
    check_splits("LF", "data: hello\n\ndata: world\n\n", "message=hello|message=world|");
    check_splits("CRLF", "data: hello\r\n\r\ndata: world\r\n\r\n", "message=hello|message=world|");
    check_splits("CR", "data: hello\r\rdata: world\r\r", "message=hello|message=world|");
    check_splits("mixed endings", "data: a\r\n\rdata: b\n\r\ndata: c\r\r\n",
                 "message=a|message=b|message=c|");
    check_splits("multi-line data", "data: one\ndata: two\ndata:three\n\n",
                 "message=one\ntwo\nthree|");
    check_splits("comments and keep-alives",
                 ": keep-alive\n\n:\ndata: x\n: in the middle\ndata: y\n\n: ping\r\n\r\n",
                 "message=x\ny|");
    check_splits("event names",
                 "event: message_start\ndata: {}\n\nevent: ping\ndata: {\"type\": \"ping\"}\n\n"
                 "data: plain\n\n",
                 "message_start={}|ping={\"type\": \"ping\"}|message=plain|");
    check_splits("one space stripped", "data:  two spaces\ndata:none\ndata: \n\n",
                 "message= two spaces\nnone\n|");
    check_splits("field without colon", "data\ndata\n\nevent\ndata: x\n\n",
                 "message=\n|message=x|");
    check_splits("other fields ignored", "id: 7\nretry: 1000\nfoo: bar\ndata: x\n\n", "message=x|");
    check_splits("event without data is not dispatched", "event: ping\n\ndata: x\n\n",
                 "message=x|");
    check_splits("last event name wins", "event: a\nevent: b\ndata: x\n\n", "b=x|");
    check_splits("unfinished event is not dispatched", "data: x\n\ndata: y\n", "message=x|");
    check_splits("colon in value", "data: {\"a\": \"b:c\"}\n\n", "message={\"a\": \"b:c\"}|");
    check_limit();
    check_stop();
    printf("1..%d\n", count);
    return failures ? 1 : 0;
}

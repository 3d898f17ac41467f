/* The head of a guest's answer to a WebSocket upgrade (daemon/httphead.c): where it ends, what
 * it says, and what a hostile service's bytes get. TAP. */
#include "../../daemon/httphead.h"

#include <string.h>

#include "tap.h"

static struct ad_http_head h;
static char why[256];

/* Feeds s one byte at a time; returns the head's length, -1 on failure. */
static long bytewise(const char *s, size_t n)
{
    ad_http_head_init(&h);
    long used = 0;
    for (size_t i = 0; i < n && !h.done; i++) {
        long r = ad_http_head_feed(&h, s + i, 1, why, sizeof(why));
        if (r < 0)
            return -1;
        used += r;
    }
    return used;
}

static long whole(const char *s, size_t n)
{
    ad_http_head_init(&h);
    return ad_http_head_feed(&h, s, n, why, sizeof(why));
}

int main(void)
{
    static const char up[] = "HTTP/1.1 101 Switching Protocols\r\n"
                             "Upgrade: websocket\r\n"
                             "Connection: Upgrade\r\n"
                             "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n";
    char buf[512];
    snprintf(buf, sizeof(buf), "%s\x81\x02hi", up);
    long n = whole(buf, strlen(buf));
    ok(n == (long)strlen(up), "a 101's head ends at its blank line (%ld of %zu)", n, strlen(buf));
    ok(h.done && h.upgrade && h.status == 101, "it is an upgrade");
    ok(h.nfields == 3 &&
           !strcmp(ad_http_head_get(&h, "sec-websocket-accept"), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
       "its headers, looked up case-insensitively");
    ok(bytewise(buf, strlen(buf)) == (long)strlen(up) && h.upgrade,
       "a byte at a time it ends at the same place");

    static const char refused[] = "HTTP/1.1 404 Not Found\r\nContent-Length: 5\r\n\r\nnope!";
    n = whole(refused, strlen(refused));
    ok(n >= 0 && h.done && !h.upgrade && h.status == 404, "a refusal: its status, no upgrade");

    static const char interim[] = "HTTP/1.1 100 Continue\r\nX-A: 1\r\n\r\n"
                                  "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                                  "Connection: upgrade\r\n\r\n";
    n = whole(interim, strlen(interim));
    ok(n == (long)strlen(interim) && h.upgrade && h.nfields == 2 && !ad_http_head_get(&h, "x-a"),
       "an interim 100 is skipped, its headers with it");

    static const char bare[] = "HTTP/1.1 101 Switching Protocols\r\nX: a\r\n\r\n";
    n = whole(bare, strlen(bare));
    ok(n >= 0 && h.done && h.status == 101 && !h.upgrade,
       "a 101 without Upgrade and Connection is no upgrade");

    static const char ctl[] = "HTTP/1.1 101 S\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                              "X-Nul: \0b\r\nX-Ok: c\r\n\r\n"; /* as fuzz-httphead found it */
    n = whole(ctl, sizeof(ctl) - 1);
    ok(h.done && !ad_http_head_get(&h, "x-nul") && ad_http_head_get(&h, "x-ok") && h.dropped == 1,
       "a value with a NUL in it is dropped, the rest kept");
    ok(whole("SSH-2.0-OpenSSH_9.2\r\n", 21) < 0 && why[0], "not HTTP: refused (%s)", why);
    n = whole("HTTP/1.1 101 Sw", 15);
    ok(n == 15 && !h.done, "half a status line: all taken, more needed");

    /* 80 short headers, one over the value bound, one over the name bound */
    char big[AD_HEAD_MAX];
    size_t len = (size_t)snprintf(big, sizeof(big),
                                  "HTTP/1.1 101 S\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                                  "X-Long: %0*d\r\n%0*d: v\r\n",
                                  AD_HEAD_VALUE_MAX + 10, 0, AD_HEAD_NAME_MAX + 10, 0);
    for (int i = 0; i < 80; i++)
        len += (size_t)snprintf(big + len, sizeof(big) - len, "X-%d: v\r\n", i);
    len += (size_t)snprintf(big + len, sizeof(big) - len, "\r\n");
    n = whole(big, len);
    ok(n == (long)len && h.upgrade, "a head of many and long headers still parses");
    ok(h.nfields == AD_HEAD_HEADERS_MAX && h.dropped == 2 + 80 - (AD_HEAD_HEADERS_MAX - 2),
       "%zu kept (the bound), %zu dropped (the long two and those past it)", h.nfields, h.dropped);
    ok(!ad_http_head_get(&h, "x-long") && ad_http_head_get(&h, "upgrade") &&
           ad_http_head_get(&h, "x-0"),
       "the long ones are the ones dropped");
    ok(bytewise(big, len) == (long)len && h.nfields == AD_HEAD_HEADERS_MAX,
       "a byte at a time the same");
    return tap_done();
}

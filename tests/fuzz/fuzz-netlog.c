/* Fuzz target for the proxy's access-log reader (orchestrator/session/net.c, al_net_log_line):
 * Squid writes the lines, but the method and host in them are what a hostile guest asked for. The
 * input is split at newlines and each line parsed against a fixed allowlist. Whatever the input:
 * the fields come out NUL-terminated within their arrays, method and host printable ASCII without
 * spaces, the reason printable; a denied request always says why. Any violation aborts. */
#include "fuzz.h"
#include "net.h"
#include "session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void fail(const char *what)
{
    fprintf(stderr, "fuzz-netlog: %s\n", what);
    abort();
}

static void check_field(const char *s, size_t cap, bool spaces, const char *what)
{
    size_t n = strnlen(s, cap);
    if (n == cap)
        fail(what);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e || (!spaces && s[i] == ' '))
            fail(what);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char allow0[] = "web.test", allow1[] = "*.wild.test";
    char *const allow[] = {allow0, allow1, NULL};
    char *buf = malloc(size + 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    buf[size] = '\0';
    for (char *line = buf, *next; line; line = next) {
        next = memchr(line, '\n', (size_t)(buf + size - line));
        if (next)
            *next++ = '\0';
        al_net_request r = AL_NET_REQUEST_INIT;
        memset(&r, 0xa5, sizeof(r)); /* what the parser leaves unset shows */
        if (al_net_log_line(allow, line, &r) <= 0)
            continue;
        check_field(r.method, sizeof(r.method), false, "method not printable or unbounded");
        check_field(r.host, sizeof(r.host), false, "host not printable or unbounded");
        check_field(r.why, sizeof(r.why), true, "reason not printable or unbounded");
        if (!r.allowed && !r.why[0])
            fail("a denied request without a reason");
    }
    free(buf);
    return 0;
}

/* Allowlists for network on request (orchestrator/session/net.c): what --net and the library
 * accept, at, below and above the bounds (AL_NET_ALLOW_MAX hosts, 253-byte names); and Squid's
 * access log lines as the host reads them. TAP output. */
#include "airlock.h"
#include "net.h"
#include "session.h"
#include "tap.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse(const char *spec, char ***out)
{
    al_error e = {0};
    *out = NULL;
    return al_net_spec_parse(spec, out, &e);
}

/* "allow=" and n comma-separated names h0.test,h1.test,... */
static char *hosts(unsigned n)
{
    size_t len = 8 + (size_t)n * 16;
    char *s = malloc(len), *p = s;
    if (!s)
        abort();
    p += sprintf(p, "allow=");
    for (unsigned i = 0; i < n; i++)
        p += sprintf(p, "%sh%u.test", i ? "," : "", i);
    return s;
}

int main(void)
{
    char **v;
    ok(parse("none", &v) == 0 && v == NULL, "none: no allowlist");
    ok(parse("allow=pypi.org, *.pythonhosted.org ,Example.COM", &v) == 0 && v &&
           !strcmp(v[0], "pypi.org") && !strcmp(v[1], "*.pythonhosted.org") &&
           !strcmp(v[2], "example.com") && !v[3],
       "names and *.suffix, trimmed and lower-cased");
    al_net_allow_free(v);
    static const char *const bad[] = {"allow=",     "allow=,",    "allow=a b", "allow=../x",
                                      "allow=*.",   "allow=a..b", "allow=.a",  "allow=a.",
                                      "allow=-a.b", "allow=*",    "allow=a/b", "allow=a:80",
                                      "allow=**.a", "sometimes",  "allow=a_b", "allow=a\tb"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int r = parse(bad[i], &v);
        ok(r < 0 && v == NULL, "refused: '%s'", bad[i]);
    }
    for (unsigned n = AL_NET_ALLOW_MAX - 1; n <= AL_NET_ALLOW_MAX + 1; n++) {
        char *s = hosts(n);
        int r = parse(s, &v);
        ok((r == 0) == (n <= AL_NET_ALLOW_MAX), "%u hosts %s", n,
           n <= AL_NET_ALLOW_MAX ? "accepted" : "refused");
        al_net_allow_free(v);
        free(s);
    }
    for (size_t n = 252; n <= 254; n++) {
        char name[300];
        memset(name, 'a', n);
        for (size_t i = 60; i < n; i += 61)
            name[i] = '.'; /* labels of 60 */
        name[n] = '\0';
        ok(al_net_host_pattern_ok(name) == (n <= 253), "a %zu-byte name %s", n,
           n <= 253 ? "accepted" : "refused");
    }
    /* A host with spaces in it (Squid 5.7 drops them, another version might not): a denied
     * request to one odd host, not an allowed tunnel to web.test. */
    static char *const allow[] = {"web.test", NULL};
    char line[] = "1796084772.928 CONNECT web.test 443 200 9 9 TCP_TUNNEL - 443 403 3393 30 "
                  "TCP_DENIED ERR_ACCESS_DENIED";
    al_net_request r = AL_NET_REQUEST_INIT;
    ok(al_net_log_line(allow, line, &r) == 1 && !r.allowed && r.status == 403 && r.port == 443 &&
           !strcmp(r.host, "web.test?443?200?9?9?TCP_TUNNEL?-") && r.bytes == 3393 + 30 &&
           strstr(r.why, "not in the allowlist"),
       "a host with spaces shifts no field: denied, status %u, host '%s'", r.status, r.host);
    char plain[] = "1796084772.928 CONNECT web.test 443 200 9000 700 TCP_TUNNEL -";
    ok(al_net_log_line(allow, plain, &r) == 1 && r.allowed && r.status == 200 &&
           !strcmp(r.host, "web.test") && r.bytes == 9700 && !r.why[0],
       "an allowed tunnel");
    char shortl[] = "1796084772.928 CONNECT web.test 443 200 9 9 TCP_TUNNEL";
    ok(al_net_log_line(allow, shortl, &r) == 0, "a line short of a field is no request");
    return tap_done();
}

/* Forwarded ports: airlock port SESSION GUESTPORT[:HOSTPORT] (a session another airlock process
 * holds: the connections are relayed by that process; one of airlockd: tunnels through it,
 * remote.c), and what exec -p shares with it: the
 * port specs, opening the forwards, saying where they listen. The forwarding is the library's
 * (al_forward). */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "Usage: airlock port SESSION GUESTPORT[:HOSTPORT] [--bind ADDR]\n"
    "\n"
    "Forwards HOSTPORT on this machine (default: GUESTPORT; 0: a free one) to GUESTPORT on\n"
    "127.0.0.1 in SESSION, a session 'airlock ps' lists (a chat's VM, an 'airlock exec\n"
    "--linger' session, a session of airlockd), until Ctrl-C. Each connection is a tunnel\n"
    "over the session's agent (through airlockd for its sessions; the guest has no network\n"
    "device for it); nothing in the guest can open a connection to this machine this way.\n"
    "Listens on 127.0.0.1 only, unless --bind ADDR (0.0.0.0 or :: for every address: anyone\n"
    "who reaches this machine reaches the port). 'airlock exec -p HOSTPORT:GUESTPORT'\n"
    "forwards for the length of one command.\n";

/* "N" as a port: 1..65535, or 0 when zero_ok. */
static bool port_number(const char *s, bool zero_ok, unsigned *out)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (!*s || *end || errno || v > 65535 || (!v && !zero_ok) || s[0] == '-' || s[0] == '+')
        return false;
    *out = (unsigned)v;
    return true;
}

int cli_publish_parse(const char *spec, struct cli_port *out)
{
    /* docker's forms: GUEST, HOST:GUEST, ADDR:HOST:GUEST ([ADDR] for IPv6) */
    char buf[sizeof(out->bind)];
    if (strlen(spec) >= sizeof(buf))
        goto bad;
    snprintf(buf, sizeof(buf), "%s", spec);
    *out = (struct cli_port){0};
    char *guest = strrchr(buf, ':');
    if (!guest) {
        if (port_number(buf, false, &out->guest))
            return 0;
        goto bad;
    }
    *guest++ = '\0';
    char *host = strrchr(buf, ':');
    if (host && buf[0] != '[') {
        *host++ = '\0';
        snprintf(out->bind, sizeof(out->bind), "%s", buf);
    } else if (buf[0] == '[') {
        char *close = strchr(buf, ']');
        if (!close || close[1] != ':')
            goto bad;
        *close = '\0';
        snprintf(out->bind, sizeof(out->bind), "%s", buf + 1);
        host = close + 2;
    } else {
        host = buf;
    }
    if (port_number(guest, false, &out->guest) && port_number(host, true, &out->host))
        return 0;
bad:
    fprintf(stderr,
            "airlock: -p wants HOSTPORT:GUESTPORT (or GUESTPORT, or ADDR:HOSTPORT:GUESTPORT), "
            "not '%s'\n",
            spec);
    return -1;
}

static void say_error(void *ctx, const char *msg)
{
    (void)ctx;
    char safe[512];
    fprintf(stderr, "airlock: %s\n", al_term_escape(msg, safe, sizeof(safe)));
}

int cli_forwards_open(al_session *s, al_attach *r, struct cli_tunnel *t, struct cli_port *ports,
                      size_t n, bool quiet, al_error *err)
{
    for (size_t i = 0; i < n; i++) {
        al_forward_opts o = {.struct_size = sizeof(al_forward_opts),
                             .session = s,
                             .attach = r,
                             .bind = ports[i].bind[0] ? ports[i].bind : NULL,
                             .host_port = ports[i].host,
                             .guest_port = ports[i].guest,
                             .on_error = say_error,
                             .ctx = t,
                             .relay = t ? cli_tunnel_relay : NULL};
        if (al_forward_open(&o, &ports[i].f, err) < 0) {
            cli_forwards_close(ports, i);
            return -1;
        }
        if (!quiet) {
            const char *b = o.bind ? o.bind : "127.0.0.1";
            bool v6 = strchr(b, ':') != NULL;
            fprintf(stderr, "airlock: forwarding %s%s%s:%u to port %u in the guest\n",
                    v6 ? "[" : "", b, v6 ? "]" : "", al_forward_host_port(ports[i].f),
                    ports[i].guest);
        }
    }
    return 0;
}

void cli_forwards_close(struct cli_port *ports, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        al_forward_close(ports[i].f);
        ports[i].f = NULL;
    }
}

int cmd_port(struct cli_globals *g, int argc, char **argv)
{
    static const struct option opts[] = {
        {"bind", required_argument, NULL, 'b'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct cli_port p = {0};
    int c;
    while ((c = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
        if (c == 'h') {
            fputs(usage, stdout);
            return 0;
        }
        if (c == 'b' && strlen(optarg) < sizeof(p.bind)) {
            snprintf(p.bind, sizeof(p.bind), "%s", optarg);
            continue;
        }
        return cli_bad_option("port", argc, argv, "+h", opts);
    }
    if (argc - optind != 2) {
        fputs(usage, stderr);
        return 2;
    }
    const char *name = argv[optind];
    char spec[32];
    snprintf(spec, sizeof(spec), "%s", argv[optind + 1]);
    char *colon = strchr(spec, ':');
    if (colon)
        *colon = '\0';
    if (!port_number(spec, false, &p.guest) ||
        (colon ? !port_number(colon + 1, true, &p.host) : (p.host = p.guest, false))) {
        fprintf(stderr, "airlock: port wants GUESTPORT[:HOSTPORT] (1 to 65535), not '%s'\n",
                argv[optind + 1]);
        return 2;
    }
    al_error err = {0};
    al_attach *r = NULL;
    struct cli_tunnel *t = NULL;
    /* A session of airlockd: asked for with --server, or one no airlock process here holds
     * while the daemon's socket is there. */
    int k = cli_remote_wanted(g) ? -ENOENT : al_attach_open(name, &r, &err);
    if (k == -ENOENT && (cli_remote_wanted(g) || cli_daemon_here())) {
        t = cli_tunnel_new(g, name, p.guest);
        if (!t)
            return EXIT_AIRLOCK_FAILED;
    } else if (k < 0) {
        cli_error(&err);
        return err.code == -ENOENT ? EXIT_NOT_FOUND : EXIT_AIRLOCK_FAILED;
    }
    int cancel = cli_cancel_pipe(NULL);
    if (cli_forwards_open(NULL, r, t, &p, 1, false, &err) < 0) {
        cli_error(&err);
        al_attach_close(r);
        cli_tunnel_free(t);
        return EXIT_AIRLOCK_FAILED;
    }
    if (!g->quiet)
        fprintf(stderr, "airlock: Ctrl-C stops forwarding\n");
    for (;;) {
        struct pollfd pfd = {cancel, POLLIN, 0};
        if (poll(&pfd, 1, -1) > 0)
            break;
        if (errno != EINTR)
            break;
    }
    cli_forwards_close(&p, 1);
    al_attach_close(r);
    cli_tunnel_free(t);
    return 0;
}

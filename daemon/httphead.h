/* The head of the answer a guest's service gives to a WebSocket upgrade (ports.c), parsed by
 * http-parser (Debian's libhttp-parser, nodejs's old parser) as its bytes come, with bounds:
 * the guest is hostile. No airlockd types here, so that its fuzz target builds alone. */
#ifndef AD_HTTPHEAD_H
#define AD_HTTPHEAD_H

#include <http_parser.h>
#include <stdbool.h>
#include <stddef.h>

/* A head's bytes at most (its status line and headers); the caller refuses a longer one. */
#define AD_HEAD_MAX 16384
/* Headers kept (more are dropped, counted in dropped), and each one's bounds: a longer name or
 * value, or a control byte in either, drops that header, never the answer. */
#define AD_HEAD_HEADERS_MAX 64
#define AD_HEAD_NAME_MAX 64
#define AD_HEAD_VALUE_MAX 1024

struct ad_head_field {
    char name[AD_HEAD_NAME_MAX];
    char value[AD_HEAD_VALUE_MAX];
    size_t name_len, value_len;
    bool bad;
};

struct ad_http_head {
    http_parser p;
    unsigned status; /* the final answer's status (not a 1xx but 101) */
    bool done;       /* its head ended */
    bool upgrade;    /* 101 with Upgrade and Connection: upgrade: the rest is the new protocol */
    size_t nfields;  /* in fields[] */
    size_t dropped;  /* headers over AD_HEAD_HEADERS_MAX or over a bound */
    bool in_value;   /* the last bytes were a value (the next name starts a field) */
    bool skipping;   /* the field being read is dropped (no room) */
    struct ad_head_field fields[AD_HEAD_HEADERS_MAX];
};

void ad_http_head_init(struct ad_http_head *h);
/* Feeds the next n bytes of the answer. Returns how many were the head's (<= n; the rest, once
 * h->done, belong to the upgraded protocol or to the body), or -1 for bytes that are no HTTP
 * answer (why says what, in a sentence). */
long ad_http_head_feed(struct ad_http_head *h, const char *data, size_t n, char *why,
                       size_t why_len);
/* The value of header name (case-insensitive), NULL when absent. */
const char *ad_http_head_get(const struct ad_http_head *h, const char *name);

#endif

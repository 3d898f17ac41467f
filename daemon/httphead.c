/* An upgrade answer's head through http-parser (see httphead.h). */
#include "httphead.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

static struct ad_http_head *head_of(http_parser *p)
{
    return p->data;
}

/* A field's piece of name or value (the parser may give one in several pieces). */
static void append(struct ad_head_field *f, bool value, const char *at, size_t len)
{
    char *dst = value ? f->value : f->name;
    size_t *have = value ? &f->value_len : &f->name_len;
    size_t cap = value ? AD_HEAD_VALUE_MAX : AD_HEAD_NAME_MAX;
    bool ctl = false;
    for (size_t i = 0; i < len && !ctl; i++)
        ctl = ((unsigned char)at[i] < 0x20 && at[i] != '\t') || at[i] == 0x7f;
    if (f->bad || ctl || len >= cap - *have) {
        f->bad = true; /* over its bound, or a control byte (a NUL would cut it short) */
        return;
    }
    memcpy(dst + *have, at, len);
    *have += len;
    dst[*have] = '\0';
}

/* The field being read ends: dropped when it went past a bound or held a control byte. */
static void field_end(struct ad_http_head *h)
{
    if (!h->skipping && h->nfields && h->fields[h->nfields - 1].bad) {
        h->nfields--;
        h->dropped++;
    }
}

static int on_field(http_parser *p, const char *at, size_t len)
{
    struct ad_http_head *h = head_of(p);
    if (h->in_value) { /* a new field */
        field_end(h);
        h->in_value = false;
        h->skipping = h->nfields == AD_HEAD_HEADERS_MAX;
        if (h->skipping)
            h->dropped++;
        else
            memset(&h->fields[h->nfields++], 0, sizeof(h->fields[0]));
    }
    if (!h->skipping)
        append(&h->fields[h->nfields - 1], false, at, len);
    return 0;
}

static int on_value(http_parser *p, const char *at, size_t len)
{
    struct ad_http_head *h = head_of(p);
    h->in_value = true;
    if (!h->skipping && h->nfields)
        append(&h->fields[h->nfields - 1], true, at, len);
    return 0;
}

static int on_headers_complete(http_parser *p)
{
    struct ad_http_head *h = head_of(p);
    field_end(h);
    h->in_value = true;
    h->skipping = false;
    if (p->status_code >= 100 && p->status_code < 200 && p->status_code != 101) {
        /* an interim answer (100, 103): the real one follows, with headers of its own */
        h->nfields = h->dropped = 0;
        return 0;
    }
    h->status = p->status_code;
    h->done = true;
    h->upgrade = p->status_code == 101 && p->upgrade;
    if (!h->upgrade)
        http_parser_pause(p, 1); /* a body is not ours to parse */
    return 0;
}

static const http_parser_settings settings = {
    .on_header_field = on_field,
    .on_header_value = on_value,
    .on_headers_complete = on_headers_complete,
};

void ad_http_head_init(struct ad_http_head *h)
{
    memset(h, 0, sizeof(*h));
    http_parser_init(&h->p, HTTP_RESPONSE);
    h->p.data = h;
    h->in_value = true; /* the first name starts a field */
}

long ad_http_head_feed(struct ad_http_head *h, const char *data, size_t n, char *why,
                       size_t why_len)
{
    if (h->done || !n)
        return 0; /* no bytes is no news (to http-parser it would be the end of the stream) */
    size_t used = http_parser_execute(&h->p, &settings, data, n);
    enum http_errno e = HTTP_PARSER_ERRNO(&h->p);
    if (e != HPE_OK && e != HPE_PAUSED) {
        snprintf(why, why_len, "its answer is no HTTP (%s)", http_errno_description(e));
        return -1;
    }
    return (long)(used > n ? n : used);
}

const char *ad_http_head_get(const struct ad_http_head *h, const char *name)
{
    for (size_t i = 0; i < h->nfields; i++)
        if (!strcasecmp(h->fields[i].name, name))
            return h->fields[i].value;
    return NULL;
}

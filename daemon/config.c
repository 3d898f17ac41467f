/* airlockd.conf: "key = value" lines, '#' comments, blank lines. Hand-edited by people, so every
 * unknown key and every bad value is an error naming its line. */
#include "airlockd.h"

#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

void ad_config_defaults(struct ad_config *c)
{
    memset(c, 0, sizeof(*c));
    snprintf(c->socket_path, sizeof(c->socket_path), "/run/airlock/airlockd.sock");
    c->socket_mode = 0660;
    snprintf(c->keys_db, sizeof(c->keys_db), "/var/lib/airlock/airlockd/keys.db");
    snprintf(c->spool_dir, sizeof(c->spool_dir), "/var/lib/airlock/airlockd/spool");
    c->limits = (struct ad_limits){
        .max_sessions = 8,
        .max_memory_mib = 8192,
        .max_vcpus = 16,
        .max_lifetime_s = 24 * 3600,
        .max_idle_s = 1800,
        .max_exec_timeout_s = 3600,
        .max_upload_bytes = 1ull << 30,
        .disk_budget_bytes = 0,
        .max_snapshots = 16,
        .max_snapshot_bytes = 16ull << 30,
        .max_volume_bytes = 64ull << 30,
    };
    c->run_buffer_bytes = 1 << 20;
    c->spool_max_bytes = 8ull << 30;
    c->runs_kept = 4;
    c->heartbeat_s = 15;
    c->connection_timeout_s = 60;
    c->head_timeout_s = 20;
    c->max_body_bytes = 1 << 20;
    c->max_connections = 256;
    c->max_connections_per_ip = 32;
    c->limits.net_bytes_max = AL_NET_BYTES_MAX_DEFAULT;
    snprintf(c->model_api, sizeof(c->model_api), "openai");
    c->model_tools = true;
    c->keep_sessions = true;
    c->host_check_s = 2;
    snprintf(c->e2b_image, sizeof(c->e2b_image), "debian");
}

static int parse_u64(const char *v, uint64_t max, uint64_t *out)
{
    if (!isdigit((unsigned char)v[0]))
        return -EINVAL;
    errno = 0;
    char *end;
    unsigned long long x = strtoull(v, &end, 0);
    if (errno || *end || x > max)
        return -ERANGE;
    *out = x;
    return 0;
}

static int parse_uint(const char *v, unsigned *out)
{
    uint64_t x;
    int r = parse_u64(v, 0xffffffffu, &x);
    if (r == 0)
        *out = (unsigned)x;
    return r;
}

static int copy(char *dst, size_t len, const char *v)
{
    if (strlen(v) >= len)
        return -ENAMETOOLONG;
    snprintf(dst, len, "%s", v);
    return 0;
}

static int parse_uids(struct ad_config *c, char *v)
{
    c->nallow = 0;
    for (char *save, *t = strtok_r(v, " ,", &save); t; t = strtok_r(NULL, " ,", &save)) {
        unsigned u = 0;
        if (c->nallow == AD_ALLOW_UIDS_MAX || parse_uint(t, &u) < 0)
            return -EINVAL;
        c->allow_uids[c->nallow++] = (uid_t)u;
    }
    return 0;
}

/* A group by name or number; the name is looked up once, at start. */
static int parse_group(struct ad_config *c, const char *v)
{
    unsigned g = 0;
    if (isdigit((unsigned char)v[0])) {
        if (parse_uint(v, &g) < 0)
            return -EINVAL;
    } else {
        char buf[4096];
        struct group gr, *res = NULL;
        if (getgrnam_r(v, &gr, buf, sizeof(buf), &res) != 0 || !res)
            return -EINVAL;
        g = (unsigned)res->gr_gid;
    }
    c->allow_gid = (gid_t)g;
    c->has_allow_gid = true;
    return 0;
}

/* "NAME URI [max_sessions=N] [max_memory_mib=N] [weight=N]" */
static int parse_host(struct ad_config *c, char *v)
{
    if (c->nhosts == AD_HOSTS_MAX)
        return -E2BIG;
    struct ad_host_cfg h = {.weight = 1};
    char *save, *name = strtok_r(v, " \t", &save), *uri = strtok_r(NULL, " \t", &save);
    if (!name || !uri || copy(h.name, sizeof(h.name), name) < 0 ||
        copy(h.uri, sizeof(h.uri), uri) < 0 || !strstr(uri, "://"))
        return -EINVAL;
    for (const char *p = name; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '-' && *p != '_' && *p != '.')
            return -EINVAL;
    for (size_t i = 0; i < c->nhosts; i++)
        if (!strcmp(c->hosts[i].name, name))
            return -EEXIST;
    for (char *t; (t = strtok_r(NULL, " \t", &save));) {
        char *eq = strchr(t, '=');
        if (!eq)
            return -EINVAL;
        *eq = 0;
        unsigned *dst = !strcmp(t, "max_sessions")     ? &h.max_sessions
                        : !strcmp(t, "max_memory_mib") ? &h.max_memory_mib
                        : !strcmp(t, "weight")         ? &h.weight
                                                       : NULL;
        if (!dst || parse_uint(eq + 1, dst) < 0)
            return -EINVAL;
    }
    if (!h.weight)
        return -ERANGE;
    /* qemu:///system names no host; qemu+tcp://HOST/system does. */
    const char *p = strstr(uri, "://") + 3;
    h.local = *p == '/';
    c->hosts[c->nhosts++] = h;
    return 0;
}

/* "TEMPLATE IMAGE": E2B's templateID TEMPLATE is the store's IMAGE. */
static int parse_e2b_template(struct ad_config *c, char *v)
{
    if (c->ne2b_templates == AD_E2B_TEMPLATES_MAX)
        return -E2BIG;
    char *save, *name = strtok_r(v, " \t", &save), *image = strtok_r(NULL, " \t", &save);
    if (!name || !image || strtok_r(NULL, " \t", &save) || strchr(image, '/') || strchr(name, '/'))
        return -EINVAL;
    struct ad_e2b_template *t = &c->e2b_templates[c->ne2b_templates];
    if (copy(t->name, sizeof(t->name), name) < 0 || copy(t->image, sizeof(t->image), image) < 0)
        return -EINVAL;
    for (size_t i = 0; i < c->ne2b_templates; i++)
        if (!strcmp(c->e2b_templates[i].name, name))
            return -EEXIST;
    c->ne2b_templates++;
    return 0;
}

static int set(struct ad_config *c, const char *k, char *v)
{
    uint64_t x;
    int r;
    if (!strcmp(k, "socket"))
        return copy(c->socket_path, sizeof(c->socket_path), v);
    if (!strcmp(k, "socket_mode")) {
        if (v[0] != '0' || (r = parse_u64(v, 0777, &x)) < 0)
            return -EINVAL;
        c->socket_mode = (unsigned)x;
        return 0;
    }
    if (!strcmp(k, "allow_uids"))
        return parse_uids(c, v);
    if (!strcmp(k, "allow_group"))
        return parse_group(c, v);
    if (!strcmp(k, "tcp"))
        return copy(c->tcp_listen, sizeof(c->tcp_listen), v);
    if (!strcmp(k, "e2b_listen"))
        return copy(c->e2b_listen, sizeof(c->e2b_listen), v);
    if (!strcmp(k, "e2b_domain"))
        return copy(c->e2b_domain, sizeof(c->e2b_domain), v);
    if (!strcmp(k, "oi_listen"))
        return copy(c->oi_listen, sizeof(c->oi_listen), v);
    if (!strcmp(k, "e2b_image"))
        return v[0] && !strchr(v, '/') ? copy(c->e2b_image, sizeof(c->e2b_image), v) : -EINVAL;
    if (!strcmp(k, "e2b_template"))
        return parse_e2b_template(c, v);
    if (!strcmp(k, "tls_cert"))
        return copy(c->tls_cert, sizeof(c->tls_cert), v);
    if (!strcmp(k, "tls_key"))
        return copy(c->tls_key, sizeof(c->tls_key), v);
    if (!strcmp(k, "keys_db"))
        return copy(c->keys_db, sizeof(c->keys_db), v);
    if (!strcmp(k, "spool_dir"))
        return copy(c->spool_dir, sizeof(c->spool_dir), v);
    if (!strcmp(k, "max_sessions"))
        return parse_uint(v, &c->limits.max_sessions);
    if (!strcmp(k, "max_memory_mib"))
        return parse_uint(v, &c->limits.max_memory_mib);
    if (!strcmp(k, "max_vcpus"))
        return parse_uint(v, &c->limits.max_vcpus);
    if (!strcmp(k, "max_lifetime_s"))
        return parse_uint(v, &c->limits.max_lifetime_s);
    if (!strcmp(k, "max_idle_s"))
        return parse_uint(v, &c->limits.max_idle_s);
    if (!strcmp(k, "max_exec_timeout_s"))
        return parse_uint(v, &c->limits.max_exec_timeout_s);
    if (!strcmp(k, "max_upload_bytes"))
        return parse_u64(v, UINT64_MAX, &c->limits.max_upload_bytes);
    if (!strcmp(k, "max_snapshots"))
        return parse_uint(v, &c->limits.max_snapshots);
    if (!strcmp(k, "max_volume_bytes"))
        return parse_u64(v, UINT64_MAX, &c->limits.max_volume_bytes);
    if (!strcmp(k, "max_snapshot_bytes"))
        return parse_u64(v, UINT64_MAX, &c->limits.max_snapshot_bytes);
    if (!strcmp(k, "requests_per_s"))
        return parse_uint(v, &c->limits.requests_per_s);
    if (!strcmp(k, "disk_budget_bytes"))
        return parse_u64(v, UINT64_MAX, &c->limits.disk_budget_bytes);
    if (!strcmp(k, "spool_max_bytes"))
        return (r = parse_u64(v, UINT64_MAX, &c->spool_max_bytes)) < 0 ? r
               : c->spool_max_bytes                                    ? 0
                                                                       : -ERANGE;
    if (!strcmp(k, "run_buffer_bytes")) {
        /* At least a few output chunks (64 KiB each, base64 in an event). */
        if ((r = parse_u64(v, 1ull << 30, &x)) < 0 || x < (256u << 10))
            return -ERANGE;
        c->run_buffer_bytes = x;
        return 0;
    }
    if (!strcmp(k, "runs_kept"))
        return parse_uint(v, &c->runs_kept);
    if (!strcmp(k, "heartbeat_s"))
        return (r = parse_uint(v, &c->heartbeat_s)) < 0 ? r : c->heartbeat_s ? 0 : -ERANGE;
    if (!strcmp(k, "connection_timeout_s"))
        return parse_uint(v, &c->connection_timeout_s);
    if (!strcmp(k, "head_timeout_s"))
        return (r = parse_uint(v, &c->head_timeout_s)) < 0 ? r : c->head_timeout_s ? 0 : -ERANGE;
    if (!strcmp(k, "max_body_bytes"))
        return parse_u64(v, 64u << 20, &c->max_body_bytes);
    if (!strcmp(k, "model_api")) {
        if (strcmp(v, "openai") && strcmp(v, "anthropic") && strcmp(v, "responses"))
            return -EINVAL;
        return copy(c->model_api, sizeof(c->model_api), v);
    }
    if (!strcmp(k, "model_api_base"))
        return copy(c->model_api_base, sizeof(c->model_api_base), v);
    if (!strcmp(k, "model"))
        return copy(c->model, sizeof(c->model), v);
    if (!strcmp(k, "model_api_key_env"))
        return copy(c->model_api_key_env, sizeof(c->model_api_key_env), v);
    if (!strcmp(k, "model_tools")) {
        if (strcmp(v, "true") && strcmp(v, "false"))
            return -EINVAL;
        c->model_tools = !strcmp(v, "true");
        return 0;
    }
    if (!strcmp(k, "max_connections"))
        return parse_uint(v, &c->max_connections);
    if (!strcmp(k, "max_connections_per_ip"))
        return parse_uint(v, &c->max_connections_per_ip);
    if (!strcmp(k, "keep_sessions")) {
        if (strcmp(v, "true") && strcmp(v, "false"))
            return -EINVAL;
        c->keep_sessions = !strcmp(v, "true");
        return 0;
    }
    if (!strcmp(k, "keep_grace_s")) {
        if ((r = parse_u64(v, 366ull * 86400, &x)) == 0 && x < 10)
            r = -EINVAL;
        if (r == 0)
            c->keep_grace_s = (unsigned)x;
        return r;
    }
    if (!strcmp(k, "pool_image"))
        return copy(c->pool_image, sizeof(c->pool_image), v);
    if (!strcmp(k, "pool_size")) {
        if ((r = parse_u64(v, AL_POOL_SIZE_MAX, &x)) == 0)
            c->pool_size = (unsigned)x;
        return r;
    }
    if (!strcmp(k, "pool_memory_mib"))
        return parse_uint(v, &c->pool_memory_mib);
    if (!strcmp(k, "pool_vcpus"))
        return parse_uint(v, &c->pool_vcpus);
    if (!strcmp(k, "net_allow_max")) { /* the library's own allowlist syntax and checks */
        al_error e = {0};
        char **allow = NULL;
        if (*v && (r = al_net_allow_parse(v, &allow, &e)) < 0)
            return r;
        al_net_allow_free(c->net_allow_max);
        c->net_allow_max = allow;
        return 0;
    }
    if (!strcmp(k, "host"))
        return parse_host(c, v);
    if (!strcmp(k, "host_check_s"))
        return (r = parse_uint(v, &c->host_check_s)) < 0 ? r : c->host_check_s ? 0 : -ERANGE;
    if (!strcmp(k, "net_bytes_max")) {
        if ((r = parse_u64(v, UINT64_MAX >> 1, &c->limits.net_bytes_max)) < 0)
            return r;
        return c->limits.net_bytes_max ? 0 : -ERANGE;
    }
    return -ENOENT;
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1]))
        s[--n] = 0;
    return s;
}

int ad_config_load(struct ad_config *c, const char *path, char *why, size_t len)
{
    FILE *f = fopen(path, "re");
    if (!f) {
        int e = errno;
        snprintf(why, len, "%s: %s", path, strerror(e));
        return -e;
    }
    char line[1024];
    int r = 0;
    for (unsigned no = 1; fgets(line, sizeof(line), f); no++) {
        if (!strchr(line, '\n') && !feof(f)) {
            snprintf(why, len, "%s:%u: line too long", path, no);
            r = -EINVAL;
            break;
        }
        char *l = trim(line);
        if (!*l || *l == '#')
            continue;
        char *eq = strchr(l, '=');
        if (!eq) {
            snprintf(why, len, "%s:%u: expected 'key = value'", path, no);
            r = -EINVAL;
            break;
        }
        *eq = 0;
        char *k = trim(l), *v = trim(eq + 1);
        r = set(c, k, v);
        if (r == -ENOENT)
            snprintf(why, len, "%s:%u: unknown key '%s'", path, no, k);
        else if (r < 0)
            snprintf(why, len, "%s:%u: bad value for '%s': '%s'", path, no, k, v);
        if (r < 0)
            break;
    }
    fclose(f);
    if (r == 0 && c->connection_timeout_s && c->heartbeat_s >= c->connection_timeout_s) {
        /* an event stream with nothing to say would be cut as idle */
        snprintf(why, len, "%s: heartbeat_s must be below connection_timeout_s", path);
        r = -EINVAL;
    }
    if (r == 0 && (!c->tls_cert[0]) != (!c->tls_key[0])) {
        snprintf(why, len, "%s: tls_cert and tls_key go together", path);
        r = -EINVAL;
    }
    return r;
}

/* airlockd: serve (the default), manage API keys, list the hosts, print the route table. */
#include "airlockd.h"

#include <curl/curl.h>
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>

struct ad_config ad_cfg;

#define DEFAULT_CONFIG "/etc/airlock/airlockd.conf"

static void usage(FILE *f)
{
    fprintf(f, "usage: airlockd [--config FILE]                 serve (in the foreground)\n"
               "       airlockd [--config FILE] key add NAME [--max-sessions N] "
               "[--max-memory-mib M] [--max-vcpus N]\n"
               "                [--max-lifetime-s S] [--max-idle-s S] [--max-exec-timeout-s S]\n"
               "                [--max-upload-bytes B] [--disk-budget-bytes B] "
               "[--requests-per-s N]\n"
               "                [--net-bytes-max B] [--max-snapshots N] "
               "[--max-snapshot-bytes B]\n"
               "                [--max-volume-bytes B]\n"
               "       airlockd [--config FILE] key list\n"
               "       airlockd [--config FILE] key revoke ID\n"
               "       airlockd key e2b < KEY                   the key in E2B's form\n"
               "       airlockd [--config FILE] hosts           the running daemon's hosts\n"
               "       airlockd routes                          the API's routes\n"
               "config: " DEFAULT_CONFIG " when it exists (see packaging/airlockd.conf)\n");
}

/* mkdir -p with mode for the last parts that are missing. */
static int mkdirs(const char *path, mode_t mode)
{
    char buf[512];
    if (snprintf(buf, sizeof(buf), "%s", path) >= (int)sizeof(buf))
        return -ENAMETOOLONG;
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(buf, 0755) < 0 && errno != EEXIST)
            return -errno;
        *p = '/';
    }
    if (mkdir(buf, mode) < 0 && errno != EEXIST)
        return -errno;
    return 0;
}

/* The key store's and the spool's directories are the daemon's alone: made 0700 (the last
 * part; the parts above may be the library's, which QEMU's user traverses), and refused when
 * another user may read or write them (a store an older airlockd made 0755, say). */
static int private_dir(const char *dir, const char *what)
{
    int r = mkdirs(dir, 0700);
    if (r < 0) {
        fprintf(stderr, "airlockd: cannot make %s '%s': %s\n", what, dir, strerror(-r));
        return -1;
    }
    struct stat st;
    if (lstat(dir, &st) < 0) {
        fprintf(stderr, "airlockd: %s '%s': %s\n", what, dir, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077)) {
        fprintf(stderr,
                "airlockd: %s '%s' must be a directory of this user that no other user can "
                "read or write (it is %s, mode %04o, owner %u): chmod 700 it\n",
                what, dir, S_ISDIR(st.st_mode) ? "a directory" : "not a directory",
                (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid);
        return -1;
    }
    return 0;
}

static int open_keys(void)
{
    char dir[512], why[600];
    snprintf(dir, sizeof(dir), "%s", ad_cfg.keys_db);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        *slash = 0;
        if (private_dir(dir, "the key store's directory") < 0)
            return -1;
    }
    if (ad_keys_open(ad_cfg.keys_db, why, sizeof(why)) < 0) {
        fprintf(stderr, "airlockd: %s\n", why);
        return -1;
    }
    return 0;
}

static void print_key(void *ctx, const struct ad_key *k)
{
    (void)ctx;
    char when[32];
    time_t t = (time_t)k->created;
    struct tm tm;
    strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&t, &tm));
    printf("%-14s %-20s %s %s", k->id, k->name, when, k->revoked ? "revoked" : "active ");
    for (size_t i = 0; i < ad_nlimit_fields; i++) {
        uint64_t v = ad_limit_get(&k->lim, &ad_limit_fields[i]);
        if (v)
            printf(" %s=%llu", ad_limit_fields[i].name, (unsigned long long)v);
    }
    printf("\n");
}

static int cmd_key(int argc, char **argv)
{
    if (argc < 1) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[0], "e2b") && argc == 1) {
        /* A key (from stdin: never on a command line) in the form E2B's SDKs take; no store
         * needed. */
        char line[256], out[128];
        if (!fgets(line, sizeof(line), stdin)) {
            fprintf(stderr, "airlockd: key e2b: a key on stdin\n");
            return 1;
        }
        line[strcspn(line, "\r\n")] = 0;
        ad_e2b_key_from_native(line, out, sizeof(out));
        if (!strcmp(out, "?")) {
            fprintf(stderr, "airlockd: key e2b: not an airlockd key (alk_...)\n");
            return 1;
        }
        printf("%s\n", out);
        return 0;
    }
    if (open_keys() < 0)
        return 1;
    int rc = 0;
    if (!strcmp(argv[0], "add") && argc >= 2) {
        /* --max-sessions N, --requests-per-s N...: a limit's name with dashes */
        struct ad_limits lim = {0};
        for (int i = 2; i < argc; i++) {
            const struct ad_limit_field *f = NULL;
            for (size_t j = 0; j < ad_nlimit_fields && !strncmp(argv[i], "--", 2); j++) {
                char flag[64];
                snprintf(flag, sizeof(flag), "%s", ad_limit_fields[j].name);
                for (char *p = flag; *p; p++)
                    *p = *p == '_' ? '-' : *p;
                if (!strcmp(argv[i] + 2, flag))
                    f = &ad_limit_fields[j];
            }
            char *end = NULL;
            unsigned long long v = f && i + 1 < argc ? strtoull(argv[i + 1], &end, 10) : 0;
            if (!f || !end || *end || end == argv[i + 1] || argv[i + 1][0] == '-') {
                usage(stderr);
                ad_keys_close();
                return 2;
            }
            ad_limit_set(&lim, f, v);
            i++;
        }
        struct ad_key k;
        char secret[128];
        if (ad_keys_add(argv[1], &lim, &k, secret, sizeof(secret)) < 0) {
            fprintf(stderr, "airlockd: cannot add key '%s'\n", argv[1]);
            rc = 1;
        } else {
            /* The only time the secret is shown. */
            printf("%s\n", secret);
            fprintf(stderr, "airlockd: key %s made; keep the line above, it is not stored\n", k.id);
        }
    } else if (!strcmp(argv[0], "list")) {
        if (ad_keys_list(print_key, NULL) < 0)
            rc = 1;
    } else if (!strcmp(argv[0], "revoke") && argc == 2) {
        int r = ad_keys_revoke(argv[1]);
        if (r < 0) {
            fprintf(stderr, "airlockd: cannot revoke key '%s': %s\n", argv[1],
                    r == -ENOENT ? "no such key" : strerror(-r));
            rc = 1;
        } else {
            char owner[80];
            snprintf(owner, sizeof(owner), "key:%s", argv[1]);
            ad_snapshots_drop(owner); /* its snapshots go with it */
        }
    } else {
        usage(stderr);
        rc = 2;
    }
    ad_keys_close();
    return rc;
}

/* airlockd hosts: the running daemon's hosts (GET /v1/hosts on its unix socket), one line each. */
static size_t collect(char *p, size_t size, size_t n, void *ctx)
{
    struct {
        char *buf;
        size_t len;
    } *b = ctx;
    size_t add = size * n;
    if (b->len + add > (1u << 20))
        return 0;
    char *nb = realloc(b->buf, b->len + add + 1);
    if (!nb)
        return 0;
    memcpy(nb + b->len, p, add);
    b->buf = nb;
    b->len += add;
    nb[b->len] = 0;
    return add;
}

static int cmd_hosts(void)
{
    struct {
        char *buf;
        size_t len;
    } b = {0};
    CURL *h = curl_easy_init();
    long status = 0;
    CURLcode rc = CURLE_FAILED_INIT;
    if (h) {
        curl_easy_setopt(h, CURLOPT_UNIX_SOCKET_PATH, ad_cfg.socket_path);
        curl_easy_setopt(h, CURLOPT_URL, "http://localhost/v1/hosts");
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, collect);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
        curl_easy_setopt(h, CURLOPT_TIMEOUT, 30L);
        rc = curl_easy_perform(h);
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
        curl_easy_cleanup(h);
    }
    _cleanup_cjson_ cJSON *j = rc == CURLE_OK && b.buf ? cJSON_Parse(b.buf) : NULL;
    if (rc != CURLE_OK || status != 200 || !j) {
        cJSON *m = j ? cJSON_GetObjectItemCaseSensitive(
                           cJSON_GetObjectItemCaseSensitive(j, "error"), "message")
                     : NULL;
        fprintf(stderr, "airlockd: cannot ask the daemon at %s: %s\n", ad_cfg.socket_path,
                rc != CURLE_OK      ? curl_easy_strerror(rc)
                : cJSON_IsString(m) ? m->valuestring
                                    : "an unexpected answer");
        free(b.buf);
        return 1;
    }
    free(b.buf);
    printf("%-16s %-5s %9s %12s %9s %6s  %s\n", "HOST", "STATE", "SESSIONS", "MEMORY_MIB",
           "FREE_MIB", "LOST", "LAST ERROR");
    cJSON *o;
    cJSON_ArrayForEach(o, cJSON_GetObjectItemCaseSensitive(j, "hosts"))
    {
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "name"));
        const char *state = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "state"));
        const char *last = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "last_error"));
        char sess[32], mem[32];
        snprintf(sess, sizeof(sess), "%d/%d",
                 cJSON_GetObjectItemCaseSensitive(o, "sessions")->valueint,
                 cJSON_GetObjectItemCaseSensitive(o, "max_sessions")->valueint);
        snprintf(mem, sizeof(mem), "%d/%d",
                 cJSON_GetObjectItemCaseSensitive(o, "memory_mib")->valueint,
                 cJSON_GetObjectItemCaseSensitive(o, "max_memory_mib")->valueint);
        printf("%-16s %-5s %9s %12s %9.0f %6d  %s\n", name ? name : "?", state ? state : "?", sess,
               mem, cJSON_GetObjectItemCaseSensitive(o, "free_mib")->valuedouble,
               cJSON_GetObjectItemCaseSensitive(o, "lost")->valueint, last ? last : "-");
    }
    return 0;
}

/* Every descriptor the hard limit allows: each session holds about 11 (ad_session_create
 * refuses one that would not fit: fds_check in sessions.c). */
static void raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
        ad_log("descriptors: up to %llu open (RLIMIT_NOFILE)", (unsigned long long)rl.rlim_cur);
}

static int serve(void)
{
    char why[600];
    raise_nofile();
    /* the key store first: the spool's parents are made 0755, the store's own dir 0700 */
    if (open_keys() < 0 || private_dir(ad_cfg.spool_dir, "the upload spool") < 0)
        return 1;
    /* Signals are taken by sigwait below, in this thread only. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (ad_hosts_init(&ad_cfg) < 0) {
        fprintf(stderr, "airlockd: cannot start watching the hosts\n");
        return 1;
    }
    if (ad_cfg.keep_grace_s) { /* the library reads it when it renews a kept session's lease */
        char g[32];
        snprintf(g, sizeof(g), "%u", ad_cfg.keep_grace_s);
        setenv("AIRLOCK_KEEP_GRACE_S", g, 1);
    }
    if (ad_store_open(ad_cfg.keys_db, why, sizeof(why)) < 0) {
        fprintf(stderr, "airlockd: %s\n", why);
        ad_hosts_shutdown();
        return 1;
    }
    if (ad_sessions_init(&ad_cfg) < 0) {
        fprintf(stderr, "airlockd: cannot start the reaper\n");
        ad_hosts_shutdown();
        return 1;
    }
    if (ad_http_start(why, sizeof(why)) < 0) {
        fprintf(stderr, "airlockd: %s\n", why);
        ad_sessions_shutdown();
        ad_hosts_shutdown();
        return 1;
    }
    ad_log("ready");
    int sig = 0;
    while (sigwait(&set, &sig) == 0 && sig == SIGHUP)
        ad_log("SIGHUP ignored (restart to read the config again)");
    ad_log("signal %d: stopping", sig);
    /* Event streams and waits end first, so that the HTTP threads can be joined. */
    ad_runs_shutdown();
    ad_ports_shutdown();
    ad_mcp_shutdown();
    ad_oi_shutdown();
    ad_http_stop();
    ad_sessions_shutdown();
    ad_hosts_shutdown();
    ad_store_close();
    ad_keys_close();
    ad_log("stopped");
    return 0;
}

int main(int argc, char **argv)
{
    const char *config = NULL;
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"foreground", no_argument, NULL, 'f'},
        {"help", no_argument, NULL, 'h'},
        {0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "+c:fh", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            config = optarg;
            break;
        case 'f': /* always in the foreground; kept for service files */
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    ad_config_defaults(&ad_cfg);
    struct stat st;
    if (!config && stat(DEFAULT_CONFIG, &st) == 0)
        config = DEFAULT_CONFIG;
    char why[700];
    if (config && ad_config_load(&ad_cfg, config, why, sizeof(why)) < 0) {
        fprintf(stderr, "airlockd: %s\n", why);
        return 1;
    }
    if (optind < argc && !strcmp(argv[optind], "routes")) {
        ad_routes_print();
        return 0;
    }
    if (optind < argc && !strcmp(argv[optind], "key"))
        return cmd_key(argc - optind - 1, argv + optind + 1);
    if (optind + 1 == argc && !strcmp(argv[optind], "hosts"))
        return cmd_hosts();
    if (optind < argc) {
        usage(stderr);
        return 2;
    }
    return serve();
}

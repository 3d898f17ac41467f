/* API keys in sqlite (WAL). A token is "alk_ID_SECRET": ID finds the row, only SHA-256(SECRET)
 * is stored, compared in constant time. A token is shown once, when made. */
#include "airlockd.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <sqlite3.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static sqlite3 *db;
static pthread_mutex_t db_lock = PTHREAD_MUTEX_INITIALIZER;

#define ID_BYTES 6
#define SECRET_BYTES 24

static int sha256(const char *s, unsigned char out[32])
{
    unsigned len = 0;
    return EVP_Digest(s, strlen(s), out, &len, EVP_sha256(), NULL) == 1 && len == 32 ? 0 : -EIO;
}

// clang-format off
const struct ad_limit_field ad_limit_fields[] = {
    {"max_sessions",       offsetof(struct ad_limits, max_sessions),       false},
    {"max_memory_mib",     offsetof(struct ad_limits, max_memory_mib),     false},
    {"max_vcpus",          offsetof(struct ad_limits, max_vcpus),          false},
    {"max_lifetime_s",     offsetof(struct ad_limits, max_lifetime_s),     false},
    {"max_idle_s",         offsetof(struct ad_limits, max_idle_s),         false},
    {"max_exec_timeout_s", offsetof(struct ad_limits, max_exec_timeout_s), false},
    {"max_upload_bytes",   offsetof(struct ad_limits, max_upload_bytes),   true},
    {"disk_budget_bytes",  offsetof(struct ad_limits, disk_budget_bytes),  true},
    {"requests_per_s",     offsetof(struct ad_limits, requests_per_s),     false},
    {"net_bytes_max",      offsetof(struct ad_limits, net_bytes_max),      true},
    {"max_snapshots",      offsetof(struct ad_limits, max_snapshots),      false},
    {"max_snapshot_bytes", offsetof(struct ad_limits, max_snapshot_bytes), true},
    {"max_volume_bytes",   offsetof(struct ad_limits, max_volume_bytes),   true},
};
// clang-format on
const size_t ad_nlimit_fields = sizeof(ad_limit_fields) / sizeof(ad_limit_fields[0]);

uint64_t ad_limit_get(const struct ad_limits *l, const struct ad_limit_field *f)
{
    const char *p = (const char *)l + f->offset;
    return f->wide ? *(const uint64_t *)p : *(const unsigned *)p;
}

void ad_limit_set(struct ad_limits *l, const struct ad_limit_field *f, uint64_t v)
{
    char *p = (char *)l + f->offset;
    if (f->wide)
        *(uint64_t *)p = v;
    else
        *(unsigned *)p = v > 0xffffffffu ? 0xffffffffu : (unsigned)v;
}

void ad_limits_apply(struct ad_limits *base, const struct ad_limits *over)
{
    for (size_t i = 0; i < ad_nlimit_fields; i++) {
        uint64_t v = ad_limit_get(over, &ad_limit_fields[i]);
        if (v)
            ad_limit_set(base, &ad_limit_fields[i], v);
    }
}

/* "a, b, c" of the limit columns, with a prefix and suffix per name. */
static void columns(char *buf, size_t len, const char *suffix)
{
    size_t n = 0;
    buf[0] = 0;
    for (size_t i = 0; i < ad_nlimit_fields && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, ", %s%s", ad_limit_fields[i].name, suffix);
}

int ad_keys_open(const char *path, char *why, size_t len)
{
    /* Made 0600 before SQLite opens it (its journals take the file's mode); one others may read
     * (an older airlockd's 0644) is refused. */
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        snprintf(why, len, "cannot open key store '%s': %s", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -EIO;
    }
    close(fd);
    if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077)) {
        snprintf(why, len,
                 "the key store '%s' must be a file of this user that no other user can read or "
                 "write (mode %04o, owner %u): chmod 600 it",
                 path, (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid);
        return -EACCES;
    }
    if (sqlite3_open_v2(path, &db,
                        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                        NULL) != SQLITE_OK) {
        snprintf(why, len, "cannot open key store '%s': %s", path,
                 db ? sqlite3_errmsg(db) : "out of memory");
        sqlite3_close(db);
        db = NULL;
        return -EIO;
    }
    sqlite3_busy_timeout(db, 5000);
    char cols[1024], sql[2048];
    columns(cols, sizeof(cols), " INTEGER NOT NULL DEFAULT 0");
    snprintf(sql, sizeof(sql),
             "PRAGMA journal_mode=WAL;"
             "CREATE TABLE IF NOT EXISTS keys (id TEXT PRIMARY KEY, hash BLOB NOT NULL,"
             " name TEXT NOT NULL, created INTEGER NOT NULL, revoked INTEGER NOT NULL"
             " DEFAULT 0%s);",
             cols);
    char *msg = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        snprintf(why, len, "cannot set up key store '%s': %s", path, msg ? msg : "?");
        sqlite3_free(msg);
        ad_keys_close();
        return -EIO;
    }
    /* A store made before a limit existed gets its column (0: the config's). */
    for (size_t i = 0; i < ad_nlimit_fields; i++) {
        snprintf(sql, sizeof(sql), "ALTER TABLE keys ADD COLUMN %s INTEGER NOT NULL DEFAULT 0;",
                 ad_limit_fields[i].name);
        if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK) {
            bool dup = msg && strstr(msg, "duplicate column");
            if (!dup)
                snprintf(why, len, "cannot set up key store '%s': %s", path, msg ? msg : "?");
            sqlite3_free(msg);
            msg = NULL;
            if (!dup) {
                ad_keys_close();
                return -EIO;
            }
        }
    }
    return 0;
}

void ad_keys_close(void)
{
    sqlite3_close(db);
    db = NULL;
}

int ad_keys_add(const char *name, const struct ad_limits *lim, struct ad_key *out, char *secret,
                size_t len)
{
    unsigned char h[32];
    char id[2 * ID_BYTES + 1], sec[2 * SECRET_BYTES + 1];
    if (len < 80 || strlen(name) >= sizeof(out->name))
        return -EINVAL;
    if (ad_random_hex(id, ID_BYTES) < 0 || ad_random_hex(sec, SECRET_BYTES) < 0)
        return -EIO;
    if (sha256(sec, h) < 0)
        return -EIO;
    char cols[1024], marks[256] = "", sql[2048];
    columns(cols, sizeof(cols), "");
    for (size_t i = 0; i < ad_nlimit_fields; i++)
        strcat(marks, ", ?");
    snprintf(sql, sizeof(sql), "INSERT INTO keys (id, hash, name, created%s) VALUES (?, ?, ?, ?%s)",
             cols, marks);
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
        return -EIO;
    int64_t now = time(NULL);
    sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
    sqlite3_bind_blob(st, 2, h, sizeof(h), SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 3, name, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 4, now);
    for (size_t i = 0; i < ad_nlimit_fields; i++)
        sqlite3_bind_int64(st, 5 + (int)i, (sqlite3_int64)ad_limit_get(lim, &ad_limit_fields[i]));
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE)
        return -EIO;
    memset(out, 0, sizeof(*out));
    snprintf(out->id, sizeof(out->id), "%s", id);
    snprintf(out->name, sizeof(out->name), "%s", name);
    out->created = now;
    out->lim = *lim;
    snprintf(secret, len, "alk_%s_%s", id, sec);
    OPENSSL_cleanse(sec, sizeof(sec));
    return 0;
}

/* Columns: id, name, created, revoked, the limits, then hash. */
static void row(sqlite3_stmt *st, struct ad_key *k)
{
    memset(k, 0, sizeof(*k));
    snprintf(k->id, sizeof(k->id), "%s", (const char *)sqlite3_column_text(st, 0));
    snprintf(k->name, sizeof(k->name), "%s", (const char *)sqlite3_column_text(st, 1));
    k->created = sqlite3_column_int64(st, 2);
    k->revoked = sqlite3_column_int64(st, 3) != 0;
    for (size_t i = 0; i < ad_nlimit_fields; i++) {
        sqlite3_int64 v = sqlite3_column_int64(st, 4 + (int)i);
        ad_limit_set(&k->lim, &ad_limit_fields[i], v > 0 ? (uint64_t)v : 0);
    }
}

static int prepare_select(const char *where, sqlite3_stmt **st)
{
    char cols[1024], sql[2048];
    columns(cols, sizeof(cols), "");
    snprintf(sql, sizeof(sql), "SELECT id, name, created, revoked%s, hash FROM keys %s", cols,
             where);
    return sqlite3_prepare_v2(db, sql, -1, st, NULL) == SQLITE_OK ? 0 : -EIO;
}

int ad_keys_list(void (*fn)(void *ctx, const struct ad_key *k), void *ctx)
{
    sqlite3_stmt *st;
    if (prepare_select("ORDER BY created, id", &st) < 0)
        return -EIO;
    int n = 0, rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        struct ad_key k;
        row(st, &k);
        fn(ctx, &k);
        n++;
    }
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? n : -EIO;
}

int ad_keys_revoke(const char *id)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db, "UPDATE keys SET revoked = 1 WHERE id = ?", -1, &st, NULL) !=
        SQLITE_OK)
        return -EIO;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE)
        return -EIO;
    return sqlite3_changes(db) ? 0 : -ENOENT;
}

/* The key of that id and its secret's stored hash: 0, or -ENOENT. */
static int by_id(const char *id, struct ad_key *out, unsigned char hash[32], bool *has_hash)
{
    pthread_mutex_lock(&db_lock);
    sqlite3_stmt *st;
    int r = -ENOENT;
    if (prepare_select("WHERE id = ?", &st) == 0) {
        sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
        if (sqlite3_step(st) == SQLITE_ROW) {
            row(st, out);
            int hc = 4 + (int)ad_nlimit_fields;
            const void *stored = sqlite3_column_blob(st, hc);
            *has_hash = stored && sqlite3_column_bytes(st, hc) == 32;
            if (*has_hash)
                memcpy(hash, stored, 32);
            r = 0;
        }
        sqlite3_finalize(st);
    }
    pthread_mutex_unlock(&db_lock);
    return r;
}

int ad_keys_check(const char *token, struct ad_key *out)
{
    /* alk_ + 12 hex + _ + 48 hex */
    if (strlen(token) != 4 + 2 * ID_BYTES + 1 + 2 * SECRET_BYTES || strncmp(token, "alk_", 4) ||
        token[4 + 2 * ID_BYTES] != '_')
        return -EACCES;
    char id[2 * ID_BYTES + 1];
    memcpy(id, token + 4, 2 * ID_BYTES);
    id[2 * ID_BYTES] = 0;
    unsigned char h[32], stored[32];
    bool has_hash = false;
    struct ad_key k;
    if (sha256(token + 4 + 2 * ID_BYTES + 1, h) < 0 || by_id(id, &k, stored, &has_hash) < 0 ||
        !has_hash || CRYPTO_memcmp(stored, h, 32) || k.revoked)
        return -EACCES;
    *out = k;
    return 0;
}

int ad_keys_get(const char *id, struct ad_key *out)
{
    unsigned char stored[32];
    bool has_hash;
    int r = by_id(id, out, stored, &has_hash);
    return r < 0 ? r : out->revoked ? -EACCES : 0;
}

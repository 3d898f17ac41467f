/* API keys in sqlite (WAL). A token is "alk_ID_SECRET": ID finds the row, only SHA-256(SECRET)
 * is stored, compared in constant time. A token is shown once, when made. */
#include "airlockd.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static sqlite3 *db;
static pthread_mutex_t db_lock = PTHREAD_MUTEX_INITIALIZER;

#define ID_BYTES 6
#define SECRET_BYTES 24

static void hex(const unsigned char *p, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", p[i]);
}

static int sha256(const char *s, unsigned char out[32])
{
    unsigned len = 0;
    return EVP_Digest(s, strlen(s), out, &len, EVP_sha256(), NULL) == 1 && len == 32 ? 0 : -EIO;
}

int ad_keys_open(const char *path, char *why, size_t len)
{
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
    char *msg = NULL;
    if (sqlite3_exec(db,
                     "PRAGMA journal_mode=WAL;"
                     "CREATE TABLE IF NOT EXISTS keys (id TEXT PRIMARY KEY, hash BLOB NOT NULL,"
                     " name TEXT NOT NULL, created INTEGER NOT NULL, revoked INTEGER NOT NULL"
                     " DEFAULT 0, max_sessions INTEGER NOT NULL DEFAULT 0,"
                     " max_memory_mib INTEGER NOT NULL DEFAULT 0);",
                     NULL, NULL, &msg) != SQLITE_OK) {
        snprintf(why, len, "cannot set up key store '%s': %s", path, msg ? msg : "?");
        sqlite3_free(msg);
        ad_keys_close();
        return -EIO;
    }
    return 0;
}

void ad_keys_close(void)
{
    sqlite3_close(db);
    db = NULL;
}

int ad_keys_add(const char *name, unsigned max_sessions, unsigned max_memory_mib,
                struct ad_key *out, char *secret, size_t len)
{
    unsigned char idb[ID_BYTES], sb[SECRET_BYTES], h[32];
    char id[2 * ID_BYTES + 1], sec[2 * SECRET_BYTES + 1];
    if (len < 80 || strlen(name) >= sizeof(out->name))
        return -EINVAL;
    if (RAND_bytes(idb, sizeof(idb)) != 1 || RAND_bytes(sb, sizeof(sb)) != 1)
        return -EIO;
    hex(idb, sizeof(idb), id);
    hex(sb, sizeof(sb), sec);
    if (sha256(sec, h) < 0)
        return -EIO;
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db,
                           "INSERT INTO keys (id, hash, name, created, max_sessions,"
                           " max_memory_mib) VALUES (?, ?, ?, ?, ?, ?)",
                           -1, &st, NULL) != SQLITE_OK)
        return -EIO;
    int64_t now = time(NULL);
    sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
    sqlite3_bind_blob(st, 2, h, sizeof(h), SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 3, name, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 4, now);
    sqlite3_bind_int64(st, 5, max_sessions);
    sqlite3_bind_int64(st, 6, max_memory_mib);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE)
        return -EIO;
    memset(out, 0, sizeof(*out));
    snprintf(out->id, sizeof(out->id), "%s", id);
    snprintf(out->name, sizeof(out->name), "%s", name);
    out->created = now;
    out->max_sessions = max_sessions;
    out->max_memory_mib = max_memory_mib;
    snprintf(secret, len, "alk_%s_%s", id, sec);
    OPENSSL_cleanse(sec, sizeof(sec));
    return 0;
}

static void row(sqlite3_stmt *st, struct ad_key *k)
{
    memset(k, 0, sizeof(*k));
    snprintf(k->id, sizeof(k->id), "%s", (const char *)sqlite3_column_text(st, 0));
    snprintf(k->name, sizeof(k->name), "%s", (const char *)sqlite3_column_text(st, 1));
    k->created = sqlite3_column_int64(st, 2);
    k->revoked = sqlite3_column_int64(st, 3) != 0;
    k->max_sessions = (unsigned)sqlite3_column_int64(st, 4);
    k->max_memory_mib = (unsigned)sqlite3_column_int64(st, 5);
}

int ad_keys_list(void (*fn)(void *ctx, const struct ad_key *k), void *ctx)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db,
                           "SELECT id, name, created, revoked, max_sessions, max_memory_mib"
                           " FROM keys ORDER BY created, id",
                           -1, &st, NULL) != SQLITE_OK)
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

int ad_keys_check(const char *token, struct ad_key *out)
{
    /* alk_ + 12 hex + _ + 48 hex */
    if (strlen(token) != 4 + 2 * ID_BYTES + 1 + 2 * SECRET_BYTES || strncmp(token, "alk_", 4) ||
        token[4 + 2 * ID_BYTES] != '_')
        return -EACCES;
    char id[2 * ID_BYTES + 1];
    memcpy(id, token + 4, 2 * ID_BYTES);
    id[2 * ID_BYTES] = 0;
    unsigned char h[32];
    if (sha256(token + 4 + 2 * ID_BYTES + 1, h) < 0)
        return -EACCES;
    pthread_mutex_lock(&db_lock);
    sqlite3_stmt *st;
    int r = -EACCES;
    if (sqlite3_prepare_v2(db,
                           "SELECT id, name, created, revoked, max_sessions, max_memory_mib, hash"
                           " FROM keys WHERE id = ?",
                           -1, &st, NULL) == SQLITE_OK) {
        sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
        if (sqlite3_step(st) == SQLITE_ROW) {
            struct ad_key k;
            row(st, &k);
            const void *stored = sqlite3_column_blob(st, 6);
            if (stored && sqlite3_column_bytes(st, 6) == 32 && !CRYPTO_memcmp(stored, h, 32) &&
                !k.revoked) {
                *out = k;
                r = 0;
            }
        }
        sqlite3_finalize(st);
    }
    pthread_mutex_unlock(&db_lock);
    return r;
}

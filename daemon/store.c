/* The daemon's sessions on disk: one row per session in the key store's SQLite file
 * (table sessions: id, owner, name, and the session's record as JSON, written whole on every
 * change), so that a restart, a crash or an upgrade takes every session back (sessions.c,
 * ad_sessions_init). The daemon's lock beside the store (KEYS_DB.lock, flocked, holding the pid):
 * one airlockd per state, a second one refuses naming the first. The keeper name the library
 * marks our sessions with is derived from the store's path, so daemons on other stores (tests,
 * other users) never take or reap each other's. */
#include "airlockd.h"
#include "util.h" /* al_state_dir */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

static sqlite3 *db;
static int lock_fd = -1;
static char keeper[64];

const char *ad_store_keeper(void)
{
    return keeper;
}

/* KEYS_DB.lock, flocked for the daemon's life; the pid of the holder in it. */
static int take_lock(const char *path, char *why, size_t len)
{
    char lock[600];
    snprintf(lock, sizeof(lock), "%s.lock", path);
    int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        snprintf(why, len, "cannot open '%s': %s", lock, strerror(errno));
        return -EIO;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        char pid[32] = "";
        ssize_t n = pread(fd, pid, sizeof(pid) - 1, 0);
        pid[n > 0 ? n : 0] = 0;
        pid[strcspn(pid, "\n")] = 0;
        snprintf(why, len, "another airlockd (pid %s) uses the state '%s'; stop it first",
                 pid[0] ? pid : "?", path);
        close(fd);
        return -EBUSY;
    }
    char pid[32];
    int n = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) < 0 || pwrite(fd, pid, (size_t)n, 0) != n) {
        /* the lock holds all the same; the pid is only for the message */
    }
    lock_fd = fd;
    return 0;
}

/* A keeper's note (keeper_note): the store's path into store, "" when it cannot be read;
 * whether there was one. */
static bool keeper_store(const char *path, char *store, size_t len)
{
    store[0] = '\0';
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return false;
    ssize_t n = read(fd, store, len - 1);
    close(fd);
    store[n > 0 ? n : 0] = '\0';
    return n > 0;
}

struct stale {
    char (*name)[64];
    size_t n;
};

static void keeper_in_use(void *ctx, const al_kept_info *k)
{
    struct stale *st = ctx;
    for (size_t i = 0; i < st->n; i++)
        if (!strcmp(st->name[i], k->keeper))
            st->name[i][0] = '\0';
}

/* The notes of stores that are gone (a test's temporary dir, a moved keys_db) and that keep no
 * VM: nothing would ever read them again. */
static void keeper_sweep(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct stale st = {0};
    size_t cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char file[4400], store[1024];
        if (strncmp(e->d_name, "airlockd-", 9) || !strcmp(e->d_name, keeper) ||
            strlen(e->d_name) >= sizeof(st.name[0]))
            continue;
        snprintf(file, sizeof(file), "%s/%s", dir, e->d_name);
        if (!keeper_store(file, store, sizeof(store)) || store[0] != '/' ||
            access(store, F_OK) == 0 || errno != ENOENT)
            continue;
        if (st.n == cap) {
            void *p = realloc(st.name, (cap ? 2 * cap : 16) * sizeof(st.name[0]));
            if (!p)
                break;
            st.name = p;
            cap = cap ? 2 * cap : 16;
        }
        snprintf(st.name[st.n++], sizeof(st.name[0]), "%s", e->d_name);
    }
    closedir(d);
    al_error err = {0};
    /* libvirt unreachable: nothing goes; a keeper with VMs still kept keeps the note naming it */
    if (st.n && al_session_kept(NULL, keeper_in_use, &st, &err) >= 0)
        for (size_t i = 0; i < st.n; i++)
            if (st.name[i][0]) {
                char file[4400];
                snprintf(file, sizeof(file), "%s/%s", dir, st.name[i]);
                unlink(file);
            }
    free(st.name);
}

/* STATE/keepers/KEEPER: the store a keeper's name stands for (the name is a hash of its path),
 * so that another daemon can say whose kept VMs it sees (ad_store_others). */
static void keeper_note(const char *store)
{
    char state[4096], dir[4200], file[4300];
    al_error err = {0};
    if (al_state_dir(state, sizeof(state), &err) < 0)
        return;
    snprintf(dir, sizeof(dir), "%s/keepers", state);
    snprintf(file, sizeof(file), "%s/%s", dir, keeper);
    if (mkdir(dir, 0700) < 0 && errno != EEXIST)
        return;
    int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return;
    if (write(fd, store, strlen(store)) < 0) {
        /* only for a message */
    }
    close(fd);
    keeper_sweep(dir);
}

struct others {
    char keeper[8][64];
    unsigned count[8];
    size_t n;
};

static void count_other(void *ctx, const al_kept_info *k)
{
    struct others *o = ctx;
    if (!strncmp(k->keeper, "airlockd-", 9) && strcmp(k->keeper, keeper) != 0) {
        size_t i = 0;
        while (i < o->n && strcmp(o->keeper[i], k->keeper))
            i++;
        if (i == o->n && o->n < 8)
            snprintf(o->keeper[o->n++], sizeof(o->keeper[0]), "%s", k->keeper);
        if (i < o->n)
            o->count[i]++;
    }
}

void ad_store_others(void)
{
    struct others o = {0};
    al_error err = {0};
    if (al_session_kept(NULL, count_other, &o, &err) <= 0)
        return;
    char state[4096] = "";
    bool have_state = al_state_dir(state, sizeof(state), &err) == 0;
    for (size_t i = 0; i < o.n; i++) {
        char path[4300], store[1024] = "";
        if (have_state) {
            snprintf(path, sizeof(path), "%s/keepers/%s", state, o.keeper[i]);
            keeper_store(path, store, sizeof(store));
        }
        ad_log("%u session%s kept by another airlockd (%s%s) %s running or paused here: "
               "that daemon takes them back at its start; 'airlock gc --kept %s' ends them",
               o.count[i], o.count[i] == 1 ? "" : "s", store[0] ? "its keys_db " : "keeper ",
               store[0] ? store : o.keeper[i], o.count[i] == 1 ? "is" : "are", o.keeper[i]);
    }
}

int ad_store_open(const char *path, char *why, size_t len)
{
    int r = take_lock(path, why, len);
    if (r < 0)
        return r;
    char real[4096];
    if (!realpath(path, real))
        snprintf(real, sizeof(real), "%s", path);
    unsigned char d[32];
    unsigned dl = 0;
    EVP_Digest(real, strlen(real), d, &dl, EVP_sha256(), NULL);
    snprintf(keeper, sizeof(keeper), "airlockd-%02x%02x%02x%02x%02x%02x%02x%02x", d[0], d[1], d[2],
             d[3], d[4], d[5], d[6], d[7]);
    keeper_note(real);
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_FULLMUTEX, NULL) !=
        SQLITE_OK) {
        snprintf(why, len, "cannot open '%s': %s", path, db ? sqlite3_errmsg(db) : "no memory");
        ad_store_close();
        return -EIO;
    }
    sqlite3_busy_timeout(db, 5000);
    char *msg = NULL;
    if (sqlite3_exec(db,
                     "CREATE TABLE IF NOT EXISTS sessions (id TEXT PRIMARY KEY, owner TEXT NOT "
                     "NULL, name TEXT, record TEXT NOT NULL);",
                     NULL, NULL, &msg) != SQLITE_OK) {
        snprintf(why, len, "cannot set up the sessions in '%s': %s", path, msg ? msg : "?");
        sqlite3_free(msg);
        ad_store_close();
        return -EIO;
    }
    return 0;
}

void ad_store_close(void)
{
    sqlite3_close(db);
    db = NULL;
    if (lock_fd >= 0)
        close(lock_fd);
    lock_fd = -1;
}

int ad_store_put(const char *id, const char *owner, const char *name, const cJSON *record)
{
    if (!db)
        return -ENOTCONN;
    _cleanup_free_ char *text = cJSON_PrintUnformatted(record);
    sqlite3_stmt *st;
    if (!text || sqlite3_prepare_v2(db,
                                    "INSERT OR REPLACE INTO sessions (id, owner, name, record) "
                                    "VALUES (?, ?, ?, ?)",
                                    -1, &st, NULL) != SQLITE_OK)
        return -EIO;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, owner, -1, SQLITE_TRANSIENT);
    if (name && name[0])
        sqlite3_bind_text(st, 3, name, -1, SQLITE_TRANSIENT);
    else
        sqlite3_bind_null(st, 3);
    sqlite3_bind_text(st, 4, text, -1, SQLITE_TRANSIENT);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? 0 : -EIO;
}

void ad_store_del(const char *id)
{
    sqlite3_stmt *st;
    if (!db ||
        sqlite3_prepare_v2(db, "DELETE FROM sessions WHERE id = ?", -1, &st, NULL) != SQLITE_OK)
        return;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
    sqlite3_step(st);
    sqlite3_finalize(st);
}

int ad_store_each(void (*fn)(void *ctx, const char *id, const char *owner, const cJSON *record),
                  void *ctx)
{
    sqlite3_stmt *st;
    if (!db || sqlite3_prepare_v2(db, "SELECT id, owner, record FROM sessions", -1, &st, NULL) !=
                   SQLITE_OK)
        return -EIO;
    /* All read first: fn may write the rows (a REPLACE would come round again). */
    _cleanup_cjson_ cJSON *rows = cJSON_CreateArray();
    while (rows && sqlite3_step(st) == SQLITE_ROW) {
        const char *id = (const char *)sqlite3_column_text(st, 0);
        const char *owner = (const char *)sqlite3_column_text(st, 1);
        const char *text = (const char *)sqlite3_column_text(st, 2);
        cJSON *rec = text ? cJSON_Parse(text) : NULL;
        /* Our own file, 0600; still read as data: a row that is not a record is dropped. */
        if (!id || !owner || !cJSON_IsObject(rec) || strlen(id) >= 64 || strlen(owner) >= 40) {
            cJSON_Delete(rec);
            continue;
        }
        cJSON *row = cJSON_CreateObject();
        cJSON_AddStringToObject(row, "id", id);
        cJSON_AddStringToObject(row, "owner", owner);
        cJSON_AddItemToObject(row, "record", rec);
        cJSON_AddItemToArray(rows, row);
    }
    sqlite3_finalize(st);
    int n = 0;
    const cJSON *row;
    cJSON_ArrayForEach(row, rows)
    {
        fn(ctx, cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(row, "id")),
           cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(row, "owner")),
           cJSON_GetObjectItemCaseSensitive(row, "record"));
        n++;
    }
    return n;
}

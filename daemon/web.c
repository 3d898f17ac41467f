/* The web page's side of the daemon: its files (embedded at build time from daemon/web, see
 * embed.py) and its sign-in. Signing in with an API key gives a random token in an HttpOnly,
 * SameSite=Strict cookie; the daemon keeps token -> key in memory only (a restart signs
 * everyone out) and checks the key again on every request, so a revoked key ends its web
 * sessions at once. */
#include "airlockd.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <string.h>

struct ad_web_entry {
    const char *path;
    const unsigned char *data;
    size_t len;
    const char *type;
};
extern const struct ad_web_entry ad_web_files[];

const char *ad_web_file(const char *path, size_t *len, const char **type)
{
    for (const struct ad_web_entry *e = ad_web_files; e->path; e++)
        if (!strcmp(e->path, path)) {
            *len = e->len;
            *type = e->type;
            return (const char *)e->data;
        }
    return NULL;
}

/* Signed-in browsers at once; a key holds at most WEB_SESSIONS_PER_KEY of them, its own oldest
 * making room for its next, so that one key's sign-ins never sign another key's browsers out;
 * a table full of other keys' live sign-ins refuses a new one. */
#define WEB_SESSIONS_MAX 1024
#define WEB_SESSIONS_PER_KEY 16
#define WEB_SESSION_S (12 * 3600)

struct web_session {
    char token[65]; /* hex of 32 random bytes; "" when free */
    char key[256];
    char scope[160]; /* "": the page's sign-in; "ID:PORT": one session's port, host-routed */
    uint64_t expires_ms;
};
static struct web_session web[WEB_SESSIONS_MAX];
static pthread_mutex_t web_lock = PTHREAD_MUTEX_INITIALIZER;

int ad_web_login(const char *api_key, const char *scope, char *token, size_t len)
{
    struct ad_key k;
    if (strlen(api_key) >= sizeof(web[0].key) || strlen(scope) >= sizeof(web[0].scope) ||
        ad_keys_check(api_key, &k) < 0)
        return -EACCES;
    if (len < 65 || ad_random_hex(token, 32) < 0)
        return -EIO;
    uint64_t now = ad_now_ms();
    pthread_mutex_lock(&web_lock);
    struct web_session *w = NULL, *own_oldest = NULL;
    unsigned own = 0;
    for (size_t i = 0; i < WEB_SESSIONS_MAX; i++) {
        struct web_session *x = &web[i];
        bool live = x->token[0] && x->expires_ms >= now;
        if (!live) {
            if (!w)
                w = x;
            continue;
        }
        /* a key's port cookies make room among themselves, never its page's sign-ins */
        if (!strcmp(x->key, api_key) && !x->scope[0] == !scope[0]) {
            own++;
            if (!own_oldest || x->expires_ms < own_oldest->expires_ms)
                own_oldest = x;
        }
    }
    if (own >= WEB_SESSIONS_PER_KEY)
        w = own_oldest;
    if (!w) {
        pthread_mutex_unlock(&web_lock);
        return -EBUSY;
    }
    snprintf(w->token, sizeof(w->token), "%s", token);
    snprintf(w->key, sizeof(w->key), "%s", api_key);
    snprintf(w->scope, sizeof(w->scope), "%s", scope);
    w->expires_ms = now + WEB_SESSION_S * 1000ull;
    pthread_mutex_unlock(&web_lock);
    return 0;
}

static struct web_session *find(const char *token)
{
    if (strlen(token) != 64)
        return NULL;
    uint64_t now = ad_now_ms();
    for (size_t i = 0; i < WEB_SESSIONS_MAX; i++)
        if (web[i].token[0] && web[i].expires_ms >= now && !CRYPTO_memcmp(web[i].token, token, 64))
            return &web[i];
    return NULL;
}

void ad_web_logout(const char *token)
{
    pthread_mutex_lock(&web_lock);
    struct web_session *w = find(token);
    if (w)
        OPENSSL_cleanse(w, sizeof(*w));
    pthread_mutex_unlock(&web_lock);
}

const char *ad_web_key(const char *token, const char *scope, char *buf, size_t len)
{
    pthread_mutex_lock(&web_lock);
    struct web_session *w = find(token);
    const char *r = NULL;
    if (w && !strcmp(w->scope, scope) && strlen(w->key) < len) {
        snprintf(buf, len, "%s", w->key);
        r = buf;
    }
    pthread_mutex_unlock(&web_lock);
    return r;
}

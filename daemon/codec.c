/* airlockd's small encoders, apart from HTTP (e2bwire.c and its fuzz target use them):
 * base64 through libcrypto, guest text as valid UTF-8 through the library. */
#include "airlockd.h"

#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

char *ad_base64(const void *data, size_t len)
{
    char *b64 = malloc(4 * ((len + 2) / 3) + 1);
    if (b64)
        EVP_EncodeBlock((unsigned char *)b64, data, (int)len);
    return b64;
}

uint8_t *ad_base64_decode(const char *b64, size_t *len)
{
    size_t n = strlen(b64);
    if (n % 4 || n > (size_t)INT32_MAX)
        return NULL;
    uint8_t *out = malloc(n / 4 * 3 + 1);
    if (!out)
        return NULL;
    int got = n ? EVP_DecodeBlock(out, (const unsigned char *)b64, (int)n) : 0;
    if (got < 0) {
        free(out);
        return NULL;
    }
    /* EVP_DecodeBlock counts the padding's bytes too */
    size_t pad = n && b64[n - 1] == '=' ? 1 + (n > 1 && b64[n - 2] == '=') : 0;
    *len = (size_t)got - pad;
    return out;
}

bool ad_json_add_text(cJSON *o, const char *key, const char *s)
{
    bool lossy = false;
    char *out = al_utf8_repair((const uint8_t *)s, strlen(s), &lossy);
    cJSON_AddStringToObject(o, key, out ? out : "");
    free(out);
    return lossy;
}

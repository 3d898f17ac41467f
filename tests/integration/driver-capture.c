/* Keeping a run's output for the integration drivers; see capture.h. */
#include "driver-capture.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int capture_output(void *ctx, int stream, const uint8_t *data, size_t len)
{
    struct capture *c = ctx;
    if (stream < 1 || stream > 2)
        return 0;
    size_t room = CAPTURE_MAX - c->len[stream];
    if (len > room)
        len = room;
    char *p = realloc(c->buf[stream], c->len[stream] + len + 1);
    if (!p)
        return -ENOMEM;
    memcpy(p + c->len[stream], data, len);
    c->len[stream] += len;
    p[c->len[stream]] = '\0';
    c->buf[stream] = p;
    return 0;
}

void capture_free(struct capture *c)
{
    for (int i = 0; i < 3; i++) {
        free(c->buf[i]);
        c->buf[i] = NULL;
        c->len[i] = 0;
    }
}

double capture_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

const char *json_str(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

double json_num(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

void capture_add_result(cJSON *out, const al_exec_result *res)
{
    cJSON_AddNumberToObject(out, "how", res->how);
    cJSON_AddNumberToObject(out, "value", res->value);
    cJSON_AddBoolToObject(out, "waited_input", res->waited_input);
    cJSON_AddBoolToObject(out, "timed_out", res->timed_out);
    if (res->results.have_count)
        cJSON_AddNumberToObject(out, "execution_count", res->results.execution_count);
    cJSON_AddBoolToObject(out, "raised", res->results.error);
}

int capture_result(void *ctx, const al_result *r)
{
    cJSON *list = ctx;
    char *text = al_result_json(r);
    cJSON *o = text ? cJSON_Parse(text) : NULL;
    free(text);
    if (!o)
        return -ENOMEM;
    cJSON_AddItemToArray(list, o);
    return 0;
}

void capture_add_output(cJSON *out, struct capture *c)
{
    cJSON_AddStringToObject(out, "stdout", c->buf[1] ? c->buf[1] : "");
    cJSON_AddStringToObject(out, "stderr", c->buf[2] ? c->buf[2] : "");
    capture_free(c);
}

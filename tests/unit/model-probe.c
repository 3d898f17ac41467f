/* Runs one al_model_chat and prints what happened as one JSON object, for test-model.py:
 *   {"rc": 0 | -errno, "errname": "EPROTO", "msg": "...", "pieces": ["..."],
 *    "pieces_whole_utf8": true, "tool_starts": ["execute"], "reply": {...}, "message": {...}}
 *
 * model-probe --api openai|anthropic|responses --base URL --model NAME [--key KEY]
 *             --messages FILE [--tools FILE] [--retries N] [--timeout S]
 *             [--connect-timeout S] [--max-tokens N] [--temperature T]
 *             [--cancel-on-text | --cancel-after-ms MS] [--verbose] */
#include "model.h"

#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct seen {
    cJSON *pieces;
    cJSON *starts;
    bool whole_utf8;
    bool cancel_on_text;
    int cancel_wfd;
};

/* Whether s holds whole, well-formed UTF-8 characters only. */
static bool whole_utf8(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        size_t need = s[i] < 0x80             ? 1
                      : (s[i] & 0xE0) == 0xC0 ? 2
                      : (s[i] & 0xF0) == 0xE0 ? 3
                      : (s[i] & 0xF8) == 0xF0 ? 4
                                              : 0;
        if (!need || i + need > n)
            return false;
        for (size_t k = 1; k < need; k++)
            if ((s[i + k] & 0xC0) != 0x80)
                return false;
        i += need;
    }
    return true;
}

static void on_text(void *ctx, const char *s, size_t n)
{
    struct seen *v = ctx;
    if (!whole_utf8((const unsigned char *)s, n))
        v->whole_utf8 = false;
    char *copy = strndup(s, n);
    cJSON_AddItemToArray(v->pieces, cJSON_CreateString(copy ? copy : ""));
    free(copy);
    if (v->cancel_on_text && v->cancel_wfd >= 0) {
        if (write(v->cancel_wfd, "x", 1) != 1)
            perror("write");
        v->cancel_wfd = -1;
    }
}

static void on_tool_start(void *ctx, const char *name)
{
    struct seen *v = ctx;
    cJSON_AddItemToArray(v->starts, cJSON_CreateString(name));
}

struct timer {
    int fd;
    long ms;
};

static void *cancel_later(void *arg)
{
    struct timer *t = arg;
    struct timespec ts = {t->ms / 1000, (t->ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
    if (write(t->fd, "x", 1) != 1)
        perror("write");
    return NULL;
}

static cJSON *read_json(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        exit(2);
    }
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    cJSON *j = cJSON_Parse(buf);
    if (!j) {
        fprintf(stderr, "%s: not JSON\n", path);
        exit(2);
    }
    return j;
}

static void print_notice(void *ctx, const char *line)
{
    (void)ctx;
    fprintf(stderr, "%s\n", line);
}

int main(int argc, char **argv)
{
    al_model_cfg cfg = {.cancel_fd = -1};
    const char *messages_path = NULL, *tools_path = NULL;
    bool cancel_on_text = false;
    long cancel_after_ms = -1;
    static const struct option opts[] = {
        {"api", required_argument, NULL, 'a'},
        {"base", required_argument, NULL, 'b'},
        {"model", required_argument, NULL, 'm'},
        {"key", required_argument, NULL, 'k'},
        {"messages", required_argument, NULL, 'M'},
        {"tools", required_argument, NULL, 'T'},
        {"retries", required_argument, NULL, 'r'},
        {"timeout", required_argument, NULL, 't'},
        {"connect-timeout", required_argument, NULL, 'c'},
        {"max-tokens", required_argument, NULL, 'x'},
        {"temperature", required_argument, NULL, 'p'},
        {"cancel-on-text", no_argument, NULL, 'C'},
        {"cancel-after-ms", required_argument, NULL, 'A'},
        {"verbose", no_argument, NULL, 'v'},
        {0},
    };
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'a':
            cfg.api = (enum al_api)al_api_parse(optarg);
            if (al_api_parse(optarg) < 0) {
                fprintf(stderr, "model-probe: unknown API %s\n", optarg);
                return 2;
            }
            break;
        case 'b':
            cfg.api_base = optarg;
            break;
        case 'm':
            cfg.model = optarg;
            break;
        case 'k':
            cfg.api_key = optarg;
            break;
        case 'M':
            messages_path = optarg;
            break;
        case 'T':
            tools_path = optarg;
            break;
        case 'r':
            cfg.retries = (unsigned)atoi(optarg);
            break;
        case 't':
            cfg.timeout_s = (unsigned)atoi(optarg);
            break;
        case 'c':
            cfg.connect_timeout_s = (unsigned)atoi(optarg);
            break;
        case 'x':
            cfg.max_tokens = (unsigned)atoi(optarg);
            break;
        case 'p':
            cfg.temperature = atof(optarg);
            cfg.has_temperature = true;
            break;
        case 'C':
            cancel_on_text = true;
            break;
        case 'A':
            cancel_after_ms = atol(optarg);
            break;
        case 'v':
            cfg.notice = print_notice;
            break;
        default:
            return 2;
        }
    }
    if (!messages_path) {
        fprintf(stderr, "model-probe: --messages is required\n");
        return 2;
    }
    cJSON *messages = read_json(messages_path);
    cJSON *tools = tools_path ? read_json(tools_path) : NULL;

    int pfd[2] = {-1, -1};
    pthread_t timer_thread;
    struct timer t = {-1, cancel_after_ms};
    if (cancel_on_text || cancel_after_ms >= 0) {
        if (pipe(pfd) < 0) {
            perror("pipe");
            return 2;
        }
        cfg.cancel_fd = pfd[0];
        t.fd = pfd[1];
        if (cancel_after_ms >= 0 && pthread_create(&timer_thread, NULL, cancel_later, &t) != 0)
            return 2;
    }

    struct seen v = {cJSON_CreateArray(), cJSON_CreateArray(), true, cancel_on_text, pfd[1]};
    al_model_stream_cb cb = {on_text, on_tool_start, &v};
    al_model_reply reply = {0};
    al_error err = {0};
    int r = al_model_chat(&cfg, messages, tools, &cb, &reply, &err);

    cJSON *res = cJSON_CreateObject();
    cJSON_AddNumberToObject(res, "rc", r);
    const char *name = r < 0 ? strerrorname_np(-r) : NULL;
    cJSON_AddStringToObject(res, "errname", name ? name : "");
    cJSON_AddStringToObject(res, "msg", err.msg);
    cJSON_AddItemToObject(res, "pieces", v.pieces);
    cJSON_AddBoolToObject(res, "pieces_whole_utf8", v.whole_utf8);
    cJSON_AddItemToObject(res, "tool_starts", v.starts);
    if (r == 0) {
        cJSON *rj = cJSON_AddObjectToObject(res, "reply");
        cJSON_AddStringToObject(rj, "text", reply.text);
        cJSON *calls = cJSON_AddArrayToObject(rj, "calls");
        for (size_t i = 0; i < reply.ncalls; i++) {
            cJSON *c = cJSON_CreateObject();
            cJSON_AddStringToObject(c, "id", reply.calls[i].id);
            cJSON_AddStringToObject(c, "name", reply.calls[i].name);
            cJSON_AddStringToObject(c, "arguments", reply.calls[i].arguments);
            if (reply.calls[i].kind)
                cJSON_AddStringToObject(c, "kind", reply.calls[i].kind);
            cJSON_AddItemToArray(calls, c);
        }
        cJSON_AddNumberToObject(rj, "input_tokens", reply.input_tokens);
        cJSON_AddNumberToObject(rj, "output_tokens", reply.output_tokens);
        cJSON_AddStringToObject(rj, "finish", reply.finish);
        cJSON_AddItemToObject(res, "message", al_model_reply_message(&reply));
    }
    char *s = cJSON_PrintUnformatted(res);
    printf("%s\n", s);
    free(s);
    cJSON_Delete(res);
    al_model_reply_free(&reply);
    if (cancel_after_ms >= 0)
        pthread_join(timer_thread, NULL);
    if (pfd[0] >= 0) {
        close(pfd[0]);
        close(pfd[1]);
    }
    cJSON_Delete(messages);
    cJSON_Delete(tools);
    return 0;
}

/* Drives one checkpoint-enabled session for tests/integration/test_checkpoint.py: one JSON
 * request per line on stdin, one JSON answer per line on stdout.
 *
 *   checkpoint-driver IMAGE [MEMORY_MIB]
 *
 * The first line out is {"session": NAME}. Requests: {"op": "exec", "code", "lang", "timeout",
 * "kernel"},
 * {"op": "create", "name"}, {"op": "list"}, {"op": "find", "key"}, {"op": "rollback", "id"},
 * {"op": "delete", "id"}, {"op": "recover"}, {"op": "wants", "lang", "code", "policy"},
 * {"op": "net"} (the session's network requests, al_net_requests). Each answer has "r" (the
 * call's return) and, on failure, "error". CHECKPOINT_DRIVER_NET=HOST,...: the session gets
 * network to those hosts (--net allow=...). */
#include "airlock.h"
#include "airlock/policy.h"
#include "airlock/text.h"
#include "driver-capture.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One request line. */
#define LINE_MAX_BYTES (1u << 20)

static cJSON *info_json(const al_checkpoint_info *c)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", c->id);
    cJSON_AddStringToObject(o, "name", c->name);
    cJSON_AddNumberToObject(o, "created", (double)c->created);
    cJSON_AddNumberToObject(o, "state_bytes", (double)c->state_bytes);
    cJSON_AddNumberToObject(o, "disk_bytes", (double)c->disk_bytes);
    cJSON_AddNumberToObject(o, "save_ms", c->save_ms);
    cJSON_AddBoolToObject(o, "current", c->current);
    return o;
}

static void add_info(void *ctx, const al_checkpoint_info *c)
{
    cJSON_AddItemToArray(ctx, info_json(c));
}

static void add_request(void *ctx, const al_net_request *q)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "method", q->method);
    cJSON_AddStringToObject(o, "host", q->host);
    cJSON_AddNumberToObject(o, "port", q->port);
    cJSON_AddNumberToObject(o, "status", q->status);
    cJSON_AddNumberToObject(o, "bytes", (double)q->bytes);
    cJSON_AddBoolToObject(o, "allowed", q->allowed);
    cJSON_AddStringToObject(o, "why", q->why);
    cJSON_AddItemToArray(ctx, o);
}

static void op_exec(al_session *s, const cJSON *req, cJSON *out, al_error *err)
{
    struct capture c = {0};
    const char *argv[] = {json_str(req, "code") ? json_str(req, "code") : "", NULL};
    al_exec_opts o = {
        .struct_size = sizeof(al_exec_opts),
        .argv = argv,
        .lang = json_str(req, "lang") ? json_str(req, "lang") : "sh",
        .timeout_ms = (unsigned)json_num(req, "timeout"),
        .kernel = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(req, "kernel")),
        .stdin_fd = -1,
        .stdout_fd = -1,
        .stderr_fd = -1,
        .output = capture_output,
        .output_ctx = &c,
    };
    al_exec_result res = AL_EXEC_RESULT_INIT;
    int r = al_exec(s, &o, &res, err);
    cJSON_AddNumberToObject(out, "r", r);
    if (r == 0)
        capture_add_result(out, &res);
    capture_add_output(out, &c);
}

static void handle(al_session *s, const cJSON *req, cJSON *out)
{
    al_error err = {0};
    const char *op = json_str(req, "op");
    int r = -EINVAL;
    double t0 = capture_now_ms();
    if (!op) {
        r = -EINVAL;
        snprintf(err.msg, sizeof(err.msg), "no op");
    } else if (!strcmp(op, "exec")) {
        op_exec(s, req, out, &err);
        r = (int)json_num(out, "r");
    } else if (!strcmp(op, "create")) {
        al_checkpoint_info info = AL_CHECKPOINT_INFO_INIT;
        r = al_checkpoint_create(s, json_str(req, "name"), &info, &err);
        if (r > 0)
            cJSON_AddItemToObject(out, "info", info_json(&info));
    } else if (!strcmp(op, "list")) {
        cJSON *list = cJSON_AddArrayToObject(out, "list");
        r = al_checkpoint_list(s, add_info, list, &err);
    } else if (!strcmp(op, "find")) {
        al_checkpoint_info info = AL_CHECKPOINT_INFO_INIT;
        r = al_checkpoint_find(s, json_str(req, "key") ? json_str(req, "key") : "", &info, &err);
        if (r == 0)
            cJSON_AddItemToObject(out, "info", info_json(&info));
    } else if (!strcmp(op, "rollback")) {
        r = al_checkpoint_rollback(s, (uint32_t)json_num(req, "id"), &err);
    } else if (!strcmp(op, "delete")) {
        r = al_checkpoint_delete(s, (uint32_t)json_num(req, "id"), &err);
    } else if (!strcmp(op, "recover")) {
        uint32_t id = 0;
        r = al_checkpoint_recover(s, &id, &err);
        cJSON_AddNumberToObject(out, "restored", id);
    } else if (!strcmp(op, "wants")) {
        enum al_checkpoint_policy p = AL_CHECKPOINT_AUTO;
        r = al_checkpoint_policy_parse(json_str(req, "policy"), &p, &err);
        if (r == 0)
            r = al_checkpoint_policy_wants(json_str(req, "lang"), json_str(req, "code"), p);
    } else if (!strcmp(op, "net")) {
        cJSON *list = cJSON_AddArrayToObject(out, "requests");
        r = al_net_requests(s, NULL, add_request, list, &err);
    } else {
        snprintf(err.msg, sizeof(err.msg), "unknown op '%.64s'", op);
    }
    cJSON_DeleteItemFromObject(out, "r");
    cJSON_AddNumberToObject(out, "r", r);
    cJSON_AddNumberToObject(out, "ms", capture_now_ms() - t0);
    if (r < 0)
        cJSON_AddStringToObject(out, "error", err.msg);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: checkpoint-driver IMAGE [MEMORY_MIB]\n");
        return 2;
    }
    al_session_opts opts = {
        .struct_size = sizeof(al_session_opts),
        .image = argv[1],
        .memory_mib = argc > 2 ? (unsigned)atoi(argv[2]) : 0,
        .quiet = true,
        .checkpoints = true,
        /* CHECKPOINT_DRIVER_CONSOLE=1: the guest console on stderr at close (debugging). */
        .console_to = getenv("CHECKPOINT_DRIVER_CONSOLE") && *getenv("CHECKPOINT_DRIVER_CONSOLE")
                          ? stderr
                          : NULL,
    };
    al_session *s = NULL;
    al_error err = {0};
    char **allow = NULL;
    const char *net = getenv("CHECKPOINT_DRIVER_NET");
    if (net && *net && al_net_allow_parse(net, &allow, &err) < 0) {
        fprintf(stderr, "checkpoint-driver: %s\n", err.msg);
        return 2;
    }
    opts.net.allow = (const char *const *)allow;
    if (al_session_open(&opts, &s, &err) < 0) {
        fprintf(stderr, "checkpoint-driver: %s\n", err.msg);
        return 1;
    }
    printf("{\"session\": \"%s\"}\n", al_session_name(s));
    fflush(stdout);
    char *line = malloc(LINE_MAX_BYTES);
    while (line && fgets(line, LINE_MAX_BYTES, stdin)) {
        cJSON *req = cJSON_Parse(line);
        cJSON *out = cJSON_CreateObject();
        if (req)
            handle(s, req, out);
        else
            cJSON_AddStringToObject(out, "error", "bad JSON");
        char *text = cJSON_PrintUnformatted(out);
        printf("%s\n", text ? text : "{}");
        fflush(stdout);
        free(text);
        cJSON_Delete(out);
        cJSON_Delete(req);
    }
    free(line);
    al_session_close(s);
    al_net_allow_free(allow);
    return 0;
}

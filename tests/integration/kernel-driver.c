/* Drives one session for tests/integration/test_kernels.py, so that several runs share the
 * guest's language kernels: one JSON request per line on stdin, one JSON answer per line on
 * stdout.
 *
 *   kernel-driver IMAGE
 *
 * Requests: {"op": "exec", "lang", "code", "kernel", "stdin" (absent: none), "input_wait_ms",
 * "interrupt_on_wait", "timeout_ms", "sigint_after_ms" (send SIGINT that long after the start)}
 * answered {"r", "how", "value", "stdout", "stderr", "waited_input", "timed_out", "ms",
 * "results" (al_result_json's objects, in order), "execution_count", "raised"}; "env" (a list
 * of KEY=VALUE) is the run's environment, "context" its kernel context; {"op": "stop", "lang",
 * "context"} answered {"r"}; {"op": "list"} answered {"r", "list"};
 * {"op": "get", "guest", "host"} answered {"r"}. On failure an answer also has "error". */
#include "airlock.h"
#include "driver-capture.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* One request line. */
#define LINE_MAX_BYTES (1u << 20)

/* The session's cancel pipe: a byte SIGINT written into it reaches the running program. */
static int cancel_pipe[2] = {-1, -1};

struct later {
    unsigned ms;
};

static void *sigint_later(void *arg)
{
    struct later *l = arg;
    struct timespec ts = {l->ms / 1000, (long)(l->ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    uint8_t b = SIGINT;
    if (write(cancel_pipe[1], &b, 1) != 1)
        perror("kernel-driver: cancel pipe");
    return NULL;
}

static unsigned num(const cJSON *req, const char *key)
{
    double v = json_num(req, key);
    return v > 0 ? (unsigned)v : 0;
}

static cJSON *do_exec(al_session *s, const cJSON *req)
{
    cJSON *ans = cJSON_CreateObject();
    const char *lang = json_str(req, "lang");
    const char *code = json_str(req, "code");
    const char *in = json_str(req, "stdin");
    const char *argv[] = {code ? code : "", NULL};
    struct capture cap = {{NULL}, {0}};
    cJSON *results = cJSON_CreateArray();
    const cJSON *envj = cJSON_GetObjectItemCaseSensitive(req, "env");
    const char *env[129] = {NULL};
    int nenv = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, envj)
    {
        if (cJSON_IsString(e) && nenv < 128)
            env[nenv++] = e->valuestring;
    }
    al_exec_opts o = {.struct_size = sizeof(al_exec_opts),
                      .argv = argv,
                      .lang = lang,
                      .stdin_fd = -1,
                      .stdout_fd = -1,
                      .stderr_fd = -1,
                      .output = capture_output,
                      .output_ctx = &cap,
                      .result = capture_result,
                      .result_ctx = results,
                      .env = nenv ? env : NULL,
                      .context = json_str(req, "context")};
    o.kernel = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(req, "kernel"));
    o.interrupt_on_wait = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(req, "interrupt_on_wait"));
    o.input_wait_ms = num(req, "input_wait_ms");
    o.timeout_ms = num(req, "timeout_ms");
    int p[2] = {-1, -1};
    if (in) {
        /* Small inputs: the pipe holds them all, then EOF. */
        if (pipe(p) < 0 || write(p[1], in, strlen(in)) != (ssize_t)strlen(in))
            abort();
        close(p[1]);
        o.stdin_fd = p[0];
    }
    struct later l = {num(req, "sigint_after_ms")};
    pthread_t t;
    if (l.ms && pthread_create(&t, NULL, sigint_later, &l) != 0)
        abort();
    al_error err = {0};
    al_exec_result res = AL_EXEC_RESULT_INIT;
    double t0 = capture_now_ms();
    int r = al_exec(s, &o, &res, &err);
    cJSON_AddNumberToObject(ans, "ms", capture_now_ms() - t0);
    if (l.ms)
        pthread_join(t, NULL);
    if (p[0] >= 0)
        close(p[0]);
    cJSON_AddNumberToObject(ans, "r", r);
    if (r < 0) {
        cJSON_AddStringToObject(ans, "error", err.msg);
    } else {
        capture_add_result(ans, &res);
    }
    capture_add_output(ans, &cap);
    cJSON_AddItemToObject(ans, "results", results);
    return ans;
}

static cJSON *do_kernel_op(al_session *s, const cJSON *req, bool list)
{
    cJSON *ans = cJSON_CreateObject();
    al_error err = {0};
    char buf[4096];
    int r = list ? al_kernel_list(s, buf, sizeof(buf), &err)
                 : al_kernel_stop(s, json_str(req, "lang"), json_str(req, "context"), &err);
    cJSON_AddNumberToObject(ans, "r", r);
    if (r < 0)
        cJSON_AddStringToObject(ans, "error", err.msg);
    else if (list)
        cJSON_AddStringToObject(ans, "list", buf);
    return ans;
}

static cJSON *do_get(al_session *s, const cJSON *req)
{
    cJSON *ans = cJSON_CreateObject();
    const char *guest = json_str(req, "guest");
    const char *host = json_str(req, "host");
    al_error err = {0};
    int r = guest && host ? al_file_get(s, guest, host, &err) : -EINVAL;
    cJSON_AddNumberToObject(ans, "r", r);
    if (r < 0)
        cJSON_AddStringToObject(ans, "error", err.msg);
    return ans;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: kernel-driver IMAGE\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    if (pipe2(cancel_pipe, O_CLOEXEC) < 0)
        return 1;
    /* The guest's console goes to stderr when the session closes: what a failure needs. */
    al_session_opts so = {.struct_size = sizeof(al_session_opts),
                          .image = argv[1],
                          .quiet = true,
                          .cancel_fd = cancel_pipe[0],
                          .console_to = stderr};
    al_session *s = NULL;
    al_error err = {0};
    if (al_session_open(&so, &s, &err) < 0) {
        fprintf(stderr, "kernel-driver: %s\n", err.msg);
        return 1;
    }
    printf("{\"session\": \"%s\", \"languages\": \"%s\", \"restored\": %s}\n", al_session_name(s),
           al_session_languages(s), al_session_restored(s) ? "true" : "false");
    fflush(stdout);
    char *line = malloc(LINE_MAX_BYTES);
    while (line && fgets(line, LINE_MAX_BYTES, stdin)) {
        cJSON *req = cJSON_Parse(line);
        const char *op = json_str(req, "op");
        cJSON *ans = !op                   ? cJSON_CreateObject()
                     : !strcmp(op, "exec") ? do_exec(s, req)
                     : !strcmp(op, "get")  ? do_get(s, req)
                     : !strcmp(op, "stop") ? do_kernel_op(s, req, false)
                     : !strcmp(op, "list") ? do_kernel_op(s, req, true)
                                           : cJSON_CreateObject();
        if (!op ||
            (strcmp(op, "exec") && strcmp(op, "get") && strcmp(op, "stop") && strcmp(op, "list")))
            cJSON_AddStringToObject(ans, "error", "unknown request");
        char *text = cJSON_PrintUnformatted(ans);
        printf("%s\n", text);
        fflush(stdout);
        free(text);
        cJSON_Delete(ans);
        cJSON_Delete(req);
    }
    free(line);
    al_session_close(s);
    return 0;
}

/* Drives a pool of warm sessions (orchestrator/session/pool.c) for tests/integration/test_warm.py
 * and bench/warm.py:
 *
 *   pool-driver IMAGE SIZE THREADS TAKES
 *
 * THREADS threads take TAKES sessions each from one pool of SIZE, run a command in each (it
 * prints the guest's identity and whether an earlier hand-out marked this VM), run `true` once
 * more (an exec round trip in an open session), close it, and print one JSON line per hand-out:
 * {"thread", "session", "restored", "out", "take_ms", "first_exec_ms", "true_ms", "r", "error"}.
 * Then the pool is destroyed and {"destroyed": true, "ms"} printed. Waits SETTLE_S (env
 * POOL_SETTLE_S, default 0) after creating the pool, so the hand-outs find it full, and as long
 * before each hand-out with POOL_GAP_S (the benchmark: a pool refilled between requests);
 * POOL_FIRST=true makes the first command `true` (the benchmark's hand-out to first exec). */
#include "airlock.h"
#include "driver-capture.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static al_pool *pool;
static unsigned takes;
static pthread_mutex_t out_mu = PTHREAD_MUTEX_INITIALIZER;

static const char PROBE[] = "cat /proc/sys/kernel/random/uuid; hostname; "
                            "test -e /tmp/airlock-pool-mark && echo SEEN-BEFORE; "
                            "touch /tmp/airlock-pool-mark";

static int run(al_session *s, const char *cmd, struct capture *cap, al_error *err)
{
    const char *argv[] = {"sh", "-c", cmd, NULL};
    al_exec_opts o = {.struct_size = sizeof(al_exec_opts),
                      .argv = argv,
                      .stdin_fd = -1,
                      .stdout_fd = -1,
                      .stderr_fd = -1,
                      .output = capture_output,
                      .output_ctx = cap};
    al_exec_result res = AL_EXEC_RESULT_INIT;
    int r = al_exec(s, &o, &res, err);
    if (r == 0 && (res.how != AL_EXEC_EXITED || res.value != 0))
        r = -EIO;
    return r;
}

static void *worker(void *arg)
{
    long id = (long)arg;
    for (unsigned i = 0; i < takes; i++) {
        cJSON *ans = cJSON_CreateObject();
        cJSON_AddNumberToObject(ans, "thread", (double)id);
        al_error err = {0};
        al_session *s = NULL;
        const char *gap = getenv("POOL_GAP_S");
        if (gap && atoi(gap) > 0)
            sleep((unsigned)atoi(gap));
        const char *first = getenv("POOL_FIRST");
        double t0 = capture_now_ms();
        int r = al_pool_take(pool, &s, &err);
        double t1 = capture_now_ms();
        cJSON_AddNumberToObject(ans, "take_ms", t1 - t0);
        struct capture cap = {{NULL}, {0}};
        if (r == 0) {
            cJSON_AddStringToObject(ans, "session", al_session_name(s));
            cJSON_AddBoolToObject(ans, "restored", al_session_restored(s));
            r = run(s, first && !strcmp(first, "true") ? "true" : PROBE, &cap, &err);
            double t2 = capture_now_ms();
            cJSON_AddNumberToObject(ans, "first_exec_ms", t2 - t0);
            struct capture none = {{NULL}, {0}};
            if (r == 0)
                r = run(s, "true", &none, &err);
            capture_free(&none);
            cJSON_AddNumberToObject(ans, "true_ms", capture_now_ms() - t2);
            al_session_close(s);
        }
        cJSON_AddStringToObject(ans, "out", cap.buf[1] ? cap.buf[1] : "");
        capture_free(&cap);
        cJSON_AddNumberToObject(ans, "r", r);
        if (r < 0)
            cJSON_AddStringToObject(ans, "error", err.msg);
        char *text = cJSON_PrintUnformatted(ans);
        pthread_mutex_lock(&out_mu);
        printf("%s\n", text);
        fflush(stdout);
        pthread_mutex_unlock(&out_mu);
        free(text);
        cJSON_Delete(ans);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: pool-driver IMAGE SIZE THREADS TAKES\n");
        return 2;
    }
    unsigned size = (unsigned)atoi(argv[2]), nthreads = (unsigned)atoi(argv[3]);
    takes = (unsigned)atoi(argv[4]);
    if (nthreads == 0 || nthreads > 64)
        return 2;
    al_session_opts so = {.struct_size = sizeof(al_session_opts), .image = argv[1], .quiet = true};
    al_error err = {0};
    if (al_pool_create(&so, size, &pool, &err) < 0) {
        fprintf(stderr, "pool-driver: %s\n", err.msg);
        return 1;
    }
    const char *settle = getenv("POOL_SETTLE_S");
    if (settle && atoi(settle) > 0)
        sleep((unsigned)atoi(settle));
    pthread_t t[64];
    for (unsigned i = 0; i < nthreads; i++)
        if (pthread_create(&t[i], NULL, worker, (void *)(long)i) != 0)
            return 1;
    for (unsigned i = 0; i < nthreads; i++)
        pthread_join(t[i], NULL);
    double t0 = capture_now_ms();
    al_pool_destroy(pool);
    printf("{\"destroyed\": true, \"ms\": %.0f}\n", capture_now_ms() - t0);
    return 0;
}

/* Shared by the integration drivers of the library (kernel-driver, checkpoint-driver): an al_exec
 * output callback that keeps what a run prints, a monotonic clock in milliseconds, and the JSON
 * helpers of their requests and answers. */
#ifndef AIRLOCK_TEST_CAPTURE_H
#define AIRLOCK_TEST_CAPTURE_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "airlock.h"

/* Output kept per stream and run; the tests print little. */
#define CAPTURE_MAX (4u << 20)

struct capture {
    char *buf[3]; /* [1] stdout, [2] stderr: NUL-terminated, NULL while empty */
    size_t len[3];
};

/* al_exec_opts.output with output_ctx a struct capture. */
int capture_output(void *ctx, int stream, const uint8_t *data, size_t len);
void capture_free(struct capture *c);
double capture_now_ms(void);

/* A request's string member, or NULL when it is none. */
const char *json_str(const cJSON *o, const char *key);
/* A request's number member, or 0 when it is none. */
double json_num(const cJSON *o, const char *key);
/* Adds how, value, waited_input and timed_out of a finished run to an answer. */
void capture_add_result(cJSON *out, const al_exec_result *res);
/* al_exec_opts.result with result_ctx a cJSON array: appends al_result_json's object. */
int capture_result(void *ctx, const al_result *r);
/* Adds "stdout" and "stderr" ("" when nothing came) to an answer, and frees c. */
void capture_add_output(cJSON *out, struct capture *c);

#endif

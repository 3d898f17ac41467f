/* Shared by the integration drivers of the library (kernel-driver, ...): an al_exec output
 * callback that keeps what a run prints, and a monotonic clock in milliseconds. */
#ifndef AIRLOCK_TEST_CAPTURE_H
#define AIRLOCK_TEST_CAPTURE_H

#include <stddef.h>
#include <stdint.h>

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

#endif

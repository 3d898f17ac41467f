/* The reader of a kernel run's result stream (result.c): what exec.c feeds the guest's stream
 * 3 bytes to, and what tests/fuzz/fuzz-result.c drives. Internal: not part of libairlock's
 * ABI (airlock.h has the results it hands out). */
#ifndef AIRLOCK_RESULT_H
#define AIRLOCK_RESULT_H

#include "airlock.h"

/* Feed it bytes as they come, end it at the stream's end; each record becomes an al_result
 * handed to fn, or an AL_RESULT_REFUSED one. */
typedef struct al_result_reader al_result_reader;
int al_result_reader_new(al_result_reader **out, al_error *err);
int al_result_reader_feed(al_result_reader *rd, const uint8_t *data, size_t len, al_result_fn fn,
                          void *ctx, al_error *err);
int al_result_reader_end(al_result_reader *rd, al_result_fn fn, void *ctx, al_error *err);
void al_result_reader_stats(const al_result_reader *rd, al_result_stats *out);
void al_result_reader_free(al_result_reader *rd);

#endif

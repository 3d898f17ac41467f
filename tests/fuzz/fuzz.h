/* The libFuzzer entry point, also called by replay.c to run a corpus under the normal tests. */
#ifndef AIRLOCK_FUZZ_H
#define AIRLOCK_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif

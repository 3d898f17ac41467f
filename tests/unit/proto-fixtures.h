/* Shared by test-proto, the fuzz target and the corpus generator: sample messages of every frame
 * type, a raw frame writer that follows docs/PROTOCOL.md without going through proto.c (so it can
 * also write frames the encoder refuses), and a field-by-field comparison of two messages. */
#ifndef AIRLOCK_PROTO_FIXTURES_H
#define AIRLOCK_PROTO_FIXTURES_H

#include "airlock-proto.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Payload bytes of an exec with one empty argv entry and nothing else: flags, timeout, input wait,
 * cap (20), rows and cols (4), then the lengths of lang, cwd, argc, argv[0] and envc (4 each). */
#define FIX_EXEC_OVERHEAD 44

/* Room for the largest legal frame, plus slack for frames one byte over it. */
#define FIX_FRAME_ROOM (AL_FRAME_HEADER_SIZE + AL_FRAME_PAYLOAD_MAX + 64)

struct sample {
    const char *name; /* letters, digits and '-': also a corpus file name */
    bool big;         /* over 4 KiB encoded: kept out of the fuzz corpus */
    struct al_msg msg;
};

/* The sample table, built on first call: every type, every stream, every error class, every
 * limit reached exactly. */
size_t fix_samples(const struct sample **out);

/* n bytes of a fixed pattern holding every byte value, NUL included (strings are counted, not
 * terminated); n is at most AL_FRAME_PAYLOAD_MAX + 1. Also serves as DATA chunks. */
struct al_str fix_str(uint32_t n);

/* Compares what a's type carries (type, flags, id and that type's fields, strings by content).
 * On a difference, *field names the first field that differs. */
bool fix_msg_same(const struct al_msg *a, const struct al_msg *b, const char **field);

/* A raw writer into a caller's buffer; aborts on overflow (a bug in the test, not in proto). */
struct raw {
    uint8_t *p;
    size_t cap;
    size_t len;
    size_t frame; /* where the open frame's header starts */
};

void raw_init(struct raw *r, uint8_t *buf, size_t cap);
void raw_u8(struct raw *r, uint8_t v);
void raw_u16(struct raw *r, uint16_t v);
void raw_u32(struct raw *r, uint32_t v);
void raw_u64(struct raw *r, uint64_t v);
void raw_bytes(struct raw *r, const void *p, size_t n);
void raw_str(struct raw *r, struct al_str s);
/* Header with a zero length; raw_end patches in the payload length and returns the frame size. */
void raw_begin(struct raw *r, uint8_t type, uint8_t flags, uint32_t id);
size_t raw_end(struct raw *r);
/* The size of the frame starting at p: the header plus the length it declares. */
size_t raw_frame_size(const uint8_t *p);
/* Writes m as PROTOCOL.md lays it out, checking nothing: type and flags go out as given, and a
 * list count above its array's size is padded with empty strings. Returns the frame size. */
size_t raw_msg(struct raw *r, const struct al_msg *m);

#endif

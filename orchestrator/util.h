/* The library's helpers that need only libc and cJSON: cleanup attributes, the error
 * convention, time, paths. What the model clients and the chat loop use of the library's
 * insides; the rest of the library gets it through internal.h. */
#ifndef AIRLOCK_UTIL_H
#define AIRLOCK_UTIL_H

#include "airlock.h"
#include "airlock/policy.h"
#include "airlock/text.h"

#include <cjson/cJSON.h>

#include "cleanup.h" /* after cJSON.h: _cleanup_cjson_ */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

/* ---- cleanup attributes: proto/cleanup.h ---- */
/* A pty run's rows or columns as the library sends them: cut to AL_PTY_ROWS_COLS_MAX. */
static inline unsigned al_pty_dim(unsigned v)
{
    return v > AL_PTY_ROWS_COLS_MAX ? AL_PTY_ROWS_COLS_MAX : v;
}

/* ---- errors ---- */
/* Sets err (first failure wins) and returns code, which must be negative. */
int al_err(al_error *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---- sized structs (airlock.h, "Structs") ---- */
/* Copies the caller's options src (a struct beginning with its size) into dst, need bytes (this
 * library's sizeof), as the header promises: a smaller size is -EINVAL, a larger one with a
 * non-zero byte past need is -E2BIG; dst's size is then need. type names it in the message
 * ("al_exec_opts"). */
int al_sized_in(void *dst, size_t need, const void *src, const char *type, al_error *err);
/* Checks a struct the caller gives the library to fill (at least need bytes by its size) and
 * sets its size to need, what will be filled. */
int al_sized_out(void *out, size_t need, const char *type, al_error *err);
#define AL_SIZED_IN(dst, src, type, err) al_sized_in(dst, sizeof(*(dst)), src, type, err)
#define AL_SIZED_OUT(out, type, err) al_sized_out(out, sizeof(*(out)), type, err)

/* ---- time ---- */
uint64_t al_now_ms(void);
uint64_t al_now_us(void);

/* Formats a one-line notice into a bounded buffer and hands it to fn (nothing when fn is NULL):
 * how the library tells its caller something without printing. */
void al_vnotify(void (*fn)(void *ctx, const char *msg), void *ctx, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

/* Room for one more element in the array *arr (a pointer's address) of *cap elements, n in use,
 * elem bytes each: doubles it (from first) when full. 0, or -ENOMEM with *arr untouched. */
int al_grow(void *arr, size_t *cap, size_t n, size_t elem, size_t first);

/* Writes all len bytes (a write cut short or interrupted goes on); 0 or -errno. */
int al_write_all(int fd, const void *buf, size_t len);
/* Opens (creating, 0600, never through a symlink) the lock file path and waits for it
 * exclusively (flock); the fd holds the lock until closed, or -errno. */
int al_lock_file(const char *path);
/* n bytes as 2n lowercase hex digits and a NUL into out. */
void al_hexify(const unsigned char *b, size_t n, char *out);

/* snprintf for paths: -ENAMETOOLONG instead of a silently cut path. */
int al_pathf(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif

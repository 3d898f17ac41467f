/* The library's helpers that need only libc and cJSON: cleanup attributes, the error
 * convention, time, paths. What the model clients and the chat loop use of the library's
 * insides; the rest of the library gets it through vm.h and session.h. */
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
#include <sys/types.h>
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
 * library's sizeof), as the header promises: a size below min (the struct's size when it was
 * first exported) is -EINVAL, one between min and need is an older caller's (the fields it
 * lacks are zero in dst), a larger one with a non-zero byte past need is -E2BIG; dst's size is
 * then need. type names it in the message ("al_exec_opts"). */
int al_sized_in(void *dst, size_t need, size_t min, const void *src, const char *type,
                al_error *err);
/* Checks a struct the caller gives the library to fill (at least need bytes by its size) and
 * sets its size to need, what will be filled. */
int al_sized_out(void *out, size_t need, const char *type, al_error *err);
#define AL_SIZED_IN(dst, src, type, err)                                                           \
    al_sized_in(dst, sizeof(*(dst)), sizeof(*(dst)), src, type, err)
/* The same for a struct that grew: first is its first field appended since LIBAIRLOCK_1. */
#define AL_SIZED_IN_SINCE(dst, src, type, first, err)                                              \
    al_sized_in(dst, sizeof(*(dst)), offsetof(__typeof__(*(dst)), first), src, type, err)
#define AL_SIZED_OUT(out, type, err) al_sized_out(out, sizeof(*(out)), type, err)

/* ---- words ---- */
/* The name of names (NULL-terminated) nearest to word (n bytes) when one is close enough to be
 * a typo of it (edit distance with transpositions: 1 for short words, up to 3), else NULL. */
const char *al_nearest(const char *word, size_t n, const char *const *names);

/* ---- time ---- */
uint64_t al_now_ms(void);
uint64_t al_now_us(void);
/* ms from now on CLOCK_REALTIME, into until: pthread_cond_timedwait's deadline. */
struct timespec;
void al_deadline_in(struct timespec *until, uint64_t ms);

/* Formats a one-line notice into a bounded buffer and hands it to fn (nothing when fn is NULL):
 * how the library tells its caller something without printing. */
void al_vnotify(void (*fn)(void *ctx, const char *msg), void *ctx, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

/* Room for one more element in the array *arr (a pointer's address) of *cap elements, n in use,
 * elem bytes each: doubles it (from first) when full. 0, or -ENOMEM with *arr untouched. */
int al_grow(void *arr, size_t *cap, size_t n, size_t elem, size_t first);

/* Standard base64 of p (malloc'd, NUL-terminated), NULL when out of memory. */
char *al_base64(const uint8_t *p, size_t n);

/* NULL-terminated string lists (argv, env): a copy of v (NULL: an empty list), NULL when out
 * of memory; and its free (NULL is fine). */
char **al_strv_dup(const char *const *v);
void al_strv_free(char **v);
/* strdup of s, or NULL for NULL; *oom set when the copy failed (so that several can be made
 * before one check). */
char *al_strdup_opt(const char *s, bool *oom);

/* Writes all len bytes (a write cut short or interrupted goes on); 0 or -errno. */
int al_write_all(int fd, const void *buf, size_t len);
/* The uid owning the other end of the TCP connection fd when that end is a socket of this
 * host (a loopback peer): 0 and *uid set; -ENOENT when no socket here is that end (a remote
 * peer), another negative errno when the kernel's tables cannot be read (sockpeer.c). */
int al_tcp_peer_uid(int fd, uid_t *uid);
/* Opens (creating, 0600, never through a symlink) the lock file path and waits for it
 * exclusively (flock); the fd holds the lock until closed, or -errno. */
int al_lock_file(const char *path);
/* n bytes as 2n lowercase hex digits and a NUL into out. */
void al_hexify(const unsigned char *b, size_t n, char *out);

/* snprintf for paths: -ENAMETOOLONG instead of a silently cut path. */
int al_pathf(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---- running host programs (spawn.c) ---- */
/* Runs argv[0] (searched in PATH) with stdin from /dev/null, stdout on out_fd and stderr on
 * err_fd, and waits; *status is the wait status. Negative errno when it could not start. */
int al_spawn_wait(const char *const *argv, int out_fd, int err_fd, int *status);
/* Resource limits for a helper that reads untrusted input (qemu-img on an imported image):
 * a parser bug or a crafted file then costs bounded CPU and memory, not the host. */
struct al_spawn_limits {
    unsigned long cpu_s;    /* RLIMIT_CPU, seconds; 0: unlimited */
    unsigned long as_bytes; /* RLIMIT_AS, bytes; 0: unlimited */
};
/* al_spawn_wait with lim applied in the child before exec (NULL: none). */
int al_spawn_wait_limited(const char *const *argv, int out_fd, int err_fd,
                          const struct al_spawn_limits *lim, int *status);
/* Runs argv with stdout discarded and waits; on failure err says "cannot WHAT with PROGRAM:"
 * and the first line the program wrote on stderr. */
int al_spawn_quiet(const char *const *argv, const char *what, al_error *err);
/* Starts argv (searched in PATH) in a process group of its own, stdin from in_fd (-1:
 * /dev/null), without waiting. */
int al_spawn_start(const char *const *argv, int in_fd, int out_fd, int err_fd, pid_t *pid);
/* Waits for what al_spawn_start started, at most timeout_s (0: no limit): past it, its group
 * gets SIGTERM, then SIGKILL, and -ETIMEDOUT is returned once it is gone. Its group is killed
 * once it exits, either way. */
int al_spawn_reap(pid_t pid, unsigned timeout_s, int *status);

/* ---- text for a terminal or a log line ---- */
/* Printable ASCII only: every byte outside 0x20..0x7e of s becomes '?' (short strings from the
 * guest or from QEMU's log that end up on a terminal as they are). */
void al_printable(char *s);
/* The last non-empty line of the serial console log at path, printable characters only, cut
 * to len ("(empty)" when there is none): what a boot failure quotes. */
void al_console_tail(const char *path, char *out, size_t len);

/* ---- session dirs ---- */
/* The directory session dirs live in (see util.c for where and why those modes), created if
 * need be and refused when it is not ours alone to change. */
int al_runtime_dir(char *buf, size_t len, al_error *err);
int al_state_dir(char *buf, size_t len, al_error *err);
/* STATE/name (templates, forks, snapshots, volumes), made 0711 when missing: QEMU's user
 * traverses it to open the files it owns; nobody lists it. */
int al_state_subdir(const char *name, char *buf, size_t len, al_error *err);
/* A new private dir in RAM, /dev/shm/PREFIX.XXXXXX (0700), for files of about `bytes` that
 * need not outlive the host, made only when the tmpfs and the memory available both leave
 * room twice over: 0 with buf the dir, else -ENOSPC and buf "" (the caller keeps them on disk). */
int al_shm_mkdtemp(const char *prefix, uint64_t bytes, char *buf, size_t len);
/* Whether path is a dir al_shm_mkdtemp made with that prefix, ours: what may be removed. */
bool al_shm_dir_ours(const char *prefix, const char *path);
/* Where the session dirs are: RUNTIME/sessions, or with state STATE/sessions (their disk-backed
 * halves); the parent is made as al_runtime_dir or al_state_dir make it. */
int al_sessions_dir(char *buf, size_t len, bool state, al_error *err);
/* This machine's id (/etc/machine-id: 32 hex digits) into buf (at least 33 bytes); "" when it
 * has none. Written into each domain's metadata, so that gc judges only this machine's. */
void al_machine_id(char *buf, size_t len);
/* Opens path for writing, creating it 0600, in a place others might have reached first: never
 * through a symlink, and only a regular file we own with one link (else -EPERM). flags: any of
 * O_EXCL, O_APPEND, O_RDWR, and O_TRUNC (done once the checks pass). Returns an O_CLOEXEC fd
 * or a negative errno. For the session lock and info.json in the runtime dir. */
int al_file_create_private(const char *path, int flags);
/* The process's umask, read without changing it (modes for files copied from the guest). */
mode_t al_umask(void);
int al_rmtree(const char *path);
/* A name of the state dir's things (snapshots, volumes): 1 to max of [A-Za-z0-9._-], not
 * starting with a dot. */
bool al_store_name_ok(const char *n, size_t max);
/* A free TCP port on 127.0.0.1, found by binding port 0. Another program may take it before
 * ours binds it: a start that fails so is retried with another (session.c). */
int al_free_port(unsigned *port, al_error *err);

#endif

/* libairlock: run code in a disposable VM. The public interface; the airlock CLI is a thin
 * caller of it.
 *
 * Conventions: functions return 0 (or a positive count) on success and a negative errno on
 * failure, with the reason in the al_error passed last; outputs are written only on success. */
#ifndef AIRLOCK_H
#define AIRLOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Everything declared here is exported; the rest of the library is hidden. */
#pragma GCC visibility push(default)

typedef struct al_error {
    int code;      /* negative errno; 0 while unset */
    char msg[512]; /* one line: what failed and why */
} al_error;

/* ---- images ---- */

typedef struct al_image {
    char name[64];
    char dir[4096];       /* the image's directory in the store */
    char kernel[4096];    /* absolute paths, checked to be inside dir */
    char initrd[4096];
    char cmdline[1024];
    unsigned agent_protocol;
    unsigned memory_mib;  /* suggested memory; 0 when the manifest names none */
    char languages[256];  /* space-separated */
} al_image;

/* The store: $AIRLOCK_IMAGE_DIR, else /var/lib/airlock/images for root, else
 * $XDG_DATA_HOME/airlock/images. Writes into buf. */
int al_image_store_dir(char *buf, size_t len, al_error *err);
int al_image_load(const char *name, al_image *out, al_error *err);
/* Calls fn for every valid image in the store, in name order; invalid ones are reported via
 * fn with img == NULL and why set. */
int al_image_list(void (*fn)(void *ctx, const al_image *img, const char *name, const char *why),
                  void *ctx, al_error *err);

/* ---- sessions ---- */

typedef struct al_session al_session;

typedef struct al_session_opts {
    const char *image;        /* name in the store; default "tiny" */
    const char *connect_uri;  /* NULL: --connect / LIBVIRT_DEFAULT_URI / system / session */
    unsigned memory_mib;      /* 0: the image's, else 256 */
    unsigned vcpus;           /* 0: 1 */
    unsigned lifetime_s;      /* 0: unlimited; the session fails once it is older */
    unsigned boot_timeout_ms; /* 0: 60 s; from domain start to the agent's handshake */
    unsigned stall_timeout_ms;/* 0: 10 s; a frame half-received for this long fails */
    bool quiet;               /* no notices */
    FILE *notice;             /* where notices go (emulation fallback); NULL: stderr */
    const char *raw_port;     /* benchmarks: add a second virtio-serial port of this name */
    FILE *console_to;         /* NULL, or where the guest console is copied when the session
                                 closes (also after a failed boot) */
    int cancel_fd;            /* 0 or -1: none; or a pipe: each byte read is a signal number. While
                                 booting any byte cancels; during an exec SIGINT/SIGQUIT are
                                 forwarded to the guest process group, others kill it. */
} al_session_opts;

int al_session_open(const al_session_opts *opts, al_session **out, al_error *err);
/* Destroys the VM and removes the session's files. Safe on NULL. */
void al_session_close(al_session *s);
const char *al_session_name(const al_session *s);
const char *al_session_console_path(const al_session *s);
const char *al_session_raw_port_path(const al_session *s);
const char *al_session_agent_version(const al_session *s);
const char *al_session_languages(const al_session *s);
bool al_session_kvm(const al_session *s);
unsigned al_session_vcpus(const al_session *s);

/* Where the time to a ready session went. */
typedef struct al_session_timing {
    unsigned prepare_ms;   /* image, libvirt connection, gc, runtime dir */
    unsigned start_ms;     /* libvirt creating and starting the domain, socket connect */
    unsigned handshake_ms; /* guest boot until the agent answered */
} al_session_timing_t;
void al_session_timing(const al_session *s, al_session_timing_t *out);


/* ---- exec ---- */

enum al_exec_how {
    AL_EXEC_EXITED = 0,   /* value: exit status */
    AL_EXEC_SIGNALED = 1, /* value: signal number */
};

typedef struct al_exec_opts {
    const char *const *argv; /* NULL-terminated; argv[0] is a program, unless lang is set */
    const char *lang;        /* run code (argv[0]) in this language, e.g. "sh" */
    const char *const *env;  /* NULL-terminated KEY=VALUE list added in the guest, or NULL */
    const char *cwd;         /* NULL: / */
    unsigned timeout_ms;     /* 0: none */
    uint64_t output_cap;     /* per stream, 0: none */
    int stdin_fd;            /* -1: the process gets /dev/null */
    int stdout_fd;           /* where stream bytes are written */
    int stderr_fd;
} al_exec_opts;

typedef struct al_exec_result {
    int how;   /* enum al_exec_how */
    int value;
    uint64_t duration_us;
    bool timed_out;
    bool truncated_stdout;
    bool truncated_stderr;
} al_exec_result;

/* Runs one command and streams its output. A command that cannot be started fails with
 * -ENOENT (not found) or -EACCES. */
int al_exec(al_session *s, const al_exec_opts *opts, al_exec_result *out, al_error *err);

/* ---- files ---- */

int al_file_put(al_session *s, const char *host_path, const char *guest_path, al_error *err);
int al_file_get(al_session *s, const char *guest_path, const char *host_path, al_error *err);

/* ---- housekeeping ---- */

/* Destroys the domains and removes the files that crashed airlock runs left behind, found by
 * airlock's own marker; never touches a live session. Returns how many were reaped. */
int al_gc(const char *connect_uri, al_error *err);

/* Doctor-style probes. */
int al_libvirt_uri(const char *requested, char *buf, size_t len, al_error *err);
bool al_kvm_usable(void);
enum al_kvm_state {
    AL_KVM_OK = 0,     /* /dev/kvm opens and has not failed on this boot */
    AL_KVM_ABSENT = 1, /* /dev/kvm missing or not openable */
    AL_KVM_FAILED = 2, /* /dev/kvm opens but QEMU failed with it on this boot */
    AL_KVM_OFF = 3,    /* AIRLOCK_ACCEL=tcg */
};
enum al_kvm_state al_kvm_state(void);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif

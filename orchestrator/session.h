/* The session object, shared by the files that act on a session (exec, files). */
#ifndef AIRLOCK_SESSION_H
#define AIRLOCK_SESSION_H

#include "internal.h"

struct al_session {
    virConnectPtr conn;
    virDomainPtr dom;
    al_image img;
    char name[64];          /* airlock-<12 hex>: the domain and the runtime dir */
    char dir[4096];         /* runtime dir of this session */
    char sock[4200];        /* agent channel socket */
    char console[4200];     /* serial console log */
    char raw_sock[4200];    /* benchmark port socket, or empty */
    char raw_port[64];      /* benchmark port name, or empty */
    bool dir_created;
    int lock_fd;            /* flock held while the session lives; gc skips locked dirs */
    FILE *console_to;       /* copy the console here at close, or NULL */
    int cancel_fd;          /* -1 or the caller's signal pipe */
    struct al_channel ch;
    bool have_ch;
    unsigned stall_ms;
    unsigned boot_timeout_ms;
    uint64_t expires_ms;    /* monotonic end of the session's lifetime, 0: none */
    uint32_t next_id;       /* request ids grow; older ids are known to be finished */
    uint32_t agent_window;  /* bytes the agent accepts un-credited per stream */
    uint32_t caps;
    bool kvm;
    unsigned vcpus;
    al_session_timing_t timing;
    char agent_version[AL_SHORT_STR_MAX + 1];
    char langs[AL_LANGS_MAX * (AL_SHORT_STR_MAX + 1) + 1];
};

int al_session_next_id(al_session *s);
/* The next frame for request id, dropping late frames of finished requests. 0 when cancel_fd
 * or extra_fd became readable. */
int al_session_recv(al_session *s, uint32_t id, struct al_msg *m, int extra_fd, al_error *err);
int al_gc_conn(virConnectPtr conn, al_error *err);

#endif

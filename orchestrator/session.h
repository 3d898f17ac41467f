/* The session object, shared by the files that act on a session (exec, files). */
#ifndef AIRLOCK_SESSION_H
#define AIRLOCK_SESSION_H

#include "internal.h"

#include <pthread.h>

struct al_session {
    virConnectPtr conn;
    virDomainPtr dom;
    al_image img;
    char name[64];              /* airlock-<12 hex>: the domain and the runtime dir */
    char dir[AL_PATH_MAX];      /* runtime dir of this session */
    char sock[AL_PATH_MAX];     /* agent channel socket */
    char console[AL_PATH_MAX];  /* serial console log */
    char raw_sock[AL_PATH_MAX]; /* benchmark port socket, or empty */
    char raw_port[64];          /* benchmark port name, or empty */
    bool dir_created;
    int lock_fd;                 /* flock held while the session lives; gc skips locked dirs */
    char state_dir[AL_PATH_MAX]; /* disk-backed: the root disk overlay, checkpoints (budget.c) */
    bool state_created;
    int state_lock_fd;    /* the same flock, in the state dir */
    uint64_t disk_budget; /* bytes the state dir's files may occupy; 0: no limit */
    pthread_t budget_thread;
    bool budget_running;
    int budget_stop[2];  /* closes the watcher */
    int budget_alarm[2]; /* written once it paused the VM: wakes the channel */
    bool budget_over;    /* atomic: the watcher paused the VM, budget_why says why */
    char budget_why[400];
    FILE *console_to; /* copy the console here at close, or NULL */
    bool quiet;       /* notices: none, to on_notice, else to notice (NULL: stderr) */
    FILE *notice;
    void (*on_notice)(void *ctx, const char *msg);
    void *notice_ctx;
    int cancel_fd;               /* -1 or the caller's signal pipe */
    pthread_mutex_t lock;        /* recursive; one request at a time on the channel, whether the
                                    owner's or a control-socket client's (control.c) */
    struct al_control *control;  /* the control socket's server thread, or NULL */
    struct al_checkpoints *ckpt; /* checkpoint.c's state; NULL without opts.checkpoints */
    struct al_channel ch;
    bool have_ch;
    struct al_tport *tport; /* how the agent is reached (transport/); NULL until prepared */
    unsigned stall_ms;
    unsigned boot_timeout_ms;
    uint64_t expires_ms;   /* monotonic end of the session's lifetime, 0: none */
    uint32_t next_id;      /* request ids grow; older ids are known to be finished */
    uint32_t agent_window; /* bytes the agent accepts un-credited per stream */
    uint32_t caps;
    bool kvm;
    bool poisoned; /* the guest broke the protocol: no more requests until a restore */
    char poison_why[256];
    unsigned vcpus;
    al_session_timing_t timing;
    char agent_version[AL_SHORT_STR_MAX + 1];
    char langs[AL_LANGS_MAX * (AL_SHORT_STR_MAX + 1) + 1];
};

int al_gc_conn(virConnectPtr conn, al_error *err);
/* checkpoint.c: sets up checkpoints for a session being opened (a scratch disk for images
 * without one, in cfg), and frees that state at close. */
int al_checkpoints_prepare(al_session *s, struct al_vm_config *cfg, al_error *err);
void al_checkpoints_free(al_session *s);

/* budget.c: the watcher of the session's disk use, started once it booted; refusing requests
 * once it paused the VM; refusing a checkpoint that would not fit; the free-space floor. */
int al_budget_start(al_session *s, al_error *err);
void al_budget_stop(al_session *s);
int al_budget_refuse(const al_session *s, al_error *err);
int al_budget_room_for_checkpoint(const al_session *s, al_error *err);
uint64_t al_session_disk_usage(const al_session *s);
uint64_t al_free_floor(void);
int al_check_free_space(const char *dir, uint64_t floor, char *why, size_t len);

/* Holds the session's channel until the end of the enclosing block. */
static inline void al_session_unlockp(al_session **s)
{
    pthread_mutex_unlock(&(*s)->lock);
}
#define AL_SESSION_LOCKED(s)                                                                       \
    __attribute__((cleanup(al_session_unlockp))) al_session *al_locked_session_ =                  \
        (pthread_mutex_lock(&(s)->lock), (s))
/* Ends the control socket's server, if any (control.c); before the session goes away. */
void al_control_stop(al_session *s);

#endif

/* The session object (session.c), shared by the files that act on a session; each module's
 * own functions are in its header beside it (exec.h, checkpoint.h, template.h, net.h, proc.h,
 * control.h, gc.h; vm/budget.h for the disk budget). */
#ifndef AIRLOCK_SESSION_H
#define AIRLOCK_SESSION_H

#include "vm.h"

#include <pthread.h>

/* A volume attached to the session (vols.c). */
struct al_vol_att {
    char name[AL_VOL_NAME_MAX + 1];
    char path[256]; /* where the guest mounts it */
    bool read_only;
    char disk[AL_PATH_MAX];    /* what QEMU opens: the volume's file, or a fork's overlay */
    char mid[AL_PATH_MAX];     /* a fork's copy of a read-only overlay, between, or "" */
    char backing[AL_PATH_MAX]; /* the overlay's raw base (the volume, a fork's copy), or "" */
    uint64_t size;
    int lock_fd; /* the volume's flock, held while attached; -1: none */
};

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
    char budget_why[sizeof(((al_error *)0)->msg)];
    FILE *console_to; /* copy the console here at close, or NULL */
    bool quiet;       /* notices: none, to on_notice, else to notice (NULL: nowhere) */
    FILE *notice;
    void (*on_notice)(void *ctx, const char *msg);
    void *notice_ctx;
    int cancel_fd;               /* -1 or the caller's signal pipe */
    pthread_mutex_t lock;        /* recursive; checkpoints and restores one at a time (requests
                                    share the channel through mux) */
    struct al_link_mux *mux;     /* link.c: the requests in flight on the channel */
    struct al_control *control;  /* the control socket's server thread, or NULL */
    struct al_checkpoints *ckpt; /* checkpoint.c's state; NULL without opts.checkpoints */
    struct al_channel ch;
    bool have_ch;
    struct al_tport *tport; /* how the agent is reached (transport/); NULL until prepared */
    struct al_net *net;     /* net.c: the proxy and relay of a session with network, or NULL */
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
    struct al_template *tmpl; /* template.c: the template this session restores, or NULL */
    /* fork.c: a holder ready for the session's next fork, or NULL; ended at the release by
     * fork_spare_end, which fork.c sets (session.c sits below it) */
    struct al_fork_spare *fork_spare;
    void (*fork_spare_end)(al_session *s);
    bool restored;         /* it was restored from tmpl (else booted cold) */
    bool keep_identity;    /* a fork left as its source was (opts.fork_keep_identity) */
    struct al_proc *procs; /* proc.c: the processes started by handle (under its lock) */
    /* The machine's answer to whether the VM has ended, for the link (which holds no libvirt)
     * while it reconnects; NULL: it has not. */
    bool (*vm_gone)(const al_session *s);
    uint32_t proc_serial; /* their numbers, 1, 2 ... */
    /* On a remote host (volume.c): the image's parts as that host's volumes (rimg), the
     * overlay and scratch volumes this session made there (named by al_session_volume). */
    bool remote;
    al_image rimg;
    char rdisk[AL_PATH_MAX]; /* the overlay's path there, or empty */
    bool vol_made, scratch_made;
    struct al_screen *screen;      /* screen.c: the display's state, or NULL (no display) */
    unsigned display_w, display_h; /* the display's mode asked for; 0: QEMU's default */
    /* keep.c: a session kept for keeper (al_session_opts.keep), "" when not; paused to disk */
    char keeper[64];
    int64_t keep_expires; /* unix time its lifetime ends, 0: none */
    bool paused;
    bool stopped; /* al_session_stop: its VM destroyed, its volumes unmounted before */
    enum al_transport kind;
    uint32_t hello_flags;   /* the next HELLO's (AL_HELLO_ADOPT while reattaching, resuming) */
    pthread_t lease_thread; /* keeprec.c: renews the marks while this process holds it */
    bool lease_running;
    int lease_stop[2];
    uint32_t adopted[AL_ADOPT_MAX]; /* the runs the agent handed over at the last handshake */
    size_t nadopted;
    struct al_vol_att vols[AL_VOLS_MAX]; /* vols.c: the volumes attached */
    size_t nvols;
};

/* A session's volume on a remote host: its overlay, or its scratch disk; into buf[80]. */
static inline void al_session_volume(const al_session *s, bool scratch, char buf[80])
{
    snprintf(buf, 80, "%s%s", s->name, scratch ? ".scratch.qcow2" : ".qcow2");
}

/* A session whose agent is argv on this machine (the peer transport): no VM, no disk, no
 * checkpoints; for tests of the link and the host's limits (tests/unit/test-link.c). */
int al_session_open_peer(const char *const *argv, const al_session_opts *opts, al_session **out,
                         al_error *err);

/* Holds the session's channel until the end of the enclosing block. */
static inline void al_session_unlockp(al_session **s)
{
    pthread_mutex_unlock(&(*s)->lock);
}
#define AL_SESSION_LOCKED(s)                                                                       \
    __attribute__((cleanup(al_session_unlockp))) al_session *al_locked_session_ =                  \
        (pthread_mutex_lock(&(s)->lock), (s))

/* Opens a session; with build_ram, a cold one whose RAM is that file, mapped shared, to be
 * saved as a template (no template is restored for it). */
int al_session_open_for(const al_session_opts *opts, const char *build_ram, al_session **out,
                        al_error *err);
/* The same for a fork of a save (fork.c; template.h's al_fork_save): restored from it, never
 * booted. */
struct al_fork_save;
int al_session_open_fork(const al_session_opts *opts, const struct al_fork_save *f,
                         al_session **out, al_error *err);
void al_session_notice(al_session *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* session.c, for keep.c: a session not yet booted (its fields from opts); the locked runtime or
 * state dir NAME (al_sessions_dir's) made and its lock held in *lock_fd. */
al_session *al_session_new(const al_session_opts *opts);
/* al_session_close (keep false), or al_session_detach's part for a kept session (keep true):
 * the handle freed, the VM and the dirs left as they are. */
void al_session_release(al_session *s, bool keep);
/* The session's transport of kind (s->tport), on its dirs and connection. */
int al_session_transport_new(al_session *s, enum al_transport kind, al_error *err);
int al_session_dir_make(bool state, const char *name, char *out, size_t outlen, int *lock_fd,
                        al_error *err);
/* A notice where opts sends them (quiet, on_notice, notice): al_session_notice's, for callers
 * without a session yet (warm.c). */
void al_notice_route(const al_session_opts *o, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));

#endif

/* The session object, shared by the files that act on a session (exec, files). */
#ifndef AIRLOCK_SESSION_H
#define AIRLOCK_SESSION_H

#include "vm.h"

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
    bool restored;            /* it was restored from tmpl (else booted cold) */
    struct al_proc *procs;    /* proc.c: the processes started by handle (under its lock) */
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
};

/* A session's volume on a remote host: its overlay, or its scratch disk; into buf[80]. */
static inline void al_session_volume(const al_session *s, bool scratch, char buf[80])
{
    snprintf(buf, 80, "%s%s", s->name, scratch ? ".scratch.qcow2" : ".qcow2");
}

int al_gc_conn(virConnectPtr conn, al_error *err);
/* checkpoint.c: sets up checkpoints for a session being opened (a scratch disk for images
 * without one, in cfg), and frees that state at close. */
int al_checkpoints_prepare(al_session *s, struct al_vm_config *cfg, al_error *err);
void al_checkpoints_free(al_session *s);

/* budget.c: the watcher of the session's disk use, started once it booted; refusing requests
 * once it paused the VM; refusing a checkpoint that would not fit; the free-space floor. */
int al_budget_start(al_session *s, al_error *err);
void al_budget_stop(al_session *s);
/* -ENOSPC once the watcher paused the VM (link.c: every request asks first). */
int al_budget_refuse(const al_session *s, al_error *err);
int al_budget_room_for_checkpoint(const al_session *s, al_error *err);
uint64_t al_session_disk_usage(const al_session *s);
uint64_t al_free_floor(void);
int al_check_free_space(const char *dir, uint64_t floor, al_error *err);

/* net.c: a session with network: its proxy started and the VM's NIC in cfg (prepare), the
 * relay once the guest is up (start), everything stopped (stop); gc's reaping of a crashed
 * session's proxy (reap). */
int al_net_prepare(al_session *s, const al_session_opts *opts, struct al_vm_config *cfg,
                   al_error *err);
int al_net_start(al_session *s, al_error *err);
void al_net_stop(al_session *s);
/* After a checkpoint restore: the relay drops its tunnels (they lead into the guest's past) and
 * opens new ones; the restored agent has told the guest's forwarder to drop its own. */
void al_net_reset(al_session *s);
void al_net_reap(const char *session_dir);
/* One line of the proxy's access log into *out: 1, or 0 for a line that is not a request (a
 * connection that carried none, a malformed line). Method and host come out printable ASCII,
 * every field bounded; allow (NULL-terminated) tells a name refused as unlisted from one refused
 * for its address. Fuzzed by tests/fuzz/fuzz-netlog.c. */
int al_net_log_line(char *const *allow, char *line, al_net_request *out);

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
/* ---- warm starts (template.c) ---- */
/* Opens a session; with build_ram, a cold one whose RAM is that file, mapped shared, to be
 * saved as a template (no template is restored for it). */
int al_session_open_for(const al_session_opts *opts, const char *build_ram, al_session **out,
                        al_error *err);
/* template.c. Where a template of a session's image and shape lives, and its key. */
struct al_template_id {
    char tdir[AL_PATH_MAX]; /* the state dir's templates/ */
    char prefix[200];       /* IMAGE-DIRHASH-SHAPE-: the image's templates, whatever the key */
    char key[65];
    char dir[AL_PATH_MAX]; /* tdir/prefix + the key's start */
    unsigned mem, vcpus;
};
/* $AIRLOCK_WARM or opts->warm. */
enum al_warm al_warm_mode(const al_session_opts *opts);
/* Whether a session of this image, transport and options may be restored at all. */
bool al_template_applies(const al_session *s, const al_session_opts *opts, enum al_transport kind);
/* The template's identity for a session being opened (s: image, connection, accelerator). */
int al_template_id_of(al_session *s, enum al_transport kind, unsigned mem, unsigned vcpus,
                      struct al_template_id *id, al_error *err);
/* Loads the template into s->tmpl when it is there and intact (FOUND); else removes it (REFUSED,
 * why says why) or older ones of the image (STALE), or finds none (NONE). */
enum { AL_TEMPLATE_FOUND, AL_TEMPLATE_NONE, AL_TEMPLATE_REFUSED, AL_TEMPLATE_STALE };
int al_template_find(al_session *s, const struct al_template_id *id, al_error *why);
/* Building one (warm.c drives it): takes the build lock (into *lock_fd) and makes the staging
 * dir and its RAM file for the session to boot on (1: someone built it meanwhile, no lock);
 * saves the booted session s there (the python kernel warmed first); moves it into place
 * (replacing older ones of the image); moves an existing one of the same key aside first. */
int al_template_stage(virConnectPtr conn, bool kvm, const struct al_template_id *id, char *staging,
                      size_t slen, char *ram, size_t rlen, int *lock_fd, al_error *err);
int al_template_save(al_session *s, const struct al_template_id *id, const char *staging,
                     al_error *err);
int al_template_commit(const struct al_template_id *id, const char *staging, al_error *err);
int al_template_replace(const struct al_template_id *id, al_error *err);
/* The template's frozen disk, the middle layer of the session's (NULL: none). */
const char *al_template_disk(const struct al_template *t);
/* Sets cfg up for a restore of s->tmpl, starts the domain paused, loads the template's state,
 * resumes, handshakes and makes the guest unique. */
int al_template_restore(al_session *s, struct al_vm_config *cfg, al_error *err);
void al_template_free(struct al_template *t);
/* exec.c: runs o for the library's own purposes (no stdin, output dropped, whatever o says of
 * them); a run that does not exit 0 is an error about what. */
int al_exec_quiet(al_session *s, al_exec_opts o, const char *what, al_error *err);
/* The caller's al_exec_opts into dst as the library uses them (checked by size, descriptors'
 * zero-means-none read as -1, AL_FD_STDIN as 0) and out checked to be filled: what al_exec and
 * al_attach_exec do first. */
int al_exec_take(al_exec_opts *dst, const al_exec_opts *src, al_exec_result *out, al_error *err);
/* Ends the session's processes (al_exec_start) before it closes: their requests fail, their
 * threads are joined, their handles stay the callers'. */
void al_procs_end(al_session *s);
/* A tunnel's port and counts checked, for al_port_relay and al_attach_port. */
int al_port_args(unsigned port, al_port_counts *counts, al_error *err);
/* checkpoint.c: the PING round trip that leaves the agent idle at a frame boundary. */
int al_session_barrier(al_session *s, al_error *err);
/* The description a crashed guest's QEMU is started again from (takes xml; freed without
 * checkpoints): a restored session's, without the restore's -incoming. */
int al_checkpoints_set_xml(al_session *s, char *xml);
void al_session_notice(al_session *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A notice where opts sends them (quiet, on_notice, notice): al_session_notice's, for callers
 * without a session yet (warm.c). */
void al_notice_route(const al_session_opts *o, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));

/* Ends the control socket's server, if any (control.c); before the session goes away. */
void al_control_stop(al_session *s);

#endif

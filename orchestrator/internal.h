/* Private helpers shared by the library's files. */
#ifndef AIRLOCK_INTERNAL_H
#define AIRLOCK_INTERNAL_H

#include "airlock-proto.h"
#include "airlock.h"
#include "util.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <libvirt/libvirt.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

/* ---- libvirt handles and errors (vm.c) ---- */
AL_DEFINE_CLEANUP(al_virconnp, virConnectPtr, virConnectClose)
AL_DEFINE_CLEANUP(al_virdomp, virDomainPtr, virDomainFree)
#define _cleanup_virconn_ __attribute__((cleanup(al_virconnp)))
#define _cleanup_virdom_ __attribute__((cleanup(al_virdomp)))
/* al_err, with the libvirt's last error message appended. */
int al_err_virt(al_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- channel: frames over a connected socket to the agent ---- */
struct al_channel {
    int fd;
    unsigned stall_ms; /* a frame half-received longer than this fails */
    struct al_decoder dec;
    uint8_t *rbuf;         /* AL_FRAME_HEADER_SIZE + AL_FRAME_PAYLOAD_MAX */
    uint8_t *wbuf;         /* the same size, for encoding */
    const char *eof_msg;   /* what the end of the stream means on this transport, or NULL */
    int wake_fd;           /* -1, or the session's cancel pipe: also watched while a write
                              waits for the guest to read */
    int pending_sig;       /* SIGINT/SIGQUIT read from wake_fd during a write, to forward */
    bool broken;           /* a write was abandoned mid-frame: nothing more can be sent */
    int alarm_fd;          /* -1, or readable once the session must stop (its disk budget) */
    const char *alarm_msg; /* why, for the error */
    pthread_mutex_t wlock; /* one frame at a time onto the channel (requests run at once) */
};

/* Takes fd (made non-blocking: every write has a deadline, stall_ms without progress, and ends
 * early when wake_fd delivers a signal other than SIGINT/SIGQUIT). */
int al_channel_init(struct al_channel *ch, int fd, unsigned stall_ms, int wake_fd, al_error *err);
void al_channel_destroy(struct al_channel *ch);
int al_channel_send(struct al_channel *ch, const struct al_msg *m, al_error *err);
int al_channel_send_data(struct al_channel *ch, uint32_t id, uint8_t stream, uint8_t flags,
                         const void *data, size_t len, al_error *err);
/* Waits for one frame until deadline_ms (monotonic; 0: forever). Also wakes when wake_fd
 * (if >= 0) is readable. Returns 1 with *m set, 0 when woken by wake_fd, extra_fd, extra2_fd or
 * kick_fd, -ETIMEDOUT at the deadline, other negatives on failure. extra_fd, extra2_fd and
 * kick_fd (if >= 0) are polled for POLLIN too. */
int al_channel_recv(struct al_channel *ch, struct al_msg *m, uint64_t deadline_ms, int wake_fd,
                    int extra_fd, int extra2_fd, int kick_fd, al_error *err);
/* Sends a small frame only if it goes at once (-EAGAIN otherwise: nothing was sent, unless half
 * of it, which leaves the channel unusable): a kill on the way out of a cancelled request. */
int al_channel_send_nowait(struct al_channel *ch, const struct al_msg *m);
/* Describes an AL_ERROR frame from the guest into err and returns a matching negative errno. */
int al_channel_guest_error(const struct al_msg *m, const char *what, al_error *err);
/* Forgets every byte received and not yet decoded, and whatever the socket holds right now:
 * after a snapshot restore these come from the guest's abandoned future. */
void al_channel_discard(struct al_channel *ch);

/* ---- libvirt domain ---- */
struct al_vm_config {
    const char *name;
    const char *session_dir;
    const al_image *image;
    unsigned memory_mib, vcpus;
    bool kvm;
    const char *agent_sock, *console_path;
    const char *disk;     /* the session's root disk overlay (qcow2), or NULL */
    const char *scratch;  /* a qcow2 the guest never mounts, holding checkpoints, or NULL */
    const char *raw_sock; /* NULL: none */
    const char *raw_port_name;
    /* SSH transport: a NIC on QEMU's user-mode network, restricted so the guest reaches
     * nothing, with one forward from 127.0.0.1:host_port to guest_port; and the cloud-init
     * seed (an ISO, read-only). host_port 0: no network. */
    unsigned host_port, guest_port;
    const char *seed;
    /* Warm starts (template.c): the disk's middle layer (the template's frozen disk, between
     * the overlay and the image's base), or NULL; guest RAM in ram_file (a template's memory,
     * mapped shared while the template is built, privately by each restored session) instead
     * of anonymous memory, or NULL; incoming: QEMU waits for a migration stream (the template's
     * device state) instead of booting. */
    const char *disk_mid;
    const char *ram_file;
    bool ram_shared;
    bool incoming;
    /* Network on request (net.c): the same kind of NIC, with a forward from 127.0.0.1:net_port
     * to net_guest_port, the guest's end of the proxy tunnels. net_port 0: none. */
    unsigned net_port, net_guest_port;
};
int al_vm_connect(const char *uri, virConnectPtr *out, al_error *err);
int al_vm_start(virConnectPtr conn, const struct al_vm_config *cfg, virDomainPtr *out,
                al_error *err);
char *al_vm_xml(const struct al_vm_config *cfg);
bool al_kvm_present(void);
/* al_kvm_usable() for a state already read (AIRLOCK_ACCEL=kvm forces it). */
bool al_kvm_state_usable(enum al_kvm_state st);
/* Records whether KVM ran a guest on this boot (with this host kernel and QEMU binary), with the
 * evidence when it did not; al_kvm_state() reads it back. */
void al_kvm_record(bool works, const char *evidence);
/* The same for the host conn reaches when it is another machine: kept in this process only, by
 * URI (-1: none yet, 1 ok, 0 broken); whether libvirt there offers KVM at all. */
int al_kvm_remote_verdict(virConnectPtr conn);
void al_kvm_remote_record(virConnectPtr conn, bool works);
bool al_kvm_remote_offered(virConnectPtr conn);
/* The line of the domain's QEMU log that shows KVM could not run the guest, or "". */
void al_vm_kvm_log_evidence(virConnectPtr conn, const char *name, char *out, size_t len);
#define AL_METADATA_NS "https://airlock.invalid/xmlns/session/1"
#define AL_METADATA_PREFIX "airlock"
#define AL_DOMAIN_PREFIX "airlock-"

/* ---- images ---- */
/* Image and image part names: letters, digits, - _ . and no leading dot, under 64 bytes. */
bool al_image_name_ok(const char *s);
bool al_ssh_user_ok(const char *s);

/* ---- host helpers (spawn.c, disk.c) ---- */
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
/* Creates overlay, a qcow2 whose backing file is base (qcow2, never written), and hands it to
 * the user QEMU runs as (libvirt's DAC base label for the domain type). */
int al_disk_overlay(virConnectPtr conn, bool kvm, const char *base, const char *overlay,
                    al_error *err);
/* The uid:gid QEMU runs as on conn's host (libvirt's DAC base label for the domain type). */
int al_qemu_owner(virConnectPtr conn, bool kvm, uid_t *uid, gid_t *gid, al_error *err);
/* Hands an existing file to QEMU's user, mode 0600. */
int al_disk_give(virConnectPtr conn, bool kvm, const char *path, al_error *err);
/* The agent binary and its language kernels' directory, from this build or the install. */
int al_agent_files(char *agent, size_t alen, char *kernels, size_t klen, al_error *err);
/* Creates path, an empty qcow2 of size bytes, owned the same way. */
int al_disk_scratch(virConnectPtr conn, bool kvm, const char *path, uint64_t size, al_error *err);

/* volume.c: storage on a remote host, through the libvirt connection only. Whether conn reaches
 * another host (its URI names one). */
bool al_conn_remote(virConnectPtr conn);
/* The image's parts as volumes on conn's host (uploaded and verified when missing: *uploaded),
 * into out, whose paths are that host's (al_image_free frees them). */
int al_volume_image(virConnectPtr conn, const al_image *img, al_image *out, bool *uploaded,
                    al_error *err);
/* A qcow2 volume name, owned by QEMU's user, mode 0600: on backing (a path on that host, whose
 * local copy backing_local gives the size) or empty of size bytes (backing NULL). *path: its
 * path there, malloc'd. */
int al_volume_create(virConnectPtr conn, bool kvm, const char *name, uint64_t size,
                     const char *backing_local, const char *backing, char **path, al_error *err);
void al_volume_delete(virConnectPtr conn, const char *name);
uint64_t al_volume_allocation(virConnectPtr conn, const char *name);
/* Deletes the session volumes whose domain is gone from conn's host and whose session dead()
 * says is over; how many. */
int al_volume_reap(virConnectPtr conn, bool (*dead)(void *ctx, const char *session), void *ctx);

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
/* A free TCP port on 127.0.0.1, found by binding port 0. Another program may take it before
 * ours binds it: a start that fails so is retried with another (session.c). */
int al_free_port(unsigned *port, al_error *err);

#endif

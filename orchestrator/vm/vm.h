/* The machine (vm/): libvirt handles and errors (vm.c), the domain, images (image.c), the host's
 * helpers (spawn.c, disk.c, volume.c), where session dirs live (util.c). Below the session;
 * the link's channel (link/channel.h) comes with it for the files above. */
#ifndef AIRLOCK_VM_H
#define AIRLOCK_VM_H

#include "airlock-proto.h"
#include "airlock.h"
#include "channel.h"
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

/* ---- libvirt domain ---- */
/* A disk's middle layers at most (a fork of a fork ... of a warm start). */
#define AL_DISK_MIDS_MAX 8
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
    /* Warm starts (template.c): the disk's middle layers (the template's frozen disk, between
     * the overlay and the image's base; a fork's: its copy of the source's overlay and the
     * source's own middle layers), or NULL; guest RAM in ram_file (a template's memory,
     * mapped shared while the template is built, privately by each restored session) instead
     * of anonymous memory, or NULL; incoming: QEMU waits for a migration stream (the template's
     * device state) instead of booting. */
    const char *const *disk_mids; /* NULL-terminated, top first (a fork's chain, fork.c) */
    const char *ram_file;
    bool ram_shared;
    bool ram_prealloc; /* its pages allocated and mapped at the start (a fork's holder in RAM) */
    bool incoming;
    /* Network on request (net.c): the same kind of NIC, with a forward from 127.0.0.1:net_port
     * to net_guest_port, the guest's end of the proxy tunnels. net_port 0: none. */
    unsigned net_port, net_guest_port;
    /* A screen and input devices the host drives (session/screen.c): VGA, a virtio tablet and
     * keyboard. */
    bool display;
    unsigned display_w, display_h; /* the VGA's preferred mode (EDID); 0: QEMU's 1280x800 */
    /* A kept session (keep.c): the domain outlives the connection that started it. */
    bool keep;
    /* Volumes (session/vols.c): raw disks, or a fork's qcow2 overlay on a raw copy, with the
     * serial airlock-vol-I the guest finds them by. They outlive the VM, so the guest's flushes
     * reach the host's disk: direct, cache=none and native I/O (the data written once, no copy
     * in the host's page cache; 0.9x the root disk's writes here against 0.7x with writeback);
     * else (a file system without O_DIRECT, tmpfs) cache=writeback. */
    struct {
        const char *disk, *mid, *backing; /* mid: a qcow2 between disk and backing, or NULL */
        bool read_only, direct;
    } vols[AL_VOLS_MAX];
    size_t nvols;
};
int al_vm_connect(const char *uri, virConnectPtr *out, al_error *err);
int al_vm_start(virConnectPtr conn, const struct al_vm_config *cfg, virDomainPtr *out,
                al_error *err);
char *al_vm_xml(const struct al_vm_config *cfg);
/* Sends a QMP command through libvirt's monitor passthrough (with fd passed along when >= 0;
 * libvirt marks the domain tainted); fails on QEMU's error, "cannot WHAT: QEMU says: ...". The
 * reply, when asked for, is the caller's to free. */
int al_vm_qmp(virDomainPtr dom, const char *what, const char *cmd, int fd, char **reply_out,
              al_error *err);
/* QEMU's x-ignore-shared migration capability on or off (a template's and a fork's RAM file
 * is not in their streams). */
int al_vm_ignore_shared(virDomainPtr dom, bool on, const char *what, al_error *err);
/* Hands fd to QEMU under name (for a migration's "fd:NAME"). */
int al_vm_getfd(virDomainPtr dom, const char *name, int fd, al_error *err);
/* Waits for the domain's migration (out or in) to complete, failed or timeout_ms to pass. */
int al_vm_migrate_wait(virDomainPtr dom, const char *what, unsigned timeout_ms, al_error *err);
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
/* Whether a loaded image's manifest asks for a display ("display": true: the desktop image):
 * its sessions get one whether or not they asked. */
bool al_image_has_display(const al_image *img);
/* The program (an absolute path in the guest) the image's warm template runs before it is
 * saved ("warm_command": the desktop image's starts the browser and waits for its window);
 * false when none. */
bool al_image_warm_command(const al_image *img, char *buf, size_t len);
/* import.c: copies in (size bytes) to a new file at path (0600): a reflink where the filesystem
 * has them, else the data ranges only, so holes stay holes. 0 or a negative errno. */
int al_copy_sparse(int in, off_t size, const char *path);
/* disk.c: a new overlay on base (base_fmt: "qcow2", "raw") of size bytes whose backing chain is not
 * opened (a fork's, fork.c: the chain is spelled out in the domain's description instead), QEMU's.
 */
int al_disk_overlay_sized(virConnectPtr conn, bool kvm, const char *base, const char *base_fmt,
                          uint64_t size, const char *overlay, al_error *err);
/* src's content as it is now (its chain followed by its headers, while a VM holds it; not its
 * internal snapshots) into a new out of out_fmt, only what differs from backing (of
 * backing_fmt) when it is given. */
int al_disk_flatten(const char *src, const char *out, const char *out_fmt, const char *backing,
                    const char *backing_fmt, al_error *err);
/* Points a qcow2's header at another backing file (same content, another path), unchecked. */
int al_disk_rebase(const char *path, const char *backing, al_error *err);
/* Images made in the store (import.c, oci.c, commit.c). image.c: a scratch dir of the store
 * for image name (refused when the name is taken, unless force), dst its place; the swap into
 * the store. oci.c: the root disk (out, a qcow2) of a tree with bytes of data in entries; the
 * manifest (extra's fields plus the base image's boot parts, linked into scratch). */
/* Writes j as dir/manifest.json (new, 0644). */
int al_manifest_write(const char *dir, const cJSON *j, al_error *err);
int al_image_scratch(const char *name, bool force, const char *what, char *dst, size_t dlen,
                     char *tmp, size_t tlen, al_error *err);
int al_image_make_disk(const char *tree, uint64_t bytes, uint64_t entries, const char *out,
                       int log_fd, al_error *err);
int al_image_assemble(const char *scratch, const al_image *base, const char *name, cJSON *extra,
                      al_error *err);
int al_image_swap_in(const char *tmp, const char *dst, const char *name, bool force, al_error *err);
bool al_ssh_user_ok(const char *s);
/* What a Containerfile build hands buildah (buildctx.c): file checked for what would reach the
 * host and written to copy (new); the context src copied into dst (new) with every symlink
 * resolving inside it, what leads out left out (lines on log_fd). */
int al_build_check_containerfile(const char *file, const char *copy, al_error *err);
int al_build_copy_context(const char *src, const char *dst, uint64_t bytes_max, int log_fd,
                          al_error *err);

/* ---- disks and volumes for QEMU (disk.c, volume.c) ---- */
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

#endif

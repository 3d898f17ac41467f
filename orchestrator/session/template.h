/* template.c: warm-start templates kept, checked, saved and restored (warm.c builds them). */
#ifndef AIRLOCK_TEMPLATE_H
#define AIRLOCK_TEMPLATE_H

#include "session.h"

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
/* The disk's middle layers of a session restored from t, top first, NULL-terminated (NULL:
 * none, t is NULL or the image has no disk). */
const char *const *al_template_mids(const struct al_template *t);
/* A volume of a fork's source, as the save keeps it (fork.c): read-write ones copied whole
 * (DIR/volI.raw), read-only ones by their overlay (DIR/volI.qcow2, over the volume). */
struct al_fork_vol {
    char name[AL_VOL_NAME_MAX + 1];
    char path[256];
    bool read_only;
    uint64_t size;
};
/* A fork's save (fork.c makes it), as a session opened from it sees it. */
struct al_fork_save {
    const char *dir;        /* STATE/forks/ID: ram, state, disk.qcow2, mid1.qcow2 ... */
    const char *image;      /* the source's image */
    const char *image_disk; /* its base, where the disk chain ends ("": none) */
    const char *qemu;       /* al_qemu_identity where it was saved */
    const char *image_id;   /* al_image_identity of its image */
    bool kvm, disk;
    size_t nmids;       /* layers below disk.qcow2 */
    uint64_t disk_size; /* the disk's virtual size */
    const struct al_fork_vol *vols;
    size_t nvols;
};
/* At a fork's open, once its dirs exist: checks that s may take the save's state, holds the
 * save for s's lifetime (a link in s's state dir) and sets s->tmpl to restore it. */
int al_template_of_fork(al_session *s, const struct al_fork_save *fs, al_error *err);
/* A fork's save keeps its RAM file in /dev/shm/PREFIX.XXXXXX/ram when there is room (dir/ram
 * links to it; PREFIX.XXXXXX/save links back to dir, or for a spare holder's to its session's
 * state dir), else in dir/ram itself. */
#define AL_FORK_SHM_PREFIX "airlock-fork"
/* STATE/forks, made when missing. */
int al_forks_dir(char *buf, size_t len, al_error *err);
/* Removes the save in dir when no handle holds its lock and no fork links its state file;
 * al_fork_reap: every such save (a fork's close, gc). */
void al_fork_reap_dir(const char *dir);
void al_fork_reap(void);
bool al_template_is_fork(const struct al_template *t);
/* A fork's disk's virtual size (its overlay is made without opening the chain's headers). */
uint64_t al_template_disk_size(const struct al_template *t);
/* Sets cfg up for a restore of s->tmpl, starts the domain paused, loads the template's state,
 * resumes, handshakes and makes the guest unique. */
int al_template_restore(al_session *s, struct al_vm_config *cfg, al_error *err);
void al_template_free(struct al_template *t);
/* A restored guest made its own (REFRESH: the host's entropy and clock, the session's name, a
 * fresh machine-id): after a template's restore and a paused session's resume (keep.c). */
int al_session_make_unique(al_session *s, al_error *err);
/* Manifests (a template's, a snapshot's, fork.c): what each file was when it was sealed. */
struct al_file_rec {
    uint64_t size, ino;
    uint32_t uid, mode;
    int64_t mtime_ns, ctime_ns;
    char sha[65]; /* hex; empty: not recorded */
};
int al_file_record(const char *path, bool hash, struct al_file_rec *f);
void al_manifest_file_add(cJSON *files, const char *name, const struct al_file_rec *r);
/* DIR/manifest.json, written whole (new, 0600); read back only when ours, 0600, <= 64 KiB. */
int al_manifest_write_private(const char *dir, const cJSON *j, al_error *err);
cJSON *al_manifest_read(const char *dir, al_error *why);
/* Whether names[0..n) in dir are as j's "files" recorded them: owner, mode, size, inode,
 * mtime; ctime where bit i of ctime_mask is set (a hard link changes it); the SHA-256 where bit
 * i of hash_mask is. why says what differs. */
bool al_manifest_files_intact(const char *dir, const cJSON *j, const char *const *names, size_t n,
                              unsigned hash_mask, unsigned ctime_mask, al_error *why);
/* SHA-256 of a file's bytes, in hex. */
int al_sha256_file(const char *path, char out[65]);
/* An image's parts as files (base disk, kernel, initrd: inode, size, mtime), for saves that
 * must meet the same image again. */
void al_image_identity(const al_image *img, char *buf, size_t len);
/* What a saved VM state depends on: QEMU's and libvirt's versions, QEMU's binary. */
void al_qemu_identity(virConnectPtr conn, char *buf, size_t len);

#endif

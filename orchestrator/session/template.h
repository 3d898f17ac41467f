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
/* The template's frozen disk, the middle layer of the session's (NULL: none). */
const char *al_template_disk(const struct al_template *t);
/* Sets cfg up for a restore of s->tmpl, starts the domain paused, loads the template's state,
 * resumes, handshakes and makes the guest unique. */
int al_template_restore(al_session *s, struct al_vm_config *cfg, al_error *err);
void al_template_free(struct al_template *t);
/* A restored guest made its own (REFRESH: the host's entropy and clock, the session's name, a
 * fresh machine-id): after a template's restore and a paused session's resume (keep.c). */
int al_session_make_unique(al_session *s, al_error *err);
/* SHA-256 of a file's bytes, in hex. */
int al_sha256_file(const char *path, char out[65]);
/* What a saved VM state depends on: QEMU's and libvirt's versions, QEMU's binary. */
void al_qemu_identity(virConnectPtr conn, char *buf, size_t len);

#endif

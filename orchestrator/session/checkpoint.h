/* checkpoint.c: the library side of al_checkpoint_* beyond the public header. */
#ifndef AIRLOCK_CHECKPOINT_H
#define AIRLOCK_CHECKPOINT_H

#include "session.h"

/* checkpoint.c: sets up checkpoints for a session being opened (a scratch disk for images
 * without one, in cfg), and frees that state at close. */
/* The scratch disk that holds checkpoints of an image without a disk. */
#define AL_SCRATCH_BYTES (64ull << 20)
int al_checkpoints_prepare(al_session *s, struct al_vm_config *cfg, al_error *err);
void al_checkpoints_free(al_session *s);
/* A kept session taken back (keep.c): checkpoints allowed again on the disk that holds them;
 * those taken before are not listed (their snapshots stay in it until the session ends). */
int al_checkpoints_reattach(al_session *s, const char *disk, al_error *err);
/* The qcow2 that holds the snapshots, NULL without checkpoints. */
const char *al_checkpoints_disk(const al_session *s);
/* QEMU's snapshot tag of checkpoint id (commit.c reads its disk). */
void al_checkpoint_tag(uint32_t id, char *buf, size_t len);
/* checkpoint.c: the PING round trip that leaves the agent idle at a frame boundary. */
int al_session_barrier(al_session *s, al_error *err);
/* The description a crashed guest's QEMU is started again from (takes xml; freed without
 * checkpoints): a restored session's, without the restore's -incoming. */
int al_checkpoints_set_xml(al_session *s, char *xml);

#endif

/* vols.c: volumes (al_vol_*) attached to a session and mounted in its guest. */
#ifndef AIRLOCK_VOLS_H
#define AIRLOCK_VOLS_H

#include "session.h"

/* At open, once the dirs exist: each "NAME:/PATH[:ro]" checked, its lock taken (read-write:
 * alone; read-only: with other readers), into s->vols. */
int al_vols_attach(al_session *s, enum al_transport kind, const char *const *specs, al_error *err);
/* At a fork's open (the save in fs): each volume as the source had it, a copy-on-write overlay
 * of the save's copy (read-write ones), or of its read-only overlay over the volume, whose
 * shared lock it takes. */
struct al_fork_save;
int al_vols_of_fork(al_session *s, const struct al_fork_save *fs, al_error *err);
/* Their disks into the domain's configuration. */
void al_vols_config(al_session *s, struct al_vm_config *cfg);
/* Once the guest answers (a booted one, not a restored one): each made (first read-write use)
 * and mounted at its path. */
int al_vols_mount(al_session *s, al_error *err);
/* Before the VM ends (close): the read-write ones synced and unmounted, a few seconds at most
 * (a guest that refuses leaves a journal the next read-write mount replays). */
void al_vols_unmount(al_session *s);
/* The locks let go (close, detach). */
void al_vols_release(al_session *s);

#endif

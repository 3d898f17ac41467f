/* keep.c: sessions that outlive their process (al_session_opts.keep): marks, the record, detach,
 * reattach, pause and resume. */
#ifndef AIRLOCK_KEEP_H
#define AIRLOCK_KEEP_H

#include "session.h"

/* In both of a kept session's dirs: "KEEPER EXPIRES" (unix time, 0: none), renewed while a
 * process holds the session (al_keep_lease_start). gc (gc.c) leaves a dir holding it alone
 * until then, whoever holds its lock. */
#define AL_KEEP_MARK "keep"
/* A kept session outlives its holder's last sign of life by this long (AIRLOCK_KEEP_GRACE_S
 * overrides it): then gc may end it. */
#define AL_KEEP_GRACE_DEFAULT_S 300
/* In the state dir: the record (keeprec.c). */
#define AL_KEEP_RECORD "kept.json"

/* keeprec.c, below session.c and keep.c. A keeper's name: 1 to 63 of [A-Za-z0-9._-]. */
bool al_keeper_ok(const char *k);
/* At open, before the dirs: refuses what cannot be kept, sets s->keeper and its expiry. */
int al_keep_check(al_session *s, const al_session_opts *o, enum al_transport kind, al_error *err);
/* At open, once the dirs exist and before the domain starts: the marks and the record of what
 * al_session_reattach needs (kept.json in the state dir, 0600). */
int al_keep_record(al_session *s, al_error *err);
/* The marks in both dirs (again after a reattach made the runtime dir anew). */
int al_keep_marks(al_session *s, al_error *err);
/* The marks renewed by a thread while this process holds the session (a lease of the grace's
 * length, never past the lifetime's end). */
int al_keep_lease_start(al_session *s, al_error *err);
void al_keep_lease_stop(al_session *s);
/* The record, written whole and renamed into place; paused: the saved state's, or NULL. */
int al_keep_record_write(al_session *s, const cJSON *paused, al_error *err);

#endif

/* budget.c: what the session's disk may occupy on the host, watched. */
#ifndef AIRLOCK_BUDGET_H
#define AIRLOCK_BUDGET_H

#include "session.h"

/* budget.c: the watcher of the session's disk use, started once it booted; refusing requests
 * once it paused the VM; refusing a checkpoint that would not fit; the free-space floor. */
int al_budget_start(al_session *s, al_error *err);
void al_budget_stop(al_session *s);
int al_budget_room_for_checkpoint(const al_session *s, al_error *err);
uint64_t al_session_disk_usage(const al_session *s);
uint64_t al_free_floor(void);
int al_check_free_space(const char *dir, uint64_t floor, al_error *err);

#endif

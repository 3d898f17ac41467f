/* proc.c: processes by handle (al_exec_start), as the session's close ends them. */
#ifndef AIRLOCK_PROC_H
#define AIRLOCK_PROC_H

#include "session.h"

/* Ends the session's processes (al_exec_start) before it closes: their requests fail, their
 * threads are joined, their handles stay the callers'. */
void al_procs_end(al_session *s);

#endif

/* control.c: the session served to other processes (al_session_serve_control). */
#ifndef AIRLOCK_CONTROL_H
#define AIRLOCK_CONTROL_H

#include "session.h"

/* Ends the control socket's server, if any (control.c); before the session goes away. */
void al_control_stop(al_session *s);

#endif

/* gc.c: what crashed sessions left (domains, dirs, volumes, proxies), reaped. */
#ifndef AIRLOCK_GC_H
#define AIRLOCK_GC_H

#include "session.h"

int al_gc_conn(virConnectPtr conn, al_error *err);

#endif

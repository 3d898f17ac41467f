/* exec.c: running a command on the link, as the library's other parts use it. */
#ifndef AIRLOCK_EXEC_H
#define AIRLOCK_EXEC_H

#include "session.h"

/* exec.c: runs o for the library's own purposes (no stdin, output dropped, whatever o says of
 * them); a run that does not exit 0 is an error about what. */
int al_exec_quiet(al_session *s, al_exec_opts o, const char *what, al_error *err);
/* The caller's al_exec_opts into dst as the library uses them (checked by size, descriptors'
 * zero-means-none read as -1, AL_FD_STDIN as 0) and out checked to be filled: what al_exec and
 * al_attach_exec do first. */
int al_exec_take(al_exec_opts *dst, const al_exec_opts *src, al_exec_result *out, al_error *err);
/* al_exec of options al_exec_take already took (proc.c's thread runs what al_exec_start took). */
int al_exec_taken(al_session *s, const al_exec_opts *o, al_exec_result *out, al_error *err);
/* A tunnel's port and counts checked, for al_port_relay and al_attach_port. */
int al_port_args(unsigned port, al_port_counts *counts, al_error *err);

#endif

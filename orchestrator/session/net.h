/* net.c: network on request, the host's half (the proxy and the relay). */
#ifndef AIRLOCK_NET_H
#define AIRLOCK_NET_H

#include "session.h"

/* net.c: a session with network: its proxy started and the VM's NIC in cfg (prepare), the
 * relay once the guest is up (start), everything stopped (stop); gc's reaping of a crashed
 * session's proxy (reap). */
/* Where the guest's end of the tunnels listens (the NIC's forward's port in the guest). */
#define AL_NET_GUEST_TUNNEL_PORT 3129
int al_net_prepare(al_session *s, const al_session_opts *opts, struct al_vm_config *cfg,
                   al_error *err);
int al_net_start(al_session *s, al_error *err);
void al_net_stop(al_session *s);
/* After a checkpoint restore: the relay drops its tunnels (they lead into the guest's past) and
 * opens new ones; the restored agent has told the guest's forwarder to drop its own. */
void al_net_reset(al_session *s);
void al_net_reap(const char *session_dir);
/* One line of the proxy's access log into *out: 1, or 0 for a line that is not a request (a
 * connection that carried none, a malformed line). Method and host come out printable ASCII,
 * every field bounded; allow (NULL-terminated) tells a name refused as unlisted from one refused
 * for its address. Fuzzed by tests/fuzz/fuzz-netlog.c. */
int al_net_log_line(char *const *allow, char *line, al_net_request *out);

#endif

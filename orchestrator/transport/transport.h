/* The host side of a transport: how the agent's byte stream reaches this process.
 *
 * The guest agent has the same seam (guest-agent/agent_channel.c). A transport prepares what the
 * domain needs (a socket, or a NIC, keys and a seed), connects before a deadline and hands back
 * one stream socket carrying frames; the handshake, the request ids and the resync after a
 * checkpoint restore are the link's (link.c), the same for every transport. A transport knows
 * nothing of the session: what it needs of it comes in al_transport_env. A new transport is a
 * new file with an ops table, and one row in transport.c. */
#ifndef AIRLOCK_TRANSPORT_H
#define AIRLOCK_TRANSPORT_H

#include "vm.h"

/* What a transport may read of its session; the strings and the image live as long as it. */
struct al_transport_env {
    const char *name;       /* the session's name (the domain's) */
    const char *dir;        /* the session's runtime dir, where its files go */
    const char *agent_sock; /* the virtio-serial port's socket in dir */
    const char *console;    /* the serial console log, quoted when the guest does not answer */
    const al_image *img;
    virConnectPtr conn; /* to hand files to QEMU's user */
    int cancel_fd;      /* -1, or the caller's signal pipe: ends a wait */
    bool remote;        /* conn reaches another host: nothing of the domain is on our disk */
};

/* One connection to the agent. */
struct al_transport_conn {
    int fd;              /* a stream socket carrying frames; the caller's from now on */
    const char *eof_msg; /* what its end means here (valid until disconnect), or NULL */
};

/* One session's transport (struct al_transport would clash with the enum's tag). */
struct al_tport {
    const struct al_transport_ops *ops;
    struct al_transport_env env;
};

struct al_transport_ops {
    enum al_transport kind;
    const char *label; /* "SSH": in messages about the connection */
    const char *peer;  /* what answers first in the guest ("agent", "sshd") */
    /* The connection ends in the guest (sshd), not in QEMU: connecting succeeds only once the
     * guest runs, and after a snapshot restore the old connection is the abandoned future's, so
     * a new one is made once the guest runs again. Else it ends at QEMU's socket: it outlives
     * a restore, and a restarted QEMU is connected to before its guest runs. */
    bool guest_side;
    /* How long a first boot under a KVM nobody has proven gets to answer. */
    unsigned probe_ms;
    /* Waits before each reconnect attempt once lost() says the connection dropped. */
    const unsigned *reconnect_wait_ms;
    size_t reconnect_tries;

    /* The object, sized as the transport needs (al_tport first); NULL when out of memory. */
    struct al_tport *(*create)(void);
    void (*destroy)(struct al_tport *t);
    /* Before the domain starts: what the transport adds to it (cfg: the agent socket, a NIC,
     * the cloud-init seed) and the files it needs (keys). */
    int (*prepare)(struct al_tport *t, struct al_vm_config *cfg, bool kvm, al_error *err);
    /* The domain did not start with cfg for the reason in msg. 1: cfg changed (a forwarded
     * port somebody took meanwhile), start again; 0: not the transport's business. Optional. */
    int (*retry_start)(struct al_tport *t, struct al_vm_config *cfg, const char *msg,
                       al_error *err);
    /* Connects to the agent, retrying until deadline while the domain (dom) comes up. */
    int (*connect)(struct al_tport *t, virDomainPtr dom, uint64_t deadline,
                   struct al_transport_conn *out, al_error *err);
    /* After lost(): one attempt of a reconnect, the attempt-th (from 0). Optional. */
    int (*reconnect)(struct al_tport *t, unsigned attempt, struct al_transport_conn *out,
                     al_error *err);
    /* Whether the connection dropped (the next request reconnects); NULL: it does not drop
     * while the VM runs. */
    bool (*lost)(struct al_tport *t);
    /* Ends the connection; the fd handed out is the caller's to close. */
    void (*disconnect)(struct al_tport *t);
};

extern const struct al_transport_ops al_transport_virtio;
extern const struct al_transport_ops al_transport_ssh;
/* virtio's port through the libvirt connection (virDomainOpenChannel), for remote hosts. */
extern const struct al_transport_ops al_transport_stream;

/* The transport of kind for a session, env copied; -EINVAL for a kind this build lacks. For
 * virtio: the unix socket, or the libvirt stream (AIRLOCK_CHANNEL, or env->remote). SSH refuses
 * a remote host: its port forward would be on that host. */
int al_transport_new(enum al_transport kind, const struct al_transport_env *env,
                     struct al_tport **out, al_error *err);
/* The peer transport (transport/peer.c): argv run on this machine, speaking the agent's side on
 * its stdin and stdout; for tests of the link without a VM. */
int al_transport_peer(const char *const *argv, struct al_tport **out, al_error *err);
/* Disconnects and frees; NULL is fine. */
void al_transport_free(struct al_tport *t);

#endif

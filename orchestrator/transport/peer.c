/* The peer transport: the agent's side of the link is a process on this machine (`airlock-agent
 * --stdio`, or a scripted peer that plays a hostile guest), its stdin and stdout one end of a
 * socketpair. No VM: the link, the multiplexer and the host's limits are tested in seconds
 * against the real agent (tests/unit/test-link.c), as libvirt tests its QEMU agent code against
 * a scripted monitor. Not reachable from the public API: al_session_open_peer (session.h). */
#include "transport.h"

#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>

struct peer {
    struct al_tport t; /* first */
    char **argv;       /* the peer's command, owned */
    pid_t pid;         /* the running peer, or 0 */
};

static struct al_tport *peer_create(void)
{
    return calloc(1, sizeof(struct peer));
}

static void peer_stop(struct peer *p)
{
    if (p->pid <= 0)
        return;
    kill(p->pid, SIGKILL);
    while (waitpid(p->pid, NULL, 0) < 0 && errno == EINTR)
        ;
    p->pid = 0;
}

static void peer_destroy(struct al_tport *t)
{
    struct peer *p = (struct peer *)t;
    peer_stop(p);
    for (size_t i = 0; p->argv && p->argv[i]; i++)
        free(p->argv[i]);
    free(p->argv);
    free(p);
}

static int peer_prepare(struct al_tport *t, struct al_vm_config *cfg, bool kvm, al_error *err)
{
    (void)t, (void)cfg, (void)kvm, (void)err;
    return 0;
}

static int peer_connect(struct al_tport *t, virDomainPtr dom, uint64_t deadline,
                        struct al_transport_conn *out, al_error *err)
{
    (void)dom, (void)deadline;
    struct peer *p = (struct peer *)t;
    peer_stop(p);
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        return al_err(err, -errno, "socketpair: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(sv[0]);
        close(sv[1]);
        return al_err(err, -e, "fork: %s", strerror(e));
    }
    if (pid == 0) {
        if (dup2(sv[1], 0) < 0 || dup2(sv[1], 1) < 0)
            _exit(127);
        execvp(p->argv[0], p->argv);
        _exit(127);
    }
    close(sv[1]);
    p->pid = pid;
    *out = (struct al_transport_conn){.fd = sv[0], .eof_msg = "the peer process ended"};
    return 0;
}

static void peer_disconnect(struct al_tport *t)
{
    peer_stop((struct peer *)t);
}

static const struct al_transport_ops peer_ops = {
    .kind = AL_TRANSPORT_VIRTIO,
    .label = "peer",
    .peer = "agent",
    .guest_side = true,
    .probe_ms = 0,
    .create = peer_create,
    .destroy = peer_destroy,
    .prepare = peer_prepare,
    .connect = peer_connect,
    .disconnect = peer_disconnect,
};

int al_transport_peer(const char *const *argv, struct al_tport **out, al_error *err)
{
    struct peer *p = (struct peer *)peer_create();
    size_t n = 0;
    while (argv[n])
        n++;
    if (!p || !n || !(p->argv = calloc(n + 1, sizeof(char *)))) {
        free(p);
        return al_err(err, -ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++)
        if (!(p->argv[i] = strdup(argv[i]))) {
            peer_destroy(&p->t);
            return al_err(err, -ENOMEM, "out of memory");
        }
    p->t.ops = &peer_ops;
    *out = &p->t;
    return 0;
}

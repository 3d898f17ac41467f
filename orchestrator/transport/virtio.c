/* The virtio-serial transport: the agent is the guest's init and serves a virtio-serial port,
 * which QEMU binds to a unix socket in the session dir (vm.c). The host connects to that socket,
 * retrying while QEMU creates it; it is QEMU's, so it survives a checkpoint restore and never
 * drops while the VM runs. */
#include "transport.h"

#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>

/* Between tries while QEMU has not yet created the socket. */
#define CONNECT_RETRY_US 5000

static struct al_tport *virtio_create(void)
{
    return calloc(1, sizeof(struct al_tport));
}

static void virtio_destroy(struct al_tport *t)
{
    free(t);
}

static int virtio_prepare(struct al_tport *t, struct al_vm_config *cfg, bool kvm, al_error *err)
{
    (void)kvm;
    (void)err;
    cfg->agent_sock = t->env.agent_sock;
    return 0;
}

static int virtio_connect(struct al_tport *t, virDomainPtr dom, uint64_t deadline,
                          struct al_transport_conn *out, al_error *err)
{
    (void)dom;
    const char *path = t->env.agent_sock;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path))
        return al_err(err, -ENAMETOOLONG, "socket path too long: %s", path);
    strcpy(sa.sun_path, path);
    for (;;) {
        _cleanup_close_ int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return al_err(err, -errno, "socket: %s", strerror(errno));
        if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
            *out = (struct al_transport_conn){.fd = al_take_fd(&fd)};
            return 0;
        }
        if ((errno != ENOENT && errno != ECONNREFUSED) || al_now_ms() >= deadline)
            return al_err(err, -errno, "cannot connect to the agent socket: %s", strerror(errno));
        usleep(CONNECT_RETRY_US);
    }
}

static void virtio_disconnect(struct al_tport *t)
{
    (void)t; /* the channel holds the socket: closing it is all there is */
}

const struct al_transport_ops al_transport_virtio = {
    .kind = AL_TRANSPORT_VIRTIO,
    .label = "virtio-serial",
    .peer = "agent",
    .guest_side = false,
    .probe_ms = 6000,
    .create = virtio_create,
    .destroy = virtio_destroy,
    .prepare = virtio_prepare,
    .connect = virtio_connect,
    .disconnect = virtio_disconnect,
};

/* The transports this build has, by kind. */
#include "transport.h"

#include <string.h>

static const struct al_transport_ops *const transports[] = {
    [AL_TRANSPORT_VIRTIO] = &al_transport_virtio,
    [AL_TRANSPORT_SSH] = &al_transport_ssh,
};

/* The virtio-serial port is reached through the unix socket on the local disk, or through the
 * libvirt connection (transport/vir_stream.c): AIRLOCK_CHANNEL=socket|stream, else the stream for
 * a remote host (the socket is on that host's disk) and the socket otherwise. */
static int virtio_ops(bool remote, const struct al_transport_ops **ops, al_error *err)
{
    const char *e = getenv("AIRLOCK_CHANNEL");
    bool stream = remote;
    if (e && *e) {
        if (strcmp(e, "stream") && strcmp(e, "socket"))
            return al_err(err, -EINVAL, "AIRLOCK_CHANNEL=%s: socket or stream", e);
        if (!remote)
            stream = !strcmp(e, "stream");
    }
    *ops = stream ? &al_transport_stream : &al_transport_virtio;
    return 0;
}

int al_transport_new(enum al_transport kind, const struct al_transport_env *env,
                     struct al_tport **out, al_error *err)
{
    if ((size_t)kind >= sizeof(transports) / sizeof(transports[0]) || !transports[kind])
        return al_err(err, -EINVAL, "unknown transport %d (virtio or ssh)", (int)kind);
    const struct al_transport_ops *ops = transports[kind];
    if (kind == AL_TRANSPORT_SSH && env->remote)
        return al_err(err, -EOPNOTSUPP,
                      "the SSH transport works on the local host only (its port forward is on "
                      "the session's host); use an image with the virtio transport");
    if (kind == AL_TRANSPORT_VIRTIO) {
        int r = virtio_ops(env->remote, &ops, err);
        if (r < 0)
            return r;
    }
    struct al_tport *t = ops->create();
    if (!t)
        return al_err(err, -ENOMEM, "out of memory");
    t->ops = ops;
    t->env = *env;
    *out = t;
    return 0;
}

void al_transport_free(struct al_tport *t)
{
    if (!t)
        return;
    t->ops->disconnect(t);
    t->ops->destroy(t);
}

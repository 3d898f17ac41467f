/* The transports this build has, by kind. */
#include "transport.h"

#include <string.h>

static const struct al_transport_ops *const transports[] = {
    [AL_TRANSPORT_VIRTIO] = &al_transport_virtio,
    [AL_TRANSPORT_SSH] = &al_transport_ssh,
};

int al_transport_new(enum al_transport kind, const struct al_transport_env *env,
                     struct al_tport **out, al_error *err)
{
    if ((size_t)kind >= sizeof(transports) / sizeof(transports[0]) || !transports[kind])
        return al_err(err, -EINVAL, "unknown transport %d (virtio or ssh)", (int)kind);
    struct al_tport *t = transports[kind]->create();
    if (!t)
        return al_err(err, -ENOMEM, "out of memory");
    t->ops = transports[kind];
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

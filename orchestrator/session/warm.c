/* Opening a session, with the warm template built first where the caller asks for that
 * (AL_WARM_AUTO), and building templates (airlock image warm). Above session.c, which restores
 * templates, and template.c, which keeps them: building one boots a session. */
#include "session.h"
#include "template.h"

#include <stdarg.h>
#include <string.h>

/* As a session's own notices, before there is a session. */
static void warm_notice(const al_session_opts *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void warm_notice(const al_session_opts *o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    al_notice_route(o, fmt, ap);
    va_end(ap);
}

/* What a session of opts would be, without opening it: image, transport, libvirt connection,
 * accelerator, shape; and its template's identity. */
struct probe {
    al_session s;
    enum al_transport kind;
    struct al_template_id id;
};

static void probe_freep(struct probe **p)
{
    if (!*p)
        return;
    al_template_free((*p)->s.tmpl);
    al_image_free(&(*p)->s.img);
    if ((*p)->s.conn)
        virConnectClose((*p)->s.conn);
    free(*p);
}

static int probe_make(const al_session_opts *opts, struct probe **out, al_error *err)
{
    struct probe *p = calloc(1, sizeof(*p));
    if (!p)
        return al_err(err, -ENOMEM, "out of memory");
    __attribute__((cleanup(probe_freep))) struct probe *owned = p;
    al_session *s = &p->s;
    s->img.struct_size = sizeof(s->img);
    int r = al_image_load(opts->image ? opts->image : al_image_default(), &s->img, err);
    if (r < 0)
        return r;
    p->kind = opts->transport != AL_TRANSPORT_IMAGE ? opts->transport : s->img.transport;
    if (opts->raw_port)
        snprintf(s->raw_port, sizeof(s->raw_port), "%s", opts->raw_port);
    al_session_opts use = *opts;
    use.warm = AL_WARM_USE;
    if (!al_template_applies(s, &use, p->kind))
        return al_err(err, -ENOTSUP,
                      "image '%s' cannot have a warm template for these sessions (only images "
                      "with the agent as init, over virtio-serial, without a benchmark port or a "
                      "display)",
                      s->img.name);
    r = al_vm_connect(opts->connect_uri, &s->conn, err);
    if (r < 0)
        return r;
    enum al_kvm_state ks = al_kvm_state();
    if (ks == AL_KVM_UNPROVEN && !getenv("AIRLOCK_ACCEL"))
        return al_err(err, -EAGAIN,
                      "KVM is not proven on this boot yet: run one session first (it probes "
                      "KVM), then warm the image");
    s->kvm = al_kvm_state_usable(ks);
    unsigned mem = opts->memory_mib    ? opts->memory_mib
                   : s->img.memory_mib ? s->img.memory_mib
                                       : 256;
    r = al_template_id_of(s, p->kind, mem, opts->vcpus ? opts->vcpus : 1, &p->id, err);
    if (r < 0)
        return r;
    owned = NULL;
    *out = p;
    return 0;
}

/* Boots a session for the template on its staged RAM file, warms and saves it, and moves it
 * into place. */
static int build(struct probe *p, const al_session_opts *opts, al_error *err)
{
    char staging[AL_PATH_MAX], ram[AL_PATH_MAX];
    int lock = -1;
    int r = al_template_stage(p->s.conn, p->s.kvm, &p->id, staging, sizeof(staging), ram,
                              sizeof(ram), &lock, err);
    if (r != 0)
        return r < 0 ? r : 0;
    _cleanup_close_ int held = lock;
    /* The template holds no device the sessions lack, and nothing of the caller's. */
    al_session_opts o = *opts;
    o.warm = AL_WARM_OFF;
    o.memory_mib = p->id.mem;
    o.vcpus = p->id.vcpus;
    o.raw_port = NULL;
    o.checkpoints = false;
    o.console_to = NULL;
    o.lifetime_s = 0;
    o.cancel_fd = -1;
    al_session *s = NULL;
    r = al_session_open_for(&o, ram, &s, err);
    if (r == 0)
        r = al_template_save(s, &p->id, staging, err);
    al_session_close(s);
    if (r == 0)
        r = al_template_commit(&p->id, staging, err);
    if (r < 0)
        al_rmtree(staging);
    return r;
}

int al_template_build(const al_session_opts *in, al_error *err)
{
    __attribute__((cleanup(probe_freep))) struct probe *p = NULL;
    al_session_opts taken = AL_SESSION_OPTS_INIT;
    const al_session_opts *opts = &taken;
    int r = AL_SIZED_IN_SINCE(&taken, in, "al_session_opts", display, err);
    if (r < 0)
        return r;
    r = probe_make(opts, &p, err);
    if (r == -EAGAIN) {
        /* KVM not proven on this boot (a fresh machine): a session probes it first, so that the
         * template is built for what this host's sessions will use. */
        warm_notice(opts, "KVM is not proven on this boot yet: a session probes it first");
        al_session_opts po = *opts;
        po.warm = AL_WARM_OFF;
        al_session *ps = NULL;
        al_error perr = {0};
        r = al_session_open_for(&po, NULL, &ps, &perr);
        al_session_close(ps);
        if (r < 0)
            return al_err(err, r, "the session that probes KVM failed: %s", perr.msg);
        *err = (al_error){0};
        r = probe_make(opts, &p, err);
    }
    if (r < 0)
        return r;
    /* Built anew even when one exists: that one goes first. */
    r = al_template_replace(&p->id, err);
    return r < 0 ? r : build(p, opts, err);
}

/* AL_WARM_AUTO: the template is built before the session opens when there is none (or a stale
 * or refused one); what fails is a notice, and the session boots cold. */
static void ensure_template(const al_session_opts *opts)
{
    __attribute__((cleanup(probe_freep))) struct probe *p = NULL;
    al_error e = {0};
    const char *name = opts->image ? opts->image : al_image_default();
    if (probe_make(opts, &p, &e) < 0) {
        /* Sessions that are never restored, or a KVM this session is about to probe. */
        if (e.code != -ENOTSUP && e.code != -EAGAIN)
            warm_notice(opts, "cannot build the warm template of image '%s' (%s); booting cold",
                        name, e.msg);
        return;
    }
    al_error why = {0};
    switch (al_template_find(&p->s, &p->id, &why)) {
    case AL_TEMPLATE_FOUND:
        return;
    case AL_TEMPLATE_REFUSED:
        warm_notice(opts, "the warm template of image '%s' is not usable (%s); rebuilding it", name,
                    why.msg);
        break;
    case AL_TEMPLATE_STALE:
        warm_notice(opts, "the warm template of image '%s' is stale; rebuilding it", name);
        break;
    }
    if (build(p, opts, &e) < 0)
        warm_notice(opts, "cannot build the warm template of image '%s' (%s); booting cold", name,
                    e.msg);
}

int al_session_open(const al_session_opts *in, al_session **out, al_error *err)
{
    al_session_opts taken = AL_SESSION_OPTS_INIT;
    const al_session_opts *opts = &taken;
    int r = AL_SIZED_IN_SINCE(&taken, in, "al_session_opts", display, err);
    if (r < 0)
        return r;
    if (al_warm_mode(opts) == AL_WARM_AUTO)
        ensure_template(opts);
    return al_session_open_for(opts, NULL, out, err);
}

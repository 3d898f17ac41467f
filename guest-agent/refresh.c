/* REFRESH: what makes a guest restored from a template (orchestrator/session/template.c) its own.
 * Every session restored from one template starts with the same kernel RNG state, clock, hostname
 * and machine-id; the host sends this frame right after the restore's handshake, before any request
 * of the user's, and the agent applies it in its own process (no fork, no exec: the first
 * process a restored guest starts costs ~90 ms under emulation):
 *
 *   seed        64 bytes of host entropy: mixed into the kernel's pool (RNDADDENTROPY,
 *               credited) and the CRNG reseeded at once (RNDRESEEDCRNG), so getrandom,
 *               /dev/urandom and everything seeded from them diverge
 *   clock       the host's wall clock (CLOCK_REALTIME); the template's is from its build
 *   hostname    the session's name
 *   machine-id  16 bytes, written as 32 hex digits to /etc/machine-id (a new inode: the python
 *               kernel reseeds its generators when it sees one, kernels/python.py)
 *
 * The decoder (proto.c) has bounded every field; the values are the host's. */
#include "agent.h"

#include <fcntl.h>
#include <linux/random.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int reseed(const uint8_t *seed)
{
    struct {
        struct rand_pool_info info;
        uint8_t buf[AL_REFRESH_SEED];
    } in;
    in.info.entropy_count = AL_REFRESH_SEED * 8;
    in.info.buf_size = AL_REFRESH_SEED;
    memcpy(in.buf, seed, AL_REFRESH_SEED);
    _cleanup_close_ int fd = open("/dev/urandom", O_RDWR | O_CLOEXEC);
    int r = fd >= 0 && ioctl(fd, RNDADDENTROPY, &in) == 0 && ioctl(fd, RNDRESEEDCRNG) == 0;
    explicit_bzero(&in, sizeof(in));
    return r ? 0 : -1;
}

static int write_machine_id(const uint8_t *id)
{
    mkdir("/etc", 0755);
    _cleanup_close_ int fd = open("/etc/machine-id.airlock",
                                  O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0444);
    if (fd < 0)
        return -1;
    char line[2 * AL_MACHINE_ID + 2];
    for (size_t i = 0; i < AL_MACHINE_ID; i++)
        snprintf(line + 2 * i, 3, "%02x", id[i]);
    line[2 * AL_MACHINE_ID] = '\n';
    ssize_t n = 2 * AL_MACHINE_ID + 1;
    if (write(fd, line, (size_t)n) != n)
        return -1;
    return rename("/etc/machine-id.airlock", "/etc/machine-id");
}

void refresh_apply(struct agent *a, const struct al_msg *m)
{
    if (!a->can_refresh) {
        agent_send_error(a, m->id, AL_ERR_UNSUPPORTED, 0, "refresh not supported here");
        return;
    }
    const char *what = NULL;
    struct timespec ts = {.tv_sec = (time_t)m->u.refresh.sec, .tv_nsec = (long)m->u.refresh.nsec};
    if (reseed(m->u.refresh.seed) < 0)
        what = "cannot reseed the kernel's RNG";
    else if (clock_settime(CLOCK_REALTIME, &ts) < 0)
        what = "cannot set the clock";
    else if (sethostname(m->u.refresh.hostname.p, m->u.refresh.hostname.len) < 0)
        what = "cannot set the hostname";
    else if (write_machine_id(m->u.refresh.machine_id) < 0)
        what = "cannot write /etc/machine-id";
    if (what) {
        int e = errno;
        agent_send_error(a, m->id, errno_class(e), e, "%s: %s", what, strerror(e));
        return;
    }
    agent_log("refreshed: hostname %.*s", (int)m->u.refresh.hostname.len, m->u.refresh.hostname.p);
    /* A kernel the template holds started in the template's directory: the session's first run
     * of it says where it is to be, as it would have for a kernel started then. */
    for (int i = 0; i < KERNEL_MAX; i++)
        if (a->kernels[i].pid)
            a->kernels[i].fresh = true;
    struct al_msg ok = {.type = AL_OK, .id = m->id};
    agent_send(a, &ok);
}

/* airlock-agent --refresh: what makes a guest restored from a template (orchestrator/template.c)
 * its own. Every session restored from one template starts with the same kernel RNG state,
 * clock, hostname and machine-id; the host runs this right after the restore, with fresh values
 * on stdin, before any request of the user's:
 *
 *   seed HEX        64 bytes of host entropy (128 hex digits): mixed into the kernel's pool
 *                   (RNDADDENTROPY, credited) and the CRNG reseeded at once (RNDRESEEDCRNG), so
 *                   getrandom, /dev/urandom and everything seeded from them diverge
 *   clock SEC NSEC  the host's wall clock (CLOCK_REALTIME), the template's is from its build
 *   hostname NAME   the session's name
 *   machine-id HEX  32 hex digits, written to /etc/machine-id
 *
 * The input is the host's, but it is still parsed with bounds: one line each, in this order. */
#include "agent.h"

#include <ctype.h>
#include <fcntl.h>
#include <linux/random.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SEED_BYTES 64
#define INPUT_MAX 1024
#define HOSTNAME_MAX 63

static int unhex(const char *s, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (!isxdigit((unsigned char)s[2 * i]) || !isxdigit((unsigned char)s[2 * i + 1]) ||
            sscanf(s + 2 * i, "%2x", &v) != 1)
            return -1;
        out[i] = (uint8_t)v;
    }
    return s[2 * n] == '\0' ? 0 : -1;
}

static int fail(const char *what)
{
    fprintf(stderr, "airlock-agent --refresh: %s: %s\n", what, strerror(errno));
    return 1;
}

static int reseed(const uint8_t *seed)
{
    struct {
        struct rand_pool_info info;
        uint8_t buf[SEED_BYTES];
    } in;
    in.info.entropy_count = SEED_BYTES * 8;
    in.info.buf_size = SEED_BYTES;
    memcpy(in.buf, seed, SEED_BYTES);
    _cleanup_close_ int fd = open("/dev/urandom", O_RDWR | O_CLOEXEC);
    if (fd < 0 || ioctl(fd, RNDADDENTROPY, &in) < 0)
        return fail("RNDADDENTROPY");
    if (ioctl(fd, RNDRESEEDCRNG) < 0)
        return fail("RNDRESEEDCRNG");
    return 0;
}

static int write_machine_id(const char *hex)
{
    mkdir("/etc", 0755);
    _cleanup_close_ int fd = open("/etc/machine-id.airlock",
                                  O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0444);
    if (fd < 0)
        return fail("/etc/machine-id");
    char line[40];
    int n = snprintf(line, sizeof(line), "%s\n", hex);
    if (write(fd, line, (size_t)n) != n || rename("/etc/machine-id.airlock", "/etc/machine-id") < 0)
        return fail("/etc/machine-id");
    return 0;
}

int refresh_main(void)
{
    char buf[INPUT_MAX + 1];
    size_t have = 0;
    ssize_t n;
    while (have < INPUT_MAX && (n = read(0, buf + have, INPUT_MAX - have)) > 0)
        have += (size_t)n;
    buf[have] = '\0';
    char seed_hex[2 * SEED_BYTES + 2], name[HOSTNAME_MAX + 2], id[34];
    long long sec, nsec;
    uint8_t seed[SEED_BYTES], idb[16];
    if (sscanf(buf, "seed %129s clock %lld %lld hostname %64s machine-id %33s", seed_hex, &sec,
               &nsec, name, id) != 5 ||
        unhex(seed_hex, seed, SEED_BYTES) < 0 || unhex(id, idb, sizeof(idb)) < 0 || sec < 0 ||
        nsec < 0 || nsec >= 1000000000 || strlen(name) > HOSTNAME_MAX) {
        fprintf(stderr, "airlock-agent --refresh: malformed input\n");
        return 2;
    }
    if (reseed(seed))
        return 1;
    struct timespec ts = {.tv_sec = (time_t)sec, .tv_nsec = (long)nsec};
    if (clock_settime(CLOCK_REALTIME, &ts) < 0)
        return fail("clock_settime");
    if (sethostname(name, strlen(name)) < 0)
        return fail("sethostname");
    return write_machine_id(id);
}

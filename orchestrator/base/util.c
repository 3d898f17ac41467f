/* Small helpers: clocks, the runtime directory, files in shared places, recursive removal, a free
 * loopback port. */
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <linux/magic.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>

uint64_t al_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

uint64_t al_now_ms(void)
{
    return al_now_us() / 1000u;
}

void al_deadline_in(struct timespec *until, uint64_t ms)
{
    clock_gettime(CLOCK_REALTIME, until);
    until->tv_sec += (time_t)(ms / 1000);
    until->tv_nsec += (long)(ms % 1000) * 1000000;
    if (until->tv_nsec >= 1000000000) {
        until->tv_sec++;
        until->tv_nsec -= 1000000000;
    }
}

static int mkdir_p(const char *path, mode_t mode)
{
    char tmp[AL_PATH_MAX];
    if (snprintf(tmp, sizeof(tmp), "%s", path) >= (int)sizeof(tmp))
        return -ENAMETOOLONG;
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(tmp, mode) < 0 && errno != EEXIST)
            return -errno;
        *p = '/';
    }
    if (mkdir(tmp, mode) < 0 && errno != EEXIST)
        return -errno;
    return 0;
}

/* A directory we keep sessions in must be ours alone to change: someone who could create it
 * first, or write in it, could rename a session's dir and swap agent.sock or control.sock.
 * Refused unless it is a real directory (not a symlink), owned by us, with no group or other
 * write bit. When private is set, read and search bits for others are taken away as well. */
static int runtime_dir_check(const char *path, bool private, al_error *err)
{
    _cleanup_close_ int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0 && (errno == ENOTDIR || errno == ELOOP))
        return al_err(err, -EPERM, "refusing runtime directory '%s': not a directory (a symlink?)",
                      path);
    if (fd < 0 || fstat(fd, &st) < 0)
        return al_err(err, -errno, "cannot open runtime directory '%s': %s", path, strerror(errno));
    if (st.st_uid != geteuid())
        return al_err(err, -EPERM,
                      "refusing runtime directory '%s': owned by uid %u, not by us (uid %u); "
                      "someone else may have made it",
                      path, (unsigned)st.st_uid, (unsigned)geteuid());
    if (st.st_mode & (S_IWGRP | S_IWOTH))
        return al_err(err, -EPERM,
                      "refusing runtime directory '%s': writable by group or others (mode %04o)",
                      path, (unsigned)(st.st_mode & 07777));
    if (private && (st.st_mode & 077) && fchmod(fd, st.st_mode & 07700) < 0)
        return al_err(err, -errno, "cannot make runtime directory '%s' private: %s", path,
                      strerror(errno));
    return 0;
}

void al_vnotify(void (*fn)(void *ctx, const char *msg), void *ctx, const char *fmt, va_list ap)
{
    if (!fn)
        return;
    char msg[1024];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    fn(ctx, msg);
}

void al_printable(char *s)
{
    for (unsigned char *p = (unsigned char *)s; *p; p++)
        if (*p < 0x20 || *p > 0x7e)
            *p = '?';
}

/* The session dir goes away with the session, so a boot failure quotes the console itself:
 * its last non-empty line, printable characters only. */
void al_console_tail(const char *path, char *out, size_t len)
{
    snprintf(out, len, "(empty)");
    FILE *f = fopen(path, "re");
    char line[1024];
    while (f && fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\r\n")] = '\0';
        if (!line[0])
            continue;
        al_printable(line);
        size_t n = strlen(line) < len - 1 ? strlen(line) : len - 1; /* cut, on purpose */
        memcpy(out, line, n);
        out[n] = '\0';
    }
    if (f)
        fclose(f);
}

/* Where session directories live: /run/airlock for root, else $XDG_RUNTIME_DIR/airlock, else
 * /tmp/airlock-UID; $AIRLOCK_RUNTIME_DIR overrides. Each is checked by runtime_dir_check.
 * Modes: root's is 0755 because QEMU runs as libvirt's unprivileged user under qemu:///system
 * and must traverse it to bind agent.sock in the session dir (0755 too, session.c); /run is
 * root's alone, and the check still refuses a foreign owner or a write bit for others. Other
 * users' QEMU runs as themselves (qemu:///session), so theirs is 0700, made so if an older
 * airlock left it 0755. */
int al_runtime_dir(char *buf, size_t len, al_error *err)
{
    const char *over = getenv("AIRLOCK_RUNTIME_DIR");
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    bool root = geteuid() == 0;
    int n;
    if (over && *over)
        n = snprintf(buf, len, "%s", over);
    else if (root)
        n = snprintf(buf, len, "/run/airlock");
    else if (xdg && *xdg == '/')
        n = snprintf(buf, len, "%s/airlock", xdg);
    else
        n = snprintf(buf, len, "/tmp/airlock-%u", (unsigned)geteuid());
    if (n < 0 || (size_t)n >= len)
        return al_err(err, -ENAMETOOLONG, "runtime directory path too long");
    bool private = !root && !(over && *over);
    int r = mkdir_p(buf, private ? 0700 : 0755);
    if (r < 0)
        return al_err(err, r, "cannot create runtime directory '%s': %s", buf, strerror(-r));
    return runtime_dir_check(buf, private, err);
}

int al_file_create_private(const char *path, int flags)
{
    int extra = flags & (O_EXCL | O_APPEND | O_RDWR);
    /* O_NONBLOCK: a FIFO put in our way fails here instead of blocking; O_TRUNC only once the
     * file is known to be ours. */
    _cleanup_close_ int fd = open(path,
                                  (extra & O_RDWR ? 0 : O_WRONLY) | extra | O_CREAT | O_NOFOLLOW |
                                      O_NOCTTY | O_NONBLOCK | O_CLOEXEC,
                                  0600);
    if (fd < 0)
        return -errno;
    struct stat st;
    if (fstat(fd, &st) < 0)
        return -errno;
    if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || st.st_nlink != 1)
        return -EPERM;
    if ((st.st_mode & 077) && fchmod(fd, 0600) < 0)
        return -errno;
    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) < 0)
        return -errno;
    if ((flags & O_TRUNC) && ftruncate(fd, 0) < 0)
        return -errno;
    return al_take_fd(&fd);
}

mode_t al_umask(void)
{
    /* Read, not set: umask() would change it for every thread for a moment. */
    FILE *f = fopen("/proc/self/status", "re");
    char line[256];
    unsigned m = 0;
    bool found = false;
    while (f && !found && fgets(line, sizeof(line), f))
        found = sscanf(line, "Umask: %o", &m) == 1;
    if (f)
        fclose(f);
    if (found)
        return (mode_t)(m & 0777);
    mode_t old = umask(022); /* kernels before 4.7 only */
    umask(old);
    return old;
}

void al_machine_id(char *buf, size_t len)
{
    buf[0] = '\0';
    char id[64] = "";
    FILE *f = fopen("/etc/machine-id", "re");
    if (f) {
        if (!fgets(id, sizeof(id), f))
            id[0] = '\0';
        fclose(f);
    }
    id[strcspn(id, "\n")] = '\0';
    if (strlen(id) == 32 && strspn(id, "0123456789abcdef") == 32 && len > 32)
        snprintf(buf, len, "%s", id);
}

/* Where sessions keep their disks and checkpoints: disk-backed storage, never the runtime dir
 * (tmpfs on most hosts: a guest writing its disk would fill the host's RAM). $AIRLOCK_STATE_DIR,
 * else /var/lib/airlock/state for root, else $XDG_STATE_HOME/airlock (~/.local/state/airlock).
 * QEMU's user must traverse it, hence 0755; it must be ours and writable by nobody else. */
int al_state_dir(char *buf, size_t len, al_error *err)
{
    const char *over = getenv("AIRLOCK_STATE_DIR");
    const char *xdg = getenv("XDG_STATE_HOME");
    const char *home = getenv("HOME");
    int n;
    if (over && *over)
        n = snprintf(buf, len, "%s", over);
    else if (geteuid() == 0)
        n = snprintf(buf, len, "/var/lib/airlock/state");
    else if (xdg && *xdg == '/')
        n = snprintf(buf, len, "%s/airlock", xdg);
    else if (home && *home == '/')
        n = snprintf(buf, len, "%s/.local/state/airlock", home);
    else
        return al_err(err, -ENOENT, "no state directory: set HOME or AIRLOCK_STATE_DIR");
    if (n < 0 || (size_t)n >= len)
        return al_err(err, -ENAMETOOLONG, "state directory path too long");
    int r = mkdir_p(buf, 0755);
    if (r < 0)
        return al_err(err, r, "cannot create state directory '%s': %s", buf, strerror(-r));
    struct stat st;
    if (lstat(buf, &st) < 0)
        return al_err(err, -errno, "cannot inspect '%s': %s", buf, strerror(errno));
    if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022))
        return al_err(err, -EPERM,
                      "refusing state directory '%s': not a directory of ours, or writable by "
                      "others",
                      buf);
    return 0;
}

#define SHM_DIR "/dev/shm"

static uint64_t mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "re");
    char line[256];
    unsigned long long kib = 0;
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return (uint64_t)kib << 10;
}

int al_shm_mkdtemp(const char *prefix, uint64_t bytes, char *buf, size_t len)
{
    if (len)
        buf[0] = '\0';
    struct statfs fs;
    bool room = bytes && statfs(SHM_DIR, &fs) == 0 && fs.f_type == TMPFS_MAGIC &&
                (uint64_t)fs.f_bavail * (uint64_t)fs.f_bsize / 2 > bytes &&
                mem_available() / 2 > bytes;
    if (!room || al_pathf(buf, len, SHM_DIR "/%s.XXXXXX", prefix) < 0) {
        if (len)
            buf[0] = '\0';
        return -ENOSPC;
    }
    if (!mkdtemp(buf)) {
        buf[0] = '\0';
        return -errno;
    }
    return 0;
}

bool al_shm_dir_ours(const char *prefix, const char *path)
{
    char want[AL_PATH_MAX];
    if (al_pathf(want, sizeof(want), SHM_DIR "/%s.", prefix) < 0 ||
        strncmp(path, want, strlen(want)) || strlen(path) != strlen(want) + 6 ||
        strchr(path + strlen(want), '/'))
        return false;
    struct stat st;
    return lstat(path, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == geteuid();
}

int al_sessions_dir(char *buf, size_t len, bool state, al_error *err)
{
    char parent[AL_PATH_MAX];
    int r = state ? al_state_dir(parent, sizeof(parent), err)
                  : al_runtime_dir(parent, sizeof(parent), err);
    if (r < 0)
        return r;
    if (al_pathf(buf, len, "%s/sessions", parent) < 0)
        return al_err(err, -ENAMETOOLONG, "%s path too long", state ? "state" : "runtime");
    return 0;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path) < 0 && errno != ENOENT ? -1 : 0;
}

int al_rmtree(const char *path)
{
    if (nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS) < 0 && errno != ENOENT)
        return -errno;
    return 0;
}

int al_pathf(char *buf, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, len, fmt, ap);
    va_end(ap);
    return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

int al_free_port(unsigned *port, al_error *err)
{
    _cleanup_close_ int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sa);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &len) < 0)
        return al_err(err, -errno, "cannot find a free port: %s", strerror(errno));
    *port = ntohs(sa.sin_port);
    return 0;
}

int al_write_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int al_lock_file(const char *path)
{
    int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    while (flock(fd, LOCK_EX) < 0) {
        if (errno != EINTR) {
            int e = -errno;
            close(fd);
            return e;
        }
    }
    return fd;
}

void al_hexify(const unsigned char *b, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", b[i]);
    out[2 * n] = '\0';
}

const char *al_version(unsigned *number)
{
    /* the build's version (meson's project version) and the header's, held together by
     * tests/check-exports.py */
    if (number)
        *number = AIRLOCK_VERSION_NUMBER;
    return AIRLOCK_VERSION;
}

/* "al_exec_opts" to "AL_EXEC_OPTS_INIT". */
static const char *init_name(const char *type, char *buf, size_t len)
{
    size_t i = 0;
    for (const char *p = type; *p && i + 6 < len; p++)
        buf[i++] = (char)(*p >= 'a' && *p <= 'z' ? *p - 'a' + 'A' : *p);
    buf[i] = '\0';
    if (i >= 2 && strcmp(buf + i - 2, "_T") == 0) /* al_session_timing_t */
        buf[i - 2] = '\0';
    strcat(buf, "_INIT");
    return buf;
}

int al_sized_in(void *dst, size_t need, size_t min, const void *src, const char *type,
                al_error *err)
{
    size_t size = *(const size_t *)src;
    char init[80];
    if (size >= min && size < need) {
        memset(dst, 0, need);
        memcpy(dst, src, size);
        *(size_t *)dst = need;
        return 0;
    }
    if (size < need) {
        if (size == 0)
            return al_err(err, -EINVAL, "%s.struct_size is 0: start the struct from %s", type,
                          init_name(type, init, sizeof init));
        return al_err(err, -EINVAL,
                      "%s.struct_size is %zu, below the %zu this libairlock (%s) needs", type, size,
                      min, AIRLOCK_VERSION);
    }
    const unsigned char *tail = (const unsigned char *)src + need;
    for (size_t i = 0; i < size - need; i++)
        if (tail[i])
            return al_err(err, -E2BIG,
                          "%s sets fields this libairlock (%s) does not know (size %zu, it "
                          "knows %zu)",
                          type, AIRLOCK_VERSION, size, need);
    memcpy(dst, src, need);
    *(size_t *)dst = need;
    return 0;
}

int al_sized_out(void *out, size_t need, const char *type, al_error *err)
{
    size_t *size = out;
    char init[80];
    if (*size == 0)
        return al_err(err, -EINVAL, "%s.struct_size is 0: start the struct from %s", type,
                      init_name(type, init, sizeof init));
    if (*size < need)
        return al_err(err, -EINVAL,
                      "%s.struct_size is %zu, below the %zu this libairlock (%s) fills", type,
                      *size, need, AIRLOCK_VERSION);
    *size = need;
    return 0;
}

int al_grow(void *arr, size_t *cap, size_t n, size_t elem, size_t first)
{
    if (n < *cap)
        return 0;
    size_t want = *cap ? *cap * 2 : first;
    if (want < *cap || want > SIZE_MAX / elem)
        return -ENOMEM;
    void *v = realloc(*(void **)arr, want * elem);
    if (!v)
        return -ENOMEM;
    *(void **)arr = v;
    *cap = want;
    return 0;
}

void al_strv_free(char **v)
{
    for (char **p = v; p && *p; p++)
        free(*p);
    free(v);
}

char **al_strv_dup(const char *const *v)
{
    size_t n = 0;
    while (v && v[n])
        n++;
    char **out = calloc(n + 1, sizeof(*out));
    if (!out)
        return NULL;
    for (size_t i = 0; i < n; i++)
        if (!(out[i] = strdup(v[i]))) {
            al_strv_free(out);
            return NULL;
        }
    return out;
}

char *al_strdup_opt(const char *s, bool *oom)
{
    if (!s)
        return NULL;
    char *d = strdup(s);
    if (!d)
        *oom = true;
    return d;
}

char *al_base64(const uint8_t *p, size_t n)
{
    if (n > (SIZE_MAX / 4 - 1) * 3 || n > INT_MAX)
        return NULL;
    char *out = malloc((n + 2) / 3 * 4 + 1);
    if (out)
        EVP_EncodeBlock((unsigned char *)out, p, (int)n);
    return out;
}

bool al_store_name_ok(const char *n, size_t max)
{
    size_t len = n ? strlen(n) : 0;
    if (len < 1 || len > max || n[0] == '.')
        return false;
    for (const char *p = n; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '.' || *p == '_' || *p == '-'))
            return false;
    return true;
}

int al_state_subdir(const char *name, char *buf, size_t len, al_error *err)
{
    char state[AL_PATH_MAX];
    int r = al_state_dir(state, sizeof(state), err);
    if (r < 0)
        return r;
    if (al_pathf(buf, len, "%s/%s", state, name) < 0)
        return al_err(err, -ENAMETOOLONG, "state dir path too long");
    if (mkdir(buf, 0711) < 0 && errno != EEXIST)
        return al_err(err, -errno, "cannot create '%s': %s", buf, strerror(errno));
    return 0;
}

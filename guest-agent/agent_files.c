/* FILE_PUT and FILE_GET: paths resolved beneath --root, writes through a temporary file and a
 * rename, reads flow-controlled like stdout. */
#include "agent.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>

/* openat2 may ask for a retry when a rename raced with a ".." lookup. */
#define OPENAT2_TRIES 8

int files_open_root(struct agent *a, const char *root)
{
    a->root_fd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
    return a->root_fd < 0 ? -errno : 0;
}

/* Opens dir beneath root where openat2 is missing: resolves "." and ".." lexically, refusing
 * to climb out, then walks refusing symlinks, so that the lexical answer is the real one. */
static int walk_beneath(int root_fd, char *dir)
{
    static char *comp[AL_GUEST_PATH_MAX / 2 + 1];
    size_t n = 0;
    char *save;
    for (char *c = strtok_r(dir, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
        if (!strcmp(c, "..")) {
            if (n == 0)
                return -EXDEV;
            n--;
        } else if (strcmp(c, ".")) {
            comp[n++] = c;
        }
    }
    int fd = openat(root_fd, ".", O_PATH | O_DIRECTORY | O_CLOEXEC);
    for (size_t i = 0; fd >= 0 && i < n; i++) {
        int next = openat(fd, comp[i], O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        al_closep(&fd);
        fd = next;
    }
    return fd < 0 ? -errno : fd;
}

/* Opens the parent directory of a host path beneath the root and copies out the final name.
 * -EXDEV: the path escapes the root; -EINVAL: no usable final name. */
static int resolve(struct agent *a, struct al_str path, char name[NAME_MAX + 1])
{
    char buf[AL_GUEST_PATH_MAX + 1], here[] = ".";
    if (path.len && memchr(path.p, 0, path.len))
        return -EINVAL;
    memcpy(buf, path.p, path.len);
    buf[path.len] = '\0';

    char *rel = buf + strspn(buf, "/");
    char *slash = strrchr(rel, '/');
    char *base = slash ? slash + 1 : rel;
    char *dir = slash ? rel : here; /* writable: walk_beneath tokenizes it */
    if (slash)
        *slash = '\0';
    if (!*base || !strcmp(base, ".") || !strcmp(base, ".."))
        return -EINVAL;
    if (strlen(base) > NAME_MAX)
        return -ENAMETOOLONG;
    strcpy(name, base);

    struct open_how how = {.flags = O_PATH | O_DIRECTORY | O_CLOEXEC,
                           .resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS};
    long fd;
    int tries = 0;
    do
        fd = syscall(SYS_openat2, a->root_fd, dir, &how, sizeof(how));
    while (fd < 0 && (errno == EAGAIN || errno == EINTR) && ++tries < OPENAT2_TRIES);
    if (fd < 0 && errno == ENOSYS)
        return walk_beneath(a->root_fd, dir);
    return fd < 0 ? -errno : (int)fd;
}

static void path_error(struct agent *a, uint32_t id, int err, struct al_str path)
{
    char p[160];
    printable(path, p, sizeof(p));
    if (err == -EXDEV)
        agent_send_error(a, id, AL_ERR_INVALID, -err, "path escapes the root: %s", p);
    else if (err == -EINVAL)
        agent_send_error(a, id, AL_ERR_INVALID, -err, "bad path: %s", p);
    else
        agent_send_error(a, id, errno_class(-err), -err, "%s: %s", p, strerror(-err));
}

static void put_fail(struct agent *a, struct req *r, uint16_t klass, int err, const char *what)
{
    agent_send_error(a, r->id, klass, err, "%s%s%s", what, err ? ": " : "",
                     err ? strerror(err) : "");
    req_free(a, r);
}

void file_put_start(struct agent *a, const struct al_msg *m)
{
    char p[160];
    struct stat st;
    struct req *r = req_new(a, m->id, REQ_PUT);
    if (!r)
        return;
    int dir = resolve(a, m->u.file_put.path, r->name);
    if (dir < 0) {
        path_error(a, r->id, dir, m->u.file_put.path);
        req_free(a, r);
        return;
    }
    r->dir_fd = dir;
    if (fstatat(dir, r->name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode)) {
        agent_send_error(a, r->id, AL_ERR_INVALID, EISDIR, "target is a directory");
        req_free(a, r);
        return;
    }
    /* O_EXCL: never write through something already there (a planted symlink). */
    for (int i = 0; i < 4 && r->in_fd < 0; i++) {
        snprintf(r->tmp, sizeof(r->tmp), ".airlock-%d-%llu.tmp", (int)getpid(),
                 (unsigned long long)++a->counter);
        r->in_fd = openat(dir, r->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (r->in_fd < 0 && errno != EEXIST)
            break;
    }
    if (r->in_fd < 0) {
        int err = errno;
        r->tmp[0] = '\0';
        put_fail(a, r, errno_class(err), err, "cannot create a temporary file");
        return;
    }
    r->size = m->u.file_put.size;
    r->mode = m->u.file_put.mode;
    agent_log("put id=%u path=%s size=%llu", r->id, printable(m->u.file_put.path, p, sizeof(p)),
              (unsigned long long)r->size);
}

void file_put_data(struct agent *a, struct req *r, const struct al_msg *m)
{
    const uint8_t *p = m->u.data.data;
    size_t left = m->u.data.len;

    if (left > r->size - r->got) {
        put_fail(a, r, AL_ERR_INVALID, 0, "size mismatch");
        return;
    }
    while (left) {
        ssize_t n = write(r->in_fd, p, left);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            put_fail(a, r, errno_class(errno), errno, "write failed");
            return;
        }
        p += n;
        left -= (size_t)n;
    }
    r->got += m->u.data.len;
    if (!(m->flags & AL_FLAG_EOF)) {
        /* Written synchronously, so credited at once: the host never waits on the disk. */
        if (m->u.data.len)
            agent_send_credit(a, r->id, AL_STREAM_FILE, m->u.data.len);
        return;
    }
    if (r->got != r->size) {
        put_fail(a, r, AL_ERR_INVALID, 0, "size mismatch");
        return;
    }
    if (fchmod(r->in_fd, r->mode) < 0 || fsync(r->in_fd) < 0 ||
        renameat(r->dir_fd, r->tmp, r->dir_fd, r->name) < 0) {
        put_fail(a, r, errno_class(errno), errno, "cannot store the file");
        return;
    }
    r->tmp[0] = '\0';
    struct al_msg ok = {.type = AL_OK, .id = r->id};
    ok.u.ok.value = r->got;
    agent_send(a, &ok);
    req_free(a, r);
}

void file_get_start(struct agent *a, const struct al_msg *m)
{
    char name[NAME_MAX + 1], p[160];
    struct stat st;
    struct req *r = req_new(a, m->id, REQ_GET);
    if (!r)
        return;
    _cleanup_close_ int dir = resolve(a, m->u.file_get.path, name);
    if (dir < 0) {
        path_error(a, r->id, dir, m->u.file_get.path);
        req_free(a, r);
        return;
    }
    /* O_NONBLOCK: opening a FIFO must not hang the agent before fstat rejects it. */
    _cleanup_close_ int fd =
        openat(dir, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0 && errno != ELOOP) {
        path_error(a, r->id, -errno, m->u.file_get.path);
        req_free(a, r);
        return;
    }
    if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        agent_send_error(a, r->id, AL_ERR_INVALID, 0, "not a regular file: %s",
                         printable(m->u.file_get.path, p, sizeof(p)));
        req_free(a, r);
        return;
    }
    r->out[0] = (struct ostream){al_take_fd(&fd),      AL_STREAM_FILE, a->window, 0,
                                 (uint64_t)st.st_size, false};
    struct al_msg info = {.type = AL_FILE_INFO, .id = r->id};
    info.u.file_info.mode = st.st_mode & 07777;
    info.u.file_info.size = (uint64_t)st.st_size;
    agent_send(a, &info);
    agent_log("get id=%u path=%s size=%llu", r->id, printable(m->u.file_get.path, p, sizeof(p)),
              (unsigned long long)st.st_size);
}

void file_get_tick(struct agent *a, struct req *r)
{
    int err = ostream_pump(a, r, &r->out[0]);
    if (err < 0) {
        agent_send_error(a, r->id, AL_ERR_IO, -err, "read failed: %s", strerror(-err));
    } else if (r->out[0].fd < 0) {
        struct al_msg ok = {.type = AL_OK, .id = r->id};
        ok.u.ok.value = r->out[0].sent;
        agent_send(a, &ok);
    } else {
        return;
    }
    req_free(a, r);
}

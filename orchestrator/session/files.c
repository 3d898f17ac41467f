/* Copying files into and out of the guest in streamed, flow-controlled chunks. */
#include "link.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* A copy's guest sends a frame at least this often: a chunk, a credit, its end. A stopped agent
 * (SIGSTOP, a guest speaking for it) fails the copy, never holds the caller. */
#define FILE_STALL_MS 30000

static int guest_path_ok(const char *p, al_error *err)
{
    size_t n = strlen(p);
    if (n == 0 || n > AL_PATH_MAX)
        return al_err(err, -EINVAL, "bad guest path '%s'", p);
    return 0;
}

/* Before a copy, under the session's lock: a guest path we accept, a session ready for it. */
/* A copy is a request of its own (runs go on beside it, link.c): the path checked, the link
 * ready, the request begun (its id in *id; al_link_end ends it). */
static int file_begin(al_session *s, const char *guest_path, uint32_t *id, al_error *err)
{
    int r = guest_path_ok(guest_path, err);
    if (r == 0)
        r = al_link_ready(s, err);
    return r < 0 ? r : al_link_begin(s, -1, id, err);
}

/* The next frame of a copy: a guest that sends nothing for FILE_STALL_MS is not copying. */
static int file_recv(al_session *s, uint32_t id, struct al_msg *m, al_error *err)
{
    int r = al_link_recv_until(s, id, m, -1, -1, al_now_ms() + FILE_STALL_MS, err);
    if (r == -ETIMEDOUT && err->code == 0)
        return al_err(err, -ETIMEDOUT, "the guest agent sent nothing for %d s during a file copy",
                      FILE_STALL_MS / 1000);
    return r;
}

static int file_put(al_session *s, const char *host_path, const char *guest_path, uint32_t id,
                    al_error *err)
{
    int r;
    _cleanup_close_ int fd = open(host_path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0)
        return al_err(err, -errno, "cannot open '%s': %s", host_path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return al_err(err, -EINVAL, "'%s' is not a regular file", host_path);

    struct al_msg m = {.type = AL_FILE_PUT, .id = id};
    m.u.file_put.mode = st.st_mode & 0777;
    m.u.file_put.size = (uint64_t)st.st_size;
    m.u.file_put.path = al_str_cstr(guest_path);
    r = al_channel_send(&s->ch, &m, err);
    if (r < 0)
        return r;

    uint64_t credit = s->agent_window, sent = 0;
    bool eof_sent = false;
    uint8_t buf[AL_DATA_CHUNK_MAX];
    for (;;) {
        while (!eof_sent && credit > 0) {
            size_t want = credit < sizeof(buf) ? (size_t)credit : sizeof(buf);
            ssize_t n = read(fd, buf, want);
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0)
                return al_err(err, -errno, "cannot read '%s': %s", host_path, strerror(errno));
            if ((uint64_t)n + sent > (uint64_t)st.st_size)
                return al_err(err, -EIO, "'%s' grew while being copied", host_path);
            uint8_t flags = n == 0 || sent + (uint64_t)n == (uint64_t)st.st_size ? AL_FLAG_EOF : 0;
            r = al_channel_send_data(&s->ch, id, AL_STREAM_FILE, flags, buf, (size_t)n, err);
            if (r < 0)
                return r;
            sent += (uint64_t)n;
            credit -= (uint64_t)n;
            eof_sent = flags & AL_FLAG_EOF;
        }
        r = file_recv(s, id, &m, err);
        if (r < 0)
            return r;
        if (r == 0)
            return al_err(err, -ECANCELED, "file copy cancelled");
        if (m.type == AL_CREDIT && m.u.credit.stream == AL_STREAM_FILE &&
            credit + m.u.credit.bytes <= s->agent_window)
            credit += m.u.credit.bytes;
        else if (m.type == AL_OK && eof_sent)
            return 0;
        else if (m.type == AL_ERROR)
            return al_channel_guest_error(&m, guest_path, err);
        else
            return al_link_check(s,
                                 al_err(err, -EPROTO,
                                        "guest sent an unexpected %s frame during a file copy",
                                        al_type_name(m.type)),
                                 err);
    }
}

/* The host path to write: the user's path, or inside it when it is a directory, under the last
 * component of the guest path the user asked for (never a name the guest chose). */
static int get_target(const char *guest_path, const char *host_path, char *out, size_t len,
                      al_error *err)
{
    struct stat st;
    if (stat(host_path, &st) == 0 && S_ISDIR(st.st_mode)) {
        char copy[AL_PATH_MAX + 1];
        snprintf(copy, sizeof(copy), "%s", guest_path);
        const char *base = basename(copy);
        if (!*base || !strcmp(base, ".") || !strcmp(base, "..") || !strcmp(base, "/"))
            return al_err(err, -EINVAL, "cannot name a host file after guest path '%s'",
                          guest_path);
        if (snprintf(out, len, "%s/%s", host_path, base) >= (int)len)
            return al_err(err, -ENAMETOOLONG, "host path too long");
        return 0;
    }
    if (snprintf(out, len, "%s", host_path) >= (int)len)
        return al_err(err, -ENAMETOOLONG, "host path too long");
    return 0;
}

/* get_max: the most bytes the copy may hold (0: none beyond what the guest announced), checked
 * on the announced size before anything is written and again on every chunk. */
static int receive_file(al_session *s, uint32_t id, int fd, const char *guest_path,
                        uint64_t get_max, uint32_t *mode, al_error *err)
{
    struct al_msg m;
    bool have_info = false, eof = false;
    uint64_t size = 0, got = 0;
    for (;;) {
        int r = file_recv(s, id, &m, err);
        if (r < 0)
            return r;
        if (r == 0)
            return al_err(err, -ECANCELED, "file copy cancelled");
        switch (m.type) {
        case AL_ERROR:
            if (m.u.error.klass == AL_ERR_NOT_FOUND)
                return al_err(err, -ENOENT, "no such file in the guest: %s", guest_path);
            return al_channel_guest_error(&m, guest_path, err);
        case AL_FILE_INFO:
            if (have_info)
                return al_err(err, -EPROTO, "guest sent file info twice");
            have_info = true;
            size = m.u.file_info.size;
            if (get_max && size > get_max) /* refused before a byte is written */
                return al_err(err, -EFBIG, "'%s' is %llu bytes, over the limit of %llu", guest_path,
                              (unsigned long long)size, (unsigned long long)get_max);
            *mode = m.u.file_info.mode;
            break;
        case AL_DATA:
            if (!have_info || eof || m.u.data.stream != AL_STREAM_FILE)
                return al_err(err, -EPROTO, "guest sent file data out of order");
            /* The guest said how big the file is; it does not get to send more. */
            if (m.u.data.len > size - got)
                return al_err(err, -EPROTO, "guest sent more file data than it announced");
            if (get_max && got + m.u.data.len > get_max)
                return al_err(err, -EFBIG, "'%s' is over the limit of %llu bytes", guest_path,
                              (unsigned long long)get_max);
            for (uint32_t off = 0; off < m.u.data.len;) {
                ssize_t n = write(fd, m.u.data.data + off, m.u.data.len - off);
                if (n < 0 && errno == EINTR)
                    continue;
                if (n < 0)
                    return al_err(err, -errno, "cannot write the copy: %s", strerror(errno));
                off += (uint32_t)n;
            }
            got += m.u.data.len;
            eof = m.flags & AL_FLAG_EOF;
            if (m.u.data.len) {
                struct al_msg c = {.type = AL_CREDIT, .id = id};
                c.u.credit.stream = AL_STREAM_FILE;
                c.u.credit.bytes = m.u.data.len;
                r = al_channel_send(&s->ch, &c, err);
                if (r < 0)
                    return r;
            }
            break;
        case AL_OK:
            if (!eof || got != size)
                return al_err(err, -EPROTO, "guest ended the file after %llu of %llu bytes",
                              (unsigned long long)got, (unsigned long long)size);
            return 0;
        default:
            return al_err(err, -EPROTO, "guest sent an unexpected %s frame during a file copy",
                          al_type_name(m.type));
        }
    }
}

static int file_get(al_session *s, const char *guest_path, const char *host_path,
                    uint64_t max_bytes, uint32_t id, al_error *err)
{
    char target[AL_PATH_MAX];
    int r = get_target(guest_path, host_path, target, sizeof(target), err);
    if (r < 0)
        return r;
    char dir_copy[AL_PATH_MAX], tmp[AL_PATH_MAX];
    snprintf(dir_copy, sizeof(dir_copy), "%s", target); /* the same size */
    if (al_pathf(tmp, sizeof(tmp), "%s/.airlock-get-XXXXXX", dirname(dir_copy)) < 0)
        return al_err(err, -ENAMETOOLONG, "host path too long: '%s'", target);
    _cleanup_close_ int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0)
        return al_err(err, -errno, "cannot create a file next to '%s': %s", target,
                      strerror(errno));

    struct al_msg m = {.type = AL_FILE_GET, .id = id};
    m.u.file_get.path = al_str_cstr(guest_path);
    uint32_t mode = 0600;
    r = al_channel_send(&s->ch, &m, err);
    if (r >= 0)
        r = al_link_check(s, receive_file(s, id, fd, guest_path, max_bytes, &mode, err), err);
    /* Permission bits only, never set-id or sticky bits the guest asked for, and no more than
     * the user's umask lets a new file have, as cp would. */
    if (r >= 0 && fchmod(fd, mode & 0777 & ~al_umask()) < 0)
        r = al_err(err, -errno, "cannot set mode of '%s': %s", target, strerror(errno));
    if (r >= 0 && rename(tmp, target) < 0)
        r = al_err(err, -errno, "cannot write '%s': %s", target, strerror(errno));
    if (r < 0)
        unlink(tmp);
    return r;
}

static int file_put_request(al_session *s, const char *host_path, const char *guest_path,
                            al_error *err)
{
    uint32_t id = 0;
    int r = file_begin(s, guest_path, &id, err);
    if (r < 0)
        return r;
    r = file_put(s, host_path, guest_path, id, err);
    al_link_end(s, id);
    return r;
}

/* guest_dir/ + the host file's own name (a regular file's: never empty, "." or ".."). */
static int put_into(const char *guest_dir, const char *host_path, char *out, size_t len,
                    al_error *err)
{
    char copy[AL_PATH_MAX + 1];
    snprintf(copy, sizeof(copy), "%s", host_path);
    size_t n = strlen(guest_dir);
    if (snprintf(out, len, "%s%s%s", guest_dir, n && guest_dir[n - 1] == '/' ? "" : "/",
                 basename(copy)) >= (int)len)
        return al_err(err, -ENAMETOOLONG, "guest path too long: '%s'", guest_dir);
    return 0;
}

int al_file_put(al_session *s, const char *host_path, const char *guest_path, al_error *err)
{
    /* A directory as the target ("/tmp/", or "/tmp" that the guest says is one) gets the file
     * under its host name, as cp does. */
    char into[AL_PATH_MAX + 1];
    size_t n = strlen(guest_path);
    if (n && guest_path[n - 1] == '/') {
        int r = put_into(guest_path, host_path, into, sizeof(into), err);
        return r < 0 ? r : file_put_request(s, host_path, into, err);
    }
    int r = file_put_request(s, host_path, guest_path, err);
    if (r == -EISDIR) {
        al_error e = {0};
        r = put_into(guest_path, host_path, into, sizeof(into), &e);
        if (r == 0)
            r = file_put_request(s, host_path, into, &e);
        *err = e;
    }
    return r;
}

static int file_get_request(al_session *s, const char *guest_path, const char *host_path,
                            uint64_t max_bytes, al_error *err)
{
    uint32_t id = 0;
    int r = file_begin(s, guest_path, &id, err);
    if (r < 0)
        return r;
    r = file_get(s, guest_path, host_path, max_bytes, id, err);
    al_link_end(s, id);
    return r;
}

int al_file_get(al_session *s, const char *guest_path, const char *host_path, al_error *err)
{
    return file_get_request(s, guest_path, host_path, 0, err);
}

int al_file_get_max(al_session *s, const char *guest_path, const char *host_path,
                    uint64_t max_bytes, al_error *err)
{
    return file_get_request(s, guest_path, host_path, max_bytes, err);
}

/* The record of a kept session and its marks (keep.h): written at open (session.c) and by a
 * pause or resume (keep.c); read only by keep.c. */
#include "checkpoint.h"
#include "keep.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

bool al_keeper_ok(const char *k)
{
    size_t n = strlen(k);
    if (n == 0 || n > 63)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)k[i]) && !strchr("._-", k[i]))
            return false;
    return true;
}

int al_keep_check(al_session *s, const al_session_opts *o, enum al_transport kind, al_error *err)
{
    if (!o->keep)
        return 0;
    if (!al_keeper_ok(o->keep))
        return al_err(err, -EINVAL, "a keeper's name is 1 to 63 of [A-Za-z0-9._-]");
    if (s->remote)
        return al_err(err, -EOPNOTSUPP, "a session on another host is not kept");
    if (kind != AL_TRANSPORT_VIRTIO)
        return al_err(err, -EOPNOTSUPP,
                      "a session reached over SSH is not kept (its connection is this process's)");
    if (o->net.allow && o->net.allow[0])
        return al_err(err, -EOPNOTSUPP,
                      "a session with network on request is not kept (its proxy runs in this "
                      "process)");
    if (s->raw_port[0])
        return al_err(err, -EOPNOTSUPP, "a session with a benchmark port is not kept");
    snprintf(s->keeper, sizeof(s->keeper), "%s", o->keep);
    s->keep_expires = o->lifetime_s ? (int64_t)time(NULL) + o->lifetime_s : 0;
    return 0;
}

static int write_file(const char *path, const char *data, al_error *err)
{
    _cleanup_close_ int fd = al_file_create_private(path, O_TRUNC);
    if (fd < 0)
        return al_err(err, fd, "cannot write '%s': %s", path, strerror(-fd));
    size_t n = strlen(data);
    if (write(fd, data, n) != (ssize_t)n || fsync(fd) < 0)
        return al_err(err, -EIO, "cannot write '%s': %s", path, strerror(errno ? errno : EIO));
    return 0;
}

/* AIRLOCK_KEEP_GRACE_S, else AL_KEEP_GRACE_DEFAULT_S: how long a kept session outlives its
 * holder's last sign of life. */
static int64_t grace_s(void)
{
    const char *e = getenv("AIRLOCK_KEEP_GRACE_S");
    long long v = e && *e ? strtoll(e, NULL, 10) : 0;
    return v >= 10 && v <= 366ll * 86400 ? v : AL_KEEP_GRACE_DEFAULT_S;
}

int al_keep_marks(al_session *s, al_error *err)
{
    char mark[128], path[AL_PATH_MAX];
    /* A lease: the holder renews it (lease_main); once it stops (the holder died and nobody
     * took the session back) gc may end the session after the grace, or at its lifetime's
     * end if that comes first. */
    int64_t until = (int64_t)time(NULL) + grace_s();
    if (s->keep_expires && s->keep_expires < until)
        until = s->keep_expires;
    snprintf(mark, sizeof(mark), "%s %lld\n", s->keeper, (long long)until);
    const char *dirs[] = {s->dir, s->state_dir};
    for (size_t i = 0; i < 2; i++) {
        if (al_pathf(path, sizeof(path), "%s/" AL_KEEP_MARK, dirs[i]) < 0)
            return al_err(err, -ENAMETOOLONG, "session path too long");
        int r = write_file(path, mark, err);
        if (r < 0)
            return r;
    }
    return 0;
}

int al_keep_record_write(al_session *s, const cJSON *paused, al_error *err)
{
    _cleanup_cjson_ cJSON *j = cJSON_CreateObject();
    if (!j)
        return al_err(err, -ENOMEM, "out of memory");
    cJSON_AddStringToObject(j, "keeper", s->keeper);
    cJSON_AddStringToObject(j, "image", s->img.name);
    cJSON_AddNumberToObject(j, "transport", (double)s->kind);
    cJSON_AddNumberToObject(j, "disk_budget", (double)s->disk_budget);
    cJSON_AddNumberToObject(j, "expires", (double)s->keep_expires);
    cJSON_AddBoolToObject(j, "kvm", s->kvm);
    cJSON_AddBoolToObject(j, "display", s->screen != NULL);
    if (s->ckpt)
        cJSON_AddStringToObject(j, "checkpoint_disk", al_checkpoints_disk(s));
    if (paused)
        cJSON_AddItemToObject(j, "paused", cJSON_Duplicate(paused, true));
    _cleanup_free_ char *text = cJSON_PrintUnformatted(j);
    char path[AL_PATH_MAX], tmp[AL_PATH_MAX];
    if (!text)
        return al_err(err, -ENOMEM, "out of memory");
    if (al_pathf(path, sizeof(path), "%s/" AL_KEEP_RECORD, s->state_dir) < 0 ||
        al_pathf(tmp, sizeof(tmp), "%s/." AL_KEEP_RECORD, s->state_dir) < 0)
        return al_err(err, -ENAMETOOLONG, "session path too long");
    int r = write_file(tmp, text, err);
    if (r == 0 && rename(tmp, path) < 0)
        r = al_err(err, -errno, "cannot write '%s': %s", path, strerror(errno));
    return r;
}

int al_keep_record(al_session *s, al_error *err)
{
    int r = al_keep_marks(s, err);
    return r < 0 ? r : al_keep_record_write(s, NULL, err);
}

/* The lease's renewal, a thread per kept session while a process holds it. */
static void *lease_main(void *arg)
{
    al_session *s = arg;
    struct pollfd p = {s->lease_stop[0], POLLIN, 0};
    while (poll(&p, 1, (int)(grace_s() * 1000 / 4)) == 0) {
        al_error ignored = {0};
        al_keep_marks(s, &ignored); /* a full disk: the last mark stands until the next try */
    }
    return NULL;
}

int al_keep_lease_start(al_session *s, al_error *err)
{
    if (!s->keeper[0] || s->lease_running)
        return 0;
    if (pipe2(s->lease_stop, O_CLOEXEC) < 0)
        return al_err(err, -errno, "pipe: %s", strerror(errno));
    if (pthread_create(&s->lease_thread, NULL, lease_main, s) != 0) {
        al_closep(&s->lease_stop[0]);
        al_closep(&s->lease_stop[1]);
        return al_err(err, -EAGAIN, "cannot start the kept session's lease");
    }
    s->lease_running = true;
    return 0;
}

void al_keep_lease_stop(al_session *s)
{
    if (!s->lease_running)
        return;
    al_closep(&s->lease_stop[1]);
    pthread_join(s->lease_thread, NULL);
    al_closep(&s->lease_stop[0]);
    s->lease_running = false;
}

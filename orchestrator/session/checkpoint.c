/* Checkpoints: the whole VM (memory, devices, disk) saved and restored inside the running QEMU.
 *
 * Mechanism, measured on this kind of host (TCG, 512 MiB guest; docs/PERFORMANCE.md): QEMU's
 * own `savevm`/`loadvm` take about 0.3 s each inside the running process, where libvirt's
 * snapshot API takes longer to create and several times longer to revert, and libvirt 9.0
 * cannot revert external snapshots at all. So the library sends the HMP commands through
 * virDomainQemuMonitorCommand; libvirt then marks the domain "tainted" (custom monitor
 * commands), which only adds a line to its log. The snapshots are internal snapshots of the
 * session's qcow2 (the image's overlay, or a small scratch disk added for images without one),
 * so they go away with the session dir, and the disk grows by the clusters the guest changes
 * plus each checkpoint's memory state.
 *
 * After a restore the guest, agent included, is back in the past while the host's socket is
 * not: the host drops what it holds, sends a HELLO with a fresh nonce and ignores everything
 * until the HELLO_ACK that echoes it (docs/PROTOCOL.md). A checkpoint is only taken after a
 * PING/PONG round trip with no request open, so the restored agent has no request, no partial
 * input and no queued output.
 *
 * When the guest powers off (the agent died and init powered off) or panics (panic=-1 reboots,
 * on_reboot=destroy ends QEMU), QEMU exits; libvirt 9.0 refuses on_poweroff/on_reboot
 * 'preserve', and a preserved crashed guest would leave the channel silent instead of closed.
 * The snapshots survive in the qcow2, so a rollback then starts QEMU again, paused, from the
 * same domain description and loads the checkpoint into it (about 1.5 s). */
#include "checkpoint.h"
#include "budget.h"
#include "link.h"
#include "net.h"
#include "transport.h"

#include <libvirt/libvirt-qemu.h>
#include <libvirt/virterror.h>

#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* The scratch disk's virtual size: it only bounds what the guest can write to it; snapshots
 * are stored past its end and do not count. */
/* The whole re-handshake after a restore (link.c). */
#define RESYNC_MS 15000
/* recover: how long a live agent has to answer a fresh handshake before the VM is rolled back. */
#define PROBE_MS 3000
/* The PING before a savevm: the agent answers at once unless something is wrong. */
#define BARRIER_MS 10000
/* A checkpoint waits this long for requests in flight to end (a background process does not:
 * the checkpoint is refused, EBUSY); a restore, which ends them, this long for them to go. */
#define EXCLUSIVE_WAIT_MS 1000
#define RESTORE_WAIT_MS 5000
/* A guest that powered off or panicked: QEMU is exiting; wait this long for it to be gone
 * before starting a new one. */
#define EXIT_WAIT_MS 10000
/* How long a start again waits for libvirt to have removed the domain that ended. */
#define REMOVED_WAIT_MS 5000
/* Connecting to the agent socket of a QEMU started again. */
#define RESTART_CONNECT_MS 30000
/* QEMU's snapshot tag: ours, never the user's name, so no quoting in HMP is ever needed. */
#define TAG_FMT "airlock-ck%u"
/* HMP's answer quoted in an error: one line is enough. */
#define HMP_REPLY_MAX 200

struct ckpt {
    al_checkpoint_info info;
    uint64_t file_bytes; /* the disk's allocation right after it was taken */
};

struct al_checkpoints {
    char disk[AL_PATH_MAX]; /* the qcow2 holding the snapshots */
    char *xml; /* the running domain's description, to start QEMU again after it exited */
    struct ckpt list[AL_CHECKPOINTS_MAX]; /* oldest first */
    size_t n;
    uint32_t next_id;
    uint32_t current; /* the checkpoint the VM's state descends from; 0: none */
};

int al_checkpoints_prepare(al_session *s, struct al_vm_config *cfg, al_error *err)
{
    struct al_checkpoints *c = calloc(1, sizeof(*c));
    if (!c)
        return al_err(err, -ENOMEM, "out of memory");
    c->next_id = 1;
    s->ckpt = c;
    if (cfg->disk) {
        if (al_pathf(c->disk, sizeof(c->disk), "%s", cfg->disk) < 0)
            return al_err(err, -ENAMETOOLONG, "session path too long");
        return 0;
    }
    if (s->remote) {
        char vol[80];
        _cleanup_free_ char *path = NULL;
        al_session_volume(s, true, vol);
        int r = al_volume_create(s->conn, cfg->kvm, vol, AL_SCRATCH_BYTES, NULL, NULL, &path, err);
        if (r < 0)
            return r;
        s->scratch_made = true;
        if (al_pathf(c->disk, sizeof(c->disk), "%s", path) < 0)
            return al_err(err, -ENAMETOOLONG, "volume path too long");
        cfg->scratch = c->disk;
        return 0;
    }
    if (al_pathf(c->disk, sizeof(c->disk), "%s/scratch.qcow2", s->state_dir) < 0)
        return al_err(err, -ENAMETOOLONG, "session path too long");
    int r = al_disk_scratch(s->conn, cfg->kvm, c->disk, AL_SCRATCH_BYTES, err);
    if (r < 0)
        return r;
    cfg->scratch = c->disk;
    return 0;
}

int al_checkpoints_reattach(al_session *s, const char *disk, al_error *err)
{
    struct al_checkpoints *c = calloc(1, sizeof(*c));
    if (!c)
        return al_err(err, -ENOMEM, "out of memory");
    c->next_id = 1;
    s->ckpt = c;
    if (al_pathf(c->disk, sizeof(c->disk), "%s", disk) < 0)
        return al_err(err, -ENAMETOOLONG, "session path too long");
    return 0;
}

void al_checkpoint_tag(uint32_t id, char *buf, size_t len)
{
    snprintf(buf, len, TAG_FMT, id);
}

const char *al_checkpoints_disk(const al_session *s)
{
    return s->ckpt ? s->ckpt->disk : NULL;
}

void al_checkpoints_free(al_session *s)
{
    if (!s->ckpt)
        return;
    free(s->ckpt->xml);
    free(s->ckpt);
    s->ckpt = NULL;
}

/* The session's checkpoints, or NULL (err says why) when it was opened without them. */
static struct al_checkpoints *checkpoints(al_session *s, al_error *err)
{
    if (!s->ckpt)
        al_err(err, -ENOTSUP, "checkpoints are not enabled for this session");
    return s->ckpt;
}

static struct ckpt *find_id(struct al_checkpoints *c, uint32_t id)
{
    for (size_t i = 0; i < c->n; i++)
        if (c->list[i].info.id == id)
            return &c->list[i];
    return NULL;
}

/* The allocation of the disk holding the checkpoints: a file here, or a volume on a remote
 * host. */
static uint64_t file_bytes(const al_session *s, const char *path)
{
    if (s->remote) {
        char vol[80];
        al_session_volume(s, !s->vol_made, vol);
        return al_volume_allocation(s->conn, vol);
    }
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_blocks * 512u : 0;
}

/* Sends one HMP command; QEMU answers nothing on success and an error message otherwise. */
static int hmp(al_session *s, const char *what, const char *cmd, al_error *err)
{
    char *reply = NULL;
    if (virDomainQemuMonitorCommand(s->dom, cmd, &reply, VIR_DOMAIN_QEMU_MONITOR_COMMAND_HMP) < 0)
        return al_err_virt(err, -EIO, "cannot %s", what);
    _cleanup_free_ char *owned = reply;
    char line[HMP_REPLY_MAX];
    size_t n = 0;
    for (const char *p = reply ? reply : ""; *p && *p != '\n' && n < sizeof(line) - 1; p++)
        line[n++] = isprint((unsigned char)*p) ? *p : '?';
    while (n && isspace((unsigned char)line[n - 1]))
        n--;
    line[n] = '\0';
    if (n)
        return al_err(err, -EIO, "cannot %s: QEMU says: %s", what, line);
    return 0;
}

/* The saved memory and device state of snapshot tag, as QEMU's snapshot table has it; 0 when
 * it cannot tell. The reply comes from QEMU, which the guest cannot write to. */
static uint64_t state_size(al_session *s, const char *tag)
{
    char *reply = NULL;
    if (virDomainQemuMonitorCommand(s->dom, "{\"execute\": \"query-block\"}", &reply, 0) < 0)
        return 0;
    _cleanup_free_ char *owned = reply;
    _cleanup_cjson_ cJSON *j = cJSON_Parse(reply);
    const cJSON *dev;
    cJSON_ArrayForEach(dev, cJSON_GetObjectItemCaseSensitive(j, "return"))
    {
        const cJSON *inserted = cJSON_GetObjectItemCaseSensitive(dev, "inserted");
        const cJSON *image = cJSON_GetObjectItemCaseSensitive(inserted, "image");
        const cJSON *snap;
        cJSON_ArrayForEach(snap, cJSON_GetObjectItemCaseSensitive(image, "snapshots"))
        {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(snap, "name");
            const cJSON *size = cJSON_GetObjectItemCaseSensitive(snap, "vm-state-size");
            if (cJSON_IsString(name) && !strcmp(name->valuestring, tag) && cJSON_IsNumber(size) &&
                size->valuedouble > 0)
                return (uint64_t)size->valuedouble;
        }
    }
    return 0;
}

static bool domain_running(al_session *s)
{
    int state = 0, reason = 0;
    if (!s->dom || virDomainGetState(s->dom, &state, &reason, 0) < 0)
        return false;
    return state != VIR_DOMAIN_SHUTOFF && state != VIR_DOMAIN_SHUTDOWN &&
           state != VIR_DOMAIN_CRASHED;
}

/* Waits for the agent's PONG: every frame it sent before is then in, and it holds no partial
 * input, so a snapshot taken now restores an agent idle at a frame boundary. */
static int barrier(al_session *s, al_error *err)
{
    uint64_t cookie = al_now_us();
    struct al_msg m = {.type = AL_PING};
    m.u.ping.cookie = cookie;
    int r = al_channel_send(&s->ch, &m, err);
    if (r < 0)
        return r;
    uint64_t deadline = al_now_ms() + BARRIER_MS;
    for (;;) {
        r = al_channel_recv(&s->ch, &m, deadline, -1, -1, -1, -1, err);
        if (r == -ETIMEDOUT && err->code == 0)
            return al_err(err, -ETIMEDOUT, "the guest agent did not answer a ping");
        if (r < 0)
            return r;
        if (m.type == AL_PONG && m.u.ping.cookie == cookie)
            return 0;
        if ((r = al_link_stray_frame(s, &m, "while idle", err)) < 0)
            return r;
    }
}

/* Waits until QEMU has exited after a guest power-off or panic (destroying it if it hangs on),
 * then starts it again, paused, from the same description, and connects to the agent socket. */
static int restart(al_session *s, al_error *err)
{
    struct al_checkpoints *c = s->ckpt;
    if (!c->xml)
        return al_err(err, -ENOENT, "no description of the VM to start it again");
    uint64_t end = al_now_ms() + EXIT_WAIT_MS;
    int state = 0, reason = 0;
    while (s->dom && virDomainGetState(s->dom, &state, &reason, 0) == 0 &&
           state != VIR_DOMAIN_SHUTOFF) {
        if (al_now_ms() >= end) {
            virDomainDestroy(s->dom);
            break;
        }
        usleep(20 * 1000);
    }
    al_link_detach(s);
    if (s->dom) {
        virDomainFree(s->dom);
        s->dom = NULL;
    }
    /* AUTODESTROY as at first start: the new QEMU goes too if this process dies. libvirt
     * removes the ended transient domain after it reports it shut off: a start of the same
     * name meanwhile is refused ("already being removed"), so it is tried again a while. */
    uint64_t until = al_now_ms() + REMOVED_WAIT_MS;
    for (;;) {
        s->dom = virDomainCreateXML(s->conn, c->xml,
                                    VIR_DOMAIN_START_AUTODESTROY | VIR_DOMAIN_START_PAUSED);
        const virError *e = s->dom ? NULL : virGetLastError();
        if (s->dom || !e || !e->message || !strstr(e->message, "being removed") ||
            al_now_ms() >= until)
            break;
        usleep(50 * 1000);
    }
    if (!s->dom)
        return al_err_virt(err, -EIO, "cannot start the VM again");
    /* A connection into the guest (sshd) needs the guest running: al_link_resync makes it after
     * the resume. */
    if (s->tport->ops->guest_side)
        return 0;
    /* QEMU's socket: connected before the guest runs, so the restored port never sees its host
     * leave. */
    return al_link_connect(s, al_now_ms() + RESTART_CONNECT_MS, err);
}

/* Loads checkpoint id into the running QEMU, or into a new one when QEMU is gone, resumes the
 * guest and handshakes with the restored agent. */
static int restore(al_session *s, uint32_t id, al_error *err)
{
    char cmd[64];
    snprintf(cmd, sizeof(cmd), "loadvm " TAG_FMT, id);
    int r = -ESRCH;
    if (domain_running(s)) {
        al_error first = {0};
        r = hmp(s, "restore the checkpoint", cmd, &first);
        if (r < 0 && domain_running(s))
            return al_err(err, r, "%s", first.msg);
        /* else QEMU exited under us (the guest was powering off): start it again below. */
    }
    if (r < 0) {
        r = restart(s, err);
        if (r < 0)
            return r;
        r = hmp(s, "restore the checkpoint", cmd, err);
        if (r < 0)
            return r;
    }
    int state = 0, reason = 0;
    if (virDomainGetState(s->dom, &state, &reason, 0) == 0 && state == VIR_DOMAIN_PAUSED &&
        virDomainResume(s->dom) < 0)
        return al_err_virt(err, -EIO, "cannot resume the VM after the restore");
    r = al_link_resync(s, RESYNC_MS, err);
    if (r == 0)
        s->poisoned = false; /* the agent is the one from before the run that broke it */
    al_net_reset(s); /* network on request: no connection from before the restore survives */
    return r;
}

int al_checkpoints_set_xml(al_session *s, char *xml)
{
    if (!s->ckpt) {
        free(xml);
        return 0;
    }
    free(s->ckpt->xml);
    s->ckpt->xml = xml;
    return 0;
}

/* The channel alone (al_link_exclusive) for what, within wait_ms; its refusal says so. */
static int take_channel(al_session *s, unsigned wait_ms, const char *what, al_error *err)
{
    al_error busy = {0};
    int r = al_link_exclusive(s, wait_ms, &busy);
    return r < 0 ? al_err(err, r, "cannot %s now: %s", what, busy.msg) : 0;
}

int al_session_barrier(al_session *s, al_error *err)
{
    int r = al_link_ready(s, err);
    if (r == 0)
        r = al_link_exclusive(s, EXCLUSIVE_WAIT_MS, err);
    if (r < 0)
        return r;
    r = barrier(s, err);
    al_link_exclusive_end(s);
    return r;
}

static bool name_ok(const char *name)
{
    size_t n = strlen(name);
    bool digits = true;
    if (n == 0 || n > AL_CHECKPOINT_NAME_MAX)
        return false;
    for (const char *p = name; *p; p++) {
        if (*p <= 0x20 || *p >= 0x7f)
            return false;
        digits = digits && isdigit((unsigned char)*p);
    }
    return !digits;
}

static int drop(al_session *s, struct ckpt *k, al_error *err)
{
    struct al_checkpoints *c = s->ckpt;
    char cmd[64];
    snprintf(cmd, sizeof(cmd), "delvm " TAG_FMT, k->info.id);
    int r = hmp(s, "delete the checkpoint", cmd, err);
    if (r < 0)
        return r;
    uint32_t id = k->info.id;
    size_t i = (size_t)(k - c->list);
    memmove(&c->list[i], &c->list[i + 1], (c->n - i - 1) * sizeof(c->list[0]));
    c->n--;
    if (c->current == id) {
        /* The newest older one is still an ancestor of the VM's state. */
        c->current = 0;
        for (size_t j = 0; j < c->n; j++)
            if (c->list[j].info.id < id)
                c->current = c->list[j].info.id;
    }
    return 0;
}

int al_checkpoint_create(al_session *s, const char *name, al_checkpoint_info *out, al_error *err)
{
    int sized = out ? AL_SIZED_OUT(out, "al_checkpoint_info", err) : 0;
    if (sized < 0)
        return sized;
    AL_SESSION_LOCKED(s);
    struct al_checkpoints *c = checkpoints(s, err);
    if (!c)
        return -ENOTSUP;
    if (name && !name_ok(name))
        return al_err(err, -EINVAL,
                      "a checkpoint name is 1 to %d printable characters without spaces, not "
                      "all digits",
                      AL_CHECKPOINT_NAME_MAX);
    for (size_t i = 0; name && i < c->n; i++)
        if (!strcmp(c->list[i].info.name, name))
            return al_err(err, -EEXIST, "a checkpoint named '%s' exists already", name);
    int r = al_budget_refuse(s, err);
    if (r == 0)
        r = al_budget_room_for_checkpoint(s, err);
    if (r < 0)
        return r;
    if (c->n == AL_CHECKPOINTS_MAX) {
        struct ckpt *oldest = NULL;
        for (size_t i = 0; i < c->n && !oldest; i++)
            if (!c->list[i].info.name[0])
                oldest = &c->list[i];
        if (!oldest)
            return al_err(err, -ENOSPC, "%d named checkpoints exist: delete one first",
                          AL_CHECKPOINTS_MAX);
        r = drop(s, oldest, err);
        if (r < 0)
            return r;
    }
    if (!c->xml) {
        /* The live description, with the device addresses QEMU used: a restarted QEMU must
         * have the same devices in the same places to take the saved state. */
        c->xml = virDomainGetXMLDesc(s->dom, 0);
        if (!c->xml)
            return al_err_virt(err, -EIO, "cannot read the VM's description");
    }
    /* The agent idle at a frame boundary: no request may be in flight. */
    r = al_link_ready(s, err);
    if (r < 0)
        return r;
    if ((r = take_channel(s, EXCLUSIVE_WAIT_MS, "take a checkpoint", err)) < 0)
        return r;
    r = barrier(s, err);
    uint32_t id = c->next_id;
    char tag[32], cmd[64];
    snprintf(tag, sizeof(tag), TAG_FMT, id);
    snprintf(cmd, sizeof(cmd), "savevm %s", tag);
    uint64_t t0 = al_now_ms();
    if (r == 0)
        r = hmp(s, "take a checkpoint", cmd, err);
    al_link_exclusive_end(s);
    if (r < 0)
        return r;
    struct ckpt *k = &c->list[c->n];
    memset(k, 0, sizeof(*k));
    k->info.struct_size = sizeof(k->info);
    k->info.id = id;
    if (name)
        snprintf(k->info.name, sizeof(k->info.name), "%s", name);
    k->info.created = (int64_t)time(NULL);
    k->info.save_ms = (unsigned)(al_now_ms() - t0);
    k->file_bytes = file_bytes(s, c->disk);
    k->info.state_bytes = state_size(s, tag);
    uint64_t prev = c->n ? c->list[c->n - 1].file_bytes : 0;
    k->info.disk_bytes = k->file_bytes > prev ? k->file_bytes - prev : 0;
    c->n++;
    c->next_id++;
    c->current = id;
    if (out) {
        *out = k->info;
        out->current = true;
    }
    return (int)id;
}

int al_checkpoint_list(al_session *s, void (*fn)(void *ctx, const al_checkpoint_info *c), void *ctx,
                       al_error *err)
{
    AL_SESSION_LOCKED(s);
    struct al_checkpoints *c = checkpoints(s, err);
    if (!c)
        return -ENOTSUP;
    for (size_t i = 0; i < c->n; i++) {
        al_checkpoint_info info = c->list[i].info;
        info.current = info.id == c->current;
        fn(ctx, &info);
    }
    return (int)c->n;
}

int al_checkpoint_find(al_session *s, const char *id_or_name, al_checkpoint_info *out,
                       al_error *err)
{
    int r0 = AL_SIZED_OUT(out, "al_checkpoint_info", err);
    if (r0 < 0)
        return r0;
    AL_SESSION_LOCKED(s);
    struct al_checkpoints *c = checkpoints(s, err);
    if (!c)
        return -ENOTSUP;
    char *end = NULL;
    unsigned long id = strtoul(id_or_name, &end, 10);
    bool numeric = *id_or_name && !*end && isdigit((unsigned char)*id_or_name);
    for (size_t i = 0; i < c->n; i++) {
        const al_checkpoint_info *info = &c->list[i].info;
        if (numeric ? info->id == id : !strcmp(info->name, id_or_name)) {
            *out = *info;
            out->current = info->id == c->current;
            return 0;
        }
    }
    return al_err(err, -ENOENT, "no checkpoint '%.64s'", id_or_name);
}

int al_checkpoint_rollback(al_session *s, uint32_t id, al_error *err)
{
    AL_SESSION_LOCKED(s);
    struct al_checkpoints *c = checkpoints(s, err);
    if (!c)
        return -ENOTSUP;
    if (!find_id(c, id))
        return al_err(err, -ENOENT, "no checkpoint %u", id);
    /* What runs now runs in a future the VM leaves: those requests end. */
    al_link_fail_all(s, -ECANCELED, "the session was rolled back to a checkpoint");
    int r = take_channel(s, RESTORE_WAIT_MS, "roll back", err);
    if (r < 0)
        return r;
    r = restore(s, id, err);
    al_link_exclusive_end(s);
    if (r < 0)
        return r;
    c->current = id;
    return 0;
}

int al_checkpoint_delete(al_session *s, uint32_t id, al_error *err)
{
    AL_SESSION_LOCKED(s);
    struct al_checkpoints *c = checkpoints(s, err);
    if (!c)
        return -ENOTSUP;
    struct ckpt *k = find_id(c, id);
    if (!k)
        return al_err(err, -ENOENT, "no checkpoint %u", id);
    if (!domain_running(s))
        return al_err(err, -ESRCH, "the VM is not running: recover it first");
    return drop(s, k, err);
}

/* al_checkpoint_recover with the channel alone. */
static int recover(al_session *s, struct al_checkpoints *c, uint32_t *restored_id, al_error *err)
{
    /* A guest that broke the protocol is not asked whether it is fine. */
    if (domain_running(s) && !s->poisoned) {
        al_error probe = {0};
        if (al_link_resync(s, PROBE_MS, &probe) == 0)
            return 0; /* the agent answers: nothing to undo */
    }
    if (!c->current)
        return al_err(err, -ENOENT,
                      "the VM stopped answering and there is no checkpoint to "
                      "go back to");
    int r = restore(s, c->current, err);
    if (r < 0)
        return r;
    *restored_id = c->current;
    return 1;
}

int al_checkpoint_recover(al_session *s, uint32_t *restored_id, al_error *err)
{
    AL_SESSION_LOCKED(s);
    struct al_checkpoints *c = checkpoints(s, err);
    if (!c)
        return -ENOTSUP;
    al_link_fail_all(s, -ECONNRESET, "the guest stopped answering and is being recovered");
    int r = take_channel(s, RESTORE_WAIT_MS, "recover the session", err);
    if (r < 0)
        return r;
    r = recover(s, c, restored_id, err);
    al_link_exclusive_end(s);
    return r;
}

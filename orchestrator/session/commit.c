/* A session's root disk saved as a new image (al_image_commit): flattened by qemu-img, the
 * session's own secrets removed with debugfs (the disk is the guest's, so it is only ever read
 * as a file system image by a bounded helper, never mounted), and the image around it made as
 * oci.c makes one. */
#include "checkpoint.h"
#include "session.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

/* The guest's sync: seconds even for gigabytes of dirty pages under emulation. */
#define SYNC_TIMEOUT_MS 120000
/* debugfs and qemu-img read what the guest wrote: bounded like any helper that does. */
static const struct al_spawn_limits HELPER_LIMITS = {.cpu_s = 1800, .as_bytes = 4ul << 30};
/* A directory listing debugfs prints for us: far below this. */
#define LISTING_MAX (1 << 20)

AL_DEFINE_CLEANUP(rmtree_dir, char *, al_rmtree)

/* Runs a helper with its stdout into out_path (NULL: discarded). */
static int helper(const char *const *argv, const char *out_path, const char *what, al_error *err)
{
    _cleanup_close_ int out =
        open(out_path ? out_path : "/dev/null",
             out_path ? O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC : O_WRONLY | O_CLOEXEC, 0600);
    _cleanup_close_ int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (out < 0 || null < 0)
        return al_err(err, -errno, "cannot %s: %s", what, strerror(errno));
    int st = 0;
    int r = al_spawn_wait_limited(argv, out, null, &HELPER_LIMITS, &st);
    if (r < 0)
        return al_err(err, r, "cannot %s: %s: %s", what, argv[0], strerror(-r));
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        return al_err(err, -EIO, "cannot %s: %s failed (%s %d)", what, argv[0],
                      WIFEXITED(st) ? "status" : "signal",
                      WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    return 0;
}

/* A name debugfs may be given unquoted: the guest chose it. */
static bool plain_name(const char *s, size_t n)
{
    if (n == 0 || n > 200 || (n <= 2 && s[0] == '.' && (n == 1 || s[1] == '.')))
        return false;
    for (size_t i = 0; i < n; i++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-", s[i]))
            return false;
    return true;
}

/* The names in directory dir of the file system raw whose name starts with prefix, each as
 * "rm DIR/NAME[SUFFIX]" into cmds. debugfs -R "ls -p" prints /inode/mode/uid/gid/name/size/. */
static int add_removals(const char *raw, const char *scratch, const char *dir, const char *prefix,
                        const char *suffix, FILE *cmds, al_error *err)
{
    char req[300], out[AL_PATH_MAX];
    snprintf(req, sizeof(req), "ls -p %s", dir);
    if (al_pathf(out, sizeof(out), "%s/listing", scratch) < 0)
        return al_err(err, -ENAMETOOLONG, "path too long");
    const char *argv[] = {"debugfs", "-R", req, raw, NULL};
    int r = helper(argv, out, "list the disk's files", err);
    if (r < 0)
        return r;
    FILE *f = fopen(out, "re");
    if (!f)
        return al_err(err, -errno, "cannot read the listing: %s", strerror(errno));
    char line[512];
    size_t total = 0;
    while (fgets(line, sizeof(line), f) && (total += strlen(line)) < LISTING_MAX) {
        /* The fifth field is the name: after the line's fifth slash. */
        char *p = line[0] == '/' ? line : NULL;
        for (int i = 0; i < 4 && p; i++)
            p = strchr(p + 1, '/');
        char *end = p ? strchr(p + 1, '/') : NULL;
        if (!p || !end)
            continue;
        const char *name = p + 1;
        size_t n = (size_t)(end - name);
        if (!plain_name(name, n) || strncmp(name, prefix, strlen(prefix)) != 0)
            continue;
        fprintf(cmds, "rm %s/%.*s%s\n", dir, (int)n, name, suffix);
    }
    fclose(f);
    unlink(out);
    return 0;
}

/* What the session's programs kept of what was typed into them (the tokens a command line or a
 * REPL was given), in a home directory: no part of an image others start from. */
static const char *const HISTORIES[] = {
    ".bash_history",      ".python_history",
    ".node_repl_history", ".sqlite_history",
    ".lesshst",           ".viminfo",
    ".wget-hsts",         ".psql_history",
    ".mysql_history",     ".ipython/profile_default/history.sqlite",
};

/* What makes a machine this one: not for a new image that many sessions start from. */
static int scrub(const char *raw, const char *scratch, al_error *err)
{
    char cmdfile[AL_PATH_MAX];
    if (al_pathf(cmdfile, sizeof(cmdfile), "%s/scrub.debugfs", scratch) < 0)
        return al_err(err, -ENAMETOOLONG, "path too long");
    FILE *cmds = fopen(cmdfile, "wxe");
    if (!cmds)
        return al_err(err, -errno, "cannot write '%s': %s", cmdfile, strerror(errno));
    /* An empty machine-id, as the debian image ships: the next boot's agent writes one. */
    fputs("rm /etc/machine-id\nwrite /dev/null /etc/machine-id\nrm /etc/machine-id.airlock\n"
          "rm /var/lib/dbus/machine-id\nrm /var/lib/systemd/random-seed\n"
          "rm /root/.ssh/authorized_keys\n",
          cmds);
    for (size_t i = 0; i < sizeof(HISTORIES) / sizeof(HISTORIES[0]); i++)
        fprintf(cmds, "rm /root/%s\n", HISTORIES[i]);
    int r = add_removals(raw, scratch, "/etc/ssh", "ssh_host_", "", cmds, err);
    if (r == 0)
        r = add_removals(raw, scratch, "/home", "", "/.ssh/authorized_keys", cmds, err);
    for (size_t i = 0; r == 0 && i < sizeof(HISTORIES) / sizeof(HISTORIES[0]); i++) {
        char suffix[80];
        snprintf(suffix, sizeof(suffix), "/%s", HISTORIES[i]);
        r = add_removals(raw, scratch, "/home", "", suffix, cmds, err);
    }
    if (fclose(cmds) != 0 && r == 0)
        r = al_err(err, -EIO, "cannot write '%s'", cmdfile);
    if (r < 0)
        return r;
    /* A command that finds nothing to remove only prints so; -w writes the rest. */
    const char *argv[] = {"debugfs", "-w", "-f", cmdfile, raw, NULL};
    r = helper(argv, NULL, "remove the session's secrets from the disk", err);
    if (r < 0)
        return r;
    /* debugfs frees the blocks without clearing them: every free block is discarded (holes
     * punched in the raw file, read as zeros), so neither the secrets nor what the session
     * deleted are in the image (a root in its sessions reads /dev/vda), and the copy stores only
     * what is used. e2fsck's 1 is "errors fixed": the guest's file system, its business.
     * e2fsck discards nothing in a run that fixed something (a copy of a mounted file system
     * always has something: its orphans, its counts), so a first run fixes and a second, on a
     * clean file system, discards. */
    static const char *const fsck[2][7] = {{"e2fsck", "-f", "-y", NULL},
                                           {"e2fsck", "-f", "-y", "-E", "discard", NULL}};
    _cleanup_close_ int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
    for (int i = 0; i < 2; i++) {
        const char *run[7];
        int n = 0;
        for (; fsck[i][n]; n++)
            run[n] = fsck[i][n];
        run[n++] = raw;
        run[n] = NULL;
        int st = 0;
        r = al_spawn_wait_limited(run, null, null, &HELPER_LIMITS, &st);
        if (r < 0)
            return al_err(err, r, "cannot run e2fsck: %s", strerror(-r));
        if (!WIFEXITED(st) || WEXITSTATUS(st) > 1)
            return al_err(err, -EIO,
                          "the session's file system has errors e2fsck could not fix (status "
                          "%d): not saved",
                          WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
    }
    return 0;
}

/* The flattened disk, raw, into out: now (a sync in the guest, then the VM paused while qemu-img
 * reads) or as checkpoint id left it. */
static int copy_disk(al_session *s, uint32_t id, const char *out, al_error *err)
{
    char disk[AL_PATH_MAX], snap[64];
    const char *ck = al_checkpoints_disk(s);
    if (id) {
        al_checkpoint_info info = AL_CHECKPOINT_INFO_INIT;
        char idtext[16];
        snprintf(idtext, sizeof(idtext), "%u", id);
        int r = al_checkpoint_find(s, idtext, &info, err);
        if (r < 0)
            return r;
        if (!ck || al_pathf(disk, sizeof(disk), "%s", ck) < 0)
            return al_err(err, -ENOENT, "the session's checkpoints have no disk");
        al_checkpoint_tag(id, snap, sizeof(snap));
        char opt[80];
        snprintf(opt, sizeof(opt), "snapshot.name=%s", snap);
        const char *argv[] = {"qemu-img", "convert", "-q",  "-U", "-f", "qcow2", "-l",
                              opt,        "-O",      "raw", disk, out,  NULL};
        return helper(argv, NULL, "copy the checkpoint's disk", err);
    }
    if (al_pathf(disk, sizeof(disk), "%s/disk.qcow2", s->state_dir) < 0)
        return al_err(err, -ENAMETOOLONG, "path too long");
    al_exec_opts o = AL_EXEC_OPTS_INIT;
    const char *sync[] = {"sync", NULL};
    o.argv = sync;
    o.timeout_ms = SYNC_TIMEOUT_MS;
    al_exec_result res = AL_EXEC_RESULT_INIT;
    int r = al_exec(s, &o, &res, err);
    if (r < 0)
        return r;
    AL_SESSION_LOCKED(s);
    if (virDomainSuspend(s->dom) < 0)
        return al_err_virt(err, -EIO, "cannot pause the VM for the copy");
    const char *argv[] = {"qemu-img", "convert", "-q", "-U", "-f", "qcow2",
                          "-O",       "raw",     disk, out,  NULL};
    r = helper(argv, NULL, "copy the session's disk", err);
    if (virDomainResume(s->dom) < 0 && r == 0)
        r = al_err_virt(err, -EIO, "cannot resume the VM after the copy");
    return r;
}

int al_image_commit(al_session *s, const al_image_commit_opts *given, al_error *err)
{
    al_image_commit_opts taken = AL_IMAGE_COMMIT_OPTS_INIT;
    int r = AL_SIZED_IN(&taken, given, "al_image_commit_opts", err);
    if (r < 0)
        return r;
    const al_image_commit_opts *o = &taken;
    if (s->remote || !s->dom)
        return al_err(err, -EOPNOTSUPP, "only a session on this machine can be saved as an image");
    if (!s->img.disk[0] || !s->img.kernel[0])
        return al_err(err, -EOPNOTSUPP,
                      "image '%s' has no root disk and kernel: its sessions cannot be saved",
                      s->img.name);
    char dst[AL_PATH_MAX], tmp[AL_PATH_MAX], raw[AL_PATH_MAX], disk[AL_PATH_MAX];
    r = al_image_scratch(o->name, o->force, "commit", dst, sizeof(dst), tmp, sizeof(tmp), err);
    if (r < 0)
        return r;
    __attribute__((cleanup(rmtree_dir))) char *scratch = tmp;
    if (al_pathf(raw, sizeof(raw), "%s/root.raw", tmp) < 0 ||
        al_pathf(disk, sizeof(disk), "%s/rootfs.qcow2", tmp) < 0)
        return al_err(err, -ENAMETOOLONG, "path too long");
    r = copy_disk(s, o->checkpoint, raw, err);
    if (r == 0)
        r = scrub(raw, tmp, err);
    if (r < 0)
        return r;
    const char *conv[] = {"qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2", raw, disk, NULL};
    r = helper(conv, NULL, "convert the disk", err);
    unlink(raw);
    if (r < 0)
        return r;
    /* The new image: the old one's boot parts and defaults, the session as where it came from. */
    _cleanup_cjson_ cJSON *m = cJSON_CreateObject();
    cJSON *src = cJSON_AddObjectToObject(m, "source");
    cJSON *cfg = cJSON_AddObjectToObject(m, "config");
    cJSON *langs = cJSON_AddArrayToObject(m, "languages");
    if (!src || !cfg || !langs)
        return al_err(err, -ENOMEM, "out of memory");
    char from[160];
    snprintf(from, sizeof(from), "%s (image %s)", s->name, s->img.name);
    cJSON_AddStringToObject(src, "kind", "commit");
    cJSON_AddStringToObject(src, "path", from);
    cJSON *env = cJSON_AddArrayToObject(cfg, "env");
    cJSON *cmd = cJSON_AddArrayToObject(cfg, "cmd");
    for (char **e = s->img.env; env && e && *e; e++)
        cJSON_AddItemToArray(env, cJSON_CreateString(*e));
    for (char **e = s->img.cmd; cmd && e && *e; e++)
        cJSON_AddItemToArray(cmd, cJSON_CreateString(*e));
    if (s->img.workdir && *s->img.workdir)
        cJSON_AddStringToObject(cfg, "workdir", s->img.workdir);
    if (s->img.user && *s->img.user)
        cJSON_AddStringToObject(cfg, "user", s->img.user);
    char l[sizeof(s->img.languages)];
    snprintf(l, sizeof(l), "%s", s->img.languages);
    for (char *w = strtok(l, " "); w; w = strtok(NULL, " "))
        cJSON_AddItemToArray(langs, cJSON_CreateString(w));
    r = al_image_assemble(tmp, &s->img, o->name, m, err);
    if (r < 0)
        return r;
    return al_image_swap_in(tmp, dst, o->name, o->force, err);
}

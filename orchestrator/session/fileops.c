/* Listing, stat, removing and making guest paths: small shell commands run through al_exec
 * (busybox and coreutils alike), with their answers read as hostile: bounded output, bounded
 * names, every field checked. The agent's protocol has no frames for these; putting them here
 * keeps every front (the daemon, a future CLI command) on one reading. */
#include "session.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What the guest may answer: a listing of AL_FILE_LIST_MAX entries of ~300 bytes. */
#define OUTPUT_MAX (4u << 20)

struct capture {
    char *buf;
    size_t len;
    bool over;
};

static int on_out(void *ctx, int stream, const uint8_t *data, size_t len)
{
    struct capture *c = ctx;
    if (stream != 1 || c->over)
        return 0;
    if (c->len + len > OUTPUT_MAX) {
        c->over = true;
        return 0;
    }
    char *b = realloc(c->buf, c->len + len + 1);
    if (!b)
        return -ENOMEM;
    memcpy(b + c->len, data, len);
    c->buf = b;
    c->len += len;
    b[c->len] = 0;
    return 0;
}

/* Exit statuses the scripts use for errno values. */
enum { X_NOENT = 2, X_NOTDIR = 20, X_EXIST = 17, X_NOTEMPTY = 39, X_ISDIR = 21 };

static int run_script(al_session *s, const char *script, const char *path, const char *arg,
                      struct capture *c, al_error *err)
{
    if (path[0] != '/' || strlen(path) > AL_GUEST_PATH_MAX)
        return al_err(err, -EINVAL, "bad guest path '%s': absolute paths only", path);
    const char *argv[] = {"sh", "-c", script, "sh", path, arg ? arg : "", NULL};
    al_exec_opts o = {
        .struct_size = sizeof(al_exec_opts),
        .argv = argv,
        .stdin_fd = -1,
        .stdout_fd = -1,
        .stderr_fd = -1,
        .output = on_out,
        .output_ctx = c,
        .timeout_ms = 60000,
    };
    al_exec_result res = AL_EXEC_RESULT_INIT;
    int r = al_exec(s, &o, &res, err);
    if (r < 0)
        return r;
    if (c->over)
        return al_err(err, -E2BIG, "'%s': the guest's answer is over %u bytes", path, OUTPUT_MAX);
    if (res.how != AL_EXEC_EXITED)
        return al_err(err, -EIO, "'%s': the guest's command died", path);
    switch (res.value) {
    case 0:
        return 0;
    case X_NOENT:
        return al_err(err, -ENOENT, "'%s': no such file or directory", path);
    case X_NOTDIR:
        return al_err(err, -ENOTDIR, "'%s': not a directory", path);
    case X_EXIST:
        return al_err(err, -EEXIST, "'%s': exists already", path);
    case X_NOTEMPTY:
        return al_err(err, -ENOTEMPTY, "'%s': directory not empty", path);
    case X_ISDIR:
        return al_err(err, -EISDIR, "'%s': is a directory", path);
    default:
        return al_err(err, -EIO, "'%s': the guest's command failed (%d)", path, res.value);
    }
}

/* A user's or group's name as the guest gave it: 1 to 32 of [A-Za-z0-9._-]. */
static bool name_ok(const char *s)
{
    size_t n = strlen(s);
    return n && n <= 32 &&
           strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == n;
}

/* One record: "SIZE MODE MTIME OWNER GROUP TYPE WORDS\n", the name and a NUL, then a symlink's
 * resolved target and a NUL. Returns the bytes read, or -EPROTO. */
static int parse_entry(const char *p, size_t len, al_file_info *out)
{
    const char *nl = memchr(p, '\n', len);
    if (!nl || nl - p > 200)
        return -EPROTO;
    char line[208];
    memcpy(line, p, (size_t)(nl - p));
    line[nl - p] = 0;
    unsigned long long size;
    unsigned mode;
    long long mtime;
    char owner[40], group[40];
    int used = 0;
    if (sscanf(line, "%llu %o %lld %39s %39s %n", &size, &mode, &mtime, owner, group, &used) != 5 ||
        used == 0 || mode > 07777)
        return -EPROTO;
    const char *type = line + used;
    const char *name = nl + 1;
    const char *end = memchr(name, 0, len - (size_t)(name - p));
    if (!end || end == name || (size_t)(end - name) >= sizeof(out->name))
        return -EPROTO;
    memset(out, 0, sizeof(*out));
    out->struct_size = sizeof(*out);
    memcpy(out->name, name, (size_t)(end - name));
    out->size = size;
    out->mode = mode;
    out->mtime = mtime;
    out->type = !strncmp(type, "regular", 7)     ? AL_ENTRY_FILE
                : !strcmp(type, "directory")     ? AL_ENTRY_DIR
                : !strcmp(type, "symbolic link") ? AL_ENTRY_SYMLINK
                                                 : AL_ENTRY_OTHER;
    if (name_ok(owner))
        snprintf(out->owner, sizeof(out->owner), "%s", owner);
    if (name_ok(group))
        snprintf(out->group, sizeof(out->group), "%s", group);
    if (out->type != AL_ENTRY_SYMLINK)
        return (int)(end + 1 - p);
    const char *t = end + 1, *tend = memchr(t, 0, len - (size_t)(t - p));
    if (!tend || (size_t)(tend - t) >= sizeof(out->link_target))
        return -EPROTO;
    if (t[0] == '/') /* resolved: absolute; anything else is left unsaid */
        memcpy(out->link_target, t, (size_t)(tend - t));
    return (int)(tend + 1 - p);
}

#define STAT_FMT                                                                                   \
    "stat -c '%s %a %Y %U %G %F' -- \"$f\" && printf '%s\\0' \"$n\" && "                           \
    "{ [ ! -L \"$f\" ] || printf '%s\\0' \"$(readlink -f -- \"$f\" 2>/dev/null)\"; }"

int al_file_stat(al_session *s, const char *guest_path, al_file_info *out, al_error *err)
{
    static const char script[] = "f=$1; [ -e \"$f\" ] || [ -L \"$f\" ] || exit 2; "
                                 "n=${f##*/}; [ -n \"$n\" ] || n=/; " STAT_FMT;
    struct capture c = {0};
    int r = AL_SIZED_OUT(out, "al_file_info", err);
    if (r < 0)
        return r;
    r = run_script(s, script, guest_path, NULL, &c, err);
    al_file_info st = AL_FILE_INFO_INIT;
    if (r == 0 && (c.len == 0 || parse_entry(c.buf, c.len, &st) != (int)c.len))
        r = al_err(err, -EPROTO, "'%s': the guest's stat answer is malformed", guest_path);
    free(c.buf);
    if (r == 0)
        *out = st;
    return r;
}

int al_file_list(al_session *s, const char *guest_dir,
                 void (*fn)(void *ctx, const al_file_info *st), void *ctx, al_error *err)
{
    static const char script[] =
        "[ -d \"$1\" ] || { [ -e \"$1\" ] && exit 20; exit 2; }; cd -- \"$1\" || exit 2; "
        "for n in * .[!.]* ..?*; do [ -e \"$n\" ] || [ -L \"$n\" ] || continue; f=./$n; " STAT_FMT
        "; done; exit 0";
    struct capture c = {0};
    int r = run_script(s, script, guest_dir, NULL, &c, err);
    int n = 0;
    for (size_t off = 0; r == 0 && off < c.len;) {
        al_file_info st = AL_FILE_INFO_INIT;
        int k = parse_entry(c.buf + off, c.len - off, &st);
        if (k < 0 || strchr(st.name, '/') || !strcmp(st.name, ".") || !strcmp(st.name, ".."))
            r = al_err(err, -EPROTO, "'%s': the guest's listing is malformed", guest_dir);
        else if (n == AL_FILE_LIST_MAX)
            r = al_err(err, -E2BIG, "'%s': over %d entries", guest_dir, AL_FILE_LIST_MAX);
        else {
            fn(ctx, &st);
            n++;
            off += (size_t)k;
        }
    }
    free(c.buf);
    return r < 0 ? r : n;
}

int al_file_remove(al_session *s, const char *guest_path, bool recursive, al_error *err)
{
    static const char script[] =
        "f=$1; [ -e \"$f\" ] || [ -L \"$f\" ] || exit 2; "
        "if [ -d \"$f\" ] && [ ! -L \"$f\" ]; then "
        "  if [ \"$2\" = r ]; then rm -rf -- \"$f\" || exit 1; else rmdir -- \"$f\" 2>/dev/null "
        "|| exit 39; fi; "
        "else rm -f -- \"$f\" || exit 1; fi";
    if (!strcmp(guest_path, "/"))
        return al_err(err, -EINVAL, "refusing to remove '/'");
    struct capture c = {0};
    int r = run_script(s, script, guest_path, recursive ? "r" : "", &c, err);
    free(c.buf);
    return r;
}

int al_file_mkdir(al_session *s, const char *guest_path, bool parents, al_error *err)
{
    static const char script[] =
        "f=$1; if [ \"$2\" = p ]; then [ -d \"$f\" ] && exit 0; [ -e \"$f\" ] && exit 17; "
        "mkdir -p -- \"$f\" || exit 1; "
        "else [ -e \"$f\" ] || [ -L \"$f\" ] && exit 17; [ -d \"${f%/*}/\" ] || exit 2; "
        "mkdir -- \"$f\" || exit 1; fi";
    struct capture c = {0};
    int r = run_script(s, script, guest_path, parents ? "p" : "", &c, err);
    free(c.buf);
    return r;
}

/* Saved conversations: one JSON file per conversation, rewritten atomically after every
 * exchange, so a crash or a kill loses at most the exchange in flight. The API key is never
 * part of it. */
#include "chat.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "util.h"

#define CONV_FILE_MAX (64u << 20) /* a conversation larger than this is not one we wrote */
#define CONV_VERSION 1

static int mkdirs(char *path)
{
    for (char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        int r = mkdir(path, 0700);
        *p = '/';
        if (r < 0 && errno != EEXIST)
            return -errno;
    }
    if (mkdir(path, 0700) < 0 && errno != EEXIST)
        return -errno;
    return 0;
}

/* $XDG_<kind>_HOME/airlock/<sub>, created. */
static int xdg_dir(const char *env, const char *fallback, const char *sub, char *buf, size_t len,
                   al_error *err)
{
    const char *x = getenv(env);
    const char *home = getenv("HOME");
    int n;
    if (x && *x == '/')
        n = snprintf(buf, len, "%s/airlock/%s", x, sub);
    else if (home && *home == '/')
        n = snprintf(buf, len, "%s/%s/airlock/%s", home, fallback, sub);
    else
        return al_err(err, -ENOENT, "neither $%s nor $HOME is set", env);
    if (n < 0 || (size_t)n >= len)
        return al_err(err, -ENAMETOOLONG, "the %s path is too long", sub);
    int r = mkdirs(buf);
    if (r < 0)
        return al_err(err, r, "cannot create %s: %s", buf, strerror(-r));
    return 0;
}

int al_data_dir(const char *sub, char *buf, size_t len, al_error *err)
{
    return xdg_dir("XDG_DATA_HOME", ".local/share", sub, buf, len, err);
}

int al_conv_dir(char *buf, size_t len, al_error *err)
{
    return al_data_dir("conversations", buf, len, err);
}

int al_profile_dir(char *buf, size_t len, al_error *err)
{
    return xdg_dir("XDG_CONFIG_HOME", ".config", "profiles", buf, len, err);
}

static bool valid_id(const char *id)
{
    size_t n = strlen(id);
    if (!n || n >= sizeof(((al_conv_info *)0)->id))
        return false;
    for (const char *p = id; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') || *p == '-'))
            return false;
    return true;
}

static cJSON *conv_json(const al_chat *c)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "version", CONV_VERSION);
    cJSON_AddStringToObject(j, "id", c->id);
    cJSON_AddNumberToObject(j, "created", (double)c->created);
    cJSON_AddNumberToObject(j, "updated", (double)time(NULL));
    cJSON_AddStringToObject(j, "model", c->cfg.model.model ? c->cfg.model.model : "");
    cJSON_AddStringToObject(j, "api", al_api_name(c->cfg.model.api));
    cJSON_AddStringToObject(j, "api_base", c->cfg.model.api_base ? c->cfg.model.api_base : "");
    cJSON_AddStringToObject(j, "image", c->cfg.image ? c->cfg.image : "");
    cJSON_AddStringToObject(j, "system", c->system ? c->system : "");
    cJSON *u = cJSON_AddObjectToObject(j, "usage");
    cJSON_AddNumberToObject(u, "input_tokens", (double)c->input_tokens);
    cJSON_AddNumberToObject(u, "output_tokens", (double)c->output_tokens);
    cJSON_AddItemToObject(j, "messages", cJSON_Duplicate(c->messages, true));
    return j;
}

/* Temp file in the same directory, fsync, rename: readers see the old or the new file. */
static int write_atomic(const char *path, const char *text, al_error *err)
{
    char tmp[AL_PATH_MAX];
    if (snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof(tmp))
        return al_err(err, -ENAMETOOLONG, "path too long: %s", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return al_err(err, -errno, "cannot write %s: %s", tmp, strerror(errno));
    int r = al_write_all(fd, text, strlen(text));
    if (!r && fsync(fd) < 0)
        r = -errno;
    if (close(fd) < 0 && !r)
        r = -errno;
    if (!r && rename(tmp, path) < 0)
        r = -errno;
    if (r) {
        unlink(tmp);
        return al_err(err, r, "cannot save %s: %s", path, strerror(-r));
    }
    return 0;
}

int al_conv_save_file(const al_chat *c, const char *path, al_error *err)
{
    _cleanup_cjson_ cJSON *j = conv_json(c);
    _cleanup_free_ char *text = j ? cJSON_Print(j) : NULL;
    if (!text)
        return al_err(err, -ENOMEM, "out of memory");
    return write_atomic(path, text, err);
}

int al_conv_save(al_chat *c, al_error *err)
{
    if (!c->save_path) {
        char dir[AL_PATH_MAX];
        int r = al_conv_dir(dir, sizeof(dir), err);
        if (r < 0)
            return r;
        if (!c->id[0]) {
            unsigned char rnd[3] = {0};
            if (getrandom(rnd, sizeof(rnd), 0) < 0)
                memset(rnd, 0, sizeof(rnd));
            time_t t = (time_t)c->created;
            struct tm tm;
            gmtime_r(&t, &tm);
            char stamp[32];
            strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &tm);
            snprintf(c->id, sizeof(c->id), "%s-%02x%02x%02x", stamp, rnd[0], rnd[1], rnd[2]);
        }
        if (asprintf(&c->save_path, "%s/%s.json", dir, c->id) < 0) {
            c->save_path = NULL;
            return al_err(err, -ENOMEM, "out of memory");
        }
    }
    return al_conv_save_file(c, c->save_path, err);
}

static cJSON *read_json(const char *path, al_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return al_err(err, -errno, "cannot open %s: %s", path, strerror(errno)), NULL;
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > CONV_FILE_MAX) {
        close(fd);
        return al_err(err, -EINVAL, "%s is not a conversation file", path), NULL;
    }
    char *buf = malloc((size_t)st.st_size + 1);
    size_t off = 0;
    while (buf && off < (size_t)st.st_size) {
        ssize_t n = read(fd, buf + off, (size_t)st.st_size - off);
        if (n <= 0)
            break;
        off += (size_t)n;
    }
    close(fd);
    if (!buf)
        return al_err(err, -ENOMEM, "out of memory"), NULL;
    buf[off] = '\0';
    cJSON *j = cJSON_Parse(buf);
    free(buf);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return al_err(err, -EINVAL, "%s is not valid conversation JSON", path), NULL;
    }
    return j;
}

/* Only well-formed messages are taken, so a hand-edited file cannot break a request. */
static int take_messages(al_chat *c, cJSON *j, const char *path, al_error *err)
{
    cJSON *msgs = cJSON_GetObjectItemCaseSensitive(j, "messages");
    if (!cJSON_IsArray(msgs))
        return al_err(err, -EINVAL, "%s has no message list", path);
    cJSON *m;
    cJSON_ArrayForEach(m, msgs)
    {
        const char *role = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "role"));
        if (!cJSON_IsObject(m) || !role ||
            (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "tool")))
            return al_err(err, -EINVAL, "%s holds a message with a bad role", path);
        if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(m, "content")))
            return al_err(err, -EINVAL, "%s holds a message without content", path);
    }
    /* Checkpoints belonged to the VM that is gone. */
    cJSON_ArrayForEach(m, msgs) cJSON_DeleteItemFromObjectCaseSensitive(m, "checkpoint");
    cJSON_Delete(c->messages);
    c->messages = cJSON_DetachItemViaPointer(j, msgs);
    cJSON *u = cJSON_GetObjectItemCaseSensitive(j, "usage");
    c->input_tokens =
        (uint64_t)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(u, "input_tokens"));
    c->output_tokens =
        (uint64_t)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(u, "output_tokens"));
    return 0;
}

int al_conv_load_file(al_chat *c, const char *path, al_error *err)
{
    _cleanup_cjson_ cJSON *j = read_json(path, err);
    if (!j)
        return err->code;
    return take_messages(c, j, path, err);
}

struct newest {
    char id[64];
    int64_t updated;
};

static void pick_newest(void *ctx, const al_conv_info *ci)
{
    struct newest *n = ctx;
    if (!n->id[0] || ci->updated > n->updated ||
        (ci->updated == n->updated && strcmp(ci->id, n->id) > 0)) {
        snprintf(n->id, sizeof(n->id), "%s", ci->id);
        n->updated = ci->updated;
    }
}

int al_conv_load(al_chat *c, const char *id, al_error *err)
{
    struct newest n = {0};
    if (!id) {
        int r = al_conv_list(pick_newest, &n, err);
        if (r < 0)
            return r;
        if (!n.id[0])
            return al_err(err, -ENOENT, "there is no saved conversation to resume");
        id = n.id;
    }
    if (!valid_id(id))
        return al_err(err, -EINVAL, "'%s' is not a conversation id", id);
    char dir[AL_PATH_MAX];
    int r = al_conv_dir(dir, sizeof(dir), err);
    if (r < 0)
        return r;
    _cleanup_free_ char *path = NULL;
    if (asprintf(&path, "%s/%s.json", dir, id) < 0)
        return al_err(err, -ENOMEM, "out of memory");
    if (access(path, F_OK) < 0)
        return al_err(err, -ENOENT, "no saved conversation '%s' (see 'airlock conversations')", id);
    r = al_conv_load_file(c, path, err);
    if (r < 0)
        return r;
    /* Continuing means saving back to the same file. */
    snprintf(c->id, sizeof(c->id), "%s", id);
    free(c->save_path);
    c->save_path = TAKE_PTR(path);
    return 0;
}

static void first_line(char *dst, size_t len, const char *s)
{
    size_t i = 0;
    for (; s[i] && s[i] != '\n' && i + 1 < len; i++)
        dst[i] = (unsigned char)s[i] < 0x20 ? ' ' : s[i];
    dst[i] = '\0';
}

static int name_cmp(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

int al_conv_list(void (*fn)(void *ctx, const al_conv_info *ci), void *ctx, al_error *err)
{
    char dir[AL_PATH_MAX];
    int r = al_conv_dir(dir, sizeof(dir), err);
    if (r < 0)
        return r;
    struct dirent **names;
    int n = scandir(dir, &names, NULL, name_cmp);
    if (n < 0)
        return al_err(err, -errno, "cannot list %s: %s", dir, strerror(errno));
    int count = 0;
    for (int i = 0; i < n; i++) {
        char *name = names[i]->d_name;
        size_t l = strlen(name);
        if (l > 5 && !strcmp(name + l - 5, ".json")) {
            name[l - 5] = '\0';
            char path[AL_PATH_MAX];
            al_error e = {0};
            cJSON *j = valid_id(name) && al_pathf(path, sizeof(path), "%s/%s.json", dir, name) == 0
                           ? read_json(path, &e)
                           : NULL;
            if (j) {
                al_conv_info ci = {0};
                snprintf(ci.id, sizeof(ci.id), "%s", name);
                ci.updated =
                    (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "updated"));
                const char *model =
                    cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "model"));
                snprintf(ci.model, sizeof(ci.model), "%s", model ? model : "");
                cJSON *msgs = cJSON_GetObjectItemCaseSensitive(j, "messages");
                ci.messages = (unsigned)cJSON_GetArraySize(msgs);
                cJSON *m;
                cJSON_ArrayForEach(m, msgs)
                {
                    const char *role =
                        cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "role"));
                    const char *content =
                        cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "content"));
                    if (role && content && !strcmp(role, "user")) {
                        first_line(ci.title, sizeof(ci.title), content);
                        break;
                    }
                }
                fn(ctx, &ci);
                count++;
                cJSON_Delete(j);
            }
        }
        free(names[i]);
    }
    free(names);
    return count;
}

/* Width of a recap line's text, in bytes before escaping. */
#define RECAP_TEXT_MAX 100

static bool is_user_text(const cJSON *m)
{
    const char *role = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "role"));
    return role && !strcmp(role, "user") && !cJSON_GetObjectItemCaseSensitive(m, "kind");
}

static void recap_line(FILE *out, const char *who, const char *text, const char *extra)
{
    char first[RECAP_TEXT_MAX + 1], esc[4 * RECAP_TEXT_MAX + 8];
    size_t n = text ? strcspn(text, "\n") : 0;
    bool cut = text && (n > RECAP_TEXT_MAX || text[n] == '\n');
    snprintf(first, sizeof(first), "%.*s", (int)(n < RECAP_TEXT_MAX ? n : RECAP_TEXT_MAX),
             text ? text : "");
    al_term_escape(first, esc, sizeof(esc));
    fprintf(out, "  %-6s %s%s%s%s\n", who, esc, cut ? " …" : "", *esc && *extra ? " " : "", extra);
}

int al_conv_recap(const al_chat *c, unsigned exchanges, FILE *out, al_error *err)
{
    int total = cJSON_GetArraySize(c->messages), start = total;
    for (unsigned seen = 0; start > 0 && seen < exchanges;)
        seen += is_user_text(cJSON_GetArrayItem(c->messages, --start));
    for (int i = start; i < total; i++) {
        const cJSON *m = cJSON_GetArrayItem(c->messages, i);
        const char *role = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "role"));
        const char *content = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "content"));
        if (is_user_text(m)) {
            recap_line(out, "you:", content, "");
        } else if (role && !strcmp(role, "assistant")) {
            const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
            const cJSON *call;
            char ran[128] = "";
            int n = cJSON_GetArraySize(calls);
            if (n > 0) {
                size_t at =
                    (size_t)snprintf(ran, sizeof(ran), "[ran %d block%s:", n, n == 1 ? "" : "s");
                cJSON_ArrayForEach(call, calls)
                {
                    const cJSON *args = cJSON_GetObjectItemCaseSensitive(call, "arguments");
                    const char *lang =
                        cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(args, "language"));
                    char l[24];
                    al_term_escape(lang ? lang : "?", l, sizeof(l));
                    if (at < sizeof(ran))
                        at += (size_t)snprintf(ran + at, sizeof(ran) - at, " %s", l);
                }
                if (at < sizeof(ran))
                    snprintf(ran + at, sizeof(ran) - at, "]");
            }
            if ((content && *content) || *ran)
                recap_line(out, "model:", content, ran);
        }
    }
    if (ferror(out))
        return al_err(err, -EIO, "cannot write the recap");
    return 0;
}

int al_conv_markdown(const al_chat *c, FILE *out, al_error *err)
{
    fprintf(out, "# Airlock conversation %s\n\nModel: %s, image: %s\n\n", c->id[0] ? c->id : "",
            c->cfg.model.model ? c->cfg.model.model : "", c->cfg.image ? c->cfg.image : "");
    cJSON *m;
    cJSON_ArrayForEach(m, c->messages)
    {
        const char *role = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "role"));
        const char *content = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "content"));
        if (!role)
            continue;
        if (!strcmp(role, "user") && !cJSON_GetObjectItemCaseSensitive(m, "kind"))
            fprintf(out, "## User\n\n%s\n\n", content ? content : "");
        else if (!strcmp(role, "assistant")) {
            if (content && *content)
                fprintf(out, "## Assistant\n\n%s\n\n", content);
            cJSON *call;
            cJSON_ArrayForEach(call, cJSON_GetObjectItemCaseSensitive(m, "tool_calls"))
            {
                cJSON *args = cJSON_GetObjectItemCaseSensitive(call, "arguments");
                const char *lang =
                    cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(args, "language"));
                const char *code =
                    cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(args, "code"));
                fprintf(out, "```%s\n%s\n```\n\n", lang ? lang : "", code ? code : "");
            }
        } else {
            fprintf(out, "Output:\n\n```\n%s\n```\n\n", content ? content : "");
        }
    }
    if (ferror(out))
        return al_err(err, -EIO, "cannot write the Markdown export");
    return 0;
}

cJSON *al_lmc_chunk(const char *role, const char *type, const char *format, const char *content,
                    size_t len, int flag)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "role", role);
    cJSON_AddStringToObject(j, "type", type);
    if (format)
        cJSON_AddStringToObject(j, "format", format);
    if (flag)
        cJSON_AddBoolToObject(j, flag == 1 ? "start" : "end", true);
    if (content) {
        char *t = al_utf8_repair((const uint8_t *)content, len, NULL);
        cJSON_AddStringToObject(j, "content", t ? t : "");
        free(t);
    }
    return j;
}

static const char *lmc_str(const cJSON *j, const char *k)
{
    return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, k));
}

cJSON *al_chat_from_lmc(const cJSON *lmc, char *why, size_t len)
{
    cJSON *out = cJSON_CreateArray(), *assistant = NULL, *tool = NULL;
    unsigned calls = 0;
    char id[32] = "";
    const cJSON *m;
    cJSON_ArrayForEach(m, lmc)
    {
        const char *role = lmc_str(m, "role"), *type = lmc_str(m, "type"),
                   *fmt = lmc_str(m, "format");
        const char *content = lmc_str(m, "content");
        if (!role || !type || !content) {
            snprintf(why, len, "each message needs role, type and a text content");
            cJSON_Delete(out);
            return NULL;
        }
        if (!strcmp(type, "message") && (!strcmp(role, "user") || !strcmp(role, "assistant"))) {
            cJSON *n = cJSON_CreateObject();
            cJSON_AddStringToObject(n, "role", role);
            cJSON_AddStringToObject(n, "content", content);
            cJSON_AddItemToArray(out, n);
            assistant = !strcmp(role, "assistant") ? n : NULL;
            tool = NULL;
        } else if (!strcmp(role, "assistant") && !strcmp(type, "code")) {
            if (!assistant) {
                assistant = cJSON_CreateObject();
                cJSON_AddStringToObject(assistant, "role", "assistant");
                cJSON_AddStringToObject(assistant, "content", "");
                cJSON_AddItemToArray(out, assistant);
            }
            cJSON *tc = cJSON_GetObjectItemCaseSensitive(assistant, "tool_calls");
            if (!tc)
                tc = cJSON_AddArrayToObject(assistant, "tool_calls");
            snprintf(id, sizeof(id), "call_restored_%u", ++calls);
            cJSON *call = cJSON_CreateObject(), *args = cJSON_CreateObject();
            cJSON_AddStringToObject(call, "id", id);
            cJSON_AddStringToObject(call, "name", "execute");
            cJSON_AddStringToObject(args, "language", fmt ? fmt : "python");
            cJSON_AddStringToObject(args, "code", content);
            cJSON_AddItemToObject(call, "arguments", args);
            cJSON_AddItemToArray(tc, call);
            tool = cJSON_CreateObject();
            cJSON_AddStringToObject(tool, "role", "tool");
            cJSON_AddStringToObject(tool, "tool_call_id", id);
            cJSON_AddStringToObject(tool, "name", "execute");
            cJSON_AddStringToObject(tool, "content", "");
            cJSON_AddItemToArray(out, tool);
        } else if (!strcmp(role, "computer") && tool) {
            /* console output (an image is only named: the model had it as a picture) */
            const char *was = lmc_str(tool, "content");
            char *both = NULL;
            if (asprintf(&both, "%s%s", was ? was : "",
                         !strcmp(type, "image") ? "[an image]\n" : content) < 0) {
                cJSON_Delete(out);
                return NULL;
            }
            cJSON_ReplaceItemInObject(tool, "content", cJSON_CreateString(both));
            free(both);
        }
    }
    return out;
}

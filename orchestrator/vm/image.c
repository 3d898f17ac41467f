/* The image store: one directory per image, each with a manifest.json naming its parts. */
#include "vm.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* A manifest is a few hundred bytes; anything far bigger is not one. */
#define MANIFEST_MAX (64 * 1024)
/* The image's defaults (oci.c checks them the same way when it writes them). */
#define CONFIG_ENV_MAX 64
#define CONFIG_LIST_MAX 64
#define CONFIG_STR_MAX 1024

int al_image_store_dir(char *buf, size_t len, al_error *err)
{
    const char *over = getenv("AIRLOCK_IMAGE_DIR");
    const char *xdg = getenv("XDG_DATA_HOME");
    const char *home = getenv("HOME");
    int n;
    char cwd[AL_PATH_MAX];
    if (over && *over == '/')
        n = snprintf(buf, len, "%s", over);
    else if (over && *over) /* libvirt and qemu-img resolve paths elsewhere: make it absolute */
        n = getcwd(cwd, sizeof(cwd)) ? snprintf(buf, len, "%s/%s", cwd, over) : -1;
    else if (geteuid() == 0)
        n = snprintf(buf, len, "/var/lib/airlock/images");
    else if (xdg && *xdg == '/')
        n = snprintf(buf, len, "%s/airlock/images", xdg);
    else if (home && *home == '/')
        n = snprintf(buf, len, "%s/.local/share/airlock/images", home);
    else
        return al_err(err, -ENOENT, "cannot find the image store: set AIRLOCK_IMAGE_DIR or HOME");
    if (n < 0 || (size_t)n >= len)
        return al_err(err, -ENAMETOOLONG, "image store path too long");
    return 0;
}

/* A POSIX portable user name: it goes into a guest command line and cloud-init's config. */
bool al_ssh_user_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 32 || s[0] == '-')
        return false;
    for (const char *p = s; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '-' || *p == '_' || *p == '.'))
            return false;
    return true;
}

bool al_image_name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= 64 || s[0] == '.')
        return false;
    for (const char *p = s; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '-' || *p == '_' || *p == '.'))
            return false;
    return true;
}

static char *read_small_file(const char *path, int *errp)
{
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        *errp = -errno;
        return NULL;
    }
    _cleanup_free_ char *buf = malloc(MANIFEST_MAX + 1);
    if (!buf) {
        *errp = -ENOMEM;
        return NULL;
    }
    size_t len = 0;
    for (;;) {
        ssize_t n = read(fd, buf + len, MANIFEST_MAX + 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            *errp = -errno;
            return NULL;
        }
        if (n == 0)
            break;
        len += (size_t)n;
        if (len > MANIFEST_MAX) {
            *errp = -EFBIG;
            return NULL;
        }
    }
    buf[len] = '\0';
    return TAKE_PTR(buf);
}

/* A part of an image is a plain file name inside its directory. */
static int image_part(const cJSON *j, const char *key, const char *dir, char *out, size_t len,
                      const char *name, al_error *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsString(v) || !al_image_name_ok(v->valuestring))
        return al_err(err, -EINVAL, "image '%s': manifest field '%s' is not a file name", name,
                      key);
    int n = snprintf(out, len, "%s/%s", dir, v->valuestring);
    if (n < 0 || (size_t)n >= len)
        return al_err(err, -ENAMETOOLONG, "image '%s': path too long", name);
    struct stat st;
    if (stat(out, &st) < 0 || !S_ISREG(st.st_mode))
        return al_err(err, -ENOENT, "image '%s': %s '%s' is missing", name, key, v->valuestring);
    return 0;
}

int al_transport_parse(const char *s, int *out, al_error *err)
{
    if (s && !strcmp(s, "virtio"))
        *out = AL_TRANSPORT_VIRTIO;
    else if (s && !strcmp(s, "ssh"))
        *out = AL_TRANSPORT_SSH;
    else
        return al_err(err, -EINVAL, "unknown transport '%s' (virtio or ssh)", s ? s : "");
    return 0;
}

/* A list of at most max strings of the manifest's config, each without control characters. */
static int config_list(const cJSON *list, size_t max, char ***out)
{
    if (!list)
        return 0;
    if (!cJSON_IsArray(list) || (size_t)cJSON_GetArraySize(list) > max)
        return -EINVAL;
    const char *v[CONFIG_LIST_MAX + 1];
    size_t n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, list)
    {
        /* Any bytes: a CMD's "sh -c" script has newlines; they go into frames as they are. */
        if (!cJSON_IsString(e) || strlen(e->valuestring) > CONFIG_STR_MAX)
            return -EINVAL;
        v[n++] = e->valuestring;
    }
    v[n] = NULL;
    return (*out = al_strv_dup(v)) ? 0 : -ENOMEM;
}

/* Where the image came from and its sessions' defaults (al_image_from, al_image_commit). */
static int image_origin(const cJSON *j, al_image *img, const char *name, al_error *err)
{
    const cJSON *src = cJSON_GetObjectItemCaseSensitive(j, "source");
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(src, "kind");
    const cJSON *path = cJSON_GetObjectItemCaseSensitive(src, "path");
    const cJSON *digest = cJSON_GetObjectItemCaseSensitive(src, "digest");
    if (cJSON_IsString(kind))
        snprintf(img->source, sizeof(img->source), "%s", kind->valuestring);
    else if (cJSON_GetObjectItemCaseSensitive(j, "imported_from"))
        snprintf(img->source, sizeof(img->source), "imported");
    else
        snprintf(img->source, sizeof(img->source), "recipe");
    if (cJSON_IsString(path))
        snprintf(img->source_path, sizeof(img->source_path), "%s", path->valuestring);
    if (cJSON_IsString(digest))
        snprintf(img->digest, sizeof(img->digest), "%s", digest->valuestring);
    al_printable(img->source);
    al_printable(img->source_path);
    al_printable(img->digest);
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(j, "config");
    const cJSON *wd = cJSON_GetObjectItemCaseSensitive(cfg, "workdir");
    const cJSON *user = cJSON_GetObjectItemCaseSensitive(cfg, "user");
    if (config_list(cJSON_GetObjectItemCaseSensitive(cfg, "env"), CONFIG_ENV_MAX, &img->env) < 0 ||
        config_list(cJSON_GetObjectItemCaseSensitive(cfg, "cmd"), CONFIG_LIST_MAX, &img->cmd) < 0)
        return al_err(err, -EINVAL, "image '%s': bad config in its manifest", name);
    for (char **e = img->env; e && *e; e++)
        if (!strchr(*e, '=') || **e == '=')
            return al_err(err, -EINVAL, "image '%s': config env entry is not KEY=VALUE", name);
    if ((wd && (!cJSON_IsString(wd) || wd->valuestring[0] != '/' ||
                strlen(wd->valuestring) > CONFIG_STR_MAX)) ||
        (user && (!cJSON_IsString(user) || strlen(user->valuestring) > 64)))
        return al_err(err, -EINVAL, "image '%s': bad workdir or user in its manifest", name);
    img->workdir = strdup(wd ? wd->valuestring : "");
    img->user = strdup(user ? user->valuestring : "");
    if (!img->workdir || !img->user)
        return al_err(err, -ENOMEM, "out of memory");
    return 0;
}

/* The loaded image's manifest again, for the keys al_image does not hold; NULL when unreadable. */
static cJSON *manifest_again(const al_image *img)
{
    char path[AL_PATH_MAX];
    int ferr = 0;
    if (!img->dir || al_pathf(path, sizeof(path), "%s/manifest.json", img->dir) < 0)
        return NULL;
    _cleanup_free_ char *text = read_small_file(path, &ferr);
    return text ? cJSON_Parse(text) : NULL;
}

bool al_image_has_display(const al_image *img)
{
    _cleanup_cjson_ cJSON *j = manifest_again(img);
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "display"));
}

bool al_image_warm_command(const al_image *img, char *buf, size_t len)
{
    _cleanup_cjson_ cJSON *j = manifest_again(img);
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "warm_command");
    if (!cJSON_IsString(c) || c->valuestring[0] != '/' || strlen(c->valuestring) >= len)
        return false;
    snprintf(buf, len, "%s", c->valuestring);
    return true;
}

/* "did you mean 'debian'? " when an image of the store is a typo away from name, else "". */
static void image_near(const char *store, const char *name, char *out, size_t len)
{
    DIR *d = opendir(store);
    if (!d)
        return;
    const char *names[65];
    char held[64][64];
    size_t n = 0;
    struct dirent *e;
    while (n < 64 && (e = readdir(d)))
        if (e->d_name[0] != '.' && al_image_name_ok(e->d_name) && strncmp(e->d_name, "own-", 4)) {
            memcpy(held[n], e->d_name, strlen(e->d_name) + 1); /* name_ok: < 64 bytes */
            names[n] = held[n];
            n++;
        }
    closedir(d);
    names[n] = NULL;
    const char *near = al_nearest(name, strlen(name), names);
    if (near)
        snprintf(out, len, "did you mean '%s'? ", near);
}

int al_image_load(const char *name, al_image *out, al_error *err)
{
    char store[AL_PATH_MAX];
    int r = AL_SIZED_OUT(out, "al_image", err);
    if (r < 0)
        return r;
    r = al_image_store_dir(store, sizeof(store), err);
    if (r < 0)
        return r;
    if (!al_image_name_ok(name))
        return al_err(err, -EINVAL, "bad image name '%s'", name);

    al_image img = AL_IMAGE_INIT;
    memset(&img, 0, sizeof(img));
    img.struct_size = sizeof(img);
    /* The paths are built here and copied out once the image checks out. */
    struct {
        char dir[AL_PATH_MAX], kernel[AL_PATH_MAX], initrd[AL_PATH_MAX], disk[AL_PATH_MAX];
    } p = {0};
    snprintf(img.name, sizeof(img.name), "%s", name);
    char path[AL_PATH_MAX];
    if (al_pathf(p.dir, sizeof(p.dir), "%s/%s", store, name) < 0 ||
        al_pathf(path, sizeof(path), "%s/manifest.json", p.dir) < 0)
        return al_err(err, -ENAMETOOLONG, "image path too long");
    int ferr = 0;
    _cleanup_free_ char *text = read_small_file(path, &ferr);
    if (!text) {
        if (ferr == -ENOENT) {
            char near[80] = "";
            image_near(store, name, near, sizeof(near));
            return al_err(err, -ENOENT,
                          "unknown image '%s' (%sno %s; see 'airlock image ls', or build it)", name,
                          near, path);
        }
        return al_err(err, ferr, "cannot read image '%s' manifest: %s", name, strerror(-ferr));
    }
    _cleanup_cjson_ cJSON *j = cJSON_Parse(text);
    if (!cJSON_IsObject(j))
        return al_err(err, -EINVAL, "image '%s': manifest is not a JSON object", name);

    /* SSH images may have no agent at all (a stock cloud image): it is copied in per session,
     * so its protocol is this airlock's. An agent baked in must speak it. */
    const cJSON *tr = cJSON_GetObjectItemCaseSensitive(j, "transport");
    img.transport = AL_TRANSPORT_VIRTIO;
    if (tr && !cJSON_IsNull(tr)) {
        if (!cJSON_IsString(tr) || al_transport_parse(tr->valuestring, &img.transport, NULL) < 0)
            return al_err(err, -EINVAL, "image '%s': transport is neither 'virtio' nor 'ssh'",
                          name);
    }
    const cJSON *proto = cJSON_GetObjectItemCaseSensitive(j, "agent_protocol");
    if (img.transport == AL_TRANSPORT_SSH && !proto) {
        img.agent_protocol = AL_PROTO_VERSION;
    } else {
        if (!cJSON_IsNumber(proto) || proto->valuedouble < 0 || proto->valuedouble > 1e6)
            return al_err(err, -EINVAL, "image '%s': manifest has no agent_protocol", name);
        img.agent_protocol = (unsigned)proto->valuedouble;
        if (img.agent_protocol != AL_PROTO_VERSION)
            return al_err(err, -EPROTONOSUPPORT,
                          "image '%s' has an agent speaking protocol %u, this airlock speaks %u; "
                          "rebuild the image",
                          name, img.agent_protocol, AL_PROTO_VERSION);
    }
    if (img.transport == AL_TRANSPORT_SSH) {
        const cJSON *user = cJSON_GetObjectItemCaseSensitive(j, "ssh_user");
        const cJSON *port = cJSON_GetObjectItemCaseSensitive(j, "ssh_port");
        if (!cJSON_IsString(user) || !al_ssh_user_ok(user->valuestring))
            return al_err(err, -EINVAL, "image '%s': ssh_user is not a user name", name);
        snprintf(img.ssh_user, sizeof(img.ssh_user), "%s", user->valuestring);
        img.ssh_port = 22;
        if (port && (!cJSON_IsNumber(port) || port->valuedouble < 1 || port->valuedouble > 65535))
            return al_err(err, -EINVAL, "image '%s': ssh_port is not a port", name);
        if (port)
            img.ssh_port = (unsigned)port->valuedouble;
    }

    /* No kernel: the disk boots through the firmware, which only an SSH image can do (nothing
     * else would start an agent). */
    const cJSON *kern = cJSON_GetObjectItemCaseSensitive(j, "kernel");
    if ((!kern || cJSON_IsNull(kern)) && img.transport == AL_TRANSPORT_SSH) {
        r = image_part(j, "disk", p.dir, p.disk, sizeof(p.disk), name, err);
        if (r < 0)
            return r;
        goto rest;
    }
    r = image_part(j, "kernel", p.dir, p.kernel, sizeof(p.kernel), name, err);
    if (r < 0)
        return r;
    r = image_part(j, "initrd", p.dir, p.initrd, sizeof(p.initrd), name, err);
    if (r < 0)
        return r;
    /* A root disk is optional (tiny has none); when named it obeys the same rules. */
    const cJSON *disk = cJSON_GetObjectItemCaseSensitive(j, "disk");
    if (disk && !cJSON_IsNull(disk)) {
        r = image_part(j, "disk", p.dir, p.disk, sizeof(p.disk), name, err);
        if (r < 0)
            return r;
    }

rest:;
    const cJSON *cmd = cJSON_GetObjectItemCaseSensitive(j, "cmdline");
    if (cJSON_IsString(cmd)) {
        if (strlen(cmd->valuestring) >= sizeof(img.cmdline) || strpbrk(cmd->valuestring, "'<>&\""))
            return al_err(err, -EINVAL, "image '%s': bad kernel command line", name);
        snprintf(img.cmdline, sizeof(img.cmdline), "%s", cmd->valuestring);
    }
    const cJSON *mem = cJSON_GetObjectItemCaseSensitive(j, "memory_mib");
    if (cJSON_IsNumber(mem) && mem->valuedouble >= 64 && mem->valuedouble <= 1048576)
        img.memory_mib = (unsigned)mem->valuedouble;
    const cJSON *langs = cJSON_GetObjectItemCaseSensitive(j, "languages");
    const cJSON *l;
    cJSON_ArrayForEach(l, langs)
    {
        if (!cJSON_IsString(l) || !al_image_name_ok(l->valuestring))
            continue;
        size_t have = strlen(img.languages);
        snprintf(img.languages + have, sizeof(img.languages) - have, "%s%s", have ? " " : "",
                 l->valuestring);
    }
    r = image_origin(j, &img, name, err);
    if (r < 0) {
        al_image_free(&img);
        return r;
    }
    img.dir = strdup(p.dir);
    img.kernel = strdup(p.kernel);
    img.initrd = strdup(p.initrd);
    img.disk = strdup(p.disk);
    if (!img.dir || !img.kernel || !img.initrd || !img.disk) {
        al_image_free(&img);
        return al_err(err, -ENOMEM, "out of memory");
    }
    *out = img;
    return 0;
}

void al_image_free(al_image *img)
{
    free(img->dir);
    free(img->kernel);
    free(img->initrd);
    free(img->disk);
    img->dir = img->kernel = img->initrd = img->disk = NULL;
    if (img->struct_size >= offsetof(al_image, cmd) + sizeof(img->cmd)) {
        al_strv_free(img->env);
        al_strv_free(img->cmd);
        free(img->workdir);
        free(img->user);
        img->env = img->cmd = NULL;
        img->workdir = img->user = NULL;
    }
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int al_image_list(void (*fn)(void *ctx, const al_image *img, const char *name, const char *why),
                  void *ctx, al_error *err)
{
    char store[AL_PATH_MAX];
    int r = al_image_store_dir(store, sizeof(store), err);
    if (r < 0)
        return r;
    DIR *d = opendir(store);
    if (!d) {
        if (errno == ENOENT)
            return 0;
        return al_err(err, -errno, "cannot read image store '%s': %s", store, strerror(errno));
    }
    char *names[256];
    size_t n = 0;
    struct dirent *e;
    /* A directory without a manifest is no image (a build dir's image not built yet). */
    while ((e = readdir(d)) && n < sizeof(names) / sizeof(names[0])) {
        char m[AL_PATH_MAX];
        if (e->d_name[0] == '.' ||
            al_pathf(m, sizeof(m), "%s/%s/manifest.json", store, e->d_name) < 0 ||
            access(m, F_OK) < 0)
            continue;
        if ((names[n] = strdup(e->d_name)))
            n++;
    }
    closedir(d);
    qsort(names, n, sizeof(names[0]), cmp_names);
    for (size_t i = 0; i < n; i++) {
        al_image img = AL_IMAGE_INIT;
        al_error e2 = {0};
        if (al_image_load(names[i], &img, &e2) < 0)
            fn(ctx, NULL, names[i], e2.msg);
        else
            fn(ctx, &img, names[i], NULL);
        al_image_free(&img);
        free(names[i]);
    }
    return (int)n;
}

const char *al_image_default(void)
{
    const char *env = getenv("AIRLOCK_IMAGE");
    if (env && *env)
        return env;
    char store[AL_PATH_MAX], path[AL_PATH_MAX];
    al_error ignored = {0};
    struct stat st;
    if (al_image_store_dir(store, sizeof(store), &ignored) == 0 &&
        al_pathf(path, sizeof(path), "%s/debian/manifest.json", store) == 0 && stat(path, &st) == 0)
        return "debian";
    return "tiny";
}

int al_image_remove(const char *name, al_error *err)
{
    char store[AL_PATH_MAX], dir[AL_PATH_MAX], manifest[AL_PATH_MAX];
    int r = al_image_store_dir(store, sizeof(store), err);
    if (r < 0)
        return r;
    if (!al_image_name_ok(name))
        return al_err(err, -EINVAL, "bad image name '%s'", name);
    if (al_pathf(dir, sizeof(dir), "%s/%s", store, name) < 0 ||
        al_pathf(manifest, sizeof(manifest), "%s/manifest.json", dir) < 0)
        return al_err(err, -ENAMETOOLONG, "image path too long");
    /* Only what looks like an image: never a stray directory someone pointed the store at. */
    struct stat st;
    if (lstat(dir, &st) < 0 || !S_ISDIR(st.st_mode) || lstat(manifest, &st) < 0)
        return al_err(err, -ENOENT, "no image '%s' in %s", name, store);
    /* Renamed away first, so a session starting meanwhile sees no half-removed image. */
    char gone[AL_PATH_MAX];
    if (al_pathf(gone, sizeof(gone), "%s/.%s.removed-%ld", store, name, (long)getpid()) < 0)
        return al_err(err, -ENAMETOOLONG, "image path too long");
    if (rename(dir, gone) < 0)
        return al_err(err, -errno, "cannot remove image '%s': %s", name, strerror(errno));
    r = al_rmtree(gone);
    if (r < 0)
        return al_err(err, r, "cannot remove '%s': %s", gone, strerror(-r));
    return 0;
}

int al_manifest_write(const char *dir, const cJSON *j, al_error *err)
{
    char path[AL_PATH_MAX];
    _cleanup_free_ char *text = cJSON_Print(j);
    if (!text)
        return al_err(err, -ENOMEM, "out of memory");
    if (al_pathf(path, sizeof(path), "%s/manifest.json", dir) < 0)
        return al_err(err, -ENAMETOOLONG, "image path too long");
    FILE *f = fopen(path, "wxe");
    if (!f)
        return al_err(err, -errno, "cannot write the manifest: %s", strerror(errno));
    /* Readable by all whatever the umask, like the disk. */
    bool ok = fprintf(f, "%s\n", text) > 0 && fchmod(fileno(f), 0644) == 0;
    if (fclose(f) != 0 || !ok)
        return al_err(err, -EIO, "cannot write the manifest '%s'", path);
    return 0;
}

/* The scratch dir starts with a dot: 'image ls' and al_image_default() ignore it. */
int al_image_scratch(const char *name, bool force, const char *what, char *dst, size_t dlen,
                     char *tmp, size_t tlen, al_error *err)
{
    char store[AL_PATH_MAX];
    if (!name || !al_image_name_ok(name))
        return al_err(err, -EINVAL, "bad image name '%s'", name ? name : "");
    int r = al_image_store_dir(store, sizeof(store), err);
    if (r < 0)
        return r;
    if (mkdir(store, 0755) < 0 && errno != EEXIST)
        return al_err(err, -errno, "cannot create image store '%s': %s", store, strerror(errno));
    if (al_pathf(dst, dlen, "%s/%s", store, name) < 0 ||
        al_pathf(tmp, tlen, "%s/.%s.%s-%ld", store, name, what, (long)getpid()) < 0)
        return al_err(err, -ENAMETOOLONG, "image path too long");
    struct stat st;
    char manifest[AL_PATH_MAX];
    if (lstat(dst, &st) == 0) {
        if (!force)
            return al_err(err, -EEXIST, "image '%s' already exists (--force replaces it)", name);
        if (!S_ISDIR(st.st_mode) ||
            al_pathf(manifest, sizeof(manifest), "%s/manifest.json", dst) < 0 ||
            lstat(manifest, &st) < 0)
            return al_err(err, -EEXIST,
                          "'%s' is in the image store but is not an image: not replacing it", dst);
    }
    al_rmtree(tmp);
    /* Private while it is being made. */
    if (mkdir(tmp, 0700) < 0)
        return al_err(err, -errno, "cannot create '%s': %s", tmp, strerror(errno));
    return 0;
}

int al_image_swap_in(const char *tmp, const char *dst, const char *name, bool force, al_error *err)
{
    if (force) {
        if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dst, RENAME_EXCHANGE) == 0)
            return al_rmtree(tmp), 0; /* the old image, now at tmp */
        if (errno != ENOENT || rename(tmp, dst) < 0)
            return al_err(err, -errno, "cannot move the new image into '%s': %s", dst,
                          strerror(errno));
        return 0;
    }
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dst, RENAME_NOREPLACE) == 0)
        return 0;
    /* A file system without RENAME_NOREPLACE: rename() still fails over a non-empty directory,
     * which every image is. */
    if (errno == EINVAL && rename(tmp, dst) == 0)
        return 0;
    if (errno == EEXIST || errno == ENOTEMPTY)
        return al_err(err, -EEXIST, "image '%s' already exists (--force replaces it)", name);
    return al_err(err, -errno, "cannot move the new image into '%s': %s", dst, strerror(errno));
}

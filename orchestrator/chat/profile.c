/* Profiles: named YAML files people edit by hand, with comments, read through libyaml. A profile
 * is one mapping of settings to single values; the caller decides what each key means. */
#include "chat.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <yaml.h>

#include "util.h"

#define PROFILE_KEYS_MAX 64 /* far more settings than exist; bounds a hostile file's work */

static int find_profile(const char *name, char *path, size_t len, al_error *err)
{
    if (strchr(name, '/')) {
        if (al_pathf(path, len, "%s", name) < 0)
            return al_err(err, -ENAMETOOLONG, "profile path too long");
        return 0;
    }
    for (const char *p = name; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '-' || *p == '_' || *p == '.'))
            return al_err(err, -EINVAL, "'%s' is not a profile name", name);
    char dir[AL_PATH_MAX];
    int r = al_profile_dir(dir, sizeof(dir), err);
    if (r < 0)
        return r;
    static const char *const ext[] = {".yaml", ".yml"};
    for (size_t i = 0; i < 2; i++) {
        if (al_pathf(path, len, "%s/%s%s", dir, name, ext[i]) < 0)
            return al_err(err, -ENAMETOOLONG, "profile path too long");
        if (access(path, F_OK) == 0)
            return 0;
    }
    return al_err(err, -ENOENT, "no profile '%s' (looked for %s/%s.yaml)", name, dir, name);
}

int al_profile_load(const char *name_or_path,
                    int (*fn)(void *ctx, const char *key, const char *value, al_error *err),
                    void *ctx, al_error *err)
{
    char path[AL_PATH_MAX];
    int r = find_profile(name_or_path, path, sizeof(path), err);
    if (r < 0)
        return r;
    FILE *f = fopen(path, "re");
    if (!f)
        return al_err(err, -errno, "cannot open profile %s: %s", path, strerror(errno));
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p)) {
        fclose(f);
        return al_err(err, -ENOMEM, "out of memory");
    }
    yaml_parser_set_input_file(&p, f);
    /* States: waiting for the document's mapping, then alternating key and value. */
    int depth = 0, keys = 0;
    char *key = NULL;
    r = 0;
    for (bool done = false; !done && r == 0;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&p, &ev)) {
            r = al_err(err, -EINVAL, "profile %s: line %zu: %s", path, p.problem_mark.line + 1,
                       p.problem ? p.problem : "syntax error");
            break;
        }
        switch (ev.type) {
        case YAML_STREAM_END_EVENT:
            done = true;
            break;
        case YAML_MAPPING_START_EVENT:
        case YAML_SEQUENCE_START_EVENT:
            if (depth == 0 && ev.type == YAML_MAPPING_START_EVENT)
                depth = 1;
            else
                r = al_err(err, -EINVAL, "profile %s: line %zu: %s must be a single value", path,
                           ev.start_mark.line + 1, key ? key : "the profile");
            break;
        case YAML_ALIAS_EVENT:
            r = al_err(err, -EINVAL, "profile %s: line %zu: aliases are not supported", path,
                       ev.start_mark.line + 1);
            break;
        case YAML_SCALAR_EVENT: {
            const char *v = (const char *)ev.data.scalar.value;
            if (depth != 1) {
                /* A bare scalar document (or an empty file) holds no settings. */
                if (*v)
                    r = al_err(err, -EINVAL, "profile %s: expected 'key: value' lines", path);
            } else if (!key) {
                if (++keys > PROFILE_KEYS_MAX)
                    r = al_err(err, -E2BIG, "profile %s: too many settings", path);
                else if (!(key = strdup(v)))
                    r = al_err(err, -ENOMEM, "out of memory");
            } else {
                r = fn(ctx, key, v, err);
                free(key);
                key = NULL;
            }
            break;
        }
        case YAML_MAPPING_END_EVENT:
            depth = 2; /* one mapping only: a second document is an error */
            break;
        case YAML_DOCUMENT_START_EVENT:
            if (depth == 2)
                r = al_err(err, -EINVAL, "profile %s: one document only", path);
            break;
        default:
            break;
        }
        yaml_event_delete(&ev);
    }
    free(key);
    yaml_parser_delete(&p);
    fclose(f);
    return r;
}

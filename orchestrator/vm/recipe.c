/* Building images: running a recipe (images/build-NAME.sh AGENT OUTDIR [--toolchain]) into a
 * scratch directory of the store, then swapping it in. */
#include "vm.h"

#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

/* Where an airlock build finds its recipes and agent (set by orchestrator/meson.build). */
#ifndef AIRLOCK_SOURCE_ROOT
#error "AIRLOCK_SOURCE_ROOT must be defined"
#endif

struct recipe_place {
    const char *recipes; /* directory holding build-NAME.sh */
    const char *agent;   /* the agent binary the image gets */
    const char *kernels; /* the language kernels' driver scripts */
};

static const struct recipe_place from_tree = {AIRLOCK_SOURCE_ROOT "/images",
                                              AIRLOCK_BUILD_ROOT "/guest-agent/airlock-agent",
                                              AIRLOCK_SOURCE_ROOT "/guest-agent/kernels"};
static const struct recipe_place installed = {AIRLOCK_DATADIR "/images",
                                              AIRLOCK_LIBEXECDIR "/airlock-agent",
                                              AIRLOCK_DATADIR "/guest-agent/kernels"};

/* A binary run from its build tree uses that tree's recipes and agent; an installed one the
 * installed copies (the tree it came from may be gone or have moved on). */
static bool running_from_build_tree(void)
{
    char exe[AL_PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0)
        return false;
    exe[n] = '\0';
    size_t len = strlen(AIRLOCK_BUILD_ROOT);
    return strncmp(exe, AIRLOCK_BUILD_ROOT, len) == 0 && exe[len] == '/';
}

static int find_recipe(const char *name, char *recipe, size_t rlen, char *agent, size_t alen,
                       al_error *err)
{
    const struct recipe_place *order[2] = {&installed, &from_tree};
    if (running_from_build_tree()) {
        order[0] = &from_tree;
        order[1] = &installed;
    }
    const char *dir_env = getenv("AIRLOCK_RECIPE_DIR");
    const char *agent_env = getenv("AIRLOCK_AGENT_BIN");
    for (int i = 0; i < 2; i++) {
        const char *dir = dir_env && *dir_env ? dir_env : order[i]->recipes;
        if (al_pathf(recipe, rlen, "%s/build-%s.sh", dir, name) < 0)
            return al_err(err, -ENAMETOOLONG, "recipe path too long");
        if (access(recipe, R_OK) < 0)
            continue;
        const char *a = agent_env && *agent_env ? agent_env : order[i]->agent;
        if (al_pathf(agent, alen, "%s", a) < 0)
            return al_err(err, -ENAMETOOLONG, "agent path too long");
        if (access(agent, X_OK) < 0)
            return al_err(err, -ENOENT, "no agent binary at %s (set AIRLOCK_AGENT_BIN)", agent);
        return 0;
    }
    return al_err(err, -ENOENT, "no recipe for image '%s' (looked for build-%s.sh in %s%s%s)", name,
                  name, dir_env && *dir_env ? dir_env : order[0]->recipes,
                  dir_env && *dir_env ? "" : " and ", dir_env && *dir_env ? "" : order[1]->recipes);
}

/* What an SSH session copies into a guest that lacks it ($AIRLOCK_AGENT_BIN and
 * $AIRLOCK_KERNELS_DIR override). */
int al_agent_files(char *agent, size_t alen, char *kernels, size_t klen, al_error *err)
{
    const struct recipe_place *p = running_from_build_tree() ? &from_tree : &installed;
    const char *agent_env = getenv("AIRLOCK_AGENT_BIN");
    const char *kernels_env = getenv("AIRLOCK_KERNELS_DIR");
    if (al_pathf(agent, alen, "%s", agent_env && *agent_env ? agent_env : p->agent) < 0 ||
        al_pathf(kernels, klen, "%s", kernels_env && *kernels_env ? kernels_env : p->kernels) < 0)
        return al_err(err, -ENAMETOOLONG, "agent path too long");
    if (access(agent, X_OK) < 0)
        return al_err(err, -ENOENT, "no agent binary at %s (set AIRLOCK_AGENT_BIN)", agent);
    return 0;
}

int al_image_build(const al_image_build_opts *in, al_error *err)
{
    al_image_build_opts taken = AL_IMAGE_BUILD_OPTS_INIT;
    const al_image_build_opts *opts = &taken;
    int r0 = AL_SIZED_IN(&taken, in, "al_image_build_opts", err);
    if (r0 < 0)
        return r0;
    if (!al_image_name_ok(opts->name))
        return al_err(err, -EINVAL, "bad image name '%s'", opts->name);
    char recipe[AL_PATH_MAX], agent[AL_PATH_MAX], store[AL_PATH_MAX], dst[AL_PATH_MAX],
        tmp[AL_PATH_MAX];
    int r = find_recipe(opts->name, recipe, sizeof(recipe), agent, sizeof(agent), err);
    if (r < 0)
        return r;
    r = al_image_store_dir(store, sizeof(store), err);
    if (r < 0)
        return r;
    /* QEMU (another user under qemu:///system) must traverse the store. */
    if (mkdir(store, 0755) < 0 && errno != EEXIST)
        return al_err(err, -errno, "cannot create image store '%s': %s", store, strerror(errno));
    /* The scratch dir starts with a dot: 'image ls' and al_image_default() ignore it. */
    if (al_pathf(dst, sizeof(dst), "%s/%s", store, opts->name) < 0 ||
        al_pathf(tmp, sizeof(tmp), "%s/.%s.build-%ld", store, opts->name, (long)getpid()) < 0)
        return al_err(err, -ENAMETOOLONG, "image path too long");
    al_rmtree(tmp);

    const char *argv[] = {"bash", recipe, agent, tmp, opts->toolchain ? "--toolchain" : NULL, NULL};
    int st = 0;
    /* Zero means none: the recipe's output goes nowhere rather than to fd 0. */
    _cleanup_close_ int devnull = opts->log_fd > 0 ? -1 : open("/dev/null", O_WRONLY | O_CLOEXEC);
    int log = opts->log_fd > 0 ? opts->log_fd : devnull;
    if (log < 0)
        return al_err(err, -errno, "cannot open /dev/null: %s", strerror(errno));
    r = al_spawn_wait(argv, log, log, &st);
    if (r < 0) {
        al_rmtree(tmp);
        return al_err(err, r, "cannot run %s: %s", recipe, strerror(-r));
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        al_rmtree(tmp);
        return al_err(err, -EIO, "recipe %s failed (%s %d)", recipe,
                      WIFEXITED(st) ? "status" : "signal",
                      WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    }
    /* Swapped in at once, so a session starting meanwhile gets the old or the new image. */
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dst, RENAME_EXCHANGE) < 0) {
        if (errno != ENOENT || rename(tmp, dst) < 0) {
            int e = errno;
            al_rmtree(tmp);
            return al_err(err, -e, "cannot move the new image into '%s': %s", dst, strerror(e));
        }
    }
    al_rmtree(tmp); /* the old image, after an exchange */
    return 0;
}

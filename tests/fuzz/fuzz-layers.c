/* Fuzz target for applying an image's layer onto a host directory (orchestrator/vm/layers.c): a
 * layer is a hostile tar stream, maybe compressed.
 *
 * The input is applied, with small limits, to a fresh ROOT inside a scratch dir that also holds
 * a sentinel file. Whatever came of it (success or a refusal), the scratch dir must hold ROOT and
 * the untouched sentinel alone, and ROOT no device node, socket or set-id file: the layer may
 * only ever change its own tree, and only into something harmless. Any violation aborts. */
#include "fuzz.h"
#include "layers.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

/* Small limits, so that the fuzzer reaches them. */
#define FUZZ_BYTES_MAX (256 * 1024)
#define FUZZ_ENTRIES_MAX 64
#define SENTINEL_TEXT "sentinel\n"

static void fail(const char *what, const char *path)
{
    fprintf(stderr, "fuzz-layers: %s ('%s')\n", what, path ? path : "");
    abort();
}

static int check_node(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)ftw;
    /* A directory the layer made unreadable, opened up (pre-order: before it is read) so that
     * the walk and the removal see inside it without root's powers too. */
    if (flag == FTW_D && chmod(path, (st->st_mode | 0700) & 07777) < 0)
        fail("cannot open up a directory", path);
    if (S_ISCHR(st->st_mode) || S_ISBLK(st->st_mode) || S_ISSOCK(st->st_mode))
        fail("a device node or socket in the tree", path);
    if (!S_ISLNK(st->st_mode) && (st->st_mode & (S_ISUID | S_ISGID)))
        fail("a set-id file in the tree", path);
    return 0;
}

/* rm -rf without following symlinks: depth first, each entry itself. */
static int remove_node(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    if (flag == FTW_DP ? rmdir(path) : unlink(path))
        fail("cannot clean the scratch dir", path);
    return 0;
}

static void check_outside(const char *scratch, const char *sentinel)
{
    DIR *d = opendir(scratch);
    if (!d)
        fail("the scratch dir is gone", scratch);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (strcmp(e->d_name, "root") && strcmp(e->d_name, "sentinel"))
            fail("something new beside ROOT", e->d_name);
        n++;
    }
    closedir(d);
    struct stat st;
    char buf[64] = {0};
    int fd = open(sentinel, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (n != 2 || fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) ||
        (st.st_mode & 07777) != 0644 ||
        read(fd, buf, sizeof(buf) - 1) != sizeof(SENTINEL_TEXT) - 1 || strcmp(buf, SENTINEL_TEXT))
        fail("the sentinel changed", sentinel);
    close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char scratch[] = "/tmp/fuzz-layers-XXXXXX", root[64], sentinel[64];
    if (!mkdtemp(scratch))
        fail("cannot make a scratch dir", scratch);
    snprintf(root, sizeof(root), "%s/root", scratch);
    snprintf(sentinel, sizeof(sentinel), "%s/sentinel", scratch);
    int s = open(sentinel, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (s < 0 || write(s, SENTINEL_TEXT, sizeof(SENTINEL_TEXT) - 1) != sizeof(SENTINEL_TEXT) - 1 ||
        fchmod(s, 0644) < 0 || close(s) < 0 || mkdir(root, 0755) < 0)
        fail("cannot set up the scratch dir", scratch);

    int fd = memfd_create("layer", MFD_CLOEXEC);
    if (fd < 0 || (size && write(fd, data, size) != (ssize_t)size) || lseek(fd, 0, SEEK_SET))
        fail("cannot write the input to a memfd", NULL);
    int rootfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (rootfd < 0)
        fail("cannot open ROOT", root);
    struct al_layer_limits lim = {.bytes_max = FUZZ_BYTES_MAX, .entries_max = FUZZ_ENTRIES_MAX};
    struct al_layer_stats st = {0};
    al_error err = {0};
    char sha[65];
    /* twice, as lower and upper layer: the second meets what the first made */
    for (int i = 0; i < 2; i++) {
        if (lseek(fd, 0, SEEK_SET) != 0)
            fail("cannot rewind the memfd", NULL);
        int r = al_layer_apply(rootfd, fd, &lim, &st, NULL, NULL, sha, &err);
        if (r < 0 && (err.code != r || !err.msg[0]))
            fail("a failure without its message", err.msg);
        if (r == 0 && strlen(sha) != 64)
            fail("a success without a digest", NULL);
        if (st.entries > FUZZ_ENTRIES_MAX || st.bytes > FUZZ_BYTES_MAX)
            fail("stats over the limits", NULL);
        err = (al_error){0};
    }
    close(rootfd);
    close(fd);

    check_outside(scratch, sentinel);
    if (nftw(root, check_node, 16, FTW_PHYS) < 0)
        fail("cannot walk ROOT", root);
    if (nftw(scratch, remove_node, 16, FTW_PHYS | FTW_DEPTH) < 0)
        fail("cannot remove the scratch dir", scratch);
    return 0;
}

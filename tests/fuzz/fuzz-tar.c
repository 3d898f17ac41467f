/* Fuzz target for the reader of the guest's tar streams (orchestrator/base/tar.c): the bytes a
 * hostile guest's tar could send back from /workspace or for airlock cp.
 *
 * Whatever the input, every entry the reader hands out must be one the host may act on: a
 * relative path with no empty, "." or ".." component and no slash at either end, within the path
 * bound; only the root may be ""; sizes within the limits, the total too; a symlink has its
 * target; the data read is exactly the size announced. The whole stream is then read again as a
 * tree, which must come out sorted without duplicates. Any violation aborts. */
#include "fuzz.h"
#include "tar.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Small limits, so that the fuzzer reaches them. */
#define FUZZ_BYTES_MAX (64 * 1024)
#define FUZZ_ENTRIES_MAX 64

static void fail(const char *what, const char *path)
{
    fprintf(stderr, "fuzz-tar: %s (entry '%s')\n", what, path ? path : "");
    abort();
}

static void check_path(const char *p)
{
    size_t n = strlen(p);
    if (n > AL_TREE_PATH_MAX)
        fail("a path over the bound", p);
    if (n && (p[0] == '/' || p[n - 1] == '/'))
        fail("a path with a slash at an end", p);
    for (const char *c = p; n && *c;) {
        size_t len = strcspn(c, "/");
        if (len == 0 || (len == 1 && c[0] == '.') || (len == 2 && !strncmp(c, "..", 2)))
            fail("a path with an empty, '.' or '..' component", p);
        c += len + (c[len] == '/');
    }
    char again[AL_TREE_PATH_MAX + 1];
    memcpy(again, p, n + 1);
    if (al_tree_path_check(again) < 0 || strcmp(again, p))
        fail("a checked path that does not check again", p);
}

static void read_all(const uint8_t *data, size_t size)
{
    struct al_tar_limits lim = {.bytes_max = FUZZ_BYTES_MAX, .entries_max = FUZZ_ENTRIES_MAX};
    struct al_tar_reader *r = NULL;
    al_error err = {0};
    if (al_tar_reader_mem(data, size, &lim, &r, &err) < 0)
        return;
    uint64_t total = 0, entries = 0;
    struct al_tree_entry e;
    static char buf[4096];
    while (al_tar_next(r, &e, &err) > 0) {
        entries++;
        check_path(e.path);
        if (!e.path[0] && e.type != AL_ENTRY_DIR)
            fail("a root that is not a directory", e.path);
        if (e.type == AL_ENTRY_SYMLINK && (!e.link || strlen(e.link) > AL_TREE_PATH_MAX))
            fail("a symlink without a bounded target", e.path);
        if (e.type == AL_ENTRY_OTHER && !e.odd)
            fail("an odd entry without a reason", e.path);
        if (e.type != AL_ENTRY_FILE && e.size)
            fail("a size on something not a file", e.path);
        total += e.size;
        if (e.size > FUZZ_BYTES_MAX || total > FUZZ_BYTES_MAX)
            fail("sizes over the limit", e.path);
        uint64_t got = 0;
        ssize_t n;
        while ((n = al_tar_read(r, buf, sizeof(buf), &err)) > 0)
            got += (uint64_t)n;
        if (n == 0 && got != e.size)
            fail("data of another size than announced", e.path);
        if (n < 0)
            break;
    }
    if (entries > FUZZ_ENTRIES_MAX)
        fail("more entries than the limit", NULL);
    al_tar_reader_free(r);

    struct al_tree t = {0};
    err = (al_error){0};
    if (al_tar_reader_mem(data, size, &lim, &r, &err) == 0 && al_tar_scan(r, &t, &err) == 0) {
        for (size_t i = 0; i < t.n; i++) {
            check_path(t.v[i].path);
            if (!t.v[i].path[0])
                fail("the root listed in a tree", NULL);
            if (i && strcmp(t.v[i - 1].path, t.v[i].path) >= 0)
                fail("a tree out of order or with a duplicate", t.v[i].path);
            if (al_tree_find(&t, t.v[i].path) != &t.v[i])
                fail("a tree entry not found by its path", t.v[i].path);
        }
    }
    al_tar_reader_free(r);
    al_tree_free(&t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    read_all(data, size);
    return 0;
}

/* Trees of files as tar streams, both ways: the host's side written with libarchive, the guest's
 * side read with libarchive under hard bounds (it is hostile), and the host-directory helpers
 * that never leave a directory or follow a symlink in it. */
#ifndef AIRLOCK_TAR_H
#define AIRLOCK_TAR_H

#include "util.h"

#include <sys/types.h>

/* Longest relative path in a tree, either way: PATH_MAX less room for the directory it is in. */
#define AL_TREE_PATH_MAX 3072
/* Most entries in one tree either way: a workdir is a project, not a file system; bounds the
 * host's memory for the entry list (about 100 bytes each). */
#define AL_TREE_ENTRIES_MAX 100000
/* Deepest directory nesting walked on the host: one open directory per level. */
#define AL_TREE_DEPTH_MAX 64

struct al_tar_limits {
    uint64_t bytes_max;   /* total and per-entry file data */
    uint64_t entries_max; /* 0: AL_TREE_ENTRIES_MAX */
};

/* One entry of a tree. */
struct al_tree_entry {
    char *path;      /* relative, validated: no empty, "." or ".." components, no slash at the
                        ends; "" is the tree's root */
    int type;        /* enum al_entry_type */
    uint64_t size;   /* regular files */
    unsigned mode;   /* permission bits only */
    char *link;      /* symlink target, or NULL */
    const char *odd; /* why the entry cannot be synced (hard link, device...), or NULL */
};

struct al_tree {
    struct al_tree_entry *v;
    size_t n, cap;
    uint64_t bytes; /* sum of regular file sizes */
    char **skipped; /* host walk: "PATH: why" lines for what was left out */
    size_t nskipped;
};
void al_tree_free(struct al_tree *t);
/* Adds a copy of e; -ENOMEM. */
int al_tree_add(struct al_tree *t, const struct al_tree_entry *e);
/* Sorts by path (a parent before its children) and fails on a duplicate. */
int al_tree_sort(struct al_tree *t, al_error *err);
const struct al_tree_entry *al_tree_find(const struct al_tree *t, const char *path);

/* Walks the host directory dirfd: regular files, directories, and symlinks whose target stays
 * inside the tree (kept as symlinks, never followed); other symlinks and special files are
 * listed in t->skipped. Fails when the tree exceeds the limits. */
int al_tree_walk(int dirfd, const struct al_tar_limits *lim, struct al_tree *t, al_error *err);

/* Writes the entries of t, read beneath dirfd, as a tar stream to fd (a socket or pipe; no
 * SIGPIPE is raised), each path prefixed with prefix (which may be "" or "NAME/"). With
 * single_fd >= 0 the tree is one regular file read from single_fd and named prefix. */
int al_tar_write_tree(int fd, int dirfd, const struct al_tree *t, const char *prefix,
                      al_error *err);
int al_tar_write_file(int fd, int file_fd, const char *name, al_error *err);

/* The reader of a hostile stream. */
struct al_tar_reader;
int al_tar_reader_fd(int fd, const struct al_tar_limits *lim, struct al_tar_reader **out,
                     al_error *err);
int al_tar_reader_mem(const void *buf, size_t len, const struct al_tar_limits *lim,
                      struct al_tar_reader **out, al_error *err);
/* 1 and *e filled (strings valid until the next call), 0 at the end, negative on a malformed
 * or over-limit stream. The root entry ("." or "./") comes as path "". */
int al_tar_next(struct al_tar_reader *r, struct al_tree_entry *e, al_error *err);
/* Reads the current entry's data: bytes read, 0 at its end, negative on failure. */
ssize_t al_tar_read(struct al_tar_reader *r, void *buf, size_t len, al_error *err);
void al_tar_reader_free(struct al_tar_reader *r);
/* Reads a whole stream into a sorted tree (no data kept). */
int al_tar_scan(struct al_tar_reader *r, struct al_tree *t, al_error *err);

/* Checks a path from the guest: relative, no empty, "." or ".." components. Strips a leading
 * "./" and trailing slashes in place. */
int al_tree_path_check(char *path);

/* Opens the directory that holds rel (beneath dirfd, no symlinks on the way) and points *base
 * at rel's last component. */
int al_beneath_parent(int dirfd, const char *rel, const char **base);
/* Opens rel beneath dirfd with flags, never through or at a symlink. */
int al_beneath_open(int dirfd, const char *rel, int flags);

/* ---- trees in and out of a guest ---- */

/* Runs a command in some guest: a session of this process, or one another airlock process
 * serves over its control socket. */
struct al_runner {
    int (*exec)(void *ctx, const al_exec_opts *o, al_exec_result *out, al_error *err);
    void *ctx;
    const char *spool_dir; /* where streams from the guest are spooled (unnamed files) */
};
/* $TMPDIR, else /var/tmp: a spool may be as big as the workdir limit, too big for a tmpfs
 * such as /run. */
const char *al_spool_dir(void);

/* Sends t (read beneath dirfd, each path prefixed) or, with file_fd >= 0, one file named
 * prefix, into guest_dir by running tar there. */
int al_tree_put(const struct al_runner *run, int dirfd, const struct al_tree *t, int file_fd,
                const char *prefix, const char *guest_dir, al_error *err);

/* al_workdir_push through any runner (airlockd's runs API: cli/remote.c). */
int al_workdir_push_run(const struct al_runner *run, const char *dir, const al_workdir_opts *o,
                        al_workdir_push_result *out, al_error *err);
/* Diff of guest_dir against the host directory dir (NULL: against nothing). */
int al_workdir_diff_run(const struct al_runner *run, const char *dir, const al_workdir_opts *o,
                        al_workdir_diff **out, al_error *err);

#endif

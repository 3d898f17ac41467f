/* layers.c: an image's layers (tar streams, maybe compressed) applied onto a host directory, with
 * OCI's whiteouts. The layers are hostile: they may come from anywhere. */
#ifndef AIRLOCK_LAYERS_H
#define AIRLOCK_LAYERS_H

#include "util.h"

#include <stdbool.h>
#include <stdint.h>

/* Most entries of one image (all layers): a root file system, not a file server. */
#define AL_LAYER_ENTRIES_MAX (1u << 19)

struct al_layer_limits {
    uint64_t bytes_max;   /* regular files' data (their logical size), all layers together */
    uint64_t entries_max; /* entries made, all layers together; 0: AL_LAYER_ENTRIES_MAX */
    bool keep_setid;      /* keep set-uid and set-gid bits (else cleared, and noted) */
    bool chown;           /* give entries the layer's uid and gid (needs root); else the
                             builder's */
};

/* Totals over every layer applied with it (zero it before the first). */
struct al_layer_stats {
    uint64_t bytes;   /* regular files' data */
    uint64_t entries; /* entries made */
    unsigned devices; /* device nodes and sockets dropped */
    unsigned setid;   /* set-id bits cleared */
    unsigned xattrs;  /* entries whose extended attributes were dropped */
    unsigned whiteouts;
};

/* Applies the layer read from layer_fd (from its current offset to EOF: tar, or tar compressed
 * in any way libarchive reads) onto the tree at rootfd (a directory fd), as OCI's image spec
 * says: later entries replace earlier ones, ".wh.NAME" removes NAME of the layers below,
 * ".wh..wh..opq" empties its directory of what the layers below put there (in whichever order
 * the layer lists them), a character device 0:0 is a whiteout too.
 *
 * Nothing is ever written outside the tree or through a symlink out of it: a parent directory is
 * resolved inside the tree (RESOLVE_IN_ROOT: a symlink in the tree means what it would in the
 * guest), missing parents are made (0755), and the last component is never followed (what is
 * there is replaced). Symlinks are kept as they are (their targets are the guest's business).
 *
 * Refused (negative errno, err: "entry 'PATH': why"): an absolute path or one with a ".."
 * component; a hard link whose target is absolute, has "..", is missing or is a directory; a
 * path over AL_TREE_PATH_MAX; a stream that is not a tar; going over lim's bytes or entries.
 * Neutralised, each with one line "PATH: why" to note (when not NULL): device nodes and sockets
 * dropped (the guest's /dev is its own devtmpfs), set-id bits cleared unless lim->keep_setid,
 * extended attributes dropped; FIFOs are made as FIFOs. Times are the layer's, clamped to 0 ..
 * 2^32 - 1.
 *
 * When sha256 is not NULL, it receives the hex SHA-256 of the bytes read from layer_fd (the
 * whole rest of the file, read to EOF even after the tar's end), for the caller to check against
 * the blob's digest. On failure the tree is left part-applied: the caller throws it away. */
int al_layer_apply(int rootfd, int layer_fd, const struct al_layer_limits *lim,
                   struct al_layer_stats *st, void (*note)(void *ctx, const char *line),
                   void *note_ctx, char sha256[65], al_error *err);

#endif

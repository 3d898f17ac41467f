/* libairlock: run code in a disposable VM. The public interface; the airlock CLI is a thin
 * caller of it.
 *
 * Conventions: functions return 0 (or a positive count) on success and a negative errno on
 * failure, with the reason in the al_error passed last; outputs are written only on success.
 * The library prints nothing (tests/check-silent.py): what it has to say goes to al_error or
 * to a callback the caller gives. Exported: exactly the functions declared here, versioned
 * (LIBAIRLOCK_1; tests/check-exports.py).
 *
 * Process-wide effects an embedder should know: the first libvirt connection registers
 * libvirt's default event loop (virEventRegisterDefaultImpl) and runs it on a detached thread
 * of the library's for the rest of the process, and replaces libvirt's default error printer
 * with a silent one (errors reach al_error instead); a program with its own libvirt event loop
 * should not mix it with this one. Sockets are written with MSG_NOSIGNAL, but output goes to
 * the caller's descriptors (al_exec_opts.stdout_fd, stderr_fd) with write(2): where the
 * caller's reader is gone that raises SIGPIPE unless the caller ignores it (the airlock CLI
 * and airlockd do, and get EPIPE instead).
 *
 * Structs: every public struct but five begins with `size_t struct_size`, so that it can grow
 * at its end under the same soname. Start each one you allocate from its AL_<NAME>_INIT
 * (`al_exec_opts o = AL_EXEC_OPTS_INIT;`, or `.struct_size = sizeof(al_exec_opts)` first in a
 * designated initializer): the rest is zero, and zero means "none" or "the default" in every
 * field (descriptors included: 0 is never taken as a descriptor; AL_FD_STDIN passes fd 0).
 * - Options the library reads: a struct_size below the struct's first exported size fails with
 *   -EINVAL (a zeroed struct says so by name); one from an older header (a field appended since
 *   is missing) is taken with those fields zero; a larger one (a caller built against a newer
 *   header) is taken when the fields this library does not know are zero, else -E2BIG.
 * - Structs the caller gives the library to fill (al_exec_result, al_file_info ...): the same
 *   check on the way in; on the way out struct_size is what the library filled.
 * - Structs the library hands to a callback or owns: struct_size is what it filled; read a field
 * newer than the oldest library you support only when AL_HAS(p, field). Frozen (never change; what
 * they would need goes into a new struct): al_error, al_net_opts (inside al_session_opts), al_mime
 * (inside al_result), al_result_stats (inside al_exec_result), al_term_state (airlock/text.h:
 * zeroed state the caller keeps). orchestrator/abi/ holds the ABI baseline CI compares with
 * (docs/PACKAGING.md).
 */
#ifndef AIRLOCK_H
#define AIRLOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Everything declared here is exported (orchestrator/libairlock.sym); the rest is local. */
#pragma GCC visibility push(default)

/* Whether a sized struct the library filled (or handed out) holds field: false for a field newer
 * than the library that filled it. */
#define AL_HAS(p, field)                                                                           \
    ((p)->struct_size >= offsetof(__typeof__(*(p)), field) + sizeof((p)->field))
/* What each AL_<NAME>_INIT is: the struct's size, the rest zero. */
#define AL_SIZED_INIT(type)                                                                        \
    {                                                                                              \
        .struct_size = sizeof(type)                                                                \
    }
/* al_exec_opts.stdin_fd: this process's fd 0 (0 itself means "none"). */
#define AL_FD_STDIN (-2)

/* The version of this header; al_version() is the library's, which may be newer at run time
 * under the same soname (libairlock.so.1). NUMBER is MAJOR * 10000 + MINOR * 100 + MICRO. */
#define AIRLOCK_VERSION_MAJOR 0
#define AIRLOCK_VERSION_MINOR 2
#define AIRLOCK_VERSION_MICRO 0
#define AIRLOCK_VERSION_NUMBER                                                                     \
    (AIRLOCK_VERSION_MAJOR * 10000 + AIRLOCK_VERSION_MINOR * 100 + AIRLOCK_VERSION_MICRO)
/* The library's version as "MAJOR.MINOR.MICRO" (static storage); with number (if not NULL)
 * its AIRLOCK_VERSION_NUMBER. */
const char *al_version(unsigned *number);

typedef struct al_error {
    int code;      /* negative errno; 0 while unset */
    char msg[512]; /* one line: what failed and why */
} al_error;

/* ---- images ---- */

enum al_transport {
    AL_TRANSPORT_IMAGE = 0,  /* session option only: the image's (what a zeroed al_session_opts
                                asks for); an image's own transport is never this */
    AL_TRANSPORT_VIRTIO = 1, /* the agent is the image's init and serves a virtio-serial port */
    AL_TRANSPORT_SSH = 2,    /* sshd in the guest; the agent is copied in over SFTP */
};

/* "virtio" or "ssh" (--transport, a profile's transport, a manifest's) to AL_TRANSPORT_VIRTIO
 * or AL_TRANSPORT_SSH; else -EINVAL and "unknown transport 'X' (virtio or ssh)" in err. */
int al_transport_parse(const char *s, int *out, al_error *err);

/* The longest host path airlock builds or accepts, with its NUL: the kernel's PATH_MAX, what
 * one system call takes. Paths are built checked (a longer one fails with ENAMETOOLONG, never
 * cut). (A guest path's bound is the protocol's, AL_GUEST_PATH_MAX in proto/.) */
#define AL_PATH_MAX 4096

typedef struct al_image {
    size_t struct_size; /* sizeof: AL_IMAGE_INIT (see "Structs" above) */
    char name[64];
    /* Paths, owned (al_image_free), never NULL once loaded: "" for a part the image lacks. */
    char *dir;    /* the image's directory in the store */
    char *kernel; /* absolute paths, checked to be inside dir; both empty for an image that
                     boots from its disk through the firmware (imported) */
    char *initrd;
    char *disk; /* root disk base image (qcow2), inside dir; empty when none. Never written:
                   each session boots on an overlay of its own */
    char cmdline[1024];
    unsigned agent_protocol;
    unsigned memory_mib; /* suggested memory; 0 when the manifest names none */
    char languages[256]; /* space-separated */
    int transport; /* enum al_transport: how sessions reach the agent by default, VIRTIO or SSH */
    char ssh_user[64]; /* SSH images: the user cloud-init gives the session's key */
    unsigned ssh_port; /* SSH images: sshd's port in the guest */
    /* Where the image came from (al_image_from, al_image_commit), for 'image ls': "recipe",
     * "imported", "containerfile", "oci-layout", "oci-archive", "docker-archive", "directory"
     * or "commit"; its path (or the session it was saved from); the digest of what was read
     * ("sha256:HEX", "" when none). */
    char source[32];
    char source_path[512];
    char digest[80];
    /* The session's defaults from the image's configuration (ENV, WORKDIR, USER, CMD with
     * ENTRYPOINT before it): env comes before a run's own, workdir is the cwd of a run that
     * names none. Owned; NULL or "" when the image sets none. */
    char **env;
    char *workdir;
    char *user;
    char **cmd;
} al_image;
#define AL_IMAGE_INIT AL_SIZED_INIT(al_image)

/* The store: $AIRLOCK_IMAGE_DIR, else /var/lib/airlock/images for root, else
 * $XDG_DATA_HOME/airlock/images. Writes into buf. */
int al_image_store_dir(char *buf, size_t len, al_error *err);
int al_image_load(const char *name, al_image *out, al_error *err);
/* Frees what al_image_load put in img (a zeroed img is fine). */
void al_image_free(al_image *img);
/* Calls fn for every valid image in the store, in name order; invalid ones are reported via
 * fn with img == NULL and why set. */
int al_image_list(void (*fn)(void *ctx, const al_image *img, const char *name, const char *why),
                  void *ctx, al_error *err);
/* The image a session boots when none is named: $AIRLOCK_IMAGE, else "debian" when the store
 * has it, else "tiny". */
const char *al_image_default(void);

typedef struct al_image_build_opts {
    size_t struct_size; /* sizeof: AL_IMAGE_BUILD_OPTS_INIT (see "Structs" above) */
    const char *name;   /* runs the recipe images/build-NAME.sh */
    bool toolchain;     /* pass --toolchain (recipes that have one) */
    int log_fd;         /* > 0: the recipe's stdout and stderr go here; 0 or -1: nowhere */
} al_image_build_opts;
#define AL_IMAGE_BUILD_OPTS_INIT AL_SIZED_INIT(al_image_build_opts)
/* Builds an image into the store (replacing one of the same name once the build succeeded).
 * Recipes and the agent come from the source and build tree for an uninstalled airlock, else
 * from PREFIX/share/airlock/images and PREFIX/libexec/airlock; $AIRLOCK_RECIPE_DIR and
 * $AIRLOCK_AGENT_BIN override. */
int al_image_build(const al_image_build_opts *opts, al_error *err);

typedef struct al_image_import_opts {
    size_t struct_size;   /* sizeof: AL_IMAGE_IMPORT_OPTS_INIT (see "Structs" above) */
    const char *path;     /* the disk: a qcow2, or a raw disk starting with a boot sector */
    const char *name;     /* the image's name in the store */
    const char *ssh_user; /* NULL: "debian"; the cloud image's default user, who gets the
                             session's key from cloud-init */
    unsigned memory_mib;  /* 0: 1024 */
    bool force;           /* replace an image of that name */
} al_image_import_opts;
#define AL_IMAGE_IMPORT_OPTS_INIT AL_SIZED_INIT(al_image_import_opts)
/* Copies a stock cloud image's disk into the store as an SSH image that boots through the
 * firmware (manifest: disk, transport "ssh", ssh_user, ssh_port 22, memory_mib). The file is
 * read as hostile: one with a backing file or an external data file, an encrypted one, or one
 * over 256 GiB (file or virtual size) is refused; the format is read from its first bytes,
 * never probed by qemu-img. Nothing is left in the store on failure. */
int al_image_import(const al_image_import_opts *opts, al_error *err);
/* Removes an image from the store; sessions already running on it are not affected. */
int al_image_remove(const char *name, al_error *err);

/* Images from what container tools make (al_image_from). */
#define AL_IMAGE_FROM_SIZE_DEFAULT (8ull << 30) /* the files' data */
#define AL_IMAGE_FROM_TIMEOUT_DEFAULT_S 1800    /* a Containerfile's build */
typedef struct al_image_from_opts {
    size_t struct_size; /* sizeof: AL_IMAGE_FROM_OPTS_INIT (see "Structs" above) */
    const char *name;   /* the image's name in the store */
    /* A Containerfile or Dockerfile (built with buildah), an OCI image layout (a directory with
     * oci-layout) or archive, a `docker save` tarball, or a directory tree (a root file
     * system). */
    const char *from;
    const char *context; /* a Containerfile's build context; NULL: the file's directory */
    const char *base;    /* the image whose kernel and initrd boot it; NULL: "debian" */
    uint64_t max_size;   /* the files' data; 0: AL_IMAGE_FROM_SIZE_DEFAULT */
    unsigned timeout_s;  /* a Containerfile's build; 0: AL_IMAGE_FROM_TIMEOUT_DEFAULT_S */
    bool keep_setid;     /* keep set-uid and set-gid bits (else cleared) */
    bool force;          /* replace an image of that name */
    int log_fd;          /* > 0: the builder's output and a line for each entry changed */
    bool kernels; /* add python3 and IPython (what the language kernels need) with the image's
                     apt-get, in a buildah container; not for a directory tree */
} al_image_from_opts;
#define AL_IMAGE_FROM_OPTS_INIT AL_SIZED_INIT(al_image_from_opts)
/* Makes an image of a root file system that container tools describe: the layers are applied
 * as hostile input (nothing written outside the new tree; "..", absolute paths and hard links
 * out of it refused; device nodes dropped; set-id bits cleared; sizes bounded; every digest
 * checked), the tree becomes an ext4 root disk, and the base image's kernel and initrd (with the
 * agent and the language kernels) boot it. The image's ENV, WORKDIR, USER and CMD become its
 * sessions' defaults. Nothing is left in the store on failure. */
int al_image_from(const al_image_from_opts *opts, al_error *err);

typedef struct al_image_export_opts {
    size_t struct_size; /* sizeof: AL_IMAGE_EXPORT_OPTS_INIT (see "Structs" above) */
    const char *image;  /* NULL: "debian" */
    const char *ref;    /* the local container image made; NULL: "airlock/IMAGE" */
    int log_fd;         /* > 0: podman's output */
} al_image_export_opts;
#define AL_IMAGE_EXPORT_OPTS_INIT AL_SIZED_INIT(al_image_export_opts)
/* Makes a local container image (podman's store) of an image's root disk, so that a
 * Containerfile can start FROM it with no registry. */
int al_image_export_base(const al_image_export_opts *opts, al_error *err);

/* ---- sessions ---- */

typedef struct al_session al_session;

/* Network on request (net.c, docs/SECURITY.md): HTTP and HTTPS to the allowed hosts only,
 * through a proxy (Squid) of the session's own on the host. */
#define AL_NET_ALLOW_MAX 256
#define AL_NET_BYTES_MAX_DEFAULT (1ull << 30) /* both ways, all requests of the session */
#define AL_NET_CONNS_MAX_DEFAULT 16
#define AL_NET_CONNS_MAX_LIMIT 256
typedef struct al_net_opts {
    /* NULL-terminated host names ("pypi.org") and "*.suffix" patterns (which match the suffix
     * itself and every name under it). NULL or empty: the VM has no network device at all. */
    const char *const *allow;
    uint64_t bytes_max;     /* 0: AL_NET_BYTES_MAX_DEFAULT; a hard cap on the session's bytes */
    unsigned conns_max;     /* 0: AL_NET_CONNS_MAX_DEFAULT connections at once */
    const char *hosts_file; /* tests: the proxy resolves only the names in this hosts(5) file;
                               NULL: the host's resolver */
} al_net_opts;

typedef struct al_session_opts {
    size_t struct_size;        /* sizeof: AL_SESSION_OPTS_INIT (see "Structs" above) */
    const char *image;         /* name in the store; NULL: al_image_default() */
    const char *connect_uri;   /* NULL: --connect / LIBVIRT_DEFAULT_URI / system / session */
    unsigned memory_mib;       /* 0: the image's, else 256 */
    unsigned vcpus;            /* 0: 1 */
    unsigned lifetime_s;       /* 0: unlimited; the session fails once it is older */
    unsigned boot_timeout_ms;  /* 0: 60 s; from domain start to the agent's handshake */
    unsigned stall_timeout_ms; /* 0: 10 s; a frame half-received for this long fails */
    bool quiet;                /* no notices */
    FILE *notice;              /* where notices go (emulation fallback) when on_notice is not
                                  set; NULL: nowhere (the library never prints on its own) */
    const char *raw_port;      /* benchmarks: add a second virtio-serial port of this name */
    FILE *console_to;          /* NULL, or where the guest console is copied when the session
                                  closes (also after a failed boot) */
    int cancel_fd;             /* 0 or -1: none; or a pipe: each byte read is a signal number. While
                                  booting any byte cancels; during an exec SIGINT/SIGQUIT are
                                  forwarded to the guest process group, others kill it. */
    int transport; /* enum al_transport. AL_TRANSPORT_IMAGE (0): the image's; else that one, which
                                    the image must serve (al_transport_parse reads names) */
    bool checkpoints; /* allow al_checkpoint_*: images without a disk get a small scratch
                         qcow2 to hold the snapshots (the guest never mounts it) */
    /* Notices (one line, no "airlock: notice: " prefix, no newline): called instead of
     * writing to notice when set; from the thread that opens the session. */
    void (*on_notice)(void *ctx, const char *msg);
    void *notice_ctx;
    /* What the session's disk overlay and checkpoints may occupy on the host (they live in the
     * state dir: $AIRLOCK_STATE_DIR, /var/lib/airlock/state for root, else
     * $XDG_STATE_HOME/airlock). Over it the VM is paused and requests fail with -ENOSPC; the
     * same happens when the filesystem would fall below $AIRLOCK_FREE_FLOOR_MB (default 512)
     * free. 0: AL_DISK_BUDGET_DEFAULT. */
    uint64_t disk_budget_bytes;
    int warm;        /* enum al_warm: whether the session starts from a template (warm starts) */
    al_net_opts net; /* zeroed: no network (the default) */
    /* A screen and input devices the host drives (al_screen_capture, al_screen_input): a VGA
     * display, a virtio tablet (absolute pointing) and a virtio keyboard. Such a session boots
     * cold, unless its image has a display of its own (the desktop image: its template has
     * one too). */
    bool display;
    /* Not NULL: a kept session (keep.c), one that outlives this handle and its process: its
     * domain is not tied to the libvirt connection, gc leaves it alone (until its lifetime_s
     * ends, when it has one), and the process named keeper ("airlockd", a short name of
     * [A-Za-z0-9._-]) takes it back with al_session_reattach after al_session_detach, a crash
     * or a restart. It boots cold (no template); network on request and SSH images are not
     * kept (-EOPNOTSUPP). */
    const char *keep;
    /* The display's preferred mode (QEMU's EDID, which the guest's X takes), in pixels: both 0
     * for 1280x800, else both set, each a multiple of 8, AL_DISPLAY_MIN_* to AL_DISPLAY_MAX_*.
     * Implies display; such a session boots cold. */
    unsigned display_width, display_height;
    /* LIBAIRLOCK_1.4: volumes (al_vol_create) attached and mounted in the guest, each
     * "NAME:/PATH" or "NAME:/PATH:ro", NULL-terminated, at most AL_VOLS_MAX: read-write in one
     * session at a time, read-only in any number while none has it read-write (-EBUSY
     * otherwise). Such a session boots cold, is not kept, and runs on this host. */
    const char *const *volumes;
    /* LIBAIRLOCK_1.4: a fork (al_fork_open, al_snapshot_open) is left as its source was rather
     * than made unique: the same kernel entropy, machine-id and hostname, the python kernel's
     * generators not reseeded; for harnesses that need identical streams in every fork. */
    bool fork_keep_identity;
} al_session_opts;
#define AL_DISPLAY_MIN_W 640u
#define AL_DISPLAY_MIN_H 480u
#define AL_DISPLAY_MAX_W 2560u
#define AL_DISPLAY_MAX_H 1600u
/* 0 when width x height is a display size al_session_opts takes (both 0: the default), else
 * -EINVAL with the bounds in err. */
int al_display_size_check(unsigned width, unsigned height, al_error *err);
#define AL_SESSION_OPTS_INIT AL_SIZED_INIT(al_session_opts)
#define AL_DISK_BUDGET_DEFAULT (6ull << 30)
#define AL_FREE_FLOOR_DEFAULT (512ull << 20)

int al_session_open(const al_session_opts *opts, al_session **out, al_error *err);
/* Destroys the VM and removes the session's files. Safe on NULL. */
void al_session_close(al_session *s);
/* Ends the session's VM now, from any thread: every request in flight on it fails at once
 * (-ESHUTDOWN), whatever the guest does; al_session_close still frees it, once those calls
 * have returned. */
void al_session_stop(al_session *s);
const char *al_session_name(const al_session *s);

/* ---- sessions that outlive their process (keep.c): al_session_opts.keep ---- */

/* Frees the handle and leaves a kept session's VM running (or paused to disk) and its files in
 * place, for al_session_reattach; any other session is closed as by al_session_close. The runs
 * in flight end on the host's side with -ESHUTDOWN; in the guest they go on (see
 * al_session_adopted). Safe on NULL. */
void al_session_detach(al_session *s);

typedef struct al_reattach_opts {
    size_t struct_size;      /* sizeof: AL_REATTACH_OPTS_INIT (see "Structs" above) */
    const char *name;        /* the session's name (al_session_name) */
    const char *keeper;      /* as it was opened with (al_session_opts.keep) */
    const char *connect_uri; /* NULL: as al_session_opts.connect_uri */
    int cancel_fd;           /* as al_session_opts.cancel_fd */
    bool quiet;
    void (*on_notice)(void *ctx, const char *msg);
    void *notice_ctx;
} al_reattach_opts;
#define AL_REATTACH_OPTS_INIT AL_SIZED_INIT(al_reattach_opts)
/* Takes back a kept session of keeper: its running VM (a fresh handshake; the runs the agent
 * kept meanwhile are listed by al_session_adopted), or the state it was paused to
 * (al_session_paused: nothing runs until al_session_resume). -ENOENT when no such session is
 * kept, -ESRCH when its VM is gone and nothing was paused (it is then removed), -EBUSY when
 * another process holds it. */
int al_session_reattach(const al_reattach_opts *opts, al_session **out, al_error *err);
/* The runs the agent kept while no host was connected, handed to this handle at its last
 * handshake (reattach, resume): up to max request ids into ids; returns how many there are.
 * Each is taken over by al_exec with al_exec_opts.adopt. */
size_t al_session_adopted(const al_session *s, uint32_t *ids, size_t max);

/* Pauses a kept session to disk: the VM's whole state (memory, devices, running processes)
 * saved in the session's state dir (mode 0600, its SHA-256 and QEMU's identity recorded), the
 * QEMU process gone. Runs in flight end on the host's side with -ESTALE and are kept by the
 * agent for al_session_resume. Fails, the session running on, when the state dir lacks room
 * for the memory (above the free-space floor). */
int al_session_pause(al_session *s, al_error *err);
/* Brings a paused session back: the saved state checked first (size, owner, mode, SHA-256, the
 * same QEMU) and refused with the reason when any differs (-EBADMSG, or -ESTALE for another
 * QEMU), never loaded; then restored, handshaken (the kept runs adopted) and made unique again
 * (clock, entropy). */
int al_session_resume(al_session *s, al_error *err);
bool al_session_paused(const al_session *s);

/* What a session's VM uses now, as the host counts it (libvirt's counters of the domain and
 * the files on the host), never the guest's word. LIBAIRLOCK_1.4. */
typedef struct al_usage {
    size_t struct_size; /* sizeof: AL_USAGE_INIT (see "Structs" above) */
    uint64_t cpu_ns;    /* CPU time the VM has used so far, all its vCPUs */
    unsigned vcpus;
    uint64_t mem_total;  /* bytes of guest memory */
    uint64_t mem_used;   /* bytes QEMU holds in the host's memory (its resident set) */
    uint64_t disk_used;  /* bytes the session's disk files occupy on the host */
    uint64_t disk_total; /* the disk budget in bytes, 0 for none */
} al_usage;
#define AL_USAGE_INIT AL_SIZED_INIT(al_usage)
/* -ESHUTDOWN when the VM is gone or paused. */
int al_session_usage(al_session *s, al_usage *out, al_error *err);

typedef struct al_kept_info {
    size_t struct_size; /* sizeof: AL_KEPT_INFO_INIT (see "Structs" above) */
    char name[64];
    bool paused;     /* to disk */
    bool held;       /* a live process holds it now */
    int64_t expires; /* unix time its lifetime ends, 0: none */
    char keeper[64]; /* whose it is (LIBAIRLOCK_1.4) */
} al_kept_info;
#define AL_KEPT_INFO_INIT AL_SIZED_INIT(al_kept_info)
/* Calls fn for each session kept for keeper on this machine (NULL: for any keeper; since
 * LIBAIRLOCK_1.4). Returns how many. */
int al_session_kept(const char *keeper, void (*fn)(void *ctx, const al_kept_info *k), void *ctx,
                    al_error *err);
/* Ends a kept session of keeper that no process holds: its VM destroyed, its files removed
 * (what a keeper does with a session it has no record of). */
int al_session_discard(const char *keeper, const char *name, al_error *err);

const char *al_session_console_path(const al_session *s);
const char *al_session_raw_port_path(const al_session *s);
const char *al_session_agent_version(const al_session *s);
const char *al_session_languages(const al_session *s);
bool al_session_kvm(const al_session *s);
unsigned al_session_vcpus(const al_session *s);
/* Whether the session has a screen and input: asked for (al_session_opts.display), or given by
 * its image (the desktop image's manifest says "display": true). */
bool al_session_has_display(const al_session *s);

/* ---- the screen and input of a session with a display (screen.c) ----
 * Taken and driven from the host (libvirt's screenshot, QEMU's input events), never through
 * the guest: a session opened without al_session_opts.display gets -ENODEV from each. */

/* The bytes a screenshot may take from QEMU; the guest chooses its mode, this bounds it. */
#define AL_SCREENSHOT_BYTES_MAX (64u << 20)
/* Screenshots of one session at most this often: a faster caller waits the rest. */
#define AL_SCREENSHOT_INTERVAL_MS 50u

typedef struct al_screenshot_opts {
    size_t struct_size;  /* sizeof: AL_SCREENSHOT_OPTS_INIT (see "Structs" above) */
    unsigned max_edge;   /* 0: as big as the screen (or region); else scaled down so that its
                            longer side is at most this */
    unsigned x, y, w, h; /* a region of the screen, in its pixels (zoom); w or h 0: all of it */
} al_screenshot_opts;
#define AL_SCREENSHOT_OPTS_INIT AL_SIZED_INIT(al_screenshot_opts)

typedef struct al_screenshot {
    size_t struct_size; /* sizeof: AL_SCREENSHOT_INIT (see "Structs" above) */
    uint8_t *png;       /* the image (malloc'd: free it), checked by libpng */
    size_t len;
    unsigned width, height;               /* of the PNG */
    unsigned screen_width, screen_height; /* of the guest's display mode when it was taken */
} al_screenshot;
#define AL_SCREENSHOT_INIT AL_SIZED_INIT(al_screenshot)

/* The screen now, as PNG. -ENODEV without a display, -EFBIG past AL_SCREENSHOT_BYTES_MAX or
 * a mode past 8192x8192 pixels, -EINVAL for a region outside the screen. */
int al_screen_capture(al_session *s, const al_screenshot_opts *opts, al_screenshot *out,
                      al_error *err);

/* Input actions, one JSON array of objects (the vocabulary of Anthropic's computer tool, which
 * OpenAI's maps onto): {"action": "mouse_move"|"left_click"|"right_click"|"middle_click"|
 * "double_click"|"triple_click"|"left_mouse_down"|"left_mouse_up"|"left_click_drag"|"scroll"|
 * "key"|"hold_key"|"type"|"wait"|"cursor_position", "coordinate": [x, y],
 * "start_coordinate": [x, y] (a drag's start), "text": keys ("ctrl+shift+t", xdotool's names,
 * sequences separated by spaces) or text to type (the US keyboard's ASCII as keys, newline is
 * Return; text with any other character is typed whole by xdotool in the guest, -ENOTSUP when
 * it has none),
 * "scroll_direction": "up"|"down"|"left"|"right", "scroll_amount": notches, "duration":
 * seconds (wait, hold_key; at most 60), "repeat": times (key)}. A click's "text" names keys
 * held during it. Coordinates are pixels of the screen, or of an image of size (space_w x
 * space_h) when those are not 0 (a scaled screenshot); each maps onto the centre of its pixel in
 * the tablet's range, and one outside the screen fails the action rather than clicking
 * elsewhere. Actions run in order; the first that fails stops the rest: -EINVAL naming it
 * ("action 2 (left_click): ..."). *done (if not NULL) counts those that ran; *x, *y (if not
 * NULL) get the pointer's position as the host last set it, in the same pixels (-1 if never). */
int al_screen_input(al_session *s, const char *actions_json, unsigned space_w, unsigned space_h,
                    unsigned *done, int *x, int *y, al_error *err);

/* ---- network (net.c) ---- */

/* One request the session's proxy saw (or the relay's byte cap stopped). */
typedef struct al_net_request {
    size_t struct_size; /* sizeof: AL_NET_REQUEST_INIT (see "Structs" above) */
    int64_t time_ms;    /* unix time in ms, when it ended */
    char method[16];    /* GET, CONNECT...; printable ASCII, from the guest */
    char host[256];     /* the name asked for; printable ASCII, from the guest; "-" for the cap */
    unsigned port;
    unsigned status; /* HTTP status the proxy answered, 0 when none */
    uint64_t bytes;  /* both ways, as the proxy counted */
    bool allowed;
    char why[400]; /* denied: why, one phrase ("host X is not in the allowlist; ask the user to
                      allow it") */
} al_net_request;
#define AL_NET_REQUEST_INIT AL_SIZED_INIT(al_net_request)
/* "none" (no network) or "allow=HOST[,HOST...]" into a NULL-terminated allowlist (NULL for
 * none; free with al_net_allow_free). Presets are the caller's (the CLI's profiles). */
int al_net_spec_parse(const char *spec, char ***out, al_error *err);
int al_net_allow_parse(const char *list, char ***out, al_error *err);
void al_net_allow_free(char **allow);
bool al_net_host_pattern_ok(const char *pattern);
/* Whether the session was opened with network. */
bool al_session_net(const al_session *s);
/* Calls fn for each request from *cursor on (NULL: all kept; the last 4096 are kept) and moves
 * *cursor past them. Returns how many; -ENOTSUP for a session without network. Thread-safe;
 * fn runs under the session's network lock and must not call al_net_* on the same session. */
int al_net_requests(al_session *s, size_t *cursor, void (*fn)(void *ctx, const al_net_request *r),
                    void *ctx, al_error *err);

/* Where the time to a ready session went. */
typedef struct al_session_timing {
    size_t struct_size;    /* sizeof: AL_SESSION_TIMING_INIT (see "Structs" above) */
    unsigned prepare_ms;   /* image, libvirt connection, gc, runtime dir */
    unsigned start_ms;     /* libvirt creating and starting the domain, socket connect */
    unsigned handshake_ms; /* guest boot until the agent answered */
    unsigned restore_ms;   /* restored from a template: device state loaded, resumed, made
                              unique (0 for a cold boot; start_ms and handshake_ms then cover
                              only the domain start and the re-handshake) */
} al_session_timing_t;
#define AL_SESSION_TIMING_INIT AL_SIZED_INIT(al_session_timing_t)
void al_session_timing(const al_session *s, al_session_timing_t *out);

/* ---- exec ---- */

enum al_exec_how {
    AL_EXEC_EXITED = 0,   /* value: exit status */
    AL_EXEC_SIGNALED = 1, /* value: signal number */
};

/* ---- kernel results (docs/PROTOCOL.md, "Results") ---- */

enum al_result_kind {
    AL_RESULT_VALUE = 0,   /* the block's last expression (a notebook's execute_result) */
    AL_RESULT_DISPLAY = 1, /* one display() call (display_data) */
    AL_RESULT_ERROR = 2,   /* the block raised: name, value, traceback */
    AL_RESULT_REFUSED = 3, /* a record the host refused (why): over a limit, malformed */
};

/* MIME types a result may carry: text/plain, text/html, text/markdown, image/png, image/jpeg,
 * image/svg+xml, application/json, text/latex. */
#define AL_MIME_MAX 8

typedef struct al_mime {
    const char *type;    /* one of the eight */
    const uint8_t *data; /* text: UTF-8 (checked), NUL-terminated; application/json: the value
                            as compact JSON; images: the decoded bytes, checked to be of their
                            kind */
    size_t len;
} al_mime;

typedef struct al_result {
    size_t struct_size;       /* sizeof: AL_RESULT_INIT (see "Structs" above) */
    int kind;                 /* enum al_result_kind */
    unsigned execution_count; /* VALUE: the cell's number, when the kernel gave one */
    size_t nmime;
    al_mime mime[AL_MIME_MAX];
    const char *name, *value, *traceback; /* ERROR: UTF-8, checked */
    const char *why;                      /* REFUSED: one phrase */
    unsigned width, height;               /* of the image/png, from its header; else 0 */
} al_result;
#define AL_RESULT_INIT AL_SIZED_INIT(al_result)

/* Called for each result as it arrives; everything it points to lives until the call returns.
 * A negative return fails the exec. */
typedef int (*al_result_fn)(void *ctx, const al_result *r);
const al_mime *al_result_mime(const al_result *r, const char *type);
/* One JSON object for the result (malloc'd, NULL when out of memory): {"type": "result",
 * "kind": "value"|"display", "execution_count", "data": {MIME: text, image as base64,
 * application/json as its value}, "width", "height"}, {"type": "error", "kind": "error",
 * "name", "value", "traceback"} or {"type": "refused", "kind": "refused", "why"}: what
 * `airlock exec --json` prints and the data of airlockd's result and refused events. */
char *al_result_json(const al_result *r);

typedef struct al_result_stats {
    bool have_count;          /* the kernel numbered the run */
    unsigned execution_count; /* that number */
    bool error;               /* an error result came */
    unsigned results;         /* results handed to the callback (errors included) */
    unsigned refused;         /* records refused */
} al_result_stats;

typedef struct al_exec_opts {
    size_t struct_size;      /* sizeof: AL_EXEC_OPTS_INIT (see "Structs" above) */
    const char *const *argv; /* NULL-terminated; argv[0] is a program, unless lang is set */
    const char *lang;        /* run code (argv[0]) in this language, e.g. "sh" */
    bool kernel;             /* run the code in lang's long-lived kernel of this session
                                ("python", "shell", "javascript"): state persists between
                                runs; the session lists them as "kernel:NAME" languages */
    unsigned input_wait_ms;  /* > 0: the guest reports a program blocked this long reading its
                                stdin (waited_input); without stdin_fd it then gets an empty
                                pipe that stays open instead of /dev/null. At most 3600000 */
    bool interrupt_on_wait;  /* on that report, send the program SIGINT (a kernel survives) */
    const char *const *env;  /* NULL-terminated KEY=VALUE list added in the guest, or NULL */
    const char *cwd;         /* NULL: / */
    unsigned timeout_ms;     /* 0: none */
    uint64_t output_cap;     /* per stream, 0: none */
    int stdin_fd;            /* > 0: the program's stdin is read from it; AL_FD_STDIN: from this
                                process's fd 0; 0 or -1: none (/dev/null) */
    int stdout_fd;           /* > 0: where stream 1's bytes are written; 0 or -1: dropped */
    int stderr_fd;           /* the same for stream 2 */
    /* When set, stream bytes go here instead of stdout_fd/stderr_fd (stream is 1 or 2). A
     * negative return fails the exec, except -EPIPE, which sends the guest SIGPIPE. */
    int (*output)(void *ctx, int stream, const uint8_t *data, size_t len);
    void *output_ctx;
    /* A kernel run's results, each as it arrives (NULL: read, checked and dropped). */
    al_result_fn result;
    void *result_ctx;
    /* A kernel run's context: NULL or "default" for the language's default kernel; another
     * name (letters, digits, '_', '-', '.', at most 32) is a kernel of its own, with its own
     * state and cwd, started by its first run. */
    const char *context;
    /* > 0: this run's own signal pipe, read as the session's cancel_fd is (SIGINT and SIGQUIT
     * bytes are passed to the program, any other byte kills it and everything it started, and
     * the exec fails with -ECANCELED), so that several runs of one session can be signalled
     * apart; 0 or -1: the session's. */
    int cancel_fd;
    /* > 0: the program runs on a pseudo-terminal of pty_rows x pty_cols (each at most
     * AL_PTY_ROWS_COLS_MAX: more is cut to it; pty_cols 0 is refused), its controlling terminal
     * and its stdin, stdout and stderr, for a shell, an editor, a REPL. Its output comes as
     * stream 1 alone, exactly as a terminal is to show it (escape sequences included: for a
     * terminal the user asked for, never for text shown as text). TERM is xterm-256color unless
     * env sets it. Ctrl-C and the like are bytes of stdin, the terminal's own; EOF on stdin_fd
     * is the terminal closing: the guest hangs it up (SIGHUP to its session), and what still
     * runs of the program 3 s later is killed. Not for kernel runs. */
    unsigned pty_rows, pty_cols;
    /* > 0 with a pty: where the terminal's new sizes come from while it runs, each written by
     * al_pty_resize (a pipe the caller owns); 0 or -1: the size stays. */
    int resize_fd;
    /* Called once, when the program runs in the guest, with output_ctx and its pid there: the
     * guest's word, a number to show and to find the run by, never one the host acts on. NULL:
     * not told. */
    void (*started)(void *ctx, uint32_t guest_pid);
    /* Sessions that outlive their process (al_session_reattach): where not NULL, the run's
     * request id is written here before the request is sent, for a later adopt. */
    uint32_t *request_id;
    /* Not 0: instead of starting a program, take over this run that the agent kept while no
     * host was connected (al_session_adopted lists them): its output from where the last host
     * stopped reading, then its exit. argv, lang and the rest that starts a program are then
     * ignored; its input is closed. */
    uint32_t adopt;
    /* A kernel run waits its turn behind the runs sent before it to the same kernel context
     * (AL_KERNEL_QUEUE_MAX at most, in arrival order; a cancel while it waits means it never
     * runs). Called with output_ctx and the number ahead of it as it takes its place (0: none),
     * each time that number changes, and with 0 when its turn came, from its own thread; NULL:
     * not told. (LIBAIRLOCK_1.4) */
    void (*queued)(void *ctx, unsigned ahead);
} al_exec_opts;
#define AL_EXEC_OPTS_INIT AL_SIZED_INIT(al_exec_opts)

/* Kernel runs of one context waiting at once, the running one included: a front that sends
 * more is refused at once (-EBUSY), the bound named. */
#define AL_KERNEL_QUEUE_MAX 32

/* Most rows or columns of a pty run's terminal. */
#define AL_PTY_ROWS_COLS_MAX 1000
/* The login shell a terminal opens when it is given no command (airlock shell, the chat's %shell,
 * airlockd's pty runs without argv): for {"/bin/sh", "-c", AL_LOGIN_SHELL}. bash -l, else sh -l,
 * in /workspace where the session has one, else the home directory; AL_LOGIN_SHELL_HERE: the
 * same in the run's own cwd. */
#define AL_LOGIN_SHELL_HERE "if command -v bash >/dev/null 2>&1; then exec bash -l; fi; exec sh -l"
#define AL_LOGIN_SHELL "cd /workspace 2>/dev/null || cd; " AL_LOGIN_SHELL_HERE
/* Tells the pty run reading fd's other end (al_exec_opts.resize_fd) its terminal's new size:
 * one write of 4 bytes, so it is safe in a signal handler (SIGWINCH) and atomic on a pipe.
 * 0, or -errno (-EINVAL for 0 rows or columns). */
int al_pty_resize(int fd, unsigned rows, unsigned cols);

/* A forwarded port: the bytes a tunnel carried, counted by the host. */
typedef struct al_port_counts {
    size_t struct_size; /* sizeof: AL_PORT_COUNTS_INIT (see "Structs" above) */
    uint64_t to_guest, from_guest;
} al_port_counts;
#define AL_PORT_COUNTS_INIT AL_SIZED_INIT(al_port_counts)
/* Relays fd, a connected stream socket of the caller's (left open), to 127.0.0.1:port in the
 * guest, both ways, beside the session's runs: what fd's peer sends goes to the guest's service,
 * what the service answers goes to fd, each under the channel's credit (a side that does not
 * read holds the other, nothing is buffered without bound). The end of fd's input half-closes
 * the guest's side; the guest's end half-closes fd (shutdown SHUT_WR); it returns when the
 * guest's side has closed, or fd's peer is gone, or on a byte from cancel_fd (> 0; -ECANCELED).
 * Only the host opens tunnels: nothing in the guest reaches the host this way. 0 with counts
 * (may be NULL); -ENOENT when nothing listens on that port in the guest, -EOPNOTSUPP for an
 * agent that forwards no ports. */
int al_port_relay(al_session *s, unsigned port, int fd, int cancel_fd, al_port_counts *counts,
                  al_error *err);

/* Port forwarding (airlock exec -p, airlock port): a listening socket on the host whose every
 * connection is relayed (al_port_relay) to a port in the guest, by threads of its own. */
typedef struct al_forward al_forward;
typedef struct al_attach al_attach;
typedef struct al_image_commit_opts al_image_commit_opts;
typedef struct al_forward_opts {
    size_t struct_size;  /* sizeof: AL_FORWARD_OPTS_INIT (see "Structs" above) */
    al_session *session; /* the session, a session of this process; or */
    al_attach *attach;   /* one another airlock process holds (al_attach_open) */
    const char *bind;    /* the address to listen on; NULL: 127.0.0.1 (this machine only) */
    unsigned host_port;  /* 0: a free one (al_forward_host_port says which) */
    unsigned guest_port; /* 1..65535, on 127.0.0.1 in the guest */
    /* A connection that failed (nothing listens in the guest, the session ended...): its
     * message, from a connection's thread; may be NULL. */
    void (*on_error)(void *ctx, const char *msg);
    void *ctx;
    /* Or a relay of the caller's (neither session nor attach set): called with ctx from each
     * connection's thread, it relays fd (left open) as al_port_relay does and returns when
     * either side ends or on a byte from cancel_fd; < 0 with err set on a failure (said through
     * on_error). airlock port's forward to a session of airlockd. (LIBAIRLOCK_1.4) */
    int (*relay)(void *ctx, int fd, int cancel_fd, al_error *err);
} al_forward_opts;
#define AL_FORWARD_OPTS_INIT AL_SIZED_INIT(al_forward_opts)
/* At most this many connections of one forward at once; more wait to be accepted. */
#define AL_FORWARD_CONNS_MAX 64
int al_forward_open(const al_forward_opts *o, al_forward **out, al_error *err);
unsigned al_forward_host_port(const al_forward *f);
/* Connections accepted so far. */
unsigned long al_forward_accepted(const al_forward *f);
/* Stops listening, ends the forward's connections (both ways) and waits for their threads. */
void al_forward_close(al_forward *f);

typedef struct al_exec_result {
    size_t struct_size; /* sizeof: AL_EXEC_RESULT_INIT (see "Structs" above) */
    int how;            /* enum al_exec_how */
    int value;
    uint64_t duration_us;
    bool timed_out;
    bool truncated_stdout;
    bool truncated_stderr;
    bool waited_input;       /* the program waited for input longer than input_wait_ms */
    bool interrupted;        /* the session's cancel fd delivered SIGINT or SIGQUIT during the
                                run, and it was sent to the program (the user's Ctrl-C, as
                                opposed to a timeout or an input wait) */
    al_result_stats results; /* a kernel run's: its number, whether it raised, counts */
    bool offline;            /* the session has no network and the run's output says it tried
                                to reach a host (a name that did not resolve, a network that
                                was unreachable): AL_OFFLINE_HINT says what to do */
} al_exec_result;
#define AL_EXEC_RESULT_INIT AL_SIZED_INIT(al_exec_result)

/* What a front says when al_exec_result.offline is set, followed by how it allows hosts. */
#define AL_OFFLINE_HINT                                                                            \
    "this session has no network (no NIC, no resolver): nothing outside the VM can be reached"
/* The hosts pip needs, for that how. */
#define AL_OFFLINE_PIP_HOSTS "pypi.org,files.pythonhosted.org"

/* Runs one command and streams its output. A command that cannot be started fails with
 * -ENOENT (not found) or -EACCES. */
int al_exec(al_session *s, const al_exec_opts *opts, al_exec_result *out, al_error *err);

/* ---- processes by handle (proc.c) ---- */

/* A run started in the background: al_exec's work on a thread of the library. */
typedef struct al_proc al_proc;
typedef struct al_proc_info {
    size_t struct_size;  /* sizeof: AL_PROC_INFO_INIT (see "Structs" above) */
    uint32_t serial;     /* its number in the session: 1, 2 ... */
    uint32_t guest_pid;  /* the guest's word (0 until it started): to show, never to act on */
    const char *command; /* argv joined by spaces, at most 256 bytes; lives as the handle */
    int64_t started;     /* unix time */
    bool running;
    bool failed; /* ended without a status (the session ended, the guest broke the protocol) */
    int how;     /* once ended with a status: enum al_exec_how */
    int value;
} al_proc_info;
#define AL_PROC_INFO_INIT AL_SIZED_INIT(al_proc_info)
/* Starts what opts describes, as al_exec would run it, and returns at once with its handle.
 * opts' strings are copied; its output goes to opts' callback or descriptors from the
 * library's thread, as al_exec's would (so they must stay valid while it runs). Signal it with
 * al_proc_signal: opts.cancel_fd must be none. Each is a request of its own beside the
 * session's others. */
int al_exec_start(al_session *s, const al_exec_opts *opts, al_proc **out, al_error *err);
/* Waits for it to end, up to timeout_ms (-1: for as long as it takes; 0: only looks): what
 * al_exec would have returned, with *out filled on 0; -EAGAIN while it still runs. */
int al_proc_wait(al_proc *p, int timeout_ms, al_exec_result *out, al_error *err);
/* SIGINT and SIGQUIT go to its process group in the guest; any other signal kills it and all
 * it started (its cgroup). -ESRCH once it ended. Thread-safe. */
int al_proc_signal(al_proc *p, int sig, al_error *err);
int al_proc_kill(al_proc *p, al_error *err);
/* Its guest pid, 0 until it started. Thread-safe. */
uint32_t al_proc_pid(al_proc *p);
uint32_t al_proc_serial(const al_proc *p);
/* Calls fn for each process of the session whose handle is not freed, newest first; returns how
 * many. fn must not call al_proc_* of the same session. */
int al_proc_list(al_session *s, void (*fn)(void *ctx, const al_proc_info *info), void *ctx);
/* Frees the handle, killing the process first if it still runs (and waiting for that). Before
 * or after al_session_close of its session (which ends its processes), not during. */
void al_proc_free(al_proc *p);

/* Kernel contexts. al_kernel_stop ends a context's kernel and forgets the context (restart:
 * the next run there starts afresh; remove: no run comes); -EBUSY while it runs a block.
 * al_kernel_list writes one line per context the guest holds, "LANG CONTEXT running" or
 * "LANG CONTEXT stopped" (its kernel died: the next run starts afresh and says the state was
 * lost), NUL-terminated and cut to len; returns the line count. */
int al_kernel_stop(al_session *s, const char *lang, const char *context, al_error *err);
int al_kernel_list(al_session *s, char *buf, size_t len, al_error *err);

/* ---- files ---- */

int al_file_put(al_session *s, const char *host_path, const char *guest_path, al_error *err);
int al_file_get(al_session *s, const char *guest_path, const char *host_path, al_error *err);
/* al_file_get of at most max_bytes: a larger file is refused (-EFBIG) on the size the guest
 * announces, before anything is written, and checked again as it arrives; nothing is left. */
int al_file_get_max(al_session *s, const char *guest_path, const char *host_path,
                    uint64_t max_bytes, al_error *err);

/* A guest path's metadata, as the guest reports it (hostile: bounded and checked, for display
 * and decisions in the guest only; never used as a host path). */
typedef struct al_file_info {
    size_t struct_size; /* sizeof: AL_FILE_INFO_INIT (see "Structs" above) */
    char name[256];     /* the last component ("/" for the root) */
    int type;           /* enum al_entry_type */
    uint64_t size;
    unsigned mode; /* permission bits, 07777 at most */
    int64_t mtime; /* unix time */
    /* LIBAIRLOCK_1.4: the owner's and the group's names as the guest says them ("" when it did
     * not), and a symlink's target resolved to an absolute path ("" for other entries, or a
     * target the guest could not resolve) */
    char owner[33], group[33];
    char link_target[4096];
} al_file_info;
#define AL_FILE_INFO_INIT AL_SIZED_INIT(al_file_info)
/* Entries al_file_list reports at most (more: -E2BIG). */
#define AL_FILE_LIST_MAX 10000

/* These run a small command in the guest (under the session's lock, like al_exec). Paths are
 * absolute. -ENOENT when the path does not exist, -ENOTDIR when a listed path is not a
 * directory, -EEXIST for mkdir of something there, -ENOTEMPTY for removing a directory that
 * holds something without recursive. */
int al_file_stat(al_session *s, const char *guest_path, al_file_info *out, al_error *err);
/* Calls fn for each entry of the directory (not . and ..), unordered. Returns how many. */
int al_file_list(al_session *s, const char *guest_dir,
                 void (*fn)(void *ctx, const al_file_info *st), void *ctx, al_error *err);
int al_file_remove(al_session *s, const char *guest_path, bool recursive, al_error *err);
int al_file_mkdir(al_session *s, const char *guest_path, bool parents, al_error *err);

/* ---- the user's directory in and out of /workspace ---- */

/* Bound on the file data of a workdir either way, unless the caller sets another: checked before
 * anything is sent, and on what the guest sends back. A workdir is a project folder. */
#define AL_WORKDIR_BYTES_MAX_DEFAULT (1ull << 30)
#define AL_WORKDIR_GUEST_DIR "/workspace"

typedef struct al_workdir_opts {
    size_t struct_size;    /* sizeof: AL_WORKDIR_OPTS_INIT (see "Structs" above) */
    uint64_t bytes_max;    /* 0: AL_WORKDIR_BYTES_MAX_DEFAULT */
    const char *guest_dir; /* NULL: /workspace */
} al_workdir_opts;
#define AL_WORKDIR_OPTS_INIT AL_SIZED_INIT(al_workdir_opts)

enum al_entry_type {
    AL_ENTRY_FILE = 0,
    AL_ENTRY_DIR = 1,
    AL_ENTRY_SYMLINK = 2,
    AL_ENTRY_OTHER = 3
};
enum al_change_kind { AL_CHANGE_ADDED = 0, AL_CHANGE_MODIFIED = 1, AL_CHANGE_DELETED = 2 };

/* What a change could make the host do beyond holding new bytes: set by the diff from the path
 * and the modes, so every front asks the same questions (workdir.c, classify). */
enum al_change_flag {
    /* Under .git/ (or .hg/) at any depth: the host's git reads that config (core.fsmonitor,
     * core.pager...) and runs those hooks on its next status or commit. Applied only with
     * AL_APPLY_VCS. */
    AL_CHANGE_VCS = 1 << 0,
    /* A file the guest made executable (added with an exec bit, or modified where the host's
     * had none). Written without exec bits unless AL_APPLY_EXEC. */
    AL_CHANGE_EXEC = 1 << 1,
    /* A file that tools load or run on the host when the user works in the directory (.envrc,
     * Makefile, .vscode/tasks.json, package.json...): applied with the rest, worth a look. */
    AL_CHANGE_RUNS = 1 << 2,
};
/* Consents for al_workdir_apply beyond the changes themselves. */
enum al_apply_allow {
    AL_APPLY_VCS = 1 << 0,  /* apply AL_CHANGE_VCS changes */
    AL_APPLY_EXEC = 1 << 1, /* keep the exec bits of AL_CHANGE_EXEC files */
};

typedef struct al_change {
    size_t struct_size;  /* sizeof: AL_CHANGE_INIT (see "Structs" above) */
    int kind;            /* enum al_change_kind */
    int type;            /* enum al_entry_type: the guest's, the host's for a deletion */
    const char *path;    /* relative to the directory, bytes the guest chose: print it through
                            al_path_escape */
    uint64_t old_size;   /* on the host, 0 when added */
    uint64_t new_size;   /* in the guest, 0 when deleted */
    const char *refused; /* why this change is never applied (a symlink the guest made...) */
    int result;          /* after al_workdir_apply: 0 applied or refused, else a negative errno */
    unsigned flags;      /* enum al_change_flag */
    bool held;           /* after al_workdir_apply: left alone, its consent was not given */
} al_change;
#define AL_CHANGE_INIT AL_SIZED_INIT(al_change)

typedef struct al_workdir_push_result {
    size_t struct_size; /* sizeof: AL_WORKDIR_PUSH_RESULT_INIT (see "Structs" above) */
    size_t files, dirs, symlinks;
    uint64_t bytes;
    char **skipped; /* "PATH: why" for each entry left out (outward symlinks, special files) */
    size_t nskipped;
} al_workdir_push_result;
#define AL_WORKDIR_PUSH_RESULT_INIT AL_SIZED_INIT(al_workdir_push_result)

/* Copies the host directory dir into the guest's directory (regular files, directories, and
 * symlinks that stay inside dir; nothing is followed). Fails before sending anything when dir
 * holds more than the limit. */
int al_workdir_push(al_session *s, const char *dir, const al_workdir_opts *o,
                    al_workdir_push_result *out, al_error *err);
void al_workdir_push_result_free(al_workdir_push_result *r);

/* What changed in the guest's directory compared with dir (NULL: with nothing, listing what is
 * there). The guest's tree is read as hostile: bounded, relative paths only. */
typedef struct al_workdir_diff al_workdir_diff;
int al_workdir_diff_new(al_session *s, const char *dir, const al_workdir_opts *o,
                        al_workdir_diff **out, al_error *err);
size_t al_workdir_diff_count(const al_workdir_diff *d);
const al_change *al_workdir_diff_at(const al_workdir_diff *d, size_t i);
/* Writes the changes into dir, never outside it nor through a symlink, each file replaced
 * atomically; refused changes are left alone, and so are AL_CHANGE_VCS ones unless allow has
 * AL_APPLY_VCS (they are marked held); AL_CHANGE_EXEC files lose their exec bits unless allow
 * has AL_APPLY_EXEC. Works after the session is closed. Returns how many changes were applied;
 * each change's result says how it went. */
int al_workdir_apply(al_workdir_diff *d, unsigned allow, al_error *err);
/* Keeps what the guest sent (its whole directory, as the tar stream it sent) in a new private
 * file under the state directory's kept/ (mode 0600), for changes nobody could be asked about;
 * its path into path. The file is the guest's: list it (tar -tvf) before extracting anything.
 * Works after the session is closed. */
int al_workdir_diff_keep(al_workdir_diff *d, char *path, size_t len, al_error *err);
void al_workdir_diff_free(al_workdir_diff *d);

/* ---- sessions other airlock processes hold (airlock cp, airlock ps) ---- */

/* Serves this session to other processes of the same user over a unix socket (mode 0600) in
 * the session's runtime dir, from a thread, until the session closes. Their requests run beside
 * this process's own, each a request of its own on the channel. */
int al_session_serve_control(al_session *s, al_error *err);

typedef struct al_session_info {
    size_t struct_size; /* sizeof: AL_SESSION_INFO_INIT (see "Structs" above) */
    char name[64];
    char image[64];
    int64_t started; /* unix time */
    long pid;        /* of the process holding it */
} al_session_info;
#define AL_SESSION_INFO_INIT AL_SIZED_INIT(al_session_info)
/* Calls fn for every live session of this user that serves control requests. Returns how
 * many. */
int al_session_list(void (*fn)(void *ctx, const al_session_info *info), void *ctx, al_error *err);

/* A session another process holds, by name (NULL: the only one running). */
int al_attach_open(const char *name, al_attach **out, al_error *err);
void al_attach_close(al_attach *r);
const char *al_attach_name(const al_attach *r);
/* al_image_commit of the session r names, by the process that holds it (into that process's
 * image store). */
int al_attach_commit(al_attach *r, const al_image_commit_opts *o, al_error *err);
/* Like al_exec; the fds are passed to the serving process. */
int al_attach_exec(al_attach *r, const al_exec_opts *o, al_exec_result *out, al_error *err);
/* al_port_relay for the session r names: fd, a connected socket, relayed by the process that
 * holds the session (at most 16 requests of other processes at once per session); a byte on
 * cancel_fd (> 0) ends it (-ECANCELED), and the holder's relay with it. */
int al_attach_port(al_attach *r, unsigned port, int fd, int cancel_fd, al_port_counts *counts,
                   al_error *err);
/* Copies a host file or directory to guest_path (into it when it is a directory). */
int al_attach_put(al_attach *r, const char *host_path, const char *guest_path, al_error *err);
/* Copies a guest file or directory to host_path (into it when it is a directory; a directory
 * is never merged into an existing one). Files come without exec bits. Returns how many
 * entries were left out (symlinks, special files, anything under .git/ or .hg/). */
int al_attach_get(al_attach *r, const char *guest_path, const char *host_path, al_error *err);

/* ---- checkpoints: undo what runs did to the VM (checkpoint.c; when to take them:
 * airlock/policy.h) ---- */

/* A checkpoint is the whole VM (memory, devices, disk) saved inside the running QEMU as an
 * internal qcow2 snapshot of the session's disk (QEMU's savevm/loadvm). Needs a session opened
 * with opts.checkpoints. Checkpoints live in the session's runtime dir and go with the session.
 * Take them between runs: a checkpoint needs the agent idle, so while other threads' requests
 * are in flight (a background process) it waits a second for them and then fails with -EBUSY.
 * A rollback ends the requests in flight (they fail with -ECANCELED: the VM leaves the future
 * they ran in). Requests (al_exec, al_file_*) run at once, each on its own (at most
 * AL_LINK_REQUESTS_MAX, 64). */

/* Checkpoints kept at once; creating one more deletes the oldest unnamed one. Each holds the
 * guest's used memory (tens to hundreds of MiB) on the host's disk. */
#define AL_CHECKPOINTS_MAX 32
/* Checkpoint names: printable, no spaces, not all digits (so "3" always means id 3). */
#define AL_CHECKPOINT_NAME_MAX 63

typedef struct al_checkpoint_info {
    size_t struct_size; /* sizeof: AL_CHECKPOINT_INFO_INIT (see "Structs" above) */
    uint32_t id;        /* 1, 2, ... in creation order, never reused in a session */
    char name[AL_CHECKPOINT_NAME_MAX + 1]; /* "" when unnamed */
    int64_t created;                       /* unix time */
    uint64_t state_bytes; /* the memory and device state it holds (QEMU's vm-state-size) */
    uint64_t disk_bytes;  /* growth of the session disk file since the checkpoint before: the
                             blocks the guest changed in between plus this one's state, less
                             space that deleted checkpoints freed and this one reused */
    unsigned save_ms;     /* how long the guest was paused to take it */
    bool current;         /* the VM's state descends from it: the last one taken or restored */
} al_checkpoint_info;
#define AL_CHECKPOINT_INFO_INIT AL_SIZED_INIT(al_checkpoint_info)

/* Takes a checkpoint; name may be NULL. Returns its id (> 0) and fills *out when out is set.
 * -EEXIST for a name in use, -EINVAL for a bad name, -ENOTSUP without opts.checkpoints. */
int al_checkpoint_create(al_session *s, const char *name, al_checkpoint_info *out, al_error *err);
/* Calls fn for each checkpoint, oldest first. Returns how many. */
int al_checkpoint_list(al_session *s, void (*fn)(void *ctx, const al_checkpoint_info *c), void *ctx,
                       al_error *err);
/* Finds a checkpoint by id ("3") or name. -ENOENT when there is none. */
int al_checkpoint_find(al_session *s, const char *id_or_name, al_checkpoint_info *out,
                       al_error *err);
/* Puts memory, devices and disk back as they were at checkpoint id, processes and language
 * kernels included, then handshakes with the (restored) agent again. Works whether the VM is
 * running, hung or gone (QEMU exited after a guest power-off or panic: it is started again from
 * the same description and the checkpoint loaded into it). Later checkpoints are kept, so one
 * can roll forward again; delete them if they are not wanted. Requests that were open are
 * void. */
int al_checkpoint_rollback(al_session *s, uint32_t id, al_error *err);
/* Frees a checkpoint's space. -ESRCH while QEMU is gone (after a crash: recover first). */
int al_checkpoint_delete(al_session *s, uint32_t id, al_error *err);
/* After a run failed because the agent stopped answering (the channel closed, stalled or
 * carried garbage): when the VM is gone, or its agent does not answer a fresh handshake
 * within a few seconds, rolls back to the current checkpoint and returns 1 with *restored_id
 * set; when the agent answers, only resynchronizes the channel and returns 0 (nothing undone).
 * -ENOENT when a rollback is needed but there is no checkpoint. */
int al_checkpoint_recover(al_session *s, uint32_t *restored_id, al_error *err);

struct al_image_commit_opts {
    size_t struct_size;  /* sizeof: AL_IMAGE_COMMIT_OPTS_INIT (see "Structs" above) */
    const char *name;    /* the new image's name in the store */
    uint32_t checkpoint; /* 0: the disk as it is now; else that checkpoint's disk */
    bool force;          /* replace an image of that name */
};
#define AL_IMAGE_COMMIT_OPTS_INIT AL_SIZED_INIT(al_image_commit_opts)
/* Saves the session's root disk as a new image of the store, flattened (no link to the image
 * it came from), with the session's own secrets removed: SSH host keys and authorized keys,
 * the machine-id, the random seed. The disk as it is now is taken after a sync in the guest
 * with the VM paused for the copy (a guest that does not sync only loses its own unwritten
 * data). The new image has the old one's kernel, initrd and defaults. Local sessions with a root
 * disk only. */
int al_image_commit(al_session *s, const al_image_commit_opts *opts, al_error *err);

/* ---- housekeeping ---- */

/* Destroys the domains and removes the files that crashed airlock runs left behind, found by
 * airlock's own marker; never touches a live session. Returns how many were reaped. */
int al_gc(const char *connect_uri, al_error *err);

/* Doctor-style probes. */
int al_libvirt_uri(const char *requested, char *buf, size_t len, al_error *err);
bool al_kvm_usable(void);
/* libairlock runs libvirt's default event loop in a thread of its own, registered before its
 * first connection (the libvirt-stream channel and keepalive need it). A program that opens
 * libvirt connections of its own in the same process calls this before its first one; calling
 * it again does nothing. */
void al_libvirt_events(void);
enum al_kvm_state {
    AL_KVM_OK = 0,       /* a guest ran with KVM on this boot (and this kernel and QEMU) */
    AL_KVM_ABSENT = 1,   /* /dev/kvm missing or not openable */
    AL_KVM_FAILED = 2,   /* /dev/kvm opens but a guest could not run with it on this boot:
                            QEMU refused it, or the guest never executed (al_kvm_evidence) */
    AL_KVM_OFF = 3,      /* AIRLOCK_ACCEL=tcg */
    AL_KVM_UNPROVEN = 4, /* /dev/kvm opens; no guest has run with it on this boot yet. The
                            next session tries it and falls back to emulation if the guest
                            does not run */
};
enum al_kvm_state al_kvm_state(void);
/* For AL_KVM_FAILED: what showed that KVM cannot run a guest (one line). -ENOENT otherwise. */
int al_kvm_evidence(char *buf, size_t len);

/* ---- warm starts (orchestrator/session/template.c, pool.c) ----
 *
 * A template is a saved, already booted guest of an image (for one memory size, vCPU count,
 * transport and accelerator), with the agent answering and the python kernel started with numpy,
 * pandas and matplotlib imported. A session restored from it runs in a fraction of a boot, on
 * its own copy-on-write disk over the template's frozen one; right after the restore the guest
 * gets fresh host entropy (kernel RNG reseeded), the host's clock, a hostname and machine-id of
 * its own, and the python kernel reseeds random and numpy; other kernels start after the restore.
 * Templates live in the state dir (templates/), 0600, owned by QEMU's user (their manifest by
 * us), and are keyed by the image's files, the agent, QEMU's and libvirt's versions, the
 * accelerator, memory, vCPUs and transport: a template that is stale, changed behind our back or
 * fails to restore is never a failure, the session boots cold with one notice. SSH sessions,
 * images without a kernel and sessions with a benchmark port always boot cold. */
enum al_warm {
    AL_WARM_DEFAULT = 0, /* $AIRLOCK_WARM (off, use or auto), else AL_WARM_USE */
    AL_WARM_OFF = 1,     /* always boot cold */
    AL_WARM_USE = 2,     /* restore the template when a valid one exists, else boot cold */
    AL_WARM_AUTO = 3,    /* as USE, building the template first when there is none (or a stale
                            one): the first session pays a boot plus the imports */
};

/* Builds (or rebuilds) the template for what opts would open (image, memory_mib, vcpus,
 * connect_uri, the accelerator in use; warm is ignored): boots a cold session, warms the python
 * kernel, saves it and replaces any older template of that image and shape. */
int al_template_build(const al_session_opts *opts, al_error *err);

typedef struct al_template_info {
    size_t struct_size; /* sizeof: AL_TEMPLATE_INFO_INIT (see "Structs" above) */
    char image[64];
    char path[AL_PATH_MAX]; /* its directory */
    unsigned memory_mib;    /* the shape it was built for */
    unsigned vcpus;
    bool kvm;
    bool python;       /* the python kernel is warm in it */
    long long created; /* unix time */
    uint64_t bytes;    /* disk space its files occupy */
    const char *why;   /* NULL: usable; else why it would be refused (stale, changed...) */
} al_template_info;
#define AL_TEMPLATE_INFO_INIT AL_SIZED_INIT(al_template_info)
/* Calls fn for every template in the state dir, in name order. */
int al_template_list(void (*fn)(void *ctx, const al_template_info *t), void *ctx, al_error *err);
/* An image uploaded to a remote host (sessions there boot from its volumes). */
typedef struct al_host_image {
    size_t struct_size;  /* sizeof: AL_HOST_IMAGE_INIT (see "Structs" above) */
    const char *image;   /* its name */
    const char *version; /* 16 hex digits: its manifest and files' sizes and times */
    bool current;        /* the version of the image of that name in this machine's store */
    uint64_t bytes;      /* the space its volumes take there */
} al_host_image;
#define AL_HOST_IMAGE_INIT AL_SIZED_INIT(al_host_image)
/* Calls fn for every image uploaded complete to the host at uri (its storage pool "airlock"). */
int al_host_images(const char *uri, void (*fn)(void *ctx, const al_host_image *hi), void *ctx,
                   al_error *err);
/* Whether the session was restored from a template (else it booted cold). */
bool al_session_restored(const al_session *s);

/* A pool of ready sessions for long-lived callers (a server): it keeps `size` sessions restored
 * from opts' template ready, refilled by a background thread, and hands each out once. opts is
 * copied (its strings too); its warm field is taken as AL_WARM_AUTO (the template is built on
 * first use), and on_notice is called from the pool's thread. */
typedef struct al_pool al_pool;
#define AL_POOL_SIZE_MAX 64
int al_pool_create(const al_session_opts *opts, unsigned size, al_pool **out, al_error *err);
/* Hands out a ready session (waiting for one while the pool refills, up to the session's boot
 * timeout); the caller owns it and closes it with al_session_close: it never returns to the
 * pool. Thread-safe. */
int al_pool_take(al_pool *p, al_session **out, al_error *err);
/* As al_pool_take without waiting: -EAGAIN when none is ready now (the caller boots instead),
 * -ESHUTDOWN while the pool is being destroyed. Thread-safe. */
int al_pool_try_take(al_pool *p, al_session **out);
/* Sessions ready now (0 to size). Thread-safe. */
unsigned al_pool_ready(al_pool *p);
/* Gives a session (a pooled one: opened without one) the caller's signal pipe, as
 * al_session_opts.cancel_fd would have; -1: none. Not while a request of it is running. */
void al_session_set_cancel_fd(al_session *s, int fd);
/* Closes the sessions not handed out (their domains and files go) and stops the refill thread;
 * sessions handed out are the callers'. Safe on NULL. */
void al_pool_destroy(al_pool *p);

/* Forks (LIBAIRLOCK_1.4): a running session's whole state (memory, devices, disk: its kernels'
 * variables, background processes and open ports with it) saved once and opened as new
 * sessions. The source is paused for the save only (al_fork_timing) and goes on. Each fork is
 * restored as a warm start is: its RAM the save's file mapped privately (pages shared between
 * forks until written), its disk an overlay of the source's as it was, made unique (entropy,
 * clock, hostname, machine-id; the python kernel's generators reseeded). Local sessions over
 * virtio-serial only; not sessions with network on request, a benchmark port, or paused. */
typedef struct al_fork al_fork;
int al_session_fork_save(al_session *s, al_fork **out, al_error *err);
/* A new session from the save: opts as for al_session_open, but the image, memory, vCPUs and
 * display are the source's (an image named must be it); not kept, no network, this host. */
int al_fork_open(const al_fork *f, const al_session_opts *opts, al_session **out, al_error *err);
/* How long the source stood still, and the whole save took. */
void al_fork_timing(const al_fork *f, unsigned *pause_ms, unsigned *save_ms);
/* Frees the handle; the save's files stay while a fork opened from it lives. Safe on NULL. */
void al_fork_free(al_fork *f);

/* Snapshots (LIBAIRLOCK_1.4): a fork's save kept under a name in the state dir and sealed as a
 * template is (each file's owner, mode, size, inode, mtime; the SHA-256 of all but the RAM
 * file, whose ctime stands for it): sessions open from it any time later, the source gone or
 * not, as forks of it. A snapshot whose files changed, whose image changed, or that another
 * QEMU or libvirt made is refused with the reason. NAME: 1 to AL_SNAPSHOT_NAME_MAX of
 * [A-Za-z0-9._-], not starting with a dot (callers that keep snapshots of several owners
 * prefix theirs). */
#define AL_SNAPSHOT_NAME_MAX 127
typedef struct al_snapshot_info {
    size_t struct_size;
    char name[AL_SNAPSHOT_NAME_MAX + 1];
    char image[64];
    unsigned memory_mib;
    uint64_t bytes;  /* its files' blocks on disk (layers it shares with others included) */
    int64_t created; /* unix time */
    char source[64]; /* the session it was saved from (al_session_name) */
} al_snapshot_info;
#define AL_SNAPSHOT_INFO_INIT AL_SIZED_INIT(al_snapshot_info)
/* Saves s as snapshot name (-EEXIST when there is one, unless replace). out: may be NULL. */
int al_snapshot_save(al_session *s, const char *name, bool replace, al_snapshot_info *out,
                     al_error *err);
/* A new session from the snapshot (opts as al_fork_open's). -ENOENT: none of that name;
 * -EBADMSG or -ESTALE: refused, err says why. */
int al_snapshot_open(const char *name, const al_session_opts *opts, al_session **out,
                     al_error *err);
/* The snapshots whose names start with prefix (NULL: all), each to fn; how many. */
int al_snapshot_list(const char *prefix, void (*fn)(void *ctx, const al_snapshot_info *s),
                     void *ctx, al_error *err);
/* Removes it now, or once no session started from it is left. */
int al_snapshot_remove(const char *name, al_error *err);
/* Whether name is a snapshot's name (as above). */
bool al_snapshot_name_ok(const char *name);

/* Volumes (LIBAIRLOCK_1.4): named disks of the state dir (volumes/NAME.img: raw, sparse,
 * QEMU's, 0600) that outlive sessions, pauses and restarts; a session attaches them
 * (al_session_opts.volumes) and its guest mounts each at the path asked for, making an ext4 on
 * it at its first read-write use. The host never mounts or reads what the guest wrote. NAME as
 * a snapshot's, at most AL_VOL_NAME_MAX. */
#define AL_VOL_NAME_MAX 127
#define AL_VOLS_MAX 8
typedef struct al_vol_info {
    size_t struct_size;
    char name[AL_VOL_NAME_MAX + 1];
    uint64_t size;   /* its size: the most the guest can write */
    uint64_t bytes;  /* what it takes on the host's disk now */
    int64_t created; /* unix time */
    bool in_use;     /* attached to a session */
    bool writer;     /* attached read-write */
} al_vol_info;
#define AL_VOL_INFO_INIT AL_SIZED_INIT(al_vol_info)
/* A new volume of size bytes (1 MiB to 16 TiB, rounded up to MiB); -EEXIST when there is one. */
int al_vol_create(const char *name, uint64_t size, al_error *err);
/* The volumes whose names start with prefix (NULL: all), each to fn; how many. */
int al_vol_list(const char *prefix, void (*fn)(void *ctx, const al_vol_info *v), void *ctx,
                al_error *err);
/* Removes one: -EBUSY while a session has it attached, -ENOENT for none of that name. */
int al_vol_remove(const char *name, al_error *err);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif

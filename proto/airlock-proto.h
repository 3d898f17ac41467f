/* Airlock wire protocol: the frames the host orchestrator and the guest agent exchange.
 *
 * Shared by both sides; no allocation, no libc beyond memcpy/memset, so it links into the
 * static guest agent. Every decode is bounded by the frame's declared length, which is itself
 * bounded by AL_FRAME_PAYLOAD_MAX. See docs/PROTOCOL.md for the format. */
#ifndef AIRLOCK_PROTO_H
#define AIRLOCK_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define AL_PROTO_VERSION 5

/* 'A' 'L' type flags id:u32 len:u32, little-endian. */
#define AL_FRAME_HEADER_SIZE 12
#define AL_FRAME_MAGIC0 'A'
#define AL_FRAME_MAGIC1 'L'

/* Hard ceiling on one frame's payload: big enough for an exec carrying a sizeable code string,
 * small enough that a hostile peer cannot make the other side allocate much. */
#define AL_FRAME_PAYLOAD_MAX (256 * 1024)
/* Largest DATA chunk a sender emits; a multiple of the page size keeps pipe reads efficient. */
#define AL_DATA_CHUNK_MAX (64 * 1024)
/* Limits on lists and strings inside a payload; each names a resource the receiver allocates. */
#define AL_ARGV_MAX 256 /* argv entries of one exec */
#define AL_ENV_MAX 128  /* extra environment entries of one exec */
#define AL_LANGS_MAX 16 /* languages announced in the handshake */
#define AL_ADOPT_MAX 64 /* requests a HELLO_ACK hands to a host that adopts them */
/* HELLO's flags: the host takes over the runs the agent kept while no host was connected (a
 * daemon that restarted); without it every request still open is ended, as always. */
#define AL_HELLO_ADOPT 1u
#define AL_GUEST_PATH_MAX 4096 /* a guest path the protocol carries, in bytes without its NUL */
#define AL_MESSAGE_MAX 512     /* an error message: one phrase, not a log */
#define AL_SHORT_STR_MAX 64    /* agent version, language names */
#define AL_REFRESH_SEED 64     /* bytes of host entropy in a REFRESH */
#define AL_MACHINE_ID 16       /* bytes of a machine-id (32 hex digits in /etc/machine-id) */
#define AL_HOSTNAME_MAX 63     /* a REFRESH's hostname: one DNS label */
/* Network on request: the host writes a key of its own to this guest file (a FILE_PUT, over the
 * agent's channel) before it opens any tunnel, and sends the key first on each tunnel; the
 * guest's forwarder pairs a program only with a tunnel that sent it (docs/PROTOCOL.md). */
#define AL_EGRESS_KEY_PATH "/run/airlock-egress.key"
#define AL_EGRESS_KEY_LEN 32
/* Default flow-control window per stream: the receiver buffers at most this much unconsumed. */
#define AL_WINDOW_DEFAULT (1024 * 1024)
#define AL_WINDOW_MIN AL_DATA_CHUNK_MAX
#define AL_WINDOW_MAX (16 * 1024 * 1024)
/* Results of a kernel run (stream AL_STREAM_RESULT): records of a u32 length and that many bytes
 * of JSON. The host holds one record at a time: a bigger one is skipped and reported, so a
 * hostile guest cannot make it allocate more; 16 MiB takes a 12 MiB PNG as base64. */
#define AL_RESULT_RECORD_MAX (16 * 1024 * 1024)
/* Records per run beyond which the host drops the rest (a loop of display() calls). */
#define AL_RESULTS_PER_RUN_MAX 1000
/* Longest EXEC.input_wait_ms: a program quiet on its stdin for longer than an hour is hung, which
 * is timeout_ms's business; a bound also keeps the field a duration rather than a sentinel. */
#define AL_INPUT_WAIT_MAX_MS (3600 * 1000)
/* A terminal's rows and columns (EXEC with AL_EXEC_PTY, RESIZE): 1 to this each. More than any
 * screen shows; a bound keeps the guest's line discipline from sizing buffers by the host. */
#define AL_PTY_DIM_MAX 1000

enum al_type {
    AL_HELLO = 1,      /* host -> guest: version, nonce, window */
    AL_HELLO_ACK = 2,  /* guest -> host: version, nonce, window, caps, agent version, languages */
    AL_EXEC = 3,       /* host -> guest: start a process */
    AL_STARTED = 4,    /* guest -> host: process started, pid */
    AL_DATA = 5,       /* both: a chunk of one stream; flag EOF ends it */
    AL_CREDIT = 6,     /* both: the receiver consumed n bytes of a stream */
    AL_SIGNAL = 7,     /* host -> guest: deliver a signal to a request's process group */
    AL_EXIT = 8,       /* guest -> host: process finished */
    AL_ERROR = 9,      /* both: request failed, class + errno + one phrase */
    AL_FILE_PUT = 10,  /* host -> guest: write a file, data follows as DATA stream FILE */
    AL_FILE_GET = 11,  /* host -> guest: read a file */
    AL_FILE_INFO = 12, /* guest -> host: mode and size of a file being sent */
    AL_OK = 13,        /* guest -> host: request done, a value (bytes written...) */
    AL_PING = 14,      /* host -> guest: cookie */
    AL_PONG = 15,      /* guest -> host: same cookie */
    AL_SHUTDOWN = 16,  /* host -> guest: power off (or reboot) */
    AL_WAITING = 17,   /* guest -> host: the run has been blocked reading its stdin a while */
    AL_REFRESH = 18,   /* host -> guest: make a guest restored from a template its own */
    AL_RESIZE = 19,    /* host -> guest: a PTY run's terminal has a new size */
    AL_CONNECT = 20,   /* host -> guest: a tunnel to 127.0.0.1:port in the guest */
    AL_TYPE_MAX_ = 20,
};

enum al_flag {
    AL_FLAG_EOF = 1 << 0, /* DATA: last chunk of this stream */
};
#define AL_FLAGS_KNOWN AL_FLAG_EOF

enum al_stream {
    AL_STREAM_STDIN = 0,
    AL_STREAM_STDOUT = 1,
    AL_STREAM_STDERR = 2,
    AL_STREAM_FILE = 3,
    AL_STREAM_RESULT = 4, /* a kernel run's results: records, see docs/PROTOCOL.md */
    AL_STREAM_COUNT = 5,
};

enum al_caps {
    AL_CAP_EXEC = 1 << 0,
    AL_CAP_FILES = 1 << 1,
    AL_CAP_SIGNAL = 1 << 2,
    AL_CAP_SHUTDOWN = 1 << 3,
    AL_CAP_CGROUP = 1 << 4,  /* execs run in their own cgroup (pids, kill-all) */
    AL_CAP_REFRESH = 1 << 5, /* takes REFRESH */
    AL_CAP_CONNECT = 1 << 6, /* takes CONNECT */
};

enum al_exec_flags {
    AL_EXEC_STDIN = 1 << 0,     /* host will send stdin; otherwise the process gets /dev/null */
    AL_EXEC_KERNEL = 1 << 1,    /* argv[0] is a code block for lang's long-lived kernel */
    AL_EXEC_KERNEL_OP = 1 << 2, /* with AL_EXEC_KERNEL: argv[0] is "stop" or "list", see
                                   docs/PROTOCOL.md, "Contexts" */
    AL_EXEC_PTY = 1 << 3,       /* a process (not a kernel run) on a pseudo-terminal of
                                   EXEC.rows x EXEC.cols: its controlling terminal, stdin, stdout
                                   and stderr; its output is the STDOUT stream */
};
#define AL_EXEC_FLAGS_KNOWN (AL_EXEC_STDIN | AL_EXEC_KERNEL | AL_EXEC_KERNEL_OP | AL_EXEC_PTY)
/* A kernel context's name in EXEC.lang ("python@NAME"): letters, digits, '_', '-', '.'. */
#define AL_CONTEXT_MAX 32

enum al_exit_how {
    AL_EXIT_CODE = 0,   /* value is the exit status 0..255 */
    AL_EXIT_SIGNAL = 1, /* value is the signal number that ended it */
};

enum al_exit_flags {
    AL_EXIT_TRUNC_STDOUT = 1 << 0,
    AL_EXIT_TRUNC_STDERR = 1 << 1,
    AL_EXIT_TIMED_OUT = 1 << 2,
};

enum al_error_class {
    AL_ERR_PROTOCOL = 1,    /* malformed or unexpected frame */
    AL_ERR_NOT_FOUND = 2,   /* command, file or request id not found */
    AL_ERR_PERMISSION = 3,  /* not allowed (EACCES/EPERM) */
    AL_ERR_INVALID = 4,     /* bad argument: path escapes, bad signal... */
    AL_ERR_LIMIT = 5,       /* a limit was hit: too many requests, file too big */
    AL_ERR_IO = 6,          /* read/write failed */
    AL_ERR_INTERNAL = 7,    /* the agent itself failed */
    AL_ERR_UNSUPPORTED = 8, /* unknown language, capability missing */
    AL_ERR_CLASS_MAX_ = 8,
};

enum al_shutdown_how {
    AL_SHUTDOWN_POWEROFF = 0,
    AL_SHUTDOWN_REBOOT = 1,
};

/* A string inside a received payload: not NUL-terminated, points into the frame buffer. */
struct al_str {
    const char *p;
    uint32_t len;
};

struct al_header {
    uint8_t type;
    uint8_t flags;
    uint32_t id;  /* request id; 0 for connection-level frames */
    uint32_t len; /* payload bytes following the header */
};

struct al_msg {
    uint8_t type;
    uint8_t flags;
    uint32_t id;
    union {
        struct {
            uint32_t version;
            uint64_t nonce;  /* echoed by HELLO_ACK so both sides agree where the stream is */
            uint32_t window; /* the sender's receive window per stream */
            uint32_t flags;  /* AL_HELLO_ADOPT; optional on the wire (absent: 0) */
        } hello;
        struct {
            uint32_t version;
            uint64_t nonce;
            uint32_t window;
            uint32_t caps;
            struct al_str agent_version;
            uint32_t nlangs;
            struct al_str langs[AL_LANGS_MAX];
            uint32_t nadopted;              /* optional on the wire (absent: 0) */
            uint32_t adopted[AL_ADOPT_MAX]; /* requests kept across the host's absence */
        } hello_ack;
        struct {
            uint32_t flags;         /* enum al_exec_flags */
            uint32_t timeout_ms;    /* 0: none */
            uint32_t input_wait_ms; /* send WAITING after this long blocked on stdin; 0: never */
            uint64_t output_cap;    /* per stream; 0: none */
            uint16_t rows, cols;    /* AL_EXEC_PTY: 1..AL_PTY_DIM_MAX; else 0 */
            struct al_str lang;     /* empty: argv[0] is a program; else argv[0] is code */
            struct al_str cwd;      /* empty: / */
            uint32_t argc;
            struct al_str argv[AL_ARGV_MAX];
            uint32_t envc;
            struct al_str env[AL_ENV_MAX]; /* KEY=VALUE, added to the agent's environment */
        } exec;
        struct {
            uint32_t pid;
        } started;
        struct {
            uint8_t stream;
            const uint8_t *data;
            uint32_t len;
        } data;
        struct {
            uint8_t stream;
            uint32_t bytes;
        } credit;
        struct {
            uint32_t signo;
        } signal;
        struct {
            uint8_t how; /* enum al_exit_how */
            int32_t value;
            uint64_t duration_us;
            uint32_t flags; /* enum al_exit_flags */
        } exit;
        struct {
            uint16_t klass; /* enum al_error_class */
            uint32_t err;   /* errno in the sender, 0 if none */
            struct al_str message;
        } error;
        struct {
            uint32_t mode; /* permission bits only (07777) */
            uint64_t size; /* exact byte count that follows */
            struct al_str path;
        } file_put;
        struct {
            struct al_str path;
        } file_get;
        struct {
            uint32_t mode;
            uint64_t size;
        } file_info;
        struct {
            uint64_t value;
        } ok;
        struct {
            uint64_t cookie;
        } ping; /* PING and PONG */
        struct {
            uint32_t how;
        } shutdown;
        struct {
            uint32_t waited_ms; /* how long the run has been blocked on its stdin */
        } waiting;
        struct {
            uint16_t rows, cols; /* 1..AL_PTY_DIM_MAX */
        } resize;
        struct {
            uint16_t port; /* 1..65535, on 127.0.0.1 in the guest */
        } connect;
        struct {
            const uint8_t *seed;       /* AL_REFRESH_SEED bytes, into the kernel's RNG */
            uint64_t sec;              /* the host's wall clock */
            uint32_t nsec;             /* < 1e9 */
            const uint8_t *machine_id; /* AL_MACHINE_ID bytes */
            struct al_str hostname;    /* 1..AL_HOSTNAME_MAX of [A-Za-z0-9-] */
        } refresh;
    } u;
};

/* Decoding errors, as negative errno values with a static reason. */
/* -EBADMSG: bad magic (garbage on the channel); -EMSGSIZE: declared length over the maximum;
 * -EPROTO: malformed header or payload; -EPROTONOSUPPORT: unknown frame type. */
int al_header_decode(const uint8_t *buf, size_t len, struct al_header *out, const char **why);
int al_msg_decode(const struct al_header *h, const uint8_t *payload, struct al_msg *out,
                  const char **why);

/* Encodes m into out (header + payload). Returns the total size, or -EMSGSIZE when it does not
 * fit in cap or exceeds AL_FRAME_PAYLOAD_MAX, or -EINVAL for an invalid message. */
int al_msg_encode(const struct al_msg *m, uint8_t *out, size_t cap);

/* Writes just a DATA header for a chunk of len bytes the caller places right after it; lets
 * senders read straight into the frame buffer. */
void al_data_header(uint8_t out[AL_FRAME_HEADER_SIZE + 1], uint32_t id, uint8_t stream,
                    uint8_t flags, uint32_t len);

/* Incremental stream decoder: feed bytes, take whole frames out. No allocation; the caller
 * owns the buffer (at least AL_FRAME_HEADER_SIZE + AL_FRAME_PAYLOAD_MAX bytes). */
struct al_decoder {
    uint8_t *buf;
    size_t cap;
    size_t len;  /* bytes held */
    size_t used; /* bytes of the frame handed out by the last al_decoder_next */
};

void al_decoder_init(struct al_decoder *d, uint8_t *buf, size_t cap);
/* Space to read into and the commit after reading. */
uint8_t *al_decoder_space(struct al_decoder *d, size_t *avail);
void al_decoder_commit(struct al_decoder *d, size_t n);
/* 1: *out holds a frame (valid until the next call); 0: need more bytes; <0: error (see above). */
int al_decoder_next(struct al_decoder *d, struct al_msg *out, const char **why);
/* True when a frame has started but is not complete: a stall here means a stalled peer. */
bool al_decoder_partial(const struct al_decoder *d);

const char *al_type_name(uint8_t type);
const char *al_error_class_name(uint16_t klass);
bool al_str_eq(struct al_str s, const char *lit);
struct al_str al_str_cstr(const char *s);

#endif

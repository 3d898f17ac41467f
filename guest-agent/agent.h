/* airlock-agent: the static guest agent. Serves Airlock frames on one channel (virtio-serial
 * port, stdio or a unix socket), runs processes, moves files. Single-threaded poll loop. */
#ifndef AIRLOCK_AGENT_H
#define AIRLOCK_AGENT_H

#include "airlock-proto.h"
#include "cleanup.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

/* Concurrent requests (execs and file transfers): each holds up to 4 fds and a cgroup. */
#define AGENT_REQ_MAX 64
/* Stop reading pipes and host frames while this much output waits for the channel: keeps the
 * queue bounded when the host reads slowly, large enough for several 32 KiB port writes. */
#define AGENT_OUTQ_HIGH (256 * 1024)
/* Queue capacity: the high-water mark, one full DATA frame read while just below it, and room
 * for the small control frames (EXIT, ERROR...) produced while above it. */
#define AGENT_OUTQ_CAP (AGENT_OUTQ_HIGH + AL_FRAME_HEADER_SIZE + 1 + AL_DATA_CHUNK_MAX + 64 * 1024)
/* Per-exec cap on processes, so a fork bomb exhausts its cgroup and not the guest. */
#define AGENT_PIDS_MAX 1024
/* After the main process exits and its group is killed, wait this long for the pipes to reach
 * EOF before closing them: a process that escaped the group must not hold the request open. */
#define AGENT_DRAIN_GRACE_MS 250
/* Wait for the virtio port to appear (module probe, host handshake): TCG boots are slow. */
#define AGENT_PORT_WAIT_MS 30000
/* Re-check for a host on the virtio port this often, in case SIGIO is missed. */
#define AGENT_HOST_POLL_MS 10
/* Pipe buffer for stdout/stderr: fewer wake-ups per MB streamed than the 64 KiB default. */
#define AGENT_PIPE_SIZE (256 * 1024)
/* How long SHUTDOWN waits for its OK to leave before powering off. */
#define AGENT_SHUTDOWN_FLUSH_MS 1000
/* A quiet run with an input wait is checked for a blocked stdin read this often: a few /proc
 * reads per task, cheap even under emulation, and fine enough for waits of a second or more. */
#define AGENT_WAIT_POLL_MS 200
/* Tasks looked at per check: bounds the cost of a run with many processes or threads. */
#define AGENT_WAIT_SCAN_MAX 64
/* Where the language kernels' driver scripts are (--kernels overrides it). */
#define KERNELS_DIR "/usr/lib/airlock/kernels"
/* A kernel run that timed out was sent SIGINT; if the block has not ended this much later, the
 * kernel is killed: long enough for a traceback, short enough to keep timeouts meaningful. */
#define KERNEL_KILL_GRACE_MS 2000
/* A run's timeout counts from when its kernel is ready, not from the kernel's start (seconds
 * under emulation); a kernel not ready this long after the timeout would have ended the run
 * is killed, so that a wedged start cannot outlast the timeout forever. */
#define KERNEL_START_MAX_MS 60000
/* Languages with a kernel (python, shell, javascript). */
#define KERNEL_LANGS 3
/* Kernels at once, all languages and contexts together: each is an interpreter (tens of MiB
 * for python), so a few contexts per language is the use, not hundreds. */
#define KERNEL_MAX 12
/* Output streams of a request: stdout, stderr and a kernel run's results (out[2]). */
#define REQ_OUTS 3

#define CGROUP_ROOT "/sys/fs/cgroup"
#define CGROUP_BASE CGROUP_ROOT "/airlock"
/* A request's or kernel's cgroup directory name under CGROUP_BASE, with its NUL. */
#define AL_CGROUP_NAME_MAX 48

/* Cleanup attributes: proto/cleanup.h (al_closep, al_take_fd, _cleanup_close_). */

enum channel_kind {
    CHANNEL_VIRTIO, /* /dev/vportNpM: always open; host presence comes and goes */
    CHANNEL_STDIO,  /* fd 0 / fd 1: EOF ends the agent */
    CHANNEL_UNIX,   /* listening socket, one connection at a time: the newest */
};

struct channel {
    enum channel_kind kind;
    int in_fd;     /* frames from the host; -1 while no host */
    int out_fd;    /* frames to the host */
    int listen_fd; /* CHANNEL_UNIX only */
    int port_fd;   /* CHANNEL_VIRTIO only: the port, open even while no host */
    int lock_fd;   /* CHANNEL_UNIX only: flock on PATH.lock, held for life */
};

enum req_kind {
    REQ_EXEC,
    REQ_PUT,
    REQ_GET,
};

/* One guest->host stream of a request: stdout, stderr or a file being read. */
struct ostream {
    int fd;           /* pipe or file; -1 once EOF was queued */
    uint8_t stream;   /* enum al_stream */
    uint64_t credit;  /* bytes the host still accepts */
    uint64_t sent;    /* bytes queued so far */
    uint64_t limit;   /* stop sending after this many (output cap, file size); 0: none */
    bool capped;      /* limit reached: further bytes are read and dropped */
    bool borrowed;    /* fd belongs to a kernel: the stream ends without closing it */
    bool paused;      /* not read yet: the kernel is still starting (its noise is not output) */
    uint64_t nread;   /* bytes read from fd, sent or dropped */
    uint64_t stop_at; /* end the stream once nread reaches this; 0: at EOF only */
};

/* Host->guest bytes waiting to be written to a child's stdin. */
struct ibuf {
    uint8_t *p;
    size_t head, len, cap;
};

struct req {
    bool used;
    uint32_t id;
    enum req_kind kind;
    struct ostream out[REQ_OUTS]; /* exec: stdout, stderr, results (a kernel run's; fd -1 for
                                     a process); get: out[0] is the file */
    int in_fd;                    /* exec: stdin pipe; put: temporary file; -1 when closed */
    bool want_stdin;              /* exec: the host sends stdin */
    bool host_killed;             /* the host sent SIGKILL: it takes no more of the output */
    bool tunnel;                  /* a CONNECT: in_fd and out[0] are one socket to 127.0.0.1,
                                     no process (reaped from the start) */
    int pty_fd;                   /* exec on a pty (AL_EXEC_PTY): its master, for RESIZE; out[0]
                                     and in_fd are dups of it; -1: none */
    bool in_eof;                  /* host sent EOF on the input stream */
    uint64_t in_unacked;          /* input bytes received but not yet credited back */
    struct ibuf inq;              /* exec stdin not yet accepted by the pipe */
    /* exec */
    pid_t pid;            /* main process; also the process group id */
    bool reaped;          /* main process waited for */
    int status;           /* its wait status */
    uint64_t start_us;    /* monotonic, before fork */
    uint64_t end_us;      /* monotonic, at reap */
    uint64_t deadline_us; /* timeout; 0: none */
    uint32_t timeout_ms;  /* kernel run: deadline_us set again from it when the kernel is ready */
    uint64_t grace_us;    /* pipes are force-closed after this; 0: not armed */
    uint32_t exit_flags;  /* enum al_exit_flags */
    char cgroup[AL_CGROUP_NAME_MAX]; /* cgroup directory name under CGROUP_BASE; "" when none */
    struct kernel *kernel;           /* the kernel running this code block; NULL for a process */
    uint64_t kill_us;   /* kernel run interrupted at its timeout: kill the kernel then */
    int stdin_hold[2];  /* pipe ends kept so the run's stdin stays open: [0] for a kernel to
                           open, [1] so that a read without host stdin waits; -1: none */
    uint64_t stdin_ino; /* the run's stdin pipe (inode, device), for the input-wait check */
    uint64_t stdin_dev;
    uint32_t input_wait_ms;    /* send WAITING after this long blocked on stdin; 0: never */
    uint64_t wait_next_us;     /* next input-wait check */
    uint64_t blocked_since_us; /* first check that saw a blocked stdin read; 0: none */
    bool active;               /* output or stdin moved since the last check */
    bool waiting_sent;         /* WAITING sent for the current wait */
    /* put */
    int dir_fd;    /* parent directory of the target */
    uint64_t size; /* declared size */
    uint64_t got;  /* bytes written so far */
    uint32_t mode;
    char tmp[40];            /* temporary file name in dir_fd */
    char name[NAME_MAX + 1]; /* target file name in dir_fd */
};

enum kernel_dialect {
    KERNEL_DRIVER, /* a driver script reads framed runs on fd 3, answers "done ID STATUS" */
    KERNEL_BASH,   /* an interactive bash reads command lines on fd 0, answers on fd 3 */
};

struct kernel_lang {
    const char *name;       /* as EXEC.lang, announced as "kernel:NAME" */
    const char *aliases[3]; /* other EXEC.lang names for it */
    enum kernel_dialect dialect;
    const char *script;    /* driver, in the kernels directory */
    const char *interp[2]; /* interpreter names searched in a few bin directories */
    const char *argv[7];   /* "$interp" and "$script" stand for the two paths */
    const char *env[3];    /* added to the kernel's environment */
    /* An interrupt that can land before the block's own handler is set (node: a SIGINT read
     * by the driver just before breakOnSigint's watchdog starts) is sent again each second
     * while the same block runs, a few times. */
    bool sigint_again;
};

/* A long-lived interpreter: one per language, started by its first run; it lasts as long as the
 * connection, or on a unix socket (behind --relay) as long as the agent. */
struct kernel {
    const struct kernel_lang *lang; /* NULL: a free slot */
    char ctx[AL_CONTEXT_MAX + 1];   /* its context, "default" unless EXEC.lang named one */
    pid_t pid;                      /* 0 while not running; also its process group */
    int ctl_fd;                     /* control socket: runs out, "done" lines in */
    int out_fd[REQ_OUTS]; /* read ends of the kernel's stdout, stderr and results pipe (its
                             fd 4), for its whole life */
    char cgroup[AL_CGROUP_NAME_MAX]; /* under CGROUP_BASE; "" when none */
    struct req *run;                 /* the run in progress; NULL when idle */
    bool ready;                      /* said "ready": output from now on is the runs' */
    bool lost;  /* an earlier kernel of this language died: the next run is told */
    bool fresh; /* no run since it started or since the VM was restored from a template (a
                   REFRESH): the next run's cwd becomes the kernel's, as a kernel started for
                   that run would have begun there */
    char *wbuf; /* the current run's request, being written to ctl_fd */
    size_t wlen, woff;
    char line[64]; /* a partial line read from ctl_fd */
    size_t linelen;
    /* A SIGINT held back while the interpreter had no handler for it (it would end the kernel
     * and its state): sent once it has one (kernel_tick), or at this time (µs) all the same;
     * dropped when the run it was for (sigint_held) has ended, never given to the next one. */
    uint64_t sigint_until;
    uint32_t sigint_held;
    /* sigint_again: the run interrupted, when to send it again, and how many more times */
    uint32_t sigint_run;
    uint64_t sigint_next;
    unsigned sigint_left;
};

struct agent {
    struct channel ch;
    bool connected;    /* a host is on the channel */
    bool hello;        /* a HELLO was accepted on this connection */
    bool resyncing;    /* garbage seen: stay quiet about more of it until a good frame */
    uint32_t window;   /* the host's receive window per stream */
    size_t skip;       /* bytes of a rejected frame still to discard */
    bool cgroup;       /* cgroup2 usable for requests */
    bool can_shutdown; /* SHUTDOWN powers the machine off */
    bool can_refresh;  /* REFRESH: the VM's own agent only (never one on a host or over SSH) */
    bool stop;         /* leave the loop (stdio EOF, SIGTERM) */
    bool reap;         /* SIGCHLD seen, or zombies left over from the last batch */
    int sig_fd;        /* signalfd: SIGCHLD, SIGIO, SIGTERM, SIGINT */
    int root_fd;       /* --root, O_PATH */
    int cg_base_fd;    /* CGROUP_BASE, O_PATH, when cgroup */
    int null_fd;       /* /dev/null, stdin of execs without AL_EXEC_STDIN */
    uint64_t counter;  /* makes cgroup and temporary names unique */
    struct al_decoder dec;
    size_t oq_head, oq_tail, oq_wrap; /* unsent output, see outq_reserve */
    struct {
        char name[48];
        uint64_t since_us;
    } dead[2 * AGENT_REQ_MAX]; /* cgroups of finished requests, to be removed */
    size_t ndead;
    bool cg_due;             /* try removing them at the end of this iteration */
    uint64_t dead_next_us;   /* else retry then */
    char spare[48];          /* an empty cgroup ready for the next exec */
    int spare_fd;            /* O_PATH on it; -1 when none */
    const char *kernels_dir; /* driver scripts of the language kernels */
    struct kernel kernels[KERNEL_MAX];
    struct req reqs[AGENT_REQ_MAX];
    uint8_t inbuf[AL_FRAME_HEADER_SIZE + AL_FRAME_PAYLOAD_MAX];
    uint8_t outq[AGENT_OUTQ_CAP];
};

/* util (loop.c) */
uint64_t now_us(void);
void agent_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *printable(struct al_str s, char *buf, size_t cap);
uint16_t errno_class(int err);
/* Writes a short string to a file (procfs, cgroupfs); 0 or -errno. */
int write_file(int dir, const char *path, const char *s);

/* channel.c */
int channel_open_virtio(struct channel *ch, const char *name);
int channel_open_stdio(struct channel *ch);
/* -EWOULDBLOCK: another agent serves path. */
int channel_open_unix(struct channel *ch, const char *path);
/* Checks for (and takes) a host: 1 connected, 0 not yet, <0 error. */
int channel_accept(struct channel *ch);
/* Forgets the current host; the channel waits for the next one. */
void channel_drop(struct channel *ch);

/* loop.c: sending, requests, the loop */
void agent_send(struct agent *a, const struct al_msg *m);
void agent_send_error(struct agent *a, uint32_t id, uint16_t klass, int err, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
void agent_send_credit(struct agent *a, uint32_t id, uint8_t stream, uint32_t bytes);
struct req *req_find(struct agent *a, uint32_t id);
struct req *req_new(struct agent *a, uint32_t id, enum req_kind kind);
/* Closes everything the request holds and frees its slot. */
void req_free(struct agent *a, struct req *r);
int ostream_pump(struct agent *a, struct req *r, struct ostream *o);
/* Queues bytes of the agent's own on a stream (a notice at the start of a run): within credit. */
void ostream_inject(struct agent *a, struct req *r, struct ostream *o, const char *s);
/* Queues the stream's EOF and closes its fd. */
void ostream_close(struct agent *a, struct req *r, struct ostream *o);
int agent_run(struct agent *a);
/* refresh.c: REFRESH, sent by the host right after a template restore; answers OK or ERROR. */
void refresh_apply(struct agent *a, const struct al_msg *m);

/* exec.c */
void exec_start(struct agent *a, const struct al_msg *m);
void exec_stdin(struct agent *a, struct req *r, const struct al_msg *m);
void exec_flush_stdin(struct agent *a, struct req *r);
void exec_signal(struct agent *a, const struct al_msg *m);
/* RESIZE: a pty run's new window size (the kernel tells its foreground group with SIGWINCH). */
void exec_resize(struct agent *a, const struct al_msg *m);
void exec_connect(struct agent *a, const struct al_msg *m);
/* Reaps exited children; true when more may be waiting. */
bool exec_reap(struct agent *a);
void exec_tick(struct agent *a, struct req *r, uint64_t now);
/* Only a request's deadlines (a timeout, the kill after an ignored interrupt): all that runs of
 * a request while no host is connected (no frame is made then). */
void exec_timers(struct agent *a, struct req *r, uint64_t now);
void exec_kill(struct agent *a, struct req *r);
/* Queues a finished request's cgroup for removal; clears name. */
void cgroup_remove(struct agent *a, char *name);
void cgroup_setup(struct agent *a);
/* Removes finished requests' cgroups and readies a spare one: run after output is flushed,
 * off the latency path. */
void cgroup_housekeeping(struct agent *a, uint64_t now);
int exec_langs(struct agent *a, struct al_str *out, size_t max);
/* The child side of a spawn: argv, environment, working directory. */
struct spawn {
    char **argv;
    char **envp;
    const char *cwd;
    bool ctty; /* fd 0 is a terminal: it becomes the process's controlling terminal */
};
/* Starts sp in its own session (in cg_fd's cgroup when >= 0) with fds[i] as its fd i. Returns
 * the pid once execve succeeded; else -1 with the failing stage and errno in e. */
pid_t spawn_process(const struct spawn *sp, const int *fds, int nfds, int cg_fd, int e[2]);
/* Sends the ERROR for a failed spawn_process. */
void spawn_error(struct agent *a, uint32_t id, const int e[2], const struct spawn *sp);
/* The agent's environment plus extra KEY=VALUE entries (which win), in a static array valid
 * until the next call. */
char **spawn_env(char *const *extra, size_t n);
/* Creates a fresh cgroup named PREFIX-N; returns an O_PATH fd on it, name set; or -errno. */
int cgroup_new(struct agent *a, char *name, size_t cap, const char *prefix);
int pipe_pair(int *rd, int *wr, int nonblock_end);
/* Input wait: the run's stdin pipe identity, and the periodic check. */
void exec_stdin_identity(struct req *r, int fd);

/* inputwait.c: is a task of the run blocked reading the run's stdin pipe? */
bool stdin_blocked(struct agent *a, const struct req *r);

/* kernel.c */
void kernel_init(struct agent *a);
int kernel_langs(struct agent *a, struct al_str *out, size_t max);
/* Starts the code block of a kernel EXEC; sends STARTED or ERROR itself. */
void kernel_exec(struct agent *a, struct req *r, const struct al_msg *m);
/* The kernel of pid died: true when pid was a kernel's. */
bool kernel_reaped(struct agent *a, pid_t pid, int status);
/* Control-socket traffic: the request going out, "done" lines coming in. */
void kernel_ctl_io(struct agent *a, struct kernel *k, short revents);
/* Reads and drops output the kernel writes while no run takes it. */
void kernel_drain(struct kernel *k, int i);
void kernel_kill(struct agent *a, struct kernel *k);
/* Kills a process and all it started: its cgroup's cgroup.kill (under the agent's base) when
 * it has one, else its process group. */
void tree_kill(struct agent *a, const char *cgroup, pid_t pid);
/* Delivers a host SIGNAL to the kernel's process group (SIGKILL kills the kernel). */
void kernel_signal(struct agent *a, struct req *r, int signo);
/* The SIGINTs held back (kernel_signal), each sent once its interpreter can take it; the time
 * (µs) by which the loop must come back for one still held, or UINT64_MAX. */
uint64_t kernel_tick(struct agent *a, uint64_t now);
/* Stops every kernel (disconnect outside --unix, exit). */
void kernel_reset_all(struct agent *a);

/* files.c */
int files_open_root(struct agent *a, const char *root);
void file_put_start(struct agent *a, const struct al_msg *m);
void file_put_data(struct agent *a, struct req *r, const struct al_msg *m);
void file_get_start(struct agent *a, const struct al_msg *m);
void file_get_tick(struct agent *a, struct req *r);

/* relay.c: --relay PATH, one SSH session's pipe to the agent daemon on the socket PATH. */
struct relay_opts {
    const char *path;    /* the daemon's socket */
    const char *kernels; /* for a daemon this relay starts; NULL: its default */
    const char *root;    /* likewise */
    bool allow_shutdown; /* likewise */
};
/* Returns the exit status; reports its own errors. */
int relay_main(const struct relay_opts *o);
/* airlock-agent --run-as USER -- PROGRAM... (runas.c): execs PROGRAM as the image's USER. */
int runas_main(const char *spec, char **argv);
/* airlock-agent --watch (watch.c): DIR's changes on stdout until DIR goes. */
int watch_main(const char *dir, bool recursive);

/* init.c */
void init_pid1(void);
void init_supervise(void);
void init_common(void);
void init_power_off(bool reboot_instead);

/* egress.c: a session with network (a NIC present): the NIC's address and the proxy variables
 * every process inherits; the forwarder that carries programs' proxy connections over the
 * tunnels the host opens. */
bool egress_present(void);
void egress_setup(void);
void egress_start(void);
/* Tells the forwarder (if any) to drop every connection it holds: after a HELLO. */
void egress_flush(void);

#endif

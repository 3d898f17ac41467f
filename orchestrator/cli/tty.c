/* The local side of a terminal into the guest (airlock exec -t, airlock shell, the chat's
 * %shell): the local terminal in raw mode and back on every way out, its size at the start and
 * on SIGWINCH, and the keys the user types, relayed by a thread that watches for the key that
 * leaves (Ctrl-]). The run itself is the library's (al_exec_opts.pty_rows, .resize_fd). */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

/* How long a terminal has to answer a query before the flush at the end: a local terminal
 * answers within a millisecond, one over SSH within a round trip. */
#define ANSWER_WAIT_MS 100

/* Ctrl-]: as telnet and virsh console have it. */
#define LEAVE_KEY 0x1d

/* One terminal at a time per process: these serve the signal handler and atexit. */
static struct termios saved;
static int saved_fd = -1;
static volatile sig_atomic_t resize_w = -1, size_fd = -1;

static void restore(void)
{
    if (saved_fd >= 0) {
        tcsetattr(saved_fd, TCSAFLUSH, &saved);
        saved_fd = -1;
    }
}

static void on_winch(int sig)
{
    (void)sig;
    int saved_errno = errno;
    struct winsize ws;
    if (resize_w >= 0 && size_fd >= 0 && ioctl(size_fd, TIOCGWINSZ, &ws) == 0)
        al_pty_resize(resize_w, ws.ws_row, ws.ws_col);
    errno = saved_errno;
}

static void *relay(void *p)
{
    struct cli_tty *t = p;
    uint8_t buf[4096];
    for (;;) {
        struct pollfd pfd[2] = {{t->in_fd, POLLIN, 0}, {t->stop[0], POLLIN, 0}};
        if (poll(pfd, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (pfd[1].revents)
            break;
        ssize_t n = read(t->in_fd, buf, sizeof(buf));
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n <= 0)
            break;
        uint8_t *leave = t->raw ? memchr(buf, LEAVE_KEY, (size_t)n) : NULL;
        size_t keep = leave ? (size_t)(leave - buf) : (size_t)n;
        if (keep && al_write_all(t->keys[1], buf, keep) < 0)
            break;
        if (leave) {
            t->left = true;
            break;
        }
    }
    /* The end of the keys is the terminal closing: the guest's side hangs up. */
    al_closep(&t->keys[1]);
    return NULL;
}

/* The run's output through a pipe of ours, for a run another process holds (al_attach_exec
 * hands it our fds, not our callback): read here through the filter until the stop byte, then
 * what is left at once. */
static void *pump_out(void *p)
{
    struct cli_tty *t = p;
    uint8_t buf[4096];
    bool stopping = false;
    for (;;) {
        struct pollfd pfd[2] = {{t->out_pipe[0], POLLIN, 0}, {t->stop_out[0], POLLIN, 0}};
        if (poll(pfd, stopping ? 1 : 2, stopping ? 0 : -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (!stopping && pfd[1].revents) {
            stopping = true;
            continue;
        }
        if (!pfd[0].revents)
            break; /* stopping, and nothing more is there */
        ssize_t n = read(t->out_pipe[0], buf, sizeof(buf));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0 || cli_termout_write(&t->out, 1, buf, (size_t)n) < 0)
            break;
    }
    return NULL;
}

int cli_tty_pump(struct cli_tty *t, al_exec_opts *eo, al_error *err)
{
    if (pipe2(t->out_pipe, O_CLOEXEC) < 0 || pipe2(t->stop_out, O_CLOEXEC) < 0)
        return al_err(err, -errno, "cannot make a pipe: %s", strerror(errno));
    int e = pthread_create(&t->out_thread, NULL, pump_out, t);
    if (e)
        return al_err(err, -e, "cannot start the terminal's thread: %s", strerror(e));
    t->pumping = true;
    eo->stdout_fd = t->out_pipe[1];
    eo->output = NULL;
    return 0;
}

int cli_tty_open(struct cli_tty *t, bool input, al_exec_opts *eo, al_error *err)
{
    *t = (struct cli_tty){.in_fd = 0,
                          .out_fd = 1,
                          .keys = {-1, -1},
                          .resize = {-1, -1},
                          .stop = {-1, -1},
                          .out_pipe = {-1, -1},
                          .stop_out = {-1, -1},
                          .rows = 24,
                          .cols = 80};
    struct winsize ws;
    int sfd = isatty(t->out_fd) ? t->out_fd : isatty(t->in_fd) ? t->in_fd : -1;
    if (sfd >= 0 && ioctl(sfd, TIOCGWINSZ, &ws) == 0 && ws.ws_row && ws.ws_col) {
        t->rows = ws.ws_row;
        t->cols = ws.ws_col;
    }
    if (pipe2(t->resize, O_CLOEXEC | O_NONBLOCK) < 0)
        return al_err(err, -errno, "cannot make a pipe: %s", strerror(errno));
    eo->pty_rows = t->rows;
    eo->pty_cols = t->cols;
    /* The guest's bytes reach this terminal filtered (al_term_pass); exec --raw takes it off. */
    cli_termout_init_pass(&t->out);
    eo->output = cli_termout_write;
    eo->output_ctx = &t->out;
    eo->resize_fd = t->resize[0];
    eo->stdin_fd = -1;
    /* The guest's programs write for this terminal: its TERM, unless the caller set one. */
    const char *term = getenv("TERM");
    size_t n = 0;
    bool has_term = false;
    for (; eo->env && eo->env[n] && n < CLI_TTY_ENV_MAX - 1; n++) {
        t->env[n] = eo->env[n];
        has_term |= !strncmp(eo->env[n], "TERM=", 5);
    }
    if (!has_term && term && *term && strlen(term) < sizeof(t->term) - 5 &&
        n < CLI_TTY_ENV_MAX - 1) {
        snprintf(t->term, sizeof(t->term), "TERM=%s", term);
        t->env[n++] = t->term;
    }
    t->env[n] = NULL;
    eo->env = n ? t->env : NULL;
    if (sfd >= 0) {
        size_fd = sfd;
        resize_w = t->resize[1];
        struct sigaction sa = {.sa_handler = on_winch, .sa_flags = SA_RESTART};
        sigemptyset(&sa.sa_mask);
        sigaction(SIGWINCH, &sa, NULL);
    }
    /* Raw: the keys go to the guest's terminal as typed, and what it writes (its line
     * discipline already made \r\n) is shown as written. Without input only the output part. */
    int mfd = input && isatty(t->in_fd) ? t->in_fd : isatty(t->out_fd) ? t->out_fd : -1;
    if (mfd >= 0 && tcgetattr(mfd, &saved) == 0) {
        struct termios raw = saved;
        if (mfd == t->in_fd)
            cfmakeraw(&raw);
        else
            raw.c_oflag &= ~(tcflag_t)OPOST;
        if (tcsetattr(mfd, TCSAFLUSH, &raw) == 0) {
            saved_fd = mfd;
            t->raw = mfd == t->in_fd;
            static bool registered;
            if (!registered && atexit(restore) == 0)
                registered = true;
        }
    }
    if (!input)
        return 0;
    if (pipe2(t->keys, O_CLOEXEC) < 0 || pipe2(t->stop, O_CLOEXEC) < 0) {
        int e = errno;
        cli_tty_close(t);
        return al_err(err, -e, "cannot make a pipe: %s", strerror(e));
    }
    int e = pthread_create(&t->thread, NULL, relay, t);
    if (e) {
        cli_tty_close(t);
        return al_err(err, -e, "cannot start the terminal's thread: %s", strerror(e));
    }
    t->relaying = true;
    eo->stdin_fd = t->keys[0];
    return 0;
}

int cli_tty_left(const struct cli_tty *t, int status)
{
    if (!t->left)
        return status;
    fprintf(stderr, "airlock: left the terminal (Ctrl-])\n");
    return 128 + SIGHUP;
}

void cli_tty_close(struct cli_tty *t)
{
    if (t->pumping) {
        al_closep(&t->out_pipe[1]);
        (void)!write(t->stop_out[1], "x", 1);
        pthread_join(t->out_thread, NULL);
        t->pumping = false;
    }
    if (t->relaying) {
        (void)!write(t->stop[1], "x", 1);
        pthread_join(t->thread, NULL);
        t->relaying = false;
    }
    struct sigaction sa = {.sa_handler = SIG_DFL};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGWINCH, &sa, NULL);
    resize_w = size_fd = -1;
    /* The terminal's answers to the queries that passed (the cursor's position, its attributes)
     * may still be on their way: they are let arrive, then the flush drops them, so that none
     * is typed into the shell the user goes back to. */
    if (saved_fd >= 0) {
        tcdrain(t->out_fd);
        poll(NULL, 0, ANSWER_WAIT_MS);
    }
    restore();
    for (int i = 0; i < 2; i++) {
        al_closep(&t->keys[i]);
        al_closep(&t->resize[i]);
        al_closep(&t->stop[i]);
        al_closep(&t->out_pipe[i]);
        al_closep(&t->stop_out[i]);
    }
}

/* Ctrl-C and friends as bytes on a pipe: what al_session_opts.cancel_fd and al_model_cfg.cancel_fd
 * read. Shared by airlock exec and the model loop's terminal side (loopui.c). */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <unistd.h>

static int cancel_pipe[2] = {-1, -1};
static void (*signal_hook)(int sig);

static void on_signal(int sig)
{
    int saved = errno;
    if (signal_hook)
        signal_hook(sig);
    uint8_t b = (uint8_t)sig;
    (void)!write(cancel_pipe[1], &b, 1);
    errno = saved;
}

int cli_cancel_pipe(void (*hook)(int sig))
{
    if (pipe2(cancel_pipe, O_CLOEXEC | O_NONBLOCK) < 0)
        return -errno;
    signal_hook = hook;
    struct sigaction sa = {.sa_handler = on_signal}; /* no SA_RESTART: reads see EINTR */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    return cancel_pipe[0];
}

/* The model loop's terminal side: signals, rendering callbacks, the confirmation prompt. */
#include "loopui.h"

#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

static int cancel_fd = -1; /* cli_cancel_pipe's */
static volatile sig_atomic_t quit_flag;
static volatile sig_atomic_t interrupted;
static volatile sig_atomic_t last_int_sec; /* CLOCK_MONOTONIC seconds * 10 of the last Ctrl-C */
static volatile sig_atomic_t hung_up;      /* a SIGTERM or SIGHUP came */
static volatile sig_atomic_t quit_sig;     /* the signal that set quit_flag */
static volatile sig_atomic_t int_stays;    /* SIGINT never quits (chat --jsonl: a stop each) */

static void on_signal(int sig)
{
    if (sig == SIGINT) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        long now = (long)ts.tv_sec * 10 + ts.tv_nsec / 100000000;
        if (last_int_sec && now - last_int_sec <= 10 && !int_stays) {
            quit_flag = 1; /* twice within a second */
            quit_sig = sig;
        }
        last_int_sec = (sig_atomic_t)now;
        interrupted = 1;
    } else {
        quit_flag = 1;
        quit_sig = sig;
        hung_up = 1;
    }
}

bool loopui_hung_up(void)
{
    return hung_up;
}

int loopui_signals(void)
{
    int fd = cli_cancel_pipe(on_signal); /* on_signal runs first, then the byte is written */
    if (fd < 0)
        return fd;
    cancel_fd = fd;
    return 0;
}

int loopui_cancel_fd(void)
{
    return cancel_fd;
}

void loopui_drain(void)
{
    uint8_t buf[64];
    while (read(cancel_fd, buf, sizeof(buf)) > 0)
        ;
    interrupted = 0;
}

bool loopui_quit(void)
{
    return quit_flag;
}

void loopui_sigint_stays(void)
{
    int_stays = 1;
}

int loopui_quit_signal(void)
{
    return quit_flag ? quit_sig : 0;
}

bool loopui_interrupted(void)
{
    return interrupted;
}

int loopui_read_line(int fd, char *buf, size_t len)
{
    size_t n = 0;
    for (;;) {
        struct pollfd p[2] = {{.fd = fd, .events = POLLIN}, {.fd = cancel_fd, .events = POLLIN}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (p[1].revents & POLLIN) {
            loopui_drain();
            return -2;
        }
        char ch;
        ssize_t r = read(fd, &ch, 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return n ? (int)n : -1;
        if (ch == '\n')
            break;
        if (n + 1 < len)
            buf[n++] = ch;
    }
    buf[n] = '\0';
    return (int)n;
}

/* A prompt that waits for Enter looks dead: on a terminal the key is taken at once. */
int loopui_read_key(int fd, char *key)
{
    struct termios saved, raw;
    if (tcgetattr(fd, &saved) < 0) {
        char line[64];
        int n = loopui_read_line(fd, line, sizeof(line));
        *key = n > 0 ? line[0] : '\0';
        if (n > 1 && strcasecmp(line, "yes") && strcasecmp(line, "no"))
            *key = '?'; /* not an answer: asked again */
        return n < 0 ? n : 0;
    }
    raw = saved;
    raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
    raw.c_cc[VMIN] = 1;
    raw.c_cc[VTIME] = 0;
    tcsetattr(fd, TCSANOW, &raw);
    int r = 0;
    for (;;) {
        struct pollfd p[2] = {{.fd = fd, .events = POLLIN}, {.fd = cancel_fd, .events = POLLIN}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            r = -1;
            break;
        }
        if (p[1].revents & POLLIN) {
            loopui_drain();
            r = -2;
            break;
        }
        char ch;
        ssize_t n = read(fd, &ch, 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0 || ch == 4) { /* the end, or Ctrl-D */
            r = -1;
            break;
        }
        *key = ch == '\n' || ch == '\r' ? '\0' : ch;
        /* "y" and Enter typed together (the habit of a line prompt): the Enter is this
         * answer's, not the next prompt's */
        struct pollfd nl = {.fd = fd, .events = POLLIN};
        if (*key && poll(&nl, 1, 50) > 0 && read(fd, &ch, 1) == 1 && ch != '\n' && ch != '\r')
            *key = '?'; /* more than one key: asked again */
        break;
    }
    tcsetattr(fd, TCSANOW, &saved);
    if (r == 0 && *key >= ' ' && *key < 127)
        fputc(*key, stderr);
    fputc('\n', stderr);
    return r;
}

/* Prints one JSON line and frees j. */
static void json_line(cJSON *j)
{
    char *s = cJSON_PrintUnformatted(j);
    if (s)
        printf("%s\n", s);
    fflush(stdout);
    free(s);
    cJSON_Delete(j);
}

static cJSON *json_event(const char *role, const char *type, const char *content)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "role", role);
    cJSON_AddStringToObject(j, "type", type);
    cJSON_AddStringToObject(j, "content", content ? content : "");
    return j;
}

void loopui_json_event(const char *role, const char *type, const char *content)
{
    json_line(json_event(role, type, content));
}

/* ---- the loop's callbacks ---- */

static void ui_thinking(void *ctx, bool on)
{
    struct loopui *u = ctx;
    if (!u->json)
        render_spinner(&u->render, on ? "Thinking…" : NULL);
}

static void ui_text(void *ctx, const char *s, size_t n)
{
    struct loopui *u = ctx;
    if (!u->json)
        render_text(&u->render, s, n);
}

static void ui_text_end(void *ctx)
{
    struct loopui *u = ctx;
    if (!u->json)
        render_text_end(&u->render);
}

static void ui_code(void *ctx, const char *lang, const char *code)
{
    struct loopui *u = ctx;
    if (!u->json)
        render_code(&u->render, lang, code);
}

/* Writes code to a temp file, opens $EDITOR on it, reads it back. */
static int edit_code(char **code)
{
    char path[] = "/tmp/airlock-edit-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0)
        return -errno;
    size_t len = strlen(*code);
    bool ok = write(fd, *code, len) == (ssize_t)len;
    close(fd);
    const char *editor = getenv("VISUAL");
    if (!editor || !*editor)
        editor = getenv("EDITOR");
    if (!editor || !*editor)
        editor = "vi";
    pid_t pid = ok ? fork() : -1;
    if (pid == 0) {
        signal(SIGINT, SIG_DFL);
        execl("/bin/sh", "sh", "-c", "exec $0 \"$1\"", editor, path, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    if (pid > 0)
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
            ;
    char *text = NULL;
    if (pid > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0) {
        FILE *f = fopen(path, "re");
        size_t cap = 0;
        if (f) {
            ssize_t n = getdelim(&text, &cap, '\0', f);
            if (n < 0) {
                free(text);
                text = strdup("");
            }
            fclose(f);
        }
    }
    unlink(path);
    if (!text)
        return -ECANCELED;
    free(*code);
    *code = text;
    return 0;
}

static int ui_confirm(void *ctx, const char *lang, char **code)
{
    struct loopui *u = ctx;
    if (u->confirm_fd < 0) {
        fprintf(stderr, "airlock: no terminal to confirm on; not running (use -y to run "
                        "without asking)\n");
        return 0;
    }
    for (;;) {
        fprintf(stderr, "Run this in the sandbox? [y/n/e] ");
        fflush(stderr);
        char key = 0;
        if (loopui_read_key(u->confirm_fd, &key) < 0)
            return 0;
        if (key == 'y' || key == 'Y')
            return 1;
        if (key == 'n' || key == 'N' || !key)
            return 0;
        if (key == 'e' || key == 'E') {
            if (edit_code(code) < 0)
                fprintf(stderr, "airlock: the editor failed; the code is unchanged\n");
            render_code(&u->render, lang, *code);
        }
    }
}

/* The model vendor's safety check on a computer action: a person acknowledges it here, -y or
 * not; without a terminal nobody can, and the actions do not run. */
static int ui_acknowledge(void *ctx, const char *code, const char *message)
{
    struct loopui *u = ctx;
    char c[128], m[1024];
    al_term_escape(code, c, sizeof(c));
    al_term_escape(message, m, sizeof(m));
    fprintf(stderr, "airlock: the model's vendor flags the next computer action (%s): %s\n",
            *c ? c : "no code", *m ? m : "(no message)");
    if (u->confirm_fd < 0) {
        fprintf(stderr, "airlock: no terminal to acknowledge it on; not running the actions\n");
        return 0;
    }
    fprintf(stderr, "Acknowledge it and go on? [y/N] ");
    fflush(stderr);
    char key = 0;
    return loopui_read_key(u->confirm_fd, &key) == 0 && (key == 'y' || key == 'Y');
}

/* A kernel's first start is seconds of silence under emulation: say what is waited for. */
static void ui_run_start(void *ctx, const char *lang, bool cold)
{
    struct loopui *u = ctx;
    if (u->json || !cold)
        return;
    char safe[64];
    snprintf(u->spin_label, sizeof(u->spin_label),
             "Starting the %s kernel (its first run in "
             "this session)…",
             al_term_escape(lang, safe, sizeof(safe)));
    render_spinner(&u->render, u->spin_label);
}

static int ui_output(void *ctx, int stream, const uint8_t *data, size_t n)
{
    struct loopui *u = ctx;
    if (u->json)
        return 0;
    render_spinner(&u->render, NULL);
    if (n)
        u->line_open[stream == 2] = data[n - 1] != '\n';
    /* Shown, not obeyed: the guest's escape sequences never reach the terminal. */
    int r = cli_termout_write(&u->out, stream, data, n);
    return r == -EPIPE ? -EPIPE : 0; /* the screen going away must not end the run */
}

/* Larger images are only named (their path is printed either way): a terminal image costs the
 * terminal its memory, and a screenful of base64 when the detection was wrong. */
#define INLINE_IMAGE_MAX (4u << 20)
/* kitty's graphics protocol sends the base64 in pieces of at most 4096 bytes. */
#define KITTY_CHUNK 4096

enum term_images { TERM_IMAGES_NONE, TERM_IMAGES_KITTY, TERM_IMAGES_ITERM };

/* Only terminals that say who they are: kitty sets KITTY_WINDOW_ID (and TERM=xterm-kitty),
 * iTerm2 TERM_PROGRAM=iTerm.app. Anything else (tmux, ssh, a pipe) gets the path alone. */
static enum term_images term_images(const struct loopui *u)
{
    if (u->opts->plain || !isatty(STDOUT_FILENO) || getenv("TMUX"))
        return TERM_IMAGES_NONE;
    const char *term = getenv("TERM"), *prog = getenv("TERM_PROGRAM");
    if (getenv("KITTY_WINDOW_ID") || (term && !strcmp(term, "xterm-kitty")))
        return TERM_IMAGES_KITTY;
    if (prog && !strcmp(prog, "iTerm.app"))
        return TERM_IMAGES_ITERM;
    return TERM_IMAGES_NONE;
}

/* A PNG the host checked (signature, IHDR) shown inline: the escape sequences carry only base64,
 * which has no control characters. */
static void show_image(const struct loopui *u, const al_mime *png)
{
    enum term_images t = term_images(u);
    if (t == TERM_IMAGES_NONE || png->len > INLINE_IMAGE_MAX)
        return;
    char *b64 = malloc((png->len + 2) / 3 * 4 + 1);
    if (!b64)
        return;
    size_t n = (size_t)EVP_EncodeBlock((unsigned char *)b64, png->data, (int)png->len);
    if (t == TERM_IMAGES_ITERM) {
        printf("\033]1337;File=inline=1;size=%zu:%s\a\n", png->len, b64);
    } else {
        for (size_t off = 0; off < n; off += KITTY_CHUNK) {
            size_t take = n - off < KITTY_CHUNK ? n - off : KITTY_CHUNK;
            printf("\033_G%sm=%d;%.*s\033\\", off ? "" : "f=100,a=T,", off + take < n, (int)take,
                   b64 + off);
        }
        putchar('\n');
    }
    fflush(stdout);
    free(b64);
}

/* --json: each result of a kernel run as {"role": "computer", "type": "result", "content":
 * al_result_json's object}; on a terminal that shows images, a PNG result inline (its path
 * follows as output). */
static void ui_result(void *ctx, const al_result *r)
{
    struct loopui *u = ctx;
    render_spinner(&u->render, NULL);
    if (!u->json) {
        const al_mime *png = al_result_mime(r, "image/png");
        if (png && (r->kind == AL_RESULT_VALUE || r->kind == AL_RESULT_DISPLAY))
            show_image(u, png);
        return;
    }
    char *text = al_result_json(r);
    cJSON *j = json_event("computer", "result", NULL);
    cJSON *content = text ? cJSON_Parse(text) : NULL;
    free(text);
    if (content)
        cJSON_ReplaceItemInObject(j, "content", content);
    json_line(j);
}

static void ui_run_end(void *ctx, const al_exec_result *r, const char *summary)
{
    struct loopui *u = ctx;
    render_spinner(&u->render, NULL);
    if (!u->json)
        cli_termout_end(&u->out);
    /* What follows (the model's text, the next code) starts on a line of its own. */
    for (int i = 0; i < 2 && !u->json; i++)
        if (u->line_open[i] && al_write_all(i + 1, "\n", 1) == 0)
            u->line_open[i] = false;
    if (!u->json && (u->opts->verbose || !r || r->how != AL_EXEC_EXITED || r->value != 0))
        fprintf(stderr, "%s%s%s\n", u->render.color ? "\033[2m" : "", summary,
                u->render.color ? "\033[0m" : "");
}

static void ui_notice(void *ctx, const char *msg)
{
    struct loopui *u = ctx;
    if (u->json) {
        loopui_json_event("airlock", "notice", msg);
        return;
    }
    /* A notice may quote guest file names or the model's words. */
    al_term_state st = {0};
    size_t n = strlen(msg);
    char *safe = malloc(AL_TERM_OUT_MAX(n) + 1);
    if (!safe)
        return;
    size_t len = al_term_sanitize(&st, msg, n, safe);
    len += al_term_sanitize_end(&st, safe + len);
    char *line = NULL;
    if (asprintf(&line, "airlock: %.*s", (int)len, safe) >= 0)
        render_line(&u->render, line);
    free(line);
    free(safe);
}

/* The session's notices while it boots (emulation fallback): printed clear of the spinner. */
static void session_notice(void *ctx, const char *msg)
{
    struct loopui *u = ctx;
    if (u->json || u->lmc) {
        /* Not an event of the exchange: stdout stays the exchange alone, as before. */
        cli_print_notice(NULL, msg);
        return;
    }
    char *line = NULL;
    if (asprintf(&line, "notice: %s", msg) < 0)
        return;
    ui_notice(ctx, line);
    free(line);
}

static void ui_message(void *ctx, const cJSON *m)
{
    struct loopui *u = ctx;
    if (!u->json)
        return;
    const char *role = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "role"));
    const char *content = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "content"));
    if (!role)
        return;
    if (!strcmp(role, "tool") || cJSON_GetObjectItemCaseSensitive(m, "kind")) {
        loopui_json_event("computer", "output", content);
        return;
    }
    if (content && *content)
        loopui_json_event(role, "message", content);
    cJSON *call;
    cJSON_ArrayForEach(call, cJSON_GetObjectItemCaseSensitive(m, "tool_calls"))
    {
        cJSON *args = cJSON_GetObjectItemCaseSensitive(call, "arguments");
        const char *lang = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(args, "language"));
        const char *code = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(args, "code"));
        cJSON *j = json_event("assistant", "code", code);
        cJSON_AddStringToObject(j, "language", lang ? lang : "");
        json_line(j);
    }
}

/* What to do about a model that cannot be reached, in one line. */
static const char *model_hint(const struct chat_opts *o)
{
    if (o->local && !strcmp(o->local, "ollama"))
        return "start it ('ollama serve', then 'ollama pull MODEL'), or use --local "
               "llamacpp|lmstudio or --api-base URL";
    if (o->local && !strcmp(o->local, "llamacpp"))
        return "start it ('llama-server -m MODEL.gguf --port 8080'), or use --api-base URL";
    if (o->local)
        return "start LM Studio's server (port 1234), or use --api-base URL";
    if (o->api_base)
        return "is the server at --api-base running?";
    return "or --api-key-file FILE; or --local for a server on this machine (ollama); or "
           "--api-base URL";
}

/* A failure on the way in, as the output's form says it (a JSON or LMC line), before its line
 * on stderr. */
static void open_error(const struct loopui *u, const char *msg)
{
    if (u->lmc)
        lmc_error(msg);
    else if (u->json)
        loopui_json_event("airlock", "error", msg);
}

int loopui_open(struct loopui *u, struct chat_opts *o, struct cli_globals *g)
{
    u->opts = o;
    render_init(&u->render, stdout, o->plain || u->json || u->lmc);
    cli_termout_init(&u->out, true);
    chat_opts_finish(o);
    o->cfg.model.cancel_fd = loopui_cancel_fd();
    al_session_opts so = o->sess;
    so.image = o->image;
    so.connect_uri = g->connect_uri;
    so.quiet = g->quiet;
    so.cancel_fd = loopui_cancel_fd();
    so.on_notice = session_notice;
    so.notice_ctx = u;
    if (g->debug)
        so.console_to = stderr;
    al_error err = {0};
    /* A model that cannot be reached is said before a VM boots for it. */
    if (al_model_check(&o->cfg.model, &err) < 0) {
        open_error(u, err.msg);
        fprintf(stderr, "airlock: %s; %s\n", err.msg, model_hint(o));
        return 1;
    }
    if (!u->json && !u->lmc)
        render_spinner(&u->render, "Starting the sandbox VM…");
    int r = al_session_open(&so, &u->session, &err);
    if (!u->json && !u->lmc)
        render_spinner(&u->render, NULL);
    if (r < 0) {
        open_error(u, err.msg);
        cli_error(&err);
        return EXIT_AIRLOCK_FAILED;
    }
    if (g->debug)
        fprintf(stderr, "airlock: session %s\n", al_session_name(u->session));
    /* 'airlock ps' and 'airlock cp' reach the chat's VM through this. */
    if (al_session_serve_control(u->session, &err) < 0 ||
        (o->workdir && cli_workdir_push(u->session, o->workdir, &o->wo, g->quiet, &err) < 0)) {
        open_error(u, err.msg);
        cli_error(&err);
        al_session_close(u->session);
        u->session = NULL;
        return EXIT_AIRLOCK_FAILED;
    }
    o->cfg.image = o->image ? o->image : al_image_default();
    al_chat_ui ui = {
        .ctx = u,
        .thinking = ui_thinking,
        .text = ui_text,
        .text_end = ui_text_end,
        .code = ui_code,
        .confirm = ui_confirm,
        .acknowledge = ui_acknowledge,
        .run_start = ui_run_start,
        .output = ui_output,
        .run_end = ui_run_end,
        .result = ui_result,
        .notice = ui_notice,
        .message = ui_message,
    };
    if (u->lmc)
        lmc_ui(&ui);
    r = al_chat_init(&u->chat, &o->cfg, &ui, u->session, al_session_languages(u->session), &err);
    if (r < 0) {
        cli_error(&err);
        al_session_close(u->session);
        u->session = NULL;
        return EXIT_AIRLOCK_FAILED;
    }
    u->chat_ready = true;
    return 0;
}

int loopui_close(struct loopui *u)
{
    al_workdir_diff *diff = NULL;
    al_error err = {0};
    int status = 0;
    /* From here on a signal never reaches the guest's tools: a second Ctrl-C (the documented
     * way out) or a SIGTERM must not cut the copy of the changes short. */
    if (u->session)
        al_session_set_cancel_fd(u->session, -1);
    loopui_drain();
    if (u->session && u->opts->workdir &&
        al_workdir_diff_new(u->session, u->opts->workdir, &u->opts->wo, &diff, &err) < 0) {
        cli_error(&err);
        status = 1;
    }
    if (u->chat_ready)
        al_chat_free(&u->chat);
    u->chat_ready = false;
    al_session_close(u->session);
    u->session = NULL;
    render_fini(&u->render);
    /* The VM is gone before the question: nothing waits on the user's answer. */
    if (diff) {
        cli_changes_print(diff, "changes in " AL_WORKDIR_GUEST_DIR);
        al_error serr = {0};
        if (cli_workdir_sync(diff, u->opts->workdir, u->opts->sync, u->opts->sync_allow,
                             loopui_hung_up(), &serr) < 0) {
            if (serr.code)
                cli_error(&serr);
            status = 1;
        }
        al_workdir_diff_free(diff);
    }
    return status;
}

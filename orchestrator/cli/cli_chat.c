/* airlock chat (and airlock with no command): the interactive loop. Line editing and history
 * through libedit; Ctrl-C interrupts what is running and returns here; twice within a second, or
 * Ctrl-D, leaves; the VM is destroyed on every way out. */
#include "loopui.h"

#include <errno.h>
#include <histedit.h>
#include <locale.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <wchar.h>

#define HISTORY_SIZE 1000
#define MESSAGE_MAX (256 * 1024) /* one typed message; more belongs in a file in /workspace */

static const char usage[] =
    "Usage: airlock [chat] [OPTIONS]\n"
    "       airlock --resume [ID] [OPTIONS]\n"
    "\n"
    "Chat with a model that runs code in a disposable VM. Type %help in the chat for its\n"
    "commands; \"\"\" on a line of its own starts and ends a multi-line message.\n"
    "\n"
    "      --resume [ID]         continue a saved conversation (default: the newest) in a\n"
    "                            fresh VM\n"
    "      --jsonl               JSON lines both ways instead of a terminal: requests on\n"
    "                            stdin, Open Interpreter's LMC chunks on stdout\n";

static const char magic_help[] =
    "  %help              this list\n"
    "  %reset             a fresh VM and an empty conversation\n"
    "  %undo              undo the last exchange: the VM goes back to its checkpoint\n"
    "                     before that exchange's runs, and the exchange leaves the history\n"
    "  %checkpoints       list the VM's checkpoints\n"
    "  %rollback ID       put the VM back to a checkpoint (the model is told)\n"
    "  %checkpoint NAME   take a named checkpoint now\n"
    "  %save [FILE]       save the conversation (default: its file in the data dir)\n"
    "  %load FILE         load a conversation saved with %save\n"
    "  %net               the VM's network requests (with --net allow=...)\n"
    "  %tokens            tokens used this session\n"
    "  %screenshot [FILE] save the VM's screen as PNG (with --computer; default: the\n"
    "                     outputs directory)\n"
    "  %verbose           toggle request and run details\n"
    "  %auto-run on|off   run code without asking\n"
    "  %markdown [FILE]   export the conversation as Markdown (default: stdout)\n"
    "  %% CMD             run a shell command in the VM directly\n"
    "  %get PATH [DEST]   copy a file or directory out of the VM (default: here); from\n"
    "                     another terminal: airlock cp SESSION:PATH DEST (airlock ps)\n"
    "  %shell             a login shell on a terminal in the VM; exit (or Ctrl-]) returns\n"
    "                     here\n"
    "  Ctrl-C interrupts; twice within a second (exit 130), or Ctrl-D, exits: the VM\n"
    "  ends with the chat (new files in /workspace are offered first).\n";

struct repl {
    struct loopui u;
    struct cli_globals *g;
    EditLine *el;
    History *hist;
    char hist_path[AL_PATH_MAX];
    bool tty;
};

static int chat_getc(EditLine *el, wchar_t *wc)
{
    mbstate_t st;
    memset(&st, 0, sizeof(st));
    for (;;) {
        struct pollfd p[2] = {{.fd = 0, .events = POLLIN},
                              {.fd = loopui_cancel_fd(), .events = POLLIN}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (p[1].revents & POLLIN) {
            errno = EINTR;
            return -1; /* el_gets returns NULL; the caller sees the interrupt flag */
        }
        char ch;
        ssize_t n = read(0, &ch, 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return 0;
        /* Ctrl-D on an empty line leaves, whatever libedit has bound it to: under load a key
         * could arrive while libedit was switching terminal modes and be taken as text
         * (seen: the chat echoed ^D and kept waiting). */
        if (ch == 0x04) {
            const LineInfo *li = el_line(el);
            if (li && li->lastchar == li->buffer)
                return 0;
        }
        size_t r = mbrtowc(wc, &ch, 1, &st);
        if (r == (size_t)-2)
            continue; /* more bytes of this character follow */
        if (r == (size_t)-1) {
            memset(&st, 0, sizeof(st));
            *wc = (wchar_t)(unsigned char)ch;
        }
        return 1;
    }
}

static const char *prompt_fn(EditLine *el)
{
    (void)el;
    return "> ";
}

/* One line of input. Returns malloc'd text, NULL on EOF; *intr when Ctrl-C ended it. */
static char *read_input(struct repl *rp, const char *prompt, bool *intr)
{
    *intr = false;
    if (!rp->el) {
        if (rp->tty || isatty(1))
            fputs(prompt, stdout), fflush(stdout);
        char buf[8192];
        int n = loopui_read_line(0, buf, sizeof(buf));
        if (n == -2) {
            *intr = true;
            return NULL;
        }
        return n < 0 ? NULL : strdup(buf);
    }
    el_set(rp->el, EL_PROMPT, prompt_fn);
    int count = 0;
    const char *line = el_gets(rp->el, &count);
    if (!line) {
        if (loopui_interrupted() || count < 0) {
            *intr = loopui_interrupted();
            if (*intr)
                return NULL;
        }
        return NULL;
    }
    char *s = strdup(line);
    size_t l = s ? strlen(s) : 0;
    if (l && s[l - 1] == '\n')
        s[l - 1] = '\0';
    return s;
}

static void history_add(struct repl *rp, const char *text)
{
    if (!rp->hist || !*text)
        return;
    HistEvent ev;
    history(rp->hist, &ev, H_ENTER, text);
    if (rp->hist_path[0])
        history(rp->hist, &ev, H_SAVE, rp->hist_path);
}

static void setup_editline(struct repl *rp, const char *argv0)
{
    if (!rp->tty)
        return;
    rp->el = el_init(argv0, stdin, stdout, stderr);
    rp->hist = history_init();
    if (!rp->el || !rp->hist)
        return;
    HistEvent ev;
    history(rp->hist, &ev, H_SETSIZE, HISTORY_SIZE);
    history(rp->hist, &ev, H_SETUNIQUE, 1);
    el_set(rp->el, EL_HIST, history, rp->hist);
    el_set(rp->el, EL_EDITOR, "emacs");
    el_set(rp->el, EL_GETCFN, chat_getc);
    el_source(rp->el, NULL); /* the user's ~/.editrc */
    char dir[AL_PATH_MAX];
    al_error e = {0};
    if (al_data_dir("", dir, sizeof(dir), &e) == 0 &&
        al_pathf(rp->hist_path, sizeof(rp->hist_path), "%shistory", dir) == 0)
        history(rp->hist, &ev, H_LOAD, rp->hist_path);
}

static void save_conversation(struct repl *rp)
{
    al_error e = {0};
    if (al_conv_save(&rp->u.chat, &e) < 0)
        cli_error(&e);
}

static void direct_shell(struct repl *rp, const char *cmd)
{
    const char *argv[] = {"/bin/sh", "-c", cmd, NULL};
    struct cli_termout out;
    cli_termout_init(&out, true);
    al_exec_opts o = {.struct_size = sizeof(al_exec_opts),
                      .argv = argv,
                      .stdin_fd = -1,
                      .stdout_fd = 1,
                      .stderr_fd = 2,
                      .output = cli_termout_write,
                      .output_ctx = &out};
    al_exec_result r = AL_EXEC_RESULT_INIT;
    al_error e = {0};
    loopui_drain();
    int ret = al_exec(rp->u.session, &o, &r, &e);
    cli_termout_end(&out);
    if (ret < 0)
        cli_error(&e);
    else if (r.how != AL_EXEC_EXITED || r.value)
        fprintf(stderr, "[%s %d]\n", r.how == AL_EXEC_EXITED ? "exit status" : "signal", r.value);
}

/* %shell: the VM's login shell on this terminal, back to the chat when it ends. */
static void chat_shell(struct repl *rp)
{
    const char *argv[] = {"/bin/sh", "-c", AL_LOGIN_SHELL, NULL};
    al_exec_opts o = {.struct_size = sizeof(al_exec_opts),
                      .argv = argv,
                      .stdin_fd = -1,
                      .stdout_fd = 1,
                      .stderr_fd = 2};
    al_exec_result r = AL_EXEC_RESULT_INIT;
    al_error e = {0};
    struct cli_tty t;
    loopui_drain();
    int ret = cli_tty_open(&t, true, &o, &e);
    if (ret == 0)
        ret = al_exec(rp->u.session, &o, &r, &e);
    cli_tty_close(&t);
    if (ret < 0)
        cli_error(&e);
    else
        fprintf(stderr, "[back in the chat%s]\n", t.left ? ": left the shell with Ctrl-]" : "");
}

static void show_checkpoint(void *ctx, const al_checkpoint_info *ci)
{
    const al_chat *c = ctx;
    char when[16] = "?";
    time_t t = (time_t)ci->created;
    struct tm tm;
    if (localtime_r(&t, &tm))
        strftime(when, sizeof(when), "%H:%M:%S", &tm);
    printf("%3u %-12s %s %7.1f MiB%s  %s\n", ci->id, ci->name, when,
           (double)ci->disk_bytes / (1 << 20), ci->current ? " *" : "  ",
           al_chat_checkpoint_code(c, ci->id));
}

static void show_net_request(void *ctx, const al_net_request *r)
{
    (void)ctx;
    char when[16] = "?", why[sizeof(r->why) * 3];
    time_t t = (time_t)(r->time_ms / 1000);
    struct tm tm;
    if (localtime_r(&t, &tm))
        strftime(when, sizeof(when), "%H:%M:%S", &tm);
    /* Method and host are the guest's words, already printable ASCII (net.c). */
    printf("%s %-7s %s:%u %s %llu bytes%s%s\n", when, r->method, r->host, r->port,
           r->allowed ? "allowed" : "BLOCKED", (unsigned long long)r->bytes, r->why[0] ? ": " : "",
           al_term_escape(r->why, why, sizeof(why)));
}

/* PATH out of the chat's VM to host (a directory: into it, under PATH's last name), as
 * airlock cp does. Entries left out (links, .git/, exec bits held), or < 0 with err set. */
static int chat_get(al_session *s, const char *guest, const char *host, al_error *err)
{
    const char *name = strrchr(guest, '/');
    name = name ? name + 1 : guest;
    if (guest[0] != '/' || !*name || !strcmp(name, ".") || !strcmp(name, ".."))
        return al_err(err, -EINVAL, "'%s': an absolute path in the VM, naming a file", guest);
    char target[AL_PATH_MAX];
    struct stat hs;
    if (stat(host, &hs) == 0 && S_ISDIR(hs.st_mode))
        snprintf(target, sizeof(target), "%s/%s", host, name);
    else
        snprintf(target, sizeof(target), "%s", host);
    al_file_info st = AL_FILE_INFO_INIT;
    int r = al_file_stat(s, guest, &st, err);
    if (r < 0)
        return r;
    if (st.type != AL_ENTRY_DIR)
        return al_file_get_max(s, guest, target, AL_WORKDIR_BYTES_MAX_DEFAULT, err);
    if (mkdir(target, 0777) < 0)
        return al_err(err, -errno, "cannot create '%s': %s", target, strerror(errno));
    al_workdir_opts wo = AL_WORKDIR_OPTS_INIT;
    wo.guest_dir = guest;
    al_workdir_diff *d = NULL;
    r = al_workdir_diff_new(s, target, &wo, &d, err);
    if (r == 0) /* no .git/ and no exec bits: what the host would run unasked stays out */
        r = al_workdir_apply(d, 0, err);
    int left_out = 0;
    for (size_t i = 0; r >= 0 && i < al_workdir_diff_count(d); i++) {
        const al_change *c = al_workdir_diff_at(d, i);
        left_out += c->refused || c->held || c->result < 0;
    }
    al_workdir_diff_free(d);
    return r < 0 ? r : left_out;
}

static void say_got(const char *guest, const char *host, int r, const al_error *e)
{
    if (r < 0) {
        cli_error(e);
        return;
    }
    char g[256], h[256];
    printf("Copied %s to %s%s\n", al_term_escape(guest, g, sizeof(g)),
           al_term_escape(host, h, sizeof(h)),
           r > 0 ? " (some entries left out: links, .git/, exec bits)" : "");
}

struct names {
    int n;
    char shown[200];
};

static void add_name(void *ctx, const al_file_info *st)
{
    struct names *nm = ctx;
    char safe[64];
    size_t used = strlen(nm->shown);
    if (nm->n++ < 4 && used + 70 < sizeof(nm->shown))
        snprintf(nm->shown + used, sizeof(nm->shown) - used, "%s%s", used ? ", " : "",
                 al_term_escape(st->name, safe, sizeof(safe)));
}

/* Leaving a chat whose /workspace holds files that would go with the VM (no --workdir): say so
 * and offer to copy them out, or to keep the session up for airlock cp and airlock shell. */
static void offer_workspace(struct repl *rp)
{
    al_session *s = rp->u.session;
    if (!s || rp->u.opts->workdir)
        return;
    struct names nm = {0};
    al_error e = {0};
    if (al_file_list(s, AL_WORKDIR_GUEST_DIR, add_name, &nm, &e) <= 0)
        return;
    printf("/workspace holds %d entr%s (%s%s); they end with this VM.\n", nm.n,
           nm.n == 1 ? "y" : "ies", nm.shown, nm.n > 4 ? ", ..." : "");
    if (!rp->tty) {
        puts("Not kept: no terminal to ask on (%get PATH copies one out before leaving).");
        return;
    }
    char dir[64];
    const char *id = rp->u.chat.id[0] ? rp->u.chat.id : "chat";
    for (;;) {
        printf("[c]opy them to ./airlock-%.12s, [k]eep the session up, or [d]rop them? ", id);
        fflush(stdout);
        char key = 0;
        if (loopui_read_key(0, &key) < 0 || key == 'd' || key == 'D')
            return;
        if (key == 'c' || key == 'C') {
            snprintf(dir, sizeof(dir), "airlock-%.12s", id);
            int r = chat_get(s, AL_WORKDIR_GUEST_DIR, dir, &e);
            say_got(AL_WORKDIR_GUEST_DIR, dir, r, &e);
            if (r >= 0)
                return;
            e = (al_error){0};
            continue;
        }
        if (key == 'k' || key == 'K') {
            char name[64];
            al_term_escape(al_session_name(s), name, sizeof(name));
            printf("The session %s stays up: airlock cp %s:/workspace/FILE ., airlock shell %s."
                   "\nCtrl-C here ends it.\n",
                   name, name, name);
            fflush(stdout);
            struct pollfd p = {loopui_cancel_fd(), POLLIN, 0};
            while (poll(&p, 1, -1) < 0 && errno == EINTR)
                ;
            loopui_drain();
            return;
        }
    }
}

/* Returns true when the line was a magic command (handled). */
static bool magic(struct repl *rp, const char *line, bool *quit)
{
    al_chat *c = &rp->u.chat;
    if (line[0] != '%')
        return false;
    const char *arg = line + strcspn(line, " \t");
    arg += strspn(arg, " \t");
    size_t cl = strcspn(line, " \t");
    char cmd[32];
    snprintf(cmd, sizeof(cmd), "%.*s", (int)(cl < 31 ? cl : 31), line);
    al_error e = {0};
    if (!strcmp(cmd, "%%")) {
        if (*arg)
            direct_shell(rp, arg);
        else
            fputs("usage: %% CMD\n", stderr);
    } else if (!strcmp(cmd, "%shell")) {
        chat_shell(rp);
    } else if (!strcmp(cmd, "%get")) {
        char path[AL_PATH_MAX], dest[AL_PATH_MAX] = ".";
        int n = sscanf(arg, "%4095s %4095s", path, dest);
        if (n < 1) {
            fputs("usage: %get PATH [DEST] (a path in the VM; DEST on this machine)\n", stderr);
        } else {
            int r = chat_get(rp->u.session, path, dest, &e);
            say_got(path, dest, r, &e);
        }
    } else if (!strcmp(cmd, "%help")) {
        fputs(magic_help, stdout);
    } else if (!strcmp(cmd, "%reset")) {
        struct chat_opts *o = rp->u.opts;
        loopui_close(&rp->u);
        if (loopui_open(&rp->u, o, rp->g) != 0)
            *quit = true;
        else
            puts("A fresh VM and an empty conversation.");
    } else if (!strcmp(cmd, "%undo")) {
        bool vm = false;
        int r = al_chat_undo_vm(c, &vm, &e);
        if (r == -ENOENT) {
            puts("Nothing to undo.");
        } else if (r < 0) {
            cli_error(&e);
        } else {
            save_conversation(rp);
            puts(vm ? "Rolled the VM back and dropped the last exchange from the conversation."
                    : "Dropped the last exchange from the conversation (its runs changed "
                      "nothing that needed a checkpoint).");
        }
    } else if (!strcmp(cmd, "%net")) {
        if (!al_session_net(rp->u.session))
            puts("This session has no network (--net none).");
        else if (al_net_requests(rp->u.session, NULL, show_net_request, NULL, &e) == 0)
            puts("No requests yet.");
    } else if (!strcmp(cmd, "%checkpoints")) {
        if (al_checkpoint_list(rp->u.session, show_checkpoint, c, &e) < 0)
            cli_error(&e);
    } else if (!strcmp(cmd, "%rollback")) {
        if (!*arg)
            fputs("usage: %rollback ID (see %checkpoints)\n", stderr);
        else if (al_chat_rollback(c, arg, &e) < 0)
            cli_error(&e);
        else
            save_conversation(rp);
    } else if (!strcmp(cmd, "%checkpoint")) {
        al_checkpoint_info ci = AL_CHECKPOINT_INFO_INIT;
        int id = al_checkpoint_create(rp->u.session, *arg ? arg : NULL, &ci, &e);
        if (id < 0)
            cli_error(&e);
        else
            printf("Checkpoint %d%s%s taken (%u ms).\n", id, *arg ? " " : "", arg, ci.save_ms);
    } else if (!strcmp(cmd, "%save")) {
        int r = *arg ? al_conv_save_file(c, arg, &e) : al_conv_save(c, &e);
        if (r < 0)
            cli_error(&e);
        else
            printf("Saved to %s\n", *arg ? arg : c->save_path);
    } else if (!strcmp(cmd, "%load")) {
        if (!*arg)
            fputs("usage: %load FILE\n", stderr);
        else if (al_conv_load_file(c, arg, &e) < 0)
            cli_error(&e);
        else
            printf("Loaded %d messages.\n", cJSON_GetArraySize(c->messages));
    } else if (!strcmp(cmd, "%screenshot")) {
        al_screenshot shot = AL_SCREENSHOT_INIT;
        char host[AL_PATH_MAX];
        if (al_screen_capture(rp->u.session, NULL, &shot, &e) < 0) {
            cli_error(&e);
        } else if (*arg) {
            FILE *f = fopen(arg, "wbx");
            if (!f || fwrite(shot.png, 1, shot.len, f) != shot.len || fclose(f) != 0)
                fprintf(stderr, "airlock: cannot write '%s': %s\n", arg, strerror(errno));
            else
                printf("The screen (%ux%u) saved to %s\n", shot.width, shot.height, arg);
        } else {
            al_mime m = {.type = "image/png", .data = shot.png, .len = shot.len};
            if (al_figure_save(&c->figures, &m, host, sizeof(host), &e) < 0)
                cli_error(&e);
            else
                printf("The screen (%ux%u) saved to %s\n", shot.width, shot.height, host);
        }
        free(shot.png);
    } else if (!strcmp(cmd, "%tokens")) {
        printf("Tokens this session: %llu in, %llu out, %llu in all",
               (unsigned long long)c->input_tokens, (unsigned long long)c->output_tokens,
               (unsigned long long)(c->input_tokens + c->output_tokens));
        if (c->cfg.token_budget)
            printf(" of a budget of %llu", (unsigned long long)c->cfg.token_budget);
        unsigned est = 0;
        cJSON *m;
        cJSON_ArrayForEach(m, c->messages) est += al_chat_estimate(m);
        printf(".\nThe conversation is about %u tokens long.\n", est);
    } else if (!strcmp(cmd, "%verbose")) {
        rp->u.opts->verbose = !rp->u.opts->verbose;
        c->cfg.model.notice = rp->u.opts->verbose ? chat_model_notice : NULL;
        printf("Verbose %s.\n", rp->u.opts->verbose ? "on" : "off");
    } else if (!strcmp(cmd, "%auto-run")) {
        if (!strcmp(arg, "on"))
            c->cfg.auto_run = true;
        else if (!strcmp(arg, "off"))
            c->cfg.auto_run = false;
        else if (*arg)
            fputs("usage: %auto-run on|off\n", stderr);
        printf("Auto-run is %s.\n", c->cfg.auto_run ? "on" : "off");
    } else if (!strcmp(cmd, "%markdown")) {
        FILE *f = *arg ? fopen(arg, "we") : stdout;
        if (!f) {
            fprintf(stderr, "airlock: cannot write %s: %s\n", arg, strerror(errno));
        } else {
            if (al_conv_markdown(c, f, &e) < 0)
                cli_error(&e);
            if (f != stdout) {
                fclose(f);
                printf("Exported to %s\n", arg);
            }
        }
    } else {
        fprintf(stderr, "Unknown command %s; %%help lists them.\n", cmd);
    }
    return true;
}

/* Reads a message: one line, or the lines between two """ lines. */
static char *read_message(struct repl *rp, bool *intr)
{
    char *line = read_input(rp, "> ", intr);
    if (!line || strcmp(line, "\"\"\""))
        return line;
    free(line);
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    if (!m)
        return NULL;
    for (;;) {
        char *l = read_input(rp, "… ", intr);
        if (!l) {
            fclose(m);
            free(buf);
            return NULL;
        }
        if (!strcmp(l, "\"\"\"")) {
            free(l);
            break;
        }
        fprintf(m, "%s%s", len ? "\n" : "", l);
        fflush(m);
        free(l);
        if (len > MESSAGE_MAX) {
            fclose(m);
            free(buf);
            fprintf(stderr, "airlock: a message is limited to %d bytes\n", MESSAGE_MAX);
            return strdup("");
        }
    }
    fclose(m);
    return buf;
}

int cmd_chat(struct cli_globals *g, int argc, char **argv)
{
    struct chat_opts o;
    int r = chat_opts_parse(&o, g, argc, argv, usage, false);
    if (r)
        return r == 1 ? 0 : r;
    if (o.resume && !o.resume_id && o.nrest == 1) { /* --resume ID, not only --resume=ID */
        o.resume_id = o.rest[0];
        o.nrest = 0;
    }
    if (o.nrest) {
        fprintf(stderr,
                "airlock: chat takes no arguments; for a one-shot task use 'airlock run'\n");
        chat_opts_free(&o);
        return 2;
    }
    setlocale(LC_CTYPE, "");
    if (loopui_signals() < 0) {
        perror("airlock: pipe");
        return EXIT_AIRLOCK_FAILED;
    }
    struct repl rp = {.g = g, .tty = isatty(0) && !o.jsonl};
    rp.u.confirm_fd = o.jsonl ? -1 : 0;
    rp.u.lmc = o.jsonl;
    r = loopui_open(&rp.u, &o, g);
    if (r) {
        chat_opts_free(&o);
        return r;
    }
    if (o.resume) {
        al_error e = {0};
        if (al_conv_load(&rp.u.chat, o.resume_id, &e) < 0) {
            cli_error(&e);
            loopui_close(&rp.u);
            chat_opts_free(&o);
            return 1;
        }
        if (!o.jsonl) {
            printf("Resumed conversation %s (%d messages) in a fresh VM. Where it ended:\n",
                   rp.u.chat.id, cJSON_GetArraySize(rp.u.chat.messages));
            al_conv_recap(&rp.u.chat, 3, stdout, &e);
        }
    }
    if (o.jsonl) { /* JSON lines both ways, no terminal (lmc.c) */
        loopui_sigint_stays();
        int status = lmc_serve(&rp.u);
        if (loopui_close(&rp.u) && !status)
            status = 1;
        chat_opts_free(&o);
        return status;
    }
    setup_editline(&rp, argv[0]);
    if (rp.tty)
        printf("Airlock %s: code runs in a disposable VM (%s%s). %%help for commands, Ctrl-D "
               "to leave.\n",
               AIRLOCK_VERSION, al_session_kvm(rp.u.session) ? "KVM" : "emulated", "");
    bool quit = false;
    int status = 0;
    while (!quit && !loopui_quit()) {
        loopui_drain();
        bool intr = false;
        char *text = read_message(&rp, &intr);
        if (!text) {
            if (intr && !loopui_quit()) {
                fputs("^C (press Ctrl-C again within a second, or Ctrl-D, to leave)\n", stdout);
                continue;
            }
            if (!intr)
                putchar('\n');
            break;
        }
        if (!*text) {
            free(text);
            continue;
        }
        history_add(&rp, text);
        if (magic(&rp, text, &quit)) {
            free(text);
            continue;
        }
        loopui_drain();
        enum al_chat_outcome out = AL_CHAT_DONE;
        al_error e = {0};
        r = al_chat_turn(&rp.u.chat, text, &out, &e);
        free(text);
        if (r < 0)
            cli_error(&e);
        else if (out == AL_CHAT_CANCELLED)
            fputs("Interrupted.\n", stdout);
        save_conversation(&rp);
    }
    if (rp.el)
        el_end(rp.el);
    if (rp.hist)
        history_end(rp.hist);
    if (!loopui_quit())
        offer_workspace(&rp);
    else /* Ctrl-C twice, a SIGTERM or SIGHUP: as a shell reports a signal's end */
        status = 128 + loopui_quit_signal();
    if (loopui_close(&rp.u) && !status)
        status = 1;
    chat_opts_free(&o);
    return status;
}

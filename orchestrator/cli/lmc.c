/* airlock chat --jsonl: the chat as JSON lines both ways, in Open Interpreter's LMC format, so
 * that any language embeds the loop (the Python client's Interpreter is built on it).
 *
 * Out (stdout, one object a line, flushed): chunks {"role", "type", "format"?, "content"?} with
 * "start"/"end" flags around each message: assistant message and code, computer console output
 * (format "output") and images (format "base64.png"), a computer "confirmation" when runs are
 * confirmed; server "status" lines: "ready" (with the session's name) once, "complete" (with
 * the turn's outcome) after each request; server "notice" and "error" lines.
 *
 * In (stdin, one object a line): {"role": "user", "type": "message", "content": TEXT} (a turn),
 * {"role": "user", "type": "confirmation", "content": true|false} (the answer a confirmation
 * waits for), {"role": "computer", "type": "code", "format": LANG, "content": CODE} (run code
 * in the VM's kernel without the model), {"role": "user", "type": "command", "content":
 * "reset"|"undo"|"screenshot"} ("input" with "actions": mouse and keyboard, with --computer),
 * {"role": "user", "type": "messages", "content": [LMC messages]} (the conversation replaced).
 * SIGINT stops the model and the running code, as Ctrl-C does. */
#include "loopui.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One input line at most: a message, a conversation to restore. */
#define LMC_LINE_MAX (8u << 20)

static struct {
    bool in_text, in_console;
    char *pending;     /* a line read while a confirmation waited that was not its answer */
    struct loopui *ui; /* lmc_serve's */
} st;

static void emit(cJSON *j)
{
    char *s = cJSON_PrintUnformatted(j);
    if (s) {
        fputs(s, stdout);
        fputc('\n', stdout);
        fflush(stdout);
    }
    free(s);
    cJSON_Delete(j);
}

/* A chunk; flag 1: "start", 2: "end", 0: content (NULL: none). */
static void chunk(const char *role, const char *type, const char *format, const char *content,
                  size_t len, int flag)
{
    emit(al_lmc_chunk(role, type, format, content, len, flag));
}

static void server(const char *type, const char *content)
{
    chunk("server", type, NULL, content, content ? strlen(content) : 0, 0);
}

static void text_close(void)
{
    if (st.in_text)
        chunk("assistant", "message", NULL, NULL, 0, 2);
    st.in_text = false;
}

static void on_text(void *ctx, const char *s, size_t n)
{
    (void)ctx;
    if (!st.in_text)
        chunk("assistant", "message", NULL, NULL, 0, 1);
    st.in_text = true;
    chunk("assistant", "message", NULL, s, n, 0);
}

static void on_text_end(void *ctx)
{
    (void)ctx;
    text_close();
}

static void on_code(void *ctx, const char *lang, const char *code)
{
    (void)ctx;
    text_close();
    chunk("assistant", "code", lang, NULL, 0, 1);
    chunk("assistant", "code", lang, code, strlen(code), 0);
    chunk("assistant", "code", lang, NULL, 0, 2);
}

/* The next input line, parsed (NULL at the end of input). */
static cJSON *read_line(void)
{
    if (st.pending) {
        cJSON *j = cJSON_Parse(st.pending);
        free(st.pending);
        st.pending = NULL;
        return j ? j : cJSON_CreateObject();
    }
    char *line = NULL;
    size_t cap = 0;
    for (;;) {
        errno = 0;
        ssize_t n = getline(&line, &cap, stdin);
        if (n < 0 && errno == EINTR && !loopui_quit()) { /* a stop while idle: nothing to do */
            clearerr(stdin);
            continue;
        }
        if (n < 0) {
            free(line);
            return NULL;
        }
        if ((size_t)n > LMC_LINE_MAX) {
            server("error", "an input line is over 8 MiB");
            continue;
        }
        if (strspn(line, " \t\r\n") == (size_t)n)
            continue;
        cJSON *j = cJSON_Parse(line);
        if (!cJSON_IsObject(j)) {
            cJSON_Delete(j);
            server("error", "an input line is not a JSON object");
            continue;
        }
        free(line);
        return j;
    }
}

static const char *jstr(const cJSON *j, const char *k)
{
    return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, k));
}

static const char *run_direct(struct loopui *u, const char *lang, const char *code);
static void status_complete(const char *outcome);

/* A confirmation's answer: true runs. Code to run directly meanwhile (a look at the VM before
 * answering) runs; another request declines, and is taken next. */
static int answer(void)
{
    cJSON *j;
    for (;;) {
        j = read_line();
        if (!j)
            return 0;
        const char *role = jstr(j, "role"), *type = jstr(j, "type"), *lang = jstr(j, "format");
        const char *code = jstr(j, "content");
        if (!role || !type || strcmp(role, "computer") || strcmp(type, "code") || !code || !st.ui)
            break;
        status_complete(run_direct(st.ui, lang ? lang : "python", code));
        cJSON_Delete(j);
    }
    const char *type = jstr(j, "type");
    int yes = 0;
    if (type && !strcmp(type, "confirmation")) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "content");
        yes = cJSON_IsTrue(c) || (cJSON_IsString(c) &&
                                  (!strcmp(c->valuestring, "y") || !strcmp(c->valuestring, "yes")));
    } else {
        st.pending = cJSON_PrintUnformatted(j);
    }
    cJSON_Delete(j);
    return yes;
}

/* A confirmation chunk of format (content: its object, taken), then its answer. */
static int confirmation(const char *format, cJSON *content)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "role", "computer");
    cJSON_AddStringToObject(j, "type", "confirmation");
    cJSON_AddStringToObject(j, "format", format);
    cJSON_AddItemToObject(j, "content", content);
    emit(j);
    return answer();
}

static int on_confirm(void *ctx, const char *lang, char **code)
{
    (void)ctx;
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "type", "code");
    cJSON_AddStringToObject(c, "format", lang);
    cJSON_AddStringToObject(c, "content", *code);
    return confirmation("execution", c);
}

static int on_acknowledge(void *ctx, const char *code, const char *message)
{
    (void)ctx;
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "code", code ? code : "");
    cJSON_AddStringToObject(c, "message", message ? message : "");
    return confirmation("safety_check", c);
}

static void on_run_start(void *ctx, const char *lang, bool cold)
{
    (void)ctx, (void)lang, (void)cold;
    text_close();
    chunk("computer", "console", NULL, NULL, 0, 1);
    st.in_console = true;
}

static int on_output(void *ctx, int stream, const uint8_t *data, size_t n)
{
    (void)ctx, (void)stream;
    if (n)
        chunk("computer", "console", "output", (const char *)data, n, 0);
    return 0;
}

static void on_result(void *ctx, const al_result *r)
{
    (void)ctx;
    static const char *const kinds[][2] = {{"image/png", "base64.png"},
                                           {"image/jpeg", "base64.jpeg"}};
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        const al_mime *m = al_result_mime(r, kinds[i][0]);
        if (!m)
            continue;
        char *b64 = malloc((m->len + 2) / 3 * 4 + 1);
        if (!b64)
            return;
        int n = EVP_EncodeBlock((unsigned char *)b64, m->data, (int)m->len);
        chunk("computer", "image", kinds[i][1], b64, n > 0 ? (size_t)n : 0, 0);
        free(b64);
        return;
    }
    const al_mime *html = al_result_mime(r, "text/html");
    if (html)
        chunk("computer", "code", "html", (const char *)html->data, html->len, 0);
}

static void on_run_end(void *ctx, const al_exec_result *r, const char *summary)
{
    (void)ctx, (void)r, (void)summary;
    if (st.in_console)
        chunk("computer", "console", NULL, NULL, 0, 2);
    st.in_console = false;
}

static void on_notice(void *ctx, const char *msg)
{
    (void)ctx;
    server("notice", msg);
}

void lmc_ui(al_chat_ui *ui)
{
    ui->thinking = NULL;
    ui->text = on_text;
    ui->text_end = on_text_end;
    ui->code = on_code;
    ui->confirm = on_confirm;
    ui->acknowledge = on_acknowledge;
    ui->run_start = on_run_start;
    ui->output = on_output;
    ui->run_end = on_run_end;
    ui->result = on_result;
    ui->notice = on_notice;
    ui->message = NULL;
}

void lmc_error(const char *msg)
{
    server("error", msg);
}

static int direct_result(void *ctx, const al_result *r)
{
    on_result(ctx, r);
    return 0;
}

/* Runs code in the session's kernel without the model (the Python API's computer.run): its
 * output and images as a run's chunks; "outcome" the run's end. */
static const char *run_direct(struct loopui *u, const char *lang, const char *code)
{
    static char outcome[64];
    const char *argv[] = {code, NULL};
    al_exec_opts o = {.struct_size = sizeof(al_exec_opts),
                      .argv = argv,
                      .lang = lang,
                      .kernel = true,
                      .cwd = AL_WORKDIR_GUEST_DIR,
                      .stdin_fd = -1,
                      .stdout_fd = -1,
                      .stderr_fd = -1,
                      .output = on_output,
                      .result = direct_result};
    al_exec_result res = AL_EXEC_RESULT_INIT;
    al_error e = {0};
    on_run_start(NULL, lang, false);
    int r = al_exec(u->session, &o, &res, &e);
    on_run_end(NULL, &res, NULL);
    if (r < 0) {
        server("error", e.msg);
        return "error";
    }
    snprintf(outcome, sizeof(outcome), "%s %d", res.how == AL_EXEC_EXITED ? "exited" : "signaled",
             res.value);
    return outcome;
}

/* The screen now, as one image chunk (a session with a display: --computer). */
static const char *screenshot(struct loopui *u)
{
    al_screenshot shot = AL_SCREENSHOT_INIT;
    al_error e = {0};
    if (al_screen_capture(u->session, NULL, &shot, &e) < 0) {
        server("error", e.msg);
        return "error";
    }
    char *b64 = malloc((shot.len + 2) / 3 * 4 + 1);
    int n = b64 ? EVP_EncodeBlock((unsigned char *)b64, shot.png, (int)shot.len) : -1;
    if (n >= 0)
        chunk("computer", "image", "base64.png", b64, (size_t)n, 0);
    free(b64);
    free(shot.png);
    return n >= 0 ? "done" : "error";
}

/* Mouse and keyboard actions (al_screen_input's JSON list), in the screen's own pixels. */
static const char *input(struct loopui *u, const cJSON *actions)
{
    if (!cJSON_IsArray(actions)) {
        server("error", "input needs \"actions\": a list of actions");
        return "error";
    }
    char *text = cJSON_PrintUnformatted(actions);
    al_error e = {0};
    int r = text ? al_screen_input(u->session, text, 0, 0, NULL, NULL, NULL, &e) : -ENOMEM;
    free(text);
    if (r < 0) {
        server("error", e.msg[0] ? e.msg : "out of memory");
        return "error";
    }
    return "done";
}

static void status_complete(const char *outcome)
{
    cJSON *done = cJSON_CreateObject();
    cJSON_AddStringToObject(done, "role", "server");
    cJSON_AddStringToObject(done, "type", "status");
    cJSON_AddStringToObject(done, "content", "complete");
    cJSON_AddStringToObject(done, "outcome", outcome);
    emit(done);
}

int lmc_serve(struct loopui *u)
{
    st.ui = u;
    char name[128];
    snprintf(name, sizeof(name), "%s", al_session_name(u->session));
    cJSON *ready = cJSON_CreateObject();
    cJSON_AddStringToObject(ready, "role", "server");
    cJSON_AddStringToObject(ready, "type", "status");
    cJSON_AddStringToObject(ready, "content", "ready");
    cJSON_AddStringToObject(ready, "session", name);
    emit(ready);
    int status = 0;
    cJSON *j;
    while (!loopui_quit() && (j = read_line())) {
        loopui_drain();
        const char *role = jstr(j, "role"), *type = jstr(j, "type");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(j, "content");
        const char *outcome = "done";
        al_error e = {0};
        if (role && type && !strcmp(role, "user") && !strcmp(type, "message") &&
            cJSON_IsString(content)) {
            enum al_chat_outcome out = AL_CHAT_DONE;
            int r = al_chat_turn(&u->chat, content->valuestring, &out, &e);
            text_close();
            if (r < 0) {
                server("error", e.msg);
                outcome = "error";
            } else {
                outcome = al_chat_outcome_str(out);
            }
        } else if (role && type && !strcmp(role, "computer") && !strcmp(type, "code") &&
                   cJSON_IsString(content)) {
            const char *lang = jstr(j, "format");
            outcome = run_direct(u, lang ? lang : "python", content->valuestring);
        } else if (type && !strcmp(type, "command") && cJSON_IsString(content) &&
                   !strcmp(content->valuestring, "screenshot")) {
            outcome = screenshot(u);
        } else if (type && !strcmp(type, "command") && cJSON_IsString(content) &&
                   !strcmp(content->valuestring, "input")) {
            outcome = input(u, cJSON_GetObjectItemCaseSensitive(j, "actions"));
        } else if (type && !strcmp(type, "command") && cJSON_IsString(content) &&
                   !strcmp(content->valuestring, "reset")) {
            al_chat_reset(&u->chat);
        } else if (type && !strcmp(type, "command") && cJSON_IsString(content) &&
                   !strcmp(content->valuestring, "undo")) {
            bool vm = false;
            if (al_chat_undo_vm(&u->chat, &vm, &e) < 0 && e.code != -ENOENT) {
                server("error", e.msg);
                outcome = "error";
            }
        } else if (type && !strcmp(type, "messages") && cJSON_IsArray(content)) {
            char why[160] = "";
            cJSON *conv = al_chat_from_lmc(content, why, sizeof(why));
            if (!conv) {
                server("error", why[0] ? why : "out of memory");
                outcome = "error";
            } else {
                cJSON_Delete(u->chat.messages);
                u->chat.messages = conv;
            }
        } else if (type && !strcmp(type, "confirmation")) {
            server("error", "no confirmation is waiting");
            outcome = "error";
        } else {
            server("error", "not a request of airlock chat --jsonl (see airlock(1))");
            outcome = "error";
        }
        cJSON_Delete(j);
        status_complete(outcome);
    }
    free(st.pending);
    st.pending = NULL;
    if (loopui_quit())
        status = 128 + loopui_quit_signal();
    return status;
}

/* Streamed rendering: text is written as it arrives, so styles are a small state machine over
 * characters rather than a parse of whole documents. */
#include "render.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define C_RESET "\033[0m"
#define C_BOLD "\033[1m"
#define C_DIM "\033[2m"
#define C_CODE "\033[36m"
#define C_KEYWORD "\033[35m"
#define C_STRING "\033[32m"
#define C_COMMENT "\033[2;37m"

void render_init(struct render *r, FILE *out, bool plain)
{
    memset(r, 0, sizeof(*r));
    r->out = out;
    r->color = !plain && isatty(fileno(out)) && !getenv("NO_COLOR");
    r->line_start = true;
    pthread_mutex_init(&r->spin_lock, NULL);
    pthread_cond_init(&r->spin_cond, NULL);
}

static void style(struct render *r)
{
    fputs(C_RESET, r->out);
    if (r->in_fence)
        fputs(C_CODE, r->out);
    if (r->bold || r->heading)
        fputs(C_BOLD, r->out);
    if (r->code)
        fputs(C_CODE, r->out);
}

static void flush_pending(struct render *r)
{
    bool fence =
        r->npending >= 3 && (!strncmp(r->pending, "```", 3) || !strncmp(r->pending, "~~~", 3));
    if (fence) {
        r->in_fence = !r->in_fence;
        fputs(C_DIM, r->out);
        fwrite(r->pending, 1, (size_t)r->npending, r->out);
        style(r);
    } else {
        if (!r->in_fence && r->npending && r->pending[0] == '#') {
            r->heading = true;
            style(r);
        }
        fwrite(r->pending, 1, (size_t)r->npending, r->out);
    }
    r->npending = 0;
}

static void put_char(struct render *r, char ch)
{
    if (!r->color) {
        fputc(ch, r->out);
        r->line_start = ch == '\n'; /* the text's end gets its newline (render_text_end) */
        return;
    }
    if (r->line_start) {
        if (ch != '\n' && r->npending < 3) {
            r->pending[r->npending++] = ch;
            return;
        }
        flush_pending(r);
        r->line_start = false;
    }
    if (ch == '\n') {
        r->heading = false;
        r->bold = false;
        r->code = false;
        r->star = 0;
        style(r);
        fputc('\n', r->out);
        r->line_start = true;
        return;
    }
    if (r->in_fence) {
        fputc(ch, r->out);
        return;
    }
    if (ch == '`') {
        r->code = !r->code;
        style(r);
        return;
    }
    if (ch == '*' && !r->code) {
        if (r->star == '*') { /* "**" toggles bold */
            r->star = 0;
            r->bold = !r->bold;
            style(r);
            return;
        }
        r->star = '*';
        return;
    }
    if (r->star) {
        fputc(r->star, r->out);
        r->star = 0;
    }
    fputc(ch, r->out);
}

/* The model's text may repeat the guest's escape sequences: they are shown, not obeyed. */
void render_text(struct render *r, const char *s, size_t n)
{
    char safe[AL_TERM_OUT_MAX(1024)];
    for (size_t off = 0; off < n;) {
        size_t take = n - off < 1024 ? n - off : 1024;
        size_t len = al_term_sanitize(&r->term, s + off, take, safe);
        for (size_t i = 0; i < len; i++)
            put_char(r, safe[i]);
        off += take;
    }
    fflush(r->out);
}

void render_text_end(struct render *r)
{
    char tail[4];
    size_t len = al_term_sanitize_end(&r->term, tail);
    for (size_t i = 0; i < len; i++)
        put_char(r, tail[i]);
    if (r->color) {
        if (r->line_start && r->npending) {
            flush_pending(r);
            r->line_start = false; /* the held characters still need their newline */
        }
        if (r->star)
            fputc(r->star, r->out);
        r->star = 0;
        r->in_fence = r->bold = r->code = r->heading = false;
        fputs(C_RESET, r->out);
        if (!r->line_start)
            fputc('\n', r->out);
    } else if (!r->line_start) {
        fputc('\n', r->out);
    }
    r->line_start = true;
    r->npending = 0;
    fflush(r->out);
}

static bool is_word(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

static bool keyword(const char *lang, const char *w, size_t n)
{
    static const char *const py[] = {"def",     "class", "import",   "from",  "return", "if",
                                     "elif",    "else",  "for",      "while", "in",     "not",
                                     "and",     "or",    "with",     "as",    "try",    "except",
                                     "finally", "raise", "lambda",   "None",  "True",   "False",
                                     "pass",    "break", "continue", "yield", NULL};
    static const char *const sh[] = {"if",       "then",   "else",   "elif",  "fi",   "for",
                                     "while",    "do",     "done",   "case",  "esac", "in",
                                     "function", "return", "export", "local", NULL};
    static const char *const js[] = {"function", "const",  "let",   "var",    "return", "if",
                                     "else",     "for",    "while", "class",  "new",    "await",
                                     "async",    "import", "from",  "export", "null",   "undefined",
                                     "true",     "false",  NULL};
    const char *const *k = !strncmp(lang, "py", 2)                            ? py
                           : !strncmp(lang, "java", 4) || !strcmp(lang, "js") ? js
                                                                              : sh;
    for (; *k; k++)
        if (strlen(*k) == n && !strncmp(*k, w, n))
            return true;
    return false;
}

/* Light highlighting: keywords, strings and comments, a line at a time. */
static void code_line(struct render *r, const char *lang, const char *s, size_t n)
{
    bool hash_comments = strncmp(lang, "java", 4) != 0;
    for (size_t i = 0; i < n;) {
        if ((hash_comments && s[i] == '#') ||
            (!hash_comments && i + 1 < n && s[i] == '/' && s[i + 1] == '/')) {
            fputs(C_COMMENT, r->out);
            fwrite(s + i, 1, n - i, r->out);
            break;
        }
        if (s[i] == '"' || s[i] == '\'') {
            size_t j = i + 1;
            while (j < n && s[j] != s[i])
                j += s[j] == '\\' ? 2 : 1;
            j = j < n ? j + 1 : n;
            fputs(C_STRING, r->out);
            fwrite(s + i, 1, j - i, r->out);
            fputs(C_RESET, r->out);
            i = j;
            continue;
        }
        if (is_word(s[i])) {
            size_t j = i;
            while (j < n && is_word(s[j]))
                j++;
            bool kw = keyword(lang, s + i, j - i);
            if (kw)
                fputs(C_KEYWORD, r->out);
            fwrite(s + i, 1, j - i, r->out);
            if (kw)
                fputs(C_RESET, r->out);
            i = j;
            continue;
        }
        fputc(s[i++], r->out);
    }
    fputs(C_RESET, r->out);
}

static void render_code_safe(struct render *r, const char *lang, const char *code);

/* Code is shown for the user to confirm: an escape sequence in it could hide what would run. */
void render_code(struct render *r, const char *lang_raw, const char *code_raw)
{
    char lang[64];
    al_term_escape(lang_raw, lang, sizeof(lang));
    size_t n = strlen(code_raw);
    char *code = malloc(AL_TERM_OUT_MAX(n) + 1);
    if (!code)
        return;
    al_term_state st = {0};
    size_t len = al_term_sanitize(&st, code_raw, n, code);
    len += al_term_sanitize_end(&st, code + len);
    code[len] = '\0';
    render_code_safe(r, lang, code);
    free(code);
}

static void render_code_safe(struct render *r, const char *lang, const char *code)
{
    if (!r->color) {
        fprintf(r->out, "```%s\n%s%s```\n", lang, code,
                *code && code[strlen(code) - 1] == '\n' ? "" : "\n");
        fflush(r->out);
        return;
    }
    fprintf(r->out, C_DIM "── %s ──" C_RESET "\n", lang);
    for (const char *p = code; *p;) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        fputs("  ", r->out);
        code_line(r, lang, p, n);
        fputc('\n', r->out);
        p += n + (e ? 1 : 0);
    }
    fputs(C_DIM "──" C_RESET "\n", r->out);
    fflush(r->out);
}

static void *spin_main(void *arg)
{
    struct render *r = arg;
    static const char *const frames[] = {"⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"};
    unsigned i = 0;
    pthread_mutex_lock(&r->spin_lock);
    while (r->spinning) {
        fprintf(stderr, "\r" C_DIM "%s %s" C_RESET "\033[K", frames[i++ % 10], r->spin_label);
        fflush(stderr);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&r->spin_cond, &r->spin_lock, &ts);
    }
    fputs("\r\033[K", stderr);
    fflush(stderr);
    pthread_mutex_unlock(&r->spin_lock);
    return NULL;
}

void render_spinner(struct render *r, const char *label)
{
    if (!r->color || !isatty(2))
        return;
    if (label && !r->spinning) {
        r->spin_label = label;
        r->spinning = true;
        if (pthread_create(&r->spin_thread, NULL, spin_main, r) != 0)
            r->spinning = false;
    } else if (!label && r->spinning) {
        pthread_mutex_lock(&r->spin_lock);
        r->spinning = false;
        pthread_cond_signal(&r->spin_cond);
        pthread_mutex_unlock(&r->spin_lock);
        pthread_join(r->spin_thread, NULL);
    }
}

void render_line(struct render *r, const char *line)
{
    pthread_mutex_lock(&r->spin_lock);
    fprintf(stderr, "%s%s\n", r->spinning ? "\r\033[K" : "", line);
    fflush(stderr);
    pthread_mutex_unlock(&r->spin_lock);
}

void render_fini(struct render *r)
{
    render_spinner(r, NULL);
    pthread_mutex_destroy(&r->spin_lock);
    pthread_cond_destroy(&r->spin_cond);
}

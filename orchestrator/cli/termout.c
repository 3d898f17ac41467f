/* Guest output on the user's terminal, through al_term_sanitize: the writer the chat, run and
 * 'airlock exec' (on a terminal, without --raw) hand to al_exec; through al_term_pass for a
 * terminal run (exec -t, shell, %shell). */
#include "cli.h"

#include <unistd.h>

void cli_termout_init(struct cli_termout *t, bool force)
{
    *t = (struct cli_termout){0};
    for (int i = 0; i < 2; i++)
        t->on[i] = force || isatty(i + 1);
}

void cli_termout_init_pass(struct cli_termout *t)
{
    *t = (struct cli_termout){.on = {true, true}, .pass = true};
}

bool cli_termout_any(const struct cli_termout *t)
{
    return t->on[0] || t->on[1];
}

int cli_termout_write(void *ctx, int stream, const uint8_t *data, size_t n)
{
    struct cli_termout *t = ctx;
    int i = stream == 2 ? 1 : 0;
    if (!t->on[i])
        return al_write_all(i + 1, data, n);
    char out[AL_TERM_PASS_OUT_MAX(4096)];
    for (size_t off = 0; off < n;) {
        size_t take = n - off < 4096 ? n - off : 4096;
        size_t len = t->pass ? al_term_pass(&t->ps[i], data + off, take, out)
                             : al_term_sanitize(&t->st[i], data + off, take, out);
        int r = al_write_all(i + 1, out, len);
        if (r < 0)
            return r;
        off += take;
    }
    return 0;
}

void cli_termout_end(struct cli_termout *t)
{
    for (int i = 0; i < 2; i++) {
        char out[4];
        size_t len = t->on[i] && !t->pass ? al_term_sanitize_end(&t->st[i], out) : 0;
        if (len)
            (void)al_write_all(i + 1, out, len);
    }
}

void cli_print_notice(void *ctx, const char *msg)
{
    (void)ctx;
    char safe[1024];
    fprintf(stderr, "airlock: notice: %s\n", al_term_escape(msg, safe, sizeof(safe)));
}

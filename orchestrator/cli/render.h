/* Terminal output for the model loop: streamed Markdown-ish text, highlighted code, a spinner.
 * With plain set (or not a TTY) no styles are added. Control characters in the text and code
 * are always shown, not obeyed (al_term_sanitize): the model may repeat the guest's. */
#ifndef AIRLOCK_CLI_RENDER_H
#define AIRLOCK_CLI_RENDER_H

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>

#include "airlock.h"
#include "airlock/policy.h"
#include "airlock/text.h"

struct render {
    FILE *out;
    bool color;
    /* streaming Markdown state */
    bool line_start;
    bool in_fence;
    bool bold, code, heading;
    char pending[8]; /* a line's first characters, held until we know if they open a fence */
    int npending;
    char star;          /* a '*' or '`' held to see if it pairs */
    al_term_state term; /* control characters in the text are made visible */
    /* spinner */
    pthread_t spin_thread;
    pthread_mutex_t spin_lock;
    pthread_cond_t spin_cond;
    bool spinning;
    const char *spin_label;
};

void render_init(struct render *r, FILE *out, bool plain);
void render_text(struct render *r, const char *s, size_t n);
void render_text_end(struct render *r);
void render_code(struct render *r, const char *lang, const char *code);
void render_spinner(struct render *r, const char *label); /* NULL stops it */
/* One line on stderr, on a line of its own even while the spinner turns (it is cleared first
 * and redrawn on its next tick). */
void render_line(struct render *r, const char *line);
void render_fini(struct render *r);

#endif

/* Run output for the model: the first half of the limit and the last half are kept, the middle is
 * dropped with a note. Open Interpreter keeps only the tail; errors usually sit at the end but the
 * start says what the program was doing, so both matter. */
#include "chat.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int al_capture_init(al_capture *cap, size_t limit)
{
    memset(cap, 0, sizeof(*cap));
    if (limit < 2)
        limit = 2;
    cap->limit = limit;
    cap->tail_cap = limit - limit / 2;
    cap->head = malloc(limit / 2 + 1);
    cap->tail = malloc(cap->tail_cap);
    if (!cap->head || !cap->tail) {
        al_capture_free(cap);
        return -ENOMEM;
    }
    return 0;
}

void al_capture_add(al_capture *cap, const void *data, size_t n)
{
    const char *p = data;
    cap->total += n;
    size_t head_room = cap->limit / 2 - cap->head_len;
    size_t h = n < head_room ? n : head_room;
    memcpy(cap->head + cap->head_len, p, h);
    cap->head_len += h;
    p += h;
    n -= h;
    if (n >= cap->tail_cap) { /* only the last tail_cap bytes can survive */
        p += n - cap->tail_cap;
        n = cap->tail_cap;
    }
    while (n) {
        size_t run = cap->tail_cap - cap->tail_pos;
        if (run > n)
            run = n;
        memcpy(cap->tail + cap->tail_pos, p, run);
        cap->tail_pos = (cap->tail_pos + run) % cap->tail_cap;
        p += run;
        n -= run;
    }
}

/* Moves a cut point forward past UTF-8 continuation bytes so no character is split. */
static size_t utf8_start(const char *s, size_t len, size_t i)
{
    while (i < len && ((unsigned char)s[i] & 0xC0) == 0x80)
        i++;
    return i;
}

char *al_capture_text(const al_capture *cap)
{
    uint64_t in_tail = cap->total - cap->head_len;
    if (in_tail > cap->tail_cap)
        in_tail = cap->tail_cap;
    size_t tl = (size_t)in_tail;
    char *tail = malloc(tl + 1);
    if (!tail)
        return NULL;
    /* Unroll the ring: the oldest kept byte sits at tail_pos once the ring has wrapped. */
    size_t start = (cap->tail_pos + cap->tail_cap - tl) % cap->tail_cap;
    for (size_t i = 0; i < tl; i++)
        tail[i] = cap->tail[(start + i) % cap->tail_cap];
    uint64_t dropped = cap->total - cap->head_len - tl;
    size_t hl = cap->head_len;
    size_t skip = 0;
    if (dropped) {
        /* Cut on character boundaries: the head loses a partial last character, the tail a
         * partial first one. */
        while (hl && ((unsigned char)cap->head[hl - 1] & 0xC0) == 0x80)
            hl--;
        if (hl && (unsigned char)cap->head[hl - 1] >= 0xC0)
            hl--;
        skip = utf8_start(tail, tl, 0);
        dropped += (cap->head_len - hl) + skip;
    }
    char note[96] = "";
    if (dropped)
        snprintf(note, sizeof(note), "\n[... %llu bytes omitted ...]\n",
                 (unsigned long long)dropped);
    size_t nl = strlen(note);
    char *out = malloc(hl + nl + (tl - skip) + 1);
    if (out) {
        memcpy(out, cap->head, hl);
        memcpy(out + hl, note, nl);
        memcpy(out + hl + nl, tail + skip, tl - skip);
        out[hl + nl + tl - skip] = '\0';
    }
    free(tail);
    return out;
}

void al_capture_free(al_capture *cap)
{
    free(cap->head);
    free(cap->tail);
    cap->head = cap->tail = NULL;
}

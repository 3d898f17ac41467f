/* The nearest of a few names to a mistyped word: "did you mean" for flags, commands, images and
 * languages, one rule for every front. */
#include "util.h"

#include <stdint.h>
#include <string.h>

#define WORD_MAX 48

/* Edit distance of a and b with adjacent transpositions ("exce" is one step from "exec"); words
 * longer than WORD_MAX are far from everything. */
static size_t distance(const char *a, size_t na, const char *b, size_t nb)
{
    if (na > WORD_MAX || nb > WORD_MAX)
        return SIZE_MAX;
    size_t d[WORD_MAX + 1][WORD_MAX + 1];
    for (size_t i = 0; i <= na; i++)
        d[i][0] = i;
    for (size_t j = 0; j <= nb; j++)
        d[0][j] = j;
    for (size_t i = 1; i <= na; i++)
        for (size_t j = 1; j <= nb; j++) {
            size_t best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < best)
                best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best)
                best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[na][nb];
}

const char *al_nearest(const char *word, size_t n, const char *const *names)
{
    const char *best = NULL;
    size_t best_d = n < 4 ? 1 : n < 8 ? 2 : 3; /* further than this is no suggestion */
    for (; *names; names++) {
        size_t d = distance(word, n, *names, strlen(*names));
        if (d <= best_d && (!best || d < best_d)) {
            best = *names;
            best_d = d;
        }
    }
    return best;
}

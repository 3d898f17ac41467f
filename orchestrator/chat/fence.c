/* The convention for models without tool calls: the first fenced code block in the reply runs,
 * and its info string names the language (CommonMark fences: ``` or ~~~, three or more). */
#include "chat.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

/* If the line at p opens or closes a fence, returns the fence length and its char. */
static size_t fence_at(const char *p, char *ch)
{
    size_t indent = 0;
    while (p[indent] == ' ' && indent < 3)
        indent++;
    char c = p[indent];
    if (c != '`' && c != '~')
        return 0;
    size_t n = 0;
    while (p[indent + n] == c)
        n++;
    if (n < 3)
        return 0;
    *ch = c;
    return indent + n;
}

int al_fence_first(const char *text, char **lang, char **code)
{
    const char *line = text;
    while (*line) {
        const char *eol = strchr(line, '\n');
        const char *next = eol ? eol + 1 : line + strlen(line);
        char ch;
        size_t f = fence_at(line, &ch);
        if (f) {
            size_t marks = 0;
            for (const char *q = line; *q == ' ' || *q == ch; q++)
                marks += *q == ch;
            const char *info = line + f;
            while (info < next && (*info == ' ' || *info == '\t'))
                info++;
            size_t il = 0;
            while (info + il < next && !isspace((unsigned char)info[il]) && info[il] != '{')
                il++;
            const char *body = next, *end = next, *l2 = next;
            end = body + strlen(body);
            while (*l2) { /* the closing fence: same char, at least as long, nothing after */
                const char *e2 = strchr(l2, '\n');
                const char *n2 = e2 ? e2 + 1 : l2 + strlen(l2);
                char c2;
                size_t f2 = fence_at(l2, &c2);
                if (f2 && c2 == ch) {
                    size_t m2 = 0;
                    const char *q = l2;
                    for (; *q == ' ' || *q == ch; q++)
                        m2 += *q == ch;
                    while (*q == ' ' || *q == '\t' || *q == '\r')
                        q++;
                    if (m2 >= marks && (*q == '\n' || *q == '\0')) {
                        end = l2;
                        break;
                    }
                }
                l2 = n2;
            }
            *lang = strndup(info, il);
            *code = strndup(body, (size_t)(end - body));
            if (!*lang || !*code) {
                free(*lang);
                free(*code);
                return -1;
            }
            return 1;
        }
        line = next;
    }
    return 0;
}

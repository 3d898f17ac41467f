/* The TAP helpers the unit tests share: ok() prints one result line, tap_done() the plan and
 * the exit status. One copy per test program (static). */
#ifndef AIRLOCK_TESTS_TAP_H
#define AIRLOCK_TESTS_TAP_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>

static int tests, failures;

__attribute__((format(printf, 2, 3))) static void ok(bool cond, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("%sok %d - ", cond ? "" : "not ", ++tests);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    failures += !cond;
}

static inline int tap_done(void)
{
    printf("1..%d\n", tests);
    return failures ? 1 : 0;
}

#endif

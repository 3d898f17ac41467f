/* The one error convention: the first failure fills al_error, callers pass it up unchanged. */
#include "util.h"

#include <stdio.h>
#include <string.h>

__attribute__((format(printf, 4, 0))) static int verr(al_error *err, int code, const char *suffix,
                                                      const char *fmt, va_list ap)
{
    if (err && err->code == 0) {
        err->code = code;
        char raw[sizeof(err->msg)];
        int n = vsnprintf(raw, sizeof(raw), fmt, ap);
        if (suffix && n >= 0 && (size_t)n < sizeof(raw))
            snprintf(raw + n, sizeof(raw) - (size_t)n, ": %s", suffix);
        /* One line with no control characters, whatever libvirt or the guest put in it: the
         * message ends up on a terminal. */
        al_term_escape(raw, err->msg, sizeof(err->msg));
    }
    return code;
}

int al_err(al_error *err, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    verr(err, code, NULL, fmt, ap);
    va_end(ap);
    return code;
}

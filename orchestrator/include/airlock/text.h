/* libairlock: text from the guest, made safe to show (term.c, result.c, util.c). Beside
 * airlock.h, by subject: what a front needs to print what a guest wrote without letting it
 * drive the terminal, and the UTF-8 checks the kernel results use. Same conventions as
 * airlock.h; exported in the same version nodes. */
#ifndef AIRLOCK_TEXT_H
#define AIRLOCK_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#pragma GCC visibility push(default)

/* ---- UTF-8 ---- */

bool al_utf8_valid(const uint8_t *p, size_t n);
/* The length of the well-formed UTF-8 sequence at p, n bytes available (RFC 3629: no overlong
 * forms, no surrogates, nothing past U+10FFFF; ASCII is 1), or 0. */
size_t al_utf8_len(const uint8_t *p, size_t n);
/* The n bytes at p as UTF-8 text (malloc'd, NUL-terminated, NULL when out of memory): each byte
 * that is not part of a well-formed sequence, and each NUL, becomes U+FFFD; *lossy (if given)
 * says whether one did. */
char *al_utf8_repair(const uint8_t *p, size_t n, bool *lossy);

/* Escapes a name for a terminal: printable ASCII and UTF-8 as is, the rest as \xNN. */
const char *al_path_escape(const char *path, char *buf, size_t len);

/* ---- text from the guest on a terminal (term.c) ---- */

/* What a stream holds between chunks. Zero it to start. Frozen (see "Structs"). */
typedef struct al_term_state {
    unsigned char part[4]; /* a UTF-8 sequence the last chunk cut */
    unsigned char npart;
    bool cr; /* the last byte was a CR (a CRLF is one newline) */
} al_term_state;

/* Room al_term_sanitize needs for n bytes in. */
#define AL_TERM_OUT_MAX(n) (3 * (size_t)(n) + 4)

/* Renders n bytes of a stream for a terminal into out (AL_TERM_OUT_MAX(n) bytes; no NUL) and
 * returns the length: \n and \t pass, a CRLF or a lone CR is a newline, other C0 controls and
 * DEL are shown in caret notation (ESC as ^[), C1 controls and bytes that are not UTF-8 as
 * U+FFFD, valid UTF-8 as is. A stream cut anywhere comes out as the whole would. */
size_t al_term_sanitize(al_term_state *st, const void *in, size_t n, char *out);
/* Ends the stream: a cut sequence it still holds as U+FFFD (out: 3 bytes); st is reset. */
size_t al_term_sanitize_end(al_term_state *st, char *out);
/* One line for a terminal: the same, with newlines, CRs and tabs as spaces; cut to fit len at a
 * character boundary. Returns buf. */
const char *al_term_escape(const char *s, char *buf, size_t len);

/* ---- a terminal run's bytes on the user's terminal (term.c) ---- */

/* What a terminal run's stream holds between chunks. Zero it to start. Frozen. */
typedef struct al_term_pass_state {
    unsigned char state; /* where in an escape sequence the stream is */
    unsigned char npart; /* bytes of a UTF-8 sequence a chunk cut */
    unsigned char part[4];
    unsigned char nseq; /* bytes of the escape sequence read so far */
    char seq[64];       /* the sequence: passed whole or dropped whole */
} al_term_pass_state;

/* Room al_term_pass needs for n bytes in. */
#define AL_TERM_PASS_OUT_MAX(n) (3 * (size_t)(n) + 68)

/* Filters n bytes of a terminal run's output for the user's terminal into out
 * (AL_TERM_PASS_OUT_MAX(n) bytes) and returns the length. Passes text (valid UTF-8 without C1
 * controls; anything else as U+FFFD), BEL, BS, HT, LF, VT, FF, CR; ESC 7 8 = > D E H M c and
 * character set designations; CSI sequences that move the cursor, erase, insert, delete,
 * scroll, set colours and attributes (SGR), set or reset modes (the alternate screen,
 * bracketed paste, mouse reporting, the cursor's visibility), set the cursor's shape, and the
 * queries whose answers carry nothing of the host: the cursor's position (CSI 6n, ?6n), status
 * (CSI 5n), the device's attributes (CSI c, CSI > c). Drops, whole: every OSC (the clipboard,
 * the title, colours, hyperlinks), DCS (DECRQSS), SOS, PM and APC string; window operations
 * and reports (CSI t); every other query; ENQ, SO, SI and the other C0 controls. A stream cut
 * anywhere comes out as the whole would. */
size_t al_term_pass(al_term_pass_state *st, const void *in, size_t n, char *out);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif

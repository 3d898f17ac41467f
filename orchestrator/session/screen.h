/* screen.c: the screen and input of a session with a display (al_screen_capture, al_screen_input).
 */
#ifndef AIRLOCK_SCREEN_H
#define AIRLOCK_SCREEN_H

#include "session.h"

/* The display's state of a session opened with al_session_opts.display; NULL when out of
 * memory. */
struct al_screen *al_screen_new(void);
void al_screen_free(struct al_screen *sc);

/* Pixel x of a screen w pixels wide onto the tablet's 0..0x7fff: the centre of the pixel, so
 * that a guest scaling back (x * w / 0x8000, as X's input drivers do) lands on x itself. */
int al_screen_abs(unsigned x, unsigned w);

/* One key name (xdotool's: "Return", "ctrl", "a", "F5", "Page_Up"..., or QEMU's qcode) to its
 * qcode, and whether shift must be held for it (an upper-case letter, "!"); NULL if unknown. */
const char *al_screen_qcode(const char *name, bool *shift);

#endif

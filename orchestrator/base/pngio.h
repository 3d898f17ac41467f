/* PNG images read as hostile and scaled (pngio.c, libpng's simplified API): the guest's figures
 * for a vision model and the screen of a session both pass here. */
#ifndef AIRLOCK_PNGIO_H
#define AIRLOCK_PNGIO_H

#include "util.h"

/* Decoded pixels: 8192x8192 at 4 bytes is 256 MiB of host memory, no more. */
#define AL_PNG_PIXELS_MAX (8192ull * 8192)

/* w x h RGBA pixels as a PNG: malloc'd into *out, *len bytes. */
int al_png_rgba(const uint8_t *px, unsigned w, unsigned h, uint8_t **out, size_t *len,
                al_error *err);
/* The PNG's size from its header alone (libpng reads the header; nothing is decoded): -EINVAL
 * for what is not a PNG, -EFBIG past AL_PNG_PIXELS_MAX. */
int al_png_size(const uint8_t *png, size_t len, unsigned *w, unsigned *h, al_error *err);
/* The PNG decoded to RGBA (malloc'd, w * h * 4 bytes) within AL_PNG_PIXELS_MAX. */
int al_png_decode(const uint8_t *png, size_t len, uint8_t **px, unsigned *w, unsigned *h,
                  al_error *err);
/* out (w2 x h2) as the box-filtered in (w x h), RGBA: each output pixel the mean of the input
 * pixels it covers. */
void al_png_box_scale(const uint8_t *in, unsigned w, unsigned h, uint8_t *out, unsigned w2,
                      unsigned h2);
/* w x h RGBA pixels as a PNG with its longer side at most side_max (0: any) and its size at most
 * bytes_max (0: any): scaled down (halved again while still too big in bytes, down to 64 px)
 * and encoded; malloc'd into *out, its size in *w_out, *h_out. */
int al_png_fit_rgba(const uint8_t *px, unsigned w, unsigned h, unsigned side_max, size_t bytes_max,
                    uint8_t **out, size_t *outlen, unsigned *w_out, unsigned *h_out, al_error *err);
/* The PNG with its longer side at most side_max and its size at most bytes_max (0: any):
 * the same bytes (a copy) when it fits, else decoded, scaled down (halved again while still
 * too big in bytes, down to 64 px) and encoded anew. malloc'd into *out; its size in *w, *h. */
int al_png_fit(const uint8_t *png, size_t len, unsigned side_max, size_t bytes_max, uint8_t **out,
               size_t *outlen, unsigned *w, unsigned *h, al_error *err);

#endif

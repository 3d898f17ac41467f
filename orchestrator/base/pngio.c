/* PNG images read as hostile and scaled: libpng decodes (a decode that fails, or an image past
 * AL_PNG_PIXELS_MAX, is refused), a box filter scales, libpng encodes again. */
#include "pngio.h"

#include <errno.h>
#include <png.h>
#include <stdlib.h>
#include <string.h>

int al_png_rgba(const uint8_t *px, unsigned w, unsigned h, uint8_t **out, size_t *len,
                al_error *err)
{
    png_image o;
    memset(&o, 0, sizeof(o));
    o.version = PNG_IMAGE_VERSION;
    o.width = w;
    o.height = h;
    o.format = PNG_FORMAT_RGBA;
    png_alloc_size_t size = 0;
    uint8_t *enc = NULL;
    bool ok = png_image_write_to_memory(&o, NULL, &size, 0, px, 0, NULL) && size &&
              (enc = malloc(size)) && png_image_write_to_memory(&o, enc, &size, 0, px, 0, NULL);
    if (!ok) {
        free(enc);
        return al_err(err, -EIO, "cannot encode the PNG: %s", o.message);
    }
    *out = enc;
    *len = size;
    return 0;
}

static int begin(png_image *img, const uint8_t *png, size_t len, al_error *err)
{
    memset(img, 0, sizeof(*img));
    img->version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_memory(img, png, len))
        return al_err(err, -EINVAL, "the image is not a PNG libpng can read: %s", img->message);
    if (!img->width || !img->height || (uint64_t)img->width * img->height > AL_PNG_PIXELS_MAX) {
        unsigned w = img->width, h = img->height;
        png_image_free(img);
        return al_err(err, -EFBIG, "the image's %ux%u pixels are over the limit", w, h);
    }
    return 0;
}

int al_png_size(const uint8_t *png, size_t len, unsigned *w, unsigned *h, al_error *err)
{
    png_image img;
    int r = begin(&img, png, len, err);
    if (r < 0)
        return r;
    *w = img.width, *h = img.height;
    png_image_free(&img);
    return 0;
}

int al_png_decode(const uint8_t *png, size_t len, uint8_t **px_out, unsigned *w, unsigned *h,
                  al_error *err)
{
    png_image img;
    int r = begin(&img, png, len, err);
    if (r < 0)
        return r;
    img.format = PNG_FORMAT_RGBA;
    size_t stride = (size_t)img.width * 4;
    uint8_t *px = malloc(stride * img.height);
    if (!px) {
        png_image_free(&img);
        return al_err(err, -ENOMEM, "out of memory");
    }
    if (!png_image_finish_read(&img, NULL, px, (png_int_32)stride, NULL)) {
        free(px);
        return al_err(err, -EINVAL, "the PNG does not decode: %s", img.message);
    }
    *px_out = px;
    *w = img.width, *h = img.height;
    return 0;
}

void al_png_box_scale(const uint8_t *in, unsigned w, unsigned h, uint8_t *out, unsigned w2,
                      unsigned h2)
{
    for (unsigned y = 0; y < h2; y++) {
        unsigned y0 = (unsigned)((uint64_t)y * h / h2), y1 = (unsigned)((uint64_t)(y + 1) * h / h2);
        if (y1 <= y0)
            y1 = y0 + 1;
        for (unsigned x = 0; x < w2; x++) {
            unsigned x0 = (unsigned)((uint64_t)x * w / w2),
                     x1 = (unsigned)((uint64_t)(x + 1) * w / w2);
            if (x1 <= x0)
                x1 = x0 + 1;
            uint64_t sum[4] = {0};
            for (unsigned yy = y0; yy < y1; yy++)
                for (unsigned xx = x0; xx < x1; xx++)
                    for (int c = 0; c < 4; c++)
                        sum[c] += in[((size_t)yy * w + xx) * 4 + c];
            uint64_t n = (uint64_t)(y1 - y0) * (x1 - x0);
            for (int c = 0; c < 4; c++)
                out[((size_t)y * w2 + x) * 4 + c] = (uint8_t)(sum[c] / n);
        }
    }
}

int al_png_fit_rgba(const uint8_t *px, unsigned w, unsigned h, unsigned side_max, size_t bytes_max,
                    uint8_t **out, size_t *outlen, unsigned *w_out, unsigned *h_out, al_error *err)
{
    /* Fit the longer side; a PNG small in pixels but big in bytes is re-encoded, halved until it
     * fits. */
    unsigned w2 = w, h2 = h;
    if (side_max && (w2 > side_max || h2 > side_max)) {
        double f = (double)side_max / (w > h ? w : h);
        w2 = (unsigned)(w * f), h2 = (unsigned)(h * f);
    }
    for (;;) {
        if (!w2)
            w2 = 1;
        if (!h2)
            h2 = 1;
        _cleanup_free_ uint8_t *scaled = NULL;
        if (w2 != w || h2 != h) {
            if (!(scaled = malloc((size_t)w2 * h2 * 4)))
                return al_err(err, -ENOMEM, "out of memory");
            al_png_box_scale(px, w, h, scaled, w2, h2);
        }
        size_t size = 0;
        uint8_t *enc = NULL;
        int r = al_png_rgba(scaled ? scaled : px, w2, h2, &enc, &size, err);
        if (r < 0)
            return r;
        if (!bytes_max || size <= bytes_max || (w2 <= 64 && h2 <= 64)) {
            *out = enc, *outlen = size;
            *w_out = w2, *h_out = h2;
            return 0;
        }
        free(enc);
        w2 /= 2, h2 /= 2;
    }
}

int al_png_fit(const uint8_t *png, size_t len, unsigned side_max, size_t bytes_max, uint8_t **out,
               size_t *outlen, unsigned *w_out, unsigned *h_out, al_error *err)
{
    unsigned w, h;
    int r = al_png_size(png, len, &w, &h, err);
    if (r < 0)
        return r;
    if (w <= side_max && h <= side_max && (!bytes_max || len <= bytes_max)) {
        uint8_t *copy = malloc(len);
        if (!copy)
            return al_err(err, -ENOMEM, "out of memory");
        memcpy(copy, png, len);
        *out = copy, *outlen = len;
        *w_out = w, *h_out = h;
        return 0;
    }
    _cleanup_free_ uint8_t *px = NULL;
    if ((r = al_png_decode(png, len, &px, &w, &h, err)) < 0)
        return r;
    return al_png_fit_rgba(px, w, h, side_max, bytes_max, out, outlen, w_out, h_out, err);
}

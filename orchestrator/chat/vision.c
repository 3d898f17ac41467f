/* Images a run returns, prepared for a vision model: a PNG is decoded with libpng, scaled down
 * to fit AL_VISION_SIDE_MAX (a box filter: each output pixel the mean of the input pixels it
 * covers) and encoded again when it is bigger than that or than AL_VISION_PNG_MAX, then handed
 * over as base64. The PNG came from the guest: libpng reads it, and a decode that fails, or an
 * image larger than AL_VISION_PIXELS_MAX, is refused rather than sent. */
#include "chat.h"

#include <errno.h>
#include <openssl/evp.h>
#include <png.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

static char *base64(const uint8_t *p, size_t n)
{
    char *out = malloc((n + 2) / 3 * 4 + 1);
    if (out)
        EVP_EncodeBlock((unsigned char *)out, p, (int)n);
    return out;
}

/* out (w2 x h2) as the box-filtered in (w x h), RGBA. */
static void box_scale(const uint8_t *in, unsigned w, unsigned h, uint8_t *out, unsigned w2,
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

int al_vision_png(const uint8_t *png, size_t len, char **b64, unsigned *w_out, unsigned *h_out,
                  al_error *err)
{
    return al_vision_png_fit(png, len, AL_VISION_SIDE_MAX, b64, w_out, h_out, err);
}

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

int al_vision_png_fit(const uint8_t *png, size_t len, unsigned side_max, char **b64,
                      unsigned *w_out, unsigned *h_out, al_error *err)
{
    png_image img;
    memset(&img, 0, sizeof(img));
    img.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_memory(&img, png, len))
        return al_err(err, -EINVAL, "the image is not a PNG libpng can read: %s", img.message);
    if (!img.width || !img.height || (uint64_t)img.width * img.height > AL_VISION_PIXELS_MAX) {
        png_image_free(&img);
        return al_err(err, -EFBIG, "the image's %ux%u pixels are over the limit", img.width,
                      img.height);
    }
    unsigned w = img.width, h = img.height;
    if (w <= side_max && h <= side_max && len <= AL_VISION_PNG_MAX) {
        png_image_free(&img);
        *b64 = base64(png, len);
        *w_out = w, *h_out = h;
        return *b64 ? 0 : al_err(err, -ENOMEM, "out of memory");
    }
    img.format = PNG_FORMAT_RGBA;
    size_t stride = (size_t)w * 4;
    uint8_t *px = malloc(stride * h);
    if (!px) {
        png_image_free(&img);
        return al_err(err, -ENOMEM, "out of memory");
    }
    if (!png_image_finish_read(&img, NULL, px, (png_int_32)stride, NULL)) {
        free(px);
        return al_err(err, -EINVAL, "the PNG does not decode: %s", img.message);
    }
    /* Fit the longer side; a PNG small in pixels but big in bytes is re-encoded, halved until it
     * fits. */
    unsigned w2 = w, h2 = h;
    if (w2 > side_max || h2 > side_max) {
        double f = (double)side_max / (w > h ? w : h);
        w2 = (unsigned)(w * f), h2 = (unsigned)(h * f);
    }
    for (;;) {
        if (!w2)
            w2 = 1;
        if (!h2)
            h2 = 1;
        uint8_t *out = malloc((size_t)w2 * h2 * 4);
        if (!out) {
            free(px);
            return al_err(err, -ENOMEM, "out of memory");
        }
        box_scale(px, w, h, out, w2, h2);
        size_t size = 0;
        uint8_t *enc = NULL;
        int r = al_png_rgba(out, w2, h2, &enc, &size, err);
        free(out);
        if (r < 0) {
            free(px);
            return r;
        }
        if (size <= AL_VISION_PNG_MAX || (w2 <= 64 && h2 <= 64)) {
            free(px);
            *b64 = base64(enc, size);
            free(enc);
            *w_out = w2, *h_out = h2;
            return *b64 ? 0 : al_err(err, -ENOMEM, "out of memory");
        }
        free(enc);
        w2 /= 2, h2 /= 2;
    }
}

bool al_vision_model(const char *model)
{
    return model && (!strncmp(model, "gpt-4o", 6) || !strncmp(model, "gpt-4.1", 7) ||
                     !strncmp(model, "claude-", 7));
}

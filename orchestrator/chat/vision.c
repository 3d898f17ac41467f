/* Images a run returns, prepared for a vision model: a PNG is decoded with libpng, scaled down
 * to fit AL_VISION_SIDE_MAX and encoded again when it is bigger than that or than
 * AL_VISION_PNG_MAX (base/pngio.c), then handed over as base64. The PNG came from the guest: a
 * decode that fails, or an image larger than AL_PNG_PIXELS_MAX, is refused rather than sent. */
#include "chat.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "pngio.h"
#include "util.h"

int al_vision_png(const uint8_t *png, size_t len, char **b64, unsigned *w_out, unsigned *h_out,
                  al_error *err)
{
    return al_vision_png_fit(png, len, AL_VISION_SIDE_MAX, b64, w_out, h_out, err);
}

int al_vision_png_fit(const uint8_t *png, size_t len, unsigned side_max, char **b64,
                      unsigned *w_out, unsigned *h_out, al_error *err)
{
    _cleanup_free_ uint8_t *fit = NULL;
    size_t n = 0;
    int r = al_png_fit(png, len, side_max, AL_VISION_PNG_MAX, &fit, &n, w_out, h_out, err);
    if (r < 0)
        return r;
    *b64 = al_base64(fit, n);
    return *b64 ? 0 : al_err(err, -ENOMEM, "out of memory");
}

bool al_vision_model(const char *model)
{
    return model && (!strncmp(model, "gpt-4o", 6) || !strncmp(model, "gpt-4.1", 7) ||
                     !strncmp(model, "claude-", 7));
}

int al_vision_screen(al_session *s, unsigned max_edge, char **b64, al_screenshot *shot,
                     al_error *err)
{
    al_screenshot_opts o = AL_SCREENSHOT_OPTS_INIT;
    o.max_edge = max_edge;
    al_screenshot got = AL_SCREENSHOT_INIT;
    int r = al_screen_capture(s, &o, &got, err);
    if (r < 0)
        return r;
    *b64 = al_base64(got.png, got.len);
    free(got.png);
    got.png = NULL;
    if (!*b64)
        return al_err(err, -ENOMEM, "out of memory");
    *shot = got;
    return 0;
}

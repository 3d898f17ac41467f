/* Fuzz target for the PNG reader and scaler (orchestrator/base/pngio.c): what a guest puts on
 * its screen (or in a figure) reaches libpng through it. The first input byte picks the longest
 * edge asked for (1..256 px); the rest is the image. Whatever the input: either a clear refusal,
 * or a PNG that libpng reads back, within the edge asked for (or the input itself, copied, when
 * it fit already) and never larger than AL_PNG_PIXELS_MAX. Any violation aborts. */
#include "fuzz.h"
#include "pngio.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void fail(const char *what)
{
    fprintf(stderr, "fuzz-png: %s\n", what);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    unsigned edge = (unsigned)data[0] + 1;
    const uint8_t *png = data + 1;
    size_t len = size - 1;
    uint8_t *out = NULL;
    size_t outlen = 0;
    unsigned w = 0, h = 0;
    al_error err = {0};
    int r = al_png_fit(png, len, edge, 64 * 1024, &out, &outlen, &w, &h, &err);
    if (r < 0) {
        if (!err.code || !err.msg[0] || out)
            fail("a refusal without a reason, or with output");
        return 0;
    }
    if (!out || !outlen || !w || !h)
        fail("no image");
    if (w > edge || h > edge)
        fail("larger than the edge asked for");
    unsigned w2 = 0, h2 = 0;
    al_error e2 = {0};
    if (al_png_size(out, outlen, &w2, &h2, &e2) < 0 || w2 != w || h2 != h)
        fail("the output does not read back as the size said");
    free(out);
    return 0;
}

/* Tests of the loop's pure parts (orchestrator/chat/): output truncation at, below and above its
 * limit, the fenced-code convention, context-window trimming, the system prompt, profiles and
 * saved conversations; images for a vision model (scaled with libpng) and how each API's
 * request carries them. TAP output. */
#include "chat.h"
#include "model/model-internal.h"

#include <openssl/evp.h>
#include <png.h>

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static unsigned count, failed;

static bool ok(bool pass, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool ok(bool pass, const char *fmt, ...)
{
    va_list ap;
    printf("%sok %u - ", pass ? "" : "not ", ++count);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    failed += !pass;
    return pass;
}

static char *captured(size_t limit, const char *text, size_t piece)
{
    al_capture c;
    if (al_capture_init(&c, limit) < 0)
        return NULL;
    size_t n = strlen(text);
    for (size_t i = 0; i < n; i += piece)
        al_capture_add(&c, text + i, n - i < piece ? n - i : piece);
    char *out = al_capture_text(&c);
    al_capture_free(&c);
    return out;
}

static void test_capture(void)
{
    char big[10001];
    for (int i = 0; i < 10000; i++)
        big[i] = (char)('a' + i % 26);
    big[10000] = '\0';
    size_t pieces[] = {1, 7, 100, 10000};
    for (size_t p = 0; p < 4; p++) {
        char below[1000];
        memcpy(below, big, 999);
        below[999] = '\0';
        char *o = captured(1000, below, pieces[p]);
        ok(o && !strcmp(o, below), "capture below the limit keeps everything (pieces of %zu)",
           pieces[p]);
        free(o);
        char at[1001];
        memcpy(at, big, 1000);
        at[1000] = '\0';
        o = captured(1000, at, pieces[p]);
        ok(o && !strcmp(o, at), "capture at the limit keeps everything (pieces of %zu)", pieces[p]);
        free(o);
        char above[1002];
        memcpy(above, big, 1001);
        above[1001] = '\0';
        o = captured(1000, above, pieces[p]);
        ok(o && !strncmp(o, big, 500) && strstr(o, "[... 1 bytes omitted ...]") &&
               !strcmp(o + strlen(o) - 500, above + 501),
           "capture one byte above the limit drops one byte from the middle (pieces of %zu)",
           pieces[p]);
        free(o);
        o = captured(1000, big, pieces[p]);
        ok(o && !strncmp(o, big, 500) && strstr(o, "[... 9000 bytes omitted ...]") &&
               !strcmp(o + strlen(o) - 500, big + 9500),
           "capture far above keeps head and tail and counts the rest (pieces of %zu)", pieces[p]);
        free(o);
    }
    /* "é" is two bytes; put one across each cut point. */
    char utf[2001];
    memset(utf, 'x', 2000);
    utf[2000] = '\0';
    memcpy(utf + 499, "\xc3\xa9", 2);  /* straddles the head's end */
    memcpy(utf + 1500, "\xc3\xa9", 2); /* straddles the tail's start (2000 - 500 = 1500..) */
    memcpy(utf + 1499, "\xc3\xa9", 2);
    char *o = captured(1000, utf, 3);
    bool valid = o != NULL;
    for (const unsigned char *p = (const unsigned char *)o; valid && *p; p++) {
        if (*p == 0xc3)
            valid = p[1] == 0xa9, p++;
        else if (*p == 0xa9)
            valid = false;
    }
    ok(valid, "capture never splits a UTF-8 character at the cuts");
    free(o);
}

static void test_fence(void)
{
    struct {
        const char *text, *lang, *code;
    } cases[] = {
        {"Let me check.\n```python\nprint(1)\n```\nDone.", "python", "print(1)\n"},
        {"```sh\nls\n```\n```python\nx\n```", "sh", "ls\n"},
        {"~~~bash\necho hi\n~~~\n", "bash", "echo hi\n"},
        {"````python\ns = '''\n```\n'''\n````\n", "python", "s = '''\n```\n'''\n"},
        {"```\nuname -a\n```", "", "uname -a\n"},
        {"```python {.line-numbers}\nx = 1\n```", "python", "x = 1\n"},
        {"text\n```python\nunterminated = True\n", "python", "unterminated = True\n"},
        {"  ```js\nconsole.log(1)\n  ```\n", "js", "console.log(1)\n"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *lang = NULL, *code = NULL;
        int r = al_fence_first(cases[i].text, &lang, &code);
        ok(r == 1 && !strcmp(lang, cases[i].lang) && !strcmp(code, cases[i].code),
           "fence case %zu: lang '%s' code found", i, cases[i].lang);
        free(lang);
        free(code);
    }
    const char *none[] = {"no code here", "inline `code` only", "``python\nx\n``", ""};
    for (size_t i = 0; i < 4; i++) {
        char *lang = NULL, *code = NULL;
        ok(al_fence_first(none[i], &lang, &code) == 0, "no fence in case %zu", i);
    }
}

static cJSON *msg(const char *role, const char *content)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddStringToObject(m, "content", content);
    return m;
}

static void test_fit(void)
{
    char filler[401];
    memset(filler, 'w', 400); /* ~100 tokens */
    filler[400] = '\0';
    cJSON *ms = cJSON_CreateArray();
    cJSON_AddItemToArray(ms, msg("user", filler));
    cJSON_AddItemToArray(ms, msg("assistant", filler));
    cJSON_AddItemToArray(ms, msg("tool", filler));
    cJSON_AddItemToArray(ms, msg("user", filler));
    cJSON_AddItemToArray(ms, msg("assistant", filler));
    cJSON_AddItemToArray(ms, msg("user", "latest"));
    al_error e = {0};
    cJSON *all = al_chat_fit(ms, "system", 0, &e);
    ok(all && cJSON_GetArraySize(all) == 6, "window 0 sends everything");
    cJSON_Delete(all);
    all = al_chat_fit(ms, "system", 100000, &e);
    ok(all && cJSON_GetArraySize(all) == 6, "a large window sends everything");
    cJSON_Delete(all);
    /* Room for the latest turn plus about two older messages: the oldest exchange goes, and
     * the trimmed history starts at a user message, never at an orphaned tool result. */
    cJSON *some = al_chat_fit(ms, "system", 300, &e);
    const char *first = some ? cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(
                                   cJSON_GetArrayItem(some, 0), "role"))
                             : NULL;
    ok(some && cJSON_GetArraySize(some) == 3 && first && !strcmp(first, "user"),
       "a small window keeps the newest exchange and starts at a user message (%d kept)",
       some ? cJSON_GetArraySize(some) : -1);
    cJSON_Delete(some);
    memset(&e, 0, sizeof(e));
    cJSON *none = al_chat_fit(ms, filler, 50, &e);
    ok(!none && e.code == -E2BIG && strstr(e.msg, "too small"),
       "a window smaller than the system prompt is a clear error: %s", e.msg);
    cJSON_Delete(ms);
}

static void test_prompt(void)
{
    al_chat_cfg cfg = {.image = "debian"};
    char *p = al_chat_system_prompt(&cfg, "python shell", true);
    ok(p && strstr(p, "python shell") && strstr(p, "debian") &&
           strstr(p, "Every run starts in /workspace") && strstr(p, "execute") &&
           !strstr(p, "interrupted after"),
       "the prompt names the image, languages, /workspace as the runs' cwd and the tool");
    free(p);
    cfg.run_timeout_s = 30;
    p = al_chat_system_prompt(&cfg, "python", true);
    ok(p && strstr(p, "interrupted after 30 s") && strstr(p, "keeps its variables"),
       "with --run-timeout the prompt says runs are interrupted and state is kept");
    free(p);
    cfg.run_timeout_s = 0;
    p = al_chat_system_prompt(&cfg, "python", false);
    ok(p && strstr(p, "fenced code block") && !strstr(p, "`execute`"),
       "the text-mode prompt explains fenced blocks instead");
    free(p);
    cfg.system_message = "You are X.";
    cfg.instructions = "Be brief.";
    p = al_chat_system_prompt(&cfg, "python", true);
    ok(p && !strncmp(p, "You are X.", 10) && strstr(p, "Be brief.") && !strstr(p, "Airlock"),
       "--system-message replaces the prompt and --instructions is appended");
    free(p);
}

struct kv {
    char keys[16][32];
    char vals[16][256];
    int n;
};

static int collect(void *ctx, const char *k, const char *v, al_error *err)
{
    (void)err;
    struct kv *kv = ctx;
    if (kv->n < 16) {
        snprintf(kv->keys[kv->n], 32, "%s", k);
        snprintf(kv->vals[kv->n], 256, "%s", v);
        kv->n++;
    }
    return 0;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void test_profile(const char *tmp)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/p.yaml", tmp);
    write_file(path, "# my local setup\nmodel: llama3.1   # the default\napi_base: "
                     "http://127.0.0.1:11434/v1\nauto-run: true\ninstructions: |\n  Use pandas.\n"
                     "  Be brief.\n");
    struct kv kv = {0};
    al_error e = {0};
    int r = al_profile_load(path, collect, &kv, &e);
    ok(r == 0 && kv.n == 4 && !strcmp(kv.keys[0], "model") && !strcmp(kv.vals[0], "llama3.1") &&
           !strcmp(kv.vals[2], "true") && !strcmp(kv.vals[3], "Use pandas.\nBe brief.\n"),
       "a profile with comments and a block scalar reads as key/value pairs");
    write_file(path, "model: [a, b]\n");
    memset(&e, 0, sizeof(e));
    kv.n = 0;
    ok(al_profile_load(path, collect, &kv, &e) < 0 && strstr(e.msg, "single value"),
       "a list value is refused: %s", e.msg);
    write_file(path, "model: a\n  bad: indent\n");
    memset(&e, 0, sizeof(e));
    ok(al_profile_load(path, collect, &kv, &e) < 0 && strstr(e.msg, "line"),
       "a syntax error names the line: %s", e.msg);
    write_file(path, "base: &b x\nother: *b\n");
    memset(&e, 0, sizeof(e));
    ok(al_profile_load(path, collect, &kv, &e) < 0, "aliases are refused");
    memset(&e, 0, sizeof(e));
    ok(al_profile_load("no-such-profile", collect, &kv, &e) == -ENOENT,
       "a missing profile is -ENOENT: %s", e.msg);
    memset(&e, 0, sizeof(e));
    ok(al_profile_load("../etc", collect, &kv, &e) < 0 || 1, "odd names do not crash");
}

static void test_conv(const char *tmp)
{
    setenv("XDG_DATA_HOME", tmp, 1);
    al_chat_cfg cfg = {.model = {.model = "m1", .api_key = "sk-secret-key"}, .image = "tiny"};
    al_chat c;
    al_error e = {0};
    ok(al_chat_init(&c, &cfg, NULL, NULL, "sh", &e) == 0, "chat init");
    cJSON_AddItemToArray(c.messages, msg("user", "first question"));
    cJSON_AddItemToArray(c.messages, msg("assistant", "answer"));
    c.input_tokens = 12;
    ok(al_conv_save(&c, &e) == 0 && c.id[0] && c.save_path, "saved as %s", c.id);
    FILE *f = c.save_path ? fopen(c.save_path, "r") : NULL;
    char buf[8192] = "";
    if (f) {
        buf[fread(buf, 1, sizeof(buf) - 1, f)] = '\0';
        fclose(f);
    }
    ok(strstr(buf, "first question") && !strstr(buf, "sk-secret-key"),
       "the file holds the messages and never the key");
    char id[64];
    snprintf(id, sizeof(id), "%s", c.id);
    al_chat d;
    al_chat_init(&d, &cfg, NULL, NULL, "sh", &e);
    ok(al_conv_load(&d, NULL, &e) == 0 && cJSON_GetArraySize(d.messages) == 2 &&
           !strcmp(d.id, id) && d.input_tokens == 12,
       "the newest conversation loads back");
    ok(al_chat_undo(&d) == 0 && cJSON_GetArraySize(d.messages) == 0, "undo drops the exchange");
    ok(al_chat_undo(&d) == -ENOENT, "undo with nothing left says so");
    memset(&e, 0, sizeof(e));
    ok(al_conv_load(&d, "../../etc/passwd", &e) == -EINVAL, "a path as id is refused");
    memset(&e, 0, sizeof(e));
    ok(al_conv_load(&d, "20990101-000000-abcdef", &e) == -ENOENT, "an unknown id: %s", e.msg);
    char bad[600];
    snprintf(bad, sizeof(bad), "%s/bad.json", tmp);
    write_file(bad, "{\"messages\": [{\"role\": \"wizard\", \"content\": \"x\"}]}");
    memset(&e, 0, sizeof(e));
    ok(al_conv_load_file(&d, bad, &e) == -EINVAL && cJSON_GetArraySize(d.messages) == 0,
       "a file with a bad role is refused and the history is untouched");
    write_file(bad, "{not json");
    memset(&e, 0, sizeof(e));
    ok(al_conv_load_file(&d, bad, &e) == -EINVAL, "invalid JSON is refused: %s", e.msg);
    al_chat_free(&d);
    al_chat_free(&c);
}

/* A file named name in dir holding n bytes of data, dated at unix second t. */
static int dated_file(const char *dir, const char *name, const void *data, size_t n, time_t t)
{
    char p[600];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    int fd = open(p, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, data, n) != (ssize_t)n)
        abort();
    struct timespec ts[2] = {{t, 0}, {t, 0}};
    futimens(fd, ts);
    return fd;
}

static bool magic(const char *tmp, const char *ext, const void *data, size_t n)
{
    int fd = dated_file(tmp, "m", data, n, 0);
    bool r = al_figure_magic_ok(fd, ext);
    close(fd);
    return r;
}

static void test_figures(const char *tmp)
{
    static const char png[] = "\x89PNG\r\n\x1a\n\0\0\0\rIHDR";
    ok(magic(tmp, ".png", png, sizeof(png) - 1) && magic(tmp, ".PNG", png, sizeof(png) - 1),
       "a PNG is a .png, any case");
    ok(!magic(tmp, ".png", "plot data\n", 10) && !magic(tmp, ".png", png, 7) &&
           !magic(tmp, ".jpg", png, sizeof(png) - 1) && !magic(tmp, ".png", "", 0),
       "text, a cut header, a PNG named .jpg and an empty file are refused");
    ok(magic(tmp, ".jpg", "\xff\xd8\xff\xe0", 4) && magic(tmp, ".jpeg", "\xff\xd8\xff\xdb", 4) &&
           magic(tmp, ".gif", "GIF89a", 6) && magic(tmp, ".pdf", "%PDF-1.7\n", 9) &&
           magic(tmp, ".webp", "RIFF\x10\0\0\0WEBPVP8 ", 16),
       "JPEG, GIF, PDF and WebP by their first bytes");
    ok(!magic(tmp, ".webp", "RIFF\x10\0\0\0WAVEfmt ", 16) && !magic(tmp, ".gif", "GIF", 3),
       "a WAV named .webp and a cut GIF header are refused");
    ok(magic(tmp, ".svg", "<svg xmlns='http://www.w3.org/2000/svg'/>", 41) &&
           magic(tmp, ".svg", "\xef\xbb\xbf\n  <?xml version='1.0'?>", 27) &&
           !magic(tmp, ".svg",
                  "\x7f"
                  "ELF\2\1\1",
                  7) &&
           !magic(tmp, ".svg", "#!/bin/sh\n", 10),
       "SVG is XML text (a BOM and blanks allowed); an ELF or a script is not");
    ok(al_figure_ext_ok(".webp") && !al_figure_ext_ok(".sh") && !al_figure_ext_ok(".png.exe") &&
           !al_figure_ext_ok(NULL),
       "only image extensions are figures");

    /* The quota: newest first, within both bounds; the user's own files are left. */
    char dir[300];
    snprintf(dir, sizeof(dir), "%s/outputs", tmp);
    mkdir(dir, 0700);
    char big[1000] = {0};
    for (int i = 0; i < 6; i++) {
        char name[64];
        snprintf(name, sizeof(name), "airlock-s-%d.png", i);
        close(dated_file(dir, name, big, 100, 1000 + i));
    }
    close(dated_file(dir, "mine.png", big, 100, 1));
    al_error e = {0};
    ok(al_outputs_prune(dir, 4, 1000, &e) == 0, "pruned (%s)", e.msg);
    char p[400];
    int left = 0;
    for (int i = 0; i < 6; i++) {
        snprintf(p, sizeof(p), "%s/airlock-s-%d.png", dir, i);
        left |= (access(p, F_OK) == 0) << i;
    }
    snprintf(p, sizeof(p), "%s/mine.png", dir);
    ok(left == 0x3c && access(p, F_OK) == 0, "a count bound keeps the newest 4 (%#x), not mine",
       left);
    close(dated_file(dir, "airlock-s-6.png", big, 1000, 1006));
    ok(al_outputs_prune(dir, 4, 1250, &e) == 0, "pruned again (%s)", e.msg);
    left = 0;
    for (int i = 0; i < 7; i++) {
        snprintf(p, sizeof(p), "%s/airlock-s-%d.png", dir, i);
        left |= (access(p, F_OK) == 0) << i;
    }
    ok(left == 0x70, "a byte bound keeps 1000 + 2 x 100 of 1250 (%#x)", left);
    ok(al_outputs_prune(dir, 1, 1, &e) == 0 && access(p, F_OK) == 0,
       "the newest is kept even over the bounds");
}

/* A w x h RGBA PNG of a gradient, malloc'd. */
static uint8_t *make_png(unsigned w, unsigned h, size_t *len)
{
    uint8_t *px = malloc((size_t)w * h * 4);
    for (size_t i = 0; px && i < (size_t)w * h * 4; i++)
        px[i] = (uint8_t)(i * 7);
    uint8_t *out = NULL;
    al_error err = {0};
    if (px && al_png_rgba(px, w, h, &out, len, &err) < 0)
        out = NULL;
    free(px);
    return out;
}

/* The width and height in a base64 PNG's IHDR. */
static bool b64_png_size(const char *b64, unsigned *w, unsigned *h)
{
    size_t n = strlen(b64);
    uint8_t *raw = malloc(n);
    int got = raw ? EVP_DecodeBlock(raw, (const unsigned char *)b64, (int)n) : -1;
    bool ok = got >= 24 && !memcmp(raw, "\x89PNG", 4);
    if (ok) {
        *w = (unsigned)raw[16] << 24 | (unsigned)raw[17] << 16 | (unsigned)raw[18] << 8 | raw[19];
        *h = (unsigned)raw[20] << 24 | (unsigned)raw[21] << 16 | (unsigned)raw[22] << 8 | raw[23];
    }
    free(raw);
    return ok;
}

static void test_vision(void)
{
    ok(al_vision_model("gpt-4o-mini") && al_vision_model("gpt-4.1") &&
           al_vision_model("claude-sonnet-4-5") && !al_vision_model("gpt-3.5-turbo") &&
           !al_vision_model("llama3") && !al_vision_model(NULL),
       "vision by default for gpt-4o*, gpt-4.1*, claude-* only");
    size_t len;
    uint8_t *small = make_png(40, 30, &len), *big;
    char *b64 = NULL;
    unsigned w = 0, h = 0;
    al_error err = {0};
    ok(small && al_vision_png(small, len, &b64, &w, &h, &err) == 0 && w == 40 && h == 30,
       "a small PNG goes as it is");
    free(b64);
    b64 = NULL;
    free(small);
    big = make_png(3000, 200, &len);
    unsigned bw = 0, bh = 0;
    ok(big && al_vision_png(big, len, &b64, &w, &h, &err) == 0 && w == AL_VISION_SIDE_MAX &&
           h == 68 && b64_png_size(b64, &bw, &bh) && bw == w && bh == h,
       "a 3000x200 PNG is scaled to %ux68 (got %ux%u, sent %ux%u)", AL_VISION_SIDE_MAX, w, h, bw,
       bh);
    free(big);
    ok(al_vision_png((const uint8_t *)"GIF89a not a png at all", 23, &b64, &w, &h, &err) == -EINVAL,
       "bytes that are not a PNG are refused");

    /* The requests: OpenAI gets the image as a data URL in a user message after the tool
     * results; Anthropic as an image block inside the tool result. */
    cJSON *msgs = cJSON_Parse("[{\"role\":\"user\",\"content\":\"plot\"},"
                              "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":"
                              "[{\"id\":\"c1\",\"name\":\"execute\",\"arguments\":{}}]},"
                              "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"ok\"}]");
    cJSON *img = cJSON_CreateObject();
    cJSON_AddStringToObject(img, "media_type", "image/png");
    cJSON_AddStringToObject(img, "data", b64);
    cJSON *imgs = cJSON_CreateArray();
    cJSON_AddItemToArray(imgs, img);
    cJSON_AddItemToObject(cJSON_GetArrayItem(msgs, 2), "images", imgs);
    al_model_cfg cfg = {.model = "m"};
    char *body = NULL;
    cJSON *b = NULL;
    bool okay = al_openai_body(&cfg, msgs, NULL, &body, &err) == 0 && (b = cJSON_Parse(body));
    cJSON *om = b ? cJSON_GetObjectItem(b, "messages") : NULL;
    cJSON *last = cJSON_GetArrayItem(om, cJSON_GetArraySize(om) - 1);
    cJSON *part = cJSON_GetArrayItem(cJSON_GetObjectItem(last, "content"), 1);
    const char *url =
        cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(part, "image_url"), "url"));
    ok(okay && cJSON_GetArraySize(om) == 4 &&
           !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(last, "role")), "user") && url &&
           !strncmp(url, "data:image/png;base64,", 22) && !strcmp(url + 22, b64),
       "OpenAI: the image follows the tool result as a user message with a data URL");
    free(body);
    cJSON_Delete(b);
    body = NULL;
    b = NULL;
    okay = al_anthropic_body(&cfg, msgs, NULL, &body, &err) == 0 && (b = cJSON_Parse(body));
    om = b ? cJSON_GetObjectItem(b, "messages") : NULL;
    last = cJSON_GetArrayItem(om, cJSON_GetArraySize(om) - 1);
    cJSON *tr = cJSON_GetArrayItem(cJSON_GetObjectItem(last, "content"), 0);
    cJSON *blk = cJSON_GetArrayItem(cJSON_GetObjectItem(tr, "content"), 1);
    cJSON *src = cJSON_GetObjectItem(blk, "source");
    ok(okay && !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(tr, "type")), "tool_result") &&
           !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(blk, "type")), "image") &&
           !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(src, "type")), "base64") &&
           !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(src, "data")), b64),
       "Anthropic: the image is an image block inside the tool result");
    free(body);
    cJSON_Delete(b);
    body = NULL;
    b = NULL;
    okay = al_responses_body(&cfg, msgs, NULL, &body, &err) == 0 && (b = cJSON_Parse(body));
    om = b ? cJSON_GetObjectItem(b, "input") : NULL;
    last = cJSON_GetArrayItem(om, cJSON_GetArraySize(om) - 1);
    cJSON *outp = cJSON_GetObjectItem(last, "output");
    part = cJSON_GetArrayItem(outp, 1);
    url = cJSON_GetStringValue(cJSON_GetObjectItem(part, "image_url"));
    ok(okay && cJSON_GetArraySize(om) == 3 &&
           !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(last, "type")),
                   "function_call_output") &&
           !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(outp, 0), "text")),
                   "ok") &&
           !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(part, "type")), "input_image") && url &&
           !strncmp(url, "data:image/png;base64,", 22) && !strcmp(url + 22, b64),
       "Responses: the image is an input_image part of the function call's output");
    free(body);
    cJSON_Delete(b);
    unsigned est = al_chat_estimate(cJSON_GetArrayItem(msgs, 2));
    ok(strlen(b64) / 4 > 1000 && est > 1600 && est < 1700,
       "a message's image counts as 1600 tokens, not its %zu bytes of base64 (%u)", strlen(b64),
       est);
    cJSON_Delete(msgs);
    free(b64);
}

/* OpenAI's computer actions as al_screen_input's, on a 720x400 screenshot. */
static void cua_case(const char *actions, const char *want, const char *what)
{
    cJSON *in = cJSON_Parse(actions);
    char why[256];
    cJSON *out = al_cua_openai_actions(in, 720, 400, why, sizeof(why));
    char *got = out ? cJSON_PrintUnformatted(out) : NULL;
    bool pass = want ? got && !strcmp(got, want) : !out && strstr(why, what);
    ok(pass, "computer actions: %s%s%s", what, pass ? "" : " -- got ", pass ? "" : got ? got : why);
    free(got);
    cJSON_Delete(out);
    cJSON_Delete(in);
}

static void test_cua(void)
{
    static const char *const newer[] = {"claude-opus-4-5", "claude-opus-4-5-20251101",
                                        "claude-sonnet-4-6", "claude-haiku-4-7", "claude-opus-5"};
    static const char *const older[] = {"claude-sonnet-4-5",
                                        "claude-opus-4-1",
                                        "claude-opus-4-20250514",
                                        "claude-3-7-sonnet-latest",
                                        "claude-haiku-4-5",
                                        "gpt-4o",
                                        "claude-",
                                        NULL};
    bool all = true;
    for (size_t i = 0; i < sizeof(newer) / sizeof(newer[0]); i++)
        all &= al_chat_computer_zoom_tool(newer[i]);
    for (size_t i = 0; i < sizeof(older) / sizeof(older[0]); i++)
        all &= !al_chat_computer_zoom_tool(older[i]);
    ok(all, "Anthropic's newer computer tool for Opus 4.5 and the 4.6 models on, only");
    cua_case("[{\"type\":\"click\",\"button\":\"right\",\"x\":0,\"y\":399,\"keys\":[\"SHIFT\"]},"
             "{\"type\":\"double_click\",\"x\":719,\"y\":0,\"keys\":null},"
             "{\"type\":\"screenshot\"},{\"type\":\"wait\"}]",
             "[{\"action\":\"right_click\",\"coordinate\":[0,399],\"text\":\"SHIFT\"},"
             "{\"action\":\"double_click\",\"coordinate\":[719,0]},"
             "{\"action\":\"wait\",\"duration\":1}]",
             "clicks at the edges with held keys, no action for a screenshot, a wait of 1 s");
    cua_case("[{\"type\":\"keypress\",\"keys\":[\"CTRL\",\"ARROWLEFT\"]},"
             "{\"type\":\"keypress\",\"keys\":[\"CAPSLOCK\"]},"
             "{\"type\":\"keypress\",\"keys\":[\"CTRL\",\"A\"]}]",
             "[{\"action\":\"key\",\"text\":\"CTRL+LEFT\"},{\"action\":\"key\",\"text\":"
             "\"caps_lock\"},{\"action\":\"key\",\"text\":\"CTRL+a\"}]",
             "key names: ARROWLEFT, CAPSLOCK, and A as the key, not a capital");
    cua_case("[{\"type\":\"scroll\",\"x\":5,\"y\":6,\"scroll_x\":-250,\"scroll_y\":120},"
             "{\"type\":\"scroll\",\"x\":5,\"y\":6,\"scroll_x\":0,\"scroll_y\":-1e9}]",
             "[{\"action\":\"scroll\",\"coordinate\":[5,6],\"scroll_direction\":\"down\","
             "\"scroll_amount\":2},{\"action\":\"scroll\",\"coordinate\":[5,6],"
             "\"scroll_direction\":\"left\",\"scroll_amount\":3},{\"action\":\"scroll\","
             "\"coordinate\":[5,6],\"scroll_direction\":\"up\",\"scroll_amount\":100}]",
             "scroll pixels as notches of 100, rounded up, capped at 100");
    cua_case("[{\"type\":\"drag\",\"path\":[{\"x\":1,\"y\":2},{\"x\":3,\"y\":4},"
             "{\"x\":5,\"y\":6}]},{\"type\":\"click\",\"button\":\"back\",\"x\":7,"
             "\"y\":8},{\"type\":\"type\",\"text\":\"hi\"}]",
             "[{\"action\":\"left_mouse_down\",\"coordinate\":[1,2]},{\"action\":"
             "\"mouse_move\",\"coordinate\":[3,4]},{\"action\":\"left_mouse_up\","
             "\"coordinate\":[5,6]},{\"action\":\"mouse_move\",\"coordinate\":[7,8]},"
             "{\"action\":\"key\",\"text\":\"alt+Left\"},{\"action\":\"type\",\"text\":"
             "\"hi\"}]",
             "a drag along its path, the back button as history back, typing");
    cua_case("[{\"type\":\"click\",\"x\":1,\"y\":1},{\"type\":\"drag\",\"path\":"
             "[{\"x\":1,\"y\":2},{\"x\":720,\"y\":4}]}]",
             NULL, "action 2 (drag): (720, 4) is outside the 720x400 screen");
    cua_case("[{\"type\":\"move\",\"x\":1.5,\"y\":1}]", NULL, "whole pixels");
    cua_case("[{\"type\":\"move\",\"x\":-1,\"y\":1}]", NULL, "outside");
    cua_case("[{\"type\":\"keypress\",\"keys\":[\"HYPERSPACE\"]}]", NULL,
             "unknown key 'HYPERSPACE'");
    cua_case("[{\"type\":\"teleport\"}]", NULL, "action 1 (teleport): unknown action type");
    cua_case("[{\"type\":\"drag\",\"path\":[{\"x\":1,\"y\":2}]}]", NULL, "2 to 256 points");
    cua_case("{\"type\":\"click\"}", NULL, "not a list");
}

int main(void)
{
    char tmp[] = "/tmp/test-chat-XXXXXX";
    if (!mkdtemp(tmp))
        return 1;
    test_capture();
    test_fence();
    test_fit();
    test_prompt();
    test_profile(tmp);
    test_conv(tmp);
    test_figures(tmp);
    test_vision();
    test_cua();
    printf("1..%u\n", count);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
    if (system(cmd) != 0)
        failed++;
    return failed ? 1 : 0;
}

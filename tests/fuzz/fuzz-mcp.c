/* Fuzz target for the MCP server (orchestrator/mcp): what a client sends, and what a guest
 * writes. The first input byte picks the mode:
 *  - even: the rest is one message for al_mcp_message (JSON-RPC, batches, tools/call with any
 *    arguments: the argument checks, the handle lookups and the errors run; start_session is
 *    renamed so that no VM boots). Every answer must be one JSON object with "jsonrpc": "2.0"
 *    and an id, and either a result or an error with an integer code.
 *  - odd: the rest is a guest's output stream, fed to a run's buffer (head and ring) in chunks
 *    the input's bytes choose; every read back must be valid UTF-8, no longer than asked (plus
 *    the U+FFFD that repairs a byte), and agree with the stream: reading from 0 up to the head's
 *    end gives the stream's first bytes, the offsets only grow and end at the total.
 * Any violation aborts. */
#include "fuzz.h"
#include "mcpint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void fail(const char *what)
{
    fprintf(stderr, "fuzz-mcp: %s\n", what);
    abort();
}

static void check_answer(void *ctx, const char *json, bool final)
{
    unsigned *finals = ctx;
    if (final)
        __atomic_add_fetch(finals, 1, __ATOMIC_SEQ_CST);
    if (!json)
        return;
    cJSON *j = cJSON_Parse(json);
    if (!j || !cJSON_IsObject(j))
        fail("an answer that is not a JSON object");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "jsonrpc");
    if (!cJSON_IsString(v) || strcmp(v->valuestring, "2.0"))
        fail("an answer without jsonrpc 2.0");
    if (final) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(j, "id");
        const cJSON *res = cJSON_GetObjectItemCaseSensitive(j, "result");
        const cJSON *err = cJSON_GetObjectItemCaseSensitive(j, "error");
        if (!id || (!res == !err))
            fail("a response without an id, or not exactly one of result and error");
        if (err && !cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(err, "code")))
            fail("an error without a code");
        if (res && cJSON_GetObjectItemCaseSensitive(res, "isError") &&
            !cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(res, "content")))
            fail("a tool result without content");
    }
    cJSON_Delete(j);
}

static void fuzz_message(const uint8_t *data, size_t size)
{
    static al_mcp *m;
    if (!m) {
        al_mcp_opts o = {.sessions_max = 1};
        al_error err = {0};
        if (al_mcp_new(&o, &m, &err) < 0)
            fail(err.msg);
    }
    char *text = malloc(size + 1);
    if (!text)
        return;
    memcpy(text, data, size);
    text[size] = '\0';
    for (char *p = text; (p = memmem(p, size - (size_t)(p - text), "start_session", 13)); p++)
        p[12] = 'X';
    unsigned finals = 0;
    unsigned want = al_mcp_message(m, text, size, check_answer, &finals);
    while (al_mcp_pending(m))
        usleep(1000);
    if (__atomic_load_n(&finals, __ATOMIC_SEQ_CST) != want)
        fail("the count of final answers is not what al_mcp_message said");
    free(text);
}

static void fuzz_buffer(const uint8_t *data, size_t size)
{
    struct mcp_buf *b = calloc(1, sizeof(*b));
    if (!b)
        return;
    /* Chunks: each input byte's low bits scale the next chunk, repeated to reach past the ring. */
    size_t reps = size ? 1 + (data[0] & 7) : 1;
    uint8_t *stream = NULL;
    size_t total = 0;
    for (size_t r = 0; r < reps; r++) {
        size_t i = 0;
        while (i < size) {
            size_t n = 1 + (size_t)(data[i] % 61) * ((data[i] & 0x80) ? 997 : 1);
            if (n > size - i)
                n = size - i;
            mcp_buf_append(b, data + i, n);
            if (total < MCP_HEAD) {
                size_t k = n < MCP_HEAD - total ? n : MCP_HEAD - total;
                stream = realloc(stream, total + k);
                memcpy(stream + total, data + i, k);
            }
            total += n;
            i += n;
        }
    }
    if (b->total != total)
        fail("the total does not count every byte");
    /* The head reads back as it was written (where it is valid UTF-8, it is the same bytes). */
    uint64_t next = 0, skipped = 0, at = 0;
    size_t head = total < MCP_HEAD ? total : MCP_HEAD;
    char *s = mcp_buf_read(b, 0, head, &next, &skipped);
    if (!s || !al_utf8_valid((const uint8_t *)s, strlen(s)) || skipped || next > head)
        fail("reading the head");
    if (al_utf8_valid(stream, (size_t)next) && !memchr(stream, 0, (size_t)next) &&
        (strlen(s) != next || memcmp(s, stream, (size_t)next)))
        fail("the head read back differs");
    free(s);
    /* From any offset to the end: offsets grow, nothing is read twice, the end is the total. */
    for (int guard = 0; at < total && guard < 100000; guard++) {
        size_t max = 1 + (size_t)(at % 4096);
        s = mcp_buf_read(b, at, max, &next, &skipped);
        if (!s || !al_utf8_valid((const uint8_t *)s, strlen(s)))
            fail("a read that is not UTF-8");
        if (next < at + skipped || next > total || next - at - skipped > max)
            fail("offsets out of order");
        if (next == at + skipped && next < total && max >= 4)
            fail("no progress");
        free(s);
        at = next == at + skipped ? next + 1 : next;
    }
    bool cut;
    s = mcp_buf_summary(b, MCP_TEXT_KEEP, &cut);
    if (!s || !al_utf8_valid((const uint8_t *)s, strlen(s)) ||
        strlen(s) > 3 * (2 * MCP_TEXT_KEEP + 96))
        fail("a summary that is not bounded UTF-8");
    if (cut != (total > 2 * MCP_TEXT_KEEP))
        fail("a summary that says it cut when it did not, or the reverse");
    free(s);
    free(stream);
    free(b->ring);
    free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!size)
        return 0;
    if (data[0] & 1)
        fuzz_buffer(data + 1, size - 1);
    else
        fuzz_message(data + 1, size - 1);
    return 0;
}

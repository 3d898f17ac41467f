/* Sample messages, a raw frame writer and message comparison for the protocol tests. */
#include "proto-fixtures.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define S(lit) ((struct al_str){(lit), sizeof(lit) - 1})

static uint8_t fill[AL_FRAME_PAYLOAD_MAX + 1];

struct al_str fix_str(uint32_t n)
{
    if (n > sizeof(fill))
        abort();
    if (fill[1] == 0) {
        for (size_t i = 0; i < sizeof(fill); i++)
            fill[i] = (uint8_t)(i % 251);
    }
    return (struct al_str){(const char *)fill, n};
}

/* ---- raw writer ---- */

void raw_init(struct raw *r, uint8_t *buf, size_t cap)
{
    r->p = buf;
    r->cap = cap;
    r->len = 0;
    r->frame = 0;
}

void raw_bytes(struct raw *r, const void *p, size_t n)
{
    if (n > r->cap - r->len) {
        fprintf(stderr, "raw writer: %zu bytes do not fit\n", n);
        abort();
    }
    if (n)
        memcpy(r->p + r->len, p, n);
    r->len += n;
}

void raw_u8(struct raw *r, uint8_t v)
{
    raw_bytes(r, &v, 1);
}

void raw_u16(struct raw *r, uint16_t v)
{
    uint8_t b[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
    raw_bytes(r, b, sizeof(b));
}

void raw_u32(struct raw *r, uint32_t v)
{
    uint8_t b[4];
    for (int i = 0; i < 4; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    raw_bytes(r, b, sizeof(b));
}

void raw_u64(struct raw *r, uint64_t v)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    raw_bytes(r, b, sizeof(b));
}

void raw_str(struct raw *r, struct al_str s)
{
    raw_u32(r, s.len);
    raw_bytes(r, s.p, s.len);
}

void raw_begin(struct raw *r, uint8_t type, uint8_t flags, uint32_t id)
{
    r->frame = r->len;
    raw_u8(r, 'A');
    raw_u8(r, 'L');
    raw_u8(r, type);
    raw_u8(r, flags);
    raw_u32(r, id);
    raw_u32(r, 0);
}

size_t raw_end(struct raw *r)
{
    size_t size = r->len - r->frame;
    uint32_t plen = (uint32_t)(size - AL_FRAME_HEADER_SIZE);
    for (int i = 0; i < 4; i++)
        r->p[r->frame + 8 + i] = (uint8_t)(plen >> (8 * i));
    return size;
}

size_t raw_frame_size(const uint8_t *p)
{
    return AL_FRAME_HEADER_SIZE +
           (p[8] | (size_t)p[9] << 8 | (size_t)p[10] << 16 | (size_t)p[11] << 24);
}

static void raw_list(struct raw *r, const struct al_str *v, uint32_t n, uint32_t room)
{
    raw_u32(r, n);
    for (uint32_t i = 0; i < n; i++)
        raw_str(r, i < room ? v[i] : (struct al_str){"", 0});
}

size_t raw_msg(struct raw *r, const struct al_msg *m)
{
    raw_begin(r, m->type, m->flags, m->id);
    switch (m->type) {
    case AL_HELLO:
        raw_u32(r, m->u.hello.version);
        raw_u64(r, m->u.hello.nonce);
        raw_u32(r, m->u.hello.window);
        break;
    case AL_HELLO_ACK:
        raw_u32(r, m->u.hello_ack.version);
        raw_u64(r, m->u.hello_ack.nonce);
        raw_u32(r, m->u.hello_ack.window);
        raw_u32(r, m->u.hello_ack.caps);
        raw_str(r, m->u.hello_ack.agent_version);
        raw_list(r, m->u.hello_ack.langs, m->u.hello_ack.nlangs, AL_LANGS_MAX);
        break;
    case AL_EXEC:
        raw_u32(r, m->u.exec.flags);
        raw_u32(r, m->u.exec.timeout_ms);
        raw_u32(r, m->u.exec.input_wait_ms);
        raw_u64(r, m->u.exec.output_cap);
        raw_u16(r, m->u.exec.rows);
        raw_u16(r, m->u.exec.cols);
        raw_str(r, m->u.exec.lang);
        raw_str(r, m->u.exec.cwd);
        raw_list(r, m->u.exec.argv, m->u.exec.argc, AL_ARGV_MAX);
        raw_list(r, m->u.exec.env, m->u.exec.envc, AL_ENV_MAX);
        break;
    case AL_STARTED:
        raw_u32(r, m->u.started.pid);
        break;
    case AL_DATA:
        raw_u8(r, m->u.data.stream);
        raw_bytes(r, m->u.data.data, m->u.data.len);
        break;
    case AL_CREDIT:
        raw_u8(r, m->u.credit.stream);
        raw_u32(r, m->u.credit.bytes);
        break;
    case AL_SIGNAL:
        raw_u32(r, m->u.signal.signo);
        break;
    case AL_EXIT:
        raw_u8(r, m->u.exit.how);
        raw_u32(r, (uint32_t)m->u.exit.value);
        raw_u64(r, m->u.exit.duration_us);
        raw_u32(r, m->u.exit.flags);
        break;
    case AL_ERROR:
        raw_u16(r, m->u.error.klass);
        raw_u32(r, m->u.error.err);
        raw_str(r, m->u.error.message);
        break;
    case AL_FILE_PUT:
        raw_u32(r, m->u.file_put.mode);
        raw_u64(r, m->u.file_put.size);
        raw_str(r, m->u.file_put.path);
        break;
    case AL_FILE_GET:
        raw_str(r, m->u.file_get.path);
        break;
    case AL_FILE_INFO:
        raw_u32(r, m->u.file_info.mode);
        raw_u64(r, m->u.file_info.size);
        break;
    case AL_OK:
        raw_u64(r, m->u.ok.value);
        break;
    case AL_PING:
    case AL_PONG:
        raw_u64(r, m->u.ping.cookie);
        break;
    case AL_SHUTDOWN:
        raw_u32(r, m->u.shutdown.how);
        break;
    case AL_WAITING:
        raw_u32(r, m->u.waiting.waited_ms);
        break;
    case AL_RESIZE:
        raw_u16(r, m->u.resize.rows);
        raw_u16(r, m->u.resize.cols);
        break;
    case AL_CONNECT:
        raw_u16(r, m->u.connect.port);
        break;
    case AL_REFRESH:
        raw_bytes(r, m->u.refresh.seed, AL_REFRESH_SEED);
        raw_u64(r, m->u.refresh.sec);
        raw_u32(r, m->u.refresh.nsec);
        raw_bytes(r, m->u.refresh.machine_id, AL_MACHINE_ID);
        raw_str(r, m->u.refresh.hostname);
        break;
    default: /* unknown types go out with an empty payload */
        break;
    }
    return raw_end(r);
}

/* ---- comparison ---- */

static bool str_same(struct al_str a, struct al_str b)
{
    return a.len == b.len && (a.len == 0 || memcmp(a.p, b.p, a.len) == 0);
}

static bool list_same(const struct al_str *a, const struct al_str *b, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        if (!str_same(a[i], b[i]))
            return false;
    }
    return true;
}

bool fix_msg_same(const struct al_msg *a, const struct al_msg *b, const char **field)
{
#define SAME(cond, name)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            *field = (name);                                                                       \
            return false;                                                                          \
        }                                                                                          \
    } while (0)
#define SAME_FIELD(f) SAME(a->u.f == b->u.f, #f)
#define SAME_STR(f) SAME(str_same(a->u.f, b->u.f), #f)

    SAME(a->type == b->type, "type");
    SAME(a->flags == b->flags, "flags");
    SAME(a->id == b->id, "id");
    switch (a->type) {
    case AL_HELLO:
        SAME_FIELD(hello.version);
        SAME_FIELD(hello.nonce);
        SAME_FIELD(hello.window);
        break;
    case AL_HELLO_ACK:
        SAME_FIELD(hello_ack.version);
        SAME_FIELD(hello_ack.nonce);
        SAME_FIELD(hello_ack.window);
        SAME_FIELD(hello_ack.caps);
        SAME_STR(hello_ack.agent_version);
        SAME_FIELD(hello_ack.nlangs);
        SAME(list_same(a->u.hello_ack.langs, b->u.hello_ack.langs, a->u.hello_ack.nlangs),
             "hello_ack.langs");
        break;
    case AL_EXEC:
        SAME_FIELD(exec.flags);
        SAME_FIELD(exec.timeout_ms);
        SAME_FIELD(exec.input_wait_ms);
        SAME_FIELD(exec.output_cap);
        SAME_FIELD(exec.rows);
        SAME_FIELD(exec.cols);
        SAME_STR(exec.lang);
        SAME_STR(exec.cwd);
        SAME_FIELD(exec.argc);
        SAME(list_same(a->u.exec.argv, b->u.exec.argv, a->u.exec.argc), "exec.argv");
        SAME_FIELD(exec.envc);
        SAME(list_same(a->u.exec.env, b->u.exec.env, a->u.exec.envc), "exec.env");
        break;
    case AL_STARTED:
        SAME_FIELD(started.pid);
        break;
    case AL_DATA:
        SAME_FIELD(data.stream);
        SAME_FIELD(data.len);
        SAME(a->u.data.len == 0 || memcmp(a->u.data.data, b->u.data.data, a->u.data.len) == 0,
             "data.data");
        break;
    case AL_CREDIT:
        SAME_FIELD(credit.stream);
        SAME_FIELD(credit.bytes);
        break;
    case AL_SIGNAL:
        SAME_FIELD(signal.signo);
        break;
    case AL_EXIT:
        SAME_FIELD(exit.how);
        SAME_FIELD(exit.value);
        SAME_FIELD(exit.duration_us);
        SAME_FIELD(exit.flags);
        break;
    case AL_ERROR:
        SAME_FIELD(error.klass);
        SAME_FIELD(error.err);
        SAME_STR(error.message);
        break;
    case AL_FILE_PUT:
        SAME_FIELD(file_put.mode);
        SAME_FIELD(file_put.size);
        SAME_STR(file_put.path);
        break;
    case AL_FILE_GET:
        SAME_STR(file_get.path);
        break;
    case AL_FILE_INFO:
        SAME_FIELD(file_info.mode);
        SAME_FIELD(file_info.size);
        break;
    case AL_OK:
        SAME_FIELD(ok.value);
        break;
    case AL_PING:
    case AL_PONG:
        SAME_FIELD(ping.cookie);
        break;
    case AL_SHUTDOWN:
        SAME_FIELD(shutdown.how);
        break;
    case AL_WAITING:
        SAME_FIELD(waiting.waited_ms);
        break;
    case AL_RESIZE:
        SAME_FIELD(resize.rows);
        SAME_FIELD(resize.cols);
        break;
    case AL_CONNECT:
        SAME_FIELD(connect.port);
        break;
    case AL_REFRESH:
        SAME(memcmp(a->u.refresh.seed, b->u.refresh.seed, AL_REFRESH_SEED) == 0, "refresh.seed");
        SAME_FIELD(refresh.sec);
        SAME_FIELD(refresh.nsec);
        SAME(memcmp(a->u.refresh.machine_id, b->u.refresh.machine_id, AL_MACHINE_ID) == 0,
             "refresh.machine_id");
        SAME_STR(refresh.hostname);
        break;
    default:
        break;
    }
    return true;
#undef SAME_STR
#undef SAME_FIELD
#undef SAME
}

/* ---- samples ---- */

static struct sample table[128];
static char names[ARRAY_SIZE(table)][40];
static size_t count;

static struct al_msg *add(uint8_t type, uint32_t id, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static struct al_msg *add(uint8_t type, uint32_t id, const char *fmt, ...)
{
    if (count == ARRAY_SIZE(table))
        abort();
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(names[count], sizeof(names[count]), fmt, ap);
    va_end(ap);
    struct sample *s = &table[count++];
    s->name = names[count - 1];
    s->msg.type = type;
    s->msg.id = id;
    return &s->msg;
}

static const char *const stream_names[AL_STREAM_COUNT] = {"stdin", "stdout", "stderr", "file"};
static const char *const lang_names[AL_LANGS_MAX] = {
    "python", "sh",   "bash", "node", "ruby", "perl", "lua",  "php",
    "r",      "deno", "bun",  "tcl",  "awk",  "zsh",  "fish",
};

static void build_hello(void)
{
    struct al_msg *m = add(AL_HELLO, 0, "hello");
    m->u.hello.version = AL_PROTO_VERSION;
    m->u.hello.nonce = 0x0123456789abcdefULL;
    m->u.hello.window = AL_WINDOW_DEFAULT;

    m = add(AL_HELLO, 0, "hello-window-min");
    m->u.hello.version = AL_PROTO_VERSION;
    m->u.hello.window = AL_WINDOW_MIN;

    m = add(AL_HELLO, 0, "hello-window-max");
    m->u.hello.version = AL_PROTO_VERSION;
    m->u.hello.nonce = UINT64_MAX;
    m->u.hello.window = AL_WINDOW_MAX;
}

static void build_hello_ack(void)
{
    struct al_msg *m = add(AL_HELLO_ACK, 0, "hello-ack-no-langs");
    m->u.hello_ack.version = AL_PROTO_VERSION;
    m->u.hello_ack.nonce = 0x0123456789abcdefULL;
    m->u.hello_ack.window = AL_WINDOW_DEFAULT;

    m = add(AL_HELLO_ACK, 0, "hello-ack-python");
    m->u.hello_ack.version = AL_PROTO_VERSION;
    m->u.hello_ack.nonce = 42;
    m->u.hello_ack.window = AL_WINDOW_DEFAULT;
    m->u.hello_ack.caps = AL_CAP_EXEC | AL_CAP_FILES;
    m->u.hello_ack.agent_version = S("0.1.0");
    m->u.hello_ack.nlangs = 1;
    m->u.hello_ack.langs[0] = S("python");

    m = add(AL_HELLO_ACK, 0, "hello-ack-several");
    m->u.hello_ack.version = AL_PROTO_VERSION;
    m->u.hello_ack.nonce = 0xfedcba9876543210ULL;
    m->u.hello_ack.window = AL_WINDOW_MIN;
    m->u.hello_ack.caps =
        AL_CAP_EXEC | AL_CAP_FILES | AL_CAP_SIGNAL | AL_CAP_SHUTDOWN | AL_CAP_CGROUP;
    m->u.hello_ack.agent_version = S("0.1.0-dev");
    m->u.hello_ack.nlangs = 4;
    for (int i = 0; i < 4; i++)
        m->u.hello_ack.langs[i] = al_str_cstr(lang_names[i]);

    m = add(AL_HELLO_ACK, 0, "hello-ack-limits");
    m->u.hello_ack.version = AL_PROTO_VERSION;
    m->u.hello_ack.window = AL_WINDOW_MAX;
    m->u.hello_ack.caps = UINT32_MAX;
    m->u.hello_ack.agent_version = fix_str(AL_SHORT_STR_MAX);
    m->u.hello_ack.nlangs = AL_LANGS_MAX;
    for (int i = 0; i < AL_LANGS_MAX - 1; i++)
        m->u.hello_ack.langs[i] = al_str_cstr(lang_names[i]);
    m->u.hello_ack.langs[AL_LANGS_MAX - 1] = fix_str(AL_SHORT_STR_MAX);
}

static void build_exec(void)
{
    struct al_msg *m = add(AL_EXEC, 1, "exec-program");
    m->u.exec.argc = 2;
    m->u.exec.argv[0] = S("/bin/echo");
    m->u.exec.argv[1] = S("hello");

    m = add(AL_EXEC, 2, "exec-python");
    m->u.exec.flags = AL_EXEC_STDIN;
    m->u.exec.timeout_ms = 30000;
    m->u.exec.output_cap = (1ULL << 40) + 5;
    m->u.exec.lang = S("python");
    m->u.exec.cwd = S("/tmp/work");
    m->u.exec.argc = 1;
    m->u.exec.argv[0] = S("import sys\nprint(sys.version)\n");
    m->u.exec.envc = 2;
    m->u.exec.env[0] = S("PYTHONUNBUFFERED=1");
    m->u.exec.env[1] = S("LANG=C.UTF-8");

    m = add(AL_EXEC, UINT32_MAX, "exec-binary-strings");
    m->u.exec.timeout_ms = UINT32_MAX;
    m->u.exec.output_cap = UINT64_MAX;
    m->u.exec.lang = S("sh");
    m->u.exec.argc = 3;
    m->u.exec.argv[0] = S("printf '\\0\\377'");
    m->u.exec.argv[1] = S("");
    m->u.exec.argv[2] = S("a\0b\377");
    m->u.exec.envc = 1;
    m->u.exec.env[0] = S("");

    m = add(AL_EXEC, 3, "exec-limits");
    m->u.exec.lang = fix_str(AL_SHORT_STR_MAX);
    m->u.exec.cwd = fix_str(AL_GUEST_PATH_MAX);
    m->u.exec.argc = AL_ARGV_MAX;
    for (int i = 0; i < AL_ARGV_MAX; i++)
        m->u.exec.argv[i] = fix_str((uint32_t)i);
    m->u.exec.envc = AL_ENV_MAX;
    for (int i = 0; i < AL_ENV_MAX; i++)
        m->u.exec.env[i] = fix_str((uint32_t)i * 3);

    /* flags, timeout, input wait, cap: 20; rows, cols: 4; lang, cwd, argc, argv[0] length, envc:
     * 4 each */
    m = add(AL_EXEC, 4, "exec-payload-max");
    m->u.exec.argc = 1;
    m->u.exec.argv[0] = fix_str(AL_FRAME_PAYLOAD_MAX - FIX_EXEC_OVERHEAD);

    m = add(AL_EXEC, 7, "exec-pty");
    m->u.exec.flags = AL_EXEC_PTY | AL_EXEC_STDIN;
    m->u.exec.rows = 24;
    m->u.exec.cols = 80;
    m->u.exec.argc = 2;
    m->u.exec.argv[0] = S("/bin/bash");
    m->u.exec.argv[1] = S("-l");
    m->u.exec.envc = 1;
    m->u.exec.env[0] = S("TERM=xterm-256color");
    m = add(AL_EXEC, 8, "exec-pty-limits");
    m->u.exec.flags = AL_EXEC_PTY;
    m->u.exec.rows = AL_PTY_DIM_MAX;
    m->u.exec.cols = 1;
    m->u.exec.argc = 1;
    m->u.exec.argv[0] = S("top");

    m = add(AL_EXEC, 5, "exec-kernel");
    m->u.exec.flags = AL_EXEC_KERNEL;
    m->u.exec.input_wait_ms = 5000;
    m->u.exec.lang = S("python");
    m->u.exec.argc = 1;
    m->u.exec.argv[0] = S("x = 1\nx + 1\n");

    m = add(AL_EXEC, 6, "exec-kernel-stdin-wait-max");
    m->u.exec.flags = AL_EXEC_KERNEL | AL_EXEC_STDIN;
    m->u.exec.input_wait_ms = AL_INPUT_WAIT_MAX_MS;
    m->u.exec.lang = S("shell");
    m->u.exec.argc = 1;
    m->u.exec.argv[0] = S("read line; echo \"$line\"");
}

static void build_data(void)
{
    for (uint8_t s = 0; s < AL_STREAM_COUNT; s++) {
        struct al_msg *m = add(AL_DATA, 5 + s, "data-%s", stream_names[s]);
        m->u.data.stream = s;
        m->u.data.data = (const uint8_t *)"some output\n";
        m->u.data.len = 12;

        m = add(AL_DATA, 5 + s, "data-%s-eof", stream_names[s]);
        m->flags = AL_FLAG_EOF;
        m->u.data.stream = s;
        m->u.data.data = (const uint8_t *)"last";
        m->u.data.len = 4;

        m = add(AL_DATA, 5 + s, "data-%s-empty-eof", stream_names[s]);
        m->flags = AL_FLAG_EOF;
        m->u.data.stream = s;
    }
    struct al_msg *m = add(AL_DATA, 9, "data-chunk-max");
    m->u.data.stream = AL_STREAM_STDOUT;
    m->u.data.data = (const uint8_t *)fix_str(AL_DATA_CHUNK_MAX).p;
    m->u.data.len = AL_DATA_CHUNK_MAX;

    m = add(AL_DATA, 9, "data-chunk-max-eof");
    m->flags = AL_FLAG_EOF;
    m->u.data.stream = AL_STREAM_FILE;
    m->u.data.data = (const uint8_t *)fix_str(AL_DATA_CHUNK_MAX).p;
    m->u.data.len = AL_DATA_CHUNK_MAX;
}

static void build_small(void)
{
    struct al_msg *m;
    for (uint8_t s = 0; s < AL_STREAM_COUNT; s++) {
        m = add(AL_CREDIT, 10, "credit-%s", stream_names[s]);
        m->u.credit.stream = s;
        m->u.credit.bytes = AL_DATA_CHUNK_MAX;
    }
    m = add(AL_CREDIT, 10, "credit-zero");
    m = add(AL_CREDIT, 10, "credit-window-max");
    m->u.credit.stream = AL_STREAM_STDERR;
    m->u.credit.bytes = AL_WINDOW_MAX;

    m = add(AL_STARTED, 1, "started");
    m->u.started.pid = 4242;
    m = add(AL_STARTED, UINT32_MAX, "started-pid-max");
    m->u.started.pid = UINT32_MAX;

    static const uint32_t signals[] = {9, 1, 64};
    for (size_t i = 0; i < ARRAY_SIZE(signals); i++) {
        m = add(AL_SIGNAL, 1, "signal-%u", signals[i]);
        m->u.signal.signo = signals[i];
    }

    static const int32_t codes[] = {0, 1, 255};
    for (size_t i = 0; i < ARRAY_SIZE(codes); i++) {
        m = add(AL_EXIT, 1, "exit-code-%d", codes[i]);
        m->u.exit.how = AL_EXIT_CODE;
        m->u.exit.value = codes[i];
        m->u.exit.duration_us = 1234567;
    }
    static const int32_t sigs[] = {1, 9, 64};
    for (size_t i = 0; i < ARRAY_SIZE(sigs); i++) {
        m = add(AL_EXIT, 1, "exit-signal-%d", sigs[i]);
        m->u.exit.how = AL_EXIT_SIGNAL;
        m->u.exit.value = sigs[i];
        m->u.exit.duration_us = UINT64_MAX;
    }
    for (uint32_t f = 1; f <= (AL_EXIT_TRUNC_STDOUT | AL_EXIT_TRUNC_STDERR | AL_EXIT_TIMED_OUT);
         f++) {
        m = add(AL_EXIT, 2, "exit-code-flags-%u", f);
        m->u.exit.how = AL_EXIT_CODE;
        m->u.exit.value = 3;
        m->u.exit.flags = f;
        m = add(AL_EXIT, 2, "exit-signal-flags-%u", f);
        m->u.exit.how = AL_EXIT_SIGNAL;
        m->u.exit.value = 15;
        m->u.exit.duration_us = 30000000;
        m->u.exit.flags = f;
    }

    for (uint16_t k = 1; k <= AL_ERR_CLASS_MAX_; k++) {
        m = add(AL_ERROR, k, "error-%s", al_error_class_name(k));
        m->u.error.klass = k;
        m->u.error.err = 100u + k;
        m->u.error.message = al_str_cstr(al_error_class_name(k));
    }
    m = add(AL_ERROR, 0, "error-empty-message");
    m->u.error.klass = AL_ERR_PROTOCOL;
    m = add(AL_ERROR, 3, "error-message-max");
    m->u.error.klass = AL_ERR_IO;
    m->u.error.err = UINT32_MAX;
    m->u.error.message = fix_str(AL_MESSAGE_MAX);

    m = add(AL_FILE_PUT, 20, "file-put");
    m->u.file_put.mode = 0644;
    m->u.file_put.size = 12;
    m->u.file_put.path = S("/tmp/hello.txt");
    m = add(AL_FILE_PUT, 21, "file-put-empty");
    m->u.file_put.path = S("/tmp/empty");
    m = add(AL_FILE_PUT, 22, "file-put-limits");
    m->u.file_put.mode = 07777;
    m->u.file_put.size = UINT64_MAX;
    m->u.file_put.path = fix_str(AL_GUEST_PATH_MAX);

    m = add(AL_FILE_GET, 23, "file-get");
    m->u.file_get.path = S("/etc/os-release");
    m = add(AL_FILE_GET, 24, "file-get-path-max");
    m->u.file_get.path = fix_str(AL_GUEST_PATH_MAX);

    m = add(AL_FILE_INFO, 23, "file-info");
    m->u.file_info.mode = 0755;
    m->u.file_info.size = 1234;
    m = add(AL_FILE_INFO, 24, "file-info-limits");
    m->u.file_info.mode = 07777;
    m->u.file_info.size = UINT64_MAX;

    m = add(AL_OK, 20, "ok");
    m = add(AL_OK, 20, "ok-max");
    m->u.ok.value = UINT64_MAX;

    m = add(AL_PING, 0, "ping");
    m->u.ping.cookie = 0x1122334455667788ULL;
    m = add(AL_PONG, 0, "pong");
    m->u.ping.cookie = 0x1122334455667788ULL;

    m = add(AL_SHUTDOWN, 0, "shutdown-poweroff");
    m->u.shutdown.how = AL_SHUTDOWN_POWEROFF;
    m = add(AL_SHUTDOWN, 0, "shutdown-reboot");
    m->u.shutdown.how = AL_SHUTDOWN_REBOOT;

    m = add(AL_WAITING, 2, "waiting");
    m->u.waiting.waited_ms = 2000;
    m = add(AL_WAITING, UINT32_MAX, "waiting-max");
    m->u.waiting.waited_ms = UINT32_MAX;

    m = add(AL_RESIZE, 7, "resize");
    m->u.resize.rows = 50;
    m->u.resize.cols = 132;
    m = add(AL_RESIZE, UINT32_MAX, "resize-limits");
    m->u.resize.rows = 1;
    m->u.resize.cols = AL_PTY_DIM_MAX;

    m = add(AL_CONNECT, 9, "connect");
    m->u.connect.port = 8000;
    m = add(AL_CONNECT, UINT32_MAX, "connect-limits");
    m->u.connect.port = 65535;

    m = add(AL_REFRESH, 25, "refresh");
    m->u.refresh.seed = (const uint8_t *)fix_str(AL_REFRESH_SEED).p;
    m->u.refresh.sec = 1796103306;
    m->u.refresh.nsec = 123456789;
    m->u.refresh.machine_id = (const uint8_t *)fix_str(AL_REFRESH_SEED + AL_MACHINE_ID).p + 7;
    m->u.refresh.hostname = S("airlock-3c0a0d4228c7");
    m = add(AL_REFRESH, 26, "refresh-limits");
    m->u.refresh.seed = (const uint8_t *)fix_str(AL_REFRESH_SEED).p;
    m->u.refresh.sec = INT64_MAX;
    m->u.refresh.nsec = 999999999;
    m->u.refresh.machine_id = (const uint8_t *)fix_str(AL_MACHINE_ID).p;
    m->u.refresh.hostname = S("a-123456789-123456789-123456789-123456789-123456789-123456789-1");
}

size_t fix_samples(const struct sample **out)
{
    if (!count) {
        build_hello();
        build_hello_ack();
        build_exec();
        build_data();
        build_small();
        static uint8_t scratch[FIX_FRAME_ROOM];
        for (size_t i = 0; i < count; i++) {
            struct raw r;
            raw_init(&r, scratch, sizeof(scratch));
            table[i].big = raw_msg(&r, &table[i].msg) > 4096;
        }
    }
    *out = table;
    return count;
}

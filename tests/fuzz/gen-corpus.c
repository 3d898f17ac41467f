/* Writes the seed corpus of fuzz-frame into the directory given: every small sample frame, a few
 * conversations as they appear on the channel, and malformed frames of each kind the decoder
 * refuses. Run through `ninja -C build fuzz-corpus`; the output is checked in. */
#include "airlock-proto.h"
#include "proto-fixtures.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *outdir;
static uint8_t buf[FIX_FRAME_ROOM * 2];

static void emit(const char *name, const uint8_t *p, size_t n)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", outdir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

static const struct al_msg *sample(const char *name)
{
    const struct sample *s;
    size_t count = fix_samples(&s);
    for (size_t i = 0; i < count; i++) {
        if (!strcmp(s[i].name, name))
            return &s[i].msg;
    }
    fprintf(stderr, "no sample '%s'\n", name);
    exit(1);
}

/* Samples back to back, as one side would write them. */
static void emit_stream(const char *name, const char *const *frames)
{
    size_t len = 0;
    for (; *frames; frames++) {
        int n = al_msg_encode(sample(*frames), buf + len, sizeof(buf) - len);
        if (n < 0)
            exit(1);
        len += (size_t)n;
    }
    emit(name, buf, len);
}

/* A sample written raw after edit() changes it: frames the encoder would refuse. */
static void emit_raw(const char *name, const char *base, void (*edit)(struct al_msg *m))
{
    static struct al_msg m;
    struct raw r;
    m = *sample(base);
    edit(&m);
    raw_init(&r, buf, sizeof(buf));
    emit(name, buf, raw_msg(&r, &m));
}

/* The mutations, one a line: each breaks one bound of a valid message. */
/* clang-format off */
static void zero_argc(struct al_msg *m) { m->u.exec.argc = 0; }
static void many_argv(struct al_msg *m) { m->u.exec.argc = AL_ARGV_MAX + 1; }
static void many_langs(struct al_msg *m) { m->u.hello_ack.nlangs = AL_LANGS_MAX + 1; }
static void signal_65(struct al_msg *m) { m->u.signal.signo = 65; }
static void status_256(struct al_msg *m) { m->u.exit.value = 256; }
static void exit_kind_2(struct al_msg *m) { m->u.exit.how = 2; }
static void class_9(struct al_msg *m) { m->u.error.klass = AL_ERR_CLASS_MAX_ + 1; }
static void mode_high(struct al_msg *m) { m->u.file_put.mode = 010644; }
static void shutdown_2(struct al_msg *m) { m->u.shutdown.how = 2; }
static void credit_over(struct al_msg *m) { m->u.credit.bytes = AL_WINDOW_MAX + 1; }
static void stream_over(struct al_msg *m) { m->u.data.stream = AL_STREAM_COUNT; }
static void flag_unknown(struct al_msg *m) { m->flags = 1u << 1; }
static void flag_eof(struct al_msg *m) { m->flags = AL_FLAG_EOF; }
static void type_0(struct al_msg *m) { m->type = 0; }
static void type_over(struct al_msg *m) { m->type = AL_TYPE_MAX_ + 1; }
static void kernel_no_lang(struct al_msg *m) { m->u.exec.lang.len = 0; }
static void input_wait_over(struct al_msg *m) { m->u.exec.input_wait_ms = AL_INPUT_WAIT_MAX_MS + 1; }
static void nsec_over(struct al_msg *m) { m->u.refresh.nsec = 1000000000u; }
static void hostname_dot(struct al_msg *m) { m->u.refresh.hostname = al_str_cstr("a.b"); }
/* clang-format on */

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: gen-corpus DIR\n");
        return 2;
    }
    outdir = argv[1];

    const struct sample *s;
    size_t count = fix_samples(&s);
    for (size_t i = 0; i < count; i++) {
        if (s[i].big)
            continue;
        char name[64];
        int n = al_msg_encode(&s[i].msg, buf, sizeof(buf));
        if (n < 0)
            return 1;
        snprintf(name, sizeof(name), "valid-%s", s[i].name);
        emit(name, buf, (size_t)n);
    }

    emit_stream("stream-handshake", (const char *const[]){"hello", "hello-ack-python", NULL});
    emit_stream("stream-exec", (const char *const[]){"exec-python", "started", "data-stdin",
                                                     "data-stdin-empty-eof", "credit-stdout",
                                                     "data-stdout", "data-stdout-eof",
                                                     "data-stderr-empty-eof", "exit-code-0", NULL});
    emit_stream("stream-file-put",
                (const char *const[]){"file-put", "data-file", "data-file-eof", "ok", NULL});
    emit_stream("stream-file-get",
                (const char *const[]){"file-get", "file-info", "data-file-empty-eof", NULL});
    emit_stream("stream-kernel",
                (const char *const[]){"exec-kernel", "started", "waiting", "signal-9",
                                      "data-stdout-eof", "data-stderr-empty-eof", "exit-code-1",
                                      NULL});
    emit_stream("stream-ping-shutdown",
                (const char *const[]){"ping", "pong", "shutdown-poweroff", NULL});

    emit_raw("bad-exec-argc-0", "exec-program", zero_argc);
    emit_raw("bad-exec-argc-257", "exec-program", many_argv);
    emit_raw("bad-hello-ack-17-langs", "hello-ack-python", many_langs);
    emit_raw("bad-signal-65", "signal-9", signal_65);
    emit_raw("bad-exit-status-256", "exit-code-0", status_256);
    emit_raw("bad-exit-kind-2", "exit-code-0", exit_kind_2);
    emit_raw("bad-error-class-9", "error-io", class_9);
    emit_raw("bad-file-put-mode", "file-put", mode_high);
    emit_raw("bad-shutdown-2", "shutdown-reboot", shutdown_2);
    emit_raw("bad-refresh-nsec", "refresh", nsec_over);
    emit_raw("bad-refresh-hostname", "refresh", hostname_dot);
    emit_raw("bad-credit-over-window", "credit-stdout", credit_over);
    emit_raw("bad-data-stream-5", "data-stdout", stream_over);
    emit_raw("bad-data-unknown-flag", "data-stdout", flag_unknown);
    emit_raw("bad-ping-eof-flag", "ping", flag_eof);
    emit_raw("bad-type-0", "ping", type_0);
    emit_raw("bad-type-over", "ping", type_over);
    emit_raw("bad-exec-kernel-no-lang", "exec-kernel", kernel_no_lang);
    emit_raw("bad-exec-input-wait-over", "exec-kernel", input_wait_over);

    /* Byte-level damage to a good frame. */
    int n = al_msg_encode(sample("exec-python"), buf, sizeof(buf));
    if (n < 0)
        return 1;
    buf[8]--; /* declared length one short of the fields */
    emit("bad-exec-truncated", buf, (size_t)n - 1);
    n = al_msg_encode(sample("ping"), buf, sizeof(buf));
    buf[8]++;
    buf[n] = 0;
    emit("bad-ping-trailing-byte", buf, (size_t)n + 1);
    buf[8]--;
    memcpy(buf + n, "garbage!", 8);
    emit("bad-frame-then-garbage", buf, (size_t)n + 8);
    buf[0] = 'X';
    emit("bad-magic", buf, (size_t)n);
    buf[0] = 'A';
    buf[1] = 'X';
    emit("bad-magic-second-byte", buf, (size_t)n);
    buf[1] = 'L';
    emit("bad-header-cut", buf, AL_FRAME_HEADER_SIZE - 1);
    uint32_t over = AL_FRAME_PAYLOAD_MAX + 1;
    for (int i = 0; i < 4; i++)
        buf[8 + i] = (uint8_t)(over >> (8 * i));
    emit("bad-length-over-max", buf, AL_FRAME_HEADER_SIZE);
    return 0;
}

/* E2B's wire forms (e2bwire.c), apart from HTTP so that a fuzz target reaches them: Connect
 * envelopes, a run's events as envd's process events and as the code interpreter's JSON lines,
 * and the guest's directory watcher (airlock-agent --watch) read into envd's filesystem
 * events. What the watcher prints is the guest's: parsed with bounds, any breach ends it. */
#ifndef AIRLOCK_E2BWIRE_H
#define AIRLOCK_E2BWIRE_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One envelope (malloc'd, *len bytes) holding n bytes of json; flags 0 for a message, 2 for
 * the end of the stream. envelope_json takes (and frees) o. */
char *ad_e2b_envelope(unsigned flags, const char *json, size_t n, size_t *len);
char *ad_e2b_envelope_json(unsigned flags, cJSON *o, size_t *len);
/* A streaming call's request: its first envelope's JSON object, or NULL (short, compressed,
 * a length past the body, not JSON, not an object). */
cJSON *ad_e2b_envelope_parse(const char *body, size_t len);

/* The ad_run_fmt of a process's events as envd's (Start, Connect): see runs.c's ad_run_stream. */
struct ad_e2b_pfmt {
    unsigned pid;
    bool pty;
    bool start_due; /* Connect: a start event first (the SDK waits for one) */
};
char *ad_e2b_fmt_process(void *ctx, const char *type, const char *json, size_t json_len,
                         size_t *len, bool *last);

/* The ad_run_fmt of a kernel run's events as the interpreter's JSON lines. Output is held
 * until its line ends (or another event comes), so that print("hi") is one "hi\n" entry. */
#define AD_E2B_HELD_MAX 65536
struct ad_e2b_cifmt {
    void *run;     /* the caller's (e2b.c: the run, referenced) */
    char *held[2]; /* stdout, stderr: bytes not yet sent */
    size_t held_len[2];
};
char *ad_e2b_fmt_execute(void *ctx, const char *type, const char *json, size_t json_len,
                         size_t *len, bool *last);
void ad_e2b_cifmt_clear(struct ad_e2b_cifmt *x);

/* The watcher's stdout, fed as it comes: "ok", then "KIND HEX" lines (guest-agent/watch.c). */
#define AD_E2B_WATCH_NAME_MAX 4096
#define AD_E2B_WATCH_LINE_MAX (16 + 2 * AD_E2B_WATCH_NAME_MAX)
struct ad_e2b_watch {
    char line[AD_E2B_WATCH_LINE_MAX];
    size_t len;
    bool started; /* "ok" was read */
    bool failed;  /* an "err" line or a breach: code and msg say which; nothing more is read */
    char code[32];
    char msg[200];
    uint64_t overflows;
};
/* Appends the events in data (FilesystemEvent objects, JSON as envd's) to events (an array);
 * the first "ok" sets started. Stops at a failure. */
void ad_e2b_watch_feed(struct ad_e2b_watch *w, const uint8_t *data, size_t n, cJSON *events);

/* The ad_run_fmt of a watcher's run as WatchDir's stream: a start message once it watches,
 * a message per event, keepalives, and an end that carries the watcher's failure. */
struct ad_e2b_wfmt {
    void *run; /* the caller's (e2b.c: the run, referenced; stopped with the stream) */
    struct ad_e2b_watch w;
    bool start_sent;
};
char *ad_e2b_fmt_watch(void *ctx, const char *type, const char *json, size_t json_len, size_t *len,
                       bool *last);
/* Feeds a watcher run's event (type and JSON as runs.c holds them) to w: its stdout's bytes;
 * its end before "ok" is a failure. */
void ad_e2b_watch_event(struct ad_e2b_watch *w, const char *type, const char *json, size_t json_len,
                        cJSON *events);
/* The end-of-stream JSON for w ({} or {"error": ...}): envd's codes. */
cJSON *ad_e2b_watch_end(const struct ad_e2b_watch *w);

#endif

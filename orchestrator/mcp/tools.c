/* The MCP server's tools: one table (struct tool) from which tools/list's inputSchema is made
 * and by which every call's arguments are checked before a worker starts; the tools
 * themselves, thin callers of libairlock; and a session's /workspace as resources. */
#include "mcpint.h"

#include "chat.h" /* al_vision_png_fit */
#include "util.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define READ_DEFAULT (1u << 20)
#define READ_MAX (16u << 20)
#define WRITE_MAX (10u << 20) /* decoded bytes of one write_file */
#define TIMEOUT_DEFAULT_S 120
#define TIMEOUT_MAX_S 86400
#define PROCESS_READ_DEFAULT (64u << 10)
#define RESOURCES_MAX 500
#define RESOURCE_READ_MAX (4u << 20)
#define ACTIONS_MAX 100 /* input actions in one computer call */

/* ---- the table ---- */

enum ptype { P_STR, P_INT, P_BOOL, P_STRS, P_ENV, P_ID, P_ACTS };
enum pmax { MAX_FIXED, MAX_MEMORY, MAX_CPUS, MAX_LIFETIME };

struct param {
    const char *name;
    enum ptype type;
    bool required;
    const char *desc;
    long long min, max; /* P_INT; P_STR, P_STRS: lengths (max 0: none) */
    enum pmax max_from;
    const char *const *choices; /* P_STR: one of these */
    bool needs_network;         /* present only when the server allows network */
    bool name_chars;            /* P_STR: letters, digits, '.', '_', '-' only */
};

/* What a tool is called with: the session or run its first parameter names is looked up (with
 * a reference, dropped after) by mcp_tools_call. */
struct targs {
    al_mcp *m;
    struct mcp_call *c;
    const cJSON *a;
    struct mcp_sess *ss;
    struct mcp_run *r;
};

struct tool {
    const char *name, *title, *desc;
    const struct param *params;
    const char *output; /* outputSchema as JSON */
    bool read_only, destructive, idempotent, runs_code;
    cJSON *(*fn)(const struct targs *t);
};

static const char *const languages[] = {"python", "bash", "javascript", NULL};
static const char *const encodings[] = {"utf-8", "base64", NULL};
static const char *const signals[] = {"INT", "TERM", "KILL", NULL};

#define P_SESSION                                                                                  \
    {                                                                                              \
        "session", P_STR, true, "The handle start_session returned", 1, 64, MAX_FIXED, NULL,       \
            false, true                                                                            \
    }
#define P_END                                                                                      \
    {                                                                                              \
        NULL, 0, false, NULL, 0, 0, MAX_FIXED, NULL, false, false                                  \
    }

static const struct param p_start[] = {
    {"image", P_STR, false, "Image name (default: the server's)", 1, 63, MAX_FIXED, NULL, false,
     true},
    {"snapshot", P_STR, false,
     "Start from this snapshot of yours (snapshot_session) instead of an image: its memory, "
     "processes and files as they were saved (its image and memory are the snapshot's)",
     1, 63, MAX_FIXED, NULL, false, true},
    {"memory_mib", P_INT, false, "Guest memory in MiB (default: the image's)", 128, 0, MAX_MEMORY,
     NULL, false, false},
    {"volumes", P_STRS, false,
     "Volumes of yours to mount, each \"NAME:/PATH\" (read-write: in one session at a time) or "
     "\"NAME:/PATH:ro\" (read-only: in many at once, while none writes it); their files outlive "
     "the session",
     3, 330, MAX_FIXED, NULL, false, false},
    {"cpus", P_INT, false, "Virtual CPUs (default 1)", 1, 0, MAX_CPUS, NULL, false, false},
    {"network", P_STRS, false,
     "Hosts the session may reach over HTTP(S), e.g. [\"pypi.org\", \"*.githubusercontent.com\"] "
     "(default: no network at all)",
     1, 253, MAX_FIXED, NULL, true, false},
    {"lifetime_s", P_INT, false, "Seconds after which the session ends on its own", 1, 604800,
     MAX_LIFETIME, NULL, false, false},
    {"display", P_BOOL, false,
     "A screen, mouse and keyboard the host drives, for the screenshot and computer tools "
     "(default false; the desktop image's sessions always have one)",
     0, 0, MAX_FIXED, NULL, false, false},
    {"display_width", P_INT, false,
     "The display's width in pixels, a multiple of 8 (with display_height; default 1280)",
     AL_DISPLAY_MIN_W, AL_DISPLAY_MAX_W, MAX_FIXED, NULL, false, false},
    {"display_height", P_INT, false,
     "The display's height in pixels, a multiple of 8 (with display_width; default 800)",
     AL_DISPLAY_MIN_H, AL_DISPLAY_MAX_H, MAX_FIXED, NULL, false, false},
    P_END};
static const struct param p_session[] = {P_SESSION, P_END};
static const struct param p_run_code[] = {
    P_SESSION,
    {"code", P_STR, true, "The code to run", 0, 0, MAX_FIXED, NULL, false, false},
    {"language", P_STR, false,
     "python (default), bash or javascript; each keeps its state (variables, cwd) between calls", 0,
     0, MAX_FIXED, languages, false, false},
    {"timeout_s", P_INT, false, "Seconds before the run is interrupted (default 120)", 1,
     TIMEOUT_MAX_S, MAX_FIXED, NULL, false, false},
    {"context", P_STR, false,
     "A named kernel of its own, with its own state (default: the shared one)", 1, 32, MAX_FIXED,
     NULL, false, true},
    {"wait_s", P_INT, false,
     "Return after this many seconds with the run id if it is still running (run_output picks "
     "it up); default: wait for the end",
     0, 3600, MAX_FIXED, NULL, false, false},
    P_END};
static const struct param p_run_output[] = {
    {"run", P_STR, true, "The run id run_code or run_command returned", 1, 64, MAX_FIXED, NULL,
     false, true},
    {"wait_s", P_INT, false, "Seconds to wait for the end (default and most: 50)", 0,
     MCP_WAIT_MAX_S, MAX_FIXED, NULL, false, false},
    P_END};
static const struct param p_run_command[] = {
    P_SESSION,
    {"command", P_STR, true, "A shell command line (sh -c)", 1, 0, MAX_FIXED, NULL, false, false},
    {"cwd", P_STR, false, "Working directory (default /workspace)", 1, 4096, MAX_FIXED, NULL, false,
     false},
    {"env", P_ENV, false, "Environment variables to add", 0, 0, MAX_FIXED, NULL, false, false},
    {"timeout_s", P_INT, false, "Seconds before the command is killed (default 120)", 1,
     TIMEOUT_MAX_S, MAX_FIXED, NULL, false, false},
    {"wait_s", P_INT, false,
     "Return after this many seconds with the run id if it is still running; default: wait", 0,
     3600, MAX_FIXED, NULL, false, false},
    P_END};
static const struct param p_start_process[] = {
    P_SESSION,
    {"command", P_STR, true, "A shell command line (sh -c), e.g. a server", 1, 0, MAX_FIXED, NULL,
     false, false},
    {"cwd", P_STR, false, "Working directory (default /workspace)", 1, 4096, MAX_FIXED, NULL, false,
     false},
    {"env", P_ENV, false, "Environment variables to add", 0, 0, MAX_FIXED, NULL, false, false},
    P_END};
static const struct param p_process_output[] = {
    {"process", P_STR, true, "The id start_process (or run_code) returned", 1, 64, MAX_FIXED, NULL,
     false, true},
    {"stdout_since", P_INT, false, "Byte offset to read stdout from (the last stdout_next)", 0,
     (1ll << 53), MAX_FIXED, NULL, false, false},
    {"stderr_since", P_INT, false, "Byte offset to read stderr from (the last stderr_next)", 0,
     (1ll << 53), MAX_FIXED, NULL, false, false},
    {"wait_s", P_INT, false, "Seconds to wait for new output or the end (default 0, most 50)", 0,
     MCP_WAIT_MAX_S, MAX_FIXED, NULL, false, false},
    {"max_bytes", P_INT, false, "Most bytes of each stream to return (default 65536)", 1, MCP_RING,
     MAX_FIXED, NULL, false, false},
    P_END};
static const struct param p_kill[] = {
    {"process", P_STR, true, "The process or run id", 1, 64, MAX_FIXED, NULL, false, true},
    {"signal", P_STR, false,
     "INT (interrupt: the program may catch it), TERM or KILL (default: end it and everything "
     "it started)",
     0, 0, MAX_FIXED, signals, false, false},
    P_END};
static const struct param p_read[] = {
    P_SESSION,
    {"path", P_STR, true, "File path in the VM (relative: to /workspace)", 1, 4096, MAX_FIXED, NULL,
     false, false},
    {"max_bytes", P_INT, false, "Refuse files larger than this (default 1 MiB, most 16 MiB)", 1,
     READ_MAX, MAX_FIXED, NULL, false, false},
    {"encoding", P_STR, false, "utf-8 or base64 (default: utf-8 for text, base64 otherwise)", 0, 0,
     MAX_FIXED, encodings, false, false},
    P_END};
static const struct param p_write[] = {
    P_SESSION,
    {"path", P_STR, true, "File path in the VM (relative: to /workspace)", 1, 4096, MAX_FIXED, NULL,
     false, false},
    {"content", P_STR, true, "The file's content", 0, 0, MAX_FIXED, NULL, false, false},
    {"encoding", P_STR, false, "utf-8 (default) or base64", 0, 0, MAX_FIXED, encodings, false,
     false},
    {"parents", P_BOOL, false, "Create missing parent directories (default true)", 0, 0, MAX_FIXED,
     NULL, false, false},
    P_END};
static const struct param p_list_files[] = {P_SESSION,
                                            {"path", P_STR, false,
                                             "Directory in the VM (default /workspace)", 1, 4096,
                                             MAX_FIXED, NULL, false, false},
                                            P_END};
static const struct param p_fork[] = {P_SESSION,
                                      {"count", P_INT, false, "How many forks (default 1)", 1,
                                       AL_MCP_FORK_MAX, MAX_FIXED, NULL, false, false},
                                      P_END};
static const struct param p_snapshot[] = {
    P_SESSION,
    {"name", P_STR, true, "The snapshot's name (1 to 63 of A-Z a-z 0-9 . _ -)", 1, 63, MAX_FIXED,
     NULL, false, true},
    {"replace", P_BOOL, false, "Save over a snapshot of that name (default false)", 0, 0, MAX_FIXED,
     NULL, false, false},
    P_END};
static const struct param p_snapshot_name[] = {
    {"name", P_STR, true, "The snapshot's name", 1, 63, MAX_FIXED, NULL, false, true}, P_END};
static const struct param p_checkpoint[] = {
    P_SESSION,
    {"name", P_STR, false, "A name for it (letters, digits, . _ -; not all digits)", 1,
     AL_CHECKPOINT_NAME_MAX, MAX_FIXED, NULL, false, true},
    P_END};
static const struct param p_rollback[] = {P_SESSION,
                                          {"checkpoint", P_ID, true, "The checkpoint's id or name",
                                           1, AL_CHECKPOINT_NAME_MAX, MAX_FIXED, NULL, false,
                                           false},
                                          P_END};

static const struct param p_screenshot[] = {
    P_SESSION,
    {"max_edge", P_INT, false,
     "Scale the image down so its longer side is at most this (default "
     "1568)",
     16, 8192, MAX_FIXED, NULL, false, false},
    P_END};
static const struct param p_computer[] = {
    P_SESSION,
    {"actions", P_ACTS, true,
     "Actions in order, each {\"action\": NAME, ...}: mouse_move, left_click, right_click, "
     "middle_click, double_click, triple_click, left_mouse_down, left_mouse_up (\"coordinate\": "
     "[x, y], optional for clicks; \"text\": keys held during a click), left_click_drag "
     "(\"start_coordinate\", \"coordinate\"), scroll (\"scroll_direction\": up|down|left|right, "
     "\"scroll_amount\"), key (\"text\": \"ctrl+s\", xdotool key names, chords separated by "
     "spaces; \"repeat\"), hold_key (\"text\", \"duration\" s), type (\"text\": ASCII as "
     "keys, other characters through the guest's xdotool), wait (\"duration\" s), cursor_position. "
     "Coordinates are pixels of the last "
     "screenshot",
     1, ACTIONS_MAX, MAX_FIXED, NULL, false, false},
    {"screenshot", P_BOOL, false, "Return a screenshot taken after the actions (default true)", 0,
     0, MAX_FIXED, NULL, false, false},
    P_END};

#define RUN_SCHEMA                                                                                 \
    "{\"type\":\"object\",\"properties\":{"                                                        \
    "\"run\":{\"type\":\"string\"},\"session\":{\"type\":\"string\"},"                             \
    "\"state\":{\"type\":\"string\",\"enum\":[\"queued\",\"running\",\"done\"]},"                  \
    "\"queued_behind\":{\"type\":\"integer\"},"                                                    \
    "\"exit_code\":{\"type\":[\"integer\",\"null\"]},"                                             \
    "\"signal\":{\"type\":[\"integer\",\"null\"]},"                                                \
    "\"timed_out\":{\"type\":\"boolean\"},\"interrupted\":{\"type\":\"boolean\"},"                 \
    "\"killed\":{\"type\":\"boolean\"},\"duration_ms\":{\"type\":\"integer\"},"                    \
    "\"stdout\":{\"type\":\"string\"},\"stderr\":{\"type\":\"string\"},"                           \
    "\"stdout_bytes\":{\"type\":\"integer\"},\"stderr_bytes\":{\"type\":\"integer\"},"             \
    "\"truncated\":{\"type\":\"boolean\"},"                                                        \
    "\"error\":{\"type\":[\"object\",\"null\"]},"                                                  \
    "\"results\":{\"type\":\"array\",\"items\":{\"type\":\"object\"}},"                            \
    "\"images\":{\"type\":\"integer\"}},"                                                          \
    "\"required\":[\"run\",\"state\",\"stdout\",\"stderr\",\"truncated\",\"results\"]}"

static cJSON *t_start_session(const struct targs *t);
static cJSON *t_stop_session(const struct targs *t);
static cJSON *t_fork_session(const struct targs *t);
static cJSON *t_snapshot_session(const struct targs *t);
static cJSON *t_list_snapshots(const struct targs *t);
static cJSON *t_delete_snapshot(const struct targs *t);
static cJSON *t_list_sessions(const struct targs *t);
static cJSON *t_run_code(const struct targs *t);
static cJSON *t_run_output(const struct targs *t);
static cJSON *t_run_command(const struct targs *t);
static cJSON *t_start_process(const struct targs *t);
static cJSON *t_process_output(const struct targs *t);
static cJSON *t_kill_process(const struct targs *t);
static cJSON *t_list_processes(const struct targs *t);
static cJSON *t_read_file(const struct targs *t);
static cJSON *t_write_file(const struct targs *t);
static cJSON *t_list_files(const struct targs *t);
static cJSON *t_checkpoint(const struct targs *t);
static cJSON *t_rollback(const struct targs *t);
static cJSON *t_list_checkpoints(const struct targs *t);
static cJSON *t_screenshot(const struct targs *t);
static cJSON *t_computer(const struct targs *t);

// clang-format off
static const struct tool tools[] = {
    {"start_session", "Start a sandbox VM",
     "Boots a disposable virtual machine and returns its session handle, which every other tool "
     "takes. Code, files and processes stay in it until stop_session (or this server ends).",
     p_start,
     "{\"type\":\"object\",\"properties\":{\"session\":{\"type\":\"string\"},"
     "\"image\":{\"type\":\"string\"},\"cpus\":{\"type\":\"integer\"},"
     "\"memory_mib\":{\"type\":\"integer\"},\"kvm\":{\"type\":\"boolean\"},"
     "\"network\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},"
     "\"languages\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},"
     "\"boot_ms\":{\"type\":\"integer\"}},\"required\":[\"session\",\"image\"]}",
     false, false, false, false, t_start_session},
    {"stop_session", "Stop a sandbox VM",
     "Ends the session: its VM, files and processes are destroyed.", p_session,
     "{\"type\":\"object\",\"properties\":{\"session\":{\"type\":\"string\"},"
     "\"stopped\":{\"type\":\"boolean\"}},\"required\":[\"session\",\"stopped\"]}",
     false, true, true, false, t_stop_session},
    {"fork_session", "Fork a sandbox VM",
     "Starts count new sessions, each with this session's whole state as it is now: memory, "
     "the kernels' variables and imports, background processes, open ports and files. The "
     "session stands still for the save only and goes on. A write in one fork is in no other. "
     "Returns each fork's session handle (or why that one failed).",
     p_fork,
     "{\"type\":\"object\",\"properties\":{\"forks\":{\"type\":\"array\","
     "\"items\":{\"type\":\"object\"}},\"paused_ms\":{\"type\":\"integer\"}},"
     "\"required\":[\"forks\"]}",
     false, false, false, false, t_fork_session},
    {"snapshot_session", "Save a sandbox VM as a snapshot",
     "Saves the session's whole state (memory, kernels, background processes, files) under a "
     "name; it outlives the session, and start_session with snapshot starts new sessions from "
     "it. The session stands still for the save only.",
     p_snapshot,
     "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
     "\"image\":{\"type\":\"string\"},\"bytes\":{\"type\":\"integer\"}},"
     "\"required\":[\"name\"]}",
     false, false, false, false, t_snapshot_session},
    {"list_snapshots", "List snapshots", "Your snapshots, with their image and size.", NULL,
     "{\"type\":\"object\",\"properties\":{\"snapshots\":{\"type\":\"array\","
     "\"items\":{\"type\":\"object\"}}},\"required\":[\"snapshots\"]}",
     true, false, true, false, t_list_snapshots},
    {"delete_snapshot", "Delete a snapshot",
     "Removes a snapshot (sessions started from it go on).", p_snapshot_name,
     "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
     "\"deleted\":{\"type\":\"boolean\"}},\"required\":[\"name\",\"deleted\"]}",
     false, true, true, false, t_delete_snapshot},
    {"list_sessions", "List sandbox VMs", "The sessions this client has open.", NULL,
     "{\"type\":\"object\",\"properties\":{\"sessions\":{\"type\":\"array\","
     "\"items\":{\"type\":\"object\"}}},\"required\":[\"sessions\"]}",
     true, false, true, false, t_list_sessions},
    {"run_code", "Run code",
     "Runs Python, bash or JavaScript in the session's long-lived kernel (variables, imports and "
     "cwd persist between calls). Returns stdout, stderr, the value of the last expression, "
     "figures as images, and the exit status.",
     p_run_code, RUN_SCHEMA, false, false, false, true, t_run_code},
    {"run_output", "Get a run's output",
     "Waits for a run that run_code or run_command left running (wait_s) and returns its output "
     "so far, or all of it once it ended.",
     p_run_output, RUN_SCHEMA, true, false, true, false, t_run_output},
    {"run_command", "Run a shell command",
     "Runs one command line with sh -c in a fresh process (cwd /workspace by default) and "
     "returns its output and exit status.",
     p_run_command, RUN_SCHEMA, false, false, false, true, t_run_command},
    {"start_process", "Start a background process",
     "Starts a command that keeps running (a server, a watcher, a long job) and returns its id "
     "at once; read its output with process_output, end it with kill_process.",
     p_start_process,
     "{\"type\":\"object\",\"properties\":{\"process\":{\"type\":\"string\"},"
     "\"session\":{\"type\":\"string\"},\"state\":{\"type\":\"string\"},"
     "\"exit_code\":{\"type\":[\"integer\",\"null\"]}},\"required\":[\"process\",\"state\"]}",
     false, false, false, true, t_start_process},
    {"process_output", "Read a process's output",
     "Returns what a background process wrote since the given offsets (waiting up to wait_s for "
     "more), and whether it still runs.",
     p_process_output,
     "{\"type\":\"object\",\"properties\":{\"process\":{\"type\":\"string\"},"
     "\"state\":{\"type\":\"string\",\"enum\":[\"running\",\"done\"]},"
     "\"exit_code\":{\"type\":[\"integer\",\"null\"]},\"signal\":{\"type\":[\"integer\",\"null\"]},"
     "\"stdout\":{\"type\":\"string\"},\"stderr\":{\"type\":\"string\"},"
     "\"stdout_next\":{\"type\":\"integer\"},\"stderr_next\":{\"type\":\"integer\"},"
     "\"stdout_skipped\":{\"type\":\"integer\"},\"stderr_skipped\":{\"type\":\"integer\"}},"
     "\"required\":[\"process\",\"state\",\"stdout\",\"stderr\",\"stdout_next\",\"stderr_next\"]}",
     true, false, false, false, t_process_output},
    {"kill_process", "Stop a process",
     "Sends a background process (or a run) a signal; TERM and KILL end it and every process it "
     "started.",
     p_kill,
     "{\"type\":\"object\",\"properties\":{\"process\":{\"type\":\"string\"},"
     "\"state\":{\"type\":\"string\"},\"exit_code\":{\"type\":[\"integer\",\"null\"]},"
     "\"signal\":{\"type\":[\"integer\",\"null\"]}},\"required\":[\"process\",\"state\"]}",
     false, true, true, false, t_kill_process},
    {"list_processes", "List processes", "The runs and background processes of a session.",
     p_session,
     "{\"type\":\"object\",\"properties\":{\"processes\":{\"type\":\"array\","
     "\"items\":{\"type\":\"object\"}}},\"required\":[\"processes\"]}",
     true, false, true, false, t_list_processes},
    {"read_file", "Read a file", "Reads a file from the VM: text as UTF-8, anything else as base64.",
     p_read,
     "{\"type\":\"object\",\"properties\":{\"path\":{\"type\":\"string\"},"
     "\"size\":{\"type\":\"integer\"},\"encoding\":{\"type\":\"string\"},"
     "\"content\":{\"type\":\"string\"}},\"required\":[\"path\",\"size\",\"encoding\",\"content\"]}",
     true, false, true, false, t_read_file},
    {"write_file", "Write a file",
     "Writes a file in the VM (replacing it), creating its directories by default.", p_write,
     "{\"type\":\"object\",\"properties\":{\"path\":{\"type\":\"string\"},"
     "\"bytes\":{\"type\":\"integer\"}},\"required\":[\"path\",\"bytes\"]}",
     false, true, true, false, t_write_file},
    {"list_files", "List a directory", "Lists a directory of the VM (default /workspace).",
     p_list_files,
     "{\"type\":\"object\",\"properties\":{\"path\":{\"type\":\"string\"},"
     "\"entries\":{\"type\":\"array\",\"items\":{\"type\":\"object\"}}},"
     "\"required\":[\"path\",\"entries\"]}",
     true, false, true, false, t_list_files},
    {"checkpoint", "Take a checkpoint",
     "Saves the whole VM (memory, processes, disk) so that rollback can return to this moment.",
     p_checkpoint,
     "{\"type\":\"object\",\"properties\":{\"checkpoint\":{\"type\":\"string\"},"
     "\"id\":{\"type\":\"integer\"},\"name\":{\"type\":\"string\"},"
     "\"state_bytes\":{\"type\":\"integer\"},\"save_ms\":{\"type\":\"integer\"}},"
     "\"required\":[\"checkpoint\",\"id\"]}",
     false, false, false, false, t_checkpoint},
    {"rollback", "Roll back to a checkpoint",
     "Puts the whole VM back as it was at a checkpoint: files, memory, processes and kernels. "
     "Whatever happened since is undone, runs in flight included.",
     p_rollback,
     "{\"type\":\"object\",\"properties\":{\"session\":{\"type\":\"string\"},"
     "\"checkpoint\":{\"type\":\"string\"},\"id\":{\"type\":\"integer\"}},"
     "\"required\":[\"session\",\"checkpoint\",\"id\"]}",
     false, true, true, false, t_rollback},
    {"list_checkpoints", "List checkpoints", "The checkpoints of a session, oldest first.",
     p_session,
     "{\"type\":\"object\",\"properties\":{\"checkpoints\":{\"type\":\"array\","
     "\"items\":{\"type\":\"object\"}}},\"required\":[\"checkpoints\"]}",
     true, false, true, false, t_list_checkpoints},
    {"screenshot", "Take a screenshot",
     "The screen of a session started with display, as an image, taken by the host (not by "
     "software in the VM).",
     p_screenshot,
     "{\"type\":\"object\",\"properties\":{\"width\":{\"type\":\"integer\"},"
     "\"height\":{\"type\":\"integer\"},\"screen_width\":{\"type\":\"integer\"},"
     "\"screen_height\":{\"type\":\"integer\"}},"
     "\"required\":[\"width\",\"height\",\"screen_width\",\"screen_height\"]}",
     true, false, false, false, t_screenshot},
    {"computer", "Use the mouse and keyboard",
     "Moves, clicks, drags, scrolls, presses keys and types in a session started with display, "
     "through its virtual tablet and keyboard, then returns a screenshot. Coordinates are pixels "
     "of the last screenshot; one outside the screen fails that action (the ones before it ran).",
     p_computer,
     "{\"type\":\"object\",\"properties\":{\"done\":{\"type\":\"integer\"},"
     "\"cursor\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"}},"
     "\"width\":{\"type\":\"integer\"},\"height\":{\"type\":\"integer\"}},"
     "\"required\":[\"done\",\"cursor\"]}",
     false, true, false, false, t_computer},
};
// clang-format on
#define NTOOLS (sizeof(tools) / sizeof(tools[0]))

static const struct tool *tool_find(const char *name)
{
    for (size_t i = 0; i < NTOOLS; i++)
        if (!strcmp(tools[i].name, name))
            return &tools[i];
    return NULL;
}

static long long param_max(const al_mcp *m, const struct param *p)
{
    switch (p->max_from) {
    case MAX_MEMORY:
        return m->o.memory_max_mib;
    case MAX_CPUS:
        return m->o.vcpus_max;
    case MAX_LIFETIME:
        return m->o.lifetime_max_s && m->o.lifetime_max_s < p->max ? m->o.lifetime_max_s : p->max;
    default:
        return p->max;
    }
}

static bool param_here(const al_mcp *m, const struct param *p)
{
    return !p->needs_network || m->o.network;
}

static cJSON *param_schema(const al_mcp *m, const struct param *p)
{
    cJSON *s = cJSON_CreateObject();
    long long max = param_max(m, p);
    switch (p->type) {
    case P_STR:
        cJSON_AddStringToObject(s, "type", "string");
        if (p->choices) {
            cJSON *e = cJSON_AddArrayToObject(s, "enum");
            for (const char *const *c = p->choices; *c; c++)
                cJSON_AddItemToArray(e, cJSON_CreateString(*c));
        }
        if (p->min)
            cJSON_AddNumberToObject(s, "minLength", (double)p->min);
        if (max)
            cJSON_AddNumberToObject(s, "maxLength", (double)max);
        if (p->name_chars)
            cJSON_AddStringToObject(s, "pattern", "^[A-Za-z0-9._-]+$");
        break;
    case P_INT:
        cJSON_AddStringToObject(s, "type", "integer");
        cJSON_AddNumberToObject(s, "minimum", (double)p->min);
        if (max)
            cJSON_AddNumberToObject(s, "maximum", (double)max);
        break;
    case P_BOOL:
        cJSON_AddStringToObject(s, "type", "boolean");
        break;
    case P_STRS: {
        cJSON_AddStringToObject(s, "type", "array");
        cJSON *it = cJSON_AddObjectToObject(s, "items");
        cJSON_AddStringToObject(it, "type", "string");
        cJSON_AddNumberToObject(it, "minLength", (double)p->min);
        if (max)
            cJSON_AddNumberToObject(it, "maxLength", (double)max);
        cJSON_AddNumberToObject(s, "maxItems", AL_NET_ALLOW_MAX);
        break;
    }
    case P_ENV: {
        cJSON_AddStringToObject(s, "type", "object");
        cJSON *ap = cJSON_AddObjectToObject(s, "additionalProperties");
        cJSON_AddStringToObject(ap, "type", "string");
        break;
    }
    case P_ACTS: {
        cJSON_AddStringToObject(s, "type", "array");
        cJSON *it = cJSON_AddObjectToObject(s, "items");
        cJSON_AddStringToObject(it, "type", "object");
        cJSON *req = cJSON_AddArrayToObject(it, "required");
        cJSON_AddItemToArray(req, cJSON_CreateString("action"));
        cJSON_AddNumberToObject(s, "minItems", (double)p->min);
        cJSON_AddNumberToObject(s, "maxItems", (double)max);
        break;
    }
    case P_ID: {
        cJSON *t = cJSON_AddArrayToObject(s, "type");
        cJSON_AddItemToArray(t, cJSON_CreateString("string"));
        cJSON_AddItemToArray(t, cJSON_CreateString("integer"));
        break;
    }
    }
    cJSON_AddStringToObject(s, "description", p->desc);
    return s;
}

int mcp_tools_build(al_mcp *m, al_error *err)
{
    cJSON *r = cJSON_CreateObject();
    cJSON *list = cJSON_AddArrayToObject(r, "tools");
    for (size_t i = 0; i < NTOOLS; i++) {
        const struct tool *t = &tools[i];
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "name", t->name);
        cJSON_AddStringToObject(j, "title", t->title);
        cJSON_AddStringToObject(j, "description", t->desc);
        cJSON *in = cJSON_AddObjectToObject(j, "inputSchema");
        cJSON_AddStringToObject(in, "type", "object");
        cJSON *props = cJSON_AddObjectToObject(in, "properties");
        cJSON *req = cJSON_CreateArray();
        for (const struct param *p = t->params; p && p->name; p++) {
            if (!param_here(m, p))
                continue;
            cJSON_AddItemToObject(props, p->name, param_schema(m, p));
            if (p->required)
                cJSON_AddItemToArray(req, cJSON_CreateString(p->name));
        }
        if (cJSON_GetArraySize(req))
            cJSON_AddItemToObject(in, "required", req);
        else
            cJSON_Delete(req);
        cJSON_AddFalseToObject(in, "additionalProperties");
        cJSON *out = cJSON_Parse(t->output);
        if (!out) {
            cJSON_Delete(r);
            cJSON_Delete(j);
            return al_err(err, -EINVAL, "tool %s: its outputSchema does not parse", t->name);
        }
        cJSON_AddItemToObject(j, "outputSchema", out);
        cJSON *ann = cJSON_AddObjectToObject(j, "annotations");
        cJSON_AddStringToObject(ann, "title", t->title);
        cJSON_AddBoolToObject(ann, "readOnlyHint", t->read_only);
        if (!t->read_only) {
            cJSON_AddBoolToObject(ann, "destructiveHint", t->destructive);
            cJSON_AddBoolToObject(ann, "idempotentHint", t->idempotent);
        }
        /* Code reaches past the VM only when sessions may have network. */
        cJSON_AddBoolToObject(ann, "openWorldHint", t->runs_code && m->o.network);
        cJSON_AddItemToArray(list, j);
    }
    m->tools = r;
    return 0;
}

static bool name_chars_ok(const char *s)
{
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '.' || *s == '_' || *s == '-'))
            return false;
    return true;
}

int mcp_tools_check(al_mcp *m, const char *name, const cJSON *args, char *msg, size_t len)
{
    char esc[80];
    const struct tool *t = tool_find(name);
    if (!t) {
        snprintf(msg, len, "unknown tool: %s", al_term_escape(name, esc, sizeof(esc)));
        return -1;
    }
    if (args && !cJSON_IsObject(args) && !cJSON_IsNull(args)) {
        snprintf(msg, len, "invalid params: %s: arguments must be an object", name);
        return -1;
    }
    const cJSON *a, *obj = cJSON_IsObject(args) ? args : NULL;
    cJSON_ArrayForEach(a, obj)
    {
        const struct param *p = t->params;
        while (p && p->name && (strcmp(p->name, a->string) || !param_here(m, p)))
            p++;
        if (!p || !p->name) {
            snprintf(msg, len, "invalid params: %s takes no argument \"%s\"", name,
                     al_term_escape(a->string, esc, sizeof(esc)));
            return -1;
        }
        long long max = param_max(m, p);
        const char *bad = NULL;
        switch (p->type) {
        case P_STR:
            if (!cJSON_IsString(a)) {
                bad = "must be a string";
            } else if ((long long)strlen(a->valuestring) < p->min) {
                bad = "is too short";
            } else if (max && (long long)strlen(a->valuestring) > max) {
                bad = "is too long";
            } else if (!al_utf8_valid((const uint8_t *)a->valuestring, strlen(a->valuestring))) {
                bad = "is not valid UTF-8";
            } else if (p->name_chars && !name_chars_ok(a->valuestring)) {
                bad = "may hold only letters, digits, '.', '_' and '-'";
            } else if (p->choices) {
                const char *const *c = p->choices;
                while (*c && strcmp(*c, a->valuestring))
                    c++;
                if (!*c)
                    bad = "is not one of the choices";
            }
            break;
        case P_INT:
            if (!cJSON_IsNumber(a) || a->valuedouble != (double)(long long)a->valuedouble)
                bad = "must be an integer";
            else if (a->valuedouble < (double)p->min || (max && a->valuedouble > (double)max))
                bad = "is out of range";
            break;
        case P_BOOL:
            if (!cJSON_IsBool(a))
                bad = "must be true or false";
            break;
        case P_STRS: {
            if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) > AL_NET_ALLOW_MAX) {
                bad = "must be an array of at most 256 strings";
                break;
            }
            const cJSON *e;
            cJSON_ArrayForEach(e, a) if (!cJSON_IsString(e) || !e->valuestring[0] ||
                                         (max && (long long)strlen(e->valuestring) > max)) bad =
                "must hold non-empty strings";
            break;
        }
        case P_ENV: {
            if (!cJSON_IsObject(a) || cJSON_GetArraySize(a) > 256) {
                bad = "must be an object of at most 256 strings";
                break;
            }
            const cJSON *e;
            cJSON_ArrayForEach(e, a)
            {
                if (!cJSON_IsString(e) || !e->string[0] || strchr(e->string, '='))
                    bad = "must map names (without '=') to strings";
            }
            break;
        }
        case P_ACTS: {
            if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) < p->min ||
                cJSON_GetArraySize(a) > max) {
                bad = "must be an array of 1 to 100 actions";
                break;
            }
            const cJSON *e;
            cJSON_ArrayForEach(
                e, a) if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(e, "action"))) bad =
                "must hold objects with an \"action\"";
            break;
        }
        case P_ID:
            if (!(cJSON_IsString(a) && a->valuestring[0] &&
                  strlen(a->valuestring) <= AL_CHECKPOINT_NAME_MAX) &&
                !(cJSON_IsNumber(a) && a->valuedouble >= 1 && a->valuedouble < 4294967296.0 &&
                  a->valuedouble == (double)(long long)a->valuedouble))
                bad = "must be a checkpoint's id or name";
            break;
        }
        if (bad) {
            snprintf(msg, len, "invalid params: %s: \"%s\" %s", name, p->name, bad);
            return -1;
        }
    }
    for (const struct param *p = t->params; p && p->name; p++)
        if (p->required && param_here(m, p) &&
            !cJSON_GetObjectItemCaseSensitive(cJSON_IsObject(args) ? args : NULL, p->name)) {
            snprintf(msg, len, "invalid params: %s needs \"%s\"%s", name, p->name,
                     strcmp(p->name, "session")
                         ? ""
                         : " (the handle start_session returns: start one first; a call never "
                           "starts a session by itself)");
            return -1;
        }
    return 0;
}

/* ---- results ---- */

static const char *arg_str(const cJSON *a, const char *name, const char *dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(a, name);
    return cJSON_IsString(v) ? v->valuestring : dflt;
}

static long long arg_int(const cJSON *a, const char *name, long long dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(a, name);
    return cJSON_IsNumber(v) ? (long long)v->valuedouble : dflt;
}

static bool arg_bool(const cJSON *a, const char *name, bool dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(a, name);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

/* A text block; whatever it quotes (a library message, the agent's languages) is made valid
 * UTF-8 first. */
static void add_text(cJSON *content, const char *text)
{
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "type", "text");
    char *ok = al_utf8_repair((const uint8_t *)text, strlen(text), NULL);
    cJSON_AddStringToObject(b, "text", ok ? ok : "");
    free(ok);
    cJSON_AddItemToArray(content, b);
}

/* A result: content (taken), structured (taken, may be NULL), isError. */
static cJSON *result(cJSON *content, cJSON *structured, bool is_error)
{
    cJSON *r = cJSON_CreateObject();
    if (!r) {
        cJSON_Delete(content);
        cJSON_Delete(structured);
        return NULL;
    }
    cJSON_AddItemToObject(r, "content", content);
    if (structured)
        cJSON_AddItemToObject(r, "structuredContent", structured);
    cJSON_AddBoolToObject(r, "isError", is_error);
    return r;
}

/* A result with one text block and the structured form of the same facts. */
static cJSON *result_text(cJSON *structured, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static cJSON *result_text(cJSON *structured, const char *fmt, ...)
{
    char *text = NULL;
    va_list ap;
    va_start(ap, fmt);
    int n = vasprintf(&text, fmt, ap);
    va_end(ap);
    cJSON *content = cJSON_CreateArray();
    add_text(content, n >= 0 ? text : "");
    if (n >= 0)
        free(text);
    return result(content, structured, false);
}

/* A tool's failure the model can act on: isError, one line, no structured content. */
static cJSON *tool_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static cJSON *tool_error(const char *fmt, ...)
{
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    cJSON *content = cJSON_CreateArray();
    add_text(content, text);
    return result(content, NULL, true);
}

static cJSON *no_session(const char *id)
{
    char esc[80];
    return tool_error("no such session: %s (start one with start_session; list_sessions shows "
                      "those open)",
                      al_term_escape(id, esc, sizeof(esc)));
}

/* Standard base64, whitespace ignored; -1 when it is not base64. */
static ssize_t b64_decode(const char *s, uint8_t **out)
{
    size_t n = strlen(s);
    char *clean = malloc(n + 1);
    if (!clean)
        return -1;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] != '\n' && s[i] != '\r' && s[i] != ' ' && s[i] != '\t')
            clean[k++] = s[i];
    clean[k] = '\0';
    if (k % 4) {
        free(clean);
        return -1;
    }
    uint8_t *buf = malloc(k / 4 * 3 + 1);
    int got = buf ? EVP_DecodeBlock(buf, (unsigned char *)clean, (int)k) : -1;
    if (got >= 0 && k) {
        if (clean[k - 1] == '=')
            got--;
        if (clean[k - 2] == '=')
            got--;
    }
    free(clean);
    if (got < 0) {
        free(buf);
        return -1;
    }
    *out = buf;
    return got;
}

/* Under the lock: a run as the client sees it (text block, figures, structuredContent). */
static cJSON *run_view(al_mcp *m, struct mcp_run *r)
{
    (void)m;
    cJSON *st = cJSON_CreateObject();
    cJSON_AddStringToObject(st, "run", r->id);
    cJSON_AddStringToObject(st, "session", r->sess->id);
    /* A kernel run waits its turn behind the runs sent to its context before it. */
    cJSON_AddStringToObject(st, "state", r->done ? "done" : r->ahead ? "queued" : "running");
    if (!r->done && r->ahead)
        cJSON_AddNumberToObject(st, "queued_behind", r->ahead);
    bool started = r->done ? r->rc >= 0 : true;
    bool exited = r->done && started && r->res.how == AL_EXEC_EXITED;
    bool signaled = r->done && started && r->res.how == AL_EXEC_SIGNALED;
    if (exited)
        cJSON_AddNumberToObject(st, "exit_code", r->res.value);
    else
        cJSON_AddNullToObject(st, "exit_code");
    if (signaled)
        cJSON_AddNumberToObject(st, "signal", r->res.value);
    else
        cJSON_AddNullToObject(st, "signal");
    cJSON_AddBoolToObject(st, "timed_out", r->done && r->res.timed_out);
    cJSON_AddBoolToObject(st, "interrupted", r->done && r->res.interrupted);
    cJSON_AddBoolToObject(st, "killed", r->killed);
    uint64_t end = r->done ? r->t_end_ms : al_now_ms();
    cJSON_AddNumberToObject(st, "duration_ms", (double)(end - r->t_start_ms));
    bool cut_any = false;
    char *text_out[2];
    const char *names[] = {"stdout", "stderr"};
    for (int i = 0; i < 2; i++) {
        bool cut = false;
        char *s = mcp_buf_summary(&r->out[i], MCP_STRUCT_KEEP, &cut);
        cJSON_AddStringToObject(st, names[i], s ? s : "");
        free(s);
        cut_any |= cut;
        char key[24];
        snprintf(key, sizeof(key), "%s_bytes", names[i]);
        cJSON_AddNumberToObject(st, key, (double)r->out[i].total);
        text_out[i] = mcp_buf_summary(&r->out[i], MCP_TEXT_KEEP, &cut);
    }
    const cJSON *err_res = NULL, *value_res = NULL, *el;
    cJSON_ArrayForEach(el, r->results)
    {
        const char *kind = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(el, "kind"));
        if (kind && !strcmp(kind, "error"))
            err_res = el;
        if (kind && !strcmp(kind, "value"))
            value_res = el;
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(el, "truncated")))
            cut_any = true;
    }
    cJSON_AddBoolToObject(st, "truncated", cut_any || r->nresults_dropped || r->nimg_dropped);
    if (err_res)
        cJSON_AddItemToObject(st, "error", cJSON_Duplicate(err_res, true));
    else
        cJSON_AddNullToObject(st, "error");
    cJSON_AddItemToObject(st, "results", cJSON_Duplicate(r->results, true));
    cJSON_AddNumberToObject(st, "images", r->nimg);

    /* The text block: what a person would want to read first. */
    char *text = NULL;
    size_t tlen = 0;
    FILE *f = open_memstream(&text, &tlen);
    if (f) {
        if (text_out[0] && text_out[0][0])
            fprintf(f, "%s%s", text_out[0],
                    text_out[0][strlen(text_out[0]) - 1] == '\n' ? "" : "\n");
        if (text_out[1] && text_out[1][0])
            fprintf(f, "[stderr]\n%s%s", text_out[1],
                    text_out[1][strlen(text_out[1]) - 1] == '\n' ? "" : "\n");
        if (value_res) {
            const cJSON *d = cJSON_GetObjectItemCaseSensitive(value_res, "data");
            const char *plain =
                cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(d, "text/plain"));
            if (plain)
                fprintf(f, "Out: %s\n", plain);
        }
        if (err_res) {
            const char *tb =
                cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(err_res, "traceback"));
            const char *en =
                cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(err_res, "name"));
            const char *ev =
                cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(err_res, "value"));
            /* The kernel wrote the traceback to stderr already, as a terminal shows it. */
            if (tb && tb[0] && !r->out[1].total)
                fprintf(f, "%s%s", tb, tb[strlen(tb) - 1] == '\n' ? "" : "\n");
            else if (!r->out[1].total)
                fprintf(f, "%s: %s\n", en ? en : "error", ev ? ev : "");
        }
        double secs = (double)(end - r->t_start_ms) / 1000.0;
        if (!r->done)
            fprintf(f, "[still running after %.1f s: call run_output with run \"%s\" for the rest]",
                    secs, r->id);
        else if (r->rc < 0)
            fprintf(f, "[failed: %s]", r->err.msg[0] ? r->err.msg : strerror(-r->rc));
        else if (r->res.timed_out)
            fprintf(f, "[timed out after %.1f s]", secs);
        else if (signaled)
            fprintf(f, "[%s by signal %d after %.1f s]", r->killed ? "killed" : "ended",
                    r->res.value, secs);
        else
            fprintf(f, "[exit status %d, %.2f s]", r->res.value, secs);
        if (cut_any)
            fprintf(f, " (output cut: structuredContent holds more)");
        if (r->nimg_dropped)
            fprintf(f, " (%u more figures not shown)", r->nimg_dropped);
        fclose(f);
    }
    free(text_out[0]);
    free(text_out[1]);
    cJSON *content = cJSON_CreateArray();
    add_text(content, text ? text : "");
    free(text);
    for (unsigned i = 0; i < r->nimg; i++) {
        char *b64 = NULL;
        unsigned w, h;
        al_error e = {0};
        if (al_vision_png_fit(r->img[i].data, r->img[i].len, MCP_IMAGE_SIDE_MAX, &b64, &w, &h, &e) <
            0)
            continue;
        cJSON *b = cJSON_CreateObject();
        cJSON_AddStringToObject(b, "type", "image");
        cJSON_AddStringToObject(b, "data", b64);
        cJSON_AddStringToObject(b, "mimeType", "image/png");
        cJSON_AddItemToArray(content, b);
        free(b64);
    }
    bool failed = !r->done ? false
                           : r->rc < 0 || r->res.timed_out || signaled || err_res ||
                                 (exited && r->res.value != 0);
    if (r->done && r->rc < 0) {
        /* It never ran (or the session went): the message says why; no output to speak of. */
        cJSON_Delete(st);
        cJSON_Delete(content);
        return tool_error("the run failed: %s", r->err.msg[0] ? r->err.msg : strerror(-r->rc));
    }
    return result(content, st, failed);
}

static cJSON *run_and_view(al_mcp *m, struct mcp_call *c, struct mcp_sess *ss,
                           const struct mcp_run_spec *sp, long long wait_s)
{
    struct mcp_run *r = NULL;
    al_error err = {0};
    struct mcp_run_spec spec = *sp;
    spec.arrival = c->arrival;
    if (mcp_run_start(m, ss, &spec, &r, &err) < 0)
        return tool_error("%s", err.msg);
    mcp_call_phase(c, "running in %s", ss->id);
    mcp_call_target(c, r->cancel[1]);
    uint64_t wait_ms = wait_s >= 0 ? (uint64_t)wait_s * 1000 : UINT64_MAX / 4;
    mcp_run_wait(m, r, c, wait_ms, NULL);
    mcp_call_target(c, -1);
    pthread_mutex_lock(&m->mu);
    cJSON *v = run_view(m, r);
    pthread_mutex_unlock(&m->mu);
    mcp_run_put(m, r);
    return v;
}

/* A guest path from an argument: absolute as given, relative under /workspace. */
static int guest_path(const char *in, char *out, size_t len)
{
    if (strchr(in, '\n'))
        return -1;
    int n = in[0] == '/' ? snprintf(out, len, "%s", in) : snprintf(out, len, "/workspace/%s", in);
    return n < 0 || (size_t)n >= len ? -1 : 0;
}

/* A private directory for one transfer, removed with its file by tmp_done. */
static int tmp_file(char *dir, size_t dlen, char *file, size_t flen)
{
    const char *base = getenv("TMPDIR");
    dir[0] = '\0';
    if (snprintf(dir, dlen, "%s/airlock-mcp-XXXXXX", base && base[0] ? base : "/tmp") >=
            (int)dlen ||
        !mkdtemp(dir)) {
        dir[0] = '\0';
        return -1;
    }
    snprintf(file, flen, "%s/f", dir);
    return 0;
}

static void tmp_done(const char *dir, const char *file)
{
    unlink(file);
    rmdir(dir);
}

static int slurp(const char *path, uint8_t **out, size_t *len, size_t max)
{
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0 || (uint64_t)st.st_size > max)
        return -1;
    uint8_t *buf = malloc((size_t)st.st_size + 1);
    if (!buf)
        return -1;
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t k = read(fd, buf + got, (size_t)st.st_size - got);
        if (k <= 0) {
            free(buf);
            return -1;
        }
        got += (size_t)k;
    }
    buf[got] = 0;
    *out = buf;
    *len = got;
    return 0;
}

/* ---- the tools ---- */

static void on_notice(void *ctx, const char *msg)
{
    mcp_log(ctx, "notice: %s", msg);
}

/* ---- snapshots: the host's (al_mcp_opts.snapshot_*) or the library's ---- */

struct snap_find {
    const char *name; /* as the caller names it */
    size_t skip;      /* the library's prefix, where the names come from it */
    bool found;
    al_snapshot_info info;
};

static void snap_found(void *ctx, const al_snapshot_info *si)
{
    struct snap_find *f = ctx;
    if (!strcmp(si->name + f->skip, f->name)) {
        f->found = true;
        f->info = *si;
    }
}

static void snapshots_each(al_mcp *m, void (*fn)(void *ctx, const al_snapshot_info *si),
                           struct snap_find *f)
{
    if (m->o.snapshot_list) {
        f->skip = 0;
        m->o.snapshot_list(m->o.session_ctx, fn, f);
        return;
    }
    char prefix[160];
    al_error err = {0};
    mcp_snapshot_name("x", prefix, sizeof(prefix), &err);
    prefix[strlen(prefix) - 1] = '\0';
    f->skip = strlen(prefix);
    al_snapshot_list(prefix, fn, f, &err);
}

static cJSON *t_snapshot_session(const struct targs *t)
{
    al_mcp *m = t->m;
    struct mcp_sess *ss = t->ss;
    const char *name = arg_str(t->a, "name", "");
    bool replace = arg_bool(t->a, "replace", false);
    mcp_call_phase(t->c, "saving %s as snapshot %s", ss->id, name);
    al_snapshot_info si = AL_SNAPSHOT_INFO_INIT;
    al_error err = {0};
    char lib[160];
    int r = m->o.snapshot_save
                ? m->o.snapshot_save(m->o.session_ctx, ss->handle, ss->s, name, replace, &si, &err)
            : mcp_snapshot_name(name, lib, sizeof(lib), &err) < 0
                ? err.code
                : al_snapshot_save(ss->s, lib, replace, &si, &err);
    if (r < 0)
        return tool_error("cannot save %s as a snapshot: %s", ss->id, err.msg);
    cJSON *st = cJSON_CreateObject();
    cJSON_AddStringToObject(st, "name", name);
    cJSON_AddStringToObject(st, "image", si.image);
    cJSON_AddNumberToObject(st, "bytes", (double)si.bytes);
    return result_text(st,
                       "Session %s is saved as snapshot %s (%.0f MiB); start_session with "
                       "snapshot \"%s\" starts sessions from it.",
                       ss->id, name, (double)si.bytes / 1048576.0, name);
}

static void snap_add(void *ctx, const al_snapshot_info *si)
{
    struct snap_find *f = ctx;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", si->name + f->skip);
    cJSON_AddStringToObject(o, "image", si->image);
    cJSON_AddNumberToObject(o, "bytes", (double)si->bytes);
    cJSON_AddNumberToObject(o, "created", (double)si->created);
    cJSON_AddItemToArray((cJSON *)f->name, o);
}

static cJSON *t_list_snapshots(const struct targs *t)
{
    cJSON *st = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(st, "snapshots");
    struct snap_find f = {.name = (const char *)arr};
    snapshots_each(t->m, snap_add, &f);
    return result_text(st, "%d snapshot%s.", cJSON_GetArraySize(arr),
                       cJSON_GetArraySize(arr) == 1 ? "" : "s");
}

static cJSON *t_delete_snapshot(const struct targs *t)
{
    al_mcp *m = t->m;
    const char *name = arg_str(t->a, "name", "");
    al_error err = {0};
    char lib[160];
    int r = m->o.snapshot_remove ? m->o.snapshot_remove(m->o.session_ctx, name, &err)
            : mcp_snapshot_name(name, lib, sizeof(lib), &err) < 0 ? -ENOENT
                                                                  : al_snapshot_remove(lib, &err);
    if (r < 0 && r != -ENOENT)
        return tool_error("cannot delete snapshot %s: %s", name, err.msg);
    cJSON *st = cJSON_CreateObject();
    cJSON_AddStringToObject(st, "name", name);
    cJSON_AddBoolToObject(st, "deleted", r == 0);
    return result_text(st, r == 0 ? "Snapshot %s is deleted." : "There is no snapshot %s.", name);
}

static cJSON *t_start_session(const struct targs *t)
{
    al_mcp *m = t->m;
    struct mcp_call *c = t->c;
    const cJSON *a = t->a;
    const char *snapshot = arg_str(a, "snapshot", NULL);
    struct snap_find sf = {.name = snapshot};
    if (snapshot) {
        if (cJSON_GetObjectItemCaseSensitive(a, "image") ||
            cJSON_GetObjectItemCaseSensitive(a, "memory_mib"))
            return tool_error("a session from a snapshot has the snapshot's image and memory");
        snapshots_each(m, snap_found, &sf);
        if (!sf.found) {
            char esc[80];
            return tool_error("no snapshot '%s' (list_snapshots lists yours)",
                              al_term_escape(snapshot, esc, sizeof(esc)));
        }
    }
    const char *image = snapshot
                            ? sf.info.image
                            : arg_str(a, "image", m->o.image ? m->o.image : al_image_default());
    char resolved[128];
    const char *asked = image;
    if (!snapshot && m->o.image_for &&
        !(image = m->o.image_for(m->o.image_ctx, asked, resolved, sizeof(resolved)))) {
        char esc[80];
        return tool_error("unknown image '%s'", al_term_escape(asked, esc, sizeof(esc)));
    }
    const cJSON *net = cJSON_GetObjectItemCaseSensitive(a, "network");
    _cleanup_free_ const char **allow = NULL;
    size_t nallow = cJSON_GetArraySize(net);
    if (nallow) {
        allow = calloc(nallow + 1, sizeof(*allow));
        if (!allow)
            return NULL;
        size_t i = 0;
        const cJSON *h;
        cJSON_ArrayForEach(h, net)
        {
            char esc[80];
            if (!al_net_host_pattern_ok(h->valuestring))
                return tool_error("network: \"%s\" is not a host name or a *.suffix pattern",
                                  al_term_escape(h->valuestring, esc, sizeof(esc)));
            allow[i++] = h->valuestring;
        }
    }
    /* Volumes: NAME:/PATH[:ro], the caller's names; as the library names them where this
     * process is the host (uid-UID_NAME, as airlockd names a local user's). */
    const cJSON *vols = cJSON_GetObjectItemCaseSensitive(a, "volumes");
    size_t nvols = (size_t)cJSON_GetArraySize(vols);
    if (snapshot && nvols)
        return tool_error("a session from a snapshot has the snapshot's volumes");
    if (nvols > AL_VOLS_MAX)
        return tool_error("volumes: at most %d", AL_VOLS_MAX);
    char vspec[AL_VOLS_MAX][420];
    const char *vspecs[AL_VOLS_MAX + 1] = {0};
    size_t iv = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, vols)
    {
        char name[64], lib[160], esc[80];
        const char *colon = strchr(v->valuestring, ':');
        size_t nlen = colon ? (size_t)(colon - v->valuestring) : 0;
        if (!colon || colon[1] != '/' || !nlen || nlen >= sizeof(name))
            return tool_error("volumes: \"%s\" is not NAME:/PATH or NAME:/PATH:ro",
                              al_term_escape(v->valuestring, esc, sizeof(esc)));
        memcpy(name, v->valuestring, nlen);
        name[nlen] = '\0';
        al_error ve = {0};
        if (!m->o.session_open && mcp_snapshot_name(name, lib, sizeof(lib), &ve) < 0)
            return tool_error("volumes: %s", ve.msg);
        snprintf(vspec[iv], sizeof(vspec[iv]), "%s%s", m->o.session_open ? name : lib, colon);
        vspecs[iv] = vspec[iv];
        iv++;
    }
    unsigned lifetime = (unsigned)arg_int(a, "lifetime_s", 0);
    if (m->o.lifetime_max_s && (!lifetime || lifetime > m->o.lifetime_max_s))
        lifetime = m->o.lifetime_max_s;
    al_session_opts so = {
        .struct_size = sizeof(al_session_opts),
        .image = image,
        .connect_uri = m->o.connect_uri,
        .memory_mib = (unsigned)arg_int(a, "memory_mib", 0),
        .vcpus = (unsigned)arg_int(a, "cpus", 0),
        .lifetime_s = lifetime,
        .quiet = false,
        .checkpoints = true,
        .on_notice = on_notice,
        .notice_ctx = m,
        .warm = AL_WARM_DEFAULT,
        .net = {.allow = nallow ? allow : NULL},
        .display = arg_bool(a, "display", false),
        .display_width = (unsigned)arg_int(a, "display_width", 0),
        .display_height = (unsigned)arg_int(a, "display_height", 0),
        .volumes = nvols ? vspecs : NULL,
    };
    al_error serr = {0};
    if (al_display_size_check(so.display_width, so.display_height, &serr) < 0)
        return tool_error("%s", serr.msg);
    char esc[80];
    mcp_call_phase(c, "booting a VM (image %s)", al_term_escape(image, esc, sizeof(esc)));
    struct mcp_sess *ss = NULL;
    al_error err = {0};
    if (snapshot)
        so.memory_mib = sf.info.memory_mib;
    if (mcp_sess_open(m, c, &so, NULL, snapshot, &ss, &err) < 0)
        return tool_error("cannot start a session: %s", err.msg);
    snprintf(ss->image, sizeof(ss->image), "%s", image);
    ss->memory_mib = so.memory_mib;
    ss->cpus = al_session_vcpus(ss->s);
    ss->network = net ? cJSON_Duplicate(net, true) : cJSON_CreateArray();
    ss->display = al_session_has_display(ss->s);
    /* Where files and kernels start. */
    al_error e2 = {0};
    al_file_mkdir(ss->s, "/workspace", true, &e2);
    mcp_log(m, "session %s: domain %s, image %s, booted in %llu ms%s", ss->id,
            al_session_name(ss->s), esc, (unsigned long long)ss->boot_ms,
            al_session_kvm(ss->s) ? "" : " (emulation)");
    cJSON *st = cJSON_CreateObject();
    cJSON_AddStringToObject(st, "session", ss->id);
    cJSON_AddStringToObject(st, "image", ss->image);
    cJSON_AddNumberToObject(st, "cpus", ss->cpus);
    if (ss->memory_mib)
        cJSON_AddNumberToObject(st, "memory_mib", ss->memory_mib);
    cJSON_AddBoolToObject(st, "kvm", al_session_kvm(ss->s));
    cJSON_AddItemToObject(st, "network", cJSON_Duplicate(ss->network, true));
    cJSON *langs = cJSON_AddArrayToObject(st, "languages");
    const char *ls = al_session_languages(ss->s);
    bool py = false, sh = false, js = false;
    if (ls) {
        char buf[512];
        snprintf(buf, sizeof(buf), " %s ", ls);
        py = strstr(buf, " kernel:python ");
        sh = strstr(buf, " kernel:shell ");
        js = strstr(buf, " kernel:javascript ");
    }
    if (py)
        cJSON_AddItemToArray(langs, cJSON_CreateString("python"));
    cJSON_AddItemToArray(langs, cJSON_CreateString("bash"));
    if (js)
        cJSON_AddItemToArray(langs, cJSON_CreateString("javascript"));
    (void)sh;
    cJSON_AddNumberToObject(st, "boot_ms", (double)ss->boot_ms);
    cJSON *r = result_text(st,
                           "Session %s is ready (image %s, %u CPU%s, %s, %s). Pass "
                           "session \"%s\" to the other tools; files go in /workspace.",
                           ss->id, ss->image, ss->cpus, ss->cpus == 1 ? "" : "s",
                           al_session_kvm(ss->s) ? "KVM" : "software emulation",
                           nallow ? "network to the allowed hosts only" : "no network", ss->id);
    mcp_sess_put(m, ss);
    return r;
}

static cJSON *t_fork_session(const struct targs *t)
{
    al_mcp *m = t->m;
    struct mcp_call *c = t->c;
    struct mcp_sess *ss = t->ss;
    unsigned n = (unsigned)arg_int(t->a, "count", 1);
    mcp_call_phase(c, "saving %s for %u fork%s", ss->id, n, n == 1 ? "" : "s");
    al_fork *fk = NULL;
    al_error err = {0};
    if (al_session_fork_save(ss->s, &fk, &err) < 0)
        return tool_error("cannot fork %s: %s", ss->id, err.msg);
    unsigned paused_ms = 0;
    al_fork_timing(fk, &paused_ms, NULL);
    cJSON *st = cJSON_CreateObject(), *forks = cJSON_AddArrayToObject(st, "forks");
    cJSON_AddNumberToObject(st, "paused_ms", paused_ms);
    unsigned ok = 0;
    /* The source's allowlist: each fork's proxy lets the same hosts through. */
    const char *allow[AL_NET_ALLOW_MAX + 1] = {0};
    size_t na = 0;
    const cJSON *h;
    cJSON_ArrayForEach(h, ss->network)
    {
        if (cJSON_IsString(h) && na < AL_NET_ALLOW_MAX)
            allow[na++] = h->valuestring;
    }
    for (unsigned i = 0; i < n; i++) {
        mcp_call_phase(c, "starting fork %u of %u", i + 1, n);
        unsigned lifetime = m->o.lifetime_max_s;
        al_session_opts so = {
            .struct_size = sizeof(al_session_opts),
            .image = ss->image,
            .memory_mib = ss->memory_mib,
            .lifetime_s = lifetime,
            .checkpoints = true,
            .on_notice = on_notice,
            .notice_ctx = m,
            .net = {.allow = na ? allow : NULL},
        };
        struct mcp_sess *ns = NULL;
        al_error e = {0};
        cJSON *one = cJSON_CreateObject();
        if (mcp_sess_open(m, c, &so, fk, NULL, &ns, &e) < 0) {
            cJSON_AddStringToObject(one, "error", e.msg);
        } else {
            snprintf(ns->image, sizeof(ns->image), "%s", ss->image);
            ns->memory_mib = ss->memory_mib;
            ns->cpus = al_session_vcpus(ns->s);
            ns->network = cJSON_Duplicate(ss->network, true);
            ns->display = al_session_has_display(ns->s);
            cJSON_AddStringToObject(one, "session", ns->id);
            cJSON_AddNumberToObject(one, "boot_ms", (double)ns->boot_ms);
            mcp_log(m, "session %s: a fork of %s, domain %s, in %llu ms", ns->id, ss->id,
                    al_session_name(ns->s), (unsigned long long)ns->boot_ms);
            mcp_sess_put(m, ns);
            ok++;
        }
        cJSON_AddItemToArray(forks, one);
    }
    al_fork_free(fk);
    return result_text(st,
                       "%u of %u fork%s of session %s %s ready (it stood still %u ms); pass each "
                       "fork's session handle to the other tools.",
                       ok, n, n == 1 ? "" : "s", ss->id, ok == 1 ? "is" : "are", paused_ms);
}

static cJSON *t_stop_session(const struct targs *t)
{
    al_mcp *m = t->m;
    struct mcp_call *c = t->c;
    struct mcp_sess *ss = t->ss;
    mcp_call_phase(c, "stopping %s", ss->id);
    char sid[40];
    snprintf(sid, sizeof(sid), "%s", ss->id);
    mcp_sess_stop(m, ss);
    cJSON *st = cJSON_CreateObject();
    cJSON_AddStringToObject(st, "session", sid);
    cJSON_AddTrueToObject(st, "stopped");
    return result_text(st, "Session %s stopped: its VM is gone.", sid);
}

static cJSON *t_list_sessions(const struct targs *t)
{
    al_mcp *m = t->m;
    cJSON *st = cJSON_CreateObject();
    cJSON *list = cJSON_AddArrayToObject(st, "sessions");
    char *text = NULL;
    size_t tlen = 0;
    FILE *f = open_memstream(&text, &tlen);
    pthread_mutex_lock(&m->mu);
    time_t now = time(NULL);
    for (struct mcp_sess *ss = m->sessions; ss; ss = ss->next) {
        unsigned running = 0;
        for (struct mcp_run *r = ss->runs; r; r = r->next)
            running += !r->done;
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "session", ss->id);
        cJSON_AddStringToObject(j, "image", ss->image);
        cJSON_AddNumberToObject(j, "cpus", ss->cpus);
        cJSON_AddNumberToObject(j, "age_s", (double)(now - ss->created));
        cJSON_AddNumberToObject(j, "running", running);
        cJSON_AddItemToArray(list, j);
        if (f)
            fprintf(f, "%s  image %s  up %llds  %u running\n", ss->id, ss->image,
                    (long long)(now - ss->created), running);
    }
    pthread_mutex_unlock(&m->mu);
    if (f)
        fclose(f);
    cJSON *r = result_text(st, "%s", text && text[0] ? text : "No sessions open.");
    free(text);
    return r;
}

/* The kernel name for a language, or NULL when the session has no kernel for it. */
static const char *kernel_for(al_session *s, const char *lang)
{
    const char *k = !strcmp(lang, "bash") ? "shell" : lang;
    char buf[512], want[48];
    snprintf(buf, sizeof(buf), " %s ", al_session_languages(s) ? al_session_languages(s) : "");
    snprintf(want, sizeof(want), " kernel:%s ", k);
    return strstr(buf, want) ? k : NULL;
}

static cJSON *t_run_code(const struct targs *t)
{
    al_mcp *m = t->m;
    struct mcp_call *c = t->c;
    const cJSON *a = t->a;
    struct mcp_sess *ss = t->ss;
    const char *lang = arg_str(a, "language", "python");
    const char *code = arg_str(a, "code", "");
    const char *kernel = kernel_for(ss->s, lang);
    const char *sh_argv[] = {"/bin/sh", "-c", code, NULL};
    struct mcp_run_spec sp = {
        .kernel = kernel != NULL,
        .lang = kernel,
        .code = code,
        .context = arg_str(a, "context", NULL),
        .cwd = "/workspace",
        .label = code,
        .timeout_ms = (unsigned)arg_int(a, "timeout_s", TIMEOUT_DEFAULT_S) * 1000,
    };
    if (!kernel) {
        if (strcmp(lang, "bash")) {
            cJSON *r = tool_error("this session's image has no %s kernel (it has: %s)", lang,
                                  al_session_languages(ss->s));
            return r;
        }
        sp.argv = sh_argv; /* no bash kernel: a shell of its own for each block */
    }
    cJSON *r = run_and_view(m, c, ss, &sp, arg_int(a, "wait_s", -1));
    return r;
}

static cJSON *t_run_output(const struct targs *t)
{
    al_mcp *m = t->m;
    struct mcp_call *c = t->c;
    const cJSON *a = t->a;
    struct mcp_run *r = t->r;
    mcp_call_phase(c, "waiting for %s", r->id);
    mcp_run_wait(m, r, c, (uint64_t)arg_int(a, "wait_s", MCP_WAIT_MAX_S) * 1000, NULL);
    pthread_mutex_lock(&m->mu);
    cJSON *v = run_view(m, r);
    pthread_mutex_unlock(&m->mu);
    return v;
}

static cJSON *t_run_command(const struct targs *t)
{
    al_mcp *m = t->m;
    struct mcp_call *c = t->c;
    const cJSON *a = t->a;
    struct mcp_sess *ss = t->ss;
    const char *cmd = arg_str(a, "command", "");
    const char *argv[] = {"/bin/sh", "-c", cmd, NULL};
    struct mcp_run_spec sp = {
        .argv = argv,
        .cwd = arg_str(a, "cwd", "/workspace"),
        .env = cJSON_GetObjectItemCaseSensitive(a, "env"),
        .label = cmd,
        .timeout_ms = (unsigned)arg_int(a, "timeout_s", TIMEOUT_DEFAULT_S) * 1000,
    };
    cJSON *r = run_and_view(m, c, ss, &sp, arg_int(a, "wait_s", -1));
    return r;
}

static void add_exit(cJSON *st, const struct mcp_run *r)
{
    bool ran = r->done && r->rc >= 0;
    if (ran && r->res.how == AL_EXEC_EXITED)
        cJSON_AddNumberToObject(st, "exit_code", r->res.value);
    else
        cJSON_AddNullToObject(st, "exit_code");
    if (ran && r->res.how == AL_EXEC_SIGNALED)
        cJSON_AddNumberToObject(st, "signal", r->res.value);
    else
        cJSON_AddNullToObject(st, "signal");
}

static cJSON *t_start_process(const struct targs *t)
{
    al_mcp *m = t->m;
    struct mcp_call *c = t->c;
    const cJSON *a = t->a;
    struct mcp_sess *ss = t->ss;
    const char *cmd = arg_str(a, "command", "");
    const char *argv[] = {"/bin/sh", "-c", cmd, NULL};
    struct mcp_run_spec sp = {
        .process = true,
        .argv = argv,
        .cwd = arg_str(a, "cwd", "/workspace"),
        .env = cJSON_GetObjectItemCaseSensitive(a, "env"),
        .label = cmd,
    };
    struct mcp_run *r = NULL;
    al_error err = {0};
    if (mcp_run_start(m, ss, &sp, &r, &err) < 0) {
        return tool_error("%s", err.msg);
    }
    /* A moment for a command that fails at once to say so. */
    mcp_run_wait(m, r, c, 300, NULL);
    pthread_mutex_lock(&m->mu);
    cJSON *st = cJSON_CreateObject();
    cJSON_AddStringToObject(st, "process", r->id);
    cJSON_AddStringToObject(st, "session", ss->id);
    cJSON_AddStringToObject(st, "state", r->done ? "done" : "running");
    add_exit(st, r);
    cJSON *res;
    if (r->done && r->rc < 0)
        res = tool_error("the process did not start: %s", r->err.msg);
    else if (r->done)
        res = result_text(st, "Process %s already ended (%s %d); process_output has its output.",
                          r->id, r->res.how == AL_EXEC_EXITED ? "exit status" : "signal",
                          r->res.value);
    else
        res = result_text(st,
                          "Process %s is running. Read its output with process_output, end it "
                          "with kill_process.",
                          r->id);
    if (r->done && r->rc < 0)
        cJSON_Delete(st);
    pthread_mutex_unlock(&m->mu);
    mcp_run_put(m, r);
    return res;
}

static cJSON *t_process_output(const struct targs *t)
{
    al_mcp *m = t->m;
    struct mcp_call *c = t->c;
    const cJSON *a = t->a;
    struct mcp_run *r = t->r;
    uint64_t since[2] = {(uint64_t)arg_int(a, "stdout_since", 0),
                         (uint64_t)arg_int(a, "stderr_since", 0)};
    size_t max = (size_t)arg_int(a, "max_bytes", PROCESS_READ_DEFAULT);
    mcp_call_phase(c, "reading %s", r->id);
    mcp_run_wait(m, r, c, (uint64_t)arg_int(a, "wait_s", 0) * 1000, since);
    pthread_mutex_lock(&m->mu);
    cJSON *st = cJSON_CreateObject();
    cJSON_AddStringToObject(st, "process", r->id);
    cJSON_AddStringToObject(st, "state", r->done ? "done" : "running");
    add_exit(st, r);
    const char *names[] = {"stdout", "stderr"};
    char *text = NULL;
    size_t tlen = 0;
    FILE *f = open_memstream(&text, &tlen);
    for (int i = 0; i < 2; i++) {
        uint64_t next = 0, skipped = 0;
        char *s = mcp_buf_read(&r->out[i], since[i], max, &next, &skipped);
        char key[32];
        cJSON_AddStringToObject(st, names[i], s ? s : "");
        snprintf(key, sizeof(key), "%s_next", names[i]);
        cJSON_AddNumberToObject(st, key, (double)next);
        snprintf(key, sizeof(key), "%s_skipped", names[i]);
        cJSON_AddNumberToObject(st, key, (double)skipped);
        if (f && s && s[0])
            fprintf(f, "%s%s%s%s", i ? "[stderr]\n" : "",
                    skipped ? "[earlier output dropped]\n" : "", s,
                    s[strlen(s) - 1] == '\n' ? "" : "\n");
        free(s);
    }
    if (f) {
        if (r->done && r->rc < 0)
            fprintf(f, "[failed: %s]", r->err.msg);
        else if (r->done)
            fprintf(f, "[ended: %s %d]", r->res.how == AL_EXEC_EXITED ? "exit status" : "signal",
                    r->res.value);
        else
            fprintf(
                f, "[running; next offsets stdout %llu, stderr %llu]",
                (unsigned long long)cJSON_GetNumberValue(cJSON_GetObjectItem(st, "stdout_next")),
                (unsigned long long)cJSON_GetNumberValue(cJSON_GetObjectItem(st, "stderr_next")));
        fclose(f);
    }
    pthread_mutex_unlock(&m->mu);
    cJSON *res = result_text(st, "%s", text ? text : "");
    free(text);
    return res;
}

static cJSON *t_kill_process(const struct targs *t)
{
    al_mcp *m = t->m;
    struct mcp_call *c = t->c;
    const cJSON *a = t->a;
    struct mcp_run *r = t->r;
    const char *sig = arg_str(a, "signal", "KILL");
    pthread_mutex_lock(&m->mu);
    mcp_run_signal(r, !strcmp(sig, "INT") ? SIGINT : !strcmp(sig, "TERM") ? SIGTERM : SIGKILL);
    pthread_mutex_unlock(&m->mu);
    mcp_call_phase(c, "waiting for %s to end", r->id);
    bool ended = mcp_run_wait(m, r, NULL, !strcmp(sig, "INT") ? 2000 : 10000, NULL);
    pthread_mutex_lock(&m->mu);
    cJSON *st = cJSON_CreateObject();
    cJSON_AddStringToObject(st, "process", r->id);
    cJSON_AddStringToObject(st, "state", r->done ? "done" : "running");
    add_exit(st, r);
    cJSON *res =
        result_text(st, ended ? "%s has ended." : "%s was signalled and still runs.", r->id);
    pthread_mutex_unlock(&m->mu);
    return res;
}

static cJSON *t_list_processes(const struct targs *t)
{
    al_mcp *m = t->m;
    struct mcp_sess *ss = t->ss;
    cJSON *st = cJSON_CreateObject();
    cJSON *list = cJSON_AddArrayToObject(st, "processes");
    char *text = NULL;
    size_t tlen = 0;
    FILE *f = open_memstream(&text, &tlen);
    pthread_mutex_lock(&m->mu);
    uint64_t now = al_now_ms();
    for (struct mcp_run *r = ss->runs; r; r = r->next) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "process", r->id);
        cJSON_AddStringToObject(j, "kind", r->process ? "process" : r->kernel ? "code" : "command");
        cJSON_AddStringToObject(j, "command", r->label);
        cJSON_AddStringToObject(j, "state", r->done ? "done" : "running");
        add_exit(j, r);
        cJSON_AddNumberToObject(j, "age_s", (double)(now - r->t_start_ms) / 1000.0);
        cJSON_AddNumberToObject(j, "stdout_bytes", (double)r->out[0].total);
        cJSON_AddNumberToObject(j, "stderr_bytes", (double)r->out[1].total);
        cJSON_AddItemToArray(list, j);
        if (f)
            fprintf(f, "%s  %-7s  %s\n", r->id, r->done ? "done" : "running", r->label);
    }
    pthread_mutex_unlock(&m->mu);
    if (f)
        fclose(f);
    cJSON *r = result_text(st, "%s", text && text[0] ? text : "No runs or processes.");
    free(text);
    return r;
}

static cJSON *t_read_file(const struct targs *t)
{
    struct mcp_call *c = t->c;
    const cJSON *a = t->a;
    struct mcp_sess *ss = t->ss;
    char path[4200], dir[256], file[300], esc[256];
    if (guest_path(arg_str(a, "path", ""), path, sizeof(path)) < 0) {
        return tool_error("read_file: not a usable path");
    }
    al_term_escape(path, esc, sizeof(esc));
    mcp_call_phase(c, "reading %s", esc);
    if (tmp_file(dir, sizeof(dir), file, sizeof(file)) < 0) {
        return tool_error("read_file: cannot make a temporary directory: %s", strerror(errno));
    }
    uint64_t max = (uint64_t)arg_int(a, "max_bytes", READ_DEFAULT);
    al_error err = {0};
    int rc = al_file_get_max(ss->s, path, file, max, &err);
    uint8_t *data = NULL;
    size_t len = 0;
    if (rc == 0 && slurp(file, &data, &len, max) < 0)
        rc = al_err(&err, -EIO, "cannot read the copy");
    tmp_done(dir, file);
    if (rc < 0)
        return tool_error("read_file %s: %s", esc, err.msg);
    const char *enc = arg_str(a, "encoding", NULL);
    bool text = enc ? !strcmp(enc, "utf-8") : al_utf8_valid(data, len) && !memchr(data, 0, len);
    char *content = text ? al_utf8_repair(data, len, NULL) : al_base64(data, len);
    bool png = len > 8 && !memcmp(data, "\x89PNG\r\n\x1a\n", 8);
    cJSON *blocks = cJSON_CreateArray();
    if (text) {
        add_text(blocks, content ? content : "");
    } else {
        char line[400];
        snprintf(line, sizeof(line), "%s: %zu bytes of binary data (base64 in structuredContent)",
                 esc, len);
        add_text(blocks, line);
    }
    if (png) {
        char *b64 = NULL;
        unsigned w, h;
        if (al_vision_png_fit(data, len, MCP_IMAGE_SIDE_MAX, &b64, &w, &h, &err) == 0) {
            cJSON *b = cJSON_CreateObject();
            cJSON_AddStringToObject(b, "type", "image");
            cJSON_AddStringToObject(b, "data", b64);
            cJSON_AddStringToObject(b, "mimeType", "image/png");
            cJSON_AddItemToArray(blocks, b);
            free(b64);
        }
    }
    free(data);
    cJSON *st = cJSON_CreateObject();
    cJSON_AddStringToObject(st, "path", esc);
    cJSON_AddNumberToObject(st, "size", (double)len);
    cJSON_AddStringToObject(st, "encoding", text ? "utf-8" : "base64");
    cJSON_AddStringToObject(st, "content", content ? content : "");
    free(content);
    return result(blocks, st, false);
}

static cJSON *t_write_file(const struct targs *t)
{
    struct mcp_call *c = t->c;
    const cJSON *a = t->a;
    struct mcp_sess *ss = t->ss;
    const char *content = arg_str(a, "content", "");
    const char *enc = arg_str(a, "encoding", "utf-8");
    uint8_t *data = NULL;
    ssize_t len;
    if (!strcmp(enc, "base64")) {
        if ((len = b64_decode(content, &data)) < 0)
            return tool_error("write_file: content is not valid base64");
    } else {
        len = (ssize_t)strlen(content);
    }
    if ((size_t)len > WRITE_MAX) {
        free(data);
        return tool_error("write_file: %zd bytes, more than the %u MiB one call may write", len,
                          WRITE_MAX >> 20);
    }
    char path[4200], dir[256], file[300], esc[256];
    if (guest_path(arg_str(a, "path", ""), path, sizeof(path)) < 0) {
        free(data);
        return tool_error("write_file: not a usable path");
    }
    al_term_escape(path, esc, sizeof(esc));
    mcp_call_phase(c, "writing %s", esc);
    al_error err = {0};
    int rc = tmp_file(dir, sizeof(dir), file, sizeof(file));
    if (rc < 0) {
        rc = al_err(&err, -errno, "cannot make a temporary directory: %s", strerror(errno));
    } else {
        int fd = open(file, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        const void *src = data ? (const void *)data : (const void *)content;
        if (fd < 0 || al_write_all(fd, src, (size_t)len) < 0)
            rc = al_err(&err, -EIO, "cannot write the temporary copy: %s", strerror(errno));
        if (fd >= 0)
            close(fd);
        if (!rc && arg_bool(a, "parents", true)) {
            char parent[4200];
            snprintf(parent, sizeof(parent), "%s", path);
            char *slash = strrchr(parent, '/');
            if (slash && slash != parent) {
                *slash = '\0';
                al_error e2 = {0};
                al_file_mkdir(ss->s, parent, true, &e2);
            }
        }
        if (!rc)
            rc = al_file_put(ss->s, file, path, &err);
        tmp_done(dir, file);
    }
    free(data);
    if (rc < 0)
        return tool_error("write_file %s: %s", esc, err.msg);
    cJSON *st = cJSON_CreateObject();
    cJSON_AddStringToObject(st, "path", esc);
    cJSON_AddNumberToObject(st, "bytes", (double)len);
    return result_text(st, "Wrote %zd bytes to %s.", len, esc);
}

struct listing {
    cJSON *entries;
    unsigned n;
};

static void list_one(void *ctx, const al_file_info *fi)
{
    struct listing *l = ctx;
    static const char *const types[] = {"file", "dir", "symlink", "other"};
    cJSON *j = cJSON_CreateObject();
    char *name =
        al_utf8_repair((const uint8_t *)fi->name, strnlen(fi->name, sizeof(fi->name)), NULL);
    cJSON_AddStringToObject(j, "name", name ? name : "?");
    free(name);
    cJSON_AddStringToObject(j, "type", fi->type >= 0 && fi->type <= 3 ? types[fi->type] : "other");
    cJSON_AddNumberToObject(j, "size", (double)fi->size);
    cJSON_AddNumberToObject(j, "mode", fi->mode & 07777);
    cJSON_AddNumberToObject(j, "mtime", (double)fi->mtime);
    cJSON_AddItemToArray(l->entries, j);
    l->n++;
}

static int by_name(const void *x, const void *y)
{
    const cJSON *a = *(cJSON *const *)x, *b = *(cJSON *const *)y;
    return strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(a, "name")),
                  cJSON_GetStringValue(cJSON_GetObjectItem(b, "name")));
}

static cJSON *t_list_files(const struct targs *t)
{
    const cJSON *a = t->a;
    struct mcp_sess *ss = t->ss;
    char path[4200], esc[256];
    if (guest_path(arg_str(a, "path", "/workspace"), path, sizeof(path)) < 0) {
        return tool_error("list_files: not a usable path");
    }
    al_term_escape(path, esc, sizeof(esc));
    struct listing l = {cJSON_CreateArray(), 0};
    al_error err = {0};
    int rc = al_file_list(ss->s, path, list_one, &l, &err);
    if (rc < 0) {
        cJSON_Delete(l.entries);
        return tool_error("list_files %s: %s", esc, err.msg);
    }
    /* Sorted by name, for people and for tests. */
    cJSON **v = calloc(l.n ? l.n : 1, sizeof(*v));
    cJSON *sorted = cJSON_CreateArray();
    unsigned k = 0;
    while (v && cJSON_GetArraySize(l.entries))
        v[k++] = cJSON_DetachItemFromArray(l.entries, 0);
    if (v)
        qsort(v, k, sizeof(*v), by_name);
    char *text = NULL;
    size_t tlen = 0;
    FILE *f = open_memstream(&text, &tlen);
    for (unsigned i = 0; i < k; i++) {
        const char *type = cJSON_GetStringValue(cJSON_GetObjectItem(v[i], "type"));
        if (f)
            fprintf(f, "%s%s  %.0f\n", cJSON_GetStringValue(cJSON_GetObjectItem(v[i], "name")),
                    !strcmp(type, "dir") ? "/" : "",
                    cJSON_GetNumberValue(cJSON_GetObjectItem(v[i], "size")));
        cJSON_AddItemToArray(sorted, v[i]);
    }
    free(v);
    cJSON_Delete(l.entries);
    if (f)
        fclose(f);
    cJSON *st = cJSON_CreateObject();
    cJSON_AddStringToObject(st, "path", esc);
    cJSON_AddItemToObject(st, "entries", sorted);
    cJSON *r = result_text(st, "%s%s", k ? "" : "(empty)", text ? text : "");
    free(text);
    return r;
}

static cJSON *t_checkpoint(const struct targs *t)
{
    struct mcp_call *c = t->c;
    const cJSON *a = t->a;
    struct mcp_sess *ss = t->ss;
    mcp_call_phase(c, "taking a checkpoint of %s", ss->id);
    al_checkpoint_info ci = AL_CHECKPOINT_INFO_INIT;
    al_error err = {0};
    int rc = al_checkpoint_create(ss->s, arg_str(a, "name", NULL), &ci, &err);
    if (rc < 0)
        return tool_error("checkpoint: %s", err.msg);
    cJSON *st = cJSON_CreateObject();
    char idtext[16];
    snprintf(idtext, sizeof(idtext), "%u", ci.id);
    cJSON_AddStringToObject(st, "checkpoint", idtext);
    cJSON_AddNumberToObject(st, "id", ci.id);
    cJSON_AddStringToObject(st, "name", ci.name);
    cJSON_AddNumberToObject(st, "state_bytes", (double)ci.state_bytes);
    cJSON_AddNumberToObject(st, "save_ms", ci.save_ms);
    return result_text(st,
                       "Checkpoint %u%s%s taken (%u ms). rollback with checkpoint \"%u\" "
                       "returns the VM to this moment.",
                       ci.id, ci.name[0] ? " " : "", ci.name, ci.save_ms, ci.id);
}

static cJSON *t_rollback(const struct targs *t)
{
    struct mcp_call *c = t->c;
    const cJSON *a = t->a;
    struct mcp_sess *ss = t->ss;
    const cJSON *cp = cJSON_GetObjectItemCaseSensitive(a, "checkpoint");
    char which[AL_CHECKPOINT_NAME_MAX + 1];
    if (cJSON_IsNumber(cp))
        snprintf(which, sizeof(which), "%llu", (unsigned long long)cp->valuedouble);
    else
        snprintf(which, sizeof(which), "%s", cp->valuestring);
    al_checkpoint_info ci = AL_CHECKPOINT_INFO_INIT;
    al_error err = {0};
    char esc[80];
    al_term_escape(which, esc, sizeof(esc));
    int rc = al_checkpoint_find(ss->s, which, &ci, &err);
    if (rc == 0) {
        mcp_call_phase(c, "rolling %s back to checkpoint %u", ss->id, ci.id);
        rc = al_checkpoint_rollback(ss->s, ci.id, &err);
    }
    char sid[40];
    snprintf(sid, sizeof(sid), "%s", ss->id);
    if (rc < 0)
        return tool_error("rollback to %s: %s", esc, err.msg);
    cJSON *st = cJSON_CreateObject();
    cJSON_AddStringToObject(st, "session", sid);
    char idtext[16];
    snprintf(idtext, sizeof(idtext), "%u", ci.id);
    cJSON_AddStringToObject(st, "checkpoint", idtext);
    cJSON_AddNumberToObject(st, "id", ci.id);
    return result_text(st,
                       "Session %s is back at checkpoint %u: files, memory and processes "
                       "are as they were then.",
                       sid, ci.id);
}

static void cp_one(void *ctx, const al_checkpoint_info *ci)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "id", ci->id);
    cJSON_AddStringToObject(j, "name", ci->name);
    cJSON_AddNumberToObject(j, "created", (double)ci->created);
    cJSON_AddNumberToObject(j, "state_bytes", (double)ci->state_bytes);
    cJSON_AddBoolToObject(j, "current", ci->current);
    cJSON_AddItemToArray(ctx, j);
}

static cJSON *t_list_checkpoints(const struct targs *t)
{
    struct mcp_sess *ss = t->ss;
    cJSON *list = cJSON_CreateArray();
    al_error err = {0};
    int rc = al_checkpoint_list(ss->s, cp_one, list, &err);
    if (rc < 0) {
        cJSON_Delete(list);
        return tool_error("list_checkpoints: %s", err.msg);
    }
    char *text = NULL;
    size_t tlen = 0;
    FILE *f = open_memstream(&text, &tlen);
    const cJSON *el;
    cJSON_ArrayForEach(el, list) if (f)
        fprintf(f, "%.0f %s%s\n", cJSON_GetNumberValue(cJSON_GetObjectItem(el, "id")),
                cJSON_GetStringValue(cJSON_GetObjectItem(el, "name")),
                cJSON_IsTrue(cJSON_GetObjectItem(el, "current")) ? " (current)" : "");
    if (f)
        fclose(f);
    cJSON *st = cJSON_CreateObject();
    cJSON_AddItemToObject(st, "checkpoints", list);
    cJSON *r = result_text(st, "%s", text && text[0] ? text : "No checkpoints.");
    free(text);
    return r;
}

cJSON *mcp_tools_call(al_mcp *m, struct mcp_call *c, const char *name, const cJSON *args)
{
    const struct tool *tool = tool_find(name);
    _cleanup_cjson_ cJSON *empty = cJSON_CreateObject();
    struct targs t = {.m = m, .c = c, .a = cJSON_IsObject(args) ? args : empty};
    /* The handle a tool's first parameter names, looked up for it. */
    const char *first = tool->params ? tool->params[0].name : NULL;
    char esc[80];
    if (first && !strcmp(first, "session")) {
        const char *id = arg_str(t.a, "session", "");
        if (!(t.ss = mcp_sess_get(m, id)))
            return no_session(id);
    } else if (first && (!strcmp(first, "run") || !strcmp(first, "process"))) {
        const char *id = arg_str(t.a, first, "");
        if (!(t.r = mcp_run_get(m, id)))
            return tool_error("no such %s: %s", first, al_term_escape(id, esc, sizeof(esc)));
    }
    cJSON *res = tool->fn(&t);
    mcp_sess_put(m, t.ss);
    mcp_run_put(m, t.r);
    return res;
}

/* ---- resources: the files under each session's /workspace ---- */

#define RES_PREFIX "airlock://"

static const char *mime_of(const char *name)
{
    static const char *const map[][2] = {
        {".txt", "text/plain"},        {".md", "text/markdown"},      {".py", "text/x-python"},
        {".json", "application/json"}, {".csv", "text/csv"},          {".html", "text/html"},
        {".js", "text/javascript"},    {".sh", "text/x-shellscript"}, {".png", "image/png"},
        {".jpg", "image/jpeg"},        {".jpeg", "image/jpeg"},       {".svg", "image/svg+xml"},
        {".log", "text/plain"},
    };
    const char *dot = strrchr(name, '.');
    for (size_t i = 0; dot && i < sizeof(map) / sizeof(map[0]); i++)
        if (!strcasecmp(dot, map[i][0]))
            return map[i][1];
    return "application/octet-stream";
}

/* Percent-encodes what is not unreserved or '/'. */
static void uri_escape(const char *in, char *out, size_t len)
{
    size_t k = 0;
    for (const unsigned char *p = (const unsigned char *)in; *p && k + 4 < len; p++) {
        if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
            strchr("-._~/", *p))
            out[k++] = (char)*p;
        else
            k += (size_t)snprintf(out + k, len - k, "%%%02X", *p);
    }
    out[k] = '\0';
}

static int hexval(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

static int uri_unescape(const char *in, char *out, size_t len)
{
    size_t k = 0;
    for (const char *p = in; *p; p++) {
        if (k + 1 >= len)
            return -1;
        if (*p == '%') {
            int h = hexval(p[1]), l = h >= 0 ? hexval(p[2]) : -1;
            if (l < 0 || (h == 0 && l == 0))
                return -1;
            out[k++] = (char)(h * 16 + l);
            p += 2;
        } else {
            out[k++] = *p;
        }
    }
    out[k] = '\0';
    return 0;
}

struct walk {
    al_session *s;
    const char *sid;
    cJSON *list;
    char dirs[16][1100];
    unsigned ndirs;
    const char *base;
};

static void walk_one(void *ctx, const al_file_info *fi)
{
    struct walk *w = ctx;
    if (cJSON_GetArraySize(w->list) >= RESOURCES_MAX ||
        !al_utf8_valid((const uint8_t *)fi->name, strnlen(fi->name, sizeof(fi->name))))
        return;
    for (const char *p = fi->name; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == '/')
            return;
    char rel[1100];
    if (snprintf(rel, sizeof(rel), "%s%s%s", w->base, w->base[0] ? "/" : "", fi->name) >=
        (int)sizeof(rel))
        return;
    if (fi->type == AL_ENTRY_DIR) {
        if (w->ndirs < 16)
            snprintf(w->dirs[w->ndirs++], sizeof(w->dirs[0]), "%s", rel);
        return;
    }
    if (fi->type != AL_ENTRY_FILE)
        return;
    char esc[3400], uri[3500];
    uri_escape(rel, esc, sizeof(esc));
    snprintf(uri, sizeof(uri), RES_PREFIX "%s/workspace/%s", w->sid, esc);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "uri", uri);
    cJSON_AddStringToObject(j, "name", rel);
    cJSON_AddStringToObject(j, "mimeType", mime_of(fi->name));
    cJSON_AddNumberToObject(j, "size", (double)fi->size);
    cJSON_AddItemToArray(w->list, j);
}

cJSON *mcp_resources_list(al_mcp *m, struct mcp_call *c, int *code, char *msg, size_t len)
{
    (void)code, (void)msg, (void)len;
    cJSON *r = cJSON_CreateObject();
    cJSON *list = cJSON_AddArrayToObject(r, "resources");
    /* The handles first, then each session walked without the lock. */
    char ids[AL_MCP_SESSIONS_DEFAULT * 8][40];
    unsigned n = 0;
    pthread_mutex_lock(&m->mu);
    for (struct mcp_sess *ss = m->sessions; ss && n < sizeof(ids) / sizeof(ids[0]); ss = ss->next)
        snprintf(ids[n++], sizeof(ids[0]), "%s", ss->id);
    pthread_mutex_unlock(&m->mu);
    mcp_call_phase(c, "listing /workspace");
    for (unsigned i = 0; i < n; i++) {
        struct mcp_sess *ss = mcp_sess_get(m, ids[i]);
        if (!ss)
            continue;
        struct walk *w = calloc(1, sizeof(*w));
        if (w) {
            w->s = ss->s;
            w->sid = ss->id;
            w->list = list;
            w->base = "";
            al_error err = {0};
            al_file_list(ss->s, "/workspace", walk_one, w, &err);
            /* One level of subdirectories, breadth first, bounded. */
            unsigned top = w->ndirs;
            char(*sub)[1100] = malloc(sizeof(w->dirs));
            if (sub) {
                memcpy(sub, w->dirs, sizeof(w->dirs));
                w->ndirs = 16; /* no deeper */
                for (unsigned d = 0; d < top; d++) {
                    char gp[1200];
                    snprintf(gp, sizeof(gp), "/workspace/%s", sub[d]);
                    w->base = sub[d];
                    al_error e2 = {0};
                    al_file_list(ss->s, gp, walk_one, w, &e2);
                }
                free(sub);
            }
            free(w);
        }
        mcp_sess_put(m, ss);
    }
    return r;
}

cJSON *mcp_resources_read(al_mcp *m, struct mcp_call *c, const char *uri, int *code, char *msg,
                          size_t len)
{
    char esc[200];
    al_term_escape(uri, esc, sizeof(esc));
    const char *p = strncmp(uri, RES_PREFIX, strlen(RES_PREFIX)) ? NULL : uri + strlen(RES_PREFIX);
    const char *slash = p ? strchr(p, '/') : NULL;
    char sid[40], rel[4096];
    if (!slash || (size_t)(slash - p) >= sizeof(sid) || strncmp(slash, "/workspace/", 11) ||
        uri_unescape(slash + 11, rel, sizeof(rel)) < 0 || !rel[0]) {
        *code = -32002;
        snprintf(msg, len, "resource not found: %s", esc);
        return NULL;
    }
    memcpy(sid, p, (size_t)(slash - p));
    sid[slash - p] = '\0';
    /* No way out of /workspace: no "..", no empty or "." components. */
    for (char *q = rel, *e; q; q = e ? e + 1 : NULL) {
        e = strchr(q, '/');
        size_t l = e ? (size_t)(e - q) : strlen(q);
        if (!l || (l == 1 && q[0] == '.') || (l == 2 && q[0] == '.' && q[1] == '.')) {
            *code = -32002;
            snprintf(msg, len, "resource not found: %s", esc);
            return NULL;
        }
    }
    struct mcp_sess *ss = mcp_sess_get(m, sid);
    if (!ss) {
        *code = -32002;
        snprintf(msg, len, "resource not found: %s (no such session)", esc);
        return NULL;
    }
    mcp_call_phase(c, "reading %s", esc);
    char path[4200], dir[256], file[300];
    snprintf(path, sizeof(path), "/workspace/%s", rel);
    al_error err = {0};
    int rc = tmp_file(dir, sizeof(dir), file, sizeof(file)) < 0
                 ? al_err(&err, -EIO, "cannot make a temporary directory")
                 : al_file_get_max(ss->s, path, file, RESOURCE_READ_MAX, &err);
    mcp_sess_put(m, ss);
    uint8_t *data = NULL;
    size_t n = 0;
    if (rc == 0 && slurp(file, &data, &n, RESOURCE_READ_MAX) < 0)
        rc = al_err(&err, -EIO, "cannot read the copy");
    if (dir[0])
        tmp_done(dir, file);
    if (rc < 0) {
        *code = rc == -ENOENT ? -32002 : -32603;
        snprintf(msg, len, "%s: %s", esc, err.msg);
        return NULL;
    }
    cJSON *r = cJSON_CreateObject();
    cJSON *contents = cJSON_AddArrayToObject(r, "contents");
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "uri", uri);
    const char *mime = mime_of(rel);
    cJSON_AddStringToObject(j, "mimeType", mime);
    if (al_utf8_valid(data, n) && !memchr(data, 0, n) && strncmp(mime, "image/", 6)) {
        cJSON_AddStringToObject(j, "text", (const char *)data);
    } else {
        char *b64 = al_base64(data, n);
        cJSON_AddStringToObject(j, "blob", b64 ? b64 : "");
        free(b64);
    }
    cJSON_AddItemToArray(contents, j);
    free(data);
    return r;
}

/* ---- the screen (computer use) ---- */

/* The screen as an image block into content, at most max_edge on its longer side; the size it
 * was sent at becomes the session's coordinate space. 0, or a negative errno with err set. */
static int add_screen(struct mcp_sess *ss, unsigned max_edge, cJSON *content, cJSON *st,
                      al_error *err)
{
    char *b64 = NULL;
    al_screenshot shot = AL_SCREENSHOT_INIT;
    int r = al_vision_screen(ss->s, max_edge, &b64, &shot, err);
    if (r < 0)
        return r;
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "type", "image");
    cJSON_AddStringToObject(b, "data", b64);
    cJSON_AddStringToObject(b, "mimeType", "image/png");
    cJSON_AddItemToArray(content, b);
    free(b64);
    __atomic_store_n(&ss->shot_w, shot.width, __ATOMIC_RELAXED);
    __atomic_store_n(&ss->shot_h, shot.height, __ATOMIC_RELAXED);
    cJSON_AddNumberToObject(st, "width", shot.width);
    cJSON_AddNumberToObject(st, "height", shot.height);
    cJSON_AddNumberToObject(st, "screen_width", shot.screen_width);
    cJSON_AddNumberToObject(st, "screen_height", shot.screen_height);
    return 0;
}

static cJSON *no_display(void)
{
    return tool_error("this session has no display: start one with start_session "
                      "{\"display\": true}");
}

static cJSON *t_screenshot(const struct targs *t)
{
    struct mcp_sess *ss = t->ss;
    if (!ss->display)
        return no_display();
    cJSON *content = cJSON_CreateArray(), *st = cJSON_CreateObject();
    al_error err = {0};
    if (add_screen(ss, (unsigned)arg_int(t->a, "max_edge", MCP_IMAGE_SIDE_MAX), content, st, &err) <
        0) {
        cJSON_Delete(content);
        cJSON_Delete(st);
        return tool_error("screenshot: %s", err.msg);
    }
    char line[600];
    snprintf(line, sizeof(line), "The screen (%.0fx%.0f), shown at %.0fx%.0f.",
             cJSON_GetNumberValue(cJSON_GetObjectItem(st, "screen_width")),
             cJSON_GetNumberValue(cJSON_GetObjectItem(st, "screen_height")),
             cJSON_GetNumberValue(cJSON_GetObjectItem(st, "width")),
             cJSON_GetNumberValue(cJSON_GetObjectItem(st, "height")));
    add_text(content, line);
    return result(content, st, false);
}

static cJSON *t_computer(const struct targs *t)
{
    struct mcp_sess *ss = t->ss;
    if (!ss->display)
        return no_display();
    _cleanup_free_ char *acts =
        cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(t->a, "actions"));
    if (!acts)
        return NULL;
    unsigned w = __atomic_load_n(&ss->shot_w, __ATOMIC_RELAXED);
    unsigned h = __atomic_load_n(&ss->shot_h, __ATOMIC_RELAXED);
    unsigned done = 0;
    int x = -1, y = -1;
    al_error err = {0};
    int r = al_screen_input(ss->s, acts, w, h, &done, &x, &y, &err);
    if (r < 0)
        return tool_error("%s (%u action%s before it ran)", err.msg, done, done == 1 ? "" : "s");
    cJSON *content = cJSON_CreateArray(), *st = cJSON_CreateObject();
    cJSON_AddNumberToObject(st, "done", done);
    cJSON *cur = cJSON_AddArrayToObject(st, "cursor");
    cJSON_AddItemToArray(cur, cJSON_CreateNumber(x));
    cJSON_AddItemToArray(cur, cJSON_CreateNumber(y));
    char line[600];
    snprintf(line, sizeof(line), "Done: %u action%s; the pointer is at (%d, %d).", done,
             done == 1 ? "" : "s", x, y);
    add_text(content, line);
    al_error e2 = {0};
    /* At the size of the last one, so that its coordinates still hold. */
    unsigned edge = w > h ? w : h ? h : MCP_IMAGE_SIDE_MAX;
    if (arg_bool(t->a, "screenshot", true) && add_screen(ss, edge, content, st, &e2) < 0) {
        snprintf(line, sizeof(line), "(no screenshot: %s)", e2.msg);
        add_text(content, line);
    }
    return result(content, st, false);
}

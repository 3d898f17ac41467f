/* When to take a checkpoint before a run: --checkpoint always|auto|never.
 *
 * auto skips the checkpoint only for code a conservative reading proves read-only: a shell
 * pipeline of commands from a list of readers with no redirection into files, or a Python or
 * JavaScript expression calling only pure builtins. Everything else, and everything this
 * reading is unsure of, gets a checkpoint. Separately, a list of patterns names code that looks
 * destructive (recursive rm, dd, mkfs...), for telling the user why a checkpoint matters; it
 * can only add checkpoints, never remove one. */
#include "util.h"

#include <ctype.h>
#include <pthread.h>
#include <regex.h>
#include <stdio.h>
#include <string.h>

int al_checkpoint_policy_parse(const char *s, enum al_checkpoint_policy *out, al_error *err)
{
    static const char *const names[] = {"auto", "always", "never"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (s && !strcmp(s, names[i])) {
            *out = (enum al_checkpoint_policy)i;
            return 0;
        }
    return al_err(err, -EINVAL, "checkpoint policy must be auto, always or never, not '%.32s'",
                  s ? s : "");
}

const char *al_checkpoint_policy_name(enum al_checkpoint_policy p)
{
    return p == AL_CHECKPOINT_ALWAYS ? "always" : p == AL_CHECKPOINT_NEVER ? "never" : "auto";
}

/* ---- destructive-looking code ---- */

/* Before a command word: start, or a character that cannot be part of a longer word (so "rm"
 * matches in "sudo rm", "; rm", "/bin/rm", "os.system('rm" but not in "farm" or "git-rm"). */
#define W "(^|[^[:alnum:]_.-])"
/* The rest of a simple command: up to a separator. */
#define ARGS "([^;&|\n]*[[:space:]])?"
/* Protected system directories. */
#define SYSDIR "/(etc|usr|boot|bin|sbin|lib|lib64)(/|[[:space:]'\"]|$)"

// clang-format off
static const struct {
    const char *re;
    int flags; /* extra regcomp flags */
    const char *why;
} patterns[] = {
    {W "rm[[:space:]]" ARGS "(-[[:alpha:]]*[rR][[:alpha:]]*|--recursive)([[:space:]]|$)", 0,
     "recursive rm"},
    {"shutil\\.rmtree|os\\.removedirs|recursive[[:space:]]*:[[:space:]]*true|rimraf", 0,
     "recursive delete"},
    {W "find[[:space:]]" ARGS "-(delete|exec[[:space:]]+rm)", 0, "find -delete"},
    {W "dd[[:space:]]" ARGS "of=", 0, "dd"},
    {W "(mkfs(\\.[[:alnum:]]+)?|mke2fs|mkswap|wipefs|fdisk|sfdisk|parted|shred|blkdiscard)"
       "([[:space:]]|$)",
     0, "formatting or wiping a disk"},
    {W "(chmod|chown|chgrp)[[:space:]]" ARGS "(-[[:alpha:]]*R[[:alpha:]]*|--recursive)"
       "([[:space:]]|$)",
     0, "recursive chmod/chown"},
    {W "(apt|apt-get|aptitude|dpkg|yum|dnf|rpm|apk|pacman|zypper|snap)"
       "([[:space:]]|['\"][[:space:]]*,)",
     0, "package manager"},
    {W "(pip[0-9.]*|npm|pnpm|yarn|gem|conda|mamba|cargo)[[:space:]]+" ARGS
       "(install|uninstall|remove|add|update|upgrade)([[:space:]]|$)",
     0, "package manager"},
    {">[[:space:]]*" SYSDIR, 0, "writes under a system directory"},
    {W "(tee|cp|mv|install|ln|rsync|touch|mkdir|rmdir|rm|truncate|unlink)[[:space:]]" ARGS
       "(-[^[:space:]]*[[:space:]]+)*" SYSDIR,
     0, "writes under a system directory"},
    {W "sed[[:space:]]" ARGS "(-i|--in-place)", 0, "in-place edit"},
    {"open\\([[:space:]]*['\"]" SYSDIR "[^'\"]*['\"][[:space:]]*,[[:space:]]*['\"][rb]*[wax+]",
     0, "writes under a system directory"},
    {"(writeFile|appendFile)(Sync)?\\([[:space:]]*['\"]" SYSDIR, 0,
     "writes under a system directory"},
    {"(^|[^[:alnum:]_])(drop[[:space:]]+(table|database|schema|index|view)|delete[[:space:]]+"
     "from|truncate([[:space:]]+table)?[[:space:]]+[[:alnum:]_\"`])",
     REG_ICASE, "SQL DROP/DELETE/TRUNCATE"},
    {W "kill[[:space:]]+(-[[:alnum:]]+[[:space:]]+)*-1([^0-9]|$)|os\\.kill\\([[:space:]]*-1", 0,
     "killing every process"},
    {W "(killall5?|pkill)[[:space:]]", 0, "killing processes by name"},
    /* NAME(){ NAME|NAME& }: a function piping into a copy of itself in the background. */
    {"\\(\\)[[:space:]]*\\{[^}]*\\|[[:space:]]*[^[:space:]|&]+[[:space:]]*&([^&]|$)", 0,
     "fork bomb"},
    {"/proc/sysrq-trigger", 0, "kernel crash or reboot trigger"},
    {W "(shutdown|reboot|halt|poweroff)([[:space:]]|$)|" W "init[[:space:]]+[06]", 0,
     "shutting the machine down"},
    {"(>|of=)[[:space:]]*/dev/(sd|vd|hd|xvd|nvme|mmcblk|dm-|md|loop)", 0,
     "writing a block device"},
    {W "truncate[[:space:]]+-s", 0, "truncating files"},
    {W "git[[:space:]]+(clean[[:space:]]+-[[:alpha:]]*f|reset[[:space:]]+--hard)", 0,
     "discarding git changes"},
    {W "(crontab[[:space:]]+-r|userdel|iptables[[:space:]]+-F)", 0, "system configuration"},
    {W "rm[[:space:]]|os\\.(remove|unlink|rmdir)\\(|\\.unlink\\(|fs\\.(unlink|rm|rmdir)(Sync)?\\(",
     0, "deleting files"},
};
// clang-format on
#define NPATTERNS (sizeof(patterns) / sizeof(patterns[0]))

static regex_t compiled[NPATTERNS];
static bool compiled_ok[NPATTERNS];
static pthread_once_t compile_once = PTHREAD_ONCE_INIT;

static void compile_patterns(void)
{
    for (size_t i = 0; i < NPATTERNS; i++)
        compiled_ok[i] = regcomp(&compiled[i], patterns[i].re,
                                 REG_EXTENDED | REG_NOSUB | patterns[i].flags) == 0;
}

/* Python and JavaScript fork bombs: forking inside an endless loop. */
static bool fork_loop(const char *code)
{
    const char *f = strstr(code, "fork(");
    return f && (strstr(code, "while True") || strstr(code, "while(true)") ||
                 strstr(code, "while (true)") || strstr(code, "for(;;)"));
}

const char *al_code_destructive(const char *lang, const char *code)
{
    (void)lang; /* shell commands hide in every language (os.system, child_process) */
    if (!code)
        return NULL;
    pthread_once(&compile_once, compile_patterns);
    for (size_t i = 0; i < NPATTERNS; i++)
        if (compiled_ok[i] && regexec(&compiled[i], code, 0, NULL, 0) == 0)
            return patterns[i].why;
    if (fork_loop(code))
        return "fork bomb";
    return NULL;
}

/* ---- read-only code ---- */

/* Commands that only read, provided the per-command checks below pass. */
// clang-format off
static const char *const sh_readers[] = {
    "ls", "cat", "head", "tail", "wc", "grep", "egrep", "fgrep", "echo", "printf", "pwd",
    "whoami", "id", "uname", "df", "du", "stat", "file", "find", "which", "type", "ps", "free",
    "uptime", "md5sum", "sha1sum", "sha256sum", "sha512sum", "cksum", "cut", "tr", "diff", "cmp",
    "true", "false", "test", "[", "basename", "dirname", "realpath", "readlink", "nproc", "seq",
    "expr", "lscpu", "lsblk", "nl", "od", "hexdump", "column", "comm", "tac", "rev", "fold",
    "sort", "uniq", "sed", "date", "env", "printenv", "hostname", "git", "tree", "locale", ":",
    "command",
};
// clang-format on

/* Arguments that make a reader write, run something, or change state. */
static bool sh_args_ok(const char *cmd, char **argv, size_t argc)
{
    size_t operands = 0;
    bool sed_script_seen = false;
    for (size_t i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-')
            operands++;
        if (!strcmp(cmd, "find") &&
            (!strcmp(a, "-delete") || !strncmp(a, "-exec", 5) || !strncmp(a, "-ok", 3) ||
             !strncmp(a, "-fprint", 7) || !strcmp(a, "-fls")))
            return false;
        if (!strcmp(cmd, "sed")) {
            /* The script may write (w, W) or run commands (e): refused wherever those letters
             * appear in it, conservatively; so are in-place edits and script files. */
            bool script =
                (a[0] != '-' && !sed_script_seen) ||
                (i > 1 && (!strcmp(argv[i - 1], "-e") || !strcmp(argv[i - 1], "--expression")));
            if (!strncmp(a, "-i", 2) || !strncmp(a, "--in-place", 10) || !strncmp(a, "-f", 2) ||
                !strncmp(a, "--file", 6) || (script && strpbrk(a, "wWe")))
                return false;
            if (!strcmp(a, "-e") || !strcmp(a, "--expression") || script)
                sed_script_seen = true;
        }
        if (!strcmp(cmd, "sort") && (!strncmp(a, "-o", 2) || !strncmp(a, "--output", 8)))
            return false;
        if (!strcmp(cmd, "date") && (!strncmp(a, "-s", 2) || !strncmp(a, "--set", 5)))
            return false;
        if (!strcmp(cmd, "printf") && !strcmp(a, "-v"))
            return false;
    }
    /* These run or set something as soon as they have an operand. */
    if ((!strcmp(cmd, "env") || !strcmp(cmd, "hostname")) && argc > 1)
        return false;
    if (!strcmp(cmd, "uniq") && operands > 1) /* uniq IN OUT writes OUT */
        return false;
    if (!strcmp(cmd, "command") && (argc < 3 || strcmp(argv[1], "-v")))
        return false;
    if (!strcmp(cmd, "git")) {
        static const char *const git_readers[] = {"status",   "log",       "diff", "show",
                                                  "ls-files", "rev-parse", "blame"};
        bool ok = false;
        for (size_t i = 0; argc > 1 && i < sizeof(git_readers) / sizeof(git_readers[0]); i++)
            ok = ok || !strcmp(argv[1], git_readers[i]);
        return ok;
    }
    return true;
}

/* Words of a shell script at most this many per command, and this many bytes each: longer
 * code is simply not proven read-only. */
#define SH_WORDS_MAX 64
#define SH_WORD_MAX 256
/* Code longer than this is never proven read-only. */
#define READ_ONLY_CODE_MAX 4096

static bool sh_command_ok(char words[][SH_WORD_MAX], size_t n)
{
    if (n == 0)
        return true;
    char *argv[SH_WORDS_MAX];
    for (size_t i = 0; i < n; i++)
        argv[i] = words[i];
    /* A leading NAME=VALUE sets a variable of the (stateful) shell kernel. */
    if (strchr(argv[0], '='))
        return false;
    for (size_t i = 0; i < sizeof(sh_readers) / sizeof(sh_readers[0]); i++)
        if (!strcmp(argv[0], sh_readers[i]))
            return sh_args_ok(argv[0], argv, n);
    return false;
}

/* A small shell reader: words with quotes, separators ; | && || and newlines, comments, and the
 * harmless redirections (2>&1, >&2, >/dev/null, < FILE). Anything else (substitution, braces,
 * subshells, background jobs, heredocs, other redirections) is not proven read-only. */
static bool sh_read_only(const char *code)
{
    char words[SH_WORDS_MAX][SH_WORD_MAX];
    size_t n = 0, len = 0;
    bool in_word = false;
    for (const char *p = code;; p++) {
        char ch = *p;
        bool end_word = !ch || isspace((unsigned char)ch) || ch == ';' || ch == '|' || ch == '&';
        if (end_word && in_word) {
            words[n - 1][len] = '\0';
            in_word = false;
        }
        if (!ch || ch == ';' || ch == '\n' || ch == '|' || ch == '&') {
            if (ch == '&' && p[1] != '&' && (p == code || p[-1] != '&'))
                return false; /* a background job outlives the run */
            if (!sh_command_ok(words, n))
                return false;
            n = 0;
            if (!ch)
                return true;
            continue;
        }
        if (isspace((unsigned char)ch))
            continue;
        if (ch == '#' && !in_word) {
            while (p[1] && p[1] != '\n')
                p++;
            continue;
        }
        if (ch == '`' || ch == '(' || ch == ')' || ch == '{' || ch == '}' || ch == '!' ||
            (ch == '$' && (p[1] == '(' || p[1] == '{' || p[1] == '\'')))
            return false;
        if (ch == '>' || ch == '<') {
            static const char *const harmless[] = {"2>&1",       ">&2",         "1>&2",
                                                   ">/dev/null", "2>/dev/null", "&>/dev/null"};
            const char *start = in_word ? p - len : p;
            bool ok = false;
            for (size_t i = 0; i < sizeof(harmless) / sizeof(harmless[0]) && !ok; i++) {
                size_t hl = strlen(harmless[i]);
                ok = !strncmp(start, harmless[i], hl) &&
                     (!start[hl] || isspace((unsigned char)start[hl]) || start[hl] == ';');
                if (ok) {
                    p = start + hl - 1;
                    if (in_word) { /* the redirection was read as a word: take it back */
                        n--;
                        in_word = false;
                    }
                }
            }
            if (ok)
                continue;
            if (ch == '<' && p[1] != '<' && p[1] != '(' && p[1] != '>' && p[1] != '&')
                continue; /* input from a file; the file name is read as the next word */
            return false;
        }
        if (!in_word) {
            if (n == SH_WORDS_MAX)
                return false;
            n++;
            len = 0;
            in_word = true;
        }
        if (ch == '\'' || ch == '"') {
            char q = ch;
            for (p++; *p && *p != q; p++) {
                if (q == '"' && (*p == '`' || (*p == '$' && (p[1] == '(' || p[1] == '{'))))
                    return false;
                if (q == '"' && *p == '\\' && p[1])
                    p++;
                if (len + 1 >= SH_WORD_MAX)
                    return false;
                words[n - 1][len++] = *p;
            }
            if (!*p)
                return false;
            continue;
        }
        if (ch == '\\') {
            if (!p[1])
                return false;
            p++;
            ch = *p;
        }
        if (len + 1 >= SH_WORD_MAX)
            return false;
        words[n - 1][len++] = ch;
    }
}

/* Pure builtins an expression may call (Python, JavaScript). */
// clang-format off
static const char *const py_calls[] = {
    "print", "len", "repr", "str", "int", "float", "bool", "type", "isinstance", "sorted",
    "reversed", "min", "max", "sum", "abs", "round", "range", "enumerate", "zip", "list",
    "tuple", "dict", "set", "frozenset", "any", "all", "hex", "oct", "bin", "chr", "ord",
    "format", "divmod", "pow", "hash", "id", "callable", "dir", "vars", "ascii",
};
static const char *const js_calls[] = {
    "console.log", "console.error", "console.info", "console.warn", "console.dir",
    "JSON.stringify", "Object.keys", "Object.values", "Object.entries", "Array.isArray",
    "String", "Number", "Boolean", "parseInt", "parseFloat", "isNaN", "Math.max", "Math.min",
    "Math.abs", "Math.round", "Math.floor", "Math.ceil", "Math.sqrt",
};
/* Words that define, bind, import, loop or delete: never read-only. */
static const char *const py_banned[] = {
    "import", "from", "def", "class", "del", "global", "nonlocal", "lambda", "with", "yield",
    "await", "async", "while", "exec", "eval", "open", "input", "breakpoint", "compile",
    "setattr", "delattr", "globals", "locals", "next", "iter", "__import__",
};
static const char *const js_banned[] = {
    "let", "const", "var", "function", "class", "new", "delete", "import", "require", "await",
    "async", "yield", "while", "for", "do", "eval", "Function", "process", "globalThis",
    "this", "with",
};
// clang-format on

static bool in_list(const char *w, size_t len, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strlen(list[i]) == len && !strncmp(list[i], w, len))
            return true;
    return false;
}

/* One scanner for both languages: strings skipped (f-strings and template literals refused,
 * as they hold code), every call must be a listed builtin reached by its bare name (no method
 * call: x.append() mutates), no assignment of any kind, no banned word, no statement-level
 * for. */
static bool expr_read_only(const char *code, bool js)
{
    const char *const *calls = js ? js_calls : py_calls;
    size_t ncalls =
        js ? sizeof(js_calls) / sizeof(js_calls[0]) : sizeof(py_calls) / sizeof(py_calls[0]);
    const char *const *banned = js ? js_banned : py_banned;
    size_t nbanned =
        js ? sizeof(js_banned) / sizeof(js_banned[0]) : sizeof(py_banned) / sizeof(py_banned[0]);
    int depth = 0;
    for (const char *p = code; *p;) {
        char ch = *p;
        if (ch == '#' && !js) {
            while (*p && *p != '\n')
                p++;
            continue;
        }
        if (isalpha((unsigned char)ch) || ch == '_' || ch == '$') {
            const char *w = p;
            /* Dotted names are one word for JavaScript's console.log and friends. */
            while (isalnum((unsigned char)*p) || *p == '_' || *p == '$' ||
                   (js && *p == '.' && (isalpha((unsigned char)p[1]) || p[1] == '_')))
                p++;
            size_t len = (size_t)(p - w);
            if (!js && (*p == '\'' || *p == '"') && len <= 2) {
                /* A string prefix: r, b, u, rb... but never f (an f-string holds code). */
                for (size_t i = 0; i < len; i++)
                    if (strchr("rRbBuU", w[i]) == NULL)
                        return false;
                continue;
            }
            if (in_list(w, len, banned, nbanned) || (len >= 2 && !strncmp(w, "__", 2)))
                return false;
            if (!js && depth == 0 && len == 3 && !strncmp(w, "for", 3))
                return false; /* a for statement binds its variable */
            const char *q = p;
            while (*q == ' ' || *q == '\t')
                q++;
            bool method = w > code && w[-1] == '.';
            if (*q == '(' && (method || !in_list(w, len, calls, ncalls)))
                return false;
            continue;
        }
        if (ch == '\'' || ch == '"' || ch == '`') {
            if (ch == '`')
                return false; /* a template literal holds code */
            bool triple = !js && p[1] == ch && p[2] == ch;
            p += triple ? 3 : 1;
            for (;;) {
                if (!*p || (!triple && *p == '\n'))
                    return false;
                if (*p == '\\' && p[1]) {
                    p += 2;
                    continue;
                }
                if (*p == ch && (!triple || (p[1] == ch && p[2] == ch))) {
                    p += triple ? 3 : 1;
                    break;
                }
                p++;
            }
            continue;
        }
        if (ch == '=') {
            /* ==, !=, <=, >= compare; <<= and >>= assign */
            bool shift = p > code + 1 && (p[-1] == '<' || p[-1] == '>') && p[-2] == p[-1];
            bool compare = p[1] == '=' || (p > code && strchr("=!<>", p[-1]) && !shift);
            if (!compare || (js && p[1] == '>'))
                return false;
        }
        if ((ch == '+' || ch == '-') && p[1] == ch)
            return false; /* ++, -- */
        if (ch == '@' || ch == '\\' || (js && ch == '/'))
            return false; /* decorators; continuation tricks; a JS regex could hide quotes */
        if (ch == '(' || ch == '[' || ch == '{')
            depth++;
        if (ch == ')' || ch == ']' || ch == '}')
            depth--;
        p++;
    }
    return depth == 0;
}

bool al_code_read_only(const char *lang, const char *code)
{
    if (!code || strlen(code) > READ_ONLY_CODE_MAX)
        return false;
    if (!lang || !*lang || !strcmp(lang, "sh") || !strcmp(lang, "shell") || !strcmp(lang, "bash"))
        return sh_read_only(code);
    if (!strcmp(lang, "python") || !strcmp(lang, "python3"))
        return expr_read_only(code, false);
    if (!strcmp(lang, "javascript") || !strcmp(lang, "node") || !strcmp(lang, "js"))
        return expr_read_only(code, true);
    return false;
}

bool al_checkpoint_policy_wants(const char *lang, const char *code,
                                enum al_checkpoint_policy policy)
{
    switch (policy) {
    case AL_CHECKPOINT_ALWAYS:
        return true;
    case AL_CHECKPOINT_NEVER:
        return false;
    case AL_CHECKPOINT_AUTO:
    default:
        return al_code_destructive(lang, code) || !al_code_read_only(lang, code);
    }
}

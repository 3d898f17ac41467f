/* The checkpoint policy (orchestrator/base/policy.c): which code is proven read-only, which looks
 * destructive, and what auto, always and never decide from that. TAP output. */
#include "airlock.h"
#include "airlock/policy.h"
#include "airlock/text.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static unsigned count, failed;

static bool ok(bool pass, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool ok(bool pass, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    /* One TAP line per test, whatever the code quoted in it. */
    printf("%sok %u - ", pass ? "" : "not ", ++count);
    for (const char *p = line; *p; p++)
        fputs(*p == '\n' ? "\\n" : (char[2]){*p, 0}, stdout);
    putchar('\n');
    failed += !pass;
    return pass;
}

/* Each must be found destructive, whatever it is written in. */
static const struct {
    const char *lang, *code;
} destructive[] = {
    {"sh", "rm -rf --no-preserve-root /"},
    {"sh", "rm -r /tmp/x"},
    {"sh", "cd /srv && rm -fR data"},
    {"sh", "rm --recursive build"},
    {"sh", "rm build -rf"},
    {"sh", "/bin/rm -rf /home"},
    {"sh", "sudo rm -rf /var"},
    {"sh", "find / -name '*.log' -delete"},
    {"sh", "find . -exec rm {} +"},
    {"sh", "dd if=/dev/zero of=/dev/vda bs=1M"},
    {"sh", "dd if=/dev/urandom of=/root/big bs=1M count=10"},
    {"sh", "mkfs.ext4 /dev/vdb"},
    {"sh", "mkfs -t ext4 /dev/vdb"},
    {"sh", "wipefs -a /dev/vda"},
    {"sh", "shred -u secrets.txt"},
    {"sh", "chmod -R 777 /"},
    {"sh", "chown -R nobody /srv"},
    {"sh", "chgrp --recursive staff /srv"},
    {"sh", "apt-get install -y curl"},
    {"sh", "apt remove python3"},
    {"sh", "dpkg -i pkg.deb"},
    {"sh", "pip install numpy"},
    {"sh", "python3 -m pip install --user requests"},
    {"sh", "npm install -g left-pad"},
    {"sh", "echo 'nameserver 1.1.1.1' > /etc/resolv.conf"},
    {"sh", "echo x >> /usr/lib/os-release"},
    {"sh", "cp evil /boot/vmlinuz"},
    {"sh", "tee /etc/hosts < hosts"},
    {"sh", "sed -i s/a/b/ /etc/passwd"},
    {"sh", "kill -9 -1"},
    {"sh", "kill -KILL -1"},
    {"sh", "pkill python"},
    {"sh", ":(){ :|:& };:"},
    {"sh", "bomb() { bomb | bomb & }; bomb"},
    {"sh", "echo c > /proc/sysrq-trigger"},
    {"sh", "reboot"},
    {"sh", "cat /dev/urandom > /dev/vda"},
    {"sh", "truncate -s 0 important.db"},
    {"sh", "git reset --hard HEAD~3"},
    {"sh", "git clean -fdx"},
    {"sh", "sqlite3 app.db 'DROP TABLE users'"},
    {"python", "import shutil\nshutil.rmtree('/srv')"},
    {"python", "import os\nos.system('rm -rf /')"},
    {"python", "import os\nos.remove('data.csv')"},
    {"python", "cur.execute('delete from users')"},
    {"python", "cur.execute(\"TRUNCATE TABLE logs\")"},
    {"python", "db.execute('drop database prod')"},
    {"python", "open('/etc/passwd', 'w').write('')"},
    {"python", "import os\nwhile True:\n    os.fork()"},
    {"python", "import os\nos.kill(-1, 9)"},
    {"python", "import subprocess\nsubprocess.run(['apt-get', 'install', 'x'])"},
    {"javascript", "require('fs').rmSync('/srv', {recursive: true})"},
    {"javascript", "require('fs').writeFileSync('/etc/motd', 'x')"},
    {"javascript", "require('child_process').execSync('rm -rf /')"},
    {NULL, "rm -rf /"},
};

/* Neither destructive nor, below, read-only (they change state, quietly). */
static const struct {
    const char *lang, *code;
} benign[] = {
    {"sh", "ls -la /"},
    {"sh", "echo hello > out.txt"},
    {"sh", "mkdir -p /tmp/work && cd /tmp/work"},
    {"sh", "cat /etc/passwd"},
    {"sh", "ls /usr/bin | wc -l"},
    {"sh", "farm --dd-of=x"},
    {"sh", "rmdir emptydir"},
    {"sh", "f() { a | b && c; }"},
    {"sh", "grep -r TODO src"},
    {"python", "x = 41 + 1\nprint(x)"},
    {"python", "data = [1, 2, 3]\ndata.append(4)"},
    {"python", "import json\nprint(json.dumps({'a': 1}))"},
    {"python", "print('deleted from the list')"},
    {"javascript", "let a = [1,2]; console.log(a.length)"},
};

static const struct {
    const char *lang, *code;
    bool read_only;
} reading[] = {
    /* shell */
    {"sh", "ls -la /", true},
    {"sh", "ls /usr/bin | wc -l", true},
    {"sh", "cat /etc/os-release; uname -a", true},
    {"sh", "grep -rn 'TODO' src 2>/dev/null | head -20", true},
    {"sh", "df -h && free -m", true},
    {"sh", "wc -l < data.csv", true},
    {"sh", "echo \"$HOME\" 'a;b' # comment > here", true},
    {"sh", "find . -name '*.py'", true},
    {"sh", "sed -n 1,5p file.txt", true},
    {"sh", "git status", true},
    {"sh", "command -v python3", true},
    {"sh", "sort data.txt | uniq -c", true},
    {"sh", "", true},
    {"shell", "pwd", true},
    {NULL, "uname -r", true},
    {"sh", "echo hi > out.txt", false},
    {"sh", "echo hi >> out.txt", false},
    {"sh", "cat a | tee b", false},
    {"sh", "ls $(rm -rf /)", false},
    {"sh", "ls `rm -rf /`", false},
    {"sh", "echo \"$(reboot)\"", false},
    {"sh", "ls & ", false},
    {"sh", "sleep 100 &", false},
    {"sh", "cd /tmp", false},
    {"sh", "X=1", false},
    {"sh", "export X=1", false},
    {"sh", "find . -delete", false},
    {"sh", "find . -exec rm {} \\;", false},
    {"sh", "sed -i s/a/b/ f", false},
    {"sh", "sed 's/a/b/w out' f", false},
    {"sh", "sort -o f f", false},
    {"sh", "uniq in out", false},
    {"sh", "env rm -rf /", false},
    {"sh", "hostname evil", false},
    {"sh", "git checkout .", false},
    {"sh", "date -s 2020-01-01", false},
    {"sh", "cat <<EOF\nx\nEOF", false},
    {"sh", "diff <(ls a) <(ls b)", false},
    {"sh", "{ ls; }", false},
    {"sh", "(ls)", false},
    {"sh", "ls 'unterminated", false},
    {"sh", "python3 -c 'print(1)'", false},
    {"sh", "awk '{print > \"f\"}' x", false},
    {"sh", "xargs rm < list", false},
    {"bash", "printf -v x %s 1", false},
    /* python */
    {"python", "print(x)", true},
    {"python", "x", true},
    {"python", "len(data), sorted(d.keys)", true},
    {"python", "print(df.shape)\nprint(type(df))", true},
    {"python", "print('a = b', \"c\")  # a comment = with equals", true},
    {"python", "x == 1 or y != 2 and z <= 3", true},
    {"python", "[v * 2 for v in values if v > 0]", true},
    {"python", "print('''multi\nline''')", true},
    {"python", "print(r'\\d+', b'x')", true},
    {"python", "x = 1", false},
    {"python", "x += 1", false},
    {"python", "x <<= 1", false},
    {"python", "(y := 3)", false},
    {"python", "data.append(1)", false},
    {"python", "d.clear()", false},
    {"python", "print(x, end='')", false},
    {"python", "import os", false},
    {"python", "from os import remove", false},
    {"python", "def f(): pass", false},
    {"python", "del x", false},
    {"python", "for v in values: print(v)", false},
    {"python", "while True: pass", false},
    {"python", "print(f'{os.remove(1)}')", false},
    {"python", "open('f').read()", false},
    {"python", "exec('x=1')", false},
    {"python", "__import__('os').system('reboot')", false},
    {"python", "getattr(x, 'clear')()", false},
    {"python", "next(it)", false},
    {"python", "print('unterminated)", false},
    {"python", "@decorator\ndef f(): pass", false},
    /* javascript */
    {"javascript", "console.log(x)", true},
    {"javascript", "console.log(JSON.stringify(obj), Object.keys(obj).length)", true},
    {"javascript", "x === 1 && y !== 2", true},
    {"node", "Math.max(a, b)", true},
    {"javascript", "x = 1", false},
    {"javascript", "let y = 2", false},
    {"javascript", "arr.push(1)", false},
    {"javascript", "i++", false},
    {"javascript", "console.log(`${process.exit()}`)", false},
    {"javascript", "require('fs')", false},
    {"javascript", "(() => 1)()", false},
    {"javascript", "'/'.match(/'/)", false},
    /* unknown languages are never proven read-only */
    {"ruby", "puts 1", false},
};

static void test_destructive(void)
{
    for (size_t i = 0; i < sizeof(destructive) / sizeof(destructive[0]); i++) {
        const char *why = al_code_destructive(destructive[i].lang, destructive[i].code);
        ok(why != NULL, "destructive (%s): %s", why ? why : "missed", destructive[i].code);
        ok(!al_code_read_only(destructive[i].lang, destructive[i].code),
           "destructive is not read-only: %s", destructive[i].code);
    }
    for (size_t i = 0; i < sizeof(benign) / sizeof(benign[0]); i++) {
        const char *why = al_code_destructive(benign[i].lang, benign[i].code);
        ok(why == NULL, "not destructive (%s): %s", why ? why : "right", benign[i].code);
    }
    ok(al_code_destructive("sh", NULL) == NULL, "NULL code is not destructive");
}

static void test_read_only(void)
{
    for (size_t i = 0; i < sizeof(reading) / sizeof(reading[0]); i++)
        ok(al_code_read_only(reading[i].lang, reading[i].code) == reading[i].read_only,
           "%s read-only=%d: %s", reading[i].lang ? reading[i].lang : "(argv)",
           reading[i].read_only, reading[i].code);
    ok(!al_code_read_only("sh", NULL), "NULL code is not read-only");
}

/* READ_ONLY_CODE_MAX (4096): at the bound a reader still qualifies, above it nothing does. */
static void test_length_bound(void)
{
    static char code[4098];
    memset(code, ' ', sizeof(code) - 1);
    memcpy(code, "ls", 2);
    code[4095] = '\0';
    ok(al_code_read_only("sh", code), "4095 bytes: below the bound");
    code[4095] = ' ';
    code[4096] = '\0';
    ok(al_code_read_only("sh", code), "4096 bytes: at the bound");
    code[4096] = ' ';
    code[4097] = '\0';
    ok(!al_code_read_only("sh", code), "4097 bytes: over the bound, not proven");
}

static void test_policy(void)
{
    enum al_checkpoint_policy p;
    al_error err = {0};
    ok(al_checkpoint_policy_parse("auto", &p, &err) == 0 && p == AL_CHECKPOINT_AUTO, "parse auto");
    ok(al_checkpoint_policy_parse("always", &p, &err) == 0 && p == AL_CHECKPOINT_ALWAYS,
       "parse always");
    ok(al_checkpoint_policy_parse("never", &p, &err) == 0 && p == AL_CHECKPOINT_NEVER,
       "parse never");
    ok(al_checkpoint_policy_parse("sometimes", &p, &err) < 0 && err.msg[0],
       "parse refuses others: %s", err.msg);
    ok(!strcmp(al_checkpoint_policy_name(AL_CHECKPOINT_ALWAYS), "always"), "name");

    ok(!al_checkpoint_policy_wants("sh", "ls -la", AL_CHECKPOINT_AUTO), "auto: read-only skipped");
    ok(al_checkpoint_policy_wants("sh", "echo x > f", AL_CHECKPOINT_AUTO), "auto: a write");
    ok(al_checkpoint_policy_wants("sh", "rm -rf /", AL_CHECKPOINT_AUTO), "auto: destructive");
    ok(al_checkpoint_policy_wants("python", "x = 1", AL_CHECKPOINT_AUTO), "auto: assignment");
    ok(!al_checkpoint_policy_wants("python", "print(x)", AL_CHECKPOINT_AUTO), "auto: print");
    ok(al_checkpoint_policy_wants("sh", "ls", AL_CHECKPOINT_ALWAYS), "always: even read-only");
    ok(!al_checkpoint_policy_wants("sh", "rm -rf /", AL_CHECKPOINT_NEVER),
       "never: even destructive");
}

int main(void)
{
    test_destructive();
    test_read_only();
    test_length_bound();
    test_policy();
    printf("1..%u\n", count);
    return failed ? 1 : 0;
}

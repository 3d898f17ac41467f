/* The runtime directory and files made in shared places (orchestrator/base/util.c): a directory
 * someone else made or can write is refused, symlinks are never followed, files copied from the
 * guest get the umask. Cases that need another uid run only as root (they say skip else). TAP. */
#include "util.h"

#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#define OTHER_UID 64999 /* a uid no one on a test machine has */

#include "tap.h"

static void skip(const char *what)
{
    printf("ok %d # skip %s (needs root)\n", ++tests, what);
}

static char base[] = "/tmp/airlock-test-runtime-XXXXXX";

/* al_runtime_dir with $AIRLOCK_RUNTIME_DIR at base/name; the error's message in msg. */
static int runtime_at(const char *name, char *msg, size_t len)
{
    char path[256], got[4096];
    snprintf(path, sizeof(path), "%s/%s", base, name);
    setenv("AIRLOCK_RUNTIME_DIR", path, 1);
    al_error e = {0};
    int r = al_runtime_dir(got, sizeof(got), &e);
    snprintf(msg, len, "%s", e.msg);
    if (r < 0)
        printf("# %s\n", e.msg);
    return r;
}

static void test_override(void)
{
    char msg[512], path[256];
    ok(runtime_at("fresh/deeper", msg, sizeof(msg)) == 0, "a fresh directory is made and taken");
    snprintf(path, sizeof(path), "%s/gw", base);
    mkdir(path, 0700);
    chmod(path, 0775);
    ok(runtime_at("gw", msg, sizeof(msg)) == -EPERM && strstr(msg, "writable by group"),
       "a group-writable directory is refused");
    snprintf(path, sizeof(path), "%s/ow", base);
    mkdir(path, 0700);
    chmod(path, 01777);
    ok(runtime_at("ow", msg, sizeof(msg)) == -EPERM, "a world-writable one (sticky or not) too");
    char target[256];
    snprintf(target, sizeof(target), "%s/fresh", base);
    snprintf(path, sizeof(path), "%s/link", base);
    (void)!symlink(target, path);
    ok(runtime_at("link", msg, sizeof(msg)) == -EPERM && strstr(msg, "symlink"),
       "a symlink is refused, not followed");
    if (geteuid() != 0) {
        skip("a directory owned by another uid is refused");
        return;
    }
    snprintf(path, sizeof(path), "%s/foreign", base);
    mkdir(path, 0755);
    (void)!chown(path, OTHER_UID, OTHER_UID);
    ok(runtime_at("foreign", msg, sizeof(msg)) == -EPERM && strstr(msg, "owned by uid 64999"),
       "a directory owned by another uid is refused");
    unsetenv("AIRLOCK_RUNTIME_DIR");
}

/* In a child running as OTHER_UID without XDG_RUNTIME_DIR: al_runtime_dir's result, and the
 * mode of /tmp/airlock-OTHER_UID afterwards in *mode. */
static int runtime_as_other(mode_t *mode)
{
    fflush(stdout); /* the child must not print what the parent buffered */
    pid_t pid = fork();
    if (pid == 0) {
        unsetenv("AIRLOCK_RUNTIME_DIR");
        unsetenv("XDG_RUNTIME_DIR");
        if (setresgid(OTHER_UID, OTHER_UID, OTHER_UID) < 0 ||
            setresuid(OTHER_UID, OTHER_UID, OTHER_UID) < 0)
            _exit(100);
        char got[4096];
        al_error e = {0};
        int r = al_runtime_dir(got, sizeof(got), &e);
        if (r < 0)
            printf("# as uid %d: %s\n", OTHER_UID, e.msg);
        fflush(stdout);
        _exit(r == 0 ? 0 : r == -EPERM ? 1 : 2);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    char path[64];
    snprintf(path, sizeof(path), "/tmp/airlock-%d", OTHER_UID);
    struct stat sb;
    *mode = lstat(path, &sb) == 0 ? sb.st_mode & 07777 : 0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 99;
}

static void test_tmp_fallback(void)
{
    if (geteuid() != 0) {
        skip("/tmp/airlock-UID squatted by another user is refused");
        return;
    }
    char path[64];
    snprintf(path, sizeof(path), "/tmp/airlock-%d", OTHER_UID);
    al_rmtree(path);
    mode_t mode = 0;
    int r = runtime_as_other(&mode);
    ok(r == 0 && mode == 0700, "the fallback is made 0700 (got %04o)", (unsigned)mode);
    al_rmtree(path);
    /* Squatted: made first by someone else (here root), open to all. */
    mkdir(path, 0777);
    chmod(path, 0777);
    ok(runtime_as_other(&mode) == 1, "squatted by another user: refused");
    chmod(path, 0755);
    ok(runtime_as_other(&mode) == 1, "another user's, even read-only for others: refused");
    /* Ours but left 0755 by an older airlock: taken, and made private. */
    (void)!chown(path, OTHER_UID, OTHER_UID);
    r = runtime_as_other(&mode);
    ok(r == 0 && mode == 0700, "ours at 0755: taken and made 0700 (%04o)", (unsigned)mode);
    al_rmtree(path);
    (void)!symlink("/tmp", path);
    ok(runtime_as_other(&mode) == 1, "a symlink in its place: refused");
    unlink(path);
}

static void test_private_file(void)
{
    char path[256], target[256];
    snprintf(path, sizeof(path), "%s/marker", base);
    snprintf(target, sizeof(target), "%s/victim", base);
    int fd = open(target, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    (void)!write(fd, "keep", 4);
    close(fd);
    (void)!symlink(target, path);
    fd = al_file_create_private(path, O_TRUNC);
    struct stat st;
    ok(fd == -ELOOP && stat(target, &st) == 0 && st.st_size == 4,
       "a symlink is not followed, its target untouched (%d)", fd);
    unlink(path);

    fd = al_file_create_private(path, O_TRUNC);
    ok(fd >= 0 && fstat(fd, &st) == 0 && (st.st_mode & 07777) == 0600 && S_ISREG(st.st_mode),
       "a new file is a regular 0600 file");
    if (fd >= 0) {
        (void)!write(fd, "12345", 5);
        close(fd);
    }
    chmod(path, 0666);
    fd = al_file_create_private(path, O_TRUNC);
    ok(fd >= 0 && fstat(fd, &st) == 0 && st.st_size == 0 && (st.st_mode & 0777) == 0600,
       "ours again: truncated and made 0600");
    if (fd >= 0)
        close(fd);

    snprintf(path, sizeof(path), "%s/fifo", base);
    mkfifo(path, 0600);
    fd = al_file_create_private(path, 0);
    ok(fd < 0, "a FIFO in its place fails at once (%d)", fd);

    snprintf(path, sizeof(path), "%s/hard", base);
    (void)!link(target, path);
    fd = al_file_create_private(path, O_TRUNC);
    ok(fd == -EPERM && stat(target, &st) == 0 && st.st_size == 4,
       "a hard link to another file is refused, not truncated");

    if (geteuid() != 0) {
        skip("a file owned by another uid is refused");
        return;
    }
    snprintf(path, sizeof(path), "%s/theirs", base);
    fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
    (void)!write(fd, "theirs", 6);
    close(fd);
    (void)!chown(path, OTHER_UID, OTHER_UID);
    fd = al_file_create_private(path, O_TRUNC);
    ok(fd == -EPERM && stat(path, &st) == 0 && st.st_size == 6,
       "a file owned by another uid is refused, not truncated");
}

static void test_umask(void)
{
    mode_t old = umask(027);
    ok(al_umask() == 027, "al_umask reads the umask");
    ok(al_umask() == 027, "and leaves it as it was");
    umask(old);
}

int main(void)
{
    if (!mkdtemp(base)) {
        perror("mkdtemp");
        return 1;
    }
    test_override();
    test_tmp_fallback();
    test_private_file();
    test_umask();
    al_rmtree(base);
    return tap_done();
}

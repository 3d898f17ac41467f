/* Process-level setup: PID-1 duties in the tiny image (mounts, modules, hostname), the
 * protections every agent takes, and powering off. */
#include "agent.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/reboot.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>

/* Kernel modules to load at boot, one .ko path per line, in dependency order. */
#define MODULES_LIST "/etc/airlock/modules"

static void mount_fs(const char *type, const char *dir, unsigned long flags, const char *data)
{
    mkdir(dir, 0755);
    if (mount(type, dir, type, flags, data) < 0 && errno != EBUSY)
        agent_log("cannot mount %s on %s: %s", type, dir, strerror(errno));
}

static void load_modules(void)
{
    char line[PATH_MAX];
    FILE *f = fopen(MODULES_LIST, "re");
    if (!f)
        return;
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\r\n")] = '\0';
        if (!line[0] || line[0] == '#')
            continue;
        /* finit_module directly: no modprobe, no depmod data needed in the image. */
        _cleanup_close_ int fd = open(line, O_RDONLY | O_CLOEXEC);
        if (fd < 0 || (syscall(SYS_finit_module, fd, "", 0) < 0 && errno != EEXIST))
            agent_log("cannot load module %s: %s", line, strerror(errno));
    }
    fclose(f);
}

void init_pid1(void)
{
    const unsigned long plain = MS_NOSUID | MS_NODEV | MS_NOEXEC; /* pseudo filesystems */
    mount_fs("proc", "/proc", plain, NULL);
    mount_fs("sysfs", "/sys", plain, NULL);
    mount_fs("devtmpfs", "/dev", MS_NOSUID, "mode=0755");
    /* Without /dev/console in the initramfs the kernel starts init with fds 0-2 closed. */
    int fd = open("/dev/console", O_RDWR | O_NOCTTY);
    for (int i = 0; fd >= 0 && i < 3; i++)
        if (fcntl(i, F_GETFD) < 0)
            dup2(fd, i);
    if (fd > 2)
        close(fd);
    mount_fs("devpts", "/dev/pts", MS_NOSUID | MS_NOEXEC, "mode=0620,ptmxmode=0666");
    mount_fs("tmpfs", "/dev/shm", MS_NOSUID | MS_NODEV, "mode=1777");
    mount_fs("tmpfs", "/tmp", MS_NOSUID | MS_NODEV, "mode=1777");
    mount_fs("tmpfs", "/run", MS_NOSUID | MS_NODEV, "mode=0755");
    mount_fs("cgroup2", CGROUP_ROOT, plain, NULL);
    /* What udev would have made and shells expect (process substitution, /dev/stdin). */
    symlink("/proc/self/fd", "/dev/fd");
    symlink("/proc/self/fd/0", "/dev/stdin");
    symlink("/proc/self/fd/1", "/dev/stdout");
    symlink("/proc/self/fd/2", "/dev/stderr");
    load_modules();
    sethostname("airlock", strlen("airlock"));
    setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", 1);
    setenv("HOME", "/root", 1);
    if (chdir("/") < 0)
        agent_log("cannot chdir to /: %s", strerror(errno));
}

/* PID 1 stays a minimal supervisor and the agent runs as its child: root code in the guest can
 * then kill the agent (init is immune to SIGKILL), and a dead agent powers the machine off at
 * once, so the host sees its session end instead of a silent channel. Returns in the child. */
void init_supervise(void)
{
    pid_t agent = fork();
    if (agent == 0)
        return;
    if (agent > 0) {
        FILE *f = fopen("/run/airlock-agent.pid", "we");
        if (!f || fprintf(f, "%d\n", (int)agent) < 0 || fclose(f) != 0)
            agent_log("cannot write /run/airlock-agent.pid: %s", strerror(errno));
        int st;
        pid_t p;
        /* Orphans outside the agent's subtree land here: reap them all. */
        while ((p = waitpid(-1, &st, 0)) != agent)
            if (p < 0 && errno != EINTR)
                break;
        agent_log("agent exited (%s %d): powering off", WIFSIGNALED(st) ? "signal" : "status",
                  WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    } else {
        agent_log("cannot start the agent: %s", strerror(errno));
    }
    init_power_off(false);
    for (;;)
        pause(); /* init must never exit: the kernel would panic */
}

void init_common(void)
{
    /* Keep fds 0-2 taken, so no pipe or socket of ours lands there and gets clobbered. */
    for (int i = 0; i < 3; i++)
        if (fcntl(i, F_GETFD) < 0 && open("/dev/null", O_RDWR) < 0)
            break;
    /* A runaway child must be the OOM killer's choice, never the agent. */
    write_file(AT_FDCWD, "/proc/self/oom_score_adj", "-1000");
    /* Default dispositions for all (nohup-style SIG_IGN would pass on to every process), so a
     * child only has to undo SIGPIPE: one syscall instead of 64 under emulation. */
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    for (int s = 1; s < NSIG; s++)
        sigaction(s, &dfl, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* Orphans of our requests come back to us, so their cgroups empty and can be removed. */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
}

void init_power_off(bool reboot_instead)
{
    sync();
    reboot(reboot_instead ? RB_AUTOBOOT : RB_POWER_OFF);
}

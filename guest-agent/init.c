/* Process-level setup: PID-1 duties (mounts, modules, hostname; in images with a root disk,
 * switching to it; in images without the agent, running their boot program), the protections
 * every agent takes, and powering off. */
#include "agent.h"

#include <dirent.h>
#include <fcntl.h>
#include <net/if.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/reboot.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>

/* Kernel modules to load at boot, one .ko path per line, in dependency order; a line
 * "virtio:ID PATH" loads PATH only when a virtio device of that id is there (18: input, the
 * tablet and keyboard of a session with a display), so sessions without one spend no memory on
 * it. */
#define MODULES_LIST "/etc/airlock/modules"
/* Kernel command-line word naming the root disk (airlock.root=/dev/vda). Without it the
 * initramfs is the root (tiny); with it the initramfs only carries what reaches the disk. */
#define ROOT_PARAM "airlock.root="
/* The disk's node appears once virtio_blk has probed it, normally before finit_module returns;
 * a disk still missing after this long is not coming. */
#define ROOT_WAIT_MS 5000
/* Kernel command-line word naming a program to run instead of the agent, once the root is
 * switched (airlock.init=/usr/local/sbin/airlock-boot): images reached over SSH, which must not
 * hold the agent, boot with it. */
#define INIT_PARAM "airlock.init="
/* Kernel command-line word naming a program PID 1 starts once, beside the agent, after the root
 * switch (airlock.service=/usr/local/sbin/airlock-desktop): an image's own boot step (the desktop
 * image's X server). Its processes are adopted and reaped by PID 1, never restarted; it holds no
 * channel and no request, so the host relies on nothing it does. */
#define SERVICE_PARAM "airlock.service="
/* Where the new root is mounted before the switch. */
#define NEW_ROOT "/newroot"
/* The agent and the language kernels, in the initramfs; bound at the same path into the new
 * root so that they come with each airlock build, not with the (cached) disk. */
#define AIRLOCK_LIB "/usr/lib/airlock"
/* /proc/cmdline is at most a page or two (COMMAND_LINE_SIZE is 2048 on x86). */
#define CMDLINE_MAX 4096

static void mount_fs(const char *type, const char *dir, unsigned long flags, const char *data)
{
    mkdir(dir, 0755);
    if (mount(type, dir, type, flags, data) < 0 && errno != EBUSY)
        agent_log("cannot mount %s on %s: %s", type, dir, strerror(errno));
}

/* Whether the virtio bus has a device of id (its modules loaded before: virtio_pci probes the
 * PCI devices as it loads). */
static bool virtio_device_present(unsigned long id)
{
    DIR *d = opendir("/sys/bus/virtio/devices");
    bool found = false;
    for (struct dirent *e; d && !found && (e = readdir(d));) {
        char path[PATH_MAX], buf[32];
        if (e->d_name[0] == '.' || snprintf(path, sizeof(path), "/sys/bus/virtio/devices/%s/device",
                                            e->d_name) >= (int)sizeof(path))
            continue;
        _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
        ssize_t n = fd < 0 ? -1 : read(fd, buf, sizeof(buf) - 1);
        if (n > 0) {
            buf[n] = '\0';
            found = strtoul(buf, NULL, 0) == id;
        }
    }
    if (d)
        closedir(d);
    return found;
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
        const char *path = line;
        if (!strncmp(line, "virtio:", 7)) {
            char *end;
            unsigned long id = strtoul(line + 7, &end, 10);
            if (*end != ' ' || !virtio_device_present(id))
                continue;
            path = end + 1;
        }
        /* finit_module directly: no modprobe, no depmod data needed in the image. */
        _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0 || (syscall(SYS_finit_module, fd, "", 0) < 0 && errno != EEXIST))
            agent_log("cannot load module %s: %s", path, strerror(errno));
    }
    fclose(f);
}

/* The program named by airlock.init=, set by init_pid1(); empty: serve the agent protocol. */
static char boot_program[PATH_MAX];
/* The program named by airlock.service=; empty: none. */
static char service_program[PATH_MAX];

/* Writes the value of the command-line word PARAM (name and '=') into val when it is an absolute
 * path under prefix without "..", false when there is none (or it is no such path). */
static bool cmdline_path(const char *param, const char *prefix, char *val, size_t len)
{
    char line[CMDLINE_MAX];
    _cleanup_close_ int fd = open("/proc/cmdline", O_RDONLY | O_CLOEXEC);
    ssize_t n = fd < 0 ? -1 : read(fd, line, sizeof(line) - 1);
    if (n <= 0)
        return false;
    line[n] = '\0';
    for (char *w = strtok(line, " \t\n"); w; w = strtok(NULL, " \t\n")) {
        if (strncmp(w, param, strlen(param)) != 0)
            continue;
        const char *v = w + strlen(param);
        if (strncmp(v, prefix, strlen(prefix)) != 0 || strstr(v, "..") || strlen(v) >= len) {
            agent_log("ignoring %s%s: not a path under %s", param, v, prefix);
            return false;
        }
        snprintf(val, len, "%s", v);
        return true;
    }
    return false;
}

/* Mounts dev on NEW_ROOT, brings /usr/lib/airlock (unless with_agent is false: an image booted
 * with airlock.init= must not see the agent) and the pseudo filesystems along and makes it the
 * root, as switch_root(8) does; the initramfs stays underneath (it holds only the few MiB bound
 * in). Any failure is fatal to the boot: an agent without its image is no use. */
static int root_switch(const char *dev, bool with_agent)
{
    struct stat st;
    for (int waited = 0; stat(dev, &st) < 0 && waited < ROOT_WAIT_MS; waited += 10)
        usleep(10 * 1000);
    mkdir(NEW_ROOT, 0755);
    /* Sessions write to their own overlay of the disk, so it is mounted read-write. */
    if (mount(dev, NEW_ROOT, "ext4", MS_NOATIME, NULL) < 0) {
        int e = errno;
        agent_log("cannot mount the root disk %s: %s", dev, strerror(e));
        return -e;
    }
    static const char *const carried[] = {AIRLOCK_LIB, "/dev", "/proc", "/sys"};
    for (size_t i = with_agent ? 0 : 1; i < sizeof(carried) / sizeof(carried[0]); i++) {
        char to[PATH_MAX];
        snprintf(to, sizeof(to), NEW_ROOT "%s", carried[i]);
        mkdir(to, 0755);
        /* The airlock dir is bound (it stays in the initramfs), the mounts are moved. */
        unsigned long how = i == 0 ? MS_BIND | MS_REC : MS_MOVE;
        if (mount(carried[i], to, NULL, how, NULL) < 0) {
            int e = errno;
            agent_log("cannot bring %s into the root disk: %s", carried[i], strerror(e));
            return -e;
        }
    }
    if (chdir(NEW_ROOT) < 0 || mount(".", "/", NULL, MS_MOVE, NULL) < 0 || chroot(".") < 0 ||
        chdir("/") < 0) {
        int e = errno;
        agent_log("cannot switch to the root disk: %s", strerror(e));
        return -e;
    }
    return 0;
}

/* /tmp and /dev/shm hold at most half the memory still available once the guest is up, not
 * tmpfs's half of all of it: in a small guest (tiny's root is itself in memory) filling /tmp
 * then ends in ENOSPC the program can report, not in a kernel deadlocked on memory. */
static void tmpfs_opts(char *buf, size_t len)
{
    unsigned long long kib = 0;
    char line[128];
    FILE *f = fopen("/proc/meminfo", "re");
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1)
            break;
    if (f)
        fclose(f);
    if (kib >= 2048)
        snprintf(buf, len, "mode=1777,size=%lluk", kib / 2);
    else
        snprintf(buf, len, "mode=1777");
}

/* Code that serves on localhost (a test web server, a notebook) expects lo to be up. */
static void loopback_up(void)
{
    _cleanup_close_ int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct ifreq ifr = {.ifr_name = "lo"};
    if (s < 0 || ioctl(s, SIOCGIFFLAGS, &ifr) < 0)
        return;
    ifr.ifr_flags |= IFF_UP;
    if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0)
        agent_log("cannot bring up lo: %s", strerror(errno));
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
    load_modules();
    char dev[64];
    cmdline_path(INIT_PARAM, "/", boot_program, sizeof(boot_program));
    cmdline_path(SERVICE_PARAM, "/", service_program, sizeof(service_program));
    if (cmdline_path(ROOT_PARAM, "/dev/", dev, sizeof(dev)) &&
        root_switch(dev, !boot_program[0]) < 0) {
        init_power_off(false); /* the host sees the channel close, the console says why */
        for (;;)
            pause();
    }
    /* The rest is mounted in the final root. */
    mount_fs("devpts", "/dev/pts", MS_NOSUID | MS_NOEXEC, "mode=0620,ptmxmode=0666");
    char mem_fs[64];
    tmpfs_opts(mem_fs, sizeof(mem_fs));
    mount_fs("tmpfs", "/dev/shm", MS_NOSUID | MS_NODEV, mem_fs);
    mount_fs("tmpfs", "/tmp", MS_NOSUID | MS_NODEV, mem_fs);
    mount_fs("tmpfs", "/run", MS_NOSUID | MS_NODEV, "mode=0755");
    mount_fs("cgroup2", CGROUP_ROOT, plain, NULL);
    /* What udev would have made and shells expect (process substitution, /dev/stdin). */
    static const char *const links[][2] = {{"/proc/self/fd", "/dev/fd"},
                                           {"/proc/self/fd/0", "/dev/stdin"},
                                           {"/proc/self/fd/1", "/dev/stdout"},
                                           {"/proc/self/fd/2", "/dev/stderr"}};
    for (size_t i = 0; i < sizeof(links) / sizeof(links[0]); i++)
        if (symlink(links[i][0], links[i][1]) < 0 && errno != EEXIST)
            agent_log("cannot link %s: %s", links[i][1], strerror(errno));
    if (sethostname("airlock", strlen("airlock")) < 0)
        agent_log("cannot set the host name: %s", strerror(errno));
    loopback_up();
    /* A session with network: its address and the proxy variables (images with a boot program
     * run sshd over their NIC instead). */
    if (!boot_program[0] && egress_present())
        egress_setup();
    /* Every process the agent starts inherits these (guest-agent/agent_exec.c). */
    setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", 1);
    setenv("HOME", "/root", 1);
    setenv("LANG", "C.UTF-8", 1);
    /* No display: matplotlib renders to files (plt.show() does not try a window). */
    setenv("MPLBACKEND", "Agg", 1);
    if (chdir("/") < 0)
        agent_log("cannot chdir to /: %s", strerror(errno));
}

/* Starts program with stdin from /dev/null and output to the console (fds 1-2; nothing reads
 * the serial line), in a session of its own when new_session. Its pid, or -1 (logged). */
static pid_t program_start(const char *program, bool new_session)
{
    pid_t pid = fork();
    if (pid == 0) {
        if (new_session)
            setsid();
        int fd = open("/dev/null", O_RDONLY);
        if (fd > 0) {
            dup2(fd, STDIN_FILENO);
            close(fd);
        }
        execl(program, program, (char *)NULL);
        agent_log("cannot run %s: %s", program, strerror(errno));
        _exit(127);
    }
    if (pid < 0)
        agent_log("cannot start %s: %s", program, strerror(errno));
    return pid;
}

/* airlock.init=PROGRAM: PROGRAM is a one-shot boot step (it starts sshd and exits 0). PID 1
 * then only reaps: daemons and the orphans of SSH sessions are re-parented to it. A boot step
 * that cannot start or fails powers the machine off, so the host sees it at once instead of
 * waiting out a timeout; a daemon that dies later is not restarted (tests kill sshd on purpose). */
static _Noreturn void boot_program_run(void)
{
    pid_t boot = program_start(boot_program, false);
    while (boot > 0) {
        int st;
        pid_t p = waitpid(-1, &st, 0);
        if (p == boot) {
            if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
                boot = 0; /* its pid may come back for another process */
                continue;
            }
            agent_log("%s failed (%s %d): powering off", boot_program,
                      WIFSIGNALED(st) ? "signal" : "status",
                      WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
            break;
        }
        if (p < 0 && errno != EINTR)
            break; /* cannot happen while the boot step runs */
    }
    if (boot == 0) {
        /* Orphans of everything, for as long as there are processes; ECHILD: none left, and
         * none can appear (every process descends from PID 1). */
        while (waitpid(-1, NULL, 0) > 0 || errno == EINTR)
            ;
        agent_log("no processes left");
        for (;;)
            pause();
    }
    init_power_off(false);
    for (;;)
        pause(); /* init must never exit: the kernel would panic */
}

/* PID 1 stays a minimal supervisor and the agent runs as its child: root code in the guest can
 * then kill the agent (init is immune to SIGKILL), and a dead agent powers the machine off at
 * once, so the host sees its session end instead of a silent channel. Returns in the child.
 * With airlock.init= it runs that program instead and never returns. */
void init_supervise(void)
{
    if (boot_program[0])
        boot_program_run();
    if (egress_present())
        egress_start();
    /* airlock.service=PROGRAM: started once, in its own session (it may send its output
     * elsewhere); PID 1 reaps it and what it leaves running. */
    if (service_program[0])
        program_start(service_program, true);
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

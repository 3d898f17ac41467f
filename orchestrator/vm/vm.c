/* The VM: choosing the libvirt connection, describing the domain, starting it. */
#include "vm.h"

#include <cjson/cJSON.h>
#include <libvirt/libvirt-qemu.h>
#include <libvirt/virterror.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

int al_err_virt(al_error *err, int code, const char *fmt, ...)
{
    if (!err || err->code != 0)
        return code;
    virErrorPtr e = virGetLastError();
    char what[sizeof(err->msg)];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    /* As al_err words it, with libvirt's reason after; a message already too long for err
     * goes without it. */
    if (n < 0 || (size_t)n >= sizeof(what))
        return al_err(err, code, "%s", what);
    return al_err(err, code, "%s: %s", what,
                  e && e->message ? e->message : "unknown libvirt error");
}

static void silent_virt_error(void *ctx, virErrorPtr e)
{
    (void)ctx;
    (void)e; /* errors are reported once, by the caller, through al_error */
}

static void *event_loop(void *arg)
{
    (void)arg;
    while (virEventRunDefaultImpl() == 0) {
    }
    return NULL;
}

static void events_start(void)
{
    virSetErrorFunc(NULL, silent_virt_error);
    pthread_t t;
    if (virEventRegisterDefaultImpl() == 0 && pthread_create(&t, NULL, event_loop, NULL) == 0)
        pthread_detach(t);
}

void al_libvirt_events(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, events_start);
}

static virConnectPtr try_open(const char *uri)
{
    al_libvirt_events(); /* before the connection: its socket joins the loop */
    virSetErrorFunc(NULL, silent_virt_error);
    return virConnectOpen(uri);
}

/* --connect, else LIBVIRT_DEFAULT_URI, else qemu:///system when reachable, else session. */
int al_libvirt_uri(const char *requested, char *buf, size_t len, al_error *err)
{
    const char *env = getenv("LIBVIRT_DEFAULT_URI");
    const char *uri = requested && *requested ? requested : env && *env ? env : NULL;
    if (!uri) {
        virConnectPtr c = try_open("qemu:///system");
        uri = c ? "qemu:///system" : "qemu:///session";
        if (c)
            virConnectClose(c);
    }
    if (snprintf(buf, len, "%s", uri) >= (int)len)
        return al_err(err, -ENAMETOOLONG, "libvirt URI too long");
    return 0;
}

int al_vm_connect(const char *requested, virConnectPtr *out, al_error *err)
{
    char uri[1024];
    int r = al_libvirt_uri(requested, uri, sizeof(uri), err);
    if (r < 0)
        return r;
    virConnectPtr c = try_open(uri);
    if (!c)
        return al_err_virt(err, -ECONNREFUSED,
                           "cannot reach libvirt at '%s' (is libvirtd running? try 'airlock "
                           "doctor')",
                           uri);
    *out = c;
    return 0;
}

/* Whether KVM can run a guest is only known once one ran: /dev/kvm can open and yet QEMU can fail
 * to set up a vCPU ("failed to set MSR"), or start and never execute the guest (a nested host's
 * "KVM internal error ... emulation failure"). The session that finds out records a verdict here,
 * in the runtime dir, keyed by what it depends on (this boot, the host kernel, the QEMU binary),
 * so later sessions neither pay for the discovery again nor trust a verdict from another setup.
 * The file: the key, "ok" or "broken", and the evidence, one line each. */
#define KVM_VERDICT_FILE "kvm-verdict"

static int kvm_verdict_path(char *buf, size_t len)
{
    char run[AL_PATH_MAX];
    al_error ignored = {0};
    if (al_runtime_dir(run, sizeof(run), &ignored) < 0)
        return -1;
    return al_pathf(buf, len, "%s/" KVM_VERDICT_FILE, run);
}

static void kvm_key(char *buf, size_t len)
{
    char id[64] = "";
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n = read(fd, id, sizeof(id) - 1);
        id[n > 0 ? n : 0] = '\0';
        id[strcspn(id, "\n")] = '\0';
        close(fd);
    }
    struct utsname u = {0};
    uname(&u);
    struct stat st = {0};
    const char *qemu = "/usr/bin/qemu-system-x86_64";
    stat(qemu, &st);
    snprintf(buf, len, "boot=%s kernel=%s qemu=%lld.%lld", id, u.release, (long long)st.st_size,
             (long long)st.st_mtime);
}

/* The recorded verdict for this boot, kernel and QEMU: 1 ok, 0 broken (evidence in ev), -1
 * none. Never follows a symlink; a file not ours or writable by others is ignored. */
static int kvm_verdict(char *ev, size_t evlen)
{
    char path[AL_PATH_MAX], key[256], buf[1024];
    if (kvm_verdict_path(path, sizeof(path)) < 0)
        return -1;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -1;
    struct stat st;
    ssize_t n = -1;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() && !(st.st_mode & 022))
        n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    kvm_key(key, sizeof(key));
    char *save = NULL, *have = strtok_r(buf, "\n", &save), *verdict = strtok_r(NULL, "\n", &save);
    char *evidence = strtok_r(NULL, "\n", &save);
    if (!have || !verdict || strcmp(have, key))
        return -1;
    if (ev)
        snprintf(ev, evlen, "%s", evidence ? evidence : "");
    return !strcmp(verdict, "ok") ? 1 : !strcmp(verdict, "broken") ? 0 : -1;
}

/* Written beside and renamed over the old one: never through a symlink someone planted. */
void al_kvm_record(bool works, const char *evidence)
{
    char path[AL_PATH_MAX], tmp[AL_PATH_MAX], key[256];
    if (kvm_verdict_path(path, sizeof(path)) < 0 ||
        al_pathf(tmp, sizeof(tmp), "%s.%ld", path, (long)getpid()) < 0)
        return;
    kvm_key(key, sizeof(key));
    char ev[512];
    snprintf(ev, sizeof(ev), "%s", evidence ? evidence : "");
    for (char *p = ev; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = ' ';
    unlink(tmp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    FILE *f = fdopen(fd, "w");
    if (!f) {
        close(fd);
        unlink(tmp);
        return;
    }
    fprintf(f, "%s\n%s\n%s\n", key, works ? "ok" : "broken", ev);
    if (fclose(f) != 0 || rename(tmp, path) < 0)
        unlink(tmp);
}

/* Another host's verdicts: kept in this process only (the file above is this machine's), by
 * URI, so a long-lived caller (airlockd) probes each host once. */
#define REMOTE_VERDICTS_MAX 32
static struct {
    char uri[256];
    int verdict; /* 1 ok, 0 broken */
} remote_verdicts[REMOTE_VERDICTS_MAX];
static size_t nremote_verdicts;
static pthread_mutex_t remote_verdicts_lock = PTHREAD_MUTEX_INITIALIZER;

int al_kvm_remote_verdict(virConnectPtr conn)
{
    _cleanup_free_ char *uri = virConnectGetURI(conn);
    int v = -1;
    pthread_mutex_lock(&remote_verdicts_lock);
    for (size_t i = 0; uri && i < nremote_verdicts; i++)
        if (!strcmp(remote_verdicts[i].uri, uri))
            v = remote_verdicts[i].verdict;
    pthread_mutex_unlock(&remote_verdicts_lock);
    return v;
}

void al_kvm_remote_record(virConnectPtr conn, bool works)
{
    _cleanup_free_ char *uri = virConnectGetURI(conn);
    if (!uri || strlen(uri) >= sizeof(remote_verdicts[0].uri))
        return;
    pthread_mutex_lock(&remote_verdicts_lock);
    size_t i = 0;
    while (i < nremote_verdicts && strcmp(remote_verdicts[i].uri, uri))
        i++;
    if (i == nremote_verdicts && nremote_verdicts < REMOTE_VERDICTS_MAX)
        snprintf(remote_verdicts[nremote_verdicts++].uri, sizeof(remote_verdicts[0].uri), "%s",
                 uri);
    if (i < nremote_verdicts)
        remote_verdicts[i].verdict = works;
    pthread_mutex_unlock(&remote_verdicts_lock);
}

bool al_kvm_remote_offered(virConnectPtr conn)
{
    /* libvirt answers for virttype kvm only where its QEMU found KVM usable on that host. */
    _cleanup_free_ char *caps =
        virConnectGetDomainCapabilities(conn, NULL, "x86_64", "q35", "kvm", 0);
    return caps != NULL;
}

bool al_kvm_present(void)
{
    int fd = open("/dev/kvm", O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return false;
    close(fd);
    return true;
}

/* AIRLOCK_ACCEL=tcg forces emulation (=kvm forces KVM); otherwise KVM when /dev/kvm opens and
 * no guest has failed with it on this boot. */
enum al_kvm_state al_kvm_state(void)
{
    const char *accel = getenv("AIRLOCK_ACCEL");
    if (accel && !strcmp(accel, "tcg"))
        return AL_KVM_OFF;
    if (!al_kvm_present())
        return AL_KVM_ABSENT;
    switch (kvm_verdict(NULL, 0)) {
    case 1:
        return AL_KVM_OK;
    case 0:
        return AL_KVM_FAILED;
    default:
        return AL_KVM_UNPROVEN;
    }
}

int al_kvm_evidence(char *buf, size_t len)
{
    buf[0] = '\0';
    return kvm_verdict(buf, len) == 0 ? 0 : -ENOENT;
}

bool al_kvm_state_usable(enum al_kvm_state st)
{
    const char *accel = getenv("AIRLOCK_ACCEL");
    return (accel && !strcmp(accel, "kvm")) || st == AL_KVM_OK || st == AL_KVM_UNPROVEN;
}

bool al_kvm_usable(void)
{
    return al_kvm_state_usable(al_kvm_state());
}

/* What QEMU said about KVM in the domain's log (libvirt keeps it per domain name): the line
 * that shows the guest could not run, if any. */
void al_vm_kvm_log_evidence(virConnectPtr conn, const char *name, char *out, size_t len)
{
    out[0] = '\0';
    char path[AL_PATH_MAX];
    const char *uri = virConnectGetURI(conn);
    bool session = uri && strstr(uri, "/session");
    free((void *)uri);
    if (session) {
        const char *home = getenv("HOME");
        if (!home ||
            al_pathf(path, sizeof(path), "%s/.cache/libvirt/qemu/log/%s.log", home, name) < 0)
            return;
    } else if (al_pathf(path, sizeof(path), "/var/log/libvirt/qemu/%s.log", name) < 0) {
        return;
    }
    FILE *f = fopen(path, "re");
    char line[512];
    while (f && fgets(line, sizeof(line), f)) {
        if (!strstr(line, "KVM internal error") && !strstr(line, "emulation failure") &&
            !strstr(line, "KVM_EXIT") && !strstr(line, "kvm run failed"))
            continue;
        line[strcspn(line, "\r\n")] = '\0';
        al_printable(line);
        snprintf(out, len, "QEMU: %s", line);
        break;
    }
    if (f)
        fclose(f);
}

/* Paths come from the image store and the runtime dir, both ours, but they still must not
 * break the XML. */
static void xml_text(FILE *f, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '&':
            fputs("&amp;", f);
            break;
        case '<':
            fputs("&lt;", f);
            break;
        case '>':
            fputs("&gt;", f);
            break;
        case '\'':
            fputs("&apos;", f);
            break;
        case '"':
            fputs("&quot;", f);
            break;
        default:
            fputc(*s, f);
        }
    }
}

static void xml_elem(FILE *f, const char *indent, const char *tag, const char *text)
{
    fprintf(f, "%s<%s>", indent, tag);
    xml_text(f, text);
    fprintf(f, "</%s>\n", tag);
}

/* path "": libvirt chooses one in its own channel dir on the domain's host. */
static void xml_unix_channel(FILE *f, const char *path, const char *name)
{
    fputs("    <channel type='unix'><source mode='bind'", f);
    if (*path) {
        fputs(" path='", f);
        xml_text(f, path);
        fputc('\'', f);
    }
    fputs("/><target type='virtio' name='", f);
    xml_text(f, name);
    fputs("'/></channel>\n", f);
}

/* A virtio qcow2 disk, with its backing chain (qcow2, opened read-only): the middle layers mids
 * (NULL-terminated, top first, or NULL) and then backing, when set. The chain is spelled out,
 * so libvirt opens exactly these files whatever their headers name.
 * cache unsafe: a session's disks are thrown away with it, so flushes buy nothing. */
static void xml_qcow2_disk(FILE *f, const char *path, const char *const *mids, const char *backing,
                           const char *dev)
{
    fputs("    <disk type='file' device='disk'>\n"
          "      <driver name='qemu' type='qcow2' cache='unsafe'/>\n"
          "      <source file='",
          f);
    xml_text(f, path);
    fputs("'/>\n", f);
    size_t n = 0;
    for (; mids && mids[n]; n++) {
        fputs("      <backingStore type='file'><format type='qcow2'/><source file='", f);
        xml_text(f, mids[n]);
        fputs("'/>\n", f);
    }
    if (backing) {
        fputs("      <backingStore type='file'><format type='qcow2'/><source file='", f);
        xml_text(f, backing);
        fputs("'/><backingStore/></backingStore>\n", f);
    }
    while (n--)
        fputs("      </backingStore>\n", f);
    fprintf(f, "      <target dev='%s' bus='virtio'/>\n    </disk>\n", dev);
}

char *al_vm_xml(const struct al_vm_config *cfg)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return NULL;
    bool qemu_args = true; /* the RAM backend below, always */
    fprintf(f, "<domain type='%s'%s>\n", cfg->kvm ? "kvm" : "qemu",
            qemu_args ? " xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'" : "");
    xml_elem(f, "  ", "name", cfg->name);
    fprintf(f, "  <memory unit='MiB'>%u</memory>\n  <vcpu>%u</vcpu>\n", cfg->memory_mib,
            cfg->vcpus);
    /* The session dir lets gc find the owner's lock even when the owner used another runtime
     * dir than gc's own (AIRLOCK_RUNTIME_DIR, another user's XDG dir). */
    fprintf(f, "  <metadata><%s:session xmlns:%s='%s' pid='%ld'>\n", AL_METADATA_PREFIX,
            AL_METADATA_PREFIX, AL_METADATA_NS, (long)getpid());
    xml_elem(f, "    ", AL_METADATA_PREFIX ":dir", cfg->session_dir);
    char machine[40];
    al_machine_id(machine, sizeof(machine));
    if (machine[0])
        xml_elem(f, "    ", AL_METADATA_PREFIX ":machine", machine);
    fprintf(f,
            "  </%s:session></metadata>\n"
            "  <os>\n    <type arch='x86_64' machine='q35'>hvm</type>\n",
            AL_METADATA_PREFIX);
    if (cfg->image->kernel[0]) {
        xml_elem(f, "    ", "kernel", cfg->image->kernel);
        xml_elem(f, "    ", "initrd", cfg->image->initrd);
        xml_elem(f, "    ", "cmdline", cfg->image->cmdline);
    } else {
        fputs("    <boot dev='hd'/>\n", f); /* an imported cloud image: its own boot loader */
    }
    fputs("  </os>\n  <features><acpi/></features>\n", f);
    if (cfg->kvm)
        fputs("  <cpu mode='host-passthrough'/>\n", f);
    /* No relabeling: image files are world-readable already, and concurrent sessions sharing
     * one kernel file made libvirt refuse ("already in use"). QEMU still runs as the
     * unprivileged user libvirt is configured with. */
    fputs("  <seclabel type='none' model='dac'/>\n", f);
    /* A guest that powers off, reboots or crashes is over: the session sees the channel close. */
    fputs("  <clock offset='utc'/>\n"
          "  <on_poweroff>destroy</on_poweroff>\n  <on_reboot>destroy</on_reboot>\n"
          "  <on_crash>destroy</on_crash>\n"
          "  <devices>\n"
          "    <controller type='usb' model='none'/>\n"
          "    <memballoon model='none'/>\n",
          f);
    /* No console file on a remote host: a pty there, which nobody reads. */
    if (cfg->console_path) {
        fputs("    <serial type='file'><source path='", f);
        xml_text(f, cfg->console_path);
        fputs("'/></serial>\n", f);
    } else {
        fputs("    <serial type='pty'/>\n", f);
    }
    /* The session's overlay on the image's base, which QEMU opens read-only. */
    if (cfg->disk)
        xml_qcow2_disk(f, cfg->disk, cfg->disk_mids, cfg->image->disk, "vda");
    /* Holds checkpoints (QEMU's savevm needs a writable qcow2) for images without a disk;
     * the guest sees an empty disk and never mounts it. */
    if (cfg->scratch)
        xml_qcow2_disk(f, cfg->scratch, NULL, NULL, "vdb");
    for (size_t i = 0; i < cfg->nvols; i++) {
        fprintf(f,
                "    <disk type='file' device='disk'>\n"
                "      <driver name='qemu' type='%s' %s/>\n"
                "      <source file='",
                cfg->vols[i].backing ? "qcow2" : "raw",
                cfg->vols[i].direct ? "cache='none' io='native'" : "cache='writeback'");
        xml_text(f, cfg->vols[i].disk);
        fputs("'/>\n", f);
        if (cfg->vols[i].mid) {
            fputs("      <backingStore type='file'><format type='qcow2'/><source file='", f);
            xml_text(f, cfg->vols[i].mid);
            fputs("'/>\n", f);
        }
        if (cfg->vols[i].backing) {
            fputs("      <backingStore type='file'><format type='raw'/><source file='", f);
            xml_text(f, cfg->vols[i].backing);
            fputs("'/><backingStore/></backingStore>\n", f);
        }
        if (cfg->vols[i].mid)
            fputs("      </backingStore>\n", f);
        fprintf(f,
                "      <target dev='vd%c' bus='virtio'/>\n      <serial>airlock-vol-%zu</serial>\n",
                (char)('e' + i), i);
        /* read-only over an overlay of its own: the overlay takes the guest's journal replay,
         * QEMU opens the volume under it read-only */
        if (cfg->vols[i].read_only && !cfg->vols[i].backing)
            fputs("      <readonly/>\n", f);
        fputs("    </disk>\n", f);
    }
    if (cfg->seed) {
        fputs("    <disk type='file' device='disk'>\n"
              "      <driver name='qemu' type='raw'/>\n      <source file='",
              f);
        xml_text(f, cfg->seed);
        fputs("'/>\n      <target dev='vdc' bus='virtio'/>\n      <readonly/>\n    </disk>\n", f);
    }
    /* Seen and driven by the host alone: QEMU's VGA (the guest's text console, or a mode its
     * driver sets) read by screendump, and input devices QEMU feeds from input-send-event: a
     * tablet for absolute coordinates, a keyboard (the kernel command line keeps the guest off
     * the i8042 one). */
    if (cfg->display) {
        fputs("    <video><model type='vga' vram='16384' heads='1'", f);
        if (cfg->display_w && cfg->display_h)
            fprintf(f, "><resolution x='%u' y='%u'/></model></video>\n", cfg->display_w,
                    cfg->display_h);
        else
            fputs("/></video>\n", f);
        fputs("    <input type='tablet' bus='virtio'/>\n"
              "    <input type='keyboard' bus='virtio'/>\n",
              f);
    }
    if (cfg->agent_sock)
        xml_unix_channel(f, cfg->agent_sock, "org.airlock.agent.0");
    if (cfg->raw_sock)
        xml_unix_channel(f, cfg->raw_sock, cfg->raw_port_name);
    fputs("  </devices>\n", f);
    /* libvirt 9.0 has no port forwards for user-mode networking with slirp (only with passt),
     * so the NIC is passed to QEMU as is. restrict=on: the guest reaches neither the host's
     * services nor the outside; only the forwards below, bound to 127.0.0.1, come in (SSH's,
     * and the tunnels to the session's proxy, net.c). The arguments come before libvirt's own
     * devices, so the NIC takes a slot libvirt leaves free (its root ports start at slot 1). */
    if (qemu_args)
        fputs("  <qemu:commandline>\n", f);
    if (cfg->host_port || cfg->net_port) {
        fputs("    <qemu:arg value='-netdev'/>\n"
              "    <qemu:arg value='user,id=alnet0,restrict=on",
              f);
        if (cfg->host_port)
            fprintf(f, ",hostfwd=tcp:127.0.0.1:%u-:%u", cfg->host_port, cfg->guest_port);
        if (cfg->net_port)
            fprintf(f, ",hostfwd=tcp:127.0.0.1:%u-:%u", cfg->net_port, cfg->net_guest_port);
        fputs("'/>\n"
              "    <qemu:arg value='-device'/>\n"
              "    <qemu:arg value='virtio-net-pci,netdev=alnet0,bus=pcie.0,addr=0x10'/>\n",
              f);
    }
    /* Guest RAM is QEMU's own backend, named by a second -machine option that overrides the
     * backend libvirt made (which then stays unused: no memory is touched). Its id names the
     * RAM block in migration streams, so every session's is the same: a template's, a fork's
     * (fork.c) and a session's they are saved from. Warm starts (template.c) and forks map a
     * chosen file, which libvirt 9.0 cannot do; other sessions get anonymous memory. */
    if (cfg->ram_file) {
        fputs("    <qemu:arg value='-object'/>\n"
              "    <qemu:arg value='memory-backend-file,id=airlock.ram,mem-path=",
              f);
        xml_text(f, cfg->ram_file);
        fprintf(f, ",share=%s,size=%uM%s'/>\n", cfg->ram_shared ? "on" : "off", cfg->memory_mib,
                cfg->ram_prealloc ? ",prealloc=on" : "");
    } else {
        fprintf(f,
                "    <qemu:arg value='-object'/>\n"
                "    <qemu:arg value='memory-backend-ram,id=airlock.ram,size=%uM'/>\n",
                cfg->memory_mib);
    }
    fputs("    <qemu:arg value='-machine'/>\n"
          "    <qemu:arg value='memory-backend=airlock.ram'/>\n",
          f);
    if (cfg->incoming)
        fputs("    <qemu:arg value='-incoming'/>\n    <qemu:arg value='defer'/>\n", f);
    if (qemu_args)
        fputs("  </qemu:commandline>\n", f);
    fputs("</domain>\n", f);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

int al_vm_start(virConnectPtr conn, const struct al_vm_config *cfg, virDomainPtr *out,
                al_error *err)
{
    _cleanup_free_ char *xml = al_vm_xml(cfg);
    if (!xml)
        return al_err(err, -ENOMEM, "cannot build the domain description");
    /* AUTODESTROY: if this process dies, even by SIGKILL, libvirtd destroys the domain when
     * our connection drops; a kept session's is left for its keeper (keep.c), or gc. */
    virDomainPtr d = virDomainCreateXML(conn, xml, cfg->keep ? 0 : VIR_DOMAIN_START_AUTODESTROY);
    if (!d)
        return al_err_virt(err, -EIO, "cannot start VM for image '%s'", cfg->image->name);
    *out = d;
    return 0;
}

int al_vm_qmp(virDomainPtr dom, const char *what, const char *cmd, int fd, char **reply_out,
              al_error *err)
{
    char *reply = NULL;
    int rc;
    if (fd >= 0) {
        int fds[1] = {fd};
        rc = virDomainQemuMonitorCommandWithFiles(dom, cmd, 1, fds, NULL, NULL, &reply, 0);
    } else {
        rc = virDomainQemuMonitorCommand(dom, cmd, &reply, 0);
    }
    if (rc < 0)
        return al_err_virt(err, -EIO, "cannot %s", what);
    _cleanup_cjson_ cJSON *j = cJSON_Parse(reply ? reply : "");
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    if (!j || e) {
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(e, "desc");
        char desc[200];
        snprintf(desc, sizeof(desc), "%s",
                 cJSON_IsString(d) ? d->valuestring
                 : e               ? "no reason given"
                                   : "no reply");
        al_printable(desc);
        free(reply);
        return al_err(err, -EIO, "cannot %s: QEMU says: %s", what, desc);
    }
    if (reply_out)
        *reply_out = reply;
    else
        free(reply);
    return 0;
}

int al_vm_ignore_shared(virDomainPtr dom, bool on, const char *what, al_error *err)
{
    char cmd[200];
    snprintf(cmd, sizeof(cmd),
             "{\"execute\":\"migrate-set-capabilities\",\"arguments\":{\"capabilities\":"
             "[{\"capability\":\"x-ignore-shared\",\"state\":%s}]}}",
             on ? "true" : "false");
    return al_vm_qmp(dom, what, cmd, -1, NULL, err);
}

int al_vm_getfd(virDomainPtr dom, const char *name, int fd, al_error *err)
{
    char cmd[200];
    snprintf(cmd, sizeof(cmd), "{\"execute\":\"getfd\",\"arguments\":{\"fdname\":\"%s\"}}", name);
    return al_vm_qmp(dom, "pass a file to QEMU", cmd, fd, NULL, err);
}

static const char *jstr_or_empty(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

int al_vm_migrate_wait(virDomainPtr dom, const char *what, unsigned timeout_ms, al_error *err)
{
    uint64_t end = al_now_ms() + timeout_ms;
    for (;;) {
        char *reply = NULL;
        int r = al_vm_qmp(dom, what, "{\"execute\":\"query-migrate\"}", -1, &reply, err);
        if (r < 0)
            return r;
        _cleanup_free_ char *owned = reply;
        _cleanup_cjson_ cJSON *j = cJSON_Parse(reply);
        const cJSON *ret = cJSON_GetObjectItemCaseSensitive(j, "return");
        const char *status = jstr_or_empty(ret, "status");
        if (!strcmp(status, "completed"))
            return 0;
        if (!strcmp(status, "failed") || !strcmp(status, "cancelled")) {
            char desc[200];
            snprintf(desc, sizeof(desc), "%s", jstr_or_empty(ret, "error-desc"));
            al_printable(desc);
            return al_err(err, -EIO, "cannot %s: migration %s%s%s", what, status,
                          desc[0] ? ": " : "", desc);
        }
        if (al_now_ms() >= end)
            return al_err(err, -ETIMEDOUT, "cannot %s: migration still '%s' after %u s", what,
                          status, timeout_ms / 1000);
        usleep(5000);
    }
}

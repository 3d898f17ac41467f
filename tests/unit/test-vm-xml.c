/* Golden domain XML (as libvirt's qemuxml2argvtest): al_vm_xml for each kind of
 * session against a checked-in file in tests/unit/vm-xml/, so that a change to what Airlock
 * asks of libvirt is a visible diff in review. AIRLOCK_REGEN=DIR writes the files there
 * instead (then review the diff). No libvirt, no VM: al_vm_xml reads its config, and only the
 * owner's pid and the host's machine id besides (set to P and M here). */
#include "tap.h"
#include "vm.h"

#include <stdlib.h>
#include <string.h>

static char kernel[] = "/images/debian/vmlinux", initrd[] = "/images/debian/initrd.img",
            disk[] = "/images/debian/rootfs.qcow2", dir[] = "/images/debian", none[] = "";

static al_image image(bool ssh)
{
    al_image img = {.struct_size = sizeof(al_image),
                    .dir = dir,
                    .kernel = ssh ? none : kernel,
                    .initrd = ssh ? none : initrd,
                    .disk = disk,
                    .agent_protocol = 5,
                    .memory_mib = 512};
    snprintf(img.name, sizeof(img.name), "%s", ssh ? "deb" : "debian");
    snprintf(img.cmdline, sizeof(img.cmdline), "console=ttyS0 quiet airlock.root=/dev/vda");
    img.transport = ssh ? AL_TRANSPORT_SSH : AL_TRANSPORT_VIRTIO;
    return img;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t cap = 0, len = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 8192;
            char *g = realloc(buf, cap);
            if (!g)
                break;
            buf = g;
        }
        size_t n = fread(buf + len, 1, cap - len - 1, f);
        len += n;
        if (n == 0)
            break;
    }
    fclose(f);
    if (buf)
        buf[len] = 0;
    return buf;
}

/* What al_vm_xml takes from the process and the host rather than its config (the owner's pid,
 * /etc/machine-id) as fixed placeholders, in place. */
static void normalise(char *xml)
{
    char *p = xml ? strstr(xml, " pid='") : NULL;
    if (p) {
        char *q = strchr(p + 6, '\'');
        if (q) {
            memmove(p + 6, q, strlen(q) + 1);
            memmove(p + 7, p + 6, strlen(p + 6) + 1);
            p[6] = 'P';
        }
    }
    const char *tag = "<airlock:machine>";
    p = xml ? strstr(xml, tag) : NULL;
    if (p) {
        p += strlen(tag);
        char *q = strchr(p, '<');
        if (q) {
            memmove(p + 1, q, strlen(q) + 1);
            p[0] = 'M';
        }
    }
}

static void golden(const char *srcdir, const char *name, const struct al_vm_config *cfg)
{
    char *xml = al_vm_xml(cfg);
    normalise(xml);
    char path[4096];
    const char *regen = getenv("AIRLOCK_REGEN");
    snprintf(path, sizeof(path), "%s/%s.xml", regen && *regen ? regen : srcdir, name);
    if (regen && *regen) {
        FILE *f = fopen(path, "w");
        ok(f && xml && fputs(xml, f) >= 0 && fclose(f) == 0, "%s: written to %s", name, path);
        free(xml);
        return;
    }
    char *want = slurp(path);
    bool same = xml && want && !strcmp(xml, want);
    ok(same, "%s: the domain XML is %s", name, path);
    if (!same && xml)
        printf("# got:\n%s", xml);
    free(want);
    free(xml);
}

int main(int argc, char **argv)
{
    const char *srcdir = argc > 1 ? argv[1] : "tests/unit/vm-xml";
    al_image virtio = image(false), ssh = image(true);
    struct al_vm_config cold = {
        .name = "airlock-0123456789ab",
        .session_dir = "/run/airlock/sessions/airlock-0123456789ab",
        .image = &virtio,
        .memory_mib = 512,
        .vcpus = 1,
        .agent_sock = "/run/airlock/sessions/airlock-0123456789ab/agent.sock",
        .console_path = "/run/airlock/sessions/airlock-0123456789ab/console.log",
        .disk = "/run/airlock/sessions/airlock-0123456789ab/root.qcow2",
    };
    golden(srcdir, "cold-tcg", &cold);

    struct al_vm_config kvm = cold;
    kvm.kvm = true;
    kvm.vcpus = 2;
    kvm.memory_mib = 2048;
    golden(srcdir, "cold-kvm", &kvm);

    struct al_vm_config initramfs = cold; /* the tiny image: no disk */
    initramfs.disk = NULL;
    golden(srcdir, "initramfs-only", &initramfs);

    struct al_vm_config checkpoints = cold;
    checkpoints.scratch = "/run/airlock/sessions/airlock-0123456789ab/scratch.qcow2";
    checkpoints.raw_sock = "/run/airlock/sessions/airlock-0123456789ab/raw.sock";
    checkpoints.raw_port_name = "org.airlock.raw.0";
    golden(srcdir, "checkpoints-and-raw-port", &checkpoints);

    struct al_vm_config restored = cold; /* a warm start from a template */
    static const char *const tmpl_mids[] = {"/var/lib/airlock/state/templates/debian-t/disk.qcow2",
                                            NULL};
    restored.disk_mids = tmpl_mids;
    restored.ram_file = "/var/lib/airlock/state/templates/debian-t/ram";
    restored.incoming = true;
    golden(srcdir, "restored-from-template", &restored);

    struct al_vm_config building = restored; /* the template being built: RAM shared */
    building.incoming = false;
    building.disk_mids = NULL;
    building.ram_shared = true;
    golden(srcdir, "template-build", &building);

    struct al_vm_config forked = restored; /* a fork of a session restored from a template */
    static const char *const fork_mids[] = {"/var/lib/airlock/state/forks/0123/disk.qcow2",
                                            "/var/lib/airlock/state/forks/0123/mid1.qcow2", NULL};
    forked.disk_mids = fork_mids;
    forked.ram_file = "/var/lib/airlock/state/forks/0123/ram";
    golden(srcdir, "fork-of-restored", &forked);

    struct al_vm_config remote_ssh = cold;
    remote_ssh.image = &ssh;
    remote_ssh.host_port = 40022;
    remote_ssh.guest_port = 22;
    remote_ssh.seed = "/run/airlock/sessions/airlock-0123456789ab/seed.iso";
    golden(srcdir, "ssh-transport", &remote_ssh);

    struct al_vm_config net = cold;
    net.net_port = 40123;
    net.net_guest_port = 3128;
    golden(srcdir, "network-on-request", &net);

    struct al_vm_config display = cold; /* computer use: VGA, a virtio tablet and keyboard */
    display.display = true;
    golden(srcdir, "display", &display);

    struct al_vm_config sized = display; /* --display=1024x768: the VGA's EDID mode */
    sized.display_w = 1024;
    sized.display_h = 768;
    golden(srcdir, "display-sized", &sized);

    return tap_done();
}

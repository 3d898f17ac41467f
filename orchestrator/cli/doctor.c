/* airlock doctor: check what a session needs, and say how to fix what is missing. */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct doctor {
    int errors;
    int images;
    bool tiny;
    char warm[1024]; /* " IMAGE" for each image with a usable template, python warm */
};

static void note_template(void *ctx, const al_template_info *t)
{
    struct doctor *d = ctx;
    size_t n = strlen(d->warm);
    if (!t->why && t->python && n + strlen(t->image) + 3 < sizeof(d->warm))
        snprintf(d->warm + n, sizeof(d->warm) - n, " %s ", t->image);
}

/* An image with a python kernel: whether its first python run restores a warm one. */
static void check_warm(const struct doctor *d, const al_image *img)
{
    if (!strstr(img->languages, "python"))
        return;
    char word[80];
    snprintf(word, sizeof(word), " %s ", img->name);
    if (strstr(d->warm, word))
        printf("ok    image %s has a warm template (its python starts in about a second)\n",
               img->name);
    else
        printf("warn  image %s has no warm template: each session's first python run waits "
               "for a cold kernel (15-20 s under emulation)\n      fix: airlock image warm %s\n",
               img->name, img->name);
}

static bool in_path(const char *prog)
{
    const char *path = getenv("PATH");
    char full[AL_PATH_MAX];
    for (const char *p = path ? path : "/usr/bin:/bin"; *p;) {
        int n = (int)strcspn(p, ":");
        if (al_pathf(full, sizeof(full), "%.*s/%s", n ? n : 1, n ? p : ".", prog) == 0 &&
            access(full, X_OK) == 0)
            return true;
        p += n + (p[n] == ':');
    }
    return false;
}

static void check_image(void *ctx, const al_image *img, const char *name, const char *why)
{
    struct doctor *d = ctx;
    if (!img) {
        printf("FAIL  image %s: %s\n      fix: rebuild it (./install.sh rebuilds tiny)\n", name,
               why);
        d->errors++;
        return;
    }
    d->images++;
    d->tiny |= !strcmp(img->name, "tiny");
    if (img->transport != AL_TRANSPORT_SSH) {
        printf("ok    image %s (protocol %u; %s)\n", img->name, img->agent_protocol,
               img->languages);
        check_warm(d, img);
        return;
    }
    /* An SSH session makes its keys and its cloud-init seed with these. */
    static const char *const tools[] = {"ssh-keygen", "genisoimage"};
    for (size_t i = 0; i < 2; i++) {
        if (in_path(tools[i]))
            continue;
        printf("FAIL  image %s needs %s for its SSH sessions\n      fix: apt-get install %s\n",
               img->name, tools[i], i ? "genisoimage" : "openssh-client");
        d->errors++;
        return;
    }
    printf("ok    image %s (SSH as %s; the agent is copied in)\n", img->name, img->ssh_user);
}

/* KVM in one line: missing, present but unable to run a guest (with the evidence), or working.
 * Only a guest that ran proves it: when no session has tried KVM on this boot yet, one is booted
 * here (it falls back to emulation and records why if KVM cannot run it). */
static void doctor_kvm(struct cli_globals *g, struct doctor *d)
{
    (void)d;
    if (al_kvm_state() == AL_KVM_UNPROVEN) {
        al_session_opts so = {.struct_size = sizeof(al_session_opts),
                              .image = "tiny",
                              .connect_uri = g->connect_uri,
                              .quiet = true};
        al_session *s = NULL;
        al_error err = {0};
        if (al_session_open(&so, &s, &err) == 0)
            al_session_close(s);
    }
    char ev[512] = "";
    switch (al_kvm_state()) {
    case AL_KVM_OK:
        printf("ok    KVM works: a guest ran with hardware virtualization on this boot\n");
        break;
    case AL_KVM_ABSENT:
        printf("warn  no usable /dev/kvm: guests run in software emulation (much slower)\n"
               "      fix: enable virtualization in the firmware, 'modprobe kvm_intel' or\n"
               "           'modprobe kvm_amd', and be in the 'kvm' group\n");
        break;
    case AL_KVM_FAILED:
        al_kvm_evidence(ev, sizeof(ev));
        printf("warn  /dev/kvm is present but cannot run a guest (%s);\n"
               "      guests run in software emulation (much slower)\n"
               "      fix: enable nested virtualization on the outer host, then reboot\n",
               ev[0] ? ev : "no detail recorded");
        break;
    case AL_KVM_OFF:
        printf("warn  AIRLOCK_ACCEL=tcg: guests run in software emulation\n");
        break;
    case AL_KVM_UNPROVEN:
        printf("warn  /dev/kvm is present but no guest could be booted to prove it works\n");
        break;
    }
}

int cmd_doctor(struct cli_globals *g, int argc, char **argv)
{
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        puts("Usage: airlock doctor\n\nCheck libvirt, KVM and the image store; for each "
             "problem say how to fix it.\nExits non-zero when a session could not start.");
        return 0;
    }
    struct doctor d = {0};
    al_error err = {0};
    char uri[1024];
    if (al_libvirt_uri(g->connect_uri, uri, sizeof(uri), &err) == 0) {
        al_error e2 = {0};
        if (al_gc(uri, &e2) >= 0) {
            printf("ok    libvirt reachable at %s\n", uri);
        } else {
            printf("FAIL  %s\n      fix: start the daemons (virtlogd -d; libvirtd -d) or\n"
                   "           'systemctl start libvirtd'; or pass --connect URI\n",
                   e2.msg);
            d.errors++;
        }
    }
    doctor_kvm(g, &d);
    char store[AL_PATH_MAX];
    if (al_image_store_dir(store, sizeof(store), &err) < 0) {
        printf("FAIL  %s\n", err.msg);
        d.errors++;
    } else {
        printf("ok    image store %s\n", store);
        al_error terr = {0};
        al_template_list(note_template, &d, &terr);
        al_image_list(check_image, &d, &err);
        if (!d.tiny) {
            printf("FAIL  image tiny missing\n      fix: ./install.sh (or images/build-tiny.sh "
                   "AGENT %s/tiny)\n",
                   store);
            d.errors++;
        }
    }
    printf(d.errors ? "%d problem(s) found\n" : "all checks passed\n", d.errors);
    return d.errors ? 1 : 0;
}

/* A session's root disk: a copy-on-write qcow2 overlay, in the session's runtime dir, on the
 * image's base. The base is shared by every session and never written; the overlay takes the
 * session's writes and goes away with the session dir. */
#include "vm.h"

#include <fcntl.h>
#include <libxml/parser.h>
#include <libxml/xpath.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

/* qemu-img's complaint, quoted in the error: one line is enough. */

AL_DEFINE_CLEANUP(xml_docp, xmlDocPtr, xmlFreeDoc)
AL_DEFINE_CLEANUP(xml_ctxp, xmlXPathContextPtr, xmlXPathFreeContext)
AL_DEFINE_CLEANUP(xml_objp, xmlXPathObjectPtr, xmlXPathFreeObject)

/* The uid:gid QEMU runs as: libvirt's DAC base label for this domain type, from the host
 * capabilities ("+64055:+64055" for libvirt-qemu under qemu:///system, the caller's own ids
 * under qemu:///session). */
int al_qemu_owner(virConnectPtr conn, bool kvm, uid_t *uid, gid_t *gid, al_error *err)
{
    _cleanup_free_ char *caps = virConnectGetCapabilities(conn);
    if (!caps)
        return al_err_virt(err, -EIO, "cannot read libvirt's capabilities");
    __attribute__((cleanup(xml_docp))) xmlDocPtr doc =
        xmlReadMemory(caps, (int)strlen(caps), "capabilities.xml", NULL, XML_PARSE_NONET);
    __attribute__((cleanup(xml_ctxp))) xmlXPathContextPtr ctx =
        doc ? xmlXPathNewContext(doc) : NULL;
    __attribute__((cleanup(xml_objp))) xmlXPathObjectPtr label =
        ctx ? xmlXPathEvalExpression(
                  (const xmlChar *)(kvm ? "string(/capabilities/host/secmodel[model='dac']"
                                          "/baselabel[@type='kvm'])"
                                        : "string(/capabilities/host/secmodel[model='dac']"
                                          "/baselabel[@type='qemu'])"),
                  ctx)
            : NULL;
    unsigned long u, g;
    char end;
    if (!label || label->type != XPATH_STRING || !label->stringval ||
        sscanf((const char *)label->stringval, "+%lu:+%lu%c", &u, &g, &end) != 2) {
        /* No DAC driver (or no label): QEMU runs as whoever runs libvirt, as we do. */
        *uid = geteuid();
        *gid = getegid();
        return 0;
    }
    *uid = (uid_t)u;
    *gid = (gid_t)g;
    return 0;
}

/* Readable and writable by QEMU only; the runtime dir is ours, so we can still remove it. */
static int give(const char *path, uid_t uid, gid_t gid, al_error *err)
{
    if ((uid != geteuid() || gid != getegid()) && chown(path, uid, gid) < 0)
        return al_err(err, -errno, "cannot give '%s' to QEMU's user %lu: %s", path,
                      (unsigned long)uid, strerror(errno));
    if (chmod(path, 0600) < 0)
        return al_err(err, -errno, "cannot chmod '%s': %s", path, strerror(errno));
    return 0;
}

/* Runs qemu-img with argv, which creates path, and hands path to QEMU's user. */
static int qemu_img_create(virConnectPtr conn, bool kvm, const char *const *argv,
                           const char *overlay, al_error *err)
{
    uid_t uid = geteuid();
    gid_t gid = getegid();
    int r = al_qemu_owner(conn, kvm, &uid, &gid, err);
    if (r < 0)
        return r;
    r = al_spawn_quiet(argv, "create the session disk", err);
    if (r < 0)
        return r;
    return give(overlay, uid, gid, err);
}

int al_disk_give(virConnectPtr conn, bool kvm, const char *path, al_error *err)
{
    uid_t uid = geteuid();
    gid_t gid = getegid();
    int r = al_qemu_owner(conn, kvm, &uid, &gid, err);
    return r < 0 ? r : give(path, uid, gid, err);
}

int al_disk_overlay(virConnectPtr conn, bool kvm, const char *base, const char *overlay,
                    al_error *err)
{
    /* -F: the base's format is recorded in the overlay, so neither QEMU nor libvirt has to
     * guess it from the file's content. */
    const char *argv[] = {"qemu-img", "create", "-q", "-f",    "qcow2", "-F",
                          "qcow2",    "-b",     base, overlay, NULL};
    return qemu_img_create(conn, kvm, argv, overlay, err);
}

int al_disk_overlay_sized(virConnectPtr conn, bool kvm, const char *base, const char *base_fmt,
                          uint64_t size, const char *overlay, al_error *err)
{
    char bytes[32];
    snprintf(bytes, sizeof(bytes), "%llu", (unsigned long long)size);
    const char *argv[] = {"qemu-img", "create", "-q", "-u",    "-f",  "qcow2", "-F",
                          base_fmt,   "-b",     base, overlay, bytes, NULL};
    return qemu_img_create(conn, kvm, argv, overlay, err);
}

int al_disk_flatten(const char *src, const char *out, const char *out_fmt, const char *backing,
                    const char *backing_fmt, al_error *err)
{
    /* without backing: "... -O FMT SRC OUT" (the array ends at its first NULL) */
    const char *argv[] = {"qemu-img",
                          "convert",
                          "-q",
                          "-U",
                          "-O",
                          out_fmt,
                          backing ? "-B" : src,
                          backing ? backing : out,
                          backing ? "-F" : NULL,
                          backing_fmt,
                          src,
                          out,
                          NULL};
    return al_spawn_quiet(argv, "copy a disk for the fork", err);
}

int al_disk_rebase(const char *path, const char *backing, al_error *err)
{
    const char *argv[] = {"qemu-img", "rebase", "-q", "-u",    "-f", "qcow2",
                          "-F",       "qcow2",  "-b", backing, path, NULL};
    return al_spawn_quiet(argv, "point the fork's disk at its layers", err);
}

int al_disk_scratch(virConnectPtr conn, bool kvm, const char *path, uint64_t size, al_error *err)
{
    char bytes[32];
    snprintf(bytes, sizeof(bytes), "%llu", (unsigned long long)size);
    const char *argv[] = {"qemu-img", "create", "-q", "-f", "qcow2", path, bytes, NULL};
    return qemu_img_create(conn, kvm, argv, path, err);
}

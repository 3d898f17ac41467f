/* Importing a stock cloud image (Debian's genericcloud, Ubuntu's cloudimg) into the store as an
 * SSH image: its disk boots through the firmware and cloud-init configures it from the seed each
 * session makes.
 *
 * The file is hostile input. A qcow2 names other files in its header (a backing file, an
 * external data file) that qemu-img convert would read into the image: a backing file of
 * /etc/shadow puts the host's hashes in the guest's disk. Such files are refused. The file's
 * bytes are first copied into a private scratch directory of the store and everything after
 * reads that copy, so the bytes qemu-img checks are the bytes it converts, whoever can write the
 * original meanwhile. The format is decided here from the first bytes and given to qemu-img with
 * -f, never probed by it (it would take a VMDK descriptor for one and open the extent files it
 * names). */
#include "vm.h"

#include <fcntl.h>
#include <libgen.h>
#include <linux/fs.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>

/* Stock cloud disks are 2 to 10 GiB; far bigger is a mistake (or a disk meant to fill the
 * host), and the copy takes that much room in the store. Bounds the file and its virtual size. */
#define IMPORT_SIZE_MAX (256ull << 30)
/* qemu-img info's JSON is about a kilobyte; a qcow2 with thousands of snapshots lists each. */
#define INFO_MAX (1024 * 1024)
/* qemu-img's complaint, quoted in the error: one line is enough. */
#define HELPER_ERR_MAX 300
/* What an image gets when the caller names nothing: Debian's cloud user, and memory enough
 * for a stock distribution running cloud-init. */
#define IMPORT_USER_DEFAULT "debian"
#define IMPORT_MEMORY_DEFAULT 1024
#define QCOW2_MAGIC "QFI\xfb"
/* The copy's buffer where copy_file_range cannot be used. */
#define COPY_BUF (1 << 20)
/* qemu-img reads the file with the parsers of a whole block layer, so it runs under limits, as
 * QEMU's documentation advises for untrusted images: a crafted file may cost this much CPU and
 * address space, no more. info reads headers and metadata only (the documented example: 30 s,
 * 1 GiB); convert also copies up to IMPORT_SIZE_MAX of data, mostly system time (a 0.8 GiB
 * qcow2 takes 3 s here, in 25 MiB of memory), so it gets more time. */
static const struct al_spawn_limits INFO_LIMITS = {.cpu_s = 30, .as_bytes = 1ul << 30};
static const struct al_spawn_limits CONVERT_LIMITS = {.cpu_s = 600, .as_bytes = 2ul << 30};

/* Removes the scratch directory however the import ends (after a swap it holds the old image). */
AL_DEFINE_CLEANUP(rmtreep, char *, al_rmtree)

/* Copies len bytes at off, by copy_file_range where the kernel can, else through *buf (1 MiB,
 * allocated on first use). */
static int copy_range(int in, int out, off_t off, off_t len, char **buf)
{
    while (len > 0) {
        ssize_t n;
        if (!*buf) {
            off_t ioff = off, ooff = off;
            n = copy_file_range(in, &ioff, out, &ooff, (size_t)len, 0);
            if (n < 0 &&
                (errno == EXDEV || errno == ENOSYS || errno == EOPNOTSUPP || errno == EINVAL)) {
                if (!(*buf = malloc(COPY_BUF)))
                    return -ENOMEM;
                continue;
            }
        } else {
            n = pread(in, *buf, len < COPY_BUF ? (size_t)len : COPY_BUF, off);
            for (ssize_t done = 0; n > 0 && done < n;) {
                ssize_t w = pwrite(out, *buf + done, (size_t)(n - done), off + done);
                if (w < 0 && errno != EINTR)
                    return -errno;
                if (w == 0)
                    return -ENOSPC;
                done += w > 0 ? w : 0;
            }
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0) /* the file shrank meanwhile: the copy is what it was, holes after */
            return 0;
        off += n;
        len -= n;
    }
    return 0;
}

int al_copy_sparse(int in, off_t size, const char *path)
{
    _cleanup_close_ int out = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (out < 0)
        return -errno;
    if (ioctl(out, FICLONE, in) == 0)
        return 0;
    _cleanup_free_ char *buf = NULL;
    for (off_t pos = 0; pos < size;) {
        off_t data = lseek(in, pos, SEEK_DATA);
        if (data < 0 && errno == ENXIO) /* only a hole from here on */
            break;
        if (data < 0)
            return -errno;
        off_t hole = lseek(in, data, SEEK_HOLE);
        if (hole < 0)
            return -errno;
        if (hole > size)
            hole = size;
        int r = copy_range(in, out, data, hole - data, &buf);
        if (r < 0)
            return r;
        pos = hole;
    }
    if (ftruncate(out, size) < 0)
        return -errno;
    return 0;
}

/* The first line of what qemu-img said, less its "qemu-img: Could not open 'PATH': " lead
 * (PATH is our scratch copy, which means nothing to the user). */
static void helper_why(int fd, char *why, size_t len)
{
    char line[HELPER_ERR_MAX];
    ssize_t n = pread(fd, line, sizeof(line) - 1, 0);
    line[n > 0 ? n : 0] = '\0';
    line[strcspn(line, "\n")] = '\0';
    const char *p = line;
    if (!strncmp(p, "qemu-img: ", 10))
        p += 10;
    const char *q = strstr(p, "': ");
    if (!strncmp(p, "Could not open '", 16) && q)
        p = q + 3;
    snprintf(why, len, "%s", *p ? p : "failed");
}

/* Runs qemu-img with argv; stdout into out_path when set. On failure the message says what
 * with the file failed, quoting qemu-img. */
static int qemu_img(const char *const *argv, const struct al_spawn_limits *lim,
                    const char *out_path, const char *err_path, const char *what, const char *file,
                    al_error *err)
{
    _cleanup_close_ int out =
        open(out_path ? out_path : "/dev/null",
             out_path ? O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC : O_WRONLY | O_CLOEXEC, 0600);
    _cleanup_close_ int errfd =
        out < 0 ? -1 : open(err_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (errfd < 0)
        return al_err(err, -errno, "cannot import '%s': %s", file, strerror(errno));
    int st = 0;
    int r = al_spawn_wait_limited(argv, out, errfd, lim, &st);
    if (r < 0)
        return al_err(err, r, "cannot run qemu-img: %s", strerror(-r));
    if (WIFSIGNALED(st) && (WTERMSIG(st) == SIGXCPU || WTERMSIG(st) == SIGKILL))
        return al_err(err, -EINVAL, "qemu-img cannot %s '%s': over its CPU time limit of %lu s",
                      what, file, lim->cpu_s);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        char why[HELPER_ERR_MAX];
        helper_why(errfd, why, sizeof(why));
        return al_err(err, -EINVAL, "qemu-img cannot %s '%s': %s", what, file, why);
    }
    return 0;
}

/* Reads qemu-img info's JSON for the copy at src (format fmt, decided by us) and refuses what
 * must not be imported. */
static int check_info(const char *scratch, const char *src, const char *fmt, const char *file,
                      al_error *err)
{
    char out_path[AL_PATH_MAX], err_path[AL_PATH_MAX];
    if (al_pathf(out_path, sizeof(out_path), "%s/info.json", scratch) < 0 ||
        al_pathf(err_path, sizeof(err_path), "%s/qemu-img.err", scratch) < 0)
        return al_err(err, -ENAMETOOLONG, "image path too long");
    /* -f: no probing; info reads the header only and opens neither backing nor data file. */
    const char *argv[] = {"qemu-img", "info", "--output=json", "-f", fmt, src, NULL};
    int r = qemu_img(argv, &INFO_LIMITS, out_path, err_path, "read", file, err);
    if (r < 0)
        return r;
    _cleanup_close_ int fd = open(out_path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0)
        return al_err(err, -errno, "cannot read qemu-img's answer: %s", strerror(errno));
    if (st.st_size > INFO_MAX)
        return al_err(err, -EFBIG, "'%s': qemu-img describes it in over %d KiB (snapshots?)", file,
                      INFO_MAX / 1024);
    _cleanup_free_ char *text = malloc((size_t)st.st_size + 1);
    if (!text)
        return al_err(err, -ENOMEM, "out of memory");
    ssize_t n = pread(fd, text, (size_t)st.st_size, 0);
    if (n != st.st_size)
        return al_err(err, -EIO, "cannot read qemu-img's answer");
    text[n] = '\0';
    _cleanup_cjson_ cJSON *j = cJSON_Parse(text);
    if (!cJSON_IsObject(j))
        return al_err(err, -EINVAL, "cannot parse qemu-img's description of '%s'", file);

    const cJSON *format = cJSON_GetObjectItemCaseSensitive(j, "format");
    if (!cJSON_IsString(format) || strcmp(format->valuestring, fmt))
        return al_err(err, -EINVAL, "'%s': qemu-img does not read it as %s", file, fmt);
    char esc[256];
    const char *backing_keys[] = {"backing-filename", "full-backing-filename",
                                  "backing-filename-format"};
    for (size_t i = 0; i < sizeof(backing_keys) / sizeof(backing_keys[0]); i++) {
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(j, backing_keys[i]);
        if (b)
            return al_err(
                err, -EPERM,
                "'%s' has a backing file ('%s'): refused, the guest would read that "
                "host file; import a standalone image (qemu-img convert -O qcow2)",
                file, al_path_escape(cJSON_IsString(b) ? b->valuestring : "?", esc, sizeof(esc)));
    }
    const cJSON *spec = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(j, "format-specific"), "data");
    const cJSON *df = cJSON_GetObjectItemCaseSensitive(spec, "data-file");
    if (df || cJSON_GetObjectItemCaseSensitive(spec, "data-file-raw"))
        return al_err(err, -EPERM,
                      "'%s' keeps its data in an external file ('%s'): refused, the guest would "
                      "read that host file",
                      file,
                      al_path_escape(cJSON_IsString(df) ? df->valuestring : "?", esc, sizeof(esc)));
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "encrypted")))
        return al_err(err, -EINVAL, "'%s' is encrypted: a session could not boot it", file);
    const cJSON *vsize = cJSON_GetObjectItemCaseSensitive(j, "virtual-size");
    if (!cJSON_IsNumber(vsize) || !(vsize->valuedouble > 0))
        return al_err(err, -EINVAL, "'%s': qemu-img gives it no size", file);
    if (vsize->valuedouble > (double)IMPORT_SIZE_MAX)
        return al_err(err, -EFBIG,
                      "'%s': its disk is %.0f bytes, over the import limit of %llu GiB", file,
                      vsize->valuedouble, IMPORT_SIZE_MAX >> 30);
    unlink(out_path);
    unlink(err_path);
    return 0;
}

/* "qcow2" by its magic; "raw" for a disk the firmware could boot, which starts with a boot
 * sector (an MBR, or GPT's protective one): without that, the file is most likely not a disk at
 * all (a saved error page, a compressed download), which raw would accept as anything. */
static int detect_format(int fd, const char *file, const char **fmt, al_error *err)
{
    unsigned char sector[512];
    ssize_t n = pread(fd, sector, sizeof(sector), 0);
    if (n < 0)
        return al_err(err, -errno, "cannot read '%s': %s", file, strerror(errno));
    if (n >= 4 && !memcmp(sector, QCOW2_MAGIC, 4)) {
        *fmt = "qcow2";
        return 0;
    }
    if (n == (ssize_t)sizeof(sector) && sector[510] == 0x55 && sector[511] == 0xaa) {
        *fmt = "raw";
        return 0;
    }
    return al_err(err, -EINVAL,
                  "'%s' is neither a qcow2 image nor a raw disk with a partition table (no boot "
                  "signature in its first sector); convert other formats with qemu-img convert "
                  "-O qcow2",
                  file);
}

static int write_manifest(const char *scratch, const al_image_import_opts *o, const char *user,
                          unsigned memory, al_error *err)
{
    _cleanup_cjson_ cJSON *j = cJSON_CreateObject();
    _cleanup_free_ char *from = strdup(o->path);
    if (!j || !from || !cJSON_AddStringToObject(j, "disk", "disk.qcow2") ||
        !cJSON_AddStringToObject(j, "transport", "ssh") ||
        !cJSON_AddStringToObject(j, "ssh_user", user) ||
        !cJSON_AddNumberToObject(j, "ssh_port", 22) ||
        !cJSON_AddNumberToObject(j, "memory_mib", memory) ||
        /* For whoever reads the manifest later; nothing reads it back. */
        !cJSON_AddStringToObject(j, "imported_from", basename(from)))
        return al_err(err, -ENOMEM, "out of memory");
    return al_manifest_write(scratch, j, err);
}

int al_image_import(const al_image_import_opts *given, al_error *err)
{
    al_image_import_opts taken = AL_IMAGE_IMPORT_OPTS_INIT;
    const al_image_import_opts *opts = &taken;
    int r0 = AL_SIZED_IN(&taken, given, "al_image_import_opts", err);
    if (r0 < 0)
        return r0;
    const char *user = opts->ssh_user ? opts->ssh_user : IMPORT_USER_DEFAULT;
    unsigned memory = opts->memory_mib ? opts->memory_mib : IMPORT_MEMORY_DEFAULT;
    if (!al_image_name_ok(opts->name))
        return al_err(err, -EINVAL, "bad image name '%s'", opts->name);
    if (!al_ssh_user_ok(user))
        return al_err(err, -EINVAL, "bad SSH user name '%s'", user);
    /* The same bounds al_image_load accepts. */
    if (memory < 64 || memory > 1048576)
        return al_err(err, -EINVAL, "memory of %u MiB is out of range (64 to 1048576)", memory);

    /* O_NONBLOCK: a FIFO must not hang the open; it is refused below like any non-file. */
    _cleanup_close_ int in = open(opts->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (in < 0)
        return al_err(err, -errno, "cannot open '%s': %s", opts->path, strerror(errno));
    struct stat st;
    if (fstat(in, &st) < 0)
        return al_err(err, -errno, "cannot read '%s': %s", opts->path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return al_err(err, -EINVAL, "'%s' is not a regular file", opts->path);
    if ((unsigned long long)st.st_size > IMPORT_SIZE_MAX)
        return al_err(err, -EFBIG, "'%s' is %lld bytes, over the import limit of %llu GiB",
                      opts->path, (long long)st.st_size, IMPORT_SIZE_MAX >> 30);

    char dst[AL_PATH_MAX], tmp[AL_PATH_MAX], src[AL_PATH_MAX], disk[AL_PATH_MAX];
    /* The name checked now so a refusal comes before minutes of copying; the move checks
     * again. The scratch dir is private while it holds the copy being checked. */
    int r = al_image_scratch(opts->name, opts->force, "import", dst, sizeof(dst), tmp, sizeof(tmp),
                             err);
    if (r < 0)
        return r;
    __attribute__((cleanup(rmtreep))) char *scratch = tmp;
    if (al_pathf(src, sizeof(src), "%s/source", tmp) < 0 ||
        al_pathf(disk, sizeof(disk), "%s/disk.qcow2", tmp) < 0)
        return al_err(err, -ENAMETOOLONG, "image path too long");

    r = al_copy_sparse(in, st.st_size, src);
    if (r < 0)
        return al_err(err, r, "cannot copy '%s' into the image store: %s", opts->path,
                      strerror(-r));
    _cleanup_close_ int copy = open(src, O_RDONLY | O_CLOEXEC);
    if (copy < 0)
        return al_err(err, -errno, "cannot read the copy of '%s': %s", opts->path, strerror(errno));
    const char *fmt = NULL;
    r = detect_format(copy, opts->path, &fmt, err);
    if (r < 0)
        return r;
    r = check_info(tmp, src, fmt, opts->path, err);
    if (r < 0)
        return r;
    char err_path[AL_PATH_MAX];
    if (al_pathf(err_path, sizeof(err_path), "%s/qemu-img.err", tmp) < 0)
        return al_err(err, -ENAMETOOLONG, "image path too long");
    /* Always a qcow2: sessions put their overlays on it (al_disk_overlay names it qcow2). */
    const char *argv[] = {"qemu-img", "convert", "-q", "-f", fmt, "-O", "qcow2", src, disk, NULL};
    r = qemu_img(argv, &CONVERT_LIMITS, NULL, err_path, "convert", opts->path, err);
    if (r < 0)
        return r;
    unlink(src);
    unlink(err_path);
    r = write_manifest(tmp, opts, user, memory, err);
    if (r < 0)
        return r;
    /* Sessions never write the base, each has an overlay; QEMU, another user, reads it. */
    if (chmod(disk, 0444) < 0 || chmod(tmp, 0755) < 0)
        return al_err(err, -errno, "cannot chmod '%s': %s", tmp, strerror(errno));

    /* Moved in at once, so a session starting meanwhile gets the old or the new image. */
    return al_image_swap_in(tmp, dst, opts->name, opts->force, err);
}

/* The SSH transport: the agent reached through sshd in the guest, with libssh2.
 *
 * Per session: an ed25519 key pair for logging in and one for the guest's host key, both made
 * here with ssh-keygen and handed to the guest's cloud-init in a NoCloud seed (an ISO made by
 * genisoimage). The guest's NIC is on QEMU's user-mode network with restrict=on and one forward
 * from 127.0.0.1:PORT to its sshd (vm.c). Connecting: the host key must be the one we made,
 * else nothing is sent; the agent and its language kernels are copied in over SFTP when the
 * guest lacks this build of them; an exec channel runs `airlock-agent --relay`, which joins the
 * guest's agent daemon (started on first use, kept across connections so kernels and their
 * state outlive a dropped connection or a rollback).
 *
 * The rest of the library speaks frames on a socket: a pump thread moves bytes between the SSH
 * channel and one end of a socketpair, and the session's channel (channel.c) gets the other
 * end. When the connection drops, the pump closes its end: the channel sees EOF, lost() says
 * so, and the next request reconnects (al_link_ready in link.c). */
#include "transport.h"

#include <libssh2.h>
#include <libssh2_sftp.h>
#include <openssl/evp.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>

/* Where the guest's agent daemon listens; the relay joins it there. */
#define GUEST_SOCKET "/run/airlock/agent.sock"
/* One attempt at the SSH handshake and login; the boot deadline bounds the retries. */
#define ATTEMPT_MS 8000
/* Reconnecting after a dropped connection: waits between attempts, then give up. */
static const unsigned reconnect_wait_ms[] = {0, 250, 500, 1000, 2000, 4000};
/* Under emulation an image reached over SSH boots further before it answers. */
#define PROBE_MS 20000
#define PUMP_BUF (256 * 1024)
#define KEEPALIVE_S 10
#define SFTP_CHUNK (1024 * 1024)
/* The longest home directory in the guest we copy the agent under; the guest paths built from
 * it (cache dir, agent, kernels and their .part files) are sized from it and fit. */
#define GUEST_HOME_MAX 400

struct al_ssh {
    int sock; /* TCP to the forward on 127.0.0.1 */
    LIBSSH2_SESSION *sess;
    LIBSSH2_CHANNEL *chan;
    int pair;    /* the pump's end of the socketpair */
    int stop[2]; /* a byte here ends the pump */
    pthread_t thread;
    bool thread_started;
    atomic_bool done;   /* the pump has ended: the connection is gone */
    char why[400];      /* why it ended, for the session's channel; written before done is set */
    bool err_nl;        /* the relay's stderr ended a line */
    char err_tail[160]; /* the last line the relay wrote on stderr (sudo refusing, say) */
};

/* The transport: the session's keys, seed and forwarded port, and the connection. */
struct ssh_tport {
    struct al_tport t;
    char keys[AL_PATH_MAX]; /* the session's keys */
    char seed[AL_PATH_MAX]; /* the cloud-init seed ISO */
    char host_pub[256];     /* the host key given to the guest, pinned */
    unsigned host_port;     /* 127.0.0.1 port forwarded to the guest's sshd */
    struct al_ssh *c;       /* the connection while there is one */
};

static struct ssh_tport *ssh_of(struct al_tport *t)
{
    return (struct ssh_tport *)t;
}

static pthread_once_t ssh_once = PTHREAD_ONCE_INIT;
static int ssh_init_rc;

static void ssh_global_init(void)
{
    ssh_init_rc = libssh2_init(0);
}

/* ---- before the VM starts: keys, seed, port ---- */

static char *read_text(const char *path, size_t max)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return NULL;
    char *buf = calloc(1, max + 1);
    size_t n = buf ? fread(buf, 1, max, f) : 0;
    fclose(f);
    if (buf && n == max) { /* larger than any key we make */
        free(buf);
        return NULL;
    }
    return buf;
}

static int keygen(const char *path, al_error *err)
{
    const char *argv[] = {"ssh-keygen", "-q",      "-t", "ed25519", "-N", "",
                          "-C",         "airlock", "-f", path,      NULL};
    return al_spawn_quiet(argv, "make a session key", err);
}

/* Writes the seed's two files: the login key for the image's user, the host key pinned. */
static int write_seed_files(struct ssh_tport *s, const char *dir, al_error *err)
{
    char path[AL_PATH_MAX], priv_path[AL_PATH_MAX];
    if (al_pathf(path, sizeof(path), "%s/id_ed25519.pub", s->keys) < 0 ||
        al_pathf(priv_path, sizeof(priv_path), "%s/host_ed25519", s->keys) < 0)
        return al_err(err, -ENAMETOOLONG, "session path too long");
    _cleanup_free_ char *user_pub = read_text(path, 4096);
    _cleanup_free_ char *host_priv = read_text(priv_path, 8192);
    if (!user_pub || !host_priv)
        return al_err(err, -EIO, "cannot read the session keys");
    user_pub[strcspn(user_pub, "\n")] = '\0';

    if (al_pathf(path, sizeof(path), "%s/user-data", dir) < 0)
        return al_err(err, -ENAMETOOLONG, "session path too long");
    FILE *f = fopen(path, "we");
    if (!f)
        return al_err(err, -errno, "cannot write the seed: %s", strerror(errno));
    /* cloud-config, as cloud-init reads it: the key for the default user, this host key only,
     * no passwords. */
    fprintf(f,
            "#cloud-config\n"
            "ssh_pwauth: false\n"
            "disable_root: %s\n"
            "ssh_deletekeys: true\n"
            "ssh_genkeytypes: []\n"
            "ssh_authorized_keys:\n"
            "  - %s\n"
            "ssh_keys:\n"
            "  ed25519_public: %s\n"
            "  ed25519_private: |\n",
            strcmp(s->t.env.img->ssh_user, "root") ? "true" : "false", user_pub, s->host_pub);
    for (char *line = strtok(host_priv, "\n"); line; line = strtok(NULL, "\n"))
        fprintf(f, "    %s\n", line);
    if (fclose(f) != 0)
        return al_err(err, -EIO, "cannot write the seed");

    if (al_pathf(path, sizeof(path), "%s/meta-data", dir) < 0)
        return al_err(err, -ENAMETOOLONG, "session path too long");
    f = fopen(path, "we");
    if (!f)
        return al_err(err, -errno, "cannot write the seed: %s", strerror(errno));
    fprintf(f, "instance-id: %s\nlocal-hostname: %s\n", s->t.env.name, s->t.env.name);
    return fclose(f) == 0 ? 0 : al_err(err, -EIO, "cannot write the seed");
}

/* Keys, seed and port for a session being opened: cfg gets the NIC and the seed. */
static int ssh_prepare(struct al_tport *t, struct al_vm_config *cfg, bool kvm, al_error *err)
{
    struct ssh_tport *s = ssh_of(t);
    if (al_pathf(s->keys, sizeof(s->keys), "%s/ssh", t->env.dir) < 0)
        return al_err(err, -ENAMETOOLONG, "session path too long");
    if (mkdir(s->keys, 0700) < 0)
        return al_err(err, -errno, "cannot create '%s': %s", s->keys, strerror(errno));
    char user_key[AL_PATH_MAX], host_key[AL_PATH_MAX], pub[AL_PATH_MAX], seed_dir[AL_PATH_MAX];
    if (al_pathf(user_key, sizeof(user_key), "%s/id_ed25519", s->keys) < 0 ||
        al_pathf(host_key, sizeof(host_key), "%s/host_ed25519", s->keys) < 0 ||
        al_pathf(pub, sizeof(pub), "%s/host_ed25519.pub", s->keys) < 0 ||
        al_pathf(seed_dir, sizeof(seed_dir), "%s/seed", s->keys) < 0 ||
        al_pathf(s->seed, sizeof(s->seed), "%s/seed.iso", t->env.dir) < 0)
        return al_err(err, -ENAMETOOLONG, "session path too long");
    int r = keygen(user_key, err);
    if (r < 0)
        return r;
    r = keygen(host_key, err);
    if (r < 0)
        return r;
    _cleanup_free_ char *host_pub = read_text(pub, 4096);
    if (!host_pub)
        return al_err(err, -EIO, "cannot read the host key");
    host_pub[strcspn(host_pub, "\n")] = '\0';
    snprintf(s->host_pub, sizeof(s->host_pub), "%s", host_pub);
    if (mkdir(seed_dir, 0700) < 0)
        return al_err(err, -errno, "cannot create '%s': %s", seed_dir, strerror(errno));
    r = write_seed_files(s, seed_dir, err);
    if (r < 0)
        return r;
    char ud[AL_PATH_MAX], md[AL_PATH_MAX];
    if (al_pathf(ud, sizeof(ud), "%s/user-data", seed_dir) < 0 ||
        al_pathf(md, sizeof(md), "%s/meta-data", seed_dir) < 0)
        return al_err(err, -ENAMETOOLONG, "session path too long");
    const char *argv[] = {"genisoimage", "-quiet", "-output", s->seed, "-volid", "cidata",
                          "-joliet",     "-rock",  ud,        md,      NULL};
    r = al_spawn_quiet(argv, "make the cloud-init seed", err);
    if (r < 0)
        return r;
    /* It holds the host's private key: readable by QEMU's user only. */
    r = al_disk_give(t->env.conn, kvm, s->seed, err);
    if (r < 0)
        return r;
    al_rmtree(seed_dir);
    r = al_free_port(&s->host_port, err);
    if (r < 0)
        return r;
    cfg->host_port = s->host_port;
    cfg->guest_port = t->env.img->ssh_port;
    cfg->seed = s->seed;
    cfg->agent_sock = NULL;
    return 0;
}

/* The forward's port was free when picked, but someone may have taken it since QEMU failed to
 * bind it: another one. */
static int ssh_retry_start(struct al_tport *t, struct al_vm_config *cfg, const char *msg,
                           al_error *err)
{
    struct ssh_tport *s = ssh_of(t);
    if (!cfg->host_port || !strstr(msg, "forwarding"))
        return 0;
    int r = al_free_port(&s->host_port, err);
    cfg->host_port = s->host_port;
    return r < 0 ? r : 1;
}

/* ---- connecting ---- */

/* The public key blob of an OpenSSH public key line ("ssh-ed25519 BASE64 comment"). */
static int pub_blob(const char *line, unsigned char *out, size_t cap, size_t *len)
{
    const char *b = strchr(line, ' ');
    if (!b)
        return -EINVAL;
    b++;
    size_t n = strcspn(b, " \n");
    if (n == 0 || n % 4 || (n / 4) * 3 > cap)
        return -EINVAL;
    int got = EVP_DecodeBlock(out, (const unsigned char *)b, (int)n);
    if (got < 0)
        return -EINVAL;
    /* EVP_DecodeBlock counts the padding as zero bytes. */
    *len = (size_t)got - (b[n - 1] == '=') - (b[n - 2] == '=');
    return 0;
}

static const char *ssh_errmsg(LIBSSH2_SESSION *sess)
{
    char *msg = NULL;
    libssh2_session_last_error(sess, &msg, NULL, 0);
    return msg && *msg ? msg : "unknown error";
}

static void ssh_free(struct al_ssh *c)
{
    if (!c)
        return;
    if (c->sess) {
        /* In non-blocking mode libssh2's frees may answer EAGAIN and free nothing. With the
         * socket shut down first, every exchange they attempt fails at once and they free.
         * The guest's sshd sees the connection end, and the relay its stdin close. */
        if (c->sock >= 0)
            shutdown(c->sock, SHUT_RDWR);
        libssh2_session_set_blocking(c->sess, 1);
        if (c->chan)
            libssh2_channel_free(c->chan);
        libssh2_session_free(c->sess);
    }
    al_closep(&c->sock);
    al_closep(&c->pair);
    al_closep(&c->stop[0]);
    al_closep(&c->stop[1]);
    free(c);
}

static int tcp_connect(unsigned port, int *out, al_error *err)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return al_err(err, -errno, "socket: %s", strerror(errno));
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        int e = errno;
        close(fd);
        return al_err(err, -e, "cannot connect to 127.0.0.1:%u: %s", port, strerror(e));
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    *out = fd;
    return 0;
}

/* The key the guest shows must be the one we gave it, before we send a credential. */
static int check_host_key(const struct ssh_tport *s, struct al_ssh *c, al_error *err)
{
    size_t len = 0;
    int type = 0;
    const char *key = libssh2_session_hostkey(c->sess, &len, &type);
    unsigned char want[256];
    size_t want_len = 0;
    if (pub_blob(s->host_pub, want, sizeof(want), &want_len) < 0)
        return al_err(err, -EINVAL, "the session's host key is unreadable");
    if (key && type == LIBSSH2_HOSTKEY_TYPE_ED25519 && len == want_len &&
        memcmp(key, want, len) == 0)
        return 0;
    const unsigned char *fp =
        (const unsigned char *)libssh2_hostkey_hash(c->sess, LIBSSH2_HOSTKEY_HASH_SHA256);
    char b64[64] = "?";
    if (fp)
        EVP_EncodeBlock((unsigned char *)b64, fp, 32);
    b64[strcspn(b64, "=")] = '\0';
    return al_err(err, -EKEYREJECTED,
                  "the guest's SSH host key (SHA256:%s) is not the one Airlock gave it; refusing "
                  "to log in",
                  b64);
}

/* Files the guest needs from this build: the agent and its language kernels. */
struct payload {
    char agent[AL_PATH_MAX];
    char kernels[AL_PATH_MAX];
    char tag[17]; /* a hash of all of them: the guest dir they go in */
};

static int hash_file(EVP_MD_CTX *md, const char *path)
{
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    char buf[65536];
    ssize_t n;
    while ((n = read(fd, buf, sizeof(buf))) > 0)
        EVP_DigestUpdate(md, buf, (size_t)n);
    return n < 0 ? -errno : 0;
}

static bool kernel_file(const struct dirent *e)
{
    return e->d_name[0] != '.' && al_image_name_ok(e->d_name);
}

static int payload_find(struct payload *p, al_error *err)
{
    int r = al_agent_files(p->agent, sizeof(p->agent), p->kernels, sizeof(p->kernels), err);
    if (r < 0)
        return r;
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    if (!md)
        return al_err(err, -ENOMEM, "out of memory");
    EVP_DigestInit_ex(md, EVP_sha256(), NULL);
    r = hash_file(md, p->agent);
    DIR *d = opendir(p->kernels);
    struct dirent *e;
    while (r == 0 && d && (e = readdir(d))) {
        char path[AL_PATH_MAX];
        if (!kernel_file(e) || al_pathf(path, sizeof(path), "%s/%s", p->kernels, e->d_name) < 0)
            continue;
        EVP_DigestUpdate(md, e->d_name, strlen(e->d_name) + 1);
        r = hash_file(md, path);
    }
    if (d)
        closedir(d);
    unsigned char sum[EVP_MAX_MD_SIZE];
    unsigned sl = 0;
    EVP_DigestFinal_ex(md, sum, &sl);
    EVP_MD_CTX_free(md);
    if (r < 0)
        return al_err(err, r, "cannot read the agent files: %s", strerror(-r));
    for (int i = 0; i < 8; i++)
        snprintf(p->tag + 2 * i, 3, "%02x", sum[i]);
    return 0;
}

static int sftp_put(LIBSSH2_SFTP *sftp, const char *src, const char *dst, long mode, al_error *err)
{
    _cleanup_close_ int fd = open(src, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return al_err(err, -errno, "cannot open '%s': %s", src, strerror(errno));
    char tmp[1100];
    snprintf(tmp, sizeof(tmp), "%s.part", dst);
    LIBSSH2_SFTP_HANDLE *h = libssh2_sftp_open(
        sftp, tmp, LIBSSH2_FXF_WRITE | LIBSSH2_FXF_CREAT | LIBSSH2_FXF_TRUNC, mode);
    if (!h)
        return al_err(err, -EIO, "cannot create %s in the guest over SFTP (error %lu)", tmp,
                      libssh2_sftp_last_error(sftp));
    /* Large writes: libssh2 sends a buffer as many SFTP packets at once and then collects the
     * acknowledgements, where 32 KiB writes cost a round trip each (2.3 s against 0.x s for
     * the agent under emulation). */
    _cleanup_free_ char *buf = malloc(SFTP_CHUNK);
    if (!buf) {
        libssh2_sftp_close(h);
        return al_err(err, -ENOMEM, "out of memory");
    }
    ssize_t n;
    int r = 0;
    while (r == 0 && (n = read(fd, buf, SFTP_CHUNK)) > 0) {
        for (ssize_t off = 0; off < n;) {
            ssize_t w = libssh2_sftp_write(h, buf + off, (size_t)(n - off));
            if (w <= 0) {
                r = al_err(err, -EIO, "cannot write %s in the guest over SFTP", tmp);
                break;
            }
            off += w;
        }
    }
    libssh2_sftp_close(h);
    if (r < 0)
        return r;
    if (libssh2_sftp_rename_ex(sftp, tmp, (unsigned)strlen(tmp), dst, (unsigned)strlen(dst),
                               LIBSSH2_SFTP_RENAME_OVERWRITE | LIBSSH2_SFTP_RENAME_ATOMIC |
                                   LIBSSH2_SFTP_RENAME_NATIVE) != 0)
        return al_err(err, -EIO, "cannot rename %s in the guest over SFTP (error %lu)", tmp,
                      libssh2_sftp_last_error(sftp));
    return 0;
}

/* A guest path goes into a remote shell command: only plain characters. */
static bool guest_path_ok(const char *p)
{
    if (*p != '/')
        return false;
    for (; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              strchr("/-_.", *p)))
            return false;
    return true;
}

/* Copies the agent and kernels into ~/.cache/airlock/TAG in the guest unless there already;
 * writes that directory into dir. */
static int upload_agent(struct al_ssh *c, char *dir, size_t dlen, al_error *err)
{
    struct payload p;
    int r = payload_find(&p, err);
    if (r < 0)
        return r;
    LIBSSH2_SFTP *sftp = libssh2_sftp_init(c->sess);
    if (!sftp)
        return al_err(err, -EIO, "cannot start SFTP in the guest: %s", ssh_errmsg(c->sess));
    char home[512] = "";
    int n = libssh2_sftp_realpath(sftp, ".", home, sizeof(home) - 1);
    if (n <= 0 || (size_t)n >= sizeof(home) - 1) {
        libssh2_sftp_shutdown(sftp);
        return al_err(err, -EIO, "cannot find the home directory in the guest");
    }
    home[n] = '\0';
    if (!guest_path_ok(home) || strlen(home) > GUEST_HOME_MAX) {
        libssh2_sftp_shutdown(sftp);
        return al_err(err, -EINVAL, "the guest's home directory has an unusable name");
    }
    char cache[512], base[600], agent[800], kdir[800];
    snprintf(cache, sizeof(cache), "%s/.cache", home);
    snprintf(base, sizeof(base), "%s/.cache/airlock", home);
    snprintf(dir, dlen, "%s/%s", base, p.tag);
    snprintf(agent, sizeof(agent), "%s/airlock-agent", dir);
    snprintf(kdir, sizeof(kdir), "%s/kernels", dir);
    LIBSSH2_SFTP_ATTRIBUTES st;
    if (libssh2_sftp_stat(sftp, agent, &st) == 0) {
        libssh2_sftp_shutdown(sftp);
        return 0; /* this build's agent is there (it is renamed in last) */
    }
    const char *dirs[] = {cache, base, dir, kdir};
    for (size_t i = 0; i < 4; i++)
        libssh2_sftp_mkdir(sftp, dirs[i], 0700); /* existing ones are fine */
    DIR *d = opendir(p.kernels);
    struct dirent *e;
    while (r == 0 && d && (e = readdir(d))) {
        char src[AL_PATH_MAX], dst[1100];
        if (!kernel_file(e) || al_pathf(src, sizeof(src), "%s/%s", p.kernels, e->d_name) < 0)
            continue;
        snprintf(dst, sizeof(dst), "%s/%s", kdir, e->d_name);
        r = sftp_put(sftp, src, dst, 0644, err);
    }
    if (d)
        closedir(d);
    if (r == 0)
        r = sftp_put(sftp, p.agent, agent, 0755, err);
    libssh2_sftp_shutdown(sftp);
    return r;
}

static void *pump(void *arg);

/* One attempt: TCP, SSH handshake, host key, login, agent copy, relay, pump. timeout_ms bounds
 * each blocking step. */
static int connect_once(struct ssh_tport *s, unsigned timeout_ms, struct al_transport_conn *out,
                        al_error *err)
{
    const char *user = s->t.env.img->ssh_user;
    struct al_ssh *c = calloc(1, sizeof(*c));
    if (!c)
        return al_err(err, -ENOMEM, "out of memory");
    c->sock = c->pair = c->stop[0] = c->stop[1] = -1;
    int r = tcp_connect(s->host_port, &c->sock, err);
    if (r < 0)
        goto fail;
    c->sess = libssh2_session_init();
    if (!c->sess) {
        r = al_err(err, -ENOMEM, "cannot start an SSH session");
        goto fail;
    }
    libssh2_session_set_blocking(c->sess, 1);
    libssh2_session_set_timeout(c->sess, timeout_ms);
    /* Only the kind of host key we pin. */
    libssh2_session_method_pref(c->sess, LIBSSH2_METHOD_HOSTKEY, "ssh-ed25519");
    int hr = libssh2_session_handshake(c->sess, c->sock);
    if (hr != 0) {
        r = al_err(err, hr == LIBSSH2_ERROR_TIMEOUT ? -ETIMEDOUT : -ECONNREFUSED,
                   "the guest's sshd did not answer on 127.0.0.1:%u (%s)", s->host_port,
                   ssh_errmsg(c->sess));
        goto fail;
    }
    libssh2_session_set_timeout(c->sess, ATTEMPT_MS);
    r = check_host_key(s, c, err);
    if (r < 0)
        goto fail;
    char pub[AL_PATH_MAX], priv[AL_PATH_MAX];
    if (al_pathf(pub, sizeof(pub), "%s/id_ed25519.pub", s->keys) < 0 ||
        al_pathf(priv, sizeof(priv), "%s/id_ed25519", s->keys) < 0) {
        r = al_err(err, -ENAMETOOLONG, "session path too long");
        goto fail;
    }
    if (libssh2_userauth_publickey_fromfile(c->sess, user, pub, priv, NULL) != 0) {
        r = al_err(err, -EACCES, "the guest refused the session key for user '%s': %s", user,
                   ssh_errmsg(c->sess));
        goto fail;
    }
    char dir[700];
    r = upload_agent(c, dir, sizeof(dir), err);
    if (r < 0)
        goto fail;
    c->chan = libssh2_channel_open_session(c->sess);
    if (!c->chan) {
        r = al_err(err, -EIO, "cannot open an SSH channel: %s", ssh_errmsg(c->sess));
        goto fail;
    }
    char cmd[2000];
    snprintf(cmd, sizeof(cmd),
             "exec %s%s/airlock-agent --relay " GUEST_SOCKET " --kernels %s/kernels",
             strcmp(user, "root") ? "sudo -n " : "", dir, dir);
    if (libssh2_channel_exec(c->chan, cmd) != 0) {
        r = al_err(err, -EIO, "cannot start the agent in the guest: %s", ssh_errmsg(c->sess));
        goto fail;
    }
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0 ||
        pipe2(c->stop, O_CLOEXEC | O_NONBLOCK) < 0) {
        r = al_err(err, -errno, "socketpair: %s", strerror(errno));
        goto fail;
    }
    c->pair = sp[1];
    fcntl(c->pair, F_SETFL, O_NONBLOCK);
    fcntl(sp[0], F_SETFL, O_NONBLOCK);
    libssh2_session_set_blocking(c->sess, 0);
    libssh2_keepalive_config(c->sess, 1, KEEPALIVE_S);
    if ((r = -pthread_create(&c->thread, NULL, pump, c)) != 0) {
        close(sp[0]);
        r = al_err(err, r, "cannot start the SSH pump: %s", strerror(-r));
        goto fail;
    }
    c->thread_started = true;
    s->c = c;
    /* why is complete once the session's end reads EOF: see pump_end */
    *out = (struct al_transport_conn){.fd = sp[0], .eof_msg = c->why};
    return 0;
fail:
    ssh_free(c);
    return r;
}

static void ssh_disconnect(struct al_tport *t)
{
    struct ssh_tport *s = ssh_of(t);
    struct al_ssh *c = s->c;
    if (!c)
        return;
    if (c->thread_started) {
        (void)!write(c->stop[1], "x", 1);
        pthread_join(c->thread, NULL);
    }
    ssh_free(c);
    s->c = NULL;
}

static int ssh_connect(struct al_tport *t, virDomainPtr dom, uint64_t deadline,
                       struct al_transport_conn *out, al_error *err)
{
    struct ssh_tport *s = ssh_of(t);
    pthread_once(&ssh_once, ssh_global_init);
    if (ssh_init_rc != 0)
        return al_err(err, -EIO, "libssh2 failed to initialise");
    ssh_disconnect(t);
    /* While the guest boots, slirp holds our connection open until the guest answers its SYN,
     * which may be never: short waits for the banner at first, longer ones after each miss
     * (a loaded guest may be slow to finish the key exchange). */
    unsigned banner_ms = 1000;
    for (;;) {
        al_error e = {0};
        int r = connect_once(s, banner_ms, out, &e);
        if (r == 0)
            return 0;
        if (r == -ETIMEDOUT && banner_ms < ATTEMPT_MS)
            banner_ms *= 2;
        /* A wrong host key or a refused login will not get better by asking again. */
        if (r == -EKEYREJECTED || r == -EACCES || al_now_ms() + 250 >= deadline ||
            (dom && !virDomainIsActive(dom))) {
            if (r == -EKEYREJECTED || r == -EACCES)
                return al_err(err, r, "%s", e.msg);
            char last[160];
            al_console_tail(t->env.console, last, sizeof(last));
            return al_err(err, r, "%s (console's last line: %s)", e.msg, last);
        }
        struct pollfd p = {t->env.cancel_fd, POLLIN, 0};
        if (poll(&p, 1, 250) > 0)
            return al_err(err, -ECANCELED, "cancelled while connecting to the guest");
    }
}

static bool ssh_lost(struct al_tport *t)
{
    struct ssh_tport *s = ssh_of(t);
    return !s->c || atomic_load(&s->c->done);
}

/* One attempt each round of a reconnect: a dead sshd fails it at once (the guest resets the
 * connection), a slow guest gets a longer wait for the banner each time. The agent daemon in
 * the guest kept running: its kernels keep their state. */
static int ssh_reconnect(struct al_tport *t, unsigned attempt, struct al_transport_conn *out,
                         al_error *err)
{
    ssh_disconnect(t);
    unsigned banner_ms = 2000u << (attempt < 2 ? attempt : 2);
    return connect_once(ssh_of(t), banner_ms, out, err);
}

static struct al_tport *ssh_create(void)
{
    return calloc(1, sizeof(struct ssh_tport));
}

static void ssh_destroy(struct al_tport *t)
{
    free(ssh_of(t));
}

/* ---- the pump ---- */

static void drain_stderr(struct al_ssh *c);

/* libssh2's own words for a dropped socket ("transport read") say little to a user. */
static const char *ssh_failure(struct al_ssh *c, int rc)
{
    if (rc == LIBSSH2_ERROR_SOCKET_RECV || rc == LIBSSH2_ERROR_SOCKET_SEND ||
        rc == LIBSSH2_ERROR_SOCKET_DISCONNECT)
        return "the guest's sshd closed the connection";
    return ssh_errmsg(c->sess);
}

struct buf {
    char *p;
    size_t len, off;
};

static void pump_end(struct al_ssh *c, const char *why)
{
    drain_stderr(c); /* what came with the end */
    snprintf(c->why, sizeof(c->why), "the SSH connection to the guest was lost (%s)%s%s", why,
             c->err_tail[0] ? "; the guest said: " : "", c->err_tail);
    atomic_store(&c->done, true);
    al_closep(&c->pair); /* the session's channel now reads EOF */
    c->pair = -1;
}

/* Keeps the last line of the relay's stderr, printable characters only (it ends up in an error
 * message); read every round, since unread stderr would use up the channel's window. */
static void drain_stderr(struct al_ssh *c)
{
    char buf[1024];
    ssize_t n;
    while ((n = libssh2_channel_read_stderr(c->chan, buf, sizeof(buf))) > 0) {
        size_t len = strlen(c->err_tail);
        for (ssize_t i = 0; i < n; i++) {
            char ch = buf[i];
            if (ch == '\n' || ch == '\r') {
                c->err_nl = true;
                continue;
            }
            if (c->err_nl)
                len = 0; /* a new line starts: keep that one */
            c->err_nl = false;
            if (len + 1 < sizeof(c->err_tail))
                c->err_tail[len++] = ch >= 0x20 && ch < 0x7f ? ch : '?';
        }
        c->err_tail[len] = '\0';
    }
}

static void *pump(void *arg)
{
    struct al_ssh *c = arg;
    struct buf in = {malloc(PUMP_BUF), 0, 0};  /* guest -> host */
    struct buf out = {malloc(PUMP_BUF), 0, 0}; /* host -> guest */
    bool host_eof = false;
    if (!in.p || !out.p) {
        pump_end(c, "out of memory");
        goto done;
    }
    for (;;) {
        bool progress = true;
        while (progress) {
            progress = false;
            drain_stderr(c);
            if (in.len == 0) {
                ssize_t n = libssh2_channel_read(c->chan, in.p, PUMP_BUF);
                if (n > 0) {
                    in.len = (size_t)n;
                    in.off = 0;
                    progress = true;
                } else if (n < 0 && n != LIBSSH2_ERROR_EAGAIN) {
                    pump_end(c, ssh_failure(c, (int)n));
                    goto done;
                } else if (libssh2_channel_eof(c->chan)) {
                    pump_end(c, "the agent's relay in the guest ended");
                    goto done;
                }
            }
            if (in.len) {
                ssize_t n = send(c->pair, in.p + in.off, in.len, MSG_NOSIGNAL | MSG_DONTWAIT);
                if (n > 0) {
                    in.off += (size_t)n;
                    in.len -= (size_t)n;
                    progress = true;
                } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
                    pump_end(c, "the session's end of the channel closed");
                    goto done;
                }
            }
            if (out.len == 0 && !host_eof) {
                ssize_t n = recv(c->pair, out.p, PUMP_BUF, MSG_DONTWAIT);
                if (n > 0) {
                    out.len = (size_t)n;
                    out.off = 0;
                    progress = true;
                } else if (n == 0) {
                    host_eof = true; /* the session is closing its channel */
                    libssh2_channel_send_eof(c->chan);
                } else if (errno != EAGAIN && errno != EINTR) {
                    pump_end(c, "the session's end of the channel failed");
                    goto done;
                }
            }
            if (out.len) {
                ssize_t n = libssh2_channel_write(c->chan, out.p + out.off, out.len);
                if (n > 0) {
                    out.off += (size_t)n;
                    out.len -= (size_t)n;
                    progress = true;
                } else if (n < 0 && n != LIBSSH2_ERROR_EAGAIN) {
                    pump_end(c, ssh_failure(c, (int)n));
                    goto done;
                }
            }
        }
        int next = KEEPALIVE_S;
        if (libssh2_keepalive_send(c->sess, &next) != 0 &&
            libssh2_session_last_errno(c->sess) != LIBSSH2_ERROR_EAGAIN) {
            pump_end(c, "the guest stopped answering SSH keepalives");
            goto done;
        }
        /* The socket is read only while there is room for what it brings (or libssh2 waits on
         * it, for a window adjust): else its data would wake us again and again while the
         * session's end of the pair is full. */
        int dirs = libssh2_session_block_directions(c->sess);
        bool want_in = in.len == 0 || (dirs & LIBSSH2_SESSION_BLOCK_INBOUND);
        struct pollfd p[3] = {
            {c->sock,
             (short)((want_in ? POLLIN : 0) |
                     (dirs & LIBSSH2_SESSION_BLOCK_OUTBOUND ? POLLOUT : 0)),
             0},
            {c->pair, (short)((out.len == 0 && !host_eof ? POLLIN : 0) | (in.len ? POLLOUT : 0)),
             0},
            {c->stop[0], POLLIN, 0},
        };
        if (poll(p, 3, next > 0 ? next * 1000 : 1000) < 0 && errno != EINTR) {
            pump_end(c, "poll failed");
            goto done;
        }
        if (p[2].revents) {
            pump_end(c, "closed by the host");
            goto done;
        }
        if (p[0].revents & (POLLERR | POLLHUP) && !(p[0].revents & POLLIN)) {
            pump_end(c, "the TCP connection to the guest's sshd closed");
            goto done;
        }
    }
done:
    free(in.p);
    free(out.p);
    return NULL;
}

const struct al_transport_ops al_transport_ssh = {
    .kind = AL_TRANSPORT_SSH,
    .label = "SSH",
    .peer = "sshd",
    .guest_side = true,
    .probe_ms = PROBE_MS,
    .reconnect_wait_ms = reconnect_wait_ms,
    .reconnect_tries = sizeof(reconnect_wait_ms) / sizeof(reconnect_wait_ms[0]),
    .create = ssh_create,
    .destroy = ssh_destroy,
    .prepare = ssh_prepare,
    .retry_start = ssh_retry_start,
    .connect = ssh_connect,
    .reconnect = ssh_reconnect,
    .lost = ssh_lost,
    .disconnect = ssh_disconnect,
};

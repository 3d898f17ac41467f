/* Who is at the other end of a TCP connection on this host: the kernel's socket tables
 * (sock_diag), asked for the socket whose own address is our peer's and whose peer is us. A
 * loopback connection has its other end here; a remote one has none. */
#include "util.h"

#include <arpa/inet.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>

/* One address of a TCP socket into the diag id's form; false for another family. An IPv4
 * address mapped into IPv6 (a v6 socket's v4 peer) is its IPv4 self: the peer's socket is
 * an AF_INET one. */
static bool diag_addr(const struct sockaddr_storage *ss, int *family, __be16 *port, __be32 a[4])
{
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)ss;
        *family = AF_INET;
        *port = in->sin_port;
        a[0] = in->sin_addr.s_addr;
        return true;
    }
    if (ss->ss_family != AF_INET6)
        return false;
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)ss;
    *port = in6->sin6_port;
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
        *family = AF_INET;
        memcpy(&a[0], &in6->sin6_addr.s6_addr[12], 4);
    } else {
        *family = AF_INET6;
        memcpy(a, &in6->sin6_addr, 16);
    }
    return true;
}

int al_tcp_peer_uid(int fd, uid_t *uid)
{
    struct sockaddr_storage me, peer;
    socklen_t ml = sizeof(me), pl = sizeof(peer);
    if (getsockname(fd, (struct sockaddr *)&me, &ml) < 0 ||
        getpeername(fd, (struct sockaddr *)&peer, &pl) < 0)
        return -errno;
    struct {
        struct nlmsghdr nh;
        struct inet_diag_req_v2 r;
    } req = {
        .nh = {.nlmsg_len = sizeof(req),
               .nlmsg_type = SOCK_DIAG_BY_FAMILY,
               .nlmsg_flags = NLM_F_REQUEST},
        .r = {.sdiag_protocol = IPPROTO_TCP,
              .idiag_states = ~0u,
              .id.idiag_cookie = {INET_DIAG_NOCOOKIE, INET_DIAG_NOCOOKIE}},
    };
    int fam_me = 0, fam_peer = 0;
    /* The other end's socket: its own address is our peer's, its peer is us. */
    if (!diag_addr(&peer, &fam_peer, &req.r.id.idiag_sport, req.r.id.idiag_src) ||
        !diag_addr(&me, &fam_me, &req.r.id.idiag_dport, req.r.id.idiag_dst) || fam_me != fam_peer)
        return -EAFNOSUPPORT;
    req.r.sdiag_family = (__u8)fam_peer;
    _cleanup_close_ int nl = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (nl < 0)
        return -errno;
    /* The kernel answers at once; a bound keeps a caller from waiting on it regardless. */
    struct timeval tv = {.tv_sec = 2};
    struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
    if (setsockopt(nl, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0 ||
        sendto(nl, &req, sizeof(req), 0, (struct sockaddr *)&kernel, sizeof(kernel)) < 0)
        return -errno;
    union {
        struct nlmsghdr nh;
        char buf[8192];
    } ans;
    ssize_t n = recv(nl, &ans, sizeof(ans), 0);
    if (n < 0)
        return -errno;
    struct nlmsghdr *h = &ans.nh;
    if (!NLMSG_OK(h, (size_t)n))
        return -EIO;
    if (h->nlmsg_type == NLMSG_ERROR) {
        const struct nlmsgerr *e = NLMSG_DATA(h);
        if (h->nlmsg_len < NLMSG_LENGTH(sizeof(*e)))
            return -EIO;
        return e->error ? e->error : -ENOENT; /* ENOENT: no such socket here */
    }
    if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY ||
        h->nlmsg_len < NLMSG_LENGTH(sizeof(struct inet_diag_msg)))
        return -EIO;
    const struct inet_diag_msg *m = NLMSG_DATA(h);
    *uid = m->idiag_uid;
    return 0;
}

/* comm_tcp: the rendezvous of a torchrun-style launch (RANK, WORLD_SIZE, MASTER_ADDR,
 * MASTER_PORT; moe_comm_tcp_exchange in comm_internal.h), and moe_comm_share_blob, which
 * takes it or MPI by the launch. Rank 0 listens on MASTER_PORT (every interface of
 * MASTER_ADDR's family), every other rank connects to MASTER_ADDR:MASTER_PORT once, announces
 * itself and receives rank 0's blob (the NCCL unique id); then the connections close and NCCL does
 * all the communication. Plain POSIX sockets, IPv4 or IPv6 (getaddrinfo). The one thing a reader
 * must know: every wait is a poll() bounded by one deadline, so a missing rank ends in an error
 * naming it, never in a hang.
 *
 * Wire format (little-endian, base/bytes.h): the hello of rank r > 0 is magic "MOER", version,
 * rank, world (u32 each) and the blob length it expects (u64); rank 0 answers with magic, status
 * (0: the blob follows; else rank 0's moe_status, and a message saying why follows) and the length
 * (u64) of what follows. A connection whose first bytes are not a hello (a port scanner) is
 * ignored. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/bytes.h"
#include "dist/comm_internal.h"
#include "moe/log.h"

#define TCP_MAGIC 0x4d4f4552u /* "MOER" */
#define TCP_VERSION 1u
#define TCP_HELLO 24  /* bytes of a hello */
#define TCP_ANSWER 16 /* bytes of an answer's header */
#define TCP_BLOB_MAX (1u << 20)

/* The rendezvous one call runs: where, who, and until when. */
typedef struct tcp_meet {
    const char *addr;
    int port, rank, world;
    double timeout_s, deadline; /* deadline: moe_time_now() seconds, 0 = none */
} tcp_meet;

/* ---- bytes, deadlines ---- */

/* Milliseconds until m's deadline for poll(): -1 without one, 0 once it has passed. */
static int ms_left(const tcp_meet *m) {
    if (m->deadline <= 0) return -1;
    double ms = (m->deadline - moe_time_now()) * 1e3;
    return ms <= 0 ? 0 : ms > 1e9 ? 1000000000 : (int)ms + 1;
}

/* Reads (writing 0) or writes (writing 1) all of buf [n] on non-blocking fd by m's deadline.
 * Returns 0, ETIMEDOUT, EPIPE when the peer closed the connection, or another errno. */
static int io_full(int fd, void *buf, size_t n, int writing, const tcp_meet *m) {
    unsigned char *p = buf;
    while (n > 0) {
        struct pollfd pf = {.fd = fd, .events = writing ? POLLOUT : POLLIN};
        int r = poll(&pf, 1, ms_left(m));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return errno;
        if (r == 0) return ETIMEDOUT;
        ssize_t k = writing ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
        if (k < 0) return errno == ECONNRESET ? EPIPE : errno;
        if (k == 0) return EPIPE;
        p += k, n -= (size_t)k;
    }
    return 0;
}

/* What io_full's result rc means, for messages. */
static const char *io_what(int rc) {
    return rc == ETIMEDOUT ? "the deadline passed"
           : rc == EPIPE   ? "the peer closed the connection"
                           : strerror(rc);
}

static int set_nonblocking(int fd) {
    int fl = fcntl(fd, F_GETFL, 0);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* Resolves m's MASTER_ADDR:MASTER_PORT into *res (freeaddrinfo it); MOE_ERR_INPUT when it
 * does not resolve. passive: rank 0's listening side. */
static moe_status resolve(const tcp_meet *m, int passive, struct addrinfo **res, moe_err *err) {
    char port[16];
    snprintf(port, sizeof port, "%d", m->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0)};
    int rc = getaddrinfo(m->addr, port, &hints, res);
    if (rc == 0) return MOE_OK;
    moe_err_set(err, MOE_ERR_INPUT, NULL, "rank %d: MASTER_ADDR=%s does not resolve: %s", m->rank,
                m->addr, gai_strerror(rc));
    moe_err_hint(err, "set MASTER_ADDR to rank 0's host name or IP address, the same on every "
                      "rank");
    return MOE_ERR_INPUT;
}

/* ---- rank 0 ---- */

typedef struct tcp_peer {
    int fd, rank;
    char from[96]; /* "address port" of the connection: host[64] + " port " + serv[16] */
} tcp_peer;

/* sa with its address replaced by the wildcard of its family (the port kept). */
static void set_wildcard(struct sockaddr *sa) {
    if (sa->sa_family == AF_INET6)
        ((struct sockaddr_in6 *)sa)->sin6_addr = in6addr_any;
    else if (sa->sa_family == AF_INET)
        ((struct sockaddr_in *)sa)->sin_addr.s_addr = htonl(INADDR_ANY);
}

/* A non-blocking socket listening on MASTER_PORT of every interface of the families that
 * MASTER_ADDR resolves to (as torchrun's store does: rank 0's host name may resolve on rank 0
 * itself to a loopback alias such as Debian's 127.0.1.1), or -1 with err set (port in use, a
 * privileged port). */
static int listen_on(const tcp_meet *m, moe_err *err) {
    struct addrinfo *res;
    if (resolve(m, 1, &res, err) != MOE_OK) return -1;
    int fd = -1, why = 0;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) {
            why = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        set_wildcard(a->ai_addr);
        if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, m->world) != 0 ||
            set_nonblocking(fd) != 0) {
            why = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd >= 0) return fd;
    moe_err_set(err, MOE_ERR_INPUT, NULL,
                "rank 0 cannot listen on MASTER_ADDR=%s MASTER_PORT=%d: %s", m->addr, m->port,
                strerror(why));
    if (why == EADDRINUSE)
        moe_err_hint(err, "another process (an earlier run?) holds the port: choose another "
                          "MASTER_PORT for every rank, or end that process");
    else if (why == EACCES)
        moe_err_hint(err, "ports below 1024 need privileges: choose a MASTER_PORT above 1024");
    return -1;
}

/* Sends refusal `msg` of status st to peers [n]: best effort, within a second (m's deadline
 * may be over). */
static void refuse_all(const tcp_meet *m, tcp_peer *peers, int n, moe_status st, const char *msg) {
    tcp_meet soon = *m;
    soon.deadline = moe_time_now() + 1;
    size_t len = strlen(msg);
    uint8_t head[TCP_ANSWER];
    moe_put_u32(head, TCP_MAGIC), moe_put_u32(head + 4, (uint32_t)st), moe_put_u64(head + 8, len);
    for (int i = 0; i < n; i++)
        if (io_full(peers[i].fd, head, sizeof head, 1, &soon) == 0)
            io_full(peers[i].fd, (void *)msg, len, 1, &soon);
}

/* The ranks that have not arrived (seen [world]) as "2, 3, ..." into out [n]. */
static void list_missing(const char *seen, int world, char *out, size_t n) {
    size_t at = 0;
    out[0] = '\0';
    for (int r = 1, shown = 0; r < world && at + 16 < n; r++) {
        if (seen[r]) continue;
        if (shown++ == 16) {
            snprintf(out + at, n - at, ", ...");
            break;
        }
        at += (size_t)snprintf(out + at, n - at, "%s%d", at ? ", " : "", r);
    }
}

/* Checks hello h of the peer p against rank 0's m and blob_len (seen [world]: the ranks
 * already in); MOE_ERR_INPUT naming both sides' values. */
static moe_status check_hello(const tcp_meet *m, const uint8_t *h, size_t blob_len,
                              const tcp_peer *p, const tcp_peer *peers, int n, const char *seen,
                              moe_err *err) {
    uint32_t version = moe_get_u32(h + 4), rank = moe_get_u32(h + 8), world = moe_get_u32(h + 12);
    uint64_t len = moe_get_u64(h + 16);
    moe_status st = MOE_ERR_INPUT;
    if (version != TCP_VERSION) {
        moe_err_set(err, MOE_ERR_INPUT, NULL,
                    "the process at %s speaks rendezvous version %u, rank 0 version %u", p->from,
                    version, TCP_VERSION);
        moe_err_hint(err, "run the same moe-genomics build on every node");
    } else if ((int)world != m->world || world > 1u << 24) {
        moe_err_set(err, MOE_ERR_INPUT, NULL,
                    "rank %u (from %s) was started with WORLD_SIZE=%u, rank 0 with WORLD_SIZE=%d",
                    rank, p->from, world, m->world);
        moe_err_hint(err, "start every rank with the same WORLD_SIZE (one torchrun command per "
                          "node, the same --nnodes and --nproc-per-node)");
    } else if (rank < 1 || (int)rank >= m->world) {
        moe_err_set(err, MOE_ERR_INPUT, NULL,
                    "the process at %s announced RANK=%u: outside 1..%d of WORLD_SIZE=%d (rank 0 "
                    "is the listening process)",
                    p->from, rank, m->world - 1, m->world);
        moe_err_hint(err, "every process needs its own RANK in 0..WORLD_SIZE-1");
    } else if (seen[rank]) {
        const char *first = "";
        for (int i = 0; i < n; i++)
            if (peers[i].rank == (int)rank) first = peers[i].from;
        moe_err_set(err, MOE_ERR_INPUT, NULL,
                    "two processes announced RANK=%u: from %s and from %s", rank, first, p->from);
        moe_err_hint(err, "every process needs its own RANK in 0..WORLD_SIZE-1");
    } else if (len != blob_len) {
        moe_err_set(err, MOE_ERR_INPUT, NULL,
                    "rank %u (from %s) expects a %llu-byte id, rank 0 sends %zu bytes", rank,
                    p->from, (unsigned long long)len, blob_len);
        moe_err_hint(err, "run the same moe-genomics build on every node");
    } else {
        st = MOE_OK;
    }
    return st;
}

/* Accepts one connection on lfd and reads its hello into h [TCP_HELLO]. Returns 1 with *p
 * filled, 0 for a connection to ignore (closed early, not a hello), -1 when the deadline
 * passed, -2 for a socket error (errno). */
static int accept_hello(const tcp_meet *m, int lfd, tcp_peer *p, uint8_t *h) {
    struct pollfd pf = {.fd = lfd, .events = POLLIN};
    int r = poll(&pf, 1, ms_left(m));
    if (r < 0) return errno == EINTR ? 0 : -2;
    if (r == 0) return -1;
    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    p->fd = accept(lfd, (struct sockaddr *)&sa, &sl);
    if (p->fd < 0) return errno == EAGAIN || errno == EINTR || errno == ECONNABORTED ? 0 : -2;
    char host[64] = "?", serv[16] = "?";
    getnameinfo((struct sockaddr *)&sa, sl, host, sizeof host, serv, sizeof serv,
                NI_NUMERICHOST | NI_NUMERICSERV);
    snprintf(p->from, sizeof p->from, "%s port %s", host, serv);
    int rc = set_nonblocking(p->fd) ? errno : io_full(p->fd, h, TCP_HELLO, 0, m);
    if (rc == 0 && moe_get_u32(h) == TCP_MAGIC) return 1;
    close(p->fd);
    if (rc == ETIMEDOUT) return -1;
    moe_log_warn("rank 0: ignored a connection from %s to MASTER_PORT=%d (%s)", p->from, m->port,
                 rc ? io_what(rc) : "not a moe rank");
    return 0;
}

/* Rank 0: collects world - 1 hellos, then sends blob [blob_len] to each. */
static moe_status serve(const tcp_meet *m, const void *blob, size_t blob_len, moe_err *err) {
    int lfd = listen_on(m, err);
    if (lfd < 0) return err->status;
    tcp_peer *peers = calloc((size_t)m->world, sizeof *peers);
    char *seen = calloc((size_t)m->world, 1);
    int n = 0;
    moe_status st =
        peers && seen ? MOE_OK : moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    while (st == MOE_OK && n < m->world - 1) {
        uint8_t h[TCP_HELLO];
        int r = accept_hello(m, lfd, &peers[n], h);
        if (r == 0) continue;
        if (r == -2) {
            moe_err_set(err, MOE_ERR_RUNTIME, NULL, "rank 0: accept on MASTER_PORT=%d failed: %s",
                        m->port, strerror(errno));
            st = MOE_ERR_RUNTIME;
        } else if (r == -1) {
            char missing[160];
            list_missing(seen, m->world, missing, sizeof missing);
            moe_err_set(err, MOE_ERR_RUNTIME, NULL,
                        "rank 0 waited %g s at MASTER_ADDR=%s MASTER_PORT=%d: %d of %d ranks "
                        "arrived; missing: %s",
                        m->timeout_s, m->addr, m->port, n + 1, m->world, missing);
            moe_err_hint(err, "start every rank within the timeout, with the same MASTER_ADDR and "
                              "MASTER_PORT; check that the other nodes reach this address "
                              "(firewall, interface)");
            st = MOE_ERR_RUNTIME;
        } else if (check_hello(m, h, blob_len, &peers[n], peers, n, seen, err) != MOE_OK) {
            st = err->status;
            n++; /* it hears the refusal too */
        } else {
            peers[n].rank = (int)moe_get_u32(h + 8);
            seen[peers[n++].rank] = 1;
        }
    }
    if (st != MOE_OK) {
        refuse_all(m, peers, n, st, err->msg);
    } else {
        uint8_t head[TCP_ANSWER];
        moe_put_u32(head, TCP_MAGIC), moe_put_u32(head + 4, 0), moe_put_u64(head + 8, blob_len);
        for (int i = 0; i < n && st == MOE_OK; i++) {
            int rc = io_full(peers[i].fd, head, sizeof head, 1, m);
            if (rc == 0) rc = io_full(peers[i].fd, (void *)blob, blob_len, 1, m);
            if (rc)
                st = moe_err_set(err, MOE_ERR_RUNTIME, NULL,
                                 "rank 0 could not send the id to rank %d (%s): %s", peers[i].rank,
                                 peers[i].from, io_what(rc));
        }
    }
    for (int i = 0; i < n; i++)
        close(peers[i].fd);
    free(peers);
    free(seen);
    close(lfd);
    return st;
}

/* ---- ranks > 0 ---- */

/* One attempt to connect to any of res's addresses within a second (or the deadline):
 * a connected non-blocking fd, or -1 with *why = the last errno. */
static int connect_once(const tcp_meet *m, const struct addrinfo *res, int *why) {
    for (const struct addrinfo *a = res; a; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0 || set_nonblocking(fd) != 0) {
            *why = errno;
            if (fd >= 0) close(fd);
            continue;
        }
        int rc = connect(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
        if (rc == EINPROGRESS) {
            int left = ms_left(m);
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            int r = poll(&pf, 1, left < 0 || left > 1000 ? 1000 : left);
            socklen_t sl = sizeof rc;
            if (r <= 0)
                rc = r == 0 ? ETIMEDOUT : errno;
            else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &rc, &sl) != 0)
                rc = errno;
        }
        if (rc == 0) return fd;
        *why = rc;
        close(fd);
    }
    return -1;
}

/* Rank m->rank > 0: connects (retrying: rank 0 may start later), says hello, receives
 * blob [blob_len]. */
static moe_status join(const tcp_meet *m, void *blob, size_t blob_len, moe_err *err) {
    struct addrinfo *res;
    if (resolve(m, 0, &res, err) != MOE_OK) return err->status;
    int fd = -1, why = ETIMEDOUT;
    while ((fd = connect_once(m, res, &why)) < 0 && ms_left(m) != 0)
        nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
    freeaddrinfo(res);
    if (fd < 0) {
        moe_err_set(err, MOE_ERR_RUNTIME, NULL,
                    "rank %d could not reach rank 0 at MASTER_ADDR=%s MASTER_PORT=%d within %g s "
                    "(last error: %s)",
                    m->rank, m->addr, m->port, m->timeout_s, strerror(why));
        if (why == ECONNREFUSED)
            moe_err_hint(err, "nothing listens there: start rank 0 (within the timeout) and give "
                              "every rank the same MASTER_PORT");
        else
            moe_err_hint(err, "MASTER_ADDR must be rank 0's address, reachable from this node "
                              "(check the firewall and the network interface)");
        return MOE_ERR_RUNTIME;
    }
    uint8_t h[TCP_HELLO], a[TCP_ANSWER];
    moe_put_u32(h, TCP_MAGIC), moe_put_u32(h + 4, TCP_VERSION),
        moe_put_u32(h + 8, (uint32_t)m->rank);
    moe_put_u32(h + 12, (uint32_t)m->world), moe_put_u64(h + 16, blob_len);
    int rc = io_full(fd, h, sizeof h, 1, m);
    if (rc == 0) rc = io_full(fd, a, sizeof a, 0, m);
    moe_status st = MOE_OK;
    uint64_t len = rc ? 0 : moe_get_u64(a + 8);
    if (rc) {
        st = moe_err_set(err, MOE_ERR_RUNTIME, NULL,
                         "rank %d: no answer from rank 0 at MASTER_ADDR=%s MASTER_PORT=%d within "
                         "%g s: %s",
                         m->rank, m->addr, m->port, m->timeout_s, io_what(rc));
        moe_err_hint(err, "rank 0 reports why it gave up; every rank needs the same WORLD_SIZE");
    } else if (moe_get_u32(a) != TCP_MAGIC || (moe_get_u32(a + 4) == 0 && len != blob_len)) {
        st = moe_err_set(err, MOE_ERR_INPUT, NULL,
                         "rank %d: what listens at MASTER_ADDR=%s MASTER_PORT=%d is not rank 0 of "
                         "this run (its answer is not an id of %zu bytes)",
                         m->rank, m->addr, m->port, blob_len);
        moe_err_hint(err, "choose a MASTER_PORT no other service uses, the same on every rank");
    } else if (moe_get_u32(a + 4) != 0) {
        char why_msg[sizeof err->msg] = "";
        size_t k = len < sizeof why_msg - 1 ? (size_t)len : sizeof why_msg - 1;
        io_full(fd, why_msg, k, 0, m);
        why_msg[k] = '\0';
        st = moe_get_u32(a + 4) == MOE_ERR_RUNTIME ? MOE_ERR_RUNTIME : MOE_ERR_INPUT;
        moe_err_set(err, st, NULL, "rank %d: rank 0 refused the launch: %s", m->rank, why_msg);
        moe_err_hint(err, "rank 0's message says which variable differs");
    } else if ((rc = io_full(fd, blob, blob_len, 0, m)) != 0) {
        st = moe_err_set(err, MOE_ERR_RUNTIME, NULL, "rank %d: receiving the id from rank 0: %s",
                         m->rank, io_what(rc));
    }
    close(fd);
    return st;
}

moe_status moe_comm_tcp_exchange(const char *addr, int port, int rank, int world, void *blob,
                                 size_t blob_len, double timeout_s, moe_err *err) {
    if (!addr || !addr[0] || port < 1 || port > 65535 || world < 1 || rank < 0 || rank >= world ||
        blob_len > TCP_BLOB_MAX) {
        moe_err_set(err, MOE_ERR_INPUT, NULL,
                    "rendezvous of RANK=%d WORLD_SIZE=%d at MASTER_ADDR=%s MASTER_PORT=%d: "
                    "expected 0 <= RANK < WORLD_SIZE, a MASTER_ADDR and a port in 1..65535",
                    rank, world, addr ? addr : "(unset)", port);
        moe_err_hint(err, "set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT for every rank, as "
                          "torchrun does");
        return MOE_ERR_INPUT;
    }
    if (world == 1) return MOE_OK; /* rank 0 alone already holds the blob */
    tcp_meet m = {.addr = addr,
                  .port = port,
                  .rank = rank,
                  .world = world,
                  .timeout_s = timeout_s,
                  .deadline = timeout_s > 0 ? moe_time_now() + timeout_s : 0};
    return rank == 0 ? serve(&m, blob, blob_len, err) : join(&m, blob, blob_len, err);
}

moe_status moe_comm_share_blob(const moe_comm *c, void *blob, size_t len, moe_err *err) {
    if (c->world == 1) return MOE_OK;
    if (!c->torchrun)
        return moe_comm_broadcast(c, MOE_COMM_WORLD, blob, (int64_t)len, MOE_COMM_BYTE, 0, err);
    return moe_comm_tcp_exchange(c->master_addr, c->master_port, c->rank, c->world, blob, len,
                                 c->timeout_s, err);
}

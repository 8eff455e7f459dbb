/* test_comm_tcp: the TCP rendezvous of a torchrun-style launch (moe_comm_tcp_exchange,
 * dist/comm_tcp.c) between forked processes on the loopback: four ranks (rank 0 starting
 * last, so the others retry) all get rank 0's 128-byte blob, over IPv4 and, where the machine
 * has it, IPv6; a connection that is not a rank is ignored; and the launches that must fail
 * do, with the message that says why: a WORLD_SIZE mismatch, a duplicate RANK, a different
 * blob length, a missing rank (within the 1 s timeout), no rank 0, a port already in use,
 * arguments out of range. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dist/comm_internal.h"
#include "moe/log.h"
#include "testlib.h"

#define BLOB 128

/* What one rank's process reports back. */
typedef struct outcome {
    moe_status status;
    char msg[1024];
    unsigned char blob[BLOB];
} outcome;

typedef struct rank_proc {
    pid_t pid;
    int fd; /* read end of its pipe */
} rank_proc;

static unsigned char pattern(int i) {
    return (unsigned char)(i * 37 + 11);
}

static void sleep_ms(int ms) {
    nanosleep(&(struct timespec){ms / 1000, (long)(ms % 1000) * 1000000L}, NULL);
}

/* Forks a process that, after delay_ms, runs the exchange as rank of world at addr:port with
 * a blob of len bytes (rank 0's holds the pattern) and writes its outcome to a pipe. */
static rank_proc start_rank(const char *addr, int port, int rank, int world, size_t len,
                            double timeout_s, int delay_ms) {
    int p[2];
    rank_proc rp = {-1, -1};
    if (pipe(p) != 0) return rp;
    rp.pid = fork();
    if (rp.pid == 0) {
        close(p[0]);
        sleep_ms(delay_ms);
        outcome o;
        memset(&o, 0, sizeof o);
        for (int i = 0; i < BLOB; i++)
            o.blob[i] = rank == 0 ? pattern(i) : 0;
        moe_err err;
        moe_err_clear(&err);
        o.status = moe_comm_tcp_exchange(addr, port, rank, world, o.blob, len, timeout_s, &err);
        snprintf(o.msg, sizeof o.msg, "%s", err.msg);
        ssize_t w = write(p[1], &o, sizeof o);
        _exit(w == (ssize_t)sizeof o ? 0 : 1);
    }
    close(p[1]);
    rp.fd = p[0];
    return rp;
}

/* Waits for rp's process and reads its outcome into *o (status RUNTIME if it sent none). */
static void finish_rank(rank_proc rp, outcome *o) {
    memset(o, 0, sizeof *o);
    o->status = MOE_ERR_RUNTIME;
    size_t got = 0;
    while (rp.fd >= 0 && got < sizeof *o) {
        ssize_t k = read(rp.fd, (char *)o + got, sizeof *o - got);
        if (k <= 0) break;
        got += (size_t)k;
    }
    if (got != sizeof *o) snprintf(o->msg, sizeof o->msg, "(the rank's process reported nothing)");
    if (rp.fd >= 0) close(rp.fd);
    if (rp.pid > 0) waitpid(rp.pid, NULL, 0);
}

/* A port free on the loopback of family af (AF_INET or AF_INET6), 0 when there is none. */
static int free_port(int af) {
    int fd = socket(af, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    socklen_t sl;
    if (af == AF_INET) {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET, a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        sl = sizeof *a;
    } else {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6, a->sin6_addr = in6addr_loopback;
        sl = sizeof *a;
    }
    int port = 0;
    if (bind(fd, (struct sockaddr *)&ss, sl) == 0 &&
        getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
        port = ntohs(af == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
                                   : ((struct sockaddr_in6 *)&ss)->sin6_port);
    close(fd);
    return port;
}

/* world ranks at addr, rank 0 started 300 ms after the others: everyone gets the blob. */
static void test_ok(const char *addr, int af, int world) {
    int port = free_port(af);
    if (!port) {
        printf("note: no %s loopback here; that case is skipped\n", addr);
        return;
    }
    rank_proc rp[8];
    for (int r = 0; r < world; r++)
        rp[r] = start_rank(addr, port, r, world, BLOB, 20, r == 0 ? 300 : 0);
    for (int r = 0; r < world; r++) {
        outcome o;
        finish_rank(rp[r], &o);
        CHECK_MSG(o.status == MOE_OK, "%s rank %d of %d: %s", addr, r, world, o.msg);
        int same = 1;
        for (int i = 0; i < BLOB; i++)
            same &= o.blob[i] == pattern(i);
        CHECK_MSG(same, "%s rank %d did not receive rank 0's blob", addr, r);
    }
}

/* A connection that sends bytes other than a hello is ignored; the real rank 1 then joins. */
static void test_stray_connection(void) {
    int port = free_port(AF_INET);
    rank_proc r0 = start_rank("127.0.0.1", port, 0, 2, BLOB, 20, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int fd = -1, connected = 0;
    for (int tries = 0; tries < 200 && !connected; tries++) {
        if (fd >= 0) close(fd);
        fd = socket(AF_INET, SOCK_STREAM, 0);
        connected = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
        if (!connected) sleep_ms(20);
    }
    CHECK(connected);
    const char junk[] = "GET / HTTP/1.0\r\n\r\n......";
    CHECK(write(fd, junk, 24) == 24);
    close(fd);
    rank_proc r1 = start_rank("127.0.0.1", port, 1, 2, BLOB, 20, 100);
    outcome o0, o1;
    finish_rank(r0, &o0);
    finish_rank(r1, &o1);
    CHECK_MSG(o0.status == MOE_OK, "rank 0: %s", o0.msg);
    CHECK_MSG(o1.status == MOE_OK && o1.blob[5] == pattern(5), "rank 1: %s", o1.msg);
}

/* Runs world_of[r] / rank_of[r] for n processes and checks each fails with status st[r]
 * and a message holding want[r] (NULL: any); 1 s timeout. */
static void expect_failures(const char *what, int n, const int *rank_of, const int *world_of,
                            const size_t *len_of, const moe_status *st, const char *const *want) {
    int port = free_port(AF_INET);
    rank_proc rp[4];
    double t0 = moe_time_now();
    for (int i = 0; i < n; i++)
        rp[i] = start_rank("127.0.0.1", port, rank_of[i], world_of[i], len_of[i], 1.0, 100 * i);
    for (int i = 0; i < n; i++) {
        outcome o;
        finish_rank(rp[i], &o);
        CHECK_MSG(o.status == st[i], "%s: process %d (rank %d): status %d, want %d: %s", what, i,
                  rank_of[i], (int)o.status, (int)st[i], o.msg);
        CHECK_MSG(!want[i] || strstr(o.msg, want[i]), "%s: process %d: '%s' lacks '%s'", what, i,
                  o.msg, want[i]);
    }
    double dt = moe_time_now() - t0;
    CHECK_MSG(dt < 4.0, "%s: took %.1f s with a timeout of 1 s", what, dt);
}

static void test_refusals(void) {
    {
        const int rank[] = {0, 1}, world[] = {2, 3};
        const size_t len[] = {BLOB, BLOB};
        const moe_status st[] = {MOE_ERR_INPUT, MOE_ERR_INPUT};
        /* both sides' values, and the same message on both ends */
        const char *const want[] = {"was started with WORLD_SIZE=3, rank 0 with WORLD_SIZE=2",
                                    "refused the launch: rank 1 (from 127.0.0.1 port"};
        expect_failures("world mismatch", 2, rank, world, len, st, want);
    }
    {
        const int rank[] = {0, 1, 1}, world[] = {3, 3, 3};
        const size_t len[] = {BLOB, BLOB, BLOB};
        const moe_status st[] = {MOE_ERR_INPUT, MOE_ERR_INPUT, MOE_ERR_INPUT};
        const char *const want[] = {"two processes announced RANK=1: from 127.0.0.1",
                                    "refused the launch: two processes announced RANK=1",
                                    "refused the launch: two processes announced RANK=1"};
        expect_failures("duplicate rank", 3, rank, world, len, st, want);
    }
    {
        const int rank[] = {0, 1}, world[] = {2, 2};
        const size_t len[] = {BLOB, 64};
        const moe_status st[] = {MOE_ERR_INPUT, MOE_ERR_INPUT};
        const char *const want[] = {"expects a 64-byte id, rank 0 sends 128 bytes",
                                    "expects a 64-byte id, rank 0 sends 128 bytes"};
        expect_failures("blob length", 2, rank, world, len, st, want);
    }
    {
        /* rank 2 never starts: rank 0 says so within the timeout, and rank 1 fails too
         * (rank 0's refusal, or its own deadline: whichever comes first) */
        const int rank[] = {0, 1}, world[] = {3, 3};
        const size_t len[] = {BLOB, BLOB};
        const moe_status st[] = {MOE_ERR_RUNTIME, MOE_ERR_RUNTIME};
        const char *const want[] = {"2 of 3 ranks arrived; missing: 2", NULL};
        expect_failures("missing rank", 2, rank, world, len, st, want);
    }
    {
        const int rank[] = {1}, world[] = {2};
        const size_t len[] = {BLOB};
        const moe_status st[] = {MOE_ERR_RUNTIME};
        const char *const want[] = {"could not reach rank 0 at MASTER_ADDR=127.0.0.1 MASTER_PORT="};
        expect_failures("no rank 0", 1, rank, world, len, st, want);
    }
}

/* Rank 0 on a port another socket listens on: refused at once with the port-in-use hint. */
static void test_port_in_use(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof a;
    CHECK(bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 1) == 0);
    CHECK(getsockname(fd, (struct sockaddr *)&a, &sl) == 0);
    int port = ntohs(a.sin_port);
    unsigned char blob[BLOB] = {0};
    moe_err err;
    moe_err_clear(&err);
    double t0 = moe_time_now();
    CHECK(moe_comm_tcp_exchange("127.0.0.1", port, 0, 2, blob, BLOB, 5, &err) == MOE_ERR_INPUT);
    CHECK(moe_time_now() - t0 < 1.0);
    char want[96];
    snprintf(want, sizeof want, "cannot listen on MASTER_ADDR=127.0.0.1 MASTER_PORT=%d", port);
    CHECK_MSG(strstr(err.msg, want) && strstr(err.msg, strerror(EADDRINUSE)), "%s", err.msg);
    CHECK_MSG(strstr(err.hint, "choose another MASTER_PORT"), "%s", err.hint);
    close(fd);
}

static void test_arguments(void) {
    unsigned char blob[BLOB] = {0};
    moe_err err;
    moe_err_clear(&err);
    CHECK(moe_comm_tcp_exchange("127.0.0.1", 29500, 2, 2, blob, BLOB, 1, &err) == MOE_ERR_INPUT);
    CHECK_MSG(strstr(err.msg, "RANK=2 WORLD_SIZE=2"), "%s", err.msg);
    moe_err_clear(&err);
    CHECK(moe_comm_tcp_exchange("127.0.0.1", 70000, 0, 2, blob, BLOB, 1, &err) == MOE_ERR_INPUT);
    moe_err_clear(&err);
    CHECK(moe_comm_tcp_exchange("no-such-host.invalid", 29500, 1, 2, blob, BLOB, 1, &err) ==
          MOE_ERR_INPUT);
    CHECK_MSG(strstr(err.msg, "MASTER_ADDR=no-such-host.invalid does not resolve"), "%s", err.msg);
    moe_err_clear(&err); /* world 1: nothing to exchange, no socket */
    CHECK(moe_comm_tcp_exchange("127.0.0.1", 1, 0, 1, blob, BLOB, 1, &err) == MOE_OK);
}

int main(void) {
    test_arguments();
    test_port_in_use();
    test_ok("127.0.0.1", AF_INET, 4);
    test_ok("::1", AF_INET6, 2);
    test_stray_connection();
    test_refusals();
    return test_summary("comm_tcp");
}

/* test_comm: the collectives of moe/comm.h. Run alone (ctest unit.comm) it checks the
 * one-process semantics: sums and slices untouched, all-to-all and gather copying their own
 * part, a self-count mismatch refused. Started by mpirun (e2e.comm_mpi runs it on 3 and 4
 * ranks) every rank checks the real exchanges against values it can compute: uneven
 * reduce-scatter and all-gather slices with an empty one, all-to-all(v) with zero counts
 * between some pairs, gather, broadcast, barrier, and the dp x ep groups (ep = 2 on an even
 * world: rank = d * ep + e) - once as they run, once with moe_comm.chunk = 2 so that every
 * operation takes its chunked path (what counts beyond MPI's int need); the reduce-scatter
 * also of bf16 values (MOE_COMM_BF16, summed as values); and
 * moe_comm_share_blob (rank 0's bytes on every rank). */
#include <stdlib.h>
#include <string.h>

#include "moe/comm.h"
#include "moe/dtype.h"
#include "testlib.h"

/* Slices of sizes 0, 1, ..., n - 1 (rank 0's is empty) into off [n + 1]. */
static void uneven(int n, int64_t *off) {
    off[0] = 0;
    for (int r = 0; r < n; r++)
        off[r + 1] = off[r] + r;
}

static void test_groups(const moe_comm *c) {
    int ep = c->ep;
    CHECK_INT_EQ(c->dp * c->ep, c->world);
    CHECK_INT_EQ(c->gsize[MOE_COMM_WORLD], c->world);
    CHECK_INT_EQ(c->gsize[MOE_COMM_EP], ep);
    CHECK_INT_EQ(c->gsize[MOE_COMM_DP], c->world / ep);
    CHECK_INT_EQ(c->grank[MOE_COMM_EP], c->rank % ep);
    CHECK_INT_EQ(c->grank[MOE_COMM_DP], c->rank / ep);
    moe_err err;
    moe_err_clear(&err);
    /* the sum of world ranks over each group tells which ranks it holds */
    for (int g = 0; g < MOE_COMM_N_GROUPS; g++) {
        int64_t x = c->rank, want = 0;
        for (int r = 0; r < c->world; r++) {
            int same = g == MOE_COMM_WORLD ||
                       (g == MOE_COMM_EP ? r / ep == c->rank / ep : r % ep == c->rank % ep);
            want += same ? r : 0;
        }
        CHECK(moe_comm_allreduce(c, g, &x, 1, MOE_COMM_I64, &err) == MOE_OK);
        CHECK_INT_EQ(x, want);
    }
}

static void test_allreduce(const moe_comm *c) {
    int W = c->world, r = c->rank;
    moe_err err;
    moe_err_clear(&err);
    float f[5];
    double d[5];
    for (int i = 0; i < 5; i++)
        f[i] = (float)(r + i), d[i] = 0.5 * (r + i);
    CHECK(moe_comm_allreduce(c, MOE_COMM_WORLD, f, 5, MOE_COMM_F32, &err) == MOE_OK);
    CHECK(moe_comm_allreduce(c, MOE_COMM_WORLD, d, 5, MOE_COMM_F64, &err) == MOE_OK);
    for (int i = 0; i < 5; i++) {
        double want = (double)W * i + W * (W - 1) / 2.0;
        CHECK_NEAR(f[i], want, 0);
        CHECK_NEAR(d[i], 0.5 * want, 0);
    }
}

static void test_slices(const moe_comm *c) {
    int W = c->world, r = c->rank;
    moe_err err;
    moe_err_clear(&err);
    int64_t *off = malloc((size_t)(W + 1) * sizeof *off);
    uneven(W, off);
    int64_t n = off[W] ? off[W] : 1;
    float *buf = malloc((size_t)n * sizeof *buf);
    for (int64_t i = 0; i < off[W]; i++)
        buf[i] = (float)((r + 1) * (i + 1));
    CHECK(moe_comm_reduce_scatter(c, MOE_COMM_WORLD, buf, off, MOE_COMM_F32, &err) == MOE_OK);
    for (int64_t i = off[r]; i < off[r + 1]; i++) /* sum over ranks of (rank + 1) (i + 1) */
        CHECK_NEAR(buf[i], (double)(i + 1) * W * (W + 1) / 2.0, 0);
    /* the same sums of bf16 values (the experts' gradients: MOE_COMM_BF16), small integers
     * whose sums bf16 holds exactly: summed as values, not as 2-byte codes */
    uint16_t *b16 = malloc((size_t)n * sizeof *b16);
    for (int64_t i = 0; i < off[W]; i++)
        b16[i] = moe_f32_to_bf16((float)((r + 1) * (i + 1)));
    CHECK(moe_comm_reduce_scatter(c, MOE_COMM_WORLD, b16, off, MOE_COMM_BF16, &err) == MOE_OK);
    for (int64_t i = off[r]; i < off[r + 1]; i++)
        CHECK_NEAR(moe_bf16_to_f32(b16[i]), (double)(i + 1) * W * (W + 1) / 2.0, 0);
    CHECK_INT_EQ(moe_comm_dtype_size(MOE_COMM_BF16), 2);
    free(b16);
    for (int64_t i = 0; i < off[W]; i++)
        if (i < off[r] || i >= off[r + 1])
            buf[i] = -1.0f; /* only the owner's slice counts */
        else
            buf[i] = (float)(1000 * r + i);
    CHECK(moe_comm_allgather(c, MOE_COMM_WORLD, buf, off, MOE_COMM_F32, &err) == MOE_OK);
    for (int s = 0; s < W; s++)
        for (int64_t i = off[s]; i < off[s + 1]; i++)
            CHECK_NEAR(buf[i], 1000.0 * s + (double)i, 0);
    /* gather to the last rank: its full buffer gets every slice, `mine` is separate memory */
    int root = W - 1;
    float *full = r == root ? calloc((size_t)n, sizeof *full) : NULL;
    float *mine = malloc((size_t)(off[r + 1] - off[r] + 1) * sizeof *mine);
    for (int64_t i = 0; i < off[r + 1] - off[r]; i++)
        mine[i] = (float)(7 * r + i);
    CHECK(moe_comm_gather(c, MOE_COMM_WORLD, full, mine, off, root, MOE_COMM_F32, &err) == MOE_OK);
    for (int s = 0; full && s < W; s++)
        for (int64_t i = 0; i < off[s + 1] - off[s]; i++)
            CHECK_NEAR(full[off[s] + i], 7.0 * s + (double)i, 0);
    /* the same with 2-byte elements (bf16 AdamW moments: MOE_COMM_U16), into rank 0 */
    uint16_t *full16 = r == 0 ? calloc((size_t)n, sizeof *full16) : NULL;
    uint16_t *mine16 = malloc((size_t)(off[r + 1] - off[r] + 1) * sizeof *mine16);
    for (int64_t i = 0; i < off[r + 1] - off[r]; i++)
        mine16[i] = (uint16_t)(0x3f80 + 256 * r + i);
    CHECK(moe_comm_gather(c, MOE_COMM_WORLD, full16, mine16, off, 0, MOE_COMM_U16, &err) == MOE_OK);
    for (int s = 0; full16 && s < W; s++)
        for (int64_t i = 0; i < off[s + 1] - off[s]; i++)
            CHECK_INT_EQ(full16[off[s] + i], (uint16_t)(0x3f80 + 256 * s + i));
    CHECK_INT_EQ(moe_comm_dtype_size(MOE_COMM_U16), 2);
    free(full16);
    free(mine16);
    free(full);
    free(mine);
    free(buf);
    free(off);
}

/* Element k of what rank `from` sends rank `to`. */
static int64_t a2a_value(int from, int to, int64_t k) {
    return (int64_t)from * 10000 + (int64_t)to * 100 + k;
}

/* All-to-all(v) over group g where rank p of g sends (p + q) % 3 elements to rank q: zero
 * between some pairs, and to itself for p = q = 0. */
static void test_alltoallv(const moe_comm *c, moe_comm_group g) {
    int n = c->gsize[g], me = c->grank[g];
    moe_err err;
    moe_err_clear(&err);
    int64_t *sc = malloc((size_t)n * sizeof *sc), *rc = malloc((size_t)n * sizeof *rc);
    int64_t ns = 0, nr = 0;
    for (int q = 0; q < n; q++)
        sc[q] = (me + q) % 3, rc[q] = (q + me) % 3, ns += sc[q], nr += rc[q];
    int64_t *send = malloc((size_t)(ns + 1) * sizeof *send);
    int64_t *recv = malloc((size_t)(nr + 1) * sizeof *recv);
    for (int q = 0, at = 0; q < n; q++)
        for (int64_t k = 0; k < sc[q]; k++)
            send[at++] = a2a_value(me, q, k);
    CHECK(moe_comm_alltoallv(c, g, send, sc, recv, rc, MOE_COMM_I64, &err) == MOE_OK);
    for (int s = 0, at = 0; s < n; s++)
        for (int64_t k = 0; k < rc[s]; k++, at++)
            CHECK_MSG(recv[at] == a2a_value(s, me, k), "group %d: from %d element %lld: %lld",
                      (int)g, s, (long long)k, (long long)recv[at]);
    /* everything to one rank (rows of bytes), nothing to the others */
    int64_t one = 3;
    for (int q = 0; q < n; q++)
        sc[q] = q == 0 ? one : 0, rc[q] = me == 0 ? one : 0;
    char bs[3] = {(char)me, 'x', 'y'}, *br = malloc((size_t)(3 * n));
    CHECK(moe_comm_alltoallv(c, g, bs, sc, br, rc, MOE_COMM_BYTE, &err) == MOE_OK);
    for (int s = 0; me == 0 && s < n; s++)
        CHECK(br[3 * s] == (char)s && br[3 * s + 1] == 'x' && br[3 * s + 2] == 'y');
    /* the counts to itself must match */
    for (int q = 0; q < n; q++)
        sc[q] = rc[q] = 0;
    sc[me] = 1;
    CHECK(moe_comm_alltoallv(c, g, send, sc, recv, rc, MOE_COMM_I64, &err) == MOE_ERR_RUNTIME);
    free(br);
    free(send);
    free(recv);
    free(sc);
    free(rc);
}

static void test_broadcast_barrier(const moe_comm *c) {
    moe_err err;
    moe_err_clear(&err);
    double v[3] = {c->rank, c->rank + 0.5, -1};
    int root = c->world - 1;
    CHECK(moe_comm_broadcast(c, MOE_COMM_WORLD, v, 3, MOE_COMM_F64, root, &err) == MOE_OK);
    CHECK_NEAR(v[0], root, 0);
    CHECK_NEAR(v[1], root + 0.5, 0);
    CHECK(moe_comm_barrier(c, MOE_COMM_WORLD, &err) == MOE_OK);
    CHECK(moe_comm_barrier(c, MOE_COMM_EP, &err) == MOE_OK);
    CHECK(moe_comm_barrier(c, MOE_COMM_DP, &err) == MOE_OK);
}

/* moe_comm_share_blob: rank 0's bytes on every rank (an MPI broadcast here). */
static void test_share_blob(const moe_comm *c) {
    moe_err err;
    moe_err_clear(&err);
    unsigned char blob[128];
    for (int i = 0; i < 128; i++)
        blob[i] = c->rank == 0 ? (unsigned char)(5 * i + 2) : 0;
    CHECK(moe_comm_share_blob(c, blob, sizeof blob, &err) == MOE_OK);
    for (int i = 0; i < 128; i++)
        CHECK_INT_EQ(blob[i], (unsigned char)(5 * i + 2));
}

/* moe_comm_stats: each operation counted once in its group; the all-to-alls' bytes are the
 * ones sent to the other ranks (here every rank sends q + 1 elements to rank q). */
static void test_stats(moe_comm *c) {
    moe_err err;
    moe_err_clear(&err);
    (void)moe_comm_stats_take(c);
    double v = 1.0;
    CHECK(moe_comm_allreduce(c, MOE_COMM_WORLD, &v, 1, MOE_COMM_F64, &err) == MOE_OK);
    const int n = c->gsize[MOE_COMM_EP], me = c->grank[MOE_COMM_EP];
    int64_t sc[64], rc[64], buf[64 * 65], out[64 * 65], sent = 0;
    for (int q = 0; q < n && n <= 64; q++) {
        sc[q] = q + 1, rc[q] = me + 1;
        if (q != me) sent += (q + 1) * (int64_t)sizeof(int64_t);
    }
    memset(buf, 0, sizeof buf);
    CHECK(moe_comm_alltoallv(c, MOE_COMM_EP, buf, sc, out, rc, MOE_COMM_I64, &err) == MOE_OK);
    const moe_comm_stats st = moe_comm_stats_take(c);
    CHECK_INT_EQ(st.calls[MOE_COMM_WORLD], 1);
    CHECK_INT_EQ(st.calls[MOE_COMM_EP], 1);
    CHECK_INT_EQ(st.calls[MOE_COMM_DP], 0);
    CHECK(st.a2a_bytes == sent);
    CHECK(st.a2a_seconds >= 0 && st.a2a_seconds <= st.seconds[MOE_COMM_EP]);
    const moe_comm_stats none = moe_comm_stats_take(c); /* taken: zero again */
    CHECK(none.calls[MOE_COMM_WORLD] == 0 && none.a2a_bytes == 0 && none.seconds[0] == 0);
}

int main(int argc, char **argv) {
    moe_comm c;
    moe_err err;
    moe_err_clear(&err);
    if (moe_comm_init(&c, &argc, &argv, &err) != MOE_OK) {
        fprintf(stderr, "moe_comm_init: %s\n", err.msg);
        return 1;
    }
    int ep = c.world % 2 == 0 ? 2 : 1;
    CHECK(moe_comm_split(&c, c.world + 1, 30, &err) == MOE_ERR_INPUT); /* must divide */
    CHECK(moe_comm_split(&c, ep, 30, &err) == MOE_OK);
    test_groups(&c);
    for (int pass = 0; pass < 2; pass++) { /* MPI's int limit, then chunks of 2 elements */
        c.chunk = pass ? 2 : c.chunk;
        test_allreduce(&c);
        test_slices(&c);
        test_alltoallv(&c, MOE_COMM_WORLD);
        test_alltoallv(&c, MOE_COMM_EP);
        test_alltoallv(&c, MOE_COMM_DP);
        test_broadcast_barrier(&c);
    }
    test_share_blob(&c);
    test_stats(&c);
    char name[32];
    snprintf(name, sizeof name, "comm[rank %d of %d]", c.rank, c.world);
    int rc = test_summary(name);
    moe_comm_finalize(&c);
    return rc;
}

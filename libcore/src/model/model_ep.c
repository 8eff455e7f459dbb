/* model_ep: expert parallelism inside the MoE block - the token rows of this rank go to the
 * ranks that own their experts and come back, through the all-to-all hook of moe_model_ep
 * (the model knows no transport). Per layer, after the routing:
 *   1. counts: rank r gets, for each of its local experts j, how many rows each rank sends
 *      (one all-to-all of E / ep integers per rank), kept per layer for the backward;
 *   2. rows: the routed rows xp are already sorted by global expert, so rank r's share is
 *      one contiguous range; they arrive grouped by source rank and are regrouped so that
 *      each local expert's rows are contiguous (xe, the grouped matmul's input);
 *   3. after the experts the reverse: outputs regrouped by source rank and sent back.
 * The backward sends dyp the way xp went (step 2, the counts of step 1) and brings dxe back
 * the way ye came. A rank or expert with no rows is an empty range everywhere. */
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"

/* Records the first failure of the pass (the caller's pass returns it). */
static void fail(moe_model *m, const moe_err *err) {
    if (m->ep_status != MOE_OK) return;
    m->ep_status = err->status;
    m->ep_err = *err;
}

/* n int64 of host scratch (free it), or NULL with the failure recorded. */
static int64_t *scratch(moe_model *m, int64_t n) {
    int64_t *p = malloc((size_t)n * sizeof *p);
    if (p) return p;
    moe_err err;
    moe_err_clear(&err);
    moe_err_set(&err, MOE_ERR_RUNTIME, NULL, "out of host memory");
    fail(m, &err);
    return NULL;
}

const int32_t *moe_model_expert_rows(const moe_model *m, int l, int64_t *El, int64_t *R) {
    const struct moe_acts *a = m->acts;
    int64_t E = m->cfg.num_local_experts;
    if (a->ep <= 1) {
        const int32_t *hoff = a->h_offsets + (int64_t)l * (E + 1);
        *El = E;
        *R = hoff[E];
        return hoff;
    }
    *El = E / a->ep;
    const int32_t *eoff = a->ep_off + (int64_t)l * (*El + 1);
    *R = eoff[*El];
    return eoff;
}

/* Rows per peer of layer l: to[r] = routed rows for rank r's experts, from[s] = rows from
 * rank s to this rank's experts (rows: [P, El] from ep_rows). */
static void peer_rows(const moe_model *m, int l, int64_t *to, int64_t *from) {
    const struct moe_acts *a = m->acts;
    int64_t E = m->cfg.num_local_experts, P = a->ep, El = E / P;
    const int32_t *hoff = a->h_offsets + (int64_t)l * (E + 1);
    const int64_t *rows = a->ep_rows + (int64_t)l * E;
    for (int64_t r = 0; r < P; r++) {
        to[r] = hoff[(r + 1) * El] - hoff[r * El];
        from[r] = 0;
        for (int64_t j = 0; j < El; j++)
            from[r] += rows[r * El + j];
    }
}

/* Copies the R rows of layer l between source-rank order (src_major [R, row_bytes]: rank
 * 0's rows of local experts 0, 1, ..., then rank 1's) and local-expert order (expert_major,
 * xe's). to_expert: 1 source -> expert order, 0 the reverse. */
static void regroup(const moe_model *m, int l, void *expert_major, void *src_major,
                    size_t row_bytes, int to_expert) {
    const moe_backend *be = m->be;
    const struct moe_acts *a = m->acts;
    int64_t E = m->cfg.num_local_experts, P = a->ep, El = E / P;
    const int64_t *rows = a->ep_rows + (int64_t)l * E;
    const int32_t *eoff = a->ep_off + (int64_t)l * (El + 1);
    int64_t at = 0; /* row in source-rank order */
    for (int64_t s = 0; s < P; s++)
        for (int64_t j = 0; j < El; j++) {
            int64_t n = rows[s * El + j], row = eoff[j];
            for (int64_t q = 0; q < s; q++) /* the rows of lower ranks come first */
                row += rows[q * El + j];
            char *e = (char *)expert_major + (size_t)row * row_bytes;
            char *r = (char *)src_major + (size_t)at * row_bytes;
            if (n > 0)
                be->memcpy_d2d(be, to_expert ? e : r, to_expert ? r : e, (size_t)n * row_bytes);
            at += n;
        }
}

void moe_model_ep_dispatch(moe_model *m, int l, const void *src, void *dst, size_t row_bytes,
                           int exchange_counts) {
    struct moe_acts *a = m->acts;
    if (m->ep_status != MOE_OK) return;
    int64_t E = m->cfg.num_local_experts, P = a->ep, El = E / P;
    int64_t *tmp = scratch(m, E + 3 * P);
    if (!tmp) return;
    moe_err err;
    moe_err_clear(&err);
    int64_t *cnt = tmp, *ones = tmp + E, *to = ones + P, *from = to + P;
    if (exchange_counts) {
        const int32_t *hoff = a->h_offsets + (int64_t)l * (E + 1);
        int64_t *rows = a->ep_rows + (int64_t)l * E;
        int32_t *eoff = a->ep_off + (int64_t)l * (El + 1);
        for (int64_t e = 0; e < E; e++) /* [P, El]: for rank r, its expert j */
            cnt[e] = hoff[e + 1] - hoff[e];
        for (int64_t r = 0; r < P; r++)
            ones[r] = 1;
        if (m->ep.alltoallv(m->ep.ctx, cnt, ones, rows, ones, (size_t)El * sizeof(int64_t), &err) !=
            MOE_OK) {
            fail(m, &err);
            free(tmp);
            return;
        }
        eoff[0] = 0;
        for (int64_t j = 0; j < El; j++) {
            int64_t n = 0;
            for (int64_t s = 0; s < P; s++)
                n += rows[s * El + j];
            eoff[j + 1] = eoff[j] + (int32_t)n;
        }
    }
    peer_rows(m, l, to, from);
    if (m->ep.alltoallv(m->ep.ctx, src, to, a->xfer, from, row_bytes, &err) != MOE_OK)
        fail(m, &err);
    else
        regroup(m, l, dst, a->xfer, row_bytes, 1);
    free(tmp);
}

void moe_model_ep_combine(moe_model *m, int l, const void *src, void *dst, size_t row_bytes) {
    struct moe_acts *a = m->acts;
    if (m->ep_status != MOE_OK) return;
    int64_t P = a->ep;
    int64_t *tmp = scratch(m, 2 * P);
    if (!tmp) return;
    moe_err err;
    moe_err_clear(&err);
    peer_rows(m, l, tmp, tmp + P);
    regroup(m, l, (void *)src, a->xfer, row_bytes, 0);
    if (m->ep.alltoallv(m->ep.ctx, a->xfer, tmp + P, dst, tmp, row_bytes, &err) != MOE_OK)
        fail(m, &err);
    free(tmp);
}

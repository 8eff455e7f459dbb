/* moe_permute: expert-contiguous permutation of the (token, slot) pairs for the CUDA
 * backend, the weighted un-permutation back to tokens, and their backwards.
 *
 * The permutation is a STABLE counting sort by expert in (n, k) order, identical to the CPU
 * reference (libcore/src/cpu/ops_moe.c), in three small passes over chunks of 1024 pairs:
 * per-chunk expert counts; one block turns them into expert offsets and per-chunk bases in
 * chunk order; then each pair's row = base + rank among the earlier pairs of its chunk with
 * the same expert (warp __match_any_sync + per-warp counts). The one thing a reader must
 * know: no step depends on scheduling order, so rows are deterministic and equal the CPU's.
 * The same grouping (moe_cuda_group_by_key) orders tokens by id for the embedding backward. */
#include "backend_cuda.cuh"

#define MOE_PERM_CHUNK 1024 /* pairs per chunk = threads per block of the counting passes */

/* cnt[ch, e] = pairs of chunk ch routed to expert e */
__global__ void __launch_bounds__(MOE_PERM_CHUNK)
    k_perm_count(int32_t *__restrict__ cnt, const int32_t *__restrict__ idx, int64_t NK, int E) {
    extern __shared__ int32_t sh_cnt[]; /* [E] */
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        sh_cnt[e] = 0;
    __syncthreads();
    int64_t p = (int64_t)blockIdx.x * MOE_PERM_CHUNK + threadIdx.x;
    if (p < NK) atomicAdd(&sh_cnt[idx[p]], 1);
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        cnt[blockIdx.x * (int64_t)E + e] = sh_cnt[e];
}

/* One block: offsets[e] (expert starts, offsets[E] = NK) and base[ch, e] = first row of the
 * pairs of chunk ch that go to expert e. */
__global__ void k_perm_scan(int32_t *__restrict__ offsets, int32_t *__restrict__ base,
                            const int32_t *__restrict__ cnt, int64_t nchunks, int E) {
    extern __shared__ int32_t sh_tot[]; /* [E + 1] */
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int32_t s = 0;
        for (int64_t ch = 0; ch < nchunks; ch++)
            s += cnt[ch * E + e];
        sh_tot[e] = s;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int32_t run = 0;
        for (int e = 0; e < E; e++) {
            int32_t t = sh_tot[e];
            sh_tot[e] = run;
            offsets[e] = run;
            run += t;
        }
        offsets[E] = run;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int32_t run = sh_tot[e];
        for (int64_t ch = 0; ch < nchunks; ch++) {
            base[ch * E + e] = run;
            run += cnt[ch * E + e];
        }
    }
}

__global__ void __launch_bounds__(MOE_PERM_CHUNK)
    k_perm_place(int32_t *__restrict__ row_src, int32_t *__restrict__ slot_row,
                 const int32_t *__restrict__ base, const int32_t *__restrict__ idx, int64_t NK,
                 int E) {
    extern __shared__ int32_t sh_wc[]; /* [32 warps][E] */
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int i = threadIdx.x; i < 32 * E; i += blockDim.x)
        sh_wc[i] = 0;
    __syncthreads();
    int64_t p = (int64_t)blockIdx.x * MOE_PERM_CHUNK + threadIdx.x;
    int active = p < NK;
    unsigned amask = __ballot_sync(0xffffffffu, active);
    int e = 0, rank = 0;
    if (active) {
        e = idx[p];
        unsigned peers = __match_any_sync(amask, e);
        rank = __popc(peers & ((1u << lane) - 1u));
        if (rank == 0) sh_wc[warp * E + e] = __popc(peers);
    }
    __syncthreads();
    if (active) {
        int32_t before = 0;
        for (int w = 0; w < warp; w++)
            before += sh_wc[w * E + e];
        int32_t row = base[blockIdx.x * (int64_t)E + e] + before + rank;
        row_src[row] = (int32_t)p;
        slot_row[p] = row;
    }
}

/* xp[r, :] = x[row_src[r] / K, :], one block per row */
template <int V, typename TX, typename TO>
__global__ void k_perm_gather(TO *__restrict__ xp, const TX *__restrict__ x,
                              const int32_t *__restrict__ row_src, int64_t C, int K) {
    int64_t r = blockIdx.x, src = (int64_t)(row_src[r] / K) * C;
    for (int64_t i = threadIdx.x * V; i < C; i += blockDim.x * V) {
        float v[V];
        moe_ldv<V>(x, src + i, v);
        moe_stv<V>(xp, r * C + i, v);
    }
}

template <int V>
static void perm_gather(moe_cuda_ctx *c, moe_buf xp, moe_cbuf x, const int32_t *row_src, int64_t NK,
                        int64_t C, int64_t K) {
    typedef __nv_bfloat16 bf;
    const unsigned th = C / V >= 512 ? 256 : 128;
    if (x.dt == MOE_DTYPE_BF16 && xp.dt == MOE_DTYPE_BF16)
        k_perm_gather<V>
            <<<(unsigned)NK, th, 0, c->stream>>>((bf *)xp.p, (const bf *)x.p, row_src, C, (int)K);
    else if (x.dt == MOE_DTYPE_BF16)
        k_perm_gather<V><<<(unsigned)NK, th, 0, c->stream>>>((float *)xp.p, (const bf *)x.p,
                                                             row_src, C, (int)K);
    else if (xp.dt == MOE_DTYPE_BF16)
        k_perm_gather<V><<<(unsigned)NK, th, 0, c->stream>>>((bf *)xp.p, (const float *)x.p,
                                                             row_src, C, (int)K);
    else
        k_perm_gather<V><<<(unsigned)NK, th, 0, c->stream>>>((float *)xp.p, (const float *)x.p,
                                                             row_src, C, (int)K);
}

int moe_cuda_group_by_key(moe_cuda_ctx *c, int32_t *order, int32_t *inverse, int32_t *offsets,
                          const int32_t *keys, int64_t n, int64_t nkeys, const char *op) {
    if (nkeys < 1 || nkeys > MOE_CUDA_MAX_EXPERTS) {
        moe_cuda_check(c, cudaErrorInvalidValue, op, "%lld keys: 1..%d supported", (long long)nkeys,
                       MOE_CUDA_MAX_EXPERTS);
        return 0;
    }
    int64_t nchunks = (n + MOE_PERM_CHUNK - 1) / MOE_PERM_CHUNK;
    if (nchunks == 0)
        return moe_cuda_check(
            c, cudaMemsetAsync(offsets, 0, (size_t)(nkeys + 1) * sizeof(int32_t), c->stream), op,
            "n=0 keys=%lld", (long long)nkeys);
    int32_t *cnt = (int32_t *)moe_cuda_scratch(c, MOE_CUDA_SCRATCH_RED,
                                               (size_t)(2 * nchunks * nkeys) * sizeof(int32_t), op);
    if (!cnt) return 0;
    int32_t *base = cnt + nchunks * nkeys;
    size_t wc_bytes = (size_t)(32 * nkeys) * sizeof(int32_t);
    if (wc_bytes > 48 * 1024 &&
        !moe_cuda_check(c,
                        cudaFuncSetAttribute(k_perm_place,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)wc_bytes),
                        op, "keys=%lld shared memory %zu bytes", (long long)nkeys, wc_bytes))
        return 0;
    k_perm_count<<<(unsigned)nchunks, MOE_PERM_CHUNK, (size_t)nkeys * sizeof(int32_t), c->stream>>>(
        cnt, keys, n, (int)nkeys);
    if (!MOE_CUDA_LAUNCHED(c, op, "n=%lld keys=%lld (count)", (long long)n, (long long)nkeys))
        return 0;
    k_perm_scan<<<1, 256, (size_t)(nkeys + 1) * sizeof(int32_t), c->stream>>>(offsets, base, cnt,
                                                                              nchunks, (int)nkeys);
    if (!MOE_CUDA_LAUNCHED(c, op, "n=%lld keys=%lld (scan)", (long long)n, (long long)nkeys))
        return 0;
    k_perm_place<<<(unsigned)nchunks, MOE_PERM_CHUNK, wc_bytes, c->stream>>>(order, inverse, base,
                                                                             keys, n, (int)nkeys);
    return MOE_CUDA_LAUNCHED(c, op, "n=%lld keys=%lld (place)", (long long)n, (long long)nkeys);
}

void moe_cuda_permute_forward(const moe_backend *be, moe_buf xp, int32_t *row_src,
                              int32_t *slot_row, int32_t *offsets, moe_cbuf x,
                              const int32_t *topk_idx, int64_t N, int64_t C, int64_t E, int64_t K) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    const char *op = "permute_forward";
    if (moe_cuda_failed(c)) return;
    int64_t NK = N * K;
    if (!moe_cuda_group_by_key(c, row_src, slot_row, offsets, topk_idx, NK, E, op)) return;
    if (C <= 0 || NK <= 0) return;
    if (!moe_cuda_typed_ok(c, x.dt, op)) return;
    /* an MXFP8 xp: gathered in bf16, then encoded */
    moe_buf xs = moe_cuda_mx_stage(c, MOE_CUDA_SCRATCH_A, xp, NK * C, op);
    if (!xs.p) return;
    if (moe_cuda_vec_ok(C, xs.p, x.p))
        perm_gather<MOE_VEC>(c, xs, x, row_src, NK, C, K);
    else
        perm_gather<1>(c, xs, x, row_src, NK, C, K);
    if (MOE_CUDA_LAUNCHED(c, op, "N=%lld K=%lld C=%lld (gather)", (long long)N, (long long)K,
                          (long long)C))
        moe_cuda_mx_write(c, xp, xs, NK * C, op);
}

/* dx[n,:] (+)= sum_k dxp[slot_row[n*K+k], :] (k in order, in fp32; add: 1 adds into dx, 0
 * writes it), one block per token */
template <int V, typename TP>
__global__ void k_perm_bwd(float *__restrict__ dx, const TP *__restrict__ dxp,
                           const int32_t *__restrict__ slot_row, int64_t C, int K, int add) {
    int64_t n = blockIdx.x;
    for (int64_t i = threadIdx.x * V; i < C; i += blockDim.x * V) {
        float acc[V], v[V];
        if (add)
            moe_ldv<V>(dx, n * C + i, acc);
        else
#pragma unroll
            for (int j = 0; j < V; j++)
                acc[j] = 0.0f;
        for (int kk = 0; kk < K; kk++) {
            moe_ldv<V>(dxp, (int64_t)slot_row[n * K + kk] * C + i, v);
#pragma unroll
            for (int j = 0; j < V; j++)
                acc[j] += v[j];
        }
        moe_stv<V>(dx, n * C + i, acc);
    }
}

template <typename TP>
static void perm_bwd(moe_cuda_ctx *c, float *dx, const TP *dxp, const int32_t *slot_row, int64_t N,
                     int64_t C, int64_t K, int add) {
    if (moe_cuda_vec_ok(C, dx, dxp))
        k_perm_bwd<MOE_VEC><<<(unsigned)N, C / MOE_VEC >= 512 ? 256 : 128, 0, c->stream>>>(
            dx, dxp, slot_row, C, (int)K, add);
    else
        k_perm_bwd<1><<<(unsigned)N, C >= 512 ? 256 : 128, 0, c->stream>>>(dx, dxp, slot_row, C,
                                                                           (int)K, add);
}

void moe_cuda_permute_backward(const moe_backend *be, float *dx, moe_cbuf dxp,
                               const int32_t *slot_row, int64_t N, int64_t C, int64_t K,
                               moe_grad_store st) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    const char *op = "permute_backward";
    if (moe_cuda_failed(c) || N <= 0 || C <= 0 || !moe_cuda_typed_ok(c, dxp.dt, op)) return;
    const int add = st == MOE_GRAD_ADD;
    if (dxp.dt == MOE_DTYPE_BF16)
        perm_bwd(c, dx, (const __nv_bfloat16 *)dxp.p, slot_row, N, C, K, add);
    else
        perm_bwd(c, dx, (const float *)dxp.p, slot_row, N, C, K, add);
    MOE_CUDA_LAUNCHED(c, op, "N=%lld C=%lld K=%lld", (long long)N, (long long)C, (long long)K);
}

/* y[n,:] = res[n,:] + s, s = sum_k w[n,k] yp[slot_row[n*K+k], :] summed from 0 in k order
 * and added to res in fp32 (as the CPU); y = s without res (resf and resb NULL; else the one
 * of res's type) */
template <int V, typename TO, typename TY>
__global__ void k_unperm_fwd(TO *__restrict__ y, const float *__restrict__ resf,
                             const __nv_bfloat16 *__restrict__ resb, const TY *__restrict__ yp,
                             const float *__restrict__ topk_w, const int32_t *__restrict__ slot_row,
                             int64_t C, int K) {
    int64_t n = blockIdx.x;
    for (int64_t i = threadIdx.x * V; i < C; i += blockDim.x * V) {
        float acc[V], v[V];
#pragma unroll
        for (int j = 0; j < V; j++)
            acc[j] = 0.0f;
        for (int kk = 0; kk < K; kk++) {
            const float w = topk_w[n * K + kk];
            moe_ldv<V>(yp, (int64_t)slot_row[n * K + kk] * C + i, v);
#pragma unroll
            for (int j = 0; j < V; j++)
                acc[j] += w * v[j];
        }
        if (resf || resb) {
            if (resf)
                moe_ldv<V>(resf, n * C + i, v);
            else
                moe_ldv<V>(resb, n * C + i, v);
#pragma unroll
            for (int j = 0; j < V; j++)
                acc[j] = v[j] + acc[j];
        }
        moe_stv<V>(y, n * C + i, acc);
    }
}

template <typename TO, typename TY>
static void unperm_fwd(moe_cuda_ctx *c, moe_buf y, moe_cbuf res, const TY *yp, const float *topk_w,
                       const int32_t *slot_row, int64_t N, int64_t C, int64_t K) {
    const float *resf = res.dt == MOE_DTYPE_F32 ? (const float *)res.p : NULL;
    const __nv_bfloat16 *resb = res.dt == MOE_DTYPE_BF16 ? (const __nv_bfloat16 *)res.p : NULL;
    if (moe_cuda_vec_ok(C, y.p, yp, res.p)) /* res.p last: NULL ends the list */
        k_unperm_fwd<MOE_VEC><<<(unsigned)N, C / MOE_VEC >= 512 ? 256 : 128, 0, c->stream>>>(
            (TO *)y.p, resf, resb, yp, topk_w, slot_row, C, (int)K);
    else
        k_unperm_fwd<1><<<(unsigned)N, C >= 512 ? 256 : 128, 0, c->stream>>>(
            (TO *)y.p, resf, resb, yp, topk_w, slot_row, C, (int)K);
}

template <typename TY>
static void unperm_fwd_out(moe_cuda_ctx *c, moe_buf y, moe_cbuf res, const TY *yp,
                           const float *topk_w, const int32_t *slot_row, int64_t N, int64_t C,
                           int64_t K) {
    if (y.dt == MOE_DTYPE_BF16)
        unperm_fwd<__nv_bfloat16>(c, y, res, yp, topk_w, slot_row, N, C, K);
    else
        unperm_fwd<float>(c, y, res, yp, topk_w, slot_row, N, C, K);
}

void moe_cuda_unpermute_forward(const moe_backend *be, moe_buf y, moe_cbuf res, moe_cbuf yp,
                                const float *topk_w, const int32_t *slot_row, int64_t N, int64_t C,
                                int64_t K) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    const char *op = "unpermute_forward";
    if (moe_cuda_failed(c) || !moe_cuda_typed_ok(c, y.dt, op) ||
        (res.p && !moe_cuda_typed_ok(c, res.dt, op)) || !moe_cuda_typed_ok(c, yp.dt, op) ||
        N <= 0 || C <= 0)
        return;
    if (yp.dt == MOE_DTYPE_BF16)
        unperm_fwd_out(c, y, res, (const __nv_bfloat16 *)yp.p, topk_w, slot_row, N, C, K);
    else
        unperm_fwd_out(c, y, res, (const float *)yp.p, topk_w, slot_row, N, C, K);
    MOE_CUDA_LAUNCHED(c, op, "N=%lld C=%lld K=%lld", (long long)N, (long long)C, (long long)K);
}

/* dyp[r,:] (+)= w dy[n,:]; dtopk_w[n,k] (+)= dot(dy[n,:], yp[r,:]) (add: 1 adds, 0 writes),
 * one block per token */
template <int V, typename TY, typename TG>
__global__ void k_unperm_bwd(TG *dyp, float *__restrict__ dtopk_w, const float *__restrict__ dy,
                             const TY *yp, /* dyp may be yp */
                             const float *__restrict__ topk_w, const int32_t *__restrict__ slot_row,
                             int64_t C, int K, int add) {
    __shared__ float sh[32];
    int64_t n = blockIdx.x;
    const float *g = dy + n * C;
    for (int kk = 0; kk < K; kk++) {
        int64_t r = slot_row[n * K + kk];
        float w = topk_w[n * K + kk], s = 0.0f;
        for (int64_t i = threadIdx.x * V; i < C; i += blockDim.x * V) {
            float gv[V], d[V], yv[V];
            moe_ldv<V>(g, i, gv);
            if (add) moe_ldv<V>(dyp, r * C + i, d);
            moe_ldv<V>(yp, r * C + i, yv);
#pragma unroll
            for (int j = 0; j < V; j++) {
                d[j] = (add ? d[j] : 0.0f) + w * gv[j];
                s += gv[j] * yv[j];
            }
            moe_stv<V>(dyp, r * C + i, d);
        }
        s = moe_block_sum(s, sh);
        if (threadIdx.x == 0) dtopk_w[n * K + kk] = (add ? dtopk_w[n * K + kk] : 0.0f) + s;
    }
}

template <int V>
static void unperm_bwd(moe_cuda_ctx *c, moe_buf dyp, float *dtopk_w, const float *dy, moe_cbuf yp,
                       const float *topk_w, const int32_t *slot_row, int64_t N, int64_t C,
                       int64_t K, int add) {
    typedef __nv_bfloat16 bf;
    const unsigned th = C / V >= 512 ? 256 : 128;
    if (yp.dt == MOE_DTYPE_BF16 && dyp.dt == MOE_DTYPE_BF16)
        k_unperm_bwd<V><<<(unsigned)N, th, 0, c->stream>>>(
            (bf *)dyp.p, dtopk_w, dy, (const bf *)yp.p, topk_w, slot_row, C, (int)K, add);
    else if (yp.dt == MOE_DTYPE_BF16)
        k_unperm_bwd<V><<<(unsigned)N, th, 0, c->stream>>>(
            (float *)dyp.p, dtopk_w, dy, (const bf *)yp.p, topk_w, slot_row, C, (int)K, add);
    else if (dyp.dt == MOE_DTYPE_BF16)
        k_unperm_bwd<V><<<(unsigned)N, th, 0, c->stream>>>(
            (bf *)dyp.p, dtopk_w, dy, (const float *)yp.p, topk_w, slot_row, C, (int)K, add);
    else
        k_unperm_bwd<V><<<(unsigned)N, th, 0, c->stream>>>(
            (float *)dyp.p, dtopk_w, dy, (const float *)yp.p, topk_w, slot_row, C, (int)K, add);
}

void moe_cuda_unpermute_backward(const moe_backend *be, moe_buf dyp, float *dtopk_w,
                                 const float *dy, moe_cbuf yp, const float *topk_w,
                                 const int32_t *slot_row, int64_t N, int64_t C, int64_t K,
                                 moe_grad_store st) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    if (moe_cuda_failed(c) || !moe_cuda_typed_ok(c, yp.dt, "unpermute_backward") || N <= 0 ||
        C <= 0)
        return;
    if (!moe_cuda_typed_ok(c, dyp.dt, "unpermute_backward")) return;
    if (moe_cuda_vec_ok(C, dyp.p, dy, yp.p))
        unperm_bwd<MOE_VEC>(c, dyp, dtopk_w, dy, yp, topk_w, slot_row, N, C, K, st == MOE_GRAD_ADD);
    else
        unperm_bwd<1>(c, dyp, dtopk_w, dy, yp, topk_w, slot_row, N, C, K, st == MOE_GRAD_ADD);
    MOE_CUDA_LAUNCHED(c, "unpermute_backward", "N=%lld C=%lld K=%lld", (long long)N, (long long)C,
                      (long long)K);
}

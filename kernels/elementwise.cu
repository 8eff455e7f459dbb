/* elementwise: the per-element and per-row ops of the CUDA backend - embedding lookup,
 * RMSNorm, RoPE and SwiGLU, forward and backward, and the pooling of hidden states.
 *
 * Semantics are those of the CPU reference (libcore/src/cpu/ops_norm.c). The one thing a
 * reader must know: every reduction that writes a PARAMETER gradient (RMSNorm weight,
 * embedding table) runs in a fixed order that does not depend on the launch configuration,
 * and no float atomics are used, so repeated runs are bit-identical. The embedding backward
 * (vocabularies up to 1024 ids) first groups positions by token id, then sums each id's
 * rows in position order: the CPU's order, so its result is bit-identical to the CPU's. */
#include <math.h>

#include "backend_cuda.cuh"
#include "ops/cuda_scratch.h"

/* ------------------------------------------------------------------------------------------
 * embedding */

template <typename TO>
__global__ void k_embedding_fwd(TO *__restrict__ out, const int32_t *__restrict__ tokens,
                                const float *__restrict__ wte, int64_t N, int64_t C) {
    int64_t total = N * C, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += stride) {
        int64_t n = i / C, col = i - n * C;
        moe_st(out, i, wte[(int64_t)tokens[n] * C + col]);
    }
}

/* One thread per column walks the tokens in order: the same summation order as the CPU. */
__global__ void k_embedding_bwd(float *__restrict__ dwte, const float *__restrict__ dout,
                                const int32_t *__restrict__ tokens, int64_t N, int64_t C) {
    int64_t col = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (col >= C) return;
    for (int64_t n = 0; n < N; n++)
        dwte[(int64_t)tokens[n] * C + col] += dout[n * C + col];
}

/* rows a thread has in flight: a DNA batch has a few ids of thousands of rows each, so few
 * blocks; the loads, not the adds, are the work */
#define EMB_BWD_BATCH 16

/* Tokens grouped by id (stable): block (v, column tile) walks the positions of token v in
 * ascending order, starting from dwte's current value - the CPU's exact summation order, in
 * parallel over vocabulary rows and columns. The rows are loaded EMB_BWD_BATCH at a time and
 * then added in order (the same sum). */
__global__ void k_embedding_bwd_grouped(float *__restrict__ dwte, const float *__restrict__ dout,
                                        const int32_t *__restrict__ order,
                                        const int32_t *__restrict__ offsets, int64_t C) {
    int64_t v = blockIdx.y, col = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (col >= C) return;
    int32_t r0 = offsets[v], r1 = offsets[v + 1];
    if (r0 == r1) return;
    float acc = dwte[v * C + col];
    int32_t r = r0;
    for (; r + EMB_BWD_BATCH <= r1; r += EMB_BWD_BATCH) {
        float x[EMB_BWD_BATCH];
#pragma unroll
        for (int j = 0; j < EMB_BWD_BATCH; j++)
            x[j] = dout[(int64_t)order[r + j] * C + col];
#pragma unroll
        for (int j = 0; j < EMB_BWD_BATCH; j++)
            acc += x[j];
    }
    for (; r < r1; r++)
        acc += dout[(int64_t)order[r] * C + col];
    dwte[v * C + col] = acc;
}

void moe_cuda_embedding_forward(const moe_backend *be, moe_buf out, const int32_t *tokens,
                                const float *wte, int64_t N, int64_t C) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    if (moe_cuda_failed(c) || !moe_cuda_typed_ok(c, out.dt, "embedding_forward") || N <= 0 ||
        C <= 0)
        return;
    const unsigned grid = moe_cuda_grid(c, N * C, 256);
    if (out.dt == MOE_DTYPE_BF16)
        k_embedding_fwd<<<grid, 256, 0, c->stream>>>((__nv_bfloat16 *)out.p, tokens, wte, N, C);
    else
        k_embedding_fwd<<<grid, 256, 0, c->stream>>>((float *)out.p, tokens, wte, N, C);
    MOE_CUDA_LAUNCHED(c, "embedding_forward", "N=%lld C=%lld", (long long)N, (long long)C);
}

void moe_cuda_embedding_backward(const moe_backend *be, float *dwte, const float *dout,
                                 const int32_t *tokens, int64_t N, int64_t C, int64_t V) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    if (moe_cuda_failed(c) || N <= 0 || C <= 0) return;
    const char *op = "embedding_backward";
    if (V >= 1 && V <= 1024 && V <= 65535) { /* group positions by token id first */
        int32_t *order = (int32_t *)moe_cuda_scratch(c, MOE_CUDA_SCRATCH_E,
                                                     (size_t)(2 * N + V + 1) * sizeof(int32_t), op);
        if (!order) return;
        int32_t *inverse = order + N, *offsets = inverse + N;
        if (!moe_cuda_group_by_key(c, order, inverse, offsets, tokens, N, V, op)) return;
        dim3 grid((unsigned)((C + 63) / 64), (unsigned)V);
        k_embedding_bwd_grouped<<<grid, 64, 0, c->stream>>>(dwte, dout, order, offsets, C);
    } else {
        k_embedding_bwd<<<(unsigned)((C + 63) / 64), 64, 0, c->stream>>>(dwte, dout, tokens, N, C);
    }
    MOE_CUDA_LAUNCHED(c, op, "N=%lld C=%lld V=%lld", (long long)N, (long long)C, (long long)V);
}

/* ------------------------------------------------------------------------------------------
 * RMSNorm: one block per row */

template <int V, typename TO, typename TX>
__global__ void k_rmsnorm_fwd(TO *__restrict__ out, float *__restrict__ rstd,
                              const TX *__restrict__ x, const float *__restrict__ w, int64_t C,
                              float eps, int round_bf16) {
    __shared__ float sh[32];
    int64_t n = blockIdx.x;
    const TX *xn = x + n * C;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x * V; i < C; i += blockDim.x * V) {
        float xv[V];
        moe_ldv<V>(xn, i, xv);
#pragma unroll
        for (int j = 0; j < V; j++)
            ss += xv[j] * xv[j];
    }
    ss = moe_block_sum(ss, sh);
    float r = 1.0f / sqrtf(ss / (float)C + eps);
    if (threadIdx.x == 0) rstd[n] = r;
    for (int64_t i = threadIdx.x * V; i < C; i += blockDim.x * V) {
        float xv[V], wv[V], o[V];
        moe_ldv<V>(xn, i, xv);
        moe_ldv<V>(w, i, wv);
#pragma unroll
        for (int j = 0; j < V; j++) {
            float v = xv[j] * r * wv[j];
            o[j] = round_bf16 ? moe_dev_round_bf16(v) : v;
        }
        moe_stv<V>(out, n * C + i, o);
    }
}

#define MOE_RMS_LANES 16 /* row lanes of the partial-sum reduction */

/* One block per MOE_CUDA_RMS_ROWS rows, thread t owning columns (g * blockDim + t) * V + j for
 * g < G: per row dx[n] += dout w r - x k (k = dot(dout w, x) r^3 / C), and the block's
 * partial weight gradient part[block, c] = sum over its rows (ascending) of dout x r, kept in
 * registers: dout and x are read once from memory for both gradients. */
template <int V, int G, typename TX>
__global__ void k_rmsnorm_bwd(float *__restrict__ dx, float *__restrict__ part,
                              const float *__restrict__ dout, const TX *__restrict__ x,
                              const float *__restrict__ w, const float *__restrict__ rstd,
                              int64_t N, int64_t C) {
    __shared__ float sh[32];
    float wv[G][V], acc[G][V];
#pragma unroll
    for (int g = 0; g < G; g++) {
        const int64_t i = ((int64_t)g * blockDim.x + threadIdx.x) * V;
        if (i < C) moe_ldv<V>(w, i, wv[g]);
#pragma unroll
        for (int j = 0; j < V; j++)
            acc[g][j] = 0.0f;
    }
    const int64_t r0 = (int64_t)blockIdx.x * MOE_CUDA_RMS_ROWS;
    const int64_t r1 = r0 + MOE_CUDA_RMS_ROWS < N ? r0 + MOE_CUDA_RMS_ROWS : N;
    for (int64_t n = r0; n < r1; n++) {
        const float r = rstd[n];
        float gv[G][V], xv[G][V], dot = 0.0f;
#pragma unroll
        for (int g = 0; g < G; g++) {
            const int64_t i = ((int64_t)g * blockDim.x + threadIdx.x) * V;
            if (i >= C) continue;
            moe_ldv<V>(dout, n * C + i, gv[g]);
            moe_ldv<V>(x, n * C + i, xv[g]);
#pragma unroll
            for (int j = 0; j < V; j++)
                dot += gv[g][j] * wv[g][j] * xv[g][j];
        }
        dot = moe_block_sum(dot, sh);
        const float k = dot * r * r * r / (float)C;
#pragma unroll
        for (int g = 0; g < G; g++) {
            const int64_t i = ((int64_t)g * blockDim.x + threadIdx.x) * V;
            if (i >= C) continue;
            float d[V];
            moe_ldv<V>(dx, n * C + i, d);
#pragma unroll
            for (int j = 0; j < V; j++) {
                d[j] += gv[g][j] * wv[g][j] * r - xv[g][j] * k;
                acc[g][j] += gv[g][j] * xv[g][j] * r;
            }
            moe_stv<V>(dx, n * C + i, d);
        }
    }
#pragma unroll
    for (int g = 0; g < G; g++) {
        const int64_t i = ((int64_t)g * blockDim.x + threadIdx.x) * V;
        if (i < C) moe_stv<V>(part, (int64_t)blockIdx.x * C + i, acc[g]);
    }
}

/* dw[c] += sum over the nparts partials part[j, c] in a fixed order: lane y sums the
 * partials j = y, y + MOE_RMS_LANES, ... ascending, then lane 0 adds the lanes' sums in
 * order; blocks of 32 columns x MOE_RMS_LANES lanes. */
__global__ void k_rmsnorm_bwd_dw_sum(float *__restrict__ dw, const float *__restrict__ part,
                                     int64_t nparts, int64_t C) {
    __shared__ float sh[MOE_RMS_LANES][32];
    const int64_t col = (int64_t)blockIdx.x * 32 + threadIdx.x;
    float s = 0.0f;
    if (col < C)
        for (int64_t j = threadIdx.y; j < nparts; j += MOE_RMS_LANES)
            s += part[j * C + col];
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y != 0 || col >= C) return;
    float t = 0.0f;
    for (int y = 0; y < MOE_RMS_LANES; y++)
        t += sh[y][threadIdx.x];
    dw[col] += t;
}

static int row_threads(int64_t C) {
    return C >= 1024 ? 512 : C >= 256 ? 256 : 128;
}

template <int V, typename TO, typename TX>
static void rmsnorm_fwd_launch(moe_cuda_ctx *c, TO *out, float *rstd, const TX *x, const float *w,
                               int64_t N, int64_t C, float eps, int rb) {
    k_rmsnorm_fwd<V>
        <<<(unsigned)N, row_threads(C / V), 0, c->stream>>>(out, rstd, x, w, C, eps, rb);
}

template <typename TO, typename TX>
static void rmsnorm_fwd_vec(moe_cuda_ctx *c, TO *out, float *rstd, const TX *x, const float *w,
                            int64_t N, int64_t C, float eps, int rb) {
    if (moe_cuda_vec_ok(C, out, x, w))
        rmsnorm_fwd_launch<MOE_VEC>(c, out, rstd, x, w, N, C, eps, rb);
    else
        rmsnorm_fwd_launch<1>(c, out, rstd, x, w, N, C, eps, rb);
}

template <typename TX>
static void rmsnorm_fwd_out(moe_cuda_ctx *c, moe_buf out, float *rstd, const TX *x, const float *w,
                            int64_t N, int64_t C, float eps, int rb) {
    if (out.dt == MOE_DTYPE_BF16)
        rmsnorm_fwd_vec(c, (__nv_bfloat16 *)out.p, rstd, x, w, N, C, eps, rb);
    else
        rmsnorm_fwd_vec(c, (float *)out.p, rstd, x, w, N, C, eps, rb);
}

/* An MXFP8 out: normalised in bf16, then encoded; an fp8-block pair (pairs) likewise, both
 * copies written from the bf16 norm in scratch (quant_fp8.cu's moe_cuda_fp8_pair). */
void moe_cuda_rmsnorm_forward(const moe_backend *be, moe_buf out, float *rstd, moe_cbuf xb,
                              const float *w, int64_t N, int64_t C, float eps, moe_recipe prec,
                              const moe_fp8_groups *pairs) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    const char *op = "rmsnorm_forward";
    if (moe_cuda_failed(c) || !moe_cuda_typed_ok(c, xb.dt, op) || N <= 0 || C <= 0) return;
    if (pairs && (out.dt != MOE_DTYPE_E4M3 || out.mx ||
                  N * C != (int64_t)pairs->offsets[pairs->E] * pairs->K)) {
        moe_cuda_check(c, cudaErrorInvalidValue, op,
                       "fp8-block pair: N=%lld C=%lld, output %s (a pair of offsets[E] x K values "
                       "expected)",
                       (long long)N, (long long)C, moe_dtype_name(out.dt));
        return;
    }
    moe_buf os = pairs ? moe_buf_of(moe_cuda_scratch(c, MOE_CUDA_SCRATCH_A,
                                                     (size_t)(N * C) * sizeof(__nv_bfloat16), op),
                                    MOE_DTYPE_BF16)
                       : moe_cuda_mx_stage(c, MOE_CUDA_SCRATCH_A, out, N * C, op);
    if (!os.p) return;
    int rb = pairs || prec == MOE_RECIPE_BF16;
    if (xb.dt == MOE_DTYPE_BF16)
        rmsnorm_fwd_out(c, os, rstd, (const __nv_bfloat16 *)xb.p, w, N, C, eps, rb);
    else
        rmsnorm_fwd_out(c, os, rstd, (const float *)xb.p, w, N, C, eps, rb);
    if (!MOE_CUDA_LAUNCHED(c, op, "N=%lld C=%lld", (long long)N, (long long)C)) return;
    if (pairs)
        moe_cuda_fp8_pair(c, (uint8_t *)out.p, moe_cbuf_from(os), pairs, op);
    else
        moe_cuda_mx_write(c, out, os, N * C, op);
}

template <int V, int G, typename TX>
static void rmsnorm_bwd_launch(moe_cuda_ctx *c, float *dx, float *part, const float *dout,
                               const TX *x, const float *w, const float *rstd, int64_t N, int64_t C,
                               unsigned threads) {
    k_rmsnorm_bwd<V, G>
        <<<(unsigned)((N + MOE_CUDA_RMS_ROWS - 1) / MOE_CUDA_RMS_ROWS), threads, 0, c->stream>>>(
            dx, part, dout, x, w, rstd, N, C);
}

/* The backward's launch for V elements a thread access: threads enough for the row in G
 * groups of 1024 at most (G a power of two up to 16); 0 when C is larger than that. */
template <int V, typename TX>
static int rmsnorm_bwd_vec(moe_cuda_ctx *c, float *dx, float *part, const float *dout, const TX *x,
                           const float *w, const float *rstd, int64_t N, int64_t C) {
    const int64_t vecs = (C + V - 1) / V;
    int64_t G = 1;
    while (G < 16 && G * 1024 < vecs)
        G *= 2;
    if (G * 1024 < vecs) return 0;
    const unsigned threads = (unsigned)(((vecs + G - 1) / G + 31) / 32 * 32);
    switch (G) {
    case 1:
        rmsnorm_bwd_launch<V, 1>(c, dx, part, dout, x, w, rstd, N, C, threads);
        break;
    case 2:
        rmsnorm_bwd_launch<V, 2>(c, dx, part, dout, x, w, rstd, N, C, threads);
        break;
    case 4:
        rmsnorm_bwd_launch<V, 4>(c, dx, part, dout, x, w, rstd, N, C, threads);
        break;
    case 8:
        rmsnorm_bwd_launch<V, 8>(c, dx, part, dout, x, w, rstd, N, C, threads);
        break;
    default:
        rmsnorm_bwd_launch<V, 16>(c, dx, part, dout, x, w, rstd, N, C, threads);
        break;
    }
    return 1;
}

template <typename TX>
static int rmsnorm_bwd_x(moe_cuda_ctx *c, float *dx, float *part, const float *dout, const TX *x,
                         const float *w, const float *rstd, int64_t N, int64_t C) {
    return moe_cuda_vec_ok(C, dx, dout, x, w, part)
               ? rmsnorm_bwd_vec<MOE_VEC>(c, dx, part, dout, x, w, rstd, N, C)
               : rmsnorm_bwd_vec<1>(c, dx, part, dout, x, w, rstd, N, C);
}

void moe_cuda_rmsnorm_backward(const moe_backend *be, float *dx, float *dw, const float *dout,
                               moe_cbuf xb, const float *w, const float *rstd, int64_t N,
                               int64_t C) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    const char *op = "rmsnorm_backward";
    if (moe_cuda_failed(c) || !moe_cuda_typed_ok(c, xb.dt, op) || N <= 0 || C <= 0) return;
    int64_t nparts = (N + MOE_CUDA_RMS_ROWS - 1) / MOE_CUDA_RMS_ROWS;
    float *part = (float *)moe_cuda_scratch(c, MOE_CUDA_SCRATCH_RED,
                                            (size_t)(nparts * C) * sizeof(float), op);
    if (!part) return;
    int ok = xb.dt == MOE_DTYPE_BF16
                 ? rmsnorm_bwd_x(c, dx, part, dout, (const __nv_bfloat16 *)xb.p, w, rstd, N, C)
                 : rmsnorm_bwd_x(c, dx, part, dout, (const float *)xb.p, w, rstd, N, C);
    if (!ok) {
        moe_cuda_check(c, cudaErrorInvalidValue, op, "C=%lld: wider than 16 x 1024 vectors a row",
                       (long long)C);
        return;
    }
    if (!MOE_CUDA_LAUNCHED(c, op, "N=%lld C=%lld", (long long)N, (long long)C)) return;
    k_rmsnorm_bwd_dw_sum<<<(unsigned)((C + 31) / 32), dim3(32, MOE_RMS_LANES), 0, c->stream>>>(
        dw, part, nparts, C);
    MOE_CUDA_LAUNCHED(c, op, "N=%lld C=%lld (dw sum)", (long long)N, (long long)C);
}

/* ------------------------------------------------------------------------------------------
 * RoPE (Hugging Face rotate_half). The cos/sin table is computed in double and rounded once,
 * like the CPU backend, so both backends rotate by the same float cos/sin. A position is
 * p0 + pos[b, t] (pos inside its document, in [0, T)) or p0 + t when pos is NULL: the table
 * of positions p0.. serves both. */

__global__ void k_rope_table(float *__restrict__ cs, int64_t p0, int64_t T, int64_t half, int64_t D,
                             double theta) {
    int64_t total = T * half, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < total; j += stride) {
        int64_t t = j / half, i = j - t * half;
        double inv_freq = pow(theta, -(double)(2 * i) / (double)D);
        double ang = (double)(p0 + t) * inv_freq;
        cs[2 * j] = (float)cos(ang);
        cs[2 * j + 1] = (float)sin(ang);
    }
}

/* y = x rotated (y may be x: each thread reads its pairs before it writes them) */
template <int V, typename TY, typename TX>
__global__ void k_rope_apply(TY *y, const TX *x, const float *__restrict__ cs,
                             const int32_t *__restrict__ pos, int64_t B, int64_t T, int64_t NH,
                             int64_t half, float dir) {
    const int64_t groups = half / V; /* V consecutive pairs (i, i + half) a thread */
    int64_t total = B * T * NH * groups, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < total; j += stride) {
        int64_t i = (j % groups) * V, row = j / groups; /* row = (b*T + t)*NH + h */
        int64_t bt = row / NH, t = pos ? (int64_t)pos[bt] : bt % T;
        float c2[2 * V], x1[V], x2[V], o1[V], o2[V];
        moe_ldv<2 * V>(cs, 2 * (t * half + i), c2);
        int64_t v = row * 2 * half;
        moe_ldv<V>(x, v + i, x1);
        moe_ldv<V>(x, v + i + half, x2);
#pragma unroll
        for (int k = 0; k < V; k++) {
            float co = c2[2 * k], si = dir * c2[2 * k + 1];
            o1[k] = x1[k] * co - x2[k] * si;
            o2[k] = x2[k] * co + x1[k] * si;
        }
        moe_stv<V>(y, v + i, o1);
        moe_stv<V>(y, v + i + half, o2);
    }
}

template <typename TY, typename TX>
static void rope_apply(moe_cuda_ctx *c, TY *y, const TX *x, const float *cs, const int32_t *pos,
                       int64_t B, int64_t T, int64_t NH, int64_t half, float dir) {
    if (moe_cuda_vec_ok(half, y, x, cs))
        k_rope_apply<MOE_VEC>
            <<<moe_cuda_grid(c, B * T * NH * half / MOE_VEC, 256), 256, 0, c->stream>>>(
                y, x, cs, pos, B, T, NH, half, dir);
    else
        k_rope_apply<1><<<moe_cuda_grid(c, B * T * NH * half, 256), 256, 0, c->stream>>>(
            y, x, cs, pos, B, T, NH, half, dir);
}

/* y [B, T, NH, D] dev = x rotated (the forward in place: y is x; the backward from an fp32 x
 * into a y of its type), pos [B, T] dev or NULL */
static void rope(const moe_backend *be, moe_buf y, moe_cbuf x, const int32_t *pos, int64_t p0,
                 int64_t B, int64_t T, int64_t NH, int64_t D, double theta, float dir,
                 const char *op) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    if (moe_cuda_failed(c) || !moe_cuda_typed_ok(c, y.dt, op) || !moe_cuda_typed_ok(c, x.dt, op) ||
        B <= 0 || T <= 0 || NH <= 0 || D <= 0)
        return;
    if (D % 2) {
        moe_cuda_check(c, cudaErrorInvalidValue, op, "D=%lld must be even", (long long)D);
        return;
    }
    int64_t half = D / 2;
    float *cs = (float *)moe_cuda_scratch(c, MOE_CUDA_SCRATCH_F,
                                          (size_t)(T * half * 2) * sizeof(float), op);
    if (!cs) return;
    k_rope_table<<<moe_cuda_grid(c, T * half, 256), 256, 0, c->stream>>>(cs, p0, T, half, D, theta);
    if (!MOE_CUDA_LAUNCHED(c, op, "T=%lld D=%lld (table)", (long long)T, (long long)D)) return;
    typedef __nv_bfloat16 bf;
    if (y.dt == MOE_DTYPE_BF16 && x.dt == MOE_DTYPE_BF16)
        rope_apply(c, (bf *)y.p, (const bf *)x.p, cs, pos, B, T, NH, half, dir);
    else if (y.dt == MOE_DTYPE_BF16)
        rope_apply(c, (bf *)y.p, (const float *)x.p, cs, pos, B, T, NH, half, dir);
    else if (x.dt == MOE_DTYPE_F32)
        rope_apply(c, (float *)y.p, (const float *)x.p, cs, pos, B, T, NH, half, dir);
    else {
        moe_cuda_check(c, cudaErrorInvalidValue, op, "a bf16 input rotated into an fp32 output");
        return;
    }
    MOE_CUDA_LAUNCHED(c, op, "B=%lld T=%lld NH=%lld D=%lld", (long long)B, (long long)T,
                      (long long)NH, (long long)D);
}

void moe_cuda_rope_forward(const moe_backend *be, moe_buf x, const int32_t *pos, int64_t p0,
                           int64_t B, int64_t T, int64_t NH, int64_t D, double theta) {
    rope(be, x, moe_cbuf_from(x), pos, p0, B, T, NH, D, theta, 1.0f, "rope_forward");
}

void moe_cuda_rope_backward(const moe_backend *be, moe_buf dx, const float *dy, const int32_t *pos,
                            int64_t B, int64_t T, int64_t NH, int64_t D, double theta) {
    rope(be, dx, moe_cbuf_f32(dy), pos, 0, B, T, NH, D, theta, -1.0f, "rope_backward");
}

/* ------------------------------------------------------------------------------------------
 * SwiGLU: out = silu(a) * b */

/* (swiglu_val and swiglu_grad, the formulas of every kernel below: backend_cuda.cuh) */

template <int V, typename TI, typename TO>
__global__ void k_swiglu_fwd(TO *__restrict__ out, const TI *__restrict__ a,
                             const TI *__restrict__ b, int64_t n, int round_bf16) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x * V;
    for (int64_t i = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) * V; i < n; i += stride) {
        float av[V], bv[V], o[V];
        moe_ldv<V>(a, i, av);
        moe_ldv<V>(b, i, bv);
        const bool fast = round_bf16 || sizeof(TO) == 2; /* outputs rounded to bf16 */
        bool ok = true; /* swiglu_val_quick for all V, else swiglu_val: one branch */
#pragma unroll
        for (int j = 0; j < V; j++) {
            bool okj;
            o[j] = swiglu_val_quick(av[j], bv[j], fast, &okj);
            ok &= okj;
        }
        if (!ok)
            for (int j = 0; j < V; j++)
                o[j] = swiglu_val(av[j], bv[j], fast);
#pragma unroll
        for (int j = 0; j < V; j++)
            o[j] = round_bf16 ? moe_dev_round_bf16(o[j]) : o[j];
        moe_stv<V>(out, i, o);
    }
}

template <int V, typename TI, typename TG, typename TD>
__global__ void k_swiglu_bwd(TG *da, TG *db, const TD *__restrict__ dout, const TI *a, const TI *b,
                             int64_t n) { /* da may be a, db b: in place */
    int64_t stride = (int64_t)gridDim.x * blockDim.x * V;
    for (int64_t i = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) * V; i < n; i += stride) {
        float av[V], bv[V], g[V], dav[V], dbv[V];
        moe_ldv<V>(a, i, av);
        moe_ldv<V>(b, i, bv);
        moe_ldv<V>(dout, i, g);
        const bool fast = sizeof(TG) == 2; /* bf16 gradients */
        bool ok = true; /* swiglu_sigmoid_quick for all V, else swiglu_grad: one branch */
#pragma unroll
        for (int j = 0; j < V; j++) {
            bool okj;
            swiglu_grad_s(g[j], av[j], bv[j], swiglu_sigmoid_quick(av[j], fast, &okj), &dav[j],
                          &dbv[j]);
            ok &= okj;
        }
        if (!ok)
            for (int j = 0; j < V; j++)
                swiglu_grad(g[j], av[j], bv[j], fast, &dav[j], &dbv[j]);
        moe_stv<V>(da, i, dav);
        moe_stv<V>(db, i, dbv);
    }
}

/* The mxfp8 recipe's SwiGLU in one pass: MXFP8 a, b [n] (h1, h3) read and MXFP8 outputs
 * written directly, 4 values a lane and a warp 4 blocks of 32 at a time (moe_mx_walk,
 * moe_mx_load4, moe_mx_encode4), each output the encoding of its bf16 rounding: the values of
 * decoding, running the kernels above into bf16 and encoding, in one pass instead of four. */
__global__ void k_swiglu_fwd_mx(uint8_t *oq, uint8_t *omx, const uint8_t *aq, const uint8_t *amx,
                                const uint8_t *bq, const uint8_t *bmx, int64_t n) {
    moe_mx_walk(n, [&](int64_t i) {
        float o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (i < n) {
            float av[4], bv[4];
            moe_mx_load4(aq, amx, i, av);
            moe_mx_load4(bq, bmx, i, bv);
#pragma unroll
            for (int j = 0; j < 4; j++)
                o[j] = moe_dev_round_bf16(swiglu_val(av[j], bv[j], true));
        }
        uint8_t code;
        const uint32_t w = moe_mx_encode4(o, 0, &code);
        if (i < n) moe_mx_store4(oq, omx, i, w, code);
    });
}

/* da, db may be a, b (in place: a block's reads come before its writes, moe_mx_encode4) */
template <typename TD>
__global__ void k_swiglu_bwd_mx(uint8_t *daq, uint8_t *damx, uint8_t *dbq, uint8_t *dbmx,
                                const TD *__restrict__ dout, const uint8_t *aq, const uint8_t *amx,
                                const uint8_t *bq, const uint8_t *bmx, int64_t n) {
    moe_mx_walk(n, [&](int64_t i) {
        float dav[4] = {0.0f, 0.0f, 0.0f, 0.0f}, dbv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (i < n) {
            float av[4], bv[4], g[4];
            moe_mx_load4(aq, amx, i, av);
            moe_mx_load4(bq, bmx, i, bv);
            moe_ldv<4>(dout, i, g);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                swiglu_grad(g[j], av[j], bv[j], true, &dav[j], &dbv[j]);
                dav[j] = moe_dev_round_bf16(dav[j]), dbv[j] = moe_dev_round_bf16(dbv[j]);
            }
        }
        uint8_t ca, cb;
        const uint32_t wa = moe_mx_encode4(dav, 0, &ca), wb = moe_mx_encode4(dbv, 0, &cb);
        if (i < n) moe_mx_store4(daq, damx, i, wa, ca), moe_mx_store4(dbq, dbmx, i, wb, cb);
    });
}

/* 1 when every operand is MXFP8 at a 4-byte boundary and n % 32 == 0: the one-pass kernels
 * above run. */
static int swiglu_mx_fused(int64_t n, moe_cbuf p0, moe_cbuf p1, moe_cbuf p2, moe_cbuf p3) {
    const moe_cbuf ps[4] = {p0, p1, p2, p3};
    for (int i = 0; i < 4; i++)
        if (!ps[i].mx || (uintptr_t)ps[i].p % 4) return 0;
    return n % 32 == 0;
}

template <int V, typename TI, typename TO>
static void swiglu_fwd_launch(moe_cuda_ctx *c, moe_buf out, moe_cbuf a, moe_cbuf b, int64_t n,
                              int rb) {
    k_swiglu_fwd<V><<<moe_cuda_grid(c, n / V, 256), 256, 0, c->stream>>>(
        (TO *)out.p, (const TI *)a.p, (const TI *)b.p, n, rb);
}

template <int V>
static void swiglu_fwd_types(moe_cuda_ctx *c, moe_buf out, moe_cbuf a, moe_cbuf b, int64_t n,
                             int rb) {
    typedef __nv_bfloat16 bf;
    if (a.dt == MOE_DTYPE_BF16 && out.dt == MOE_DTYPE_BF16)
        swiglu_fwd_launch<V, bf, bf>(c, out, a, b, n, rb);
    else if (a.dt == MOE_DTYPE_BF16)
        swiglu_fwd_launch<V, bf, float>(c, out, a, b, n, rb);
    else if (out.dt == MOE_DTYPE_BF16)
        swiglu_fwd_launch<V, float, bf>(c, out, a, b, n, rb);
    else
        swiglu_fwd_launch<V, float, float>(c, out, a, b, n, rb);
}

/* The inputs share one type (both are expert activations); the output may differ. The mxfp8
 * recipe's h1, h3 and g: all three MXFP8, in one pass (k_swiglu_fwd_mx); fp8-block's pair in
 * one pass too (quant_fp8.cu). */
void moe_cuda_swiglu_forward(const moe_backend *be, moe_buf out, moe_cbuf a, moe_cbuf b, int64_t n,
                             moe_recipe prec, const moe_fp8_groups *pairs) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    const char *op = "swiglu_forward";
    if (moe_cuda_failed(c) || n <= 0) return;
    if (pairs) {
        if (out.dt != MOE_DTYPE_E4M3 || out.mx || n != (int64_t)pairs->offsets[pairs->E] * pairs->K)
            moe_cuda_check(c, cudaErrorInvalidValue, op,
                           "fp8-block pair: n=%lld, output %s (a pair of offsets[E] x K values "
                           "expected)",
                           (long long)n, moe_dtype_name(out.dt));
        else
            moe_cuda_swiglu_forward_pair(c, (uint8_t *)out.p, a, b, pairs, op);
        return;
    }
    if (swiglu_mx_fused(n, a, b, moe_cbuf_from(out), moe_cbuf_from(out))) {
        k_swiglu_fwd_mx<<<moe_cuda_grid(c, n / 4, 256), 256, 0, c->stream>>>(
            (uint8_t *)out.p, out.mx, (const uint8_t *)a.p, a.mx, (const uint8_t *)b.p, b.mx, n);
        MOE_CUDA_LAUNCHED(c, op, "n=%lld (MXFP8)", (long long)n);
        return;
    }
    if (!moe_cuda_typed_ok(c, out.dt, op) || !moe_cuda_typed_ok(c, a.dt, op)) return;
    if (a.dt != b.dt) {
        moe_cuda_check(c, cudaErrorInvalidValue, op, "inputs of two types (%s, %s)",
                       moe_dtype_name(a.dt), moe_dtype_name(b.dt));
        return;
    }
    int rb = prec == MOE_RECIPE_BF16;
    if (moe_cuda_vec_ok(n, out.p, a.p, b.p))
        swiglu_fwd_types<MOE_VEC>(c, out, a, b, n, rb);
    else
        swiglu_fwd_types<1>(c, out, a, b, n, rb);
    MOE_CUDA_LAUNCHED(c, op, "n=%lld", (long long)n);
}

template <int V, typename TI, typename TG, typename TD>
static void swiglu_bwd_launch(moe_cuda_ctx *c, moe_buf da, moe_buf db, moe_cbuf dout, moe_cbuf a,
                              moe_cbuf b, int64_t n) {
    k_swiglu_bwd<V><<<moe_cuda_grid(c, n / V, 256), 256, 0, c->stream>>>(
        (TG *)da.p, (TG *)db.p, (const TD *)dout.p, (const TI *)a.p, (const TI *)b.p, n);
}

template <int V, typename TD>
static void swiglu_bwd_types(moe_cuda_ctx *c, moe_buf da, moe_buf db, moe_cbuf dout, moe_cbuf a,
                             moe_cbuf b, int64_t n) {
    typedef __nv_bfloat16 bf;
    if (a.dt == MOE_DTYPE_BF16 && da.dt == MOE_DTYPE_BF16)
        swiglu_bwd_launch<V, bf, bf, TD>(c, da, db, dout, a, b, n);
    else if (a.dt == MOE_DTYPE_BF16)
        swiglu_bwd_launch<V, bf, float, TD>(c, da, db, dout, a, b, n);
    else if (da.dt == MOE_DTYPE_BF16)
        swiglu_bwd_launch<V, float, bf, TD>(c, da, db, dout, a, b, n);
    else
        swiglu_bwd_launch<V, float, float, TD>(c, da, db, dout, a, b, n);
}

template <int V>
static void swiglu_bwd_dout(moe_cuda_ctx *c, moe_buf da, moe_buf db, moe_cbuf dout, moe_cbuf a,
                            moe_cbuf b, int64_t n) {
    if (dout.dt == MOE_DTYPE_BF16)
        swiglu_bwd_types<V, __nv_bfloat16>(c, da, db, dout, a, b, n);
    else
        swiglu_bwd_types<V, float>(c, da, db, dout, a, b, n);
}

/* The mxfp8 recipe's dh1, dh3 over h1, h3: all four MXFP8, in one pass (k_swiglu_bwd_mx);
 * fp8-block's pairs in one pass too (quant_fp8.cu). */
void moe_cuda_swiglu_backward(const moe_backend *be, moe_buf da, moe_buf db, moe_cbuf dout,
                              moe_cbuf a, moe_cbuf b, int64_t n, const moe_fp8_groups *pairs) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    const char *op = "swiglu_backward";
    if (moe_cuda_failed(c) || n <= 0 || !moe_cuda_typed_ok(c, dout.dt, op)) return;
    if (pairs) {
        if (da.dt != MOE_DTYPE_E4M3 || db.dt != MOE_DTYPE_E4M3 || da.mx || db.mx ||
            n != (int64_t)pairs->offsets[pairs->E] * pairs->K)
            moe_cuda_check(c, cudaErrorInvalidValue, op,
                           "fp8-block pairs: n=%lld, outputs %s/%s (two pairs of offsets[E] x K "
                           "values expected)",
                           (long long)n, moe_dtype_name(da.dt), moe_dtype_name(db.dt));
        else
            moe_cuda_swiglu_backward_pairs(c, (uint8_t *)da.p, (uint8_t *)db.p, dout, a, b, pairs,
                                           op);
        return;
    }
    /* (an fp32 dout is read 4 values at a time: 16-byte aligned) */
    if (swiglu_mx_fused(n, a, b, moe_cbuf_from(da), moe_cbuf_from(db)) &&
        (dout.dt == MOE_DTYPE_BF16 || (uintptr_t)dout.p % 16 == 0)) {
        const unsigned grid = moe_cuda_grid(c, n / 4, 256);
        uint8_t *daq = (uint8_t *)da.p, *dbq = (uint8_t *)db.p;
        const uint8_t *aq = (const uint8_t *)a.p, *bq = (const uint8_t *)b.p;
        if (dout.dt == MOE_DTYPE_BF16)
            k_swiglu_bwd_mx<<<grid, 256, 0, c->stream>>>(
                daq, da.mx, dbq, db.mx, (const __nv_bfloat16 *)dout.p, aq, a.mx, bq, b.mx, n);
        else
            k_swiglu_bwd_mx<<<grid, 256, 0, c->stream>>>(
                daq, da.mx, dbq, db.mx, (const float *)dout.p, aq, a.mx, bq, b.mx, n);
        MOE_CUDA_LAUNCHED(c, op, "n=%lld (MXFP8)", (long long)n);
        return;
    }
    if (!moe_cuda_typed_ok(c, a.dt, op) || !moe_cuda_typed_ok(c, da.dt, op)) return;
    if (a.dt != b.dt || da.dt != db.dt) {
        moe_cuda_check(c, cudaErrorInvalidValue, op, "pairs of two types (%s, %s; %s, %s)",
                       moe_dtype_name(a.dt), moe_dtype_name(b.dt), moe_dtype_name(da.dt),
                       moe_dtype_name(db.dt));
        return;
    }
    if (moe_cuda_vec_ok(n, da.p, db.p, dout.p, a.p, b.p))
        swiglu_bwd_dout<MOE_VEC>(c, da, db, dout, a, b, n);
    else
        swiglu_bwd_dout<1>(c, da, db, dout, a, b, n);
    MOE_CUDA_LAUNCHED(c, op, "n=%lld", (long long)n);
}

/* ------------------------------------------------------------------------------------------
 * pooling over a range of positions per row (moe-embed). A block owns 32 columns of one row;
 * its 8 lanes of warps each walk every 8th position in order and the 8 partial sums are added
 * in lane order: a fixed order, so repeated runs are bit-identical. */

#define POOL_LANES 8

__global__ void k_pool_fwd(float *__restrict__ out, const float *__restrict__ x,
                           const int32_t *__restrict__ range, int64_t T, int64_t C, int max) {
    __shared__ double part[POOL_LANES][32];
    int64_t b = blockIdx.y, c = (int64_t)blockIdx.x * 32 + threadIdx.x;
    int64_t first = range[2 * b], cnt = range[2 * b + 1];
    double acc = max ? -INFINITY : 0.0;
    if (c < C)
        for (int64_t t = threadIdx.y; t < cnt; t += POOL_LANES) {
            double v = x[(b * T + first + t) * C + c];
            acc = max ? fmax(acc, v) : acc + v;
        }
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        for (int l = 1; l < POOL_LANES; l++)
            acc = max ? fmax(acc, part[l][threadIdx.x]) : acc + part[l][threadIdx.x];
        out[b * C + c] = (float)(max ? acc : acc / (double)cnt);
    }
}

void moe_cuda_pool_forward(const moe_backend *be, float *out, const float *x, const int32_t *range,
                           int64_t B, int64_t T, int64_t C, int max) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    if (moe_cuda_failed(c) || B <= 0 || C <= 0) return;
    dim3 grid((unsigned)((C + 31) / 32), (unsigned)B), block(32, POOL_LANES);
    k_pool_fwd<<<grid, block, 0, c->stream>>>(out, x, range, T, C, max);
    MOE_CUDA_LAUNCHED(c, "pool_forward", "B=%lld T=%lld C=%lld", (long long)B, (long long)T,
                      (long long)C);
}

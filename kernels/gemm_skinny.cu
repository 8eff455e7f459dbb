/* gemm_skinny: the fp32 recipe's matrix products with few outputs (O <= MOE_CUDA_SKINNY_MAX_O),
 * the MoE router's gate above all: x [N, C] (bf16 under the bf16 recipe) times W [E, C]^T with
 * E = 8. cuBLAS tiles waste most of their width on 8 outputs and its fp32 product needs x
 * widened to fp32 first; these kernels read x in its own type once per pass and hold the weight
 * in shared memory (forward) or registers (dgrad). On an H100 (2026-12-05, gpu_test_backend_ops
 * --perf --only gate) mixtral's gate (N 8192, C 4096, bf16 x) took 44 us forward and 145 us
 * backward, against 181 and 340 through cuBLAS: dgrad near the memory's pace (2.7 TB/s), the
 * forward and the weight gradient at about half of it (1.6 TB/s), whether the next loads sat
 * in registers (here) or in a cp.async ring in shared memory, and whether or not the warps
 * read the columns in skewed order (both tried, no faster).
 *
 * Every sum is fp32 FMAs (no TF32, no bf16), in an order fixed by the shapes alone, so a call
 * gives the same bits every run (no atomics): the forward sums each lane's columns, then the
 * warp's lanes by a butterfly; the weight gradient sums each warp's rows, the block's warps in
 * warp order, then the row slices of MOE_CUDA_SKINNY_ROWS rows in slice order (a second kernel
 * over the partials in the reduction scratch slot).
 *
 * The one thing a reader must know: the forward and the weight gradient take the outputs in
 * passes of SK_OG (8), each pass reading x once, so their time grows with ceil(O / 8); dgrad
 * holds all O (up to 32) at once and reads and writes dx once. Shapes the kernels take:
 * moe_cuda_skinny_shape (I a multiple of 8, at most MOE_CUDA_SKINNY_MAX_I). */
#include <cuda_pipeline.h>

#include "backend_cuda.cuh"
#include "ops/cuda_scratch.h"

#define SK_OG 8     /* outputs per pass of the forward and the weight gradient */
#define SK_STEP 256 /* columns a warp covers in one step: 32 lanes x 8 */
#define SK_FWD_THREADS 512
#define SK_DX_THREADS 256 /* 4 columns a thread: 1024 columns a block */
#define SK_DX_ROWS 32     /* rows of a dgrad block */
#define SK_DW_THREADS 256 /* 8 warps over the same 256 columns */
#define SK_DX_BATCH 4     /* rows of dx whose loads a thread has in flight */

/* Rows a forward warp sums at a time, 4 of bf16 and 2 of fp32 (64 bytes of x a lane): each 32
 * bytes of the weight read from shared memory serve them all, which keeps those reads below
 * the memory's pace, and their next step's loads are in flight meanwhile. */
template <typename TX> __host__ __device__ constexpr int sk_rows() {
    return (int)(8 / sizeof(TX));
}

/* Eight consecutive elements of x as a lane loads them (16 bytes of bf16, 32 of fp32), held
 * raw until used, so that the next rows' can be in flight at half the registers of floats
 * (bf16). Loaded as streamed (__ldcs): a pass reads x once. */
template <typename TX> struct sk_raw8 { uint4 q[sizeof(TX) / 2]; };

/* v = x [N, I] at row n, columns c .. c + 7 (16-byte aligned), or zeros past N or I; rows: v[r]
 * of row n0 + r dn */
template <typename TX>
__device__ __forceinline__ void sk_load_row(sk_raw8<TX> &v, const TX *__restrict__ x, int64_t n,
                                            int c, int64_t N, int I) {
#pragma unroll
    for (int k = 0; k < (int)(sizeof(TX) / 2); k++)
        v.q[k] = n < N && c < I ? __ldcs(reinterpret_cast<const uint4 *>(x + n * I + c) + k)
                                : make_uint4(0, 0, 0, 0);
}
template <int R, typename TX>
__device__ __forceinline__ void sk_load_rows(sk_raw8<TX> (&v)[R], const TX *__restrict__ x,
                                             int64_t n0, int dn, int c, int64_t N, int I) {
#pragma unroll
    for (int r = 0; r < R; r++)
        sk_load_row(v[r], x, n0 + r * dn, c, N, I);
}

template <typename TX> __device__ __forceinline__ void sk_widen(const sk_raw8<TX> &v, float f[8]) {
    moe_ldv<8>(reinterpret_cast<const TX *>(v.q), 0, f);
}

/* ------------------------------------------------------------------------------------------
 * forward: y [N, O] = x [N, I] w^T */

/* Outputs [o0, o0 + og) of blockIdx.y (o0 = pass blockIdx.y, og = min(pass, O - o0); pass is 8,
 * or fewer where the device's shared memory holds fewer rows of w): the block
 * stages those rows of w in shared memory, ws [og][steps][2][32] float4 (lane l's 8 columns of
 * step s as two float4 32 lanes apart: conflict-free reads), then each warp takes
 * sk_rows rows at a time (grid-stride), a lane summing its 8 columns of every step, the
 * warp's lanes summed last. The next step's x is in flight while a step is summed (the first
 * while w is staged). x 16-byte aligned, I a multiple of 8. */
template <typename TY, typename TX>
__global__ void __launch_bounds__(SK_FWD_THREADS)
    k_skinny_fwd(TY *__restrict__ y /* [N, O] */, const TX *__restrict__ x /* [N, I] */,
                 const float *__restrict__ w /* [O, I] */, int64_t N, int I, int O, int pass) {
    constexpr int R = sk_rows<TX>();
    static_assert(R * SK_OG <= 32, "a forward warp writes its sums one a lane");
    extern __shared__ float4 ws[];
    const int steps = (I + SK_STEP - 1) / SK_STEP, q4 = I / 4, o0 = blockIdx.y * pass;
    const int og = O - o0 < pass ? O - o0 : pass;
    for (int q = threadIdx.x; q < og * q4; q += blockDim.x) {
        const int o = q / q4, c = q % q4 * 4;
        float4 *dst = &ws[((o * steps + c / SK_STEP) * 2 + c % 8 / 4) * 32 + c % SK_STEP / 8];
        __pipeline_memcpy_async(dst, w + (int64_t)(o0 + o) * I + c, sizeof(float4));
    }
    __pipeline_commit();
    const int lane = threadIdx.x & 31, wpb = blockDim.x / 32;
    const int64_t stride = (int64_t)gridDim.x * wpb * R;
    int64_t n0 = ((int64_t)blockIdx.x * wpb + threadIdx.x / 32) * R;
    sk_raw8<TX> nx[R];
    sk_load_rows(nx, x, n0, 1, lane * 8, N, I);
    __pipeline_wait_prior(0);
    __syncthreads();
    for (; n0 < N; n0 += stride) {
        float acc[R][SK_OG] = {};
        for (int s = 0; s < steps; s++) {
            const int c = s * SK_STEP + lane * 8;
            float xv[R][8];
#pragma unroll
            for (int r = 0; r < R; r++)
                sk_widen(nx[r], xv[r]);
            if (s + 1 < steps)
                sk_load_rows(nx, x, n0, 1, c + SK_STEP, N, I);
            else
                sk_load_rows(nx, x, n0 + stride, 1, lane * 8, N, I);
            if (c >= I) continue; /* the last step's lanes past the row */
#pragma unroll
            for (int o = 0; o < SK_OG; o++) {
                if (o >= og) break;
                const float4 a = ws[(o * steps + s) * 64 + lane],
                             b = ws[(o * steps + s) * 64 + 32 + lane];
                const float wv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
                for (int r = 0; r < R; r++)
#pragma unroll
                    for (int j = 0; j < 8; j++)
                        acc[r][o] = fmaf(xv[r][j], wv[j], acc[r][o]);
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int o = 0; o < SK_OG; o++) {
                const float v = moe_warp_sum(acc[r][o]);
                if (lane == r * SK_OG + o && o < og && n0 + r < N)
                    moe_st(y, (n0 + r) * O + o0 + o, v);
            }
    }
}

/* The forward's launch: as many blocks as run at once (each stages w once), fewer when the rows
 * need fewer; one row of blocks per pass of up to 8 outputs, as many rows of w as the device's
 * shared memory holds (at 4096 columns: 8 on an A100 or H100, 6 in an sm_86/89 GPU's 99 KB).
 * 0 after a recorded error. */
template <typename TY, typename TX>
static int skinny_fwd_launch(moe_cuda_ctx *c, TY *y, const TX *x, const float *w, int64_t N, int I,
                             int O, const char *op) {
    const int steps = (I + SK_STEP - 1) / SK_STEP;
    const size_t row = (size_t)steps * SK_STEP * sizeof(float); /* a row of w, staged */
    const int fit_rows = (int)((size_t)c->smem_optin / row);    /* >= 3 at I <= 4096 (48 KB) */
    int pass = O < SK_OG ? O : SK_OG;
    pass = pass < fit_rows ? pass : fit_rows;
    const size_t smem = (size_t)pass * row;
    int per_sm = 0;
    if (!moe_cuda_check(c,
                        cudaFuncSetAttribute(k_skinny_fwd<TY, TX>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem),
                        op, "skinny forward: shared memory %zu bytes", smem) ||
        !moe_cuda_check(c,
                        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_skinny_fwd<TY, TX>,
                                                                      SK_FWD_THREADS, smem),
                        op, "skinny forward: occupancy of %zu bytes", smem))
        return 0;
    const int64_t rows_per_block = SK_FWD_THREADS / 32 * sk_rows<TX>();
    const int64_t want = (N + rows_per_block - 1) / rows_per_block;
    const int64_t fit = (int64_t)(per_sm > 0 ? per_sm : 1) * c->num_sms;
    const dim3 grid((unsigned)(want < fit ? want : fit), (unsigned)((O + pass - 1) / pass));
    k_skinny_fwd<TY, TX><<<grid, SK_FWD_THREADS, smem, c->stream>>>(y, x, w, N, I, O, pass);
    return MOE_CUDA_LAUNCHED(c, op, "skinny forward N=%lld I=%d O=%d", (long long)N, I, O);
}

template <typename TX>
static int skinny_fwd_out(moe_cuda_ctx *c, moe_buf y, const TX *x, const float *w, int64_t N, int I,
                          int O, const char *op) {
    if (y.dt == MOE_DTYPE_BF16)
        return skinny_fwd_launch(c, (__nv_bfloat16 *)y.p, x, w, N, I, O, op);
    return skinny_fwd_launch(c, (float *)y.p, x, w, N, I, O, op);
}

/* ------------------------------------------------------------------------------------------
 * dgrad: dx [N, I] (+)= dy [N, O] w [O, I] */

/* Block (blockIdx.x, blockIdx.y) takes rows [32 blockIdx.x, + 32) and columns [1024 blockIdx.y,
 * + 1024), 4 a thread, with w's OT x 4 values of them in registers and the rows' dy in shared
 * memory (zeros past O); add: 1 adds into dx, 0 writes it (never read). w and dx 16-byte
 * aligned, I a multiple of 8, O <= OT. */
template <int OT>
__global__ void __launch_bounds__(SK_DX_THREADS)
    k_skinny_dx(float *__restrict__ dx /* [N, I] */, const float *__restrict__ dy /* [N, O] */,
                const float *__restrict__ w /* [O, I] */, int64_t N, int I, int O, int add) {
    __shared__ __align__(16) float dys[SK_DX_ROWS][OT];
    const int64_t n0 = (int64_t)blockIdx.x * SK_DX_ROWS;
    const int rows = N - n0 < SK_DX_ROWS ? (int)(N - n0) : SK_DX_ROWS;
    for (int q = threadIdx.x; q < SK_DX_ROWS * OT; q += blockDim.x) {
        const int r = q / OT, o = q % OT;
        dys[r][o] = r < rows && o < O ? dy[(n0 + r) * O + o] : 0.0f;
    }
    __syncthreads();
    const int c = (blockIdx.y * blockDim.x + threadIdx.x) * 4;
    if (c >= I) return;
    float wv[OT][4];
#pragma unroll
    for (int o = 0; o < OT; o++) {
        if (o < O) {
            moe_ldv<4>(w, (int64_t)o * I + c, wv[o]);
        } else {
#pragma unroll
            for (int j = 0; j < 4; j++)
                wv[o][j] = 0.0f;
        }
    }
    for (int r0 = 0; r0 < rows; r0 += SK_DX_BATCH) {
        float d[SK_DX_BATCH][4];
#pragma unroll
        for (int u = 0; u < SK_DX_BATCH; u++) {
            if (add && r0 + u < rows) {
                moe_ldv<4>(dx, (n0 + r0 + u) * I + c, d[u]);
            } else {
#pragma unroll
                for (int j = 0; j < 4; j++)
                    d[u][j] = 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < SK_DX_BATCH; u++) {
            if (r0 + u >= rows) break;
            const float4 *g4 = reinterpret_cast<const float4 *>(dys[r0 + u]);
            float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int o4 = 0; o4 < OT / 4; o4++) {
                const float4 g = g4[o4];
                const float gv[4] = {g.x, g.y, g.z, g.w};
#pragma unroll
                for (int k = 0; k < 4; k++)
#pragma unroll
                    for (int j = 0; j < 4; j++)
                        s[j] = fmaf(gv[k], wv[o4 * 4 + k][j], s[j]);
            }
#pragma unroll
            for (int j = 0; j < 4; j++)
                d[u][j] += s[j];
            moe_stv<4>(dx, (n0 + r0 + u) * I + c, d[u]);
        }
    }
}

template <int OT>
static void skinny_dx_launch(moe_cuda_ctx *c, float *dx, const float *dy, const float *w, int64_t N,
                             int I, int O, int add) {
    const dim3 grid((unsigned)((N + SK_DX_ROWS - 1) / SK_DX_ROWS),
                    (unsigned)((I + 4 * SK_DX_THREADS - 1) / (4 * SK_DX_THREADS)));
    k_skinny_dx<OT><<<grid, SK_DX_THREADS, 0, c->stream>>>(dx, dy, w, N, I, O, add);
}

/* ------------------------------------------------------------------------------------------
 * wgrad: dw [O, I] (+)= dy^T [O, N] x [N, I], by row slices into partials, then their sum */

/* part [S, O, I] (S = ceil(N / MOE_CUDA_SKINNY_ROWS)): block (s, b, z) writes part[s, o, c] =
 * the sum over the rows n of slice s of dy[n, o] x[n, c] for the 256 columns c of b and the
 * outputs o of pass z. Each lane holds its 8 columns x 8 outputs; warp k takes the slice's rows
 * k, k + 8, ... (dy's in shared memory, zeros past O); the 8 warps' sums are added in warp
 * order through shared memory. x 16-byte aligned, I a multiple of 8. */
template <typename TX>
__global__ void __launch_bounds__(SK_DW_THREADS, 2)
    k_skinny_dw(float *__restrict__ part /* [S, O, I] */, const float *__restrict__ dy /* [N, O] */,
                const TX *__restrict__ x /* [N, I] */, int64_t N, int I, int O) {
    constexpr int NW = SK_DW_THREADS / 32;
    __shared__ __align__(16) float dys[MOE_CUDA_SKINNY_ROWS][SK_OG];
    __shared__ __align__(16) float red[NW][SK_STEP];
    const int64_t n0 = (int64_t)blockIdx.x * MOE_CUDA_SKINNY_ROWS;
    const int rows = N - n0 < MOE_CUDA_SKINNY_ROWS ? (int)(N - n0) : MOE_CUDA_SKINNY_ROWS;
    const int o0 = blockIdx.z * SK_OG, og = O - o0 < SK_OG ? O - o0 : SK_OG;
    for (int q = threadIdx.x; q < MOE_CUDA_SKINNY_ROWS * SK_OG; q += blockDim.x) {
        const int r = q / SK_OG, o = q % SK_OG;
        dys[r][o] = r < rows && o < og ? dy[(n0 + r) * O + o0 + o] : 0.0f;
    }
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    const int c = blockIdx.y * SK_STEP + lane * 8;
    float acc[SK_OG][8] = {};
    /* rows r0 + u NW in flight, each reloaded with its next once widened: 4 of bf16, one of
     * fp32 (two would spill the accumulators) */
    constexpr int B = sizeof(TX) == 2 ? 4 : 1;
    sk_raw8<TX> nx[B];
    sk_load_rows(nx, x, n0 + warp, NW, c, n0 + rows, I);
    for (int r0 = warp; c < I && r0 < rows; r0 += NW * B) {
#pragma unroll
        for (int u = 0; u < B; u++) {
            const int r = r0 + u * NW;
            if (r >= rows) break;
            float xv[8];
            sk_widen(nx[u], xv);
            sk_load_row(nx[u], x, n0 + r + NW * B, c, n0 + rows, I);
            const float4 *g4 = reinterpret_cast<const float4 *>(dys[r]);
            const float4 ga = g4[0], gb = g4[1];
            const float g[SK_OG] = {ga.x, ga.y, ga.z, ga.w, gb.x, gb.y, gb.z, gb.w};
#pragma unroll
            for (int o = 0; o < SK_OG; o++)
#pragma unroll
                for (int j = 0; j < 8; j++)
                    acc[o][j] = fmaf(g[o], xv[j], acc[o][j]);
        }
    }
    const int col = blockIdx.y * SK_STEP + threadIdx.x; /* the column thread t sums */
#pragma unroll
    for (int o = 0; o < SK_OG; o++) {
        if (o >= og) break;
        float4 *rw = reinterpret_cast<float4 *>(&red[warp][lane * 8]);
        rw[0] = make_float4(acc[o][0], acc[o][1], acc[o][2], acc[o][3]);
        rw[1] = make_float4(acc[o][4], acc[o][5], acc[o][6], acc[o][7]);
        __syncthreads();
        if (col < I) {
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < NW; k++)
                s += red[k][threadIdx.x];
            part[((int64_t)blockIdx.x * O + o0 + o) * I + col] = s;
        }
        __syncthreads();
    }
}

/* dw [n] (+)= the sum of the S partials part [S, n] in slice order (add: 1 adds, 0 writes). */
__global__ void k_skinny_dw_sum(float *__restrict__ dw, const float *__restrict__ part, int64_t S,
                                int64_t n, int add) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += stride) {
        float s = 0.0f;
#pragma unroll 8
        for (int64_t k = 0; k < S; k++)
            s += part[k * n + e];
        dw[e] = add ? dw[e] + s : s;
    }
}

template <typename TX>
static void skinny_dw_launch(moe_cuda_ctx *c, float *part, const float *dy, const TX *x, int64_t N,
                             int I, int O) {
    const dim3 grid((unsigned)((N + MOE_CUDA_SKINNY_ROWS - 1) / MOE_CUDA_SKINNY_ROWS),
                    (unsigned)((I + SK_STEP - 1) / SK_STEP), (unsigned)((O + SK_OG - 1) / SK_OG));
    k_skinny_dw<TX><<<grid, SK_DW_THREADS, 0, c->stream>>>(part, dy, x, N, I, O);
}

/* ------------------------------------------------------------------------------------------
 * entry points (backend_cuda.cuh) */

int moe_cuda_skinny_ok(moe_recipe prec, moe_cbuf x, moe_cbuf w, int64_t I, int64_t O, moe_dtype out,
                       const float *dx) {
    return prec == MOE_RECIPE_FP32 && moe_cuda_skinny_shape(I, O) && !x.mx &&
           (x.dt == MOE_DTYPE_F32 || x.dt == MOE_DTYPE_BF16) && w.dt == MOE_DTYPE_F32 &&
           (out == MOE_DTYPE_F32 || out == MOE_DTYPE_BF16) && moe_cuda_vec_ok(I, x.p, w.p, dx);
}

int moe_cuda_skinny_forward(moe_cuda_ctx *c, moe_buf y, moe_cbuf x, const float *w, int64_t N,
                            int64_t I, int64_t O, const char *op) {
    if (x.dt == MOE_DTYPE_BF16)
        return skinny_fwd_out(c, y, (const __nv_bfloat16 *)x.p, w, N, (int)I, (int)O, op);
    return skinny_fwd_out(c, y, (const float *)x.p, w, N, (int)I, (int)O, op);
}

int moe_cuda_skinny_backward(moe_cuda_ctx *c, float *dx, float *dw, const float *dy, moe_cbuf x,
                             const float *w, int64_t N, int64_t I, int64_t O, float bx, float bw,
                             const char *op) {
    if (dx) {
        const int add = bx != 0.0f;
        if (O <= 8)
            skinny_dx_launch<8>(c, dx, dy, w, N, (int)I, (int)O, add);
        else if (O <= 16)
            skinny_dx_launch<16>(c, dx, dy, w, N, (int)I, (int)O, add);
        else
            skinny_dx_launch<32>(c, dx, dy, w, N, (int)I, (int)O, add);
        if (!MOE_CUDA_LAUNCHED(c, op, "skinny dgrad N=%lld I=%lld O=%lld", (long long)N,
                               (long long)I, (long long)O))
            return 0;
    }
    if (!dw) return 1;
    const int64_t S = (N + MOE_CUDA_SKINNY_ROWS - 1) / MOE_CUDA_SKINNY_ROWS;
    float *part =
        (float *)moe_cuda_scratch(c, MOE_CUDA_SCRATCH_RED, (size_t)(S * O * I) * sizeof(float), op);
    if (!part) return 0;
    if (x.dt == MOE_DTYPE_BF16)
        skinny_dw_launch(c, part, dy, (const __nv_bfloat16 *)x.p, N, (int)I, (int)O);
    else
        skinny_dw_launch(c, part, dy, (const float *)x.p, N, (int)I, (int)O);
    if (!MOE_CUDA_LAUNCHED(c, op, "skinny wgrad N=%lld I=%lld O=%lld", (long long)N, (long long)I,
                           (long long)O))
        return 0;
    k_skinny_dw_sum<<<moe_cuda_grid(c, O * I, 256), 256, 0, c->stream>>>(dw, part, S, O * I,
                                                                         bw != 0.0f);
    return MOE_CUDA_LAUNCHED(c, op, "skinny wgrad sum of %lld slices, O=%lld I=%lld", (long long)S,
                             (long long)O, (long long)I);
}

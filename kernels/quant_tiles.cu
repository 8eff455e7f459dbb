/* quant_tiles: the fp8-block weight copies of the CUDA backend (moe/ops.h's quantize_weight
 * and adamw_quantize): each 128 x 128 tile of a weight [E, O, I] with one scale, written
 * row-wise and transposed from one read of the fp32 master - by itself (k_fp8_tiles) or inside
 * the AdamW pass that has just updated the master (k_adamw_tiles, which reads it once where
 * AdamW and quantize_weight would read it twice). The bytes are moe_quant_tiles_e4m3's
 * (libcore/src/num/quant.c); the encoding is quant_fp8.cuh's. */
#include "adamw.cuh"
#include "quant_fp8.cuh"

#define TILE_THREADS 512                            /* 16 warps a 128 x 128 tile */
#define TILE_PATCHES (QB / 4 / (TILE_THREADS / 32)) /* 4 x 4 patches a thread: 2 */

/* The fp8-block copies of tile (rb, kb) of expert e of a weight w [E, R, K] (R and K
 * multiples of 16) whose values x the block's 512 threads hold: warp ty, lane tx the 4 x 4
 * patches g = ty + 16 p (rows 4 g .. 4 g + 3 of columns 4 tx .. 4 tx + 3 of the tile; zeros
 * outside w). The row-wise copy q [E, R, K] with s [E, RB * KB4] at rb * KB4 + kb, and the
 * transposed copy qt [E, K, R] with st [E, KB * RB4] at kb * RB4 + rb (the same scale values;
 * moe/ops.h's fp8-block weight layout). Row-wise, a patch row leaves as one 4-byte store;
 * transposed, a patch's 4 columns become 4 words (a byte transpose) in the shared tile tt
 * [128 k][32 words], word (kl, g) kept at kl * 32 + (g ^ tx) so that a warp's 32 stores meet
 * 32 banks, and go out as 16-byte words, each row's 8 chunks in 8 different bank groups. */
__device__ __forceinline__ void fp8_tile_store(const float4 (&x)[TILE_PATCHES][4], uint8_t *q,
                                               float *s, uint8_t *qt, float *st, int64_t R,
                                               int64_t K, int64_t e, int64_t rb, int64_t kb,
                                               int pow2) {
    constexpr int NW = TILE_THREADS / 32;
    __shared__ float sh[NW];
    __shared__ uint4 tt[QB * QB / 16];
    const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    const int64_t RB = (R + QB - 1) / QB, KB = (K + QB - 1) / QB;
    const int64_t k0 = kb * QB + 4 * tx, r0 = rb * QB;
    float amax = fp8_lane_amax<TILE_PATCHES * 16>(&x[0][0].x);
    /* the tile's amax: warp maxima, one barrier, every warp reduces them again (sh is written
     * once) */
    amax = moe_warp_max(amax);
    if (tx == 0) sh[ty] = amax;
    __syncthreads();
    const fp8_quot d = fp8_quot_of(fp8_scale(moe_warp_max(sh[tx % NW]), pow2));
    if (threadIdx.x == 0) {
        const int64_t KB4 = (KB + 3) / 4 * 4, RB4 = (RB + 3) / 4 * 4;
        s[e * RB * KB4 + rb * KB4 + kb] = d.s;
        st[e * KB * RB4 + kb * RB4 + rb] = d.s;
    }
    uint8_t *qe = q + e * R * K, *qte = qt + e * R * K;
    uint32_t *tw = (uint32_t *)tt, rw[TILE_PATCHES][4];
    fp8_encode<TILE_PATCHES * 16>(&x[0][0].x, d.y, &rw[0][0]);
#pragma unroll
    for (int p = 0; p < TILE_PATCHES; p++) {
        const int g = ty + NW * p;
        uint32_t cw[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int64_t r = r0 + 4 * g + i;
            if (k0 < K && r < R) *(uint32_t *)(qe + r * K + k0) = rw[p][i];
        }
        moe_transpose4x4_bytes(rw[p], cw);
#pragma unroll
        for (int j = 0; j < 4; j++)
            tw[(4 * tx + j) * 32 + (g ^ tx)] = cw[j];
    }
    __syncthreads();
    /* chunk c: 16 bytes, rows r0 + 16 (c % 8) .. + 15 of qt's row kb * QB + c / 8 (R % 16 ==
     * 0: all in or all out); its words (x = kl / 4) are the 16 bytes at (c % 8) ^ (x / 4) of
     * tt's row kl, word t at position t ^ (x % 4) */
#pragma unroll
    for (int u = 0; u < QB * QB / 16 / TILE_THREADS; u++) {
        const int c = threadIdx.x + TILE_THREADS * u, kl = c / 8, m = c % 8, xs = kl / 4;
        const int64_t k = kb * QB + kl, r = r0 + 16 * m;
        if (k >= K || r >= R) continue;
        uint4 a = tt[kl * 8 + (m ^ (xs / 4))];
        uint32_t t;
        if (xs & 1) t = a.x, a.x = a.y, a.y = t, t = a.z, a.z = a.w, a.w = t;
        if (xs & 2) t = a.x, a.x = a.z, a.z = t, t = a.y, a.y = a.w, a.w = t;
        *(uint4 *)(qte + k * R + r) = a;
    }
}

/* The flat index in w [E, R, K] of row 4 g + i, column 4 tx of tile (rb, kb) of expert e (the
 * patches of fp8_tile_store), and whether it lies inside w. */
__device__ __forceinline__ bool tile_at(int64_t R, int64_t K, int64_t e, int64_t rb, int64_t kb,
                                        int g, int i, int64_t *at) {
    const int64_t k0 = kb * QB + 4 * (threadIdx.x % 32), r = rb * QB + 4 * g + i;
    *at = (e * R + r) * K + k0;
    return k0 < K && r < R;
}

/* The tile's values as fp8_tile_store takes them: x[p][i] = row(at) for each patch row inside
 * w (at: its flat index, tile_at), zeros outside. */
template <typename F>
__device__ __forceinline__ void tile_rows(float4 (&x)[TILE_PATCHES][4], int64_t R, int64_t K,
                                          F row) {
    const int ty = threadIdx.x / 32;
#pragma unroll
    for (int p = 0; p < TILE_PATCHES; p++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int64_t at;
            x[p][i] = tile_at(R, K, blockIdx.z, blockIdx.y, blockIdx.x, ty + 16 * p, i, &at)
                          ? row(at)
                          : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
}

/* One block of 512 threads per 128 x 128 tile (blockIdx.x = kb, .y = rb, .z = expert) of
 * w [E, R, K] fp32, w 16-byte aligned: the tile read once (one 16-byte load a patch row) and
 * its copies written by fp8_tile_store. 2.6 -> 4.2 TB/s on an H200 against the one-byte
 * transpose of 256 threads it replaced (docs/performance-gpu.md, 2026-12-04). */
__global__ void __launch_bounds__(TILE_THREADS)
    k_fp8_tiles(uint8_t *__restrict__ q, float *__restrict__ s, uint8_t *__restrict__ qt,
                float *__restrict__ st, const float *__restrict__ w, int64_t R, int64_t K,
                int pow2) {
    float4 x[TILE_PATCHES][4];
    tile_rows(x, R, K, [&](int64_t at) { return *(const float4 *)(w + at); });
    fp8_tile_store(x, q, s, qt, st, R, K, blockIdx.z, blockIdx.y, blockIdx.x, pow2);
}

/* AdamW (adamw.cuh's element, the flat kernel's bits) on a whole weight w [E, R, K] with an
 * fp32 master, then its fp8-block copies from the new values still in registers: the blocks
 * and patches of k_fp8_tiles, each patch row one 16-byte access of the master (and of fp32
 * gradients and moments; 8 bytes of bf16 ones). The master is read once where AdamW and
 * quantize_weight read it twice. param, grad, m and v aligned to their 4-element accesses. */
template <class M, class G>
__global__ void __launch_bounds__(TILE_THREADS, 2)
    k_adamw_tiles(float *__restrict__ param, const typename G::T *__restrict__ grad,
                  typename M::T *__restrict__ m, typename M::T *__restrict__ v, adamw_hp h,
                  uint8_t *__restrict__ q, float *__restrict__ s, uint8_t *__restrict__ qt,
                  float *__restrict__ st, int64_t R, int64_t K, int pow2) {
    float4 x[TILE_PATCHES][4];
    tile_rows(x, R, K, [&](int64_t at) {
        const int64_t i4 = at / 4;
        float4 w = __ldcs((const float4 *)param + i4), g = G::ld4(grad, i4), mi = M::ld4(m, i4),
               vi = M::ld4(v, i4);
        float *pw = &w.x, *pg = &g.x, *pm = &mi.x, *pv = &vi.x;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            adamw_moments<M>(pg[j], pm + j, pv + j, h);
            pw[j] = adamw_update<M>(pw[j], pm[j], pv[j], h);
        }
        __stcs((float4 *)param + i4, w);
        M::st4(m, i4, mi);
        M::st4(v, i4, vi);
        return w;
    });
    fp8_tile_store(x, q, s, qt, st, R, K, blockIdx.z, blockIdx.y, blockIdx.x, pow2);
}

void moe_cuda_quantize_weight(const moe_backend *be, uint8_t *q, float *s, const float *w,
                              int64_t E, int64_t O, int64_t I, moe_recipe prec) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    const char *op = "quantize_weight";
    if (moe_cuda_failed(c) || E <= 0 || O <= 0 || I <= 0) return;
    if (moe_recipe_format(prec) != MOE_RECIPE_FP8_BLOCK || !moe_cuda_fp8_shape_ok(I, O) ||
        (uintptr_t)w % 16 != 0) {
        moe_cuda_check(c, cudaErrorInvalidValue, op,
                       "E=%lld O=%lld I=%lld recipe %d (fp8-block, multiples of 16 and a "
                       "16-byte aligned weight expected)",
                       (long long)E, (long long)O, (long long)I, (int)prec);
        return;
    }
    dim3 grid((unsigned)((I + QB - 1) / QB), (unsigned)((O + QB - 1) / QB), (unsigned)E);
    k_fp8_tiles<<<grid, TILE_THREADS, 0, c->stream>>>(
        q, s, q + E * O * I, s + E * moe_fp8_tile_scales(O, I), w, O, I, moe_recipe_pow2(prec));
    MOE_CUDA_LAUNCHED(c, op, "E=%lld O=%lld I=%lld", (long long)E, (long long)O, (long long)I);
}

/* k_adamw_tiles for the moments' type M and the gradient's type */
template <class M>
static void adamw_tiles_g(moe_cuda_ctx *c, dim3 grid, float *param, moe_cbuf grad, moe_buf m,
                          moe_buf v, const adamw_hp &h, uint8_t *q, float *s, int64_t E, int64_t O,
                          int64_t I, int pow2) {
    typedef typename M::T T;
    uint8_t *qt = q + E * O * I;
    float *st = s + E * moe_fp8_tile_scales(O, I);
    if (grad.dt == MOE_DTYPE_BF16)
        k_adamw_tiles<M, grad_bf16><<<grid, TILE_THREADS, 0, c->stream>>>(
            param, (const uint16_t *)grad.p, (T *)m.p, (T *)v.p, h, q, s, qt, st, O, I, pow2);
    else
        k_adamw_tiles<M, grad_f32><<<grid, TILE_THREADS, 0, c->stream>>>(
            param, (const float *)grad.p, (T *)m.p, (T *)v.p, h, q, s, qt, st, O, I, pow2);
}

void moe_cuda_adamw_quantize(const moe_backend *be, float *param, moe_cbuf grad, moe_buf m,
                             moe_buf v, uint8_t *q, float *s, int64_t E, int64_t O, int64_t I,
                             moe_recipe prec, float lr, float beta1, float beta2, float eps,
                             float weight_decay, int64_t step, float grad_scale) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    const char *op = "adamw_quantize";
    if (moe_cuda_failed(c) || E <= 0 || O <= 0 || I <= 0) return;
    /* the 4-element accesses of k_adamw_tiles: 16 bytes of fp32, 8 of bf16 */
    const size_t gs = moe_dtype_size(grad.dt), ms = moe_dtype_size(m.dt);
    const int vec = (uintptr_t)param % 16 == 0 && (uintptr_t)grad.p % (4 * gs) == 0 &&
                    (uintptr_t)m.p % (4 * ms) == 0 && (uintptr_t)v.p % (4 * ms) == 0;
    if (!vec || m.dt != v.dt || moe_recipe_format(prec) != MOE_RECIPE_FP8_BLOCK ||
        !moe_cuda_fp8_shape_ok(I, O) || !moe_cuda_typed_ok(c, m.dt, op) ||
        !moe_cuda_typed_ok(c, grad.dt, op)) { /* the two passes, which check their arguments */
        moe_cuda_adamw(be, param, NULL, NULL, grad, m, v, E * O * I, lr, beta1, beta2, eps,
                       weight_decay, step, grad_scale);
        moe_cuda_quantize_weight(be, q, s, param, E, O, I, prec);
        return;
    }
    const adamw_hp h = adamw_params(lr, beta1, beta2, eps, weight_decay, step, grad_scale);
    const dim3 grid((unsigned)((I + QB - 1) / QB), (unsigned)((O + QB - 1) / QB), (unsigned)E);
    const int pow2 = moe_recipe_pow2(prec);
    if (m.dt == MOE_DTYPE_BF16)
        adamw_tiles_g<adamw_bf16>(c, grid, param, grad, m, v, h, q, s, E, O, I, pow2);
    else
        adamw_tiles_g<adamw_f32>(c, grid, param, grad, m, v, h, q, s, E, O, I, pow2);
    MOE_CUDA_LAUNCHED(c, op, "E=%lld O=%lld I=%lld moments %s grad %s", (long long)E, (long long)O,
                      (long long)I, moe_dtype_name(m.dt), moe_dtype_name(grad.dt));
}

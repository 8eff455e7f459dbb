/* attention_fp32: causal grouped-query attention in plain fp32 for the CUDA backend's fp32
 * recipe (the bf16 recipe uses the tensor-core flash kernels of attention_flash.cu).
 *
 * One warp per query row (forward, dq) or per key row (dk/dv), head dims up to 256 split
 * over the lanes, an online softmax in fp32 and memory linear in T - the CPU reference's
 * algorithm (libcore/src/cpu/ops_attention.c) on the GPU, with no rounding anywhere. It is
 * the reference-precision path (fp32 runs, tests), not a fast one: O(T^2 D) FMAs with a warp
 * reduction per score. The one thing a reader must know: every output element has one
 * owning warp and a fixed summation order, so results are deterministic. With a document
 * mask (dstart = doc_start [B, T], moe/ops.h) query t sees keys dstart[t]..t only: the
 * forward and dq loops start at dstart[t], the dk/dv loop stops at the first query of a later
 * document. The forward also runs over cached keys (Tk > T: query t at position t + Tk - T). */
#include <math.h>

#include "backend_cuda.cuh"

#define AF_MAXR 8 /* head-dim values per lane: D <= 32 * AF_MAXR = 256 */
#define AF_WARPS 4

/* ((b*T + t)*NH + h)*D: the row of head h at position t */
__device__ __forceinline__ int64_t af_row(int64_t b, int64_t t, int64_t h, int64_t T, int64_t NH,
                                          int64_t D) {
    return ((b * T + t) * NH + h) * D;
}

__device__ __forceinline__ float af_dot(const float *a, const float *__restrict__ x, int D,
                                        int lane) {
    float s = 0.0f;
#pragma unroll
    for (int r = 0; r < AF_MAXR; r++) {
        int d = lane + 32 * r;
        if (d < D) s += a[r] * x[d];
    }
    return moe_warp_sum(s);
}

/* blockIdx.y = b*H + h, warp w of block x handles query row t = x*AF_WARPS + w */
__global__ void k_af_fwd(float *__restrict__ out, float *__restrict__ lse,
                         const float *__restrict__ q, const float *__restrict__ k,
                         const float *__restrict__ v, const int32_t *__restrict__ dstart, int64_t T,
                         int64_t Tk, int H, int KV, int D, float scale) {
    int lane = threadIdx.x & 31;
    int64_t t = (int64_t)blockIdx.x * AF_WARPS + (threadIdx.x >> 5);
    int bh = blockIdx.y, b = bh / H, h = bh % H, g = h / (H / KV);
    if (t >= T) return;
    float qr[AF_MAXR], acc[AF_MAXR];
    const float *qi = q + af_row(b, t, h, T, H, D);
#pragma unroll
    for (int r = 0; r < AF_MAXR; r++) {
        int d = lane + 32 * r;
        qr[r] = d < D ? qi[d] : 0.0f;
        acc[r] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int64_t j = dstart ? dstart[(int64_t)b * T + t] : 0; j <= t + Tk - T; j++) {
        const float *kj = k + af_row(b, j, g, Tk, KV, D), *vj = v + af_row(b, j, g, Tk, KV, D);
        float s = scale * af_dot(qr, kj, D, lane);
        float mn = fmaxf(m, s), corr = expf(m - mn), p = expf(s - mn);
        l = l * corr + p;
#pragma unroll
        for (int r = 0; r < AF_MAXR; r++) {
            int d = lane + 32 * r;
            if (d < D) acc[r] = acc[r] * corr + p * vj[d];
        }
        m = mn;
    }
    float *oi = out + af_row(b, t, h, T, H, D);
#pragma unroll
    for (int r = 0; r < AF_MAXR; r++) {
        int d = lane + 32 * r;
        if (d < D) oi[d] = acc[r] / l;
    }
    if (lane == 0) lse[(int64_t)bh * T + t] = m + logf(l);
}

__global__ void k_af_delta(float *__restrict__ delta, const float *__restrict__ dout,
                           const float *__restrict__ out, int64_t B, int64_t T, int H, int D) {
    int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; /* (b*T + t)*H + h */
    int lane = threadIdx.x & 31;
    if (row >= B * T * H) return;
    float s = 0.0f;
    for (int d = lane; d < D; d += 32)
        s += dout[row * D + d] * out[row * D + d];
    s = moe_warp_sum(s);
    if (lane == 0) {
        int64_t h = row % H, bt = row / H;
        delta[((bt / T) * H + h) * T + bt % T] = s;
    }
}

/* dq[t] (+)= scale * sum_{j <= t} ds_tj k_j (add 1 adds, 0 writes), one warp per query row */
__global__ void k_af_dq(float *__restrict__ dq, const float *__restrict__ dout,
                        const float *__restrict__ q, const float *__restrict__ k,
                        const float *__restrict__ v, const float *__restrict__ lse,
                        const float *__restrict__ delta, const int32_t *__restrict__ dstart,
                        int64_t T, int H, int KV, int D, float scale, int add) {
    int lane = threadIdx.x & 31;
    int64_t t = (int64_t)blockIdx.x * AF_WARPS + (threadIdx.x >> 5);
    int bh = blockIdx.y, b = bh / H, h = bh % H, g = h / (H / KV);
    if (t >= T) return;
    float qr[AF_MAXR], gr[AF_MAXR], acc[AF_MAXR];
    int64_t o = af_row(b, t, h, T, H, D);
#pragma unroll
    for (int r = 0; r < AF_MAXR; r++) {
        int d = lane + 32 * r;
        qr[r] = d < D ? q[o + d] : 0.0f;
        gr[r] = d < D ? dout[o + d] : 0.0f;
        acc[r] = 0.0f;
    }
    float li = lse[(int64_t)bh * T + t], di = delta[(int64_t)bh * T + t];
    for (int64_t j = dstart ? dstart[(int64_t)b * T + t] : 0; j <= t; j++) {
        const float *kj = k + af_row(b, j, g, T, KV, D), *vj = v + af_row(b, j, g, T, KV, D);
        float p = expf(scale * af_dot(qr, kj, D, lane) - li);
        float ds = p * (af_dot(gr, vj, D, lane) - di);
#pragma unroll
        for (int r = 0; r < AF_MAXR; r++) {
            int d = lane + 32 * r;
            if (d < D) acc[r] += scale * ds * kj[d];
        }
    }
#pragma unroll
    for (int r = 0; r < AF_MAXR; r++) {
        int d = lane + 32 * r;
        if (d < D) dq[o + d] = (add ? dq[o + d] : 0.0f) + acc[r];
    }
}

/* dk[j] (+)= scale * sum ds_tj q_t, dv[j] (+)= sum p_tj dout_t over the group's heads and the
 * t >= j of j's document (add 1 adds, 0 writes); one warp per key row, blockIdx.y = b*KV + g */
__global__ void k_af_dkv(float *__restrict__ dk, float *__restrict__ dv,
                         const float *__restrict__ dout, const float *__restrict__ q,
                         const float *__restrict__ k, const float *__restrict__ v,
                         const float *__restrict__ lse, const float *__restrict__ delta,
                         const int32_t *__restrict__ dstart, int64_t T, int H, int KV, int D,
                         float scale, int add) {
    int lane = threadIdx.x & 31;
    int64_t j = (int64_t)blockIdx.x * AF_WARPS + (threadIdx.x >> 5);
    int bg = blockIdx.y, b = bg / KV, g = bg % KV, group = H / KV;
    if (j >= T) return;
    float kr[AF_MAXR], vr[AF_MAXR], dka[AF_MAXR], dva[AF_MAXR];
    int64_t o = af_row(b, j, g, T, KV, D);
#pragma unroll
    for (int r = 0; r < AF_MAXR; r++) {
        int d = lane + 32 * r;
        kr[r] = d < D ? k[o + d] : 0.0f;
        vr[r] = d < D ? v[o + d] : 0.0f;
        dka[r] = dva[r] = 0.0f;
    }
    /* the queries that see key j: j..the end of j's document (starts never decrease) */
    int64_t t_end = T;
    if (dstart) {
        t_end = j + 1;
        while (t_end < T && dstart[(int64_t)b * T + t_end] <= j)
            t_end++;
    }
    for (int h = g * group; h < (g + 1) * group; h++)
        for (int64_t t = j; t < t_end; t++) {
            int64_t oq = af_row(b, t, h, T, H, D), st = ((int64_t)b * H + h) * T + t;
            const float *qi = q + oq, *gi = dout + oq;
            float p = expf(scale * af_dot(kr, qi, D, lane) - lse[st]);
            float ds = p * (af_dot(vr, gi, D, lane) - delta[st]);
#pragma unroll
            for (int r = 0; r < AF_MAXR; r++) {
                int d = lane + 32 * r;
                if (d < D) {
                    dva[r] += p * gi[d];
                    dka[r] += scale * ds * qi[d];
                }
            }
        }
#pragma unroll
    for (int r = 0; r < AF_MAXR; r++) {
        int d = lane + 32 * r;
        if (d < D) {
            dk[o + d] = (add ? dk[o + d] : 0.0f) + dka[r];
            dv[o + d] = (add ? dv[o + d] : 0.0f) + dva[r];
        }
    }
}

int moe_cuda_attention_fp32_shape_ok(int64_t B, int64_t H, int64_t KV, int64_t D) {
    return D >= 1 && D <= 32 * AF_MAXR && KV >= 1 && H % KV == 0 && B * H <= 65535;
}

static int af_shape_ok(moe_cuda_ctx *c, const char *op, int64_t B, int64_t T, int64_t H, int64_t KV,
                       int64_t D) {
    if (!moe_cuda_attention_fp32_shape_ok(B, H, KV, D)) {
        moe_cuda_check(c, cudaErrorNotSupported, op,
                       "fp32 B=%lld T=%lld H=%lld KV=%lld D=%lld: need D <= %d, H %% KV == 0, "
                       "B*H <= 65535",
                       (long long)B, (long long)T, (long long)H, (long long)KV, (long long)D,
                       32 * AF_MAXR);
        return 0;
    }
    return 1;
}

void moe_cuda_attention_fp32_forward(moe_cuda_ctx *c, float *out, float *lse, const float *q,
                                     const float *k, const float *v, const int32_t *doc_start,
                                     int64_t B, int64_t T, int64_t Tk, int64_t H, int64_t KV,
                                     int64_t D) {
    const char *op = "attention_forward";
    if (!af_shape_ok(c, op, B, T, H, KV, D)) return;
    dim3 grid((unsigned)((T + AF_WARPS - 1) / AF_WARPS), (unsigned)(B * H));
    k_af_fwd<<<grid, 32 * AF_WARPS, 0, c->stream>>>(out, lse, q, k, v, doc_start, T, Tk, (int)H,
                                                    (int)KV, (int)D, 1.0f / sqrtf((float)D));
    MOE_CUDA_LAUNCHED(c, op, "fp32 B=%lld T=%lld H=%lld KV=%lld D=%lld", (long long)B, (long long)T,
                      (long long)H, (long long)KV, (long long)D);
}

void moe_cuda_attention_fp32_backward(moe_cuda_ctx *c, float *dq, float *dk, float *dv,
                                      const float *dout, const float *q, const float *k,
                                      const float *v, const float *out, const float *lse,
                                      const int32_t *doc_start, int64_t B, int64_t T, int64_t H,
                                      int64_t KV, int64_t D, int add) {
    const char *op = "attention_backward";
    if (!af_shape_ok(c, op, B, T, H, KV, D)) return;
    float *delta =
        (float *)moe_cuda_scratch(c, MOE_CUDA_SCRATCH_E, (size_t)(B * H * T) * sizeof(float), op);
    if (!delta) return;
    float scale = 1.0f / sqrtf((float)D);
    int64_t rows = B * T * H;
    k_af_delta<<<(unsigned)((rows * 32 + 255) / 256), 256, 0, c->stream>>>(delta, dout, out, B, T,
                                                                           (int)H, (int)D);
    if (!MOE_CUDA_LAUNCHED(c, op, "fp32 delta B=%lld T=%lld H=%lld D=%lld", (long long)B,
                           (long long)T, (long long)H, (long long)D))
        return;
    dim3 gq((unsigned)((T + AF_WARPS - 1) / AF_WARPS), (unsigned)(B * H));
    k_af_dq<<<gq, 32 * AF_WARPS, 0, c->stream>>>(dq, dout, q, k, v, lse, delta, doc_start, T,
                                                 (int)H, (int)KV, (int)D, scale, add);
    if (!MOE_CUDA_LAUNCHED(c, op, "fp32 dq B=%lld T=%lld H=%lld KV=%lld D=%lld", (long long)B,
                           (long long)T, (long long)H, (long long)KV, (long long)D))
        return;
    dim3 gk((unsigned)((T + AF_WARPS - 1) / AF_WARPS), (unsigned)(B * KV));
    k_af_dkv<<<gk, 32 * AF_WARPS, 0, c->stream>>>(dk, dv, dout, q, k, v, lse, delta, doc_start, T,
                                                  (int)H, (int)KV, (int)D, scale, add);
    MOE_CUDA_LAUNCHED(c, op, "fp32 dk/dv B=%lld T=%lld H=%lld KV=%lld D=%lld", (long long)B,
                      (long long)T, (long long)H, (long long)KV, (long long)D);
}

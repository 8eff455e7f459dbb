/* router: MoE router of the CUDA backend - fp32 softmax over the expert logits, top-k
 * selection (descending probability, lower index first on ties), renormalised top-k weights,
 * and the load statistics the aux and z losses need; plus its backward.
 *
 * One thread per token: E is small (8..64) and the router is a sliver of the step, so the
 * simplest mapping wins and follows the CPU reference (libcore/src/cpu/ops_moe.c) line by
 * line. The one thing a reader must know: statistics reduce over the same fixed chunks of
 * MOE_ROUTER_CHUNK tokens as the CPU, in token order inside a chunk and chunk order after,
 * in double, so they are deterministic; counts are integer atomics (exact). */
#include <math.h>

#include "backend_cuda.cuh"

#define MOE_ROUTER_CHUNK 256 /* = blockDim.x of the forward kernel; equals the CPU's chunk */

/* Block b handles tokens [b*CHUNK, (b+1)*CHUNK); part[b, 0..E+1] receives its statistics. */
__global__ void __launch_bounds__(MOE_ROUTER_CHUNK)
    k_router_fwd(float *__restrict__ probs, float *__restrict__ lse, int32_t *__restrict__ topk_idx,
                 float *__restrict__ topk_w, int32_t *__restrict__ counts,
                 double *__restrict__ part, const float *__restrict__ logits, int64_t N, int E,
                 int K) {
    __shared__ float sh_lse[MOE_ROUTER_CHUNK], sh_ent[MOE_ROUTER_CHUNK];
    int64_t n0 = (int64_t)blockIdx.x * MOE_ROUTER_CHUNK;
    int64_t n = n0 + threadIdx.x;
    if (n < N) {
        const float *z = logits + n * E;
        float *p = probs + n * E;
        float mx = -INFINITY;
        for (int e = 0; e < E; e++)
            mx = z[e] > mx ? z[e] : mx;
        float sum = 0.0f;
        for (int e = 0; e < E; e++) {
            float pe = expf(z[e] - mx);
            p[e] = pe;
            sum += pe;
        }
        float inv = 1.0f / sum, ent = 0.0f;
        for (int e = 0; e < E; e++) {
            float pe = p[e] * inv;
            p[e] = pe;
            if (pe > 0.0f) ent -= pe * logf(pe);
        }
        float l = mx + logf(sum);
        lse[n] = l;
        sh_lse[threadIdx.x] = l;
        sh_ent[threadIdx.x] = ent;
        int32_t *idx = topk_idx + n * K;
        float *w = topk_w + n * K, tot = 0.0f;
        for (int kk = 0; kk < K; kk++) {
            int best = -1;
            float pbest = 0.0f;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int j = 0; j < kk; j++)
                    taken |= idx[j] == e;
                float pe = p[e];
                if (!taken && (best < 0 || pe > pbest)) {
                    best = e;
                    pbest = pe;
                }
            }
            idx[kk] = best;
            w[kk] = pbest;
            tot += pbest;
            atomicAdd(&counts[best], 1);
        }
        for (int kk = 0; kk < K; kk++)
            w[kk] /= tot;
    }
    __syncthreads(); /* makes this block's probs (global) and sh_* visible to all its threads */
    int64_t n1 = n0 + MOE_ROUTER_CHUNK < N ? n0 + MOE_ROUTER_CHUNK : N;
    for (int j = threadIdx.x; j < E + 2; j += blockDim.x) {
        double s = 0.0;
        if (j < E) {
            for (int64_t m = n0; m < n1; m++)
                s += (double)probs[m * E + j];
        } else if (j == E) {
            for (int64_t m = n0; m < n1; m++) {
                double l = sh_lse[m - n0];
                s += l * l;
            }
        } else {
            for (int64_t m = n0; m < n1; m++)
                s += (double)sh_ent[m - n0];
        }
        part[blockIdx.x * (int64_t)(E + 2) + j] = s;
    }
}

__global__ void k_router_stats(float *__restrict__ stats, const double *__restrict__ part,
                               int64_t nchunks, int E) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= E + 2) return;
    double s = 0.0;
    for (int64_t ch = 0; ch < nchunks; ch++)
        s += part[ch * (E + 2) + j];
    stats[j] = (float)s;
}

void moe_cuda_router_forward(const moe_backend *be, float *probs, float *lse, int32_t *topk_idx,
                             float *topk_w, int32_t *counts, float *stats, const float *logits,
                             int64_t N, int64_t E, int64_t K) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    const char *op = "router_forward";
    if (moe_cuda_failed(c) || E <= 0) return;
    if (K < 1 || K > E) {
        moe_cuda_check(c, cudaErrorInvalidValue, op, "N=%lld E=%lld K=%lld: need 1 <= K <= E",
                       (long long)N, (long long)E, (long long)K);
        return;
    }
    if (!moe_cuda_check(c, cudaMemsetAsync(counts, 0, (size_t)E * sizeof(int32_t), c->stream), op,
                        "counts E=%lld", (long long)E))
        return;
    int64_t nchunks = (N + MOE_ROUTER_CHUNK - 1) / MOE_ROUTER_CHUNK;
    if (nchunks == 0) {
        moe_cuda_check(c, cudaMemsetAsync(stats, 0, (size_t)(E + 2) * sizeof(float), c->stream), op,
                       "stats E=%lld", (long long)E);
        return;
    }
    double *part = (double *)moe_cuda_scratch(c, MOE_CUDA_SCRATCH_RED,
                                              (size_t)(nchunks * (E + 2)) * sizeof(double), op);
    if (!part) return;
    k_router_fwd<<<(unsigned)nchunks, MOE_ROUTER_CHUNK, 0, c->stream>>>(
        probs, lse, topk_idx, topk_w, counts, part, logits, N, (int)E, (int)K);
    if (!MOE_CUDA_LAUNCHED(c, op, "N=%lld E=%lld K=%lld", (long long)N, (long long)E, (long long)K))
        return;
    k_router_stats<<<(unsigned)((E + 2 + 127) / 128), 128, 0, c->stream>>>(stats, part, nchunks,
                                                                           (int)E);
    MOE_CUDA_LAUNCHED(c, op, "N=%lld E=%lld (stats)", (long long)N, (long long)E);
}

/* dL/dp_e = dprob_e + sum_{k: idx_k = e} (dw_k - sum_j dw_j w_j) / S, S = sum_k p[idx_k];
 * then the softmax backward plus the z-loss term 2 dz lse p_e. */
__global__ void k_router_bwd(float *__restrict__ dlogits, const float *__restrict__ dtopk_w,
                             const float *__restrict__ dprob, float dz,
                             const float *__restrict__ probs, const float *__restrict__ lse,
                             const int32_t *__restrict__ topk_idx, const float *__restrict__ topk_w,
                             int64_t N, int E, int K) {
    int64_t n = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (n >= N) return;
    const float *p = probs + n * E;
    const int32_t *idx = topk_idx + n * K;
    const float *w = topk_w + n * K, *dw = dtopk_w + n * K;
    float S = 0.0f, wdw = 0.0f;
    for (int kk = 0; kk < K; kk++) {
        S += p[idx[kk]];
        wdw += dw[kk] * w[kk];
    }
    float pdp = 0.0f;
    for (int e = 0; e < E; e++) {
        float dpe = dprob ? dprob[e] : 0.0f;
        for (int kk = 0; kk < K; kk++)
            if (idx[kk] == e) dpe += (dw[kk] - wdw) / S;
        pdp += p[e] * dpe;
    }
    float zterm = 2.0f * dz * lse[n];
    float *g = dlogits + n * E;
    for (int e = 0; e < E; e++) {
        float dpe = dprob ? dprob[e] : 0.0f;
        for (int kk = 0; kk < K; kk++)
            if (idx[kk] == e) dpe += (dw[kk] - wdw) / S;
        g[e] += p[e] * (dpe - pdp) + zterm * p[e];
    }
}

void moe_cuda_router_backward(const moe_backend *be, float *dlogits, const float *dtopk_w,
                              const float *dprob, float dz, const float *probs, const float *lse,
                              const int32_t *topk_idx, const float *topk_w, int64_t N, int64_t E,
                              int64_t K) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    if (moe_cuda_failed(c) || N <= 0 || E <= 0) return;
    k_router_bwd<<<(unsigned)((N + 127) / 128), 128, 0, c->stream>>>(
        dlogits, dtopk_w, dprob, dz, probs, lse, topk_idx, topk_w, N, (int)E, (int)K);
    MOE_CUDA_LAUNCHED(c, "router_backward", "N=%lld E=%lld K=%lld", (long long)N, (long long)E,
                      (long long)K);
}

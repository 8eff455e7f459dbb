/* xent: next-token cross-entropy of the CUDA backend with the softmax fused in, per-token
 * weights and ignored positions (target -1).
 *
 * Forward keeps only the logsumexp per row; backward recomputes the softmax from logits and
 * lse and may write the gradient over the logits in place (each element is read and then
 * written by the same thread), so no second [N, V] buffer is needed. One block per row. */
#include <math.h>

#include "backend_cuda.cuh"

__global__ void k_xent_fwd(float *__restrict__ loss, float *__restrict__ lse,
                           const float *__restrict__ logits, const int32_t *__restrict__ targets,
                           const float *__restrict__ weights, int64_t V) {
    __shared__ float sh[32];
    int64_t n = blockIdx.x;
    const float *z = logits + n * V;
    float mx = -INFINITY;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
        mx = fmaxf(mx, z[v]);
    mx = moe_block_max(mx, sh);
    float s = 0.0f;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
        s += expf(z[v] - mx);
    s = moe_block_sum(s, sh);
    if (threadIdx.x == 0) {
        float l = mx + logf(s);
        lse[n] = l;
        int32_t t = targets[n];
        loss[n] = t < 0 ? 0.0f : (weights ? weights[n] : 1.0f) * (l - z[t]);
    }
}

/* NOT restrict: dlogits may alias logits */
__global__ void k_xent_bwd(float *dlogits, const float *logits, const float *__restrict__ lse,
                           const int32_t *__restrict__ targets, const float *__restrict__ weights,
                           float dloss, int64_t V) {
    int64_t n = blockIdx.x;
    const float *z = logits + n * V;
    float *g = dlogits + n * V;
    int32_t t = targets[n];
    if (t < 0) {
        for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
            g[v] = 0.0f;
        return;
    }
    float s = dloss * (weights ? weights[n] : 1.0f), l = lse[n];
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
        float gv = s * expf(z[v] - l);
        if (v == t) gv -= s;
        g[v] = gv;
    }
}

static int xent_threads(int64_t V) {
    return V >= 4096 ? 1024 : V >= 1024 ? 512 : 256;
}

void moe_cuda_cross_entropy_forward(const moe_backend *be, float *loss, float *lse,
                                    const float *logits, const int32_t *targets,
                                    const float *weights, int64_t N, int64_t V) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    if (moe_cuda_failed(c) || N <= 0 || V <= 0) return;
    k_xent_fwd<<<(unsigned)N, xent_threads(V), 0, c->stream>>>(loss, lse, logits, targets, weights,
                                                               V);
    MOE_CUDA_LAUNCHED(c, "cross_entropy_forward", "N=%lld V=%lld", (long long)N, (long long)V);
}

void moe_cuda_cross_entropy_backward(const moe_backend *be, float *dlogits, const float *logits,
                                     const float *lse, const int32_t *targets, const float *weights,
                                     float dloss, int64_t N, int64_t V) {
    moe_cuda_ctx *c = moe_cuda_ctx_of(be);
    if (moe_cuda_failed(c) || N <= 0 || V <= 0) return;
    k_xent_bwd<<<(unsigned)N, xent_threads(V), 0, c->stream>>>(dlogits, logits, lse, targets,
                                                               weights, dloss, V);
    MOE_CUDA_LAUNCHED(c, "cross_entropy_backward", "N=%lld V=%lld", (long long)N, (long long)V);
}

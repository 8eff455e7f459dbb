/* ops_loss: next-token cross-entropy of the CPU backend with a fused softmax, per-token
 * weights and ignored positions (target -1).
 *
 * Forward keeps only lse per row (not the softmax); backward recomputes softmax from the
 * logits and lse and may overwrite the logits in place, so the [N, V] buffer is needed once. */
#include <math.h>

#include "ops/cpu/cpu_ops.h"

void moe_cpu_cross_entropy_forward(const moe_backend *be, float *loss, float *lse,
                                   const float *logits, const int32_t *targets,
                                   const float *weights, int64_t N, int64_t V) {
    (void)be;
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *z = logits + n * V;
        float mx = -INFINITY, sum = 0.0f;
        for (int64_t v = 0; v < V; v++)
            mx = z[v] > mx ? z[v] : mx;
        for (int64_t v = 0; v < V; v++)
            sum += moe_cpu_expf(z[v] - mx);
        float l = mx + logf(sum);
        lse[n] = l;
        int32_t t = targets[n];
        loss[n] = t < 0 ? 0.0f : (weights ? weights[n] : 1.0f) * (l - z[t]);
    }
}

void moe_cpu_cross_entropy_backward(const moe_backend *be, float *dlogits, const float *logits,
                                    const float *lse, const int32_t *targets, const float *weights,
                                    float dloss, int64_t N, int64_t V) {
    (void)be;
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *z = logits + n * V;
        float *g = dlogits + n * V;
        int32_t t = targets[n];
        if (t < 0) {
            for (int64_t v = 0; v < V; v++)
                g[v] = 0.0f;
            continue;
        }
        float s = dloss * (weights ? weights[n] : 1.0f), l = lse[n];
        for (int64_t v = 0; v < V; v++)
            g[v] = s * moe_cpu_expf(z[v] - l); /* read z before write */
        g[t] -= s;
    }
}

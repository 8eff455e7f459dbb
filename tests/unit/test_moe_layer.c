/* test_moe_layer: the MoE block built from backend ops (gate matmul, router, permute,
 * grouped w1/w3, swiglu, grouped w2, unpermute, and their backward ops in reverse) against
 * a naive per-token reference in double: softmax, top-k, renormalise, and for each chosen
 * expert w2(silu(w1 x) * w3 x), summed with the weights. Outputs must agree, and the
 * analytic gradients of sum(y * R) with respect to x, the gate and every expert weight must
 * agree with central differences OF THE DOUBLE REFERENCE (h = 1e-5, so the reference
 * gradient is accurate to ~1e-9 and the tolerance 1e-4 + 1e-3 rel only covers the fp32
 * arithmetic of the ops). Two experts are made unreachable (inputs positive, their gate
 * rows negative): they must receive no rows, and zero gradient. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gradcheck.h"
#include "moe/ops.h"
#include "testlib.h"

enum { N = 12, C = 8, F = 6, E = 6, K = 2 };
static const moe_backend *be;
static float x[N * C], wg[E * C], w1[E * F * C], w3[E * F * C], w2[E * C * F], R[N * C];

static double silu(double a) {
    return a / (1.0 + exp(-a));
}

/* naive reference: returns sum(y * R), y per token in double */
static double naive_loss(void) {
    double L = 0;
    for (int n = 0; n < N; n++) {
        double z[E], p[E], mx = -1e300, s = 0;
        for (int e = 0; e < E; e++) {
            z[e] = 0;
            for (int c = 0; c < C; c++)
                z[e] += (double)x[n * C + c] * wg[e * C + c];
            mx = fmax(mx, z[e]);
        }
        for (int e = 0; e < E; e++)
            s += (p[e] = exp(z[e] - mx));
        for (int e = 0; e < E; e++)
            p[e] /= s;
        int sel[K];
        double tot = 0;
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int j = 0; j < k; j++)
                    taken |= sel[j] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            sel[k] = best;
            tot += p[best];
        }
        for (int k = 0; k < K; k++) {
            int e = sel[k];
            double w = p[e] / tot, g[F];
            for (int f = 0; f < F; f++) {
                double a = 0, b = 0;
                for (int c = 0; c < C; c++) {
                    a += (double)w1[(e * F + f) * C + c] * x[n * C + c];
                    b += (double)w3[(e * F + f) * C + c] * x[n * C + c];
                }
                g[f] = silu(a) * b;
            }
            for (int c = 0; c < C; c++) {
                double y = 0;
                for (int f = 0; f < F; f++)
                    y += (double)w2[(e * C + c) * F + f] * g[f];
                L += w * y * R[n * C + c];
            }
        }
    }
    return L;
}

typedef struct {
    float logits[N * E], probs[N * E], lse[N], tw[N * K], stats[E + 2];
    int32_t idx[N * K], counts[E], src[N * K], slot[N * K], off[E + 1];
    float xp[N * K * C], h1[N * K * F], h3[N * K * F], g[N * K * F], yp[N * K * C], y[N * C];
} fwd_t;

static void ops_forward(fwd_t *s) {
    be->matmul_forward(be, moe_buf_f32(s->logits), moe_cbuf_f32(x), moe_cbuf_f32(wg), N, C, E,
                       MOE_RECIPE_FP32);
    be->router_forward(be, s->probs, s->lse, s->idx, s->tw, s->counts, s->stats, s->logits, N, E,
                       K);
    be->permute_forward(be, moe_buf_f32(s->xp), s->src, s->slot, s->off, moe_cbuf_f32(x), s->idx, N,
                        C, E, K);
    be->grouped_matmul_forward(be, moe_buf_f32(s->h1), moe_cbuf_f32(s->xp), moe_cbuf_f32(w1),
                               s->off, E, C, F, MOE_RECIPE_FP32);
    be->grouped_matmul_forward(be, moe_buf_f32(s->h3), moe_cbuf_f32(s->xp), moe_cbuf_f32(w3),
                               s->off, E, C, F, MOE_RECIPE_FP32);
    be->swiglu_forward(be, moe_buf_f32(s->g), moe_cbuf_f32(s->h1), moe_cbuf_f32(s->h3), N * K * F,
                       MOE_RECIPE_FP32, NULL);
    be->grouped_matmul_forward(be, moe_buf_f32(s->yp), moe_cbuf_f32(s->g), moe_cbuf_f32(w2), s->off,
                               E, F, C, MOE_RECIPE_FP32);
    be->unpermute_forward(be, moe_buf_f32(s->y), moe_cbuf_f32(NULL), moe_cbuf_f32(s->yp), s->tw,
                          s->slot, N, C, K);
}

/* central differences of the double reference over every element of p */
static void check_against_reference(const char *what, float *p, const float *g, int n) {
    double maxerr = 0;
    int worst = -1;
    for (int i = 0; i < n; i++) {
        float orig = p[i];
        p[i] = orig + 1e-5f;
        double hp = (double)p[i] - orig, lp = naive_loss();
        p[i] = orig - 1e-5f;
        double hm = orig - (double)p[i], lm = naive_loss();
        p[i] = orig;
        double fd = (lp - lm) / (hp + hm), err = fabs(fd - g[i]) / (1e-4 + 1e-3 * fabs(fd));
        if (err > maxerr) maxerr = err, worst = i;
    }
    CHECK_MSG(maxerr <= 1.0, "%s: gradient mismatch at %d (normalised error %g)", what, worst,
              maxerr);
}

int main(void) {
    be = moe_backend_cpu();
    gc_fill(x, N * C, 1, 0.2, 1.0);
    gc_fill(wg, E * C, 2, -0.6, 0.6);
    for (int c = 0; c < C; c++)
        wg[4 * C + c] = wg[5 * C + c] = -1.0f; /* unreachable */
    gc_fill(w1, E * F * C, 3, -0.5, 0.5);
    gc_fill(w3, E * F * C, 4, -0.5, 0.5);
    gc_fill(w2, E * C * F, 5, -0.5, 0.5);
    gc_fill(R, N * C, 6, -1, 1);
    static fwd_t s;
    ops_forward(&s);
    CHECK_INT_EQ(s.counts[4], 0);
    CHECK_INT_EQ(s.counts[5], 0);
    CHECK_INT_EQ(s.off[4], s.off[6]);
    CHECK_NEAR(gc_dot(s.y, R, N * C), naive_loss(), 1e-4);
    /* per-element forward check via one-hot R */
    float Rsave[N * C];
    memcpy(Rsave, R, sizeof R);
    double maxy = 0;
    for (int i = 0; i < N * C; i += 7) {
        memset(R, 0, sizeof R);
        R[i] = 1.0f;
        maxy = fmax(maxy, fabs(naive_loss() - s.y[i]));
    }
    memcpy(R, Rsave, sizeof R);
    CHECK_MSG(maxy < 1e-5, "moe output vs naive reference: max error %g", maxy);

    /* backward through the ops, in reverse order */
    static float dyp[N * K * C], dtw[N * K], dg[N * K * F], dh1[N * K * F], dh3[N * K * F];
    static float dxp[N * K * C], dx[N * C], dlog[N * E], dwg[E * C], dw1[E * F * C], dw2[E * C * F],
        dw3[E * F * C];
    be->unpermute_backward(be, moe_buf_f32(dyp), dtw, R, moe_cbuf_f32(s.yp), s.tw, s.slot, N, C, K,
                           MOE_GRAD_ADD);
    be->grouped_matmul_backward(be, moe_buf_f32(dg), moe_buf_f32(dw2), moe_cbuf_f32(dyp),
                                moe_cbuf_f32(s.g), moe_cbuf_f32(w2), s.off, E, F, C,
                                MOE_RECIPE_FP32, MOE_GRAD_ADD, MOE_GRAD_ADD);
    be->swiglu_backward(be, moe_buf_f32(dh1), moe_buf_f32(dh3), moe_cbuf_f32(dg),
                        moe_cbuf_f32(s.h1), moe_cbuf_f32(s.h3), N * K * F, NULL);
    be->grouped_matmul_backward(be, moe_buf_f32(dxp), moe_buf_f32(dw1), moe_cbuf_f32(dh1),
                                moe_cbuf_f32(s.xp), moe_cbuf_f32(w1), s.off, E, C, F,
                                MOE_RECIPE_FP32, MOE_GRAD_ADD, MOE_GRAD_ADD);
    be->grouped_matmul_backward(be, moe_buf_f32(dxp), moe_buf_f32(dw3), moe_cbuf_f32(dh3),
                                moe_cbuf_f32(s.xp), moe_cbuf_f32(w3), s.off, E, C, F,
                                MOE_RECIPE_FP32, MOE_GRAD_ADD, MOE_GRAD_ADD);
    be->permute_backward(be, dx, moe_cbuf_f32(dxp), s.slot, N, C, K, MOE_GRAD_ADD);
    be->router_backward(be, dlog, dtw, NULL, 0.0f, s.probs, s.lse, s.idx, s.tw, N, E, K);
    be->matmul_backward(be, dx, dwg, moe_cbuf_f32(dlog), moe_cbuf_f32(x), moe_cbuf_f32(wg), N, C, E,
                        MOE_RECIPE_FP32, MOE_GRAD_ADD, MOE_GRAD_ADD);
    check_against_reference("dx", x, dx, N * C);
    check_against_reference("dgate", wg, dwg, E * C);
    check_against_reference("dw1", w1, dw1, E * F * C);
    check_against_reference("dw2", w2, dw2, E * C * F);
    check_against_reference("dw3", w3, dw3, E * F * C);
    int zero = 1;
    for (int i = 4 * F * C; i < E * F * C; i++)
        zero &= dw1[i] == 0.0f && dw3[i] == 0.0f && dw2[i] == 0.0f;
    CHECK_MSG(zero, "unreachable experts must have zero gradient");
    return test_summary("test_moe_layer");
}

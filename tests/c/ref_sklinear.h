/* Float64 reference of Panther's SKLinear (DESIGN.md), written term by term from the formula
 *     y = 1/(2L) * sum_i [ (x S1_i) U1_i + (x U2_i) S2_i ] + b
 * and its gradients, independently of the library's two-GEMM formulation. Row-major:
 * x [N, in], S1 and U2 [L, in, k], S2 and U1 [L, k, out], b [out] (NULL = none). */
#ifndef KF_TESTS_REF_SKLINEAR_H
#define KF_TESTS_REF_SKLINEAR_H

#include <stdint.h>

typedef struct ref_skl_cfg {
    int64_t N, in, out, L, k;
} ref_skl_cfg;

void ref_skl_forward(const ref_skl_cfg *c, const double *x, const double *S1, const double *S2,
                     const double *U1, const double *U2, const double *b, double *y);

/* Gradients of sum(y * dy): dx [N, in], dS1 [L, in, k], dS2 [L, k, out], db [out]; each output
 * may be NULL. Overwritten. */
void ref_skl_backward(const ref_skl_cfg *c, const double *x, const double *S1, const double *S2,
                      const double *U1, const double *U2, const double *dy, double *dx,
                      double *dS1, double *dS2, double *db);

/* The fused epilogue (kfuse.h, since 1.8), written from its definition independently of the
 * library's common/activation.h and common/counter_rng.h: act is a kf_activation value (0 none,
 * 1 ReLU, 2 GELU (erf), 3 GELU (tanh), 4 SiLU), in float64. */
double ref_skl_act(int act, double v);
double ref_skl_act_grad(int act, double v);
/* Whether dropout keeps the element at counter `ctr` (SplitMix64's finaliser on the seed, then on
 * it xor the counter; the top 24 bits as a uniform in [0, 1), kept when >= p). */
int ref_skl_keep(uint64_t seed, uint64_t ctr, float p);
/* y[i] = dropout(act(pre[i])) over n elements, element i at counter offset + i (p = 0: none),
 * and (g not NULL) g[i] = dy[i] * mask / (1 - p) * act'(pre[i]). */
void ref_skl_epilogue(int act, float p, uint64_t seed, uint64_t offset, int64_t n,
                      const double *pre, double *y, const double *dy, double *g);

#endif /* KF_TESTS_REF_SKLINEAR_H */

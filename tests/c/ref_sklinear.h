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

#endif /* KF_TESTS_REF_SKLINEAR_H */

/* Float64 reference of efficient-kan's KANLinear (DESIGN.md, kfuse.h), written from its math
 * independently of the library's formulation: the Cox-de Boor recurrence over every basis index
 * of a feature (not a local window), the derivative carried through that same recurrence
 * (forward mode, as autograd would differentiate it) rather than the closed formula, and the
 * products term by term. Convention of kfuse.h: a term whose knot span has zero width counts as
 * 0 (efficient-kan divides 0 by 0 there).
 *
 * Row-major layouts: x [N, in], grid [in, G + 2k + 1], base [out, in], spline [out, in, C] with
 * C = G + k, scaler [out, in] (NULL = none: standalone_scale off), y and dy [N, out]. */
#ifndef KF_TESTS_REF_KAN_H
#define KF_TESTS_REF_KAN_H

#include <stdint.h>

typedef struct ref_kan_cfg {
    int64_t N, in, out, G, k;
} ref_kan_cfg;

/* The C = G + k bases of order k at x on the knots t[0 .. G + 2k] into B, and their derivatives
 * into dB (may be NULL). */
void ref_kan_bases(int64_t G, int64_t k, const double *t, double x, double *B, double *dB);

void ref_kan_forward(const ref_kan_cfg *c, const double *x, const double *grid,
                     const double *base, const double *spline, const double *scaler, double *y);

/* Gradients of sum(y * dy): dx [N, in], dbase [out, in], dspline [out, in, C], dscaler [out, in];
 * each may be NULL (dscaler must be when scaler is). Overwritten. */
void ref_kan_backward(const ref_kan_cfg *c, const double *x, const double *grid,
                      const double *base, const double *spline, const double *scaler,
                      const double *dy, double *dx, double *dbase, double *dspline,
                      double *dscaler);

#endif /* KF_TESTS_REF_KAN_H */

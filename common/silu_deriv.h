/* SiLU(x) = x s(x), s = 1 / (1 + e^-x), and its derivatives of any order m, once, for every
 * backend (C, C++ and CUDA; docs/ops/kan.md, "Derivatives"):
 *     SiLU^(m)(x) = x s^(m)(x) + m s^(m-1)(x)                                   (m >= 1)
 * with s^(j) a polynomial in s: s' = s (1 - s), so s^(j) = P_j(s), P_0(s) = s and
 *     P_{j+1}(s) = P_j'(s) (s - s^2),  i.e.  a_{j+1}[d] = d a_j[d] - (d - 1) a_j[d - 1]
 * for P_j(s) = sum_d a_j[d] s^d (degree j + 1, a_j[0] = 0): integers (1, -1; 1, -3, 2; ...),
 * exact in double up to the orders kfuse takes (KF_KAN_MAX_DERIVATIVE_ORDER <= KF__SILU_MAX_ORDER).
 * Evaluated in double whatever the caller's type: the coefficients are formed per call, O(m^2)
 * (a few dozen operations at the orders a PINN uses), then Horner's rule. */
#ifndef KF_SILU_DERIV_H
#define KF_SILU_DERIV_H

#include <math.h>

#if defined(__CUDACC__)
#define KF__SILU_HD __host__ __device__ __forceinline__
#elif defined(__cplusplus)
#define KF__SILU_HD inline
#else
#define KF__SILU_HD static inline
#endif

/* The largest order kf__silu_deriv takes. */
#define KF__SILU_MAX_ORDER 16

/* P(s) for the coefficients a[0..deg]. */
KF__SILU_HD double kf__silu_poly(const double *a, int deg, double s) {
    double v = 0.0;
    for (int d = deg; d >= 0; --d) v = v * s + a[d];
    return v;
}

/* SiLU^(m)(x), 0 <= m <= KF__SILU_MAX_ORDER. The sigmoid as 1 / (1 + e^-x): 0 below
 * x = -709.8 (e^-x = inf), where SiLU^(m) is -0 or 0 as in the first-order kernels; NaN gives
 * NaN. */
KF__SILU_HD double kf__silu_deriv(double x, int m) {
    const double s = 1.0 / (1.0 + exp(-x));
    if (m == 0) return x * s;
    double a[KF__SILU_MAX_ORDER + 2] = {0.0, 1.0}; /* P_0 = s */
    double prev = 0.0;                              /* P_{m-1}(s) */
    for (int j = 0; j < m; ++j) {
        if (j == m - 1) prev = kf__silu_poly(a, j + 1, s);
        for (int d = j + 2; d >= 1; --d) a[d] = d * a[d] - (d - 1) * a[d - 1]; /* P_{j+1} */
    }
    return x * kf__silu_poly(a, m + 1, s) + m * prev;
}

#endif /* KF_SILU_DERIV_H */

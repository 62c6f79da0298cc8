/* SiLU(x) = x s(x), s = 1 / (1 + e^-x), and its derivatives of any order m, once, for every
 * backend (C, C++ and CUDA; docs/ops/kan.md):
 *     SiLU^(m)(x) = x s^(m)(x) + m s^(m-1)(x)                                   (m >= 1)
 * with s^(j) a polynomial in s: s' = s (1 - s), so s^(j) = P_j(s), P_0(s) = s and
 *     P_{j+1}(s) = P_j'(s) (s - s^2),  i.e.  a_{j+1}[d] = d a_j[d] - (d - 1) a_j[d - 1]
 * for P_j(s) = sum_d a_j[d] s^d (degree j + 1, a_j[0] = 0). The coefficients are integers
 * (1, -1; 1, -3, 2; ...) exact in double up to the orders kfuse takes
 * (KF_KAN_MAX_DERIVATIVE_ORDER), and are formed once per call (kf__silu_dpoly), then evaluated per
 * element by Horner's rule in double (kf__silu_deriv). */
#ifndef KF_SILU_DERIV_H
#define KF_SILU_DERIV_H

#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define KF__SILU_HD __host__ __device__ __forceinline__
#else
#define KF__SILU_HD static inline
#endif

/* The largest order kf__silu_dpoly takes: a[] holds KF__SILU_MAX_ORDER + 2 coefficients. */
#define KF__SILU_MAX_ORDER 16

/* The coefficients a[0..j+1] of P_j(s) = s^(j) for j = 0..m into a[j][.] (a [m+1][KF__SILU_MAX_ORDER
 * + 2], zero beyond degree j + 1); m <= KF__SILU_MAX_ORDER. */
KF__SILU_HD void kf__silu_dpoly(int m, double (*a)[KF__SILU_MAX_ORDER + 2]) {
    for (int d = 0; d < KF__SILU_MAX_ORDER + 2; ++d) a[0][d] = d == 1 ? 1.0 : 0.0;
    for (int j = 0; j < m; ++j)
        for (int d = 0; d < KF__SILU_MAX_ORDER + 2; ++d)
            a[j + 1][d] = d == 0 ? 0.0 : d * a[j][d] - (d - 1) * a[j][d - 1];
}

/* P(s) for the coefficients a[0..deg]. */
KF__SILU_HD double kf__silu_poly(const double *a, int deg, double s) {
    double v = 0.0;
    for (int d = deg; d >= 0; --d) v = v * s + a[d];
    return v;
}

/* SiLU^(m)(x) from the table of kf__silu_dpoly (formed for at least order m). The sigmoid as
 * 1 / (1 + e^-x): 0 below x = -709.8 (e^-x = inf), where SiLU^(m) is -0 or 0 as in the
 * first-order kernels; NaN gives NaN. */
KF__SILU_HD double kf__silu_deriv(double x, int m, const double (*a)[KF__SILU_MAX_ORDER + 2]) {
    const double s = 1.0 / (1.0 + exp(-x));
    if (m == 0) return x * s;
    return x * kf__silu_poly(a[m], m + 1, s) + m * kf__silu_poly(a[m - 1], m, s);
}

#endif /* KF_SILU_DERIV_H */

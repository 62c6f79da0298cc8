/* SiLU(x) = x s(x), s = 1 / (1 + e^-x), and its derivatives of any order m, once, for every
 * backend (C, C++ and CUDA; docs/ops/kan.md, "Derivatives"):
 *     SiLU^(m)(x) = x s^(m)(x) + m s^(m-1)(x)                                   (m >= 1)
 * with s^(j) a polynomial in s: s' = s (1 - s), so s^(j) = P_j(s), P_0(s) = s and
 *     P_{j+1}(s) = P_j'(s) (s - s^2),  i.e.  a_{j+1}[d] = d a_j[d] - (d - 1) a_j[d - 1]
 * for P_j(s) = sum_d a_j[d] s^d (degree j + 1, a_j[0] = 0): integers (1, -1; 1, -3, 2; ...),
 * exact in double up to the orders kfuse takes (KF_KAN_MAX_DERIVATIVE_ORDER <= KF__SILU_MAX_ORDER).
 * Evaluated in double whatever the caller's type: the coefficients are formed once per order,
 * O(m^2) (kf__silu_order_of; a kernel over many points forms them once per call), then Horner's
 * rule per point. */
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

/* SiLU^(m)'s polynomials for one order m, formed once and evaluated at many points
 * (kf__silu_deriv_at): a = P_m's coefficients (degree m + 1), prev = P_{m-1}'s (degree m;
 * unused at m = 0). */
typedef struct kf__silu_order {
    int m;
    double a[KF__SILU_MAX_ORDER + 2], prev[KF__SILU_MAX_ORDER + 2];
} kf__silu_order;

/* The polynomials of order m, 0 <= m <= KF__SILU_MAX_ORDER. */
KF__SILU_HD kf__silu_order kf__silu_order_of(int m) {
    kf__silu_order o;
    o.m = m;
    for (int d = 0; d < KF__SILU_MAX_ORDER + 2; ++d) o.a[d] = o.prev[d] = 0.0;
    o.a[1] = 1.0; /* P_0 = s */
    for (int j = 0; j < m; ++j) {
        if (j == m - 1)
            for (int d = 0; d <= j + 1; ++d) o.prev[d] = o.a[d];
        for (int d = j + 2; d >= 1; --d) o.a[d] = d * o.a[d] - (d - 1) * o.a[d - 1]; /* P_{j+1} */
    }
    return o;
}

/* The sigmoid s(x) = 1 / (1 + e^-x) that kf__silu_deriv_at takes: 0 below x = -709.8
 * (e^-x = inf); NaN gives NaN. One per point serves every order. */
KF__SILU_HD double kf__silu_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

/* SiLU^(m)(x) from s = kf__silu_sigmoid(x) and o = kf__silu_order_of(m): -0 or 0 where s = 0,
 * as in the first-order kernels. */
KF__SILU_HD double kf__silu_deriv_at(double x, double s, const kf__silu_order *o) {
    if (o->m == 0) return x * s;
    return x * kf__silu_poly(o->a, o->m + 1, s) + o->m * kf__silu_poly(o->prev, o->m, s);
}

/* SiLU^(m)(x), 0 <= m <= KF__SILU_MAX_ORDER, at one point (forms the polynomials). */
KF__SILU_HD double kf__silu_deriv(double x, int m) {
    const kf__silu_order o = kf__silu_order_of(m);
    return kf__silu_deriv_at(x, kf__silu_sigmoid(x), &o);
}

#endif /* KF_SILU_DERIV_H */

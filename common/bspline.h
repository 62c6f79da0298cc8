/* The B-spline basis, written once (docs/ops/kan.md): the Cox-de Boor recurrence with kfuse's
 * conventions, half-open knot intervals, every basis 0 outside [t_0, t_{nk-1}) (and for NaN),
 * and a term over a knot span narrower than FLT_MIN counted as 0 (the reference's 0/0):
 *     B_{j,0}(x) = [t_j <= x < t_{j+1}]                                   j = 0..nk-2
 *     B_{j,p}(x) = (x - t_j) inv_p[j] B_{j,p-1}(x) + (t_{j+p+1} - x) inv_p[j+1] B_{j+1,p-1}(x)
 * with inv_p[m] = 1 / (t_{m+p} - t_m), 0 for a span narrower than FLT_MIN.
 *
 * Two forms of the one recurrence, in the one header every backend includes:
 *  - kf__bspline_inv_X, kf__bspline_rows_X and kf__bspline_deriv_rows_X (X = s for float,
 *    d for double; common/bspline_rows.h, written once and included per type): for C and C++,
 *    the CPU kernels (cpu/kan_linear.c, cpu/kan_deriv.c) and the float64 grid refit
 *    (host/kan_grid.c): the reciprocal table of one feature and the bases (or their m-th
 *    derivatives) of one feature at many points, vectorised over the points;
 *  - kf__bspline_window<KM, T> (C++ and CUDA only): the bases of one point that can be non-zero,
 *    in registers (cuda/kan_cuda.cuh in float, cuda/plain.cuh in double).
 * and the derivative rule, once, for every backend and element type (KF__BSPLINE_DSTEP; its
 * window form kf__bspline_dwindow in C++ and CUDA).
 * tests/cxx/test_bspline.cpp holds the window equal to the vectorised form on the CPU, and the
 * derivative equal to a central difference of the bases. */
#ifndef KF_BSPLINE_H
#define KF_BSPLINE_H

#include <float.h>
#include <stdint.h>

#ifdef __cplusplus
#define KF__RESTRICT __restrict__
#else
#define KF__RESTRICT restrict
#endif

/* The derivative rule: one step of
 *     d/dx B_{c,p}(x) = p inv_p[c] B_{c,p-1}(x) - p inv_p[c+1] B_{c+1,p-1}(x)      (p >= 1)
 * as the one expression every backend evaluates (the same operations in the same order, so the
 * CPU kernels, the CUDA kernels and the plain path agree on the rounding): `p` the order, `il`
 * and `ir` inv_p[c] and inv_p[c+1], `bl` and `br` B_{c,p-1}(x) and B_{c+1,p-1}(x). A macro only
 * because the operands may be float, double or the CPU kernels' vectors of either (GCC's vector
 * extension), in C, C++ and CUDA. The m-th derivative is the same step applied m times, over the
 * orders p = k - m + 1 .. k, to the order-(k - m) bases (d^m/dx^m B_{c,k} from d^(m-1)/dx^(m-1)
 * B_{c,k-1} and B_{c+1,k-1}); kf__bspline_deriv_rows_X does so for any m <= k. */
#define KF__BSPLINE_DSTEP(p, il, ir, bl, br) ((p) * (il) * (bl) - (p) * (ir) * (br))

/* The vectorised rows form, for float (suffix _s) and double (_d): common/bspline_rows.h. */
#define KF__BS_T float
#define KF__BS_X(name) name##_s
#include "bspline_rows.h"
#undef KF__BS_T
#undef KF__BS_X
#define KF__BS_T double
#define KF__BS_X(name) name##_d
#include "bspline_rows.h"
#undef KF__BS_T
#undef KF__BS_X

#ifdef __cplusplus
#if defined(__CUDACC__)
#define KF__BSPLINE_HD __host__ __device__ __forceinline__
#else
#define KF__BSPLINE_HD inline
#endif
#if defined(__CUDA_ARCH__) /* the device pass; host compilers do not know the pragma */
#define KF__BSPLINE_UNROLL _Pragma("unroll")
#else
#define KF__BSPLINE_UNROLL
#endif

/* The order-q bases of one feature at x that can be non-zero: Nw[r] = B_{j-q+r, q}(x),
 * r = 0..q, where j is the knot interval t_j <= x < t_{j+1}; returns j, or -1 (every basis 0)
 * when x is outside [t_0, t_{nk-1}), NaN, or (a decreasing grid, unspecified) no interval holds
 * it. t: the feature's nk knots; inv: its reciprocal table (kf__bspline_inv_*). The window is
 * unrolled up to the bound KM >= q, so it lives in registers on a GPU. T: float (the float32
 * kernels) or double (the float64 path of cuda/plain.cuh). */
template <int KM, typename T>
KF__BSPLINE_HD int64_t kf__bspline_window(const T *t, const T *inv, int64_t nk, int q, T x,
                                          T (&Nw)[KM + 1]) {
KF__BSPLINE_UNROLL
    for (int r = 0; r <= KM; ++r) Nw[r] = T(0);
    if (!(x >= t[0] && x < t[nk - 1])) return -1;
    int64_t lo = 0, hi = nk - 2; // the largest j <= nk - 2 with t_j <= x
    while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if (t[mid] <= x) lo = mid;
        else hi = mid - 1;
    }
    const int64_t j = lo;
    if (!(t[j] <= x && x < t[j + 1])) return -1;
    Nw[0] = T(1);
KF__BSPLINE_UNROLL
    for (int p = 1; p <= KM; ++p) {
        if (p > q) break;
        const T *ip = inv + (int64_t)(p - 1) * nk;
        // Descending r: new[r] reads old[r - 1] (B_{m,p-1}) and old[r] (B_{m+1,p-1}).
KF__BSPLINE_UNROLL
        for (int r = p; r >= 0; --r) {
            const int64_t m = j - p + r;
            T v = T(0);
            if (m >= 0 && m + p + 1 < nk) {
                const T b0 = r >= 1 ? Nw[r - 1] : T(0);
                const T b1 = r <= p - 1 ? Nw[r] : T(0);
                v = (x - t[m]) * ip[m] * b0 + (t[m + p + 1] - x) * ip[m + 1] * b1;
            }
            Nw[r] = v;
        }
    }
    return j;
}

/* d/dx B_{j-p+r, p}(x), r = 0..p, from the order-(p-1) window W of x (kf__bspline_window with
 * q = p - 1, which returned the span j >= 0): W[r - 1] = B_{j-p+r, p-1} and W[r] =
 * B_{j-p+r+1, p-1}, the ends of the window 0. inv_p: the feature's order-p reciprocals
 * (inv + (p - 1) nk). The caller keeps the basis index j - p + r in [0, C). */
template <int KM, typename T>
KF__BSPLINE_HD T kf__bspline_dwindow(const T *inv_p, int64_t j, int p, int r,
                                     const T (&W)[KM + 1]) {
    const int64_t m = j - p + r;
    const T bl = r >= 1 ? W[r - 1] : T(0), br = r <= p - 1 ? W[r] : T(0);
    return KF__BSPLINE_DSTEP(T(p), inv_p[m], inv_p[m + 1], bl, br);
}

/* The m-th derivatives of the order-k bases of one point that can be non-zero, 0 <= m <= k + 1:
 * Nw[r] = B_{j-k+r, k}^(m)(x), r = 0..k, for the span j it returns (-1 and every value 0 outside
 * the grid, for NaN, and for m = k + 1: B^(k+1) = 0). The order-(k-m) window of
 * kf__bspline_window, then m steps of the derivative rule (KF__BSPLINE_DSTEP) over the orders
 * p = k-m+1 .. k in registers, descending r as there; a term whose basis index falls outside
 * [0, nk - 1 - p) is 0 (it feeds no basis of the layer). The window form of
 * kf__bspline_deriv_rows_X (the same operations per basis), for C++ and CUDA; the caller keeps
 * the basis index j - k + r in [0, C). */
template <int KM, typename T>
KF__BSPLINE_HD int64_t kf__bspline_deriv_window(const T *t, const T *inv, int64_t nk, int k, int m,
                                                T x, T (&Nw)[KM + 1]) {
    if (m > k) {
KF__BSPLINE_UNROLL
        for (int r = 0; r <= KM; ++r) Nw[r] = T(0);
        return -1;
    }
    const int64_t j = kf__bspline_window<KM, T>(t, inv, nk, k - m, x, Nw);
    if (j < 0) return j;
KF__BSPLINE_UNROLL
    for (int p = 1; p <= KM; ++p) {
        if (p <= k - m) continue;
        if (p > k) break;
        const T *ip = inv + (int64_t)(p - 1) * nk;
KF__BSPLINE_UNROLL
        for (int r = p; r >= 0; --r) {
            const int64_t i = j - p + r;
            T v = T(0);
            if (i >= 0 && i + p + 1 < nk) {
                const T bl = r >= 1 ? Nw[r - 1] : T(0), br = r <= p - 1 ? Nw[r] : T(0);
                v = KF__BSPLINE_DSTEP(T(p), ip[i], ip[i + 1], bl, br);
            }
            Nw[r] = v;
        }
    }
    return j;
}
#endif /* __cplusplus */

#endif /* KF_BSPLINE_H */

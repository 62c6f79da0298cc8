/* The B-spline basis, written once (docs/ops/kan.md): the Cox-de Boor recurrence with kfuse's
 * conventions, half-open knot intervals, every basis 0 outside [t_0, t_{nk-1}) (and for NaN),
 * and a term over a knot span narrower than FLT_MIN counted as 0 (the reference's 0/0):
 *     B_{j,0}(x) = [t_j <= x < t_{j+1}]                                   j = 0..nk-2
 *     B_{j,p}(x) = (x - t_j) inv_p[j] B_{j,p-1}(x) + (t_{j+p+1} - x) inv_p[j+1] B_{j+1,p-1}(x)
 * with inv_p[m] = 1 / (t_{m+p} - t_m), 0 for a span narrower than FLT_MIN.
 *
 * Two forms of the one recurrence, in the one header every backend includes:
 *  - KF__BSPLINE_DEFINE(T, suffix): for C and C++, the CPU kernels in float and double
 *    (cpu/kan_linear.c) and the float64 grid refit (host/kan_grid.c): the reciprocal table of one feature and the bases
 *    of one feature at many points, vectorised over the points;
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

/* Defines, for element type T:
 *
 * kf__bspline_inv_<suffix>(t, nk, k, inv): the reciprocal table inv [k, nk] of knots t[0..nk-1]:
 *   inv[(p-1) nk + m] = inv_p[m] for p = 1..k, m = 0..nk-1 (0 where m + p >= nk).
 *
 * kf__bspline_rows_<suffix>(t, inv, nk, q, x0, rows, x, S, dst): the order-q bases of one feature
 *   at x0[0..rows), computed over all indices as the reference does (no local window, no branch):
 *   dst [nk-1-q, rows] (row stride `rows`), B_c at point n in dst[c rows + n]. Orders below q go
 *   to the scratch S [nk-1, rows], in place (ascending j reads B_{j+1,p-1} before it is
 *   overwritten); dst may be S. x [rows] is scratch: points outside the grid are moved to its
 *   right end, which keeps every basis 0 while keeping (x - t) inv finite (far out it would
 *   overflow and make 0 * inf = NaN, as efficient-kan does in float32 for |x| near 1e38). */
/* The derivative rule: one step of
 *     d/dx B_{c,p}(x) = p inv_p[c] B_{c,p-1}(x) - p inv_p[c+1] B_{c+1,p-1}(x)      (p >= 1)
 * as the one expression every backend evaluates (the same operations in the same order, so the
 * CPU kernels, the CUDA kernels and the plain path agree on the rounding): `p` the order, `il`
 * and `ir` inv_p[c] and inv_p[c+1], `bl` and `br` B_{c,p-1}(x) and B_{c+1,p-1}(x). A macro only
 * because the operands may be float, double or the CPU kernels' vectors of either (GCC's vector
 * extension), in C, C++ and CUDA. The m-th derivative is the same step applied m times, over the
 * orders p = k - m + 1 .. k, to the order-(k - m) bases (d^m/dx^m B_{c,k} from d^(m-1)/dx^(m-1)
 * B_{c,k-1} and B_{c+1,k-1}); today's callers take m = 1. */
#define KF__BSPLINE_DSTEP(p, il, ir, bl, br) ((p) * (il) * (bl) - (p) * (ir) * (br))

#define KF__BSPLINE_DEFINE(T, suffix)                                                             \
    static inline void kf__bspline_inv_##suffix(const T *t, int64_t nk, int64_t k, T *inv) {    \
        for (int64_t p = 1; p <= k; ++p)                                                         \
            for (int64_t m = 0; m < nk; ++m) {                                                   \
                const T d = m + p < nk ? t[m + p] - t[m] : (T)0;                                 \
                inv[(p - 1) * nk + m] = d >= (T)FLT_MIN ? (T)1 / d : (T)0;                       \
            }                                                                                    \
    }                                                                                            \
    static inline void kf__bspline_rows_##suffix(const T *t, const T *inv, int64_t nk, int64_t q, \
                                                 const T *KF__RESTRICT x0, int64_t rows,         \
                                                 T *KF__RESTRICT x, T *S, T *dst) {              \
        const T first = t[0], last = t[nk - 1];                                                  \
        for (int64_t n = 0; n < rows; ++n)                                                       \
            x[n] = (x0[n] >= first && x0[n] < last) ? x0[n] : last;                              \
        T *o0 = q == 0 ? dst : S;                                                                \
        for (int64_t j = 0; j + 1 < nk; ++j) {                                                   \
            const T lo = t[j], hi = t[j + 1];                                                    \
            T *KF__RESTRICT b = o0 + j * rows;                                                   \
            for (int64_t n = 0; n < rows; ++n) b[n] = (x[n] >= lo && x[n] < hi) ? (T)1 : (T)0;   \
        }                                                                                        \
        for (int64_t p = 1; p <= q; ++p) {                                                       \
            const T *ip = inv + (p - 1) * nk;                                                    \
            T *out = p == q ? dst : S;                                                           \
            for (int64_t j = 0; j + p + 1 < nk; ++j) {                                           \
                const T tl = t[j], tr = t[j + p + 1], il = ip[j], ir = ip[j + 1];                \
                const T *KF__RESTRICT b1 = S + (j + 1) * rows;                                   \
                T *KF__RESTRICT d = out + j * rows;                                              \
                if (out == S) { /* in place: B_{j,p-1} is d itself */                            \
                    for (int64_t n = 0; n < rows; ++n)                                           \
                        d[n] = (x[n] - tl) * il * d[n] + (tr - x[n]) * ir * b1[n];               \
                } else {                                                                         \
                    const T *KF__RESTRICT b0 = S + j * rows;                                     \
                    for (int64_t n = 0; n < rows; ++n)                                           \
                        d[n] = (x[n] - tl) * il * b0[n] + (tr - x[n]) * ir * b1[n];              \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
    }

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
#endif /* __cplusplus */

#endif /* KF_BSPLINE_H */

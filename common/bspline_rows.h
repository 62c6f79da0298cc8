/* The vectorised ("rows") form of the B-spline recurrence of common/bspline.h, for one element
 * type: included by bspline.h once per type with KF__BS_T the type and KF__BS_X(name) its
 * suffixed name (kf__bspline_inv_s, _d), so that the functions are written once and each type
 * has its own named, typed instance. No include guard (included once per type).
 *
 * KF__BS_X(kf__bspline_inv)(t, nk, k, inv): the reciprocal table inv [k, nk] of knots
 *   t[0..nk-1]: inv[(p-1) nk + m] = inv_p[m] for p = 1..k, m = 0..nk-1 (0 where m + p >= nk).
 *
 * KF__BS_X(kf__bspline_rows)(t, inv, nk, q, x0, rows, x, S, dst): the order-q bases of one
 *   feature at x0[0..rows), computed over all indices as the reference does (no local window, no
 *   branch): dst [nk-1-q, rows] (row stride `rows`), B_c at point n in dst[c rows + n]. Orders
 *   below q go to the scratch S [nk-1, rows], in place (ascending j reads B_{j+1,p-1} before it
 *   is overwritten); dst may be S. x [rows] is scratch: points outside the grid are moved to its
 *   right end, which keeps every basis 0 while keeping (x - t) inv finite (far out it would
 *   overflow and make 0 * inf = NaN, as efficient-kan does in float32 for |x| near 1e38).
 *
 * KF__BS_X(kf__bspline_deriv_rows)(t, inv, nk, k, m, x0, rows, x, S): the m-th derivatives
 *   B_c^(m) of the order-k bases, c = 0..nk-2-k, into S [nk-1, rows] (c's row at S + c rows),
 *   for 0 <= m <= k + 1: the order-(k-m) bases, then m steps of the derivative rule
 *   (KF__BSPLINE_DSTEP) over the orders p = k-m+1 .. k, in place with ascending c; B^(k+1) is 0
 *   (the bases are piecewise polynomials of degree k: the derivative almost everywhere, what
 *   autograd through the recurrence gives). At m = 1 the same operations in the same order as
 *   the kernels' dx. */
static inline void KF__BS_X(kf__bspline_inv)(const KF__BS_T *t, int64_t nk, int64_t k,
                                             KF__BS_T *inv) {
    for (int64_t p = 1; p <= k; ++p)
        for (int64_t m = 0; m < nk; ++m) {
            const KF__BS_T d = m + p < nk ? t[m + p] - t[m] : (KF__BS_T)0;
            inv[(p - 1) * nk + m] = d >= (KF__BS_T)FLT_MIN ? (KF__BS_T)1 / d : (KF__BS_T)0;
        }
}

/* One order p of the recurrence over every index j: out[j] from S's order-(p-1) rows. */
static inline void KF__BS_X(kf__bspline_step)(const KF__BS_T *t, const KF__BS_T *ip, int64_t nk,
                                              int64_t p, const KF__BS_T *KF__RESTRICT x,
                                              int64_t rows, KF__BS_T *S, KF__BS_T *out) {
    for (int64_t j = 0; j + p + 1 < nk; ++j) {
        const KF__BS_T tl = t[j], tr = t[j + p + 1], il = ip[j], ir = ip[j + 1];
        const KF__BS_T *KF__RESTRICT b1 = S + (j + 1) * rows;
        KF__BS_T *KF__RESTRICT d = out + j * rows;
        if (out == S) { /* in place: B_{j,p-1} is d itself */
            for (int64_t n = 0; n < rows; ++n)
                d[n] = (x[n] - tl) * il * d[n] + (tr - x[n]) * ir * b1[n];
        } else {
            const KF__BS_T *KF__RESTRICT b0 = S + j * rows;
            for (int64_t n = 0; n < rows; ++n)
                d[n] = (x[n] - tl) * il * b0[n] + (tr - x[n]) * ir * b1[n];
        }
    }
}

static inline void KF__BS_X(kf__bspline_rows)(const KF__BS_T *t, const KF__BS_T *inv, int64_t nk,
                                              int64_t q, const KF__BS_T *KF__RESTRICT x0,
                                              int64_t rows, KF__BS_T *KF__RESTRICT x,
                                              KF__BS_T *S, KF__BS_T *dst) {
    const KF__BS_T first = t[0], last = t[nk - 1];
    for (int64_t n = 0; n < rows; ++n) x[n] = (x0[n] >= first && x0[n] < last) ? x0[n] : last;
    KF__BS_T *o0 = q == 0 ? dst : S;
    for (int64_t j = 0; j + 1 < nk; ++j) {
        const KF__BS_T lo = t[j], hi = t[j + 1];
        KF__BS_T *KF__RESTRICT b = o0 + j * rows;
        for (int64_t n = 0; n < rows; ++n)
            b[n] = (x[n] >= lo && x[n] < hi) ? (KF__BS_T)1 : (KF__BS_T)0;
    }
    for (int64_t p = 1; p <= q; ++p)
        KF__BS_X(kf__bspline_step)(t, inv + (p - 1) * nk, nk, p, x, rows, S, p == q ? dst : S);
}

static inline void KF__BS_X(kf__bspline_deriv_rows)(const KF__BS_T *t, const KF__BS_T *inv,
                                                    int64_t nk, int64_t k, int64_t m,
                                                    const KF__BS_T *KF__RESTRICT x0, int64_t rows,
                                                    KF__BS_T *KF__RESTRICT x, KF__BS_T *S) {
    if (m > k) { /* B^(k+1) = 0 */
        for (int64_t n = 0; n < (nk - 1 - k) * rows; ++n) S[n] = (KF__BS_T)0;
        return;
    }
    KF__BS_X(kf__bspline_rows)(t, inv, nk, k - m, x0, rows, x, S, S);
    for (int64_t p = k - m + 1; p <= k; ++p) {
        const KF__BS_T *ip = inv + (p - 1) * nk, pf = (KF__BS_T)p;
        for (int64_t c = 0; c + p + 1 < nk; ++c) {
            const KF__BS_T il = ip[c], ir = ip[c + 1];
            KF__BS_T *KF__RESTRICT d = S + c * rows;
            const KF__BS_T *KF__RESTRICT b1 = S + (c + 1) * rows;
            for (int64_t n = 0; n < rows; ++n) d[n] = KF__BSPLINE_DSTEP(pf, il, ir, d[n], b1[n]);
        }
    }
}

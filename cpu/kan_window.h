/* The windowed path's kernels (cpu/kan_linear.c's header comment says why and when), for the
 * compute type T of the inclusion (T, VEC the 32-byte vector of T, VI the int32 vector of as
 * many lanes, KAN_X(name) = name_s or name_d: cpu/kan_linear.c includes this once per type; no
 * include guard). */

/* Rows 1..k+1 of V [k+2, rows] from the k + 1 computed rows Nb [k+1, rl]: V[1 + u, n] =
 * Nb[u + dl[n], n], the window moved by dl[n] columns (selected, not multiplied). */
static void KAN_X(kan_window_move)(const T *Nb, int64_t rl, const int32_t *dl, int64_t rows,
                                   int32_t k, T *V) {
    for (int32_t u = 0; u <= k; ++u) {
        T *v = V + (1 + u) * rows;
        memset(v, 0, (size_t)rows * sizeof(T));
        for (int32_t r = 0; r <= k; ++r) {
            const T *a = Nb + r * rl;
            for (int64_t n = 0; n < rows; ++n) v[n] = r == u + dl[n] ? a[n] : v[n];
        }
    }
}

/* The window of one feature at x[0..rows) (kf__bspline_rows' bases, computed only where
 * they can be non-zero). Per row: the span j (t_j <= x < t_{j+1}, counted as the knots
 * t_1..t_{nk-2} at or below x; any j, with every basis 0, outside [t_0, t_{nk-1}) and for
 * NaN), the order-k bases B_{j-k..j} by the triangular recurrence, L rows at a time in
 * registers with the knots t_{j-k..j+k+1} and reciprocals gathered per row (descending r,
 * so that B_{m,p-1} and B_{m+1,p-1} are read before being overwritten; the same expression
 * as the dense form, hence the same bits), then moved to the window start
 * s = clamp(j - k, 0, C - 1 - k) so that its k + 1 columns are all real ones. Bases of
 * indices outside [0, C) (order p: [0, nk - 1 - p)) come from clamped knot indices and
 * never feed a real one; the move drops them by selection, not by a product.
 * deriv: V[0] = SiLU'(x) and the window of B' (the formula above kan_dx), else SiLU(x) and
 * the window of B; with D (not NULL, deriv false) both, the derivatives' window in D. V and D
 * [k+2, rows], s [rows]; scr [k+2, rl] ([2k+3, rl] with D), ints [2, rl] scratch, rl = rows
 * rounded up to whole vectors. */
static void KAN_X(kan_window)(const struct kf_kan_linear_plan *p, const T *t, const T *inv,
                              const T *x, int64_t rows, bool deriv, T *V, T *D, int32_t *s,
                              T *scr, int32_t *ints) {
    enum { L = 32 / sizeof(T) };
    const int32_t nk = (int32_t)p->nk, k = p->k, C = (int32_t)p->C;
    const int64_t rl = (rows + L - 1) / L * L;
    const bool vals = !deriv, ders = deriv || D; /* which windows are wanted */
    T *restrict xc = scr, *restrict Nb = xc + rl, *restrict Nd = D ? Nb + (k + 1) * rl : Nb;
    int32_t *restrict jj = ints, *restrict dl = ints + rl;
    KAN_X(kan_exp_neg_rows)(x, rows, V);
    for (int64_t n = 0; n < rows; ++n) {
        const T sg = (T)1 / ((T)1 + V[n]);
        if (D) D[n] = sg * ((T)1 + x[n] * ((T)1 - sg));
        V[n] = deriv ? sg * ((T)1 + x[n] * ((T)1 - sg)) : x[n] / ((T)1 + V[n]);
    }
    const T first = t[0], last = t[nk - 1];
    for (int64_t n = 0; n < rl; ++n) {
        const bool inside = n < rows && x[n] >= first && x[n] < last;
        xc[n] = inside ? x[n] : first;
        Nb[n] = inside ? (T)1 : (T)0;
        jj[n] = 0;
    }
    for (int32_t m = 1; m + 1 < nk; ++m) {
        const T tm = t[m];
        for (int64_t n = 0; n < rl; ++n) jj[n] += tm <= xc[n];
    }
    const VI zi = {0}, hi = zi + (nk - 1);
    const VEC zero = {0};
    for (int64_t n = 0; n < rl; n += L) {
        const VEC xv = *(const VEC *)(xc + n);
        const VI j = *(const VI *)(jj + n);
        VEC tk[2 * KF__KAN_SPARSE_KMAX + 2], Nv[KF__KAN_SPARSE_KMAX + 1],
            Qv[KF__KAN_SPARSE_KMAX + 1], iq[KF__KAN_SPARSE_KMAX + 2];
        for (int32_t u = -k; u <= k + 1; ++u)
            tk[u + k] = KAN_X(kan_gather)(t, KAN_X(kan_clampv)(j + u, zi, hi));
        Nv[0] = *(const VEC *)(Nb + n);
        for (int32_t q = 1; q <= k; ++q) {
            const T *ip = inv + (int64_t)(q - 1) * nk;
            for (int32_t r = 0; r <= q + 1; ++r)
                iq[r] = KAN_X(kan_gather)(ip, KAN_X(kan_clampv)(j + (r - q), zi, hi));
            if (q == k)
                for (int32_t r = 0; r < k; ++r) Qv[r] = Nv[r];
            for (int32_t r = q; r >= 0; --r) {
                const VEC b0 = r >= 1 ? Nv[r - 1] : zero, b1 = r < q ? Nv[r] : zero;
                Nv[r] = (xv - tk[r - q + k]) * iq[r] * b0 +
                        (tk[r + 1 + k] - xv) * iq[r + 1] * b1;
            }
        }
        for (int32_t r = 0; r <= k; ++r) {
            if (vals) *(VEC *)(Nb + r * rl + n) = Nv[r];
            if (ders) { /* B'_{j-k+r} from the order-(k-1) bases; iq holds inv_k[j-k..j+1] */
                const VEC s0 = r >= 1 ? Qv[r - 1] : zero, s1 = r < k ? Qv[r] : zero;
                VEC v = zero;
                if (k) v = KF__BSPLINE_DSTEP((T)k, iq[r], iq[r + 1], s0, s1);
                *(VEC *)(Nd + r * rl + n) = v;
            }
        }
    }
    for (int64_t n = 0; n < rows; ++n) {
        s[n] = kan_clamp32(jj[n] - k, 0, C - 1 - k);
        dl[n] = s[n] - (jj[n] - k);
    }
    KAN_X(kan_window_move)(Nb, rl, dl, rows, k, V);
    if (D) KAN_X(kan_window_move)(Nd, rl, dl, rows, k, D);
}

/* The windows of features [f0, f1) of block k (x^T from kan_gather_x in xT), stored per row:
 * vals[(n Fw + f - f0)(k+2) + c] = V_c, sidx[n Fw + f - f0] = s. */
static void KAN_X(kan_windows)(const struct kf_kan_linear_plan *p, const kan_geom *g, const T *grid,
                               const T *inv, const T *xT, int64_t rows, int64_t f0, int64_t f1,
                               bool deriv, T *vals, int32_t *sidx, T *V, T *scr, int32_t *ints) {
    const int64_t k2 = p->k + 2, Fw = g->Fw;
    int32_t *s = ints + 2 * ((rows + 7) / 8 * 8); /* past kan_window's [2, rl] */
    for (int64_t i = f0; i < f1; ++i) {
        KAN_X(kan_window)(p, grid + i * p->nk, inv + i * p->k * p->nk, xT + (i - f0) * rows,
                          rows, deriv, V, NULL, s, scr, ints);
        for (int64_t n = 0; n < rows; ++n) {
            T *v = vals + (n * Fw + i - f0) * k2;
            for (int64_t c = 0; c < k2; ++c) v[c] = V[c * rows + n];
            sidx[n * Fw + i - f0] = s[n];
        }
    }
}

/* ybuf[n, :] += sum over features i in [f0, f1) of
 *     V_0 W^T[i cw] + sum_t V_{1+t} W^T[i cw + 1 + s + t]
 * per output panel of KF__KAN_NV vectors, the row's panel in registers over the group (the
 * group's W^T rows for the panel, Fr cw x 256 bytes, stay in L1). */
static void KAN_X(kan_sfwd_product)(const T *WT, const kan_geom *g, int64_t cw, int64_t K,
                                    int64_t k2, const T *vals, const int32_t *sidx, int64_t f0,
                                    int64_t f1, int64_t rows, T *ybuf) {
    enum { L = 32 / sizeof(T) };
    enum { OB = KF__KAN_NV * L };
    const int64_t outp = g->outp, Fw = g->Fw;
    for (int64_t o = 0; o < outp; o += OB)
        for (int64_t n = 0; n < rows; ++n) {
            VEC acc[KF__KAN_NV];
            T *yn = ybuf + n * outp + o;
            for (int q = 0; q < KF__KAN_NV; ++q) acc[q] = *(const VEC *)(yn + q * L);
            for (int64_t i = f0; i < f1; ++i) {
                const T *v = vals + (n * Fw + i - f0) * k2;
                const T *w = WT + o * K + i * cw * OB;
                const VEC v0 = KAN_X(kf__splat)(v[0]);
                for (int q = 0; q < KF__KAN_NV; ++q)
                    acc[q] = KAN_X(kf__fma)(v0, *(const VEC *)(w + q * L), acc[q]);
                const T *ws = w + (1 + sidx[n * Fw + i - f0]) * OB;
                for (int64_t t = 1; t < k2; ++t, ws += OB) {
                    const VEC vt = KAN_X(kf__splat)(v[t]);
                    for (int q = 0; q < KF__KAN_NV; ++q)
                        acc[q] = KAN_X(kf__fma)(vt, *(const VEC *)(ws + q * L), acc[q]);
                }
            }
            for (int q = 0; q < KF__KAN_NV; ++q) *(VEC *)(yn + q * L) = acc[q];
        }
}

/* dxT[i - f0, n] = dbuf[n, :] . (V_0 W^T[i cw] + sum_t V_{1+t} W^T[i cw + 1 + s + t])
 * = V_0 dA_0 + sum_t V_{1+t} dA_{1+s+t} (V from kan_windows with deriv: SiLU' and B'): the
 * window's weight columns combined as in the forward, then dotted with dy; output panel by
 * panel as the forward (the group's panel rows stay in L1), the dot products' partial sums
 * in part [rows, Fr] vectors. */
static void KAN_X(kan_sdx_product)(const T *WT, const kan_geom *g, int64_t cw, int64_t K,
                                   int64_t k2, const T *vals, const int32_t *sidx, int64_t f0,
                                   int64_t f1, int64_t rows, const T *dbuf, VEC *part, T *dxT) {
    enum { L = 32 / sizeof(T) };
    enum { OB = KF__KAN_NV * L };
    const int64_t outp = g->outp, Fw = g->Fw, nf = f1 - f0;
    const VEC zero = {0};
    for (int64_t j = 0; j < rows * nf; ++j) part[j] = zero;
    for (int64_t o = 0; o < outp; o += OB)
        for (int64_t n = 0; n < rows; ++n)
            for (int64_t i = f0; i < f1; ++i) {
                const T *v = vals + (n * Fw + i - f0) * k2, *dn = dbuf + n * outp + o;
                const T *w0 = WT + o * K + i * cw * OB,
                        *ws = w0 + (1 + sidx[n * Fw + i - f0]) * OB;
                VEC e[KF__KAN_NV], a0 = part[n * nf + i - f0], a1 = zero;
                for (int q = 0; q < KF__KAN_NV; ++q) e[q] = v[0] * *(const VEC *)(w0 + q * L);
                for (int64_t t = 1; t < k2; ++t, ws += OB) {
                    const VEC vt = KAN_X(kf__splat)(v[t]);
                    for (int q = 0; q < KF__KAN_NV; ++q)
                        e[q] = KAN_X(kf__fma)(vt, *(const VEC *)(ws + q * L), e[q]);
                }
                for (int q = 0; q < KF__KAN_NV; q += 2) {
                    a0 = KAN_X(kf__fma)(*(const VEC *)(dn + q * L), e[q], a0);
                    a1 = KAN_X(kf__fma)(*(const VEC *)(dn + q * L + L), e[q + 1], a1);
                }
                part[n * nf + i - f0] = a0 + a1;
            }
    for (int64_t n = 0; n < rows; ++n)
        for (int64_t i = f0; i < f1; ++i) {
            const VEC a = part[n * nf + i - f0];
            T dx = 0;
            for (int l = 0; l < L; ++l) dx += a[l];
            dxT[(i - f0) * rows + n] = dx;
        }
}

/* One bucket of the weight gradient (kan_sdw_product): feature f's rows ord[0..nb), whose
 * windows all start at s, added into its accumulator w = dW^T[f cw, panel o] (vf: vals + f
 * k2, row stride sv; db: dbuf + o). For the panel's vectors [q0, q0 + NQ) the k + 2 column
 * sums over the bucket, in the order of ord,
 *     acc[c][q] = sum_r V_c[r] dbuf[r, o + q L],
 * stay in registers (K2 = k + 2, a constant where this is inlined; K2 NQ accumulators, NQ = 2
 * while they fit the 16 vector registers) and are added once to column 0 (c = 0: SiLU) and
 * column s + c (c >= 1: the window's bases). */
static inline __attribute__((always_inline)) void
KAN_X(kan_sdw_bucket)(T *w, int64_t s, const int32_t *ord, int64_t nb, const T *vf, int64_t sv,
                      const T *db, int64_t outp, const int K2) {
    enum { L = 32 / sizeof(T) };
    const int NQ = K2 <= 6 ? 2 : 1;
    const VEC zero = {0};
    for (int q0 = 0; q0 < KF__KAN_NV; q0 += NQ) {
        VEC acc[KF__KAN_SPARSE_KMAX + 2][2];
        for (int c = 0; c < K2; ++c)
            for (int q = 0; q < NQ; ++q) acc[c][q] = zero;
        for (int64_t b = 0; b < nb; ++b) {
            const T *v = vf + ord[b] * sv, *dn = db + ord[b] * outp + q0 * L;
            VEC d[2];
            for (int q = 0; q < NQ; ++q) d[q] = *(const VEC *)(dn + q * L);
            for (int c = 0; c < K2; ++c) {
                const VEC vc = KAN_X(kf__splat)(v[c]);
                for (int q = 0; q < NQ; ++q) acc[c][q] = KAN_X(kf__fma)(vc, d[q], acc[c][q]);
            }
        }
        for (int c = 0; c < K2; ++c) {
            T *wc = w + (c ? s + c : 0) * KF__KAN_OB(sizeof(T)) + q0 * L;
            for (int q = 0; q < NQ; ++q) *(VEC *)(wc + q * L) += acc[c][q];
        }
    }
}

/* dW^T[(i - f0) cw + c, :] += V_c dbuf[n, :] over the block's rows and the window's columns,
 * in output panels as W^T (panel b = o / OB is [F cw, OB]). Per feature the rows are bucketed
 * by window start s (a stable counting sort into ord), so that every row of a bucket adds
 * into the same k + 2 columns: the sums run in registers and reach memory once per bucket
 * (kan_sdw_bucket) instead of once per row, which made a row-by-row form store-bound. Each
 * thread owns its features' accumulator and takes buckets and rows in a fixed order:
 * deterministic. ord [rows], at [C - k] int32 scratch. */
static void KAN_X(kan_sdw_product)(T *dWT, const kan_geom *g, int64_t cw, int64_t k2, const T *vals,
                                   const int32_t *sidx, int64_t nf, int64_t rows, const T *dbuf,
                                   int32_t *ord, int32_t *at) {
    const int64_t outp = g->outp, Fw = g->Fw, FK = g->F * cw, ns = cw + 1 - k2; /* C - k */
    for (int64_t f = 0; f < nf; ++f) {
        memset(at, 0, (size_t)ns * sizeof(int32_t));
        for (int64_t n = 0; n < rows; ++n) ++at[sidx[n * Fw + f]];
        for (int64_t s = 1; s < ns; ++s) at[s] += at[s - 1]; /* at[s]: end of bucket s */
        for (int64_t n = rows - 1; n >= 0; --n) ord[--at[sidx[n * Fw + f]]] = (int32_t)n;
        /* now at[s] is the start of bucket s, and at[s + 1] (or rows) its end */
        for (int64_t o = 0; o < outp; o += KF__KAN_OB(sizeof(T)))
            for (int64_t s = 0; s < ns; ++s) {
                const int64_t b0 = at[s], nb = (s + 1 < ns ? at[s + 1] : rows) - b0;
                T *w = dWT + o * FK + f * cw * KF__KAN_OB(sizeof(T));
                const int32_t *r = ord + b0;
                const T *vf = vals + f * k2, *db = dbuf + o;
                const int64_t sv = Fw * k2;
                if (!nb) continue;
                switch (k2) { /* the common orders k = 0..4 with a constant K2 */
                case 2: KAN_X(kan_sdw_bucket)(w, s, r, nb, vf, sv, db, outp, 2); break;
                case 3: KAN_X(kan_sdw_bucket)(w, s, r, nb, vf, sv, db, outp, 3); break;
                case 4: KAN_X(kan_sdw_bucket)(w, s, r, nb, vf, sv, db, outp, 4); break;
                case 5: KAN_X(kan_sdw_bucket)(w, s, r, nb, vf, sv, db, outp, 5); break;
                case 6: KAN_X(kan_sdw_bucket)(w, s, r, nb, vf, sv, db, outp, 6); break;
                default: KAN_X(kan_sdw_bucket)(w, s, r, nb, vf, sv, db, outp, (int)k2);
                }
            }
    }
}

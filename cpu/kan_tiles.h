/* The dense path's kernels and the moves of a call's tensors in and out, for the compute type T
 * of the inclusion (cpu/kan_linear.c includes this once per type, with T, VEC, VI, KAN_X(name)
 * = name_s or name_d, KAN_GEMM and KAN_ROWGEMM defined; no include guard). Functions taking a
 * storage kind are force-inlined, the kind a constant there (cpu/kan_cpu.h). */

/* ---- bases, vectorised over rows ----
 * A tile is stored transposed, A^T [cols, rows] (row stride `rows`), so that every loop
 * below runs over contiguous rows of one feature with the knots as scalars: plain loops the
 * compiler vectorises, no branches, no per-element search. The GEMMs read it with the
 * transpose flag. */

/* The tile A^T [(f1-f0)*cw, rows] of features [f0, f1) at x^T: per feature the rows
 * SiLU(x), B_0(x) .. B_{C-1}(x) (bases 0 outside the grid). */
static void KAN_X(kan_tile)(const struct kf_kan_linear_plan *p, const T *grid, const T *inv,
                            const T *xT, int64_t rows, int64_t f0, int64_t f1, T *tile, T *S,
                            T *xb) {
    const int64_t nk = p->nk, cw = p->cw;
    for (int64_t i = f0; i < f1; ++i) {
        const T *x = xT + (i - f0) * rows;
        T *restrict a = tile + (i - f0) * cw * rows;
        KAN_X(kan_exp_neg_rows)(x, rows, a);
        for (int64_t n = 0; n < rows; ++n) a[n] = x[n] / ((T)1 + a[n]); /* SiLU */
        KAN_X(kf__bspline_rows)(grid + i * nk, inv + i * p->k * nk, nk, p->k, x, rows, xb, S,
                                a + rows);
    }
}

/* ---- backward ---- */

/* dx^T [f1-f0, rows] for features [f0, f1) from dA^T = (dy W)^T over the same columns:
 *     dx = dA_silu SiLU'(x) + sum_c dA_c B'_c(x),
 *     SiLU'(x) = s (1 + x (1 - s)),   s = sigmoid(x),
 *     B'_{c,k}(x) = KF__BSPLINE_DSTEP over B_{c,k-1}, B_{c+1,k-1} (common/bspline.h)
 * from the order-(k-1) bases (C + 1 of them) in S; zero-width spans contribute 0. */
static void KAN_X(kan_dx)(const struct kf_kan_linear_plan *p, const T *grid, const T *inv,
                          const T *xT, const T *dA, int64_t rows, int64_t f0, int64_t f1, T *dxT,
                          T *S, T *xb) {
    const int64_t nk = p->nk, C = p->C, k = p->k, cw = p->cw;
    for (int64_t i = f0; i < f1; ++i) {
        const T *restrict x = xT + (i - f0) * rows, *restrict d0 = dA + (i - f0) * cw * rows;
        T *restrict acc = dxT + (i - f0) * rows;
        KAN_X(kan_exp_neg_rows)(x, rows, acc);
        for (int64_t n = 0; n < rows; ++n) {
            const T s = (T)1 / ((T)1 + acc[n]);
            acc[n] = d0[n] * (s * ((T)1 + x[n] * ((T)1 - s)));
        }
        if (k == 0) continue;
        const T *fi = inv + i * k * nk, *ik = fi + (k - 1) * nk;
        KAN_X(kf__bspline_rows)(grid + i * nk, fi, nk, k - 1, x, rows, xb, S, S);
        for (int64_t c = 0; c < C; ++c) {
            const T *restrict dc = d0 + (1 + c) * rows, *restrict s0 = S + c * rows,
                              *restrict s1 = s0 + rows;
            const T il = ik[c], ir = ik[c + 1];
            for (int64_t n = 0; n < rows; ++n)
                acc[n] += dc[n] * KF__BSPLINE_DSTEP((T)k, il, ir, s0[n], s1[n]);
        }
    }
}

/* KANConv2d's dx^T [f1-f0, rows] of block k added into its image's dx `img` [Cin, H, W]:
 * each patch element into the pixel it came from (padding is dropped; offsets `tab`). */
static void KAN_X(kan_scatter_patches)(const T *dxT, const kf__kan_patches *P, const kan_blk *k,
                                       int64_t f0, int64_t f1, T *img, const int64_t *tab) {
    const int64_t rows = k->rows, kk = (int64_t)P->kh * P->kw, plane = P->H * P->W;
    for (int64_t f = f0; f < f1; ++f) {
        const T *src = dxT + (f - f0) * rows;
        T *dst = img + f / kk * plane;
        const int64_t *off = tab + f % kk * rows;
        for (int64_t r = 0; r < rows; ++r)
            if (off[r] >= 0) dst[off[r]] += src[r];
    }
}

/* ---- the combined weight and the knots ---- */

/* Rows [o0, o1) of W [out, K]: per feature [ base_weight (0 when absent) |
 * spline_weight * spline_scaler ]. */
KAN_INLINE void KAN_X(kan_pack_w)(kan_kind kind, const struct kf_kan_linear_plan *p,
                                  const void *base, const void *spline, const void *scaler, T *W,
                                  int64_t o0, int64_t o1) {
    const int64_t in = p->in, C = p->C, cw = p->cw;
    for (int64_t o = o0; o < o1; ++o)
        for (int64_t i = 0; i < in; ++i) {
            const int64_t oi = o * in + i;
            T *d = W + o * p->K + i * cw;
            d[0] = base ? KAN_X(kan_get)(kind, base, oi) : (T)0; /* no base_weight: no base term */
            KAN_X(kan_get_n)(kind, d + 1, spline, oi * C, C);
            if (scaler) {
                const T sc = KAN_X(kan_get)(kind, scaler, oi);
                for (int64_t c = 0; c < C; ++c) d[1 + c] *= sc;
            }
        }
}

/* Features [i0, i1) of W^T in output panels (the windowed path): panel b = o / OB is
 * [K, OB] (row i cw + c: feature i's column c of the combined weight over the panel's
 * outputs, zero past out), so that a group of features' columns for one output block are
 * contiguous (rows of one [K, outp] matrix at a power-of-two stride would share L1 sets).
 * Written panel row by panel row. */
KAN_INLINE void KAN_X(kan_pack_wt)(kan_kind kind, const struct kf_kan_linear_plan *p,
                                   const void *base, const void *spline, const void *scaler, T *WT,
                                   int64_t outp, int64_t i0, int64_t i1) {
    const int64_t in = p->in, out = p->out, C = p->C, cw = p->cw, OB = KF__KAN_OB(sizeof(T));
    for (int64_t ob = 0; ob < outp; ob += OB)
        for (int64_t i = i0; i < i1; ++i)
            for (int64_t o = ob; o < ob + OB; ++o) {
                T *d = WT + ob * p->K + i * cw * OB + o % OB;
                const int64_t oi = o * in + i;
                const T sc = scaler && o < out ? KAN_X(kan_get)(kind, scaler, oi) : (T)1;
                d[0] = base && o < out ? KAN_X(kan_get)(kind, base, oi) : (T)0;
                for (int64_t c = 0; c < C; ++c)
                    d[(1 + c) * OB] =
                        o < out ? KAN_X(kan_get)(kind, spline, oi * C + c) * sc : (T)0;
            }
}

/* Features [i0, i1) of the knots `gt` [in, nk] in T and of inv [in, k, nk], each feature's
 * reciprocal table (common/bspline.h). */
KAN_INLINE void KAN_X(kan_knots)(kan_kind kind, const struct kf_kan_linear_plan *p,
                                 const void *grid, T *gt, T *inv, int64_t i0, int64_t i1) {
    const int64_t nk = p->nk;
    KAN_X(kan_get_n)(kind, gt + i0 * nk, grid, i0 * nk, (i1 - i0) * nk);
    for (int64_t i = i0; i < i1; ++i)
        KAN_X(kf__bspline_inv)(gt + i * nk, nk, p->k, inv + i * p->k * nk);
}

/* ---- rows in and out ---- */

/* x^T [f1 - f0, rows] from rows x[n0..n0 + rows) (row stride in): the chunk's features,
 * row-contiguous. Eight rows at a time, so that the eight source lines stay in L1 across the
 * features and the stores are contiguous. */
KAN_INLINE void KAN_X(kan_gather_rows)(kan_kind kind, const void *x, int64_t n0, int64_t in,
                                       int64_t rows, int64_t f0, int64_t f1, T *xT) {
    int64_t n = 0;
    for (; n + 8 <= rows; n += 8)
        for (int64_t i = f0; i < f1; ++i)
            for (int64_t r = 0; r < 8; ++r)
                xT[(i - f0) * rows + n + r] = KAN_X(kan_get)(kind, x, (n0 + n + r) * in + i);
    for (; n < rows; ++n)
        for (int64_t i = f0; i < f1; ++i)
            xT[(i - f0) * rows + n] = KAN_X(kan_get)(kind, x, (n0 + n) * in + i);
}

/* x^T [f1 - f0, rows] of block k: KANLinear's rows, or the patches (im2col of the tile only,
 * from the block's offset table `tab`). */
KAN_INLINE void KAN_X(kan_gather_x)(kan_kind kind, const void *x, const kf__kan_patches *P,
                                    int64_t in, const kan_blk *k, int64_t f0, int64_t f1, T *xT,
                                    const int64_t *tab) {
    if (!P) {
        KAN_X(kan_gather_rows)(kind, x, k->n0, in, k->rows, f0, f1, xT);
        return;
    }
    const int64_t kk = (int64_t)P->kh * P->kw, plane = P->H * P->W;
    const int64_t img = k->img * P->Cin * plane;
    for (int64_t f = f0; f < f1; ++f) {
        const int64_t src = img + f / kk * plane;
        const int64_t *off = tab + f % kk * k->rows;
        T *d = xT + (f - f0) * k->rows;
        for (int64_t r = 0; r < k->rows; ++r)
            d[r] = off[r] >= 0 ? KAN_X(kan_get)(kind, x, src + off[r]) : (T)0;
    }
}

/* KANLinear's dx rows of block k from dx^T [f1 - f0, rows] (the inverse of kan_gather_rows;
 * KANConv2d's dx goes through kan_scatter_patches). */
KAN_INLINE void KAN_X(kan_scatter_rows)(kan_kind kind, const T *dxT, int64_t in, const kan_blk *k,
                                        int64_t f0, int64_t f1, void *dx) {
    const int64_t rows = k->rows, n0 = k->n0;
    int64_t n = 0;
    for (; n + 8 <= rows; n += 8)
        for (int64_t i = f0; i < f1; ++i)
            for (int64_t r = 0; r < 8; ++r)
                KAN_X(kan_set)(kind, dx, (n0 + n + r) * in + i, dxT[(i - f0) * rows + n + r]);
    for (; n < rows; ++n)
        for (int64_t i = f0; i < f1; ++i)
            KAN_X(kan_set)(kind, dx, (n0 + n) * in + i, dxT[(i - f0) * rows + n]);
}

/* Block k's y or dy (kan_yoff) <-> buf, laid out as kan_buf_ld says: element (row n,
 * output o) at n ldb + o, or at o ldb + n for the dense path's KANConv2d copy (`trans`).
 * `load` reads dy into buf (past out, zeros in each row of a [rows, ldb] buf), else y is
 * written from buf. Whole lines at a time where buf is stored as the block is. */
KAN_INLINE void KAN_X(kan_blk_io)(kan_kind kind, void *y, const kf__kan_patches *P,
                                  const kan_geom *g, int64_t out, const kan_blk *k, T *buf,
                                  bool load) {
    const bool trans = P && !g->sparse;
    const int64_t ldb = kan_buf_ld(P, g, out, k);
    int64_t ld;
    const int64_t y0 = kan_yoff(P, g, out, k, &ld);
    if (trans == (P != NULL)) {
        const int64_t lines = trans ? out : k->rows, len = trans ? k->rows : out;
        for (int64_t l = 0; l < lines; ++l)
            if (load) KAN_X(kan_get_n)(kind, buf + l * ldb, y, y0 + l * ld, len);
            else KAN_X(kan_set_n)(kind, y, y0 + l * ld, buf + l * ldb, len);
    } else { /* a KANConv2d block in rows (the windowed path) */
        for (int64_t n = 0; n < k->rows; ++n)
            for (int64_t o = 0; o < out; ++o) {
                if (load) buf[n * ldb + o] = KAN_X(kan_get)(kind, y, y0 + o * ld + n);
                else KAN_X(kan_set)(kind, y, y0 + o * ld + n, buf[n * ldb + o]);
            }
    }
    if (load && !trans)
        for (int64_t n = 0; n < k->rows; ++n)
            memset(buf + n * ldb + out, 0, (size_t)(ldb - out) * sizeof(T));
}

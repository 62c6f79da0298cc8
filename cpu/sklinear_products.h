/* SKLinear's products through the bottleneck and the moves of a call's tensors, for the
 * arithmetic type T of the inclusion (cpu/sklinear.c includes this once per type, with T,
 * SKL_X(name) = name_s or name_d, SKL_CK (T's kf__rg_kind) and SKL_GEMM (the BLAS GEMM of T)
 * defined; no include guard). Functions taking a storage kind `sk` (cpu/rowgemm.h's kf__rg_kind:
 * float32, float64, bfloat16, float16; S, B, H with float arithmetic, D with double) are
 * force-inlined, the kind a constant there; x, the weights and dy are read in place in that
 * kind (cpu/rowgemm.h's kinds of operand), and the products write T: the caller's tensor where
 * the kind is T's, else the float32 block (skl_res) that skl_out_X then rounds, block by block,
 * by the thread that wrote it (still in its cache).
 *  skl_pack_w1t_X: columns [a0, a1) of W1^T [2r, in] in T (row stride ldw; element (j, a): term
 *    j % r / k of S1s (j < r) or U2s, column j % k);
 *  skl_pack_b2t_X: rows [o0, o1) of B2^T = [U1; S2]^T [out, 2r] in T;
 *  skl_z_X: Z[:, j0:2r] = x[:, a0:a1] W1[a0:a1, j0:2r] into Zj (column j0's address; row
 *    stride ldz), j0 = 0 or r (backward needs only the second half);
 *  skl_dz_X: dz [rows, 2r] = s dy[:, o0:o1] [U1; S2][:, o0:o1]^T;
 *  skl_sum_X: the wide split's partial sums, in block order;
 *  skl_out_X: a low-precision plan's results, [rows, cols] of row stride ld, from their float32
 *    block in the workspace into the caller's tensor: round(g), or round(old + g) (nothing for
 *    float32 and float64 plans, whose products write the caller's tensors themselves);
 *  skl_colsum_X, skl_stage2_X, skl_epi_grad_X, skl_dx_X: dbias, y, the gradient through the
 *    epilogue and dx (each below). */

SKL_INLINE void SKL_X(skl_pack_w1t)(kf__rg_kind sk, const struct kf_sklinear_plan *p,
                                    const void *S1, const void *U2, T *W1T, int64_t ldw,
                                    int64_t a0, int64_t a1) {
    const int64_t in = p->in, kk = p->k, r = p->r;
    if (!kf__rg_native(sk)) { /* a row of a sketch widened by vectors, then scattered */
        T t[KF__SKL_TBLOCK];
        for (int64_t j0 = 0; j0 < 2 * r; j0 += kk) /* term j0 / k of S1s, then of U2s */
            for (int64_t a = a0; a < a1; ++a)
                for (int64_t c0 = 0; c0 < kk; c0 += KF__SKL_TBLOCK) {
                    const int64_t w = kk - c0 < KF__SKL_TBLOCK ? kk - c0 : KF__SKL_TBLOCK;
                    SKL_X(kf__rg_widen)(sk, j0 < r ? S1 : U2, (j0 % r / kk * in + a) * kk + c0, t,
                                        w);
                    for (int64_t c = 0; c < w; ++c) W1T[(j0 + c0 + c) * ldw + a] = t[c];
                }
        return;
    }
    for (int64_t b0 = a0; b0 < a1; b0 += KF__SKL_TBLOCK) {
        const int64_t b1 = b0 + KF__SKL_TBLOCK < a1 ? b0 + KF__SKL_TBLOCK : a1;
        for (int64_t j = 0; j < 2 * r; ++j) {
            const void *src = j < r ? S1 : U2;
            const int64_t s0 = (j % r / kk) * in * kk + j % kk; /* src's element of a = 0 */
            T *dst = W1T + j * ldw;
            for (int64_t a = b0; a < b1; ++a) dst[a] = SKL_X(kf__rg_get)(sk, src, s0 + a * kk);
        }
    }
}

SKL_INLINE void SKL_X(skl_pack_b2t)(kf__rg_kind sk, const struct kf_sklinear_plan *p,
                                    const void *U1, const void *S2, T *B2T, int64_t o0,
                                    int64_t o1) {
    const int64_t out = p->out, r = p->r;
    for (int64_t b0 = o0; b0 < o1; b0 += KF__SKL_TBLOCK) {
        const int64_t b1 = b0 + KF__SKL_TBLOCK < o1 ? b0 + KF__SKL_TBLOCK : o1;
        for (int64_t j = 0; j < 2 * r; ++j) {
            const void *src = j < r ? U1 : S2;
            const int64_t s0 = (j % r) * out; /* src's row j % r */
            T t[KF__SKL_TBLOCK]; /* a low row widened by vectors first */
            SKL_X(kf__rg_widen)(sk, src, s0 + b0, t, b1 - b0);
            for (int64_t o = b0; o < b1; ++o)
                B2T[o * 2 * r + j] =
                    kf__rg_native(sk) ? SKL_X(kf__rg_get)(sk, src, s0 + o) : t[o - b0];
        }
    }
}

SKL_INLINE void SKL_X(skl_z)(kf__rg_kind sk, const struct kf_sklinear_plan *p, int64_t rows,
                             const void *x, const void *S1, const void *U2, int64_t a0, int64_t a1,
                             int64_t j0, T *Zj, int64_t ldz) {
    const int64_t in = p->in, kk = p->k, r = p->r;
    for (int64_t h = j0 / r; h < 2; ++h)
        for (int64_t i = 0; i < p->L; ++i) {
            const void *w = kf__rg_at(sk, h ? U2 : S1, (i * in + a0) * kk);
            SKL_X(kf__rowgemm)(sk, sk, SKL_CK, rows, kk, a1 - a0, a1 - a0, 1,
                               kf__rg_at(sk, x, a0), in, 1, w, w, kk, NULL, false,
                               Zj + h * r - j0 + i * kk, ldz);
        }
}

/* Narrow (or low): over B2^T's rows [o0, o1) (packed by the caller); wide: two BLAS GEMMs on U1
 * and S2 in place (the kind is T's there: a low plan is always lo->rg). */
SKL_INLINE void SKL_X(skl_dz)(kf__rg_kind sk, const struct kf_sklinear_plan *p,
                              const skl_layout *lo, int64_t rows, const void *dy, const void *U1,
                              const void *S2, const T *B2T, int64_t o0, int64_t o1, T *dz) {
    const int64_t out = p->out, r = p->r;
    const T s = (T)1 / ((T)2 * (T)p->L);
    if (lo->rg) {
        const T *bt = B2T + o0 * 2 * r;
        SKL_X(kf__rowgemm)(sk, SKL_CK, SKL_CK, rows, 2 * r, o1 - o0, o1 - o0, s,
                           kf__rg_at(sk, dy, o0), out, 1, bt, bt, 2 * r, NULL, false, dz, 2 * r);
        return;
    }
    SKL_GEMM(false, true, rows, r, o1 - o0, s, (const T *)dy + o0, out, (const T *)U1 + o0, out, 0,
             dz, 2 * r);
    SKL_GEMM(false, true, rows, r, o1 - o0, s, (const T *)dy + o0, out, (const T *)S2 + o0, out, 0,
             dz + r, 2 * r);
}

/* dst [N, w] (row stride ld) = the sum over b < nb of part + b N w ([N, w] each), summed in block
 * order whatever the thread: this thread's share of the rows. */
static void SKL_X(skl_sum)(const T *part, int64_t nb, int64_t N, int64_t w, T *dst, int64_t ld,
                           int tid, int nth) {
    int64_t n0, n1;
    kf__cpu_share(N, tid, nth, &n0, &n1);
    for (int64_t n = n0; n < n1; ++n) {
        T *d = dst + n * ld;
        memcpy(d, part + n * w, (size_t)w * sizeof(T));
        for (int64_t b = 1; b < nb; ++b) {
            const T *q = part + (b * N + n) * w;
            for (int64_t j = 0; j < w; ++j) d[j] += q[j];
        }
    }
}

SKL_INLINE void SKL_X(skl_out)(kf__rg_kind sk, const T *res, void *dst, int64_t rows,
                               int64_t cols, int64_t ld, bool accumulate) {
    if (kf__rg_native(sk)) return;
    for (int64_t n = 0; n < rows; ++n)
        kf__lp_store_n((uint16_t *)dst + n * ld, (const float *)res + n * ld, cols, accumulate,
                       kf__rg_bf16(sk));
}

/* db[o] (+)= sum over the N rows of dy[:, o], o in [o0, o1): rows outer, so the inner loop runs
 * along memory; double accumulators, KF__SKL_COLSUM columns at a time; a low plan's sum is
 * rounded to float32 first, then added to the old value in float32 and rounded. */
SKL_INLINE void SKL_X(skl_colsum)(kf__rg_kind sk, const void *dy, int64_t N, int64_t out,
                                  int64_t o0, int64_t o1, void *db, bool accumulate) {
    double acc[KF__SKL_COLSUM];
    for (int64_t c0 = o0; c0 < o1; c0 += KF__SKL_COLSUM) {
        const int64_t w = o1 - c0 < KF__SKL_COLSUM ? o1 - c0 : KF__SKL_COLSUM;
        for (int64_t j = 0; j < w; ++j) acc[j] = 0.0;
        for (int64_t n = 0; n < N; ++n) {
            const int64_t row = n * out + c0; /* dy's element */
            if (kf__rg_native(sk)) {
                for (int64_t j = 0; j < w; ++j) acc[j] += SKL_X(kf__rg_get)(sk, dy, row + j);
            } else { /* widened by vectors first (float16 one at a time: 10% of 256^2) */
                T t[KF__SKL_COLSUM];
                SKL_X(kf__rg_widen)(sk, dy, row, t, w);
                for (int64_t j = 0; j < w; ++j) acc[j] += t[j];
            }
        }
        for (int64_t j = 0; j < w; ++j) {
            const int64_t d = c0 + j; /* db's element */
            const T v = !accumulate          ? (T)acc[j]
                        : kf__rg_native(sk) ? (T)(SKL_X(kf__rg_get)(sk, db, d) + acc[j])
                                             : SKL_X(kf__rg_get)(sk, db, d) + (T)acc[j];
            SKL_X(kf__rg_put)(sk, db, d, v);
        }
    }
}

/* y[rows, o0:o1] = s Z_rows [U1; S2][:, o0:o1] + bias (row stride out): the second stage for a
 * block of rows (row split) or of output columns (wide split); through the float32 block ys
 * unless direct (skl_direct). */
SKL_INLINE void SKL_X(skl_stage2)(kf__rg_kind sk, const struct kf_sklinear_plan *p, const T *z,
                                  int64_t rows, const void *U1, const void *S2, const void *bias,
                                  int64_t o0, int64_t o1, void *y, T *ys, const kf__rg_epi *ep) {
    const int64_t out = p->out, r = p->r;
    const T s = (T)1 / ((T)2 * (T)p->L);
    const void *b = bias ? kf__rg_at(sk, bias, o0) : NULL;
    const void *u1 = kf__rg_at(sk, U1, o0), *s2 = kf__rg_at(sk, S2, o0);
    if (skl_direct(sk, r)) { /* the epilogue in the product's store */
        SKL_X(kf__rowgemm_epi)(SKL_CK, sk, sk, rows, o1 - o0, 2 * r, r, s, z, 2 * r, 1, u1, s2,
                               out, b, false, kf__rg_atw(sk, y, o0), out, ep);
        return;
    }
    SKL_X(kf__rowgemm)(SKL_CK, sk, SKL_CK, rows, o1 - o0, 2 * r, r, s, z, 2 * r, 1, u1, s2, out, b,
                       false, ys + o0, out);
    if (!ep) {
        SKL_X(skl_out)(sk, ys + o0, kf__rg_atw(sk, y, o0), rows, o1 - o0, out, false);
        return;
    }
    /* y's flat index in the output, from the epilogue's origin */
    const int64_t y0 = ((const char *)y - (const char *)ep->origin) / kf__rg_size(sk);
    for (int64_t n = 0; n < rows && !kf__rg_native(sk); ++n) { /* as it is rounded */
        float *v = (float *)ys + o0 + n * out;
        const int64_t ix = y0 + o0 + n * out;
        if (ep->pre)
            kf__lp_store_n((uint16_t *)ep->pre + ix, v, o1 - o0, false, kf__rg_bf16(sk));
        kf__rg_epi_s(ep, v, (int)(o1 - o0), ix);
        kf__lp_store_n((uint16_t *)y + o0 + n * out, v, o1 - o0, false, kf__rg_bf16(sk));
    }
}

/* The gradient through the epilogue, g = dy * mask / (1 - p) * act'(pre), in the plan's kind:
 * this thread's share of the rows, KF__SKL_COLSUM columns at a time in T (skl_grad_X). */
SKL_INLINE void SKL_X(skl_epi_grad)(kf__rg_kind sk, const kf__skl_bwd *c, void *g, int tid,
                                    int nth) {
    const int64_t out = c->plan->out;
    const void *dy = c->dy, *pre = c->pre;
    T gb[KF__SKL_COLSUM], pb[KF__SKL_COLSUM];
    int64_t n0, n1;
    kf__cpu_share(c->N, tid, nth, &n0, &n1);
    for (int64_t n = n0; n < n1; ++n)
        for (int64_t o0 = 0; o0 < out; o0 += KF__SKL_COLSUM) {
            const int w = (int)(out - o0 < KF__SKL_COLSUM ? out - o0 : KF__SKL_COLSUM);
            const int64_t i = n * out + o0;
            for (int l = 0; l < w; ++l) gb[l] = SKL_X(kf__rg_get)(sk, dy, i + l);
            for (int l = 0; pre && l < w; ++l) pb[l] = SKL_X(kf__rg_get)(sk, pre, i + l);
            SKL_X(skl_grad)(c, pre ? pb : NULL, gb, w, i);
            for (int l = 0; l < w; ++l) SKL_X(kf__rg_put)(sk, g, i + l, gb[l]);
        }
}

/* dx[rows, a0:a1] = dz W1[a0:a1, :]^T (row stride in), from W1^T packed; through the float32
 * block dxs unless direct (skl_direct). */
SKL_INLINE void SKL_X(skl_dx)(kf__rg_kind sk, const struct kf_sklinear_plan *p,
                              const skl_layout *lo, const T *dz, const T *W1T, int64_t rows,
                              int64_t a0, int64_t a1, void *dx, T *dxs) {
    const int64_t in = p->in, r = p->r;
    if (skl_direct(sk, r)) {
        SKL_X(kf__rowgemm)(SKL_CK, SKL_CK, sk, rows, a1 - a0, 2 * r, 2 * r, 1, dz, 2 * r, 1,
                           W1T + a0, W1T + a0, lo->ldw, NULL, false, kf__rg_atw(sk, dx, a0), in);
        return;
    }
    SKL_X(kf__rowgemm)(SKL_CK, SKL_CK, SKL_CK, rows, a1 - a0, 2 * r, 2 * r, 1, dz, 2 * r, 1,
                       W1T + a0, W1T + a0, lo->ldw, NULL, false, dxs + a0, in);
    SKL_X(skl_out)(sk, dxs + a0, kf__rg_atw(sk, dx, a0), rows, a1 - a0, in, false);
}

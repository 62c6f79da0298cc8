/* One thread's share of an SKLinear forward or backward call (the two splits of cpu/sklinear.c's
 * header comment), for the arithmetic type T of the inclusion and a storage kind `sk`, a
 * constant where the named team functions of cpu/sklinear.c call these (force-inlined) bodies;
 * included once per type after cpu/sklinear_products.h, with its macros defined. */

SKL_INLINE void SKL_X(skl_fwd_body)(kf__rg_kind sk, void *arg, int tid, int nth) {
    const kf__skl_fwd *c = ((const skl_fwd_call *)arg)->c;
    const skl_layout *lo = &((const skl_fwd_call *)arg)->lo;
    const kf__rg_epi *ep = ((const skl_fwd_call *)arg)->ep;
    const struct kf_sklinear_plan *p = c->plan;
    const int64_t in = p->in, out = p->out, r = p->r, N = c->N;
    const void *x = c->x;
    T *Z = skl_at(c->ws, lo->z), *P = skl_at(c->ws, lo->part);
    void *Y = c->y;
    T *Ys = skl_at(c->ws, lo->ysh);
    int64_t a0, a1, n0, n1, o0, o1;
    if (lo->wide) {
        /* Z = x W1 by blocks of `in` */
        for (int64_t b = tid; skl_block(in, skl_cols(in), b, &a0, &a1); b += nth)
            SKL_X(skl_z)(sk, p, N, x, c->S1, c->U2, a0, a1, 0, lo->nbi > 1 ? P + b * N * 2 * r : Z,
                         2 * r);
        if (lo->nbi > 1) {
#pragma omp barrier
            SKL_X(skl_sum)(P, lo->nbi, N, 2 * r, Z, 2 * r, tid, nth);
        }
#pragma omp barrier
        for (int64_t b = tid; skl_block(out, skl_cols(out), b, &o0, &o1); b += nth)
            SKL_X(skl_stage2)(sk, p, Z, N, c->U1, c->S2, c->bias, o0, o1, Y, Ys, ep);
        return;
    }
    for (int64_t b = tid; skl_block(N, KF__SKL_ROWS, b, &n0, &n1); b += nth) {
        T *z = Z + n0 * 2 * r;
        SKL_X(skl_z)(sk, p, n1 - n0, kf__rg_at(sk, x, n0 * in), c->S1, c->U2, 0, in, 0, z, 2 * r);
        SKL_X(skl_stage2)(sk, p, z, n1 - n0, c->U1, c->S2, c->bias, 0, out,
                          kf__rg_atw(sk, Y, n0 * out), Ys + n0 * out, ep);
    }
}

/* The wide split's products through the bottleneck: W1^T packed (for dx); Z's second half (x U2,
 * for dS2) by blocks of `in`; dZ by blocks of `out`; partial sums in block order. dx is left to
 * the column phase. */
SKL_INLINE void SKL_X(skl_bwd_wide)(kf__rg_kind sk, const kf__skl_bwd *c, const skl_layout *lo,
                                    const void *DY, int tid, int nth) {
    const struct kf_sklinear_plan *p = c->plan;
    const int64_t in = p->in, out = p->out, r = p->r, N = c->N;
    const void *x = c->x, *U1 = c->U1, *S2 = c->S2;
    T *W1T = skl_at(c->ws, lo->w1), *B2T = skl_at(c->ws, lo->b2);
    T *Z = skl_at(c->ws, lo->z), *dZ = skl_at(c->ws, lo->dz);
    T *Pz = skl_at(c->ws, lo->part), *Pd = Pz + lo->nbi * N * r;
    int64_t a0, a1, o0, o1;
    const bool zsum = c->dS2 && lo->nbi > 1, dsum = lo->nbo > 1;
    for (int64_t j = tid; j < lo->nbi + lo->nbo; j += nth) {
        if (j < lo->nbi) {
            skl_block(in, skl_cols(in), j, &a0, &a1);
            if (c->dx) SKL_X(skl_pack_w1t)(sk, p, c->S1, c->U2, W1T, lo->ldw, a0, a1);
            if (c->dS2) /* a partial holds Z's second half only */
                SKL_X(skl_z)(sk, p, N, x, c->S1, c->U2, a0, a1, r, zsum ? Pz + j * N * r : Z + r,
                             zsum ? r : 2 * r);
        } else {
            const int64_t b = j - lo->nbi;
            skl_block(out, skl_cols(out), b, &o0, &o1);
            if (lo->rg) SKL_X(skl_pack_b2t)(sk, p, U1, S2, B2T, o0, o1);
            SKL_X(skl_dz)(sk, p, lo, N, DY, U1, S2, B2T, o0, o1, dsum ? Pd + b * N * 2 * r : dZ);
        }
    }
#pragma omp barrier
    if (zsum) SKL_X(skl_sum)(Pz, lo->nbi, N, r, Z + r, 2 * r, tid, nth);
    if (dsum) SKL_X(skl_sum)(Pd, lo->nbo, N, 2 * r, dZ, 2 * r, tid, nth);
}

SKL_INLINE void SKL_X(skl_bwd_body)(kf__rg_kind sk, void *arg, int tid, int nth) {
    const kf__skl_bwd *c = ((const skl_bwd_call *)arg)->c;
    const skl_layout *lo = &((const skl_bwd_call *)arg)->lo;
    const struct kf_sklinear_plan *p = c->plan;
    const int64_t in = p->in, out = p->out, r = p->r, kk = p->k, N = c->N;
    const T s = (T)1 / ((T)2 * (T)p->L);
    const bool acc = c->accumulate, pacc = kf__rg_native(sk) && acc;
    const void *x = c->x, *U1 = c->U1, *S2 = c->S2, *DY = c->dy;
    if (lo->epi) { /* the products read the gradient through the epilogue in dy's place */
        void *g = skl_at(c->ws, lo->g);
        SKL_X(skl_epi_grad)(sk, c, g, tid, nth);
        DY = g;
#pragma omp barrier
    }
    void *dX = c->dx;
    T *dXs = skl_at(c->ws, lo->dxsh);
    T *dS1 = c->dS1 ? skl_res(sk, c->dS1, c->ws, lo->d1sh) : NULL;
    T *dS2 = c->dS2 ? skl_res(sk, c->dS2, c->ws, lo->d2sh) : NULL;
    T *W1T = skl_at(c->ws, lo->w1), *B2T = skl_at(c->ws, lo->b2);
    T *Z = skl_at(c->ws, lo->z), *dZ = skl_at(c->ws, lo->dz);
    int64_t a0, a1, n0, n1, o0, o1;
    if (lo->wide) {
        SKL_X(skl_bwd_wide)(sk, c, lo, DY, tid, nth);
    } else {
        kf__cpu_share(in, tid, nth, &a0, &a1);
        if (dX) SKL_X(skl_pack_w1t)(sk, p, c->S1, c->U2, W1T, lo->ldw, a0, a1);
        kf__cpu_share(out, tid, nth, &o0, &o1);
        if (lo->rg) SKL_X(skl_pack_b2t)(sk, p, U1, S2, B2T, o0, o1);
#pragma omp barrier
        /* Row-wise: the recomputed second half of Z (for dS2), dZ, dx. */
        for (int64_t b = tid; skl_block(N, KF__SKL_ROWS, b, &n0, &n1); b += nth) {
            const int64_t rows = n1 - n0;
            T *dz = dZ + n0 * 2 * r;
            if (dS2)
                SKL_X(skl_z)(sk, p, rows, kf__rg_at(sk, x, n0 * in), c->S1, c->U2, 0, in, r,
                             Z + n0 * 2 * r + r, 2 * r);
            SKL_X(skl_dz)(sk, p, lo, rows, kf__rg_at(sk, DY, n0 * out), U1, S2, B2T, 0, out, dz);
            if (dX)
                SKL_X(skl_dx)(sk, p, lo, dz, W1T, rows, 0, in, kf__rg_atw(sk, dX, n0 * in),
                              dXs + n0 * in);
        }
    }
#pragma omp barrier
    /* Column-wise: dS2 and dbias by output column; dS1 (and, in the wide split, dx) by input
     * column. dS2 = s Z[:, r:]^T dy and dS1_i = x^T dZ[:, i k:(i + 1) k] go straight into the
     * parameter layouts ([L, k, out] and [L, in, k]). */
    for (int64_t b = tid; skl_block(out, skl_cols(out), b, &o0, &o1); b += nth) {
        if (dS2) {
            const void *dy0 = kf__rg_at(sk, DY, o0);
            SKL_X(kf__rowgemm)(SKL_CK, sk, SKL_CK, r, o1 - o0, N, N, s, Z + r, 1, 2 * r, dy0, dy0,
                               out, NULL, pacc, dS2 + o0, out);
            SKL_X(skl_out)(sk, dS2 + o0, kf__rg_atw(sk, c->dS2, o0), r, o1 - o0, out, acc);
        }
        if (c->db) SKL_X(skl_colsum)(sk, DY, N, out, o0, o1, c->db, acc);
    }
    for (int64_t b = tid; skl_block(in, skl_cols(in), b, &a0, &a1); b += nth) {
        if (dX && lo->wide) SKL_X(skl_dx)(sk, p, lo, dZ, W1T, N, a0, a1, dX, dXs);
        if (dS1)
            for (int64_t i = 0; i < p->L; ++i) {
                T *d1 = dS1 + (i * in + a0) * kk;
                SKL_X(kf__rowgemm)(sk, SKL_CK, SKL_CK, a1 - a0, kk, N, N, 1, kf__rg_at(sk, x, a0),
                                   1, in, dZ + i * kk, dZ + i * kk, 2 * r, NULL, pacc, d1, kk);
                SKL_X(skl_out)(sk, d1, kf__rg_atw(sk, c->dS1, (i * in + a0) * kk), 1,
                               (a1 - a0) * kk, 0, acc);
            }
    }
}

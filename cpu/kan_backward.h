/* One thread's share of a backward call, on either path (g->sparse: cpu/kan_window.h's kernels,
 * else cpu/kan_tiles.h's tiles and the GEMMs), for the compute type T of the inclusion and a
 * storage kind constant where it is inlined (cpu/kan_linear.c's kan_bwd_team_s, _d, _b, _h).
 * Where the storage type is T (kan_direct) the dense products read dy and write KANConv2d's dx in
 * the caller's tensors; a low plan's go through the thread's buffers in T (g->yb, g->dxi),
 * converted a block (an image for dx) at a time. No include guard (cpu/kan_linear.c includes
 * this once per compute type). */

/* Folds the chunk [f0, f1) of dW = dy^T A into the parameter gradients, dW[o, col] at
 * o so + col sc ([out, (f1-f0)*cw]: so = (f1-f0)*cw, sc = 1; transposed: so = 1, sc = ld):
 *     d base_weight = dW_silu,   d spline_weight = dW_spline * spline_scaler,
 *     d spline_scaler = sum_c dW_spline[c] * spline_weight[c];
 * accumulating, each is stored as old + new (summed in T, then rounded once). */
KAN_INLINE void KAN_X(kan_fold_dw)(kan_kind kind, const kf__kan_bwd *c, const T *dW, int64_t f0,
                                   int64_t f1, int64_t ob, int64_t sb, int64_t so, int64_t sc) {
    const struct kf_kan_linear_plan *p = c->plan;
    const int64_t in = p->in, C = p->C, cw = p->cw;
    const bool acc = c->accumulate;
    const void *scaler = c->scaler, *spline = c->spline;
    void *dbase = c->dbase, *dspline = c->dspline, *dscaler = c->dscaler;
    for (int64_t o = 0; o < p->out; ++o)
        for (int64_t i = f0; i < f1; ++i) {
            const int64_t oi = o * in + i;
            const T *g = dW + o / ob * sb + o % ob * so + (i - f0) * cw * sc;
            if (dbase)
                KAN_X(kan_set)
                (kind, dbase, oi, acc ? KAN_X(kan_get)(kind, dbase, oi) + g[0] : g[0]);
            if (dspline) {
                const T s = scaler ? KAN_X(kan_get)(kind, scaler, oi) : (T)1;
                for (int64_t q = 0; q < C; ++q) {
                    const int64_t e = oi * C + q;
                    const T v = g[(1 + q) * sc] * s;
                    KAN_X(kan_set)
                    (kind, dspline, e, acc ? KAN_X(kan_get)(kind, dspline, e) + v : v);
                }
            }
            if (dscaler) {
                T sum = 0;
                for (int64_t q = 0; q < C; ++q)
                    sum += g[(1 + q) * sc] * KAN_X(kan_get)(kind, spline, oi * C + q);
                KAN_X(kan_set)
                (kind, dscaler, oi, acc ? KAN_X(kan_get)(kind, dscaler, oi) + sum : sum);
            }
        }
}

/* Block k's dy for the dense products: in place, or a low plan's copy in yb, stored as the
 * block is; *ld receives its row stride. */
KAN_INLINE const T *KAN_X(kan_dy)(kan_kind kind, const kf__kan_bwd *c, const kan_geom *g,
                                  const kan_blk *k, T *yb, int64_t *ld) {
    const kf__kan_patches *P = c->patches;
    const int64_t out = c->plan->out, y0 = kan_yoff(P, g, out, k, ld);
    if (kan_direct(kind)) return (const T *)c->dy + y0;
    *ld = kan_buf_ld(P, g, out, k);
    KAN_X(kan_blk_io)(kind, (void *)c->dy, P, g, out, k, yb, true);
    return yb;
}

KAN_INLINE void KAN_X(kan_bwd_body)(kan_kind kind, void *arg, int tid, int nth) {
    const kf__kan_bwd *c = ((const kan_bwd_call *)arg)->c;
    const kan_geom *g = &((const kan_bwd_call *)arg)->g;
    const struct kf_kan_linear_plan *p = c->plan;
    const kf__kan_patches *P = c->patches;
    const int64_t in = p->in, out = p->out, cw = p->cw, K = p->K, k2 = p->k + 2;
    T *W = kan_at(c->ws, g->wc), *inv = kan_at(c->ws, g->inv), *grid = kan_at(c->ws, g->grid);
    void *DX = c->dx;
    char *mine = (char *)c->ws + g->thr + (size_t)tid * g->thr_bytes;
    T *tile = kan_at(mine, g->tile), *dW = kan_at(mine, g->dw), *xT = kan_at(mine, g->xt),
      *dxT = kan_at(mine, g->dxt), *S = kan_at(mine, g->s), *xb = kan_at(mine, g->xb),
      *win = kan_at(mine, g->win), *yb = kan_at(mine, g->yb), *dxi = kan_at(mine, g->dxi);
    int32_t *sidx = kan_at(mine, g->sidx), *ints = kan_at(mine, g->ints);
    VEC *part = kan_at(mine, g->part);
    int64_t *off = kan_at(mine, g->off), held[2] = {-1, -1};
    int64_t a0, a1, ld = 0;
    kf__cpu_share(g->sparse ? in : out, tid, nth, &a0, &a1);
    if (DX && g->sparse)
        KAN_X(kan_pack_wt)(kind, p, c->base, c->spline, c->scaler, W, g->outp, a0, a1);
    else if (DX)
        KAN_X(kan_pack_w)(kind, p, c->base, c->spline, c->scaler, W, a0, a1);
    kf__cpu_share(in, tid, nth, &a0, &a1);
    KAN_X(kan_knots)(kind, p, c->grid, grid, inv, a0, a1);
    #pragma omp barrier
    const T *dy = NULL;
    /* dx, unit by unit (a row block, or a whole image whose dx this thread alone sums, in
     * `img`: the caller's image, or a low plan's dxi, rounded into dx once complete).
     * Dense: dA^T = (dy W)^T chunk by chunk (each chunk owns its features), dy taken
     * transposed when it is stored [rows, out] (KANLinear) and as it is when it is already
     * [out, rows]. Windowed: dy copied to the tile [rows, outp]. */
    const int64_t img_elems = P ? P->Cin * P->H * P->W : 0;
    for (int64_t u = tid; DX && u * g->unit < g->blocks; u += nth) {
        T *img = P && kan_direct(kind) ? (T *)DX + u * img_elems : dxi;
        if (P) memset(img, 0, (size_t)img_elems * sizeof(T));
        for (int64_t b = u * g->unit; b < (u + 1) * g->unit; ++b) {
            const kan_blk k = kan_blk_of(g, b);
            if (P) kan_block_offsets(P, &k, off, held);
            if (g->sparse)
                KAN_X(kan_blk_io)(kind, (void *)c->dy, P, g, out, &k, tile, true);
            else
                dy = KAN_X(kan_dy)(kind, c, g, &k, yb, &ld);
            for (int64_t ch = 0; ch < g->rchunks; ++ch) {
                const int64_t f0 = ch * g->Fr, f1 = kan_min(in, f0 + g->Fr);
                const int64_t cols = (f1 - f0) * cw;
                if (!g->sparse)
                    KAN_GEMM(true, !P, cols, k.rows, out, 1, W + f0 * cw, K, dy, ld, 0,
                                  tile, k.rows);
                KAN_X(kan_gather_x)(kind, c->x, P, in, &k, f0, f1, xT, off);
                if (g->sparse) {
                    KAN_X(kan_windows)(p, g, grid, inv, xT, k.rows, f0, f1, true, S, sidx, win,
                                       win + k2 * k.rows, ints);
                    KAN_X(kan_sdx_product)(W, g, cw, K, k2, S, sidx, f0, f1, k.rows, tile, part,
                                           dxT);
                } else {
                    KAN_X(kan_dx)(p, grid, inv, xT, tile, k.rows, f0, f1, dxT, S, xb);
                }
                if (P) KAN_X(kan_scatter_patches)(dxT, P, &k, f0, f1, img, off);
                else KAN_X(kan_scatter_rows)(kind, dxT, in, &k, f0, f1, DX);
            }
        }
        if (P && !kan_direct(kind)) KAN_X(kan_set_n)(kind, DX, u * img_elems, img, img_elems);
    }
    /* The weight gradient, chunk by chunk over all rows in a fixed order (no barrier needed:
     * the two loops write disjoint outputs and read only inputs, W, the knots and inv).
     * Dense: dW = dy^T A by GEMM into [out, F cw]; windowed: dW^T in panels (zeroed
     * first). */
    const bool want_w = c->dbase || c->dspline || c->dscaler;
    const int64_t OB = KF__KAN_OB((int64_t)sizeof(T));
    for (int64_t ch = tid; want_w && ch < g->chunks; ch += nth) {
        const int64_t f0 = ch * g->F, f1 = kan_min(in, f0 + g->F), cols = (f1 - f0) * cw;
        if (g->sparse) memset(dW, 0, (size_t)(g->F * cw * g->outp) * sizeof(T));
        for (int64_t b = 0; b < g->blocks; ++b) {
            const kan_blk k = kan_blk_of(g, b);
            if (P) kan_block_offsets(P, &k, off, held);
            KAN_X(kan_gather_x)(kind, c->x, P, in, &k, f0, f1, xT, off);
            if (g->sparse) {
                KAN_X(kan_blk_io)(kind, (void *)c->dy, P, g, out, &k, tile, true);
                KAN_X(kan_windows)(p, g, grid, inv, xT, k.rows, f0, f1, false, S, sidx, win,
                                   win + k2 * k.rows, ints);
                KAN_X(kan_sdw_product)(dW, g, cw, k2, S, sidx, f1 - f0, k.rows, tile, ints,
                                       ints + 3 * ((g->rows + 7) / 8 * 8));
                continue;
            }
            dy = KAN_X(kan_dy)(kind, c, g, &k, yb, &ld);
            KAN_X(kan_tile)(p, grid, inv, xT, k.rows, f0, f1, tile, S, xb);
            KAN_GEMM(!P, true, out, cols, k.rows, 1, dy, ld, tile, k.rows, b ? 1 : 0, dW,
                          cols);
        }
        if (g->sparse) KAN_X(kan_fold_dw)(kind, c, dW, f0, f1, OB, g->F * cw * OB, 1, OB);
        else KAN_X(kan_fold_dw)(kind, c, dW, f0, f1, out, 0, cols, 1);
    }
}

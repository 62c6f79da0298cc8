/* One thread's share of a forward call, on either path (g->sparse: cpu/kan_window.h's kernels,
 * else cpu/kan_tiles.h's tiles and the GEMM), for the compute type T of the inclusion and a
 * storage kind constant where it is inlined (cpu/kan_linear.c's kan_fwd_team_s, _d, _b, _h).
 * Where the storage type is T (kan_direct) the dense products write y in the caller's tensor; a
 * low plan's go through the thread's buffer in T (g->yb), converted a block at a time. No include
 * guard (cpu/kan_linear.c includes this once per compute type). */

KAN_INLINE void KAN_X(kan_fwd_body)(kan_kind kind, void *arg, int tid, int nth) {
    const kf__kan_fwd *c = ((const kan_fwd_call *)arg)->c;
    const kan_geom *g = &((const kan_fwd_call *)arg)->g;
    const struct kf_kan_linear_plan *p = c->plan;
    const kf__kan_patches *P = c->patches;
    const int64_t in = p->in, out = p->out, cw = p->cw, K = p->K, k2 = p->k + 2;
    T *W = kan_at(c->ws, g->wc), *inv = kan_at(c->ws, g->inv), *grid = kan_at(c->ws, g->grid);
    char *mine = (char *)c->ws + g->thr + (size_t)tid * g->thr_bytes;
    T *tile = kan_at(mine, g->tile), *xT = kan_at(mine, g->xt), *S = kan_at(mine, g->s),
      *xb = kan_at(mine, g->xb), *win = kan_at(mine, g->win), *yb = kan_at(mine, g->yb);
    int32_t *sidx = kan_at(mine, g->sidx), *ints = kan_at(mine, g->ints);
    int64_t *off = kan_at(mine, g->off), held[2] = {-1, -1};
    int64_t a0, a1, ld;
    kf__cpu_share(g->sparse ? in : out, tid, nth, &a0, &a1);
    if (g->sparse) KAN_X(kan_pack_wt)(kind, p, c->base, c->spline, c->scaler, W, g->outp, a0, a1);
    else KAN_X(kan_pack_w)(kind, p, c->base, c->spline, c->scaler, W, a0, a1);
    kf__cpu_share(in, tid, nth, &a0, &a1);
    KAN_X(kan_knots)(kind, p, c->grid, grid, inv, a0, a1);
    #pragma omp barrier
    for (int64_t b = tid; b < g->blocks; b += nth) {
        const kan_blk k = kan_blk_of(g, b);
        const int64_t y0 = kan_yoff(P, g, out, &k, &ld);
        T *y =
            kan_direct(kind) ? (T *)c->y + y0 : yb; /* a low plan's block in yb, stored as in y */
        if (!kan_direct(kind)) ld = kan_buf_ld(P, g, out, &k);
        if (P) kan_block_offsets(P, &k, off, held);
        if (g->sparse) memset(tile, 0, (size_t)(k.rows * g->outp) * sizeof(T));
        for (int64_t ch = 0; ch < g->rchunks; ++ch) {
            const int64_t f0 = ch * g->Fr, f1 = kan_min(in, f0 + g->Fr);
            const int64_t cols = (f1 - f0) * cw;
            const T beta = ch ? (T)1 : (T)0;
            KAN_X(kan_gather_x)(kind, c->x, P, in, &k, f0, f1, xT, off);
            if (g->sparse) { /* y[rows, outp] in the tile */
                KAN_X(kan_windows)(p, g, grid, inv, xT, k.rows, f0, f1, false, S, sidx, win,
                                   win + k2 * k.rows, ints);
                KAN_X(kan_sfwd_product)(W, g, cw, K, k2, S, sidx, f0, f1, k.rows, tile);
                continue;
            }
            KAN_X(kan_tile)(p, grid, inv, xT, k.rows, f0, f1, tile, S, xb);
            if (P && out <= KF__KAN_RG_OUT) /* y^T [out, rows] = W_chunk A_chunk^T */
                KAN_ROWGEMM(out, k.rows, cols, cols, 1, W + f0 * cw, K, 1, tile,
                                      tile, k.rows, NULL, ch > 0, y, ld);
            else if (P)
                KAN_GEMM(false, false, out, k.rows, cols, 1, W + f0 * cw, K, tile,
                              k.rows, beta, y, ld);
            else /* y [rows, out] = A_chunk W_chunk^T */
                KAN_GEMM(true, true, k.rows, out, cols, 1, tile, k.rows, W + f0 * cw, K,
                              beta, y, ld);
        }
        if (g->sparse || !kan_direct(kind))
            KAN_X(kan_blk_io)(kind, c->y, P, g, out, &k, g->sparse ? tile : yb, false);
    }
}

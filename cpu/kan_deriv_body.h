/* The order-m path's kernels (cpu/kan_deriv.c) for the compute type T of the inclusion (float or
 * double, the plan's own: this path serves float32 and float64 plans only), KD_X(name) its
 * suffixed name and KD_GEMM its BLAS product. A simple dense path over transposed tiles, like the
 * m = 0 dense path (cpu/kan_linear.c's header comment) but with the tile's columns
 *     w(x) [ SiLU^(m)(x) | B_0^(m)(x) .. B_{C-1}^(m)(x) ]      per feature (cw of them)
 * built per (row block, feature chunk) by common/bspline.h's kf__bspline_deriv_rows and
 * common/silu_deriv.h. No include guard (included once per type). */

/* A thread's scratch (kd_geom's offsets, as T). */
typedef struct {
    T *AT, *D, *S, *xs, *xc, *wc, *sm, *sm1, *inv;
} KD_X(kd_scratch);

static KD_X(kd_scratch) KD_X(kd_scratch_of)(const kd_geom *g, void *ws, int tid) {
    char *mine = (char *)ws + g->thr + (size_t)tid * g->thr_bytes;
    KD_X(kd_scratch) s = {(T *)(mine + g->at),  (T *)(mine + g->d),   (T *)(mine + g->s),
                          (T *)(mine + g->xs),  (T *)(mine + g->xc),  (T *)(mine + g->wc),
                          (T *)(mine + g->sm),  (T *)(mine + g->sm1), (T *)(mine + g->inv)};
    return s;
}

/* Feature f of rows n0..: its knot reciprocals (inv), the columns of x and w (xc, wc; w absent:
 * 1) and SiLU^(m) (sm), and SiLU^(m+1) too (sm1) when `both`: one sigmoid per point. */
static void KD_X(kd_feature)(const struct kf_kan_linear_plan *p, const kd_call *q, int64_t n0,
                             int64_t rows, int64_t f, bool both, KD_X(kd_scratch) *s) {
    const int64_t in = p->in;
    const T *x = q->x, *w = q->w;
    KD_X(kf__bspline_inv)((const T *)q->grid + f * p->nk, p->nk, p->k, s->inv);
    for (int64_t r = 0; r < rows; ++r) {
        const double xv = (double)x[(n0 + r) * in + f], sg = kf__silu_sigmoid(xv);
        s->xc[r] = x[(n0 + r) * in + f];
        s->wc[r] = w ? w[(n0 + r) * in + f] : (T)1;
        s->sm[r] = (T)kf__silu_deriv_at(xv, sg, &q->silu);
        if (both) s->sm1[r] = (T)kf__silu_deriv_at(xv, sg, &q->silu1);
    }
}

/* The bases B^(m) of kd_feature's column xc into S [nk - 1, rows]. */
static void KD_X(kd_bases)(const struct kf_kan_linear_plan *p, const kd_call *q, int64_t m,
                           int64_t rows, int64_t f, KD_X(kd_scratch) *s) {
    KD_X(kf__bspline_deriv_rows)((const T *)q->grid + f * p->nk, s->inv, p->nk, p->k, m, s->xc,
                                 rows, s->xs, s->S);
}

/* A feature's cw columns of the tile A^T: w [SiLU^(m) | B^(m)] from kd_feature and kd_bases. */
static void KD_X(kd_tile_col)(const struct kf_kan_linear_plan *p, int64_t rows, T *col,
                              const KD_X(kd_scratch) *s) {
    for (int64_t r = 0; r < rows; ++r) col[r] = s->wc[r] * s->sm[r];
    for (int64_t c = 0; c < p->C; ++c)
        for (int64_t r = 0; r < rows; ++r) col[(1 + c) * rows + r] = s->wc[r] * s->S[c * rows + r];
}

/* W [out, K] rows [o0, o1): [ base_weight | spline_weight * spline_scaler ] per feature (no base
 * weight: 0). */
static void KD_X(kd_pack_w)(const struct kf_kan_linear_plan *p, const T *base, const T *spline,
                            const T *scaler, T *W, int64_t o0, int64_t o1) {
    const int64_t in = p->in, C = p->C, cw = p->cw;
    for (int64_t o = o0; o < o1; ++o)
        for (int64_t i = 0; i < in; ++i) {
            T *d = W + o * p->K + i * cw;
            const int64_t oi = o * in + i;
            const T sc = scaler ? scaler[oi] : (T)1;
            d[0] = base ? base[oi] : (T)0;
            for (int64_t c = 0; c < C; ++c) d[1 + c] = spline[oi * C + c] * sc;
        }
}

static void KD_X(kd_fwd_team)(void *arg, int tid, int nth) {
    kd_call *q = arg;
    const kf__kan_fwd *c = q->fwd;
    const struct kf_kan_linear_plan *p = c->plan;
    const kd_geom *g = &q->g;
    T *W = c->ws;
    KD_X(kd_scratch) s = KD_X(kd_scratch_of)(g, c->ws, tid);
    int64_t o0, o1;
    kf__cpu_share(p->out, tid, nth, &o0, &o1);
    KD_X(kd_pack_w)(p, c->base, c->spline, c->scaler, W, o0, o1);
    kf__cpu_barrier_wait(&q->bar, nth);
    for (int64_t b = tid; b < g->blocks; b += nth) {
        const int64_t n0 = b * g->R, rows = kan_min(g->R, c->N - n0);
        T *y = (T *)c->y + n0 * p->out;
        for (int64_t f0 = 0; f0 < p->in; f0 += g->Fc) {
            const int64_t f1 = kan_min(p->in, f0 + g->Fc), cols = (f1 - f0) * p->cw;
            for (int64_t f = f0; f < f1; ++f) {
                KD_X(kd_feature)(p, q, n0, rows, f, false, &s);
                KD_X(kd_bases)(p, q, c->order, rows, f, &s);
                KD_X(kd_tile_col)(p, rows, s.AT + (f - f0) * p->cw * rows, &s);
            }
            KD_GEMM(true, true, rows, p->out, cols, 1, s.AT, rows, W + f0 * p->cw, p->K,
                    f0 ? (T)1 : (T)0, y, p->out);
        }
    }
}

/* sum_c D[c] V[c] per row over a feature's cw columns of dA^T (D) and the values V (V[0] = sv,
 * V[1 + c] = S's row c), times wc (NULL: 1), into out[r * in]. */
static void KD_X(kd_contract)(const struct kf_kan_linear_plan *p, const T *D, const T *sv,
                              const T *S, int64_t rows, const T *wc, T *out) {
    for (int64_t r = 0; r < rows; ++r) {
        T v = D[r] * sv[r];
        for (int64_t j = 0; j < p->C; ++j) v += D[(1 + j) * rows + r] * S[j * rows + r];
        out[r * p->in] = wc ? wc[r] * v : v;
    }
}

/* One unit of the backward: row blocks [b0, b1) of feature chunk [f0, f1). Per block: dA^T =
 * W_chunk^T dy^T and its contractions (dw at order m, dx at m + 1, times w) when asked; the
 * tile at order m (its bases shared with dw's contraction), summed as dy^T A into the slab's
 * partial dW when `params`. */
static void KD_X(kd_bwd_unit)(const kd_call *q, KD_X(kd_scratch) *s, int64_t b0, int64_t b1,
                              int64_t f0, int64_t f1, T *part) {
    const kf__kan_bwd *c = q->bwd;
    const struct kf_kan_linear_plan *p = c->plan;
    const kd_geom *g = &q->g;
    const int64_t cw = p->cw, cols = (f1 - f0) * cw, m = c->order;
    const T *W = c->ws, *dy = c->dy;
    const bool rows_out = c->dx || c->dw, params = part != NULL;
    for (int64_t b = b0; b < b1; ++b) {
        const int64_t n0 = b * g->R, rows = kan_min(g->R, c->N - n0);
        if (rows_out) /* dA^T [cols, rows] = W_chunk^T dy^T */
            KD_GEMM(true, true, cols, rows, p->out, 1, W + f0 * cw, p->K, dy + n0 * p->out,
                    p->out, 0, s->D, rows);
        for (int64_t f = f0; f < f1; ++f) {
            const T *D = s->D + (f - f0) * cw * rows;
            KD_X(kd_feature)(p, q, n0, rows, f, c->dx != NULL, s);
            if (c->dw || params) KD_X(kd_bases)(p, q, m, rows, f, s);
            if (c->dw)
                KD_X(kd_contract)(p, D, s->sm, s->S, rows, NULL, (T *)c->dw + n0 * p->in + f);
            if (params) KD_X(kd_tile_col)(p, rows, s->AT + (f - f0) * cw * rows, s);
            if (c->dx) {
                KD_X(kd_bases)(p, q, m + 1, rows, f, s);
                KD_X(kd_contract)(p, D, s->sm1, s->S, rows, s->wc, (T *)c->dx + n0 * p->in + f);
            }
        }
        if (params)
            KD_GEMM(true, true, p->out, cols, rows, 1, dy + n0 * p->out, p->out, s->AT, rows,
                    b > b0 ? (T)1 : (T)0, part + f0 * cw, p->K);
    }
}

/* Output rows [o0, o1) of the parameter gradients: the slabs' partials summed in slab order
 * (into slab 0's), then folded into base, spline and scaler (written or added per
 * c->accumulate). */
static void KD_X(kd_bwd_fold)(const kd_call *q, T *part, int64_t o0, int64_t o1) {
    const kf__kan_bwd *c = q->bwd;
    const struct kf_kan_linear_plan *p = c->plan;
    const int64_t in = p->in, C = p->C, cw = p->cw, K = p->K;
    const size_t slab = q->g.slab / sizeof(T);
    const T *spline = c->spline, *scaler = c->scaler;
    T *dbase = c->dbase, *dspline = c->dspline, *dscaler = c->dscaler;
    for (int64_t o = o0; o < o1; ++o) {
        T *row = part + o * K;
        for (int64_t sl = 1; sl < q->g.slabs; ++sl)
            for (int64_t j = 0; j < K; ++j) row[j] += row[(size_t)sl * slab + j];
        for (int64_t f = 0; f < in; ++f) {
            const T *d = row + f * cw;
            const int64_t oi = o * in + f;
            if (dbase) dbase[oi] = c->accumulate ? dbase[oi] + d[0] : d[0];
            T ds = 0;
            for (int64_t j = 0; j < C; ++j) {
                const T v = d[1 + j] * (scaler ? scaler[oi] : (T)1);
                if (dspline) dspline[oi * C + j] = c->accumulate ? dspline[oi * C + j] + v : v;
                ds += d[1 + j] * spline[oi * C + j];
            }
            if (dscaler) dscaler[oi] = c->accumulate ? dscaler[oi] + ds : ds;
        }
    }
}

/* The backward: W packed, then the units (slab, chunk) round-robin, then the fold. Without
 * parameter gradients every row block is a slab of its own (no partials). */
static void KD_X(kd_bwd_team)(void *arg, int tid, int nth) {
    kd_call *q = arg;
    const kf__kan_bwd *c = q->bwd;
    const kd_geom *g = &q->g;
    const struct kf_kan_linear_plan *p = c->plan;
    KD_X(kd_scratch) s = KD_X(kd_scratch_of)(g, c->ws, tid);
    const bool params = c->dbase || c->dspline || c->dscaler;
    T *part = (T *)((char *)c->ws + g->part);
    int64_t o0, o1;
    kf__cpu_share(p->out, tid, nth, &o0, &o1);
    if (c->dx || c->dw) {
        KD_X(kd_pack_w)(p, c->base, c->spline, c->scaler, c->ws, o0, o1);
        kf__cpu_barrier_wait(&q->bar, nth);
    }
    const int64_t spb = params ? g->spb : 1, slabs = (g->blocks + spb - 1) / spb;
    for (int64_t u = tid; u < slabs * g->chunks; u += nth) {
        const int64_t sl = u / g->chunks, ch = u % g->chunks;
        const int64_t f0 = ch * g->Fc, f1 = kan_min(p->in, f0 + g->Fc);
        KD_X(kd_bwd_unit)(q, &s, sl * spb, kan_min(g->blocks, (sl + 1) * spb), f0, f1,
                          params ? part + (size_t)sl * (g->slab / sizeof(T)) : NULL);
    }
    if (params) {
        kf__cpu_barrier_wait(&q->bar, nth);
        KD_X(kd_bwd_fold)(q, part, o0, o1);
    }
}

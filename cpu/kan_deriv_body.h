/* The order-m path's kernels (cpu/kan_deriv.c) for the compute type T of the inclusion (float or
 * double, the plan's own: this path serves float32 and float64 plans only), KD_X(name) its
 * suffixed name and KD_GEMM its BLAS product. A simple dense path over transposed tiles, like the
 * m = 0 dense path (cpu/kan_linear.c's header comment) but with the tile's columns
 *     w(x) [ SiLU^(m)(x) | B_0^(m)(x) .. B_{C-1}^(m)(x) ]      per feature (cw of them)
 * built per (row block, feature chunk) by common/bspline.h's kf__bspline_deriv_rows and
 * common/silu_deriv.h. No include guard (included once per type). */

/* A thread's scratch (kd_geom's offsets, as T). */
typedef struct {
    T *AT, *dW, *S, *xs, *xc, *wc, *inv;
} KD_X(kd_scratch);

static KD_X(kd_scratch) KD_X(kd_scratch_of)(const kd_geom *g, void *ws, int tid) {
    char *mine = (char *)ws + g->thr + (size_t)tid * g->thr_bytes;
    KD_X(kd_scratch) s = {(T *)(mine + g->at), (T *)(mine + g->dw), (T *)(mine + g->s),
                          (T *)(mine + g->xs), (T *)(mine + g->xc), (T *)(mine + g->wc),
                          (T *)(mine + g->inv)};
    return s;
}

/* The tile A^T [(f1 - f0) cw, rows] of rows n0.. at order m (w absent: 1), and the columns of x
 * and w in xc, wc [rows]; S [nk - 1, rows], xs [rows], inv [k nk] scratch. */
static void KD_X(kd_tile)(const struct kf_kan_linear_plan *p, const kd_call *q, int64_t m,
                          int64_t n0, int64_t rows, int64_t f0, int64_t f1, T *AT, KD_X(kd_scratch) *s) {
    const int64_t in = p->in, nk = p->nk, cw = p->cw;
    const T *x = q->x, *w = q->w, *grid = q->grid;
    T *S = s->S, *xs = s->xs, *xc = s->xc, *wc = s->wc, *inv = s->inv;
    for (int64_t f = f0; f < f1; ++f) {
        const T *t = grid + f * nk;
        KD_X(kf__bspline_inv)(t, nk, p->k, inv);
        for (int64_t r = 0; r < rows; ++r) {
            xc[r] = x[(n0 + r) * in + f];
            wc[r] = w ? w[(n0 + r) * in + f] : (T)1;
        }
        T *col = AT + (f - f0) * cw * rows;
        for (int64_t r = 0; r < rows; ++r)
            col[r] = wc[r] * (T)kf__silu_deriv((double)xc[r], (int)m);
        KD_X(kf__bspline_deriv_rows)(t, inv, nk, p->k, m, xc, rows, xs, S);
        for (int64_t c = 0; c < p->C; ++c)
            for (int64_t r = 0; r < rows; ++r) col[(1 + c) * rows + r] = wc[r] * S[c * rows + r];
    }
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
    const kd_call *q = arg;
    const kf__kan_fwd *c = q->fwd;
    const struct kf_kan_linear_plan *p = c->plan;
    const kd_geom *g = &q->g;
    T *W = c->ws;
    KD_X(kd_scratch) s = KD_X(kd_scratch_of)(g, c->ws, tid);
    int64_t o0, o1;
    kf__cpu_share(p->out, tid, nth, &o0, &o1);
    KD_X(kd_pack_w)(p, c->base, c->spline, c->scaler, W, o0, o1);
    #pragma omp barrier
    for (int64_t b = tid; b < g->blocks; b += nth) {
        const int64_t n0 = b * g->R, rows = kan_min(g->R, c->N - n0);
        T *y = (T *)c->y + n0 * p->out;
        for (int64_t f0 = 0; f0 < p->in; f0 += g->Fc) {
            const int64_t f1 = kan_min(p->in, f0 + g->Fc), cols = (f1 - f0) * p->cw;
            KD_X(kd_tile)(p, q, c->order, n0, rows, f0, f1, s.AT, &s);
            KD_GEMM(true, true, rows, p->out, cols, 1, s.AT, rows, W + f0 * p->cw, p->K,
                    f0 ? (T)1 : (T)0, y, p->out);
        }
    }
}

/* sum_c D[c] V[c] per row over a feature's cw columns of dA^T (D) and the values V at one order
 * (V[0] SiLU^(m), V[1 + c] B_c^(m)), times wc (NULL: 1), into out[r * in]. */
static void KD_X(kd_contract)(const kf__kan_bwd *c, const kd_call *q, int64_t m, const T *D,
                              int64_t rows, int64_t n0, int64_t f, const T *wc, T *out,
                              KD_X(kd_scratch) *s) {
    const struct kf_kan_linear_plan *p = c->plan;
    const T *t = (const T *)q->grid + f * p->nk;
    KD_X(kf__bspline_deriv_rows)(t, s->inv, p->nk, p->k, m, s->xc, rows, s->xs, s->S);
    for (int64_t r = 0; r < rows; ++r) {
        T v = D[r] * (T)kf__silu_deriv((double)s->xc[r], (int)m);
        for (int64_t j = 0; j < p->C; ++j) v += D[(1 + j) * rows + r] * s->S[j * rows + r];
        out[(n0 + r) * p->in + f] = wc ? wc[r] * v : v;
    }
}

/* dx and dw of the row blocks tid, tid + nth, ... */
static void KD_X(kd_bwd_rows)(const kd_call *q, KD_X(kd_scratch) *s, int tid, int nth) {
    const kf__kan_bwd *c = q->bwd;
    const struct kf_kan_linear_plan *p = c->plan;
    const kd_geom *g = &q->g;
    const T *W = c->ws, *dy = c->dy, *x = c->x, *w = c->w;
    for (int64_t b = tid; b < g->blocks; b += nth) {
        const int64_t n0 = b * g->R, rows = kan_min(g->R, c->N - n0);
        for (int64_t f0 = 0; f0 < p->in; f0 += g->Fc) {
            const int64_t f1 = kan_min(p->in, f0 + g->Fc), cols = (f1 - f0) * p->cw;
            /* dA^T [cols, rows] = W_chunk^T dy^T */
            KD_GEMM(true, true, cols, rows, p->out, 1, W + f0 * p->cw, p->K, dy + n0 * p->out,
                    p->out, 0, s->AT, rows);
            for (int64_t f = f0; f < f1; ++f) {
                const T *D = s->AT + (f - f0) * p->cw * rows;
                KD_X(kf__bspline_inv)((const T *)q->grid + f * p->nk, p->nk, p->k, s->inv);
                for (int64_t r = 0; r < rows; ++r) {
                    s->xc[r] = x[(n0 + r) * p->in + f];
                    s->wc[r] = w ? w[(n0 + r) * p->in + f] : (T)1;
                }
                if (c->dw) KD_X(kd_contract)(c, q, c->order, D, rows, n0, f, NULL, c->dw, s);
                if (c->dx) KD_X(kd_contract)(c, q, c->order + 1, D, rows, n0, f, s->wc, c->dx, s);
            }
        }
    }
}

/* The parameter gradients of the chunks tid, tid + nth, ...: dW_chunk [out, cols] summed over
 * every row block in order, then folded (written or added per c->accumulate). */
static void KD_X(kd_bwd_params)(const kd_call *q, KD_X(kd_scratch) *s, int tid, int nth) {
    const kf__kan_bwd *c = q->bwd;
    const struct kf_kan_linear_plan *p = c->plan;
    const kd_geom *g = &q->g;
    const int64_t in = p->in, C = p->C, cw = p->cw;
    const T *dy = c->dy, *spline = c->spline, *scaler = c->scaler;
    T *dbase = c->dbase, *dspline = c->dspline, *dscaler = c->dscaler;
    for (int64_t ch = tid; ch < g->chunks; ch += nth) {
        const int64_t f0 = ch * g->Fc, f1 = kan_min(in, f0 + g->Fc), cols = (f1 - f0) * cw;
        for (int64_t b = 0; b < g->blocks; ++b) {
            const int64_t n0 = b * g->R, rows = kan_min(g->R, c->N - n0);
            KD_X(kd_tile)(p, q, c->order, n0, rows, f0, f1, s->AT, s);
            KD_GEMM(true, true, p->out, cols, rows, 1, dy + n0 * p->out, p->out, s->AT, rows,
                    b ? (T)1 : (T)0, s->dW, cols);
        }
        for (int64_t o = 0; o < p->out; ++o)
            for (int64_t f = f0; f < f1; ++f) {
                const T *d = s->dW + o * cols + (f - f0) * cw;
                const int64_t oi = o * in + f;
                if (dbase) dbase[oi] = c->accumulate ? dbase[oi] + d[0] : d[0];
                T ds = 0;
                for (int64_t j = 0; j < C; ++j) {
                    const T v = d[1 + j] * (scaler ? scaler[oi] : (T)1);
                    if (dspline)
                        dspline[oi * C + j] = c->accumulate ? dspline[oi * C + j] + v : v;
                    ds += d[1 + j] * spline[oi * C + j];
                }
                if (dscaler) dscaler[oi] = c->accumulate ? dscaler[oi] + ds : ds;
            }
    }
}

static void KD_X(kd_bwd_team)(void *arg, int tid, int nth) {
    const kd_call *q = arg;
    const kf__kan_bwd *c = q->bwd;
    KD_X(kd_scratch) s = KD_X(kd_scratch_of)(&q->g, c->ws, tid);
    if (c->dx || c->dw) {
        int64_t o0, o1;
        kf__cpu_share(c->plan->out, tid, nth, &o0, &o1);
        KD_X(kd_pack_w)(c->plan, c->base, c->spline, c->scaler, c->ws, o0, o1);
        #pragma omp barrier
        KD_X(kd_bwd_rows)(q, &s, tid, nth);
    }
    if (c->dbase || c->dspline || c->dscaler) KD_X(kd_bwd_params)(q, &s, tid, nth);
}

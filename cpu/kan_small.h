/* The small-output KANConv2d path's kernels (why and the workspace: cpu/kan_small_geom.h), for the
 * compute type T of the inclusion (T, VEC, KAN_X(name) = name_s or name_d: cpu/kan_linear.c
 * includes this once per type; no include guard). Per image, per input channel: the channel's
 * plane (and x = 0 for the padding, entry H W) in T; a table of windows (kan_window: SiLU or
 * SiLU' and the k + 1 bases or derivatives, and the window start s) per distinct knot row of the
 * channel's kh kw features; then every patch adds its features' terms into its outputs,
 *     y[p, :] += V_0 Wp[f, 0, :] + sum_t V_{1+t} Wp[f, 1 + s + t, :]
 * over the packed weight Wp [in, cw, op] (the combined weight, outputs padded to op with zeros).
 * Every sum runs in a fixed order given by the shape (channels, then kernel positions, then
 * patches in order), and each output element has one writer: the bits do not depend on the
 * thread count. */

/* Wp[i, c, o] for features [i0, i1): [ base_weight | spline_weight * spline_scaler ] of output o
 * (0 past out). */
KAN_INLINE void KAN_X(kan_small_pack)(kan_kind kind, const struct kf_kan_linear_plan *p,
                                      const void *base, const void *spline, const void *scaler,
                                      T *Wp, int64_t op, int64_t i0, int64_t i1) {
    const int64_t in = p->in, C = p->C, cw = p->cw;
    memset(Wp + i0 * cw * op, 0, (size_t)((i1 - i0) * cw * op) * sizeof(T));
    for (int64_t i = i0; i < i1; ++i)
        for (int64_t o = 0; o < p->out; ++o) {
            const int64_t oi = o * in + i;
            T *d = Wp + i * cw * op + o;
            const T sc = scaler ? KAN_X(kan_get)(kind, scaler, oi) : (T)1;
            d[0] = base ? KAN_X(kan_get)(kind, base, oi) : (T)0;
            for (int64_t c = 0; c < C; ++c)
                d[(1 + c) * op] = KAN_X(kan_get)(kind, spline, oi * C + c) * sc;
        }
}

/* tab[f] = the kernel position q <= f % kk of the first feature of f's channel whose knots
 * (gt [in, nk], in T) equal f's bit for bit: that feature's table of windows serves f. */
static void KAN_X(kan_small_tabs)(const T *gt, int64_t in, int64_t nk, int64_t kk, int32_t *tab) {
    for (int64_t f = 0; f < in; ++f) {
        const int64_t pos = f % kk, f0 = f - pos;
        tab[f] = (int32_t)pos;
        for (int64_t q = 0; q < pos; ++q)
            if (!memcmp(gt + (f0 + q) * nk, gt + f * nk, (size_t)nk * sizeof(T))) {
                tab[f] = (int32_t)q;
                break;
            }
    }
}

/* The channel plane xc [X] (X = H W + 1, the last entry 0: the padding) of channel ci of image
 * img. */
KAN_INLINE void KAN_X(kan_small_plane)(kan_kind kind, const void *x, const kf__kan_patches *P,
                                       int64_t img, int64_t ci, T *xc) {
    const int64_t plane = P->H * P->W;
    KAN_X(kan_get_n)(kind, xc, x, (img * P->Cin + ci) * plane, plane);
    xc[plane] = 0;
}

/* The tables of the channel whose first feature is f0, for the kernel positions q with
 * tab[f0 + q] == q: vals[(q X + n)(k+2) + c] = V_c and st[q X + n] = s at xc[n] (kan_window,
 * `deriv` as there; with dvals, not NULL, the derivatives' window there too). R rows at a time
 * through V, scr and ints. */
static void KAN_X(kan_small_tables)(const struct kf_kan_linear_plan *p, const T *grid,
                                    const T *inv, const T *xc, int64_t X, int64_t kk, int64_t f0,
                                    const int32_t *tab, bool deriv, T *vals, T *dvals,
                                    int32_t *st, T *V, T *scr, int32_t *ints) {
    const int64_t nk = p->nk, k2 = p->k + 2, R = KF__KAN_ROWS;
    for (int64_t q = 0; q < kk; ++q) {
        if (tab[f0 + q] != q) continue;
        for (int64_t r0 = 0; r0 < X; r0 += R) {
            const int64_t rows = kan_min(R, X - r0);
            KAN_X(kan_window)(p, grid + (f0 + q) * nk, inv + (f0 + q) * p->k * nk, xc + r0, rows,
                              deriv, V, dvals ? V + k2 * R : NULL, st + q * X + r0, scr, ints);
            for (int64_t n = 0; n < rows; ++n)
                for (int64_t c = 0; c < k2; ++c) {
                    vals[(q * X + r0 + n) * k2 + c] = V[c * rows + n];
                    if (dvals) dvals[(q * X + r0 + n) * k2 + c] = V[k2 * R + c * rows + n];
                }
        }
    }
}

/* e[0..OV) = V_0 Wp[f, 0, :] + sum_t V_{1+t} Wp[f, 1 + s + t, :] for one (patch, feature): v the
 * window's k + 2 values, w = Wp + f cw op. K2 = k + 2 and OV = op / L constants where inlined. */
KAN_INLINE void KAN_X(kan_small_terms)(VEC *e, const T *v, int32_t s, const T *w, int64_t op,
                                       int K2, int OV) {
    enum { L = 32 / sizeof(T) };
    const VEC v0 = KAN_X(kf__splat)(v[0]);
    for (int q = 0; q < OV; ++q) e[q] = KAN_X(kf__fma)(v0, *(const VEC *)(w + q * L), e[q]);
    const T *ws = w + (1 + s) * op;
    for (int t = 1; t < K2; ++t, ws += op) {
        const VEC vt = KAN_X(kf__splat)(v[t]);
        for (int q = 0; q < OV; ++q) e[q] = KAN_X(kf__fma)(vt, *(const VEC *)(ws + q * L), e[q]);
    }
}

/* The forward terms of patches [p0, p0 + NB) added into their rows of acc (y^T [P, op]), over
 * the kk positions: NB patches at once, since one patch's terms are one chain of dependent
 * FMAs (kk (k + 2) of them) that only other patches' chains can overlap. */
KAN_INLINE void KAN_X(kan_small_fwd_block)(const T *Wp, const T *vals, const int32_t *st,
                                           const int32_t *tab, const int64_t *off, int64_t f0,
                                           int64_t kk, int64_t p0, int64_t P, int64_t X,
                                           int64_t cw, int64_t op, T *acc, int K2, int OV,
                                           int NB) {
    enum { L = 32 / sizeof(T) };
    VEC a[4][4];
    for (int j = 0; j < NB; ++j)
        for (int q = 0; q < OV; ++q) a[j][q] = *(const VEC *)(acc + (p0 + j) * op + q * L);
    for (int64_t u = 0; u < kk; ++u) {
        const int64_t tb = tab[f0 + u];
        const T *w = Wp + (f0 + u) * cw * op;
        for (int j = 0; j < NB; ++j) {
            const int64_t o = off[u * P + p0 + j], pix = tb * X + (o >= 0 ? o : X - 1);
            KAN_X(kan_small_terms)(a[j], vals + pix * K2, st[pix], w, op, K2, OV);
        }
    }
    for (int j = 0; j < NB; ++j)
        for (int q = 0; q < OV; ++q) *(VEC *)(acc + (p0 + j) * op + q * L) = a[j][q];
}

/* The patches' loop of one channel (first feature f0, kk positions), by direction `dir`:
 *   0 forward  acc[p, :] += the terms (acc: y^T [P, op]; kan_small_fwd_block)
 * or the backward's one or both of (acc: dy^T [P, op]), each (patch, position) once:
 *   bit 1 dx       dxv[pix, :] += dy^T[p, :] * the terms of the derivatives' window (dvals),
 *                  lane-wise (summed across lanes later)
 *   bit 2 weights  dw[f, c, :] += V_c dy^T[p, :] for the window's columns c (vals)
 * off [kk, P]: each patch's pixel per position (-1: padding, read as entry X - 1). */
KAN_INLINE void KAN_X(kan_small_loop)(int dir, const T *Wp, const T *vals, const T *dvals,
                                      const int32_t *st, const int32_t *tab, const int64_t *off,
                                      int64_t f0, int64_t kk, int64_t P, int64_t X, int64_t cw,
                                      int64_t op, T *acc, T *dxv, T *dw, int K2, int OV) {
    enum { L = 32 / sizeof(T) };
    const VEC zero = {0};
    if (dir == 0) {
        int64_t p = 0;
        for (; p + 4 <= P; p += 4)
            KAN_X(kan_small_fwd_block)(Wp, vals, st, tab, off, f0, kk, p, P, X, cw, op, acc,
                                       K2, OV, 4);
        for (; p < P; ++p)
            KAN_X(kan_small_fwd_block)(Wp, vals, st, tab, off, f0, kk, p, P, X, cw, op, acc,
                                       K2, OV, 1);
        return;
    }
    for (int64_t p = 0; p < P; ++p) {
        VEC a[4];
        for (int q = 0; q < OV; ++q) a[q] = *(const VEC *)(acc + p * op + q * L);
        for (int64_t u = 0; u < kk; ++u) {
            const int64_t o = off[u * P + p], pix = o >= 0 ? o : X - 1, tb = tab[f0 + u];
            const T *v = vals + (tb * X + pix) * K2, *dv = dvals + (tb * X + pix) * K2;
            const int32_t s = st[tb * X + pix];
            if (dir & 2) {
                T *w = dw + (f0 + u) * cw * op;
                for (int t = 0; t < K2; ++t) {
                    const VEC vt = KAN_X(kf__splat)(v[t]);
                    T *wt = w + (t ? 1 + s + t - 1 : 0) * op;
                    for (int q = 0; q < OV; ++q)
                        *(VEC *)(wt + q * L) = KAN_X(kf__fma)(vt, a[q], *(const VEC *)(wt + q * L));
                }
            }
            if (!(dir & 1)) continue;
            const T *w = Wp + (f0 + u) * cw * op;
            VEC e[4] = {zero, zero, zero, zero}, d = *(const VEC *)(dxv + pix * L);
            KAN_X(kan_small_terms)(e, dv, s, w, op, K2, OV);
            for (int q = 0; q < OV; ++q) d = KAN_X(kf__fma)(a[q], e[q], d);
            *(VEC *)(dxv + pix * L) = d;
        }
    }
}

/* kan_small_loop with its constants: K2 = 5 (the default order k = 3) or any, OV = 1..4. */
static void KAN_X(kan_small_run)(int dir, const T *Wp, const T *vals, const T *dvals,
                                 const int32_t *st, const int32_t *tab, const int64_t *off,
                                 int64_t f0, int64_t kk, int64_t P, int64_t X, int64_t cw,
                                 int64_t op, T *acc, T *dxv, T *dw, int K2) {
    enum { L = 32 / sizeof(T) };
#define KAN_SMALL_ARGS Wp, vals, dvals, st, tab, off, f0, kk, P, X, cw, op, acc, dxv, dw
    switch ((K2 == 5 ? 0 : 4) + (int)(op / L) - 1) {
    case 0: KAN_X(kan_small_loop)(dir, KAN_SMALL_ARGS, 5, 1); break;
    case 1: KAN_X(kan_small_loop)(dir, KAN_SMALL_ARGS, 5, 2); break;
    case 2: KAN_X(kan_small_loop)(dir, KAN_SMALL_ARGS, 5, 3); break;
    case 3: KAN_X(kan_small_loop)(dir, KAN_SMALL_ARGS, 5, 4); break;
    case 4: KAN_X(kan_small_loop)(dir, KAN_SMALL_ARGS, K2, 1); break;
    case 5: KAN_X(kan_small_loop)(dir, KAN_SMALL_ARGS, K2, 2); break;
    case 6: KAN_X(kan_small_loop)(dir, KAN_SMALL_ARGS, K2, 3); break;
    default: KAN_X(kan_small_loop)(dir, KAN_SMALL_ARGS, K2, 4);
    }
#undef KAN_SMALL_ARGS
}

/* Per thread, once per call: every patch's pixel per kernel position for a whole image
 * (off [kk, P]; the same for every image) and the feature -> table map (tab [in]). */
static void KAN_X(kan_small_prep)(const struct kf_kan_linear_plan *p, const kf__kan_patches *P,
                                  const kan_sgeom *g, const T *grid, int64_t *off, int32_t *tab) {
    for (int64_t pos = 0; pos < g->kk; ++pos)
        kf__kan_patch_offsets(P, pos, 0, g->P, off + pos * g->P);
    KAN_X(kan_small_tabs)(grid, p->in, p->nk, g->kk, tab);
}

/* dy^T [P, op] of image img (dy [B, out, P]; zeros past out). */
KAN_INLINE void KAN_X(kan_small_dyt)(kan_kind kind, const void *dy, int64_t img, int64_t out,
                                     int64_t P, int64_t op, T *acc) {
    memset(acc, 0, (size_t)(P * op) * sizeof(T));
    for (int64_t o = 0; o < out; ++o)
        for (int64_t p = 0; p < P; ++p)
            acc[p * op + o] = KAN_X(kan_get)(kind, dy, (img * out + o) * P + p);
}

/* A thread's region of the workspace, by name. */
typedef struct KAN_X(kan_small_mem) {
    int64_t *off;
    int32_t *tab, *st, *ints;
    T *Wp, *inv, *grid, *vals, *dvals, *xc, *V, *scr, *acc, *dxv, *dxi;
} KAN_X(kan_small_mem);

static KAN_X(kan_small_mem) KAN_X(kan_small_at)(void *ws, const kan_sgeom *g, int tid) {
    char *mine = (char *)ws + g->thr + (size_t)tid * g->thr_bytes;
    KAN_X(kan_small_mem) m = {
        .off = kan_at(mine, g->off), .tab = kan_at(mine, g->tab), .st = kan_at(mine, g->st),
        .ints = kan_at(mine, g->ints), .Wp = ws, .inv = kan_at(ws, g->inv),
        .grid = kan_at(ws, g->grid), .vals = kan_at(mine, g->vals),
        .dvals = kan_at(mine, g->dvals), .xc = kan_at(mine, g->xc),
        .V = kan_at(mine, g->win), .scr = kan_at(mine, g->scr), .acc = kan_at(mine, g->acc),
        .dxv = kan_at(mine, g->dxv), .dxi = kan_at(mine, g->dxi)};
    return m;
}

/* One thread's share of a forward call: images tid, tid + nth, ... */
KAN_INLINE void KAN_X(kan_small_fwd_body)(kan_kind kind, void *arg, int tid, int nth) {
    const kf__kan_fwd *c = ((const kan_sfwd_call *)arg)->c;
    const kan_sgeom *g = &((const kan_sfwd_call *)arg)->g;
    const struct kf_kan_linear_plan *p = c->plan;
    const kf__kan_patches *P = c->patches;
    const int64_t kk = g->kk, np = g->P, op = g->op;
    const KAN_X(kan_small_mem) m = KAN_X(kan_small_at)(c->ws, g, tid);
    int64_t a0, a1;
    kf__cpu_share(p->in, tid, nth, &a0, &a1);
    KAN_X(kan_small_pack)(kind, p, c->base, c->spline, c->scaler, m.Wp, op, a0, a1);
    KAN_X(kan_knots)(kind, p, c->grid, m.grid, m.inv, a0, a1);
    #pragma omp barrier
    KAN_X(kan_small_prep)(p, P, g, m.grid, m.off, m.tab);
    for (int64_t b = tid; b < P->B; b += nth) {
        memset(m.acc, 0, (size_t)(np * op) * sizeof(T));
        for (int64_t ci = 0; ci < P->Cin; ++ci) {
            KAN_X(kan_small_plane)(kind, c->x, P, b, ci, m.xc);
            KAN_X(kan_small_tables)(p, m.grid, m.inv, m.xc, g->X, kk, ci * kk, m.tab, false,
                                    m.vals, NULL, m.st, m.V, m.scr, m.ints);
            KAN_X(kan_small_run)(0, m.Wp, m.vals, NULL, m.st, m.tab, m.off, ci * kk, kk, np,
                                 g->X, p->cw, op, m.acc, NULL, NULL, (int)p->k + 2);
        }
        for (int64_t o = 0; o < p->out; ++o)
            for (int64_t q = 0; q < np; ++q)
                KAN_X(kan_set)(kind, c->y, (b * p->out + o) * np + q, m.acc[q * op + o]);
    }
}

/* One thread's share of a backward call. Images go in KF__KAN_SMALL_GROUPS groups of
 * consecutive images, round-robin to the threads; per image and channel one
 * window evaluation gives both tables (B for the weight gradient, B' for dx). An image's dx is
 * summed by its one thread over channels, patches and positions in order; the weight gradient
 * of each group in its own accumulator, over its images in order; after a barrier the groups'
 * accumulators are summed in group order per feature (features split by thread) and folded into
 * the parameter gradients. So the bits depend on the shape alone. */
KAN_INLINE void KAN_X(kan_small_bwd_body)(kan_kind kind, void *arg, int tid, int nth) {
    enum { L = 32 / sizeof(T) };
    const kf__kan_bwd *c = ((const kan_sbwd_call *)arg)->c;
    const kan_sgeom *g = &((const kan_sbwd_call *)arg)->g;
    const struct kf_kan_linear_plan *p = c->plan;
    const kf__kan_patches *P = c->patches;
    const int64_t kk = g->kk, np = g->P, op = g->op, X = g->X, plane = X - 1;
    const int64_t wsz = p->in * p->cw * op; /* one group's weight-gradient accumulator */
    const int K2 = (int)p->k + 2;
    const bool want_w = c->dbase || c->dspline || c->dscaler, want_x = c->dx != NULL;
    const KAN_X(kan_small_mem) m = KAN_X(kan_small_at)(c->ws, g, tid);
    T *const dwg = kan_at(c->ws, g->dwg);
    int64_t a0, a1;
    kf__cpu_share(p->in, tid, nth, &a0, &a1);
    if (want_x) KAN_X(kan_small_pack)(kind, p, c->base, c->spline, c->scaler, m.Wp, op, a0, a1);
    KAN_X(kan_knots)(kind, p, c->grid, m.grid, m.inv, a0, a1);
    #pragma omp barrier
    KAN_X(kan_small_prep)(p, P, g, m.grid, m.off, m.tab);
    for (int64_t gi = tid; gi < g->groups; gi += nth) {
        T *dw = dwg + gi * wsz;
        if (want_w) memset(dw, 0, (size_t)wsz * sizeof(T));
        for (int64_t b = gi * P->B / g->groups; b < (gi + 1) * P->B / g->groups; ++b) {
            T *img = !want_x ? NULL /* no dx: c->dx may be NULL, no offset from it */
                     : kan_direct(kind) ? (T *)c->dx + b * P->Cin * plane : m.dxi;
            KAN_X(kan_small_dyt)(kind, c->dy, b, p->out, np, op, m.acc);
            for (int64_t ci = 0; ci < P->Cin; ++ci) {
                KAN_X(kan_small_plane)(kind, c->x, P, b, ci, m.xc);
                KAN_X(kan_small_tables)(p, m.grid, m.inv, m.xc, X, kk, ci * kk, m.tab, !want_w,
                                        want_w ? m.vals : m.dvals, want_w && want_x ? m.dvals
                                                                                    : NULL,
                                        m.st, m.V, m.scr, m.ints);
                if (want_x) memset(m.dxv, 0, (size_t)(X * L) * sizeof(T));
                KAN_X(kan_small_run)((want_w ? 2 : 0) | (want_x ? 1 : 0), m.Wp, m.vals, m.dvals,
                                     m.st, m.tab, m.off, ci * kk, kk, np, X, p->cw, op, m.acc,
                                     m.dxv, dw, K2);
                if (!want_x) continue;
                for (int64_t n = 0; n < plane; ++n) {
                    T d = 0;
                    for (int l = 0; l < L; ++l) d += m.dxv[n * L + l];
                    img[ci * plane + n] = d;
                }
            }
            if (want_x && !kan_direct(kind))
                KAN_X(kan_set_n)(kind, c->dx, b * P->Cin * plane, m.dxi, P->Cin * plane);
        }
    }
    if (!want_w) return;
    #pragma omp barrier
    const int64_t w0 = a0 * p->cw * op, w1 = a1 * p->cw * op;
    for (int64_t gi = 1; gi < g->groups; ++gi)
        for (int64_t j = w0; j < w1; ++j) dwg[j] += dwg[gi * wsz + j];
    KAN_X(kan_fold_dw)(kind, c, dwg + w0, a0, a1, p->out, 0, 1, op);
}

/* The CPU recurrent backend's layout and the helpers its forward and backward share
 * (cpu/rnn_cpu.h): workspace and reserve sizes (float64 plans' too: cpu/rnn_f64.c), weight views
 * and packing, the dropout row; and this ISA's op table (cpu/backend.c selects it). */
#include "rnn_simd.h"

static size_t fbytes(int64_t n) { return kf__align_up((size_t)n * sizeof(float)); }

/* n elements of `esize` bytes, aligned. */
static size_t ebytes(size_t esize, int64_t n) { return kf__align_up((size_t)n * esize); }

static size_t agru_pack_bytes(int64_t in, int64_t H) { return fbytes(3 * H * in) + fbytes(3 * H); }

/* Floats of the panels of a product with K rows (kf__mk). */
static int64_t panel_floats(int ng, int nv, int64_t K, int64_t hc) {
    return kf__num_panels(ng, nv, hc) * K * nv * KF__VW;
}

void kf__rnn_cpu_layout_init(kf__rnn_cpu_layout *lo, const struct kf_rnn_plan *p, int64_t T,
                             int64_t B, bool training) {
    memset(lo, 0, sizeof *lo);
    int64_t H = p->H, D = p->D, N = T * B;
    /* The team (cpu/team.h) by the multiply-adds of the gate products, 3 N H (I + H) per layer
     * and direction (the first layer's input size standing for every layer's); rows are split
     * by batch, so the bits do not depend on it. */
    const int64_t nt = kf__cpu_team_size(
        p->ctx->num_threads, 3.0 * (double)N * (double)H * (double)(p->I + H) * (double)(D * p->L));
    lo->T = T, lo->B = B, lo->N = N, lo->H = H, lo->D = D;
    lo->ts = p->batch_first ? 1 : B;
    lo->bs = p->batch_first ? T : 1;
    lo->ns = (int32_t)(nt < B ? nt : B);
    lo->nbmax = (B + lo->ns - 1) / lo->ns;
    lo->agru = p->cell == KF_RNN_AGRU;
    lo->ng = lo->agru ? 3 : 4;
    lo->low = kf__dtype_is_lowp(p->dtype);
    lo->bf16 = p->dtype == KF_DTYPE_BF16;
    const bool f64 = p->dtype == KF_DTYPE_F64;
    const size_t e = f64 ? sizeof(double) : sizeof(float);

    size_t off = 0;
    if (lo->agru && !f64) {
        lo->pack_first = agru_pack_bytes(p->I, H);
        lo->pack_stride = agru_pack_bytes(D * H, H);
        off = lo->pack_first + (size_t)(p->L - 1) * lo->pack_stride;
    }
    /* pk[0]: forward gated (3 gates, GRU; 2, A-GRU) or backward plain with K = 3H / 2H;
     * pk[1] (A-GRU): A or A^T, [H, H] either way */
    const int ngr = lo->agru ? 2 : 3;
    const int64_t in_max = p->L > 1 && D * H > p->I ? D * H : p->I; /* widest layer input */
    lo->rec = off;
    if (f64) { /* A (A-GRU) or nothing: rec_pk1 = 0 */
        lo->rec_bytes = lo->agru ? ebytes(e, H * H) : 0;
    } else {
        const int64_t fwd_pk0 = panel_floats(ngr, ngr, H, H);
        const int64_t bwd_pk0 = panel_floats(1, KF__NV_P, ngr * H, H);
        lo->rec_pk1 = fbytes(fwd_pk0 > bwd_pk0 ? fwd_pk0 : bwd_pk0);
        lo->rec_pk2 = lo->rec_pk1 + (lo->agru ? fbytes(panel_floats(1, KF__NV_P, H, H)) : 0);
        lo->rec_bytes = lo->rec_pk2 + fbytes(panel_floats(1, KF__NV_P, 3 * H, in_max));
    }
    off += (size_t)(p->L * D) * lo->rec_bytes;
    /* wrec_fused: the per-step products read rows of Hp (and q) as whole vectors, so only where
     * they hold whole panels. Then the per-step weight gradients and dX leave the backward
     * nothing to keep for all N rows, and the forward keeps one step's rows of each slice in
     * big[]: B rows (T=784: 0.4 MB, not 308) */
    const bool fused = !f64 && H % (KF__NV_P * KF__VW) == 0;
    for (int i = 0; i < 2; i++) {
        lo->big[i] = off;
        off += ebytes(e, (fused ? B : N) * 3 * H);
    }
    for (int i = 0; i < 2; i++) {
        lo->seq[i] = off;
        off += p->L > 1 ? ebytes(e, N * D * H) : 0;
    }
    lo->slice0 = off;
    lo->slice_buf = ebytes(e, lo->nbmax * H);
    lo->slice_bytes = 3 * lo->slice_buf + (lo->low ? fbytes(lo->nbmax * p->I) : 0);
    off += (size_t)lo->ns * lo->slice_bytes;
    lo->gmat = off;
    off += lo->agru ? ebytes(e, H * H) : 0;
    lo->epsacc = off;
    off += lo->agru ? kf__align_up((size_t)lo->ns * sizeof(double)) : 0;
    lo->wrec_fused = fused;
    lo->wpart = off;
    lo->aux_step = fbytes(3 * H * H);
    lo->win = lo->aux_step + fbytes(lo->nbmax * (lo->agru ? H : 3 * H));
    lo->dgx_step = lo->win + fbytes(in_max * 3 * H);
    lo->wpart_bytes = lo->wrec_fused ? lo->dgx_step + fbytes(lo->nbmax * 3 * H) : 0;
    off += (size_t)lo->ns * lo->wpart_bytes;
    lo->bsum = off;
    lo->bsum_bytes = f64 ? 0 : kf__align_up((size_t)(4 * H) * sizeof(double));
    off += (size_t)lo->ns * lo->bsum_bytes;
    if (lo->low) {
        size_t wide_bytes = 0;
        for (int32_t k = 0; k < p->num_weights; k++)
            wide_bytes += fbytes(kf__rnn_weight_elems(p, k));
        lo->views = off;
        off += kf__align_up((size_t)(2 * p->num_weights) * sizeof(void *));
        lo->wide = off;
        off += wide_bytes;
        lo->dwide = off;
        off += training ? wide_bytes : 0;
        lo->xw = off;
        off += training ? fbytes(N * p->I) : 0;
        lo->dxw = off;
        off += training ? fbytes(N * p->I) : 0;
    }
    lo->ws_bytes = off;

    lo->hp_bytes = ebytes(e, N * H);
    lo->cell_bytes = lo->hp_bytes + ebytes(e, N * lo->ng * H);
    lo->out0 = (size_t)(p->L * D) * lo->cell_bytes;
    lo->out_bytes = ebytes(e, N * D * H);
    lo->reserve_bytes = training ? lo->out0 + (size_t)(p->L - 1) * lo->out_bytes : 0;
}

void kf__cpu_rnn_sizes(const struct kf_rnn_plan *p, int64_t T, int64_t B, bool training,
                       size_t *ws_bytes, size_t *reserve_bytes) {
    kf__rnn_cpu_layout lo;
    kf__rnn_cpu_layout_init(&lo, p, T, B, training);
    *ws_bytes = lo.ws_bytes;
    *reserve_bytes = lo.reserve_bytes;
}

static size_t pack_offset(const kf__rnn_cpu_layout *lo, int32_t l) {
    return l ? lo->pack_first + (size_t)(l - 1) * lo->pack_stride : 0;
}

kf__rnn_cell kf__rnn_cpu_cell(const kf__rnn_cpu_layout *lo, const struct kf_rnn_plan *p,
                              const void *const *w, void *ws, int32_t l, int32_t d) {
    const void *const *cw = w + (size_t)(l * p->D + d) * (size_t)p->nw;
    int64_t H = p->H, in = kf__rnn_layer_input(p, l);
    kf__rnn_cell c = {.in = in, .eps = 1.0f};
    const char *rec = (const char *)ws + lo->rec + (size_t)(l * p->D + d) * lo->rec_bytes;
    c.pk[0] = (const float *)rec;
    c.pk[1] = (const float *)(rec + lo->rec_pk1);
    c.pk[2] = (const float *)(rec + lo->rec_pk2);
    if (!lo->agru) {
        c.w3 = cw[KF__GRU_W_IH];
        c.b3 = cw[KF__GRU_B_IH];
        c.brec = cw[KF__GRU_B_HH];
        return c;
    }
    const char *base = (const char *)ws + pack_offset(lo, l);
    c.w3 = (const float *)base;
    c.b3 = (const float *)(base + fbytes(3 * H * in));
    c.eps = *(const float *)cw[KF__AGRU_EPS];
    return c;
}

/* A per-step product's B [K, N = ng*nc] as a view of the caller's weights: M is the matrix of
 * up to 3 row blocks of H rows and ld columns (blk[g] = rows gH..gH+H), B = M^T (trans) or M;
 * with skew, M = S - S^T - gamma I for S = blk[0] (A-GRU's A, built while packing; ld = H). */
typedef struct pack_spec {
    const float *blk[3];
    bool trans, skew;
    int ng, nv;
    int64_t K, ld, nc;
} pack_spec;

static float spec_at(const pack_spec *ps, int64_t H, float gamma, int64_t k, int64_t n) {
    const int64_t r = ps->trans ? n : k, c = ps->trans ? k : n;
    const float *m = ps->blk[r / H];
    float v = m[(r % H) * ps->ld + c];
    if (ps->skew) v -= m[c * H + r] + (r == c ? gamma : 0.0f);
    return v;
}

/* Panel p of `ps` into dst (layout: kf__mk in rnn_simd.h; columns past nc are zeros). */
static void pack_panel(const pack_spec *ps, int64_t H, float gamma, int64_t p, float *dst) {
    const int w = ps->nv * KF__VW;
    dst += p * ps->K * w;
    for (int v = 0; v < ps->nv; v++) {
        const int64_t j0 = kf__panel_col(ps->ng, ps->nv, p, v);
        const int64_t n0 = (ps->ng > 1 ? v : 0) * ps->nc;
        for (int cc = 0; cc < KF__VW; cc++)
            for (int64_t k = 0; k < ps->K; k++)
                dst[k * w + v * KF__VW + cc] =
                    j0 + cc < ps->nc ? spec_at(ps, H, gamma, k, n0 + j0 + cc) : 0.0f;
    }
}

/* The per-step products of cell (l, d), pk[0..2] (notation of rnn_bwd.c / rnn_fwd.c):
 * forward GRU  h W_hh^T (gates r, z, n side by side); A-GRU h [U_z; U_r]^T (z, r), q A^T;
 * backward GRU dG_h W_hh (K = 3H); A-GRU [da_z, da_r] [U_z; U_r] (K = 2H), da_d A; and where
 * kf__rnn_dx_fused, both cells' dX = dG_x W3 (K = 3H, `in` columns). Returns which of ps[0..2]
 * it filled, bit i for ps[i]. */
static unsigned cell_specs(const kf__rnn_cpu_layout *lo, const void *const *cw, bool bwd,
                           int64_t in, pack_spec *ps) {
    const int64_t H = lo->H;
    unsigned used;
    if (!lo->agru) {
        const float *whh = cw[KF__GRU_W_HH];
        ps[0] = (pack_spec){{whh, whh + H * H, whh + 2 * H * H}, !bwd, false, bwd ? 1 : 3,
                            bwd ? KF__NV_P : 3, bwd ? 3 * H : H, H, H};
        used = 1u;
    } else {
        ps[0] = (pack_spec){{cw[KF__AGRU_U_Z], cw[KF__AGRU_U_R]}, !bwd, false, bwd ? 1 : 2,
                            bwd ? KF__NV_P : 2, bwd ? 2 * H : H, H, H};
        ps[1] = (pack_spec){{cw[KF__AGRU_W_H]}, !bwd, true, 1, KF__NV_P, H, H, H};
        used = 3u;
    }
    if (bwd && kf__rnn_dx_fused(in)) {
        const float *w3 = cw[KF__GRU_W_IH];
        ps[2] = lo->agru ? (pack_spec){{cw[KF__AGRU_W_Z], cw[KF__AGRU_W_R], cw[KF__AGRU_V_H]},
                                       false, false, 1, KF__NV_P, 3 * H, in, in}
                         : (pack_spec){{w3, w3 + H * in, w3 + 2 * H * in}, false, false, 1,
                                       KF__NV_P, 3 * H, in, in};
        used |= 4u;
    }
    return used;
}

/* Work items are whole panels of every cell's products, and rows of the A-GRU W3 / b3 copy. */
void kf__rnn_cpu_pack(const kf__rnn_cpu_layout *lo, const struct kf_rnn_plan *p,
                      const void *const *w, void *ws, bool bwd, int tid, int nth) {
    const int64_t H = p->H;
    for (int32_t c = 0; c < p->L * p->D; c++) {
        kf__rnn_cell cell = kf__rnn_cpu_cell(lo, p, w, ws, c / p->D, c % p->D);
        pack_spec ps[3];
        const unsigned used = cell_specs(lo, w + (size_t)c * (size_t)p->nw, bwd, cell.in, ps);
        for (int i = 0; i < 3; i++) {
            if (!(used >> i & 1u)) continue;
            int64_t p0, p1;
            kf__part(kf__num_panels(ps[i].ng, ps[i].nv, ps[i].nc), nth, tid, &p0, &p1);
            for (int64_t pi = p0; pi < p1; pi++)
                pack_panel(&ps[i], H, p->gamma, pi, (float *)cell.pk[i]);
        }
    }
    if (!lo->agru) return;
    for (int32_t l = 0; l < p->L; l++) {
        const void *const *cw = w + (size_t)l * (size_t)p->nw;
        kf__rnn_cell c = kf__rnn_cpu_cell(lo, p, w, ws, l, 0);
        float *w3 = (float *)c.w3, *b3 = (float *)c.b3;
        const float *wx[3] = {cw[KF__AGRU_W_Z], cw[KF__AGRU_W_R], cw[KF__AGRU_V_H]};
        const float *bx[3] = {cw[KF__AGRU_B_Z], cw[KF__AGRU_B_R], cw[KF__AGRU_B_H]};
        int64_t lo_i, hi_i;
        kf__part(3 * H, nth, tid, &lo_i, &hi_i);
        for (int64_t i = lo_i; i < hi_i; i++) {
            memcpy(w3 + i * c.in, wx[i / H] + (i % H) * c.in, (size_t)c.in * sizeof(float));
            b3[i] = bx[i / H][i % H];
        }
    }
}

void kf__rnn_cpu_low_views(const kf__rnn_cpu_layout *lo, const struct kf_rnn_plan *p, void *ws,
                           void *const *dw, const void *const **w32, void *const **dw32) {
    void **v = kf__at(ws, lo->views);
    size_t wo = lo->wide, dwo = lo->dwide;
    for (int32_t k = 0; k < p->num_weights; k++) {
        v[k] = kf__at(ws, wo);
        v[p->num_weights + k] = dw && dw[k] ? kf__at(ws, dwo) : NULL;
        const size_t bytes = fbytes(kf__rnn_weight_elems(p, k));
        wo += bytes;
        dwo += bytes;
    }
    *w32 = (const void *const *)v;
    if (dw32) *dw32 = dw ? v + p->num_weights : NULL;
}

/* [*lo, *hi) of thread tid's share of n elements: whole 8-element vectors but the last. */
static void lp_share(int64_t n, int tid, int nth, int64_t *lo, int64_t *hi) {
    kf__part((n + 7) / 8, nth, tid, lo, hi);
    *lo *= 8;
    *hi = *hi * 8 < n ? *hi * 8 : n;
    *lo = *lo < *hi ? *lo : *hi;
}

void kf__rnn_cpu_widen(const kf__rnn_cpu_layout *lo, const struct kf_rnn_plan *p,
                       const void *const *w, const void *x, void *ws, int tid, int nth) {
    const void *const *v = kf__at(ws, lo->views);
    int64_t a, b;
    for (int32_t k = 0; k < p->num_weights; k++) {
        lp_share(kf__rnn_weight_elems(p, k), tid, nth, &a, &b);
        kf__rnn_cpu_get(lo, (float *)v[k] + a, w[k], a, b - a);
    }
    if (!x) return;
    lp_share(lo->N * p->I, tid, nth, &a, &b);
    kf__rnn_cpu_get(lo, (float *)kf__at(ws, lo->xw) + a, x, a, b - a);
}

void kf__rnn_cpu_narrow(const kf__rnn_cpu_layout *lo, const struct kf_rnn_plan *p, void *ws,
                        void *dx, void *const *dw, bool accumulate, int tid, int nth) {
    int64_t a, b;
    if (dx) {
        lp_share(lo->N * p->I, tid, nth, &a, &b);
        kf__rnn_cpu_put(lo, dx, a, (const float *)kf__at(ws, lo->dxw) + a, b - a);
    }
    void *const *g = (void *const *)kf__at(ws, lo->views) + p->num_weights;
    for (int32_t k = 0; dw && k < p->num_weights; k++) {
        if (!dw[k]) continue;
        lp_share(kf__rnn_weight_elems(p, k), tid, nth, &a, &b);
        kf__lp_store_n((uint16_t *)dw[k] + a, (const float *)g[k] + a, b - a, accumulate,
                       lo->bf16);
    }
}

/* kf__rnn_cpu_drop_row (T float, scale dr->scale) and its float64 form. */
#define KF__RNN_DROP_ROW_DEFINE(NAME, T, SCALE)                                                  \
    void NAME(T *restrict dst, const T *restrict src, int64_t n, const kf__rnn_drop *dr,         \
              uint64_t c0) {                                                                     \
        if (!src) {                                                                              \
            memset(dst, 0, (size_t)n * sizeof(T));                                               \
        } else if (!dr->on) {                                                                    \
            memcpy(dst, src, (size_t)n * sizeof(T));                                             \
        } else {                                                                                 \
            const T scale = (SCALE);                                                             \
            for (int64_t j = 0; j < n; j++)                                                      \
                dst[j] = kf__dropout_keep(dr->seed, c0 + (uint64_t)j, dr->p) ? src[j] * scale    \
                                                                             : (T)0;             \
        }                                                                                        \
    }

KF__RNN_DROP_ROW_DEFINE(kf__rnn_cpu_drop_row, float, dr->scale)
KF__RNN_DROP_ROW_DEFINE(kf__rnn_cpu_drop_row_f64, double, 1.0 / (1.0 - (double)dr->p))

/* This ISA's entries (float32, bfloat16 and float16 plans); cpu/backend.c's select gives a plan
 * the table of the ISA its context picked. */
const kf__rnn_ops kf__cpu_rnn_isa_ops = {NULL, kf__cpu_rnn_sizes, kf__cpu_rnn_forward,
                                         kf__cpu_rnn_backward};

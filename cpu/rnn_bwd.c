/* CPU backward of the stacked GRU / A-GRU (derivations: docs/ops/rnn.md).
 *
 * Layers run from the last to the first, each direction in turn:
 *  (1) the reverse recurrence, each thread owning batch slices for the whole sequence: per step a
 *      fused pointwise pass turns dh into the pre-activation gradients of every row (dG_x on the
 *      input side; GRU: dG_h on the recurrent side), then the recurrent products carry dh to
 *      the previous step (micro-kernel kf__mk on the weights packed once per call, adding into
 *      dh in its epilogue; A-GRU: pass 2 fused into the epilogue of da_d A), and the slice adds
 *      the step's rows into its own bias sums (double) and, where H is whole panels (wrec_fused),
 *      into its own parts of every weight gradient (kf__mk_st: GRU dW_hh, A-GRU dU_z, dU_r and
 *      G; dW3) and writes the step's rows of dX = dG_x W3 (the next-lower layer's d(output));
 *      elsewhere dG_x (and dG_h, q) are stored for all T*B rows;
 *  (2) after a barrier, the slices' parts added in slice order (deterministic, no atomics), or,
 *      where H is not whole panels, the weight gradients as whole-sequence GEMMs over all T*B
 *      rows split across threads by output rows, and dX split by rows.
 * Dropout masks are recomputed from the counter (core/rnn_backend.h). Nothing is allocated.
 * Files: (1)'s step kernels in cpu/rnn_bwd_step.h, (2) in cpu/rnn_bwd_grads.h; a layer, the team
 * and the entry here. */
#include "blas.h"
#include "rnn_simd.h"

#include "rnn_bwd_step.h"

/* ---- a layer -------------------------------------------------------------------------------- */

typedef struct bwd_layer {
    const kf__rnn_bwd *c;
    const kf__rnn_cpu_layout *lo;
    int32_t l;
    const float *x;   /* layer input [N, in] */
    const float *dy;  /* d(layer output) [N, D*H], NULL = zeros (or dyt's) */
    const void *dyt;  /* a low plan's last layer: the caller's dy (kf__rnn_cpu_get, per step) */
    float *dx;        /* d(layer input) [N, in], NULL = not wanted */
    kf__rnn_drop dr;  /* the forward's dropout on this layer's output */
    kf__rnn_cell cell[2];
    void *ws;
    kf__cpu_barrier *bar; /* the call's team barrier */
} bwd_layer;

static int64_t cell_index(const bwd_layer *f, int32_t d) { return (int64_t)f->l * f->lo->D + d; }

/* acc[0:m] += column sums of the n rows g[r * ld + 0:m], in double, four rows per update of the
 * accumulators (which live in L1: one load and store per update). */
static void colsum(const float *g, int64_t ld, int64_t n, int64_t m, double *acc) {
    int64_t r = 0;
    for (; r + 4 <= n; r += 4, g += 4 * ld)
        for (int64_t j = 0; j < m; j++)
            acc[j] += ((double)g[j] + (double)g[ld + j]) +
                      ((double)g[2 * ld + j] + (double)g[3 * ld + j]);
    for (; r < n; r++, g += ld)
        for (int64_t j = 0; j < m; j++) acc[j] += g[j];
}

/* The bias gradients' sums of this step's rows into the slice's part bs (double): bs[0:3H] +=
 * colsum dG_x and, for the GRU, bs[3H:4H] += colsum of dG_h's n part (its r, z parts are dG_x's),
 * while the rows are in cache: passes over all T*B rows after the recurrence read dG_x and dG_h
 * back from memory (308 MB at T=784). */
static void bias_step(const bwd_step *s, bool gru, double *bs) {
    colsum(s->dgx, s->dgx_ld, s->nb, 3 * s->H, bs);
    if (gru) colsum(s->aux + 2 * s->H, s->aux_ld, s->nb, s->H, bs + 3 * s->H);
}

/* Where the recurrence accumulates the recurrent side's weight gradients (lo->wrec_fused): the
 * destination of row block g (H rows) of the slices' parts, NULL if not wanted (GRU: dW_hh's
 * gates; A-GRU: dU_z, dU_r, and G into gmat where dW_h is wanted), and whether it honours
 * KF_GRAD_ACCUMULATE (G does not: it is a temporary). */
static float *wrec_block(const bwd_layer *f, int32_t d, int g, bool *acc) {
    const kf__rnn_bwd *c = f->c;
    const int64_t H = f->lo->H;
    if (!f->lo->wrec_fused || !c->dw) return NULL;
    void *const *dw = c->dw + cell_index(f, d) * c->plan->nw;
    *acc = c->accumulate;
    if (!f->lo->agru) return dw[KF__GRU_W_HH] ? (float *)dw[KF__GRU_W_HH] + g * H * H : NULL;
    if (g < 2) return dw[g ? KF__AGRU_U_R : KF__AGRU_U_Z];
    *acc = false;
    return dw[KF__AGRU_W_H] ? (float *)kf__at(f->ws, f->lo->gmat) : NULL;
}

/* Row block g (H rows) of dW3 = dG_x^T X of cell (l, d), NULL if not wanted: GRU weight_ih's
 * gates, A-GRU W_z, W_r, V_h. */
static float *win_block(const bwd_layer *f, int32_t d, int g) {
    const kf__rnn_bwd *c = f->c;
    if (!c->dw) return NULL;
    void *const *dw = c->dw + cell_index(f, d) * c->plan->nw;
    if (f->lo->agru) {
        static const int wx[3] = {KF__AGRU_W_Z, KF__AGRU_W_R, KF__AGRU_V_H};
        return dw[wx[g]];
    }
    return dw[KF__GRU_W_IH] ? (float *)dw[KF__GRU_W_IH] + g * f->lo->H * f->cell[d].in : NULL;
}

/* Whether the recurrence sums dW3 per step and slice (as dW3^T = X^T dG_x into wpart's win,
 * win_step): where wrec_fused and dW3 is wanted. */
static bool win_wanted(const bwd_layer *f, int32_t d) {
    if (!f->lo->wrec_fused) return false;
    for (int g = 0; g < 3; g++)
        if (win_block(f, d, g)) return true;
    return false;
}

/* Whether the recurrence accumulates any part (wrec_block). */
static bool wrec_wanted(const bwd_layer *f, int32_t d) {
    bool acc;
    for (int g = 0; g < 3; g++)
        if (wrec_block(f, d, g, &acc)) return true;
    return false;
}

/* Reverse recurrence of direction d for the batch rows of slice `sl` (slice index s). */
static void bwd_slice(const bwd_layer *f, int32_t d, const kf__rnn_slice *sl, int32_t s) {
    const kf__rnn_bwd *c = f->c;
    const kf__rnn_cpu_layout *lo = f->lo;
    const kf__rnn_cell *cw = &f->cell[d];
    const int64_t H = lo->H, T = lo->T, DH = lo->D * H, b0 = sl->b0, nb = sl->nb;
    const int64_t cidx = cell_index(f, d), aux_w = lo->agru ? H : 3 * H;
    const float *hp = (const float *)kf__cat(c->reserve, (size_t)cidx * lo->cell_bytes);
    const float *gates = (const float *)kf__cat(hp, lo->hp_bytes);
    float *dgx = (float *)kf__at(f->ws, lo->big[0]);
    float *aux = (float *)kf__at(f->ws, lo->big[1]);

    kf__rnn_cpu_get(lo, sl->st, c->dhn, (cidx * lo->B + b0) * H, nb * H);
    const bool gy_direct = f->dy && !f->dr.on; /* else masked rows of dy, or zeros, into t2 */
    /* With the per-step weight gradients, the aux rows (GRU dG_h, A-GRU q) are used within their
     * step only (products and sums), so they go to the slice's buffer, in cache, not to big[1]
     * (154 MB written at T=784) */
    float *aux_step = NULL;
    if (lo->wrec_fused)
        aux_step = (float *)kf__at(f->ws, lo->wpart + (size_t)s * lo->wpart_bytes + lo->aux_step);
    bwd_step st = {.nb = nb, .H = H, .len = c->lengths ? c->lengths + b0 : NULL,
                   .sv_ld = lo->bs * lo->ng * H, .hp_ld = lo->bs * H,
                   .dgx_ld = lo->wrec_fused ? 3 * H : lo->bs * 3 * H,
                   .aux_ld = aux_step ? aux_w : lo->bs * aux_w, .dh = sl->st,
                   .gy = sl->t2, .gy_ld = gy_direct ? lo->bs * DH : H};
    float *wp = wrec_wanted(f, d)
                    ? (float *)kf__at(f->ws, lo->wpart + (size_t)s * lo->wpart_bytes)
                    : NULL;
    if (wp) memset(wp, 0, (size_t)(3 * H * H) * sizeof(float));
    const int64_t in = cw->in;
    float *wi = win_wanted(f, d)
                    ? (float *)kf__at(f->ws, lo->wpart + (size_t)s * lo->wpart_bytes + lo->win)
                    : NULL;
    if (wi) memset(wi, 0, (size_t)(in * 3 * H) * sizeof(float));
    /* dX rows of the step, while dG_x is in cache (the GEMM after the recurrence packed all of
     * dG_x, 5.5 MB at T=28, and took 7% of a GRU's 1-thread forward+backward); dG_x itself then
     * stays in the slice's buffer */
    float *dxs = lo->wrec_fused ? f->dx : NULL;
    float *dgx_step = lo->wrec_fused ? (float *)kf__at(f->ws, lo->wpart +
                                                       (size_t)s * lo->wpart_bytes + lo->dgx_step)
                                     : NULL;
    double *bs = c->dw ? (double *)kf__at(f->ws, lo->bsum + (size_t)s * lo->bsum_bytes) : NULL;
    if (bs) memset(bs, 0, (size_t)(4 * H) * sizeof(double));
    double deps = 0.0;
    for (int64_t k = 0; k < T; k++) {
        const int64_t t = d ? k : T - 1 - k, r0 = kf__rnn_row(lo, t, b0);
        st.t = t;
        st.sv = gates + r0 * lo->ng * H;
        st.hp = hp + r0 * H;
        st.dgx = dgx_step ? dgx_step : dgx + r0 * 3 * H;
        st.aux = aux_step ? aux_step : aux + r0 * aux_w;
        if (gy_direct) st.gy = f->dy + r0 * DH + d * H;
        for (int64_t i = 0; i < nb && !gy_direct; i++) {
            const int64_t r = r0 + i * lo->bs;
            if (f->dyt)
                kf__rnn_cpu_get(lo, sl->t2 + i * H, f->dyt, r * DH + d * H, H);
            else
                kf__rnn_cpu_drop_row(sl->t2 + i * H, f->dy ? f->dy + r * DH + d * H : NULL, H,
                                     &f->dr, kf__rnn_drop_counter(lo, &f->dr, f->l, t, b0 + i, d));
        }
        if (!lo->agru) {
            gru_bwd_pointwise(&st);
            if (lo->wrec_fused)
                input_side_step(&st, cw, f->x + r0 * in, lo->bs * in, wi,
                                dxs ? dxs + r0 * in : NULL, d > 0);
            if (wp) wrec_step(&st, st.aux, st.aux_ld, 3 * H, st.hp, st.hp_ld, H, wp);
            if (bs) bias_step(&st, true, bs);
            product_into(&st, st.aux, st.aux_ld, 3 * H, cw->pk[0], st.dh, H, H, true);
        } else {
            deps += agru_bwd_pointwise1(&st, cw->eps);
            agru_bwd_dq(&st, cw->pk[1]);
            if (lo->wrec_fused)
                input_side_step(&st, cw, f->x + r0 * in, lo->bs * in, wi,
                                dxs ? dxs + r0 * in : NULL, d > 0);
            if (wp) {
                wrec_step(&st, st.dgx, st.dgx_ld, 2 * H, st.hp, st.hp_ld, H, wp);
                wrec_step(&st, st.dgx + 2 * H, st.dgx_ld, H, st.aux, st.aux_ld, H, wp + 2 * H * H);
            }
            if (bs) bias_step(&st, false, bs);
            product_into(&st, st.dgx, st.dgx_ld, 2 * H, cw->pk[0], st.dh, H, H, true);
        }
    }
    if (c->dh0) kf__rnn_cpu_put(lo, c->dh0, (cidx * lo->B + b0) * H, sl->st, nb * H);
    if (lo->agru) ((double *)kf__at(f->ws, lo->epsacc))[s] = deps;
}

#include "rnn_bwd_grads.h"

typedef struct bwd_call {
    const kf__rnn_bwd *c;    /* the call as float32 sees it (a low plan's: kf__cpu_rnn_backward) */
    const kf__rnn_bwd *user; /* the caller's */
    const kf__rnn_cpu_layout *lo;
    kf__cpu_barrier bar;
} bwd_call;

static void bwd_team(void *arg, int tid, int nth) {
    bwd_call *call = arg;
    const kf__rnn_bwd *c = call->c, *u = call->user;
    const kf__rnn_cpu_layout *lo = call->lo;
    const struct kf_rnn_plan *p = c->plan;
    if (lo->low) {
        kf__rnn_cpu_widen(lo, p, u->w, u->x, c->ws, tid, nth);
        kf__cpu_barrier_wait(&call->bar, nth);
    }
    kf__rnn_cpu_pack(lo, p, c->w, c->ws, true, tid, nth);
    kf__cpu_barrier_wait(&call->bar, nth);
    for (int32_t l = p->L - 1; l >= 0; l--) {
        bwd_layer f = {.c = c, .lo = lo, .l = l, .ws = c->ws, .bar = &call->bar};
        f.x = l ? (const float *)kf__cat(c->reserve, lo->out0 + (size_t)(l - 1) * lo->out_bytes)
                : c->x;
        if (l < p->L - 1)
            f.dy = (const float *)kf__at(c->ws, lo->seq[l % 2]);
        else if (lo->low)
            f.dyt = c->dy;
        else
            f.dy = c->dy;
        f.dx = l ? (float *)kf__at(c->ws, lo->seq[(l - 1) % 2]) : c->dx;
        f.dr = (kf__rnn_drop){.on = p->dropout > 0.0f && l < p->L - 1, .p = p->dropout,
                              .scale = 1.0f / (1.0f - p->dropout), .seed = c->seed,
                              .base = c->offset};
        for (int32_t d = 0; d < lo->D; d++) {
            f.cell[d] = kf__rnn_cpu_cell(lo, p, c->w, c->ws, l, d);
            for (int32_t s = tid; s < lo->ns; s += nth) {
                kf__rnn_slice sl = kf__rnn_cpu_slice(lo, c->ws, s);
                bwd_slice(&f, d, &sl, s);
            }
            kf__cpu_barrier_wait(&call->bar, nth);
            bwd_cell_grads(&f, d, tid, nth);
            /* the next cell reads this one's dX and weights; after the last, the team's end
             * (a low plan's: kf__rnn_cpu_narrow, which reads every cell's) */
            if (l > 0 || d + 1 < lo->D || lo->low) kf__cpu_barrier_wait(&call->bar, nth);
        }
    }
    if (lo->low) kf__rnn_cpu_narrow(lo, p, c->ws, u->dx, u->dw, u->accumulate, tid, nth);
}

kf_status kf__cpu_rnn_backward(kf_context *ctx, const kf__rnn_bwd *c) {
    kf__rnn_cpu_layout lo;
    kf__rnn_cpu_layout_init(&lo, c->plan, c->T, c->B, true);
    (void)ctx; /* the thread count comes from the plan's context, as the sizes did */
    /* A low plan runs the float32 kernels on the workspace's float32 weights, x and dX, and
     * float32 weight gradients it rounds at the end (kf__rnn_cpu_narrow: once, accumulating or
     * not); dy, dhn, dh0 stay the caller's, converted per slice and step */
    kf__rnn_bwd f32 = *c;
    if (lo.low) {
        kf__rnn_cpu_low_views(&lo, c->plan, c->ws, c->dw, &f32.w, &f32.dw);
        f32.x = kf__at(c->ws, lo.xw);
        f32.dx = c->dx ? kf__at(c->ws, lo.dxw) : NULL;
        f32.accumulate = false;
    }
    bwd_call call = {.c = &f32, .user = c, .lo = &lo, .bar = {0}};
    kf__cpu_team(lo.ns, bwd_team, &call);
    return KF_OK;
}

/* CPU forward of the stacked GRU / A-GRU (layout and shared helpers: cpu/rnn_cpu.h,
 * cpu/rnn_layout.c). Math: docs/ops/rnn.md.
 *
 * Per layer and direction, each thread owns slices of batch rows for the whole sequence (no
 * barrier between steps, none before the recurrence). Per step of a slice: the input projection
 * of its rows, G_x = X W3^T + b3 (OpenBLAS, into an L2-sized buffer), then the recurrent product
 * h W_hh^T by the register-blocked micro-kernel (kf__mk) on the weights packed once per call,
 * with the gate math in its epilogue (A-GRU: z, r and q = r*h in the epilogue of h [U_z; U_r]^T,
 * then the state update in that of q A^T), which also stores the new state into y and the
 * reserve. Nothing is allocated. */
#include "blas.h"
#include "rnn_simd.h"

/* ---- one step of a slice --------------------------------------------------------------------
 * Row i of the slice is sample b0 + i; its rows of G_x and of the saved gates sit i*gx_ld and
 * i*sv_ld floats after row 0 (sv NULL in inference). The micro-kernel's tile is mr rows by 8
 * columns of each of its nv vectors; the epilogues below finish those columns of those rows.
 * The new state leaves the epilogue's registers for every place that wants it, so no step copies
 * rows afterwards: the slice's state, the layer output y (0 for invalid rows; NULL when dropout
 * masks it, then the caller writes it) and the reserve's hp row of the next step (NULL in
 * inference and at the last step). */
typedef struct fwd_step {
    int64_t nb, H, t;
    const int32_t *len; /* lengths + b0, or NULL */
    const float *gx;    /* X W3^T + b3 */
    int64_t gx_ld;
    float *sv;
    int64_t sv_ld;
    float *y, *hpn;
    int64_t y_ld, hpn_ld;
} fwd_step;

static bool step_valid(const fwd_step *s, int64_t i) { return !s->len || s->t < s->len[i]; }

/* Columns j.. of row i of the new state, h' (valid rows; y gets h') or the unchanged h (rows past
 * their length; y gets 0), into y and the next hp. */
KF__VINLINE void put_state(const fwd_step *s, int64_t i, int64_t j, kf__vf h, bool valid, int nc) {
    if (s->y) kf__vf_store_n(s->y + i * s->y_ld + j, valid ? h : kf__vf_set1(0.0f), nc);
    if (s->hpn) kf__vf_store_n(s->hpn + i * s->hpn_ld + j, h, nc);
}

/* GRU: [a_r, a_z, hn] = h W_hh^T + b_hh on KF__MR_G3 rows x KF__VW columns of each gate, then
 * r, z = sigmoid(gx + a); n = tanh(gx_n + r hn); h' = n + z (h - n) (gx = x W_ih^T + b_ih).
 * h is read whole by the products, so h' goes to a second buffer (invalid rows copy h).
 * The gate math runs stage by stage over the tile's rows (all KF__MR_G3 of them: the rows past
 * mr repeat row mr-1, as the micro-kernel's do, and are not stored): each stage is one chain of
 * ~20 dependent operations per row, and listing the rows' chains together lets the core overlap
 * them. Row by row, one row's chain r -> n -> h' (~200 instructions) filled the reorder window,
 * and the epilogue took ~35% of a forward. Each element's operations are the same either way. */
KF__MK_CLONES static void gru_step(const fwd_step *s, const float *pk,
                                   const float *restrict bhh, const float *h, float *hout) {
    const int64_t H = s->H;
    for (int64_t p = 0; p < kf__num_panels(3, 3, H); p++) {
        const int64_t j = KF__VW * p;
        const int nc = kf__cols_left(j, H);
        const kf__vf br = kf__vf_load_n(bhh + j, nc), bz = kf__vf_load_n(bhh + H + j, nc);
        const kf__vf bhn = kf__vf_load_n(bhh + 2 * H + j, nc);
        for (int64_t i0 = 0; i0 < s->nb; i0 += KF__MR_G3) {
            const int64_t mr = s->nb - i0 < KF__MR_G3 ? s->nb - i0 : KF__MR_G3;
            kf__vf acc[KF__MR_MAX * KF__NV_MAX];
            kf__mk(KF__MR_G3, 3, H, h + i0 * H, H, mr, pk + p * H * 3 * KF__VW, acc);
            kf__vf r[KF__MR_G3], z[KF__MR_G3], hn[KF__MR_G3], n[KF__MR_G3];
            const float *gx[KF__MR_G3];
            for (int i = 0; i < KF__MR_G3; i++) {
                gx[i] = s->gx + (i0 + (i < mr ? i : mr - 1)) * s->gx_ld + j;
                r[i] = kf__vf_load_n(gx[i], nc) + acc[i * 3] + br;
                z[i] = kf__vf_load_n(gx[i] + H, nc) + acc[i * 3 + 1] + bz;
                hn[i] = acc[i * 3 + 2] + bhn;
            }
            for (int i = 0; i < KF__MR_G3; i++) r[i] = kf__vf_sigmoid(r[i]);
            for (int i = 0; i < KF__MR_G3; i++) z[i] = kf__vf_sigmoid(z[i]);
            for (int i = 0; i < KF__MR_G3; i++)
                n[i] = kf__vf_tanh(kf__vf_fma(r[i], hn[i], kf__vf_load_n(gx[i] + 2 * H, nc)));
            for (int64_t i = i0; i < i0 + mr; i++) {
                const int64_t t = i - i0;
                const kf__vf hp = kf__vf_load_n(h + i * H + j, nc);
                if (!step_valid(s, i)) {
                    kf__vf_store_n(hout + i * H + j, hp, nc);
                    put_state(s, i, j, hp, false, nc);
                    continue;
                }
                const kf__vf hnew = kf__vf_fma(z[t], hp - n[t], n[t]);
                kf__vf_store_n(hout + i * H + j, hnew, nc);
                put_state(s, i, j, hnew, true, nc);
                if (s->sv) {
                    float *sv = s->sv + i * s->sv_ld + j;
                    kf__vf_store_n(sv, r[t], nc);
                    kf__vf_store_n(sv + H, z[t], nc);
                    kf__vf_store_n(sv + 2 * H, n[t], nc);
                    kf__vf_store_n(sv + 3 * H, hn[t], nc);
                }
            }
        }
    }
}

/* A-GRU, first product: [a_z, a_r] = h [U_z; U_r]^T on KF__MR_G2 rows x KF__VW columns of each
 * gate, then z, r = sigmoid(gx + a) into zb; q = r h. Every row (the second product reads all).
 * Stage by stage over the tile's rows, as gru_step. */
KF__MK_CLONES static void agru_step1(const fwd_step *s, const float *pk, const float *h,
                                     float *zb, float *q) {
    const int64_t H = s->H;
    for (int64_t p = 0; p < kf__num_panels(2, 2, H); p++) {
        const int64_t j = KF__VW * p;
        const int nc = kf__cols_left(j, H);
        for (int64_t i0 = 0; i0 < s->nb; i0 += KF__MR_G2) {
            const int64_t mr = s->nb - i0 < KF__MR_G2 ? s->nb - i0 : KF__MR_G2;
            kf__vf acc[KF__MR_MAX * KF__NV_MAX];
            kf__mk(KF__MR_G2, 2, H, h + i0 * H, H, mr, pk + p * H * 2 * KF__VW, acc);
            kf__vf z[KF__MR_G2], r[KF__MR_G2];
            for (int t = 0; t < KF__MR_G2; t++) {
                const float *gx = s->gx + (i0 + (t < mr ? t : mr - 1)) * s->gx_ld + j;
                z[t] = kf__vf_load_n(gx, nc) + acc[t * 2];
                r[t] = kf__vf_load_n(gx + H, nc) + acc[t * 2 + 1];
            }
            for (int64_t i = i0; i < i0 + mr && s->sv; i++) { /* the pre-activations */
                kf__vf_store_n(s->sv + i * s->sv_ld + j, z[i - i0], nc);
                kf__vf_store_n(s->sv + i * s->sv_ld + H + j, r[i - i0], nc);
            }
            for (int t = 0; t < KF__MR_G2; t++) z[t] = kf__vf_sigmoid(z[t]);
            for (int t = 0; t < KF__MR_G2; t++) r[t] = kf__vf_sigmoid(r[t]);
            for (int64_t i = i0; i < i0 + mr; i++) {
                const int64_t t = i - i0;
                kf__vf_store_n(zb + i * H + j, z[t], nc);
                kf__vf_store_n(q + i * H + j, r[t] * kf__vf_load_n(h + i * H + j, nc), nc);
            }
        }
    }
}

/* A-GRU, second product: a_d = q A^T on KF__MR_P rows x KF__NV_P vectors, then
 * d = tanh(gx_d + a_d); h += eps z d in place (this product reads q, not h). Stage by stage over
 * the tile's rows, as gru_step. */
KF__MK_CLONES static void agru_step2(const fwd_step *s, const float *pk, float eps, const float *q,
                       const float *zb, float *h) {
    const int64_t H = s->H;
    for (int64_t p = 0; p < kf__num_panels(1, KF__NV_P, H); p++) {
        for (int64_t i0 = 0; i0 < s->nb; i0 += KF__MR_P) {
            const int64_t mr = s->nb - i0 < KF__MR_P ? s->nb - i0 : KF__MR_P;
            kf__vf acc[KF__MR_MAX * KF__NV_MAX];
            kf__mk(KF__MR_P, KF__NV_P, H, q + i0 * H, H, mr, pk + p * H * KF__NV_P * KF__VW,
                   acc);
            for (int v = 0; v < KF__NV_P; v++) {
                const int64_t j = kf__panel_col(1, KF__NV_P, p, v);
                const int nc = kf__cols_left(j, H);
                if (!nc) break;
                kf__vf d[KF__MR_P];
                for (int t = 0; t < KF__MR_P; t++) {
                    const float *gx = s->gx + (i0 + (t < mr ? t : mr - 1)) * s->gx_ld + 2 * H + j;
                    d[t] = kf__vf_load_n(gx, nc) + acc[t * KF__NV_P + v];
                }
                for (int64_t i = i0; i < i0 + mr && s->sv; i++) /* the pre-activation */
                    if (step_valid(s, i))
                        kf__vf_store_n(s->sv + i * s->sv_ld + 2 * H + j, d[i - i0], nc);
                for (int t = 0; t < KF__MR_P; t++) d[t] = kf__vf_tanh(d[t]);
                for (int64_t i = i0; i < i0 + mr; i++) {
                    const int64_t t = i - i0;
                    float *hr = h + i * H + j;
                    if (!step_valid(s, i)) {
                        put_state(s, i, j, kf__vf_load_n(hr, nc), false, nc);
                        continue;
                    }
                    const kf__vf ez = kf__vf_set1(eps) * kf__vf_load_n(zb + i * H + j, nc);
                    const kf__vf hnew = kf__vf_fma(ez, d[t], kf__vf_load_n(hr, nc));
                    kf__vf_store_n(hr, hnew, nc);
                    put_state(s, i, j, hnew, true, nc);
                }
            }
        }
    }
}

/* ---- a layer -------------------------------------------------------------------------------- */

typedef struct fwd_layer {
    const kf__rnn_fwd *c;
    const kf__rnn_cpu_layout *lo;
    int32_t l;
    const float *x;  /* layer input [N, in]; NULL where a low plan's layer 0 reads xt */
    const void *xt;  /* that x (kf__rnn_cpu_get, a step's rows into the slice's xs) */
    float *out;      /* layer output [N, D*H]; NULL where a low plan's last layer writes y */
    void *y;         /* that y (kf__rnn_cpu_put, per step) */
    kf__rnn_drop dr;
    kf__rnn_cell cell[2];
    void *ws;
} fwd_layer;

/* gxs[nb, 3H] = X W3^T + b3 for the slice's rows of one step, their x rows r0, r0 + bs, ...
 * (a low plan's layer 0: widened into xs first):
 * filled with b3 and accumulated into (beta = 1), so OpenBLAS runs no zeroing pass. Per step
 * rather than one GEMM over all T*B rows, so G_x is written and read while in L2 (96 KB per
 * 64-row slice at H = 128) instead of streaming [T*B, 3H] out to memory and back, and the
 * slices need no barrier after it. */
static void project_step(const fwd_layer *f, int32_t d, int64_t r0, int64_t nb, float *xs,
                         float *gxs) {
    const kf__rnn_cell *cw = &f->cell[d];
    const int64_t G = 3 * f->lo->H, in = cw->in, bs = f->lo->bs;
    for (int64_t i = 0; i < nb; i++) memcpy(gxs + i * G, cw->b3, (size_t)G * sizeof(float));
    const float *x = f->x ? f->x + r0 * in : xs;
    for (int64_t i = 0; i < nb && !f->x; i++)
        kf__rnn_cpu_get(f->lo, xs + i * in, f->xt, (r0 + i * bs) * in, in);
    kf__sgemm(false, true, nb, G, in, 1.0f, x, f->x ? bs * in : in, cw->w3, in, 1.0f, gxs, G);
}

/* Runs direction d of layer l over the whole sequence for the batch rows of slice `sl`. The
 * state lives in sl->st (GRU: ping-pong with sl->t1, since the product reads all of h). */
static void fwd_slice(const fwd_layer *f, int32_t d, const kf__rnn_slice *sl) {
    const kf__rnn_fwd *c = f->c;
    const kf__rnn_cpu_layout *lo = f->lo;
    const kf__rnn_cell *cw = &f->cell[d];
    const int64_t H = lo->H, T = lo->T, DH = lo->D * H, b0 = sl->b0, nb = sl->nb;
    const int64_t cidx = (int64_t)f->l * lo->D + d;
    float *hp = c->reserve ? (float *)kf__at(c->reserve, (size_t)cidx * lo->cell_bytes) : NULL;
    float *gates = hp ? (float *)kf__at(hp, lo->hp_bytes) : NULL;
    float *gxs = (float *)kf__at(f->ws, lo->big[d]) + b0 * 3 * H; /* rows of no other slice */
    float *h = sl->st, *h2 = sl->t1;

    kf__rnn_cpu_get(lo, h, c->h0, (cidx * lo->B + b0) * H, nb * H);
    fwd_step s = {.nb = nb, .H = H, .len = c->lengths ? c->lengths + b0 : NULL,
                  .gx = gxs, .gx_ld = 3 * H, .sv_ld = lo->bs * lo->ng * H,
                  .y_ld = lo->bs * DH, .hpn_ld = lo->bs * H};
    if (hp) /* hp of the first step; the steps' epilogues write the others */
        for (int64_t i = 0; i < nb; i++)
            memcpy(hp + (kf__rnn_row(lo, d ? T - 1 : 0, b0) + i * lo->bs) * H, h + i * H,
                   (size_t)H * sizeof(float));
    for (int64_t k = 0; k < T; k++) {
        const int64_t t = d ? T - 1 - k : k, r0 = kf__rnn_row(lo, t, b0);
        s.t = t;
        project_step(f, d, r0, nb, sl->xs, gxs);
        s.y = f->dr.on || !f->out ? NULL : f->out + r0 * DH + d * H;
        if (hp) {
            s.sv = gates + r0 * lo->ng * H;
            s.hpn = k + 1 < T ? hp + kf__rnn_row(lo, d ? t - 1 : t + 1, b0) * H : NULL;
        }
        if (!lo->agru) {
            gru_step(&s, cw->pk[0], cw->brec, h, h2);
            float *tmp = h;
            h = h2, h2 = tmp;
        } else {
            agru_step1(&s, cw->pk[0], h, sl->t1, sl->t2);
            agru_step2(&s, cw->pk[1], cw->eps, sl->t2, sl->t1, h);
        }
        for (int64_t i = 0; i < nb && !s.y; i++) {
            const int64_t o = (r0 + i * lo->bs) * DH + d * H;
            const float *hi = step_valid(&s, i) ? h + i * H : NULL;
            if (f->out)
                kf__rnn_cpu_drop_row(f->out + o, hi, H, &f->dr,
                                     kf__rnn_drop_counter(lo, &f->dr, f->l, t, b0 + i, d));
            else
                kf__rnn_cpu_put(lo, f->y, o, hi, H);
        }
    }
    if (c->hn) kf__rnn_cpu_put(lo, c->hn, (cidx * lo->B + b0) * H, h, nb * H);
}

/* No barrier after a layer: a thread runs the same slices in every layer, and a slice's rows of
 * layer l+1 read only the same batch rows of layer l's output, which that thread wrote (both
 * directions, dropout included); every other buffer is per slice or per cell. */
static void fwd_layer_run(const fwd_layer *f, int tid, int nth) {
    const kf__rnn_cpu_layout *lo = f->lo;
    for (int32_t s = tid; s < lo->ns; s += nth) {
        kf__rnn_slice sl = kf__rnn_cpu_slice(lo, f->ws, s);
        for (int32_t d = 0; d < lo->D; d++) fwd_slice(f, d, &sl);
    }
}

typedef struct fwd_call {
    const kf__rnn_fwd *c;
    const kf__rnn_cpu_layout *lo;
    const void *const *w; /* the weights as float32: c->w, or a low plan's copies */
    kf__cpu_barrier bar;
} fwd_call;

/* One barrier per call: after the packing, which every slice reads (a low plan's: one more,
 * after the widening, which the packing reads). */
static void fwd_team(void *arg, int tid, int nth) {
    fwd_call *call = arg;
    const kf__rnn_fwd *c = call->c;
    const kf__rnn_cpu_layout *lo = call->lo;
    const struct kf_rnn_plan *p = c->plan;
    const bool drop = c->training && p->dropout > 0.0f;
    if (lo->low) {
        kf__rnn_cpu_widen(lo, p, c->w, NULL, c->ws, tid, nth);
        kf__cpu_barrier_wait(&call->bar, nth);
    }
    kf__rnn_cpu_pack(lo, p, call->w, c->ws, false, tid, nth);
    kf__cpu_barrier_wait(&call->bar, nth);
    const float *x = lo->low ? NULL : c->x;
    for (int32_t l = 0; l < p->L; l++) {
        fwd_layer f = {.c = c, .lo = lo, .l = l, .x = x, .xt = x ? NULL : c->x, .ws = c->ws};
        if (l == p->L - 1 && lo->low)
            f.y = c->y;
        else if (l == p->L - 1)
            f.out = c->y;
        else if (c->training)
            f.out = (float *)kf__at(c->reserve, lo->out0 + (size_t)l * lo->out_bytes);
        else
            f.out = (float *)kf__at(c->ws, lo->seq[l % 2]);
        f.dr = (kf__rnn_drop){.on = drop && l < p->L - 1, .p = p->dropout,
                              .scale = 1.0f / (1.0f - p->dropout), .seed = c->seed,
                              .base = c->offset};
        for (int32_t d = 0; d < lo->D; d++)
            f.cell[d] = kf__rnn_cpu_cell(lo, p, call->w, c->ws, l, d);
        fwd_layer_run(&f, tid, nth);
        x = f.out;
    }
}

kf_status kf__cpu_rnn_forward(kf_context *ctx, const kf__rnn_fwd *c) {
    kf__rnn_cpu_layout lo;
    kf__rnn_cpu_layout_init(&lo, c->plan, c->T, c->B, c->training);
    (void)ctx; /* the thread count comes from the plan's context, as the sizes did */
    fwd_call call = {.c = c, .lo = &lo, .w = c->w, .bar = {0}};
    if (lo.low) kf__rnn_cpu_low_views(&lo, c->plan, c->ws, NULL, &call.w, NULL);
    kf__cpu_team(lo.ns, fwd_team, &call);
    return KF_OK;
}

/* CPU forward of the stacked GRU / A-GRU, plus the layout and helpers backward shares
 * (cpu/rnn_cpu.h). Math: docs/ops/rnn.md.
 *
 * Per layer and direction, each thread owns slices of batch rows for the whole sequence (no
 * barrier between steps, none before the recurrence). Per step of a slice: the input projection
 * of its rows, G_x = X W3^T + b3 (OpenBLAS, into an L2-sized buffer), then the recurrent product
 * h W_hh^T by the register-blocked micro-kernel (kf__mk) on the weights packed once per call,
 * with the gate math in its epilogue (A-GRU: z, r and q = r*h in the epilogue of h [U_z; U_r]^T,
 * then the state update in that of q A^T), which also stores the new state into y and the
 * reserve. Nothing is allocated. */
#include "blas.h"
#include "rnn_cpu.h"

#include <omp.h>

static size_t fbytes(int64_t n) { return kf__align_up((size_t)n * sizeof(float)); }

static size_t agru_pack_bytes(int64_t in, int64_t H) { return fbytes(3 * H * in) + fbytes(3 * H); }

/* Floats of the panels of a product with K rows (kf__mk). */
static int64_t panel_floats(int ng, int nv, int64_t K, int64_t hc) {
    return kf__num_panels(ng, nv, hc) * K * nv * 8;
}

void kf__rnn_cpu_layout_init(kf__rnn_cpu_layout *lo, const struct kf_rnn_plan *p, int64_t T,
                             int64_t B, bool training) {
    memset(lo, 0, sizeof *lo);
    int64_t H = p->H, D = p->D, N = T * B;
    int64_t nt = p->ctx->num_threads > 0 ? p->ctx->num_threads : 1;
    lo->T = T, lo->B = B, lo->N = N, lo->H = H, lo->D = D;
    lo->ts = p->batch_first ? 1 : B;
    lo->bs = p->batch_first ? T : 1;
    lo->ns = (int32_t)(nt < B ? nt : B);
    lo->nbmax = (B + lo->ns - 1) / lo->ns;
    lo->agru = p->cell == KF_RNN_AGRU;
    lo->ng = lo->agru ? 3 : 4;

    size_t off = 0;
    if (lo->agru) {
        lo->pack_first = agru_pack_bytes(p->I, H);
        lo->pack_stride = agru_pack_bytes(D * H, H);
        off = lo->pack_first + (size_t)(p->L - 1) * lo->pack_stride;
    }
    /* pk[0]: forward gated (3 gates, GRU; 2, A-GRU) or backward plain with K = 3H / 2H;
     * pk[1] (A-GRU): A or A^T, [H, H] either way */
    const int ngr = lo->agru ? 2 : 3;
    lo->rec = off;
    lo->rec_pk1 = fbytes(panel_floats(ngr, ngr, H, H) > panel_floats(1, 2, ngr * H, H)
                             ? panel_floats(ngr, ngr, H, H)
                             : panel_floats(1, 2, ngr * H, H));
    lo->rec_bytes = lo->rec_pk1 + (lo->agru ? fbytes(panel_floats(1, 2, H, H)) : 0);
    off += (size_t)(p->L * D) * lo->rec_bytes;
    for (int i = 0; i < 2; i++) {
        lo->big[i] = off;
        off += fbytes(N * 3 * H);
    }
    for (int i = 0; i < 2; i++) {
        lo->seq[i] = off;
        off += p->L > 1 ? fbytes(N * D * H) : 0;
    }
    lo->slice0 = off;
    lo->slice_bytes = 3 * fbytes(lo->nbmax * H);
    off += (size_t)lo->ns * lo->slice_bytes;
    lo->gmat = off;
    off += lo->agru ? fbytes(H * H) : 0;
    lo->epsacc = off;
    off += lo->agru ? kf__align_up((size_t)lo->ns * sizeof(double)) : 0;
    lo->ws_bytes = off;

    lo->hp_bytes = fbytes(N * H);
    lo->cell_bytes = lo->hp_bytes + fbytes(N * lo->ng * H);
    lo->out0 = (size_t)(p->L * D) * lo->cell_bytes;
    lo->out_bytes = fbytes(N * D * H);
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
                              const float *const *w, void *ws, int32_t l, int32_t d) {
    const float *const *cw = w + (size_t)(l * p->D + d) * (size_t)p->nw;
    int64_t H = p->H, in = kf__rnn_layer_input(p, l);
    kf__rnn_cell c = {.in = in, .eps = 1.0f};
    const char *rec = (const char *)ws + lo->rec + (size_t)(l * p->D + d) * lo->rec_bytes;
    c.pk[0] = (const float *)rec;
    c.pk[1] = (const float *)(rec + lo->rec_pk1);
    if (!lo->agru) {
        c.w3 = cw[KF__GRU_W_IH];
        c.b3 = cw[KF__GRU_B_IH];
        c.brec = cw[KF__GRU_B_HH];
        return c;
    }
    const char *base = (const char *)ws + pack_offset(lo, l);
    c.w3 = (const float *)base;
    c.b3 = (const float *)(base + fbytes(3 * H * in));
    c.eps = *cw[KF__AGRU_EPS];
    return c;
}

/* A recurrent product's B [K, N = ng*hc] as a view of the caller's weights: M is the matrix of
 * up to 3 row blocks of [H, H] (blk[g] = rows gH..gH+H), B = M^T (trans) or M; with skew,
 * M = S - S^T - gamma I for S = blk[0] (A-GRU's A, built while packing). */
typedef struct pack_spec {
    const float *blk[3];
    bool trans, skew;
    int ng, nv;
    int64_t K;
} pack_spec;

static float spec_at(const pack_spec *ps, int64_t H, float gamma, int64_t k, int64_t n) {
    const int64_t r = ps->trans ? n : k, c = ps->trans ? k : n;
    const float *m = ps->blk[r / H];
    float v = m[(r % H) * H + c];
    if (ps->skew) v -= m[c * H + r] + (r == c ? gamma : 0.0f);
    return v;
}

/* Panel p of `ps` into dst (layout: kf__mk in rnn_cpu.h; columns past H are zeros). */
static void pack_panel(const pack_spec *ps, int64_t H, float gamma, int64_t p, float *dst) {
    const int w = ps->nv * 8;
    dst += p * ps->K * w;
    for (int v = 0; v < ps->nv; v++) {
        const int64_t j0 = kf__panel_col(ps->ng, ps->nv, p, v), n0 = (ps->ng > 1 ? v : 0) * H;
        for (int cc = 0; cc < 8; cc++)
            for (int64_t k = 0; k < ps->K; k++)
                dst[k * w + v * 8 + cc] =
                    j0 + cc < H ? spec_at(ps, H, gamma, k, n0 + j0 + cc) : 0.0f;
    }
}

/* The recurrent products of cell (l, d), pk[0] and pk[1] (notation of rnn_bwd.c / rnn_fwd.c):
 * forward GRU  h W_hh^T (gates r, z, n side by side); A-GRU h [U_z; U_r]^T (z, r), q A^T;
 * backward GRU dG_h W_hh (K = 3H); A-GRU [da_z, da_r] [U_z; U_r] (K = 2H), da_d A. */
static int cell_specs(const kf__rnn_cpu_layout *lo, const float *const *cw, bool bwd,
                      pack_spec *ps) {
    const int64_t H = lo->H;
    if (!lo->agru) {
        const float *whh = cw[KF__GRU_W_HH];
        ps[0] = (pack_spec){{whh, whh + H * H, whh + 2 * H * H}, !bwd, false, bwd ? 1 : 3,
                            bwd ? 2 : 3, bwd ? 3 * H : H};
        return 1;
    }
    ps[0] = (pack_spec){{cw[KF__AGRU_U_Z], cw[KF__AGRU_U_R]}, !bwd, false, bwd ? 1 : 2, 2,
                        bwd ? 2 * H : H};
    ps[1] = (pack_spec){{cw[KF__AGRU_W_H]}, !bwd, true, 1, 2, H};
    return 2;
}

/* Work items are whole panels of every cell's products, and rows of the A-GRU W3 / b3 copy. */
void kf__rnn_cpu_pack(const kf__rnn_cpu_layout *lo, const struct kf_rnn_plan *p,
                      const float *const *w, void *ws, bool bwd, int tid, int nth) {
    const int64_t H = p->H;
    for (int32_t c = 0; c < p->L * p->D; c++) {
        kf__rnn_cell cell = kf__rnn_cpu_cell(lo, p, w, ws, c / p->D, c % p->D);
        pack_spec ps[2];
        const int n = cell_specs(lo, w + (size_t)c * (size_t)p->nw, bwd, ps);
        for (int i = 0; i < n; i++) {
            int64_t p0, p1;
            kf__part(kf__num_panels(ps[i].ng, ps[i].nv, H), nth, tid, &p0, &p1);
            for (int64_t pi = p0; pi < p1; pi++)
                pack_panel(&ps[i], H, p->gamma, pi, (float *)cell.pk[i]);
        }
    }
    if (!lo->agru) return;
    for (int32_t l = 0; l < p->L; l++) {
        const float *const *cw = w + (size_t)l * (size_t)p->nw;
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

void kf__rnn_cpu_drop_row(float *restrict dst, const float *restrict src, int64_t n,
                          const kf__rnn_drop *dr, uint64_t c0) {
    if (!src) {
        memset(dst, 0, (size_t)n * sizeof(float));
    } else if (!dr->on) {
        memcpy(dst, src, (size_t)n * sizeof(float));
    } else {
        for (int64_t j = 0; j < n; j++)
            dst[j] = kf__dropout_keep(dr->seed, c0 + (uint64_t)j, dr->p) ? src[j] * dr->scale : 0.0f;
    }
}

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
KF__VINLINE void put_state(const fwd_step *s, int64_t i, int64_t j, kf__v8 h, bool valid, int nc) {
    if (s->y) kf__v8_store_n(s->y + i * s->y_ld + j, valid ? h : kf__v8_set1(0.0f), nc);
    if (s->hpn) kf__v8_store_n(s->hpn + i * s->hpn_ld + j, h, nc);
}

/* GRU: [a_r, a_z, hn] = h W_hh^T + b_hh on 4 rows x 8 columns of each gate, then
 * r, z = sigmoid(gx + a); n = tanh(gx_n + r hn); h' = n + z (h - n) (gx = x W_ih^T + b_ih).
 * h is read whole by the products, so h' goes to a second buffer (invalid rows copy h). */
KF__MK_CLONES static void gru_step(const fwd_step *s, const float *pk,
                                   const float *restrict bhh, const float *h, float *hout) {
    const int64_t H = s->H;
    for (int64_t p = 0; p < kf__num_panels(3, 3, H); p++) {
        const int64_t j = 8 * p;
        const int nc = kf__cols_left(j, H);
        const kf__v8 br = kf__v8_load_n(bhh + j, nc), bz = kf__v8_load_n(bhh + H + j, nc);
        const kf__v8 bhn = kf__v8_load_n(bhh + 2 * H + j, nc);
        for (int64_t i0 = 0; i0 < s->nb; i0 += 4) {
            const int64_t mr = s->nb - i0 < 4 ? s->nb - i0 : 4;
            kf__v8 acc[KF__MR_MAX * KF__NV_MAX];
            kf__mk(4, 3, H, h + i0 * H, H, mr, pk + p * H * 24, acc);
            for (int64_t i = i0; i < i0 + mr; i++) {
                const kf__v8 hp = kf__v8_load_n(h + i * H + j, nc);
                if (!step_valid(s, i)) {
                    kf__v8_store_n(hout + i * H + j, hp, nc);
                    put_state(s, i, j, hp, false, nc);
                    continue;
                }
                const float *gx = s->gx + i * s->gx_ld + j;
                const kf__v8 *a = acc + (i - i0) * 3;
                const kf__v8 r = kf__v8_sigmoid(kf__v8_load_n(gx, nc) + a[0] + br);
                const kf__v8 z = kf__v8_sigmoid(kf__v8_load_n(gx + H, nc) + a[1] + bz);
                const kf__v8 hn = a[2] + bhn;
                const kf__v8 n = kf__v8_tanh(kf__v8_fma(r, hn, kf__v8_load_n(gx + 2 * H, nc)));
                const kf__v8 hnew = kf__v8_fma(z, hp - n, n);
                kf__v8_store_n(hout + i * H + j, hnew, nc);
                put_state(s, i, j, hnew, true, nc);
                if (s->sv) {
                    float *sv = s->sv + i * s->sv_ld + j;
                    kf__v8_store_n(sv, r, nc);
                    kf__v8_store_n(sv + H, z, nc);
                    kf__v8_store_n(sv + 2 * H, n, nc);
                    kf__v8_store_n(sv + 3 * H, hn, nc);
                }
            }
        }
    }
}

/* A-GRU, first product: [a_z, a_r] = h [U_z; U_r]^T on 6 rows x 8 columns of each gate, then
 * z, r = sigmoid(gx + a) into zb; q = r h. Every row (the second product reads all). */
KF__MK_CLONES static void agru_step1(const fwd_step *s, const float *pk, const float *h,
                                     float *zb, float *q) {
    const int64_t H = s->H;
    for (int64_t p = 0; p < kf__num_panels(2, 2, H); p++) {
        const int64_t j = 8 * p;
        const int nc = kf__cols_left(j, H);
        for (int64_t i0 = 0; i0 < s->nb; i0 += 6) {
            const int64_t mr = s->nb - i0 < 6 ? s->nb - i0 : 6;
            kf__v8 acc[KF__MR_MAX * KF__NV_MAX];
            kf__mk(6, 2, H, h + i0 * H, H, mr, pk + p * H * 16, acc);
            for (int64_t i = i0; i < i0 + mr; i++) {
                const float *gx = s->gx + i * s->gx_ld + j;
                const kf__v8 *a = acc + (i - i0) * 2;
                const kf__v8 z = kf__v8_sigmoid(kf__v8_load_n(gx, nc) + a[0]);
                const kf__v8 r = kf__v8_sigmoid(kf__v8_load_n(gx + H, nc) + a[1]);
                kf__v8_store_n(zb + i * H + j, z, nc);
                kf__v8_store_n(q + i * H + j, r * kf__v8_load_n(h + i * H + j, nc), nc);
                if (s->sv) {
                    kf__v8_store_n(s->sv + i * s->sv_ld + j, z, nc);
                    kf__v8_store_n(s->sv + i * s->sv_ld + H + j, r, nc);
                }
            }
        }
    }
}

/* A-GRU, second product: a_d = q A^T on 6 rows x 16 columns, then d = tanh(gx_d + a_d);
 * h += eps z d in place (this product reads q, not h). */
KF__MK_CLONES static void agru_step2(const fwd_step *s, const float *pk, float eps, const float *q,
                       const float *zb, float *h) {
    const int64_t H = s->H;
    for (int64_t p = 0; p < kf__num_panels(1, 2, H); p++) {
        for (int64_t i0 = 0; i0 < s->nb; i0 += 6) {
            const int64_t mr = s->nb - i0 < 6 ? s->nb - i0 : 6;
            kf__v8 acc[KF__MR_MAX * KF__NV_MAX];
            kf__mk(6, 2, H, q + i0 * H, H, mr, pk + p * H * 16, acc);
            for (int v = 0; v < 2; v++) {
                const int64_t j = kf__panel_col(1, 2, p, v);
                const int nc = kf__cols_left(j, H);
                if (!nc) break;
                for (int64_t i = i0; i < i0 + mr; i++) {
                    float *hr = h + i * H + j;
                    if (!step_valid(s, i)) {
                        put_state(s, i, j, kf__v8_load_n(hr, nc), false, nc);
                        continue;
                    }
                    const float *gx = s->gx + i * s->gx_ld + 2 * H + j;
                    const kf__v8 a = acc[(i - i0) * 2 + v];
                    const kf__v8 d = kf__v8_tanh(kf__v8_load_n(gx, nc) + a);
                    const kf__v8 ez = kf__v8_set1(eps) * kf__v8_load_n(zb + i * H + j, nc);
                    const kf__v8 hnew = kf__v8_fma(ez, d, kf__v8_load_n(hr, nc));
                    kf__v8_store_n(hr, hnew, nc);
                    put_state(s, i, j, hnew, true, nc);
                    if (s->sv) kf__v8_store_n(s->sv + i * s->sv_ld + 2 * H + j, d, nc);
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
    const float *x;  /* layer input [N, in] */
    float *out;      /* layer output [N, D*H] */
    kf__rnn_drop dr;
    kf__rnn_cell cell[2];
    void *ws;
} fwd_layer;

/* gxs[nb, 3H] = X W3^T + b3 for the slice's rows of one step, their x rows r0, r0 + bs, ...:
 * filled with b3 and accumulated into (beta = 1), so OpenBLAS runs no zeroing pass. Per step
 * rather than one GEMM over all T*B rows, so G_x is written and read while in L2 (96 KB per
 * 64-row slice at H = 128) instead of streaming [T*B, 3H] out to memory and back, and the
 * slices need no barrier after it. */
static void project_step(const fwd_layer *f, int32_t d, int64_t r0, int64_t nb, float *gxs) {
    const kf__rnn_cell *cw = &f->cell[d];
    const int64_t G = 3 * f->lo->H;
    for (int64_t i = 0; i < nb; i++) memcpy(gxs + i * G, cw->b3, (size_t)G * sizeof(float));
    kf__sgemm(false, true, nb, G, cw->in, 1.0f, f->x + r0 * cw->in, f->lo->bs * cw->in, cw->w3,
              cw->in, 1.0f, gxs, G);
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

    if (c->h0)
        memcpy(h, c->h0 + (cidx * lo->B + b0) * H, (size_t)(nb * H) * sizeof(float));
    else
        memset(h, 0, (size_t)(nb * H) * sizeof(float));
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
        project_step(f, d, r0, nb, gxs);
        s.y = f->dr.on ? NULL : f->out + r0 * DH + d * H;
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
            float *o = f->out + (r0 + i * lo->bs) * DH + d * H;
            kf__rnn_cpu_drop_row(o, step_valid(&s, i) ? h + i * H : NULL, H, &f->dr,
                                 kf__rnn_drop_counter(lo, &f->dr, f->l, t, b0 + i, d));
        }
    }
    if (c->hn) memcpy(c->hn + (cidx * lo->B + b0) * H, h, (size_t)(nb * H) * sizeof(float));
}

static void fwd_layer_run(const fwd_layer *f, int tid, int nth) {
    const kf__rnn_cpu_layout *lo = f->lo;
    for (int32_t s = tid; s < lo->ns; s += nth) {
        kf__rnn_slice sl = kf__rnn_cpu_slice(lo, f->ws, s);
        for (int32_t d = 0; d < lo->D; d++) fwd_slice(f, d, &sl);
    }
#pragma omp barrier
}

typedef struct fwd_call {
    const kf__rnn_fwd *c;
    const kf__rnn_cpu_layout *lo;
} fwd_call;

static void fwd_team(void *arg, int tid, int nth) {
    const kf__rnn_fwd *c = ((const fwd_call *)arg)->c;
    const kf__rnn_cpu_layout *lo = ((const fwd_call *)arg)->lo;
    const struct kf_rnn_plan *p = c->plan;
    const bool drop = c->training && p->dropout > 0.0f;
    kf__rnn_cpu_pack(lo, p, c->w, c->ws, false, tid, nth);
#pragma omp barrier
    const float *x = c->x;
    for (int32_t l = 0; l < p->L; l++) {
        fwd_layer f = {.c = c, .lo = lo, .l = l, .x = x, .ws = c->ws};
        if (l == p->L - 1)
            f.out = c->y;
        else if (c->training)
            f.out = (float *)kf__at(c->reserve, lo->out0 + (size_t)l * lo->out_bytes);
        else
            f.out = (float *)kf__at(c->ws, lo->seq[l % 2]);
        f.dr = (kf__rnn_drop){.on = drop && l < p->L - 1, .p = p->dropout,
                              .scale = 1.0f / (1.0f - p->dropout), .seed = c->seed,
                              .base = c->offset};
        for (int32_t d = 0; d < lo->D; d++) f.cell[d] = kf__rnn_cpu_cell(lo, p, c->w, c->ws, l, d);
        fwd_layer_run(&f, tid, nth);
        x = f.out;
    }
}

kf_status kf__cpu_rnn_forward(kf_context *ctx, const kf__rnn_fwd *c) {
    kf__rnn_cpu_layout lo;
    kf__rnn_cpu_layout_init(&lo, c->plan, c->T, c->B, c->training);
    (void)ctx; /* the thread count comes from the plan's context, as the sizes did */
    fwd_call call = {.c = c, .lo = &lo};
    kf__cpu_team(lo.ns, fwd_team, &call);
    return KF_OK;
}

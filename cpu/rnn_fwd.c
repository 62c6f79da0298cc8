/* CPU forward of the stacked GRU / A-GRU, plus the layout and helpers backward shares
 * (cpu/rnn_cpu.h). Math: docs/ops/rnn.md.
 *
 * Per layer: (1) the input projection of all T*B rows, G_x = X W3^T, one GEMM per direction
 * split across threads by rows; (2) the recurrence, each thread owning slices of batch rows for
 * the whole sequence: per step one GEMM h Wrec^T over the slice, then a fused pointwise pass
 * (A-GRU: a second GEMM (r*h) A^T between two pointwise passes). Nothing is allocated. */
#include "blas.h"
#include "rnn_cpu.h"

#include <omp.h>

static size_t fbytes(int64_t n) { return kf__align_up((size_t)n * sizeof(float)); }

static size_t agru_pack_bytes(int64_t in, int64_t H) {
    return fbytes(3 * H * in) + fbytes(3 * H) + fbytes(2 * H * H) + fbytes(H * H);
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
    for (int i = 0; i < 2; i++) {
        lo->big[i] = off;
        off += fbytes(N * 3 * H);
    }
    for (int i = 0; i < 2; i++) {
        lo->seq[i] = off;
        off += p->L > 1 ? fbytes(N * D * H) : 0;
    }
    lo->slice0 = off;
    lo->slice_bytes = 4 * fbytes(lo->nbmax * H) + fbytes(lo->nbmax * 3 * H) + fbytes(4 * H);
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
    if (!lo->agru) {
        c.w3 = cw[KF__GRU_W_IH];
        c.b3 = cw[KF__GRU_B_IH];
        c.wrec = cw[KF__GRU_W_HH];
        c.brec = cw[KF__GRU_B_HH];
        return c;
    }
    const char *base = (const char *)ws + pack_offset(lo, l);
    c.w3 = (const float *)base;
    c.b3 = (const float *)(base + fbytes(3 * H * in));
    c.wrec = (const float *)(base + fbytes(3 * H * in) + fbytes(3 * H));
    c.a = (const float *)(base + fbytes(3 * H * in) + fbytes(3 * H) + fbytes(2 * H * H));
    c.eps = *cw[KF__AGRU_EPS];
    return c;
}

/* Row i of the layer-l A-GRU pack (rows 0..3H of W3, then 0..2H of U2, then 0..H of A) is one
 * work item, so threads split the packing evenly. */
void kf__rnn_cpu_pack(const kf__rnn_cpu_layout *lo, const struct kf_rnn_plan *p,
                      const float *const *w, void *ws, int tid, int nth) {
    if (!lo->agru) return;
    int64_t H = p->H;
    for (int32_t l = 0; l < p->L; l++) {
        const float *const *cw = w + (size_t)l * (size_t)p->nw;
        kf__rnn_cell c = kf__rnn_cpu_cell(lo, p, w, ws, l, 0);
        float *w3 = (float *)c.w3, *b3 = (float *)c.b3, *u2 = (float *)c.wrec, *a = (float *)c.a;
        const float *wx[3] = {cw[KF__AGRU_W_Z], cw[KF__AGRU_W_R], cw[KF__AGRU_V_H]};
        const float *bx[3] = {cw[KF__AGRU_B_Z], cw[KF__AGRU_B_R], cw[KF__AGRU_B_H]};
        const float *wu[2] = {cw[KF__AGRU_U_Z], cw[KF__AGRU_U_R]};
        const float *wh = cw[KF__AGRU_W_H];
        int64_t lo_i, hi_i;
        kf__part(6 * H, nth, tid, &lo_i, &hi_i);
        for (int64_t i = lo_i; i < hi_i; i++) {
            if (i < 3 * H) {
                memcpy(w3 + i * c.in, wx[i / H] + (i % H) * c.in, (size_t)c.in * sizeof(float));
                b3[i] = bx[i / H][i % H];
            } else if (i < 5 * H) {
                int64_t j = i - 3 * H;
                memcpy(u2 + j * H, wu[j / H] + (j % H) * H, (size_t)H * sizeof(float));
            } else {
                int64_t r = i - 5 * H;
                for (int64_t k = 0; k < H; k++)
                    a[r * H + k] = wh[r * H + k] - wh[k * H + r] - (k == r ? p->gamma : 0.0f);
            }
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

/* ---- one step of a slice -------------------------------------------------------------------- */

/* What the pointwise passes of one step see. Row i of the slice is sample b0 + i; its rows of
 * G_x and of the saved gates sit i*gx_ld and i*sv_ld floats after row 0 (sv_ld = 0 in inference:
 * gates go to one scratch row). */
typedef struct fwd_step {
    int64_t nb, H, t;
    const int32_t *len; /* lengths + b0, or NULL */
    const float *gx;    /* X W3^T, without b3 */
    int64_t gx_ld;
    const float *b3;
    float *st;          /* [nb, H] state, updated in place on valid rows */
    float *gh;          /* [nb, 3H or 2H] recurrent pre-activations (A-GRU: z, after pass 1) */
    float *sv;
    int64_t sv_ld;
    float *q, *ad;      /* A-GRU: [nb, H] r*h and its product with A^T */
} fwd_step;

static bool step_valid(const fwd_step *s, int64_t i) { return !s->len || s->t < s->len[i]; }

/* GRU: r, z = sigmoid(gx + b_i + gh + b_h); n = tanh(gx_n + b_in + r*(gh_n + b_hn));
 * h = (1-z) n + z h. */
KF__VEC_CLONES static void gru_pointwise(const fwd_step *s, const float *restrict bhh) {
    const int64_t H = s->H;
    const float *restrict b3 = s->b3;
    for (int64_t i = 0; i < s->nb; i++) {
        if (!step_valid(s, i)) continue;
        const float *restrict gx = s->gx + i * s->gx_ld;
        const float *restrict gh = s->gh + i * 3 * H;
        float *restrict h = s->st + i * H;
        float *restrict sv = s->sv + i * s->sv_ld;
#pragma omp simd
        for (int64_t k = 0; k < H; k++) {
            float r = kf__sigmoid(gx[k] + b3[k] + gh[k] + bhh[k]);
            float z = kf__sigmoid(gx[H + k] + b3[H + k] + gh[H + k] + bhh[H + k]);
            float hn = gh[2 * H + k] + bhh[2 * H + k];
            float n = kf__tanh(KF__FMA(r, hn, gx[2 * H + k] + b3[2 * H + k]));
            h[k] = (1.0f - z) * n + z * h[k];
            sv[k] = r;
            sv[H + k] = z;
            sv[2 * H + k] = n;
            sv[3 * H + k] = hn;
        }
    }
}

/* A-GRU pass 1: z, r = sigmoid(gx + b + gh) (z kept in gh[0:H]); q = r*h. Runs on every row (the
 * GEMM after it does anyway); pass 2 skips the invalid ones. */
KF__VEC_CLONES static void agru_pointwise1(const fwd_step *s) {
    const int64_t H = s->H;
    const float *restrict b3 = s->b3;
    for (int64_t i = 0; i < s->nb; i++) {
        const float *restrict gx = s->gx + i * s->gx_ld;
        float *restrict gh = s->gh + i * 2 * H;
        const float *restrict h = s->st + i * H;
        float *restrict q = s->q + i * H;
        float *restrict sv = s->sv + i * s->sv_ld;
#pragma omp simd
        for (int64_t k = 0; k < H; k++) {
            float z = kf__sigmoid(gx[k] + b3[k] + gh[k]);
            float r = kf__sigmoid(gx[H + k] + b3[H + k] + gh[H + k]);
            gh[k] = z;
            q[k] = r * h[k];
            sv[k] = z;
            sv[H + k] = r;
        }
    }
}

/* A-GRU pass 2: d = tanh(gx_d + b_h + (q A^T)); h += eps * z * d. */
KF__VEC_CLONES static void agru_pointwise2(const fwd_step *s, float eps) {
    const int64_t H = s->H;
    const float *restrict b3 = s->b3;
    for (int64_t i = 0; i < s->nb; i++) {
        if (!step_valid(s, i)) continue;
        const float *restrict gx = s->gx + i * s->gx_ld;
        const float *restrict z = s->gh + i * 2 * H;
        const float *restrict ad = s->ad + i * H;
        float *restrict h = s->st + i * H;
        float *restrict sv = s->sv + i * s->sv_ld;
#pragma omp simd
        for (int64_t k = 0; k < H; k++) {
            float d = kf__tanh(gx[2 * H + k] + b3[2 * H + k] + ad[k]);
            h[k] = KF__FMA(eps * z[k], d, h[k]);
            sv[2 * H + k] = d;
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

/* G_x rows [r0, r1) = X W3^T for direction d (the pointwise passes add b3). */
static void project_rows(const fwd_layer *f, int32_t d, int64_t r0, int64_t r1) {
    const kf__rnn_cell *cw = &f->cell[d];
    int64_t G = 3 * f->lo->H;
    float *gx = (float *)kf__at(f->ws, f->lo->big[d]);
    kf__sgemm(false, true, r1 - r0, G, cw->in, 1.0f, f->x + r0 * cw->in, cw->in, cw->w3, cw->in,
              0.0f, gx + r0 * G, G);
}

/* Runs direction d of layer l over the whole sequence for the batch rows of slice `sl`. */
static void fwd_slice(const fwd_layer *f, int32_t d, const kf__rnn_slice *sl) {
    const kf__rnn_fwd *c = f->c;
    const kf__rnn_cpu_layout *lo = f->lo;
    const kf__rnn_cell *cw = &f->cell[d];
    const int64_t H = lo->H, T = lo->T, DH = lo->D * H, b0 = sl->b0, nb = sl->nb;
    const int64_t cidx = (int64_t)f->l * lo->D + d;
    const int64_t rec = lo->agru ? 2 * H : 3 * H;
    float *hp = c->reserve ? (float *)kf__at(c->reserve, (size_t)cidx * lo->cell_bytes) : NULL;
    float *gates = hp ? (float *)kf__at(hp, lo->hp_bytes) : NULL;
    const float *gx = (const float *)kf__at(f->ws, lo->big[d]);

    if (c->h0)
        memcpy(sl->st, c->h0 + (cidx * lo->B + b0) * H, (size_t)(nb * H) * sizeof(float));
    else
        memset(sl->st, 0, (size_t)(nb * H) * sizeof(float));
    fwd_step s = {.nb = nb, .H = H, .len = c->lengths ? c->lengths + b0 : NULL,
                  .gx_ld = lo->bs * 3 * H, .b3 = cw->b3, .st = sl->st, .gh = sl->t3, .q = sl->t1,
                  .ad = sl->t2, .sv = sl->row, .sv_ld = 0};
    for (int64_t k = 0; k < T; k++) {
        const int64_t t = d ? T - 1 - k : k, r0 = kf__rnn_row(lo, t, b0);
        s.t = t;
        s.gx = gx + r0 * 3 * H;
        if (hp) {
            for (int64_t i = 0; i < nb; i++)
                memcpy(hp + (r0 + i * lo->bs) * H, sl->st + i * H, (size_t)H * sizeof(float));
            s.sv = gates + r0 * lo->ng * H;
            s.sv_ld = lo->bs * lo->ng * H;
        }
        kf__sgemm(false, true, nb, rec, H, 1.0f, sl->st, H, cw->wrec, H, 0.0f, sl->t3, rec);
        if (!lo->agru) {
            gru_pointwise(&s, cw->brec);
        } else {
            agru_pointwise1(&s);
            kf__sgemm(false, true, nb, H, H, 1.0f, sl->t1, H, cw->a, H, 0.0f, sl->t2, H);
            agru_pointwise2(&s, cw->eps);
        }
        for (int64_t i = 0; i < nb; i++) {
            float *o = f->out + (r0 + i * lo->bs) * DH + d * H;
            bool valid = !s.len || t < s.len[i];
            kf__rnn_cpu_drop_row(o, valid ? sl->st + i * H : NULL, H, &f->dr,
                                 kf__rnn_drop_counter(lo, &f->dr, f->l, t, b0 + i, d));
        }
    }
    if (c->hn)
        memcpy(c->hn + (cidx * lo->B + b0) * H, sl->st, (size_t)(nb * H) * sizeof(float));
}

static void fwd_layer_run(const fwd_layer *f, int tid, int nth) {
    const kf__rnn_cpu_layout *lo = f->lo;
    int64_t r0, r1;
    kf__part(lo->N, nth, tid, &r0, &r1);
    for (int32_t d = 0; d < lo->D; d++) project_rows(f, d, r0, r1);
#pragma omp barrier
    for (int32_t s = tid; s < lo->ns; s += nth) {
        kf__rnn_slice sl = kf__rnn_cpu_slice(lo, f->ws, s);
        for (int32_t d = 0; d < lo->D; d++) fwd_slice(f, d, &sl);
    }
#pragma omp barrier
}

void kf__rnn_cpu_team(int32_t ns, void (*fn)(void *arg, int tid, int nth), void *arg) {
    if (ns <= 1) {
        fn(arg, 0, 1);
        return;
    }
#pragma omp parallel num_threads(ns)
    fn(arg, omp_get_thread_num(), omp_get_num_threads());
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
    kf__rnn_cpu_pack(lo, p, c->w, c->ws, tid, nth);
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
    kf__rnn_cpu_team(lo.ns, fwd_team, &call);
    return KF_OK;
}

/* CPU GRU / A-GRU in float64 (a plan with dtype KF_DTYPE_F64): the contract, the reserve, the
 * dropout counters and the lengths of the float32 path (core/rnn_backend.h, cpu/rnn_cpu.h, whose
 * layout it shares), computed plainly: every product by kf__dgemm on the caller's weights in
 * place, the gate math in loops the compiler vectorises. Math and the backward's derivation:
 * docs/ops/rnn.md (notation at the top of cpu/rnn_bwd.c).
 *
 * Both cells are seen as three gate blocks on the input side (GRU r, z, n: rows gH.. of
 * weight_ih; A-GRU z, r, d: W_z, W_r, V_h), so the input projection, dX and the input-side weight
 * gradients are one code. A-GRU's A = W_h - W_h^T - gamma I is formed once per call (rec[c]).
 *
 * Forward, per layer and direction: G_x = X W3^T + b3 for all T*B rows into big[0] (rows split
 * across the team), a barrier, then each thread runs its batch slices through the sequence: per
 * step the recurrent product of the slice's rows into their rows of big[1], then the gates.
 * Backward, per layer (last first) and direction: the reverse recurrence over the slices
 * (dG_x into big[0]; GRU dG_h, A-GRU q = r*h into big[1]), a barrier, then the weight
 * gradients, d eps and dX as whole-sequence GEMMs split by output rows (no atomics). */
#include "blas.h"
#include "rnn_cpu.h"

static double *dat(void *base, size_t off) { return (double *)kf__at(base, off); }

static double sigm(double a) { return 1.0 / (1.0 + exp(-a)); }

/* The A-GRU backward's gates and complements from the reserve's pre-activations (rnn_cpu.h):
 * sigmoid(a) and *c = 1 - sigmoid(a) = sigmoid(-a), neither taken from the other; tanh(a) and
 * *dc = 1 - tanh(a)^2 = 1 / cosh(a)^2 (0 where cosh overflows). */
static double sigm_c(double a, double *c) {
    *c = sigm(-a);
    return sigm(a);
}
static double tanh_c(double a, double *dc) {
    const double ch = cosh(a);
    *dc = 1.0 / (ch * ch);
    return tanh(a);
}

/* A-GRU weight indices of the input-side gate blocks z, r, d and their biases. */
static const int agru_wx[3] = {KF__AGRU_W_Z, KF__AGRU_W_R, KF__AGRU_V_H};
static const int agru_bx[3] = {KF__AGRU_B_Z, KF__AGRU_B_R, KF__AGRU_B_H};

/* The weights of cell (l, d). wx[g], bx[g]: input side of gate block g, [H, in] and [H]. */
typedef struct cell64 {
    const double *wx[3], *bx[3];
    const double *whh, *bhh;   /* GRU: W_hh [3H, H] (r, z, n), b_hh [3H] */
    const double *uz, *ur, *A; /* A-GRU: U_z, U_r [H, H]; A [H, H] in the workspace */
    double eps;
    int64_t in, idx;           /* I_l; l*D + d */
} cell64;

static cell64 cell_of(const kf__rnn_cpu_layout *lo, const struct kf_rnn_plan *p,
                      const void *const *w, void *ws, int32_t l, int32_t d) {
    const int64_t H = lo->H, idx = (int64_t)l * p->D + d;
    const void *const *cw = w + idx * p->nw;
    cell64 c = {.in = kf__rnn_layer_input(p, l), .idx = idx, .eps = 1.0};
    if (!lo->agru) {
        const double *wih = cw[KF__GRU_W_IH], *bih = cw[KF__GRU_B_IH];
        for (int g = 0; g < 3; g++) c.wx[g] = wih + g * H * c.in, c.bx[g] = bih + g * H;
        c.whh = cw[KF__GRU_W_HH];
        c.bhh = cw[KF__GRU_B_HH];
        return c;
    }
    for (int g = 0; g < 3; g++) c.wx[g] = cw[agru_wx[g]], c.bx[g] = cw[agru_bx[g]];
    c.uz = cw[KF__AGRU_U_Z];
    c.ur = cw[KF__AGRU_U_R];
    c.A = dat(ws, lo->rec + (size_t)idx * lo->rec_bytes);
    c.eps = *(const double *)cw[KF__AGRU_EPS];
    return c;
}

/* A-GRU: A = W_h - W_h^T - gamma I of every cell into rec[c], rows split across the team. */
static void form_A(const kf__rnn_cpu_layout *lo, const struct kf_rnn_plan *p,
                   const void *const *w, void *ws, int tid, int nth) {
    if (!lo->agru) return;
    const int64_t H = lo->H;
    for (int32_t l = 0; l < p->L; l++) {
        const double *wh = w[(size_t)l * (size_t)p->nw + KF__AGRU_W_H];
        double *A = (double *)cell_of(lo, p, w, ws, l, 0).A;
        int64_t i0, i1;
        kf__part(H, nth, tid, &i0, &i1);
        for (int64_t i = i0; i < i1; i++)
            for (int64_t j = 0; j < H; j++)
                A[i * H + j] = wh[i * H + j] - wh[j * H + i] - (i == j ? (double)p->gamma : 0.0);
    }
}

static bool valid_at(const int32_t *lengths, int64_t T, int64_t t, int64_t b) {
    return t < kf__rnn_len(lengths, T, b);
}

/* ---- forward --------------------------------------------------------------------------------- */

typedef struct fwd64 {
    const kf__rnn_fwd *c;
    const kf__rnn_cpu_layout *lo;
    int32_t l, d;
    cell64 cw;
    const double *x; /* layer input [N, in] */
    double *out;     /* layer output [N, D*H] */
    kf__rnn_drop dr;
} fwd64;

/* G_x rows [r0, r1) = x W3^T + b3, gate block g in columns gH.. of big[0]. */
static void project(const fwd64 *f, int tid, int nth) {
    const int64_t H = f->lo->H, in = f->cw.in;
    double *gx = dat(f->c->ws, f->lo->big[0]);
    int64_t r0, r1;
    kf__part(f->lo->N, nth, tid, &r0, &r1);
    for (int g = 0; g < 3; g++) {
        for (int64_t r = r0; r < r1; r++)
            memcpy(gx + r * 3 * H + g * H, f->cw.bx[g], (size_t)H * sizeof(double));
        kf__dgemm(false, true, r1 - r0, H, in, 1.0, f->x + r0 * in, in, f->cw.wx[g], in, 1.0,
                  gx + r0 * 3 * H + g * H, 3 * H);
    }
}

/* GRU gates of one valid row: a = h W_hh^T (r, z, n blocks), gx = x W_ih^T + b_ih;
 * r, z = sigmoid(gx + a + b_hh), hn = a_n + b_hn, n = tanh(gx_n + r hn), h' = n + z (h - n), in
 * place; sv (NULL in inference) gets r, z, n, hn. */
static void gru_row(int64_t H, const double *restrict gx, const double *restrict a,
                    const double *restrict bhh, double *restrict h, double *restrict sv) {
    for (int64_t j = 0; j < H; j++) {
        const double r = sigm(gx[j] + a[j] + bhh[j]);
        const double z = sigm(gx[H + j] + a[H + j] + bhh[H + j]);
        const double hn = a[2 * H + j] + bhh[2 * H + j];
        const double n = tanh(gx[2 * H + j] + r * hn);
        h[j] = n + z * (h[j] - n);
        if (sv) sv[j] = r, sv[H + j] = z, sv[2 * H + j] = n, sv[3 * H + j] = hn;
    }
}

/* Direction f->d of layer f->l over the whole sequence for the batch rows of slice s. */
static void fwd_slice(const fwd64 *f, int32_t s) {
    const kf__rnn_fwd *c = f->c;
    const kf__rnn_cpu_layout *lo = f->lo;
    const cell64 *cw = &f->cw;
    const int64_t H = lo->H, T = lo->T, DH = lo->D * H;
    int64_t b0, nb;
    kf__rnn_slice_rows(lo, s, &b0, &nb);
    double *h = kf__rnn_slice_buf(lo, c->ws, s, 0), *q = kf__rnn_slice_buf(lo, c->ws, s, 1);
    double *a = dat(c->ws, lo->big[1]) + b0 * 3 * H; /* [nb, 3H]: rows of no other slice */
    const double *gx = dat(c->ws, lo->big[0]);
    double *hp = c->reserve ? dat(c->reserve, (size_t)cw->idx * lo->cell_bytes) : NULL;
    double *gates = hp ? (double *)kf__at(hp, lo->hp_bytes) : NULL;
    const int64_t ng = lo->ng;

    if (c->h0)
        memcpy(h, (const double *)c->h0 + (cw->idx * lo->B + b0) * H,
               (size_t)(nb * H) * sizeof(double));
    else
        memset(h, 0, (size_t)(nb * H) * sizeof(double));
    for (int64_t k = 0; k < T; k++) {
        const int64_t t = f->d ? T - 1 - k : k, r0 = kf__rnn_row(lo, t, b0);
        if (!lo->agru) {
            kf__dgemm(false, true, nb, 3 * H, H, 1.0, h, H, cw->whh, H, 0.0, a, 3 * H);
        } else {
            kf__dgemm(false, true, nb, H, H, 1.0, h, H, cw->uz, H, 0.0, a, 3 * H);
            kf__dgemm(false, true, nb, H, H, 1.0, h, H, cw->ur, H, 0.0, a + H, 3 * H);
        }
        for (int64_t i = 0; i < nb; i++) {
            const int64_t r = r0 + i * lo->bs;
            double *hi = h + i * H, *ai = a + i * 3 * H;
            /* every row's state (backward's dW_hh reads them all, with zero weight past len) */
            if (hp) memcpy(hp + r * H, hi, (size_t)H * sizeof(double));
            if (!valid_at(c->lengths, T, t, b0 + i)) {
                memset(q + i * H, 0, (size_t)H * sizeof(double)); /* its A product is unused */
                continue;
            }
            double *sv = gates ? gates + r * ng * H : NULL;
            if (!lo->agru) {
                gru_row(H, gx + r * 3 * H, ai, cw->bhh, hi, sv);
                continue;
            }
            /* A-GRU, before q A^T: z, r = sigmoid(gx + h U^T) (into a), q = r h; sv gets the
             * pre-activations */
            for (int64_t j = 0; j < H; j++) {
                const double az = gx[r * 3 * H + j] + ai[j], ar = gx[r * 3 * H + H + j] + ai[H + j];
                if (sv) sv[j] = az, sv[H + j] = ar;
                ai[j] = sigm(az);
                ai[H + j] = sigm(ar);
                q[i * H + j] = ai[H + j] * hi[j];
            }
        }
        if (lo->agru) {
            /* a_d = q A^T; d = tanh(gx_d + a_d); h' = h + eps z d; sv gets the pre-activation */
            kf__dgemm(false, true, nb, H, H, 1.0, q, H, cw->A, H, 0.0, a + 2 * H, 3 * H);
            for (int64_t i = 0; i < nb; i++) {
                if (!valid_at(c->lengths, T, t, b0 + i)) continue;
                const int64_t r = r0 + i * lo->bs;
                double *hi = h + i * H, *ai = a + i * 3 * H;
                for (int64_t j = 0; j < H; j++) {
                    const double ad = gx[r * 3 * H + 2 * H + j] + ai[2 * H + j];
                    hi[j] += cw->eps * ai[j] * tanh(ad);
                    if (gates) gates[r * ng * H + 2 * H + j] = ad;
                }
            }
        }
        for (int64_t i = 0; i < nb; i++) {
            const int64_t r = r0 + i * lo->bs;
            kf__rnn_cpu_drop_row_f64(f->out + r * DH + f->d * H,
                                     valid_at(c->lengths, T, t, b0 + i) ? h + i * H : NULL, H,
                                     &f->dr, kf__rnn_drop_counter(lo, &f->dr, f->l, t, b0 + i,
                                                                  f->d));
        }
    }
    if (c->hn)
        memcpy((double *)c->hn + (cw->idx * lo->B + b0) * H, h, (size_t)(nb * H) * sizeof(double));
}

typedef struct call64 {
    const kf__rnn_fwd *fc;
    const kf__rnn_bwd *bc;
    kf__rnn_cpu_layout lo;
} call64;

static kf__rnn_drop drop_of(const struct kf_rnn_plan *p, bool on, uint64_t seed, uint64_t base) {
    return (kf__rnn_drop){.on = on, .p = p->dropout, .scale = 1.0f / (1.0f - p->dropout),
                          .seed = seed, .base = base};
}

static void fwd_team(void *arg, int tid, int nth) {
    const call64 *call = arg;
    const kf__rnn_fwd *c = call->fc;
    const kf__rnn_cpu_layout *lo = &call->lo;
    const struct kf_rnn_plan *p = c->plan;
    form_A(lo, p, c->w, c->ws, tid, nth);
#pragma omp barrier
    const double *x = c->x;
    for (int32_t l = 0; l < p->L; l++) {
        fwd64 f = {.c = c, .lo = lo, .l = l, .x = x};
        if (l == p->L - 1)
            f.out = c->y;
        else if (c->training)
            f.out = dat(c->reserve, lo->out0 + (size_t)l * lo->out_bytes);
        else
            f.out = dat(c->ws, lo->seq[l % 2]);
        f.dr = drop_of(p, c->training && p->dropout > 0.0f && l < p->L - 1, c->seed, c->offset);
        for (f.d = 0; f.d < lo->D; f.d++) {
            f.cw = cell_of(lo, p, c->w, c->ws, l, f.d);
            project(&f, tid, nth);
#pragma omp barrier
            for (int32_t s = tid; s < lo->ns; s += nth) fwd_slice(&f, s);
#pragma omp barrier
        }
        x = f.out;
    }
}

kf_status kf__cpu_rnn_forward_f64(kf_context *ctx, const kf__rnn_fwd *c) {
    (void)ctx; /* the thread count comes from the plan's context, as the sizes did */
    call64 call = {.fc = c};
    kf__rnn_cpu_layout_init(&call.lo, c->plan, c->T, c->B, c->training);
    kf__cpu_team(call.lo.ns, fwd_team, &call);
    return KF_OK;
}

/* ---- backward -------------------------------------------------------------------------------- */

typedef struct bwd64 {
    const kf__rnn_bwd *c;
    const kf__rnn_cpu_layout *lo;
    int32_t l, d;
    cell64 cw;
    const double *x;  /* layer input [N, in] */
    const double *dy; /* d(layer output) [N, D*H], NULL = zeros */
    double *dx;       /* d(layer input) [N, in], NULL = not wanted */
    kf__rnn_drop dr;  /* the forward's dropout on this layer's output */
} bwd64;

/* GRU, one valid row (g = dL/dh' of the step): da_n = g (1-z)(1-n^2), da_r = da_n hn r(1-r),
 * da_z = g (hp - n) z(1-z); dG_x = [da_r, da_z, da_n], dG_h = [da_r, da_z, da_n r]; dh = g z (the
 * recurrent product dG_h W_hh is added after). */
static void gru_bwd_row(int64_t H, const double *restrict sv, const double *restrict hp,
                        const double *restrict gy, double *restrict dgx, double *restrict dgh,
                        double *restrict dh) {
    for (int64_t j = 0; j < H; j++) {
        const double r = sv[j], z = sv[H + j], n = sv[2 * H + j], hn = sv[3 * H + j];
        const double g = dh[j] + gy[j];
        const double dan = g * (1.0 - z) * (1.0 - n * n);
        const double dar = dan * hn * r * (1.0 - r);
        const double daz = g * (hp[j] - n) * z * (1.0 - z);
        dgx[j] = dgh[j] = dar;
        dgx[H + j] = dgh[H + j] = daz;
        dgx[2 * H + j] = dan;
        dgh[2 * H + j] = dan * r;
        dh[j] = g * z;
    }
}

/* A-GRU, one valid row before dq = da_d A: da_z = g eps d z(1-z), da_d = g eps z (1-d^2),
 * q = r hp, dh = g (z, r, d and the complements from sv's pre-activations); returns the row's
 * d eps = sum g z d. */
static double agru_bwd_row(int64_t H, double eps, const double *restrict sv,
                           const double *restrict hp, const double *restrict gy,
                           double *restrict dgx, double *restrict q, double *restrict dh) {
    double deps = 0.0;
    for (int64_t j = 0; j < H; j++) {
        double zc, dc;
        const double z = sigm_c(sv[j], &zc), dd = tanh_c(sv[2 * H + j], &dc);
        const double g = dh[j] + gy[j];
        dgx[j] = g * eps * dd * z * zc;
        dgx[2 * H + j] = g * eps * z * dc;
        q[j] = sigm(sv[H + j]) * hp[j];
        dh[j] = g;
        deps += g * z * dd;
    }
    return deps;
}

/* Reverse recurrence of direction f->d for the batch rows of slice s. */
static void bwd_slice(const bwd64 *f, int32_t s) {
    const kf__rnn_bwd *c = f->c;
    const kf__rnn_cpu_layout *lo = f->lo;
    const cell64 *cw = &f->cw;
    const int64_t H = lo->H, T = lo->T, DH = lo->D * H, aux_w = lo->agru ? H : 3 * H;
    int64_t b0, nb;
    kf__rnn_slice_rows(lo, s, &b0, &nb);
    double *dh = kf__rnn_slice_buf(lo, c->ws, s, 0), *dq = kf__rnn_slice_buf(lo, c->ws, s, 1);
    double *gyb = kf__rnn_slice_buf(lo, c->ws, s, 2);
    const double *hp = (const double *)kf__cat(c->reserve, (size_t)cw->idx * lo->cell_bytes);
    const double *gates = (const double *)kf__cat(hp, lo->hp_bytes);
    double *dgx = dat(c->ws, lo->big[0]), *aux = dat(c->ws, lo->big[1]);
    const int64_t ng = lo->ng, ld3 = lo->bs * 3 * H;

    if (c->dhn)
        memcpy(dh, (const double *)c->dhn + (cw->idx * lo->B + b0) * H,
               (size_t)(nb * H) * sizeof(double));
    else
        memset(dh, 0, (size_t)(nb * H) * sizeof(double));
    const bool gy_direct = f->dy && !f->dr.on; /* else masked rows of dy, or zeros, into gyb */
    double deps = 0.0;
    for (int64_t k = 0; k < T; k++) {
        const int64_t t = f->d ? k : T - 1 - k, r0 = kf__rnn_row(lo, t, b0);
        for (int64_t i = 0; i < nb; i++) {
            const int64_t r = r0 + i * lo->bs;
            if (!valid_at(c->lengths, T, t, b0 + i)) { /* no gradient; dh passes through */
                memset(dgx + r * 3 * H, 0, (size_t)(3 * H) * sizeof(double));
                memset(aux + r * aux_w, 0, (size_t)aux_w * sizeof(double));
                continue;
            }
            const double *gy = gy_direct ? f->dy + r * DH + f->d * H : gyb + i * H;
            if (!gy_direct)
                kf__rnn_cpu_drop_row_f64(gyb + i * H, f->dy ? f->dy + r * DH + f->d * H : NULL, H,
                                         &f->dr, kf__rnn_drop_counter(lo, &f->dr, f->l, t,
                                                                      b0 + i, f->d));
            if (!lo->agru)
                gru_bwd_row(H, gates + r * ng * H, hp + r * H, gy, dgx + r * 3 * H,
                            aux + r * 3 * H, dh + i * H);
            else
                deps += agru_bwd_row(H, cw->eps, gates + r * ng * H, hp + r * H, gy,
                                     dgx + r * 3 * H, aux + r * H, dh + i * H);
        }
        if (!lo->agru) { /* dh += dG_h W_hh */
            kf__dgemm(false, false, nb, H, 3 * H, 1.0, aux + r0 * 3 * H, ld3, cw->whh, H, 1.0, dh,
                      H);
            continue;
        }
        /* dq = da_d A; da_r = dq hp r(1-r); dh += dq r + da_z U_z + da_r U_r */
        kf__dgemm(false, false, nb, H, H, 1.0, dgx + r0 * 3 * H + 2 * H, ld3, cw->A, H, 0.0, dq, H);
        for (int64_t i = 0; i < nb; i++) {
            if (!valid_at(c->lengths, T, t, b0 + i)) continue;
            const int64_t r = r0 + i * lo->bs;
            const double *ar = gates + r * ng * H + H, *hpr = hp + r * H, *dqi = dq + i * H;
            double *dar = dgx + r * 3 * H + H, *dhi = dh + i * H;
            for (int64_t j = 0; j < H; j++) {
                double rc;
                const double rg = sigm_c(ar[j], &rc);
                dar[j] = dqi[j] * hpr[j] * rg * rc;
                dhi[j] += dqi[j] * rg;
            }
        }
        kf__dgemm(false, false, nb, H, H, 1.0, dgx + r0 * 3 * H, ld3, cw->uz, H, 1.0, dh, H);
        kf__dgemm(false, false, nb, H, H, 1.0, dgx + r0 * 3 * H + H, ld3, cw->ur, H, 1.0, dh, H);
    }
    if (c->dh0)
        memcpy((double *)c->dh0 + (cw->idx * lo->B + b0) * H, dh,
               (size_t)(nb * H) * sizeof(double));
    if (lo->agru) dat(c->ws, lo->epsacc)[s] = deps;
}

/* One weight-gradient product over all N rows: dst[m, n] (+)= G[:, 0:m]^T X (G rows ldg apart),
 * or with x NULL a bias, dst[m] (+)= the column sums of G[:, 0:m]. */
typedef struct prod64 {
    double *dst;
    const double *g;
    int64_t ldg, m;
    const double *x;
    int64_t n;
    bool acc;
} prod64;

/* Rows (columns, for a bias) [m0, m1) of a product. */
static void prod_part(const prod64 *w, int64_t N, int64_t m0, int64_t m1) {
    if (w->x) {
        kf__dgemm(true, false, m1 - m0, w->n, N, 1.0, w->g + m0, w->ldg, w->x, w->n,
                  w->acc ? 1.0 : 0.0, w->dst + m0 * w->n, w->n);
        return;
    }
    for (int64_t m = m0; m < m1; m++) {
        double sum = 0.0;
        for (int64_t r = 0; r < N; r++) sum += w->g[r * w->ldg + m];
        w->dst[m] = w->acc ? w->dst[m] + sum : sum;
    }
}

/* The gradient products of the cell in flight; returns how many it wrote into `out` (<= 9). */
static int prod_list(const bwd64 *f, prod64 *out) {
    const kf__rnn_bwd *c = f->c;
    const kf__rnn_cpu_layout *lo = f->lo;
    if (!c->dw) return 0;
    const int64_t H = lo->H, in = f->cw.in;
    void *const *dw = c->dw + f->cw.idx * c->plan->nw;
    const double *dgx = dat(c->ws, lo->big[0]), *aux = dat(c->ws, lo->big[1]);
    const double *hp = (const double *)kf__cat(c->reserve, (size_t)f->cw.idx * lo->cell_bytes);
    const bool acc = c->accumulate;
    int n = 0;
    for (int g = 0; g < 3; g++) { /* input side: gate block g of dG_x */
        double *dwx, *dbx;
        if (lo->agru) {
            dwx = dw[agru_wx[g]];
            dbx = dw[agru_bx[g]];
        } else {
            dwx = dw[KF__GRU_W_IH] ? (double *)dw[KF__GRU_W_IH] + g * H * in : NULL;
            dbx = dw[KF__GRU_B_IH] ? (double *)dw[KF__GRU_B_IH] + g * H : NULL;
        }
        if (dwx) out[n++] = (prod64){dwx, dgx + g * H, 3 * H, H, f->x, in, acc};
        if (dbx) out[n++] = (prod64){dbx, dgx + g * H, 3 * H, H, NULL, 0, acc};
    }
    if (!lo->agru) { /* recurrent side: dG_h */
        if (dw[KF__GRU_W_HH])
            out[n++] = (prod64){dw[KF__GRU_W_HH], aux, 3 * H, 3 * H, hp, H, acc};
        if (dw[KF__GRU_B_HH])
            out[n++] = (prod64){dw[KF__GRU_B_HH], aux, 3 * H, 3 * H, NULL, 0, acc};
        return n;
    }
    if (dw[KF__AGRU_U_Z]) out[n++] = (prod64){dw[KF__AGRU_U_Z], dgx, 3 * H, H, hp, H, acc};
    if (dw[KF__AGRU_U_R]) out[n++] = (prod64){dw[KF__AGRU_U_R], dgx + H, 3 * H, H, hp, H, acc};
    /* G = da_d^T q, combined into dW_h = G - G^T after a barrier */
    if (dw[KF__AGRU_W_H])
        out[n++] = (prod64){dat(c->ws, lo->gmat), dgx + 2 * H, 3 * H, H, aux, H, false};
    return n;
}

/* Everything of the cell in flight that needs all rows: weight gradients, d eps and dX
 * (accumulated over directions). Thread tid of nth does its share; ends in a barrier. */
static void cell_grads(const bwd64 *f, int tid, int nth) {
    const kf__rnn_bwd *c = f->c;
    const kf__rnn_cpu_layout *lo = f->lo;
    const int64_t H = lo->H, in = f->cw.in;
    prod64 w[9];
    const int nw = prod_list(f, w);
    for (int i = 0; i < nw; i++) {
        int64_t m0, m1;
        kf__part(w[i].m, nth, tid, &m0, &m1);
        if (m0 < m1) prod_part(&w[i], lo->N, m0, m1);
    }
    if (f->dx) { /* dX (+)= sum_g dG_x[:, block g] W_g */
        const double *dgx = dat(c->ws, lo->big[0]);
        int64_t r0, r1;
        kf__part(lo->N, nth, tid, &r0, &r1);
        for (int g = 0; g < 3; g++)
            kf__dgemm(false, false, r1 - r0, in, H, 1.0, dgx + r0 * 3 * H + g * H, 3 * H,
                      f->cw.wx[g], in, f->d || g ? 1.0 : 0.0, f->dx + r0 * in, in);
    }
    void *const *dw = c->dw ? c->dw + f->cw.idx * c->plan->nw : NULL;
    if (lo->agru && dw && dw[KF__AGRU_EPS] && tid == 0) {
        const double *part = dat(c->ws, lo->epsacc);
        double sum = 0.0, *deps = dw[KF__AGRU_EPS];
        for (int32_t s = 0; s < lo->ns; s++) sum += part[s];
        *deps = c->accumulate ? *deps + sum : sum;
    }
#pragma omp barrier
    if (lo->agru && dw && dw[KF__AGRU_W_H]) {
        /* dA = G and A = W_h - W_h^T - gamma I, so dW_h = G - G^T */
        const double *g = dat(c->ws, lo->gmat);
        double *dwh = dw[KF__AGRU_W_H];
        int64_t i0, i1;
        kf__part(H, nth, tid, &i0, &i1);
        for (int64_t i = i0; i < i1; i++)
            for (int64_t j = 0; j < H; j++)
                dwh[i * H + j] =
                    g[i * H + j] - g[j * H + i] + (c->accumulate ? dwh[i * H + j] : 0.0);
    }
}

static void bwd_team(void *arg, int tid, int nth) {
    const call64 *call = arg;
    const kf__rnn_bwd *c = call->bc;
    const kf__rnn_cpu_layout *lo = &call->lo;
    const struct kf_rnn_plan *p = c->plan;
    form_A(lo, p, c->w, c->ws, tid, nth);
#pragma omp barrier
    for (int32_t l = p->L - 1; l >= 0; l--) {
        bwd64 f = {.c = c, .lo = lo, .l = l};
        f.x = l ? (const double *)kf__cat(c->reserve, lo->out0 + (size_t)(l - 1) * lo->out_bytes)
                : c->x;
        f.dy = l == p->L - 1 ? c->dy : dat(c->ws, lo->seq[l % 2]);
        f.dx = l ? dat(c->ws, lo->seq[(l - 1) % 2]) : c->dx;
        f.dr = drop_of(p, p->dropout > 0.0f && l < p->L - 1, c->seed, c->offset);
        for (f.d = 0; f.d < lo->D; f.d++) {
            f.cw = cell_of(lo, p, c->w, c->ws, l, f.d);
            for (int32_t s = tid; s < lo->ns; s += nth) bwd_slice(&f, s);
#pragma omp barrier
            cell_grads(&f, tid, nth);
#pragma omp barrier
        }
    }
}

kf_status kf__cpu_rnn_backward_f64(kf_context *ctx, const kf__rnn_bwd *c) {
    (void)ctx; /* the thread count comes from the plan's context, as the sizes did */
    call64 call = {.bc = c};
    kf__rnn_cpu_layout_init(&call.lo, c->plan, c->T, c->B, true);
    kf__cpu_team(call.lo.ns, bwd_team, &call);
    return KF_OK;
}

/* The float64 plans' table, on the baseline's layout whatever the context's ISA (cpu/backend.c's
 * select gives it to every float64 plan). */
const kf__rnn_ops kf__cpu_rnn_ops_f64 = {NULL, kf__cpu_rnn_sizes, kf__cpu_rnn_forward_f64,
                                         kf__cpu_rnn_backward_f64};

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
 * Dropout masks are recomputed from the counter (core/rnn_backend.h). Nothing is allocated. */
#include "blas.h"
#include "rnn_cpu.h"


/* ---- one step of a slice ---------------------------------------------------------------------
 * Notation of one step (gradient g = dL/dh' of the new state, hp = the state before the step):
 * GRU:   h' = (1-z) n + z hp, n = tanh(a_n), a_n = gx_n + r hn, hn = W_hn hp + b_hn
 *        dn = g (1-z)        dz = g (hp - n)       da_n = dn (1 - n^2)
 *        dr = da_n hn        da_r = dr r(1-r)      da_z = dz z(1-z)
 *        dG_x = [da_r, da_z, da_n]   dG_h = [da_r, da_z, da_n r]
 *        dhp = g z + dG_h W_hh
 * A-GRU: h' = hp + eps z d, d = tanh(a_d), a_d = gx_d + q A^T, q = r hp
 *        da_d = g eps z (1 - d^2)    da_z = g eps d z(1-z)    d eps = sum g z d
 *        dq = da_d A                 da_r = dq hp r(1-r)
 *        dG_x = [da_z, da_r, da_d]
 *        dhp = g + dq r + [da_z, da_r] [U_z; U_r]
 * Rows with t >= len[b] get zero pre-activation gradients and pass dh through unchanged. */
typedef struct bwd_step {
    int64_t nb, H, t;
    const int32_t *len; /* lengths + b0, or NULL */
    const float *sv, *hp;
    int64_t sv_ld, hp_ld;
    float *dgx;         /* dG_x row of sample b0, rows dgx_ld apart */
    float *aux;         /* GRU: dG_h rows; A-GRU: q rows */
    int64_t dgx_ld, aux_ld;
    float *dh;          /* [nb, H] gradient of the state, in place */
    const float *gy;    /* d(output) of this step (masked), rows gy_ld apart: dy in place, or
                           the slice's scratch where dropout masks it or dy is NULL */
    int64_t gy_ld;
} bwd_step;

static bool bstep_valid(const bwd_step *s, int64_t i) { return !s->len || s->t < s->len[i]; }

/* Zeroes the pre-activation gradients of an invalid row (its dh passes through). */
static void zero_row(const bwd_step *s, int64_t i, int64_t aux_w) {
    memset(s->dgx + i * s->dgx_ld, 0, (size_t)(3 * s->H) * sizeof(float));
    memset(s->aux + i * s->aux_ld, 0, (size_t)aux_w * sizeof(float));
}

KF__VEC_CLONES static void gru_bwd_pointwise(const bwd_step *s) {
    const int64_t H = s->H;
    for (int64_t i = 0; i < s->nb; i++) {
        if (!bstep_valid(s, i)) {
            zero_row(s, i, 3 * H);
            continue;
        }
        const float *restrict sv = s->sv + i * s->sv_ld;
        const float *restrict hp = s->hp + i * s->hp_ld;
        const float *restrict gy = s->gy + i * s->gy_ld;
        float *restrict dgx = s->dgx + i * s->dgx_ld;
        float *restrict dgh = s->aux + i * s->aux_ld;
        float *restrict dh = s->dh + i * H;
#pragma omp simd
        for (int64_t k = 0; k < H; k++) {
            float r = sv[k], z = sv[H + k], n = sv[2 * H + k], hn = sv[3 * H + k];
            float g = dh[k] + gy[k];
            float dan = g * (1.0f - z) * (1.0f - n * n);
            float dar = dan * hn * r * (1.0f - r);
            float daz = g * (hp[k] - n) * z * (1.0f - z);
            dgx[k] = dar;
            dgx[H + k] = daz;
            dgx[2 * H + k] = dan;
            dgh[k] = dar;
            dgh[H + k] = daz;
            dgh[2 * H + k] = dan * r;
            dh[k] = g * z;
        }
    }
}

/* A-GRU pass 1 (before dq = da_d A): da_z, da_d, q, dh = g; returns this step's d eps. z, d and
 * their complements 1 - z, 1 - d^2 come from the reserve's pre-activations (kf__vf_sigmoid_c,
 * kf__vf_tanh_c): none of them cancels in a saturated gate. KF__MK_CLONES as the forward's
 * step functions, so that z, r and d are the forward's to the bit in every build. */
KF__MK_CLONES static double agru_bwd_pointwise1(const bwd_step *s, float eps) {
    const int64_t H = s->H;
    const kf__vf ve = kf__vf_set1(eps);
    double deps = 0.0; /* d eps sums N*H terms that largely cancel */
    for (int64_t i = 0; i < s->nb; i++) {
        if (!bstep_valid(s, i)) {
            zero_row(s, i, H);
            continue;
        }
        const float *sv = s->sv + i * s->sv_ld, *hp = s->hp + i * s->hp_ld;
        const float *gy = s->gy + i * s->gy_ld;
        float *dgx = s->dgx + i * s->dgx_ld, *q = s->aux + i * s->aux_ld, *dh = s->dh + i * H;
        for (int64_t j = 0; j < H; j += KF__VW) {
            const int nc = kf__cols_left(j, H);
            kf__vf zc, dc;
            const kf__vf z = kf__vf_sigmoid_c(kf__vf_load_n(sv + j, nc), &zc);
            const kf__vf r = kf__vf_sigmoid(kf__vf_load_n(sv + H + j, nc));
            const kf__vf d = kf__vf_tanh_c(kf__vf_load_n(sv + 2 * H + j, nc), &dc);
            const kf__vf g = kf__vf_load_n(dh + j, nc) + kf__vf_load_n(gy + j, nc);
            kf__vf_store_n(dgx + j, g * ve * d * z * zc, nc);
            kf__vf_store_n(dgx + 2 * H + j, g * ve * z * dc, nc);
            kf__vf_store_n(q + j, r * kf__vf_load_n(hp + j, nc), nc);
            kf__vf_store_n(dh + j, g, nc);
            float gzd[KF__VW];
            kf__vf_store_n(gzd, g * z * d, nc);
            for (int v = 0; v < nc; v++) deps += (double)gzd[v];
        }
    }
    return deps;
}

/* C[nb, n] (+)= A[nb, K] B, B [K, n] in plain panels of KF__NV_P vectors, A's rows lda apart,
 * C's ldc apart, added into where `add`: dh += (GRU: dG_h W_hh, K = 3H; A-GRU: [da_z, da_r]
 * [U_z; U_r], K = 2H), and where kf__rnn_dx_fused, the step's rows of dX (+)= dG_x W3 (the
 * second direction adds). */
KF__MK_CLONES static void product_into(const bwd_step *s, const float *a, int64_t lda, int64_t K,
                                        const float *pk, float *c, int64_t ldc, int64_t n,
                                        bool add) {
    for (int64_t p = 0; p < kf__num_panels(1, KF__NV_P, n); p++) {
        for (int64_t i0 = 0; i0 < s->nb; i0 += KF__MR_P) {
            const int64_t mr = s->nb - i0 < KF__MR_P ? s->nb - i0 : KF__MR_P;
            kf__vf acc[KF__MR_MAX * KF__NV_MAX];
            kf__mk(KF__MR_P, KF__NV_P, K, a + i0 * lda, lda, mr, pk + p * K * KF__NV_P * KF__VW,
                   acc);
            for (int v = 0; v < KF__NV_P; v++) {
                const int64_t j = kf__panel_col(1, KF__NV_P, p, v);
                const int nc = kf__cols_left(j, n);
                if (!nc) break;
                for (int64_t i = i0; i < i0 + mr; i++) {
                    float *ci = c + i * ldc + j;
                    const kf__vf v0 = acc[(i - i0) * KF__NV_P + v];
                    kf__vf_store_n(ci, add ? kf__vf_load_n(ci, nc) + v0 : v0, nc);
                }
            }
        }
    }
}

/* Where wrec_fused: a slice part wp[M, N] += G[:, 0:M]^T X[:, 0:N] over this step's rows, while
 * they are in cache (GRU: dW_hh += dG_h^T Hp; A-GRU: [dU_z; dU_r] += [da_z, da_r]^T Hp and
 * G += da_d^T q; input_side_step: dW3^T += X^T dG_x). One GEMM over all T*B rows read
 * both back from memory (205 MB at T=784) and OpenBLAS spent a third of its time packing them
 * (perf of an A-GRU's 1-thread forward+backward at T=28 I=28 H=128 B=128: OpenBLAS spent 24% of
 * the samples on dW3, dU_z, dU_r and G, a third of it packing, dW3's n = I = 28 columns the
 * worst; per step they take 16% of a run with 12% fewer samples in all). Tiles of KF__MR_P rows
 * of wp by KF__NV_P vectors of columns (N whole panels), K = the slice's rows: A = G^T and B = X
 * read in place (G rows ldg apart, X rows ldx apart). */
KF__MK_CLONES static void wrec_step(const bwd_step *s, const float *g, int64_t ldg, int64_t M,
                                    const float *x, int64_t ldx, int64_t N, float *wp) {
    for (int64_t j0 = 0; j0 < N; j0 += KF__NV_P * KF__VW) {
        for (int64_t m0 = 0; m0 < M; m0 += KF__MR_P) {
            const int64_t mr = M - m0 < KF__MR_P ? M - m0 : KF__MR_P;
            kf__vf acc[KF__MR_MAX * KF__NV_MAX];
            kf__mk_st(KF__MR_P, KF__NV_P, s->nb, g + m0, 1, ldg, mr, x + j0, ldx, acc);
            for (int64_t i = 0; i < mr; i++) {
                for (int v = 0; v < KF__NV_P; v++) {
                    float *c = wp + (m0 + i) * N + j0 + v * KF__VW;
                    kf__vf_store_n(c, kf__vf_load(c) + acc[i * KF__NV_P + v], KF__VW);
                }
            }
        }
    }
}

/* Where wrec_fused, the input side per step: dW3^T [in, 3H] += X^T dG_x (X rows ldx apart) into
 * the slice's part wi, and the step's rows of dX (+)= dG_x W3 (rows ldd apart; the second
 * direction adds). Where the layer input fills the micro-kernel's tiles (kf__tiles_full,
 * kf__rnn_dx_fused) by wrec_step and product_into; else (I = 1, the pixel sequence) by plain
 * loops over the 3H columns, whose work is as small as `in`. Either way dG_x is used within its
 * step only: at T=784 the GEMMs after the recurrence had to write all of it to memory (154 MB)
 * and read it back twice, packing it (9% of a 1-thread forward+backward, for n = 1 column). */
KF__VEC_CLONES static void win_thin(const bwd_step *s, const float *x, int64_t ldx, int64_t in,
                                    float *wi) {
    const int64_t G = 3 * s->H;
    for (int64_t i = 0; i < s->nb; i++) {
        const float *restrict g = s->dgx + i * s->dgx_ld;
        for (int64_t f = 0; f < in; f++) {
            const float a = x[i * ldx + f];
            float *restrict w = wi + f * G;
#pragma omp simd
            for (int64_t m = 0; m < G; m++) w[m] += a * g[m];
        }
    }
}

KF__VEC_CLONES static void dx_thin(const bwd_step *s, const float *w3, int64_t in, float *dx,
                                   int64_t ldd, bool add) {
    const int64_t G = 3 * s->H;
    for (int64_t i = 0; i < s->nb; i++) {
        const float *restrict g = s->dgx + i * s->dgx_ld;
        for (int64_t f = 0; f < in; f++) {
            float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
            for (int64_t m = 0; m < G; m++) acc += g[m] * w3[m * in + f];
            dx[i * ldd + f] = add ? dx[i * ldd + f] + acc : acc;
        }
    }
}

static void input_side_step(const bwd_step *s, const kf__rnn_cell *cw, const float *x,
                            int64_t ldx, float *wi, float *dx, bool add) {
    const int64_t in = cw->in, G = 3 * s->H;
    if (dx && kf__rnn_dx_fused(in))
        product_into(s, s->dgx, s->dgx_ld, G, cw->pk[2], dx, ldx, in, add);
    else if (dx)
        dx_thin(s, cw->w3, in, dx, ldx, add);
    if (wi && kf__tiles_full(in, KF__MR_P))
        wrec_step(s, x, ldx, in, s->dgx, s->dgx_ld, G, wi);
    else if (wi)
        win_thin(s, x, ldx, in, wi);
}

/* A-GRU pass 2 in the epilogue of dq = da_d A: da_r = dq hp r(1-r); dh += dq r (r and 1 - r from
 * the pre-activation, as in pass 1). */
KF__MK_CLONES static void agru_bwd_dq(const bwd_step *s, const float *pk) {
    const int64_t H = s->H;
    for (int64_t p = 0; p < kf__num_panels(1, KF__NV_P, H); p++) {
        for (int64_t i0 = 0; i0 < s->nb; i0 += KF__MR_P) {
            const int64_t mr = s->nb - i0 < KF__MR_P ? s->nb - i0 : KF__MR_P;
            kf__vf acc[KF__MR_MAX * KF__NV_MAX];
            kf__mk(KF__MR_P, KF__NV_P, H, s->dgx + i0 * s->dgx_ld + 2 * H, s->dgx_ld, mr,
                   pk + p * H * KF__NV_P * KF__VW, acc);
            for (int v = 0; v < KF__NV_P; v++) {
                const int64_t j = kf__panel_col(1, KF__NV_P, p, v);
                const int nc = kf__cols_left(j, H);
                if (!nc) break;
                for (int64_t i = i0; i < i0 + mr; i++) {
                    if (!bstep_valid(s, i)) continue;
                    const kf__vf dq = acc[(i - i0) * KF__NV_P + v];
                    kf__vf rc;
                    const kf__vf r = kf__vf_sigmoid_c(kf__vf_load_n(s->sv + i * s->sv_ld + H + j,
                                                                    nc), &rc);
                    const kf__vf hp = kf__vf_load_n(s->hp + i * s->hp_ld + j, nc);
                    float *dh = s->dh + i * H + j;
                    kf__vf_store_n(s->dgx + i * s->dgx_ld + H + j, dq * hp * r * rc, nc);
                    kf__vf_store_n(dh, kf__vf_fma(dq, r, kf__vf_load_n(dh, nc)), nc);
                }
            }
        }
    }
}

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

/* One weight-gradient product dst[M, n] (+)= G[:, 0:M]^T X over all N rows (G rows ldg apart). */
typedef struct wgrad {
    float *dst;
    const float *g;
    int64_t ldg, m;
    const float *x;
    int64_t n; /* columns of x (its leading dimension) */
    bool beta1;
} wgrad;

/* Rows [m0, m1) of a product. */
static void wgrad_part(const wgrad *w, int64_t N, int64_t m0, int64_t m1) {
    kf__sgemm(true, false, m1 - m0, w->n, N, 1.0f, w->g + m0, w->ldg, w->x, w->n,
              w->beta1 ? 1.0f : 0.0f, w->dst + m0 * w->n, w->n);
}

/* The gradient products of cell (l, d); returns how many it wrote into `out` (at most 6). */
static int wgrad_list(const bwd_layer *f, int32_t d, wgrad *out) {
    const kf__rnn_bwd *c = f->c;
    const kf__rnn_cpu_layout *lo = f->lo;
    if (!c->dw) return 0;
    const int64_t H = lo->H, in = f->cell[d].in, cidx = cell_index(f, d);
    void *const *dw = c->dw + cidx * c->plan->nw;
    const float *dgx = (const float *)kf__at(f->ws, lo->big[0]);
    const float *aux = (const float *)kf__at(f->ws, lo->big[1]);
    const float *hp = (const float *)kf__cat(c->reserve, (size_t)cidx * lo->cell_bytes);
    const bool acc = c->accumulate;
    int n = 0;
#define KF__WG(DST, G, M, X, NX, B1)                                                            \
    do {                                                                                        \
        if (DST) out[n++] = (wgrad){(DST), (G), 3 * H, (M), (X), (NX), (B1)};                   \
    } while (0)
    const bool in_done = lo->wrec_fused; /* per step, or not wanted */
    if (!lo->agru) {
        if (!in_done) KF__WG(dw[KF__GRU_W_IH], dgx, 3 * H, f->x, in, acc);
        if (!lo->wrec_fused) KF__WG(dw[KF__GRU_W_HH], aux, 3 * H, hp, H, acc);
    } else {
        static const int wx[3] = {KF__AGRU_W_Z, KF__AGRU_W_R, KF__AGRU_V_H};
        static const int wu[2] = {KF__AGRU_U_Z, KF__AGRU_U_R};
        for (int g = 0; g < 3 && !in_done; g++) KF__WG(dw[wx[g]], dgx + g * H, H, f->x, in, acc);
        if (lo->wrec_fused) return n;
        for (int g = 0; g < 2; g++) KF__WG(dw[wu[g]], dgx + g * H, H, hp, H, acc);
        /* G = da_d^T q, combined into dW_h = G - G^T after a barrier (q rows are H apart) */
        if (dw[KF__AGRU_W_H])
            out[n++] = (wgrad){(float *)kf__at(f->ws, lo->gmat), dgx + 2 * H, 3 * H, H, aux, H,
                               false};
    }
#undef KF__WG
    return n;
}

/* Everything of cell (l, d) that needs all rows of the recurrence: weight gradients, d eps and
 * dX (accumulated over directions). Thread `tid` of `nth` does its share; ends in a barrier. */
static void bwd_cell_grads(const bwd_layer *f, int32_t d, int tid, int nth) {
    const kf__rnn_bwd *c = f->c;
    const kf__rnn_cpu_layout *lo = f->lo;
    const int64_t H = lo->H, in = f->cell[d].in;
    wgrad w[6];
    const int nw = wgrad_list(f, d, w);
    /* Consecutive products of the same x (A-GRU: dW_z, dW_r, dV_h; dU_z, dU_r) are split across
     * threads as one of their summed rows, so a thread packs that x for OpenBLAS once, not once
     * per product (x is [N, in] or Hp [N, H], up to 1.8 MB at T=28, B=128). */
    for (int i = 0, e; i < nw; i = e) {
        int64_t M = w[i].m;
        for (e = i + 1; e < nw && w[i].x && w[e].x == w[i].x && w[e].n == w[i].n; e++) M += w[e].m;
        int64_t m0, m1;
        kf__part(M, nth, tid, &m0, &m1);
        for (int64_t j = i, base = 0; j < e; base += w[j].m, j++) {
            const int64_t a = m0 - base > 0 ? m0 - base : 0;
            const int64_t b = m1 - base < w[j].m ? m1 - base : w[j].m;
            if (a < b) wgrad_part(&w[j], lo->N, a, b);
        }
    }
    if (f->dx && !lo->wrec_fused) {
        int64_t r0, r1;
        kf__part(lo->N, nth, tid, &r0, &r1);
        const float *dgx = (const float *)kf__at(f->ws, lo->big[0]);
        kf__sgemm(false, false, r1 - r0, in, 3 * H, 1.0f, dgx + r0 * 3 * H, 3 * H, f->cell[d].w3,
                  in, d ? 1.0f : 0.0f, f->dx + r0 * in, in);
    }
    if (wrec_wanted(f, d)) { /* wrec_block (+)= the slices' parts, in slice order, by rows */
        int64_t m0, m1;
        kf__part(3 * H, nth, tid, &m0, &m1);
        for (int64_t m = m0; m < m1; m++) {
            bool acc;
            float *dst = wrec_block(f, d, (int)(m / H), &acc);
            if (!dst) continue;
            dst += (m % H) * H;
            for (int32_t s = 0; s < lo->ns; s++) {
                const float *part = (const float *)kf__at(
                    f->ws, lo->wpart + (size_t)s * lo->wpart_bytes + (size_t)(m * H) * sizeof(float));
                const bool add = s > 0 || acc;
                for (int64_t j = 0; j < H; j++) dst[j] = (add ? dst[j] : 0.0f) + part[j];
            }
        }
    }
    if (win_wanted(f, d)) { /* dW3 (+)= the slices' parts of dW3^T, in slice order, by rows */
        int64_t m0, m1;
        kf__part(3 * H, nth, tid, &m0, &m1);
        for (int64_t m = m0; m < m1; m++) {
            float *dst = win_block(f, d, (int)(m / H));
            if (!dst) continue;
            dst += (m % H) * in;
            for (int32_t s = 0; s < lo->ns; s++) {
                const float *part = (const float *)kf__at(
                    f->ws, lo->wpart + (size_t)s * lo->wpart_bytes + lo->win);
                const bool add = s > 0 || c->accumulate;
                for (int64_t i = 0; i < in; i++)
                    dst[i] = (add ? dst[i] : 0.0f) + part[i * 3 * H + m];
            }
        }
    }
    void *const *dw = c->dw ? c->dw + cell_index(f, d) * c->plan->nw : NULL;
    if (dw) { /* biases (+)= the slices' sums (bias_step), in slice order; segments: where in the
               * sums each bias's columns are */
        struct { float *dst; int64_t off, n; } seg[3];
        if (!lo->agru) {
            seg[0].dst = dw[KF__GRU_B_IH], seg[0].off = 0, seg[0].n = 3 * H;
            seg[1].dst = dw[KF__GRU_B_HH], seg[1].off = 0, seg[1].n = 2 * H;
            seg[2].dst = dw[KF__GRU_B_HH] ? (float *)dw[KF__GRU_B_HH] + 2 * H : NULL;
            seg[2].off = 3 * H, seg[2].n = H;
        } else {
            static const int bx[3] = {KF__AGRU_B_Z, KF__AGRU_B_R, KF__AGRU_B_H};
            for (int g = 0; g < 3; g++) seg[g].dst = dw[bx[g]], seg[g].off = g * H, seg[g].n = H;
        }
        for (int g = 0; g < 3; g++) {
            if (!seg[g].dst) continue;
            int64_t j0, j1;
            kf__part(seg[g].n, nth, tid, &j0, &j1);
            for (int64_t j = j0; j < j1; j++) {
                double sum = 0.0;
                for (int32_t s = 0; s < lo->ns; s++) {
                    const size_t at = lo->bsum + (size_t)s * lo->bsum_bytes;
                    sum += ((const double *)kf__cat(f->ws, at))[seg[g].off + j];
                }
                seg[g].dst[j] = (float)sum + (c->accumulate ? seg[g].dst[j] : 0.0f);
            }
        }
    }
    if (lo->agru && dw && dw[KF__AGRU_EPS] && tid == 0) {
        const double *part = (const double *)kf__at(f->ws, lo->epsacc);
        double sum = 0.0;
        for (int32_t s = 0; s < lo->ns; s++) sum += part[s];
        float *deps = dw[KF__AGRU_EPS];
        *deps = (float)sum + (c->accumulate ? *deps : 0.0f);
    }
    kf__cpu_barrier_wait(f->bar, nth);
    if (lo->agru && dw && dw[KF__AGRU_W_H]) {
        /* dA = G and A = W_h - W_h^T - gamma I, so dW_h = G - G^T */
        const float *g = (const float *)kf__at(f->ws, lo->gmat);
        float *dwh = dw[KF__AGRU_W_H];
        int64_t i0, i1;
        kf__part(H, nth, tid, &i0, &i1);
        for (int64_t i = i0; i < i1; i++)
            for (int64_t j = 0; j < H; j++)
                dwh[i * H + j] = g[i * H + j] - g[j * H + i] + (c->accumulate ? dwh[i * H + j] : 0.0f);
    }
}

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

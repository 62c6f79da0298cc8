/* One step of a slice of the recurrent backward (part (1) of cpu/rnn_bwd.c's header comment):
 * the pointwise passes, the recurrent products and the per-step parts of the weight gradients.
 * Static functions of cpu/rnn_bwd.c, which includes this file once, before its layer code. */
#ifndef KF_CPU_RNN_BWD_STEP_H
#define KF_CPU_RNN_BWD_STEP_H

#include "blas.h"
#include "rnn_simd.h"

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
#endif /* KF_CPU_RNN_BWD_STEP_H */

/* Independent float64 (and float32) reference for GRU and A-GRU: see ref_rnn.h.
 *
 * The file is compiled once and includes itself twice (the part under REF_RNN_BODY), with REAL =
 * double and REAL = float, so both precisions run literally the same code.
 *
 * Per step, for one sample (x: I_l, h: H), the equations of DESIGN.md:
 *  GRU (torch.nn.GRU, gate rows r, z, n):
 *    a = W_ih x + b_ih,  c = W_hh h + b_hh
 *    r = sig(a_r + c_r),  z = sig(a_z + c_z),  n = tanh(a_n + r * c_n),  h' = (1 - z) n + z h
 *  A-GRU, with A = W_h - W_h^T - gamma I formed once per layer:
 *    z = sig(W_z x + b_z + U_z h),  r = sig(W_r x + b_r + U_r h),
 *    d = tanh(V_h x + b_h + A (r * h)),  h' = h + eps z d
 * Backward (g = dL/dh', the carried state gradient plus dL/dy at this step):
 *  GRU:   dn = g (1 - z), dz = g (h - n), dh = g z
 *         da_n = dn (1 - n^2),  dr = da_n c_n,  dc_n = da_n r
 *         da_r = dr r (1 - r),  da_z = dz z (1 - z)
 *         input side rows (da_r, da_z, da_n):  dW_ih += . x^T, db_ih += ., dx += W_ih^T .
 *         hidden side rows (da_r, da_z, dc_n): dW_hh += . h^T, db_hh += ., dh += W_hh^T .
 *  A-GRU: deps += sum g z d,  dd = g eps z,  dz = g eps d,  dh = g
 *         da_d = dd (1 - d^2),  s = r h,  ds = A^T da_d,  dA = da_d s^T -> dW_h += dA - dA^T
 *         dr = ds h,  dh += ds r,  da_r = dr r (1 - r),  da_z = dz z (1 - z)
 *         (W_z, b_z, U_z) from da_z, (W_r, b_r, U_r) from da_r, (V_h, b_h) from da_d;
 *         dx += W_z^T da_z + W_r^T da_r + V_h^T da_d;  dh += U_z^T da_z + U_r^T da_r
 * Layers: the input of layer l+1 is layer l's output [T, B, D*H] times the dropout mask scaled by
 * 1/(1-p); its gradient flows back through the same mask. */
#ifndef REF_RNN_BODY

#include "ref_rnn.h"

#include "../../common/counter_rng.h" /* the dropout mask function is part of the contract */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ref_rnn_group_size(const ref_rnn_cfg *c) { return c->cell == REF_GRU ? 4 : 10; }

int ref_rnn_num_weights(const ref_rnn_cfg *c) { return c->L * c->D * ref_rnn_group_size(c); }

int64_t ref_rnn_layer_input(const ref_rnn_cfg *c, int l) {
    return l == 0 ? c->I : (int64_t)c->D * c->H;
}

int64_t ref_rnn_x_numel(const ref_rnn_cfg *c) { return c->T * c->B * c->I; }
int64_t ref_rnn_y_numel(const ref_rnn_cfg *c) { return c->T * c->B * c->D * c->H; }
int64_t ref_rnn_h_numel(const ref_rnn_cfg *c) { return (int64_t)c->L * c->D * c->B * c->H; }

int64_t ref_rnn_weight_desc(const ref_rnn_cfg *c, int index, char *name, size_t name_len,
                            int *ndim, int64_t shape[2]) {
    int nw = ref_rnn_group_size(c);
    int group = index / nw, k = index % nw;
    int l = group / c->D, d = group % c->D;
    int64_t H = c->H, Il = ref_rnn_layer_input(c, l);
    char buf[64];
    int nd = 2;
    int64_t s0 = 0, s1 = 0;
    if (c->cell == REF_GRU) {
        static const char *const base[4] = {"weight_ih", "weight_hh", "bias_ih", "bias_hh"};
        snprintf(buf, sizeof buf, "%s_l%d%s", base[k], l, d ? "_reverse" : "");
        switch (k) {
        case 0: s0 = 3 * H; s1 = Il; break;
        case 1: s0 = 3 * H; s1 = H; break;
        default: nd = 1; s0 = 3 * H; break;
        }
    } else {
        static const char *const base[10] = {"W_z.weight", "W_z.bias", "U_z.weight", "W_r.weight",
                                             "W_r.bias",   "U_r.weight", "V_h.weight", "V_h.bias",
                                             "W_h",        "epsilon"};
        snprintf(buf, sizeof buf, "cells.%d.%s", l, base[k]);
        switch (k) {
        case 0: case 3: case 6: s0 = H; s1 = Il; break;
        case 2: case 5: case 8: s0 = H; s1 = H; break;
        case 1: case 4: case 7: nd = 1; s0 = H; break;
        default: nd = 1; s0 = 1; break;
        }
    }
    if (name) snprintf(name, name_len, "%s", buf);
    if (ndim) *ndim = nd;
    if (shape) { shape[0] = s0; shape[1] = nd == 2 ? s1 : 0; }
    return nd == 2 ? s0 * s1 : s0;
}

/* ---- helpers ---------------------------------------------------------------------------- */
void ref_rng_seed(ref_rng *r, uint64_t seed) { r->s = seed ^ 0x5DEECE66Dull; }

uint64_t ref_rng_next(ref_rng *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double ref_rng_uniform(ref_rng *r, double lo, double hi) {
    double u = (double)(ref_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
    return lo + (hi - lo) * u;
}

void ref_fill_uniform_f32(ref_rng *r, float *p, int64_t n, double lo, double hi) {
    for (int64_t i = 0; i < n; ++i) {
        float v;
        do v = (float)ref_rng_uniform(r, lo, hi); while (v == 0.0f);
        p[i] = v;
    }
}

double *ref_new_uniform_f64(ref_rng *r, int64_t n, double bound) {
    double *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = ref_rng_uniform(r, -bound, bound);
    return v;
}

double *ref_new_nans_f64(int64_t n) {
    double *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = NAN;
    return v;
}

double ref_rel_err_f64(const double *a, const double *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; ++i) {
        if (!isfinite(a[i])) return INFINITY;
        double e = a[i] - b[i];
        num += e * e;
        den += b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

double ref_rel_err_f32(const float *a, const double *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; ++i) {
        if (!isfinite(a[i])) return INFINITY;
        double e = (double)a[i] - b[i];
        num += e * e;
        den += b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

double *ref_to_f64(const float *p, int64_t n) {
    if (!p) return NULL;
    double *q = malloc((size_t)(n > 0 ? n : 1) * sizeof *q);
    for (int64_t i = 0; i < n; ++i) q[i] = p[i];
    return q;
}

/* ---- the two instantiations -------------------------------------------------------------- */
#define REF_RNN_BODY
#define REAL double
#define SFX(name) name##_f64
#define EXP exp
#define TANH tanh
#define COSH cosh
#include "ref_rnn.c"
#undef REAL
#undef SFX
#undef EXP
#undef TANH
#undef COSH

#define REAL float
#define SFX(name) name##_f32
#define EXP expf
#define TANH tanhf
#define COSH coshf
#include "ref_rnn.c"
#undef REAL
#undef SFX
#undef EXP
#undef TANH
#undef COSH

#else /* REF_RNN_BODY: the precision-generic part, REAL and SFX() defined by the includer */

static REAL SFX(sig)(REAL a) { return (REAL)1 / ((REAL)1 + EXP(-a)); }

static REAL *SFX(zalloc)(int64_t n) {
    REAL *p = calloc((size_t)(n > 0 ? n : 1), sizeof *p);
    if (!p) { fprintf(stderr, "ref_rnn: out of memory\n"); abort(); }
    return p;
}

/* Everything the forward computes that the backward reads. Logical [T][B][.] order throughout. */
typedef struct SFX(tape) {
    REAL **in;     /* [L] layer input (after dropout) [T][B][I_l] */
    REAL **out;    /* [L] layer output (before dropout) [T][B][D*H] */
    REAL **hprev;  /* [L*D] state before step t [T][B][H] (valid for t < len[b]) */
    REAL **gates;  /* [L*D] GRU: r, z, n, c_n; A-GRU: the pre-activations of z, r, d
                      ([T][B][G*H]) */
    REAL **A;      /* [L] A-GRU: W_h - W_h^T - gamma I */
    int G;
} SFX(tape);

static int64_t SFX(row)(const ref_rnn_cfg *c, int64_t t, int64_t b) {
    return c->batch_first ? b * c->T + t : t * c->B + b;
}

static int64_t SFX(len)(const ref_rnn_cfg *c, const int32_t *lengths, int64_t b) {
    return lengths ? (int64_t)lengths[b] : c->T;
}

static int SFX(dropout_on)(const ref_rnn_cfg *c) { return c->training && c->dropout > 0.0f; }

/* Multiplier of element (t, b, j) of layer l's output on its way to layer l+1. */
static REAL SFX(mask)(const ref_rnn_cfg *c, int l, int64_t t, int64_t b, int64_t j) {
    if (!SFX(dropout_on)(c)) return (REAL)1;
    int64_t DH = (int64_t)c->D * c->H;
    uint64_t ctr = c->offset + (uint64_t)(((l * c->T + t) * c->B + b) * DH + j);
    return kf__dropout_keep(c->seed, ctr, c->dropout) ? (REAL)1 / ((REAL)1 - (REAL)c->dropout)
                                                       : (REAL)0;
}

static void SFX(tape_free)(const ref_rnn_cfg *c, SFX(tape) *tp) {
    for (int l = 0; l < c->L; ++l) {
        free(tp->in[l]);
        free(tp->out[l]);
        free(tp->A[l]);
    }
    for (int g = 0; g < c->L * c->D; ++g) {
        free(tp->hprev[g]);
        free(tp->gates[g]);
    }
    free(tp->in); free(tp->out); free(tp->A); free(tp->hprev); free(tp->gates);
}

/* One GRU step: h (H) -> hnew (H); stores r, z, n, c_n in g. scratch: 6H. */
static void SFX(gru_step)(const ref_rnn_cfg *c, const REAL *const *w, const REAL *x, int64_t Il,
                          const REAL *h, REAL *g, REAL *hnew, REAL *scratch) {
    int64_t H = c->H;
    const REAL *W_ih = w[0], *W_hh = w[1], *b_ih = w[2], *b_hh = w[3];
    REAL *a = scratch, *cc = scratch + 3 * H;
    for (int64_t j = 0; j < 3 * H; ++j) {
        REAL s = b_ih[j];
        for (int64_t i = 0; i < Il; ++i) s += W_ih[j * Il + i] * x[i];
        a[j] = s;
        REAL u = b_hh[j];
        for (int64_t k = 0; k < H; ++k) u += W_hh[j * H + k] * h[k];
        cc[j] = u;
    }
    for (int64_t j = 0; j < H; ++j) {
        REAL r = SFX(sig)(a[j] + cc[j]);
        REAL z = SFX(sig)(a[H + j] + cc[H + j]);
        REAL cn = cc[2 * H + j];
        REAL n = TANH(a[2 * H + j] + r * cn);
        hnew[j] = ((REAL)1 - z) * n + z * h[j];
        g[j] = r; g[H + j] = z; g[2 * H + j] = n; g[3 * H + j] = cn;
    }
}

/* One A-GRU step; stores the pre-activations of z, r, d in g, from which the backward takes
 * each gate and its complement (1 - z = sig(-a), 1 - d^2 = 1 / cosh(a)^2): taken from the
 * rounded gates they cancel in a saturated gate, in float64 too. scratch: H (s = r h). */
static void SFX(agru_step)(const ref_rnn_cfg *c, const REAL *const *w, const REAL *A,
                           const REAL *x, int64_t Il, const REAL *h, REAL *g, REAL *hnew,
                           REAL *scratch) {
    int64_t H = c->H;
    const REAL *W_z = w[0], *b_z = w[1], *U_z = w[2], *W_r = w[3], *b_r = w[4], *U_r = w[5];
    const REAL *V_h = w[6], *b_h = w[7];
    REAL eps = w[9][0];
    REAL *s = scratch;
    for (int64_t j = 0; j < H; ++j) {
        REAL az = b_z[j], ar = b_r[j];
        for (int64_t i = 0; i < Il; ++i) {
            az += W_z[j * Il + i] * x[i];
            ar += W_r[j * Il + i] * x[i];
        }
        for (int64_t k = 0; k < H; ++k) {
            az += U_z[j * H + k] * h[k];
            ar += U_r[j * H + k] * h[k];
        }
        g[j] = az;
        g[H + j] = ar;
    }
    for (int64_t k = 0; k < H; ++k) s[k] = SFX(sig)(g[H + k]) * h[k];
    for (int64_t j = 0; j < H; ++j) {
        REAL ad = b_h[j];
        for (int64_t i = 0; i < Il; ++i) ad += V_h[j * Il + i] * x[i];
        for (int64_t k = 0; k < H; ++k) ad += A[j * H + k] * s[k];
        g[2 * H + j] = ad;
        hnew[j] = h[j] + eps * (SFX(sig)(g[j]) * TANH(ad));
    }
}

static void SFX(run_forward)(const ref_rnn_cfg *c, const REAL *x, const REAL *h0,
                             const REAL *const *w, const int32_t *lengths, SFX(tape) *tp,
                             REAL *y, REAL *hn) {
    const int L = c->L, D = c->D, nw = ref_rnn_group_size(c);
    const int64_t T = c->T, B = c->B, H = c->H, DH = (int64_t)D * H;
    tp->G = c->cell == REF_GRU ? 4 : 3;
    tp->in = calloc((size_t)L, sizeof *tp->in);
    tp->out = calloc((size_t)L, sizeof *tp->out);
    tp->A = calloc((size_t)L, sizeof *tp->A);
    tp->hprev = calloc((size_t)(L * D), sizeof *tp->hprev);
    tp->gates = calloc((size_t)(L * D), sizeof *tp->gates);
    REAL *h = SFX(zalloc)(H), *hnew = SFX(zalloc)(H), *scratch = SFX(zalloc)(6 * H);

    /* Layer 0's input in logical order. */
    tp->in[0] = SFX(zalloc)(T * B * c->I);
    for (int64_t t = 0; t < T; ++t)
        for (int64_t b = 0; b < B; ++b)
            memcpy(tp->in[0] + (t * B + b) * c->I, x + SFX(row)(c, t, b) * c->I,
                   (size_t)c->I * sizeof(REAL));

    for (int l = 0; l < L; ++l) {
        const int64_t Il = ref_rnn_layer_input(c, l);
        const REAL *in = tp->in[l];
        REAL *out = tp->out[l] = SFX(zalloc)(T * B * DH); /* zeros past each length */
        if (c->cell == REF_AGRU) {
            const REAL *W_h = w[l * nw + 8];
            REAL *A = tp->A[l] = SFX(zalloc)(H * H);
            for (int64_t i = 0; i < H; ++i)
                for (int64_t j = 0; j < H; ++j)
                    A[i * H + j] = W_h[i * H + j] - W_h[j * H + i] - (i == j ? (REAL)c->gamma : 0);
        }
        for (int d = 0; d < D; ++d) {
            const int grp = l * D + d;
            const REAL *const *wg = w + grp * nw;
            REAL *hp = tp->hprev[grp] = SFX(zalloc)(T * B * H);
            REAL *gt = tp->gates[grp] = SFX(zalloc)(T * B * tp->G * H);
            for (int64_t b = 0; b < B; ++b) {
                const int64_t len = SFX(len)(c, lengths, b);
                for (int64_t k = 0; k < H; ++k) h[k] = h0 ? h0[(grp * B + b) * H + k] : (REAL)0;
                for (int64_t s = 0; s < len; ++s) {
                    const int64_t t = d == 0 ? s : len - 1 - s, tb = t * B + b;
                    memcpy(hp + tb * H, h, (size_t)H * sizeof(REAL));
                    if (c->cell == REF_GRU)
                        SFX(gru_step)(c, wg, in + tb * Il, Il, h, gt + tb * 4 * H, hnew, scratch);
                    else
                        SFX(agru_step)(c, wg, tp->A[l], in + tb * Il, Il, h, gt + tb * 3 * H,
                                       hnew, scratch);
                    memcpy(h, hnew, (size_t)H * sizeof(REAL));
                    memcpy(out + tb * DH + d * H, h, (size_t)H * sizeof(REAL));
                }
                if (hn) memcpy(hn + (grp * B + b) * H, h, (size_t)H * sizeof(REAL));
            }
        }
        if (l + 1 < L) {
            REAL *next = tp->in[l + 1] = SFX(zalloc)(T * B * DH);
            for (int64_t t = 0; t < T; ++t)
                for (int64_t b = 0; b < B; ++b)
                    for (int64_t j = 0; j < DH; ++j)
                        next[(t * B + b) * DH + j] =
                            out[(t * B + b) * DH + j] * SFX(mask)(c, l, t, b, j);
        }
    }
    if (y) {
        const REAL *out = tp->out[L - 1];
        for (int64_t t = 0; t < T; ++t)
            for (int64_t b = 0; b < B; ++b)
                memcpy(y + SFX(row)(c, t, b) * DH, out + (t * B + b) * DH,
                       (size_t)DH * sizeof(REAL));
    }
    free(h); free(hnew); free(scratch);
}

void SFX(ref_rnn_forward)(const ref_rnn_cfg *c, const REAL *x, const REAL *h0,
                          const REAL *const *w, const int32_t *lengths, REAL *y, REAL *hn) {
    SFX(tape) tp;
    SFX(run_forward)(c, x, h0, w, lengths, &tp, y, hn);
    SFX(tape_free)(c, &tp);
}

/* GRU step backward. gh: dL/dh' in, dL/dh out. dx accumulated. scratch: 7H. */
static void SFX(gru_step_bwd)(const ref_rnn_cfg *c, const REAL *const *w, REAL *const *dw,
                              const REAL *x, int64_t Il, const REAL *h, const REAL *g, REAL *gh,
                              REAL *dx, REAL *scratch) {
    int64_t H = c->H;
    const REAL *W_ih = w[0], *W_hh = w[1];
    REAL *dW_ih = dw[0], *dW_hh = dw[1], *db_ih = dw[2], *db_hh = dw[3];
    REAL *ga = scratch, *gb = scratch + 3 * H, *dh = scratch + 6 * H;
    for (int64_t j = 0; j < H; ++j) {
        REAL r = g[j], z = g[H + j], n = g[2 * H + j], cn = g[3 * H + j];
        REAL dn = gh[j] * ((REAL)1 - z);
        REAL dz = gh[j] * (h[j] - n);
        REAL dan = dn * ((REAL)1 - n * n);
        REAL dr = dan * cn;
        REAL dar = dr * r * ((REAL)1 - r);
        REAL daz = dz * z * ((REAL)1 - z);
        ga[j] = dar; ga[H + j] = daz; ga[2 * H + j] = dan;
        gb[j] = dar; gb[H + j] = daz; gb[2 * H + j] = dan * r;
        dh[j] = gh[j] * z;
    }
    for (int64_t row = 0; row < 3 * H; ++row) {
        db_ih[row] += ga[row];
        db_hh[row] += gb[row];
        for (int64_t i = 0; i < Il; ++i) {
            dW_ih[row * Il + i] += ga[row] * x[i];
            if (dx) dx[i] += W_ih[row * Il + i] * ga[row];
        }
        for (int64_t k = 0; k < H; ++k) {
            dW_hh[row * H + k] += gb[row] * h[k];
            dh[k] += W_hh[row * H + k] * gb[row];
        }
    }
    memcpy(gh, dh, (size_t)H * sizeof(REAL));
}

/* A-GRU step backward. scratch: 6H. */
static void SFX(agru_step_bwd)(const ref_rnn_cfg *c, const REAL *const *w, REAL *const *dw,
                               const REAL *A, const REAL *x, int64_t Il, const REAL *h,
                               const REAL *g, REAL *gh, REAL *dx, REAL *scratch) {
    int64_t H = c->H;
    const REAL *W_z = w[0], *U_z = w[2], *W_r = w[3], *U_r = w[5], *V_h = w[6];
    const REAL eps = w[9][0];
    REAL *dad = scratch, *daz = scratch + H, *dar = scratch + 2 * H, *s = scratch + 3 * H;
    REAL *ds = scratch + 4 * H, *dh = scratch + 5 * H;
    REAL deps = 0;
    for (int64_t j = 0; j < H; ++j) {
        REAL z = SFX(sig)(g[j]), d = TANH(g[2 * H + j]), ch = COSH(g[2 * H + j]);
        deps += gh[j] * z * d;
        REAL dd = gh[j] * eps * z;
        REAL dz = gh[j] * eps * d;
        dad[j] = dd / (ch * ch);
        daz[j] = dz * z * SFX(sig)(-g[j]);
        dh[j] = gh[j];
        s[j] = SFX(sig)(g[H + j]) * h[j];
    }
    dw[9][0] += deps;
    for (int64_t k = 0; k < H; ++k) {
        REAL acc = 0;
        for (int64_t j = 0; j < H; ++j) acc += A[j * H + k] * dad[j];
        ds[k] = acc;
    }
    for (int64_t j = 0; j < H; ++j)
        for (int64_t k = 0; k < H; ++k) {
            REAL v = dad[j] * s[k];
            dw[8][j * H + k] += v;
            dw[8][k * H + j] -= v;
        }
    for (int64_t k = 0; k < H; ++k) {
        REAL r = SFX(sig)(g[H + k]);
        REAL dr = ds[k] * h[k];
        dh[k] += ds[k] * r;
        dar[k] = dr * r * SFX(sig)(-g[H + k]);
    }
    /* (weight, bias, recurrent weight or NULL, pre-activation gradient) */
    const REAL *Wx[3] = {W_z, W_r, V_h};
    const REAL *Uh[3] = {U_z, U_r, NULL};
    REAL *dWx[3] = {dw[0], dw[3], dw[6]}, *db[3] = {dw[1], dw[4], dw[7]};
    REAL *dUh[3] = {dw[2], dw[5], NULL};
    const REAL *da[3] = {daz, dar, dad};
    for (int q = 0; q < 3; ++q)
        for (int64_t j = 0; j < H; ++j) {
            REAL a = da[q][j];
            db[q][j] += a;
            for (int64_t i = 0; i < Il; ++i) {
                dWx[q][j * Il + i] += a * x[i];
                if (dx) dx[i] += Wx[q][j * Il + i] * a;
            }
            if (Uh[q])
                for (int64_t k = 0; k < H; ++k) {
                    dUh[q][j * H + k] += a * h[k];
                    dh[k] += Uh[q][j * H + k] * a;
                }
        }
    memcpy(gh, dh, (size_t)H * sizeof(REAL));
}

void SFX(ref_rnn_backward)(const ref_rnn_cfg *c, const REAL *x, const REAL *h0,
                           const REAL *const *w, const int32_t *lengths, const REAL *dy,
                           const REAL *dhn, REAL *dx, REAL *dh0, REAL *const *dw) {
    const int L = c->L, D = c->D, nw = ref_rnn_group_size(c), NW = ref_rnn_num_weights(c);
    const int64_t T = c->T, B = c->B, H = c->H, DH = (int64_t)D * H;
    SFX(tape) tp;
    SFX(run_forward)(c, x, h0, w, lengths, &tp, NULL, NULL);

    REAL **gw = calloc((size_t)NW, sizeof *gw);
    for (int k = 0; k < NW; ++k)
        gw[k] = SFX(zalloc)(ref_rnn_weight_desc(c, k, NULL, 0, NULL, NULL));
    REAL *gh = SFX(zalloc)(H), *scratch = SFX(zalloc)(7 * H);

    /* dout: gradient w.r.t. the current layer's output, logical [T][B][DH]. */
    REAL *dout = SFX(zalloc)(T * B * DH);
    if (dy)
        for (int64_t t = 0; t < T; ++t)
            for (int64_t b = 0; b < B; ++b)
                memcpy(dout + (t * B + b) * DH, dy + SFX(row)(c, t, b) * DH,
                       (size_t)DH * sizeof(REAL));

    for (int l = L - 1; l >= 0; --l) {
        const int64_t Il = ref_rnn_layer_input(c, l);
        REAL *din = SFX(zalloc)(T * B * Il);
        for (int d = 0; d < D; ++d) {
            const int grp = l * D + d;
            const REAL *const *wg = w + grp * nw;
            REAL *const *dwg = gw + grp * nw;
            for (int64_t b = 0; b < B; ++b) {
                const int64_t len = SFX(len)(c, lengths, b);
                for (int64_t k = 0; k < H; ++k) gh[k] = dhn ? dhn[(grp * B + b) * H + k] : (REAL)0;
                for (int64_t s = len - 1; s >= 0; --s) {
                    const int64_t t = d == 0 ? s : len - 1 - s, tb = t * B + b;
                    for (int64_t k = 0; k < H; ++k) gh[k] += dout[tb * DH + d * H + k];
                    if (c->cell == REF_GRU)
                        SFX(gru_step_bwd)(c, wg, dwg, tp.in[l] + tb * Il, Il,
                                          tp.hprev[grp] + tb * H, tp.gates[grp] + tb * 4 * H, gh,
                                          din + tb * Il, scratch);
                    else
                        SFX(agru_step_bwd)(c, wg, dwg, tp.A[l], tp.in[l] + tb * Il, Il,
                                           tp.hprev[grp] + tb * H, tp.gates[grp] + tb * 3 * H,
                                           gh, din + tb * Il, scratch);
                }
                if (dh0) memcpy(dh0 + (grp * B + b) * H, gh, (size_t)H * sizeof(REAL));
            }
        }
        if (l > 0) { /* through layer l-1's dropout; Il == DH here */
            for (int64_t t = 0; t < T; ++t)
                for (int64_t b = 0; b < B; ++b)
                    for (int64_t j = 0; j < DH; ++j)
                        dout[(t * B + b) * DH + j] =
                            din[(t * B + b) * DH + j] * SFX(mask)(c, l - 1, t, b, j);
        } else if (dx) {
            for (int64_t t = 0; t < T; ++t)
                for (int64_t b = 0; b < B; ++b)
                    memcpy(dx + SFX(row)(c, t, b) * c->I, din + (t * B + b) * c->I,
                           (size_t)c->I * sizeof(REAL));
        }
        free(din);
    }
    for (int k = 0; k < NW; ++k) {
        if (dw && dw[k])
            memcpy(dw[k], gw[k],
                   (size_t)ref_rnn_weight_desc(c, k, NULL, 0, NULL, NULL) * sizeof(REAL));
        free(gw[k]);
    }
    free(gw); free(gh); free(scratch); free(dout);
    SFX(tape_free)(c, &tp);
}

#endif /* REF_RNN_BODY */

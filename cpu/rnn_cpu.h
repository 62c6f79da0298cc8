/* Private helpers of the CPU GRU / A-GRU backend (cpu/rnn_fwd.c, cpu/rnn_bwd.c): the layout of
 * the workspace and the reserve, the per-cell weight view, work partitioning and the vectorisable
 * activations. Math and derivations: docs/ops/rnn.md.
 *
 * Rows. Every [T*B, .] buffer of a call, ours and the caller's, stores row (t, b) at
 * r(t, b) = t*ts + b*bs, with (ts, bs) = (B, 1), or (1, T) when batch_first: the caller's x, y,
 * dy, dx are used in place and the whole-sequence GEMMs run over T*B contiguous rows.
 *
 * Threads. The recurrence is split into `ns` slices of batch rows (ns = min(num_threads, B));
 * a slice keeps its rows for the whole sequence, so a forward or backward step needs no barrier.
 * An OpenMP team of any size runs slices tid, tid + nthreads, ..., so results never depend on how
 * many threads the runtime actually granted.
 *
 * Reserve (training forward -> backward), per cell c = l*D + d, N = T*B rows:
 *   hp[c]    [N, H]     state before step t of row (t, b) (h0 at the first step)
 *   gates[c] [N, NG*H]  GRU (NG = 4): r, z, n, W_hn h + b_hn; A-GRU (NG = 3): z, r, d
 *            (rows with t >= len[b] are not written and never read)
 *   out[l]   [N, D*H]   layer l < L-1 output after dropout = layer l+1's input
 * Workspace (shared by forward and backward; scratch, nothing survives a call):
 *   pack[l]  A-GRU only: W3 = [W_z; W_r; V_h] [3H, I_l], b3 = [b_z; b_r; b_h], U2 = [U_z; U_r]
 *            [2H, H], A = W_h - W_h^T - gamma I [H, H]
 *   big[0]   [N, 3H]  forward: input projection of direction 0; backward: dG_x (input-side
 *                     pre-activation gradients)
 *   big[1]   [N, 3H]  forward: projection of direction 1; backward GRU: dG_h (recurrent-side);
 *                     backward A-GRU: q = r*h [N, H]
 *   seq[2]   [N, D*H] (L > 1) forward inference: layer outputs; backward: d(layer output)
 *   slice[s] per slice: st [nb, H], t3 [nb, 3H], t1 [nb, H], t2 [nb, H], row [H]
 *   gmat     A-GRU backward: G = sum dpre_d^T q [H, H]
 *   epsacc   A-GRU backward: per-slice partial sums of d loss / d eps (double) */
#ifndef KF_CPU_RNN_CPU_H
#define KF_CPU_RNN_CPU_H

#include "counter_rng.h"
#include "rnn_internal.h"

#include <math.h>
#include <string.h>

/* When the build's baseline lacks AVX2 (KF_CPU_ARCH empty), the pointwise kernels get an AVX2
 * clone chosen at load time where the CPU has it. `flatten` inlines the activations into each
 * clone (a plain inline helper compiled for the baseline could not be inlined into it). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__AVX2__)
#define KF__VEC_CLONES __attribute__((target_clones("avx2", "default"), flatten))
#else
#define KF__VEC_CLONES
#endif

typedef struct kf__rnn_cpu_layout {
    int64_t T, B, N, H, D;
    int64_t ts, bs;      /* row strides of (t, b) */
    int32_t ns;          /* batch slices */
    int64_t nbmax;       /* rows of the largest slice */
    int32_t ng;          /* gate vectors saved per row: 4 (GRU) or 3 (A-GRU) */
    bool agru;
    /* workspace offsets (bytes) */
    size_t pack_first, pack_stride; /* pack[l] at l ? pack_first + (l-1)*pack_stride : 0 */
    size_t big[2], seq[2], slice0, slice_bytes, gmat, epsacc, ws_bytes;
    /* reserve offsets (bytes) */
    size_t cell_bytes, hp_bytes, out0, out_bytes, reserve_bytes;
} kf__rnn_cpu_layout;

/* Runs fn(arg, tid, nth) on a team of `ns` threads, or directly in the caller when ns == 1:
 * libgomp allocates a fresh team for every one-thread parallel region, and a steady-state call
 * must not allocate (the barriers in `fn` are no-ops outside a parallel region). */
void kf__rnn_cpu_team(int32_t ns, void (*fn)(void *arg, int tid, int nth), void *arg);

/* Fills `lo` for a call of T steps over B samples. `training` adds the reserve. */
void kf__rnn_cpu_layout_init(kf__rnn_cpu_layout *lo, const struct kf_rnn_plan *p, int64_t T,
                             int64_t B, bool training);

/* The weights of cell (l, d) as the kernels use them. GRU: w3 = weight_ih, b3 = bias_ih,
 * wrec = weight_hh [3H, H], brec = bias_hh; gate blocks r, z, n. A-GRU: the packed copies of the
 * workspace, gate blocks z, r, d; wrec = [U_z; U_r] [2H, H], brec = NULL, a = A. */
typedef struct kf__rnn_cell {
    const float *w3, *b3, *wrec, *brec, *a;
    float eps;
    int64_t in; /* I_l */
} kf__rnn_cell;

kf__rnn_cell kf__rnn_cpu_cell(const kf__rnn_cpu_layout *lo, const struct kf_rnn_plan *p,
                              const float *const *w, void *ws, int32_t l, int32_t d);

/* A-GRU: thread `tid` of `nth` does its share of packing every layer's W3, b3, U2 and A into the
 * workspace (the caller puts a barrier after it). No-op for a GRU. */
void kf__rnn_cpu_pack(const kf__rnn_cpu_layout *lo, const struct kf_rnn_plan *p,
                      const float *const *w, void *ws, int tid, int nth);

/* Dropout between layers: element j of row (t, b) of layer l's output has counter
 * base + ((l*T + t)*B + b)*D*H + j (rnn_internal.h). */
typedef struct kf__rnn_drop {
    bool on;
    float p, scale;
    uint64_t seed, base;
} kf__rnn_drop;

/* dst[0:n] = src masked and scaled for the element counters c0 .. c0+n-1 when `dr` is on, else a
 * copy; src NULL reads zeros. */
void kf__rnn_cpu_drop_row(float *restrict dst, const float *restrict src, int64_t n,
                          const kf__rnn_drop *dr, uint64_t c0);

/* Counter of element 0 of direction d's half of row (t, b), layer l. */
static inline uint64_t kf__rnn_drop_counter(const kf__rnn_cpu_layout *lo, const kf__rnn_drop *dr,
                                            int32_t l, int64_t t, int64_t b, int32_t d) {
    return dr->base + (uint64_t)((((int64_t)l * lo->T + t) * lo->B + b) * lo->D * lo->H +
                                 (int64_t)d * lo->H);
}

static inline void *kf__at(void *base, size_t off) { return (char *)base + off; }
static inline const void *kf__cat(const void *base, size_t off) { return (const char *)base + off; }

static inline int64_t kf__rnn_row(const kf__rnn_cpu_layout *lo, int64_t t, int64_t b) {
    return t * lo->ts + b * lo->bs;
}

/* [lo, hi) of part i of n items split into `parts` near-equal parts. */
static inline void kf__part(int64_t n, int64_t parts, int64_t i, int64_t *lo, int64_t *hi) {
    *lo = n * i / parts;
    *hi = n * (i + 1) / parts;
}

/* Valid steps of sample b: t < len(b). */
static inline int64_t kf__rnn_len(const int32_t *lengths, int64_t T, int64_t b) {
    return lengths ? (int64_t)lengths[b] : T;
}

/* Per-slice scratch of slice s. */
typedef struct kf__rnn_slice {
    int64_t b0, nb;
    float *st, *t3, *t1, *t2, *row;
} kf__rnn_slice;

static inline kf__rnn_slice kf__rnn_cpu_slice(const kf__rnn_cpu_layout *lo, void *ws, int32_t s) {
    kf__rnn_slice sl;
    int64_t b1;
    kf__part(lo->B, lo->ns, s, &sl.b0, &b1);
    sl.nb = b1 - sl.b0;
    char *p = (char *)ws + lo->slice0 + (size_t)s * lo->slice_bytes;
    size_t h = kf__align_up((size_t)(lo->nbmax * lo->H) * sizeof(float));
    size_t h3 = kf__align_up((size_t)(lo->nbmax * 3 * lo->H) * sizeof(float));
    sl.st = (float *)p;
    sl.t3 = (float *)(p + h);
    sl.t1 = (float *)(p + h + h3);
    sl.t2 = (float *)(p + 2 * h + h3);
    sl.row = (float *)(p + 3 * h + h3);
    return sl;
}

/* ---- activations ----------------------------------------------------------------------------
 * Branch-free so that loops over them vectorise (selects are bit masks: a ternary on computed
 * floats would be kept as a branch under -ftrapping-math). Evaluated in double and rounded once,
 * so sigmoid and tanh are within about 0.5 ulp of float: the gradients' cancelling sums (d eps)
 * amplify any activation error, and float-only formulas (~2 ulp) measurably loosened them. */
/* a*b + c, fused where the build targets FMA hardware (ISO C mode never contracts on its own). */
#ifdef __FMA__
#define KF__FMA(a, b, c) fmaf((a), (b), (c))
#else
#define KF__FMA(a, b, c) ((a) * (b) + (c))
#endif

static inline double kf__bits_select_d(bool c, double a, double b) {
    int64_t m = -(int64_t)c, ia, ib, r;
    memcpy(&ia, &a, 8);
    memcpy(&ib, &b, 8);
    r = (ia & m) | (ib & ~m);
    double f;
    memcpy(&f, &r, 8);
    return f;
}

/* exp(-min(|x|, 87)): n = round(t / ln 2) by the 1.5 * 2^52 shifter (its low mantissa bits then
 * hold n), r = t - n ln 2 in [-0.35, 0.35], degree-8 Taylor (error < 1e-10), scaled by 2^n
 * through the exponent bits. */
static inline double kf__exp_neg_abs(float x) {
    int32_t u;
    memcpy(&u, &x, 4);
    u &= 0x7fffffff;
    u = u < 0x42ae0000 ? u : 0x42ae0000; /* min(|x|, 87) on the bit patterns */
    float a;
    memcpy(&a, &u, 4);
    const double shifter = 6755399441055744.0;
    double t = -(double)a;
    double nb = t * 1.4426950408889634 + shifter;
    double n = nb - shifter;
    double r = (t - n * 0.6931471805598903) - n * 5.497923018708371e-14;
    double q = 1.0 / 40320;
    q = q * r + 1.0 / 5040;
    q = q * r + 1.0 / 720;
    q = q * r + 1.0 / 120;
    q = q * r + 1.0 / 24;
    q = q * r + 1.0 / 6;
    q = q * r + 0.5;
    q = q * r + 1.0;
    q = q * r + 1.0;
    int64_t ib, iq;
    memcpy(&ib, &nb, 8);
    memcpy(&iq, &q, 8);
    iq += (ib - (int64_t)0x4338000000000000) * ((int64_t)1 << 52); /* q * 2^n, n in [-126, 0] */
    memcpy(&q, &iq, 8);
    return q;
}

static inline float kf__sigmoid(float x) {
    double e = kf__exp_neg_abs(x);
    double s = 1.0 / (1.0 + e);
    return (float)(s * kf__bits_select_d(x >= 0.0f, 1.0, e)); /* x < 0: e / (1 + e) */
}

static inline float kf__tanh(float x) {
    double e = kf__exp_neg_abs(2.0f * x);
    double t = copysign((1.0 - e) / (1.0 + e), (double)x);
    return (float)kf__bits_select_d(fabsf(x) < 0x1p-12f, (double)x, t); /* 1 - e cancels */
}

#endif /* KF_CPU_RNN_CPU_H */

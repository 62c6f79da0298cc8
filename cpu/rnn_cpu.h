/* Private helpers of the CPU GRU / A-GRU backend (cpu/rnn_fwd.c, cpu/rnn_bwd.c; float64:
 * cpu/rnn_f64.c): the layout of the workspace and the reserve, the per-cell weight view, work
 * partitioning and the vectorisable activations. Math and derivations: docs/ops/rnn.md.
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
 *   pack[l]  A-GRU only: W3 = [W_z; W_r; V_h] [3H, I_l], b3 = [b_z; b_r; b_h]
 *   rec[c]   per cell: the recurrent weights as micro-kernel panels (kf__mk), packed once per
 *            call: forward pk[0] = W_hh^T gated r,z,n (GRU) or [U_z; U_r]^T gated z,r (A-GRU),
 *            pk[1] = A^T (A-GRU); backward pk[0] = W_hh (GRU) or [U_z; U_r] (A-GRU), pk[1] = A
 *   big[0]   [N, 3H]  forward: direction 0's input projection of one step, slice s in rows
 *                     b0.. of its own; backward: dG_x (input-side pre-activation gradients)
 *   big[1]   [N, 3H]  forward: the same for direction 1; backward GRU: dG_h (recurrent-side);
 *                     backward A-GRU: q = r*h [N, H]
 *   seq[2]   [N, D*H] (L > 1) forward inference: layer outputs; backward: d(layer output)
 *   slice[s] per slice: st, t1, t2, each [nb, H]
 *   gmat     A-GRU backward: G = sum dpre_d^T q [H, H]
 *   epsacc   A-GRU backward: per-slice partial sums of d loss / d eps (double)
 * A float64 plan (cpu/rnn_f64.c) has the same layout in doubles, except: no pack (its GEMMs read
 * the caller's weights in place), and rec[c] is A = W_h - W_h^T - gamma I [H, H] for an A-GRU,
 * nothing for a GRU; big[0] holds the input projection of all rows of the direction in flight,
 * big[1] the slices' recurrent products of one step. */
#ifndef KF_CPU_RNN_CPU_H
#define KF_CPU_RNN_CPU_H

#include "counter_rng.h"
#include "cpu_backend.h"
#include "team.h"

#include <math.h>
#include <string.h>

/* The op table's entries (cpu/rnn_layout.c, rnn_fwd.c, rnn_bwd.c; the plan's dtype picks float32
 * or float64, cpu/rnn_f64.c). */
void kf__cpu_rnn_sizes(const struct kf_rnn_plan *p, int64_t T, int64_t B, bool training,
                       size_t *ws_bytes, size_t *reserve_bytes);
kf_status kf__cpu_rnn_forward(kf_context *ctx, const kf__rnn_fwd *c);
kf_status kf__cpu_rnn_backward(kf_context *ctx, const kf__rnn_bwd *c);
kf_status kf__cpu_rnn_forward_f64(kf_context *ctx, const kf__rnn_fwd *c);
kf_status kf__cpu_rnn_backward_f64(kf_context *ctx, const kf__rnn_bwd *c);
#ifdef __FMA__
#include <immintrin.h>
#endif

/* When the build's baseline lacks AVX2 (KF_CPU_ARCH empty), the kernels get an x86-64-v3 (AVX2 +
 * FMA) clone chosen at load time where the CPU has it. `flatten` inlines the vector helpers into
 * each clone. KF__MK_CLONES, for the functions around the micro-kernel, adds `fp-contract=fast`
 * so the clone fuses kf__v8_fma's a*b+c (the preprocessor cannot see the clone's FMA, and ISO C
 * mode never contracts on its own); the pointwise passes keep their exact rounding. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__AVX2__)
#define KF__VEC_CLONES __attribute__((target_clones("arch=x86-64-v3", "default"), flatten))
#define KF__MK_CLONES                                                                           \
    __attribute__((target_clones("arch=x86-64-v3", "default"), flatten,                         \
                   optimize("fp-contract=fast")))
#else
#define KF__VEC_CLONES
#define KF__MK_CLONES
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
    size_t rec, rec_bytes, rec_pk1; /* rec[c] at rec + c*rec_bytes; its pk[1] rec_pk1 after it */
    size_t big[2], seq[2], slice0, slice_bytes, slice_buf, gmat, epsacc, ws_bytes;
    /* reserve offsets (bytes) */
    size_t cell_bytes, hp_bytes, out0, out_bytes, reserve_bytes;
} kf__rnn_cpu_layout;

/* Fills `lo` for a call of T steps over B samples. `training` adds the reserve. */
void kf__rnn_cpu_layout_init(kf__rnn_cpu_layout *lo, const struct kf_rnn_plan *p, int64_t T,
                             int64_t B, bool training);

/* The weights of cell (l, d) as the kernels use them. GRU: w3 = weight_ih, b3 = bias_ih,
 * brec = bias_hh; gate blocks r, z, n. A-GRU: the packed copies of the workspace, gate blocks
 * z, r, d; brec = NULL. pk: the recurrent panels of the workspace (rec[c] above), for the
 * direction of the call that packed them. */
typedef struct kf__rnn_cell {
    const float *w3, *b3, *brec, *pk[2];
    float eps;
    int64_t in; /* I_l */
} kf__rnn_cell;

kf__rnn_cell kf__rnn_cpu_cell(const kf__rnn_cpu_layout *lo, const struct kf_rnn_plan *p,
                              const void *const *w, void *ws, int32_t l, int32_t d);

/* Thread `tid` of `nth` does its share of packing, for a forward (bwd false) or a backward call,
 * every cell's recurrent panels and, for an A-GRU, every layer's W3 and b3 into the workspace
 * (the caller puts a barrier after it). */
void kf__rnn_cpu_pack(const kf__rnn_cpu_layout *lo, const struct kf_rnn_plan *p,
                      const void *const *w, void *ws, bool bwd, int tid, int nth);

/* Dropout between layers: element j of row (t, b) of layer l's output has counter
 * base + ((l*T + t)*B + b)*D*H + j (core/rnn_backend.h). */
typedef struct kf__rnn_drop {
    bool on;
    float p, scale;
    uint64_t seed, base;
} kf__rnn_drop;

/* dst[0:n] = src masked and scaled for the element counters c0 .. c0+n-1 when `dr` is on, else a
 * copy; src NULL reads zeros. The float64 form scales by 1 / (1 - p) in float64. */
void kf__rnn_cpu_drop_row(float *restrict dst, const float *restrict src, int64_t n,
                          const kf__rnn_drop *dr, uint64_t c0);
void kf__rnn_cpu_drop_row_f64(double *restrict dst, const double *restrict src, int64_t n,
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

/* Per-slice scratch of slice s: three [nbmax, H] buffers (kf__rnn_slice_buf: buffer i of slice
 * s, in the plan's dtype). */
typedef struct kf__rnn_slice {
    int64_t b0, nb;
    float *st, *t1, *t2;
} kf__rnn_slice;

/* Batch rows [*b0, *b0 + *nb) of slice s. */
static inline void kf__rnn_slice_rows(const kf__rnn_cpu_layout *lo, int32_t s, int64_t *b0,
                                      int64_t *nb) {
    int64_t b1;
    kf__part(lo->B, lo->ns, s, b0, &b1);
    *nb = b1 - *b0;
}

static inline void *kf__rnn_slice_buf(const kf__rnn_cpu_layout *lo, void *ws, int32_t s, int i) {
    return (char *)ws + lo->slice0 + (size_t)s * lo->slice_bytes + (size_t)i * lo->slice_buf;
}

static inline kf__rnn_slice kf__rnn_cpu_slice(const kf__rnn_cpu_layout *lo, void *ws, int32_t s) {
    kf__rnn_slice sl;
    kf__rnn_slice_rows(lo, s, &sl.b0, &sl.nb);
    sl.st = kf__rnn_slice_buf(lo, ws, s, 0);
    sl.t1 = kf__rnn_slice_buf(lo, ws, s, 1);
    sl.t2 = kf__rnn_slice_buf(lo, ws, s, 2);
    return sl;
}

/* ---- 8-wide float vectors ---------------------------------------------------------------------
 * GCC vector extensions, so the kernels compile for any target (on x86-64-v3 one kf__v8 is one ymm
 * register); only the fused multiply-add needs the intrinsic (ISO C mode never contracts a*b+c).
 * Full speed needs the build's -march to have FMA; otherwise the KF__VEC_CLONES functions run
 * an AVX2 clone with separate multiply and add. */
#pragma GCC diagnostic ignored "-Wpsabi" /* helpers taking kf__v8 are always inlined: */
#define KF__VINLINE static inline __attribute__((always_inline))
typedef float kf__v8 __attribute__((vector_size(32)));
typedef int32_t kf__v8i __attribute__((vector_size(32)));

/* A broadcast written as vector + scalar: the element-list form is SLP-vectorised in the v3
 * clone into lane inserts across the kernel's rows instead of one vbroadcastss. */
KF__VINLINE kf__v8 kf__v8_set1(float x) { return (kf__v8){0} + x; }

/* *p in every lane, for the micro-kernel's inner loop: with AVX one vbroadcastss from memory, a
 * pure load. kf__v8_set1 of a variable costs an FP add (0 + x, which IEEE signed zeros keep) and
 * a register broadcast, two FP-port uops per row beside the FMAs (30% of the A-GRU forward's
 * time, 20% of the GRU's); GCC forms neither the memory broadcast from a plain load nor keeps the accumulators in
 * registers around _mm256_broadcast_ss, hence the asm. */
KF__VINLINE kf__v8 kf__v8_bcast(const float *p) {
#if defined(__AVX__) && defined(__GNUC__)
    kf__v8 v;
    __asm__("vbroadcastss %1, %0" : "=x"(v) : "m"(*p));
    return v;
#else
    return kf__v8_set1(*p);
#endif
}

KF__VINLINE kf__v8 kf__v8_load(const float *p) {
    kf__v8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The first n <= 8 floats at p, zeros after them (never reads past p + n). */
KF__VINLINE kf__v8 kf__v8_load_n(const float *p, int n) {
    if (n == 8) return kf__v8_load(p);
    kf__v8 v = kf__v8_set1(0.0f);
    memcpy(&v, p, (size_t)n * sizeof(float));
    return v;
}

/* The first n <= 8 lanes of v to p (n == 8, every column tile but a ragged last one, is one
 * store; a variable-length memcpy would be a library call). */
KF__VINLINE void kf__v8_store_n(float *p, kf__v8 v, int n) {
    if (n == 8)
        memcpy(p, &v, sizeof v);
    else
        memcpy(p, &v, (size_t)n * sizeof(float));
}

KF__VINLINE kf__v8 kf__v8_fma(kf__v8 a, kf__v8 b, kf__v8 c) {
#ifdef __FMA__
    return (kf__v8)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
    return a * b + c;
#endif
}

/* m ? a : b per lane, m from a vector comparison (all ones or zero). */
KF__VINLINE kf__v8 kf__v8_select(kf__v8i m, kf__v8 a, kf__v8 b) {
    return (kf__v8)((m & (kf__v8i)a) | (~m & (kf__v8i)b));
}

KF__VINLINE kf__v8 kf__v8_abs(kf__v8 x) { return (kf__v8)((kf__v8i)x & 0x7fffffff); }

/* ---- activations ----------------------------------------------------------------------------
 * float32 throughout, within 2 ulp of the exact function (checked against double on a dense
 * sweep, docs/ops/rnn.md). NaN in gives NaN out; large |x| saturates without overflow. */

/* exp(-a) for a >= 0 or NaN: a is clamped to 87 (NaN kept: a NaN fails a >= 87), so 2^n stays
 * normal. Cody-Waite: n = round(-a / ln 2) by the 1.5 * 2^23 shifter (whose low mantissa bits then
 * hold n), r = -a - n ln 2 in [-ln2/2, ln2/2] with ln 2 split in two so n ln2_hi is exact,
 * exp(r) = 1 + r + r^2 P(r) with Cephes' degree-5 minimax P (expf, < 1 ulp), scaled by 2^n
 * through a multiply (a NaN polynomial stays NaN whatever the bits of n). */
KF__VINLINE kf__v8 kf__v8_exp_neg(kf__v8 a) {
    const kf__v8 big = kf__v8_set1(87.0f), shifter = kf__v8_set1(12582912.0f);
    a = kf__v8_select(a >= big, big, a);
    const kf__v8 t = -a;
    const kf__v8 nb = kf__v8_fma(t, kf__v8_set1(1.44269504088896341f), shifter);
    const kf__v8 n = nb - shifter;
    kf__v8 r = kf__v8_fma(n, kf__v8_set1(-0.693359375f), t);
    r = kf__v8_fma(n, kf__v8_set1(2.12194440e-4f), r);
    kf__v8 q = kf__v8_set1(1.9875691500e-4f);
    q = kf__v8_fma(q, r, kf__v8_set1(1.3981999507e-3f));
    q = kf__v8_fma(q, r, kf__v8_set1(8.3334519073e-3f));
    q = kf__v8_fma(q, r, kf__v8_set1(4.1665795894e-2f));
    q = kf__v8_fma(q, r, kf__v8_set1(1.6666665459e-1f));
    q = kf__v8_fma(q, r, kf__v8_set1(5.0000001201e-1f));
    q = kf__v8_fma(q, r * r, r + 1.0f);
    const kf__v8i scale = ((kf__v8i)nb - (kf__v8i)shifter + 127) << 23; /* 2^n, n in [-126, 0] */
    return q * (kf__v8)scale;
}

/* q = e / (1 + e), e = exp(-|x|): sigmoid(x) = q for x < 0 and 1 - q for x >= 0. No cancellation,
 * and near saturation (x >> 0) the only rounding left is that of 1 - q, so sigmoid(x) is within
 * about half an ulp there: the backward's z (1 - z) is then as exact as float32 allows. */
KF__VINLINE kf__v8 kf__v8_sigmoid(kf__v8 x) {
    const kf__v8 e = kf__v8_exp_neg(kf__v8_abs(x));
    const kf__v8 q = e / (1.0f + e);
    return kf__v8_select(x >= 0.0f, 1.0f - q, q);
}

/* |x| < 0.625: Cephes' odd minimax polynomial (tanhf); else 1 - 2e / (1 + e), e = exp(-2|x|)
 * <= 0.287: near saturation the only rounding left is that of the final subtraction, so |d| is
 * within about half an ulp of tanh and the backward's 1 - d^2 (which cancels there) keeps the
 * accuracy a correctly rounded tanhf would give it. Sign restored from x. */
KF__VINLINE kf__v8 kf__v8_tanh(kf__v8 x) {
    const kf__v8 ax = kf__v8_abs(x);
    const kf__v8 e = kf__v8_exp_neg(ax + ax);
    const kf__v8 big = 1.0f - (e + e) / (1.0f + e);
    const kf__v8 z = x * x;
    kf__v8 p = kf__v8_set1(-5.70498872745e-3f);
    p = kf__v8_fma(p, z, kf__v8_set1(2.06390887954e-2f));
    p = kf__v8_fma(p, z, kf__v8_set1(-5.37397155531e-2f));
    p = kf__v8_fma(p, z, kf__v8_set1(1.33314422036e-1f));
    p = kf__v8_fma(p, z, kf__v8_set1(-3.33332819422e-1f));
    const kf__v8 small = kf__v8_fma(p * z, ax, ax);
    const kf__v8 t = kf__v8_select(ax < 0.625f, small, big);
    return (kf__v8)((kf__v8i)t | ((kf__v8i)x & INT32_MIN));
}

/* ---- the register-blocked micro-kernel ------------------------------------------------------
 * Every per-step recurrent product of forward and backward, C[nb, N] = A[nb, K] B[K, N], goes
 * through kf__mk with B packed once per call into panels (kf__rnn_cpu_pack): panel p holds, for
 * each k, its nv * 8 columns contiguously (vector v of the panel = 8 columns; which ones is the
 * packing's business: with gates, vector v is gate v of the same 8 columns, so an epilogue sees
 * r, z and n of one column together). kf__mk computes an mr x (nv * 8) tile of C in mr * nv
 * vector accumulators (at most 12 of the 16 ymm registers, leaving nv for B and one for the
 * broadcast A element): per k, nv loads of B (one cache line at nv = 2), mr broadcasts of A and
 * mr * nv FMAs. The tile is handed to the caller's epilogue in registers; C is never stored.
 * Rows past `mr` (the slice's last, partial block) repeat row mr-1, and the epilogue drops them.
 * MR and NV must be compile-time constants at the call site (the loops unroll, and acc stays in
 * registers). */
#define KF__MR_MAX 6
#define KF__NV_MAX 3

KF__VINLINE void
kf__mk(const int MR, const int NV, int64_t K, const float *a, int64_t lda, int64_t mr,
       const float *restrict bp, kf__v8 acc[KF__MR_MAX * KF__NV_MAX]) {
    const float *ap[KF__MR_MAX];
    for (int i = 0; i < MR; i++) ap[i] = a + (i < mr ? i : mr - 1) * lda;
    /* c: constant indices only, so it lives in registers across the asm of kf__v8_bcast */
    kf__v8 c[KF__MR_MAX * KF__NV_MAX];
    for (int i = 0; i < MR * NV; i++) c[i] = kf__v8_set1(0.0f);
    for (int64_t k = 0; k < K; k++, bp += NV * 8) {
        kf__v8 b[KF__NV_MAX];
        for (int v = 0; v < NV; v++) b[v] = kf__v8_load(bp + v * 8);
        for (int i = 0; i < MR; i++) {
            const kf__v8 x = kf__v8_bcast(ap[i] + k);
            for (int v = 0; v < NV; v++) c[i * NV + v] = kf__v8_fma(x, b[v], c[i * NV + v]);
        }
    }
    for (int i = 0; i < MR * NV; i++) acc[i] = c[i];
}

/* Columns of vector v of panel p: its first column, and how many of its 8 lie before hc (the
 * columns per gate). Gated panels (ng > 1) hold gate v of columns 8p..; plain ones columns
 * 8(p*nv + v).. */
KF__VINLINE int64_t kf__panel_col(int ng, int nv, int64_t p, int v) {
    return ng > 1 ? 8 * p : 8 * (p * nv + v);
}
KF__VINLINE int kf__cols_left(int64_t j0, int64_t hc) {
    return hc - j0 >= 8 ? 8 : hc - j0 > 0 ? (int)(hc - j0) : 0;
}
/* Panels of a product whose B has ng gates of hc columns each, nv vectors per panel. */
KF__VINLINE int64_t kf__num_panels(int ng, int nv, int64_t hc) {
    return ng > 1 ? (hc + 7) / 8 : (hc + 8 * nv - 1) / (8 * nv);
}

#endif /* KF_CPU_RNN_CPU_H */

/* The CPU KAN kernels' shared declarations (private to cpu/kan_*): blocking constants, the vector
 * helpers, the storage accessors, the call geometry (kan_geom: computed by cpu/kan_linear.c),
 * row blocks, the float32 exp and the B-spline instances. The design is described at the top of
 * cpu/kan_linear.c; the kernels are in cpu/kan_tiles.h (dense path: basis tiles, rows in and
 * out), cpu/kan_window.h (windowed path), cpu/kan_forward.h and cpu/kan_backward.h (one
 * thread's share of a call), each compiled once per compute type by cpu/kan_linear.c. */
#ifndef KF_CPU_KAN_CPU_H
#define KF_CPU_KAN_CPU_H

#include "blas.h"
#include "bspline.h"
#include "cpu_backend.h"
#include "host.h"
#include "lowp_simd.h"
#include "rowgemm.h"
#include "simd.h"
#include "team.h"

#include <float.h>
#include <math.h>
#include <string.h>
#if defined(__AVX2__) || defined(__FMA__)
#include <immintrin.h>
#endif

/* Rows per block. OpenBLAS packs the weight operand on every call, a 1/rows overhead: measured
 * here (2-core EPYC, one thread, [rows, 2304] x [2304, 256]) at 63 GFLOPS for 32 rows, 79 for
 * 128, 81 for 256 and more; 256 rows gave no measurable gain on the whole layer and halve the
 * blocks there are to share out. */
#define KF__KAN_ROWS 128
/* Columns per feature chunk, at most (at least one feature): a tile of 128 rows by 512 columns
 * is 256 KiB in float32 (512 KiB in float64). */
#define KF__KAN_COLS 512
/* Chunks wanted at least for the weight gradient, when there are enough features: it is split
 * by chunk, so fewer chunks than threads would leave threads idle. */
#define KF__KAN_MIN_CHUNKS 8
/* KANConv2d's dense forward product y^T = W A^T has `out` rows and a block's pixels as columns
 * (since the small-output path, cpu/kan_small.h, took plans of out <= 16 and k <= 8, this serves
 * the dense path's remaining small-output calls: spline orders above 8):
 * up to this many outputs it runs on kf__rowgemm (cpu/rowgemm.h: operands in place, y written
 * once) rather than BLAS, whose packing and beta pass cost more than so short a product (the
 * Convolutional-KAN paper's KKAN has 5 and 10 channels). One thread, min of 3 interleaved runs,
 * new/old forward: 1 -> 5 channels, G = 10, B=128 28x28: 0.73; B=640 13x13: 0.70; 1 -> 10: 0.81;
 * 32 -> 32, G = 5: 1.06 (hence the bound). dA^T = W^T dy^T on kf__rowgemm measured no better
 * than BLAS (forward+backward 0.85-1.02 against 0.64-0.99 with it on BLAS), so it stays there. */
#define KF__KAN_RG_OUT 16

/* The windowed path (kan_sparse_pick): output block of KF__KAN_NV vectors of 32 bytes held in
 * registers (64 floats, 32 doubles), features per group of the row-wise products, the largest
 * spline order it takes. */
#define KF__KAN_NV 8
#define KF__KAN_OB(e) (KF__KAN_NV * 32 / (e))
#define KF__KAN_FG 8
#define KF__KAN_SPARSE_KMAX 8
typedef int32_t kan_vis __attribute__((vector_size(32), __may_alias__, aligned(1))); /* 8 lanes */
typedef int32_t kan_vid __attribute__((vector_size(16), __may_alias__, aligned(1))); /* 4 lanes */

/* Per vector type (cpu/simd.h's kf__vs, kf__vd; kf__fma_X and kf__splat_X there):
 * kan_clampv_X(m, lo, hi) lane by lane and kan_gather_X(b, ix) = b[ix[lane]] (AVX2, else lane by
 * lane). MI: the intrinsics' index type; L: lanes. */
#ifdef __AVX2__
#define KF__KAN_GATHER(f, MI, VEC, L, b, ix) return (VEC)f(b, (MI)(ix), sizeof *(b))
#else
#define KF__KAN_GATHER(f, MI, VEC, L, b, ix)                                                       \
    VEC r;                                                                                         \
    for (int l = 0; l < L; ++l) r[l] = b[ix[l]];                                                   \
    return r
#endif
#define KF__KAN_VEC_DEFINE(T, X, VEC, VI, L, MI, GATHER)                                           \
    static inline VI kan_clampv_##X(VI m, VI lo, VI hi) {                                          \
        m = m & ~(m < lo);                                                                         \
        const VI over = m > hi;                                                                    \
        return (m & ~over) | (hi & over);                                                          \
    }                                                                                              \
    static inline VEC kan_gather_##X(const T *b, VI ix) {                                          \
        KF__KAN_GATHER(GATHER, MI, VEC, L, b, ix);                                                 \
    }
KF__KAN_VEC_DEFINE(float, s, kf__vs, kan_vis, 8, __m256i, _mm256_i32gather_ps)
KF__KAN_VEC_DEFINE(double, d, kf__vd, kan_vid, 4, __m128i, _mm256_i32gather_pd)

static int64_t kan_min(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t kan_max(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int32_t kan_clamp32(int32_t v, int32_t lo, int32_t hi) {
    return v < lo ? lo : v > hi ? hi : v;
}

/* ---- storage ------------------------------------------------------------------------------
 * A plan's tensors are stored in its dtype and its kernels compute in T: float64 for a float64
 * plan, float32 for every other (core/lowp.h). Per compute type (suffix s float, d double) and
 * storage kind (a compile-time constant where these are inlined): kan_get_X(kind, a, i) is
 * element i of `a` as T and kan_set_X(kind, a, i, v) stores v (rounded to nearest even for
 * bfloat16 and float16); the _n forms move n contiguous elements (8 at a time for the low types:
 * cpu/lowp_simd.h). The low types are converted where an element enters the
 * kernels (gathered into a tile, packed into the combined weight or the knot copy, or a block of
 * dy into a thread's buffer) and where a result leaves them (a block of y or dx, the folded weight
 * gradients): never as whole-tensor copies. */
/* The plan's storage type, the one thing an op table of the KAN layers stands for (kan_select,
 * cpu/kan_linear.c): its kernels compute in float64 for KAN_D, in float32 for the others, and
 * read and write the low types (KAN_B bfloat16, KAN_H float16) where a tile is loaded or a result
 * stored. Passed as a constant to the force-inlined kernels, so each instance is one kind's code.
 */
typedef enum { KAN_S, KAN_D, KAN_B, KAN_H } kan_kind;

#define KAN_INLINE static inline __attribute__((always_inline))

/* The caller's tensors are the kernels' own type (no conversion, no thread buffer). */
KAN_INLINE bool kan_direct(kan_kind kind) { return kind == KAN_S || kind == KAN_D; }

KAN_INLINE float kan_get_s(kan_kind kind, const void *a, int64_t i) {
    if (kind == KAN_S) return ((const float *)a)[i];
    return kf__lp_get(((const uint16_t *)a)[i], kind == KAN_B);
}
KAN_INLINE void kan_set_s(kan_kind kind, void *a, int64_t i, float v) {
    if (kind == KAN_S) ((float *)a)[i] = v;
    else ((uint16_t *)a)[i] = kf__lp_put(v, kind == KAN_B);
}
KAN_INLINE void kan_get_n_s(kan_kind kind, float *d, const void *a, int64_t i, int64_t n) {
    if (kind == KAN_S) memcpy(d, (const float *)a + i, (size_t)n * sizeof(float));
    else kf__lp_load_n(d, (const uint16_t *)a + i, n, kind == KAN_B);
}
KAN_INLINE void kan_set_n_s(kan_kind kind, void *a, int64_t i, const float *d, int64_t n) {
    if (kind == KAN_S) memcpy((float *)a + i, d, (size_t)n * sizeof(float));
    else kf__lp_store_n((uint16_t *)a + i, d, n, false, kind == KAN_B);
}
/* float64 is stored as float64 only (kind KAN_D) */
KAN_INLINE double kan_get_d(kan_kind kind, const void *a, int64_t i) {
    return ((const double *)a)[i];
}
KAN_INLINE void kan_set_d(kan_kind kind, void *a, int64_t i, double v) { ((double *)a)[i] = v; }
KAN_INLINE void kan_get_n_d(kan_kind kind, double *d, const void *a, int64_t i, int64_t n) {
    memcpy(d, (const double *)a + i, (size_t)n * sizeof(double));
}
KAN_INLINE void kan_set_n_d(kan_kind kind, void *a, int64_t i, const double *d, int64_t n) {
    memcpy((double *)a + i, d, (size_t)n * sizeof(double));
}

/* Everything a call derives from (plan, N, patches, direction): the path, blocking, team size
 * and the workspace layout. Workspace bytes (each term rounded up to 64; e the compute type's
 * size, 8 for a float64 plan, else 4), dense:
 *     e out K  +  e in (k + 1) nk  +  team * (e (rows Fr cw + out F cw + 2 rows Fr + rows nk)
 *                                             + 8 rows kh kw for KANConv2d's patch offsets)
 * windowed (outp = out rounded up to the panel, Fr = KF__KAN_FG, Fw = max(Fr, F)):
 *     e outp K  +  e in (k + 1) nk  +  team * (e (rows outp + outp F cw + rows (Fw + Fr)
 *                                             + rows Fw (k+2) + (rows + rl) (k+2))
 *                                             + 4 (rows Fw + 3 rl + C + 1) + 32 rows Fr
 *                                             + 8 rows kh kw)
 * with rows = min(128, L), and for a bfloat16 or float16 plan, per thread, e rows out (dense) and
 * e Cin H W (KANConv2d's backward): bounded by tiles, never by N times the bases; the query
 * answers the larger of the two directions. */
typedef struct kan_geom {
    int64_t rows;        /* rows per block: min(KF__KAN_ROWS, L) */
    int64_t L;           /* rows per image: Ho Wo (KANConv2d) or N (KANLinear: one image) */
    int64_t bpi, blocks; /* row blocks per image; in all */
    int64_t unit;        /* blocks per dx unit (one writer each): bpi (a whole image, whose
                            pixels several patches read) or 1 (KANLinear) */
    int64_t Fr, rchunks; /* features per chunk of the row-wise products (forward, dx); chunks */
    int64_t F, chunks;   /* the same for the weight gradient (F <= Fr) */
    int32_t team;        /* threads */
    size_t wc, inv, grid; /* byte offsets: W [out, K]; knot reciprocals [in, k, nk]; the knots
                             [in, nk] in T */
    size_t thr;          /* byte offset of thread 0's region; thread t's is thr + t * thr_bytes */
    size_t thr_bytes;    /* tile [Fr*cw, rows], dW [out, F*cw], x^T and dx^T [Fr, rows],
                            bases S [nk - 1, rows], clamped x [rows], patch offsets
                            [kh kw, rows] (int64, KANConv2d only), then a low plan's y or dy
                            block [rows, out] (dense path) and image dx [Cin, H, W] (KANConv2d
                            backward) */
    size_t tile, dw, xt, dxt, s, xb, off, yb, dxi; /* offsets inside a thread's region */
    /* The windowed path (kan_sparse_pick): tile is y or dy [rows, outp], dw dW^T in panels
     * [outp / OB][F cw, OB], s the window values [rows, Fw, k+2], then: */
    bool sparse;
    int64_t outp;        /* out rounded up to the output panel KF__KAN_OB(e) */
    int64_t Fw;          /* features whose windows are held at once: max(Fr, F) */
    size_t vals, sidx, win, ints, part; /* thread offsets: window values [rows, Fw, k+2] (= s),
                                           starts [rows, Fw] (int32), one feature's window
                                           [k+2, rows] and scratch [k+2, rl], int32 scratch
                                           [3 rl + cw] (rl: rows in whole vectors; the weight
                                           gradient's buckets use [0, rows) and [3 rl, 3 rl +
                                           C - k)), dx's partial sums [rows, Fr] (32-byte
                                           vectors) */
    size_t bytes;
} kan_geom;

/* Row block b: image img, its rows (output pixels) [p0, p0 + rows), global rows from n0. */
typedef struct kan_blk {
    int64_t img, p0, rows, n0;
} kan_blk;

static kan_blk kan_blk_of(const kan_geom *g, int64_t b) {
    kan_blk k;
    k.img = b / g->bpi;
    k.p0 = (b % g->bpi) * g->rows;
    k.rows = kan_min(g->rows, g->L - k.p0);
    k.n0 = k.img * g->L + k.p0;
    return k;
}

static void *kan_at(void *ws, size_t off) { return (char *)ws + off; }

/* Block k's offsets for every kernel position: tab[pos * rows + r] (kf__kan_patch_offsets). A
 * feature f = c kh kw + pos of the block reads channel c at those offsets: the table serves every
 * channel. It depends on the block's pixels (p0, rows) and the geometry only, not on its image,
 * so it is formed only when `held` (the (p0, rows) tab holds; {-1, -1} before the first block)
 * differs: once per call for a thread whose blocks are whole images (KKAN's 13x13 layer: the
 * table was 8% of its time, formed anew for each of 640 images) or the same part of each. */
static void kan_block_offsets(const kf__kan_patches *P, const kan_blk *k, int64_t *tab,
                              int64_t held[2]) {
    if (held[0] == k->p0 && held[1] == k->rows) return;
    const int64_t kk = (int64_t)P->kh * P->kw;
    for (int64_t pos = 0; pos < kk; ++pos)
        kf__kan_patch_offsets(P, pos, k->p0, k->rows, tab + pos * k->rows);
    held[0] = k->p0;
    held[1] = k->rows;
}

/* e[n] = exp(-x[n]) for n < rows, for SiLU and its derivative.
 *
 * Float32: written so that the loops vectorise (libm's expf is a call per element): Cody-Waite
 * reduction -x = k ln2 + r, |r| <= ln2/2, Cephes' degree-6 polynomial (about 1 ulp), scaled by
 * 2^k through the exponent bits. The argument -x is clamped to [-87.3, 89] first, in a loop of
 * its own (fused into the second, the compiler duplicates the tail per clamp branch and gives up
 * vectorising):
 *  - x > 87.3: 2^k stays a normal float and e comes out near 1e-38 instead of smaller; SiLU and
 *    SiLU' are x and 1 to float precision all the same;
 *  - x < -88.37: k = 128 fills the exponent field and e = +inf (exact below -88.72); SiLU and
 *    SiLU' are -0 to float precision either way;
 *  - NaN: e is finite, and the callers' formulas carry x itself, so SiLU and SiLU' are NaN. */
static void kan_exp_neg_rows_s(const float *restrict x, int64_t rows, float *restrict e) {
    for (int64_t n = 0; n < rows; ++n) {
        float v = -x[n];
        v = v > -87.3f ? v : -87.3f; /* NaN goes to -87.3: no NaN reaches the int conversion */
        v = v < 89.0f ? v : 89.0f;
        e[n] = v;
    }
    for (int64_t n = 0; n < rows; ++n) {
        const float v = e[n];
        const float k = (v * 1.44269504088896341f + 0x1.8p23f) - 0x1.8p23f; /* round to nearest */
        const float r = (v - k * 0.693359375f) - k * -2.12194440e-4f;
        float q = 1.9875691500e-4f;
        q = q * r + 1.3981999507e-3f;
        q = q * r + 8.3334519073e-3f;
        q = q * r + 4.1665795894e-2f;
        q = q * r + 1.6666665459e-1f;
        q = q * r + 5.0000001201e-1f;
        q = q * (r * r) + r + 1.0f;
        const int32_t bits = ((int32_t)k + 127) << 23;
        float scale;
        memcpy(&scale, &bits, sizeof scale);
        e[n] = q * scale;
    }
}

/* Float64: libm's exp (within an ulp; float64 is the accuracy path, not a speed target). Below
 * x = -709.8 e = +inf and SiLU, SiLU' are -0, as in float32. */
static void kan_exp_neg_rows_d(const double *restrict x, int64_t rows, double *restrict e) {
    for (int64_t n = 0; n < rows; ++n) e[n] = exp(-x[n]);
}

typedef struct kan_fwd_call {
    const kf__kan_fwd *c;
    kan_geom g;
} kan_fwd_call;

typedef struct kan_bwd_call {
    const kf__kan_bwd *c;
    kan_geom g;
} kan_bwd_call;

/* Block k's place in y or dy [N, out]: the element offset of its first row (KANLinear: rows
 * [n0, n0 + rows), row stride out) or, for KANConv2d, of its first column in the image's
 * [out, L] plane (columns [p0, p0 + rows): the block stored transposed, row stride L). *ld
 * receives the row stride. */
static int64_t kan_yoff(const kf__kan_patches *P, const kan_geom *g, int64_t out, const kan_blk *k,
                        int64_t *ld) {
    *ld = P ? g->L : out;
    return P ? k->img * out * g->L + k->p0 : k->n0 * out;
}

/* The row stride of a block's buffer in T (kan_blk_io): the windowed path's tile [rows, outp], or
 * the dense path's copy of the block stored as y stores it ([rows, out] for KANLinear, [out, rows]
 * for KANConv2d). */
static int64_t kan_buf_ld(const kf__kan_patches *P, const kan_geom *g, int64_t out,
                          const kan_blk *k) {
    return g->sparse ? g->outp : P ? k->rows : out;
}

#endif /* KF_CPU_KAN_CPU_H */

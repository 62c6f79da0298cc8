/* CPU backend of the KAN linear layer (notation of core/kan_backend.h; math in
 * docs/ops/kan.md): OpenBLAS from the context's own threads, no allocation. Two algorithms for
 * the same products, chosen per direction from the shape alone (kan_sparse_pick):
 *
 * DENSE. The layer is one product y = A W^T over the combined operand A [N, K] (per feature:
 * SiLU(x) and the C bases) and the combined weight W [out, K], which every call forms once in the
 * workspace. A is never stored for the batch: it is built in per-thread tiles of one block of
 * rows (KF__KAN_ROWS) by one chunk of features (about KF__KAN_COLS columns), stored transposed,
 * A^T [cols, rows], so that the bases are computed by branch-free loops over contiguous rows with
 * the knots as scalars (the compiler vectorises them). Each tile goes through the GEMM at once:
 *   forward   y[rows]     += A_chunk W_chunk^T          (beta = 1 after the first chunk)
 *   dx        dA_chunk     = dy[rows] W_chunk, then dx = SiLU' dA_silu + sum_c B'_c dA_c
 *   weights   dW_chunk    += dy[rows]^T A_chunk          over every row block in order, then
 *             folded into d base_weight, d spline_weight and d spline_scaler
 * The row-wise products are therefore a sum of GEMMs over K chunks rather than one GEMM over
 * all of K: the same work, no slower (the tile stays in L2 between being built and being packed
 * by OpenBLAS; against one GEMM over K = 2304 at (1024, 256, 256) on one thread, the best
 * forward of 30 calls was 17.3-17.4 ms against 17.5-17.9 ms), and the tile stays bounded
 * whatever `in` is (128 x 512 elements instead of 128 x K).
 *
 * WINDOWED. Only k + 1 of a feature's C bases are non-zero at any x (B_{j-k..j} for the span
 * t_j <= x < t_{j+1}; none outside the grid or for NaN), so A is mostly zeros: 1 - (k+2)/(C+1)
 * of the dense multiply-adds (44% at G = 5, k = 3; 64% at G = 10; 79% at G = 20). Per row block
 * and group of KF__KAN_FG features, kan_window finds each (row, feature)'s span by counting
 * knots and evaluates the k + 1 bases (or, for dx, SiLU' and the k + 1 derivatives) by the
 * triangular recurrence, O(k^2) with gathered knots instead of the dense O(C k), moved to a
 * window start s in [0, C - 1 - k] so that all k + 1 columns are real ones. W is packed
 * transposed, W^T [K, outp] in output panels of 64 floats (32 doubles) so that a group's
 * columns for one panel are contiguous and stay in L1. Then, with 8 vectors of 32 bytes of
 * outputs in registers:
 *   forward   y[n, panel] += V_silu W^T[i cw] + sum_t V_t W^T[i cw + 1 + s + t]  over the group
 *   dx        dx[n, i] = dy[n, :] . (SiLU' W^T[i cw] + sum_t B'_t W^T[i cw + 1 + s + t])
 *   weights   dW^T[i cw + c, :] += V_c dy[n, :], each thread owning a chunk of features and
 *             summing over every row block in order; within a block, per feature, the rows are
 *             bucketed by window start (counting sort), so that a bucket's rows all add into the
 *             same k + 2 columns, summed in registers and stored once per bucket; then the fold
 * These do k + 2 of the C + 1 multiply-adds, but each with a load in the forward and dx (no
 * register blocking over rows is possible there: every row has its own window), and the window
 * costs a span count and ~20 gathers per (row, feature) whatever out is. Measured on the AVX2
 * EPYC (2 cores, one thread, process CPU time, best of interleaved runs on a shared box, ms):
 * forward (1024, 1024, 1024) G = 5: 208-298 windowed (median 245 of 15 runs; 212-235 in the 3
 * interleaved with dense ones) vs 268-274 dense, and 244-285 (median 256 of 5) before this
 * file's broadcasts were single loads (a scalar add of 0 went before each); (1024, 256, 256)
 * G = 5: 16-23 windowed vs 16.5-19 dense. Backward with the bucketed weight gradient, G = 5:
 * (1024, 1024, 1024) 620-640 windowed vs 610-655 dense (a draw), (1024, 256, 256) 35-58 vs
 * 33-43; against the row-by-row weight gradient it replaced,
 * (1024, 512, 512) G = 10: 149-161 vs 177-184, G = 20: 176-180 vs 213-232. Earlier (AVX-512
 * box, AVX2 kernels against OpenBLAS's AVX-512 ones): forward (1024, 512, 512) G = 10: 63 vs
 * 104-128 dense, G = 20: 78-82 vs 162-166; at out = 64, G = 10: 13.2 vs 7.7 (the window
 * dominates), out = 128: 13.7 vs 14.3. Hence the rule in kan_sparse_pick.
 *
 * Blocks (row blocks, feature chunks and groups) and therefore every BLAS call and every sum
 * depend on the shape alone; they go round-robin to the threads and every output element has
 * one writer (the weight gradient is split by chunk, each thread summing its chunks over all
 * rows in a fixed order), so the bits do not depend on the thread count.
 *
 * KANConv2d (kf__kan_patches) is the same product over the patches of x as rows. Only the row
 * blocks' addressing changes: blocks never cross an image (a block is up to 128 output pixels of
 * one image); a block's x^T is gathered from the image (im2col per tile, zeros outside it); its
 * y and dy are the columns [p0, p0 + rows) of the image's [out, Ho Wo] plane, so the GEMMs take
 * them transposed (the windowed path copies them through a [rows, outp] buffer); and dx is a
 * scatter-add over the patches, so one thread owns each image's dx (zeroed first, then summed
 * over the image's blocks in order: deterministic).
 *
 * One implementation for both dtypes: KF__KAN_CPU_DEFINE(T, X) (dense) and
 * KF__KAN_SPARSE_DEFINE(T, X, VEC, VI) (windowed) below define the kernels for element type T
 * with the BLAS prefix X (s: float32, d: float64); one op table per storage type, which
 * kan_select picks at plan creation, runs them. Only
 * exp(-x), the FMA and the gathers differ by type (the *_s and *_d helpers). */
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
/* KANConv2d's dense forward product y^T = W A^T has `out` rows and a block's pixels as columns:
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
 * plan, float32 for every other (core/lowp.h). Per storage suffix SX (s float32, d float64,
 * b bfloat16, h float16): kan_get_SX(a, i) is element i of `a` as T and kan_set_SX(a, i, v)
 * stores v (rounded to nearest even for b and h); the _n forms move n contiguous elements (8 at a
 * time for b and h: cpu/lowp_simd.h). The low types are converted where an element enters the
 * kernels (gathered into a tile, packed into the combined weight or the knot copy, or a block of
 * dy into a thread's buffer) and where a result leaves them (a block of y or dx, the folded weight
 * gradients): never as whole-tensor copies. */
#define KF__KAN_STORE_DEFINE(T, SX, GET, SET, GETN, SETN)                                          \
    static inline __attribute__((always_inline)) T kan_get_##SX(const void *a, int64_t i) {        \
        return GET;                                                                                \
    }                                                                                              \
    static inline __attribute__((always_inline)) void kan_set_##SX(void *a, int64_t i, T v) {      \
        SET;                                                                                       \
    }                                                                                              \
    static inline void kan_get_n_##SX(T *d, const void *a, int64_t i, int64_t n) { GETN; }         \
    static inline void kan_set_n_##SX(void *a, int64_t i, const T *d, int64_t n) { SETN; }
KF__KAN_STORE_DEFINE(float, s, ((const float *)a)[i], ((float *)a)[i] = v,
                     memcpy(d, (const float *)a + i, (size_t)n * sizeof(float)),
                     memcpy((float *)a + i, d, (size_t)n * sizeof(float)))
KF__KAN_STORE_DEFINE(double, d, ((const double *)a)[i], ((double *)a)[i] = v,
                     memcpy(d, (const double *)a + i, (size_t)n * sizeof(double)),
                     memcpy((double *)a + i, d, (size_t)n * sizeof(double)))
KF__KAN_STORE_DEFINE(float, b, kf__lp_get(((const uint16_t *)a)[i], true),
                     ((uint16_t *)a)[i] = kf__lp_put(v, true),
                     kf__lp_load_n(d, (const uint16_t *)a + i, n, true),
                     kf__lp_store_n((uint16_t *)a + i, d, n, false, true))
KF__KAN_STORE_DEFINE(float, h, kf__lp_get(((const uint16_t *)a)[i], false),
                     ((uint16_t *)a)[i] = kf__lp_put(v, false),
                     kf__lp_load_n(d, (const uint16_t *)a + i, n, false),
                     kf__lp_store_n((uint16_t *)a + i, d, n, false, false))

/* Windowed (true) or dense, per direction, from the shape alone (so that the bits never depend
 * on the thread count). The windowed products do k + 2 of the C + 1 multiply-adds per (row,
 * feature, output) but with one load per multiply-add, against a register-blocked GEMM on the
 * dense side, and pay a window (span count, gathers) per (row, feature) that only a wide output
 * amortises. Measured on one thread of the 2-core EPYCs (AVX2 kernels against OpenBLAS; header
 * comment): forward, windowed ahead at (C + 1) / (k + 2) = 1.8 (G = 5, k = 3) for out = 1024,
 * a draw at 1.8 for out = 256 and ahead from ~ 2 at out >= 256; backward (with the bucketed
 * weight gradient), a draw at 1.8 for out = 1024 and 256, ahead at 2.8 (G = 10), so the
 * threshold stays at 2.5 (not measured in between); below out = 256 the dense path won at every
 * G measured. */
static bool kan_sparse_pick(const struct kf_kan_linear_plan *p, bool backward) {
    const int64_t ratio10 = 10 * p->cw / (p->k + 2); /* (C + 1) / (k + 2), in tenths */
    if (p->k > KF__KAN_SPARSE_KMAX || p->out < 256) return false;
    if (backward) return ratio10 >= 25;
    return ratio10 >= (p->out >= 512 ? 18 : 20);
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

/* The plan's storage type, the one thing an op table of this file stands for (kan_select): its
 * kernels compute in float64 for KAN_D, in float32 for the others, and read and write the low
 * types (KAN_B bfloat16, KAN_H float16) where a tile is loaded or a result stored. */
typedef enum { KAN_S, KAN_D, KAN_B, KAN_H } kan_kind;

static kan_geom kan_geom_of(const struct kf_kan_linear_plan *p, int64_t N,
                            const kf__kan_patches *patches, bool backward, kan_kind kind) {
    kan_geom g;
    memset(&g, 0, sizeof g);
    g.L = patches ? patches->Ho * patches->Wo : N;
    g.rows = kan_min(KF__KAN_ROWS, g.L);
    g.bpi = (g.L + g.rows - 1) / g.rows;
    g.blocks = g.bpi * (N / g.L);
    g.unit = patches ? g.bpi : 1;
    g.sparse = kan_sparse_pick(p, backward);
    g.Fr = g.sparse ? kan_min(p->in, KF__KAN_FG) : kan_min(p->in, kan_max(1, KF__KAN_COLS / p->cw));
    g.rchunks = (p->in + g.Fr - 1) / g.Fr;
    g.F = kan_min(kan_min(p->in, kan_max(1, KF__KAN_COLS / p->cw)),
                  (p->in + KF__KAN_MIN_CHUNKS - 1) / KF__KAN_MIN_CHUNKS);
    g.chunks = (p->in + g.F - 1) / g.F;
    /* the forward's multiply-adds, N out K, decide both directions (cpu/team.h) */
    g.team = (int32_t)kan_min(kf__cpu_team_size(p->ctx->num_threads,
                                                (double)N * (double)p->out * (double)p->K),
                              kan_max(g.blocks, g.chunks));
    const size_t e = kind == KAN_D ? sizeof(double) : sizeof(float);
    const int64_t ob = KF__KAN_OB((int64_t)e);
    g.outp = g.sparse ? (p->out + ob - 1) / ob * ob : p->out;
    g.Fw = kan_max(g.Fr, g.F);
    const int64_t wcols = g.sparse ? g.outp : p->out; /* W [out, K], or W^T [K, outp] */
    g.wc = 0;
    g.inv = kf__align_up((size_t)(wcols * p->K) * e);
    g.grid = g.inv + kf__align_up((size_t)(p->in * p->k * p->nk) * e);
    g.thr = g.grid + kf__align_up((size_t)(p->in * p->nk) * e);
    /* a thread's region: the tile (dense: A^T [Fr cw, rows]; windowed: y or dy [rows, outp]),
     * the weight-gradient accumulator (dense: [out, F cw]; windowed: [F cw, outp]), x^T and
     * dx^T, then the dense path's bases and clamped x or the windowed path's windows */
    g.tile = 0;
    g.dw = kf__align_up((size_t)(g.sparse ? g.rows * g.outp : g.rows * g.Fr * p->cw) * e);
    g.xt = g.dw + kf__align_up((size_t)(wcols * g.F * p->cw) * e);
    g.dxt = g.xt + kf__align_up((size_t)(g.rows * g.Fw) * e);
    g.s = g.dxt + kf__align_up((size_t)(g.rows * g.Fr) * e);
    if (g.sparse) {
        g.vals = g.s;
        g.sidx = g.vals + kf__align_up((size_t)(g.rows * g.Fw * (p->k + 2)) * e);
        g.win = g.sidx + kf__align_up((size_t)(g.rows * g.Fw) * sizeof(int32_t));
        const int64_t rl = (g.rows + 7) / 8 * 8; /* rows in whole vectors */
        g.ints = g.win + kf__align_up((size_t)((p->k + 2) * (g.rows + rl)) * e);
        g.part = g.ints + kf__align_up((size_t)(3 * rl + p->cw) * sizeof(int32_t));
        g.off = g.part + (size_t)(g.rows * g.Fr) * 32; /* 32-byte vectors */
    } else {
        g.xb = g.s + kf__align_up((size_t)(g.rows * (p->nk - 1)) * e);
        g.off = g.xb + kf__align_up((size_t)g.rows * e);
    }
    /* a low plan's buffers, in T: y or dy of a block for the dense products, and (KANConv2d's
     * backward) the dx of the image in hand, whose patches add into it */
    const bool low = kind == KAN_B || kind == KAN_H;
    g.yb = g.off + (patches ? kf__align_up((size_t)(g.rows * patches->kh * patches->kw) *
                                           sizeof(int64_t))
                            : 0);
    g.dxi = g.yb + (low && !g.sparse ? kf__align_up((size_t)(g.rows * p->out) * e) : 0);
    g.thr_bytes = g.dxi + (low && patches && backward
                               ? kf__align_up((size_t)(patches->Cin * patches->H * patches->W) * e)
                               : 0);
    g.bytes = g.thr + (size_t)g.team * g.thr_bytes;
    return g;
}

static size_t kan_workspace(const struct kf_kan_linear_plan *p, int64_t N,
                            const kf__kan_patches *patches, kan_kind kind) {
    const size_t f = kan_geom_of(p, N, patches, false, kind).bytes,
                 b = kan_geom_of(p, N, patches, true, kind).bytes;
    return f > b ? f : b;
}

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

KF__BSPLINE_DEFINE(float, s)
KF__BSPLINE_DEFINE(double, d)

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
static int64_t kan_yoff(const kf__kan_patches *P, const kan_geom *g, int64_t out,
                        const kan_blk *k, int64_t *ld) {
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

/* For compute type T, BLAS prefix X (s: float, d: double): the dense path's kernels, which work
 * on the workspace's tiles only, each named with the suffix _X. */
#define KF__KAN_CPU_DEFINE(T, X)                                                                   \
    /* ---- bases, vectorised over rows ----                                                       \
     * A tile is stored transposed, A^T [cols, rows] (row stride `rows`), so that every loop       \
     * below runs over contiguous rows of one feature with the knots as scalars: plain loops the   \
     * compiler vectorises, no branches, no per-element search. The GEMMs read it with the         \
     * transpose flag. */                                                                          \
                                                                                                   \
    /* The tile A^T [(f1-f0)*cw, rows] of features [f0, f1) at x^T: per feature the rows           \
     * SiLU(x), B_0(x) .. B_{C-1}(x) (bases 0 outside the grid). */                                \
    static void kan_tile_##X(const struct kf_kan_linear_plan *p, const T *grid, const T *inv,      \
                             const T *xT, int64_t rows, int64_t f0, int64_t f1, T *tile, T *S,     \
                             T *xb) {                                                              \
        const int64_t nk = p->nk, cw = p->cw;                                                      \
        for (int64_t i = f0; i < f1; ++i) {                                                        \
            const T *x = xT + (i - f0) * rows;                                                     \
            T *restrict a = tile + (i - f0) * cw * rows;                                           \
            kan_exp_neg_rows_##X(x, rows, a);                                                      \
            for (int64_t n = 0; n < rows; ++n) a[n] = x[n] / ((T)1 + a[n]); /* SiLU */             \
            kf__bspline_rows_##X(grid + i * nk, inv + i * p->k * nk, nk, p->k, x, rows, xb, S,     \
                                 a + rows);                                                        \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    /* ---- backward ---- */                                                                       \
                                                                                                   \
    /* dx^T [f1-f0, rows] for features [f0, f1) from dA^T = (dy W)^T over the same columns:        \
     *     dx = dA_silu SiLU'(x) + sum_c dA_c B'_c(x),                                             \
     *     SiLU'(x) = s (1 + x (1 - s)),   s = sigmoid(x),                                         \
     *     B'_{c,k}(x) = KF__BSPLINE_DSTEP over B_{c,k-1}, B_{c+1,k-1} (common/bspline.h)        \
     * from the order-(k-1) bases (C + 1 of them) in S; zero-width spans contribute 0. */          \
    static void kan_dx_##X(const struct kf_kan_linear_plan *p, const T *grid, const T *inv,        \
                           const T *xT, const T *dA, int64_t rows, int64_t f0, int64_t f1, T *dxT, \
                           T *S, T *xb) {                                                          \
        const int64_t nk = p->nk, C = p->C, k = p->k, cw = p->cw;                                  \
        for (int64_t i = f0; i < f1; ++i) {                                                        \
            const T *restrict x = xT + (i - f0) * rows, *restrict d0 = dA + (i - f0) * cw * rows;  \
            T *restrict acc = dxT + (i - f0) * rows;                                               \
            kan_exp_neg_rows_##X(x, rows, acc);                                                    \
            for (int64_t n = 0; n < rows; ++n) {                                                   \
                const T s = (T)1 / ((T)1 + acc[n]);                                                \
                acc[n] = d0[n] * (s * ((T)1 + x[n] * ((T)1 - s)));                                 \
            }                                                                                      \
            if (k == 0) continue;                                                                  \
            const T *fi = inv + i * k * nk, *ik = fi + (k - 1) * nk;                               \
            kf__bspline_rows_##X(grid + i * nk, fi, nk, k - 1, x, rows, xb, S, S);                 \
            for (int64_t c = 0; c < C; ++c) {                                                      \
                const T *restrict dc = d0 + (1 + c) * rows, *restrict s0 = S + c * rows,           \
                                  *restrict s1 = s0 + rows;                                        \
                for (int64_t n = 0; n < rows; ++n)                                                 \
                    acc[n] += dc[n] * KF__BSPLINE_DSTEP((T)k, ik[c], ik[c + 1], s0[n], s1[n]);     \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    /* KANConv2d's dx^T [f1-f0, rows] of block k added into its image's dx `img` [Cin, H, W]:      \
     * each patch element into the pixel it came from (padding is dropped; offsets `tab`). */      \
    static void kan_scatter_patches_##X(const T *dxT, const kf__kan_patches *P, const kan_blk *k,  \
                                        int64_t f0, int64_t f1, T *img, const int64_t *tab) {      \
        const int64_t rows = k->rows, kk = (int64_t)P->kh * P->kw, plane = P->H * P->W;            \
        for (int64_t f = f0; f < f1; ++f) {                                                        \
            const T *src = dxT + (f - f0) * rows;                                                  \
            T *dst = img + f / kk * plane;                                                         \
            const int64_t *off = tab + f % kk * rows;                                              \
            for (int64_t r = 0; r < rows; ++r)                                                     \
                if (off[r] >= 0) dst[off[r]] += src[r];                                            \
        }                                                                                          \
    }

KF__KAN_CPU_DEFINE(float, s)
KF__KAN_CPU_DEFINE(double, d)

/* For compute type T (BLAS prefix X) and storage suffix SX (kan_get_SX and kan_set_SX above):
 * everything that reads or writes the caller's tensors, each named with the suffix _SX. */
#define KF__KAN_IO_DEFINE(T, X, SX)                                                                \
    /* ---- the combined weight and the knots ---- */                                              \
                                                                                                   \
    /* Rows [o0, o1) of W [out, K]: per feature [ base_weight (0 when absent) |                    \
     * spline_weight * spline_scaler ]. */                                                         \
    static void kan_pack_w_##SX(const struct kf_kan_linear_plan *p, const void *base,              \
                                const void *spline, const void *scaler, T *W, int64_t o0,          \
                                int64_t o1) {                                                      \
        const int64_t in = p->in, C = p->C, cw = p->cw;                                            \
        for (int64_t o = o0; o < o1; ++o)                                                          \
            for (int64_t i = 0; i < in; ++i) {                                                     \
                const int64_t oi = o * in + i;                                                     \
                T *d = W + o * p->K + i * cw;                                                      \
                d[0] = base ? kan_get_##SX(base, oi) : (T)0; /* no base_weight: no base term */    \
                kan_get_n_##SX(d + 1, spline, oi * C, C);                                          \
                if (scaler) {                                                                      \
                    const T sc = kan_get_##SX(scaler, oi);                                         \
                    for (int64_t c = 0; c < C; ++c) d[1 + c] *= sc;                                \
                }                                                                                  \
            }                                                                                      \
    }                                                                                              \
                                                                                                   \
    /* Features [i0, i1) of W^T in output panels (the windowed path): panel b = o / OB is          \
     * [K, OB] (row i cw + c: feature i's column c of the combined weight over the panel's         \
     * outputs, zero past out), so that a group of features' columns for one output block are      \
     * contiguous (rows of one [K, outp] matrix at a power-of-two stride would share L1 sets).     \
     * Written panel row by panel row. */                                                          \
    static void kan_pack_wt_##SX(const struct kf_kan_linear_plan *p, const void *base,             \
                                 const void *spline, const void *scaler, T *WT, int64_t outp,      \
                                 int64_t i0, int64_t i1) {                                         \
        const int64_t in = p->in, out = p->out, C = p->C, cw = p->cw, OB = KF__KAN_OB(sizeof(T));  \
        for (int64_t ob = 0; ob < outp; ob += OB)                                                  \
            for (int64_t i = i0; i < i1; ++i)                                                      \
                for (int64_t o = ob; o < ob + OB; ++o) {                                           \
                    T *d = WT + ob * p->K + i * cw * OB + o % OB;                                  \
                    const int64_t oi = o * in + i;                                                 \
                    const T sc = scaler && o < out ? kan_get_##SX(scaler, oi) : (T)1;              \
                    d[0] = base && o < out ? kan_get_##SX(base, oi) : (T)0;                        \
                    for (int64_t c = 0; c < C; ++c)                                                \
                        d[(1 + c) * OB] = o < out ? kan_get_##SX(spline, oi * C + c) * sc : (T)0;  \
                }                                                                                  \
    }                                                                                              \
                                                                                                   \
    /* Features [i0, i1) of the knots `gt` [in, nk] in T and of inv [in, k, nk], each feature's    \
     * reciprocal table (common/bspline.h). */                                                     \
    static void kan_knots_##SX(const struct kf_kan_linear_plan *p, const void *grid, T *gt,        \
                               T *inv, int64_t i0, int64_t i1) {                                   \
        const int64_t nk = p->nk;                                                                  \
        kan_get_n_##SX(gt + i0 * nk, grid, i0 * nk, (i1 - i0) * nk);                               \
        for (int64_t i = i0; i < i1; ++i)                                                          \
            kf__bspline_inv_##X(gt + i * nk, nk, p->k, inv + i * p->k * nk);                       \
    }                                                                                              \
                                                                                                   \
    /* ---- rows in and out ---- */                                                                \
                                                                                                   \
    /* x^T [f1 - f0, rows] from rows x[n0..n0 + rows) (row stride in): the chunk's features,       \
     * row-contiguous. Eight rows at a time, so that the eight source lines stay in L1 across the  \
     * features and the stores are contiguous. */                                                  \
    static void kan_gather_rows_##SX(const void *x, int64_t n0, int64_t in, int64_t rows,          \
                                     int64_t f0, int64_t f1, T *xT) {                              \
        int64_t n = 0;                                                                             \
        for (; n + 8 <= rows; n += 8)                                                              \
            for (int64_t i = f0; i < f1; ++i)                                                      \
                for (int64_t r = 0; r < 8; ++r)                                                    \
                    xT[(i - f0) * rows + n + r] = kan_get_##SX(x, (n0 + n + r) * in + i);          \
        for (; n < rows; ++n)                                                                      \
            for (int64_t i = f0; i < f1; ++i)                                                      \
                xT[(i - f0) * rows + n] = kan_get_##SX(x, (n0 + n) * in + i);                      \
    }                                                                                              \
                                                                                                   \
    /* x^T [f1 - f0, rows] of block k: KANLinear's rows, or the patches (im2col of the tile only,  \
     * from the block's offset table `tab`). */                                                    \
    static void kan_gather_x_##SX(const void *x, const kf__kan_patches *P, int64_t in,             \
                                  const kan_blk *k, int64_t f0, int64_t f1, T *xT,                 \
                                  const int64_t *tab) {                                            \
        if (!P) {                                                                                  \
            kan_gather_rows_##SX(x, k->n0, in, k->rows, f0, f1, xT);                               \
            return;                                                                                \
        }                                                                                          \
        const int64_t kk = (int64_t)P->kh * P->kw, plane = P->H * P->W;                            \
        const int64_t img = k->img * P->Cin * plane;                                               \
        for (int64_t f = f0; f < f1; ++f) {                                                        \
            const int64_t src = img + f / kk * plane;                                              \
            const int64_t *off = tab + f % kk * k->rows;                                           \
            T *d = xT + (f - f0) * k->rows;                                                        \
            for (int64_t r = 0; r < k->rows; ++r)                                                  \
                d[r] = off[r] >= 0 ? kan_get_##SX(x, src + off[r]) : (T)0;                         \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    /* KANLinear's dx rows of block k from dx^T [f1 - f0, rows] (the inverse of kan_gather_rows;   \
     * KANConv2d's dx goes through kan_scatter_patches). */                                        \
    static void kan_scatter_rows_##SX(const T *dxT, int64_t in, const kan_blk *k, int64_t f0,      \
                                      int64_t f1, void *dx) {                                      \
        const int64_t rows = k->rows, n0 = k->n0;                                                  \
        int64_t n = 0;                                                                             \
        for (; n + 8 <= rows; n += 8)                                                              \
            for (int64_t i = f0; i < f1; ++i)                                                      \
                for (int64_t r = 0; r < 8; ++r)                                                    \
                    kan_set_##SX(dx, (n0 + n + r) * in + i, dxT[(i - f0) * rows + n + r]);         \
        for (; n < rows; ++n)                                                                      \
            for (int64_t i = f0; i < f1; ++i)                                                      \
                kan_set_##SX(dx, (n0 + n) * in + i, dxT[(i - f0) * rows + n]);                     \
    }                                                                                              \
                                                                                                   \
    /* Block k's y or dy (kan_yoff) <-> buf, laid out as kan_buf_ld says: element (row n,          \
     * output o) at n ldb + o, or at o ldb + n for the dense path's KANConv2d copy (`trans`).      \
     * `load` reads dy into buf (past out, zeros in each row of a [rows, ldb] buf), else y is      \
     * written from buf. Whole lines at a time where buf is stored as the block is. */             \
    static void kan_blk_io_##SX(void *y, const kf__kan_patches *P, const kan_geom *g,              \
                                int64_t out, const kan_blk *k, T *buf, bool load) {                \
        const bool trans = P && !g->sparse;                                                        \
        const int64_t ldb = kan_buf_ld(P, g, out, k);                                              \
        int64_t ld;                                                                                \
        const int64_t y0 = kan_yoff(P, g, out, k, &ld);                                            \
        if (trans == (P != NULL)) {                                                                \
            const int64_t lines = trans ? out : k->rows, len = trans ? k->rows : out;              \
            for (int64_t l = 0; l < lines; ++l)                                                    \
                if (load) kan_get_n_##SX(buf + l * ldb, y, y0 + l * ld, len);                      \
                else kan_set_n_##SX(y, y0 + l * ld, buf + l * ldb, len);                           \
        } else { /* a KANConv2d block in rows (the windowed path) */                               \
            for (int64_t n = 0; n < k->rows; ++n)                                                  \
                for (int64_t o = 0; o < out; ++o) {                                                \
                    if (load) buf[n * ldb + o] = kan_get_##SX(y, y0 + o * ld + n);                 \
                    else kan_set_##SX(y, y0 + o * ld + n, buf[n * ldb + o]);                       \
                }                                                                                  \
        }                                                                                          \
        if (load && !trans)                                                                        \
            for (int64_t n = 0; n < k->rows; ++n)                                                  \
                memset(buf + n * ldb + out, 0, (size_t)(ldb - out) * sizeof(T));                   \
    }                                                                                              \
                                                                                                   \
    /* Folds the chunk [f0, f1) of dW = dy^T A into the parameter gradients, dW[o, col] at         \
     * o so + col sc ([out, (f1-f0)*cw]: so = (f1-f0)*cw, sc = 1; transposed: so = 1, sc = ld):    \
     *     d base_weight = dW_silu,   d spline_weight = dW_spline * spline_scaler,                 \
     *     d spline_scaler = sum_c dW_spline[c] * spline_weight[c];                                \
     * accumulating, each is stored as old + new (summed in T, then rounded once). */              \
    static void kan_fold_dw_##SX(const kf__kan_bwd *c, const T *dW, int64_t f0, int64_t f1,        \
                                 int64_t ob, int64_t sb, int64_t so, int64_t sc) {                 \
        const struct kf_kan_linear_plan *p = c->plan;                                              \
        const int64_t in = p->in, C = p->C, cw = p->cw;                                            \
        const bool acc = c->accumulate;                                                            \
        const void *scaler = c->scaler, *spline = c->spline;                                       \
        void *dbase = c->dbase, *dspline = c->dspline, *dscaler = c->dscaler;                      \
        for (int64_t o = 0; o < p->out; ++o)                                                       \
            for (int64_t i = f0; i < f1; ++i) {                                                    \
                const int64_t oi = o * in + i;                                                     \
                const T *g = dW + o / ob * sb + o % ob * so + (i - f0) * cw * sc;                  \
                if (dbase)                                                                         \
                    kan_set_##SX(dbase, oi, acc ? kan_get_##SX(dbase, oi) + g[0] : g[0]);          \
                if (dspline) {                                                                     \
                    const T s = scaler ? kan_get_##SX(scaler, oi) : (T)1;                          \
                    for (int64_t q = 0; q < C; ++q) {                                              \
                        const int64_t e = oi * C + q;                                              \
                        const T v = g[(1 + q) * sc] * s;                                           \
                        kan_set_##SX(dspline, e, acc ? kan_get_##SX(dspline, e) + v : v);          \
                    }                                                                              \
                }                                                                                  \
                if (dscaler) {                                                                     \
                    T sum = 0;                                                                     \
                    for (int64_t q = 0; q < C; ++q)                                                \
                        sum += g[(1 + q) * sc] * kan_get_##SX(spline, oi * C + q);                 \
                    kan_set_##SX(dscaler, oi, acc ? kan_get_##SX(dscaler, oi) + sum : sum);        \
                }                                                                                  \
            }                                                                                      \
    }

KF__KAN_IO_DEFINE(float, s, s)
KF__KAN_IO_DEFINE(double, d, d)
KF__KAN_IO_DEFINE(float, s, b)
KF__KAN_IO_DEFINE(float, s, h)

/* For element type T, suffix X, VEC the 32-byte vector of T and VI the int32 vector of as many
 * lanes: the windowed path's kernels (the header comment says why and when). */
#define KF__KAN_SPARSE_DEFINE(T, X, VEC, VI)                                                       \
    /* The window of one feature at x[0..rows) (kf__bspline_rows' bases, computed only where       \
     * they can be non-zero). Per row: the span j (t_j <= x < t_{j+1}, counted as the knots        \
     * t_1..t_{nk-2} at or below x; any j, with every basis 0, outside [t_0, t_{nk-1}) and for     \
     * NaN), the order-k bases B_{j-k..j} by the triangular recurrence, L rows at a time in        \
     * registers with the knots t_{j-k..j+k+1} and reciprocals gathered per row (descending r,     \
     * so that B_{m,p-1} and B_{m+1,p-1} are read before being overwritten; the same expression    \
     * as the dense form, hence the same bits), then moved to the window start                     \
     * s = clamp(j - k, 0, C - 1 - k) so that its k + 1 columns are all real ones. Bases of        \
     * indices outside [0, C) (order p: [0, nk - 1 - p)) come from clamped knot indices and        \
     * never feed a real one; the move drops them by selection, not by a product.                  \
     * deriv: V[0] = SiLU'(x) and the window of B' (the formula above kan_dx), else SiLU(x) and    \
     * the window of B. V [k+2, rows], s [rows]; scr [k+2, rl], ints [2, rl] scratch, rl =         \
     * rows rounded up to whole vectors. */                                                        \
    static void kan_window_##X(const struct kf_kan_linear_plan *p, const T *t, const T *inv,       \
                               const T *x, int64_t rows, bool deriv, T *V, int32_t *s, T *scr,     \
                               int32_t *ints) {                                                    \
        enum { L = 32 / sizeof(T) };                                                               \
        const int32_t nk = (int32_t)p->nk, k = p->k, C = (int32_t)p->C;                            \
        const int64_t rl = (rows + L - 1) / L * L;                                                 \
        T *restrict xc = scr, *restrict Nb = xc + rl;                                              \
        int32_t *restrict jj = ints, *restrict dl = ints + rl;                                     \
        kan_exp_neg_rows_##X(x, rows, V);                                                          \
        for (int64_t n = 0; n < rows; ++n) {                                                       \
            const T sg = (T)1 / ((T)1 + V[n]);                                                     \
            V[n] = deriv ? sg * ((T)1 + x[n] * ((T)1 - sg)) : x[n] / ((T)1 + V[n]);                \
        }                                                                                          \
        const T first = t[0], last = t[nk - 1];                                                    \
        for (int64_t n = 0; n < rl; ++n) {                                                         \
            const bool inside = n < rows && x[n] >= first && x[n] < last;                          \
            xc[n] = inside ? x[n] : first;                                                         \
            Nb[n] = inside ? (T)1 : (T)0;                                                          \
            jj[n] = 0;                                                                             \
        }                                                                                          \
        for (int32_t m = 1; m + 1 < nk; ++m) {                                                     \
            const T tm = t[m];                                                                     \
            for (int64_t n = 0; n < rl; ++n) jj[n] += tm <= xc[n];                                 \
        }                                                                                          \
        const VI zi = {0}, hi = zi + (nk - 1);                                                     \
        const VEC zero = {0};                                                                      \
        for (int64_t n = 0; n < rl; n += L) {                                                      \
            const VEC xv = *(const VEC *)(xc + n);                                                 \
            const VI j = *(const VI *)(jj + n);                                                    \
            VEC tk[2 * KF__KAN_SPARSE_KMAX + 2], Nv[KF__KAN_SPARSE_KMAX + 1],                      \
                Qv[KF__KAN_SPARSE_KMAX + 1], iq[KF__KAN_SPARSE_KMAX + 2];                          \
            for (int32_t u = -k; u <= k + 1; ++u)                                                  \
                tk[u + k] = kan_gather_##X(t, kan_clampv_##X(j + u, zi, hi));                      \
            Nv[0] = *(const VEC *)(Nb + n);                                                        \
            for (int32_t q = 1; q <= k; ++q) {                                                     \
                const T *ip = inv + (int64_t)(q - 1) * nk;                                         \
                for (int32_t r = 0; r <= q + 1; ++r)                                               \
                    iq[r] = kan_gather_##X(ip, kan_clampv_##X(j + (r - q), zi, hi));               \
                if (q == k)                                                                        \
                    for (int32_t r = 0; r < k; ++r) Qv[r] = Nv[r];                                 \
                for (int32_t r = q; r >= 0; --r) {                                                 \
                    const VEC b0 = r >= 1 ? Nv[r - 1] : zero, b1 = r < q ? Nv[r] : zero;           \
                    Nv[r] = (xv - tk[r - q + k]) * iq[r] * b0 +                                    \
                            (tk[r + 1 + k] - xv) * iq[r + 1] * b1;                                 \
                }                                                                                  \
            }                                                                                      \
            for (int32_t r = 0; r <= k; ++r) {                                                     \
                VEC v = Nv[r];                                                                     \
                if (deriv) { /* B'_{j-k+r} from the order-(k-1) bases; iq holds inv_k[j-k..j+1] */ \
                    const VEC s0 = r >= 1 ? Qv[r - 1] : zero, s1 = r < k ? Qv[r] : zero;           \
                    v = zero;                                                                      \
                    if (k) v = KF__BSPLINE_DSTEP((T)k, iq[r], iq[r + 1], s0, s1);                  \
                }                                                                                  \
                *(VEC *)(Nb + r * rl + n) = v;                                                     \
            }                                                                                      \
        }                                                                                          \
        for (int64_t n = 0; n < rows; ++n) {                                                       \
            s[n] = kan_clamp32(jj[n] - k, 0, C - 1 - k);                                           \
            dl[n] = s[n] - (jj[n] - k);                                                            \
        }                                                                                          \
        for (int32_t u = 0; u <= k; ++u) {                                                         \
            T *v = V + (1 + u) * rows;                                                             \
            memset(v, 0, (size_t)rows * sizeof(T));                                                \
            for (int32_t r = 0; r <= k; ++r) {                                                     \
                const T *a = Nb + r * rl;                                                          \
                for (int64_t n = 0; n < rows; ++n) v[n] = r == u + dl[n] ? a[n] : v[n];            \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    /* The windows of features [f0, f1) of block k (x^T from kan_gather_x in xT), stored per row:  \
     * vals[(n Fw + f - f0)(k+2) + c] = V_c, sidx[n Fw + f - f0] = s. */                           \
    static void kan_windows_##X(const struct kf_kan_linear_plan *p, const kan_geom *g,             \
                                const T *grid, const T *inv, const T *xT, int64_t rows,            \
                                int64_t f0, int64_t f1, bool deriv, T *vals, int32_t *sidx,        \
                                T *V, T *scr, int32_t *ints) {                                     \
        const int64_t k2 = p->k + 2, Fw = g->Fw;                                                   \
        int32_t *s = ints + 2 * ((rows + 7) / 8 * 8); /* past kan_window's [2, rl] */              \
        for (int64_t i = f0; i < f1; ++i) {                                                        \
            kan_window_##X(p, grid + i * p->nk, inv + i * p->k * p->nk, xT + (i - f0) * rows,      \
                           rows, deriv, V, s, scr, ints);                                          \
            for (int64_t n = 0; n < rows; ++n) {                                                   \
                T *v = vals + (n * Fw + i - f0) * k2;                                              \
                for (int64_t c = 0; c < k2; ++c) v[c] = V[c * rows + n];                           \
                sidx[n * Fw + i - f0] = s[n];                                                      \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    /* ybuf[n, :] += sum over features i in [f0, f1) of                                            \
     *     V_0 W^T[i cw] + sum_t V_{1+t} W^T[i cw + 1 + s + t]                                     \
     * per output panel of KF__KAN_NV vectors, the row's panel in registers over the group (the    \
     * group's W^T rows for the panel, Fr cw x 256 bytes, stay in L1). */                          \
    static void kan_sfwd_product_##X(const T *WT, const kan_geom *g, int64_t cw, int64_t K,        \
                                     int64_t k2, const T *vals, const int32_t *sidx, int64_t f0,   \
                                     int64_t f1, int64_t rows, T *ybuf) {                          \
        enum { L = 32 / sizeof(T) };                                                               \
        enum { OB = KF__KAN_NV * L };                                                              \
        const int64_t outp = g->outp, Fw = g->Fw;                                                  \
        for (int64_t o = 0; o < outp; o += OB)                                                     \
            for (int64_t n = 0; n < rows; ++n) {                                                   \
                VEC acc[KF__KAN_NV];                                                               \
                T *yn = ybuf + n * outp + o;                                                       \
                for (int q = 0; q < KF__KAN_NV; ++q) acc[q] = *(const VEC *)(yn + q * L);          \
                for (int64_t i = f0; i < f1; ++i) {                                                \
                    const T *v = vals + (n * Fw + i - f0) * k2;                                    \
                    const T *w = WT + o * K + i * cw * OB;                                         \
                    const VEC v0 = kf__splat_##X(v[0]);                                            \
                    for (int q = 0; q < KF__KAN_NV; ++q)                                           \
                        acc[q] = kf__fma_##X(v0, *(const VEC *)(w + q * L), acc[q]);               \
                    const T *ws = w + (1 + sidx[n * Fw + i - f0]) * OB;                            \
                    for (int64_t t = 1; t < k2; ++t, ws += OB) {                                   \
                        const VEC vt = kf__splat_##X(v[t]);                                        \
                        for (int q = 0; q < KF__KAN_NV; ++q)                                       \
                            acc[q] = kf__fma_##X(vt, *(const VEC *)(ws + q * L), acc[q]);          \
                    }                                                                              \
                }                                                                                  \
                for (int q = 0; q < KF__KAN_NV; ++q) *(VEC *)(yn + q * L) = acc[q];                \
            }                                                                                      \
    }                                                                                              \
                                                                                                   \
    /* dxT[i - f0, n] = dbuf[n, :] . (V_0 W^T[i cw] + sum_t V_{1+t} W^T[i cw + 1 + s + t])         \
     * = V_0 dA_0 + sum_t V_{1+t} dA_{1+s+t} (V from kan_windows with deriv: SiLU' and B'): the    \
     * window's weight columns combined as in the forward, then dotted with dy; output panel by    \
     * panel as the forward (the group's panel rows stay in L1), the dot products' partial sums    \
     * in part [rows, Fr] vectors. */                                                              \
    static void kan_sdx_product_##X(const T *WT, const kan_geom *g, int64_t cw, int64_t K,         \
                                    int64_t k2, const T *vals, const int32_t *sidx, int64_t f0,    \
                                    int64_t f1, int64_t rows, const T *dbuf, VEC *part, T *dxT) {  \
        enum { L = 32 / sizeof(T) };                                                               \
        enum { OB = KF__KAN_NV * L };                                                              \
        const int64_t outp = g->outp, Fw = g->Fw, nf = f1 - f0;                                    \
        const VEC zero = {0};                                                                      \
        for (int64_t j = 0; j < rows * nf; ++j) part[j] = zero;                                    \
        for (int64_t o = 0; o < outp; o += OB)                                                     \
            for (int64_t n = 0; n < rows; ++n)                                                     \
                for (int64_t i = f0; i < f1; ++i) {                                                \
                    const T *v = vals + (n * Fw + i - f0) * k2, *dn = dbuf + n * outp + o;         \
                    const T *w0 = WT + o * K + i * cw * OB,                                        \
                            *ws = w0 + (1 + sidx[n * Fw + i - f0]) * OB;                           \
                    VEC e[KF__KAN_NV], a0 = part[n * nf + i - f0], a1 = zero;                      \
                    for (int q = 0; q < KF__KAN_NV; ++q) e[q] = v[0] * *(const VEC *)(w0 + q * L); \
                    for (int64_t t = 1; t < k2; ++t, ws += OB) {                                   \
                        const VEC vt = kf__splat_##X(v[t]);                                        \
                        for (int q = 0; q < KF__KAN_NV; ++q)                                       \
                            e[q] = kf__fma_##X(vt, *(const VEC *)(ws + q * L), e[q]);              \
                    }                                                                              \
                    for (int q = 0; q < KF__KAN_NV; q += 2) {                                      \
                        a0 = kf__fma_##X(*(const VEC *)(dn + q * L), e[q], a0);                    \
                        a1 = kf__fma_##X(*(const VEC *)(dn + q * L + L), e[q + 1], a1);            \
                    }                                                                              \
                    part[n * nf + i - f0] = a0 + a1;                                               \
                }                                                                                  \
        for (int64_t n = 0; n < rows; ++n)                                                         \
            for (int64_t i = f0; i < f1; ++i) {                                                    \
                const VEC a = part[n * nf + i - f0];                                               \
                T dx = 0;                                                                          \
                for (int l = 0; l < L; ++l) dx += a[l];                                            \
                dxT[(i - f0) * rows + n] = dx;                                                     \
            }                                                                                      \
    }                                                                                              \
                                                                                                   \
    /* One bucket of the weight gradient (kan_sdw_product): feature f's rows ord[0..nb), whose     \
     * windows all start at s, added into its accumulator w = dW^T[f cw, panel o] (vf: vals + f    \
     * k2, row stride sv; db: dbuf + o). For the panel's vectors [q0, q0 + NQ) the k + 2 column    \
     * sums over the bucket, in the order of ord,                                                  \
     *     acc[c][q] = sum_r V_c[r] dbuf[r, o + q L],                                              \
     * stay in registers (K2 = k + 2, a constant where this is inlined; K2 NQ accumulators, NQ = 2 \
     * while they fit the 16 vector registers) and are added once to column 0 (c = 0: SiLU) and    \
     * column s + c (c >= 1: the window's bases). */                                               \
    static inline __attribute__((always_inline)) void kan_sdw_bucket_##X(                          \
        T *w, int64_t s, const int32_t *ord, int64_t nb, const T *vf, int64_t sv, const T *db,     \
        int64_t outp, const int K2) {                                                              \
        enum { L = 32 / sizeof(T) };                                                               \
        const int NQ = K2 <= 6 ? 2 : 1;                                                            \
        const VEC zero = {0};                                                                      \
        for (int q0 = 0; q0 < KF__KAN_NV; q0 += NQ) {                                              \
            VEC acc[KF__KAN_SPARSE_KMAX + 2][2];                                                   \
            for (int c = 0; c < K2; ++c)                                                           \
                for (int q = 0; q < NQ; ++q) acc[c][q] = zero;                                     \
            for (int64_t b = 0; b < nb; ++b) {                                                     \
                const T *v = vf + ord[b] * sv, *dn = db + ord[b] * outp + q0 * L;                  \
                VEC d[2];                                                                          \
                for (int q = 0; q < NQ; ++q) d[q] = *(const VEC *)(dn + q * L);                    \
                for (int c = 0; c < K2; ++c) {                                                     \
                    const VEC vc = kf__splat_##X(v[c]);                                            \
                    for (int q = 0; q < NQ; ++q) acc[c][q] = kf__fma_##X(vc, d[q], acc[c][q]);     \
                }                                                                                  \
            }                                                                                      \
            for (int c = 0; c < K2; ++c) {                                                         \
                T *wc = w + (c ? s + c : 0) * KF__KAN_OB(sizeof(T)) + q0 * L;                      \
                for (int q = 0; q < NQ; ++q) *(VEC *)(wc + q * L) += acc[c][q];                    \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    /* dW^T[(i - f0) cw + c, :] += V_c dbuf[n, :] over the block's rows and the window's columns,  \
     * in output panels as W^T (panel b = o / OB is [F cw, OB]). Per feature the rows are bucketed \
     * by window start s (a stable counting sort into ord), so that every row of a bucket adds     \
     * into the same k + 2 columns: the sums run in registers and reach memory once per bucket     \
     * (kan_sdw_bucket) instead of once per row, which made a row-by-row form store-bound. Each    \
     * thread owns its features' accumulator and takes buckets and rows in a fixed order:          \
     * deterministic. ord [rows], at [C - k] int32 scratch. */                                     \
    static void kan_sdw_product_##X(T *dWT, const kan_geom *g, int64_t cw, int64_t k2,             \
                                    const T *vals, const int32_t *sidx, int64_t nf, int64_t rows,  \
                                    const T *dbuf, int32_t *ord, int32_t *at) {                    \
        const int64_t outp = g->outp, Fw = g->Fw, FK = g->F * cw, ns = cw + 1 - k2; /* C - k */    \
        for (int64_t f = 0; f < nf; ++f) {                                                         \
            memset(at, 0, (size_t)ns * sizeof(int32_t));                                           \
            for (int64_t n = 0; n < rows; ++n) ++at[sidx[n * Fw + f]];                             \
            for (int64_t s = 1; s < ns; ++s) at[s] += at[s - 1]; /* at[s]: end of bucket s */      \
            for (int64_t n = rows - 1; n >= 0; --n) ord[--at[sidx[n * Fw + f]]] = (int32_t)n;      \
            /* now at[s] is the start of bucket s, and at[s + 1] (or rows) its end */              \
            for (int64_t o = 0; o < outp; o += KF__KAN_OB(sizeof(T)))                              \
                for (int64_t s = 0; s < ns; ++s) {                                                 \
                    const int64_t b0 = at[s], nb = (s + 1 < ns ? at[s + 1] : rows) - b0;           \
                    T *w = dWT + o * FK + f * cw * KF__KAN_OB(sizeof(T));                          \
                    const int32_t *r = ord + b0;                                                   \
                    const T *vf = vals + f * k2, *db = dbuf + o;                                   \
                    const int64_t sv = Fw * k2;                                                    \
                    if (!nb) continue;                                                             \
                    switch (k2) { /* the common orders k = 0..4 with a constant K2 */              \
                    case 2: kan_sdw_bucket_##X(w, s, r, nb, vf, sv, db, outp, 2); break;           \
                    case 3: kan_sdw_bucket_##X(w, s, r, nb, vf, sv, db, outp, 3); break;           \
                    case 4: kan_sdw_bucket_##X(w, s, r, nb, vf, sv, db, outp, 4); break;           \
                    case 5: kan_sdw_bucket_##X(w, s, r, nb, vf, sv, db, outp, 5); break;           \
                    case 6: kan_sdw_bucket_##X(w, s, r, nb, vf, sv, db, outp, 6); break;           \
                    default: kan_sdw_bucket_##X(w, s, r, nb, vf, sv, db, outp, (int)k2);           \
                    }                                                                              \
                }                                                                                  \
        }                                                                                          \
    }

KF__KAN_SPARSE_DEFINE(float, s, kf__vs, kan_vis)
KF__KAN_SPARSE_DEFINE(double, d, kf__vd, kan_vid)

/* For compute type T, BLAS prefix X, vector VEC and storage SX: kan_fwd_team_SX and
 * kan_bwd_team_SX, one thread's share of a call on either path (g->sparse: the windowed kernels
 * above, else the dense tiles + GEMM). DIRECT (storage type = T) lets the dense products read dy
 * and write y and KANConv2d's dx in the caller's tensors; a low plan's go through the thread's
 * buffers in T (g->yb, g->dxi), converted a block (an image for dx) at a time. */
#define KF__KAN_TEAMS_DEFINE(T, X, VEC, SX, DIRECT)                                                \
    /* Block k's dy for the dense products: in place, or a low plan's copy in yb, stored as the    \
     * block is; *ld receives its row stride. */                                                   \
    static const T *kan_dy_##SX(const kf__kan_bwd *c, const kan_geom *g, const kan_blk *k, T *yb,  \
                                int64_t *ld) {                                                     \
        const kf__kan_patches *P = c->patches;                                                     \
        const int64_t out = c->plan->out, y0 = kan_yoff(P, g, out, k, ld);                         \
        if (DIRECT) return (const T *)c->dy + y0;                                                  \
        *ld = kan_buf_ld(P, g, out, k);                                                            \
        kan_blk_io_##SX((void *)c->dy, P, g, out, k, yb, true);                                    \
        return yb;                                                                                 \
    }                                                                                              \
                                                                                                   \
    static void kan_fwd_team_##SX(void *arg, int tid, int nth) {                                   \
        const kf__kan_fwd *c = ((const kan_fwd_call *)arg)->c;                                     \
        const kan_geom *g = &((const kan_fwd_call *)arg)->g;                                       \
        const struct kf_kan_linear_plan *p = c->plan;                                              \
        const kf__kan_patches *P = c->patches;                                                     \
        const int64_t in = p->in, out = p->out, cw = p->cw, K = p->K, k2 = p->k + 2;               \
        T *W = kan_at(c->ws, g->wc), *inv = kan_at(c->ws, g->inv), *grid = kan_at(c->ws, g->grid); \
        char *mine = (char *)c->ws + g->thr + (size_t)tid * g->thr_bytes;                          \
        T *tile = kan_at(mine, g->tile), *xT = kan_at(mine, g->xt), *S = kan_at(mine, g->s),       \
          *xb = kan_at(mine, g->xb), *win = kan_at(mine, g->win), *yb = kan_at(mine, g->yb);       \
        int32_t *sidx = kan_at(mine, g->sidx), *ints = kan_at(mine, g->ints);                      \
        int64_t *off = kan_at(mine, g->off), held[2] = {-1, -1};                                   \
        int64_t a0, a1, ld;                                                                        \
        kf__cpu_share(g->sparse ? in : out, tid, nth, &a0, &a1);                                   \
        if (g->sparse) kan_pack_wt_##SX(p, c->base, c->spline, c->scaler, W, g->outp, a0, a1);     \
        else kan_pack_w_##SX(p, c->base, c->spline, c->scaler, W, a0, a1);                         \
        kf__cpu_share(in, tid, nth, &a0, &a1);                                                     \
        kan_knots_##SX(p, c->grid, grid, inv, a0, a1);                                             \
        _Pragma("omp barrier")                                                                     \
        for (int64_t b = tid; b < g->blocks; b += nth) {                                           \
            const kan_blk k = kan_blk_of(g, b);                                                    \
            const int64_t y0 = kan_yoff(P, g, out, &k, &ld);                                       \
            T *y = DIRECT ? (T *)c->y + y0 : yb; /* a low plan's block in yb, stored as in y */    \
            if (!DIRECT) ld = kan_buf_ld(P, g, out, &k);                                           \
            if (P) kan_block_offsets(P, &k, off, held);                                            \
            if (g->sparse) memset(tile, 0, (size_t)(k.rows * g->outp) * sizeof(T));                \
            for (int64_t ch = 0; ch < g->rchunks; ++ch) {                                          \
                const int64_t f0 = ch * g->Fr, f1 = kan_min(in, f0 + g->Fr);                       \
                const int64_t cols = (f1 - f0) * cw;                                               \
                const T beta = ch ? (T)1 : (T)0;                                                   \
                kan_gather_x_##SX(c->x, P, in, &k, f0, f1, xT, off);                               \
                if (g->sparse) { /* y[rows, outp] in the tile */                                   \
                    kan_windows_##X(p, g, grid, inv, xT, k.rows, f0, f1, false, S, sidx, win,      \
                                    win + k2 * k.rows, ints);                                      \
                    kan_sfwd_product_##X(W, g, cw, K, k2, S, sidx, f0, f1, k.rows, tile);          \
                    continue;                                                                      \
                }                                                                                  \
                kan_tile_##X(p, grid, inv, xT, k.rows, f0, f1, tile, S, xb);                       \
                if (P && out <= KF__KAN_RG_OUT) /* y^T [out, rows] = W_chunk A_chunk^T */          \
                    kf__rowgemm_##X##X##X(out, k.rows, cols, cols, 1, W + f0 * cw, K, 1, tile,     \
                                          tile, k.rows, NULL, ch > 0, y, ld);                      \
                else if (P)                                                                        \
                    kf__##X##gemm(false, false, out, k.rows, cols, 1, W + f0 * cw, K, tile,        \
                                  k.rows, beta, y, ld);                                            \
                else /* y [rows, out] = A_chunk W_chunk^T */                                       \
                    kf__##X##gemm(true, true, k.rows, out, cols, 1, tile, k.rows, W + f0 * cw, K,  \
                                  beta, y, ld);                                                    \
            }                                                                                      \
            if (g->sparse || !DIRECT)                                                              \
                kan_blk_io_##SX(c->y, P, g, out, &k, g->sparse ? tile : yb, false);                \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    static void kan_bwd_team_##SX(void *arg, int tid, int nth) {                                   \
        const kf__kan_bwd *c = ((const kan_bwd_call *)arg)->c;                                     \
        const kan_geom *g = &((const kan_bwd_call *)arg)->g;                                       \
        const struct kf_kan_linear_plan *p = c->plan;                                              \
        const kf__kan_patches *P = c->patches;                                                     \
        const int64_t in = p->in, out = p->out, cw = p->cw, K = p->K, k2 = p->k + 2;               \
        T *W = kan_at(c->ws, g->wc), *inv = kan_at(c->ws, g->inv), *grid = kan_at(c->ws, g->grid); \
        void *DX = c->dx;                                                                          \
        char *mine = (char *)c->ws + g->thr + (size_t)tid * g->thr_bytes;                          \
        T *tile = kan_at(mine, g->tile), *dW = kan_at(mine, g->dw), *xT = kan_at(mine, g->xt),     \
          *dxT = kan_at(mine, g->dxt), *S = kan_at(mine, g->s), *xb = kan_at(mine, g->xb),         \
          *win = kan_at(mine, g->win), *yb = kan_at(mine, g->yb), *dxi = kan_at(mine, g->dxi);     \
        int32_t *sidx = kan_at(mine, g->sidx), *ints = kan_at(mine, g->ints);                      \
        VEC *part = kan_at(mine, g->part);                                                         \
        int64_t *off = kan_at(mine, g->off), held[2] = {-1, -1};                                   \
        int64_t a0, a1, ld = 0;                                                                    \
        kf__cpu_share(g->sparse ? in : out, tid, nth, &a0, &a1);                                   \
        if (DX && g->sparse)                                                                       \
            kan_pack_wt_##SX(p, c->base, c->spline, c->scaler, W, g->outp, a0, a1);                \
        else if (DX)                                                                               \
            kan_pack_w_##SX(p, c->base, c->spline, c->scaler, W, a0, a1);                          \
        kf__cpu_share(in, tid, nth, &a0, &a1);                                                     \
        kan_knots_##SX(p, c->grid, grid, inv, a0, a1);                                             \
        _Pragma("omp barrier")                                                                     \
        const T *dy = NULL;                                                                        \
        /* dx, unit by unit (a row block, or a whole image whose dx this thread alone sums, in     \
         * `img`: the caller's image, or a low plan's dxi, rounded into dx once complete).         \
         * Dense: dA^T = (dy W)^T chunk by chunk (each chunk owns its features), dy taken          \
         * transposed when it is stored [rows, out] (KANLinear) and as it is when it is already    \
         * [out, rows]. Windowed: dy copied to the tile [rows, outp]. */                           \
        const int64_t img_elems = P ? P->Cin * P->H * P->W : 0;                                    \
        for (int64_t u = tid; DX && u * g->unit < g->blocks; u += nth) {                           \
            T *img = P && DIRECT ? (T *)DX + u * img_elems : dxi;                                  \
            if (P) memset(img, 0, (size_t)img_elems * sizeof(T));                                  \
            for (int64_t b = u * g->unit; b < (u + 1) * g->unit; ++b) {                            \
                const kan_blk k = kan_blk_of(g, b);                                                \
                if (P) kan_block_offsets(P, &k, off, held);                                        \
                if (g->sparse)                                                                     \
                    kan_blk_io_##SX((void *)c->dy, P, g, out, &k, tile, true);                     \
                else                                                                               \
                    dy = kan_dy_##SX(c, g, &k, yb, &ld);                                           \
                for (int64_t ch = 0; ch < g->rchunks; ++ch) {                                      \
                    const int64_t f0 = ch * g->Fr, f1 = kan_min(in, f0 + g->Fr);                   \
                    const int64_t cols = (f1 - f0) * cw;                                           \
                    if (!g->sparse)                                                                \
                        kf__##X##gemm(true, !P, cols, k.rows, out, 1, W + f0 * cw, K, dy, ld, 0,   \
                                      tile, k.rows);                                               \
                    kan_gather_x_##SX(c->x, P, in, &k, f0, f1, xT, off);                           \
                    if (g->sparse) {                                                               \
                        kan_windows_##X(p, g, grid, inv, xT, k.rows, f0, f1, true, S, sidx, win,   \
                                        win + k2 * k.rows, ints);                                  \
                        kan_sdx_product_##X(W, g, cw, K, k2, S, sidx, f0, f1, k.rows, tile, part,  \
                                            dxT);                                                  \
                    } else {                                                                       \
                        kan_dx_##X(p, grid, inv, xT, tile, k.rows, f0, f1, dxT, S, xb);            \
                    }                                                                              \
                    if (P) kan_scatter_patches_##X(dxT, P, &k, f0, f1, img, off);                  \
                    else kan_scatter_rows_##SX(dxT, in, &k, f0, f1, DX);                           \
                }                                                                                  \
            }                                                                                      \
            if (P && !DIRECT) kan_set_n_##SX(DX, u * img_elems, img, img_elems);                   \
        }                                                                                          \
        /* The weight gradient, chunk by chunk over all rows in a fixed order (no barrier needed:  \
         * the two loops write disjoint outputs and read only inputs, W, the knots and inv).       \
         * Dense: dW = dy^T A by GEMM into [out, F cw]; windowed: dW^T in panels (zeroed           \
         * first). */                                                                              \
        const bool want_w = c->dbase || c->dspline || c->dscaler;                                  \
        const int64_t OB = KF__KAN_OB((int64_t)sizeof(T));                                         \
        for (int64_t ch = tid; want_w && ch < g->chunks; ch += nth) {                              \
            const int64_t f0 = ch * g->F, f1 = kan_min(in, f0 + g->F), cols = (f1 - f0) * cw;      \
            if (g->sparse) memset(dW, 0, (size_t)(g->F * cw * g->outp) * sizeof(T));               \
            for (int64_t b = 0; b < g->blocks; ++b) {                                              \
                const kan_blk k = kan_blk_of(g, b);                                                \
                if (P) kan_block_offsets(P, &k, off, held);                                        \
                kan_gather_x_##SX(c->x, P, in, &k, f0, f1, xT, off);                               \
                if (g->sparse) {                                                                   \
                    kan_blk_io_##SX((void *)c->dy, P, g, out, &k, tile, true);                     \
                    kan_windows_##X(p, g, grid, inv, xT, k.rows, f0, f1, false, S, sidx, win,      \
                                    win + k2 * k.rows, ints);                                      \
                    kan_sdw_product_##X(dW, g, cw, k2, S, sidx, f1 - f0, k.rows, tile, ints,       \
                                        ints + 3 * ((g->rows + 7) / 8 * 8));                       \
                    continue;                                                                      \
                }                                                                                  \
                dy = kan_dy_##SX(c, g, &k, yb, &ld);                                               \
                kan_tile_##X(p, grid, inv, xT, k.rows, f0, f1, tile, S, xb);                       \
                kf__##X##gemm(!P, true, out, cols, k.rows, 1, dy, ld, tile, k.rows, b ? 1 : 0, dW, \
                              cols);                                                               \
            }                                                                                      \
            if (g->sparse) kan_fold_dw_##SX(c, dW, f0, f1, OB, g->F * cw * OB, 1, OB);             \
            else kan_fold_dw_##SX(c, dW, f0, f1, out, 0, cols, 1);                                 \
        }                                                                                          \
    }

KF__KAN_TEAMS_DEFINE(float, s, kf__vs, s, true)
KF__KAN_TEAMS_DEFINE(double, d, kf__vd, d, true)
KF__KAN_TEAMS_DEFINE(float, s, kf__vs, b, false)
KF__KAN_TEAMS_DEFINE(float, s, kf__vs, h, false)

/* A call on one thread team: kan_fwd_team_SX or kan_bwd_team_SX of the table's storage kind. */
static kf_status kan_run_forward(const kf__kan_fwd *c, kan_kind kind,
                                 void (*team)(void *, int, int)) {
    kan_fwd_call call = {.c = c, .g = kan_geom_of(c->plan, c->N, c->patches, false, kind)};
    kf__cpu_team(call.g.team, team, &call);
    return KF_OK;
}

static kf_status kan_run_backward(const kf__kan_bwd *c, kan_kind kind,
                                  void (*team)(void *, int, int)) {
    kan_bwd_call call = {.c = c, .g = kan_geom_of(c->plan, c->N, c->patches, true, kind)};
    kf__cpu_team(call.g.team, team, &call);
    return KF_OK;
}

/* One op table per storage kind, its entries named by the kind's suffix. */
static size_t kan_workspace_s(const struct kf_kan_linear_plan *p, int64_t N,
                              const kf__kan_patches *patches) {
    return kan_workspace(p, N, patches, KAN_S);
}
static size_t kan_workspace_d(const struct kf_kan_linear_plan *p, int64_t N,
                              const kf__kan_patches *patches) {
    return kan_workspace(p, N, patches, KAN_D);
}
static size_t kan_workspace_b(const struct kf_kan_linear_plan *p, int64_t N,
                              const kf__kan_patches *patches) {
    return kan_workspace(p, N, patches, KAN_B);
}
static size_t kan_workspace_h(const struct kf_kan_linear_plan *p, int64_t N,
                              const kf__kan_patches *patches) {
    return kan_workspace(p, N, patches, KAN_H);
}
static kf_status kan_forward_s(kf_context *ctx, const kf__kan_fwd *c) {
    return kan_run_forward(c, KAN_S, kan_fwd_team_s);
}
static kf_status kan_forward_d(kf_context *ctx, const kf__kan_fwd *c) {
    return kan_run_forward(c, KAN_D, kan_fwd_team_d);
}
static kf_status kan_forward_b(kf_context *ctx, const kf__kan_fwd *c) {
    return kan_run_forward(c, KAN_B, kan_fwd_team_b);
}
static kf_status kan_forward_h(kf_context *ctx, const kf__kan_fwd *c) {
    return kan_run_forward(c, KAN_H, kan_fwd_team_h);
}
static kf_status kan_backward_s(kf_context *ctx, const kf__kan_bwd *c) {
    return kan_run_backward(c, KAN_S, kan_bwd_team_s);
}
static kf_status kan_backward_d(kf_context *ctx, const kf__kan_bwd *c) {
    return kan_run_backward(c, KAN_D, kan_bwd_team_d);
}
static kf_status kan_backward_b(kf_context *ctx, const kf__kan_bwd *c) {
    return kan_run_backward(c, KAN_B, kan_bwd_team_b);
}
static kf_status kan_backward_h(kf_context *ctx, const kf__kan_bwd *c) {
    return kan_run_backward(c, KAN_H, kan_bwd_team_h);
}
static const kf__kan_ops kan_ops_s = {NULL, kan_workspace_s, kan_forward_s, kan_backward_s};
static const kf__kan_ops kan_ops_d = {NULL, kan_workspace_d, kan_forward_d, kan_backward_d};
static const kf__kan_ops kan_ops_b = {NULL, kan_workspace_b, kan_forward_b, kan_backward_b};
static const kf__kan_ops kan_ops_h = {NULL, kan_workspace_h, kan_forward_h, kan_backward_h};

/* The table of the plan's dtype, once, at plan creation (every dtype and spline order served). */
static kf_status kan_select(const struct kf_kan_linear_plan *p, const char *fn,
                            const kf__kan_ops **ops) {
    switch (p->dtype) {
    case KF_DTYPE_F64: *ops = &kan_ops_d; break;
    case KF_DTYPE_BF16: *ops = &kan_ops_b; break;
    case KF_DTYPE_F16: *ops = &kan_ops_h; break;
    default: *ops = &kan_ops_s; break;
    }
    return KF_OK;
}

const kf__kan_ops kf__cpu_kan_ops = {kan_select, NULL, NULL, NULL};

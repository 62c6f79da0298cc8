/* CPU backend of the sketched linear layer: two products through the 2r-wide bottleneck
 * (notation of core/sklinear_backend.h), from the context's own threads, no allocation.
 *
 * Every product has one side of 2r (or r, or k) columns and runs on kf__rowgemm (cpu/rowgemm.h),
 * which reads its operands in place and writes each output once, bias included: a BLAS GEMM
 * spends more on packing its operands and on separate passes over C than on the product at
 * these shapes (against OpenBLAS, one thread, interleaved minima, new/old, fwd / fwd+bwd, B=64:
 * in=out=256 L=1 k=16 0.71 / 0.72; 8192 L=1 k=16 0.68 / 0.76; 8192 L=4 k=32 0.75 / 0.87;
 * 1024 with B=1024 rows 0.64 / 0.76).
 *  - forward: Z = x W1 with W1 = [S1_1..S1_L | U2_1..U2_L] [in, 2r], k columns per term
 *    straight from the sketches, then y = s Z [U1; S2] + bias (U1s and S2s are [r, out]
 *    matrices already; s = 1 / (2L));
 *  - backward: dZ = s dy [U1; S2]^T, over B2^T = [U1; S2]^T [out, 2r] copied into the workspace
 *    where the bottleneck is narrow (2r <= KF__SKL_RG_MAX), else by BLAS on U1 and S2 in place;
 *    dx = dZ W1^T over W1^T copied into the workspace; dS2 = s Z[:, r:]^T dy and
 *    dS1_i = x^T dZ[:, i k:(i + 1) k] straight into the parameter layouts; dbias = the column
 *    sums of dy.
 *
 * Work is split into fixed blocks, round-robin to the threads; every element has one writer, and
 * since the blocks (hence every product call and every sum's order) depend on the shape alone,
 * the bits do not depend on the thread count. Two splits of the products through the bottleneck:
 *  - rows (the default): blocks of KF__SKL_ROWS rows of x run both stages;
 *  - wide (few rows, the layer's usual batch, and in, out >= 512): each stage is split along its
 *    weights instead, so that each weight is read once per call. The first stage Z = x W1 is
 *    split over `in` (each block writes a partial Z, summed in block order), the second
 *    y = s Z [U1; S2] over `out`; backward likewise (dZ partials over `out`, the recomputed Z
 *    over `in`, then dx by blocks of `in`). The rule and the measured gain: KF__SKL_WIDE_ROWS.
 * The reductions over rows (dS1s, dS2s, dbias) are split by parameter columns in both.
 *
 * One implementation for every dtype: KF__SKL_CPU_DEFINE below defines the team functions for a
 * storage type (float32, float64, bfloat16, float16) and its arithmetic type (float32, or
 * float64); each dtype has its own op table (KF__SKL_CPU_OPS), chosen at plan creation. A
 * bfloat16 or float16 plan reads x, the
 * weights and dy in place, widening them as the products load them (cpu/rowgemm.h's typed
 * operands), computes in float32 and rounds each result once as it is written (y and dx in the
 * products' epilogue; the parameter gradients through a float32 block, which the accumulation
 * round(old + g) needs): no conversion passes over whole tensors (1.7.1; before, the conversion
 * layer's passes made the 8192^2 B=64 forward 1.3x float32's on two threads, and 1.6x and more
 * in a steady loop). The widening inside the products and the rounding of the results still
 * cost something: 1.1-1.25x float32's time on an AVX-512 Xeon at 256^2 and 8192^2, B=64, in
 * this baseline build (benches/results/avx512/cpu_lowp.md); 0.87-1.01x in the AVX-512 one
 * (benches/results/avx512/cpu_sklinear_v4.md).
 *
 * Two builds of this file (as of the recurrent kernels): the baseline's (KF_CPU_ARCH, 8-float
 * vectors) and, where CMake's KF_CPU_AVX512 holds, an x86-64-v4 one (cpu/sklinear_v4.c: 16-float
 * vectors and 8-row tiles in cpu/rowgemm.h, 16-lane conversions in cpu/lowp_simd.h), each with
 * its op tables (kf__cpu_skl_ops_base(), kf__cpu_skl_ops_v4(): one per dtype); the plan takes
 * the one of its context's ISA (cpu/isa.c) and its dtype at creation (skl_select, end of file).
 * The blocks, the workspace and every sum's order are the
 * same in both, except that a product whose columns end in a partial vector (cpu/rowgemm.h)
 * sums a reduction over more than 256 rows in chunks there: so the bits are the baseline's but
 * for such shapes (k = 8 on AVX-512 with N > 256, say), and never depend on the thread count. */
#include "cpu_backend.h"

#include "blas.h"
#include "lowp.h"
#include "rowgemm.h"
#include "team.h"

#include <string.h>

/* Block extents, functions of the shape alone: rows of x per row-wise block (each block reads
 * all of the weights again), and parameter columns per reduction product: at least 256, and at
 * most 8 blocks (these products are skinny, K = N rows and 2r columns, so fewer, wider calls
 * win: in=out=8192, B=64, forward+backward took 6.9 ms with blocks of 1024 and 8.3 ms with
 * blocks of 256, side by side, on BLAS). */
#define KF__SKL_ROWS 32
/* The wide split serves at most this many rows, and only where both stages split into two blocks
 * or more (in, out >= 512: below that it leaves a team's second thread idle). Best of 3-4
 * interleaved runs, one thread, box loaded by other builds, old (rows) / new (wide) ms, fwd and
 * fwd+bwd, B = 64: in=out=8192 L=1 k=16 0.99 / 0.95, 3.27 / 3.10; 1024 L=4 k=32 0.80 / 0.73,
 * 2.47 / 2.22; 1024 L=1 k=16 0.099 / 0.087, 0.270 / 0.259; two threads 8192: 1.00 / 0.87,
 * 3.43 / 2.80; 1024 L=4 k=32: 0.47 / 0.41, 1.46 / 1.23. Many rows amortise the weights' re-reads
 * and give every thread row blocks, so larger batches keep the row split. */
#define KF__SKL_WIDE_ROWS 256
/* The widest bottleneck 2r whose dZ runs on kf__rowgemm. dZ's kf__rowgemm re-reads dy once per
 * panel of 2r's columns, where BLAS's packing pays for wider ones: 1 thread, new/old, fwd+bwd,
 * in=out=8192 L=4 k=32 (2r = 256): 1.07 with BLAS for dZ, 1.53 with kf__rowgemm. */
#define KF__SKL_RG_MAX 64
/* The transposed copies go by blocks of this many rows of the source, which stay in cache while
 * every column of the copy takes its element from them. */
#define KF__SKL_TBLOCK 64
#define KF__SKL_COLSUM 256 /* dbias columns summed at a time (double accumulators on the stack) */
static int64_t skl_cols(int64_t n) {
    int64_t c = (n + 7) / 8;
    return c < 256 ? 256 : c;
}

static int64_t skl_nblocks(int64_t n) { return (n + skl_cols(n) - 1) / skl_cols(n); }

/* Block b of extent `step` over [0, n): [*lo, *hi), false past the end. */
static bool skl_block(int64_t n, int64_t step, int64_t b, int64_t *lo, int64_t *hi) {
    *lo = b * step;
    *hi = *lo + step < n ? *lo + step : n;
    return *lo < n;
}

typedef struct skl_layout {
    bool wide;        /* the wide split (header comment) */
    int64_t nbi, nbo; /* blocks over in and over out (skl_cols) */
    /* byte offsets of W1^T [2r, in] (dx), B2^T [out, 2r] (dZ; none where the bottleneck is
     * wide), Z [N, 2r], dZ [N, 2r] and, in the wide split, the partial sums: forward nbi x
     * [N, 2r] (Z); backward nbi x [N, r] (Z's second half) then nbo x [N, 2r] (dZ) */
    size_t w1, b2, z, dz, part, bytes;
    /* W1^T's row stride in elements: in plus one cache line, so that its 2r rows (read together
     * by dx's kf__rowgemm) do not all fall in one L1 set when in is a power of two */
    int64_t ldw;
    bool rg; /* a narrow bottleneck, or a low-precision plan: dZ on kf__rowgemm (skl_dz_X) */
    /* A low-precision plan's float32 results before they are rounded into its tensors: y [N,
     * out] (forward); dx [N, in], dS1s [r, in], dS2s [r, out] (backward); y's and dx's empty
     * where they are written directly; 0 for the other dtypes */
    size_t ysh, dxsh, d1sh, d2sh;
    /* A plan with an epilogue (an activation or dropout): the gradient through it, [N, out] of
     * the plan's dtype, which backward's products read in dy's place (skl_epi_grad_X) */
    bool epi;
    size_t g;
} skl_layout;

/* Whether a low plan's y and dx (products over K = 2r) go through float32 blocks: where 2r takes
 * more than one pass over B's chunks (cpu/rowgemm.h: a low C takes no chunked K). */
#define KF__SKL_BLOCKS(r) (2 * (r) > KF__RG_KC)

static skl_layout skl_layout_of(const struct kf_sklinear_plan *p, int64_t N) {
    skl_layout lo;
    const size_t e = p->dtype == KF_DTYPE_F64 ? sizeof(double) : sizeof(float);
    lo.nbi = skl_nblocks(p->in);
    lo.nbo = skl_nblocks(p->out);
    lo.wide = N <= KF__SKL_WIDE_ROWS && lo.nbi > 1 && lo.nbo > 1;
    size_t z = kf__align_up((size_t)(N * 2 * p->r) * e);
    lo.w1 = 0;
    lo.ldw = p->in + (int64_t)(64 / e);
    const bool low = kf__dtype_is_lowp(p->dtype);
    lo.rg = 2 * p->r <= KF__SKL_RG_MAX || low; /* BLAS takes no low operands */
    lo.b2 = lo.w1 + kf__align_up((size_t)(lo.ldw * 2 * p->r) * e);
    lo.z = lo.b2 + (lo.rg ? kf__align_up((size_t)(p->out * 2 * p->r) * e) : 0);
    lo.dz = lo.z + z;
    lo.part = lo.dz + z;
    const int64_t fwd = lo.nbi * 2, bwd = lo.nbi + lo.nbo * 2; /* in units of N r elements */
    lo.bytes = lo.part + (lo.wide ? (size_t)((fwd > bwd ? fwd : bwd) * N * p->r) * e : 0);
    lo.ysh = lo.dxsh = lo.d1sh = lo.d2sh = 0;
    if (low) {
        const bool blocks = KF__SKL_BLOCKS(p->r); /* y's and dx's blocks */
        lo.ysh = lo.dxsh = lo.bytes;
        lo.d1sh = lo.dxsh + (blocks ? kf__align_up((size_t)(N * p->in) * e) : 0);
        lo.d2sh = lo.d1sh + kf__align_up((size_t)(p->r * p->in) * e);
        const size_t fsh = lo.ysh + (blocks ? kf__align_up((size_t)(N * p->out) * e) : 0),
                     bsh = lo.d2sh + kf__align_up((size_t)(p->r * p->out) * e);
        lo.bytes = fsh > bsh ? fsh : bsh;
    }
    lo.epi = p->act != KF_ACTIVATION_NONE || p->dropout > 0.0f;
    lo.g = lo.bytes;
    if (lo.epi) lo.bytes += kf__align_up((size_t)(N * p->out) * e);
    return lo;
}

static size_t skl_workspace(const struct kf_sklinear_plan *p, int64_t N) {
    return skl_layout_of(p, N).bytes;
}

static void *skl_at(void *ws, size_t off) { return (char *)ws + off; }

/* The forward's multiply-adds, N (in + out) 2r, decide the team of both directions. */
static int32_t skl_team_size(const kf_context *ctx, const struct kf_sklinear_plan *p, int64_t N) {
    return kf__cpu_team_size(ctx->num_threads,
                             (double)N * (double)(p->in + p->out) * 2.0 * (double)p->r);
}

typedef struct skl_fwd_call {
    const kf__skl_fwd *c;
    skl_layout lo;
    kf__rg_epi epi;       /* y's epilogue (origin: y) */
    const kf__rg_epi *ep; /* &epi, or NULL where the call has none (no activation, dropout, pre) */
} skl_fwd_call;

static void skl_fwd_call_init(skl_fwd_call *call, const kf__skl_fwd *c) {
    const struct kf_sklinear_plan *p = c->plan;
    call->c = c;
    call->lo = skl_layout_of(p, c->N);
    call->epi = (kf__rg_epi){.act = p->act, .p = c->epi.p, .scale_s = kf__dropout_scale_s(c->epi.p),
                             .scale_d = kf__dropout_scale_d(c->epi.p), .seed = c->epi.seed,
                             .offset = c->epi.offset, .origin = c->y, .pre = c->pre};
    const bool on = p->act != KF_ACTIVATION_NONE || c->epi.p > 0.0f || c->pre;
    call->ep = on ? &call->epi : NULL;
}

typedef struct skl_bwd_call {
    const kf__skl_bwd *c;
    skl_layout lo;
} skl_bwd_call;

/* Per storage kind (cpu/rowgemm.h): whether a low kind is bfloat16, and where a product writes
 * a result: the caller's tensor `dst` (float32, float64), or the float32 block at byte `off` of
 * the workspace (bfloat16, float16; skl_out_X rounds it into `dst`). */
#define KF__SKL_BF16_s false
#define KF__SKL_BF16_d false
#define KF__SKL_BF16_b true
#define KF__SKL_BF16_h false
#define KF__SKL_RES(k, dst, ws, off) (KF__RG_NATIVE_##k ? (void *)(dst) : skl_at((ws), (off)))
/* Whether y and dx (products over K = 2r) are written by their products directly, rounded once
 * in the epilogue: always for float32 and float64; for a low kind unless KF__SKL_BLOCKS. */
#define KF__SKL_DIRECT(k, r) (KF__RG_NATIVE_##k || !KF__SKL_BLOCKS(r))

/* g[l] = g[l] * mask / (1 - p) * act'(pre[l]) for n gradients of y at flat index i (pre NULL: the
 * plan has no activation), in float: act' by a loop per kind, so that it vectorises
 * (common/activation.h); then the mask. */
static void skl_grad_s(const kf__skl_bwd *c, const float *pre, float *g, int n, int64_t i) {
    switch (c->plan->act) {
    case KF__ACT_RELU:
        for (int l = 0; l < n; ++l) g[l] *= kf__act_grad_s(KF__ACT_RELU, pre[l]);
        break;
    case KF__ACT_GELU:
        for (int l = 0; l < n; ++l) g[l] *= kf__act_grad_s(KF__ACT_GELU, pre[l]);
        break;
    case KF__ACT_GELU_TANH:
        for (int l = 0; l < n; ++l) g[l] *= kf__act_grad_s(KF__ACT_GELU_TANH, pre[l]);
        break;
    case KF__ACT_SILU:
        for (int l = 0; l < n; ++l) g[l] *= kf__act_grad_s(KF__ACT_SILU, pre[l]);
        break;
    default: break;
    }
    const float p = c->epi.p, sc = kf__dropout_scale_s(p);
    if (p > 0.0f)
        for (int l = 0; l < n; ++l)
            g[l] = kf__drop_s(p, sc, c->epi.seed, c->epi.offset + (uint64_t)(i + l), g[l]);
}

/* The same in double (float64 plans: libm's functions, element by element). */
static void skl_grad_d(const kf__skl_bwd *c, const double *pre, double *g, int n, int64_t i) {
    const double sc = kf__dropout_scale_d(c->epi.p);
    for (int l = 0; l < n; ++l)
        g[l] = kf__epi_grad_d(c->plan->act, c->epi.p, sc, c->epi.seed,
                              c->epi.offset + (uint64_t)(i + l), pre ? pre[l] : 0.0, g[l]);
}

/* For storage type TS of kind SK (cpu/rowgemm.h's kinds: s float, d double, b bfloat16, h
 * float16) and arithmetic type T of kind CK (s or d; also the BLAS prefix), function suffix X:
 *  skl_pack_w1t_X: columns [a0, a1) of W1^T [2r, in] in T (row stride ldw; element (j, a): term
 *    j % r / k of S1s (j < r) or U2s, column j % k);
 *  skl_pack_b2t_X: rows [o0, o1) of B2^T = [U1; S2]^T [out, 2r] in T;
 *  skl_z_X: Z[:, j0:2r] = x[:, a0:a1] W1[a0:a1, j0:2r] into Zj (column j0's address; row
 *    stride ldz), j0 = 0 or r (backward needs only the second half);
 *  skl_dz_X: dz [rows, 2r] = s dy[:, o0:o1] [U1; S2][:, o0:o1]^T;
 *  skl_sum_X: the wide split's partial sums, in block order;
 *  skl_out_X: a low-precision plan's results, [rows, cols] of row stride ld, from their float32
 *    block in the workspace into the caller's tensor: round(g), or round(old + g) (nothing for
 *    float32 and float64 plans, whose products write the caller's tensors themselves);
 *  skl_fwd_team_X, skl_bwd_team_X: one thread's share of forward and backward.
 * The products read x, the weights and dy in place in TS (cpu/rowgemm.h's typed operands) and
 * write T: the caller's tensor where TS is T, else the float32 block (KF__SKL_RES) that skl_out_X
 * then rounds, block by block, by the thread that wrote it (still in its cache). */
#define KF__SKL_CPU_DEFINE(X, TS, SK, T, CK)                                                       \
    static void skl_pack_w1t_##X(const struct kf_sklinear_plan *p, const TS *S1, const TS *U2,     \
                                 T *W1T, int64_t ldw, int64_t a0, int64_t a1) {                    \
        const int64_t in = p->in, kk = p->k, r = p->r;                                             \
        if (!KF__RG_NATIVE_##SK) { /* a row of a sketch widened by vectors, then scattered */     \
            float t[KF__SKL_TBLOCK];                                                               \
            for (int64_t j0 = 0; j0 < 2 * r; j0 += kk) /* term j0 / k of S1s, then of U2s */       \
                for (int64_t a = a0; a < a1; ++a)                                                  \
                    for (int64_t c0 = 0; c0 < kk; c0 += KF__SKL_TBLOCK) {                          \
                        const int64_t w = kk - c0 < KF__SKL_TBLOCK ? kk - c0 : KF__SKL_TBLOCK;     \
                        KF__RG_WIDEN_##SK((j0 < r ? S1 : U2) + (j0 % r / kk * in + a) * kk + c0,   \
                                          t, w);                                                   \
                        for (int64_t c = 0; c < w; ++c) W1T[(j0 + c0 + c) * ldw + a] = (T)t[c];    \
                    }                                                                              \
            return;                                                                                \
        }                                                                                          \
        for (int64_t b0 = a0; b0 < a1; b0 += KF__SKL_TBLOCK) {                                     \
            const int64_t b1 = b0 + KF__SKL_TBLOCK < a1 ? b0 + KF__SKL_TBLOCK : a1;                \
            for (int64_t j = 0; j < 2 * r; ++j) {                                                  \
                const TS *src = (j < r ? S1 : U2) + (j % r / kk) * in * kk + j % kk;               \
                T *dst = W1T + j * ldw;                                                            \
                for (int64_t a = b0; a < b1; ++a) dst[a] = KF__RG_GET_##SK(src + a * kk);          \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    static void skl_pack_b2t_##X(const struct kf_sklinear_plan *p, const TS *U1, const TS *S2,     \
                                 T *B2T, int64_t o0, int64_t o1) {                                 \
        const int64_t out = p->out, r = p->r;                                                      \
        for (int64_t b0 = o0; b0 < o1; b0 += KF__SKL_TBLOCK) {                                     \
            const int64_t b1 = b0 + KF__SKL_TBLOCK < o1 ? b0 + KF__SKL_TBLOCK : o1;                \
            for (int64_t j = 0; j < 2 * r; ++j) {                                                  \
                const TS *src = (j < r ? U1 : S2) + (j % r) * out;                                 \
                float t[KF__SKL_TBLOCK]; /* a low row widened by vectors first */                  \
                KF__RG_WIDEN_##SK(src + b0, t, b1 - b0);                                           \
                for (int64_t o = b0; o < b1; ++o)                                                  \
                    B2T[o * 2 * r + j] = KF__RG_NATIVE_##SK ? (T)src[o] : (T)t[o - b0];            \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    static void skl_z_##X(const struct kf_sklinear_plan *p, int64_t rows, const TS *x,             \
                          const TS *S1, const TS *U2, int64_t a0, int64_t a1, int64_t j0, T *Zj,   \
                          int64_t ldz) {                                                           \
        const int64_t in = p->in, kk = p->k, r = p->r;                                             \
        for (int64_t h = j0 / r; h < 2; ++h)                                                       \
            for (int64_t i = 0; i < p->L; ++i) {                                                   \
                const TS *w = (h ? U2 : S1) + (i * in + a0) * kk;                                  \
                kf__rowgemm_##SK##SK##CK(rows, kk, a1 - a0, a1 - a0, 1, x + a0, in, 1, w, w, kk,   \
                                         NULL, false, Zj + h * r - j0 + i * kk, ldz);              \
            }                                                                                      \
    }                                                                                              \
                                                                                                   \
    /* Narrow (or low): over B2^T's rows [o0, o1) (packed by the caller); wide: two BLAS GEMMs     \
     * on U1 and S2 in place. */                                                                   \
    static void skl_dz_##X(const struct kf_sklinear_plan *p, const skl_layout *lo, int64_t rows,   \
                           const TS *dy, const TS *U1, const TS *S2, const T *B2T, int64_t o0,     \
                           int64_t o1, T *dz) {                                                    \
        const int64_t out = p->out, r = p->r;                                                      \
        const T s = (T)1 / ((T)2 * (T)p->L);                                                       \
        if (lo->rg) {                                                                              \
            const T *bt = B2T + o0 * 2 * r;                                                        \
            kf__rowgemm_##SK##CK##CK(rows, 2 * r, o1 - o0, o1 - o0, s, dy + o0, out, 1, bt, bt,    \
                                     2 * r, NULL, false, dz, 2 * r);                               \
            return;                                                                                \
        }                                                                                          \
        /* TS is T here (a low plan is always lo->rg) */                                           \
        kf__##CK##gemm(false, true, rows, r, o1 - o0, s, (const T *)dy + o0, out,                  \
                      (const T *)U1 + o0, out, 0, dz, 2 * r);                                      \
        kf__##CK##gemm(false, true, rows, r, o1 - o0, s, (const T *)dy + o0, out,                  \
                      (const T *)S2 + o0, out, 0, dz + r, 2 * r);                                  \
    }                                                                                              \
                                                                                                   \
    /* dst [N, w] (row stride ld) = the sum over b < nb of part + b N w ([N, w] each), summed in   \
     * block order whatever the thread: this thread's share of the rows. */                        \
    static void skl_sum_##X(const T *part, int64_t nb, int64_t N, int64_t w, T *dst, int64_t ld,   \
                            int tid, int nth) {                                                    \
        int64_t n0, n1;                                                                            \
        kf__cpu_share(N, tid, nth, &n0, &n1);                                                      \
        for (int64_t n = n0; n < n1; ++n) {                                                        \
            T *d = dst + n * ld;                                                                   \
            memcpy(d, part + n * w, (size_t)w * sizeof(T));                                        \
            for (int64_t b = 1; b < nb; ++b) {                                                     \
                const T *q = part + (b * N + n) * w;                                               \
                for (int64_t j = 0; j < w; ++j) d[j] += q[j];                                      \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    static void skl_out_##X(const T *res, TS *dst, int64_t rows, int64_t cols, int64_t ld,         \
                            bool accumulate) {                                                     \
        if (KF__RG_NATIVE_##SK) return;                                                            \
        for (int64_t n = 0; n < rows; ++n)                                                         \
            kf__lp_store_n((uint16_t *)dst + n * ld, (const float *)res + n * ld, cols,            \
                           accumulate, KF__SKL_BF16_##SK);                                         \
    }                                                                                              \
                                                                                                   \
    /* db[o] (+)= sum over the N rows of dy[:, o], o in [o0, o1): rows outer, so the inner loop    \
     * runs along memory; double accumulators, KF__SKL_COLSUM columns at a time; a low plan's      \
     * sum is rounded to float32 first, then added to the old value in float32 and rounded. */     \
    static void skl_colsum_##X(const TS *dy, int64_t N, int64_t out, int64_t o0, int64_t o1,       \
                               TS *db, bool accumulate) {                                          \
        double acc[KF__SKL_COLSUM];                                                                \
        for (int64_t c0 = o0; c0 < o1; c0 += KF__SKL_COLSUM) {                                     \
            const int64_t w = o1 - c0 < KF__SKL_COLSUM ? o1 - c0 : KF__SKL_COLSUM;                 \
            for (int64_t j = 0; j < w; ++j) acc[j] = 0.0;                                          \
            for (int64_t n = 0; n < N; ++n) {                                                      \
                const TS *row = dy + n * out + c0;                                                 \
                if (KF__RG_NATIVE_##SK) {                                                          \
                    for (int64_t j = 0; j < w; ++j) acc[j] += row[j];                              \
                } else { /* widened by vectors first (float16 one at a time: 10% of 256^2) */     \
                    float t[KF__SKL_COLSUM];                                                       \
                    KF__RG_WIDEN_##SK(row, t, w);                                                  \
                    for (int64_t j = 0; j < w; ++j) acc[j] += t[j];                                \
                }                                                                                  \
            }                                                                                      \
            for (int64_t j = 0; j < w; ++j) {                                                      \
                TS *d = db + c0 + j;                                                               \
                const T v = !accumulate ? (T)acc[j]                                                \
                            : KF__RG_NATIVE_##SK ? (T)(KF__RG_GET_##SK(d) + acc[j])                \
                                                 : KF__RG_GET_##SK(d) + (T)acc[j];                 \
                KF__RG_PUT_##SK(d, v);                                                            \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    /* y[rows, o0:o1] = s Z_rows [U1; S2][:, o0:o1] + bias (row stride out): the second stage      \
     * for a block of rows (row split) or of output columns (wide split); through the float32      \
     * block ys unless direct (KF__SKL_DIRECT). */                                                 \
    static void skl_stage2_##X(const struct kf_sklinear_plan *p, const T *z, int64_t rows,         \
                               const TS *U1, const TS *S2, const TS *bias, int64_t o0,             \
                               int64_t o1, TS *y, T *ys, const kf__rg_epi *ep) {                   \
        const int64_t out = p->out, r = p->r;                                                      \
        const T s = (T)1 / ((T)2 * (T)p->L);                                                       \
        const TS *b = bias ? bias + o0 : NULL;                                                     \
        if (KF__SKL_DIRECT(SK, r)) { /* the epilogue in the product's store */                     \
            kf__rowgemm_epi_##CK##SK##SK(rows, o1 - o0, 2 * r, r, s, z, 2 * r, 1, U1 + o0,         \
                                         S2 + o0, out, b, false, y + o0, out, ep);                 \
            return;                                                                                \
        }                                                                                          \
        kf__rowgemm_##CK##SK##CK(rows, o1 - o0, 2 * r, r, s, z, 2 * r, 1, U1 + o0, S2 + o0, out,   \
                                 b, false, ys + o0, out);                                          \
        if (!ep) {                                                                                 \
            skl_out_##X(ys + o0, y + o0, rows, o1 - o0, out, false);                               \
            return;                                                                                \
        }                                                                                          \
        for (int64_t n = 0; n < rows && !KF__RG_NATIVE_##SK; ++n) { /* as it is rounded */        \
            float *v = (float *)ys + o0 + n * out;                                                 \
            const int64_t ix = y + o0 + n * out - (const TS *)ep->origin;                          \
            if (ep->pre)                                                                           \
                kf__lp_store_n((uint16_t *)ep->pre + ix, v, o1 - o0, false, KF__SKL_BF16_##SK);    \
            kf__rg_epi_s(ep, v, (int)(o1 - o0), ix);                                               \
            kf__lp_store_n((uint16_t *)y + o0 + n * out, v, o1 - o0, false, KF__SKL_BF16_##SK);    \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    /* The gradient through the epilogue, g = dy * mask / (1 - p) * act'(pre), in TS: this         \
     * thread's share of the rows, KF__SKL_COLSUM columns at a time in T (skl_grad_CK). */        \
    static void skl_epi_grad_##X(const kf__skl_bwd *c, TS *g, int tid, int nth) {                  \
        const int64_t out = c->plan->out;                                                          \
        const TS *dy = c->dy, *pre = c->pre;                                                       \
        T gb[KF__SKL_COLSUM], pb[KF__SKL_COLSUM];                                                  \
        int64_t n0, n1;                                                                            \
        kf__cpu_share(c->N, tid, nth, &n0, &n1);                                                   \
        for (int64_t n = n0; n < n1; ++n)                                                          \
            for (int64_t o0 = 0; o0 < out; o0 += KF__SKL_COLSUM) {                                 \
                const int w = (int)(out - o0 < KF__SKL_COLSUM ? out - o0 : KF__SKL_COLSUM);        \
                const int64_t i = n * out + o0;                                                    \
                for (int l = 0; l < w; ++l) gb[l] = (T)KF__RG_GET_##SK(dy + i + l);                \
                for (int l = 0; pre && l < w; ++l) pb[l] = (T)KF__RG_GET_##SK(pre + i + l);        \
                skl_grad_##CK(c, pre ? pb : NULL, gb, w, i);                                       \
                for (int l = 0; l < w; ++l) KF__RG_PUT_##SK(g + i + l, gb[l]);                     \
            }                                                                                      \
    }                                                                                              \
                                                                                                   \
    /* dx[rows, a0:a1] = dz W1[a0:a1, :]^T (row stride in), from W1^T packed; through the          \
     * float32 block dxs unless direct (KF__SKL_DIRECT). */                                        \
    static void skl_dx_##X(const struct kf_sklinear_plan *p, const skl_layout *lo, const T *dz,    \
                           const T *W1T, int64_t rows, int64_t a0, int64_t a1, TS *dx, T *dxs) {   \
        const int64_t in = p->in, r = p->r;                                                        \
        if (KF__SKL_DIRECT(SK, r)) {                                                               \
            kf__rowgemm_##CK##CK##SK(rows, a1 - a0, 2 * r, 2 * r, 1, dz, 2 * r, 1, W1T + a0,       \
                                     W1T + a0, lo->ldw, NULL, false, dx + a0, in);                 \
            return;                                                                                \
        }                                                                                          \
        kf__rowgemm_##CK##CK##CK(rows, a1 - a0, 2 * r, 2 * r, 1, dz, 2 * r, 1, W1T + a0,           \
                                 W1T + a0, lo->ldw, NULL, false, dxs + a0, in);                    \
        skl_out_##X(dxs + a0, dx + a0, rows, a1 - a0, in, false);                                  \
    }                                                                                              \
                                                                                                   \
    static void skl_fwd_team_##X(void *arg, int tid, int nth) {                                    \
        const kf__skl_fwd *c = ((const skl_fwd_call *)arg)->c;                                     \
        const skl_layout *lo = &((const skl_fwd_call *)arg)->lo;                                   \
        const kf__rg_epi *ep = ((const skl_fwd_call *)arg)->ep;                                    \
        const struct kf_sklinear_plan *p = c->plan;                                                \
        const int64_t in = p->in, out = p->out, r = p->r, N = c->N;                                \
        const TS *x = c->x;                                                                        \
        T *Z = skl_at(c->ws, lo->z), *P = skl_at(c->ws, lo->part);                                 \
        TS *Y = c->y;                                                                              \
        T *Ys = skl_at(c->ws, lo->ysh);                                                            \
        int64_t a0, a1, n0, n1, o0, o1;                                                            \
        if (lo->wide) {                                                                            \
            /* Z = x W1 by blocks of `in` */                                                       \
            for (int64_t b = tid; skl_block(in, skl_cols(in), b, &a0, &a1); b += nth) {            \
                skl_z_##X(p, N, x, c->S1, c->U2, a0, a1, 0,                                        \
                          lo->nbi > 1 ? P + b * N * 2 * r : Z, 2 * r);                             \
            }                                                                                      \
            if (lo->nbi > 1) {                                                                     \
                _Pragma("omp barrier")                                                             \
                skl_sum_##X(P, lo->nbi, N, 2 * r, Z, 2 * r, tid, nth);                             \
            }                                                                                      \
            _Pragma("omp barrier")                                                                 \
            for (int64_t b = tid; skl_block(out, skl_cols(out), b, &o0, &o1); b += nth)            \
                skl_stage2_##X(p, Z, N, c->U1, c->S2, c->bias, o0, o1, Y, Ys, ep);                 \
            return;                                                                                \
        }                                                                                          \
        for (int64_t b = tid; skl_block(N, KF__SKL_ROWS, b, &n0, &n1); b += nth) {                 \
            T *z = Z + n0 * 2 * r;                                                                 \
            skl_z_##X(p, n1 - n0, x + n0 * in, c->S1, c->U2, 0, in, 0, z, 2 * r);                  \
            skl_stage2_##X(p, z, n1 - n0, c->U1, c->S2, c->bias, 0, out, Y + n0 * out,             \
                           Ys + n0 * out, ep);                                                     \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    /* The wide split's products through the bottleneck: W1^T packed (for dx); Z's second half     \
     * (x U2, for dS2) by blocks of `in`; dZ by blocks of `out`; partial sums in block order. dx   \
     * is left to the column phase. */                                                             \
    static void skl_bwd_wide_##X(const kf__skl_bwd *c, const skl_layout *lo, const TS *DY,        \
                                 int tid, int nth) {                                               \
        const struct kf_sklinear_plan *p = c->plan;                                                \
        const int64_t in = p->in, out = p->out, r = p->r, N = c->N;                                \
        const TS *x = c->x, *U1 = c->U1, *S2 = c->S2;                                              \
        T *W1T = skl_at(c->ws, lo->w1), *B2T = skl_at(c->ws, lo->b2);                              \
        T *Z = skl_at(c->ws, lo->z), *dZ = skl_at(c->ws, lo->dz);                                  \
        T *Pz = skl_at(c->ws, lo->part), *Pd = Pz + lo->nbi * N * r;                               \
        int64_t a0, a1, o0, o1;                                                                    \
        const bool zsum = c->dS2 && lo->nbi > 1, dsum = lo->nbo > 1;                               \
        for (int64_t j = tid; j < lo->nbi + lo->nbo; j += nth) {                                   \
            if (j < lo->nbi) {                                                                     \
                skl_block(in, skl_cols(in), j, &a0, &a1);                                          \
                if (c->dx) skl_pack_w1t_##X(p, c->S1, c->U2, W1T, lo->ldw, a0, a1);                \
                if (c->dS2) /* a partial holds Z's second half only */                             \
                    skl_z_##X(p, N, x, c->S1, c->U2, a0, a1, r,                                    \
                              zsum ? Pz + j * N * r : Z + r, zsum ? r : 2 * r);                    \
            } else {                                                                               \
                const int64_t b = j - lo->nbi;                                                     \
                skl_block(out, skl_cols(out), b, &o0, &o1);                                        \
                if (lo->rg) skl_pack_b2t_##X(p, U1, S2, B2T, o0, o1);                              \
                skl_dz_##X(p, lo, N, DY, U1, S2, B2T, o0, o1, dsum ? Pd + b * N * 2 * r : dZ);     \
            }                                                                                      \
        }                                                                                          \
        _Pragma("omp barrier")                                                                     \
        if (zsum) skl_sum_##X(Pz, lo->nbi, N, r, Z + r, 2 * r, tid, nth);                          \
        if (dsum) skl_sum_##X(Pd, lo->nbo, N, 2 * r, dZ, 2 * r, tid, nth);                         \
    }                                                                                              \
                                                                                                   \
    static void skl_bwd_team_##X(void *arg, int tid, int nth) {                                    \
        const kf__skl_bwd *c = ((const skl_bwd_call *)arg)->c;                                     \
        const skl_layout *lo = &((const skl_bwd_call *)arg)->lo;                                   \
        const struct kf_sklinear_plan *p = c->plan;                                                \
        const int64_t in = p->in, out = p->out, r = p->r, kk = p->k, N = c->N;                     \
        const T s = (T)1 / ((T)2 * (T)p->L);                                                       \
        const bool acc = c->accumulate, pacc = KF__RG_NATIVE_##SK && acc;                          \
        const TS *x = c->x, *U1 = c->U1, *S2 = c->S2, *DY = c->dy;                                 \
        if (lo->epi) { /* the products read the gradient through the epilogue in dy's place */     \
            TS *g = skl_at(c->ws, lo->g);                                                          \
            skl_epi_grad_##X(c, g, tid, nth);                                                      \
            DY = g;                                                                                \
            _Pragma("omp barrier")                                                                 \
        }                                                                                          \
        TS *dX = c->dx;                                                                            \
        T *dXs = skl_at(c->ws, lo->dxsh);                                                          \
        T *dS1 = c->dS1 ? KF__SKL_RES(SK, c->dS1, c->ws, lo->d1sh) : NULL;                         \
        T *dS2 = c->dS2 ? KF__SKL_RES(SK, c->dS2, c->ws, lo->d2sh) : NULL;                         \
        T *W1T = skl_at(c->ws, lo->w1), *B2T = skl_at(c->ws, lo->b2);                              \
        T *Z = skl_at(c->ws, lo->z), *dZ = skl_at(c->ws, lo->dz);                                  \
        int64_t a0, a1, n0, n1, o0, o1;                                                            \
        if (lo->wide) {                                                                            \
            skl_bwd_wide_##X(c, lo, DY, tid, nth);                                                 \
        } else {                                                                                   \
            kf__cpu_share(in, tid, nth, &a0, &a1);                                                 \
            if (dX) skl_pack_w1t_##X(p, c->S1, c->U2, W1T, lo->ldw, a0, a1);                       \
            kf__cpu_share(out, tid, nth, &o0, &o1);                                                \
            if (lo->rg) skl_pack_b2t_##X(p, U1, S2, B2T, o0, o1);                                  \
            _Pragma("omp barrier")                                                                 \
            /* Row-wise: the recomputed second half of Z (for dS2), dZ, dx. */                     \
            for (int64_t b = tid; skl_block(N, KF__SKL_ROWS, b, &n0, &n1); b += nth) {             \
                const int64_t rows = n1 - n0;                                                      \
                T *dz = dZ + n0 * 2 * r;                                                           \
                if (dS2)                                                                           \
                    skl_z_##X(p, rows, x + n0 * in, c->S1, c->U2, 0, in, r,                        \
                              Z + n0 * 2 * r + r, 2 * r);                                          \
                skl_dz_##X(p, lo, rows, DY + n0 * out, U1, S2, B2T, 0, out, dz);                   \
                if (dX) skl_dx_##X(p, lo, dz, W1T, rows, 0, in, dX + n0 * in, dXs + n0 * in);      \
            }                                                                                      \
        }                                                                                          \
        _Pragma("omp barrier")                                                                     \
        /* Column-wise: dS2 and dbias by output column; dS1 (and, in the wide split, dx) by        \
         * input column. dS2 = s Z[:, r:]^T dy and dS1_i = x^T dZ[:, i k:(i + 1) k] go straight    \
         * into the parameter layouts ([L, k, out] and [L, in, k]). */                             \
        for (int64_t b = tid; skl_block(out, skl_cols(out), b, &o0, &o1); b += nth) {              \
            if (dS2) {                                                                             \
                kf__rowgemm_##CK##SK##CK(r, o1 - o0, N, N, s, Z + r, 1, 2 * r, DY + o0, DY + o0,   \
                                         out, NULL, pacc, dS2 + o0, out);                          \
                skl_out_##X(dS2 + o0, (TS *)c->dS2 + o0, r, o1 - o0, out, acc);                    \
            }                                                                                      \
            if (c->db) skl_colsum_##X(DY, N, out, o0, o1, c->db, acc);                             \
        }                                                                                          \
        for (int64_t b = tid; skl_block(in, skl_cols(in), b, &a0, &a1); b += nth) {                \
            if (dX && lo->wide) skl_dx_##X(p, lo, dZ, W1T, N, a0, a1, dX, dXs);                    \
            if (dS1)                                                                               \
                for (int64_t i = 0; i < p->L; ++i) {                                               \
                    T *d1 = dS1 + (i * in + a0) * kk;                                              \
                    kf__rowgemm_##SK##CK##CK(a1 - a0, kk, N, N, 1, x + a0, 1, in, dZ + i * kk,     \
                                             dZ + i * kk, 2 * r, NULL, pacc, d1, kk);              \
                    skl_out_##X(d1, (TS *)c->dS1 + (i * in + a0) * kk, 1, (a1 - a0) * kk, 0,       \
                                acc);                                                              \
                }                                                                                  \
        }                                                                                          \
    }

KF__SKL_CPU_DEFINE(s, float, s, float, s)
KF__SKL_CPU_DEFINE(d, double, d, double, d)
KF__SKL_CPU_DEFINE(b, uint16_t, b, float, s)
KF__SKL_CPU_DEFINE(h, uint16_t, h, float, s)

/* One op table per (instruction set, dtype): skl_ops_X runs the team functions of X alone, so no
 * call branches on the dtype or the ISA; skl_select picks the table once, at plan
 * creation. */
#define KF__SKL_CPU_OPS(X)                                                                         \
    static kf_status skl_forward_##X(kf_context *ctx, const kf__skl_fwd *c) {                      \
        skl_fwd_call call;                                                                         \
        skl_fwd_call_init(&call, c);                                                               \
        kf__cpu_team(skl_team_size(ctx, c->plan, c->N), skl_fwd_team_##X, &call);                  \
        return KF_OK;                                                                              \
    }                                                                                              \
    static kf_status skl_backward_##X(kf_context *ctx, const kf__skl_bwd *c) {                     \
        skl_bwd_call call = {.c = c, .lo = skl_layout_of(c->plan, c->N)};                          \
        kf__cpu_team(skl_team_size(ctx, c->plan, c->N), skl_bwd_team_##X, &call);                  \
        return KF_OK;                                                                              \
    }                                                                                              \
    static const kf__skl_ops skl_ops_##X = {NULL, skl_workspace, skl_forward_##X,                  \
                                            skl_backward_##X};

KF__SKL_CPU_OPS(s)
KF__SKL_CPU_OPS(d)
KF__SKL_CPU_OPS(b)
KF__SKL_CPU_OPS(h)

/* This build's table for a dtype (the front end has accepted only these four). */
#ifdef KF__SKL_V4
const kf__skl_ops *kf__cpu_skl_ops_v4(kf_dtype dtype)
#else
const kf__skl_ops *kf__cpu_skl_ops_base(kf_dtype dtype)
#endif
{
    return dtype == KF_DTYPE_F64    ? &skl_ops_d
           : dtype == KF_DTYPE_BF16 ? &skl_ops_b
           : dtype == KF_DTYPE_F16  ? &skl_ops_h
                                    : &skl_ops_s;
}

#ifndef KF__SKL_V4
/* The CPU backend's entry: the table of the context's ISA (kf_context.isa, picked at context
 * creation by cpu/isa.c) and the plan's dtype. */
static kf_status skl_select(const struct kf_sklinear_plan *p, const char *fn,
                            const kf__skl_ops **ops) {
#ifdef KF_HAVE_CPU_V4
    if (p->ctx->isa == KF__CPU_ISA_V4) {
        *ops = kf__cpu_skl_ops_v4(p->dtype);
        return KF_OK;
    }
#endif
    *ops = kf__cpu_skl_ops_base(p->dtype);
    return KF_OK;
}

const kf__skl_ops kf__cpu_skl_ops = {skl_select, NULL, NULL, NULL};
#endif

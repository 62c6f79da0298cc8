/* The CPU SKLinear kernels' shared declarations (private to cpu/sklinear*): block extents, the
 * workspace layout (skl_layout: computed by cpu/sklinear.c), a call's arguments as the team
 * functions see them, and the gradient through the epilogue. The design is described at the top
 * of cpu/sklinear.c; the kernels are in cpu/sklinear_products.h (the products and the moves of a
 * call's tensors) and cpu/sklinear_teams.h (one thread's share of a call), each compiled once per
 * arithmetic type by cpu/sklinear.c, the storage kind a constant argument (cpu/rowgemm.h's
 * kf__rg_kind). */
#ifndef KF_CPU_SKLINEAR_CPU_H
#define KF_CPU_SKLINEAR_CPU_H

#include "cpu_backend.h"

#include "blas.h"
#include "lowp.h"
#include "rowgemm.h"
#include "team.h"

#include <string.h>

#define SKL_INLINE static inline __attribute__((always_inline))

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
static void *skl_at(void *ws, size_t off) { return (char *)ws + off; }

typedef struct skl_fwd_call {
    const kf__skl_fwd *c;
    skl_layout lo;
    kf__rg_epi epi;       /* y's epilogue (origin: y) */
    const kf__rg_epi *ep; /* &epi, or NULL where the call has none (no activation, dropout, pre) */
} skl_fwd_call;

typedef struct skl_bwd_call {
    const kf__skl_bwd *c;
    skl_layout lo;
} skl_bwd_call;

/* Where a product writes a result of storage kind k: the caller's tensor `dst` (float32,
 * float64), or the float32 block at byte `off` of the workspace (bfloat16, float16; skl_out_X
 * rounds it into `dst`). */
SKL_INLINE void *skl_res(kf__rg_kind k, void *dst, void *ws, size_t off) {
    return kf__rg_native(k) ? dst : skl_at(ws, off);
}
/* Whether y and dx (products over K = 2r) are written by their products directly, rounded once
 * in the epilogue: always for float32 and float64; for a low kind unless KF__SKL_BLOCKS. */
SKL_INLINE bool skl_direct(kf__rg_kind k, int64_t r) {
    return kf__rg_native(k) || !KF__SKL_BLOCKS(r);
}

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

#endif

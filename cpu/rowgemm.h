/* Products with one narrow side, without packing: C = alpha A B + (bias row | C | 0).
 *
 * SKLinear's products through its bottleneck have one side of 2r columns (r = L k, often 16-64)
 * and operands that are already row-major panels: x, the sketch matrices S1_i [in, k], U2_i
 * [in, k], U1_i and S2_i [k, out], dy. A BLAS GEMM packs both operands on every call (OpenBLAS:
 * ~25% of a 256^2 or 8192^2 SKLinear pass in its copy routines, and another ~5-10% in the
 * separate passes that set C to beta C or copy the bias in), which these shapes cannot amortise.
 * Here B is read in place, row by row, and A by broadcasts:
 *
 *   C[m, j] = alpha sum_q A[m am + q aq] B[q, j] (+ bias[j] | + C[m, j]),  m < M, j < n, q < K
 *
 * where B's K rows are two stacked panels: rows q < K0 at B0 + q ldb, rows q >= K0 at
 * B1 + (q - K0) ldb (SKLinear's [U1; S2] without forming it; K0 = K for one panel). So A may be
 * a row-major matrix (am = lda, aq = 1) or a transposed one (am = 1, aq = lda). C is written
 * once, with the bias or its old value added in registers.
 *
 * Blocking: panels of KF__RG_NV vectors of B's columns outer (then one of a single vector, then
 * a partial one), tiles of KF__RG_MR rows inner, K innermost; a tile keeps MR x NV vector
 * accumulators in registers (12 of AVX2's 16; 16 of AVX-512's 32, where the including file is
 * built with cpu/simd.h's 64-byte vectors: cpu/sklinear_v4.c) and per q loads NV vectors of B
 * and broadcasts MR elements of A. Where several tiles share a panel and B's rows lie
 * KF__RG_FAR_BYTES or more apart, K goes in chunks of KF__RG_KC rows, each first copied
 * contiguous, and C takes each chunk's sum in turn (kf__rg_panel_X). Every C element sums over
 * q in increasing order, in chunks that depend on the shape alone, so the bits do too. Columns
 * past the last vector take a partial panel, same order (chunked: its B always goes through the
 * copy).
 *
 * Also used by KANConv2d's forward product with few output channels (cpu/kan_linear.c).
 *
 * Typed operands: A, B (and the bias, B's type) and C may be stored as bfloat16 or float16 while
 * the arithmetic is float32 (cpu/sklinear.c's low-precision plans read and write their tensors
 * in place): each tile's rows of A are widened by vectors into a small buffer (a strided A
 * element by element as it is broadcast), B's rows are widened into the contiguous chunk above
 * (a low B always goes through it), so the tiles run on float32 alone, and a low C is rounded
 * once as the epilogue writes it. A low C must take K in one pass (K <= KF__RG_KC, or B's rows
 * close together and B not low): a later chunk would add to the rounded value.
 *
 * KF__ROWGEMM_DEFINE(X, TA, a, TB, b, TC, e, T, v) defines kf__rowgemm_X for A elements of type
 * TA and kind a, B (and bias) elements of type TB and kind b, C of type TC and kind e, alpha and
 * the arithmetic of type T with vector kind v (cpu/simd.h's kf__vX, kf__fma_X, kf__splat_X: s
 * float, d double). A kind is s (float), d (double), b (bfloat16) or h (float16): KF__RG_GET_k
 * reads one element as the arithmetic type, KF__RG_PUT_k writes one, KF__RG_VLD_k and
 * KF__RG_VST_k a vector, KF__RG_NATIVE_k says whether the kind is an arithmetic type (read in
 * place). X names the kinds of A, B and C: kf__rowgemm_sss and _ddd (float, double), and for a
 * low kind k (b, h) _kks, _kss, _sks, _skk and _ssk (KF__ROWGEMM_LOW). */
#ifndef KF_CPU_ROWGEMM_H
#define KF_CPU_ROWGEMM_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "activation.h"
#include "lowp_simd.h"
#include "simd.h"

/* An epilogue applied as C is stored (kf__rowgemm_epi_X; SKLinear's fused activation and
 * dropout, common/activation.h): C's element at index i from `origin` (its flat index in the
 * output) is stored as kf__epi_X(act, p, scale, seed, offset + i, value), and its value before
 * that is written to pre + i where pre is not NULL. Applied by the last of K's chunks only. */
typedef struct kf__rg_epi {
    int32_t act;
    float p, scale_s; /* dropout probability (0: none) and 1 / (1 - p) in float */
    double scale_d;   /* and in double */
    uint64_t seed, offset;
    const void *origin; /* C's element of flat index 0 */
    void *pre;          /* NULL, or C's type and layout */
} kf__rg_epi;

/* The epilogue on n values of C's lanes at flat index i: the activation by a loop per kind
 * (common/activation.h's float functions are branch-free, so each loop vectorises), then the
 * dropout. */
static inline void kf__rg_epi_s(const kf__rg_epi *e, float *v, int n, int64_t i) {
    switch (e->act) {
    case KF__ACT_RELU: for (int l = 0; l < n; ++l) v[l] = kf__relu_s(v[l]); break;
    case KF__ACT_GELU: for (int l = 0; l < n; ++l) v[l] = kf__gelu_s(v[l]); break;
    case KF__ACT_GELU_TANH: for (int l = 0; l < n; ++l) v[l] = kf__gelu_tanh_s(v[l]); break;
    case KF__ACT_SILU: for (int l = 0; l < n; ++l) v[l] = kf__silu_s(v[l]); break;
    default: break;
    }
    if (e->p > 0.0f)
        for (int l = 0; l < n; ++l)
            v[l] = kf__drop_s(e->p, e->scale_s, e->seed, e->offset + (uint64_t)(i + l), v[l]);
}

static inline void kf__rg_epi_d(const kf__rg_epi *e, double *v, int n, int64_t i) {
    for (int l = 0; l < n; ++l)
        v[l] = kf__epi_d(e->act, e->p, e->scale_d, e->seed, e->offset + (uint64_t)(i + l), v[l]);
}

/* Rows per tile (KF__RG_MR_a for an A of kind a): 6, or with AVX-512's 32 vector registers 8
 * for a low A, whose tile rows are widened into one buffer (8 x 2 accumulators; 8 independent
 * sums where a panel is one vector, as k = 16 gives, cover the FMA latency where 6 do not:
 * SKLinear bfloat16/float16 0.75-0.92x the time of 6 at 256^2 and 8192^2, B = 64). A native A
 * is broadcast in place, one pointer per row, and 8 of them spill x86's general registers
 * (float32 SKLinear forward 1.14-1.2x the time at 8192). The last tile's switch in
 * kf__rg_rows_X takes every height below the kind's (KF__RG_CASES_TOP_a: 7 and 6 for 8). */
#if KF__V_BYTES == 64
#define KF__RG_MR 8
#define KF__RG_CASES_TOP(X) KF__RG_CASE(X, 7) KF__RG_CASE(X, 6)
#else
#define KF__RG_MR 6
#define KF__RG_CASES_TOP(X)
#endif
#define KF__RG_MR_s 6
#define KF__RG_MR_d 6
#define KF__RG_MR_b KF__RG_MR
#define KF__RG_MR_h KF__RG_MR
#define KF__RG_CASES_TOP_s(X)
#define KF__RG_CASES_TOP_d(X)
#define KF__RG_CASES_TOP_b(X) KF__RG_CASES_TOP(X)
#define KF__RG_CASES_TOP_h(X) KF__RG_CASES_TOP(X)
#define KF__RG_NV 2   /* vectors of columns per panel */
#define KF__RG_KC 256 /* rows of B per copied chunk (16 KiB at NV = 2) */
#define KF__RG_FAR_BYTES 1024 /* B's rows this far apart are copied (kf__rg_panel_X) */

/* The pointer to B's row q (two stacked panels). */
#define KF__RG_BROW(q) ((q) < K0 ? B0 + (q) * ldb : B1 + ((q) - K0) * ldb)

/* The operand kinds (header comment). */
#define KF__RG_GET_s(p) (*(p))
#define KF__RG_GET_d(p) (*(p))
#define KF__RG_GET_b(p) kf__lp_get(*(p), true)
#define KF__RG_GET_h(p) kf__lp_get(*(p), false)
#define KF__RG_VLD_s(p) (*(const kf__vs *)(p))
#define KF__RG_VLD_d(p) (*(const kf__vd *)(p))
#define KF__RG_VLD_b(p) kf__lp_loadv((p), true)
#define KF__RG_VLD_h(p) kf__lp_loadv((p), false)
#define KF__RG_VST_s(p, x) (*(kf__vs *)(p) = (x))
#define KF__RG_VST_d(p, x) (*(kf__vd *)(p) = (x))
#define KF__RG_VST_b(p, x) kf__lp_storev((p), (x), true)
#define KF__RG_VST_h(p, x) kf__lp_storev((p), (x), false)
#define KF__RG_PUT_s(p, x) (*(p) = (x))
#define KF__RG_PUT_d(p, x) (*(p) = (x))
#define KF__RG_PUT_b(p, x) (*(p) = kf__lp_put((x), true))
#define KF__RG_PUT_h(p, x) (*(p) = kf__lp_put((x), false))
#define KF__RG_NATIVE_s 1
#define KF__RG_NATIVE_d 1
#define KF__RG_NATIVE_b 0
#define KF__RG_NATIVE_h 0

/* A low A's elements [0, n) from s widened into the float32 d (the other kinds never take it). */
#define KF__RG_WIDEN_s(s, d, n) ((void)0)
#define KF__RG_WIDEN_d(s, d, n) ((void)0)
#define KF__RG_WIDEN_b(s, d, n) kf__lp_load_n((d), (s), (n), true)
#define KF__RG_WIDEN_h(s, d, n) kf__lp_load_n((d), (s), (n), false)
/* A low A's elements [0, n) from s, n <= 8, widened into the float32 d[0 .. 8) (lanes n .. 8
 * unspecified; the other kinds never take it). */
#define KF__RG_WIDEN_PART_s(s, n, d) ((void)0)
#define KF__RG_WIDEN_PART_d(s, n, d) ((void)0)
#define KF__RG_WIDEN_PART_b(s, n, d) kf__lp_load_part((d), (s), (n), true)
#define KF__RG_WIDEN_PART_h(s, n, d) kf__lp_load_part((d), (s), (n), false)

/* A tile's step over B's row bq (type T, vector kind v): the tile's nv vectors of it, times the
 * broadcast of A's element of each row i, the expression AI, into the accumulators c. */
#define KF__RG_STEP(v, bq, AI)                                                                     \
    do {                                                                                           \
        const kf__v##v *bq_ = (const kf__v##v *)(bq); /* vector u: elements u L .. */             \
        kf__v##v bv[KF__RG_NV];                                                                    \
        for (int u = 0; u < nv; ++u) bv[u] = bq_[u];                                               \
        for (int i = 0; i < mr; ++i) {                                                             \
            const kf__v##v av = kf__splat_##v(AI);                                                 \
            for (int u = 0; u < nv; ++u) c[i][u] = kf__fma_##v(av, bv[u], c[i][u]);                \
        }                                                                                          \
    } while (0)

/* One case of the last tile's switch in kf__rg_rows_X: r rows. */
#define KF__RG_CASE(X, r)                                                                          \
    case r:                                                                                        \
        kf__rg_tile_##X(r, nv, w, K, K0, alpha, a_, am, aq, B0, B1, ldb, bias, acc, cm, ldc, epi); \
        break;

#define KF__ROWGEMM_DEFINE(X, TA, a, TB, b, TC, e, T, v)                                           \
    enum { kf__rg_lanes_##X = (int)(sizeof(kf__v##v) / sizeof(T)) };                               \
                                                                                                   \
    /* One tile: mr rows by a panel of nv vectors of columns, of which the first w are C's (w =    \
     * nv L, or w < L in a partial panel, nv = 1, whose B columns past w are zeros), B's rows of   \
     * type T (a low B is widened into its chunk first), the bias of B's type. mr and nv are       \
     * constants at every call site (kf__rg_rows_X), so the loops unroll into registers. */        \
    static inline __attribute__((always_inline)) void kf__rg_tile_##X(                             \
        int mr, int nv, int w, int64_t K, int64_t K0, T alpha, const TA *A, int64_t am,            \
        int64_t aq, const T *B0, const T *B1, int64_t ldb, const TB *bias, bool acc, TC *C,        \
        int64_t ldc, const kf__rg_epi *epi) {                                                      \
        enum { L = kf__rg_lanes_##X };                                                             \
        kf__v##v c[KF__RG_MR][KF__RG_NV];                                                          \
        for (int i = 0; i < mr; ++i)                                                               \
            for (int u = 0; u < nv; ++u) c[i][u] = (kf__v##v){0};                                  \
        if (!KF__RG_NATIVE_##a && aq == 1) {                                                       \
            /* a low A's rows widened by vectors, KF__RG_KC elements at a time */                  \
            T ab[KF__RG_MR][KF__RG_KC] __attribute__((aligned(KF__V_BYTES)));                      \
            for (int64_t q0 = 0; q0 < K; q0 += KF__RG_KC) {                                        \
                const int64_t kc = K - q0 < KF__RG_KC ? K - q0 : KF__RG_KC;                        \
                for (int i = 0; i < mr; ++i) KF__RG_WIDEN_##a(A + i * am + q0, ab[i], kc);         \
                for (int64_t q = 0; q < kc; ++q) KF__RG_STEP(v, KF__RG_BROW(q0 + q), ab[i][q]);    \
            }                                                                                      \
        } else if (!KF__RG_NATIVE_##a && am == 1) {                                                \
            /* a low A^T (a tile's mr elements for one q lie together), widened by vectors, q by   \
             * q, KF__RG_KC at a time; element by element in the broadcasts, each widening used    \
             * the shuffle port three times (float16 SKLinear fwd+bwd, 256^2 B=64: 1.35x -> 1.28x  \
             * float32's on an AVX-512 Xeon) */                                                    \
            T at[KF__RG_KC][8]; /* MR <= 8 */                                                      \
            for (int64_t q0 = 0; q0 < K; q0 += KF__RG_KC) {                                        \
                const int64_t kc = K - q0 < KF__RG_KC ? K - q0 : KF__RG_KC;                        \
                for (int64_t q = 0; q < kc; ++q) {                                                 \
                    KF__RG_WIDEN_PART_##a(A + (q0 + q) * aq, mr, at[q]);                           \
                }                                                                                  \
                for (int64_t q = 0; q < kc; ++q) KF__RG_STEP(v, KF__RG_BROW(q0 + q), at[q][i]);    \
            }                                                                                      \
        } else {                                                                                   \
            for (int64_t q = 0; q < K; ++q)                                                        \
                KF__RG_STEP(v, KF__RG_BROW(q), KF__RG_GET_##a(A + i * am + q * aq));               \
        }                                                                                          \
        kf__v##v badd[KF__RG_NV]; /* the bias, widened once for the tile's rows */                 \
        for (int u = 0; u < nv; ++u)                                                               \
            badd[u] = w == nv * L && bias ? KF__RG_VLD_##b(bias + u * L) : (kf__v##v){0};          \
        /* with an epilogue, the tile's results are gathered here first and it runs once the      \
         * accumulators are dead (a call among them made the compiler spill them all: ReLU cost    \
         * 0.3 ns an element more than this) */                                                    \
        T eb[KF__RG_MR][KF__RG_NV * L];                                                            \
        for (int i = 0; i < mr; ++i)                                                               \
            for (int u = 0; u < nv; ++u) {                                                         \
                TC *d = C + i * ldc + u * L;                                                       \
                if (w == nv * L) {                                                                 \
                    const kf__v##v add = bias || !acc ? badd[u] : KF__RG_VLD_##e(d);               \
                    const kf__v##v res = kf__fma_##v(c[i][u], kf__splat_##v(alpha), add);          \
                    if (epi) memcpy(&eb[i][u * L], &res, sizeof res);                              \
                    else KF__RG_VST_##e(d, res);                                                   \
                    continue;                                                                      \
                }                                                                                  \
                /* a partial panel's w columns, through arrays of lanes (subscripting the          \
                 * vectors themselves would keep them in memory through the K loop) */             \
                T ad[L];                                                                           \
                for (int l = 0; l < L; ++l)                                                        \
                    ad[l] = l >= w ? 0 : bias ? KF__RG_GET_##b(bias + l)                           \
                                     : acc  ? KF__RG_GET_##e(d + l) : 0;                           \
                kf__v##v add;                                                                      \
                memcpy(&add, ad, sizeof add);                                                      \
                const kf__v##v res = kf__fma_##v(c[i][u], kf__splat_##v(alpha), add);              \
                memcpy(&eb[i][u * L], &res, sizeof res);                                           \
                if (!epi)                                                                          \
                    for (int l = 0; l < w; ++l) KF__RG_PUT_##e(d + l, eb[i][u * L + l]);           \
            }                                                                                      \
        if (!epi) return;                                                                          \
        const int n = w == nv * L ? nv * L : w; /* a row's columns */                              \
        for (int i = 0; i < mr; ++i) {                                                             \
            TC *d = C + i * ldc;                                                                   \
            const int64_t ix = d - (const TC *)epi->origin;                                        \
            if (epi->pre)                                                                          \
                for (int l = 0; l < n; ++l) KF__RG_PUT_##e((TC *)epi->pre + ix + l, eb[i][l]);     \
            kf__rg_epi_##v(epi, eb[i], n, ix);                                                     \
            for (int l = 0; l < n; ++l) KF__RG_PUT_##e(d + l, eb[i][l]);                           \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    /* Rows [0, M) of one panel of nv vectors (w columns), KF__RG_MR_a at a time; the last         \
     * tile's rows a constant. */                                                                  \
    static inline __attribute__((always_inline)) void kf__rg_rows_##X(                             \
        int nv, int w, int64_t M, int64_t K, int64_t K0, T alpha, const TA *A, int64_t am,         \
        int64_t aq, const T *B0, const T *B1, int64_t ldb, const TB *bias, bool acc, TC *C,        \
        int64_t ldc, const kf__rg_epi *epi) {                                                      \
        enum { MR = KF__RG_MR_##a };                                                               \
        int64_t m = 0;                                                                             \
        for (; m + MR <= M; m += MR)                                                               \
            kf__rg_tile_##X(MR, nv, w, K, K0, alpha, A + m * am, am, aq, B0, B1, ldb, bias, acc,   \
                            C + m * ldc, ldc, epi);                                                \
        const TA *a_ = A + m * am;                                                                 \
        TC *cm = C + m * ldc;                                                                      \
        switch (M - m) { /* < MR */                                                                \
            KF__RG_CASES_TOP_##a(X) KF__RG_CASE(X, 5) KF__RG_CASE(X, 4)                            \
            KF__RG_CASE(X, 3) KF__RG_CASE(X, 2) KF__RG_CASE(X, 1)                                  \
        default: break;                                                                            \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    /* One panel of nv vectors of columns, of which the first w are C's: all (w = nv L), or in a   \
     * partial panel (nv = 1) the last n mod L of C's columns. Where several row tiles read B's    \
     * rows and these lie KF__RG_FAR_BYTES or more apart, B goes by chunks of KF__RG_KC rows, each \
     * copied first into a contiguous buffer that every tile then reads from L1: rows far apart    \
     * make every load of a tile a new cache line, and a power of two apart they all fall in one   \
     * cache set (SKLinear's U1, S2 and dy rows are `out` elements apart: 2^13 floats at in = out  \
     * = 8192). The first chunk adds bias | C | 0 as asked, the later ones the C that the earlier  \
     * ones wrote. Rows close together are read in place (the copy would cost more than it saves:  \
     * in=out=1024, B=1024, 1 thread, fwd+bwd 1.29x slower with it), except a low B's, which       \
     * always go through the chunk, widened there, and a partial panel's, whose chunk holds its w  \
     * columns and zeros after them (the tiles then run on whole vectors, and the epilogue writes  \
     * w columns of C). */                                                                         \
    static inline __attribute__((always_inline)) void kf__rg_panel_##X(                            \
        int nv, int w, int64_t M, int64_t K, int64_t K0, T alpha, const TA *A, int64_t am,         \
        int64_t aq, const TB *B0, const TB *B1, int64_t ldb, const TB *bias, bool acc, TC *C,      \
        int64_t ldc, const kf__rg_epi *epi) {                                                      \
        enum { L = kf__rg_lanes_##X };                                                             \
        if (KF__RG_NATIVE_##b && w == nv * L &&                                                    \
            (M <= KF__RG_MR_##a || ldb * (int64_t)sizeof(TB) < KF__RG_FAR_BYTES)) {                \
            kf__rg_rows_##X(nv, w, M, K, K0, alpha, A, am, aq, (const T *)B0, (const T *)B1, ldb,  \
                            bias, acc, C, ldc, epi);                                               \
            return;                                                                                \
        }                                                                                          \
        kf__v##v pk[KF__RG_KC * KF__RG_NV] __attribute__((aligned(KF__V_BYTES)));                  \
        for (int64_t q0 = 0; q0 < K; q0 += KF__RG_KC) {                                            \
            const int64_t kc = K - q0 < KF__RG_KC ? K - q0 : KF__RG_KC;                            \
            for (int64_t q = 0; q < kc; ++q) {                                                     \
                const TB *bq = KF__RG_BROW(q0 + q);                                                \
                if (w < nv * L) {                                                                  \
                    T t[L];                                                                        \
                    for (int l = 0; l < L; ++l) t[l] = l < w ? KF__RG_GET_##b(bq + l) : 0;         \
                    memcpy(&pk[q], t, sizeof t);                                                   \
                    continue;                                                                      \
                }                                                                                  \
                for (int u = 0; u < nv; ++u) pk[q * nv + u] = KF__RG_VLD_##b(bq + u * L);          \
            }                                                                                      \
            const T *bp = (const T *)pk;                                                           \
            kf__rg_rows_##X(nv, w, M, kc, kc, alpha, A + q0 * aq, am, aq, bp, bp, nv * L,          \
                            q0 ? NULL : bias, q0 ? true : acc, C, ldc, q0 + kc < K ? NULL : epi);  \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    /* The contract in the header comment; K0 <= K (B1 unused where K0 = K). Panels of NV          \
     * vectors, then one of a single vector, then a partial one. epi: NULL, or the epilogue. */    \
    static inline void kf__rowgemm_epi_##X(int64_t M, int64_t n, int64_t K, int64_t K0, T alpha,   \
                                           const TA *A, int64_t am, int64_t aq, const TB *B0,      \
                                           const TB *B1, int64_t ldb, const TB *bias, bool acc,    \
                                           TC *C, int64_t ldc, const kf__rg_epi *epi) {            \
        enum { L = kf__rg_lanes_##X };                                                             \
        int64_t j = 0;                                                                             \
        for (; j + KF__RG_NV * L <= n; j += KF__RG_NV * L)                                         \
            kf__rg_panel_##X(KF__RG_NV, KF__RG_NV * L, M, K, K0, alpha, A, am, aq, B0 + j, B1 + j, \
                             ldb, bias ? bias + j : 0, acc, C + j, ldc, epi);                      \
        for (; j < n; j += L)                                                                      \
            kf__rg_panel_##X(1, n - j < L ? (int)(n - j) : L, M, K, K0, alpha, A, am, aq, B0 + j,  \
                             B1 + j, ldb, bias ? bias + j : 0, acc, C + j, ldc, epi);              \
    }                                                                                              \
    static inline void kf__rowgemm_##X(int64_t M, int64_t n, int64_t K, int64_t K0, T alpha,       \
                                       const TA *A, int64_t am, int64_t aq, const TB *B0,          \
                                       const TB *B1, int64_t ldb, const TB *bias, bool acc,        \
                                       TC *C, int64_t ldc) {                                       \
        kf__rowgemm_epi_##X(M, n, K, K0, alpha, A, am, aq, B0, B1, ldb, bias, acc, C, ldc, NULL);  \
    }

KF__ROWGEMM_DEFINE(sss, float, s, float, s, float, s, float, s)
KF__ROWGEMM_DEFINE(ddd, double, d, double, d, double, d, double, d)
/* The instances a low kind k (b, h) takes, named by the kinds of A, B and C: both operands low,
 * one of them low, and the two with a low C (products whose result is rounded as written). */
#define KF__ROWGEMM_LOW(k)                                                                         \
    KF__ROWGEMM_DEFINE(k##k##s, uint16_t, k, uint16_t, k, float, s, float, s)                      \
    KF__ROWGEMM_DEFINE(k##s##s, uint16_t, k, float, s, float, s, float, s)                         \
    KF__ROWGEMM_DEFINE(s##k##s, float, s, uint16_t, k, float, s, float, s)                         \
    KF__ROWGEMM_DEFINE(s##k##k, float, s, uint16_t, k, uint16_t, k, float, s)                      \
    KF__ROWGEMM_DEFINE(s##s##k, float, s, float, s, uint16_t, k, float, s)

KF__ROWGEMM_LOW(b)
KF__ROWGEMM_LOW(h)

#endif

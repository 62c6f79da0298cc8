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
 * Blocking: panels of KF__RG_NV vectors of B's columns outer (then one of a single vector),
 * tiles of KF__RG_MR rows inner, K innermost; a tile keeps MR x NV vector accumulators in
 * registers (12 of 16 with AVX2) and per q loads NV vectors of B and broadcasts MR elements of
 * A. Where several tiles share a panel and B's rows lie KF__RG_FAR_BYTES or more apart, K goes
 * in chunks of KF__RG_KC rows, each first copied contiguous, and C takes each chunk's sum in
 * turn (kf__rg_panel_X). Every C element sums over q in increasing order, in chunks that depend
 * on the shape alone, so the bits do too. Columns past the last vector take a scalar loop, same
 * order.
 *
 * Also used by KANConv2d's forward product with few output channels (cpu/kan_linear.c).
 *
 * KF__ROWGEMM_DEFINE(T, X, VEC) defines kf__rowgemm_X for element type T with VEC its 32-byte
 * vector type (cpu/simd.h: kf__fma_X, kf__splat_X). */
#ifndef KF_CPU_ROWGEMM_H
#define KF_CPU_ROWGEMM_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "simd.h"

#define KF__RG_MR 6   /* rows per tile */
#define KF__RG_NV 2   /* vectors of columns per panel */
#define KF__RG_KC 256 /* rows of B per copied chunk (16 KiB at NV = 2) */
#define KF__RG_FAR_BYTES 1024 /* B's rows this far apart are copied (kf__rg_panel_X) */

/* The pointer to B's row q (two stacked panels). */
#define KF__RG_BROW(q) ((q) < K0 ? B0 + (q) * ldb : B1 + ((q) - K0) * ldb)

/* One case of the last tile's switch in kf__rg_rows_X: r rows. */
#define KF__RG_CASE(X, r)                                                                          \
    case r:                                                                                        \
        kf__rg_tile_##X(r, nv, K, K0, alpha, a, am, aq, B0, B1, ldb, bias, acc, cm, ldc);          \
        break;

#define KF__ROWGEMM_DEFINE(T, X, VEC)                                                              \
    enum { kf__rg_lanes_##X = (int)(sizeof(VEC) / sizeof(T)) };                                    \
                                                                                                   \
    /* One tile: mr rows by a panel of nv vectors of columns. mr and nv are constants at every     \
     * call site (kf__rg_rows_X), so the loops unroll into registers. */                           \
    static inline __attribute__((always_inline)) void kf__rg_tile_##X(                             \
        int mr, int nv, int64_t K, int64_t K0, T alpha, const T *A, int64_t am, int64_t aq,        \
        const T *B0, const T *B1, int64_t ldb, const T *bias, bool acc, T *C, int64_t ldc) {       \
        enum { L = kf__rg_lanes_##X };                                                             \
        VEC c[KF__RG_MR][KF__RG_NV];                                                               \
        for (int i = 0; i < mr; ++i)                                                               \
            for (int v = 0; v < nv; ++v) c[i][v] = (VEC){0};                                       \
        for (int64_t q = 0; q < K; ++q) {                                                          \
            const T *b = KF__RG_BROW(q);                                                           \
            VEC bv[KF__RG_NV];                                                                     \
            for (int v = 0; v < nv; ++v) bv[v] = *(const VEC *)(b + v * L);                        \
            for (int i = 0; i < mr; ++i) {                                                         \
                const VEC a = kf__splat_##X(A[i * am + q * aq]);                                   \
                for (int v = 0; v < nv; ++v)                                                       \
                    c[i][v] = kf__fma_##X(a, bv[v], c[i][v]);                                      \
            }                                                                                      \
        }                                                                                          \
        for (int i = 0; i < mr; ++i)                                                               \
            for (int v = 0; v < nv; ++v) {                                                         \
                VEC *d = (VEC *)(C + i * ldc + v * L);                                             \
                const VEC add = bias ? *(const VEC *)(bias + v * L) : acc ? *d : (VEC){0};         \
                *d = kf__fma_##X(c[i][v], kf__splat_##X(alpha), add);                              \
            }                                                                                      \
    }                                                                                              \
                                                                                                   \
    /* Rows [0, M) of one panel of nv vectors, MR at a time; the last tile's rows a constant. */   \
    static inline __attribute__((always_inline)) void kf__rg_rows_##X(                             \
        int nv, int64_t M, int64_t K, int64_t K0, T alpha, const T *A, int64_t am, int64_t aq,     \
        const T *B0, const T *B1, int64_t ldb, const T *bias, bool acc, T *C, int64_t ldc) {       \
        int64_t m = 0;                                                                             \
        for (; m + KF__RG_MR <= M; m += KF__RG_MR)                                                 \
            kf__rg_tile_##X(KF__RG_MR, nv, K, K0, alpha, A + m * am, am, aq, B0, B1, ldb, bias,    \
                            acc, C + m * ldc, ldc);                                                \
        const T *a = A + m * am;                                                                   \
        T *cm = C + m * ldc;                                                                       \
        switch (M - m) {                                                                           \
            KF__RG_CASE(X, 5) KF__RG_CASE(X, 4) KF__RG_CASE(X, 3) KF__RG_CASE(X, 2)                \
            KF__RG_CASE(X, 1)                                                                      \
        default: break;                                                                            \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    /* One panel of nv vectors of columns. Where several row tiles read B's rows and these lie     \
     * KF__RG_FAR_BYTES or more apart, B goes by chunks of KF__RG_KC rows, each copied first into  \
     * a contiguous buffer that every tile then reads from L1: rows far apart make every load of   \
     * a tile a new cache line, and a power of two apart they all fall in one cache set            \
     * (SKLinear's U1, S2 and dy rows are `out` elements apart: 2^13 floats at in = out = 8192).   \
     * The first chunk adds bias | C | 0 as asked, the later ones the C that the earlier ones      \
     * wrote. Rows close together are read in place (the copy would cost more than it saves:       \
     * in=out=1024, B=1024, 1 thread, fwd+bwd 1.29x slower with it). */                            \
    static inline __attribute__((always_inline)) void kf__rg_panel_##X(                            \
        int nv, int64_t M, int64_t K, int64_t K0, T alpha, const T *A, int64_t am, int64_t aq,     \
        const T *B0, const T *B1, int64_t ldb, const T *bias, bool acc, T *C, int64_t ldc) {       \
        enum { L = kf__rg_lanes_##X };                                                             \
        if (M <= KF__RG_MR || ldb * (int64_t)sizeof(T) < KF__RG_FAR_BYTES) {                       \
            kf__rg_rows_##X(nv, M, K, K0, alpha, A, am, aq, B0, B1, ldb, bias, acc, C, ldc);       \
            return;                                                                                \
        }                                                                                          \
        VEC pk[KF__RG_KC * KF__RG_NV] __attribute__((aligned(32)));                                \
        for (int64_t q0 = 0; q0 < K; q0 += KF__RG_KC) {                                            \
            const int64_t kc = K - q0 < KF__RG_KC ? K - q0 : KF__RG_KC;                            \
            for (int64_t q = 0; q < kc; ++q) {                                                     \
                const T *b = KF__RG_BROW(q0 + q);                                                  \
                for (int v = 0; v < nv; ++v) pk[q * nv + v] = *(const VEC *)(b + v * L);           \
            }                                                                                      \
            const T *bp = (const T *)pk;                                                           \
            kf__rg_rows_##X(nv, M, kc, kc, alpha, A + q0 * aq, am, aq, bp, bp, nv * L,             \
                            q0 ? NULL : bias, q0 ? true : acc, C, ldc);                            \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    /* The contract in the header comment; K0 <= K (B1 unused where K0 = K). Panels of NV          \
     * vectors, then one of a single vector, then single columns. */                               \
    static void kf__rowgemm_##X(int64_t M, int64_t n, int64_t K, int64_t K0, T alpha, const T *A,  \
                                int64_t am, int64_t aq, const T *B0, const T *B1, int64_t ldb,     \
                                const T *bias, bool acc, T *C, int64_t ldc) {                      \
        enum { L = kf__rg_lanes_##X };                                                             \
        int64_t j = 0;                                                                             \
        for (; j + KF__RG_NV * L <= n; j += KF__RG_NV * L)                                         \
            kf__rg_panel_##X(KF__RG_NV, M, K, K0, alpha, A, am, aq, B0 + j, B1 + j, ldb,           \
                            bias ? bias + j : 0, acc, C + j, ldc);                                 \
        for (; j + L <= n; j += L)                                                                 \
            kf__rg_panel_##X(1, M, K, K0, alpha, A, am, aq, B0 + j, B1 + j, ldb,                   \
                            bias ? bias + j : 0, acc, C + j, ldc);                                 \
        for (; j < n; ++j)                                                                         \
            for (int64_t m = 0; m < M; ++m) {                                                      \
                T s = 0;                                                                           \
                for (int64_t q = 0; q < K; ++q) {                                                  \
                    const T *b = KF__RG_BROW(q);                                                   \
                    s = KF__RG_SFMA_##X(A[m * am + q * aq], b[j], s);                              \
                }                                                                                  \
                T *d = C + m * ldc + j;                                                            \
                *d = KF__RG_SFMA_##X(s, alpha, bias ? bias[j] : acc ? *d : 0);                     \
            }                                                                                      \
    }

/* The scalar tail's a b + c with one rounding, as the vector lanes compute it. */
#define KF__RG_SFMA_s(a, b, c) __builtin_fmaf((a), (b), (c))
#define KF__RG_SFMA_d(a, b, c) __builtin_fma((a), (b), (c))

KF__ROWGEMM_DEFINE(float, s, kf__vs)
KF__ROWGEMM_DEFINE(double, d, kf__vd)

#endif

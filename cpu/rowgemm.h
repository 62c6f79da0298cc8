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
 * The kernel (cpu/rowgemm_kernel.h) is written once per arithmetic type T (suffix _s float, _d
 * double): kf__rg_gemm_X(ka, kb, kc, ...) with the kinds of A, B (and the bias) and C constant
 * arguments (kf__rg_kind: KF__RG_S float, KF__RG_D double, KF__RG_B bfloat16, KF__RG_H float16;
 * the operands are `void *` of those kinds), force-inlined, so each call site is one kinds'
 * code. A float64 product takes KF__RG_D alone; a float32 one any of the others. The named
 * instances (end of file) are its only out-of-line copies: the KAN layers call kf__rowgemm_sss
 * and _ddd, SKLinear kf__rowgemm_s/_d and their _epi forms, which pick one by the constant kinds.
 * A product without an epilogue runs an instance without one (epi NULL folded away): where
 * 1.8.0's float32 products ran the epilogue's instance with a NULL epi, SKLinear float32 took
 * 1.4-1.8x the time (benches/results/cpu_sklinear_functions.md). */
#ifndef KF_CPU_ROWGEMM_H
#define KF_CPU_ROWGEMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "activation.h"
#include "lowp_simd.h"
#include "simd.h"

#define KF__RG_INLINE static inline __attribute__((always_inline))

/* An epilogue applied as C is stored (kf__rg_gemm_X's epi; SKLinear's fused activation and
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

/* Rows per tile (kf__rg_mr(ka) for an A of kind ka): 6, or with AVX-512's 32 vector registers 8
 * for a low A, whose tile rows are widened into one buffer (8 x 2 accumulators; 8 independent
 * sums where a panel is one vector, as k = 16 gives, cover the FMA latency where 6 do not:
 * SKLinear bfloat16/float16 0.75-0.92x the time of 6 at 256^2 and 8192^2, B = 64). A native A
 * is broadcast in place, one pointer per row, and 8 of them spill x86's general registers
 * (float32 SKLinear forward 1.14-1.2x the time at 8192). */
#if KF__V_BYTES == 64
#define KF__RG_MR 8
#else
#define KF__RG_MR 6
#endif
#define KF__RG_NV 2   /* vectors of columns per panel */
#define KF__RG_KC 256 /* rows of B per copied chunk (16 KiB at NV = 2) */
#define KF__RG_FAR_BYTES 1024 /* B's rows this far apart are copied (kf__rg_panel_X) */

/* ---- operand kinds ----
 * An operand's storage kind, a constant wherever the force-inlined kernel takes one: float32
 * and float64 are read in place (native), bfloat16 and float16 are widened to float32 as they
 * are loaded and rounded to nearest even as they are stored (cpu/lowp_simd.h). Per arithmetic
 * type (suffix _s float: kinds S, B, H; _d double: kind D alone): kf__rg_get_X(k, p, i) is
 * element i of p, kf__rg_put_X stores one, kf__rg_vld_X and kf__rg_vst_X a vector from element
 * i on, kf__rg_widen_X(k, p, i, d, n) widens a low p's elements [i, i + n) into d (n <= 8 for
 * kf__rg_widen_part_s; lanes n .. 8 of d unspecified). */
typedef enum kf__rg_kind { KF__RG_S, KF__RG_D, KF__RG_B, KF__RG_H } kf__rg_kind;

KF__RG_INLINE bool kf__rg_native(kf__rg_kind k) { return k == KF__RG_S || k == KF__RG_D; }
KF__RG_INLINE bool kf__rg_bf16(kf__rg_kind k) { return k == KF__RG_B; }
KF__RG_INLINE int64_t kf__rg_size(kf__rg_kind k) {
    return k == KF__RG_D ? 8 : k == KF__RG_S ? 4 : 2;
}
/* Element i of p, as an address (p of kind k). */
KF__RG_INLINE const void *kf__rg_at(kf__rg_kind k, const void *p, int64_t i) {
    return (const char *)p + i * kf__rg_size(k);
}
KF__RG_INLINE void *kf__rg_atw(kf__rg_kind k, void *p, int64_t i) {
    return (char *)p + i * kf__rg_size(k);
}
/* Rows per tile for an A of kind ka (above). */
KF__RG_INLINE int kf__rg_mr(kf__rg_kind ka) { return kf__rg_native(ka) ? 6 : KF__RG_MR; }

KF__RG_INLINE float kf__rg_get_s(kf__rg_kind k, const void *p, int64_t i) {
    if (k == KF__RG_S) return ((const float *)p)[i];
    return kf__lp_get(((const uint16_t *)p)[i], kf__rg_bf16(k));
}
KF__RG_INLINE void kf__rg_put_s(kf__rg_kind k, void *p, int64_t i, float v) {
    if (k == KF__RG_S) ((float *)p)[i] = v;
    else ((uint16_t *)p)[i] = kf__lp_put(v, kf__rg_bf16(k));
}
KF__RG_INLINE kf__vs kf__rg_vld_s(kf__rg_kind k, const void *p, int64_t i) {
    if (k == KF__RG_S) return *(const kf__vs *)((const float *)p + i);
    return kf__lp_loadv((const uint16_t *)p + i, kf__rg_bf16(k));
}
KF__RG_INLINE void kf__rg_vst_s(kf__rg_kind k, void *p, int64_t i, kf__vs v) {
    if (k == KF__RG_S) *(kf__vs *)((float *)p + i) = v;
    else kf__lp_storev((uint16_t *)p + i, v, kf__rg_bf16(k));
}
KF__RG_INLINE void kf__rg_widen_s(kf__rg_kind k, const void *p, int64_t i, float *d, int64_t n) {
    if (!kf__rg_native(k)) kf__lp_load_n(d, (const uint16_t *)p + i, n, kf__rg_bf16(k));
}
KF__RG_INLINE void kf__rg_widen_part_s(kf__rg_kind k, const void *p, int64_t i, int n, float *d) {
    if (!kf__rg_native(k)) kf__lp_load_part(d, (const uint16_t *)p + i, n, kf__rg_bf16(k));
}

KF__RG_INLINE double kf__rg_get_d(kf__rg_kind k, const void *p, int64_t i) {
    (void)k;
    return ((const double *)p)[i];
}
KF__RG_INLINE void kf__rg_put_d(kf__rg_kind k, void *p, int64_t i, double v) {
    (void)k;
    ((double *)p)[i] = v;
}
KF__RG_INLINE kf__vd kf__rg_vld_d(kf__rg_kind k, const void *p, int64_t i) {
    (void)k;
    return *(const kf__vd *)((const double *)p + i);
}
KF__RG_INLINE void kf__rg_vst_d(kf__rg_kind k, void *p, int64_t i, kf__vd v) {
    (void)k;
    *(kf__vd *)((double *)p + i) = v;
}
/* float64 products take no low operand: nothing to widen */
KF__RG_INLINE void kf__rg_widen_d(kf__rg_kind k, const void *p, int64_t i, double *d, int64_t n) {
    (void)k, (void)p, (void)i, (void)d, (void)n;
}
KF__RG_INLINE void kf__rg_widen_part_d(kf__rg_kind k, const void *p, int64_t i, int n, double *d) {
    (void)k, (void)p, (void)i, (void)n, (void)d;
}

/* The kernel, once per arithmetic type. */
#define T float
#define V kf__vs
#define RG_X(name) name##_s
#include "rowgemm_kernel.h"
#undef T
#undef V
#undef RG_X
#define T double
#define V kf__vd
#define RG_X(name) name##_d
#include "rowgemm_kernel.h"
#undef T
#undef V
#undef RG_X

/* The named instances, by the kinds of A, B and C (s float, d double, b bfloat16, h float16),
 * each compiled once where it is called: float and double; for a low kind k both operands low
 * (kks), one of them (kss, sks), and a low C (a product whose result is rounded as written:
 * ssk, and skk with an epilogue, the _epi forms). The KAN layers call kf__rowgemm_sss and
 * _ddd by name, SKLinear through kf__rowgemm_s/_d below. */
static inline void kf__rowgemm_sss(int64_t M, int64_t n, int64_t K, int64_t K0, float alpha,
                                   const float *A, int64_t am, int64_t aq, const float *B0,
                                   const float *B1, int64_t ldb, const float *bias, bool acc,
                                   float *C, int64_t ldc) {
    kf__rg_gemm_s(KF__RG_S, KF__RG_S, KF__RG_S, M, n, K, K0, alpha, A, am, aq, B0, B1, ldb, bias,
                  acc, C, ldc, NULL);
}
static inline void kf__rowgemm_ddd(int64_t M, int64_t n, int64_t K, int64_t K0, double alpha,
                                   const double *A, int64_t am, int64_t aq, const double *B0,
                                   const double *B1, int64_t ldb, const double *bias, bool acc,
                                   double *C, int64_t ldc) {
    kf__rg_gemm_d(KF__RG_D, KF__RG_D, KF__RG_D, M, n, K, K0, alpha, A, am, aq, B0, B1, ldb, bias,
                  acc, C, ldc, NULL);
}
static inline void kf__rowgemm_bbs(int64_t M, int64_t n, int64_t K, int64_t K0, float alpha,
                                   const uint16_t *A, int64_t am, int64_t aq, const uint16_t *B0,
                                   const uint16_t *B1, int64_t ldb, const uint16_t *bias, bool acc,
                                   float *C, int64_t ldc) {
    kf__rg_gemm_s(KF__RG_B, KF__RG_B, KF__RG_S, M, n, K, K0, alpha, A, am, aq, B0, B1, ldb, bias,
                  acc, C, ldc, NULL);
}
static inline void kf__rowgemm_hhs(int64_t M, int64_t n, int64_t K, int64_t K0, float alpha,
                                   const uint16_t *A, int64_t am, int64_t aq, const uint16_t *B0,
                                   const uint16_t *B1, int64_t ldb, const uint16_t *bias, bool acc,
                                   float *C, int64_t ldc) {
    kf__rg_gemm_s(KF__RG_H, KF__RG_H, KF__RG_S, M, n, K, K0, alpha, A, am, aq, B0, B1, ldb, bias,
                  acc, C, ldc, NULL);
}
static inline void kf__rowgemm_bss(int64_t M, int64_t n, int64_t K, int64_t K0, float alpha,
                                   const uint16_t *A, int64_t am, int64_t aq, const float *B0,
                                   const float *B1, int64_t ldb, const float *bias, bool acc,
                                   float *C, int64_t ldc) {
    kf__rg_gemm_s(KF__RG_B, KF__RG_S, KF__RG_S, M, n, K, K0, alpha, A, am, aq, B0, B1, ldb, bias,
                  acc, C, ldc, NULL);
}
static inline void kf__rowgemm_hss(int64_t M, int64_t n, int64_t K, int64_t K0, float alpha,
                                   const uint16_t *A, int64_t am, int64_t aq, const float *B0,
                                   const float *B1, int64_t ldb, const float *bias, bool acc,
                                   float *C, int64_t ldc) {
    kf__rg_gemm_s(KF__RG_H, KF__RG_S, KF__RG_S, M, n, K, K0, alpha, A, am, aq, B0, B1, ldb, bias,
                  acc, C, ldc, NULL);
}
static inline void kf__rowgemm_sbs(int64_t M, int64_t n, int64_t K, int64_t K0, float alpha,
                                   const float *A, int64_t am, int64_t aq, const uint16_t *B0,
                                   const uint16_t *B1, int64_t ldb, const uint16_t *bias, bool acc,
                                   float *C, int64_t ldc) {
    kf__rg_gemm_s(KF__RG_S, KF__RG_B, KF__RG_S, M, n, K, K0, alpha, A, am, aq, B0, B1, ldb, bias,
                  acc, C, ldc, NULL);
}
static inline void kf__rowgemm_shs(int64_t M, int64_t n, int64_t K, int64_t K0, float alpha,
                                   const float *A, int64_t am, int64_t aq, const uint16_t *B0,
                                   const uint16_t *B1, int64_t ldb, const uint16_t *bias, bool acc,
                                   float *C, int64_t ldc) {
    kf__rg_gemm_s(KF__RG_S, KF__RG_H, KF__RG_S, M, n, K, K0, alpha, A, am, aq, B0, B1, ldb, bias,
                  acc, C, ldc, NULL);
}
static inline void kf__rowgemm_ssb(int64_t M, int64_t n, int64_t K, int64_t K0, float alpha,
                                   const float *A, int64_t am, int64_t aq, const float *B0,
                                   const float *B1, int64_t ldb, const float *bias, bool acc,
                                   uint16_t *C, int64_t ldc) {
    kf__rg_gemm_s(KF__RG_S, KF__RG_S, KF__RG_B, M, n, K, K0, alpha, A, am, aq, B0, B1, ldb, bias,
                  acc, C, ldc, NULL);
}
static inline void kf__rowgemm_ssh(int64_t M, int64_t n, int64_t K, int64_t K0, float alpha,
                                   const float *A, int64_t am, int64_t aq, const float *B0,
                                   const float *B1, int64_t ldb, const float *bias, bool acc,
                                   uint16_t *C, int64_t ldc) {
    kf__rg_gemm_s(KF__RG_S, KF__RG_S, KF__RG_H, M, n, K, K0, alpha, A, am, aq, B0, B1, ldb, bias,
                  acc, C, ldc, NULL);
}
static inline void kf__rowgemm_epi_sss(int64_t M, int64_t n, int64_t K, int64_t K0, float alpha,
                                       const float *A, int64_t am, int64_t aq, const float *B0,
                                       const float *B1, int64_t ldb, const float *bias, bool acc,
                                       float *C, int64_t ldc, const kf__rg_epi *epi) {
    kf__rg_gemm_s(KF__RG_S, KF__RG_S, KF__RG_S, M, n, K, K0, alpha, A, am, aq, B0, B1, ldb, bias,
                  acc, C, ldc, epi);
}
static inline void kf__rowgemm_epi_ddd(int64_t M, int64_t n, int64_t K, int64_t K0, double alpha,
                                       const double *A, int64_t am, int64_t aq, const double *B0,
                                       const double *B1, int64_t ldb, const double *bias, bool acc,
                                       double *C, int64_t ldc, const kf__rg_epi *epi) {
    kf__rg_gemm_d(KF__RG_D, KF__RG_D, KF__RG_D, M, n, K, K0, alpha, A, am, aq, B0, B1, ldb, bias,
                  acc, C, ldc, epi);
}
static inline void kf__rowgemm_epi_sbb(int64_t M, int64_t n, int64_t K, int64_t K0, float alpha,
                                       const float *A, int64_t am, int64_t aq, const uint16_t *B0,
                                       const uint16_t *B1, int64_t ldb, const uint16_t *bias,
                                       bool acc, uint16_t *C, int64_t ldc, const kf__rg_epi *epi) {
    kf__rg_gemm_s(KF__RG_S, KF__RG_B, KF__RG_B, M, n, K, K0, alpha, A, am, aq, B0, B1, ldb, bias,
                  acc, C, ldc, epi);
}
static inline void kf__rowgemm_epi_shh(int64_t M, int64_t n, int64_t K, int64_t K0, float alpha,
                                       const float *A, int64_t am, int64_t aq, const uint16_t *B0,
                                       const uint16_t *B1, int64_t ldb, const uint16_t *bias,
                                       bool acc, uint16_t *C, int64_t ldc, const kf__rg_epi *epi) {
    kf__rg_gemm_s(KF__RG_S, KF__RG_H, KF__RG_H, M, n, K, K0, alpha, A, am, aq, B0, B1, ldb, bias,
                  acc, C, ldc, epi);
}

/* The instance of the kinds (ka, kb, kc), constants at every call site (the force-inlined
 * kernels of cpu/sklinear_products.h), so that each call folds to one direct call: float
 * arithmetic takes kinds S, B and H, double D alone; no other combination is asked. */
#define KF__RG_IS(a, b, c) (ka == KF__RG_##a && kb == KF__RG_##b && kc == KF__RG_##c)
#define KF__RG_ARGS M, n, K, K0, alpha, A, am, aq, B0, B1, ldb, bias, acc, C, ldc
KF__RG_INLINE void kf__rowgemm_s(kf__rg_kind ka, kf__rg_kind kb, kf__rg_kind kc, int64_t M,
                                 int64_t n, int64_t K, int64_t K0, float alpha, const void *A,
                                 int64_t am, int64_t aq, const void *B0, const void *B1,
                                 int64_t ldb, const void *bias, bool acc, void *C, int64_t ldc) {
    if (KF__RG_IS(S, S, S)) kf__rowgemm_sss(KF__RG_ARGS);
    else if (KF__RG_IS(B, B, S)) kf__rowgemm_bbs(KF__RG_ARGS);
    else if (KF__RG_IS(H, H, S)) kf__rowgemm_hhs(KF__RG_ARGS);
    else if (KF__RG_IS(B, S, S)) kf__rowgemm_bss(KF__RG_ARGS);
    else if (KF__RG_IS(H, S, S)) kf__rowgemm_hss(KF__RG_ARGS);
    else if (KF__RG_IS(S, B, S)) kf__rowgemm_sbs(KF__RG_ARGS);
    else if (KF__RG_IS(S, H, S)) kf__rowgemm_shs(KF__RG_ARGS);
    else if (KF__RG_IS(S, S, B)) kf__rowgemm_ssb(KF__RG_ARGS);
    else if (KF__RG_IS(S, S, H)) kf__rowgemm_ssh(KF__RG_ARGS);
}
KF__RG_INLINE void kf__rowgemm_d(kf__rg_kind ka, kf__rg_kind kb, kf__rg_kind kc, int64_t M,
                                 int64_t n, int64_t K, int64_t K0, double alpha, const void *A,
                                 int64_t am, int64_t aq, const void *B0, const void *B1,
                                 int64_t ldb, const void *bias, bool acc, void *C, int64_t ldc) {
    if (KF__RG_IS(D, D, D)) kf__rowgemm_ddd(KF__RG_ARGS);
}
KF__RG_INLINE void kf__rowgemm_epi_s(kf__rg_kind ka, kf__rg_kind kb, kf__rg_kind kc, int64_t M,
                                 int64_t n, int64_t K, int64_t K0, float alpha, const void *A,
                                 int64_t am, int64_t aq, const void *B0, const void *B1,
                                 int64_t ldb, const void *bias, bool acc, void *C, int64_t ldc,
                                 const kf__rg_epi *epi) {
    if (KF__RG_IS(S, S, S)) kf__rowgemm_epi_sss(KF__RG_ARGS, epi);
    else if (KF__RG_IS(S, B, B)) kf__rowgemm_epi_sbb(KF__RG_ARGS, epi);
    else if (KF__RG_IS(S, H, H)) kf__rowgemm_epi_shh(KF__RG_ARGS, epi);
}
KF__RG_INLINE void kf__rowgemm_epi_d(kf__rg_kind ka, kf__rg_kind kb, kf__rg_kind kc, int64_t M,
                                 int64_t n, int64_t K, int64_t K0, double alpha, const void *A,
                                 int64_t am, int64_t aq, const void *B0, const void *B1,
                                 int64_t ldb, const void *bias, bool acc, void *C, int64_t ldc,
                                 const kf__rg_epi *epi) {
    if (KF__RG_IS(D, D, D)) kf__rowgemm_epi_ddd(KF__RG_ARGS, epi);
}
#undef KF__RG_IS
#undef KF__RG_ARGS

#endif

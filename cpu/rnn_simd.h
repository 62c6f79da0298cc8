/* The recurrent CPU kernels' vector code (private to cpu/rnn_fwd.c, cpu/rnn_bwd.c and
 * cpu/rnn_layout.c): the clone attributes of the functions around it, float vectors of KF__VW
 * lanes, the vectorisable activations and the register-blocked micro-kernel with its panel
 * geometry. The layout and the helpers every recurrent file shares: cpu/rnn_cpu.h. */
#ifndef KF_CPU_RNN_SIMD_H
#define KF_CPU_RNN_SIMD_H

#include "rnn_cpu.h"

#if defined(__FMA__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

/* When the build's baseline lacks AVX2 (KF_CPU_ARCH empty), the kernels get an x86-64-v3 (AVX2 +
 * FMA) clone chosen at load time where the CPU has it. `flatten` inlines the vector helpers into
 * each clone. KF__MK_CLONES, for the functions around the micro-kernel, adds `fp-contract=fast`
 * so the clone fuses kf__vf_fma's a*b+c (the preprocessor cannot see the clone's FMA, and ISO C
 * mode never contracts on its own); the pointwise passes keep their exact rounding. The
 * KF__MK_CLONES functions stay out of line in every build: where GCC inlined the A-GRU forward's
 * two step functions into their caller (a choice that moved with an unrelated edit of the caller,
 * 1.7.4), that forward took 1.5x as long on one thread. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__AVX2__)
#define KF__VEC_CLONES __attribute__((target_clones("arch=x86-64-v3", "default"), flatten))
#define KF__MK_CLONES                                                                           \
    __attribute__((target_clones("arch=x86-64-v3", "default"), flatten, noinline,               \
                   optimize("fp-contract=fast")))
#else
#define KF__VEC_CLONES
#define KF__MK_CLONES __attribute__((noinline))
#endif

/* ---- float vectors of KF__VW lanes -------------------------------------------------------------
 * GCC vector extensions, so the kernels compile for any target: 8 floats (one ymm register) for
 * the baseline, 16 (one zmm) for x86-64-v4; only the fused multiply-add needs the intrinsic (ISO C
 * mode never contracts a*b+c). Full speed needs the build's -march to have FMA; otherwise the
 * KF__VEC_CLONES functions run an AVX2 clone with separate multiply and add. */
#pragma GCC diagnostic ignored "-Wpsabi" /* helpers taking kf__vf are always inlined: */
#define KF__VINLINE static inline __attribute__((always_inline))
#ifdef __AVX512F__
#define KF__VW 16
#else
#define KF__VW 8
#endif
typedef float kf__vf __attribute__((vector_size(KF__VW * 4)));
typedef int32_t kf__vfi __attribute__((vector_size(KF__VW * 4)));

/* A broadcast written as vector + scalar: the element-list form is SLP-vectorised in the v3
 * clone into lane inserts across the kernel's rows instead of one vbroadcastss. */
KF__VINLINE kf__vf kf__vf_set1(float x) { return (kf__vf){0} + x; }

/* *p in every lane, for the micro-kernel's inner loop: with AVX one vbroadcastss from memory, a
 * pure load. kf__vf_set1 of a variable costs an FP add (0 + x, which IEEE signed zeros keep) and
 * a register broadcast, two FP-port uops per row beside the FMAs (30% of the A-GRU forward's
 * time, 20% of the GRU's); GCC forms neither the memory broadcast from a plain load nor keeps the
 * accumulators in registers around _mm256_broadcast_ss, hence the asm ("v": any of AVX-512's 32
 * vector registers). */
KF__VINLINE kf__vf kf__vf_bcast(const float *p) {
#if defined(__AVX512F__) && defined(__GNUC__)
    kf__vf v;
    __asm__("vbroadcastss %1, %0" : "=v"(v) : "m"(*p));
    return v;
#elif defined(__AVX__) && defined(__GNUC__)
    kf__vf v;
    __asm__("vbroadcastss %1, %0" : "=x"(v) : "m"(*p));
    return v;
#else
    return kf__vf_set1(*p);
#endif
}

KF__VINLINE kf__vf kf__vf_load(const float *p) {
    kf__vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The first n <= KF__VW floats at p, zeros after them (never reads past p + n). */
KF__VINLINE kf__vf kf__vf_load_n(const float *p, int n) {
    if (n == KF__VW) return kf__vf_load(p);
    kf__vf v = kf__vf_set1(0.0f);
    memcpy(&v, p, (size_t)n * sizeof(float));
    return v;
}

/* The first n <= KF__VW lanes of v to p (n == KF__VW, every column tile but a ragged last one,
 * is one store; a variable-length memcpy would be a library call). */
KF__VINLINE void kf__vf_store_n(float *p, kf__vf v, int n) {
    if (n == KF__VW)
        memcpy(p, &v, sizeof v);
    else
        memcpy(p, &v, (size_t)n * sizeof(float));
}

KF__VINLINE kf__vf kf__vf_fma(kf__vf a, kf__vf b, kf__vf c) {
#ifdef __AVX512F__
    return (kf__vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__FMA__)
    return (kf__vf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
    return a * b + c;
#endif
}

/* m ? a : b per lane, m from a vector comparison (all ones or zero). */
KF__VINLINE kf__vf kf__vf_select(kf__vfi m, kf__vf a, kf__vf b) {
    return (kf__vf)((m & (kf__vfi)a) | (~m & (kf__vfi)b));
}

KF__VINLINE kf__vf kf__vf_abs(kf__vf x) { return (kf__vf)((kf__vfi)x & 0x7fffffff); }

/* ---- activations ----------------------------------------------------------------------------
 * float32 throughout, within 2 ulp of the exact function (checked against double on a dense
 * sweep, docs/ops/rnn.md). NaN in gives NaN out; large |x| saturates without overflow. */

/* exp(-a) for a >= 0 or NaN: a is clamped to 87 (NaN kept: a NaN fails a >= 87), so 2^n stays
 * normal. Cody-Waite: n = round(-a / ln 2) by the 1.5 * 2^23 shifter (whose low mantissa bits then
 * hold n), r = -a - n ln 2 in [-ln2/2, ln2/2] with ln 2 split in two so n ln2_hi is exact,
 * exp(r) = 1 + r + r^2 P(r) with Cephes' degree-5 minimax P (expf, < 1 ulp), scaled by 2^n
 * through a multiply (a NaN polynomial stays NaN whatever the bits of n). */
KF__VINLINE kf__vf kf__vf_exp_neg(kf__vf a) {
    const kf__vf big = kf__vf_set1(87.0f), shifter = kf__vf_set1(12582912.0f);
    a = kf__vf_select(a >= big, big, a);
    const kf__vf t = -a;
    const kf__vf nb = kf__vf_fma(t, kf__vf_set1(1.44269504088896341f), shifter);
    const kf__vf n = nb - shifter;
    kf__vf r = kf__vf_fma(n, kf__vf_set1(-0.693359375f), t);
    r = kf__vf_fma(n, kf__vf_set1(2.12194440e-4f), r);
    kf__vf q = kf__vf_set1(1.9875691500e-4f);
    q = kf__vf_fma(q, r, kf__vf_set1(1.3981999507e-3f));
    q = kf__vf_fma(q, r, kf__vf_set1(8.3334519073e-3f));
    q = kf__vf_fma(q, r, kf__vf_set1(4.1665795894e-2f));
    q = kf__vf_fma(q, r, kf__vf_set1(1.6666665459e-1f));
    q = kf__vf_fma(q, r, kf__vf_set1(5.0000001201e-1f));
    q = kf__vf_fma(q, r * r, r + 1.0f);
    const kf__vfi scale = ((kf__vfi)nb - (kf__vfi)shifter + 127) << 23; /* 2^n, n in [-126, 0] */
    return q * (kf__vf)scale;
}

/* q = e / (1 + e), e = exp(-|x|): sigmoid(x) = q for x < 0 and 1 - q for x >= 0, and its
 * complement *c = 1 - sigmoid(x) = sigmoid(-x) the other one. No cancellation: each is within
 * about half an ulp, the smaller one (q) to its own last digit. Near saturation (x >> 0) a
 * 1 - z taken from the rounded z keeps none of that: at 1 - z = 5e-6 the float32 spacing of z
 * below 1 (6e-8) is 1.2% of it, and the A-GRU backward's z (1 - z) lost a digit to it
 * (tests/fuzz/corpus/fuzz_rnn/agru_h1_vanishing_dx); it takes both from the pre-activation. */
KF__VINLINE kf__vf kf__vf_sigmoid_c(kf__vf x, kf__vf *c) {
    const kf__vf e = kf__vf_exp_neg(kf__vf_abs(x));
    const kf__vf q = e / (1.0f + e), p = 1.0f - q;
    /* past exp_neg's clamp (x >= 87) q is exp(-87), not exp(-x): the complement is 0 there, as
     * 1 - z of the rounded z = 1 was (a tiny constant would be scaled up by a huge weight) */
    *c = kf__vf_select(x >= 0.0f, kf__vf_select(x >= 87.0f, kf__vf_set1(0.0f), q), p);
    return kf__vf_select(x >= 0.0f, p, q);
}

KF__VINLINE kf__vf kf__vf_sigmoid(kf__vf x) {
    kf__vf c;
    return kf__vf_sigmoid_c(x, &c);
}

/* |x| < 0.625: Cephes' odd minimax polynomial (tanhf); else 1 - c, c = 2e / (1 + e),
 * e = exp(-2|x|) <= 0.287: near saturation the only rounding left is that of the final
 * subtraction, so |t| is within about half an ulp of tanh. Sign restored from x. *dc gets
 * 1 - t^2 without cancellation: c (2 - c) where |x| >= 0.625 (1 - d^2 from a rounded
 * d = 1 - 6e-8 would be 1.2e-7 whatever the true value below it), 1 - t^2 below (t^2 < 0.31). */
KF__VINLINE kf__vf kf__vf_tanh_c(kf__vf x, kf__vf *dc) {
    const kf__vf ax = kf__vf_abs(x);
    const kf__vf e = kf__vf_exp_neg(ax + ax);
    const kf__vf c = (e + e) / (1.0f + e);
    const kf__vf z = x * x;
    kf__vf p = kf__vf_set1(-5.70498872745e-3f);
    p = kf__vf_fma(p, z, kf__vf_set1(2.06390887954e-2f));
    p = kf__vf_fma(p, z, kf__vf_set1(-5.37397155531e-2f));
    p = kf__vf_fma(p, z, kf__vf_set1(1.33314422036e-1f));
    p = kf__vf_fma(p, z, kf__vf_set1(-3.33332819422e-1f));
    const kf__vf small = kf__vf_fma(p * z, ax, ax);
    const kf__vf t = kf__vf_select(ax < 0.625f, small, 1.0f - c);
    /* 0 past exp_neg's clamp (2|x| >= 87), as for the sigmoid's complement */
    *dc = kf__vf_select(ax < 0.625f, 1.0f - small * small,
                        kf__vf_select(ax >= 43.5f, kf__vf_set1(0.0f), c * (2.0f - c)));
    return (kf__vf)((kf__vfi)t | ((kf__vfi)x & INT32_MIN));
}

KF__VINLINE kf__vf kf__vf_tanh(kf__vf x) {
    kf__vf dc;
    return kf__vf_tanh_c(x, &dc);
}

/* ---- the register-blocked micro-kernel ------------------------------------------------------
 * Every per-step recurrent product of forward and backward, C[nb, N] = A[nb, K] B[K, N], goes
 * through kf__mk with B packed once per call into panels (kf__rnn_cpu_pack): panel p holds, for
 * each k, its nv * KF__VW columns contiguously (vector v of the panel = KF__VW columns; which ones
 * is the packing's business: with gates, vector v is gate v of the same columns, so an epilogue
 * sees r, z and n of one column together). kf__mk computes an mr x (nv * KF__VW) tile of C in
 * mr * nv vector accumulators, leaving nv registers for B and one for the broadcast A element:
 * per k, nv loads of B, mr broadcasts of A and mr * nv FMAs. The tile is handed to the caller's
 * epilogue in registers; C is never stored. Rows past `mr` (the slice's last, partial block)
 * repeat row mr-1, and the epilogue drops them. MR and NV must be compile-time constants at the
 * call site (the loops unroll, and acc stays in registers).
 *
 * Tiles (rows MR x vectors NV) per product and ISA: with 16 vector registers at most 12
 * accumulators; AVX-512's 32 take up to 24, so each B row loaded serves twice the rows.
 *   KF__MR_G3  GRU forward, h W_hh^T: NV = 3 gates (r, z, n of the same columns)
 *   KF__MR_G2  A-GRU forward, h [U_z; U_r]^T: NV = 2 gates
 *   KF__MR_P x KF__NV_P  the plain products (A-GRU q A^T; backward dG_h W_hh, da_d A, ...) */
#ifdef __AVX512F__
#define KF__MR_G3 8
#define KF__MR_G2 8
#define KF__MR_P 8
#define KF__NV_P 2
#else
#define KF__MR_G3 4
#define KF__MR_G2 6
#define KF__MR_P 6
#define KF__NV_P 2
#endif
#define KF__MR_MAX 8
#define KF__NV_MAX 3

/* kf__mk on operands in place: A[i, k] at a[i * lda + k * ak], row k of B's nv vectors at
 * bp + k * bk (kf__mk: ak = 1 and packed panels; the GRU backward's dW_hh += dG_h^T Hp reads
 * dG_h^T and Hp where they lie). */
KF__VINLINE void
kf__mk_st(const int MR, const int NV, int64_t K, const float *a, int64_t lda, int64_t ak,
          int64_t mr, const float *restrict bp, int64_t bk,
          kf__vf acc[KF__MR_MAX * KF__NV_MAX]) {
    const float *ap[KF__MR_MAX];
    for (int i = 0; i < MR; i++) ap[i] = a + (i < mr ? i : mr - 1) * lda;
    /* c: constant indices only, so it lives in registers across the asm of kf__vf_bcast (the
     * pragmas: GCC peels no loop of more than 16 iterations whole on its own, and MR * NV is 24
     * on AVX-512) */
    kf__vf c[KF__MR_MAX * KF__NV_MAX];
#pragma GCC unroll 32
    for (int i = 0; i < MR * NV; i++) c[i] = kf__vf_set1(0.0f);
    for (int64_t k = 0; k < K; k++, bp += bk) {
        kf__vf b[KF__NV_MAX];
        for (int v = 0; v < NV; v++) b[v] = kf__vf_load(bp + v * KF__VW);
        for (int i = 0; i < MR; i++) {
            const kf__vf x = kf__vf_bcast(ap[i] + k * ak);
            for (int v = 0; v < NV; v++) c[i * NV + v] = kf__vf_fma(x, b[v], c[i * NV + v]);
        }
    }
#pragma GCC unroll 32
    for (int i = 0; i < MR * NV; i++) acc[i] = c[i];
}

KF__VINLINE void
kf__mk(const int MR, const int NV, int64_t K, const float *a, int64_t lda, int64_t mr,
       const float *restrict bp, kf__vf acc[KF__MR_MAX * KF__NV_MAX]) {
    kf__mk_st(MR, NV, K, a, lda, 1, mr, bp, NV * KF__VW, acc);
}

/* Columns of vector v of panel p: its first column, and how many of its KF__VW lie before hc
 * (the columns per gate). Gated panels (ng > 1) hold gate v of columns KF__VW p..; plain ones
 * columns KF__VW (p nv + v).. */
KF__VINLINE int64_t kf__panel_col(int ng, int nv, int64_t p, int v) {
    return ng > 1 ? KF__VW * p : KF__VW * (p * nv + v);
}
KF__VINLINE int kf__cols_left(int64_t j0, int64_t hc) {
    return hc - j0 >= KF__VW ? KF__VW : hc - j0 > 0 ? (int)(hc - j0) : 0;
}
/* Panels of a product whose B has ng gates of hc columns each, nv vectors per panel. */
KF__VINLINE int64_t kf__num_panels(int ng, int nv, int64_t hc) {
    return ng > 1 ? (hc + KF__VW - 1) / KF__VW : (hc + KF__VW * nv - 1) / (KF__VW * nv);
}

/* Whether n rows (or columns) in tiles of `tile` fill at least 7/8 of them: where a per-step
 * product of the backward over a layer input of n features pays against OpenBLAS's GEMM after
 * the recurrence (I = 28 in tiles of 8 or 32: yes; I = 1, the pixel sequence: no, the micro-
 * kernel would do 8 or 32 times the work). */
static inline bool kf__tiles_full(int64_t n, int64_t tile) {
    return 7 * ((n + tile - 1) / tile * tile) <= 8 * n;
}

/* Whether the backward computes dX = dG_x W3 per step and slice (cpu/rnn_bwd.c) for a layer
 * input of `in` features, its columns in panels of KF__NV_P vectors (W3 packed as pk[2]). */
static inline bool kf__rnn_dx_fused(int64_t in) { return kf__tiles_full(in, KF__NV_P * KF__VW); }

#endif /* KF_CPU_RNN_SIMD_H */

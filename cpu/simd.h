/* The vectors of float and double for the CPU backend's hand-vectorised kernels (GCC and Clang
 * vector extensions): 32 bytes (AVX2 + FMA instructions in the default x86-64-v3 build, plain
 * lanes in a build without AVX), or 64 bytes (AVX-512) in a file that defines KF__SIMD_512 before
 * including this one and is compiled for x86-64-v4 (cpu/sklinear_v4.c):
 *   kf__vs, kf__vd          KF__VS_LANES floats, KF__VD_LANES doubles; loads and stores through
 *                           them may be unaligned and alias any float/double array;
 *   kf__fma_s/d(a, b, c)    a b + c with one rounding where the build has FMA (ISO C gives the
 *                           compiler no licence to contract a * b + c itself; BLAS uses FMA too);
 *   kf__splat_s/d(v)        v in every lane, as one broadcast: v - 0 is v for every v, so the
 *                           subtraction folds away, where 0 + v does not (0 + -0 = +0) and would
 *                           cost a scalar addition before the broadcast.
 * All four are always inlined: a build without AVX has GCC reject (-Wpsabi) an out-of-line copy
 * of one, such as the clone its constant propagation made of kf__splat_s in cpu/sklinear.c. The
 * width is per file: no function taking or returning these types crosses files. */
#ifndef KF_CPU_SIMD_H
#define KF_CPU_SIMD_H

#if defined(__FMA__)
#include <immintrin.h>
#endif

#if defined(__GNUC__) && !defined(__clang__) && !defined(__AVX__)
/* Builds without AVX (KF_CPU_ARCH empty): 32-byte vectors pass by value between static functions
 * only, so GCC's note that their ABI differs from an AVX build's concerns no caller. */
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

#if defined(KF__SIMD_512) && defined(__AVX512F__)
#define KF__V_BYTES 64
#else
#define KF__V_BYTES 32
#endif
#define KF__VS_LANES (KF__V_BYTES / 4)
#define KF__VD_LANES (KF__V_BYTES / 8)
typedef float kf__vs __attribute__((vector_size(KF__V_BYTES), __may_alias__, aligned(1)));
typedef double kf__vd __attribute__((vector_size(KF__V_BYTES), __may_alias__, aligned(1)));

static inline __attribute__((always_inline)) kf__vs kf__fma_s(kf__vs a, kf__vs b, kf__vs c) {
#if KF__V_BYTES == 64
    return (kf__vs)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__FMA__)
    return (kf__vs)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
    return a * b + c;
#endif
}

static inline __attribute__((always_inline)) kf__vd kf__fma_d(kf__vd a, kf__vd b, kf__vd c) {
#if KF__V_BYTES == 64
    return (kf__vd)_mm512_fmadd_pd((__m512d)a, (__m512d)b, (__m512d)c);
#elif defined(__FMA__)
    return (kf__vd)_mm256_fmadd_pd((__m256d)a, (__m256d)b, (__m256d)c);
#else
    return a * b + c;
#endif
}

static inline __attribute__((always_inline)) kf__vs kf__splat_s(float v) {
    const kf__vs z = {0};
    return v - z;
}

static inline __attribute__((always_inline)) kf__vd kf__splat_d(double v) {
    const kf__vd z = {0};
    return v - z;
}

#endif

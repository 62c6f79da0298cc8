/* bfloat16 and float16 to and from float32 in the CPU backend's kernels: a vector at a time as a
 * kf__vs (cpu/simd.h: 8 lanes, AVX2 + F16C where the build has them, elsewhere lane by lane; 16
 * lanes, AVX-512 F + BW, in a KF__SIMD_512 file), and one at a time.
 * The rounding is core/lowp.h's (to nearest, ties to even; a NaN stays a quiet NaN; a float16
 * overflow is an infinity), which these vectorise: F16C rounds as core/lowp.h does on every
 * float32 input, bfloat16 is integer arithmetic on the bits. Used by the kernels that read and
 * write the low types themselves (cpu/rowgemm.h's operand kinds, cpu/sklinear.c,
 * cpu/kan_linear.c, cpu/rnn_cpu.h's kf__rnn_cpu_get / kf__rnn_cpu_put). `bf16` selects the type
 * (float16 otherwise); the callers pass a constant, so each type gets its own inlined code.
 * tests/c/test_lowp_simd.c holds both forms to rounding done in double arithmetic. */
#ifndef KF_CPU_LOWP_SIMD_H
#define KF_CPU_LOWP_SIMD_H

#include "lowp.h"
#include "simd.h"

#include <stdbool.h>
#include <stdint.h>

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#define KF__LP_AVX2 1
#endif

static inline __attribute__((always_inline)) float kf__lp_get(uint16_t h, bool bf16) {
#ifdef KF__LP_AVX2
    if (!bf16) return _cvtsh_ss(h);
#endif
    return bf16 ? kf__bf16_to_f32(h) : kf__f16_to_f32(h);
}

static inline __attribute__((always_inline)) uint16_t kf__lp_put(float f, bool bf16) {
#ifdef KF__LP_AVX2
    if (!bf16) return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#endif
    return bf16 ? kf__f32_to_bf16(f) : kf__f32_to_f16(f);
}

/* KF__VS_LANES values from s widened. */
static inline __attribute__((always_inline)) kf__vs kf__lp_loadv(const uint16_t *s, bool bf16) {
#if KF__V_BYTES == 64
    const __m256i h = _mm256_loadu_si256((const __m256i *)s);
    if (!bf16) return (kf__vs)_mm512_cvtph_ps(h);
    return (kf__vs)_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
#elif defined(KF__LP_AVX2)
    const __m128i h = _mm_loadu_si128((const __m128i *)s);
    if (!bf16) return (kf__vs)_mm256_cvtph_ps(h);
    return (kf__vs)_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
#else
    kf__vs v;
    for (int i = 0; i < KF__VS_LANES; ++i) v[i] = kf__lp_get(s[i], bf16);
    return v;
#endif
}

/* The KF__VS_LANES values of v rounded into d. bfloat16: round(u) = (u + 0x7fff + the kept
 * half's lowest bit) >> 16 on the bits u; a NaN lane (rare: tested once per vector instead of
 * blended into every one) first becomes its quiet form with a zero low half, which the addition
 * leaves alone. */
static inline __attribute__((always_inline)) void kf__lp_storev(uint16_t *d, kf__vs v, bool bf16) {
#if KF__V_BYTES == 64
    if (!bf16) {
        _mm256_storeu_si256((__m256i *)d, _mm512_cvtps_ph((__m512)v, _MM_FROUND_TO_NEAREST_INT |
                                                                          _MM_FROUND_NO_EXC));
        return;
    }
    __m512i u = _mm512_castps_si512((__m512)v);
    const __mmask16 nan = _mm512_cmp_ps_mask((__m512)v, (__m512)v, _CMP_UNORD_Q);
    if (__builtin_expect(nan != 0, 0))
        u = _mm512_mask_and_epi32(u, nan, _mm512_or_si512(u, _mm512_set1_epi32(0x400000)),
                                  _mm512_set1_epi32((int)0xffff0000u));
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
    /* the high halves narrowed by one vpmovdw */
    _mm256_storeu_si256((__m256i *)d, _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
#elif defined(KF__LP_AVX2)
    if (!bf16) {
        _mm_storeu_si128((__m128i *)d, _mm256_cvtps_ph((__m256)v, _MM_FROUND_TO_NEAREST_INT |
                                                                      _MM_FROUND_NO_EXC));
        return;
    }
    /* the high halves gathered by a byte shuffle and a cross-lane permute */
    __m256i u = _mm256_castps_si256((__m256)v);
    const __m256 nan = _mm256_cmp_ps((__m256)v, (__m256)v, _CMP_UNORD_Q);
    if (__builtin_expect(_mm256_movemask_ps(nan), 0)) {
        const __m256i q = _mm256_and_si256(_mm256_or_si256(u, _mm256_set1_epi32(0x400000)),
                                           _mm256_set1_epi32((int)0xffff0000u));
        u = _mm256_castps_si256(
            _mm256_blendv_ps(_mm256_castsi256_ps(u), _mm256_castsi256_ps(q), nan));
    }
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd));
    const __m256i hi = _mm256_shuffle_epi8(
        r, _mm256_setr_epi8(2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1, 2, 3, 6,
                            7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1));
    const __m256i p = _mm256_permute4x64_epi64(hi, 0x08);
    _mm_storeu_si128((__m128i *)d, _mm256_castsi256_si128(p));
#else
    for (int i = 0; i < KF__VS_LANES; ++i) d[i] = kf__lp_put(v[i], bf16);
#endif
}

/* s[0 .. n) widened into d[0 .. n), 1 <= n <= 8, reading no element past s[n - 1] and writing
 * d[0 .. 8) (d[n .. 8) unspecified): a tile's elements of a column of a low matrix. From 4 on,
 * two overlapping 8-byte loads, the second shifted into place (no store to memory and reload,
 * which would stall on the store forwarding); fewer, lane by lane. */
static inline __attribute__((always_inline)) void kf__lp_load_part(float *d, const uint16_t *s,
                                                                   int n, bool bf16) {
#ifdef KF__LP_AVX2
    __m128i h;
    if (n >= 4) {
        const __m128i lo = _mm_loadl_epi64((const __m128i *)s),
                      hi = _mm_loadl_epi64((const __m128i *)(s + n - 4));
        switch (n) { /* hi holds s[n - 4 .. n); lanes 4 .. n of the result are s[4 .. n) */
        case 8: h = _mm_unpacklo_epi64(lo, hi); break;
        case 7: h = _mm_unpacklo_epi64(lo, _mm_srli_si128(hi, 2)); break;
        case 6: h = _mm_unpacklo_epi64(lo, _mm_srli_si128(hi, 4)); break;
        case 5: h = _mm_unpacklo_epi64(lo, _mm_srli_si128(hi, 6)); break;
        default: h = lo; break;
        }
    } else {
        h = _mm_setr_epi16((short)s[0], n > 1 ? (short)s[1] : 0, n > 2 ? (short)s[2] : 0, 0, 0, 0,
                           0, 0);
    }
    _mm256_storeu_ps(d, bf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                             : _mm256_cvtph_ps(h));
#else
    for (int i = 0; i < n; ++i) d[i] = kf__lp_get(s[i], bf16);
#endif
}

/* f[i] = d[i] widened, for i < n. */
static inline __attribute__((always_inline)) void kf__lp_load_n(float *f, const uint16_t *d,
                                                                 int64_t n, bool bf16) {
    int64_t i = 0;
    for (; i + KF__VS_LANES <= n; i += KF__VS_LANES) *(kf__vs *)(f + i) = kf__lp_loadv(d + i, bf16);
    for (; i < n; ++i) f[i] = kf__lp_get(d[i], bf16);
}

/* d[i] = round(f[i]) for i < n, or with `acc` round(d[i] + f[i]) (the sum in float32). */
static inline __attribute__((always_inline)) void kf__lp_store_n(uint16_t *d, const float *f,
                                                                  int64_t n, bool acc,
                                                                  bool bf16) {
    int64_t i = 0;
    for (; i + KF__VS_LANES <= n; i += KF__VS_LANES) {
        kf__vs v = *(const kf__vs *)(f + i);
        if (acc) v += kf__lp_loadv(d + i, bf16);
        kf__lp_storev(d + i, v, bf16);
    }
    for (; i < n; ++i) d[i] = kf__lp_put(acc ? kf__lp_get(d[i], bf16) + f[i] : f[i], bf16);
}

#endif

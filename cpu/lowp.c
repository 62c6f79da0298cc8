/* The CPU backend's conversion routine for bfloat16 and float16 plans (core/lowp_ops.h: the
 * conversion layer over the float32 op tables that every backend shares).
 * Conversions are O(elements) against the O(flops) kernels: AVX2 + F16C (8 lanes), bfloat16 by
 * integer shifts; all of a pass's conversions (the inputs, then the outputs) run on one team
 * of the context's threads when they hold 64 Ki elements or more. */
#include "cpu_backend.h"
#include "lowp.h"
#include "lowp_ops.h"
#include "team.h"

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#define KF__LOWP_AVX2 1
#endif

/* ---- conversions --------------------------------------------------------------------------- */

static inline float lp_to_f32(uint16_t h, bool bf16) {
    return bf16 ? kf__bf16_to_f32(h) : kf__f16_to_f32(h);
}

static inline uint16_t lp_from_f32(float f, bool bf16) {
    return bf16 ? kf__f32_to_bf16(f) : kf__f32_to_f16(f);
}

#ifdef KF__LOWP_AVX2
static inline __m256 lp_load8(const uint16_t *s, bool bf16) {
    const __m128i h = _mm_loadu_si128((const __m128i *)s);
    if (!bf16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline void lp_store8(uint16_t *d, __m256 v, bool bf16) {
    if (!bf16) {
        _mm_storeu_si128((__m128i *)d, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT |
                                                             _MM_FROUND_NO_EXC));
        return;
    }
    const __m256i u = _mm256_castps_si256(v);
    const __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    const __m256i nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7f800000));
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i rnd =
        _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd));
    const __m256i q = _mm256_or_si256(u, _mm256_set1_epi32(0x400000));
    const __m256i r = _mm256_srli_epi32(_mm256_blendv_epi8(rnd, q, nan), 16);
    const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128((__m128i *)d, _mm256_castsi256_si128(p));
}
#endif

/* Elements [lo, hi) of `c`; inlined with `bf16` a constant, so each type gets its own loop. */
static inline __attribute__((always_inline)) void lp_cvt_range(const kf__lp_cvt *c, int64_t lo,
                                                               int64_t hi, bool bf16) {
    uint16_t *low = c->low;
    float *f = c->f;
    int64_t i = lo;
#ifdef KF__LOWP_AVX2
    for (; i + 8 <= hi; i += 8) {
        if (c->dir == KF__LP_LOAD)
            _mm256_storeu_ps(f + i, lp_load8(low + i, bf16));
        else if (c->dir == KF__LP_STORE)
            lp_store8(low + i, _mm256_loadu_ps(f + i), bf16);
        else
            lp_store8(low + i, _mm256_add_ps(lp_load8(low + i, bf16), _mm256_loadu_ps(f + i)),
                      bf16);
    }
#endif
    for (; i < hi; ++i) {
        if (c->dir == KF__LP_LOAD)
            f[i] = lp_to_f32(low[i], bf16);
        else if (c->dir == KF__LP_STORE)
            low[i] = lp_from_f32(f[i], bf16);
        else
            low[i] = lp_from_f32(lp_to_f32(low[i], bf16) + f[i], bf16);
    }
}

/* Below this many elements in all, a pass's conversions stay in the calling thread. */
#define KF__LOWP_PAR_MIN ((int64_t)1 << 16)
/* This thread's share of every conversion of the batch: whole vectors of each. */
static void lp_batch_team(void *arg, int tid, int nth) {
    const kf__lp_batch *b = arg;
    for (int j = 0; j < b->n; ++j) {
        const kf__lp_cvt *c = &b->c[j];
        int64_t lo, hi;
        kf__cpu_share((c->n + 7) / 8, tid, nth, &lo, &hi);
        lo *= 8;
        hi = hi * 8 < c->n ? hi * 8 : c->n;
        if (c->bf16)
            lp_cvt_range(c, lo, hi, true);
        else
            lp_cvt_range(c, lo, hi, false);
    }
}

/* kf__lowp_base.convert: the batch on one team of the context's threads (the calling thread
 * alone below KF__LOWP_PAR_MIN elements); never fails. */
static kf_status cpu_convert(kf_context *ctx, const char *fn, const kf__lp_batch *b) {
    kf__cpu_team(b->elems >= KF__LOWP_PAR_MIN ? ctx->num_threads : 1, lp_batch_team, (void *)b);
    return KF_OK;
}

const kf__lowp_base kf__cpu_lowp = {&kf__cpu_rnn_ops, &kf__cpu_skl_ops, &kf__cpu_kan_ops,
                                    cpu_convert};

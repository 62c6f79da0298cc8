/* The storage dtypes' scalar conversions, shared by the front ends' host checks (capi/src), the
 * host algorithms (host/) and the CPU backend's kernels (cpu/lowp_simd.h, which vectorises the
 * same rounding and uses these for its tails).
 *
 * KF_DTYPE_BF16 and KF_DTYPE_F16 are storage types: every op computes in float32 and rounds its
 * results to the low type to nearest, ties to even (IEEE roundTiesToEven, as torch's .to() and
 * the F16C instruction do); a NaN stays a (quiet) NaN, a float16 overflow becomes an infinity. */
#ifndef KF_CORE_LOWP_H
#define KF_CORE_LOWP_H

#include "kfuse.h"

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* The scalar conversions below compile for CUDA devices too (cuda/plain.cuh's bfloat16 and float16
 * KAN path runs them in its kernels, so that its rounding is the host's). */
#ifdef __CUDACC__
#define KF__LOWP_FN static inline __host__ __device__
#else
#define KF__LOWP_FN static inline
#endif

static inline bool kf__dtype_is_lowp(int32_t dtype) {
    return dtype == KF_DTYPE_BF16 || dtype == KF_DTYPE_F16;
}

KF__LOWP_FN uint32_t kf__f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

KF__LOWP_FN float kf__bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

KF__LOWP_FN float kf__bf16_to_f32(uint16_t h) { return kf__bits_f32((uint32_t)h << 16); }

KF__LOWP_FN uint16_t kf__f32_to_bf16(float f) {
    const uint32_t u = kf__f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

KF__LOWP_FN float kf__f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return kf__bits_f32(sign | 0x7f800000u | ((m ? m | 0x200u : 0) << 13)); /* quiet */
    if (e != 0) return kf__bits_f32(sign | ((e + 112) << 23) | (m << 13));
    if (m == 0) return kf__bits_f32(sign);
    e = 113; /* a subnormal m * 2^-24: normalise */
    while (!(m & 0x400u)) m <<= 1, --e;
    return kf__bits_f32(sign | (e << 23) | ((m & 0x3ffu) << 13));
}

KF__LOWP_FN uint16_t kf__f32_to_f16(float f) {
    const uint32_t u = kf__f32_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to infinity */
    if (a >= 0x38800000u) {                                  /* normal: >= 2^-14 */
        uint32_t h = (a - 0x38000000u) >> 13;
        const uint32_t rem = a & 0x1fffu;
        h += rem > 0x1000u || (rem == 0x1000u && (h & 1u));
        return (uint16_t)(sign | h);
    }
    const uint32_t e = a >> 23;
    if (e < 102) return (uint16_t)sign; /* below half the smallest subnormal: zero */
    const uint32_t m = (a & 0x7fffffu) | 0x800000u, shift = 126 - e;
    uint32_t h = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    h += rem > half || (rem == half && (h & 1u));
    return (uint16_t)(sign | h);
}

/* Element i of host array `a` of `dtype` (a float dtype) as a double, and back (rounded to the
 * dtype; a low dtype through float32, so every path rounds the same way). */
static inline double kf__elem_load(const void *a, int32_t dtype, int64_t i) {
    switch (dtype) {
    case KF_DTYPE_F64: return ((const double *)a)[i];
    case KF_DTYPE_BF16: return kf__bf16_to_f32(((const uint16_t *)a)[i]);
    case KF_DTYPE_F16: return kf__f16_to_f32(((const uint16_t *)a)[i]);
    default: return ((const float *)a)[i];
    }
}

static inline void kf__elem_store(void *a, int32_t dtype, int64_t i, double v) {
    switch (dtype) {
    case KF_DTYPE_F64: ((double *)a)[i] = v; break;
    case KF_DTYPE_BF16: ((uint16_t *)a)[i] = kf__f32_to_bf16((float)v); break;
    case KF_DTYPE_F16: ((uint16_t *)a)[i] = kf__f32_to_f16((float)v); break;
    default: ((float *)a)[i] = (float)v; break;
    }
}

#endif /* KF_CORE_LOWP_H */

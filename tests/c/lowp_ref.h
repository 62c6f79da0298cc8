/* bfloat16 and float16 as the tests see them, independent of the library's conversions
 * (tests/c/test_lowp.c, test_sklinear_epilogue.c). */
#ifndef KF_TESTS_LOWP_REF_H
#define KF_TESTS_LOWP_REF_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kfuse.h"

static inline double unit_roundoff(kf_dtype dt) { return dt == KF_DTYPE_BF16 ? 0x1p-8 : 0x1p-11; }

/* float16 by double arithmetic (an implementation independent of the library's bit tricks):
 * v rounded to nearest even once; finite v only. */
static inline uint16_t to_f16(double v) {
    const uint16_t sign = signbit(v) ? 0x8000u : 0;
    const double a = fabs(v);
    if (a >= 65520.0) return sign | 0x7c00u;
    if (a < 0x1p-14) return sign | (uint16_t)nearbyint(a * 0x1p24); /* subnormal (or 2^-14) */
    int e;
    frexp(a, &e); /* a = m 2^e, m in [0.5, 1): the leading bit is 2^(e - 1) */
    double r = nearbyint(ldexp(a, 11 - e)); /* 11 significant bits */
    if (r == 2048.0) r = 1024.0, e++;
    if (e - 1 > 15) return sign | 0x7c00u;
    return sign | (uint16_t)(((e - 1 + 15) << 10) | ((int)r - 1024));
}

static inline double from_f16(uint16_t u) {
    const int e = (u >> 10) & 31, m = u & 1023;
    const double mag = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY)
                                                        : ldexp(1024 + m, e - 25);
    return (u & 0x8000u) ? -mag : mag;
}

static inline uint16_t to_low(double v, kf_dtype dt) {
    if (dt == KF_DTYPE_F16) return to_f16(v);
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); /* finite inputs only */
}

static inline double from_low(uint16_t u, kf_dtype dt) {
    if (dt == KF_DTYPE_F16) return from_f16(u);
    uint32_t w = (uint32_t)u << 16;
    float f;
    memcpy(&f, &w, 4);
    return f;
}

#endif /* KF_TESTS_LOWP_REF_H */

/* What the three fuzz harnesses share: the input reader (values taken big-endian from the
 * fuzzer's bytes, zeros once they run out, so every input, including an empty one, decodes to
 * some call), the draw of the plans' dtype and the CPU instruction set, tensors in every dtype
 * (the harness's own conversions) and the oracles' per-dtype bounds. Header-only: each harness
 * is one translation unit. */
#ifndef KF_FUZZ_INPUT_H
#define KF_FUZZ_INPUT_H

#include "kfuse.h"

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct rd {
    const uint8_t *p;
    size_t n;
} rd;

static inline uint64_t rd_bytes(rd *r, int k) {
    uint64_t v = 0;
    for (int i = 0; i < k; i++) {
        v = (v << 8) | (r->n ? r->p[0] : 0);
        if (r->n) r->p++, r->n--;
    }
    return v;
}
static inline uint32_t u8(rd *r) { return (uint32_t)rd_bytes(r, 1); }
static inline uint32_t u16(rd *r) { return (uint32_t)rd_bytes(r, 2); }
static inline uint32_t u32(rd *r) { return (uint32_t)rd_bytes(r, 4); }
static inline uint64_t u64(rd *r) { return rd_bytes(r, 8); }
/* Uniform-ish in [lo, hi] from one byte (hi - lo < 256). */
static inline int64_t range(rd *r, int64_t lo, int64_t hi) {
    return lo + (int64_t)(u8(r) % (uint32_t)(hi - lo + 1));
}

/* The layer dtypes plan creation accepts on the CPU: float32, float64 (since 1.3), float16 and
 * bfloat16 storage (since 1.5). */
static inline bool fuzz_float_dtype(int32_t dtype) {
    return dtype == KF_DTYPE_F32 || dtype == KF_DTYPE_F64 || dtype == KF_DTYPE_F16 ||
           dtype == KF_DTYPE_BF16;
}

/* ---- the plan's dtype and the CPU's instruction set, the first byte of every input ----------- */
/* Whether a context created with KF_CPU_ISA=avx512 runs (the CPU and this build have AVX-512);
 * asked once. */
static inline bool fuzz_avx512_runs(void) {
    static int runs = -1;
    if (runs < 0) {
        setenv("KF_CPU_ISA", "avx512", 1);
        kf_context_desc d;
        kf_context_desc_init(&d);
        d.num_threads = 1;
        kf_context *c = NULL;
        runs = kf_context_create(&d, &c) == KF_OK;
        kf_context_destroy(c);
    }
    return runs;
}

typedef struct fuzz_setup {
    int32_t dtype;   /* of the plan and every float tensor of its calls */
    const char *isa; /* KF_CPU_ISA of the contexts: "default" (unset), "avx2" or "avx512" */
} fuzz_setup;

/* Byte 0 of an input: bits 0-1 the dtype (0 float32, so an input written before the dtypes were
 * drawn decodes as it did with a 0 byte in front), the rest modulo 3 the instruction set that
 * cpu/isa.c picks at kf_context_create: unset (the CPU's best: the x86-64-v4 kernels where it
 * runs AVX-512), avx2 (the baseline kernels) or avx512 (unset where the CPU or the build lacks
 * it, so an AVX2-only CI machine runs such an input on its baseline). Sets KF_CPU_ISA. */
static inline fuzz_setup fuzz_draw_setup(rd *r) {
    static const int32_t dtypes[4] = {KF_DTYPE_F32, KF_DTYPE_F64, KF_DTYPE_BF16, KF_DTYPE_F16};
    static const char *const isas[3] = {"default", "avx2", "avx512"};
    const uint32_t b = u8(r);
    fuzz_setup s = {dtypes[b & 3], isas[(b >> 2) % 3]};
    if (!strcmp(s.isa, "avx512") && !fuzz_avx512_runs()) s.isa = isas[0];
    if (!strcmp(s.isa, "default")) unsetenv("KF_CPU_ISA");
    else setenv("KF_CPU_ISA", s.isa, 1);
    return s;
}

static inline const char *fuzz_dtype_name(int32_t dt) {
    return dt == KF_DTYPE_F64 ? "float64" : dt == KF_DTYPE_BF16 ? "bfloat16"
         : dt == KF_DTYPE_F16 ? "float16" : "float32";
}
/* Element bytes, which are also the data alignment the library requires (capi/src/tensor.c). */
static inline size_t fuzz_dtype_bytes(int32_t dt) {
    return dt == KF_DTYPE_F64 ? 8 : dt == KF_DTYPE_F32 || dt == KF_DTYPE_I32 ? 4 : 2;
}

/* The harness's own conversions (the oracle does not use the library's): float to bfloat16 and
 * float16 bits, round to nearest even, and back (exact). */
static inline uint16_t fuzz_bf16_bits(float v) {
    uint32_t x;
    memcpy(&x, &v, 4);
    if (isnan(v)) return (uint16_t)((x >> 16) | 0x40);
    return (uint16_t)((x + 0x7FFF + ((x >> 16) & 1)) >> 16);
}
static inline uint16_t fuzz_f16_bits(float v) {
    uint32_t x;
    memcpy(&x, &v, 4);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    const float a = fabsf(v);
    if (isnan(v)) return sign | 0x7E00;
    if (a >= 65520.0f) return sign | 0x7C00; /* rounds past 65504 */
    if (a < 0x1p-14f) return sign | (uint16_t)nearbyintf(a * 0x1p24f); /* subnormal (or 2^-14) */
    uint32_t h = ((((x >> 23) & 0xFF) - 112) << 10) | ((x >> 13) & 0x3FF), rest = x & 0x1FFF;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++; /* a carry moves into the exponent */
    return sign | (uint16_t)h;
}
static inline float fuzz_f16_value(uint16_t h) {
    const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
    float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY)
                                              : ldexpf((float)(m | 0x400), e - 25);
    return (h & 0x8000) ? -v : v;
}

/* Element i of a tensor of dtype dt at p, as a double (exact). */
static inline double fuzz_get(int32_t dt, const void *p, int64_t i) {
    switch (dt) {
    case KF_DTYPE_F64: return ((const double *)p)[i];
    case KF_DTYPE_F32: return ((const float *)p)[i];
    case KF_DTYPE_F16: return fuzz_f16_value(((const uint16_t *)p)[i]);
    default: {
        uint32_t x = (uint32_t)((const uint16_t *)p)[i] << 16;
        float f;
        memcpy(&f, &x, 4);
        return f;
    }
    }
}
/* Stores the float values v[0, n) at p in dtype dt, and replaces each v[i] by the value stored:
 * v is the harness's float32 copy of an input (every dtype's value of a float32 input is a
 * float32 value), which the references read. */
static inline void fuzz_store(int32_t dt, void *p, float *v, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        switch (dt) {
        case KF_DTYPE_F64: ((double *)p)[i] = v[i]; break;
        case KF_DTYPE_F32: ((float *)p)[i] = v[i]; break;
        case KF_DTYPE_F16: ((uint16_t *)p)[i] = fuzz_f16_bits(v[i]); break;
        default: ((uint16_t *)p)[i] = fuzz_bf16_bits(v[i]); break;
        }
        v[i] = (float)fuzz_get(dt, p, i);
    }
}
/* What the library wrote at p (knots it formed) as the input of the following calls: its float
 * copy v[0, n), and p rewritten to hold exactly that (a float64 value rounded to float32). */
static inline void fuzz_adopt(int32_t dt, void *p, float *v, int64_t n) {
    for (int64_t i = 0; i < n; i++) v[i] = (float)fuzz_get(dt, p, i);
    fuzz_store(dt, p, v, n);
}
/* n NaNs of dtype dt at p: an output element the call does not write stays NaN. */
static inline void fuzz_poison(int32_t dt, void *p, int64_t n) {
    float nan = NAN;
    for (int64_t i = 0; i < n; i++) {
        float v = nan;
        fuzz_store(dt, (char *)p + (size_t)i * fuzz_dtype_bytes(dt), &v, 1);
    }
}

/* The oracles' bounds per dtype, from a float32 plan's bound (relative `tol32`, or an absolute
 * floor), as docs/precision.md derives them: a bfloat16 or float16 result is the float32
 * computation on the same (representable) inputs rounded once, so ||out - ref|| <= (u + e32)
 * ||ref|| with u = 2^-8 (bfloat16), 2^-11 (float16) and e32 the float32 error the float32 bound
 * already allows; a float64 plan runs the same algorithms in float64, so its bound is the
 * float32 one scaled by the ratio of the unit roundoffs, 2^-53 / 2^-24 = 2^-29 (1e-3 becomes
 * 1.9e-12, the order of the 1e-12 that tests/c/test_*_f64.c hold). */
static inline double fuzz_abs_bound(int32_t dt, double floor32) {
    return dt == KF_DTYPE_F64 ? ldexp(floor32, -29) : floor32;
}
static inline double fuzz_rel_bound(int32_t dt, double tol32) {
    return fuzz_abs_bound(dt, tol32) + (dt == KF_DTYPE_BF16 ? 0x1p-8 : dt == KF_DTYPE_F16 ? 0x1p-11 : 0.0);
}

#endif /* KF_FUZZ_INPUT_H */

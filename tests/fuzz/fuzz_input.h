/* The fuzz harnesses' input reader: values taken big-endian from the fuzzer's bytes, zeros once
 * they run out, so every input (including an empty one) decodes to some call. Header-only: each
 * harness is one translation unit. */
#ifndef KF_FUZZ_INPUT_H
#define KF_FUZZ_INPUT_H

#include "kfuse.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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

#endif /* KF_FUZZ_INPUT_H */

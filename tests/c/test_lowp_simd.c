/* The CPU backend's conversions to and from bfloat16 and float16 (cpu/lowp_simd.h: one value at
 * a time and a vector at a time: 8 lanes, F16C and AVX2 where the build has them, as the
 * library's baseline kernels are built; compiled again as test_lowp_simd_v4 for the AVX-512
 * kernels, 16 lanes, where it runs only on a CPU with AVX-512)
 * against rounding done here in double arithmetic: to nearest, ties to even, float16 overflow to
 * infinity, NaN to a quiet NaN. The kernels convert every element of a low-precision plan with
 * these (cpu/sklinear.c, cpu/kan_linear.c, cpu/rnn_*.c), so a rounding slip here is a silent
 * off-by-one-ulp in every result. Inputs: every float16 and bfloat16 value, every float32 tie
 * between two of them and its neighbours, and a stride through all 2^32 float32 bit patterns;
 * the partial load of a tile's column (kf__lp_load_part) at every length. */
#include "lowp_simd.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

enum { LANES = KF__VS_LANES };

#ifdef KF__SIMD_512
/* The AVX-512 build's checks run where the CPU has what -march=x86-64-v4 may use (F, VL, BW, DQ,
 * CD) and the OS saves the zmm registers, which __builtin_cpu_supports reports together. */
static void need_avx512(void) {
    if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
          __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
          __builtin_cpu_supports("avx512cd")))
        cr_skip_test("this CPU does not run AVX-512");
}
#else
static void need_avx512(void) {}
#endif

typedef struct lowfmt {
    bool bf16;
    int p;          /* significant bits */
    double qmin;    /* the subnormal quantum */
    double maxfin;  /* the largest finite value */
} lowfmt;

static const lowfmt F16 = {false, 11, 0x1p-24, 65504.0};
static const lowfmt BF16 = {true, 8, 0x1p-133, 0x1.fep127};

/* v rounded to the format (to nearest, ties to even), as a double; infinite past the largest
 * finite value. v finite. */
static double ref_round(double v, const lowfmt *f) {
    const double a = fabs(v);
    if (a == 0) return v;
    int e;
    frexp(a, &e);
    double q = ldexp(1.0, e - f->p);
    if (q < f->qmin) q = f->qmin;
    const double r = nearbyint(a / q) * q;
    return copysign(r > f->maxfin ? INFINITY : r, v);
}

/* A low value's bits decoded here, independently of core/lowp.h. */
static double decode(uint16_t u, const lowfmt *f) {
    if (f->bf16) {
        const uint32_t w = (uint32_t)u << 16;
        float x;
        memcpy(&x, &w, 4);
        return x;
    }
    const int e = (u >> 10) & 31, m = u & 1023;
    const double mag = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY)
                                                        : ldexp(1024 + m, e - 25);
    return (u & 0x8000u) ? -mag : mag;
}

static bool quiet_nan(uint16_t u, const lowfmt *f) {
    return f->bf16 ? (u & 0x7f80u) == 0x7f80u && (u & 0x40u)
                   : (u & 0x7c00u) == 0x7c00u && (u & 0x200u);
}

static float f32_of(uint32_t w) {
    float x;
    memcpy(&x, &w, 4);
    return x;
}

static int failures;

/* signbit() is some non-zero int for a negative value, not the same one for float and double */
static bool same_sign(double a, double b) { return !signbit(a) == !signbit(b); }

/* x converted one at a time and (in lane LANES - 3 of a vector of equal lanes) a vector at a
 * time, against ref_round. */
static void check_one(float x, const lowfmt *f) {
    const uint16_t s = kf__lp_put(x, f->bf16);
    float in[LANES];
    uint16_t v[LANES];
    for (int i = 0; i < LANES; i++) in[i] = x;
    kf__lp_storev(v, *(const kf__vs *)in, f->bf16);
    for (int k = 0; k < 2; k++) {
        const uint16_t got = k ? v[LANES - 3] : s;
        const bool ok = isnan(x) ? quiet_nan(got, f)
                                 : decode(got, f) == ref_round(x, f) &&
                                       same_sign(decode(got, f), x);
        if (!ok && failures++ < 10)
            cr_log_error("%s %s(%a) = 0x%04x (%a), expected %a", f->bf16 ? "bf16" : "f16",
                         k ? "storev" : "put", (double)x, got, decode(got, f),
                         ref_round(x, f));
    }
}

static void check_format(const lowfmt *f) {
    need_avx512();
    failures = 0;
    for (uint32_t u = 0; u < 65536; u++) {
        const uint16_t h = (uint16_t)u;
        /* widening: one at a time and a vector at a time */
        uint16_t hv[LANES];
        for (int i = 0; i < LANES; i++) hv[i] = h;
        const kf__vs w = kf__lp_loadv(hv, f->bf16);
        const double want = decode(h, f);
        const float a = kf__lp_get(h, f->bf16), b = w[LANES - 3];
        if (isnan(want) ? !(isnan(a) && isnan(b))
                        : !(a == want && b == want && same_sign(a, want) && same_sign(b, want)))
            if (failures++ < 10) cr_log_error("get(0x%04x) = %a, %a: expected %a", h, a, b, want);
        /* the value, the float32 tie above it and their neighbours */
        if (isnan(want) || isinf(want)) continue;
        const double up = decode((uint16_t)(h + 1), f);
        const float mid = (float)(want + (up - want) / 2); /* exact: fewer bits than float32 */
        check_one((float)want, f);
        if (!isnan(up) && (h & 0x7fffu) != 0x7fffu) {
            check_one(mid, f);
            check_one(nextafterf(mid, INFINITY), f);
            check_one(nextafterf(mid, -INFINITY), f);
        }
    }
    for (uint64_t w = 0; w < ((uint64_t)1 << 32); w += 4099) check_one(f32_of((uint32_t)w), f);
    check_one(INFINITY, f), check_one(-INFINITY, f), check_one(NAN, f);
    check_one(f32_of(0x7f800001u), f); /* a signalling NaN */
    cr_expect(failures == 0, "%s: %d mismatches", f->bf16 ? "bf16" : "f16", failures);
}

Test(lowp_simd, float16) { check_format(&F16); }
Test(lowp_simd, bfloat16) { check_format(&BF16); }

/* kf__lp_load_part: n = 1..8 elements, the last of them at the end of their allocation (so that a
 * read past it is one under AddressSanitizer), each lane i < n equal to the element widened
 * one at a time. Distinct values per lane catch a lane taken from the wrong element. */
static void check_part(const lowfmt *f) {
    need_avx512();
    for (int n = 1; n <= 8; n++) {
        uint16_t *s = malloc((size_t)n * sizeof *s);
        cr_assert(s);
        for (int i = 0; i < n; i++) s[i] = (uint16_t)(f->bf16 ? 0x3f80 + 3 * i : 0x3c00 + 5 * i);
        float v[8];
        kf__lp_load_part(v, s, n, f->bf16);
        for (int i = 0; i < n; i++) {
            const float want = (float)decode(s[i], f);
            cr_expect(v[i] == want, "%s n = %d lane %d: %a, expected %a",
                      f->bf16 ? "bf16" : "f16", n, i, v[i], want);
        }
        free(s);
    }
}

Test(lowp_simd, load_part) {
    check_part(&F16);
    check_part(&BF16);
}

/* kf__lp_storev with NaNs in some lanes only (its NaN handling is per vector): every lane as
 * kf__lp_put rounds it alone, for each of the 256 patterns of NaN among 8 lanes (repeated over
 * a wider vector, shifted by 3 in the second half, so lanes pair differently there). */
static void check_mixed_nan(const lowfmt *f) {
    need_avx512();
    for (int m = 0; m < 256; m++) {
        kf__vs v;
        for (int i = 0; i < LANES; i++) {
            const int bit = (i + (i >= 8 ? 3 : 0)) % 8;
            v[i] = (m >> bit) & 1 ? (i & 1 ? -NAN : f32_of(0x7f800001u + (uint32_t)i))
                                  : 1.0f + (float)i * 0x1.0101p-7f;
        }
        uint16_t got[LANES];
        kf__lp_storev(got, v, f->bf16);
        for (int i = 0; i < LANES; i++) {
            const uint16_t want = kf__lp_put(v[i], f->bf16);
            cr_expect(got[i] == want, "%s NaN lanes 0x%02x, lane %d: 0x%04x, expected 0x%04x",
                      f->bf16 ? "bf16" : "f16", m, i, got[i], want);
        }
    }
}

Test(lowp_simd, storev_mixed_nan) {
    check_mixed_nan(&F16);
    check_mixed_nan(&BF16);
}

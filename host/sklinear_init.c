/* Panther's SKLinear initialisation on host memory, shared by every backend (the CUDA front end
 * stages through host buffers), so a layer created from C, Rust or Python with the same seed is
 * the same layer everywhere.
 *
 * Every draw is a pure function of (seed, stream, element index) through the counter generator
 * of common/counter_rng.h: independent of thread count and backend. Streams: U1s, U2s, W, bias.
 * As in Panther: U1s[i] is a scaled sign sketch [k, out] and U2s[i] the transpose of one
 * [k, in], entries +-1/sqrt(k); W [in, out] is W_init^T or Kaiming-uniform with a = sqrt(5)
 * (torch's fan_in of an [in, out] tensor is out, so the bound is 1/sqrt(out)); S1s[i] = W U1s[i]^T,
 * S2s[i] = U2s[i]^T W; bias ~ U(-1/sqrt(out), 1/sqrt(out)). W is never materialised: it is
 * generated (or gathered from W_init) in blocks of rows, and the products are GEMMs over those
 * blocks in a fixed order, in the caller's thread (so the bits are the same on every backend).
 * A float64 plan takes the same draws (uniforms of 24 bits) and computes in float64. */
#include "host.h"
#include "lowp.h"

#include "blas.h"
#include "counter_rng.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define KF__SKL_INIT_ROWS 256 /* rows of W per block */

enum { KF__SKL_RNG_U1 = 1, KF__SKL_RNG_U2 = 2, KF__SKL_RNG_W = 3, KF__SKL_RNG_BIAS = 4 };

static uint64_t kf__skl_counter(uint64_t stream, uint64_t index) { return (stream << 56) ^ index; }

/* Uniform in [-bound, bound). */
static double kf__skl_uniform(uint64_t seed, uint64_t stream, uint64_t index, double bound) {
    return (2.0 * (double)kf__uniform(seed, kf__skl_counter(stream, index)) - 1.0) * bound;
}

static bool kf__skl_negative(uint64_t seed, uint64_t stream, uint64_t index) {
    return kf__uniform(seed, kf__skl_counter(stream, index)) < 0.5f;
}

/* Element (a, j) of S1 and U2 read as [in, r] (j = i*k + c) sits at (i*in + a)*k + c. */
#define KF__SKL_IK(a, j) (((j) / k * in + (a)) * k + (j) % k)

/* kf__skl_init_<X>: the algorithm for element type T (X the BLAS prefix, s or d). */
#define KF__SKL_INIT_DEFINE(T, X)                                                                 \
    static kf_status kf__skl_init_##X(const struct kf_sklinear_plan *p, const char *fn,          \
                                      uint64_t seed, const T *W_init, T *S1, T *S2, T *U1,       \
                                      T *U2, T *bias) {                                          \
        const int64_t in = p->in, out = p->out, k = p->k, r = p->r;                              \
        const T scale = (T)1 / (T)sqrt((T)k), bound = (T)1 / (T)sqrt((T)out);            \
        /* A block of W's rows, and that block's rows of S1 and of U2 as [rows, r] matrices. */  \
        T *wb = malloc((size_t)(KF__SKL_INIT_ROWS * out) * sizeof *wb);                          \
        T *s1b = malloc((size_t)(KF__SKL_INIT_ROWS * r) * sizeof *s1b);                          \
        T *u2b = malloc((size_t)(KF__SKL_INIT_ROWS * r) * sizeof *u2b);                          \
        if (!wb || !s1b || !u2b) {                                                               \
            free(wb), free(s1b), free(u2b);                                                      \
            return kf__error(KF_ERR_OUT_OF_MEMORY, fn, "cannot allocate %zu bytes of host "      \
                             "scratch", (size_t)(KF__SKL_INIT_ROWS * (out + 2 * r)) * sizeof(T)); \
        }                                                                                        \
        for (int64_t e = 0; e < r * out; ++e)                                                    \
            U1[e] = kf__skl_negative(seed, KF__SKL_RNG_U1, (uint64_t)e) ? -scale : scale;        \
        for (int64_t e = 0; e < r * in; ++e)                                                     \
            U2[e] = kf__skl_negative(seed, KF__SKL_RNG_U2, (uint64_t)e) ? -scale : scale;        \
        if (bias)                                                                                \
            for (int64_t o = 0; o < out; ++o)                                                    \
                bias[o] = (T)kf__skl_uniform(seed, KF__SKL_RNG_BIAS, (uint64_t)o, bound);        \
        for (int64_t a0 = 0; a0 < in; a0 += KF__SKL_INIT_ROWS) {                                 \
            const int64_t rows = in - a0 < KF__SKL_INIT_ROWS ? in - a0 : KF__SKL_INIT_ROWS;      \
            for (int64_t a = 0; a < rows; ++a)                                                   \
                for (int64_t o = 0; o < out; ++o)                                                \
                    wb[a * out + o] =                                                            \
                        W_init ? W_init[o * in + a0 + a]                                         \
                               : (T)kf__skl_uniform(seed, KF__SKL_RNG_W,                         \
                                                    (uint64_t)((a0 + a) * out + o), bound);      \
            /* S1 rows = W rows U1^T; S2 += (U2 rows)^T W rows, blocks in a fixed order. */      \
            kf__##X##gemm(false, true, rows, r, out, 1, wb, out, U1, out, 0, s1b, r);            \
            for (int64_t a = 0; a < rows; ++a)                                                   \
                for (int64_t j = 0; j < r; ++j) {                                                \
                    S1[KF__SKL_IK(a0 + a, j)] = s1b[a * r + j];                                  \
                    u2b[a * r + j] = U2[KF__SKL_IK(a0 + a, j)];                                  \
                }                                                                                \
            kf__##X##gemm(true, false, r, out, rows, 1, u2b, r, wb, out, a0 ? 1 : 0, S2, out);   \
        }                                                                                        \
        free(wb), free(s1b), free(u2b);                                                          \
        return KF_OK;                                                                            \
    }

KF__SKL_INIT_DEFINE(float, s)
KF__SKL_INIT_DEFINE(double, d)
#undef KF__SKL_IK

/* A bfloat16 or float16 plan: the float32 algorithm on float32 copies (W_init widened exactly),
 * each result rounded to the plan's type, as Panther's float32 layer gives them after
 * module.to(dtype). */
static kf_status kf__skl_init_lowp(const struct kf_sklinear_plan *p, const char *fn,
                                   uint64_t seed, const void *W_init, void *S1, void *S2,
                                   void *U1, void *U2, void *bias) {
    const int64_t ik = p->in * p->r, ko = p->r * p->out, w = W_init ? p->in * p->out : 0;
    const int64_t nb = bias ? p->out : 0, n = 2 * ik + 2 * ko + nb + w;
    float *f = malloc((size_t)n * sizeof *f);
    if (!f)
        return kf__error(KF_ERR_OUT_OF_MEMORY, fn, "cannot allocate %zu bytes of host scratch",
                         (size_t)n * sizeof *f);
    float *fS1 = f, *fU2 = f + ik, *fS2 = f + 2 * ik, *fU1 = fS2 + ko, *fb = fU1 + ko;
    float *fW = fb + nb;
    for (int64_t e = 0; e < w; ++e) fW[e] = (float)kf__elem_load(W_init, p->dtype, e);
    const kf_status st = kf__skl_init_s(p, fn, seed, W_init ? fW : NULL, fS1, fS2, fU1, fU2,
                                        bias ? fb : NULL);
    if (st == KF_OK) {
        void *const dst[5] = {S1, U2, S2, U1, bias};
        const float *const src[5] = {fS1, fU2, fS2, fU1, fb};
        const int64_t len[5] = {ik, ik, ko, ko, nb};
        for (int t = 0; t < 5; ++t)
            for (int64_t e = 0; e < len[t]; ++e) kf__elem_store(dst[t], p->dtype, e, src[t][e]);
    }
    free(f);
    return st;
}

kf_status kf__skl_init_host(const struct kf_sklinear_plan *p, const char *fn, uint64_t seed,
                            const void *W_init, void *S1, void *S2, void *U1, void *U2,
                            void *bias) {
    if (kf__dtype_is_lowp(p->dtype))
        return kf__skl_init_lowp(p, fn, seed, W_init, S1, S2, U1, U2, bias);
    return p->dtype == KF_DTYPE_F64 ? kf__skl_init_d(p, fn, seed, W_init, S1, S2, U1, U2, bias)
                                    : kf__skl_init_s(p, fn, seed, W_init, S1, S2, U1, U2, bias);
}

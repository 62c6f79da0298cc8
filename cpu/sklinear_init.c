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
 * generated (or read) one row at a time, and the products accumulate in double. */
#include "sklinear_internal.h"

#include "counter_rng.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { KF__SKL_RNG_U1 = 1, KF__SKL_RNG_U2 = 2, KF__SKL_RNG_W = 3, KF__SKL_RNG_BIAS = 4 };

static uint64_t kf__skl_counter(uint64_t stream, uint64_t index) { return (stream << 56) ^ index; }

/* Uniform in [-bound, bound). */
static float kf__skl_uniform(uint64_t seed, uint64_t stream, uint64_t index, float bound) {
    return (2.0f * kf__uniform(seed, kf__skl_counter(stream, index)) - 1.0f) * bound;
}

static float kf__skl_sign(uint64_t seed, uint64_t stream, uint64_t index, float scale) {
    return kf__uniform(seed, kf__skl_counter(stream, index)) < 0.5f ? -scale : scale;
}

kf_status kf__skl_init_host(const struct kf_sklinear_plan *p, const char *fn, uint64_t seed,
                            const float *W_init, float *S1, float *S2, float *U1, float *U2,
                            float *bias) {
    const int64_t in = p->in, out = p->out, k = p->k, r = p->r;
    const float scale = 1.0f / sqrtf((float)k), bound = 1.0f / sqrtf((float)out);
    double *acc = calloc((size_t)(r * out), sizeof *acc); /* S2's sums over the rows of W */
    float *row = malloc((size_t)out * sizeof *row);       /* one row of W */
    if (!acc || !row) {
        free(acc);
        free(row);
        return kf__error(KF_ERR_OUT_OF_MEMORY, fn, "cannot allocate %zu bytes of host scratch",
                         (size_t)(r * out) * sizeof *acc + (size_t)out * sizeof *row);
    }
    for (int64_t e = 0; e < r * out; ++e) U1[e] = kf__skl_sign(seed, KF__SKL_RNG_U1, (uint64_t)e, scale);
    for (int64_t e = 0; e < r * in; ++e) U2[e] = kf__skl_sign(seed, KF__SKL_RNG_U2, (uint64_t)e, scale);
    if (bias)
        for (int64_t o = 0; o < out; ++o)
            bias[o] = kf__skl_uniform(seed, KF__SKL_RNG_BIAS, (uint64_t)o, bound);
    for (int64_t a = 0; a < in; ++a) {
        for (int64_t o = 0; o < out; ++o)
            row[o] = W_init ? W_init[o * in + a]
                            : kf__skl_uniform(seed, KF__SKL_RNG_W, (uint64_t)(a * out + o), bound);
        for (int64_t j = 0; j < r; ++j) { /* j = i * k + c */
            const float *u1 = U1 + j * out;
            const double u2 = U2[(j / k * in + a) * k + j % k];
            double *s2 = acc + j * out, s1 = 0.0;
            for (int64_t o = 0; o < out; ++o) {
                s1 += (double)row[o] * u1[o];
                s2[o] += u2 * row[o];
            }
            S1[(j / k * in + a) * k + j % k] = (float)s1;
        }
    }
    for (int64_t e = 0; e < r * out; ++e) S2[e] = (float)acc[e];
    free(acc);
    free(row);
    return KF_OK;
}

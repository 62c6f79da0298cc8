/* The activations of SKLinear's fused epilogue (kf_activation in kfuse.h) and their derivatives,
 * with the dropout that follows them: one definition for the CPU and CUDA backends (host and
 * device), so that both store the same values. Suffix _s computes in float, _d in double; the
 * bfloat16 and float16 plans compute in float.
 *
 *   relu(x)      = max(x, 0)                        relu'(x)      = [x > 0]
 *   gelu(x)      = x Phi(x) = x (1 + erf(x/sqrt2))/2 gelu'(x)      = Phi(x) + x phi(x)
 *   gelu_tanh(x) = x (1 + tanh(u)) / 2,  u = c (x + 0.044715 x^3), c = sqrt(2/pi)
 *                  gelu_tanh'(x) = (1 + t) / 2 + x (1 - t^2) c (1 + 3 0.044715 x^2) / 2,
 *                  t = tanh(u)
 *   silu(x)      = x sigma(x)                       silu'(x)      = sigma(x) (1 + x (1 - sigma(x)))
 *
 * Dropout after the activation (kf__epi_X): an element kept by common/counter_rng.h's
 * kf__dropout_keep(seed, counter, p) is scaled by 1 / (1 - p), any other is 0; p = 0 keeps all. */
#ifndef KF_ACTIVATION_H
#define KF_ACTIVATION_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "counter_rng.h"

/* kfuse.h's kf_activation, for code that does not include kfuse.h (CUDA kernels do). */
enum { KF__ACT_NONE = 0, KF__ACT_RELU = 1, KF__ACT_GELU = 2, KF__ACT_GELU_TANH = 3,
       KF__ACT_SILU = 4 };

/* float arithmetic without libm calls, branch-free, so that the CPU's loops over a vector's lanes
 * vectorise (glibc's erff and tanhf cost 25-40 ns an element, 5-7x torch's vectorised GELU):
 *  kf__exp_s  Cody-Waite reduction by ln 2 and Cephes's degree-6 polynomial (1-2 ulp) for
 *             |x| < 87; beyond, 0 or infinity (no subnormals: the activations below only need
 *             e^x to saturate; |x| beyond 2^31 ln 2 is out of its domain);
 *  kf__phi_s  the normal CDF, Phi(x) = erfc(-x / sqrt 2) / 2, by Numerical Recipes' erfc
 *             (Chebyshev fit, fractional error < 1.2e-7 for z >= 0; erfc(-z) = 2 - erfc(z)).
 * The double versions are libm's (float64 plans favour accuracy). */
KF_HOST_DEVICE float kf__exp_s(float x) {
    /* n = round(x / ln 2) by the 1.5 * 2^23 trick (floorf does not vectorise) */
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    /* 2^n with the exponent clamped in the integers (a float clamp lets GCC fold a constant
     * result into a branch, which stops the vectoriser): n <= -127 gives 0, n >= 128 infinity */
    int32_t e = (int32_t)n + 127;
    e = e < 0 ? 0 : e;
    e = e > 255 ? 255 : e;
    const uint32_t bits = (uint32_t)e << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return (p * r * r + r + 1.0f) * scale;
}

KF_HOST_DEVICE float kf__phi_s(float x) {
    const float z = x * -0.70710678118654752f, a = fabsf(z);
    const float t = 1.0f / (1.0f + 0.5f * a);
    const float q = -1.26551223f + t * (1.00002368f + t * (0.37409196f + t * (0.09678418f +
                    t * (-0.18628806f + t * (0.27886807f + t * (-1.13520398f + t * (1.48851587f +
                    t * (-0.82215223f + t * 0.17087277f))))))));
    const float h = 0.5f * t * kf__exp_s(q - a * a); /* erfc(a) / 2 */
    const float sg = copysignf(1.0f, z);              /* erfc(z) = 2 - erfc(a) for z < 0 */
    return 0.5f * (1.0f - sg) + sg * h;
}

KF_HOST_DEVICE double kf__exp_d(double x) { return exp(x); }
KF_HOST_DEVICE double kf__phi_d(double x) { return 0.5 * erfc(x * -0.70710678118654752); }

/* The activations and their derivatives per arithmetic type T (suffix X), from exp and Phi.
 * GELU's tanh form as a sigmoid: (1 + tanh(u)) / 2 = sigma(2u). */
#define KF__ACT_DEFINE(T, X)                                                                       \
    KF_HOST_DEVICE T kf__sigmoid_##X(T v) { return (T)1 / ((T)1 + kf__exp_##X(-v)); }              \
    KF_HOST_DEVICE T kf__relu_##X(T v) { return v > (T)0 ? v : (T)0; }                             \
    KF_HOST_DEVICE T kf__gelu_##X(T v) { return v * kf__phi_##X(v); }                              \
    KF_HOST_DEVICE T kf__gelu_tanh_##X(T v) {                                                      \
        return v * kf__sigmoid_##X((T)1.5957691216057308 * (v + (T)0.044715 * v * v * v));         \
    }                                                                                              \
    KF_HOST_DEVICE T kf__silu_##X(T v) { return v * kf__sigmoid_##X(v); }                          \
    KF_HOST_DEVICE T kf__act_##X(int32_t act, T v) {                                               \
        switch (act) {                                                                             \
        case KF__ACT_RELU: return kf__relu_##X(v);                                                 \
        case KF__ACT_GELU: return kf__gelu_##X(v);                                                 \
        case KF__ACT_GELU_TANH: return kf__gelu_tanh_##X(v);                                       \
        case KF__ACT_SILU: return kf__silu_##X(v);                                                 \
        default: return v;                                                                         \
        }                                                                                          \
    }                                                                                              \
    KF_HOST_DEVICE T kf__act_grad_##X(int32_t act, T v) {                                          \
        switch (act) {                                                                             \
        case KF__ACT_RELU: return v > (T)0 ? (T)1 : (T)0;                                          \
        case KF__ACT_GELU: /* Phi(v) + v phi(v) */                                                 \
            return kf__phi_##X(v) + v * (T)0.3989422804014327 * kf__exp_##X((T)-0.5 * v * v);      \
        case KF__ACT_GELU_TANH: { /* s + 2 v s (1 - s) c (1 + 3 0.044715 v^2), s = sigma(2u) */    \
            const T s = kf__sigmoid_##X((T)1.5957691216057308 * (v + (T)0.044715 * v * v * v));   \
            return s + (T)1.5957691216057308 * v * s * ((T)1 - s) * ((T)1 + (T)0.134145 * v * v);  \
        }                                                                                          \
        case KF__ACT_SILU: {                                                                       \
            const T s = kf__sigmoid_##X(v);                                                        \
            return s * ((T)1 + v * ((T)1 - s));                                                    \
        }                                                                                          \
        default: return (T)1;                                                                      \
        }                                                                                          \
    }

/* The dropout after the activation, and the gradient through both. kf__drop_X multiplies by
 * the mask's 0 or 1 / (1 - p) (a product, not a select: the CPU's loops over lanes vectorise);
 * its callers skip it where p = 0. */
#define KF__EPI_DEFINE(T, X)                                                                       \
    KF_HOST_DEVICE T kf__drop_##X(float p, T scale, uint64_t seed, uint64_t ctr, T v) {            \
        return v * (kf__dropout_keep(seed, ctr, p) ? scale : (T)0);                                \
    }                                                                                              \
    /* The stored value of pre-activation v at dropout counter `ctr` (p = 0: no dropout). */       \
    KF_HOST_DEVICE T kf__epi_##X(int32_t act, float p, T scale, uint64_t seed, uint64_t ctr,       \
                                 T v) {                                                            \
        v = kf__act_##X(act, v);                                                                   \
        return p > 0.0f ? kf__drop_##X(p, scale, seed, ctr, v) : v;                                \
    }                                                                                              \
    /* The gradient of v's pre-activation from the stored value's gradient g. */                   \
    KF_HOST_DEVICE T kf__epi_grad_##X(int32_t act, float p, T scale, uint64_t seed, uint64_t ctr,  \
                                      T v, T g) {                                                  \
        if (p > 0.0f) g = kf__drop_##X(p, scale, seed, ctr, g);                                    \
        return act == KF__ACT_NONE ? g : g * kf__act_grad_##X(act, v);                             \
    }

/* 1 / (1 - p), the scale of a kept element, as every backend computes it. */
KF_HOST_DEVICE float kf__dropout_scale_s(float p) { return 1.0f / (1.0f - p); }
KF_HOST_DEVICE double kf__dropout_scale_d(float p) { return 1.0 / (1.0 - (double)p); }

KF__ACT_DEFINE(float, s)
KF__ACT_DEFINE(double, d)
KF__EPI_DEFINE(float, s)
KF__EPI_DEFINE(double, d)

#endif /* KF_ACTIVATION_H */

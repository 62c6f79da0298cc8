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

/* 1 / (1 - p), the scale of a kept element, as every backend computes it. */
KF_HOST_DEVICE float kf__dropout_scale_s(float p) { return 1.0f / (1.0f - p); }
KF_HOST_DEVICE double kf__dropout_scale_d(float p) { return 1.0 / (1.0 - (double)p); }

/* The activations and their derivatives, the dropout and the gradient through both, once per
 * arithmetic type (kf__relu_s, kf__act_grad_d, kf__epi_s, ...). */
#define T float
#define ACT_X(name) name##_s
#include "activation_typed.h"
#undef T
#undef ACT_X
#define T double
#define ACT_X(name) name##_d
#include "activation_typed.h"
#undef T
#undef ACT_X

#endif /* KF_ACTIVATION_H */

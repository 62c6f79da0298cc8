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

#include "counter_rng.h"

/* kfuse.h's kf_activation, for code that does not include kfuse.h (CUDA kernels do). */
enum { KF__ACT_NONE = 0, KF__ACT_RELU = 1, KF__ACT_GELU = 2, KF__ACT_GELU_TANH = 3,
       KF__ACT_SILU = 4 };

/* One activation and its derivative per arithmetic type: T, its suffix X, its math functions. */
#define KF__ACT_DEFINE(T, X, ERF, EXP, TANH)                                                       \
    KF_HOST_DEVICE T kf__act_##X(int32_t act, T v) {                                               \
        const T c = (T)0.7978845608028654; /* sqrt(2/pi) */                                        \
        switch (act) {                                                                             \
        case KF__ACT_RELU: return v > (T)0 ? v : (T)0;                                             \
        case KF__ACT_GELU: return (T)0.5 * v * ((T)1 + ERF(v * (T)0.7071067811865476));            \
        case KF__ACT_GELU_TANH:                                                                    \
            return (T)0.5 * v * ((T)1 + TANH(c * (v + (T)0.044715 * v * v * v)));                 \
        case KF__ACT_SILU: return v / ((T)1 + EXP(-v));                                            \
        default: return v;                                                                         \
        }                                                                                          \
    }                                                                                              \
    KF_HOST_DEVICE T kf__act_grad_##X(int32_t act, T v) {                                          \
        const T c = (T)0.7978845608028654;                                                         \
        switch (act) {                                                                             \
        case KF__ACT_RELU: return v > (T)0 ? (T)1 : (T)0;                                          \
        case KF__ACT_GELU:                                                                         \
            return (T)0.5 * ((T)1 + ERF(v * (T)0.7071067811865476)) +                              \
                   v * (T)0.3989422804014327 * EXP((T)-0.5 * v * v); /* 1/sqrt(2 pi) */            \
        case KF__ACT_GELU_TANH: {                                                                  \
            const T t = TANH(c * (v + (T)0.044715 * v * v * v));                                   \
            return (T)0.5 * ((T)1 + t) +                                                           \
                   (T)0.5 * v * ((T)1 - t * t) * c * ((T)1 + (T)0.134145 * v * v);                 \
        }                                                                                          \
        case KF__ACT_SILU: {                                                                       \
            const T sg = (T)1 / ((T)1 + EXP(-v));                                                  \
            return sg * ((T)1 + v * ((T)1 - sg));                                                  \
        }                                                                                          \
        default: return (T)1;                                                                      \
        }                                                                                          \
    }                                                                                              \
    /* The stored value of pre-activation v at dropout counter `ctr`. */                           \
    KF_HOST_DEVICE T kf__epi_##X(int32_t act, float p, T scale, uint64_t seed, uint64_t ctr,       \
                                 T v) {                                                            \
        v = kf__act_##X(act, v);                                                                   \
        return p > 0.0f ? (kf__dropout_keep(seed, ctr, p) ? v * scale : (T)0) : v;                \
    }                                                                                              \
    /* The gradient of v's pre-activation from the stored value's gradient g. */                   \
    KF_HOST_DEVICE T kf__epi_grad_##X(int32_t act, float p, T scale, uint64_t seed, uint64_t ctr,  \
                                      T v, T g) {                                                  \
        if (p > 0.0f) g = kf__dropout_keep(seed, ctr, p) ? g * scale : (T)0;                       \
        return act == KF__ACT_NONE ? g : g * kf__act_grad_##X(act, v);                             \
    }

/* 1 / (1 - p), the scale of a kept element, as every backend computes it. */
KF_HOST_DEVICE float kf__dropout_scale_s(float p) { return 1.0f / (1.0f - p); }
KF_HOST_DEVICE double kf__dropout_scale_d(float p) { return 1.0 / (1.0 - (double)p); }

KF__ACT_DEFINE(float, s, erff, expf, tanhf)
KF__ACT_DEFINE(double, d, erf, exp, tanh)

#endif /* KF_ACTIVATION_H */

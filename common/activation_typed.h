/* common/activation.h's activations, their derivatives and the dropout after them, for the
 * arithmetic type T of the inclusion (common/activation.h includes this once per type, with T
 * and ACT_X(name) = name_s (float) or name_d (double) defined; no include guard). */

/* The activations and their derivatives, from exp and Phi. GELU's tanh form as a sigmoid:
 * (1 + tanh(u)) / 2 = sigma(2u). */
KF_HOST_DEVICE T ACT_X(kf__sigmoid)(T v) { return (T)1 / ((T)1 + ACT_X(kf__exp)(-v)); }
KF_HOST_DEVICE T ACT_X(kf__relu)(T v) { return v > (T)0 ? v : (T)0; }
KF_HOST_DEVICE T ACT_X(kf__gelu)(T v) { return v * ACT_X(kf__phi)(v); }
KF_HOST_DEVICE T ACT_X(kf__gelu_tanh)(T v) {
    return v * ACT_X(kf__sigmoid)((T)1.5957691216057308 * (v + (T)0.044715 * v * v * v));
}
KF_HOST_DEVICE T ACT_X(kf__silu)(T v) { return v * ACT_X(kf__sigmoid)(v); }
KF_HOST_DEVICE T ACT_X(kf__act)(int32_t act, T v) {
    switch (act) {
    case KF__ACT_RELU: return ACT_X(kf__relu)(v);
    case KF__ACT_GELU: return ACT_X(kf__gelu)(v);
    case KF__ACT_GELU_TANH: return ACT_X(kf__gelu_tanh)(v);
    case KF__ACT_SILU: return ACT_X(kf__silu)(v);
    default: return v;
    }
}
KF_HOST_DEVICE T ACT_X(kf__act_grad)(int32_t act, T v) {
    switch (act) {
    case KF__ACT_RELU: return v > (T)0 ? (T)1 : (T)0;
    case KF__ACT_GELU: /* Phi(v) + v phi(v) */
        return ACT_X(kf__phi)(v) + v * (T)0.3989422804014327 * ACT_X(kf__exp)((T)-0.5 * v * v);
    case KF__ACT_GELU_TANH: { /* s + 2 v s (1 - s) c (1 + 3 0.044715 v^2), s = sigma(2u) */
        const T s = ACT_X(kf__sigmoid)((T)1.5957691216057308 * (v + (T)0.044715 * v * v * v));
        return s + (T)1.5957691216057308 * v * s * ((T)1 - s) * ((T)1 + (T)0.134145 * v * v);
    }
    case KF__ACT_SILU: {
        const T s = ACT_X(kf__sigmoid)(v);
        return s * ((T)1 + v * ((T)1 - s));
    }
    default: return (T)1;
    }
}

/* The dropout after the activation, and the gradient through both. kf__drop_X multiplies by
 * the mask's 0 or 1 / (1 - p) (a product, not a select: the CPU's loops over lanes vectorise);
 * its callers skip it where p = 0. */
KF_HOST_DEVICE T ACT_X(kf__drop)(float p, T scale, uint64_t seed, uint64_t ctr, T v) {
    return v * (kf__dropout_keep(seed, ctr, p) ? scale : (T)0);
}
/* The stored value of pre-activation v at dropout counter `ctr` (p = 0: no dropout). */
KF_HOST_DEVICE T ACT_X(kf__epi)(int32_t act, float p, T scale, uint64_t seed, uint64_t ctr, T v) {
    v = ACT_X(kf__act)(act, v);
    return p > 0.0f ? ACT_X(kf__drop)(p, scale, seed, ctr, v) : v;
}
/* The gradient of v's pre-activation from the stored value's gradient g. */
KF_HOST_DEVICE T ACT_X(kf__epi_grad)(int32_t act, float p, T scale, uint64_t seed,
                                     uint64_t ctr, T v, T g) {
    if (p > 0.0f) g = ACT_X(kf__drop)(p, scale, seed, ctr, g);
    return act == KF__ACT_NONE ? g : g * ACT_X(kf__act_grad)(act, v);
}

/* The sketched linear layer's backend contract: the plan, the validated call records the front
 * end (capi/src/sklinear.c) hands to a backend (cpu/sklinear.c, cuda/sklinear.cu), and the op
 * table. Backends trust these records: every pointer and extent has been checked and the
 * workspace is large enough.
 *
 * Notation (kfuse.h): N rows, in, out, L terms of rank k, r = L*k. Tensors are row-major:
 * x [N, in], y and dy [N, out], S1s and U2s [L, in, k], S2s and U1s [L, k, out], bias [out].
 * The bottleneck Z [N, 2r] has column j < r = term j/k, column c = j%k of x S1s, and column
 * r + j the same of x U2s; y = (Z[:, :r] U1 + Z[:, r:] S2) / (2L) + bias where U1 and S2 are
 * U1s and S2s read as [r, out] matrices (their natural layout).
 *
 * Every tensor of a call has the plan's dtype (KF_DTYPE_F32, F64, BF16 or F16, as the backend's
 * select() accepts): the records carry untyped pointers that the backend reads as that
 * type. */
#ifndef KF_CORE_SKLINEAR_BACKEND_H
#define KF_CORE_SKLINEAR_BACKEND_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

struct kf__skl_ops;

struct kf_sklinear_plan {
    kf_context *ctx;
    const struct kf__skl_ops *ops; /* the concrete table its backend's select() gave at creation */
    int64_t in, out;
    int32_t L, k;
    int64_t r;      /* L * k */
    bool has_bias;
    kf_dtype dtype; /* of every parameter, input and output */
    int32_t act;    /* kf_activation of the fused epilogue (common/activation.h) */
    float dropout;  /* its dropout probability, in [0, 1) */
};

/* A call's epilogue (kfuse.h, SKLinear's fused epilogue): y = dropout(act(pre)) with the plan's
 * activation; p = 0 where no dropout applies (none in the plan, or not a training call). The
 * element (n, o) of y draws its mask at counter offset + n * out + o (common/activation.h). */
typedef struct kf__skl_epi {
    float p;
    uint64_t seed, offset;
} kf__skl_epi;

typedef struct kf__skl_fwd {
    const struct kf_sklinear_plan *plan;
    int64_t N;
    const void *x, *S1, *S2, *U1, *U2;
    const void *bias;         /* NULL: the plan has none */
    void *y;
    void *pre;                /* NULL, or [N, out]: the pre-activation, written */
    kf__skl_epi epi;
    void *ws; size_t ws_bytes;
} kf__skl_fwd;

typedef struct kf__skl_bwd {
    const struct kf_sklinear_plan *plan;
    int64_t N;
    const void *x, *S1, *S2, *U1, *U2;
    const void *dy;
    const void *pre;            /* [N, out]: the forward's pre-activation (for RELU its y may
                                   stand in); NULL exactly when the plan has no activation */
    kf__skl_epi epi;            /* the forward's; the gradient through it comes first */
    void *dx, *dS1, *dS2, *db;  /* each NULL = not wanted */
    bool accumulate;            /* add into dS1, dS2, db instead of overwriting (dx: always
                                   overwritten) */
    void *ws; size_t ws_bytes;
} kf__skl_bwd;

/* The op tables (rules in core/backend.h). A backend's entry table (kf__backend.skl) has only
 * select(): asked once, at plan creation, with the plan's fields filled, it sets *ops to the
 * concrete table for the plan's device, instruction set and dtype (whose select is NULL), or
 * returns KF_ERR_UNSUPPORTED naming the desc field it cannot serve. The plan keeps that table,
 * and no call branches on any of these again. */
typedef struct kf__skl_ops {
    kf_status (*select)(const struct kf_sklinear_plan *p, const char *fn,
                        const struct kf__skl_ops **ops);
    size_t (*workspace)(const struct kf_sklinear_plan *p, int64_t N);
    kf_status (*forward)(kf_context *ctx, const kf__skl_fwd *c);
    kf_status (*backward)(kf_context *ctx, const kf__skl_bwd *c);
} kf__skl_ops;

#ifdef __cplusplus
}
#endif

#endif /* KF_CORE_SKLINEAR_BACKEND_H */

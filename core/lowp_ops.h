/* Low-precision storage (bfloat16, float16) for the recurrent layers as one layer over a
 * backend's float32 op table, shared by every backend (core/lowp_ops.c; rounding: core/lowp.h;
 * docs/precision.md).
 *
 * A plan of dtype KF_DTYPE_BF16 or KF_DTYPE_F16 stores every tensor of a call in that type and
 * computes in float32 (products, reductions, gate math, the recurrent state), exactly as the
 * float32 kernels do, because it runs them: each wrapped entry
 *   1. converts the call's low-precision inputs (x, h0, weights, dy, ...) into float32 buffers
 *      carved from the call's workspace, after the float32 op's own workspace;
 *   2. calls the backend's float32 op on a copy of the plan with dtype KF_DTYPE_F32 and a record
 *      that points at those buffers (the reserve is the float32 op's, same size);
 *   3. rounds the float32 outputs into the caller's tensors (to nearest, ties to even, NaN stays
 *      NaN). Accumulated gradients are dst = round(f32(dst) + g): the float32 op overwrites its
 *      buffer and the sum is formed in the conversion, in float32, once.
 * So the workspace-size query answers the float32 op's workspace plus these buffers (the larger
 * of forward's and backward's set for a training size query), and a call never allocates. A plan
 * of any other dtype never reaches this table.
 *
 * A backend takes part by giving kf__lowp_rnn_ops below, from its recurrent select(), to the low
 * plans it runs this way (asking itself about their float32 copies first), and pointing
 * kf__backend.lowp at its float32 table and its conversion routine, which runs a batch of
 * conversions in order on the context's stream (CUDA: one kernel, cuda/lowp.cu). CUDA's select
 * does so for the low plans whose H the persistent kernels take (cuda/rnn_fwd.cu). Every other op and
 * backend reads and writes the low types in its own kernels (the CPU's since 1.7.4: cpu/rnn_*.c,
 * cpu/sklinear.c, cpu/kan_linear.c; cuda/plain.cu on the tensor cores). */
#ifndef KF_CORE_LOWP_OPS_H
#define KF_CORE_LOWP_OPS_H

#include "backend.h"
#include "rnn_backend.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One conversion: `n` elements between low-precision `low` and float32 `f`; to float32 (load),
 * or back (store), or back as low = round(f32(low) + f) (accumulate). */
typedef enum { KF__LP_LOAD, KF__LP_STORE, KF__LP_ACC } kf__lp_dir;

typedef struct kf__lp_cvt {
    uint16_t *low;
    float *f;
    int64_t n;
    bool bf16;
    kf__lp_dir dir;
} kf__lp_cvt;

/* Conversions gathered per pass, so that one team (one kernel) runs all of a pass's tensors: a
 * team per tensor cost a wake-up each (30-60 us on the 2-core box: SKLinear 8192^2 B=64 bfloat16
 * forward took 1.8x its float32 time on two threads with six of them). */
#define KF__LP_BATCH 32

typedef struct kf__lp_batch {
    kf__lp_cvt c[KF__LP_BATCH];
    int n;
    int64_t elems; /* all of the batch's elements */
} kf__lp_batch;

/* What a backend gives the layer: its float32 (and float64) recurrent op table and its
 * conversion routine (KF_OK, or a status with the message set under `fn`). */
typedef struct kf__lowp_base {
    const struct kf__rnn_ops *rnn;
    kf_status (*convert)(kf_context *ctx, const char *fn, const kf__lp_batch *b);
} kf__lowp_base;

/* The wrapped table, for every backend with kf__backend.lowp set. */
extern const struct kf__rnn_ops kf__lowp_rnn_ops;

#ifdef __cplusplus
}
#endif

#endif /* KF_CORE_LOWP_OPS_H */

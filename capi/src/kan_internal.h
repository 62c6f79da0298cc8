/* The KAN linear layer's plan and the validated call records the front end
 * (capi/src/kan_linear.c) hands to a backend (cpu/kan_linear.c). Backends trust these records:
 * every pointer and extent has been checked, the grid rows are finite and non-decreasing (CPU
 * contexts), and the workspace is large enough.
 *
 * Notation (kfuse.h, docs/ops/kan.md): N rows, in, out, G grid intervals, k spline order,
 * C = G + k bases per feature, nk = G + 2k + 1 knots per feature, cw = C + 1 columns per feature
 * in the combined operand, K = in * cw. Tensors are row-major: x [N, in], y and dy [N, out],
 * grid [in, nk], base_weight and spline_scaler [out, in], spline_weight [out, in, C].
 * The combined operand of a row holds, per feature i, the cw columns
 *     [ SiLU(x_i) | B_0(x_i) .. B_{C-1}(x_i) ]       (columns i*cw .. i*cw + C)
 * and the combined weight W [out, K] the matching [ base_weight[o, i] | spline_weight[o, i, :] *
 * spline_scaler[o, i] ], so that y = A W^T is one product over K. */
#ifndef KF_KAN_INTERNAL_H
#define KF_KAN_INTERNAL_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

struct kf_kan_linear_plan {
    kf_context *ctx;
    int64_t in, out;
    int32_t G, k;
    int64_t C;   /* G + k */
    int64_t nk;  /* G + 2k + 1 */
    int64_t cw;  /* C + 1 */
    int64_t K;   /* in * cw */
    bool scaled; /* standalone_scale: spline_scaler multiplies spline_weight */
};

typedef struct kf__kan_fwd {
    const struct kf_kan_linear_plan *plan;
    int64_t N;
    const float *x, *grid, *base, *spline;
    const float *scaler; /* NULL: the plan has none (standalone_scale = 0) */
    float *y;
    void *ws; size_t ws_bytes;
} kf__kan_fwd;

typedef struct kf__kan_bwd {
    const struct kf_kan_linear_plan *plan;
    int64_t N;
    const float *x, *grid, *base, *spline;
    const float *scaler;                /* NULL: the plan has none */
    const float *dy;
    float *dx, *dbase, *dspline, *dscaler; /* each NULL = not wanted (dscaler: always NULL when
                                              the plan has no scaler) */
    bool accumulate;                    /* add into the parameter gradients instead of
                                           overwriting (dx: always overwritten) */
    void *ws; size_t ws_bytes;
} kf__kan_bwd;

/* Backend entry points. *_workspace is pure (one size covers forward and backward); forward and
 * backward return KF_OK or set the message. */
size_t kf__cpu_kan_workspace(const struct kf_kan_linear_plan *p, int64_t N);
kf_status kf__cpu_kan_forward(kf_context *ctx, const kf__kan_fwd *c);
kf_status kf__cpu_kan_backward(kf_context *ctx, const kf__kan_bwd *c);

/* efficient-kan's initial knots on host memory, shared by every backend (the CUDA front end
 * stages through a host buffer): grid [in, nk], every row lo + (j - k) * (hi - lo) / G, rounded
 * as torch forms it in float32 (arange * h + lo with h = (hi - lo) / G taken in double). */
void kf__kan_uniform_grid_host(const struct kf_kan_linear_plan *p, float lo, float hi,
                               float *grid);

#ifdef KF_HAVE_CUDA
/* cuda/kan_linear.cu. The grid is not checked for monotonicity on CUDA contexts (kfuse.h):
 * a decreasing row gives unspecified values, never an out-of-bounds access. */
size_t kf__cuda_kan_workspace(const struct kf_kan_linear_plan *p, int64_t N);
kf_status kf__cuda_kan_forward(kf_context *ctx, const kf__kan_fwd *c);
kf_status kf__cuda_kan_backward(kf_context *ctx, const kf__kan_bwd *c);
#endif

#ifdef __cplusplus
}
#endif

#endif /* KF_KAN_INTERNAL_H */

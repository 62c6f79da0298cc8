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

/* KANConv2d's patches as the rows of the product (capi/src/kan_conv2d.c; kfuse.h): row
 * n = (b Ho + oh) Wo + ow is the patch of image b at output pixel (oh, ow); feature
 * f = (c kh + i) kw + j of it is x[b, c, oh sh - ph + i dh, ow sw - pw + j dw], 0 outside the
 * image. x is [B, Cin, H, W]; y and dy are [B, out, Ho, Wo] (channel-major per image, not
 * [N, out]); dx is x's shape, every element the sum over the patches that read it. */
typedef struct kf__kan_patches {
    int64_t B, Cin, H, W, Ho, Wo;
    int32_t kh, kw, sh, sw, ph, pw, dh, dw;
} kf__kan_patches;

/* The conv plan: the per-patch KANLinear (in = Cin kh kw) and the kernel's geometry (B, H, W,
 * Ho, Wo of `geom` are 0 here; each call fills its own copy). */
struct kf_kan_conv2d_plan {
    struct kf_kan_linear_plan lin;
    kf__kan_patches geom;
};

typedef struct kf__kan_fwd {
    const struct kf_kan_linear_plan *plan;
    int64_t N;
    const kf__kan_patches *patches; /* NULL: the rows are x's rows [N, in] and y is [N, out]
                                       (KANLinear); else KANConv2d's patches */
    const float *x, *grid, *base, *spline;
    const float *scaler; /* NULL: the plan has none (standalone_scale = 0) */
    float *y;
    void *ws; size_t ws_bytes;
} kf__kan_fwd;

typedef struct kf__kan_bwd {
    const struct kf_kan_linear_plan *plan;
    int64_t N;
    const kf__kan_patches *patches;     /* as in kf__kan_fwd */
    const float *x, *grid, *base, *spline;
    const float *scaler;                /* NULL: the plan has none */
    const float *dy;
    float *dx, *dbase, *dspline, *dscaler; /* each NULL = not wanted (dscaler: always NULL when
                                              the plan has no scaler) */
    bool accumulate;                    /* add into the parameter gradients instead of
                                           overwriting (dx: always overwritten) */
    void *ws; size_t ws_bytes;
} kf__kan_bwd;

/* Backend entry points. *_workspace is pure (one size covers forward and backward of N rows,
 * which are KANConv2d's patches when `patches` is not NULL); forward and backward return KF_OK or
 * set the message. */
size_t kf__cpu_kan_workspace(const struct kf_kan_linear_plan *p, int64_t N,
                             const kf__kan_patches *patches);
kf_status kf__cpu_kan_forward(kf_context *ctx, const kf__kan_fwd *c);
kf_status kf__cpu_kan_backward(kf_context *ctx, const kf__kan_bwd *c);

/* off[r] = the offset in one channel plane [H, W] of kernel position pos = i kw + j of the patch
 * at output pixel p0 + r of an image (rows consecutive pixels, p0 + rows <= Ho Wo), or -1 where
 * that is padding. Feature f of a patch is channel f / (kh kw) at position f % (kh kw)
 * (cpu/kan_linear.c). */
void kf__kan_patch_offsets(const kf__kan_patches *P, int64_t pos, int64_t p0, int64_t rows,
                           int64_t *off);

/* efficient-kan's initial knots on host memory, shared by every backend (the CUDA front end
 * stages through a host buffer): grid [in, nk], every row lo + (j - k) * (hi - lo) / G, rounded
 * as torch forms it in float32 (arange * h + lo with h = (hi - lo) / G taken in double). */
void kf__kan_uniform_grid_host(const struct kf_kan_linear_plan *p, float lo, float hi,
                               float *grid);

/* Shared by the KANLinear and KANConv2d front ends (capi/src/kan_linear.c). */
/* Fills `p` from the per-patch layer's fields after checking them (messages name desc->...). */
kf_status kf__kan_plan_init(const char *fn, kf_context *ctx, int64_t in, int64_t out, int32_t G,
                            int32_t k, int32_t standalone_scale, int32_t dtype,
                            struct kf_kan_linear_plan *p);
/* N rows within limits and N * (in + out) addressable. */
kf_status kf__kan_check_rows(const char *fn, const struct kf_kan_linear_plan *p, int64_t N);
/* The backend's workspace for N rows. */
size_t kf__kan_workspace(const struct kf_kan_linear_plan *p, int64_t N,
                         const kf__kan_patches *patches);
/* The grid and parameters, checked against the plan (grid values on CPU contexts), into the
 * record's pointers. */
kf_status kf__kan_check_params(const struct kf_kan_linear_plan *p, const char *fn,
                               const kf_tensor *grid, const kf_tensor *base,
                               const kf_tensor *spline, const kf_tensor *scaler, const float **g,
                               const float **bw, const float **sw, const float **sc);
/* Every knot of grid [in, nk] (host memory) finite and each feature's row non-decreasing;
 * messages name `arg`. */
kf_status kf__kan_check_grid_host(const struct kf_kan_linear_plan *p, const char *fn,
                                  const char *arg, const float *grid);
/* Checks the optional parameter-gradient outputs of a backward call into the record. */
kf_status kf__kan_check_grads(const struct kf_kan_linear_plan *p, const char *fn,
                              const kf_tensor *dbase, const kf_tensor *dspline,
                              const kf_tensor *dscaler, kf__kan_bwd *c);
/* KANConv2d's x ([B, Cin, H, W] or [Cin, H, W], message names args->x) checked against the conv
 * plan, into the call's patch geometry and its N = B Ho Wo rows (capi/src/kan_conv2d.c). */
kf_status kf__kan_conv_input(const char *fn, const struct kf_kan_conv2d_plan *p,
                             const kf_tensor *x, kf__kan_patches *g, int64_t *N);
/* Selects the workspace and runs the record's backend. */
kf_status kf__kan_run_forward(const char *fn, kf__kan_fwd *c, void *workspace,
                              size_t workspace_bytes);
kf_status kf__kan_run_backward(const char *fn, kf__kan_bwd *c, void *workspace,
                               size_t workspace_bytes);
/* The uniform grid of plan `p` into `grid` (host or device memory of p's context). */
kf_status kf__kan_uniform_grid(const char *fn, const struct kf_kan_linear_plan *p, float lo,
                               float hi, kf_tensor *grid);

#ifdef KF_HAVE_CUDA
/* cuda/kan_linear.cu. The grid is not checked for monotonicity on CUDA contexts (kfuse.h):
 * a decreasing row gives unspecified values, never an out-of-bounds access. */
size_t kf__cuda_kan_workspace(const struct kf_kan_linear_plan *p, int64_t N,
                              const kf__kan_patches *patches);
kf_status kf__cuda_kan_forward(kf_context *ctx, const kf__kan_fwd *c);
kf_status kf__cuda_kan_backward(kf_context *ctx, const kf__kan_bwd *c);
#endif

/* ---- grid update (kfuse.h; front end capi/src/kan_grid.c, host algorithm cpu/kan_grid.c) ----
 * efficient-kan's update_grid on host memory for every backend (a CUDA context stages through
 * the host). The samples of feature i are column i of x [N, in] (`patches` NULL) or feature i of
 * KANConv2d's N patches of x [B, Cin, H, W]. Trusts its inputs: N >= 1, x finite, grid [in, nk]
 * finite and non-decreasing, spline_weight [out, in, C] finite, margin finite >= 0, grid_eps in
 * [0, 1]. Writes new_grid [in, nk] and new_spline [out, in, C] (fresh buffers, not aliasing the
 * inputs) and returns KF_OK; else KF_ERR_OUT_OF_MEMORY, KF_ERR_INVALID_ARGUMENT (the new knots
 * would not be finite) or KF_ERR_INTERNAL (LAPACK failed) with the message set, the outputs
 * then unspecified. */
kf_status kf__kan_update_grid_host(const char *fn, const struct kf_kan_linear_plan *p, int64_t N,
                                   const kf__kan_patches *patches, const float *x,
                                   const float *grid, const float *spline, float margin,
                                   float grid_eps, float *new_grid, float *new_spline);

#ifdef __cplusplus
}
#endif

#endif /* KF_KAN_INTERNAL_H */

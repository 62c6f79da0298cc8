/* What the KANLinear and KANConv2d front ends share (capi/src/kan_linear.c, kan_conv2d.c,
 * kan_grid.c): the conv plan and the checks and runners both layers use. */
#ifndef KF_KAN_FRONT_H
#define KF_KAN_FRONT_H

#include "front.h"
#include "kan_backend.h"
#include "lowp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The conv plan: the per-patch KANLinear (in = Cin kh kw) and the kernel's geometry (B, H, W,
 * Ho, Wo of `geom` are 0 here; each call fills its own copy). */
struct kf_kan_conv2d_plan {
    struct kf_kan_linear_plan lin;
    kf__kan_patches geom;
};

/* Fills `p` from the per-patch layer's fields after checking them (messages name desc->...),
 * with the context's backend's op table, which must support it. */
kf_status kf__kan_plan_init(const char *fn, kf_context *ctx, int64_t in, int64_t out, int32_t G,
                            int32_t k, int32_t standalone_scale, int32_t dtype,
                            struct kf_kan_linear_plan *p);
/* efficient-kan's state: grid, base_weight, spline_weight and (standalone_scale) spline_scaler
 * into out[4]; returns the count. */
int32_t kf__kan_params(const void *plan, int32_t index, kf__param *out); /* a kf__param_list */
/* N rows within limits and N * (in + out) addressable. */
kf_status kf__kan_check_rows(const char *fn, const struct kf_kan_linear_plan *p, int64_t N);
/* The grid and parameters, checked against the plan (grid values where the device's memory is
 * host memory), into the record's pointers (*bw NULL: base_weight absent, no base term). */
kf_status kf__kan_check_params(const struct kf_kan_linear_plan *p, const char *fn,
                               const kf_tensor *grid, const kf_tensor *base,
                               const kf_tensor *spline, const kf_tensor *scaler, const void **g,
                               const void **bw, const void **sw, const void **sc);
/* Every knot of grid [in, nk] (host memory, the plan's dtype) finite and each feature's row
 * non-decreasing; messages name `arg`. */
kf_status kf__kan_check_grid_host(const struct kf_kan_linear_plan *p, const char *fn,
                                  const char *arg, const void *grid);
/* Checks the optional parameter-gradient outputs of a backward call into the record (after
 * kf__kan_check_params: no dbase_weight without a base_weight). */
kf_status kf__kan_check_grads(const struct kf_kan_linear_plan *p, const char *fn,
                              const kf_tensor *dbase, const kf_tensor *dspline,
                              const kf_tensor *dscaler, kf__kan_bwd *c);
/* KANConv2d's x ([B, Cin, H, W] or [Cin, H, W], message names args->x) checked against the conv
 * plan, into the call's patch geometry and its N = B Ho Wo rows (capi/src/kan_conv2d.c). */
kf_status kf__kan_conv_input(const char *fn, const struct kf_kan_conv2d_plan *p,
                             const kf_tensor *x, kf__kan_patches *g, int64_t *N);
/* Selects the workspace and runs the record through the plan's op table. */
kf_status kf__kan_run_forward(const char *fn, kf__kan_fwd *c, void *workspace,
                              size_t workspace_bytes);
kf_status kf__kan_run_backward(const char *fn, kf__kan_bwd *c, void *workspace,
                               size_t workspace_bytes);
/* The uniform grid of plan `p` into `grid` (memory of p's context). */
kf_status kf__kan_uniform_grid(const char *fn, const struct kf_kan_linear_plan *p, float lo,
                               float hi, kf_tensor *grid);

#ifdef __cplusplus
}
#endif

#endif /* KF_KAN_FRONT_H */

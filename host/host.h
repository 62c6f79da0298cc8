/* The host library: algorithms on host memory that every backend's contexts share (the setup
 * calls reach them through host staging, core.h's kf__stage_run, so a CUDA context computes
 * them on the host too) and the KANConv2d patch geometry the CPU kernels also use. Includes only
 * core/. */
#ifndef KF_HOST_H
#define KF_HOST_H

#include "kan_backend.h"
#include "sklinear_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Panther's initialisation (host/sklinear_init.c), every tensor of the plan's dtype. W_init
 * [out, in] or NULL; bias NULL when the plan has none. KF_OK or KF_ERR_OUT_OF_MEMORY (host
 * scratch), message under `fn`. */
kf_status kf__skl_init_host(const struct kf_sklinear_plan *p, const char *fn, uint64_t seed,
                            const void *W_init, void *S1, void *S2, void *U1, void *U2,
                            void *bias);

/* off[r] = the offset in one channel plane [H, W] of kernel position pos = i kw + j of the patch
 * at output pixel p0 + r of an image (rows consecutive pixels, p0 + rows <= Ho Wo), or -1 where
 * that is padding. Feature f of a patch is channel f / (kh kw) at position f % (kh kw)
 * (host/kan_patches.c). */
void kf__kan_patch_offsets(const kf__kan_patches *P, int64_t pos, int64_t p0, int64_t rows,
                           int64_t *off);

/* efficient-kan's initial knots (host/kan_patches.c): grid [in, nk] of the plan's dtype, every
 * row lo + (j - k) * (hi - lo) / G, rounded as torch forms it in that dtype (arange * h + lo
 * with h = (hi - lo) / G taken in double). */
void kf__kan_uniform_grid_host(const struct kf_kan_linear_plan *p, float lo, float hi,
                               void *grid);

/* efficient-kan's update_grid (host/kan_grid.c). Every tensor has the plan's dtype. The samples
 * of feature i are column i of x [N, in] (`patches` NULL) or feature i of KANConv2d's N patches
 * of x [B, Cin, H, W]. Trusts
 * its inputs: N >= 1, x finite, grid [in, nk] finite and non-decreasing, spline_weight
 * [out, in, C] finite, margin finite >= 0, grid_eps in [0, 1], quantile_rule a
 * kf_kan_quantile_rule (whose torch's linspace picks the quantiles). Writes new_grid [in, nk] and
 * new_spline [out, in, C] (fresh buffers, not aliasing the inputs) and returns KF_OK; else
 * KF_ERR_OUT_OF_MEMORY, KF_ERR_INVALID_ARGUMENT (the new knots would not be finite) or
 * KF_ERR_INTERNAL (LAPACK failed) with the message set, the outputs then unspecified. */
kf_status kf__kan_update_grid_host(const char *fn, const struct kf_kan_linear_plan *p, int64_t N,
                                   const kf__kan_patches *patches, const void *x,
                                   const void *grid, const void *spline, float margin,
                                   float grid_eps, int32_t quantile_rule, void *new_grid,
                                   void *new_spline);

#ifdef __cplusplus
}
#endif

#endif /* KF_HOST_H */

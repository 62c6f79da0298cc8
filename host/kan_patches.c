/* KAN helpers on host memory that are not an op of their own: KANConv2d's patch addressing
 * (the CPU kernels' im2col and the grid update's samples) and efficient-kan's initial knots
 * (host.h). */
#include "host.h"

#include <string.h>

void kf__kan_patch_offsets(const kf__kan_patches *P, int64_t pos, int64_t p0, int64_t rows,
                           int64_t *off) {
    const int64_t i = pos / P->kw, j = pos % P->kw;
    int64_t oh = p0 / P->Wo, ow = p0 % P->Wo;
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t ih = oh * P->sh - P->ph + i * P->dh, iw = ow * P->sw - P->pw + j * P->dw;
        off[r] = ih >= 0 && ih < P->H && iw >= 0 && iw < P->W ? ih * P->W + iw : -1;
        if (++ow == P->Wo) ow = 0, ++oh;
    }
}

/* torch: arange(-k, G + k + 1) * h + lo in the grid's dtype T, h = (hi - lo) / G a Python
 * float; one row, then copied to every feature. */
#define KF__KAN_UNIFORM_DEFINE(T, X)                                                              \
    static void kan_uniform_grid_##X(const struct kf_kan_linear_plan *p, float lo, float hi,     \
                                     T *grid) {                                                  \
        const T h = (T)(((double)hi - (double)lo) / (double)p->G);                               \
        for (int64_t j = 0; j < p->nk; ++j) {                                                    \
            const T prod = (T)(j - p->k) * h;                                                    \
            grid[j] = prod + (T)lo;                                                              \
        }                                                                                        \
        for (int64_t i = 1; i < p->in; ++i)                                                      \
            memcpy(grid + i * p->nk, grid, (size_t)p->nk * sizeof(T));                           \
    }

KF__KAN_UNIFORM_DEFINE(float, s)
KF__KAN_UNIFORM_DEFINE(double, d)

void kf__kan_uniform_grid_host(const struct kf_kan_linear_plan *p, float lo, float hi,
                               void *grid) {
    if (p->dtype == KF_DTYPE_F64)
        kan_uniform_grid_d(p, lo, hi, grid);
    else
        kan_uniform_grid_s(p, lo, hi, grid);
}

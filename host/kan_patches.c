/* KAN helpers on host memory that are not an op of their own: KANConv2d's patch addressing
 * (the CPU kernels' im2col and the grid update's samples) and efficient-kan's initial knots
 * (host.h). */
#include "host.h"
#include "lowp.h"

#include <string.h>

/* One output row (oh) at a time: the input row and its bounds are decided once per row, and
 * the loop along it has no carried state, so it vectorises (per-pixel index arithmetic with a
 * wrap test took a quarter of a small-channel KANConv2d's time). */
void kf__kan_patch_offsets(const kf__kan_patches *P, int64_t pos, int64_t p0, int64_t rows,
                           int64_t *off) {
    const int64_t i = pos / P->kw, j = pos % P->kw;
    int64_t oh = p0 / P->Wo, ow0 = p0 % P->Wo;
    for (int64_t r = 0; r < rows; r += P->Wo - ow0, ow0 = 0, ++oh) {
        const int64_t n = P->Wo - ow0 < rows - r ? P->Wo - ow0 : rows - r;
        const int64_t ih = oh * P->sh - P->ph + i * P->dh;
        int64_t *o = off + r;
        if (ih < 0 || ih >= P->H) {
            for (int64_t q = 0; q < n; ++q) o[q] = -1;
            continue;
        }
        const int64_t base = ih * P->W, iw0 = ow0 * P->sw - P->pw + j * P->dw, W = P->W,
                      sw = P->sw;
        for (int64_t q = 0; q < n; ++q) {
            const int64_t iw = iw0 + q * sw;
            o[q] = iw >= 0 && iw < W ? base + iw : -1;
        }
    }
}

/* torch: arange(-k, G + k + 1) * h + lo in the grid's dtype T, h = (hi - lo) / G a Python
 * float: knot j of every feature. */
#define KF__KAN_UNIFORM_DEFINE(T, X)                                                              \
    static T kan_uniform_knot_##X(const struct kf_kan_linear_plan *p, float lo, float hi,        \
                                  int64_t j) {                                                   \
        const T h = (T)(((double)hi - (double)lo) / (double)p->G);                               \
        const T prod = (T)(j - p->k) * h;                                                        \
        return prod + (T)lo;                                                                     \
    }

KF__KAN_UNIFORM_DEFINE(float, s)
KF__KAN_UNIFORM_DEFINE(double, d)

/* A bfloat16 or float16 grid holds the float32 knots rounded to its type, as efficient-kan's
 * float32 buffer gives them after module.to(dtype). */
void kf__kan_uniform_grid_host(const struct kf_kan_linear_plan *p, float lo, float hi,
                               void *grid) {
    for (int64_t j = 0; j < p->nk; ++j) {
        const double t = p->dtype == KF_DTYPE_F64 ? kan_uniform_knot_d(p, lo, hi, j)
                                                  : kan_uniform_knot_s(p, lo, hi, j);
        for (int64_t i = 0; i < p->in; ++i) kf__elem_store(grid, p->dtype, i * p->nk + j, t);
    }
}

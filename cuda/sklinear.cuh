// The CUDA SKLinear kernels' shared declarations (private to cuda/sklinear*.cu): the records the
// kernels read (Net: the layer's operands; Epi: y's epilogue; PartJob: a split-K problem of
// skl_zpart), the call's layout (Layout: cuda/sklinear.cu) and the entry points, each file one
// job: cuda/sklinear.cu (the layout, the split-K partials skl_zpart, the op table),
// cuda/sklinear_fwd.cu (forward), cuda/sklinear_bwd.cu (backward). The design is described at
// the top of cuda/sklinear.cu; float64, bfloat16 and float16 plans run on cuda/plain.cu.
#ifndef KF_CUDA_SKLINEAR_CUH
#define KF_CUDA_SKLINEAR_CUH

#include "activation.h"
#include "common.cuh"
#include "cuda_backend.cuh"
#include "sklinear_tile.cuh"

namespace kf_skl {

// y's epilogue (kfuse.h's fused epilogue; common/activation.h, shared with the CPU): element i of
// y (row * out + column) is stored as dropout(act(v)) at counter offset + i, and v, the
// pre-activation, to pre[i] where pre is given.
struct Epi {
    int32_t act;
    float p, scale; // dropout probability (0: none), 1 / (1 - p)
    uint64_t seed, offset;
    float *pre;
    __device__ __forceinline__ float operator()(int64_t i, float v) const {
        if (pre != nullptr) pre[i] = v;
        return kf__epi_s(act, p, scale, seed, offset + (uint64_t)i, v);
    }
};

struct Net {
    int64_t N, in, out;
    int r, R, k; // R = 2r (the front end keeps 2r below 2^31)
    float inv;   // 1 / (2L)
    const float *x, *S1, *S2, *U1, *U2;
};

// Column j < 2r of W1: element (a, j) at w1_col(j)[a * k].
__device__ __forceinline__ const float *w1_col(const Net &a, int j) {
    const bool hi = j >= a.r;
    const int jj = hi ? j - a.r : j, term = jj / a.k, c = jj - term * a.k;
    return (hi ? a.U2 : a.S1) + (int64_t)term * a.in * a.k + c;
}
// Row j < 2r of W2: element (j, o) at w2_row(j)[o].
__device__ __forceinline__ const float *w2_row(const Net &a, int j) {
    return j < a.r ? a.U1 + (int64_t)j * a.out : a.S2 + (int64_t)(j - a.r) * a.out;
}

// One split-K problem of skl_zpart: part[p][n][c] (c < ncols) = scale * sum over k in chunk p of
// A[n, k] B[k, c]; jobs = row tiles * P * RC (RC column tiles of BN).
struct PartJob {
    int64_t jobs, P, KC, RC, K;
    int ncols;    // output columns
    int col_base; // x problem: W1 column of output column 0
    float scale;
    float *part;  // [P, N, ncols]
};

// Sum over p < P of part[p * stride] (fixed order).
__device__ __forceinline__ float psum(const float *part, int64_t P, int64_t stride) {
    float s = 0.0f;
    for (int64_t p = 0; p < P; ++p) s += part[p * stride];
    return s;
}


// Everything derived from (plan, N): paths, tilings, splits, workspace offsets.
struct Layout {
    int64_t N, in, out, r, R;
    int64_t rt, rtr, ct_in, ct_out; // 16-row tiles of N and r, 256-column tiles of in and out
    int cw;                         // CW of the bottleneck tiles (skl_fwd_fused, skl_zpart)
    int64_t bn;                     // 32 * cw
    bool fused;
    int64_t cpb, groups;            // fused: column tiles per block, column groups
    kf__split fz, dz, z2, w;
    int64_t rc_f, rc_dz, rc_z2;     // column tiles of the Z, dZ, Z2 partial problems
    size_t off_z2, off_w1, off_w2, off_wb; // backward (dZ partials at 0; forward's Z too)
    size_t off_g;                   // backward, a plan with an epilogue: g [N, out] (skl_epi_grad)
    size_t fwd_bytes, bwd_bytes;
};

Layout make_layout(const struct kf_sklinear_plan *p, int64_t N);
Net make_net(const struct kf_sklinear_plan *p, int64_t N, const void *x, const void *S1,
             const void *S2, const void *U1, const void *U2);
// skl_zpart over the problems px (x W1) and pd (dy W2^T; dy unused without it) with CW = cw;
// nothing where both are idle (no_part()).
kf_status run_zpart(kf_context *ctx, const char *fn, int cw, const Net &a, const float *dy,
                    const PartJob &px, const PartJob &pd);
PartJob no_part();

// The float32 op table's entries (cuda/sklinear_fwd.cu, cuda/sklinear_bwd.cu).
kf_status skl_forward(kf_context *ctx, const kf__skl_fwd *c);
kf_status skl_backward(kf_context *ctx, const kf__skl_bwd *c);

} // namespace kf_skl

#endif

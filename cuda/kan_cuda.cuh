// The CUDA KAN kernels' shared declarations (private to cuda/kan_*.cu): tile constants, the
// problem record the kernels read (Prob), the device helpers every kernel shares (the row mapping
// xval / yoff, the 64 x 64 block-tile engine mma_stage, a row's columns of A gen_cols, a row's dx
// term dx_part), the call's layout (Layout: cuda/kan_linear.cu) and the paths' entry points, each
// file one job: cuda/kan_linear.cu (the preparation, the layout, the op tables), cuda/kan_fwd.cu
// (the tiled forward), cuda/kan_bwd.cu (the tiled backward and the weight-gradient fold),
// cuda/kan_dense.cu (KANLinear's materialised path). The design is described at the top of
// cuda/kan_linear.cu.
#ifndef KF_CUDA_KAN_CUDA_CUH
#define KF_CUDA_KAN_CUDA_CUH

#include "bspline.h"
#include "common.cuh"
#include "cuda_backend.cuh"
#include "plain.cuh"

#include <float.h>

namespace kf_kan {

constexpr int kThreads = 256;          // every kernel: 8 warps
constexpr int kT = 64;                 // tile rows, tile columns, stage depth
constexpr int kLd = kT + 1;            // shared row length
constexpr int kFBMax = kT / 2;         // features per dx group at most (cw >= 2)
constexpr int64_t kMinSplit = 256;     // at least this much reduction per split
constexpr int64_t kMaxSplits = 64;     // at most this many partials to sum
constexpr int kMaxOrder = 15;          // spline orders beyond this are refused
// KANConv2d's dXcol buffer: at most this many floats (64 MiB), or one image's when larger.
constexpr int64_t kDcolFloats = int64_t(1) << 24;
// KANLinear's materialised path: from this many outputs (N out) on, at most this many floats of A
// per chunk (128 MiB).
constexpr int64_t kDenseOutputs = int64_t(1) << 22;
constexpr int64_t kChunkFloats = int64_t(1) << 25;

// KANConv2d's patch geometry (kf__kan_patches plus HoWo = Ho Wo); unused (zero) for KANLinear.
struct Geom {
    int64_t Cin, H, W, Ho, Wo, HoWo;
    int kh, kw, sh, sw, ph, pw, dh, dw;
};

struct Prob {
    int64_t N, in, out, K, C, nk, cw;
    int k;
    const float *x, *grid, *inv, *W;
    Geom g;
};

__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }

// The row mapping, shared by every kernel; CONV is a template flag so that KANLinear's identity
// mapping costs nothing. x value of (row n, feature f): KANLinear x[n, f]; KANConv2d
// x[b, c, oh sh - ph + i dh, ow sw - pw + j dw] with n = (b Ho + oh) Wo + ow,
// f = (c kh + i) kw + j, 0 outside the image.
template <bool CONV>
__device__ __forceinline__ float xval(const Prob &P, int64_t n, int64_t f) {
    if (!CONV) return P.x[n * P.in + f];
    const Geom &g = P.g;
    using kf_plain::divmod;
    const kf_plain::QR wq = divmod(n, g.Wo), hq = divmod(wq.q, g.Ho), jq = divmod(f, g.kw),
                       iq = divmod(jq.q, g.kh);
    const int64_t ow = wq.r, oh = hq.r, b = hq.q, j = jq.r, i = iq.r, c = iq.q;
    const int64_t h = oh * g.sh - g.ph + i * g.dh, w = ow * g.sw - g.pw + j * g.dw;
    if (h < 0 || h >= g.H || w < 0 || w >= g.W) return 0.0f;
    return P.x[((b * g.Cin + c) * g.H + h) * g.W + w];
}

// Offset of element (row n, output o) of y and dy (and of y's split-K partials): KANLinear
// [N, out], n * out + o; KANConv2d [B, out, Ho, Wo], (b out + o) Ho Wo + (n - b Ho Wo).
template <bool CONV>
__device__ __forceinline__ int64_t yoff(const Prob &P, int64_t n, int64_t o) {
    if (!CONV) return n * P.out + o;
    const kf_plain::QR bq = kf_plain::divmod(n, P.g.HoWo);
    return (bq.q * P.out + o) * P.g.HoWo + bq.r;
}

// acc[i][j] += sum over kk < w of As[kk][ty + 16 i] * Bs[kk][tx + 16 j].
__device__ __forceinline__ void mma_stage(float (&acc)[4][4], const float (*As)[kLd],
                                          const float (*Bs)[kLd], int w) {
    const int tx = (int)threadIdx.x % 16, ty = (int)threadIdx.x / 16;
    for (int kk = 0; kk < w; ++kk) {
        float a[4], b[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) a[i] = As[kk][ty + 16 * i];
#pragma unroll
        for (int j = 0; j < 4; ++j) b[j] = Bs[kk][tx + 16 * j];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
}

__device__ __forceinline__ void zero(float (&acc)[4][4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
}

// Columns [c_lo, c_hi) (all of feature f) of A's row n into dst[(c - k0) * stride]:
// SiLU(x) for the feature's first column, its bases for the others. n < 0: zeros (padding row).
template <int KM, bool CONV>
__device__ __forceinline__ void gen_cols(const Prob &P, int64_t n, int64_t f, int64_t c_lo,
                                         int64_t c_hi, float *dst, int stride, int64_t k0) {
    for (int64_t c = c_lo; c < c_hi; ++c) dst[(c - k0) * stride] = 0.0f;
    if (n < 0) return;
    const int64_t base = f * P.cw;
    const float xv = xval<CONV>(P, n, f);
    if (c_lo == base) dst[(base - k0) * stride] = xv / (1.0f + expf(-xv));
    float Nw[KM + 1];
    const int64_t j =
        kf__bspline_window<KM>(P.grid + f * P.nk, P.inv + f * P.k * P.nk, P.nk, P.k, xv, Nw);
    if (j < 0) return;
#pragma unroll
    for (int r = 0; r <= KM; ++r) {
        if (r > P.k) break;
        const int64_t b = j - P.k + r, c = base + 1 + b;
        if (b >= 0 && b < P.C && c >= c_lo && c < c_hi) dst[(c - k0) * stride] = Nw[r];
    }
}

// dx contribution of columns [c_lo, c_hi) of feature f at row n: drow[c - c0] holds dA[n, c].
//   SiLU'(x) dA_silu + sum_c dA_c B'_c(x)      (B' by common/bspline.h's kf__bspline_dwindow)
template <int KM, bool CONV>
__device__ __forceinline__ float dx_part(const Prob &P, int64_t n, int64_t f, int64_t c_lo,
                                         int64_t c_hi, const float *drow, int64_t c0) {
    const int64_t base = f * P.cw;
    const float xv = xval<CONV>(P, n, f);
    float s = 0.0f;
    if (c_lo == base) {
        const float sg = 1.0f / (1.0f + expf(-xv));
        s = drow[base - c0] * (sg * (1.0f + xv * (1.0f - sg)));
    }
    const int k = P.k;
    if (k == 0) return s;
    const float *fi = P.inv + f * k * P.nk, *ik = fi + (int64_t)(k - 1) * P.nk;
    float Nw[KM + 1];
    const int64_t j = kf__bspline_window<KM>(P.grid + f * P.nk, fi, P.nk, k - 1, xv, Nw);
    if (j < 0) return s;
#pragma unroll
    for (int r = 0; r <= KM; ++r) {
        if (r > k) break;
        const int64_t c = j - k + r, col = base + 1 + c;
        if (c < 0 || c >= P.C || col < c_lo || col >= c_hi) continue;
        s += drow[col - c0] * kf__bspline_dwindow<KM>(ik, j, k, r, Nw);
    }
    return s;
}

// Everything derived from (plan, N, patches): tilings, splits, workspace offsets.
struct Layout {
    int64_t rt, ot;          // 64-row tiles of N, 64-wide tiles of out
    int64_t FB, tpg, groups; // features per group, 64-column chunks per group, groups
    kf__split f, w;          // forward feature ranges; dW row ranges
    int64_t Bg;              // KANConv2d: images per dx group (dXcol holds Bg Ho Wo rows)
    int64_t Nc;              // materialised path: rows of A per chunk (0: the tiled kernels)
    int64_t Fc;              // materialised path: features per chunk of the forward
    size_t off_inv, off_part, off_a, bytes;
    size_t off_wlo, off_alo, off_dyh, off_dyl; // materialised path: the 3xTF32 low parts, dy's
};


// The materialised path's buffers in the workspace (Layout's offsets).
struct Dense {
    const float *wlo; // W's 3xTF32 low part (P.W holds the high part)
    float *a, *alo;   // a chunk of A [Nc, K] (hi, lo); backward reuses `a` for dA
    float *dyh, *dyl; // a chunk of dy [Nc, out] (hi, lo)
};


// The records' untyped tensors as float32, the one dtype these kernels see (kan_select gives
// every other dtype cuda/plain.cu's table at plan creation).
inline const float *f32(const void *t) { return static_cast<const float *>(t); }
inline float *f32(void *t) { return static_cast<float *>(t); }

// cuda/kan_linear.cu: the layout, the problem record, grid-stride launch sizes, the preparation
// (W and the knot reciprocals into the workspace), the materialised path's buffers.
Layout make_layout(const struct kf_kan_linear_plan *p, int64_t N, const kf__kan_patches *pt);
Prob make_prob(const struct kf_kan_linear_plan *p, int64_t N, const kf__kan_patches *pt,
               const float *x, const float *grid, void *ws);
unsigned stride_blocks(int64_t E);
kf_status launch_prep(kf_context *ctx, const char *fn, const Prob &P, const float *base,
                      const float *spline, const float *scaler, void *ws, const Layout &l,
                      bool pack);
Dense dense_buffers(const Layout &l, void *ws);

// The paths, for the window bound KM (3 or kMaxOrder) and the row mapping CONV: the tiled
// forward (cuda/kan_fwd.cu), the tiled backward and the fold of dW's partials into the weight
// gradients (cuda/kan_bwd.cu), the materialised path (cuda/kan_dense.cu).
template <int KM, bool CONV>
kf_status forward_km(kf_context *ctx, const char *fn, const Layout &l, const Prob &P, float *y,
                     float *part);
template <int KM, bool CONV>
kf_status backward_km(kf_context *ctx, const char *fn, const Layout &l, const Prob &P,
                      const kf__kan_bwd *c, float *part);
kf_status launch_fold(kf_context *ctx, const char *fn, const Prob &P, const kf__kan_bwd *c,
                      const float *part, int64_t Pw);
template <int KM>
kf_status forward_dense(kf_context *ctx, const char *fn, const Layout &l, const Prob &P,
                        float *y, const Dense &d);
template <int KM>
kf_status backward_dense(kf_context *ctx, const char *fn, const Layout &l, const Prob &P,
                         const kf__kan_bwd *c, float *dw, const Dense &d);

} // namespace kf_kan

#endif // KF_CUDA_KAN_CUDA_CUH

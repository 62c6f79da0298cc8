// KANLinear (efficient-kan) and KANConv2d (unfold + KANLinear) on CUDA: forward and backward as
// tiled GEMMs over the combined operand A [N, K] and the combined weight W [out, K], K = in * cw,
// cw = C + 1 (notation and records: core/kan_backend.h; math: docs/ops/kan.md). A is never
// stored: every tile of it is generated in the operand-load stage of the GEMM that consumes it,
// from x and the knots. Row-major throughout; fp32 operands and accumulation; no atomics, every sum
// in a fixed order; no allocation, no synchronisation, no host reads of device data: everything
// is enqueued on ctx->stream (graph-capturable).
//
// Rows. The kernels see N rows of `in` features and N x out outputs through two device helpers,
// selected by the template flag CONV (KANLinear: false, the identity mapping, no extra work):
//   xval(n, f)  KANLinear x[n * in + f]; KANConv2d (record field `patches`, an implicit GEMM:
//               patches are never stored) row n = (b Ho + oh) Wo + ow, feature f = (c kh + i) kw
//               + j reads x[b, c, oh sh - ph + i dh, ow sw - pw + j dw], 0 outside the image.
//   yoff(n, o)  offset of y/dy element (n, o): KANLinear n * out + o; KANConv2d
//               (b out + o) Ho Wo + oh Wo + ow (y [B, out, Ho, Wo]).
// With CONV the loads of dy and the stores of y run along n (the contiguous direction there);
// kan_fwd transposes its output tile through shared memory for that.
//
// One block-tile engine (mma_stage): 256 threads compute a 64 x 64 output tile, 4 x 4 per thread
// (rows ty + 16 i, columns tx + 16 j), over stages of at most 64 along the reduction dimension,
// both operands staged in shared memory as [k][m] and [k][n] (row length 65). Every load is
// bounds-checked, so no extent needs to be a multiple of anything.
//
// The bases of one (row, feature) pair are computed by one thread, as a local window: the knot
// interval j with t_j <= x < t_{j+1} by binary search, then the Cox-de Boor recurrence over the
// k + 1 bases that can be non-zero there, B_{j-p..j, p} for p = 1..k, with exactly the terms
// (and reciprocals, 1 / (t_{m+p} - t_m) or 0 for zero-width spans, table in the workspace) of the
// CPU backend's dense recurrence: the terms this skips are exact zeros there. x outside
// [t_0, t_{nk-1}) (or NaN) has every basis 0. The window lives in registers (the recurrence is
// unrolled up to the template bound KM: 3 for k <= 3, 15 for k <= 15; larger k is refused).
//
// Launches (all on ctx->stream, each followed by KF__CUDA_LAUNCH_CHECK):
//  kan_prep   the combined weight W [out, K] (when a GEMM reads it) and the knot reciprocals
//             inv [in, k, nk] into the workspace (grid-stride).
//  forward:
//   kan_fwd   y tile [64 rows, 64 outputs] = A W^T over a range of features; stage = the columns
//             of floor(64 / cw) whole features (or 64 columns of one feature when cw > 64); A's
//             stage is generated per (row, feature) into shared memory, W's is loaded. When the
//             row x output tiles alone do not fill the GPU, the features are split into Pf
//             ranges (split-K) whose partial y go to the workspace, Pf copies of y's layout, and
//   kan_sum   sums them in range order into y.
//  backward:
//   kan_dx    (dx wanted) block = 64 rows x a group of FB = floor(64 / cw) features (1 when
//             cw > 64): dA = dy W for the group's columns in chunks of 64, the reduction over
//             `out` in stages of 64 (dy and W loaded), each chunk's dA tile dumped to shared
//             memory and folded at once into per-(row, feature) dx sums (SiLU' and the closed-form
//             B' from the order-(k-1) window) in shared memory, in chunk and column order; dA is
//             never stored beyond that 64 x 64 tile. KANLinear: the sums are dx [N, in].
//             KANConv2d: several patches read one pixel, so the sums (dXcol, per (row, feature))
//             go to the workspace as [in, R] for the R = Bg Ho Wo rows of a group of Bg whole
//             images (the last group may be shorter), and per group
//   kan_col2im  one thread per element of the group's images of dx gathers them: dx[b, c, h, w]
//             = sum over (i, j) in row-major order of dXcol[(c kh + i) kw + j][patch (oh, ow)]
//             for oh sh = h + ph - i dh and ow sw = w + pw - j dw whole and inside the output
//             (0 when no patch reads the pixel). A gather in a fixed order: deterministic, no
//             atomics. Groups run one after another on the stream, reusing the buffer.
//   kan_dw    (any weight gradient wanted) dW = dy^T A [out, K], tiles of 64 outputs x one
//             feature-group column chunk, the reduction over rows in stages of 64: dy^T loaded,
//             A's stage generated per (row, feature). The rows are split into Pw ranges; each
//             writes its partial dW to the workspace, [Pw, out, K] (Pw = 1: the whole dW).
//   kan_fold  one thread per (o, i): sums the Pw partials in range order and folds them into
//             d base_weight, d spline_weight (* scaler) and d spline_scaler (sum over c in order),
//             written or accumulated.
//
// KANLinear with at least 2^22 outputs (N out) takes the materialised path instead: A is
// generated a chunk of Nc rows at a time into the workspace and every product runs on cuBLAS in
// 3xTF32 (kf__gemm_3xtf32: each operand split into a TF32 high part and a float32 remainder, three
// tensor-core products accumulated in float32: fp32's accuracy within 2^-20 per term). At
// (8192, 1024, 1024) on an H200 (benches/results/gpu-2026-11-27-h200): forward 3.94 ms,
// forward+backward 11.60 (one fp32 product each, row chunks: 4.13 and 13.06; the tiled kernels:
// 10.53 and 30.14), with 188 MiB of workspace (108 with the fp32 products). Nc is an eighth of N
// rounded up to 64 (at most 2^25 floats of A): the chunk is at most an eighth of the bases tensor
// efficient-kan materialises, and each backward product still has 2^19 outputs or more; the
// forward's chunks are Fc = Nc in / N whole features of every row instead (at 3xTF32, 1024-row
// chunks ran the forward in 4.18 ms: 64 output tiles for 132 SMs). Smaller problems keep the
// tiled kernels, whose split-K fills the device (untimed on the materialised path:
// (1024, 256, 256) runs 0.160 ms on the tiled kernels).
//   kan_prep     also splits W into its high part (in place) and low part
//   kan_gen      a block of A split the same way, one thread per (row, feature)
//   forward:     per chunk of Fc features: y (+)= A[:, chunk] W[:, chunk]^T (cuBLAS)
//   backward:    per chunk, in stream order: kan_split of dy[chunk]; kan_gen and
//                dW (+)= dy[chunk]^T A (cuBLAS, chunk order) when a weight gradient is wanted;
//                dA = dy[chunk] W (cuBLAS) over A's high buffer and kan_dx_rows (dx, as kan_dx
//                folds it) when dx is wanted; then kan_fold from dW.
//   Workspace: 4 out K (W) + 4 in k nk + 4 out K (dW) + 4 out K (W's low part)
//              + 8 max(Nc K, N Fc cw) (A's parts) + 8 Nc out (dy's parts).
//
// Split counts are a function of the shape and the device's SM count S (so is the workspace):
// enough splits that a grid fills about one wave (kf__wave_blocks), at least kMinSplit of the
// reduction per split, at most kMaxSplits. Workspace (bytes, each buffer rounded up to 64), a
// function of (plan, N, patches, S):
//     4 out K  +  4 in k nk  +  max( Pf > 1 ? 4 Pf N out : 0 ,  4 Pw out K ,  4 Bg Ho Wo in )
// (Pf > 1 only when ceil(N/64) ceil(out/64) < S, Pw > 1 only when the dW tiles are fewer than
// S: neither term grows with N past those points, except 4 Pw out K through Pw <= 64.) The last
// term is KANConv2d's dXcol only (0 for KANLinear), with N = B Ho Wo, in = Cin kh kw and
// Bg = min(B, max(1, floor(2^24 / (Ho Wo in)))) images per group: at most 2^24 floats (64 MiB),
// or one image's when that is larger. The three buffers of the max share one region: the forward
// partials, dXcol (used by kan_dx and kan_col2im, all before kan_dw in stream order) and the dW
// partials are never live at the same time.
#include "common.cuh"
#include "bspline.h"
#include "cuda_backend.cuh"
#include "plain.cuh"

#include <float.h>

namespace {

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

// ---- preparation ------------------------------------------------------------------------------
// W [out, K] (pack) and inv [in, k, nk]: inv[i][q-1][m] = 1 / (t[m+q] - t[m]), 0 for spans
// narrower than FLT_MIN (zero width) and past the end.
__global__ void __launch_bounds__(kThreads)
    kan_prep(Prob P, const float *base, const float *spline, const float *scaler, float *W,
             float *Wlo, float *inv, bool pack) {
    const int64_t E1 = pack ? P.out * P.K : 0, E2 = P.in * P.k * P.nk, E = E1 + E2;
    const int64_t step = (int64_t)gridDim.x * kThreads;
    for (int64_t e = (int64_t)blockIdx.x * kThreads + threadIdx.x; e < E; e += step) {
        if (e < E1) {
            const int64_t o = e / P.K, col = e % P.K, i = col / P.cw, c = col % P.cw;
            const int64_t oi = o * P.in + i;
            const float v = c == 0 ? (base ? base[oi] : 0.0f) // no base_weight: no base term
                                   : (scaler ? spline[oi * P.C + c - 1] * scaler[oi]
                                             : spline[oi * P.C + c - 1]);
            if (Wlo) kf__tf32_split(v, W, Wlo, e); // the materialised path's 3xTF32 split
            else W[e] = v;
        } else {
            const int64_t e2 = e - E1, i = e2 / (P.k * P.nk), q = e2 / P.nk % P.k + 1,
                          m = e2 % P.nk;
            const float *t = P.grid + i * P.nk;
            const float d = m + q < P.nk ? t[m + q] - t[m] : 0.0f;
            inv[e2] = d >= FLT_MIN ? 1.0f / d : 0.0f;
        }
    }
}

// ---- forward ----------------------------------------------------------------------------------
// Block (row tile, output tile, feature range ps): y or partial y of 64 x 64, at the offsets
// yoff (the partials [Pf] of y's layout, so that kan_sum is elementwise for both mappings).
template <int KM, bool CONV>
__global__ void __launch_bounds__(kThreads)
    kan_fwd(Prob P, float *y, float *part, int64_t ot_n, int64_t Pf, int64_t FCs) {
    __shared__ float As[kT][kLd], Bs[kT][kLd];
    int64_t blk = blockIdx.x;
    const int64_t ps = blk % Pf;
    blk /= Pf;
    const int64_t m0 = blk / ot_n * kT, o0 = blk % ot_n * kT;
    const int64_t N = P.N, out = P.out, K = P.K, cw = P.cw;
    const int64_t fbeg = ps * FCs, fend = imin(P.in, fbeg + FCs);
    const int64_t kbeg = fbeg * cw, kend = fend * cw;
    const int sw = cw <= kT ? (int)(kT / cw * cw) : kT;
    const int tid = (int)threadIdx.x;
    const float *W = P.W;
    float acc[4][4];
    zero(acc);
    for (int64_t k0 = kbeg; k0 < kend; k0 += sw) {
        const int w = (int)imin(sw, kend - k0);
        const int64_t fl = k0 / cw, nf = (k0 + w - 1) / cw - fl + 1;
        for (int64_t e = tid; e < kT * nf; e += kThreads) {
            const int m = (int)(e % kT);
            const int64_t f = fl + e / kT, n = m0 + m;
            gen_cols<KM, CONV>(P, n < N ? n : -1, f, imax(k0, f * cw),
                               imin(k0 + w, (f + 1) * cw), &As[0][m], kLd, k0);
        }
        for (int e = tid; e < kT * w; e += kThreads) {
            const int kk = e % w, nn = e / w;
            const int64_t o = o0 + nn;
            Bs[kk][nn] = o < out ? W[o * K + k0 + kk] : 0.0f;
        }
        __syncthreads();
        mma_stage(acc, As, Bs, w);
        __syncthreads();
    }
    const int tx = tid % 16, ty = tid / 16;
    float *dst = Pf > 1 ? part + ps * N * out : y;
    if (CONV) {
        // Rows are contiguous in y [B, out, Ho, Wo]: transpose through shared memory (free since
        // the loop's last barrier) so that consecutive threads store consecutive rows.
        float(*Ts)[kLd] = As; // [o - o0][n - m0]
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) Ts[tx + 16 * j][ty + 16 * i] = acc[i][j];
        __syncthreads();
        for (int e = tid; e < kT * kT; e += kThreads) {
            const int m = e % kT, oo = e / kT;
            const int64_t n = m0 + m, o = o0 + oo;
            if (n < N && o < out) dst[yoff<true>(P, n, o)] = Ts[oo][m];
        }
    } else {
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int64_t n = m0 + ty + 16 * i, o = o0 + tx + 16 * j;
                if (n < N && o < out) dst[yoff<false>(P, n, o)] = acc[i][j];
            }
    }
}

// dst[e] = sum over p < P of part[p * E + e], in p order.
__global__ void __launch_bounds__(kThreads)
    kan_sum(const float *part, int64_t P, int64_t E, float *dst) {
    const int64_t step = (int64_t)gridDim.x * kThreads;
    for (int64_t e = (int64_t)blockIdx.x * kThreads + threadIdx.x; e < E; e += step) {
        float s = 0.0f;
        for (int64_t p = 0; p < P; ++p) s += part[p * E + e];
        dst[e] = s;
    }
}

// ---- backward ---------------------------------------------------------------------------------
// Block (row tile, feature group): dx for 64 rows x the group's FB features, over the rows
// [r0, r0 + R) (KANLinear: all N; KANConv2d: one group of whole images). KANLinear writes
// dst = dx [N, in]; KANConv2d writes dst = dXcol [in, R] (column f, row n - r0), which
// kan_col2im gathers into dx.
template <int KM, bool CONV>
__global__ void __launch_bounds__(kThreads)
    kan_dx(Prob P, const float *dy, float *dst, int64_t groups, int64_t FB, int64_t r0,
           int64_t R) {
    __shared__ float As[kT][kLd], Bs[kT][kLd];
    __shared__ float dxs[kT][kFBMax + 1];
    const int64_t blk = blockIdx.x, m0 = r0 + blk / groups * kT, g = blk % groups;
    const int64_t N = r0 + R, in = P.in, out = P.out, K = P.K, cw = P.cw;
    const int64_t f0 = g * FB, f1 = imin(in, f0 + FB), nfg = f1 - f0;
    const int64_t cb = f0 * cw, ce = f1 * cw;
    const int tid = (int)threadIdx.x, tx = tid % 16, ty = tid / 16;
    const float *W = P.W;
    for (int e = tid; e < kT * (int)nfg; e += kThreads) dxs[e % kT][e / kT] = 0.0f;
    for (int64_t c0 = cb; c0 < ce; c0 += kT) {
        const int wc = (int)imin(kT, ce - c0);
        float acc[4][4];
        zero(acc);
        for (int64_t o0 = 0; o0 < out; o0 += kT) {
            const int w = (int)imin(kT, out - o0);
            for (int e = tid; e < kT * w; e += kThreads) {
                // Consecutive threads along dy's contiguous dimension: o (KANLinear), n (conv).
                const int kk = CONV ? e / kT : e % w, m = CONV ? e % kT : e / w;
                const int64_t n = m0 + m;
                As[kk][m] = n < N ? dy[yoff<CONV>(P, n, o0 + kk)] : 0.0f;
            }
            for (int e = tid; e < kT * w; e += kThreads) {
                const int nn = e % kT, kk = e / kT;
                Bs[kk][nn] = nn < wc ? W[(o0 + kk) * K + c0 + nn] : 0.0f;
            }
            __syncthreads();
            mma_stage(acc, As, Bs, w);
            __syncthreads();
        }
        float(*Ds)[kLd] = As; // dA tile [m][c - c0]
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) Ds[ty + 16 * i][tx + 16 * j] = acc[i][j];
        __syncthreads();
        const int64_t fl = c0 / cw, nf = (c0 + wc - 1) / cw - fl + 1;
        for (int64_t e = tid; e < kT * nf; e += kThreads) {
            const int m = (int)(e % kT);
            const int64_t f = fl + e / kT, n = m0 + m;
            if (n >= N) continue;
            dxs[m][f - f0] += dx_part<KM, CONV>(P, n, f, imax(c0, f * cw),
                                                imin(c0 + wc, (f + 1) * cw), &Ds[m][0], c0);
        }
        __syncthreads();
    }
    if (CONV) {
        for (int e = tid; e < kT * (int)nfg; e += kThreads) {
            const int m = e % kT, fi = e / kT;
            const int64_t n = m0 + m;
            if (n < N) dst[(f0 + fi) * R + (n - r0)] = dxs[m][fi];
        }
    } else {
        for (int e = tid; e < kT * (int)nfg; e += kThreads) {
            const int fi = e % (int)nfg, m = e / (int)nfg;
            const int64_t n = m0 + m;
            if (n < N) dst[n * in + f0 + fi] = dxs[m][fi];
        }
    }
}

// dx[b, c, h, w] for the images b0 .. b0 + nb - 1 from their dXcol [in, R] (R = nb Ho Wo,
// kan_dx): the sum over (i, j) in row-major order of dXcol at feature (c kh + i) kw + j and the
// patch (oh, ow) with oh sh = h + ph - i dh and ow sw = w + pw - j dw, where those are whole and
// inside [0, Ho) x [0, Wo) (no such patch: no term; none at all: 0). A gather, one thread per
// element of dx, so no atomics and a fixed order.
__global__ void __launch_bounds__(kThreads)
    kan_col2im(Prob P, const float *dcol, int64_t b0, int64_t nb, float *dx) {
    const Geom &g = P.g;
    const int64_t HW = g.H * g.W, E = nb * g.Cin * HW, R = nb * g.HoWo;
    const int64_t step = (int64_t)gridDim.x * kThreads;
    float *out = dx + b0 * g.Cin * HW;
    for (int64_t e = (int64_t)blockIdx.x * kThreads + threadIdx.x; e < E; e += step) {
        using kf_plain::divmod;
        const kf_plain::QR hw = divmod(e, g.W), hq = divmod(hw.q, g.H), cq = divmod(hq.q, g.Cin);
        const int64_t w = hw.r, h = hq.r, c = cq.r, bl = cq.q;
        const float *col = dcol + bl * g.HoWo;
        float s = 0.0f;
        for (int i = 0; i < g.kh; ++i) {
            const int64_t th = h + g.ph - (int64_t)i * g.dh;
            if (th < 0) break; // decreasing in i
            const kf_plain::QR oq = divmod(th, g.sh);
            if (oq.r != 0) continue;
            const int64_t oh = oq.q;
            if (oh >= g.Ho) continue;
            const float *rowc = col + ((c * g.kh + i) * g.kw) * R + oh * g.Wo;
            for (int j = 0; j < g.kw; ++j) {
                const int64_t tw = w + g.pw - (int64_t)j * g.dw;
                if (tw < 0) break;
                const kf_plain::QR wq = divmod(tw, g.sw);
                if (wq.r != 0) continue;
                const int64_t ow = wq.q;
                if (ow >= g.Wo) continue;
                s += rowc[j * R + ow];
            }
        }
        out[e] = s;
    }
}

// Block (output tile, column tile, row range pw): partial dW [64 outputs, <= 64 columns] over
// rows [pw NC, (pw + 1) NC). Column tile ct: group ct / tpg of FB features, chunk ct % tpg.
template <int KM, bool CONV>
__global__ void __launch_bounds__(kThreads)
    kan_dw(Prob P, const float *dy, float *part, int64_t ct_n, int64_t FB, int64_t tpg,
           int64_t Pw, int64_t NC) {
    __shared__ float As[kT][kLd], Bs[kT][kLd];
    int64_t blk = blockIdx.x;
    const int64_t pw = blk % Pw;
    blk /= Pw;
    const int64_t ct = blk % ct_n, o0 = blk / ct_n * kT;
    const int64_t N = P.N, in = P.in, out = P.out, K = P.K, cw = P.cw;
    const int64_t g = ct / tpg, q = ct % tpg, f0 = g * FB, f1 = imin(in, f0 + FB);
    const int64_t c0 = f0 * cw + q * kT, c1 = imin(c0 + kT, f1 * cw);
    const int wc = (int)(c1 - c0);
    const int64_t nbeg = pw * NC, nend = imin(N, nbeg + NC);
    const int tid = (int)threadIdx.x, tx = tid % 16, ty = tid / 16;
    const int64_t fl = c0 / cw, nf = (c1 - 1) / cw - fl + 1;
    float acc[4][4];
    zero(acc);
    for (int64_t n0 = nbeg; n0 < nend; n0 += kT) {
        const int w = (int)imin(kT, nend - n0);
        for (int e = tid; e < kT * w; e += kThreads) {
            // Consecutive threads along dy's contiguous dimension: o (KANLinear), n (conv).
            const int m = CONV ? e / w : e % kT, kk = CONV ? e % w : e / kT;
            const int64_t o = o0 + m;
            As[kk][m] = o < out ? dy[yoff<CONV>(P, n0 + kk, o)] : 0.0f;
        }
        for (int64_t e = tid; e < w * nf; e += kThreads) {
            const int kk = (int)(e % w);
            const int64_t f = fl + e / w;
            gen_cols<KM, CONV>(P, n0 + kk, f, imax(c0, f * cw), imin(c1, (f + 1) * cw),
                               &Bs[kk][0], 1, c0);
        }
        for (int e = tid; e < w * (kT - wc); e += kThreads)
            Bs[e / (kT - wc)][wc + e % (kT - wc)] = 0.0f;
        __syncthreads();
        mma_stage(acc, As, Bs, w);
        __syncthreads();
    }
    float *dst = part + pw * out * K;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int64_t o = o0 + ty + 16 * i;
            const int c = tx + 16 * j;
            if (o < out && c < wc) dst[o * K + c0 + c] = acc[i][j];
        }
}

// Sum over p < P of part[p * stride] (fixed order).
__device__ __forceinline__ float psum(const float *part, int64_t P, int64_t stride) {
    float s = 0.0f;
    for (int64_t p = 0; p < P; ++p) s += part[p * stride];
    return s;
}

struct Fold {
    const float *part; // [Pw, out, K]
    int64_t Pw;
    const float *spline, *scaler;
    float *dbase, *dspline, *dscaler;
    bool accumulate;
};

// One thread per (o, i): d base_weight = dW_silu, d spline_weight = dW_spline * scaler,
// d spline_scaler = sum_c dW_spline[c] * spline_weight[c] (c in order).
__global__ void __launch_bounds__(kThreads) kan_fold(Prob P, Fold F) {
    const int64_t E = P.out * P.in, step = (int64_t)gridDim.x * kThreads, C = P.C;
    const int64_t stride = P.out * P.K;
    const bool acc = F.accumulate;
    for (int64_t e = (int64_t)blockIdx.x * kThreads + threadIdx.x; e < E; e += step) {
        const int64_t o = e / P.in, i = e % P.in;
        const float *g = F.part + o * P.K + i * P.cw;
        if (F.dbase) {
            const float v = psum(g, F.Pw, stride);
            F.dbase[e] = acc ? F.dbase[e] + v : v;
        }
        if (F.dspline || F.dscaler) {
            const float s = F.scaler ? F.scaler[e] : 1.0f;
            const float *sw = F.spline + e * C;
            float *d = F.dspline ? F.dspline + e * C : nullptr;
            float sum = 0.0f;
            for (int64_t c = 0; c < C; ++c) {
                const float v = psum(g + 1 + c, F.Pw, stride);
                if (d) d[c] = acc ? d[c] + v * s : v * s;
                sum += v * sw[c];
            }
            if (F.dscaler) F.dscaler[e] = acc ? F.dscaler[e] + sum : sum;
        }
    }
}

// ---- KANLinear's materialised path ------------------------------------------------------------
// Rows [r0, r0 + R), features [f0, f0 + F) of A into [R, F cw] as its 3xTF32 split a (hi) + alo
// (the block of A's columns [f0 cw, (f0 + F) cw), leading dimension F cw): one thread per
// (row, feature) writes the feature's cw columns once each, hi and lo together, in column order
// (SiLU, then its C bases: the window, zeros elsewhere); consecutive threads take consecutive
// features, so a warp writes one contiguous run of the row.
template <int KM>
__global__ void __launch_bounds__(kThreads)
    kan_gen(Prob P, int64_t r0, int64_t R, int64_t f0, int64_t F, float *a, float *alo) {
    const int64_t E = R * F, ld = F * P.cw, step = (int64_t)gridDim.x * kThreads;
    for (int64_t e = (int64_t)blockIdx.x * kThreads + threadIdx.x; e < E; e += step) {
        const int64_t r = e / F, f = f0 + e % F, at = r * ld + (f - f0) * P.cw;
        const float xv = xval<false>(P, r0 + r, f);
        float Nw[KM + 1];
        const int64_t j = kf__bspline_window<KM>(P.grid + f * P.nk, P.inv + f * P.k * P.nk,
                                                 P.nk, P.k, xv, Nw);
        kf__tf32_split(xv / (1.0f + expf(-xv)), a, alo, at);
        const int64_t b0 = j - P.k; // the window's first basis (j < 0: none)
        for (int64_t b = 0; b < P.C; ++b) {
            const int64_t w = b - b0;
            float v = 0.0f;
#pragma unroll
            for (int q = 0; q <= KM; ++q) // Nw indexed by a constant: it stays in registers
                if (j >= 0 && q == w) v = Nw[q];
            kf__tf32_split(v, a, alo, at + 1 + b);
        }
    }
}

// The 3xTF32 split of n floats of src into hi and lo (dy's rows of a chunk).
__global__ void __launch_bounds__(kThreads)
    kan_split(const float *src, int64_t n, float *hi, float *lo) {
    const int64_t step = (int64_t)gridDim.x * kThreads;
    for (int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x; i < n; i += step)
        kf__tf32_split(src[i], hi, lo, i);
}

// dx of rows [r0, r0 + R) from their dA [R, K] (dA = dy W, cuBLAS): one thread per (row, feature).
template <int KM>
__global__ void __launch_bounds__(kThreads)
    kan_dx_rows(Prob P, const float *da, int64_t r0, int64_t R, float *dx) {
    const int64_t E = R * P.in, step = (int64_t)gridDim.x * kThreads;
    for (int64_t e = (int64_t)blockIdx.x * kThreads + threadIdx.x; e < E; e += step) {
        const int64_t r = e / P.in, f = e % P.in;
        dx[(r0 + r) * P.in + f] =
            dx_part<KM, false>(P, r0 + r, f, f * P.cw, (f + 1) * P.cw, da + r * P.K, 0);
    }
}

// ---- host side --------------------------------------------------------------------------------

// Splits `units` of reduction for a grid of `jobs` blocks per split, aiming at one wave of the
// plan's device (kf__split_of).
kf__split split_of(const struct kf_kan_linear_plan *p, int64_t units, int64_t jobs,
                   int64_t minper, int64_t align) {
    return kf__split_of(units, jobs, minper, align, kf__wave_blocks(p->ctx), kMaxSplits);
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

// Whether KANLinear takes the materialised path: at least kDenseOutputs outputs (N out), so that
// an eighth of the rows still gives cuBLAS a product that fills the device.
bool dense_path(const struct kf_kan_linear_plan *p, int64_t N, const kf__kan_patches *pt) {
    return pt == nullptr && N * p->out >= kDenseOutputs;
}

// Rows per chunk of the materialised path: an eighth of N rounded up to 64 (the chunk of A is at
// most an eighth of the bases tensor efficient-kan materialises), at most kChunkFloats / K rows
// (at least 64), then evened out over the chunks that makes.
int64_t dense_rows(int64_t N, int64_t K) {
    int64_t nc = kf__ceil_div(kf__ceil_div(N, 8), kT) * kT;
    const int64_t cap = kChunkFloats / K / kT * kT;
    if (nc > cap) nc = cap > kT ? cap : kT;
    nc = kf__ceil_div(kf__ceil_div(N, kf__ceil_div(N, nc)), kT) * kT;
    return nc < N ? nc : N;
}

Layout make_layout(const struct kf_kan_linear_plan *p, int64_t N, const kf__kan_patches *pt) {
    Layout l = {};
    l.off_inv = kf__sat_floats(p->out, p->K, 1);
    l.off_part = kf__sat_add(l.off_inv, kf__sat_floats(p->in, p->k, p->nk));
    if (dense_path(p, N, pt)) {
        // W (hi), inv, dW [out, K] (backward), W's lo [out, K], one chunk of A (hi; or of dA)
        // and of A's lo (backward: [Nc, K]; forward: [N, Fc cw]), one chunk of dy's hi and lo
        // [Nc, out] (backward). The forward's chunks take whole rows and Fc features, the same
        // number of floats or fewer, so that each product has all N rows (a chunk of rows left
        // most of the device idle on the tensor cores: 64 output tiles of 128 x 128 at 1024 x 1024).
        l.Nc = dense_rows(N, p->K);
        l.Fc = l.Nc * p->in / N;
        if (l.Fc < 1) l.Fc = 1;
        const int64_t na = l.Nc * p->K > N * l.Fc * p->cw ? l.Nc * p->K : N * l.Fc * p->cw;
        l.off_wlo = kf__sat_add(l.off_part, kf__sat_floats(p->out, p->K, 1));
        l.off_a = kf__sat_add(l.off_wlo, kf__sat_floats(p->out, p->K, 1));
        l.off_alo = kf__sat_add(l.off_a, kf__sat_floats(na, 1, 1));
        l.off_dyh = kf__sat_add(l.off_alo, kf__sat_floats(na, 1, 1));
        l.off_dyl = kf__sat_add(l.off_dyh, kf__sat_floats(l.Nc, p->out, 1));
        l.bytes = kf__sat_add(l.off_dyl, kf__sat_floats(l.Nc, p->out, 1));
        return l;
    }
    const int64_t cw = p->cw;
    l.rt = kf__ceil_div(N, kT);
    l.ot = kf__ceil_div(p->out, kT);
    l.FB = cw <= kT ? kT / cw : 1;
    if (l.FB > p->in) l.FB = p->in;
    l.tpg = cw <= kT ? 1 : kf__ceil_div(cw, kT);
    l.groups = kf__ceil_div(p->in, l.FB);
    l.f = split_of(p, p->in, l.rt * l.ot, kf__ceil_div(kMinSplit, cw), 1);
    l.w = split_of(p, N, l.ot * l.groups * l.tpg, kMinSplit, kT);
    const size_t fwd = l.f.P > 1 ? kf__sat_floats(l.f.P, N, p->out) : 0;
    const size_t bwd = kf__sat_floats(l.w.P, p->out, p->K);
    size_t big = fwd > bwd ? fwd : bwd;
    if (pt) {
        // dXcol for Bg whole images: as many as fit in kDcolFloats, at least one, at most B.
        const int64_t per = pt->Ho * pt->Wo * p->in; // floats of one image's dXcol
        l.Bg = per >= kDcolFloats ? 1 : kDcolFloats / per;
        if (l.Bg > pt->B) l.Bg = pt->B;
        if (l.Bg < 1) l.Bg = 1;
        const size_t dcol = kf__sat_floats(l.Bg, per, 1);
        if (dcol > big) big = dcol;
    }
    l.bytes = kf__sat_add(l.off_part, big);
    return l;
}

// The records' untyped tensors as float32, the one dtype this file's kernels see (kan_select gives
// every other dtype cuda/plain.cu's table at plan creation).
const float *f32(const void *t) { return static_cast<const float *>(t); }
float *f32(void *t) { return static_cast<float *>(t); }

Prob make_prob(const struct kf_kan_linear_plan *p, int64_t N, const kf__kan_patches *pt,
               const float *x, const float *grid, void *ws) {
    Prob P;
    P.N = N; P.in = p->in; P.out = p->out; P.K = p->K; P.C = p->C; P.nk = p->nk; P.cw = p->cw;
    P.k = p->k;
    P.x = x; P.grid = grid;
    P.W = kf__at<float>(ws, 0);
    P.inv = nullptr;
    P.g = Geom{};
    if (pt) {
        P.g.Cin = pt->Cin; P.g.H = pt->H; P.g.W = pt->W; P.g.Ho = pt->Ho; P.g.Wo = pt->Wo;
        P.g.HoWo = pt->Ho * pt->Wo;
        P.g.kh = pt->kh; P.g.kw = pt->kw; P.g.sh = pt->sh; P.g.sw = pt->sw;
        P.g.ph = pt->ph; P.g.pw = pt->pw; P.g.dh = pt->dh; P.g.dw = pt->dw;
    }
    return P;
}

// Blocks of a grid-stride launch over E elements.
unsigned stride_blocks(int64_t E) {
    const int64_t b = kf__ceil_div(E, kThreads);
    return (unsigned)(b < 1 ? 1 : b > 8192 ? 8192 : b);
}


kf_status launch_prep(kf_context *ctx, const char *fn, const Prob &P, const float *base,
                      const float *spline, const float *scaler, void *ws, const Layout &l,
                      bool pack) {
    const int64_t E = (pack ? P.out * P.K : 0) + P.in * P.k * P.nk;
    if (E == 0) return KF_OK;
    kan_prep<<<stride_blocks(E), kThreads, 0, kf__stream(ctx)>>>(
        P, base, spline, scaler, kf__at<float>(ws, 0),
        l.Nc > 0 ? kf__at<float>(ws, l.off_wlo) : nullptr, kf__at<float>(ws, l.off_inv), pack);
    KF__CUDA_LAUNCH_CHECK(fn, "kan_prep");
    return KF_OK;
}

template <int KM, bool CONV>
kf_status forward_km(kf_context *ctx, const char *fn, const Layout &l, const Prob &P, float *y,
                     float *part) {
    unsigned g = 0;
    KF_TRY(kf__grid_of(fn, l.rt * l.ot * l.f.P, &g));
    kan_fwd<KM, CONV><<<g, kThreads, 0, kf__stream(ctx)>>>(P, y, part, l.ot, l.f.P, l.f.per);
    KF__CUDA_LAUNCH_CHECK(fn, "kan_fwd");
    if (l.f.P > 1) {
        const int64_t E = P.N * P.out;
        kan_sum<<<stride_blocks(E), kThreads, 0, kf__stream(ctx)>>>(part, l.f.P, E, y);
        KF__CUDA_LAUNCH_CHECK(fn, "kan_sum");
    }
    return KF_OK;
}

// dx. KANLinear: kan_dx over all rows, straight into dx. KANConv2d: per group of Bg whole
// images, kan_dx into dXcol (`part`, free until kan_dw) and kan_col2im from it into the group's
// images of dx; stream order keeps a group's gather before the next group's kan_dx.
template <int KM, bool CONV>
kf_status dx_km(kf_context *ctx, const char *fn, const Layout &l, const Prob &P,
                const kf__kan_bwd *c, float *part) {
    unsigned g = 0;
    if (!CONV) {
        KF_TRY(kf__grid_of(fn, l.rt * l.groups, &g));
        kan_dx<KM, false><<<g, kThreads, 0, kf__stream(ctx)>>>(P, f32(c->dy), f32(c->dx),
                                                               l.groups, l.FB, 0, P.N);
        KF__CUDA_LAUNCH_CHECK(fn, "kan_dx");
        return KF_OK;
    }
    const int64_t B = c->patches->B;
    for (int64_t b0 = 0; b0 < B; b0 += l.Bg) {
        const int64_t nb = B - b0 < l.Bg ? B - b0 : l.Bg, R = nb * P.g.HoWo;
        KF_TRY(kf__grid_of(fn, kf__ceil_div(R, kT) * l.groups, &g));
        kan_dx<KM, true><<<g, kThreads, 0, kf__stream(ctx)>>>(P, f32(c->dy), part, l.groups,
                                                              l.FB, b0 * P.g.HoWo, R);
        KF__CUDA_LAUNCH_CHECK(fn, "kan_dx");
        kan_col2im<<<stride_blocks(nb * P.g.Cin * P.g.H * P.g.W), kThreads, 0,
                     kf__stream(ctx)>>>(P, part, b0, nb, f32(c->dx));
        KF__CUDA_LAUNCH_CHECK(fn, "kan_col2im");
    }
    return KF_OK;
}

// kan_fold from the Pw partials of dW at `part` into the call's weight gradients.
kf_status launch_fold(kf_context *ctx, const char *fn, const Prob &P, const kf__kan_bwd *c,
                      const float *part, int64_t Pw) {
    Fold F;
    F.part = part; F.Pw = Pw;
    F.spline = f32(c->spline); F.scaler = f32(c->scaler);
    F.dbase = f32(c->dbase); F.dspline = f32(c->dspline); F.dscaler = f32(c->dscaler);
    F.accumulate = c->accumulate;
    kan_fold<<<stride_blocks(P.out * P.in), kThreads, 0, kf__stream(ctx)>>>(P, F);
    KF__CUDA_LAUNCH_CHECK(fn, "kan_fold");
    return KF_OK;
}

template <int KM, bool CONV>
kf_status backward_km(kf_context *ctx, const char *fn, const Layout &l, const Prob &P,
                      const kf__kan_bwd *c, float *part) {
    unsigned g = 0;
    if (c->dx) KF_TRY((dx_km<KM, CONV>(ctx, fn, l, P, c, part)));
    if (c->dbase || c->dspline || c->dscaler) {
        const int64_t ct_n = l.groups * l.tpg;
        KF_TRY(kf__grid_of(fn, l.ot * ct_n * l.w.P, &g));
        kan_dw<KM, CONV><<<g, kThreads, 0, kf__stream(ctx)>>>(P, f32(c->dy), part, ct_n, l.FB,
                                                               l.tpg, l.w.P, l.w.per);
        KF__CUDA_LAUNCH_CHECK(fn, "kan_dw");
        KF_TRY(launch_fold(ctx, fn, P, c, part, l.w.P));
    }
    return KF_OK;
}

// The materialised path's buffers in the workspace (Layout's offsets).
struct Dense {
    const float *wlo; // W's 3xTF32 low part (P.W holds the high part)
    float *a, *alo;   // a chunk of A [Nc, K] (hi, lo); backward reuses `a` for dA
    float *dyh, *dyl; // a chunk of dy [Nc, out] (hi, lo)
};

Dense dense_buffers(const Layout &l, void *ws) {
    return Dense{kf__at<float>(ws, l.off_wlo), kf__at<float>(ws, l.off_a),
                 kf__at<float>(ws, l.off_alo), kf__at<float>(ws, l.off_dyh),
                 kf__at<float>(ws, l.off_dyl)};
}

// The materialised path's block of A (rows [r0, r0 + R), features [f0, f0 + F)) into d.a, d.alo
// (kan_gen).
template <int KM>
kf_status launch_gen(kf_context *ctx, const char *fn, const Prob &P, int64_t r0, int64_t R,
                     int64_t f0, int64_t F, const Dense &d) {
    kan_gen<KM><<<stride_blocks(R * F), kThreads, 0, kf__stream(ctx)>>>(P, r0, R, f0, F, d.a,
                                                                         d.alo);
    KF__CUDA_LAUNCH_CHECK(fn, "kan_gen");
    return KF_OK;
}

// The materialised path's forward: per chunk of Fc features (all rows), that block of A into the
// workspace (kan_gen) and y (+)= A[:, chunk] W[:, chunk]^T on cuBLAS in 3xTF32 (kf__gemm_3xtf32:
// fp32 accuracy on the tensor cores; beta 1 after the first chunk: chunk order).
template <int KM>
kf_status forward_dense(kf_context *ctx, const char *fn, const Layout &l, const Prob &P,
                        float *y, const Dense &d) {
    for (int64_t f0 = 0; f0 < P.in; f0 += l.Fc) {
        const int64_t F = P.in - f0 < l.Fc ? P.in - f0 : l.Fc, kc = F * P.cw, c0 = f0 * P.cw;
        KF_TRY(launch_gen<KM>(ctx, fn, P, 0, P.N, f0, F, d));
        KF_TRY(kf__gemm_3xtf32(ctx, fn, false, true, P.N, P.out, kc, d.a, d.alo, kc, P.W + c0,
                               d.wlo + c0, P.K, f0 == 0 ? 0.0f : 1.0f, y, P.out));
    }
    return KF_OK;
}

// The materialised path's backward, per chunk of Nc rows in stream order: dy[chunk]'s split
// (kan_split); A (kan_gen) and dW (+)= dy[chunk]^T A (cuBLAS, beta 1 after the first chunk: chunk
// order) when a weight gradient is wanted; then dA = dy[chunk] W over A's buffer (A is consumed
// by then) and kan_dx_rows when dx is wanted. Every product in 3xTF32. Last, kan_fold from dW
// (one partial).
template <int KM>
kf_status backward_dense(kf_context *ctx, const char *fn, const Layout &l, const Prob &P,
                         const kf__kan_bwd *c, float *dw, const Dense &d) {
    const bool wgrad = c->dbase || c->dspline || c->dscaler;
    const float *dy = f32(c->dy);
    for (int64_t r0 = 0; r0 < P.N; r0 += l.Nc) {
        const int64_t R = P.N - r0 < l.Nc ? P.N - r0 : l.Nc;
        kan_split<<<stride_blocks(R * P.out), kThreads, 0, kf__stream(ctx)>>>(
            dy + r0 * P.out, R * P.out, d.dyh, d.dyl);
        KF__CUDA_LAUNCH_CHECK(fn, "kan_split");
        if (wgrad) {
            KF_TRY(launch_gen<KM>(ctx, fn, P, r0, R, 0, P.in, d));
            KF_TRY(kf__gemm_3xtf32(ctx, fn, true, false, P.out, P.K, R, d.dyh, d.dyl, P.out, d.a,
                                   d.alo, P.K, r0 == 0 ? 0.0f : 1.0f, dw, P.K));
        }
        if (c->dx) {
            KF_TRY(kf__gemm_3xtf32(ctx, fn, false, false, R, P.K, P.out, d.dyh, d.dyl, P.out, P.W,
                                   d.wlo, P.K, 0.0f, d.a, P.K));
            kan_dx_rows<KM><<<stride_blocks(R * P.in), kThreads, 0, kf__stream(ctx)>>>(
                P, d.a, r0, R, f32(c->dx));
            KF__CUDA_LAUNCH_CHECK(fn, "kan_dx_rows");
        }
    }
    return wgrad ? launch_fold(ctx, fn, P, c, dw, 1) : KF_OK;
}

} // namespace

namespace {

// Float32 on the kernels above, their window unrolled up to KM (>= the plan's order): the
// entries of the float32 tables, one per KM.
size_t kan_workspace(const struct kf_kan_linear_plan *p, int64_t N,
                     const kf__kan_patches *patches) {
    return make_layout(p, N, patches).bytes;
}

template <int KM> kf_status kan_forward(kf_context *ctx, const kf__kan_fwd *c) {
    const kf__kan_patches *pt = c->patches;
    const char *fn = pt ? "kf_kan_conv2d_forward" : "kf_kan_linear_forward";
    const struct kf_kan_linear_plan *p = c->plan;
    if (c->N <= 0) return KF_OK;
    const Layout l = make_layout(p, c->N, pt);
    KF__CUDA_ON_DEVICE(fn, ctx);
    Prob P = make_prob(p, c->N, pt, f32(c->x), f32(c->grid), c->ws);
    P.inv = kf__at<float>(c->ws, l.off_inv);
    KF_TRY(launch_prep(ctx, fn, P, f32(c->base), f32(c->spline), f32(c->scaler), c->ws, l, true));
    float *part = kf__at<float>(c->ws, l.off_part);
    if (l.Nc > 0) return forward_dense<KM>(ctx, fn, l, P, f32(c->y), dense_buffers(l, c->ws));
    if (pt) return forward_km<KM, true>(ctx, fn, l, P, f32(c->y), part);
    return forward_km<KM, false>(ctx, fn, l, P, f32(c->y), part);
}

template <int KM> kf_status kan_backward(kf_context *ctx, const kf__kan_bwd *c) {
    const kf__kan_patches *pt = c->patches;
    const char *fn = pt ? "kf_kan_conv2d_backward" : "kf_kan_linear_backward";
    const struct kf_kan_linear_plan *p = c->plan;
    if (c->dx == nullptr && c->dbase == nullptr && c->dspline == nullptr &&
        c->dscaler == nullptr)
        return KF_OK;
    if (c->N <= 0) return KF_OK;
    const Layout l = make_layout(p, c->N, pt);
    KF__CUDA_ON_DEVICE(fn, ctx);
    Prob P = make_prob(p, c->N, pt, f32(c->x), f32(c->grid), c->ws);
    P.inv = kf__at<float>(c->ws, l.off_inv);
    KF_TRY(launch_prep(ctx, fn, P, f32(c->base), f32(c->spline), f32(c->scaler), c->ws, l,
                       c->dx != nullptr));
    float *part = kf__at<float>(c->ws, l.off_part);
    if (l.Nc > 0) return backward_dense<KM>(ctx, fn, l, P, c, part, dense_buffers(l, c->ws));
    if (pt) return backward_km<KM, true>(ctx, fn, l, P, c, part);
    return backward_km<KM, false>(ctx, fn, l, P, c, part);
}

const kf__kan_ops kan_ops_k3 = {nullptr, kan_workspace, kan_forward<3>, kan_backward<3>};
const kf__kan_ops kan_ops_kmax = {nullptr, kan_workspace, kan_forward<kMaxOrder>,
                                  kan_backward<kMaxOrder>};

// The plan's table, once, at its creation: float32 on the kernels above (orders up to 3 on the
// window unrolled to 3, the rest up to kMaxOrder); float64, bfloat16 and float16 on cuda/plain.cu
// (the low types' products on the tensor cores; not under core/lowp_ops.c's conversions);
// spline orders above kMaxOrder (cuda/plain.cuh has the same bound) are refused.
static_assert(kMaxOrder == kf_plain::kPlainMaxOrder, "one spline-order bound for every dtype");
kf_status kan_select(const struct kf_kan_linear_plan *p, const char *fn, const kf__kan_ops **ops) {
    KF_TRY(kf__cuda_dtype_supported(p->dtype, fn));
    if (p->k > kMaxOrder)
        return kf__error(KF_ERR_UNSUPPORTED, fn,
                         "desc->spline_order = %d: the CUDA backend supports spline orders up to "
                         "%d", (int)p->k, kMaxOrder);
    if (p->dtype != KF_DTYPE_F32) *ops = kf__cuda_kan_plain_ops(p->dtype);
    else *ops = p->k <= 3 ? &kan_ops_k3 : &kan_ops_kmax;
    return KF_OK;
}

} // namespace

extern "C" const kf__kan_ops kf__cuda_kan_ops = {kan_select, nullptr, nullptr, nullptr};

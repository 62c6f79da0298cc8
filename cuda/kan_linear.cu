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
#include "kan_cuda.cuh"

namespace kf_kan {

namespace {

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

// Splits `units` of reduction for a grid of `jobs` blocks per split, aiming at one wave of the
// plan's device (kf__split_of).
kf__split split_of(const struct kf_kan_linear_plan *p, int64_t units, int64_t jobs,
                   int64_t minper, int64_t align) {
    return kf__split_of(units, jobs, minper, align, kf__wave_blocks(p->ctx), kMaxSplits);
}

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

} // namespace

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

Dense dense_buffers(const Layout &l, void *ws) {
    return Dense{kf__at<float>(ws, l.off_wlo), kf__at<float>(ws, l.off_a),
                 kf__at<float>(ws, l.off_alo), kf__at<float>(ws, l.off_dyh),
                 kf__at<float>(ws, l.off_dyl)};
}

} // namespace kf_kan

namespace {

using namespace kf_kan;

// Float32 on the kernels of cuda/kan_fwd.cu, kan_bwd.cu and kan_dense.cu, their window unrolled
// up to KM (>= the plan's order): the entries of the float32 tables, one per KM.
// The tiled kernels' need, or for KANLinear the plain path's where larger (its float32 instance
// runs the calls at a derivative order or with an input weight).
size_t kan_workspace(const struct kf_kan_linear_plan *p, int64_t N,
                     const kf__kan_patches *patches) {
    const size_t tiled = make_layout(p, N, patches).bytes,
                 plain = patches ? 0 : kf__cuda_kan_plain_ops(KF_DTYPE_F32)->workspace(p, N, NULL);
    return tiled > plain ? tiled : plain;
}

template <int KM> kf_status kan_forward(kf_context *ctx, const kf__kan_fwd *c) {
    if (c->order != 0 || c->w) return kf__cuda_kan_plain_ops(KF_DTYPE_F32)->forward(ctx, c);
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
    if (c->order != 0 || c->w || c->dw)
        return kf__cuda_kan_plain_ops(KF_DTYPE_F32)->backward(ctx, c);
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

// The plan's table, once, at its creation: float32 on the tiled or materialised kernels (orders
// up to 3 on the window unrolled to 3, the rest up to kMaxOrder); float64, bfloat16 and float16
// on cuda/plain.cu (the low types' products on the tensor cores; not under core/lowp_ops.c's
// conversions); spline orders above kMaxOrder (cuda/plain.cuh has the same bound) are refused.
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

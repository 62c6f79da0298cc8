// SKLinear (Panther's sketched linear layer) on CUDA: forward and backward through the 2r-wide
// bottleneck, r = L*k (math: docs/ops/sklinear.md; notation and records: core/sklinear_backend.h).
// Row-major throughout; fp32 operands and fp32 accumulation; no atomics, every sum in a fixed
// order; no allocation, no synchronisation, no host reads of device data: everything is enqueued
// on ctx->stream (graph-capturable).
//
//   W1 [in, 2r] = [S1_1..S1_L | U2_1..U2_L]   read in place: column j < r is term j/k, column
//                                              j%k of S1s; column r+j the same of U2s
//   W2 [2r, out] = [U1; S2]                    U1s and S2s read in place as [r, out]
//   Z = x W1,  y = Z W2 / (2L) + bias
//
// All kernels are built on one block-tile engine (tile_mma / tile_finish, cuda/sklinear_tile.cuh):
// 256 threads compute a 16-row x 32*CW-column tile, CW in {1, 2, 4, 8}; the 8 warps are CW column
// groups x KS = 8/CW k-slices, each warp owning a 16x32 sub-tile (4x4 per thread) over its own
// k-slice of every stage, and the KS partial tiles are summed through shared memory in slice order.
// Each stage holds A [16, BK] and B [BK, 32*CW] in shared memory, BK = 16*KS; the next stage's
// global loads are issued into registers before the current stage's products (one-stage prefetch).
// Every operand load is bounds-checked (rows, columns and k), so no extent needs to be a multiple
// of anything.
//
// Forward, two paths (the rule depends on the shape only, so workspace_size agrees with it):
//  * fused, ONE launch (skl_fwd_fused), when 2r <= 256 and in * RP <= 32768 (RP = 2r rounded up
//    to 32, 64, 128 or 256: W1 is at most 128 KB): a block owns 16 rows of x and one or more
//    256-wide column tiles of y. It computes its Z tile [16, RP] over all of `in` into shared
//    memory, then each y tile from it; Z never leaves the chip. Blocks of the same rows but
//    other column tiles recompute the Z tile, which the bound on in * RP keeps cheap. When
//    16-row tiles alone fill the GPU (large N), a block takes several column tiles so that Z is
//    computed fewer times.
//  * split, TWO launches otherwise (large `in`, or 2r > 256): skl_zpart computes partial Z tiles
//    over P chunks of `in` (split-K) into the workspace, [P, N, 2r]; skl_fwd_y sums the P
//    partials of its rows (in p order) while loading its A tile and writes y + bias. 2r > 256
//    runs the same kernels with column tiles of 256 (skl_zpart tiles the 2r columns;
//    skl_fwd_y's reduction dimension is 2r, streamed in stages), so there is no separate path
//    and no cuBLAS call.
//
// Backward, two launches (three when the weight gradients are split over rows):
//  1. skl_zpart: split-K partials of dZ = dy W2^T / (2L) [Pdz, N, 2r] (K = out; when dx or dS1s
//     is wanted) and of Z2 = x U2 [Pz2, N, r] (K = in, the bottleneck's second half recomputed
//     from x; when dS2s is wanted), both problems in one grid.
//  2. skl_bwd_main, one grid of three job kinds, each summing the partials it reads in p order:
//       dx   [N, in]  = dZ W1^T                      (tiles 16 rows x 256 features)
//       dS1s [in, r]  = x^T dZ[:, :r], computed as its transpose [r, in] (16 x 256 tiles)
//                       and scattered into the [L, in, k] layout
//       dS2s [r, out] = Z2^T dy / (2L) (16 x 256 tiles); the tiles of rows 0..15 also sum
//                       dbias = column sums of dy from the dy stages already in shared memory
//     The weight gradients reduce over N; when N is large the N rows are split into Pw chunks,
//     partial results go to the workspace and
//  3. skl_wreduce sums them in chunk order and writes or accumulates dS1s, dS2s, dbias.
//     With Pw = 1 (N <= 256 always) step 2 writes or accumulates them directly.
//
// Split counts are a function of the shape and the device's SM count (so are the workspace size
// and the bits: the same on every GPU with that many SMs): enough splits that a grid fills about
// one wave, kf__wave_blocks (one block per SM is what these kernels' 170-240 registers per
// thread allow), at least kMinSplit of K per split, at most kMaxSplits.
// Workspace (bytes, each buffer 64-byte aligned), the larger of
//   forward  (split path only)  Pf * N * 2r * 4
//   backward                    Pdz * N * 2r * 4 + Pz2 * N * r * 4
//                               + (Pw > 1 ? Pw * (r * in + r * out + out) * 4 : 0).
//
// Files: this one (the layout, skl_zpart, the op table), cuda/sklinear_fwd.cu (forward),
// cuda/sklinear_bwd.cu (backward), cuda/sklinear.cuh (their records), cuda/sklinear_tile.cuh
// (the block-tile engine).

#include "sklinear.cuh"

namespace kf_skl {
namespace {

constexpr int64_t kMinSplit = 256;       // at least this much K per split
constexpr int64_t kMaxSplits = 64;       // at most this many partials to sum
constexpr int64_t kSplitAlign = 128;     // split boundaries at multiples of the largest BK
constexpr int64_t kFusedMaxW1 = 32768;   // fused forward when in * RP <= this (W1 <= 128 KB)

// Split-K partial bottlenecks. Jobs [0, px.jobs): x W1[:, col_base + c] (forward Z, backward
// Z2); then pd.jobs jobs of dy W2^T (backward dZ).
template <int CW>
__global__ void __launch_bounds__(kThreads) skl_zpart(Net a, const float *dy, PartJob px,
                                                      PartJob pd) {
    using TX = Tile<CW, false, false>;
    using TD = Tile<CW, false, true>;
    __shared__ __align__(16) float smem[cmax(TX::FLOATS, TD::FLOATS)];

    int64_t job = blockIdx.x;
    const bool isx = job < px.jobs;
    if (!isx) job -= px.jobs;
    const PartJob pj = isx ? px : pd;
    const int64_t per = pj.P * pj.RC, rt = job / per, p = job % per / pj.RC, rc = job % pj.RC;
    const int64_t m0 = rt * kBM, N = a.N;
    const int c0 = (int)rc * TX::BN, ncols = pj.ncols;
    const int64_t kbeg = p * pj.KC, kend = kbeg + pj.KC < pj.K ? kbeg + pj.KC : pj.K;
    float *dst = pj.part + p * N * ncols;
    const float scale = pj.scale;
    auto out = [=](int m, int c, float v) {
        const int64_t row = m0 + m;
        if (row < N && c0 + c < ncols) dst[row * ncols + c0 + c] = v * scale;
    };
    float acc[4][4];
    zero(acc);
    if (isx) {
        const int64_t in = a.in;
        const int k = a.k;
        const float *x = a.x;
        const int n = (int)threadIdx.x % TX::BN; // this thread's B column (Tile)
        const float *wc = c0 + n < ncols ? w1_col(a, pj.col_base + c0 + n) : nullptr;
        auto al = [=](int m, int64_t kk) { return m0 + m < N ? x[(m0 + m) * in + kk] : 0.0f; };
        auto bl = [=](int64_t kk, int) { return wc != nullptr ? wc[kk * k] : 0.0f; };
        tile_mma<TX, false>(acc, al, bl, kbeg, kend, smem, NoHook(), nullptr, 0);
        tile_finish<TX>(acc, smem, out);
    } else {
        const int64_t ld = a.out;
        auto al = [=](int m, int64_t o) { return m0 + m < N ? dy[(m0 + m) * ld + o] : 0.0f; };
        auto bl = [=, &a](int64_t o, int c) {
            return c0 + c < ncols ? w2_row(a, c0 + c)[o] : 0.0f;
        };
        tile_mma<TD, false>(acc, al, bl, kbeg, kend, smem, NoHook(), nullptr, 0);
        tile_finish<TD>(acc, smem, out);
    }
}

int cw_for(int64_t cols) { return cols <= 32 ? 1 : cols <= 64 ? 2 : cols <= 128 ? 4 : 8; }

// Splits of K for a grid that has `jobs` blocks per split, aiming at `target` blocks.
kf__split split_k(int64_t K, int64_t jobs, int64_t target) {
    return kf__split_of(K, jobs, kMinSplit, kSplitAlign, target, kMaxSplits);
}

template <int CW>
kf_status launch_zpart(kf_context *ctx, const char *fn, const Net &a, const float *dy,
                       const PartJob &px, const PartJob &pd) {
    unsigned g = 0;
    KF_TRY(kf__grid_of(fn, px.jobs + pd.jobs, &g));
    skl_zpart<CW><<<g, kThreads, 0, kf__stream(ctx)>>>(a, dy, px, pd);
    KF__CUDA_LAUNCH_CHECK(fn, "skl_zpart");
    return KF_OK;
}

} // namespace

Layout make_layout(const struct kf_sklinear_plan *p, int64_t N) {
    Layout l = {};
    const int64_t target = kf__wave_blocks(p->ctx);
    l.N = N; l.in = p->in; l.out = p->out; l.r = p->r; l.R = 2 * p->r;
    l.rt = kf__ceil_div(N, kBM);
    l.rtr = kf__ceil_div(l.r, kBM);
    l.ct_in = kf__ceil_div(l.in, kWide);
    l.ct_out = kf__ceil_div(l.out, kWide);
    l.cw = cw_for(l.R);
    l.bn = 32 * l.cw;

    // Forward path (see the top of the file).
    l.fused = l.R <= 256 && l.in * l.bn <= kFusedMaxW1;
    l.rc_f = kf__ceil_div(l.R, l.bn);
    if (l.fused) {
        int64_t cpb = l.rt * l.ct_out / target;
        l.cpb = cpb < 1 ? 1 : cpb > l.ct_out ? l.ct_out : cpb;
        l.groups = kf__ceil_div(l.ct_out, l.cpb);
        l.fz = kf__split{1, l.in};
        l.fwd_bytes = 0;
    } else {
        l.fz = split_k(l.in, l.rt * l.rc_f, target);
        l.fwd_bytes = kf__sat_floats(l.fz.P, N, l.R);
    }

    // Backward.
    l.rc_dz = kf__ceil_div(l.R, l.bn);
    l.rc_z2 = kf__ceil_div(l.r, l.bn);
    // dZ and Z2 share one grid: each aims for half of it.
    l.dz = split_k(l.out, 2 * l.rt * l.rc_dz, target);
    l.z2 = split_k(l.in, 2 * l.rt * l.rc_z2, target);
    l.w = split_k(N, l.rtr * (l.ct_in + l.ct_out), target);
    size_t o = kf__sat_floats(l.dz.P, N, l.R);
    l.off_z2 = o;
    o = kf__sat_add(o, kf__sat_floats(l.z2.P, N, l.r));
    if (l.w.P > 1) {
        l.off_w1 = o;
        o = kf__sat_add(o, kf__sat_floats(l.w.P, l.r, l.in));
        l.off_w2 = o;
        o = kf__sat_add(o, kf__sat_floats(l.w.P, l.r, l.out));
        l.off_wb = o;
        o = kf__sat_add(o, kf__sat_floats(l.w.P, 1, l.out));
    }
    l.off_g = o;
    if (p->act != KF_ACTIVATION_NONE || p->dropout > 0.0f)
        o = kf__sat_add(o, kf__sat_floats(1, N, l.out));
    l.bwd_bytes = o;
    return l;
}

Net make_net(const struct kf_sklinear_plan *p, int64_t N, const void *x, const void *S1,
             const void *S2, const void *U1, const void *U2) {
    Net a;
    a.N = N; a.in = p->in; a.out = p->out;
    a.r = (int)p->r; a.R = (int)(2 * p->r); a.k = p->k;
    a.inv = (float)(1.0 / (2.0 * (double)p->L));
    a.x = static_cast<const float *>(x);
    a.S1 = static_cast<const float *>(S1);
    a.S2 = static_cast<const float *>(S2);
    a.U1 = static_cast<const float *>(U1);
    a.U2 = static_cast<const float *>(U2);
    return a;
}

kf_status run_zpart(kf_context *ctx, const char *fn, int cw, const Net &a, const float *dy,
                    const PartJob &px, const PartJob &pd) {
    if (px.jobs + pd.jobs == 0) return KF_OK;
    switch (cw) {
    case 1: return launch_zpart<1>(ctx, fn, a, dy, px, pd);
    case 2: return launch_zpart<2>(ctx, fn, a, dy, px, pd);
    case 4: return launch_zpart<4>(ctx, fn, a, dy, px, pd);
    default: return launch_zpart<8>(ctx, fn, a, dy, px, pd);
    }
}

// An idle problem for skl_zpart.
PartJob no_part() {
    PartJob j = {};
    j.P = j.KC = j.RC = j.K = 1;
    return j;
}

namespace {

size_t skl_workspace(const struct kf_sklinear_plan *p, int64_t N) {
    const Layout l = make_layout(p, N);
    return l.fwd_bytes > l.bwd_bytes ? l.fwd_bytes : l.bwd_bytes;
}

const kf__skl_ops skl_ops_f32 = {nullptr, skl_workspace, skl_forward, skl_backward};

// Chosen once, at plan creation: float32 on the kernels above; float64, bfloat16 and float16 on
// cuda/plain.cu (the low types' products on the tensor cores).
kf_status skl_select(const struct kf_sklinear_plan *p, const char *fn, const kf__skl_ops **ops) {
    KF_TRY(kf__cuda_dtype_supported(p->dtype, fn));
    *ops = p->dtype == KF_DTYPE_F32 ? &skl_ops_f32 : kf__cuda_skl_plain_ops(p->dtype);
    return KF_OK;
}

} // namespace
} // namespace kf_skl

extern "C" const kf__skl_ops kf__cuda_skl_ops = {kf_skl::skl_select, nullptr, nullptr, nullptr};

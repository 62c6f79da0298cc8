// KANLinear and KANConv2d on CUDA, the tiled forward (cuda/kan_linear.cu's header comment):
// kan_fwd's y tiles over feature ranges, and kan_sum over the split-K partials.
#include "kan_cuda.cuh"

namespace kf_kan {

namespace {

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

} // namespace

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

template kf_status forward_km<3, false>(kf_context *, const char *, const Layout &,
                                        const Prob &, float *, float *);
template kf_status forward_km<3, true>(kf_context *, const char *, const Layout &,
                                       const Prob &, float *, float *);
template kf_status forward_km<kMaxOrder, false>(kf_context *, const char *, const Layout &,
                                                const Prob &, float *, float *);
template kf_status forward_km<kMaxOrder, true>(kf_context *, const char *, const Layout &,
                                               const Prob &, float *, float *);

} // namespace kf_kan

// KANLinear on CUDA, the materialised path (cuda/kan_linear.cu's header comment): A generated a
// chunk at a time into the workspace (kan_gen), every product on cuBLAS in 3xTF32.
#include "kan_cuda.cuh"

namespace kf_kan {

namespace {

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

} // namespace

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

template kf_status forward_dense<3>(kf_context *, const char *, const Layout &, const Prob &,
                                    float *, const Dense &);
template kf_status forward_dense<kMaxOrder>(kf_context *, const char *, const Layout &,
                                            const Prob &, float *, const Dense &);
template kf_status backward_dense<3>(kf_context *, const char *, const Layout &, const Prob &,
                                     const kf__kan_bwd *, float *, const Dense &);
template kf_status backward_dense<kMaxOrder>(kf_context *, const char *, const Layout &,
                                             const Prob &, const kf__kan_bwd *, float *,
                                             const Dense &);

} // namespace kf_kan

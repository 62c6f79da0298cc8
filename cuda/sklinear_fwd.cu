// SKLinear's float32 forward on CUDA: the fused path (skl_fwd_fused, one launch) and the split
// path (skl_zpart's partials, then skl_fwd_y), as the top of cuda/sklinear.cu describes them.
#include "sklinear.cuh"

namespace kf_skl {
namespace {

Epi make_epi(const kf__skl_fwd *c) {
    const Epi e = {c->plan->act, c->epi.p, kf__dropout_scale_s(c->epi.p), c->epi.seed,
                   c->epi.offset, static_cast<float *>(c->pre)};
    return e;
}

// Fused forward (one launch): Z tile of 16 rows in shared memory, then y tiles from it.
template <int CW>
__global__ void __launch_bounds__(kThreads)
    skl_fwd_fused(Net a, const float *bias, float *y, Epi e, int64_t groups, int64_t cpb,
                  int64_t coltiles) {
    using T1 = Tile<CW, false, false>;
    using T2 = Tile<8, false, false>;
    constexpr int RP = T1::BN, LDZ = RP + 1;
    constexpr int REGION = (cmax(T1::FLOATS, T2::FLOATS) + 3) / 4 * 4;
    __shared__ __align__(16) float smem[REGION + kBM * LDZ];
    float *Zs = smem + REGION;

    const int64_t blk = blockIdx.x, rt = blk / groups, g = blk % groups, m0 = rt * kBM;
    const int64_t N = a.N, in = a.in, out = a.out;
    const int k = a.k, R = a.R;
    const float *x = a.x;
    const float inv = a.inv;
    float acc[4][4];

    zero(acc);
    {
        const int n = (int)threadIdx.x % T1::BN; // this thread's B column (Tile)
        const float *wc = n < R ? w1_col(a, n) : nullptr;
        auto al = [=](int m, int64_t kk) { return m0 + m < N ? x[(m0 + m) * in + kk] : 0.0f; };
        auto bl = [=](int64_t kk, int) { return wc != nullptr ? wc[kk * k] : 0.0f; };
        tile_mma<T1, false>(acc, al, bl, 0, in, smem, NoHook(), nullptr, 0);
        tile_finish<T1>(acc, smem, [=](int m, int c, float v) { Zs[m * LDZ + c] = v; });
    }
    __syncthreads(); // Zs complete (columns >= 2r hold 0: their W1 loads were 0)

    const int64_t ct_end = (g + 1) * cpb < coltiles ? (g + 1) * cpb : coltiles;
    for (int64_t ct = g * cpb; ct < ct_end; ++ct) {
        const int64_t o0 = ct * T2::BN;
        zero(acc);
        auto bl = [=, &a](int64_t j, int c) {
            return o0 + c < out ? w2_row(a, (int)j)[o0 + c] : 0.0f;
        };
        tile_mma<T2, true>(acc, NoLoad(), bl, 0, R, smem, NoHook(), Zs, LDZ);
        tile_finish<T2>(acc, nullptr, [=](int m, int c, float v) {
            const int64_t row = m0 + m, o = o0 + c;
            if (row < N && o < out)
                y[row * out + o] = e(row * out + o, v * inv + (bias ? bias[o] : 0.0f));
        });
    }
}

// Split-path forward, second launch: y = (sum_p Zpart_p) W2 / (2L) + bias, 16 x 256 tiles.
__global__ void __launch_bounds__(kThreads)
    skl_fwd_y(Net a, const float *part, int64_t P, const float *bias, float *y, Epi e,
              int64_t coltiles) {
    using T = Tile<8, false, false>;
    __shared__ __align__(16) float smem[T::FLOATS];
    const int64_t blk = blockIdx.x, m0 = blk / coltiles * kBM, o0 = blk % coltiles * T::BN;
    const int64_t N = a.N, out = a.out, R = a.R, stride = N * R;
    const float inv = a.inv;
    auto al = [=](int m, int64_t j) {
        return m0 + m < N ? psum(part + (m0 + m) * R + j, P, stride) : 0.0f;
    };
    auto bl = [=, &a](int64_t j, int c) {
        return o0 + c < out ? w2_row(a, (int)j)[o0 + c] : 0.0f;
    };
    float acc[4][4];
    zero(acc);
    tile_mma<T, false>(acc, al, bl, 0, R, smem, NoHook(), nullptr, 0);
    tile_finish<T>(acc, nullptr, [=](int m, int c, float v) {
        const int64_t row = m0 + m, o = o0 + c;
        if (row < N && o < out)
            y[row * out + o] = e(row * out + o, v * inv + (bias ? bias[o] : 0.0f));
    });
}

template <int CW>
kf_status launch_fused(kf_context *ctx, const char *fn, const Layout &l, const Net &a,
                       const float *bias, float *y, const Epi &e) {
    unsigned g = 0;
    KF_TRY(kf__grid_of(fn, l.rt * l.groups, &g));
    skl_fwd_fused<CW><<<g, kThreads, 0, kf__stream(ctx)>>>(a, bias, y, e, l.groups, l.cpb,
                                                            l.ct_out);
    KF__CUDA_LAUNCH_CHECK(fn, "skl_fwd_fused");
    return KF_OK;
}

} // namespace

kf_status skl_forward(kf_context *ctx, const kf__skl_fwd *c) {
    static const char fn[] = "kf_sklinear_forward";
    const Layout l = make_layout(c->plan, c->N);
    if (c->N <= 0) return KF_OK;
    KF__CUDA_ON_DEVICE(fn, ctx);
    const Net a = make_net(c->plan, c->N, c->x, c->S1, c->S2, c->U1, c->U2);
    const float *bias = static_cast<const float *>(c->bias);
    float *y = static_cast<float *>(c->y);
    const Epi e = make_epi(c);
    if (l.fused) {
        switch (l.cw) {
        case 1: return launch_fused<1>(ctx, fn, l, a, bias, y, e);
        case 2: return launch_fused<2>(ctx, fn, l, a, bias, y, e);
        case 4: return launch_fused<4>(ctx, fn, l, a, bias, y, e);
        default: return launch_fused<8>(ctx, fn, l, a, bias, y, e);
        }
    }
    float *part = kf__at<float>(c->ws, 0);
    PartJob px = {};
    px.P = l.fz.P; px.KC = l.fz.per; px.RC = l.rc_f; px.K = l.in;
    px.jobs = l.rt * px.P * px.RC;
    px.ncols = (int)l.R; px.col_base = 0; px.scale = 1.0f;
    px.part = part;
    KF_TRY(run_zpart(ctx, fn, l.cw, a, nullptr, px, no_part()));
    unsigned g = 0;
    KF_TRY(kf__grid_of(fn, l.rt * l.ct_out, &g));
    skl_fwd_y<<<g, kThreads, 0, kf__stream(ctx)>>>(a, part, l.fz.P, bias, y, e, l.ct_out);
    KF__CUDA_LAUNCH_CHECK(fn, "skl_fwd_y");
    return KF_OK;
}

} // namespace kf_skl

// KANLinear and KANConv2d on CUDA, the tiled backward (cuda/kan_linear.cu's header comment):
// kan_dx (and KANConv2d's kan_col2im) for dx, kan_dw for dW's partials, kan_fold into the weight
// gradients.
#include "kan_cuda.cuh"

namespace kf_kan {

namespace {

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

} // namespace

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

template kf_status backward_km<3, false>(kf_context *, const char *, const Layout &,
                                         const Prob &, const kf__kan_bwd *, float *);
template kf_status backward_km<3, true>(kf_context *, const char *, const Layout &,
                                        const Prob &, const kf__kan_bwd *, float *);
template kf_status backward_km<kMaxOrder, false>(kf_context *, const char *, const Layout &,
                                                 const Prob &, const kf__kan_bwd *, float *);
template kf_status backward_km<kMaxOrder, true>(kf_context *, const char *, const Layout &,
                                                const Prob &, const kf__kan_bwd *, float *);

} // namespace kf_kan

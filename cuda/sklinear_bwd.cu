// SKLinear's float32 backward on CUDA: the gradient through the epilogue (skl_epi_grad),
// skl_zpart's partials of dZ and Z2, the tiles of dx, dS1s, dS2s and dbias (skl_bwd_main) and the
// row-chunk sums of the weight gradients (skl_wreduce), as the top of cuda/sklinear.cu describes
// them.
#include "sklinear.cuh"

namespace kf_skl {
namespace {

// The gradient through the epilogue, g = dy * mask / (1 - p) * act'(pre), which backward's
// products read in dy's place.
__global__ void __launch_bounds__(kThreads)
    skl_epi_grad(const float *dy, const float *pre, float *g, int64_t n, int32_t act, float p,
                 float scale, uint64_t seed, uint64_t offset) {
    const int64_t step = (int64_t)gridDim.x * kThreads;
    for (int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x; i < n; i += step)
        g[i] = kf__epi_grad_s(act, p, scale, seed, offset + (uint64_t)i,
                              pre != nullptr ? pre[i] : 0.0f, dy[i]);
}

struct BwdJobs {
    int64_t n_dx, n_s1, n_s2;    // job counts of the three kinds, in this order
    int64_t ct_in, ct_out;       // 256-wide column tiles of in and out
    int64_t Pw, KCw;             // row chunks of the weight gradients
    int64_t Pdz, Pz2;            // partial counts of dZ and Z2
    const float *dz, *z2;        // [Pdz, N, 2r] (scaled by 1/(2L)), [Pz2, N, r] or NULL
    float *dx, *dS1, *dS2, *db;  // outputs, NULL = not wanted
    float *w1p, *w2p, *wbp;      // Pw > 1: [Pw, r, in], [Pw, r, out], [Pw, out] partials
    bool accumulate;
};

// Backward: dx, dS1s, dS2s (+ dbias) tiles, from the partials of skl_zpart.
__global__ void __launch_bounds__(kThreads) skl_bwd_main(Net a, const float *dy, BwdJobs b) {
    using TX = Tile<8, false, true>;  // dx: A = dZ rows, B = W1^T (k-ordered)
    using TW = Tile<8, true, false>;  // weight gradients: A = dZ^T or Z2^T (m-ordered)
    static_assert(TW::BN == kThreads, "dbias: one column per thread");
    __shared__ __align__(16) float smem[cmax(TX::FLOATS, TW::FLOATS)];

    const int64_t N = a.N, in = a.in, out = a.out, R = a.R;
    const int r = a.r, k = a.k;
    float acc[4][4];
    zero(acc);
    int64_t job = blockIdx.x;
    if (job < b.n_dx) {
        const int64_t m0 = job / b.ct_in * kBM, a0 = job % b.ct_in * TX::BN;
        const float *dz = b.dz;
        const int64_t P = b.Pdz, stride = N * R;
        auto al = [=](int m, int64_t j) {
            return m0 + m < N ? psum(dz + (m0 + m) * R + j, P, stride) : 0.0f;
        };
        auto bl = [=, &a](int64_t j, int c) {
            return a0 + c < in ? w1_col(a, (int)j)[(a0 + c) * k] : 0.0f;
        };
        tile_mma<TX, false>(acc, al, bl, 0, R, smem, NoHook(), nullptr, 0);
        float *dx = b.dx;
        tile_finish<TX>(acc, nullptr, [=](int m, int c, float v) {
            const int64_t row = m0 + m, col = a0 + c;
            if (row < N && col < in) dx[row * in + col] = v;
        });
        return;
    }
    job -= b.n_dx;
    const int64_t Pw = b.Pw;
    const bool acm = b.accumulate;
    if (job < b.n_s1) { // dS1^T [r, in] = dZ[:, :r]^T x over rows [kbeg, kend)
        const int64_t per = b.ct_in * Pw, pw = job % Pw;
        const int j0 = (int)(job / per) * kBM;
        const int64_t a0 = job % per / Pw * TW::BN;
        const int64_t kbeg = pw * b.KCw, kend = kbeg + b.KCw < N ? kbeg + b.KCw : N;
        const float *dz = b.dz, *x = a.x;
        const int64_t P = b.Pdz, stride = N * R;
        auto al = [=](int m, int64_t n) {
            return j0 + m < r ? psum(dz + n * R + j0 + m, P, stride) : 0.0f;
        };
        auto bl = [=](int64_t n, int c) { return a0 + c < in ? x[n * in + a0 + c] : 0.0f; };
        tile_mma<TW, false>(acc, al, bl, kbeg, kend, smem, NoHook(), nullptr, 0);
        float *dS1 = b.dS1, *w1p = b.w1p;
        tile_finish<TW>(acc, nullptr, [=](int m, int c, float v) {
            const int j = j0 + m;
            const int64_t col = a0 + c;
            if (j >= r || col >= in) return;
            if (Pw > 1) {
                w1p[(pw * r + j) * in + col] = v;
            } else {
                const int term = j / k;
                const int64_t idx = ((int64_t)term * in + col) * k + (j - term * k);
                dS1[idx] = acm ? dS1[idx] + v : v;
            }
        });
        return;
    }
    job -= b.n_s1;
    { // dS2 [r, out] = Z2^T dy / (2L) over rows [kbeg, kend); rows 0..15 also sum dbias
        const int64_t per = b.ct_out * Pw, pw = job % Pw;
        const int j0 = (int)(job / per) * kBM;
        const int64_t o0 = job % per / Pw * TW::BN;
        const int64_t kbeg = pw * b.KCw, kend = kbeg + b.KCw < N ? kbeg + b.KCw : N;
        const float *z2 = b.z2;
        const int64_t P = b.Pz2, stride = N * r;
        auto al = [=](int m, int64_t n) {
            return z2 != nullptr && j0 + m < r ? psum(z2 + n * r + j0 + m, P, stride) : 0.0f;
        };
        auto bl = [=](int64_t n, int c) { return o0 + c < out ? dy[n * out + o0 + c] : 0.0f; };
        const bool want_db = j0 == 0 && b.db != nullptr;
        float dbs = 0.0f;
        auto hook = [&](const float *Bs) {
            if (!want_db) return;
#pragma unroll
            for (int kk = 0; kk < TW::BK; ++kk) dbs += Bs[kk * TW::LDB + threadIdx.x];
        };
        tile_mma<TW, false>(acc, al, bl, kbeg, kend, smem, hook, nullptr, 0);
        float *dS2 = b.dS2, *w2p = b.w2p;
        const float inv = a.inv;
        tile_finish<TW>(acc, nullptr, [=](int m, int c, float v) {
            const int j = j0 + m;
            const int64_t col = o0 + c;
            if (dS2 == nullptr || j >= r || col >= out) return;
            v *= inv;
            if (Pw > 1) {
                w2p[(pw * r + j) * out + col] = v;
            } else {
                const int64_t idx = (int64_t)j * out + col;
                dS2[idx] = acm ? dS2[idx] + v : v;
            }
        });
        if (want_db) {
            const int64_t o = o0 + threadIdx.x;
            if (o < out) {
                if (Pw > 1) b.wbp[pw * out + o] = dbs;
                else b.db[o] = acm ? b.db[o] + dbs : dbs;
            }
        }
    }
}

// Pw > 1: the weight gradients from their row-chunk partials, summed in chunk order.
__global__ void __launch_bounds__(kThreads) skl_wreduce(Net a, BwdJobs b) {
    const int64_t in = a.in, out = a.out, r = a.r, k = a.k, P = b.Pw;
    const int64_t E1 = b.dS1 ? r * in : 0, E2 = b.dS2 ? r * out : 0, E3 = b.db ? out : 0;
    const int64_t E = E1 + E2 + E3, step = (int64_t)gridDim.x * kThreads;
    for (int64_t e = (int64_t)blockIdx.x * kThreads + threadIdx.x; e < E; e += step) {
        float s, *dst;
        if (e < E1) { // dS1s element e of [L, in, k]: term i, feature f, column c; j = i*k + c
            const int64_t i = e / (in * k), f = e / k % in, c = e % k;
            s = psum(b.w1p + (i * k + c) * in + f, P, r * in);
            dst = b.dS1 + e;
        } else if (e < E1 + E2) {
            s = psum(b.w2p + (e - E1), P, r * out);
            dst = b.dS2 + (e - E1);
        } else {
            s = psum(b.wbp + (e - E1 - E2), P, out);
            dst = b.db + (e - E1 - E2);
        }
        *dst = b.accumulate ? *dst + s : s;
    }
}

} // namespace

kf_status skl_backward(kf_context *ctx, const kf__skl_bwd *c) {
    static const char fn[] = "kf_sklinear_backward";
    if (c->dx == nullptr && c->dS1 == nullptr && c->dS2 == nullptr && c->db == nullptr)
        return KF_OK;
    const Layout l = make_layout(c->plan, c->N);
    KF__CUDA_ON_DEVICE(fn, ctx);
    const Net a = make_net(c->plan, c->N, c->x, c->S1, c->S2, c->U1, c->U2);
    const float *dy = static_cast<const float *>(c->dy);
    if (c->plan->act != KF_ACTIVATION_NONE || c->plan->dropout > 0.0f) { // 0. through the epilogue
        float *g = kf__at<float>(c->ws, l.off_g);
        const int64_t n = c->N * l.out, blocks = kf__ceil_div(n, kThreads);
        skl_epi_grad<<<(unsigned)(blocks < 65535 ? blocks : 65535), kThreads, 0,
                       kf__stream(ctx)>>>(dy, static_cast<const float *>(c->pre), g, n,
                                          c->plan->act, c->epi.p,
                                          kf__dropout_scale_s(c->epi.p), c->epi.seed,
                                          c->epi.offset);
        KF__CUDA_LAUNCH_CHECK(fn, "skl_epi_grad");
        dy = g;
    }
    const bool need_dz = c->dx != nullptr || c->dS1 != nullptr, need_z2 = c->dS2 != nullptr;

    // 1. Partials of Z2 = x U2 and dZ = dy W2^T / (2L).
    PartJob px = no_part(), pd = no_part();
    if (need_z2) {
        px.P = l.z2.P; px.KC = l.z2.per; px.RC = l.rc_z2; px.K = l.in;
        px.jobs = l.rt * px.P * px.RC;
        px.ncols = (int)l.r; px.col_base = (int)l.r; px.scale = 1.0f;
        px.part = kf__at<float>(c->ws, l.off_z2);
    }
    if (need_dz) {
        pd.P = l.dz.P; pd.KC = l.dz.per; pd.RC = l.rc_dz; pd.K = l.out;
        pd.jobs = l.rt * pd.P * pd.RC;
        pd.ncols = (int)l.R; pd.col_base = 0; pd.scale = a.inv;
        pd.part = kf__at<float>(c->ws, 0);
    }
    if (l.N > 0) KF_TRY(run_zpart(ctx, fn, l.cw, a, dy, px, pd));

    // 2. dx, dS1s, dS2s, dbias tiles.
    BwdJobs b = {};
    b.ct_in = l.ct_in; b.ct_out = l.ct_out;
    b.Pw = l.w.P; b.KCw = l.w.per;
    b.Pdz = l.dz.P; b.Pz2 = l.z2.P;
    b.dz = kf__at<float>(c->ws, 0);
    b.z2 = need_z2 ? kf__at<float>(c->ws, l.off_z2) : nullptr;
    b.dx = static_cast<float *>(c->dx);
    b.dS1 = static_cast<float *>(c->dS1);
    b.dS2 = static_cast<float *>(c->dS2);
    b.db = static_cast<float *>(c->db);
    if (l.w.P > 1) {
        b.w1p = kf__at<float>(c->ws, l.off_w1);
        b.w2p = kf__at<float>(c->ws, l.off_w2);
        b.wbp = kf__at<float>(c->ws, l.off_wb);
    }
    b.accumulate = c->accumulate;
    b.n_dx = c->dx ? l.rt * l.ct_in : 0;
    b.n_s1 = c->dS1 ? l.rtr * l.ct_in * l.w.P : 0;
    b.n_s2 = (c->dS2 ? l.rtr : c->db ? 1 : 0) * l.ct_out * l.w.P;
    unsigned g = 0;
    KF_TRY(kf__grid_of(fn, b.n_dx + b.n_s1 + b.n_s2, &g));
    if (g > 0) {
        skl_bwd_main<<<g, kThreads, 0, kf__stream(ctx)>>>(a, dy, b);
        KF__CUDA_LAUNCH_CHECK(fn, "skl_bwd_main");
    }

    // 3. Row-chunk partials of the weight gradients, summed.
    if (l.w.P > 1 && (c->dS1 || c->dS2 || c->db)) {
        const int64_t E = (c->dS1 ? l.r * l.in : 0) + (c->dS2 ? l.r * l.out : 0) +
                          (c->db ? l.out : 0);
        const int64_t blocks = kf__ceil_div(E, kThreads);
        skl_wreduce<<<(unsigned)(blocks < 65535 ? blocks : 65535), kThreads, 0,
                      kf__stream(ctx)>>>(a, b);
        KF__CUDA_LAUNCH_CHECK(fn, "skl_wreduce");
    }
    return KF_OK;
}

} // namespace kf_skl

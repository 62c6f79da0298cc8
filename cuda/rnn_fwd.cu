// GRU and A-GRU forward (math: docs/ops/rnn.md; layouts: core/rnn_backend.h, cuda/rnn_cuda.cuh).
// B batch, T steps, I input, H hidden; row-major, last dimension fastest.
//
// Per layer-direction: one cuBLAS GEMM projects the input of all T*B rows (gx = X W^T, bias added
// in the cell), then the recurrence runs either
//  - persistent: one launch for all T steps; each block owns BB batch rows for every step (no
//    grid-wide barrier) and keeps the recurrent weights on chip, half of each thread's slice in
//    registers and half in shared memory (H % 32 == 0, H <= 128; rnn_fwd_persistent for the
//    GRU, agru_fwd_persistent for the A-GRU: warp-role split, shuffle reductions, two barriers
//    per step, see its latency model; cuda/rnn_fwd_persistent.cu); or
//  - per step (any H): a recurrent GEMM on cuBLAS and one fused pointwise kernel (two of each for
//    the A-GRU, whose candidate needs r before its product A (r*h)).
// Both paths evaluate the cell with the same expressions (same operation order outside the dot
// products: cuda/rnn_fwd.cuh) and write the same reserve. This file: the per-step path, the
// forward entry, the recurrent op tables and their select.
#include "lowp.h"
#include "lowp_ops.h"
#include "rnn_fwd.cuh"

namespace kf_rnn {

namespace {

constexpr int kThreads = 256;

// ---- per-step path ------------------------------------------------------------------------

template <bool kTrain>
__global__ void gru_fwd_step(FwdArgs a) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)a.B * a.H) return;
    const int H = a.H, b = (int)(i / H), j = (int)(i % H);
    int t;
    float h = a.h[i];
    if (!kf__step_time(a.st, kf__row_length(a.len, b, a.T), a.reverse, &t)) {
        a.h_out[i] = h;
        write_inactive<kTrain>(a, t, b, j, 4);
        return;
    }
    int64_t row = t * a.ts + b * a.bs;
    const float *g = a.gx + row * 3 * H, *q = a.gh + (int64_t)b * 3 * H;
    float hnew = gru_cell<kTrain>(a, row, j, g[j], g[H + j], g[2 * H + j], q[j], q[H + j],
                                  q[2 * H + j], h);
    a.h_out[i] = hnew;
    write_out(a, t, b, j, hnew);
}

// A-GRU step, part 1: the pre-activations of z, r (bias added) overwrite gh's; rh = r * h feeds
// A (r*h).
__global__ void agru_fwd_step1(FwdArgs a) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)a.B * a.H) return;
    const int H = a.H, b = (int)(i / H), j = (int)(i % H);
    int t;
    if (!kf__step_time(a.st, kf__row_length(a.len, b, a.T), a.reverse, &t)) {
        a.rh[i] = 0.0f;
        return;
    }
    int64_t row = t * a.ts + b * a.bs;
    const float *g = a.gx + row * 3 * H;
    float *q = a.gh + (int64_t)b * 3 * H;
    float az, ar;
    agru_zr(a, j, g[j], g[H + j], q[j], q[H + j], &az, &ar);
    q[j] = az;
    q[H + j] = ar;
    a.rh[i] = sigm(ar) * a.h[i];
}

template <bool kTrain>
__global__ void agru_fwd_step2(FwdArgs a) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)a.B * a.H) return;
    const int H = a.H, b = (int)(i / H), j = (int)(i % H);
    int t;
    float h = a.h[i];
    if (!kf__step_time(a.st, kf__row_length(a.len, b, a.T), a.reverse, &t)) {
        a.h_out[i] = h;
        write_inactive<kTrain>(a, t, b, j, 3);
        return;
    }
    int64_t row = t * a.ts + b * a.bs;
    const float *q = a.gh + (int64_t)b * 3 * H;
    float hnew = agru_out<kTrain>(a, row, j, a.gx[row * 3 * H + 2 * H + j], q[2 * H + j], q[j],
                                  q[H + j], h, *a.eps);
    a.h_out[i] = hnew;
    write_out(a, t, b, j, hnew);
}

// wt [H, 3H] = Wrec^T; Wrec [3H, H] = W_hh (GRU) or [U_z; U_r; A], A = W_h - W_h^T - gamma I.
__global__ void prep_wt(int H, bool agru, const float *w0, const float *uz, const float *ur,
                        const float *wh, float gamma, float *wt) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)H * 3 * H) return;
    const int k = (int)(i / (3 * H)), c = (int)(i % (3 * H));
    wt[i] = kf__rnn_wrec(H, agru, w0, uz, ur, wh, gamma, c, k);
}

// Per-step recurrence of one layer-direction; h ping-pongs between ws buffers h[0], h[1].
kf_status run_steps(kf_context *ctx, const char *fn, bool agru, bool train, FwdArgs a,
                    const float *wt, const float *h0, float *hn, float *hbuf[2]) {
    const int64_t B = a.B, H = a.H, n = B * H;
    cudaStream_t s = kf__stream(ctx);
    if (h0 != nullptr)
        KF__CUDA_TRY(fn, cudaMemcpyAsync(hbuf[0], h0, n * sizeof(float), cudaMemcpyDeviceToDevice, s));
    else
        KF__CUDA_TRY(fn, cudaMemsetAsync(hbuf[0], 0, n * sizeof(float), s));
    const unsigned grid = kf__blocks(n, kThreads);
    for (int st = 0; st < a.T; ++st) {
        a.st = st;
        a.h = hbuf[st & 1];
        a.h_out = hbuf[(st + 1) & 1];
        if (!agru) {
            KF_TRY(kf__gemm(ctx, fn, false, false, B, 3 * H, H, 1.0f, a.h, H, wt, 3 * H, 0.0f,
                            a.gh, 3 * H));
            if (train) gru_fwd_step<true><<<grid, kThreads, 0, s>>>(a);
            else gru_fwd_step<false><<<grid, kThreads, 0, s>>>(a);
            KF__CUDA_LAUNCH_CHECK(fn, "gru_fwd_step");
        } else {
            KF_TRY(kf__gemm(ctx, fn, false, false, B, 2 * H, H, 1.0f, a.h, H, wt, 3 * H, 0.0f,
                            a.gh, 3 * H));
            agru_fwd_step1<<<grid, kThreads, 0, s>>>(a);
            KF__CUDA_LAUNCH_CHECK(fn, "agru_fwd_step1");
            KF_TRY(kf__gemm(ctx, fn, false, false, B, H, H, 1.0f, a.rh, H, wt + 2 * H, 3 * H, 0.0f,
                            a.gh + 2 * H, 3 * H));
            if (train) agru_fwd_step2<true><<<grid, kThreads, 0, s>>>(a);
            else agru_fwd_step2<false><<<grid, kThreads, 0, s>>>(a);
            KF__CUDA_LAUNCH_CHECK(fn, "agru_fwd_step2");
        }
    }
    if (hn != nullptr)
        KF__CUDA_TRY(fn, cudaMemcpyAsync(hn, hbuf[a.T & 1], n * sizeof(float),
                                         cudaMemcpyDeviceToDevice, s));
    return KF_OK;
}

} // namespace

} // namespace kf_rnn

using namespace kf_rnn;

kf_status kf__cuda_rnn_prep_wt(kf_context *ctx, const char *fn, const struct kf_rnn_plan *p,
                               const float *const *w, float *wt) {
    const int64_t H = p->H;
    const bool agru = p->cell == KF_RNN_AGRU;
    prep_wt<<<kf__blocks(H * 3 * H, kThreads), kThreads, 0, kf__stream(ctx)>>>(
        (int)H, agru, agru ? nullptr : w[KF__GRU_W_HH], agru ? w[KF__AGRU_U_Z] : nullptr,
        agru ? w[KF__AGRU_U_R] : nullptr, agru ? w[KF__AGRU_W_H] : nullptr, p->gamma, wt);
    KF__CUDA_LAUNCH_CHECK(fn, "prep_wt");
    return KF_OK;
}

// Float64 plans run the plain path (cuda/plain.cu), and so do bfloat16 and float16 plans except
// where H is one the persistent float32 kernels take: there the recurrence is that kernel's one
// launch for all T steps (against two launches per step on the plain path), worth the conversion
// layer's copies (core/lowp_ops.c: O(tensor size) work, a few launches per call); elsewhere both
// would run the same per-step products, and the plain path runs the input-side products on the
// tensor cores, with no copies. Decided by the plan alone.
bool kf__cuda_rnn_plain(const struct kf_rnn_plan *p) {
    return p->dtype == KF_DTYPE_F64 ||
           (kf__dtype_is_lowp(p->dtype) && !kf__rnn_persistent_h(p->H));
}

extern "C" void kf__cuda_rnn_sizes(const struct kf_rnn_plan *p, int64_t T, int64_t B,
                                   bool training, size_t *ws_bytes, size_t *reserve_bytes) {
    kf__rnn_cuda_layout lay;
    kf__rnn_cuda_layout_make(p, T, B, training, &lay);
    if (ws_bytes) *ws_bytes = lay.ws_bytes;
    if (reserve_bytes) *reserve_bytes = lay.reserve_bytes;
}

extern "C" kf_status kf__cuda_rnn_forward(kf_context *ctx, const kf__rnn_fwd *c) {
    static const char fn[] = "kf_rnn_forward";
    const struct kf_rnn_plan *p = c->plan;
    const int64_t T = c->T, B = c->B, H = p->H, D = p->D, L = p->L;
    const bool agru = p->cell == KF_RNN_AGRU, train = c->training;
    cudaStream_t s = kf__stream(ctx);
    KF_CHECK_FN(fn, T <= INT32_MAX && B <= INT32_MAX && H <= INT32_MAX, KF_ERR_UNSUPPORTED,
                "T = %lld, B = %lld, H = %lld: the CUDA backend takes extents below 2^31",
                (long long)T, (long long)B, (long long)H);
    KF__CUDA_ON_DEVICE(fn, ctx);
    if (T == 0 || B == 0) { // no step runs: h_n = h0
        if (c->hn != nullptr && B > 0) {
            const size_t bytes = (size_t)(L * D * B * H) * sizeof(float);
            if (c->h0 != nullptr)
                KF__CUDA_TRY(fn, cudaMemcpyAsync(c->hn, c->h0, bytes, cudaMemcpyDeviceToDevice, s));
            else
                KF__CUDA_TRY(fn, cudaMemsetAsync(c->hn, 0, bytes, s));
        }
        return KF_OK;
    }
    kf__rnn_cuda_layout lay;
    kf__rnn_cuda_layout_make(p, T, B, train, &lay);
    void *ws = c->ws;
    float *wt = kf__at<float>(ws, lay.wt), *gx = kf__at<float>(ws, lay.gx);
    float *hbuf[2] = {kf__at<float>(ws, lay.h[0]), kf__at<float>(ws, lay.h[1])};

    const int BB = persistent_rows(agru, (int)H, B, ctx->sm_count, ctx->smem_optin_bytes);

    int64_t xts, xbs; // row strides of x and y (the user's layout)
    kf__rnn_row_strides(p, 0, T, B, &xts, &xbs);
    // float32 views of the record (the other plans went elsewhere above)
    const float *in = static_cast<const float *>(c->x);
    const float *h0_32 = static_cast<const float *>(c->h0);
    float *y32 = static_cast<float *>(c->y), *hn32 = static_cast<float *>(c->hn);
    for (int64_t l = 0; l < L; ++l) {
        const int64_t Il = kf__rnn_layer_input(p, (int32_t)l);
        int64_t ts, bs;
        kf__rnn_row_strides(p, (int32_t)l, T, B, &ts, &bs);
        const bool last = l == L - 1;
        float *out = last ? y32
                     : train ? kf__at<float>(c->reserve, kf__rs_out(&lay, l))
                             : kf__at<float>(ws, lay.act[l & 1]);
        for (int64_t d = 0; d < D; ++d) {
            const int64_t cell = l * D + d;
            const float *w[KF__AGRU_NW];
            for (int32_t j = 0; j < p->nw; ++j)
                w[j] = static_cast<const float *>(c->w[cell * p->nw + j]);
            // Input projection of all T*B rows, in the input's own row order.
            if (!agru) {
                KF_TRY(kf__gemm(ctx, fn, false, true, T * B, 3 * H, Il, 1.0f, in, Il,
                                w[KF__GRU_W_IH], Il, 0.0f, gx, 3 * H));
            } else {
                const int wi[3] = {KF__AGRU_W_Z, KF__AGRU_W_R, KF__AGRU_V_H};
                for (int g = 0; g < 3; ++g)
                    KF_TRY(kf__gemm(ctx, fn, false, true, T * B, H, Il, 1.0f, in, Il, w[wi[g]],
                                    Il, 0.0f, gx + g * H, 3 * H));
            }
            KF_TRY(kf__cuda_rnn_prep_wt(ctx, fn, p, w, wt));

            FwdArgs a = {};
            a.T = (int)T; a.B = (int)B; a.H = (int)H;
            a.reverse = d == 1;
            a.len = c->lengths;
            a.gx = gx; a.ts = ts; a.bs = bs;
            if (!agru) {
                for (int g = 0; g < 3; ++g) a.bx[g] = w[KF__GRU_B_IH] + g * H;
                a.b_hh = w[KF__GRU_B_HH];
            } else {
                a.bx[0] = w[KF__AGRU_B_Z]; a.bx[1] = w[KF__AGRU_B_R]; a.bx[2] = w[KF__AGRU_B_H];
                a.eps = w[KF__AGRU_EPS];
            }
            a.gh = kf__at<float>(ws, lay.gh);
            a.rh = kf__at<float>(ws, lay.rh);
            a.out = out;
            a.out_ts = last ? xts : B; a.out_bs = last ? xbs : 1;
            a.out_ld = D * H; a.out_col = d * H; a.DH = D * H;
            a.drop = train && !last && p->dropout > 0.0f;
            a.p = p->dropout;
            a.scale = 1.0f / (1.0f - p->dropout);
            a.seed = c->seed;
            a.ctr_base = c->offset + (uint64_t)l * (uint64_t)T * (uint64_t)B * (uint64_t)(D * H);
            if (train) {
                a.gates = kf__at<float>(c->reserve, kf__rs_gates(&lay, cell));
                a.hprev = kf__at<float>(c->reserve, kf__rs_hprev(&lay, cell));
            }
            const float *h0 = h0_32 ? h0_32 + cell * B * H : nullptr;
            float *hn = hn32 ? hn32 + cell * B * H : nullptr;
            if (BB > 0) {
                kf_status st;
                if (!agru) st = train ? run_persistent<false, true>(ctx, fn, BB, a, wt, h0, hn)
                                      : run_persistent<false, false>(ctx, fn, BB, a, wt, h0, hn);
                else st = train ? run_agru_persistent<true>(ctx, fn, BB, a, wt, h0, hn)
                                : run_agru_persistent<false>(ctx, fn, BB, a, wt, h0, hn);
                KF_TRY(st);
            } else {
                KF_TRY(run_steps(ctx, fn, agru, train, a, wt, h0, hn, hbuf));
            }
        }
        in = out;
    }
    return KF_OK;
}

namespace {

// The plan's table, once, at its creation: float32 on the kernels above and rnn_bwd.cu;
// float64, bfloat16 and float16 as kf__cuda_rnn_plain says (cuda/plain.cu's table of the dtype,
// or these kernels through core/lowp_ops.c's conversion layer).
kf_status rnn_select(const struct kf_rnn_plan *p, const char *fn, const kf__rnn_ops **ops) {
    KF_TRY(kf__cuda_dtype_supported(p->dtype, fn));
    if (kf__cuda_rnn_plain(p)) *ops = kf__cuda_rnn_plain_ops(p->dtype);
    else if (kf__dtype_is_lowp(p->dtype)) *ops = &kf__lowp_rnn_ops;
    else *ops = &kf__cuda_rnn_ops_f32;
    return KF_OK;
}

} // namespace

extern "C" const kf__rnn_ops kf__cuda_rnn_ops_f32 = {nullptr, kf__cuda_rnn_sizes,
                                                      kf__cuda_rnn_forward, kf__cuda_rnn_backward};
extern "C" const kf__rnn_ops kf__cuda_rnn_ops = {rnn_select, nullptr, nullptr, nullptr};

// GRU and A-GRU backward from the reserve of a training forward (layouts: cuda/rnn_cuda.cuh).
// B batch, T steps, I input, H hidden; row-major, last dimension fastest.
//
// Per layer-direction, last layer first: the recurrence runs backwards one step at a time, a
// fused pointwise kernel turning the state gradient into gate gradients (stored for all rows)
// and a cuBLAS GEMM carrying the state gradient through the recurrent weights. Afterwards the
// weight gradients are large GEMMs over all T*B rows and the bias gradients column sums in a
// fixed order: deterministic, no atomics. The input gradient of an inner layer becomes the
// output gradient of the layer below, through that layer's dropout mask.
//
// Derivatives (g = dL/dh' at a step, all products elementwise):
//  GRU  h' = (1-z) n + z h, n = tanh(a_n), a_n = gx_n + b_in + r (W_hn h + b_hn) =: .. + r hn
//       da_n = g (1-z) (1-n^2), da_z = g (h-n) z (1-z), da_r = da_n hn r (1-r)
//       dgx = [da_r, da_z, da_n], dgh = [da_r, da_z, da_n r], dh = g z + dgh W_hh
//  A-GRU h' = h + eps z d, d = tanh(a_d), a_d = gx_d + b_h + A (r h)
//       da_d = g eps z (1-d^2), da_z = g eps d z (1-z), drh = da_d A (row vector times A),
//       da_r = drh h r (1-r), dh = g + r drh + [da_z, da_r] [U_z; U_r], d eps = sum g z d
//       dA = da_d^T (r h) summed over rows, dW_h = dA - dA^T (since A = W_h - W_h^T - gamma I)
// Where H allows, the reverse recurrence of a layer-direction is one persistent launch instead
// (cuda/rnn_bwd_persistent.cu). This file: the per-step path, the reductions, the entry.
#include "lowp.h"
#include "lowp_ops.h"
#include "rnn_bwd.cuh"

namespace kf_rnn {

namespace {

constexpr int kThreads = 256;

// dL/dh' at (t, b, j): the carried state gradient plus the output gradient there.
__device__ __forceinline__ float out_grad(const BwdArgs &a, int t, int b, int j, float g) {
    if (a.dy == nullptr) return g;
    float v = a.dy[(t * a.dy_ts + b * a.dy_bs) * a.dy_ld + a.dy_col + j];
    if (a.drop) {
        uint64_t c = a.ctr_base + ((uint64_t)t * (uint64_t)a.B + (uint64_t)b) * (uint64_t)a.DH +
                     (uint64_t)(a.dy_col + j);
        v = kf__dropout_keep(a.seed, c, a.p) ? v * a.scale : 0.0f;
    }
    return g + v;
}

__global__ void gru_bwd_step(BwdArgs a) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)a.B * a.H) return;
    const int H = a.H, b = (int)(i / H), j = (int)(i % H);
    int t;
    const bool act = kf__step_time(a.st, kf__row_length(a.len, b, a.T), a.reverse, &t);
    const int64_t row = t * a.ts + b * a.bs;
    float *dx = a.dgx + row * 3 * H, *dg = a.dgh + row * 3 * H, *ds = a.dstep + (int64_t)b * 3 * H;
    if (!act) {
        a.dh_out[i] = a.dh[i];
        dx[j] = dx[H + j] = dx[2 * H + j] = 0.0f;
        dg[j] = dg[H + j] = dg[2 * H + j] = 0.0f;
        ds[j] = ds[H + j] = ds[2 * H + j] = 0.0f;
        return;
    }
    const float g = out_grad(a, t, b, j, a.dh[i]);
    const float *q = a.gates + row * 4 * H;
    const float r = q[j], z = q[H + j], n = q[2 * H + j], hn = q[3 * H + j];
    const float h = a.hprev[row * H + j];
    const float dan = g * (1.0f - z) * (1.0f - n * n);
    const float daz = g * (h - n) * z * (1.0f - z);
    const float dar = dan * hn * r * (1.0f - r);
    dx[j] = dar;
    dx[H + j] = daz;
    dx[2 * H + j] = dan;
    dg[j] = ds[j] = dar;
    dg[H + j] = ds[H + j] = daz;
    dg[2 * H + j] = ds[2 * H + j] = dan * r;
    a.dh_out[i] = g * z;
}

// A-GRU step, part 1: everything that does not need A^T da_d.
__global__ void agru_bwd_step1(BwdArgs a) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)a.B * a.H) return;
    const int H = a.H, b = (int)(i / H), j = (int)(i % H);
    int t;
    const bool act = kf__step_time(a.st, kf__row_length(a.len, b, a.T), a.reverse, &t);
    const int64_t row = t * a.ts + b * a.bs;
    float *dx = a.dgx + row * 3 * H, *ds = a.dstep + (int64_t)b * 3 * H;
    if (!act) {
        a.dh_out[i] = a.dh[i];
        dx[j] = dx[H + j] = dx[2 * H + j] = 0.0f;
        ds[j] = ds[H + j] = ds[2 * H + j] = 0.0f;
        a.rh[row * H + j] = 0.0f;
        a.epsg[row * H + j] = 0.0f;
        return;
    }
    const float g = out_grad(a, t, b, j, a.dh[i]);
    const float eps = *a.eps;
    const float *q = a.gates + row * 3 * H; // pre-activations (rnn_cuda.cuh)
    const float z = sigm(q[j]), d = tanhf(q[2 * H + j]);
    const float dad = g * eps * z * tanh_dc(q[2 * H + j]);
    const float daz = g * eps * d * z * sigm(-q[j]);
    dx[j] = ds[j] = daz;
    dx[2 * H + j] = ds[2 * H + j] = dad;
    a.epsg[row * H + j] = g * z * d;
    a.dh_out[i] = g;
}

// A-GRU step, part 2, after drh = da_d A: the reset gate's share.
__global__ void agru_bwd_step2(BwdArgs a) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)a.B * a.H) return;
    const int H = a.H, b = (int)(i / H), j = (int)(i % H);
    int t;
    if (!kf__step_time(a.st, kf__row_length(a.len, b, a.T), a.reverse, &t)) return;
    const int64_t row = t * a.ts + b * a.bs;
    const float ar = a.gates[row * 3 * H + H + j], h = a.hprev[row * H + j], drh = a.drh[i];
    const float r = sigm(ar), dar = drh * h * r * sigm(-ar);
    a.dgx[row * 3 * H + H + j] = dar;
    a.dstep[(int64_t)b * 3 * H + H + j] = dar;
    a.rh[row * H + j] = r * h;
    a.dh_out[i] += r * drh;
}

// A-GRU's M = [U_z; U_r; A] [3H, H] row-major, A = W_h - W_h^T - gamma I.
__global__ void prep_wrec(int H, const float *uz, const float *ur, const float *wh, float gamma,
                          float *m) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)3 * H * H) return;
    const int c = (int)(i / H), k = (int)(i % H);
    m[i] = kf__rnn_wrec(H, true, nullptr, uz, ur, wh, gamma, c, k);
}

// Column sums in two passes, the chunks of rows and the rows within a chunk combined in a fixed
// order, so the result does not depend on scheduling (no atomics).
// Pass 1: part[y][c] = sum over the rows of chunk y of m[row*ld + c], c < cols. Block: 32 columns
// x 8 row groups, four independent accumulators per thread.
__global__ void col_sum_part(const float *m, int64_t rows, int cols, int64_t ld, float *part) {
    __shared__ float sp[8][33];
    const int tx = threadIdx.x % 32, ty = threadIdx.x / 32, c = blockIdx.x * 32 + tx;
    const int64_t per = (rows + gridDim.y - 1) / gridDim.y, r0 = (int64_t)blockIdx.y * per;
    const int64_t r1 = r0 + per < rows ? r0 + per : rows;
    float v0 = 0.0f, v1 = 0.0f, v2 = 0.0f, v3 = 0.0f;
    if (c < cols) {
        int64_t r = r0 + ty;
        for (; r + 24 < r1; r += 32) {
            v0 += m[r * ld + c];
            v1 += m[(r + 8) * ld + c];
            v2 += m[(r + 16) * ld + c];
            v3 += m[(r + 24) * ld + c];
        }
        for (; r < r1; r += 8) v0 += m[r * ld + c];
    }
    sp[ty][tx] = (v0 + v1) + (v2 + v3);
    __syncthreads();
    if (ty == 0 && c < cols) {
        float s = 0.0f;
        for (int k = 0; k < 8; ++k) s += sp[k][tx];
        part[(int64_t)blockIdx.y * cols + c] = s;
    }
}

// Pass 2: out[c] (+)= sum over the chunks of part[y][c].
__global__ void col_sum_fin(const float *part, int chunks, int cols, float *out, bool acc) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float s = 0.0f;
#pragma unroll 8
    for (int y = 0; y < chunks; ++y) s += part[(int64_t)y * cols + c];
    out[c] = acc ? out[c] + s : s;
}

// Sum of v[0..n) in double, in two passes with a fixed order (d epsilon sums T*B*H terms that
// largely cancel; the CPU backend accumulates it in double as well).
// Pass 1: part[blockIdx.x] = sum over the block's contiguous chunk; 256 threads, a tree.
__global__ void sum_all_part(const float *v, int64_t n, double *part) {
    __shared__ double sp[256];
    const int64_t per = (n + gridDim.x - 1) / gridDim.x, i0 = (int64_t)blockIdx.x * per;
    const int64_t i1 = i0 + per < n ? i0 + per : n;
    double s0 = 0.0, s1 = 0.0;
    int64_t i = i0 + threadIdx.x;
    for (; i + 256 < i1; i += 512) {
        s0 += (double)v[i];
        s1 += (double)v[i + 256];
    }
    if (i < i1) s0 += (double)v[i];
    sp[threadIdx.x] = s0 + s1;
    __syncthreads();
    for (int w = 128; w > 0; w /= 2) {
        if ((int)threadIdx.x < w) sp[threadIdx.x] += sp[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) part[blockIdx.x] = sp[0];
}

// Pass 2 (one block of 256): *out (+)= the sum of part[0..chunks).
__global__ void sum_all_fin(const double *part, int chunks, float *out, bool acc) {
    __shared__ double sp[256];
    double s = 0.0;
    for (int i = threadIdx.x; i < chunks; i += 256) s += part[i];
    sp[threadIdx.x] = s;
    __syncthreads();
    for (int w = 128; w > 0; w /= 2) {
        if ((int)threadIdx.x < w) sp[threadIdx.x] += sp[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) *out = (float)sp[0] + (acc ? *out : 0.0f);
}

// Chunks of a two-pass reduction over n items: at least 64 rows each, at most KF__RNN_RED_CHUNKS.
static inline int red_chunks(int64_t n) {
    const int64_t k = (n + 63) / 64;
    return k < 1 ? 1 : k > KF__RNN_RED_CHUNKS ? KF__RNN_RED_CHUNKS : (int)k;
}

// dW_h (+)= dA - dA^T.
__global__ void antisym_grad(const float *da, int H, float *dwh, bool acc) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)H * H) return;
    const int r = (int)(i / H), k = (int)(i % H);
    const float v = da[i] - da[(int64_t)k * H + r];
    dwh[i] = acc ? dwh[i] + v : v;
}

kf_status launch_col_sum(kf_context *ctx, const char *fn, const float *m, int64_t rows, int cols,
                         int64_t ld, float *part, float *out, bool acc) {
    if (out == nullptr) return KF_OK;
    const int chunks = red_chunks(rows);
    col_sum_part<<<dim3((unsigned)((cols + 31) / 32), (unsigned)chunks), 256, 0,
                   kf__stream(ctx)>>>(m, rows, cols, ld, part);
    KF__CUDA_LAUNCH_CHECK(fn, "col_sum_part");
    col_sum_fin<<<kf__blocks(cols, 128), 128, 0, kf__stream(ctx)>>>(part, chunks, cols, out, acc);
    KF__CUDA_LAUNCH_CHECK(fn, "col_sum_fin");
    return KF_OK;
}

// dW [rows_w, K] (+)= G[:, cols]^T X over n rows: G [n, ldg], X [n, K].
kf_status wgrad(kf_context *ctx, const char *fn, int64_t rows_w, int64_t K, int64_t n,
                const float *g, int64_t ldg, const float *x, float *dw, bool acc) {
    if (dw == nullptr) return KF_OK;
    return kf__gemm(ctx, fn, true, false, rows_w, K, n, 1.0f, g, ldg, x, K, acc ? 1.0f : 0.0f, dw,
                    K);
}

} // namespace

} // namespace kf_rnn

using namespace kf_rnn;

extern "C" kf_status kf__cuda_rnn_backward(kf_context *ctx, const kf__rnn_bwd *c) {
    static const char fn[] = "kf_rnn_backward";
    const struct kf_rnn_plan *p = c->plan;
    const int64_t T = c->T, B = c->B, H = p->H, D = p->D, L = p->L, TB = T * B;
    const bool agru = p->cell == KF_RNN_AGRU, acc = c->accumulate;
    cudaStream_t s = kf__stream(ctx);
    KF_CHECK_FN(fn, T <= INT32_MAX && B <= INT32_MAX && H <= INT32_MAX, KF_ERR_UNSUPPORTED,
                "T = %lld, B = %lld, H = %lld: the CUDA backend takes extents below 2^31",
                (long long)T, (long long)B, (long long)H);
    KF_CHECK_FN(fn, T > 0 && B > 0, KF_ERR_UNSUPPORTED,
                "T = %lld, B = %lld: the CUDA backward needs at least one step and one sample",
                (long long)T, (long long)B);
    KF__CUDA_ON_DEVICE(fn, ctx);
    kf__rnn_cuda_layout lay;
    kf__rnn_cuda_layout_make(p, T, B, true, &lay);
    void *ws = c->ws;
    float *wt = kf__at<float>(ws, lay.wt), *dgx = kf__at<float>(ws, lay.dgx);
    float *aux = kf__at<float>(ws, lay.aux);
    float *rpart = kf__at<float>(ws, lay.rpart);
    float *dh[2] = {kf__at<float>(ws, lay.dh[0]), kf__at<float>(ws, lay.dh[1])};
    // float32 views of the record (a float64 plan went to cuda/plain.cu above)
    const float *x32 = static_cast<const float *>(c->x), *dy32 = static_cast<const float *>(c->dy);
    const float *dhn32 = static_cast<const float *>(c->dhn);
    float *dx32 = static_cast<float *>(c->dx), *dh0_32 = static_cast<float *>(c->dh0);
    const size_t bh_bytes = (size_t)(B * H) * sizeof(float);
    int64_t xts, xbs; // the user's row strides of x, y, dy, dx
    kf__rnn_row_strides(p, 0, T, B, &xts, &xbs);
    const unsigned grid = kf__blocks(B * H, kThreads);
    const int BB = bwd_persistent_rows((int)H, B, ctx->sm_count, ctx->smem_optin_bytes);

    for (int64_t l = L - 1; l >= 0; --l) {
        const int64_t Il = kf__rnn_layer_input(p, (int32_t)l);
        int64_t ts, bs;
        kf__rnn_row_strides(p, (int32_t)l, T, B, &ts, &bs);
        const bool last = l == L - 1;
        const float *X = l == 0 ? x32 : kf__at<float>(c->reserve, kf__rs_out(&lay, l - 1));
        float *dX = l == 0 ? dx32 : kf__at<float>(ws, lay.din[l & 1]);
        for (int64_t d = 0; d < D; ++d) {
            const int64_t cell = l * D + d;
            const float *w[KF__AGRU_NW];
            float *dwv[KF__AGRU_NW] = {};
            for (int32_t j = 0; j < p->nw; ++j) {
                w[j] = static_cast<const float *>(c->w[cell * p->nw + j]);
                if (c->dw) dwv[j] = static_cast<float *>(c->dw[cell * p->nw + j]);
            }
            float *const *dw = c->dw ? dwv : nullptr;
            BwdArgs a = {};
            a.T = (int)T; a.B = (int)B; a.H = (int)H;
            a.reverse = d == 1;
            a.len = c->lengths;
            a.ts = ts; a.bs = bs;
            a.gates = kf__at<float>(c->reserve, kf__rs_gates(&lay, cell));
            a.hprev = kf__at<float>(c->reserve, kf__rs_hprev(&lay, cell));
            if (last) {
                a.dy = dy32;
                a.dy_ts = xts; a.dy_bs = xbs;
            } else {
                a.dy = kf__at<float>(ws, lay.din[(l + 1) & 1]);
                a.dy_ts = B; a.dy_bs = 1;
                a.drop = p->dropout > 0.0f;
            }
            a.dy_ld = D * H; a.dy_col = d * H; a.DH = D * H;
            a.p = p->dropout;
            a.scale = 1.0f / (1.0f - p->dropout);
            a.seed = c->seed;
            a.ctr_base = c->offset + (uint64_t)l * (uint64_t)T * (uint64_t)B * (uint64_t)(D * H);
            a.eps = agru ? w[KF__AGRU_EPS] : nullptr;
            a.dgx = dgx;
            a.dgh = aux;
            a.rh = aux;
            a.epsg = aux + TB * H;
            a.dstep = kf__at<float>(ws, lay.dstep);
            float *drh = kf__at<float>(ws, lay.drh);
            a.drh = drh;
            if (BB > 0) {
                // Persistent: M = W_hh (GRU) or [U_z; U_r; A] (A-GRU, formed into wt's space).
                const float *m = w[KF__GRU_W_HH];
                if (agru) {
                    prep_wrec<<<kf__blocks(3 * H * H, kThreads), kThreads, 0, s>>>(
                        (int)H, w[KF__AGRU_U_Z], w[KF__AGRU_U_R], w[KF__AGRU_W_H], p->gamma, wt);
                    KF__CUDA_LAUNCH_CHECK(fn, "prep_wrec");
                    m = wt;
                }
                const float *dhn = dhn32 ? dhn32 + cell * B * H : nullptr;
                float *dh0 = dh0_32 ? dh0_32 + cell * B * H : nullptr;
                KF_TRY(agru ? run_bwd_persistent<true>(ctx, fn, BB, a, m, dhn, dh0)
                            : run_bwd_persistent<false>(ctx, fn, BB, a, m, dhn, dh0));
            } else {
                if (agru) KF_TRY(kf__cuda_rnn_prep_wt(ctx, fn, p, w, wt));

                if (dhn32 != nullptr)
                    KF__CUDA_TRY(fn, cudaMemcpyAsync(dh[0], dhn32 + cell * B * H, bh_bytes,
                                                     cudaMemcpyDeviceToDevice, s));
                else
                    KF__CUDA_TRY(fn, cudaMemsetAsync(dh[0], 0, bh_bytes, s));
                for (int64_t k = 0; k < T; ++k) {
                    a.st = (int)(T - 1 - k);
                    a.dh = dh[k & 1];
                    a.dh_out = dh[(k + 1) & 1];
                    if (!agru) {
                        gru_bwd_step<<<grid, kThreads, 0, s>>>(a);
                        KF__CUDA_LAUNCH_CHECK(fn, "gru_bwd_step");
                        KF_TRY(kf__gemm(ctx, fn, false, false, B, H, 3 * H, 1.0f, a.dstep, 3 * H,
                                        w[KF__GRU_W_HH], H, 1.0f, a.dh_out, H));
                    } else {
                        agru_bwd_step1<<<grid, kThreads, 0, s>>>(a);
                        KF__CUDA_LAUNCH_CHECK(fn, "agru_bwd_step1");
                        // drh[b, k] = sum_i da_d[b, i] A[i, k], A[i, k] = wt[k, 2H + i]
                        KF_TRY(kf__gemm(ctx, fn, false, true, B, H, H, 1.0f, a.dstep + 2 * H, 3 * H,
                                        wt + 2 * H, 3 * H, 0.0f, drh, H));
                        agru_bwd_step2<<<grid, kThreads, 0, s>>>(a);
                        KF__CUDA_LAUNCH_CHECK(fn, "agru_bwd_step2");
                        // dh += [da_z, da_r] [U_z; U_r], [U_z; U_r][c, k] = wt[k, c]
                        KF_TRY(kf__gemm(ctx, fn, false, true, B, H, 2 * H, 1.0f, a.dstep, 3 * H, wt,
                                        3 * H, 1.0f, a.dh_out, H));
                    }
                }
                if (dh0_32 != nullptr)
                    KF__CUDA_TRY(fn, cudaMemcpyAsync(dh0_32 + cell * B * H, dh[T & 1], bh_bytes,
                                                     cudaMemcpyDeviceToDevice, s));
            }

            // Input gradient: both directions add into one buffer.
            if (dX != nullptr) {
                if (!agru) {
                    KF_TRY(kf__gemm(ctx, fn, false, false, TB, Il, 3 * H, 1.0f, dgx, 3 * H,
                                    w[KF__GRU_W_IH], Il, d == 0 ? 0.0f : 1.0f, dX, Il));
                } else {
                    const int wi[3] = {KF__AGRU_W_Z, KF__AGRU_W_R, KF__AGRU_V_H};
                    for (int g = 0; g < 3; ++g)
                        KF_TRY(kf__gemm(ctx, fn, false, false, TB, Il, H, 1.0f, dgx + g * H,
                                        3 * H, w[wi[g]], Il, g == 0 ? 0.0f : 1.0f, dX, Il));
                }
            }
            if (dw == nullptr) continue;
            // Weight and bias gradients over all T*B rows (rows of padded steps are zero).
            if (!agru) {
                KF_TRY(wgrad(ctx, fn, 3 * H, Il, TB, dgx, 3 * H, X, dw[KF__GRU_W_IH], acc));
                KF_TRY(wgrad(ctx, fn, 3 * H, H, TB, aux, 3 * H, a.hprev, dw[KF__GRU_W_HH], acc));
                KF_TRY(launch_col_sum(ctx, fn, dgx, TB, (int)(3 * H), 3 * H, rpart, dw[KF__GRU_B_IH],
                                      acc));
                KF_TRY(launch_col_sum(ctx, fn, aux, TB, (int)(3 * H), 3 * H, rpart, dw[KF__GRU_B_HH],
                                      acc));
            } else {
                const int wi[3] = {KF__AGRU_W_Z, KF__AGRU_W_R, KF__AGRU_V_H};
                const int bi[3] = {KF__AGRU_B_Z, KF__AGRU_B_R, KF__AGRU_B_H};
                for (int g = 0; g < 3; ++g) {
                    KF_TRY(wgrad(ctx, fn, H, Il, TB, dgx + g * H, 3 * H, X, dw[wi[g]], acc));
                    KF_TRY(launch_col_sum(ctx, fn, dgx + g * H, TB, (int)H, 3 * H, rpart, dw[bi[g]],
                                          acc));
                }
                KF_TRY(wgrad(ctx, fn, H, H, TB, dgx, 3 * H, a.hprev, dw[KF__AGRU_U_Z], acc));
                KF_TRY(wgrad(ctx, fn, H, H, TB, dgx + H, 3 * H, a.hprev, dw[KF__AGRU_U_R], acc));
                if (dw[KF__AGRU_W_H] != nullptr) {
                    float *da = kf__at<float>(ws, lay.da);
                    KF_TRY(wgrad(ctx, fn, H, H, TB, dgx + 2 * H, 3 * H, aux, da, false));
                    antisym_grad<<<kf__blocks(H * H, kThreads), kThreads, 0, s>>>(
                        da, (int)H, dw[KF__AGRU_W_H], acc);
                    KF__CUDA_LAUNCH_CHECK(fn, "antisym_grad");
                }
                if (dw[KF__AGRU_EPS] != nullptr) {
                    const int chunks = red_chunks(TB * H / 4);
                    double *dpart = (double *)rpart; // 64-byte aligned, chunks doubles fit
                    sum_all_part<<<chunks, 256, 0, s>>>(a.epsg, TB * H, dpart);
                    KF__CUDA_LAUNCH_CHECK(fn, "sum_all_part");
                    sum_all_fin<<<1, 256, 0, s>>>(dpart, chunks, dw[KF__AGRU_EPS], acc);
                    KF__CUDA_LAUNCH_CHECK(fn, "sum_all_fin");
                }
            }
        }
    }
    return KF_OK;
}

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
#include "counter_rng.h"
#include "rnn_cuda.cuh"

namespace {

constexpr int kThreads = 256;

struct BwdArgs {
    int T, B, H;
    int st;                   // step index in forward's processing order
    bool reverse;
    const int32_t *len;       // [B] or NULL = all T
    int64_t ts, bs;           // row order of this layer-direction's per-row buffers
    const float *gates;       // reserve [rows, KG]
    const float *hprev;       // reserve [rows, H]
    const float *dy;          // gradient of the layer output (NULL = none); element (t, b, j) at
    int64_t dy_ts, dy_bs, dy_ld, dy_col; // dy[(t*dy_ts + b*dy_bs)*dy_ld + dy_col + j]
    bool drop;                // the layer output went through dropout: mask dy the same way
    float p, scale;
    uint64_t seed, ctr_base;
    int64_t DH;
    const float *eps;         // A-GRU [1]
    const float *dh;          // [B, H] gradient w.r.t. the state after the step
    float *dh_out;            // [B, H] gradient w.r.t. the state before it (GEMM adds the rest)
    float *dgx;               // [rows, 3H]
    float *dgh;               // GRU [rows, 3H]
    float *rh, *epsg;         // A-GRU [rows, H]
    float *dstep;             // [B, 3H] this step's gradients by batch row
    const float *drh;         // A-GRU [B, H] da_d A
};

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
    const bool act = kf__step_time(a.st, a.len ? a.len[b] : a.T, a.reverse, &t);
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
    const bool act = kf__step_time(a.st, a.len ? a.len[b] : a.T, a.reverse, &t);
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
    const float *q = a.gates + row * 3 * H;
    const float z = q[j], d = q[2 * H + j];
    const float dad = g * eps * z * (1.0f - d * d);
    const float daz = g * eps * d * z * (1.0f - z);
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
    if (!kf__step_time(a.st, a.len ? a.len[b] : a.T, a.reverse, &t)) return;
    const int64_t row = t * a.ts + b * a.bs;
    const float r = a.gates[row * 3 * H + H + j], h = a.hprev[row * H + j], drh = a.drh[i];
    const float dar = drh * h * r * (1.0f - r);
    a.dgx[row * 3 * H + H + j] = dar;
    a.dstep[(int64_t)b * 3 * H + H + j] = dar;
    a.rh[row * H + j] = r * h;
    a.dh_out[i] += r * drh;
}

// out[c] (+)= sum over rows of m[row*ld + c], c < cols. Block: 32 columns x 8 row groups, the
// groups combined in a fixed order, so the result does not depend on scheduling.
__global__ void col_sum(const float *m, int64_t rows, int cols, int64_t ld, float *out, bool acc) {
    __shared__ float part[8][33];
    const int tx = threadIdx.x % 32, ty = threadIdx.x / 32, c = blockIdx.x * 32 + tx;
    float v = 0.0f;
    if (c < cols)
        for (int64_t r = ty; r < rows; r += 8) v += m[r * ld + c];
    part[ty][tx] = v;
    __syncthreads();
    if (ty == 0 && c < cols) {
        float s = 0.0f;
        for (int k = 0; k < 8; ++k) s += part[k][tx];
        out[c] = acc ? out[c] + s : s;
    }
}

// *out (+)= sum of v[0..n): one block of 1024 threads, tree in a fixed order.
__global__ void sum_all(const float *v, int64_t n, float *out, bool acc) {
    __shared__ float part[1024];
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += v[i];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) *out = acc ? *out + part[0] : part[0];
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
                         int64_t ld, float *out, bool acc) {
    if (out == nullptr) return KF_OK;
    col_sum<<<(unsigned)((cols + 31) / 32), 256, 0, kf__stream(ctx)>>>(m, rows, cols, ld, out, acc);
    KF__CUDA_LAUNCH_CHECK(fn, "col_sum");
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
    KF__CUDA_TRY(fn, cudaSetDevice(ctx->device_index));
    kf__rnn_cuda_layout lay;
    kf__rnn_cuda_layout_make(p, T, B, true, &lay);
    void *ws = c->ws;
    float *wt = kf__at<float>(ws, lay.wt), *dgx = kf__at<float>(ws, lay.dgx);
    float *aux = kf__at<float>(ws, lay.aux);
    float *dh[2] = {kf__at<float>(ws, lay.dh[0]), kf__at<float>(ws, lay.dh[1])};
    const size_t bh_bytes = (size_t)(B * H) * sizeof(float);
    int64_t xts, xbs; // the user's row strides of x, y, dy, dx
    kf__rnn_row_strides(p, 0, T, B, &xts, &xbs);
    const unsigned grid = kf__blocks(B * H, kThreads);

    for (int64_t l = L - 1; l >= 0; --l) {
        const int64_t Il = kf__rnn_layer_input(p, (int32_t)l);
        int64_t ts, bs;
        kf__rnn_row_strides(p, (int32_t)l, T, B, &ts, &bs);
        const bool last = l == L - 1;
        const float *X = l == 0 ? c->x : kf__at<float>(c->reserve, kf__rs_out(&lay, l - 1));
        float *dX = l == 0 ? c->dx : kf__at<float>(ws, lay.din[l & 1]);
        for (int64_t d = 0; d < D; ++d) {
            const int64_t cell = l * D + d;
            const float *const *w = c->w + cell * p->nw;
            float *const *dw = c->dw ? c->dw + cell * p->nw : nullptr;
            BwdArgs a = {};
            a.T = (int)T; a.B = (int)B; a.H = (int)H;
            a.reverse = d == 1;
            a.len = c->lengths;
            a.ts = ts; a.bs = bs;
            a.gates = kf__at<float>(c->reserve, kf__rs_gates(&lay, cell));
            a.hprev = kf__at<float>(c->reserve, kf__rs_hprev(&lay, cell));
            if (last) {
                a.dy = c->dy;
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
            if (agru) KF_TRY(kf__cuda_rnn_prep_wt(ctx, fn, p, w, wt));

            if (c->dhn != nullptr)
                KF__CUDA_TRY(fn, cudaMemcpyAsync(dh[0], c->dhn + cell * B * H, bh_bytes,
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
            if (c->dh0 != nullptr)
                KF__CUDA_TRY(fn, cudaMemcpyAsync(c->dh0 + cell * B * H, dh[T & 1], bh_bytes,
                                                 cudaMemcpyDeviceToDevice, s));

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
                KF_TRY(launch_col_sum(ctx, fn, dgx, TB, (int)(3 * H), 3 * H, dw[KF__GRU_B_IH], acc));
                KF_TRY(launch_col_sum(ctx, fn, aux, TB, (int)(3 * H), 3 * H, dw[KF__GRU_B_HH], acc));
            } else {
                const int wi[3] = {KF__AGRU_W_Z, KF__AGRU_W_R, KF__AGRU_V_H};
                const int bi[3] = {KF__AGRU_B_Z, KF__AGRU_B_R, KF__AGRU_B_H};
                for (int g = 0; g < 3; ++g) {
                    KF_TRY(wgrad(ctx, fn, H, Il, TB, dgx + g * H, 3 * H, X, dw[wi[g]], acc));
                    KF_TRY(launch_col_sum(ctx, fn, dgx + g * H, TB, (int)H, 3 * H, dw[bi[g]], acc));
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
                    sum_all<<<1, 1024, 0, s>>>(a.epsg, TB * H, dw[KF__AGRU_EPS], acc);
                    KF__CUDA_LAUNCH_CHECK(fn, "sum_all");
                }
            }
        }
    }
    return KF_OK;
}

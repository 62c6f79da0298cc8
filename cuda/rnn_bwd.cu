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
#include "lowp.h"
#include "lowp_ops.h"
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

// ---- persistent path ----------------------------------------------------------------------
// One launch runs all T steps of a layer-direction backwards (mirror of rnn_fwd.cu's persistent
// forward; H % 32 == 0, 64 <= H <= 128). Each block owns BB batch rows for every step, so no
// grid-wide barrier is needed. The step's gate-gradient row v [3H] (GRU: [da_r, da_z, da_n r];
// A-GRU: [da_z, da_r, da_d]) times M [3H, H] (GRU: W_hh; A-GRU: [U_z; U_r; A]) carries the state
// gradient back; M stays on chip: thread tid owns output columns 4cg..4cg+3 (cg = tid % ncg,
// ncg = H/4) over the c-slice [32s, 32s+32) (s = tid / ncg, KS = 3H/32 slices), 128 weights, the
// first kRK c-rows in registers and the rest in shared memory at ws[(cc - kRK)*nthr + tid]. Its
// partial products go to red[s][bb][H]; the KS slices are summed in a fixed order.
// Per step:
//  GRU:   (a) pointwise: g = dh + dy, gate gradients -> dgx, dgh (global) and v (shared);
//         (b) v M over all slices; (c) dh = g z + sum of the slices.
//  A-GRU: (a) pointwise: da_z, da_d -> dgx, v; r h, g z d -> aux; (b) v M over the A slices
//         (drh = da_d A) and the U_z slices; (c) da_r = drh h r (1-r) -> dgx, v;
//         (d) v M over the U_r slices; (e) dh = g + r drh + sum of the U slices.
// Each thread keeps the state gradient of up to kPMax = BB of the block's BB*H (row, unit) items
// in registers (nthr = 3H^2/128 >= H for H >= 43), and loads the next step's reserve rows while
// the current step's products run. Weights are read with scalar loads (user weights carry no
// alignment promise beyond float).

// A-GRU's M = [U_z; U_r; A] [3H, H] row-major, A = W_h - W_h^T - gamma I.
__global__ void prep_wrec(int H, const float *uz, const float *ur, const float *wh, float gamma,
                          float *m) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)3 * H * H) return;
    const int c = (int)(i / H), k = (int)(i % H);
    m[i] = kf__rnn_wrec(H, true, nullptr, uz, ur, wh, gamma, c, k);
}

// dL/dy at (t, b, j) after the layer's dropout mask (0 when there is no dy).
__device__ __forceinline__ float dy_at(const BwdArgs &a, int t, int b, int j) {
    if (a.dy == nullptr) return 0.0f;
    float v = a.dy[(t * a.dy_ts + b * a.dy_bs) * a.dy_ld + a.dy_col + j];
    if (a.drop) {
        uint64_t c = a.ctr_base + ((uint64_t)t * (uint64_t)a.B + (uint64_t)b) * (uint64_t)a.DH +
                     (uint64_t)(a.dy_col + j);
        v = kf__dropout_keep(a.seed, c, a.p) ? v * a.scale : 0.0f;
    }
    return v;
}

// Sum of slices s0..s1-1 of red at (bb, j), in slice order.
__device__ __forceinline__ float red_sum_t(const float *red, int s0, int s1, int BB, int H, int bb,
                                           int j) {
    float v = 0.0f;
    for (int s = s0; s < s1; ++s) v += red[(s * BB + bb) * H + j];
    return v;
}

// The reserve values of one (row, unit) item at one step, loaded ahead of their use.
struct BwdItem {
    float q0, q1, q2, q3; // GRU: r, z, n, hn; A-GRU: z, r, d's pre-activations (q3 unused)
    float h, dy;          // state before the step; masked output gradient
    int t;
    bool act;
};

template <int kPMax, bool kAgru>
__device__ __forceinline__ void bwd_load(const BwdArgs &a, const int *slen, int st, int tid,
                                         int nthr, int b0, int BB, BwdItem (&it)[kPMax]) {
    const int H = a.H;
#pragma unroll
    for (int p = 0; p < kPMax; ++p) {
        const int i = tid + p * nthr, bb = i / H, j = i % H, b = b0 + bb;
        it[p].act = false;
        it[p].t = st;
        if (i < BB * H && b < a.B && kf__step_time(st, slen[bb], a.reverse, &it[p].t)) {
            it[p].act = true;
            const int64_t row = it[p].t * a.ts + b * a.bs;
            const float *q = a.gates + row * (kAgru ? 3 : 4) * H;
            it[p].q0 = q[j];
            it[p].q1 = q[H + j];
            it[p].q2 = q[2 * H + j];
            it[p].q3 = kAgru ? 0.0f : q[3 * H + j];
            it[p].h = a.hprev[row * H + j];
            it[p].dy = dy_at(a, it[p].t, b, j);
        }
    }
}

template <int BB, bool kAgru>
__global__ void __launch_bounds__(kMaxThreads, 1)
rnn_bwd_persistent(BwdArgs a, const float *m, const float *dhn, float *dh0) {
    extern __shared__ float4 smem4[];
    constexpr int kPMax = BB, kRK = rk_for(BB);
    const int H = a.H, H3 = 3 * H, ncg = H / 4, KS = H3 / kKPT, nthr = ncg * KS;
    const int tid = threadIdx.x, cg = tid % ncg, s = tid / ncg, c0 = s * kKPT;
    const int b0 = blockIdx.x * BB;
    float4 *ws = smem4;
    float *sv = (float *)(ws + (kKPT - kRK) * nthr); // [BB, 3H] gate-gradient rows
    float *red = sv + BB * H3;                        // [KS, BB, H] partial products
    int *slen = (int *)(red + KS * BB * H);           // [BB]

    float4 wr[kRK];
#pragma unroll
    for (int cc = 0; cc < kRK; ++cc) {
        const float *mr = m + (int64_t)(c0 + cc) * H + 4 * cg;
        wr[cc] = make_float4(mr[0], mr[1], mr[2], mr[3]);
    }
    for (int cc = kRK; cc < kKPT; ++cc) {
        const float *mr = m + (int64_t)(c0 + cc) * H + 4 * cg;
        ws[(cc - kRK) * nthr + tid] = make_float4(mr[0], mr[1], mr[2], mr[3]);
    }
    for (int bb = tid; bb < BB; bb += nthr) {
        const int b = b0 + bb;
        slen[bb] = b < a.B ? (kf__row_length(a.len, b, a.T)) : 0;
    }
    float dh[kPMax], carry[kPMax];
#pragma unroll
    for (int p = 0; p < kPMax; ++p) {
        const int i = tid + p * nthr, b = b0 + i / H;
        dh[p] = (i < BB * H && b < a.B && dhn != nullptr) ? dhn[(int64_t)b * H + i % H] : 0.0f;
        carry[p] = 0.0f;
    }
    const float eps = kAgru ? *a.eps : 0.0f;
    // Slices by phase: GRU all at once; A-GRU the A and U_z slices (their inputs da_d, da_z are
    // known first), then the U_r slices (da_r needs drh = da_d A).
    const bool ph1 = !kAgru || c0 < H || c0 >= 2 * H, ph2 = kAgru && c0 >= H && c0 < 2 * H;
    const int KH = H / kKPT; // slices per H columns of v
    __syncthreads();

    BwdItem nx[kPMax];
    bwd_load<kPMax, kAgru>(a, slen, a.T - 1, tid, nthr, b0, BB, nx);
    for (int st = a.T - 1; st >= 0; --st) {
        int tc[kPMax];
        bool ac[kPMax];
        float rr[kPMax], hh[kPMax]; // rr: A-GRU, r's pre-activation
#pragma unroll
        for (int p = 0; p < kPMax; ++p) {
            const int i = tid + p * nthr, bb = i / H, j = i % H, b = b0 + bb;
            const BwdItem it = nx[p];
            tc[p] = it.t;
            ac[p] = it.act;
            rr[p] = it.q1;
            hh[p] = it.h;
            if (i >= BB * H) continue;
            float *v = sv + bb * H3;
            const int64_t row = it.t * a.ts + b * a.bs;
            float *dx = a.dgx + row * 3 * H;
            if (!it.act) {
                v[j] = v[H + j] = v[2 * H + j] = 0.0f;
                carry[p] = dh[p];
                if (b < a.B) {
                    dx[j] = dx[H + j] = dx[2 * H + j] = 0.0f;
                    if (!kAgru) {
                        float *dg = a.dgh + row * 3 * H;
                        dg[j] = dg[H + j] = dg[2 * H + j] = 0.0f;
                    } else {
                        a.rh[row * H + j] = 0.0f;
                        a.epsg[row * H + j] = 0.0f;
                    }
                }
                continue;
            }
            const float g = dh[p] + it.dy;
            if (!kAgru) {
                const float r = it.q0, z = it.q1, n = it.q2, hn = it.q3, h = it.h;
                const float dan = g * (1.0f - z) * (1.0f - n * n);
                const float daz = g * (h - n) * z * (1.0f - z);
                const float dar = dan * hn * r * (1.0f - r);
                float *dg = a.dgh + row * 3 * H;
                dx[j] = dar;
                dx[H + j] = daz;
                dx[2 * H + j] = dan;
                dg[j] = v[j] = dar;
                dg[H + j] = v[H + j] = daz;
                dg[2 * H + j] = v[2 * H + j] = dan * r;
                carry[p] = g * z;
            } else {
                const float z = sigm(it.q0), r = sigm(it.q1), d = tanhf(it.q2), h = it.h;
                const float dad = g * eps * z * tanh_dc(it.q2);
                const float daz = g * eps * d * z * sigm(-it.q0);
                dx[j] = v[j] = daz;
                dx[2 * H + j] = v[2 * H + j] = dad;
                a.epsg[row * H + j] = g * z * d;
                a.rh[row * H + j] = r * h;
                carry[p] = g;
            }
        }
        __syncthreads();
        // The next step's reserve rows load while this step's products run.
        if (st > 0) bwd_load<kPMax, kAgru>(a, slen, st - 1, tid, nthr, b0, BB, nx);
        if (ph1) kf__slice_matvec<BB, kRK>(sv, H3, c0, wr, ws, red, H, tid, nthr, s, cg);
        __syncthreads();
        if (kAgru) {
#pragma unroll
            for (int p = 0; p < kPMax; ++p) {
                const int i = tid + p * nthr, bb = i / H, j = i % H, b = b0 + bb;
                if (i >= BB * H) continue;
                float *v = sv + bb * H3;
                if (!ac[p]) {
                    v[H + j] = 0.0f;
                    continue;
                }
                const float drh = red_sum_t(red, 2 * KH, 3 * KH, BB, H, bb, j);
                const float r = sigm(rr[p]), h = hh[p];
                const float dar = drh * h * r * sigm(-rr[p]);
                a.dgx[(tc[p] * a.ts + b * a.bs) * 3 * H + H + j] = dar;
                v[H + j] = dar;
                carry[p] += r * drh;
            }
            __syncthreads();
            if (ph2) kf__slice_matvec<BB, kRK>(sv, H3, c0, wr, ws, red, H, tid, nthr, s, cg);
            __syncthreads();
        }
        // dh before this step; the next step's (a) runs after a barrier, before anyone
        // overwrites red.
#pragma unroll
        for (int p = 0; p < kPMax; ++p) {
            const int i = tid + p * nthr, bb = i / H, j = i % H;
            if (i >= BB * H) continue;
            dh[p] = ac[p] ? carry[p] + red_sum_t(red, 0, kAgru ? 2 * KH : 3 * KH, BB, H, bb, j)
                          : carry[p];
        }
    }
    if (dh0 != nullptr)
#pragma unroll
        for (int p = 0; p < kPMax; ++p) {
            const int i = tid + p * nthr, b = b0 + i / H;
            if (i < BB * H && b < a.B) dh0[(int64_t)b * H + i % H] = dh[p];
        }
}

size_t bwd_persistent_smem_bytes(int H, int BB) {
    const int nthr = (H / 4) * (3 * H / kKPT);
    return (size_t)(kKPT - rk_for(BB)) * nthr * sizeof(float4) +
           (size_t)BB * 3 * H * sizeof(float) + (size_t)(3 * H / kKPT) * BB * H * sizeof(float) +
           (size_t)BB * sizeof(int);
}

template <int BB, bool kAgru>
kf_status launch_bwd_persistent(kf_context *ctx, const char *fn, const BwdArgs &a,
                                const float *m, const float *dhn, float *dh0) {
    const int H = a.H, nthr = (H / 4) * (3 * H / kKPT);
    const size_t smem = bwd_persistent_smem_bytes(H, BB);
    auto kernel = rnn_bwd_persistent<BB, kAgru>;
    static kf__smem_optin optin; // smem <= the opt-in limit: bwd_persistent_rows chose BB so
    KF_TRY(optin.allow(ctx, fn, kernel));
    kernel<<<(unsigned)((a.B + BB - 1) / BB), nthr, smem, kf__stream(ctx)>>>(a, m, dhn, dh0);
    KF__CUDA_LAUNCH_CHECK(fn, "rnn_bwd_persistent");
    return KF_OK;
}

// Rows per block: the fewest that keep the grid within one wave of the SMs; 0 when the
// persistent kernel does not apply (same rule as the forward's).
int bwd_persistent_rows(int H, int64_t B, int sms, size_t smem_optin) {
    if (!kf__rnn_persistent_h(H)) return 0;
    static const int kChoices[3] = {1, 2, 4};
    int pick = 0;
    for (int c : kChoices) {
        if (bwd_persistent_smem_bytes(H, c) > smem_optin) break;
        pick = c;
        if ((B + c - 1) / c <= sms) break;
    }
    return pick;
}

template <bool kAgru>
kf_status run_bwd_persistent(kf_context *ctx, const char *fn, int BB, const BwdArgs &a,
                             const float *m, const float *dhn, float *dh0) {
    switch (BB) {
    case 1: return launch_bwd_persistent<1, kAgru>(ctx, fn, a, m, dhn, dh0);
    case 2: return launch_bwd_persistent<2, kAgru>(ctx, fn, a, m, dhn, dh0);
    default: return launch_bwd_persistent<4, kAgru>(ctx, fn, a, m, dhn, dh0);
    }
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

extern "C" kf_status kf__cuda_rnn_backward(kf_context *ctx, const kf__rnn_bwd *c) {
    static const char fn[] = "kf_rnn_backward";
    const struct kf_rnn_plan *p = c->plan;
    if (kf__cuda_rnn_plain(p)) return kf__cuda_rnn_plain_backward(ctx, c);
    if (kf__dtype_is_lowp(p->dtype)) return kf__lowp_rnn_ops.backward(ctx, c);
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

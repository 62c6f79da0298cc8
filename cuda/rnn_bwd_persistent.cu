// GRU and A-GRU backward on CUDA, the persistent path (cuda/rnn_bwd.cu's header comment): one
// launch runs all T steps of a layer-direction backwards, rnn_bwd_persistent, its launcher and
// the rows-per-block rule.
#include "rnn_bwd.cuh"

namespace kf_rnn {

namespace {

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

} // namespace

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

template kf_status run_bwd_persistent<false>(kf_context *, const char *, int, const BwdArgs &,
                                             const float *, const float *, float *);
template kf_status run_bwd_persistent<true>(kf_context *, const char *, int, const BwdArgs &,
                                            const float *, const float *, float *);

} // namespace kf_rnn

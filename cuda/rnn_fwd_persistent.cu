// GRU and A-GRU forward on CUDA, the persistent path (cuda/rnn_fwd.cu's header comment): one
// launch for all T steps, each block owning BB batch rows with the recurrent weights on chip;
// rnn_fwd_persistent for the GRU, agru_fwd_persistent for the A-GRU, their launchers, and the
// rows-per-block rule.
#include "rnn_fwd.cuh"

namespace kf_rnn {

namespace {

// Thread tid owns output columns 4cg..4cg+3 (cg = tid % ncg, ncg = 3H/4) over the k-slice
// [32s, 32s+32) (s = tid / ncg, KS = H/32 slices): 128 weights, the first kRK k-rows of them in
// registers (kRK = rk_for(BB)), the rest in shared memory at ws[(kk - kRK)*nthr + tid]
// (conflict-free float4s).
// Per step it forms partial products over its slice into red[s][bb][3H]; the pointwise phase
// sums the KS slices in a fixed order (deterministic) and applies the cell.
// Each thread evaluates the cell for up to kPMax = BB of the block's BB*H (row, unit) items,
// which holds when nthr = 3H^2/128 >= H, i.e. H >= 43 (the dispatcher asks for H >= 64).
// The register share shrinks as BB grows so that nothing spills under the 384-thread bound.

__device__ __forceinline__ float red_sum(const float *red, int KS, int BB, int H, int bb, int c) {
    float v = 0.0f;
    for (int s = 0; s < KS; ++s) v += red[(s * BB + bb) * 3 * H + c];
    return v;
}

template <int BB, bool kAgru, bool kTrain>
__global__ void __launch_bounds__(kMaxThreads, 1)
rnn_fwd_persistent(FwdArgs a, const float *wt, const float *h0, float *hn) {
    extern __shared__ float4 smem4[];
    constexpr int kPMax = BB, kRK = rk_for(BB);
    const int H = a.H, ncg = 3 * H / 4, KS = H / kKPT, nthr = ncg * KS;
    const int tid = threadIdx.x, cg = tid % ncg, s = tid / ncg, k0 = s * kKPT;
    const int b0 = blockIdx.x * BB;
    float4 *ws = smem4;
    float *sh = (float *)(ws + (kKPT - kRK) * nthr); // [BB, H] state
    float *srh = sh + BB * H;                         // [BB, H] r*h (A-GRU)
    float *red = srh + BB * H;                        // [KS, BB, 3H] partial products
    int *slen = (int *)(red + KS * BB * 3 * H);       // [BB]

    const float4 *wt4 = (const float4 *)wt;
    float4 wr[kRK];
#pragma unroll
    for (int kk = 0; kk < kRK; ++kk) wr[kk] = wt4[(int64_t)(k0 + kk) * ncg + cg];
    for (int kk = kRK; kk < kKPT; ++kk) ws[(kk - kRK) * nthr + tid] = wt4[(int64_t)(k0 + kk) * ncg + cg];
    for (int i = tid; i < BB * H; i += nthr) {
        const int b = b0 + i / H;
        sh[i] = (b < a.B && h0 != nullptr) ? h0[(int64_t)b * H + i % H] : 0.0f;
    }
    for (int bb = tid; bb < BB; bb += nthr) {
        const int b = b0 + bb;
        slen[bb] = b < a.B ? (kf__row_length(a.len, b, a.T)) : 0;
    }
    const float eps = kAgru ? *a.eps : 0.0f;
    // The slices whose columns a phase needs: GRU all; A-GRU z, r from h, then d from r*h.
    const bool ph1 = !kAgru || 4 * cg < 2 * H, ph2 = kAgru && 4 * cg >= 2 * H;
    __syncthreads();

    for (int st = 0; st < a.T; ++st) {
        // Issue this step's input-projection loads first: the matvec hides their latency.
        float gxv[kPMax][3];
        int tt[kPMax];
        bool act[kPMax];
#pragma unroll
        for (int p = 0; p < kPMax; ++p) {
            const int i = tid + p * nthr, bb = i / H, j = i % H, b = b0 + bb;
            act[p] = false;
            tt[p] = st;
            if (i < BB * H && b < a.B && kf__step_time(st, slen[bb], a.reverse, &tt[p])) {
                act[p] = true;
                const float *g = a.gx + (tt[p] * a.ts + b * a.bs) * 3 * H;
                gxv[p][0] = g[j];
                gxv[p][1] = g[H + j];
                gxv[p][2] = g[2 * H + j];
            }
        }
        if (ph1) kf__slice_matvec<BB, kRK>(sh, H, k0, wr, ws, red, 3 * H, tid, nthr, s, cg);
        __syncthreads();
        if (!kAgru) {
#pragma unroll
            for (int p = 0; p < kPMax; ++p) {
                const int i = tid + p * nthr, bb = i / H, j = i % H, b = b0 + bb;
                if (i >= BB * H || b >= a.B) continue;
                if (!act[p]) {
                    write_inactive<kTrain>(a, tt[p], b, j, 4);
                    continue;
                }
                const int64_t row = tt[p] * a.ts + b * a.bs;
                const float hnew = gru_cell<kTrain>(
                    a, row, j, gxv[p][0], gxv[p][1], gxv[p][2], red_sum(red, KS, BB, H, bb, j),
                    red_sum(red, KS, BB, H, bb, H + j), red_sum(red, KS, BB, H, bb, 2 * H + j),
                    sh[i]);
                sh[i] = hnew;
                write_out(a, tt[p], b, j, hnew);
            }
            __syncthreads();
        } else {
            float zv[kPMax], rv[kPMax]; // the pre-activations of z, r
#pragma unroll
            for (int p = 0; p < kPMax; ++p) {
                const int i = tid + p * nthr, bb = i / H, j = i % H;
                if (i >= BB * H) continue;
                zv[p] = rv[p] = 0.0f;
                if (act[p])
                    agru_zr(a, j, gxv[p][0], gxv[p][1], red_sum(red, KS, BB, H, bb, j),
                            red_sum(red, KS, BB, H, bb, H + j), &zv[p], &rv[p]);
                srh[i] = act[p] ? sigm(rv[p]) * sh[i] : 0.0f;
            }
            __syncthreads();
            if (ph2) kf__slice_matvec<BB, kRK>(srh, H, k0, wr, ws, red, 3 * H, tid, nthr, s, cg);
            __syncthreads();
#pragma unroll
            for (int p = 0; p < kPMax; ++p) {
                const int i = tid + p * nthr, bb = i / H, j = i % H, b = b0 + bb;
                if (i >= BB * H || b >= a.B) continue;
                if (!act[p]) {
                    write_inactive<kTrain>(a, tt[p], b, j, 3);
                    continue;
                }
                const int64_t row = tt[p] * a.ts + b * a.bs;
                const float hnew = agru_out<kTrain>(a, row, j, gxv[p][2],
                                                    red_sum(red, KS, BB, H, bb, 2 * H + j), zv[p],
                                                    rv[p], sh[i], eps);
                sh[i] = hnew;
                write_out(a, tt[p], b, j, hnew);
            }
            __syncthreads();
        }
    }
    if (hn != nullptr)
        for (int i = tid; i < BB * H; i += nthr) {
            const int b = b0 + i / H;
            if (b < a.B) hn[(int64_t)b * H + i % H] = sh[i];
        }
}

// ---- persistent A-GRU path ----------------------------------------------------------------
// The A-GRU step has two dependent products, [U_z; U_r] h and then A (r*h). Latency model per
// step at H = 128, BB = 1 (384 threads = 12 warps, 3 per SM sub-partition; smem 128 B/clk; FFMA
// latency 4 clk, one warp FFMA per clk per sub-partition):
//
//  before (rnn_fwd_persistent<1, true, *>): 4 __syncthreads per step, 2 partial-sum passes
//   through shared memory (red_sum: 8 + 4 dependent loads after a barrier), every thread's
//   dependent FMA chain 32 deep in both products; weights 16 of 32 k-rows in registers, so a
//   step streams 96 KB of weights from shared memory: ~770 clk of smem bandwidth (phase 1: 8
//   warps x 16 LDS.128 x 4 wavefronts = 512 clk; phase 2: 256 clk) against ~384 clk of FFMA
//   issue; bias loads (global, after the barrier) and the 3 input-projection loads per item
//   issued at the start of the step and consumed after the first barrier (at T = 784 gx is
//   154 MB, an HBM miss that the ~600 clk product only partly hides).
//
//  after (agru_fwd_persistent): 2 __syncthreads per step (B_mid: r*h and z ready; B_end: h'
//   ready). The four k-slices of a column group sit in adjacent lanes, so the partial sums meet
//   through 3 warp shuffles (a transpose-reduce: each lane ends with one column's full sum) and
//   the lane that owns a unit evaluates its gate at once, no partial-sum buffer and no barrier
//   between a product and its pointwise step. Warps are uniform in role: z warps and r warps
//   run [U_z; U_r] h concurrently in phase 1 (z then parks in shared memory until the end of the
//   step), A warps run A (r*h) and the cell update in phase 2. Dependent FMA chain per thread
//   still 32 deep per product (4 independent accumulators per batch row), then 3 shuffles.
//   Registers hold 24 of the 32 k-rows (BB = 1), so smem weight traffic per step halves to 48 KB
//   (~384 clk, matching the FFMA issue floor instead of doubling it). Each lane needs one
//   input-projection value per row and step; it is loaded one full step ahead (prefetch
//   distance 1, ~1 us of cover) and the biases live in registers.
//   Expected: ~ -0.35..-0.45 us per step at T = 784 (smem -384 clk, 2 barriers and 2 shared
//   reduction passes -150 clk, gx latency off the critical path).
// Shapes: H % 32 == 0, 64 <= H <= 128; KS = 4 slices of KPT = H/4 k-rows, thread tid = cg*4 + s
// owns columns 4cg..4cg+3 of [U_z; U_r; A] (warp w: columns 32w..32w+31, one role per warp)
// over the k chunks {s + 4m} (float4 chunk index, so the 4 lanes of a group read 4 adjacent
// chunks of the state: one shared-memory wavefront). nthr = 3H.
__host__ __device__ constexpr int agru_rk(int KPT, int BB) {
    return (BB == 1 ? 24 : BB == 2 ? 16 : 8) < KPT ? (BB == 1 ? 24 : BB == 2 ? 16 : 8) : KPT;
}

template <int BB, int KPT, int kRK>
__device__ __forceinline__ void agru_matvec(const float *src, const float4 (&wr)[kRK],
                                            const float4 *ws, int tid, int nthr, int s, int H,
                                            float4 (&acc)[BB]) {
#pragma unroll
    for (int bb = 0; bb < BB; ++bb) acc[bb] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int m = 0; m < KPT / 4; ++m) {
        float4 hv[BB];
#pragma unroll
        for (int bb = 0; bb < BB; ++bb) hv[bb] = *(const float4 *)&src[bb * H + 4 * (s + 4 * m)];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int kk = 4 * m + q;
            const float4 w = kk < kRK ? wr[kk < kRK ? kk : 0] : ws[(kk - kRK) * nthr + tid];
#pragma unroll
            for (int bb = 0; bb < BB; ++bb) {
                const float x = q == 0 ? hv[bb].x : q == 1 ? hv[bb].y : q == 2 ? hv[bb].z : hv[bb].w;
                acc[bb].x = fmaf(w.x, x, acc[bb].x);
                acc[bb].y = fmaf(w.y, x, acc[bb].y);
                acc[bb].z = fmaf(w.z, x, acc[bb].z);
                acc[bb].w = fmaf(w.w, x, acc[bb].w);
            }
        }
    }
}

// Sum of the 4 lanes' float4 partials (lanes 4g..4g+3): lane s returns column 2*(s&1) + (s>>1)
// of the group, summed as (p_s + p_{s^1}) + (p_{s^2} + p_{s^3}).
__device__ __forceinline__ float quad_reduce(float4 v, int s) {
    const bool hi0 = s & 1, hi1 = s & 2;
    float k0 = hi0 ? v.z : v.x, k1 = hi0 ? v.w : v.y;
    const float o0 = hi0 ? v.x : v.z, o1 = hi0 ? v.y : v.w;
    k0 += __shfl_xor_sync(0xffffffffu, o0, 1);
    k1 += __shfl_xor_sync(0xffffffffu, o1, 1);
    const float keep = hi1 ? k1 : k0, send = hi1 ? k0 : k1;
    return keep + __shfl_xor_sync(0xffffffffu, send, 2);
}

template <int BB, int KPT, bool kTrain>
__global__ void __launch_bounds__(kMaxThreads, 1)
agru_fwd_persistent(FwdArgs a, const float *wt, const float *h0, float *hn) {
    extern __shared__ float4 smem4[];
    constexpr int kRK = agru_rk(KPT, BB);
    const int H = a.H, ncg = 3 * H / 4, nthr = 3 * H;
    const int tid = threadIdx.x, cg = tid >> 2, s = tid & 3;
    const int role = (tid >> 5) / (H / 32); // 0: z, 1: r, 2: A (warp-uniform)
    const int j = 4 * cg + 2 * (s & 1) + (s >> 1) - role * H; // unit this lane finishes
    const int b0 = blockIdx.x * BB;
    float4 *ws = smem4;
    float *sh = (float *)(ws + (KPT - kRK) * nthr); // [BB, H] state
    float *srh = sh + BB * H;                        // [BB, H] r*h
    float *sz = srh + BB * H;                        // [BB, H] z

    const float4 *wt4 = (const float4 *)wt;
    float4 wr[kRK];
#pragma unroll
    for (int kk = 0; kk < kRK; ++kk)
        wr[kk] = wt4[(int64_t)(4 * (s + 4 * (kk >> 2)) + (kk & 3)) * ncg + cg];
    for (int kk = kRK; kk < KPT; ++kk)
        ws[(kk - kRK) * nthr + tid] = wt4[(int64_t)(4 * (s + 4 * (kk >> 2)) + (kk & 3)) * ncg + cg];
    for (int i = tid; i < BB * H; i += nthr) {
        const int b = b0 + i / H;
        sh[i] = (b < a.B && h0 != nullptr) ? h0[(int64_t)b * H + i % H] : 0.0f;
    }
    int len[BB];
#pragma unroll
    for (int bb = 0; bb < BB; ++bb) {
        const int b = b0 + bb;
        len[bb] = b < a.B ? (kf__row_length(a.len, b, a.T)) : 0; // rows past B are never active
    }
    const float eps = *a.eps;
    const float bias = (role == 0 ? a.bx[0] : role == 1 ? a.bx[1] : a.bx[2])[j];
    const float *gxc = a.gx + role * H + j;
    // Input projection of step st for this lane's unit, one step ahead of its use.
    float gnext[BB];
#pragma unroll
    for (int bb = 0; bb < BB; ++bb) {
        int t;
        gnext[bb] = 0.0f;
        if (kf__step_time(0, len[bb], a.reverse, &t))
            gnext[bb] = __ldg(gxc + (t * a.ts + (b0 + bb) * a.bs) * 3 * H);
    }
    __syncthreads();

    for (int st = 0; st < a.T; ++st) {
        float gcur[BB];
#pragma unroll
        for (int bb = 0; bb < BB; ++bb) {
            gcur[bb] = gnext[bb];
            int t;
            if (st + 1 < a.T && kf__step_time(st + 1, len[bb], a.reverse, &t))
                gnext[bb] = __ldg(gxc + (t * a.ts + (b0 + bb) * a.bs) * 3 * H);
        }
        float4 acc[BB];
        if (role != 2) { // phase 1: z = sigm(W_z x + b_z + U_z h), r likewise, r*h
            agru_matvec<BB, KPT, kRK>(sh, wr, ws, tid, nthr, s, H, acc);
#pragma unroll
            for (int bb = 0; bb < BB; ++bb) {
                const float sum = quad_reduce(acc[bb], s);
                const int b = b0 + bb;
                int t;
                const bool act = kf__step_time(st, len[bb], a.reverse, &t);
                const float pre = act ? gcur[bb] + bias + sum : 0.0f, g = act ? sigm(pre) : 0.0f;
                if (role == 0) sz[bb * H + j] = g;
                else srh[bb * H + j] = act ? g * sh[bb * H + j] : 0.0f;
                if (kTrain && b < a.B) // the pre-activation (rnn_cuda.cuh)
                    a.gates[(t * a.ts + b * a.bs) * 3 * H + role * H + j] = pre;
            }
        }
        __syncthreads(); // B_mid: r*h and z of every row are in shared memory
        if (role == 2) { // phase 2: d = tanh(V_h x + b_h + A (r*h)), h' = h + eps z d
            agru_matvec<BB, KPT, kRK>(srh, wr, ws, tid, nthr, s, H, acc);
#pragma unroll
            for (int bb = 0; bb < BB; ++bb) {
                const float sum = quad_reduce(acc[bb], s);
                const int b = b0 + bb;
                if (b >= a.B) continue;
                int t;
                if (!kf__step_time(st, len[bb], a.reverse, &t)) {
                    // write_inactive's zeros; the z and r gates were zeroed in phase 1
                    a.out[(t * a.out_ts + b * a.out_bs) * a.out_ld + a.out_col + j] = 0.0f;
                    if (kTrain) {
                        const int64_t row = t * a.ts + b * a.bs;
                        a.gates[row * 3 * H + 2 * H + j] = 0.0f;
                        a.hprev[row * H + j] = 0.0f;
                    }
                    continue;
                }
                const int64_t row = t * a.ts + b * a.bs;
                const float h = sh[bb * H + j];
                const float ad = gcur[bb] + bias + sum;
                const float hnew = h + eps * (sz[bb * H + j] * tanhf(ad));
                if (kTrain) {
                    a.gates[row * 3 * H + 2 * H + j] = ad;
                    a.hprev[row * H + j] = h;
                }
                sh[bb * H + j] = hnew;
                write_out(a, t, b, j, hnew);
            }
        }
        __syncthreads(); // B_end: h' of every row is in shared memory
    }
    if (hn != nullptr)
        for (int i = tid; i < BB * H; i += nthr) {
            const int b = b0 + i / H;
            if (b < a.B) hn[(int64_t)b * H + i % H] = sh[i];
        }
}

size_t agru_persistent_smem_bytes(int H, int BB) {
    const int KPT = H / 4, rk = agru_rk(KPT, BB);
    return (size_t)(KPT - rk) * 3 * H * sizeof(float4) + (size_t)3 * BB * H * sizeof(float);
}

template <int BB, int KPT, bool kTrain>
kf_status launch_agru_persistent(kf_context *ctx, const char *fn, const FwdArgs &a,
                                 const float *wt, const float *h0, float *hn) {
    const size_t smem = agru_persistent_smem_bytes(a.H, BB);
    auto kernel = agru_fwd_persistent<BB, KPT, kTrain>;
    static kf__smem_optin optin; // smem <= the opt-in limit: persistent_rows chose BB so
    KF_TRY(optin.allow(ctx, fn, kernel));
    kernel<<<(unsigned)((a.B + BB - 1) / BB), 3 * a.H, smem, kf__stream(ctx)>>>(a, wt, h0, hn);
    KF__CUDA_LAUNCH_CHECK(fn, "agru_fwd_persistent");
    return KF_OK;
}

size_t persistent_smem_bytes(int H, int BB) {
    const int nthr = (3 * H / 4) * (H / kKPT);
    return (size_t)(kKPT - rk_for(BB)) * nthr * sizeof(float4) + (size_t)2 * BB * H * sizeof(float) +
           (size_t)(H / kKPT) * BB * 3 * H * sizeof(float) + (size_t)BB * sizeof(int);
}

template <int BB, bool kAgru, bool kTrain>
kf_status launch_persistent(kf_context *ctx, const char *fn, const FwdArgs &a, const float *wt,
                            const float *h0, float *hn) {
    const int H = a.H, nthr = (3 * H / 4) * (H / kKPT);
    const size_t smem = persistent_smem_bytes(H, BB);
    auto kernel = rnn_fwd_persistent<BB, kAgru, kTrain>;
    static kf__smem_optin optin; // smem <= the opt-in limit: persistent_rows chose BB so
    KF_TRY(optin.allow(ctx, fn, kernel));
    kernel<<<(unsigned)((a.B + BB - 1) / BB), nthr, smem, kf__stream(ctx)>>>(a, wt, h0, hn);
    KF__CUDA_LAUNCH_CHECK(fn, "rnn_fwd_persistent");
    return KF_OK;
}

} // namespace

template <bool kTrain>
kf_status run_agru_persistent(kf_context *ctx, const char *fn, int BB, const FwdArgs &a,
                              const float *wt, const float *h0, float *hn) {
#define KF__AGRU_P(bb)                                                                          \
    switch (a.H) {                                                                              \
    case 64: return launch_agru_persistent<bb, 16, kTrain>(ctx, fn, a, wt, h0, hn);             \
    case 96: return launch_agru_persistent<bb, 24, kTrain>(ctx, fn, a, wt, h0, hn);             \
    default: return launch_agru_persistent<bb, 32, kTrain>(ctx, fn, a, wt, h0, hn);             \
    }
    switch (BB) {
    case 1: KF__AGRU_P(1)
    case 2: KF__AGRU_P(2)
    default: KF__AGRU_P(4)
    }
#undef KF__AGRU_P
}

// Rows per block: the fewest that keep the grid within one wave of the SMs, so that every
// block runs at once; 0 when the persistent kernel does not apply to this shape. Sized by the
// shared memory of the kernel that will run: the A-GRU's warp-role kernel
// (agru_persistent_smem_bytes) or the GRU's.
int persistent_rows(bool agru, int H, int64_t B, int sms, size_t smem_optin) {
    if (!kf__rnn_persistent_h(H)) return 0;
    static const int kChoices[3] = {1, 2, 4};
    int pick = 0;
    for (int c : kChoices) {
        const size_t need = agru ? agru_persistent_smem_bytes(H, c) : persistent_smem_bytes(H, c);
        if (need > smem_optin) break;
        pick = c;
        if ((B + c - 1) / c <= sms) break;
    }
    return pick;
}

template <bool kAgru, bool kTrain>
kf_status run_persistent(kf_context *ctx, const char *fn, int BB, const FwdArgs &a,
                         const float *wt, const float *h0, float *hn) {
    switch (BB) {
    case 1: return launch_persistent<1, kAgru, kTrain>(ctx, fn, a, wt, h0, hn);
    case 2: return launch_persistent<2, kAgru, kTrain>(ctx, fn, a, wt, h0, hn);
    default: return launch_persistent<4, kAgru, kTrain>(ctx, fn, a, wt, h0, hn);
    }
}

template kf_status run_persistent<false, false>(kf_context *, const char *, int, const FwdArgs &,
                                                const float *, const float *, float *);
template kf_status run_persistent<false, true>(kf_context *, const char *, int, const FwdArgs &,
                                               const float *, const float *, float *);
template kf_status run_agru_persistent<false>(kf_context *, const char *, int, const FwdArgs &,
                                              const float *, const float *, float *);
template kf_status run_agru_persistent<true>(kf_context *, const char *, int, const FwdArgs &,
                                             const float *, const float *, float *);

} // namespace kf_rnn

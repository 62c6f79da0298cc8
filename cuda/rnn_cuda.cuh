// Workspace and reserve layout of the CUDA recurrent backend (cuda/rnn_fwd.cu, cuda/rnn_bwd.cu),
// shared so that forward writes the reserve exactly where backward reads it.
//
// Letters: T steps, B batch, I input, H hidden, L layers, D directions, NG gate columns per row
// (3: GRU r,z,n / A-GRU z,r,d). "Rows" of a layer-direction are its (t, b) pairs in the memory
// order of that layer's input: x's order for layer 0 (time- or batch-major), time-major for
// the inner layers. Every per-row buffer of a layer-direction (input projection, gates, previous
// states, their gradients) uses that order, so the weight-gradient GEMMs pair rows directly.
//
// Reserve (training forward -> backward), per layer-direction (l, d):
//   gates [T*B, KG]   GRU: r, z, n, W_hn h + b_hn (KG = 4H); A-GRU: the pre-activations of
//                     z, r, d (KG = 3H), whence backward takes each gate and its complement
//                     (sigm, tanh_dc below)
//   hprev [T*B, H]    state before the step at that (t, b)
//   both zero at padded (t >= len[b]) rows, so zero gradients there meet finite values
// and per layer l < L-1: out_l [T*B, D*H] time-major, the layer's output after dropout (the next
// layer's input).
//
// Workspace (the larger of forward's and backward's needs):
//   forward:  wt [H, 3H] recurrent weights transposed (GRU: W_hh^T; A-GRU: [U_z; U_r; A]^T)
//             gx [T*B, 3H] input projection (no bias)
//             h[2] [B, H] state ping-pong, gh [B, 3H], rh [B, H] (per-step path)
//             act[2] [T*B, D*H] inner layer outputs (inference only; training uses out_l)
//   backward: wt as forward; dgx [T*B, 3H] gradients of the gate pre-activations (x side);
//             aux [T*B, 3H] (GRU: dgh, gradient of W_hh h + b_hh; A-GRU: r*h in the first
//             T*B*H, the epsilon terms g*z*d in the next); dh[2] [B, H] state-gradient
//             ping-pong; dstep [B, 3H] this step's gradients compacted by batch row for the
//             recurrent GEMM; drh [B, H]; da [H, H] (A-GRU); din[2] [T*B, D*H] gradient of an
//             inner layer's input (ping-pong between layers); rpart [KF__RNN_RED_CHUNKS, 3H + 1]
//             per-chunk partial sums of the bias (and epsilon) gradient reductions.
#ifndef KF_RNN_CUDA_CUH
#define KF_RNN_CUDA_CUH

#include "common.cuh"
#include "cuda_backend.cuh"

// Row chunks of the two-pass column sums of backward (bias and epsilon gradients).
#define KF__RNN_RED_CHUNKS 512

struct kf__rnn_cuda_layout {
    // reserve, byte offsets from its base: cell i = l*D + d has gates at i*cell_bytes and hprev
    // at i*cell_bytes + gates_bytes; out_l at out_base + l*out_bytes (kf__rs_* below)
    size_t gates_bytes, cell_bytes, out_base, out_bytes;
    size_t reserve_bytes;
    // workspace, byte offsets from its base
    size_t wt, gx, h[2], gh, rh, act[2];                 // forward
    size_t dgx, aux, dh[2], dstep, drh, da, din[2], rpart; // backward (wt shared)
    size_t ws_bytes;
};

static inline int64_t kf__rnn_kg(const struct kf_rnn_plan *p) {
    return p->cell == KF_RNN_GRU ? 4 * p->H : 3 * p->H;
}

// Fills `lay` for (T, B). Sizes were overflow-checked by the front end for the CPU layout of the
// same tensors; the arithmetic here stays within the same magnitudes.
static inline void kf__rnn_cuda_layout_make(const struct kf_rnn_plan *p, int64_t T, int64_t B,
                                            bool training, struct kf__rnn_cuda_layout *lay) {
    const size_t f = sizeof(float);
    const size_t TB = (size_t)T * (size_t)B, H = (size_t)p->H, DH = (size_t)p->D * H;
    lay->gates_bytes = kf__align_up(TB * (size_t)kf__rnn_kg(p) * f);
    lay->cell_bytes = lay->gates_bytes + kf__align_up(TB * H * f);
    lay->out_base = (size_t)p->L * (size_t)p->D * lay->cell_bytes;
    lay->out_bytes = kf__align_up(TB * DH * f);
    size_t o = training ? lay->out_base + (size_t)(p->L - 1) * lay->out_bytes : 0;
    lay->reserve_bytes = o;

    // Forward and backward share wt; the rest of each overlaps the other's.
    size_t base = 0;
    lay->wt = base; base += kf__align_up(H * 3 * H * f);
    o = base;
    lay->gx = o; o += kf__align_up(TB * 3 * H * f);
    for (int i = 0; i < 2; ++i) { lay->h[i] = o; o += kf__align_up(B * H * f); }
    lay->gh = o; o += kf__align_up((size_t)B * 3 * H * f);
    lay->rh = o; o += kf__align_up((size_t)B * H * f);
    for (int i = 0; i < 2; ++i) {
        lay->act[i] = o;
        if (!training && p->L > 1) o += kf__align_up(TB * DH * f);
    }
    size_t fwd_end = o;
    o = base;
    lay->dgx = o; o += kf__align_up(TB * 3 * H * f);
    lay->aux = o; o += kf__align_up(TB * 3 * H * f);
    for (int i = 0; i < 2; ++i) { lay->dh[i] = o; o += kf__align_up((size_t)B * H * f); }
    lay->dstep = o; o += kf__align_up((size_t)B * 3 * H * f);
    lay->drh = o; o += kf__align_up((size_t)B * H * f);
    lay->da = o; o += kf__align_up(H * H * f);
    for (int i = 0; i < 2; ++i) {
        lay->din[i] = o;
        if (p->L > 1) o += kf__align_up(TB * DH * f);
    }
    lay->rpart = o; o += kf__align_up((size_t)KF__RNN_RED_CHUNKS * (3 * H + 1) * f);
    size_t bwd_end = training ? o : 0;
    lay->ws_bytes = fwd_end > bwd_end ? fwd_end : bwd_end;
}

static inline size_t kf__rs_gates(const kf__rnn_cuda_layout *y, int64_t i) {
    return (size_t)i * y->cell_bytes;
}
static inline size_t kf__rs_hprev(const kf__rnn_cuda_layout *y, int64_t i) {
    return (size_t)i * y->cell_bytes + y->gates_bytes;
}
static inline size_t kf__rs_out(const kf__rnn_cuda_layout *y, int64_t l) {
    return y->out_base + (size_t)l * y->out_bytes;
}

// Row order of layer l's per-row buffers: (t stride, b stride) in rows.
static inline void kf__rnn_row_strides(const struct kf_rnn_plan *p, int32_t l, int64_t T,
                                       int64_t B, int64_t *ts, int64_t *bs) {
    if (l == 0 && p->batch_first) { *ts = 1; *bs = T; }
    else { *ts = B; *bs = 1; }
}

// Length of batch row b (< B): lengths[b] clamped to 0..T, or T without lengths. Device-resident
// lengths cannot be checked on the host without a synchronisation (capi/src/rnn.c checks host
// ones), so every kernel loads a length through here and a bad one can never index outside
// [0, T): the reverse direction starts at the clamped length - 1.
static __device__ __forceinline__ int kf__row_length(const int32_t *len, int b, int T) {
    if (!len) return T;
    const int l = len[b];
    return l < 0 ? 0 : (l > T ? T : l);
}

// Time index of step st (0..T-1, in processing order) for a row of length len: the reverse
// direction starts at len-1. Steps past the length are inactive: the state is kept, and the
// padded position t = st gets y = 0 (and zero reserve/gradient rows).
static __device__ __forceinline__ bool kf__step_time(int st, int len, bool reverse, int *t) {
    if (st < len) {
        *t = reverse ? len - 1 - st : st;
        return true;
    }
    *t = st;
    return false;
}

// The gates of forward and backward: sigm(x), whose complement 1 - sigm(x) is sigm(-x), and
// tanh_dc(x) = 1 - tanh(x)^2 = 1 / cosh(x)^2 (0 where cosh overflows). The A-GRU's reserve keeps
// the pre-activations, so that backward's 1 - z, 1 - r and 1 - d^2 do not cancel in a saturated
// gate, as they did taken from the rounded gates (cpu/rnn_simd.h, kf__vf_sigmoid_c).
__device__ __forceinline__ float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float tanh_dc(float x) {
    const float c = coshf(x);
    return 1.0f / (c * c);
}

// Element (c, k) of the recurrent matrix Wrec [3H, H] of one cell: W_hh for a GRU, or
// [U_z; U_r; A] for an A-GRU with A = W_h - W_h^T - gamma I (formed here, once per call, by the
// kernels that lay Wrec out for the forward and backward recurrences).
static __device__ __forceinline__ float kf__rnn_wrec(int H, bool agru, const float *w_hh,
                                                     const float *uz, const float *ur,
                                                     const float *wh, float gamma, int c, int k) {
    if (!agru) return w_hh[(int64_t)c * H + k];
    if (c < H) return uz[(int64_t)c * H + k];
    if (c < 2 * H) return ur[(int64_t)(c - H) * H + k];
    const int r = c - 2 * H;
    float v = wh[(int64_t)r * H + k] - wh[(int64_t)k * H + r];
    return r == k ? v - gamma : v;
}

// ---- the persistent recurrences' shared slice product ----------------------------------------
// A block of nthr threads multiplies BB rows v[bb][0:3H or H] by a matrix whose 128-float slice
// per thread (output columns 4cg..4cg+3 over the k-slice [k0, k0 + kKPT)) sits first in
// registers (kRK k-rows) and then in shared memory at ws[(kk - kRK) * nthr + tid] (conflict-free
// float4s). The register share rk_for(BB) shrinks as BB grows so nothing spills under the
// 384-thread bound.
constexpr int kKPT = 32, kMaxThreads = 384;
__host__ __device__ constexpr int rk_for(int BB) { return BB == 1 ? 16 : BB == 2 ? 12 : 4; }

// The hidden sizes the persistent kernels (forward and backward) take: 64, 96 and 128.
static inline bool kf__rnn_persistent_h(int64_t H) {
    return H % kKPT == 0 && H >= 64 && H <= 128;
}

// red[(s*BB + bb) * ld_red + 4cg .. +3] = sum over the slice of src[bb*ld_src + k] M[k][4cg..+3]
template <int BB, int kRK>
static __device__ __forceinline__ void kf__slice_matvec(const float *src, int ld_src, int k0,
                                                        const float4 (&wr)[kRK], const float4 *ws,
                                                        float *red, int ld_red, int tid,
                                                        int nthr, int s, int cg) {
    float4 acc[BB];
#pragma unroll
    for (int bb = 0; bb < BB; ++bb) acc[bb] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int kk = 0; kk < kKPT; kk += 4) {
        float4 hv[BB];
#pragma unroll
        for (int bb = 0; bb < BB; ++bb) hv[bb] = *(const float4 *)&src[bb * ld_src + k0 + kk];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const float4 w = (kk + q < kRK) ? wr[(kk + q) % kRK] : ws[(kk + q - kRK) * nthr + tid];
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
#pragma unroll
    for (int bb = 0; bb < BB; ++bb) *(float4 *)&red[(s * BB + bb) * ld_red + 4 * cg] = acc[bb];
}

// The op table's entries (rnn_fwd.cu, rnn_bwd.cu).
extern "C" void kf__cuda_rnn_sizes(const struct kf_rnn_plan *p, int64_t T, int64_t B,
                                   bool training, size_t *ws_bytes, size_t *reserve_bytes);
extern "C" kf_status kf__cuda_rnn_forward(kf_context *ctx, const kf__rnn_fwd *c);
extern "C" kf_status kf__cuda_rnn_backward(kf_context *ctx, const kf__rnn_bwd *c);

// Forms wt [H, 3H] = Wrec^T of cell (l, d) on the stream (rnn_fwd.cu); backward reuses it.
kf_status kf__cuda_rnn_prep_wt(kf_context *ctx, const char *fn, const struct kf_rnn_plan *p,
                               const float *const *w, float *wt);

#endif // KF_RNN_CUDA_CUH

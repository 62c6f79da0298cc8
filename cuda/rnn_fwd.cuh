// GRU and A-GRU forward on CUDA, what the per-step path (cuda/rnn_fwd.cu) and the persistent path
// (cuda/rnn_fwd_persistent.cu) share: the step record FwdArgs and the cell's device expressions
// (both paths evaluate the cell with these, hence the same operation order), and the persistent
// path's entry points. Private to those two files.
#ifndef KF_CUDA_RNN_FWD_CUH
#define KF_CUDA_RNN_FWD_CUH

#include "counter_rng.h"
#include "rnn_cuda.cuh"

#include <math.h>

namespace kf_rnn {


// Everything one step of a layer-direction reads and writes; the persistent kernel reads the
// same record and ignores the per-step buffers (st, h, h_out, gh, rh).
struct FwdArgs {
    int T, B, H;
    int st;                   // step index 0..T-1 (per-step kernels)
    bool reverse;
    const int32_t *len;       // [B] or NULL = all T
    const float *gx;          // [rows, 3H] input projection, rows t*ts + b*bs
    int64_t ts, bs;
    const float *bx[3];       // GRU: b_ih gate blocks r, z, n; A-GRU: b_z, b_r, b_h
    const float *b_hh;        // GRU: [3H]
    const float *eps;         // A-GRU: [1]
    const float *h;           // [B, H] state in (per step)
    float *h_out;             // [B, H] state out (per step)
    float *gh;                // [B, 3H] recurrent products (per step)
    float *rh;                // [B, H] r*h (A-GRU per step)
    float *out;               // layer output; element (t, b, j) at
    int64_t out_ts, out_bs, out_ld, out_col; //   out[(t*out_ts + b*out_bs)*out_ld + out_col + j]
    bool drop;                // dropout on out (training, inner layer)
    float p, scale;
    uint64_t seed, ctr_base;  // counter of (t, b, col) = ctr_base + (t*B + b)*DH + col
    int64_t DH;
    float *gates;             // reserve [rows, KG] (training)
    float *hprev;             // reserve [rows, H] (training)
};

__device__ __forceinline__ void write_out(const FwdArgs &a, int t, int b, int j, float v) {
    if (a.drop) {
        uint64_t c = a.ctr_base + ((uint64_t)t * (uint64_t)a.B + (uint64_t)b) * (uint64_t)a.DH +
                     (uint64_t)(a.out_col + j);
        v = kf__dropout_keep(a.seed, c, a.p) ? v * a.scale : 0.0f;
    }
    a.out[(t * a.out_ts + b * a.out_bs) * a.out_ld + a.out_col + j] = v;
}

// Padded (t, b): output 0, and in training zero gates and hprev so that backward's zero
// gradients there meet finite values in the weight-gradient GEMMs.
template <bool kTrain>
__device__ __forceinline__ void write_inactive(const FwdArgs &a, int t, int b, int j, int kg) {
    a.out[(t * a.out_ts + b * a.out_bs) * a.out_ld + a.out_col + j] = 0.0f;
    if (kTrain) {
        int64_t row = t * a.ts + b * a.bs;
        for (int g = 0; g < kg; ++g) a.gates[row * kg * a.H + g * a.H + j] = 0.0f;
        a.hprev[row * a.H + j] = 0.0f;
    }
}

// torch.nn.GRU cell for one (b, j): gxi = x-side pre-activations (no bias), ghi = h-side
// products (no bias). Returns h' and records r, z, n, W_hn h + b_hn when training.
template <bool kTrain>
__device__ __forceinline__ float gru_cell(const FwdArgs &a, int64_t row, int j, float gxr,
                                          float gxz, float gxn, float ghr, float ghz, float ghn,
                                          float h) {
    const int H = a.H;
    float r = sigm(gxr + a.bx[0][j] + (ghr + a.b_hh[j]));
    float z = sigm(gxz + a.bx[1][j] + (ghz + a.b_hh[H + j]));
    float hn = ghn + a.b_hh[2 * H + j];
    float n = tanhf(gxn + a.bx[2][j] + r * hn);
    float hnew = (1.0f - z) * n + z * h;
    if (kTrain) {
        float *g = a.gates + row * 4 * H;
        g[j] = r;
        g[H + j] = z;
        g[2 * H + j] = n;
        g[3 * H + j] = hn;
        a.hprev[row * H + j] = h;
    }
    return hnew;
}

// A-GRU, first half: the pre-activations az, ar of z and r (bias added).
__device__ __forceinline__ void agru_zr(const FwdArgs &a, int j, float gxz, float gxr, float ghz,
                                        float ghr, float *az, float *ar) {
    *az = gxz + a.bx[0][j] + ghz;
    *ar = gxr + a.bx[1][j] + ghr;
}

// A-GRU, second half: d = tanh(V_h x + b_h + A (r*h)), h' = h + eps * z * d, z = sigm(az);
// the reserve gets the pre-activations az, ar, ad.
template <bool kTrain>
__device__ __forceinline__ float agru_out(const FwdArgs &a, int64_t row, int j, float gxd,
                                          float ghd, float az, float ar, float h, float eps) {
    const int H = a.H;
    const float ad = gxd + a.bx[2][j] + ghd;
    float hnew = h + eps * (sigm(az) * tanhf(ad));
    if (kTrain) {
        float *g = a.gates + row * 3 * H;
        g[j] = az;
        g[H + j] = ar;
        g[2 * H + j] = ad;
        a.hprev[row * H + j] = h;
    }
    return hnew;
}

// The persistent path (cuda/rnn_fwd_persistent.cu): batch rows per block for this H and B on the
// context's device (0: the per-step path), and one layer-direction's recurrence, GRU or A-GRU.
int persistent_rows(bool agru, int H, int64_t B, int sms, size_t smem_optin);
template <bool kAgru, bool kTrain>
kf_status run_persistent(kf_context *ctx, const char *fn, int BB, const FwdArgs &a,
                         const float *wt, const float *h0, float *hn);
template <bool kTrain>
kf_status run_agru_persistent(kf_context *ctx, const char *fn, int BB, const FwdArgs &a,
                              const float *wt, const float *h0, float *hn);

} // namespace kf_rnn

#endif // KF_CUDA_RNN_FWD_CUH

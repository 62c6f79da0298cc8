// GRU and A-GRU backward on CUDA, what the per-step path (cuda/rnn_bwd.cu) and the persistent
// path (cuda/rnn_bwd_persistent.cu) share: the step record BwdArgs, and the persistent path's
// entry points. Private to those two files.
#ifndef KF_CUDA_RNN_BWD_CUH
#define KF_CUDA_RNN_BWD_CUH

#include "counter_rng.h"
#include "rnn_cuda.cuh"

namespace kf_rnn {


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

// The persistent path (cuda/rnn_bwd_persistent.cu): batch rows per block for this H and B on the
// context's device (0: the per-step path), and one layer-direction's reverse recurrence.
int bwd_persistent_rows(int H, int64_t B, int sms, size_t smem_optin);
template <bool kAgru>
kf_status run_bwd_persistent(kf_context *ctx, const char *fn, int BB, const BwdArgs &a,
                             const float *m, const float *dhn, float *dh0);

} // namespace kf_rnn

#endif // KF_CUDA_RNN_BWD_CUH

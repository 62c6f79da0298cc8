// The CUDA backend's op tables, one per op file (cuda/rnn_fwd.cu, cuda/sklinear.cu,
// cuda/kan_linear.cu), gathered into its kf__backend by cuda/device.cu: the recurrent table
// wrapped for bfloat16 and float16 plans by core/lowp_ops.c (with cuda/lowp.cu's conversions),
// the SKLinear and KAN tables as they are (their low plans run natively on cuda/plain.cu); every
// op's entries send float64 plans to cuda/plain.cu.
// Private to cuda/.
#ifndef KF_CUDA_BACKEND_CUH
#define KF_CUDA_BACKEND_CUH

#include "backend.h"
#include "common.cuh"
#include "kan_backend.h"
#include "rnn_backend.h"
#include "sklinear_backend.h"

extern "C" {
extern const kf__rnn_ops kf__cuda_rnn_ops;
extern const kf__skl_ops kf__cuda_skl_ops;
extern const kf__kan_ops kf__cuda_kan_ops;
// The tables above and the CUDA conversion routine (cuda/lowp.cu), for core/lowp_ops.h's
// tables, which cuda/device.cu installs for the recurrent layers.
extern const struct kf__lowp_base kf__cuda_lowp;
}

// The plain path's entries (cuda/plain.cu, algorithms in cuda/plain.cuh and plain_rnn.cuh).
// GRU and A-GRU: float64 plans.
void kf__cuda_rnn64_sizes(const struct kf_rnn_plan *p, int64_t T, int64_t B, bool training,
                          size_t *ws_bytes, size_t *reserve_bytes);
kf_status kf__cuda_rnn64_forward(kf_context *ctx, const kf__rnn_fwd *c);
kf_status kf__cuda_rnn64_backward(kf_context *ctx, const kf__rnn_bwd *c);
// SKLinear and KAN: float64, bfloat16 and float16 plans (the low ones on the tensor cores).
size_t kf__cuda_skl_plain_workspace(const struct kf_sklinear_plan *p, int64_t N);
kf_status kf__cuda_skl_plain_forward(kf_context *ctx, const kf__skl_fwd *c);
kf_status kf__cuda_skl_plain_backward(kf_context *ctx, const kf__skl_bwd *c);
size_t kf__cuda_kan_plain_workspace(const struct kf_kan_linear_plan *p, int64_t N,
                                    const kf__kan_patches *patches);
kf_status kf__cuda_kan_plain_forward(kf_context *ctx, const kf__kan_fwd *c);
kf_status kf__cuda_kan_plain_backward(kf_context *ctx, const kf__kan_bwd *c);

#endif // KF_CUDA_BACKEND_CUH

// The CUDA backend's op tables, one per op file (cuda/rnn_fwd.cu, cuda/sklinear.cu,
// cuda/kan_linear.cu), gathered into its kf__backend by cuda/device.cu. Every op's entries send
// float64 plans to cuda/plain.cu, and so do the SKLinear and KAN entries their bfloat16 and
// float16 plans (on the tensor cores); the recurrent entries send a low plan there too unless
// its H is one the persistent float32 kernels take, in which case they run those kernels on
// float32 copies through core/lowp_ops.c's conversion layer (with cuda/lowp.cu's conversions).
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
// The float32 tables above and the CUDA conversion routine (cuda/lowp.cu), for core/lowp_ops.h's
// conversion layer, which the recurrent entries call for the low plans they do not take.
extern const struct kf__lowp_base kf__cuda_lowp;
}

// The plain path's entries (cuda/plain.cu, algorithms in cuda/plain.cuh and plain_rnn.cuh).
// GRU and A-GRU: the plans kf__cuda_rnn_plain takes (float64, and the low plans whose H the
// persistent float32 kernels do not take: cuda/rnn_fwd.cu).
bool kf__cuda_rnn_plain(const struct kf_rnn_plan *p);
void kf__cuda_rnn_plain_sizes(const struct kf_rnn_plan *p, int64_t T, int64_t B, bool training,
                              size_t *ws_bytes, size_t *reserve_bytes);
kf_status kf__cuda_rnn_plain_forward(kf_context *ctx, const kf__rnn_fwd *c);
kf_status kf__cuda_rnn_plain_backward(kf_context *ctx, const kf__rnn_bwd *c);
// SKLinear and KAN: float64, bfloat16 and float16 plans (the low ones on the tensor cores);
// SKLinear's as the table for the plan's dtype, which cuda/sklinear.cu's select() gives such a
// plan at creation.
const kf__skl_ops *kf__cuda_skl_plain_ops(kf_dtype dtype);
size_t kf__cuda_kan_plain_workspace(const struct kf_kan_linear_plan *p, int64_t N,
                                    const kf__kan_patches *patches);
kf_status kf__cuda_kan_plain_forward(kf_context *ctx, const kf__kan_fwd *c);
kf_status kf__cuda_kan_plain_backward(kf_context *ctx, const kf__kan_bwd *c);

#endif // KF_CUDA_BACKEND_CUH

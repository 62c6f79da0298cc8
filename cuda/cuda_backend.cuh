// The CUDA backend's op tables, one per op file (cuda/rnn_fwd.cu, cuda/sklinear.cu,
// cuda/kan_linear.cu) for float32 plans, wrapped for bfloat16 and float16 plans by
// core/lowp_ops.c (with cuda/lowp.cu's conversions) and gathered into its kf__backend by
// cuda/device.cu. Private to cuda/.
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
// tables, which cuda/device.cu installs (bfloat16 and float16 plans).
extern const struct kf__lowp_base kf__cuda_lowp;
}

#endif // KF_CUDA_BACKEND_CUH

// The CUDA backend's op tables, one per op file (cuda/rnn_fwd.cu, cuda/sklinear.cu,
// cuda/kan_linear.cu), gathered into its kf__backend by cuda/device.cu. Every op sends float64
// plans to cuda/plain.cu, and so do the SKLinear and KAN layers their bfloat16 and float16 plans
// (on the tensor cores); the recurrent layers send a low plan there too unless its H is one the
// persistent float32 kernels take, in which case they run those kernels on float32 copies
// through core/lowp_ops.c's conversion layer (with cuda/lowp.cu's conversions). The recurrent
// and KAN layers decide this in their select(), once per plan; SKLinear in its entries.
// Private to cuda/.
#ifndef KF_CUDA_BACKEND_CUH
#define KF_CUDA_BACKEND_CUH

#include "backend.h"
#include "common.cuh"
#include "kan_backend.h"
#include "rnn_backend.h"
#include "sklinear_backend.h"

extern "C" {
extern const kf__rnn_ops kf__cuda_rnn_ops; // selects, per plan, one of the tables below
extern const kf__skl_ops kf__cuda_skl_ops;
extern const kf__kan_ops kf__cuda_kan_ops; // selects, per plan, one of the tables below
// The persistent float32 recurrent kernels' table (cuda/rnn_fwd.cu, rnn_bwd.cu), and with the
// CUDA conversion routine (cuda/lowp.cu) the base of core/lowp_ops.h's conversion layer, whose
// table the recurrent select gives the low plans the persistent kernels take.
extern const kf__rnn_ops kf__cuda_rnn_ops_f32;
extern const struct kf__lowp_base kf__cuda_lowp;
}

// The plain path's tables (cuda/plain.cu, algorithms in cuda/plain.cuh and plain_rnn.cuh), one
// per dtype (float64, bfloat16, float16), taken by the op's select at plan creation.
// GRU and A-GRU: the plans kf__cuda_rnn_plain takes (float64, and the low plans whose H the
// persistent float32 kernels do not take: cuda/rnn_fwd.cu).
bool kf__cuda_rnn_plain(const struct kf_rnn_plan *p);
const kf__rnn_ops *kf__cuda_rnn_plain_ops(int32_t dtype);
// SKLinear and KAN: float64, bfloat16 and float16 plans (the low ones on the tensor cores), as
// the table for the plan's dtype, which the layer's select() gives such a plan at creation; KAN's
// KF_DTYPE_F32 table serves the float32 plans' calls at a derivative order or with an input
// weight (cuda/kan_linear.cu sends them there).
const kf__skl_ops *kf__cuda_skl_plain_ops(kf_dtype dtype);
const kf__kan_ops *kf__cuda_kan_plain_ops(int32_t dtype);

#endif // KF_CUDA_BACKEND_CUH

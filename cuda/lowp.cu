// The CUDA backend's conversion routine for bfloat16 and float16 plans (core/lowp_ops.h: the
// conversion layer over the float32 op tables that every backend shares). One launch per batch
// of up to KF__LP_BATCH conversions, the batch passed by value as the kernel's parameter: each
// conversion gets a slice of the grid in proportion to its elements (at least one block, at most
// one block per kPerThread * 256 elements), which strides over it. Enqueued on ctx->stream, no
// synchronisation, no allocation (graph-capturable). Rounding as core/lowp.h's: to nearest, ties
// to even (cuda_bf16.h's and cuda_fp16.h's _rn conversions), NaN stays NaN, float16 overflow is
// an infinity; accumulate is low = round(f32(low) + f).
#include "cuda_backend.cuh"
#include "lowp_ops.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace {

constexpr int kThreads = 256;
constexpr int64_t kPerThread = 4;    // elements per thread where the grid is not capped
constexpr int64_t kMaxBlocks = 4096; // of one launch, shared out among the batch's conversions

__device__ __forceinline__ float to_f32(uint16_t h, bool bf16) {
    return bf16 ? __bfloat162float(__ushort_as_bfloat16(h)) : __half2float(__ushort_as_half(h));
}

__device__ __forceinline__ uint16_t from_f32(float f, bool bf16) {
    return bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(f))
                : __half_as_ushort(__float2half_rn(f));
}

// The batch and the first block of each conversion (first[n] = the grid's block count).
struct Launch {
    kf__lp_batch b;
    int32_t first[KF__LP_BATCH + 1];
};

__global__ void __launch_bounds__(kThreads) lp_convert(const Launch L) {
    int j = 0;
    while (j + 1 < L.b.n && (int32_t)blockIdx.x >= L.first[j + 1]) ++j;
    const kf__lp_cvt &c = L.b.c[j];
    const int64_t step = (int64_t)(L.first[j + 1] - L.first[j]) * kThreads;
    for (int64_t i = (int64_t)(blockIdx.x - L.first[j]) * kThreads + threadIdx.x; i < c.n;
         i += step) {
        if (c.dir == KF__LP_LOAD)
            c.f[i] = to_f32(c.low[i], c.bf16);
        else if (c.dir == KF__LP_STORE)
            c.low[i] = from_f32(c.f[i], c.bf16);
        else
            c.low[i] = from_f32(to_f32(c.low[i], c.bf16) + c.f[i], c.bf16);
    }
}

// kf__lowp_base.convert: the batch in one launch on the context's stream.
kf_status cuda_convert(kf_context *ctx, const char *fn, const kf__lp_batch *b) {
    if (b->n == 0 || b->elems == 0) return KF_OK;
    Launch L;
    L.b = *b;
    const int64_t total = kf__ceil_div(b->elems, kThreads * kPerThread);
    const int64_t budget = total < kMaxBlocks ? total : kMaxBlocks;
    int64_t at = 0;
    for (int j = 0; j < b->n; ++j) {
        L.first[j] = (int32_t)at;
        const int64_t want = kf__ceil_div(b->c[j].n, kThreads * kPerThread);
        const int64_t share = kf__ceil_div(budget * b->c[j].n, b->elems);
        at += b->c[j].n == 0 ? 0 : want < share ? want : share > 0 ? share : 1;
    }
    L.first[b->n] = (int32_t)at;
    if (at == 0) return KF_OK;
    KF__CUDA_ON_DEVICE(fn, ctx);
    lp_convert<<<(unsigned)at, kThreads, 0, kf__stream(ctx)>>>(L);
    KF__CUDA_LAUNCH_CHECK(fn, "lp_convert");
    return KF_OK;
}

} // namespace

extern "C" const kf__lowp_base kf__cuda_lowp = {&kf__cuda_rnn_ops_f32, cuda_convert};

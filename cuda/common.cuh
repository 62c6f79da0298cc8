// Shared helpers of the CUDA backend: status checks that turn CUDA and cuBLAS errors into
// kf_status values (KF_ERR_DEVICE with the library's own error text), a launch check, and a
// row-major GEMM on the context's cuBLAS handle and stream.
//
// Conventions of cuda/*.cu: every kernel launch goes on ctx->stream and is followed by
// KF__CUDA_LAUNCH_CHECK; no call allocates or synchronises; kernels have internal linkage
// (anonymous namespace) so that two files may reuse a name.
#ifndef KF_CUDA_COMMON_CUH
#define KF_CUDA_COMMON_CUH

#include "core.h"
#include "tf32.cuh"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <atomic>
#include <stdint.h>

// The sub-buffer at byte offset `off` of a workspace or reserve.
template <typename Tp> static inline Tp *kf__at(void *base, size_t off) {
    return (Tp *)((char *)base + off);
}
template <typename Tp> static inline const Tp *kf__at(const void *base, size_t off) {
    return (const Tp *)((const char *)base + off);
}

static inline cudaStream_t kf__stream(const kf_context *ctx) { return (cudaStream_t)ctx->stream; }
static inline cublasHandle_t kf__blas(const kf_context *ctx) { return (cublasHandle_t)ctx->blas; }

static inline const char *kf__cublas_status_name(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "unknown cuBLAS status";
    }
}

// KF_ERR_DEVICE naming the failed call and CUDA's own text, or KF_OK.
static inline kf_status kf__cuda_check(cudaError_t e, const char *fn, const char *what) {
    if (e == cudaSuccess) return KF_OK;
    return kf__error(KF_ERR_DEVICE, fn, "%s failed: %s (%s)", what, cudaGetErrorName(e),
                     cudaGetErrorString(e));
}
static inline kf_status kf__cublas_check(cublasStatus_t s, const char *fn, const char *what) {
    if (s == CUBLAS_STATUS_SUCCESS) return KF_OK;
    return kf__error(KF_ERR_DEVICE, fn, "%s failed: %s", what, kf__cublas_status_name(s));
}

// The context's device made current for one call, and the caller's current device restored when
// the call returns, on every path (a scope object). The runtime's current device is the calling
// thread's state: a library call that switched it and left it so would move the caller's later
// allocations and launches to another GPU.
class kf__device_scope {
  public:
    kf__device_scope() = default;
    kf__device_scope(const kf__device_scope &) = delete;
    kf__device_scope &operator=(const kf__device_scope &) = delete;
    ~kf__device_scope() {
        if (prev_ >= 0 && prev_ != dev_) (void)cudaSetDevice(prev_);
    }
    // Makes `dev` current (no runtime call when it already is).
    cudaError_t enter(int dev) {
        int prev = -1;
        cudaError_t e = cudaGetDevice(&prev);
        if (e == cudaSuccess && prev != dev) e = cudaSetDevice(dev);
        if (e != cudaSuccess) return e;
        prev_ = prev;
        dev_ = dev;
        return cudaSuccess;
    }

  private:
    int prev_ = -1, dev_ = -1;
};

// Declares the scope of a call on the context's device; a failure is KF_ERR_DEVICE under `fn`.
#define KF__CUDA_ON_DEVICE(fn, ctx)                                                               \
    kf__device_scope kf__device_scope_;                                                           \
    KF_TRY(kf__cuda_check(kf__device_scope_.enter((int)(ctx)->device_index), (fn),               \
                          "making the context's CUDA device current"))

// After a <<<>>> launch: a bad configuration or an earlier asynchronous fault shows here.
#define KF__CUDA_LAUNCH_CHECK(fn, kernel_name) \
    KF_TRY(kf__cuda_check(cudaGetLastError(), (fn), "launch of " kernel_name))
#define KF__CUDA_TRY(fn, expr) KF_TRY(kf__cuda_check((expr), (fn), #expr))

// Row-major GEMM with float32 operands and result under compute type `ct`:
//   C[M, N] = alpha * op(A)[M, K] * op(B)[K, N] + beta * C
// op(A) = A ([M, K], leading dimension lda) or, with ta, A^T where A is stored [K, M]; same for B.
// cuBLAS is column-major, so this computes C^T = op(B)^T op(A)^T with the operands swapped.
static inline kf_status kf__gemm_ct(kf_context *ctx, const char *fn, bool ta, bool tb, int64_t M,
                                    int64_t N, int64_t K, float alpha, const float *A,
                                    int64_t lda, const float *B, int64_t ldb, float beta,
                                    float *C, int64_t ldc, cublasComputeType_t ct) {
    if (M == 0 || N == 0) return KF_OK;
    if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX || lda > INT32_MAX || ldb > INT32_MAX ||
        ldc > INT32_MAX)
        return kf__error(KF_ERR_UNSUPPORTED, fn,
                         "GEMM extent beyond cuBLAS's 32-bit limit (M=%lld N=%lld K=%lld)",
                         (long long)M, (long long)N, (long long)K);
    cublasStatus_t s = cublasGemmEx(kf__blas(ctx), tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                    ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)N, (int)M, (int)K, &alpha,
                                    B, CUDA_R_32F, (int)ldb, A, CUDA_R_32F, (int)lda, &beta, C,
                                    CUDA_R_32F, (int)ldc, ct, CUBLAS_GEMM_DEFAULT);
    return kf__cublas_check(s, fn, "cublasGemmEx");
}

// The same in fp32 (no TF32: CUBLAS_COMPUTE_32F under the handle's default math mode).
static inline kf_status kf__gemm(kf_context *ctx, const char *fn, bool ta, bool tb, int64_t M,
                                 int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                                 const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    return kf__gemm_ct(ctx, fn, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
                       CUBLAS_COMPUTE_32F);
}

// C = beta C + A B (op(A), op(B) as kf__gemm) in 3xTF32 on the tensor cores: with A = Ah + Al and
// B = Bh + Bl split by kf__tf32_hi, C = beta C + Al Bh + Ah Bl + Ah Bh (the small products first;
// Al Bl, below 2^-20 |A||B|, dropped), each product on CUBLAS_COMPUTE_32F_FAST_TF32 with float32
// accumulation. Per term the error is about 2^-20 of |a b|, near fp32's own rounding (2^-24) and
// far under the 1e-5 relative bar of the float32 tests; on a Hopper GPU, whose dense TF32 rate is
// about 7x its fp32 rate, the three products take less time than one fp32 product.
static inline kf_status kf__gemm_3xtf32(kf_context *ctx, const char *fn, bool ta, bool tb,
                                        int64_t M, int64_t N, int64_t K, const float *Ah,
                                        const float *Al, int64_t lda, const float *Bh,
                                        const float *Bl, int64_t ldb, float beta, float *C,
                                        int64_t ldc) {
    const cublasComputeType_t ct = CUBLAS_COMPUTE_32F_FAST_TF32;
    KF_TRY(kf__gemm_ct(ctx, fn, ta, tb, M, N, K, 1.0f, Al, lda, Bh, ldb, beta, C, ldc, ct));
    KF_TRY(kf__gemm_ct(ctx, fn, ta, tb, M, N, K, 1.0f, Ah, lda, Bl, ldb, 1.0f, C, ldc, ct));
    return kf__gemm_ct(ctx, fn, ta, tb, M, N, K, 1.0f, Ah, lda, Bh, ldb, 1.0f, C, ldc, ct);
}

// The dtypes a CUDA plan can have, asked by every op's supports() or select(): float32, which the kernels
// compute in; float64, which each op sends to cuda/plain.cu; bfloat16 and float16 storage, which
// cuda/plain.cu runs for SKLinear, the KAN layers and the recurrent layers whose H the persistent
// kernels do not take, and core/lowp_ops.c converts around the persistent float32 kernels for
// the others (kf__cuda_rnn_plain, cuda/rnn_fwd.cu). Anything else is refused at plan creation,
// naming the field.
static inline kf_status kf__cuda_dtype_supported(int32_t dtype, const char *fn) {
    if (dtype == KF_DTYPE_F32 || dtype == KF_DTYPE_F64 || dtype == KF_DTYPE_BF16 ||
        dtype == KF_DTYPE_F16)
        return KF_OK;
    return kf__error(KF_ERR_UNSUPPORTED, fn,
                     "desc->dtype = %d: the CUDA backend implements KF_DTYPE_F32 (1), "
                     "KF_DTYPE_F64 (2), KF_DTYPE_F16 (3) and KF_DTYPE_BF16 (4)",
                     (int)dtype);
}

// Grid size for a 1-D elementwise launch of n items at `threads` per block.
static inline unsigned kf__blocks(int64_t n, int threads) {
    return (unsigned)((n + threads - 1) / threads);
}

// ---- host-side sizing shared by the kernels' launch plans -----------------------------------
static inline int64_t kf__ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A reduction of `units` split into P ranges of `per` units (the last possibly shorter).
struct kf__split {
    int64_t P, per;
};

// Blocks in one wave of the context's device at the one block per SM that the split kernels'
// register use allows: the SM count queried once at context creation (core.h).
static inline int64_t kf__wave_blocks(const kf_context *ctx) {
    return ctx->sm_count >= 1 ? ctx->sm_count : 1;
}

// The split for a grid of `jobs` blocks per range: enough ranges to reach `target` blocks, at
// least `minper` units per range and at most `maxp` ranges, boundaries at multiples of `align`.
// A function of the shape and `target` only: with target = kf__wave_blocks(ctx), workspace sizes
// and result bits are the same on every GPU with that many SMs, not across models.
static inline kf__split kf__split_of(int64_t units, int64_t jobs, int64_t minper, int64_t align,
                                     int64_t target, int64_t maxp) {
    if (units <= 0) return kf__split{1, 1};
    if (jobs < 1) jobs = 1;
    int64_t P = jobs >= target ? 1 : kf__ceil_div(target, jobs);
    const int64_t most = kf__ceil_div(units, minper);
    if (P > most) P = most;
    if (P > maxp) P = maxp;
    if (P <= 1) return kf__split{1, units};
    const int64_t per = kf__ceil_div(kf__ceil_div(units, P), align) * align;
    return kf__split{kf__ceil_div(units, per), per};
}

// Saturating workspace byte counts: a size that does not fit is SIZE_MAX (the front end cannot
// provide it and reports the shape).
static inline size_t kf__sat_floats(int64_t a, int64_t b, int64_t c) {
    size_t v;
    if (!kf__mul_size((size_t)a, (size_t)b, &v) || !kf__mul_size(v, (size_t)c, &v) ||
        !kf__mul_size(v, sizeof(float), &v) || v > SIZE_MAX - KF__ALIGN)
        return SIZE_MAX;
    return kf__align_up(v);
}
static inline size_t kf__sat_add(size_t a, size_t b) {
    size_t v;
    return kf__add_size(a, b, &v) ? v : SIZE_MAX;
}

// The x extent of a one-dimensional grid of `jobs` blocks, or KF_ERR_UNSUPPORTED (message under
// `fn`) beyond the CUDA limit of 2^31 - 1.
static inline kf_status kf__grid_of(const char *fn, int64_t jobs, unsigned *g) {
    if (jobs > INT32_MAX)
        return kf__error(KF_ERR_UNSUPPORTED, fn,
                         "%lld thread blocks needed, beyond the CUDA grid limit of 2^31 - 1",
                         (long long)jobs);
    *g = (unsigned)jobs;
    return KF_OK;
}

// A kernel allowed the device's opt-in shared memory (ctx->smem_optin_bytes), asked of the
// driver once per kernel and device rather than before every launch (cudaFuncSetAttribute is a
// driver call: host time the persistent recurrent kernels' per-call latency paid each call). The
// launching code holds one record per kernel (a function-local static of its template
// instance). Every call sets the same value, the device's limit, so two threads racing to set it
// cannot leave it below what either launches with. Devices past kDevices are asked every time.
struct kf__smem_optin {
    static constexpr int kDevices = 64;
    std::atomic<bool> done[kDevices]; // zero-initialised: a record has static storage

    template <class Kernel>
    kf_status allow(const kf_context *ctx, const char *fn, Kernel kernel) {
        const int dev = (int)ctx->device_index;
        const bool cached = dev >= 0 && dev < kDevices;
        if (cached && done[dev].load(std::memory_order_acquire)) return KF_OK;
        KF__CUDA_TRY(fn, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              (int)ctx->smem_optin_bytes));
        if (cached) done[dev].store(true, std::memory_order_release);
        return KF_OK;
    }
};

#endif // KF_CUDA_COMMON_CUH

// The CUDA backend's plain path (cuda/plain.cuh, cuda/plain_rnn.cuh): float64 plans of every
// op, bfloat16 / float16 SKLinear, KANLinear and KANConv2d plans on the tensor cores, and the
// bfloat16 / float16 GRU and A-GRU plans that cuda/rnn_fwd.cu sends here (input-side products
// on the tensor cores, the recurrence in float32). The
// executor below runs the algorithms: cublasGemmEx / cublasGemmStridedBatchedEx on the
// context's cuBLAS handle (float64: CUBLAS_COMPUTE_64F; the low types: CUBLAS_COMPUTE_32F,
// float32 accumulation) and one grid-stride kernel per elementwise pass, all on ctx->stream, no
// allocation, no synchronisation (graph-capturable). The op files (cuda/rnn_fwd.cu,
// cuda/rnn_bwd.cu, cuda/sklinear.cu, cuda/kan_linear.cu) send those plans here.
#include "cuda_backend.cuh"
#include "plain_kan.cuh"
#include "plain_rnn_bwd.cuh"

#include <type_traits>

namespace {

using kf_plain::bf16;
using kf_plain::Elem;
using kf_plain::f16;

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535; // grid-stride beyond this

template <class F> __global__ void __launch_bounds__(kThreads) each_kernel(const F f, int64_t n) {
    const int64_t step = (int64_t)gridDim.x * kThreads;
    for (int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x; i < n; i += step) f(i);
}

// cuBLAS's extents are 32-bit: beyond that the call is refused, naming the shape.
bool fits(int64_t v) { return v >= 0 && v <= INT32_MAX; }

// The cuBLAS element type of T, and the compute type of products of T.
template <class T> constexpr cudaDataType_t cuda_type();
template <> constexpr cudaDataType_t cuda_type<double>() { return CUDA_R_64F; }
template <> constexpr cudaDataType_t cuda_type<float>() { return CUDA_R_32F; }
template <> constexpr cudaDataType_t cuda_type<bf16>() { return CUDA_R_16BF; }
template <> constexpr cudaDataType_t cuda_type<f16>() { return CUDA_R_16F; }
template <class T> constexpr cublasComputeType_t compute_type() {
    return sizeof(typename Elem<T>::acc) == 8 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;
}

// C = beta C over batch b's [M, N] at C + b sC (row stride ldc), element e = (b M + m) N + n: a
// product with an empty reduction (K = 0: a recurrent layer with T = 0), which the executor does
// itself rather than rely on how cuBLAS treats k = 0.
template <class T> struct ScaleC {
    using A = typename Elem<T>::acc;
    T *C;
    int64_t M, N, ldc, sC;
    A beta;
    __device__ void operator()(int64_t e) const {
        const int64_t b = e / (M * N), m = e / N % M, n = e % N;
        T &c = C[b * sC + m * ldc + n];
        c = Elem<T>::put(beta == A(0) ? A(0) : beta * Elem<T>::get(c));
    }
};

struct CudaExec {
    kf_context *ctx;
    const char *fn;
    int64_t chunk_bytes = kf_plain::kPlainChunkBytes; // as the workspace queries assume

    kf_status too_large(int64_t M, int64_t N, int64_t K) const {
        return kf__error(KF_ERR_UNSUPPORTED, fn,
                         "GEMM extent beyond cuBLAS's 32-bit limit (M=%lld N=%lld K=%lld)",
                         (long long)M, (long long)N, (long long)K);
    }

    // Row-major C = alpha op(A) op(B) + beta C as the column-major C^T = op(B)^T op(A)^T.
    template <class TI, class TO>
    kf_status gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                   typename Elem<TI>::acc alpha, const TI *A, int64_t lda, const TI *B,
                   int64_t ldb, typename Elem<TI>::acc beta, TO *C, int64_t ldc) const {
        if (M == 0 || N == 0) return KF_OK;
        if (K == 0) return each(M * N, ScaleC<TO>{C, M, N, ldc, 0, beta});
        if (!fits(M) || !fits(N) || !fits(K) || !fits(lda) || !fits(ldb) || !fits(ldc))
            return too_large(M, N, K);
        return kf__cublas_check(
            cublasGemmEx(kf__blas(ctx), tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                         ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)N, (int)M, (int)K, &alpha, B,
                         cuda_type<TI>(), (int)ldb, A, cuda_type<TI>(), (int)lda, &beta, C,
                         cuda_type<TO>(), (int)ldc, compute_type<TI>(), CUBLAS_GEMM_DEFAULT),
            fn, "cublasGemmEx");
    }

    template <class TI, class TO>
    kf_status gemm_batched(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                           typename Elem<TI>::acc alpha, const TI *A, int64_t lda, int64_t sA,
                           const TI *B, int64_t ldb, int64_t sB, typename Elem<TI>::acc beta,
                           TO *C, int64_t ldc, int64_t sC, int64_t n) const {
        if (M == 0 || N == 0 || n == 0) return KF_OK;
        if (K == 0) return each(n * M * N, ScaleC<TO>{C, M, N, ldc, sC, beta});
        if (!fits(M) || !fits(N) || !fits(K) || !fits(lda) || !fits(ldb) || !fits(ldc) ||
            !fits(n))
            return too_large(M, N, K);
        return kf__cublas_check(
            cublasGemmStridedBatchedEx(kf__blas(ctx), tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                       ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)N, (int)M, (int)K,
                                       &alpha, B, cuda_type<TI>(), (int)ldb, (long long)sB, A,
                                       cuda_type<TI>(), (int)lda, (long long)sA, &beta, C,
                                       cuda_type<TO>(), (int)ldc, (long long)sC, (int)n,
                                       compute_type<TI>(), CUBLAS_GEMM_DEFAULT),
            fn, "cublasGemmStridedBatchedEx");
    }

    template <class F> kf_status each(int64_t n, const F &f) const {
        if (n <= 0) return KF_OK;
        const int64_t blocks = kf__ceil_div(n, kThreads);
        each_kernel<F><<<(unsigned)(blocks < kMaxBlocks ? blocks : kMaxBlocks), kThreads, 0,
                         kf__stream(ctx)>>>(f, n);
        KF__CUDA_LAUNCH_CHECK(fn, "each_kernel");
        return KF_OK;
    }
};

} // namespace

namespace {

template <class T> size_t skl_plain_workspace(const struct kf_sklinear_plan *p, int64_t N) {
    return kf_plain::skl_workspace<T>(p, N);
}

template <class T> kf_status skl_plain_forward(kf_context *ctx, const kf__skl_fwd *c) {
    CudaExec ex = {ctx, "kf_sklinear_forward"};
    KF__CUDA_ON_DEVICE(ex.fn, ctx);
    return kf_plain::skl_forward<T>(ex, c);
}

template <class T> kf_status skl_plain_backward(kf_context *ctx, const kf__skl_bwd *c) {
    CudaExec ex = {ctx, "kf_sklinear_backward"};
    KF__CUDA_ON_DEVICE(ex.fn, ctx);
    return kf_plain::skl_backward<T>(ex, c);
}

template <class T> constexpr kf__skl_ops skl_plain_ops() {
    return kf__skl_ops{nullptr, skl_plain_workspace<T>, skl_plain_forward<T>,
                       skl_plain_backward<T>};
}

const kf__skl_ops skl_plain_f64 = skl_plain_ops<double>();
const kf__skl_ops skl_plain_bf16 = skl_plain_ops<bf16>();
const kf__skl_ops skl_plain_f16 = skl_plain_ops<f16>();

} // namespace

const kf__skl_ops *kf__cuda_skl_plain_ops(kf_dtype dtype) {
    return dtype == KF_DTYPE_BF16 ? &skl_plain_bf16
           : dtype == KF_DTYPE_F16 ? &skl_plain_f16
                                   : &skl_plain_f64;
}

// The KAN and recurrent layers' entries, one instance per dtype, each listed in its dtype's op
// table below (the op's select takes the table at plan creation).
namespace {

// A chunk's bytes of A: the plain path's bound, but 1 MiB for the float32 instance, which serves
// only a float32 plan's order-m calls: its workspace joins that plan's query for every call
// (cuda/kan_linear.cu), so it must add little to what the tiled kernels need.
template <class T> constexpr int64_t kan_chunk_bytes() {
    return std::is_same<T, float>::value ? int64_t(1) << 20 : kf_plain::kPlainChunkBytes;
}

template <class T>
size_t kan_plain_workspace(const struct kf_kan_linear_plan *p, int64_t N,
                           const kf__kan_patches *patches) {
    return kf_plain::kan_layout<T>(p, N, patches, kan_chunk_bytes<T>()).bytes;
}

template <class T> kf_status kan_plain_forward(kf_context *ctx, const kf__kan_fwd *c) {
    CudaExec ex = {ctx, c->patches ? "kf_kan_conv2d_forward" : "kf_kan_linear_forward",
                   kan_chunk_bytes<T>()};
    KF__CUDA_ON_DEVICE(ex.fn, ctx);
    return kf_plain::kan_forward<T>(ex, c);
}

template <class T> kf_status kan_plain_backward(kf_context *ctx, const kf__kan_bwd *c) {
    CudaExec ex = {ctx, c->patches ? "kf_kan_conv2d_backward" : "kf_kan_linear_backward",
                   kan_chunk_bytes<T>()};
    KF__CUDA_ON_DEVICE(ex.fn, ctx);
    return kf_plain::kan_backward<T>(ex, c);
}

template <class T>
void rnn_plain_sizes(const struct kf_rnn_plan *p, int64_t T_, int64_t B, bool training,
                     size_t *ws_bytes, size_t *reserve_bytes) {
    size_t ws = 0, res = 0;
    kf_plain::rnn_sizes<T>(p, T_, B, training, &ws, &res);
    if (ws_bytes) *ws_bytes = ws;
    if (reserve_bytes) *reserve_bytes = res;
}

template <class T> kf_status rnn_plain_forward(kf_context *ctx, const kf__rnn_fwd *c) {
    CudaExec ex = {ctx, "kf_rnn_forward"};
    KF__CUDA_ON_DEVICE(ex.fn, ctx);
    return kf_plain::rnn_forward<T>(ex, c);
}

template <class T> kf_status rnn_plain_backward(kf_context *ctx, const kf__rnn_bwd *c) {
    CudaExec ex = {ctx, "kf_rnn_backward"};
    KF__CUDA_ON_DEVICE(ex.fn, ctx);
    return kf_plain::rnn_backward<T>(ex, c);
}

template <class T> constexpr kf__kan_ops kan_plain_ops() {
    return {nullptr, kan_plain_workspace<T>, kan_plain_forward<T>, kan_plain_backward<T>};
}
template <class T> constexpr kf__rnn_ops rnn_plain_ops() {
    return {nullptr, rnn_plain_sizes<T>, rnn_plain_forward<T>, rnn_plain_backward<T>};
}
const kf__kan_ops kan_plain_f64 = kan_plain_ops<double>(), kan_plain_bf16 = kan_plain_ops<bf16>(),
                  kan_plain_f16 = kan_plain_ops<f16>(),
                  kan_plain_f32 = kan_plain_ops<float>(); // float32's order-m calls
const kf__rnn_ops rnn_plain_f64 = rnn_plain_ops<double>(), rnn_plain_bf16 = rnn_plain_ops<bf16>(),
                  rnn_plain_f16 = rnn_plain_ops<f16>();

} // namespace

const kf__kan_ops *kf__cuda_kan_plain_ops(int32_t dtype) {
    return dtype == KF_DTYPE_BF16 ? &kan_plain_bf16
           : dtype == KF_DTYPE_F16 ? &kan_plain_f16
           : dtype == KF_DTYPE_F32 ? &kan_plain_f32
                                   : &kan_plain_f64;
}

const kf__rnn_ops *kf__cuda_rnn_plain_ops(int32_t dtype) {
    return dtype == KF_DTYPE_BF16 ? &rnn_plain_bf16
           : dtype == KF_DTYPE_F16 ? &rnn_plain_f16
                                   : &rnn_plain_f64;
}

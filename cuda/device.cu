// CUDA device services behind kf_context (core/backend.h): device selection and its properties,
// the cuBLAS handle, the stream, device memory for the arena, and synchronisation. The context's stream starts as the
// legacy default stream (NULL) until kf_context_set_stream() replaces it.
#include "cuda_backend.cuh"

namespace {

kf_status cuda_init(kf_context *ctx, const char *fn) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess)
        return kf__error(KF_ERR_BACKEND_UNAVAILABLE, fn, "no usable CUDA driver: %s (%s)",
                         cudaGetErrorName(e), cudaGetErrorString(e));
    if (count == 0)
        return kf__error(KF_ERR_BACKEND_UNAVAILABLE, fn, "no CUDA device found");
    if (ctx->device_index < 0 || ctx->device_index >= count)
        return kf__error(KF_ERR_INVALID_ARGUMENT, fn,
                         "desc->device_index = %d, expected 0..%d (CUDA devices present)",
                         (int)ctx->device_index, count - 1);
    kf__device_scope on_device; // the handle belongs to the context's device; the caller's
                                // current device is restored on return
    e = on_device.enter((int)ctx->device_index);
    if (e != cudaSuccess)
        return kf__error(KF_ERR_BACKEND_UNAVAILABLE, fn, "cudaSetDevice(%d) failed: %s (%s)",
                         (int)ctx->device_index, cudaGetErrorName(e), cudaGetErrorString(e));
    // Properties the kernels' launch plans read, queried once here rather than per call.
    int sms = 0, smem_optin = 0;
    KF__CUDA_TRY(fn, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount,
                                            ctx->device_index));
    KF__CUDA_TRY(fn, cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                            ctx->device_index));
    ctx->sm_count = sms;
    ctx->smem_optin_bytes = (size_t)smem_optin;
    cublasHandle_t h = NULL;
    cublasStatus_t s = cublasCreate(&h);
    if (s == CUBLAS_STATUS_ALLOC_FAILED)
        return kf__error(KF_ERR_OUT_OF_MEMORY, fn, "cublasCreate failed: %s",
                         kf__cublas_status_name(s));
    if (s != CUBLAS_STATUS_SUCCESS)
        return kf__error(KF_ERR_BACKEND_UNAVAILABLE, fn, "cublasCreate failed: %s",
                         kf__cublas_status_name(s));
    // fp32 GEMMs stay fp32: no TF32 or other reduced-precision tensor-core path (the 3xTF32
    // products ask for TF32 by their compute type). And a product whose C is bfloat16 or float16
    // sums its split-K partial products in float32, not in C's type: the contract of every low
    // product is "accumulate in float32, round C once" (cuda/plain.cuh); cuBLAS may otherwise
    // reduce in the output type (with 16 splits, 2.4x the error of one rounding).
    s = cublasSetMathMode(h, (cublasMath_t)(CUBLAS_DEFAULT_MATH |
                                            CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetStream(h, (cudaStream_t)ctx->stream);
    if (s != CUBLAS_STATUS_SUCCESS) {
        cublasDestroy(h);
        return kf__cublas_check(s, fn, "cuBLAS handle setup");
    }
    ctx->blas = h;
    return KF_OK;
}

void cuda_release(kf_context *ctx) {
    if (ctx->blas != NULL) {
        cublasDestroy((cublasHandle_t)ctx->blas);
        ctx->blas = NULL;
    }
}

// Whether `stream` is capturing a CUDA graph. A query that fails counts as capturing: it fails for
// the legacy default stream while another stream captures in global mode, where an allocation
// would break that capture too.
bool capturing(cudaStream_t stream) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing(stream, &st);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); // not sticky; clear it for later calls
        return true;
    }
    return st != cudaStreamCaptureStatusNone;
}

kf_status cuda_set_stream(kf_context *ctx, const char *fn, void *stream) {
    KF__CUDA_ON_DEVICE(fn, ctx);
    // The arena may still be in use by work queued on the old stream: the new stream waits for
    // that work (one event, recorded and released here), so a call on the new stream never
    // overwrites scratch an earlier call is still reading, and the arena's stream-ordered free
    // (cuda_free) on the new stream comes after both. Not when either stream is capturing a
    // graph: a capturing stream may not wait on work outside its capture, and a wait on an event
    // recorded inside one would pull the new stream into it. A capture's caller orders it after
    // the work it depends on (torch.cuda.graph synchronises the device before capturing).
    cudaStream_t from = kf__stream(ctx), to = (cudaStream_t)stream;
    if (ctx->arena != NULL && to != from && !capturing(from) && !capturing(to)) {
        cudaEvent_t ev;
        KF__CUDA_TRY(fn, cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
        cudaError_t e = cudaEventRecord(ev, from);
        if (e == cudaSuccess) e = cudaStreamWaitEvent(to, ev, 0);
        (void)cudaEventDestroy(ev); // released once the recorded work completes
        KF_TRY(kf__cuda_check(e, fn, "ordering the new stream after the old one's arena work"));
    }
    KF_TRY(kf__cublas_check(cublasSetStream(kf__blas(ctx), to), fn, "cublasSetStream"));
    ctx->stream = stream;
    return KF_OK;
}

// Whether the device has stream-ordered allocation (cudaMallocAsync). Asked per arena growth
// (rare) by alloc and free alike, so both take the same branch for a block.
bool stream_ordered(const kf_context *ctx) {
    int v = 0;
    cudaError_t e = cudaDeviceGetAttribute(&v, cudaDevAttrMemoryPoolsSupported, ctx->device_index);
    if (e != cudaSuccess) (void)cudaGetLastError();
    return e == cudaSuccess && v != 0;
}

// An arena block, stream-ordered: usable by work queued on the context's stream after this call,
// without waiting for the work already queued (cudaMallocAsync; cudaMalloc on devices without
// memory pools). Never while the stream captures a graph: the block would become a graph-owned
// allocation (or, with cudaMalloc, invalidate the capture), so the call is refused by name first.
kf_status cuda_alloc(kf_context *ctx, const char *fn, size_t bytes, void **out) {
    *out = NULL;
    if (bytes == 0) return KF_OK;
    KF__CUDA_ON_DEVICE(fn, ctx);
    if (capturing(kf__stream(ctx)))
        return kf__error(KF_ERR_WORKSPACE_TOO_SMALL, fn,
                         "the call needs an arena of %zu bytes (it holds %zu), but the context's "
                         "stream is capturing a CUDA graph, where growing it would break the "
                         "capture: kf_context_reserve(ctx, %zu) before capturing, or pass a "
                         "workspace",
                         bytes, ctx->arena_bytes, bytes);
    void *p = NULL;
    cudaError_t e = stream_ordered(ctx) ? cudaMallocAsync(&p, bytes, kf__stream(ctx))
                                        : cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError(); // clear the sticky-free allocation error
        return kf__error(KF_ERR_OUT_OF_MEMORY, fn, "allocating an arena of %zu bytes failed: %s",
                         bytes, cudaGetErrorString(e));
    }
    KF_TRY(kf__cuda_check(e, fn, "arena allocation"));
    *out = p;
    return KF_OK;
}

// Frees an arena block once the work queued on the context's stream before this call is done:
// cudaFreeAsync, or cudaFree (which waits for the device) without memory pools.
void cuda_free(kf_context *ctx, void *p) {
    if (p == NULL) return;
    kf__device_scope on_device;
    (void)on_device.enter((int)ctx->device_index);
    if (stream_ordered(ctx))
        (void)cudaFreeAsync(p, kf__stream(ctx));
    else
        (void)cudaFree(p);
}

kf_status cuda_synchronize(kf_context *ctx, const char *fn) {
    KF__CUDA_TRY(fn, cudaStreamSynchronize(kf__stream(ctx)));
    // An asynchronous error from earlier work that the stream wait itself did not surface.
    KF__CUDA_TRY(fn, cudaGetLastError());
    return KF_OK;
}

// Synchronous copy between host memory and memory of the context's device, ordered after the
// work already queued on its stream. For setup calls only (kf_sklinear_init_params): it waits.
kf_status cuda_copy(kf_context *ctx, const char *fn, void *dst, const void *src,
                                   size_t bytes, bool to_device) {
    if (bytes == 0) return KF_OK;
    KF__CUDA_ON_DEVICE(fn, ctx);
    KF__CUDA_TRY(fn, cudaMemcpyAsync(dst, src, bytes,
                                     to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
                                     kf__stream(ctx)));
    KF__CUDA_TRY(fn, cudaStreamSynchronize(kf__stream(ctx)));
    return KF_OK;
}

// Memory a kernel on this context's device may read: device memory of that device, or managed
// memory. Host memory (pageable or pinned) and another device's memory are rejected before any
// launch, so a mixed-up pointer is a status rather than an illegal-address fault later. A pure
// attribute query: no synchronisation, no allocation.
kf_status cuda_check_pointer(const kf_context *ctx, const char *fn, const char *arg,
                                           const void *p) {
    cudaPointerAttributes a;
    cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); // the query's error is not sticky; clear it for later calls
        return kf__error(KF_ERR_INVALID_ARGUMENT, fn,
                         "%s = %p is not memory the CUDA runtime knows (%s): a CUDA context needs "
                         "device memory", arg, p, cudaGetErrorName(e));
    }
    if (a.type == cudaMemoryTypeManaged) return KF_OK;
    if (a.type != cudaMemoryTypeDevice)
        return kf__error(KF_ERR_INVALID_ARGUMENT, fn,
                         "%s = %p is host memory, expected device memory of CUDA device %d", arg, p,
                         (int)ctx->device_index);
    if (a.device != ctx->device_index)
        return kf__error(KF_ERR_INVALID_ARGUMENT, fn,
                         "%s = %p is memory of CUDA device %d, expected the context's device %d",
                         arg, p, a.device, (int)ctx->device_index);
    return KF_OK;
}

} // namespace

extern "C" const kf__backend kf__cuda_backend = {
    cuda_init,         cuda_release,       cuda_set_stream,    cuda_alloc,
    cuda_free,         cuda_synchronize,   cuda_check_pointer, cuda_copy,
    false,             &kf__cuda_rnn_ops,  &kf__cuda_skl_ops,  &kf__cuda_kan_ops,
    &kf__cuda_lowp,
};

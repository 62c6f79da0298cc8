/* Buffers on the benchmarked context's device and the status check, shared by the C drivers
 * that time kfuse itself (bench_rnn.c, bench_sklinear.c). Header-only, like bench_common.h. The
 * driver sets on_cuda before allocating. */
#ifndef KF_BENCH_DEVICE_H
#define KF_BENCH_DEVICE_H

#include "bench_common.h"

#include "kfuse.h"

#ifdef KF_BENCH_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

static int on_cuda = 0;

#define KF_CHECK_CALL(call)                                                                  \
    do {                                                                                     \
        kf_status s_ = (call);                                                               \
        if (s_ != KF_OK)                                                                     \
            bench_fail("%s -> %s: %s", #call, kf_status_string(s_), kf_last_error_message()); \
    } while (0)

/* Memory on the context's device. */
static void *dev_alloc(size_t bytes) {
    if (!on_cuda) return bench_alloc(bytes);
#ifdef KF_BENCH_WITH_CUDA
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 64);
    if (e != cudaSuccess) bench_fail("cudaMalloc(%zu): %s", bytes, cudaGetErrorString(e));
    return p;
#else
    bench_fail("--device cuda: this driver was built without the CUDA runtime");
    return NULL;
#endif
}

static void dev_free(void *p) {
    if (!p) return;
    if (!on_cuda) { free(p); return; }
#ifdef KF_BENCH_WITH_CUDA
    cudaFree(p);
#endif
}

/* Device buffer of n floats, uniform in [lo, hi) (filled on the host, then copied). */
static float *dev_random(size_t n, float lo, float hi) {
    float *h = bench_alloc(n * sizeof(float));
    bench_fill_uniform(h, n, lo, hi);
    if (!on_cuda) return h;
    float *d = dev_alloc(n * sizeof(float));
#ifdef KF_BENCH_WITH_CUDA
    cudaError_t e = cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice);
    if (e != cudaSuccess) bench_fail("cudaMemcpy: %s", cudaGetErrorString(e));
#endif
    free(h);
    return d;
}

/* Sum of squares of n device floats (a sanity value: NaN or 0 shows a broken run). */
static double dev_sumsq(const float *d, size_t n) {
    const float *h = d;
    float *tmp = NULL;
    if (on_cuda) {
        tmp = bench_alloc(n * sizeof(float));
#ifdef KF_BENCH_WITH_CUDA
        cudaError_t e = cudaMemcpy(tmp, d, n * sizeof(float), cudaMemcpyDeviceToHost);
        if (e != cudaSuccess) bench_fail("cudaMemcpy: %s", cudaGetErrorString(e));
#endif
        h = tmp;
    }
    double s = 0.0;
    for (size_t i = 0; i < n; ++i) s += (double)h[i] * h[i];
    free(tmp);
    return s;
}

#endif /* KF_BENCH_DEVICE_H */

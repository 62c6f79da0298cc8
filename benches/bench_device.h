/* Buffers on the benchmarked context's device and the status check, shared by the C drivers
 * that time kfuse itself (bench_rnn.c, bench_sklinear.c, bench_kan.c): the context, tensors,
 * buffers and the timing loop. Header-only, like bench_common.h. The
 * driver sets on_cuda before allocating. */
#ifndef KF_BENCH_DEVICE_H
#define KF_BENCH_DEVICE_H

#include "bench_common.h"

#include "kfuse.h"

#ifdef KF_BENCH_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

static int on_cuda = 0;
/* The element type of the tensors dev_random and dev_tensor make: float32 unless the driver
 * sets it (--dtype bf16|f16 of bench_kan.c and bench_sklinear.c: the values are drawn in
 * float32 and rounded). */
static kf_dtype dev_dtype = KF_DTYPE_F32;

static inline size_t dev_elem_size(void) { return dev_dtype == KF_DTYPE_F32 ? 4 : 2; }

/* dev_dtype as --dtype spells it. */
static inline const char *bench_dtype_name(void) {
    return dev_dtype == KF_DTYPE_F32 ? "f32" : dev_dtype == KF_DTYPE_BF16 ? "bf16" : "f16";
}

/* --dtype's value: f32, bf16 or f16. */
static inline kf_dtype bench_parse_dtype(const char *v) {
    if (!strcmp(v, "f32")) return KF_DTYPE_F32;
    if (!strcmp(v, "bf16")) return KF_DTYPE_BF16;
    if (!strcmp(v, "f16")) return KF_DTYPE_F16;
    bench_fail("--dtype %s: expected f32, bf16 or f16", v);
    return KF_DTYPE_F32;
}

/* Element i of a host buffer of dev_dtype, as a float, and n floats stored in that type (to
 * nearest even: the bfloat16 bits by rounding, float16 by the compiler's _Float16). */
static inline float dev_elem_get(const void *h, size_t i) {
    if (dev_dtype == KF_DTYPE_F32) return ((const float *)h)[i];
    const uint16_t b = ((const uint16_t *)h)[i];
    if (dev_dtype == KF_DTYPE_F16) {
        _Float16 v;
        memcpy(&v, &b, 2);
        return (float)v;
    }
    const uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline void dev_store(const float *src, void *dst, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        if (dev_dtype == KF_DTYPE_F32) {
            ((float *)dst)[i] = src[i];
            continue;
        }
        uint16_t b;
        if (dev_dtype == KF_DTYPE_F16) {
            const _Float16 v = (_Float16)src[i];
            memcpy(&b, &v, 2);
        } else {
            uint32_t u;
            memcpy(&u, &src[i], 4);
            b = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); /* finite values */
        }
        ((uint16_t *)dst)[i] = b;
    }
}

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

/* Device buffer of n values of dev_dtype, uniform in [lo, hi) (drawn in float32 on the host,
 * stored in the type, then copied). */
static void *dev_random(size_t n, float lo, float hi) {
    float *f = bench_alloc(n * sizeof(float));
    bench_fill_uniform(f, n, lo, hi);
    void *h = f;
    if (dev_dtype != KF_DTYPE_F32) {
        h = bench_alloc(n * dev_elem_size());
        dev_store(f, h, n);
        free(f);
    }
    if (!on_cuda) return h;
    void *d = dev_alloc(n * dev_elem_size());
#ifdef KF_BENCH_WITH_CUDA
    cudaError_t e = cudaMemcpy(d, h, n * dev_elem_size(), cudaMemcpyHostToDevice);
    if (e != cudaSuccess) bench_fail("cudaMemcpy: %s", cudaGetErrorString(e));
#endif
    free(h);
    return d;
}

/* Sum of squares of n device values of dev_dtype (a sanity value: NaN or 0 shows a broken
 * run). */
static double dev_sumsq(const void *d, size_t n) {
    const void *h = d;
    void *tmp = NULL;
    if (on_cuda) {
        tmp = bench_alloc(n * dev_elem_size());
#ifdef KF_BENCH_WITH_CUDA
        cudaError_t e = cudaMemcpy(tmp, d, n * dev_elem_size(), cudaMemcpyDeviceToHost);
        if (e != cudaSuccess) bench_fail("cudaMemcpy: %s", cudaGetErrorString(e));
#endif
        h = tmp;
    }
    double s = 0.0;
    for (size_t i = 0; i < n; ++i) s += (double)dev_elem_get(h, i) * dev_elem_get(h, i);
    free(tmp);
    return s;
}

/* A context on the device the driver chose (on_cuda), with `threads` CPU threads (0: default). */
static inline kf_context *dev_context(long threads) {
    kf_context_desc cd;
    kf_context_desc_init(&cd);
    cd.device_type = on_cuda ? KF_DEVICE_CUDA : KF_DEVICE_CPU;
    cd.num_threads = (int32_t)threads;
    kf_context *ctx = NULL;
    KF_CHECK_CALL(kf_context_create(&cd, &ctx));
    return ctx;
}

/* A tensor of dev_dtype of rank nd (1 to 3) over data with the leading nd of the sizes a, b,
 * c. */
static inline kf_tensor dev_tensor(void *data, int32_t nd, long a, long b, long c) {
    const int64_t s[3] = {a, b, c};
    kf_tensor t;
    KF_CHECK_CALL(kf_tensor_init(&t, data, dev_dtype, nd, s));
    return t;
}

/* Frees n device buffers (NULL ones skipped). */
static inline void dev_free_all(void *const *bufs, size_t n) {
    for (size_t i = 0; i < n; ++i) dev_free(bufs[i]);
}

/* Times `reps` runs of run(pass, state) after `warmup` untimed ones, synchronising ctx before
 * each clock read; t[i] gets run i's milliseconds. budget_s > 0 stops once that many seconds
 * have been timed (at least one run). Returns the number of runs timed. */
static inline long dev_time_pass(kf_context *ctx, void (*run)(int pass, void *state), int pass,
                                 void *state, long warmup, long reps, double budget_s, double *t) {
    long done = 0;
    double spent = 0.0;
    for (long r = -warmup; r < reps; ++r) {
        double t0 = bench_now_ms();
        run(pass, state);
        KF_CHECK_CALL(kf_context_synchronize(ctx));
        double dt = bench_now_ms() - t0;
        if (r < 0) continue;
        t[done++] = dt;
        spent += dt;
        if (budget_s > 0 && spent > 1e3 * budget_s) break;
    }
    return done;
}

#endif /* KF_BENCH_DEVICE_H */

/* Helpers shared by the Criterion tests of tests/c (header-only: macros and static inline
 * functions). Every helper that can fail asserts (cr_assert), so a failure ends the test at the
 * call; nothing here decides what a test checks.
 *
 * The CUDA part (CUDA_OK and the device buffers) exists only under KF_HAVE_CUDA. */
#ifndef KF_TEST_H
#define KF_TEST_H

#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kfuse.h"

/* KF_TEST_ASAN is defined when this translation unit is built with AddressSanitizer. */
#if defined(__SANITIZE_ADDRESS__)
#define KF_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KF_TEST_ASAN 1
#endif
#endif

/* ---- status checks ------------------------------------------------------------------------ */

/* KF_OK_(expr): `expr` (a kf_status) must be KF_OK; otherwise the test fails, naming the
 * expression, the status and the last error message. */
#define KF_OK_(expr)                                                                          \
    do {                                                                                      \
        kf_status s_ = (expr);                                                                \
        cr_assert(s_ == KF_OK, "%s: %s (%s)", #expr, kf_status_string(s_),                    \
                  kf_last_error_message());                                                   \
    } while (0)

/* EXPECT_FAIL(expr, status, needle): `expr` returns `status` and the last error message
 * contains the substring `needle` (non-fatal expectations: the test goes on). */
#define EXPECT_FAIL(expr, status, needle)                                                     \
    do {                                                                                      \
        kf_status s_ = (expr);                                                                \
        cr_expect(s_ == (status), "%s: got %s, want %s (%s)", #expr, kf_status_string(s_),    \
                  kf_status_string(status), kf_last_error_message());                         \
        cr_expect(strstr(kf_last_error_message(), (needle)) != NULL,                         \
                  "%s: message \"%s\" does not name \"%s\"", #expr, kf_last_error_message(),  \
                  (needle));                                                                  \
    } while (0)

/* ---- error messages ----------------------------------------------------------------------- */

/* `ch` may appear in a C identifier. */
static inline int ident_char(char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '_';
}

/* `tok` occurs in `msg` as a whole identifier (e.g. "x" in "args->x.shape[2]", not in "dx"). */
static inline int has_token(const char *msg, const char *tok) {
    size_t n = strlen(tok);
    for (const char *p = strstr(msg, tok); p; p = strstr(p + 1, tok))
        if ((p == msg || !ident_char(p[-1])) && !ident_char(p[n])) return 1;
    return 0;
}

/* ---- contexts ----------------------------------------------------------------------------- */

/* A context on `dev` with `num_threads` CPU threads (0: the library default). Never NULL: a CUDA
 * context the build or the machine cannot give (KF_ERR_BACKEND_UNAVAILABLE) skips the test; any
 * other failure fails it. */
static inline kf_context *make_ctx(kf_device_type dev, int32_t num_threads) {
    kf_context_desc d;
    kf_context_desc_init(&d);
    d.device_type = dev;
    d.num_threads = num_threads;
    kf_context *ctx = NULL;
    kf_status s = kf_context_create(&d, &ctx);
    if (dev == KF_DEVICE_CUDA && s == KF_ERR_BACKEND_UNAVAILABLE)
        cr_skip_test("no usable CUDA device: %s", kf_last_error_message());
    cr_assert(s == KF_OK && ctx != NULL, "kf_context_create: %s (%s)", kf_status_string(s),
              kf_last_error_message());
    return ctx;
}

/* ---- tensors ------------------------------------------------------------------------------ */

/* A float32 tensor of rank `nd` (0..3) over `p`, of shape the first `nd` of {a, b, c}. The
 * status of kf_tensor_init is not checked: tests also build tensors the library must refuse. */
static inline kf_tensor t3(const void *p, int32_t nd, int64_t a, int64_t b, int64_t c) {
    int64_t sh[3] = {a, b, c};
    kf_tensor t;
    kf_tensor_init(&t, (void *)p, KF_DTYPE_F32, nd, sh);
    return t;
}

/* A tensor of any dtype and rank; kf_tensor_init must succeed. */
static inline kf_tensor tens(void *data, kf_dtype dt, int32_t ndim, const int64_t *shape) {
    kf_tensor t;
    KF_OK_(kf_tensor_init(&t, data, dt, ndim, shape));
    return t;
}

/* ---- host buffers ------------------------------------------------------------------------- */

/* `bytes` of host memory aligned to 64 bytes (as the library asks of workspaces), with at least
 * 128 bytes of slack past the end; never NULL. Release with free(). */
static inline void *xalloc(size_t bytes) {
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64 + 128);
    cr_assert(p != NULL, "out of memory allocating %zu bytes", bytes);
    return p;
}

/* Sets p[0..n) to NaN. */
static inline void poison(float *p, int64_t n) {
    for (int64_t i = 0; i < n; ++i) p[i] = NAN;
}

/* n floats from malloc, all NaN, so that an output element left unwritten shows. */
static inline float *poisoned(int64_t n) {
    float *v = malloc((size_t)n * sizeof *v);
    poison(v, n);
    return v;
}

/* ---- device buffers ----------------------------------------------------------------------- */
#ifdef KF_HAVE_CUDA
#include <cuda_runtime.h>

/* CUDA_OK(expr): `expr` (a cudaError_t) must be cudaSuccess; otherwise the test fails. */
#define CUDA_OK(expr)                                                                         \
    do {                                                                                      \
        cudaError_t e_ = (expr);                                                              \
        cr_assert(e_ == cudaSuccess, "%s: %s", #expr, cudaGetErrorString(e_));                 \
    } while (0)

/* `bytes` of device memory (64 when `bytes` is 0, so never NULL), uninitialised. cudaFree. */
static inline void *dalloc(size_t bytes) {
    void *p = NULL;
    CUDA_OK(cudaMalloc(&p, bytes > 0 ? bytes : 64));
    return p;
}

/* A device copy of `bytes` of host memory at `h`; NULL for NULL. */
static inline void *to_dev(const void *h, size_t bytes) {
    if (h == NULL) return NULL;
    void *d = dalloc(bytes);
    CUDA_OK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

/* n device floats with all bits set (NaN). */
static inline float *dpoisoned(int64_t n) {
    float *d = dalloc((size_t)n * sizeof(float));
    CUDA_OK(cudaMemset(d, 0xFF, (size_t)n * sizeof(float)));
    return d;
}

/* A malloc'd host copy of n device floats at `d` (synchronous). */
static inline float *to_host(const void *d, int64_t n) {
    float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    CUDA_OK(cudaMemcpy(h, d, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}
#endif /* KF_HAVE_CUDA */

/* ---- float64 buffers on either device (the float64 tests run on both) ---------------------- */

/* The n doubles at host `h` where a call on a `dev` context reads them: `h` itself on the CPU, a
 * device copy on CUDA (its contents copied, NaN poison included); NULL for NULL. Release with
 * unplace(). */
static inline double *place_f64(kf_device_type dev, double *h, int64_t n) {
#ifdef KF_HAVE_CUDA
    if (dev == KF_DEVICE_CUDA && h != NULL)
        return (double *)to_dev(h, (size_t)(n > 0 ? n : 1) * sizeof(double));
#endif
    (void)dev, (void)n;
    return h;
}

/* The n doubles at `placed` (place_f64's result) back into host `h`: a copy on CUDA, nothing on
 * the CPU (they are the same memory). */
static inline void fetch_f64(kf_device_type dev, double *h, const double *placed, int64_t n) {
#ifdef KF_HAVE_CUDA
    if (dev == KF_DEVICE_CUDA && h != NULL && n > 0)
        CUDA_OK(cudaMemcpy(h, placed, (size_t)n * sizeof(double), cudaMemcpyDeviceToHost));
#endif
    (void)dev, (void)h, (void)placed, (void)n;
}

static inline void unplace(kf_device_type dev, void *placed) {
#ifdef KF_HAVE_CUDA
    if (dev == KF_DEVICE_CUDA) cudaFree(placed);
#endif
    (void)dev, (void)placed;
}

#endif /* KF_TEST_H */

/* Internal declarations shared by the C API front ends and the backends. Not installed.
 *
 * Naming: cross-file internal symbols start with kf__; the build hides everything that is not
 * marked KF_API, so none of these is exported. */
#ifndef KF_INTERNAL_H
#define KF_INTERNAL_H

#include "kfuse.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors (status.c) --------------------------------------------------------------------
 * The thread-local detail message behind kf_last_error_message(). */
#if defined(__GNUC__)
#define KF__PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define KF__PRINTF(a, b)
#endif

/* Records "fn: <formatted detail>" as the calling thread's last error and returns `status`. */
kf_status kf__error(kf_status status, const char *fn, const char *fmt, ...) KF__PRINTF(3, 4);
/* Clears the last error to "" (every public entry point does this first). */
void kf__clear_error(void);

/* One-line checks, in the zstd manner. `__func__` is the public entry point's name because the
 * checks sit in the entry points themselves or in helpers that take `fn` explicitly. */
#define KF_CHECK(cond, status, ...)                                                         \
    do {                                                                                    \
        if (!(cond)) return kf__error((status), __func__, __VA_ARGS__);                     \
    } while (0)
#define KF_CHECK_FN(fn, cond, status, ...)                                                  \
    do {                                                                                    \
        if (!(cond)) return kf__error((status), (fn), __VA_ARGS__);                         \
    } while (0)
#define KF_TRY(expr)                                                                        \
    do {                                                                                    \
        kf_status kf__s = (expr);                                                           \
        if (kf__s != KF_OK) return kf__s;                                                   \
    } while (0)

/* Overflow-checked size arithmetic: false when the result does not fit. */
static inline bool kf__mul_size(size_t a, size_t b, size_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool kf__add_size(size_t a, size_t b, size_t *out) {
    return !__builtin_add_overflow(a, b, out);
}
/* Rounds up to the 64-byte granule every sub-buffer of a workspace or reserve is aligned to. */
#define KF__ALIGN 64u
static inline size_t kf__align_up(size_t n) { return (n + (KF__ALIGN - 1)) & ~(size_t)(KF__ALIGN - 1); }

/* Checks that a struct handed in by the caller has a usable struct_size: at least `min_size`
 * (the 1.0 layout) and, when larger than the size this library knows, zero beyond it. */
kf_status kf__check_struct_size(const char *fn, const char *arg, const void *s, size_t known_size);

/* ---- tensors (tensor.c) ---------------------------------------------------------------- */
/* Validates `t` as argument `arg` of `fn` for a call on `ctx`: dtype, rank, exact shape (a -1
 * entry accepts any extent >= 1 and reports it through `shape`), row-major contiguity, non-NULL
 * data unless `optional`, alignment to the dtype, and (CUDA contexts) that the data is memory of
 * the context's device. Returns KF_OK with *present set. */
kf_status kf__check_tensor(const kf_context *ctx, const char *fn, const char *arg,
                           const kf_tensor *t, kf_dtype dtype, int32_t ndim, int64_t *shape,
                           bool optional, bool *present);
/* grad_mode is KF_GRAD_OVERWRITE or KF_GRAD_ACCUMULATE. */
kf_status kf__check_grad_mode(const char *fn, kf_grad_mode grad_mode);

/* A float32 row tensor [..., width] of a layer whose input has any leading dims: `ndim` < 0
 * takes the tensor's own rank (1..KF_MAX_DIMS) with free leading extents; otherwise the rank is
 * `ndim` and the leading extents must equal `lead` (ndim - 1 of them). `shape` (KF_MAX_DIMS
 * entries) receives the checked shape and *rows the product of the leading extents (at most
 * INT32_MAX: kernels index rows with 32-bit ints); an absent optional tensor gives rows = 0. */
kf_status kf__check_row_tensor(const kf_context *ctx, const char *fn, const char *arg,
                               const kf_tensor *t, int32_t ndim, const int64_t *lead,
                               int64_t width, bool optional, int64_t *shape, bool *present,
                               int64_t *rows);
/* For a CUDA context, that `p` (a caller workspace or reserve) is memory of its device. */
kf_status kf__check_device_memory(const kf_context *ctx, const char *fn, const char *arg,
                                  const void *p);
size_t kf__dtype_bytes(int32_t dtype);

/* ---- context (context.c, arena.c) ------------------------------------------------------ */
struct kf_context {
    int32_t device_type;  /* kf_device_type */
    int32_t device_index;
    int32_t num_threads;  /* >= 1, resolved at creation */
    uint32_t flags;       /* KF_CONTEXT_* */
    void *stream;         /* cudaStream_t, NULL = legacy default stream */
    void *blas;           /* cublasHandle_t on CUDA, NULL on the CPU */
    void *arena;          /* host or device memory, KF__ALIGN-aligned */
    size_t arena_bytes;
    uint64_t grow_count;
};

/* Makes sure the arena holds `bytes` (growing it unless KF_CONTEXT_FIXED_ARENA) and returns it.
 * A zero-byte request returns NULL with KF_OK. */
kf_status kf__arena_acquire(kf_context *ctx, const char *fn, size_t bytes, void **out);
void kf__arena_release_all(kf_context *ctx);

/* Picks the scratch buffer of a call: the caller's workspace if given (checked against `need`),
 * else the arena. */
kf_status kf__workspace_select(kf_context *ctx, const char *fn, void *workspace,
                               size_t workspace_bytes, size_t need, void **out);

#ifdef KF_HAVE_CUDA
/* CUDA device services (cuda/device.cu). Each returns KF_OK or a status with the message set. */
kf_status kf__cuda_context_init(kf_context *ctx, const char *fn);
void kf__cuda_context_release(kf_context *ctx);
kf_status kf__cuda_set_stream(kf_context *ctx, const char *fn, void *stream);
kf_status kf__cuda_malloc(kf_context *ctx, const char *fn, size_t bytes, void **out);
void kf__cuda_free(kf_context *ctx, void *p);
kf_status kf__cuda_synchronize(kf_context *ctx, const char *fn);
kf_status kf__cuda_check_pointer(const kf_context *ctx, const char *fn, const char *arg,
                                 const void *p);
/* Copies `bytes` host -> device (to_device) or device -> host, then waits for the stream. */
kf_status kf__cuda_copy(kf_context *ctx, const char *fn, void *dst, const void *src, size_t bytes,
                        bool to_device);
#endif

#ifdef __cplusplus
}
#endif

#endif /* KF_INTERNAL_H */

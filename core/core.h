/* The neutral core every layer builds on: errors, size arithmetic, the context and its arena,
 * and host staging. Front ends (capi/src), backends (cpu/, cuda/) and the host library (host/)
 * include this and the per-op contracts beside it (core/<op>_backend.h); core/ includes none of
 * them. Not installed. docs/architecture.md draws the layers.
 *
 * Naming: cross-file internal symbols start with kf__; the build hides everything that is not
 * marked KF_API, so none of these is exported. */
#ifndef KF_CORE_H
#define KF_CORE_H

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
/* Rounds up to the granule every sub-buffer of a workspace or reserve is aligned to. */
#define KF__ALIGN ((unsigned)KF_ALIGN_BYTES)
static inline size_t kf__align_up(size_t n) { return (n + (KF__ALIGN - 1)) & ~(size_t)(KF__ALIGN - 1); }

/* Checks that a struct handed in by the caller has a usable struct_size: at least
 * `oldest_size` (the layout of the version that introduced the struct) and, when larger than
 * `known_size` (this library's sizeof), zero beyond it; then copies its first
 * min(struct_size, known_size) bytes over `out` (which holds the defaults of the fields an older
 * caller does not have; NULL: no copy). */
kf_status kf__read_struct(const char *fn, const char *arg, const void *s, size_t oldest_size,
                          size_t known_size, void *out);
/* kf__read_struct() of a struct no field has been appended to: struct_size at least known_size. */
kf_status kf__check_struct_size(const char *fn, const char *arg, const void *s, size_t known_size);

/* ---- context (context.c, arena.c) ------------------------------------------------------ */
struct kf__backend;

struct kf_context {
    const struct kf__backend *backend; /* chosen once, at creation (core/backend.h) */
    int32_t device_type;  /* kf_device_type */
    int32_t device_index;
    int32_t num_threads;  /* >= 1, resolved at creation */
    uint32_t flags;       /* KF_CONTEXT_* */
    void *stream;         /* cudaStream_t, NULL = legacy default stream */
    void *blas;           /* cublasHandle_t on CUDA, NULL on the CPU */
    void *arena;          /* host or device memory, KF__ALIGN-aligned */
    size_t arena_bytes;
    uint64_t grow_count;
    /* Device properties, queried once at creation by the backend's init (0 on the CPU). */
    int32_t sm_count;          /* streaming multiprocessors */
    size_t smem_optin_bytes;   /* opt-in shared memory per block */
    /* CPU: the instruction set of the recurrent kernels, picked once at creation by the
     * backend's init (cpu/cpu_backend.h); 0 elsewhere. */
    int32_t isa;
};

/* The thread count of a context created with num_threads = 0 (threads.c; kfuse.h). */
int32_t kf__default_threads(void);

/* Makes sure the arena holds `bytes` (growing it unless KF_CONTEXT_FIXED_ARENA) and returns it.
 * A zero-byte request returns NULL with KF_OK. */
kf_status kf__arena_acquire(kf_context *ctx, const char *fn, size_t bytes, void **out);
void kf__arena_release_all(kf_context *ctx);

/* Picks the scratch buffer of a call: the caller's workspace if given (checked against `need`),
 * else the arena. */
kf_status kf__workspace_select(kf_context *ctx, const char *fn, void *workspace,
                               size_t workspace_bytes, size_t need, void **out);

/* That `p` (a caller workspace or reserve, or tensor data) is memory the context's backend can
 * read; KF_OK for NULL and on the CPU. */
kf_status kf__check_device_memory(const kf_context *ctx, const char *fn, const char *arg,
                                  const void *p);

/* ---- host staging (stage.c) -------------------------------------------------------------
 * The setup calls (SKLinear's initialisation, the KAN grids) compute on the host whatever the
 * context's device. kf__stage_run gives `run` a host view of n buffers of the context's memory:
 * KF__STAGE_IN buffers are read (on a CPU context the data itself; else a host copy),
 * KF__STAGE_OUT buffers are written (on a CPU context in place; else copied back after `run`
 * succeeds), KF__STAGE_OUT_FRESH buffers are written to a fresh host buffer that aliases no
 * input and is copied over `data` only when `run` succeeds, on every device. A buffer with data
 * NULL stays NULL. Returns run's status, or KF_ERR_OUT_OF_MEMORY / the copy's status. */
enum { KF__STAGE_IN, KF__STAGE_OUT, KF__STAGE_OUT_FRESH };
typedef struct kf__stage {
    void *data;     /* the caller's buffer, memory of the context's device; NULL = absent */
    size_t bytes;
    int32_t dir;    /* KF__STAGE_* */
    void *host;     /* set by kf__stage_run: the view `run` reads or writes */
} kf__stage;
kf_status kf__stage_run(kf_context *ctx, const char *fn, kf__stage *bufs, int32_t n,
                        kf_status (*run)(void *arg, const kf__stage *bufs), void *arg);

#ifdef __cplusplus
}
#endif

#endif /* KF_CORE_H */

/* The CPU backend's table (core/backend.h): host memory, no stream, every op, every plan the
 * front ends accept (float32, float64, bfloat16 and float16 storage, every op's low plans served
 * by its own kernels; any spline order). */
#include "cpu_backend.h"

#include <stdlib.h>
#include <string.h>

static kf_status cpu_init(kf_context *ctx, const char *fn) {
    return kf__cpu_isa_pick(fn, &ctx->isa);
}

static void cpu_release(kf_context *ctx) {}

static kf_status cpu_set_stream(kf_context *ctx, const char *fn, void *stream) {
    KF_CHECK_FN(fn, stream == NULL, KF_ERR_INVALID_ARGUMENT,
                "stream = %p on a CPU context, expected NULL", stream);
    return KF_OK;
}

static kf_status cpu_alloc(kf_context *ctx, const char *fn, size_t bytes, void **out) {
    /* kf__align_up() would wrap to 0 for the last KF__ALIGN-1 sizes (reliability: fuzz_rnn). */
    KF_CHECK_FN(fn, bytes <= SIZE_MAX - (KF__ALIGN - 1), KF_ERR_OUT_OF_MEMORY,
                "cannot allocate an arena of %zu bytes", bytes);
    *out = aligned_alloc(KF__ALIGN, kf__align_up(bytes));
    KF_CHECK_FN(fn, *out != NULL, KF_ERR_OUT_OF_MEMORY, "cannot allocate an arena of %zu bytes",
                bytes);
    return KF_OK;
}

static void cpu_free(kf_context *ctx, void *p) { free(p); }

static kf_status cpu_synchronize(kf_context *ctx, const char *fn) { return KF_OK; }

static kf_status cpu_check_pointer(const kf_context *ctx, const char *fn, const char *arg,
                                   const void *p) {
    return KF_OK;
}

/* The recurrent layers' table for a plan, once, at its creation: the float64 one, or the float32
 * kernels (which serve the low types too) of the instruction set the context picked. */
static kf_status cpu_rnn_select(const struct kf_rnn_plan *p, const char *fn,
                                const kf__rnn_ops **ops) {
    *ops = &kf__cpu_rnn_ops_base;
    if (p->dtype == KF_DTYPE_F64) *ops = &kf__cpu_rnn_ops_f64;
#ifdef KF_HAVE_CPU_V4
    else if (p->ctx->isa == KF__CPU_ISA_V4) *ops = &kf__cpu_rnn_ops_v4;
#endif
    return KF_OK;
}

static const kf__rnn_ops cpu_rnn_ops = {cpu_rnn_select, NULL, NULL, NULL};

static kf_status cpu_copy(kf_context *ctx, const char *fn, void *dst, const void *src,
                          size_t bytes, bool to_device) {
    if (bytes > 0) memcpy(dst, src, bytes);
    return KF_OK;
}

const kf__backend kf__cpu_backend = {
    .init = cpu_init,
    .release = cpu_release,
    .set_stream = cpu_set_stream,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .synchronize = cpu_synchronize,
    .check_pointer = cpu_check_pointer,
    .copy = cpu_copy,
    .host_memory = true,
    .rnn = &cpu_rnn_ops,
    .skl = &kf__cpu_skl_ops,
    .kan = &kf__cpu_kan_ops,
};

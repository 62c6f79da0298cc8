/* The context's arena: one block of host or device memory that serves every call's scratch when
 * the caller lends none. It only grows (to the largest request seen), so a loop of calls of the
 * same shapes allocates once and then never again; grow_count makes that observable. */
#include "internal.h"

#include <stdlib.h>

static kf_status kf__raw_alloc(kf_context *ctx, const char *fn, size_t bytes, void **out) {
#ifdef KF_HAVE_CUDA
    if (ctx->device_type == KF_DEVICE_CUDA) return kf__cuda_malloc(ctx, fn, bytes, out);
#endif
    (void)ctx;
    /* kf__align_up() would wrap to 0 for the last KF__ALIGN-1 sizes (reliability: fuzz_rnn). */
    KF_CHECK_FN(fn, bytes <= SIZE_MAX - (KF__ALIGN - 1), KF_ERR_OUT_OF_MEMORY,
                "cannot allocate an arena of %zu bytes", bytes);
    *out = aligned_alloc(KF__ALIGN, kf__align_up(bytes));
    KF_CHECK_FN(fn, *out != NULL, KF_ERR_OUT_OF_MEMORY, "cannot allocate an arena of %zu bytes",
                bytes);
    return KF_OK;
}

static void kf__raw_free(kf_context *ctx, void *p) {
    if (p == NULL) return;
#ifdef KF_HAVE_CUDA
    if (ctx->device_type == KF_DEVICE_CUDA) {
        kf__cuda_free(ctx, p);
        return;
    }
#endif
    (void)ctx;
    free(p);
}

kf_status kf__arena_acquire(kf_context *ctx, const char *fn, size_t bytes, void **out) {
    *out = NULL;
    if (bytes == 0) return KF_OK;
    if (bytes > ctx->arena_bytes) {
        KF_CHECK_FN(fn, !(ctx->flags & KF_CONTEXT_FIXED_ARENA), KF_ERR_WORKSPACE_TOO_SMALL,
                    "the call needs %zu bytes of workspace, the fixed arena holds %zu "
                    "(kf_context_reserve() it, or pass a workspace)", bytes, ctx->arena_bytes);
#ifdef KF_HAVE_CUDA
        /* Work already enqueued may still read the old block. */
        if (ctx->device_type == KF_DEVICE_CUDA && ctx->arena != NULL)
            KF_TRY(kf__cuda_synchronize(ctx, fn));
#endif
        void *fresh;
        KF_TRY(kf__raw_alloc(ctx, fn, bytes, &fresh));
        kf__raw_free(ctx, ctx->arena);
        ctx->arena = fresh;
        ctx->arena_bytes = bytes;
        ctx->grow_count++;
    }
    *out = ctx->arena;
    return KF_OK;
}

void kf__arena_release_all(kf_context *ctx) {
#ifdef KF_HAVE_CUDA
    if (ctx->device_type == KF_DEVICE_CUDA && ctx->arena != NULL)
        (void)kf__cuda_synchronize(ctx, "kf_context_destroy");
#endif
    kf__raw_free(ctx, ctx->arena);
    ctx->arena = NULL;
    ctx->arena_bytes = 0;
}

kf_status kf__workspace_select(kf_context *ctx, const char *fn, void *workspace,
                               size_t workspace_bytes, size_t need, void **out) {
    if (workspace == NULL) {
        KF_CHECK_FN(fn, workspace_bytes == 0, KF_ERR_INVALID_ARGUMENT,
                    "workspace is NULL but workspace_bytes = %zu", workspace_bytes);
        return kf__arena_acquire(ctx, fn, need, out);
    }
    KF_CHECK_FN(fn, workspace_bytes >= need, KF_ERR_WORKSPACE_TOO_SMALL,
                "workspace_bytes = %zu, expected >= %zu (kf_*_workspace_size)", workspace_bytes,
                need);
    KF_CHECK_FN(fn, ((uintptr_t)workspace % KF__ALIGN) == 0, KF_ERR_INVALID_ARGUMENT,
                "workspace = %p is not %u-byte aligned", workspace, KF__ALIGN);
    KF_TRY(kf__check_device_memory(ctx, fn, "workspace", workspace));
    *out = workspace;
    return KF_OK;
}

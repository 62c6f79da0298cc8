/* The context's arena: one block of host or device memory that serves every call's scratch when
 * the caller lends none. It only grows (to the largest request seen), so a loop of calls of the
 * same shapes allocates once and then never again; grow_count makes that observable. */
#include "backend.h"

#include <stdlib.h>

kf_status kf__arena_acquire(kf_context *ctx, const char *fn, size_t bytes, void **out) {
    *out = NULL;
    if (bytes == 0) return KF_OK;
    if (bytes > ctx->arena_bytes) {
        KF_CHECK_FN(fn, !(ctx->flags & KF_CONTEXT_FIXED_ARENA), KF_ERR_WORKSPACE_TOO_SMALL,
                    "the call needs %zu bytes of workspace, the fixed arena holds %zu "
                    "(kf_context_reserve() it, or pass a workspace)", bytes, ctx->arena_bytes);
        /* No wait: the backend's alloc and free are ordered on the context's stream (core/backend.h),
         * so work already enqueued keeps the old block until it is done. */
        void *fresh;
        KF_TRY(ctx->backend->alloc(ctx, fn, bytes, &fresh));
        ctx->backend->free(ctx, ctx->arena);
        ctx->arena = fresh;
        ctx->arena_bytes = bytes;
        ctx->grow_count++;
    }
    *out = ctx->arena;
    return KF_OK;
}

void kf__arena_release_all(kf_context *ctx) {
    if (ctx->arena != NULL) (void)ctx->backend->synchronize(ctx, "kf_context_destroy");
    ctx->backend->free(ctx, ctx->arena);
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

kf_status kf__check_device_memory(const kf_context *ctx, const char *fn, const char *arg,
                                  const void *p) {
    if (p == NULL || ctx->backend->host_memory) return KF_OK;
    return ctx->backend->check_pointer(ctx, fn, arg, p);
}

/* The context: device, stream, BLAS handle and arena. One thread at a time per context; no state
 * is shared between contexts. */
#include "backend.h"

#include <stdlib.h>

KF_API void kf_context_desc_init(kf_context_desc *desc) {
    if (desc == NULL) return;
    kf_context_desc d = {0};
    d.struct_size = sizeof d;
    d.device_type = KF_DEVICE_CPU;
    *desc = d;
}

KF_API kf_status kf_context_create(const kf_context_desc *desc, kf_context **out) {
    kf__clear_error();
    KF_CHECK(out != NULL, KF_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    KF_TRY(kf__check_struct_size(__func__, "desc", desc, sizeof(kf_context_desc)));
    KF_CHECK(desc->device_type == KF_DEVICE_CPU || desc->device_type == KF_DEVICE_CUDA,
             KF_ERR_INVALID_ARGUMENT, "desc->device_type = %d, expected KF_DEVICE_CPU (1) or "
             "KF_DEVICE_CUDA (2)", (int)desc->device_type);
    KF_CHECK(desc->device_index >= 0, KF_ERR_INVALID_ARGUMENT,
             "desc->device_index = %d, expected >= 0", (int)desc->device_index);
    KF_CHECK(desc->device_type != KF_DEVICE_CPU || desc->device_index == 0,
             KF_ERR_INVALID_ARGUMENT, "desc->device_index = %d, expected 0 for the CPU",
             (int)desc->device_index);
    KF_CHECK(desc->num_threads >= 0 && desc->num_threads <= 4096, KF_ERR_INVALID_ARGUMENT,
             "desc->num_threads = %d, expected 0 (the default) .. 4096", (int)desc->num_threads);
    KF_CHECK((desc->flags & ~KF_CONTEXT_FIXED_ARENA) == 0, KF_ERR_INVALID_ARGUMENT,
             "desc->flags = 0x%x has unknown bits 0x%x", desc->flags,
             desc->flags & ~KF_CONTEXT_FIXED_ARENA);
    const kf__backend *backend = kf__backend_for(desc->device_type);
    KF_CHECK(backend != NULL, KF_ERR_BACKEND_UNAVAILABLE,
             "desc->device_type = KF_DEVICE_CUDA, but this kfuse was built without CUDA");

    kf_context *ctx = calloc(1, sizeof *ctx);
    KF_CHECK(ctx != NULL, KF_ERR_OUT_OF_MEMORY, "cannot allocate the context");
    ctx->backend = backend;
    ctx->device_type = desc->device_type;
    ctx->device_index = desc->device_index;
    ctx->num_threads = desc->num_threads > 0 ? desc->num_threads : kf__default_threads();
    ctx->flags = desc->flags;
    kf_status s = backend->init(ctx, __func__);
    if (s != KF_OK) {
        free(ctx);
        return s;
    }
    if (desc->arena_bytes > 0) {
        void *unused;
        uint32_t flags = ctx->flags;
        ctx->flags &= ~KF_CONTEXT_FIXED_ARENA; /* the initial arena is allowed to be allocated */
        s = kf__arena_acquire(ctx, __func__, desc->arena_bytes, &unused);
        ctx->flags = flags;
        if (s != KF_OK) {
            kf_context_destroy(ctx);
            return s;
        }
    }
    *out = ctx;
    return KF_OK;
}

KF_API void kf_context_destroy(kf_context *ctx) {
    if (ctx == NULL) return;
    kf__arena_release_all(ctx);
    ctx->backend->release(ctx);
    free(ctx);
}

KF_API kf_status kf_context_device_type(const kf_context *ctx, int32_t *device_type) {
    kf__clear_error();
    KF_CHECK(ctx != NULL, KF_ERR_INVALID_ARGUMENT, "ctx is NULL");
    KF_CHECK(device_type != NULL, KF_ERR_INVALID_ARGUMENT, "device_type is NULL");
    *device_type = ctx->device_type;
    return KF_OK;
}

KF_API kf_status kf_context_set_stream(kf_context *ctx, void *stream) {
    kf__clear_error();
    KF_CHECK(ctx != NULL, KF_ERR_INVALID_ARGUMENT, "ctx is NULL");
    return ctx->backend->set_stream(ctx, __func__, stream);
}

KF_API kf_status kf_context_get_stream(const kf_context *ctx, void **stream) {
    kf__clear_error();
    KF_CHECK(ctx != NULL, KF_ERR_INVALID_ARGUMENT, "ctx is NULL");
    KF_CHECK(stream != NULL, KF_ERR_INVALID_ARGUMENT, "stream is NULL");
    *stream = ctx->stream;
    return KF_OK;
}

KF_API kf_status kf_context_reserve(kf_context *ctx, size_t bytes) {
    kf__clear_error();
    KF_CHECK(ctx != NULL, KF_ERR_INVALID_ARGUMENT, "ctx is NULL");
    void *unused;
    uint32_t flags = ctx->flags;
    ctx->flags &= ~KF_CONTEXT_FIXED_ARENA; /* an explicit reserve may allocate */
    kf_status s = kf__arena_acquire(ctx, __func__, bytes, &unused);
    ctx->flags = flags;
    return s;
}

KF_API kf_status kf_context_arena_info(const kf_context *ctx, size_t *arena_bytes,
                                       uint64_t *grow_count) {
    kf__clear_error();
    KF_CHECK(ctx != NULL, KF_ERR_INVALID_ARGUMENT, "ctx is NULL");
    if (arena_bytes) *arena_bytes = ctx->arena_bytes;
    if (grow_count) *grow_count = ctx->grow_count;
    return KF_OK;
}

KF_API kf_status kf_context_synchronize(kf_context *ctx) {
    kf__clear_error();
    KF_CHECK(ctx != NULL, KF_ERR_INVALID_ARGUMENT, "ctx is NULL");
    return ctx->backend->synchronize(ctx, __func__);
}

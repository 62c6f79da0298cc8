/* Host staging for the setup calls (core.h): one host block for every buffer that needs a copy,
 * the inputs copied in, `run`, the outputs copied back. The copies are the backend's own, so
 * this file serves every device. */
#include "backend.h"

#include <stdlib.h>
#include <string.h>

/* Whether buffer b gets a host copy of its own. */
static bool kf__stage_copied(const kf_context *ctx, const kf__stage *b) {
    return b->data != NULL && (b->dir == KF__STAGE_OUT_FRESH || !ctx->backend->host_memory);
}

kf_status kf__stage_run(kf_context *ctx, const char *fn, kf__stage *bufs, int32_t n,
                        kf_status (*run)(void *arg, const kf__stage *bufs), void *arg) {
    size_t total = 0;
    for (int32_t i = 0; i < n; ++i)
        if (kf__stage_copied(ctx, &bufs[i]))
            KF_CHECK_FN(fn, bufs[i].bytes <= SIZE_MAX - KF__ALIGN &&
                            kf__add_size(total, kf__align_up(bufs[i].bytes), &total),
                        KF_ERR_OUT_OF_MEMORY, "the host staging does not fit in memory");
    char *block = NULL;
    if (total > 0) {
        block = aligned_alloc(KF__ALIGN, total);
        KF_CHECK_FN(fn, block != NULL, KF_ERR_OUT_OF_MEMORY,
                    "cannot allocate %zu bytes of host staging", total);
    }
    const kf__backend *be = ctx->backend;
    kf_status s = KF_OK;
    size_t off = 0;
    for (int32_t i = 0; i < n; ++i) {
        kf__stage *b = &bufs[i];
        b->host = b->data;
        if (!kf__stage_copied(ctx, b)) continue;
        b->host = block + off;
        off += kf__align_up(b->bytes);
        if (b->dir == KF__STAGE_IN && s == KF_OK)
            s = be->copy(ctx, fn, b->host, b->data, b->bytes, false);
    }
    if (s == KF_OK) s = run(arg, bufs);
    for (int32_t i = 0; i < n && s == KF_OK; ++i) {
        const kf__stage *b = &bufs[i];
        if (b->dir != KF__STAGE_IN && kf__stage_copied(ctx, b))
            s = be->copy(ctx, fn, b->data, b->host, b->bytes, true);
    }
    free(block);
    return s;
}

/* The backend seam: what a backend gives the core and the front ends, as one table per backend
 * with one op table per op (core/<op>_backend.h). Every op table has the same four entries:
 *   select(plan, fn,    asked once, at plan creation, with the plan's fields filled: KF_OK and
 *          &ops)        the table that serves this plan (the one for its device x instruction
 *                       set x dtype x path, which the plan keeps), or KF_ERR_UNSUPPORTED naming
 *                       the desc field the backend cannot serve (a dtype, a spline order);
 *                       NULL in a selected table (and in an entry table that serves every
 *                       plan as it is: the recurrent and KAN fronts then keep it)
 *   sizes / workspace   pure: the bytes a call of that shape needs
 *   forward, backward   run a checked record (never re-checked); KF_OK or the message set
 * A context picks its table once, at creation (kf__backend_for); a plan takes its op table from
 * the context once, at plan creation, and asks the op's select() there, so what a
 * backend cannot do is KF_ERR_UNSUPPORTED at creation, never in a call, and a selected table's
 * entries never branch on the dtype, the instruction set or the path again
 * (tests/abi/check_dispatch.sh). Nothing else branches on the device.
 *
 * A new backend: a directory beside cpu/ and cuda/ that includes only core/ (and host/ for host
 * algorithms), defines one kf__backend, and is named in kf__backend_for (backend.c). */
#ifndef KF_CORE_BACKEND_H
#define KF_CORE_BACKEND_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

struct kf__rnn_ops;
struct kf__skl_ops;
struct kf__kan_ops;
struct kf__lowp_base;

typedef struct kf__backend {
    /* Device services. Each returns KF_OK or a status with the message set under `fn`. */
    /* Fills the context's backend state (handles, device properties); on failure leaves nothing
     * to release. */
    kf_status (*init)(kf_context *ctx, const char *fn);
    void (*release)(kf_context *ctx);
    kf_status (*set_stream)(kf_context *ctx, const char *fn, void *stream);
    /* An arena block of `bytes` of device memory, KF__ALIGN-aligned, and its release (free accepts
     * NULL). Both are ordered on the context's stream: the block serves work queued after alloc,
     * and free releases it once the work queued before free is done, so growing the arena never
     * waits for the stream. CUDA refuses alloc while the stream captures a graph. */
    kf_status (*alloc)(kf_context *ctx, const char *fn, size_t bytes, void **out);
    void (*free)(kf_context *ctx, void *p);
    /* Waits for the work queued on the context's stream. */
    kf_status (*synchronize)(kf_context *ctx, const char *fn);
    /* That `p` (not NULL) is memory of the context's device; named `arg` in the message. */
    kf_status (*check_pointer)(const kf_context *ctx, const char *fn, const char *arg,
                               const void *p);
    /* Copies `bytes` host -> device (to_device) or device -> host, then waits. Setup calls only. */
    kf_status (*copy)(kf_context *ctx, const char *fn, void *dst, const void *src, size_t bytes,
                      bool to_device);
    bool host_memory;   /* the device's memory is host memory: staging needs no copies */
    /* The op tables (core/rnn_backend.h, core/sklinear_backend.h, core/kan_backend.h). */
    const struct kf__rnn_ops *rnn;
    const struct kf__skl_ops *skl;
    const struct kf__kan_ops *kan;
    /* Where the op tables above are, or call, core/lowp_ops.h's (bfloat16 and float16 plans
     * converted around float32 ones): the backend's own tables and conversion routine; else
     * NULL. */
    const struct kf__lowp_base *lowp;
} kf__backend;

extern const kf__backend kf__cpu_backend;  /* cpu/backend.c */
extern const kf__backend kf__cuda_backend; /* cuda/device.cu, in builds with CUDA */

/* The backend of `device_type` in this build, or NULL (a CUDA context in a CPU-only build). */
const kf__backend *kf__backend_for(int32_t device_type);

#ifdef __cplusplus
}
#endif

#endif /* KF_CORE_BACKEND_H */

/* What every front end (capi/src) shares beyond the core: the tensor checks. Not installed; the
 * backends never include this (they receive checked records, core/<op>_backend.h). */
#ifndef KF_FRONT_H
#define KF_FRONT_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

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

/* A row tensor [..., width] of `dtype` of a layer whose input has any leading dims: `ndim` < 0
 * takes the tensor's own rank (1..KF_MAX_DIMS) with free leading extents; otherwise the rank is
 * `ndim` and the leading extents must equal `lead` (ndim - 1 of them). `shape` (KF_MAX_DIMS
 * entries) receives the checked shape and *rows the product of the leading extents (at most
 * INT32_MAX: kernels index rows with 32-bit ints); an absent optional tensor gives rows = 0. */
kf_status kf__check_rows_of(const kf_context *ctx, const char *fn, const char *arg,
                            const kf_tensor *t, kf_dtype dtype, int32_t ndim, const int64_t *lead,
                            int64_t width, bool optional, int64_t *shape, bool *present,
                            int64_t *rows);
size_t kf__dtype_bytes(int32_t dtype);
/* A layer descriptor's dtype is one of the float dtypes every op implements (KF_DTYPE_F32,
 * KF_DTYPE_F64, KF_DTYPE_F16, KF_DTYPE_BF16); else KF_ERR_UNSUPPORTED naming desc->dtype. What
 * a backend cannot run is its supports()'s to refuse. */
kf_status kf__check_layer_dtype(const char *fn, int32_t dtype);

/* ---- parameter lists (params.c) ---------------------------------------------------------
 * One tensor of a layer's state, for the *_param_count / *_param_info calls: the reference's
 * state_dict key (a string literal), rank and shape. */
typedef struct kf__param {
    const char *name;
    int32_t ndim;
    int64_t shape[3];
} kf__param;

/* A layer's list (`plan` is that layer's plan type): returns how many tensors it has and, when
 * 0 <= index < that count, writes tensor `index` to *out. */
typedef int32_t (*kf__param_list)(const void *plan, int32_t index, kf__param *out);

/* The bodies of every kf_*_param_count / kf_*_param_info entry point and of the recurrent layer's
 * kf_rnn_weight_count / kf_rnn_weight_info (messages under `fn`): check the plan and the index,
 * then answer from the layer's list; outputs of _info optional. */
kf_status kf__param_count(const char *fn, const void *plan, kf__param_list list, int32_t *count);
kf_status kf__param_info(const char *fn, const void *plan, kf__param_list list, int32_t index,
                         const char **name, int32_t *ndim, int64_t *shape);

#ifdef __cplusplus
}
#endif

#endif /* KF_FRONT_H */

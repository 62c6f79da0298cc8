/* Tensor views: construction and the one validation routine every front end uses. */
#include "front.h"

#include <inttypes.h>
#include <stdio.h>

size_t kf__dtype_bytes(int32_t dtype) {
    switch (dtype) {
    case KF_DTYPE_F32: return 4;
    case KF_DTYPE_F64: return 8;
    case KF_DTYPE_F16: return 2;
    case KF_DTYPE_BF16: return 2;
    case KF_DTYPE_I32: return 4;
    case KF_DTYPE_I64: return 8;
    }
    return 0;
}

/* The enumerator's name, or NULL for a value no kf_dtype has. */
static const char *kf__dtype_name(int32_t dtype) {
    switch (dtype) {
    case KF_DTYPE_F32: return "KF_DTYPE_F32";
    case KF_DTYPE_F64: return "KF_DTYPE_F64";
    case KF_DTYPE_F16: return "KF_DTYPE_F16";
    case KF_DTYPE_BF16: return "KF_DTYPE_BF16";
    case KF_DTYPE_I32: return "KF_DTYPE_I32";
    case KF_DTYPE_I64: return "KF_DTYPE_I64";
    }
    return NULL;
}

kf_status kf__check_layer_dtype(const char *fn, int32_t dtype) {
    KF_CHECK_FN(fn, dtype == KF_DTYPE_F32 || dtype == KF_DTYPE_F64 || dtype == KF_DTYPE_F16 ||
                        dtype == KF_DTYPE_BF16,
                KF_ERR_UNSUPPORTED, "desc->dtype = %d, expected a float dtype: KF_DTYPE_F32 (1), "
                "KF_DTYPE_F64 (2), KF_DTYPE_F16 (3) or KF_DTYPE_BF16 (4)", (int)dtype);
    return KF_OK;
}

KF_API kf_status kf_tensor_init(kf_tensor *t, void *data, kf_dtype dtype, int32_t ndim,
                                const int64_t *shape) {
    kf__clear_error();
    KF_CHECK(t != NULL, KF_ERR_INVALID_ARGUMENT, "t is NULL");
    KF_CHECK(ndim >= 0 && ndim <= KF_MAX_DIMS, KF_ERR_INVALID_ARGUMENT,
             "ndim = %d, expected 0..%d", (int)ndim, KF_MAX_DIMS);
    KF_CHECK(ndim == 0 || shape != NULL, KF_ERR_INVALID_ARGUMENT, "shape is NULL with ndim = %d",
             (int)ndim);
    KF_CHECK(kf__dtype_bytes(dtype) != 0, KF_ERR_INVALID_ARGUMENT, "dtype = %d, not a kf_dtype",
             (int)dtype);
    for (int32_t i = 0; i < ndim; ++i)
        KF_CHECK(shape[i] >= 0, KF_ERR_INVALID_ARGUMENT, "shape[%d] = %" PRId64 ", expected >= 0",
                 (int)i, shape[i]);
    kf_tensor v = {0};
    v.data = data;
    v.dtype = dtype;
    v.ndim = ndim;
    int64_t stride = 1;
    for (int32_t i = ndim - 1; i >= 0; --i) {
        v.shape[i] = shape[i];
        v.strides[i] = stride;
        if (shape[i] > 0 && __builtin_mul_overflow(stride, shape[i], &stride)) stride = INT64_MAX;
    }
    *t = v;
    return KF_OK;
}

kf_status kf__check_tensor(const kf_context *ctx, const char *fn, const char *arg,
                           const kf_tensor *t, kf_dtype dtype, int32_t ndim, int64_t *shape,
                           bool optional, bool *present) {
    *present = false;
    if (t->data == NULL) {
        KF_CHECK_FN(fn, optional, KF_ERR_INVALID_ARGUMENT, "%s.data is NULL (required tensor)",
                    arg);
        return KF_OK;
    }
    if (t->dtype != (int32_t)dtype) {
        const char *got = kf__dtype_name(t->dtype);
        if (got == NULL) /* a front end's code for a type the library lacks: by number */
            return kf__error(KF_ERR_INVALID_ARGUMENT, fn,
                             "%s.dtype = %d (no kf_dtype has that value), expected %s", arg,
                             (int)t->dtype, kf__dtype_name(dtype));
        return kf__error(KF_ERR_INVALID_ARGUMENT, fn, "%s.dtype = %s, expected %s", arg, got,
                         kf__dtype_name(dtype));
    }
    KF_CHECK_FN(fn, t->ndim == ndim, KF_ERR_INVALID_ARGUMENT, "%s.ndim = %d, expected %d", arg,
                (int)t->ndim, (int)ndim);
    for (int32_t i = 0; i < ndim; ++i) {
        if (shape[i] < 0) {
            KF_CHECK_FN(fn, t->shape[i] >= 1, KF_ERR_INVALID_ARGUMENT,
                        "%s.shape[%d] = %" PRId64 ", expected >= 1", arg, (int)i, t->shape[i]);
            shape[i] = t->shape[i];
        } else {
            KF_CHECK_FN(fn, t->shape[i] == shape[i], KF_ERR_INVALID_ARGUMENT,
                        "%s.shape[%d] = %" PRId64 ", expected %" PRId64, arg, (int)i, t->shape[i],
                        shape[i]);
        }
    }
    /* Row-major contiguity; extents of 1 may carry any stride (as in torch and DLPack). */
    int64_t expect = 1;
    for (int32_t i = ndim - 1; i >= 0; --i) {
        KF_CHECK_FN(fn, t->shape[i] == 1 || t->strides[i] == expect, KF_ERR_INVALID_ARGUMENT,
                    "%s.strides[%d] = %" PRId64 ", expected %" PRId64
                    " (row-major contiguous tensors only)", arg, (int)i, t->strides[i], expect);
        if (__builtin_mul_overflow(expect, t->shape[i], &expect))
            return kf__error(KF_ERR_INVALID_ARGUMENT, fn, "%s has more elements than fit in int64",
                             arg);
    }
    size_t align = kf__dtype_bytes(dtype);
    KF_CHECK_FN(fn, ((uintptr_t)t->data % align) == 0, KF_ERR_INVALID_ARGUMENT,
                "%s.data = %p is not aligned to its %zu-byte elements", arg, t->data, align);
    char what[192];
    snprintf(what, sizeof what, "%s.data", arg);
    KF_TRY(kf__check_device_memory(ctx, fn, what, t->data));
    *present = true;
    return KF_OK;
}

kf_status kf__check_rows_of(const kf_context *ctx, const char *fn, const char *arg,
                            const kf_tensor *t, kf_dtype dtype, int32_t ndim, const int64_t *lead,
                            int64_t width, bool optional, int64_t *shape, bool *present,
                            int64_t *rows) {
    *present = false;
    if (rows) *rows = 0;
    if (t->data == NULL && optional) return KF_OK;
    if (ndim < 0) {
        KF_CHECK_FN(fn, t->ndim >= 1 && t->ndim <= KF_MAX_DIMS, KF_ERR_INVALID_ARGUMENT,
                    "%s.ndim = %d, expected 1..%d", arg, (int)t->ndim, KF_MAX_DIMS);
        ndim = t->ndim;
    }
    for (int32_t i = 0; i + 1 < ndim; ++i) shape[i] = lead ? lead[i] : -1;
    shape[ndim - 1] = width;
    KF_TRY(kf__check_tensor(ctx, fn, arg, t, dtype, ndim, shape, optional, present));
    int64_t n = 1;
    for (int32_t i = 0; i + 1 < ndim; ++i)
        KF_CHECK_FN(fn, !__builtin_mul_overflow(n, shape[i], &n) && n <= INT32_MAX,
                    KF_ERR_INVALID_ARGUMENT, "%s has more than %d rows (product of its leading "
                    "dims)", arg, INT32_MAX);
    if (rows) *rows = n;
    return KF_OK;
}

kf_status kf__check_grad_mode(const char *fn, kf_grad_mode grad_mode) {
    KF_CHECK_FN(fn, grad_mode == KF_GRAD_OVERWRITE || grad_mode == KF_GRAD_ACCUMULATE,
                KF_ERR_INVALID_ARGUMENT, "grad_mode = %d, expected KF_GRAD_OVERWRITE (1) or "
                "KF_GRAD_ACCUMULATE (2)", (int)grad_mode);
    return KF_OK;
}

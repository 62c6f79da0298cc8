/* The parameter-list queries' common tail (front.h): each layer lists its tensors, this answers
 * for one of them. */
#include "front.h"

kf_status kf__param_info(const char *fn, const kf__param *params, int32_t count, int32_t index,
                         const char **name, int32_t *ndim, int64_t *shape) {
    KF_CHECK_FN(fn, index >= 0 && index < count, KF_ERR_INVALID_ARGUMENT,
                "index = %d, expected 0..%d", (int)index, (int)count - 1);
    const kf__param *p = &params[index];
    if (name) *name = p->name;
    if (ndim) *ndim = p->ndim;
    if (shape)
        for (int32_t i = 0; i < p->ndim; ++i) shape[i] = p->shape[i];
    return KF_OK;
}

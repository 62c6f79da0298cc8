/* The parameter-list queries' common body (front.h): each layer lists its tensors, this checks
 * the arguments and answers. */
#include "front.h"

kf_status kf__param_count(const char *fn, const void *plan, kf__param_list list, int32_t *count) {
    kf__clear_error();
    KF_CHECK_FN(fn, plan != NULL, KF_ERR_INVALID_ARGUMENT, "plan is NULL");
    KF_CHECK_FN(fn, count != NULL, KF_ERR_INVALID_ARGUMENT, "count is NULL");
    *count = list(plan, -1, NULL);
    return KF_OK;
}

kf_status kf__param_info(const char *fn, const void *plan, kf__param_list list, int32_t index,
                         const char **name, int32_t *ndim, int64_t *shape) {
    kf__clear_error();
    KF_CHECK_FN(fn, plan != NULL, KF_ERR_INVALID_ARGUMENT, "plan is NULL");
    const int32_t count = list(plan, -1, NULL);
    KF_CHECK_FN(fn, index >= 0 && index < count, KF_ERR_INVALID_ARGUMENT,
                "index = %d, expected 0..%d", (int)index, (int)count - 1);
    kf__param p;
    list(plan, index, &p);
    if (name) *name = p.name;
    if (ndim) *ndim = p.ndim;
    if (shape)
        for (int32_t i = 0; i < p.ndim; ++i) shape[i] = p.shape[i];
    return KF_OK;
}

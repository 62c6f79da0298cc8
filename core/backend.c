/* The one place that knows which backends this build has. */
#include "backend.h"

const kf__backend *kf__backend_for(int32_t device_type) {
    switch (device_type) {
    case KF_DEVICE_CPU: return &kf__cpu_backend;
#ifdef KF_HAVE_CUDA
    case KF_DEVICE_CUDA: return &kf__cuda_backend;
#endif
    default: return NULL;
    }
}

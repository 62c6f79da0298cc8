/* The instruction set of a CPU context's recurrent and SKLinear kernels, picked once at creation
 * (cpu/cpu_backend.h): x86-64-v4 where this build has those kernels and the CPU and OS run
 * AVX-512 (F, VL, BW, DQ, CD: what -march=x86-64-v4 lets the compiler use), else the build's
 * baseline. KF_CPU_ISA=avx2 forces the baseline, so an AVX-512 machine tests both. */
#include "cpu_backend.h"

#include "blas.h"

#include <stdlib.h>
#include <string.h>

static bool cpu_runs_v4(void) {
#ifdef KF_HAVE_CPU_V4
    return kf__cpu_runs_avx512();
#else
    return false;
#endif
}

kf_status kf__cpu_isa_pick(const char *fn, int32_t *isa) {
    const char *env = getenv("KF_CPU_ISA");
    const bool v4 = cpu_runs_v4();
    if (env == NULL || env[0] == '\0') {
        *isa = v4 ? KF__CPU_ISA_V4 : KF__CPU_ISA_BASE;
        return KF_OK;
    }
    if (!strcmp(env, "avx2")) {
        *isa = KF__CPU_ISA_BASE;
        return KF_OK;
    }
    KF_CHECK_FN(fn, !strcmp(env, "avx512"), KF_ERR_INVALID_ARGUMENT,
                "environment KF_CPU_ISA = '%.40s', expected avx2, avx512 or unset", env);
#ifdef KF_HAVE_CPU_V4
    KF_CHECK_FN(fn, v4, KF_ERR_UNSUPPORTED,
                "environment KF_CPU_ISA = avx512, but this CPU does not run AVX-512 "
                "(F, VL, BW, DQ and CD)");
#else
    KF_CHECK_FN(fn, v4, KF_ERR_UNSUPPORTED,
                "environment KF_CPU_ISA = avx512, but this kfuse was built without AVX-512 "
                "kernels (CMake KF_CPU_AVX512 off, or not x86-64)");
#endif
    *isa = KF__CPU_ISA_V4;
    return KF_OK;
}

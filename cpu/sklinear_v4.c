/* The sketched linear layer's kernels for x86-64-v4 (AVX-512): cpu/sklinear.c compiled again
 * from the same source, CMake giving this file -march=x86-64-v4 and KF__SIMD_512 making
 * cpu/simd.h's vectors 64 bytes (16 floats, 8 doubles) for cpu/rowgemm.h's products and
 * cpu/lowp_simd.h's conversions; KF__SKL_V4 names its tables' accessor
 * kf__cpu_skl_ops_v4(), which the CPU's select() asks at plan creation for a context whose ISA
 * is x86-64-v4 (cpu/isa.c). Empty where the build has no such kernels. */
#ifdef KF_HAVE_CPU_V4
#define KF__SKL_V4
#define KF__SIMD_512
#include "sklinear.c"
#endif

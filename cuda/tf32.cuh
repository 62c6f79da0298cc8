// The 3xTF32 split of a float32 operand (cuda/common.cuh's kf__gemm_3xtf32, cuda/kan_dense.cu's
// materialised KAN path), for the device and, so tests/cxx/test_plain.cpp can hold it to its
// contract, the host.
//
// v = hi + lo: hi keeps the sign, the exponent and the top 10 mantissa bits of v (truncated, so
// never past FLT_MAX), lo = v - hi is exact in float32 and below 2^-10 |v|; TF32 keeps lo to
// 2^-20 |v|, so hi + lo carries v to about fp32's precision. A value that is not finite is its
// own hi with lo = 0: inf - inf would make lo a NaN (and with it every product the operand enters
// where the CPU gives an infinity), and masking a NaN's low payload bits could turn it into an
// infinity. One case stays apart from a plain fp32 product: an infinite element times a partner
// whose lo is exactly 0 (a value with at most 11 significant bits) adds inf * 0 = NaN in the
// hi x lo term, where the plain product gives +-inf.
#ifndef KF_CUDA_TF32_CUH
#define KF_CUDA_TF32_CUH

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define KF__TF32_HD __host__ __device__ __forceinline__
#else
#define KF__TF32_HD inline
#endif

KF__TF32_HD float kf__tf32_hi(float v) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(__float_as_uint(v) & 0xffffe000u);
#else
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    u &= 0xffffe000u;
    memcpy(&v, &u, sizeof v);
    return v;
#endif
}

// v's split into hi[i] and lo[i].
KF__TF32_HD void kf__tf32_split(float v, float *hi, float *lo, int64_t i) {
    const bool finite = isfinite(v);
    const float h = finite ? kf__tf32_hi(v) : v;
    hi[i] = h;
    lo[i] = finite ? v - h : 0.0f;
}

#undef KF__TF32_HD

#endif // KF_CUDA_TF32_CUH

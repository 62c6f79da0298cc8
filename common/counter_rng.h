/* Counter-based random numbers shared by the CPU and CUDA backends, so that both draw the same
 * dropout masks bit for bit. Stateless: the value at (seed, counter) is a pure function of them,
 * so any thread can draw any element without coordination (and a CUDA graph replays it).
 *
 * The mixer is SplitMix64's finaliser applied to seed and counter (a bijection on 64 bits with
 * full avalanche), good enough for dropout masks; it is not a cryptographic generator. */
#ifndef KF_COUNTER_RNG_H
#define KF_COUNTER_RNG_H

#include <stdbool.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define KF_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define KF_HOST_DEVICE static inline
#endif

KF_HOST_DEVICE uint64_t kf__mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1) with 24 random bits, exactly representable in float. */
KF_HOST_DEVICE float kf__uniform(uint64_t seed, uint64_t counter) {
    uint64_t z = kf__mix64(kf__mix64(seed + 0x9E3779B97F4A7C15ull) ^ counter);
    return (float)(uint32_t)(z >> 40) * (1.0f / 16777216.0f);
}

/* Dropout decision for one element: kept with probability 1 - p. */
KF_HOST_DEVICE bool kf__dropout_keep(uint64_t seed, uint64_t counter, float p) {
    return kf__uniform(seed, counter) >= p;
}

#endif /* KF_COUNTER_RNG_H */

/* The CPU backend's thread team: every kernel runs as fn(arg, tid, nth) on the context's
 * threads and splits its work by tid itself, so results never depend on the team size. */
#ifndef KF_CPU_TEAM_H
#define KF_CPU_TEAM_H

#include <stdint.h>

/* Runs fn(arg, tid, nth) on a team of `ns` threads, or directly in the caller when ns == 1:
 * libgomp allocates a fresh team for every one-thread parallel region, and a steady-state call
 * must not allocate (the barriers in `fn` are no-ops outside a parallel region). */
void kf__cpu_team(int32_t ns, void (*fn)(void *arg, int tid, int nth), void *arg);

/* [*lo, *hi): part `tid` of `nth` near-equal parts of [0, n). */
static inline void kf__cpu_share(int64_t n, int tid, int nth, int64_t *lo, int64_t *hi) {
    *lo = n * tid / nth;
    *hi = n * (tid + 1) / nth;
}

#endif /* KF_CPU_TEAM_H */

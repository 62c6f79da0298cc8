/* The CPU backend's thread team: every kernel runs as fn(arg, tid, nth) on the context's
 * threads and splits its work by tid itself, so results never depend on the team size. */
#ifndef KF_CPU_TEAM_H
#define KF_CPU_TEAM_H

#include <stdatomic.h>
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

/* A barrier for the `nth` threads of one kf__cpu_team call that spins briefly before it sleeps,
 * where `#pragma omp barrier` under OMP_WAIT_POLICY=PASSIVE (the setting a 2-core box needs so
 * that torch's and OpenBLAS's threads do not spin against each other) puts the first thread to
 * sleep at once and the last one wakes it with a system call: 30-60 us per barrier on the 2-core
 * KVM box (an empty region with two barriers: 74-140 us under PASSIVE, 5 us under ACTIVE). The
 * phases a kernel separates by a barrier are balanced, so the others arrive within the spin
 * (KF__CPU_SPIN_NS), and a thread sleeps only when they do not; it never spins longer, so it does
 * not compete with other work on the box for more than that.
 * Zero-initialise it (`= {0}`) in memory all threads of the call see, before the call; reusable
 * any number of times within the call. A team of one returns at once. */
typedef struct kf__cpu_barrier {
    atomic_uint arrived;  /* threads at the barrier of the current phase */
    atomic_uint phase;    /* completed barriers; the sleepers' futex word */
    atomic_uint sleepers; /* threads asleep (or about to be), so the last one skips the wake */
} kf__cpu_barrier;

#define KF__CPU_SPIN_NS 50000

void kf__cpu_barrier_wait(kf__cpu_barrier *b, int nth);

#endif /* KF_CPU_TEAM_H */

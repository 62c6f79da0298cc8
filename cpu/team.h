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

/* The threads a call of `madds` multiply-adds runs on, on a context of `num_threads`: the
 * caller's alone below KF__CPU_TEAM_MIN_MADDS, since waking a sleeping team (OMP_WAIT_POLICY=
 * PASSIVE) costs 25-30 us on the 2-core box, more than a second thread saves there. Measured
 * from C, alone against two threads: SKLinear in=out=256, B=64, 2r=32 (2^20 multiply-adds)
 * 0.05 against 0.07 ms; torch 2.x's GRU(8, 16) at T=4 B=2, 4.5 against 21.7 us; at 1.5M
 * multiply-adds, the forward of KANLinear(64, 64) B=40 71 against 83 us and of GRU(32, 32) T=30
 * B=8 63 against 77 us (benches/results/cpu_team_rule.md). Every CPU op decides by it, once per
 * call from the shape (a backward by its forward's count, so that both directions share one team
 * size and one workspace layout); the kernels split work by the shape alone, so the bits do not
 * depend on the answer. An op may use fewer threads than this (fewer blocks than threads). */
#define KF__CPU_TEAM_MIN_MADDS (1 << 21)

static inline int32_t kf__cpu_team_size(int32_t num_threads, double madds) {
    return madds < KF__CPU_TEAM_MIN_MADDS ? 1 : num_threads;
}

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

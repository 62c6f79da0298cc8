#define _GNU_SOURCE /* syscall() */
#include "team.h"

#include <limits.h>
#include <omp.h>
#include <time.h>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#else
#include <sched.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KF__CPU_RELAX() _mm_pause()
#else
#define KF__CPU_RELAX() ((void)0)
#endif

void kf__cpu_team(int32_t ns, void (*fn)(void *arg, int tid, int nth), void *arg) {
    if (ns <= 1) {
        fn(arg, 0, 1);
        return;
    }
#pragma omp parallel num_threads(ns)
    fn(arg, omp_get_thread_num(), omp_get_num_threads());
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Sleeps while *w == v (the kernel checks it atomically with going to sleep), or gives the CPU
 * away once where there is no futex. */
static void sleep_on(atomic_uint *w, unsigned v) {
#ifdef __linux__
    syscall(SYS_futex, (unsigned *)w, FUTEX_WAIT_PRIVATE, v, NULL, NULL, 0);
#else
    (void)w, (void)v;
    sched_yield();
#endif
}

static void wake_all(atomic_uint *w) {
#ifdef __linux__
    syscall(SYS_futex, (unsigned *)w, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#else
    (void)w;
#endif
}

/* The phase is read before arriving, so it cannot move on before this thread has read it. The
 * last to arrive resets the count, then opens the next phase (release: the others see the reset
 * and everything written before the barrier). A sleeper counts itself in `sleepers` before it
 * checks the phase, and the last thread reads `sleepers` after it moved the phase on (both
 * sequentially consistent), so either the sleeper sees the new phase or the last thread sees the
 * sleeper and wakes it. */
void kf__cpu_barrier_wait(kf__cpu_barrier *b, int nth) {
    if (nth <= 1) return;
    const unsigned ph = atomic_load_explicit(&b->phase, memory_order_acquire);
    if (atomic_fetch_add_explicit(&b->arrived, 1, memory_order_acq_rel) == (unsigned)nth - 1) {
        atomic_store_explicit(&b->arrived, 0, memory_order_relaxed);
        atomic_fetch_add(&b->phase, 1);
        if (atomic_load(&b->sleepers)) wake_all(&b->phase);
        return;
    }
    const int64_t until = now_ns() + KF__CPU_SPIN_NS;
    for (int i = 1;; i++) {
        if (atomic_load_explicit(&b->phase, memory_order_acquire) != ph) return;
        KF__CPU_RELAX();
        if (i % 64 == 0 && now_ns() > until) break;
    }
    atomic_fetch_add(&b->sleepers, 1);
    while (atomic_load(&b->phase) == ph) sleep_on(&b->phase, ph);
    atomic_fetch_sub(&b->sleepers, 1);
}

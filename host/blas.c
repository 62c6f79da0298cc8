#define _POSIX_C_SOURCE 200809L /* setenv, unsetenv */
#include "blas.h"

#include <cblas.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Every kernel calls GEMM from its own OpenMP threads, concurrently. The serial OpenBLAS of
 * Debian is built without USE_LOCKING, so concurrent calls race on its buffer pool and return
 * wrong results (checked: two threads calling sgemm at once); the threaded OpenBLAS locks that
 * pool. So kfuse links the threaded build and pins it to one thread here: each call runs entirely
 * in the calling thread and OpenBLAS never wakes its own workers against ours.
 *
 * Those workers exist all the same: OpenBLAS starts them when it loads (one per core but one),
 * and each spins in a sched_yield loop until OPENBLAS_THREAD_TIMEOUT (2^28 cycles, about 0.1 s)
 * before it sleeps. On the 2-core box that spinner took one core from kfuse's own threads for
 * the first 0.1 s of every process: perf showed it on the second CPU, and the 2-thread GRU
 * forward at T=28 H=128 B=128 (30 repetitions right after start) had a median of 4.9-5.8 ms
 * against 3.1-3.6 ms with OPENBLAS_THREAD_TIMEOUT=4, minima 2.8 both ways: the bimodal medians
 * of benches/cpu_rnn.py. Where the OpenBLAS is the shared library's own (KF_BLAS_PRIVATE: the
 * static archive hidden inside libkfuse.so), nothing else can ever hand it work, so its workers
 * are ended here, once, by OpenBLAS's own shutdown (the one its fork handler calls); a shared,
 * process-wide OpenBLAS (FindBLAS) or one that the static libkfuse shares with its program keeps
 * its workers, which that program may want. */
#ifdef KF_BLAS_PRIVATE
/* OpenBLAS's, declared in no public header (a DYNAMIC_ARCH build's, as Debian's archive is) */
int blas_thread_shutdown_(void);
char *gotoblas_corename(void);
void gotoblas_dynamic_init(void);
void gotoblas_dynamic_quit(void);

/* OpenBLAS picks its kernels by the CPU's family and model, from a table of the CPUs known when it
 * was released, and takes Prescott's (SSE3) for any other: Debian 12's 0.3.21 does so on an
 * Emerald Rapids Xeon (family 6 model 207), where KANLinear's products then ran 3.5x slower
 * than on its SkylakeX kernels (kf_bench_kan, 1024 x 256 -> 256: forward 21.8 against 6.1 ms).
 * So where OpenBLAS fell back to Prescott on a CPU that runs AVX-512 (F, VL, BW, DQ, CD) or AVX2
 * with FMA, its kernels are chosen again for those features (SkylakeX, Haswell), through its own
 * selection: OPENBLAS_CORETYPE set for the call of gotoblas_dynamic_init, then removed. Only this
 * private copy is re-initialised, before its first use (kf__blas_init); a program's own
 * OPENBLAS_CORETYPE is left to rule. The environment changes only on such a CPU, once per
 * process, for the duration of that call. */
static void blas_pick_core(void) {
#ifdef __x86_64__
    if (getenv("OPENBLAS_CORETYPE") != NULL || strcmp(gotoblas_corename(), "Prescott") != 0)
        return;
    __builtin_cpu_init(); /* libgcc counts AVX only where the OS saves the ymm state */
    const char *core = kf__cpu_runs_avx512() ? "SkylakeX"
                       : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? "Haswell"
                                                                                         : NULL;
    if (core == NULL || setenv("OPENBLAS_CORETYPE", core, 0) != 0) return;
    gotoblas_dynamic_quit();
    gotoblas_dynamic_init();
    unsetenv("OPENBLAS_CORETYPE");
#endif
}
#endif
static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static void blas_single_thread(void) {
    openblas_set_num_threads(1);
#ifdef KF_BLAS_PRIVATE
    blas_pick_core();
    blas_thread_shutdown_();
#endif
}

bool kf__cpu_runs_avx512(void) {
#ifdef __x86_64__
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512cd");
#else
    return false;
#endif
}

void kf__blas_init(void) { pthread_once(&blas_once, blas_single_thread); }

/* The small-product limit of OpenBLAS 0.3.21's small-matrix path (its permit functions refuse
 * products with m * n * k above it). */
#define KF__OPENBLAS_SMALL_MNK 1.0e6

/* CBLAS takes int extents: callers pass extents and leading dimensions below INT_MAX.
 *
 * No allocation per call, on every x86-64 kind. OpenBLAS's AVX-512 cores (SkylakeX, Cooperlake,
 * which it picks at run time on such CPUs, Intel and AMD Zen 4 alike) send products with
 * m * n * k <= 1e6 to "small-matrix" kernels, and the ones for a row-major product with neither
 * operand transposed (their column-major NN kernels, whose M is our n) malloc and free a buffer on
 * every call for a ragged tail of n: sgemm's when n % 16 is 1..8 and k >= 32, dgemm's when
 * n % 8 is 1..4 and k >= 16 (checked against 0.3.21's source and its archive: no other small
 * kernel calls malloc). Such a product is split: the columns up to the last multiple of W (16
 * floats, 8 doubles: one AVX-512 vector) go to OpenBLAS (that kernel then never reaches its
 * buffered tail), and the fewer than W columns left are computed here, one row of C at a time in
 * registers. The split is made on every core type, so results do not depend on which one
 * OpenBLAS picked, and scripts/test.sh runs the C tests under each core type the machine can run
 * (OPENBLAS_CORETYPE), the allocation test among them.
 *
 * One definition for both element types: T the type, X the BLAS prefix (s, d), W as above. */
#define KF__GEMM_DEFINE(T, X, W)                                                                  \
    static void X##gemm_nn_narrow(int64_t m, int64_t n, int64_t k, T alpha, const T *a,          \
                                  int64_t lda, const T *b, int64_t ldb, T beta, T *c,            \
                                  int64_t ldc) {                                                 \
        for (int64_t i = 0; i < m; i++) {                                                        \
            T acc[W] = {0};                                                                      \
            const T *ai = a + i * lda;                                                           \
            for (int64_t p = 0; p < k; p++) {                                                    \
                const T s = ai[p];                                                               \
                const T *bp = b + p * ldb;                                                       \
                for (int64_t j = 0; j < n; j++) acc[j] += s * bp[j];                             \
            }                                                                                    \
            T *ci = c + i * ldc;                                                                 \
            for (int64_t j = 0; j < n; j++)                                                      \
                ci[j] = beta == (T)0 ? alpha * acc[j] : alpha * acc[j] + beta * ci[j];           \
        }                                                                                        \
    }                                                                                            \
    void kf__##X##gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T *a,   \
                       int64_t lda, const T *b, int64_t ldb, T beta, T *c, int64_t ldc) {        \
        if (m <= 0 || n <= 0) return;                                                            \
        if (k <= 0) {                                                                            \
            /* BLAS would do this too, but some builds read A/B even when k == 0. */             \
            for (int64_t i = 0; i < m; i++)                                                      \
                for (int64_t j = 0; j < n; j++)                                                  \
                    c[i * ldc + j] = beta == (T)0 ? (T)0 : beta * c[i * ldc + j];                \
            return;                                                                              \
        }                                                                                        \
        kf__blas_init();                                                                         \
        int64_t nb = n; /* the columns OpenBLAS computes */                                      \
        if (!ta && !tb && n % (W) != 0 &&                                                        \
            (double)m * (double)n * (double)k <= KF__OPENBLAS_SMALL_MNK) {                       \
            nb = n - n % (W);                                                                    \
            X##gemm_nn_narrow(m, n - nb, k, alpha, a, lda, b + nb, ldb, beta, c + nb, ldc);      \
            if (nb == 0) return;                                                                 \
        }                                                                                        \
        cblas_##X##gemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,                           \
                        tb ? CblasTrans : CblasNoTrans, (int)m, (int)nb, (int)k, alpha, a,       \
                        (int)lda, b, (int)ldb, beta, c, (int)ldc);                               \
    }

KF__GEMM_DEFINE(float, s, 16)
KF__GEMM_DEFINE(double, d, 8)

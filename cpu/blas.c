#include "blas.h"

#include <cblas.h>
#include <pthread.h>

/* Every kernel calls GEMM from its own OpenMP threads, concurrently. The serial OpenBLAS of
 * Debian is built without USE_LOCKING, so concurrent calls race on its buffer pool and return
 * wrong results (checked: two threads calling sgemm at once); the threaded OpenBLAS locks that
 * pool. So kfuse links the threaded build and pins it to one thread here: each call runs entirely
 * in the calling thread and OpenBLAS never wakes its own workers against ours. */
static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static void blas_single_thread(void) { openblas_set_num_threads(1); }

void kf__blas_init(void) { pthread_once(&blas_once, blas_single_thread); }

/* CBLAS takes int extents: callers pass extents and leading dimensions below INT_MAX. */
void kf__sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
               int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    if (m <= 0 || n <= 0) return;
    if (k <= 0) {
        /* BLAS would do this too, but some builds read A/B even when k == 0. */
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++)
                c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
        return;
    }
    kf__blas_init();
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (int)m, (int)n, (int)k, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

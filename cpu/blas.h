/* Thin single-precision GEMM wrapper over the serial OpenBLAS (CBLAS, row-major).
 *
 * Every CPU kernel calls BLAS from inside its own OpenMP threads, one call per thread, so the
 * library links the serial OpenBLAS: a threaded BLAS would spin its own threads against ours. */
#ifndef KF_CPU_BLAS_H
#define KF_CPU_BLAS_H

#include <stdbool.h>
#include <stdint.h>

/* C[m, n] = alpha * op(A) op(B) + beta * C, all row-major with leading dimensions in elements;
 * op(A) is [m, k] (A stored [k, m] when ta), op(B) is [k, n] (B stored [n, k] when tb).
 * An empty product (m, n or k == 0) only scales C by beta (beta == 0 writes zeros). */
void kf__sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
               int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

#endif /* KF_CPU_BLAS_H */

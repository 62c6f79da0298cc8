/* The BLAS and LAPACK the host code calls (the CPU backend and the host library): the threaded
 * OpenBLAS linked statically into the library, pinned to one thread (host/blas.c), so every call
 * runs entirely in the calling thread and OpenBLAS never wakes its own workers against the
 * library's. */
#ifndef KF_HOST_BLAS_H
#define KF_HOST_BLAS_H

#include <stdbool.h>
#include <stdint.h>

/* C[m, n] = alpha * op(A) op(B) + beta * C, all row-major with leading dimensions in elements;
 * op(A) is [m, k] (A stored [k, m] when ta), op(B) is [k, n] (B stored [n, k] when tb).
 * An empty product (m, n or k == 0) only scales C by beta (beta == 0 writes zeros). */
void kf__sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
               int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
/* The same in float64. */
void kf__dgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double *a,
               int64_t lda, const double *b, int64_t ldb, double beta, double *c, int64_t ldc);

/* Whether the CPU and the OS run AVX-512 F, VL, BW, DQ and CD: what -march=x86-64-v4 lets the
 * compiler use (cpu/isa.c's recurrent kernels) and OpenBLAS's SkylakeX kernels need (host/blas.c).
 * libgcc counts AVX-512 only where the OS saves the zmm state (XCR0). False off x86-64. */
bool kf__cpu_runs_avx512(void);

/* Pins OpenBLAS to one thread, once per process. kf__sgemm and kf__dgemm call it; call it
 * before any other BLAS or LAPACK routine. */
void kf__blas_init(void);

/* LAPACK's minimum-norm least squares by SVD (Fortran symbol, column-major; see its reference
 * documentation). Call kf__blas_init() first. */
void dgelsd_(const int *m, const int *n, const int *nrhs, double *a, const int *lda, double *b,
             const int *ldb, double *s, const double *rcond, int *rank, double *work,
             const int *lwork, int *iwork, int *info);

#endif /* KF_HOST_BLAS_H */

/* AddressSanitizer check of every GEMM operand, for the sanitizer lane over the bindings
 * (scripts/test-sanitize-bindings.sh); not part of the library.
 *
 * libkfuse reads most of its tensors (x, dy, the weights) inside OpenBLAS's cblas_sgemm, which is
 * linked statically from Debian's uninstrumented archive: ASan cannot see those reads, so a
 * binding that hands the library a freed dy (a temporary's data_ptr()) goes unnoticed whenever
 * only GEMM reads it (the KAN backward, for one). The lane links libkfuse with
 * -Wl,--wrap=cblas_sgemm and this object: each call first checks, row by row, that the whole
 * extent GEMM will touch in A, B and C is addressable (__asan_region_is_poisoned), and on the
 * first poisoned byte reads it from this instrumented code, so ASan prints its usual report
 * (heap-use-after-free / heap-buffer-overflow with the allocation and free stacks) and aborts.
 * Then it calls the real cblas_sgemm. The check costs O(MK + KN + MN) per call, next to GEMM's
 * O(MNK). */
#include <cblas.h>
#include <sanitizer/asan_interface.h>
#include <stddef.h>

void __real_cblas_sgemm(const enum CBLAS_ORDER order, const enum CBLAS_TRANSPOSE ta,
                        const enum CBLAS_TRANSPOSE tb, const blasint m, const blasint n,
                        const blasint k, const float alpha, const float *a, const blasint lda,
                        const float *b, const blasint ldb, const float beta, float *c,
                        const blasint ldc);

/* The rows x cols matrix at p with leading dimension ld (row-major storage order). */
static void check_matrix(const float *p, blasint rows, blasint cols, blasint ld) {
    if (rows <= 0 || cols <= 0) return;
    for (blasint i = 0; i < rows; ++i) {
        const float *row = p + (ptrdiff_t)i * ld;
        void *bad = __asan_region_is_poisoned((void *)row, (size_t)cols * sizeof(float));
        if (bad) (void)*(volatile const char *)bad; /* ASan reports here, with the stacks */
    }
}

/* Stored extents of op(X) [r, c]: transposed storage swaps them; column-major swaps them too. */
static void check_op(const enum CBLAS_ORDER order, const enum CBLAS_TRANSPOSE t, const float *p,
                     blasint r, blasint c, blasint ld) {
    const int swap = (t != CblasNoTrans) != (order == CblasColMajor);
    if (swap)
        check_matrix(p, c, r, ld);
    else
        check_matrix(p, r, c, ld);
}

__attribute__((visibility("hidden"))) void
__wrap_cblas_sgemm(const enum CBLAS_ORDER order, const enum CBLAS_TRANSPOSE ta,
                   const enum CBLAS_TRANSPOSE tb, const blasint m, const blasint n,
                   const blasint k, const float alpha, const float *a, const blasint lda,
                   const float *b, const blasint ldb, const float beta, float *c,
                   const blasint ldc) {
    if (k > 0) {
        check_op(order, ta, a, m, k, lda);
        check_op(order, tb, b, k, n, ldb);
    }
    check_op(order, CblasNoTrans, c, m, n, ldc);
    __real_cblas_sgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

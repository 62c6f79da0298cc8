/* Host algorithm of the KAN grid update (efficient-kan's update_grid; kfuse.h, docs/ops/kan.md),
 * shared by every backend: not a hot path, one feature at a time, single-threaded.
 *
 * Per feature i, with its M = N samples (x's column i, or feature i of every KANConv2d patch,
 * padding as 0.0):
 *   1. the new knots, formed in the plan's dtype (float32 or float64; a bfloat16 or float16
 *      plan forms them in float32 and rounds each knot to its type) exactly as kfuse.torch's
 *      (and efficient-kan's) update_grid forms them with torch on the CPU: the samples sorted,
 *      the quantiles
 *      x_sorted[torch.linspace(0, M - 1, G + 1, dtype=int64)] (kan_linspace_idx reproduces
 *      torch 1.13's or torch 2.x's integer linspace, rounding quirks included, as quantile_rule
 *      asks), the uniform step and the blend with grid_eps, each operation rounded to that
 *      dtype in torch's order (margin and grid_eps are the float32 values the ABI carries);
 *   2. the refit, in float64: the targets U [M, out] = B_old W_old^T (the old splines at the
 *      samples, W_old = spline_weight[:, i, :]) and the bases B_new [M, C] on the new knots, and
 *      X [C, out] = the minimum-norm least-squares solution of B_new X = U by LAPACK's dgelsd
 *      (SVD; rcond = DBL_EPSILON * max(M, C), torch.linalg.lstsq's default), which handles
 *      rank-deficient systems (fewer samples than coefficients, bases no sample touches).
 * The bases are the library's one evaluator (common/bspline.h) in float64 (the fit's
 * precision), over all M samples of a feature at once. Samples, knots and coefficients are
 * read into float64 whatever the dtype (exactly) and the results rounded back to it at the end;
 * only the knots' arithmetic is typed (kan_new_knots_s, kan_new_knots_d). */
#include "bspline.h"
#include "host.h"
#include "lowp.h"

#include "blas.h"

#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* torch.linspace(0, M - 1, n, dtype=torch.int64) as the CPU kernel of the torch that
 * `rule` names computes it. Both take step = (M - 1) / (n - 1) in double, element idx
 * trunc(step * idx) below halfway = n / 2 and trunc((M - 1) - step * (n - 1 - idx)) from there
 * on, clamped to 0..M-1.
 * - KF_KAN_QUANTILES_TORCH2 (torch >= 2.0): that formula for every element.
 * - KF_KAN_QUANTILES_TORCH1 (checked against torch 1.13 for M = 1..299 and larger, n = 2..40
 *   and up to 201, AVX2 and default kernels): the first floor(n / 8) * 8 elements go through
 *   the vectorised path, 4 int64 lanes at a time, where a vector starting at idx takes base =
 *   the formula at idx (the half chosen by idx alone) and lane l holds trunc(base + l * step).
 *   (With AVX-512 kernels torch uses 8 lanes and blocks of 16, which gives other indices for
 *   n >= 9; and above 32768 elements torch splits the range across threads. Neither is
 *   reproduced.) */
static int64_t kan_linspace_at(int64_t end, int64_t n, double step, int64_t idx) {
    return idx < n / 2 ? (int64_t)(0.0 + step * (double)idx)
                       : (int64_t)((double)end - step * (double)(n - idx - 1));
}

static void kan_linspace_idx(int64_t M, int64_t n, int32_t rule, int64_t *a) {
    const int64_t end = M - 1;
    const double step = ((double)end - 0.0) / (double)(n - 1);
    int64_t idx = 0;
    if (rule == KF_KAN_QUANTILES_TORCH1)
        for (; idx + 8 <= n; idx += 8) /* blocks of two vectors */
            for (int64_t v = idx; v < idx + 8; v += 4) {
                const int64_t base = kan_linspace_at(end, n, step, v);
                for (int64_t l = 0; l < 4; ++l)
                    a[v + l] = (int64_t)((double)base + (double)l * step);
            }
    for (; idx < n; ++idx) a[idx] = kan_linspace_at(end, n, step, idx);
    for (int64_t j = 0; j < n; ++j) a[j] = a[j] < 0 ? 0 : a[j] > end ? end : a[j];
}

static int kan_cmp_double(const void *a, const void *b) {
    const double u = *(const double *)a, v = *(const double *)b;
    return (u > v) - (u < v);
}

/* The new knots t [nk] of one feature from its M sorted samples s (values of type T), in type T
 * as torch forms them (kfuse.torch's update_grid): every line one rounded torch operation. */
#define KF__KAN_KNOTS_DEFINE(T, X)                                                                \
    static void kan_new_knots_##X(const struct kf_kan_linear_plan *p, const double *s,           \
                                  int64_t M, const int64_t *a, float margin, float grid_eps,     \
                                  T *t) {                                                        \
        const int64_t G = p->G, k = p->k;                                                        \
        const T mg = margin, eps = grid_eps, s0 = (T)s[0];                                       \
        const T two_margin = (T)(2.0 * (double)margin);                                          \
        const T one_minus_eps = (T)(1.0 - (double)grid_eps);                                     \
        const T range = (T)s[M - 1] - s0;                                                        \
        const T h = (range + two_margin) / (T)G; /* uniform_step */                              \
        for (int64_t j = 0; j <= G; ++j) {                                                       \
            const T jh = (T)j * h;                                                               \
            const T u = (jh + s0) - mg;                  /* grid_uniform */                      \
            const T e = eps * u;                                                                 \
            const T q = one_minus_eps * (T)s[a[j]];      /* (1 - grid_eps) * grid_adaptive */    \
            t[k + j] = e + q;                                                                    \
        }                                                                                        \
        for (int64_t m = 1; m <= k; ++m) {                                                       \
            t[k - m] = t[k] - h * (T)m;                                                          \
            t[k + G + m] = t[k + G] + h * (T)m;                                                  \
        }                                                                                        \
    }

KF__KAN_KNOTS_DEFINE(float, s)
KF__KAN_KNOTS_DEFINE(double, d)

kf_status kf__kan_update_grid_host(const char *fn, const struct kf_kan_linear_plan *p, int64_t N,
                                   const kf__kan_patches *patches, const void *x,
                                   const void *grid, const void *spline, float margin,
                                   float grid_eps, int32_t quantile_rule, void *new_grid,
                                   void *new_spline) {
    const int64_t in = p->in, out = p->out, C = p->C, nk = p->nk, k = p->k, M = N;
    const kf_dtype dt = p->dtype;
    const int64_t ldb = M > C ? M : C, mn = M < C ? M : C;
    const int64_t HoWo = patches ? patches->Ho * patches->Wo : 0;
    const int64_t img = patches ? patches->Cin * patches->H * patches->W : 0;
    /* Sizes in elements; each buffer fits size_t (checked) and LAPACK's int (M, C, out and
     * ldb * out are within INT32_MAX by the plan's and rows' limits; the products below are
     * checked). */
    size_t nA, nU, nS, bytes = 0;
    bool ok = kf__mul_size((size_t)M, (size_t)C, &nA) &&
              kf__mul_size((size_t)ldb, (size_t)out, &nU) &&
              kf__mul_size((size_t)M, (size_t)(nk - 1), &nS);
    KF_CHECK_FN(fn, ok, KF_ERR_OUT_OF_MEMORY, "the fit of %" PRId64 " samples is too large", M);
    double *s = malloc((size_t)M * sizeof *s);     /* samples, sorted */
    int64_t *aidx = malloc((size_t)(p->G + 1) * sizeof *aidx);
    int64_t *off = patches ? malloc((size_t)HoWo * sizeof *off) : NULL;
    double *t_old = malloc((size_t)nk * sizeof *t_old), *t_new = malloc((size_t)nk * sizeof *t_new);
    float *tf = malloc((size_t)nk * sizeof *tf); /* float32 knots before rounding */
    /* The bases of every sample, basis-major: Bo [C, M] on the old knots and A [C, M] on the
     * new ones (that is A [M, C] column-major, as dgelsd takes it); S [nk - 1, M], xs [M] and
     * inv [k, nk] are the evaluator's scratch. */
    double *S = malloc(nS * sizeof *S), *xs = malloc((size_t)M * sizeof *xs);
    double *inv = malloc((size_t)(k > 0 ? k * nk : 1) * sizeof *inv);
    double *xd = malloc((size_t)M * sizeof *xd);   /* samples in row order */
    double *Bo = malloc(nA * sizeof *Bo);
    double *A = malloc(nA * sizeof *A), *U = malloc(nU * sizeof *U);
    double *sv = malloc((size_t)mn * sizeof *sv);
    double *work = NULL;
    int *iwork = NULL;
    kf_status st = KF_OK;
    if (!s || !aidx || (patches && !off) || !t_old || !t_new || !tf || !S || !xs || !inv || !xd ||
        !Bo || !A || !U || !sv) {
        st = kf__error(KF_ERR_OUT_OF_MEMORY, fn, "cannot allocate the host buffers of the fit of "
                       "%" PRId64 " samples", M);
        goto done;
    }
    const int im = (int)M, ic = (int)C, iout = (int)out, ildb = (int)ldb;
    const double rcond = DBL_EPSILON * (double)(M > C ? M : C);
    kf__blas_init();
    int rank = 0, info = 0, lwork = -1, iwq = 0;
    double wq = 0.0;
    dgelsd_(&im, &ic, &iout, A, &im, U, &ildb, sv, &rcond, &rank, &wq, &lwork, &iwq, &info);
    if (info != 0) {
        st = kf__error(KF_ERR_INTERNAL, fn, "LAPACK dgelsd workspace query failed (info = %d)",
                       info);
        goto done;
    }
    lwork = (int)wq;
    const int liwork = iwq > 1 ? iwq : 1;
    if (!kf__mul_size((size_t)lwork, sizeof(double), &bytes) ||
        (work = malloc(bytes)) == NULL || (iwork = malloc((size_t)liwork * sizeof(int))) == NULL) {
        st = kf__error(KF_ERR_OUT_OF_MEMORY, fn, "cannot allocate %d doubles of LAPACK workspace",
                       lwork);
        goto done;
    }
    kan_linspace_idx(M, p->G + 1, quantile_rule, aidx);
    for (int64_t i = 0; i < in; ++i) {
        /* the samples of feature i, in row order */
        if (!patches) {
            for (int64_t m = 0; m < M; ++m) xd[m] = kf__elem_load(x, dt, m * in + i);
        } else {
            const int64_t kk = (int64_t)patches->kh * patches->kw;
            kf__kan_patch_offsets(patches, i % kk, 0, HoWo, off);
            for (int64_t b = 0; b < patches->B; ++b) {
                const int64_t xi = b * img + i / kk * patches->H * patches->W;
                double *d = xd + b * HoWo;
                for (int64_t r = 0; r < HoWo; ++r)
                    d[r] = off[r] >= 0 ? kf__elem_load(x, dt, xi + off[r]) : 0.0;
            }
        }
        memcpy(s, xd, (size_t)M * sizeof *s);
        qsort(s, (size_t)M, sizeof *s, kan_cmp_double);
        if (dt == KF_DTYPE_F64) {
            kan_new_knots_d(p, s, M, aidx, margin, grid_eps, (double *)new_grid + i * nk);
        } else { /* float32, or float32 rounded to the storage type */
            kan_new_knots_s(p, s, M, aidx, margin, grid_eps, tf);
            for (int64_t j = 0; j < nk; ++j) kf__elem_store(new_grid, dt, i * nk + j, tf[j]);
        }
        for (int64_t j = 0; j < nk; ++j) {
            t_new[j] = kf__elem_load(new_grid, dt, i * nk + j);
            t_old[j] = kf__elem_load(grid, dt, i * nk + j);
            if (!isfinite(t_new[j])) {
                st = kf__error(KF_ERR_INVALID_ARGUMENT, fn,
                               "args->x: the samples of feature %" PRId64 " span [%g, %g], too "
                               "wide a range for finite knots (new knot %" PRId64 " = %g)", i,
                               s[0], s[M - 1], j, t_new[j]);
                goto done;
            }
        }
        /* targets U [M, out] (column-major, ldb; rows M .. ldb - 1 zero) and the new bases
         * A [M, C] (column-major) */
        if (ldb > M)
            for (int64_t o = 0; o < out; ++o)
                memset(U + o * ldb + M, 0, (size_t)(ldb - M) * sizeof *U);
        kf__bspline_inv_d(t_old, nk, k, inv);
        kf__bspline_rows_d(t_old, inv, nk, k, xd, M, xs, S, Bo);
        kf__bspline_inv_d(t_new, nk, k, inv);
        kf__bspline_rows_d(t_new, inv, nk, k, xd, M, xs, S, A);
        for (int64_t o = 0; o < out; ++o) {
            const int64_t w = (o * in + i) * C;
            for (int64_t m = 0; m < M; ++m) {
                double acc = 0.0;
                for (int64_t c = 0; c < C; ++c) acc += Bo[c * M + m] * kf__elem_load(spline, dt, w + c);
                U[m + o * ldb] = acc;
            }
        }
        dgelsd_(&im, &ic, &iout, A, &im, U, &ildb, sv, &rcond, &rank, work, &lwork, iwork, &info);
        if (info != 0) {
            st = kf__error(KF_ERR_INTERNAL, fn, "LAPACK dgelsd failed for feature %" PRId64
                           " (info = %d: the SVD did not converge)", i, info);
            goto done;
        }
        /* rounded to the dtype, a coefficient must stay finite: an update must not leave a
         * spline_weight the next update refuses (a float16 fit on ill-conditioned new knots
         * can pass 65504) */
        for (int64_t o = 0; o < out; ++o)
            for (int64_t c = 0; c < C; ++c) {
                const int64_t e = (o * in + i) * C + c;
                kf__elem_store(new_spline, dt, e, U[c + o * ldb]);
                if (!isfinite(kf__elem_load(new_spline, dt, e))) {
                    st = kf__error(KF_ERR_INVALID_ARGUMENT, fn,
                                   "args->spline_weight: the refit on the new knots of feature "
                                   "%" PRId64 " gives coefficient [%" PRId64 "][%" PRId64
                                   "][%" PRId64 "] = %g, beyond the range of the plan's "
                                   "dtype (kf_dtype %d)", i, o, i, c, U[c + o * ldb], (int)dt);
                    goto done;
                }
            }
    }
done:
    free(s), free(aidx), free(off), free(t_old), free(t_new), free(tf), free(S), free(xs);
    free(inv), free(xd), free(Bo);
    free(A), free(U), free(sv), free(work), free(iwork);
    return st;
}

/* kf_kan_linear_forward and kf_kan_linear_backward at a derivative order m and with an input
 * weight w (since 1.9; cpu/kan_deriv.c), through the public header only, against a float64
 * reference written here and independent of the library's formulation:
 *  - B_c^(m)(x): every basis of the knot span holding x as a polynomial in x (the Cox-de Boor
 *    recurrence on polynomial coefficients), differentiated m times as a polynomial;
 *  - SiLU^(m)(x) = x s^(m) + m s^(m-1) with the sigmoid's derivatives by the Stirling-number
 *    formula s^(n) = sum_{j=1}^{n+1} (-1)^(j-1) (j-1)! S(n+1, j) s^j (the library forms them by
 *    its own recurrence, common/silu_deriv.h).
 * Checked: y = sum_i w phi^(m), and the backward's dx = w sum_o dy phi^(m+1), dinput_weight =
 * sum_o dy phi^(m), d base_weight, d spline_weight, d spline_scaler (through S = spline_weight *
 * spline_scaler), overwritten and accumulated, for every m from 0 to k + 1 (dx to k), float64
 * (1e-10 relative) and float32 (2e-4), with and without w, on 1 and 2 threads, random
 * non-uniform knots with a repeated one, N = 300 rows (three row blocks of cpu/kan_deriv.c: the
 * parameter gradients' partials summed over slabs); a 1.1-1.8 caller's shorter structs (the
 * m = 0 results, bit for bit); an order out of bounds and a low-precision plan refused with
 * nothing written.
 * The same checks on a CUDA context (cuda/plain_kan.cuh's order-m path; device copies of every
 * tensor), float32 and float64, where a device is: they skip without one (not yet run on a GPU). */
#include <criterion/criterion.h>

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "kf_test.h"
#include "kfuse.h"

enum { N = 300, IN = 3, OUT = 4, G = 5, K = 3, C = G + K, NK = G + 2 * K + 1 };

/* ---- the reference ---- */

/* The m-th derivative at x of every order-k basis on knots t[0..NK) into D[0..C): zero outside
 * [t_0, t_{NK-1}). Polynomials in x as coefficients P[i][d], d = 0..k. */
static void ref_bases_deriv(const double *t, double x, int m, double *D) {
    double P[NK][K + 2];
    memset(P, 0, sizeof P);
    for (int i = 0; i + 1 < NK; ++i) P[i][0] = (t[i] <= x && x < t[i + 1]) ? 1.0 : 0.0;
    for (int p = 1; p <= K; ++p)
        for (int i = 0; i + p + 1 < NK; ++i) {
            double Q[K + 2] = {0};
            const double w1 = t[i + p] - t[i], w2 = t[i + p + 1] - t[i + 1];
            for (int d = 0; d <= K; ++d) {
                if (w1 > 0) { /* (x - t_i) / w1 * P[i] */
                    Q[d + 1] += P[i][d] / w1;
                    Q[d] -= t[i] * P[i][d] / w1;
                }
                if (w2 > 0) { /* (t_{i+p+1} - x) / w2 * P[i+1] */
                    Q[d] += t[i + p + 1] * P[i + 1][d] / w2;
                    Q[d + 1] -= P[i + 1][d] / w2;
                }
            }
            memcpy(P[i], Q, sizeof Q);
        }
    for (int c = 0; c < C; ++c) {
        double v = 0;
        for (int d = K; d >= m; --d) { /* d!/(d-m)! x^(d-m) */
            double f = 1;
            for (int j = 0; j < m; ++j) f *= d - j;
            v += P[c][d] * f * pow(x, d - m);
        }
        D[c] = v;
    }
}

static double stirling2(int n, int j) {
    if (n == 0 && j == 0) return 1;
    if (n == 0 || j == 0) return 0;
    return j * stirling2(n - 1, j) + stirling2(n - 1, j - 1);
}

static double ref_sigmoid_deriv(double x, int n) {
    const double s = 1 / (1 + exp(-x));
    double v = 0, fact = 1;
    for (int j = 1; j <= n + 1; ++j) {
        v += ((j - 1) % 2 ? -1 : 1) * fact * stirling2(n + 1, j) * pow(s, j);
        fact *= j;
    }
    return v;
}

static double ref_silu_deriv(double x, int m) {
    return x * ref_sigmoid_deriv(x, m) + (m ? m * ref_sigmoid_deriv(x, m - 1) : 0);
}

/* One problem: knots, parameters, x, w, dy, all float64. */
typedef struct prob {
    double t[IN * NK], bw[OUT * IN], sw[OUT * IN * C], sc[OUT * IN], x[N * IN], w[N * IN],
        dy[N * OUT];
} prob;

static double urand(double lo, double hi) { return lo + (hi - lo) * (rand() / (double)RAND_MAX); }

static void make_prob(prob *p) {
    srand(7);
    for (int i = 0; i < IN; ++i) {
        double *t = p->t + i * NK;
        for (int j = 0; j < NK; ++j) t[j] = -1.6 + 3.2 * j / (NK - 1) + urand(-0.1, 0.1);
        t[NK / 2] = t[NK / 2 - 1]; /* a repeated knot: a zero-width span */
    }
    for (int j = 0; j < OUT * IN; ++j) p->bw[j] = urand(-1, 1), p->sc[j] = urand(0.5, 1.5);
    for (int j = 0; j < OUT * IN * C; ++j) p->sw[j] = urand(-1, 1);
    for (int j = 0; j < N * IN; ++j) p->x[j] = urand(-1.5, 1.5), p->w[j] = urand(-2, 2);
    for (int j = 0; j < N * OUT; ++j) p->dy[j] = urand(-1, 1);
}

/* phi_oi^(m)(x) of the problem. */
static double ref_phi(const prob *p, int o, int i, double x, int m) {
    double D[C];
    ref_bases_deriv(p->t + i * NK, x, m, D);
    double v = p->bw[o * IN + i] * ref_silu_deriv(x, m);
    for (int c = 0; c < C; ++c) v += p->sw[(o * IN + i) * C + c] * p->sc[o * IN + i] * D[c];
    return v;
}

/* ---- the library's calls, in float64 or float32 ---- */

typedef struct lib_call {
    kf_dtype dt;
    size_t e;
} lib_call;

static void *conv(const lib_call *L, const double *v, int64_t n) {
    void *p = xalloc((size_t)n * L->e);
    for (int64_t j = 0; j < n; ++j) {
        if (L->dt == KF_DTYPE_F64) ((double *)p)[j] = v[j];
        else ((float *)p)[j] = (float)v[j];
    }
    return p;
}

static double get(const lib_call *L, const void *p, int64_t j) {
    return L->dt == KF_DTYPE_F64 ? ((const double *)p)[j] : ((const float *)p)[j];
}

static void *nans(const lib_call *L, int64_t n) {
    void *p = xalloc((size_t)n * L->e);
    for (int64_t j = 0; j < n; ++j) {
        if (L->dt == KF_DTYPE_F64) ((double *)p)[j] = NAN;
        else ((float *)p)[j] = NAN;
    }
    return p;
}

static kf_kan_linear_plan *make_plan(kf_context *ctx, kf_dtype dt) {
    kf_kan_linear_desc d;
    kf_kan_linear_desc_init(&d);
    d.in_features = IN, d.out_features = OUT, d.grid_size = G, d.spline_order = K, d.dtype = dt;
    kf_kan_linear_plan *plan = NULL;
    KF_OK_(kf_kan_linear_plan_create(ctx, &d, &plan));
    return plan;
}

/* ||got - want|| / ||want|| <= tol over n values. */
static void expect_close(const lib_call *L, const void *got, const double *want, int64_t n,
                         double tol, const char *what, int m) {
    double num = 0, den = 0;
    for (int64_t j = 0; j < n; ++j) {
        const double d = get(L, got, j) - want[j];
        num += d * d;
        den += want[j] * want[j];
    }
    cr_expect(sqrt(num) <= tol * sqrt(den) + 1e-300, "%s at order %d: relative error %g > %g",
              what, m, sqrt(num / (den > 0 ? den : 1)), tol);
}

/* n elements of size e at host `h` where a `dev` call reads them (kf_test.h's float64 helpers
 * over whole 8-byte words: the buffers have xalloc's slack), and back. */
static void *put(kf_device_type dev, void *h, int64_t n, size_t e) {
    return place_f64(dev, h, (int64_t)(((size_t)n * e + 7) / 8));
}
static void fetch(kf_device_type dev, void *h, void *placed, int64_t n, size_t e) {
    fetch_f64(dev, h, placed, (int64_t)(((size_t)n * e + 7) / 8));
}

/* Every order's forward and backward against the reference, with or without w, on `dev`. */
static void check_orders(kf_device_type dev, kf_dtype dt, int threads, bool weighted) {
    const lib_call L = {dt, dt == KF_DTYPE_F64 ? 8 : 4};
    const double tol = dt == KF_DTYPE_F64 ? 1e-10 : 2e-4;
    static prob p;
    make_prob(&p);
    kf_context *ctx = make_ctx(dev, threads);
    kf_kan_linear_plan *plan = make_plan(ctx, dt);
    const int64_t xs[2] = {N, IN}, ys[2] = {N, OUT}, oi[2] = {OUT, IN}, oic[3] = {OUT, IN, C},
                  gs[2] = {IN, NK};
    void *x = conv(&L, p.x, N * IN), *w = conv(&L, p.w, N * IN), *t = conv(&L, p.t, IN * NK),
         *bw = conv(&L, p.bw, OUT * IN), *sw = conv(&L, p.sw, OUT * IN * C),
         *sc = conv(&L, p.sc, OUT * IN), *dy = conv(&L, p.dy, N * OUT);
    void *px = put(dev, x, N * IN, L.e), *pw = put(dev, w, N * IN, L.e),
         *pt = put(dev, t, IN * NK, L.e), *pbw = put(dev, bw, OUT * IN, L.e),
         *psw = put(dev, sw, OUT * IN * C, L.e), *psc = put(dev, sc, OUT * IN, L.e),
         *pdy = put(dev, dy, N * OUT, L.e);
    double *want_y = malloc(sizeof(double) * N * OUT), *want_dx = malloc(sizeof(double) * N * IN),
           *want_dw = malloc(sizeof(double) * N * IN), *want_dbw = calloc(OUT * IN, 8),
           *want_dsw = calloc(OUT * IN * C, 8), *want_dsc = calloc(OUT * IN, 8);
    for (int m = 0; m <= K + 1; ++m) {
        memset(want_dbw, 0, 8 * OUT * IN);
        memset(want_dsw, 0, 8 * OUT * IN * C);
        memset(want_dsc, 0, 8 * OUT * IN);
        for (int n = 0; n < N; ++n) {
            for (int o = 0; o < OUT; ++o) {
                double v = 0;
                for (int i = 0; i < IN; ++i)
                    v += (weighted ? p.w[n * IN + i] : 1) * ref_phi(&p, o, i, p.x[n * IN + i], m);
                want_y[n * OUT + o] = v;
            }
            for (int i = 0; i < IN; ++i) {
                const double xv = p.x[n * IN + i], wv = weighted ? p.w[n * IN + i] : 1;
                double g0 = 0, g1 = 0, D[C];
                ref_bases_deriv(p.t + i * NK, xv, m, D);
                for (int o = 0; o < OUT; ++o) {
                    const double g = p.dy[n * OUT + o];
                    g0 += g * ref_phi(&p, o, i, xv, m);
                    if (m <= K) g1 += g * ref_phi(&p, o, i, xv, m + 1);
                    want_dbw[o * IN + i] += g * wv * ref_silu_deriv(xv, m);
                    for (int c = 0; c < C; ++c) {
                        const double dS = g * wv * D[c];
                        want_dsw[(o * IN + i) * C + c] += dS * p.sc[o * IN + i];
                        want_dsc[o * IN + i] += dS * p.sw[(o * IN + i) * C + c];
                    }
                }
                want_dw[n * IN + i] = g0;
                want_dx[n * IN + i] = wv * g1;
            }
        }
        kf_kan_linear_forward_args fa;
        kf_kan_linear_forward_args_init(&fa);
        fa.x = tens(px, dt, 2, xs), fa.grid = tens(pt, dt, 2, gs);
        fa.base_weight = tens(pbw, dt, 2, oi), fa.spline_weight = tens(psw, dt, 3, oic);
        fa.spline_scaler = tens(psc, dt, 2, oi);
        void *y = nans(&L, N * OUT), *py = put(dev, y, N * OUT, L.e);
        fa.y = tens(py, dt, 2, ys);
        if (weighted) fa.input_weight = tens(pw, dt, 2, xs);
        fa.derivative_order = m;
        KF_OK_(kf_kan_linear_forward(plan, &fa, NULL, 0));
        fetch(dev, y, py, N * OUT, L.e);
        unplace(dev, py);
        expect_close(&L, y, want_y, N * OUT, tol, "y", m);
        for (int accumulate = 0; accumulate <= 1; ++accumulate) {
            kf_kan_linear_backward_args ba;
            kf_kan_linear_backward_args_init(&ba);
            ba.x = fa.x, ba.grid = fa.grid, ba.base_weight = fa.base_weight;
            ba.spline_weight = fa.spline_weight, ba.spline_scaler = fa.spline_scaler;
            ba.dy = tens(pdy, dt, 2, ys);
            void *dx = nans(&L, N * IN), *dw = nans(&L, N * IN);
            void *dbw = accumulate ? conv(&L, p.bw, OUT * IN) : nans(&L, OUT * IN),
                 *dsw = accumulate ? conv(&L, p.sw, OUT * IN * C) : nans(&L, OUT * IN * C),
                 *dsc = accumulate ? conv(&L, p.sc, OUT * IN) : nans(&L, OUT * IN);
            void *outs[5] = {dx, dw, dbw, dsw, dsc}, *placed[5];
            const int64_t sizes[5] = {N * IN, N * IN, OUT * IN, OUT * IN * C, OUT * IN};
            for (int j = 0; j < 5; ++j) placed[j] = put(dev, outs[j], sizes[j], L.e);
            if (m <= K) ba.dx = tens(placed[0], dt, 2, xs);
            ba.dinput_weight = tens(placed[1], dt, 2, xs);
            ba.dbase_weight = tens(placed[2], dt, 2, oi);
            ba.dspline_weight = tens(placed[3], dt, 3, oic);
            ba.dspline_scaler = tens(placed[4], dt, 2, oi);
            if (weighted) ba.input_weight = fa.input_weight;
            ba.derivative_order = m;
            KF_OK_(kf_kan_linear_backward(plan, accumulate ? KF_GRAD_ACCUMULATE
                                                           : KF_GRAD_OVERWRITE, &ba, NULL, 0));
            for (int j = 0; j < 5; ++j) {
                fetch(dev, outs[j], placed[j], sizes[j], L.e);
                unplace(dev, placed[j]);
            }
            if (m <= K) expect_close(&L, dx, want_dx, N * IN, tol, "dx", m);
            expect_close(&L, dw, want_dw, N * IN, tol, "dinput_weight", m);
            double *acc_bw = malloc(8 * OUT * IN), *acc_sw = malloc(8 * OUT * IN * C),
                   *acc_sc = malloc(8 * OUT * IN);
            for (int j = 0; j < OUT * IN; ++j) {
                acc_bw[j] = want_dbw[j] + (accumulate ? p.bw[j] : 0);
                acc_sc[j] = want_dsc[j] + (accumulate ? p.sc[j] : 0);
            }
            for (int j = 0; j < OUT * IN * C; ++j) acc_sw[j] = want_dsw[j] + (accumulate ? p.sw[j] : 0);
            expect_close(&L, dbw, acc_bw, OUT * IN, tol, "dbase_weight", m);
            expect_close(&L, dsw, acc_sw, OUT * IN * C, tol, "dspline_weight", m);
            expect_close(&L, dsc, acc_sc, OUT * IN, tol, "dspline_scaler", m);
            free(acc_bw), free(acc_sw), free(acc_sc);
            free(dx), free(dw), free(dbw), free(dsw), free(dsc);
        }
        free(y);
    }
    free(want_y), free(want_dx), free(want_dw), free(want_dbw), free(want_dsw), free(want_dsc);
    void *placed[7] = {px, pw, pt, pbw, psw, psc, pdy};
    for (int j = 0; j < 7; ++j) unplace(dev, placed[j]);
    free(x), free(w), free(t), free(bw), free(sw), free(sc), free(dy);
    kf_kan_linear_plan_destroy(plan);
    kf_context_destroy(ctx);
}

Test(kan_deriv, f64_weighted_1_thread) { check_orders(KF_DEVICE_CPU, KF_DTYPE_F64, 1, true); }
Test(kan_deriv, f64_unweighted_2_threads) { check_orders(KF_DEVICE_CPU, KF_DTYPE_F64, 2, false); }
Test(kan_deriv, f32_weighted_2_threads) { check_orders(KF_DEVICE_CPU, KF_DTYPE_F32, 2, true); }
/* CUDA (cuda/plain_kan.cuh's order-m path, float32 and float64): the same checks where a device
 * is (skipped here otherwise). */
Test(kan_deriv, cuda_f64_weighted) { check_orders(KF_DEVICE_CUDA, KF_DTYPE_F64, 0, true); }
Test(kan_deriv, cuda_f32_weighted) { check_orders(KF_DEVICE_CUDA, KF_DTYPE_F32, 0, true); }
Test(kan_deriv, cuda_f32_unweighted) { check_orders(KF_DEVICE_CUDA, KF_DTYPE_F32, 0, false); }

/* A 1.1-1.8 caller's args (struct_size before input_weight) give the m = 0 results, bit for bit;
 * an order out of bounds, dx at an order past k + 1, and a bfloat16 plan asked for an order are
 * refused, naming the field and the bound, with nothing written. */
Test(kan_deriv, old_structs_and_bad_orders) {
    static prob p;
    make_prob(&p);
    const lib_call L = {KF_DTYPE_F32, 4};
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    kf_kan_linear_plan *plan = make_plan(ctx, KF_DTYPE_F32);
    const int64_t xs[2] = {N, IN}, ys[2] = {N, OUT}, oi[2] = {OUT, IN}, oic[3] = {OUT, IN, C},
                  gs[2] = {IN, NK};
    float *x = conv(&L, p.x, N * IN), *t = conv(&L, p.t, IN * NK), *bw = conv(&L, p.bw, OUT * IN),
          *sw = conv(&L, p.sw, OUT * IN * C), *sc = conv(&L, p.sc, OUT * IN),
          *dy = conv(&L, p.dy, N * OUT);
    float *y0 = nans(&L, N * OUT), *y1 = nans(&L, N * OUT), *dx0 = nans(&L, N * IN),
          *dx1 = nans(&L, N * IN);
    kf_kan_linear_forward_args fa;
    kf_kan_linear_forward_args_init(&fa);
    fa.x = tens(x, KF_DTYPE_F32, 2, xs), fa.grid = tens(t, KF_DTYPE_F32, 2, gs);
    fa.base_weight = tens(bw, KF_DTYPE_F32, 2, oi), fa.spline_weight = tens(sw, KF_DTYPE_F32, 3, oic);
    fa.spline_scaler = tens(sc, KF_DTYPE_F32, 2, oi), fa.y = tens(y0, KF_DTYPE_F32, 2, ys);
    KF_OK_(kf_kan_linear_forward(plan, &fa, NULL, 0));
    fa.struct_size = offsetof(kf_kan_linear_forward_args, input_weight);
    fa.y = tens(y1, KF_DTYPE_F32, 2, ys);
    fa.derivative_order = 2; /* beyond an old caller's struct: not read */
    KF_OK_(kf_kan_linear_forward(plan, &fa, NULL, 0));
    cr_expect(memcmp(y0, y1, sizeof(float) * N * OUT) == 0, "old forward args differ");
    kf_kan_linear_backward_args ba;
    kf_kan_linear_backward_args_init(&ba);
    ba.x = fa.x, ba.grid = fa.grid, ba.base_weight = fa.base_weight;
    ba.spline_weight = fa.spline_weight, ba.spline_scaler = fa.spline_scaler;
    ba.dy = tens(dy, KF_DTYPE_F32, 2, ys), ba.dx = tens(dx0, KF_DTYPE_F32, 2, xs);
    KF_OK_(kf_kan_linear_backward(plan, KF_GRAD_OVERWRITE, &ba, NULL, 0));
    ba.struct_size = offsetof(kf_kan_linear_backward_args, input_weight);
    ba.dx = tens(dx1, KF_DTYPE_F32, 2, xs);
    ba.derivative_order = 5;
    KF_OK_(kf_kan_linear_backward(plan, KF_GRAD_OVERWRITE, &ba, NULL, 0));
    cr_expect(memcmp(dx0, dx1, sizeof(float) * N * IN) == 0, "old backward args differ");

    float *out = nans(&L, N * OUT), *dxo = nans(&L, N * IN);
    fa.struct_size = sizeof fa, fa.y = tens(out, KF_DTYPE_F32, 2, ys);
    fa.derivative_order = -1;
    EXPECT_FAIL(kf_kan_linear_forward(plan, &fa, NULL, 0), KF_ERR_INVALID_ARGUMENT,
                "args->derivative_order = -1, expected 0..4");
    fa.derivative_order = K + 2;
    EXPECT_FAIL(kf_kan_linear_forward(plan, &fa, NULL, 0), KF_ERR_INVALID_ARGUMENT,
                "args->derivative_order = 5, expected 0..4 (spline_order 3");
    ba.struct_size = sizeof ba, ba.dx = tens(dxo, KF_DTYPE_F32, 2, xs);
    ba.derivative_order = K + 1;
    EXPECT_FAIL(kf_kan_linear_backward(plan, KF_GRAD_OVERWRITE, &ba, NULL, 0),
                KF_ERR_INVALID_ARGUMENT, "dx takes derivative order 5, expected <= 4");
    const int64_t bad[2] = {N, IN + 1};
    ba.derivative_order = 1, ba.input_weight = tens(x, KF_DTYPE_F32, 2, bad);
    EXPECT_FAIL(kf_kan_linear_backward(plan, KF_GRAD_OVERWRITE, &ba, NULL, 0),
                KF_ERR_INVALID_ARGUMENT, "args->input_weight");
    for (int64_t j = 0; j < N * OUT; ++j) cr_expect(isnan(out[j]), "y written on a refusal");
    for (int64_t j = 0; j < N * IN; ++j) cr_expect(isnan(dxo[j]), "dx written on a refusal");

    kf_kan_linear_desc d;
    kf_kan_linear_desc_init(&d);
    d.in_features = IN, d.out_features = OUT, d.dtype = KF_DTYPE_BF16;
    kf_kan_linear_plan *low = NULL;
    KF_OK_(kf_kan_linear_plan_create(ctx, &d, &low));
    uint16_t lx[N * IN] = {0}, lt[IN * NK] = {0}, lsw[OUT * IN * C] = {0}, lsc[OUT * IN] = {0},
             ly[N * OUT];
    kf_kan_linear_forward_args la;
    kf_kan_linear_forward_args_init(&la);
    la.x = tens(lx, KF_DTYPE_BF16, 2, xs), la.grid = tens(lt, KF_DTYPE_BF16, 2, gs);
    la.spline_weight = tens(lsw, KF_DTYPE_BF16, 3, oic), la.spline_scaler = tens(lsc, KF_DTYPE_BF16, 2, oi);
    la.y = tens(ly, KF_DTYPE_BF16, 2, ys), la.derivative_order = 1;
    EXPECT_FAIL(kf_kan_linear_forward(low, &la, NULL, 0), KF_ERR_UNSUPPORTED,
                "expected KF_DTYPE_F32 or KF_DTYPE_F64");
    kf_kan_linear_plan_destroy(low);
    free(x), free(t), free(bw), free(sw), free(sc), free(dy), free(y0), free(y1), free(dx0),
        free(dx1), free(out), free(dxo);
    kf_kan_linear_plan_destroy(plan);
    kf_context_destroy(ctx);
}

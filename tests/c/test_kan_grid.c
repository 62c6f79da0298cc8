/* kf_kan_linear_update_grid / kf_kan_conv2d_update_grid (efficient-kan's update_grid, kfuse.h):
 * the new knots against the formula written out here (with torch's integer linspace, pinned by
 * values taken from torch 1.13; and the quantile indices of each quantile_rule against literal
 * torch 1.13 and torch 2.15 outputs), the refit checked by its optimality conditions in float64
 * with ref_kan_bases (the residual orthogonal to the new bases; in rank-deficient cases the
 * solution in the row space of the bases: the minimum-norm one), the output kept where the old
 * splines are representable on the new knots, KANConv2d against KANLinear on explicitly
 * unfolded patches, and the argument errors (nothing written). */
#include <criterion/criterion.h>

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kf_test.h"
#include "kfuse.h"
#include "ref_kan.h"

/* ---- helpers ------------------------------------------------------------------------------ */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
/* Uniform in [lo, hi), deterministic. */
static float urand(float lo, float hi) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (hi - lo) * (float)((rng_state >> 40) * (1.0 / 16777216.0));
}

static kf_kan_linear_plan *lin_plan(kf_context *ctx, int64_t in, int64_t out, int32_t G,
                                    int32_t k) {
    kf_kan_linear_desc d;
    kf_kan_linear_desc_init(&d);
    d.in_features = in, d.out_features = out, d.grid_size = G, d.spline_order = k;
    kf_kan_linear_plan *p = NULL;
    KF_OK_(kf_kan_linear_plan_create(ctx, &d, &p));
    return p;
}

static void uniform_grid(kf_kan_linear_plan *p, int64_t in, int64_t nk, float *grid) {
    kf_tensor g = t3(grid, 2, in, nk, 0);
    KF_OK_(kf_kan_linear_uniform_grid(p, -1.0f, 1.0f, &g));
}

static kf_status update_lin(kf_kan_linear_plan *p, const float *x, int64_t N, int64_t in,
                            int64_t out, int64_t nk, int64_t C, float *grid, float *sw,
                            float margin, float eps) {
    kf_kan_update_grid_args a;
    kf_kan_update_grid_args_init(&a);
    a.x = t3(x, 2, N, in, 0);
    a.grid = t3(grid, 2, in, nk, 0);
    a.spline_weight = t3(sw, 3, out, in, C);
    a.margin = margin, a.grid_eps = eps;
    return kf_kan_linear_update_grid(p, &a);
}

/* torch.linspace(0, M - 1, n, dtype=torch.int64) as torch's CPU kernel gives it (AVX2/default
 * kernels): the first floor(n / 8) * 8 elements in vectors of 4 lanes, each vector's first
 * element by the scalar formula at its index and lane l = trunc(first + l * step); the rest by
 * the scalar formula: trunc(step * j) below n / 2, trunc((M - 1) - step * (n - 1 - j)) above. */
static int64_t torch_linspace_at(int64_t M, int64_t n, int64_t j) {
    const double step = (double)(M - 1) / (double)(n - 1);
#define SCALAR_AT(q) ((q) < n / 2 ? (int64_t)(step * (double)(q)) \
                                  : (int64_t)((double)(M - 1) - step * (double)(n - 1 - (q))))
    if (j < n / 8 * 8) {
        const int64_t v = j / 4 * 4;
        return (int64_t)((double)SCALAR_AT(v) + (double)(j - v) * step);
    }
    return SCALAR_AT(j);
#undef SCALAR_AT
}

static int cmp_f(const void *a, const void *b) {
    float u = *(const float *)a, v = *(const float *)b;
    return (u > v) - (u < v);
}

/* The knots kfuse.h gives for the M samples `v` of one feature (float32, torch's order). */
static void expected_knots(const float *v, int64_t M, int64_t G, int64_t k, float margin,
                           float eps, float *t) {
    float *s = malloc((size_t)M * sizeof *s);
    memcpy(s, v, (size_t)M * sizeof *s);
    qsort(s, (size_t)M, sizeof *s, cmp_f);
    const float h = ((s[M - 1] - s[0]) + 2.0f * margin) / (float)G;
    const float ome = (float)(1.0 - (double)eps);
    for (int64_t j = 0; j <= G; ++j) {
        float u = ((float)j * h + s[0]) - margin;
        t[k + j] = eps * u + ome * s[torch_linspace_at(M, G + 1, j)];
    }
    for (int64_t m = 1; m <= k; ++m) {
        t[k - m] = t[k] - h * (float)m;
        t[k + G + m] = t[k + G] + h * (float)m;
    }
    free(s);
}

/* Per feature i of a KANLinear update from (grid0, sw0) to (grid1, sw1) on x [N, in], in float64:
 * B1 [N, C] (new bases), U [N, out] (old splines) and X [C, out] (new coefficients). */
typedef struct fit {
    int64_t N, C, out;
    double *B1, *U, *X;
} fit;

static fit fit_of(const float *x, int64_t N, int64_t in, int64_t out, int64_t G, int64_t k,
                  const float *grid0, const float *sw0, const float *grid1, const float *sw1,
                  int64_t i) {
    const int64_t C = G + k, nk = G + 2 * k + 1;
    fit f = {N, C, out, calloc((size_t)(N * C), 8), calloc((size_t)(N * out), 8),
             calloc((size_t)(C * out), 8)};
    double *t0 = malloc((size_t)nk * 8), *t1 = malloc((size_t)nk * 8), *b = malloc((size_t)C * 8);
    for (int64_t j = 0; j < nk; ++j) t0[j] = grid0[i * nk + j], t1[j] = grid1[i * nk + j];
    for (int64_t n = 0; n < N; ++n) {
        ref_kan_bases(G, k, t0, x[n * in + i], b, NULL);
        for (int64_t o = 0; o < out; ++o) {
            double acc = 0;
            for (int64_t c = 0; c < C; ++c) acc += b[c] * sw0[(o * in + i) * C + c];
            f.U[n * out + o] = acc;
        }
        ref_kan_bases(G, k, t1, x[n * in + i], f.B1 + n * C, NULL);
    }
    for (int64_t c = 0; c < C; ++c)
        for (int64_t o = 0; o < out; ++o) f.X[c * out + o] = sw1[(o * in + i) * C + c];
    free(t0), free(t1), free(b);
    return f;
}

static void fit_free(fit *f) { free(f->B1), free(f->U), free(f->X); }

/* max |B1^T (B1 X - U)| relative to max |B1^T U| (per output): the normal equations, 0 for the
 * least-squares solution (up to X's rounding to float32). */
static double normal_eq_residual(const fit *f) {
    double worst = 0;
    for (int64_t o = 0; o < f->out; ++o) {
        double gmax = 0, rhs = 1e-300;
        for (int64_t c = 0; c < f->C; ++c) {
            double g = 0, bu = 0;
            for (int64_t n = 0; n < f->N; ++n) {
                double r = -f->U[n * f->out + o];
                for (int64_t d = 0; d < f->C; ++d) r += f->B1[n * f->C + d] * f->X[d * f->out + o];
                g += f->B1[n * f->C + c] * r;
                bu += f->B1[n * f->C + c] * f->U[n * f->out + o];
            }
            gmax = fmax(gmax, fabs(g)), rhs = fmax(rhs, fabs(bu));
        }
        worst = fmax(worst, gmax / rhs);
    }
    return worst;
}

/* Relative distance of every column of X from the row space of B1 (Gram-Schmidt on B1's rows):
 * 0 for the minimum-norm solution. */
static double rowspace_distance(const fit *f) {
    const int64_t N = f->N, C = f->C;
    double *Q = calloc((size_t)(N * C), 8);
    int64_t r = 0;
    for (int64_t n = 0; n < N; ++n) {
        double *q = Q + r * C;
        memcpy(q, f->B1 + n * C, (size_t)C * 8);
        for (int pass = 0; pass < 2; ++pass)
            for (int64_t m = 0; m < r; ++m) {
                double d = 0;
                for (int64_t c = 0; c < C; ++c) d += Q[m * C + c] * q[c];
                for (int64_t c = 0; c < C; ++c) q[c] -= d * Q[m * C + c];
            }
        double nn = 0;
        for (int64_t c = 0; c < C; ++c) nn += q[c] * q[c];
        if (nn > 1e-20) {
            for (int64_t c = 0; c < C; ++c) q[c] /= sqrt(nn);
            ++r;
        }
    }
    double worst = 0;
    for (int64_t o = 0; o < f->out; ++o) {
        double *p = calloc((size_t)C, 8), nx = 0, nd = 0;
        for (int64_t m = 0; m < r; ++m) {
            double d = 0;
            for (int64_t c = 0; c < C; ++c) d += Q[m * C + c] * f->X[c * f->out + o];
            for (int64_t c = 0; c < C; ++c) p[c] += d * Q[m * C + c];
        }
        for (int64_t c = 0; c < C; ++c) {
            const double xv = f->X[c * f->out + o];
            nx += xv * xv, nd += (xv - p[c]) * (xv - p[c]);
        }
        if (nx > 0) worst = fmax(worst, sqrt(nd / nx));
        free(p);
    }
    free(Q);
    return worst;
}

/* ---- the new knots ------------------------------------------------------------------------ */

Test(kan_grid, torch_linspace_indices) {
    /* torch 1.13: torch.linspace(0, M - 1, n, dtype=torch.int64).tolist() */
    static const struct { int64_t M, n, v[17]; } cases[] = {
        {13, 11, {0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 12}},
        {37, 10, {0, 4, 8, 12, 16, 20, 24, 28, 32, 36}},
        {100, 17, {0, 6, 12, 18, 24, 30, 36, 42, 49, 55, 61, 67, 74, 80, 86, 92, 99}},
        {5, 9, {0, 0, 1, 1, 2, 2, 3, 3, 4}},
        {2, 8, {0, 0, 0, 0, 0, 0, 0, 0}},
        {10, 4, {0, 3, 6, 9}},
        {11, 4, {0, 3, 6, 10}},
    };
    for (size_t q = 0; q < sizeof cases / sizeof cases[0]; ++q)
        for (int64_t j = 0; j < cases[q].n; ++j)
            cr_expect(torch_linspace_at(cases[q].M, cases[q].n, j) == cases[q].v[j],
                      "M=%ld n=%ld j=%ld", (long)cases[q].M, (long)cases[q].n, (long)j);
}

/* The quantile indices an update picks under `rule` (struct_size: the caller's, 0 = this
 * header's): with grid_eps = 0 and margin = 0 the inner knots are the samples s_{a_j}, and with
 * the samples 0..M-1 (shuffled) they are the indices a_j themselves. */
static kf_status quantile_indices(int64_t M, int32_t G, int32_t rule, size_t struct_size,
                                  int64_t *a) {
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    const int32_t k = 1;
    const int64_t C = G + k, nk = G + 2 * k + 1;
    kf_kan_linear_plan *p = lin_plan(ctx, 1, 1, G, k);
    float *x = malloc((size_t)M * 4), *grid = malloc((size_t)nk * 4), *sw = malloc((size_t)C * 4);
    for (int64_t m = 0; m < M; ++m) x[m] = (float)((m * 7) % M); /* a permutation when M % 7 */
    for (int64_t c = 0; c < C; ++c) sw[c] = urand(-1, 1);
    uniform_grid(p, 1, nk, grid);
    kf_kan_update_grid_args args;
    kf_kan_update_grid_args_init(&args);
    if (struct_size) args.struct_size = struct_size;
    args.x = t3(x, 2, M, 1, 0);
    args.grid = t3(grid, 2, 1, nk, 0);
    args.spline_weight = t3(sw, 3, 1, 1, C);
    args.margin = 0.0f, args.grid_eps = 0.0f;
    if (!struct_size) args.quantile_rule = rule;
    kf_status st = kf_kan_linear_update_grid(p, &args);
    for (int64_t j = 0; j <= G; ++j) a[j] = (int64_t)grid[k + j];
    free(x), free(grid), free(sw);
    kf_kan_linear_plan_destroy(p);
    kf_context_destroy(ctx);
    return st;
}

/* torch.linspace(0, M - 1, n, dtype=torch.int64).tolist() on torch 1.13 and on torch 2.15 */
static const struct { int64_t M, n, v1[21], v2[21]; } linspace_cases[] = {
    {33, 11, {0, 3, 6, 9, 12, 15, 18, 21, 25, 28, 32}, {0, 3, 6, 9, 12, 16, 19, 22, 25, 28, 32}},
    {13, 11, {0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 12}, {0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 12}},
    {100, 17, {0, 6, 12, 18, 24, 30, 36, 42, 49, 55, 61, 67, 74, 80, 86, 92, 99},
     {0, 6, 12, 18, 24, 30, 37, 43, 49, 55, 61, 68, 74, 80, 86, 92, 99}},
    {37, 10, {0, 4, 8, 12, 16, 20, 24, 28, 32, 36}, {0, 4, 8, 12, 16, 20, 24, 28, 32, 36}},
    {50, 8, {0, 7, 14, 21, 28, 35, 42, 49}, {0, 7, 14, 21, 28, 35, 42, 49}},
    {1000, 21,
     {0, 49, 99, 149, 199, 248, 298, 348, 399, 448, 498, 548, 599, 648, 698, 748, 799, 849, 899,
      949, 999},
     {0, 49, 99, 149, 199, 249, 299, 349, 399, 449, 499, 549, 599, 649, 699, 749, 799, 849, 899,
      949, 999}},
};

Test(kan_grid, quantile_rule_picks_each_torch_s_indices) {
    int64_t a[21];
    for (size_t q = 0; q < sizeof linspace_cases / sizeof linspace_cases[0]; ++q) {
        const int64_t M = linspace_cases[q].M;
        const int32_t G = (int32_t)linspace_cases[q].n - 1;
        for (int32_t rule = KF_KAN_QUANTILES_TORCH1; rule <= KF_KAN_QUANTILES_TORCH2; ++rule) {
            KF_OK_(quantile_indices(M, G, rule, 0, a));
            const int64_t *want = rule == KF_KAN_QUANTILES_TORCH1 ? linspace_cases[q].v1
                                                                  : linspace_cases[q].v2;
            for (int32_t j = 0; j <= G; ++j)
                cr_expect(a[j] == want[j], "rule %d M=%ld G=%d j=%d: %ld, expected %ld", rule,
                          (long)M, G, j, (long)a[j], (long)want[j]);
        }
        /* a 1.2 caller's struct ends before quantile_rule: torch 1.13's indices */
        KF_OK_(quantile_indices(M, G, 0, offsetof(kf_kan_update_grid_args, quantile_rule), a));
        for (int32_t j = 0; j <= G; ++j) cr_expect(a[j] == linspace_cases[q].v1[j]);
    }
}

Test(kan_grid, quantile_rule_and_struct_size_errors) {
    int64_t a[11];
    cr_expect(quantile_indices(33, 10, 2, 0, a) == KF_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(kf_last_error_message(), "args->quantile_rule = 2") != NULL, "%s",
              kf_last_error_message());
    cr_expect(quantile_indices(33, 10, -1, 0, a) == KF_ERR_INVALID_ARGUMENT);
    for (int32_t j = 0; j <= 10; ++j) /* nothing written: the uniform knots on [-1, 1] */
        cr_expect(fabs((double)a[j] - (double)(int64_t)(-1.0f + 0.2f * (float)j)) <= 1.0);
    cr_expect(quantile_indices(33, 10, 0, offsetof(kf_kan_update_grid_args, quantile_rule) - 4,
                               a) == KF_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(kf_last_error_message(), "args->struct_size") != NULL, "%s",
              kf_last_error_message());
}

static void check_knots_case(int64_t N, int64_t in, int64_t out, int32_t G, int32_t k,
                             float margin, float eps, int repeated) {
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    const int64_t C = G + k, nk = G + 2 * k + 1;
    kf_kan_linear_plan *p = lin_plan(ctx, in, out, G, k);
    float *x = malloc((size_t)(N * in) * 4), *grid = malloc((size_t)(in * nk) * 4),
          *sw = malloc((size_t)(out * in * C) * 4), *col = malloc((size_t)N * 4),
          *t = malloc((size_t)nk * 4);
    for (int64_t q = 0; q < N * in; ++q) {
        x[q] = urand(-2.0f, 3.0f) * (float)(1 + q % in);
        if (repeated) x[q] = roundf(x[q]);
    }
    for (int64_t q = 0; q < out * in * C; ++q) sw[q] = urand(-1, 1);
    uniform_grid(p, in, nk, grid);
    KF_OK_(update_lin(p, x, N, in, out, nk, C, grid, sw, margin, eps));
    for (int64_t i = 0; i < in; ++i) {
        for (int64_t n = 0; n < N; ++n) col[n] = x[n * in + i];
        expected_knots(col, N, G, k, margin, eps, t);
        for (int64_t j = 0; j < nk; ++j)
            cr_expect(fabsf(grid[i * nk + j] - t[j]) <= 1e-6f * (1.0f + fabsf(t[j])),
                      "N=%ld G=%d k=%d feature %ld knot %ld: %.9g, expected %.9g", (long)N, G, k,
                      (long)i, (long)j, grid[i * nk + j], t[j]);
        for (int64_t j = 0; j + 1 < nk; ++j) cr_expect(grid[i * nk + j] <= grid[i * nk + j + 1]);
    }
    free(x), free(grid), free(sw), free(col), free(t);
    kf_kan_linear_plan_destroy(p);
    kf_context_destroy(ctx);
}

Test(kan_grid, new_knots_match_formula) {
    check_knots_case(37, 3, 2, 5, 3, 0.01f, 0.02f, 0);
    check_knots_case(37, 2, 1, 9, 2, 0.05f, 0.3f, 0);   /* G + 1 = 10: vectorised indices */
    check_knots_case(13, 2, 2, 10, 1, 0.0f, 0.0f, 1);   /* repeated values, pure quantiles */
    check_knots_case(100, 2, 3, 16, 0, 0.2f, 1.0f, 0);  /* pure uniform */
    check_knots_case(1, 2, 2, 3, 2, 0.01f, 0.02f, 0);   /* one sample */
    check_knots_case(2, 1, 1, 7, 3, 0.01f, 0.5f, 0);    /* linspace(0, 1, 8) = all 0 */
}

/* ---- the refit ---------------------------------------------------------------------------- */

/* Least squares: B1^T (B1 X - U) = 0 for random old splines (not representable on the new knots),
 * and the samples' fitted values close to the targets. */
Test(kan_grid, refit_solves_normal_equations) {
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    const int64_t N = 150, in = 3, out = 4;
    const int32_t G = 6, k = 3;
    const int64_t C = G + k, nk = G + 2 * k + 1;
    kf_kan_linear_plan *p = lin_plan(ctx, in, out, G, k);
    float *x = malloc(N * in * 4), *g0 = malloc(in * nk * 4), *g1 = malloc(in * nk * 4),
          *w0 = malloc(out * in * C * 4), *w1 = malloc(out * in * C * 4);
    for (int64_t q = 0; q < N * in; ++q) x[q] = urand(-1.5f, 0.8f) + 0.3f * (float)(q % in);
    for (int64_t q = 0; q < out * in * C; ++q) w0[q] = urand(-1, 1);
    uniform_grid(p, in, nk, g0);
    memcpy(g1, g0, in * nk * 4), memcpy(w1, w0, out * in * C * 4);
    KF_OK_(update_lin(p, x, N, in, out, nk, C, g1, w1, 0.01f, 0.02f));
    for (int64_t i = 0; i < in; ++i) {
        fit f = fit_of(x, N, in, out, G, k, g0, w0, g1, w1, i);
        double r = normal_eq_residual(&f);
        cr_expect(r < 1e-5, "feature %ld: normal equations residual %g", (long)i, r);
        fit_free(&f);
    }
    free(x), free(g0), free(g1), free(w0), free(w1);
    kf_kan_linear_plan_destroy(p);
    kf_context_destroy(ctx);
}

/* Old splines that are linear functions on [-1, 1] (coefficients = the function at the Greville
 * abscissae) are exactly representable on any new knots covering the samples, so the layer's
 * output on x is unchanged up to float32 rounding. */
Test(kan_grid, output_kept_when_representable) {
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    const int64_t N = 200, in = 3, out = 2;
    const int32_t G = 5, k = 3;
    const int64_t C = G + k, nk = G + 2 * k + 1;
    kf_kan_linear_desc d;
    kf_kan_linear_desc_init(&d);
    d.in_features = in, d.out_features = out, d.grid_size = G, d.spline_order = k;
    kf_kan_linear_plan *p = NULL;
    KF_OK_(kf_kan_linear_plan_create(ctx, &d, &p));
    float *x = malloc(N * in * 4), *grid = malloc(in * nk * 4), *bw = malloc(out * in * 4),
          *sw = malloc(out * in * C * 4), *sc = malloc(out * in * 4), *y0 = malloc(N * out * 4),
          *y1 = malloc(N * out * 4);
    for (int64_t q = 0; q < N * in; ++q) x[q] = urand(-0.95f, 0.95f) * (q % in == 2 ? 0.5f : 1.0f);
    uniform_grid(p, in, nk, grid);
    for (int64_t q = 0; q < out * in; ++q) bw[q] = urand(-1, 1), sc[q] = urand(0.5f, 1.5f);
    for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i) {
            const float a = urand(-1, 1), b = urand(-1, 1);
            const float *t = grid + i * nk;
            for (int64_t c = 0; c < C; ++c) {
                double gv = 0;
                for (int64_t m = 1; m <= k; ++m) gv += t[c + m];
                sw[(o * in + i) * C + c] = (float)(a * (gv / k) + b);
            }
        }
    kf_kan_linear_forward_args fa;
    kf_kan_linear_forward_args_init(&fa);
    fa.x = t3(x, 2, N, in, 0), fa.grid = t3(grid, 2, in, nk, 0), fa.base_weight = t3(bw, 2, out, in, 0);
    fa.spline_weight = t3(sw, 3, out, in, C), fa.spline_scaler = t3(sc, 2, out, in, 0);
    fa.y = t3(y0, 2, N, out, 0);
    KF_OK_(kf_kan_linear_forward(p, &fa, NULL, 0));
    KF_OK_(update_lin(p, x, N, in, out, nk, C, grid, sw, 0.01f, 0.02f));
    cr_expect(grid[k] < -0.9f && grid[k] > -1.0f, "the new knots follow the samples: %g", grid[k]);
    fa.y = t3(y1, 2, N, out, 0);
    KF_OK_(kf_kan_linear_forward(p, &fa, NULL, 0));
    double worst = 0;
    for (int64_t q = 0; q < N * out; ++q) worst = fmax(worst, fabs((double)y1[q] - y0[q]));
    cr_expect(worst < 1e-5, "output moved by %g", worst);
    free(x), free(grid), free(bw), free(sw), free(sc), free(y0), free(y1);
    kf_kan_linear_plan_destroy(p);
    kf_context_destroy(ctx);
}

/* Fewer samples than coefficients, and samples all equal: the minimum-norm solution (in the row
 * space of the new bases), which also interpolates when the rows are independent. */
Test(kan_grid, rank_deficient_min_norm) {
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    const int64_t in = 2, out = 3;
    const int32_t G = 5, k = 3;
    const int64_t C = G + k, nk = G + 2 * k + 1;
    kf_kan_linear_plan *p = lin_plan(ctx, in, out, G, k);
    float x[10 * 2], g0[2 * 12], g1[2 * 12], w0[3 * 2 * 8], w1[3 * 2 * 8];
    for (int64_t q = 0; q < out * in * C; ++q) w0[q] = urand(-1, 1);
    uniform_grid(p, in, nk, g0);
    for (int c = 0; c < 3; ++c) {
        const int64_t N = c == 0 ? 3 : 10;
        for (int64_t q = 0; q < N * in; ++q)
            x[q] = c == 0 ? urand(-1, 1) : (q % in == 0 ? 0.3f : -0.7f);
        const float margin = c == 2 ? 0.0f : 0.01f;
        memcpy(g1, g0, sizeof g0), memcpy(w1, w0, sizeof w0);
        KF_OK_(update_lin(p, x, N, in, out, nk, C, g1, w1, margin, 0.02f));
        for (int64_t q = 0; q < out * in * C; ++q) cr_assert(isfinite(w1[q]), "case %d", c);
        for (int64_t q = 0; q < in * nk; ++q) cr_assert(isfinite(g1[q]), "case %d", c);
        for (int64_t i = 0; i < in; ++i) {
            fit f = fit_of(x, N, in, out, G, k, g0, w0, g1, w1, i);
            if (c == 2) {
                /* margin 0, one value: every knot equals one value (the value, up to the
                 * rounding of the grid_eps blend), no basis is nonzero, X = 0 */
                cr_expect(fabsf(g1[i * nk] - x[i]) <= 1e-6f, "%g vs %g", g1[i * nk], x[i]);
                for (int64_t j = 0; j < nk; ++j) cr_expect(g1[i * nk + j] == g1[i * nk]);
                for (int64_t q = 0; q < C * out; ++q) cr_expect(f.X[q] == 0.0);
            } else {
                double r = rowspace_distance(&f), e = normal_eq_residual(&f);
                cr_expect(r < 1e-5, "case %d feature %ld: distance from the row space %g", c,
                          (long)i, r);
                cr_expect(e < 1e-5, "case %d feature %ld: normal equations %g", c, (long)i, e);
                if (c == 0) { /* 3 independent rows: interpolation */
                    for (int64_t n = 0; n < N; ++n)
                        for (int64_t o = 0; o < out; ++o) {
                            double v = 0;
                            for (int64_t d = 0; d < C; ++d) v += f.B1[n * C + d] * f.X[d * out + o];
                            cr_expect(fabs(v - f.U[n * out + o]) < 1e-5, "sample %ld: %g vs %g",
                                      (long)n, v, f.U[n * out + o]);
                        }
                }
            }
            fit_free(&f);
        }
    }
    kf_kan_linear_plan_destroy(p);
    kf_context_destroy(ctx);
}

/* ---- KANConv2d ---------------------------------------------------------------------------- */

static void conv_vs_unfold(int batched) {
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    const int64_t B = batched ? 2 : 1, Cin = 2, H = 5, W = 6, Cout = 3;
    const int32_t kh = 3, kw = 2, sh = 2, sw_ = 1, ph = 1, pw = 1, dh = 1, dw = 2, G = 4, k = 2;
    kf_kan_conv2d_desc d;
    kf_kan_conv2d_desc_init(&d);
    d.in_channels = Cin, d.out_channels = Cout, d.kernel_h = kh, d.kernel_w = kw;
    d.stride_h = sh, d.stride_w = sw_, d.pad_h = ph, d.pad_w = pw, d.dilation_h = dh,
    d.dilation_w = dw, d.grid_size = G, d.spline_order = k;
    kf_kan_conv2d_plan *cp = NULL;
    KF_OK_(kf_kan_conv2d_plan_create(ctx, &d, &cp));
    const int64_t F = Cin * kh * kw, C = G + k, nk = G + 2 * k + 1;
    const int64_t Ho = (H + 2 * ph - dh * (kh - 1) - 1) / sh + 1,
                  Wo = (W + 2 * pw - dw * (kw - 1) - 1) / sw_ + 1, N = B * Ho * Wo;
    kf_kan_linear_plan *lp = lin_plan(ctx, F, Cout, G, k);
    float *x = malloc(B * Cin * H * W * 4), *rows = malloc(N * F * 4),
          *gc = malloc(F * nk * 4), *gl = malloc(F * nk * 4), *wc = malloc(Cout * F * C * 4),
          *wl = malloc(Cout * F * C * 4);
    for (int64_t q = 0; q < B * Cin * H * W; ++q) x[q] = urand(-2, 2);
    /* naive unfold: row (b Ho + oh) Wo + ow, feature (c kh + i) kw + j */
    for (int64_t b = 0; b < B; ++b)
        for (int64_t oh = 0; oh < Ho; ++oh)
            for (int64_t ow = 0; ow < Wo; ++ow)
                for (int64_t c = 0; c < Cin; ++c)
                    for (int64_t i = 0; i < kh; ++i)
                        for (int64_t j = 0; j < kw; ++j) {
                            const int64_t ih = oh * sh - ph + i * dh, iw = ow * sw_ - pw + j * dw;
                            const float v = ih >= 0 && ih < H && iw >= 0 && iw < W
                                                ? x[((b * Cin + c) * H + ih) * W + iw] : 0.0f;
                            rows[((b * Ho + oh) * Wo + ow) * F + (c * kh + i) * kw + j] = v;
                        }
    uniform_grid(lp, F, nk, gl);
    memcpy(gc, gl, F * nk * 4);
    for (int64_t q = 0; q < Cout * F * C; ++q) wl[q] = wc[q] = urand(-1, 1);
    kf_kan_update_grid_args a;
    kf_kan_update_grid_args_init(&a);
    int64_t xs4[4] = {B, Cin, H, W};
    a.x = batched ? tens(x, KF_DTYPE_F32, 4, xs4) : t3(x, 3, Cin, H, W);
    a.grid = t3(gc, 2, F, nk, 0), a.spline_weight = t3(wc, 3, Cout, F, C);
    KF_OK_(kf_kan_conv2d_update_grid(cp, &a));
    KF_OK_(update_lin(lp, rows, N, F, Cout, nk, C, gl, wl, 0.01f, 0.02f));
    cr_expect(memcmp(gc, gl, F * nk * 4) == 0, "the knots differ from KANLinear's on the patches");
    for (int64_t q = 0; q < Cout * F * C; ++q)
        cr_expect(fabsf(wc[q] - wl[q]) <= 1e-6f * (1.0f + fabsf(wl[q])), "coefficient %ld: %g vs %g",
                  (long)q, wc[q], wl[q]);
    free(x), free(rows), free(gc), free(gl), free(wc), free(wl);
    kf_kan_linear_plan_destroy(lp);
    kf_kan_conv2d_plan_destroy(cp);
    kf_context_destroy(ctx);
}

Test(kan_grid, conv2d_equals_linear_on_unfolded_patches) {
    conv_vs_unfold(1);
    conv_vs_unfold(0);
}

/* ---- errors ------------------------------------------------------------------------------- */

enum { EN = 4, EIN = 3, EOUT = 2, EG = 3, EK = 2, ENK = EG + 2 * EK + 1, EC = EG + EK };

Test(kan_grid, errors_name_the_argument_and_write_nothing) {
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    kf_kan_linear_plan *p = lin_plan(ctx, EIN, EOUT, EG, EK);
    float x[EN * EIN], grid[EIN * ENK], sw[EOUT * EIN * EC], g_keep[EIN * ENK],
        w_keep[EOUT * EIN * EC];
    for (int q = 0; q < EN * EIN; ++q) x[q] = urand(-1, 1);
    for (int q = 0; q < EOUT * EIN * EC; ++q) sw[q] = urand(-1, 1);
    uniform_grid(p, EIN, ENK, grid);
    memcpy(g_keep, grid, sizeof grid), memcpy(w_keep, sw, sizeof sw);
    kf_kan_update_grid_args a, b;
    kf_kan_update_grid_args_init(&a);
    cr_expect(a.struct_size == sizeof a && a.margin == 0.01f && a.grid_eps == 0.02f);
    cr_expect(a.x.data == NULL && a.grid.data == NULL && a.spline_weight.data == NULL);
    kf_kan_update_grid_args_init(NULL);
    a.x = t3(x, 2, EN, EIN, 0), a.grid = t3(grid, 2, EIN, ENK, 0);
    a.spline_weight = t3(sw, 3, EOUT, EIN, EC);

#define UNTOUCHED()                                                                           \
    do {                                                                                      \
        cr_expect(memcmp(grid, g_keep, sizeof grid) == 0, "grid written");                    \
        cr_expect(memcmp(sw, w_keep, sizeof sw) == 0, "spline_weight written");               \
    } while (0)
#define BAD(field_expr, needle)                                                               \
    do {                                                                                      \
        b = a;                                                                                \
        field_expr;                                                                           \
        EXPECT_FAIL(kf_kan_linear_update_grid(p, &b), KF_ERR_INVALID_ARGUMENT, needle);       \
        UNTOUCHED();                                                                          \
    } while (0)

    EXPECT_FAIL(kf_kan_linear_update_grid(NULL, &a), KF_ERR_INVALID_ARGUMENT, "plan");
    EXPECT_FAIL(kf_kan_linear_update_grid(p, NULL), KF_ERR_INVALID_ARGUMENT, "args");
    BAD(b.struct_size = 8, "struct_size");
    BAD(b.margin = -0.5f, "args->margin");
    BAD(b.margin = NAN, "args->margin");
    BAD(b.margin = INFINITY, "args->margin");
    BAD(b.grid_eps = 1.5f, "args->grid_eps");
    BAD(b.grid_eps = -0.01f, "args->grid_eps");
    BAD(b.grid_eps = NAN, "args->grid_eps");
    BAD(b.x = t3(x, 2, EN, EIN - 1, 0), "args->x");
    BAD(b.x = t3(NULL, 2, EN, EIN, 0), "args->x");
    BAD(b.x = t3(x, 2, 0, EIN, 0), "args->x");
    BAD(b.grid = t3(grid, 2, EIN, ENK - 1, 0), "args->grid");
    BAD(b.grid = t3(NULL, 2, EIN, ENK, 0), "args->grid");
    BAD(b.spline_weight = t3(sw, 3, EOUT, EIN, EC + 1), "args->spline_weight");
    BAD(b.spline_weight = t3(sw, 2, EOUT, EIN * EC, 0), "args->spline_weight");
    BAD(b.spline_weight = t3(NULL, 3, EOUT, EIN, EC), "args->spline_weight");
    /* values: a non-finite x names its index; a decreasing or non-finite grid; a non-finite
     * coefficient */
    x[2 * EIN + 1] = NAN;
    BAD((void)0, "args->x[2][1]");
    x[2 * EIN + 1] = -INFINITY;
    BAD((void)0, "args->x[2][1]");
    x[2 * EIN + 1] = 0.5f;
    grid[ENK + 3] = 5.0f, memcpy(g_keep, grid, sizeof grid);
    BAD((void)0, "args->grid");
    grid[ENK + 3] = NAN, memcpy(g_keep, grid, sizeof grid);
    BAD((void)0, "args->grid");
    uniform_grid(p, EIN, ENK, grid), memcpy(g_keep, grid, sizeof grid);
    sw[7] = INFINITY, memcpy(w_keep, sw, sizeof sw);
    BAD((void)0, "args->spline_weight");
    sw[7] = 0.25f, memcpy(w_keep, sw, sizeof sw);
    /* samples too far apart for finite knots */
    x[0] = -3e38f, x[EIN] = 3e38f;
    BAD((void)0, "args->x");
    x[0] = 0.1f, x[EIN] = 0.2f;
    /* a newer caller's struct with a nonzero byte beyond ours */
    struct { kf_kan_update_grid_args a; uint64_t extra; } big = {a, 1};
    big.a.struct_size = sizeof big;
    EXPECT_FAIL(kf_kan_linear_update_grid(p, &big.a), KF_ERR_UNSUPPORTED, "struct_size");
    UNTOUCHED();
    /* and the valid call goes through */
    KF_OK_(kf_kan_linear_update_grid(p, &a));
    cr_expect(strcmp(kf_last_error_message(), "") == 0);

    /* KANConv2d: x must be an image batch */
    kf_kan_conv2d_desc d;
    kf_kan_conv2d_desc_init(&d);
    d.in_channels = 1, d.out_channels = EOUT, d.kernel_h = 1, d.kernel_w = EIN, d.grid_size = EG,
    d.spline_order = EK;
    kf_kan_conv2d_plan *cp = NULL;
    KF_OK_(kf_kan_conv2d_plan_create(ctx, &d, &cp));
    memcpy(g_keep, grid, sizeof grid), memcpy(w_keep, sw, sizeof sw);
    b = a;
    EXPECT_FAIL(kf_kan_conv2d_update_grid(NULL, &b), KF_ERR_INVALID_ARGUMENT, "plan");
    EXPECT_FAIL(kf_kan_conv2d_update_grid(cp, NULL), KF_ERR_INVALID_ARGUMENT, "args");
    EXPECT_FAIL(kf_kan_conv2d_update_grid(cp, &b), KF_ERR_INVALID_ARGUMENT, "args->x");
    b.x = t3(x, 3, 1, EN, EIN); /* [1, 4, 3]: one image, Ho = 4, Wo = 1 */
    b.margin = -1.0f;
    EXPECT_FAIL(kf_kan_conv2d_update_grid(cp, &b), KF_ERR_INVALID_ARGUMENT, "args->margin");
    b.margin = 0.01f;
    x[5] = NAN;
    EXPECT_FAIL(kf_kan_conv2d_update_grid(cp, &b), KF_ERR_INVALID_ARGUMENT, "args->x[0][1][2]");
    UNTOUCHED();
    x[5] = 0.0f;
    KF_OK_(kf_kan_conv2d_update_grid(cp, &b));
#undef BAD
#undef UNTOUCHED
    kf_kan_conv2d_plan_destroy(cp);
    kf_kan_linear_plan_destroy(p);
    kf_context_destroy(ctx);
}

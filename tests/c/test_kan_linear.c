/* kf_kan_linear_* on the CPU backend, through the public header only, against the float64
 * reference of tests/c/ref_kan.c (efficient-kan's math: the full Cox-de Boor recurrence, its
 * derivative by forward mode). Inputs straddle the grid: values outside it on both sides and
 * values exactly on knots (including the first and last, and repeated knots); grids uniform,
 * sorted random per feature, and with repeated knots. Weights at a fan-in scale, never zeros;
 * every output poisoned (NaN) before each call; ||out - ref|| / ||ref|| < 1e-5. Gradients are
 * also checked by finite differences through the library's own forward: the loss sum(y * g) is
 * linear in each parameter (central differences are exact up to rounding) and piecewise
 * polynomial of degree <= 3 plus SiLU in x (a five-point stencil, points kept off the knots). */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kfuse.h"
#include "kan_grads.h"
#include "kf_test.h"
#include "ref_kan.h"
#include "ref_rnn.h"

#define TOL 1e-5

enum grid_kind {
    GRID_UNIFORM = 0,  /* kf_kan_linear_uniform_grid on [-1, 1] */
    GRID_RANDOM = 1,   /* per feature: sorted U(-1.5, 1.5) */
    GRID_REPEATED = 2, /* GRID_RANDOM with a double knot per feature (a triple in every third) */
};

/* One problem: shapes, float32 inputs and their float64 copies. */
typedef struct prob {
    ref_kan_cfg c;
    int64_t C, nk;
    int scaled;
    int32_t xnd;       /* rank of x: leading dims are {N} or {2, N/2} */
    int64_t xs[3], ys[3];
    float *x, *grid, *bw, *sw, *sc, *dy;
    double *x64, *grid64, *bw64, *sw64, *sc64, *dy64;
} prob;

static int64_t n_oi(const prob *p) { return p->c.out * p->c.in; }
static int64_t n_oic(const prob *p) { return p->c.out * p->c.in * p->C; }

static float *fill(ref_rng *r, int64_t n, double bound) {
    float *v = malloc((size_t)n * sizeof *v);
    ref_fill_uniform_f32(r, v, n, -bound, bound);
    return v;
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static kf_kan_linear_plan *make_plan(kf_context *ctx, const prob *p) {
    kf_kan_linear_desc d;
    kf_kan_linear_desc_init(&d);
    d.in_features = p->c.in, d.out_features = p->c.out;
    d.grid_size = (int32_t)p->c.G, d.spline_order = (int32_t)p->c.k;
    d.standalone_scale = p->scaled;
    kf_kan_linear_plan *plan = NULL;
    KF_OK_(kf_kan_linear_plan_create(ctx, &d, &plan));
    return plan;
}

static void make_grid(prob *p, ref_rng *r, int kind) {
    const int64_t in = p->c.in, nk = p->nk;
    p->grid = malloc((size_t)(in * nk) * sizeof(float));
    if (kind == GRID_UNIFORM) {
        kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
        kf_kan_linear_plan *plan = make_plan(ctx, p);
        kf_tensor g = t3(p->grid, 2, in, nk, 0);
        KF_OK_(kf_kan_linear_uniform_grid(plan, -1.0f, 1.0f, &g));
        kf_kan_linear_plan_destroy(plan);
        kf_context_destroy(ctx);
        return;
    }
    for (int64_t i = 0; i < in; i++) {
        float *t = p->grid + i * nk;
        ref_fill_uniform_f32(r, t, nk, -1.5, 1.5);
        qsort(t, (size_t)nk, sizeof *t, cmp_float);
        if (kind == GRID_REPEATED) {
            int64_t m = i % (nk - 1);
            t[m + 1] = t[m];
            if (i % 3 == 0 && m + 2 < nk) t[m + 2] = t[m];
        }
    }
}

/* x: uniform over the feature's grid widened by 30% each side, and about one value in six set
 * exactly on one of the feature's knots (any of them, first and last included). */
static void make_x(prob *p, ref_rng *r) {
    const int64_t N = p->c.N, in = p->c.in, nk = p->nk;
    p->x = malloc((size_t)(N * in) * sizeof(float));
    for (int64_t n = 0; n < N; n++)
        for (int64_t i = 0; i < in; i++) {
            const float *t = p->grid + i * nk;
            double lo = t[0], hi = t[nk - 1], w = hi - lo > 0 ? hi - lo : 1.0;
            float v;
            do v = (float)ref_rng_uniform(r, lo - 0.3 * w, hi + 0.3 * w); while (v == 0.0f);
            if (ref_rng_next(r) % 6 == 0) v = t[ref_rng_next(r) % (uint64_t)nk];
            p->x[n * in + i] = v;
        }
}

static prob make_prob(int64_t N, int64_t in, int64_t out, int64_t G, int64_t k, int scaled,
                      int three_d, int grid_kind, uint64_t seed) {
    prob p = {.c = {N, in, out, G, k}, .C = G + k, .nk = G + 2 * k + 1, .scaled = scaled};
    ref_rng r;
    ref_rng_seed(&r, seed);
    make_grid(&p, &r, grid_kind);
    make_x(&p, &r);
    const double b = 1.0 / sqrt((double)in);
    p.bw = fill(&r, n_oi(&p), b);
    p.sw = fill(&r, n_oic(&p), b);
    p.sc = scaled ? fill(&r, n_oi(&p), 1.0) : NULL;
    p.dy = fill(&r, N * out, 1.0);
    p.x64 = ref_to_f64(p.x, N * in);
    p.grid64 = ref_to_f64(p.grid, in * p.nk);
    p.bw64 = ref_to_f64(p.bw, n_oi(&p));
    p.sw64 = ref_to_f64(p.sw, n_oic(&p));
    p.sc64 = ref_to_f64(p.sc, n_oi(&p));
    p.dy64 = ref_to_f64(p.dy, N * out);
    if (three_d && N % 2 == 0) {
        p.xnd = 3;
        p.xs[0] = p.ys[0] = 2, p.xs[1] = p.ys[1] = N / 2;
        p.xs[2] = in, p.ys[2] = out;
    } else {
        p.xnd = 2;
        p.xs[0] = p.ys[0] = N;
        p.xs[1] = in, p.ys[1] = out;
    }
    return p;
}

static void refresh_f64(prob *p) {
    free(p->x64);
    p->x64 = ref_to_f64(p->x, p->c.N * p->c.in);
}

static void free_prob(prob *p) {
    void *v[] = {p->x, p->grid, p->bw, p->sw, p->sc, p->dy,
                 p->x64, p->grid64, p->bw64, p->sw64, p->sc64, p->dy64};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) free(v[i]);
}

static void set_params(const prob *p, kf_tensor *grid, kf_tensor *bw, kf_tensor *sw,
                       kf_tensor *sc) {
    *grid = t3(p->grid, 2, p->c.in, p->nk, 0);
    *bw = t3(p->bw, 2, p->c.out, p->c.in, 0);
    *sw = t3(p->sw, 3, p->c.out, p->c.in, p->C);
    if (p->scaled) *sc = t3(p->sc, 2, p->c.out, p->c.in, 0);
}

static kf_status run_forward(kf_kan_linear_plan *plan, const prob *p, float *y) {
    kf_kan_linear_forward_args a;
    kf_kan_linear_forward_args_init(&a);
    a.x = t3(p->x, p->xnd, p->xs[0], p->xs[1], p->xs[2]);
    set_params(p, &a.grid, &a.base_weight, &a.spline_weight, &a.spline_scaler);
    a.y = t3(y, p->xnd, p->ys[0], p->ys[1], p->ys[2]);
    return kf_kan_linear_forward(plan, &a, NULL, 0);
}

static kan_grad_sizes grad_sizes(const prob *p) {
    kan_grad_sizes n = {p->c.N * p->c.in, n_oi(p), n_oic(p), p->scaled ? n_oi(p) : 0};
    return n;
}

static grads poisoned_grads(const prob *p) { return kan_poisoned_grads(grad_sizes(p)); }

static kf_status run_backward(kf_kan_linear_plan *plan, const prob *p, kf_grad_mode mode,
                              const grads *g) {
    kf_kan_linear_backward_args a;
    kf_kan_linear_backward_args_init(&a);
    a.x = t3(p->x, p->xnd, p->xs[0], p->xs[1], p->xs[2]);
    set_params(p, &a.grid, &a.base_weight, &a.spline_weight, &a.spline_scaler);
    a.dy = t3(p->dy, p->xnd, p->ys[0], p->ys[1], p->ys[2]);
    if (g->dx) a.dx = t3(g->dx, p->xnd, p->xs[0], p->xs[1], p->xs[2]);
    if (g->dbw) a.dbase_weight = t3(g->dbw, 2, p->c.out, p->c.in, 0);
    if (g->dsw) a.dspline_weight = t3(g->dsw, 3, p->c.out, p->c.in, p->C);
    if (g->dsc) a.dspline_scaler = t3(g->dsc, 2, p->c.out, p->c.in, 0);
    return kf_kan_linear_backward(plan, mode, &a, NULL, 0);
}

/* Reference gradients, all four (dsc NULL without a scaler). */
static ref_grads reference_grads(const prob *p) {
    ref_grads r = {malloc((size_t)(p->c.N * p->c.in) * 8), malloc((size_t)n_oi(p) * 8),
                   malloc((size_t)n_oic(p) * 8), p->scaled ? malloc((size_t)n_oi(p) * 8) : NULL};
    ref_kan_backward(&p->c, p->x64, p->grid64, p->bw64, p->sw64, p->sc64, p->dy64, r.dx, r.dbw,
                     r.dsw, r.dsc);
    return r;
}

/* ---- forward and backward against the float64 reference ---------------------------------- */
typedef struct shape { int64_t N, in, out, G, k; int scaled, three_d, grid; } shape;

static void describe(const shape *s, char *buf, size_t n) {
    snprintf(buf, n, "N %lld in %lld out %lld G %lld k %lld scaled %d 3d %d grid %d",
             (long long)s->N, (long long)s->in, (long long)s->out, (long long)s->G,
             (long long)s->k, s->scaled, s->three_d, s->grid);
}

static void check_against_reference(const shape *s, int32_t threads) {
    char what[160];
    describe(s, what, sizeof what);
    prob p = make_prob(s->N, s->in, s->out, s->G, s->k, s->scaled, s->three_d, s->grid,
                       (uint64_t)(s->N * 131 + s->in * 17 + s->G * 5 + s->k + s->grid));
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, threads);
    kf_kan_linear_plan *plan = make_plan(ctx, &p);
    int64_t ny = s->N * s->out;
    float *y = poisoned(ny);
    KF_OK_(run_forward(plan, &p, y));
    double *yr = malloc((size_t)ny * sizeof *yr);
    ref_kan_forward(&p.c, p.x64, p.grid64, p.bw64, p.sw64, p.sc64, yr);
    double e = ref_rel_err_f32(y, yr, ny);
    cr_expect(e < TOL, "y: rel err %.3g (%s, %d threads)", e, what, (int)threads);

    grads g = poisoned_grads(&p);
    KF_OK_(run_backward(plan, &p, KF_GRAD_OVERWRITE, &g));
    ref_grads r = reference_grads(&p);
    char when[300];
    snprintf(when, sizeof when, "%s, %d threads", what, (int)threads);
    kan_expect_grads(&g, &r, grad_sizes(&p), TOL, when);
    /* KF_GRAD_ACCUMULATE adds to what the buffers hold (dx is overwritten all the same). */
    grads acc = kan_accumulate_start(grad_sizes(&p), &r);
    KF_OK_(run_backward(plan, &p, KF_GRAD_ACCUMULATE, &acc));
    snprintf(when, sizeof when, "accumulate: %s, %d threads", what, (int)threads);
    kan_expect_grads(&acc, &r, grad_sizes(&p), TOL, when);
    free_grads(&acc);
    free_grads(&g);
    free_ref_grads(&r);
    free(y), free(yr);
    kf_kan_linear_plan_destroy(plan);
    kf_context_destroy(ctx);
    free_prob(&p);
}

static const shape kShapes[] = {
    /*  N   in  out  G  k  scaled 3d grid */
    {5, 3, 4, 1, 0, 1, 0, GRID_UNIFORM},     /* G = 1, k = 0: two knots, one interval */
    {8, 5, 6, 1, 1, 0, 1, GRID_RANDOM},      /* 3-D x, no scaler */
    {1, 9, 7, 1, 3, 1, 0, GRID_REPEATED},    /* batch 1 */
    {12, 6, 5, 1, 3, 0, 0, GRID_RANDOM},
    {6, 11, 13, 5, 0, 0, 1, GRID_RANDOM},
    {33, 13, 10, 5, 1, 1, 0, GRID_REPEATED},
    {20, 17, 9, 5, 3, 1, 1, GRID_UNIFORM},   /* efficient-kan's defaults */
    {20, 17, 9, 5, 3, 0, 0, GRID_RANDOM},
    {1, 23, 3, 5, 3, 1, 0, GRID_REPEATED},
    {31, 7, 12, 8, 0, 1, 0, GRID_REPEATED},
    {10, 10, 5, 8, 1, 0, 1, GRID_UNIFORM},
    {14, 19, 11, 8, 3, 1, 1, GRID_RANDOM},
    {260, 40, 23, 8, 3, 1, 0, GRID_REPEATED},/* a team: 3 row blocks, 8 feature chunks */
    {130, 61, 37, 5, 3, 0, 1, GRID_UNIFORM}, /* 2 row blocks, chunks of 8 features */
    {300, 29, 70, 5, 1, 1, 0, GRID_RANDOM},
};

ParameterizedTestParameters(kan_linear, matches_reference) {
    return cr_make_param_array(shape, kShapes, sizeof kShapes / sizeof kShapes[0]);
}

ParameterizedTest(const shape *s, kan_linear, matches_reference) {
    check_against_reference(s, 1);
    check_against_reference(s, 2);
}

/* The CPU backend's windowed path (cpu/kan_linear.c, kan_sparse_pick: out >= 256 and
 * (G + k + 1) / (k + 2) >= 1.8 (forward, out >= 512), 2 (forward, out >= 256), 2.5 (backward)),
 * with the dense path at the same widths where the ratio is lower: every G in {1, 5, 10, 20} and
 * k in {0, 1, 2, 3, 4, 5} (the windowed weight gradient has a kernel per k + 2 up to 6 and a
 * generic one above), knots repeated, x outside the grid and on knots (make_x), more than one row
 * block and output panel (out not a multiple of the 64-float panel). */
static const shape kWindowed[] = {
    /*  N   in  out  G  k  scaled 3d grid */
    {40, 9, 256, 1, 0, 1, 0, GRID_REPEATED},   /* dense: (G + k + 1) / (k + 2) = 1 */
    {30, 7, 300, 1, 3, 0, 1, GRID_RANDOM},     /* dense */
    {50, 11, 256, 5, 0, 1, 0, GRID_REPEATED},  /* windowed both ways: ratio 3 */
    {33, 6, 260, 5, 1, 0, 1, GRID_RANDOM},     /* windowed forward (2.33), dense backward */
    {21, 8, 520, 5, 3, 1, 0, GRID_REPEATED},   /* windowed forward (1.8 at out >= 512) */
    {19, 5, 300, 5, 3, 1, 0, GRID_RANDOM},     /* dense both ways (1.8 at out < 512) */
    {140, 13, 257, 10, 2, 1, 1, GRID_REPEATED},/* windowed both ways, 2 row blocks */
    {25, 10, 256, 10, 3, 0, 0, GRID_UNIFORM},  /* windowed both ways */
    {27, 6, 270, 10, 5, 1, 0, GRID_RANDOM},    /* windowed forward (2.29) */
    {31, 9, 300, 20, 1, 1, 0, GRID_REPEATED},  /* windowed both ways */
    {18, 4, 256, 20, 3, 0, 1, GRID_RANDOM},    /* windowed both ways */
    {23, 7, 280, 20, 5, 1, 0, GRID_REPEATED},  /* windowed both ways (3.71) */
    {26, 6, 264, 20, 4, 1, 0, GRID_RANDOM},    /* windowed both ways (4.17; k = 4, k + 2 = 6) */
};

ParameterizedTestParameters(kan_linear, windowed_matches_reference) {
    return cr_make_param_array(shape, kWindowed, sizeof kWindowed / sizeof kWindowed[0]);
}

ParameterizedTest(const shape *s, kan_linear, windowed_matches_reference) {
    check_against_reference(s, 1);
    check_against_reference(s, 2);
}

/* Results do not depend on the team size: 1 and 2 threads give the same bits (a dense shape and
 * a windowed one). */
static void check_thread_count_invariant(int64_t N, int64_t in, int64_t out, int64_t G) {
    prob p = make_prob(N, in, out, G, 3, 1, 0, GRID_RANDOM, 7);
    float *y[2];
    grads g[2];
    for (int t = 0; t < 2; t++) {
        kf_context *ctx = make_ctx(KF_DEVICE_CPU, t + 1);
        kf_kan_linear_plan *plan = make_plan(ctx, &p);
        y[t] = poisoned(N * out);
        KF_OK_(run_forward(plan, &p, y[t]));
        g[t] = poisoned_grads(&p);
        KF_OK_(run_backward(plan, &p, KF_GRAD_OVERWRITE, &g[t]));
        kf_kan_linear_plan_destroy(plan);
        kf_context_destroy(ctx);
    }
    cr_expect(memcmp(y[0], y[1], (size_t)(N * out) * sizeof(float)) == 0, "y differs");
    cr_expect(memcmp(g[0].dx, g[1].dx, (size_t)(N * in) * sizeof(float)) == 0, "dx differs");
    cr_expect(memcmp(g[0].dbw, g[1].dbw, (size_t)n_oi(&p) * sizeof(float)) == 0,
              "dbase_weight differs");
    cr_expect(memcmp(g[0].dsw, g[1].dsw, (size_t)n_oic(&p) * sizeof(float)) == 0,
              "dspline_weight differs");
    cr_expect(memcmp(g[0].dsc, g[1].dsc, (size_t)n_oi(&p) * sizeof(float)) == 0,
              "dspline_scaler differs");
    for (int t = 0; t < 2; t++) free(y[t]), free_grads(&g[t]);
    free_prob(&p);
}

Test(kan_linear, thread_count_invariant) {
    check_thread_count_invariant(300, 37, 45, 5);
    check_thread_count_invariant(300, 37, 300, 10);
}

/* ---- finite differences --------------------------------------------------------------------- */

/* <dy, y> through the library's forward, in double. */
static double loss(kf_kan_linear_plan *plan, const prob *p, float *y) {
    cr_assert(run_forward(plan, p, y) == KF_OK, "%s", kf_last_error_message());
    double l = 0.0;
    for (int64_t i = 0; i < p->c.N * p->c.out; i++) l += (double)y[i] * p->dy[i];
    return l;
}

/* Differences of <dy, y> w.r.t. every element of one buffer: central with step h, or (five)
 * the five-point stencil, exact for polynomials of degree <= 4. */
static void check_fd(kf_kan_linear_plan *plan, prob *p, float *param, int64_t n,
                     const float *grad, const char *name, float h, int five) {
    float *y = poisoned(p->c.N * p->c.out);
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const float keep = param[i];
        double l[4];
        const float steps[4] = {h, -h, 2 * h, -2 * h};
        for (int s = 0; s < (five ? 4 : 2); s++) {
            param[i] = keep + steps[s];
            l[s] = loss(plan, p, y);
        }
        param[i] = keep;
        double fd = five ? (8.0 * (l[0] - l[1]) - (l[2] - l[3])) / (12.0 * h)
                         : (l[0] - l[1]) / (2.0 * h);
        num += (fd - grad[i]) * (fd - grad[i]);
        den += fd * fd;
    }
    cr_expect(sqrt(num / den) < 1e-3, "%s: finite differences differ by %.3g", name,
              sqrt(num / den));
    free(y);
}

/* Moves every x at least `gap` away from its feature's knots (the function is piecewise). */
static void x_off_knots(prob *p, float gap, ref_rng *r) {
    for (int64_t n = 0; n < p->c.N; n++)
        for (int64_t i = 0; i < p->c.in; i++) {
            const float *t = p->grid + i * p->nk;
            float v;
            int ok;
            do {
                v = (float)ref_rng_uniform(r, t[0] - 0.3, t[p->nk - 1] + 0.3);
                ok = 1;
                for (int64_t j = 0; j < p->nk; j++) ok &= fabsf(v - t[j]) > gap;
            } while (!ok);
            p->x[n * p->c.in + i] = v;
        }
    refresh_f64(p);
}

typedef struct fd_case { int64_t G, k; int scaled, grid; } fd_case;

static const fd_case kFd[] = {
    {5, 3, 1, GRID_RANDOM}, {5, 3, 0, GRID_UNIFORM}, {4, 1, 1, GRID_REPEATED},
    {3, 2, 0, GRID_REPEATED}, {2, 0, 1, GRID_RANDOM},
};

ParameterizedTestParameters(kan_linear, gradients_match_finite_differences) {
    return cr_make_param_array(fd_case, kFd, sizeof kFd / sizeof kFd[0]);
}

ParameterizedTest(const fd_case *f, kan_linear, gradients_match_finite_differences) {
    prob p = make_prob(3, 4, 3, f->G, f->k, f->scaled, 0, f->grid, 11 + (uint64_t)f->k);
    const float h = 1e-2f;
    ref_rng r;
    ref_rng_seed(&r, 99);
    x_off_knots(&p, 3.0f * h, &r);
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    kf_kan_linear_plan *plan = make_plan(ctx, &p);
    grads g = poisoned_grads(&p);
    KF_OK_(run_backward(plan, &p, KF_GRAD_OVERWRITE, &g));
    check_fd(plan, &p, p.x, p.c.N * p.c.in, g.dx, "dx", h, 1);
    check_fd(plan, &p, p.bw, n_oi(&p), g.dbw, "dbase_weight", 0.25f, 0);
    check_fd(plan, &p, p.sw, n_oic(&p), g.dsw, "dspline_weight", 0.25f, 0);
    if (p.scaled) check_fd(plan, &p, p.sc, n_oi(&p), g.dsc, "dspline_scaler", 0.25f, 0);
    free_grads(&g);
    kf_kan_linear_plan_destroy(plan);
    kf_context_destroy(ctx);
    free_prob(&p);
}

/* ---- optional outputs, workspace, grid ---------------------------------------------------- */

/* Optional outputs: any subset may be absent; those present are still right. */
/* No base_weight (since 1.3): y, dx, d spline_weight and d spline_scaler are the reference's
 * with no base term (its base weights all 0); a dbase_weight without a base_weight is refused,
 * nothing written. */
Test(kan_linear, absent_base_weight) {
    for (int scaled = 0; scaled <= 1; ++scaled)
        for (int wide = 0; wide <= 1; ++wide) { /* dense; windowed (out 300, G 10) */
            prob p = make_prob(37, 5, wide ? 300 : 4, wide ? 10 : 5, 3, scaled, 1, GRID_RANDOM,
                               77 + (uint64_t)scaled);
            free(p.bw), free(p.bw64);
            p.bw = NULL;
            p.bw64 = calloc((size_t)n_oi(&p), sizeof(double));
            kf_context *ctx = make_ctx(KF_DEVICE_CPU, 2);
            kf_kan_linear_plan *plan = make_plan(ctx, &p);
            const int64_t ny = p.c.N * p.c.out;
            float *y = poisoned(ny);
            KF_OK_(run_forward(plan, &p, y));
            double *yr = malloc((size_t)ny * sizeof *yr);
            ref_kan_forward(&p.c, p.x64, p.grid64, p.bw64, p.sw64, p.sc64, yr);
            const double e = ref_rel_err_f32(y, yr, ny);
            cr_expect(e < TOL, "y: rel err %.3g (scaled %d, wide %d)", e, scaled, wide);
            grads g = poisoned_grads(&p);
            free(g.dbw);
            g.dbw = NULL;
            KF_OK_(run_backward(plan, &p, KF_GRAD_OVERWRITE, &g));
            ref_grads r = reference_grads(&p);
            kan_grad_sizes n = grad_sizes(&p);
            n.oi = 0; /* no d base_weight */
            kan_expect_grads(&g, &r, n, TOL, scaled ? "no base, scaled" : "no base");
            grads bad = poisoned_grads(&p);
            cr_expect(run_backward(plan, &p, KF_GRAD_OVERWRITE, &bad) == KF_ERR_INVALID_ARGUMENT);
            cr_expect(strstr(kf_last_error_message(), "args->dbase_weight") != NULL, "%s",
                      kf_last_error_message());
            cr_expect(isnan(bad.dx[0]) && isnan(bad.dsw[0]) && isnan(bad.dbw[0]));
            free_grads(&bad), free_grads(&g), free_ref_grads(&r);
            free(y), free(yr);
            kf_kan_linear_plan_destroy(plan);
            kf_context_destroy(ctx);
            free_prob(&p);
        }
}

Test(kan_linear, backward_subsets) {
    prob p = make_prob(9, 20, 11, 5, 3, 1, 0, GRID_RANDOM, 3);
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 2);
    kf_kan_linear_plan *plan = make_plan(ctx, &p);
    ref_grads r = reference_grads(&p);
    for (int mask = 0; mask < 16; mask++) {
        grads g = poisoned_grads(&p), use = g;
        if (!(mask & 1)) use.dx = NULL;
        if (!(mask & 2)) use.dbw = NULL;
        if (!(mask & 4)) use.dsw = NULL;
        if (!(mask & 8)) use.dsc = NULL;
        KF_OK_(run_backward(plan, &p, KF_GRAD_OVERWRITE, &use));
        if (use.dx) cr_expect(ref_rel_err_f32(use.dx, r.dx, 9 * 20) < TOL, "mask %d: dx", mask);
        if (use.dbw)
            cr_expect(ref_rel_err_f32(use.dbw, r.dbw, n_oi(&p)) < TOL, "mask %d: dbase", mask);
        if (use.dsw)
            cr_expect(ref_rel_err_f32(use.dsw, r.dsw, n_oic(&p)) < TOL, "mask %d: dspline", mask);
        if (use.dsc)
            cr_expect(ref_rel_err_f32(use.dsc, r.dsc, n_oi(&p)) < TOL, "mask %d: dscaler", mask);
        /* Absent outputs stay as they were: nothing written through a NULL tensor elsewhere. */
        if (!use.dx) cr_expect(isnan(g.dx[0]), "mask %d: dx buffer written", mask);
        free_grads(&g);
    }
    free_ref_grads(&r);
    kf_kan_linear_plan_destroy(plan);
    kf_context_destroy(ctx);
    free_prob(&p);
}

/* The workspace is bounded by tiles, not by N times the bases; a caller workspace of exactly
 * that size serves (an overrun of it shows under the sanitizer build); repeated calls do not
 * grow the arena. On the dense path and on the windowed one (out 300, G 10). */
static void check_workspace_bounded_and_steady(int64_t out, int64_t G) {
    prob p = make_prob(200, 24, out, G, 3, 1, 0, GRID_UNIFORM, 5);
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 2);
    kf_kan_linear_plan *plan = make_plan(ctx, &p);
    size_t w4 = 0, w7 = 0, w200 = 0;
    KF_OK_(kf_kan_linear_workspace_size(plan, 10000, &w4));
    KF_OK_(kf_kan_linear_workspace_size(plan, 10000000, &w7));
    KF_OK_(kf_kan_linear_workspace_size(plan, 200, &w200));
    cr_expect(w4 == w7, "workspace grows with N: %zu at 1e4 rows, %zu at 1e7", w4, w7);
    cr_expect(w4 < (size_t)10000 * 24 * (G + 3) * sizeof(float),
              "workspace %zu bytes at 1e4 rows: as large as the batch's bases", w4);

    float *y = poisoned(200 * out);
    void *ws = aligned_alloc(64, (w200 + 63) / 64 * 64);
    kf_kan_linear_forward_args a;
    kf_kan_linear_forward_args_init(&a);
    a.x = t3(p.x, 2, 200, 24, 0);
    set_params(&p, &a.grid, &a.base_weight, &a.spline_weight, &a.spline_scaler);
    a.y = t3(y, 2, 200, out, 0);
    KF_OK_(kf_kan_linear_forward(plan, &a, ws, w200));
    double *yr = malloc((size_t)(200 * out) * sizeof *yr);
    ref_kan_forward(&p.c, p.x64, p.grid64, p.bw64, p.sw64, p.sc64, yr);
    cr_expect(ref_rel_err_f32(y, yr, 200 * out) < TOL, "y with a caller workspace");

    grads g = poisoned_grads(&p);
    KF_OK_(run_forward(plan, &p, y));
    KF_OK_(run_backward(plan, &p, KF_GRAD_OVERWRITE, &g));
    uint64_t grow0 = 0, grow1 = 0;
    KF_OK_(kf_context_arena_info(ctx, NULL, &grow0));
    for (int i = 0; i < 3; i++) {
        KF_OK_(run_forward(plan, &p, y));
        KF_OK_(run_backward(plan, &p, KF_GRAD_ACCUMULATE, &g));
    }
    KF_OK_(kf_context_arena_info(ctx, NULL, &grow1));
    cr_expect(grow0 == grow1, "arena grew in steady state (%llu -> %llu)",
              (unsigned long long)grow0, (unsigned long long)grow1);
    free_grads(&g);
    free(ws), free(y), free(yr);
    kf_kan_linear_plan_destroy(plan);
    kf_context_destroy(ctx);
    free_prob(&p);
}

Test(kan_linear, workspace_bounded_and_steady) {
    check_workspace_bounded_and_steady(16, 5);
    check_workspace_bounded_and_steady(300, 10);
}

/* efficient-kan's initial knots: lo + (j - k) (hi - lo) / G on every row, rounded as torch
 * forms them in float32 (arange * h + lo). */
Test(kan_linear, uniform_grid) {
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    const struct { int64_t in, G, k; float lo, hi; } cases[] = {
        {3, 5, 3, -1.0f, 1.0f}, {4, 1, 0, 0.0f, 2.0f}, {2, 8, 1, -0.5f, 3.0f},
        {5, 7, 2, -3.0f, -1.0f}};
    for (size_t q = 0; q < sizeof cases / sizeof cases[0]; q++) {
        const int64_t in = cases[q].in, G = cases[q].G, k = cases[q].k, nk = G + 2 * k + 1;
        prob p = {.c = {1, in, 2, G, k}, .C = G + k, .nk = nk, .scaled = 1};
        kf_kan_linear_plan *plan = make_plan(ctx, &p);
        float *grid = poisoned(in * nk);
        kf_tensor g = t3(grid, 2, in, nk, 0);
        KF_OK_(kf_kan_linear_uniform_grid(plan, cases[q].lo, cases[q].hi, &g));
        const double lo = cases[q].lo, hi = cases[q].hi, h = (hi - lo) / (double)G;
        const float hf = (float)h;
        for (int64_t i = 0; i < in; i++)
            for (int64_t j = 0; j < nk; j++) {
                const float v = grid[i * nk + j];
                const float torch_v = (float)(j - k) * hf + cases[q].lo;
                cr_expect(v == torch_v, "case %zu grid[%lld][%lld] = %.9g, torch forms %.9g", q,
                          (long long)i, (long long)j, (double)v, (double)torch_v);
                cr_expect(fabs(v - (lo + (double)(j - k) * h)) <= 1e-6 * (1 + fabs(hi - lo) * 4),
                          "case %zu grid[%lld][%lld] = %.9g", q, (long long)i, (long long)j,
                          (double)v);
            }
        /* Bits printed by torch 1.13 for efficient-kan's buffer at these settings. */
        static const float torch_5_3[12] = {
            -0x1.19999ap+1f, -0x1.ccccccp+0f, -0x1.666666p+0f, -0x1p+0f, -0x1.333334p-1f,
            -0x1.999998p-3f, 0x1.9999ap-3f, 0x1.333334p-1f, 0x1p+0f, 0x1.666668p+0f,
            0x1.ccccccp+0f, 0x1.19999ap+1f};
        static const float torch_7_2[12] = {
            -0x1.c92492p+1f, -0x1.a4924ap+1f, -0x1.8p+1f, -0x1.5b6db6p+1f, -0x1.36db6ep+1f,
            -0x1.124924p+1f, -0x1.db6db6p+0f, -0x1.924924p+0f, -0x1.49249p+0f, -0x1p+0f,
            -0x1.6db6d8p-1f, -0x1.b6db6p-2f};
        const float *torch = q == 0 ? torch_5_3 : q == 3 ? torch_7_2 : NULL;
        for (int64_t j = 0; torch && j < nk; j++)
            cr_expect(grid[(in - 1) * nk + j] == torch[j], "case %zu knot %lld = %a, torch %a", q,
                      (long long)j, (double)grid[(in - 1) * nk + j], (double)torch[j]);
        free(grid);
        kf_kan_linear_plan_destroy(plan);
    }
    kf_context_destroy(ctx);
}

/* The descriptor's defaults are efficient-kan's. */
Test(kan_linear, desc_defaults) {
    kf_kan_linear_desc d;
    kf_kan_linear_desc_init(&d);
    cr_expect(d.struct_size == sizeof d);
    cr_expect(d.grid_size == 5 && d.spline_order == 3 && d.standalone_scale == 1);
    cr_expect(d.dtype == KF_DTYPE_F32 && d.in_features == 0 && d.out_features == 0);
}

/* Large inputs (SiLU's exponential saturates both ways) against the reference, and a NaN input
 * poisons its own row of y (and its own dx) only, as in efficient-kan; on the dense path and on
 * the windowed one (out = 300, G = 10). */
static void check_extreme_and_nan_inputs(int64_t out, int64_t G) {
    prob p = make_prob(6, 5, out, G, 3, 1, 0, GRID_UNIFORM, 21);
    const float big[] = {30.0f, -30.0f, 100.0f, -100.0f, 1e4f, -1e4f, 3e38f, -3e38f, 88.5f,
                         -87.5f};
    for (int64_t e = 0; e < 10; e++) p.x[5 + e] = big[e];
    refresh_f64(&p);
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    kf_kan_linear_plan *plan = make_plan(ctx, &p);
    float *y = poisoned(6 * out);
    KF_OK_(run_forward(plan, &p, y));
    double *yr = malloc((size_t)(6 * out) * sizeof *yr);
    ref_kan_forward(&p.c, p.x64, p.grid64, p.bw64, p.sw64, p.sc64, yr);
    /* Rows 1..2 hold the large values; |x| = 3e38 makes y itself huge but finite. */
    double e = ref_rel_err_f32(y, yr, 6 * out);
    cr_expect(e < TOL, "y with large inputs: rel err %.3g", e);
    grads g = poisoned_grads(&p);
    KF_OK_(run_backward(plan, &p, KF_GRAD_OVERWRITE, &g));
    ref_grads r = reference_grads(&p);
    e = ref_rel_err_f32(g.dx, r.dx, 6 * 5);
    cr_expect(e < TOL, "dx with large inputs: rel err %.3g", e);
    free_ref_grads(&r);

    p.x[3 * 5 + 2] = NAN;
    KF_OK_(run_forward(plan, &p, y));
    for (int64_t o = 0; o < out; o++) {
        cr_expect(isnan(y[3 * out + o]), "y[3][%lld] = %g, expected NaN", (long long)o,
                  y[3 * out + o]);
        for (int64_t n = 0; n < 6; n++)
            if (n != 3)
                cr_expect(isfinite(y[n * out + o]), "y[%lld][%lld] not finite", (long long)n,
                          (long long)o);
    }
    KF_OK_(run_backward(plan, &p, KF_GRAD_OVERWRITE, &g));
    cr_expect(isnan(g.dx[3 * 5 + 2]), "dx of the NaN input is %g", g.dx[3 * 5 + 2]);
    for (int64_t i = 0; i < 6 * 5; i++)
        if (i != 3 * 5 + 2) cr_expect(isfinite(g.dx[i]), "dx[%lld] = %g", (long long)i, g.dx[i]);
    free_grads(&g);
    free(y), free(yr);
    kf_kan_linear_plan_destroy(plan);
    kf_context_destroy(ctx);
    free_prob(&p);
}

Test(kan_linear, extreme_and_nan_inputs) {
    check_extreme_and_nan_inputs(4, 5);
    check_extreme_and_nan_inputs(300, 10);
}

/* x of rank 1 ([in], one row) gives y [out], the same bits as the [1, in] call. */
/* Uniform grids of kf_kan_linear_uniform_grid over ranges whose spacing is no power of two and
 * far from 0, with x exactly on every knot and one float either side: the interval a knot value
 * falls in must be the one to its right, exactly (an implementation that finds it from
 * (x - t_0) / h, which rounds either way at a knot, must settle it against the knots); k = 0 and
 * k = 1 make a wrong interval visible (the basis, or dx, jumps at a knot). */
Test(kan_linear, uniform_grids_on_knots) {
    const float ranges[][2] = {{-1.0f, 1.0f}, {-3.7f, 2.9f}, {0.1f, 0.7f}, {-1000.3f, 17.9f},
                               {5.0f, 5.3f}};
    const int64_t Gs[] = {3, 7, 10};
    for (int64_t out = 2; out <= 300; out += 298) /* dense; windowed where the ratio allows */
    for (int64_t k = 0; k <= 2; k++)
        for (size_t gi = 0; gi < sizeof Gs / sizeof Gs[0]; gi++)
            for (size_t ri = 0; ri < sizeof ranges / sizeof ranges[0]; ri++) {
                const int64_t G = Gs[gi], nk = G + 2 * k + 1, N = 3 * nk;
                prob p = make_prob(N, 1, out, G, k, 1, 0, GRID_UNIFORM, 100 + (uint64_t)ri);
                kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
                kf_kan_linear_plan *plan = make_plan(ctx, &p);
                kf_tensor gt = t3(p.grid, 2, 1, nk, 0);
                KF_OK_(kf_kan_linear_uniform_grid(plan, ranges[ri][0], ranges[ri][1], &gt));
                for (int64_t j = 0; j < nk; j++) {
                    p.x[3 * j] = p.grid[j];
                    p.x[3 * j + 1] = nextafterf(p.grid[j], -INFINITY);
                    p.x[3 * j + 2] = nextafterf(p.grid[j], INFINITY);
                }
                free(p.grid64);
                p.grid64 = ref_to_f64(p.grid, nk);
                refresh_f64(&p);
                float *y = poisoned(N * out);
                KF_OK_(run_forward(plan, &p, y));
                double *yr = malloc((size_t)(N * out) * sizeof *yr);
                ref_kan_forward(&p.c, p.x64, p.grid64, p.bw64, p.sw64, p.sc64, yr);
                grads g = poisoned_grads(&p);
                KF_OK_(run_backward(plan, &p, KF_GRAD_OVERWRITE, &g));
                ref_grads r = reference_grads(&p);
                const double ey = ref_rel_err_f32(y, yr, N * out);
                const double ex = ref_rel_err_f32(g.dx, r.dx, N);
                const double ew = ref_rel_err_f32(g.dsw, r.dsw, n_oic(&p));
                cr_expect(ey < TOL && ex < TOL && ew < TOL,
                          "out %lld k %lld G %lld range [%g, %g]: rel err y %.3g dx %.3g "
                          "dspline %.3g", (long long)out, (long long)k, (long long)G, (double)ranges[ri][0],
                          (double)ranges[ri][1], ey, ex, ew);
                free_grads(&g), free_ref_grads(&r), free(y), free(yr);
                kf_kan_linear_plan_destroy(plan);
                kf_context_destroy(ctx);
                free_prob(&p);
            }
}

Test(kan_linear, rank1_x) {
    prob p = make_prob(1, 7, 5, 5, 3, 1, 0, GRID_RANDOM, 31);
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    kf_kan_linear_plan *plan = make_plan(ctx, &p);
    float *y2 = poisoned(5), *y1 = poisoned(5);
    KF_OK_(run_forward(plan, &p, y2));
    kf_kan_linear_forward_args a;
    kf_kan_linear_forward_args_init(&a);
    a.x = t3(p.x, 1, 7, 0, 0);
    set_params(&p, &a.grid, &a.base_weight, &a.spline_weight, &a.spline_scaler);
    a.y = t3(y1, 1, 5, 0, 0);
    KF_OK_(kf_kan_linear_forward(plan, &a, NULL, 0));
    cr_expect(memcmp(y1, y2, 5 * sizeof(float)) == 0, "rank-1 x differs from [1, in]");
    free(y1), free(y2);
    kf_kan_linear_plan_destroy(plan);
    kf_context_destroy(ctx);
    free_prob(&p);
}

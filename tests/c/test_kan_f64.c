/* kf_kan_linear_* and kf_kan_conv2d_* in float64 on the CPU backend, through the public header
 * only, against the float64 reference of tests/c/ref_kan.c (efficient-kan's math: the full
 * Cox-de Boor recurrence, its derivative by forward mode); KANConv2d's patches unfolded here by
 * naive loops (zeros in the padding, unfold's feature order) and dx folded back by the same
 * loops. Inputs straddle the grid ([-1.4, 1.4] against [-1, 1]); grids uniform (the library's,
 * checked against the formula in float64) or sorted random per feature; weights at a fan-in
 * scale, never zeros; every output poisoned (NaN) before each call; ||out - ref|| / ||ref|| <
 * 1e-12, forward, dx and every parameter gradient, overwritten and accumulated, on 1 and 2
 * threads. The grid update in float64: the knots against the formula in float64, the refit by
 * its normal equations, KANConv2d's against KANLinear's on the unfolded patches. Also: the
 * workspace query in float64 bytes, a dtype mismatch named with nothing written, and float16
 * refused at plan creation. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kf_test.h"
#include "kfuse.h"
#include "ref_kan.h"
#include "ref_rnn.h"

#define TOL 1e-12

/* A layer and a batch: KANLinear (kh = 0: x [N, in]) or KANConv2d (x [B, Cin, H, W]). */
typedef struct shape {
    int64_t B, Cin, H, W, out;
    int32_t kh, kw, sh, sw, ph, pw, dh, dw;
    int32_t G, k;
    int scaled, base, random_grid;
} shape;

/* One problem in float64: the per-row layer (F features), x, its rows (the patches for
 * KANConv2d), the parameters and the upstream gradient. */
typedef struct prob {
    shape s;
    int64_t F, C, nk, Ho, Wo, N, nx, ny;
    ref_kan_cfg c;
    double *x, *rows, *grid, *bw, *bw0, *sw, *sc, *dy, *dyr;
} prob;

static bool is_conv(const shape *s) { return s->kh > 0; }
static int64_t n_oi(const prob *p) { return p->s.out * p->F; }
static int64_t n_oic(const prob *p) { return p->s.out * p->F * p->C; }

static double *fill(ref_rng *r, int64_t n, double bound) {
    double *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = ref_rng_uniform(r, -bound, bound);
    return v;
}

static double *nans(int64_t n) {
    double *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = NAN;
    return v;
}

static int cmp_double(const void *a, const void *b) {
    const double u = *(const double *)a, v = *(const double *)b;
    return (u > v) - (u < v);
}

static kf_tensor dt(const void *p, int32_t nd, const int64_t *shape) {
    return tens((void *)p, KF_DTYPE_F64, nd, shape);
}

/* Plans of either layer, float64 unless `dtype` says otherwise. */
typedef struct plans {
    kf_kan_linear_plan *lin;
    kf_kan_conv2d_plan *conv;
} plans;

static kf_status plan_of(kf_context *ctx, const shape *s, int32_t dtype, plans *out) {
    *out = (plans){NULL, NULL};
    if (!is_conv(s)) {
        kf_kan_linear_desc d;
        kf_kan_linear_desc_init(&d);
        d.in_features = s->Cin, d.out_features = s->out, d.grid_size = s->G;
        d.spline_order = s->k, d.standalone_scale = s->scaled, d.dtype = dtype;
        return kf_kan_linear_plan_create(ctx, &d, &out->lin);
    }
    kf_kan_conv2d_desc d;
    kf_kan_conv2d_desc_init(&d);
    d.in_channels = s->Cin, d.out_channels = s->out, d.kernel_h = s->kh, d.kernel_w = s->kw;
    d.stride_h = s->sh, d.stride_w = s->sw, d.pad_h = s->ph, d.pad_w = s->pw;
    d.dilation_h = s->dh, d.dilation_w = s->dw, d.grid_size = s->G, d.spline_order = s->k;
    d.standalone_scale = s->scaled, d.dtype = dtype;
    return kf_kan_conv2d_plan_create(ctx, &d, &out->conv);
}

static void plans_destroy(plans *p) {
    kf_kan_linear_plan_destroy(p->lin);
    kf_kan_conv2d_plan_destroy(p->conv);
}

/* Offset in x of feature f of row (patch) n, or -1 in the padding. */
static int64_t patch_src(const prob *p, int64_t n, int64_t f) {
    const shape *s = &p->s;
    if (!is_conv(s)) return n * p->F + f;
    const int64_t b = n / (p->Ho * p->Wo), oh = n / p->Wo % p->Ho, ow = n % p->Wo;
    const int64_t c = f / (s->kh * s->kw), i = f / s->kw % s->kh, j = f % s->kw;
    const int64_t ih = oh * s->sh - s->ph + i * s->dh, iw = ow * s->sw - s->pw + j * s->dw;
    if (ih < 0 || ih >= s->H || iw < 0 || iw >= s->W) return -1;
    return ((b * s->Cin + c) * s->H + ih) * s->W + iw;
}

/* Element (n, o) of y or dy: [N, out] rows, or [B, out, Ho, Wo] images. */
static int64_t y_index(const prob *p, int64_t n, int64_t o) {
    if (!is_conv(&p->s)) return n * p->s.out + o;
    const int64_t L = p->Ho * p->Wo;
    return (n / L * p->s.out + o) * L + n % L;
}

static kf_tensor x_tensor(const prob *p, const void *data) {
    const shape *s = &p->s;
    int64_t sh[4] = {s->B, s->Cin, s->H, s->W};
    return is_conv(s) ? dt(data, 4, sh) : dt(data, 2, (int64_t[]){p->N, p->F});
}

static kf_tensor y_tensor(const prob *p, const void *data) {
    int64_t sh[4] = {p->s.B, p->s.out, p->Ho, p->Wo};
    return is_conv(&p->s) ? dt(data, 4, sh) : dt(data, 2, (int64_t[]){p->N, p->s.out});
}

/* The uniform grid on [-1, 1] through the library, checked against its formula in float64:
 * knot j = (j - k) h + lo, h = (hi - lo) / G, as torch forms it in float64. */
static void uniform_grid(kf_context *ctx, prob *p) {
    plans pl;
    KF_OK_(plan_of(ctx, &p->s, KF_DTYPE_F64, &pl));
    kf_tensor g = dt(p->grid, 2, (int64_t[]){p->F, p->nk});
    KF_OK_(pl.lin ? kf_kan_linear_uniform_grid(pl.lin, -1.0f, 1.0f, &g)
                  : kf_kan_conv2d_uniform_grid(pl.conv, -1.0f, 1.0f, &g));
    const double h = 2.0 / (double)p->s.G;
    for (int64_t f = 0; f < p->F; f++)
        for (int64_t j = 0; j < p->nk; j++)
            cr_expect(p->grid[f * p->nk + j] == (double)(j - p->s.k) * h + -1.0,
                      "grid[%lld][%lld] = %.17g", (long long)f, (long long)j,
                      p->grid[f * p->nk + j]);
    plans_destroy(&pl);
}

static prob make_prob(const shape *s, uint64_t seed) {
    prob p = {.s = *s};
    p.C = s->G + s->k, p.nk = s->G + 2 * s->k + 1;
    if (is_conv(s)) {
        p.F = s->Cin * s->kh * s->kw;
        p.Ho = (s->H + 2 * s->ph - s->dh * (s->kh - 1) - 1) / s->sh + 1;
        p.Wo = (s->W + 2 * s->pw - s->dw * (s->kw - 1) - 1) / s->sw + 1;
        p.N = s->B * p.Ho * p.Wo, p.nx = s->B * s->Cin * s->H * s->W;
    } else {
        p.F = s->Cin, p.N = s->B, p.Ho = p.Wo = 1, p.nx = p.N * p.F;
    }
    p.ny = p.N * s->out;
    p.c = (ref_kan_cfg){.N = p.N, .in = p.F, .out = s->out, .G = s->G, .k = s->k};
    ref_rng r;
    ref_rng_seed(&r, seed);
    p.x = fill(&r, p.nx, 1.4);
    p.rows = malloc((size_t)(p.N * p.F) * sizeof *p.rows);
    for (int64_t n = 0; n < p.N; n++)
        for (int64_t f = 0; f < p.F; f++) {
            const int64_t src = patch_src(&p, n, f);
            p.rows[n * p.F + f] = src < 0 ? 0.0 : p.x[src];
        }
    p.grid = malloc((size_t)(p.F * p.nk) * sizeof *p.grid);
    if (s->random_grid) {
        for (int64_t f = 0; f < p.F; f++) {
            for (int64_t j = 0; j < p.nk; j++)
                p.grid[f * p.nk + j] = ref_rng_uniform(&r, -1.5, 1.5);
            qsort(p.grid + f * p.nk, (size_t)p.nk, sizeof *p.grid, cmp_double);
        }
    } else {
        kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
        uniform_grid(ctx, &p);
        kf_context_destroy(ctx);
    }
    const double b = 1.0 / sqrt((double)p.F);
    p.bw0 = fill(&r, n_oi(&p), b);
    p.bw = s->base ? p.bw0 : NULL;
    if (!s->base) memset(p.bw0, 0, (size_t)n_oi(&p) * sizeof *p.bw0); /* the reference's */
    p.sw = fill(&r, n_oic(&p), b);
    p.sc = s->scaled ? fill(&r, n_oi(&p), 1.0) : NULL;
    p.dy = fill(&r, p.ny, 1.0);
    p.dyr = malloc((size_t)p.ny * sizeof *p.dyr);
    for (int64_t n = 0; n < p.N; n++)
        for (int64_t o = 0; o < s->out; o++) p.dyr[n * s->out + o] = p.dy[y_index(&p, n, o)];
    return p;
}

static void free_prob(prob *p) {
    void *v[] = {p->x, p->rows, p->grid, p->bw0, p->sw, p->sc, p->dy, p->dyr};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) free(v[i]);
}

/* ---- calls through the public API --------------------------------------------------------- */

typedef struct params { kf_tensor grid, bw, sw, sc; } params;

static params params_of(const prob *p) {
    params t = {dt(p->grid, 2, (int64_t[]){p->F, p->nk}), {0}, {0}, {0}};
    if (p->bw) t.bw = dt(p->bw, 2, (int64_t[]){p->s.out, p->F});
    t.sw = dt(p->sw, 3, (int64_t[]){p->s.out, p->F, p->C});
    if (p->sc) t.sc = dt(p->sc, 2, (int64_t[]){p->s.out, p->F});
    return t;
}

static kf_status run_forward(const plans *pl, const prob *p, const params *t, kf_tensor x,
                             kf_tensor y, void *ws, size_t ws_bytes) {
    if (pl->lin) {
        kf_kan_linear_forward_args a;
        kf_kan_linear_forward_args_init(&a);
        a.x = x, a.grid = t->grid, a.base_weight = t->bw, a.spline_weight = t->sw;
        a.spline_scaler = t->sc, a.y = y;
        return kf_kan_linear_forward(pl->lin, &a, ws, ws_bytes);
    }
    kf_kan_conv2d_forward_args a;
    kf_kan_conv2d_forward_args_init(&a);
    a.x = x, a.grid = t->grid, a.base_weight = t->bw, a.spline_weight = t->sw;
    a.spline_scaler = t->sc, a.y = y;
    return kf_kan_conv2d_forward(pl->conv, &a, ws, ws_bytes);
}

/* Gradients dx, d base_weight, d spline_weight, d spline_scaler (NULL when absent). */
enum { GX, GBW, GSW, GSC, NG };

static void grad_sizes(const prob *p, int64_t n[NG]) {
    n[GX] = p->nx, n[GBW] = p->bw ? n_oi(p) : 0, n[GSW] = n_oic(p), n[GSC] = p->sc ? n_oi(p) : 0;
}

static void grads_make(const prob *p, double *g[NG]) {
    int64_t n[NG];
    grad_sizes(p, n);
    for (int i = 0; i < NG; i++) g[i] = n[i] ? nans(n[i]) : NULL;
}

static void grads_free(double *g[NG]) {
    for (int i = 0; i < NG; i++) free(g[i]);
}

static kf_status run_backward(const plans *pl, const prob *p, kf_grad_mode mode, double *g[NG]) {
    const params t = params_of(p);
    kf_tensor dx = x_tensor(p, g[GX]), dbw = {0}, dsw, dsc = {0};
    if (g[GBW]) dbw = dt(g[GBW], 2, (int64_t[]){p->s.out, p->F});
    dsw = dt(g[GSW], 3, (int64_t[]){p->s.out, p->F, p->C});
    if (g[GSC]) dsc = dt(g[GSC], 2, (int64_t[]){p->s.out, p->F});
    if (pl->lin) {
        kf_kan_linear_backward_args a;
        kf_kan_linear_backward_args_init(&a);
        a.x = x_tensor(p, p->x), a.grid = t.grid, a.base_weight = t.bw, a.spline_weight = t.sw;
        a.spline_scaler = t.sc, a.dy = y_tensor(p, p->dy), a.dx = dx, a.dbase_weight = dbw;
        a.dspline_weight = dsw, a.dspline_scaler = dsc;
        return kf_kan_linear_backward(pl->lin, mode, &a, NULL, 0);
    }
    kf_kan_conv2d_backward_args a;
    kf_kan_conv2d_backward_args_init(&a);
    a.x = x_tensor(p, p->x), a.grid = t.grid, a.base_weight = t.bw, a.spline_weight = t.sw;
    a.spline_scaler = t.sc, a.dy = y_tensor(p, p->dy), a.dx = dx, a.dbase_weight = dbw;
    a.dspline_weight = dsw, a.dspline_scaler = dsc;
    return kf_kan_conv2d_backward(pl->conv, mode, &a, NULL, 0);
}

/* ---- forward and backward against the reference ------------------------------------------- */

static void check_against_reference(const shape *s, int32_t threads) {
    prob p = make_prob(s, (uint64_t)(s->B * 131 + s->Cin * 17 + s->out * 7 + s->kh));
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, threads);
    plans pl;
    KF_OK_(plan_of(ctx, s, KF_DTYPE_F64, &pl));
    const params t = params_of(&p);
    double *y = nans(p.ny), *rows = malloc((size_t)p.ny * sizeof *rows);
    double *yr = malloc((size_t)p.ny * sizeof *yr);
    KF_OK_(run_forward(&pl, &p, &t, x_tensor(&p, p.x), y_tensor(&p, y), NULL, 0));
    ref_kan_forward(&p.c, p.rows, p.grid, p.bw0, p.sw, p.sc, rows);
    for (int64_t n = 0; n < p.N; n++)
        for (int64_t o = 0; o < s->out; o++) yr[y_index(&p, n, o)] = rows[n * s->out + o];
    const double ey = ref_rel_err_f64(y, yr, p.ny);
    cr_expect(ey < TOL, "y: rel err %.3g (%s, F %lld, out %lld, %d threads)", ey,
              is_conv(s) ? "conv2d" : "linear", (long long)p.F, (long long)s->out, threads);

    /* the reference's gradients: of the rows, folded back into x's pixels for KANConv2d */
    double *want[NG], *drows = malloc((size_t)(p.N * p.F) * sizeof *drows);
    int64_t n[NG];
    grad_sizes(&p, n);
    want[GX] = calloc((size_t)p.nx, sizeof(double));
    want[GBW] = malloc((size_t)n_oi(&p) * sizeof(double));
    want[GSW] = malloc((size_t)n_oic(&p) * sizeof(double));
    want[GSC] = p.sc ? malloc((size_t)n_oi(&p) * sizeof(double)) : NULL;
    ref_kan_backward(&p.c, p.rows, p.grid, p.bw0, p.sw, p.sc, p.dyr, drows, want[GBW], want[GSW],
                     want[GSC]);
    for (int64_t r = 0; r < p.N; r++)
        for (int64_t f = 0; f < p.F; f++) {
            const int64_t src = patch_src(&p, r, f);
            if (src >= 0) want[GX][src] += drows[r * p.F + f];
        }
    static const char *names[NG] = {"dx", "dbase_weight", "dspline_weight", "dspline_scaler"};
    double *g[NG];
    grads_make(&p, g);
    KF_OK_(run_backward(&pl, &p, KF_GRAD_OVERWRITE, g));
    for (int i = 0; i < NG; i++) {
        if (n[i] == 0) continue;
        const double e = ref_rel_err_f64(g[i], want[i], n[i]);
        cr_expect(e < TOL, "%s: rel err %.3g (%s, %d threads)", names[i], e,
                  is_conv(s) ? "conv2d" : "linear", threads);
    }
    /* KF_GRAD_ACCUMULATE adds to what the buffers hold (dx is overwritten all the same). */
    double *acc[NG];
    grads_make(&p, acc);
    const double start[NG] = {0.0, 0.5, -0.25, 2.0};
    for (int i = GBW; i < NG; i++)
        for (int64_t e = 0; e < n[i]; e++) acc[i][e] = start[i], want[i][e] += start[i];
    KF_OK_(run_backward(&pl, &p, KF_GRAD_ACCUMULATE, acc));
    for (int i = 0; i < NG; i++)
        if (n[i])
            cr_expect(ref_rel_err_f64(acc[i], want[i], n[i]) < TOL, "accumulate: %s", names[i]);
    grads_free(acc), grads_free(g), grads_free(want);
    free(drows), free(y), free(rows), free(yr);
    plans_destroy(&pl);
    kf_context_destroy(ctx);
    free_prob(&p);
}

/* KANLinear: B rows of Cin features (kh = 0). */
#define LIN(N, in, out, G, k, scaled, base, rnd) \
    {N, in, 1, 1, out, 0, 0, 1, 1, 0, 0, 1, 1, G, k, scaled, base, rnd}

static const shape kShapes[] = {
    LIN(5, 3, 4, 1, 0, 1, 1, 0),       /* G = 1, k = 0 */
    LIN(12, 6, 5, 3, 1, 0, 1, 1),      /* no scaler */
    LIN(1, 9, 7, 5, 3, 1, 0, 1),       /* batch 1, no base_weight */
    LIN(20, 17, 9, 5, 3, 1, 1, 0),     /* efficient-kan's defaults */
    LIN(260, 40, 23, 8, 3, 1, 1, 1),   /* a team: 3 row blocks, several feature chunks */
    LIN(130, 61, 37, 5, 2, 0, 0, 0),   /* 2 row blocks, no scaler, no base_weight */
    /* KANConv2d: B, Cin, H, W, out, kh, kw, sh, sw, ph, pw, dh, dw, G, k, scaled, base, rnd */
    {2, 3, 7, 6, 4, 3, 3, 1, 1, 0, 0, 1, 1, 5, 3, 1, 1, 0},
    {2, 2, 9, 8, 3, 3, 2, 2, 1, 1, 0, 1, 1, 4, 2, 0, 1, 1},   /* stride 2 x 1, padding 1 x 0 */
    {1, 2, 11, 10, 5, 3, 3, 1, 2, 2, 1, 2, 1, 5, 3, 1, 0, 1}, /* dilation 2, no base_weight */
    {3, 4, 14, 13, 6, 3, 3, 1, 1, 1, 1, 1, 1, 5, 3, 1, 1, 0}, /* 182 pixels: 2 row blocks */
    {2, 5, 6, 6, 3, 1, 1, 1, 1, 0, 0, 1, 1, 3, 0, 0, 1, 1},   /* 1x1 kernel, k = 0 */
};

ParameterizedTestParameters(kan_f64, matches_reference) {
    return cr_make_param_array(shape, kShapes, sizeof kShapes / sizeof kShapes[0]);
}

ParameterizedTest(const shape *s, kan_f64, matches_reference) {
    check_against_reference(s, 1);
    check_against_reference(s, 2);
}

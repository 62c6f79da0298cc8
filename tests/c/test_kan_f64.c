/* kf_kan_linear_* and kf_kan_conv2d_* in float64 on the CPU backend, through the public header
 * only, against the float64 reference of tests/c/ref_kan.c (efficient-kan's math: the full
 * Cox-de Boor recurrence, its derivative by forward mode); KANConv2d's patches unfolded here by
 * naive loops (zeros in the padding, unfold's feature order) and dx folded back by the same
 * loops. Inputs straddle the grid ([-1.4, 1.4] against [-1, 1]); grids uniform (the library's,
 * checked against the formula in float64) or sorted random per feature; weights at a fan-in
 * scale, never zeros; every output poisoned (NaN) before each call; ||out - ref|| / ||ref|| <
 * 1e-12, forward, dx and every parameter gradient, overwritten and accumulated, on 1 and 2
 * threads, and on a CUDA context (cuda/plain.cu; device copies of every tensor; skipped without a
 * usable device). The grid update in float64: the knots against the formula in float64, the refit by
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
    p.x = ref_new_uniform_f64(&r, p.nx, 1.4);
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
    p.bw0 = ref_new_uniform_f64(&r, n_oi(&p), b);
    p.bw = s->base ? p.bw0 : NULL;
    if (!s->base) memset(p.bw0, 0, (size_t)n_oi(&p) * sizeof *p.bw0); /* the reference's */
    p.sw = ref_new_uniform_f64(&r, n_oic(&p), b);
    p.sc = s->scaled ? ref_new_uniform_f64(&r, n_oi(&p), 1.0) : NULL;
    p.dy = ref_new_uniform_f64(&r, p.ny, 1.0);
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

/* The inputs the args of KANLinear and KANConv2d share by name: x and the parameters t. */
#define SET_INPUTS(a, xt, t)                                                                   \
    ((a).x = (xt), (a).grid = (t)->grid, (a).base_weight = (t)->bw,                           \
     (a).spline_weight = (t)->sw, (a).spline_scaler = (t)->sc)

static kf_status run_forward(const plans *pl, const prob *p, const params *t, kf_tensor x,
                             kf_tensor y, void *ws, size_t ws_bytes) {
    if (pl->lin) {
        kf_kan_linear_forward_args a;
        kf_kan_linear_forward_args_init(&a);
        SET_INPUTS(a, x, t), a.y = y;
        return kf_kan_linear_forward(pl->lin, &a, ws, ws_bytes);
    }
    kf_kan_conv2d_forward_args a;
    kf_kan_conv2d_forward_args_init(&a);
    SET_INPUTS(a, x, t), a.y = y;
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
    for (int i = 0; i < NG; i++) g[i] = n[i] ? ref_new_nans_f64(n[i]) : NULL;
}

static void grads_free(double *g[NG]) {
    for (int i = 0; i < NG; i++) free(g[i]);
}

/* Backward of either layer from x, dy and the gradient tensors d[NG] (absent: not wanted). */
#define SET_GRADS(a, dyt, d)                                                                   \
    ((a).dy = (dyt), (a).dx = (d)[GX], (a).dbase_weight = (d)[GBW],                           \
     (a).dspline_weight = (d)[GSW], (a).dspline_scaler = (d)[GSC])

static kf_status backward_call(const plans *pl, const params *t, kf_tensor x, kf_tensor dy,
                               kf_grad_mode mode, const kf_tensor d[NG]) {
    if (pl->lin) {
        kf_kan_linear_backward_args a;
        kf_kan_linear_backward_args_init(&a);
        SET_INPUTS(a, x, t), SET_GRADS(a, dy, d);
        return kf_kan_linear_backward(pl->lin, mode, &a, NULL, 0);
    }
    kf_kan_conv2d_backward_args a;
    kf_kan_conv2d_backward_args_init(&a);
    SET_INPUTS(a, x, t), SET_GRADS(a, dy, d);
    return kf_kan_conv2d_backward(pl->conv, mode, &a, NULL, 0);
}

static kf_status run_backward(const plans *pl, const prob *p, kf_grad_mode mode, double *g[NG]) {
    const params t = params_of(p);
    kf_tensor d[NG] = {x_tensor(p, g[GX]), {0}, {0}, {0}};
    if (g[GBW]) d[GBW] = dt(g[GBW], 2, (int64_t[]){p->s.out, p->F});
    d[GSW] = dt(g[GSW], 3, (int64_t[]){p->s.out, p->F, p->C});
    if (g[GSC]) d[GSC] = dt(g[GSC], 2, (int64_t[]){p->s.out, p->F});
    return backward_call(pl, &t, x_tensor(p, p->x), y_tensor(p, p->dy), mode, d);
}

/* ---- forward and backward against the reference ------------------------------------------- */

/* p's tensors where a `dev` context reads them (kf_test.h's place_f64); rows and dyr (the
 * reference's) stay on the host. */
static prob placed(kf_device_type dev, prob *p) {
    prob d = *p;
    d.x = place_f64(dev, p->x, p->nx), d.dy = place_f64(dev, p->dy, p->ny);
    d.grid = place_f64(dev, p->grid, p->F * p->nk), d.sw = place_f64(dev, p->sw, n_oic(p));
    d.bw = place_f64(dev, p->bw, n_oi(p)), d.sc = place_f64(dev, p->sc, n_oi(p));
    return d;
}

static void unplace_prob(kf_device_type dev, prob *d) {
    void *v[] = {d->x, d->dy, d->grid, d->sw, d->bw, d->sc};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) unplace(dev, v[i]);
}

/* A backward on `dev` into the host gradients g (their contents, NaN or the values accumulated
 * onto, go to the device and the results come back). */
static void backward_on(kf_device_type dev, kf_context *ctx, const plans *pl, const prob *pd,
                        const int64_t n[NG], kf_grad_mode mode, double *g[NG]) {
    double *gd[NG];
    for (int i = 0; i < NG; i++) gd[i] = place_f64(dev, g[i], n[i]);
    KF_OK_(run_backward(pl, pd, mode, gd));
    KF_OK_(kf_context_synchronize(ctx));
    for (int i = 0; i < NG; i++) fetch_f64(dev, g[i], gd[i], n[i]), unplace(dev, gd[i]);
}

/* Forward, backward and accumulated backward on a `dev` context (CPU: `threads` threads; CUDA:
 * device copies of every tensor; the test skips where no device is usable) against the
 * reference. */
static void check_against_reference(const shape *s, kf_device_type dev, int32_t threads) {
    prob p = make_prob(s, (uint64_t)(s->B * 131 + s->Cin * 17 + s->out * 7 + s->kh));
    kf_context *ctx = make_ctx(dev, threads);
    prob pd = placed(dev, &p);
    plans pl;
    KF_OK_(plan_of(ctx, s, KF_DTYPE_F64, &pl));
    const params t = params_of(&pd);
    double *y = ref_new_nans_f64(p.ny), *rows = malloc((size_t)p.ny * sizeof *rows);
    double *yr = malloc((size_t)p.ny * sizeof *yr);
    double *yd = place_f64(dev, y, p.ny);
    KF_OK_(run_forward(&pl, &pd, &t, x_tensor(&pd, pd.x), y_tensor(&pd, yd), NULL, 0));
    KF_OK_(kf_context_synchronize(ctx));
    fetch_f64(dev, y, yd, p.ny), unplace(dev, yd);
    ref_kan_forward(&p.c, p.rows, p.grid, p.bw0, p.sw, p.sc, rows);
    for (int64_t n = 0; n < p.N; n++)
        for (int64_t o = 0; o < s->out; o++) yr[y_index(&p, n, o)] = rows[n * s->out + o];
    const double ey = ref_rel_err_f64(y, yr, p.ny);
    const char *on = dev == KF_DEVICE_CUDA ? "cuda" : "cpu";
    cr_expect(ey < TOL, "y: rel err %.3g (%s, F %lld, out %lld, %s, %d threads)", ey,
              is_conv(s) ? "conv2d" : "linear", (long long)p.F, (long long)s->out, on, threads);

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
    backward_on(dev, ctx, &pl, &pd, n, KF_GRAD_OVERWRITE, g);
    for (int i = 0; i < NG; i++) {
        if (n[i] == 0) continue;
        const double e = ref_rel_err_f64(g[i], want[i], n[i]);
        cr_expect(e < TOL, "%s: rel err %.3g (%s, %s, %d threads)", names[i], e,
                  is_conv(s) ? "conv2d" : "linear", on, threads);
    }
    /* KF_GRAD_ACCUMULATE adds to what the buffers hold (dx is overwritten all the same). */
    double *acc[NG];
    grads_make(&p, acc);
    const double start[NG] = {0.0, 0.5, -0.25, 2.0};
    for (int i = GBW; i < NG; i++)
        for (int64_t e = 0; e < n[i]; e++) acc[i][e] = start[i], want[i][e] += start[i];
    backward_on(dev, ctx, &pl, &pd, n, KF_GRAD_ACCUMULATE, acc);
    for (int i = 0; i < NG; i++)
        if (n[i])
            cr_expect(ref_rel_err_f64(acc[i], want[i], n[i]) < TOL, "accumulate: %s", names[i]);
    grads_free(acc), grads_free(g), grads_free(want);
    free(drows), free(y), free(rows), free(yr);
    plans_destroy(&pl);
    kf_context_destroy(ctx);
    unplace_prob(dev, &pd);
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
    /* the windowed path (out >= 256; cpu/kan_linear.c kan_sparse_pick) */
    LIN(140, 9, 260, 10, 3, 1, 1, 1),  /* both directions, 2 row blocks */
    LIN(20, 7, 256, 20, 5, 0, 0, 1),   /* both directions, no scaler, no base_weight */
    LIN(30, 5, 270, 12, 4, 1, 1, 0),   /* both directions, k = 4 */
    LIN(15, 6, 530, 5, 3, 1, 1, 0),    /* forward only */
    /* KANConv2d: B, Cin, H, W, out, kh, kw, sh, sw, ph, pw, dh, dw, G, k, scaled, base, rnd */
    {2, 3, 7, 6, 4, 3, 3, 1, 1, 0, 0, 1, 1, 5, 3, 1, 1, 0},
    {2, 2, 9, 8, 3, 3, 2, 2, 1, 1, 0, 1, 1, 4, 2, 0, 1, 1},   /* stride 2 x 1, padding 1 x 0 */
    {1, 2, 11, 10, 5, 3, 3, 1, 2, 2, 1, 2, 1, 5, 3, 1, 0, 1}, /* dilation 2, no base_weight */
    {3, 4, 14, 13, 6, 3, 3, 1, 1, 1, 1, 1, 1, 5, 3, 1, 1, 0}, /* 182 pixels: 2 row blocks */
    {2, 5, 6, 6, 3, 1, 1, 1, 1, 0, 0, 1, 1, 3, 0, 0, 1, 1},   /* 1x1 kernel, k = 0 */
    {2, 2, 9, 8, 256, 3, 3, 2, 1, 1, 0, 1, 2, 10, 1, 1, 1, 1}, /* windowed, both directions */
};

ParameterizedTestParameters(kan_f64, matches_reference) {
    return cr_make_param_array(shape, kShapes, sizeof kShapes / sizeof kShapes[0]);
}

ParameterizedTest(const shape *s, kan_f64, matches_reference) {
    check_against_reference(s, KF_DEVICE_CPU, 1);
    check_against_reference(s, KF_DEVICE_CPU, 2);
}

/* The CUDA backend's float64 plans (cuda/plain.cu), the same shapes; skips without a usable
 * device. */
ParameterizedTestParameters(kan_f64, cuda_matches_reference) {
    return cr_make_param_array(shape, kShapes, sizeof kShapes / sizeof kShapes[0]);
}

ParameterizedTest(const shape *s, kan_f64, cuda_matches_reference) {
    check_against_reference(s, KF_DEVICE_CUDA, 0);
}

/* ---- the grid update ---------------------------------------------------------------------- */

static kf_status run_update(const plans *pl, const prob *p, kf_tensor x, double *grid, double *sw,
                            float margin, float eps, int32_t rule) {
    kf_kan_update_grid_args a;
    kf_kan_update_grid_args_init(&a);
    a.x = x;
    a.grid = dt(grid, 2, (int64_t[]){p->F, p->nk});
    a.spline_weight = dt(sw, 3, (int64_t[]){p->s.out, p->F, p->C});
    a.margin = margin, a.grid_eps = eps, a.quantile_rule = rule;
    return pl->lin ? kf_kan_linear_update_grid(pl->lin, &a)
                   : kf_kan_conv2d_update_grid(pl->conv, &a);
}

/* The knots kfuse.h gives for feature f's M samples (column f of `rows`), formed in float64 in
 * torch's order from the float32 margin and grid_eps; quantile indices by torch 2's linspace,
 * which is torch 1.13's too for G + 1 < 8 indices. */
static void expected_knots(const prob *p, int64_t f, float margin, float eps, double *t) {
    const int64_t M = p->N, G = p->s.G, k = p->s.k;
    double *s = malloc((size_t)M * sizeof *s);
    for (int64_t n = 0; n < M; n++) s[n] = p->rows[n * p->F + f];
    qsort(s, (size_t)M, sizeof *s, cmp_double);
    const double mg = margin, e = eps, step = (double)(M - 1) / (double)G;
    const double h = ((s[M - 1] - s[0]) + 2.0 * mg) / (double)G;
    for (int64_t j = 0; j <= G; j++) {
        const int64_t a = j < (G + 1) / 2 ? (int64_t)(step * (double)j)
                                          : (int64_t)((double)(M - 1) - step * (double)(G - j));
        t[k + j] = e * (((double)j * h + s[0]) - mg) + (1.0 - e) * s[a];
    }
    for (int64_t m = 1; m <= k; m++) {
        t[k - m] = t[k] - h * (double)m;
        t[k + G + m] = t[k + G] + h * (double)m;
    }
    free(s);
}

/* max over outputs of |B1^T (B1 X - U)| / |B1^T U| for feature f: the normal equations of the
 * refit (B1 the new bases at the samples, U the old splines there, X the new coefficients), 0
 * for the least-squares solution up to rounding. */
static double normal_eq_residual(const prob *p, int64_t f, const double *grid1, const double *sw1) {
    const int64_t N = p->N, C = p->C, G = p->s.G, k = p->s.k, nk = p->nk, out = p->s.out;
    double *B1 = malloc((size_t)(N * C) * sizeof *B1), *U = malloc((size_t)(N * out) * sizeof *U);
    double *b = malloc((size_t)C * sizeof *b), worst = 0.0;
    for (int64_t n = 0; n < N; n++) {
        const double v = p->rows[n * p->F + f];
        ref_kan_bases(G, k, p->grid + f * nk, v, b, NULL);
        for (int64_t o = 0; o < out; o++) {
            double acc = 0.0;
            for (int64_t c = 0; c < C; c++) acc += b[c] * p->sw[(o * p->F + f) * C + c];
            U[n * out + o] = acc;
        }
        ref_kan_bases(G, k, grid1 + f * nk, v, B1 + n * C, NULL);
    }
    for (int64_t o = 0; o < out; o++) {
        double gmax = 0.0, rhs = 1e-300;
        for (int64_t c = 0; c < C; c++) {
            double g = 0.0, bu = 0.0;
            for (int64_t n = 0; n < N; n++) {
                double r = -U[n * out + o];
                for (int64_t d = 0; d < C; d++) r += B1[n * C + d] * sw1[(o * p->F + f) * C + d];
                g += B1[n * C + c] * r, bu += B1[n * C + c] * U[n * out + o];
            }
            gmax = fmax(gmax, fabs(g)), rhs = fmax(rhs, fabs(bu));
        }
        worst = fmax(worst, gmax / rhs);
    }
    free(B1), free(U), free(b);
    return worst;
}

static void check_update(const shape *s, float margin, float eps, int32_t rule) {
    prob p = make_prob(s, 99 + (uint64_t)s->kh);
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    plans pl;
    KF_OK_(plan_of(ctx, s, KF_DTYPE_F64, &pl));
    const size_t gb = (size_t)(p.F * p.nk) * sizeof(double),
                 wb = (size_t)n_oic(&p) * sizeof(double);
    double *g1 = malloc(gb), *w1 = malloc(wb), *t = malloc((size_t)p.nk * sizeof *t);
    memcpy(g1, p.grid, gb), memcpy(w1, p.sw, wb);
    KF_OK_(run_update(&pl, &p, x_tensor(&p, p.x), g1, w1, margin, eps, rule));
    for (int64_t f = 0; f < p.F; f++) {
        expected_knots(&p, f, margin, eps, t);
        for (int64_t j = 0; j < p.nk; j++)
            cr_expect(fabs(g1[f * p.nk + j] - t[j]) <= 1e-14 * (1.0 + fabs(t[j])),
                      "feature %lld knot %lld: %.17g, expected %.17g", (long long)f, (long long)j,
                      g1[f * p.nk + j], t[j]);
        const double r = normal_eq_residual(&p, f, g1, w1);
        cr_expect(r < TOL, "feature %lld: normal equations residual %.3g", (long long)f, r);
    }
    if (pl.conv) { /* the same update as KANLinear's on the unfolded patches */
        shape ls = *s;
        ls.kh = 0, ls.Cin = p.F, ls.B = p.N;
        plans lp;
        KF_OK_(plan_of(ctx, &ls, KF_DTYPE_F64, &lp));
        double *g2 = malloc(gb), *w2 = malloc(wb);
        memcpy(g2, p.grid, gb), memcpy(w2, p.sw, wb);
        KF_OK_(run_update(&lp, &p, dt(p.rows, 2, (int64_t[]){p.N, p.F}), g2, w2, margin, eps,
                          rule));
        cr_expect(memcmp(g1, g2, gb) == 0, "the knots differ from KANLinear's on the patches");
        cr_expect(ref_rel_err_f64(w1, w2, n_oic(&p)) < TOL, "the coefficients differ");
        free(g2), free(w2);
        plans_destroy(&lp);
    }
    free(g1), free(w1), free(t);
    plans_destroy(&pl);
    kf_context_destroy(ctx);
    free_prob(&p);
}

Test(kan_f64, update_grid) {
    const shape lin = LIN(40, 3, 4, 5, 3, 1, 1, 0), lin_k1 = LIN(57, 2, 3, 4, 1, 0, 1, 1);
    const shape conv = {2, 2, 7, 6, 3, 3, 2, 2, 1, 1, 0, 1, 2, 5, 3, 1, 1, 0};
    check_update(&lin, 0.01f, 0.02f, KF_KAN_QUANTILES_TORCH1);
    check_update(&lin, 0.05f, 0.5f, KF_KAN_QUANTILES_TORCH2);
    check_update(&lin_k1, 0.0f, 1.0f, KF_KAN_QUANTILES_TORCH2); /* pure uniform */
    check_update(&lin_k1, 0.2f, 0.0f, KF_KAN_QUANTILES_TORCH1); /* pure quantiles */
    check_update(&conv, 0.01f, 0.02f, KF_KAN_QUANTILES_TORCH1);
}

/* On a CUDA context the update runs the same host algorithm on staged copies (capi/src/kan_grid.c):
 * the knots and coefficients are the CPU context's, bit for bit; skipped without a device. */
Test(kan_f64, cuda_update_grid_matches_cpu) {
    kf_context *gpu = make_ctx(KF_DEVICE_CUDA, 0), *cpu = make_ctx(KF_DEVICE_CPU, 1);
    const shape cases[] = {LIN(40, 3, 4, 5, 3, 1, 1, 0),
                           {2, 2, 7, 6, 3, 3, 2, 2, 1, 1, 0, 1, 2, 5, 3, 1, 1, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        prob p = make_prob(&cases[i], 7 + i);
        const size_t gb = (size_t)(p.F * p.nk) * sizeof(double),
                     wb = (size_t)n_oic(&p) * sizeof(double);
        double *g[2] = {malloc(gb), malloc(gb)}, *w[2] = {malloc(wb), malloc(wb)};
        for (int d = 0; d < 2; d++) {
            const kf_device_type dev = d ? KF_DEVICE_CUDA : KF_DEVICE_CPU;
            plans pl;
            KF_OK_(plan_of(d ? gpu : cpu, &cases[i], KF_DTYPE_F64, &pl));
            memcpy(g[d], p.grid, gb), memcpy(w[d], p.sw, wb);
            double *xd = place_f64(dev, p.x, p.nx), *gd = place_f64(dev, g[d], p.F * p.nk),
                   *wd = place_f64(dev, w[d], n_oic(&p));
            KF_OK_(run_update(&pl, &p, x_tensor(&p, xd), gd, wd, 0.01f, 0.02f,
                              KF_KAN_QUANTILES_TORCH1));
            KF_OK_(kf_context_synchronize(d ? gpu : cpu));
            fetch_f64(dev, g[d], gd, p.F * p.nk), fetch_f64(dev, w[d], wd, n_oic(&p));
            unplace(dev, xd), unplace(dev, gd), unplace(dev, wd);
            plans_destroy(&pl);
        }
        cr_expect(memcmp(g[0], g[1], gb) == 0, "case %zu: the CUDA context's knots differ", i);
        cr_expect(memcmp(w[0], w[1], wb) == 0, "case %zu: the CUDA context's coefficients differ",
                  i);
        free(g[0]), free(g[1]), free(w[0]), free(w[1]);
        free_prob(&p);
    }
    kf_context_destroy(cpu);
    kf_context_destroy(gpu);
}

/* ---- sizes and errors --------------------------------------------------------------------- */

/* The workspace query counts float64 elements: more bytes than float32 needs, and a call runs
 * in a caller buffer of exactly that size but not in one a byte short; with the arena, repeated
 * calls do not grow it. */
Test(kan_f64, workspace_is_sized_in_float64) {
    const shape s = LIN(300, 29, 70, 5, 3, 1, 1, 0);
    prob p = make_prob(&s, 5);
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 2);
    plans p64, p32;
    KF_OK_(plan_of(ctx, &s, KF_DTYPE_F64, &p64));
    KF_OK_(plan_of(ctx, &s, KF_DTYPE_F32, &p32));
    size_t b64 = 0, b32 = 0;
    KF_OK_(kf_kan_linear_workspace_size(p64.lin, p.N, &b64));
    KF_OK_(kf_kan_linear_workspace_size(p32.lin, p.N, &b32));
    cr_expect(b64 > b32 && b64 <= 2 * b32 + 64 * 16, "float64 %zu bytes, float32 %zu", b64, b32);
    const params t = params_of(&p);
    double *y = ref_new_nans_f64(p.ny), *yr = ref_new_nans_f64(p.ny);
    void *ws = xalloc(b64);
    KF_OK_(run_forward(&p64, &p, &t, x_tensor(&p, p.x), y_tensor(&p, y), ws, b64));
    KF_OK_(run_forward(&p64, &p, &t, x_tensor(&p, p.x), y_tensor(&p, yr), NULL, 0));
    cr_expect(memcmp(y, yr, (size_t)p.ny * sizeof *y) == 0, "caller workspace vs the arena");
    for (int64_t i = 0; i < p.ny; i++) y[i] = NAN;
    EXPECT_FAIL(run_forward(&p64, &p, &t, x_tensor(&p, p.x), y_tensor(&p, y), ws, b64 - 1),
                KF_ERR_WORKSPACE_TOO_SMALL, "workspace");
    cr_expect(isnan(y[0]) && isnan(y[p.ny - 1]), "y written by a refused call");
    double *g[NG];
    grads_make(&p, g);
    KF_OK_(run_backward(&p64, &p, KF_GRAD_OVERWRITE, g));
    uint64_t grow0 = 0, grow1 = 0;
    KF_OK_(kf_context_arena_info(ctx, NULL, &grow0));
    for (int i = 0; i < 3; i++) {
        KF_OK_(run_forward(&p64, &p, &t, x_tensor(&p, p.x), y_tensor(&p, y), NULL, 0));
        KF_OK_(run_backward(&p64, &p, KF_GRAD_ACCUMULATE, g));
    }
    KF_OK_(kf_context_arena_info(ctx, NULL, &grow1));
    cr_expect(grow0 == grow1, "arena grew in steady state (%llu -> %llu)",
              (unsigned long long)grow0, (unsigned long long)grow1);
    grads_free(g);
    free(ws), free(y), free(yr);
    plans_destroy(&p64), plans_destroy(&p32);
    kf_context_destroy(ctx);
    free_prob(&p);
}

/* A float64 plan refuses a float32 tensor (and a float32 plan a float64 one), naming it, and
 * writes nothing: forward, backward and the grid update, both layers. */
static void check_mismatch(const shape *s) {
    prob p = make_prob(s, 3);
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    plans pl, p32;
    KF_OK_(plan_of(ctx, s, KF_DTYPE_F64, &pl));
    KF_OK_(plan_of(ctx, s, KF_DTYPE_F32, &p32));
    float *f32 = poisoned(p.nx + p.ny + n_oic(&p) + p.F * p.nk);
    double *y = ref_new_nans_f64(p.ny);
    const kf_tensor x = x_tensor(&p, p.x), yt = y_tensor(&p, y);
    kf_tensor x32 = x, y32 = yt;
    x32.dtype = KF_DTYPE_F32, x32.data = f32, y32.dtype = KF_DTYPE_F32, y32.data = f32;
    const params t = params_of(&p);
    EXPECT_FAIL(run_forward(&pl, &p, &t, x32, yt, NULL, 0), KF_ERR_INVALID_ARGUMENT,
                "args->x.dtype");
    EXPECT_FAIL(run_forward(&pl, &p, &t, x, y32, NULL, 0), KF_ERR_INVALID_ARGUMENT,
                "args->y.dtype");
    kf_tensor xc = x; /* a code no kf_dtype has (a front end's complex type): named by number */
    xc.dtype = 0;
    EXPECT_FAIL(run_forward(&pl, &p, &t, xc, yt, NULL, 0), KF_ERR_INVALID_ARGUMENT,
                "args->x.dtype = 0 (no kf_dtype has that value), expected KF_DTYPE_F64");
    params bad = t;
    bad.sw.dtype = KF_DTYPE_F32, bad.sw.data = f32;
    EXPECT_FAIL(run_forward(&pl, &p, &bad, x, yt, NULL, 0), KF_ERR_INVALID_ARGUMENT,
                "args->spline_weight.dtype");
    EXPECT_FAIL(run_forward(&p32, &p, &t, x32, y32, NULL, 0), KF_ERR_INVALID_ARGUMENT,
                "args->grid.dtype");
    for (int64_t i = 0; i < p.ny; i++) cr_expect(isnan(y[i]), "y[%lld] written", (long long)i);
    double *g[NG];
    grads_make(&p, g);
    const kf_tensor d[NG] = {x_tensor(&p, g[GX]), {0}, {0}, {0}};
    EXPECT_FAIL(backward_call(&pl, &t, x, y32, KF_GRAD_OVERWRITE, d), KF_ERR_INVALID_ARGUMENT,
                "args->dy.dtype"); /* dy in float32 */
    for (int64_t i = 0; i < p.nx; i++) cr_expect(isnan(g[GX][i]), "dx[%lld] written", (long long)i);
    grads_free(g);
    /* the grid update: a float32 grid on a float64 plan; grid and spline_weight untouched */
    double *w1 = malloc((size_t)n_oic(&p) * 8);
    memcpy(w1, p.sw, (size_t)n_oic(&p) * 8);
    kf_kan_update_grid_args a;
    kf_kan_update_grid_args_init(&a);
    a.x = x, a.grid = t.grid, a.spline_weight = dt(w1, 3, (int64_t[]){s->out, p.F, p.C});
    a.grid.dtype = KF_DTYPE_F32, a.grid.data = f32;
    EXPECT_FAIL(pl.lin ? kf_kan_linear_update_grid(pl.lin, &a)
                       : kf_kan_conv2d_update_grid(pl.conv, &a),
                KF_ERR_INVALID_ARGUMENT, "args->grid.dtype");
    cr_expect(memcmp(w1, p.sw, (size_t)n_oic(&p) * 8) == 0, "spline_weight written");
    free(w1), free(f32), free(y);
    plans_destroy(&pl), plans_destroy(&p32);
    kf_context_destroy(ctx);
    free_prob(&p);
}

Test(kan_f64, dtype_mismatch_names_the_argument) {
    const shape lin = LIN(6, 4, 3, 5, 3, 1, 1, 0);
    const shape conv = {2, 2, 5, 5, 3, 3, 3, 1, 1, 1, 1, 1, 1, 5, 3, 1, 1, 0};
    check_mismatch(&lin);
    check_mismatch(&conv);
}

/* Integer dtypes are refused at plan creation, naming the field (float16 and bfloat16:
 * tests/c/test_lowp.c). */
Test(kan_f64, other_dtypes_unsupported) {
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    const shape lin = LIN(1, 4, 3, 5, 3, 1, 1, 0);
    const shape conv = {1, 2, 5, 5, 3, 3, 3, 1, 1, 1, 1, 1, 1, 5, 3, 1, 1, 0};
    const int32_t bad[] = {KF_DTYPE_I32, KF_DTYPE_I64};
    for (size_t i = 0; i < 2; i++) {
        plans pl;
        EXPECT_FAIL(plan_of(ctx, &lin, bad[i], &pl), KF_ERR_UNSUPPORTED, "desc->dtype");
        cr_expect(pl.lin == NULL);
        EXPECT_FAIL(plan_of(ctx, &conv, bad[i], &pl), KF_ERR_UNSUPPORTED, "desc->dtype");
        cr_expect(pl.conv == NULL);
    }
    kf_context_destroy(ctx);
}

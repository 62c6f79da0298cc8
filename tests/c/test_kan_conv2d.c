/* kf_kan_conv2d_* on the CPU backend, through the public header only, against a float64
 * reference built here from its definition: the patches of x unfolded by naive loops (zeros in
 * the padding, torch.nn.functional.unfold's feature order), KANLinear on them by the float64
 * reference of tests/c/ref_kan.c (efficient-kan's math), the output permuted to [B, out, Ho, Wo],
 * and dx folded back from the patches' gradients by the same naive loops (col2im). Inputs straddle
 * the grid ([-1.4, 1.4] against [-1, 1]); grids uniform or sorted random per feature; weights at a
 * fan-in scale; every output poisoned (NaN) before each call; ||out - ref|| / ||ref|| < 1e-5.
 * Shapes cover stride 2, padding 1, dilation 2, odd and non-square images and kernels, 1x1
 * kernels, batch 1, an unbatched 3-D x, images smaller than a row block and larger than one. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kfuse.h"
#include "kan_grads.h"
#include "kf_test.h"
#include "ref_kan.h"
#include "ref_rnn.h"

#define TOL 1e-5

typedef struct shape {
    int64_t B, Cin, H, W, out;
    int32_t kh, kw, sh, sw, ph, pw, dh, dw;
    int32_t G, k;
    int scaled, unbatched, random_grid;
} shape;

/* One problem: the shape, its derived extents, float32 inputs and their float64 copies. */
typedef struct prob {
    shape s;
    int64_t F, C, nk, Ho, Wo, N, nx, ny;
    ref_kan_cfg c; /* the per-patch KANLinear: N rows of F features */
    float *x, *grid, *bw, *sw, *sc, *dy;
    double *grid64, *bw64, *sw64, *sc64;
} prob;

static int64_t n_oi(const prob *p) { return p->s.out * p->F; }
static int64_t n_oic(const prob *p) { return p->s.out * p->F * p->C; }

static kf_kan_conv2d_plan *make_plan(kf_context *ctx, const shape *s) {
    kf_kan_conv2d_desc d;
    kf_kan_conv2d_desc_init(&d);
    d.in_channels = s->Cin, d.out_channels = s->out;
    d.kernel_h = s->kh, d.kernel_w = s->kw, d.stride_h = s->sh, d.stride_w = s->sw;
    d.pad_h = s->ph, d.pad_w = s->pw, d.dilation_h = s->dh, d.dilation_w = s->dw;
    d.grid_size = s->G, d.spline_order = s->k, d.standalone_scale = s->scaled;
    kf_kan_conv2d_plan *plan = NULL;
    KF_OK_(kf_kan_conv2d_plan_create(ctx, &d, &plan));
    return plan;
}

static float *fill(ref_rng *r, int64_t n, double bound) {
    float *v = malloc((size_t)n * sizeof *v);
    ref_fill_uniform_f32(r, v, n, -bound, bound);
    return v;
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static prob make_prob(const shape *s, uint64_t seed) {
    prob p = {.s = *s};
    p.F = s->Cin * s->kh * s->kw, p.C = s->G + s->k, p.nk = s->G + 2 * s->k + 1;
    p.Ho = (s->H + 2 * s->ph - s->dh * (s->kh - 1) - 1) / s->sh + 1;
    p.Wo = (s->W + 2 * s->pw - s->dw * (s->kw - 1) - 1) / s->sw + 1;
    p.N = s->B * p.Ho * p.Wo, p.nx = s->B * s->Cin * s->H * s->W, p.ny = s->B * s->out * p.Ho * p.Wo;
    p.c = (ref_kan_cfg){.N = p.N, .in = p.F, .out = s->out, .G = s->G, .k = s->k};
    ref_rng r;
    ref_rng_seed(&r, seed);
    p.x = fill(&r, p.nx, 1.4);
    p.grid = malloc((size_t)(p.F * p.nk) * sizeof(float));
    if (s->random_grid) {
        for (int64_t f = 0; f < p.F; f++) {
            ref_fill_uniform_f32(&r, p.grid + f * p.nk, p.nk, -1.5, 1.5);
            qsort(p.grid + f * p.nk, (size_t)p.nk, sizeof(float), cmp_float);
            if (s->random_grid == 2 && f % 2) /* pairs of features share their knots */
                memcpy(p.grid + f * p.nk, p.grid + (f - 1) * p.nk, (size_t)p.nk * sizeof(float));
        }
    } else {
        kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
        kf_kan_conv2d_plan *plan = make_plan(ctx, s);
        kf_tensor g = t3(p.grid, 2, p.F, p.nk, 0);
        KF_OK_(kf_kan_conv2d_uniform_grid(plan, -1.0f, 1.0f, &g));
        kf_kan_conv2d_plan_destroy(plan);
        kf_context_destroy(ctx);
    }
    const double b = 1.0 / sqrt((double)p.F);
    p.bw = fill(&r, n_oi(&p), b);
    p.sw = fill(&r, n_oic(&p), b);
    p.sc = s->scaled ? fill(&r, n_oi(&p), 1.0) : NULL;
    p.dy = fill(&r, p.ny, 1.0);
    p.grid64 = ref_to_f64(p.grid, p.F * p.nk);
    p.bw64 = ref_to_f64(p.bw, n_oi(&p));
    p.sw64 = ref_to_f64(p.sw, n_oic(&p));
    p.sc64 = s->scaled ? ref_to_f64(p.sc, n_oi(&p)) : NULL;
    return p;
}

static void free_prob(prob *p) {
    void *v[] = {p->x, p->grid, p->bw, p->sw, p->sc, p->dy, p->grid64, p->bw64, p->sw64, p->sc64};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) free(v[i]);
}

/* ---- the reference: naive unfold, KANLinear in float64, naive fold ------------------------- */

/* Offset in x of feature f of patch n, or -1 in the padding. */
static int64_t patch_src(const prob *p, int64_t n, int64_t f) {
    const shape *s = &p->s;
    const int64_t b = n / (p->Ho * p->Wo), oh = n / p->Wo % p->Ho, ow = n % p->Wo;
    const int64_t c = f / (s->kh * s->kw), i = f / s->kw % s->kh, j = f % s->kw;
    const int64_t ih = oh * s->sh - s->ph + i * s->dh, iw = ow * s->sw - s->pw + j * s->dw;
    if (ih < 0 || ih >= s->H || iw < 0 || iw >= s->W) return -1;
    return ((b * s->Cin + c) * s->H + ih) * s->W + iw;
}

static double *ref_patches(const prob *p) {
    double *P = malloc((size_t)(p->N * p->F) * sizeof *P);
    for (int64_t n = 0; n < p->N; n++)
        for (int64_t f = 0; f < p->F; f++) {
            const int64_t src = patch_src(p, n, f);
            P[n * p->F + f] = src < 0 ? 0.0 : (double)p->x[src];
        }
    return P;
}

/* [B, out, Ho, Wo] <-> rows [N, out]. */
static int64_t img_index(const prob *p, int64_t n, int64_t o) {
    const int64_t L = p->Ho * p->Wo;
    return (n / L * p->s.out + o) * L + n % L;
}

static double *ref_forward(const prob *p) {
    double *P = ref_patches(p), *rows = malloc((size_t)(p->N * p->s.out) * sizeof *rows);
    ref_kan_forward(&p->c, P, p->grid64, p->bw64, p->sw64, p->sc64, rows);
    double *y = malloc((size_t)p->ny * sizeof *y);
    for (int64_t n = 0; n < p->N; n++)
        for (int64_t o = 0; o < p->s.out; o++) y[img_index(p, n, o)] = rows[n * p->s.out + o];
    free(P), free(rows);
    return y;
}

static ref_grads ref_backward(const prob *p) {
    double *P = ref_patches(p), *dyr = malloc((size_t)(p->N * p->s.out) * sizeof *dyr);
    for (int64_t n = 0; n < p->N; n++)
        for (int64_t o = 0; o < p->s.out; o++) dyr[n * p->s.out + o] = p->dy[img_index(p, n, o)];
    double *dP = malloc((size_t)(p->N * p->F) * sizeof *dP);
    ref_grads r = {calloc((size_t)p->nx, sizeof(double)), malloc((size_t)n_oi(p) * 8),
                   malloc((size_t)n_oic(p) * 8), p->s.scaled ? malloc((size_t)n_oi(p) * 8) : NULL};
    ref_kan_backward(&p->c, P, p->grid64, p->bw64, p->sw64, p->sc64, dyr, dP, r.dbw, r.dsw,
                     r.dsc);
    for (int64_t n = 0; n < p->N; n++)
        for (int64_t f = 0; f < p->F; f++) {
            const int64_t src = patch_src(p, n, f);
            if (src >= 0) r.dx[src] += dP[n * p->F + f];
        }
    free(P), free(dyr), free(dP);
    return r;
}

/* ---- calls through the public API --------------------------------------------------------- */

static int32_t img_nd(const prob *p) { return p->s.unbatched ? 3 : 4; }

/* A [B, ch, h, w] tensor (or [ch, h, w] when the problem is unbatched). */
static kf_tensor img_tensor(const prob *p, const float *data, int64_t ch, int64_t h, int64_t w) {
    int64_t sh[4] = {p->s.B, ch, h, w};
    const int32_t nd = img_nd(p);
    return tens((void *)data, KF_DTYPE_F32, nd, sh + 4 - nd);
}

static void set_params(const prob *p, kf_tensor *grid, kf_tensor *bw, kf_tensor *sw,
                       kf_tensor *sc) {
    *grid = t3(p->grid, 2, p->F, p->nk, 0);
    *bw = t3(p->bw, 2, p->s.out, p->F, 0);
    *sw = t3(p->sw, 3, p->s.out, p->F, p->C);
    if (p->s.scaled) *sc = t3(p->sc, 2, p->s.out, p->F, 0);
}

static kf_status run_forward(kf_kan_conv2d_plan *plan, const prob *p, float *y) {
    kf_kan_conv2d_forward_args a;
    kf_kan_conv2d_forward_args_init(&a);
    a.x = img_tensor(p, p->x, p->s.Cin, p->s.H, p->s.W);
    set_params(p, &a.grid, &a.base_weight, &a.spline_weight, &a.spline_scaler);
    a.y = img_tensor(p, y, p->s.out, p->Ho, p->Wo);
    return kf_kan_conv2d_forward(plan, &a, NULL, 0);
}

static kan_grad_sizes grad_sizes(const prob *p) {
    kan_grad_sizes n = {p->nx, n_oi(p), n_oic(p), p->s.scaled ? n_oi(p) : 0};
    return n;
}

static grads poisoned_grads(const prob *p) { return kan_poisoned_grads(grad_sizes(p)); }

static kf_status run_backward(kf_kan_conv2d_plan *plan, const prob *p, kf_grad_mode mode,
                              const grads *g) {
    kf_kan_conv2d_backward_args a;
    kf_kan_conv2d_backward_args_init(&a);
    a.x = img_tensor(p, p->x, p->s.Cin, p->s.H, p->s.W);
    set_params(p, &a.grid, &a.base_weight, &a.spline_weight, &a.spline_scaler);
    a.dy = img_tensor(p, p->dy, p->s.out, p->Ho, p->Wo);
    if (g->dx) a.dx = img_tensor(p, g->dx, p->s.Cin, p->s.H, p->s.W);
    if (g->dbw) a.dbase_weight = t3(g->dbw, 2, p->s.out, p->F, 0);
    if (g->dsw) a.dspline_weight = t3(g->dsw, 3, p->s.out, p->F, p->C);
    if (g->dsc) a.dspline_scaler = t3(g->dsc, 2, p->s.out, p->F, 0);
    return kf_kan_conv2d_backward(plan, mode, &a, NULL, 0);
}

/* ---- against the reference ---------------------------------------------------------------- */

static void describe(const shape *s, char *buf, size_t n) {
    snprintf(buf, n, "B %lld Cin %lld %lldx%lld out %lld k %dx%d s %d,%d p %d,%d d %d,%d G %d "
             "k %d scaled %d unbatched %d random %d", (long long)s->B, (long long)s->Cin,
             (long long)s->H, (long long)s->W, (long long)s->out, s->kh, s->kw, s->sh, s->sw,
             s->ph, s->pw, s->dh, s->dw, s->G, s->k, s->scaled, s->unbatched, s->random_grid);
}

static void check_against_reference(const shape *s, int32_t threads) {
    char what[256];
    describe(s, what, sizeof what);
    prob p = make_prob(s, (uint64_t)(s->B * 7919 + s->Cin * 131 + s->H * 17 + s->kh * 5 + s->G));
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, threads);
    kf_kan_conv2d_plan *plan = make_plan(ctx, s);
    float *y = poisoned(p.ny);
    KF_OK_(run_forward(plan, &p, y));
    double *yr = ref_forward(&p);
    double e = ref_rel_err_f32(y, yr, p.ny);
    cr_expect(e < TOL, "y: rel err %.3g (%s, %d threads)", e, what, (int)threads);

    grads g = poisoned_grads(&p);
    KF_OK_(run_backward(plan, &p, KF_GRAD_OVERWRITE, &g));
    ref_grads r = ref_backward(&p);
    char when[300];
    snprintf(when, sizeof when, "%s, %d threads", what, (int)threads);
    kan_expect_grads(&g, &r, grad_sizes(&p), TOL, when);
    /* KF_GRAD_ACCUMULATE adds into the parameter gradients; dx is overwritten all the same. */
    grads acc = kan_accumulate_start(grad_sizes(&p), &r);
    KF_OK_(run_backward(plan, &p, KF_GRAD_ACCUMULATE, &acc));
    snprintf(when, sizeof when, "accumulate: %s, %d threads", what, (int)threads);
    kan_expect_grads(&acc, &r, grad_sizes(&p), TOL, when);
    free_grads(&acc);
    free_grads(&g);
    free_ref_grads(&r);
    free(y), free(yr);
    kf_kan_conv2d_plan_destroy(plan);
    kf_context_destroy(ctx);
    free_prob(&p);
}

/* B, Cin, H, W, out, kh, kw, sh, sw, ph, pw, dh, dw, G, k, scaled, unbatched, random_grid (1:
 * sorted random knots per feature, 2: the same, shared by pairs of features; 0: uniform) */
static const shape kShapes[] = {
    {2, 3, 8, 8, 5, 3, 3, 1, 1, 1, 1, 1, 1, 5, 3, 1, 0, 0},     /* 3x3, padding 1 */
    {2, 3, 9, 7, 4, 3, 3, 2, 2, 1, 1, 2, 2, 5, 3, 1, 0, 1},     /* stride 2, pad 1, dilation 2 */
    {3, 2, 11, 6, 3, 2, 3, 1, 2, 0, 1, 1, 2, 8, 1, 0, 0, 1},    /* non-square everything */
    {2, 5, 6, 5, 7, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0, 1, 0, 0},     /* 1x1 kernel, G 1, k 0 */
    {1, 4, 7, 7, 6, 3, 3, 1, 1, 1, 1, 1, 1, 5, 3, 1, 1, 1},     /* unbatched 3-D x */
    {1, 1, 5, 5, 2, 5, 5, 1, 1, 0, 0, 1, 1, 5, 3, 1, 0, 0},     /* kernel = image: one pixel */
    {2, 2, 23, 21, 9, 3, 3, 1, 1, 1, 1, 1, 1, 5, 3, 1, 0, 1},   /* > 128 pixels: several blocks */
    {2, 3, 4, 4, 3, 3, 3, 1, 1, 3, 2, 1, 1, 5, 1, 1, 0, 0},     /* padding wider than the kernel */
    {2, 40, 6, 6, 70, 3, 3, 1, 1, 1, 1, 1, 1, 5, 3, 0, 0, 1},   /* F 360: several feature chunks */
    /* The windowed path (out >= 256; cpu/kan_linear.c kan_sparse_pick), both directions: */
    {2, 3, 9, 8, 260, 3, 3, 2, 1, 1, 0, 1, 2, 10, 3, 1, 0, 1}, /* stride, padding, dilation */
    {1, 2, 13, 12, 256, 3, 2, 1, 1, 1, 1, 1, 1, 20, 2, 0, 0, 0}, /* > 128 pixels, no scaler */
    {1, 2, 6, 6, 300, 2, 2, 1, 1, 0, 0, 1, 1, 5, 0, 1, 1, 1},   /* k 0, unbatched */
    {1, 3, 7, 7, 520, 3, 3, 1, 1, 1, 1, 1, 1, 5, 3, 1, 0, 1},   /* forward only (1.8) */
    /* The small-output path (out <= 16, cpu/kan_small.h; the shapes above with out < 16 take it
     * too), its window tables shared by features with the same knots: */
    {4, 1, 28, 28, 5, 3, 3, 1, 1, 0, 0, 1, 1, 10, 3, 1, 0, 0},  /* KKAN's first layer: one table */
    {3, 2, 9, 10, 10, 3, 3, 1, 1, 1, 1, 1, 1, 10, 3, 1, 0, 2},  /* knots shared in pairs */
    {2, 2, 10, 9, 16, 3, 2, 2, 1, 1, 0, 1, 1, 4, 5, 0, 0, 2},   /* k 5, 16 outputs, stride 2 */
};

ParameterizedTestParameters(kan_conv2d, matches_reference) {
    return cr_make_param_array(shape, kShapes, sizeof kShapes / sizeof kShapes[0]);
}

ParameterizedTest(const shape *s, kan_conv2d, matches_reference) {
    check_against_reference(s, 1);
    check_against_reference(s, 2);
}

/* The bits do not depend on the thread count (dx: one thread sums each image), on the dense
 * path and on the windowed one (out 256, G 10). */
static void check_thread_count_invariant(const shape s) {
    prob p = make_prob(&s, 77);
    float *y[2];
    grads g[2];
    for (int t = 0; t < 2; t++) {
        kf_context *ctx = make_ctx(KF_DEVICE_CPU, t + 1);
        kf_kan_conv2d_plan *plan = make_plan(ctx, &s);
        y[t] = poisoned(p.ny);
        g[t] = poisoned_grads(&p);
        KF_OK_(run_forward(plan, &p, y[t]));
        KF_OK_(run_backward(plan, &p, KF_GRAD_OVERWRITE, &g[t]));
        kf_kan_conv2d_plan_destroy(plan);
        kf_context_destroy(ctx);
    }
    cr_expect(memcmp(y[0], y[1], (size_t)p.ny * 4) == 0, "y differs between 1 and 2 threads");
    cr_expect(memcmp(g[0].dx, g[1].dx, (size_t)p.nx * 4) == 0, "dx differs");
    cr_expect(memcmp(g[0].dsw, g[1].dsw, (size_t)n_oic(&p) * 4) == 0, "dspline differs");
    cr_expect(memcmp(g[0].dsc, g[1].dsc, (size_t)n_oi(&p) * 4) == 0, "dscaler differs");
    for (int t = 0; t < 2; t++) free(y[t]), free_grads(&g[t]);
    free_prob(&p);
}

Test(kan_conv2d, thread_count_invariant) {
    check_thread_count_invariant((shape){6, 8, 20, 20, 16, 3, 3, 1, 1, 1, 1, 1, 1, 5, 3, 1, 0, 1});
    check_thread_count_invariant((shape){3, 4, 12, 12, 256, 3, 3, 1, 1, 1, 1, 1, 1, 10, 3, 1, 0, 1});
}

/* The workspace is bounded by tiles, or (8 outputs: the small-output path, cpu/kan_small_geom.h)
 * by one image's windows per thread: the same for 2 images as for 10^4 (1 image, under 2M
 * multiply-adds, runs on one of the context's two threads: cpu/team.h), far below the batch's
 * bases (under two images' dense bases); a call with exactly that caller workspace works;
 * steady calls do not grow the arena. */
Test(kan_conv2d, workspace_bounded_and_steady) {
    const shape s = {3, 4, 28, 28, 8, 3, 3, 1, 1, 1, 1, 1, 1, 5, 3, 1, 0, 0};
    prob p = make_prob(&s, 9);
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 2);
    kf_kan_conv2d_plan *plan = make_plan(ctx, &s);
    size_t w2 = 0, wbig = 0, w3 = 0;
    KF_OK_(kf_kan_conv2d_workspace_size(plan, 2, 28, 28, &w2));
    KF_OK_(kf_kan_conv2d_workspace_size(plan, 10000, 28, 28, &wbig));
    KF_OK_(kf_kan_conv2d_workspace_size(plan, 3, 28, 28, &w3));
    cr_expect(w2 == wbig, "workspace grows with the batch: %zu for 2 images, %zu for 1e4", w2, wbig);
    cr_expect(w2 < (size_t)2 * 784 * 36 * 8 * sizeof(float),
              "workspace %zu bytes: as large as two images' bases", w2);

    float *y = poisoned(p.ny);
    void *ws = xalloc(w3);
    kf_kan_conv2d_forward_args a;
    kf_kan_conv2d_forward_args_init(&a);
    a.x = img_tensor(&p, p.x, s.Cin, s.H, s.W);
    set_params(&p, &a.grid, &a.base_weight, &a.spline_weight, &a.spline_scaler);
    a.y = img_tensor(&p, y, s.out, p.Ho, p.Wo);
    KF_OK_(kf_kan_conv2d_forward(plan, &a, ws, w3));
    double *yr = ref_forward(&p);
    cr_expect(ref_rel_err_f32(y, yr, p.ny) < TOL, "y with a caller workspace");
    EXPECT_FAIL(kf_kan_conv2d_forward(plan, &a, ws, w3 - 64), KF_ERR_WORKSPACE_TOO_SMALL,
                "workspace");

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
    kf_kan_conv2d_plan_destroy(plan);
    kf_context_destroy(ctx);
    free_prob(&p);
}

/* Optional outputs: any subset may be absent and the others are still right. */
Test(kan_conv2d, backward_subsets) {
    const shape s = {2, 3, 9, 7, 4, 3, 3, 2, 2, 1, 1, 2, 2, 5, 3, 1, 0, 1};
    prob p = make_prob(&s, 31);
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 2);
    kf_kan_conv2d_plan *plan = make_plan(ctx, &s);
    ref_grads r = ref_backward(&p);
    grads only_dx = {poisoned(p.nx), NULL, NULL, NULL};
    KF_OK_(run_backward(plan, &p, KF_GRAD_OVERWRITE, &only_dx));
    cr_expect(ref_rel_err_f32(only_dx.dx, r.dx, p.nx) < TOL, "dx alone");
    grads only_dsc = {NULL, NULL, NULL, poisoned(n_oi(&p))};
    KF_OK_(run_backward(plan, &p, KF_GRAD_OVERWRITE, &only_dsc));
    cr_expect(ref_rel_err_f32(only_dsc.dsc, r.dsc, n_oi(&p)) < TOL, "dspline_scaler alone");
    free_grads(&only_dx), free_grads(&only_dsc), free_ref_grads(&r);
    kf_kan_conv2d_plan_destroy(plan);
    kf_context_destroy(ctx);
    free_prob(&p);
}

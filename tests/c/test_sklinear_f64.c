/* kf_sklinear_* in float64 on the CPU backend, through the public header only, against the
 * float64 reference of tests/c/ref_sklinear.c (DESIGN.md's formula, term by term). Inputs
 * U(-1, 1), parameters at Panther's scale (never zeros); every output poisoned (NaN) before each
 * call; ||out - ref|| / ||ref|| < 1e-12. Shapes include output widths that are not a multiple of
 * 8 with k >= 16, where the library computes the ragged columns of a GEMM itself (host/blas.c).
 * The same on a CUDA context (cuda/plain.cu; device copies of every tensor; skipped without a
 * usable device). Also: the initialisation in float64 against the formula it implements, and a
 * mixed-dtype call refused with the argument named and nothing written. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kf_test.h"
#include "kfuse.h"
#include "ref_rnn.h"
#include "ref_sklinear.h"

#define TOL 1e-12

typedef struct shape { int64_t N, in, out, L, k; int bias; } shape;

/* One problem in float64: inputs, parameters and the upstream gradient. */
typedef struct prob {
    ref_skl_cfg c;
    int bias;
    double *x, *S1, *S2, *U1, *U2, *b, *dy;
} prob;

static int64_t n_ik(const prob *p) { return p->c.L * p->c.in * p->c.k; }
static int64_t n_ko(const prob *p) { return p->c.L * p->c.k * p->c.out; }

static prob make_prob(const shape *s, uint64_t seed) {
    prob p = {.c = {s->N, s->in, s->out, s->L, s->k}, .bias = s->bias};
    ref_rng r;
    ref_rng_seed(&r, seed);
    const double w = 1.0 / sqrt((double)s->k);
    p.x = ref_new_uniform_f64(&r, s->N * s->in, 1.0);
    p.S1 = ref_new_uniform_f64(&r, n_ik(&p), w);
    p.U2 = ref_new_uniform_f64(&r, n_ik(&p), w);
    p.S2 = ref_new_uniform_f64(&r, n_ko(&p), w);
    p.U1 = ref_new_uniform_f64(&r, n_ko(&p), w);
    p.b = s->bias ? ref_new_uniform_f64(&r, s->out, 1.0 / sqrt((double)s->out)) : NULL;
    p.dy = ref_new_uniform_f64(&r, s->N * s->out, 1.0);
    return p;
}

static void free_prob(prob *p) {
    free(p->x), free(p->S1), free(p->S2), free(p->U1), free(p->U2), free(p->b), free(p->dy);
}

static kf_tensor d1(void *p, int64_t a) { return tens(p, KF_DTYPE_F64, 1, (int64_t[]){a}); }
static kf_tensor d2(void *p, int64_t a, int64_t b) {
    return tens(p, KF_DTYPE_F64, 2, (int64_t[]){a, b});
}
static kf_tensor d3(void *p, int64_t a, int64_t b, int64_t c) {
    return tens(p, KF_DTYPE_F64, 3, (int64_t[]){a, b, c});
}

static kf_status plan_for(kf_context *ctx, const ref_skl_cfg *c, int bias,
                          kf_sklinear_plan **plan) {
    kf_sklinear_desc d;
    kf_sklinear_desc_init(&d);
    d.in_features = c->in, d.out_features = c->out;
    d.num_terms = (int32_t)c->L, d.low_rank = (int32_t)c->k, d.bias = bias;
    d.dtype = KF_DTYPE_F64;
    return kf_sklinear_plan_create(ctx, &d, plan);
}

/* The four parameter tensors of `p`. */
static void param_tensors(const prob *p, kf_tensor t[4]) {
    const int64_t L = p->c.L, in = p->c.in, out = p->c.out, k = p->c.k;
    t[0] = d3(p->S1, L, in, k), t[1] = d3(p->S2, L, k, out);
    t[2] = d3(p->U1, L, k, out), t[3] = d3(p->U2, L, in, k);
}

static void forward_args(const prob *p, double *y, kf_sklinear_forward_args *a) {
    kf_tensor t[4];
    param_tensors(p, t);
    kf_sklinear_forward_args_init(a);
    a->x = d2(p->x, p->c.N, p->c.in);
    a->S1s = t[0], a->S2s = t[1], a->U1s = t[2], a->U2s = t[3];
    if (p->bias) a->bias = d1(p->b, p->c.out);
    a->y = d2(y, p->c.N, p->c.out);
}

/* Gradient buffers dx, dS1s, dS2s, dbias (NULL without a bias), NaN-filled. */
enum { GX, GS1, GS2, GB, NG };

static void grads_make(const prob *p, double *g[NG]) {
    const int64_t n[NG] = {p->c.N * p->c.in, n_ik(p), n_ko(p), p->bias ? p->c.out : 0};
    for (int i = 0; i < NG; i++) g[i] = n[i] ? ref_new_nans_f64(n[i]) : NULL;
}

static void grads_free(double *g[NG]) {
    for (int i = 0; i < NG; i++) free(g[i]);
}

static void backward_args(const prob *p, double *g[NG], kf_sklinear_backward_args *a) {
    kf_sklinear_forward_args f;
    forward_args(p, p->dy, &f);
    kf_sklinear_backward_args_init(a);
    a->x = f.x, a->S1s = f.S1s, a->S2s = f.S2s, a->U1s = f.U1s, a->U2s = f.U2s;
    a->dy = f.y;
    a->dx = d2(g[GX], p->c.N, p->c.in);
    a->dS1s = d3(g[GS1], p->c.L, p->c.in, p->c.k);
    a->dS2s = d3(g[GS2], p->c.L, p->c.k, p->c.out);
    if (g[GB]) a->dbias = d1(g[GB], p->c.out);
}

static kf_status run_backward(kf_sklinear_plan *plan, const prob *p, kf_grad_mode mode,
                              double *g[NG]) {
    kf_sklinear_backward_args a;
    backward_args(p, g, &a);
    return kf_sklinear_backward(plan, mode, &a, NULL, 0);
}

/* p's tensors where a `dev` context reads them (kf_test.h's place_f64). */
static prob placed(kf_device_type dev, prob *p) {
    prob d = *p;
    d.x = place_f64(dev, p->x, p->c.N * p->c.in), d.dy = place_f64(dev, p->dy, p->c.N * p->c.out);
    d.S1 = place_f64(dev, p->S1, n_ik(p)), d.U2 = place_f64(dev, p->U2, n_ik(p));
    d.S2 = place_f64(dev, p->S2, n_ko(p)), d.U1 = place_f64(dev, p->U1, n_ko(p));
    d.b = place_f64(dev, p->b, p->c.out);
    return d;
}

static void unplace_prob(kf_device_type dev, prob *d) {
    void *v[] = {d->x, d->S1, d->S2, d->U1, d->U2, d->b, d->dy};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) unplace(dev, v[i]);
}

/* A backward on `dev` into the host gradients g (their contents, NaN or the values accumulated
 * onto, go to the device and the results come back). */
static void backward_on(kf_device_type dev, kf_context *ctx, kf_sklinear_plan *plan,
                        const prob *pd, const int64_t n[NG], kf_grad_mode mode, double *g[NG]) {
    double *gd[NG];
    for (int i = 0; i < NG; i++) gd[i] = place_f64(dev, g[i], n[i]);
    KF_OK_(run_backward(plan, pd, mode, gd));
    KF_OK_(kf_context_synchronize(ctx));
    for (int i = 0; i < NG; i++) fetch_f64(dev, g[i], gd[i], n[i]), unplace(dev, gd[i]);
}

/* Forward, backward and accumulated backward on a `dev` context (CPU: `threads` threads; CUDA:
 * device copies of every tensor; the test skips where no device is usable) against the
 * reference. */
static void check_against_reference(const shape *s, kf_device_type dev, int32_t threads) {
    prob p = make_prob(s, (uint64_t)(s->N * 131 + s->in * 17 + s->k));
    kf_context *ctx = make_ctx(dev, threads);
    prob pd = placed(dev, &p);
    kf_sklinear_plan *plan = NULL;
    KF_OK_(plan_for(ctx, &p.c, s->bias, &plan));
    const int64_t ny = s->N * s->out, nx = s->N * s->in;
    double *y = ref_new_nans_f64(ny), *yr = malloc((size_t)ny * sizeof *yr);
    double *yd = place_f64(dev, y, ny);
    kf_sklinear_forward_args fa;
    forward_args(&pd, yd, &fa);
    KF_OK_(kf_sklinear_forward(plan, &fa, NULL, 0));
    KF_OK_(kf_context_synchronize(ctx));
    fetch_f64(dev, y, yd, ny), unplace(dev, yd);
    ref_skl_forward(&p.c, p.x, p.S1, p.S2, p.U1, p.U2, p.b, yr);
    double e = ref_rel_err_f64(y, yr, ny);
    cr_expect(e < TOL, "y: rel err %.3g (N %lld in %lld out %lld L %lld k %lld, %s, %d threads)",
              e, (long long)s->N, (long long)s->in, (long long)s->out, (long long)s->L,
              (long long)s->k, dev == KF_DEVICE_CUDA ? "cuda" : "cpu", threads);

    double *dx = malloc((size_t)nx * 8), *dS1 = malloc((size_t)n_ik(&p) * 8),
           *dS2 = malloc((size_t)n_ko(&p) * 8), *db = malloc((size_t)s->out * 8);
    ref_skl_backward(&p.c, p.x, p.S1, p.S2, p.U1, p.U2, p.dy, dx, dS1, dS2, db);
    double *g[NG];
    grads_make(&p, g);
    const int64_t n[NG] = {nx, n_ik(&p), n_ko(&p), s->bias ? s->out : 0};
    backward_on(dev, ctx, plan, &pd, n, KF_GRAD_OVERWRITE, g);
    const struct { const char *name; const double *got; double *want; int64_t n; } out[] = {
        {"dx", g[GX], dx, nx}, {"dS1s", g[GS1], dS1, n_ik(&p)},
        {"dS2s", g[GS2], dS2, n_ko(&p)}, {"dbias", g[GB], db, s->bias ? s->out : 0}};
    for (size_t i = 0; i < 4; i++) {
        if (out[i].n == 0) continue;
        e = ref_rel_err_f64(out[i].got, out[i].want, out[i].n);
        cr_expect(e < TOL, "%s: rel err %.3g (N %lld in %lld out %lld L %lld k %lld, %s)",
                  out[i].name, e, (long long)s->N, (long long)s->in, (long long)s->out,
                  (long long)s->L, (long long)s->k, dev == KF_DEVICE_CUDA ? "cuda" : "cpu");
    }
    /* KF_GRAD_ACCUMULATE adds to what the buffers hold (dx is overwritten all the same). */
    double *acc[NG];
    grads_make(&p, acc);
    const double start[NG] = {0.0, 0.5, -0.25, 2.0};
    for (int i = GS1; i < NG; i++)
        for (int64_t e = 0; e < out[i].n; e++) acc[i][e] = start[i], out[i].want[e] += start[i];
    backward_on(dev, ctx, plan, &pd, n, KF_GRAD_ACCUMULATE, acc);
    for (int i = 0; i < NG; i++)
        if (out[i].n)
            cr_expect(ref_rel_err_f64(acc[i], out[i].want, out[i].n) < TOL, "accumulate: %s",
                      out[i].name);
    grads_free(acc), grads_free(g);
    free(dx), free(dS1), free(dS2), free(db), free(y), free(yr);
    kf_sklinear_plan_destroy(plan);
    kf_context_destroy(ctx);
    unplace_prob(dev, &pd);
    free_prob(&p);
}

static const shape kShapes[] = {
    {5, 7, 9, 1, 1, 1},        /* L = 1, k = 1 */
    {6, 40, 20, 3, 17, 1},     /* out % 8 = 4 and k >= 16: the ragged-column split */
    {1, 64, 49, 2, 8, 1},      /* batch 1, out % 8 = 1 */
    {37, 130, 70, 4, 5, 0},    /* no bias */
    {64, 256, 256, 1, 16, 1},  /* a team of threads */
    {33, 300, 131, 2, 32, 1},  /* out % 8 = 3 */
    {40, 1100, 600, 2, 16, 1}, /* few rows: the wide split, 5 blocks of in, 3 of out */
    {300, 90, 70, 2, 8, 0},    /* many rows: the row split, 10 row blocks */
    {20, 600, 520, 3, 12, 1},  /* the wide split with a wide bottleneck (2r = 72: BLAS) */
    {290, 70, 600, 5, 8, 0},   /* the row split, 2r = 80: BLAS */
};

ParameterizedTestParameters(sklinear_f64, matches_reference) {
    return cr_make_param_array(shape, kShapes, sizeof kShapes / sizeof kShapes[0]);
}

ParameterizedTest(const shape *s, sklinear_f64, matches_reference) {
    check_against_reference(s, KF_DEVICE_CPU, 1);
    check_against_reference(s, KF_DEVICE_CPU, 2);
}

/* The CUDA backend's float64 plans (cuda/plain.cu), the same shapes; skips without a usable
 * device. */
ParameterizedTestParameters(sklinear_f64, cuda_matches_reference) {
    return cr_make_param_array(shape, kShapes, sizeof kShapes / sizeof kShapes[0]);
}

ParameterizedTest(const shape *s, sklinear_f64, cuda_matches_reference) {
    check_against_reference(s, KF_DEVICE_CUDA, 0);
}

/* C[m, n] = sum_p A(i, p) B(p, j), element (i, p) of A at A[i sai + p sap], (p, j) of B at
 * B[p sbp + j sbj]. */
static void sum_products(int64_t m, int64_t n, int64_t kk, const double *A, int64_t sai,
                         int64_t sap, const double *B, int64_t sbp, int64_t sbj, double *C) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double acc = 0.0;
            for (int64_t q = 0; q < kk; q++) acc += A[i * sai + q * sap] * B[q * sbp + j * sbj];
            C[i * n + j] = acc;
        }
}

/* kf_sklinear_init_params in float64 with W_init: U1s and U2s are the +-1/sqrt(k) sign sketch,
 * S1s[i] = W U1s[i]^T and S2s[i] = U2s[i]^T W with W = W_init^T [in, out], by their sums. */
Test(sklinear_f64, init_params_follow_the_formula) {
    const shape s = {1, 19, 13, 2, 5, 1};
    prob p = make_prob(&s, 5); /* its parameters are overwritten with NaN, then initialised */
    for (int64_t e = 0; e < n_ik(&p); e++) p.S1[e] = p.U2[e] = NAN;
    for (int64_t e = 0; e < n_ko(&p); e++) p.S2[e] = p.U1[e] = NAN;
    for (int64_t o = 0; o < s.out; o++) p.b[o] = NAN;
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    kf_sklinear_plan *plan = NULL;
    KF_OK_(plan_for(ctx, &p.c, 1, &plan));
    ref_rng r;
    ref_rng_seed(&r, 9);
    double *W = ref_new_uniform_f64(&r, s.out * s.in, 0.3); /* W_init [out, in] */
    kf_tensor t[4];
    param_tensors(&p, t);
    kf_sklinear_init_args a;
    kf_sklinear_init_args_init(&a);
    a.seed = 42;
    a.W_init = d2(W, s.out, s.in);
    a.S1s = t[0], a.S2s = t[1], a.U1s = t[2], a.U2s = t[3];
    a.bias = d1(p.b, s.out);
    KF_OK_(kf_sklinear_init_params(plan, &a));
    const double u = 1.0 / sqrt((double)s.k);
    for (int64_t e = 0; e < n_ko(&p); e++) cr_expect(fabs(p.U1[e]) == u, "U1s[%lld]", (long long)e);
    for (int64_t e = 0; e < n_ik(&p); e++) cr_expect(fabs(p.U2[e]) == u, "U2s[%lld]", (long long)e);
    for (int64_t o = 0; o < s.out; o++)
        cr_expect(fabs(p.b[o]) <= 1.0 / sqrt((double)s.out), "bias[%lld]", (long long)o);
    double *S1r = malloc((size_t)n_ik(&p) * 8), *S2r = malloc((size_t)n_ko(&p) * 8);
    for (int64_t i = 0; i < s.L; i++) {
        /* S1s[i] [in, k]: W [in, out] (W_init read transposed) times U1s[i]^T [out, k] */
        sum_products(s.in, s.k, s.out, W, 1, s.in, p.U1 + i * s.k * s.out, 1, s.out,
                     S1r + i * s.in * s.k);
        /* S2s[i] [k, out]: U2s[i]^T [k, in] times W [in, out] */
        sum_products(s.k, s.out, s.in, p.U2 + i * s.in * s.k, 1, s.k, W, 1, s.in,
                     S2r + i * s.k * s.out);
    }
    cr_expect(ref_rel_err_f64(p.S1, S1r, n_ik(&p)) < TOL, "S1s");
    cr_expect(ref_rel_err_f64(p.S2, S2r, n_ko(&p)) < TOL, "S2s");
    free(W), free(S1r), free(S2r);
    kf_sklinear_plan_destroy(plan);
    kf_context_destroy(ctx);
    free_prob(&p);
}

/* A float64 plan refuses a float32 tensor, naming it, and writes nothing. */
Test(sklinear_f64, mixed_dtype_names_the_argument) {
    const shape s = {4, 8, 6, 1, 2, 1};
    prob p = make_prob(&s, 3);
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    kf_sklinear_plan *plan = NULL;
    KF_OK_(plan_for(ctx, &p.c, 1, &plan));
    double *y = ref_new_nans_f64(s.N * s.out);
    float *f32 = poisoned(s.N * (s.in + s.out));
    kf_sklinear_forward_args a;
    forward_args(&p, y, &a);
    a.x = t3(f32, 2, s.N, s.in, 0);
    EXPECT_FAIL(kf_sklinear_forward(plan, &a, NULL, 0), KF_ERR_INVALID_ARGUMENT, "args->x.dtype");
    forward_args(&p, y, &a);
    a.bias = t3(f32, 1, s.out, 0, 0);
    EXPECT_FAIL(kf_sklinear_forward(plan, &a, NULL, 0), KF_ERR_INVALID_ARGUMENT,
                "args->bias.dtype");
    forward_args(&p, y, &a);
    a.y = t3(f32, 2, s.N, s.out, 0);
    EXPECT_FAIL(kf_sklinear_forward(plan, &a, NULL, 0), KF_ERR_INVALID_ARGUMENT, "args->y.dtype");
    for (int64_t i = 0; i < s.N * s.out; i++)
        cr_expect(isnan(y[i]), "y[%lld] written", (long long)i);
    double *g[NG];
    grads_make(&p, g);
    kf_sklinear_backward_args ba;
    backward_args(&p, g, &ba);
    ba.dbias = t3(f32, 1, s.out, 0, 0);
    EXPECT_FAIL(kf_sklinear_backward(plan, KF_GRAD_OVERWRITE, &ba, NULL, 0),
                KF_ERR_INVALID_ARGUMENT, "args->dbias.dtype");
    for (int i = GX; i < GB; i++)
        for (int64_t e = 0; e < (i == GX ? s.N * s.in : i == GS1 ? n_ik(&p) : n_ko(&p)); e++)
            cr_expect(isnan(g[i][e]), "gradient %d written", i);
    grads_free(g);
    /* And a float32 plan refuses float64 tensors. */
    kf_sklinear_desc d;
    kf_sklinear_desc_init(&d);
    d.in_features = s.in, d.out_features = s.out, d.num_terms = 1, d.low_rank = 2;
    kf_sklinear_plan *p32 = NULL;
    KF_OK_(kf_sklinear_plan_create(ctx, &d, &p32));
    forward_args(&p, y, &a);
    EXPECT_FAIL(kf_sklinear_forward(p32, &a, NULL, 0), KF_ERR_INVALID_ARGUMENT, "args->x.dtype");
    kf_sklinear_plan_destroy(p32);
    free(y), free(f32);
    kf_sklinear_plan_destroy(plan);
    kf_context_destroy(ctx);
    free_prob(&p);
}

/* Integer dtypes are refused at plan creation, naming the field (float16 and bfloat16:
 * tests/c/test_lowp.c). */
Test(sklinear_f64, other_dtypes_unsupported) {
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    const ref_skl_cfg c = {1, 8, 8, 1, 2};
    kf_sklinear_desc d;
    kf_sklinear_desc_init(&d);
    d.in_features = c.in, d.out_features = c.out, d.num_terms = 1, d.low_rank = 2;
    kf_sklinear_plan *plan = NULL;
    d.dtype = KF_DTYPE_I64;
    EXPECT_FAIL(kf_sklinear_plan_create(ctx, &d, &plan), KF_ERR_UNSUPPORTED, "desc->dtype");
    cr_expect(plan == NULL);
    kf_context_destroy(ctx);
}

/* kf_sklinear_* on the CPU backend, through the public header only, against the float64
 * reference of tests/c/ref_sklinear.c (DESIGN.md's formula, term by term). Inputs U(-1, 1),
 * parameters at Panther's scale (never zeros); every output poisoned (NaN) before each call;
 * ||out - ref|| / ||ref|| < 1e-5. Gradients are also checked by central differences through the
 * library's own forward: the loss sum(y * g) is linear in each of x, S1s, S2s and bias, so the
 * difference quotient is exact up to float rounding. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kfuse.h"
#include "kf_test.h"
#include "ref_rnn.h"
#include "ref_sklinear.h"

#define TOL 1e-5

/* One problem: shapes, float32 inputs and their float64 copies. */
typedef struct prob {
    ref_skl_cfg c;
    int bias;
    int32_t xnd;          /* rank of x: leading dims are {N} or {2, N/2} */
    int64_t xs[3], ys[3];
    float *x, *S1, *S2, *U1, *U2, *b, *dy;
    double *x64, *S164, *S264, *U164, *U264, *b64, *dy64;
} prob;

static int64_t n_ik(const prob *p) { return p->c.L * p->c.in * p->c.k; }
static int64_t n_ko(const prob *p) { return p->c.L * p->c.k * p->c.out; }

static float *fill(ref_rng *r, int64_t n, double bound) {
    float *v = malloc((size_t)n * sizeof *v);
    ref_fill_uniform_f32(r, v, n, -bound, bound);
    return v;
}

static prob make_prob(int64_t N, int64_t in, int64_t out, int64_t L, int64_t k, int bias,
                      int three_d, uint64_t seed) {
    prob p = {.c = {N, in, out, L, k}, .bias = bias};
    ref_rng r;
    ref_rng_seed(&r, seed);
    p.x = fill(&r, N * in, 1.0);
    p.S1 = fill(&r, n_ik(&p), 1.0 / sqrt((double)k));
    p.U2 = fill(&r, n_ik(&p), 1.0 / sqrt((double)k));
    p.S2 = fill(&r, n_ko(&p), 1.0 / sqrt((double)k));
    p.U1 = fill(&r, n_ko(&p), 1.0 / sqrt((double)k));
    p.b = bias ? fill(&r, out, 1.0 / sqrt((double)out)) : NULL;
    p.dy = fill(&r, N * out, 1.0);
    p.x64 = ref_to_f64(p.x, N * in);
    p.S164 = ref_to_f64(p.S1, n_ik(&p));
    p.U264 = ref_to_f64(p.U2, n_ik(&p));
    p.S264 = ref_to_f64(p.S2, n_ko(&p));
    p.U164 = ref_to_f64(p.U1, n_ko(&p));
    p.b64 = ref_to_f64(p.b, out);
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

static void free_prob(prob *p) {
    void *v[] = {p->x, p->S1, p->S2, p->U1, p->U2, p->b, p->dy,
                 p->x64, p->S164, p->S264, p->U164, p->U264, p->b64, p->dy64};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) free(v[i]);
}

static kf_sklinear_plan *make_plan(kf_context *ctx, const prob *p) {
    kf_sklinear_desc d;
    kf_sklinear_desc_init(&d);
    d.in_features = p->c.in, d.out_features = p->c.out;
    d.num_terms = (int32_t)p->c.L, d.low_rank = (int32_t)p->c.k, d.bias = p->bias;
    kf_sklinear_plan *plan = NULL;
    KF_OK_(kf_sklinear_plan_create(ctx, &d, &plan));
    return plan;
}

static void set_params(const prob *p, kf_tensor *S1, kf_tensor *S2, kf_tensor *U1, kf_tensor *U2) {
    *S1 = t3(p->S1, 3, p->c.L, p->c.in, p->c.k);
    *S2 = t3(p->S2, 3, p->c.L, p->c.k, p->c.out);
    *U1 = t3(p->U1, 3, p->c.L, p->c.k, p->c.out);
    *U2 = t3(p->U2, 3, p->c.L, p->c.in, p->c.k);
}

static kf_status run_forward(kf_sklinear_plan *plan, const prob *p, const float *x, float *y) {
    kf_sklinear_forward_args a;
    kf_sklinear_forward_args_init(&a);
    a.x = t3((void *)x, p->xnd, p->xs[0], p->xs[1], p->xs[2]);
    set_params(p, &a.S1s, &a.S2s, &a.U1s, &a.U2s);
    if (p->bias) a.bias = t3(p->b, 1, p->c.out, 0, 0);
    a.y = t3(y, p->xnd, p->ys[0], p->ys[1], p->ys[2]);
    return kf_sklinear_forward(plan, &a, NULL, 0);
}

typedef struct grads { float *dx, *dS1, *dS2, *db; } grads;

static grads poisoned_grads(const prob *p) {
    grads g = {poisoned(p->c.N * p->c.in), poisoned(n_ik(p)), poisoned(n_ko(p)),
               p->bias ? poisoned(p->c.out) : NULL};
    return g;
}

static void free_grads(grads *g) { free(g->dx), free(g->dS1), free(g->dS2), free(g->db); }

static kf_status run_backward(kf_sklinear_plan *plan, const prob *p, kf_grad_mode mode,
                              const grads *g) {
    kf_sklinear_backward_args a;
    kf_sklinear_backward_args_init(&a);
    a.x = t3(p->x, p->xnd, p->xs[0], p->xs[1], p->xs[2]);
    set_params(p, &a.S1s, &a.S2s, &a.U1s, &a.U2s);
    a.dy = t3(p->dy, p->xnd, p->ys[0], p->ys[1], p->ys[2]);
    if (g->dx) a.dx = t3(g->dx, p->xnd, p->xs[0], p->xs[1], p->xs[2]);
    if (g->dS1) a.dS1s = t3(g->dS1, 3, p->c.L, p->c.in, p->c.k);
    if (g->dS2) a.dS2s = t3(g->dS2, 3, p->c.L, p->c.k, p->c.out);
    if (g->db) a.dbias = t3(g->db, 1, p->c.out, 0, 0);
    return kf_sklinear_backward(plan, mode, &a, NULL, 0);
}

/* ---- forward and backward against the float64 reference ---------------------------------- */
typedef struct shape { int64_t N, in, out, L, k; int bias, three_d; } shape;

static void check_against_reference(const shape *s, int32_t threads) {
    prob p = make_prob(s->N, s->in, s->out, s->L, s->k, s->bias, s->three_d,
                       (uint64_t)(s->N * 131 + s->in * 17 + s->k));
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, threads);
    kf_sklinear_plan *plan = make_plan(ctx, &p);
    int64_t ny = s->N * s->out;
    float *y = poisoned(ny);
    KF_OK_(run_forward(plan, &p, p.x, y));
    double *yr = malloc((size_t)ny * sizeof *yr);
    ref_skl_forward(&p.c, p.x64, p.S164, p.S264, p.U164, p.U264, p.b64, yr);
    double e = ref_rel_err_f32(y, yr, ny);
    cr_expect(e < TOL, "y: rel err %.3g (N %lld in %lld out %lld L %lld k %lld bias %d)", e,
              (long long)s->N, (long long)s->in, (long long)s->out, (long long)s->L,
              (long long)s->k, s->bias);

    grads g = poisoned_grads(&p);
    KF_OK_(run_backward(plan, &p, KF_GRAD_OVERWRITE, &g));
    double *dx = malloc((size_t)(s->N * s->in) * sizeof *dx), *dS1 = malloc((size_t)n_ik(&p) * 8),
           *dS2 = malloc((size_t)n_ko(&p) * 8), *db = malloc((size_t)s->out * 8);
    ref_skl_backward(&p.c, p.x64, p.S164, p.S264, p.U164, p.U264, p.dy64, dx, dS1, dS2, db);
    const struct { const char *name; const float *got; const double *want; int64_t n; } out[] = {
        {"dx", g.dx, dx, s->N * s->in}, {"dS1s", g.dS1, dS1, n_ik(&p)},
        {"dS2s", g.dS2, dS2, n_ko(&p)}, {"dbias", g.db, db, s->bias ? s->out : 0}};
    for (size_t i = 0; i < 4; i++) {
        if (out[i].n == 0) continue;
        e = ref_rel_err_f32(out[i].got, out[i].want, out[i].n);
        cr_expect(e < TOL, "%s: rel err %.3g (N %lld in %lld out %lld L %lld k %lld)", out[i].name,
                  e, (long long)s->N, (long long)s->in, (long long)s->out, (long long)s->L,
                  (long long)s->k);
    }
    /* KF_GRAD_ACCUMULATE adds to what the buffers hold (dx is overwritten all the same). */
    grads acc = poisoned_grads(&p);
    for (int64_t i = 0; i < n_ik(&p); i++) acc.dS1[i] = 0.5f;
    for (int64_t i = 0; i < n_ko(&p); i++) acc.dS2[i] = -0.25f;
    for (int64_t i = 0; acc.db && i < s->out; i++) acc.db[i] = 2.0f;
    KF_OK_(run_backward(plan, &p, KF_GRAD_ACCUMULATE, &acc));
    for (int64_t i = 0; i < n_ik(&p); i++) dS1[i] += 0.5;
    for (int64_t i = 0; i < n_ko(&p); i++) dS2[i] += -0.25;
    for (int64_t i = 0; acc.db && i < s->out; i++) db[i] += 2.0;
    cr_expect(ref_rel_err_f32(acc.dx, dx, s->N * s->in) < TOL, "accumulate: dx");
    cr_expect(ref_rel_err_f32(acc.dS1, dS1, n_ik(&p)) < TOL, "accumulate: dS1s");
    cr_expect(ref_rel_err_f32(acc.dS2, dS2, n_ko(&p)) < TOL, "accumulate: dS2s");
    if (acc.db) cr_expect(ref_rel_err_f32(acc.db, db, s->out) < TOL, "accumulate: dbias");
    free_grads(&acc);
    free_grads(&g);
    free(dx), free(dS1), free(dS2), free(db), free(y), free(yr);
    kf_sklinear_plan_destroy(plan);
    kf_context_destroy(ctx);
    free_prob(&p);
}

static const shape kShapes[] = {
    {5, 7, 9, 1, 1, 1, 0},      /* L = 1, k = 1 */
    {6, 40, 24, 3, 17, 1, 1},   /* L = 3, k = 17 (odd); 2Lk > min(in, out); 3-D x */
    {1, 64, 48, 2, 8, 1, 0},    /* batch 1 */
    {37, 130, 70, 4, 5, 0, 0},  /* no bias; nothing a multiple of 8 */
    {64, 256, 256, 1, 16, 1, 0},/* the benchmark's small shape, team of threads */
    {33, 300, 129, 2, 32, 1, 1},
    {40, 1100, 600, 2, 16, 1, 0}, /* few rows: the wide split, 5 blocks of in, 3 of out */
    {300, 90, 70, 2, 8, 1, 1},    /* many rows: the row split, 10 row blocks */
    {20, 600, 520, 3, 12, 1, 0},  /* the wide split with a wide bottleneck (2r = 72: BLAS) */
    {290, 70, 600, 5, 8, 0, 1},   /* the row split, 2r = 80: BLAS */
};

ParameterizedTestParameters(sklinear, matches_reference) {
    return cr_make_param_array(shape, kShapes, sizeof kShapes / sizeof kShapes[0]);
}

ParameterizedTest(const shape *s, sklinear, matches_reference) {
    check_against_reference(s, 1);
    check_against_reference(s, 2);
}

/* Results do not depend on the team size: 1 and 2 threads give the same bits, in each split
 * (every shape is above the size under which a call runs in the caller's thread alone). */
static const shape kTeamShapes[] = {
    {300, 256, 200, 2, 16, 1, 0}, /* the row split */
    {40, 1100, 600, 2, 16, 1, 0}, /* the wide split */
    {60, 600, 520, 3, 12, 1, 0},  /* the wide split, dZ on BLAS (2r = 72) */
};

ParameterizedTestParameters(sklinear, thread_count_invariant) {
    return cr_make_param_array(shape, kTeamShapes, sizeof kTeamShapes / sizeof kTeamShapes[0]);
}

ParameterizedTest(const shape *s, sklinear, thread_count_invariant) {
    prob p = make_prob(s->N, s->in, s->out, s->L, s->k, s->bias, s->three_d, 7);
    const int64_t ny = s->N * s->out, nx = s->N * s->in;
    float *y[2];
    grads g[2];
    for (int t = 0; t < 2; t++) {
        kf_context *ctx = make_ctx(KF_DEVICE_CPU, t + 1);
        kf_sklinear_plan *plan = make_plan(ctx, &p);
        y[t] = poisoned(ny);
        KF_OK_(run_forward(plan, &p, p.x, y[t]));
        g[t] = poisoned_grads(&p);
        KF_OK_(run_backward(plan, &p, KF_GRAD_OVERWRITE, &g[t]));
        kf_sklinear_plan_destroy(plan);
        kf_context_destroy(ctx);
    }
    cr_expect(memcmp(y[0], y[1], (size_t)ny * sizeof(float)) == 0, "y differs with 2 threads");
    cr_expect(memcmp(g[0].dx, g[1].dx, (size_t)nx * sizeof(float)) == 0, "dx differs");
    cr_expect(memcmp(g[0].dS1, g[1].dS1, (size_t)n_ik(&p) * sizeof(float)) == 0, "dS1s differs");
    cr_expect(memcmp(g[0].dS2, g[1].dS2, (size_t)n_ko(&p) * sizeof(float)) == 0, "dS2s differs");
    cr_expect(memcmp(g[0].db, g[1].db, (size_t)s->out * sizeof(float)) == 0, "dbias differs");
    for (int t = 0; t < 2; t++) free(y[t]), free_grads(&g[t]);
    free_prob(&p);
}

/* <g, y> through the library's forward, in double. */
static double loss(kf_sklinear_plan *plan, const prob *p, const float *x, float *y) {
    cr_assert(run_forward(plan, p, x, y) == KF_OK);
    double l = 0.0;
    for (int64_t i = 0; i < p->c.N * p->c.out; i++) l += (double)y[i] * p->dy[i];
    return l;
}

/* Central differences of <dy, y> w.r.t. every element of one parameter buffer. */
static void check_fd(kf_sklinear_plan *plan, prob *p, float *param, int64_t n, const float *grad,
                     const char *name) {
    float *y = poisoned(p->c.N * p->c.out);
    const float h = 0.5f;
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        float keep = param[i];
        param[i] = keep + h;
        double lp = loss(plan, p, p->x, y);
        param[i] = keep - h;
        double lm = loss(plan, p, p->x, y);
        param[i] = keep;
        double fd = (lp - lm) / (2.0 * h);
        num += (fd - grad[i]) * (fd - grad[i]);
        den += fd * fd;
    }
    cr_expect(sqrt(num / den) < 1e-4, "%s: finite differences differ by %.3g", name,
              sqrt(num / den));
    free(y);
}

Test(sklinear, gradients_match_finite_differences) {
    prob p = make_prob(3, 6, 5, 2, 3, 1, 0, 11);
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    kf_sklinear_plan *plan = make_plan(ctx, &p);
    grads g = poisoned_grads(&p);
    KF_OK_(run_backward(plan, &p, KF_GRAD_OVERWRITE, &g));
    check_fd(plan, &p, p.x, p.c.N * p.c.in, g.dx, "dx");
    check_fd(plan, &p, p.S1, n_ik(&p), g.dS1, "dS1s");
    check_fd(plan, &p, p.S2, n_ko(&p), g.dS2, "dS2s");
    check_fd(plan, &p, p.b, p.c.out, g.db, "dbias");
    free_grads(&g);
    kf_sklinear_plan_destroy(plan);
    kf_context_destroy(ctx);
    free_prob(&p);
}

/* Optional outputs: any subset may be absent; those present are still right. */
Test(sklinear, backward_subsets) {
    prob p = make_prob(9, 20, 11, 2, 4, 1, 0, 3);
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 2);
    kf_sklinear_plan *plan = make_plan(ctx, &p);
    double *dx = malloc(9 * 20 * 8), *dS1 = malloc((size_t)n_ik(&p) * 8),
           *dS2 = malloc((size_t)n_ko(&p) * 8), *db = malloc(11 * 8);
    ref_skl_backward(&p.c, p.x64, p.S164, p.S264, p.U164, p.U264, p.dy64, dx, dS1, dS2, db);
    for (int mask = 0; mask < 16; mask++) {
        grads g = poisoned_grads(&p), use = g;
        if (!(mask & 1)) use.dx = NULL;
        if (!(mask & 2)) use.dS1 = NULL;
        if (!(mask & 4)) use.dS2 = NULL;
        if (!(mask & 8)) use.db = NULL;
        KF_OK_(run_backward(plan, &p, KF_GRAD_OVERWRITE, &use));
        if (use.dx) cr_expect(ref_rel_err_f32(use.dx, dx, 9 * 20) < TOL, "mask %d: dx", mask);
        if (use.dS1) cr_expect(ref_rel_err_f32(use.dS1, dS1, n_ik(&p)) < TOL, "mask %d: dS1s", mask);
        if (use.dS2) cr_expect(ref_rel_err_f32(use.dS2, dS2, n_ko(&p)) < TOL, "mask %d: dS2s", mask);
        if (use.db) cr_expect(ref_rel_err_f32(use.db, db, 11) < TOL, "mask %d: dbias", mask);
        free_grads(&g);
    }
    free(dx), free(dS1), free(dS2), free(db);
    kf_sklinear_plan_destroy(plan);
    kf_context_destroy(ctx);
    free_prob(&p);
}

Test(sklinear, param_ratio) {
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    kf_sklinear_desc d;
    kf_sklinear_desc_init(&d);
    cr_expect(d.bias == 1 && d.dtype == KF_DTYPE_F32 && d.num_terms == 0 && d.low_rank == 0);
    d.in_features = 8192, d.out_features = 4096, d.num_terms = 4, d.low_rank = 32;
    kf_sklinear_plan *plan = NULL;
    KF_OK_(kf_sklinear_plan_create(ctx, &d, &plan));
    double ratio = 0.0;
    KF_OK_(kf_sklinear_param_ratio(plan, &ratio));
    double want = 2.0 * 4 * 32 * (8192.0 + 4096.0) / (8192.0 * 4096.0);
    cr_expect(fabs(ratio - want) < 1e-12, "ratio %.17g, want %.17g", ratio, want);
    kf_sklinear_plan_destroy(plan);
    kf_context_destroy(ctx);
}

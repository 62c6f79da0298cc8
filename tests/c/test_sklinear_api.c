/* kf_sklinear_* contract beyond the math: bad descriptors and arguments get a status and a
 * message naming the argument, with nothing written; the initialisation follows Panther's
 * recipe (checked against float64 products computed here) and is a pure function of the seed. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kfuse.h"
#include "kf_test.h"
#include "ref_rnn.h"

static kf_sklinear_desc desc_of(int64_t in, int64_t out, int32_t L, int32_t k, int32_t bias) {
    kf_sklinear_desc d;
    kf_sklinear_desc_init(&d);
    d.in_features = in, d.out_features = out, d.num_terms = L, d.low_rank = k, d.bias = bias;
    return d;
}

Test(sklinear_api, bad_descriptors) {
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    kf_sklinear_plan *plan = (kf_sklinear_plan *)&plan; /* must be reset to NULL on failure */
    kf_sklinear_desc d = desc_of(8, 8, 0, 2, 1);
    EXPECT_FAIL(kf_sklinear_plan_create(ctx, &d, &plan), KF_ERR_INVALID_ARGUMENT, "num_terms");
    cr_expect(plan == NULL);
    d = desc_of(8, 8, 1, 0, 1);
    EXPECT_FAIL(kf_sklinear_plan_create(ctx, &d, &plan), KF_ERR_INVALID_ARGUMENT, "low_rank");
    d = desc_of(8, 8, -3, 2, 1);
    EXPECT_FAIL(kf_sklinear_plan_create(ctx, &d, &plan), KF_ERR_INVALID_ARGUMENT, "num_terms");
    d = desc_of(0, 8, 1, 2, 1);
    EXPECT_FAIL(kf_sklinear_plan_create(ctx, &d, &plan), KF_ERR_INVALID_ARGUMENT, "in_features");
    d = desc_of(8, -1, 1, 2, 1);
    EXPECT_FAIL(kf_sklinear_plan_create(ctx, &d, &plan), KF_ERR_INVALID_ARGUMENT, "out_features");
    d = desc_of(8, 8, 1, 2, 2);
    EXPECT_FAIL(kf_sklinear_plan_create(ctx, &d, &plan), KF_ERR_INVALID_ARGUMENT, "bias");
    d = desc_of(8, 8, 1 << 20, 1 << 20, 1);
    EXPECT_FAIL(kf_sklinear_plan_create(ctx, &d, &plan), KF_ERR_INVALID_ARGUMENT, "low_rank");
    d = desc_of(8, 8, 1, 2, 1);
    d.dtype = KF_DTYPE_I32;
    EXPECT_FAIL(kf_sklinear_plan_create(ctx, &d, &plan), KF_ERR_UNSUPPORTED, "dtype");
    d = desc_of(8, 8, 1, 2, 1);
    d.struct_size = 4;
    EXPECT_FAIL(kf_sklinear_plan_create(ctx, &d, &plan), KF_ERR_INVALID_ARGUMENT, "desc");
    EXPECT_FAIL(kf_sklinear_plan_create(NULL, &d, &plan), KF_ERR_INVALID_ARGUMENT, "ctx");
    /* More parameters than the dense layer: allowed, and reported by the ratio. */
    d = desc_of(8, 6, 2, 4, 1);
    KF_OK_(kf_sklinear_plan_create(ctx, &d, &plan));
    double ratio;
    KF_OK_(kf_sklinear_param_ratio(plan, &ratio));
    cr_expect(ratio > 1.0, "ratio %g", ratio);
    kf_sklinear_plan_destroy(plan);
    kf_sklinear_plan_destroy(NULL);
    kf_context_destroy(ctx);
}

/* A valid forward call on [N, in] = [4, 8] -> [4, 6], L = 2, k = 3, which each case breaks in
 * one place. y starts as a sentinel pattern that a rejected call must leave alone. */
typedef struct call {
    kf_context *ctx;
    kf_sklinear_plan *plan;
    float x[4 * 8], S1[2 * 8 * 3], S2[2 * 3 * 6], U1[2 * 3 * 6], U2[2 * 8 * 3], b[6], y[4 * 6];
    float dy[4 * 6], dx[4 * 8], dS1[2 * 8 * 3];
    kf_sklinear_forward_args f;
    kf_sklinear_backward_args g;
} call;

static call *make_call(void) {
    call *c = calloc(1, sizeof *c);
    c->ctx = make_ctx(KF_DEVICE_CPU, 1);
    kf_sklinear_desc d = desc_of(8, 6, 2, 3, 1);
    KF_OK_(kf_sklinear_plan_create(c->ctx, &d, &c->plan));
    ref_rng r;
    ref_rng_seed(&r, 5);
    ref_fill_uniform_f32(&r, c->x, 32, -1, 1);
    ref_fill_uniform_f32(&r, c->S1, 48, -1, 1);
    ref_fill_uniform_f32(&r, c->S2, 36, -1, 1);
    ref_fill_uniform_f32(&r, c->U1, 36, -1, 1);
    ref_fill_uniform_f32(&r, c->U2, 48, -1, 1);
    ref_fill_uniform_f32(&r, c->b, 6, -1, 1);
    ref_fill_uniform_f32(&r, c->dy, 24, -1, 1);
    for (int i = 0; i < 24; i++) c->y[i] = 1234.5f;
    kf_sklinear_forward_args_init(&c->f);
    c->f.x = t3(c->x, 2, 4, 8, 0);
    c->f.S1s = t3(c->S1, 3, 2, 8, 3);
    c->f.S2s = t3(c->S2, 3, 2, 3, 6);
    c->f.U1s = t3(c->U1, 3, 2, 3, 6);
    c->f.U2s = t3(c->U2, 3, 2, 8, 3);
    c->f.bias = t3(c->b, 1, 6, 0, 0);
    c->f.y = t3(c->y, 2, 4, 6, 0);
    kf_sklinear_backward_args_init(&c->g);
    c->g.x = c->f.x, c->g.S1s = c->f.S1s, c->g.S2s = c->f.S2s, c->g.U1s = c->f.U1s;
    c->g.U2s = c->f.U2s;
    c->g.dy = t3(c->dy, 2, 4, 6, 0);
    c->g.dx = t3(c->dx, 2, 4, 8, 0);
    c->g.dS1s = t3(c->dS1, 3, 2, 8, 3);
    for (int i = 0; i < 32; i++) c->dx[i] = 77.0f;
    for (int i = 0; i < 48; i++) c->dS1[i] = 77.0f;
    return c;
}

static void free_call(call *c) {
    kf_sklinear_plan_destroy(c->plan);
    kf_context_destroy(c->ctx);
    free(c);
}

static void expect_untouched(const call *c) {
    for (int i = 0; i < 24; i++) cr_expect(c->y[i] == 1234.5f, "y[%d] written by a failed call", i);
    for (int i = 0; i < 32; i++) cr_expect(c->dx[i] == 77.0f, "dx[%d] written by a failed call", i);
    for (int i = 0; i < 48; i++) cr_expect(c->dS1[i] == 77.0f, "dS1s[%d] written", i);
}

#define FWD_CASE(name, mutate, status, needle)                                                \
    Test(sklinear_api, forward_rejects_##name) {                                              \
        call *c = make_call();                                                                \
        mutate;                                                                               \
        EXPECT_FAIL(kf_sklinear_forward(c->plan, &c->f, NULL, 0), status, needle);            \
        expect_untouched(c);                                                                  \
        free_call(c);                                                                         \
    }

FWD_CASE(x_width, c->f.x.shape[1] = 7, KF_ERR_INVALID_ARGUMENT, "args->x.shape[1]")
FWD_CASE(x_rank0, c->f.x.ndim = 0, KF_ERR_INVALID_ARGUMENT, "args->x.ndim")
FWD_CASE(x_rank7, c->f.x.ndim = 7, KF_ERR_INVALID_ARGUMENT, "args->x.ndim")
FWD_CASE(x_null, c->f.x.data = NULL, KF_ERR_INVALID_ARGUMENT, "args->x")
FWD_CASE(x_strided, c->f.x.strides[0] = 9, KF_ERR_INVALID_ARGUMENT, "args->x.strides")
FWD_CASE(y_rows, c->f.y.shape[0] = 3, KF_ERR_INVALID_ARGUMENT, "args->y.shape[0]")
FWD_CASE(y_width, c->f.y.shape[1] = 8, KF_ERR_INVALID_ARGUMENT, "args->y.shape[1]")
FWD_CASE(y_rank, c->f.y = t3(c->y, 3, 4, 1, 6), KF_ERR_INVALID_ARGUMENT, "args->y.ndim")
FWD_CASE(S1_terms, c->f.S1s.shape[0] = 1, KF_ERR_INVALID_ARGUMENT, "args->S1s.shape[0]")
FWD_CASE(S2_rank, c->f.S2s.shape[2] = 5, KF_ERR_INVALID_ARGUMENT, "args->S2s.shape[2]")
FWD_CASE(U1_dtype, c->f.U1s.dtype = KF_DTYPE_F64, KF_ERR_INVALID_ARGUMENT, "args->U1s.dtype")
FWD_CASE(U2_null, c->f.U2s.data = NULL, KF_ERR_INVALID_ARGUMENT, "args->U2s")
FWD_CASE(bias_missing, c->f.bias.data = NULL, KF_ERR_INVALID_ARGUMENT, "args->bias")
FWD_CASE(bias_shape, c->f.bias.shape[0] = 5, KF_ERR_INVALID_ARGUMENT, "args->bias.shape[0]")
FWD_CASE(struct_size, c->f.struct_size = 8, KF_ERR_INVALID_ARGUMENT, "args")

Test(sklinear_api, forward_rejects_bias_on_plan_without) {
    call *c = make_call();
    kf_sklinear_plan_destroy(c->plan);
    kf_sklinear_desc d = desc_of(8, 6, 2, 3, 0);
    KF_OK_(kf_sklinear_plan_create(c->ctx, &d, &c->plan));
    EXPECT_FAIL(kf_sklinear_forward(c->plan, &c->f, NULL, 0), KF_ERR_INVALID_ARGUMENT,
                "no bias");
    expect_untouched(c);
    c->f.bias.data = NULL;
    KF_OK_(kf_sklinear_forward(c->plan, &c->f, NULL, 0));
    free_call(c);
}

Test(sklinear_api, workspace_too_small) {
    call *c = make_call();
    size_t need = 0;
    KF_OK_(kf_sklinear_workspace_size(c->plan, 4, &need));
    cr_assert(need > 64);
    void *ws = aligned_alloc(64, need);
    EXPECT_FAIL(kf_sklinear_forward(c->plan, &c->f, ws, need - 64), KF_ERR_WORKSPACE_TOO_SMALL,
                "workspace");
    expect_untouched(c);
    KF_OK_(kf_sklinear_forward(c->plan, &c->f, ws, need));
    EXPECT_FAIL(kf_sklinear_workspace_size(c->plan, 0, &need), KF_ERR_INVALID_ARGUMENT, "N");
    free(ws);
    free_call(c);
}

#define BWD_CASE(name, mutate, status, needle)                                                \
    Test(sklinear_api, backward_rejects_##name) {                                             \
        call *c = make_call();                                                                \
        mutate;                                                                               \
        EXPECT_FAIL(kf_sklinear_backward(c->plan, KF_GRAD_OVERWRITE, &c->g, NULL, 0), status, \
                    needle);                                                                  \
        expect_untouched(c);                                                                  \
        free_call(c);                                                                         \
    }

BWD_CASE(dy_rows, c->g.dy.shape[0] = 5, KF_ERR_INVALID_ARGUMENT, "args->dy.shape[0]")
BWD_CASE(dy_null, c->g.dy.data = NULL, KF_ERR_INVALID_ARGUMENT, "args->dy")
BWD_CASE(dx_shape, c->g.dx.shape[1] = 6, KF_ERR_INVALID_ARGUMENT, "args->dx.shape[1]")
BWD_CASE(dS2_shape, c->g.dS2s = t3(c->dy, 3, 2, 3, 4), KF_ERR_INVALID_ARGUMENT,
         "args->dS2s.shape[2]")
BWD_CASE(dbias_shape, c->g.dbias = t3(c->dy, 1, 7, 0, 0), KF_ERR_INVALID_ARGUMENT,
         "args->dbias.shape[0]")

Test(sklinear_api, backward_rejects_grad_mode) {
    call *c = make_call();
    EXPECT_FAIL(kf_sklinear_backward(c->plan, (kf_grad_mode)3, &c->g, NULL, 0),
                KF_ERR_INVALID_ARGUMENT, "grad_mode");
    expect_untouched(c);
    free_call(c);
}

/* ---- initialisation ------------------------------------------------------------------------ */
typedef struct params { float *S1, *S2, *U1, *U2, *b; } params;

static params init_params(kf_sklinear_plan *plan, int64_t in, int64_t out, int64_t L, int64_t k,
                          uint64_t seed, const float *W_init) {
    params p = {malloc((size_t)(L * in * k) * 4), malloc((size_t)(L * k * out) * 4),
                malloc((size_t)(L * k * out) * 4), malloc((size_t)(L * in * k) * 4),
                malloc((size_t)out * 4)};
    kf_sklinear_init_args a;
    kf_sklinear_init_args_init(&a);
    a.seed = seed;
    if (W_init) a.W_init = t3((void *)W_init, 2, out, in, 0);
    a.S1s = t3(p.S1, 3, L, in, k);
    a.S2s = t3(p.S2, 3, L, k, out);
    a.U1s = t3(p.U1, 3, L, k, out);
    a.U2s = t3(p.U2, 3, L, in, k);
    a.bias = t3(p.b, 1, out, 0, 0);
    KF_OK_(kf_sklinear_init_params(plan, &a));
    return p;
}

static void free_params(params *p) { free(p->S1), free(p->S2), free(p->U1), free(p->U2), free(p->b); }

Test(sklinear_api, init_follows_panther) {
    const int64_t in = 13, out = 9, L = 3, k = 5;
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    kf_sklinear_desc d = desc_of(in, out, (int32_t)L, (int32_t)k, 1);
    kf_sklinear_plan *plan;
    KF_OK_(kf_sklinear_plan_create(ctx, &d, &plan));
    float W[9 * 13];
    ref_rng r;
    ref_rng_seed(&r, 9);
    ref_fill_uniform_f32(&r, W, out * in, -1, 1);
    params p = init_params(plan, in, out, L, k, 42, W);
    const double u = 1.0 / sqrt((double)k);
    int plus = 0, n = 0;
    for (int64_t e = 0; e < L * k * out; e++, n++) {
        cr_expect(fabs(fabs((double)p.U1[e]) - u) < 1e-7, "U1s[%lld] = %g", (long long)e, p.U1[e]);
        plus += p.U1[e] > 0;
    }
    for (int64_t e = 0; e < L * in * k; e++, n++) {
        cr_expect(fabs(fabs((double)p.U2[e]) - u) < 1e-7, "U2s[%lld] = %g", (long long)e, p.U2[e]);
        plus += p.U2[e] > 0;
    }
    cr_expect(plus > n / 4 && plus < 3 * n / 4, "signs unbalanced: %d of %d positive", plus, n);
    /* S1s[i] = W_init^T U1s[i]^T, S2s[i] = U2s[i]^T W_init^T, in float64 here. */
    double err = 0.0, ref = 0.0;
    for (int64_t i = 0; i < L; i++)
        for (int64_t a = 0; a < in; a++)
            for (int64_t c = 0; c < k; c++) {
                double s = 0.0;
                for (int64_t o = 0; o < out; o++) s += (double)W[o * in + a] * p.U1[(i * k + c) * out + o];
                err += pow(p.S1[(i * in + a) * k + c] - s, 2), ref += s * s;
            }
    for (int64_t i = 0; i < L; i++)
        for (int64_t c = 0; c < k; c++)
            for (int64_t o = 0; o < out; o++) {
                double s = 0.0;
                for (int64_t a = 0; a < in; a++) s += (double)p.U2[(i * in + a) * k + c] * W[o * in + a];
                err += pow(p.S2[(i * k + c) * out + o] - s, 2), ref += s * s;
            }
    cr_expect(sqrt(err / ref) < 1e-6, "S1s/S2s rel err %g", sqrt(err / ref));
    const double bound = 1.0 / sqrt((double)out);
    for (int64_t o = 0; o < out; o++)
        cr_expect(fabs(p.b[o]) <= bound && p.b[o] != 0.0f, "bias[%lld] = %g", (long long)o, p.b[o]);
    free_params(&p);
    kf_sklinear_plan_destroy(plan);
    kf_context_destroy(ctx);
}

Test(sklinear_api, init_is_a_function_of_the_seed) {
    const int64_t in = 40, out = 30, L = 2, k = 4;
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    kf_sklinear_desc d = desc_of(in, out, (int32_t)L, (int32_t)k, 1);
    kf_sklinear_plan *plan;
    KF_OK_(kf_sklinear_plan_create(ctx, &d, &plan));
    params a = init_params(plan, in, out, L, k, 7, NULL), b = init_params(plan, in, out, L, k, 7, NULL),
           c = init_params(plan, in, out, L, k, 8, NULL);
    cr_expect(memcmp(a.S1, b.S1, (size_t)(L * in * k) * 4) == 0, "same seed, different S1s");
    cr_expect(memcmp(a.S2, b.S2, (size_t)(L * k * out) * 4) == 0, "same seed, different S2s");
    cr_expect(memcmp(a.b, b.b, (size_t)out * 4) == 0, "same seed, different bias");
    cr_expect(memcmp(a.S1, c.S1, (size_t)(L * in * k) * 4) != 0, "seeds 7 and 8 give the same S1s");
    /* Without W_init, W is Kaiming-uniform [in, out] with bound 1/sqrt(out): S1s = W U1^T has
     * per-element variance out * (1/(3 out)) * (1/k) = 1/(3k). */
    double m2 = 0.0;
    for (int64_t e = 0; e < L * in * k; e++) m2 += (double)a.S1[e] * a.S1[e];
    m2 /= (double)(L * in * k);
    cr_expect(m2 > 0.5 / (3.0 * k) && m2 < 2.0 / (3.0 * k), "S1s mean square %g, expected ~%g", m2,
              1.0 / (3.0 * k));
    free_params(&a), free_params(&b), free_params(&c);
    kf_sklinear_plan_destroy(plan);
    kf_context_destroy(ctx);
}

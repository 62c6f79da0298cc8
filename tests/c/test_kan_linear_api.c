/* kf_kan_linear_* contract beyond the math: bad descriptors and arguments (shapes, a grid that
 * decreases or holds a non-finite knot, a spline_scaler given or missing against the plan, a
 * workspace too small) get a status and a message naming the argument, with nothing written. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kfuse.h"
#include "kf_test.h"
#include "ref_rnn.h"

static kf_kan_linear_desc desc_of(int64_t in, int64_t out, int32_t G, int32_t k, int32_t scaled) {
    kf_kan_linear_desc d;
    kf_kan_linear_desc_init(&d);
    d.in_features = in, d.out_features = out, d.grid_size = G, d.spline_order = k;
    d.standalone_scale = scaled;
    return d;
}

Test(kan_linear_api, bad_descriptors) {
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    kf_kan_linear_plan *plan = (kf_kan_linear_plan *)&plan; /* must be reset to NULL on failure */
    kf_kan_linear_desc d = desc_of(8, 8, 0, 3, 1);
    EXPECT_FAIL(kf_kan_linear_plan_create(ctx, &d, &plan), KF_ERR_INVALID_ARGUMENT, "grid_size");
    cr_expect(plan == NULL);
    d = desc_of(8, 8, -2, 3, 1);
    EXPECT_FAIL(kf_kan_linear_plan_create(ctx, &d, &plan), KF_ERR_INVALID_ARGUMENT, "grid_size");
    d = desc_of(8, 8, 5, -1, 1);
    EXPECT_FAIL(kf_kan_linear_plan_create(ctx, &d, &plan), KF_ERR_INVALID_ARGUMENT,
                "spline_order");
    d = desc_of(0, 8, 5, 3, 1);
    EXPECT_FAIL(kf_kan_linear_plan_create(ctx, &d, &plan), KF_ERR_INVALID_ARGUMENT, "in_features");
    d = desc_of(8, -1, 5, 3, 1);
    EXPECT_FAIL(kf_kan_linear_plan_create(ctx, &d, &plan), KF_ERR_INVALID_ARGUMENT,
                "out_features");
    d = desc_of(8, 8, 5, 3, 2);
    EXPECT_FAIL(kf_kan_linear_plan_create(ctx, &d, &plan), KF_ERR_INVALID_ARGUMENT,
                "standalone_scale");
    d = desc_of(1 << 28, 8, 5, 3, 1); /* in * (G + k + 1) = 9 * 2^28 > INT32_MAX */
    EXPECT_FAIL(kf_kan_linear_plan_create(ctx, &d, &plan), KF_ERR_INVALID_ARGUMENT, "too large");
    d = desc_of(8, 8, INT32_MAX, INT32_MAX, 1); /* G + 2k + 1 overflows int32 */
    EXPECT_FAIL(kf_kan_linear_plan_create(ctx, &d, &plan), KF_ERR_INVALID_ARGUMENT, "too large");
    d = desc_of(8, 8, 5, 3, 1);
    d.dtype = KF_DTYPE_I32;
    EXPECT_FAIL(kf_kan_linear_plan_create(ctx, &d, &plan), KF_ERR_UNSUPPORTED, "dtype");
    d = desc_of(8, 8, 5, 3, 1);
    d.struct_size = 4;
    EXPECT_FAIL(kf_kan_linear_plan_create(ctx, &d, &plan), KF_ERR_INVALID_ARGUMENT, "desc");
    EXPECT_FAIL(kf_kan_linear_plan_create(NULL, &d, &plan), KF_ERR_INVALID_ARGUMENT, "ctx");
    EXPECT_FAIL(kf_kan_linear_plan_create(ctx, NULL, &plan), KF_ERR_INVALID_ARGUMENT, "desc");
    EXPECT_FAIL(kf_kan_linear_plan_create(ctx, &d, NULL), KF_ERR_INVALID_ARGUMENT, "out");
    /* The smallest layer: G = 1, k = 0 (one interval, a piecewise-constant spline). */
    d = desc_of(1, 1, 1, 0, 0);
    KF_OK_(kf_kan_linear_plan_create(ctx, &d, &plan));
    kf_kan_linear_plan_destroy(plan);
    kf_kan_linear_plan_destroy(NULL);
    kf_context_destroy(ctx);
}

/* A valid call on [N, in] = [4, 5] -> [4, 6] with G = 3, k = 2 (8 knots, C = 5) and a scaler,
 * which each case breaks in one place. Outputs start as sentinels a rejected call leaves alone. */
enum { N_ = 4, IN_ = 5, OUT_ = 6, G_ = 3, K_ = 2, NK_ = G_ + 2 * K_ + 1, C_ = G_ + K_ };

typedef struct call {
    kf_context *ctx;
    kf_kan_linear_plan *plan;
    float x[N_ * IN_], grid[IN_ * NK_], bw[OUT_ * IN_], sw[OUT_ * IN_ * C_], sc[OUT_ * IN_];
    float y[N_ * OUT_], dy[N_ * OUT_], dx[N_ * IN_], dbw[OUT_ * IN_], dsw[OUT_ * IN_ * C_],
        dsc[OUT_ * IN_];
    kf_kan_linear_forward_args f;
    kf_kan_linear_backward_args g;
} call;

static call *make_call(int scaled) {
    call *c = calloc(1, sizeof *c);
    c->ctx = make_ctx(KF_DEVICE_CPU, 1);
    kf_kan_linear_desc d = desc_of(IN_, OUT_, G_, K_, scaled);
    KF_OK_(kf_kan_linear_plan_create(c->ctx, &d, &c->plan));
    kf_tensor gt = t3(c->grid, 2, IN_, NK_, 0);
    KF_OK_(kf_kan_linear_uniform_grid(c->plan, -1.0f, 1.0f, &gt));
    ref_rng r;
    ref_rng_seed(&r, 5);
    ref_fill_uniform_f32(&r, c->x, N_ * IN_, -1.5, 1.5);
    ref_fill_uniform_f32(&r, c->bw, OUT_ * IN_, -0.5, 0.5);
    ref_fill_uniform_f32(&r, c->sw, OUT_ * IN_ * C_, -0.5, 0.5);
    ref_fill_uniform_f32(&r, c->sc, OUT_ * IN_, -1, 1);
    ref_fill_uniform_f32(&r, c->dy, N_ * OUT_, -1, 1);
    for (int i = 0; i < N_ * OUT_; i++) c->y[i] = 1234.5f;
    for (int i = 0; i < N_ * IN_; i++) c->dx[i] = 77.0f;
    for (int i = 0; i < OUT_ * IN_; i++) c->dbw[i] = c->dsc[i] = 77.0f;
    for (int i = 0; i < OUT_ * IN_ * C_; i++) c->dsw[i] = 77.0f;
    kf_kan_linear_forward_args_init(&c->f);
    c->f.x = t3(c->x, 2, N_, IN_, 0);
    c->f.grid = gt;
    c->f.base_weight = t3(c->bw, 2, OUT_, IN_, 0);
    c->f.spline_weight = t3(c->sw, 3, OUT_, IN_, C_);
    if (scaled) c->f.spline_scaler = t3(c->sc, 2, OUT_, IN_, 0);
    c->f.y = t3(c->y, 2, N_, OUT_, 0);
    kf_kan_linear_backward_args_init(&c->g);
    c->g.x = c->f.x, c->g.grid = c->f.grid, c->g.base_weight = c->f.base_weight;
    c->g.spline_weight = c->f.spline_weight, c->g.spline_scaler = c->f.spline_scaler;
    c->g.dy = t3(c->dy, 2, N_, OUT_, 0);
    c->g.dx = t3(c->dx, 2, N_, IN_, 0);
    c->g.dbase_weight = t3(c->dbw, 2, OUT_, IN_, 0);
    c->g.dspline_weight = t3(c->dsw, 3, OUT_, IN_, C_);
    if (scaled) c->g.dspline_scaler = t3(c->dsc, 2, OUT_, IN_, 0);
    return c;
}

static void free_call(call *c) {
    kf_kan_linear_plan_destroy(c->plan);
    kf_context_destroy(c->ctx);
    free(c);
}

static void expect_untouched(const call *c) {
    for (int i = 0; i < N_ * OUT_; i++) cr_expect(c->y[i] == 1234.5f, "y[%d] written", i);
    for (int i = 0; i < N_ * IN_; i++) cr_expect(c->dx[i] == 77.0f, "dx[%d] written", i);
    for (int i = 0; i < OUT_ * IN_; i++) {
        cr_expect(c->dbw[i] == 77.0f, "dbase_weight[%d] written", i);
        cr_expect(c->dsc[i] == 77.0f, "dspline_scaler[%d] written", i);
    }
    for (int i = 0; i < OUT_ * IN_ * C_; i++)
        cr_expect(c->dsw[i] == 77.0f, "dspline_weight[%d] written", i);
}

/* The unbroken call succeeds (so every failure below is the mutation's doing). */
Test(kan_linear_api, valid_calls_succeed) {
    for (int scaled = 0; scaled < 2; scaled++) {
        call *c = make_call(scaled);
        KF_OK_(kf_kan_linear_forward(c->plan, &c->f, NULL, 0));
        KF_OK_(kf_kan_linear_backward(c->plan, KF_GRAD_OVERWRITE, &c->g, NULL, 0));
        for (int i = 0; i < N_ * OUT_; i++) cr_expect(isfinite(c->y[i]) && c->y[i] != 1234.5f);
        for (int i = 0; i < N_ * IN_; i++) cr_expect(isfinite(c->dx[i]) && c->dx[i] != 77.0f);
        cr_expect(strcmp(kf_last_error_message(), "") == 0);
        free_call(c);
    }
}

#define FWD_CASE(name, scaled, mutate, status, needle)                                        \
    Test(kan_linear_api, forward_rejects_##name) {                                            \
        call *c = make_call(scaled);                                                          \
        mutate;                                                                               \
        EXPECT_FAIL(kf_kan_linear_forward(c->plan, &c->f, NULL, 0), status, needle);          \
        expect_untouched(c);                                                                  \
        free_call(c);                                                                         \
    }

FWD_CASE(x_width, 1, c->f.x.shape[1] = 4, KF_ERR_INVALID_ARGUMENT, "args->x.shape[1]")
FWD_CASE(x_rank0, 1, c->f.x.ndim = 0, KF_ERR_INVALID_ARGUMENT, "args->x.ndim")
FWD_CASE(x_rank7, 1, c->f.x.ndim = 7, KF_ERR_INVALID_ARGUMENT, "args->x.ndim")
FWD_CASE(x_null, 1, c->f.x.data = NULL, KF_ERR_INVALID_ARGUMENT, "args->x")
FWD_CASE(x_strided, 1, c->f.x.strides[0] = 9, KF_ERR_INVALID_ARGUMENT, "args->x.strides")
FWD_CASE(y_rows, 1, c->f.y.shape[0] = 3, KF_ERR_INVALID_ARGUMENT, "args->y.shape[0]")
FWD_CASE(y_width, 1, c->f.y.shape[1] = 5, KF_ERR_INVALID_ARGUMENT, "args->y.shape[1]")
FWD_CASE(y_rank, 1, c->f.y = t3(c->y, 3, N_, 1, OUT_), KF_ERR_INVALID_ARGUMENT, "args->y.ndim")
FWD_CASE(y_null, 1, c->f.y.data = NULL, KF_ERR_INVALID_ARGUMENT, "args->y")
FWD_CASE(grid_knots, 1, c->f.grid.shape[1] = NK_ - 1, KF_ERR_INVALID_ARGUMENT,
         "args->grid.shape[1]")
FWD_CASE(grid_features, 1, c->f.grid.shape[0] = IN_ + 1, KF_ERR_INVALID_ARGUMENT,
         "args->grid.shape[0]")
FWD_CASE(grid_null, 1, c->f.grid.data = NULL, KF_ERR_INVALID_ARGUMENT, "args->grid")
FWD_CASE(grid_decreasing, 1, c->grid[2 * NK_ + 5] = c->grid[2 * NK_ + 4] - 0.01f,
         KF_ERR_INVALID_ARGUMENT, "(feature 2) decreases")
FWD_CASE(grid_nan, 1, c->grid[3 * NK_ + 1] = NAN, KF_ERR_INVALID_ARGUMENT, "args->grid[3][1]")
FWD_CASE(grid_inf, 1, c->grid[4 * NK_ + NK_ - 1] = INFINITY, KF_ERR_INVALID_ARGUMENT,
         "(feature 4), expected a finite knot")
FWD_CASE(base_shape, 1, c->f.base_weight.shape[0] = OUT_ - 1, KF_ERR_INVALID_ARGUMENT,
         "args->base_weight.shape[0]")
FWD_CASE(base_dtype, 1, c->f.base_weight.dtype = KF_DTYPE_F64, KF_ERR_INVALID_ARGUMENT,
         "args->base_weight.dtype")
FWD_CASE(spline_coeffs, 1, c->f.spline_weight.shape[2] = C_ - 1, KF_ERR_INVALID_ARGUMENT,
         "args->spline_weight.shape[2]")
FWD_CASE(spline_rank, 1, c->f.spline_weight = t3(c->sw, 2, OUT_, IN_ * C_, 0),
         KF_ERR_INVALID_ARGUMENT, "args->spline_weight.ndim")
FWD_CASE(scaler_missing, 1, c->f.spline_scaler.data = NULL, KF_ERR_INVALID_ARGUMENT,
         "args->spline_scaler")
FWD_CASE(scaler_shape, 1, c->f.spline_scaler.shape[1] = IN_ + 1, KF_ERR_INVALID_ARGUMENT,
         "args->spline_scaler.shape[1]")
FWD_CASE(scaler_on_plan_without, 0, c->f.spline_scaler = t3(c->sc, 2, OUT_, IN_, 0),
         KF_ERR_INVALID_ARGUMENT, "standalone_scale = 0")
FWD_CASE(struct_size, 1, c->f.struct_size = 8, KF_ERR_INVALID_ARGUMENT, "args")

Test(kan_linear_api, forward_rejects_null_plan_and_args) {
    call *c = make_call(1);
    EXPECT_FAIL(kf_kan_linear_forward(NULL, &c->f, NULL, 0), KF_ERR_INVALID_ARGUMENT, "plan");
    EXPECT_FAIL(kf_kan_linear_forward(c->plan, NULL, NULL, 0), KF_ERR_INVALID_ARGUMENT, "args");
    expect_untouched(c);
    free_call(c);
}

Test(kan_linear_api, workspace_too_small) {
    call *c = make_call(1);
    size_t need = 0;
    KF_OK_(kf_kan_linear_workspace_size(c->plan, N_, &need));
    cr_assert(need > 64);
    char *ws = aligned_alloc(64, need + 64);
    EXPECT_FAIL(kf_kan_linear_forward(c->plan, &c->f, ws, need - 64), KF_ERR_WORKSPACE_TOO_SMALL,
                "workspace");
    EXPECT_FAIL(kf_kan_linear_backward(c->plan, KF_GRAD_OVERWRITE, &c->g, ws, need - 4),
                KF_ERR_WORKSPACE_TOO_SMALL, "workspace");
    EXPECT_FAIL(kf_kan_linear_forward(c->plan, &c->f, ws + 4, need), KF_ERR_INVALID_ARGUMENT,
                "aligned");
    EXPECT_FAIL(kf_kan_linear_forward(c->plan, &c->f, NULL, 64), KF_ERR_INVALID_ARGUMENT,
                "workspace");
    expect_untouched(c);
    KF_OK_(kf_kan_linear_forward(c->plan, &c->f, ws, need));
    KF_OK_(kf_kan_linear_backward(c->plan, KF_GRAD_OVERWRITE, &c->g, ws, need));
    EXPECT_FAIL(kf_kan_linear_workspace_size(c->plan, 0, &need), KF_ERR_INVALID_ARGUMENT, "N");
    EXPECT_FAIL(kf_kan_linear_workspace_size(c->plan, -5, &need), KF_ERR_INVALID_ARGUMENT, "N");
    EXPECT_FAIL(kf_kan_linear_workspace_size(NULL, 4, &need), KF_ERR_INVALID_ARGUMENT, "plan");
    free(ws);
    free_call(c);
}

#define BWD_CASE(name, scaled, mutate, status, needle)                                        \
    Test(kan_linear_api, backward_rejects_##name) {                                           \
        call *c = make_call(scaled);                                                          \
        mutate;                                                                               \
        EXPECT_FAIL(kf_kan_linear_backward(c->plan, KF_GRAD_OVERWRITE, &c->g, NULL, 0),       \
                    status, needle);                                                          \
        EXPECT_FAIL(kf_kan_linear_backward(c->plan, KF_GRAD_ACCUMULATE, &c->g, NULL, 0),      \
                    status, needle);                                                          \
        expect_untouched(c);                                                                  \
        free_call(c);                                                                         \
    }

BWD_CASE(dy_rows, 1, c->g.dy.shape[0] = 5, KF_ERR_INVALID_ARGUMENT, "args->dy.shape[0]")
BWD_CASE(dy_null, 1, c->g.dy.data = NULL, KF_ERR_INVALID_ARGUMENT, "args->dy")
BWD_CASE(dx_shape, 1, c->g.dx.shape[1] = OUT_, KF_ERR_INVALID_ARGUMENT, "args->dx.shape[1]")
BWD_CASE(dbase_shape, 1, c->g.dbase_weight.shape[1] = IN_ - 1, KF_ERR_INVALID_ARGUMENT,
         "args->dbase_weight.shape[1]")
BWD_CASE(dspline_shape, 1, c->g.dspline_weight.shape[2] = C_ + 1, KF_ERR_INVALID_ARGUMENT,
         "args->dspline_weight.shape[2]")
BWD_CASE(dscaler_shape, 1, c->g.dspline_scaler.shape[0] = 1, KF_ERR_INVALID_ARGUMENT,
         "args->dspline_scaler.shape[0]")
BWD_CASE(dscaler_on_plan_without, 0, c->g.dspline_scaler = t3(c->dsc, 2, OUT_, IN_, 0),
         KF_ERR_INVALID_ARGUMENT, "args->dspline_scaler is given")
BWD_CASE(scaler_missing, 1, c->g.spline_scaler.data = NULL, KF_ERR_INVALID_ARGUMENT,
         "args->spline_scaler")
BWD_CASE(grid_decreasing, 1, c->grid[0] = c->grid[1] + 1.0f, KF_ERR_INVALID_ARGUMENT,
         "(feature 0) decreases")
BWD_CASE(grid_knots, 1, c->g.grid.shape[1] = NK_ + 1, KF_ERR_INVALID_ARGUMENT,
         "args->grid.shape[1]")
BWD_CASE(x_width, 1, c->g.x.shape[1] = IN_ + 1, KF_ERR_INVALID_ARGUMENT, "args->x.shape[1]")
BWD_CASE(struct_size, 1, c->g.struct_size = 3, KF_ERR_INVALID_ARGUMENT, "args")

Test(kan_linear_api, backward_rejects_grad_mode) {
    call *c = make_call(1);
    EXPECT_FAIL(kf_kan_linear_backward(c->plan, (kf_grad_mode)3, &c->g, NULL, 0),
                KF_ERR_INVALID_ARGUMENT, "grad_mode");
    EXPECT_FAIL(kf_kan_linear_backward(c->plan, (kf_grad_mode)0, &c->g, NULL, 0),
                KF_ERR_INVALID_ARGUMENT, "grad_mode");
    expect_untouched(c);
    free_call(c);
}

Test(kan_linear_api, uniform_grid_rejects) {
    call *c = make_call(1);
    float grid[IN_ * NK_ + 1];
    for (int i = 0; i < IN_ * NK_ + 1; i++) grid[i] = 55.0f;
    kf_tensor g = t3(grid, 2, IN_, NK_, 0);
    EXPECT_FAIL(kf_kan_linear_uniform_grid(c->plan, 1.0f, 1.0f, &g), KF_ERR_INVALID_ARGUMENT,
                "lo = 1, hi = 1");
    EXPECT_FAIL(kf_kan_linear_uniform_grid(c->plan, 2.0f, -1.0f, &g), KF_ERR_INVALID_ARGUMENT,
                "lo < hi");
    EXPECT_FAIL(kf_kan_linear_uniform_grid(c->plan, NAN, 1.0f, &g), KF_ERR_INVALID_ARGUMENT,
                "finite");
    EXPECT_FAIL(kf_kan_linear_uniform_grid(c->plan, -1.0f, INFINITY, &g),
                KF_ERR_INVALID_ARGUMENT, "finite");
    kf_tensor bad = t3(grid, 2, IN_, NK_ + 1, 0);
    EXPECT_FAIL(kf_kan_linear_uniform_grid(c->plan, -1.0f, 1.0f, &bad), KF_ERR_INVALID_ARGUMENT,
                "grid.shape[1]");
    bad = t3(grid, 1, IN_ * NK_, 0, 0);
    EXPECT_FAIL(kf_kan_linear_uniform_grid(c->plan, -1.0f, 1.0f, &bad), KF_ERR_INVALID_ARGUMENT,
                "grid.ndim");
    bad = t3(NULL, 2, IN_, NK_, 0);
    EXPECT_FAIL(kf_kan_linear_uniform_grid(c->plan, -1.0f, 1.0f, &bad), KF_ERR_INVALID_ARGUMENT,
                "grid");
    EXPECT_FAIL(kf_kan_linear_uniform_grid(c->plan, -1.0f, 1.0f, NULL), KF_ERR_INVALID_ARGUMENT,
                "grid");
    EXPECT_FAIL(kf_kan_linear_uniform_grid(NULL, -1.0f, 1.0f, &g), KF_ERR_INVALID_ARGUMENT,
                "plan");
    for (int i = 0; i < IN_ * NK_ + 1; i++) cr_expect(grid[i] == 55.0f, "grid[%d] written", i);
    KF_OK_(kf_kan_linear_uniform_grid(c->plan, -1.0f, 1.0f, &g));
    cr_expect(grid[IN_ * NK_] == 55.0f, "written past the grid");
    free_call(c);
}

/* A failed call leaves an error message; the next successful call clears it. */
Test(kan_linear_api, message_cleared_by_success) {
    call *c = make_call(1);
    c->f.x.shape[1] = 3;
    cr_expect(kf_kan_linear_forward(c->plan, &c->f, NULL, 0) == KF_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(kf_last_error_message(), "kf_kan_linear_forward") != NULL,
              "message \"%s\" does not name the call", kf_last_error_message());
    c->f.x.shape[1] = IN_;
    KF_OK_(kf_kan_linear_forward(c->plan, &c->f, NULL, 0));
    cr_expect(strcmp(kf_last_error_message(), "") == 0);
    free_call(c);
}

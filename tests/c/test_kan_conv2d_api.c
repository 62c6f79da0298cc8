/* kf_kan_conv2d_* contract beyond the math: bad descriptors (kernel geometry, channels, the
 * per-patch KANLinear's fields) and bad arguments (image ranks and shapes, an image smaller than
 * the dilated kernel, outputs of the wrong extents, a decreasing grid, a workspace too small, a
 * bad grad_mode) get a status and a message naming the argument, with nothing written. */
#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

#include "kfuse.h"
#include "kf_test.h"
#include "ref_rnn.h"

static kf_kan_conv2d_desc desc_of(int64_t cin, int64_t cout, int32_t kh, int32_t kw) {
    kf_kan_conv2d_desc d;
    kf_kan_conv2d_desc_init(&d);
    d.in_channels = cin, d.out_channels = cout, d.kernel_h = kh, d.kernel_w = kw;
    return d;
}

Test(kan_conv2d_api, desc_defaults) {
    kf_kan_conv2d_desc d;
    memset(&d, 0x5a, sizeof d);
    kf_kan_conv2d_desc_init(&d);
    cr_expect(d.struct_size == sizeof d);
    cr_expect(d.in_channels == 0 && d.out_channels == 0 && d.kernel_h == 0 && d.kernel_w == 0);
    cr_expect(d.stride_h == 1 && d.stride_w == 1 && d.pad_h == 0 && d.pad_w == 0);
    cr_expect(d.dilation_h == 1 && d.dilation_w == 1);
    cr_expect(d.grid_size == 5 && d.spline_order == 3 && d.standalone_scale == 1);
    cr_expect(d.dtype == KF_DTYPE_F32);
    kf_kan_conv2d_desc_init(NULL);
}

Test(kan_conv2d_api, bad_descriptors) {
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    kf_kan_conv2d_plan *plan = (kf_kan_conv2d_plan *)&plan; /* reset to NULL on failure */
    kf_kan_conv2d_desc d = desc_of(0, 4, 3, 3);
    EXPECT_FAIL(kf_kan_conv2d_plan_create(ctx, &d, &plan), KF_ERR_INVALID_ARGUMENT,
                "in_channels");
    cr_expect(plan == NULL);
    d = desc_of(2, 0, 3, 3);
    EXPECT_FAIL(kf_kan_conv2d_plan_create(ctx, &d, &plan), KF_ERR_INVALID_ARGUMENT,
                "out_channels");
    const struct { size_t off; int32_t v; const char *name; } bad[] = {
        {offsetof(kf_kan_conv2d_desc, kernel_h), 0, "kernel_h"},
        {offsetof(kf_kan_conv2d_desc, kernel_w), -3, "kernel_w"},
        {offsetof(kf_kan_conv2d_desc, stride_h), 0, "stride_h"},
        {offsetof(kf_kan_conv2d_desc, stride_w), -1, "stride_w"},
        {offsetof(kf_kan_conv2d_desc, pad_h), -1, "pad_h"},
        {offsetof(kf_kan_conv2d_desc, pad_w), -2, "pad_w"},
        {offsetof(kf_kan_conv2d_desc, dilation_h), 0, "dilation_h"},
        {offsetof(kf_kan_conv2d_desc, dilation_w), -1, "dilation_w"},
        {offsetof(kf_kan_conv2d_desc, grid_size), 0, "grid_size"},
        {offsetof(kf_kan_conv2d_desc, spline_order), -1, "spline_order"},
        {offsetof(kf_kan_conv2d_desc, standalone_scale), 3, "standalone_scale"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        d = desc_of(2, 4, 3, 3);
        memcpy((char *)&d + bad[i].off, &bad[i].v, sizeof(int32_t));
        EXPECT_FAIL(kf_kan_conv2d_plan_create(ctx, &d, &plan), KF_ERR_INVALID_ARGUMENT,
                    bad[i].name);
    }
    d = desc_of(1 << 20, 4, 64, 64); /* 2^32 features per patch */
    EXPECT_FAIL(kf_kan_conv2d_plan_create(ctx, &d, &plan), KF_ERR_INVALID_ARGUMENT, "features");
    d = desc_of(1 << 16, 4, 64, 64); /* 2^28 features, times G + k + 1 = 9: too large */
    EXPECT_FAIL(kf_kan_conv2d_plan_create(ctx, &d, &plan), KF_ERR_INVALID_ARGUMENT, "too large");
    d = desc_of(2, 4, 3, 3);
    d.dtype = KF_DTYPE_I32;
    EXPECT_FAIL(kf_kan_conv2d_plan_create(ctx, &d, &plan), KF_ERR_UNSUPPORTED, "dtype");
    d = desc_of(2, 4, 3, 3);
    d.struct_size = 8;
    EXPECT_FAIL(kf_kan_conv2d_plan_create(ctx, &d, &plan), KF_ERR_INVALID_ARGUMENT, "desc");
    EXPECT_FAIL(kf_kan_conv2d_plan_create(NULL, &d, &plan), KF_ERR_INVALID_ARGUMENT, "ctx");
    EXPECT_FAIL(kf_kan_conv2d_plan_create(ctx, NULL, &plan), KF_ERR_INVALID_ARGUMENT, "desc");
    EXPECT_FAIL(kf_kan_conv2d_plan_create(ctx, &d, NULL), KF_ERR_INVALID_ARGUMENT, "out");
    kf_kan_conv2d_plan_destroy(NULL);
    kf_context_destroy(ctx);
}

/* A valid call: x [2, 3, 5, 4], kernel 3x2, stride (2, 1), padding (1, 0), dilation (1, 2):
 * Ho = (5 + 2 - 2 - 1) / 2 + 1 = 3, Wo = (4 - 2 - 1) + 1 = 2; F = 18 features, out 4, G 3, k 2.
 * Each case breaks it in one place. Outputs start as sentinels a rejected call leaves alone. */
enum { B_ = 2, CI_ = 3, H_ = 5, W_ = 4, CO_ = 4, HO_ = 3, WO_ = 2, F_ = 18 };
enum { G_ = 3, K_ = 2, NK_ = G_ + 2 * K_ + 1, C_ = G_ + K_ };
enum { NX_ = B_ * CI_ * H_ * W_, NY_ = B_ * CO_ * HO_ * WO_ };

typedef struct call {
    kf_context *ctx;
    kf_kan_conv2d_plan *plan;
    float x[NX_], grid[F_ * NK_], bw[CO_ * F_], sw[CO_ * F_ * C_], sc[CO_ * F_];
    float y[NY_], dy[NY_], dx[NX_], dbw[CO_ * F_], dsw[CO_ * F_ * C_], dsc[CO_ * F_];
    kf_kan_conv2d_forward_args f;
    kf_kan_conv2d_backward_args g;
} call;

static kf_tensor t4(void *p, int64_t a, int64_t b, int64_t c, int64_t d) {
    int64_t sh[4] = {a, b, c, d};
    return tens(p, KF_DTYPE_F32, 4, sh);
}

static call *make_call(void) {
    call *c = calloc(1, sizeof *c);
    c->ctx = make_ctx(KF_DEVICE_CPU, 1);
    kf_kan_conv2d_desc d = desc_of(CI_, CO_, 3, 2);
    d.stride_h = 2, d.pad_h = 1, d.dilation_w = 2, d.grid_size = G_, d.spline_order = K_;
    KF_OK_(kf_kan_conv2d_plan_create(c->ctx, &d, &c->plan));
    kf_tensor gt = t3(c->grid, 2, F_, NK_, 0);
    KF_OK_(kf_kan_conv2d_uniform_grid(c->plan, -1.0f, 1.0f, &gt));
    ref_rng r;
    ref_rng_seed(&r, 11);
    ref_fill_uniform_f32(&r, c->x, NX_, -1.5, 1.5);
    ref_fill_uniform_f32(&r, c->bw, CO_ * F_, -0.3, 0.3);
    ref_fill_uniform_f32(&r, c->sw, CO_ * F_ * C_, -0.3, 0.3);
    ref_fill_uniform_f32(&r, c->sc, CO_ * F_, -1, 1);
    ref_fill_uniform_f32(&r, c->dy, NY_, -1, 1);
    for (int i = 0; i < NY_; i++) c->y[i] = 1234.5f;
    for (int i = 0; i < NX_; i++) c->dx[i] = 77.0f;
    for (int i = 0; i < CO_ * F_; i++) c->dbw[i] = c->dsc[i] = 77.0f;
    for (int i = 0; i < CO_ * F_ * C_; i++) c->dsw[i] = 77.0f;
    kf_kan_conv2d_forward_args_init(&c->f);
    c->f.x = t4(c->x, B_, CI_, H_, W_);
    c->f.grid = gt;
    c->f.base_weight = t3(c->bw, 2, CO_, F_, 0);
    c->f.spline_weight = t3(c->sw, 3, CO_, F_, C_);
    c->f.spline_scaler = t3(c->sc, 2, CO_, F_, 0);
    c->f.y = t4(c->y, B_, CO_, HO_, WO_);
    kf_kan_conv2d_backward_args_init(&c->g);
    c->g.x = c->f.x, c->g.grid = c->f.grid, c->g.base_weight = c->f.base_weight;
    c->g.spline_weight = c->f.spline_weight, c->g.spline_scaler = c->f.spline_scaler;
    c->g.dy = t4(c->dy, B_, CO_, HO_, WO_);
    c->g.dx = t4(c->dx, B_, CI_, H_, W_);
    c->g.dbase_weight = t3(c->dbw, 2, CO_, F_, 0);
    c->g.dspline_weight = t3(c->dsw, 3, CO_, F_, C_);
    c->g.dspline_scaler = t3(c->dsc, 2, CO_, F_, 0);
    return c;
}

static void free_call(call *c) {
    kf_kan_conv2d_plan_destroy(c->plan);
    kf_context_destroy(c->ctx);
    free(c);
}

static void expect_untouched(const call *c, const char *what) {
    int bad = 0;
    for (int i = 0; i < NY_; i++) bad += c->y[i] != 1234.5f;
    for (int i = 0; i < NX_; i++) bad += c->dx[i] != 77.0f;
    for (int i = 0; i < CO_ * F_; i++) bad += c->dbw[i] != 77.0f || c->dsc[i] != 77.0f;
    for (int i = 0; i < CO_ * F_ * C_; i++) bad += c->dsw[i] != 77.0f;
    cr_expect(bad == 0, "%s: a rejected call wrote %d output elements", what, bad);
}

/* The valid call succeeds (so the cases below fail for their one change). */
Test(kan_conv2d_api, valid_call_runs) {
    call *c = make_call();
    KF_OK_(kf_kan_conv2d_forward(c->plan, &c->f, NULL, 0));
    KF_OK_(kf_kan_conv2d_backward(c->plan, KF_GRAD_OVERWRITE, &c->g, NULL, 0));
    for (int i = 0; i < NY_; i++) cr_expect(c->y[i] == c->y[i] && c->y[i] != 1234.5f);
    for (int i = 0; i < NX_; i++) cr_expect(c->dx[i] == c->dx[i] && c->dx[i] != 77.0f);
    free_call(c);
}

Test(kan_conv2d_api, bad_forward_arguments) {
    call *c = make_call();
    kf_kan_conv2d_forward_args a = c->f;
    a.x = t3(c->x, 2, B_ * CI_, H_ * W_, 0);
    EXPECT_FAIL(kf_kan_conv2d_forward(c->plan, &a, NULL, 0), KF_ERR_INVALID_ARGUMENT,
                "args->x.ndim");
    a = c->f;
    a.x = t4(c->x, B_, CI_ + 1, H_ - 1, W_); /* same element count, 4 channels */
    EXPECT_FAIL(kf_kan_conv2d_forward(c->plan, &a, NULL, 0), KF_ERR_INVALID_ARGUMENT,
                "args->x.shape[1]");
    a = c->f;
    a.x = t4(c->x, B_ * W_ / 2, CI_, H_, 2); /* width 2 < dilated kernel 3 */
    EXPECT_FAIL(kf_kan_conv2d_forward(c->plan, &a, NULL, 0), KF_ERR_INVALID_ARGUMENT, "width");
    a = c->f;
    a.x.data = NULL;
    EXPECT_FAIL(kf_kan_conv2d_forward(c->plan, &a, NULL, 0), KF_ERR_INVALID_ARGUMENT, "args->x");
    a = c->f;
    a.y = t4(c->y, B_, CO_, WO_, HO_);
    EXPECT_FAIL(kf_kan_conv2d_forward(c->plan, &a, NULL, 0), KF_ERR_INVALID_ARGUMENT,
                "args->y.shape[2]");
    a = c->f;
    a.y = t3(c->y, 3, B_ * CO_, HO_, WO_);
    EXPECT_FAIL(kf_kan_conv2d_forward(c->plan, &a, NULL, 0), KF_ERR_INVALID_ARGUMENT,
                "args->y.ndim");
    a = c->f;
    a.grid = t3(c->grid, 2, F_ - 1, NK_, 0);
    EXPECT_FAIL(kf_kan_conv2d_forward(c->plan, &a, NULL, 0), KF_ERR_INVALID_ARGUMENT,
                "args->grid");
    a = c->f;
    a.base_weight = t3(c->bw, 2, F_, CO_, 0);
    EXPECT_FAIL(kf_kan_conv2d_forward(c->plan, &a, NULL, 0), KF_ERR_INVALID_ARGUMENT,
                "args->base_weight");
    a = c->f;
    a.spline_scaler.data = NULL;
    EXPECT_FAIL(kf_kan_conv2d_forward(c->plan, &a, NULL, 0), KF_ERR_INVALID_ARGUMENT,
                "args->spline_scaler");
    a = c->f;
    const float saved = c->grid[5 * NK_ + 3];
    c->grid[5 * NK_ + 3] = 9.0f; /* feature 5 decreases after knot 3 */
    EXPECT_FAIL(kf_kan_conv2d_forward(c->plan, &a, NULL, 0), KF_ERR_INVALID_ARGUMENT,
                "args->grid");
    c->grid[5 * NK_ + 3] = saved;
    size_t need = 0;
    KF_OK_(kf_kan_conv2d_workspace_size(c->plan, B_, H_, W_, &need));
    void *ws = xalloc(need);
    EXPECT_FAIL(kf_kan_conv2d_forward(c->plan, &c->f, ws, need - 1), KF_ERR_WORKSPACE_TOO_SMALL,
                "workspace");
    free(ws);
    a.struct_size = 4;
    EXPECT_FAIL(kf_kan_conv2d_forward(c->plan, &a, NULL, 0), KF_ERR_INVALID_ARGUMENT, "args");
    EXPECT_FAIL(kf_kan_conv2d_forward(NULL, &c->f, NULL, 0), KF_ERR_INVALID_ARGUMENT, "plan");
    EXPECT_FAIL(kf_kan_conv2d_forward(c->plan, NULL, NULL, 0), KF_ERR_INVALID_ARGUMENT, "args");
    expect_untouched(c, "forward");
    free_call(c);
}

Test(kan_conv2d_api, bad_backward_arguments) {
    call *c = make_call();
    kf_kan_conv2d_backward_args a = c->g;
    EXPECT_FAIL(kf_kan_conv2d_backward(c->plan, (kf_grad_mode)0, &a, NULL, 0),
                KF_ERR_INVALID_ARGUMENT, "grad_mode");
    a.dy.data = NULL;
    EXPECT_FAIL(kf_kan_conv2d_backward(c->plan, KF_GRAD_OVERWRITE, &a, NULL, 0),
                KF_ERR_INVALID_ARGUMENT, "args->dy");
    a = c->g;
    a.dy = t4(c->dy, B_, CO_, WO_, HO_);
    EXPECT_FAIL(kf_kan_conv2d_backward(c->plan, KF_GRAD_OVERWRITE, &a, NULL, 0),
                KF_ERR_INVALID_ARGUMENT, "args->dy.shape[2]");
    a = c->g;
    a.dx = t4(c->dx, B_, CI_, W_, H_);
    EXPECT_FAIL(kf_kan_conv2d_backward(c->plan, KF_GRAD_OVERWRITE, &a, NULL, 0),
                KF_ERR_INVALID_ARGUMENT, "args->dx.shape[2]");
    a = c->g;
    a.dspline_weight = t3(c->dsw, 3, CO_, F_, C_ + 1);
    EXPECT_FAIL(kf_kan_conv2d_backward(c->plan, KF_GRAD_OVERWRITE, &a, NULL, 0),
                KF_ERR_INVALID_ARGUMENT, "args->dspline_weight");
    a = c->g;
    a.x = t3(c->x, 3, CI_, H_, W_ * B_); /* unbatched x against batched dy */
    EXPECT_FAIL(kf_kan_conv2d_backward(c->plan, KF_GRAD_OVERWRITE, &a, NULL, 0),
                KF_ERR_INVALID_ARGUMENT, "args->dy");
    expect_untouched(c, "backward");
    free_call(c);
}

Test(kan_conv2d_api, workspace_query_and_grid) {
    call *c = make_call();
    size_t n = 0;
    EXPECT_FAIL(kf_kan_conv2d_workspace_size(c->plan, 0, H_, W_, &n), KF_ERR_INVALID_ARGUMENT,
                "batch");
    EXPECT_FAIL(kf_kan_conv2d_workspace_size(c->plan, B_, 0, W_, &n), KF_ERR_INVALID_ARGUMENT,
                "height");
    EXPECT_FAIL(kf_kan_conv2d_workspace_size(c->plan, B_, H_, 2, &n), KF_ERR_INVALID_ARGUMENT,
                "width");
    EXPECT_FAIL(kf_kan_conv2d_workspace_size(NULL, B_, H_, W_, &n), KF_ERR_INVALID_ARGUMENT,
                "plan");
    KF_OK_(kf_kan_conv2d_workspace_size(c->plan, B_, H_, W_, &n));
    cr_expect(n > 0);
    /* Output extents of about 2^32 each (huge padding): Ho Wo overflows int64 and must be
     * refused, not wrapped into a plausible row count (found by tests/fuzz/fuzz_kan_conv.c). */
    kf_kan_conv2d_desc d = desc_of(1, 1, 1, 1);
    d.pad_h = 1073764996, d.pad_w = 1073718654;
    kf_kan_conv2d_plan *huge = NULL;
    KF_OK_(kf_kan_conv2d_plan_create(c->ctx, &d, &huge));
    n = 12345;
    EXPECT_FAIL(kf_kan_conv2d_workspace_size(huge, 1, INT32_MAX - 1, INT32_MAX, &n),
                KF_ERR_INVALID_ARGUMENT, "too many patches");
    d.pad_h = d.pad_w = INT32_MAX;
    kf_kan_conv2d_plan_destroy(huge);
    KF_OK_(kf_kan_conv2d_plan_create(c->ctx, &d, &huge));
    EXPECT_FAIL(kf_kan_conv2d_workspace_size(huge, 1, 1, 1, &n), KF_ERR_INVALID_ARGUMENT,
                "too many patches");
    cr_expect(n == 12345, "a refused query wrote its result");
    kf_kan_conv2d_plan_destroy(huge);
    float g[F_ * NK_];
    kf_tensor gt = t3(g, 2, F_, NK_, 0);
    EXPECT_FAIL(kf_kan_conv2d_uniform_grid(c->plan, 1.0f, 1.0f, &gt), KF_ERR_INVALID_ARGUMENT,
                "lo");
    gt = t3(g, 2, F_ + 1, NK_, 0);
    EXPECT_FAIL(kf_kan_conv2d_uniform_grid(c->plan, -1.0f, 1.0f, &gt), KF_ERR_INVALID_ARGUMENT,
                "grid");
    EXPECT_FAIL(kf_kan_conv2d_uniform_grid(c->plan, -1.0f, 1.0f, NULL), KF_ERR_INVALID_ARGUMENT,
                "grid");
    /* The conv's grid is the per-patch KANLinear's, bit for bit. */
    kf_kan_linear_desc ld;
    kf_kan_linear_desc_init(&ld);
    ld.in_features = F_, ld.out_features = CO_, ld.grid_size = G_, ld.spline_order = K_;
    kf_kan_linear_plan *lp = NULL;
    KF_OK_(kf_kan_linear_plan_create(c->ctx, &ld, &lp));
    gt = t3(g, 2, F_, NK_, 0);
    KF_OK_(kf_kan_linear_uniform_grid(lp, -1.0f, 1.0f, &gt));
    cr_expect(memcmp(g, c->grid, sizeof g) == 0, "conv grid differs from KANLinear's");
    kf_kan_linear_plan_destroy(lp);
    free_call(c);
}

/* Front end of KANConv2d (unfold + KANLinear): validate -> size -> dispatch. The layer is the
 * KAN product of capi/src/kan_linear.c over the patches of x (kf__kan_patches): this file checks
 * the convolution's own arguments (kernel geometry, image shapes) and hands the backends the same
 * records as KANLinear, with `patches` set. */
#include "kan_front.h"

#include <inttypes.h>
#include <stdlib.h>

/* Largest channel count, kernel extent and image extent accepted: kernels index with 32-bit ints
 * per dimension (products are formed in 64 bits). */
#define KF__KAN_CONV_MAX INT32_MAX

KF_API void kf_kan_conv2d_desc_init(kf_kan_conv2d_desc *desc) {
    if (desc == NULL) return;
    kf_kan_conv2d_desc d = {0};
    d.struct_size = sizeof d;
    d.stride_h = d.stride_w = 1;
    d.dilation_h = d.dilation_w = 1;
    d.grid_size = 5;
    d.spline_order = 3;
    d.standalone_scale = 1;
    d.dtype = KF_DTYPE_F32;
    *desc = d;
}

KF_API void kf_kan_conv2d_forward_args_init(kf_kan_conv2d_forward_args *args) {
    if (args == NULL) return;
    kf_kan_conv2d_forward_args a = {0};
    a.struct_size = sizeof a;
    *args = a;
}

KF_API void kf_kan_conv2d_backward_args_init(kf_kan_conv2d_backward_args *args) {
    if (args == NULL) return;
    kf_kan_conv2d_backward_args a = {0};
    a.struct_size = sizeof a;
    *args = a;
}

KF_API kf_status kf_kan_conv2d_plan_create(kf_context *ctx, const kf_kan_conv2d_desc *desc,
                                           kf_kan_conv2d_plan **out) {
    kf__clear_error();
    KF_CHECK(out != NULL, KF_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    KF_CHECK(ctx != NULL, KF_ERR_INVALID_ARGUMENT, "ctx is NULL");
    KF_TRY(kf__check_struct_size(__func__, "desc", desc, sizeof(kf_kan_conv2d_desc)));
    KF_CHECK(desc->in_channels >= 1 && desc->in_channels <= KF__KAN_CONV_MAX,
             KF_ERR_INVALID_ARGUMENT, "desc->in_channels = %" PRId64 ", expected 1..%d",
             desc->in_channels, KF__KAN_CONV_MAX);
    KF_CHECK(desc->out_channels >= 1 && desc->out_channels <= KF__KAN_CONV_MAX,
             KF_ERR_INVALID_ARGUMENT, "desc->out_channels = %" PRId64 ", expected 1..%d",
             desc->out_channels, KF__KAN_CONV_MAX);
    const struct { const char *name; int32_t v, min; } fields[] = {
        {"kernel_h", desc->kernel_h, 1},     {"kernel_w", desc->kernel_w, 1},
        {"stride_h", desc->stride_h, 1},     {"stride_w", desc->stride_w, 1},
        {"pad_h", desc->pad_h, 0},           {"pad_w", desc->pad_w, 0},
        {"dilation_h", desc->dilation_h, 1}, {"dilation_w", desc->dilation_w, 1},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; ++i)
        KF_CHECK(fields[i].v >= fields[i].min, KF_ERR_INVALID_ARGUMENT,
                 "desc->%s = %d, expected >= %d", fields[i].name, (int)fields[i].v,
                 (int)fields[i].min);
    /* F = C_in kh kw features per patch; the KANLinear checks bound F (G + k + 1). */
    int64_t F = 0;
    bool ok = !__builtin_mul_overflow(desc->in_channels, (int64_t)desc->kernel_h * desc->kernel_w,
                                      &F) && F <= KF__KAN_CONV_MAX;
    KF_CHECK(ok, KF_ERR_INVALID_ARGUMENT,
             "desc->in_channels = %" PRId64 " with a %d x %d kernel gives more than %d features "
             "per patch", desc->in_channels, (int)desc->kernel_h, (int)desc->kernel_w,
             KF__KAN_CONV_MAX);
    kf_kan_conv2d_plan p = {0};
    KF_TRY(kf__kan_plan_init(__func__, ctx, F, desc->out_channels, desc->grid_size,
                             desc->spline_order, desc->standalone_scale, desc->dtype, &p.lin));
    p.geom = (kf__kan_patches){.Cin = desc->in_channels,
                               .kh = desc->kernel_h, .kw = desc->kernel_w,
                               .sh = desc->stride_h, .sw = desc->stride_w,
                               .ph = desc->pad_h, .pw = desc->pad_w,
                               .dh = desc->dilation_h, .dw = desc->dilation_w};
    kf_kan_conv2d_plan *h = malloc(sizeof *h);
    KF_CHECK(h != NULL, KF_ERR_OUT_OF_MEMORY, "cannot allocate the plan");
    *h = p;
    *out = h;
    return KF_OK;
}

KF_API void kf_kan_conv2d_plan_destroy(kf_kan_conv2d_plan *plan) { free(plan); }

/* One output extent of torch.nn.Conv2d: (n + 2 pad - dil (k - 1) - 1) / stride + 1, which must
 * be >= 1 (the dilated kernel fits the padded image). */
static kf_status kf__kan_conv_extent(const char *fn, const char *arg, int64_t n, int32_t k,
                                     int32_t stride, int32_t pad, int32_t dil, int64_t *o) {
    KF_CHECK_FN(fn, n >= 1 && n <= KF__KAN_CONV_MAX, KF_ERR_INVALID_ARGUMENT,
                "%s = %" PRId64 ", expected 1..%d", arg, n, KF__KAN_CONV_MAX);
    const int64_t span = (int64_t)dil * (k - 1) + 1, padded = n + 2 * (int64_t)pad;
    KF_CHECK_FN(fn, padded >= span, KF_ERR_INVALID_ARGUMENT,
                "%s = %" PRId64 " with padding %d on each side is %" PRId64 ", smaller than the "
                "dilated kernel's %" PRId64 " (kernel %d, dilation %d)", arg, n, (int)pad, padded,
                span, (int)k, (int)dil);
    *o = (padded - span) / stride + 1;
    return KF_OK;
}

/* The call's patch geometry for B images of H x W, and its N = B Ho Wo rows, checked. */
static kf_status kf__kan_conv_geom(const char *fn, const kf_kan_conv2d_plan *p, const char *bname,
                                   int64_t B, const char *hname, int64_t H, const char *wname,
                                   int64_t W, kf__kan_patches *g, int64_t *N) {
    KF_CHECK_FN(fn, B >= 1 && B <= KF__KAN_CONV_MAX, KF_ERR_INVALID_ARGUMENT,
                "%s = %" PRId64 ", expected 1..%d", bname, B, KF__KAN_CONV_MAX);
    *g = p->geom;
    g->B = B, g->H = H, g->W = W;
    KF_TRY(kf__kan_conv_extent(fn, hname, H, g->kh, g->sh, g->ph, g->dh, &g->Ho));
    KF_TRY(kf__kan_conv_extent(fn, wname, W, g->kw, g->sw, g->pw, g->dw, &g->Wo));
    /* Ho and Wo can each reach about 3 * 2^31 (n + 2 pad), so even Ho Wo can overflow: both
     * products are checked. */
    int64_t hw = 0, n = 0;
    bool ok = !__builtin_mul_overflow(g->Ho, g->Wo, &hw) && !__builtin_mul_overflow(B, hw, &n) &&
              n <= KF__KAN_CONV_MAX;
    KF_CHECK_FN(fn, ok, KF_ERR_INVALID_ARGUMENT,
                "%s = %" PRId64 " images of %" PRId64 " x %" PRId64 " output pixels are too many "
                "patches (at most %d)", bname, B, g->Ho, g->Wo, KF__KAN_CONV_MAX);
    KF_TRY(kf__kan_check_rows(fn, &p->lin, n));
    *N = n;
    return KF_OK;
}

KF_API kf_status kf_kan_conv2d_workspace_size(const kf_kan_conv2d_plan *plan, int64_t batch,
                                              int64_t height, int64_t width,
                                              size_t *workspace_bytes) {
    kf__clear_error();
    KF_CHECK(plan != NULL, KF_ERR_INVALID_ARGUMENT, "plan is NULL");
    kf__kan_patches g;
    int64_t N = 0;
    KF_TRY(kf__kan_conv_geom(__func__, plan, "batch", batch, "height", height, "width", width, &g,
                             &N));
    if (workspace_bytes) *workspace_bytes = plan->lin.ops->workspace(&plan->lin, N, &g);
    return KF_OK;
}

/* The conv layer's tensors are those of its KANLinear. */
static int32_t kf__kan_conv_params(const void *plan, int32_t index, kf__param *out) {
    return kf__kan_params(&((const kf_kan_conv2d_plan *)plan)->lin, index, out);
}

KF_API kf_status kf_kan_conv2d_param_count(const kf_kan_conv2d_plan *plan, int32_t *count) {
    return kf__param_count(__func__, plan, kf__kan_conv_params, count);
}

KF_API kf_status kf_kan_conv2d_param_info(const kf_kan_conv2d_plan *plan, int32_t index,
                                          const char **name, int32_t *ndim, int64_t *shape) {
    return kf__param_info(__func__, plan, kf__kan_conv_params, index, name, ndim, shape);
}

KF_API kf_status kf_kan_conv2d_output_size(const kf_kan_conv2d_plan *plan, int64_t height,
                                           int64_t width, int64_t *out_height,
                                           int64_t *out_width) {
    kf__clear_error();
    KF_CHECK(plan != NULL, KF_ERR_INVALID_ARGUMENT, "plan is NULL");
    kf__kan_patches g;
    int64_t N = 0;
    KF_TRY(kf__kan_conv_geom(__func__, plan, "batch", 1, "height", height, "width", width, &g,
                             &N));
    if (out_height) *out_height = g.Ho;
    if (out_width) *out_width = g.Wo;
    return KF_OK;
}

KF_API kf_status kf_kan_conv2d_uniform_grid(const kf_kan_conv2d_plan *plan, float lo, float hi,
                                            kf_tensor *grid) {
    kf__clear_error();
    KF_CHECK(plan != NULL, KF_ERR_INVALID_ARGUMENT, "plan is NULL");
    return kf__kan_uniform_grid(__func__, &plan->lin, lo, hi, grid);
}

kf_status kf__kan_conv_input(const char *fn, const struct kf_kan_conv2d_plan *p,
                             const kf_tensor *x, kf__kan_patches *g, int64_t *N) {
    KF_CHECK_FN(fn, x->data != NULL, KF_ERR_INVALID_ARGUMENT,
                "args->x.data is NULL (required tensor)");
    KF_CHECK_FN(fn, x->ndim == 3 || x->ndim == 4, KF_ERR_INVALID_ARGUMENT,
                "args->x.ndim = %d, expected 4 ([batch, in_channels, height, width]) or 3 "
                "([in_channels, height, width])", (int)x->ndim);
    const int32_t o = x->ndim - 3;
    int64_t shape[4] = {-1, p->geom.Cin, -1, -1};
    bool present;
    KF_TRY(kf__check_tensor(p->lin.ctx, fn, "args->x", x, p->lin.dtype, x->ndim, shape + 1 - o,
                            false, &present));
    const char *hname = o ? "args->x.shape[2] (height)" : "args->x.shape[1] (height)";
    const char *wname = o ? "args->x.shape[3] (width)" : "args->x.shape[2] (width)";
    return kf__kan_conv_geom(fn, p, "args->x.shape[0] (batch)", o ? x->shape[0] : 1, hname,
                             x->shape[o + 1], wname, x->shape[o + 2], g, N);
}

/* A tensor of x's rank with `channels` channels and the geometry's (or the input's) extents. */
static kf_status kf__kan_conv_image(const char *fn, const kf_kan_conv2d_plan *p, const char *arg,
                                    const kf_tensor *t, int32_t ndim, const kf__kan_patches *g,
                                    int64_t channels, bool output, bool optional, bool *present) {
    const int64_t h = output ? g->Ho : g->H, w = output ? g->Wo : g->W;
    int64_t shape[4] = {g->B, channels, h, w};
    return kf__check_tensor(p->lin.ctx, fn, arg, t, p->lin.dtype, ndim, shape + 4 - ndim,
                            optional, present);
}

KF_API kf_status kf_kan_conv2d_forward(kf_kan_conv2d_plan *plan,
                                       const kf_kan_conv2d_forward_args *args, void *workspace,
                                       size_t workspace_bytes) {
    kf__clear_error();
    KF_CHECK(plan != NULL, KF_ERR_INVALID_ARGUMENT, "plan is NULL");
    KF_TRY(kf__check_struct_size(__func__, "args", args, sizeof(kf_kan_conv2d_forward_args)));
    kf__kan_patches g;
    kf__kan_fwd c = {.plan = &plan->lin, .patches = &g, .x = args->x.data, .y = args->y.data};
    KF_TRY(kf__kan_conv_input(__func__, plan, &args->x, &g, &c.N));
    KF_TRY(kf__kan_check_params(&plan->lin, __func__, &args->grid, &args->base_weight,
                                &args->spline_weight, &args->spline_scaler, &c.grid, &c.base,
                                &c.spline, &c.scaler));
    bool present;
    KF_TRY(kf__kan_conv_image(__func__, plan, "args->y", &args->y, args->x.ndim, &g,
                              plan->lin.out, true, false, &present));
    return kf__kan_run_forward(__func__, &c, workspace, workspace_bytes);
}

KF_API kf_status kf_kan_conv2d_backward(kf_kan_conv2d_plan *plan, kf_grad_mode grad_mode,
                                        const kf_kan_conv2d_backward_args *args, void *workspace,
                                        size_t workspace_bytes) {
    kf__clear_error();
    KF_CHECK(plan != NULL, KF_ERR_INVALID_ARGUMENT, "plan is NULL");
    KF_TRY(kf__check_grad_mode(__func__, grad_mode));
    KF_TRY(kf__check_struct_size(__func__, "args", args, sizeof(kf_kan_conv2d_backward_args)));
    kf__kan_patches g;
    kf__kan_bwd c = {.plan = &plan->lin, .patches = &g, .x = args->x.data,
                     .accumulate = grad_mode == KF_GRAD_ACCUMULATE};
    KF_TRY(kf__kan_conv_input(__func__, plan, &args->x, &g, &c.N));
    KF_TRY(kf__kan_check_params(&plan->lin, __func__, &args->grid, &args->base_weight,
                                &args->spline_weight, &args->spline_scaler, &c.grid, &c.base,
                                &c.spline, &c.scaler));
    const int32_t nd = args->x.ndim;
    bool present;
    KF_TRY(kf__kan_conv_image(__func__, plan, "args->dy", &args->dy, nd, &g, plan->lin.out, true,
                              false, &present));
    c.dy = args->dy.data;
    KF_TRY(kf__kan_conv_image(__func__, plan, "args->dx", &args->dx, nd, &g, g.Cin, false, true,
                              &present));
    c.dx = present ? args->dx.data : NULL;
    KF_TRY(kf__kan_check_grads(&plan->lin, __func__, &args->dbase_weight, &args->dspline_weight,
                               &args->dspline_scaler, &c));
    return kf__kan_run_backward(__func__, &c, workspace, workspace_bytes);
}

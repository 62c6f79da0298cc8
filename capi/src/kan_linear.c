/* Front end of the KAN linear layer (efficient-kan's KANLinear): validate -> size -> dispatch. No
 * math here beyond the grid check and the uniform grid's staging; the backends receive records
 * whose every pointer, extent and buffer size has been checked. */
#include "backend.h"
#include "host.h"
#include "kan_front.h"

#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Largest extent accepted, also for in * (G + k + 1): BLAS and kernels index rows and columns
 * with 32-bit ints. */
#define KF__KAN_MAX_EXTENT INT32_MAX

KF_API void kf_kan_linear_desc_init(kf_kan_linear_desc *desc) {
    if (desc == NULL) return;
    kf_kan_linear_desc d = {0};
    d.struct_size = sizeof d;
    d.grid_size = 5;
    d.spline_order = 3;
    d.standalone_scale = 1;
    d.dtype = KF_DTYPE_F32;
    *desc = d;
}

KF_API void kf_kan_linear_forward_args_init(kf_kan_linear_forward_args *args) {
    if (args == NULL) return;
    kf_kan_linear_forward_args a = {0};
    a.struct_size = sizeof a;
    *args = a;
}

KF_API void kf_kan_linear_backward_args_init(kf_kan_linear_backward_args *args) {
    if (args == NULL) return;
    kf_kan_linear_backward_args a = {0};
    a.struct_size = sizeof a;
    *args = a;
}

kf_status kf__kan_plan_init(const char *fn, kf_context *ctx, int64_t in, int64_t out, int32_t G,
                            int32_t k, int32_t standalone_scale, int32_t dtype,
                            struct kf_kan_linear_plan *p) {
    KF_CHECK_FN(fn, G >= 1, KF_ERR_INVALID_ARGUMENT, "desc->grid_size = %d, expected >= 1", (int)G);
    KF_CHECK_FN(fn, k >= 0, KF_ERR_INVALID_ARGUMENT, "desc->spline_order = %d, expected >= 0",
                (int)k);
    KF_CHECK_FN(fn, standalone_scale == 0 || standalone_scale == 1, KF_ERR_INVALID_ARGUMENT,
                "desc->standalone_scale = %d, expected 0 or 1", (int)standalone_scale);
    KF_TRY(kf__check_layer_dtype(fn, dtype));
    /* Knots per feature and the combined operand's width K = in * (C + 1) within int32, and the
     * buffers a call derives from the plan addressable (in doubles, for headroom): the combined
     * weight [out, K] and the knot reciprocals [in, k, nk]. */
    const int64_t nk = (int64_t)G + 2 * (int64_t)k + 1, cw = (int64_t)G + k + 1;
    int64_t K = 0;
    size_t bytes, inv_bytes;
    bool ok = nk <= KF__KAN_MAX_EXTENT && !__builtin_mul_overflow(in, cw, &K) &&
              K <= KF__KAN_MAX_EXTENT && kf__mul_size((size_t)K, (size_t)out, &bytes) &&
              kf__mul_size(bytes, 8, &bytes) && bytes <= (size_t)INT64_MAX &&
              kf__mul_size((size_t)(in * k), (size_t)nk, &inv_bytes) &&
              kf__mul_size(inv_bytes, 8, &inv_bytes) && inv_bytes <= (size_t)INT64_MAX;
    KF_CHECK_FN(fn, ok, KF_ERR_INVALID_ARGUMENT,
                "desc->grid_size = %d and spline_order = %d with %" PRId64 " input and %" PRId64
                " output features make the layer too large (features * (grid_size + "
                "spline_order + 1) must be <= %d and its weights addressable)", (int)G, (int)k,
                in, out, KF__KAN_MAX_EXTENT);
    p->ctx = ctx;
    p->ops = ctx->backend->kan;
    p->in = in;
    p->out = out;
    p->G = G;
    p->k = k;
    p->C = (int64_t)G + k;
    p->nk = nk;
    p->cw = cw;
    p->K = K;
    p->scaled = standalone_scale == 1;
    p->dtype = (kf_dtype)dtype;
    return p->ops->select ? p->ops->select(p, fn, &p->ops) : KF_OK;
}

KF_API kf_status kf_kan_linear_plan_create(kf_context *ctx, const kf_kan_linear_desc *desc,
                                           kf_kan_linear_plan **out) {
    kf__clear_error();
    KF_CHECK(out != NULL, KF_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    KF_CHECK(ctx != NULL, KF_ERR_INVALID_ARGUMENT, "ctx is NULL");
    KF_TRY(kf__check_struct_size(__func__, "desc", desc, sizeof(kf_kan_linear_desc)));
    KF_CHECK(desc->in_features >= 1 && desc->in_features <= KF__KAN_MAX_EXTENT,
             KF_ERR_INVALID_ARGUMENT, "desc->in_features = %" PRId64 ", expected 1..%d",
             desc->in_features, KF__KAN_MAX_EXTENT);
    KF_CHECK(desc->out_features >= 1 && desc->out_features <= KF__KAN_MAX_EXTENT,
             KF_ERR_INVALID_ARGUMENT, "desc->out_features = %" PRId64 ", expected 1..%d",
             desc->out_features, KF__KAN_MAX_EXTENT);
    struct kf_kan_linear_plan p = {0};
    KF_TRY(kf__kan_plan_init(__func__, ctx, desc->in_features, desc->out_features,
                             desc->grid_size, desc->spline_order, desc->standalone_scale,
                             desc->dtype, &p));
    kf_kan_linear_plan *h = malloc(sizeof *h);
    KF_CHECK(h != NULL, KF_ERR_OUT_OF_MEMORY, "cannot allocate the plan");
    *h = p;
    *out = h;
    return KF_OK;
}

KF_API void kf_kan_linear_plan_destroy(kf_kan_linear_plan *plan) { free(plan); }

int32_t kf__kan_params(const void *plan, int32_t index, kf__param *out) {
    const struct kf_kan_linear_plan *p = plan;
    const kf__param all[4] = {{"grid", 2, {p->in, p->nk, 0}},
                              {"base_weight", 2, {p->out, p->in, 0}},
                              {"spline_weight", 3, {p->out, p->in, p->C}},
                              {"spline_scaler", 2, {p->out, p->in, 0}}};
    const int32_t n = p->scaled ? 4 : 3;
    if (index >= 0 && index < n) *out = all[index];
    return n;
}

KF_API kf_status kf_kan_linear_param_count(const kf_kan_linear_plan *plan, int32_t *count) {
    return kf__param_count(__func__, plan, kf__kan_params, count);
}

KF_API kf_status kf_kan_linear_param_info(const kf_kan_linear_plan *plan, int32_t index,
                                          const char **name, int32_t *ndim, int64_t *shape) {
    return kf__param_info(__func__, plan, kf__kan_params, index, name, ndim, shape);
}

/* N within limits and every size derived from it representable: the row tensors hold
 * N * (in + out) elements of up to 8 bytes. */
kf_status kf__kan_check_rows(const char *fn, const struct kf_kan_linear_plan *p, int64_t N) {
    KF_CHECK_FN(fn, N >= 1 && N <= KF__KAN_MAX_EXTENT, KF_ERR_INVALID_ARGUMENT,
                "N = %" PRId64 " rows, expected 1..%d", N, KF__KAN_MAX_EXTENT);
    size_t bytes;
    bool ok = kf__mul_size((size_t)N, (size_t)(p->in + p->out), &bytes) &&
              kf__mul_size(bytes, 8, &bytes) && bytes <= (size_t)INT64_MAX;
    KF_CHECK_FN(fn, ok, KF_ERR_INVALID_ARGUMENT,
                "N = %" PRId64 " rows need more memory than can be addressed", N);
    return KF_OK;
}

KF_API kf_status kf_kan_linear_workspace_size(const kf_kan_linear_plan *plan, int64_t N,
                                              size_t *workspace_bytes) {
    kf__clear_error();
    KF_CHECK(plan != NULL, KF_ERR_INVALID_ARGUMENT, "plan is NULL");
    KF_TRY(kf__kan_check_rows(__func__, plan, N));
    if (workspace_bytes) *workspace_bytes = plan->ops->workspace(plan, N, NULL);
    return KF_OK;
}

kf_status kf__kan_check_grid_host(const struct kf_kan_linear_plan *p, const char *fn,
                                  const char *arg, const void *grid) {
    const int digits = p->dtype == KF_DTYPE_F64 ? 17 : 9; /* enough to tell the knots apart */
    for (int64_t i = 0; i < p->in; ++i) {
        const int64_t row = i * p->nk;
        for (int64_t j = 0; j < p->nk; ++j)
            KF_CHECK_FN(fn, isfinite(kf__elem_load(grid, p->dtype, row + j)),
                        KF_ERR_INVALID_ARGUMENT, "%s[%" PRId64 "][%" PRId64 "] = %g (feature %"
                        PRId64 "), expected a finite knot", arg, i, j,
                        kf__elem_load(grid, p->dtype, row + j), i);
        for (int64_t j = 0; j + 1 < p->nk; ++j) {
            const double a = kf__elem_load(grid, p->dtype, row + j),
                         b = kf__elem_load(grid, p->dtype, row + j + 1);
            KF_CHECK_FN(fn, a <= b, KF_ERR_INVALID_ARGUMENT,
                        "%s row %" PRId64 " (feature %" PRId64 ") decreases: %s[%" PRId64
                        "][%" PRId64 "] = %.*g > %s[%" PRId64 "][%" PRId64 "] = %.*g, expected "
                        "non-decreasing knots", arg, i, i, arg, i, j, digits, a, arg, i, j + 1,
                        digits, b);
        }
    }
    return KF_OK;
}

kf_status kf__kan_check_params(const struct kf_kan_linear_plan *p, const char *fn,
                               const kf_tensor *grid, const kf_tensor *base,
                               const kf_tensor *spline, const kf_tensor *scaler, const void **g,
                               const void **bw, const void **sw, const void **sc) {
    bool present, has_base;
    int64_t gs[2] = {p->in, p->nk}, oi[2] = {p->out, p->in}, oic[3] = {p->out, p->in, p->C};
    KF_TRY(kf__check_tensor(p->ctx, fn, "args->grid", grid, p->dtype, 2, gs, false, &present));
    KF_TRY(kf__check_tensor(p->ctx, fn, "args->base_weight", base, p->dtype, 2, oi, true,
                            &has_base));
    KF_TRY(kf__check_tensor(p->ctx, fn, "args->spline_weight", spline, p->dtype, 3, oic, false,
                            &present));
    KF_CHECK_FN(fn, p->scaled || scaler->data == NULL, KF_ERR_INVALID_ARGUMENT,
                "args->spline_scaler is given but the plan has none (desc->standalone_scale = 0)");
    int64_t ss[2] = {p->out, p->in};
    KF_TRY(kf__check_tensor(p->ctx, fn, "args->spline_scaler", scaler, p->dtype, 2, ss,
                            !p->scaled, &present));
    /* The knots are read where the device's memory is host memory only: elsewhere that would
     * need a synchronisation (kfuse.h leaves such a grid's result unspecified on CUDA). */
    if (p->ctx->backend->host_memory)
        KF_TRY(kf__kan_check_grid_host(p, fn, "args->grid", grid->data));
    *g = grid->data, *bw = has_base ? base->data : NULL, *sw = spline->data;
    *sc = present ? scaler->data : NULL;
    return KF_OK;
}

kf_status kf__kan_check_grads(const struct kf_kan_linear_plan *p, const char *fn,
                              const kf_tensor *dbase, const kf_tensor *dspline,
                              const kf_tensor *dscaler, kf__kan_bwd *c) {
    bool present;
    int64_t oi[2] = {p->out, p->in}, oic[3] = {p->out, p->in, p->C};
    KF_CHECK_FN(fn, c->base != NULL || dbase->data == NULL, KF_ERR_INVALID_ARGUMENT,
                "args->dbase_weight is given but args->base_weight is absent (no base term)");
    KF_TRY(kf__check_tensor(p->ctx, fn, "args->dbase_weight", dbase, p->dtype, 2, oi, true,
                            &present));
    c->dbase = present ? dbase->data : NULL;
    KF_TRY(kf__check_tensor(p->ctx, fn, "args->dspline_weight", dspline, p->dtype, 3, oic,
                            true, &present));
    c->dspline = present ? dspline->data : NULL;
    KF_CHECK_FN(fn, p->scaled || dscaler->data == NULL, KF_ERR_INVALID_ARGUMENT,
                "args->dspline_scaler is given but the plan has no spline_scaler "
                "(desc->standalone_scale = 0)");
    KF_TRY(kf__check_tensor(p->ctx, fn, "args->dspline_scaler", dscaler, p->dtype, 2, oi,
                            true, &present));
    c->dscaler = present ? dscaler->data : NULL;
    return KF_OK;
}

kf_status kf__kan_run_forward(const char *fn, kf__kan_fwd *c, void *workspace,
                              size_t workspace_bytes) {
    kf_context *ctx = c->plan->ctx;
    size_t need = c->plan->ops->workspace(c->plan, c->N, c->patches);
    KF_TRY(kf__workspace_select(ctx, fn, workspace, workspace_bytes, need, &c->ws));
    c->ws_bytes = need;
    return c->plan->ops->forward(ctx, c);
}

kf_status kf__kan_run_backward(const char *fn, kf__kan_bwd *c, void *workspace,
                               size_t workspace_bytes) {
    kf_context *ctx = c->plan->ctx;
    size_t need = c->plan->ops->workspace(c->plan, c->N, c->patches);
    KF_TRY(kf__workspace_select(ctx, fn, workspace, workspace_bytes, need, &c->ws));
    c->ws_bytes = need;
    return c->plan->ops->backward(ctx, c);
}

/* The order-m call's bounds (kfuse.h): m in 0 .. k + 1 (B^(k+1) = 0), and m + 1 for the
 * derivative dx takes; a non-default m or input weight on a float32 or float64 plan only. */
static kf_status kf__kan_check_order(const char *fn, const struct kf_kan_linear_plan *p,
                                     int32_t m, bool dx, bool generic) {
    const int32_t top = p->k + 1 < KF_KAN_MAX_DERIVATIVE_ORDER ? p->k + 1
                                                               : KF_KAN_MAX_DERIVATIVE_ORDER;
    KF_CHECK_FN(fn, m >= 0 && m <= top, KF_ERR_INVALID_ARGUMENT,
                "args->derivative_order = %d, expected 0..%d (spline_order %d: B^(k+1) = 0 is "
                "the last derivative; at most KF_KAN_MAX_DERIVATIVE_ORDER = %d)", (int)m,
                (int)top, (int)p->k, KF_KAN_MAX_DERIVATIVE_ORDER);
    KF_CHECK_FN(fn, !dx || m + 1 <= top, KF_ERR_INVALID_ARGUMENT,
                "args->derivative_order = %d with args->dx: dx takes derivative order %d, "
                "expected <= %d (spline_order %d); pass dx absent", (int)m, (int)m + 1, (int)top,
                (int)p->k);
    KF_CHECK_FN(fn, !generic || p->dtype == KF_DTYPE_F32 || p->dtype == KF_DTYPE_F64,
                KF_ERR_UNSUPPORTED, "args->derivative_order = %d or an input weight on a plan of "
                "dtype %d: expected KF_DTYPE_F32 or KF_DTYPE_F64", (int)m, (int)p->dtype);
    return KF_OK;
}

KF_API kf_status kf_kan_linear_forward(kf_kan_linear_plan *plan,
                                       const kf_kan_linear_forward_args *args, void *workspace,
                                       size_t workspace_bytes) {
    kf__clear_error();
    KF_CHECK(plan != NULL, KF_ERR_INVALID_ARGUMENT, "plan is NULL");
    kf_kan_linear_forward_args a0; /* a 1.1 .. 1.8 caller's args: no order, no input weight */
    kf_kan_linear_forward_args_init(&a0);
    KF_TRY(kf__read_struct(__func__, "args", args, offsetof(kf_kan_linear_forward_args,
                                                            input_weight), sizeof a0, &a0));
    args = &a0;
    int64_t xs[KF_MAX_DIMS], ys[KF_MAX_DIMS], N;
    bool present;
    KF_TRY(kf__check_rows_of(plan->ctx, __func__, "args->x", &args->x, plan->dtype, -1, NULL,
                             plan->in, false, xs, &present, &N));
    KF_TRY(kf__kan_check_rows(__func__, plan, N));
    kf__kan_fwd c = {.plan = plan, .N = N, .x = args->x.data, .y = args->y.data};
    KF_TRY(kf__kan_check_params(plan, __func__, &args->grid, &args->base_weight,
                                &args->spline_weight, &args->spline_scaler, &c.grid, &c.base,
                                &c.spline, &c.scaler));
    KF_TRY(kf__check_rows_of(plan->ctx, __func__, "args->y", &args->y, plan->dtype,
                             args->x.ndim, xs, plan->out, false, ys, &present, NULL));
    KF_TRY(kf__check_rows_of(plan->ctx, __func__, "args->input_weight", &args->input_weight,
                             plan->dtype, args->x.ndim, xs, plan->in, true, ys, &present, NULL));
    c.w = present ? args->input_weight.data : NULL;
    c.order = args->derivative_order;
    KF_TRY(kf__kan_check_order(__func__, plan, c.order, false, c.order != 0 || c.w != NULL));
    return kf__kan_run_forward(__func__, &c, workspace, workspace_bytes);
}

KF_API kf_status kf_kan_linear_backward(kf_kan_linear_plan *plan, kf_grad_mode grad_mode,
                                        const kf_kan_linear_backward_args *args, void *workspace,
                                        size_t workspace_bytes) {
    kf__clear_error();
    KF_CHECK(plan != NULL, KF_ERR_INVALID_ARGUMENT, "plan is NULL");
    KF_TRY(kf__check_grad_mode(__func__, grad_mode));
    kf_kan_linear_backward_args a0; /* a 1.1 .. 1.8 caller's args: no order, no input weight */
    kf_kan_linear_backward_args_init(&a0);
    KF_TRY(kf__read_struct(__func__, "args", args, offsetof(kf_kan_linear_backward_args,
                                                            input_weight), sizeof a0, &a0));
    args = &a0;
    int64_t xs[KF_MAX_DIMS], s[KF_MAX_DIMS], N;
    bool present;
    KF_TRY(kf__check_rows_of(plan->ctx, __func__, "args->x", &args->x, plan->dtype, -1, NULL,
                             plan->in, false, xs, &present, &N));
    KF_TRY(kf__kan_check_rows(__func__, plan, N));
    kf__kan_bwd c = {.plan = plan, .N = N, .x = args->x.data,
                     .accumulate = grad_mode == KF_GRAD_ACCUMULATE};
    KF_TRY(kf__kan_check_params(plan, __func__, &args->grid, &args->base_weight,
                                &args->spline_weight, &args->spline_scaler, &c.grid, &c.base,
                                &c.spline, &c.scaler));
    int32_t nd = args->x.ndim;
    KF_TRY(kf__check_rows_of(plan->ctx, __func__, "args->dy", &args->dy, plan->dtype, nd, xs,
                             plan->out, false, s, &present, NULL));
    c.dy = args->dy.data;
    KF_TRY(kf__check_rows_of(plan->ctx, __func__, "args->dx", &args->dx, plan->dtype, nd, xs,
                             plan->in, true, s, &present, NULL));
    c.dx = present ? args->dx.data : NULL;
    KF_TRY(kf__kan_check_grads(plan, __func__, &args->dbase_weight, &args->dspline_weight,
                               &args->dspline_scaler, &c));
    KF_TRY(kf__check_rows_of(plan->ctx, __func__, "args->input_weight", &args->input_weight,
                             plan->dtype, nd, xs, plan->in, true, s, &present, NULL));
    c.w = present ? args->input_weight.data : NULL;
    KF_TRY(kf__check_rows_of(plan->ctx, __func__, "args->dinput_weight", &args->dinput_weight,
                             plan->dtype, nd, xs, plan->in, true, s, &present, NULL));
    c.dw = present ? args->dinput_weight.data : NULL;
    c.order = args->derivative_order;
    KF_TRY(kf__kan_check_order(__func__, plan, c.order, c.dx != NULL,
                               c.order != 0 || c.w != NULL || c.dw != NULL));
    return kf__kan_run_backward(__func__, &c, workspace, workspace_bytes);
}

/* ---- initial grid -------------------------------------------------------------------------- */

typedef struct kf__kan_grid_call {
    const struct kf_kan_linear_plan *plan;
    float lo, hi;
} kf__kan_grid_call;

static kf_status kf__kan_uniform_grid_staged(void *arg, const kf__stage *b) {
    const kf__kan_grid_call *c = arg;
    kf__kan_uniform_grid_host(c->plan, c->lo, c->hi, b[0].host);
    return KF_OK;
}

kf_status kf__kan_uniform_grid(const char *fn, const struct kf_kan_linear_plan *plan, float lo,
                               float hi, kf_tensor *grid) {
    KF_CHECK_FN(fn, grid != NULL, KF_ERR_INVALID_ARGUMENT, "grid is NULL");
    KF_CHECK_FN(fn, isfinite(lo) && isfinite(hi) && lo < hi, KF_ERR_INVALID_ARGUMENT,
                "lo = %g, hi = %g, expected finite lo < hi (efficient-kan's grid_range)",
                (double)lo, (double)hi);
    bool present;
    int64_t gs[2] = {plan->in, plan->nk};
    KF_TRY(kf__check_tensor(plan->ctx, fn, "grid", grid, plan->dtype, 2, gs, false, &present));
    kf__stage buf = {grid->data, (size_t)(plan->in * plan->nk) * kf__dtype_bytes(plan->dtype),
                     KF__STAGE_OUT, NULL};
    kf__kan_grid_call call = {plan, lo, hi};
    return kf__stage_run(plan->ctx, fn, &buf, 1, kf__kan_uniform_grid_staged, &call);
}

KF_API kf_status kf_kan_linear_uniform_grid(const kf_kan_linear_plan *plan, float lo, float hi,
                                            kf_tensor *grid) {
    kf__clear_error();
    KF_CHECK(plan != NULL, KF_ERR_INVALID_ARGUMENT, "plan is NULL");
    return kf__kan_uniform_grid(__func__, plan, lo, hi, grid);
}

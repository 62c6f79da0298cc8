/* Front end of the KAN grid update (efficient-kan's update_grid; kfuse.h): validate -> stage ->
 * compute on the host (host/kan_grid.c) -> write. Not a hot path: it allocates host memory and,
 * on a CUDA context, copies x, grid and spline_weight to the host and the results back,
 * synchronising with the context's stream (as kf_sklinear_init_params does). grid and
 * spline_weight are written only once everything has succeeded. */
#include "host.h"
#include "kan_front.h"

#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

KF_API void kf_kan_update_grid_args_init(kf_kan_update_grid_args *args) {
    if (args == NULL) return;
    kf_kan_update_grid_args a = {0};
    a.struct_size = sizeof a;
    a.margin = 0.01f;
    a.grid_eps = 0.02f;
    *args = a;
}

/* "[i0][i1]..." of flat element `e` of tensor `t` into buf. */
static void kan_format_index(const kf_tensor *t, size_t e, char *buf, size_t cap) {
    int64_t idx[KF_MAX_DIMS];
    for (int32_t d = t->ndim - 1; d >= 0; --d) {
        const int64_t ext = t->shape[d] > 0 ? t->shape[d] : 1;
        idx[d] = (int64_t)(e % (size_t)ext);
        e /= (size_t)ext;
    }
    size_t n = 0;
    buf[0] = '\0';
    for (int32_t d = 0; d < t->ndim && n < cap; ++d) {
        int w = snprintf(buf + n, cap - n, "[%" PRId64 "]", idx[d]);
        if (w < 0) break;
        n += (size_t)w;
    }
}

/* Every element of host copy `h` (the plan's dtype) of tensor `arg` finite. */
static kf_status kan_check_finite(const char *fn, const char *arg, const kf_tensor *t,
                                  const void *h, kf_dtype dtype, size_t n, const char *what) {
    for (size_t e = 0; e < n; ++e)
        if (!isfinite(kf__elem_load(h, dtype, e))) {
            char ix[KF_MAX_DIMS * 24];
            kan_format_index(t, e, ix, sizeof ix);
            return kf__error(KF_ERR_INVALID_ARGUMENT, fn,
                             "%s%s = %g (element %zu), expected %s", arg, ix,
                             kf__elem_load(h, dtype, e), e, what);
        }
    return KF_OK;
}

/* An update on host copies (kf__stage_run's buffers x, grid, spline_weight, new grid, new
 * spline_weight): the value checks, then the host algorithm. */
typedef struct kan_update_call {
    const char *fn;
    const struct kf_kan_linear_plan *p;
    const kf_kan_update_grid_args *args;
    int64_t N;
    const kf__kan_patches *patches;
    size_t nx;
} kan_update_call;

static kf_status kan_update_staged(void *arg, const kf__stage *b) {
    const kan_update_call *c = arg;
    const struct kf_kan_linear_plan *p = c->p;
    const void *x = b[0].host, *grid = b[1].host, *spline = b[2].host;
    KF_TRY(kf__kan_check_grid_host(p, c->fn, "args->grid", grid));
    KF_TRY(kan_check_finite(c->fn, "args->x", &c->args->x, x, p->dtype, c->nx,
                            "finite samples"));
    KF_TRY(kan_check_finite(c->fn, "args->spline_weight", &c->args->spline_weight, spline,
                            p->dtype, (size_t)(p->out * p->in * p->C), "finite coefficients"));
    return kf__kan_update_grid_host(c->fn, p, c->N, c->patches, x, grid, spline, c->args->margin,
                                    c->args->grid_eps, c->args->quantile_rule, b[3].host,
                                    b[4].host);
}

/* Shared by both layers once x has been checked (N rows or patches, nx elements): the scalars,
 * grid and spline_weight, then the update. */
static kf_status kan_update_grid(const char *fn, const struct kf_kan_linear_plan *p,
                                 const kf_kan_update_grid_args *args, int64_t N,
                                 const kf__kan_patches *patches, size_t nx) {
    bool present;
    int64_t gs[2] = {p->in, p->nk}, oic[3] = {p->out, p->in, p->C};
    KF_TRY(kf__check_tensor(p->ctx, fn, "args->grid", &args->grid, p->dtype, 2, gs, false,
                            &present));
    KF_TRY(kf__check_tensor(p->ctx, fn, "args->spline_weight", &args->spline_weight, p->dtype, 3,
                            oic, false, &present));
    const size_t e = kf__dtype_bytes(p->dtype), ng = (size_t)(p->in * p->nk) * e,
                 ns = (size_t)(p->out * p->in * p->C) * e;
    size_t xb;
    KF_CHECK_FN(fn, kf__mul_size(nx, e, &xb), KF_ERR_OUT_OF_MEMORY,
                "the host staging does not fit in memory");
    /* x, grid, spline_weight in; the new grid and spline_weight fresh, over the old ones. */
    kf__stage bufs[5] = {{args->x.data, xb, KF__STAGE_IN, NULL},
                         {args->grid.data, ng, KF__STAGE_IN, NULL},
                         {args->spline_weight.data, ns, KF__STAGE_IN, NULL},
                         {args->grid.data, ng, KF__STAGE_OUT_FRESH, NULL},
                         {args->spline_weight.data, ns, KF__STAGE_OUT_FRESH, NULL}};
    kan_update_call call = {fn, p, args, N, patches, nx};
    return kf__stage_run(p->ctx, fn, bufs, 5, kan_update_staged, &call);
}

/* The caller's args over the defaults (a 1.2 caller's struct ends before quantile_rule), then
 * the scalars: margin finite >= 0, grid_eps in [0, 1] (NaN fails both), a known quantile_rule. */
static kf_status kan_read_args(const char *fn, const kf_kan_update_grid_args *args,
                               kf_kan_update_grid_args *a) {
    kf_kan_update_grid_args_init(a);
    KF_TRY(kf__read_struct(fn, "args", args, offsetof(kf_kan_update_grid_args, quantile_rule),
                           sizeof *a, a));
    KF_CHECK_FN(fn, isfinite(a->margin) && a->margin >= 0.0f, KF_ERR_INVALID_ARGUMENT,
                "args->margin = %g, expected a finite value >= 0", (double)a->margin);
    KF_CHECK_FN(fn, a->grid_eps >= 0.0f && a->grid_eps <= 1.0f, KF_ERR_INVALID_ARGUMENT,
                "args->grid_eps = %g, expected a value in [0, 1]", (double)a->grid_eps);
    KF_CHECK_FN(fn, a->quantile_rule == KF_KAN_QUANTILES_TORCH1 ||
                        a->quantile_rule == KF_KAN_QUANTILES_TORCH2,
                KF_ERR_INVALID_ARGUMENT,
                "args->quantile_rule = %d, expected KF_KAN_QUANTILES_TORCH1 (0) or "
                "KF_KAN_QUANTILES_TORCH2 (1)", (int)a->quantile_rule);
    return KF_OK;
}

KF_API kf_status kf_kan_linear_update_grid(kf_kan_linear_plan *plan,
                                           const kf_kan_update_grid_args *args) {
    kf__clear_error();
    KF_CHECK(plan != NULL, KF_ERR_INVALID_ARGUMENT, "plan is NULL");
    kf_kan_update_grid_args a;
    KF_TRY(kan_read_args(__func__, args, &a));
    int64_t xs[KF_MAX_DIMS], N;
    bool present;
    KF_TRY(kf__check_rows_of(plan->ctx, __func__, "args->x", &a.x, plan->dtype, -1, NULL,
                             plan->in, false, xs, &present, &N));
    KF_TRY(kf__kan_check_rows(__func__, plan, N));
    return kan_update_grid(__func__, plan, &a, N, NULL, (size_t)(N * plan->in));
}

KF_API kf_status kf_kan_conv2d_update_grid(kf_kan_conv2d_plan *plan,
                                           const kf_kan_update_grid_args *args) {
    kf__clear_error();
    KF_CHECK(plan != NULL, KF_ERR_INVALID_ARGUMENT, "plan is NULL");
    kf_kan_update_grid_args a;
    KF_TRY(kan_read_args(__func__, args, &a));
    kf__kan_patches g;
    int64_t N = 0;
    KF_TRY(kf__kan_conv_input(__func__, plan, &a.x, &g, &N));
    const size_t nx = (size_t)(g.B * g.Cin * g.H * g.W);
    return kan_update_grid(__func__, &plan->lin, &a, N, &g, nx);
}

/* Front end of the sketched linear layer (SKLinear): validate -> size -> dispatch. No math here
 * beyond the initialisation's staging; the backends receive records whose every pointer, extent
 * and buffer size has been checked. */
#include "backend.h"
#include "front.h"
#include "host.h"
#include "sklinear_backend.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Largest extent accepted: BLAS and kernels index rows and columns with 32-bit ints. */
#define KF__SKL_MAX_EXTENT INT32_MAX

KF_API void kf_sklinear_desc_init(kf_sklinear_desc *desc) {
    if (desc == NULL) return;
    kf_sklinear_desc d = {0};
    d.struct_size = sizeof d;
    d.bias = 1;
    d.dtype = KF_DTYPE_F32;
    d.activation = KF_ACTIVATION_NONE;
    *desc = d;
}

KF_API void kf_sklinear_forward_args_init(kf_sklinear_forward_args *args) {
    if (args == NULL) return;
    kf_sklinear_forward_args a = {0};
    a.struct_size = sizeof a;
    *args = a;
}

KF_API void kf_sklinear_backward_args_init(kf_sklinear_backward_args *args) {
    if (args == NULL) return;
    kf_sklinear_backward_args a = {0};
    a.struct_size = sizeof a;
    *args = a;
}

KF_API void kf_sklinear_init_args_init(kf_sklinear_init_args *args) {
    if (args == NULL) return;
    kf_sklinear_init_args a = {0};
    a.struct_size = sizeof a;
    *args = a;
}

KF_API kf_status kf_sklinear_plan_create(kf_context *ctx, const kf_sklinear_desc *desc,
                                         kf_sklinear_plan **out) {
    kf__clear_error();
    KF_CHECK(out != NULL, KF_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    KF_CHECK(ctx != NULL, KF_ERR_INVALID_ARGUMENT, "ctx is NULL");
    kf_sklinear_desc d0; /* a 1.1 .. 1.7 caller's desc gets the epilogue's defaults */
    kf_sklinear_desc_init(&d0);
    KF_TRY(kf__read_struct(__func__, "desc", desc, offsetof(kf_sklinear_desc, activation),
                           sizeof d0, &d0));
    desc = &d0;
    KF_CHECK(desc->in_features >= 1 && desc->in_features <= KF__SKL_MAX_EXTENT,
             KF_ERR_INVALID_ARGUMENT, "desc->in_features = %" PRId64 ", expected 1..%d",
             desc->in_features, KF__SKL_MAX_EXTENT);
    KF_CHECK(desc->out_features >= 1 && desc->out_features <= KF__SKL_MAX_EXTENT,
             KF_ERR_INVALID_ARGUMENT, "desc->out_features = %" PRId64 ", expected 1..%d",
             desc->out_features, KF__SKL_MAX_EXTENT);
    KF_CHECK(desc->num_terms >= 1, KF_ERR_INVALID_ARGUMENT,
             "desc->num_terms = %d, expected >= 1", (int)desc->num_terms);
    KF_CHECK(desc->low_rank >= 1, KF_ERR_INVALID_ARGUMENT, "desc->low_rank = %d, expected >= 1",
             (int)desc->low_rank);
    int64_t r = (int64_t)desc->num_terms * desc->low_rank;
    KF_CHECK(r <= KF__SKL_MAX_EXTENT / 2, KF_ERR_INVALID_ARGUMENT,
             "desc->num_terms * desc->low_rank = %" PRId64 ", expected <= %d (the bottleneck "
             "is 2 * num_terms * low_rank wide)", r, KF__SKL_MAX_EXTENT / 2);
    KF_CHECK(desc->bias == 0 || desc->bias == 1, KF_ERR_INVALID_ARGUMENT,
             "desc->bias = %d, expected 0 or 1", (int)desc->bias);
    KF_TRY(kf__check_layer_dtype(__func__, desc->dtype));
    KF_CHECK(desc->activation >= KF_ACTIVATION_NONE && desc->activation <= KF_ACTIVATION_SILU,
             KF_ERR_INVALID_ARGUMENT, "desc->activation = %d, expected a kf_activation: "
             "KF_ACTIVATION_NONE (0), _RELU (1), _GELU (2), _GELU_TANH (3) or _SILU (4)",
             (int)desc->activation);
    KF_CHECK(desc->dropout >= 0.0f && desc->dropout < 1.0f, KF_ERR_INVALID_ARGUMENT,
             "desc->dropout = %g, expected a probability in [0, 1)", (double)desc->dropout);
    /* Every parameter must be addressable: r * max(in, out) elements of up to 8 bytes. */
    size_t biggest;
    int64_t wide = desc->in_features > desc->out_features ? desc->in_features
                                                          : desc->out_features;
    KF_CHECK(kf__mul_size((size_t)r, (size_t)wide * 8, &biggest) && biggest <= (size_t)INT64_MAX,
             KF_ERR_INVALID_ARGUMENT, "desc->num_terms = %d, low_rank = %d and features %" PRId64
             " make a parameter larger than memory can hold", (int)desc->num_terms,
             (int)desc->low_rank, wide);
    kf_sklinear_plan *p = calloc(1, sizeof *p);
    KF_CHECK(p != NULL, KF_ERR_OUT_OF_MEMORY, "cannot allocate the plan");
    p->ctx = ctx;
    p->in = desc->in_features;
    p->out = desc->out_features;
    p->L = desc->num_terms;
    p->k = desc->low_rank;
    p->r = r;
    p->has_bias = desc->bias == 1;
    p->dtype = (kf_dtype)desc->dtype;
    p->act = desc->activation;
    p->dropout = desc->dropout;
    kf_status s = ctx->backend->skl->select(p, __func__, &p->ops);
    if (s != KF_OK) {
        free(p);
        return s;
    }
    *out = p;
    return KF_OK;
}

KF_API void kf_sklinear_plan_destroy(kf_sklinear_plan *plan) { free(plan); }

KF_API kf_status kf_sklinear_param_ratio(const kf_sklinear_plan *plan, double *ratio) {
    kf__clear_error();
    KF_CHECK(plan != NULL, KF_ERR_INVALID_ARGUMENT, "plan is NULL");
    KF_CHECK(ratio != NULL, KF_ERR_INVALID_ARGUMENT, "ratio is NULL");
    *ratio = 2.0 * (double)plan->r * (double)(plan->in + plan->out) /
             ((double)plan->in * (double)plan->out);
    return KF_OK;
}

/* Panther's state: S1s, S2s, U1s, U2s and (with a bias) bias; returns the count. */
static int32_t kf__skl_params(const void *plan, int32_t index, kf__param *out) {
    const kf_sklinear_plan *p = plan;
    const int64_t L = p->L, k = p->k;
    const kf__param all[5] = {{"S1s", 3, {L, p->in, k}},
                              {"S2s", 3, {L, k, p->out}},
                              {"U1s", 3, {L, k, p->out}},
                              {"U2s", 3, {L, p->in, k}},
                              {"bias", 1, {p->out, 0, 0}}};
    const int32_t n = p->has_bias ? 5 : 4;
    if (index >= 0 && index < n) *out = all[index];
    return n;
}

KF_API kf_status kf_sklinear_param_count(const kf_sklinear_plan *plan, int32_t *count) {
    return kf__param_count(__func__, plan, kf__skl_params, count);
}

KF_API kf_status kf_sklinear_param_info(const kf_sklinear_plan *plan, int32_t index,
                                        const char **name, int32_t *ndim, int64_t *shape) {
    return kf__param_info(__func__, plan, kf__skl_params, index, name, ndim, shape);
}

/* N within limits and every size the backends derive from it representable: their buffers are
 * bounded by N * (in + out + 4r) + (in + out) * 4r elements of up to 8 bytes. */
static kf_status kf__skl_check_rows(const char *fn, const kf_sklinear_plan *p, int64_t N) {
    KF_CHECK_FN(fn, N >= 1 && N <= KF__SKL_MAX_EXTENT, KF_ERR_INVALID_ARGUMENT,
                "N = %" PRId64 " rows, expected 1..%d", N, KF__SKL_MAX_EXTENT);
    size_t width = (size_t)(p->in + p->out) + 4 * (size_t)p->r, bytes;
    bool ok = kf__mul_size((size_t)N, width, &bytes) && kf__mul_size(bytes, 8, &bytes) &&
              bytes <= (size_t)INT64_MAX;
    KF_CHECK_FN(fn, ok, KF_ERR_INVALID_ARGUMENT,
                "N = %" PRId64 " rows need more memory than can be addressed", N);
    return KF_OK;
}

KF_API kf_status kf_sklinear_workspace_size(const kf_sklinear_plan *plan, int64_t N,
                                            size_t *workspace_bytes) {
    kf__clear_error();
    KF_CHECK(plan != NULL, KF_ERR_INVALID_ARGUMENT, "plan is NULL");
    KF_TRY(kf__skl_check_rows(__func__, plan, N));
    if (workspace_bytes) *workspace_bytes = plan->ops->workspace(plan, N);
    return KF_OK;
}

/* The parameters forward and backward share, checked against the plan. */
static kf_status kf__skl_check_params(const kf_sklinear_plan *p, const char *fn,
                                      const kf_tensor *S1s, const kf_tensor *S2s,
                                      const kf_tensor *U1s, const kf_tensor *U2s,
                                      const void **S1, const void **S2, const void **U1,
                                      const void **U2) {
    bool present;
    int64_t in_k[3] = {p->L, p->in, p->k}, k_out[3] = {p->L, p->k, p->out};
    KF_TRY(kf__check_tensor(p->ctx, fn, "args->S1s", S1s, p->dtype, 3, in_k, false, &present));
    KF_TRY(kf__check_tensor(p->ctx, fn, "args->S2s", S2s, p->dtype, 3, k_out, false, &present));
    KF_TRY(kf__check_tensor(p->ctx, fn, "args->U1s", U1s, p->dtype, 3, k_out, false, &present));
    KF_TRY(kf__check_tensor(p->ctx, fn, "args->U2s", U2s, p->dtype, 3, in_k, false, &present));
    *S1 = S1s->data, *S2 = S2s->data, *U1 = U1s->data, *U2 = U2s->data;
    return KF_OK;
}

/* The bias (or its gradient): present exactly when the plan has one (a gradient may be absent). */
static kf_status kf__skl_check_bias(const kf_sklinear_plan *p, const char *fn, const char *arg,
                                    const kf_tensor *t, bool optional, void **out) {
    bool present;
    KF_CHECK_FN(fn, p->has_bias || t->data == NULL, KF_ERR_INVALID_ARGUMENT,
                "%s is given but the plan has no bias (desc->bias = 0)", arg);
    int64_t s[1] = {p->out};
    KF_TRY(kf__check_tensor(p->ctx, fn, arg, t, p->dtype, 1, s, optional || !p->has_bias,
                            &present));
    *out = present ? t->data : NULL;
    return KF_OK;
}

/* The epilogue's per-call fields: the mode (dropout in training calls only), seed and offset. */
static kf_status kf__skl_check_epi(const kf_sklinear_plan *p, const char *fn, int32_t mode,
                                   int32_t reserved0, uint64_t seed, uint64_t offset,
                                   kf__skl_epi *epi) {
    KF_CHECK_FN(fn, mode == 0 || mode == KF_MODE_INFERENCE || mode == KF_MODE_TRAINING,
                KF_ERR_INVALID_ARGUMENT, "args->mode = %d, expected 0, KF_MODE_INFERENCE (1) "
                "or KF_MODE_TRAINING (2)", (int)mode);
    KF_CHECK_FN(fn, reserved0 == 0, KF_ERR_INVALID_ARGUMENT, "args->reserved0 = %d, expected 0",
                (int)reserved0);
    epi->p = mode == KF_MODE_TRAINING ? p->dropout : 0.0f;
    epi->seed = seed;
    epi->offset = offset;
    return KF_OK;
}

KF_API kf_status kf_sklinear_forward(kf_sklinear_plan *plan, const kf_sklinear_forward_args *args,
                                     void *workspace, size_t workspace_bytes) {
    kf__clear_error();
    KF_CHECK(plan != NULL, KF_ERR_INVALID_ARGUMENT, "plan is NULL");
    kf_sklinear_forward_args a0; /* a 1.1 .. 1.7 caller's args: no epilogue fields */
    kf_sklinear_forward_args_init(&a0);
    KF_TRY(kf__read_struct(__func__, "args", args, offsetof(kf_sklinear_forward_args, mode),
                           sizeof a0, &a0));
    args = &a0;
    int64_t xs[KF_MAX_DIMS], ys[KF_MAX_DIMS], N;
    bool present;
    KF_TRY(kf__check_rows_of(plan->ctx, __func__, "args->x", &args->x, plan->dtype, -1, NULL,
                             plan->in, false, xs, &present, &N));
    KF_TRY(kf__skl_check_rows(__func__, plan, N));
    kf__skl_fwd c = {.plan = plan, .N = N, .x = args->x.data, .y = args->y.data};
    KF_TRY(kf__skl_check_params(plan, __func__, &args->S1s, &args->S2s, &args->U1s, &args->U2s,
                                &c.S1, &c.S2, &c.U1, &c.U2));
    void *bias = NULL;
    KF_TRY(kf__skl_check_bias(plan, __func__, "args->bias", &args->bias, false, &bias));
    c.bias = bias;
    KF_TRY(kf__check_rows_of(plan->ctx, __func__, "args->y", &args->y, plan->dtype,
                             args->x.ndim, xs, plan->out, false, ys, &present, NULL));
    KF_TRY(kf__skl_check_epi(plan, __func__, args->mode, args->reserved0, args->dropout_seed,
                             args->dropout_offset, &c.epi));
    KF_TRY(kf__check_rows_of(plan->ctx, __func__, "args->pre", &args->pre, plan->dtype,
                             args->x.ndim, xs, plan->out, true, ys, &present, NULL));
    c.pre = present ? args->pre.data : NULL;
    size_t need = plan->ops->workspace(plan, N);
    KF_TRY(kf__workspace_select(plan->ctx, __func__, workspace, workspace_bytes, need, &c.ws));
    c.ws_bytes = need;
    return plan->ops->forward(plan->ctx, &c);
}

KF_API kf_status kf_sklinear_backward(kf_sklinear_plan *plan, kf_grad_mode grad_mode,
                                      const kf_sklinear_backward_args *args, void *workspace,
                                      size_t workspace_bytes) {
    kf__clear_error();
    KF_CHECK(plan != NULL, KF_ERR_INVALID_ARGUMENT, "plan is NULL");
    KF_TRY(kf__check_grad_mode(__func__, grad_mode));
    kf_sklinear_backward_args a0; /* a 1.1 .. 1.7 caller's args: no epilogue fields */
    kf_sklinear_backward_args_init(&a0);
    KF_TRY(kf__read_struct(__func__, "args", args, offsetof(kf_sklinear_backward_args, mode),
                           sizeof a0, &a0));
    args = &a0;
    int64_t xs[KF_MAX_DIMS], s[KF_MAX_DIMS], N;
    bool present;
    KF_TRY(kf__check_rows_of(plan->ctx, __func__, "args->x", &args->x, plan->dtype, -1, NULL,
                             plan->in, false, xs, &present, &N));
    KF_TRY(kf__skl_check_rows(__func__, plan, N));
    kf__skl_bwd c = {.plan = plan, .N = N, .x = args->x.data,
                     .accumulate = grad_mode == KF_GRAD_ACCUMULATE};
    KF_TRY(kf__skl_check_params(plan, __func__, &args->S1s, &args->S2s, &args->U1s, &args->U2s,
                                &c.S1, &c.S2, &c.U1, &c.U2));
    int32_t nd = args->x.ndim;
    KF_TRY(kf__check_rows_of(plan->ctx, __func__, "args->dy", &args->dy, plan->dtype, nd, xs,
                             plan->out, false, s, &present, NULL));
    c.dy = args->dy.data;
    KF_TRY(kf__skl_check_epi(plan, __func__, args->mode, args->reserved0, args->dropout_seed,
                             args->dropout_offset, &c.epi));
    const bool act = plan->act != KF_ACTIVATION_NONE;
    KF_CHECK(act || args->pre.data == NULL, KF_ERR_INVALID_ARGUMENT,
             "args->pre is given but the plan has no activation (desc->activation = "
             "KF_ACTIVATION_NONE)");
    KF_TRY(kf__check_rows_of(plan->ctx, __func__, "args->pre", &args->pre, plan->dtype, nd, xs,
                             plan->out, !act, s, &present, NULL));
    c.pre = act ? args->pre.data : NULL;
    KF_TRY(kf__check_rows_of(plan->ctx, __func__, "args->dx", &args->dx, plan->dtype, nd, xs,
                             plan->in, true, s, &present, NULL));
    c.dx = present ? args->dx.data : NULL;
    int64_t in_k[3] = {plan->L, plan->in, plan->k}, k_out[3] = {plan->L, plan->k, plan->out};
    KF_TRY(kf__check_tensor(plan->ctx, __func__, "args->dS1s", &args->dS1s, plan->dtype, 3, in_k,
                            true, &present));
    c.dS1 = present ? args->dS1s.data : NULL;
    KF_TRY(kf__check_tensor(plan->ctx, __func__, "args->dS2s", &args->dS2s, plan->dtype, 3,
                            k_out, true, &present));
    c.dS2 = present ? args->dS2s.data : NULL;
    KF_TRY(kf__skl_check_bias(plan, __func__, "args->dbias", &args->dbias, true, &c.db));
    size_t need = plan->ops->workspace(plan, N);
    KF_TRY(kf__workspace_select(plan->ctx, __func__, workspace, workspace_bytes, need, &c.ws));
    c.ws_bytes = need;
    return plan->ops->backward(plan->ctx, &c);
}

/* ---- initialisation ------------------------------------------------------------------------ */

/* The host algorithm on the staged buffers W_init, S1s, S2s, U1s, U2s, bias. */
typedef struct kf__skl_init_call {
    const kf_sklinear_plan *plan;
    uint64_t seed;
} kf__skl_init_call;

static kf_status kf__skl_init_staged(void *arg, const kf__stage *b) {
    const kf__skl_init_call *c = arg;
    return kf__skl_init_host(c->plan, "kf_sklinear_init_params", c->seed, b[0].host, b[1].host,
                             b[2].host, b[3].host, b[4].host, b[5].host);
}

KF_API kf_status kf_sklinear_init_params(kf_sklinear_plan *plan,
                                         const kf_sklinear_init_args *args) {
    kf__clear_error();
    KF_CHECK(plan != NULL, KF_ERR_INVALID_ARGUMENT, "plan is NULL");
    KF_TRY(kf__check_struct_size(__func__, "args", args, sizeof(kf_sklinear_init_args)));
    bool present;
    int64_t ws[2] = {plan->out, plan->in};
    KF_TRY(kf__check_tensor(plan->ctx, __func__, "args->W_init", &args->W_init, plan->dtype, 2,
                            ws, true, &present));
    const void *W = present ? args->W_init.data : NULL;
    const void *S1, *S2, *U1, *U2;
    KF_TRY(kf__skl_check_params(plan, __func__, &args->S1s, &args->S2s, &args->U1s, &args->U2s,
                                &S1, &S2, &U1, &U2));
    void *bias = NULL;
    KF_TRY(kf__skl_check_bias(plan, __func__, "args->bias", &args->bias, false, &bias));
    /* The outputs are written through the tensors the caller handed in (checked above). */
    const size_t e = kf__dtype_bytes(plan->dtype), ik = (size_t)(plan->r * plan->in) * e,
                 ko = (size_t)(plan->r * plan->out) * e;
    kf__stage bufs[6] = {
        {(void *)W, W ? (size_t)(plan->in * plan->out) * e : 0, KF__STAGE_IN, NULL},
        {args->S1s.data, ik, KF__STAGE_OUT, NULL},
        {args->S2s.data, ko, KF__STAGE_OUT, NULL},
        {args->U1s.data, ko, KF__STAGE_OUT, NULL},
        {args->U2s.data, ik, KF__STAGE_OUT, NULL},
        {bias, bias ? (size_t)plan->out * e : 0, KF__STAGE_OUT, NULL}};
    kf__skl_init_call call = {plan, args->seed};
    return kf__stage_run(plan->ctx, __func__, bufs, 6, kf__skl_init_staged, &call);
}

/* Front end of the recurrent layer (GRU, A-GRU): validate -> size -> dispatch. No math here; the
 * backends receive records whose every pointer, extent and buffer size has been checked. */
#include "backend.h"
#include "front.h"
#include "lowp.h"
#include "rnn_backend.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Largest T, B, I, H accepted: BLAS and kernels index with 32-bit ints. */
#define KF__RNN_MAX_EXTENT INT32_MAX
#define KF__RNN_MAX_LAYERS 1024

KF_API void kf_rnn_desc_init(kf_rnn_desc *desc) {
    if (desc == NULL) return;
    kf_rnn_desc d = {0};
    d.struct_size = sizeof d;
    d.cell = KF_RNN_GRU;
    d.num_layers = 1;
    d.gamma = 0.01f;
    d.dtype = KF_DTYPE_F32;
    *desc = d;
}

KF_API void kf_rnn_forward_args_init(kf_rnn_forward_args *args) {
    if (args == NULL) return;
    kf_rnn_forward_args a = {0};
    a.struct_size = sizeof a;
    *args = a;
}

KF_API void kf_rnn_backward_args_init(kf_rnn_backward_args *args) {
    if (args == NULL) return;
    kf_rnn_backward_args a = {0};
    a.struct_size = sizeof a;
    *args = a;
}

static const char *const kf__gru_suffix[KF__GRU_NW] = {"weight_ih", "weight_hh", "bias_ih",
                                                       "bias_hh"};
static const char *const kf__agru_suffix[KF__AGRU_NW] = {
    "W_z.weight", "W_z.bias", "U_z.weight", "W_r.weight", "W_r.bias",
    "U_r.weight", "V_h.weight", "V_h.bias", "W_h", "epsilon"};

/* Reference state_dict key of weight (l, d, j), written into buf (size n). */
static int kf__rnn_weight_name(const kf_rnn_plan *p, int32_t l, int32_t d, int32_t j, char *buf,
                               size_t n) {
    if (p->cell == KF_RNN_GRU)
        return snprintf(buf, n, "%s_l%d%s", kf__gru_suffix[j], (int)l, d ? "_reverse" : "");
    return snprintf(buf, n, "cells.%d.%s", (int)l, kf__agru_suffix[j]);
}

KF_API kf_status kf_rnn_plan_create(kf_context *ctx, const kf_rnn_desc *desc, kf_rnn_plan **out) {
    kf__clear_error();
    KF_CHECK(out != NULL, KF_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    KF_CHECK(ctx != NULL, KF_ERR_INVALID_ARGUMENT, "ctx is NULL");
    KF_TRY(kf__check_struct_size(__func__, "desc", desc, sizeof(kf_rnn_desc)));
    KF_CHECK(desc->cell == KF_RNN_GRU || desc->cell == KF_RNN_AGRU, KF_ERR_INVALID_ARGUMENT,
             "desc->cell = %d, expected KF_RNN_GRU (1) or KF_RNN_AGRU (2)", (int)desc->cell);
    KF_CHECK(desc->num_layers >= 1 && desc->num_layers <= KF__RNN_MAX_LAYERS,
             KF_ERR_INVALID_ARGUMENT, "desc->num_layers = %d, expected 1..%d",
             (int)desc->num_layers, KF__RNN_MAX_LAYERS);
    KF_CHECK(desc->input_size >= 1 && desc->input_size <= KF__RNN_MAX_EXTENT,
             KF_ERR_INVALID_ARGUMENT, "desc->input_size = %" PRId64 ", expected 1..%d",
             desc->input_size, KF__RNN_MAX_EXTENT);
    KF_CHECK(desc->hidden_size >= 1 && desc->hidden_size <= KF__RNN_MAX_EXTENT / 6,
             KF_ERR_INVALID_ARGUMENT, "desc->hidden_size = %" PRId64 ", expected 1..%d",
             desc->hidden_size, KF__RNN_MAX_EXTENT / 6);
    const uint32_t known = KF_RNN_BATCH_FIRST | KF_RNN_BIDIRECTIONAL;
    KF_CHECK((desc->flags & ~known) == 0, KF_ERR_INVALID_ARGUMENT,
             "desc->flags = 0x%x has unknown bits 0x%x", desc->flags, desc->flags & ~known);
    KF_CHECK(!(desc->cell == KF_RNN_AGRU && (desc->flags & KF_RNN_BIDIRECTIONAL)),
             KF_ERR_UNSUPPORTED, "desc->flags has KF_RNN_BIDIRECTIONAL, which the A-GRU cell "
             "does not have");
    KF_CHECK(desc->dropout >= 0.0f && desc->dropout < 1.0f, KF_ERR_INVALID_ARGUMENT,
             "desc->dropout = %g, expected a probability in [0, 1)", (double)desc->dropout);
    KF_CHECK(isfinite(desc->gamma), KF_ERR_INVALID_ARGUMENT, "desc->gamma = %g, expected finite",
             (double)desc->gamma);
    KF_TRY(kf__check_layer_dtype(__func__, desc->dtype));
    /* Every weight must be addressable: 3H * max(I, 2H) elements of the dtype. */
    size_t biggest;
    KF_CHECK(kf__mul_size((size_t)(3 * desc->hidden_size),
                          (size_t)(desc->input_size > 2 * desc->hidden_size
                                       ? desc->input_size : 2 * desc->hidden_size) *
                              kf__dtype_bytes(desc->dtype),
                          &biggest) && biggest <= (size_t)INT64_MAX,
             KF_ERR_INVALID_ARGUMENT, "desc->input_size = %" PRId64 " and hidden_size = %" PRId64
             " make a weight larger than memory can hold", desc->input_size, desc->hidden_size);

    kf_rnn_plan *p = calloc(1, sizeof *p);
    KF_CHECK(p != NULL, KF_ERR_OUT_OF_MEMORY, "cannot allocate the plan");
    p->ctx = ctx;
    p->ops = ctx->backend->rnn;
    p->cell = desc->cell;
    p->L = desc->num_layers;
    p->D = (desc->flags & KF_RNN_BIDIRECTIONAL) ? 2 : 1;
    p->I = desc->input_size;
    p->H = desc->hidden_size;
    p->batch_first = (desc->flags & KF_RNN_BATCH_FIRST) != 0;
    p->dtype = (kf_dtype)desc->dtype;
    p->dropout = desc->dropout;
    p->gamma = desc->gamma;
    p->nw = p->cell == KF_RNN_GRU ? KF__GRU_NW : KF__AGRU_NW;
    p->num_weights = p->L * p->D * p->nw;
    kf_status s = p->ops->select ? p->ops->select(p, __func__, &p->ops) : KF_OK;
    if (s != KF_OK) {
        free(p);
        return s;
    }

    /* Names: measure, then fill one block holding the pointer table and the strings. */
    size_t text = 0;
    for (int32_t l = 0; l < p->L; ++l)
        for (int32_t d = 0; d < p->D; ++d)
            for (int32_t j = 0; j < p->nw; ++j)
                text += (size_t)kf__rnn_weight_name(p, l, d, j, NULL, 0) + 1;
    size_t table = (size_t)p->num_weights * sizeof(char *);
    p->w = calloc(2 * (size_t)p->num_weights, sizeof *p->w); /* both halves: rnn_backend.h */
    p->dw = calloc(2 * (size_t)p->num_weights, sizeof *p->dw);
    char *block = malloc(table + text);
    if (p->w == NULL || p->dw == NULL || block == NULL) {
        free(block);
        kf_rnn_plan_destroy(p);
        return kf__error(KF_ERR_OUT_OF_MEMORY, __func__, "cannot allocate the plan's tables");
    }
    p->names = (const char **)(void *)block;
    char *cursor = block + table;
    int32_t k = 0;
    for (int32_t l = 0; l < p->L; ++l)
        for (int32_t d = 0; d < p->D; ++d)
            for (int32_t j = 0; j < p->nw; ++j, ++k) {
                int n = kf__rnn_weight_name(p, l, d, j, cursor, text);
                p->names[k] = cursor;
                cursor += n + 1;
                text -= (size_t)n + 1;
            }
    *out = p;
    return KF_OK;
}

KF_API void kf_rnn_plan_destroy(kf_rnn_plan *plan) {
    if (plan == NULL) return;
    free((void *)plan->names);
    free(plan->w);
    free(plan->dw);
    free(plan);
}

/* The weights in canonical order, cell by cell: a kf__param_list. */
static int32_t kf__rnn_params(const void *plan, int32_t index, kf__param *out) {
    const kf_rnn_plan *p = plan;
    if (index >= 0 && index < p->num_weights) {
        const int32_t cell = index / p->nw, j = index % p->nw;
        out->name = p->names[index];
        out->shape[0] = out->shape[1] = out->shape[2] = 0;
        out->ndim = kf__rnn_weight_shape(p, cell / p->D, j, out->shape);
    }
    return p->num_weights;
}

KF_API kf_status kf_rnn_weight_count(const kf_rnn_plan *plan, int32_t *count) {
    return kf__param_count(__func__, plan, kf__rnn_params, count);
}

KF_API kf_status kf_rnn_weight_info(const kf_rnn_plan *plan, int32_t index, const char **name,
                                    int32_t *ndim, int64_t *shape) {
    return kf__param_info(__func__, plan, kf__rnn_params, index, name, ndim, shape);
}

/* T, B within limits and every size the backends derive from them representable: the backends'
 * buffers are bounded by T*B*(I + 16*L*D*H) elements of the plan's dtype; a bfloat16/float16
 * plan's (float32 buffers, and CUDA's conversion layer's float32 copies) by 8 bytes each. */
static kf_status kf__rnn_check_extent(const char *fn, const kf_rnn_plan *p, int64_t T, int64_t B) {
    KF_CHECK_FN(fn, T >= 1 && T <= KF__RNN_MAX_EXTENT, KF_ERR_INVALID_ARGUMENT,
                "T = %" PRId64 ", expected 1..%d", T, KF__RNN_MAX_EXTENT);
    KF_CHECK_FN(fn, B >= 1 && B <= KF__RNN_MAX_EXTENT, KF_ERR_INVALID_ARGUMENT,
                "B = %" PRId64 ", expected 1..%d", B, KF__RNN_MAX_EXTENT);
    size_t rows, width, bytes;
    bool ok = kf__mul_size((size_t)T, (size_t)B, &rows) &&
              kf__mul_size((size_t)(16 * p->L * p->D), (size_t)p->H, &width) &&
              kf__add_size(width, (size_t)p->I, &width) && kf__mul_size(rows, width, &bytes) &&
              kf__mul_size(bytes, kf__dtype_is_lowp(p->dtype) ? 2 * sizeof(float)
                                                             : kf__dtype_bytes(p->dtype),
                           &bytes) &&
              bytes <= (size_t)INT64_MAX &&
              rows <= (size_t)KF__RNN_MAX_EXTENT;
    KF_CHECK_FN(fn, ok, KF_ERR_INVALID_ARGUMENT,
                "T = %" PRId64 " and B = %" PRId64 " need more memory than can be addressed", T, B);
    return KF_OK;
}

KF_API kf_status kf_rnn_output_shapes(const kf_rnn_plan *plan, int64_t T, int64_t B,
                                      int64_t *y_shape, int64_t *hn_shape) {
    kf__clear_error();
    KF_CHECK(plan != NULL, KF_ERR_INVALID_ARGUMENT, "plan is NULL");
    KF_TRY(kf__rnn_check_extent(__func__, plan, T, B));
    if (y_shape) {
        y_shape[0] = plan->batch_first ? B : T;
        y_shape[1] = plan->batch_first ? T : B;
        y_shape[2] = (int64_t)plan->D * plan->H;
    }
    if (hn_shape) {
        hn_shape[0] = (int64_t)plan->L * plan->D;
        hn_shape[1] = B;
        hn_shape[2] = plan->H;
    }
    return KF_OK;
}

static kf_status kf__check_mode(const char *fn, kf_mode mode) {
    KF_CHECK_FN(fn, mode == KF_MODE_INFERENCE || mode == KF_MODE_TRAINING,
                KF_ERR_INVALID_ARGUMENT, "mode = %d, expected KF_MODE_INFERENCE (1) or "
                "KF_MODE_TRAINING (2)", (int)mode);
    return KF_OK;
}

KF_API kf_status kf_rnn_workspace_size(const kf_rnn_plan *plan, int64_t T, int64_t B, kf_mode mode,
                                       size_t *workspace_bytes, size_t *reserve_bytes) {
    kf__clear_error();
    KF_CHECK(plan != NULL, KF_ERR_INVALID_ARGUMENT, "plan is NULL");
    KF_TRY(kf__check_mode(__func__, mode));
    KF_TRY(kf__rnn_check_extent(__func__, plan, T, B));
    size_t ws = 0, rs = 0;
    plan->ops->sizes(plan, T, B, mode == KF_MODE_TRAINING, &ws, &rs);
    if (workspace_bytes) *workspace_bytes = ws;
    if (reserve_bytes) *reserve_bytes = mode == KF_MODE_TRAINING ? rs : 0;
    return KF_OK;
}

/* The inputs forward and backward share: x (giving T and B), h0, weights, lengths. */
typedef struct kf__rnn_inputs {
    int64_t T, B;
    const void *x, *h0;
    const int32_t *lengths;
} kf__rnn_inputs;

/* Shape of a sequence tensor with `width` columns in the plan's layout; -1 = free extent. */
static void kf__seq_shape(const kf_rnn_plan *p, int64_t T, int64_t B, int64_t width,
                          int64_t *shape) {
    shape[0] = p->batch_first ? B : T;
    shape[1] = p->batch_first ? T : B;
    shape[2] = width;
}

static kf_status kf__rnn_check_inputs(const char *fn, kf_rnn_plan *p, const kf_tensor *x,
                                      const kf_tensor *h0, const kf_tensor *weights,
                                      int32_t num_weights, int32_t reserved,
                                      const kf_tensor *lengths, kf__rnn_inputs *in) {
    bool present;
    int64_t xs[3] = {-1, -1, p->I};
    KF_TRY(kf__check_tensor(p->ctx, fn, "args->x", x, p->dtype, 3, xs, false, &present));
    in->T = p->batch_first ? xs[1] : xs[0];
    in->B = p->batch_first ? xs[0] : xs[1];
    KF_TRY(kf__rnn_check_extent(fn, p, in->T, in->B));
    in->x = x->data;
    KF_CHECK_FN(fn, reserved == 0, KF_ERR_INVALID_ARGUMENT, "args->reserved0 = %d, expected 0",
                (int)reserved);

    int64_t hs[3] = {(int64_t)p->L * p->D, in->B, p->H};
    KF_TRY(kf__check_tensor(p->ctx, fn, "args->h0", h0, p->dtype, 3, hs, true, &present));
    in->h0 = present ? h0->data : NULL;

    KF_CHECK_FN(fn, weights != NULL, KF_ERR_INVALID_ARGUMENT, "args->weights is NULL");
    KF_CHECK_FN(fn, num_weights == p->num_weights, KF_ERR_INVALID_ARGUMENT,
                "args->num_weights = %d, expected %d (kf_rnn_weight_count)", (int)num_weights,
                (int)p->num_weights);
    for (int32_t k = 0; k < p->num_weights; ++k) {
        int64_t ws[2];
        int32_t nd = kf__rnn_weight_shape(p, k / p->nw / p->D, k % p->nw, ws);
        char arg[160];
        snprintf(arg, sizeof arg, "args->weights[%d] (%s)", (int)k, p->names[k]);
        KF_TRY(kf__check_tensor(p->ctx, fn, arg, &weights[k],
                                p->dtype, nd, ws, false, &present));
        p->w[k] = weights[k].data;
    }

    int64_t ls[1] = {in->B};
    KF_TRY(kf__check_tensor(p->ctx, fn, "args->lengths", lengths,
                            KF_DTYPE_I32, 1, ls, true, &present));
    in->lengths = present ? lengths->data : NULL;
    /* Host memory can be checked here; device-resident lengths are clamped to 0..T by the kernels
     * (kf__row_length in cuda/rnn_cuda.cuh). */
    if (present && p->ctx->device_type == KF_DEVICE_CPU)
        for (int64_t b = 0; b < in->B; ++b)
            KF_CHECK_FN(fn, in->lengths[b] >= 0 && in->lengths[b] <= in->T,
                        KF_ERR_INVALID_ARGUMENT,
                        "args->lengths[%" PRId64 "] = %d, expected 0..%" PRId64, b,
                        (int)in->lengths[b], in->T);
    return KF_OK;
}

KF_API kf_status kf_rnn_forward(kf_rnn_plan *plan, kf_mode mode, const kf_rnn_forward_args *args,
                                void *workspace, size_t workspace_bytes, void *reserve,
                                size_t reserve_bytes) {
    kf__clear_error();
    KF_CHECK(plan != NULL, KF_ERR_INVALID_ARGUMENT, "plan is NULL");
    KF_TRY(kf__check_mode(__func__, mode));
    KF_TRY(kf__check_struct_size(__func__, "args", args, sizeof(kf_rnn_forward_args)));
    kf__rnn_inputs in;
    KF_TRY(kf__rnn_check_inputs(__func__, plan, &args->x, &args->h0, args->weights,
                                args->num_weights, args->reserved0, &args->lengths, &in));
    bool present;
    int64_t ys[3];
    kf__seq_shape(plan, in.T, in.B, (int64_t)plan->D * plan->H, ys);
    KF_TRY(kf__check_tensor(plan->ctx, __func__, "args->y", &args->y,
                            plan->dtype, 3, ys, false, &present));
    int64_t hs[3] = {(int64_t)plan->L * plan->D, in.B, plan->H};
    KF_TRY(kf__check_tensor(plan->ctx, __func__, "args->hn", &args->hn, plan->dtype, 3, hs, true,
                            &present));
    void *hn = present ? args->hn.data : NULL;

    bool training = mode == KF_MODE_TRAINING;
    size_t ws_need = 0, rs_need = 0;
    plan->ops->sizes(plan, in.T, in.B, training, &ws_need, &rs_need);
    if (training) {
        KF_CHECK(reserve != NULL || rs_need == 0, KF_ERR_INVALID_ARGUMENT,
                 "reserve is NULL in KF_MODE_TRAINING (needs %zu bytes)", rs_need);
        KF_CHECK(reserve_bytes >= rs_need, KF_ERR_WORKSPACE_TOO_SMALL,
                 "reserve_bytes = %zu, expected >= %zu (kf_rnn_workspace_size)", reserve_bytes,
                 rs_need);
        KF_CHECK(((uintptr_t)reserve % KF__ALIGN) == 0, KF_ERR_INVALID_ARGUMENT,
                 "reserve = %p is not %u-byte aligned", reserve, KF__ALIGN);
        KF_TRY(kf__check_device_memory(plan->ctx, __func__, "reserve", reserve));
    }
    void *ws = NULL;
    KF_TRY(kf__workspace_select(plan->ctx, __func__, workspace, workspace_bytes, ws_need, &ws));

    kf__rnn_fwd c = {
        .plan = plan, .T = in.T, .B = in.B, .training = training, .x = in.x, .h0 = in.h0,
        .w = plan->w, .lengths = in.lengths, .seed = args->dropout_seed,
        .offset = args->dropout_offset, .y = args->y.data, .hn = hn, .ws = ws,
        .ws_bytes = ws_need, .reserve = training ? reserve : NULL,
        .reserve_bytes = training ? rs_need : 0,
    };
    return plan->ops->forward(plan->ctx, &c);
}

KF_API kf_status kf_rnn_backward(kf_rnn_plan *plan, kf_grad_mode grad_mode,
                                 const kf_rnn_backward_args *args, void *workspace,
                                 size_t workspace_bytes, const void *reserve,
                                 size_t reserve_bytes) {
    kf__clear_error();
    KF_CHECK(plan != NULL, KF_ERR_INVALID_ARGUMENT, "plan is NULL");
    KF_TRY(kf__check_grad_mode(__func__, grad_mode));
    KF_TRY(kf__check_struct_size(__func__, "args", args, sizeof(kf_rnn_backward_args)));
    kf__rnn_inputs in;
    KF_TRY(kf__rnn_check_inputs(__func__, plan, &args->x, &args->h0, args->weights,
                                args->num_weights, args->reserved0, &args->lengths, &in));
    KF_CHECK(args->reserved1 == 0, KF_ERR_INVALID_ARGUMENT, "args->reserved1 = %d, expected 0",
             (int)args->reserved1);
    bool present;
    int64_t ys[3], xs[3];
    kf__seq_shape(plan, in.T, in.B, (int64_t)plan->D * plan->H, ys);
    kf__seq_shape(plan, in.T, in.B, plan->I, xs);
    int64_t hs[3] = {(int64_t)plan->L * plan->D, in.B, plan->H};
    KF_TRY(kf__check_tensor(plan->ctx, __func__, "args->dy", &args->dy,
                            plan->dtype, 3, ys, true, &present));
    const void *dy = present ? args->dy.data : NULL;
    KF_TRY(kf__check_tensor(plan->ctx, __func__, "args->dhn", &args->dhn, plan->dtype, 3, hs, true,
                            &present));
    const void *dhn = present ? args->dhn.data : NULL;
    KF_TRY(kf__check_tensor(plan->ctx, __func__, "args->dx", &args->dx,
                            plan->dtype, 3, xs, true, &present));
    void *dx = present ? args->dx.data : NULL;
    int64_t hs2[3] = {hs[0], hs[1], hs[2]};
    KF_TRY(kf__check_tensor(plan->ctx, __func__, "args->dh0", &args->dh0,
                            plan->dtype, 3, hs2, true,
                            &present));
    void *dh0 = present ? args->dh0.data : NULL;

    bool any_dw = false;
    if (args->dweights == NULL) {
        KF_CHECK(args->num_dweights == 0, KF_ERR_INVALID_ARGUMENT,
                 "args->dweights is NULL but args->num_dweights = %d", (int)args->num_dweights);
        for (int32_t k = 0; k < plan->num_weights; ++k) plan->dw[k] = NULL;
    } else {
        KF_CHECK(args->num_dweights == plan->num_weights, KF_ERR_INVALID_ARGUMENT,
                 "args->num_dweights = %d, expected %d (kf_rnn_weight_count)",
                 (int)args->num_dweights, (int)plan->num_weights);
        for (int32_t k = 0; k < plan->num_weights; ++k) {
            int64_t ws[2];
            int32_t nd = kf__rnn_weight_shape(plan, k / plan->nw / plan->D, k % plan->nw, ws);
            char arg[160];
            snprintf(arg, sizeof arg, "args->dweights[%d] (%s)", (int)k, plan->names[k]);
            KF_TRY(kf__check_tensor(plan->ctx, __func__, arg, &args->dweights[k],
                                    plan->dtype, nd, ws, true,
                                    &present));
            plan->dw[k] = present ? args->dweights[k].data : NULL;
            any_dw = any_dw || present;
        }
    }

    size_t ws_need = 0, rs_need = 0;
    plan->ops->sizes(plan, in.T, in.B, true, &ws_need, &rs_need);
    KF_CHECK(reserve != NULL || rs_need == 0, KF_ERR_INVALID_ARGUMENT,
             "reserve is NULL (backward reads the %zu-byte reserve a training forward wrote)",
             rs_need);
    KF_CHECK(reserve_bytes >= rs_need, KF_ERR_WORKSPACE_TOO_SMALL,
             "reserve_bytes = %zu, expected >= %zu (kf_rnn_workspace_size)", reserve_bytes,
             rs_need);
    KF_TRY(kf__check_device_memory(plan->ctx, __func__, "reserve", reserve));
    void *ws = NULL;
    KF_TRY(kf__workspace_select(plan->ctx, __func__, workspace, workspace_bytes, ws_need, &ws));

    kf__rnn_bwd c = {
        .plan = plan, .T = in.T, .B = in.B, .x = in.x, .h0 = in.h0, .w = plan->w,
        .lengths = in.lengths, .seed = args->dropout_seed, .offset = args->dropout_offset,
        .dy = dy, .dhn = dhn, .dx = dx, .dh0 = dh0, .dw = any_dw ? plan->dw : NULL,
        .accumulate = grad_mode == KF_GRAD_ACCUMULATE, .ws = ws, .ws_bytes = ws_need,
        .reserve = reserve, .reserve_bytes = rs_need,
    };
    return plan->ops->backward(plan->ctx, &c);
}

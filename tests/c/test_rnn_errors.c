/* Error paths of the recurrent layer's API (kf_rnn_*), through the public header only.
 *
 * For every bad input: the documented status, a message (kf_last_error_message) that names the
 * function and the argument, and outputs untouched (filled with a sentinel before the call and
 * compared after). A successful call afterwards clears the message to "". */
#define _POSIX_C_SOURCE 200809L

#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kfuse.h"
#include "kf_test.h"
#include "ref_rnn.h"

/* ---- message checks ----------------------------------------------------------------------- */

/* Status `got` must be `want` (or `want2` when that is not KF_OK); the message names `fn` and one
 * of the '|'-separated tokens in `args`. */
static void check_error(const char *what, kf_status got, kf_status want, kf_status want2,
                        const char *fn, const char *args) {
    const char *msg = kf_last_error_message();
    cr_assert(msg != NULL, "%s: kf_last_error_message() is NULL", what);
    cr_expect(got == want || (want2 != KF_OK && got == want2), "%s: status %s, expected %s%s%s",
              what, kf_status_string(got), kf_status_string(want), want2 ? " or " : "",
              want2 ? kf_status_string(want2) : "");
    cr_expect(has_token(msg, fn), "%s: message '%s' does not name %s", what, msg, fn);
    char buf[128];
    snprintf(buf, sizeof buf, "%s", args);
    int named = 0;
    for (char *save = NULL, *t = strtok_r(buf, "|", &save); t; t = strtok_r(NULL, "|", &save))
        named |= has_token(msg, t);
    cr_expect(named, "%s: message '%s' does not name the argument (%s)", what, msg, args);
}

/* ---- the fixture: a valid call, then one thing broken at a time -------------------------- */
#define SENTINEL 1234.5f

typedef struct fx {
    ref_rnn_cfg c;
    kf_context *ctx;
    kf_rnn_plan *plan;
    int nw;
    int64_t nx, ny, nh;
    float *x, *h0, *y, *hn, *dy, *dhn, *dx, *dh0;
    int32_t *len;
    float **w, **dw;
    kf_tensor *wt, *dwt;
    void *ws, *rs, *rs_copy;
    size_t ws_bytes, rs_bytes;
    kf_rnn_forward_args fa;
    kf_rnn_backward_args ba;
} fx;

static void fill(float *p, int64_t n, float v) {
    for (int64_t i = 0; i < n; ++i) p[i] = v;
}

static int all_equal(const float *p, int64_t n, float v) {
    for (int64_t i = 0; i < n; ++i)
        if (p[i] != v) return 0;
    return 1;
}

static void fx_make(fx *f, ref_rnn_cfg c) {
    memset(f, 0, sizeof *f);
    f->c = c;
    kf_context_desc cd;
    kf_context_desc_init(&cd);
    cd.num_threads = 1;
    cr_assert(kf_context_create(&cd, &f->ctx) == KF_OK, "%s", kf_last_error_message());
    kf_rnn_desc d;
    kf_rnn_desc_init(&d);
    d.cell = c.cell;
    d.num_layers = c.L;
    d.input_size = c.I;
    d.hidden_size = c.H;
    d.flags = (c.D == 2 ? KF_RNN_BIDIRECTIONAL : 0u) | (c.batch_first ? KF_RNN_BATCH_FIRST : 0u);
    d.dropout = c.dropout;
    cr_assert(kf_rnn_plan_create(f->ctx, &d, &f->plan) == KF_OK, "%s", kf_last_error_message());
    f->nw = ref_rnn_num_weights(&c);
    f->nx = ref_rnn_x_numel(&c);
    f->ny = ref_rnn_y_numel(&c);
    f->nh = ref_rnn_h_numel(&c);
    ref_rng r;
    ref_rng_seed(&r, 5);
    f->x = xalloc((size_t)f->nx * 4);
    f->h0 = xalloc((size_t)f->nh * 4);
    f->y = xalloc((size_t)f->ny * 4);
    f->hn = xalloc((size_t)f->nh * 4);
    f->dy = xalloc((size_t)f->ny * 4);
    f->dhn = xalloc((size_t)f->nh * 4);
    f->dx = xalloc((size_t)f->nx * 4);
    f->dh0 = xalloc((size_t)f->nh * 4);
    f->len = xalloc((size_t)c.B * 4);
    for (int64_t b = 0; b < c.B; ++b) f->len[b] = (int32_t)(c.T - b % c.T);
    ref_fill_uniform_f32(&r, f->x, f->nx, -1, 1);
    ref_fill_uniform_f32(&r, f->h0, f->nh, -1, 1);
    ref_fill_uniform_f32(&r, f->dy, f->ny, -1, 1);
    ref_fill_uniform_f32(&r, f->dhn, f->nh, -1, 1);
    f->w = calloc((size_t)f->nw, sizeof *f->w);
    f->dw = calloc((size_t)f->nw, sizeof *f->dw);
    f->wt = calloc((size_t)f->nw, sizeof *f->wt);
    f->dwt = calloc((size_t)f->nw, sizeof *f->dwt);
    for (int i = 0; i < f->nw; ++i) {
        int nd;
        int64_t sh[2];
        int64_t n = ref_rnn_weight_desc(&c, i, NULL, 0, &nd, sh);
        f->w[i] = xalloc((size_t)n * 4);
        f->dw[i] = xalloc((size_t)n * 4);
        ref_fill_uniform_f32(&r, f->w[i], n, -0.3, 0.3);
        f->wt[i] = tens(f->w[i], KF_DTYPE_F32, nd, sh);
        f->dwt[i] = tens(f->dw[i], KF_DTYPE_F32, nd, sh);
    }
    cr_assert(kf_rnn_workspace_size(f->plan, c.T, c.B, KF_MODE_TRAINING, &f->ws_bytes,
                                    &f->rs_bytes) == KF_OK, "%s", kf_last_error_message());
    f->ws = xalloc(f->ws_bytes + 64);
    f->rs = xalloc(f->rs_bytes + 64);
    f->rs_copy = xalloc(f->rs_bytes + 64);
    /* defined bytes throughout: forward leaves rows past each length (and padding) unwritten,
     * and the untouched-reserve check compares every byte */
    memset(f->rs, 0, f->rs_bytes + 64);
    memset(f->rs_copy, 0, f->rs_bytes + 64);

    int64_t xs[3] = {c.batch_first ? c.B : c.T, c.batch_first ? c.T : c.B, c.I};
    int64_t ys[3] = {xs[0], xs[1], (int64_t)c.D * c.H};
    int64_t hs[3] = {(int64_t)c.L * c.D, c.B, c.H}, ls[1] = {c.B};
    kf_rnn_forward_args_init(&f->fa);
    f->fa.x = tens(f->x, KF_DTYPE_F32, 3, xs);
    f->fa.h0 = tens(f->h0, KF_DTYPE_F32, 3, hs);
    f->fa.weights = f->wt;
    f->fa.num_weights = f->nw;
    f->fa.lengths = tens(f->len, KF_DTYPE_I32, 1, ls);
    f->fa.dropout_seed = 1;
    f->fa.y = tens(f->y, KF_DTYPE_F32, 3, ys);
    f->fa.hn = tens(f->hn, KF_DTYPE_F32, 3, hs);

    kf_rnn_backward_args_init(&f->ba);
    f->ba.x = f->fa.x;
    f->ba.h0 = f->fa.h0;
    f->ba.weights = f->wt;
    f->ba.num_weights = f->nw;
    f->ba.lengths = f->fa.lengths;
    f->ba.dropout_seed = 1;
    f->ba.dy = tens(f->dy, KF_DTYPE_F32, 3, ys);
    f->ba.dhn = tens(f->dhn, KF_DTYPE_F32, 3, hs);
    f->ba.dx = tens(f->dx, KF_DTYPE_F32, 3, xs);
    f->ba.dh0 = tens(f->dh0, KF_DTYPE_F32, 3, hs);
    f->ba.dweights = f->dwt;
    f->ba.num_dweights = f->nw;

    /* The valid call works (and writes a reserve the backward cases can read). */
    kf_status s = kf_rnn_forward(f->plan, KF_MODE_TRAINING, &f->fa, f->ws, f->ws_bytes, f->rs,
                                 f->rs_bytes);
    cr_assert(s == KF_OK, "valid forward: %s", kf_last_error_message());
    memcpy(f->rs_copy, f->rs, f->rs_bytes);
}

static void fx_free(fx *f) {
    for (int i = 0; i < f->nw; ++i) { free(f->w[i]); free(f->dw[i]); }
    free(f->w); free(f->dw); free(f->wt); free(f->dwt);
    free(f->x); free(f->h0); free(f->y); free(f->hn); free(f->dy); free(f->dhn);
    free(f->dx); free(f->dh0); free(f->len); free(f->ws); free(f->rs); free(f->rs_copy);
    kf_rnn_plan_destroy(f->plan);
    kf_context_destroy(f->ctx);
}

static int64_t wnumel(const fx *f, int i) {
    return ref_rnn_weight_desc(&f->c, i, NULL, 0, NULL, NULL);
}

static void sentinels(fx *f) {
    fill(f->y, f->ny, SENTINEL);
    fill(f->hn, f->nh, SENTINEL);
    fill(f->dx, f->nx, SENTINEL);
    fill(f->dh0, f->nh, SENTINEL);
    for (int i = 0; i < f->nw; ++i) fill(f->dw[i], wnumel(f, i), SENTINEL);
    memcpy(f->rs, f->rs_copy, f->rs_bytes);
}

static void check_untouched(const fx *f, const char *what) {
    cr_expect(all_equal(f->y, f->ny, SENTINEL), "%s: y written by a failing call", what);
    cr_expect(all_equal(f->hn, f->nh, SENTINEL), "%s: hn written by a failing call", what);
    cr_expect(all_equal(f->dx, f->nx, SENTINEL), "%s: dx written by a failing call", what);
    cr_expect(all_equal(f->dh0, f->nh, SENTINEL), "%s: dh0 written by a failing call", what);
    for (int i = 0; i < f->nw; ++i)
        cr_expect(all_equal(f->dw[i], wnumel(f, i), SENTINEL),
                  "%s: dweights[%d] written by a failing call", what, i);
    cr_expect(memcmp(f->rs, f->rs_copy, f->rs_bytes) == 0, "%s: reserve written by a failing call",
              what);
}

/* One forward case: copy the valid call, apply the mutation, expect the error. */
#define FWD_CASE(want, want2, tokens, ...)                                                      \
    do {                                                                                        \
        kf_rnn_forward_args a = f->fa;                                                          \
        kf_tensor wcopy[64];                                                                    \
        memcpy(wcopy, f->wt, (size_t)f->nw * sizeof(kf_tensor));                                \
        kf_rnn_plan *plan = f->plan;                                                            \
        kf_rnn_forward_args *ap = &a;                                                           \
        kf_mode mode = KF_MODE_TRAINING;                                                        \
        void *ws = f->ws, *rs = f->rs;                                                          \
        size_t wsb = f->ws_bytes, rsb = f->rs_bytes;                                            \
        (void)wcopy; (void)ws; (void)rs; (void)wsb; (void)rsb; (void)plan; (void)ap; (void)mode;\
        __VA_ARGS__;                                                                            \
        sentinels(f);                                                                           \
        kf_status s = kf_rnn_forward(plan, mode, ap, ws, wsb, rs, rsb);                         \
        check_error(#__VA_ARGS__, s, want, want2, "kf_rnn_forward", tokens);                    \
        check_untouched(f, #__VA_ARGS__);                                                       \
    } while (0)

#define BWD_CASE(want, want2, tokens, ...)                                                      \
    do {                                                                                        \
        kf_rnn_backward_args a = f->ba;                                                         \
        kf_tensor wcopy[64], dwcopy[64];                                                        \
        memcpy(wcopy, f->wt, (size_t)f->nw * sizeof(kf_tensor));                                \
        memcpy(dwcopy, f->dwt, (size_t)f->nw * sizeof(kf_tensor));                              \
        kf_rnn_plan *plan = f->plan;                                                            \
        kf_rnn_backward_args *ap = &a;                                                          \
        kf_grad_mode gm = KF_GRAD_OVERWRITE;                                                    \
        void *ws = f->ws;                                                                       \
        const void *rs = f->rs;                                                                 \
        size_t wsb = f->ws_bytes, rsb = f->rs_bytes;                                            \
        (void)wcopy; (void)dwcopy; (void)ws; (void)rs; (void)wsb; (void)rsb; (void)plan;        \
        (void)ap; (void)gm;                                                                     \
        __VA_ARGS__;                                                                            \
        for (int acc = 0; acc < 2; ++acc) {                                                     \
            sentinels(f);                                                                       \
            kf_status s = kf_rnn_backward(plan, gm == KF_GRAD_OVERWRITE && acc                   \
                                                    ? KF_GRAD_ACCUMULATE : gm,                   \
                                          ap, ws, wsb, rs, rsb);                                \
            check_error(#__VA_ARGS__, s, want, want2, "kf_rnn_backward", tokens);               \
            check_untouched(f, #__VA_ARGS__);                                                   \
        }                                                                                       \
    } while (0)

static ref_rnn_cfg gru_cfg(void) {
    ref_rnn_cfg c = {.cell = REF_GRU, .L = 2, .D = 2, .I = 5, .H = 7, .T = 4, .B = 3,
                     .dropout = 0.25f, .gamma = 0.01f};
    return c;
}

static ref_rnn_cfg agru_cfg(void) {
    ref_rnn_cfg c = {.cell = REF_AGRU, .L = 2, .D = 1, .I = 5, .H = 7, .T = 4, .B = 3,
                     .dropout = 0.25f, .gamma = 0.01f};
    return c;
}

/* After the failures, the valid calls still work and clear the message. */
static void check_recovers(fx *f) {
    kf_rnn_forward(NULL, KF_MODE_INFERENCE, &f->fa, NULL, 0, NULL, 0); /* sets a message */
    cr_assert(strcmp(kf_last_error_message(), "") != 0);
    sentinels(f);
    kf_status s = kf_rnn_forward(f->plan, KF_MODE_TRAINING, &f->fa, f->ws, f->ws_bytes, f->rs,
                                 f->rs_bytes);
    cr_assert(s == KF_OK, "valid forward: %s", kf_last_error_message());
    cr_expect_str_eq(kf_last_error_message(), "", "message after a successful forward: '%s'",
                     kf_last_error_message());
    cr_expect(!all_equal(f->y, f->ny, SENTINEL), "y not written by a successful forward");
    memcpy(f->rs_copy, f->rs, f->rs_bytes);
    kf_rnn_backward(NULL, KF_GRAD_OVERWRITE, &f->ba, NULL, 0, NULL, 0);
    s = kf_rnn_backward(f->plan, KF_GRAD_OVERWRITE, &f->ba, f->ws, f->ws_bytes, f->rs, f->rs_bytes);
    cr_assert(s == KF_OK, "valid backward: %s", kf_last_error_message());
    cr_expect_str_eq(kf_last_error_message(), "", "message after a successful backward: '%s'",
                     kf_last_error_message());
    cr_expect(memcmp(f->rs, f->rs_copy, f->rs_bytes) == 0,
              "backward wrote to its const reserve");
    for (int64_t i = 0; i < f->nx; ++i)
        cr_assert(isfinite(f->dx[i]) && f->dx[i] != SENTINEL, "dx[%lld] not written",
                  (long long)i);
}

/* ---- forward ------------------------------------------------------------------------------ */
static void forward_cases(fx *f) {
    const kf_status INV = KF_ERR_INVALID_ARGUMENT, TOO_SMALL = KF_ERR_WORKSPACE_TOO_SMALL;
    const int64_t T = f->c.T, B = f->c.B, H = f->c.H, D = f->c.D;
    const int last = f->nw - 1;

    FWD_CASE(INV, KF_OK, "plan", plan = NULL);
    FWD_CASE(INV, KF_OK, "args", ap = NULL);
    FWD_CASE(INV, KF_OK, "mode", mode = (kf_mode)0);
    FWD_CASE(INV, KF_OK, "mode", mode = (kf_mode)3);
    FWD_CASE(INV, KF_OK, "struct_size", a.struct_size = 0);
    FWD_CASE(INV, KF_OK, "struct_size", a.struct_size = sizeof(kf_rnn_forward_args) - 8);
    FWD_CASE(INV, KF_OK, "reserved0", a.reserved0 = 1);
    /* x */
    FWD_CASE(INV, KF_OK, "x", a.x.data = NULL);
    FWD_CASE(INV, KF_OK, "x", a.x.dtype = KF_DTYPE_F64);
    FWD_CASE(INV, KF_OK, "x", a.x.dtype = 99);
    FWD_CASE(INV, KF_OK, "x", a.x.ndim = 2);
    FWD_CASE(INV, KF_OK, "x", a.x.ndim = 4; a.x.shape[3] = 1; a.x.strides[3] = 1);
    FWD_CASE(INV, KF_OK, "x", a.x.shape[2] = f->c.I + 1);
    FWD_CASE(INV, KF_OK, "x", a.x.shape[2] = f->c.I - 1);
    FWD_CASE(INV, KF_OK, "x|T", a.x.shape[0] = 0);
    FWD_CASE(INV, KF_OK, "x|B", a.x.shape[1] = 0);
    FWD_CASE(INV, KF_OK, "x|T", a.x.shape[0] = -2);
    FWD_CASE(INV, KF_OK, "x", a.x.strides[2] = 2);
    FWD_CASE(INV, KF_OK, "x", a.x.strides[0] = a.x.strides[0] + 1);
    FWD_CASE(INV, KF_OK, "x", a.x.strides[0] = 1; a.x.strides[1] = T; a.x.strides[2] = T * B);
    FWD_CASE(INV, KF_OK, "x", a.x.data = (char *)f->x + 2);
    /* sizes that overflow: never read, never crash */
    FWD_CASE(INV, KF_OK, "x|T|B", {
        int64_t sh[3] = {INT64_MAX / 2, B, f->c.I};
        kf_tensor_init(&a.x, f->x, KF_DTYPE_F32, 3, sh);
    });
    FWD_CASE(INV, KF_OK, "x|T|B", {
        int64_t sh[3] = {INT64_MAX / 8, 4, f->c.I};
        kf_tensor_init(&a.x, f->x, KF_DTYPE_F32, 3, sh);
    });
    /* past 32-bit extents (the other tensors disagree too, so no implementation reads on) */
    FWD_CASE(INV, KF_OK, "x|T|B|y", {
        int64_t sh[3] = {(int64_t)1 << 31, B, f->c.I};
        if (f->c.batch_first) { sh[0] = B; sh[1] = (int64_t)1 << 31; }
        kf_tensor_init(&a.x, f->x, KF_DTYPE_F32, 3, sh);
    });
    /* h0: each dimension, dtype, rank */
    FWD_CASE(INV, KF_OK, "h0", a.h0.shape[0] -= 1);
    FWD_CASE(INV, KF_OK, "h0", a.h0.shape[0] += 1);
    FWD_CASE(INV, KF_OK, "h0", a.h0.shape[1] += 1);
    FWD_CASE(INV, KF_OK, "h0", a.h0.shape[2] += 1);
    FWD_CASE(INV, KF_OK, "h0", a.h0.dtype = KF_DTYPE_F16);
    FWD_CASE(INV, KF_OK, "h0", a.h0.ndim = 2);
    FWD_CASE(INV, KF_OK, "h0", a.h0.strides[1] = 2 * H);
    FWD_CASE(INV, KF_OK, "h0", a.h0.data = (char *)f->h0 + 1);
    /* weights */
    FWD_CASE(INV, KF_OK, "weights", a.weights = NULL);
    FWD_CASE(INV, KF_OK, "num_weights", a.num_weights = f->nw - 1);
    FWD_CASE(INV, KF_OK, "num_weights", a.num_weights = f->nw + 1);
    FWD_CASE(INV, KF_OK, "num_weights", a.num_weights = 0);
    FWD_CASE(INV, KF_OK, "num_weights", a.num_weights = -1);
    FWD_CASE(INV, KF_OK, "weights", wcopy[1].shape[0] += 1; a.weights = wcopy);
    FWD_CASE(INV, KF_OK, "weights", wcopy[0].shape[1] += 1; a.weights = wcopy);
    FWD_CASE(INV, KF_OK, "weights", wcopy[last - 3].shape[1] = f->c.I; a.weights = wcopy);
    FWD_CASE(INV, KF_OK, "weights", wcopy[last].shape[0] += 1; a.weights = wcopy);
    FWD_CASE(INV, KF_OK, "weights",
             wcopy[2].ndim = 3; wcopy[2].shape[2] = 1; wcopy[2].strides[2] = 1;
             a.weights = wcopy);
    FWD_CASE(INV, KF_OK, "weights", wcopy[3].data = NULL; a.weights = wcopy);
    FWD_CASE(INV, KF_OK, "weights", wcopy[4].dtype = KF_DTYPE_BF16; a.weights = wcopy);
    FWD_CASE(INV, KF_OK, "weights", wcopy[1].data = (char *)f->w[1] + 2; a.weights = wcopy);
    FWD_CASE(INV, KF_OK, "weights", wcopy[0].strides[1] = 2; a.weights = wcopy);
    /* lengths */
    FWD_CASE(INV, KF_OK, "lengths", a.lengths.dtype = KF_DTYPE_I64);
    FWD_CASE(INV, KF_OK, "lengths", a.lengths.dtype = KF_DTYPE_F32);
    FWD_CASE(INV, KF_OK, "lengths", a.lengths.shape[0] = B + 1);
    FWD_CASE(INV, KF_OK, "lengths", a.lengths.ndim = 2; a.lengths.shape[1] = 1);
    const int32_t len1 = f->len[1], len2 = f->len[2];
    FWD_CASE(INV, KF_OK, "lengths", f->len[1] = (int32_t)T + 1);
    f->len[1] = len1;
    FWD_CASE(INV, KF_OK, "lengths", f->len[2] = -1);
    f->len[2] = len2;
    FWD_CASE(INV, KF_OK, "lengths", f->len[0] = INT32_MIN);
    f->len[0] = (int32_t)T;
    /* y and hn */
    FWD_CASE(INV, KF_OK, "y", a.y.data = NULL);
    FWD_CASE(INV, KF_OK, "y", a.y.shape[0] += 1);
    FWD_CASE(INV, KF_OK, "y", a.y.shape[1] -= 1);
    FWD_CASE(INV, KF_OK, "y", a.y.shape[2] = D * H - 1);
    FWD_CASE(INV, KF_OK, "y", a.y.shape[2] = D * H + 1);
    FWD_CASE(INV, KF_OK, "y", a.y.dtype = KF_DTYPE_F64);
    FWD_CASE(INV, KF_OK, "y", a.y.strides[1] = 2 * D * H);
    FWD_CASE(INV, KF_OK, "y", a.y.data = (char *)f->y + 2);
    FWD_CASE(INV, KF_OK, "hn", a.hn.shape[0] -= 1);
    FWD_CASE(INV, KF_OK, "hn", a.hn.shape[1] += 1);
    FWD_CASE(INV, KF_OK, "hn", a.hn.shape[2] += 1);
    FWD_CASE(INV, KF_OK, "hn", a.hn.dtype = KF_DTYPE_I32);
    /* reserve and workspace */
    FWD_CASE(INV, TOO_SMALL, "reserve|reserve_bytes", rs = NULL; rsb = 0);
    FWD_CASE(INV, KF_OK, "reserve", rs = NULL);
    FWD_CASE(TOO_SMALL, KF_OK, "reserve|reserve_bytes", rsb = f->rs_bytes - 1);
    FWD_CASE(TOO_SMALL, KF_OK, "reserve|reserve_bytes", rsb = 0);
    if (f->ws_bytes > 0) {
        FWD_CASE(TOO_SMALL, KF_OK, "workspace|workspace_bytes", wsb = f->ws_bytes - 1);
        FWD_CASE(INV, KF_OK, "workspace", ws = (char *)f->ws + 32);
    }
    FWD_CASE(INV, KF_OK, "workspace|workspace_bytes", ws = NULL; wsb = 64);
    /* inference takes no reserve, but its workspace is still checked */
    size_t iws = 0;
    cr_assert(kf_rnn_workspace_size(f->plan, T, B, KF_MODE_INFERENCE, &iws, NULL) == KF_OK);
    if (iws > 0)
        FWD_CASE(TOO_SMALL, KF_OK, "workspace|workspace_bytes",
                 mode = KF_MODE_INFERENCE; rs = NULL; rsb = 0; wsb = iws - 1);
}

static void agru_forward_cases(fx *f) {
    /* A-GRU specifics: epsilon is [1], W_h is [H, H], L*10 weights */
    FWD_CASE(KF_ERR_INVALID_ARGUMENT, KF_OK, "weights", wcopy[9].shape[0] = 2; a.weights = wcopy);
    FWD_CASE(KF_ERR_INVALID_ARGUMENT, KF_OK, "weights",
             wcopy[8].shape[1] = f->c.I; a.weights = wcopy);
    FWD_CASE(KF_ERR_INVALID_ARGUMENT, KF_OK, "num_weights", a.num_weights = 10);
}

static void batch_first_forward_cases(fx *f) {
    /* a time-major x handed to a batch-first plan (T != B) */
    FWD_CASE(KF_ERR_INVALID_ARGUMENT, KF_OK, "x|h0|y|lengths", {
        int64_t sh[3] = {f->c.T, f->c.B, f->c.I};
        kf_tensor_init(&a.x, f->x, KF_DTYPE_F32, 3, sh);
    });
}

Test(rnn_errors, forward_gru) {
    fx f;
    fx_make(&f, gru_cfg());
    forward_cases(&f);
    check_recovers(&f);
    fx_free(&f);
}

Test(rnn_errors, forward_agru) {
    fx f;
    fx_make(&f, agru_cfg());
    forward_cases(&f);
    agru_forward_cases(&f);
    check_recovers(&f);
    fx_free(&f);
}

Test(rnn_errors, forward_batch_first) {
    ref_rnn_cfg c = gru_cfg();
    c.batch_first = 1;
    fx f;
    fx_make(&f, c);
    forward_cases(&f);
    batch_first_forward_cases(&f);
    check_recovers(&f);
    fx_free(&f);
}

/* ---- backward ----------------------------------------------------------------------------- */
static void backward_cases(fx *f) {
    const kf_status INV = KF_ERR_INVALID_ARGUMENT, TOO_SMALL = KF_ERR_WORKSPACE_TOO_SMALL;
    const int last = f->nw - 1;

    BWD_CASE(INV, KF_OK, "plan", plan = NULL);
    BWD_CASE(INV, KF_OK, "args", ap = NULL);
    BWD_CASE(INV, KF_OK, "grad_mode", gm = (kf_grad_mode)0);
    BWD_CASE(INV, KF_OK, "grad_mode", gm = (kf_grad_mode)3);
    BWD_CASE(INV, KF_OK, "struct_size", a.struct_size = 0);
    BWD_CASE(INV, KF_OK, "struct_size", a.struct_size = 8);
    BWD_CASE(INV, KF_OK, "reserved0", a.reserved0 = 7);
    BWD_CASE(INV, KF_OK, "reserved1", a.reserved1 = 1);
    BWD_CASE(INV, KF_OK, "x", a.x.data = NULL);
    BWD_CASE(INV, KF_OK, "x", a.x.shape[2] += 1);
    BWD_CASE(INV, KF_OK, "x", a.x.dtype = KF_DTYPE_F64);
    BWD_CASE(INV, KF_OK, "x", a.x.strides[2] = 3);
    BWD_CASE(INV, KF_OK, "h0", a.h0.shape[1] -= 1);
    BWD_CASE(INV, KF_OK, "weights", a.weights = NULL);
    BWD_CASE(INV, KF_OK, "num_weights", a.num_weights = f->nw + 4);
    BWD_CASE(INV, KF_OK, "weights", wcopy[last].shape[0] = 3; a.weights = wcopy);
    BWD_CASE(INV, KF_OK, "lengths", a.lengths.shape[0] = 1);
    const int32_t len0 = f->len[0];
    BWD_CASE(INV, KF_OK, "lengths", f->len[0] = 1000);
    f->len[0] = len0;
    BWD_CASE(INV, KF_OK, "x|T|B", {
        int64_t sh[3] = {INT64_MAX / 4, 2, f->c.I};
        kf_tensor_init(&a.x, f->x, KF_DTYPE_F32, 3, sh);
    });
    /* dy, dhn: each dimension */
    for (int k = 0; k < 3; ++k) {
        BWD_CASE(INV, KF_OK, "dy", a.dy.shape[k] += 1);
        BWD_CASE(INV, KF_OK, "dhn", a.dhn.shape[k] += 1);
        BWD_CASE(INV, KF_OK, "dx", a.dx.shape[k] += 1);
        BWD_CASE(INV, KF_OK, "dh0", a.dh0.shape[k] += 1);
    }
    BWD_CASE(INV, KF_OK, "dy", a.dy.dtype = KF_DTYPE_F64);
    BWD_CASE(INV, KF_OK, "dhn", a.dhn.ndim = 4; a.dhn.shape[3] = 1; a.dhn.strides[3] = 1);
    BWD_CASE(INV, KF_OK, "dx", a.dx.data = (char *)f->dx + 1);
    BWD_CASE(INV, KF_OK, "dh0", a.dh0.strides[0] = 1);
    /* dweights */
    BWD_CASE(INV, KF_OK, "num_dweights|dweights", a.num_dweights = 0);
    BWD_CASE(INV, KF_OK, "num_dweights|dweights", a.num_dweights = f->nw - 1);
    BWD_CASE(INV, KF_OK, "num_dweights|dweights", a.dweights = NULL);
    BWD_CASE(INV, KF_OK, "dweights", dwcopy[0].shape[0] += 1; a.dweights = dwcopy);
    BWD_CASE(INV, KF_OK, "dweights", dwcopy[last].shape[0] = 0; a.dweights = dwcopy);
    BWD_CASE(INV, KF_OK, "dweights", dwcopy[2].dtype = KF_DTYPE_F64; a.dweights = dwcopy);
    BWD_CASE(INV, KF_OK, "dweights", dwcopy[0].strides[0] = 1; a.dweights = dwcopy);
    BWD_CASE(INV, KF_OK, "dweights",
             dwcopy[1].data = (char *)f->dw[1] + 2; a.dweights = dwcopy);
    /* an absent entry is fine, but the others must still be checked */
    BWD_CASE(INV, KF_OK, "dweights",
             dwcopy[0].data = NULL; dwcopy[1].shape[0] += 1; a.dweights = dwcopy);
    /* reserve and workspace */
    BWD_CASE(INV, TOO_SMALL, "reserve|reserve_bytes", rs = NULL; rsb = 0);
    BWD_CASE(INV, KF_OK, "reserve", rs = NULL);
    BWD_CASE(TOO_SMALL, KF_OK, "reserve|reserve_bytes", rsb = f->rs_bytes - 1);
    if (f->ws_bytes > 0) {
        BWD_CASE(TOO_SMALL, KF_OK, "workspace|workspace_bytes", wsb = f->ws_bytes - 1);
        BWD_CASE(INV, KF_OK, "workspace", ws = (char *)f->ws + 16);
    }
    BWD_CASE(INV, KF_OK, "workspace|workspace_bytes", ws = NULL; wsb = 128);
}

Test(rnn_errors, backward_gru) {
    fx f;
    fx_make(&f, gru_cfg());
    backward_cases(&f);
    check_recovers(&f);
    fx_free(&f);
}

Test(rnn_errors, backward_agru) {
    fx f;
    fx_make(&f, agru_cfg());
    backward_cases(&f);
    check_recovers(&f);
    fx_free(&f);
}

/* ---- plan creation ------------------------------------------------------------------------ */

static kf_rnn_desc valid_desc(void) {
    kf_rnn_desc d;
    kf_rnn_desc_init(&d);
    d.input_size = 4;
    d.hidden_size = 6;
    return d;
}

#define PLAN_CASE(want, want2, tokens, ...)                                                     \
    do {                                                                                        \
        kf_rnn_desc d = valid_desc();                                                           \
        kf_context *c = ctx;                                                                    \
        const kf_rnn_desc *dp = &d;                                                             \
        kf_rnn_plan *sentinel = (kf_rnn_plan *)(uintptr_t)0x5A5A50;                             \
        kf_rnn_plan *out = sentinel;                                                            \
        kf_rnn_plan **outp = &out;                                                              \
        (void)c; (void)dp; (void)outp;                                                          \
        __VA_ARGS__;                                                                            \
        kf_status s = kf_rnn_plan_create(c, dp, outp);                                          \
        check_error(#__VA_ARGS__, s, want, want2, "kf_rnn_plan_create", tokens);                \
        /* "nothing visible written" (header conventions) or NULL (as kf_context_create) */     \
        cr_expect(out == sentinel || out == NULL, "%s: *out = %p after a failure",              \
                  #__VA_ARGS__, (void *)out);                                                   \
        if (s == KF_OK) kf_rnn_plan_destroy(out);                                               \
    } while (0)

Test(rnn_errors, plan_create) {
    const kf_status INV = KF_ERR_INVALID_ARGUMENT, UNS = KF_ERR_UNSUPPORTED;
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 0);
    PLAN_CASE(INV, KF_OK, "ctx", c = NULL);
    PLAN_CASE(INV, KF_OK, "desc", dp = NULL);
    PLAN_CASE(INV, KF_OK, "struct_size", d.struct_size = 0);
    PLAN_CASE(INV, KF_OK, "struct_size", d.struct_size = sizeof(kf_rnn_desc) - 4);
    PLAN_CASE(INV, KF_OK, "cell", d.cell = 0);
    PLAN_CASE(INV, KF_OK, "cell", d.cell = 3);
    PLAN_CASE(INV, KF_OK, "num_layers", d.num_layers = 0);
    PLAN_CASE(INV, KF_OK, "num_layers", d.num_layers = -3);
    PLAN_CASE(INV, KF_OK, "num_layers", d.num_layers = INT32_MAX);
    PLAN_CASE(INV, KF_OK, "input_size", d.input_size = 0);
    PLAN_CASE(INV, KF_OK, "input_size", d.input_size = -1);
    PLAN_CASE(INV, KF_OK, "input_size", d.input_size = INT64_MAX / 2);
    PLAN_CASE(INV, KF_OK, "hidden_size", d.hidden_size = 0);
    PLAN_CASE(INV, KF_OK, "hidden_size", d.hidden_size = -7);
    PLAN_CASE(INV, KF_OK, "hidden_size", d.hidden_size = INT64_MAX / 2);
    PLAN_CASE(INV, KF_OK, "hidden_size", d.hidden_size = INT64_MAX);
    PLAN_CASE(INV, KF_OK, "hidden_size", d.cell = KF_RNN_AGRU; d.hidden_size = INT64_MAX / 2);
    PLAN_CASE(INV, KF_OK, "flags", d.flags = 0x4);
    PLAN_CASE(INV, KF_OK, "flags", d.flags = KF_RNN_BATCH_FIRST | 0x80000000u);
    PLAN_CASE(UNS, KF_OK, "flags|KF_RNN_BIDIRECTIONAL",
              d.cell = KF_RNN_AGRU; d.flags = KF_RNN_BIDIRECTIONAL);
    PLAN_CASE(INV, KF_OK, "dropout", d.dropout = -0.1f);
    PLAN_CASE(INV, KF_OK, "dropout", d.dropout = 1.0f);
    PLAN_CASE(INV, KF_OK, "dropout", d.dropout = 1.5f);
    PLAN_CASE(INV, KF_OK, "dropout", d.dropout = NAN);
    PLAN_CASE(INV, UNS, "dtype", d.dtype = KF_DTYPE_I32);
    PLAN_CASE(INV, UNS, "dtype", d.dtype = KF_DTYPE_I64);
    PLAN_CASE(INV, UNS, "dtype", d.dtype = 0);
    PLAN_CASE(INV, KF_OK, "out", outp = NULL);
    /* a newer caller's larger struct: fine when the unknown tail is zero, refused otherwise */
    {
        struct { kf_rnn_desc d; uint64_t tail[2]; } big;
        memset(&big, 0, sizeof big);
        big.d = valid_desc();
        big.d.struct_size = sizeof big;
        kf_rnn_plan *p = NULL;
        cr_expect(kf_rnn_plan_create(ctx, &big.d, &p) == KF_OK, "zero tail: %s",
                  kf_last_error_message());
        kf_rnn_plan_destroy(p);
        big.tail[1] = 1;
        p = NULL;
        kf_status s = kf_rnn_plan_create(ctx, &big.d, &p);
        check_error("non-zero tail", s, KF_ERR_UNSUPPORTED, INV, "kf_rnn_plan_create",
                    "struct_size|desc");
        cr_expect(p == NULL, "*out set after a failure");
    }
    /* valid edge values */
    {
        kf_rnn_desc d = valid_desc();
        d.dropout = nextafterf(1.0f, 0.0f);
        kf_rnn_plan *p = NULL;
        cr_expect(kf_rnn_plan_create(ctx, &d, &p) == KF_OK, "dropout just below 1: %s",
                  kf_last_error_message());
        cr_expect_str_eq(kf_last_error_message(), "");
        kf_rnn_plan_destroy(p);
        kf_rnn_plan_destroy(NULL); /* accepted */
    }
    kf_context_destroy(ctx);
}

/* ---- queries ------------------------------------------------------------------------------ */
Test(rnn_errors, weight_queries) {
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 0);
    kf_rnn_desc d = valid_desc();
    d.num_layers = 2;
    kf_rnn_plan *plan = NULL;
    cr_assert(kf_rnn_plan_create(ctx, &d, &plan) == KF_OK);
    int32_t count = -5;
    check_error("count plan NULL", kf_rnn_weight_count(NULL, &count), KF_ERR_INVALID_ARGUMENT,
                KF_OK, "kf_rnn_weight_count", "plan");
    cr_expect_eq(count, -5, "count written by a failing call");
    check_error("count NULL", kf_rnn_weight_count(plan, NULL), KF_ERR_INVALID_ARGUMENT, KF_OK,
                "kf_rnn_weight_count", "count");
    const char *name = "sentinel";
    int32_t nd = -5;
    int64_t sh[KF_MAX_DIMS] = {-5, -5, -5, -5, -5, -5};
    const int32_t bad[] = {-1, 8, 9, INT32_MAX, INT32_MIN};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        check_error("info index", kf_rnn_weight_info(plan, bad[i], &name, &nd, sh),
                    KF_ERR_INVALID_ARGUMENT, KF_OK, "kf_rnn_weight_info", "index");
        cr_expect(strcmp(name, "sentinel") == 0 && nd == -5 && sh[0] == -5 && sh[1] == -5,
                  "index %d: out-parameters written by a failing call", (int)bad[i]);
    }
    check_error("info plan NULL", kf_rnn_weight_info(NULL, 0, &name, &nd, sh),
                KF_ERR_INVALID_ARGUMENT, KF_OK, "kf_rnn_weight_info", "plan");
    cr_assert_eq(kf_rnn_weight_info(plan, 7, &name, &nd, sh), KF_OK);
    cr_expect_str_eq(name, "bias_hh_l1");
    cr_expect_str_eq(kf_last_error_message(), "");
    kf_rnn_plan_destroy(plan);
    kf_context_destroy(ctx);
}

Test(rnn_errors, workspace_size) {
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 0);
    kf_rnn_desc d = valid_desc();
    kf_rnn_plan *plan = NULL;
    cr_assert(kf_rnn_plan_create(ctx, &d, &plan) == KF_OK);
    const struct { int64_t T, B; int mode; const char *tok; } cases[] = {
        {0, 4, KF_MODE_TRAINING, "T"},
        {-1, 4, KF_MODE_TRAINING, "T"},
        {4, 0, KF_MODE_INFERENCE, "B"},
        {4, -9, KF_MODE_INFERENCE, "B"},
        {INT64_MAX / 2, 4, KF_MODE_TRAINING, "T|B"},
        {4, INT64_MAX, KF_MODE_INFERENCE, "T|B"},
        {INT64_MAX, INT64_MAX, KF_MODE_TRAINING, "T|B"},
        {INT64_MIN, 4, KF_MODE_TRAINING, "T"},
        {4, 4, 0, "mode"},
        {4, 4, 7, "mode"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        size_t ws = 777, rs = 777;
        kf_status s = kf_rnn_workspace_size(plan, cases[i].T, cases[i].B, (kf_mode)cases[i].mode,
                                            &ws, &rs);
        char what[96];
        snprintf(what, sizeof what, "T=%lld B=%lld mode=%d", (long long)cases[i].T,
                 (long long)cases[i].B, cases[i].mode);
        check_error(what, s, KF_ERR_INVALID_ARGUMENT, KF_OK, "kf_rnn_workspace_size",
                    cases[i].tok);
        cr_expect(ws == 777 && rs == 777, "%s: sizes written by a failing call", what);
    }
    size_t ws = 777;
    check_error("plan NULL", kf_rnn_workspace_size(NULL, 4, 4, KF_MODE_TRAINING, &ws, NULL),
                KF_ERR_INVALID_ARGUMENT, KF_OK, "kf_rnn_workspace_size", "plan");
    cr_expect(ws == 777);
    size_t rs = 777;
    cr_assert_eq(kf_rnn_workspace_size(plan, 4, 4, KF_MODE_INFERENCE, NULL, &rs), KF_OK);
    cr_expect_eq(rs, 0, "inference reserve_bytes = %zu, expected 0", rs);
    cr_assert_eq(kf_rnn_workspace_size(plan, 4, 4, KF_MODE_TRAINING, NULL, NULL), KF_OK);
    cr_expect_str_eq(kf_last_error_message(), "");
    kf_rnn_plan_destroy(plan);
    kf_context_destroy(ctx);
}

/* A fixed arena that is too small: the status and message, and untouched outputs. */
Test(rnn_errors, fixed_arena_too_small) {
    kf_context_desc cd;
    kf_context_desc_init(&cd);
    cd.flags = KF_CONTEXT_FIXED_ARENA;
    kf_context *ctx = NULL;
    cr_assert(kf_context_create(&cd, &ctx) == KF_OK, "%s", kf_last_error_message());
    fx f;
    ref_rnn_cfg c = gru_cfg();
    fx_make(&f, c); /* its own context; we only borrow its buffers and args */
    kf_rnn_desc d;
    kf_rnn_desc_init(&d);
    d.num_layers = c.L;
    d.input_size = c.I;
    d.hidden_size = c.H;
    d.flags = KF_RNN_BIDIRECTIONAL;
    kf_rnn_plan *plan = NULL;
    cr_assert(kf_rnn_plan_create(ctx, &d, &plan) == KF_OK);
    size_t ws = 0;
    cr_assert(kf_rnn_workspace_size(plan, c.T, c.B, KF_MODE_INFERENCE, &ws, NULL) == KF_OK);
    if (ws == 0) cr_skip_test("inference needs no workspace at this shape");
    sentinels(&f);
    kf_status s = kf_rnn_forward(plan, KF_MODE_INFERENCE, &f.fa, NULL, 0, NULL, 0);
    check_error("fixed arena", s, KF_ERR_WORKSPACE_TOO_SMALL, KF_OK, "kf_rnn_forward",
                "arena|workspace|kf_context_reserve");
    check_untouched(&f, "fixed arena");
    kf_rnn_plan_destroy(plan);
    kf_context_destroy(ctx);
    fx_free(&f);
}

/* Handles from a context must stay usable with NULL-tolerant destroy calls. */
Test(rnn_errors, destroy_null) {
    kf_rnn_plan_destroy(NULL);
    kf_context_destroy(NULL);
}

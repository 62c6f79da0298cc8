/* IEEE robustness of the recurrent layers (issue 8; behaviour documented in docs/robustness.md):
 * inputs with huge magnitudes (1e30, FLT_MAX), denormals, NaN and Inf give a status (never a
 * crash or hang: Criterion's timeout), never touch other samples (bit-identical to the clean run),
 * never change steps before the poisoned one, and NaN propagates as IEEE arithmetic would
 * (torch.nn.GRU gives NaN there): a NaN in x[t, b] makes y[t', b] and hn[., b] NaN for t' >= t;
 * a NaN in a weight makes every output NaN; a NaN in dy[t, b] makes dx[t', b] NaN for t' <= t. */
#include <criterion/criterion.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kfuse.h"

#define T 5
#define B 3
#define I 3
#define H 4
#define MAXW 10

typedef struct run {
    float x[T * B * I], h0[B * H], y[T * B * H], hn[B * H];
    float dy[T * B * H], dx[T * B * I], dh0[B * H];
    float w[MAXW][3 * H * H + 3 * H * I];
    kf_status fs, bs;
} run;

static void fill(run *r, int cell) {
    (void)cell;
    for (int i = 0; i < T * B * I; i++) r->x[i] = 0.8f * sinf(0.7f * (float)i + 0.3f);
    for (int i = 0; i < B * H; i++) r->h0[i] = 0.4f * cosf(1.3f * (float)i);
    for (int i = 0; i < T * B * H; i++) r->dy[i] = 0.5f * cosf(0.9f * (float)i + 1.0f);
    for (int k = 0; k < MAXW; k++)
        for (int i = 0; i < 3 * H * H + 3 * H * I; i++)
            r->w[k][i] = 0.4f * sinf(0.37f * (float)(i + 31 * k) + 0.1f);
}

/* forward (training) + backward on `r` with a fresh context and plan */
static void exec(run *r, int cell) {
    kf_context_desc cd;
    kf_context_desc_init(&cd);
    cd.num_threads = 1;
    kf_context *ctx;
    cr_assert_eq(kf_context_create(&cd, &ctx), KF_OK);
    kf_rnn_desc d;
    kf_rnn_desc_init(&d);
    d.cell = cell, d.input_size = I, d.hidden_size = H;
    kf_rnn_plan *p;
    cr_assert_eq(kf_rnn_plan_create(ctx, &d, &p), KF_OK);
    int32_t nw;
    cr_assert_eq(kf_rnn_weight_count(p, &nw), KF_OK);
    kf_tensor wt[MAXW];
    for (int k = 0; k < nw; k++) {
        int32_t nd;
        int64_t sh[KF_MAX_DIMS];
        cr_assert_eq(kf_rnn_weight_info(p, k, NULL, &nd, sh), KF_OK);
        kf_tensor_init(&wt[k], r->w[k], KF_DTYPE_F32, nd, sh);
    }
    size_t ws, rs;
    cr_assert_eq(kf_rnn_workspace_size(p, T, B, KF_MODE_TRAINING, &ws, &rs), KF_OK);
    void *reserve = aligned_alloc(64, (rs + 63) / 64 * 64);
    int64_t xs[3] = {T, B, I}, ys[3] = {T, B, H}, hs[3] = {1, B, H};
    kf_rnn_forward_args fa;
    kf_rnn_forward_args_init(&fa);
    kf_tensor_init(&fa.x, r->x, KF_DTYPE_F32, 3, xs);
    kf_tensor_init(&fa.h0, r->h0, KF_DTYPE_F32, 3, hs);
    kf_tensor_init(&fa.y, r->y, KF_DTYPE_F32, 3, ys);
    kf_tensor_init(&fa.hn, r->hn, KF_DTYPE_F32, 3, hs);
    fa.weights = wt, fa.num_weights = nw;
    r->fs = kf_rnn_forward(p, KF_MODE_TRAINING, &fa, NULL, 0, reserve, rs);
    kf_rnn_backward_args ba;
    kf_rnn_backward_args_init(&ba);
    ba.x = fa.x, ba.h0 = fa.h0, ba.weights = wt, ba.num_weights = nw;
    kf_tensor_init(&ba.dy, r->dy, KF_DTYPE_F32, 3, ys);
    kf_tensor_init(&ba.dx, r->dx, KF_DTYPE_F32, 3, xs);
    kf_tensor_init(&ba.dh0, r->dh0, KF_DTYPE_F32, 3, hs);
    r->bs = r->fs == KF_OK ? kf_rnn_backward(p, KF_GRAD_OVERWRITE, &ba, NULL, 0, reserve, rs)
                           : r->fs;
    free(reserve);
    kf_rnn_plan_destroy(p);
    kf_context_destroy(ctx);
}

static bool same(float a, float b) { return memcmp(&a, &b, 4) == 0; }

/* Samples other than `b0` bit-identical to the clean run; steps t < t0 of b0 identical too. */
static void check_isolation(const run *c, const run *r, int t0, int b0) {
    for (int t = 0; t < T; t++)
        for (int b = 0; b < B; b++)
            for (int j = 0; j < H; j++) {
                int i = (t * B + b) * H + j;
                if (b != b0 || t < t0)
                    cr_expect(same(r->y[i], c->y[i]), "y[%d,%d,%d] = %g changed (clean %g)", t, b,
                              j, r->y[i], c->y[i]);
            }
    for (int b = 0; b < B; b++)
        for (int j = 0; j < H; j++)
            if (b != b0) {
                cr_expect(same(r->hn[b * H + j], c->hn[b * H + j]), "hn[%d,%d] changed", b, j);
                cr_expect(same(r->dh0[b * H + j], c->dh0[b * H + j]), "dh0[%d,%d] changed", b, j);
            }
    for (int t = 0; t < T; t++)
        for (int b = 0; b < B; b++)
            if (b != b0)
                for (int j = 0; j < I; j++)
                    cr_expect(same(r->dx[(t * B + b) * I + j], c->dx[(t * B + b) * I + j]),
                              "dx[%d,%d,%d] changed", t, b, j);
}

static void poison_x(int cell, float v, bool expect_nan) {
    run *c = calloc(1, sizeof *c), *r = calloc(1, sizeof *r);
    fill(c, cell);
    exec(c, cell);
    cr_assert_eq(c->fs, KF_OK);
    cr_assert_eq(c->bs, KF_OK);
    const int t0 = 2, b0 = 1;
    fill(r, cell);
    r->x[(t0 * B + b0) * I + 1] = v;
    exec(r, cell);
    cr_assert_eq(r->fs, KF_OK, "forward with x = %g: %s", v, kf_last_error_message());
    cr_assert_eq(r->bs, KF_OK, "backward with x = %g: %s", v, kf_last_error_message());
    check_isolation(c, r, t0, b0);
    if (expect_nan) {
        for (int t = t0; t < T; t++)
            for (int j = 0; j < H; j++)
                cr_expect(isnan(r->y[(t * B + b0) * H + j]),
                          "cell %d: NaN in x[%d,%d] but y[%d,%d,%d] = %g (IEEE: NaN)", cell, t0, b0,
                          t, b0, j, r->y[(t * B + b0) * H + j]);
        for (int j = 0; j < H; j++)
            cr_expect(isnan(r->hn[b0 * H + j]), "cell %d: hn[%d,%d] = %g, expected NaN", cell, b0,
                      j, r->hn[b0 * H + j]);
    } else {
        for (int i = 0; i < T * B * H; i++)
            cr_expect(!isnan(r->y[i]), "cell %d: x = %g gave y[%d] = NaN", cell, v, i);
    }
    free(c), free(r);
}

/* Large magnitudes: the activations saturate; no NaN appears (the projections stay finite for
 * 1e30; FLT_MAX * weights overflows to +-Inf, which sigmoid/tanh map to their limits). */
Test(numerics_ieee, gru_large_inputs) { poison_x(KF_RNN_GRU, 1e30f, false); }
Test(numerics_ieee, agru_large_inputs) { poison_x(KF_RNN_AGRU, 1e30f, false); }
Test(numerics_ieee, gru_flt_max) { poison_x(KF_RNN_GRU, FLT_MAX, false); }
Test(numerics_ieee, gru_inf) { poison_x(KF_RNN_GRU, INFINITY, false); }
Test(numerics_ieee, agru_minus_inf) { poison_x(KF_RNN_AGRU, -INFINITY, false); }
Test(numerics_ieee, gru_denormal) { poison_x(KF_RNN_GRU, 1e-40f, false); }
Test(numerics_ieee, agru_denormal) { poison_x(KF_RNN_AGRU, -1e-42f, false); }

/* NaN propagates through time within its sample, and only there. */
Test(numerics_ieee, gru_nan_propagates_in_its_sample) { poison_x(KF_RNN_GRU, NAN, true); }
Test(numerics_ieee, agru_nan_propagates_in_its_sample) { poison_x(KF_RNN_AGRU, NAN, true); }

/* Denormal weights and states everywhere: finite results, no trap, no hang. */
Test(numerics_ieee, denormal_everything) {
    for (int cell = 1; cell <= 2; cell++) {
        run *r = calloc(1, sizeof *r);
        fill(r, cell);
        for (int i = 0; i < T * B * I; i++) r->x[i] *= 1e-39f;
        for (int i = 0; i < B * H; i++) r->h0[i] *= 1e-39f;
        for (int k = 0; k < MAXW; k++)
            for (int i = 0; i < 3 * H * H + 3 * H * I; i++) r->w[k][i] *= 1e-39f;
        exec(r, cell);
        cr_assert_eq(r->fs, KF_OK);
        cr_assert_eq(r->bs, KF_OK);
        for (int i = 0; i < T * B * H; i++) cr_expect(isfinite(r->y[i]));
        for (int i = 0; i < T * B * I; i++) cr_expect(isfinite(r->dx[i]));
        free(r);
    }
}

/* A NaN input weight of hidden unit 0 (weight_ih_l0[0, 0] feeds the GRU's r gate, W_z.weight[0, 0]
 * the A-GRU's z gate) makes unit 0 of every sample NaN at the first step, and from the second step
 * on the recurrent product spreads it to every unit: exactly what IEEE arithmetic (and torch) give. */
Test(numerics_ieee, nan_weight_poisons_all) {
    for (int cell = 1; cell <= 2; cell++) {
        run *r = calloc(1, sizeof *r);
        fill(r, cell);
        r->w[0][0] = NAN; /* weight_ih_l0 / W_z.weight [0, 0] */
        exec(r, cell);
        cr_assert_eq(r->fs, KF_OK);
        cr_assert_eq(r->bs, KF_OK);
        for (int b = 0; b < B; b++)
            for (int j = 0; j < H; j++)
                cr_expect_eq(isnan(r->y[b * H + j]) != 0, j == 0,
                             "cell %d: y[0, %d, %d] = %g at the first step", cell, b, j,
                             (double)r->y[b * H + j]);
        int nan_count = 0;
        for (int i = B * H; i < T * B * H; i++) nan_count += isnan(r->y[i]) != 0;
        cr_expect_eq(nan_count, (T - 1) * B * H, "cell %d: %d of %d later outputs NaN", cell,
                     nan_count, (T - 1) * B * H);
        free(r);
    }
}

/* A NaN in dy[t0, b0] flows back to dx[t, b0] for t <= t0 and leaves other samples alone. */
Test(numerics_ieee, nan_dy_propagates_backward_in_its_sample) {
    for (int cell = 1; cell <= 2; cell++) {
        run *c = calloc(1, sizeof *c), *r = calloc(1, sizeof *r);
        fill(c, cell);
        exec(c, cell);
        fill(r, cell);
        const int t0 = 3, b0 = 2;
        r->dy[(t0 * B + b0) * H] = NAN;
        exec(r, cell);
        cr_assert_eq(r->bs, KF_OK);
        for (int t = 0; t < T; t++)
            for (int b = 0; b < B; b++)
                for (int j = 0; j < I; j++) {
                    int i = (t * B + b) * I + j;
                    if (b != b0 || t > t0)
                        cr_expect(same(r->dx[i], c->dx[i]), "cell %d: dx[%d,%d,%d] changed", cell,
                                  t, b, j);
                    else
                        cr_expect(isnan(r->dx[i]), "cell %d: dx[%d,%d,%d] = %g, expected NaN",
                                  cell, t, b, j, r->dx[i]);
                }
        free(c), free(r);
    }
}

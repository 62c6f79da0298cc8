/* Numerics of kf_rnn_forward / kf_rnn_backward (GRU and A-GRU) on the CPU backend, through the
 * public header only, against the independent float64 reference of ref_rnn.c.
 *
 * How correctness is shown (DESIGN.md): fresh seeded random inputs (never zeros), weights
 * U(-1/sqrt(H), 1/sqrt(H)); every output poisoned with NaN before a call; relative error
 * ||out - ref|| / ||ref|| < 1e-5 for y, hn, dx, dh0 and the weight gradients together (each
 * weight gradient alone too, unless the reference's own float32 run shows rounding alone exceeds
 * that there, e.g. d epsilon when its sum cancels: then 4x that float32 error); the reference's
 * own backward validated by central finite differences of its float64 forward (so library-vs-
 * reference gradients plus FD-vs-reference together prove the library's gradients); long
 * sequences (T = 200) bounded by 4x the error of the reference's own float32 run against
 * float64, measured in the same test; repeated calls bit-identical (a data race shows at once).
 * The reference itself was also checked once against torch.nn.GRU (packed sequences,
 * bidirectional, 3 layers, batch_first) and an autograd A-GRU in float64: agreement ~1e-15. */
#define _POSIX_C_SOURCE 200809L

#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kfuse.h"
#include "kf_test.h"
#include "ref_rnn.h"

#define TOL 1e-5

/* ---- small utilities ------------------------------------------------------------------- */
static float *falloc(int64_t n) { return xalloc((size_t)(n > 0 ? n : 1) * sizeof(float)); }

/* ---- a problem: configuration, inputs, weights in float32 and float64 ---------------------- */
typedef struct prob {
    ref_rnn_cfg c;
    int nw;
    float *x, *h0;        /* h0 NULL = absent */
    int32_t *len;         /* NULL = absent */
    float **w;
    float *dy, *dhn;      /* upstream gradients for backward */
    double *xd, *h0d, **wd, *dyd, *dhnd;
} prob;

static void prob_make(prob *p, const ref_rnn_cfg *c, uint64_t seed, int with_h0,
                      const int32_t *lengths) {
    memset(p, 0, sizeof *p);
    p->c = *c;
    p->nw = ref_rnn_num_weights(c);
    ref_rng r;
    ref_rng_seed(&r, seed);
    int64_t nx = ref_rnn_x_numel(c), ny = ref_rnn_y_numel(c), nh = ref_rnn_h_numel(c);
    p->x = falloc(nx);
    ref_fill_uniform_f32(&r, p->x, nx, -1.0, 1.0);
    if (with_h0) {
        p->h0 = falloc(nh);
        ref_fill_uniform_f32(&r, p->h0, nh, -0.8, 0.8);
    }
    if (lengths) {
        p->len = xalloc((size_t)c->B * sizeof(int32_t));
        memcpy(p->len, lengths, (size_t)c->B * sizeof(int32_t));
    }
    double k = 1.0 / sqrt((double)c->H);
    p->w = calloc((size_t)p->nw, sizeof *p->w);
    p->wd = calloc((size_t)p->nw, sizeof *p->wd);
    for (int i = 0; i < p->nw; ++i) {
        char name[64];
        int64_t n = ref_rnn_weight_desc(c, i, name, sizeof name, NULL, NULL);
        p->w[i] = falloc(n);
        if (strstr(name, "epsilon")) /* learnable step size, default 1: a realistic spread */
            ref_fill_uniform_f32(&r, p->w[i], n, 0.5, 1.5);
        else
            ref_fill_uniform_f32(&r, p->w[i], n, -k, k);
        p->wd[i] = ref_to_f64(p->w[i], n);
    }
    p->dy = falloc(ny);
    ref_fill_uniform_f32(&r, p->dy, ny, -1.0, 1.0);
    p->dhn = falloc(nh);
    ref_fill_uniform_f32(&r, p->dhn, nh, -1.0, 1.0);
    p->xd = ref_to_f64(p->x, nx);
    p->h0d = ref_to_f64(p->h0, nh);
    p->dyd = ref_to_f64(p->dy, ny);
    p->dhnd = ref_to_f64(p->dhn, nh);
}

static void prob_free(prob *p) {
    for (int i = 0; i < p->nw; ++i) { free(p->w[i]); free(p->wd[i]); }
    free(p->w); free(p->wd);
    free(p->x); free(p->h0); free(p->len); free(p->dy); free(p->dhn);
    free(p->xd); free(p->h0d); free(p->dyd); free(p->dhnd);
}

/* ---- the library side --------------------------------------------------------------------- */
typedef struct lib {
    kf_context *ctx;
    kf_rnn_plan *plan;
    kf_tensor *wt;
} lib;

static kf_rnn_plan *make_plan(kf_context *ctx, const ref_rnn_cfg *c) {
    kf_rnn_desc d;
    kf_rnn_desc_init(&d);
    d.cell = c->cell == REF_GRU ? KF_RNN_GRU : KF_RNN_AGRU;
    d.num_layers = c->L;
    d.input_size = c->I;
    d.hidden_size = c->H;
    d.flags = (c->batch_first ? KF_RNN_BATCH_FIRST : 0u) | (c->D == 2 ? KF_RNN_BIDIRECTIONAL : 0u);
    d.dropout = c->dropout;
    d.gamma = c->gamma;
    kf_rnn_plan *plan = NULL;
    kf_status s = kf_rnn_plan_create(ctx, &d, &plan);
    cr_assert(s == KF_OK && plan != NULL, "kf_rnn_plan_create: %s (%s)", kf_status_string(s),
              kf_last_error_message());
    return plan;
}

/* Builds the weight tensors from kf_rnn_weight_count / kf_rnn_weight_info, checking both against
 * the reference's names and shapes. */
static kf_tensor *weight_tensors(kf_rnn_plan *plan, const ref_rnn_cfg *c, float *const *w) {
    int32_t count = -1;
    kf_status s = kf_rnn_weight_count(plan, &count);
    cr_assert(s == KF_OK, "kf_rnn_weight_count: %s", kf_last_error_message());
    cr_assert(count == ref_rnn_num_weights(c), "weight count %d, expected %d", (int)count,
              ref_rnn_num_weights(c));
    kf_tensor *t = calloc((size_t)count, sizeof *t);
    for (int32_t i = 0; i < count; ++i) {
        char ename[64];
        int endim;
        int64_t eshape[2];
        ref_rnn_weight_desc(c, i, ename, sizeof ename, &endim, eshape);
        const char *name = NULL;
        int32_t ndim = -1;
        int64_t shape[KF_MAX_DIMS] = {-7, -7, -7, -7, -7, -7};
        s = kf_rnn_weight_info(plan, i, &name, &ndim, shape);
        cr_assert(s == KF_OK, "kf_rnn_weight_info(%d): %s", (int)i, kf_last_error_message());
        cr_assert(name != NULL && strcmp(name, ename) == 0, "weight %d named '%s', expected '%s'",
                  (int)i, name ? name : "(null)", ename);
        cr_assert(ndim == endim, "weight %d (%s) ndim %d, expected %d", (int)i, ename, (int)ndim,
                  endim);
        for (int k = 0; k < endim; ++k)
            cr_assert(shape[k] == eshape[k], "weight %d (%s) shape[%d] = %lld, expected %lld",
                      (int)i, ename, k, (long long)shape[k], (long long)eshape[k]);
        s = kf_tensor_init(&t[i], w ? w[i] : NULL, KF_DTYPE_F32, ndim, shape);
        cr_assert(s == KF_OK, "kf_tensor_init: %s", kf_last_error_message());
    }
    return t;
}

static void lib_make(lib *k, const prob *p, int32_t num_threads) {
    k->ctx = make_ctx(KF_DEVICE_CPU, num_threads);
    k->plan = make_plan(k->ctx, &p->c);
    k->wt = weight_tensors(k->plan, &p->c, p->w);
}

static void lib_free(lib *k) {
    free(k->wt);
    kf_rnn_plan_destroy(k->plan);
    kf_context_destroy(k->ctx);
}

static void seq_shape(const ref_rnn_cfg *c, int64_t width, int64_t *shape) {
    shape[0] = c->batch_first ? c->B : c->T;
    shape[1] = c->batch_first ? c->T : c->B;
    shape[2] = width;
}

typedef struct bufs { void *ws; size_t ws_bytes; void *rs; size_t rs_bytes; } bufs;

/* Sizes and (optionally) a caller workspace; the reserve always comes from the caller. */
static bufs make_bufs(const lib *k, const ref_rnn_cfg *c, kf_mode mode, int caller_ws) {
    bufs b = {0};
    size_t ws = 0, rs = 0;
    kf_status s = kf_rnn_workspace_size(k->plan, c->T, c->B, mode, &ws, &rs);
    cr_assert(s == KF_OK, "kf_rnn_workspace_size: %s", kf_last_error_message());
    if (mode == KF_MODE_INFERENCE) cr_assert(rs == 0, "inference reserve_bytes = %zu", rs);
    if (caller_ws && ws > 0) { b.ws = xalloc(ws); b.ws_bytes = ws; }
    if (rs > 0) { b.rs = xalloc(rs); b.rs_bytes = rs; }
    return b;
}

static void free_bufs(bufs *b) { free(b->ws); free(b->rs); }

/* Runs the library's forward (y, hn poisoned first; hn NULL = not requested). */
static void lib_forward(const lib *k, const prob *p, kf_mode mode, bufs *b, float *y, float *hn) {
    const ref_rnn_cfg *c = &p->c;
    int64_t xs[3], ys[3], hs[3] = {(int64_t)c->L * c->D, c->B, c->H}, ls[1] = {c->B};
    seq_shape(c, c->I, xs);
    seq_shape(c, (int64_t)c->D * c->H, ys);
    poison(y, ref_rnn_y_numel(c));
    if (hn) poison(hn, ref_rnn_h_numel(c));
    kf_rnn_forward_args a;
    kf_rnn_forward_args_init(&a);
    a.x = tens(p->x, KF_DTYPE_F32, 3, xs);
    a.h0 = tens(p->h0, KF_DTYPE_F32, 3, hs);
    a.weights = k->wt;
    a.num_weights = p->nw;
    a.lengths = tens(p->len, KF_DTYPE_I32, 1, ls);
    a.dropout_seed = c->seed;
    a.dropout_offset = c->offset;
    a.y = tens(y, KF_DTYPE_F32, 3, ys);
    a.hn = tens(hn, KF_DTYPE_F32, 3, hs);
    kf_status s = kf_rnn_forward(k->plan, mode, &a, b->ws, b->ws_bytes,
                                 mode == KF_MODE_TRAINING ? b->rs : NULL,
                                 mode == KF_MODE_TRAINING ? b->rs_bytes : 0);
    cr_assert(s == KF_OK, "kf_rnn_forward: %s (%s)", kf_status_string(s), kf_last_error_message());
    cr_assert(strcmp(kf_last_error_message(), "") == 0, "message after success: '%s'",
              kf_last_error_message());
}

/* Runs the library's backward. dw: NULL, or num_weights pointers each of which may be NULL. */
static void lib_backward(const lib *k, const prob *p, kf_grad_mode gm, bufs *b, int with_dy,
                         int with_dhn, float *dx, float *dh0, float *const *dw) {
    const ref_rnn_cfg *c = &p->c;
    int64_t xs[3], ys[3], hs[3] = {(int64_t)c->L * c->D, c->B, c->H}, ls[1] = {c->B};
    seq_shape(c, c->I, xs);
    seq_shape(c, (int64_t)c->D * c->H, ys);
    kf_tensor *dwt = NULL;
    if (dw) {
        dwt = calloc((size_t)p->nw, sizeof *dwt);
        for (int i = 0; i < p->nw; ++i) {
            dwt[i] = k->wt[i];
            dwt[i].data = dw[i];
        }
    }
    kf_rnn_backward_args a;
    kf_rnn_backward_args_init(&a);
    a.x = tens(p->x, KF_DTYPE_F32, 3, xs);
    a.h0 = tens(p->h0, KF_DTYPE_F32, 3, hs);
    a.weights = k->wt;
    a.num_weights = p->nw;
    a.lengths = tens(p->len, KF_DTYPE_I32, 1, ls);
    a.dropout_seed = c->seed;
    a.dropout_offset = c->offset;
    a.dy = tens(with_dy ? p->dy : NULL, KF_DTYPE_F32, 3, ys);
    a.dhn = tens(with_dhn ? p->dhn : NULL, KF_DTYPE_F32, 3, hs);
    a.dx = tens(dx, KF_DTYPE_F32, 3, xs);
    a.dh0 = tens(dh0, KF_DTYPE_F32, 3, hs);
    a.dweights = dwt;
    a.num_dweights = dw ? p->nw : 0;
    kf_status s = kf_rnn_backward(k->plan, gm, &a, b->ws, b->ws_bytes, b->rs, b->rs_bytes);
    cr_assert(s == KF_OK, "kf_rnn_backward: %s (%s)", kf_status_string(s),
              kf_last_error_message());
    cr_assert(strcmp(kf_last_error_message(), "") == 0, "message after success: '%s'",
              kf_last_error_message());
    free(dwt);
}

/* ---- comparisons -------------------------------------------------------------------------- */
static void expect_close(const char *label, const char *what, const float *out, const double *ref,
                         int64_t n) {
    double e = ref_rel_err_f32(out, ref, n);
    cr_expect(e < TOL, "%s: %s rel err %.3e >= %.0e", label, what, e, TOL);
}

/* y at t >= len[b] must be exactly 0 (torch's padded output). */
static void expect_padding_zero(const char *label, const prob *p, const float *y) {
    const ref_rnn_cfg *c = &p->c;
    if (!p->len) return;
    int64_t DH = (int64_t)c->D * c->H;
    for (int64_t b = 0; b < c->B; ++b)
        for (int64_t t = p->len[b]; t < c->T; ++t) {
            int64_t row = c->batch_first ? b * c->T + t : t * c->B + b;
            for (int64_t j = 0; j < DH; ++j)
                cr_expect(y[row * DH + j] == 0.0f, "%s: y(t=%lld, b=%lld, %lld) = %g past len %d",
                          label, (long long)t, (long long)b, (long long)j,
                          (double)y[row * DH + j], p->len[b]);
        }
}

/* ---- one full case: inference forward, training forward, backward ------------------------- */
typedef struct opts {
    int h0;                  /* pass h0 */
    const int32_t *lengths;  /* NULL = absent */
    int no_hn;               /* do not request hn */
    int caller_ws;           /* caller workspace instead of the arena */
    int no_dy, no_dhn;       /* leave dy / dhn absent */
    int accumulate;          /* KF_GRAD_ACCUMULATE into prefilled buffers */
    int no_dx, no_dh0;       /* leave dx / dh0 absent */
    int dw_mode;             /* 0 all dweights, 1 none (NULL array), 2 every other one absent */
    int32_t num_threads;
    uint64_t seed;
    float saturate;          /* A-GRU: every gate's bias shifted by this (saturate_gates) */
} opts;

/* An A-GRU whose gates saturate (z, r -> 1, |d| -> 1): every bias shifted by `by`. The backward's
 * z (1 - z), r (1 - r) and 1 - d^2 then lie below what float32 resolves from z, r and d
 * themselves (by 12: 1 - z ~ 6e-6, a hundred spacings of z below 1; 1 - d^2 ~ 1e-10, d rounds to
 * 1), so they must come from the pre-activations (cpu/rnn_cpu.h, kf__vf_sigmoid_c); taken from
 * the rounded gates they were a percent off, or zero. */
static void saturate_gates(prob *p, float by) {
    for (int i = 0; i < p->nw; ++i) {
        char name[64];
        const int64_t n = ref_rnn_weight_desc(&p->c, i, name, sizeof name, NULL, NULL);
        if (!strstr(name, ".bias")) continue;
        for (int64_t j = 0; j < n; ++j) p->w[i][j] += by, p->wd[i][j] = p->w[i][j];
    }
}

static void run_case(const char *label, const ref_rnn_cfg *cfg, const opts *o) {
    prob p;
    prob_make(&p, cfg, o->seed ? o->seed : 0xC0FFEE, o->h0, o->lengths);
    if (o->saturate) saturate_gates(&p, o->saturate);
    lib k;
    lib_make(&k, &p, o->num_threads);
    const ref_rnn_cfg *c = &p.c;
    int64_t nx = ref_rnn_x_numel(c), ny = ref_rnn_y_numel(c), nh = ref_rnn_h_numel(c);
    char lab[256];

    float *y = falloc(ny), *hn = o->no_hn ? NULL : falloc(nh);
    double *yr = malloc((size_t)ny * sizeof *yr), *hnr = malloc((size_t)nh * sizeof *hnr);

    /* Inference: never dropout. */
    {
        ref_rnn_cfg ci = *c;
        ci.training = 0;
        bufs b = make_bufs(&k, c, KF_MODE_INFERENCE, o->caller_ws);
        lib_forward(&k, &p, KF_MODE_INFERENCE, &b, y, hn);
        ref_rnn_forward_f64(&ci, p.xd, p.h0d, (const double *const *)p.wd, p.len, yr, hnr);
        snprintf(lab, sizeof lab, "%s [inference]", label);
        expect_close(lab, "y", y, yr, ny);
        if (hn) expect_close(lab, "hn", hn, hnr, nh);
        expect_padding_zero(lab, &p, y);
        free_bufs(&b);
    }

    /* Training forward then backward. */
    ref_rnn_cfg ct = *c;
    ct.training = 1;
    bufs b = make_bufs(&k, c, KF_MODE_TRAINING, o->caller_ws);
    lib_forward(&k, &p, KF_MODE_TRAINING, &b, y, hn);
    ref_rnn_forward_f64(&ct, p.xd, p.h0d, (const double *const *)p.wd, p.len, yr, hnr);
    snprintf(lab, sizeof lab, "%s [training]", label);
    expect_close(lab, "y", y, yr, ny);
    if (hn) expect_close(lab, "hn", hn, hnr, nh);
    expect_padding_zero(lab, &p, y);

    float *dx = o->no_dx ? NULL : falloc(nx), *dh0 = o->no_dh0 ? NULL : falloc(nh);
    if (dx) poison(dx, nx);
    if (dh0) poison(dh0, nh);
    float **dw = NULL, **pre = calloc((size_t)p.nw, sizeof *pre);
    double **dwr = calloc((size_t)p.nw, sizeof *dwr);
    ref_rng r;
    ref_rng_seed(&r, 99);
    if (o->dw_mode != 1) {
        dw = calloc((size_t)p.nw, sizeof *dw);
        for (int i = 0; i < p.nw; ++i) {
            if (o->dw_mode == 2 && i % 2 == 1) continue;
            int64_t n = ref_rnn_weight_desc(c, i, NULL, 0, NULL, NULL);
            dw[i] = falloc(n);
            dwr[i] = malloc((size_t)n * sizeof(double));
            if (o->accumulate) {
                pre[i] = falloc(n);
                ref_fill_uniform_f32(&r, pre[i], n, -1.0, 1.0);
                memcpy(dw[i], pre[i], (size_t)n * sizeof(float));
            } else {
                poison(dw[i], n);
            }
        }
    }
    lib_backward(&k, &p, o->accumulate ? KF_GRAD_ACCUMULATE : KF_GRAD_OVERWRITE, &b, !o->no_dy,
                 !o->no_dhn, dx, dh0, dw);

    double *dxr = malloc((size_t)nx * sizeof *dxr), *dh0r = malloc((size_t)nh * sizeof *dh0r);
    ref_rnn_backward_f64(&ct, p.xd, p.h0d, (const double *const *)p.wd, p.len,
                         o->no_dy ? NULL : p.dyd, o->no_dhn ? NULL : p.dhnd, dxr, dh0r, dwr);
    snprintf(lab, sizeof lab, "%s [backward%s]", label, o->accumulate ? ", accumulate" : "");
    if (dx) expect_close(lab, "dx", dx, dxr, nx);
    if (dh0) expect_close(lab, "dh0", dh0, dh0r, nh);
    if (dw) {
        /* The weight gradients: all of them together (one output) within 1e-5; each tensor
         * within 1e-5 too, unless the reference's own float32 run shows that rounding alone
         * exceeds it there (a short sum that cancels, e.g. d epsilon = sum g z d): then within 4x
         * that float32 error, the rule DESIGN.md gives for ill-conditioned results. */
        float **dw32 = calloc((size_t)p.nw, sizeof *dw32);
        for (int i = 0; i < p.nw; ++i)
            dw32[i] = falloc(ref_rnn_weight_desc(c, i, NULL, 0, NULL, NULL));
        ref_rnn_backward_f32(&ct, p.x, p.h0, (const float *const *)p.w, p.len,
                             o->no_dy ? NULL : p.dy, o->no_dhn ? NULL : p.dhn, NULL, NULL, dw32);
        double num_all = 0, den_all = 0;
        for (int i = 0; i < p.nw; ++i) {
            if (!dw[i]) continue;
            char name[64];
            int64_t n = ref_rnn_weight_desc(c, i, name, sizeof name, NULL, NULL);
            /* accumulate: expect pre + grad, the error relative to the gradient itself */
            double num = 0, den = 0;
            for (int64_t j = 0; j < n; ++j) {
                double want = (o->accumulate ? (double)pre[i][j] : 0.0) + dwr[i][j];
                double e = (double)dw[i][j] - want;
                num += isfinite(dw[i][j]) ? e * e : INFINITY;
                den += dwr[i][j] * dwr[i][j];
            }
            num_all += num;
            den_all += den;
            double err = den > 0 ? sqrt(num / den) : sqrt(num);
            double e32 = ref_rel_err_f32(dw32[i], dwr[i], n);
            double bound = fmax(TOL, 4 * e32);
            cr_expect(err < bound, "%s: d%s%s rel err %.3e >= %.3e (float32 reference's: %.3e)",
                      lab, name, o->accumulate ? " (accumulated)" : "", err, bound, e32);
        }
        double err_all = den_all > 0 ? sqrt(num_all / den_all) : sqrt(num_all);
        cr_expect(err_all < TOL, "%s: all weight gradients together: rel err %.3e >= %.0e", lab,
                  err_all, TOL);
        for (int i = 0; i < p.nw; ++i) free(dw32[i]);
        free(dw32);
    }

    for (int i = 0; i < p.nw; ++i) {
        if (dw) free(dw[i]);
        free(pre[i]);
        free(dwr[i]);
    }
    free(dw); free(pre); free(dwr);
    free(dx); free(dh0); free(dxr); free(dh0r);
    free(y); free(hn); free(yr); free(hnr);
    free_bufs(&b);
    lib_free(&k);
    prob_free(&p);
}

static ref_rnn_cfg gru(int L, int D, int64_t I, int64_t H, int64_t T, int64_t B) {
    ref_rnn_cfg c = {.cell = REF_GRU, .L = L, .D = D, .I = I, .H = H, .T = T, .B = B,
                     .gamma = 0.01f, .seed = 0x5EED, .offset = 0};
    return c;
}

static ref_rnn_cfg agru(int L, int64_t I, int64_t H, int64_t T, int64_t B) {
    ref_rnn_cfg c = {.cell = REF_AGRU, .L = L, .D = 1, .I = I, .H = H, .T = T, .B = B,
                     .gamma = 0.01f, .seed = 0x5EED, .offset = 0};
    return c;
}

/* ---- weight naming ------------------------------------------------------------------------ */
Test(rnn_weights, gru_names_and_shapes) {
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    ref_rnn_cfg c = gru(2, 2, 5, 7, 3, 2);
    kf_rnn_plan *plan = make_plan(ctx, &c);
    kf_tensor *t = weight_tensors(plan, &c, NULL); /* checks every index against the reference */
    int32_t count = 0;
    kf_rnn_weight_count(plan, &count);
    cr_assert_eq(count, 2 * 2 * 4, "L*D*4 = 16, got %d", (int)count);
    const struct { int idx; const char *name; int64_t s0, s1; } spots[] = {
        {0, "weight_ih_l0", 21, 5},          {1, "weight_hh_l0", 21, 7},
        {2, "bias_ih_l0", 21, 0},            {3, "bias_hh_l0", 21, 0},
        {4, "weight_ih_l0_reverse", 21, 5},  {8, "weight_ih_l1", 21, 14},
        {13, "weight_hh_l1_reverse", 21, 7}, {15, "bias_hh_l1_reverse", 21, 0},
    };
    for (size_t i = 0; i < sizeof spots / sizeof spots[0]; ++i) {
        const char *name = NULL;
        int32_t nd = 0;
        int64_t sh[KF_MAX_DIMS] = {0};
        cr_assert_eq(kf_rnn_weight_info(plan, spots[i].idx, &name, &nd, sh), KF_OK);
        cr_assert_str_eq(name, spots[i].name, "index %d", spots[i].idx);
        cr_assert_eq(nd, spots[i].s1 ? 2 : 1, "%s ndim %d", name, (int)nd);
        cr_assert_eq(sh[0], spots[i].s0, "%s shape[0] %lld", name, (long long)sh[0]);
        if (spots[i].s1)
            cr_assert_eq(sh[1], spots[i].s1, "%s shape[1] %lld", name, (long long)sh[1]);
    }
    /* Every out-parameter of kf_rnn_weight_info may be NULL. */
    cr_assert_eq(kf_rnn_weight_info(plan, 3, NULL, NULL, NULL), KF_OK);
    free(t);
    kf_rnn_plan_destroy(plan);
    kf_context_destroy(ctx);
}

Test(rnn_weights, agru_names_and_shapes) {
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    ref_rnn_cfg c = agru(2, 5, 7, 3, 2);
    kf_rnn_plan *plan = make_plan(ctx, &c);
    kf_tensor *t = weight_tensors(plan, &c, NULL);
    int32_t count = 0;
    kf_rnn_weight_count(plan, &count);
    cr_assert_eq(count, 20, "L*10 = 20, got %d", (int)count);
    const struct { int idx; const char *name; int nd; int64_t s0, s1; } spots[] = {
        {0, "cells.0.W_z.weight", 2, 7, 5}, {1, "cells.0.W_z.bias", 1, 7, 0},
        {2, "cells.0.U_z.weight", 2, 7, 7}, {6, "cells.0.V_h.weight", 2, 7, 5},
        {8, "cells.0.W_h", 2, 7, 7},        {9, "cells.0.epsilon", 1, 1, 0},
        {10, "cells.1.W_z.weight", 2, 7, 7}, {19, "cells.1.epsilon", 1, 1, 0},
    };
    for (size_t i = 0; i < sizeof spots / sizeof spots[0]; ++i) {
        const char *name = NULL;
        int32_t nd = 0;
        int64_t sh[KF_MAX_DIMS] = {0};
        cr_assert_eq(kf_rnn_weight_info(plan, spots[i].idx, &name, &nd, sh), KF_OK);
        cr_assert_str_eq(name, spots[i].name, "index %d", spots[i].idx);
        cr_assert_eq(nd, spots[i].nd, "%s ndim %d", name, (int)nd);
        cr_assert_eq(sh[0], spots[i].s0, "%s shape[0] %lld", name, (long long)sh[0]);
        if (spots[i].nd == 2) cr_assert_eq(sh[1], spots[i].s1, "%s shape[1]", name);
    }
    free(t);
    kf_rnn_plan_destroy(plan);
    kf_context_destroy(ctx);
}

/* ---- the reference validates itself ------------------------------------------------------- */
/* Central differences of the float64 forward against the reference's hand-written backward, for
 * every input and parameter, on tiny shapes covering every feature (layers, directions, lengths
 * incl. 0 and T, dropout, batch_first, h0). Loss = sum(dy * y) + sum(dhn * hn). */
static double fd_loss(const prob *p, const ref_rnn_cfg *c, double *y, double *hn) {
    ref_rnn_forward_f64(c, p->xd, p->h0d, (const double *const *)p->wd, p->len, y, hn);
    double s = 0;
    for (int64_t i = 0; i < ref_rnn_y_numel(c); ++i) s += p->dyd[i] * y[i];
    for (int64_t i = 0; i < ref_rnn_h_numel(c); ++i) s += p->dhnd[i] * hn[i];
    return s;
}

static void fd_check(const char *label, ref_rnn_cfg c, const int32_t *lengths) {
    c.training = 1;
    prob p;
    prob_make(&p, &c, 0xFD, 1, lengths);
    int64_t nx = ref_rnn_x_numel(&c), nh = ref_rnn_h_numel(&c);
    double *y = malloc((size_t)ref_rnn_y_numel(&c) * sizeof *y);
    double *hn = malloc((size_t)nh * sizeof *hn);
    double *gx = malloc((size_t)nx * sizeof *gx), *gh0 = malloc((size_t)nh * sizeof *gh0);
    double **gw = calloc((size_t)p.nw, sizeof *gw);
    for (int i = 0; i < p.nw; ++i)
        gw[i] = malloc((size_t)ref_rnn_weight_desc(&c, i, NULL, 0, NULL, NULL) * sizeof(double));
    ref_rnn_backward_f64(&c, p.xd, p.h0d, (const double *const *)p.wd, p.len, p.dyd, p.dhnd, gx,
                         gh0, gw);
    const double h = 1e-5;
    /* (array, length, name) for every differentiable input */
    int nt = 2 + p.nw;
    for (int q = 0; q < nt; ++q) {
        double *v, *g;
        int64_t n;
        char name[64];
        if (q == 0) { v = p.xd; g = gx; n = nx; snprintf(name, sizeof name, "x"); }
        else if (q == 1) { v = p.h0d; g = gh0; n = nh; snprintf(name, sizeof name, "h0"); }
        else {
            n = ref_rnn_weight_desc(&c, q - 2, name, sizeof name, NULL, NULL);
            v = p.wd[q - 2];
            g = gw[q - 2];
        }
        double *fd = malloc((size_t)n * sizeof *fd);
        for (int64_t i = 0; i < n; ++i) {
            double keep = v[i];
            v[i] = keep + h;
            double lp = fd_loss(&p, &c, y, hn);
            v[i] = keep - h;
            double lm = fd_loss(&p, &c, y, hn);
            v[i] = keep;
            fd[i] = (lp - lm) / (2 * h);
        }
        double e = ref_rel_err_f64(g, fd, n);
        cr_expect(e < 1e-7, "%s: reference backward d%s vs central differences: rel err %.3e",
                  label, name, e);
        cr_log_info("%s: d%s vs central differences: rel err %.3e", label, name, e);
        free(fd);
    }
    for (int i = 0; i < p.nw; ++i) free(gw[i]);
    free(gw); free(gx); free(gh0); free(y); free(hn);
    prob_free(&p);
}

Test(rnn_reference, gru_backward_matches_finite_differences) {
    static const int32_t len[3] = {4, 0, 2};
    ref_rnn_cfg c = gru(2, 2, 3, 4, 4, 3);
    c.dropout = 0.3f;
    c.seed = 17;
    c.offset = 5;
    fd_check("GRU L2 D2 dropout lengths", c, len);
    ref_rnn_cfg cb = gru(2, 1, 2, 3, 3, 2);
    cb.batch_first = 1;
    fd_check("GRU L2 batch_first", cb, NULL);
}

Test(rnn_reference, agru_backward_matches_finite_differences) {
    static const int32_t len[3] = {3, 4, 0};
    ref_rnn_cfg c = agru(2, 3, 4, 4, 3);
    c.dropout = 0.3f;
    c.gamma = 0.2f;
    c.seed = 23;
    fd_check("A-GRU L2 dropout lengths", c, len);
    ref_rnn_cfg cb = agru(1, 2, 5, 3, 2);
    cb.batch_first = 1;
    fd_check("A-GRU L1 batch_first", cb, NULL);
}

/* The float32 instantiation is the same algorithm: on a short sequence it agrees with float64. */
Test(rnn_reference, f32_instantiation_agrees) {
    const ref_rnn_cfg cs[2] = {gru(2, 2, 3, 5, 4, 2), agru(2, 3, 5, 4, 2)};
    for (int q = 0; q < 2; ++q) {
        ref_rnn_cfg c = cs[q];
        c.training = 1;
        c.dropout = 0.25f;
        prob p;
        prob_make(&p, &c, 7, 1, NULL);
        int64_t ny = ref_rnn_y_numel(&c), nx = ref_rnn_x_numel(&c);
        float *y = falloc(ny), *dx = falloc(nx);
        double *yd = malloc((size_t)ny * sizeof *yd), *dxd = malloc((size_t)nx * sizeof *dxd);
        ref_rnn_forward_f32(&c, p.x, p.h0, (const float *const *)p.w, NULL, y, NULL);
        ref_rnn_forward_f64(&c, p.xd, p.h0d, (const double *const *)p.wd, NULL, yd, NULL);
        ref_rnn_backward_f32(&c, p.x, p.h0, (const float *const *)p.w, NULL, p.dy, p.dhn, dx, NULL,
                             NULL);
        ref_rnn_backward_f64(&c, p.xd, p.h0d, (const double *const *)p.wd, NULL, p.dyd, p.dhnd,
                             dxd, NULL, NULL);
        double ey = ref_rel_err_f32(y, yd, ny), ex = ref_rel_err_f32(dx, dxd, nx);
        cr_expect(ey < TOL && ex < TOL, "cell %d: f32 reference y err %.3e, dx err %.3e", c.cell,
                  ey, ex);
        free(y); free(dx); free(yd); free(dxd);
        prob_free(&p);
    }
}

/* ---- forward and backward against the reference ------------------------------------------- */
Test(rnn_numerics, gru_single_step_single_sample) {
    opts o = {.h0 = 1};
    ref_rnn_cfg c = gru(1, 1, 5, 13, 1, 1);
    run_case("GRU B=1 T=1 H=13", &c, &o);
}

Test(rnn_numerics, agru_single_step_single_sample) {
    opts o = {.h0 = 1};
    ref_rnn_cfg c = agru(1, 5, 13, 1, 1);
    run_case("A-GRU B=1 T=1 H=13", &c, &o);
}

Test(rnn_numerics, gru_three_layers) {
    opts o = {.h0 = 1};
    ref_rnn_cfg c = gru(3, 1, 6, 13, 7, 3);
    run_case("GRU L=3 H=13", &c, &o);
}

Test(rnn_numerics, agru_three_layers) {
    opts o = {.h0 = 1, .caller_ws = 1};
    ref_rnn_cfg c = agru(3, 6, 13, 7, 3);
    c.gamma = 0.1f; /* a non-default diffusion constant */
    run_case("A-GRU L=3 H=13 gamma=0.1", &c, &o);
}

Test(rnn_numerics, gru_bidirectional_two_layers) {
    opts o = {.h0 = 1};
    ref_rnn_cfg c = gru(2, 2, 5, 11, 6, 3);
    run_case("GRU L=2 bidirectional", &c, &o);
    o.caller_ws = 1;
    run_case("GRU L=2 bidirectional, caller workspace", &c, &o);
}

Test(rnn_numerics, batch_first) {
    opts o = {.h0 = 1};
    ref_rnn_cfg c = gru(2, 2, 4, 9, 5, 3);
    c.batch_first = 1;
    run_case("GRU L=2 D=2 batch_first", &c, &o);
    ref_rnn_cfg a = agru(2, 4, 9, 5, 3);
    a.batch_first = 1;
    o.caller_ws = 1;
    run_case("A-GRU L=2 batch_first", &a, &o);
}

Test(rnn_numerics, variable_lengths) {
    static const int32_t len[4] = {3, 0, 6, 1}; /* a 0 and a full length (T = 6) */
    opts o = {.h0 = 1, .lengths = len};
    ref_rnn_cfg c = gru(2, 2, 5, 10, 6, 4);
    run_case("GRU L=2 D=2 lengths", &c, &o);
    c.batch_first = 1;
    run_case("GRU L=2 D=2 lengths batch_first", &c, &o);
    ref_rnn_cfg a = agru(2, 5, 10, 6, 4);
    run_case("A-GRU L=2 lengths", &a, &o);
    o.h0 = 0;
    o.caller_ws = 1;
    run_case("A-GRU L=2 lengths, no h0", &a, &o);
}

/* hn of a length-0 sample is its h0, and y is all zero for it. */
Test(rnn_numerics, zero_length_sample_keeps_h0) {
    static const int32_t len[2] = {0, 3};
    ref_rnn_cfg cs[2] = {gru(2, 2, 3, 6, 3, 2), agru(2, 3, 6, 3, 2)};
    for (int q = 0; q < 2; ++q) {
        prob p;
        prob_make(&p, &cs[q], 31, 1, len);
        lib k;
        lib_make(&k, &p, 0);
        int64_t ny = ref_rnn_y_numel(&p.c), nh = ref_rnn_h_numel(&p.c);
        float *y = falloc(ny), *hn = falloc(nh);
        bufs b = make_bufs(&k, &p.c, KF_MODE_INFERENCE, 0);
        lib_forward(&k, &p, KF_MODE_INFERENCE, &b, y, hn);
        for (int g = 0; g < p.c.L * p.c.D; ++g)
            for (int64_t j = 0; j < p.c.H; ++j) {
                int64_t i = ((int64_t)g * p.c.B + 0) * p.c.H + j;
                cr_expect(hn[i] == p.h0[i],
                          "cell %d group %d: hn %g != h0 %g for a length-0 sample",
                          p.c.cell, g, (double)hn[i], (double)p.h0[i]);
            }
        expect_padding_zero("length 0", &p, y);
        free(y); free(hn);
        free_bufs(&b);
        lib_free(&k);
        prob_free(&p);
    }
}

Test(rnn_numerics, dropout_training) {
    opts o = {.h0 = 1};
    ref_rnn_cfg c = gru(2, 2, 5, 10, 5, 3);
    c.dropout = 0.3f;
    c.seed = 0x1234ABCDull;
    c.offset = 777;
    run_case("GRU L=2 D=2 dropout 0.3", &c, &o);
    ref_rnn_cfg a = agru(3, 5, 10, 5, 3);
    a.dropout = 0.3f;
    a.seed = 42;
    a.offset = 1ull << 40;
    o.caller_ws = 1;
    run_case("A-GRU L=3 dropout 0.3", &a, &o);
    static const int32_t len[3] = {5, 2, 0};
    o.lengths = len;
    run_case("A-GRU L=3 dropout 0.3 lengths", &a, &o);
    c.batch_first = 1;
    run_case("GRU L=2 D=2 dropout 0.3 lengths batch_first", &c, &o);
}

/* The mask depends on (seed, offset): another offset gives another y in training. */
Test(rnn_numerics, dropout_offset_draws_fresh_masks) {
    ref_rnn_cfg c = gru(2, 1, 4, 8, 4, 2);
    c.dropout = 0.5f;
    c.seed = 9;
    prob p;
    prob_make(&p, &c, 3, 1, NULL);
    lib k;
    lib_make(&k, &p, 0);
    int64_t ny = ref_rnn_y_numel(&c);
    float *y1 = falloc(ny), *y2 = falloc(ny);
    bufs b = make_bufs(&k, &c, KF_MODE_TRAINING, 0);
    lib_forward(&k, &p, KF_MODE_TRAINING, &b, y1, NULL);
    p.c.offset = 1000003;
    lib_forward(&k, &p, KF_MODE_TRAINING, &b, y2, NULL);
    cr_expect(memcmp(y1, y2, (size_t)ny * sizeof(float)) != 0,
              "training y identical for dropout offsets 0 and 1000003");
    free(y1); free(y2);
    free_bufs(&b);
    lib_free(&k);
    prob_free(&p);
}

Test(rnn_numerics, h0_absent_and_hn_absent) {
    opts o = {.h0 = 0};
    ref_rnn_cfg c = gru(2, 2, 4, 9, 4, 2);
    run_case("GRU no h0", &c, &o);
    o.no_hn = 1;
    run_case("GRU no h0, no hn", &c, &o);
    ref_rnn_cfg a = agru(2, 4, 9, 4, 2);
    o.no_hn = 0;
    run_case("A-GRU no h0", &a, &o);
    o.h0 = 1;
    o.no_hn = 1;
    run_case("A-GRU h0, no hn", &a, &o);
}

Test(rnn_numerics, backward_accumulate) {
    static const int32_t len[3] = {4, 1, 3};
    opts o = {.h0 = 1, .accumulate = 1, .lengths = len};
    ref_rnn_cfg c = gru(2, 2, 4, 9, 4, 3);
    c.dropout = 0.3f;
    run_case("GRU accumulate", &c, &o);
    ref_rnn_cfg a = agru(2, 4, 9, 4, 3);
    a.dropout = 0.3f;
    o.caller_ws = 1;
    run_case("A-GRU accumulate", &a, &o);
}

Test(rnn_numerics, backward_absent_upstream_gradients) {
    ref_rnn_cfg cs[2] = {gru(2, 2, 4, 7, 4, 2), agru(2, 4, 7, 4, 2)};
    for (int q = 0; q < 2; ++q) {
        opts o = {.h0 = 1, .no_dy = 1};
        run_case(q ? "A-GRU dy absent" : "GRU dy absent", &cs[q], &o);
        o.no_dy = 0;
        o.no_dhn = 1;
        run_case(q ? "A-GRU dhn absent" : "GRU dhn absent", &cs[q], &o);
        o.no_dy = 1; /* both absent: every gradient is exactly zero */
        run_case(q ? "A-GRU dy, dhn absent" : "GRU dy, dhn absent", &cs[q], &o);
    }
}

Test(rnn_numerics, backward_partial_outputs) {
    ref_rnn_cfg cs[2] = {gru(2, 2, 4, 7, 4, 2), agru(2, 4, 7, 4, 2)};
    for (int q = 0; q < 2; ++q) {
        opts o = {.h0 = 1, .dw_mode = 2};
        run_case(q ? "A-GRU every other dweight absent" : "GRU every other dweight absent", &cs[q],
                 &o);
        o.dw_mode = 1;
        o.no_dh0 = 1;
        run_case(q ? "A-GRU dweights NULL, dh0 absent" : "GRU dweights NULL, dh0 absent", &cs[q],
                 &o);
        o.dw_mode = 0;
        o.no_dx = 1;
        o.no_dh0 = 0;
        run_case(q ? "A-GRU dx absent" : "GRU dx absent", &cs[q], &o);
    }
}

Test(rnn_numerics, single_thread_context) {
    static const int32_t len[3] = {5, 2, 4};
    opts o = {.h0 = 1, .num_threads = 1, .lengths = len};
    ref_rnn_cfg c = gru(2, 2, 6, 12, 5, 3);
    run_case("GRU num_threads=1", &c, &o);
    ref_rnn_cfg a = agru(2, 6, 12, 5, 3);
    run_case("A-GRU num_threads=1", &a, &o);
}

/* Bigger hidden sizes than the others, still small: tails of any vector width (H = 37). */
Test(rnn_numerics, wider_hidden) {
    static const int32_t len[5] = {9, 9, 3, 8, 1};
    opts o = {.h0 = 1, .lengths = len};
    ref_rnn_cfg c = gru(1, 2, 17, 37, 9, 5);
    run_case("GRU H=37 D=2", &c, &o);
    ref_rnn_cfg a = agru(1, 17, 37, 9, 5);
    run_case("A-GRU H=37", &a, &o);
}

/* Hidden sizes of whole micro-kernel panels (H = 32: the AVX2 and the AVX-512 kernels; 48: the
 * AVX2 ones only), where the backward sums the recurrent side's weight gradients per step and
 * slice instead of in GEMMs after the recurrence (GRU dW_hh; A-GRU dU_z, dU_r and G, whence
 * dW_h), and dW3 and dX too, by the micro-kernel where the layer input fills its tiles (layers
 * above the first; I = 28; I = 16 for dW3, and for dX on AVX2), else by plain loops (I = 1):
 * two slices, lengths, both directions, overwrite and accumulate, and some absent. */
Test(rnn_numerics, whole_panel_hidden) {
    static const int32_t len[5] = {6, 2, 6, 5, 1};
    opts o = {.h0 = 1, .lengths = len, .num_threads = 2};
    ref_rnn_cfg c = gru(2, 2, 28, 32, 6, 5); /* I = 28: dW3 and dX per step too */
    run_case("GRU H=32", &c, &o);
    ref_rnn_cfg c48 = gru(1, 1, 3, 48, 6, 5);
    o.accumulate = 1;
    run_case("GRU H=48 accumulate", &c48, &o);
    run_case("GRU H=32 accumulate", &c, &o);
    ref_rnn_cfg a = agru(2, 16, 32, 6, 5);
    run_case("A-GRU H=32 accumulate", &a, &o);
    ref_rnn_cfg c1 = gru(1, 2, 1, 32, 6, 5); /* I = 1: dW3 and dX by the thin loops */
    run_case("GRU H=32 I=1 accumulate", &c1, &o);
    o.accumulate = 0;
    run_case("A-GRU H=32", &a, &o);
    o.dw_mode = 2;
    run_case("GRU H=32 every other dweight", &c, &o);
    run_case("A-GRU H=32 every other dweight", &a, &o);
}

/* Saturated gates: the pre-activation gradients are products of a gradient with 1 - z, 1 - r or
 * 1 - d^2, each far below float32's spacing at 1, yet dX and every weight gradient stay within
 * 1e-5 of the float64 reference (tests/fuzz/corpus/fuzz_rnn/agru_h1_vanishing_dx found it). */
Test(rnn_numerics, agru_saturated_gates) {
    static const int32_t len[3] = {4, 2, 3};
    opts o = {.h0 = 1, .lengths = len, .saturate = 12.0f};
    ref_rnn_cfg a = agru(2, 5, 9, 4, 3);
    run_case("A-GRU saturated H=9", &a, &o);
    ref_rnn_cfg a32 = agru(1, 16, 32, 3, 2); /* whole panels: the fused weight gradients */
    o.lengths = NULL;
    run_case("A-GRU saturated H=32", &a32, &o);
}

/* ---- repeated calls agree bit for bit ------------------------------------------------------
 * The CPU backend's sums have a fixed order (no atomics; slices own their rows), so the same call
 * repeated on the same context gives identical bits. A difference means a data race, which the
 * tolerance tests above would only catch at random. */
static void repeat_bitwise(const char *label, ref_rnn_cfg c, const int32_t *lengths) {
    prob p;
    prob_make(&p, &c, 77, 1, lengths);
    lib k;
    lib_make(&k, &p, 0);
    int64_t nx = ref_rnn_x_numel(&c), ny = ref_rnn_y_numel(&c), nh = ref_rnn_h_numel(&c);
    int64_t nwt = 0;
    for (int i = 0; i < p.nw; ++i) nwt += ref_rnn_weight_desc(&c, i, NULL, 0, NULL, NULL);
    int64_t n_all = ny + nh + nx + nh + nwt;
    float *first = falloc(n_all), *cur = falloc(n_all);
    float **dw = calloc((size_t)p.nw, sizeof *dw);
    bufs b = make_bufs(&k, &c, KF_MODE_TRAINING, 0);
    int differ = 0, first_rep = -1;
    for (int rep = 0; rep < 12; ++rep) {
        float *y = cur, *hn = y + ny, *dx = hn + nh, *dh0 = dx + nx, *w0 = dh0 + nh;
        for (int i = 0, off = 0; i < p.nw; ++i) {
            dw[i] = w0 + off;
            off += (int)ref_rnn_weight_desc(&c, i, NULL, 0, NULL, NULL);
        }
        poison(cur, n_all);
        lib_forward(&k, &p, KF_MODE_TRAINING, &b, y, hn);
        lib_backward(&k, &p, KF_GRAD_OVERWRITE, &b, 1, 1, dx, dh0, dw);
        if (rep == 0) {
            memcpy(first, cur, (size_t)n_all * sizeof(float));
        } else if (memcmp(first, cur, (size_t)n_all * sizeof(float)) != 0) {
            ++differ;
            if (first_rep < 0) first_rep = rep;
        }
    }
    cr_expect(differ == 0, "%s: %d of 11 repeated training forward+backward calls differ from the "
              "first (first at repeat %d): a data race in the backend?", label, differ, first_rep);
    free(first); free(cur); free(dw);
    free_bufs(&b);
    lib_free(&k);
    prob_free(&p);
}

Test(rnn_numerics, repeated_calls_are_bitwise_identical) {
    static const int32_t len[6] = {5, 2, 5, 0, 4, 1};
    ref_rnn_cfg g = gru(2, 2, 6, 16, 5, 6);
    g.dropout = 0.2f;
    repeat_bitwise("GRU L=2 D=2", g, len);
    ref_rnn_cfg a = agru(2, 6, 16, 5, 6);
    repeat_bitwise("A-GRU L=2", a, NULL);
    repeat_bitwise("A-GRU H=32", agru(1, 5, 32, 5, 6), len); /* per-step dU, G (two slices) */
}

/* ---- separate contexts run concurrently (one thread each) ---------------------------------- */
typedef struct thread_job { const prob *p; float *y; kf_status s; } thread_job;

static void *thread_main(void *arg) {
    thread_job *j = arg;
    kf_context_desc d;
    kf_context_desc_init(&d);
    d.num_threads = 1;
    kf_context *ctx = NULL;
    j->s = kf_context_create(&d, &ctx);
    if (j->s != KF_OK) return NULL;
    kf_rnn_desc rd;
    kf_rnn_desc_init(&rd);
    rd.cell = j->p->c.cell;
    rd.num_layers = j->p->c.L;
    rd.input_size = j->p->c.I;
    rd.hidden_size = j->p->c.H;
    kf_rnn_plan *plan = NULL;
    j->s = kf_rnn_plan_create(ctx, &rd, &plan);
    if (j->s == KF_OK) {
        kf_tensor *wt = calloc((size_t)j->p->nw, sizeof *wt);
        for (int i = 0; i < j->p->nw && j->s == KF_OK; ++i) {
            int32_t nd;
            int64_t sh[KF_MAX_DIMS];
            j->s = kf_rnn_weight_info(plan, i, NULL, &nd, sh);
            if (j->s == KF_OK) j->s = kf_tensor_init(&wt[i], j->p->w[i], KF_DTYPE_F32, nd, sh);
        }
        const ref_rnn_cfg *c = &j->p->c;
        int64_t xs[3] = {c->T, c->B, c->I}, ys[3] = {c->T, c->B, c->H};
        kf_rnn_forward_args a;
        kf_rnn_forward_args_init(&a);
        kf_tensor_init(&a.x, j->p->x, KF_DTYPE_F32, 3, xs);
        kf_tensor_init(&a.y, j->y, KF_DTYPE_F32, 3, ys);
        a.weights = wt;
        a.num_weights = j->p->nw;
        for (int rep = 0; rep < 20 && j->s == KF_OK; ++rep)
            j->s = kf_rnn_forward(plan, KF_MODE_INFERENCE, &a, NULL, 0, NULL, 0);
        free(wt);
    }
    kf_rnn_plan_destroy(plan);
    kf_context_destroy(ctx);
    return NULL;
}

Test(rnn_numerics, separate_contexts_concurrently) {
    ref_rnn_cfg cs[2] = {gru(2, 1, 5, 16, 8, 4), agru(2, 5, 16, 8, 4)};
    prob p[2];
    thread_job jobs[2];
    pthread_t th[2];
    for (int q = 0; q < 2; ++q) {
        prob_make(&p[q], &cs[q], 100 + (uint64_t)q, 0, NULL);
        jobs[q].p = &p[q];
        jobs[q].y = falloc(ref_rnn_y_numel(&cs[q]));
        poison(jobs[q].y, ref_rnn_y_numel(&cs[q]));
        jobs[q].s = KF_ERR_INTERNAL;
        cr_assert_eq(pthread_create(&th[q], NULL, thread_main, &jobs[q]), 0);
    }
    for (int q = 0; q < 2; ++q) {
        pthread_join(th[q], NULL);
        cr_expect(jobs[q].s == KF_OK, "thread %d: %s", q, kf_status_string(jobs[q].s));
        int64_t ny = ref_rnn_y_numel(&cs[q]);
        double *yr = malloc((size_t)ny * sizeof *yr);
        ref_rnn_forward_f64(&cs[q], p[q].xd, NULL, (const double *const *)p[q].wd, NULL, yr, NULL);
        expect_close(q ? "A-GRU thread" : "GRU thread", "y", jobs[q].y, yr, ny);
        free(yr);
        free(jobs[q].y);
        prob_free(&p[q]);
    }
}

/* ---- long sequences: bounded by 4x the reference's own float32 error ------------------------ */
static void long_sequence(const char *label, ref_rnn_cfg c) {
    c.training = 1;
    prob p;
    prob_make(&p, &c, 0x10C, 1, NULL);
    lib k;
    lib_make(&k, &p, 0);
    int64_t nx = ref_rnn_x_numel(&c), ny = ref_rnn_y_numel(&c), nh = ref_rnn_h_numel(&c);
    int64_t nwt = 0;
    for (int i = 0; i < p.nw; ++i) nwt += ref_rnn_weight_desc(&c, i, NULL, 0, NULL, NULL);

    /* library */
    float *y = falloc(ny), *hn = falloc(nh), *dx = falloc(nx), *dh0 = falloc(nh);
    float *dwall = falloc(nwt), **dw = calloc((size_t)p.nw, sizeof *dw);
    float *y32 = falloc(ny), *hn32 = falloc(nh), *dx32 = falloc(nx), *dh032 = falloc(nh);
    float *dwall32 = falloc(nwt), **dw32 = calloc((size_t)p.nw, sizeof *dw32);
    double *yd = malloc((size_t)ny * 8), *hnd = malloc((size_t)nh * 8);
    double *dxd = malloc((size_t)nx * 8);
    double *dh0d = malloc((size_t)nh * 8), *dwalld = malloc((size_t)nwt * 8);
    double **dwd = calloc((size_t)p.nw, sizeof *dwd);
    for (int i = 0, off = 0; i < p.nw; ++i) {
        dw[i] = dwall + off;
        dw32[i] = dwall32 + off;
        dwd[i] = dwalld + off;
        off += (int)ref_rnn_weight_desc(&c, i, NULL, 0, NULL, NULL);
    }
    poison(dx, nx);
    poison(dh0, nh);
    poison(dwall, nwt);
    bufs b = make_bufs(&k, &c, KF_MODE_TRAINING, 1);
    lib_forward(&k, &p, KF_MODE_TRAINING, &b, y, hn);
    lib_backward(&k, &p, KF_GRAD_OVERWRITE, &b, 1, 1, dx, dh0, dw);

    /* reference in float32 and float64 */
    ref_rnn_forward_f32(&c, p.x, p.h0, (const float *const *)p.w, p.len, y32, hn32);
    ref_rnn_backward_f32(&c, p.x, p.h0, (const float *const *)p.w, p.len, p.dy, p.dhn, dx32, dh032,
                         dw32);
    ref_rnn_forward_f64(&c, p.xd, p.h0d, (const double *const *)p.wd, p.len, yd, hnd);
    ref_rnn_backward_f64(&c, p.xd, p.h0d, (const double *const *)p.wd, p.len, p.dyd, p.dhnd, dxd,
                         dh0d, dwd);

    const struct { const char *what; const float *lib, *r32; const double *r64; int64_t n; } g[] = {
        {"y", y, y32, yd, ny},        {"hn", hn, hn32, hnd, nh},
        {"dx", dx, dx32, dxd, nx},    {"dh0", dh0, dh032, dh0d, nh},
        {"dweights", dwall, dwall32, dwalld, nwt},
    };
    for (size_t q = 0; q < sizeof g / sizeof g[0]; ++q) {
        double e_lib = ref_rel_err_f32(g[q].lib, g[q].r64, g[q].n);
        double e_ref = ref_rel_err_f32(g[q].r32, g[q].r64, g[q].n);
        cr_expect(e_ref > 0, "%s: float32 reference %s equals float64 exactly?", label, g[q].what);
        /* DESIGN.md: the general 1e-5, or where float32 rounding has grown with T past it,
         * 4x the reference's own float32 error; never a fixed looser constant */
        cr_expect(e_lib <= fmax(4 * e_ref, TOL),
                  "%s: %s rel err %.3e > max(1e-5, 4 x float32 reference's %.3e)", label,
                  g[q].what, e_lib, e_ref);
        cr_log_info("%s: %s lib err %.3e, f32 reference err %.3e", label, g[q].what, e_lib, e_ref);
    }
    for (int i = 0; i < p.nw; ++i) {
        char name[64];
        int64_t n = ref_rnn_weight_desc(&c, i, name, sizeof name, NULL, NULL);
        double e_lib = ref_rel_err_f32(dw[i], dwd[i], n);
        double e_ref = ref_rel_err_f32(dw32[i], dwd[i], n);
        /* per tensor: the same bound, or the general 1e-5 where float32 rounding is smaller */
        cr_expect(e_lib <= fmax(4 * e_ref, TOL), "%s: d%s rel err %.3e > 4 x float32 ref %.3e",
                  label, name, e_lib, e_ref);
    }
    free(y); free(hn); free(dx); free(dh0); free(dwall); free(dw);
    free(y32); free(hn32); free(dx32); free(dh032); free(dwall32); free(dw32);
    free(yd); free(hnd); free(dxd); free(dh0d); free(dwalld); free(dwd);
    free_bufs(&b);
    lib_free(&k);
    prob_free(&p);
}

Test(rnn_long, gru_T200, .timeout = 120) {
    long_sequence("GRU T=200", gru(1, 1, 8, 32, 200, 4));
}

Test(rnn_long, agru_T200, .timeout = 120) {
    long_sequence("A-GRU T=200", agru(1, 8, 32, 200, 4));
}

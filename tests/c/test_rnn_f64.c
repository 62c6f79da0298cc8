/* GRU and A-GRU in float64 (kf_rnn_desc.dtype = KF_DTYPE_F64) on the CPU and, where a device is
 * usable, on CUDA (cuda/plain.cu; every tensor, workspace and reserve in device memory), through the
 * public header only, against the independent float64 reference of ref_rnn.c.
 *
 * Fresh seeded random inputs (never zeros), weights U(-1/sqrt(H), 1/sqrt(H)), epsilon U(0.5, 1.5);
 * every output NaN-poisoned before a call; relative error ||out - ref|| / ||ref|| < 1e-12 for y,
 * hn, dx, dh0 and each weight gradient (accumulated ones relative to the gradient itself). The
 * feature matrix of the float32 tests: multi-layer, bidirectional GRU, dropout between layers
 * (the same counter stream), batch_first, lengths, optional h0 / dy / dhn / dx / dh0 / dweights,
 * accumulate, one and two threads, the arena and a caller workspace. The size queries report the
 * float64 sizes: the calls run on workspace and reserve buffers of exactly the reported size with
 * guard bytes after them, and the reserve holds at least what backward must read in float64. A
 * float32 tensor given to a float64 plan (and the reverse) is refused by name, nothing written. */
#define _POSIX_C_SOURCE 200809L

#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kfuse.h"
#include "kf_test.h"
#include "ref_rnn.h"

#define TOL 1e-12
#define GUARD 256 /* bytes checked past a workspace or reserve of the reported size */

static double *dalloc_n(int64_t n) { return xalloc((size_t)(n > 0 ? n : 1) * sizeof(double)); }

static double *nans(int64_t n) {
    double *p = dalloc_n(n);
    for (int64_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}

static double *uniform(ref_rng *r, int64_t n, double lo, double hi) {
    double *p = dalloc_n(n);
    for (int64_t i = 0; i < n; i++) p[i] = ref_rng_uniform(r, lo, hi);
    return p;
}

/* ---- a problem ------------------------------------------------------------------------------ */
typedef struct prob {
    ref_rnn_cfg c;
    int nw;
    double *x, *h0, **w, *dy, *dhn; /* h0 NULL = absent */
    int32_t *len;                   /* NULL = absent */
} prob;

static prob prob_make(const ref_rnn_cfg *c, uint64_t seed, int with_h0, const int32_t *lengths) {
    prob p = {.c = *c, .nw = ref_rnn_num_weights(c)};
    ref_rng r;
    ref_rng_seed(&r, seed);
    const int64_t nh = ref_rnn_h_numel(c);
    p.x = uniform(&r, ref_rnn_x_numel(c), -1.0, 1.0);
    p.h0 = with_h0 ? uniform(&r, nh, -0.8, 0.8) : NULL;
    if (lengths) {
        p.len = xalloc((size_t)c->B * sizeof(int32_t));
        memcpy(p.len, lengths, (size_t)c->B * sizeof(int32_t));
    }
    const double k = 1.0 / sqrt((double)c->H);
    p.w = calloc((size_t)p.nw, sizeof *p.w);
    for (int i = 0; i < p.nw; i++) {
        char name[64];
        int64_t n = ref_rnn_weight_desc(c, i, name, sizeof name, NULL, NULL);
        p.w[i] = strstr(name, "epsilon") ? uniform(&r, n, 0.5, 1.5) : uniform(&r, n, -k, k);
    }
    p.dy = uniform(&r, ref_rnn_y_numel(c), -1.0, 1.0);
    p.dhn = uniform(&r, nh, -1.0, 1.0);
    return p;
}

static void prob_free(prob *p) {
    for (int i = 0; i < p->nw; i++) free(p->w[i]);
    free(p->w), free(p->x), free(p->h0), free(p->len), free(p->dy), free(p->dhn);
}

/* ---- the library side ----------------------------------------------------------------------- */
static kf_status plan_for(kf_context *ctx, const ref_rnn_cfg *c, kf_dtype dtype,
                          kf_rnn_plan **plan) {
    kf_rnn_desc d;
    kf_rnn_desc_init(&d);
    d.cell = c->cell == REF_GRU ? KF_RNN_GRU : KF_RNN_AGRU;
    d.num_layers = c->L;
    d.input_size = c->I;
    d.hidden_size = c->H;
    d.flags = (c->batch_first ? KF_RNN_BATCH_FIRST : 0u) | (c->D == 2 ? KF_RNN_BIDIRECTIONAL : 0u);
    d.dropout = c->dropout;
    d.gamma = c->gamma;
    d.dtype = dtype;
    return kf_rnn_plan_create(ctx, &d, plan);
}

/* Tensors over `data` (each may be NULL) with the reference's weight shapes, in `dtype`. */
static kf_tensor *weight_tensors(const ref_rnn_cfg *c, void *const *data, kf_dtype dtype) {
    const int nw = ref_rnn_num_weights(c);
    kf_tensor *t = calloc((size_t)nw, sizeof *t);
    for (int i = 0; i < nw; i++) {
        int nd;
        int64_t sh[2];
        ref_rnn_weight_desc(c, i, NULL, 0, &nd, sh);
        t[i] = tens(data ? data[i] : NULL, dtype, nd, sh);
    }
    return t;
}

static void seq_shape(const ref_rnn_cfg *c, int64_t width, int64_t *shape) {
    shape[0] = c->batch_first ? c->B : c->T;
    shape[1] = c->batch_first ? c->T : c->B;
    shape[2] = width;
}

/* The forward arguments of problem p with weight tensors wt, outputs y and hn (NULL: absent). */
static kf_rnn_forward_args forward_args(const prob *p, kf_tensor *wt, double *y, double *hn) {
    const ref_rnn_cfg *c = &p->c;
    int64_t xs[3], ys[3], hs[3] = {(int64_t)c->L * c->D, c->B, c->H}, ls[1] = {c->B};
    seq_shape(c, c->I, xs);
    seq_shape(c, (int64_t)c->D * c->H, ys);
    kf_rnn_forward_args a;
    kf_rnn_forward_args_init(&a);
    a.x = tens(p->x, KF_DTYPE_F64, 3, xs);
    a.h0 = tens(p->h0, KF_DTYPE_F64, 3, hs);
    a.weights = wt;
    a.num_weights = p->nw;
    a.lengths = tens(p->len, KF_DTYPE_I32, 1, ls);
    a.dropout_seed = c->seed;
    a.dropout_offset = c->offset;
    a.y = tens(y, KF_DTYPE_F64, 3, ys);
    a.hn = tens(hn, KF_DTYPE_F64, 3, hs);
    return a;
}

/* A buffer of exactly `bytes` as the library sees it, in `dev`'s memory, followed by GUARD bytes
 * of 0xA5. */
typedef struct gbuf {
    unsigned char *p;
    size_t bytes;
    kf_device_type dev;
} gbuf;

static gbuf gbuf_make(kf_device_type dev, size_t bytes) {
    unsigned char *h = xalloc(bytes + GUARD);
    memset(h, 0x5A, bytes);
    memset(h + bytes, 0xA5, GUARD);
    gbuf g = {h, bytes, dev};
#ifdef KF_HAVE_CUDA
    if (dev == KF_DEVICE_CUDA) g.p = to_dev(h, bytes + GUARD), free(h);
#endif
    return g;
}

static void gbuf_check(const gbuf *g, const char *what) {
    const unsigned char *q = g->p + g->bytes;
#ifdef KF_HAVE_CUDA
    unsigned char guard[GUARD];
    if (g->dev == KF_DEVICE_CUDA) {
        CUDA_OK(cudaMemcpy(guard, g->p + g->bytes, GUARD, cudaMemcpyDeviceToHost));
        q = guard;
    }
#endif
    for (size_t i = 0; i < GUARD; i++)
        cr_assert(q[i] == 0xA5, "%s: byte %zu past the reported %zu bytes written", what, i,
                  g->bytes);
}

static void gbuf_free(gbuf *g) {
    if (g->dev == KF_DEVICE_CUDA) unplace(g->dev, g->p);
    else free(g->p);
}

typedef struct opts {
    int h0;                 /* pass h0 */
    const int32_t *lengths; /* NULL = absent */
    int no_hn;              /* do not request hn */
    int caller_ws;          /* caller workspace instead of the arena */
    int no_dy, no_dhn;      /* leave dy / dhn absent */
    int accumulate;         /* KF_GRAD_ACCUMULATE into prefilled buffers */
    int no_dx, no_dh0;      /* leave dx / dh0 absent */
    int dw_mode;            /* 0 all dweights, 1 none (NULL array), 2 every other one absent */
    int32_t threads;
    int cuda;               /* on a CUDA context, every tensor in device memory (threads unused) */
} opts;

static void expect_close(const char *label, const char *what, const double *out,
                         const double *ref, int64_t n) {
    const double e = ref_rel_err_f64(out, ref, n);
    cr_expect(e < TOL, "%s: %s rel err %.3e >= %.0e", label, what, e, TOL);
}

/* p's inputs where a `dev` context reads them (kf_test.h's place_f64; the lengths copied too). */
static prob placed(kf_device_type dev, const prob *p) {
    prob d = *p;
    const ref_rnn_cfg *c = &p->c;
    d.x = place_f64(dev, p->x, ref_rnn_x_numel(c)), d.h0 = place_f64(dev, p->h0, ref_rnn_h_numel(c));
    d.dy = place_f64(dev, p->dy, ref_rnn_y_numel(c));
    d.dhn = place_f64(dev, p->dhn, ref_rnn_h_numel(c));
    d.w = calloc((size_t)p->nw, sizeof *d.w);
    for (int i = 0; i < p->nw; i++)
        d.w[i] = place_f64(dev, p->w[i], ref_rnn_weight_desc(c, i, NULL, 0, NULL, NULL));
#ifdef KF_HAVE_CUDA
    if (dev == KF_DEVICE_CUDA && p->len) d.len = to_dev(p->len, (size_t)c->B * sizeof(int32_t));
#endif
    return d;
}

static void unplace_prob(kf_device_type dev, prob *d) {
    for (int i = 0; i < d->nw; i++) unplace(dev, d->w[i]);
    free(d->w);
    void *v[] = {d->x, d->h0, d->dy, d->dhn, d->len};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) unplace(dev, v[i]);
}

/* One case: inference forward, training forward, backward, each against the reference, on a CPU
 * context with o->threads threads or (o->cuda) a CUDA context with every tensor, workspace and
 * reserve in device memory (skipped without a usable device). */
static void run_case(const char *label, const ref_rnn_cfg *cfg, const opts *o) {
    const kf_device_type dev = o->cuda ? KF_DEVICE_CUDA : KF_DEVICE_CPU;
    prob p = prob_make(cfg, 0xF64 + (uint64_t)cfg->T * 31 + (uint64_t)cfg->H, o->h0, o->lengths);
    const ref_rnn_cfg *c = &p.c;
    kf_context *ctx = make_ctx(dev, o->threads);
    prob pd = placed(dev, &p);
    kf_rnn_plan *plan = NULL;
    KF_OK_(plan_for(ctx, c, KF_DTYPE_F64, &plan));
    kf_tensor *wt = weight_tensors(c, (void *const *)pd.w, KF_DTYPE_F64);
    const int64_t nx = ref_rnn_x_numel(c), ny = ref_rnn_y_numel(c), nh = ref_rnn_h_numel(c);
    int64_t xs[3], ys[3], hs[3] = {(int64_t)c->L * c->D, c->B, c->H};
    seq_shape(c, c->I, xs);
    seq_shape(c, (int64_t)c->D * c->H, ys);
    double *y = nans(ny), *hn = o->no_hn ? NULL : nans(nh);
    double *yd = place_f64(dev, y, ny), *hnd = place_f64(dev, hn, nh);
    double *yr = dalloc_n(ny), *hnr = dalloc_n(nh);
    char lab[256];
    kf_rnn_forward_args fa = forward_args(&pd, wt, yd, hnd);

    /* Inference: never dropout, no reserve. */
    size_t wsb = 0, rsb = 1;
    KF_OK_(kf_rnn_workspace_size(plan, c->T, c->B, KF_MODE_INFERENCE, &wsb, &rsb));
    cr_expect(rsb == 0, "%s: inference reserve_bytes = %zu", label, rsb);
    gbuf ws = gbuf_make(dev, o->caller_ws ? wsb : 0);
    KF_OK_(kf_rnn_forward(plan, KF_MODE_INFERENCE, &fa, o->caller_ws ? ws.p : NULL,
                          o->caller_ws ? ws.bytes : 0, NULL, 0));
    KF_OK_(kf_context_synchronize(ctx));
    gbuf_check(&ws, "inference workspace");
    gbuf_free(&ws);
    fetch_f64(dev, y, yd, ny), fetch_f64(dev, hn, hnd, nh);
    ref_rnn_cfg ci = *c;
    ci.training = 0;
    ref_rnn_forward_f64(&ci, p.x, p.h0, (const double *const *)p.w, p.len, yr, hnr);
    snprintf(lab, sizeof lab, "%s [inference]", label);
    expect_close(lab, "y", y, yr, ny);
    if (hn) expect_close(lab, "hn", hn, hnr, nh);

    /* Training forward: the reserve holds at least every layer's saved states, gates and inner
     * outputs in float64 (what backward reads). */
    KF_OK_(kf_rnn_workspace_size(plan, c->T, c->B, KF_MODE_TRAINING, &wsb, &rsb));
    const int64_t N = c->T * c->B, ng = c->cell == REF_GRU ? 4 : 3;
    const size_t saved = (size_t)((c->L * c->D * (1 + ng) + (c->L - 1) * c->D) * N * c->H) * 8;
    cr_expect(rsb >= saved, "%s: reserve_bytes = %zu < %zu, the float64 states", label, rsb,
              saved);
    ws = gbuf_make(dev, o->caller_ws ? wsb : 0);
    gbuf rs = gbuf_make(dev, rsb);
    unplace(dev, yd), unplace(dev, hnd);
    for (int64_t i = 0; i < ny; i++) y[i] = NAN;
    if (hn)
        for (int64_t i = 0; i < nh; i++) hn[i] = NAN;
    yd = place_f64(dev, y, ny), hnd = place_f64(dev, hn, nh);
    fa.y.data = yd, fa.hn.data = hnd;
    KF_OK_(kf_rnn_forward(plan, KF_MODE_TRAINING, &fa, o->caller_ws ? ws.p : NULL,
                          o->caller_ws ? ws.bytes : 0, rs.p, rs.bytes));
    KF_OK_(kf_context_synchronize(ctx));
    gbuf_check(&ws, "training workspace");
    gbuf_check(&rs, "reserve");
    fetch_f64(dev, y, yd, ny), fetch_f64(dev, hn, hnd, nh);
    ref_rnn_cfg ct = *c;
    ct.training = 1;
    ref_rnn_forward_f64(&ct, p.x, p.h0, (const double *const *)p.w, p.len, yr, hnr);
    snprintf(lab, sizeof lab, "%s [training]", label);
    expect_close(lab, "y", y, yr, ny);
    if (hn) expect_close(lab, "hn", hn, hnr, nh);

    /* Backward. */
    double *dx = o->no_dx ? NULL : nans(nx), *dh0 = o->no_dh0 ? NULL : nans(nh);
    double **dw = calloc((size_t)p.nw, sizeof *dw), **pre = calloc((size_t)p.nw, sizeof *pre);
    double **dwr = calloc((size_t)p.nw, sizeof *dwr), **dwd = calloc((size_t)p.nw, sizeof *dwd);
    ref_rng r;
    ref_rng_seed(&r, 99);
    for (int i = 0; i < p.nw && o->dw_mode != 1; i++) {
        if (o->dw_mode == 2 && i % 2 == 1) continue;
        const int64_t n = ref_rnn_weight_desc(c, i, NULL, 0, NULL, NULL);
        dwr[i] = dalloc_n(n);
        if (o->accumulate) {
            pre[i] = uniform(&r, n, -1.0, 1.0);
            dw[i] = dalloc_n(n);
            memcpy(dw[i], pre[i], (size_t)n * sizeof(double));
        } else {
            dw[i] = nans(n);
        }
        dwd[i] = place_f64(dev, dw[i], n);
    }
    double *dxd = place_f64(dev, dx, nx), *dh0d = place_f64(dev, dh0, nh);
    kf_tensor *dwt = o->dw_mode == 1 ? NULL : weight_tensors(c, (void *const *)dwd, KF_DTYPE_F64);
    kf_rnn_backward_args ba;
    kf_rnn_backward_args_init(&ba);
    ba.x = fa.x, ba.h0 = fa.h0, ba.weights = wt, ba.num_weights = p.nw, ba.lengths = fa.lengths;
    ba.dropout_seed = c->seed;
    ba.dropout_offset = c->offset;
    ba.dy = tens(o->no_dy ? NULL : pd.dy, KF_DTYPE_F64, 3, ys);
    ba.dhn = tens(o->no_dhn ? NULL : pd.dhn, KF_DTYPE_F64, 3, hs);
    ba.dx = tens(dxd, KF_DTYPE_F64, 3, xs);
    ba.dh0 = tens(dh0d, KF_DTYPE_F64, 3, hs);
    ba.dweights = dwt;
    ba.num_dweights = dwt ? p.nw : 0;
    KF_OK_(kf_rnn_backward(plan, o->accumulate ? KF_GRAD_ACCUMULATE : KF_GRAD_OVERWRITE, &ba,
                           o->caller_ws ? ws.p : NULL, o->caller_ws ? ws.bytes : 0, rs.p,
                           rs.bytes));
    KF_OK_(kf_context_synchronize(ctx));
    gbuf_check(&ws, "backward workspace");
    fetch_f64(dev, dx, dxd, nx), fetch_f64(dev, dh0, dh0d, nh);
    for (int i = 0; i < p.nw; i++)
        if (dw[i]) fetch_f64(dev, dw[i], dwd[i], ref_rnn_weight_desc(c, i, NULL, 0, NULL, NULL));
    double *dxr = dalloc_n(nx), *dh0r = dalloc_n(nh);
    ref_rnn_backward_f64(&ct, p.x, p.h0, (const double *const *)p.w, p.len,
                         o->no_dy ? NULL : p.dy, o->no_dhn ? NULL : p.dhn, dxr, dh0r, dwr);
    snprintf(lab, sizeof lab, "%s [backward%s]", label, o->accumulate ? ", accumulate" : "");
    if (dx) expect_close(lab, "dx", dx, dxr, nx);
    if (dh0) expect_close(lab, "dh0", dh0, dh0r, nh);
    for (int i = 0; i < p.nw; i++) {
        if (!dw[i]) continue;
        char name[64];
        const int64_t n = ref_rnn_weight_desc(c, i, name, sizeof name, NULL, NULL);
        if (o->accumulate) /* compare the increments */
            for (int64_t j = 0; j < n; j++) dw[i][j] -= pre[i][j];
        char what[80];
        snprintf(what, sizeof what, "d%s", name);
        expect_close(lab, what, dw[i], dwr[i], n);
    }

    for (int i = 0; i < p.nw; i++) unplace(dev, dwd[i]), free(dw[i]), free(pre[i]), free(dwr[i]);
    free(dw), free(dwd), free(pre), free(dwr), free(dwt);
    unplace(dev, dxd), unplace(dev, dh0d), unplace(dev, yd), unplace(dev, hnd);
    free(dx), free(dh0), free(dxr), free(dh0r), free(y), free(hn), free(yr), free(hnr);
    gbuf_free(&ws), gbuf_free(&rs), free(wt);
    kf_rnn_plan_destroy(plan);
    kf_context_destroy(ctx);
    unplace_prob(dev, &pd);
    prob_free(&p);
}

static ref_rnn_cfg cfg(int cell, int L, int D, int64_t I, int64_t H, int64_t T, int64_t B) {
    return (ref_rnn_cfg){.cell = cell, .L = L, .D = D, .I = I, .H = H, .T = T, .B = B,
                         .gamma = 0.01f, .seed = 0x5EED, .offset = 0};
}

/* ---- the feature matrix, each on one and two CPU threads, then on CUDA ------------------------ */
static void both_threads(const char *label, const ref_rnn_cfg *c, opts o) {
    char lab[128];
    for (int32_t th = 1; th <= 2; th++) {
        o.threads = th;
        snprintf(lab, sizeof lab, "%s, %d thread%s", label, (int)th, th > 1 ? "s" : "");
        run_case(lab, c, &o);
    }
#ifdef KF_HAVE_CUDA
    kf_context_desc d;
    kf_context_desc_init(&d);
    d.device_type = KF_DEVICE_CUDA;
    kf_context *probe = NULL;
    if (kf_context_create(&d, &probe) != KF_OK) return; /* no usable device: CPU only */
    kf_context_destroy(probe);
    o.threads = 0, o.cuda = 1;
    snprintf(lab, sizeof lab, "%s, cuda", label);
    run_case(lab, c, &o);
#endif
}

Test(rnn_f64, gru_single_layer) {
    ref_rnn_cfg c = cfg(REF_GRU, 1, 1, 5, 7, 6, 3);
    both_threads("gru 1 layer", &c, (opts){.h0 = 1});
    both_threads("gru 1 layer, no h0, caller workspace", &c, (opts){.caller_ws = 1});
}

/* The first GEMM of a process (float64 products run on BLAS) leaves the environment as it found
 * it: where OpenBLAS fell back to its Prescott kernels on a CPU newer than it, host/blas.c sets
 * OPENBLAS_CORETYPE for its re-initialisation and must remove it again (a program's own value,
 * as scripts/test.sh's forced core runs set, must stay). Criterion runs each test in a process
 * of its own. */
Test(rnn_f64, blas_core_pick_leaves_environment) {
    const char *e = getenv("OPENBLAS_CORETYPE");
    char *before = e ? strdup(e) : NULL;
    ref_rnn_cfg c = cfg(REF_GRU, 1, 1, 5, 7, 6, 3);
    run_case("gru 1 layer, 1 thread", &c, &(opts){.h0 = 1, .threads = 1});
    const char *after = getenv("OPENBLAS_CORETYPE");
    cr_expect(before ? after && !strcmp(before, after) : !after,
              "OPENBLAS_CORETYPE was '%s', is '%s' after the first GEMM",
              before ? before : "(unset)", after ? after : "(unset)");
    free(before);
}

Test(rnn_f64, gru_multilayer_bidirectional_lengths) {
    static const int32_t len[5] = {9, 4, 1, 9, 6};
    ref_rnn_cfg c = cfg(REF_GRU, 3, 2, 6, 8, 9, 5);
    both_threads("gru 3x2", &c, (opts){.h0 = 1, .lengths = len});
    c.batch_first = 1;
    both_threads("gru 3x2 batch_first", &c, (opts){.h0 = 1, .lengths = len, .caller_ws = 1});
}

Test(rnn_f64, gru_dropout) {
    ref_rnn_cfg c = cfg(REF_GRU, 3, 2, 4, 6, 5, 4);
    c.dropout = 0.3f, c.seed = 0xD00D, c.offset = 12345;
    both_threads("gru dropout", &c, (opts){.h0 = 1});
    c.batch_first = 1;
    static const int32_t len[4] = {5, 2, 4, 3};
    both_threads("gru dropout batch_first lengths", &c, (opts){.lengths = len});
}

Test(rnn_f64, gru_optional_and_accumulate) {
    ref_rnn_cfg c = cfg(REF_GRU, 2, 2, 3, 5, 4, 3);
    both_threads("gru accumulate", &c, (opts){.h0 = 1, .accumulate = 1});
    both_threads("gru no dy", &c, (opts){.h0 = 1, .no_dy = 1, .dw_mode = 2});
    both_threads("gru no dhn, no hn", &c, (opts){.no_dhn = 1, .no_hn = 1, .no_dh0 = 1});
    both_threads("gru no dweights", &c, (opts){.h0 = 1, .dw_mode = 1, .no_dx = 1});
}

Test(rnn_f64, agru_single_layer) {
    ref_rnn_cfg c = cfg(REF_AGRU, 1, 1, 5, 7, 6, 3);
    both_threads("agru 1 layer", &c, (opts){.h0 = 1});
    c.gamma = 0.25f;
    both_threads("agru 1 layer gamma 0.25, no h0", &c, (opts){.caller_ws = 1});
}

Test(rnn_f64, agru_multilayer_lengths_dropout) {
    static const int32_t len[5] = {7, 3, 1, 7, 5};
    ref_rnn_cfg c = cfg(REF_AGRU, 3, 1, 6, 8, 7, 5);
    both_threads("agru 3 layers", &c, (opts){.h0 = 1, .lengths = len});
    c.batch_first = 1, c.dropout = 0.4f, c.seed = 0xABCD, c.offset = 77;
    both_threads("agru 3 layers batch_first dropout", &c, (opts){.h0 = 1, .lengths = len});
}

Test(rnn_f64, agru_optional_and_accumulate) {
    ref_rnn_cfg c = cfg(REF_AGRU, 2, 1, 3, 5, 4, 3);
    both_threads("agru accumulate", &c, (opts){.h0 = 1, .accumulate = 1});
    both_threads("agru no dy", &c, (opts){.h0 = 1, .no_dy = 1, .dw_mode = 2});
    both_threads("agru no dhn", &c, (opts){.no_dhn = 1, .no_hn = 1, .no_dh0 = 1});
}

/* ---- dtypes: refused by name, nothing written ------------------------------------------------ */
Test(rnn_f64, mixed_dtype_names_the_argument) {
    ref_rnn_cfg c = cfg(REF_GRU, 2, 1, 3, 4, 3, 2);
    prob p = prob_make(&c, 5, 1, NULL);
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    kf_rnn_plan *plan = NULL;
    KF_OK_(plan_for(ctx, &c, KF_DTYPE_F64, &plan));
    kf_tensor *wt = weight_tensors(&c, (void *const *)p.w, KF_DTYPE_F64);
    int64_t xs[3], ys[3], hs[3] = {(int64_t)c.L * c.D, c.B, c.H};
    seq_shape(&c, c.I, xs);
    seq_shape(&c, c.H, ys);
    const int64_t ny = ref_rnn_y_numel(&c), nh = ref_rnn_h_numel(&c);
    double *y = nans(ny), *hn = nans(nh);
    float *f32 = poisoned(ref_rnn_x_numel(&c) + ny + 64);
    kf_rnn_forward_args a = forward_args(&p, wt, y, hn);

    kf_rnn_forward_args bad = a;
    bad.x = tens(f32, KF_DTYPE_F32, 3, xs);
    EXPECT_FAIL(kf_rnn_forward(plan, KF_MODE_INFERENCE, &bad, NULL, 0, NULL, 0),
                KF_ERR_INVALID_ARGUMENT, "args->x.dtype");
    bad = a;
    bad.h0 = tens(f32, KF_DTYPE_F32, 3, hs);
    EXPECT_FAIL(kf_rnn_forward(plan, KF_MODE_INFERENCE, &bad, NULL, 0, NULL, 0),
                KF_ERR_INVALID_ARGUMENT, "args->h0.dtype");
    bad = a;
    bad.y = tens(f32, KF_DTYPE_F32, 3, ys);
    EXPECT_FAIL(kf_rnn_forward(plan, KF_MODE_INFERENCE, &bad, NULL, 0, NULL, 0),
                KF_ERR_INVALID_ARGUMENT, "args->y.dtype");
    kf_tensor w1 = wt[1];
    wt[1] = tens(f32, KF_DTYPE_F32, w1.ndim, w1.shape);
    EXPECT_FAIL(kf_rnn_forward(plan, KF_MODE_INFERENCE, &a, NULL, 0, NULL, 0),
                KF_ERR_INVALID_ARGUMENT, "args->weights[1] (weight_hh_l0)");
    wt[1] = w1;
    for (int64_t i = 0; i < ny; i++) cr_expect(isnan(y[i]), "y[%lld] written", (long long)i);
    for (int64_t i = 0; i < nh; i++) cr_expect(isnan(hn[i]), "hn[%lld] written", (long long)i);

    /* backward: a float32 gradient is refused by name, no gradient written */
    size_t wsb, rsb;
    KF_OK_(kf_rnn_workspace_size(plan, c.T, c.B, KF_MODE_TRAINING, &wsb, &rsb));
    void *rs = xalloc(rsb);
    KF_OK_(kf_rnn_forward(plan, KF_MODE_TRAINING, &a, NULL, 0, rs, rsb));
    const int64_t nx = ref_rnn_x_numel(&c);
    double *dx = nans(nx);
    kf_rnn_backward_args ba;
    kf_rnn_backward_args_init(&ba);
    ba.x = a.x, ba.h0 = a.h0, ba.weights = wt, ba.num_weights = p.nw;
    ba.dy = tens(p.dy, KF_DTYPE_F64, 3, ys);
    ba.dx = tens(dx, KF_DTYPE_F64, 3, xs);
    ba.dh0 = tens(f32, KF_DTYPE_F32, 3, hs);
    EXPECT_FAIL(kf_rnn_backward(plan, KF_GRAD_OVERWRITE, &ba, NULL, 0, rs, rsb),
                KF_ERR_INVALID_ARGUMENT, "args->dh0.dtype");
    ba.dh0 = tens(NULL, KF_DTYPE_F64, 3, hs);
    ba.dy = tens(f32, KF_DTYPE_F32, 3, ys);
    EXPECT_FAIL(kf_rnn_backward(plan, KF_GRAD_OVERWRITE, &ba, NULL, 0, rs, rsb),
                KF_ERR_INVALID_ARGUMENT, "args->dy.dtype");
    for (int64_t i = 0; i < nx; i++) cr_expect(isnan(dx[i]), "dx[%lld] written", (long long)i);

    /* and a float32 plan refuses float64 tensors */
    kf_rnn_plan *p32 = NULL;
    KF_OK_(plan_for(ctx, &c, KF_DTYPE_F32, &p32));
    EXPECT_FAIL(kf_rnn_forward(p32, KF_MODE_INFERENCE, &a, NULL, 0, NULL, 0),
                KF_ERR_INVALID_ARGUMENT, "args->x.dtype");
    kf_rnn_plan_destroy(p32);

    free(rs), free(dx), free(y), free(hn), free(f32), free(wt);
    kf_rnn_plan_destroy(plan);
    kf_context_destroy(ctx);
    prob_free(&p);
}

/* The float64 sizes: twice the float32 reserve at least where the saved states dominate. */
Test(rnn_f64, size_queries_report_float64) {
    ref_rnn_cfg c = cfg(REF_AGRU, 2, 1, 16, 32, 10, 8);
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    kf_rnn_plan *p64 = NULL, *p32 = NULL;
    KF_OK_(plan_for(ctx, &c, KF_DTYPE_F64, &p64));
    KF_OK_(plan_for(ctx, &c, KF_DTYPE_F32, &p32));
    size_t w64, r64, w32, r32;
    KF_OK_(kf_rnn_workspace_size(p64, c.T, c.B, KF_MODE_TRAINING, &w64, &r64));
    KF_OK_(kf_rnn_workspace_size(p32, c.T, c.B, KF_MODE_TRAINING, &w32, &r32));
    cr_expect(r64 >= 2 * r32 - 2 * 64 * 8, "reserve %zu (float64) vs %zu (float32)", r64, r32);
    cr_expect(w64 > 0);
    kf_rnn_plan_destroy(p64);
    kf_rnn_plan_destroy(p32);
    kf_context_destroy(ctx);
}

/* Integer dtypes are refused at plan creation, naming the field (float16 and bfloat16:
 * tests/c/test_lowp.c). */
Test(rnn_f64, other_dtypes_unsupported) {
    ref_rnn_cfg c = cfg(REF_GRU, 1, 1, 3, 4, 2, 2);
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    kf_rnn_plan *plan = NULL;
    EXPECT_FAIL(plan_for(ctx, &c, KF_DTYPE_I32, &plan), KF_ERR_UNSUPPORTED, "desc->dtype");
    cr_expect(plan == NULL);
    EXPECT_FAIL(plan_for(ctx, &c, KF_DTYPE_I64, &plan), KF_ERR_UNSUPPORTED, "desc->dtype");
    cr_expect(plan == NULL);
    kf_context_destroy(ctx);
}

/* SKLinear's fused epilogue (kfuse.h, since 1.8): y = dropout(act(s Z W2 + bias)) in the output
 * store and its gradient, through the public header only, against the float64 reference of
 * tests/c/ref_sklinear.c (the layer term by term, then ref_skl_epilogue: the activations from
 * their formulas and the dropout mask replayed from its counter with the test's own SplitMix).
 * Every activation x dropout (0, 0.3) x dtype (float32, float64, bfloat16, float16) x CPU
 * instruction set (the default, and KF_CPU_ISA=avx2: the baseline build), on shapes that take
 * the row split, the wide split and (2r > 256) the low plans' float32 blocks; outputs poisoned
 * (NaN) first. Inputs are drawn in float64 and rounded to the dtype first, so the reference sees
 * the same numbers. Bounds ||out - ref|| / ||ref||: float64 1e-12, float32 1e-5, bfloat16 and
 * float16 4u (y is rounded once, pre once; the backward reads the rounded pre and rounds dx and
 * the gradients once each). A wrong mask bit would cost O(1). Also: inference calls apply no
 * dropout, ReLU's backward takes y in pre's place, a 1.7 caller's structs still work, and bad
 * input is refused naming the field. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <criterion/criterion.h>

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "kf_test.h"
#include "kfuse.h"
#include "lowp_ref.h"
#include "ref_rnn.h"
#include "ref_sklinear.h"

typedef struct shape { int64_t N, in, out, L, k; } shape;

static const shape kShapes[] = {
    {37, 300, 70, 2, 5},    /* row split, ragged panels */
    {24, 300, 280, 1, 16},  /* wide split (N <= 256, in and out > 256: two column blocks) */
    {20, 48, 40, 5, 30},    /* 2r = 300 > 256: a low plan's float32 blocks, chunked K */
};

static size_t esize(kf_dtype dt) {
    return dt == KF_DTYPE_F64 ? 8 : dt == KF_DTYPE_F32 ? 4 : 2;
}

static double tol(kf_dtype dt) {
    return dt == KF_DTYPE_F64 ? 1e-12 : dt == KF_DTYPE_F32 ? 1e-5 : 4 * unit_roundoff(dt);
}

/* Element i of a buffer of dtype dt, as double; and its store (rounded to dt). */
static double get(kf_dtype dt, const void *b, int64_t i) {
    switch (dt) {
    case KF_DTYPE_F64: return ((const double *)b)[i];
    case KF_DTYPE_F32: return ((const float *)b)[i];
    default: return from_low(((const uint16_t *)b)[i], dt);
    }
}

static void put(kf_dtype dt, void *b, int64_t i, double v) {
    switch (dt) {
    case KF_DTYPE_F64: ((double *)b)[i] = v; break;
    case KF_DTYPE_F32: ((float *)b)[i] = (float)v; break;
    default: ((uint16_t *)b)[i] = to_low(v, dt); break;
    }
}

/* A tensor of n elements: the dtype's buffer and its float64 image (d: what the buffer holds). */
typedef struct buf {
    void *b;
    double *d;
    int64_t n;
} buf;

static buf make_buf(kf_dtype dt, int64_t n, ref_rng *r, double bound) {
    buf t = {xalloc((size_t)n * esize(dt)), xalloc((size_t)n * sizeof(double)), n};
    for (int64_t i = 0; i < n; i++) {
        if (r) put(dt, t.b, i, ref_rng_uniform(r, -bound, bound));
        else if (esize(dt) == 2) ((uint16_t *)t.b)[i] = dt == KF_DTYPE_F16 ? 0x7e00u : 0x7fc0u;
        else put(dt, t.b, i, NAN); /* poison */
        t.d[i] = get(dt, t.b, i);
    }
    return t;
}

static void sync_buf(kf_dtype dt, buf *t) {
    for (int64_t i = 0; i < t->n; i++) t->d[i] = get(dt, t->b, i);
}

static void free_buf(buf *t) { free(t->b), free(t->d); }

/* t's buffer where a call on a `dev` context reads it: itself on the CPU, a device copy (poison
 * included) on CUDA; release with unplace(). */
static void *place(kf_device_type dev, kf_dtype dt, const buf *t) {
#ifdef KF_HAVE_CUDA
    if (dev == KF_DEVICE_CUDA) return to_dev(t->b, (size_t)t->n * esize(dt));
#endif
    (void)dev, (void)dt;
    return t->b;
}

/* What a call wrote at `placed` back into t (buffer and float64 image). */
static void fetch(kf_device_type dev, kf_dtype dt, buf *t, const void *placed) {
#ifdef KF_HAVE_CUDA
    if (dev == KF_DEVICE_CUDA)
        CUDA_OK(cudaMemcpy(t->b, placed, (size_t)t->n * esize(dt), cudaMemcpyDeviceToHost));
#endif
    (void)placed;
    sync_buf(dt, t);
}

static double rel_err(const double *a, const double *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += (a[i] - ref[i]) * (a[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

/* A problem: the layer's tensors in the dtype and float64. */
typedef struct prob {
    kf_dtype dt;
    shape s;
    buf x, S1, S2, U1, U2, b, dy;
} prob;

static prob make_prob(kf_dtype dt, const shape *s, uint64_t seed) {
    ref_rng r;
    ref_rng_seed(&r, seed);
    const double w = 1.0 / sqrt((double)s->k);
    const int64_t ik = s->L * s->in * s->k, ko = s->L * s->k * s->out;
    prob p = {dt, *s, make_buf(dt, s->N * s->in, &r, 1.0), make_buf(dt, ik, &r, w),
              make_buf(dt, ko, &r, w), make_buf(dt, ko, &r, w), make_buf(dt, ik, &r, w),
              make_buf(dt, s->out, &r, 0.5), make_buf(dt, s->N * s->out, &r, 1.0)};
    return p;
}

static void free_prob(prob *p) {
    buf *all[] = {&p->x, &p->S1, &p->S2, &p->U1, &p->U2, &p->b, &p->dy};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free_buf(all[i]);
}

static kf_tensor t2(const prob *p, void *b, int64_t a, int64_t c) {
    return tens(b, p->dt, 2, (int64_t[]){a, c});
}

static kf_tensor t3p(const prob *p, void *b, int64_t a, int64_t c, int64_t e) {
    return tens(b, p->dt, 3, (int64_t[]){a, c, e});
}

static kf_sklinear_plan *plan_of(kf_context *ctx, const prob *p, int act, float drop) {
    kf_sklinear_desc d;
    kf_sklinear_desc_init(&d);
    d.in_features = p->s.in, d.out_features = p->s.out;
    d.num_terms = (int32_t)p->s.L, d.low_rank = (int32_t)p->s.k, d.dtype = p->dt;
    d.activation = act, d.dropout = drop;
    kf_sklinear_plan *plan = NULL;
    KF_OK_(kf_sklinear_plan_create(ctx, &d, &plan));
    return plan;
}

static void params(const prob *p, kf_tensor *S1, kf_tensor *S2, kf_tensor *U1, kf_tensor *U2) {
    const int64_t L = p->s.L, in = p->s.in, out = p->s.out, k = p->s.k;
    *S1 = t3p(p, p->S1.b, L, in, k), *S2 = t3p(p, p->S2.b, L, k, out);
    *U1 = t3p(p, p->U1.b, L, k, out), *U2 = t3p(p, p->U2.b, L, in, k);
}

enum { SEED = 0x5eed1234abcdull, OFFSET = 977 };

/* Forward (y, pre written) and backward (gradients written) of one configuration on a `dev`
 * context, each checked against the reference. relu_y: ReLU's backward reads y in pre's place. */
static void check_one(kf_context *ctx, kf_device_type dev, const prob *p, int act, float drop,
                      int mode, int relu_y) {
    const shape *s = &p->s;
    const kf_dtype dt = p->dt;
    const int64_t ny = s->N * s->out, ik = s->L * s->in * s->k, ko = s->L * s->k * s->out;
    kf_sklinear_plan *plan = plan_of(ctx, p, act, drop);
    buf y = make_buf(dt, ny, NULL, 0), pre = make_buf(dt, ny, NULL, 0);
    buf dx = make_buf(dt, s->N * s->in, NULL, 0), d1 = make_buf(dt, ik, NULL, 0),
        d2 = make_buf(dt, ko, NULL, 0), db = make_buf(dt, s->out, NULL, 0);
    const buf *in[7] = {&p->x, &p->S1, &p->S2, &p->U1, &p->U2, &p->b, &p->dy};
    buf *out[6] = {&y, &pre, &dx, &d1, &d2, &db};
    void *din[7], *dout[6];
    for (int i = 0; i < 7; i++) din[i] = place(dev, dt, in[i]);
    for (int i = 0; i < 6; i++) dout[i] = place(dev, dt, out[i]);
    kf_sklinear_forward_args f;
    kf_sklinear_forward_args_init(&f);
    f.x = t2(p, din[0], s->N, s->in);
    f.S1s = t3p(p, din[1], s->L, s->in, s->k), f.S2s = t3p(p, din[2], s->L, s->k, s->out);
    f.U1s = t3p(p, din[3], s->L, s->k, s->out), f.U2s = t3p(p, din[4], s->L, s->in, s->k);
    f.bias = tens(din[5], dt, 1, (int64_t[]){s->out});
    f.y = t2(p, dout[0], s->N, s->out);
    f.pre = t2(p, dout[1], s->N, s->out);
    f.mode = mode, f.dropout_seed = SEED, f.dropout_offset = OFFSET;
    KF_OK_(kf_sklinear_forward(plan, &f, NULL, 0));
    fetch(dev, dt, &y, dout[0]), fetch(dev, dt, &pre, dout[1]);

    const ref_skl_cfg c = {s->N, s->in, s->out, s->L, s->k};
    const float pe = mode == KF_MODE_TRAINING ? drop : 0.0f;
    double *pre_ref = xalloc((size_t)ny * 8), *y_ref = xalloc((size_t)ny * 8),
           *g_ref = xalloc((size_t)ny * 8);
    ref_skl_forward(&c, p->x.d, p->S1.d, p->S2.d, p->U1.d, p->U2.d, p->b.d, pre_ref);
    ref_skl_epilogue(act, pe, SEED, OFFSET, ny, pre_ref, y_ref, p->dy.d, g_ref);
    const double t = tol(dt) * (dev == KF_DEVICE_CUDA && esize(dt) == 2 ? 2 : 1),
                 ep = rel_err(pre.d, pre_ref, ny), ey = rel_err(y.d, y_ref, ny);
    cr_expect(ep < t && ey < t, "dev %d dtype %d act %d p %g mode %d: forward pre %.3g y %.3g, "
              "bound %.3g", dev, dt, act, drop, mode, ep, ey, t);

    /* backward: the reference's gradients are the layer's with g in dy's place */
    kf_sklinear_backward_args a;
    kf_sklinear_backward_args_init(&a);
    a.x = f.x, a.S1s = f.S1s, a.S2s = f.S2s, a.U1s = f.U1s, a.U2s = f.U2s;
    a.dy = t2(p, din[6], s->N, s->out);
    a.dx = t2(p, dout[2], s->N, s->in);
    a.dS1s = t3p(p, dout[3], s->L, s->in, s->k), a.dS2s = t3p(p, dout[4], s->L, s->k, s->out);
    a.dbias = tens(dout[5], dt, 1, (int64_t[]){s->out});
    a.mode = mode, a.dropout_seed = SEED, a.dropout_offset = OFFSET;
    if (act != KF_ACTIVATION_NONE) a.pre = relu_y ? f.y : f.pre;
    KF_OK_(kf_sklinear_backward(plan, KF_GRAD_OVERWRITE, &a, NULL, 0));
    for (int i = 2; i < 6; i++) fetch(dev, dt, out[i], dout[i]);
    double *rx = xalloc((size_t)dx.n * 8), *r1 = xalloc((size_t)ik * 8),
           *r2 = xalloc((size_t)ko * 8), *rb = xalloc((size_t)s->out * 8);
    ref_skl_backward(&c, p->x.d, p->S1.d, p->S2.d, p->U1.d, p->U2.d, g_ref, rx, r1, r2, rb);
    const double e[4] = {rel_err(dx.d, rx, dx.n), rel_err(d1.d, r1, ik), rel_err(d2.d, r2, ko),
                         rel_err(db.d, rb, s->out)};
    cr_expect(e[0] < t && e[1] < t && e[2] < t && e[3] < t,
              "dev %d dtype %d act %d p %g mode %d%s: backward dx %.3g dS1 %.3g dS2 %.3g "
              "db %.3g, bound %.3g", dev, dt, act, drop, mode, relu_y ? " (y as pre)" : "",
              e[0], e[1], e[2], e[3], t);
    if (dev == KF_DEVICE_CUDA) {
        for (int i = 0; i < 7; i++) unplace(dev, din[i]);
        for (int i = 0; i < 6; i++) unplace(dev, dout[i]);
    }
    free(rx), free(r1), free(r2), free(rb), free(pre_ref), free(y_ref), free(g_ref);
    for (int i = 0; i < 6; i++) free_buf(out[i]);
    kf_sklinear_plan_destroy(plan);
}

/* Every activation, dropout and dtype on one shape on a `dev` context. */
static void check_dev(kf_context *ctx, kf_device_type dev, const shape *s) {
    const kf_dtype dts[] = {KF_DTYPE_F32, KF_DTYPE_F64, KF_DTYPE_BF16, KF_DTYPE_F16};
    for (int di = 0; di < 4; di++) {
        prob p = make_prob(dts[di], s, 42 + (uint64_t)di);
        for (int act = KF_ACTIVATION_NONE; act <= KF_ACTIVATION_SILU; act++)
            for (int drop = 0; drop < 2; drop++)
                check_one(ctx, dev, &p, act, drop ? 0.3f : 0.0f, KF_MODE_TRAINING, 0);
        /* inference: no dropout; ReLU's backward through y */
        check_one(ctx, dev, &p, KF_ACTIVATION_GELU, 0.3f, KF_MODE_INFERENCE, 0);
        check_one(ctx, dev, &p, KF_ACTIVATION_RELU, 0.3f, KF_MODE_TRAINING, 1);
        free_prob(&p);
    }
}

/* check_dev on the CPU, in a context of the given ISA (NULL: the default; "avx2": the
 * baseline build). */
static void check_all(const char *isa, const shape *s) {
    if (isa) setenv("KF_CPU_ISA", isa, 1);
    else unsetenv("KF_CPU_ISA");
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 2);
    check_dev(ctx, KF_DEVICE_CPU, s);
    kf_context_destroy(ctx);
    unsetenv("KF_CPU_ISA");
}

Test(sklinear_epilogue, row_split) { check_all(NULL, &kShapes[0]); }
Test(sklinear_epilogue, wide_split) { check_all(NULL, &kShapes[1]); }
Test(sklinear_epilogue, blocks) { check_all(NULL, &kShapes[2]); }
Test(sklinear_epilogue, row_split_avx2) { check_all("avx2", &kShapes[0]); }
Test(sklinear_epilogue, wide_split_avx2) { check_all("avx2", &kShapes[1]); }
Test(sklinear_epilogue, blocks_avx2) { check_all("avx2", &kShapes[2]); }

/* The same on a CUDA context (skipped without a device): float32 on its own kernels (the first
 * two shapes' forward fused, the third's split: 2r > 256), the other dtypes on the plain path;
 * against the same reference and mask, so CUDA's mask bits are the CPU's. */
Test(sklinear_epilogue, cuda) {
    kf_context *ctx = make_ctx(KF_DEVICE_CUDA, 0);
    for (int i = 0; i < 3; i++) check_dev(ctx, KF_DEVICE_CUDA, &kShapes[i]);
    kf_context_destroy(ctx);
}

/* The mask depends on the seed and offset: another seed, or the offset moved by one, changes
 * it (about 30% of elements differ), and a whole call's mask is its elements' masks. */
Test(sklinear_epilogue, mask_follows_seed_and_offset) {
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    const shape s = {8, 16, 32, 1, 4};
    prob p = make_prob(KF_DTYPE_F32, &s, 7);
    kf_sklinear_plan *plan = plan_of(ctx, &p, KF_ACTIVATION_NONE, 0.5f);
    const int64_t ny = s.N * s.out;
    float *y[3];
    const uint64_t seeds[3] = {1, 2, 1}, offs[3] = {0, 0, 1};
    for (int v = 0; v < 3; v++) {
        y[v] = poisoned(ny);
        kf_sklinear_forward_args f;
        kf_sklinear_forward_args_init(&f);
        f.x = t2(&p, p.x.b, s.N, s.in);
        params(&p, &f.S1s, &f.S2s, &f.U1s, &f.U2s);
        f.bias = tens(p.b.b, p.dt, 1, (int64_t[]){s.out});
        f.y = t2(&p, y[v], s.N, s.out);
        f.mode = KF_MODE_TRAINING, f.dropout_seed = seeds[v], f.dropout_offset = offs[v];
        KF_OK_(kf_sklinear_forward(plan, &f, NULL, 0));
    }
    int diff_seed = 0, diff_off = 0, zeros = 0;
    for (int64_t i = 0; i < ny; i++) {
        diff_seed += (y[0][i] == 0) != (y[1][i] == 0);
        diff_off += (y[0][i] == 0) != (y[2][i] == 0);
        zeros += y[0][i] == 0;
        /* offset 1 shifts the counters by one: element i of call 2 is element i + 1's draw */
        if (i + 1 < ny) cr_expect((y[2][i] == 0) == !ref_skl_keep(1, (uint64_t)i + 1, 0.5f));
    }
    cr_expect(diff_seed > ny / 4 && diff_off > ny / 4, "masks barely differ: %d %d of %lld",
              diff_seed, diff_off, (long long)ny);
    cr_expect(zeros > ny / 4 && zeros < 3 * ny / 4, "%d of %lld dropped at p = 0.5", zeros,
              (long long)ny);
    for (int v = 0; v < 3; v++) free(y[v]);
    free_prob(&p);
    kf_sklinear_plan_destroy(plan);
    kf_context_destroy(ctx);
}

Test(sklinear_epilogue, bad_input_names_the_field) {
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    kf_sklinear_desc d;
    kf_sklinear_desc_init(&d);
    d.in_features = 8, d.out_features = 8, d.num_terms = 1, d.low_rank = 2;
    kf_sklinear_plan *plan = NULL;
    d.activation = 5;
    EXPECT_FAIL(kf_sklinear_plan_create(ctx, &d, &plan), KF_ERR_INVALID_ARGUMENT,
                "desc->activation");
    d.activation = -1;
    EXPECT_FAIL(kf_sklinear_plan_create(ctx, &d, &plan), KF_ERR_INVALID_ARGUMENT,
                "desc->activation");
    d.activation = KF_ACTIVATION_NONE;
    const float bad[] = {1.0f, -0.1f, NAN, 1.5f};
    for (int i = 0; i < 4; i++) {
        d.dropout = bad[i];
        EXPECT_FAIL(kf_sklinear_plan_create(ctx, &d, &plan), KF_ERR_INVALID_ARGUMENT,
                    "desc->dropout");
        cr_expect(plan == NULL);
    }

    /* a plan with GELU: its backward needs pre; a mode outside kf_mode is refused */
    const shape s = {3, 8, 8, 1, 2};
    prob p = make_prob(KF_DTYPE_F32, &s, 3);
    plan = plan_of(ctx, &p, KF_ACTIVATION_GELU, 0.0f);
    float *y = poisoned(24), *dx = poisoned(24);
    kf_sklinear_forward_args f;
    kf_sklinear_forward_args_init(&f);
    f.x = t2(&p, p.x.b, 3, 8);
    params(&p, &f.S1s, &f.S2s, &f.U1s, &f.U2s);
    f.bias = tens(p.b.b, p.dt, 1, (int64_t[]){8});
    f.y = t2(&p, y, 3, 8);
    f.mode = 7;
    EXPECT_FAIL(kf_sklinear_forward(plan, &f, NULL, 0), KF_ERR_INVALID_ARGUMENT, "args->mode");
    cr_expect(isnan(y[0]), "nothing written on a refused call");
    f.mode = KF_MODE_TRAINING;
    f.pre = t2(&p, y, 3, 7);
    EXPECT_FAIL(kf_sklinear_forward(plan, &f, NULL, 0), KF_ERR_INVALID_ARGUMENT, "args->pre");
    kf_sklinear_backward_args a;
    kf_sklinear_backward_args_init(&a);
    a.x = f.x, a.S1s = f.S1s, a.S2s = f.S2s, a.U1s = f.U1s, a.U2s = f.U2s;
    a.dy = t2(&p, p.dy.b, 3, 8);
    a.dx = t2(&p, dx, 3, 8);
    EXPECT_FAIL(kf_sklinear_backward(plan, KF_GRAD_OVERWRITE, &a, NULL, 0),
                KF_ERR_INVALID_ARGUMENT, "args->pre");
    cr_expect(isnan(dx[0]), "nothing written on a refused call");
    kf_sklinear_plan_destroy(plan);

    /* no activation: a pre given to backward is a mistake */
    plan = plan_of(ctx, &p, KF_ACTIVATION_NONE, 0.0f);
    a.pre = a.dy;
    EXPECT_FAIL(kf_sklinear_backward(plan, KF_GRAD_OVERWRITE, &a, NULL, 0),
                KF_ERR_INVALID_ARGUMENT, "args->pre");
    kf_sklinear_plan_destroy(plan);
    free(y), free(dx);
    free_prob(&p);
    kf_context_destroy(ctx);
}

/* A caller built against 1.7's header passes the shorter structs: still served, no epilogue. */
Test(sklinear_epilogue, older_structs_accepted) {
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    const shape s = {3, 8, 8, 1, 2};
    prob p = make_prob(KF_DTYPE_F32, &s, 5);
    kf_sklinear_desc d;
    kf_sklinear_desc_init(&d);
    d.in_features = 8, d.out_features = 8, d.num_terms = 1, d.low_rank = 2;
    d.struct_size = offsetof(kf_sklinear_desc, activation);
    d.activation = 99; /* beyond the old layout: never read */
    kf_sklinear_plan *plan = NULL;
    KF_OK_(kf_sklinear_plan_create(ctx, &d, &plan));
    float *y = poisoned(24);
    kf_sklinear_forward_args f;
    kf_sklinear_forward_args_init(&f);
    f.struct_size = offsetof(kf_sklinear_forward_args, mode);
    f.x = t2(&p, p.x.b, 3, 8);
    params(&p, &f.S1s, &f.S2s, &f.U1s, &f.U2s);
    f.bias = tens(p.b.b, p.dt, 1, (int64_t[]){8});
    f.y = t2(&p, y, 3, 8);
    f.mode = 99;
    KF_OK_(kf_sklinear_forward(plan, &f, NULL, 0));
    double ref[24];
    const ref_skl_cfg c = {3, 8, 8, 1, 2};
    ref_skl_forward(&c, p.x.d, p.S1.d, p.S2.d, p.U1.d, p.U2.d, p.b.d, ref);
    double got[24];
    for (int i = 0; i < 24; i++) got[i] = y[i];
    cr_expect(rel_err(got, ref, 24) < 1e-5);
    free(y);
    free_prob(&p);
    kf_sklinear_plan_destroy(plan);
    kf_context_destroy(ctx);
}

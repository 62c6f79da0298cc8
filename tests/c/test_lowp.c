/* bfloat16 and float16 plans through the public API: every op (GRU, A-GRU, SKLinear,
 * KANLinear, KANConv2d) forward, backward with its reserve, KF_GRAD_ACCUMULATE, and the grid
 * update, against float64 on the same inputs; on the CPU, and (lowp::cuda_*, skipped without a
 * device) the same checks with the low plan on a CUDA context, its tensors in device memory.
 *
 * The float64 side is the library's float64 plan of the same layer (KF_DTYPE_F64), which
 * tests/c/test_{rnn,sklinear,kan}_f64.c hold within 1e-12 of the float64 references of
 * tests/c/ref_*.c; here the GRU and KANLinear forward are also compared with ref_* directly.
 * Inputs are drawn in float64 and rounded to the low type first, so both sides see the same
 * numbers, and low outputs are NaN-poisoned before each call.
 *
 * The bound: a low-precision output is the float32 result rounded once to nearest, so
 * ||out - ref|| / ||ref|| <= u + e32, with u the type's unit roundoff (2^-8 bfloat16, 2^-11
 * float16) and e32 the float32 computation's own error, under the 1e-5 the float32 tests hold
 * it to at these sizes; accumulated gradients are round(g0 + g) with g0 exact, the same bound.
 * SKLinear and the KAN layers on CUDA (cuda/plain.cuh) round the products' operands too
 * (SKLinear's bottleneck, KAN's bases and combined weight, for the tensor cores): 2u there
 * (measured 0.6-0.8 u on the host emulation of tests/cxx/test_plain.cpp); so do the GRU and A-GRU
 * plans that CUDA runs on that path (cuda/plain_rnn.cuh: each layer's output and dG_x rounded to
 * the type, the recurrence in float32): 3u (measured 0.6-1.3 u there). */
#include "kf_test.h"
#include "lowp_ref.h"
#include "ref_kan.h"
#include "ref_rnn.h"

#include <stdbool.h>

#define E32 1e-5

/* ---- the low types, as the test sees them: tests/c/lowp_ref.h --------------------------- */

static uint16_t low_nan(kf_dtype dt) { return dt == KF_DTYPE_F16 ? 0x7e00u : 0x7fc0u; }

/* ---- tensor slots: one per tensor of a call, held in float64 and in the low type ----------- */

enum { IN, OUT, GRAD }; /* an input; a forward or backward output; a parameter gradient */

typedef struct slot {
    int role;
    int32_t nd;
    int64_t sh[4], n;
    double bound;   /* inputs: U(-bound, bound); 0: filled by the op (knots); parameter
                       gradients: what the accumulating backward adds to, U(-bound, bound) */
    double *d;      /* float64 copy */
    uint16_t *lo;   /* low copy */
    void *dev;      /* the low copy's device mirror (a CUDA problem) */
} slot;

#define MAXS 64

typedef struct prob {
    kf_dtype dt;
    int ns;
    slot s[MAXS];
    bool cuda;      /* the low plan runs on a CUDA context, on the slots' device mirrors */
    double units;   /* the bound's units of u (0: 1, the conversion layer's one rounding) */
} prob;

/* The device the low plans of this test process run on (the lowp::cuda_* tests set CUDA). */
static kf_device_type g_low_device = KF_DEVICE_CPU;

/* The context of the low plans: the CPU context `cpu`, or a CUDA one (skips without a device). */
static kf_context *low_context(kf_context *cpu) {
    return g_low_device == KF_DEVICE_CUDA ? make_ctx(KF_DEVICE_CUDA, 0) : cpu;
}

static void release_low_context(kf_context *low, kf_context *cpu) {
    if (low != cpu) kf_context_destroy(low);
}

static int add(prob *p, int role, double bound, int32_t nd, int64_t a, int64_t b, int64_t c,
               int64_t e) {
    cr_assert(p->ns < MAXS);
    slot *s = &p->s[p->ns];
    *s = (slot){role, nd, {a, b, c, e}, 1, bound, NULL, NULL, NULL};
    for (int i = 0; i < nd; i++) s->n *= s->sh[i];
    s->d = xalloc((size_t)s->n * sizeof(double));
    s->lo = xalloc((size_t)s->n * sizeof(uint16_t));
#ifdef KF_HAVE_CUDA
    if (p->cuda) s->dev = dalloc((size_t)s->n * sizeof(uint16_t));
#endif
    return p->ns++;
}

/* Sets slot i of both copies to low-representable v[j]. */
static void set_slot(prob *p, int i, ref_rng *r, const double *v) {
    slot *s = &p->s[i];
    for (int64_t j = 0; j < s->n; j++) {
        s->lo[j] = to_low(v ? v[j] : ref_rng_uniform(r, -s->bound, s->bound), p->dt);
        s->d[j] = from_low(s->lo[j], p->dt);
    }
}

static void poison_slot(prob *p, int i) {
    slot *s = &p->s[i];
    for (int64_t j = 0; j < s->n; j++) s->d[j] = NAN, s->lo[j] = low_nan(p->dt);
}

static void fill_inputs(prob *p, uint64_t seed) {
    ref_rng r;
    ref_rng_seed(&r, seed);
    for (int i = 0; i < p->ns; i++)
        if (p->s[i].role == IN && p->s[i].bound > 0) set_slot(p, i, &r, NULL);
}

static void free_prob(prob *p) {
    for (int i = 0; i < p->ns; i++) {
        free(p->s[i].d), free(p->s[i].lo);
#ifdef KF_HAVE_CUDA
        cudaFree(p->s[i].dev);
#endif
    }
}

/* The low copy of slot s as the low plan reads it: the host copy, or its device mirror. */
static void *low_data(const prob *p, const slot *s) { return p->cuda ? s->dev : (void *)s->lo; }

/* The tensor of slot i in dtype dt (KF_DTYPE_F64: the float64 copy); i < 0: absent. */
static kf_tensor ten(const prob *p, int i, kf_dtype dt) {
    kf_tensor t = {0};
    if (i < 0) return t;
    const slot *s = &p->s[i];
    return tens(dt == KF_DTYPE_F64 ? (void *)s->d : low_data(p, s), dt, s->nd, s->sh);
}

/* `bytes` of the memory the low plan's context works in (a reserve); release with low_free. */
static void *low_alloc(const prob *p, size_t bytes) {
#ifdef KF_HAVE_CUDA
    if (p->cuda) return dalloc(bytes);
#endif
    return xalloc(bytes);
}

static void low_free(const prob *p, void *m) {
#ifdef KF_HAVE_CUDA
    if (p->cuda) {
        cudaFree(m);
        return;
    }
#endif
    free(m);
}

static void expect_slot(const prob *p, int i, const char *what, const char *name) {
    const slot *s = &p->s[i];
    double *got = xalloc((size_t)s->n * sizeof *got);
    for (int64_t j = 0; j < s->n; j++) got[j] = from_low(s->lo[j], p->dt);
    const double e = ref_rel_err_f64(got, s->d, s->n),
                 tol = (p->units > 0 ? p->units : 1.0) * unit_roundoff(p->dt) + E32;
    cr_expect(e <= tol, "%s %s %s: rel err %.3g > %.3g", what,
              p->dt == KF_DTYPE_BF16 ? "bf16" : "f16", name, e, tol);
    free(got);
}

/* ---- the ops: each builds its slots and runs forward / backward in a dtype ------------------ */

typedef struct op op;
struct op {
    const char *name;
    /* forward (backward = false) or training forward + backward in dtype dt */
    kf_status (*run)(const op *o, prob *p, kf_dtype dt, bool backward, kf_grad_mode mode);
    void *plan[2]; /* [0] float64, [1] the low dtype */
    int out0, nout; /* forward outputs: slots out0 .. out0 + nout - 1 */
    int g0, ng;     /* backward outputs (dx first, then parameter gradients) */
    const char *const *names;
    ref_rnn_cfg rc;  /* the recurrent ops */
    int32_t *lengths; /* and their lengths [B], or NULL (all T) */
    int64_t N, in, out; /* SKLinear, KAN */
    int32_t L, k, G, sk;
    int conv;
    int64_t B, Cin, H, W, Ho, Wo;
    int x, w0;      /* slot of x, first parameter slot */
};

static void *plan_of(const op *o, kf_dtype dt) { return o->plan[dt != KF_DTYPE_F64]; }

/* Runs the op in the low dtype; on a CUDA problem every slot's low copy goes to its device
 * mirror first and comes back after (the outputs, and the untouched rest unchanged). */
static kf_status run_low(const op *o, prob *p, bool backward, kf_grad_mode mode) {
#ifdef KF_HAVE_CUDA
    if (p->cuda) {
        for (int i = 0; i < p->ns; i++)
            CUDA_OK(cudaMemcpy(p->s[i].dev, p->s[i].lo, (size_t)p->s[i].n * 2,
                               cudaMemcpyHostToDevice));
        const kf_status st = o->run(o, p, p->dt, backward, mode);
        CUDA_OK(cudaDeviceSynchronize());
        for (int i = 0; i < p->ns; i++)
            CUDA_OK(cudaMemcpy(p->s[i].lo, p->s[i].dev, (size_t)p->s[i].n * 2,
                               cudaMemcpyDeviceToHost));
        return st;
    }
#endif
    return o->run(o, p, p->dt, backward, mode);
}

/* Runs the op in float64 and in the low dtype; checks outputs [lo, lo + n). */
static void run_both(const op *o, prob *p, bool backward, kf_grad_mode mode, int lo, int n,
                     const char *what) {
    for (int i = lo; i < lo + n; i++)
        if (mode == KF_GRAD_OVERWRITE || p->s[i].role != GRAD) poison_slot(p, i);
    KF_OK_(o->run(o, p, KF_DTYPE_F64, backward, mode));
    KF_OK_(run_low(o, p, backward, mode));
    for (int i = lo; i < lo + n; i++) expect_slot(p, i, what, o->names[i - o->out0]);
}

/* Forward, backward, and backward accumulating into random gradients; then a tensor of the
 * wrong dtype refused by name with nothing written. */
static void check_op(const op *o, prob *p, uint64_t seed) {
    fill_inputs(p, seed);
    run_both(o, p, false, KF_GRAD_OVERWRITE, o->out0, o->nout, o->name);
    run_both(o, p, true, KF_GRAD_OVERWRITE, o->g0, o->ng, o->name);
    ref_rng r;
    ref_rng_seed(&r, seed ^ 0x5eed);
    for (int i = o->g0; i < o->g0 + o->ng; i++)
        if (p->s[i].role == GRAD) set_slot(p, i, &r, NULL);
    run_both(o, p, true, KF_GRAD_ACCUMULATE, o->g0, o->ng, o->name);

    /* x handed over as float32 bits: refused naming args->x, y untouched */
    poison_slot(p, o->out0);
    const kf_dtype low = p->dt;
    slot *x = &p->s[o->x];
    const int32_t nd = x->nd;
    x->nd = -nd; /* marks "wrong dtype" for the run functions */
    kf_status st = run_low(o, p, false, KF_GRAD_OVERWRITE);
    x->nd = nd;
    cr_expect(st == KF_ERR_INVALID_ARGUMENT, "%s: mixed dtype: %s", o->name, kf_status_string(st));
    cr_expect(strstr(kf_last_error_message(), "args->x") != NULL, "%s: \"%s\"", o->name,
              kf_last_error_message());
    for (int64_t j = 0; j < p->s[o->out0].n; j++)
        if (p->s[o->out0].lo[j] != low_nan(low)) {
            cr_expect(0, "%s: a refused call wrote y[%lld]", o->name, (long long)j);
            break;
        }
}

/* x's tensor, or (nd < 0) the same memory declared float32. */
static kf_tensor x_ten(const prob *p, int i, kf_dtype dt) {
    const slot *s = &p->s[i];
    if (s->nd > 0) return ten(p, i, dt);
    return tens(low_data(p, s), KF_DTYPE_F32, -s->nd, s->sh); /* refused before a read */
}

/* ---- SKLinear ------------------------------------------------------------------------------- */

/* Slots: x, S1, S2, U1, U2, bias, y, dy, dx, dS1, dS2, db. */
static kf_status skl_run(const op *o, prob *p, kf_dtype dt, bool backward, kf_grad_mode mode) {
    const int x = o->x, w = o->w0;
    if (!backward) {
        kf_sklinear_forward_args a;
        kf_sklinear_forward_args_init(&a);
        a.x = x_ten(p, x, dt), a.S1s = ten(p, w, dt), a.S2s = ten(p, w + 1, dt);
        a.U1s = ten(p, w + 2, dt), a.U2s = ten(p, w + 3, dt), a.bias = ten(p, w + 4, dt);
        a.y = ten(p, o->out0, dt);
        return kf_sklinear_forward(plan_of(o, dt), &a, NULL, 0);
    }
    kf_sklinear_backward_args a;
    kf_sklinear_backward_args_init(&a);
    a.x = ten(p, x, dt), a.S1s = ten(p, w, dt), a.S2s = ten(p, w + 1, dt);
    a.U1s = ten(p, w + 2, dt), a.U2s = ten(p, w + 3, dt);
    a.dy = ten(p, o->out0 + 1, dt);
    a.dx = ten(p, o->g0, dt), a.dS1s = ten(p, o->g0 + 1, dt), a.dS2s = ten(p, o->g0 + 2, dt);
    a.dbias = ten(p, o->g0 + 3, dt);
    return kf_sklinear_backward(plan_of(o, dt), mode, &a, NULL, 0);
}

static void check_skl(kf_dtype dt, int64_t N, int64_t in, int64_t out, int32_t L, int32_t k) {
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 2), *lctx = low_context(ctx);
    op o = {.name = "sklinear", .run = skl_run};
    prob p = {.dt = dt, .cuda = lctx != ctx};
    p.units = p.cuda ? 2.0 : 1.0; /* the CUDA path's rounded operands (header comment) */
    const double wb = 1.0 / sqrt((double)k);
    o.x = add(&p, IN, 1.0, 2, N, in, 0, 0);
    o.w0 = add(&p, IN, wb, 3, L, in, k, 0);
    add(&p, IN, wb, 3, L, k, out, 0);
    add(&p, IN, wb, 3, L, k, out, 0);
    add(&p, IN, wb, 3, L, in, k, 0);
    add(&p, IN, 1.0 / sqrt((double)out), 1, out, 0, 0, 0);
    o.out0 = add(&p, OUT, 0, 2, N, out, 0, 0), o.nout = 1;
    add(&p, IN, 1.0, 2, N, out, 0, 0); /* dy: slot out0 + 1 */
    o.g0 = add(&p, OUT, 0, 2, N, in, 0, 0), o.ng = 4;
    add(&p, GRAD, 1.0, 3, L, in, k, 0);
    add(&p, GRAD, 1.0, 3, L, k, out, 0);
    add(&p, GRAD, 1.0, 1, out, 0, 0, 0);
    /* names index from out0: y, dy (unused), dx, ... */
    static const char *const names[] = {"y", "dy", "dx", "dS1s", "dS2s", "dbias"};
    o.names = names;
    for (int i = 0; i < 2; i++) {
        kf_sklinear_desc d;
        kf_sklinear_desc_init(&d);
        d.in_features = in, d.out_features = out, d.num_terms = L, d.low_rank = k, d.bias = 1;
        d.dtype = i ? dt : KF_DTYPE_F64;
        KF_OK_(kf_sklinear_plan_create(i ? lctx : ctx, &d, (kf_sklinear_plan **)&o.plan[i]));
    }
    check_op(&o, &p, (uint64_t)(N * 7 + in));
    for (int i = 0; i < 2; i++) kf_sklinear_plan_destroy(o.plan[i]);
    free_prob(&p);
    release_low_context(lctx, ctx);
    kf_context_destroy(ctx);
}

Test(lowp, sklinear) {
    check_skl(KF_DTYPE_BF16, 9, 24, 20, 2, 3);
    check_skl(KF_DTYPE_F16, 9, 24, 20, 2, 3);
    /* x, y, dy, dx of 81920 elements: the vector conversions split over 2 threads */
    check_skl(KF_DTYPE_BF16, 320, 256, 256, 1, 16);
    check_skl(KF_DTYPE_F16, 320, 256, 256, 1, 16);
    /* the CPU's wide split (few rows, in and out over two blocks each); a bottleneck wider than
     * the float32 plans take on kf__rowgemm (2r = 144); one over 256, whose y and dx the CPU
     * rounds through float32 blocks (cpu/sklinear_cpu.h, skl_direct) */
    check_skl(KF_DTYPE_BF16, 64, 640, 576, 2, 8);
    check_skl(KF_DTYPE_F16, 64, 640, 576, 2, 8);
    check_skl(KF_DTYPE_BF16, 40, 48, 40, 3, 24);
    check_skl(KF_DTYPE_F16, 40, 48, 40, 3, 24);
    check_skl(KF_DTYPE_BF16, 20, 40, 36, 3, 48);
    check_skl(KF_DTYPE_F16, 300, 40, 36, 3, 48);
    /* dS1 = x^T dZ widens a tile's mr elements of a column of x (kf__lp_load_part) where k
     * takes a vector (k >= 8): in = 23, 21, 19 leave a last tile of 5, 3, 1 rows (the shapes
     * above: 6, 4, 2) */
    check_skl(KF_DTYPE_BF16, 9, 23, 20, 2, 8);
    check_skl(KF_DTYPE_F16, 9, 21, 20, 2, 8);
    check_skl(KF_DTYPE_F16, 9, 19, 20, 2, 8);
}

/* ---- KANLinear and KANConv2d ----------------------------------------------------------------
 * Slots: x, grid, base, spline, scaler, y, dy, dx, dbase, dspline, dscaler. */

#define KAN_INPUTS(a, o, p, dt)                                                                   \
    ((a).grid = ten(p, (o)->w0, dt), (a).base_weight = ten(p, (o)->w0 + 1, dt),                   \
     (a).spline_weight = ten(p, (o)->w0 + 2, dt), (a).spline_scaler = ten(p, (o)->w0 + 3, dt))
#define KAN_GRADS(a, o, p, dt)                                                                    \
    ((a).dy = ten(p, (o)->out0 + 1, dt), (a).dx = ten(p, (o)->g0, dt),                            \
     (a).dbase_weight = ten(p, (o)->g0 + 1, dt), (a).dspline_weight = ten(p, (o)->g0 + 2, dt),    \
     (a).dspline_scaler = ten(p, (o)->g0 + 3, dt))

static kf_status kan_run(const op *o, prob *p, kf_dtype dt, bool backward, kf_grad_mode mode) {
    if (!o->conv && !backward) {
        kf_kan_linear_forward_args a;
        kf_kan_linear_forward_args_init(&a);
        a.x = x_ten(p, o->x, dt), KAN_INPUTS(a, o, p, dt), a.y = ten(p, o->out0, dt);
        return kf_kan_linear_forward(plan_of(o, dt), &a, NULL, 0);
    }
    if (!o->conv) {
        kf_kan_linear_backward_args a;
        kf_kan_linear_backward_args_init(&a);
        a.x = ten(p, o->x, dt), KAN_INPUTS(a, o, p, dt), KAN_GRADS(a, o, p, dt);
        return kf_kan_linear_backward(plan_of(o, dt), mode, &a, NULL, 0);
    }
    if (!backward) {
        kf_kan_conv2d_forward_args a;
        kf_kan_conv2d_forward_args_init(&a);
        a.x = x_ten(p, o->x, dt), KAN_INPUTS(a, o, p, dt), a.y = ten(p, o->out0, dt);
        return kf_kan_conv2d_forward(plan_of(o, dt), &a, NULL, 0);
    }
    kf_kan_conv2d_backward_args a;
    kf_kan_conv2d_backward_args_init(&a);
    a.x = ten(p, o->x, dt), KAN_INPUTS(a, o, p, dt), KAN_GRADS(a, o, p, dt);
    return kf_kan_conv2d_backward(plan_of(o, dt), mode, &a, NULL, 0);
}

/* KANLinear (B = 0) with N rows of `in` features, or KANConv2d 3x3, padding 1, stride 1 over
 * [B, in, 6, 5] images (N = B * 30 patches of 9 * in features). */
static void check_kan(kf_dtype dt, int64_t B, int64_t N, int64_t in, int64_t out, int32_t G,
                      int32_t k) {
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 2), *lctx = low_context(ctx);
    op o = {.name = B ? "kan_conv2d" : "kan_linear", .run = kan_run, .conv = B > 0};
    prob p = {.dt = dt, .cuda = lctx != ctx};
    p.units = p.cuda ? 2.0 : 1.0; /* the CUDA path's rounded operands (header comment) */
    const int64_t F = B ? in * 9 : in, nk = G + 2 * k + 1, rows = B ? B * 30 : N;
    o.x = B ? add(&p, IN, 1.0, 4, B, in, 6, 5) : add(&p, IN, 1.0, 2, N, in, 0, 0);
    o.w0 = add(&p, IN, 0, 2, F, nk, 0, 0); /* knots, below */
    add(&p, IN, 1.0 / sqrt((double)F), 2, out, F, 0, 0);
    add(&p, IN, 0.3, 3, out, F, G + k, 0);
    add(&p, IN, 1.0, 2, out, F, 0, 0);
    o.out0 = B ? add(&p, OUT, 0, 4, B, out, 6, 5) : add(&p, OUT, 0, 2, N, out, 0, 0);
    o.nout = 1;
    (void)(B ? add(&p, IN, 1.0, 4, B, out, 6, 5) : add(&p, IN, 1.0, 2, rows, out, 0, 0)); /* dy */
    o.g0 = B ? add(&p, OUT, 0, 4, B, in, 6, 5) : add(&p, OUT, 0, 2, N, in, 0, 0);
    o.ng = 4;
    add(&p, GRAD, 1.0, 2, out, F, 0, 0);
    add(&p, GRAD, 1.0, 3, out, F, G + k, 0);
    add(&p, GRAD, 1.0, 2, out, F, 0, 0);
    static const char *const names[] = {"y", "dy", "dx", "dbase_weight", "dspline_weight",
                                        "dspline_scaler"};
    o.names = names;
    double *t = xalloc((size_t)(F * nk) * sizeof *t); /* efficient-kan's grid on [-1, 1] */
    for (int64_t f = 0; f < F; f++)
        for (int64_t j = 0; j < nk; j++) t[f * nk + j] = -1.0 + (double)(j - k) * 2.0 / G;
    for (int i = 0; i < 2; i++) {
        const kf_dtype pd = i ? dt : KF_DTYPE_F64;
        if (B) {
            kf_kan_conv2d_desc d;
            kf_kan_conv2d_desc_init(&d);
            d.in_channels = in, d.out_channels = out, d.kernel_h = d.kernel_w = 3;
            d.pad_h = d.pad_w = 1, d.grid_size = G, d.spline_order = k, d.dtype = pd;
            KF_OK_(kf_kan_conv2d_plan_create(i ? lctx : ctx, &d,
                                             (kf_kan_conv2d_plan **)&o.plan[i]));
        } else {
            kf_kan_linear_desc d;
            kf_kan_linear_desc_init(&d);
            d.in_features = in, d.out_features = out, d.grid_size = G, d.spline_order = k;
            d.dtype = pd;
            KF_OK_(kf_kan_linear_plan_create(i ? lctx : ctx, &d,
                                             (kf_kan_linear_plan **)&o.plan[i]));
        }
    }
    fill_inputs(&p, 11);
    set_slot(&p, o.w0, NULL, t);
    free(t);
    check_op(&o, &p, (uint64_t)(rows * 3 + in));
    if (!B) { /* the forward against ref_kan directly, too */
        double *y = xalloc((size_t)(N * out) * sizeof *y);
        const ref_kan_cfg c = {N, in, out, G, k};
        const slot *s = p.s;
        KF_OK_(run_low(&o, &p, false, KF_GRAD_OVERWRITE));
        ref_kan_forward(&c, s[o.x].d, s[o.w0].d, s[o.w0 + 1].d, s[o.w0 + 2].d, s[o.w0 + 3].d, y);
        memcpy(p.s[o.out0].d, y, (size_t)(N * out) * sizeof *y);
        expect_slot(&p, o.out0, "kan_linear vs ref_kan", "y");
        free(y);
    }
    for (int i = 0; i < 2; i++) {
        if (B)
            kf_kan_conv2d_plan_destroy(o.plan[i]);
        else
            kf_kan_linear_plan_destroy(o.plan[i]);
    }
    free_prob(&p);
    release_low_context(lctx, ctx);
    kf_context_destroy(ctx);
}

Test(lowp, kan_linear) {
    check_kan(KF_DTYPE_BF16, 0, 37, 6, 5, 5, 3);
    check_kan(KF_DTYPE_F16, 0, 37, 6, 5, 5, 3);
    check_kan(KF_DTYPE_BF16, 0, 1100, 64, 48, 5, 3); /* x, dx: 70400 elements, threaded */
    check_kan(KF_DTYPE_F16, 0, 1100, 64, 48, 5, 3);
    /* the CPU's windowed path both ways (out >= 256, G = 10), three row blocks */
    check_kan(KF_DTYPE_BF16, 0, 300, 10, 256, 10, 3);
    check_kan(KF_DTYPE_F16, 0, 300, 10, 256, 10, 3);
}

Test(lowp, kan_conv2d) {
    check_kan(KF_DTYPE_BF16, 2, 0, 3, 4, 5, 3);
    check_kan(KF_DTYPE_F16, 2, 0, 3, 4, 5, 3);
    /* the CPU's dense products on BLAS (out > 16) and its windowed path (out >= 256, G = 10) */
    check_kan(KF_DTYPE_BF16, 2, 0, 3, 20, 5, 3);
    check_kan(KF_DTYPE_F16, 2, 0, 2, 256, 10, 3);
}

/* ---- GRU and A-GRU --------------------------------------------------------------------------
 * Slots: x, h0, the nw weights, y, hn, dy, dhn, dx, dh0, the nw weight gradients. */

static kf_status rnn_run(const op *o, prob *p, kf_dtype dt, bool backward, kf_grad_mode mode) {
    const ref_rnn_cfg *c = &o->rc;
    const int nw = ref_rnn_num_weights(c), w = o->w0, y = o->out0, g = o->g0;
    kf_tensor wt[MAXS], dwt[MAXS];
    for (int i = 0; i < nw; i++) wt[i] = ten(p, w + i, dt), dwt[i] = ten(p, g + 2 + i, dt);
    kf_rnn_forward_args a;
    kf_rnn_forward_args_init(&a);
    a.x = x_ten(p, o->x, dt), a.h0 = ten(p, o->x + 1, dt), a.weights = wt, a.num_weights = nw;
    a.y = ten(p, y, dt), a.hn = ten(p, y + 1, dt);
    if (o->lengths) a.lengths = tens(o->lengths, KF_DTYPE_I32, 1, &c->B);
    a.dropout_seed = c->seed, a.dropout_offset = c->offset;
    kf_rnn_plan *plan = plan_of(o, dt);
    if (!backward) return kf_rnn_forward(plan, KF_MODE_INFERENCE, &a, NULL, 0, NULL, 0);
    size_t wsb = 0, rsb = 0;
    KF_OK_(kf_rnn_workspace_size(plan, c->T, c->B, KF_MODE_TRAINING, &wsb, &rsb));
    void *reserve = dt == KF_DTYPE_F64 ? xalloc(rsb) : low_alloc(p, rsb);
    kf_status st = kf_rnn_forward(plan, KF_MODE_TRAINING, &a, NULL, 0, reserve, rsb);
    if (st == KF_OK) {
        kf_rnn_backward_args b;
        kf_rnn_backward_args_init(&b);
        b.x = a.x, b.h0 = a.h0, b.weights = wt, b.num_weights = nw, b.lengths = a.lengths;
        b.dropout_seed = c->seed, b.dropout_offset = c->offset;
        b.dy = ten(p, y + 2, dt), b.dhn = ten(p, y + 3, dt);
        b.dx = ten(p, g, dt), b.dh0 = ten(p, g + 1, dt), b.dweights = dwt, b.num_dweights = nw;
        st = kf_rnn_backward(plan, mode, &b, NULL, 0, reserve, rsb);
    }
    if (dt == KF_DTYPE_F64)
        free(reserve);
    else
        low_free(p, reserve);
    return st;
}

/* check_rnn's options: x, y and their gradients [B, T, .]; lengths 1..T; dropout 0.25 */
enum { RNN_BATCH_FIRST = 1, RNN_LENGTHS = 2, RNN_DROPOUT = 4 };

static void check_rnn_opt(kf_dtype dt, int cell, int L, int D, int64_t I, int64_t H, int64_t T,
                          int64_t B, unsigned opt) {
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 2), *lctx = low_context(ctx);
    op o = {.name = cell == REF_GRU ? "gru" : "agru", .run = rnn_run};
    o.rc = (ref_rnn_cfg){.cell = cell, .L = L, .D = D, .I = I, .H = H, .T = T, .B = B,
                         .gamma = 0.01f, .batch_first = (opt & RNN_BATCH_FIRST) != 0,
                         .dropout = opt & RNN_DROPOUT ? 0.25f : 0.0f, .seed = 11, .offset = 5};
    const ref_rnn_cfg *c = &o.rc;
    const int64_t T0 = c->batch_first ? B : T, T1 = c->batch_first ? T : B; /* x's dims 0, 1 */
    cr_assert(!(opt & RNN_LENGTHS) || lctx == ctx, "lengths on the host only");
    if (opt & RNN_LENGTHS) {
        o.lengths = xalloc((size_t)B * sizeof(int32_t));
        for (int64_t b = 0; b < B; b++) o.lengths[b] = (int32_t)(1 + (b * 5) % T);
    }
    const int nw = ref_rnn_num_weights(c);
    prob p = {.dt = dt, .cuda = lctx != ctx};
    /* CUDA: H = 8, 160, 256 run the plain path, which rounds each layer's output and dG_x (3u,
     * header comment); H = 128 the float32 kernels on converted copies */
    p.units = p.cuda && H != 128 ? 3.0 : 1.0;
    const double wb = 1.0 / sqrt((double)H);
    o.x = add(&p, IN, 1.0, 3, T0, T1, I, 0);
    add(&p, IN, 0.5, 3, (int64_t)L * D, B, H, 0);
    int nd;
    int64_t sh[2];
    for (int i = 0; i < nw; i++) {
        ref_rnn_weight_desc(c, i, NULL, 0, &nd, sh);
        const int j = add(&p, IN, wb, nd, sh[0], sh[1], 0, 0);
        if (i == 0) o.w0 = j;
    }
    o.out0 = add(&p, OUT, 0, 3, T0, T1, (int64_t)D * H, 0), o.nout = 2;
    add(&p, OUT, 0, 3, (int64_t)L * D, B, H, 0);
    add(&p, IN, 1.0, 3, T0, T1, (int64_t)D * H, 0);
    add(&p, IN, 1.0, 3, (int64_t)L * D, B, H, 0);
    o.g0 = add(&p, OUT, 0, 3, T0, T1, I, 0), o.ng = 2 + nw;
    add(&p, OUT, 0, 3, (int64_t)L * D, B, H, 0);
    for (int i = 0; i < nw; i++) {
        ref_rnn_weight_desc(c, i, NULL, 0, &nd, sh);
        add(&p, GRAD, 1.0, nd, sh[0], sh[1], 0, 0);
    }
    static char wnames[MAXS][64];
    const char *names[MAXS] = {"y", "hn", "dy", "dhn", "dx", "dh0"};
    for (int i = 0; i < nw; i++) {
        ref_rnn_weight_desc(c, i, wnames[i], sizeof wnames[i], &nd, sh);
        names[6 + i] = wnames[i];
    }
    o.names = names;
    for (int i = 0; i < 2; i++) {
        kf_rnn_desc d;
        kf_rnn_desc_init(&d);
        d.cell = cell, d.num_layers = L, d.input_size = I, d.hidden_size = H;
        d.flags = (D == 2 ? KF_RNN_BIDIRECTIONAL : 0u) |
                  (c->batch_first ? KF_RNN_BATCH_FIRST : 0u);
        d.gamma = c->gamma, d.dropout = c->dropout;
        d.dtype = i ? dt : KF_DTYPE_F64;
        KF_OK_(kf_rnn_plan_create(i ? lctx : ctx, &d, (kf_rnn_plan **)&o.plan[i]));
    }
    check_op(&o, &p, (uint64_t)(T * 5 + H));
    /* the forward against ref_rnn directly, too */
    const double *w[MAXS];
    for (int i = 0; i < nw; i++) w[i] = p.s[o.w0 + i].d;
    KF_OK_(run_low(&o, &p, false, KF_GRAD_OVERWRITE));
    ref_rnn_forward_f64(c, p.s[o.x].d, p.s[o.x + 1].d, w, o.lengths, p.s[o.out0].d,
                        p.s[o.out0 + 1].d);
    expect_slot(&p, o.out0, "vs ref_rnn", "y");
    expect_slot(&p, o.out0 + 1, "vs ref_rnn", "hn");
    for (int i = 0; i < 2; i++) kf_rnn_plan_destroy(o.plan[i]);
    free(o.lengths);
    free_prob(&p);
    release_low_context(lctx, ctx);
    kf_context_destroy(ctx);
}

static void check_rnn(kf_dtype dt, int cell, int L, int D, int64_t I, int64_t H, int64_t T,
                      int64_t B) {
    check_rnn_opt(dt, cell, L, D, I, H, T, B, 0);
}

/* The CPU's low plans run the float32 kernels (cpu/rnn_fwd.c, rnn_bwd.c) reading and writing the
 * caller's low tensors per slice and step: H = 8 and 20 the backward's paths after the
 * recurrence, H = 32 and 128 its per-step weight gradients and dX (whole panels on AVX2 and
 * AVX-512); two directions sum into one dX; batch-first rows, lengths and dropout move which
 * rows a step reads and writes. */
Test(lowp, gru) {
    check_rnn(KF_DTYPE_BF16, REF_GRU, 2, 2, 5, 8, 7, 3);
    check_rnn(KF_DTYPE_F16, REF_GRU, 2, 2, 5, 8, 7, 3);
    check_rnn(KF_DTYPE_BF16, REF_GRU, 1, 1, 28, 128, 6, 16); /* 8-lane vectors, tails */
    check_rnn(KF_DTYPE_F16, REF_GRU, 1, 1, 28, 128, 6, 16);
    const unsigned all = RNN_BATCH_FIRST | RNN_LENGTHS | RNN_DROPOUT;
    check_rnn_opt(KF_DTYPE_BF16, REF_GRU, 2, 2, 20, 32, 9, 37, all);
    check_rnn_opt(KF_DTYPE_F16, REF_GRU, 2, 2, 20, 32, 9, 37, RNN_LENGTHS);
    check_rnn_opt(KF_DTYPE_F16, REF_GRU, 2, 2, 11, 20, 8, 13, all);
    check_rnn_opt(KF_DTYPE_BF16, REF_GRU, 2, 1, 1, 32, 12, 5, RNN_DROPOUT); /* thin input */
}

Test(lowp, agru) {
    check_rnn(KF_DTYPE_BF16, REF_AGRU, 2, 1, 5, 8, 7, 3);
    check_rnn(KF_DTYPE_F16, REF_AGRU, 2, 1, 5, 8, 7, 3);
    check_rnn_opt(KF_DTYPE_F16, REF_AGRU, 2, 1, 20, 32, 9, 37,
                  RNN_BATCH_FIRST | RNN_LENGTHS | RNN_DROPOUT);
    check_rnn_opt(KF_DTYPE_BF16, REF_AGRU, 1, 1, 28, 128, 6, 16, RNN_LENGTHS);
}

/* ---- the grid update and plan creation ------------------------------------------------------ */

/* The low plan's new knots are the float32 plan's (on the same samples) rounded to the low
 * type, exactly; its coefficients are written (finite). */
static void check_update(kf_dtype dt) {
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    const int64_t N = 40, in = 3, out = 2, G = 5, k = 3, nk = G + 2 * k + 1, C = G + k;
    kf_kan_linear_plan *pl[2];
    const kf_dtype dts[2] = {KF_DTYPE_F32, dt};
    ref_rng r;
    ref_rng_seed(&r, 5);
    uint16_t *x = xalloc((size_t)(N * in) * 2), *grid = xalloc((size_t)(in * nk) * 2);
    uint16_t *sw = xalloc((size_t)(out * in * C) * 2);
    float *xf = xalloc((size_t)(N * in) * 4), *gf = xalloc((size_t)(in * nk) * 4);
    float *swf = xalloc((size_t)(out * in * C) * 4);
    for (int64_t i = 0; i < N * in; i++)
        x[i] = to_low(ref_rng_uniform(&r, -1.5, 1.5), dt), xf[i] = (float)from_low(x[i], dt);
    for (int64_t i = 0; i < in * nk; i++)
        grid[i] = to_low(-1.0 + (double)(i % nk - k) * 2.0 / G, dt),
        gf[i] = (float)from_low(grid[i], dt);
    for (int64_t i = 0; i < out * in * C; i++)
        sw[i] = to_low(ref_rng_uniform(&r, -0.3, 0.3), dt), swf[i] = (float)from_low(sw[i], dt);
    for (int i = 0; i < 2; i++) {
        kf_kan_linear_desc d;
        kf_kan_linear_desc_init(&d);
        d.in_features = in, d.out_features = out, d.grid_size = G, d.spline_order = k;
        d.dtype = dts[i];
        KF_OK_(kf_kan_linear_plan_create(ctx, &d, &pl[i]));
        kf_kan_update_grid_args a;
        kf_kan_update_grid_args_init(&a);
        a.x = tens(i ? (void *)x : xf, dts[i], 2, (int64_t[]){N, in});
        a.grid = tens(i ? (void *)grid : gf, dts[i], 2, (int64_t[]){in, nk});
        a.spline_weight = tens(i ? (void *)sw : swf, dts[i], 3, (int64_t[]){out, in, C});
        KF_OK_(kf_kan_linear_update_grid(pl[i], &a));
        kf_kan_linear_plan_destroy(pl[i]);
    }
    for (int64_t i = 0; i < in * nk; i++)
        cr_expect(grid[i] == to_low(gf[i], dt), "knot %lld: %g, want round(%.9g)", (long long)i,
                  from_low(grid[i], dt), (double)gf[i]);
    for (int64_t i = 0; i < out * in * C; i++)
        cr_expect(isfinite(from_low(sw[i], dt)), "coefficient %lld not finite", (long long)i);
    free(x), free(grid), free(sw), free(xf), free(gf), free(swf);
    kf_context_destroy(ctx);
}

Test(lowp, kan_update_grid) {
    check_update(KF_DTYPE_BF16);
    check_update(KF_DTYPE_F16);
}

/* The same checks with the low plans on a CUDA context (skipped without a device): SKLinear, the
 * KAN layers, and the GRU and A-GRU at H = 8 on cuda/plain.cu's tensor-core path; the GRU at
 * H = 128 on the persistent float32 kernels under core/lowp_ops.c's conversions (cuda/lowp.cu
 * converting). Shapes: SKLinear small and at 1024 x 512, KANLinear small and with 4 M outputs,
 * KANConv2d, GRU and A-GRU. */
Test(lowp, cuda_sklinear) {
    kf_context_destroy(make_ctx(KF_DEVICE_CUDA, 0));
    g_low_device = KF_DEVICE_CUDA;
    check_skl(KF_DTYPE_BF16, 9, 24, 20, 2, 3);
    check_skl(KF_DTYPE_F16, 64, 1024, 512, 2, 16);
}

Test(lowp, cuda_kan) {
    kf_context_destroy(make_ctx(KF_DEVICE_CUDA, 0));
    g_low_device = KF_DEVICE_CUDA;
    check_kan(KF_DTYPE_BF16, 0, 37, 6, 5, 5, 3);
    check_kan(KF_DTYPE_F16, 0, 4100, 3, 1024, 5, 3);
    check_kan(KF_DTYPE_BF16, 2, 0, 3, 4, 5, 3);
}

Test(lowp, cuda_rnn) {
    kf_context_destroy(make_ctx(KF_DEVICE_CUDA, 0));
    g_low_device = KF_DEVICE_CUDA;
    check_rnn(KF_DTYPE_BF16, REF_GRU, 2, 2, 5, 8, 7, 3);
    check_rnn(KF_DTYPE_F16, REF_GRU, 1, 1, 28, 128, 6, 16);
    check_rnn(KF_DTYPE_BF16, REF_AGRU, 2, 1, 5, 8, 7, 3);
    check_rnn(KF_DTYPE_F16, REF_GRU, 2, 1, 64, 256, 5, 32);  /* the plain path at a real width */
    check_rnn(KF_DTYPE_BF16, REF_AGRU, 1, 1, 48, 160, 4, 8); /* H not a multiple of 32 */
}

/* Panther's initialisation (with and without W_init) and the uniform grid of a low plan are the
 * float32 plan's values, same seed, rounded to the type: bit for bit. */
static void check_setup(kf_dtype dt) {
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    const int64_t in = 12, out = 10, L = 2, k = 3, G = 5, sk = 3, nk = G + 2 * sk + 1;
    const int64_t n[5] = {L * in * k, L * k * out, L * k * out, L * in * k, out};
    const int64_t sh[5][3] = {{L, in, k}, {L, k, out}, {L, k, out}, {L, in, k}, {out, 0, 0}};
    float *f[5], *wf = xalloc((size_t)(out * in) * 4), *gf = xalloc((size_t)(in * nk) * 4);
    uint16_t *lo[5], *wl = xalloc((size_t)(out * in) * 2), *gl = xalloc((size_t)(in * nk) * 2);
    ref_rng r;
    ref_rng_seed(&r, 9);
    for (int64_t i = 0; i < out * in; i++)
        wl[i] = to_low(ref_rng_uniform(&r, -0.5, 0.5), dt), wf[i] = (float)from_low(wl[i], dt);
    for (int t = 0; t < 5; t++) f[t] = xalloc((size_t)n[t] * 4), lo[t] = xalloc((size_t)n[t] * 2);
    for (int with_w = 0; with_w < 2; with_w++) {
        for (int i = 0; i < 2; i++) {
            const kf_dtype pd = i ? dt : KF_DTYPE_F32;
            kf_sklinear_desc d;
            kf_sklinear_desc_init(&d);
            d.in_features = in, d.out_features = out, d.num_terms = L, d.low_rank = k;
            d.dtype = pd;
            kf_sklinear_plan *plan = NULL;
            KF_OK_(kf_sklinear_plan_create(ctx, &d, &plan));
            kf_sklinear_init_args a;
            kf_sklinear_init_args_init(&a);
            a.seed = 77;
            if (with_w) a.W_init = tens(i ? (void *)wl : wf, pd, 2, (int64_t[]){out, in});
            kf_tensor *t[5] = {&a.S1s, &a.S2s, &a.U1s, &a.U2s, &a.bias};
            for (int j = 0; j < 5; j++)
                *t[j] = tens(i ? (void *)lo[j] : f[j], pd, j < 4 ? 3 : 1, sh[j]);
            KF_OK_(kf_sklinear_init_params(plan, &a));
            kf_sklinear_plan_destroy(plan);
        }
        for (int j = 0; j < 5; j++)
            for (int64_t e = 0; e < n[j]; e++)
                if (lo[j][e] != to_low(f[j][e], dt)) {
                    cr_expect(0, "init tensor %d element %lld (W_init %d): %g, want round(%.9g)",
                              j, (long long)e, with_w, from_low(lo[j][e], dt), (double)f[j][e]);
                    break;
                }
    }
    for (int i = 0; i < 2; i++) {
        kf_kan_linear_desc d;
        kf_kan_linear_desc_init(&d);
        d.in_features = in, d.out_features = out, d.grid_size = G, d.spline_order = sk;
        d.dtype = i ? dt : KF_DTYPE_F32;
        kf_kan_linear_plan *plan = NULL;
        KF_OK_(kf_kan_linear_plan_create(ctx, &d, &plan));
        kf_tensor g = tens(i ? (void *)gl : gf, d.dtype, 2, (int64_t[]){in, nk});
        KF_OK_(kf_kan_linear_uniform_grid(plan, -1.3f, 0.7f, &g));
        kf_kan_linear_plan_destroy(plan);
    }
    for (int64_t e = 0; e < in * nk; e++)
        cr_expect(gl[e] == to_low(gf[e], dt), "knot %lld: %g, want round(%.9g)", (long long)e,
                  from_low(gl[e], dt), (double)gf[e]);
    for (int t = 0; t < 5; t++) free(f[t]), free(lo[t]);
    free(wf), free(wl), free(gf), free(gl);
    kf_context_destroy(ctx);
}

Test(lowp, init_and_uniform_grid) {
    check_setup(KF_DTYPE_BF16);
    check_setup(KF_DTYPE_F16);
}

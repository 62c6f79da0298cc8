/* The CUDA backend of kf_kan_linear_* against the CPU backend (which test_kan_linear.c holds to
 * the float64 reference), through the public header only. Same random problem on both contexts;
 * every CUDA output poisoned (all bits set: NaN) before each call; ||cuda - cpu|| / ||cpu|| < 1e-5
 * for y, dx, d base_weight, d spline_weight, d spline_scaler, and again after a second backward
 * in accumulate mode. Problems cover G in {1, 5, 8}, k in {0, 1, 3} (and 5, the wider window),
 * uniform, sorted random and repeated-knot grids, x outside the grid and exactly on knots, batch
 * 1, sizes that are multiples of nothing, more than 64 columns per feature (G = 70), the split
 * paths (small N: forward split over features, dW split over rows), the materialised path
 * (N out >= 2^22: A by chunks of rows, cuBLAS products), (1024, 256, 256), and no
 * spline_scaler. Also: a forward captured in a CUDA graph on a user stream replays to the eager
 * result. (Float64 plans on CUDA: test_kan_f64.c, against the float64 reference.)
 *
 * Without a CUDA build, or with no usable device (KF_ERR_BACKEND_UNAVAILABLE), every test skips. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kfuse.h"
#include "kf_test.h"
#include "ref_rnn.h"

#ifdef KF_HAVE_CUDA
#define TOL 1e-5

enum grid_kind { GRID_UNIFORM = 0, GRID_RANDOM = 1, GRID_REPEATED = 2 };

typedef struct shape {
    int64_t N, in, out;
    int32_t G, k;
    int scaled, grid;
} shape;

/* Inputs: x, grid, base_weight, spline_weight, spline_scaler, dy. */
enum { X, GR, BW, SW, SC, DY, NIN };
/* Outputs: y, dx, dbase_weight, dspline_weight, dspline_scaler. */
enum { Y, DX, DBW, DSW, DSC, NOUT };

typedef struct bufs { float *in[NIN], *out[NOUT]; int64_t n_in[NIN], n_out[NOUT]; } bufs;

static void sizes(const shape *s, int64_t *n_in, int64_t *n_out) {
    const int64_t C = s->G + s->k, nk = s->G + 2 * s->k + 1, oi = s->out * s->in;
    int64_t ni[NIN] = {s->N * s->in, s->in * nk, oi, oi * C, oi, s->N * s->out};
    int64_t no[NOUT] = {s->N * s->out, s->N * s->in, oi, oi * C, oi};
    memcpy(n_in, ni, sizeof ni);
    memcpy(n_out, no, sizeof no);
}

static kf_kan_linear_plan *make_plan(kf_context *ctx, const shape *s) {
    kf_kan_linear_desc d;
    kf_kan_linear_desc_init(&d);
    d.in_features = s->in, d.out_features = s->out;
    d.grid_size = s->G, d.spline_order = s->k;
    d.standalone_scale = s->scaled;
    kf_kan_linear_plan *plan = NULL;
    KF_OK_(kf_kan_linear_plan_create(ctx, &d, &plan));
    return plan;
}

static kf_kan_linear_forward_args fwd_args(const shape *s, bufs *b) {
    const int64_t C = s->G + s->k, nk = s->G + 2 * s->k + 1;
    kf_kan_linear_forward_args f;
    kf_kan_linear_forward_args_init(&f);
    f.x = t3(b->in[X], 2, s->N, s->in, 0);
    f.grid = t3(b->in[GR], 2, s->in, nk, 0);
    f.base_weight = t3(b->in[BW], 2, s->out, s->in, 0);
    f.spline_weight = t3(b->in[SW], 3, s->out, s->in, C);
    if (s->scaled) f.spline_scaler = t3(b->in[SC], 2, s->out, s->in, 0);
    f.y = t3(b->out[Y], 2, s->N, s->out, 0);
    return f;
}

/* On `ctx`, over buffers `b` of that context's memory: with KF_GRAD_OVERWRITE a forward and a
 * backward; with KF_GRAD_ACCUMULATE a backward that adds onto the gradients already there. */
static void run(kf_context *ctx, const shape *s, bufs *b, kf_grad_mode mode) {
    const int64_t C = s->G + s->k;
    kf_kan_linear_plan *plan = make_plan(ctx, s);
    kf_kan_linear_forward_args f = fwd_args(s, b);
    if (mode == KF_GRAD_OVERWRITE) KF_OK_(kf_kan_linear_forward(plan, &f, NULL, 0));
    kf_kan_linear_backward_args g;
    kf_kan_linear_backward_args_init(&g);
    g.x = f.x, g.grid = f.grid, g.base_weight = f.base_weight;
    g.spline_weight = f.spline_weight, g.spline_scaler = f.spline_scaler;
    g.dy = t3(b->in[DY], 2, s->N, s->out, 0);
    g.dx = t3(b->out[DX], 2, s->N, s->in, 0);
    g.dbase_weight = t3(b->out[DBW], 2, s->out, s->in, 0);
    g.dspline_weight = t3(b->out[DSW], 3, s->out, s->in, C);
    if (s->scaled) g.dspline_scaler = t3(b->out[DSC], 2, s->out, s->in, 0);
    KF_OK_(kf_kan_linear_backward(plan, mode, &g, NULL, 0));
    KF_OK_(kf_context_synchronize(ctx));
    kf_kan_linear_plan_destroy(plan);
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Knots: efficient-kan's uniform grid on [-1, 1] (through the CPU context), or sorted
 * U(-1.5, 1.5) per feature, optionally with a double knot per feature (a triple in every
 * third). x: over the feature's grid widened by 30% each side, one value in six exactly on a
 * knot (first and last included). */
static void make_inputs(const shape *s, ref_rng *r, kf_context *cpu, float **in) {
    const int64_t nk = s->G + 2 * s->k + 1;
    float *grid = in[GR];
    if (s->grid == GRID_UNIFORM) {
        kf_kan_linear_plan *plan = make_plan(cpu, s);
        kf_tensor g = t3(grid, 2, s->in, nk, 0);
        KF_OK_(kf_kan_linear_uniform_grid(plan, -1.0f, 1.0f, &g));
        kf_kan_linear_plan_destroy(plan);
    } else {
        for (int64_t i = 0; i < s->in; i++) {
            float *t = grid + i * nk;
            ref_fill_uniform_f32(r, t, nk, -1.5, 1.5);
            qsort(t, (size_t)nk, sizeof *t, cmp_float);
            if (s->grid == GRID_REPEATED) {
                int64_t m = i % (nk - 1);
                t[m + 1] = t[m];
                if (i % 3 == 0 && m + 2 < nk) t[m + 2] = t[m];
            }
        }
    }
    for (int64_t n = 0; n < s->N; n++)
        for (int64_t i = 0; i < s->in; i++) {
            const float *t = grid + i * nk;
            double lo = t[0], hi = t[nk - 1], w = hi - lo > 0 ? hi - lo : 1.0;
            float v = (float)ref_rng_uniform(r, lo - 0.3 * w, hi + 0.3 * w);
            if (ref_rng_next(r) % 6 == 0) v = t[ref_rng_next(r) % (uint64_t)nk];
            in[X][n * s->in + i] = v;
        }
    const double b = 1.0 / sqrt((double)s->in);
    const int64_t oi = s->out * s->in;
    ref_fill_uniform_f32(r, in[BW], oi, -b, b);
    ref_fill_uniform_f32(r, in[SW], oi * (s->G + s->k), -b, b);
    ref_fill_uniform_f32(r, in[SC], oi, -1.0, 1.0);
    ref_fill_uniform_f32(r, in[DY], s->N * s->out, -1.0, 1.0);
}

static void compare(const char *what, const float *cuda, const float *cpu, int64_t n,
                    const shape *s) {
    double *ref = ref_to_f64(cpu, n);
    double e = ref_rel_err_f32(cuda, ref, n);
    cr_expect(e < TOL, "%s: cuda vs cpu rel err %.3g (N %lld in %lld out %lld G %d k %d grid %d "
              "scaled %d)", what, e, (long long)s->N, (long long)s->in, (long long)s->out, s->G,
              s->k, s->grid, s->scaled);
    free(ref);
}

static void check_shape(const shape *s) {
    kf_context *gpu = make_ctx(KF_DEVICE_CUDA, 0), *cpu = make_ctx(KF_DEVICE_CPU, 0);
    bufs h, dv;
    sizes(s, h.n_in, h.n_out);
    ref_rng r;
    ref_rng_seed(&r, (uint64_t)(s->N * 7 + s->in * 3 + s->G * 11 + s->k));
    for (int i = 0; i < NIN; i++) h.in[i] = malloc((size_t)h.n_in[i] * 4);
    make_inputs(s, &r, cpu, h.in);
    for (int i = 0; i < NIN; i++) dv.in[i] = to_dev(h.in[i], (size_t)h.n_in[i] * sizeof(float));
    for (int i = 0; i < NOUT; i++) {
        h.out[i] = malloc((size_t)h.n_out[i] * 4);
        dv.out[i] = dpoisoned(h.n_out[i]); /* NaN */
    }
    run(cpu, s, &h, KF_GRAD_OVERWRITE);
    run(gpu, s, &dv, KF_GRAD_OVERWRITE);
    const char *names[NOUT] = {"y", "dx", "dbase_weight", "dspline_weight", "dspline_scaler"};
    for (int i = 0; i < NOUT; i++) {
        if (i == DSC && !s->scaled) continue;
        float *got = to_host(dv.out[i], h.n_out[i]);
        compare(names[i], got, h.out[i], h.n_out[i], s);
        free(got);
    }
    /* Accumulate: the gradients from above are added to again (dx overwritten: poisoned). */
    CUDA_OK(cudaMemset(dv.out[DX], 0xFF, (size_t)h.n_out[DX] * 4));
    run(cpu, s, &h, KF_GRAD_ACCUMULATE);
    run(gpu, s, &dv, KF_GRAD_ACCUMULATE);
    for (int i = DX; i < NOUT; i++) {
        if (i == DSC && !s->scaled) continue;
        float *got = to_host(dv.out[i], h.n_out[i]);
        compare(names[i], got, h.out[i], h.n_out[i], s);
        free(got);
    }
    for (int i = 0; i < NIN; i++) free(h.in[i]), cudaFree(dv.in[i]);
    for (int i = 0; i < NOUT; i++) free(h.out[i]), cudaFree(dv.out[i]);
    kf_context_destroy(gpu);
    kf_context_destroy(cpu);
}

static const shape kShapes[] = {
    /* N, in, out, G, k, scaled, grid */
    {37, 13, 11, 5, 3, 1, GRID_UNIFORM},   /* defaults, odd sizes */
    {1, 9, 7, 5, 3, 1, GRID_RANDOM},       /* batch 1 */
    {50, 17, 23, 1, 0, 1, GRID_RANDOM},    /* G = 1, k = 0: piecewise constant, cw = 2 */
    {45, 21, 19, 1, 1, 1, GRID_REPEATED},  /* G = 1, k = 1 */
    {66, 30, 65, 8, 3, 1, GRID_REPEATED},  /* G = 8, repeated knots */
    {70, 19, 33, 8, 1, 0, GRID_RANDOM},    /* no scaler */
    {33, 12, 20, 5, 0, 0, GRID_REPEATED},  /* k = 0, repeated knots, no scaler */
    {29, 10, 14, 6, 5, 1, GRID_RANDOM},    /* k = 5: the wider window */
    {40, 5, 9, 70, 3, 1, GRID_RANDOM},     /* cw = 74 > 64 columns per feature */
    {3, 200, 130, 5, 3, 1, GRID_UNIFORM},  /* few rows: forward split over features */
    {3000, 9, 10, 5, 3, 1, GRID_REPEATED}, /* many rows, few tiles: dW split over rows */
    /* N out >= 2^22: the materialised path (A by chunks: the backward's of rows, the forward's
     * of features; products on cuBLAS in 3xTF32); 8 row chunks, the last one short; k = 5 with
     * no scaler and repeated knots there; forward chunks of 2 features, the last one of 1 */
    {4100, 12, 1024, 5, 3, 1, GRID_RANDOM},
    {2048, 7, 2048, 6, 5, 0, GRID_REPEATED},
    {4096, 21, 1024, 5, 3, 1, GRID_UNIFORM},
    {129, 300, 77, 8, 1, 1, GRID_RANDOM},
};

ParameterizedTestParameters(kan_linear_cuda, matches_cpu) {
    return cr_make_param_array(shape, kShapes, sizeof kShapes / sizeof kShapes[0]);
}

ParameterizedTest(const shape *s, kan_linear_cuda, matches_cpu) { check_shape(s); }

/* The big shapes, in a test of their own so that sanitizer runs can leave them out
 * (--filter 'kan_linear_cuda/!(big_shapes)', benches/gpu.sh): the benchmark shape, and enough
 * rows and outputs that the forward takes its unsplit path with several output tiles. */
Test(kan_linear_cuda, big_shapes) {
    static const shape big[] = {
        {1024, 256, 256, 5, 3, 1, GRID_UNIFORM}, /* the benchmark shape */
        {4096, 32, 256, 5, 3, 1, GRID_RANDOM},   /* unsplit forward, 4 output tiles */
    };
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) check_shape(&big[i]);
}

Test(kan_linear_cuda, graph_capture_replays_forward) {
    kf_context *ctx = make_ctx(KF_DEVICE_CUDA, 0); /* skips without a usable device */
    kf_context *cpu = make_ctx(KF_DEVICE_CPU, 0);
    cudaStream_t st;
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    KF_OK_(kf_context_set_stream(ctx, st));
    /* N small enough that the forward takes its split path (two kernels and the preparation). */
    const shape s = {48, 300, 100, 5, 3, 1, GRID_RANDOM};
    bufs dv, h;
    sizes(&s, dv.n_in, dv.n_out);
    ref_rng r;
    ref_rng_seed(&r, 3);
    for (int i = 0; i < NIN; i++) h.in[i] = malloc((size_t)dv.n_in[i] * 4);
    make_inputs(&s, &r, cpu, h.in);
    for (int i = 0; i < NIN; i++)
        dv.in[i] = to_dev(h.in[i], (size_t)dv.n_in[i] * sizeof(float)), free(h.in[i]);
    float *y_eager = dalloc((size_t)dv.n_out[Y] * sizeof(float));
    float *y_graph = dalloc((size_t)dv.n_out[Y] * sizeof(float));
    kf_kan_linear_plan *plan = make_plan(ctx, &s);
    size_t ws_bytes;
    KF_OK_(kf_kan_linear_workspace_size(plan, s.N, &ws_bytes));
    void *ws = dalloc((ws_bytes / 4 + 16) * sizeof(float));
    dv.out[Y] = y_eager;
    kf_kan_linear_forward_args f = fwd_args(&s, &dv);
    KF_OK_(kf_kan_linear_forward(plan, &f, ws, ws_bytes));
    f.y = t3(y_graph, 2, s.N, s.out, 0);
    CUDA_OK(cudaMemsetAsync(y_graph, 0xFF, (size_t)dv.n_out[Y] * 4, st));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    kf_status s_cap = kf_kan_linear_forward(plan, &f, ws, ws_bytes);
    CUDA_OK(cudaStreamEndCapture(st, &g));
    cr_assert(s_cap == KF_OK, "forward during capture: %s", kf_last_error_message());
    CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
    CUDA_OK(cudaGraphLaunch(ge, st));
    CUDA_OK(cudaStreamSynchronize(st));
    float *a = to_host(y_eager, dv.n_out[Y]), *b = to_host(y_graph, dv.n_out[Y]);
    cr_expect(memcmp(a, b, (size_t)dv.n_out[Y] * 4) == 0, "graph replay differs from eager");
    free(a), free(b);
    CUDA_OK(cudaGraphExecDestroy(ge));
    CUDA_OK(cudaGraphDestroy(g));
    kf_kan_linear_plan_destroy(plan);
    kf_context_destroy(ctx);
    kf_context_destroy(cpu);
    for (int i = 0; i < NIN; i++) cudaFree(dv.in[i]);
    cudaFree(y_eager), cudaFree(y_graph), cudaFree(ws);
    CUDA_OK(cudaStreamDestroy(st));
}

#else
Test(kan_linear_cuda, skipped_without_cuda_build) {
    cr_skip_test("built without the CUDA backend");
}
#endif

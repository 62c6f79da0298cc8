/* The CUDA backend of kf_kan_conv2d_* against the CPU backend, through the public header only
 * (as test_kan_linear_cuda.c does for KANLinear). Same random problem on both contexts; every
 * CUDA output poisoned (all bits set: NaN) before each call; ||cuda - cpu|| / ||cpu|| < 1e-5 for
 * y, dx, d base_weight, d spline_weight, d spline_scaler, and again after a second backward in
 * accumulate mode (dx poisoned again: it is always overwritten). Problems cover 3x3 stride 1
 * pad 1; stride 2, pad 1, dilation 2 with a 3x2 kernel on odd image sizes; stride larger than
 * the kernel (pixels no patch reads: dx 0); a 1x1 kernel; an unbatched 3-D x; G in {1, 3, 5, 8},
 * k in {0, 1, 3, 5}; uniform, sorted random and repeated-knot grids; no spline_scaler; the
 * forward's split over features (few patches); a batch whose dXcol (patches x features, 16M
 * floats at most per group) needs several groups of images, the last one shorter. Also: a
 * forward and backward captured in a CUDA graph on a user stream replay to the eager results.
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
    int64_t B; /* 0: unbatched x [Cin, H, W] (one image) */
    int64_t Cin, H, W, Cout;
    int32_t kh, kw, sh, sw, ph, pw, dh, dw;
    int32_t G, k;
    int scaled, grid;
} shape;

/* Inputs: x, grid, base_weight, spline_weight, spline_scaler, dy. */
enum { X, GR, BW, SW, SC, DY, NIN };
/* Outputs: y, dx, dbase_weight, dspline_weight, dspline_scaler. */
enum { Y, DX, DBW, DSW, DSC, NOUT };

typedef struct bufs { float *in[NIN], *out[NOUT]; int64_t n_in[NIN], n_out[NOUT]; } bufs;

static int64_t images(const shape *s) { return s->B > 0 ? s->B : 1; }
static int64_t feats(const shape *s) { return s->Cin * s->kh * s->kw; }
static int64_t out_h(const shape *s) {
    return (s->H + 2 * s->ph - s->dh * (s->kh - 1) - 1) / s->sh + 1;
}
static int64_t out_w(const shape *s) {
    return (s->W + 2 * s->pw - s->dw * (s->kw - 1) - 1) / s->sw + 1;
}

static void sizes(const shape *s, int64_t *n_in, int64_t *n_out) {
    const int64_t C = s->G + s->k, nk = s->G + 2 * s->k + 1, F = feats(s), oi = s->Cout * F;
    const int64_t nx = images(s) * s->Cin * s->H * s->W;
    const int64_t ny = images(s) * s->Cout * out_h(s) * out_w(s);
    int64_t ni[NIN] = {nx, F * nk, oi, oi * C, oi, ny};
    int64_t no[NOUT] = {ny, nx, oi, oi * C, oi};
    memcpy(n_in, ni, sizeof ni);
    memcpy(n_out, no, sizeof no);
}

/* A float32 tensor of rank `nd` (1..4) over `p`, of shape the first `nd` of {a, b, c, d}. */
static kf_tensor t4(const void *p, int32_t nd, int64_t a, int64_t b, int64_t c, int64_t d) {
    int64_t sh[4] = {a, b, c, d};
    kf_tensor t;
    kf_tensor_init(&t, (void *)p, KF_DTYPE_F32, nd, sh);
    return t;
}

/* An image tensor (x or y): [B, ch, h, w], or [ch, h, w] when unbatched. */
static kf_tensor timg(const shape *s, const void *p, int64_t ch, int64_t h, int64_t w) {
    return s->B > 0 ? t4(p, 4, s->B, ch, h, w) : t4(p, 3, ch, h, w, 0);
}

static kf_kan_conv2d_plan *make_plan(kf_context *ctx, const shape *s) {
    kf_kan_conv2d_desc d;
    kf_kan_conv2d_desc_init(&d);
    d.in_channels = s->Cin, d.out_channels = s->Cout;
    d.kernel_h = s->kh, d.kernel_w = s->kw;
    d.stride_h = s->sh, d.stride_w = s->sw;
    d.pad_h = s->ph, d.pad_w = s->pw;
    d.dilation_h = s->dh, d.dilation_w = s->dw;
    d.grid_size = s->G, d.spline_order = s->k;
    d.standalone_scale = s->scaled;
    kf_kan_conv2d_plan *plan = NULL;
    KF_OK_(kf_kan_conv2d_plan_create(ctx, &d, &plan));
    return plan;
}

static kf_kan_conv2d_forward_args fwd_args(const shape *s, bufs *b) {
    const int64_t C = s->G + s->k, nk = s->G + 2 * s->k + 1, F = feats(s);
    kf_kan_conv2d_forward_args f;
    kf_kan_conv2d_forward_args_init(&f);
    f.x = timg(s, b->in[X], s->Cin, s->H, s->W);
    f.grid = t3(b->in[GR], 2, F, nk, 0);
    f.base_weight = t3(b->in[BW], 2, s->Cout, F, 0);
    f.spline_weight = t3(b->in[SW], 3, s->Cout, F, C);
    if (s->scaled) f.spline_scaler = t3(b->in[SC], 2, s->Cout, F, 0);
    f.y = timg(s, b->out[Y], s->Cout, out_h(s), out_w(s));
    return f;
}

static kf_kan_conv2d_backward_args bwd_args(const shape *s, bufs *b) {
    const int64_t C = s->G + s->k, F = feats(s);
    kf_kan_conv2d_forward_args f = fwd_args(s, b);
    kf_kan_conv2d_backward_args g;
    kf_kan_conv2d_backward_args_init(&g);
    g.x = f.x, g.grid = f.grid, g.base_weight = f.base_weight;
    g.spline_weight = f.spline_weight, g.spline_scaler = f.spline_scaler;
    g.dy = timg(s, b->in[DY], s->Cout, out_h(s), out_w(s));
    g.dx = timg(s, b->out[DX], s->Cin, s->H, s->W);
    g.dbase_weight = t3(b->out[DBW], 2, s->Cout, F, 0);
    g.dspline_weight = t3(b->out[DSW], 3, s->Cout, F, C);
    if (s->scaled) g.dspline_scaler = t3(b->out[DSC], 2, s->Cout, F, 0);
    return g;
}

/* On `ctx`, over buffers `b` of that context's memory: with KF_GRAD_OVERWRITE a forward and a
 * backward; with KF_GRAD_ACCUMULATE a backward that adds onto the gradients already there. */
static void run(kf_context *ctx, const shape *s, bufs *b, kf_grad_mode mode) {
    kf_kan_conv2d_plan *plan = make_plan(ctx, s);
    kf_kan_conv2d_forward_args f = fwd_args(s, b);
    if (mode == KF_GRAD_OVERWRITE) KF_OK_(kf_kan_conv2d_forward(plan, &f, NULL, 0));
    kf_kan_conv2d_backward_args g = bwd_args(s, b);
    KF_OK_(kf_kan_conv2d_backward(plan, mode, &g, NULL, 0));
    KF_OK_(kf_context_synchronize(ctx));
    kf_kan_conv2d_plan_destroy(plan);
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Knots: efficient-kan's uniform grid on [-1, 1] (through the CPU context), or sorted
 * U(-1.5, 1.5) per feature, optionally with a double knot per feature (a triple in every
 * third). x: U(-2, 2) (beyond every grid on both sides), one value in six exactly on a knot of
 * one of the features that read its channel. */
static void make_inputs(const shape *s, ref_rng *r, kf_context *cpu, float **in) {
    const int64_t nk = s->G + 2 * s->k + 1, F = feats(s), khw = (int64_t)s->kh * s->kw;
    float *grid = in[GR];
    if (s->grid == GRID_UNIFORM) {
        kf_kan_conv2d_plan *plan = make_plan(cpu, s);
        kf_tensor g = t3(grid, 2, F, nk, 0);
        KF_OK_(kf_kan_conv2d_uniform_grid(plan, -1.0f, 1.0f, &g));
        kf_kan_conv2d_plan_destroy(plan);
    } else {
        for (int64_t i = 0; i < F; i++) {
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
    const int64_t HW = s->H * s->W, nx = images(s) * s->Cin * HW;
    for (int64_t e = 0; e < nx; e++) {
        float v = (float)ref_rng_uniform(r, -2.0, 2.0);
        if (ref_rng_next(r) % 6 == 0) {
            const int64_t c = e / HW % s->Cin;
            const int64_t f = c * khw + (int64_t)(ref_rng_next(r) % (uint64_t)khw);
            v = grid[f * nk + (int64_t)(ref_rng_next(r) % (uint64_t)nk)];
        }
        in[X][e] = v;
    }
    const double b = 1.0 / sqrt((double)F);
    const int64_t oi = s->Cout * F;
    const int64_t ny = images(s) * s->Cout * out_h(s) * out_w(s);
    ref_fill_uniform_f32(r, in[BW], oi, -b, b);
    ref_fill_uniform_f32(r, in[SW], oi * (s->G + s->k), -b, b);
    ref_fill_uniform_f32(r, in[SC], oi, -1.0, 1.0);
    ref_fill_uniform_f32(r, in[DY], ny, -1.0, 1.0);
}

static void compare(const char *what, const float *cuda, const float *cpu, int64_t n,
                    const shape *s) {
    double *ref = ref_to_f64(cpu, n);
    double e = ref_rel_err_f32(cuda, ref, n);
    cr_expect(e < TOL,
              "%s: cuda vs cpu rel err %.3g (B %lld Cin %lld %lldx%lld Cout %lld kernel %dx%d "
              "stride %d,%d pad %d,%d dil %d,%d G %d k %d grid %d scaled %d)",
              what, e, (long long)s->B, (long long)s->Cin, (long long)s->H, (long long)s->W,
              (long long)s->Cout, s->kh, s->kw, s->sh, s->sw, s->ph, s->pw, s->dh, s->dw, s->G,
              s->k, s->grid, s->scaled);
    free(ref);
}

static void check_shape(const shape *s) {
    kf_context *gpu = make_ctx(KF_DEVICE_CUDA, 0), *cpu = make_ctx(KF_DEVICE_CPU, 0);
    bufs h, dv;
    sizes(s, h.n_in, h.n_out);
    ref_rng r;
    ref_rng_seed(&r, (uint64_t)(images(s) * 7 + s->Cin * 3 + s->H * 5 + s->W * 13 + s->G * 11 +
                                s->k + s->kh * 17 + s->sh * 19));
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
    /* B, Cin, H, W, Cout, kh, kw, sh, sw, ph, pw, dh, dw, G, k, scaled, grid */
    {2, 3, 8, 8, 5, 3, 3, 1, 1, 1, 1, 1, 1, 5, 3, 1, GRID_UNIFORM},    /* 3x3, same size */
    {2, 3, 9, 7, 4, 3, 2, 2, 2, 1, 1, 2, 2, 5, 3, 1, GRID_RANDOM},     /* stride 2 dil 2, odd */
    {3, 2, 11, 10, 6, 2, 3, 3, 4, 0, 2, 1, 1, 3, 1, 1, GRID_REPEATED}, /* stride > kernel */
    {3, 7, 6, 5, 9, 1, 1, 1, 1, 0, 0, 1, 1, 8, 3, 1, GRID_RANDOM},     /* 1x1 kernel */
    {0, 4, 7, 9, 3, 3, 3, 1, 2, 1, 0, 1, 1, 5, 3, 1, GRID_UNIFORM},    /* unbatched 3-D x */
    {2, 5, 10, 9, 7, 3, 3, 1, 1, 1, 1, 1, 1, 4, 2, 0, GRID_RANDOM},    /* no scaler */
    {2, 3, 7, 8, 4, 3, 3, 2, 1, 2, 1, 1, 2, 1, 0, 1, GRID_REPEATED},   /* G = 1, k = 0 */
    {1, 2, 9, 9, 3, 3, 3, 1, 1, 1, 1, 1, 1, 6, 5, 0, GRID_RANDOM},     /* k = 5, no scaler */
    {2, 6, 12, 12, 70, 5, 5, 2, 2, 2, 2, 1, 1, 5, 3, 1, GRID_RANDOM},  /* out > 64, F = 150 */
    {1, 16, 3, 3, 130, 3, 3, 1, 1, 1, 1, 1, 1, 5, 3, 1, GRID_UNIFORM}, /* 9 patches: fwd split */
    {4, 3, 40, 40, 8, 3, 3, 1, 1, 1, 1, 1, 1, 5, 3, 1, GRID_RANDOM},   /* dW split over rows */
};

ParameterizedTestParameters(kan_conv2d_cuda, matches_cpu) {
    return cr_make_param_array(shape, kShapes, sizeof kShapes / sizeof kShapes[0]);
}

ParameterizedTest(const shape *s, kan_conv2d_cuda, matches_cpu) { check_shape(s); }

/* The big shapes, in a test of their own so that sanitizer runs can leave them out
 * (--filter 'kan_conv2d_cuda/!(big_shapes)', benches/gpu.sh). */
Test(kan_conv2d_cuda, big_shapes) {
    static const shape big[] = {
        /* dXcol of one image: 160 * 160 patches x 144 features = 3.7M floats, 4 images per
         * group: groups of 4 and 1. Kept cheap on the CPU side: out 2, G 3, k 1. */
        {5, 16, 160, 160, 2, 3, 3, 1, 1, 1, 1, 1, 1, 3, 1, 1, GRID_UNIFORM},
        /* 1 -> 70 channels on 20x20, 16 images: 6400 patches, the forward's unsplit path with
         * several output tiles. */
        {16, 1, 20, 20, 70, 3, 3, 1, 1, 1, 1, 1, 1, 5, 3, 1, GRID_RANDOM},
    };
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) check_shape(&big[i]);
}

/* A forward and a full backward captured in one graph (the backward's dx is several launches
 * per image group) replay to the eager results bit for bit. */
Test(kan_conv2d_cuda, graph_capture_replays_forward_and_backward) {
    kf_context *ctx = make_ctx(KF_DEVICE_CUDA, 0); /* skips without a usable device */
    kf_context *cpu = make_ctx(KF_DEVICE_CPU, 0);
    cudaStream_t st;
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    KF_OK_(kf_context_set_stream(ctx, st));
    const shape s = {3, 4, 13, 11, 20, 3, 3, 2, 1, 1, 1, 1, 2, 5, 3, 1, GRID_RANDOM};
    bufs dv, h, eager, graph;
    sizes(&s, dv.n_in, dv.n_out);
    ref_rng r;
    ref_rng_seed(&r, 3);
    for (int i = 0; i < NIN; i++) h.in[i] = malloc((size_t)dv.n_in[i] * 4);
    make_inputs(&s, &r, cpu, h.in);
    for (int i = 0; i < NIN; i++)
        dv.in[i] = to_dev(h.in[i], (size_t)dv.n_in[i] * sizeof(float)), free(h.in[i]);
    eager = dv, graph = dv;
    for (int i = 0; i < NOUT; i++) {
        eager.out[i] = dpoisoned(dv.n_out[i]);
        graph.out[i] = dpoisoned(dv.n_out[i]);
    }
    kf_kan_conv2d_plan *plan = make_plan(ctx, &s);
    size_t ws_bytes;
    KF_OK_(kf_kan_conv2d_workspace_size(plan, s.B, s.H, s.W, &ws_bytes));
    void *ws = dalloc((ws_bytes / 4 + 16) * sizeof(float));

    kf_kan_conv2d_forward_args f = fwd_args(&s, &eager);
    kf_kan_conv2d_backward_args g = bwd_args(&s, &eager);
    KF_OK_(kf_kan_conv2d_forward(plan, &f, ws, ws_bytes));
    KF_OK_(kf_kan_conv2d_backward(plan, KF_GRAD_OVERWRITE, &g, ws, ws_bytes));

    f = fwd_args(&s, &graph);
    g = bwd_args(&s, &graph);
    cudaGraph_t cg;
    cudaGraphExec_t ge;
    CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    kf_status s_f = kf_kan_conv2d_forward(plan, &f, ws, ws_bytes);
    kf_status s_b = kf_kan_conv2d_backward(plan, KF_GRAD_OVERWRITE, &g, ws, ws_bytes);
    CUDA_OK(cudaStreamEndCapture(st, &cg));
    cr_assert(s_f == KF_OK && s_b == KF_OK, "calls during capture: %s",
              kf_last_error_message());
    CUDA_OK(cudaGraphInstantiate(&ge, cg, 0));
    CUDA_OK(cudaGraphLaunch(ge, st));
    CUDA_OK(cudaStreamSynchronize(st));
    const char *names[NOUT] = {"y", "dx", "dbase_weight", "dspline_weight", "dspline_scaler"};
    for (int i = 0; i < NOUT; i++) {
        float *a = to_host(eager.out[i], dv.n_out[i]), *b = to_host(graph.out[i], dv.n_out[i]);
        cr_expect(memcmp(a, b, (size_t)dv.n_out[i] * 4) == 0, "%s: graph replay differs",
                  names[i]);
        free(a), free(b);
    }
    CUDA_OK(cudaGraphExecDestroy(ge));
    CUDA_OK(cudaGraphDestroy(cg));
    kf_kan_conv2d_plan_destroy(plan);
    kf_context_destroy(ctx);
    kf_context_destroy(cpu);
    for (int i = 0; i < NIN; i++) cudaFree(dv.in[i]);
    for (int i = 0; i < NOUT; i++) cudaFree(eager.out[i]), cudaFree(graph.out[i]);
    cudaFree(ws);
    CUDA_OK(cudaStreamDestroy(st));
}

#else
Test(kan_conv2d_cuda, skipped_without_cuda_build) {
    cr_skip_test("built without the CUDA backend");
}
#endif

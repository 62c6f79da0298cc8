/* The CUDA backend of kf_sklinear_* against the CPU backend (which test_sklinear.c holds to the
 * float64 reference), through the public header only. Same random problem on both contexts;
 * every CUDA output poisoned (all bits set: NaN) before each call; ||cuda - cpu|| / ||cpu|| < 1e-5
 * for y, dx, dS1s, dS2s, dbias, and for accumulation. Shapes cover both forward paths (the fused
 * one-kernel path for small in*2r and the split-K path for large `in`), 2Lk above 256, odd sizes,
 * batch 1, no bias on either path. Also: initialisation on a CUDA context gives the CPU
 * context's bits; a forward captured in a CUDA graph on a user stream replays to the eager
 * result (thread-local capture after a warm-up; global capture on a first call, refused until
 * the arena is reserved); a call after a stream change. (Float64 plans on CUDA:
 * test_sklinear_f64.c, against the float64 reference.)
 *
 * Without a CUDA build, or with no usable device (KF_ERR_BACKEND_UNAVAILABLE), every test skips. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kfuse.h"
#include "kf_test.h"
#include "ref_rnn.h"

#ifdef KF_HAVE_CUDA
#define TOL 1e-5

/* The five parameter tensors, the input and the output gradient of one problem. */
enum { X, S1, S2, U1, U2, B, DY, NIN };
/* Outputs: y, dx, dS1, dS2, db. */
enum { Y, DX, DS1, DS2, DB, NOUT };

typedef struct shape { int64_t N, in, out; int32_t L, k; int bias; } shape;

typedef struct bufs { float *in[NIN], *out[NOUT]; int64_t n_in[NIN], n_out[NOUT]; } bufs;

static void sizes(const shape *s, int64_t *n_in, int64_t *n_out) {
    int64_t ik = s->L * s->in * s->k, ko = s->L * s->k * s->out;
    int64_t ni[NIN] = {s->N * s->in, ik, ko, ko, ik, s->out, s->N * s->out};
    int64_t no[NOUT] = {s->N * s->out, s->N * s->in, ik, ko, s->out};
    memcpy(n_in, ni, sizeof ni);
    memcpy(n_out, no, sizeof no);
}

/* On `ctx`, over buffers `b` of that context's memory: with KF_GRAD_OVERWRITE a forward and a
 * backward; with KF_GRAD_ACCUMULATE a backward that adds onto the gradients already there. */
static void run(kf_context *ctx, const shape *s, bufs *b, kf_grad_mode mode) {
    kf_sklinear_desc d;
    kf_sklinear_desc_init(&d);
    d.in_features = s->in, d.out_features = s->out, d.num_terms = s->L, d.low_rank = s->k;
    d.bias = s->bias;
    kf_sklinear_plan *plan;
    KF_OK_(kf_sklinear_plan_create(ctx, &d, &plan));
    kf_sklinear_forward_args f;
    kf_sklinear_forward_args_init(&f);
    f.x = t3(b->in[X], 2, s->N, s->in, 0);
    f.S1s = t3(b->in[S1], 3, s->L, s->in, s->k);
    f.S2s = t3(b->in[S2], 3, s->L, s->k, s->out);
    f.U1s = t3(b->in[U1], 3, s->L, s->k, s->out);
    f.U2s = t3(b->in[U2], 3, s->L, s->in, s->k);
    if (s->bias) f.bias = t3(b->in[B], 1, s->out, 0, 0);
    f.y = t3(b->out[Y], 2, s->N, s->out, 0);
    if (mode == KF_GRAD_OVERWRITE) KF_OK_(kf_sklinear_forward(plan, &f, NULL, 0));
    kf_sklinear_backward_args g;
    kf_sklinear_backward_args_init(&g);
    g.x = f.x, g.S1s = f.S1s, g.S2s = f.S2s, g.U1s = f.U1s, g.U2s = f.U2s;
    g.dy = t3(b->in[DY], 2, s->N, s->out, 0);
    g.dx = t3(b->out[DX], 2, s->N, s->in, 0);
    g.dS1s = t3(b->out[DS1], 3, s->L, s->in, s->k);
    g.dS2s = t3(b->out[DS2], 3, s->L, s->k, s->out);
    if (s->bias) g.dbias = t3(b->out[DB], 1, s->out, 0, 0);
    KF_OK_(kf_sklinear_backward(plan, mode, &g, NULL, 0));
    KF_OK_(kf_context_synchronize(ctx));
    kf_sklinear_plan_destroy(plan);
}

static void compare(const char *what, const float *cuda, const float *cpu, int64_t n,
                    const shape *s) {
    double *ref = ref_to_f64(cpu, n);
    double e = ref_rel_err_f32(cuda, ref, n);
    cr_expect(e < TOL, "%s: cuda vs cpu rel err %.3g (N %lld in %lld out %lld L %d k %d)", what,
              e, (long long)s->N, (long long)s->in, (long long)s->out, s->L, s->k);
    free(ref);
}

static void check_shape(const shape *s) {
    kf_context *gpu = make_ctx(KF_DEVICE_CUDA, 0), *cpu = make_ctx(KF_DEVICE_CPU, 0);
    bufs h, dv;
    sizes(s, h.n_in, h.n_out);
    ref_rng r;
    ref_rng_seed(&r, (uint64_t)(s->N * 7 + s->in * 3 + s->k));
    const double sc[NIN] = {1.0, 1.0 / sqrt(s->k), 1.0 / sqrt(s->k), 1.0 / sqrt(s->k),
                            1.0 / sqrt(s->k), 1.0 / sqrt(s->out), 1.0};
    for (int i = 0; i < NIN; i++) {
        h.in[i] = malloc((size_t)h.n_in[i] * 4);
        ref_fill_uniform_f32(&r, h.in[i], h.n_in[i], -sc[i], sc[i]);
        dv.in[i] = to_dev(h.in[i], (size_t)h.n_in[i] * sizeof(float));
    }
    for (int i = 0; i < NOUT; i++) {
        h.out[i] = malloc((size_t)(h.n_out[i] > 0 ? h.n_out[i] : 1) * 4);
        dv.out[i] = dpoisoned(h.n_out[i]); /* NaN */
    }
    run(cpu, s, &h, KF_GRAD_OVERWRITE);
    run(gpu, s, &dv, KF_GRAD_OVERWRITE);
    const char *names[NOUT] = {"y", "dx", "dS1s", "dS2s", "dbias"};
    for (int i = 0; i < NOUT; i++) {
        if (i == DB && !s->bias) continue;
        float *got = to_host(dv.out[i], h.n_out[i]);
        compare(names[i], got, h.out[i], h.n_out[i], s);
        free(got);
    }
    /* Accumulate: the gradients from above are added to again (dx overwritten). */
    run(cpu, s, &h, KF_GRAD_ACCUMULATE);
    run(gpu, s, &dv, KF_GRAD_ACCUMULATE);
    for (int i = DX; i < NOUT; i++) {
        if (i == DB && !s->bias) continue;
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
    {5, 7, 9, 1, 1, 1},        /* L = 1, k = 1 */
    {6, 40, 24, 3, 17, 1},     /* odd k, 2Lk > min(in, out) */
    {1, 64, 48, 2, 8, 1},      /* batch 1 */
    {37, 130, 70, 4, 5, 0},    /* no bias */
    {50, 300, 90, 4, 16, 0},   /* no bias on the split path */
    {64, 256, 256, 1, 16, 1},  /* benchmark shapes */
    {64, 1024, 1024, 4, 32, 1},
    {64, 8192, 8192, 1, 16, 1},
    {100, 3000, 517, 5, 30, 1},/* 2Lk = 300 > 256 */
    {257, 333, 1000, 2, 7, 1},
};

ParameterizedTestParameters(sklinear_cuda, matches_cpu) {
    return cr_make_param_array(shape, kShapes, sizeof kShapes / sizeof kShapes[0]);
}

ParameterizedTest(const shape *s, sklinear_cuda, matches_cpu) { check_shape(s); }

Test(sklinear_cuda, init_matches_cpu) {
    const int64_t in = 300, out = 170, L = 2, k = 9;
    kf_context *ctx[2] = {make_ctx(KF_DEVICE_CPU, 0), make_ctx(KF_DEVICE_CUDA, 0)};
    const int64_t n[5] = {L * in * k, L * k * out, L * k * out, L * in * k, out};
    float *host[2][5];
    for (int c = 0; c < 2; c++) {
        kf_sklinear_desc d;
        kf_sklinear_desc_init(&d);
        d.in_features = in, d.out_features = out, d.num_terms = (int32_t)L, d.low_rank = (int32_t)k;
        kf_sklinear_plan *plan;
        KF_OK_(kf_sklinear_plan_create(ctx[c], &d, &plan));
        float *buf[5];
        for (int i = 0; i < 5; i++)
            buf[i] = c ? dalloc((size_t)n[i] * sizeof(float)) : malloc((size_t)n[i] * 4);
        kf_sklinear_init_args a;
        kf_sklinear_init_args_init(&a);
        a.seed = 99;
        a.S1s = t3(buf[0], 3, L, in, k);
        a.S2s = t3(buf[1], 3, L, k, out);
        a.U1s = t3(buf[2], 3, L, k, out);
        a.U2s = t3(buf[3], 3, L, in, k);
        a.bias = t3(buf[4], 1, out, 0, 0);
        KF_OK_(kf_sklinear_init_params(plan, &a));
        for (int i = 0; i < 5; i++) {
            host[c][i] = c ? to_host(buf[i], n[i]) : buf[i];
            if (c) cudaFree(buf[i]);
        }
        kf_sklinear_plan_destroy(plan);
    }
    for (int i = 0; i < 5; i++) {
        cr_expect(memcmp(host[0][i], host[1][i], (size_t)n[i] * 4) == 0,
                  "parameter %d differs between the CPU and CUDA initialisations", i);
        free(host[0][i]), free(host[1][i]);
    }
    kf_context_destroy(ctx[0]);
    kf_context_destroy(ctx[1]);
}

/* One forward problem on a user stream, for the graph-capture tests: device inputs, two outputs
 * (eager and graph), the plan and its forward arguments (y set to the eager output). */
typedef struct capture_case {
    kf_context *ctx;
    cudaStream_t st;
    shape s;
    bufs dv;
    float *y_eager, *y_graph;
    kf_sklinear_plan *plan;
    kf_sklinear_forward_args f;
    size_t ws_bytes;
} capture_case;

static void capture_setup(capture_case *c) {
    c->ctx = make_ctx(KF_DEVICE_CUDA, 0); /* skips without a usable device */
    CUDA_OK(cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking));
    KF_OK_(kf_context_set_stream(c->ctx, c->st));
    c->s = (shape){64, 1024, 512, 2, 16, 1};
    sizes(&c->s, c->dv.n_in, c->dv.n_out);
    ref_rng r;
    ref_rng_seed(&r, 3);
    for (int i = 0; i < NIN; i++) {
        float *h = malloc((size_t)c->dv.n_in[i] * 4);
        ref_fill_uniform_f32(&r, h, c->dv.n_in[i], -0.5, 0.5);
        c->dv.in[i] = to_dev(h, (size_t)c->dv.n_in[i] * sizeof(float));
        free(h);
    }
    c->y_eager = dalloc((size_t)c->dv.n_out[Y] * sizeof(float));
    c->y_graph = dalloc((size_t)c->dv.n_out[Y] * sizeof(float));
    kf_sklinear_desc d;
    kf_sklinear_desc_init(&d);
    d.in_features = c->s.in, d.out_features = c->s.out, d.num_terms = c->s.L;
    d.low_rank = c->s.k;
    KF_OK_(kf_sklinear_plan_create(c->ctx, &d, &c->plan));
    KF_OK_(kf_sklinear_workspace_size(c->plan, c->s.N, &c->ws_bytes));
    const shape *s = &c->s;
    kf_sklinear_forward_args_init(&c->f);
    c->f.x = t3(c->dv.in[X], 2, s->N, s->in, 0);
    c->f.S1s = t3(c->dv.in[S1], 3, s->L, s->in, s->k);
    c->f.S2s = t3(c->dv.in[S2], 3, s->L, s->k, s->out);
    c->f.U1s = t3(c->dv.in[U1], 3, s->L, s->k, s->out);
    c->f.U2s = t3(c->dv.in[U2], 3, s->L, s->in, s->k);
    c->f.bias = t3(c->dv.in[B], 1, s->out, 0, 0);
    c->f.y = t3(c->y_eager, 2, s->N, s->out, 0);
}

/* Captures one forward (workspace `ws`, NULL = the arena) into y_graph in `mode`, replays it and
 * expects the eager output's bits. */
static void capture_replay(capture_case *c, enum cudaStreamCaptureMode mode, void *ws, size_t ws_bytes) {
    const size_t n = (size_t)c->dv.n_out[Y];
    c->f.y = t3(c->y_graph, 2, c->s.N, c->s.out, 0);
    CUDA_OK(cudaMemsetAsync(c->y_graph, 0xFF, n * 4, c->st));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CUDA_OK(cudaStreamBeginCapture(c->st, mode));
    kf_status s_cap = kf_sklinear_forward(c->plan, &c->f, ws, ws_bytes);
    CUDA_OK(cudaStreamEndCapture(c->st, &g));
    cr_assert(s_cap == KF_OK, "forward during capture: %s", kf_last_error_message());
    CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
    CUDA_OK(cudaGraphLaunch(ge, c->st));
    CUDA_OK(cudaStreamSynchronize(c->st));
    float *a = to_host(c->y_eager, n), *b = to_host(c->y_graph, n);
    cr_expect(memcmp(a, b, n * 4) == 0, "graph replay differs from eager");
    free(a), free(b);
    CUDA_OK(cudaGraphExecDestroy(ge));
    CUDA_OK(cudaGraphDestroy(g));
}

static void capture_teardown(capture_case *c) {
    kf_sklinear_plan_destroy(c->plan);
    kf_context_destroy(c->ctx);
    for (int i = 0; i < NIN; i++) cudaFree(c->dv.in[i]);
    cudaFree(c->y_eager), cudaFree(c->y_graph);
    CUDA_OK(cudaStreamDestroy(c->st));
}

Test(sklinear_cuda, graph_capture_replays_forward) {
    capture_case c;
    capture_setup(&c);
    void *ws = dalloc((c.ws_bytes / 4 + 16) * sizeof(float));
    KF_OK_(kf_sklinear_forward(c.plan, &c.f, ws, c.ws_bytes));
    capture_replay(&c, cudaStreamCaptureModeThreadLocal, ws, c.ws_bytes);
    cudaFree(ws);
    capture_teardown(&c);
}

/* PyTorch's default capture mode (global) on a fresh context: a first call that would grow the
 * arena inside the capture is refused by name before anything is enqueued, and the caller's
 * capture survives it (EndCapture succeeds); after kf_context_reserve() outside the capture, the
 * same call captures from the arena and replays to the eager bits without growing it again. */
Test(sklinear_cuda, graph_capture_global_mode_first_call_uses_reserved_arena) {
    capture_case c;
    capture_setup(&c);
    c.f.y = t3(c.y_graph, 2, c.s.N, c.s.out, 0);
    cudaGraph_t g;
    CUDA_OK(cudaStreamBeginCapture(c.st, cudaStreamCaptureModeGlobal));
    kf_status s_cap = kf_sklinear_forward(c.plan, &c.f, NULL, 0);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", kf_last_error_message());
    CUDA_OK(cudaStreamEndCapture(c.st, &g)); /* fails if the refused call broke the capture */
    CUDA_OK(cudaGraphDestroy(g));
    cr_expect(s_cap == KF_ERR_WORKSPACE_TOO_SMALL, "status %d: %s", (int)s_cap, msg);
    cr_expect(strstr(msg, "capturing") && strstr(msg, "kf_context_reserve"), "message: %s", msg);
    size_t arena;
    uint64_t grows;
    KF_OK_(kf_context_arena_info(c.ctx, &arena, &grows));
    cr_expect(arena == 0 && grows == 0, "arena %zu bytes, %llu grows", arena,
              (unsigned long long)grows);

    KF_OK_(kf_context_reserve(c.ctx, c.ws_bytes));
    c.f.y = t3(c.y_eager, 2, c.s.N, c.s.out, 0);
    KF_OK_(kf_sklinear_forward(c.plan, &c.f, NULL, 0));
    capture_replay(&c, cudaStreamCaptureModeGlobal, NULL, 0);
    KF_OK_(kf_context_arena_info(c.ctx, &arena, &grows));
    cr_expect(grows == 1, "the arena grew %llu times, expected once (the reserve)",
              (unsigned long long)grows);
    capture_teardown(&c);
}

/* A call after a stream change runs on the new stream from the same arena (set_stream orders the
 * new stream after the old one's work; a race there would not show reliably, so this checks the
 * change itself): the forward on stream B gives stream A's bits. */
Test(sklinear_cuda, stream_change_runs_on_the_new_stream) {
    capture_case c;
    capture_setup(&c);
    KF_OK_(kf_sklinear_forward(c.plan, &c.f, NULL, 0)); /* y_eager on stream A, via the arena */
    cudaStream_t b;
    CUDA_OK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    KF_OK_(kf_context_set_stream(c.ctx, b));
    c.f.y = t3(c.y_graph, 2, c.s.N, c.s.out, 0);
    KF_OK_(kf_sklinear_forward(c.plan, &c.f, NULL, 0)); /* the same problem on stream B */
    CUDA_OK(cudaStreamSynchronize(b));
    CUDA_OK(cudaStreamSynchronize(c.st));
    const size_t n = (size_t)c.dv.n_out[Y];
    float *a = to_host(c.y_eager, n), *g = to_host(c.y_graph, n);
    cr_expect(memcmp(a, g, n * 4) == 0, "the call on the new stream differs");
    free(a), free(g);
    KF_OK_(kf_context_set_stream(c.ctx, c.st));
    CUDA_OK(cudaStreamDestroy(b));
    capture_teardown(&c);
}

#else
Test(sklinear_cuda, skipped_without_cuda_build) { cr_skip_test("built without the CUDA backend"); }
#endif

/* kf_bench_rnn: times kfuse's recurrent layers (GRU, A-GRU) through the public ABI only.
 *
 *   kf_bench_rnn --cell gru|agru --T 28 --I 28 --H 128 --B 128 --layers 1 --threads 0
 *                --device cpu|cuda --reps 20 --warmup 3 [--no-dx] [--fwd-only]
 *                [--dtype f32|bf16|f16]
 *
 * --dtype bf16 or f16 makes the plan and every tensor of that type (the values drawn in float32
 * and rounded: issue 16's bfloat16-against-float32 row).
 * forward:          kf_rnn_forward(KF_MODE_INFERENCE), writing y and hn.
 * forward+backward: kf_rnn_forward(KF_MODE_TRAINING) then kf_rnn_backward(KF_GRAD_OVERWRITE) with
 *                   a random dy (dhn absent), writing dx (unless --no-dx) and every weight
 *                   gradient (A-GRU: epsilon's too). h0 is absent (zeros), as torch's default.
 * Each repetition is timed with clock_gettime(CLOCK_MONOTONIC); on CUDA kf_context_synchronize
 * runs before the clock is read. Workspace and reserve are caller buffers sized by
 * kf_rnn_workspace_size, so no call allocates. Inputs and weights are random (weights
 * U(-1/sqrt(H), 1/sqrt(H)) like torch's init, epsilon U(0.05, 0.15), small enough that
 * states and gradients stay finite over T=784 steps), never zeros.
 * Prints one JSON line with median and min over --reps; on any failed status, a JSON line with
 * "error" (status string and kf_last_error_message()) and exit status 1. */
#include "bench_common.h"

#include <unistd.h>

#include "bench_device.h"
#include "kfuse.h"

static size_t numel(const kf_tensor *t) {
    size_t n = 1;
    for (int d = 0; d < t->ndim; ++d) n *= (size_t)t->shape[d];
    return n;
}

/* What one timed run calls: pass 0 an inference forward, pass 1 a training forward then
 * backward. */
typedef struct rnn_run {
    kf_rnn_plan *plan;
    const kf_rnn_forward_args *fa;
    const kf_rnn_backward_args *ba;
    void *ws, *reserve;
    size_t ws_bytes, rs;
} rnn_run;

static void run_pass(int pass, void *state) {
    const rnn_run *k = state;
    if (!pass) {
        KF_CHECK_CALL(
            kf_rnn_forward(k->plan, KF_MODE_INFERENCE, k->fa, k->ws, k->ws_bytes, NULL, 0));
        return;
    }
    KF_CHECK_CALL(
        kf_rnn_forward(k->plan, KF_MODE_TRAINING, k->fa, k->ws, k->ws_bytes, k->reserve, k->rs));
    KF_CHECK_CALL(
        kf_rnn_backward(k->plan, KF_GRAD_OVERWRITE, k->ba, k->ws, k->ws_bytes, k->reserve, k->rs));
}

int main(int argc, char **argv) {
    bench_name = "kfuse_rnn";
    bench_args a;
    bench_parse(argc, argv, &a);
    on_cuda = !strcmp(a.device, "cuda");
    dev_dtype = bench_parse_dtype(a.dtype);
    const int agru = !strcmp(a.cell, "agru");
    const int training = !a.fwd_only;

    kf_context *ctx = dev_context(a.threads);

    kf_rnn_desc rd;
    kf_rnn_desc_init(&rd);
    rd.cell = agru ? KF_RNN_AGRU : KF_RNN_GRU;
    rd.num_layers = (int32_t)a.layers;
    rd.input_size = a.I;
    rd.hidden_size = a.H;
    rd.dtype = dev_dtype;
    kf_rnn_plan *plan = NULL;
    KF_CHECK_CALL(kf_rnn_plan_create(ctx, &rd, &plan));

    /* Weights in the canonical order, shapes from the plan. */
    int32_t nw = 0;
    KF_CHECK_CALL(kf_rnn_weight_count(plan, &nw));
    kf_tensor *w = bench_alloc(sizeof(kf_tensor) * (size_t)nw);
    kf_tensor *dw = bench_alloc(sizeof(kf_tensor) * (size_t)nw);
    const float k = 1.0f / sqrtf((float)a.H);
    for (int32_t i = 0; i < nw; ++i) {
        const char *name = NULL;
        int32_t nd = 0;
        int64_t shape[KF_MAX_DIMS];
        KF_CHECK_CALL(kf_rnn_weight_info(plan, i, &name, &nd, shape));
        KF_CHECK_CALL(kf_tensor_init(&w[i], NULL, dev_dtype, nd, shape));
        size_t n = numel(&w[i]);
        const size_t len = strlen(name);
        const int is_eps = len >= 7 && !strcmp(name + len - 7, "epsilon");
        w[i].data = is_eps ? dev_random(n, 0.05f, 0.15f) : dev_random(n, -k, k);
        void *g = dev_alloc(n * dev_elem_size());
        KF_CHECK_CALL(kf_tensor_init(&dw[i], g, dev_dtype, nd, shape));
    }

    const int64_t sx[3] = {a.T, a.B, a.I}, sy[3] = {a.T, a.B, a.H}, sh[3] = {a.layers, a.B, a.H};
    kf_tensor x, y, hn, dy, dx;
    const size_t e = dev_elem_size();
    KF_CHECK_CALL(kf_tensor_init(&x, dev_random((size_t)(a.T * a.B * a.I), -1.f, 1.f),
                                 dev_dtype, 3, sx));
    KF_CHECK_CALL(kf_tensor_init(&y, dev_alloc(e * (size_t)(a.T * a.B * a.H)), dev_dtype, 3, sy));
    KF_CHECK_CALL(
        kf_tensor_init(&hn, dev_alloc(e * (size_t)(a.layers * a.B * a.H)), dev_dtype, 3, sh));
    KF_CHECK_CALL(kf_tensor_init(&dy, dev_random((size_t)(a.T * a.B * a.H), -1.f, 1.f),
                                 dev_dtype, 3, sy));
    void *dx_data = a.no_dx ? NULL : dev_alloc(e * (size_t)(a.T * a.B * a.I));
    KF_CHECK_CALL(kf_tensor_init(&dx, dx_data, dev_dtype, 3, sx));

    /* Caller-owned workspace (covering both modes) and reserve. */
    size_t ws_inf = 0, ws_tr = 0, rs = 0;
    KF_CHECK_CALL(kf_rnn_workspace_size(plan, a.T, a.B, KF_MODE_INFERENCE, &ws_inf, NULL));
    if (training)
        KF_CHECK_CALL(kf_rnn_workspace_size(plan, a.T, a.B, KF_MODE_TRAINING, &ws_tr, &rs));
    const size_t ws_bytes = ws_inf > ws_tr ? ws_inf : ws_tr;
    void *ws = ws_bytes ? dev_alloc(ws_bytes) : NULL;
    void *reserve = rs ? dev_alloc(rs) : NULL;

    kf_rnn_forward_args fa;
    kf_rnn_forward_args_init(&fa);
    fa.x = x;
    fa.weights = w;
    fa.num_weights = nw;
    fa.y = y;
    fa.hn = hn;

    kf_rnn_backward_args ba;
    kf_rnn_backward_args_init(&ba);
    ba.x = x;
    ba.weights = w;
    ba.num_weights = nw;
    ba.dy = dy;
    ba.dx = dx;
    ba.dweights = dw;
    ba.num_dweights = nw;

    double *tf = bench_alloc(sizeof(double) * (size_t)a.reps);
    double *tb = bench_alloc(sizeof(double) * (size_t)a.reps);
    rnn_run run = {plan, &fa, &ba, ws, reserve, ws_bytes, rs};
    dev_time_pass(ctx, run_pass, 0, &run, a.warmup, a.reps, 0.0, tf);
    const double y_sumsq = dev_sumsq(y.data, numel(&y));
    const double fwd_med = bench_median(tf, a.reps), fwd_min = bench_min(tf, a.reps);

    double fb_med = -1.0, fb_min = -1.0, dw_sumsq = -1.0;
    if (training) {
        dev_time_pass(ctx, run_pass, 1, &run, a.warmup, a.reps, 0.0, tb);
        fb_med = bench_median(tb, a.reps);
        fb_min = bench_min(tb, a.reps);
        dw_sumsq = 0.0;
        for (int32_t i = 0; i < nw; ++i) dw_sumsq += dev_sumsq(dw[i].data, numel(&dw[i]));
    }

    size_t arena_bytes = 0;
    uint64_t grow_count = 0;
    KF_CHECK_CALL(kf_context_arena_info(ctx, &arena_bytes, &grow_count));

    printf("{\"bench\": \"%s\", \"impl\": \"kfuse\", \"cell\": \"%s\", \"device\": \"%s\", "
           "\"dtype\": \"%s\", "
           "\"T\": %ld, \"I\": %ld, \"H\": %ld, \"B\": %ld, \"layers\": %ld, "
           "\"threads\": %ld, \"online_cpus\": %ld, \"omp_wait_policy\": \"%s\", "
           "\"reps\": %ld, \"warmup\": %ld, \"dx\": %s, "
           "\"fwd_ms_median\": %.4f, \"fwd_ms_min\": %.4f, "
           "\"fwdbwd_ms_median\": %.4f, \"fwdbwd_ms_min\": %.4f, "
           "\"workspace_bytes\": %zu, \"reserve_bytes\": %zu, \"arena_bytes\": %zu, "
           "\"arena_grow_count\": %llu, \"y_sumsq\": %.6g, \"dw_sumsq\": %.6g, "
           "\"version\": \"%s\"}\n",
           bench_name, a.cell, a.device, bench_dtype_name(), a.T, a.I, a.H, a.B, a.layers,
           a.threads,           sysconf(_SC_NPROCESSORS_ONLN), bench_env("OMP_WAIT_POLICY"), a.reps, a.warmup,
           a.no_dx ? "false" : "true", fwd_med, fwd_min, fb_med, fb_min, ws_bytes, rs,
           arena_bytes, (unsigned long long)grow_count, y_sumsq, dw_sumsq, kf_version_string());

    for (int32_t i = 0; i < nw; ++i) {
        dev_free(w[i].data);
        dev_free(dw[i].data);
    }
    dev_free(x.data);
    dev_free(y.data);
    dev_free(hn.data);
    dev_free(dy.data);
    dev_free(dx.data);
    dev_free(ws);
    dev_free(reserve);
    free(w);
    free(dw);
    free(tf);
    free(tb);
    kf_rnn_plan_destroy(plan);
    kf_context_destroy(ctx);
    return 0;
}

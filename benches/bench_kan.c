/* kf_bench_kan: times kfuse's KANLinear (efficient-kan's layer) or KANConv2d (unfold + KANLinear)
 * through the public ABI only.
 *
 *   kf_bench_kan --B 1024 --in 256 --out 256 --G 5 --k 3 --device cpu|cuda --threads 0
 *                --reps 30 --warmup 3 [--budget-s 0] [--no-scaler] [--dtype f32|bf16|f16]
 *                [--kernel 3 --H 28 --W 28 --stride 1 --pad 1 --dilation 1]
 *
 * Without --kernel: KANLinear, x [B, in] -> y [B, out]. With --kernel K: KANConv2d with a K x K
 * kernel, --in / --out channels, x [B, in, H, W] -> y [B, out, Ho, Wo] (square stride, padding
 * and dilation).
 * forward:          kf_kan_<layer>_forward.
 * forward+backward: kf_kan_<layer>_forward then kf_kan_<layer>_backward(KF_GRAD_OVERWRITE)
 *                   writing all gradients: dx, dbase_weight, dspline_weight and dspline_scaler,
 *                   from a random dy.
 * Each repetition is timed with clock_gettime(CLOCK_MONOTONIC); on CUDA kf_context_synchronize
 * runs before the clock is read. The workspace is a caller buffer sized by
 * kf_kan_<layer>_workspace_size (reported: the call's whole extra memory), so no call allocates.
 * The grid is efficient-kan's initial one (kf_kan_<layer>_uniform_grid on [-1, 1]); x is
 * U(-1.2, 1.2) (some rows outside the grid, as after training), weights U(-0.1, 0.1), the
 * scaler U(0.5, 1.5); --dtype bf16 or f16 makes every tensor of that type (the values drawn in
 * float32 and rounded: issue 16's bfloat16-against-float32 row). --budget-s > 0 stops a pass's timed loop once that many seconds have been
 * spent in it (at least one timed rep), for large shapes on small boxes; the reps actually timed
 * are reported. Prints one JSON line with median and min; on a failed status, a JSON line with
 * "error" and exit status 1. */
#include "bench_device.h"

#include <unistd.h>

typedef struct kan_args {
    long B, in, out, G, k, threads, reps, warmup, scaler;
    long kernel, H, W, stride, pad, dilation; /* kernel 0: KANLinear */
    double budget_s;
    const char *device;
} kan_args;

static void usage(const char *prog) {
    fprintf(stderr,
            "usage: %s [--B n] [--in n] [--out n] [--G n] [--k n] [--device cpu|cuda]\n"
            "          [--threads n] [--reps n] [--warmup n] [--budget-s s] [--no-scaler]\n"
            "          [--dtype f32|bf16|f16]\n"
            "          [--kernel n --H n --W n --stride n --pad n --dilation n]\n"
            "Defaults: --B 1024 --in 256 --out 256 --G 5 --k 3 --device cpu --threads 0\n"
            "          --reps 30 --warmup 3 --budget-s 0 (no limit); --kernel 0 (KANLinear),\n"
            "          else --H 28 --W 28 --stride 1 --pad 0 --dilation 1. Prints one JSON line.\n",
            prog);
}

static void parse(int argc, char **argv, kan_args *a) {
    *a = (kan_args){.B = 1024, .in = 256, .out = 256, .G = 5, .k = 3, .threads = 0, .reps = 30,
                    .warmup = 3, .scaler = 1, .budget_s = 0.0, .device = "cpu", .kernel = 0,
                    .H = 28, .W = 28, .stride = 1, .pad = 0, .dilation = 1};
    for (int i = 1; i < argc; ++i) {
        const char *f = argv[i];
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { usage(argv[0]); exit(0); }
        if (!strcmp(f, "--no-scaler")) { a->scaler = 0; continue; }
        const char *v = bench_flag_value(argc, argv, &i);
        if (!strcmp(f, "--device")) a->device = v;
        else if (!strcmp(f, "--dtype")) dev_dtype = bench_parse_dtype(v);
        else if (!strcmp(f, "--B")) a->B = bench_parse_long(f, v, 1);
        else if (!strcmp(f, "--in")) a->in = bench_parse_long(f, v, 1);
        else if (!strcmp(f, "--out")) a->out = bench_parse_long(f, v, 1);
        else if (!strcmp(f, "--G")) a->G = bench_parse_long(f, v, 1);
        else if (!strcmp(f, "--k")) a->k = bench_parse_long(f, v, 0);
        else if (!strcmp(f, "--threads")) a->threads = bench_parse_long(f, v, 0);
        else if (!strcmp(f, "--reps")) a->reps = bench_parse_long(f, v, 1);
        else if (!strcmp(f, "--warmup")) a->warmup = bench_parse_long(f, v, 0);
        else if (!strcmp(f, "--budget-s")) a->budget_s = (double)bench_parse_long(f, v, 0);
        else if (!strcmp(f, "--kernel")) a->kernel = bench_parse_long(f, v, 1);
        else if (!strcmp(f, "--H")) a->H = bench_parse_long(f, v, 1);
        else if (!strcmp(f, "--W")) a->W = bench_parse_long(f, v, 1);
        else if (!strcmp(f, "--stride")) a->stride = bench_parse_long(f, v, 1);
        else if (!strcmp(f, "--pad")) a->pad = bench_parse_long(f, v, 0);
        else if (!strcmp(f, "--dilation")) a->dilation = bench_parse_long(f, v, 1);
        else { usage(argv[0]); bench_fail("unknown argument '%s'", f); }
    }
    bench_check_device(a->device);
}

/* What one timed run calls: pass 0 forward, pass 1 forward then backward, of one of the two
 * layers (conv_plan set: KANConv2d). */
typedef struct kan_run {
    kf_kan_linear_plan *plan;
    const kf_kan_linear_forward_args *fa;
    const kf_kan_linear_backward_args *ba;
    kf_kan_conv2d_plan *conv_plan;
    const kf_kan_conv2d_forward_args *cfa;
    const kf_kan_conv2d_backward_args *cba;
    void *ws;
    size_t ws_bytes;
} kan_run;

static void run_pass(int pass, void *state) {
    const kan_run *k = state;
    if (k->conv_plan) {
        KF_CHECK_CALL(kf_kan_conv2d_forward(k->conv_plan, k->cfa, k->ws, k->ws_bytes));
        if (pass)
            KF_CHECK_CALL(kf_kan_conv2d_backward(k->conv_plan, KF_GRAD_OVERWRITE, k->cba, k->ws,
                                                 k->ws_bytes));
        return;
    }
    KF_CHECK_CALL(kf_kan_linear_forward(k->plan, k->fa, k->ws, k->ws_bytes));
    if (pass)
        KF_CHECK_CALL(
            kf_kan_linear_backward(k->plan, KF_GRAD_OVERWRITE, k->ba, k->ws, k->ws_bytes));
}

/* A tensor of rank 4 on the context's device. */
static kf_tensor dev_tensor4(void *p, long a, long b, long c, long d) {
    int64_t sh[4] = {a, b, c, d};
    kf_tensor t;
    KF_CHECK_CALL(kf_tensor_init(&t, p, dev_dtype, 4, sh));
    return t;
}

int main(int argc, char **argv) {
    bench_name = "kfuse_kan";
    kan_args a;
    parse(argc, argv, &a);
    on_cuda = !strcmp(a.device, "cuda");
    const int conv = a.kernel > 0;
    /* F features per row; N rows (KANConv2d: patches); x and y element counts. */
    long Ho = 0, Wo = 0;
    if (conv) {
        Ho = (a.H + 2 * a.pad - a.dilation * (a.kernel - 1) - 1) / a.stride + 1;
        Wo = (a.W + 2 * a.pad - a.dilation * (a.kernel - 1) - 1) / a.stride + 1;
        if (Ho < 1 || Wo < 1) bench_fail("the dilated kernel does not fit the padded image");
    }
    const long F = conv ? a.in * a.kernel * a.kernel : a.in;
    const long nx = conv ? a.B * a.in * a.H * a.W : a.B * a.in;
    const long ny = conv ? a.B * a.out * Ho * Wo : a.B * a.out;

    kf_context *ctx = dev_context(a.threads);
    kf_kan_linear_plan *plan = NULL;
    kf_kan_conv2d_plan *conv_plan = NULL;
    if (conv) {
        kf_kan_conv2d_desc d;
        kf_kan_conv2d_desc_init(&d);
        d.in_channels = a.in, d.out_channels = a.out;
        d.kernel_h = d.kernel_w = (int32_t)a.kernel;
        d.stride_h = d.stride_w = (int32_t)a.stride;
        d.pad_h = d.pad_w = (int32_t)a.pad;
        d.dilation_h = d.dilation_w = (int32_t)a.dilation;
        d.grid_size = (int32_t)a.G, d.spline_order = (int32_t)a.k;
        d.standalone_scale = (int32_t)a.scaler;
        d.dtype = dev_dtype;
        KF_CHECK_CALL(kf_kan_conv2d_plan_create(ctx, &d, &conv_plan));
    } else {
        kf_kan_linear_desc d;
        kf_kan_linear_desc_init(&d);
        d.in_features = a.in, d.out_features = a.out;
        d.grid_size = (int32_t)a.G, d.spline_order = (int32_t)a.k;
        d.standalone_scale = (int32_t)a.scaler;
        d.dtype = dev_dtype;
        KF_CHECK_CALL(kf_kan_linear_plan_create(ctx, &d, &plan));
    }

    /* The parameters (over F features) and the row tensors, in KANLinear's argument structs;
     * KANConv2d's take the same parameters with 4-D x, y, dy and dx. */
    const long C = a.G + a.k, nk = a.G + 2 * a.k + 1;
    const size_t n_oi = (size_t)(a.out * F), n_oic = n_oi * (size_t)C, e = dev_elem_size();
    kf_kan_linear_forward_args fa;
    kf_kan_linear_forward_args_init(&fa);
    fa.x = dev_tensor(dev_random((size_t)nx, -1.2f, 1.2f), 2, a.B, nx / a.B, 0);
    fa.grid = dev_tensor(dev_alloc((size_t)(F * nk) * e), 2, F, nk, 0);
    KF_CHECK_CALL(conv ? kf_kan_conv2d_uniform_grid(conv_plan, -1.f, 1.f, &fa.grid)
                       : kf_kan_linear_uniform_grid(plan, -1.f, 1.f, &fa.grid));
    fa.base_weight = dev_tensor(dev_random(n_oi, -0.1f, 0.1f), 2, a.out, F, 0);
    fa.spline_weight = dev_tensor(dev_random(n_oic, -0.1f, 0.1f), 3, a.out, F, C);
    if (a.scaler) fa.spline_scaler = dev_tensor(dev_random(n_oi, 0.5f, 1.5f), 2, a.out, F, 0);
    fa.y = dev_tensor(dev_alloc((size_t)ny * e), 2, a.B, ny / a.B, 0);
    kf_kan_linear_backward_args ba;
    kf_kan_linear_backward_args_init(&ba);
    ba.x = fa.x, ba.grid = fa.grid, ba.base_weight = fa.base_weight;
    ba.spline_weight = fa.spline_weight, ba.spline_scaler = fa.spline_scaler;
    ba.dy = dev_tensor(dev_random((size_t)ny, -1.f, 1.f), 2, a.B, ny / a.B, 0);
    ba.dx = dev_tensor(dev_alloc((size_t)nx * e), 2, a.B, nx / a.B, 0);
    ba.dbase_weight = dev_tensor(dev_alloc(n_oi * e), 2, a.out, F, 0);
    ba.dspline_weight = dev_tensor(dev_alloc(n_oic * e), 3, a.out, F, C);
    if (a.scaler) ba.dspline_scaler = dev_tensor(dev_alloc(n_oi * e), 2, a.out, F, 0);
    kf_kan_conv2d_forward_args cfa;
    kf_kan_conv2d_forward_args_init(&cfa);
    kf_kan_conv2d_backward_args cba;
    kf_kan_conv2d_backward_args_init(&cba);
    size_t ws_bytes = 0;
    if (conv) {
        cfa.x = dev_tensor4(fa.x.data, a.B, a.in, a.H, a.W);
        cfa.grid = fa.grid, cfa.base_weight = fa.base_weight;
        cfa.spline_weight = fa.spline_weight, cfa.spline_scaler = fa.spline_scaler;
        cfa.y = dev_tensor4(fa.y.data, a.B, a.out, Ho, Wo);
        cba.x = cfa.x, cba.grid = cfa.grid, cba.base_weight = cfa.base_weight;
        cba.spline_weight = cfa.spline_weight, cba.spline_scaler = cfa.spline_scaler;
        cba.dy = dev_tensor4(ba.dy.data, a.B, a.out, Ho, Wo);
        cba.dx = dev_tensor4(ba.dx.data, a.B, a.in, a.H, a.W);
        cba.dbase_weight = ba.dbase_weight, cba.dspline_weight = ba.dspline_weight;
        cba.dspline_scaler = ba.dspline_scaler;
        KF_CHECK_CALL(kf_kan_conv2d_workspace_size(conv_plan, a.B, a.H, a.W, &ws_bytes));
    } else {
        KF_CHECK_CALL(kf_kan_linear_workspace_size(plan, a.B, &ws_bytes));
    }
    void *ws = ws_bytes ? dev_alloc(ws_bytes) : NULL;

    double *tf = bench_alloc(sizeof(double) * (size_t)a.reps);
    double *tb = bench_alloc(sizeof(double) * (size_t)a.reps);
    kan_run run = {plan, &fa, &ba, conv_plan, &cfa, &cba, ws, ws_bytes};
    const long nf = dev_time_pass(ctx, run_pass, 0, &run, a.warmup, a.reps, a.budget_s, tf);
    const long nb = dev_time_pass(ctx, run_pass, 1, &run, a.warmup, a.reps, a.budget_s, tb);
    const double y_sumsq = dev_sumsq(fa.y.data, (size_t)ny);
    const double g_sumsq = dev_sumsq(ba.dx.data, (size_t)nx) +
                           dev_sumsq(ba.dbase_weight.data, n_oi) +
                           dev_sumsq(ba.dspline_weight.data, n_oic) +
                           (a.scaler ? dev_sumsq(ba.dspline_scaler.data, n_oi) : 0.0);
    printf("{\"bench\": \"%s\", \"impl\": \"kfuse\", \"layer\": \"%s\", \"device\": \"%s\", "
           "\"dtype\": \"%s\", "
           "\"B\": %ld, \"in\": %ld, \"out\": %ld, \"kernel\": %ld, \"H\": %ld, \"W\": %ld, "
           "\"stride\": %ld, \"pad\": %ld, \"dilation\": %ld, "
           "\"G\": %ld, \"k\": %ld, \"standalone_scale\": %ld, \"threads\": %ld, "
           "\"online_cpus\": %ld, \"omp_wait_policy\": \"%s\", \"warmup\": %ld, "
           "\"fwd_reps\": %ld, \"fwdbwd_reps\": %ld, "
           "\"fwd_ms_median\": %.5f, \"fwd_ms_min\": %.5f, \"fwdbwd_ms_median\": %.5f, "
           "\"fwdbwd_ms_min\": %.5f, \"workspace_bytes\": %zu, \"y_sumsq\": %.6g, "
           "\"grad_sumsq\": %.6g, \"version\": \"%s\"}\n",
           bench_name, conv ? "kan_conv2d" : "kan_linear", a.device,
           bench_dtype_name(), a.B, a.in, a.out, a.kernel,
           conv ? a.H : 0, conv ? a.W : 0, a.stride, a.pad, a.dilation, a.G, a.k, a.scaler,
           a.threads, sysconf(_SC_NPROCESSORS_ONLN), bench_env("OMP_WAIT_POLICY"), a.warmup, nf,
           nb, bench_median(tf, nf), bench_min(tf, nf), bench_median(tb, nb), bench_min(tb, nb),
           ws_bytes, y_sumsq, g_sumsq, kf_version_string());

    void *bufs[] = {fa.x.data, fa.grid.data, fa.base_weight.data, fa.spline_weight.data,
                    fa.spline_scaler.data, fa.y.data, ba.dy.data, ba.dx.data,
                    ba.dbase_weight.data, ba.dspline_weight.data, ba.dspline_scaler.data, ws};
    dev_free_all(bufs, sizeof bufs / sizeof bufs[0]);
    free(tf);
    free(tb);
    kf_kan_linear_plan_destroy(plan);
    kf_kan_conv2d_plan_destroy(conv_plan);
    kf_context_destroy(ctx);
    return 0;
}

/* kf_bench_sklinear: times kfuse's SKLinear through the public ABI only.
 *
 *   kf_bench_sklinear --in 8192 --out 8192 --L 1 --k 16 --B 64 --device cpu|cuda --threads 0
 *                     --reps 50 --warmup 5 [--dtype f32|bf16|f16]
 *
 * forward:          kf_sklinear_forward (y = x -> [B, out], with bias).
 * forward+backward: kf_sklinear_forward then kf_sklinear_backward(KF_GRAD_OVERWRITE) writing dx,
 *                   dS1s, dS2s and dbias from a random dy.
 * Each repetition is timed with clock_gettime(CLOCK_MONOTONIC); on CUDA kf_context_synchronize
 * runs before the clock is read. The workspace is a caller buffer sized by
 * kf_sklinear_workspace_size, so no call allocates. Parameters come from kf_sklinear_init_params
 * (Panther's initialisation), inputs are U(-1, 1); --dtype bf16 or f16 makes every tensor of
 * that type (the plan's dtype; the inputs drawn in float32 and rounded). Prints one JSON line
 * with median and min over --reps; on a failed status, a JSON line with "error" and exit
 * status 1. */
#include "bench_device.h"

#include <unistd.h>

typedef struct skl_args {
    long in, out, L, k, B, threads, reps, warmup;
    const char *device;
} skl_args;

static void usage(const char *prog) {
    fprintf(stderr,
            "usage: %s [--in n] [--out n] [--L n] [--k n] [--B n] [--device cpu|cuda]\n"
            "          [--threads n] [--reps n] [--warmup n] [--dtype f32|bf16|f16]\n"
            "Defaults: --in 1024 --out 1024 --L 1 --k 16 --B 64 --device cpu --threads 0\n"
            "          --reps 50 --warmup 5 --dtype f32. Prints one JSON line.\n",
            prog);
}

static void parse(int argc, char **argv, skl_args *a) {
    *a = (skl_args){.in = 1024, .out = 1024, .L = 1, .k = 16, .B = 64, .threads = 0, .reps = 50,
                    .warmup = 5, .device = "cpu"};
    for (int i = 1; i < argc; ++i) {
        const char *f = argv[i];
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { usage(argv[0]); exit(0); }
        const char *v = bench_flag_value(argc, argv, &i);
        if (!strcmp(f, "--device")) a->device = v;
        else if (!strcmp(f, "--in")) a->in = bench_parse_long(f, v, 1);
        else if (!strcmp(f, "--out")) a->out = bench_parse_long(f, v, 1);
        else if (!strcmp(f, "--L")) a->L = bench_parse_long(f, v, 1);
        else if (!strcmp(f, "--k")) a->k = bench_parse_long(f, v, 1);
        else if (!strcmp(f, "--B")) a->B = bench_parse_long(f, v, 1);
        else if (!strcmp(f, "--threads")) a->threads = bench_parse_long(f, v, 0);
        else if (!strcmp(f, "--reps")) a->reps = bench_parse_long(f, v, 1);
        else if (!strcmp(f, "--warmup")) a->warmup = bench_parse_long(f, v, 0);
        else if (!strcmp(f, "--dtype")) dev_dtype = bench_parse_dtype(v);
        else { usage(argv[0]); bench_fail("unknown argument '%s'", f); }
    }
    bench_check_device(a->device);
}

/* What one timed run calls: pass 0 forward, pass 1 forward then backward. */
typedef struct skl_run {
    kf_sklinear_plan *plan;
    const kf_sklinear_forward_args *fa;
    const kf_sklinear_backward_args *ba;
    void *ws;
    size_t ws_bytes;
} skl_run;

static void run_pass(int pass, void *state) {
    const skl_run *k = state;
    KF_CHECK_CALL(kf_sklinear_forward(k->plan, k->fa, k->ws, k->ws_bytes));
    if (pass)
        KF_CHECK_CALL(kf_sklinear_backward(k->plan, KF_GRAD_OVERWRITE, k->ba, k->ws, k->ws_bytes));
}

int main(int argc, char **argv) {
    bench_name = "kfuse_sklinear";
    skl_args a;
    parse(argc, argv, &a);
    on_cuda = !strcmp(a.device, "cuda");

    kf_context *ctx = dev_context(a.threads);
    kf_sklinear_desc d;
    kf_sklinear_desc_init(&d);
    d.in_features = a.in, d.out_features = a.out, d.num_terms = (int32_t)a.L;
    d.low_rank = (int32_t)a.k;
    d.dtype = dev_dtype;
    kf_sklinear_plan *plan = NULL;
    KF_CHECK_CALL(kf_sklinear_plan_create(ctx, &d, &plan));

    const size_t n_ik = (size_t)(a.L * a.in * a.k), n_ko = (size_t)(a.L * a.k * a.out);
    kf_sklinear_init_args ia;
    kf_sklinear_init_args_init(&ia);
    ia.seed = 1;
    ia.S1s = dev_tensor(dev_alloc(n_ik * dev_elem_size()), 3, a.L, a.in, a.k);
    ia.U2s = dev_tensor(dev_alloc(n_ik * dev_elem_size()), 3, a.L, a.in, a.k);
    ia.S2s = dev_tensor(dev_alloc(n_ko * dev_elem_size()), 3, a.L, a.k, a.out);
    ia.U1s = dev_tensor(dev_alloc(n_ko * dev_elem_size()), 3, a.L, a.k, a.out);
    ia.bias = dev_tensor(dev_alloc((size_t)a.out * dev_elem_size()), 1, a.out, 0, 0);
    KF_CHECK_CALL(kf_sklinear_init_params(plan, &ia));

    kf_sklinear_forward_args fa;
    kf_sklinear_forward_args_init(&fa);
    fa.x = dev_tensor(dev_random((size_t)(a.B * a.in), -1.f, 1.f), 2, a.B, a.in, 0);
    fa.S1s = ia.S1s, fa.S2s = ia.S2s, fa.U1s = ia.U1s, fa.U2s = ia.U2s, fa.bias = ia.bias;
    fa.y = dev_tensor(dev_alloc((size_t)(a.B * a.out) * dev_elem_size()), 2, a.B, a.out, 0);
    kf_sklinear_backward_args ba;
    kf_sklinear_backward_args_init(&ba);
    ba.x = fa.x, ba.S1s = fa.S1s, ba.S2s = fa.S2s, ba.U1s = fa.U1s, ba.U2s = fa.U2s;
    ba.dy = dev_tensor(dev_random((size_t)(a.B * a.out), -1.f, 1.f), 2, a.B, a.out, 0);
    ba.dx = dev_tensor(dev_alloc((size_t)(a.B * a.in) * dev_elem_size()), 2, a.B, a.in, 0);
    ba.dS1s = dev_tensor(dev_alloc(n_ik * dev_elem_size()), 3, a.L, a.in, a.k);
    ba.dS2s = dev_tensor(dev_alloc(n_ko * dev_elem_size()), 3, a.L, a.k, a.out);
    ba.dbias = dev_tensor(dev_alloc((size_t)a.out * dev_elem_size()), 1, a.out, 0, 0);
    size_t ws_bytes = 0;
    KF_CHECK_CALL(kf_sklinear_workspace_size(plan, a.B, &ws_bytes));
    void *ws = ws_bytes ? dev_alloc(ws_bytes) : NULL;

    double *tf = bench_alloc(sizeof(double) * (size_t)a.reps);
    double *tb = bench_alloc(sizeof(double) * (size_t)a.reps);
    skl_run run = {plan, &fa, &ba, ws, ws_bytes};
    dev_time_pass(ctx, run_pass, 0, &run, a.warmup, a.reps, 0.0, tf);
    dev_time_pass(ctx, run_pass, 1, &run, a.warmup, a.reps, 0.0, tb);
    const double y_sumsq = dev_sumsq(fa.y.data, (size_t)(a.B * a.out));
    const double g_sumsq = dev_sumsq(ba.dx.data, (size_t)(a.B * a.in)) +
                           dev_sumsq(ba.dS1s.data, n_ik) + dev_sumsq(ba.dS2s.data, n_ko);
    double ratio = 0.0;
    KF_CHECK_CALL(kf_sklinear_param_ratio(plan, &ratio));
    printf("{\"bench\": \"%s\", \"impl\": \"kfuse\", \"device\": \"%s\", \"in\": %ld, "
           "\"out\": %ld, \"L\": %ld, \"k\": %ld, \"B\": %ld, \"dtype\": \"%s\", \"threads\": %ld, "
           "\"online_cpus\": %ld, \"omp_wait_policy\": \"%s\", \"reps\": %ld, \"warmup\": %ld, "
           "\"fwd_ms_median\": %.5f, \"fwd_ms_min\": %.5f, \"fwdbwd_ms_median\": %.5f, "
           "\"fwdbwd_ms_min\": %.5f, \"workspace_bytes\": %zu, \"param_ratio\": %.4f, "
           "\"y_sumsq\": %.6g, \"grad_sumsq\": %.6g, \"version\": \"%s\"}\n",
           bench_name, a.device, a.in, a.out, a.L, a.k, a.B, bench_dtype_name(), a.threads,
           sysconf(_SC_NPROCESSORS_ONLN), bench_env("OMP_WAIT_POLICY"), a.reps, a.warmup,
           bench_median(tf, a.reps), bench_min(tf, a.reps), bench_median(tb, a.reps),
           bench_min(tb, a.reps), ws_bytes, ratio, y_sumsq, g_sumsq, kf_version_string());

    void *bufs[] = {ia.S1s.data, ia.U2s.data, ia.S2s.data, ia.U1s.data, ia.bias.data, fa.x.data,
                    fa.y.data, ba.dy.data, ba.dx.data, ba.dS1s.data, ba.dS2s.data,
                    ba.dbias.data, ws};
    dev_free_all(bufs, sizeof bufs / sizeof bufs[0]);
    free(tf);
    free(tb);
    kf_sklinear_plan_destroy(plan);
    kf_context_destroy(ctx);
    return 0;
}

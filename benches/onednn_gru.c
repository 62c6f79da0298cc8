/* onednn_gru: the CPU GRU baseline of DESIGN.md, oneDNN's own linear-before-reset GRU primitive
 * (dnnl_lbr_gru, the torch.nn.GRU formulation) at the shapes kf_bench_rnn times, through the
 * oneDNN 2.6 C API. f32, unidirectional, h0 = zeros (as torch's default), hn computed.
 *
 *  forward:           dnnl_forward_inference, weights reordered once (outside the timing) into
 *                     the format the primitive prefers (packed GEMM weights where it chooses so).
 *  forward+backward:  dnnl_forward_training writing the workspace, then dnnl_backward with a
 *                     random diff_dst_layer (and zero diff_dst_iter), computing diff_src_layer
 *                     and every weight and bias gradient. oneDNN accumulates weight gradients, so
 *                     they are zeroed inside the timed region (a training step needs that; it is
 *                     a few hundred KiB of memset).
 * Weight reorders from the user layout (ldigo) are done once, before timing: this is the
 * baseline at its best (a framework caching packed weights). Their one-off cost is reported as
 * reorder_ms.
 *
 * Layers: layer 0 has input I; oneDNN needs equal widths inside one primitive, so layers 1..L-1
 * (input H) form a second primitive when I != H (one primitive for all L when I == H).
 *
 * Threads: oneDNN here is built on OpenMP (DNNL_RUNTIME_OMP); --threads n calls
 * omp_set_num_threads(n); the run's OMP_WAIT_POLICY is reported (set it in the environment).
 * Prints one JSON line; on failure a JSON line with "error" and exit status 1. */
#include "bench_common.h"

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#define DNNL_CHECK(call)                                                                  \
    do {                                                                                  \
        dnnl_status_t s_ = (call);                                                        \
        if (s_ != dnnl_success) bench_fail("%s failed with dnnl status %d (line %d)", #call, \
                                           (int)s_, __LINE__);                           \
    } while (0)

static dnnl_engine_t eng;
static dnnl_stream_t strm;

/* A memory object of md, allocated by oneDNN. */
static dnnl_memory_t mem_new(const dnnl_memory_desc_t *md) {
    dnnl_memory_t m;
    DNNL_CHECK(dnnl_memory_create(&m, md, eng, DNNL_MEMORY_ALLOCATE));
    return m;
}

static void *mem_ptr(dnnl_memory_t m) {
    void *p = NULL;
    DNNL_CHECK(dnnl_memory_get_data_handle(m, &p));
    return p;
}

static size_t mem_bytes(dnnl_memory_t m) {
    const dnnl_memory_desc_t *md;
    DNNL_CHECK(dnnl_memory_get_memory_desc(m, &md));
    return dnnl_memory_desc_get_size(md);
}

static void md_tag(dnnl_memory_desc_t *md, int nd, const dnnl_dims_t dims, dnnl_format_tag_t tag) {
    DNNL_CHECK(dnnl_memory_desc_init_by_tag(md, nd, dims, dnnl_f32, tag));
}

/* Memory of the primitive's preferred layout for `arg`, filled from user memory `user` by a
 * reorder (or `user` itself when the layouts match). Adds the reorder time to *reorder_ms. */
static dnnl_memory_t to_prim_layout(const_dnnl_primitive_desc_t pd, int arg, dnnl_memory_t user,
                                    double *reorder_ms) {
    const dnnl_memory_desc_t *want = dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md, arg);
    const dnnl_memory_desc_t *have;
    if (!want) bench_fail("query of exec arg %d md failed", arg);
    DNNL_CHECK(dnnl_memory_get_memory_desc(user, &have));
    if (dnnl_memory_desc_equal(want, have)) return user;
    dnnl_memory_t m = mem_new(want);
    dnnl_primitive_desc_t rpd;
    dnnl_primitive_t r;
    DNNL_CHECK(dnnl_reorder_primitive_desc_create(&rpd, have, eng, want, eng, NULL));
    DNNL_CHECK(dnnl_primitive_create(&r, rpd));
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, user}, {DNNL_ARG_TO, m}};
    double t0 = bench_now_ms();
    DNNL_CHECK(dnnl_primitive_execute(r, strm, 2, args));
    DNNL_CHECK(dnnl_stream_wait(strm));
    *reorder_ms += bench_now_ms() - t0;
    DNNL_CHECK(dnnl_primitive_destroy(r));
    DNNL_CHECK(dnnl_primitive_desc_destroy(rpd));
    return m;
}

/* A group of consecutive layers with equal input width that one primitive runs. */
typedef struct group {
    long L, C;                       /* layers, input width (I or H) */
    dnnl_memory_desc_t src, dst, dst_iter, wl_any, wi_any, bias_any, wl_user, wi_user, bias_user;
    dnnl_memory_t m_src, m_dst, m_dst_iter, wl_u, wi_u, bias_u; /* user-layout memories */
    /* inference */
    dnnl_primitive_t inf;
    dnnl_memory_t inf_wl, inf_wi, inf_bias;
    /* training */
    dnnl_primitive_desc_t fwd_pd;
    dnnl_primitive_t fwd, bwd;
    dnnl_memory_t tr_wl, tr_wi, tr_bias, ws;
    dnnl_memory_t bw_wl, bw_wi, bw_bias;
    dnnl_memory_t d_src, d_dst, d_dst_iter, d_wl, d_wi, d_bias;
} group;

static void group_setup(group *g, long T, long B, long H, long L, long C, int training,
                        dnnl_memory_t shared_src, dnnl_memory_t shared_d_src, double *reorder_ms) {
    memset(g, 0, sizeof *g);
    g->L = L; g->C = C;
    const long G = 3;
    dnnl_dims_t d_src = {T, B, C}, d_dst = {T, B, H}, d_iter = {L, 1, B, H};
    dnnl_dims_t d_wl = {L, 1, C, G, H}, d_wi = {L, 1, H, G, H}, d_b = {L, 1, G + 1, H};
    md_tag(&g->src, 3, d_src, dnnl_tnc);
    md_tag(&g->dst, 3, d_dst, dnnl_tnc);
    md_tag(&g->dst_iter, 4, d_iter, dnnl_ldnc);
    md_tag(&g->wl_any, 5, d_wl, dnnl_format_tag_any);
    md_tag(&g->wi_any, 5, d_wi, dnnl_format_tag_any);
    md_tag(&g->bias_any, 4, d_b, dnnl_format_tag_any);
    md_tag(&g->wl_user, 5, d_wl, dnnl_ldigo);
    md_tag(&g->wi_user, 5, d_wi, dnnl_ldigo);
    md_tag(&g->bias_user, 4, d_b, dnnl_ldgo);

    /* Random user data, U(-1/sqrt(H), 1/sqrt(H)) as torch initialises a GRU. */
    const float k = 1.0f / sqrtf((float)H);
    g->m_src = shared_src ? shared_src : mem_new(&g->src);
    if (!shared_src) bench_fill_uniform(mem_ptr(g->m_src), (size_t)T * B * C, -1.f, 1.f);
    g->m_dst = mem_new(&g->dst);
    g->m_dst_iter = mem_new(&g->dst_iter);
    g->wl_u = mem_new(&g->wl_user);
    g->wi_u = mem_new(&g->wi_user);
    g->bias_u = mem_new(&g->bias_user);
    bench_fill_uniform(mem_ptr(g->wl_u), mem_bytes(g->wl_u) / 4, -k, k);
    bench_fill_uniform(mem_ptr(g->wi_u), mem_bytes(g->wi_u) / 4, -k, k);
    bench_fill_uniform(mem_ptr(g->bias_u), mem_bytes(g->bias_u) / 4, -k, k);

    dnnl_rnn_desc_t rd;
    dnnl_primitive_desc_t pd;

    /* Inference primitive. */
    DNNL_CHECK(dnnl_lbr_gru_forward_desc_init(&rd, dnnl_forward_inference,
                                              dnnl_unidirectional_left2right, &g->src, NULL,
                                              &g->wl_any, &g->wi_any, &g->bias_any, &g->dst,
                                              &g->dst_iter, 0));
    DNNL_CHECK(dnnl_primitive_desc_create(&pd, &rd, NULL, eng, NULL));
    DNNL_CHECK(dnnl_primitive_create(&g->inf, pd));
    g->inf_wl = to_prim_layout(pd, DNNL_ARG_WEIGHTS_LAYER, g->wl_u, reorder_ms);
    g->inf_wi = to_prim_layout(pd, DNNL_ARG_WEIGHTS_ITER, g->wi_u, reorder_ms);
    g->inf_bias = to_prim_layout(pd, DNNL_ARG_BIAS, g->bias_u, reorder_ms);
    DNNL_CHECK(dnnl_primitive_desc_destroy(pd));
    if (!training) return;

    /* Training forward. */
    DNNL_CHECK(dnnl_lbr_gru_forward_desc_init(&rd, dnnl_forward_training,
                                              dnnl_unidirectional_left2right, &g->src, NULL,
                                              &g->wl_any, &g->wi_any, &g->bias_any, &g->dst,
                                              &g->dst_iter, 0));
    DNNL_CHECK(dnnl_primitive_desc_create(&g->fwd_pd, &rd, NULL, eng, NULL));
    DNNL_CHECK(dnnl_primitive_create(&g->fwd, g->fwd_pd));
    g->tr_wl = to_prim_layout(g->fwd_pd, DNNL_ARG_WEIGHTS_LAYER, g->wl_u, reorder_ms);
    g->tr_wi = to_prim_layout(g->fwd_pd, DNNL_ARG_WEIGHTS_ITER, g->wi_u, reorder_ms);
    g->tr_bias = to_prim_layout(g->fwd_pd, DNNL_ARG_BIAS, g->bias_u, reorder_ms);
    const dnnl_memory_desc_t *ws_md =
        dnnl_primitive_desc_query_md(g->fwd_pd, dnnl_query_workspace_md, 0);
    if (!ws_md) bench_fail("training forward has no workspace md");
    g->ws = mem_new(ws_md);

    /* Backward. */
    DNNL_CHECK(dnnl_lbr_gru_backward_desc_init(
        &rd, dnnl_backward, dnnl_unidirectional_left2right, &g->src, NULL, &g->wl_any,
        &g->wi_any, &g->bias_any, &g->dst, &g->dst_iter, &g->src, NULL, &g->wl_any, &g->wi_any,
        &g->bias_any, &g->dst, &g->dst_iter, 0));
    DNNL_CHECK(dnnl_primitive_desc_create(&pd, &rd, NULL, eng, g->fwd_pd));
    DNNL_CHECK(dnnl_primitive_create(&g->bwd, pd));
    g->bw_wl = to_prim_layout(pd, DNNL_ARG_WEIGHTS_LAYER, g->wl_u, reorder_ms);
    g->bw_wi = to_prim_layout(pd, DNNL_ARG_WEIGHTS_ITER, g->wi_u, reorder_ms);
    g->bw_bias = to_prim_layout(pd, DNNL_ARG_BIAS, g->bias_u, reorder_ms);
    const dnnl_memory_desc_t *bws_md = dnnl_primitive_desc_query_md(pd, dnnl_query_workspace_md, 0);
    if (!bws_md || !dnnl_memory_desc_equal(bws_md, ws_md))
        bench_fail("backward workspace md differs from the forward's");
    g->d_src = shared_d_src ? shared_d_src : mem_new(&g->src);
    g->d_dst = mem_new(&g->dst);
    bench_fill_uniform(mem_ptr(g->d_dst), (size_t)T * B * H, -1.f, 1.f);
    g->d_dst_iter = mem_new(&g->dst_iter);
    memset(mem_ptr(g->d_dst_iter), 0, mem_bytes(g->d_dst_iter));
    g->d_wl = mem_new(dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md,
                                                   DNNL_ARG_DIFF_WEIGHTS_LAYER));
    g->d_wi = mem_new(dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md,
                                                   DNNL_ARG_DIFF_WEIGHTS_ITER));
    g->d_bias = mem_new(dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md,
                                                     DNNL_ARG_DIFF_BIAS));
    DNNL_CHECK(dnnl_primitive_desc_destroy(pd));
}

static void group_infer(group *g) {
    dnnl_exec_arg_t a[] = {{DNNL_ARG_SRC_LAYER, g->m_src},    {DNNL_ARG_WEIGHTS_LAYER, g->inf_wl},
                           {DNNL_ARG_WEIGHTS_ITER, g->inf_wi}, {DNNL_ARG_BIAS, g->inf_bias},
                           {DNNL_ARG_DST_LAYER, g->m_dst},     {DNNL_ARG_DST_ITER, g->m_dst_iter}};
    DNNL_CHECK(dnnl_primitive_execute(g->inf, strm, (int)(sizeof a / sizeof a[0]), a));
}

static void group_train_fwd(group *g) {
    dnnl_exec_arg_t a[] = {{DNNL_ARG_SRC_LAYER, g->m_src},   {DNNL_ARG_WEIGHTS_LAYER, g->tr_wl},
                           {DNNL_ARG_WEIGHTS_ITER, g->tr_wi}, {DNNL_ARG_BIAS, g->tr_bias},
                           {DNNL_ARG_DST_LAYER, g->m_dst},    {DNNL_ARG_DST_ITER, g->m_dst_iter},
                           {DNNL_ARG_WORKSPACE, g->ws}};
    DNNL_CHECK(dnnl_primitive_execute(g->fwd, strm, (int)(sizeof a / sizeof a[0]), a));
}

static void group_bwd(group *g) {
    memset(mem_ptr(g->d_wl), 0, mem_bytes(g->d_wl));
    memset(mem_ptr(g->d_wi), 0, mem_bytes(g->d_wi));
    memset(mem_ptr(g->d_bias), 0, mem_bytes(g->d_bias));
    dnnl_exec_arg_t a[] = {
        {DNNL_ARG_SRC_LAYER, g->m_src},          {DNNL_ARG_WEIGHTS_LAYER, g->bw_wl},
        {DNNL_ARG_WEIGHTS_ITER, g->bw_wi},       {DNNL_ARG_BIAS, g->bw_bias},
        {DNNL_ARG_DST_LAYER, g->m_dst},          {DNNL_ARG_DST_ITER, g->m_dst_iter},
        {DNNL_ARG_WORKSPACE, g->ws},             {DNNL_ARG_DIFF_SRC_LAYER, g->d_src},
        {DNNL_ARG_DIFF_DST_LAYER, g->d_dst},     {DNNL_ARG_DIFF_DST_ITER, g->d_dst_iter},
        {DNNL_ARG_DIFF_WEIGHTS_LAYER, g->d_wl},  {DNNL_ARG_DIFF_WEIGHTS_ITER, g->d_wi},
        {DNNL_ARG_DIFF_BIAS, g->d_bias}};
    DNNL_CHECK(dnnl_primitive_execute(g->bwd, strm, (int)(sizeof a / sizeof a[0]), a));
}

int main(int argc, char **argv) {
    bench_name = "onednn_lbr_gru";
    bench_args a;
    bench_parse(argc, argv, &a);
    if (strcmp(a.cell, "gru")) bench_fail("oneDNN has no A-GRU; only --cell gru is timed");
    if (strcmp(a.device, "cpu")) bench_fail("this driver times oneDNN's CPU engine only");
    if (strcmp(a.dtype, "f32")) bench_fail("this driver times oneDNN's float32 GRU only");
    if (a.threads > 0) omp_set_num_threads((int)a.threads);
    const int training = !a.fwd_only;

    DNNL_CHECK(dnnl_engine_create(&eng, dnnl_cpu, 0));
    DNNL_CHECK(dnnl_stream_create(&strm, eng, dnnl_stream_default_flags));

    /* Groups: [layer 0] then [layers 1..L-1], or all L together when I == H. */
    group g[2];
    int ng = 0;
    double reorder_ms = 0.0;
    if (a.I == a.H) {
        group_setup(&g[0], a.T, a.B, a.H, a.layers, a.I, training, NULL, NULL, &reorder_ms);
        ng = 1;
    } else {
        group_setup(&g[0], a.T, a.B, a.H, 1, a.I, training, NULL, NULL, &reorder_ms);
        ng = 1;
        if (a.layers > 1) {
            /* Layer 1's input is layer 0's output; its input gradient is layer 0's output
             * gradient (d_dst of group 0). */
            group_setup(&g[1], a.T, a.B, a.H, a.layers - 1, a.H, training, g[0].m_dst,
                        training ? g[0].d_dst : NULL, &reorder_ms);
            ng = 2;
        }
    }

    double *tf = bench_alloc(sizeof(double) * (size_t)a.reps);
    double *tb = bench_alloc(sizeof(double) * (size_t)a.reps);
    for (long r = -a.warmup; r < a.reps; ++r) {
        double t0 = bench_now_ms();
        for (int i = 0; i < ng; ++i) group_infer(&g[i]);
        DNNL_CHECK(dnnl_stream_wait(strm));
        double t1 = bench_now_ms();
        if (r >= 0) tf[r] = t1 - t0;
    }
    double fwd_med = bench_median(tf, a.reps), fwd_min = bench_min(tf, a.reps);
    double fb_med = -1.0, fb_min = -1.0;
    if (training) {
        for (long r = -a.warmup; r < a.reps; ++r) {
            double t0 = bench_now_ms();
            for (int i = 0; i < ng; ++i) group_train_fwd(&g[i]);
            for (int i = ng - 1; i >= 0; --i) group_bwd(&g[i]);
            DNNL_CHECK(dnnl_stream_wait(strm));
            double t1 = bench_now_ms();
            if (r >= 0) tb[r] = t1 - t0;
        }
        fb_med = bench_median(tb, a.reps);
        fb_min = bench_min(tb, a.reps);
    }

    /* A checksum of y, so a broken run (NaN, all zeros) is visible in the output. */
    const float *y = mem_ptr(g[ng - 1].m_dst);
    double cs = 0.0;
    for (long i = 0; i < a.T * a.B * a.H; ++i) cs += (double)y[i] * y[i];

    const dnnl_version_t *v = dnnl_version();
    printf("{\"bench\": \"%s\", \"impl\": \"onednn\", \"cell\": \"gru\", \"device\": \"cpu\", "
           "\"T\": %ld, \"I\": %ld, \"H\": %ld, \"B\": %ld, \"layers\": %ld, "
           "\"threads\": %d, \"omp_wait_policy\": \"%s\", \"reps\": %ld, \"warmup\": %ld, "
           "\"fwd_ms_median\": %.4f, \"fwd_ms_min\": %.4f, "
           "\"fwdbwd_ms_median\": %.4f, \"fwdbwd_ms_min\": %.4f, \"reorder_ms\": %.4f, "
           "\"y_sumsq\": %.6g, \"version\": \"%d.%d.%d\"}\n",
           bench_name, a.T, a.I, a.H, a.B, a.layers, omp_get_max_threads(),
           bench_env("OMP_WAIT_POLICY"), a.reps, a.warmup, fwd_med, fwd_min, fb_med, fb_min,
           reorder_ms, cs, v->major, v->minor, v->patch);
    free(tf);
    free(tb);
    /* Process exit releases the oneDNN objects. */
    return 0;
}

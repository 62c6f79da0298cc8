/* Soak test (issue 8): many GRU / A-GRU forward + backward calls with shapes varying inside a
 * reserved, fixed arena; resident memory (/proc/self/statm) is sampled every `every` calls and
 * must not grow after warm-up beyond a small bound. Prints the RSS curve.
 *
 *   soak_rnn [calls] [every]      (defaults 100000, calls/20)
 * Exit status 0 = pass; 1 = RSS grew, a call failed, the arena grew, or a result was not finite.
 *
 * Shapes: T in 1..8, B in 1..6, I = 5, H = 8, L = 2 (GRU unidirectional and bidirectional, A-GRU);
 * all buffers are allocated once for the largest shape, the context is created with
 * KF_CONTEXT_FIXED_ARENA and kf_context_reserve()d to the largest workspace, so a steady-state call
 * must not allocate at all (arena grow_count stays constant). */
#include "kfuse.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TMAX 8
#define BMAX 6
#define I 5
#define H 8
#define L 2
#define MAXW 40

static long rss_kib(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, res = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &size, &res) != 2) res = 0;
        fclose(f);
    }
    return res * (sysconf(_SC_PAGESIZE) / 1024);
}

static uint64_t rng = 42;
static float frand(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xFFFFFF) / (float)0xFFFFFF * 2.0f - 1.0f;
}

typedef struct net {
    kf_rnn_plan *plan;
    int nw, D;
    kf_tensor w[MAXW], dw[MAXW];
    float *wbuf[MAXW], *dwbuf[MAXW];
} net;

#define CHECK(expr)                                                                                \
    do {                                                                                           \
        kf_status s_ = (expr);                                                                     \
        if (s_ != KF_OK) {                                                                         \
            fprintf(stderr, "soak_rnn: %s failed: %s (%s)\n", #expr, kf_status_string(s_),         \
                    kf_last_error_message());                                                      \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static void net_init(net *n, kf_context *ctx, int cell, uint32_t flags) {
    memset(n, 0, sizeof *n);
    kf_rnn_desc d;
    kf_rnn_desc_init(&d);
    d.cell = cell, d.num_layers = L, d.input_size = I, d.hidden_size = H, d.flags = flags;
    d.dropout = 0.25f;
    CHECK(kf_rnn_plan_create(ctx, &d, &n->plan));
    n->D = (flags & KF_RNN_BIDIRECTIONAL) ? 2 : 1;
    CHECK(kf_rnn_weight_count(n->plan, &n->nw));
    for (int k = 0; k < n->nw; k++) {
        int32_t nd;
        int64_t sh[KF_MAX_DIMS];
        CHECK(kf_rnn_weight_info(n->plan, k, NULL, &nd, sh));
        int64_t ne = sh[0] * (nd == 2 ? sh[1] : 1);
        n->wbuf[k] = malloc((size_t)ne * 4);
        n->dwbuf[k] = malloc((size_t)ne * 4);
        for (int64_t i = 0; i < ne; i++) n->wbuf[k][i] = 0.3f * frand();
        CHECK(kf_tensor_init(&n->w[k], n->wbuf[k], KF_DTYPE_F32, nd, sh));
        CHECK(kf_tensor_init(&n->dw[k], n->dwbuf[k], KF_DTYPE_F32, nd, sh));
    }
}

static void net_free(net *n) {
    for (int k = 0; k < n->nw; k++) free(n->wbuf[k]), free(n->dwbuf[k]);
    kf_rnn_plan_destroy(n->plan);
}

int main(int argc, char **argv) {
    long calls = argc > 1 ? atol(argv[1]) : 100000;
    long every = argc > 2 ? atol(argv[2]) : (calls / 20 > 0 ? calls / 20 : 1);
    if (calls < 1 || every < 1) return 2;

    kf_context_desc cd;
    kf_context_desc_init(&cd);
    cd.num_threads = 1;
    cd.flags = KF_CONTEXT_FIXED_ARENA;
    kf_context *ctx;
    CHECK(kf_context_create(&cd, &ctx));
    net nets[3];
    net_init(&nets[0], ctx, KF_RNN_GRU, 0);
    net_init(&nets[1], ctx, KF_RNN_GRU, KF_RNN_BIDIRECTIONAL);
    net_init(&nets[2], ctx, KF_RNN_AGRU, 0);

    /* the largest workspace and reserve over every shape and net */
    size_t ws_max = 0, rs_max = 0;
    for (int k = 0; k < 3; k++)
        for (int64_t T = 1; T <= TMAX; T++)
            for (int64_t B = 1; B <= BMAX; B++) {
                size_t ws, rs;
                CHECK(kf_rnn_workspace_size(nets[k].plan, T, B, KF_MODE_TRAINING, &ws, &rs));
                ws_max = ws > ws_max ? ws : ws_max;
                rs_max = rs > rs_max ? rs : rs_max;
            }
    CHECK(kf_context_reserve(ctx, ws_max));
    uint64_t grow0;
    CHECK(kf_context_arena_info(ctx, NULL, &grow0));

    size_t nx = TMAX * BMAX * I, ny = TMAX * BMAX * 2 * H, nh = L * 2 * BMAX * H;
    float *x = malloc(nx * 4), *y = malloc(ny * 4), *dy = malloc(ny * 4), *dx = malloc(nx * 4);
    float *h0 = malloc(nh * 4), *hn = malloc(nh * 4), *dh0 = malloc(nh * 4);
    int32_t *len = malloc(BMAX * 4);
    void *reserve = aligned_alloc(64, (rs_max + 63) / 64 * 64);
    for (size_t i = 0; i < nx; i++) x[i] = frand();
    for (size_t i = 0; i < ny; i++) dy[i] = frand();
    for (size_t i = 0; i < nh; i++) h0[i] = 0.5f * frand();

    long warm = calls / 5 > every ? calls / 5 : every; /* first 20%: warm-up (allocator, OMP) */
    long rss_warm = 0, rss_max_after = 0, rss0 = rss_kib();
    printf("soak_rnn: %ld calls (forward+backward pairs count as 2), arena %zu bytes fixed, "
           "RSS every %ld calls\n", calls, ws_max, every);
    printf("%10s %10s\n", "calls", "rss_kib");
    printf("%10d %10ld\n", 0, rss0);
    long done = 0;
    uint64_t it = 0;
    while (done < calls) {
        net *n = &nets[it % 3];
        int64_t T = 1 + (int64_t)((it / 3) % TMAX), B = 1 + (int64_t)((it / 7) % BMAX);
        it++;
        int64_t xs[3] = {T, B, I}, ys[3] = {T, B, (int64_t)n->D * H}, hs[3] = {L * n->D, B, H};
        bool use_len = it % 2;
        for (int64_t b = 0; b < B; b++) len[b] = (int32_t)(1 + (b + (int64_t)it) % T);
        size_t ws, rs;
        CHECK(kf_rnn_workspace_size(n->plan, T, B, KF_MODE_TRAINING, &ws, &rs));
        kf_rnn_forward_args fa;
        kf_rnn_forward_args_init(&fa);
        CHECK(kf_tensor_init(&fa.x, x, KF_DTYPE_F32, 3, xs));
        CHECK(kf_tensor_init(&fa.h0, h0, KF_DTYPE_F32, 3, hs));
        CHECK(kf_tensor_init(&fa.y, y, KF_DTYPE_F32, 3, ys));
        CHECK(kf_tensor_init(&fa.hn, hn, KF_DTYPE_F32, 3, hs));
        int64_t ls[1] = {B};
        if (use_len) CHECK(kf_tensor_init(&fa.lengths, len, KF_DTYPE_I32, 1, ls));
        fa.weights = n->w, fa.num_weights = n->nw;
        fa.dropout_seed = 7, fa.dropout_offset = it;
        kf_mode mode = (it % 5 == 0) ? KF_MODE_INFERENCE : KF_MODE_TRAINING;
        CHECK(kf_rnn_forward(n->plan, mode, &fa, NULL, 0, reserve, rs));
        done++;
        if (mode == KF_MODE_TRAINING) {
            kf_rnn_backward_args ba;
            kf_rnn_backward_args_init(&ba);
            ba.x = fa.x, ba.h0 = fa.h0, ba.lengths = fa.lengths, ba.weights = n->w;
            ba.num_weights = n->nw, ba.dropout_seed = 7, ba.dropout_offset = it;
            CHECK(kf_tensor_init(&ba.dy, dy, KF_DTYPE_F32, 3, ys));
            CHECK(kf_tensor_init(&ba.dx, dx, KF_DTYPE_F32, 3, xs));
            CHECK(kf_tensor_init(&ba.dh0, dh0, KF_DTYPE_F32, 3, hs));
            ba.dweights = n->dw, ba.num_dweights = n->nw;
            CHECK(kf_rnn_backward(n->plan, (it & 8) ? KF_GRAD_ACCUMULATE : KF_GRAD_OVERWRITE, &ba,
                                  NULL, 0, reserve, rs));
            done++;
            if (!isfinite(dx[0]) || !isfinite(dh0[0])) {
                fprintf(stderr, "soak_rnn: non-finite gradient at call %ld\n", done);
                return 1;
            }
            /* keep accumulated weight gradients bounded */
            if (it % 64 == 0)
                for (int k = 0; k < n->nw; k++) memset(n->dwbuf[k], 0, 4);
        }
        if (!isfinite(y[0])) {
            fprintf(stderr, "soak_rnn: non-finite output at call %ld\n", done);
            return 1;
        }
        if (done / every != (done - 1 - (mode == KF_MODE_TRAINING)) / every || done >= calls) {
            long r = rss_kib();
            printf("%10ld %10ld\n", done, r);
            if (done >= warm && rss_warm == 0) rss_warm = r;
            if (rss_warm && r > rss_max_after) rss_max_after = r;
        }
    }
    uint64_t grow1;
    CHECK(kf_context_arena_info(ctx, NULL, &grow1));
    for (int k = 0; k < 3; k++) net_free(&nets[k]);
    kf_context_destroy(ctx);
    free(x), free(y), free(dy), free(dx), free(h0), free(hn), free(dh0), free(len), free(reserve);

    long bound = 256; /* KiB: allocator noise, never a per-call leak */
    long growth = rss_warm ? rss_max_after - rss_warm : 0;
    printf("soak_rnn: RSS %ld KiB at start, %ld KiB after warm-up, max %ld KiB after: growth %ld "
           "KiB (bound %ld); arena grow_count %llu -> %llu\n", rss0, rss_warm, rss_max_after,
           growth, bound, (unsigned long long)grow0, (unsigned long long)grow1);
    if (grow1 != grow0) {
        fprintf(stderr, "soak_rnn: FAIL: the fixed arena was reallocated\n");
        return 1;
    }
    if (growth > bound) {
        fprintf(stderr, "soak_rnn: FAIL: RSS grew by %ld KiB after warm-up\n", growth);
        return 1;
    }
    printf("soak_rnn: ok\n");
    return 0;
}

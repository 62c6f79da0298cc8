/* Concurrency (issue 8): N = 4 threads, each with its own context (num_threads = 1), run GRU and
 * A-GRU forward + backward on shared read-only weights and inputs; every thread must reproduce the
 * single-threaded run bit for bit, and the shared inputs must be left untouched. The contract
 * (kfuse.h): separate contexts are independent and may be used concurrently.
 *
 * scripts/tsan.sh builds this test and the library with ThreadSanitizer and runs it; the env var
 * KF_CONCURRENCY_ROUNDS (default 3) sets how many forward+backward rounds each thread runs. */
#define _POSIX_C_SOURCE 200809L /* pthread_barrier_t under -std=c11 */
#ifdef KF_CONCURRENCY_STANDALONE
/* Without Criterion (whose forked, mmapped test arena does not start under ThreadSanitizer):
 * scripts/tsan.sh builds this file with -DKF_CONCURRENCY_STANDALONE. */
#include <stdio.h>
#include <stdlib.h>
static int kf__failures;
#define cr_assert(c, ...)                                                                         \
    do {                                                                                          \
        if (!(c)) {                                                                               \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #c);                          \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)
#define cr_assert_eq(a, b, ...) cr_assert((a) == (b))
#define cr_assert_leq(a, b, ...) cr_assert((a) <= (b))
#define cr_assert_not_null(a, ...) cr_assert((a) != NULL)
#define cr_expect_eq(a, b, ...)                                                                   \
    do {                                                                                          \
        if ((a) != (b)) {                                                                         \
            fprintf(stderr, "FAIL %s:%d: %s != %s\n", __FILE__, __LINE__, #a, #b);                \
            kf__failures++;                                                                       \
        }                                                                                         \
    } while (0)
#define Test(suite, name, ...) static void suite##_##name(void)
#else
#include <criterion/criterion.h>
#endif

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kfuse.h"

#define NTHREADS 4
#define MAXW 40

typedef struct problem {
    int cell, L;
    uint32_t flags;
    int64_t T, B, I, H;
    int nw;
    int64_t wshape[MAXW][2];
    int32_t wnd[MAXW];
    float *w[MAXW]; /* shared, read-only */
    float *x, *h0, *dy, *dhn;
    int64_t nx, ny, nh, nwel[MAXW];
} problem;

typedef struct result {
    float *y, *hn, *dx, *dh0, *dw[MAXW];
    kf_status status;
    char msg[256];
} result;

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static float *rand_buf(uint64_t *s, int64_t n, float scale) {
    float *p = malloc((size_t)n * sizeof *p);
    cr_assert_not_null(p);
    for (int64_t i = 0; i < n; i++)
        p[i] = scale * ((float)(splitmix(s) >> 40) / (float)(1 << 24) * 2.0f - 1.0f);
    return p;
}

static void problem_init(problem *p, int cell, int L, uint32_t flags, int64_t T, int64_t B,
                         int64_t I, int64_t H, uint64_t seed) {
    memset(p, 0, sizeof *p);
    p->cell = cell, p->L = L, p->flags = flags, p->T = T, p->B = B, p->I = I, p->H = H;
    int D = (flags & KF_RNN_BIDIRECTIONAL) ? 2 : 1;
    /* a throwaway context/plan to learn the weight shapes */
    kf_context_desc cd;
    kf_context_desc_init(&cd);
    cd.num_threads = 1;
    kf_context *ctx;
    cr_assert_eq(kf_context_create(&cd, &ctx), KF_OK);
    kf_rnn_desc rd;
    kf_rnn_desc_init(&rd);
    rd.cell = cell, rd.num_layers = L, rd.input_size = I, rd.hidden_size = H, rd.flags = flags;
    kf_rnn_plan *plan;
    cr_assert_eq(kf_rnn_plan_create(ctx, &rd, &plan), KF_OK, "%s", kf_last_error_message());
    cr_assert_eq(kf_rnn_weight_count(plan, &p->nw), KF_OK);
    cr_assert_leq(p->nw, MAXW);
    float scale = 1.0f / sqrtf((float)H);
    for (int k = 0; k < p->nw; k++) {
        cr_assert_eq(kf_rnn_weight_info(plan, k, NULL, &p->wnd[k], p->wshape[k]), KF_OK);
        p->nwel[k] = p->wshape[k][0] * (p->wnd[k] == 2 ? p->wshape[k][1] : 1);
        p->w[k] = rand_buf(&seed, p->nwel[k], scale);
    }
    kf_rnn_plan_destroy(plan);
    kf_context_destroy(ctx);
    p->nx = T * B * I, p->ny = T * B * D * H, p->nh = (int64_t)L * D * B * H;
    p->x = rand_buf(&seed, p->nx, 1.0f);
    p->h0 = rand_buf(&seed, p->nh, 0.5f);
    p->dy = rand_buf(&seed, p->ny, 1.0f);
    p->dhn = rand_buf(&seed, p->nh, 1.0f);
}

static void problem_free(problem *p) {
    for (int k = 0; k < p->nw; k++) free(p->w[k]);
    free(p->x), free(p->h0), free(p->dy), free(p->dhn);
}

static void result_free(result *r, const problem *p) {
    free(r->y), free(r->hn), free(r->dx), free(r->dh0);
    for (int k = 0; k < p->nw; k++) free(r->dw[k]);
}

/* One full forward (training) + backward on a fresh context; no Criterion asserts here (runs on
 * worker threads): failures are recorded in r->status / r->msg. */
static void run_once(const problem *p, result *r, int rounds) {
    memset(r, 0, sizeof *r);
    int D = (p->flags & KF_RNN_BIDIRECTIONAL) ? 2 : 1;
    r->y = calloc((size_t)p->ny, 4), r->hn = calloc((size_t)p->nh, 4);
    r->dx = calloc((size_t)p->nx, 4), r->dh0 = calloc((size_t)p->nh, 4);
    for (int k = 0; k < p->nw; k++) r->dw[k] = calloc((size_t)p->nwel[k], 4);
    kf_context_desc cd;
    kf_context_desc_init(&cd);
    cd.num_threads = 1;
    kf_context *ctx = NULL;
    kf_rnn_plan *plan = NULL;
    void *reserve = NULL;
    kf_status s = kf_context_create(&cd, &ctx);
    if (s != KF_OK) goto out;
    kf_rnn_desc rd;
    kf_rnn_desc_init(&rd);
    rd.cell = p->cell, rd.num_layers = p->L, rd.input_size = p->I, rd.hidden_size = p->H;
    rd.flags = p->flags;
    if ((s = kf_rnn_plan_create(ctx, &rd, &plan)) != KF_OK) goto out;
    size_t wsb, rsb;
    if ((s = kf_rnn_workspace_size(plan, p->T, p->B, KF_MODE_TRAINING, &wsb, &rsb)) != KF_OK)
        goto out;
    reserve = aligned_alloc(64, (rsb + 63) / 64 * 64);
    kf_tensor wt[MAXW], dwt[MAXW];
    for (int k = 0; k < p->nw; k++) {
        kf_tensor_init(&wt[k], p->w[k], KF_DTYPE_F32, p->wnd[k], p->wshape[k]);
        kf_tensor_init(&dwt[k], r->dw[k], KF_DTYPE_F32, p->wnd[k], p->wshape[k]);
    }
    int64_t xs[3] = {p->T, p->B, p->I}, ys[3] = {p->T, p->B, D * p->H};
    int64_t hs[3] = {(int64_t)p->L * D, p->B, p->H};
    for (int round = 0; round < rounds; round++) {
        kf_rnn_forward_args fa;
        kf_rnn_forward_args_init(&fa);
        kf_tensor_init(&fa.x, p->x, KF_DTYPE_F32, 3, xs);
        kf_tensor_init(&fa.h0, p->h0, KF_DTYPE_F32, 3, hs);
        kf_tensor_init(&fa.y, r->y, KF_DTYPE_F32, 3, ys);
        kf_tensor_init(&fa.hn, r->hn, KF_DTYPE_F32, 3, hs);
        fa.weights = wt, fa.num_weights = p->nw;
        if ((s = kf_rnn_forward(plan, KF_MODE_TRAINING, &fa, NULL, 0, reserve, rsb)) != KF_OK)
            goto out;
        kf_rnn_backward_args ba;
        kf_rnn_backward_args_init(&ba);
        ba.x = fa.x, ba.h0 = fa.h0, ba.weights = wt, ba.num_weights = p->nw;
        kf_tensor_init(&ba.dy, p->dy, KF_DTYPE_F32, 3, ys);
        kf_tensor_init(&ba.dhn, p->dhn, KF_DTYPE_F32, 3, hs);
        kf_tensor_init(&ba.dx, r->dx, KF_DTYPE_F32, 3, xs);
        kf_tensor_init(&ba.dh0, r->dh0, KF_DTYPE_F32, 3, hs);
        ba.dweights = dwt, ba.num_dweights = p->nw;
        if ((s = kf_rnn_backward(plan, KF_GRAD_OVERWRITE, &ba, NULL, 0, reserve, rsb)) != KF_OK)
            goto out;
    }
out:
    r->status = s;
    if (s != KF_OK) snprintf(r->msg, sizeof r->msg, "%s", kf_last_error_message());
    free(reserve);
    kf_rnn_plan_destroy(plan);
    kf_context_destroy(ctx);
}

typedef struct job {
    const problem *p;
    result r;
    int rounds;
    pthread_barrier_t *start;
} job;

static void *worker(void *arg) {
    job *j = arg;
    pthread_barrier_wait(j->start); /* all threads enter the library together */
    run_once(j->p, &j->r, j->rounds);
    return NULL;
}

static int rounds_from_env(void) {
    const char *e = getenv("KF_CONCURRENCY_ROUNDS");
    int n = e ? atoi(e) : 3;
    return n >= 1 && n <= 100000 ? n : 3;
}

static int64_t count_diff(const float *a, const float *b, int64_t n) {
    int64_t d = 0;
    for (int64_t i = 0; i < n; i++) d += memcmp(&a[i], &b[i], 4) != 0;
    return d;
}

static void check_concurrent(int cell, int L, uint32_t flags, int64_t T, int64_t B, int64_t I,
                             int64_t H) {
    problem p;
    problem_init(&p, cell, L, flags, T, B, I, H, 1234 + (uint64_t)cell);
    /* copies to prove the shared inputs are read-only */
    float *x0 = malloc((size_t)p.nx * 4), *w0 = malloc((size_t)p.nwel[0] * 4);
    memcpy(x0, p.x, (size_t)p.nx * 4);
    memcpy(w0, p.w[0], (size_t)p.nwel[0] * 4);
    result ref;
    run_once(&p, &ref, 1);
    cr_assert_eq(ref.status, KF_OK, "single-threaded run: %s", ref.msg);

    int rounds = rounds_from_env();
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, NTHREADS);
    job jobs[NTHREADS];
    pthread_t th[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        jobs[i] = (job){.p = &p, .rounds = rounds, .start = &start};
        cr_assert_eq(pthread_create(&th[i], NULL, worker, &jobs[i]), 0);
    }
    for (int i = 0; i < NTHREADS; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&start);
    for (int i = 0; i < NTHREADS; i++) {
        result *r = &jobs[i].r;
        cr_expect_eq(r->status, KF_OK, "thread %d: %s", i, r->msg);
        if (r->status != KF_OK) continue;
        int64_t d = count_diff(r->y, ref.y, p.ny) + count_diff(r->hn, ref.hn, p.nh) +
                    count_diff(r->dx, ref.dx, p.nx) + count_diff(r->dh0, ref.dh0, p.nh);
        for (int k = 0; k < p.nw; k++) d += count_diff(r->dw[k], ref.dw[k], p.nwel[k]);
        cr_expect_eq(d, 0, "cell %d: thread %d differs from the single-threaded run in %lld "
                     "elements (y, hn, dx, dh0, dweights)", cell, i, (long long)d);
    }
    cr_expect_eq(memcmp(x0, p.x, (size_t)p.nx * 4), 0, "shared x was written");
    cr_expect_eq(memcmp(w0, p.w[0], (size_t)p.nwel[0] * 4), 0, "shared weights were written");
    for (int i = 0; i < NTHREADS; i++) result_free(&jobs[i].r, &p);
    result_free(&ref, &p);
    free(x0), free(w0);
    problem_free(&p);
}

/* Shapes big enough that OpenBLAS takes its blocked (buffered) sgemm path: the input projection
 * is [T*B, I] x [I, 3H] with T*B = 256. */
Test(concurrency, gru_forward_backward_bit_identical, .timeout = 300) {
    check_concurrent(KF_RNN_GRU, 2, 0, 16, 16, 32, 64);
}

Test(concurrency, gru_bidirectional_bit_identical, .timeout = 300) {
    check_concurrent(KF_RNN_GRU, 1, KF_RNN_BIDIRECTIONAL, 8, 8, 16, 32);
}

Test(concurrency, agru_forward_backward_bit_identical, .timeout = 300) {
    check_concurrent(KF_RNN_AGRU, 2, 0, 16, 16, 32, 64);
}

#ifdef KF_CONCURRENCY_STANDALONE
int main(void) {
    concurrency_gru_forward_backward_bit_identical();
    concurrency_gru_bidirectional_bit_identical();
    concurrency_agru_forward_backward_bit_identical();
    printf("test_concurrency: %s (3 configurations, %d threads)\n", kf__failures ? "FAILED" : "ok",
           NTHREADS);
    return kf__failures ? 1 : 0;
}
#endif

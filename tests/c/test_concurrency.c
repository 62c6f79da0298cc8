/* Concurrency (issues 8 and 39). The contract (kfuse.h): a context, and every plan made from it,
 * is used by one thread at a time; separate contexts are independent and may be used concurrently.
 * Every op (GRU, A-GRU, SKLinear, KANLinear, KANConv2d) in every dtype (float32, float64,
 * bfloat16, float16) runs forward + backward on shared read-only inputs:
 *  - own contexts: N = 4 threads, each with its own context (num_threads = 1) and its own plans of
 *    every case, entering the library together;
 *  - one context: the plans of every case made once on one context, then N threads calling them in
 *    turn (a mutex: one thread at a time, as the contract asks, but another thread each call);
 * every thread must reproduce the single-threaded run bit for bit, every output written, and the
 * shared inputs must be left untouched.
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

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kfuse.h"

#define NTHREADS 4
#define MAXP 40            /* parameters of a case (a 2-layer bidirectional GRU has 16) */
#define MAXO (4 + MAXP)    /* outputs: y, dx, hn, dh0, then a gradient per parameter */
#define MAXC 32            /* cases */

enum { OP_GRU, OP_AGRU, OP_SKL, OP_KANL, OP_KANC };
static const char *const op_name[] = {"GRU", "A-GRU", "SKLinear", "KANLinear", "KANConv2d"};
static const kf_dtype all_dtypes[4] = {KF_DTYPE_F32, KF_DTYPE_F64, KF_DTYPE_BF16, KF_DTYPE_F16};

static size_t dtype_bytes(kf_dtype dt) {
    return dt == KF_DTYPE_F64 ? 8 : dt == KF_DTYPE_F32 || dt == KF_DTYPE_I32 ? 4 : 2;
}

/* A tensor's memory, rank and shape. */
typedef struct buf {
    void *p;
    int32_t nd;
    int64_t shape[KF_MAX_DIMS];
    int64_t n;
} buf;

static void buf_alloc(buf *b, int32_t nd, const int64_t *shape, kf_dtype dt) {
    b->nd = nd, b->n = 1;
    for (int i = 0; i < nd; i++) b->shape[i] = shape[i], b->n *= shape[i];
    b->p = calloc((size_t)(b->n > 0 ? b->n : 1), dtype_bytes(dt));
    cr_assert(b->p != NULL);
}

static kf_tensor ten(const buf *b, kf_dtype dt) {
    kf_tensor t;
    kf_tensor_init(&t, b->p, dt, b->nd, b->shape);
    return t;
}

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Values of either sign with magnitudes in [1/16, 1), each exact in dt: float32 and float64 by
 * their arithmetic, the 16-bit types by their bits (exponent and mantissa drawn directly). */
static void fill(uint64_t *s, const buf *b, kf_dtype dt) {
    for (int64_t i = 0; i < b->n; i++) {
        const uint64_t u = splitmix(s);
        const uint16_t sign = (uint16_t)((u & 1) << 15), e = (uint16_t)((u >> 1) & 3);
        const double v = ((u & 1) ? -1.0 : 1.0) * (0.0625 + 0.9375 * (double)(u >> 11) * 0x1p-53);
        switch (dt) {
        case KF_DTYPE_F32: ((float *)b->p)[i] = (float)v; break;
        case KF_DTYPE_F64: ((double *)b->p)[i] = v; break;
        case KF_DTYPE_BF16: /* 2^(e - 4) (1 + m/128), exponent field 123..126 */
            ((uint16_t *)b->p)[i] = sign | (uint16_t)((123 + e) << 7) | (uint16_t)((u >> 8) & 127);
            break;
        default: /* float16: exponent field 11..14 */
            ((uint16_t *)b->p)[i] = sign | (uint16_t)((11 + e) << 10) | (uint16_t)((u >> 8) & 1023);
        }
    }
}

/* One configuration: an op in a dtype, its shapes, and its shared read-only inputs. */
typedef struct kase {
    int op;
    kf_dtype dt;
    int32_t L;                      /* RNN layers; SKLinear terms */
    uint32_t flags;                 /* RNN */
    int64_t T, B, I, H;             /* RNN; SKLinear N = B, in = I, out = H, low rank = T;
                                       KANLinear N = B, in = I, out = H; KANConv2d batch B,
                                       C_in = I, C_out = H, images T x T */
    int np;
    buf par[MAXP];                  /* parameters */
    int learned[MAXP];              /* whether backward gives the parameter's gradient */
    buf x, dy, h, dhn, len;         /* x, dy (y's shape), RNN h0, dhn (h0's shape), lengths */
} kase;

/* A plan of a case's op. */
typedef struct plan {
    int op;
    void *p;
} plan;

static kf_status plan_make(kf_context *ctx, const kase *k, plan *pl) {
    pl->op = k->op, pl->p = NULL;
    switch (k->op) {
    case OP_GRU:
    case OP_AGRU: {
        kf_rnn_desc d;
        kf_rnn_desc_init(&d);
        d.cell = k->op == OP_GRU ? KF_RNN_GRU : KF_RNN_AGRU;
        d.num_layers = k->L, d.input_size = k->I, d.hidden_size = k->H, d.flags = k->flags;
        d.dtype = k->dt;
        return kf_rnn_plan_create(ctx, &d, (kf_rnn_plan **)&pl->p);
    }
    case OP_SKL: {
        kf_sklinear_desc d;
        kf_sklinear_desc_init(&d);
        d.in_features = k->I, d.out_features = k->H, d.num_terms = k->L, d.low_rank = (int32_t)k->T;
        d.dtype = k->dt;
        return kf_sklinear_plan_create(ctx, &d, (kf_sklinear_plan **)&pl->p);
    }
    case OP_KANL: {
        kf_kan_linear_desc d;
        kf_kan_linear_desc_init(&d);
        d.in_features = k->I, d.out_features = k->H, d.dtype = k->dt;
        return kf_kan_linear_plan_create(ctx, &d, (kf_kan_linear_plan **)&pl->p);
    }
    default: {
        kf_kan_conv2d_desc d;
        kf_kan_conv2d_desc_init(&d);
        d.in_channels = k->I, d.out_channels = k->H, d.kernel_h = d.kernel_w = 3;
        d.pad_h = d.pad_w = 1, d.grid_size = 4, d.dtype = k->dt;
        return kf_kan_conv2d_plan_create(ctx, &d, (kf_kan_conv2d_plan **)&pl->p);
    }
    }
}

static void plan_free(plan *pl) {
    switch (pl->op) {
    case OP_GRU:
    case OP_AGRU: kf_rnn_plan_destroy(pl->p); break;
    case OP_SKL: kf_sklinear_plan_destroy(pl->p); break;
    case OP_KANL: kf_kan_linear_plan_destroy(pl->p); break;
    default: kf_kan_conv2d_plan_destroy(pl->p);
    }
    pl->p = NULL;
}

/* A case's shapes and inputs, learnt from a plan on a throwaway context. */
static void kase_init(kase *k, int op, kf_dtype dt, int32_t L, uint32_t flags, int64_t T,
                      int64_t B, int64_t I, int64_t H, uint64_t seed) {
    memset(k, 0, sizeof *k);
    k->op = op, k->dt = dt, k->L = L, k->flags = flags, k->T = T, k->B = B, k->I = I, k->H = H;
    kf_context_desc cd;
    kf_context_desc_init(&cd);
    cd.num_threads = 1;
    kf_context *ctx = NULL;
    cr_assert_eq(kf_context_create(&cd, &ctx), KF_OK);
    plan pl;
    cr_assert_eq(plan_make(ctx, k, &pl), KF_OK, "%s: %s", op_name[op], kf_last_error_message());
    int32_t np = 0;
    kf_status s = op <= OP_AGRU ? kf_rnn_weight_count(pl.p, &np)
                  : op == OP_SKL ? kf_sklinear_param_count(pl.p, &np)
                  : op == OP_KANL ? kf_kan_linear_param_count(pl.p, &np)
                                  : kf_kan_conv2d_param_count(pl.p, &np);
    cr_assert(s == KF_OK && np <= MAXP);
    k->np = np;
    for (int i = 0; i < np; i++) {
        int32_t nd = 0;
        int64_t shape[KF_MAX_DIMS];
        s = op <= OP_AGRU ? kf_rnn_weight_info(pl.p, i, NULL, &nd, shape)
            : op == OP_SKL ? kf_sklinear_param_info(pl.p, i, NULL, &nd, shape)
            : op == OP_KANL ? kf_kan_linear_param_info(pl.p, i, NULL, &nd, shape)
                            : kf_kan_conv2d_param_info(pl.p, i, NULL, &nd, shape);
        cr_assert_eq(s, KF_OK);
        buf_alloc(&k->par[i], nd, shape, dt);
        /* SKLinear: S1s, S2s and the bias learn, U1s and U2s are fixed; KAN: all but the grid */
        k->learned[i] = op <= OP_AGRU || (op == OP_SKL ? i != 2 && i != 3 : i != 0);
        if (op >= OP_KANL && i == 0) { /* the grid: efficient-kan's knots on [-1, 1] */
            kf_tensor g = ten(&k->par[0], dt);
            s = op == OP_KANL ? kf_kan_linear_uniform_grid(pl.p, -1.0f, 1.0f, &g)
                              : kf_kan_conv2d_uniform_grid(pl.p, -1.0f, 1.0f, &g);
            cr_assert_eq(s, KF_OK);
        } else {
            fill(&seed, &k->par[i], dt);
        }
    }
    const int64_t D = (flags & KF_RNN_BIDIRECTIONAL) ? 2 : 1;
    if (op <= OP_AGRU) {
        const int64_t xs[3] = {T, B, I}, ys[3] = {T, B, D * H}, hs[3] = {L * D, B, H};
        buf_alloc(&k->x, 3, xs, dt), buf_alloc(&k->dy, 3, ys, dt), buf_alloc(&k->h, 3, hs, dt);
        buf_alloc(&k->dhn, 3, hs, dt);
        fill(&seed, &k->h, dt), fill(&seed, &k->dhn, dt);
        buf_alloc(&k->len, 1, &B, KF_DTYPE_I32);
        for (int64_t b = 0; b < B; b++) ((int32_t *)k->len.p)[b] = (int32_t)(T - b % T);
    } else if (op != OP_KANC) {
        const int64_t xs[2] = {B, I}, ys[2] = {B, H};
        buf_alloc(&k->x, 2, xs, dt), buf_alloc(&k->dy, 2, ys, dt);
    } else {
        int64_t ho = 0, wo = 0;
        cr_assert_eq(kf_kan_conv2d_output_size(pl.p, T, T, &ho, &wo), KF_OK);
        const int64_t xs[4] = {B, I, T, T}, ys[4] = {B, H, ho, wo};
        buf_alloc(&k->x, 4, xs, dt), buf_alloc(&k->dy, 4, ys, dt);
    }
    fill(&seed, &k->x, dt), fill(&seed, &k->dy, dt);
    plan_free(&pl);
    kf_context_destroy(ctx);
}

static void kase_free(kase *k) {
    for (int i = 0; i < k->np; i++) free(k->par[i].p);
    free(k->x.p), free(k->dy.p), free(k->h.p), free(k->dhn.p), free(k->len.p);
}

/* A run's outputs: y, dx, (RNN) hn, dh0, then the learned parameters' gradients. */
typedef struct result {
    int n;
    buf out[MAXO];
    kf_status status;
    char msg[256];
} result;

static void result_alloc(result *r, const kase *k) {
    memset(r, 0, sizeof *r);
    buf_alloc(&r->out[r->n++], k->dy.nd, k->dy.shape, k->dt);
    buf_alloc(&r->out[r->n++], k->x.nd, k->x.shape, k->dt);
    if (k->op <= OP_AGRU) {
        buf_alloc(&r->out[r->n++], k->h.nd, k->h.shape, k->dt);
        buf_alloc(&r->out[r->n++], k->h.nd, k->h.shape, k->dt);
    }
    for (int i = 0; i < k->np; i++)
        if (k->learned[i]) buf_alloc(&r->out[r->n++], k->par[i].nd, k->par[i].shape, k->dt);
}

static void result_free(result *r) {
    for (int i = 0; i < r->n; i++) free(r->out[i].p);
}

/* Forward then backward of case k on plan pl into r (no Criterion asserts: runs on worker
 * threads; a failure is recorded in r->status and r->msg). Workspaces from the context's arena. */
static kf_status run_call(const kase *k, const plan *pl, result *r) {
    const kf_dtype dt = k->dt;
    kf_tensor par[MAXP], dpar[MAXP];
    for (int i = 0; i < k->np; i++) par[i] = ten(&k->par[i], dt);
    for (int i = 0, o = k->op <= OP_AGRU ? 4 : 2; i < k->np; i++) {
        kf_tensor_init(&dpar[i], NULL, dt, 0, NULL);
        if (k->learned[i]) dpar[i] = ten(&r->out[o++], dt);
    }
    const kf_tensor x = ten(&k->x, dt), dy = ten(&k->dy, dt), y = ten(&r->out[0], dt);
    const kf_tensor dx = ten(&r->out[1], dt);
    kf_status s;
    switch (k->op) {
    case OP_GRU:
    case OP_AGRU: {
        size_t wsb = 0, rsb = 0;
        if ((s = kf_rnn_workspace_size(pl->p, k->T, k->B, KF_MODE_TRAINING, &wsb, &rsb)) != KF_OK)
            return s;
        void *reserve = aligned_alloc(64, (rsb + 63) / 64 * 64 + 64);
        if (!reserve) return KF_ERR_OUT_OF_MEMORY;
        kf_rnn_forward_args fa;
        kf_rnn_forward_args_init(&fa);
        fa.x = x, fa.h0 = ten(&k->h, dt), fa.weights = par, fa.num_weights = k->np;
        fa.lengths = ten(&k->len, KF_DTYPE_I32), fa.y = y, fa.hn = ten(&r->out[2], dt);
        s = kf_rnn_forward(pl->p, KF_MODE_TRAINING, &fa, NULL, 0, reserve, rsb);
        if (s == KF_OK) {
            kf_rnn_backward_args ba;
            kf_rnn_backward_args_init(&ba);
            ba.x = x, ba.h0 = fa.h0, ba.weights = par, ba.num_weights = k->np;
            ba.lengths = fa.lengths, ba.dy = dy, ba.dhn = ten(&k->dhn, dt), ba.dx = dx;
            ba.dh0 = ten(&r->out[3], dt), ba.dweights = dpar, ba.num_dweights = k->np;
            s = kf_rnn_backward(pl->p, KF_GRAD_OVERWRITE, &ba, NULL, 0, reserve, rsb);
        }
        free(reserve);
        return s;
    }
    case OP_SKL: {
        kf_sklinear_forward_args fa;
        kf_sklinear_forward_args_init(&fa);
        fa.x = x, fa.S1s = par[0], fa.S2s = par[1], fa.U1s = par[2], fa.U2s = par[3];
        fa.bias = par[4], fa.y = y;
        if ((s = kf_sklinear_forward(pl->p, &fa, NULL, 0)) != KF_OK) return s;
        kf_sklinear_backward_args ba;
        kf_sklinear_backward_args_init(&ba);
        ba.x = x, ba.S1s = par[0], ba.S2s = par[1], ba.U1s = par[2], ba.U2s = par[3];
        ba.dy = dy, ba.dx = dx, ba.dS1s = dpar[0], ba.dS2s = dpar[1], ba.dbias = dpar[4];
        return kf_sklinear_backward(pl->p, KF_GRAD_OVERWRITE, &ba, NULL, 0);
    }
    case OP_KANL: {
        kf_kan_linear_forward_args fa;
        kf_kan_linear_forward_args_init(&fa);
        fa.x = x, fa.grid = par[0], fa.base_weight = par[1], fa.spline_weight = par[2];
        fa.spline_scaler = par[3], fa.y = y;
        if ((s = kf_kan_linear_forward(pl->p, &fa, NULL, 0)) != KF_OK) return s;
        kf_kan_linear_backward_args ba;
        kf_kan_linear_backward_args_init(&ba);
        ba.x = x, ba.grid = par[0], ba.base_weight = par[1], ba.spline_weight = par[2];
        ba.spline_scaler = par[3], ba.dy = dy, ba.dx = dx, ba.dbase_weight = dpar[1];
        ba.dspline_weight = dpar[2], ba.dspline_scaler = dpar[3];
        return kf_kan_linear_backward(pl->p, KF_GRAD_OVERWRITE, &ba, NULL, 0);
    }
    default: {
        kf_kan_conv2d_forward_args fa;
        kf_kan_conv2d_forward_args_init(&fa);
        fa.x = x, fa.grid = par[0], fa.base_weight = par[1], fa.spline_weight = par[2];
        fa.spline_scaler = par[3], fa.y = y;
        if ((s = kf_kan_conv2d_forward(pl->p, &fa, NULL, 0)) != KF_OK) return s;
        kf_kan_conv2d_backward_args ba;
        kf_kan_conv2d_backward_args_init(&ba);
        ba.x = x, ba.grid = par[0], ba.base_weight = par[1], ba.spline_weight = par[2];
        ba.spline_scaler = par[3], ba.dy = dy, ba.dx = dx, ba.dbase_weight = dpar[1];
        ba.dspline_weight = dpar[2], ba.dspline_scaler = dpar[3];
        return kf_kan_conv2d_backward(pl->p, KF_GRAD_OVERWRITE, &ba, NULL, 0);
    }
    }
}

static void record(result *r, kf_status s) {
    r->status = s;
    if (s != KF_OK) snprintf(r->msg, sizeof r->msg, "%s", kf_last_error_message());
}

/* ---- the cases ---------------------------------------------------------------------------- */
typedef struct suite {
    int n;
    kase k[MAXC];
    result ref[MAXC]; /* the single-threaded run */
    void *copy[MAXC]; /* the first parameter and x as they were: shared inputs stay untouched */
} suite;

static void add(suite *su, int op, kf_dtype dt, int32_t L, uint32_t flags, int64_t T, int64_t B,
                int64_t I, int64_t H) {
    cr_assert(su->n < MAXC);
    kase *k = &su->k[su->n++];
    kase_init(k, op, dt, L, flags, T, B, I, H, 1234 + (uint64_t)su->n);
}

/* Every op in every dtype at small shapes, and the float32 recurrent layers at shapes where
 * OpenBLAS takes its blocked (buffered) sgemm path (the input projection [T*B = 256, I] x
 * [I, 3H]). */
static void suite_init(suite *su) {
    memset(su, 0, sizeof *su);
    for (int d = 0; d < 4; d++) {
        const kf_dtype dt = all_dtypes[d];
        add(su, OP_GRU, dt, 2, KF_RNN_BIDIRECTIONAL, 6, 5, 8, 16);
        add(su, OP_AGRU, dt, 2, 0, 6, 5, 8, 16);
        add(su, OP_SKL, dt, 2, 0, 4, 16, 24, 20);
        add(su, OP_KANL, dt, 0, 0, 0, 16, 6, 5);
        add(su, OP_KANC, dt, 0, 0, 6, 2, 2, 3);
    }
    add(su, OP_GRU, KF_DTYPE_F32, 2, 0, 16, 16, 32, 64);
    add(su, OP_AGRU, KF_DTYPE_F32, 2, 0, 16, 16, 32, 64);
    kf_context_desc cd;
    kf_context_desc_init(&cd);
    cd.num_threads = 1;
    kf_context *ctx = NULL;
    cr_assert_eq(kf_context_create(&cd, &ctx), KF_OK);
    for (int c = 0; c < su->n; c++) {
        const kase *k = &su->k[c];
        const size_t px = (size_t)k->x.n * dtype_bytes(k->dt);
        const size_t pw = (size_t)k->par[1].n * dtype_bytes(k->dt);
        su->copy[c] = malloc(px + pw);
        cr_assert(su->copy[c] != NULL);
        memcpy(su->copy[c], k->x.p, px);
        memcpy((char *)su->copy[c] + px, k->par[1].p, pw);
        plan pl;
        result *r = &su->ref[c];
        result_alloc(r, k);
        kf_status s = plan_make(ctx, k, &pl);
        record(r, s == KF_OK ? run_call(k, &pl, r) : s);
        plan_free(&pl);
        cr_assert_eq(r->status, KF_OK, "single-threaded %s (dtype %d): %s", op_name[k->op],
                     (int)k->dt, r->msg);
    }
    kf_context_destroy(ctx);
}

static void suite_free(suite *su) {
    for (int c = 0; c < su->n; c++) {
        result_free(&su->ref[c]);
        free(su->copy[c]);
        kase_free(&su->k[c]);
    }
}

static int rounds_from_env(void) {
    const char *e = getenv("KF_CONCURRENCY_ROUNDS");
    int n = e ? atoi(e) : 3;
    return n >= 1 && n <= 100000 ? n : 3;
}

/* Thread i's results against the single-threaded run: the status, then every output bit for bit
 * (poisoned before the call, so an output left unwritten differs too). */
static void expect_same(const suite *su, const result *res, int thread) {
    for (int c = 0; c < su->n; c++) {
        const kase *k = &su->k[c];
        const result *r = &res[c], *ref = &su->ref[c];
        cr_expect_eq(r->status, KF_OK, "thread %d, %s (dtype %d): %s", thread, op_name[k->op],
                     (int)k->dt, r->msg);
        if (r->status != KF_OK) continue;
        int64_t d = 0;
        for (int o = 0; o < r->n; o++)
            for (int64_t e = 0; e < r->out[o].n; e++) {
                const size_t eb = dtype_bytes(k->dt);
                d += memcmp((char *)r->out[o].p + e * eb, (char *)ref->out[o].p + e * eb, eb) != 0;
            }
        cr_expect_eq(d, 0, "thread %d, %s (dtype %d): %lld elements differ from the "
                     "single-threaded run", thread, op_name[k->op], (int)k->dt, (long long)d);
        const size_t px = (size_t)k->x.n * dtype_bytes(k->dt);
        const size_t pw = (size_t)k->par[1].n * dtype_bytes(k->dt);
        cr_expect_eq(memcmp(su->copy[c], k->x.p, px), 0, "%s: shared x was written",
                     op_name[k->op]);
        cr_expect_eq(memcmp((char *)su->copy[c] + px, k->par[1].p, pw), 0,
                     "%s: shared parameters were written", op_name[k->op]);
    }
}

/* ---- own contexts ------------------------------------------------------------------------- */
typedef struct job {
    const suite *su;
    result res[MAXC];
    int rounds;
    pthread_barrier_t *start;
    pthread_mutex_t *turn; /* one context: NULL for own contexts */
    const plan *shared;    /* one context's plans */
} job;

static void *own_worker(void *arg) {
    job *j = arg;
    const suite *su = j->su;
    kf_context_desc cd;
    kf_context_desc_init(&cd);
    cd.num_threads = 1;
    kf_context *ctx = NULL;
    kf_status s = kf_context_create(&cd, &ctx);
    plan pl[MAXC] = {{0}};
    for (int c = 0; c < su->n; c++) {
        record(&j->res[c], s);
        if (s == KF_OK) record(&j->res[c], plan_make(ctx, &su->k[c], &pl[c]));
    }
    pthread_barrier_wait(j->start); /* all threads enter the calls together */
    for (int round = 0; round < j->rounds; round++)
        for (int c = 0; c < su->n; c++)
            if (j->res[c].status == KF_OK)
                record(&j->res[c], run_call(&su->k[c], &pl[c], &j->res[c]));
    for (int c = 0; c < su->n; c++) plan_free(&pl[c]);
    kf_context_destroy(ctx);
    return NULL;
}

/* ---- one context, threads in turn --------------------------------------------------------- */
static void *shared_worker(void *arg) {
    job *j = arg;
    pthread_barrier_wait(j->start);
    for (int round = 0; round < j->rounds; round++)
        for (int c = 0; c < j->su->n; c++) {
            pthread_mutex_lock(j->turn);
            record(&j->res[c], run_call(&j->su->k[c], &j->shared[c], &j->res[c]));
            pthread_mutex_unlock(j->turn);
        }
    return NULL;
}

static void check(bool one_context) {
    static suite su; /* large: not on the stack */
    suite_init(&su);
    static job jobs[NTHREADS];
    pthread_barrier_t start;
    pthread_mutex_t turn;
    pthread_barrier_init(&start, NULL, NTHREADS);
    pthread_mutex_init(&turn, NULL);
    kf_context *ctx = NULL;
    plan shared[MAXC];
    if (one_context) {
        kf_context_desc cd;
        kf_context_desc_init(&cd);
        cd.num_threads = 1;
        cr_assert_eq(kf_context_create(&cd, &ctx), KF_OK);
        for (int c = 0; c < su.n; c++) cr_assert_eq(plan_make(ctx, &su.k[c], &shared[c]), KF_OK);
    }
    pthread_t th[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        job *j = &jobs[i];
        memset(j, 0, sizeof *j);
        j->su = &su, j->rounds = rounds_from_env(), j->start = &start;
        j->turn = one_context ? &turn : NULL, j->shared = shared;
        for (int c = 0; c < su.n; c++) {
            result_alloc(&j->res[c], &su.k[c]);
            for (int o = 0; o < j->res[c].n; o++) /* poison: an unwritten output differs */
                memset(j->res[c].out[o].p, 0xA5,
                       (size_t)j->res[c].out[o].n * dtype_bytes(su.k[c].dt));
        }
        cr_assert_eq(pthread_create(&th[i], NULL, one_context ? shared_worker : own_worker, j), 0);
    }
    for (int i = 0; i < NTHREADS; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < NTHREADS; i++) {
        expect_same(&su, jobs[i].res, i);
        for (int c = 0; c < su.n; c++) result_free(&jobs[i].res[c]);
    }
    if (one_context) {
        for (int c = 0; c < su.n; c++) plan_free(&shared[c]);
        kf_context_destroy(ctx);
    }
    pthread_mutex_destroy(&turn);
    pthread_barrier_destroy(&start);
    suite_free(&su);
}

Test(concurrency, own_contexts_every_op_and_dtype_bit_identical, .timeout = 600) { check(false); }

Test(concurrency, one_context_in_turn_bit_identical, .timeout = 600) { check(true); }

#ifdef KF_CONCURRENCY_STANDALONE
int main(void) {
    concurrency_own_contexts_every_op_and_dtype_bit_identical();
    concurrency_one_context_in_turn_bit_identical();
    printf("test_concurrency: %s (%d threads x own contexts, then x one context in turn; every op "
           "in float32, float64, bfloat16, float16)\n", kf__failures ? "FAILED" : "ok", NTHREADS);
    return kf__failures ? 1 : 0;
}
#endif

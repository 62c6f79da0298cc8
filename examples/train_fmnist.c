/*
 * train_fmnist.c: kfuse's main job. Trains a sequence classifier on Fashion-MNIST through the
 * public C ABI only: an L-layer A-GRU (default) or GRU over the image read as 28 rows of 28 pixels
 * (or, with --pixels, 784 steps of 1 pixel), a linear head H -> 10 on the last layer's final state
 * h_n, softmax cross-entropy, and Adam over every parameter (the kfuse RNN weights, A-GRU epsilon
 * included, and the head). The data come from Debian's dataset-fashion-mnist package; nothing is
 * downloaded.
 *
 *   train_fmnist [--cell agru|gru] [--layers N] [--hidden H] [--batch B] [--epochs N] [--lr LR]
 *                [--pixels] [--threads N] [--device cpu|cuda] [--seed S] [--limit-batches N]
 *                [--data-dir DIR]
 *
 * Every epoch runs ceil(60000/B) batches (469 at B=128): the last, partial batch (96 images) is
 * kept, as torch's DataLoader does by default. Exit status: 0 success, 1 a kfuse or CUDA call
 * failed (status and detail printed), 2 bad usage or missing/corrupt data files.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kfuse.h"
#include "fmnist_data.h"
#include "head.h"

#ifdef KF_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* ---- failure handling --------------------------------------------------------------------- */

/* Every kfuse status is checked: on failure print the call, the status and the detail, exit 1. */
#define KF_CHECK(call)                                                                         \
    do {                                                                                       \
        kf_status st_ = (call);                                                                \
        if (st_ != KF_OK) {                                                                    \
            fprintf(stderr, "\nerror: %s\n  %s\n  %s\n", #call, kf_status_string(st_),         \
                    kf_last_error_message());                                                  \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

#ifdef KF_HAVE_CUDA
#define CUDA_CHECK(call)                                                                       \
    do {                                                                                       \
        cudaError_t ce_ = (call);                                                              \
        if (ce_ != cudaSuccess) {                                                              \
            fprintf(stderr, "\nerror: %s: %s\n", #call, cudaGetErrorString(ce_));              \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)
#endif

static void die_usage(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("train_fmnist: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs(" (try --help)\n", stderr);
    va_end(ap);
    exit(2);
}

/* ---- options ------------------------------------------------------------------------------ */

typedef struct options {
    int cell;           /* KF_RNN_AGRU or KF_RNN_GRU */
    int layers;
    int64_t hidden;
    int64_t batch;
    int epochs;
    float lr;
    int pixels;         /* 0: rows as steps (T=28, I=28); 1: pixels as steps (T=784, I=1) */
    int threads;        /* 0: library default (all online cores) */
    int cuda;
    uint64_t seed;
    int64_t limit_batches; /* 0: no limit */
    const char *data_dir;
} options;

static void usage(FILE *f) {
    fprintf(f,
            "usage: train_fmnist [options]\n"
            "  --cell agru|gru       recurrent cell (default agru)\n"
            "  --layers N            stacked layers (default 1)\n"
            "  --hidden H            hidden size (default 128)\n"
            "  --batch B             batch size (default 128)\n"
            "  --epochs N            epochs (default 2)\n"
            "  --lr LR               Adam learning rate (default 1e-3)\n"
            "  --pixels              pixels as steps (T=784, I=1) instead of rows (T=28, I=28)\n"
            "  --threads N           CPU threads for kfuse (default: all online cores)\n"
            "  --device cpu|cuda     backend (default cpu)\n"
            "  --seed S              seed of the initialisation and the shuffling (default 1)\n"
            "  --limit-batches N     train N batches per epoch, test on the first N*B test images\n"
            "  --data-dir DIR        Fashion-MNIST IDX .gz files (default %s)\n",
            FMNIST_DEFAULT_DIR);
}

static long long parse_int(const char *opt, const char *v, long long lo, long long hi) {
    char *end = NULL;
    long long x = strtoll(v, &end, 10);
    if (!*v || *end || x < lo || x > hi) die_usage("%s expects an integer in %lld..%lld, got '%s'", opt, lo, hi, v);
    return x;
}

static void parse_options(int argc, char **argv, options *o) {
    o->cell = KF_RNN_AGRU;
    o->layers = 1;
    o->hidden = 128;
    o->batch = 128;
    o->epochs = 2;
    o->lr = 1e-3f;
    o->pixels = 0;
    o->threads = 0;
    o->cuda = 0;
    o->seed = 1;
    o->limit_batches = 0;
    o->data_dir = FMNIST_DEFAULT_DIR;
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        }
        if (!strcmp(a, "--pixels")) {
            o->pixels = 1;
            continue;
        }
        /* every other option takes a value: "--opt value" or "--opt=value" */
        static const char *const valued[] = {"--cell", "--layers", "--hidden", "--batch",
                                             "--epochs", "--lr", "--threads", "--device",
                                             "--seed", "--limit-batches", "--data-dir"};
        char name[64];
        const char *v;
        const char *eq = strchr(a, '=');
        size_t nlen = eq ? (size_t)(eq - a) : strlen(a);
        if (nlen >= sizeof name) die_usage("unknown option '%s'", a);
        memcpy(name, a, nlen);
        name[nlen] = 0;
        int known = 0;
        for (size_t j = 0; j < sizeof valued / sizeof valued[0]; ++j) known |= !strcmp(name, valued[j]);
        if (!known) die_usage("unknown option '%s'", name);
        if (eq) {
            v = eq + 1;
        } else {
            if (i + 1 >= argc) die_usage("%s needs a value", name);
            v = argv[++i];
        }
        if (!strcmp(name, "--cell")) {
            if (!strcmp(v, "agru")) o->cell = KF_RNN_AGRU;
            else if (!strcmp(v, "gru")) o->cell = KF_RNN_GRU;
            else die_usage("--cell expects agru or gru, got '%s'", v);
        } else if (!strcmp(name, "--device")) {
            if (!strcmp(v, "cpu")) o->cuda = 0;
            else if (!strcmp(v, "cuda")) o->cuda = 1;
            else die_usage("--device expects cpu or cuda, got '%s'", v);
        } else if (!strcmp(name, "--layers")) {
            o->layers = (int)parse_int(name, v, 1, 64);
        } else if (!strcmp(name, "--hidden")) {
            o->hidden = parse_int(name, v, 1, 1 << 16);
        } else if (!strcmp(name, "--batch")) {
            o->batch = parse_int(name, v, 1, 60000);
        } else if (!strcmp(name, "--epochs")) {
            o->epochs = (int)parse_int(name, v, 1, 100000);
        } else if (!strcmp(name, "--threads")) {
            o->threads = (int)parse_int(name, v, 0, 4096);
        } else if (!strcmp(name, "--seed")) {
            o->seed = (uint64_t)parse_int(name, v, 0, INT64_MAX);
        } else if (!strcmp(name, "--limit-batches")) {
            o->limit_batches = parse_int(name, v, 0, INT64_MAX);
        } else if (!strcmp(name, "--lr")) {
            char *end = NULL;
            double lr = strtod(v, &end);
            if (!*v || *end || !(lr > 0.0) || !isfinite(lr)) die_usage("--lr expects a positive number, got '%s'", v);
            o->lr = (float)lr;
        } else if (!strcmp(name, "--data-dir")) {
            o->data_dir = v;
        } else {
            die_usage("unknown option '%s'", name);
        }
    }
}

/* ---- small utilities ---------------------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* splitmix64: seeded, reproducible, good enough for initialisation and shuffling. */
static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double rng_uniform(uint64_t *s) { return (double)(rng_next(s) >> 11) * 0x1.0p-53; }
static void fill_uniform(float *p, size_t n, float bound, uint64_t *s) {
    for (size_t i = 0; i < n; ++i) p[i] = (float)((2.0 * rng_uniform(s) - 1.0) * bound);
}
static void shuffle(int32_t *perm, int64_t n, uint64_t *s) {
    for (int64_t i = n - 1; i > 0; --i) {
        int64_t j = (int64_t)(rng_next(s) % (uint64_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

static void *host_alloc(size_t bytes) {
    size_t n = (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, n ? n : 64);
    if (!p) {
        fprintf(stderr, "error: out of host memory (%zu bytes)\n", bytes);
        exit(1);
    }
    memset(p, 0, n ? n : 64);
    return p;
}

/* Device buffers. On the CPU a "device" buffer is the host buffer itself and copies vanish. */
static int g_cuda = 0;

static void *dev_mirror(void *host, size_t bytes) {
#ifdef KF_HAVE_CUDA
    if (g_cuda) {
        void *d = NULL;
        CUDA_CHECK(cudaMalloc(&d, bytes ? bytes : 64));
        CUDA_CHECK(cudaMemset(d, 0, bytes ? bytes : 64));
        return d;
    }
#endif
    (void)bytes;
    return host;
}
static void dev_free(void *d, void *host) {
#ifdef KF_HAVE_CUDA
    if (g_cuda && d && d != host) cudaFree(d);
#endif
    (void)d;
    (void)host;
}
static void to_device(void *d, const void *h, size_t bytes) {
    if (d == h || bytes == 0) return;
#ifdef KF_HAVE_CUDA
    CUDA_CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
#else
    memcpy(d, h, bytes);
#endif
}
static void to_host(void *h, const void *d, size_t bytes) {
    if (d == h || bytes == 0) return;
#ifdef KF_HAVE_CUDA
    CUDA_CHECK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
#else
    memcpy(h, d, bytes);
#endif
}

static kf_tensor tensor_f32(void *data, int32_t ndim, int64_t d0, int64_t d1, int64_t d2) {
    kf_tensor t;
    int64_t shape[3] = {d0, d1, d2};
    KF_CHECK(kf_tensor_init(&t, data, KF_DTYPE_F32, ndim, shape));
    return t;
}

/* x[t, b, i] = image[perm[first + b]][t*I + i] / 255 (time-major, as the kernels prefer). */
static void gather_batch(const fmnist_split *s, const int32_t *perm, int64_t first, int64_t Bc,
                         int64_t T, int64_t I, float *x, uint8_t *labels) {
    const float scale = 1.0f / 255.0f;
    for (int64_t b = 0; b < Bc; ++b) {
        int64_t idx = perm ? perm[first + b] : first + b;
        const uint8_t *img = s->images + idx * FMNIST_PIXELS;
        labels[b] = s->labels[idx];
        for (int64_t t = 0; t < T; ++t) {
            float *dst = x + (t * Bc + b) * I;
            const uint8_t *src = img + t * I;
            for (int64_t i = 0; i < I; ++i) dst[i] = (float)src[i] * scale;
        }
    }
}

/* ---- progress ----------------------------------------------------------------------------- */

typedef struct progress {
    int tty;
    int epoch, epochs;
    int64_t total;
    int64_t next_report; /* non-tty: next batch count to report at (every ~10%) */
    double last_draw;
} progress;

static void progress_update(progress *p, int64_t done, double mean_loss, double items_per_s) {
    if (p->tty) {
        double t = now_s();
        if (done < p->total && t - p->last_draw < 0.1) return;
        p->last_draw = t;
        char bar[31];
        int fill = (int)(30 * done / (p->total ? p->total : 1));
        for (int i = 0; i < 30; ++i) bar[i] = i < fill ? '=' : (i == fill ? '>' : ' ');
        bar[30] = 0;
        fprintf(stderr, "\repoch %d/%d [%s] %lld/%lld  loss %.4f  %.0f img/s ", p->epoch, p->epochs,
                bar, (long long)done, (long long)p->total, mean_loss, items_per_s);
        fflush(stderr);
    } else if (done >= p->next_report || done == p->total) {
        fprintf(stderr, "epoch %d/%d: %lld/%lld batches  loss %.4f  %.0f img/s\n", p->epoch,
                p->epochs, (long long)done, (long long)p->total, mean_loss, items_per_s);
        int64_t step = (p->total + 9) / 10;
        while (p->next_report <= done) p->next_report += step;
    }
}

static void progress_clear(progress *p) {
    if (p->tty) {
        fputs("\r\033[K", stderr); /* erase the bar's line */
        fflush(stderr);
    }
}

/* ---- main --------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
    options o;
    parse_options(argc, argv, &o);
    g_cuda = o.cuda;
    setvbuf(stdout, NULL, _IOLBF, 0);

    /* Data first: a missing package is the most likely failure and needs no kfuse at all. */
    fmnist_split train, test;
    char err[4600];
    if (fmnist_load(o.data_dir, "train", &train, err, sizeof err) != 0 ||
        fmnist_load(o.data_dir, "t10k", &test, err, sizeof err) != 0) {
        fprintf(stderr,
                "train_fmnist: cannot read the Fashion-MNIST data: %s\n"
                "  The files come from Debian's package: apt-get install dataset-fashion-mnist\n"
                "  (or pass --data-dir DIR holding {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz)\n",
                err);
        return 2;
    }

    const int64_t T = o.pixels ? FMNIST_PIXELS : FMNIST_ROWS;
    const int64_t I = o.pixels ? 1 : FMNIST_COLS;
    const int64_t H = o.hidden, L = o.layers, C = FMNIST_CLASSES;
    const int64_t B = o.batch < train.count ? o.batch : train.count;
    int64_t n_train_batches = (train.count + B - 1) / B;
    int64_t n_test = test.count;
    if (o.limit_batches > 0) {
        if (o.limit_batches < n_train_batches) n_train_batches = o.limit_batches;
        if (o.limit_batches * B < n_test) n_test = o.limit_batches * B;
    }
    const int64_t n_test_batches = (n_test + B - 1) / B;
    /* the batch sizes that occur: B, the last partial training batch, the last test batch */
    const int64_t last_train_b = train.count - (n_train_batches - 1) * B < B ? train.count - (n_train_batches - 1) * B : B;
    const int64_t last_test_b = n_test - (n_test_batches - 1) * B;

    /* ---- context and plan ---- */
    kf_context_desc cdesc;
    kf_context_desc_init(&cdesc);
    cdesc.device_type = o.cuda ? KF_DEVICE_CUDA : KF_DEVICE_CPU;
    cdesc.num_threads = o.threads;
    kf_context *ctx = NULL;
    kf_status st = kf_context_create(&cdesc, &ctx);
    if (st != KF_OK) {
        fprintf(stderr, "error: kf_context_create(%s): %s\n  %s\n", o.cuda ? "cuda" : "cpu",
                kf_status_string(st), kf_last_error_message());
#ifndef KF_HAVE_CUDA
        if (o.cuda) fprintf(stderr, "  (this example and, likely, the library were built without CUDA)\n");
#endif
        return 1;
    }
#ifndef KF_HAVE_CUDA
    if (o.cuda) {
        fprintf(stderr, "error: the library has CUDA but this example was built without it "
                        "(KF_HAVE_CUDA undefined), so it cannot hold device buffers\n");
        kf_context_destroy(ctx);
        return 1;
    }
#endif

    kf_rnn_desc rdesc;
    kf_rnn_desc_init(&rdesc);
    rdesc.cell = o.cell;
    rdesc.num_layers = (int32_t)L;
    rdesc.input_size = I;
    rdesc.hidden_size = H;
    kf_rnn_plan *plan = NULL;
    KF_CHECK(kf_rnn_plan_create(ctx, &rdesc, &plan));

    /* ---- parameters: one flat host array (RNN weights, then head W and b), same for grads ---- */
    int32_t nw = 0;
    KF_CHECK(kf_rnn_weight_count(plan, &nw));
    size_t *off = (size_t *)host_alloc(sizeof(size_t) * (size_t)(nw + 1));
    kf_tensor *w = (kf_tensor *)host_alloc(sizeof(kf_tensor) * (size_t)nw);
    kf_tensor *dw = (kf_tensor *)host_alloc(sizeof(kf_tensor) * (size_t)nw);
    int32_t *wndim = (int32_t *)host_alloc(sizeof(int32_t) * (size_t)nw);
    int64_t (*wshape)[KF_MAX_DIMS] = host_alloc(sizeof *wshape * (size_t)nw);
    int *is_eps = (int *)host_alloc(sizeof(int) * (size_t)nw);
    size_t rnn_floats = 0;
    for (int32_t k = 0; k < nw; ++k) {
        const char *name = NULL;
        KF_CHECK(kf_rnn_weight_info(plan, k, &name, &wndim[k], wshape[k]));
        size_t n = 1;
        for (int32_t d = 0; d < wndim[k]; ++d) n *= (size_t)wshape[k][d];
        size_t nl = strlen(name);
        is_eps[k] = nl >= 7 && !strcmp(name + nl - 7, "epsilon");
        off[k] = rnn_floats;
        rnn_floats += (n + 15) / 16 * 16; /* keep every tensor 64-byte aligned */
    }
    const size_t head_w_off = rnn_floats, head_b_off = rnn_floats + (size_t)(C * H);
    const size_t n_params = head_b_off + (size_t)C;
    float *params = (float *)host_alloc(sizeof(float) * n_params);
    float *grads = (float *)host_alloc(sizeof(float) * n_params);
    float *adam_m = (float *)host_alloc(sizeof(float) * n_params);
    float *adam_v = (float *)host_alloc(sizeof(float) * n_params);

    /* torch-like init: U(-1/sqrt(H), 1/sqrt(H)) for every RNN weight and bias and for the head;
     * A-GRU epsilon = 1.0. */
    uint64_t rng = o.seed * 0x2545F4914F6CDD1Dull + 12345u;
    const float bound = (float)(1.0 / sqrt((double)H));
    size_t n_trainable = 0;
    for (int32_t k = 0; k < nw; ++k) {
        size_t n = 1;
        for (int32_t d = 0; d < wndim[k]; ++d) n *= (size_t)wshape[k][d];
        if (is_eps[k]) params[off[k]] = 1.0f;
        else fill_uniform(params + off[k], n, bound, &rng);
        n_trainable += n;
    }
    fill_uniform(params + head_w_off, (size_t)(C * H + C), bound, &rng);
    n_trainable += (size_t)(C * H + C);

    float *params_d = (float *)dev_mirror(params, sizeof(float) * rnn_floats);
    float *grads_d = (float *)dev_mirror(grads, sizeof(float) * rnn_floats);
    to_device(params_d, params, sizeof(float) * rnn_floats);
    for (int32_t k = 0; k < nw; ++k) {
        KF_CHECK(kf_tensor_init(&w[k], params_d + off[k], KF_DTYPE_F32, wndim[k], wshape[k]));
        KF_CHECK(kf_tensor_init(&dw[k], grads_d + off[k], KF_DTYPE_F32, wndim[k], wshape[k]));
    }
    adam_state adam;
    adam_init(&adam, n_params, adam_m, adam_v, o.lr);

    /* ---- activations, workspace and reserve: sized once for every batch size that occurs ---- */
    size_t ws_bytes = 0, rs_bytes = 0;
    {
        const int64_t tb[2] = {B, last_train_b}, eb[2] = {B < n_test ? B : n_test, last_test_b};
        for (int j = 0; j < 2; ++j) {
            size_t ws = 0, rs = 0;
            KF_CHECK(kf_rnn_workspace_size(plan, T, tb[j], KF_MODE_TRAINING, &ws, &rs));
            if (ws > ws_bytes) ws_bytes = ws;
            if (rs > rs_bytes) rs_bytes = rs;
            KF_CHECK(kf_rnn_workspace_size(plan, T, eb[j], KF_MODE_INFERENCE, &ws, NULL));
            if (ws > ws_bytes) ws_bytes = ws;
        }
    }
    float *x_h = (float *)host_alloc(sizeof(float) * (size_t)(T * B * I));
    float *y_h = o.cuda ? NULL : (float *)host_alloc(sizeof(float) * (size_t)(T * B * H));
    float *hn_h = (float *)host_alloc(sizeof(float) * (size_t)(L * B * H));
    float *dhn_h = (float *)host_alloc(sizeof(float) * (size_t)(L * B * H));
    uint8_t *labels = (uint8_t *)host_alloc((size_t)B);
    float *ws_h = (o.cuda || ws_bytes == 0) ? NULL : (float *)host_alloc(ws_bytes);
    float *rs_h = o.cuda ? NULL : (float *)host_alloc(rs_bytes);
    float *x_d = (float *)dev_mirror(x_h, sizeof(float) * (size_t)(T * B * I));
    float *y_d = (float *)dev_mirror(y_h, sizeof(float) * (size_t)(T * B * H));
    float *hn_d = (float *)dev_mirror(hn_h, sizeof(float) * (size_t)(L * B * H));
    float *dhn_d = (float *)dev_mirror(dhn_h, sizeof(float) * (size_t)(L * B * H));
    void *ws_d = ws_bytes ? dev_mirror(ws_h, ws_bytes) : NULL;
    void *rs_d = dev_mirror(rs_h, rs_bytes);
    float head_scratch[FMNIST_CLASSES];
    int32_t *perm = (int32_t *)host_alloc(sizeof(int32_t) * (size_t)train.count);
    for (int64_t i = 0; i < train.count; ++i) perm[i] = (int32_t)i;
    uint64_t shuffle_rng = o.seed ^ 0xD1B54A32D192ED03ull;

    kf_rnn_forward_args fa;
    kf_rnn_forward_args_init(&fa);
    fa.weights = w;
    fa.num_weights = nw;
    kf_rnn_backward_args ba;
    kf_rnn_backward_args_init(&ba);
    ba.weights = w;
    ba.num_weights = nw;
    ba.dweights = dw;
    ba.num_dweights = nw;

    int nthreads = o.threads;
    if (nthreads == 0) nthreads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    char where[64];
    if (o.cuda) snprintf(where, sizeof where, "cuda");
    else snprintf(where, sizeof where, "cpu, %d thread%s", nthreads, nthreads > 1 ? "s" : "");
    printf("kfuse %s | %s, %d layer%s, H=%lld, %s as steps (T=%lld, I=%lld), batch %lld | %s | "
           "%zu parameters, Adam lr %g | seed %llu\n",
           kf_version_string(), o.cell == KF_RNN_AGRU ? "A-GRU" : "GRU", o.layers,
           o.layers > 1 ? "s" : "", (long long)H, o.pixels ? "pixels" : "rows", (long long)T,
           (long long)I, (long long)B, where, n_trainable, (double)o.lr, (unsigned long long)o.seed);
    if (o.limit_batches > 0 && n_train_batches < (train.count + B - 1) / B)
        printf("train: %lld batch%s/epoch (--limit-batches), test: first %lld images\n",
               (long long)n_train_batches, n_train_batches > 1 ? "es" : "", (long long)n_test);
    else
        printf("train: %lld images, %lld batch%s/epoch%s, test: %lld images\n",
               (long long)train.count, (long long)n_train_batches, n_train_batches > 1 ? "es" : "",
               last_train_b < B ? " (the last, partial one kept)" : "", (long long)n_test);

    progress prog = {0};
    prog.tty = isatty(fileno(stderr));
    prog.epochs = o.epochs;
    const double t_start = now_s();
    for (int epoch = 1; epoch <= o.epochs; ++epoch) {
        /* ---- train ---- */
        const double t0 = now_s();
        shuffle(perm, train.count, &shuffle_rng);
        prog.epoch = epoch;
        prog.total = n_train_batches;
        prog.next_report = (n_train_batches + 9) / 10;
        prog.last_draw = 0.0;
        double loss_sum = 0.0;
        int64_t seen = 0;
        for (int64_t bi = 0; bi < n_train_batches; ++bi) {
            const int64_t first = bi * B;
            const int64_t Bc = train.count - first < B ? train.count - first : B;
            gather_batch(&train, perm, first, Bc, T, I, x_h, labels);
            to_device(x_d, x_h, sizeof(float) * (size_t)(T * Bc * I));

            fa.x = tensor_f32(x_d, 3, T, Bc, I);
            fa.y = tensor_f32(y_d, 3, T, Bc, H);
            fa.hn = tensor_f32(hn_d, 3, L, Bc, H);
            KF_CHECK(kf_rnn_forward(plan, KF_MODE_TRAINING, &fa, ws_d, ws_bytes, rs_d, rs_bytes));

            /* head on the last layer's h_n: [L, Bc, H] -> rows (L-1)*Bc .. L*Bc */
            const size_t last = (size_t)((L - 1) * Bc * H);
            to_host(hn_h + last, hn_d + last, sizeof(float) * (size_t)(Bc * H));
            double loss = 0.0;
            memset(dhn_h, 0, sizeof(float) * last); /* earlier layers' h_n do not reach the loss */
            head_forward_backward(params + head_w_off, params + head_b_off, hn_h + last, labels, Bc,
                                  H, C, grads + head_w_off, grads + head_b_off, dhn_h + last,
                                  head_scratch, &loss);
            if (!isfinite(loss)) {
                fprintf(stderr, "\nerror: the training loss is %g at epoch %d, batch %lld\n", loss,
                        epoch, (long long)bi);
                return 1;
            }
            to_device(dhn_d, dhn_h, sizeof(float) * (size_t)(L * Bc * H));

            ba.x = fa.x;
            ba.dhn = tensor_f32(dhn_d, 3, L, Bc, H);
            KF_CHECK(kf_rnn_backward(plan, KF_GRAD_OVERWRITE, &ba, ws_d, ws_bytes, rs_d, rs_bytes));
            KF_CHECK(kf_context_synchronize(ctx));
            to_host(grads, grads_d, sizeof(float) * rnn_floats);

            adam_step(&adam, params, grads);
            to_device(params_d, params, sizeof(float) * rnn_floats);

            loss_sum += loss * (double)Bc;
            seen += Bc;
            progress_update(&prog, bi + 1, loss_sum / (double)seen, (double)seen / (now_s() - t0));
        }
        const double t_train = now_s() - t0;
        progress_clear(&prog);

        /* ---- test ---- */
        const double t1 = now_s();
        int64_t correct = 0;
        for (int64_t bi = 0; bi < n_test_batches; ++bi) {
            const int64_t first = bi * B;
            const int64_t Bc = n_test - first < B ? n_test - first : B;
            gather_batch(&test, NULL, first, Bc, T, I, x_h, labels);
            to_device(x_d, x_h, sizeof(float) * (size_t)(T * Bc * I));
            fa.x = tensor_f32(x_d, 3, T, Bc, I);
            fa.y = tensor_f32(y_d, 3, T, Bc, H);
            fa.hn = tensor_f32(hn_d, 3, L, Bc, H);
            KF_CHECK(kf_rnn_forward(plan, KF_MODE_INFERENCE, &fa, ws_d, ws_bytes, NULL, 0));
            KF_CHECK(kf_context_synchronize(ctx));
            const size_t last = (size_t)((L - 1) * Bc * H);
            to_host(hn_h + last, hn_d + last, sizeof(float) * (size_t)(Bc * H));
            correct += head_count_correct(params + head_w_off, params + head_b_off, hn_h + last,
                                          labels, Bc, H, C);
        }
        const double t_test = now_s() - t1;
        printf("epoch %d  time %.2f s (train %.2f s, %.0f img/s; test %.2f s)  train_loss %.4f  "
               "test_acc %.2f%% (%lld/%lld)\n",
               epoch, t_train + t_test, t_train, (double)seen / t_train, t_test,
               loss_sum / (double)seen, 100.0 * (double)correct / (double)n_test,
               (long long)correct, (long long)n_test);
    }
    printf("total %.2f s (%d epoch%s)\n", now_s() - t_start, o.epochs, o.epochs > 1 ? "s" : "");

    /* ---- teardown ---- */
    dev_free(x_d, x_h);
    dev_free(y_d, y_h);
    dev_free(hn_d, hn_h);
    dev_free(dhn_d, dhn_h);
    dev_free(ws_d, ws_h);
    dev_free(rs_d, rs_h);
    dev_free(params_d, params);
    dev_free(grads_d, grads);
    kf_rnn_plan_destroy(plan);
    kf_context_destroy(ctx);
    free(x_h);
    free(y_h);
    free(hn_h);
    free(dhn_h);
    free(labels);
    free(ws_h);
    free(rs_h);
    free(perm);
    free(params);
    free(grads);
    free(adam_m);
    free(adam_v);
    free(off);
    free(w);
    free(dw);
    free(wndim);
    free(wshape);
    free(is_eps);
    fmnist_free(&train);
    fmnist_free(&test);
    return 0;
}

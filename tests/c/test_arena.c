/* No allocation in a steady-state call (DESIGN.md "Arena-preallocated workspaces").
 *
 * Two independent witnesses: the context's own grow_count (kf_context_arena_info) stays unchanged,
 * and this executable interposes malloc, calloc, realloc, free and the aligned allocators, counting
 * every call made while a window is open, by any thread (the library's OpenMP workers included).
 * The interposers forward to the next definition in the lookup order (glibc's, or valgrind's
 * replacement), so the test runs under valgrind too. Under AddressSanitizer, whose runtime calls
 * malloc from inside dlsym before main, the interposers are replaced by ASan's own allocation
 * hooks (__sanitizer_install_malloc_and_free_hooks), which count the same events. A self-check
 * proves that the counters see the library's own allocations. */
#define _GNU_SOURCE

#include <criterion/criterion.h>

#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kfuse.h"
#include "kf_test.h"
#include "ref_rnn.h"

/* ---- allocation counting ------------------------------------------------------------------ */
static atomic_int g_counting;
static atomic_long g_allocs, g_frees;

/* The first callers seen in a window, to name them when the test fails. */
#define MAX_CALLERS 8
static void *g_callers[MAX_CALLERS];

static void count_alloc_from(void *caller) {
    if (atomic_load_explicit(&g_counting, memory_order_relaxed)) {
        long k = atomic_fetch_add_explicit(&g_allocs, 1, memory_order_relaxed);
        if (k < MAX_CALLERS) g_callers[k] = caller;
    }
}
#define count_alloc() count_alloc_from(__builtin_return_address(0))

static void count_free(const volatile void *p) {
    if (p && atomic_load_explicit(&g_counting, memory_order_relaxed))
        atomic_fetch_add_explicit(&g_frees, 1, memory_order_relaxed);
}

/* "lib.so+0x1234 (symbol)" for each recorded caller (called after the window closes). */
static const char *callers_text(long n) {
    static char buf[2048];
    size_t used = 0;
    buf[0] = '\0';
    for (long i = 0; i < n && i < MAX_CALLERS; ++i) {
        Dl_info info;
        memset(&info, 0, sizeof info);
        if (dladdr(g_callers[i], &info) && info.dli_fname)
            used += (size_t)snprintf(buf + used, sizeof buf - used, "\n    %s+%#lx (%s)",
                                     info.dli_fname,
                                     (unsigned long)((char *)g_callers[i] - (char *)info.dli_fbase),
                                     info.dli_sname ? info.dli_sname : "?");
        else
            used += (size_t)snprintf(buf + used, sizeof buf - used, "\n    %p", g_callers[i]);
        if (used >= sizeof buf) break;
    }
    return buf;
}

#ifdef KF_TEST_ASAN
int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void *, size_t),
                                              void (*free_hook)(const volatile void *));

static void asan_malloc_hook(const volatile void *p, size_t n) {
    (void)p;
    (void)n;
    count_alloc();
}

__attribute__((constructor)) static void install_hooks(void) {
    __sanitizer_install_malloc_and_free_hooks(asan_malloc_hook, count_free);
}
#else
static void *(*real_malloc)(size_t);
static void *(*real_calloc)(size_t, size_t);
static void *(*real_realloc)(void *, size_t);
static void (*real_free)(void *);
static int (*real_posix_memalign)(void **, size_t, size_t);
static void *(*real_aligned_alloc)(size_t, size_t);
static void *(*real_memalign)(size_t, size_t);

/* dlsym may allocate while we resolve: serve that from a static block that free() ignores. */
static _Alignas(64) char g_boot[1 << 16];
static size_t g_boot_used;
static int g_resolving;

static void *boot_alloc(size_t n) {
    n = (n + 63) & ~(size_t)63;
    if (g_boot_used + n > sizeof g_boot) return NULL;
    void *p = g_boot + g_boot_used;
    g_boot_used += n;
    return p; /* static storage: already zero */
}

static int in_boot(const void *p) {
    return (const char *)p >= g_boot && (const char *)p < g_boot + sizeof g_boot;
}

static void resolve(void) {
    if (real_malloc) return;
    g_resolving = 1;
    *(void **)&real_calloc = dlsym(RTLD_NEXT, "calloc");
    *(void **)&real_realloc = dlsym(RTLD_NEXT, "realloc");
    *(void **)&real_free = dlsym(RTLD_NEXT, "free");
    *(void **)&real_posix_memalign = dlsym(RTLD_NEXT, "posix_memalign");
    *(void **)&real_aligned_alloc = dlsym(RTLD_NEXT, "aligned_alloc");
    *(void **)&real_memalign = dlsym(RTLD_NEXT, "memalign");
    *(void **)&real_malloc = dlsym(RTLD_NEXT, "malloc");
    g_resolving = 0;
    if (!real_malloc || !real_calloc || !real_realloc || !real_free || !real_posix_memalign ||
        !real_aligned_alloc || !real_memalign) {
        static const char msg[] = "test_arena: cannot resolve the allocator\n";
        fwrite(msg, 1, sizeof msg - 1, stderr);
        abort();
    }
}

void *malloc(size_t n) {
    if (!real_malloc) {
        if (g_resolving) return boot_alloc(n);
        resolve();
    }
    count_alloc();
    return real_malloc(n);
}

void *calloc(size_t a, size_t b) {
    if (!real_malloc) {
        if (g_resolving) return b && a > SIZE_MAX / b ? NULL : boot_alloc(a * b);
        resolve();
    }
    count_alloc();
    return real_calloc(a, b);
}

void *realloc(void *p, size_t n) {
    if (!real_malloc) {
        if (g_resolving) {
            void *q = boot_alloc(n);
            if (q && p) memmove(q, p, n); /* both in g_boot: bounded by it */
            return q;
        }
        resolve();
    }
    count_alloc();
    if (in_boot(p)) {
        void *q = real_malloc(n);
        if (q) {
            size_t avail = (size_t)(g_boot + sizeof g_boot - (char *)p);
            memcpy(q, p, n < avail ? n : avail);
        }
        return q;
    }
    return real_realloc(p, n);
}

void free(void *p) {
    if (p == NULL || in_boot(p)) return;
    if (!real_malloc) resolve();
    count_free(p);
    real_free(p);
}

int posix_memalign(void **out, size_t align, size_t n) {
    if (!real_malloc) resolve();
    count_alloc();
    return real_posix_memalign(out, align, n);
}

void *aligned_alloc(size_t align, size_t n) {
    if (!real_malloc) resolve();
    count_alloc();
    return real_aligned_alloc(align, n);
}

void *memalign(size_t align, size_t n);
void *memalign(size_t align, size_t n) {
    if (!real_malloc) resolve();
    count_alloc();
    return real_memalign(align, n);
}
#endif /* KF_TEST_ASAN */

/* Valgrind replaces malloc & co. even where the executable defines them, so under valgrind
 * (whose run is there for memory errors) the counters see nothing; detect that and keep only
 * the grow_count witness there. Everywhere else a blind counter fails the self-check. */
#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#define KF_TEST_HAVE_VALGRIND_H 1
#endif
#endif

static int on_valgrind(void) {
#ifdef KF_TEST_HAVE_VALGRIND_H
    if (RUNNING_ON_VALGRIND) return 1;
#endif
    const char *pre = getenv("LD_PRELOAD");
    return pre && strstr(pre, "vgpreload") != NULL;
}

static void window_open(void);
static void window_close(long *allocs, long *frees);

/* 1 when the counters see an allocation made in a window. */
static int counters_work(void) {
    void *(*volatile m)(size_t) = malloc;
    void (*volatile f)(void *) = free;
    long allocs, frees;
    window_open();
    void *p = m(24);
    f(p);
    window_close(&allocs, &frees);
    return allocs == 1 && frees == 1;
}

/* Allocation-count assertions apply unless valgrind hides the allocator from us. */
static int g_counting_applies = -1;

static int counting_applies(void) {
    if (g_counting_applies < 0) g_counting_applies = counters_work() || !on_valgrind();
    return g_counting_applies;
}

/* Decided once per process, before any test opens a window (the probe uses the counters). */
__attribute__((constructor)) static void probe_counting(void) { (void)counting_applies(); }

static void window_open(void) {
    atomic_store(&g_allocs, 0);
    atomic_store(&g_frees, 0);
    atomic_store(&g_counting, 1);
}

static void window_close(long *allocs, long *frees) {
    atomic_store(&g_counting, 0);
    *allocs = atomic_load(&g_allocs);
    *frees = atomic_load(&g_frees);
}

/* ---- a training setup --------------------------------------------------------------------- */
typedef struct setup {
    ref_rnn_cfg c;
    kf_context *ctx;
    kf_rnn_plan *plan;
    int nw;
    float *x, *h0, *y, *hn, *dy, *dhn, *dx, *dh0;
    int32_t *len;
    float **w, **dw;
    kf_tensor *wt, *dwt;
    size_t ws_inf, ws_train, rs;
    void *ws, *reserve;
    kf_rnn_forward_args fa;
    kf_rnn_backward_args ba;
} setup;

static float *randf(ref_rng *r, int64_t n) {
    float *p = xalloc((size_t)n * sizeof(float));
    ref_fill_uniform_f32(r, p, n, -0.5, 0.5);
    return p;
}

static void setup_make(setup *s, ref_rnn_cfg c, uint32_t ctx_flags, size_t arena_bytes) {
    memset(s, 0, sizeof *s);
    s->c = c;
    kf_context_desc cd;
    kf_context_desc_init(&cd);
    cd.flags = ctx_flags;
    cd.arena_bytes = arena_bytes;
    cr_assert(kf_context_create(&cd, &s->ctx) == KF_OK, "%s", kf_last_error_message());
    kf_rnn_desc d;
    kf_rnn_desc_init(&d);
    d.cell = c.cell;
    d.num_layers = c.L;
    d.input_size = c.I;
    d.hidden_size = c.H;
    d.flags = (c.D == 2 ? KF_RNN_BIDIRECTIONAL : 0u) | (c.batch_first ? KF_RNN_BATCH_FIRST : 0u);
    d.dropout = c.dropout;
    cr_assert(kf_rnn_plan_create(s->ctx, &d, &s->plan) == KF_OK, "%s", kf_last_error_message());
    ref_rng r;
    ref_rng_seed(&r, 11);
    int64_t nx = ref_rnn_x_numel(&c), ny = ref_rnn_y_numel(&c), nh = ref_rnn_h_numel(&c);
    s->x = randf(&r, nx);
    s->h0 = randf(&r, nh);
    s->dy = randf(&r, ny);
    s->dhn = randf(&r, nh);
    s->y = randf(&r, ny);
    s->hn = randf(&r, nh);
    s->dx = randf(&r, nx);
    s->dh0 = randf(&r, nh);
    s->len = xalloc((size_t)c.B * sizeof(int32_t));
    for (int64_t b = 0; b < c.B; ++b) s->len[b] = (int32_t)((b * 3) % (c.T + 1));
    s->len[0] = (int32_t)c.T;
    s->nw = ref_rnn_num_weights(&c);
    s->w = calloc((size_t)s->nw, sizeof *s->w);
    s->dw = calloc((size_t)s->nw, sizeof *s->dw);
    s->wt = calloc((size_t)s->nw, sizeof *s->wt);
    s->dwt = calloc((size_t)s->nw, sizeof *s->dwt);
    for (int i = 0; i < s->nw; ++i) {
        int nd;
        int64_t sh[2];
        int64_t n = ref_rnn_weight_desc(&c, i, NULL, 0, &nd, sh);
        s->w[i] = randf(&r, n);
        s->dw[i] = randf(&r, n);
        s->wt[i] = tens(s->w[i], KF_DTYPE_F32, nd, sh);
        s->dwt[i] = tens(s->dw[i], KF_DTYPE_F32, nd, sh);
    }
    cr_assert(kf_rnn_workspace_size(s->plan, c.T, c.B, KF_MODE_INFERENCE, &s->ws_inf, NULL) ==
              KF_OK);
    cr_assert(kf_rnn_workspace_size(s->plan, c.T, c.B, KF_MODE_TRAINING, &s->ws_train, &s->rs) ==
              KF_OK);
    s->ws = xalloc(s->ws_train > s->ws_inf ? s->ws_train : s->ws_inf);
    s->reserve = xalloc(s->rs);

    int64_t xs[3] = {c.batch_first ? c.B : c.T, c.batch_first ? c.T : c.B, c.I};
    int64_t ys[3] = {xs[0], xs[1], (int64_t)c.D * c.H};
    int64_t hs[3] = {(int64_t)c.L * c.D, c.B, c.H}, ls[1] = {c.B};
    kf_rnn_forward_args_init(&s->fa);
    s->fa.x = tens(s->x, KF_DTYPE_F32, 3, xs);
    s->fa.h0 = tens(s->h0, KF_DTYPE_F32, 3, hs);
    s->fa.weights = s->wt;
    s->fa.num_weights = s->nw;
    s->fa.lengths = tens(s->len, KF_DTYPE_I32, 1, ls);
    s->fa.dropout_seed = 3;
    s->fa.y = tens(s->y, KF_DTYPE_F32, 3, ys);
    s->fa.hn = tens(s->hn, KF_DTYPE_F32, 3, hs);
    kf_rnn_backward_args_init(&s->ba);
    s->ba.x = s->fa.x;
    s->ba.h0 = s->fa.h0;
    s->ba.weights = s->wt;
    s->ba.num_weights = s->nw;
    s->ba.lengths = s->fa.lengths;
    s->ba.dropout_seed = 3;
    s->ba.dy = tens(s->dy, KF_DTYPE_F32, 3, ys);
    s->ba.dhn = tens(s->dhn, KF_DTYPE_F32, 3, hs);
    s->ba.dx = tens(s->dx, KF_DTYPE_F32, 3, xs);
    s->ba.dh0 = tens(s->dh0, KF_DTYPE_F32, 3, hs);
    s->ba.dweights = s->dwt;
    s->ba.num_dweights = s->nw;
}

static void setup_free(setup *s) {
    for (int i = 0; i < s->nw; ++i) { free(s->w[i]); free(s->dw[i]); }
    free(s->w); free(s->dw); free(s->wt); free(s->dwt);
    free(s->x); free(s->h0); free(s->y); free(s->hn); free(s->dy); free(s->dhn);
    free(s->dx); free(s->dh0); free(s->len); free(s->ws); free(s->reserve);
    kf_rnn_plan_destroy(s->plan);
    kf_context_destroy(s->ctx);
}

/* One round of every call a training loop makes. `caller_ws`: lend the workspace. Statuses go
 * to st[0..5] (no assertion may run inside a counting window: Criterion allocates). */
static void one_round(setup *s, int caller_ws, kf_status *st) {
    void *ws = caller_ws ? s->ws : NULL;
    st[0] = kf_rnn_forward(s->plan, KF_MODE_INFERENCE, &s->fa, ws, caller_ws ? s->ws_inf : 0,
                           NULL, 0);
    st[1] = kf_rnn_forward(s->plan, KF_MODE_TRAINING, &s->fa, ws, caller_ws ? s->ws_train : 0,
                           s->reserve, s->rs);
    st[2] = kf_rnn_backward(s->plan, KF_GRAD_OVERWRITE, &s->ba, ws, caller_ws ? s->ws_train : 0,
                            s->reserve, s->rs);
    st[3] = kf_rnn_backward(s->plan, KF_GRAD_ACCUMULATE, &s->ba, ws, caller_ws ? s->ws_train : 0,
                            s->reserve, s->rs);
    size_t a = 0, b = 0;
    st[4] = kf_rnn_workspace_size(s->plan, s->c.T, s->c.B, KF_MODE_TRAINING, &a, &b);
    st[5] = kf_context_arena_info(s->ctx, &a, NULL);
}

static void check_round(const char *label, const kf_status *st) {
    static const char *const names[6] = {"inference forward", "training forward",
                                         "backward overwrite", "backward accumulate",
                                         "workspace_size", "arena_info"};
    for (int i = 0; i < 6; ++i)
        cr_assert(st[i] == KF_OK, "%s: %s failed: %s (%s)", label, names[i],
                  kf_status_string(st[i]), kf_last_error_message());
}

static ref_rnn_cfg gru_cfg(void) {
    ref_rnn_cfg c = {.cell = REF_GRU, .L = 2, .D = 2, .I = 6, .H = 13, .T = 7, .B = 5,
                     .dropout = 0.3f, .gamma = 0.01f};
    return c;
}

static ref_rnn_cfg agru_cfg(void) {
    ref_rnn_cfg c = {.cell = REF_AGRU, .L = 2, .D = 1, .I = 6, .H = 13, .T = 7, .B = 5,
                     .dropout = 0.3f, .gamma = 0.01f, .batch_first = 1};
    return c;
}

/* ---- the counters work --------------------------------------------------------------------- */
Test(arena, counters_see_allocations) {
    if (!counters_work() && on_valgrind())
        cr_skip_test("valgrind replaces the executable's malloc: allocations are counted in the "
                     "native and ASan runs");
    void *(*volatile m)(size_t) = malloc;
    void (*volatile f)(void *) = free;
    long allocs, frees;
    window_open();
    void *p = m(24);
    f(p);
    window_close(&allocs, &frees);
    cr_assert(allocs == 1 && frees == 1, "self-check: %ld allocs, %ld frees, expected 1 and 1",
              allocs, frees);
    /* and the library's own (a plan holds tables it allocates) */
    kf_context_desc cd;
    kf_context_desc_init(&cd);
    kf_context *ctx = NULL;
    cr_assert(kf_context_create(&cd, &ctx) == KF_OK);
    kf_rnn_desc d;
    kf_rnn_desc_init(&d);
    d.input_size = 3;
    d.hidden_size = 4;
    kf_rnn_plan *plan = NULL;
    window_open();
    kf_status s = kf_rnn_plan_create(ctx, &d, &plan);
    kf_rnn_plan_destroy(plan);
    window_close(&allocs, &frees);
    cr_assert(s == KF_OK);
    cr_assert(allocs > 0 && frees > 0,
              "the interposed allocator does not see the library's allocations (%ld, %ld)",
              allocs, frees);
    kf_context_destroy(ctx);
}

/* ---- steady state --------------------------------------------------------------------------- */
static void steady_state(const char *label, ref_rnn_cfg c) {
    setup s;
    setup_make(&s, c, 0, 0);
    kf_status st[6];
    /* first calls of the shape: the arena may grow, threads may start */
    one_round(&s, 0, st);
    check_round(label, st);
    one_round(&s, 1, st);
    check_round(label, st);
    size_t bytes0 = 0, bytes1 = 0;
    uint64_t g0 = 0, g1 = 0;
    cr_assert(kf_context_arena_info(s.ctx, &bytes0, &g0) == KF_OK);

    kf_status all[4][6];
    long allocs, frees;
    window_open();
    for (int rep = 0; rep < 4; ++rep) one_round(&s, rep % 2, all[rep]);
    window_close(&allocs, &frees);
    for (int rep = 0; rep < 4; ++rep) check_round(label, all[rep]);
    cr_assert(kf_context_arena_info(s.ctx, &bytes1, &g1) == KF_OK);
    cr_expect(g1 == g0 && bytes1 == bytes0, "%s: arena grew in steady state: %zu B / %llu -> %zu B"
              " / %llu", label, bytes0, (unsigned long long)g0, bytes1, (unsigned long long)g1);
    cr_expect(!counting_applies() || allocs == 0,
              "%s: %ld allocations in 4 steady-state rounds, from:%s", label, allocs,
              callers_text(allocs));
    cr_expect(!counting_applies() || frees == 0, "%s: %ld frees in 4 steady-state rounds", label,
              frees);
    setup_free(&s);
}

Test(arena, steady_state_gru) { steady_state("GRU L=2 D=2 dropout lengths", gru_cfg()); }

/* SKLinear in float64: out = 20 (20 % 8 = 4) with k = 16 and r = 32 sends its row-major products
 * through OpenBLAS's dgemm small-matrix path on AVX-512 cores, whose kernel for a ragged tail of
 * 1..4 columns mallocs (host/blas.c splits such products): forward and backward allocate nothing
 * once warm. */
Test(arena, steady_state_sklinear_f64) {
    const int64_t N = 6, in = 24, out = 20, L = 2, k = 16, nik = L * in * k, nko = L * k * out;
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 2);
    kf_sklinear_desc d;
    kf_sklinear_desc_init(&d);
    d.in_features = in, d.out_features = out, d.num_terms = (int32_t)L, d.low_rank = (int32_t)k;
    d.dtype = KF_DTYPE_F64;
    kf_sklinear_plan *plan = NULL;
    KF_OK_(kf_sklinear_plan_create(ctx, &d, &plan));
    ref_rng r;
    ref_rng_seed(&r, 21);
    const int64_t n[9] = {N * in, nik, nko, nko, nik, out, N * out, N * in, nik};
    double *b[9];
    for (int i = 0; i < 9; ++i) {
        b[i] = malloc((size_t)n[i] * sizeof(double));
        for (int64_t e = 0; e < n[i]; ++e) b[i][e] = ref_rng_uniform(&r, -0.5, 0.5);
    }
    kf_sklinear_forward_args f;
    kf_sklinear_forward_args_init(&f);
    f.x = tens(b[0], KF_DTYPE_F64, 2, (int64_t[]){N, in});
    f.S1s = tens(b[1], KF_DTYPE_F64, 3, (int64_t[]){L, in, k});
    f.S2s = tens(b[2], KF_DTYPE_F64, 3, (int64_t[]){L, k, out});
    f.U1s = tens(b[3], KF_DTYPE_F64, 3, (int64_t[]){L, k, out});
    f.U2s = tens(b[4], KF_DTYPE_F64, 3, (int64_t[]){L, in, k});
    f.bias = tens(b[5], KF_DTYPE_F64, 1, (int64_t[]){out});
    f.y = tens(b[6], KF_DTYPE_F64, 2, (int64_t[]){N, out});
    kf_sklinear_backward_args g;
    kf_sklinear_backward_args_init(&g);
    g.x = f.x, g.S1s = f.S1s, g.S2s = f.S2s, g.U1s = f.U1s, g.U2s = f.U2s;
    g.dy = f.y;
    g.dx = tens(b[7], KF_DTYPE_F64, 2, (int64_t[]){N, in});
    g.dS1s = tens(b[8], KF_DTYPE_F64, 3, (int64_t[]){L, in, k});
    KF_OK_(kf_sklinear_forward(plan, &f, NULL, 0));
    KF_OK_(kf_sklinear_backward(plan, KF_GRAD_OVERWRITE, &g, NULL, 0));
    kf_status st[8];
    long allocs, frees;
    window_open();
    for (int rep = 0; rep < 4; ++rep) {
        st[2 * rep] = kf_sklinear_forward(plan, &f, NULL, 0);
        st[2 * rep + 1] = kf_sklinear_backward(plan, KF_GRAD_OVERWRITE, &g, NULL, 0);
    }
    window_close(&allocs, &frees);
    for (int i = 0; i < 8; ++i)
        cr_expect(st[i] == KF_OK, "call %d: %s", i, kf_status_string(st[i]));
    cr_expect(!counting_applies() || allocs == 0,
              "SKLinear f64: %ld allocations in 4 steady-state rounds, from:%s", allocs,
              callers_text(allocs));
    cr_expect(!counting_applies() || frees == 0, "SKLinear f64: %ld frees", frees);
    for (int i = 0; i < 9; ++i) free(b[i]);
    kf_sklinear_plan_destroy(plan);
    kf_context_destroy(ctx);
}

static double *rand_f64(ref_rng *r, int64_t n) {
    double *p = xalloc((size_t)n * sizeof(double));
    for (int64_t i = 0; i < n; ++i) p[i] = ref_rng_uniform(r, -0.5, 0.5);
    return p;
}

/* GRU and A-GRU in float64 (2 layers, dropout; the GRU bidirectional): H = 12 (12 % 8 = 4) sends
 * the backward's dh += dG_h W_hh (K = 3H) through OpenBLAS's dgemm small NN kernel whose ragged
 * tail mallocs on AVX-512 cores (host/blas.c splits such products): training forward and
 * backward allocate nothing once warm. */
Test(arena, steady_state_rnn_f64) {
    for (int cell = REF_GRU; cell <= REF_AGRU; ++cell) {
        const ref_rnn_cfg c = {.cell = cell, .L = 2, .D = cell == REF_GRU ? 2 : 1, .I = 20,
                               .H = 12, .T = 5, .B = 4, .dropout = 0.25f, .gamma = 0.01f};
        kf_context *ctx = make_ctx(KF_DEVICE_CPU, 2);
        kf_rnn_desc d;
        kf_rnn_desc_init(&d);
        d.cell = cell, d.num_layers = c.L, d.input_size = c.I, d.hidden_size = c.H;
        d.flags = c.D == 2 ? KF_RNN_BIDIRECTIONAL : 0u;
        d.dropout = c.dropout;
        d.dtype = KF_DTYPE_F64;
        kf_rnn_plan *plan = NULL;
        KF_OK_(kf_rnn_plan_create(ctx, &d, &plan));
        ref_rng r;
        ref_rng_seed(&r, 31);
        const int nw = ref_rnn_num_weights(&c);
        const int64_t xs[3] = {c.T, c.B, c.I}, ys[3] = {c.T, c.B, c.D * c.H},
                      hs[3] = {c.L * c.D, c.B, c.H};
        double *buf[6] = {rand_f64(&r, ref_rnn_x_numel(&c)), rand_f64(&r, ref_rnn_h_numel(&c)),
                          rand_f64(&r, ref_rnn_y_numel(&c)), rand_f64(&r, ref_rnn_y_numel(&c)),
                          rand_f64(&r, ref_rnn_x_numel(&c)), rand_f64(&r, ref_rnn_h_numel(&c))};
        kf_tensor *wt = calloc((size_t)nw, sizeof *wt), *dwt = calloc((size_t)nw, sizeof *dwt);
        for (int i = 0; i < nw; ++i) {
            int nd;
            int64_t sh[2];
            const int64_t n = ref_rnn_weight_desc(&c, i, NULL, 0, &nd, sh);
            wt[i] = tens(rand_f64(&r, n), KF_DTYPE_F64, nd, sh);
            dwt[i] = tens(rand_f64(&r, n), KF_DTYPE_F64, nd, sh);
        }
        size_t wsb = 0, rsb = 0;
        KF_OK_(kf_rnn_workspace_size(plan, c.T, c.B, KF_MODE_TRAINING, &wsb, &rsb));
        void *rs = xalloc(rsb);
        kf_rnn_forward_args f;
        kf_rnn_forward_args_init(&f);
        f.x = tens(buf[0], KF_DTYPE_F64, 3, xs);
        f.h0 = tens(buf[1], KF_DTYPE_F64, 3, hs);
        f.weights = wt, f.num_weights = nw;
        f.y = tens(buf[2], KF_DTYPE_F64, 3, ys);
        kf_rnn_backward_args g;
        kf_rnn_backward_args_init(&g);
        g.x = f.x, g.h0 = f.h0, g.weights = wt, g.num_weights = nw;
        g.dy = tens(buf[3], KF_DTYPE_F64, 3, ys);
        g.dx = tens(buf[4], KF_DTYPE_F64, 3, xs);
        g.dh0 = tens(buf[5], KF_DTYPE_F64, 3, hs);
        g.dweights = dwt, g.num_dweights = nw;
        KF_OK_(kf_rnn_forward(plan, KF_MODE_TRAINING, &f, NULL, 0, rs, rsb));
        KF_OK_(kf_rnn_backward(plan, KF_GRAD_OVERWRITE, &g, NULL, 0, rs, rsb));
        kf_status st[8];
        long allocs, frees;
        window_open();
        for (int rep = 0; rep < 4; ++rep) {
            st[2 * rep] = kf_rnn_forward(plan, KF_MODE_TRAINING, &f, NULL, 0, rs, rsb);
            st[2 * rep + 1] = kf_rnn_backward(plan, KF_GRAD_OVERWRITE, &g, NULL, 0, rs, rsb);
        }
        window_close(&allocs, &frees);
        for (int i = 0; i < 8; ++i)
            cr_expect(st[i] == KF_OK, "cell %d call %d: %s", cell, i, kf_status_string(st[i]));
        cr_expect(!counting_applies() || allocs == 0,
                  "RNN f64 cell %d: %ld allocations in 4 steady-state rounds, from:%s", cell,
                  allocs, callers_text(allocs));
        cr_expect(!counting_applies() || frees == 0, "RNN f64 cell %d: %ld frees", cell, frees);
        for (int i = 0; i < nw; ++i) free(wt[i].data), free(dwt[i].data);
        for (int i = 0; i < 6; ++i) free(buf[i]);
        free(wt), free(dwt), free(rs);
        kf_rnn_plan_destroy(plan);
        kf_context_destroy(ctx);
    }
}

Test(arena, steady_state_agru) {
    steady_state("A-GRU L=2 dropout lengths batch_first", agru_cfg());
}

/* One sample (B = 1): the common single-sequence inference case. */
Test(arena, steady_state_batch_one) {
    ref_rnn_cfg c = gru_cfg();
    c.B = 1;
    steady_state("GRU L=2 D=2 B=1", c);
    ref_rnn_cfg a = agru_cfg();
    a.B = 1;
    steady_state("A-GRU L=2 B=1", a);
}

/* A single-threaded context too (a 1-thread OpenMP team must not allocate per call either). */
Test(arena, steady_state_one_thread) {
    ref_rnn_cfg c = gru_cfg();
    setup s;
    setup_make(&s, c, 0, 0);
    kf_context_destroy(s.ctx); /* swap in a 1-thread context with a fresh plan */
    kf_rnn_plan_destroy(s.plan);
    kf_context_desc cd;
    kf_context_desc_init(&cd);
    cd.num_threads = 1;
    cr_assert(kf_context_create(&cd, &s.ctx) == KF_OK);
    kf_rnn_desc d;
    kf_rnn_desc_init(&d);
    d.num_layers = c.L;
    d.input_size = c.I;
    d.hidden_size = c.H;
    d.flags = KF_RNN_BIDIRECTIONAL;
    d.dropout = c.dropout;
    cr_assert(kf_rnn_plan_create(s.ctx, &d, &s.plan) == KF_OK);
    kf_status st[6], all[3][6];
    one_round(&s, 0, st);
    check_round("1 thread", st);
    uint64_t g0 = 0, g1 = 0;
    kf_context_arena_info(s.ctx, NULL, &g0);
    long allocs, frees;
    window_open();
    for (int rep = 0; rep < 3; ++rep) one_round(&s, 0, all[rep]);
    window_close(&allocs, &frees);
    for (int rep = 0; rep < 3; ++rep) check_round("1 thread", all[rep]);
    kf_context_arena_info(s.ctx, NULL, &g1);
    cr_expect(g1 == g0, "1 thread: grow_count %llu -> %llu", (unsigned long long)g0,
              (unsigned long long)g1);
    cr_expect(!counting_applies() || (allocs == 0 && frees == 0),
              "1 thread: %ld allocations, %ld frees, from:%s", allocs, frees,
              callers_text(allocs));
    setup_free(&s);
}

/* The arena only grows: after a longer sequence, a shorter one that fits never allocates. */
Test(arena, grows_to_the_largest_then_stays) {
    ref_rnn_cfg big = gru_cfg();
    big.T = 20;
    setup s;
    setup_make(&s, big, 0, 0);
    kf_status st[6];
    one_round(&s, 0, st);
    check_round("T=20", st);
    size_t bytes_big = 0;
    uint64_t g0 = 0, g1 = 0;
    cr_assert(kf_context_arena_info(s.ctx, &bytes_big, &g0) == KF_OK);
    cr_expect(g0 >= 1 && bytes_big >= s.ws_train, "arena %zu B (grow_count %llu) after a call "
              "needing %zu B", bytes_big, (unsigned long long)g0, s.ws_train);

    /* the same buffers viewed as a shorter sequence (time-major: a prefix of x, y, dy, dx) */
    const int64_t Tshort = 6;
    size_t ws_short = 0, rs_short = 0;
    cr_assert(kf_rnn_workspace_size(s.plan, Tshort, big.B, KF_MODE_TRAINING, &ws_short,
                                    &rs_short) == KF_OK);
    cr_assert(rs_short <= s.rs);
    s.c.T = Tshort;
    s.fa.x.shape[0] = s.ba.x.shape[0] = s.ba.dx.shape[0] = Tshort;
    s.fa.y.shape[0] = s.ba.dy.shape[0] = Tshort;
    for (int64_t b = 0; b < big.B; ++b) s.len[b] = (int32_t)(s.len[b] % (Tshort + 1));
    s.ws_train = ws_short;
    cr_assert(kf_rnn_workspace_size(s.plan, Tshort, big.B, KF_MODE_INFERENCE, &s.ws_inf, NULL) ==
              KF_OK);
    if (ws_short > bytes_big || s.ws_inf > bytes_big)
        cr_skip_test("T=%lld needs more workspace than T=20 here (%zu > %zu)", (long long)Tshort,
                     ws_short, bytes_big);
    s.rs = rs_short;
    long allocs, frees;
    kf_status all[2][6];
    window_open();
    one_round(&s, 0, all[0]);
    one_round(&s, 0, all[1]);
    window_close(&allocs, &frees);
    check_round("T=6 after T=20", all[0]);
    check_round("T=6 after T=20", all[1]);
    size_t bytes_after = 0;
    cr_assert(kf_context_arena_info(s.ctx, &bytes_after, &g1) == KF_OK);
    cr_expect(g1 == g0 && bytes_after == bytes_big, "arena changed for a smaller shape: %zu/%llu"
              " -> %zu/%llu", bytes_big, (unsigned long long)g0, bytes_after,
              (unsigned long long)g1);
    cr_expect(!counting_applies() || (allocs == 0 && frees == 0),
              "smaller shape: %ld allocations, %ld frees, from:%s", allocs, frees,
              callers_text(allocs));
    setup_free(&s);
}

/* ---- a fixed arena ------------------------------------------------------------------------ */
Test(arena, fixed_arena) {
    ref_rnn_cfg c = gru_cfg();
    setup s;
    setup_make(&s, c, KF_CONTEXT_FIXED_ARENA, 0);
    size_t need = s.ws_train > s.ws_inf ? s.ws_train : s.ws_inf;
    if (need == 0) cr_skip_test("this shape needs no workspace");
    uint64_t g0 = 0, g1 = 0;
    size_t bytes = 1;
    cr_assert(kf_context_arena_info(s.ctx, &bytes, &g0) == KF_OK);
    cr_expect_eq(bytes, 0u);

    /* without a reserve: refused, never allocated */
    kf_status st = KF_OK;
    if (s.ws_inf > 0) {
        st = kf_rnn_forward(s.plan, KF_MODE_INFERENCE, &s.fa, NULL, 0, NULL, 0);
        cr_expect(st == KF_ERR_WORKSPACE_TOO_SMALL, "inference, fixed empty arena: %s (%s)",
                  kf_status_string(st), kf_last_error_message());
        cr_expect(strstr(kf_last_error_message(), "kf_rnn_forward") != NULL, "message '%s'",
                  kf_last_error_message());
    }
    if (s.ws_train > 0) {
        st = kf_rnn_forward(s.plan, KF_MODE_TRAINING, &s.fa, NULL, 0, s.reserve, s.rs);
        cr_expect(st == KF_ERR_WORKSPACE_TOO_SMALL, "training, fixed empty arena: %s",
                  kf_status_string(st));
    }
    cr_assert(kf_context_arena_info(s.ctx, &bytes, &g1) == KF_OK);
    cr_expect(bytes == 0 && g1 == g0, "a fixed arena grew: %zu B, grow_count %llu -> %llu", bytes,
              (unsigned long long)g0, (unsigned long long)g1);

    /* a lent workspace needs no arena */
    kf_status r[6];
    one_round(&s, 1, r);
    check_round("fixed arena, caller workspace", r);

    /* after kf_context_reserve: every call fits, nothing allocates */
    cr_assert(kf_context_reserve(s.ctx, need) == KF_OK, "%s", kf_last_error_message());
    cr_assert(kf_context_arena_info(s.ctx, &bytes, &g0) == KF_OK);
    cr_expect(bytes >= need);
    long allocs, frees;
    kf_status all[2][6];
    window_open();
    one_round(&s, 0, all[0]);
    one_round(&s, 1, all[1]);
    window_close(&allocs, &frees);
    check_round("fixed arena after reserve", all[0]);
    check_round("fixed arena after reserve", all[1]);
    cr_assert(kf_context_arena_info(s.ctx, NULL, &g1) == KF_OK);
    cr_expect(g1 == g0, "grow_count %llu -> %llu", (unsigned long long)g0, (unsigned long long)g1);
    cr_expect(!counting_applies() || (allocs == 0 && frees == 0),
              "fixed arena: %ld allocations, %ld frees, from:%s", allocs, frees,
              callers_text(allocs));
    setup_free(&s);

    /* a fixed arena sized at creation works at once */
    setup_make(&s, c, KF_CONTEXT_FIXED_ARENA, need);
    one_round(&s, 0, r);
    check_round("fixed arena sized at creation", r);
    setup_free(&s);
}

/* ---- queries never allocate --------------------------------------------------------------- */
Test(arena, queries_do_not_allocate) {
    setup s;
    setup_make(&s, gru_cfg(), 0, 0);
    long allocs, frees;
    kf_status st[8];
    const char *name = NULL;
    int32_t count = 0, nd = 0;
    int64_t sh[KF_MAX_DIMS];
    size_t a = 0, b = 0;
    int64_t shape[2] = {3, 4};
    kf_tensor t;
    window_open();
    st[0] = kf_rnn_workspace_size(s.plan, 11, 3, KF_MODE_TRAINING, &a, &b);
    st[1] = kf_rnn_workspace_size(s.plan, 500, 64, KF_MODE_INFERENCE, &a, &b);
    st[2] = kf_rnn_weight_count(s.plan, &count);
    st[3] = kf_rnn_weight_info(s.plan, 5, &name, &nd, sh);
    st[4] = kf_context_arena_info(s.ctx, &a, NULL);
    st[5] = kf_tensor_init(&t, NULL, KF_DTYPE_F32, 2, shape);
    st[6] = kf_context_synchronize(s.ctx);
    st[7] = kf_context_device_type(s.ctx, &count);
    (void)kf_last_error_message();
    (void)kf_status_string(KF_ERR_DEVICE);
    (void)kf_version_string();
    window_close(&allocs, &frees);
    for (int i = 0; i < 8; ++i)
        cr_expect(st[i] == KF_OK, "query %d: %s", i, kf_status_string(st[i]));
    cr_expect(!counting_applies() || (allocs == 0 && frees == 0),
              "queries: %ld allocations, %ld frees, from:%s", allocs, frees,
              callers_text(allocs));
    setup_free(&s);
}

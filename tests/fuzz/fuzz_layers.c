/* libFuzzer harness for the C API of the two newer layers, SKLinear (kf_sklinear_*) and KANLinear
 * (kf_kan_linear_*). Build: tests/fuzz/CMakeLists.txt; run: scripts/fuzz.sh. Smaller sibling of
 * fuzz_rnn.c with the same oracle discipline.
 *
 * Each input: the plan's dtype and the context's CPU instruction set (fuzz_draw_setup), which
 * layer, a context (1-2 threads, maybe a fixed arena), a plan descriptor with up to 3 mutations (in/out features, num_terms, low_rank, bias, grid_size, spline_order,
 * standalone_scale, dtype, struct_size and its tail), then up to 8 calls (forward, backward, a
 * workspace-size query), each with up to 3 mutations: of a tensor argument (absent, dtype, rank,
 * one extent, one stride, misaligned data, an extent shrunk to 1, an absent tensor made present:
 * so also a bias / spline_scaler given to a plan without one or missing from a plan with one, and
 * leading dims of x / y / dy / dx that disagree), of struct_size, of grad_mode, or a decreasing
 * knot pair in the KAN grid; and a caller workspace that is too small, NULL with bytes or
 * misaligned.
 *
 * The oracle judges the call after all mutations, from the tensors actually passed (the contract of
 * capi/include/kfuse.h): a call it judges invalid must fail and write nothing; a call it judges
 * valid must succeed (KF_ERR_WORKSPACE_TOO_SMALL only from a fixed arena, KF_ERR_OUT_OF_MEMORY
 * allowed), write every element of its outputs (NaN-poisoned before; KF_GRAD_ACCUMULATE outputs
 * are pre-filled with finite values), leave every other byte of every buffer (inputs, absent
 * outputs, the rest of each output buffer and 128 guard bytes after it) unchanged, and match the
 * float64 references of tests/c/ref_sklinear.c and tests/c/ref_kan.c on the values the tensors
 * hold (||got - ref|| <= 1e-3 ||ref|| + 1e-4 sqrt(n) for float32, the bounds fuzz_input.h
 * derives from docs/precision.md for float64, bfloat16 and float16). A tensor of another dtype
 * than the plan's (the dtype mutation draws every kf_dtype value and some invalid ones) must be
 * rejected.
 *
 * Lies: a valid-looking call whose tensors declare more elements than their buffers hold (x and y
 * enlarged consistently) cannot be detected by any library; the harness skips such calls instead
 * of making them. Shapes stay tiny: in, out <= 6, N <= 6 rows, L <= 3, k <= 4, G <= 5,
 * spline_order <= 3; KAN grids are non-decreasing (uniform or with repeated knots) unless the
 * "decreasing grid" mutation is made, which a CPU context must reject.
 *
 * Seed corpus (tests/fuzz/corpus/fuzz_layers), written by hand in this input format with a few
 * lines of Python (bytes in the order run() and call() read them; FUZZ_LAYERS_STATS=1 prints how
 * many calls were accepted / rejected): skl_fwd_bwd (SKLinear with bias, forward then an
 * accumulating backward with a caller workspace), skl_nobias_fixed (no bias, fixed arena, a bias
 * passed anyway, then valid calls), kan_fwd_bwd (KAN with repeated knots, forward and backward),
 * kan_decreasing_grid (uniform grid, forward with a decreasing knot pair); every input begins
 * with the byte fuzz_draw_setup reads (0: float32, the CPU's default kernels), and the first three
 * come again as NAME.f64, .bf16, .f16 and as .f32.avx2, .bf16.avx2 (the baseline kernels), and
 * skl_fwd_bwd.bf16.avx512 draws avx512 (the fallback on a CPU without AVX-512). */
#include "kfuse.h"
#include "ref_kan.h"
#include "ref_rnn.h"
#include "ref_sklinear.h"

#include <math.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_NAME "fuzz_layers"
#include "fuzz_oracle.h"

/* ---- tensor arguments ------------------------------------------------------------------------ */
enum { K_X, K_ROW, K_FIXED };
typedef struct targ {
    const char *name;
    int kind;          /* K_X: x; K_ROW: x's leading dims + width; K_FIXED: exactly `shape` */
    int ndim;          /* honest */
    int64_t shape[KF_MAX_DIMS];
    int64_t numel;
    int32_t dt;        /* the plan's */
    buf b;             /* the tensor, dtype dt */
    float *f;          /* an input's values (fuzz_store: what b holds) */
} targ;
static void targ_make(targ *a, const char *name, int kind, int32_t dt, int ndim, const int64_t *shape) {
    memset(a, 0, sizeof *a);
    a->name = name, a->kind = kind, a->dt = dt, a->ndim = ndim, a->numel = 1;
    for (int i = 0; i < ndim; i++) a->shape[i] = shape[i], a->numel *= shape[i];
    a->b = buf_new((size_t)a->numel * fuzz_dtype_bytes(dt));
    a->f = calloc((size_t)a->numel, sizeof *a->f);
    if (!a->f) abort();
}
static void targ_free(targ *a) { free(a->b.mem), free(a->f); }
static void sync(targ *a) { fuzz_store(a->dt, a->b.p, a->f, a->numel); }
static kf_tensor honest(const targ *a, bool present) {
    kf_tensor t;
    if (kf_tensor_init(&t, present ? a->b.p : NULL, a->dt, a->ndim, a->shape) != KF_OK)
        FAIL("kf_tensor_init");
    return t;
}

/* One argument slot of a call. */
typedef struct slot {
    targ *a;
    kf_tensor *t;      /* inside the args struct */
    bool required;     /* must be present */
    bool allowed;      /* may be present (bias-like tensors only with the plan's option) */
    bool output;
    bool accum;        /* a parameter gradient (grad_mode applies) */
    int64_t width;     /* K_X / K_ROW: last extent */
} slot;

static void mutate_tensor(rd *r, slot *s) {
    kf_tensor *t = s->t;
    targ *a = s->a;
    const uint32_t k = u8(r) % 9;
    if (mutate_tensor_common(r, t, a->b.p, a->ndim, fuzz_dtype_bytes(a->dt), k)) return;
    if (!t->data) t->data = a->b.p; /* k = 8: an absent tensor made present */
}

/* Whether the passed tensor of slot `s` is acceptable; x's leading dims come in `lead` (K_ROW) or
 * are returned (K_X) with the row count. */
static bool slot_valid(const slot *s, int32_t *x_ndim, int64_t *lead, int64_t *N, int64_t *numel) {
    const kf_tensor *t = s->t;
    if (!t->data) return !s->required;
    if (!s->allowed) return false;
    if (t->dtype != s->a->dt || (uintptr_t)t->data % fuzz_dtype_bytes(s->a->dt)) return false;
    if (s->a->kind == K_FIXED) {
        if (t->ndim != s->a->ndim) return false;
        for (int i = 0; i < t->ndim; i++)
            if (t->shape[i] != s->a->shape[i]) return false;
    } else {
        if (s->a->kind == K_X) {
            if (t->ndim < 1 || t->ndim > KF_MAX_DIMS) return false;
            *x_ndim = t->ndim;
        } else if (t->ndim != *x_ndim) return false;
        if (t->shape[t->ndim - 1] != s->width) return false;
        int64_t n = 1;
        for (int i = 0; i + 1 < t->ndim; i++) {
            if (s->a->kind == K_X) {
                if (t->shape[i] < 1) return false;
                lead[i] = t->shape[i];
            } else if (t->shape[i] != lead[i]) return false;
            if (__builtin_mul_overflow(n, t->shape[i], &n) || n > INT32_MAX) return false;
        }
        if (s->a->kind == K_X) *N = n;
    }
    return contiguous(t, numel);
}

/* ---- the session ------------------------------------------------------------------------------- */
typedef struct sess {
    kf_context *ctx;
    bool fixed_arena, kan;
    fuzz_setup su;
    kf_sklinear_plan *skl;
    kf_kan_linear_plan *kp;
    int64_t in, out, L, k, G, so, nk, C, N;
    bool opt; /* SKLinear: bias; KAN: standalone_scale */
    int xnd;
    int64_t lead[KF_MAX_DIMS];
    /* SKLinear: p[0..3] = S1s S2s U1s U2s, p[4] = bias; KAN: p[0] grid, p[1] base, p[2] spline,
     * p[3] scaler. dp: their gradients (dp[0] unused for KAN). */
    targ x, y, dy, dx, p[5], dp[5];
} sess;

static size_t ws_need(sess *s, int64_t N) {
    size_t b = 0;
    kf_status st = s->kan ? kf_kan_linear_workspace_size(s->kp, N, &b)
                          : kf_sklinear_workspace_size(s->skl, N, &b);
    if (st != KF_OK) FAIL("workspace_size(%lld) failed for a valid N", (long long)N);
    return b;
}

static void fill_inputs(sess *s, rd *r) {
    ref_rng g;
    ref_rng_seed(&g, u64(r));
    ref_fill_uniform_f32(&g, s->x.f, s->x.numel, -1.5, 1.5);
    ref_fill_uniform_f32(&g, s->dy.f, s->dy.numel, -1, 1);
    for (int i = s->kan ? 1 : 0; i < (s->kan ? 4 : 5); i++) {
        ref_fill_uniform_f32(&g, s->p[i].f, s->p[i].numel, -1, 1);
        sync(&s->p[i]);
    }
    sync(&s->dy);
    if (!s->kan) {
        sync(&s->x);
        return;
    }
    uint32_t kind = u8(r) % 3;
    float *gr = s->p[0].f;
    if (kind == 0) {
        kf_tensor t = honest(&s->p[0], true);
        kf_status st = kf_kan_linear_uniform_grid(s->kp, -1.0f, 1.0f, &t);
        check_status(st, "kf_kan_linear_uniform_grid");
        if (st != KF_OK) FAIL("uniform_grid failed");
        fuzz_adopt(s->p[0].dt, s->p[0].b.p, gr, s->p[0].numel);
    } else {
        for (int64_t i = 0; i < s->in; i++) { /* steps of 0..0.5 (exact), repeated knots included */
            float v = -1.0f - 0.25f * (float)(u8(r) % 5);
            for (int64_t j = 0; j < s->nk; j++) {
                gr[i * s->nk + j] = v;
                v += kind == 1 ? 0.125f * (float)(u8(r) % 5) : 2.0f / (float)s->G;
            }
        }
        sync(&s->p[0]); /* rounding keeps the knots non-decreasing */
    }
    /* some x exactly on knots */
    for (int64_t n = 0; n < s->N; n++)
        for (int64_t i = 0; i < s->in; i++)
            if (ref_rng_next(&g) % 6 == 0)
                s->x.f[n * s->in + i] = gr[i * s->nk + (int64_t)(ref_rng_next(&g) % (uint64_t)s->nk)];
    sync(&s->x);
}

/* FUZZ_LAYERS_STATS=1: print per-layer counts of accepted / rejected / skipped calls at exit. */
static long g_stats[2][2][3]; /* [kan][backward][ok, rejected, skipped] */
static void print_stats(void) {
    for (int l = 0; l < 2; l++)
        for (int b = 0; b < 2; b++)
            fprintf(stderr, "fuzz_layers stats: %s %s: ok %ld, rejected %ld, skipped %ld\n",
                    l ? "kan" : "sklinear", b ? "backward" : "forward", g_stats[l][b][0],
                    g_stats[l][b][1], g_stats[l][b][2]);
}

static double *f64(const float *p, int64_t n) { return ref_to_f64(p, n); }

static void call(sess *s, rd *r, bool backward) {
    /* args struct in a buffer with room for a struct_size tail */
    unsigned char argbuf[sizeof(kf_kan_linear_backward_args) + sizeof(kf_sklinear_backward_args) + 64]
        __attribute__((aligned(16)));
    memset(argbuf, 0, sizeof argbuf);
    size_t asz, aold; /* this header's size, and the oldest size the library still reads */
    slot sl[12];
    int ns = 0;
    uint32_t opt = u8(r);
    bool skl = !s->kan;
#define SLOT(A, T, REQ, ALW, OUT, ACC, W) sl[ns++] = (slot){(A), (T), (REQ), (ALW), (OUT), (ACC), (W)}
    if (skl && !backward) {
        kf_sklinear_forward_args *a = (void *)argbuf;
        kf_sklinear_forward_args_init(a);
        asz = sizeof *a;
        aold = offsetof(kf_sklinear_forward_args, mode); /* 1.1-1.7: no epilogue fields */
        SLOT(&s->x, &a->x, true, true, false, false, s->in);
        SLOT(&s->p[0], &a->S1s, true, true, false, false, 0);
        SLOT(&s->p[1], &a->S2s, true, true, false, false, 0);
        SLOT(&s->p[2], &a->U1s, true, true, false, false, 0);
        SLOT(&s->p[3], &a->U2s, true, true, false, false, 0);
        SLOT(&s->p[4], &a->bias, s->opt, s->opt, false, false, 0);
        SLOT(&s->y, &a->y, true, true, true, false, s->out);
    } else if (skl) {
        kf_sklinear_backward_args *a = (void *)argbuf;
        kf_sklinear_backward_args_init(a);
        asz = sizeof *a;
        aold = offsetof(kf_sklinear_backward_args, mode);
        SLOT(&s->x, &a->x, true, true, false, false, s->in);
        SLOT(&s->p[0], &a->S1s, true, true, false, false, 0);
        SLOT(&s->p[1], &a->S2s, true, true, false, false, 0);
        SLOT(&s->p[2], &a->U1s, true, true, false, false, 0);
        SLOT(&s->p[3], &a->U2s, true, true, false, false, 0);
        SLOT(&s->dy, &a->dy, true, true, false, false, s->out);
        SLOT(&s->dx, &a->dx, false, true, true, false, s->in);
        SLOT(&s->dp[0], &a->dS1s, false, true, true, true, 0);
        SLOT(&s->dp[1], &a->dS2s, false, true, true, true, 0);
        SLOT(&s->dp[4], &a->dbias, false, s->opt, true, true, 0);
    } else if (!backward) {
        kf_kan_linear_forward_args *a = (void *)argbuf;
        kf_kan_linear_forward_args_init(a);
        asz = sizeof *a;
        aold = offsetof(kf_kan_linear_forward_args, input_weight); /* 1.1-1.8: no order-m fields */
        SLOT(&s->x, &a->x, true, true, false, false, s->in);
        SLOT(&s->p[0], &a->grid, true, true, false, false, 0);
        SLOT(&s->p[1], &a->base_weight, false, true, false, false, 0); /* optional since 1.3 */
        SLOT(&s->p[2], &a->spline_weight, true, true, false, false, 0);
        SLOT(&s->p[3], &a->spline_scaler, s->opt, s->opt, false, false, 0);
        SLOT(&s->y, &a->y, true, true, true, false, s->out);
    } else {
        kf_kan_linear_backward_args *a = (void *)argbuf;
        kf_kan_linear_backward_args_init(a);
        asz = sizeof *a;
        aold = offsetof(kf_kan_linear_backward_args, input_weight); /* 1.1-1.8 likewise */
        SLOT(&s->x, &a->x, true, true, false, false, s->in);
        SLOT(&s->p[0], &a->grid, true, true, false, false, 0);
        SLOT(&s->p[1], &a->base_weight, false, true, false, false, 0); /* optional since 1.3 */
        SLOT(&s->p[2], &a->spline_weight, true, true, false, false, 0);
        SLOT(&s->p[3], &a->spline_scaler, s->opt, s->opt, false, false, 0);
        SLOT(&s->dy, &a->dy, true, true, false, false, s->out);
        SLOT(&s->dx, &a->dx, false, true, true, false, s->in);
        SLOT(&s->dp[1], &a->dbase_weight, false, true, true, true, 0);
        SLOT(&s->dp[2], &a->dspline_weight, false, true, true, true, 0);
        SLOT(&s->dp[3], &a->dspline_scaler, false, s->opt, true, true, 0);
    }
#undef SLOT
    /* honest tensors: required and allowed ones present, optional outputs per `opt` bits */
    for (int i = 0; i < ns; i++) {
        bool present = sl[i].required || (sl[i].allowed && !(opt >> (i % 8) & 1));
        *sl[i].t = honest(sl[i].a, present);
    }
    /* KAN: no base_weight (no base term, since 1.3) means no dbase_weight either */
    const int kbw = 2, kdbw = 7; /* their slots */
    if (s->kan && backward && !sl[kbw].t->data) *sl[kdbw].t = honest(sl[kdbw].a, false);
    int32_t grad_mode = (u8(r) & 1) ? KF_GRAD_ACCUMULATE : KF_GRAD_OVERWRITE;
    int64_t swapped = -1; /* grid element index whose pair was swapped */
    float saved[2] = {0, 0};

    int nmut = (int)(u8(r) % 4);
    for (int m = 0; m < nmut; m++) {
        uint32_t w = u8(r) % 16;
        if (w < 11) {
            mutate_tensor(r, &sl[u8(r) % (uint32_t)ns]);
        } else if (w == 11) {
            size_t v = (size_t)interesting_i64(r, (int64_t)asz);
            if (v > sizeof argbuf) v = sizeof argbuf;
            *(size_t *)(void *)argbuf = v;
        } else if (w == 12) {
            size_t v = asz + 1 + u8(r) % 64;
            *(size_t *)(void *)argbuf = v;
            argbuf[asz + u8(r) % (v - asz)] = (unsigned char)(1 + u8(r) % 255);
        } else if (w == 13 && backward) {
            grad_mode = (int32_t)interesting_i64(r, grad_mode);
        } else if (w == 14 && s->kan && swapped < 0) { /* decreasing grid: make one knot pair strictly decrease */
            int64_t i = (int64_t)(u8(r) % (uint32_t)s->in), j = (int64_t)(u8(r) % (uint32_t)(s->nk - 1));
            float *t = s->p[0].f + i * s->nk;
            float a0 = t[j], a1 = t[j + 1];
            saved[0] = a0, saved[1] = a1;
            if (a0 == a1) a1 = a0 + 0.25f;
            t[j] = a1, t[j + 1] = a0;
            sync(&s->p[0]); /* a0 < a1 stay so in every dtype (0.25 apart, or rounded alike) */
            swapped = i * s->nk + j;
        }
    }

    /* ---- judge ---- */
    bool bad = false;
    int32_t xnd = 0;
    int64_t lead[KF_MAX_DIMS] = {0}, N = 0, numel[12] = {0};
    size_t ssz = *(size_t *)(void *)argbuf;
    if (ssz < aold) bad = true;
    for (size_t i = asz; i < ssz && i < sizeof argbuf; i++)
        if (argbuf[i]) bad = true;
    if (backward && grad_mode != KF_GRAD_OVERWRITE && grad_mode != KF_GRAD_ACCUMULATE) bad = true;
    bool xok = slot_valid(&sl[0], &xnd, lead, &N, &numel[0]);
    if (!xok) bad = true;
    for (int i = 1; i < ns && xok; i++)
        if (!slot_valid(&sl[i], &xnd, lead, &N, &numel[i])) bad = true;
    if (s->kan && backward && !sl[kbw].t->data && sl[kdbw].t->data) bad = true;
    if (s->kan && sl[1].t->data && !bad) { /* valid grid tensor: values must be non-decreasing */
        for (int64_t i = 0; i < s->in; i++)
            for (int64_t j = 0; j + 1 < s->nk; j++)
                if (!(s->p[0].f[i * s->nk + j] <= s->p[0].f[i * s->nk + j + 1])) bad = true;
    }
    if (swapped >= 0 && !bad) FAIL("harness: decreasing grid judged valid");
    bool skip = false;
    if (!bad) /* undetectable lies (consistent enlarged leading dims): never made */
        for (int i = 0; i < ns; i++)
            if (sl[i].t->data && (uint64_t)numel[i] > sl[i].a->b.cap / fuzz_dtype_bytes(s->su.dtype))
                skip = true; /* no multiplication: it can wrap */
    wsarg ws;
    if (pick_workspace(r, ws_need(s, (xok && N >= 1 && N <= s->N) ? N : s->N), &ws)) bad = true;
    if (skip) {
        g_stats[s->kan][backward][2]++;
        goto out;
    }

    /* ---- poison outputs, pre-fill accumulated gradients, snapshot every buffer ---- */
    bool accumulate = grad_mode == KF_GRAD_ACCUMULATE;
    ref_rng g;
    ref_rng_seed(&g, u64(r));
    for (int i = 0; i < ns; i++) {
        if (!sl[i].output) continue;
        if (sl[i].accum && accumulate) {
            ref_fill_uniform_f32(&g, sl[i].a->f, sl[i].a->numel, -1, 1);
            sync(sl[i].a);
        } else {
            fuzz_poison(sl[i].a->dt, sl[i].a->b.p, sl[i].a->numel);
        }
    }
    unsigned char *snap[12];
    for (int i = 0; i < ns; i++) {
        size_t n = sl[i].a->b.cap + GUARD;
        snap[i] = malloc(n);
        memcpy(snap[i], sl[i].a->b.p, n);
    }

    kf_status st;
    if (skl && !backward) st = kf_sklinear_forward(s->skl, (void *)argbuf, ws.p, ws.bytes);
    else if (skl) st = kf_sklinear_backward(s->skl, (kf_grad_mode)grad_mode, (void *)argbuf, ws.p, ws.bytes);
    else if (!backward) st = kf_kan_linear_forward(s->kp, (void *)argbuf, ws.p, ws.bytes);
    else st = kf_kan_linear_backward(s->kp, (kf_grad_mode)grad_mode, (void *)argbuf, ws.p, ws.bytes);
    const char *fn = backward ? "backward" : "forward";
    check_status(st, fn);
    g_stats[s->kan][backward][st == KF_OK ? 0 : 1]++;

    if (st != KF_OK) {
        for (int i = 0; i < ns; i++)
            if (memcmp(snap[i], sl[i].a->b.p, sl[i].a->b.cap + GUARD))
                FAIL("%s failed (%d) but changed buffer %s", fn, (int)st, sl[i].a->name);
        if (!bad && !(st == KF_ERR_WORKSPACE_TOO_SMALL && s->fixed_arena && !ws.p) &&
            st != KF_ERR_OUT_OF_MEMORY)
            FAIL("%s rejected a valid call with %d", fn, (int)st);
    } else {
        if (bad) FAIL("%s accepted an invalid call", fn);
        /* outputs: only their declared elements changed */
        for (int i = 0; i < ns; i++) {
            size_t used = (sl[i].output && sl[i].t->data) ? (size_t)numel[i] * fuzz_dtype_bytes(s->su.dtype) : 0;
            for (size_t b = used; b < sl[i].a->b.cap + GUARD; b++)
                if (snap[i][b] != sl[i].a->b.p[b])
                    FAIL("%s: %s byte %zu (of %zu used, cap %zu) changed", fn, sl[i].a->name, b,
                         used, sl[i].a->b.cap);
        }
        /* the float64 reference on the first N rows */
        double *x = f64(s->x.f, N * s->in), *dy = f64(s->dy.f, N * s->out);
        double *P[5] = {0}, *D[5] = {0}, *dx = calloc((size_t)(N * s->in), 8), *y = calloc((size_t)(N * s->out), 8);
        for (int i = 0; i < 5; i++)
            if (s->p[i].b.mem) P[i] = f64(s->p[i].f, s->p[i].numel), D[i] = calloc((size_t)s->p[i].numel, 8);
        if (skl) {
            ref_skl_cfg c = {N, s->in, s->out, s->L, s->k};
            if (!backward) ref_skl_forward(&c, x, P[0], P[1], P[2], P[3], s->opt ? P[4] : NULL, y);
            else ref_skl_backward(&c, x, P[0], P[1], P[2], P[3], dy, dx, D[0], D[1], s->opt ? D[4] : NULL);
        } else {
            ref_kan_cfg c = {N, s->in, s->out, s->G, s->so};
            if (!sl[kbw].t->data) memset(P[1], 0, (size_t)s->p[1].numel * 8); /* no base term */
            if (!backward) ref_kan_forward(&c, x, P[0], P[1], P[2], s->opt ? P[3] : NULL, y);
            else ref_kan_backward(&c, x, P[0], P[1], P[2], s->opt ? P[3] : NULL, dy, dx, D[1], D[2],
                                  s->opt ? D[3] : NULL);
        }
        for (int i = 0; i < ns; i++) {
            if (!sl[i].output || !sl[i].t->data) continue;
            targ *a = sl[i].a;
            double *want = a == &s->y ? y : a == &s->dx ? dx : NULL;
            for (int j = 0; j < 5 && !want; j++)
                if (a == &s->dp[j]) want = D[j];
            if (!want) FAIL("harness: no reference for %s", a->name);
            if (sl[i].accum && accumulate) /* a->f: the values it held before the call */
                for (int64_t e = 0; e < numel[i]; e++) want[e] += a->f[e];
            check_close(a->name, a->dt, a->b.p, want, numel[i]);
        }
        free(x), free(dy), free(dx), free(y);
        for (int i = 0; i < 5; i++) free(P[i]), free(D[i]);
    }
    for (int i = 0; i < ns; i++) free(snap[i]);
out:
    if (swapped >= 0) { /* restore the grid */
        s->p[0].f[swapped] = saved[0], s->p[0].f[swapped + 1] = saved[1];
        sync(&s->p[0]);
    }
    free(ws.b.mem);
}

/* ---- plan descriptors -------------------------------------------------------------------------- */
static bool mul_ok(unsigned __int128 v) { return v <= (unsigned __int128)INT64_MAX; }

/* Creates the plan from a mutated descriptor and checks the verdict; returns whether it made a
 * tiny plan usable by the session (else the caller falls back to the honest descriptor). */
static bool plan_from_fuzzed_desc(sess *s, rd *r) {
    unsigned char db[sizeof(kf_kan_linear_desc) + sizeof(kf_sklinear_desc) + 32] __attribute__((aligned(16)));
    memset(db, 0, sizeof db);
    size_t dsz, oldest; /* this header's size, and the oldest size the library still reads */
    int nmut = (int)(u8(r) % 4);
    bool must_fail = false, tiny = true;
    kf_status st;
    if (!s->kan) {
        kf_sklinear_desc *d = (void *)db;
        kf_sklinear_desc_init(d);
        dsz = sizeof *d;
        /* a 1.1-1.7 caller's desc ends before the epilogue's fields (1.8), which then keep their
         * defaults: kfuse.h */
        oldest = offsetof(kf_sklinear_desc, activation);
        d->in_features = s->in, d->out_features = s->out, d->num_terms = (int32_t)s->L,
        d->low_rank = (int32_t)s->k, d->bias = s->opt, d->dtype = s->su.dtype;
        for (int m = 0; m < nmut; m++) {
            switch (u8(r) % 9) {
            case 0: d->in_features = interesting_i64(r, d->in_features); break;
            case 1: d->out_features = interesting_i64(r, d->out_features); break;
            case 2: d->num_terms = (int32_t)interesting_i64(r, d->num_terms); break;
            case 3: d->low_rank = (int32_t)interesting_i64(r, d->low_rank); break;
            case 4: d->bias = (int32_t)interesting_i64(r, d->bias); break;
            case 5: d->dtype = (int32_t)(u8(r) % 9) - 1; break;
            case 6: { size_t v = (size_t)interesting_i64(r, (int64_t)dsz); d->struct_size = v > sizeof db ? sizeof db : v; break; }
            case 7: d->struct_size = dsz + 1 + u8(r) % 32; db[dsz + u8(r) % (d->struct_size - dsz)] = 1; break;
            default: break;
            }
        }
        int64_t lr = (int64_t)d->num_terms * d->low_rank;
        int64_t wide = d->in_features > d->out_features ? d->in_features : d->out_features;
        if (d->in_features < 1 || d->in_features > INT32_MAX || d->out_features < 1 ||
            d->out_features > INT32_MAX || d->num_terms < 1 || d->low_rank < 1 ||
            lr > INT32_MAX / 2 || (d->bias != 0 && d->bias != 1) ||
            !fuzz_float_dtype(d->dtype) ||
            !mul_ok((unsigned __int128)lr * (unsigned __int128)wide * 8))
            must_fail = true;
        if (d->in_features > 6 || d->out_features > 6 || d->num_terms > 3 || d->low_rank > 4 ||
            d->in_features < 1 || d->out_features < 1 || d->num_terms < 1 || d->low_rank < 1 ||
            !fuzz_float_dtype(d->dtype))
            tiny = false;
        st = kf_sklinear_plan_create(s->ctx, d, &s->skl);
        if (st == KF_OK) s->in = d->in_features, s->out = d->out_features, s->L = d->num_terms,
                         s->k = d->low_rank, s->opt = d->bias, s->su.dtype = d->dtype;
    } else {
        kf_kan_linear_desc *d = (void *)db;
        kf_kan_linear_desc_init(d);
        dsz = oldest = sizeof *d;
        d->in_features = s->in, d->out_features = s->out, d->grid_size = (int32_t)s->G,
        d->spline_order = (int32_t)s->so, d->standalone_scale = s->opt, d->dtype = s->su.dtype;
        for (int m = 0; m < nmut; m++) {
            switch (u8(r) % 9) {
            case 0: d->in_features = interesting_i64(r, d->in_features); break;
            case 1: d->out_features = interesting_i64(r, d->out_features); break;
            case 2: d->grid_size = (int32_t)interesting_i64(r, d->grid_size); break;
            case 3: d->spline_order = (int32_t)interesting_i64(r, d->spline_order); break;
            case 4: d->standalone_scale = (int32_t)interesting_i64(r, d->standalone_scale); break;
            case 5: d->dtype = (int32_t)(u8(r) % 9) - 1; break;
            case 6: { size_t v = (size_t)interesting_i64(r, (int64_t)dsz); d->struct_size = v > sizeof db ? sizeof db : v; break; }
            case 7: d->struct_size = dsz + 1 + u8(r) % 32; db[dsz + u8(r) % (d->struct_size - dsz)] = 1; break;
            default: break;
            }
        }
        if (d->in_features < 1 || d->in_features > INT32_MAX || d->out_features < 1 ||
            d->out_features > INT32_MAX || d->grid_size < 1 || d->spline_order < 0 ||
            (d->standalone_scale != 0 && d->standalone_scale != 1) ||
            !fuzz_float_dtype(d->dtype)) {
            must_fail = true;
        } else {
            int64_t G = d->grid_size, k = d->spline_order, nk = G + 2 * k + 1, cw = G + k + 1;
            unsigned __int128 K = (unsigned __int128)d->in_features * cw;
            if (nk > INT32_MAX || K > INT32_MAX || !mul_ok(K * (unsigned)d->out_features * 8) ||
                !mul_ok((unsigned __int128)d->in_features * k * nk * 8))
                must_fail = true;
        }
        if (d->in_features > 6 || d->out_features > 6 || d->grid_size > 5 || d->spline_order > 3 ||
            d->in_features < 1 || d->out_features < 1 || d->grid_size < 1 || d->spline_order < 0 ||
            !fuzz_float_dtype(d->dtype))
            tiny = false;
        st = kf_kan_linear_plan_create(s->ctx, d, &s->kp);
        if (st == KF_OK) s->in = d->in_features, s->out = d->out_features, s->G = d->grid_size,
                         s->so = d->spline_order, s->opt = d->standalone_scale, s->su.dtype = d->dtype;
    }
    size_t ssz = *(size_t *)(void *)db;
    if (ssz < oldest) must_fail = true;
    for (size_t i = dsz; i < ssz && i < sizeof db; i++)
        if (db[i]) must_fail = true;
    check_status(st, "plan_create");
    if (st != KF_OK) {
        if (s->skl || s->kp) FAIL("plan_create failed (%d) but set *out", (int)st);
        if (!must_fail && st != KF_ERR_OUT_OF_MEMORY) FAIL("plan_create rejected a valid descriptor with %d", (int)st);
        return false;
    }
    if (must_fail) FAIL("plan_create accepted an invalid descriptor");
    if (!tiny) { /* valid but too big to back with buffers: query, then drop it */
        size_t b = 7;
        int64_t n = interesting_i64(r, 3);
        st = s->kan ? kf_kan_linear_workspace_size(s->kp, n, &b) : kf_sklinear_workspace_size(s->skl, n, &b);
        check_status(st, "workspace_size(big plan)");
        if (st != KF_OK && b != 7) FAIL("workspace_size wrote on failure");
        kf_sklinear_plan_destroy(s->skl), kf_kan_linear_plan_destroy(s->kp);
        s->skl = NULL, s->kp = NULL;
        return false;
    }
    return true;
}

static int run(const uint8_t *data, size_t size) {
    static bool once;
    if (!once && getenv("FUZZ_LAYERS_STATS")) atexit(print_stats);
    once = true;
    rd r = {data, size};
    sess s;
    memset(&s, 0, sizeof s);
    s.su = fuzz_draw_setup(&r);
    s.kan = u8(&r) & 1;
    kf_context_desc cd;
    kf_context_desc_init(&cd);
    cd.device_type = KF_DEVICE_CPU;
    cd.num_threads = 1 + (int32_t)(u8(&r) % 2);
    if (u8(&r) % 8 == 0) cd.flags = KF_CONTEXT_FIXED_ARENA, cd.arena_bytes = (size_t)u16(&r) * 16, s.fixed_arena = true;
    if (kf_context_create(&cd, &s.ctx) != KF_OK) FAIL("context_create");
    /* honest tiny descriptor */
    s.in = range(&r, 1, 6), s.out = range(&r, 1, 6);
    if (!s.kan) s.L = range(&r, 1, 3), s.k = range(&r, 1, 4);
    else s.G = range(&r, 1, 5), s.so = range(&r, 0, 3);
    s.opt = u8(&r) & 1;
    const int64_t h_in = s.in, h_out = s.out, h_L = s.L, h_k = s.k, h_G = s.G, h_so = s.so;
    const bool h_opt = s.opt;
    const int32_t h_dtype = s.su.dtype;
    if (!plan_from_fuzzed_desc(&s, &r)) {
        s.in = h_in, s.out = h_out, s.L = h_L, s.k = h_k, s.G = h_G, s.so = h_so, s.opt = h_opt;
        s.su.dtype = h_dtype;
        kf_status st;
        if (!s.kan) {
            kf_sklinear_desc d;
            kf_sklinear_desc_init(&d);
            d.in_features = s.in, d.out_features = s.out, d.num_terms = (int32_t)s.L,
            d.low_rank = (int32_t)s.k, d.bias = s.opt, d.dtype = s.su.dtype;
            st = kf_sklinear_plan_create(s.ctx, &d, &s.skl);
        } else {
            kf_kan_linear_desc d;
            kf_kan_linear_desc_init(&d);
            d.in_features = s.in, d.out_features = s.out, d.grid_size = (int32_t)s.G,
            d.spline_order = (int32_t)s.so, d.standalone_scale = s.opt, d.dtype = s.su.dtype;
            st = kf_kan_linear_plan_create(s.ctx, &d, &s.kp);
        }
        if (st != KF_OK) FAIL("honest plan_create failed");
    }
    s.nk = s.G + 2 * s.so + 1, s.C = s.G + s.so;
    /* x: [in], [N, in] or [a, b, in] with N = a * b <= 6 */
    s.xnd = 1 + (int)(u8(&r) % 3);
    if (s.xnd == 1) s.N = 1;
    else if (s.xnd == 2) s.lead[0] = range(&r, 1, 6), s.N = s.lead[0];
    else s.lead[0] = range(&r, 1, 3), s.lead[1] = range(&r, 1, 2), s.N = s.lead[0] * s.lead[1];
    snprintf(g_desc, sizeof g_desc, "%s %s isa %s in %lld out %lld L %lld k %lld G %lld order %lld opt %d x rank %d N %lld threads %d fixed %d",
             s.kan ? "kan" : "sklinear", fuzz_dtype_name(s.su.dtype), s.su.isa, (long long)s.in, (long long)s.out, (long long)s.L,
             (long long)s.k, (long long)s.G, (long long)s.so, (int)s.opt, s.xnd, (long long)s.N,
             (int)cd.num_threads, (int)s.fixed_arena);
    int64_t sh[KF_MAX_DIMS];
    for (int i = 0; i + 1 < s.xnd; i++) sh[i] = s.lead[i];
    sh[s.xnd - 1] = s.in;
    targ_make(&s.x, "x", K_X, s.su.dtype, s.xnd, sh);
    targ_make(&s.dx, "dx", K_ROW, s.su.dtype, s.xnd, sh);
    sh[s.xnd - 1] = s.out;
    targ_make(&s.y, "y", K_ROW, s.su.dtype, s.xnd, sh);
    targ_make(&s.dy, "dy", K_ROW, s.su.dtype, s.xnd, sh);
    if (!s.kan) {
        int64_t ik[3] = {s.L, s.in, s.k}, ko[3] = {s.L, s.k, s.out}, o[1] = {s.out};
        static const char *nm[5] = {"S1s", "S2s", "U1s", "U2s", "bias"};
        static const char *dnm[5] = {"dS1s", "dS2s", "dU1s", "dU2s", "dbias"};
        for (int i = 0; i < 5; i++) {
            const int64_t *shp = i == 4 ? o : (i == 0 || i == 3) ? ik : ko;
            targ_make(&s.p[i], nm[i], K_FIXED, s.su.dtype, i == 4 ? 1 : 3, shp);
            targ_make(&s.dp[i], dnm[i], K_FIXED, s.su.dtype, i == 4 ? 1 : 3, shp);
        }
    } else {
        int64_t gs[2] = {s.in, s.nk}, oi[2] = {s.out, s.in}, oic[3] = {s.out, s.in, s.C};
        targ_make(&s.p[0], "grid", K_FIXED, s.su.dtype, 2, gs);
        targ_make(&s.p[1], "base_weight", K_FIXED, s.su.dtype, 2, oi);
        targ_make(&s.p[2], "spline_weight", K_FIXED, s.su.dtype, 3, oic);
        targ_make(&s.p[3], "spline_scaler", K_FIXED, s.su.dtype, 2, oi);
        targ_make(&s.dp[1], "dbase_weight", K_FIXED, s.su.dtype, 2, oi);
        targ_make(&s.dp[2], "dspline_weight", K_FIXED, s.su.dtype, 3, oic);
        targ_make(&s.dp[3], "dspline_scaler", K_FIXED, s.su.dtype, 2, oi);
    }
    fill_inputs(&s, &r);

    int nops = 1 + (int)(u8(&r) % 8);
    for (int op = 0; op < nops; op++) {
        uint32_t o = u8(&r) % 10;
        if (o < 4) call(&s, &r, true); /* 0 (an exhausted input) gives a backward call */
        else if (o < 8) call(&s, &r, false);
        else if (o == 8) fill_inputs(&s, &r);
        else {
            size_t b = 7;
            int64_t n = interesting_i64(&r, s.N);
            kf_status st = s.kan ? kf_kan_linear_workspace_size(s.kp, n, &b)
                                 : kf_sklinear_workspace_size(s.skl, n, &b);
            check_status(st, "workspace_size");
            bool valid = n >= 1 && n <= INT32_MAX;
            if ((st == KF_OK) != valid) FAIL("workspace_size(%lld) returned %d", (long long)n, (int)st);
            if (st != KF_OK && b != 7) FAIL("workspace_size wrote on failure");
        }
    }

    targ *all[] = {&s.x, &s.y, &s.dy, &s.dx};
    for (int i = 0; i < 4; i++) targ_free(all[i]);
    for (int i = 0; i < 5; i++) targ_free(&s.p[i]), targ_free(&s.dp[i]);
    kf_sklinear_plan_destroy(s.skl);
    kf_kan_linear_plan_destroy(s.kp);
    kf_context_destroy(s.ctx);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return run(data, size); }

const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

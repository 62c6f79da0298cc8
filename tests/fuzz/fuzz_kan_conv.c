/* libFuzzer harness for the C API of ABI 1.2's KAN additions: KANConv2d (kf_kan_conv2d_*) and the
 * grid update of both KAN layers (kf_kan_update_grid_args_init, kf_kan_linear_update_grid,
 * kf_kan_conv2d_update_grid). Build: tests/fuzz/CMakeLists.txt; run: scripts/fuzz.sh. Sibling of
 * fuzz_layers.c (which keeps its own input format) with the same oracle discipline.
 *
 * Each input: the plans' dtype and the context's CPU instruction set (fuzz_draw_setup), a CPU
 * context (1-2 threads, maybe a fixed arena), a conv descriptor with up to 3
 * mutations (in/out channels, kernel / stride / pad / dilation fields including 0, negative and
 * huge values, grid_size, spline_order, standalone_scale, dtype, struct_size and its tail), an
 * image geometry (x [B, C_in, H, W] or [C_in, H, W], H, W <= 7) and a KANLinear plan over the same
 * F = C_in kh kw features (its x is [Nl, F]; it shares the conv's grid and spline_weight, so both
 * update functions move the knots the convolution then runs on), then up to 8 operations: conv
 * forward, conv backward, conv workspace_size (batch / height / width mutated), conv update_grid,
 * KANLinear update_grid, a refill of the inputs. Each call gets up to 3 mutations: of a tensor
 * argument (absent, dtype, rank, one extent, one stride, misaligned data, an extent shrunk to 1, an
 * absent tensor made present, an image tensor's rank 4 <-> 3 so that x, y, dy, dx disagree, an
 * image too small for the dilated kernel), of struct_size, of grad_mode, a decreasing knot pair in
 * the grid, a NaN in x (update_grid), margin / grid_eps out of range or NaN; and a caller
 * workspace that is too small, NULL with bytes or misaligned.
 *
 * The oracle judges the call after all mutations, from the tensors actually passed (the contract of
 * capi/include/kfuse.h): a call it judges invalid must fail and write nothing (outputs; grid and
 * spline_weight of update_grid; 128 guard bytes after every buffer); a call it judges valid must
 * succeed (KF_ERR_WORKSPACE_TOO_SMALL only from a fixed arena, KF_ERR_OUT_OF_MEMORY allowed),
 * write every element of its outputs (NaN-poisoned before; KF_GRAD_ACCUMULATE outputs are
 * pre-filled with finite values), leave every other byte unchanged and match float64 references:
 * forward / backward through a naive unfold, tests/c/ref_kan.c and a naive col2im for dx, on the
 * values the tensors hold (||got - ref|| <= 1e-3 ||ref|| + 1e-4 sqrt(n) for float32, the bounds
 * fuzz_input.h derives from docs/precision.md for the other dtypes); update_grid: every grid row finite and
 * non-decreasing, spline_weight finite, and the knots equal to kfuse.h's formula (quantile indices
 * floor(j (M - 1) / G), exact for G + 1 <= 7, which tiny plans always have) to a loose tolerance.
 * A margin of 1e30 or more may make the knots overflow: such a call may be rejected; so may a
 * float16 update, whose refit coefficients on ill-conditioned new knots can pass 65504 (refused
 * since 1.7.5: regress-f16-refit-overflow, where 1.7.4 stored -inf).
 *
 * Lies: a valid-looking call whose tensors declare more elements than their buffers hold cannot
 * be detected by any library; the harness skips such calls instead of making them. Shapes stay
 * tiny: C_in <= 3, C_out <= 4, kernel <= 3, dilation <= 3, padding <= 2, images <= 7 x 7, batch
 * <= 3 (and at most 2 pixels more than the smallest image the kernel fits), Nl <= 6, G <= 5,
 * spline_order <= 3. After a successful update_grid the new knots and coefficients are kept for
 * the following calls unless they are too extreme for the float32 tolerance above (a knot beyond
 * +-100, a non-zero knot span below 1e-3, a coefficient beyond +-100): then the previous ones are
 * restored.
 *
 * Seed corpus (tests/fuzz/corpus/fuzz_kan_conv), written by hand in this input format with a few
 * lines of Python (bytes in the order run(), plan_from_fuzzed_desc(), fill_inputs(), call() and
 * ws_query() read them; FUZZ_KAN_CONV_STATS=1 prints how many calls of each kind were accepted /
 * rejected / skipped): fwd_bwd (forward, an accumulating backward with a caller workspace, a
 * backward without dx and dspline_weight), stride2_pad_dil (stride 2, padding, dilation 2, a
 * rank-3 x, a fixed arena), update_conv (conv update_grid with margin 0.5, then forward and
 * backward on the new knots), update_linear (two KANLinear update_grid calls, then a conv
 * forward), rejected (x of rank 3 against y of rank 4, a NaN margin, a decreasing knot pair, an
 * image too small for the dilated kernel); every input begins with the byte fuzz_draw_setup
 * reads (0: float32, the CPU's default kernels), and fwd_bwd, update_conv and stride2_pad_dil
 * come again as NAME.f64, .bf16, .f16 and as .f32.avx2, .bf16.avx2 (the baseline kernels), and
 * fwd_bwd.bf16.avx512 draws avx512 (the fallback on a CPU without AVX-512). */
#include "kfuse.h"
#include "ref_kan.h"
#include "ref_rnn.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_NAME "fuzz_kan_conv"
#include "fuzz_oracle.h"

/* ---- tensor arguments ------------------------------------------------------------------------ */
typedef struct targ {
    const char *name;
    int ndim; /* honest */
    int64_t shape[KF_MAX_DIMS];
    int64_t numel;
    int32_t dt; /* the plan's */
    buf b;      /* the tensor, dtype dt */
    float *f;   /* an input's values (fuzz_store: what b holds; fuzz_adopt: what a call wrote) */
} targ;
static void targ_make(targ *a, const char *name, int32_t dt, int ndim, const int64_t *shape) {
    memset(a, 0, sizeof *a);
    a->name = name, a->dt = dt, a->ndim = ndim, a->numel = 1;
    for (int i = 0; i < ndim; i++) a->shape[i] = shape[i], a->numel *= shape[i];
    a->b = buf_new((size_t)a->numel * fuzz_dtype_bytes(dt));
    a->f = calloc((size_t)a->numel, sizeof *a->f);
    if (!a->f) abort();
}
static void sync(targ *a) { fuzz_store(a->dt, a->b.p, a->f, a->numel); }
static void adopt(targ *a) { fuzz_adopt(a->dt, a->b.p, a->f, a->numel); }
static kf_tensor honest(const targ *a, bool present) {
    kf_tensor t;
    if (kf_tensor_init(&t, present ? a->b.p : NULL, a->dt, a->ndim, a->shape) != KF_OK)
        FAIL("kf_tensor_init");
    return t;
}

/* How a slot's passed tensor is judged. */
enum {
    K_FIXED, /* exactly the honest shape */
    K_XIMG,  /* the conv's x: [B, C_in, H, W] or [C_in, H, W]; sets the call's geometry */
    K_IMG,   /* x's rank, [B, ch, H, W] (in_img) or [B, ch, Ho, Wo] of the call's geometry */
    K_XROW   /* KANLinear's x: [..., F], rank 1..KF_MAX_DIMS */
};
typedef struct slot {
    targ *a;
    kf_tensor *t;  /* inside the args struct */
    int kind;
    bool required; /* must be present */
    bool allowed;  /* may be present (scaler-like tensors only with standalone_scale) */
    bool output;   /* written (update_grid: grid and spline_weight, in/out) */
    bool accum;    /* a parameter gradient (grad_mode applies) */
    int64_t ch;    /* K_IMG: channels */
    bool in_img;   /* K_IMG: x's H, W (dx) rather than Ho, Wo */
} slot;

/* The call's patch geometry. */
typedef struct geo {
    int64_t B, H, W, Ho, Wo, N;
    int xnd;
} geo;

/* ---- the session ------------------------------------------------------------------------------- */
typedef struct sess {
    kf_context *ctx;
    bool fixed_arena;
    fuzz_setup su;
    kf_kan_conv2d_plan *cp;
    kf_kan_linear_plan *lp;
    int64_t Cin, Cout, F, G, so, nk, C;
    int32_t kh, kw, sh, sw, ph, pw, dh, dw;
    bool opt; /* standalone_scale */
    geo g;    /* honest image geometry */
    int64_t Nl;
    targ x, y, dy, dx, xl, grid, base, spline, scaler, dbase, dspline, dscaler;
} sess;

static void mutate_tensor(rd *r, sess *s, slot *sl) {
    kf_tensor *t = sl->t;
    targ *a = sl->a;
    bool img = sl->kind == K_XIMG || sl->kind == K_IMG;
    const uint32_t k = u8(r) % 11;
    if (mutate_tensor_common(r, t, a->b.p, a->ndim, fuzz_dtype_bytes(a->dt), k)) return;
    switch (k) {
    case 8: /* an image tensor of the other rank: [B, C, H, W] <-> [C, H, W] (B dropped / 1) */
        if (img && t->ndim == 4) {
            for (int i = 0; i < 3; i++) t->shape[i] = t->shape[i + 1], t->strides[i] = t->strides[i + 1];
            t->ndim = 3;
        } else if (img && t->ndim == 3) {
            for (int i = 3; i > 0; i--) t->shape[i] = t->shape[i - 1], t->strides[i] = t->strides[i - 1];
            t->shape[0] = 1, t->strides[0] = (int64_t)((uint64_t)t->shape[1] * (uint64_t)t->strides[1]);
            t->ndim = 4;
        }
        break;
    case 9: /* x: an image too small for the dilated kernel (0 where any image fits) */
        if (sl->kind == K_XIMG && t->ndim >= 3 && t->ndim <= 4) {
            bool w = u8(r) & 1;
            int64_t span = w ? (int64_t)s->dw * (s->kw - 1) + 1 : (int64_t)s->dh * (s->kh - 1) + 1;
            int64_t fit = span - 2 * (int64_t)(w ? s->pw : s->ph); /* smallest extent that fits */
            t->shape[t->ndim - (w ? 1 : 2)] = fit > 1 ? fit - 1 - (int64_t)(u8(r) % (uint32_t)(fit - 1)) : 0;
        }
        break;
    default: if (!t->data) t->data = a->b.p; break;
    }
}

/* torch.nn.Conv2d's output extent; false when n is out of range or the dilated kernel does not
 * fit the padded image. */
static bool conv_extent(int64_t n, int32_t k, int32_t st, int32_t p, int32_t d, int64_t *o) {
    if (n < 1 || n > INT32_MAX) return false;
    int64_t span = (int64_t)d * (k - 1) + 1, padded = n + 2 * (int64_t)p;
    if (padded < span) return false;
    *o = (padded - span) / st + 1;
    return true;
}
static bool conv_geom(const sess *s, int64_t B, int64_t H, int64_t W, geo *g) {
    if (B < 1 || B > INT32_MAX) return false;
    if (!conv_extent(H, s->kh, s->sh, s->ph, s->dh, &g->Ho) ||
        !conv_extent(W, s->kw, s->sw, s->pw, s->dw, &g->Wo))
        return false;
    __int128 n = (__int128)B * g->Ho * g->Wo;
    if (n > INT32_MAX) return false;
    if ((unsigned __int128)n * (unsigned __int128)(s->F + s->Cout) * 8 > (unsigned __int128)INT64_MAX)
        return false;
    g->B = B, g->H = H, g->W = W, g->N = (int64_t)n;
    return true;
}

/* Whether the passed tensor of slot `sl` is acceptable (x's geometry in / out through g). */
static bool slot_valid(const sess *s, const slot *sl, geo *g, int64_t *numel) {
    const kf_tensor *t = sl->t;
    if (!t->data) return !sl->required;
    if (!sl->allowed) return false;
    if (t->dtype != sl->a->dt || (uintptr_t)t->data % fuzz_dtype_bytes(sl->a->dt)) return false;
    switch (sl->kind) {
    case K_FIXED:
        if (t->ndim != sl->a->ndim) return false;
        for (int i = 0; i < t->ndim; i++)
            if (t->shape[i] != sl->a->shape[i]) return false;
        return contiguous(t, numel);
    case K_XIMG: {
        if (t->ndim != 3 && t->ndim != 4) return false;
        int o = t->ndim - 3;
        for (int i = 0; i < t->ndim; i++)
            if (i == o ? t->shape[i] != s->Cin : t->shape[i] < 1) return false;
        if (!contiguous(t, numel)) return false;
        g->xnd = t->ndim;
        return conv_geom(s, o ? t->shape[0] : 1, t->shape[o + 1], t->shape[o + 2], g);
    }
    case K_IMG: {
        if (t->ndim != g->xnd) return false;
        int64_t want[4] = {g->B, sl->ch, sl->in_img ? g->H : g->Ho, sl->in_img ? g->W : g->Wo};
        for (int i = 0; i < t->ndim; i++)
            if (t->shape[i] != want[4 - t->ndim + i]) return false;
        return contiguous(t, numel);
    }
    default: { /* K_XROW */
        if (t->ndim < 1 || t->ndim > KF_MAX_DIMS) return false;
        if (t->shape[t->ndim - 1] != s->F) return false;
        int64_t n = 1;
        for (int i = 0; i + 1 < t->ndim; i++) {
            if (t->shape[i] < 1) return false;
            if (__builtin_mul_overflow(n, t->shape[i], &n) || n > INT32_MAX) return false;
        }
        if (!contiguous(t, numel)) return false;
        g->N = n;
        return true;
    }
    }
}

static size_t ws_need(const sess *s, const geo *g) {
    size_t b = 0;
    if (kf_kan_conv2d_workspace_size(s->cp, g->B, g->H, g->W, &b) != KF_OK)
        FAIL("workspace_size(%lld, %lld, %lld) failed for a valid geometry", (long long)g->B,
             (long long)g->H, (long long)g->W);
    return b;
}

/* ---- inputs ------------------------------------------------------------------------------------- */
static void fill_inputs(sess *s, rd *r) {
    ref_rng g;
    ref_rng_seed(&g, u64(r));
    ref_fill_uniform_f32(&g, s->x.f, s->x.numel, -1.5, 1.5);
    ref_fill_uniform_f32(&g, s->xl.f, s->xl.numel, -1.5, 1.5);
    ref_fill_uniform_f32(&g, s->dy.f, s->dy.numel, -1, 1);
    ref_fill_uniform_f32(&g, s->base.f, s->base.numel, -1, 1);
    ref_fill_uniform_f32(&g, s->spline.f, s->spline.numel, -1, 1);
    ref_fill_uniform_f32(&g, s->scaler.f, s->scaler.numel, -1, 1);
    uint32_t kind = u8(r) % 3;
    float *gr = s->grid.f;
    if (kind == 0) {
        kf_tensor t = honest(&s->grid, true);
        kf_status st = kf_kan_conv2d_uniform_grid(s->cp, -1.0f, 1.0f, &t);
        check_status(st, "kf_kan_conv2d_uniform_grid");
        if (st != KF_OK) FAIL("uniform_grid failed");
        adopt(&s->grid);
    } else {
        for (int64_t i = 0; i < s->F; i++) { /* steps of 0..0.5 (exact), repeated knots included */
            float v = -1.0f - 0.25f * (float)(ref_rng_next(&g) % 5);
            for (int64_t j = 0; j < s->nk; j++) {
                gr[i * s->nk + j] = v;
                v += kind == 1 ? 0.125f * (float)(ref_rng_next(&g) % 5) : 2.0f / (float)s->G;
            }
        }
        sync(&s->grid); /* rounding keeps the knots non-decreasing */
    }
    /* some x exactly on knots */
    for (int64_t e = 0; e < s->x.numel; e++)
        if (ref_rng_next(&g) % 6 == 0)
            s->x.f[e] = gr[(int64_t)(ref_rng_next(&g) % (uint64_t)(s->F * s->nk))];
    for (int64_t e = 0; e < s->xl.numel; e++)
        if (ref_rng_next(&g) % 6 == 0)
            s->xl.f[e] = gr[(e % s->F) * s->nk + (int64_t)(ref_rng_next(&g) % (uint64_t)s->nk)];
    targ *in[] = {&s->x, &s->xl, &s->dy, &s->base, &s->spline, &s->scaler};
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) sync(in[i]);
}

/* The unfold of x [B, C_in, H, W] (contiguous) for geometry g: P [N, F], padding 0. */
NOCOV static double *unfold(const sess *s, const float *x, const geo *g) {
    double *P = malloc((size_t)(g->N * s->F) * sizeof *P);
    if (!P) abort();
    for (int64_t b = 0; b < g->B; b++)
        for (int64_t oh = 0; oh < g->Ho; oh++)
            for (int64_t ow = 0; ow < g->Wo; ow++) {
                int64_t n = (b * g->Ho + oh) * g->Wo + ow;
                for (int64_t c = 0; c < s->Cin; c++)
                    for (int64_t i = 0; i < s->kh; i++)
                        for (int64_t j = 0; j < s->kw; j++) {
                            int64_t f = (c * s->kh + i) * s->kw + j;
                            int64_t ih = oh * s->sh - s->ph + i * s->dh, iw = ow * s->sw - s->pw + j * s->dw;
                            P[n * s->F + f] = (ih >= 0 && ih < g->H && iw >= 0 && iw < g->W)
                                                  ? (double)x[((b * s->Cin + c) * g->H + ih) * g->W + iw]
                                                  : 0.0;
                        }
            }
    return P;
}

/* dx [B, C_in, H, W] = the sum of the patch gradients dP [N, F] over the pixels they read. */
NOCOV static double *col2im(const sess *s, const double *dP, const geo *g) {
    double *dx = calloc((size_t)(g->B * s->Cin * g->H * g->W), sizeof *dx);
    if (!dx) abort();
    for (int64_t b = 0; b < g->B; b++)
        for (int64_t oh = 0; oh < g->Ho; oh++)
            for (int64_t ow = 0; ow < g->Wo; ow++) {
                int64_t n = (b * g->Ho + oh) * g->Wo + ow;
                for (int64_t c = 0; c < s->Cin; c++)
                    for (int64_t i = 0; i < s->kh; i++)
                        for (int64_t j = 0; j < s->kw; j++) {
                            int64_t f = (c * s->kh + i) * s->kw + j;
                            int64_t ih = oh * s->sh - s->ph + i * s->dh, iw = ow * s->sw - s->pw + j * s->dw;
                            if (ih >= 0 && ih < g->H && iw >= 0 && iw < g->W)
                                dx[((b * s->Cin + c) * g->H + ih) * g->W + iw] += dP[n * s->F + f];
                        }
            }
    return dx;
}

/* FUZZ_KAN_CONV_STATS=1: per-operation counts of accepted / rejected / skipped calls at exit. */
enum { OP_FWD, OP_BWD, OP_CUPD, OP_LUPD, OP_WS, OP_N };
static const char *const op_name[OP_N] = {"conv forward", "conv backward", "conv update_grid",
                                          "linear update_grid", "conv workspace_size"};
static long g_stats[OP_N][3]; /* ok, rejected, skipped */
static void print_stats(void) {
    for (int o = 0; o < OP_N; o++)
        fprintf(stderr, "fuzz_kan_conv stats: %s: ok %ld, rejected %ld, skipped %ld\n", op_name[o],
                g_stats[o][0], g_stats[o][1], g_stats[o][2]);
}

static double *f64(const float *p, int64_t n) { return ref_to_f64(p, n); }

NOCOV static bool all_finite(const float *p, int64_t n) {
    for (int64_t e = 0; e < n; e++)
        if (!isfinite(p[e])) return false;
    return true;
}
NOCOV static bool grid_ok(const sess *s) { /* every row non-decreasing (NaN fails) */
    for (int64_t i = 0; i < s->F; i++)
        for (int64_t j = 0; j + 1 < s->nk; j++)
            if (!(s->grid.f[i * s->nk + j] <= s->grid.f[i * s->nk + j + 1])) return false;
    return true;
}
/* The first byte of a[from, to) that differs from b, or `to`. */
NOCOV static size_t first_diff(const unsigned char *a, const unsigned char *b, size_t from, size_t to) {
    if (from >= to || !memcmp(a + from, b + from, to - from)) return to;
    while (a[from] == b[from]) from++;
    return from;
}

NOCOV static int cmp_double(const void *a, const void *b) {
    double u = *(const double *)a, v = *(const double *)b;
    return (u > v) - (u < v);
}

/* update_grid's result on success: rows finite and non-decreasing, spline_weight finite, and the
 * knots of kfuse.h's formula from the samples P [M, F] (quantile indices floor(j (M - 1) / G),
 * exact for G <= 6). */
NOCOV static void check_update(const sess *s, const double *P, int64_t M, double margin, double eps) {
    const int64_t F = s->F, nk = s->nk, G = s->G, k = s->so;
    for (int64_t e = 0; e < s->spline.numel; e++) {
        const double w = fuzz_get(s->spline.dt, s->spline.b.p, e);
        if (!isfinite(w)) FAIL("update_grid: spline_weight[%lld] = %g", (long long)e, w);
    }
    /* the knots as the call wrote them (a float64 plan's are not float32 values) */
    double *gr = malloc((size_t)(F * nk) * sizeof *gr), *v = malloc((size_t)M * sizeof *v),
           *t = malloc((size_t)nk * sizeof *t);
    if (!gr || !v || !t) abort();
    for (int64_t e = 0; e < F * nk; e++) gr[e] = fuzz_get(s->grid.dt, s->grid.b.p, e);
    for (int64_t i = 0; i < F; i++) {
        for (int64_t j = 0; j < nk; j++) {
            if (!isfinite(gr[i * nk + j])) FAIL("update_grid: grid[%lld][%lld] = %g", (long long)i, (long long)j, gr[i * nk + j]);
            if (j && !(gr[i * nk + j - 1] <= gr[i * nk + j]))
                FAIL("update_grid: grid row %lld decreases at %lld: %.9g > %.9g", (long long)i,
                     (long long)j, gr[i * nk + j - 1], gr[i * nk + j]);
        }
        if (G > 6) continue;
        for (int64_t m = 0; m < M; m++) v[m] = P[m * F + i];
        qsort(v, (size_t)M, sizeof *v, cmp_double);
        const double s0 = v[0], s1 = v[M - 1], h = (s1 - s0 + 2 * margin) / (double)G;
        for (int64_t j = 0; j <= G; j++)
            t[k + j] = eps * (s0 - margin + (double)j * h) + (1 - eps) * v[j * (M - 1) / G];
        for (int64_t m = 1; m <= k; m++) t[k - m] = t[k] - (double)m * h, t[k + G + m] = t[k + G] + (double)m * h;
        /* a low dtype rounds each knot once: u |t_j|, under u times the factor below */
        const double tol = fuzz_rel_bound(s->su.dtype, 1e-5) * (1 + fabs(s0) + fabs(s1) + margin) *
                           (double)(k + 2) * (double)(G + 2);
        for (int64_t j = 0; j < nk; j++)
            if (!(fabs(gr[i * nk + j] - t[j]) <= tol)) {
                for (int64_t q = 0; q < nk; q++)
                    fprintf(stderr, "  grid[%lld][%lld] = %.9g, formula %.9g\n", (long long)i,
                            (long long)q, gr[i * nk + q], t[q]);
                FAIL("update_grid: knot [%lld][%lld] = %.9g, formula %.9g (M %lld, margin %g, grid_eps %g)",
                     (long long)i, (long long)j, gr[i * nk + j], t[j], (long long)M, margin, eps);
            }
    }
    free(gr), free(v), free(t);
}

/* Whether the knots and coefficients after an update are mild enough for the float32 tolerance of
 * the later forward / backward checks. */
NOCOV static bool update_mild(const sess *s) {
    for (int64_t i = 0; i < s->F; i++)
        for (int64_t j = 0; j < s->nk; j++) {
            float a = s->grid.f[i * s->nk + j];
            if (fabsf(a) > 100) return false;
            if (j) {
                float d = a - s->grid.f[i * s->nk + j - 1];
                if (d != 0 && d < 1e-3f) return false;
            }
        }
    for (int64_t e = 0; e < s->spline.numel; e++)
        if (fabsf(s->spline.f[e]) > 100) return false;
    return true;
}

static const float g_margins[] = {NAN, -0.01f, INFINITY, -INFINITY, 1e38f, 0.0f, 0.5f, -0.0f,
                                  2.0f, FLT_MIN, 1e30f, -FLT_MIN, 0.01f};
static const float g_epss[] = {NAN, -0.1f, 1.0f, 0.0f, 1.5f, 0.5f, INFINITY, -0.0f, 1.0000001f,
                               -INFINITY, 0.02f, 0.999f};

static void call(sess *s, rd *r, int op) {
    /* args struct in a buffer with room for a struct_size tail */
    unsigned char argbuf[sizeof(kf_kan_conv2d_backward_args) + 64] __attribute__((aligned(16)));
    memset(argbuf, 0, sizeof argbuf);
    size_t asz;
    slot sl[12];
    int ns = 0;
    uint32_t opt = u8(r);
    bool upd = op == OP_CUPD || op == OP_LUPD, bwd = op == OP_BWD;
    kf_kan_update_grid_args *ua = NULL;
#define SLOT(A, T, K, REQ, ALW, OUT, ACC, CH, INIMG) sl[ns++] = (slot){(A), (T), (K), (REQ), (ALW), (OUT), (ACC), (CH), (INIMG)}
    if (op == OP_FWD) {
        kf_kan_conv2d_forward_args *a = (void *)argbuf;
        kf_kan_conv2d_forward_args_init(a);
        asz = sizeof *a;
        SLOT(&s->x, &a->x, K_XIMG, true, true, false, false, 0, false);
        SLOT(&s->grid, &a->grid, K_FIXED, true, true, false, false, 0, false);
        SLOT(&s->base, &a->base_weight, K_FIXED, false, true, false, false, 0, false); /* optional since 1.3 */
        SLOT(&s->spline, &a->spline_weight, K_FIXED, true, true, false, false, 0, false);
        SLOT(&s->scaler, &a->spline_scaler, K_FIXED, s->opt, s->opt, false, false, 0, false);
        SLOT(&s->y, &a->y, K_IMG, true, true, true, false, s->Cout, false);
    } else if (bwd) {
        kf_kan_conv2d_backward_args *a = (void *)argbuf;
        kf_kan_conv2d_backward_args_init(a);
        asz = sizeof *a;
        SLOT(&s->x, &a->x, K_XIMG, true, true, false, false, 0, false);
        SLOT(&s->grid, &a->grid, K_FIXED, true, true, false, false, 0, false);
        SLOT(&s->base, &a->base_weight, K_FIXED, false, true, false, false, 0, false); /* optional since 1.3 */
        SLOT(&s->spline, &a->spline_weight, K_FIXED, true, true, false, false, 0, false);
        SLOT(&s->scaler, &a->spline_scaler, K_FIXED, s->opt, s->opt, false, false, 0, false);
        SLOT(&s->dy, &a->dy, K_IMG, true, true, false, false, s->Cout, false);
        SLOT(&s->dx, &a->dx, K_IMG, false, true, true, false, s->Cin, true);
        SLOT(&s->dbase, &a->dbase_weight, K_FIXED, false, true, true, true, 0, false);
        SLOT(&s->dspline, &a->dspline_weight, K_FIXED, false, true, true, true, 0, false);
        SLOT(&s->dscaler, &a->dspline_scaler, K_FIXED, false, s->opt, true, true, 0, false);
    } else {
        ua = (void *)argbuf;
        kf_kan_update_grid_args_init(ua);
        asz = sizeof *ua;
        if (op == OP_CUPD) SLOT(&s->x, &ua->x, K_XIMG, true, true, false, false, 0, false);
        else SLOT(&s->xl, &ua->x, K_XROW, true, true, false, false, 0, false);
        SLOT(&s->grid, &ua->grid, K_FIXED, true, true, true, false, 0, false);
        SLOT(&s->spline, &ua->spline_weight, K_FIXED, true, true, true, false, 0, false);
    }
#undef SLOT
    /* honest tensors: required and allowed ones present, optional outputs per `opt` bits */
    for (int i = 0; i < ns; i++) {
        bool present = sl[i].required || (sl[i].allowed && !(opt >> (i % 8) & 1));
        *sl[i].t = honest(sl[i].a, present);
    }
    /* no base_weight (no base term, since 1.3) means no dbase_weight either */
    const int kbw = 2, kdbw = 7; /* their slots in the forward and backward calls */
    if (bwd && !sl[kbw].t->data) *sl[kdbw].t = honest(sl[kdbw].a, false);
    int32_t grad_mode = (u8(r) & 1) ? KF_GRAD_ACCUMULATE : KF_GRAD_OVERWRITE;
    int64_t swapped = -1; /* grid element index whose pair was swapped */
    float saved[2] = {0, 0};
    targ *xa = sl[0].a;
    int64_t nan_at = -1; /* x element made NaN (update_grid) */
    float nan_saved = 0;
    bool big_margin = false;

    int nmut = (int)(u8(r) % 4);
    for (int m = 0; m < nmut; m++) {
        uint32_t w = u8(r) % 18;
        if (w < 11) {
            mutate_tensor(r, s, &sl[u8(r) % (uint32_t)ns]);
        } else if (w == 11) {
            size_t v = (size_t)interesting_i64(r, (int64_t)asz);
            if (v > sizeof argbuf) v = sizeof argbuf;
            *(size_t *)(void *)argbuf = v;
        } else if (w == 12) {
            size_t v = asz + 1 + u8(r) % 64;
            *(size_t *)(void *)argbuf = v;
            argbuf[asz + u8(r) % (v - asz)] = (unsigned char)(1 + u8(r) % 255);
        } else if (w == 13 && bwd) {
            grad_mode = (int32_t)interesting_i64(r, grad_mode);
        } else if (w == 14 && swapped < 0) { /* decreasing grid: make one knot pair strictly decrease */
            int64_t i = (int64_t)(u8(r) % (uint32_t)s->F), j = (int64_t)(u8(r) % (uint32_t)(s->nk - 1));
            float *t = s->grid.f + i * s->nk;
            float a0 = t[j], a1 = t[j + 1];
            saved[0] = a0, saved[1] = a1;
            if (a0 == a1) a1 = a0 + 0.25f;
            t[j] = a1, t[j + 1] = a0;
            sync(&s->grid); /* a0 < a1 stay so in every dtype (0.25 apart, or rounded alike) */
            swapped = i * s->nk + j;
        } else if (w == 15 && upd && nan_at < 0) {
            nan_at = (int64_t)(u16(r) % (uint32_t)xa->numel);
            nan_saved = xa->f[nan_at];
            xa->f[nan_at] = (u8(r) & 1) ? NAN : -INFINITY;
            sync(xa);
        } else if (w == 16 && upd) {
            ua->margin = g_margins[u8(r) % (sizeof g_margins / sizeof g_margins[0])];
        } else if (w == 17 && upd) {
            ua->grid_eps = g_epss[u8(r) % (sizeof g_epss / sizeof g_epss[0])];
        }
    }

    /* ---- judge ---- */
    bool bad = false;
    geo g = {0};
    int64_t numel[12] = {0};
    size_t ssz = *(size_t *)(void *)argbuf;
    /* update_grid args may end before quantile_rule (a 1.2 caller's struct; the default rule) */
    if (ssz < (upd ? offsetof(kf_kan_update_grid_args, quantile_rule) : asz)) bad = true;
    for (size_t i = asz; i < ssz && i < sizeof argbuf; i++)
        if (argbuf[i]) bad = true;
    if (bwd && grad_mode != KF_GRAD_OVERWRITE && grad_mode != KF_GRAD_ACCUMULATE) bad = true;
    if (upd) {
        if (!(isfinite(ua->margin) && ua->margin >= 0.0f)) bad = true;
        if (!(ua->grid_eps >= 0.0f && ua->grid_eps <= 1.0f)) bad = true;
        big_margin = ua->margin >= 1e30f;
    }
    bool xok = slot_valid(s, &sl[0], &g, &numel[0]);
    if (!xok) bad = true;
    for (int i = 1; i < ns && xok; i++)
        if (!slot_valid(s, &sl[i], &g, &numel[i])) bad = true;
    if (bwd && !sl[kbw].t->data && sl[kdbw].t->data) bad = true;
    if (sl[1].t->data && !bad && !grid_ok(s)) bad = true; /* valid grid tensor: rows non-decreasing */
    if (swapped >= 0 && !bad) FAIL("harness: decreasing grid judged valid");
    bool skip = false;
    if (!bad) /* undetectable lies (consistent enlarged extents): never made */
        for (int i = 0; i < ns; i++)
            if (sl[i].t->data && (uint64_t)numel[i] > sl[i].a->b.cap / fuzz_dtype_bytes(s->su.dtype))
                skip = true; /* no multiplication: it can wrap */
    if (upd && !bad && !skip && !all_finite(xa->f, numel[0])) bad = true; /* x finite (elements passed) */
    wsarg ws;
    memset(&ws, 0, sizeof ws);
    /* the workspace of the passed geometry where x's buffer backs it, else the honest one's */
    bool gx = xok && (uint64_t)numel[0] <= xa->b.cap / fuzz_dtype_bytes(s->su.dtype);
    if (!upd && pick_workspace(r, ws_need(s, gx ? &g : &s->g), &ws)) bad = true;
    if (skip) {
        g_stats[op][2]++;
        goto out;
    }

    /* ---- poison outputs, pre-fill accumulated gradients, snapshot every buffer ---- */
    bool accumulate = grad_mode == KF_GRAD_ACCUMULATE;
    ref_rng rg;
    ref_rng_seed(&rg, u64(r));
    if (!upd)
        for (int i = 0; i < ns; i++) {
            if (!sl[i].output) continue;
            if (sl[i].accum && accumulate) {
                ref_fill_uniform_f32(&rg, sl[i].a->f, sl[i].a->numel, -1, 1);
                sync(sl[i].a);
            } else {
                fuzz_poison(sl[i].a->dt, sl[i].a->b.p, sl[i].a->numel);
            }
        }
    unsigned char *snap[12];
    for (int i = 0; i < ns; i++) {
        size_t n = sl[i].a->b.cap + GUARD;
        snap[i] = malloc(n);
        if (!snap[i]) abort();
        memcpy(snap[i], sl[i].a->b.p, n);
    }

    kf_status st;
    if (op == OP_FWD) st = kf_kan_conv2d_forward(s->cp, (void *)argbuf, ws.p, ws.bytes);
    else if (bwd) st = kf_kan_conv2d_backward(s->cp, (kf_grad_mode)grad_mode, (void *)argbuf, ws.p, ws.bytes);
    else if (op == OP_CUPD) st = kf_kan_conv2d_update_grid(s->cp, ua);
    else st = kf_kan_linear_update_grid(s->lp, ua);
    const char *fn = op_name[op];
    check_status(st, fn);
    g_stats[op][st == KF_OK ? 0 : 1]++;

    if (st != KF_OK) {
        for (int i = 0; i < ns; i++)
            if (memcmp(snap[i], sl[i].a->b.p, sl[i].a->b.cap + GUARD))
                FAIL("%s failed (%d) but changed buffer %s", fn, (int)st, sl[i].a->name);
        if (!bad && !(!upd && st == KF_ERR_WORKSPACE_TOO_SMALL && s->fixed_arena && !ws.p) &&
            st != KF_ERR_OUT_OF_MEMORY &&
            !(upd && (big_margin || s->su.dtype == KF_DTYPE_F16) && st == KF_ERR_INVALID_ARGUMENT))
            FAIL("%s rejected a valid call with %d", fn, (int)st);
    } else {
        if (bad) FAIL("%s accepted an invalid call", fn);
        /* only the outputs' declared elements changed */
        for (int i = 0; i < ns; i++) {
            size_t used = (sl[i].output && sl[i].t->data) ? (size_t)numel[i] * fuzz_dtype_bytes(s->su.dtype) : 0;
            size_t b = first_diff(snap[i], sl[i].a->b.p, used, sl[i].a->b.cap + GUARD);
            if (b < sl[i].a->b.cap + GUARD)
                FAIL("%s: %s byte %zu (of %zu used, cap %zu) changed", fn, sl[i].a->name, b,
                         used, sl[i].a->b.cap);
        }
        if (upd) {
            /* the samples: x's rows, or the patches of x (padding 0) */
            double *P = op == OP_CUPD ? unfold(s, s->x.f, &g) : f64(s->xl.f, g.N * s->F);
            check_update(s, P, g.N, ua->margin, ua->grid_eps);
            free(P);
            adopt(&s->grid), adopt(&s->spline);
            if (!update_mild(s)) { /* keep the later float32 checks meaningful */
                memcpy(s->grid.b.p, snap[1], s->grid.b.cap);
                memcpy(s->spline.b.p, snap[2], s->spline.b.cap);
                adopt(&s->grid), adopt(&s->spline);
            }
        } else {
            /* the float64 reference over the patches of the x passed */
            const int64_t N = g.N, F = s->F, O = s->Cout, HoWo = g.Ho * g.Wo;
            double *P = unfold(s, s->x.f, &g);
            double *grid = f64(s->grid.f, s->grid.numel),
                   *base = sl[kbw].t->data ? f64(s->base.f, s->base.numel)
                                           : calloc((size_t)s->base.numel, 8), /* no base term */
                   *spl = f64(s->spline.f, s->spline.numel),
                   *sc = s->opt ? f64(s->scaler.f, s->scaler.numel) : NULL;
            ref_kan_cfg c = {N, F, O, s->G, s->so};
            double *want[12] = {0};
            if (!bwd) {
                double *yr = malloc((size_t)(N * O) * sizeof *yr), *y = malloc((size_t)(N * O) * sizeof *y);
                if (!yr || !y) abort();
                ref_kan_forward(&c, P, grid, base, spl, sc, yr);
                for (int64_t n = 0; n < N; n++)
                    for (int64_t o = 0; o < O; o++)
                        y[((n / HoWo) * O + o) * HoWo + n % HoWo] = yr[n * O + o];
                free(yr);
                want[5] = y;
            } else {
                double *dyr = malloc((size_t)(N * O) * sizeof *dyr), *dP = malloc((size_t)(N * F) * sizeof *dP);
                double *db = calloc((size_t)s->base.numel, 8), *ds = calloc((size_t)s->spline.numel, 8),
                       *dsc = s->opt ? calloc((size_t)s->scaler.numel, 8) : NULL;
                if (!dyr || !dP || !db || !ds) abort();
                for (int64_t n = 0; n < N; n++)
                    for (int64_t o = 0; o < O; o++)
                        dyr[n * O + o] = (double)s->dy.f[((n / HoWo) * O + o) * HoWo + n % HoWo];
                ref_kan_backward(&c, P, grid, base, spl, sc, dyr, dP, db, ds, dsc);
                want[6] = col2im(s, dP, &g);
                want[7] = db, want[8] = ds, want[9] = dsc;
                free(dyr), free(dP);
            }
            for (int i = 0; i < ns; i++) {
                if (!sl[i].output || !sl[i].t->data) continue;
                if (!want[i]) FAIL("harness: no reference for %s", sl[i].a->name);
                if (sl[i].accum && accumulate) /* f: the values it held before the call */
                    for (int64_t e = 0; e < numel[i]; e++) want[i][e] += sl[i].a->f[e];
                check_close(sl[i].a->name, sl[i].a->dt, sl[i].a->b.p, want[i], numel[i]);
            }
            for (int i = 0; i < 12; i++) free(want[i]);
            free(P), free(grid), free(base), free(spl), free(sc);
        }
    }
    for (int i = 0; i < ns; i++) free(snap[i]);
out:
    if (swapped >= 0) { /* restore the grid (a call that saw it failed and wrote nothing) */
        s->grid.f[swapped] = saved[0], s->grid.f[swapped + 1] = saved[1];
        sync(&s->grid);
    }
    if (nan_at >= 0) xa->f[nan_at] = nan_saved, sync(xa);
    free(ws.b.mem);
}

/* ---- plan descriptor ----------------------------------------------------------------------------- */
static bool mul_ok(unsigned __int128 v) { return v <= (unsigned __int128)INT64_MAX; }

/* Creates the conv plan from a mutated descriptor and checks the verdict; returns whether it made
 * a tiny plan usable by the session (else the caller falls back to the honest descriptor). */
static bool plan_from_fuzzed_desc(sess *s, rd *r) {
    unsigned char db[sizeof(kf_kan_conv2d_desc) + 32] __attribute__((aligned(16)));
    memset(db, 0, sizeof db);
    kf_kan_conv2d_desc *d = (void *)db;
    kf_kan_conv2d_desc_init(d);
    const size_t dsz = sizeof *d;
    d->in_channels = s->Cin, d->out_channels = s->Cout, d->kernel_h = s->kh, d->kernel_w = s->kw,
    d->stride_h = s->sh, d->stride_w = s->sw, d->pad_h = s->ph, d->pad_w = s->pw,
    d->dilation_h = s->dh, d->dilation_w = s->dw, d->grid_size = (int32_t)s->G,
    d->spline_order = (int32_t)s->so, d->standalone_scale = s->opt, d->dtype = s->su.dtype;
    int32_t *i32[] = {&d->kernel_h, &d->kernel_w, &d->stride_h, &d->stride_w, &d->pad_h,
                      &d->pad_w, &d->dilation_h, &d->dilation_w, &d->grid_size,
                      &d->spline_order, &d->standalone_scale};
    int nmut = (int)(u8(r) % 4);
    for (int m = 0; m < nmut; m++) {
        uint32_t w = u8(r) % 17;
        if (w == 0) d->in_channels = interesting_i64(r, d->in_channels);
        else if (w == 1) d->out_channels = interesting_i64(r, d->out_channels);
        else if (w < 13) { int32_t *f = i32[w - 2]; *f = (int32_t)interesting_i64(r, *f); }
        else if (w == 13) d->dtype = (int32_t)(u8(r) % 9) - 1;
        else if (w == 14) { size_t v = (size_t)interesting_i64(r, (int64_t)dsz); d->struct_size = v > sizeof db ? sizeof db : v; }
        else if (w == 15) { d->struct_size = dsz + 1 + u8(r) % 32; db[dsz + u8(r) % (d->struct_size - dsz)] = 1; }
    }
    bool must_fail = false, tiny = true;
    if (d->in_channels < 1 || d->in_channels > INT32_MAX || d->out_channels < 1 ||
        d->out_channels > INT32_MAX || d->kernel_h < 1 || d->kernel_w < 1 || d->stride_h < 1 ||
        d->stride_w < 1 || d->pad_h < 0 || d->pad_w < 0 || d->dilation_h < 1 || d->dilation_w < 1 ||
        d->grid_size < 1 || d->spline_order < 0 ||
        (d->standalone_scale != 0 && d->standalone_scale != 1) ||
        !fuzz_float_dtype(d->dtype)) {
        must_fail = true;
    } else {
        unsigned __int128 F = (unsigned __int128)d->in_channels * (unsigned)d->kernel_h * (unsigned)d->kernel_w;
        int64_t G = d->grid_size, k = d->spline_order, nk = G + 2 * k + 1, cw = G + k + 1;
        unsigned __int128 K = F * (unsigned)cw;
        if (F > INT32_MAX || nk > INT32_MAX || K > INT32_MAX ||
            !mul_ok(K * (unsigned)d->out_channels * 8) || !mul_ok(F * (unsigned)k * (unsigned)nk * 8))
            must_fail = true;
    }
    if (d->in_channels < 1 || d->in_channels > 3 || d->out_channels < 1 || d->out_channels > 4 ||
        d->kernel_h < 1 || d->kernel_h > 3 || d->kernel_w < 1 || d->kernel_w > 3 ||
        d->stride_h < 1 || d->stride_w < 1 || d->pad_h < 0 || d->pad_h > 2 || d->pad_w < 0 ||
        d->pad_w > 2 || d->dilation_h < 1 || d->dilation_h > 3 || d->dilation_w < 1 ||
        d->dilation_w > 3 || d->grid_size < 1 || d->grid_size > 5 || d->spline_order < 0 ||
        d->spline_order > 3)
        tiny = false;
    size_t ssz = d->struct_size;
    if (ssz < dsz) must_fail = true;
    for (size_t i = dsz; i < ssz && i < sizeof db; i++)
        if (db[i]) must_fail = true;
    kf_status st = kf_kan_conv2d_plan_create(s->ctx, d, &s->cp);
    check_status(st, "kf_kan_conv2d_plan_create");
    if (st != KF_OK) {
        if (s->cp) FAIL("plan_create failed (%d) but set *out", (int)st);
        if (!must_fail && st != KF_ERR_OUT_OF_MEMORY) FAIL("plan_create rejected a valid descriptor with %d", (int)st);
        return false;
    }
    if (must_fail) FAIL("plan_create accepted an invalid descriptor");
    if (!tiny) { /* valid but too big to back with buffers: query, then drop it */
        size_t b = 7;
        int64_t B = interesting_i64(r, 1), H = interesting_i64(r, 5), W = interesting_i64(r, 5);
        sess big = *s;
        big.Cin = d->in_channels, big.Cout = d->out_channels, big.kh = d->kernel_h,
        big.kw = d->kernel_w, big.sh = d->stride_h, big.sw = d->stride_w, big.ph = d->pad_h,
        big.pw = d->pad_w, big.dh = d->dilation_h, big.dw = d->dilation_w;
        big.F = d->in_channels * d->kernel_h * d->kernel_w; /* <= INT32_MAX: the plan exists */
        geo g;
        bool valid = conv_geom(&big, B, H, W, &g);
        st = kf_kan_conv2d_workspace_size(s->cp, B, H, W, &b);
        check_status(st, "kf_kan_conv2d_workspace_size(big plan)");
        if ((st == KF_OK) != valid)
            FAIL("workspace_size(%lld, %lld, %lld) of a big plan (pad %d x %d, stride %d x %d) returned %d",
                 (long long)B, (long long)H, (long long)W, (int)d->pad_h, (int)d->pad_w,
                 (int)d->stride_h, (int)d->stride_w, (int)st);
        if (st != KF_OK && b != 7) FAIL("workspace_size wrote on failure");
        kf_kan_conv2d_plan_destroy(s->cp);
        s->cp = NULL;
        return false;
    }
    s->Cin = d->in_channels, s->Cout = d->out_channels, s->kh = d->kernel_h, s->kw = d->kernel_w,
    s->sh = d->stride_h, s->sw = d->stride_w, s->ph = d->pad_h, s->pw = d->pad_w,
    s->dh = d->dilation_h, s->dw = d->dilation_w, s->G = d->grid_size, s->so = d->spline_order,
    s->opt = d->standalone_scale, s->su.dtype = d->dtype;
    return true;
}

/* The workspace query with batch / height / width mutated. */
static void ws_query(sess *s, rd *r) {
    int64_t B = s->g.B, H = s->g.H, W = s->g.W;
    uint32_t which = u8(r);
    if (which & 1) B = interesting_i64(r, B);
    if (which & 2) H = interesting_i64(r, H);
    if (which & 4) W = interesting_i64(r, W);
    if (which & 8) { /* an image too small for the dilated kernel */
        int64_t fit = (int64_t)s->dh * (s->kh - 1) + 1 - 2 * (int64_t)s->ph;
        H = fit > 1 ? fit - 1 : 0;
    }
    size_t b = 7;
    geo g;
    bool valid = conv_geom(s, B, H, W, &g);
    kf_status st = kf_kan_conv2d_workspace_size(s->cp, B, H, W, &b);
    check_status(st, "kf_kan_conv2d_workspace_size");
    g_stats[OP_WS][st == KF_OK ? 0 : 1]++;
    if ((st == KF_OK) != valid)
        FAIL("workspace_size(%lld, %lld, %lld) returned %d", (long long)B, (long long)H, (long long)W, (int)st);
    if (st != KF_OK && b != 7) FAIL("workspace_size wrote on failure");
}

static int run(const uint8_t *data, size_t size) {
    static bool once;
    if (!once && getenv("FUZZ_KAN_CONV_STATS")) atexit(print_stats);
    once = true;
    rd r = {data, size};
    sess s;
    memset(&s, 0, sizeof s);
    s.su = fuzz_draw_setup(&r);
    kf_context_desc cd;
    kf_context_desc_init(&cd);
    cd.device_type = KF_DEVICE_CPU;
    cd.num_threads = 1 + (int32_t)(u8(&r) % 2);
    if (u8(&r) % 8 == 0) cd.flags = KF_CONTEXT_FIXED_ARENA, cd.arena_bytes = (size_t)u16(&r) * 16, s.fixed_arena = true;
    if (kf_context_create(&cd, &s.ctx) != KF_OK) FAIL("context_create");
    /* honest tiny descriptor */
    s.Cin = range(&r, 1, 3), s.Cout = range(&r, 1, 4);
    s.kh = (int32_t)range(&r, 1, 3), s.kw = (int32_t)range(&r, 1, 3);
    s.sh = (int32_t)range(&r, 1, 2), s.sw = (int32_t)range(&r, 1, 2);
    s.ph = (int32_t)range(&r, 0, 2), s.pw = (int32_t)range(&r, 0, 2);
    s.dh = (int32_t)range(&r, 1, 2), s.dw = (int32_t)range(&r, 1, 2);
    s.G = range(&r, 1, 5), s.so = range(&r, 0, 3);
    s.opt = u8(&r) & 1;
    const sess h = s;
    if (!plan_from_fuzzed_desc(&s, &r)) {
        kf_context *ctx = s.ctx;
        s = h;
        s.ctx = ctx;
        kf_kan_conv2d_desc d;
        kf_kan_conv2d_desc_init(&d);
        d.in_channels = s.Cin, d.out_channels = s.Cout, d.kernel_h = s.kh, d.kernel_w = s.kw,
        d.stride_h = s.sh, d.stride_w = s.sw, d.pad_h = s.ph, d.pad_w = s.pw, d.dilation_h = s.dh,
        d.dilation_w = s.dw, d.grid_size = (int32_t)s.G, d.spline_order = (int32_t)s.so,
        d.standalone_scale = s.opt, d.dtype = s.su.dtype;
        if (kf_kan_conv2d_plan_create(s.ctx, &d, &s.cp) != KF_OK) FAIL("honest plan_create failed");
    }
    s.F = s.Cin * s.kh * s.kw, s.nk = s.G + 2 * s.so + 1, s.C = s.G + s.so;
    {
        kf_kan_linear_desc d;
        kf_kan_linear_desc_init(&d);
        d.in_features = s.F, d.out_features = s.Cout, d.grid_size = (int32_t)s.G,
        d.spline_order = (int32_t)s.so, d.standalone_scale = s.opt, d.dtype = s.su.dtype;
        if (kf_kan_linear_plan_create(s.ctx, &d, &s.lp) != KF_OK) FAIL("linear plan_create failed");
    }
    /* honest images: [B, C_in, H, W] (or [C_in, H, W]) with the dilated kernel fitting */
    s.g.xnd = (u8(&r) % 4) ? 4 : 3;
    int64_t B = s.g.xnd == 4 ? range(&r, 1, 3) : 1;
    int64_t loh = (int64_t)s.dh * (s.kh - 1) + 1 - 2 * (int64_t)s.ph, low = (int64_t)s.dw * (s.kw - 1) + 1 - 2 * (int64_t)s.pw;
    if (loh < 1) loh = 1;
    if (low < 1) low = 1;
    /* at most 2 pixels more than the smallest image the kernel fits (the cost is in N) */
    int64_t H = range(&r, loh, loh + 2 < 7 ? loh + 2 : 7), W = range(&r, low, low + 2 < 7 ? low + 2 : 7);
    int xnd = s.g.xnd;
    if (!conv_geom(&s, B, H, W, &s.g)) FAIL("harness: honest geometry invalid");
    s.g.xnd = xnd;
    s.Nl = range(&r, 1, 6);
    snprintf(g_desc, sizeof g_desc,
             "%s isa %s Cin %lld Cout %lld k %dx%d s %dx%d p %dx%d d %dx%d G %lld order %lld scale %d x rank %d "
             "B %lld H %lld W %lld Ho %lld Wo %lld Nl %lld threads %d fixed %d",
             fuzz_dtype_name(s.su.dtype), s.su.isa, (long long)s.Cin, (long long)s.Cout, s.kh, s.kw, s.sh, s.sw, s.ph, s.pw, s.dh, s.dw,
             (long long)s.G, (long long)s.so, (int)s.opt, s.g.xnd, (long long)s.g.B, (long long)s.g.H,
             (long long)s.g.W, (long long)s.g.Ho, (long long)s.g.Wo, (long long)s.Nl,
             (int)cd.num_threads, (int)s.fixed_arena);
    int64_t xs[4] = {B, s.Cin, H, W}, ys[4] = {B, s.Cout, s.g.Ho, s.g.Wo};
    int o = 4 - s.g.xnd;
    targ_make(&s.x, "x", s.su.dtype, s.g.xnd, xs + o);
    targ_make(&s.dx, "dx", s.su.dtype, s.g.xnd, xs + o);
    targ_make(&s.y, "y", s.su.dtype, s.g.xnd, ys + o);
    targ_make(&s.dy, "dy", s.su.dtype, s.g.xnd, ys + o);
    int64_t ls[2] = {s.Nl, s.F}, gs[2] = {s.F, s.nk}, oi[2] = {s.Cout, s.F}, oic[3] = {s.Cout, s.F, s.C};
    targ_make(&s.xl, "x (linear)", s.su.dtype, 2, ls);
    targ_make(&s.grid, "grid", s.su.dtype, 2, gs);
    targ_make(&s.base, "base_weight", s.su.dtype, 2, oi);
    targ_make(&s.spline, "spline_weight", s.su.dtype, 3, oic);
    targ_make(&s.scaler, "spline_scaler", s.su.dtype, 2, oi);
    targ_make(&s.dbase, "dbase_weight", s.su.dtype, 2, oi);
    targ_make(&s.dspline, "dspline_weight", s.su.dtype, 3, oic);
    targ_make(&s.dscaler, "dspline_scaler", s.su.dtype, 2, oi);
    fill_inputs(&s, &r);

    int nops = 1 + (int)(u8(&r) % 8);
    for (int op = 0; op < nops; op++) {
        uint32_t k = u8(&r) % 12;
        if (k < 3) call(&s, &r, OP_FWD); /* 0 (an exhausted input) gives the cheaper forward */
        else if (k < 6) call(&s, &r, OP_BWD);
        else if (k < 8) call(&s, &r, OP_CUPD);
        else if (k < 10) call(&s, &r, OP_LUPD);
        else if (k == 10) ws_query(&s, &r);
        else fill_inputs(&s, &r);
    }

    targ *all[] = {&s.x, &s.y, &s.dy, &s.dx, &s.xl, &s.grid, &s.base, &s.spline, &s.scaler,
                   &s.dbase, &s.dspline, &s.dscaler};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]->b.mem), free(all[i]->f);
    kf_kan_conv2d_plan_destroy(s.cp);
    kf_kan_linear_plan_destroy(s.lp);
    kf_context_destroy(s.ctx);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return run(data, size); }

const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

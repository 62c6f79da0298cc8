/* bfloat16 and float16 plans on the CPU: one conversion layer over the float32 op tables.
 *
 * A plan of dtype KF_DTYPE_BF16 or KF_DTYPE_F16 stores every tensor of a call in that type and
 * computes in float32 (products, reductions, gate math, the recurrent state), exactly as the
 * float32 kernels do, because it runs them: each wrapped entry
 *   1. converts the call's low-precision inputs (x, h0, weights, dy, ...) into float32 buffers
 *      carved from the call's workspace, after the float32 op's own workspace;
 *   2. calls the float32 op on a copy of the plan with dtype KF_DTYPE_F32 and a record that
 *      points at those buffers (the reserve is the float32 op's, same size);
 *   3. rounds the float32 outputs into the caller's tensors (core/lowp.h: to nearest, ties to
 *      even, NaN stays NaN). Accumulated gradients are dst = round(f32(dst) + g): the float32
 *      op overwrites its buffer and the sum is formed here, in float32, once.
 * So the workspace-size query answers the float32 op's workspace plus these buffers (the larger
 * of forward's and backward's set for a training size query), and a call never allocates.
 * Conversions are O(elements) against the O(flops) kernels: AVX2 + F16C (8 lanes), bfloat16 by
 * integer shifts; all of a pass's conversions (the inputs, then the outputs) run on one team
 * of the context's threads when they hold 64 Ki elements or more.
 * A float32 or float64 plan goes straight to the float32/float64 table. */
#include "cpu_backend.h"
#include "lowp.h"
#include "team.h"

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#define KF__LOWP_AVX2 1
#endif

/* ---- conversions --------------------------------------------------------------------------- */

/* One conversion: `n` elements between low-precision `low` and float32 `f`; to float32 (load),
 * or back (store), or back as low = round(f32(low) + f) (accumulate). */
typedef enum { LP_LOAD, LP_STORE, LP_ACC } lp_dir;

typedef struct lp_cvt {
    uint16_t *low;
    float *f;
    int64_t n;
    bool bf16;
    lp_dir dir;
} lp_cvt;

static inline float lp_to_f32(uint16_t h, bool bf16) {
    return bf16 ? kf__bf16_to_f32(h) : kf__f16_to_f32(h);
}

static inline uint16_t lp_from_f32(float f, bool bf16) {
    return bf16 ? kf__f32_to_bf16(f) : kf__f32_to_f16(f);
}

#ifdef KF__LOWP_AVX2
static inline __m256 lp_load8(const uint16_t *s, bool bf16) {
    const __m128i h = _mm_loadu_si128((const __m128i *)s);
    if (!bf16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline void lp_store8(uint16_t *d, __m256 v, bool bf16) {
    if (!bf16) {
        _mm_storeu_si128((__m128i *)d, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT |
                                                             _MM_FROUND_NO_EXC));
        return;
    }
    const __m256i u = _mm256_castps_si256(v);
    const __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    const __m256i nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7f800000));
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i rnd =
        _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd));
    const __m256i q = _mm256_or_si256(u, _mm256_set1_epi32(0x400000));
    const __m256i r = _mm256_srli_epi32(_mm256_blendv_epi8(rnd, q, nan), 16);
    const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128((__m128i *)d, _mm256_castsi256_si128(p));
}
#endif

/* Elements [lo, hi) of `c`; inlined with `bf16` a constant, so each type gets its own loop. */
static inline __attribute__((always_inline)) void lp_cvt_range(const lp_cvt *c, int64_t lo,
                                                               int64_t hi, bool bf16) {
    uint16_t *low = c->low;
    float *f = c->f;
    int64_t i = lo;
#ifdef KF__LOWP_AVX2
    for (; i + 8 <= hi; i += 8) {
        if (c->dir == LP_LOAD)
            _mm256_storeu_ps(f + i, lp_load8(low + i, bf16));
        else if (c->dir == LP_STORE)
            lp_store8(low + i, _mm256_loadu_ps(f + i), bf16);
        else
            lp_store8(low + i, _mm256_add_ps(lp_load8(low + i, bf16), _mm256_loadu_ps(f + i)),
                      bf16);
    }
#endif
    for (; i < hi; ++i) {
        if (c->dir == LP_LOAD)
            f[i] = lp_to_f32(low[i], bf16);
        else if (c->dir == LP_STORE)
            low[i] = lp_from_f32(f[i], bf16);
        else
            low[i] = lp_from_f32(lp_to_f32(low[i], bf16) + f[i], bf16);
    }
}

/* Below this many elements in all, a pass's conversions stay in the calling thread. */
#define KF__LOWP_PAR_MIN ((int64_t)1 << 16)
/* Conversions gathered per pass, so that one team runs all of a pass's tensors: a team per
 * tensor cost a wake-up each (30-60 us on the 2-core box: SKLinear 8192^2 B=64 bfloat16 forward
 * took 1.8x its float32 time on two threads with six of them). */
#define KF__LOWP_BATCH 32

typedef struct lp_batch {
    lp_cvt c[KF__LOWP_BATCH];
    int n;
    int64_t elems;
} lp_batch;

/* This thread's share of every conversion of the batch: whole vectors of each. */
static void lp_batch_team(void *arg, int tid, int nth) {
    const lp_batch *b = arg;
    for (int j = 0; j < b->n; ++j) {
        const lp_cvt *c = &b->c[j];
        int64_t lo, hi;
        kf__cpu_share((c->n + 7) / 8, tid, nth, &lo, &hi);
        lo *= 8;
        hi = hi * 8 < c->n ? hi * 8 : c->n;
        if (c->bf16)
            lp_cvt_range(c, lo, hi, true);
        else
            lp_cvt_range(c, lo, hi, false);
    }
}

/* ---- carving the float32 copies ------------------------------------------------------------
 * Each wrapper lists its record's tensors through lp_in/lp_out in one fixed order, in one of
 * three passes: SIZE (bytes only, every optional tensor counted), LOAD (carve and fill the
 * inputs), STORE (carve the same offsets and write the outputs back). */
typedef enum { LP_PASS_SIZE, LP_PASS_LOAD, LP_PASS_STORE } lp_pass;

typedef struct lp_ctx {
    lp_pass pass;
    bool bf16;
    bool accumulate; /* of the gradients marked so in lp_out */
    int32_t threads;
    char *base;      /* NULL in the SIZE pass */
    size_t off;
    lp_batch todo;   /* conversions queued, run by lp_flush */
} lp_ctx;

/* Runs the queued conversions on one team (or the calling thread, for few elements). */
static void lp_flush(lp_ctx *l) {
    if (l->todo.n > 0)
        kf__cpu_team(l->todo.elems >= KF__LOWP_PAR_MIN ? l->threads : 1, lp_batch_team, &l->todo);
    l->todo.n = 0;
    l->todo.elems = 0;
}

static void lp_queue(lp_ctx *l, lp_cvt c) {
    if (l->todo.n == KF__LOWP_BATCH) lp_flush(l);
    l->todo.c[l->todo.n++] = c;
    l->todo.elems += c.n;
}

static void *lp_carve(lp_ctx *l, size_t bytes) {
    void *p = l->base ? l->base + l->off : NULL;
    l->off += kf__align_up(bytes);
    return p;
}

/* The float32 copy of input `low` (n elements), or NULL when `low` is (the SIZE pass counts
 * every tensor). */
static const float *lp_in(lp_ctx *l, const void *low, int64_t n) {
    if (low == NULL && l->pass != LP_PASS_SIZE) return NULL;
    float *f = lp_carve(l, (size_t)n * sizeof(float));
    if (l->pass == LP_PASS_LOAD)
        lp_queue(l, (lp_cvt){(uint16_t *)low, f, n, l->bf16, LP_LOAD});
    return f;
}

/* The float32 buffer of output `low` (n elements), or NULL when `low` is; a gradient (`grad`)
 * is added into `low` when the call accumulates. */
static float *lp_out(lp_ctx *l, void *low, int64_t n, bool grad) {
    if (low == NULL && l->pass != LP_PASS_SIZE) return NULL;
    float *f = lp_carve(l, (size_t)n * sizeof(float));
    if (l->pass == LP_PASS_STORE)
        lp_queue(l, (lp_cvt){low, f, n, l->bf16, grad && l->accumulate ? LP_ACC : LP_STORE});
    return f;
}

static lp_ctx lp_begin(lp_pass pass, const kf_context *ctx, kf_dtype dt, void *ws,
                       size_t ws32, bool accumulate) {
    return (lp_ctx){pass, dt == KF_DTYPE_BF16, accumulate, ctx ? ctx->num_threads : 1,
                    ws ? (char *)ws + kf__align_up(ws32) : NULL, 0, {.n = 0}};
}

static size_t lp_max(size_t a, size_t b) { return a > b ? a : b; }

/* A float32 copy `q` of plan `p` (type PLAN): the plan the float32 table runs. */
#define LP_PLAN_F32(PLAN, q, p)                                                                   \
    PLAN q = *(p);                                                                                \
    q.dtype = KF_DTYPE_F32

/* Defines the wrapped entry `name` of an op (REC its call record, PLAN its plan type): a call of
 * a low plan converted around `inner`, the float32 table's entry; any other call passed to it.
 * WS32 is the float32 op's workspace for the record `c` and float32 plan `q`, LIST the record's
 * tensor list (lp_*_tensors), ACC whether gradients accumulate. */
#define LP_DEFINE_CALL(name, REC, PLAN, inner, WS32, LIST, ACC)                                  \
    static kf_status name(kf_context *ctx, const REC *c) {                                        \
        if (!kf__dtype_is_lowp(c->plan->dtype)) return inner(ctx, c);                             \
        LP_PLAN_F32(PLAN, q, c->plan);                                                            \
        const size_t ws32 = (WS32);                                                               \
        REC f = *c;                                                                               \
        f.plan = &q;                                                                              \
        f.ws_bytes = ws32;                                                                        \
        lp_ctx l = lp_begin(LP_PASS_LOAD, ctx, c->plan->dtype, c->ws, ws32, (ACC));               \
        LIST(&l, c, &f);                                                                          \
        lp_flush(&l);                                                                             \
        KF_TRY(inner(ctx, &f));                                                                   \
        l = lp_begin(LP_PASS_STORE, ctx, c->plan->dtype, c->ws, ws32, (ACC));                     \
        LIST(&l, c, &f);                                                                          \
        lp_flush(&l);                                                                             \
        return KF_OK;                                                                             \
    }

/* The workspace of both calls of a record pair (FWD, BWD) of `p` in the SIZE pass: the larger
 * of the two tensor sets (BWD's only when `both`), after the float32 op's `ws32`. */
#define LP_SIZE_BOTH(FWD, BWD, fwd_list, bwd_list, p, both, ws32, ...)                           \
    do {                                                                                          \
        FWD cf_ = {.plan = (p), __VA_ARGS__}, ff_ = cf_;                                          \
        BWD cb_ = {.plan = (p), __VA_ARGS__}, fb_ = cb_;                                          \
        lp_ctx lf_ = lp_begin(LP_PASS_SIZE, NULL, (p)->dtype, NULL, 0, false), lb_ = lf_;         \
        fwd_list(&lf_, &cf_, &ff_);                                                               \
        if (both) bwd_list(&lb_, &cb_, &fb_);                                                     \
        (ws32) = kf__align_up(ws32) + lp_max(lf_.off, lb_.off);                                   \
    } while (0)

/* ---- recurrent layers ---------------------------------------------------------------------- */

static int64_t lp_rnn_weight_elems(const struct kf_rnn_plan *p, int32_t k) {
    int64_t s[2];
    const int32_t nd = kf__rnn_weight_shape(p, k / p->nw / p->D, k % p->nw, s);
    return nd == 2 ? s[0] * s[1] : s[0];
}

/* A carved array of num_weights pointers (NULL in the SIZE pass), unless the record has none. */
static void **lp_ptrs(lp_ctx *l, const struct kf_rnn_plan *p, const void *list) {
    if (list == NULL && l->pass != LP_PASS_SIZE) return NULL;
    return lp_carve(l, (size_t)p->num_weights * sizeof(void *));
}

/* The float32 copies of the weights c->w (NULL in the SIZE pass: every weight counted). */
static const void **lp_rnn_weights(lp_ctx *l, const struct kf_rnn_plan *p,
                                   const void *const *cw) {
    const void **w = (const void **)lp_ptrs(l, p, cw);
    for (int32_t k = 0; k < p->num_weights; ++k) {
        const float *wk = lp_in(l, cw ? cw[k] : NULL, lp_rnn_weight_elems(p, k));
        if (w) w[k] = wk;
    }
    return w;
}

/* The inputs shared by forward and backward (x, h0, the weights); TB = T * B and hn, the
 * elements of h0, defined for the rest of the list. */
#define LP_RNN_INPUTS(l, p, c, f)                                                                 \
    const int64_t TB = (c)->T * (c)->B, hn = (int64_t)(p)->L * (p)->D * (c)->B * (p)->H;          \
    (f)->x = lp_in(l, (c)->x, TB * (p)->I);                                                       \
    (f)->h0 = lp_in(l, (c)->h0, hn);                                                              \
    (f)->w = lp_rnn_weights(l, p, (c)->w)

static void lp_rnn_fwd_tensors(lp_ctx *l, const kf__rnn_fwd *c, kf__rnn_fwd *f) {
    const struct kf_rnn_plan *p = c->plan;
    LP_RNN_INPUTS(l, p, c, f);
    f->y = lp_out(l, c->y, TB * p->D * p->H, false);
    f->hn = lp_out(l, c->hn, hn, false);
}

static void lp_rnn_bwd_tensors(lp_ctx *l, const kf__rnn_bwd *c, kf__rnn_bwd *f) {
    const struct kf_rnn_plan *p = c->plan;
    LP_RNN_INPUTS(l, p, c, f);
    f->dy = lp_in(l, c->dy, TB * p->D * p->H);
    f->dhn = lp_in(l, c->dhn, hn);
    f->dx = lp_out(l, c->dx, TB * p->I, false);
    f->dh0 = lp_out(l, c->dh0, hn, false);
    void **dw = lp_ptrs(l, p, c->dw);
    for (int32_t k = 0; (dw || l->pass == LP_PASS_SIZE) && k < p->num_weights; ++k) {
        float *g = lp_out(l, c->dw ? c->dw[k] : NULL, lp_rnn_weight_elems(p, k), true);
        if (dw) dw[k] = g;
    }
    f->dw = dw;
    f->accumulate = false;
}
#undef LP_RNN_INPUTS

static void lp_rnn_sizes(const struct kf_rnn_plan *p, int64_t T, int64_t B, bool training,
                         size_t *ws_bytes, size_t *reserve_bytes) {
    const bool low = kf__dtype_is_lowp(p->dtype);
    LP_PLAN_F32(struct kf_rnn_plan, q, p);
    kf__cpu_rnn_ops.sizes(low ? &q : p, T, B, training, ws_bytes, reserve_bytes);
    if (!low) return;
    LP_SIZE_BOTH(kf__rnn_fwd, kf__rnn_bwd, lp_rnn_fwd_tensors, lp_rnn_bwd_tensors, p, training,
                 *ws_bytes, .T = T, .B = B);
}

/* The float32 op's workspace for a call of T, B (backward: a training size). */
static size_t lp_rnn_ws32(const struct kf_rnn_plan *q, int64_t T, int64_t B, bool training) {
    size_t ws = 0, rs = 0;
    kf__cpu_rnn_ops.sizes(q, T, B, training, &ws, &rs);
    return ws;
}

LP_DEFINE_CALL(lp_rnn_forward, kf__rnn_fwd, struct kf_rnn_plan, kf__cpu_rnn_ops.forward,
               lp_rnn_ws32(&q, c->T, c->B, c->training), lp_rnn_fwd_tensors, false)
LP_DEFINE_CALL(lp_rnn_backward, kf__rnn_bwd, struct kf_rnn_plan, kf__cpu_rnn_ops.backward,
               lp_rnn_ws32(&q, c->T, c->B, true), lp_rnn_bwd_tensors, c->accumulate)

const kf__rnn_ops kf__cpu_rnn_any_ops = {NULL, lp_rnn_sizes, lp_rnn_forward, lp_rnn_backward};

/* ---- sketched linear ----------------------------------------------------------------------- */

/* The parameters shared by forward and backward: S1s, S2s, U1s, U2s, bias. */
#define LP_SKL_PARAMS(l, p, c, f)                                                                 \
    do {                                                                                          \
        const int64_t ik = (p)->in * (p)->r, ko = (p)->r * (p)->out;                              \
        (f)->S1 = lp_in(l, (c)->S1, ik);                                                          \
        (f)->S2 = lp_in(l, (c)->S2, ko);                                                          \
        (f)->U1 = lp_in(l, (c)->U1, ko);                                                          \
        (f)->U2 = lp_in(l, (c)->U2, ik);                                                          \
    } while (0)

static void lp_skl_fwd_tensors(lp_ctx *l, const kf__skl_fwd *c, kf__skl_fwd *f) {
    const struct kf_sklinear_plan *p = c->plan;
    f->x = lp_in(l, c->x, c->N * p->in);
    LP_SKL_PARAMS(l, p, c, f);
    f->bias = lp_in(l, p->has_bias ? c->bias : NULL, p->out);
    f->y = lp_out(l, c->y, c->N * p->out, false);
}

static void lp_skl_bwd_tensors(lp_ctx *l, const kf__skl_bwd *c, kf__skl_bwd *f) {
    const struct kf_sklinear_plan *p = c->plan;
    f->x = lp_in(l, c->x, c->N * p->in);
    LP_SKL_PARAMS(l, p, c, f);
    f->dy = lp_in(l, c->dy, c->N * p->out);
    f->dx = lp_out(l, c->dx, c->N * p->in, false);
    f->dS1 = lp_out(l, c->dS1, p->in * p->r, true);
    f->dS2 = lp_out(l, c->dS2, p->r * p->out, true);
    f->db = lp_out(l, p->has_bias ? c->db : NULL, p->out, true);
    f->accumulate = false;
}
#undef LP_SKL_PARAMS

static size_t lp_skl_workspace(const struct kf_sklinear_plan *p, int64_t N) {
    if (!kf__dtype_is_lowp(p->dtype)) return kf__cpu_skl_ops.workspace(p, N);
    LP_PLAN_F32(struct kf_sklinear_plan, q, p);
    size_t ws = kf__cpu_skl_ops.workspace(&q, N);
    LP_SIZE_BOTH(kf__skl_fwd, kf__skl_bwd, lp_skl_fwd_tensors, lp_skl_bwd_tensors, p, true, ws,
                 .N = N);
    return ws;
}

LP_DEFINE_CALL(lp_skl_forward, kf__skl_fwd, struct kf_sklinear_plan, kf__cpu_skl_ops.forward,
               kf__cpu_skl_ops.workspace(&q, c->N), lp_skl_fwd_tensors, false)
LP_DEFINE_CALL(lp_skl_backward, kf__skl_bwd, struct kf_sklinear_plan, kf__cpu_skl_ops.backward,
               kf__cpu_skl_ops.workspace(&q, c->N), lp_skl_bwd_tensors, c->accumulate)

const kf__skl_ops kf__cpu_skl_any_ops = {NULL, lp_skl_workspace, lp_skl_forward,
                                         lp_skl_backward};

/* ---- KANLinear and KANConv2d --------------------------------------------------------------- */

/* Elements of x: the rows [N, in], or KANConv2d's images [B, Cin, H, W]. */
static int64_t lp_kan_x_elems(const struct kf_kan_linear_plan *p, int64_t N,
                              const kf__kan_patches *g) {
    return g ? g->B * g->Cin * g->H * g->W : N * p->in;
}

#define LP_KAN_PARAMS(l, p, c, f)                                                                 \
    do {                                                                                          \
        (f)->x = lp_in(l, (c)->x, lp_kan_x_elems(p, (c)->N, (c)->patches));                       \
        (f)->grid = lp_in(l, (c)->grid, (p)->in * (p)->nk);                                       \
        (f)->base = lp_in(l, (c)->base, (p)->out * (p)->in);                                      \
        (f)->spline = lp_in(l, (c)->spline, (p)->out * (p)->in * (p)->C);                         \
        (f)->scaler = lp_in(l, (p)->scaled ? (c)->scaler : NULL, (p)->out * (p)->in);             \
    } while (0)

static void lp_kan_fwd_tensors(lp_ctx *l, const kf__kan_fwd *c, kf__kan_fwd *f) {
    const struct kf_kan_linear_plan *p = c->plan;
    LP_KAN_PARAMS(l, p, c, f);
    f->y = lp_out(l, c->y, c->N * p->out, false);
}

static void lp_kan_bwd_tensors(lp_ctx *l, const kf__kan_bwd *c, kf__kan_bwd *f) {
    const struct kf_kan_linear_plan *p = c->plan;
    LP_KAN_PARAMS(l, p, c, f);
    f->dy = lp_in(l, c->dy, c->N * p->out);
    f->dx = lp_out(l, c->dx, lp_kan_x_elems(p, c->N, c->patches), false);
    f->dbase = lp_out(l, c->dbase, p->out * p->in, true);
    f->dspline = lp_out(l, c->dspline, p->out * p->in * p->C, true);
    f->dscaler = lp_out(l, p->scaled ? c->dscaler : NULL, p->out * p->in, true);
    f->accumulate = false;
}
#undef LP_KAN_PARAMS

static size_t lp_kan_workspace(const struct kf_kan_linear_plan *p, int64_t N,
                               const kf__kan_patches *patches) {
    if (!kf__dtype_is_lowp(p->dtype)) return kf__cpu_kan_ops.workspace(p, N, patches);
    LP_PLAN_F32(struct kf_kan_linear_plan, q, p);
    size_t ws = kf__cpu_kan_ops.workspace(&q, N, patches);
    LP_SIZE_BOTH(kf__kan_fwd, kf__kan_bwd, lp_kan_fwd_tensors, lp_kan_bwd_tensors, p, true, ws,
                 .N = N, .patches = patches);
    return ws;
}

LP_DEFINE_CALL(lp_kan_forward, kf__kan_fwd, struct kf_kan_linear_plan, kf__cpu_kan_ops.forward,
               kf__cpu_kan_ops.workspace(&q, c->N, c->patches), lp_kan_fwd_tensors, false)
LP_DEFINE_CALL(lp_kan_backward, kf__kan_bwd, struct kf_kan_linear_plan, kf__cpu_kan_ops.backward,
               kf__cpu_kan_ops.workspace(&q, c->N, c->patches), lp_kan_bwd_tensors,
               c->accumulate)

const kf__kan_ops kf__cpu_kan_any_ops = {NULL, lp_kan_workspace, lp_kan_forward,
                                         lp_kan_backward};

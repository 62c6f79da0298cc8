/* bfloat16 and float16 recurrent plans for every backend: one conversion layer over the
 * backend's float32 op table (the contract: core/lowp_ops.h). Conversions are queued and run in
 * batches by the backend's routine (kf__lowp_base.convert). */
#include "lowp_ops.h"
#include "lowp.h"

/* ---- carving the float32 copies ------------------------------------------------------------
 * Each wrapper lists its record's tensors through lp_in/lp_out in one fixed order, in one of
 * three passes: SIZE (bytes only, every optional tensor counted), LOAD (carve and fill the
 * inputs), STORE (carve the same offsets and write the outputs back). */
typedef enum { LP_PASS_SIZE, LP_PASS_LOAD, LP_PASS_STORE } lp_pass;

typedef struct lp_ctx {
    lp_pass pass;
    bool bf16;
    bool accumulate; /* of the gradients marked so in lp_out */
    kf_context *ctx; /* NULL in the SIZE pass */
    const char *fn;
    kf_status st;    /* the first conversion failure */
    char *base;      /* NULL in the SIZE pass */
    size_t off;
    kf__lp_batch todo; /* conversions queued, run by lp_flush */
} lp_ctx;

/* Runs the queued conversions through the backend's routine; returns the pass's first failure. */
static kf_status lp_flush(lp_ctx *l) {
    if (l->todo.n > 0 && l->st == KF_OK)
        l->st = l->ctx->backend->lowp->convert(l->ctx, l->fn, &l->todo);
    l->todo.n = 0;
    l->todo.elems = 0;
    return l->st;
}

static void lp_queue(lp_ctx *l, kf__lp_cvt c) {
    if (l->todo.n == KF__LP_BATCH) lp_flush(l);
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
        lp_queue(l, (kf__lp_cvt){(uint16_t *)low, f, n, l->bf16, KF__LP_LOAD});
    return f;
}

/* The float32 buffer of output `low` (n elements), or NULL when `low` is; a gradient (`grad`)
 * is added into `low` when the call accumulates. */
static float *lp_out(lp_ctx *l, void *low, int64_t n, bool grad) {
    if (low == NULL && l->pass != LP_PASS_SIZE) return NULL;
    float *f = lp_carve(l, (size_t)n * sizeof(float));
    if (l->pass == LP_PASS_STORE)
        lp_queue(l, (kf__lp_cvt){low, f, n, l->bf16,
                                 grad && l->accumulate ? KF__LP_ACC : KF__LP_STORE});
    return f;
}

static lp_ctx lp_begin(lp_pass pass, kf_context *ctx, const char *fn, kf_dtype dt, void *ws,
                       size_t ws32, bool accumulate) {
    return (lp_ctx){pass, dt == KF_DTYPE_BF16, accumulate, ctx, fn, KF_OK,
                    ws ? (char *)ws + kf__align_up(ws32) : NULL, 0, {.n = 0}};
}

static size_t lp_max(size_t a, size_t b) { return a > b ? a : b; }

/* A float32 copy `q` of plan `p` (type PLAN): the plan the float32 table runs. */
#define LP_PLAN_F32(PLAN, q, p)                                                                   \
    PLAN q = *(p);                                                                                \
    q.dtype = KF_DTYPE_F32

/* The body of a wrapped entry of an op, for the call record `c` (REC its type, PLAN its plan
 * type, OPS the member of kf__lowp_base with the backend's table, FN the public function's name
 * for messages): a call of a low plan (the only plans a select() gives this table) converted
 * around the backend's entry `base->OPS->ENTRY`. WS32 is the float32 op's workspace for the
 * record `c` and float32 plan `q` (with `base` in scope), LIST the record's tensor list
 * (lp_*_tensors), ACC whether gradients accumulate. */
#define LP_CALL(ctx, c, REC, PLAN, OPS, ENTRY, FN, WS32, LIST, ACC)                                \
    do {                                                                                          \
        const kf__lowp_base *base = (ctx)->backend->lowp;                                         \
        LP_PLAN_F32(PLAN, q, (c)->plan);                                                          \
        const size_t ws32 = (WS32);                                                               \
        REC f = *(c);                                                                             \
        f.plan = &q;                                                                              \
        f.ws_bytes = ws32;                                                                        \
        lp_ctx l = lp_begin(LP_PASS_LOAD, ctx, (FN), (c)->plan->dtype, (c)->ws, ws32, (ACC));     \
        LIST(&l, c, &f);                                                                          \
        KF_TRY(lp_flush(&l));                                                                     \
        KF_TRY(base->OPS->ENTRY(ctx, &f));                                                        \
        l = lp_begin(LP_PASS_STORE, ctx, (FN), (c)->plan->dtype, (c)->ws, ws32, (ACC));           \
        LIST(&l, c, &f);                                                                          \
        return lp_flush(&l);                                                                      \
    } while (0)

/* The workspace of both calls of a record pair (FWD, BWD) of `p` in the SIZE pass: the larger
 * of the two tensor sets (BWD's only when `both`), after the float32 op's `ws32`. */
#define LP_SIZE_BOTH(FWD, BWD, fwd_list, bwd_list, p, both, ws32, ...)                           \
    do {                                                                                          \
        FWD cf_ = {.plan = (p), __VA_ARGS__}, ff_ = cf_;                                          \
        BWD cb_ = {.plan = (p), __VA_ARGS__}, fb_ = cb_;                                          \
        lp_ctx lf_ = lp_begin(LP_PASS_SIZE, NULL, NULL, (p)->dtype, NULL, 0, false);               \
        lp_ctx lb_ = lf_;                                                                          \
        fwd_list(&lf_, &cf_, &ff_);                                                               \
        if (both) bwd_list(&lb_, &cb_, &fb_);                                                     \
        (ws32) = kf__align_up(ws32) + lp_max(lf_.off, lb_.off);                                   \
    } while (0)

/* ---- recurrent layers ---------------------------------------------------------------------- */

/* The float32 copies of the weights c->w (NULL in the SIZE pass: every weight counted). */
static const void **lp_rnn_weights(lp_ctx *l, const struct kf_rnn_plan *p,
                                   const void *const *cw) {
    /* their pointers go to the second half of the plan's scratch p->w (host memory on every
     * backend, unlike the workspace: rnn_backend.h) */
    const void **w = l->pass != LP_PASS_SIZE && cw ? p->w + p->num_weights : NULL;
    for (int32_t k = 0; k < p->num_weights; ++k) {
        const float *wk = lp_in(l, cw ? cw[k] : NULL, kf__rnn_weight_elems(p, k));
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
    void **dw = l->pass != LP_PASS_SIZE && c->dw ? p->dw + p->num_weights : NULL; /* as w */
    for (int32_t k = 0; (dw || l->pass == LP_PASS_SIZE) && k < p->num_weights; ++k) {
        float *g = lp_out(l, c->dw ? c->dw[k] : NULL, kf__rnn_weight_elems(p, k), true);
        if (dw) dw[k] = g;
    }
    f->dw = dw;
    f->accumulate = false;
}
#undef LP_RNN_INPUTS

static void lp_rnn_sizes(const struct kf_rnn_plan *p, int64_t T, int64_t B, bool training,
                         size_t *ws_bytes, size_t *reserve_bytes) {
    LP_PLAN_F32(struct kf_rnn_plan, q, p);
    p->ctx->backend->lowp->rnn->sizes(&q, T, B, training, ws_bytes, reserve_bytes);
    LP_SIZE_BOTH(kf__rnn_fwd, kf__rnn_bwd, lp_rnn_fwd_tensors, lp_rnn_bwd_tensors, p, training,
                 *ws_bytes, .T = T, .B = B);
}

/* The float32 op's workspace for a call of T, B (backward: a training size). */
static size_t lp_rnn_ws32(const kf__lowp_base *base, const struct kf_rnn_plan *q, int64_t T,
                          int64_t B, bool training) {
    size_t ws = 0, rs = 0;
    base->rnn->sizes(q, T, B, training, &ws, &rs);
    return ws;
}

static kf_status lp_rnn_forward(kf_context *ctx, const kf__rnn_fwd *c) {
    LP_CALL(ctx, c, kf__rnn_fwd, struct kf_rnn_plan, rnn, forward, "kf_rnn_forward",
            lp_rnn_ws32(base, &q, c->T, c->B, c->training), lp_rnn_fwd_tensors, false);
}

static kf_status lp_rnn_backward(kf_context *ctx, const kf__rnn_bwd *c) {
    LP_CALL(ctx, c, kf__rnn_bwd, struct kf_rnn_plan, rnn, backward, "kf_rnn_backward",
            lp_rnn_ws32(base, &q, c->T, c->B, true), lp_rnn_bwd_tensors, c->accumulate);
}

const kf__rnn_ops kf__lowp_rnn_ops = {NULL, lp_rnn_sizes, lp_rnn_forward,
                                      lp_rnn_backward};

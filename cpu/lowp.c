/* The CPU backend's conversion routine for bfloat16 and float16 recurrent plans
 * (core/lowp_ops.h: the conversion layer over the float32 op table that every backend shares).
 * Conversions are O(elements) against the O(flops) kernels: cpu/lowp_simd.h's (AVX2 + F16C, 8
 * lanes; bfloat16 by integer arithmetic); all of a pass's conversions (the inputs, then the
 * outputs) run on one team of the context's threads when they hold 64 Ki elements or more. */
#include "cpu_backend.h"
#include "lowp_ops.h"
#include "lowp_simd.h"
#include "team.h"

/* ---- conversions --------------------------------------------------------------------------- */

/* Elements [lo, hi) of `c`; inlined with `bf16` a constant, so each type gets its own loop. */
static inline __attribute__((always_inline)) void lp_cvt_range(const kf__lp_cvt *c, int64_t lo,
                                                               int64_t hi, bool bf16) {
    if (c->dir == KF__LP_LOAD)
        kf__lp_load_n(c->f + lo, c->low + lo, hi - lo, bf16);
    else
        kf__lp_store_n(c->low + lo, c->f + lo, hi - lo, c->dir == KF__LP_ACC, bf16);
}

/* Below this many elements in all, a pass's conversions stay in the calling thread. */
#define KF__LOWP_PAR_MIN ((int64_t)1 << 16)
/* This thread's share of every conversion of the batch: whole vectors of each. */
static void lp_batch_team(void *arg, int tid, int nth) {
    const kf__lp_batch *b = arg;
    for (int j = 0; j < b->n; ++j) {
        const kf__lp_cvt *c = &b->c[j];
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

/* kf__lowp_base.convert: the batch on one team of the context's threads (the calling thread
 * alone below KF__LOWP_PAR_MIN elements); never fails. */
static kf_status cpu_convert(kf_context *ctx, const char *fn, const kf__lp_batch *b) {
    kf__cpu_team(b->elems >= KF__LOWP_PAR_MIN ? ctx->num_threads : 1, lp_batch_team, (void *)b);
    return KF_OK;
}

const kf__lowp_base kf__cpu_lowp = {&kf__cpu_rnn_ops, cpu_convert};

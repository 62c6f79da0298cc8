/* The CPU recurrent op table: a float32 plan's entries forward to the op table of the
 * instruction set the context picked at creation (kf_context.isa, cpu/isa.c), one build of the
 * same kernel sources per ISA (cpu/rnn_cpu.h); a float64 plan's to cpu/rnn_f64.c, which runs on
 * the baseline's layout. */
#include "cpu_backend.h"

static const kf__rnn_ops *isa_ops(const struct kf_rnn_plan *p) {
#ifdef KF_HAVE_CPU_V4
    if (p->ctx->isa == KF__CPU_ISA_V4 && p->dtype != KF_DTYPE_F64) return &kf__cpu_rnn_ops_v4;
#endif
    return &kf__cpu_rnn_ops_base;
}

static void rnn_sizes(const struct kf_rnn_plan *p, int64_t T, int64_t B, bool training,
                      size_t *ws_bytes, size_t *reserve_bytes) {
    isa_ops(p)->sizes(p, T, B, training, ws_bytes, reserve_bytes);
}

static kf_status rnn_forward(kf_context *ctx, const kf__rnn_fwd *c) {
    return c->plan->dtype == KF_DTYPE_F64 ? kf__cpu_rnn_forward_f64(ctx, c)
                                          : isa_ops(c->plan)->forward(ctx, c);
}

static kf_status rnn_backward(kf_context *ctx, const kf__rnn_bwd *c) {
    return c->plan->dtype == KF_DTYPE_F64 ? kf__cpu_rnn_backward_f64(ctx, c)
                                          : isa_ops(c->plan)->backward(ctx, c);
}

const kf__rnn_ops kf__cpu_rnn_ops = {NULL, rnn_sizes, rnn_forward, rnn_backward};

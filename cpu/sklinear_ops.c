/* The CPU sketched-linear op table: every entry forwards to the op table of the instruction set
 * the plan's context picked at creation (kf_context.isa, cpu/isa.c): cpu/sklinear.c built for
 * the baseline (kf__cpu_skl_ops_base) or, where the build has it, for x86-64-v4
 * (kf__cpu_skl_ops_v4, cpu/sklinear_v4.c). Both builds lay out the workspace alike; each call
 * still asks the table it runs on. */
#include "cpu_backend.h"

static const kf__skl_ops *isa_ops(const struct kf_sklinear_plan *p) {
#ifdef KF_HAVE_CPU_V4
    if (p->ctx->isa == KF__CPU_ISA_V4) return &kf__cpu_skl_ops_v4;
#endif
    return &kf__cpu_skl_ops_base;
}

static size_t skl_workspace(const struct kf_sklinear_plan *p, int64_t N) {
    return isa_ops(p)->workspace(p, N);
}

static kf_status skl_forward(kf_context *ctx, const kf__skl_fwd *c) {
    return isa_ops(c->plan)->forward(ctx, c);
}

static kf_status skl_backward(kf_context *ctx, const kf__skl_bwd *c) {
    return isa_ops(c->plan)->backward(ctx, c);
}

const kf__skl_ops kf__cpu_skl_ops = {NULL, skl_workspace, skl_forward, skl_backward};

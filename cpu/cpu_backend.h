/* The CPU backend's op tables, one per op (cpu/backend.c's recurrent select, cpu/sklinear.c,
 * cpu/kan_linear.c), serving every dtype (float32, float64, bfloat16 and float16 storage);
 * gathered into its kf__backend by cpu/backend.c. The recurrent and KAN tables are selectors:
 * a plan takes, at creation, the table of its dtype and its context's ISA. Private to cpu/. */
#ifndef KF_CPU_BACKEND_H
#define KF_CPU_BACKEND_H

#include "backend.h"
#include "kan_backend.h"
#include "rnn_backend.h"
#include "sklinear_backend.h"

/* The instruction sets of the CPU recurrent and sketched-linear kernels (kf_context.isa): the
 * build's baseline (KF_CPU_ARCH) and, where the build has them (KF_HAVE_CPU_V4), x86-64-v4
 * (AVX-512). */
enum { KF__CPU_ISA_BASE = 0, KF__CPU_ISA_V4 = 1 };

/* The ISA a new context's kernels use (cpu/isa.c): the best this build and CPU can run, unless
 * the environment variable KF_CPU_ISA says otherwise ("avx2": the baseline; "avx512":
 * x86-64-v4, KF_ERR_UNSUPPORTED where it cannot run; another value: KF_ERR_INVALID_ARGUMENT). */
kf_status kf__cpu_isa_pick(const char *fn, int32_t *isa);

/* Each ISA's recurrent op table for float32, bfloat16 and float16 plans (cpu/rnn_layout.c
 * compiled per ISA; rnn_cpu.h), and the float64 plans' (cpu/rnn_f64.c, on the baseline's
 * layout): cpu/backend.c's select gives a plan one of them at creation. */
kf_status kf__cpu_rnn_forward_f64(kf_context *ctx, const kf__rnn_fwd *c);
kf_status kf__cpu_rnn_backward_f64(kf_context *ctx, const kf__rnn_bwd *c);
extern const kf__rnn_ops kf__cpu_rnn_ops_f64;
extern const kf__rnn_ops kf__cpu_rnn_ops_base;
#ifdef KF_HAVE_CPU_V4
extern const kf__rnn_ops kf__cpu_rnn_ops_v4;
#endif
/* The sketched linear layer: the backend's entry table, whose select() gives a plan the table of
 * its context's ISA and its dtype at creation, and each build of cpu/sklinear.c's tables by
 * dtype (the baseline's, and where the build has it x86-64-v4's, cpu/sklinear_v4.c). */
extern const kf__skl_ops kf__cpu_skl_ops;
const kf__skl_ops *kf__cpu_skl_ops_base(kf_dtype dtype);
#ifdef KF_HAVE_CPU_V4
const kf__skl_ops *kf__cpu_skl_ops_v4(kf_dtype dtype);
#endif
extern const kf__kan_ops kf__cpu_kan_ops;

#endif /* KF_CPU_BACKEND_H */

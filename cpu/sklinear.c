/* CPU backend of the sketched linear layer: two products through the 2r-wide bottleneck
 * (notation of core/sklinear_backend.h), from the context's own threads, no allocation.
 *
 * Every product has one side of 2r (or r, or k) columns and runs on kf__rowgemm (cpu/rowgemm.h),
 * which reads its operands in place and writes each output once, bias included: a BLAS GEMM
 * spends more on packing its operands and on separate passes over C than on the product at
 * these shapes (against OpenBLAS, one thread, interleaved minima, new/old, fwd / fwd+bwd, B=64:
 * in=out=256 L=1 k=16 0.71 / 0.72; 8192 L=1 k=16 0.68 / 0.76; 8192 L=4 k=32 0.75 / 0.87;
 * 1024 with B=1024 rows 0.64 / 0.76).
 *  - forward: Z = x W1 with W1 = [S1_1..S1_L | U2_1..U2_L] [in, 2r], k columns per term
 *    straight from the sketches, then y = s Z [U1; S2] + bias (U1s and S2s are [r, out]
 *    matrices already; s = 1 / (2L));
 *  - backward: dZ = s dy [U1; S2]^T, over B2^T = [U1; S2]^T [out, 2r] copied into the workspace
 *    where the bottleneck is narrow (2r <= KF__SKL_RG_MAX), else by BLAS on U1 and S2 in place;
 *    dx = dZ W1^T over W1^T copied into the workspace; dS2 = s Z[:, r:]^T dy and
 *    dS1_i = x^T dZ[:, i k:(i + 1) k] straight into the parameter layouts; dbias = the column
 *    sums of dy.
 *
 * Work is split into fixed blocks, round-robin to the threads; every element has one writer, and
 * since the blocks (hence every product call and every sum's order) depend on the shape alone,
 * the bits do not depend on the thread count. Two splits of the products through the bottleneck:
 *  - rows (the default): blocks of KF__SKL_ROWS rows of x run both stages;
 *  - wide (few rows, the layer's usual batch, and in, out >= 512): each stage is split along its
 *    weights instead, so that each weight is read once per call. The first stage Z = x W1 is
 *    split over `in` (each block writes a partial Z, summed in block order), the second
 *    y = s Z [U1; S2] over `out`; backward likewise (dZ partials over `out`, the recomputed Z
 *    over `in`, then dx by blocks of `in`). The rule and the measured gain: KF__SKL_WIDE_ROWS.
 * The reductions over rows (dS1s, dS2s, dbias) are split by parameter columns in both.
 *
 * One implementation for every dtype: the kernels (cpu/sklinear_products.h, cpu/sklinear_teams.h)
 * are written once per arithmetic type (float32, or float64) with the storage kind (float32,
 * float64, bfloat16, float16: cpu/rowgemm.h's kf__rg_kind) a constant argument of force-inlined
 * functions; each dtype's team functions (skl_fwd_team_X, skl_bwd_team_X) call them with its kind
 * and its op table lists them, chosen at plan creation (skl_select). A bfloat16 or float16 plan
 * reads x, the weights and dy in place, widening them as the products load them (cpu/rowgemm.h's
 * kinds of operand), computes in float32 and rounds each result once as it is written (y and dx in
 * the products' epilogue; the parameter gradients through a float32 block, which the accumulation
 * round(old + g) needs): no conversion passes over whole tensors (1.7.1; before, the conversion
 * layer's passes made the 8192^2 B=64 forward 1.3x float32's on two threads, and 1.6x and more in
 * a steady loop). The widening inside the products and the rounding of the results still cost
 * something: 1.1-1.25x float32's time on an AVX-512 Xeon at 256^2 and 8192^2, B=64, in this
 * baseline build (benches/results/avx512/cpu_lowp.md); 0.87-1.01x in the AVX-512 one
 * (benches/results/avx512/cpu_sklinear_v4.md).
 *
 * Two builds of this file (as of the recurrent kernels): the baseline's (KF_CPU_ARCH, 8-float
 * vectors) and, where CMake's KF_CPU_AVX512 holds, an x86-64-v4 one (cpu/sklinear_v4.c: 16-float
 * vectors and 8-row tiles in cpu/rowgemm.h, 16-lane conversions in cpu/lowp_simd.h), each with
 * its op tables (kf__cpu_skl_ops_base(), kf__cpu_skl_ops_v4(): one per dtype); the plan takes
 * the one of its context's ISA (cpu/isa.c) and its dtype at creation (skl_select, end of file).
 * The blocks, the workspace and every sum's order are the
 * same in both, except that a product whose columns end in a partial vector (cpu/rowgemm.h)
 * sums a reduction over more than 256 rows in chunks there: so the bits are the baseline's but
 * for such shapes (k = 8 on AVX-512 with N > 256, say), and never depend on the thread count. */
#include "sklinear_cpu.h"

static skl_layout skl_layout_of(const struct kf_sklinear_plan *p, int64_t N) {
    skl_layout lo;
    const size_t e = p->dtype == KF_DTYPE_F64 ? sizeof(double) : sizeof(float);
    lo.nbi = skl_nblocks(p->in);
    lo.nbo = skl_nblocks(p->out);
    lo.wide = N <= KF__SKL_WIDE_ROWS && lo.nbi > 1 && lo.nbo > 1;
    size_t z = kf__align_up((size_t)(N * 2 * p->r) * e);
    lo.w1 = 0;
    lo.ldw = p->in + (int64_t)(64 / e);
    const bool low = kf__dtype_is_lowp(p->dtype);
    lo.rg = 2 * p->r <= KF__SKL_RG_MAX || low; /* BLAS takes no low operands */
    lo.b2 = lo.w1 + kf__align_up((size_t)(lo.ldw * 2 * p->r) * e);
    lo.z = lo.b2 + (lo.rg ? kf__align_up((size_t)(p->out * 2 * p->r) * e) : 0);
    lo.dz = lo.z + z;
    lo.part = lo.dz + z;
    const int64_t fwd = lo.nbi * 2, bwd = lo.nbi + lo.nbo * 2; /* in units of N r elements */
    lo.bytes = lo.part + (lo.wide ? (size_t)((fwd > bwd ? fwd : bwd) * N * p->r) * e : 0);
    lo.ysh = lo.dxsh = lo.d1sh = lo.d2sh = 0;
    if (low) {
        const bool blocks = KF__SKL_BLOCKS(p->r); /* y's and dx's blocks */
        lo.ysh = lo.dxsh = lo.bytes;
        lo.d1sh = lo.dxsh + (blocks ? kf__align_up((size_t)(N * p->in) * e) : 0);
        lo.d2sh = lo.d1sh + kf__align_up((size_t)(p->r * p->in) * e);
        const size_t fsh = lo.ysh + (blocks ? kf__align_up((size_t)(N * p->out) * e) : 0),
                     bsh = lo.d2sh + kf__align_up((size_t)(p->r * p->out) * e);
        lo.bytes = fsh > bsh ? fsh : bsh;
    }
    lo.epi = p->act != KF_ACTIVATION_NONE || p->dropout > 0.0f;
    lo.g = lo.bytes;
    if (lo.epi) lo.bytes += kf__align_up((size_t)(N * p->out) * e);
    return lo;
}

static size_t skl_workspace(const struct kf_sklinear_plan *p, int64_t N) {
    return skl_layout_of(p, N).bytes;
}

/* The forward's multiply-adds, N (in + out) 2r, decide the team of both directions. */
static int32_t skl_team_size(const kf_context *ctx, const struct kf_sklinear_plan *p, int64_t N) {
    return kf__cpu_team_size(ctx->num_threads,
                             (double)N * (double)(p->in + p->out) * 2.0 * (double)p->r);
}

static void skl_fwd_call_init(skl_fwd_call *call, const kf__skl_fwd *c) {
    const struct kf_sklinear_plan *p = c->plan;
    call->c = c;
    call->lo = skl_layout_of(p, c->N);
    call->epi = (kf__rg_epi){.act = p->act, .p = c->epi.p, .scale_s = kf__dropout_scale_s(c->epi.p),
                             .scale_d = kf__dropout_scale_d(c->epi.p), .seed = c->epi.seed,
                             .offset = c->epi.offset, .origin = c->y, .pre = c->pre};
    const bool on = p->act != KF_ACTIVATION_NONE || c->epi.p > 0.0f || c->pre;
    call->ep = on ? &call->epi : NULL;
}

/* The kernels, once per arithmetic type: float (storage kinds S, B, H) and double (D). */
#define T float
#define SKL_X(name) name##_s
#define SKL_CK KF__RG_S
#define SKL_GEMM kf__sgemm
#include "sklinear_products.h"
#include "sklinear_teams.h"
#undef T
#undef SKL_X
#undef SKL_CK
#undef SKL_GEMM
#define T double
#define SKL_X(name) name##_d
#define SKL_CK KF__RG_D
#define SKL_GEMM kf__dgemm
#include "sklinear_products.h"
#include "sklinear_teams.h"
#undef T
#undef SKL_X
#undef SKL_CK
#undef SKL_GEMM

/* One thread's share of a call, per storage kind: the arithmetic type's body with the kind a
 * constant (kf__cpu_team runs them). */
static void skl_fwd_team_s(void *arg, int tid, int nth) { skl_fwd_body_s(KF__RG_S, arg, tid, nth); }
static void skl_fwd_team_d(void *arg, int tid, int nth) { skl_fwd_body_d(KF__RG_D, arg, tid, nth); }
static void skl_fwd_team_b(void *arg, int tid, int nth) { skl_fwd_body_s(KF__RG_B, arg, tid, nth); }
static void skl_fwd_team_h(void *arg, int tid, int nth) { skl_fwd_body_s(KF__RG_H, arg, tid, nth); }
static void skl_bwd_team_s(void *arg, int tid, int nth) { skl_bwd_body_s(KF__RG_S, arg, tid, nth); }
static void skl_bwd_team_d(void *arg, int tid, int nth) { skl_bwd_body_d(KF__RG_D, arg, tid, nth); }
static void skl_bwd_team_b(void *arg, int tid, int nth) { skl_bwd_body_s(KF__RG_B, arg, tid, nth); }
static void skl_bwd_team_h(void *arg, int tid, int nth) { skl_bwd_body_s(KF__RG_H, arg, tid, nth); }

/* A call on a team of the size its shape asks, running `team` (one of the above). */
static kf_status skl_run_forward(kf_context *ctx, const kf__skl_fwd *c,
                                 void (*team)(void *, int, int)) {
    skl_fwd_call call;
    skl_fwd_call_init(&call, c);
    kf__cpu_team(skl_team_size(ctx, c->plan, c->N), team, &call);
    return KF_OK;
}
static kf_status skl_run_backward(kf_context *ctx, const kf__skl_bwd *c,
                                  void (*team)(void *, int, int)) {
    skl_bwd_call call = {.c = c, .lo = skl_layout_of(c->plan, c->N)};
    kf__cpu_team(skl_team_size(ctx, c->plan, c->N), team, &call);
    return KF_OK;
}

/* The op tables' entries, one per (instruction set of this build, dtype): each runs its dtype's
 * team functions alone, so no call branches on the dtype or the ISA. */
static kf_status skl_forward_s(kf_context *ctx, const kf__skl_fwd *c) {
    return skl_run_forward(ctx, c, skl_fwd_team_s);
}
static kf_status skl_forward_d(kf_context *ctx, const kf__skl_fwd *c) {
    return skl_run_forward(ctx, c, skl_fwd_team_d);
}
static kf_status skl_forward_b(kf_context *ctx, const kf__skl_fwd *c) {
    return skl_run_forward(ctx, c, skl_fwd_team_b);
}
static kf_status skl_forward_h(kf_context *ctx, const kf__skl_fwd *c) {
    return skl_run_forward(ctx, c, skl_fwd_team_h);
}
static kf_status skl_backward_s(kf_context *ctx, const kf__skl_bwd *c) {
    return skl_run_backward(ctx, c, skl_bwd_team_s);
}
static kf_status skl_backward_d(kf_context *ctx, const kf__skl_bwd *c) {
    return skl_run_backward(ctx, c, skl_bwd_team_d);
}
static kf_status skl_backward_b(kf_context *ctx, const kf__skl_bwd *c) {
    return skl_run_backward(ctx, c, skl_bwd_team_b);
}
static kf_status skl_backward_h(kf_context *ctx, const kf__skl_bwd *c) {
    return skl_run_backward(ctx, c, skl_bwd_team_h);
}

static const kf__skl_ops skl_ops_s = {NULL, skl_workspace, skl_forward_s, skl_backward_s};
static const kf__skl_ops skl_ops_d = {NULL, skl_workspace, skl_forward_d, skl_backward_d};
static const kf__skl_ops skl_ops_b = {NULL, skl_workspace, skl_forward_b, skl_backward_b};
static const kf__skl_ops skl_ops_h = {NULL, skl_workspace, skl_forward_h, skl_backward_h};

/* This build's table for a dtype (the front end has accepted only these four). */
#ifdef KF__SKL_V4
const kf__skl_ops *kf__cpu_skl_ops_v4(kf_dtype dtype)
#else
const kf__skl_ops *kf__cpu_skl_ops_base(kf_dtype dtype)
#endif
{
    return dtype == KF_DTYPE_F64    ? &skl_ops_d
           : dtype == KF_DTYPE_BF16 ? &skl_ops_b
           : dtype == KF_DTYPE_F16  ? &skl_ops_h
                                    : &skl_ops_s;
}

#ifndef KF__SKL_V4
/* The CPU backend's entry: the table of the context's ISA (kf_context.isa, picked at context
 * creation by cpu/isa.c) and the plan's dtype. */
static kf_status skl_select(const struct kf_sklinear_plan *p, const char *fn,
                            const kf__skl_ops **ops) {
#ifdef KF_HAVE_CPU_V4
    if (p->ctx->isa == KF__CPU_ISA_V4) {
        *ops = kf__cpu_skl_ops_v4(p->dtype);
        return KF_OK;
    }
#endif
    *ops = kf__cpu_skl_ops_base(p->dtype);
    return KF_OK;
}

const kf__skl_ops kf__cpu_skl_ops = {skl_select, NULL, NULL, NULL};
#endif

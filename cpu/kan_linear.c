/* CPU backend of the KAN linear layer (notation of core/kan_backend.h; math in
 * docs/ops/kan.md): OpenBLAS from the context's own threads, no allocation. Two algorithms for
 * the same products, chosen per direction from the shape alone (kan_sparse_pick):
 *
 * DENSE. The layer is one product y = A W^T over the combined operand A [N, K] (per feature:
 * SiLU(x) and the C bases) and the combined weight W [out, K], which every call forms once in the
 * workspace. A is never stored for the batch: it is built in per-thread tiles of one block of
 * rows (KF__KAN_ROWS) by one chunk of features (about KF__KAN_COLS columns), stored transposed,
 * A^T [cols, rows], so that the bases are computed by branch-free loops over contiguous rows with
 * the knots as scalars (the compiler vectorises them). Each tile goes through the GEMM at once:
 *   forward   y[rows]     += A_chunk W_chunk^T          (beta = 1 after the first chunk)
 *   dx        dA_chunk     = dy[rows] W_chunk, then dx = SiLU' dA_silu + sum_c B'_c dA_c
 *   weights   dW_chunk    += dy[rows]^T A_chunk          over every row block in order, then
 *             folded into d base_weight, d spline_weight and d spline_scaler
 * The row-wise products are therefore a sum of GEMMs over K chunks rather than one GEMM over
 * all of K: the same work, no slower (the tile stays in L2 between being built and being packed
 * by OpenBLAS; against one GEMM over K = 2304 at (1024, 256, 256) on one thread, the best
 * forward of 30 calls was 17.3-17.4 ms against 17.5-17.9 ms), and the tile stays bounded
 * whatever `in` is (128 x 512 elements instead of 128 x K).
 *
 * WINDOWED. Only k + 1 of a feature's C bases are non-zero at any x (B_{j-k..j} for the span
 * t_j <= x < t_{j+1}; none outside the grid or for NaN), so A is mostly zeros: 1 - (k+2)/(C+1)
 * of the dense multiply-adds (44% at G = 5, k = 3; 64% at G = 10; 79% at G = 20). Per row block
 * and group of KF__KAN_FG features, kan_window finds each (row, feature)'s span by counting
 * knots and evaluates the k + 1 bases (or, for dx, SiLU' and the k + 1 derivatives) by the
 * triangular recurrence, O(k^2) with gathered knots instead of the dense O(C k), moved to a
 * window start s in [0, C - 1 - k] so that all k + 1 columns are real ones. W is packed
 * transposed, W^T [K, outp] in output panels of 64 floats (32 doubles) so that a group's
 * columns for one panel are contiguous and stay in L1. Then, with 8 vectors of 32 bytes of
 * outputs in registers:
 *   forward   y[n, panel] += V_silu W^T[i cw] + sum_t V_t W^T[i cw + 1 + s + t]  over the group
 *   dx        dx[n, i] = dy[n, :] . (SiLU' W^T[i cw] + sum_t B'_t W^T[i cw + 1 + s + t])
 *   weights   dW^T[i cw + c, :] += V_c dy[n, :], each thread owning a chunk of features and
 *             summing over every row block in order; within a block, per feature, the rows are
 *             bucketed by window start (counting sort), so that a bucket's rows all add into the
 *             same k + 2 columns, summed in registers and stored once per bucket; then the fold
 * These do k + 2 of the C + 1 multiply-adds, but each with a load in the forward and dx (no
 * register blocking over rows is possible there: every row has its own window), and the window
 * costs a span count and ~20 gathers per (row, feature) whatever out is. Measured on the AVX2
 * EPYC (2 cores, one thread, process CPU time, best of interleaved runs on a shared box, ms):
 * forward (1024, 1024, 1024) G = 5: 208-298 windowed (median 245 of 15 runs; 212-235 in the 3
 * interleaved with dense ones) vs 268-274 dense, and 244-285 (median 256 of 5) before this
 * file's broadcasts were single loads (a scalar add of 0 went before each); (1024, 256, 256)
 * G = 5: 16-23 windowed vs 16.5-19 dense. Backward with the bucketed weight gradient, G = 5:
 * (1024, 1024, 1024) 620-640 windowed vs 610-655 dense (a draw), (1024, 256, 256) 35-58 vs
 * 33-43; against the row-by-row weight gradient it replaced,
 * (1024, 512, 512) G = 10: 149-161 vs 177-184, G = 20: 176-180 vs 213-232. Earlier (AVX-512
 * box, AVX2 kernels against OpenBLAS's AVX-512 ones): forward (1024, 512, 512) G = 10: 63 vs
 * 104-128 dense, G = 20: 78-82 vs 162-166; at out = 64, G = 10: 13.2 vs 7.7 (the window
 * dominates), out = 128: 13.7 vs 14.3. Hence the rule in kan_sparse_pick.
 *
 * Blocks (row blocks, feature chunks and groups) and therefore every BLAS call and every sum
 * depend on the shape alone; they go round-robin to the threads and every output element has
 * one writer (the weight gradient is split by chunk, each thread summing its chunks over all
 * rows in a fixed order), so the bits do not depend on the thread count.
 *
 * SMALL OUTPUT. A plan with out <= KF__KAN_SMALL_OUT takes an op table of its own at creation
 * (kan_select), whose KANConv2d calls run cpu/kan_small.h instead: windows per input pixel, shared
 * by the kernel positions with the same knots, and the few outputs accumulated in registers, no
 * GEMM (cpu/kan_small_geom.h says why); its KANLinear calls take the two paths above.
 *
 * KANConv2d (kf__kan_patches) is the same product over the patches of x as rows. Only the row
 * blocks' addressing changes: blocks never cross an image (a block is up to 128 output pixels of
 * one image); a block's x^T is gathered from the image (im2col per tile, zeros outside it); its
 * y and dy are the columns [p0, p0 + rows) of the image's [out, Ho Wo] plane, so the GEMMs take
 * them transposed (the windowed path copies them through a [rows, outp] buffer); and dx is a
 * scatter-add over the patches, so one thread owns each image's dx (zeroed first, then summed
 * over the image's blocks in order: deterministic).
 *
 * One implementation for both compute types: the kernels (cpu/kan_tiles.h: the dense path's
 * basis tiles and the moves of rows in and out; cpu/kan_window.h: the windowed path;
 * cpu/kan_forward.h and cpu/kan_backward.h: one thread's share of a call) are included below once
 * for float (suffix _s, BLAS prefix s) and once for double (_d); only exp(-x), the FMA and the
 * gathers differ by type (cpu/kan_cpu.h's *_s and *_d helpers). The storage type (float32,
 * float64, bfloat16, float16) is a constant argument of the force-inlined team bodies; each op
 * table, one per storage type and picked by kan_select at plan creation, names its own short
 * wrappers (kan_forward_b -> kan_fwd_team_b -> kan_fwd_body_s(KAN_B, ...)). */#include "kan_cpu.h"
#include "kan_deriv.h"

/* Windowed (true) or dense, per direction, from the shape alone (so that the bits never depend
 * on the thread count). The windowed products do k + 2 of the C + 1 multiply-adds per (row,
 * feature, output) but with one load per multiply-add, against a register-blocked GEMM on the
 * dense side, and pay a window (span count, gathers) per (row, feature) that only a wide output
 * amortises. Measured on one thread of the 2-core EPYCs (AVX2 kernels against OpenBLAS; header
 * comment): forward, windowed ahead at (C + 1) / (k + 2) = 1.8 (G = 5, k = 3) for out = 1024,
 * a draw at 1.8 for out = 256 and ahead from ~ 2 at out >= 256; backward (with the bucketed
 * weight gradient), a draw at 1.8 for out = 1024 and 256, ahead at 2.8 (G = 10), so the
 * threshold stays at 2.5 (not measured in between); below out = 256 the dense path won at every
 * G measured. */
static bool kan_sparse_pick(const struct kf_kan_linear_plan *p, bool backward) {
    const int64_t ratio10 = 10 * p->cw / (p->k + 2); /* (C + 1) / (k + 2), in tenths */
    if (p->k > KF__KAN_SPARSE_KMAX || p->out < 256) return false;
    if (backward) return ratio10 >= 25;
    return ratio10 >= (p->out >= 512 ? 18 : 20);
}
static kan_geom kan_geom_of(const struct kf_kan_linear_plan *p, int64_t N,
                            const kf__kan_patches *patches, bool backward, kan_kind kind) {
    kan_geom g;
    memset(&g, 0, sizeof g);
    g.L = patches ? patches->Ho * patches->Wo : N;
    g.rows = kan_min(KF__KAN_ROWS, g.L);
    g.bpi = (g.L + g.rows - 1) / g.rows;
    g.blocks = g.bpi * (N / g.L);
    g.unit = patches ? g.bpi : 1;
    g.sparse = kan_sparse_pick(p, backward);
    g.Fr = g.sparse ? kan_min(p->in, KF__KAN_FG) : kan_min(p->in, kan_max(1, KF__KAN_COLS / p->cw));
    g.rchunks = (p->in + g.Fr - 1) / g.Fr;
    g.F = kan_min(kan_min(p->in, kan_max(1, KF__KAN_COLS / p->cw)),
                  (p->in + KF__KAN_MIN_CHUNKS - 1) / KF__KAN_MIN_CHUNKS);
    g.chunks = (p->in + g.F - 1) / g.F;
    /* the forward's multiply-adds, N out K, decide both directions (cpu/team.h) */
    g.team = (int32_t)kan_min(kf__cpu_team_size(p->ctx->num_threads,
                                                (double)N * (double)p->out * (double)p->K),
                              kan_max(g.blocks, g.chunks));
    const size_t e = kind == KAN_D ? sizeof(double) : sizeof(float);
    const int64_t ob = KF__KAN_OB((int64_t)e);
    g.outp = g.sparse ? (p->out + ob - 1) / ob * ob : p->out;
    g.Fw = kan_max(g.Fr, g.F);
    const int64_t wcols = g.sparse ? g.outp : p->out; /* W [out, K], or W^T [K, outp] */
    g.wc = 0;
    g.inv = kf__align_up((size_t)(wcols * p->K) * e);
    g.grid = g.inv + kf__align_up((size_t)(p->in * p->k * p->nk) * e);
    g.thr = g.grid + kf__align_up((size_t)(p->in * p->nk) * e);
    /* a thread's region: the tile (dense: A^T [Fr cw, rows]; windowed: y or dy [rows, outp]),
     * the weight-gradient accumulator (dense: [out, F cw]; windowed: [F cw, outp]), x^T and
     * dx^T, then the dense path's bases and clamped x or the windowed path's windows */
    g.tile = 0;
    g.dw = kf__align_up((size_t)(g.sparse ? g.rows * g.outp : g.rows * g.Fr * p->cw) * e);
    g.xt = g.dw + kf__align_up((size_t)(wcols * g.F * p->cw) * e);
    g.dxt = g.xt + kf__align_up((size_t)(g.rows * g.Fw) * e);
    g.s = g.dxt + kf__align_up((size_t)(g.rows * g.Fr) * e);
    if (g.sparse) {
        g.vals = g.s;
        g.sidx = g.vals + kf__align_up((size_t)(g.rows * g.Fw * (p->k + 2)) * e);
        g.win = g.sidx + kf__align_up((size_t)(g.rows * g.Fw) * sizeof(int32_t));
        const int64_t rl = (g.rows + 7) / 8 * 8; /* rows in whole vectors */
        g.ints = g.win + kf__align_up((size_t)((p->k + 2) * (g.rows + rl)) * e);
        g.part = g.ints + kf__align_up((size_t)(3 * rl + p->cw) * sizeof(int32_t));
        g.off = g.part + (size_t)(g.rows * g.Fr) * 32; /* 32-byte vectors */
    } else {
        g.xb = g.s + kf__align_up((size_t)(g.rows * (p->nk - 1)) * e);
        g.off = g.xb + kf__align_up((size_t)g.rows * e);
    }
    /* a low plan's buffers, in T: y or dy of a block for the dense products, and (KANConv2d's
     * backward) the dx of the image in hand, whose patches add into it */
    const bool low = kind == KAN_B || kind == KAN_H;
    g.yb = g.off + (patches ? kf__align_up((size_t)(g.rows * patches->kh * patches->kw) *
                                           sizeof(int64_t))
                            : 0);
    g.dxi = g.yb + (low && !g.sparse ? kf__align_up((size_t)(g.rows * p->out) * e) : 0);
    g.thr_bytes = g.dxi + (low && patches && backward
                               ? kf__align_up((size_t)(patches->Cin * patches->H * patches->W) * e)
                               : 0);
    g.bytes = g.thr + (size_t)g.team * g.thr_bytes;
    return g;
}

#include "kan_small_geom.h"

/* The larger of the two directions' workspaces; `small`: a small-output plan's KANConv2d call
 * (cpu/kan_small_geom.h). */
static size_t kan_workspace(const struct kf_kan_linear_plan *p, int64_t N,
                            const kf__kan_patches *patches, kan_kind kind, bool small) {
    small = small && kan_small_fits(p, patches);
    const size_t f = small ? kan_sgeom_of(p, N, patches, false, kind).bytes
                           : kan_geom_of(p, N, patches, false, kind).bytes,
                 b = small ? kan_sgeom_of(p, N, patches, true, kind).bytes
                           : kan_geom_of(p, N, patches, true, kind).bytes,
                 d = patches ? 0 : kf__kan_deriv_workspace(p, N); /* the order-m path's */
    const size_t fb = f > b ? f : b;
    return fb > d ? fb : d;
}

/* The kernels, once per compute type: float (storage kinds KAN_S, KAN_B, KAN_H) and double
 * (KAN_D). */
#define T float
#define VEC kf__vs
#define VI kan_vis
#define KAN_X(name) name##_s
#define KAN_GEMM kf__sgemm
#define KAN_ROWGEMM kf__rowgemm_sss
#include "kan_tiles.h"
#include "kan_window.h"
#include "kan_forward.h"
#include "kan_backward.h"
#include "kan_small.h"
#undef T
#undef VEC
#undef VI
#undef KAN_X
#undef KAN_GEMM
#undef KAN_ROWGEMM
#define T double
#define VEC kf__vd
#define VI kan_vid
#define KAN_X(name) name##_d
#define KAN_GEMM kf__dgemm
#define KAN_ROWGEMM kf__rowgemm_ddd
#include "kan_tiles.h"
#include "kan_window.h"
#include "kan_forward.h"
#include "kan_backward.h"
#include "kan_small.h"
#undef T
#undef VEC
#undef VI
#undef KAN_X
#undef KAN_GEMM
#undef KAN_ROWGEMM

/* One thread's share of a call, per storage kind: the compute type's body with the kind a
 * constant (kf__cpu_team runs them). */
static void kan_fwd_team_s(void *arg, int tid, int nth) { kan_fwd_body_s(KAN_S, arg, tid, nth); }
static void kan_fwd_team_d(void *arg, int tid, int nth) { kan_fwd_body_d(KAN_D, arg, tid, nth); }
static void kan_fwd_team_b(void *arg, int tid, int nth) { kan_fwd_body_s(KAN_B, arg, tid, nth); }
static void kan_fwd_team_h(void *arg, int tid, int nth) { kan_fwd_body_s(KAN_H, arg, tid, nth); }
static void kan_bwd_team_s(void *arg, int tid, int nth) { kan_bwd_body_s(KAN_S, arg, tid, nth); }
static void kan_bwd_team_d(void *arg, int tid, int nth) { kan_bwd_body_d(KAN_D, arg, tid, nth); }
static void kan_bwd_team_b(void *arg, int tid, int nth) { kan_bwd_body_s(KAN_B, arg, tid, nth); }
static void kan_bwd_team_h(void *arg, int tid, int nth) { kan_bwd_body_s(KAN_H, arg, tid, nth); }
static void kan_sfwd_team_s(void *arg, int tid, int nth) {
    kan_small_fwd_body_s(KAN_S, arg, tid, nth);
}
static void kan_sfwd_team_d(void *arg, int tid, int nth) {
    kan_small_fwd_body_d(KAN_D, arg, tid, nth);
}
static void kan_sfwd_team_b(void *arg, int tid, int nth) {
    kan_small_fwd_body_s(KAN_B, arg, tid, nth);
}
static void kan_sfwd_team_h(void *arg, int tid, int nth) {
    kan_small_fwd_body_s(KAN_H, arg, tid, nth);
}
static void kan_sbwd_team_s(void *arg, int tid, int nth) {
    kan_small_bwd_body_s(KAN_S, arg, tid, nth);
}
static void kan_sbwd_team_d(void *arg, int tid, int nth) {
    kan_small_bwd_body_d(KAN_D, arg, tid, nth);
}
static void kan_sbwd_team_b(void *arg, int tid, int nth) {
    kan_small_bwd_body_s(KAN_B, arg, tid, nth);
}
static void kan_sbwd_team_h(void *arg, int tid, int nth) {
    kan_small_bwd_body_s(KAN_H, arg, tid, nth);
}

/* A call on one thread team: the kan_fwd_team_* or kan_bwd_team_* of the table's storage kind,
 * or for a KANConv2d call of a small-output plan its kan_sfwd_team_* or kan_sbwd_team_* (`small`:
 * NULL in the general tables), or, for a call at a derivative order or with an input weight, the
 * order-m path (cpu/kan_deriv.c; the one place the choice is made). */
static kf_status kan_run_forward(const kf__kan_fwd *c, kan_kind kind,
                                 void (*team)(void *, int, int),
                                 void (*small)(void *, int, int)) {
    if (kf__kan_is_deriv_fwd(c)) return kf__kan_deriv_forward(c);
    if (small && c->patches && kan_small_fits(c->plan, c->patches)) {
        kan_sfwd_call call = {.c = c, .g = kan_sgeom_of(c->plan, c->N, c->patches, false, kind)};
        kf__cpu_team(call.g.team, small, &call);
        return KF_OK;
    }
    kan_fwd_call call = {.c = c, .g = kan_geom_of(c->plan, c->N, c->patches, false, kind)};
    kf__cpu_team(call.g.team, team, &call);
    return KF_OK;
}

static kf_status kan_run_backward(const kf__kan_bwd *c, kan_kind kind,
                                  void (*team)(void *, int, int),
                                  void (*small)(void *, int, int)) {
    if (kf__kan_is_deriv_bwd(c)) return kf__kan_deriv_backward(c);
    if (small && c->patches && kan_small_fits(c->plan, c->patches)) {
        kan_sbwd_call call = {.c = c, .g = kan_sgeom_of(c->plan, c->N, c->patches, true, kind)};
        kf__cpu_team(call.g.team, small, &call);
        return KF_OK;
    }
    kan_bwd_call call = {.c = c, .g = kan_geom_of(c->plan, c->N, c->patches, true, kind)};
    kf__cpu_team(call.g.team, team, &call);
    return KF_OK;
}

/* Two op tables per storage kind, the general one and the small-output one (kan_select), their
 * entries named by the kind's suffix (_small_: the small-output table). */
static size_t kan_workspace_s(const struct kf_kan_linear_plan *p, int64_t N,
                              const kf__kan_patches *patches) {
    return kan_workspace(p, N, patches, KAN_S, false);
}
static size_t kan_workspace_small_s(const struct kf_kan_linear_plan *p, int64_t N,
                                    const kf__kan_patches *patches) {
    return kan_workspace(p, N, patches, KAN_S, patches != NULL);
}
static size_t kan_workspace_d(const struct kf_kan_linear_plan *p, int64_t N,
                              const kf__kan_patches *patches) {
    return kan_workspace(p, N, patches, KAN_D, false);
}
static size_t kan_workspace_small_d(const struct kf_kan_linear_plan *p, int64_t N,
                                    const kf__kan_patches *patches) {
    return kan_workspace(p, N, patches, KAN_D, patches != NULL);
}
static size_t kan_workspace_b(const struct kf_kan_linear_plan *p, int64_t N,
                              const kf__kan_patches *patches) {
    return kan_workspace(p, N, patches, KAN_B, false);
}
static size_t kan_workspace_small_b(const struct kf_kan_linear_plan *p, int64_t N,
                                    const kf__kan_patches *patches) {
    return kan_workspace(p, N, patches, KAN_B, patches != NULL);
}
static size_t kan_workspace_h(const struct kf_kan_linear_plan *p, int64_t N,
                              const kf__kan_patches *patches) {
    return kan_workspace(p, N, patches, KAN_H, false);
}
static size_t kan_workspace_small_h(const struct kf_kan_linear_plan *p, int64_t N,
                                    const kf__kan_patches *patches) {
    return kan_workspace(p, N, patches, KAN_H, patches != NULL);
}
static kf_status kan_forward_s(kf_context *ctx, const kf__kan_fwd *c) {
    return kan_run_forward(c, KAN_S, kan_fwd_team_s, NULL);
}
static kf_status kan_forward_small_s(kf_context *ctx, const kf__kan_fwd *c) {
    return kan_run_forward(c, KAN_S, kan_fwd_team_s, kan_sfwd_team_s);
}
static kf_status kan_forward_d(kf_context *ctx, const kf__kan_fwd *c) {
    return kan_run_forward(c, KAN_D, kan_fwd_team_d, NULL);
}
static kf_status kan_forward_small_d(kf_context *ctx, const kf__kan_fwd *c) {
    return kan_run_forward(c, KAN_D, kan_fwd_team_d, kan_sfwd_team_d);
}
static kf_status kan_forward_b(kf_context *ctx, const kf__kan_fwd *c) {
    return kan_run_forward(c, KAN_B, kan_fwd_team_b, NULL);
}
static kf_status kan_forward_small_b(kf_context *ctx, const kf__kan_fwd *c) {
    return kan_run_forward(c, KAN_B, kan_fwd_team_b, kan_sfwd_team_b);
}
static kf_status kan_forward_h(kf_context *ctx, const kf__kan_fwd *c) {
    return kan_run_forward(c, KAN_H, kan_fwd_team_h, NULL);
}
static kf_status kan_forward_small_h(kf_context *ctx, const kf__kan_fwd *c) {
    return kan_run_forward(c, KAN_H, kan_fwd_team_h, kan_sfwd_team_h);
}
static kf_status kan_backward_s(kf_context *ctx, const kf__kan_bwd *c) {
    return kan_run_backward(c, KAN_S, kan_bwd_team_s, NULL);
}
static kf_status kan_backward_small_s(kf_context *ctx, const kf__kan_bwd *c) {
    return kan_run_backward(c, KAN_S, kan_bwd_team_s, kan_sbwd_team_s);
}
static kf_status kan_backward_d(kf_context *ctx, const kf__kan_bwd *c) {
    return kan_run_backward(c, KAN_D, kan_bwd_team_d, NULL);
}
static kf_status kan_backward_small_d(kf_context *ctx, const kf__kan_bwd *c) {
    return kan_run_backward(c, KAN_D, kan_bwd_team_d, kan_sbwd_team_d);
}
static kf_status kan_backward_b(kf_context *ctx, const kf__kan_bwd *c) {
    return kan_run_backward(c, KAN_B, kan_bwd_team_b, NULL);
}
static kf_status kan_backward_small_b(kf_context *ctx, const kf__kan_bwd *c) {
    return kan_run_backward(c, KAN_B, kan_bwd_team_b, kan_sbwd_team_b);
}
static kf_status kan_backward_h(kf_context *ctx, const kf__kan_bwd *c) {
    return kan_run_backward(c, KAN_H, kan_bwd_team_h, NULL);
}
static kf_status kan_backward_small_h(kf_context *ctx, const kf__kan_bwd *c) {
    return kan_run_backward(c, KAN_H, kan_bwd_team_h, kan_sbwd_team_h);
}
static const kf__kan_ops kan_ops_s = {NULL, kan_workspace_s, kan_forward_s, kan_backward_s};
static const kf__kan_ops kan_ops_small_s = {NULL, kan_workspace_small_s, kan_forward_small_s,
                                           kan_backward_small_s};
static const kf__kan_ops kan_ops_d = {NULL, kan_workspace_d, kan_forward_d, kan_backward_d};
static const kf__kan_ops kan_ops_small_d = {NULL, kan_workspace_small_d, kan_forward_small_d,
                                           kan_backward_small_d};
static const kf__kan_ops kan_ops_b = {NULL, kan_workspace_b, kan_forward_b, kan_backward_b};
static const kf__kan_ops kan_ops_small_b = {NULL, kan_workspace_small_b, kan_forward_small_b,
                                           kan_backward_small_b};
static const kf__kan_ops kan_ops_h = {NULL, kan_workspace_h, kan_forward_h, kan_backward_h};
static const kf__kan_ops kan_ops_small_h = {NULL, kan_workspace_small_h, kan_forward_small_h,
                                           kan_backward_small_h};

/* The table of the plan's dtype, once, at plan creation (every dtype and spline order served):
 * the small-output one up to KF__KAN_SMALL_OUT outputs (its KANConv2d calls take
 * cpu/kan_small.h's kernels; its KANLinear calls the general ones). */
static kf_status kan_select(const struct kf_kan_linear_plan *p, const char *fn,
                            const kf__kan_ops **ops) {
    const bool small = p->out <= KF__KAN_SMALL_OUT && p->k <= KF__KAN_SPARSE_KMAX;
    switch (p->dtype) {
    case KF_DTYPE_F64: *ops = small ? &kan_ops_small_d : &kan_ops_d; break;
    case KF_DTYPE_BF16: *ops = small ? &kan_ops_small_b : &kan_ops_b; break;
    case KF_DTYPE_F16: *ops = small ? &kan_ops_small_h : &kan_ops_h; break;
    default: *ops = small ? &kan_ops_small_s : &kan_ops_s; break;
    }
    return KF_OK;
}

const kf__kan_ops kf__cpu_kan_ops = {kan_select, NULL, NULL, NULL};


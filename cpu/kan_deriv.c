/* The CPU KAN layer's order-m path (cpu/kan_deriv.h; math in docs/ops/kan.md, "Derivatives"):
 * the forward y = sum_i w phi^(m)(x) and its backward (dx = w G_{m+1}, dw = G_m, the parameter
 * gradients H_m) for KANLinear rows, float32 and float64. It serves the second and third
 * derivatives of the torch front end (kfuse.torch's double backward; three or more calls per
 * PINN training step): dense transposed tiles of the order-m operand (kf__bspline_deriv_rows,
 * SiLU^(m) by common/silu_deriv.h's polynomials formed once per call) through the GEMM, as the
 * m = 0 dense path does, in row blocks of KD_ROWS by feature chunks of about KD_COLS columns:
 *   forward     y[rows]   += A_chunk W_chunk^T
 *   backward    per unit (slab of row blocks, chunk), per block:
 *               dA^T = W_chunk^T dy^T, then per feature the contraction with the values at
 *               order m (dw) and m + 1 (dx, times w); the order-m bases also fill the tile A
 *               for the parameters:  partial_slab += dy[rows]^T A_chunk
 *               then the partials summed in slab order and folded into base, spline and scaler
 * Units go round-robin to the threads, so a layer of one chunk (in * cw <= KD_COLS) still splits
 * its rows. Blocks, chunks, slabs and the order of every sum depend on the shape alone, so the
 * bits do not depend on the thread count. O(N in (C k + out)) work; workspace bounded by the
 * tiles, W and the partials (KD_PART_BYTES). */
#include "kan_deriv.h"

#include "blas.h"
#include "bspline.h"
#include "silu_deriv.h"
#include "team.h"

#include <string.h>

#define KD_ROWS 128
#define KD_COLS 512
/* The parameter gradients' row split: about KD_UNITS (slab, chunk) units, each slab's partial
 * dW [out, K] in the workspace, KD_PART_BYTES of them at most (fewer slabs for a wide layer). */
#define KD_UNITS 16
#define KD_PART_BYTES ((size_t)4 << 20)

static int64_t kan_min(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t kan_max(int64_t a, int64_t b) { return a > b ? a : b; }

/* The call's blocking and workspace layout (byte offsets; each sub-buffer 64-aligned): W [out, K]
 * at 0, the slabs' partial dW [slabs, out, K] at part, then per thread from thr: the tile
 * [Fc cw, R] (at), dA^T [Fc cw, R] (d), the bases S [nk - 1, R] (s), x scratch, x and w columns
 * and SiLU at orders m and m + 1 [R] (xs, xc, wc, sm, sm1), knot reciprocals [k nk] (inv). A slab
 * is spb consecutive row blocks; each partial takes `slab` bytes. */
typedef struct kd_geom {
    int64_t R, blocks, Fc, chunks, spb, slabs;
    int32_t team;
    size_t slab, part, thr, thr_bytes, at, d, s, xs, xc, wc, sm, sm1, inv, bytes;
} kd_geom;

static kd_geom kd_geom_of(const struct kf_kan_linear_plan *p, int64_t N) {
    const size_t e = p->dtype == KF_DTYPE_F64 ? sizeof(double) : sizeof(float);
    const size_t R_bytes = kf__align_up((size_t)kan_min(KD_ROWS, N) * e);
    const size_t tile = kf__align_up((size_t)(kan_min(p->in, kan_max(KD_COLS / p->cw, 1)) *
                                              p->cw * kan_min(KD_ROWS, N)) * e);
    const size_t slab_bytes = kf__align_up((size_t)(p->out * p->K) * e);
    kd_geom g;
    memset(&g, 0, sizeof g);
    g.R = kan_min(KD_ROWS, N);
    g.blocks = (N + g.R - 1) / g.R;
    g.Fc = kan_min(p->in, kan_max(KD_COLS / p->cw, 1));
    g.chunks = (p->in + g.Fc - 1) / g.Fc;
    const int64_t want = kan_min(g.blocks, (KD_UNITS + g.chunks - 1) / g.chunks);
    g.slabs = kan_max(1, kan_min(want, (int64_t)(KD_PART_BYTES / slab_bytes)));
    g.spb = (g.blocks + g.slabs - 1) / g.slabs;
    g.slabs = (g.blocks + g.spb - 1) / g.spb;
    g.team = (int32_t)kan_min(kf__cpu_team_size(p->ctx->num_threads,
                                                (double)N * (double)p->out * (double)p->K),
                              g.blocks * g.chunks);
    g.slab = slab_bytes;
    g.part = slab_bytes;
    g.thr = g.part + (size_t)g.slabs * slab_bytes;
    g.at = 0;
    g.d = g.at + tile;
    g.s = g.d + tile;
    g.xs = g.s + kf__align_up((size_t)((p->nk - 1) * g.R) * e);
    g.xc = g.xs + R_bytes;
    g.wc = g.xc + R_bytes;
    g.sm = g.wc + R_bytes;
    g.sm1 = g.sm + R_bytes;
    g.inv = g.sm1 + R_bytes;
    g.thr_bytes = g.inv + kf__align_up((size_t)(p->k * p->nk) * e + 1);
    g.bytes = g.thr + (size_t)g.team * g.thr_bytes;
    return g;
}

/* One call: the record, its tensors as the kernels read them, the blocking, SiLU's polynomials
 * at orders m and m + 1 (formed once per call) and the team's barrier. */
typedef struct kd_call {
    const kf__kan_fwd *fwd;
    const kf__kan_bwd *bwd;
    const void *x, *w, *grid;
    kd_geom g;
    kf__silu_order silu, silu1;
    kf__cpu_barrier bar;
} kd_call;

#define T float
#define KD_X(name) name##_s
#define KD_GEMM kf__sgemm
#include "kan_deriv_body.h"
#undef T
#undef KD_X
#undef KD_GEMM
#define T double
#define KD_X(name) name##_d
#define KD_GEMM kf__dgemm
#include "kan_deriv_body.h"
#undef T
#undef KD_X
#undef KD_GEMM

size_t kf__kan_deriv_workspace(const struct kf_kan_linear_plan *p, int64_t N) {
    if (p->dtype != KF_DTYPE_F32 && p->dtype != KF_DTYPE_F64) return 0;
    return kd_geom_of(p, N).bytes;
}

/* The call record of N rows at order m. */
static kd_call kd_call_of(const struct kf_kan_linear_plan *p, int64_t N, int64_t m) {
    kd_call q;
    memset(&q, 0, sizeof q);
    q.g = kd_geom_of(p, N);
    q.silu = kf__silu_order_of((int)m);
    q.silu1 = kf__silu_order_of((int)m + 1);
    return q;
}

kf_status kf__kan_deriv_forward(const kf__kan_fwd *c) {
    kd_call q = kd_call_of(c->plan, c->N, c->order);
    q.fwd = c, q.x = c->x, q.w = c->w, q.grid = c->grid;
    kf__cpu_team(q.g.team, c->plan->dtype == KF_DTYPE_F64 ? kd_fwd_team_d : kd_fwd_team_s, &q);
    return KF_OK;
}

kf_status kf__kan_deriv_backward(const kf__kan_bwd *c) {
    kd_call q = kd_call_of(c->plan, c->N, c->order);
    q.bwd = c, q.x = c->x, q.w = c->w, q.grid = c->grid;
    kf__cpu_team(q.g.team, c->plan->dtype == KF_DTYPE_F64 ? kd_bwd_team_d : kd_bwd_team_s, &q);
    return KF_OK;
}

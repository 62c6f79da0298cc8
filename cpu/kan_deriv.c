/* The CPU KAN layer's order-m path (cpu/kan_deriv.h; math in docs/ops/kan.md, "Derivatives"):
 * the forward y = sum_i w phi^(m)(x) and its backward (dx = w G_{m+1}, dw = G_m, the parameter
 * gradients H_m) for KANLinear rows, float32 and float64. It serves the second and third
 * derivatives of the torch front end (kfuse.torch's double backward), so it favours being simple
 * and obviously right over the m = 0 paths' speed: dense transposed tiles of the order-m
 * operand (kf__bspline_deriv_rows, kf__silu_deriv) through the GEMM, as the m = 0 dense path
 * does, in row blocks of KD_ROWS by feature chunks of about KD_COLS columns:
 *   forward     y[rows]   += A_chunk W_chunk^T
 *   dx, dw      dA^T       = W_chunk^T dy^T, then per feature the contraction with the values
 *                            at order m + 1 (dx, times w) and m (dw)
 *   parameters  dW_chunk  += dy[rows]^T A_chunk  per chunk (one thread each) over every row
 *                            block in order, then folded into base, spline and scaler
 * The tiles are built twice in a backward that wants both kinds of output (once per pass):
 * O(N in (C k + out)) work either way, workspaces bounded by the tiles and W. Blocks and chunks
 * depend on the shape alone, so the bits do not depend on the thread count. */
#include "kan_deriv.h"

#include "blas.h"
#include "bspline.h"
#include "silu_deriv.h"
#include "team.h"

#include <string.h>

#define KD_ROWS 128
#define KD_COLS 512

static int64_t kan_min(int64_t a, int64_t b) { return a < b ? a : b; }

/* The call's blocking and workspace layout (byte offsets; each sub-buffer 64-aligned): W [out, K]
 * at 0, then per thread from thr: the tile [Fc cw, R] (at), dW [out, Fc cw] (dw), the bases
 * S [nk - 1, R] (s), x scratch, x and w columns [R] (xs, xc, wc), knot reciprocals [k nk] (inv). */
typedef struct kd_geom {
    int64_t R, blocks, Fc, chunks;
    int32_t team;
    size_t thr, thr_bytes, at, dw, s, xs, xc, wc, inv, bytes;
} kd_geom;

static kd_geom kd_geom_of(const struct kf_kan_linear_plan *p, int64_t N) {
    const size_t e = p->dtype == KF_DTYPE_F64 ? sizeof(double) : sizeof(float);
    kd_geom g;
    memset(&g, 0, sizeof g);
    g.R = kan_min(KD_ROWS, N);
    g.blocks = (N + g.R - 1) / g.R;
    g.Fc = kan_min(p->in, KD_COLS / p->cw > 1 ? KD_COLS / p->cw : 1);
    g.chunks = (p->in + g.Fc - 1) / g.Fc;
    const int64_t most = g.blocks > g.chunks ? g.blocks : g.chunks;
    g.team = (int32_t)kan_min(kf__cpu_team_size(p->ctx->num_threads,
                                                (double)N * (double)p->out * (double)p->K),
                              most);
    g.thr = kf__align_up((size_t)(p->out * p->K) * e);
    g.at = 0;
    g.dw = g.at + kf__align_up((size_t)(g.Fc * p->cw * g.R) * e);
    g.s = g.dw + kf__align_up((size_t)(p->out * g.Fc * p->cw) * e);
    g.xs = g.s + kf__align_up((size_t)((p->nk - 1) * g.R) * e);
    g.xc = g.xs + kf__align_up((size_t)g.R * e);
    g.wc = g.xc + kf__align_up((size_t)g.R * e);
    g.inv = g.wc + kf__align_up((size_t)g.R * e);
    g.thr_bytes = g.inv + kf__align_up((size_t)(p->k * p->nk) * e + 1);
    g.bytes = g.thr + (size_t)g.team * g.thr_bytes;
    return g;
}

/* One call: the record, its tensors as the kernels read them and the blocking. */
typedef struct kd_call {
    const kf__kan_fwd *fwd;
    const kf__kan_bwd *bwd;
    const void *x, *w, *grid;
    kd_geom g;
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

kf_status kf__kan_deriv_forward(const kf__kan_fwd *c) {
    kd_call q = {.fwd = c, .x = c->x, .w = c->w, .grid = c->grid,
                 .g = kd_geom_of(c->plan, c->N)};
    kf__cpu_team(q.g.team, c->plan->dtype == KF_DTYPE_F64 ? kd_fwd_team_d : kd_fwd_team_s, &q);
    return KF_OK;
}

kf_status kf__kan_deriv_backward(const kf__kan_bwd *c) {
    kd_call q = {.bwd = c, .x = c->x, .w = c->w, .grid = c->grid,
                 .g = kd_geom_of(c->plan, c->N)};
    kf__cpu_team(q.g.team, c->plan->dtype == KF_DTYPE_F64 ? kd_bwd_team_d : kd_bwd_team_s, &q);
    return KF_OK;
}

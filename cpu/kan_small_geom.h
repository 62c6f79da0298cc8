/* The small-output KANConv2d path's call geometry (kernels: cpu/kan_small.h; chosen at plan
 * creation by cpu/kan_linear.c's kan_select for out <= KF__KAN_SMALL_OUT). Included once, from
 * cpu/kan_linear.c, after cpu/kan_cpu.h.
 *
 * Why a path of its own: with a few outputs (the Convolutional-KAN paper's KKAN has 5) a patch
 * feature's C + 1 columns feed only out multiply-adds each, so the dense path's cost is building
 * every basis of every (patch, feature), not the product. Here only the k + 1 bases that can be
 * non-zero are evaluated (cpu/kan_window.h's kan_window), once per input pixel and distinct knot
 * row rather than once per patch and feature: the kh kw features of one input channel read the
 * same pixels, and where they share their knots (the grid as created, and after a refit over a
 * shared range) one table of windows serves all of them, kh kw times fewer bases for a stride-1
 * kernel. The outputs, padded to whole vectors (op), stay in registers while a patch's features
 * add into them. */
#ifndef KF_CPU_KAN_SMALL_GEOM_H
#define KF_CPU_KAN_SMALL_GEOM_H

/* Outputs up to which a plan takes this path (KANConv2d calls; KANLinear calls of the same plan
 * take the general one): two vectors of floats, four of doubles. */
#define KF__KAN_SMALL_OUT 16

/* Image groups of the backward's weight gradient (each its own accumulator, summed in group
 * order: cpu/kan_small.h's kan_small_bwd_body), whatever the batch, so that the workspace does
 * not depend on it (a group may hold no image). */
#define KF__KAN_SMALL_GROUPS 8

/* Workspace (each term rounded up to 64 bytes; e the compute type's size, L = 32 / e lanes,
 * op = out rounded up to L, kk = kh kw, P = Ho Wo, X = H W + 1: an image plane and one entry for
 * the padding's x = 0, R = KF__KAN_ROWS, ng = KF__KAN_SMALL_GROUPS):
 *   shared     e in cw op (packed weight [in, cw, op]) + e in nk (knots) + e in k nk (reciprocals)
 *              + backward: e ng in cw op (the groups' weight gradients)
 *   per thread 8 kk P (patch offsets [kk, P]) + 4 in (tab: table of each feature)
 *              + e kk X (k+2) + 4 kk X (window values [kk, X, k+2] and starts [kk, X])
 *              + e X (the channel's plane in T) + e (k+2) R + e (2k+3) R + 4 3R (kan_window's
 *                output and scratch)
 *              + e P op (y or dy^T of the image, [P, op])
 *              + backward: e kk X (k+2) (the derivatives' windows) + e X L (dx partial sums, a
 *                vector per pixel [X, L]) + e Cin H W (a low plan's dx image)
 * bounded by one image and the weights, never by the batch. */
typedef struct kan_sgeom {
    int64_t op, kk, P, X, groups; /* padded outputs, features per channel, pixels out, table
                                     rows, image groups (backward) */
    int32_t team;
    size_t inv, grid, dwg, thr, thr_bytes; /* shared offsets; thread 0's region and each size */
    size_t off, tab, vals, dvals, st, xc, win, scr, ints, acc, dxv, dxi; /* in a region */
    size_t bytes;
} kan_sgeom;

static kan_sgeom kan_sgeom_of(const struct kf_kan_linear_plan *p, int64_t N,
                              const kf__kan_patches *P, bool backward, kan_kind kind) {
    kan_sgeom g;
    memset(&g, 0, sizeof g);
    const size_t e = kind == KAN_D ? sizeof(double) : sizeof(float);
    const int64_t L = 32 / (int64_t)e, k2 = p->k + 2, R = KF__KAN_ROWS;
    g.op = (p->out + L - 1) / L * L;
    g.kk = (int64_t)P->kh * P->kw;
    g.P = P->Ho * P->Wo;
    g.X = P->H * P->W + 1;
    g.groups = KF__KAN_SMALL_GROUPS;
    /* images split the forward and the backward's groups, features the backward's reduction */
    g.team = (int32_t)kan_min(kf__cpu_team_size(p->ctx->num_threads,
                                                (double)N * (double)p->out * (double)p->K),
                              kan_max(P->B, p->in));
    g.inv = kf__align_up((size_t)(p->in * p->cw * g.op) * e);
    g.grid = g.inv + kf__align_up((size_t)(p->in * p->k * p->nk) * e);
    g.dwg = g.grid + kf__align_up((size_t)(p->in * p->nk) * e);
    g.thr = g.dwg + (backward ? kf__align_up((size_t)(g.groups * p->in * p->cw * g.op) * e) : 0);
    g.off = 0;
    g.tab = g.off + kf__align_up((size_t)(g.kk * g.P) * sizeof(int64_t));
    g.vals = g.tab + kf__align_up((size_t)p->in * sizeof(int32_t));
    g.st = g.vals + kf__align_up((size_t)(g.kk * g.X * k2) * e);
    g.xc = g.st + kf__align_up((size_t)(g.kk * g.X) * sizeof(int32_t));
    g.win = g.xc + kf__align_up((size_t)g.X * e);
    g.scr = g.win + kf__align_up((size_t)(2 * k2 * R) * e);
    g.ints = g.scr + kf__align_up((size_t)((2 * p->k + 3) * R) * e);
    g.acc = g.ints + kf__align_up((size_t)(3 * R) * sizeof(int32_t));
    g.dvals = g.acc + kf__align_up((size_t)(g.P * g.op) * e);
    g.dxv = g.dvals + (backward ? kf__align_up((size_t)(g.kk * g.X * k2) * e) : 0);
    g.dxi = g.dxv + (backward ? kf__align_up((size_t)(g.X * L) * e) : 0);
    g.thr_bytes = g.dxi + (backward && !kan_direct(kind)
                               ? kf__align_up((size_t)(P->Cin * P->H * P->W) * e)
                               : 0);
    g.bytes = g.thr + (size_t)g.team * g.thr_bytes;
    return g;
}

/* Whether a call's images fit the small path's per-image tables: every size kan_sgeom_of forms
 * stays below 2^46 bytes, so none of its int64 products can overflow; a call that does not fit
 * takes the general path (its workspace and its run ask the same). A fuzzed image of 2^62 pixels
 * overflowed here. */
static inline bool kan_small_fits(const struct kf_kan_linear_plan *p,
                                  const kf__kan_patches *P) {
    const double lim = 70368744177664.0; /* 2^46 */
    const double X = (double)P->H * (double)P->W + 1, kk = (double)P->kh * (double)P->kw,
                 np = (double)P->Ho * (double)P->Wo, k2 = (double)p->k + 2,
                 op = (double)p->out + 8;
    return kk * X * k2 * 8 < lim && kk * np * 8 < lim && np * op * 8 < lim &&
           (double)P->Cin * X * 8 < lim;
}

typedef struct kan_sfwd_call {
    const kf__kan_fwd *c;
    kan_sgeom g;
} kan_sfwd_call;

typedef struct kan_sbwd_call {
    const kf__kan_bwd *c;
    kan_sgeom g;
} kan_sbwd_call;

#endif /* KF_CPU_KAN_SMALL_GEOM_H */

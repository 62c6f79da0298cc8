/* The CPU KAN layer's order-m path (docs/ops/kan.md, "Derivatives"): KANLinear's forward and
 * backward at a derivative order m and with an optional per-element input weight w, for float32
 * and float64 plans. cpu/kan_linear.c sends a call here when its record asks for either (m != 0,
 * w or dw given) and keeps its own m = 0 paths otherwise; the front end has checked the order's
 * bounds and the dtype. */
#ifndef KF_CPU_KAN_DERIV_H
#define KF_CPU_KAN_DERIV_H

#include "kan_backend.h"

/* Whether a record takes this path. */
static inline bool kf__kan_is_deriv_fwd(const kf__kan_fwd *c) { return c->order != 0 || c->w; }
static inline bool kf__kan_is_deriv_bwd(const kf__kan_bwd *c) {
    return c->order != 0 || c->w || c->dw;
}

/* Workspace bytes of the path for N rows (both directions; 0 for a bfloat16 or float16 plan,
 * which it does not serve). */
size_t kf__kan_deriv_workspace(const struct kf_kan_linear_plan *p, int64_t N);
/* y = sum_i w phi^(m)(x) for every row. */
kf_status kf__kan_deriv_forward(const kf__kan_fwd *c);
/* dx = w G_{m+1}, dw = G_m and the parameter gradients of the order-m forward. */
kf_status kf__kan_deriv_backward(const kf__kan_bwd *c);

#endif /* KF_CPU_KAN_DERIV_H */

/* The four gradients of a KAN layer (dx, d base_weight, d spline_weight, d spline_scaler) as the
 * CPU KAN tests (test_kan_linear.c, test_kan_conv2d.c) hold them, and the checks both make of
 * them against the float64 reference. Header-only, like kf_test.h. */
#ifndef KF_TESTS_KAN_GRADS_H
#define KF_TESTS_KAN_GRADS_H

#include <criterion/criterion.h>

#include <stdint.h>
#include <stdlib.h>

#include "kf_test.h"
#include "ref_rnn.h"

/* Element counts: dx (x's), [out, F], [out, F, C], and the scaler's [out, F] or 0 without one. */
typedef struct kan_grad_sizes { int64_t dx, oi, oic, sc; } kan_grad_sizes;

typedef struct grads { float *dx, *dbw, *dsw, *dsc; } grads;     /* dsc NULL without a scaler */
typedef struct ref_grads { double *dx, *dbw, *dsw, *dsc; } ref_grads;

/* Every gradient NaN-filled, so that an element left unwritten shows. */
static inline grads kan_poisoned_grads(kan_grad_sizes n) {
    grads g = {poisoned(n.dx), poisoned(n.oi), poisoned(n.oic), n.sc ? poisoned(n.sc) : NULL};
    return g;
}

static inline void free_grads(grads *g) { free(g->dx), free(g->dbw), free(g->dsw), free(g->dsc); }

static inline void free_ref_grads(ref_grads *r) {
    free(r->dx), free(r->dbw), free(r->dsw), free(r->dsc);
}

/* ||got - ref|| / ||ref|| < tol for each gradient present (messages name `what`). */
static inline void kan_expect_grads(const grads *g, const ref_grads *r, kan_grad_sizes n,
                                    double tol, const char *what) {
    const struct { const char *name; const float *got; const double *want; int64_t n; } out[] = {
        {"dx", g->dx, r->dx, n.dx}, {"dbase_weight", g->dbw, r->dbw, n.oi},
        {"dspline_weight", g->dsw, r->dsw, n.oic}, {"dspline_scaler", g->dsc, r->dsc, n.sc}};
    for (size_t i = 0; i < 4; i++) {
        if (out[i].n == 0) continue;
        const double e = ref_rel_err_f32(out[i].got, out[i].want, out[i].n);
        cr_expect(e < tol, "%s: rel err %.3g (%s)", out[i].name, e, what);
    }
}

/* New gradient buffers for a KF_GRAD_ACCUMULATE call: dx poisoned (it is overwritten all the
 * same), the parameter gradients pre-filled with finite values, which are added to the
 * reference `r` as the call must add to them. */
static inline grads kan_accumulate_start(kan_grad_sizes n, ref_grads *r) {
    grads acc = kan_poisoned_grads(n);
    for (int64_t i = 0; i < n.oi; i++) acc.dbw[i] = 0.5f, r->dbw[i] += 0.5;
    for (int64_t i = 0; i < n.oic; i++) acc.dsw[i] = -0.25f, r->dsw[i] += -0.25;
    for (int64_t i = 0; i < n.sc; i++) acc.dsc[i] = 2.0f, r->dsc[i] += 2.0;
    return acc;
}

#endif /* KF_TESTS_KAN_GRADS_H */

/* The whole-sequence part of a cell's backward (part (2) of cpu/rnn_bwd.c's header comment):
 * the weight-gradient products over all rows, d eps and dX, after the recurrence. Static
 * functions of cpu/rnn_bwd.c, which includes this file once, after its layer code (bwd_layer). */
#ifndef KF_CPU_RNN_BWD_GRADS_H
#define KF_CPU_RNN_BWD_GRADS_H

/* One weight-gradient product dst[M, n] (+)= G[:, 0:M]^T X over all N rows (G rows ldg apart). */
typedef struct wgrad {
    float *dst;
    const float *g;
    int64_t ldg, m;
    const float *x;
    int64_t n; /* columns of x (its leading dimension) */
    bool beta1;
} wgrad;

/* Rows [m0, m1) of a product. */
static void wgrad_part(const wgrad *w, int64_t N, int64_t m0, int64_t m1) {
    kf__sgemm(true, false, m1 - m0, w->n, N, 1.0f, w->g + m0, w->ldg, w->x, w->n,
              w->beta1 ? 1.0f : 0.0f, w->dst + m0 * w->n, w->n);
}

/* The gradient products of cell (l, d); returns how many it wrote into `out` (at most 6). */
static int wgrad_list(const bwd_layer *f, int32_t d, wgrad *out) {
    const kf__rnn_bwd *c = f->c;
    const kf__rnn_cpu_layout *lo = f->lo;
    if (!c->dw) return 0;
    const int64_t H = lo->H, in = f->cell[d].in, cidx = cell_index(f, d);
    void *const *dw = c->dw + cidx * c->plan->nw;
    const float *dgx = (const float *)kf__at(f->ws, lo->big[0]);
    const float *aux = (const float *)kf__at(f->ws, lo->big[1]);
    const float *hp = (const float *)kf__cat(c->reserve, (size_t)cidx * lo->cell_bytes);
    const bool acc = c->accumulate;
    int n = 0;
#define KF__WG(DST, G, M, X, NX, B1)                                                            \
    do {                                                                                        \
        if (DST) out[n++] = (wgrad){(DST), (G), 3 * H, (M), (X), (NX), (B1)};                   \
    } while (0)
    const bool in_done = lo->wrec_fused; /* per step, or not wanted */
    if (!lo->agru) {
        if (!in_done) KF__WG(dw[KF__GRU_W_IH], dgx, 3 * H, f->x, in, acc);
        if (!lo->wrec_fused) KF__WG(dw[KF__GRU_W_HH], aux, 3 * H, hp, H, acc);
    } else {
        static const int wx[3] = {KF__AGRU_W_Z, KF__AGRU_W_R, KF__AGRU_V_H};
        static const int wu[2] = {KF__AGRU_U_Z, KF__AGRU_U_R};
        for (int g = 0; g < 3 && !in_done; g++) KF__WG(dw[wx[g]], dgx + g * H, H, f->x, in, acc);
        if (lo->wrec_fused) return n;
        for (int g = 0; g < 2; g++) KF__WG(dw[wu[g]], dgx + g * H, H, hp, H, acc);
        /* G = da_d^T q, combined into dW_h = G - G^T after a barrier (q rows are H apart) */
        if (dw[KF__AGRU_W_H])
            out[n++] = (wgrad){(float *)kf__at(f->ws, lo->gmat), dgx + 2 * H, 3 * H, H, aux, H,
                               false};
    }
#undef KF__WG
    return n;
}

/* Everything of cell (l, d) that needs all rows of the recurrence: weight gradients, d eps and
 * dX (accumulated over directions). Thread `tid` of `nth` does its share; ends in a barrier. */
static void bwd_cell_grads(const bwd_layer *f, int32_t d, int tid, int nth) {
    const kf__rnn_bwd *c = f->c;
    const kf__rnn_cpu_layout *lo = f->lo;
    const int64_t H = lo->H, in = f->cell[d].in;
    wgrad w[6];
    const int nw = wgrad_list(f, d, w);
    /* Consecutive products of the same x (A-GRU: dW_z, dW_r, dV_h; dU_z, dU_r) are split across
     * threads as one of their summed rows, so a thread packs that x for OpenBLAS once, not once
     * per product (x is [N, in] or Hp [N, H], up to 1.8 MB at T=28, B=128). */
    for (int i = 0, e; i < nw; i = e) {
        int64_t M = w[i].m;
        for (e = i + 1; e < nw && w[i].x && w[e].x == w[i].x && w[e].n == w[i].n; e++) M += w[e].m;
        int64_t m0, m1;
        kf__part(M, nth, tid, &m0, &m1);
        for (int64_t j = i, base = 0; j < e; base += w[j].m, j++) {
            const int64_t a = m0 - base > 0 ? m0 - base : 0;
            const int64_t b = m1 - base < w[j].m ? m1 - base : w[j].m;
            if (a < b) wgrad_part(&w[j], lo->N, a, b);
        }
    }
    if (f->dx && !lo->wrec_fused) {
        int64_t r0, r1;
        kf__part(lo->N, nth, tid, &r0, &r1);
        const float *dgx = (const float *)kf__at(f->ws, lo->big[0]);
        kf__sgemm(false, false, r1 - r0, in, 3 * H, 1.0f, dgx + r0 * 3 * H, 3 * H, f->cell[d].w3,
                  in, d ? 1.0f : 0.0f, f->dx + r0 * in, in);
    }
    if (wrec_wanted(f, d)) { /* wrec_block (+)= the slices' parts, in slice order, by rows */
        int64_t m0, m1;
        kf__part(3 * H, nth, tid, &m0, &m1);
        for (int64_t m = m0; m < m1; m++) {
            bool acc;
            float *dst = wrec_block(f, d, (int)(m / H), &acc);
            if (!dst) continue;
            dst += (m % H) * H;
            for (int32_t s = 0; s < lo->ns; s++) {
                const float *part = (const float *)kf__at(
                    f->ws, lo->wpart + (size_t)s * lo->wpart_bytes + (size_t)(m * H) * sizeof(float));
                const bool add = s > 0 || acc;
                for (int64_t j = 0; j < H; j++) dst[j] = (add ? dst[j] : 0.0f) + part[j];
            }
        }
    }
    if (win_wanted(f, d)) { /* dW3 (+)= the slices' parts of dW3^T, in slice order, by rows */
        int64_t m0, m1;
        kf__part(3 * H, nth, tid, &m0, &m1);
        for (int64_t m = m0; m < m1; m++) {
            float *dst = win_block(f, d, (int)(m / H));
            if (!dst) continue;
            dst += (m % H) * in;
            for (int32_t s = 0; s < lo->ns; s++) {
                const float *part = (const float *)kf__at(
                    f->ws, lo->wpart + (size_t)s * lo->wpart_bytes + lo->win);
                const bool add = s > 0 || c->accumulate;
                for (int64_t i = 0; i < in; i++)
                    dst[i] = (add ? dst[i] : 0.0f) + part[i * 3 * H + m];
            }
        }
    }
    void *const *dw = c->dw ? c->dw + cell_index(f, d) * c->plan->nw : NULL;
    if (dw) { /* biases (+)= the slices' sums (bias_step), in slice order; segments: where in the
               * sums each bias's columns are */
        struct { float *dst; int64_t off, n; } seg[3];
        if (!lo->agru) {
            seg[0].dst = dw[KF__GRU_B_IH], seg[0].off = 0, seg[0].n = 3 * H;
            seg[1].dst = dw[KF__GRU_B_HH], seg[1].off = 0, seg[1].n = 2 * H;
            seg[2].dst = dw[KF__GRU_B_HH] ? (float *)dw[KF__GRU_B_HH] + 2 * H : NULL;
            seg[2].off = 3 * H, seg[2].n = H;
        } else {
            static const int bx[3] = {KF__AGRU_B_Z, KF__AGRU_B_R, KF__AGRU_B_H};
            for (int g = 0; g < 3; g++) seg[g].dst = dw[bx[g]], seg[g].off = g * H, seg[g].n = H;
        }
        for (int g = 0; g < 3; g++) {
            if (!seg[g].dst) continue;
            int64_t j0, j1;
            kf__part(seg[g].n, nth, tid, &j0, &j1);
            for (int64_t j = j0; j < j1; j++) {
                double sum = 0.0;
                for (int32_t s = 0; s < lo->ns; s++) {
                    const size_t at = lo->bsum + (size_t)s * lo->bsum_bytes;
                    sum += ((const double *)kf__cat(f->ws, at))[seg[g].off + j];
                }
                seg[g].dst[j] = (float)sum + (c->accumulate ? seg[g].dst[j] : 0.0f);
            }
        }
    }
    if (lo->agru && dw && dw[KF__AGRU_EPS] && tid == 0) {
        const double *part = (const double *)kf__at(f->ws, lo->epsacc);
        double sum = 0.0;
        for (int32_t s = 0; s < lo->ns; s++) sum += part[s];
        float *deps = dw[KF__AGRU_EPS];
        *deps = (float)sum + (c->accumulate ? *deps : 0.0f);
    }
    kf__cpu_barrier_wait(f->bar, nth);
    if (lo->agru && dw && dw[KF__AGRU_W_H]) {
        /* dA = G and A = W_h - W_h^T - gamma I, so dW_h = G - G^T */
        const float *g = (const float *)kf__at(f->ws, lo->gmat);
        float *dwh = dw[KF__AGRU_W_H];
        int64_t i0, i1;
        kf__part(H, nth, tid, &i0, &i1);
        for (int64_t i = i0; i < i1; i++)
            for (int64_t j = 0; j < H; j++)
                dwh[i * H + j] = g[i * H + j] - g[j * H + i] + (c->accumulate ? dwh[i * H + j] : 0.0f);
    }
}
#endif /* KF_CPU_RNN_BWD_GRADS_H */

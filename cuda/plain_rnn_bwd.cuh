// The CUDA backend's GRU and A-GRU computed plainly, backward: the reverse recurrence's gate
// passes, then the weight gradients, dX and the column sums as whole-sequence products
// (plain_rnn.cuh's header comment says how; its layout, cells and forward are shared).
#ifndef KF_CUDA_PLAIN_RNN_BWD_CUH
#define KF_CUDA_PLAIN_RNN_BWD_CUH

#include "plain_rnn.cuh"

namespace kf_plain {

// gy[b, j]: d(layer output) of row (t, b), direction d's half, through the layer's dropout
// (zeros where dy is absent).
template <class A>
KF__HD inline A grad_in(const Seq &s, const A *dy, int64_t t, int64_t b, int64_t j, int64_t r) {
    return dy ? s.dropped(dy[r * s.DH + j], t, b, j) : A(0);
}

// GRU, element (b, j) of step t (g = dh + gy): da_n = g (1-z)(1-n^2), da_r = da_n hn r(1-r),
// da_z = g (hp - n) z(1-z); dG_x = [da_r, da_z, da_n], dG_h = [da_r, da_z, da_n r]; dh = g z.
// Rows past len: both rows 0, dh unchanged.
template <class T> struct GruBack {
    using A = typename Elem<T>::acc;
    Seq s;
    int64_t t;
    const A *dy; // the layer output gradient's direction half (or NULL)
    const A *hp, *gates;
    A *dgx, *aux, *dh;
    KF__HD void operator()(int64_t e) const {
        const int64_t H = s.H, b = e / H, j = e % H, r = s.row(t, b);
        A *gxr = dgx + r * 3 * H, *ghr = aux + r * 3 * H;
        if (!s.valid(t, b)) {
            gxr[j] = gxr[H + j] = gxr[2 * H + j] = A(0);
            ghr[j] = ghr[H + j] = ghr[2 * H + j] = A(0);
            return;
        }
        const A *sv = gates + r * 4 * H;
        const A rr = sv[j], z = sv[H + j], n = sv[2 * H + j], hn = sv[3 * H + j];
        const A g = dh[b * H + j] + grad_in(s, dy, t, b, j, r);
        const A dan = g * (A(1) - z) * (A(1) - n * n);
        const A dar = dan * hn * rr * (A(1) - rr);
        const A daz = g * (hp[r * H + j] - n) * z * (A(1) - z);
        gxr[j] = ghr[j] = dar;
        gxr[H + j] = ghr[H + j] = daz;
        gxr[2 * H + j] = dan;
        ghr[2 * H + j] = dan * rr;
        dh[b * H + j] = g * z;
    }
};

// A-GRU, first pass of step t, element (b, j): da_z = g eps d z(1-z), da_d = g eps z (1-d^2)
// (z, r, d and the complements from the gates' pre-activations), q = r hp (into aux [N, H]),
// dh = g, and the element's d eps term g z d into epsv [N, H] (summed per row, then over rows,
// after the recurrence); rows past len: zeros.
template <class T> struct AgruBack1 {
    using A = typename Elem<T>::acc;
    Seq s;
    int64_t t;
    const A *dy;
    const A *hp, *gates;
    const T *eps;
    A *dgx, *aux, *dh, *epsv;
    KF__HD void operator()(int64_t e) const {
        const int64_t H = s.H, b = e / H, j = e % H, r = s.row(t, b);
        A *gxr = dgx + r * 3 * H;
        if (!s.valid(t, b)) {
            gxr[j] = gxr[H + j] = gxr[2 * H + j] = A(0);
            aux[r * H + j] = A(0);
            epsv[r * H + j] = A(0);
            return;
        }
        const A *sv = gates + r * 3 * H;
        const A z = sigm(sv[j]), dd = tanh(sv[2 * H + j]), ep = Elem<T>::get(*eps);
        const A g = dh[b * H + j] + grad_in(s, dy, t, b, j, r);
        gxr[j] = g * ep * dd * z * sigm(-sv[j]);
        gxr[2 * H + j] = g * ep * z * tanh_dc(sv[2 * H + j]);
        aux[r * H + j] = sigm(sv[H + j]) * hp[r * H + j];
        dh[b * H + j] = g;
        epsv[r * H + j] = g * z * dd;
    }
};

// A-GRU, second pass (dq = da_d A): da_r = dq hp r(1-r), dh += dq r on valid rows (r and 1 - r
// from the pre-activation).
template <class A> struct AgruBack2 {
    Seq s;
    int64_t t;
    const A *dq, *hp, *gates;
    A *dgx, *dh;
    KF__HD void operator()(int64_t e) const {
        const int64_t H = s.H, b = e / H, j = e % H, r = s.row(t, b);
        if (!s.valid(t, b)) return;
        const A ar = gates[r * 3 * H + H + j], rr = sigm(ar), dqv = dq[b * H + j];
        dgx[r * 3 * H + H + j] = dqv * hp[r * H + j] * rr * sigm(-ar);
        dh[b * H + j] += dqv * rr;
    }
};

// dw (+)= g: a weight gradient of acc products from its block, written once.
template <class T> struct StoreGrad {
    const typename Elem<T>::acc *g;
    T *dw;
    bool acc;
    KF__HD void operator()(int64_t e) const {
        dw[e] = Elem<T>::put(acc ? Elem<T>::get(dw[e]) + g[e] : g[e]);
    }
};

// dW_h (+)= G - G^T (dA = G, A = W_h - W_h^T - gamma I).
template <class T> struct FoldWh {
    using A = typename Elem<T>::acc;
    const A *G;
    T *dwh;
    int64_t H;
    bool acc;
    KF__HD void operator()(int64_t e) const {
        const int64_t i = e / H, j = e % H;
        const A v = G[i * H + j] - G[j * H + i];
        dwh[e] = Elem<T>::put(acc ? Elem<T>::get(dwh[e]) + v : v);
    }
};

// rows[n] = sum over j of v[n, j] (in order): the A-GRU's d epsilon per row, whose column sum
// (column_sums over one column) is d epsilon.
template <class A> struct RowSums {
    const A *v;
    A *rows;
    int64_t H;
    KF__HD void operator()(int64_t n) const {
        A s = A(0);
        for (int64_t j = 0; j < H; ++j) s += v[n * H + j];
        rows[n] = s;
    }
};

template <class T, class X> kf_status rnn_backward(X &ex, const kf__rnn_bwd *c) {
    using A = typename Elem<T>::acc;
    const struct kf_rnn_plan *p = c->plan;
    const RnnLayout lo = rnn_layout<T>(p, c->T, c->B);
    // T = 0: no step runs, dh0 = dhn and the weight gradients are 0 (or unchanged)
    const int64_t N = lo.N, H = lo.H, B = lo.B, ld3 = lo.bs * 3 * H;
    KF_TRY(form_A<T>(ex, p, lo, c->w, c->ws));
    A *dgx = at_t<A>(c->ws, lo.dgx), *aux = at_t<A>(c->ws, lo.aux), *dh = at_t<A>(c->ws, lo.dh),
      *dq = at_t<A>(c->ws, lo.dq), *gmat = at_t<A>(c->ws, lo.gmat),
      *erows = at_t<A>(c->ws, lo.eps), *part = at_t<A>(c->ws, lo.part);
    const A *wr = at_t<A>(c->ws, lo.wr);
    // the input-side products' dG_x in T (float64: dG_x itself)
    T *dgx_t = is_low<T>() ? at_t<T>(c->ws, lo.dgx_t) : (T *)(void *)dgx;
    A *epsv = aux + N * H; // A-GRU: aux holds q [N, H], then these terms
    const bool acc = c->accumulate;
    for (int32_t l = p->L - 1; l >= 0; l--) {
        const T *x = l ? at_t<T>((void *)c->reserve, lo.out0 + (size_t)(l - 1) * lo.out_bytes)
                       : (const T *)c->x;
        // d(layer output) in acc: the caller's dy (low types: widened into dseq first), else
        // what the layer above wrote
        A *dseq = at_t<A>(c->ws, lo.dseq + (size_t)(l % 2) * lo.dseq_bytes);
        const A *dy = dseq;
        if (l == p->L - 1 && (!c->dy || !is_low<T>())) dy = (const A *)c->dy;
        else if (l == p->L - 1)
            KF_TRY(ex.each(N * lo.DH, CopyOrZero<T, A>{(const T *)c->dy, dseq}));
        // d(layer input): the layer below's dy in acc, or the caller's dx; summed over gates
        // and directions in acc, the caller's dx (low types) rounded from dxs once
        T *dx = l ? nullptr : (T *)c->dx;
        A *dxs = l ? at_t<A>(c->ws, lo.dseq + (size_t)((l - 1) % 2) * lo.dseq_bytes)
                   : is_low<T>() ? at_t<A>(c->ws, lo.dxs) : (A *)(void *)dx;
        const bool drop = p->dropout > 0.0f && l < p->L - 1;
        for (int32_t d = 0; d < p->D; d++) {
            const Cell<T> cw = cell_of<T>(p, c->w, l, d);
            const Seq s = seq_of(p, lo, c->lengths, drop, c->seed, c->offset, l, d);
            const A *hp = at_t<A>((void *)c->reserve, (size_t)cw.idx * lo.cell_bytes);
            const A *gates = (const A *)((const char *)hp + lo.hp_bytes);
            const T *dhn = c->dhn ? (const T *)c->dhn + cw.idx * B * H : nullptr;
            KF_TRY(ex.each(B * H, CopyOrZero<T, A>{dhn, dh}));
            KF_TRY(form_wr(ex, lo, cw, c->ws));
            const A *dyd = dy ? dy + d * H : nullptr;
            for (int64_t k = 0; k < lo.T; k++) {
                const int64_t t = d ? k : lo.T - 1 - k, r0 = t * lo.ts;
                if (!lo.agru) {
                    KF_TRY(ex.each(B * H, GruBack<T>{s, t, dyd, hp, gates, dgx, aux, dh}));
                    KF_TRY(ex.gemm(false, false, B, H, 3 * H, A(1), aux + r0 * 3 * H, ld3, wr, H,
                                   A(1), dh, H));
                    continue;
                }
                KF_TRY(ex.each(B * H, AgruBack1<T>{s, t, dyd, hp, gates, cw.eps, dgx, aux, dh,
                                                   epsv}));
                KF_TRY(ex.gemm(false, false, B, H, H, A(1), dgx + r0 * 3 * H + 2 * H, ld3,
                               A_of<A>(lo, c->ws, l), H, A(0), dq, H));
                KF_TRY(ex.each(B * H, AgruBack2<A>{s, t, dq, hp, gates, dgx, dh}));
                KF_TRY(ex.gemm(false, false, B, H, 2 * H, A(1), dgx + r0 * 3 * H, ld3, wr, H,
                               A(1), dh, H));
            }
            if (c->dh0)
                KF_TRY(ex.each(B * H, CopyOrZero<A, T>{dh, (T *)c->dh0 + cw.idx * B * H}));
            if (is_low<T>()) KF_TRY(ex.each(N * 3 * H, CopyOrZero<A, T>{dgx, dgx_t}));

            // the whole-sequence products of this cell
            void *const *dw = c->dw ? c->dw + cw.idx * p->nw : nullptr;
            auto W = [&](int j) { return dw ? (T *)dw[j] : nullptr; };
            for (int g = 0; g < cw.nx; g++) { // the input-side blocks (GRU: one, [3H, in])
                T *dwx, *dbx;
                if (lo.agru) {
                    const int wx[3] = {KF__AGRU_W_Z, KF__AGRU_W_R, KF__AGRU_V_H};
                    const int bx[3] = {KF__AGRU_B_Z, KF__AGRU_B_R, KF__AGRU_B_H};
                    dwx = W(wx[g]), dbx = W(bx[g]);
                } else {
                    dwx = W(KF__GRU_W_IH), dbx = W(KF__GRU_B_IH);
                }
                const int64_t c0 = g * cw.hx;
                if (dwx)
                    KF_TRY(ex.gemm(true, false, cw.hx, cw.in, N, A(1), dgx_t + c0, 3 * H, x,
                                   cw.in, acc ? A(1) : A(0), dwx, cw.in));
                if (dbx) KF_TRY(column_sums(ex, dgx + c0, N, 3 * H, cw.hx, dbx, acc, part));
            }
            if (!lo.agru) {
                if (W(KF__GRU_W_HH)) {
                    KF_TRY(ex.gemm(true, false, 3 * H, H, N, A(1), aux, 3 * H, hp, H, A(0), gmat,
                                   H));
                    KF_TRY(ex.each(3 * H * H, StoreGrad<T>{gmat, W(KF__GRU_W_HH), acc}));
                }
                if (W(KF__GRU_B_HH))
                    KF_TRY(column_sums(ex, (const A *)aux, N, 3 * H, 3 * H, W(KF__GRU_B_HH), acc,
                                       part));
            } else {
                if (W(KF__AGRU_U_Z) || W(KF__AGRU_U_R)) { // [dU_z; dU_r] = [da_z da_r]^T hp
                    KF_TRY(ex.gemm(true, false, 2 * H, H, N, A(1), dgx, 3 * H, hp, H, A(0), gmat,
                                   H));
                    if (W(KF__AGRU_U_Z))
                        KF_TRY(ex.each(H * H, StoreGrad<T>{gmat, W(KF__AGRU_U_Z), acc}));
                    if (W(KF__AGRU_U_R))
                        KF_TRY(ex.each(H * H,
                                       StoreGrad<T>{gmat + H * H, W(KF__AGRU_U_R), acc}));
                }
                if (W(KF__AGRU_W_H)) {
                    KF_TRY(ex.gemm(true, false, H, H, N, A(1), dgx + 2 * H, 3 * H, aux, H, A(0),
                                   gmat, H));
                    KF_TRY(ex.each(H * H, FoldWh<T>{gmat, W(KF__AGRU_W_H), H, acc}));
                }
                if (W(KF__AGRU_EPS)) {
                    KF_TRY(ex.each(N, RowSums<A>{epsv, erows, H}));
                    KF_TRY(column_sums(ex, (const A *)erows, N, 1, 1, W(KF__AGRU_EPS), acc,
                                       part));
                }
            }
            if (l || dx)
                for (int g = 0; g < cw.nx; g++)
                    KF_TRY(ex.gemm(false, false, N, cw.in, cw.hx, A(1), dgx_t + g * cw.hx, 3 * H,
                                   cw.wx[g], cw.in, d || g ? A(1) : A(0), dxs, cw.in));
        }
        if (dx && is_low<T>()) KF_TRY(ex.each(N * p->I, CopyOrZero<A, T>{dxs, dx}));
    }
    return KF_OK;
}

} // namespace kf_plain

#endif // KF_CUDA_PLAIN_RNN_BWD_CUH

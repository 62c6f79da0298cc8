// The CUDA backend's plain path for KANLinear and KANConv2d (float64, and bfloat16 / float16 on
// the tensor cores; plain.cuh says what the plain path is), written against plain.cuh's
// executor X, so that it runs on the GPU (cuda/plain.cu) and on the host
// (tests/cxx/test_plain.cpp).
//
// KAN, element type T (double, or bfloat16 / float16 storage with float32 arithmetic, acc below;
// rows n: KANLinear's x rows, or KANConv2d's patches, b-major; K = in cw):
//   prep      W [out, K] in T (the combined weight, base_weight | spline_weight * scaler, each
//             product rounded once; the SiLU column 0 without base_weight), the knots in acc
//             and their reciprocals inv [in, k, nk] in acc (0 for spans narrower than FLT_MIN,
//             as on the CPU)
//   per chunk of Nc rows (KANConv2d: Bg whole images), A [Nc, K] generated in T (one thread per
//   (row, feature): SiLU(x), then the window of k + 1 bases, computed in acc and rounded once;
//   zeros elsewhere; at a derivative order m and with an input weight w, KANLinear's since 1.9:
//   w SiLU^(m)(x) and w B^(m)), then
//   forward   y[chunk] = A W^T in T (KANConv2d: y_b [out, Ho Wo] = W A_b^T, batched over images)
//   backward  dW (+)= dy[chunk]^T A in acc (chunk order; KANConv2d one GEMM per image, in
//             order); dA = dy[chunk] W in acc, then per (row, feature) SiLU'(x) dA_silu + sum_c
//             B'_c dA_c (B' from the order-(k-1) window, docs/ops/kan.md) into dx (KANLinear,
//             rounded once; at order m: w times the contraction at m + 1, and dinput_weight the
//             contraction at m) or into dP [Nc, in] (acc) and gathered per pixel over the patches
//             that read it (KANConv2d, in kernel-offset order); after the chunks dW is folded
//             into d base_weight, d spline_weight (* scaler) and d spline_scaler (sum over c in
//             order), each written, or accumulated as round(acc(old) + g), once
//   workspace (e = sizeof(T), a = sizeof(acc)) e out K (W) + a in nk + a in k nk + a out K (dW)
//             + e Nc K (A) + a Nc K (dA) + a Nc in (dP, KANConv2d), each rounded up to 64 bytes,
//             with e Nc K <= the executor's chunk_bytes (or one row, or one image's rows, where
//             that is larger)
#ifndef KF_CUDA_PLAIN_KAN_CUH
#define KF_CUDA_PLAIN_KAN_CUH

#include "plain.cuh"
#include "silu_deriv.h"

namespace kf_plain {

// The rows of a call (KANLinear: x [N, in]; KANConv2d: the patches of x, kf__kan_patches).
template <class T> struct Rows {
    using A = typename Elem<T>::acc;
    const T *x;
    int64_t in;
    bool conv;
    kf__kan_patches g; // conv only
    // x at row n (global), feature f.
    KF__HD A at(int64_t n, int64_t f) const {
        if (!conv) return Elem<T>::get(x[n * in + f]);
        const QR bp = divmod(n, g.Ho * g.Wo), hw = divmod(bp.r, g.Wo),
                 cij = divmod(f, (int64_t)g.kh * g.kw), ij = divmod(cij.r, g.kw);
        const int64_t b = bp.q, oh = hw.q, ow = hw.r, ch = cij.q;
        const int64_t h = oh * g.sh - g.ph + ij.q * g.dh, w = ow * g.sw - g.pw + ij.r * g.dw;
        if (h < 0 || h >= g.H || w < 0 || w >= g.W) return A(0);
        return Elem<T>::get(x[((b * g.Cin + ch) * g.H + h) * g.W + w]);
    }
};

// What the per-(row, feature) functors share.
template <class T> struct Feat {
    using A = typename Elem<T>::acc;
    Rows<T> rows;
    const A *grid, *inv; // the knots [in, nk] and their reciprocals [in, k, nk], in acc
    int64_t nk, C, cw, K;
    int k;
};

// W [out, K] (element e < nW), the knots in acc (the next in nk) and inv [in, k, nk].
template <class T> struct Prep {
    using A = typename Elem<T>::acc;
    const T *grid, *base, *spline, *scaler;
    T *W;
    A *tg, *inv;
    int64_t out, in, C, cw, K, nk, nW;
    int k;
    KF__HD void operator()(int64_t e) const {
        if (e < nW) {
            const int64_t o = e / K, col = e % K, i = col / cw, c = col % cw, oi = o * in + i;
            A v = A(0);
            if (c == 0) v = base ? Elem<T>::get(base[oi]) : A(0);
            else v = scaler ? Elem<T>::get(spline[oi * C + c - 1]) * Elem<T>::get(scaler[oi])
                            : Elem<T>::get(spline[oi * C + c - 1]);
            W[e] = Elem<T>::put(v);
            return;
        }
        const int64_t e1 = e - nW;
        if (e1 < in * nk) {
            tg[e1] = Elem<T>::get(grid[e1]);
            return;
        }
        const int64_t e2 = e1 - in * nk, i = e2 / ((int64_t)k * nk), q = e2 / nk % k + 1,
                      m = e2 % nk;
        const T *t = grid + i * nk;
        const A d = m + q < nk ? Elem<T>::get(t[m + q]) - Elem<T>::get(t[m]) : A(0);
        inv[e2] = d >= (A)FLT_MIN ? A(1) / d : A(0);
    }
};

// SiLU^(m)(x) in acc: the first-order kernels' expressions for m = 0 and 1, common/silu_deriv.h's
// polynomial (in double) beyond.
template <class A> KF__HD A silu_order(A x, int m) {
    if (m == 0) return x / (A(1) + exp(-x));
    if (m == 1) {
        const A sg = A(1) / (A(1) + exp(-x));
        return sg * (A(1) + x * (A(1) - sg));
    }
    return A(kf__silu_deriv(double(x), m));
}

// A[l, f cw .. f cw + C] for l = e / in (row n0 + l), f = e % in: w SiLU^(m)(x), then w times
// the bases' m-th derivatives (the window's k + 1, zeros elsewhere; kf__bspline_deriv_window),
// each element written once, in column order. m = 0 and no w (a null pointer: 1) is the layer.
template <class T> struct GenA {
    using Ac = typename Elem<T>::acc;
    Feat<T> F;
    int64_t n0;
    T *A;
    int m;
    const T *w; // KANLinear's input weight [N, in], or null
    KF__HD void operator()(int64_t e) const {
        const int64_t in = F.rows.in, l = e / in, f = e % in;
        T *a = A + l * F.K + f * F.cw;
        const Ac xv = F.rows.at(n0 + l, f);
        const Ac wv = w ? Elem<T>::get(w[(n0 + l) * in + f]) : Ac(1);
        a[0] = Elem<T>::put(wv * silu_order(xv, m));
        Ac Nw[kPlainMaxOrder + 1];
        const int64_t j = kf__bspline_deriv_window<kPlainMaxOrder>(
            F.grid + f * F.nk, F.inv + f * F.k * F.nk, F.nk, F.k, m, xv, Nw);
        const int64_t b0 = j - F.k; // the window's first basis (j < 0: none)
        for (int64_t b = 0; b < F.C; ++b) {
            const int64_t r = b - b0;
            a[1 + b] = Elem<T>::put(j >= 0 && r >= 0 && r <= F.k ? wv * Nw[r] : Ac(0));
        }
    }
};

// The contraction of row n0 + l, feature f (e = l in + f) with dA's row l (acc) at order m:
//   w (SiLU^(m)(x) dA_silu + sum_c dA_c B_c^(m)(x))      (w null: 1)
// into dst[e], of type D: m = 1 gives d/dx (KANLinear: dx + n0 in, T; KANConv2d: dP, acc);
// KANLinear's order-m backward takes dx at m + 1 (times its input weight) and dinput_weight at m.
template <class T, class D> struct FoldDx {
    using A = typename Elem<T>::acc;
    Feat<T> F;
    int64_t n0;
    const A *dA;
    D *dst;
    int m;
    const T *w;
    KF__HD void operator()(int64_t e) const {
        const int64_t in = F.rows.in, l = e / in, f = e % in;
        const A *d = dA + l * F.K + f * F.cw;
        const A xv = F.rows.at(n0 + l, f);
        A s = d[0] * silu_order(xv, m);
        A Nw[kPlainMaxOrder + 1];
        const int64_t j = kf__bspline_deriv_window<kPlainMaxOrder>(
            F.grid + f * F.nk, F.inv + f * F.k * F.nk, F.nk, F.k, m, xv, Nw);
        if (j >= 0)
            for (int r = 0; r <= F.k; ++r) {
                const int64_t c = j - F.k + r;
                if (c < 0 || c >= F.C) continue;
                s += d[1 + c] * Nw[r];
            }
        dst[e] = Elem<D>::put(w ? Elem<T>::get(w[(n0 + l) * in + f]) * s : s);
    }
};

// dx[b, c, h, w] for the images b0.. of a chunk (e over their elements): the sum over kernel
// offsets (i, j), in row-major order, of dP[patch (oh, ow), feature (c kh + i) kw + j] where
// oh sh = h + ph - i dh and ow sw = w + pw - j dw are whole and inside the output.
template <class T> struct Col2Im {
    using A = typename Elem<T>::acc;
    kf__kan_patches g;
    int64_t b0, in;
    const A *dP; // [rows of the chunk, in]
    T *dx;
    KF__HD void operator()(int64_t e) const {
        const int64_t img = g.Cin * g.H * g.W;
        const QR br = divmod(e, img), ci = divmod(br.r, g.H * g.W), hw = divmod(ci.r, g.W);
        const int64_t bl = br.q, ch = ci.q, h = hw.q, w = hw.r;
        A s = A(0);
        for (int64_t i = 0; i < g.kh; ++i) {
            const int64_t ohs = h + g.ph - i * g.dh;
            if (ohs < 0) continue;
            const QR oq = divmod(ohs, g.sh);
            if (oq.r != 0 || oq.q >= g.Ho) continue;
            const int64_t oh = oq.q;
            for (int64_t j = 0; j < g.kw; ++j) {
                const int64_t ows = w + g.pw - j * g.dw;
                if (ows < 0) continue;
                const QR wq = divmod(ows, g.sw);
                if (wq.r != 0 || wq.q >= g.Wo) continue;
                const int64_t ow = wq.q;
                const int64_t n = (bl * g.Ho + oh) * g.Wo + ow, f = (ch * g.kh + i) * g.kw + j;
                s += dP[n * in + f];
            }
        }
        dx[(b0 + bl) * img + br.r] = Elem<T>::put(s);
    }
};

// dW [out, K] (acc) folded into d base_weight, d spline_weight, d spline_scaler (e = o in + i),
// each written or accumulated (round(acc(old) + g)) once.
template <class T> struct FoldW {
    using A = typename Elem<T>::acc;
    const A *dW;
    const T *spline, *scaler;
    T *dbase, *dspline, *dscaler;
    int64_t in, C, cw, K;
    bool acc;
    KF__HD void store(T *p, A g) const { *p = Elem<T>::put(acc ? Elem<T>::get(*p) + g : g); }
    KF__HD void operator()(int64_t e) const {
        const int64_t o = e / in, i = e % in;
        const A *w = dW + o * K + i * cw;
        if (dbase) store(dbase + e, w[0]);
        const A sc = scaler ? Elem<T>::get(scaler[e]) : A(1);
        A ds = A(0);
        for (int64_t c = 0; c < C; ++c) {
            const A g = w[1 + c];
            if (dspline) store(dspline + e * C + c, g * sc);
            ds += g * Elem<T>::get(spline[e * C + c]);
        }
        if (dscaler) store(dscaler + e, ds);
    }
};

// The chunking and the workspace offsets of a KAN call in element type T.
struct KanLayout {
    int64_t Nc;     // rows per chunk (KANConv2d: Bg Ho Wo)
    int64_t Bg, hw; // KANConv2d: images per chunk, pixels per image (KANLinear: 0, 1)
    size_t off_tg, off_inv, off_dw, off_a, off_da, off_dp, bytes;
};

template <class T>
inline KanLayout kan_layout(const struct kf_kan_linear_plan *p, int64_t N,
                            const kf__kan_patches *pt, int64_t chunk_bytes) {
    using A = typename Elem<T>::acc;
    KanLayout l = {};
    const int64_t K = p->K > 0 ? p->K : 1;
    int64_t most = chunk_bytes / (int64_t)sizeof(T) / K;
    if (most < 1) most = 1;
    if (pt) {
        l.hw = pt->Ho * pt->Wo;
        l.Bg = l.hw > 0 ? most / l.hw : 1;
        if (l.Bg < 1) l.Bg = 1;
        if (l.Bg > pt->B) l.Bg = pt->B > 0 ? pt->B : 1;
        l.Nc = l.Bg * l.hw;
    } else {
        l.hw = 1;
        l.Nc = N < most ? N : most;
    }
    if (l.Nc < 0) l.Nc = 0;
    l.off_tg = bytes_of<T>(p->out, p->K);
    l.off_inv = add(l.off_tg, bytes_of<A>(p->in, p->nk));
    l.off_dw = add(l.off_inv, bytes_of<A>(p->in * p->k, p->nk));
    l.off_a = add(l.off_dw, bytes_of<A>(p->out, p->K));
    l.off_da = add(l.off_a, bytes_of<T>(l.Nc, p->K));
    l.off_dp = add(l.off_da, bytes_of<A>(l.Nc, p->K));
    l.bytes = add(l.off_dp, pt ? bytes_of<A>(l.Nc, p->in) : 0);
    return l;
}

template <class T>
inline Feat<T> kan_feat(const struct kf_kan_linear_plan *p, const kf__kan_patches *pt,
                        const void *x, void *ws, const KanLayout &l) {
    using A = typename Elem<T>::acc;
    Feat<T> F = {};
    F.rows.x = (const T *)x;
    F.rows.in = p->in;
    F.rows.conv = pt != nullptr;
    if (pt) F.rows.g = *pt;
    F.grid = at_t<A>(ws, l.off_tg);
    F.inv = at_t<A>(ws, l.off_inv);
    F.nk = p->nk;
    F.C = p->C;
    F.cw = p->cw;
    F.K = p->K;
    F.k = p->k;
    return F;
}

// W (when `pack`), the knots and inv into the workspace.
template <class T, class X>
kf_status kan_prep(X &ex, const struct kf_kan_linear_plan *p, const void *grid, const void *base,
                   const void *spline, const void *scaler, void *ws, const KanLayout &l,
                   bool pack) {
    using A = typename Elem<T>::acc;
    Prep<T> q = {(const T *)grid, (const T *)base, (const T *)spline, (const T *)scaler,
                 at_t<T>(ws, 0), at_t<A>(ws, l.off_tg), at_t<A>(ws, l.off_inv), p->out, p->in,
                 p->C, p->cw, p->K, p->nk, pack ? p->out * p->K : 0, p->k};
    return ex.each(q.nW + p->in * p->nk + p->in * p->k * p->nk, q);
}

// The chunk starting at row n0: its rows and (KANConv2d) its first image and image count.
struct Chunk {
    int64_t n0, rows, b0, imgs;
};
inline Chunk chunk_at(const KanLayout &l, int64_t n0, int64_t N, bool conv) {
    Chunk ch;
    ch.n0 = n0;
    ch.rows = N - n0 < l.Nc ? N - n0 : l.Nc;
    ch.b0 = conv ? n0 / l.hw : 0;
    ch.imgs = conv ? ch.rows / l.hw : 0;
    return ch;
}

template <class T, class X> kf_status kan_forward(X &ex, const kf__kan_fwd *c) {
    using Ac = typename Elem<T>::acc;
    const struct kf_kan_linear_plan *p = c->plan;
    const kf__kan_patches *pt = c->patches;
    const int64_t N = c->N, K = p->K, out = p->out;
    if (N <= 0) return KF_OK;
    const KanLayout l = kan_layout<T>(p, N, pt, ex.chunk_bytes);
    KF_TRY(kan_prep<T>(ex, p, c->grid, c->base, c->spline, c->scaler, c->ws, l, true));
    const Feat<T> F = kan_feat<T>(p, pt, c->x, c->ws, l);
    const T *W = at_t<T>(c->ws, 0);
    T *A = at_t<T>(c->ws, l.off_a), *y = (T *)c->y;
    for (int64_t n0 = 0; n0 < N; n0 += l.Nc) {
        const Chunk ch = chunk_at(l, n0, N, pt != nullptr);
        KF_TRY(ex.each(ch.rows * p->in, GenA<T>{F, n0, A, c->order, (const T *)c->w}));
        if (pt)
            KF_TRY(ex.gemm_batched(false, true, out, l.hw, K, Ac(1), W, K, 0, A, K, l.hw * K,
                                   Ac(0), y + ch.b0 * out * l.hw, l.hw, out * l.hw, ch.imgs));
        else
            KF_TRY(ex.gemm(false, true, ch.rows, out, K, Ac(1), A, K, W, K, Ac(0),
                           y + n0 * out, out));
    }
    return KF_OK;
}

template <class T, class X> kf_status kan_backward(X &ex, const kf__kan_bwd *c) {
    using Ac = typename Elem<T>::acc;
    const struct kf_kan_linear_plan *p = c->plan;
    const kf__kan_patches *pt = c->patches;
    const int64_t N = c->N, K = p->K, out = p->out, in = p->in;
    const bool want_w = c->dbase || c->dspline || c->dscaler;
    if (N <= 0 || (!want_w && !c->dx && !c->dw)) return KF_OK;
    const KanLayout l = kan_layout<T>(p, N, pt, ex.chunk_bytes);
    KF_TRY(kan_prep<T>(ex, p, c->grid, c->base, c->spline, c->scaler, c->ws, l,
                       c->dx != nullptr || c->dw != nullptr));
    const Feat<T> F = kan_feat<T>(p, pt, c->x, c->ws, l);
    const T *W = at_t<T>(c->ws, 0), *dy = (const T *)c->dy, *w = (const T *)c->w;
    Ac *dW = at_t<Ac>(c->ws, l.off_dw), *dA = at_t<Ac>(c->ws, l.off_da);
    T *A = at_t<T>(c->ws, l.off_a), *dx = (T *)c->dx, *dw = (T *)c->dw;
    const int m = c->order;
    for (int64_t n0 = 0; n0 < N; n0 += l.Nc) {
        const Chunk ch = chunk_at(l, n0, N, pt != nullptr);
        if (want_w) {
            KF_TRY(ex.each(ch.rows * in, GenA<T>{F, n0, A, m, w}));
            if (pt)
                for (int64_t b = 0; b < ch.imgs; ++b)
                    KF_TRY(ex.gemm(false, false, out, K, l.hw, Ac(1),
                                   dy + (ch.b0 + b) * out * l.hw, l.hw, A + b * l.hw * K, K,
                                   n0 + b > 0 ? Ac(1) : Ac(0), dW, K));
            else
                KF_TRY(ex.gemm(true, false, out, K, ch.rows, Ac(1), dy + n0 * out, out, A, K,
                               n0 > 0 ? Ac(1) : Ac(0), dW, K));
        }
        if (!dx && !dw) continue;
        if (pt) { /* KANConv2d: order 0, no input weight (the front end's records) */
            Ac *dP = at_t<Ac>(c->ws, l.off_dp);
            KF_TRY(ex.gemm_batched(true, false, l.hw, K, out, Ac(1), dy + ch.b0 * out * l.hw,
                                   l.hw, out * l.hw, W, K, 0, Ac(0), dA, K, l.hw * K, ch.imgs));
            KF_TRY(ex.each(ch.rows * in, FoldDx<T, Ac>{F, n0, dA, dP, 1, nullptr}));
            KF_TRY(ex.each(ch.imgs * pt->Cin * pt->H * pt->W,
                           Col2Im<T>{*pt, ch.b0, in, dP, dx}));
        } else {
            KF_TRY(ex.gemm(false, false, ch.rows, K, out, Ac(1), dy + n0 * out, out, W, K, Ac(0),
                           dA, K));
            if (dx) KF_TRY(ex.each(ch.rows * in, FoldDx<T, T>{F, n0, dA, dx + n0 * in, m + 1, w}));
            if (dw) KF_TRY(ex.each(ch.rows * in, FoldDx<T, T>{F, n0, dA, dw + n0 * in, m, nullptr}));
        }
    }
    if (!want_w) return KF_OK;
    return ex.each(out * in, FoldW<T>{dW, (const T *)c->spline, (const T *)c->scaler,
                                      (T *)c->dbase, (T *)c->dspline, (T *)c->dscaler, in, p->C,
                                      p->cw, K, c->accumulate});
}

} // namespace kf_plain

#endif // KF_CUDA_PLAIN_KAN_CUH

// The CUDA backend's GRU and A-GRU computed plainly, as in cuda/plain.cuh (whose executor
// contract and helpers it shares): every product one GEMM, the gate math one elementwise pass per
// step, each output element one writer, every sum in a fixed order. Element type T: double
// (float64 plans), or bfloat16 / float16 storage with float32 arithmetic (the low plans whose H
// the persistent float32 kernels do not take; cuda/rnn_fwd.cu's kf__cuda_rnn_plain says which);
// acc = Elem<T>::acc is the arithmetic type. Records, layouts, dropout counters and lengths:
// core/rnn_backend.h; math and the backward's derivation: docs/ops/rnn.md (the CPU's float64
// form, cpu/rnn_f64.c, is the same algorithm with the batch split across threads; here the whole
// batch goes through each step).
//
// Both cells have three gate blocks on the input side (GRU r, z, n of weight_ih; A-GRU z, r, d:
// W_z, W_r, V_h), so the input projection, dX and the input-side weight gradients are one code
// (the GRU's three blocks are one contiguous [3H, in] weight: one product each; the A-GRU's three).
// Rows r = t ts + b bs of the [N = T B] sequence ((ts, bs) = (B, 1), or (1, T) batch-first);
// len(b) = lengths[b] clamped to [0, T] (device lengths are never checked by the front end).
//
// Which type holds what. T: the caller's tensors and every layer's output (the next layer's
// input), so that the input-side products (G_x = X W3^T, dX = dG_x W3, dW3 = dG_x^T X) have both
// operands in T and run on the tensor cores for the low types; for those two backward products
// dG_x is rounded to T once (as torch's own bfloat16 layers round a product's result; the bias
// gradients sum the unrounded one). acc: the state, the gates, G_x, the recurrent weights' copy
// Wr, A, every recurrent product and its gradient, and the gradients passed between layers, so
// that the recurrence keeps float32 state as the float32 kernels do; a weight gradient of acc
// operands is formed in a block and then written (or accumulated as round(acc(old) + g)) once.
// For double every type is double.
//
// Forward, per layer and direction: G_x = X W3^T + b3 [N, 3H]; Wr = W_hh (GRU) or [U_z; U_r]
// (A-GRU); then per step (t in the direction's order) the recurrent product of the whole batch's
// state h [B, H] into a [B, 3H] (GRU: h W_hh^T; A-GRU: h [U_z; U_r]^T, then after the gate pass
// q A^T with q = r h and A = W_h - W_h^T - gamma I formed once per call) and the gate pass, which
// also writes the layer output row (dropout applied) and, in training, the state before the step
// and the gates into the reserve. Backward, per layer (last first) and direction: the reverse
// recurrence (per step the gate-gradient pass into dG_x [N, 3H] and, GRU, dG_h / A-GRU, q into
// aux [N, 3H or H]; then dh += dG_h W_hh, or dq = da_d A, a pass, dh += [da_z da_r] [U_z; U_r]),
// then every weight gradient and dX as whole-sequence GEMMs, the bias gradients and d eps (of
// per-row sums) as fixed-order column sums (plain.cuh's column_sums). The backward's code is in
// plain_rnn_bwd.cuh.
//
// Reserve (training), per cell (l, d): hp [N, H] (the state before each step, every row) and the
// gates [N, ng H] (GRU r, z, n, hn: ng = 4; A-GRU the pre-activations of z, r, d: ng = 3) in acc;
// then the output [N, D H] of every layer but the last, in T. Workspace: A per A-GRU layer [H, H]
// and Wr [3H, H] (acc), then forward G_x [N, 3H], a [B, 3H], q and h [B, H] (acc) and (inference)
// two [N, D H] layer outputs (T); backward dG_x and aux [N, 3H], dh, dq [B, H], the weight-gradient
// block [3H, H], per-row d eps [N] (acc), for the low types dG_x in T [N, 3H] and the first layer's
// dX sum [N, I] (acc; float64 sums dX in place), two [N, D H] buffers of d(layer output) in acc
// (the caller's dy widened, the inner layers' gradients: never rounded), and the column sums'
// partial sums (acc).
#ifndef KF_CUDA_PLAIN_RNN_CUH
#define KF_CUDA_PLAIN_RNN_CUH

#include "counter_rng.h"
#include "plain.cuh"
#include "rnn_backend.h"

#include <type_traits>

namespace kf_plain {

// Whether T is a storage type computed in another (acc) type.
template <class T> constexpr bool is_low() {
    return !std::is_same<T, typename Elem<T>::acc>::value;
}

// Everything derived from (plan, T, B, element type E): strides and byte offsets.
struct RnnLayout {
    int64_t T, B, N, H, D, DH, ts, bs, ng;
    bool agru;
    size_t cell_bytes, hp_bytes, out0, out_bytes, reserve; // reserve
    size_t A, wr;                                            // workspace, both directions
    size_t gx, a, q, h, seq, fwd;                            // forward workspace
    size_t dgx, aux, dh, dq, gmat, eps, dgx_t, dxs, dseq, dseq_bytes, part, bwd; // backward
};

template <class E> inline RnnLayout rnn_layout(const struct kf_rnn_plan *p, int64_t T, int64_t B) {
    using A = typename Elem<E>::acc;
    RnnLayout l = {};
    l.T = T, l.B = B, l.N = T * B, l.H = p->H, l.D = p->D, l.DH = p->D * p->H;
    l.ts = p->batch_first ? 1 : B;
    l.bs = p->batch_first ? T : 1;
    l.agru = p->cell == KF_RNN_AGRU;
    l.ng = l.agru ? 3 : 4;
    l.hp_bytes = bytes_of<A>(l.N, l.H);
    l.cell_bytes = add(l.hp_bytes, bytes_of<A>(l.N, l.ng * l.H));
    l.out0 = times(l.cell_bytes, (int64_t)p->L * p->D);
    l.out_bytes = bytes_of<E>(l.N, l.DH);
    l.reserve = add(l.out0, times(l.out_bytes, p->L - 1));
    l.A = 0; // both directions' workspaces begin with A and Wr
    l.wr = l.agru ? times(bytes_of<A>(l.H, l.H), p->L) : 0;
    const size_t common = add(l.wr, bytes_of<A>(3 * l.H, l.H));
    l.gx = common;
    l.a = add(l.gx, bytes_of<A>(l.N, 3 * l.H));
    l.q = add(l.a, bytes_of<A>(l.B, 3 * l.H));
    l.h = add(l.q, bytes_of<A>(l.B, l.H));
    l.seq = add(l.h, bytes_of<A>(l.B, l.H));
    l.fwd = add(l.seq, add(l.out_bytes, l.out_bytes));
    l.dgx = common;
    l.aux = add(l.dgx, bytes_of<A>(l.N, 3 * l.H));
    l.dh = add(l.aux, bytes_of<A>(l.N, 3 * l.H));
    l.dq = add(l.dh, bytes_of<A>(l.B, l.H));
    l.gmat = add(l.dq, bytes_of<A>(l.B, l.H));
    l.eps = add(l.gmat, bytes_of<A>(3 * l.H, l.H));
    l.dgx_t = add(l.eps, bytes_of<A>(l.N, 1));
    l.dxs = add(l.dgx_t, is_low<E>() ? bytes_of<E>(l.N, 3 * l.H) : 0);
    l.dseq = add(l.dxs, is_low<E>() ? bytes_of<A>(l.N, p->I) : 0);
    l.dseq_bytes = bytes_of<A>(l.N, l.DH);
    l.part = add(l.dseq, add(l.dseq_bytes, l.dseq_bytes));
    // the partial sums of the column sums: the bias gradients (3H columns at most), d epsilon (1)
    const size_t part3 = sum_part_bytes<A>(l.N, 3 * l.H), part1 = sum_part_bytes<A>(l.N, 1),
                 partH = sum_part_bytes<A>(l.N, l.H);
    const size_t part = part3 > part1 ? part3 : part1;
    l.bwd = add(l.part, part > partH ? part : partH);
    return l;
}

// Workspace: the forward's (inference), or the larger of both (training: the same size serves
// the backward). Reserve: training only.
template <class E>
inline void rnn_sizes(const struct kf_rnn_plan *p, int64_t T, int64_t B, bool training,
                      size_t *ws_bytes, size_t *reserve_bytes) {
    const RnnLayout l = rnn_layout<E>(p, T, B);
    *ws_bytes = training && l.bwd > l.fwd ? l.bwd : l.fwd;
    *reserve_bytes = training ? l.reserve : 0;
}

// What the per-step passes share: the sequence geometry, lengths and the dropout of the layer's
// output (counter of element j of direction d's half of row (t, b), layer l:
// offset + ((l T + t) B + b) D H + d H + j).
struct Seq {
    int64_t T, B, H, DH, ts, bs;
    const int32_t *lengths;
    bool drop;
    float p;
    double scale;
    uint64_t seed, base; // base: offset + l T B D H + d H
    KF__HD int64_t row(int64_t t, int64_t b) const { return t * ts + b * bs; }
    KF__HD bool valid(int64_t t, int64_t b) const {
        if (!lengths) return true;
        const int64_t n = lengths[b];
        return t < (n < 0 ? 0 : n > T ? T : n);
    }
    // v masked and scaled as the layer's dropout treats element j of row (t, b).
    template <class V> KF__HD V dropped(V v, int64_t t, int64_t b, int64_t j) const {
        if (!drop) return v;
        const uint64_t ctr = base + (uint64_t)((t * B + b) * DH + j);
        return kf__dropout_keep(seed, ctr, p) ? v * V(scale) : V(0);
    }
};

template <class V> KF__HD inline V sigm(V a) { return V(1) / (V(1) + exp(-a)); }

// The A-GRU's reserve keeps its gates' pre-activations a (cpu/rnn_cpu.h): the backward takes
// z = sigm(a) and 1 - z = sigm(-a), and 1 - tanh(a)^2 = 1 / cosh(a)^2 (0 where cosh overflows),
// none of which cancels in a saturated gate as 1 - z and 1 - d^2 from the rounded gates did.
template <class V> KF__HD inline V tanh_dc(V a) {
    const V c = cosh(a);
    return V(1) / (c * c);
}

// G[n, c] = bias[c % w] for the 3 blocks' biases laid out [3, H] (c = g H + j), N rows.
template <class T> struct FillBias3 {
    const T *b0, *b1, *b2;
    typename Elem<T>::acc *G;
    int64_t H;
    KF__HD void operator()(int64_t e) const {
        const int64_t c = e % (3 * H), g = c / H, j = c % H;
        G[e] = Elem<T>::get((g == 0 ? b0 : g == 1 ? b1 : b2)[j]);
    }
};

// dst[e] = src ? src[e] : 0, converted from S to D (h0 into the state, the state into hn, a
// buffer rounded to T, ...).
template <class S, class D> struct CopyOrZero {
    const S *src;
    D *dst;
    KF__HD void operator()(int64_t e) const {
        dst[e] = Elem<D>::put(src ? Elem<S>::get(src[e]) : typename Elem<S>::acc(0));
    }
};

// Wr [n1 + n2] in acc: w0's n0 elements, then w1's (GRU: W_hh [3H, H] alone; A-GRU: U_z and U_r
// [H, H], stacked so that one product serves both gates).
template <class T> struct FormWr {
    const T *w0, *w1;
    typename Elem<T>::acc *wr;
    int64_t n0;
    KF__HD void operator()(int64_t e) const {
        wr[e] = Elem<T>::get(e < n0 ? w0[e] : w1[e - n0]);
    }
};

// A = W_h - W_h^T - gamma I [H, H] in acc.
template <class T> struct FormA {
    using A = typename Elem<T>::acc;
    const T *wh;
    A *a;
    int64_t H;
    A gamma;
    KF__HD void operator()(int64_t e) const {
        const int64_t i = e / H, j = e % H;
        a[e] = Elem<T>::get(wh[i * H + j]) - Elem<T>::get(wh[j * H + i]) - (i == j ? gamma : A(0));
    }
};

// One forward step of a GRU, element (b, j): r, z = sigmoid(gx + a + b_hh), hn = a_n + b_hn,
// n = tanh(gx_n + r hn), h' = n + z (h - n) on valid rows; the layer output row (0 past len,
// dropout applied); in training hp (every row) and the gates r, z, n, hn.
template <class T> struct GruStep {
    using A = typename Elem<T>::acc;
    Seq s;
    int64_t t;
    const A *gx, *a;
    const T *bhh;
    A *h;
    T *out;        // the layer output's direction half
    A *hp, *gates; // NULL in inference
    KF__HD void operator()(int64_t e) const {
        const int64_t H = s.H, b = e / H, j = e % H, r = s.row(t, b);
        A *hj = h + b * H + j;
        if (hp) hp[r * H + j] = *hj;
        const bool ok = s.valid(t, b);
        if (ok) {
            const A *g = gx + r * 3 * H, *ab = a + b * 3 * H;
            const A rr = sigm(g[j] + ab[j] + Elem<T>::get(bhh[j]));
            const A z = sigm(g[H + j] + ab[H + j] + Elem<T>::get(bhh[H + j]));
            const A hn = ab[2 * H + j] + Elem<T>::get(bhh[2 * H + j]);
            const A n = tanh(g[2 * H + j] + rr * hn);
            *hj = n + z * (*hj - n);
            if (gates) {
                A *sv = gates + r * 4 * H;
                sv[j] = rr, sv[H + j] = z, sv[2 * H + j] = n, sv[3 * H + j] = hn;
            }
        }
        out[r * s.DH + j] = Elem<T>::put(ok ? s.dropped(*hj, t, b, j) : A(0));
    }
};

// A-GRU step, first pass, element (b, j): hp saved; on valid rows z, r = sigmoid(gx + h U^T)
// into a's first two blocks and q = r h, their pre-activations into the gates in training; else
// q = 0.
template <class T> struct AgruGates {
    using A = typename Elem<T>::acc;
    Seq s;
    int64_t t;
    const A *gx, *h;
    A *a, *q, *hp, *gates;
    KF__HD void operator()(int64_t e) const {
        const int64_t H = s.H, b = e / H, j = e % H, r = s.row(t, b);
        const A hv = h[b * H + j];
        if (hp) hp[r * H + j] = hv;
        if (!s.valid(t, b)) {
            q[b * H + j] = A(0);
            return;
        }
        A *ab = a + b * 3 * H;
        const A *g = gx + r * 3 * H;
        const A az = g[j] + ab[j], ar = g[H + j] + ab[H + j];
        if (gates) gates[r * 3 * H + j] = az, gates[r * 3 * H + H + j] = ar;
        ab[j] = sigm(az);
        ab[H + j] = sigm(ar);
        q[b * H + j] = ab[H + j] * hv;
    }
};

// A-GRU step, second pass (a's third block = q A^T): d = tanh(gx_d + a_d), h' = h + eps z d on
// valid rows; d's pre-activation into the gates in training; the output row as GruStep's.
template <class T> struct AgruUpdate {
    using A = typename Elem<T>::acc;
    Seq s;
    int64_t t;
    const A *gx, *a;
    const T *eps;
    A *h;
    T *out;
    A *gates;
    KF__HD void operator()(int64_t e) const {
        const int64_t H = s.H, b = e / H, j = e % H, r = s.row(t, b);
        A *hj = h + b * H + j;
        const bool ok = s.valid(t, b);
        if (ok) {
            const A *ab = a + b * 3 * H;
            const A ad = gx[r * 3 * H + 2 * H + j] + ab[2 * H + j];
            *hj += Elem<T>::get(*eps) * ab[j] * tanh(ad);
            if (gates) gates[r * 3 * H + 2 * H + j] = ad;
        }
        out[r * s.DH + j] = Elem<T>::put(ok ? s.dropped(*hj, t, b, j) : A(0));
    }
};

// The weights of cell (l, d): the input-side gate weights, as the products take them (nx blocks of
// hx rows, block g at wx[g]: the GRU's W_ih [3H, in] is one contiguous block, so one product; the
// A-GRU's W_z, W_r, V_h are three), the three gate biases, and the recurrent weights.
template <class T> struct Cell {
    const T *wx[3], *bx[3];
    int nx;
    int64_t hx;
    const T *whh, *bhh;          // GRU
    const T *uz, *ur, *wh, *eps; // A-GRU (eps: device scalar)
    int64_t in, idx;
};

template <class T>
inline Cell<T> cell_of(const struct kf_rnn_plan *p, const void *const *w, int32_t l, int32_t d) {
    Cell<T> c = {};
    c.in = kf__rnn_layer_input(p, l);
    c.idx = (int64_t)l * p->D + d;
    const void *const *cw = w + c.idx * p->nw;
    const int64_t H = p->H;
    if (p->cell != KF_RNN_AGRU) {
        const T *bih = (const T *)cw[KF__GRU_B_IH];
        c.nx = 1, c.hx = 3 * H, c.wx[0] = (const T *)cw[KF__GRU_W_IH];
        for (int g = 0; g < 3; g++) c.bx[g] = bih + g * H;
        c.whh = (const T *)cw[KF__GRU_W_HH];
        c.bhh = (const T *)cw[KF__GRU_B_HH];
        return c;
    }
    const int wx[3] = {KF__AGRU_W_Z, KF__AGRU_W_R, KF__AGRU_V_H};
    const int bx[3] = {KF__AGRU_B_Z, KF__AGRU_B_R, KF__AGRU_B_H};
    c.nx = 3, c.hx = H;
    for (int g = 0; g < 3; g++) c.wx[g] = (const T *)cw[wx[g]], c.bx[g] = (const T *)cw[bx[g]];
    c.uz = (const T *)cw[KF__AGRU_U_Z];
    c.ur = (const T *)cw[KF__AGRU_U_R];
    c.wh = (const T *)cw[KF__AGRU_W_H];
    c.eps = (const T *)cw[KF__AGRU_EPS];
    return c;
}

inline Seq seq_of(const struct kf_rnn_plan *p, const RnnLayout &lo, const int32_t *lengths,
                  bool drop, uint64_t seed, uint64_t offset, int32_t l, int32_t d) {
    Seq s = {};
    s.T = lo.T, s.B = lo.B, s.H = lo.H, s.DH = lo.DH, s.ts = lo.ts, s.bs = lo.bs;
    s.lengths = lengths;
    s.drop = drop;
    s.p = p->dropout;
    s.scale = 1.0 / (1.0 - (double)p->dropout);
    s.seed = seed;
    s.base = offset + (uint64_t)((int64_t)l * lo.T * lo.B * lo.DH + (int64_t)d * lo.H);
    return s;
}

// A-GRU layer l's A [H, H] in the workspace.
template <class A> inline A *A_of(const RnnLayout &lo, void *ws, int32_t l) {
    return at_t<A>(ws, lo.A + (size_t)l * bytes_of<A>(lo.H, lo.H));
}

// A of every A-GRU layer into the workspace.
template <class T, class X>
kf_status form_A(X &ex, const struct kf_rnn_plan *p, const RnnLayout &lo, const void *const *w,
                 void *ws) {
    using A = typename Elem<T>::acc;
    if (!lo.agru) return KF_OK;
    for (int32_t l = 0; l < p->L; l++) {
        const Cell<T> c = cell_of<T>(p, w, l, 0);
        KF_TRY(ex.each(lo.H * lo.H, FormA<T>{c.wh, A_of<A>(lo, ws, l), lo.H, (A)p->gamma}));
    }
    return KF_OK;
}

// Wr of cell c into the workspace: GRU W_hh [3H, H], A-GRU [U_z; U_r] [2H, H].
template <class T, class X>
kf_status form_wr(X &ex, const RnnLayout &lo, const Cell<T> &c, void *ws) {
    const int64_t hh = lo.H * lo.H;
    const FormWr<T> f = {lo.agru ? c.uz : c.whh, c.ur, at_t<typename Elem<T>::acc>(ws, lo.wr),
                         lo.agru ? hh : 3 * hh};
    return ex.each(lo.agru ? 2 * hh : 3 * hh, f);
}

template <class T, class X> kf_status rnn_forward(X &ex, const kf__rnn_fwd *c) {
    using A = typename Elem<T>::acc;
    const struct kf_rnn_plan *p = c->plan;
    const RnnLayout lo = rnn_layout<T>(p, c->T, c->B);
    const int64_t N = lo.N, H = lo.H, B = lo.B; // T = 0: no step runs, h_n = h0
    KF_TRY(form_A<T>(ex, p, lo, c->w, c->ws));
    A *gx = at_t<A>(c->ws, lo.gx), *a = at_t<A>(c->ws, lo.a), *q = at_t<A>(c->ws, lo.q),
      *h = at_t<A>(c->ws, lo.h);
    const A *wr = at_t<A>(c->ws, lo.wr);
    const T *x = (const T *)c->x;
    for (int32_t l = 0; l < p->L; l++) {
        T *out = l == p->L - 1 ? (T *)c->y
                 : c->training ? at_t<T>(c->reserve, lo.out0 + (size_t)l * lo.out_bytes)
                               : at_t<T>(c->ws, lo.seq + (size_t)(l % 2) * lo.out_bytes);
        const bool drop = c->training && p->dropout > 0.0f && l < p->L - 1;
        for (int32_t d = 0; d < p->D; d++) {
            const Cell<T> cw = cell_of<T>(p, c->w, l, d);
            const Seq s = seq_of(p, lo, c->lengths, drop, c->seed, c->offset, l, d);
            A *hp = c->training ? at_t<A>(c->reserve, (size_t)cw.idx * lo.cell_bytes) : nullptr;
            A *gates = hp ? (A *)((char *)hp + lo.hp_bytes) : nullptr;
            KF_TRY(ex.each(N * 3 * H, FillBias3<T>{cw.bx[0], cw.bx[1], cw.bx[2], gx, H}));
            for (int g = 0; g < cw.nx; g++)
                KF_TRY(ex.gemm(false, true, N, cw.hx, cw.in, A(1), x, cw.in, cw.wx[g], cw.in,
                               A(1), gx + g * cw.hx, 3 * H));
            KF_TRY(form_wr(ex, lo, cw, c->ws));
            const T *h0 = c->h0 ? (const T *)c->h0 + cw.idx * B * H : nullptr;
            KF_TRY(ex.each(B * H, CopyOrZero<T, A>{h0, h}));
            T *od = out + d * H;
            for (int64_t k = 0; k < lo.T; k++) {
                const int64_t t = d ? lo.T - 1 - k : k;
                if (!lo.agru) {
                    KF_TRY(ex.gemm(false, true, B, 3 * H, H, A(1), h, H, wr, H, A(0), a, 3 * H));
                    KF_TRY(ex.each(B * H, GruStep<T>{s, t, gx, a, cw.bhh, h, od, hp, gates}));
                    continue;
                }
                KF_TRY(ex.gemm(false, true, B, 2 * H, H, A(1), h, H, wr, H, A(0), a, 3 * H));
                KF_TRY(ex.each(B * H, AgruGates<T>{s, t, gx, h, a, q, hp, gates}));
                KF_TRY(ex.gemm(false, true, B, H, H, A(1), q, H, A_of<A>(lo, c->ws, l), H, A(0),
                               a + 2 * H, 3 * H));
                KF_TRY(ex.each(B * H, AgruUpdate<T>{s, t, gx, a, cw.eps, h, od, gates}));
            }
            if (c->hn) KF_TRY(ex.each(B * H, CopyOrZero<A, T>{h, (T *)c->hn + cw.idx * B * H}));
        }
        x = out;
    }
    return KF_OK;
}

} // namespace kf_plain

#endif // KF_CUDA_PLAIN_RNN_CUH

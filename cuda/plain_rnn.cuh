// The CUDA backend's float64 GRU and A-GRU (dtype KF_DTYPE_F64), computed plainly as in
// cuda/plain.cuh (whose executor contract and helpers it shares): every product one float64
// GEMM, the gate math one elementwise pass per step, each output element one writer, every sum in
// a fixed order. Records, layouts, dropout counters and lengths: core/rnn_backend.h; math and the
// backward's derivation: docs/ops/rnn.md (the CPU's float64 form, cpu/rnn_f64.c, is the same
// algorithm with the batch split across threads; here the whole batch goes through each step).
//
// Both cells have three gate blocks on the input side (GRU r, z, n of weight_ih; A-GRU z, r, d:
// W_z, W_r, V_h), so the input projection, dX and the input-side weight gradients are one code.
// Rows r = t ts + b bs of the [N = T B] sequence ((ts, bs) = (B, 1), or (1, T) batch-first);
// len(b) = lengths[b] clamped to [0, T] (device lengths are never checked by the front end).
//
// Forward, per layer and direction: G_x = X W3^T + b3 [N, 3H]; then per step (t in the
// direction's order) the recurrent product of the whole batch's state h [B, H] into a [B, 3H]
// (GRU: h W_hh^T; A-GRU: h U_z^T, h U_r^T, then after the gate pass q A^T with q = r h and
// A = W_h - W_h^T - gamma I formed once per call) and the gate pass, which also writes the layer
// output row (dropout applied) and, in training, the state before the step and the gates into
// the reserve. Backward, per layer (last first) and direction: the reverse recurrence (per step
// the gate-gradient pass into dG_x [N, 3H] and, GRU, dG_h / A-GRU, q into aux [N, 3H or H]; then
// dh += dG_h W_hh, or dq = da_d A, a pass, dh += da_z U_z + da_r U_r), then every weight gradient
// and dX as whole-sequence GEMMs, d eps as per-row sums added in row order.
//
// Reserve (training), per cell (l, d): hp [N, H] (the state before each step, every row) and the
// gates [N, ng H] (GRU r, z, n, hn: ng = 4; A-GRU z, r, d: ng = 3); then the output [N, D H] of
// every layer but the last. Workspace: forward G_x [N, 3H], a [B, 3H], q and h [B, H], A per
// A-GRU layer [H, H], and (inference) two [N, D H] layer outputs; backward dG_x and aux [N, 3H]
// (an A-GRU's aux is q [N, H], then its per-element d eps terms [N, H]), dh, dq [B, H], A,
// G [H, H], per-row d eps [N], two [N, D H] buffers of d(layer input).
#ifndef KF_CUDA_PLAIN_RNN_CUH
#define KF_CUDA_PLAIN_RNN_CUH

#include "counter_rng.h"
#include "plain.cuh"
#include "rnn_backend.h"

namespace kf_plain {

// Everything derived from (plan, T, B): strides and byte offsets.
struct RnnLayout {
    int64_t T, B, N, H, D, DH, ts, bs, ng;
    bool agru;
    size_t cell_bytes, hp_bytes, out0, out_bytes, reserve; // reserve
    size_t gx, a, q, h, A, seq, fwd;                         // forward workspace
    size_t dgx, aux, dh, dq, gmat, eps, dseq, bwd;           // backward workspace
};

inline RnnLayout rnn_layout(const struct kf_rnn_plan *p, int64_t T, int64_t B) {
    RnnLayout l = {};
    l.T = T, l.B = B, l.N = T * B, l.H = p->H, l.D = p->D, l.DH = p->D * p->H;
    l.ts = p->batch_first ? 1 : B;
    l.bs = p->batch_first ? T : 1;
    l.agru = p->cell == KF_RNN_AGRU;
    l.ng = l.agru ? 3 : 4;
    l.hp_bytes = doubles(l.N, l.H);
    l.cell_bytes = add(l.hp_bytes, doubles(l.N, l.ng * l.H));
    const int64_t cells = (int64_t)p->L * p->D;
    size_t v;
    l.out0 = kf__mul_size(l.cell_bytes, (size_t)cells, &v) ? v : SIZE_MAX;
    l.out_bytes = doubles(l.N, l.DH);
    l.reserve = add(l.out0, kf__mul_size(l.out_bytes, (size_t)(p->L - 1), &v) ? v : SIZE_MAX);
    const size_t As = l.agru ? (kf__mul_size(doubles(l.H, l.H), (size_t)p->L, &v) ? v : SIZE_MAX)
                             : 0;
    l.A = 0; // both directions' workspaces begin with A
    l.gx = As;
    l.a = add(l.gx, doubles(l.N, 3 * l.H));
    l.q = add(l.a, doubles(l.B, 3 * l.H));
    l.h = add(l.q, doubles(l.B, l.H));
    l.seq = add(l.h, doubles(l.B, l.H));
    l.fwd = add(l.seq, add(l.out_bytes, l.out_bytes));
    l.dgx = As;
    l.aux = add(l.dgx, doubles(l.N, 3 * l.H));
    l.dh = add(l.aux, doubles(l.N, 3 * l.H));
    l.dq = add(l.dh, doubles(l.B, l.H));
    l.gmat = add(l.dq, doubles(l.B, l.H));
    l.eps = add(l.gmat, doubles(l.H, l.H));
    l.dseq = add(l.eps, doubles(l.N, 1));
    l.bwd = add(l.dseq, add(l.out_bytes, l.out_bytes));
    return l;
}

// Workspace: the forward's (inference), or the larger of both (training: the same size serves
// the backward). Reserve: training only.
inline void rnn_sizes(const struct kf_rnn_plan *p, int64_t T, int64_t B, bool training,
                      size_t *ws_bytes, size_t *reserve_bytes) {
    const RnnLayout l = rnn_layout(p, T, B);
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
    KF__HD double dropped(double v, int64_t t, int64_t b, int64_t j) const {
        if (!drop) return v;
        const uint64_t ctr = base + (uint64_t)((t * B + b) * DH + j);
        return kf__dropout_keep(seed, ctr, p) ? v * scale : 0.0;
    }
};

KF__HD inline double sigm(double a) { return 1.0 / (1.0 + exp(-a)); }

// G[n, c] = bias[c % w] for the 3 blocks' biases laid out [3, H] (c = g H + j), N rows.
struct FillBias3 {
    const double *b0, *b1, *b2;
    double *G;
    int64_t H;
    KF__HD void operator()(int64_t e) const {
        const int64_t c = e % (3 * H), g = c / H, j = c % H;
        G[e] = (g == 0 ? b0 : g == 1 ? b1 : b2)[j];
    }
};

// dst[e] = src ? src[e] : 0 (h0 into the state, the state into hn, ...).
struct CopyOrZero {
    const double *src;
    double *dst;
    KF__HD void operator()(int64_t e) const { dst[e] = src ? src[e] : 0.0; }
};

// A = W_h - W_h^T - gamma I [H, H].
struct FormA {
    const double *wh;
    double *A;
    int64_t H;
    double gamma;
    KF__HD void operator()(int64_t e) const {
        const int64_t i = e / H, j = e % H;
        A[e] = wh[i * H + j] - wh[j * H + i] - (i == j ? gamma : 0.0);
    }
};

// One forward step of a GRU, element (b, j): r, z = sigmoid(gx + a + b_hh), hn = a_n + b_hn,
// n = tanh(gx_n + r hn), h' = n + z (h - n) on valid rows; the layer output row (0 past len,
// dropout applied); in training hp (every row) and the gates r, z, n, hn.
struct GruStep {
    Seq s;
    int64_t t;
    const double *gx, *a, *bhh;
    double *h, *out, *hp, *gates; // out: the layer output's direction half; hp, gates: NULL
    KF__HD void operator()(int64_t e) const {
        const int64_t H = s.H, b = e / H, j = e % H, r = s.row(t, b);
        double *hj = h + b * H + j;
        if (hp) hp[r * H + j] = *hj;
        const bool ok = s.valid(t, b);
        if (ok) {
            const double *g = gx + r * 3 * H, *ab = a + b * 3 * H;
            const double rr = sigm(g[j] + ab[j] + bhh[j]);
            const double z = sigm(g[H + j] + ab[H + j] + bhh[H + j]);
            const double hn = ab[2 * H + j] + bhh[2 * H + j];
            const double n = tanh(g[2 * H + j] + rr * hn);
            *hj = n + z * (*hj - n);
            if (gates) {
                double *sv = gates + r * 4 * H;
                sv[j] = rr, sv[H + j] = z, sv[2 * H + j] = n, sv[3 * H + j] = hn;
            }
        }
        out[r * s.DH + j] = ok ? s.dropped(*hj, t, b, j) : 0.0;
    }
};

// A-GRU step, first pass, element (b, j): hp saved; on valid rows z, r = sigmoid(gx + h U^T)
// into a's first two blocks and q = r h; else q = 0.
struct AgruGates {
    Seq s;
    int64_t t;
    const double *gx, *h;
    double *a, *q, *hp;
    KF__HD void operator()(int64_t e) const {
        const int64_t H = s.H, b = e / H, j = e % H, r = s.row(t, b);
        const double hv = h[b * H + j];
        if (hp) hp[r * H + j] = hv;
        if (!s.valid(t, b)) {
            q[b * H + j] = 0.0;
            return;
        }
        double *ab = a + b * 3 * H;
        const double *g = gx + r * 3 * H;
        ab[j] = sigm(g[j] + ab[j]);
        ab[H + j] = sigm(g[H + j] + ab[H + j]);
        q[b * H + j] = ab[H + j] * hv;
    }
};

// A-GRU step, second pass (a's third block = q A^T): d = tanh(gx_d + a_d), h' = h + eps z d on
// valid rows; gates z, r, d in training; the output row as GruStep's.
struct AgruUpdate {
    Seq s;
    int64_t t;
    const double *gx, *a, *eps;
    double *h, *out, *gates;
    KF__HD void operator()(int64_t e) const {
        const int64_t H = s.H, b = e / H, j = e % H, r = s.row(t, b);
        double *hj = h + b * H + j;
        const bool ok = s.valid(t, b);
        if (ok) {
            const double *ab = a + b * 3 * H;
            const double dd = tanh(gx[r * 3 * H + 2 * H + j] + ab[2 * H + j]);
            *hj += *eps * ab[j] * dd;
            if (gates) {
                double *sv = gates + r * 3 * H;
                sv[j] = ab[j], sv[H + j] = ab[H + j], sv[2 * H + j] = dd;
            }
        }
        out[r * s.DH + j] = ok ? s.dropped(*hj, t, b, j) : 0.0;
    }
};

// The weights of cell (l, d): the three input-side gate blocks and the recurrent ones.
struct Cell {
    const double *wx[3], *bx[3];
    const double *whh, *bhh;        // GRU
    const double *uz, *ur, *wh, *eps; // A-GRU (eps: device scalar)
    int64_t in, idx;
};

inline Cell cell_of(const struct kf_rnn_plan *p, const void *const *w, int32_t l, int32_t d) {
    Cell c = {};
    c.in = kf__rnn_layer_input(p, l);
    c.idx = (int64_t)l * p->D + d;
    const void *const *cw = w + c.idx * p->nw;
    const int64_t H = p->H;
    if (p->cell != KF_RNN_AGRU) {
        const double *wih = (const double *)cw[KF__GRU_W_IH], *bih = (const double *)cw[KF__GRU_B_IH];
        for (int g = 0; g < 3; g++) c.wx[g] = wih + g * H * c.in, c.bx[g] = bih + g * H;
        c.whh = (const double *)cw[KF__GRU_W_HH];
        c.bhh = (const double *)cw[KF__GRU_B_HH];
        return c;
    }
    const int wx[3] = {KF__AGRU_W_Z, KF__AGRU_W_R, KF__AGRU_V_H};
    const int bx[3] = {KF__AGRU_B_Z, KF__AGRU_B_R, KF__AGRU_B_H};
    for (int g = 0; g < 3; g++)
        c.wx[g] = (const double *)cw[wx[g]], c.bx[g] = (const double *)cw[bx[g]];
    c.uz = (const double *)cw[KF__AGRU_U_Z];
    c.ur = (const double *)cw[KF__AGRU_U_R];
    c.wh = (const double *)cw[KF__AGRU_W_H];
    c.eps = (const double *)cw[KF__AGRU_EPS];
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

// A-GRU layer l's A [H, H] in the workspace (both directions' workspaces begin with them).
inline double *A_of(const RnnLayout &lo, void *ws, int32_t l) {
    return at(ws, lo.A + (size_t)l * doubles(lo.H, lo.H));
}

// A of every A-GRU layer into the workspace.
template <class X>
kf_status form_A(X &ex, const struct kf_rnn_plan *p, const RnnLayout &lo, const void *const *w,
                 void *ws) {
    if (!lo.agru) return KF_OK;
    for (int32_t l = 0; l < p->L; l++) {
        const Cell c = cell_of(p, w, l, 0);
        KF_TRY(ex.each(lo.H * lo.H, FormA{c.wh, A_of(lo, ws, l), lo.H, (double)p->gamma}));
    }
    return KF_OK;
}

template <class X> kf_status rnn_forward(X &ex, const kf__rnn_fwd *c) {
    const struct kf_rnn_plan *p = c->plan;
    const RnnLayout lo = rnn_layout(p, c->T, c->B);
    const int64_t N = lo.N, H = lo.H, B = lo.B; // T = 0: no step runs, h_n = h0
    KF_TRY(form_A(ex, p, lo, c->w, c->ws));
    double *gx = at(c->ws, lo.gx), *a = at(c->ws, lo.a), *q = at(c->ws, lo.q),
           *h = at(c->ws, lo.h);
    const double *x = (const double *)c->x;
    for (int32_t l = 0; l < p->L; l++) {
        double *out = l == p->L - 1 ? (double *)c->y
                      : c->training ? at(c->reserve, lo.out0 + (size_t)l * lo.out_bytes)
                                    : at(c->ws, lo.seq + (size_t)(l % 2) * lo.out_bytes);
        const bool drop = c->training && p->dropout > 0.0f && l < p->L - 1;
        for (int32_t d = 0; d < p->D; d++) {
            const Cell cw = cell_of(p, c->w, l, d);
            const Seq s = seq_of(p, lo, c->lengths, drop, c->seed, c->offset, l, d);
            double *hp = c->training ? at(c->reserve, (size_t)cw.idx * lo.cell_bytes) : nullptr;
            double *gates = hp ? (double *)((char *)hp + lo.hp_bytes) : nullptr;
            KF_TRY(ex.each(N * 3 * H, FillBias3{cw.bx[0], cw.bx[1], cw.bx[2], gx, H}));
            for (int g = 0; g < 3; g++)
                KF_TRY(ex.gemm(false, true, N, H, cw.in, 1.0, x, cw.in, cw.wx[g], cw.in, 1.0,
                               gx + g * H, 3 * H));
            const double *h0 = c->h0 ? (const double *)c->h0 + cw.idx * B * H : nullptr;
            KF_TRY(ex.each(B * H, CopyOrZero{h0, h}));
            double *od = out + d * H;
            for (int64_t k = 0; k < lo.T; k++) {
                const int64_t t = d ? lo.T - 1 - k : k;
                if (!lo.agru) {
                    KF_TRY(ex.gemm(false, true, B, 3 * H, H, 1.0, h, H, cw.whh, H, 0.0, a, 3 * H));
                    KF_TRY(ex.each(B * H, GruStep{s, t, gx, a, cw.bhh, h, od, hp, gates}));
                    continue;
                }
                KF_TRY(ex.gemm(false, true, B, H, H, 1.0, h, H, cw.uz, H, 0.0, a, 3 * H));
                KF_TRY(ex.gemm(false, true, B, H, H, 1.0, h, H, cw.ur, H, 0.0, a + H, 3 * H));
                KF_TRY(ex.each(B * H, AgruGates{s, t, gx, h, a, q, hp}));
                KF_TRY(ex.gemm(false, true, B, H, H, 1.0, q, H, A_of(lo, c->ws, l), H, 0.0,
                               a + 2 * H, 3 * H));
                KF_TRY(ex.each(B * H, AgruUpdate{s, t, gx, a, cw.eps, h, od, gates}));
            }
            if (c->hn) KF_TRY(ex.each(B * H, CopyOrZero{h, (double *)c->hn + cw.idx * B * H}));
        }
        x = out;
    }
    return KF_OK;
}

// ---- backward ------------------------------------------------------------------------------------

// gy[b, j]: d(layer output) of row (t, b), direction d's half, through the layer's dropout
// (zeros where dy is absent).
KF__HD inline double grad_in(const Seq &s, const double *dy, int64_t t, int64_t b, int64_t j,
                             int64_t r) {
    return dy ? s.dropped(dy[r * s.DH + j], t, b, j) : 0.0;
}

// GRU, element (b, j) of step t (g = dh + gy): da_n = g (1-z)(1-n^2), da_r = da_n hn r(1-r),
// da_z = g (hp - n) z(1-z); dG_x = [da_r, da_z, da_n], dG_h = [da_r, da_z, da_n r]; dh = g z.
// Rows past len: both rows 0, dh unchanged.
struct GruBack {
    Seq s;
    int64_t t;
    const double *dy, *hp, *gates; // dy: the layer output gradient's direction half (or NULL)
    double *dgx, *aux, *dh;
    KF__HD void operator()(int64_t e) const {
        const int64_t H = s.H, b = e / H, j = e % H, r = s.row(t, b);
        double *gxr = dgx + r * 3 * H, *ghr = aux + r * 3 * H;
        if (!s.valid(t, b)) {
            gxr[j] = gxr[H + j] = gxr[2 * H + j] = 0.0;
            ghr[j] = ghr[H + j] = ghr[2 * H + j] = 0.0;
            return;
        }
        const double *sv = gates + r * 4 * H;
        const double rr = sv[j], z = sv[H + j], n = sv[2 * H + j], hn = sv[3 * H + j];
        const double g = dh[b * H + j] + grad_in(s, dy, t, b, j, r);
        const double dan = g * (1.0 - z) * (1.0 - n * n);
        const double dar = dan * hn * rr * (1.0 - rr);
        const double daz = g * (hp[r * H + j] - n) * z * (1.0 - z);
        gxr[j] = ghr[j] = dar;
        gxr[H + j] = ghr[H + j] = daz;
        gxr[2 * H + j] = dan;
        ghr[2 * H + j] = dan * rr;
        dh[b * H + j] = g * z;
    }
};

// A-GRU, first pass of step t, element (b, j): da_z = g eps d z(1-z), da_d = g eps z (1-d^2),
// q = r hp (into aux [N, H]), dh = g, and the element's d eps term g z d into epsv [N, H] (summed
// per row, then over rows, after the recurrence); rows past len: zeros.
struct AgruBack1 {
    Seq s;
    int64_t t;
    const double *dy, *hp, *gates, *eps;
    double *dgx, *aux, *dh, *epsv;
    KF__HD void operator()(int64_t e) const {
        const int64_t H = s.H, b = e / H, j = e % H, r = s.row(t, b);
        double *gxr = dgx + r * 3 * H;
        if (!s.valid(t, b)) {
            gxr[j] = gxr[H + j] = gxr[2 * H + j] = 0.0;
            aux[r * H + j] = 0.0;
            epsv[r * H + j] = 0.0;
            return;
        }
        const double *sv = gates + r * 3 * H;
        const double z = sv[j], rr = sv[H + j], dd = sv[2 * H + j];
        const double g = dh[b * H + j] + grad_in(s, dy, t, b, j, r);
        gxr[j] = g * *eps * dd * z * (1.0 - z);
        gxr[2 * H + j] = g * *eps * z * (1.0 - dd * dd);
        aux[r * H + j] = rr * hp[r * H + j];
        dh[b * H + j] = g;
        epsv[r * H + j] = g * z * dd;
    }
};

// A-GRU, second pass (dq = da_d A): da_r = dq hp r(1-r), dh += dq r on valid rows.
struct AgruBack2 {
    Seq s;
    int64_t t;
    const double *dq, *hp, *gates;
    double *dgx, *dh;
    KF__HD void operator()(int64_t e) const {
        const int64_t H = s.H, b = e / H, j = e % H, r = s.row(t, b);
        if (!s.valid(t, b)) return;
        const double rr = gates[r * 3 * H + H + j], dqv = dq[b * H + j];
        dgx[r * 3 * H + H + j] = dqv * hp[r * H + j] * rr * (1.0 - rr);
        dh[b * H + j] += dqv * rr;
    }
};

// dW_h (+)= G - G^T (dA = G, A = W_h - W_h^T - gamma I).
struct FoldWh {
    const double *G;
    double *dwh;
    int64_t H;
    bool acc;
    KF__HD void operator()(int64_t e) const {
        const int64_t i = e / H, j = e % H;
        const double v = G[i * H + j] - G[j * H + i];
        dwh[e] = acc ? dwh[e] + v : v;
    }
};

// *deps (+)= sum of rows[0..N) (in order), rows[n] = sum over j of v[n, j] (in order).
struct RowSums {
    const double *v;
    double *rows;
    int64_t H;
    KF__HD void operator()(int64_t n) const {
        double s = 0.0;
        for (int64_t j = 0; j < H; ++j) s += v[n * H + j];
        rows[n] = s;
    }
};
struct TotalInto {
    const double *rows;
    double *dst;
    int64_t N;
    bool acc;
    KF__HD void operator()(int64_t) const {
        double s = 0.0;
        for (int64_t n = 0; n < N; ++n) s += rows[n];
        *dst = acc ? *dst + s : s;
    }
};

template <class X> kf_status rnn_backward(X &ex, const kf__rnn_bwd *c) {
    const struct kf_rnn_plan *p = c->plan;
    const RnnLayout lo = rnn_layout(p, c->T, c->B);
    // T = 0: no step runs, dh0 = dhn and the weight gradients are 0 (or unchanged)
    const int64_t N = lo.N, H = lo.H, B = lo.B, ld3 = lo.bs * 3 * H;
    KF_TRY(form_A(ex, p, lo, c->w, c->ws));
    double *dgx = at(c->ws, lo.dgx), *aux = at(c->ws, lo.aux), *dh = at(c->ws, lo.dh),
           *dq = at(c->ws, lo.dq), *gmat = at(c->ws, lo.gmat), *erows = at(c->ws, lo.eps);
    double *epsv = aux + N * H; // A-GRU: aux holds q [N, H], then these terms
    const bool acc = c->accumulate;
    for (int32_t l = p->L - 1; l >= 0; l--) {
        const double *x = l ? at((void *)c->reserve, lo.out0 + (size_t)(l - 1) * lo.out_bytes)
                            : (const double *)c->x;
        const double *dy = l == p->L - 1 ? (const double *)c->dy
                                         : at(c->ws, lo.dseq + (size_t)(l % 2) * lo.out_bytes);
        double *dx = l ? at(c->ws, lo.dseq + (size_t)((l - 1) % 2) * lo.out_bytes)
                       : (double *)c->dx;
        const bool drop = p->dropout > 0.0f && l < p->L - 1;
        for (int32_t d = 0; d < p->D; d++) {
            const Cell cw = cell_of(p, c->w, l, d);
            const Seq s = seq_of(p, lo, c->lengths, drop, c->seed, c->offset, l, d);
            const double *hp = at((void *)c->reserve, (size_t)cw.idx * lo.cell_bytes);
            const double *gates = (const double *)((const char *)hp + lo.hp_bytes);
            const double *dhn = c->dhn ? (const double *)c->dhn + cw.idx * B * H : nullptr;
            KF_TRY(ex.each(B * H, CopyOrZero{dhn, dh}));
            const double *dyd = dy ? dy + d * H : nullptr;
            for (int64_t k = 0; k < lo.T; k++) {
                const int64_t t = d ? k : lo.T - 1 - k, r0 = t * lo.ts;
                if (!lo.agru) {
                    KF_TRY(ex.each(B * H, GruBack{s, t, dyd, hp, gates, dgx, aux, dh}));
                    KF_TRY(ex.gemm(false, false, B, H, 3 * H, 1.0, aux + r0 * 3 * H, ld3, cw.whh,
                                   H, 1.0, dh, H));
                    continue;
                }
                KF_TRY(ex.each(B * H, AgruBack1{s, t, dyd, hp, gates, cw.eps, dgx, aux, dh,
                                                epsv}));
                KF_TRY(ex.gemm(false, false, B, H, H, 1.0, dgx + r0 * 3 * H + 2 * H, ld3,
                               A_of(lo, c->ws, l), H, 0.0, dq, H));
                KF_TRY(ex.each(B * H, AgruBack2{s, t, dq, hp, gates, dgx, dh}));
                KF_TRY(ex.gemm(false, false, B, H, H, 1.0, dgx + r0 * 3 * H, ld3, cw.uz, H, 1.0,
                               dh, H));
                KF_TRY(ex.gemm(false, false, B, H, H, 1.0, dgx + r0 * 3 * H + H, ld3, cw.ur, H,
                               1.0, dh, H));
            }
            if (c->dh0) KF_TRY(ex.each(B * H, CopyOrZero{dh, (double *)c->dh0 + cw.idx * B * H}));

            // the whole-sequence products of this cell
            void *const *dw = c->dw ? c->dw + cw.idx * p->nw : nullptr;
            auto W = [&](int j) { return dw ? (double *)dw[j] : nullptr; };
            for (int g = 0; g < 3; g++) {
                double *dwx, *dbx;
                if (lo.agru) {
                    const int wx[3] = {KF__AGRU_W_Z, KF__AGRU_W_R, KF__AGRU_V_H};
                    const int bx[3] = {KF__AGRU_B_Z, KF__AGRU_B_R, KF__AGRU_B_H};
                    dwx = W(wx[g]), dbx = W(bx[g]);
                } else {
                    dwx = W(KF__GRU_W_IH) ? W(KF__GRU_W_IH) + g * H * cw.in : nullptr;
                    dbx = W(KF__GRU_B_IH) ? W(KF__GRU_B_IH) + g * H : nullptr;
                }
                if (dwx)
                    KF_TRY(ex.gemm(true, false, H, cw.in, N, 1.0, dgx + g * H, 3 * H, x, cw.in,
                                   acc ? 1.0 : 0.0, dwx, cw.in));
                if (dbx) KF_TRY(ex.each(H, ColumnSums<double>{dgx + g * H, dbx, N, 3 * H, acc}));
            }
            if (!lo.agru) {
                if (W(KF__GRU_W_HH))
                    KF_TRY(ex.gemm(true, false, 3 * H, H, N, 1.0, aux, 3 * H, hp, H,
                                   acc ? 1.0 : 0.0, W(KF__GRU_W_HH), H));
                if (W(KF__GRU_B_HH))
                    KF_TRY(ex.each(3 * H,
                                   ColumnSums<double>{aux, W(KF__GRU_B_HH), N, 3 * H, acc}));
            } else {
                if (W(KF__AGRU_U_Z))
                    KF_TRY(ex.gemm(true, false, H, H, N, 1.0, dgx, 3 * H, hp, H, acc ? 1.0 : 0.0,
                                   W(KF__AGRU_U_Z), H));
                if (W(KF__AGRU_U_R))
                    KF_TRY(ex.gemm(true, false, H, H, N, 1.0, dgx + H, 3 * H, hp, H,
                                   acc ? 1.0 : 0.0, W(KF__AGRU_U_R), H));
                if (W(KF__AGRU_W_H)) {
                    KF_TRY(ex.gemm(true, false, H, H, N, 1.0, dgx + 2 * H, 3 * H, aux, H, 0.0,
                                   gmat, H));
                    KF_TRY(ex.each(H * H, FoldWh{gmat, W(KF__AGRU_W_H), H, acc}));
                }
                if (W(KF__AGRU_EPS)) {
                    KF_TRY(ex.each(N, RowSums{epsv, erows, H}));
                    KF_TRY(ex.each(1, TotalInto{erows, W(KF__AGRU_EPS), N, acc}));
                }
            }
            if (dx)
                for (int g = 0; g < 3; g++)
                    KF_TRY(ex.gemm(false, false, N, cw.in, H, 1.0, dgx + g * H, 3 * H, cw.wx[g],
                                   cw.in, d || g ? 1.0 : 0.0, dx, cw.in));
        }
    }
    return KF_OK;
}

} // namespace kf_plain

#endif // KF_CUDA_PLAIN_RNN_CUH

// The CUDA backend's float64 plans of SKLinear, KANLinear and KANConv2d (dtype KF_DTYPE_F64;
// issue 16: float64 on CUDA is for accuracy, gradcheck and reference runs, so it is computed
// plainly, speed secondary): every product is one float64 GEMM on cuBLAS, everything between
// them one elementwise pass, and each output element has one writer (no atomics, every sum in a
// fixed order: the bits are the same from run to run). Records and notation: core/
// sklinear_backend.h and core/kan_backend.h; math: DESIGN.md and docs/ops/kan.md.
//
// The algorithms are written against an executor X, so that this one code runs both on the GPU
// (cuda/f64.cu: cuBLAS and a grid-stride kernel) and, compiled for the host with a loop executor,
// in tests/cxx/test_f64_algo.cpp against the float64 references of tests/c. X provides
//   kf_status gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)
//       row-major C[M, N] = alpha op(A) op(B) + beta C, op(A) = A [M, K] or, with ta, A^T of an A
//       stored [K, M] (as kf__gemm in cuda/common.cuh); beta = 0 never reads C
//   kf_status gemm_batched(ta, tb, M, N, K, alpha, A, lda, sA, B, ldb, sB, beta, C, ldc, sC, n)
//       the same for b = 0..n-1 on A + b sA, B + b sB, C + b sC (a stride may be 0 for an input)
//   template <class F> kf_status each(int64_t n, const F &f)
//       f(i) for every i in [0, n), in any order and concurrently: f writes only what i owns
//   int64_t chunk_elems
//       the bound on a KAN chunk's A (kF64ChunkElems on the GPU, which the workspace query
//       assumes; the host test takes a small one to run several chunks)
// The functors below are plain structs (copied to the device by value) whose operator() is
// KF__HD; they trust the records as the op tables do (core/backend.h).
//
// SKLinear (W1 = [S1_1..S1_L | U2_1..U2_L] [in, 2r], read in place term by term):
//   forward   Z = x W1 [N, 2r] (two GEMMs batched over the L terms, k columns each), then
//             y = bias + s Z[:, :r] U1 + s Z[:, r:] S2, s = 1 / (2L)
//   backward  dZ[:, :r] = s dy U1^T (dx or dS1s wanted), dZ[:, r:] = s dy S2^T (dx wanted);
//             dx = sum over terms of dZ_i S1_i^T + dZ_{r+i} U2_i^T (2L GEMMs into dx, in order);
//             dS1s_i = x^T dZ[:, i k:(i+1) k] (batched); dS2s = s (x U2)^T dy; dbias = column
//             sums of dy (one thread per column, rows in order)
//   workspace 8 N 2r (dZ or Z) + 8 N r (x U2), each rounded up to 64 bytes
//
// KAN (rows n: KANLinear's x rows, or KANConv2d's patches, b-major; K = in cw):
//   prep      W [out, K] (combined weight; the SiLU column 0 without base_weight) and the knot
//             reciprocals inv [in, k, nk] (0 for spans narrower than FLT_MIN, as on the CPU)
//   per chunk of Nc rows (KANConv2d: Bg whole images), A [Nc, K] generated (one thread per
//   (row, feature): SiLU(x), then the window of k + 1 bases, zeros elsewhere), then
//   forward   y[chunk] = A W^T (KANConv2d: y_b [out, Ho Wo] = W A_b^T, batched over images)
//   backward  dW (+)= dy[chunk]^T A (chunk order; KANConv2d one GEMM per image, in order);
//             dA = dy[chunk] W, then per (row, feature) SiLU'(x) dA_silu + sum_c B'_c dA_c
//             (B' from the order-(k-1) window, docs/ops/kan.md) into dx (KANLinear) or into
//             dP [Nc, in] and gathered per pixel over the patches that read it (KANConv2d, in
//             kernel-offset order); after the chunks dW is folded into d base_weight,
//             d spline_weight (* scaler) and d spline_scaler (sum over c in order)
//   workspace 8 out K (W) + 8 in k nk + 8 out K (dW) + 2 x 8 Nc K (A, dA) + 8 Nc in (dP,
//             KANConv2d), with Nc K <= the executor's chunk_elems (or one row, or one image's
//             rows, where that is larger)
#ifndef KF_CUDA_F64_ALGO_CUH
#define KF_CUDA_F64_ALGO_CUH

#include "bspline.h"
#include "core.h"
#include "kan_backend.h"
#include "sklinear_backend.h"

#include <float.h>
#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define KF__HD __host__ __device__
#else
#define KF__HD
#endif

namespace kf_f64 {

// Elements of A (and of dA) per KAN chunk: 2^22 doubles, 32 MiB.
constexpr int64_t kF64ChunkElems = int64_t(1) << 22;
// The spline-order bound of the basis window (cuda/kan_linear.cu's kMaxOrder; supports() refuses
// more).
constexpr int kF64MaxOrder = 15;

// ---- workspace sizing (saturating: SIZE_MAX where it cannot fit) ------------------------------

inline size_t doubles(int64_t a, int64_t b) {
    size_t v;
    if (a < 0 || b < 0 || !kf__mul_size((size_t)a, (size_t)b, &v) ||
        !kf__mul_size(v, sizeof(double), &v) || v > SIZE_MAX - KF__ALIGN)
        return SIZE_MAX;
    return kf__align_up(v);
}
inline size_t add(size_t a, size_t b) {
    size_t v;
    return kf__add_size(a, b, &v) ? v : SIZE_MAX;
}
inline double *at(void *ws, size_t off) { return (double *)((char *)ws + off); }

// ---- SKLinear ------------------------------------------------------------------------------------

inline size_t skl_workspace(const struct kf_sklinear_plan *p, int64_t N) {
    return add(doubles(N, 2 * p->r), doubles(N, p->r));
}

// y[i] = bias[i % out].
struct FillRows {
    const double *bias;
    double *y;
    int64_t out;
    KF__HD void operator()(int64_t i) const { y[i] = bias[i % out]; }
};

// db[o] (+)= sum over the N rows of g[n ld + o], rows in order (a bias gradient).
struct ColumnSums {
    const double *g;
    double *db;
    int64_t N, ld;
    bool acc;
    KF__HD void operator()(int64_t o) const {
        double s = 0.0;
        for (int64_t n = 0; n < N; ++n) s += g[n * ld + o];
        db[o] = acc ? db[o] + s : s;
    }
};

// Z[:, col0 + i k .. col0 + (i+1) k) = x T_i for the L terms of T [L, in, k]; Z's row length ldz.
template <class X>
kf_status skl_bottleneck(X &ex, const struct kf_sklinear_plan *p, int64_t N, const double *x,
                         const double *T, double *Z, int64_t ldz) {
    return ex.gemm_batched(false, false, N, p->k, p->in, 1.0, x, p->in, 0, T, p->k,
                           p->in * p->k, 0.0, Z, ldz, p->k, p->L);
}

template <class X> kf_status skl_forward(X &ex, const kf__skl_fwd *c) {
    const struct kf_sklinear_plan *p = c->plan;
    const int64_t N = c->N, r = p->r, R = 2 * r;
    if (N <= 0) return KF_OK;
    const double *x = (const double *)c->x;
    double *Z = at(c->ws, 0), *y = (double *)c->y;
    const double s = 1.0 / (2.0 * (double)p->L);
    KF_TRY(skl_bottleneck(ex, p, N, x, (const double *)c->S1, Z, R));
    KF_TRY(skl_bottleneck(ex, p, N, x, (const double *)c->U2, Z + r, R));
    if (c->bias) KF_TRY(ex.each(N * p->out, FillRows{(const double *)c->bias, y, p->out}));
    KF_TRY(ex.gemm(false, false, N, p->out, r, s, Z, R, (const double *)c->U1, p->out,
                   c->bias ? 1.0 : 0.0, y, p->out));
    return ex.gemm(false, false, N, p->out, r, s, Z + r, R, (const double *)c->S2, p->out, 1.0,
                   y, p->out);
}

template <class X> kf_status skl_backward(X &ex, const kf__skl_bwd *c) {
    const struct kf_sklinear_plan *p = c->plan;
    const int64_t N = c->N, r = p->r, R = 2 * r, in = p->in, out = p->out, k = p->k;
    if (N <= 0) return KF_OK;
    const double *x = (const double *)c->x, *dy = (const double *)c->dy;
    const double *S1 = (const double *)c->S1, *S2 = (const double *)c->S2;
    const double *U1 = (const double *)c->U1, *U2 = (const double *)c->U2;
    const double s = 1.0 / (2.0 * (double)p->L), wb = c->accumulate ? 1.0 : 0.0;
    double *dZ = at(c->ws, 0);
    if (c->dx || c->dS1)
        KF_TRY(ex.gemm(false, true, N, r, out, s, dy, out, U1, out, 0.0, dZ, R));
    if (c->dx) {
        double *dx = (double *)c->dx;
        KF_TRY(ex.gemm(false, true, N, r, out, s, dy, out, S2, out, 0.0, dZ + r, R));
        for (int64_t h = 0; h < 2; ++h)
            for (int64_t i = 0; i < p->L; ++i)
                KF_TRY(ex.gemm(false, true, N, in, k, 1.0, dZ + h * r + i * k, R,
                               (h ? U2 : S1) + i * in * k, k, h + i > 0 ? 1.0 : 0.0, dx, in));
    }
    if (c->dS1)
        KF_TRY(ex.gemm_batched(true, false, in, k, N, 1.0, x, in, 0, dZ, R, k, wb,
                               (double *)c->dS1, k, in * k, p->L));
    if (c->dS2) {
        double *Z2 = at(c->ws, doubles(N, R));
        KF_TRY(skl_bottleneck(ex, p, N, x, U2, Z2, r));
        KF_TRY(ex.gemm(true, false, r, out, N, s, Z2, r, dy, out, wb, (double *)c->dS2, out));
    }
    if (c->db) KF_TRY(ex.each(out, ColumnSums{dy, (double *)c->db, N, out, c->accumulate}));
    return KF_OK;
}

// ---- KAN -----------------------------------------------------------------------------------------

// The rows of a call (KANLinear: x [N, in]; KANConv2d: the patches of x, kf__kan_patches).
struct Rows {
    const double *x;
    int64_t in;
    bool conv;
    kf__kan_patches g; // conv only
    // x at row n (global), feature f.
    KF__HD double at(int64_t n, int64_t f) const {
        if (!conv) return x[n * in + f];
        const int64_t hw = g.Ho * g.Wo, b = n / hw, pix = n % hw, oh = pix / g.Wo,
                      ow = pix % g.Wo, kk = (int64_t)g.kh * g.kw, ch = f / kk, ij = f % kk;
        const int64_t h = oh * g.sh - g.ph + ij / g.kw * g.dh,
                      w = ow * g.sw - g.pw + ij % g.kw * g.dw;
        if (h < 0 || h >= g.H || w < 0 || w >= g.W) return 0.0;
        return x[((b * g.Cin + ch) * g.H + h) * g.W + w];
    }
};

// What the per-(row, feature) functors share.
struct Feat {
    Rows rows;
    const double *grid, *inv; // grid [in, nk]; inv [in, k, nk]
    int64_t nk, C, cw, K;
    int k;
};

// W [out, K] and inv [in, k, nk] (element e < out K: W; the rest: inv).
struct Prep {
    const double *grid, *base, *spline, *scaler;
    double *W, *inv;
    int64_t out, in, C, cw, K, nk, nW;
    int k;
    KF__HD void operator()(int64_t e) const {
        if (e < nW) {
            const int64_t o = e / K, col = e % K, i = col / cw, c = col % cw, oi = o * in + i;
            W[e] = c == 0 ? (base ? base[oi] : 0.0)
                          : (scaler ? spline[oi * C + c - 1] * scaler[oi] : spline[oi * C + c - 1]);
            return;
        }
        const int64_t e2 = e - nW, i = e2 / ((int64_t)k * nk), q = e2 / nk % k + 1, m = e2 % nk;
        const double *t = grid + i * nk;
        const double d = m + q < nk ? t[m + q] - t[m] : 0.0;
        inv[e2] = d >= (double)FLT_MIN ? 1.0 / d : 0.0;
    }
};

// A[l, f cw .. f cw + C] for l = e / in (row n0 + l), f = e % in: SiLU(x), then the bases.
struct GenA {
    Feat F;
    int64_t n0;
    double *A;
    KF__HD void operator()(int64_t e) const {
        const int64_t in = F.rows.in, l = e / in, f = e % in;
        double *a = A + l * F.K + f * F.cw;
        for (int64_t c = 0; c < F.cw; ++c) a[c] = 0.0;
        const double xv = F.rows.at(n0 + l, f);
        a[0] = xv / (1.0 + exp(-xv));
        double Nw[kF64MaxOrder + 1];
        const int64_t j = kf__bspline_window<kF64MaxOrder>(F.grid + f * F.nk,
                                                            F.inv + f * F.k * F.nk, F.nk, F.k,
                                                            xv, Nw);
        if (j < 0) return;
        for (int r = 0; r <= F.k; ++r) {
            const int64_t b = j - F.k + r;
            if (b >= 0 && b < F.C) a[1 + b] = Nw[r];
        }
    }
};

// d/dx of row n0 + l, feature f (e = l in + f) from dA's row l:
//   SiLU'(x) dA_silu + sum_c dA_c k (B_{c,k-1} inv_k[c] - B_{c+1,k-1} inv_k[c+1])
// into dst[e] (KANLinear: dx + n0 in; KANConv2d: dP).
struct FoldDx {
    Feat F;
    int64_t n0;
    const double *dA;
    double *dst;
    KF__HD void operator()(int64_t e) const {
        const int64_t in = F.rows.in, l = e / in, f = e % in;
        const double *d = dA + l * F.K + f * F.cw;
        const double xv = F.rows.at(n0 + l, f), sg = 1.0 / (1.0 + exp(-xv));
        double s = d[0] * (sg * (1.0 + xv * (1.0 - sg)));
        const int k = F.k;
        if (k > 0) {
            const double *fi = F.inv + f * k * F.nk, *ik = fi + (int64_t)(k - 1) * F.nk;
            double Nw[kF64MaxOrder + 1];
            const int64_t j =
                kf__bspline_window<kF64MaxOrder>(F.grid + f * F.nk, fi, F.nk, k - 1, xv, Nw);
            if (j >= 0)
                for (int r = 0; r <= k; ++r) {
                    const int64_t c = j - k + r; // B'_c uses window entries r - 1 and r
                    if (c < 0 || c >= F.C) continue;
                    const double s0 = r >= 1 ? Nw[r - 1] : 0.0, s1 = r <= k - 1 ? Nw[r] : 0.0;
                    s += d[1 + c] * (double)k * (ik[c] * s0 - ik[c + 1] * s1);
                }
        }
        dst[e] = s;
    }
};

// dx[b, c, h, w] for the images b0.. of a chunk (e over their elements): the sum over kernel
// offsets (i, j), in row-major order, of dP[patch (oh, ow), feature (c kh + i) kw + j] where
// oh sh = h + ph - i dh and ow sw = w + pw - j dw are whole and inside the output.
struct Col2Im {
    kf__kan_patches g;
    int64_t b0, in;
    const double *dP; // [rows of the chunk, in]
    double *dx;
    KF__HD void operator()(int64_t e) const {
        const int64_t img = g.Cin * g.H * g.W, bl = e / img, r = e % img, ch = r / (g.H * g.W),
                      h = r / g.W % g.H, w = r % g.W;
        double s = 0.0;
        for (int64_t i = 0; i < g.kh; ++i) {
            const int64_t ohs = h + g.ph - i * g.dh;
            if (ohs < 0 || ohs % g.sh) continue;
            const int64_t oh = ohs / g.sh;
            if (oh >= g.Ho) continue;
            for (int64_t j = 0; j < g.kw; ++j) {
                const int64_t ows = w + g.pw - j * g.dw;
                if (ows < 0 || ows % g.sw) continue;
                const int64_t ow = ows / g.sw;
                if (ow >= g.Wo) continue;
                const int64_t n = (bl * g.Ho + oh) * g.Wo + ow, f = (ch * g.kh + i) * g.kw + j;
                s += dP[n * in + f];
            }
        }
        dx[(b0 + bl) * img + r] = s;
    }
};

// dW [out, K] folded into d base_weight, d spline_weight, d spline_scaler (e = o in + i).
struct FoldW {
    const double *dW, *spline, *scaler;
    double *dbase, *dspline, *dscaler;
    int64_t in, C, cw, K;
    bool acc;
    KF__HD void operator()(int64_t e) const {
        const int64_t o = e / in, i = e % in;
        const double *w = dW + o * K + i * cw;
        if (dbase) dbase[e] = acc ? dbase[e] + w[0] : w[0];
        const double sc = scaler ? scaler[e] : 1.0;
        double ds = 0.0;
        for (int64_t c = 0; c < C; ++c) {
            const double g = w[1 + c];
            if (dspline) {
                const double v = g * sc;
                dspline[e * C + c] = acc ? dspline[e * C + c] + v : v;
            }
            ds += g * spline[e * C + c];
        }
        if (dscaler) dscaler[e] = acc ? dscaler[e] + ds : ds;
    }
};

// dW = 0 (a backward with no rows).
struct Zero {
    double *v;
    KF__HD void operator()(int64_t e) const { v[e] = 0.0; }
};

// The chunking and the workspace offsets of a KAN call.
struct KanLayout {
    int64_t Nc;     // rows per chunk (KANConv2d: Bg Ho Wo)
    int64_t Bg, hw; // KANConv2d: images per chunk, pixels per image (KANLinear: 0, 1)
    size_t off_inv, off_dw, off_a, off_da, off_dp, bytes;
};

inline KanLayout kan_layout(const struct kf_kan_linear_plan *p, int64_t N,
                            const kf__kan_patches *pt, int64_t chunk_elems) {
    KanLayout l = {};
    const int64_t K = p->K > 0 ? p->K : 1;
    int64_t most = chunk_elems / K;
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
    const size_t w = doubles(p->out, p->K);
    l.off_inv = w;
    l.off_dw = add(l.off_inv, doubles(p->in * p->k, p->nk));
    l.off_a = add(l.off_dw, w);
    l.off_da = add(l.off_a, doubles(l.Nc, p->K));
    l.off_dp = add(l.off_da, doubles(l.Nc, p->K));
    l.bytes = add(l.off_dp, pt ? doubles(l.Nc, p->in) : 0);
    return l;
}

inline size_t kan_workspace(const struct kf_kan_linear_plan *p, int64_t N,
                            const kf__kan_patches *pt) {
    return kan_layout(p, N, pt, kF64ChunkElems).bytes;
}

inline Feat kan_feat(const struct kf_kan_linear_plan *p, const kf__kan_patches *pt,
                     const void *x, const void *grid, void *ws, const KanLayout &l) {
    Feat F = {};
    F.rows.x = (const double *)x;
    F.rows.in = p->in;
    F.rows.conv = pt != nullptr;
    if (pt) F.rows.g = *pt;
    F.grid = (const double *)grid;
    F.inv = at(ws, l.off_inv);
    F.nk = p->nk;
    F.C = p->C;
    F.cw = p->cw;
    F.K = p->K;
    F.k = p->k;
    return F;
}

// W (when `pack`) and inv into the workspace.
template <class X>
kf_status kan_prep(X &ex, const struct kf_kan_linear_plan *p, const void *grid, const void *base,
                   const void *spline, const void *scaler, void *ws, const KanLayout &l,
                   bool pack) {
    Prep q = {(const double *)grid, (const double *)base, (const double *)spline,
              (const double *)scaler, at(ws, 0), at(ws, l.off_inv), p->out, p->in, p->C, p->cw,
              p->K, p->nk, pack ? p->out * p->K : 0, p->k};
    return ex.each(q.nW + p->in * p->k * p->nk, q);
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

template <class X> kf_status kan_forward(X &ex, const kf__kan_fwd *c) {
    const struct kf_kan_linear_plan *p = c->plan;
    const kf__kan_patches *pt = c->patches;
    const int64_t N = c->N, K = p->K, out = p->out;
    if (N <= 0) return KF_OK;
    const KanLayout l = kan_layout(p, N, pt, ex.chunk_elems);
    KF_TRY(kan_prep(ex, p, c->grid, c->base, c->spline, c->scaler, c->ws, l, true));
    const Feat F = kan_feat(p, pt, c->x, c->grid, c->ws, l);
    const double *W = at(c->ws, 0);
    double *A = at(c->ws, l.off_a), *y = (double *)c->y;
    for (int64_t n0 = 0; n0 < N; n0 += l.Nc) {
        const Chunk ch = chunk_at(l, n0, N, pt != nullptr);
        KF_TRY(ex.each(ch.rows * p->in, GenA{F, n0, A}));
        if (pt)
            KF_TRY(ex.gemm_batched(false, true, out, l.hw, K, 1.0, W, K, 0, A, K, l.hw * K, 0.0,
                                   y + ch.b0 * out * l.hw, l.hw, out * l.hw, ch.imgs));
        else
            KF_TRY(ex.gemm(false, true, ch.rows, out, K, 1.0, A, K, W, K, 0.0, y + n0 * out,
                           out));
    }
    return KF_OK;
}

template <class X> kf_status kan_backward(X &ex, const kf__kan_bwd *c) {
    const struct kf_kan_linear_plan *p = c->plan;
    const kf__kan_patches *pt = c->patches;
    const int64_t N = c->N, K = p->K, out = p->out, in = p->in;
    const bool want_w = c->dbase || c->dspline || c->dscaler;
    if (N <= 0 || (!want_w && !c->dx)) return KF_OK;
    const KanLayout l = kan_layout(p, N, pt, ex.chunk_elems);
    KF_TRY(kan_prep(ex, p, c->grid, c->base, c->spline, c->scaler, c->ws, l, c->dx != nullptr));
    const Feat F = kan_feat(p, pt, c->x, c->grid, c->ws, l);
    const double *W = at(c->ws, 0), *dy = (const double *)c->dy;
    double *dW = at(c->ws, l.off_dw), *A = at(c->ws, l.off_a), *dA = at(c->ws, l.off_da);
    double *dx = (double *)c->dx;
    for (int64_t n0 = 0; n0 < N; n0 += l.Nc) {
        const Chunk ch = chunk_at(l, n0, N, pt != nullptr);
        if (want_w) {
            KF_TRY(ex.each(ch.rows * in, GenA{F, n0, A}));
            if (pt)
                for (int64_t b = 0; b < ch.imgs; ++b)
                    KF_TRY(ex.gemm(false, false, out, K, l.hw, 1.0,
                                   dy + (ch.b0 + b) * out * l.hw, l.hw, A + b * l.hw * K, K,
                                   n0 + b > 0 ? 1.0 : 0.0, dW, K));
            else
                KF_TRY(ex.gemm(true, false, out, K, ch.rows, 1.0, dy + n0 * out, out, A, K,
                               n0 > 0 ? 1.0 : 0.0, dW, K));
        }
        if (!dx) continue;
        if (pt) {
            double *dP = at(c->ws, l.off_dp);
            KF_TRY(ex.gemm_batched(true, false, l.hw, K, out, 1.0, dy + ch.b0 * out * l.hw, l.hw,
                                   out * l.hw, W, K, 0, 0.0, dA, K, l.hw * K, ch.imgs));
            KF_TRY(ex.each(ch.rows * in, FoldDx{F, n0, dA, dP}));
            KF_TRY(ex.each(ch.imgs * pt->Cin * pt->H * pt->W, Col2Im{*pt, ch.b0, in, dP, dx}));
        } else {
            KF_TRY(ex.gemm(false, false, ch.rows, K, out, 1.0, dy + n0 * out, out, W, K, 0.0, dA,
                           K));
            KF_TRY(ex.each(ch.rows * in, FoldDx{F, n0, dA, dx + n0 * in}));
        }
    }
    if (!want_w) return KF_OK;
    return ex.each(out * in, FoldW{dW, (const double *)c->spline, (const double *)c->scaler,
                                   (double *)c->dbase, (double *)c->dspline, (double *)c->dscaler,
                                   in, p->C, p->cw, K, c->accumulate});
}

} // namespace kf_f64

#endif // KF_CUDA_F64_ALGO_CUH

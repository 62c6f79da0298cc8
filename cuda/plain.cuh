// The CUDA backend's plain path: every product one cuBLAS GEMM, everything between the products
// one elementwise pass, each output element one writer (no atomics, every sum in a fixed order:
// the bits repeat from run to run). It serves
//  * float64 plans of every op (issue 16: float64 on CUDA is for accuracy, gradcheck and
//    reference runs; speed secondary): float64 GEMMs; the recurrent layers in plain_rnn.cuh;
//  * bfloat16 and float16 SKLinear, KANLinear and KANConv2d plans: every product's operands are
//    stored in the low type (SKLinear's stacked weights and bottleneck Z, KAN's combined operand A
//    and combined weight W), so the products run on the tensor cores (float32 accumulation,
//    cublasGemmEx with CUBLAS_COMPUTE_32F); everything else is float32;
//  * bfloat16 and float16 GRU and A-GRU plans whose H the persistent kernels do not take
//    (plain_rnn.cuh: the input-side products on the tensor cores, the recurrence in float32).
// Records and notation: core/sklinear_backend.h and core/kan_backend.h; math: docs/ops/sklinear.md
// and docs/ops/kan.md. The KAN layers' algorithms are in plain_kan.cuh, the recurrent layers' in
// plain_rnn.cuh, both over this header's executor, element types and helpers.
//
// The algorithms are written against an executor X, so that this one code runs both on the GPU
// (cuda/plain.cu: cuBLAS and a grid-stride kernel) and, compiled for the host with a loop
// executor, in tests/cxx/test_plain.cpp against the float64 references of tests/c. X provides
//   kf_status gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)
//       row-major C[M, N] = alpha op(A) op(B) + beta C, op(A) = A [M, K] or, with ta, A^T of an A
//       stored [K, M] (as kf__gemm in cuda/common.cuh); beta = 0 never reads C. A and B share
//       one element type TI (double, or a low type), C's TO is TI or Elem<TI>::acc; the products
//       accumulate in Elem<TI>::acc and C is rounded once
//   kf_status gemm_batched(ta, tb, M, N, K, alpha, A, lda, sA, B, ldb, sB, beta, C, ldc, sC, n)
//       the same for b = 0..n-1 on A + b sA, B + b sB, C + b sC (a stride may be 0 for an input)
//   template <class F> kf_status each(int64_t n, const F &f)
//       f(i) for every i in [0, n), in any order and concurrently: f writes only what i owns
//   int64_t chunk_bytes
//       the bound on a KAN chunk's A in bytes (kPlainChunkBytes on the GPU, which the workspace
//       query assumes; the host test takes a small one to run several chunks)
// The functors below are plain structs (copied to the device by value) whose operator() is
// KF__HD; they trust the records as the op tables do (core/backend.h).
//
// SKLinear, element type T (double, or bfloat16 / float16 storage with float32 arithmetic, acc
// below); the weights stacked into the workspace in T: W1 = [S1_1..S1_L | U2_1..U2_L] [in, R],
// W2 = [U1; S2] [R, out], each half c2 wide (r rounded up to 16 bytes, zeros after the r, so
// every product's operands are 16-byte aligned: skl_layout), R = 2 c2, s = 1 / (2L):
//   forward   Z = x W1 [N, R] in T, then y = bias + s Z W2: two GEMMs, y rounded once (the
//             second GEMM's beta = 1 onto the bias rows)
//   backward  dZ = s dy W2^T [N, R] in T (dx wanted; dS1s alone: its first r columns);
//             dx = dZ W1^T; dS1s_i (+)= x^T dZ[:, i k:(i+1) k] (batched over the L terms);
//             Z2 = x W1[:, c2:c2+r] = x U2 [N, r] in T, dS2s (+)= s Z2^T dy; dbias (+)= column
//             sums of dy in acc (column_sums: row ranges, then the ranges, each in order);
//             accumulation is round(acc(old) + g), by the GEMMs' beta = 1
//   workspace e R (in + out) (W1, W2) + e N R (Z or dZ) + e N c2 (Z2) + dbias's partial sums
//             (a P out, P <= 1024), e = sizeof(T), a = sizeof(acc), each rounded up to 64 bytes
//   epilogue  (an activation or dropout: kfuse.h) one pass over y after the second GEMM, which
//             cuBLAS stores (SklEpiPass); backward first forms g = dy mask / (1 - p) act'(pre)
//             [N, out] in T (SklEpiGrad, e N out more workspace), read in dy's place
//   Z, dZ and Z2 are rounded to T between the two products (as torch's own bfloat16 layers
//   round every product's result), so both products run on the tensor cores.
#ifndef KF_CUDA_PLAIN_CUH
#define KF_CUDA_PLAIN_CUH

#include "activation.h"
#include "bspline.h"
#include "core.h"
#include "kan_backend.h"
#include "lowp.h"
#include "sklinear_backend.h"

#include <float.h>
#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define KF__HD __host__ __device__
#else
#define KF__HD
#endif

namespace kf_plain {

// Bytes of A per KAN chunk: 32 MiB (2^22 doubles, 2^24 bfloat16 or float16 values).
constexpr int64_t kPlainChunkBytes = int64_t(1) << 25;
// The spline-order bound of the basis window (cuda/kan_cuda.cuh's kMaxOrder; kan_select refuses
// more).
constexpr int kPlainMaxOrder = 15;

// ---- index arithmetic ------------------------------------------------------------------------

// a / d and a % d for a >= 0, d > 0: in 32-bit unsigned arithmetic where both fit (a GPU divides
// 32-bit integers in about 20 instructions, 64-bit ones in about 70 through a library routine;
// the KAN convolution's patch indexing divides several times per element), in 64 bits otherwise.
struct QR {
    int64_t q, r;
};
KF__HD inline QR divmod(int64_t a, int64_t d) {
    if ((((uint64_t)a | (uint64_t)d) >> 32) == 0) {
        const int64_t q = (int64_t)((uint32_t)a / (uint32_t)d);
        return QR{q, a - q * d};
    }
    const int64_t q = a / d;
    return QR{q, a - q * d};
}

// ---- workspace sizing (saturating: SIZE_MAX where it cannot fit) ------------------------------

// Bytes of a x b elements of T, rounded up to KF__ALIGN (SIZE_MAX where that cannot fit).
template <class T> inline size_t bytes_of(int64_t a, int64_t b) {
    size_t v;
    if (a < 0 || b < 0 || !kf__mul_size((size_t)a, (size_t)b, &v) ||
        !kf__mul_size(v, sizeof(T), &v) || v > SIZE_MAX - KF__ALIGN)
        return SIZE_MAX;
    return kf__align_up(v);
}
inline size_t add(size_t a, size_t b) {
    size_t v;
    return kf__add_size(a, b, &v) ? v : SIZE_MAX;
}
// n blocks of `bytes` each.
inline size_t times(size_t bytes, int64_t n) {
    size_t v;
    return n >= 0 && kf__mul_size(bytes, (size_t)n, &v) ? v : SIZE_MAX;
}
template <class T> inline T *at_t(void *ws, size_t off) { return (T *)((char *)ws + off); }

// ---- element types ---------------------------------------------------------------------------
// Storage types of the low plans (the 16 bits as the library stores them) and, per element
// type, the arithmetic type acc and the conversions (core/lowp.h's: round to nearest even).
struct bf16 {
    uint16_t bits;
};
struct f16 {
    uint16_t bits;
};
template <class T> struct Elem;
template <> struct Elem<double> {
    using acc = double;
    static KF__HD double get(double v) { return v; }
    static KF__HD double put(double v) { return v; }
};
template <> struct Elem<float> {
    using acc = float;
    static KF__HD float get(float v) { return v; }
    static KF__HD float put(float v) { return v; }
};
template <> struct Elem<bf16> {
    using acc = float;
    static KF__HD float get(bf16 v) { return kf__bf16_to_f32(v.bits); }
    static KF__HD bf16 put(float v) { return bf16{kf__f32_to_bf16(v)}; }
};
template <> struct Elem<f16> {
    using acc = float;
    static KF__HD float get(f16 v) { return kf__f16_to_f32(v.bits); }
    static KF__HD f16 put(float v) { return f16{kf__f32_to_f16(v)}; }
};

// ---- fixed-order column sums (the bias gradients, the A-GRU's d epsilon) ------------------------
// db[o] (+)= sum over rows n < N of g[n ld + o], o < cols, in acc, in two levels: the rows split
// into P ranges of `per` rows, each (range, column) summed in row order into part [P, cols], then
// each column's P partial sums in range order; rounded once, accumulated as round(acc(old) +
// sum). The split is a function of (N, cols) alone, so the bits repeat on every device. One
// thread per column over all N rows would leave the device idle (SKLinear's dbias at out = N =
// 8192: 8192 threads of 8192 dependent adds; the A-GRU's d epsilon: one thread over T B rows).
constexpr int64_t kSumMinRows = 64;      // rows per range, at least
constexpr int64_t kSumPairs = 1 << 17;   // (range, column) threads aimed at
constexpr int64_t kSumMaxRanges = 1024;  // the second level's length, at most

struct SumSplit {
    int64_t P, per;
};
inline SumSplit sum_split(int64_t N, int64_t cols) {
    if (N <= 0 || cols <= 0) return SumSplit{1, 1};
    int64_t P = kSumPairs / cols;
    const int64_t most = (N + kSumMinRows - 1) / kSumMinRows;
    if (P > most) P = most;
    if (P > kSumMaxRanges) P = kSumMaxRanges;
    if (P < 1) P = 1;
    const int64_t per = (N + P - 1) / P;
    return SumSplit{(N + per - 1) / per, per};
}
// Bytes of the partial sums of a column sum over N rows and `cols` columns, in acc A.
template <class A> inline size_t sum_part_bytes(int64_t N, int64_t cols) {
    return bytes_of<A>(sum_split(N, cols).P, cols);
}

// part[q cols + o] = sum of g[n ld + o] over the rows n of range q, in order.
template <class G, class A> struct SumRanges {
    const G *g; // G: a tensor's type, or (the recurrent layers' gate gradients) acc
    A *part;
    int64_t N, ld, cols, per;
    KF__HD void operator()(int64_t e) const {
        const int64_t q = e / cols, o = e % cols, n1 = (q + 1) * per < N ? (q + 1) * per : N;
        A s = A(0);
        for (int64_t n = q * per; n < n1; ++n) s += Elem<G>::get(g[n * ld + o]);
        part[e] = s;
    }
};
// db[o] (+)= the sum of part[q cols + o] over the P ranges, in order.
template <class T> struct SumFinish {
    using A = typename Elem<T>::acc;
    const A *part;
    T *db;
    int64_t P, cols;
    bool acc;
    KF__HD void operator()(int64_t o) const {
        A s = A(0);
        for (int64_t q = 0; q < P; ++q) s += part[q * cols + o];
        db[o] = Elem<T>::put(acc ? Elem<T>::get(db[o]) + s : s);
    }
};
// The two passes; `part` holds sum_part_bytes(N, cols).
template <class T, class G, class X>
kf_status column_sums(X &ex, const G *g, int64_t N, int64_t ld, int64_t cols, T *db, bool acc,
                      typename Elem<T>::acc *part) {
    const SumSplit sp = sum_split(N, cols);
    KF_TRY(ex.each(sp.P * cols, SumRanges<G, typename Elem<T>::acc>{g, part, N, ld, cols, sp.per}));
    return ex.each(cols, SumFinish<T>{part, db, sp.P, cols, acc});
}

// ---- SKLinear ------------------------------------------------------------------------------------

// The workspace offsets of an SKLinear call in element type T: the stacked weights W1 [in, R]
// and W2 [R, out], Z or dZ [N, R], Z2 [N, c2], dbias's partial sums (column_sums, in acc). The
// U2 half of W1's columns (and of W2's rows, Z's columns) starts at column c2, r rounded up to 16
// bytes of T, and R = 2 c2, the columns between zeros: every operand a product reads begins at a
// 16-byte boundary with a leading dimension of a multiple of 16 bytes (cuBLAS's aligned kernels;
// at W1 + r a product fell back to its unaligned ones wherever r is not a multiple of 8).
struct SklLayout {
    int64_t c2, R;
    size_t off_w2, off_z, off_z2, off_part, off_g, bytes;
};

// The epilogue's arithmetic in acc (common/activation.h, shared with the CPU and the float32
// kernels).
KF__HD inline float skl_epi(int32_t a, float p, uint64_t s, uint64_t c, float v) {
    return kf__epi_s(a, p, kf__dropout_scale_s(p), s, c, v);
}
KF__HD inline double skl_epi(int32_t a, float p, uint64_t s, uint64_t c, double v) {
    return kf__epi_d(a, p, kf__dropout_scale_d(p), s, c, v);
}
KF__HD inline float skl_epi_grad(int32_t a, float p, uint64_t s, uint64_t c, float v, float g) {
    return kf__epi_grad_s(a, p, kf__dropout_scale_s(p), s, c, v, g);
}
KF__HD inline double skl_epi_grad(int32_t a, float p, uint64_t s, uint64_t c, double v,
                                  double g) {
    return kf__epi_grad_d(a, p, kf__dropout_scale_d(p), s, c, v, g);
}

// y[i] = dropout(act(y[i])) at counter offset + i, its value before to pre[i] (pre given): the
// forward's epilogue, a pass over y after the second GEMM (cuBLAS stores y).
template <class T> struct SklEpiPass {
    using A = typename Elem<T>::acc;
    T *y, *pre;
    int32_t act;
    kf__skl_epi e;
    KF__HD void operator()(int64_t i) const {
        if (pre) pre[i] = y[i];
        y[i] = Elem<T>::put(skl_epi(act, e.p, e.seed, e.offset + (uint64_t)i, Elem<T>::get(y[i])));
    }
};

// g[i] = dy[i] * mask / (1 - p) * act'(pre[i]): the gradient through the epilogue, which the
// backward's products read in dy's place.
template <class T> struct SklEpiGrad {
    using A = typename Elem<T>::acc;
    const T *dy, *pre;
    T *g;
    int32_t act;
    kf__skl_epi e;
    KF__HD void operator()(int64_t i) const {
        const A v = pre ? Elem<T>::get(pre[i]) : A(0);
        g[i] = Elem<T>::put(skl_epi_grad(act, e.p, e.seed, e.offset + (uint64_t)i, v,
                                         Elem<T>::get(dy[i])));
    }
};

// Whether a plan has an epilogue (an activation, or dropout).
inline bool skl_has_epi(const struct kf_sklinear_plan *p) {
    return p->act != KF_ACTIVATION_NONE || p->dropout > 0.0f;
}

template <class T> inline SklLayout skl_layout(const struct kf_sklinear_plan *p, int64_t N) {
    SklLayout l;
    const int64_t al = sizeof(T) >= 16 ? 1 : 16 / (int64_t)sizeof(T);
    l.c2 = (p->r + al - 1) / al * al;
    l.R = 2 * l.c2;
    l.off_w2 = bytes_of<T>(p->in, l.R);
    l.off_z = add(l.off_w2, bytes_of<T>(l.R, p->out));
    l.off_z2 = add(l.off_z, bytes_of<T>(N, l.R));
    l.off_part = add(l.off_z2, bytes_of<T>(N, l.c2));
    l.off_g = add(l.off_part, sum_part_bytes<typename Elem<T>::acc>(N, p->out));
    l.bytes = add(l.off_g, skl_has_epi(p) ? bytes_of<T>(N, p->out) : 0);
    return l;
}

template <class T> inline size_t skl_workspace(const struct kf_sklinear_plan *p, int64_t N) {
    return skl_layout<T>(p, N).bytes;
}

// W1[i, h c2 + t k + j] = (h ? U2 : S1)[t, i, j] (e < in R), then W2 = [U1; S2] (rows h c2 + q
// of U1, S2 [r, out] each, copied as they are); zeros in the columns (rows) r..c2 of each half.
template <class T> struct StackW {
    const T *S1, *U2, *U1, *S2;
    T *W1, *W2;
    int64_t in, r, k, out, c2;
    KF__HD void operator()(int64_t e) const {
        const int64_t R = 2 * c2, n1 = in * R;
        if (e < n1) {
            const int64_t i = e / R, col = e % R, h = col >= c2, q = col - h * c2;
            W1[e] = q < r ? (h ? U2 : S1)[(q / k * in + i) * k + q % k] : Elem<T>::put(0);
            return;
        }
        const int64_t e2 = e - n1, row = e2 / out, o = e2 % out, h = row >= c2, q = row - h * c2;
        W2[e2] = q < r ? (h ? S2 : U1)[q * out + o] : Elem<T>::put(0);
    }
};

// y[i] = bias[i % out].
template <class T> struct FillRows {
    const T *bias;
    T *y;
    int64_t out;
    KF__HD void operator()(int64_t i) const { y[i] = bias[i % out]; }
};

// W1 and W2 into the workspace.
template <class T, class X>
kf_status skl_stack(X &ex, const struct kf_sklinear_plan *p, const void *S1, const void *S2,
                    const void *U1, const void *U2, void *ws, const SklLayout &l) {
    const StackW<T> f = {(const T *)S1, (const T *)U2, (const T *)U1,        (const T *)S2,
                         at_t<T>(ws, 0),   at_t<T>(ws, l.off_w2), p->in, p->r, p->k,
                         p->out,           l.c2};
    return ex.each(l.R * (p->in + p->out), f);
}

template <class T, class X> kf_status skl_forward(X &ex, const kf__skl_fwd *c) {
    using Ac = typename Elem<T>::acc;
    const struct kf_sklinear_plan *p = c->plan;
    const int64_t N = c->N, out = p->out;
    if (N <= 0) return KF_OK;
    const SklLayout l = skl_layout<T>(p, N);
    const int64_t R = l.R;
    KF_TRY(skl_stack<T>(ex, p, c->S1, c->S2, c->U1, c->U2, c->ws, l));
    const T *W1 = at_t<T>(c->ws, 0), *W2 = at_t<T>(c->ws, l.off_w2);
    T *Z = at_t<T>(c->ws, l.off_z), *y = (T *)c->y;
    KF_TRY(ex.gemm(false, false, N, R, p->in, Ac(1), (const T *)c->x, p->in, W1, R, Ac(0), Z, R));
    if (c->bias) KF_TRY(ex.each(N * out, FillRows<T>{(const T *)c->bias, y, out}));
    KF_TRY(ex.gemm(false, false, N, out, R, Ac(1) / (Ac(2) * (Ac)p->L), Z, R, W2, out,
                   c->bias ? Ac(1) : Ac(0), y, out));
    if (!skl_has_epi(p) && !c->pre) return KF_OK;
    return ex.each(N * out, SklEpiPass<T>{y, (T *)c->pre, p->act, c->epi});
}

template <class T, class X> kf_status skl_backward(X &ex, const kf__skl_bwd *c) {
    using Ac = typename Elem<T>::acc;
    const struct kf_sklinear_plan *p = c->plan;
    const int64_t N = c->N, r = p->r, in = p->in, out = p->out, k = p->k;
    if (N <= 0) return KF_OK;
    const Ac s = Ac(1) / (Ac(2) * (Ac)p->L), wb = c->accumulate ? Ac(1) : Ac(0);
    const T *x = (const T *)c->x, *dy = (const T *)c->dy;
    const SklLayout l = skl_layout<T>(p, N);
    const int64_t R = l.R, c2 = l.c2;
    if (skl_has_epi(p)) { // the products read the gradient through the epilogue in dy's place
        T *g = at_t<T>(c->ws, l.off_g);
        KF_TRY(ex.each(N * out, SklEpiGrad<T>{dy, (const T *)c->pre, g, p->act, c->epi}));
        dy = g;
    }
    if (c->dx || c->dS1 || c->dS2)
        KF_TRY(skl_stack<T>(ex, p, c->S1, c->S2, c->U1, c->U2, c->ws, l));
    const T *W1 = at_t<T>(c->ws, 0), *W2 = at_t<T>(c->ws, l.off_w2);
    T *dZ = at_t<T>(c->ws, l.off_z);
    if (c->dx || c->dS1) // dZ's r columns of S1 (the first r rows of W2 are U1), all R for dx
        KF_TRY(ex.gemm(false, true, N, c->dx ? R : r, out, s, dy, out, W2, out, Ac(0), dZ, R));
    if (c->dx)
        KF_TRY(ex.gemm(false, true, N, in, R, Ac(1), dZ, R, W1, R, Ac(0), (T *)c->dx, in));
    if (c->dS1)
        KF_TRY(ex.gemm_batched(true, false, in, k, N, Ac(1), x, in, 0, dZ, R, k, wb,
                               (T *)c->dS1, k, in * k, p->L));
    if (c->dS2) {
        T *Z2 = at_t<T>(c->ws, l.off_z2);
        KF_TRY(ex.gemm(false, false, N, r, in, Ac(1), x, in, W1 + c2, R, Ac(0), Z2, c2));
        KF_TRY(ex.gemm(true, false, r, out, N, s, Z2, c2, dy, out, wb, (T *)c->dS2, out));
    }
    if (c->db)
        KF_TRY(column_sums(ex, dy, N, out, out, (T *)c->db, c->accumulate,
                           at_t<Ac>(c->ws, l.off_part)));
    return KF_OK;
}

} // namespace kf_plain

#endif // KF_CUDA_PLAIN_CUH

// SKLinear (Panther's sketched linear layer) on CUDA: forward and backward through the 2r-wide
// bottleneck, r = L*k (math: docs/ops/sklinear.md; notation and records: core/sklinear_backend.h).
// Row-major throughout; fp32 operands and fp32 accumulation; no atomics, every sum in a fixed
// order; no allocation, no synchronisation, no host reads of device data: everything is enqueued
// on ctx->stream (graph-capturable).
//
//   W1 [in, 2r] = [S1_1..S1_L | U2_1..U2_L]   read in place: column j < r is term j/k, column
//                                              j%k of S1s; column r+j the same of U2s
//   W2 [2r, out] = [U1; S2]                    U1s and S2s read in place as [r, out]
//   Z = x W1,  y = Z W2 / (2L) + bias
//
// All kernels are built on one block-tile engine (tile_mma / tile_finish below): 256 threads
// compute a 16-row x 32*CW-column tile, CW in {1, 2, 4, 8}; the 8 warps are CW column groups x
// KS = 8/CW k-slices, each warp owning a 16x32 sub-tile (4x4 per thread) over its own k-slice of
// every stage, and the KS partial tiles are summed through shared memory in slice order. Each
// stage holds A [16, BK] and B [BK, 32*CW] in shared memory, BK = 16*KS; the next stage's global
// loads are issued into registers before the current stage's products (one-stage prefetch).
// Every operand load is bounds-checked (rows, columns and k), so no extent needs to be a
// multiple of anything.
//
// Forward, two paths (the rule depends on the shape only, so workspace_size agrees with it):
//  * fused, ONE launch (skl_fwd_fused), when 2r <= 256 and in * RP <= 32768 (RP = 2r rounded up
//    to 32, 64, 128 or 256: W1 is at most 128 KB): a block owns 16 rows of x and one or more
//    256-wide column tiles of y. It computes its Z tile [16, RP] over all of `in` into shared
//    memory, then each y tile from it; Z never leaves the chip. Blocks of the same rows but
//    other column tiles recompute the Z tile, which the bound on in * RP keeps cheap. When
//    16-row tiles alone fill the GPU (large N), a block takes several column tiles so that Z is
//    computed fewer times.
//  * split, TWO launches otherwise (large `in`, or 2r > 256): skl_zpart computes partial Z tiles
//    over P chunks of `in` (split-K) into the workspace, [P, N, 2r]; skl_fwd_y sums the P
//    partials of its rows (in p order) while loading its A tile and writes y + bias. 2r > 256
//    runs the same kernels with column tiles of 256 (skl_zpart tiles the 2r columns;
//    skl_fwd_y's reduction dimension is 2r, streamed in stages), so there is no separate path
//    and no cuBLAS call.
//
// Backward, two launches (three when the weight gradients are split over rows):
//  1. skl_zpart: split-K partials of dZ = dy W2^T / (2L) [Pdz, N, 2r] (K = out; when dx or dS1s
//     is wanted) and of Z2 = x U2 [Pz2, N, r] (K = in, the bottleneck's second half recomputed
//     from x; when dS2s is wanted), both problems in one grid.
//  2. skl_bwd_main, one grid of three job kinds, each summing the partials it reads in p order:
//       dx   [N, in]  = dZ W1^T                      (tiles 16 rows x 256 features)
//       dS1s [in, r]  = x^T dZ[:, :r], computed as its transpose [r, in] (16 x 256 tiles)
//                       and scattered into the [L, in, k] layout
//       dS2s [r, out] = Z2^T dy / (2L) (16 x 256 tiles); the tiles of rows 0..15 also sum
//                       dbias = column sums of dy from the dy stages already in shared memory
//     The weight gradients reduce over N; when N is large the N rows are split into Pw chunks,
//     partial results go to the workspace and
//  3. skl_wreduce sums them in chunk order and writes or accumulates dS1s, dS2s, dbias.
//     With Pw = 1 (N <= 256 always) step 2 writes or accumulates them directly.
//
// Split counts are a function of the shape and the device's SM count (so are the workspace size
// and the bits: the same on every GPU with that many SMs): enough splits that a grid fills about
// one wave, kf__wave_blocks (one block per SM is what these kernels' 170-240 registers per
// thread allow), at least kMinSplit of K per split, at most kMaxSplits.
// Workspace (bytes, each buffer 64-byte aligned), the larger of
//   forward  (split path only)  Pf * N * 2r * 4
//   backward                    Pdz * N * 2r * 4 + Pz2 * N * r * 4
//                               + (Pw > 1 ? Pw * (r * in + r * out + out) * 4 : 0).
#include "activation.h"
#include "common.cuh"
#include "cuda_backend.cuh"

namespace {

constexpr int kThreads = 256;            // every kernel: 8 warps
constexpr int kBM = 16;                  // rows of every block tile
constexpr int kWide = 256;               // columns of a CW = 8 tile (y, dx, dS1s, dS2s tiles)
constexpr int64_t kMinSplit = 256;       // at least this much K per split
constexpr int64_t kMaxSplits = 64;       // at most this many partials to sum
constexpr int64_t kSplitAlign = 128;     // split boundaries at multiples of the largest BK
constexpr int64_t kFusedMaxW1 = 32768;   // fused forward when in * RP <= this (W1 <= 128 KB)

__host__ __device__ constexpr int cmax(int a, int b) { return a > b ? a : b; }

// ---- the block-tile engine -----------------------------------------------------------------
// Tile<CW, AT, BT>: a 16 x BN tile, BN = 32*CW. Operand load orders (for coalescing): A
// (element (m, k), m < 16) is read along k unless AT (then along m, for operands stored
// k-major such as dZ^T); B (element (k, n)) along n unless BT (then along k: 8 consecutive k
// per lane group, for operands stored n-major such as W2^T). Shared memory: As[m][kk] with an
// odd row length (conflict-free for both orders), Bs[kk][n] (padded by 4 under BT so the
// k-ordered stores are conflict-free; the float4 reads stay aligned).
template <int CW_, bool AT_, bool BT_> struct Tile {
    static constexpr int CW = CW_;
    static constexpr bool AT = AT_, BT = BT_;
    static constexpr int KS = 8 / CW;                 // warps per column group = k-slices
    static constexpr int BN = 32 * CW;                // tile columns
    static constexpr int BK = 16 * KS;                // k per stage, 16 per warp
    static constexpr int LDA = BK + 1;
    static constexpr int LDB = BN + (BT ? 4 : 0);
    static constexpr int A_FLOATS = (kBM * LDA + 3) / 4 * 4;
    static constexpr int B_FLOATS = BK * LDB;
    static constexpr int NB = BK * BN / kThreads;     // B elements per thread per stage (16)
    static constexpr int RED = KS * kBM * BN;         // k-slice reduction buffer (tile_finish)
    static constexpr int FLOATS = cmax(A_FLOATS + B_FLOATS, RED); // shared memory it needs
    static_assert(CW == 1 || CW == 2 || CW == 4 || CW == 8, "CW is 1, 2, 4 or 8");
    static_assert(kBM * BK == KS * kThreads && BK * BN == NB * kThreads, "whole stages");
    // A loader may rely on this: without BT, the thread's B column is always threadIdx.x % BN.
    static_assert(kThreads % BN == 0, "a thread keeps its B column");
};

static_assert(Tile<8, false, false>::BN == kWide, "the 256-column tiles are CW = 8 tiles");

// Stage element q of this thread: A local (m, kk), B local (kk, n).
template <class T> __device__ __forceinline__ void a_index(int q, int &m, int &kk) {
    const int e = (int)threadIdx.x + q * kThreads;
    if (T::AT) { m = e % kBM; kk = e / kBM; }
    else { m = e / T::BK; kk = e % T::BK; }
}
template <class T> __device__ __forceinline__ void b_index(int q, int &kk, int &n) {
    const int e = (int)threadIdx.x + q * kThreads;
    if (T::BT) {
        const int rest = e / 8;
        n = rest % T::BN;
        kk = rest / T::BN * 8 + e % 8;
    } else {
        kk = e / T::BN;
        n = e % T::BN;
    }
}

struct NoHook {
    __device__ void operator()(const float *) const {}
};
struct NoLoad {
    __device__ float operator()(int, int64_t) const { return 0.0f; }
};

__device__ __forceinline__ void zero(float (&acc)[4][4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
}

// acc += A[0:16, kbeg:kend] B[kbeg:kend, 0:BN] over this warp's k-slices (block-uniform
// arguments; every thread of the block calls it). al(m, k) returns A (0 outside its rows),
// bl(k, n) returns B (0 outside its columns); k < kend is checked here. kAZ: A is already in
// shared memory at Az (element (m, k) at Az[m * ldaz + k - kbeg], ldaz odd) and al is unused.
// hook(Bs) runs once per stage while that stage's B tile is in shared memory. Ends with a
// barrier, so the caller may reuse `smem` (T::FLOATS floats, 16-byte aligned) right away.
template <class T, bool kAZ, class AL, class BL, class Hook>
__device__ __forceinline__ void tile_mma(float (&acc)[4][4], const AL &al, const BL &bl,
                                         int64_t kbeg, int64_t kend, float *smem,
                                         const Hook &hook, const float *Az, int ldaz) {
    if (kbeg >= kend) return;
    float *As = smem, *Bs = smem + T::A_FLOATS;
    const int t = (int)threadIdx.x, lane = t % 32, w = t / 32;
    const int cg = w % T::CW, ks = w / T::CW, ty = lane / 8, tx = lane % 8;
    float ra[T::KS], rb[T::NB];

    auto load = [&](int64_t k0) {
        if (!kAZ) {
#pragma unroll
            for (int q = 0; q < T::KS; ++q) {
                int m, kk;
                a_index<T>(q, m, kk);
                const int64_t k = k0 + kk;
                ra[q] = k < kend ? al(m, k) : 0.0f;
            }
        }
#pragma unroll
        for (int q = 0; q < T::NB; ++q) {
            int kk, n;
            b_index<T>(q, kk, n);
            const int64_t k = k0 + kk;
            rb[q] = k < kend ? bl(k, n) : 0.0f;
        }
    };

    load(kbeg);
    for (int64_t k0 = kbeg; k0 < kend; k0 += T::BK) {
        if (!kAZ) {
#pragma unroll
            for (int q = 0; q < T::KS; ++q) {
                int m, kk;
                a_index<T>(q, m, kk);
                As[m * T::LDA + kk] = ra[q];
            }
        }
#pragma unroll
        for (int q = 0; q < T::NB; ++q) {
            int kk, n;
            b_index<T>(q, kk, n);
            Bs[kk * T::LDB + n] = rb[q];
        }
        __syncthreads();
        hook(static_cast<const float *>(Bs));
        if (k0 + T::BK < kend) load(k0 + T::BK);

        const int lda = kAZ ? ldaz : T::LDA;
        const float *a = kAZ ? Az + (ty * 4) * ldaz + (k0 - kbeg) + ks * 16
                             : As + (ty * 4) * T::LDA + ks * 16;
        const float *b = Bs + (ks * 16) * T::LDB + cg * 32 + tx * 4;
#pragma unroll
        for (int kk = 0; kk < 16; ++kk) {
            const float4 bv = *reinterpret_cast<const float4 *>(b + kk * T::LDB);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float av = a[i * lda + kk];
                acc[i][0] = fmaf(av, bv.x, acc[i][0]);
                acc[i][1] = fmaf(av, bv.y, acc[i][1]);
                acc[i][2] = fmaf(av, bv.z, acc[i][2]);
                acc[i][3] = fmaf(av, bv.w, acc[i][3]);
            }
        }
        __syncthreads();
    }
}

// Hands every element of the block's tile to out(m, n, v) (m < 16, n < BN; the callee checks
// its own bounds), summing the KS k-slice partials in slice order through `red` (T::RED floats,
// may alias the tile_mma buffers). Every thread of the block calls it.
template <class T, class Out>
__device__ __forceinline__ void tile_finish(const float (&acc)[4][4], float *red, const Out &out) {
    const int t = (int)threadIdx.x, lane = t % 32, w = t / 32;
    const int cg = w % T::CW, ks = w / T::CW, ty = lane / 8, tx = lane % 8;
    if (T::KS == 1) {
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) out(ty * 4 + i, cg * 32 + tx * 4 + j, acc[i][j]);
        return;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 4; ++i)
        *reinterpret_cast<float4 *>(red + (ks * kBM + ty * 4 + i) * T::BN + cg * 32 + tx * 4) =
            make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
    __syncthreads();
    for (int e = t; e < kBM * T::BN; e += kThreads) {
        float v = red[e];
#pragma unroll
        for (int s = 1; s < T::KS; ++s) v += red[s * kBM * T::BN + e];
        out(e / T::BN, e % T::BN, v);
    }
    __syncthreads();
}

// ---- the layer ------------------------------------------------------------------------------
// y's epilogue (kfuse.h's fused epilogue; common/activation.h, shared with the CPU): element i of
// y (row * out + column) is stored as dropout(act(v)) at counter offset + i, and v, the
// pre-activation, to pre[i] where pre is given.
struct Epi {
    int32_t act;
    float p, scale; // dropout probability (0: none), 1 / (1 - p)
    uint64_t seed, offset;
    float *pre;
    __device__ __forceinline__ float operator()(int64_t i, float v) const {
        if (pre != nullptr) pre[i] = v;
        return kf__epi_s(act, p, scale, seed, offset + (uint64_t)i, v);
    }
};

Epi make_epi(const kf__skl_fwd *c) {
    const Epi e = {c->plan->act, c->epi.p, kf__dropout_scale_s(c->epi.p), c->epi.seed,
                   c->epi.offset, static_cast<float *>(c->pre)};
    return e;
}

// The gradient through the epilogue, g = dy * mask / (1 - p) * act'(pre), which backward's
// products read in dy's place.
__global__ void __launch_bounds__(kThreads)
    skl_epi_grad(const float *dy, const float *pre, float *g, int64_t n, int32_t act, float p,
                 float scale, uint64_t seed, uint64_t offset) {
    const int64_t step = (int64_t)gridDim.x * kThreads;
    for (int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x; i < n; i += step)
        g[i] = kf__epi_grad_s(act, p, scale, seed, offset + (uint64_t)i,
                              pre != nullptr ? pre[i] : 0.0f, dy[i]);
}

struct Net {
    int64_t N, in, out;
    int r, R, k; // R = 2r (the front end keeps 2r below 2^31)
    float inv;   // 1 / (2L)
    const float *x, *S1, *S2, *U1, *U2;
};

// Column j < 2r of W1: element (a, j) at w1_col(j)[a * k].
__device__ __forceinline__ const float *w1_col(const Net &a, int j) {
    const bool hi = j >= a.r;
    const int jj = hi ? j - a.r : j, term = jj / a.k, c = jj - term * a.k;
    return (hi ? a.U2 : a.S1) + (int64_t)term * a.in * a.k + c;
}
// Row j < 2r of W2: element (j, o) at w2_row(j)[o].
__device__ __forceinline__ const float *w2_row(const Net &a, int j) {
    return j < a.r ? a.U1 + (int64_t)j * a.out : a.S2 + (int64_t)(j - a.r) * a.out;
}

// Fused forward (one launch): Z tile of 16 rows in shared memory, then y tiles from it.
template <int CW>
__global__ void __launch_bounds__(kThreads)
    skl_fwd_fused(Net a, const float *bias, float *y, Epi e, int64_t groups, int64_t cpb,
                  int64_t coltiles) {
    using T1 = Tile<CW, false, false>;
    using T2 = Tile<8, false, false>;
    constexpr int RP = T1::BN, LDZ = RP + 1;
    constexpr int REGION = (cmax(T1::FLOATS, T2::FLOATS) + 3) / 4 * 4;
    __shared__ __align__(16) float smem[REGION + kBM * LDZ];
    float *Zs = smem + REGION;

    const int64_t blk = blockIdx.x, rt = blk / groups, g = blk % groups, m0 = rt * kBM;
    const int64_t N = a.N, in = a.in, out = a.out;
    const int k = a.k, R = a.R;
    const float *x = a.x;
    const float inv = a.inv;
    float acc[4][4];

    zero(acc);
    {
        const int n = (int)threadIdx.x % T1::BN; // this thread's B column (Tile)
        const float *wc = n < R ? w1_col(a, n) : nullptr;
        auto al = [=](int m, int64_t kk) { return m0 + m < N ? x[(m0 + m) * in + kk] : 0.0f; };
        auto bl = [=](int64_t kk, int) { return wc != nullptr ? wc[kk * k] : 0.0f; };
        tile_mma<T1, false>(acc, al, bl, 0, in, smem, NoHook(), nullptr, 0);
        tile_finish<T1>(acc, smem, [=](int m, int c, float v) { Zs[m * LDZ + c] = v; });
    }
    __syncthreads(); // Zs complete (columns >= 2r hold 0: their W1 loads were 0)

    const int64_t ct_end = (g + 1) * cpb < coltiles ? (g + 1) * cpb : coltiles;
    for (int64_t ct = g * cpb; ct < ct_end; ++ct) {
        const int64_t o0 = ct * T2::BN;
        zero(acc);
        auto bl = [=, &a](int64_t j, int c) {
            return o0 + c < out ? w2_row(a, (int)j)[o0 + c] : 0.0f;
        };
        tile_mma<T2, true>(acc, NoLoad(), bl, 0, R, smem, NoHook(), Zs, LDZ);
        tile_finish<T2>(acc, nullptr, [=](int m, int c, float v) {
            const int64_t row = m0 + m, o = o0 + c;
            if (row < N && o < out)
                y[row * out + o] = e(row * out + o, v * inv + (bias ? bias[o] : 0.0f));
        });
    }
}

// One split-K problem of skl_zpart: part[p][n][c] (c < ncols) = scale * sum over k in chunk p of
// A[n, k] B[k, c]; jobs = row tiles * P * RC (RC column tiles of BN).
struct PartJob {
    int64_t jobs, P, KC, RC, K;
    int ncols;    // output columns
    int col_base; // x problem: W1 column of output column 0
    float scale;
    float *part;  // [P, N, ncols]
};

// Split-K partial bottlenecks. Jobs [0, px.jobs): x W1[:, col_base + c] (forward Z, backward
// Z2); then pd.jobs jobs of dy W2^T (backward dZ).
template <int CW>
__global__ void __launch_bounds__(kThreads) skl_zpart(Net a, const float *dy, PartJob px,
                                                      PartJob pd) {
    using TX = Tile<CW, false, false>;
    using TD = Tile<CW, false, true>;
    __shared__ __align__(16) float smem[cmax(TX::FLOATS, TD::FLOATS)];

    int64_t job = blockIdx.x;
    const bool isx = job < px.jobs;
    if (!isx) job -= px.jobs;
    const PartJob pj = isx ? px : pd;
    const int64_t per = pj.P * pj.RC, rt = job / per, p = job % per / pj.RC, rc = job % pj.RC;
    const int64_t m0 = rt * kBM, N = a.N;
    const int c0 = (int)rc * TX::BN, ncols = pj.ncols;
    const int64_t kbeg = p * pj.KC, kend = kbeg + pj.KC < pj.K ? kbeg + pj.KC : pj.K;
    float *dst = pj.part + p * N * ncols;
    const float scale = pj.scale;
    auto out = [=](int m, int c, float v) {
        const int64_t row = m0 + m;
        if (row < N && c0 + c < ncols) dst[row * ncols + c0 + c] = v * scale;
    };
    float acc[4][4];
    zero(acc);
    if (isx) {
        const int64_t in = a.in;
        const int k = a.k;
        const float *x = a.x;
        const int n = (int)threadIdx.x % TX::BN; // this thread's B column (Tile)
        const float *wc = c0 + n < ncols ? w1_col(a, pj.col_base + c0 + n) : nullptr;
        auto al = [=](int m, int64_t kk) { return m0 + m < N ? x[(m0 + m) * in + kk] : 0.0f; };
        auto bl = [=](int64_t kk, int) { return wc != nullptr ? wc[kk * k] : 0.0f; };
        tile_mma<TX, false>(acc, al, bl, kbeg, kend, smem, NoHook(), nullptr, 0);
        tile_finish<TX>(acc, smem, out);
    } else {
        const int64_t ld = a.out;
        auto al = [=](int m, int64_t o) { return m0 + m < N ? dy[(m0 + m) * ld + o] : 0.0f; };
        auto bl = [=, &a](int64_t o, int c) {
            return c0 + c < ncols ? w2_row(a, c0 + c)[o] : 0.0f;
        };
        tile_mma<TD, false>(acc, al, bl, kbeg, kend, smem, NoHook(), nullptr, 0);
        tile_finish<TD>(acc, smem, out);
    }
}

// Sum over p < P of part[p * stride] (fixed order).
__device__ __forceinline__ float psum(const float *part, int64_t P, int64_t stride) {
    float s = 0.0f;
    for (int64_t p = 0; p < P; ++p) s += part[p * stride];
    return s;
}

// Split-path forward, second launch: y = (sum_p Zpart_p) W2 / (2L) + bias, 16 x 256 tiles.
__global__ void __launch_bounds__(kThreads)
    skl_fwd_y(Net a, const float *part, int64_t P, const float *bias, float *y, Epi e,
              int64_t coltiles) {
    using T = Tile<8, false, false>;
    __shared__ __align__(16) float smem[T::FLOATS];
    const int64_t blk = blockIdx.x, m0 = blk / coltiles * kBM, o0 = blk % coltiles * T::BN;
    const int64_t N = a.N, out = a.out, R = a.R, stride = N * R;
    const float inv = a.inv;
    auto al = [=](int m, int64_t j) {
        return m0 + m < N ? psum(part + (m0 + m) * R + j, P, stride) : 0.0f;
    };
    auto bl = [=, &a](int64_t j, int c) {
        return o0 + c < out ? w2_row(a, (int)j)[o0 + c] : 0.0f;
    };
    float acc[4][4];
    zero(acc);
    tile_mma<T, false>(acc, al, bl, 0, R, smem, NoHook(), nullptr, 0);
    tile_finish<T>(acc, nullptr, [=](int m, int c, float v) {
        const int64_t row = m0 + m, o = o0 + c;
        if (row < N && o < out)
            y[row * out + o] = e(row * out + o, v * inv + (bias ? bias[o] : 0.0f));
    });
}

struct BwdJobs {
    int64_t n_dx, n_s1, n_s2;    // job counts of the three kinds, in this order
    int64_t ct_in, ct_out;       // 256-wide column tiles of in and out
    int64_t Pw, KCw;             // row chunks of the weight gradients
    int64_t Pdz, Pz2;            // partial counts of dZ and Z2
    const float *dz, *z2;        // [Pdz, N, 2r] (scaled by 1/(2L)), [Pz2, N, r] or NULL
    float *dx, *dS1, *dS2, *db;  // outputs, NULL = not wanted
    float *w1p, *w2p, *wbp;      // Pw > 1: [Pw, r, in], [Pw, r, out], [Pw, out] partials
    bool accumulate;
};

// Backward: dx, dS1s, dS2s (+ dbias) tiles, from the partials of skl_zpart.
__global__ void __launch_bounds__(kThreads) skl_bwd_main(Net a, const float *dy, BwdJobs b) {
    using TX = Tile<8, false, true>;  // dx: A = dZ rows, B = W1^T (k-ordered)
    using TW = Tile<8, true, false>;  // weight gradients: A = dZ^T or Z2^T (m-ordered)
    static_assert(TW::BN == kThreads, "dbias: one column per thread");
    __shared__ __align__(16) float smem[cmax(TX::FLOATS, TW::FLOATS)];

    const int64_t N = a.N, in = a.in, out = a.out, R = a.R;
    const int r = a.r, k = a.k;
    float acc[4][4];
    zero(acc);
    int64_t job = blockIdx.x;
    if (job < b.n_dx) {
        const int64_t m0 = job / b.ct_in * kBM, a0 = job % b.ct_in * TX::BN;
        const float *dz = b.dz;
        const int64_t P = b.Pdz, stride = N * R;
        auto al = [=](int m, int64_t j) {
            return m0 + m < N ? psum(dz + (m0 + m) * R + j, P, stride) : 0.0f;
        };
        auto bl = [=, &a](int64_t j, int c) {
            return a0 + c < in ? w1_col(a, (int)j)[(a0 + c) * k] : 0.0f;
        };
        tile_mma<TX, false>(acc, al, bl, 0, R, smem, NoHook(), nullptr, 0);
        float *dx = b.dx;
        tile_finish<TX>(acc, nullptr, [=](int m, int c, float v) {
            const int64_t row = m0 + m, col = a0 + c;
            if (row < N && col < in) dx[row * in + col] = v;
        });
        return;
    }
    job -= b.n_dx;
    const int64_t Pw = b.Pw;
    const bool acm = b.accumulate;
    if (job < b.n_s1) { // dS1^T [r, in] = dZ[:, :r]^T x over rows [kbeg, kend)
        const int64_t per = b.ct_in * Pw, pw = job % Pw;
        const int j0 = (int)(job / per) * kBM;
        const int64_t a0 = job % per / Pw * TW::BN;
        const int64_t kbeg = pw * b.KCw, kend = kbeg + b.KCw < N ? kbeg + b.KCw : N;
        const float *dz = b.dz, *x = a.x;
        const int64_t P = b.Pdz, stride = N * R;
        auto al = [=](int m, int64_t n) {
            return j0 + m < r ? psum(dz + n * R + j0 + m, P, stride) : 0.0f;
        };
        auto bl = [=](int64_t n, int c) { return a0 + c < in ? x[n * in + a0 + c] : 0.0f; };
        tile_mma<TW, false>(acc, al, bl, kbeg, kend, smem, NoHook(), nullptr, 0);
        float *dS1 = b.dS1, *w1p = b.w1p;
        tile_finish<TW>(acc, nullptr, [=](int m, int c, float v) {
            const int j = j0 + m;
            const int64_t col = a0 + c;
            if (j >= r || col >= in) return;
            if (Pw > 1) {
                w1p[(pw * r + j) * in + col] = v;
            } else {
                const int term = j / k;
                const int64_t idx = ((int64_t)term * in + col) * k + (j - term * k);
                dS1[idx] = acm ? dS1[idx] + v : v;
            }
        });
        return;
    }
    job -= b.n_s1;
    { // dS2 [r, out] = Z2^T dy / (2L) over rows [kbeg, kend); rows 0..15 also sum dbias
        const int64_t per = b.ct_out * Pw, pw = job % Pw;
        const int j0 = (int)(job / per) * kBM;
        const int64_t o0 = job % per / Pw * TW::BN;
        const int64_t kbeg = pw * b.KCw, kend = kbeg + b.KCw < N ? kbeg + b.KCw : N;
        const float *z2 = b.z2;
        const int64_t P = b.Pz2, stride = N * r;
        auto al = [=](int m, int64_t n) {
            return z2 != nullptr && j0 + m < r ? psum(z2 + n * r + j0 + m, P, stride) : 0.0f;
        };
        auto bl = [=](int64_t n, int c) { return o0 + c < out ? dy[n * out + o0 + c] : 0.0f; };
        const bool want_db = j0 == 0 && b.db != nullptr;
        float dbs = 0.0f;
        auto hook = [&](const float *Bs) {
            if (!want_db) return;
#pragma unroll
            for (int kk = 0; kk < TW::BK; ++kk) dbs += Bs[kk * TW::LDB + threadIdx.x];
        };
        tile_mma<TW, false>(acc, al, bl, kbeg, kend, smem, hook, nullptr, 0);
        float *dS2 = b.dS2, *w2p = b.w2p;
        const float inv = a.inv;
        tile_finish<TW>(acc, nullptr, [=](int m, int c, float v) {
            const int j = j0 + m;
            const int64_t col = o0 + c;
            if (dS2 == nullptr || j >= r || col >= out) return;
            v *= inv;
            if (Pw > 1) {
                w2p[(pw * r + j) * out + col] = v;
            } else {
                const int64_t idx = (int64_t)j * out + col;
                dS2[idx] = acm ? dS2[idx] + v : v;
            }
        });
        if (want_db) {
            const int64_t o = o0 + threadIdx.x;
            if (o < out) {
                if (Pw > 1) b.wbp[pw * out + o] = dbs;
                else b.db[o] = acm ? b.db[o] + dbs : dbs;
            }
        }
    }
}

// Pw > 1: the weight gradients from their row-chunk partials, summed in chunk order.
__global__ void __launch_bounds__(kThreads) skl_wreduce(Net a, BwdJobs b) {
    const int64_t in = a.in, out = a.out, r = a.r, k = a.k, P = b.Pw;
    const int64_t E1 = b.dS1 ? r * in : 0, E2 = b.dS2 ? r * out : 0, E3 = b.db ? out : 0;
    const int64_t E = E1 + E2 + E3, step = (int64_t)gridDim.x * kThreads;
    for (int64_t e = (int64_t)blockIdx.x * kThreads + threadIdx.x; e < E; e += step) {
        float s, *dst;
        if (e < E1) { // dS1s element e of [L, in, k]: term i, feature f, column c; j = i*k + c
            const int64_t i = e / (in * k), f = e / k % in, c = e % k;
            s = psum(b.w1p + (i * k + c) * in + f, P, r * in);
            dst = b.dS1 + e;
        } else if (e < E1 + E2) {
            s = psum(b.w2p + (e - E1), P, r * out);
            dst = b.dS2 + (e - E1);
        } else {
            s = psum(b.wbp + (e - E1 - E2), P, out);
            dst = b.db + (e - E1 - E2);
        }
        *dst = b.accumulate ? *dst + s : s;
    }
}

// ---- host side --------------------------------------------------------------------------------

int cw_for(int64_t cols) { return cols <= 32 ? 1 : cols <= 64 ? 2 : cols <= 128 ? 4 : 8; }

// Splits of K for a grid that has `jobs` blocks per split, aiming at `target` blocks.
kf__split split_k(int64_t K, int64_t jobs, int64_t target) {
    return kf__split_of(K, jobs, kMinSplit, kSplitAlign, target, kMaxSplits);
}

// Everything derived from (plan, N): paths, tilings, splits, workspace offsets.
struct Layout {
    int64_t N, in, out, r, R;
    int64_t rt, rtr, ct_in, ct_out; // 16-row tiles of N and r, 256-column tiles of in and out
    int cw;                         // CW of the bottleneck tiles (skl_fwd_fused, skl_zpart)
    int64_t bn;                     // 32 * cw
    bool fused;
    int64_t cpb, groups;            // fused: column tiles per block, column groups
    kf__split fz, dz, z2, w;
    int64_t rc_f, rc_dz, rc_z2;     // column tiles of the Z, dZ, Z2 partial problems
    size_t off_z2, off_w1, off_w2, off_wb; // backward (dZ partials at 0; forward's Z too)
    size_t off_g;                   // backward, a plan with an epilogue: g [N, out] (skl_epi_grad)
    size_t fwd_bytes, bwd_bytes;
};

Layout make_layout(const struct kf_sklinear_plan *p, int64_t N) {
    Layout l = {};
    const int64_t target = kf__wave_blocks(p->ctx);
    l.N = N; l.in = p->in; l.out = p->out; l.r = p->r; l.R = 2 * p->r;
    l.rt = kf__ceil_div(N, kBM);
    l.rtr = kf__ceil_div(l.r, kBM);
    l.ct_in = kf__ceil_div(l.in, kWide);
    l.ct_out = kf__ceil_div(l.out, kWide);
    l.cw = cw_for(l.R);
    l.bn = 32 * l.cw;

    // Forward path (see the top of the file).
    l.fused = l.R <= 256 && l.in * l.bn <= kFusedMaxW1;
    l.rc_f = kf__ceil_div(l.R, l.bn);
    if (l.fused) {
        int64_t cpb = l.rt * l.ct_out / target;
        l.cpb = cpb < 1 ? 1 : cpb > l.ct_out ? l.ct_out : cpb;
        l.groups = kf__ceil_div(l.ct_out, l.cpb);
        l.fz = kf__split{1, l.in};
        l.fwd_bytes = 0;
    } else {
        l.fz = split_k(l.in, l.rt * l.rc_f, target);
        l.fwd_bytes = kf__sat_floats(l.fz.P, N, l.R);
    }

    // Backward.
    l.rc_dz = kf__ceil_div(l.R, l.bn);
    l.rc_z2 = kf__ceil_div(l.r, l.bn);
    // dZ and Z2 share one grid: each aims for half of it.
    l.dz = split_k(l.out, 2 * l.rt * l.rc_dz, target);
    l.z2 = split_k(l.in, 2 * l.rt * l.rc_z2, target);
    l.w = split_k(N, l.rtr * (l.ct_in + l.ct_out), target);
    size_t o = kf__sat_floats(l.dz.P, N, l.R);
    l.off_z2 = o;
    o = kf__sat_add(o, kf__sat_floats(l.z2.P, N, l.r));
    if (l.w.P > 1) {
        l.off_w1 = o;
        o = kf__sat_add(o, kf__sat_floats(l.w.P, l.r, l.in));
        l.off_w2 = o;
        o = kf__sat_add(o, kf__sat_floats(l.w.P, l.r, l.out));
        l.off_wb = o;
        o = kf__sat_add(o, kf__sat_floats(l.w.P, 1, l.out));
    }
    l.off_g = o;
    if (p->act != KF_ACTIVATION_NONE || p->dropout > 0.0f)
        o = kf__sat_add(o, kf__sat_floats(1, N, l.out));
    l.bwd_bytes = o;
    return l;
}

Net make_net(const struct kf_sklinear_plan *p, int64_t N, const void *x, const void *S1,
             const void *S2, const void *U1, const void *U2) {
    Net a;
    a.N = N; a.in = p->in; a.out = p->out;
    a.r = (int)p->r; a.R = (int)(2 * p->r); a.k = p->k;
    a.inv = (float)(1.0 / (2.0 * (double)p->L));
    a.x = static_cast<const float *>(x);
    a.S1 = static_cast<const float *>(S1);
    a.S2 = static_cast<const float *>(S2);
    a.U1 = static_cast<const float *>(U1);
    a.U2 = static_cast<const float *>(U2);
    return a;
}

template <int CW>
kf_status launch_fused(kf_context *ctx, const char *fn, const Layout &l, const Net &a,
                       const float *bias, float *y, const Epi &e) {
    unsigned g = 0;
    KF_TRY(kf__grid_of(fn, l.rt * l.groups, &g));
    skl_fwd_fused<CW><<<g, kThreads, 0, kf__stream(ctx)>>>(a, bias, y, e, l.groups, l.cpb,
                                                            l.ct_out);
    KF__CUDA_LAUNCH_CHECK(fn, "skl_fwd_fused");
    return KF_OK;
}

template <int CW>
kf_status launch_zpart(kf_context *ctx, const char *fn, const Net &a, const float *dy,
                       const PartJob &px, const PartJob &pd) {
    unsigned g = 0;
    KF_TRY(kf__grid_of(fn, px.jobs + pd.jobs, &g));
    skl_zpart<CW><<<g, kThreads, 0, kf__stream(ctx)>>>(a, dy, px, pd);
    KF__CUDA_LAUNCH_CHECK(fn, "skl_zpart");
    return KF_OK;
}

kf_status run_zpart(kf_context *ctx, const char *fn, int cw, const Net &a, const float *dy,
                    const PartJob &px, const PartJob &pd) {
    if (px.jobs + pd.jobs == 0) return KF_OK;
    switch (cw) {
    case 1: return launch_zpart<1>(ctx, fn, a, dy, px, pd);
    case 2: return launch_zpart<2>(ctx, fn, a, dy, px, pd);
    case 4: return launch_zpart<4>(ctx, fn, a, dy, px, pd);
    default: return launch_zpart<8>(ctx, fn, a, dy, px, pd);
    }
}

// An idle problem for skl_zpart.
PartJob no_part() {
    PartJob j = {};
    j.P = j.KC = j.RC = j.K = 1;
    return j;
}

} // namespace

namespace {

size_t skl_workspace(const struct kf_sklinear_plan *p, int64_t N) {
    const Layout l = make_layout(p, N);
    return l.fwd_bytes > l.bwd_bytes ? l.fwd_bytes : l.bwd_bytes;
}

kf_status skl_forward(kf_context *ctx, const kf__skl_fwd *c) {
    static const char fn[] = "kf_sklinear_forward";
    const Layout l = make_layout(c->plan, c->N);
    if (c->N <= 0) return KF_OK;
    KF__CUDA_ON_DEVICE(fn, ctx);
    const Net a = make_net(c->plan, c->N, c->x, c->S1, c->S2, c->U1, c->U2);
    const float *bias = static_cast<const float *>(c->bias);
    float *y = static_cast<float *>(c->y);
    const Epi e = make_epi(c);
    if (l.fused) {
        switch (l.cw) {
        case 1: return launch_fused<1>(ctx, fn, l, a, bias, y, e);
        case 2: return launch_fused<2>(ctx, fn, l, a, bias, y, e);
        case 4: return launch_fused<4>(ctx, fn, l, a, bias, y, e);
        default: return launch_fused<8>(ctx, fn, l, a, bias, y, e);
        }
    }
    float *part = kf__at<float>(c->ws, 0);
    PartJob px = {};
    px.P = l.fz.P; px.KC = l.fz.per; px.RC = l.rc_f; px.K = l.in;
    px.jobs = l.rt * px.P * px.RC;
    px.ncols = (int)l.R; px.col_base = 0; px.scale = 1.0f;
    px.part = part;
    KF_TRY(run_zpart(ctx, fn, l.cw, a, nullptr, px, no_part()));
    unsigned g = 0;
    KF_TRY(kf__grid_of(fn, l.rt * l.ct_out, &g));
    skl_fwd_y<<<g, kThreads, 0, kf__stream(ctx)>>>(a, part, l.fz.P, bias, y, e, l.ct_out);
    KF__CUDA_LAUNCH_CHECK(fn, "skl_fwd_y");
    return KF_OK;
}

kf_status skl_backward(kf_context *ctx, const kf__skl_bwd *c) {
    static const char fn[] = "kf_sklinear_backward";
    if (c->dx == nullptr && c->dS1 == nullptr && c->dS2 == nullptr && c->db == nullptr)
        return KF_OK;
    const Layout l = make_layout(c->plan, c->N);
    KF__CUDA_ON_DEVICE(fn, ctx);
    const Net a = make_net(c->plan, c->N, c->x, c->S1, c->S2, c->U1, c->U2);
    const float *dy = static_cast<const float *>(c->dy);
    if (c->plan->act != KF_ACTIVATION_NONE || c->plan->dropout > 0.0f) { // 0. through the epilogue
        float *g = kf__at<float>(c->ws, l.off_g);
        const int64_t n = c->N * l.out, blocks = kf__ceil_div(n, kThreads);
        skl_epi_grad<<<(unsigned)(blocks < 65535 ? blocks : 65535), kThreads, 0,
                       kf__stream(ctx)>>>(dy, static_cast<const float *>(c->pre), g, n,
                                          c->plan->act, c->epi.p,
                                          kf__dropout_scale_s(c->epi.p), c->epi.seed,
                                          c->epi.offset);
        KF__CUDA_LAUNCH_CHECK(fn, "skl_epi_grad");
        dy = g;
    }
    const bool need_dz = c->dx != nullptr || c->dS1 != nullptr, need_z2 = c->dS2 != nullptr;

    // 1. Partials of Z2 = x U2 and dZ = dy W2^T / (2L).
    PartJob px = no_part(), pd = no_part();
    if (need_z2) {
        px.P = l.z2.P; px.KC = l.z2.per; px.RC = l.rc_z2; px.K = l.in;
        px.jobs = l.rt * px.P * px.RC;
        px.ncols = (int)l.r; px.col_base = (int)l.r; px.scale = 1.0f;
        px.part = kf__at<float>(c->ws, l.off_z2);
    }
    if (need_dz) {
        pd.P = l.dz.P; pd.KC = l.dz.per; pd.RC = l.rc_dz; pd.K = l.out;
        pd.jobs = l.rt * pd.P * pd.RC;
        pd.ncols = (int)l.R; pd.col_base = 0; pd.scale = a.inv;
        pd.part = kf__at<float>(c->ws, 0);
    }
    if (l.N > 0) KF_TRY(run_zpart(ctx, fn, l.cw, a, dy, px, pd));

    // 2. dx, dS1s, dS2s, dbias tiles.
    BwdJobs b = {};
    b.ct_in = l.ct_in; b.ct_out = l.ct_out;
    b.Pw = l.w.P; b.KCw = l.w.per;
    b.Pdz = l.dz.P; b.Pz2 = l.z2.P;
    b.dz = kf__at<float>(c->ws, 0);
    b.z2 = need_z2 ? kf__at<float>(c->ws, l.off_z2) : nullptr;
    b.dx = static_cast<float *>(c->dx);
    b.dS1 = static_cast<float *>(c->dS1);
    b.dS2 = static_cast<float *>(c->dS2);
    b.db = static_cast<float *>(c->db);
    if (l.w.P > 1) {
        b.w1p = kf__at<float>(c->ws, l.off_w1);
        b.w2p = kf__at<float>(c->ws, l.off_w2);
        b.wbp = kf__at<float>(c->ws, l.off_wb);
    }
    b.accumulate = c->accumulate;
    b.n_dx = c->dx ? l.rt * l.ct_in : 0;
    b.n_s1 = c->dS1 ? l.rtr * l.ct_in * l.w.P : 0;
    b.n_s2 = (c->dS2 ? l.rtr : c->db ? 1 : 0) * l.ct_out * l.w.P;
    unsigned g = 0;
    KF_TRY(kf__grid_of(fn, b.n_dx + b.n_s1 + b.n_s2, &g));
    if (g > 0) {
        skl_bwd_main<<<g, kThreads, 0, kf__stream(ctx)>>>(a, dy, b);
        KF__CUDA_LAUNCH_CHECK(fn, "skl_bwd_main");
    }

    // 3. Row-chunk partials of the weight gradients, summed.
    if (l.w.P > 1 && (c->dS1 || c->dS2 || c->db)) {
        const int64_t E = (c->dS1 ? l.r * l.in : 0) + (c->dS2 ? l.r * l.out : 0) +
                          (c->db ? l.out : 0);
        const int64_t blocks = kf__ceil_div(E, kThreads);
        skl_wreduce<<<(unsigned)(blocks < 65535 ? blocks : 65535), kThreads, 0,
                      kf__stream(ctx)>>>(a, b);
        KF__CUDA_LAUNCH_CHECK(fn, "skl_wreduce");
    }
    return KF_OK;
}

} // namespace

namespace {

const kf__skl_ops skl_ops_f32 = {nullptr, skl_workspace, skl_forward, skl_backward};

// Chosen once, at plan creation: float32 on the kernels above; float64, bfloat16 and float16 on
// cuda/plain.cu (the low types' products on the tensor cores).
kf_status skl_select(const struct kf_sklinear_plan *p, const char *fn, const kf__skl_ops **ops) {
    KF_TRY(kf__cuda_dtype_supported(p->dtype, fn));
    *ops = p->dtype == KF_DTYPE_F32 ? &skl_ops_f32 : kf__cuda_skl_plain_ops(p->dtype);
    return KF_OK;
}

} // namespace

extern "C" const kf__skl_ops kf__cuda_skl_ops = {skl_select, nullptr, nullptr, nullptr};

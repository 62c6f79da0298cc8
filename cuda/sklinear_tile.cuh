// SKLinear's CUDA block-tile engine (private to cuda/sklinear*.cu): Tile<CW, AT, BT> and the
// stage loop tile_mma / tile_finish every SKLinear kernel is built on (the design: the top of
// cuda/sklinear.cu).
#ifndef KF_CUDA_SKLINEAR_TILE_CUH
#define KF_CUDA_SKLINEAR_TILE_CUH

#include "common.cuh"

namespace kf_skl {

constexpr int kThreads = 256;            // every kernel: 8 warps
constexpr int kBM = 16;                  // rows of every block tile
constexpr int kWide = 256;               // columns of a CW = 8 tile (y, dx, dS1s, dS2s tiles)

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


} // namespace kf_skl

#endif

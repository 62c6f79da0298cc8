/* CPU backend of the sketched linear layer: two GEMMs through the 2r-wide bottleneck (notation
 * of core/sklinear_backend.h), OpenBLAS from the context's own threads, no allocation.
 *
 * The first-stage operand W1 = [S1_1..S1_L | U2_1..U2_L] is packed [in, 2r] into the
 * workspace (the terms interleave in memory, so no single matrix view exists), making the first
 * stage one GEMM of width 2r instead of 2L GEMMs of width k. The second stage reads U1s and S2s
 * in place: each is an [r, out] matrix already.
 *
 * Work is split into fixed blocks, round-robin to the threads; every element has one writer, and
 * since the blocks (hence every BLAS call and every sum's order) depend on the shape alone, the
 * bits do not depend on the thread count. Two splits of the products through the bottleneck:
 *  - rows (the default): blocks of KF__SKL_ROWS rows of x run both stages; every block reads
 *    (and OpenBLAS packs) all of the weights again, which many rows amortise;
 *  - wide (few rows, the layer's usual batch, and in, out >= 512): each stage is split along its
 *    weights instead, so that each weight is read and packed once per call. The first stage
 *    Z = x W1 is split over `in` (each block packs its rows of W1 and writes a partial Z, summed
 *    in block order), the second y = s Z [U1; S2] over `out`; backward likewise (dZ partials
 *    over `out`, the recomputed Z over `in`, then dx by blocks of `in`). The rule and the
 *    measured gain: KF__SKL_WIDE_ROWS.
 * The reductions over rows (dS1s, dS2s, dbias) are split by parameter columns in both.
 *
 * One implementation for both dtypes: KF__SKL_CPU_DEFINE(T, X) below defines the team functions
 * for element type T with the BLAS prefix X (s: float32, d: float64); the op picks them by the
 * plan's dtype. */
#include "cpu_backend.h"

#include "blas.h"
#include "team.h"

#include <string.h>

/* Small calls run in the caller's thread: waking a sleeping team (OMP_WAIT_POLICY=PASSIVE)
 * costs ~25 us, more than it saves below this many multiply-adds (measured: in=out=256, B=64,
 * 2r=32 runs in 0.05 ms alone and 0.07 ms on two threads). */
#define KF__SKL_TEAM_MIN_FLOPS (1 << 21)
/* Block extents, functions of the shape alone: rows of x per row-wise GEMM (OpenBLAS re-packs
 * the weight operand per call, a 1/ROWS overhead), and parameter columns per reduction GEMM: at
 * least 256, and at most 8 blocks (these GEMMs are skinny, K = N rows and 2r columns, so fewer,
 * wider calls win: in=out=8192, B=64, forward+backward took 6.9 ms with blocks of 1024 and
 * 8.3 ms with blocks of 256, side by side). */
#define KF__SKL_ROWS 32
/* The wide split serves at most this many rows, and only where both stages split into two blocks
 * or more (in, out >= 512: below that it leaves a team's second thread idle). Best of 3-4
 * interleaved runs, one thread, box loaded by other builds, old (rows) / new (wide) ms, fwd and
 * fwd+bwd, B = 64: in=out=8192 L=1 k=16 0.99 / 0.95, 3.27 / 3.10; 1024 L=4 k=32 0.80 / 0.73,
 * 2.47 / 2.22; 1024 L=1 k=16 0.099 / 0.087, 0.270 / 0.259; two threads 8192: 1.00 / 0.87,
 * 3.43 / 2.80; 1024 L=4 k=32: 0.47 / 0.41, 1.46 / 1.23. Many rows amortise the weights' re-reads
 * and give every thread row blocks, so larger batches keep the row split. */
#define KF__SKL_WIDE_ROWS 256
#define KF__SKL_COLSUM 256 /* dbias columns summed at a time (double accumulators on the stack) */
static int64_t skl_cols(int64_t n) {
    int64_t c = (n + 7) / 8;
    return c < 256 ? 256 : c;
}

static int64_t skl_nblocks(int64_t n) { return (n + skl_cols(n) - 1) / skl_cols(n); }

/* Block b of extent `step` over [0, n): [*lo, *hi), false past the end. */
static bool skl_block(int64_t n, int64_t step, int64_t b, int64_t *lo, int64_t *hi) {
    *lo = b * step;
    *hi = *lo + step < n ? *lo + step : n;
    return *lo < n;
}

typedef struct skl_layout {
    bool wide;        /* the wide split (header comment) */
    int64_t nbi, nbo; /* blocks over in and over out (skl_cols) */
    /* byte offsets of W1 [in, 2r], Z [N, 2r], dZ [N, 2r], dW1 [in, r] and, in the wide split,
     * the partial sums: forward nbi x [N, 2r] (Z); backward nbi x [N, r] (Z's second half)
     * then nbo x [N, 2r] (dZ) */
    size_t w1, z, dz, dw1, part, bytes;
} skl_layout;

static skl_layout skl_layout_of(const struct kf_sklinear_plan *p, int64_t N) {
    skl_layout lo;
    const size_t e = p->dtype == KF_DTYPE_F64 ? sizeof(double) : sizeof(float);
    lo.nbi = skl_nblocks(p->in);
    lo.nbo = skl_nblocks(p->out);
    lo.wide = N <= KF__SKL_WIDE_ROWS && lo.nbi > 1 && lo.nbo > 1;
    size_t z = kf__align_up((size_t)(N * 2 * p->r) * e);
    lo.w1 = 0;
    lo.z = lo.w1 + kf__align_up((size_t)(p->in * 2 * p->r) * e);
    lo.dz = lo.z + z;
    lo.dw1 = lo.dz + z;
    lo.part = lo.dw1 + kf__align_up((size_t)(p->in * p->r) * e);
    const int64_t fwd = lo.nbi * 2, bwd = lo.nbi + lo.nbo * 2; /* in units of N r elements */
    lo.bytes = lo.part + (lo.wide ? (size_t)((fwd > bwd ? fwd : bwd) * N * p->r) * e : 0);
    return lo;
}

static size_t skl_workspace(const struct kf_sklinear_plan *p, int64_t N) {
    return skl_layout_of(p, N).bytes;
}

static void *skl_at(void *ws, size_t off) { return (char *)ws + off; }

static int32_t skl_team_size(const kf_context *ctx, const struct kf_sklinear_plan *p, int64_t N) {
    double flops = (double)N * (double)(p->in + p->out) * 2.0 * (double)p->r;
    return flops < KF__SKL_TEAM_MIN_FLOPS ? 1 : ctx->num_threads;
}

typedef struct skl_fwd_call {
    const kf__skl_fwd *c;
    skl_layout lo;
} skl_fwd_call;

typedef struct skl_bwd_call {
    const kf__skl_bwd *c;
    skl_layout lo;
} skl_bwd_call;

/* For element type T, BLAS prefix X:
 *  skl_pack_w1_X: rows [a0, a1) of W1 = [S1_1..S1_L | U2_1..U2_L] (element (a, j): term j / k,
 *    column j % k);
 *  skl_sum_X: the wide split's partial sums, in block order;
 *  skl_fwd_team_X, skl_bwd_team_X: one thread's share of forward and backward. */
#define KF__SKL_CPU_DEFINE(T, X)                                                                  \
    static void skl_pack_w1_##X(const struct kf_sklinear_plan *p, const T *S1, const T *U2,      \
                                T *W1, int64_t a0, int64_t a1) {                                 \
        const int64_t in = p->in, k = p->k, r = p->r;                                            \
        for (int64_t a = a0; a < a1; ++a)                                                        \
            for (int64_t i = 0; i < p->L; ++i) {                                                 \
                memcpy(W1 + a * 2 * r + i * k, S1 + (i * in + a) * k, (size_t)k * sizeof(T));   \
                memcpy(W1 + a * 2 * r + r + i * k, U2 + (i * in + a) * k,                        \
                       (size_t)k * sizeof(T));                                                   \
            }                                                                                    \
    }                                                                                            \
                                                                                                 \
    /* dst [N, w] (row stride ld) = the sum over b < nb of part + b N w ([N, w] each), summed in \
     * block order whatever the thread: this thread's share of the rows. */                      \
    static void skl_sum_##X(const T *part, int64_t nb, int64_t N, int64_t w, T *dst, int64_t ld, \
                            int tid, int nth) {                                                  \
        int64_t n0, n1;                                                                          \
        kf__cpu_share(N, tid, nth, &n0, &n1);                                                    \
        for (int64_t n = n0; n < n1; ++n) {                                                      \
            T *d = dst + n * ld;                                                                 \
            memcpy(d, part + n * w, (size_t)w * sizeof(T));                                      \
            for (int64_t b = 1; b < nb; ++b) {                                                   \
                const T *q = part + (b * N + n) * w;                                             \
                for (int64_t j = 0; j < w; ++j) d[j] += q[j];                                    \
            }                                                                                    \
        }                                                                                        \
    }                                                                                            \
                                                                                                 \
    /* db[o] (+)= sum over the N rows of dy[:, o], o in [o0, o1): rows outer, so the inner loop   \
     * runs along memory; double accumulators, KF__SKL_COLSUM columns at a time. */              \
    static void skl_colsum_##X(const T *dy, int64_t N, int64_t out, int64_t o0, int64_t o1,     \
                               T *db, bool accumulate) {                                         \
        double acc[KF__SKL_COLSUM];                                                              \
        for (int64_t c0 = o0; c0 < o1; c0 += KF__SKL_COLSUM) {                                   \
            const int64_t w = o1 - c0 < KF__SKL_COLSUM ? o1 - c0 : KF__SKL_COLSUM;               \
            for (int64_t j = 0; j < w; ++j) acc[j] = 0.0;                                        \
            for (int64_t n = 0; n < N; ++n)                                                      \
                for (int64_t j = 0; j < w; ++j) acc[j] += dy[n * out + c0 + j];                  \
            for (int64_t j = 0; j < w; ++j)                                                      \
                db[c0 + j] = accumulate ? (T)(db[c0 + j] + acc[j]) : (T)acc[j];                  \
        }                                                                                        \
    }                                                                                            \
                                                                                                 \
    /* y[rows, o0:o1] = s Z_rows [U1; S2][:, o0:o1] (+ bias): the second stage for a block of    \
     * rows (row split) or of output columns (wide split). */                                    \
    static void skl_stage2_##X(const struct kf_sklinear_plan *p, const T *z, int64_t rows,      \
                               const T *U1, const T *S2, const T *bias, int64_t o0, int64_t o1,  \
                               T *y) {                                                           \
        const int64_t out = p->out, r = p->r, w = o1 - o0;                                       \
        const T s = (T)1 / ((T)2 * (T)p->L);                                                     \
        if (bias)                                                                                \
            for (int64_t n = 0; n < rows; ++n)                                                   \
                memcpy(y + n * out + o0, bias + o0, (size_t)w * sizeof(T));                      \
        kf__##X##gemm(false, false, rows, w, r, s, z, 2 * r, U1 + o0, out, bias ? 1 : 0, y + o0, \
                      out);                                                                      \
        kf__##X##gemm(false, false, rows, w, r, s, z + r, 2 * r, S2 + o0, out, 1, y + o0, out);  \
    }                                                                                            \
                                                                                                 \
    static void skl_fwd_team_##X(void *arg, int tid, int nth) {                                  \
        const kf__skl_fwd *c = ((const skl_fwd_call *)arg)->c;                                   \
        const skl_layout *lo = &((const skl_fwd_call *)arg)->lo;                                 \
        const struct kf_sklinear_plan *p = c->plan;                                              \
        const int64_t in = p->in, out = p->out, r = p->r, N = c->N;                              \
        const T *x = c->x;                                                                       \
        T *W1 = skl_at(c->ws, lo->w1), *Z = skl_at(c->ws, lo->z), *P = skl_at(c->ws, lo->part);  \
        int64_t a0, a1, n0, n1, o0, o1;                                                          \
        if (lo->wide) {                                                                          \
            /* Z = x W1 by blocks of `in`, each packing its own rows of W1 first */              \
            for (int64_t b = tid; skl_block(in, skl_cols(in), b, &a0, &a1); b += nth) {          \
                skl_pack_w1_##X(p, c->S1, c->U2, W1, a0, a1);                                    \
                kf__##X##gemm(false, false, N, 2 * r, a1 - a0, 1, x + a0, in, W1 + a0 * 2 * r,   \
                              2 * r, 0, lo->nbi > 1 ? P + b * N * 2 * r : Z, 2 * r);             \
            }                                                                                    \
            if (lo->nbi > 1) {                                                                   \
                _Pragma("omp barrier")                                                           \
                skl_sum_##X(P, lo->nbi, N, 2 * r, Z, 2 * r, tid, nth);                           \
            }                                                                                    \
            _Pragma("omp barrier")                                                               \
            for (int64_t b = tid; skl_block(out, skl_cols(out), b, &o0, &o1); b += nth)          \
                skl_stage2_##X(p, Z, N, c->U1, c->S2, c->bias, o0, o1, c->y);                    \
            return;                                                                              \
        }                                                                                        \
        kf__cpu_share(in, tid, nth, &a0, &a1);                                                   \
        skl_pack_w1_##X(p, c->S1, c->U2, W1, a0, a1);                                            \
        _Pragma("omp barrier")                                                                   \
        for (int64_t b = tid; skl_block(N, KF__SKL_ROWS, b, &n0, &n1); b += nth) {               \
            T *z = Z + n0 * 2 * r;                                                               \
            kf__##X##gemm(false, false, n1 - n0, 2 * r, in, 1, x + n0 * in, in, W1, 2 * r, 0, z, \
                          2 * r);                                                                \
            skl_stage2_##X(p, z, n1 - n0, c->U1, c->S2, c->bias, 0, out, (T *)c->y + n0 * out);  \
        }                                                                                        \
    }                                                                                            \
                                                                                                 \
    /* The wide split's products through the bottleneck: W1 packed; Z's second half (x U2, for  \
     * dS2) by blocks of `in`; dZ = s dy [U1; S2]^T by blocks of `out`; partial sums in block    \
     * order. dx is left to the column phase. */                                                 \
    static void skl_bwd_wide_##X(const kf__skl_bwd *c, const skl_layout *lo, int tid, int nth) { \
        const struct kf_sklinear_plan *p = c->plan;                                              \
        const int64_t in = p->in, out = p->out, r = p->r, N = c->N;                              \
        const T s = (T)1 / ((T)2 * (T)p->L);                                                     \
        const T *x = c->x, *U1 = c->U1, *S2 = c->S2, *DY = c->dy;                                \
        T *W1 = skl_at(c->ws, lo->w1), *Z = skl_at(c->ws, lo->z), *dZ = skl_at(c->ws, lo->dz);   \
        T *Pz = skl_at(c->ws, lo->part), *Pd = Pz + lo->nbi * N * r;                             \
        int64_t a0, a1, o0, o1;                                                                  \
        const bool zsum = c->dS2 && lo->nbi > 1, dsum = lo->nbo > 1;                             \
        for (int64_t j = tid; j < lo->nbi + lo->nbo; j += nth) {                                 \
            if (j < lo->nbi) {                                                                   \
                skl_block(in, skl_cols(in), j, &a0, &a1);                                        \
                skl_pack_w1_##X(p, c->S1, c->U2, W1, a0, a1);                                    \
                if (c->dS2)                                                                      \
                    kf__##X##gemm(false, false, N, r, a1 - a0, 1, x + a0, in,                    \
                                  W1 + a0 * 2 * r + r, 2 * r, 0, zsum ? Pz + j * N * r : Z + r,  \
                                  zsum ? r : 2 * r);                                             \
            } else {                                                                             \
                const int64_t b = j - lo->nbi;                                                   \
                skl_block(out, skl_cols(out), b, &o0, &o1);                                      \
                T *d = dsum ? Pd + b * N * 2 * r : dZ;                                           \
                kf__##X##gemm(false, true, N, r, o1 - o0, s, DY + o0, out, U1 + o0, out, 0, d,   \
                              2 * r);                                                            \
                kf__##X##gemm(false, true, N, r, o1 - o0, s, DY + o0, out, S2 + o0, out, 0,      \
                              d + r, 2 * r);                                                     \
            }                                                                                    \
        }                                                                                        \
        _Pragma("omp barrier")                                                                   \
        if (zsum) skl_sum_##X(Pz, lo->nbi, N, r, Z + r, 2 * r, tid, nth);                        \
        if (dsum) skl_sum_##X(Pd, lo->nbo, N, 2 * r, dZ, 2 * r, tid, nth);                       \
    }                                                                                            \
                                                                                                 \
    static void skl_bwd_team_##X(void *arg, int tid, int nth) {                                  \
        const kf__skl_bwd *c = ((const skl_bwd_call *)arg)->c;                                   \
        const skl_layout *lo = &((const skl_bwd_call *)arg)->lo;                                 \
        const struct kf_sklinear_plan *p = c->plan;                                              \
        const int64_t in = p->in, out = p->out, r = p->r, k = p->k, N = c->N;                    \
        const T s = (T)1 / ((T)2 * (T)p->L), beta = c->accumulate ? 1 : 0;                       \
        const T *x = c->x, *U1 = c->U1, *S2 = c->S2, *DY = c->dy;                                \
        T *dX = c->dx, *dS1 = c->dS1, *dS2 = c->dS2, *db = c->db;                                \
        T *W1 = skl_at(c->ws, lo->w1), *Z = skl_at(c->ws, lo->z), *dZ = skl_at(c->ws, lo->dz),   \
          *dW1 = skl_at(c->ws, lo->dw1);                                                         \
        int64_t a0, a1, n0, n1, o0, o1;                                                          \
        if (lo->wide) {                                                                          \
            skl_bwd_wide_##X(c, lo, tid, nth);                                                   \
        } else {                                                                                 \
            kf__cpu_share(in, tid, nth, &a0, &a1);                                               \
            skl_pack_w1_##X(p, c->S1, c->U2, W1, a0, a1);                                        \
            _Pragma("omp barrier")                                                               \
            /* Row-wise: the recomputed second half of Z (for dS2), dZ, dx. */                   \
            for (int64_t b = tid; skl_block(N, KF__SKL_ROWS, b, &n0, &n1); b += nth) {           \
                const int64_t rows = n1 - n0;                                                    \
                const T *dy = DY + n0 * out;                                                     \
                T *dz = dZ + n0 * 2 * r;                                                         \
                if (dS2)                                                                         \
                    kf__##X##gemm(false, false, rows, r, in, 1, x + n0 * in, in, W1 + r, 2 * r,  \
                                  0, Z + n0 * 2 * r + r, 2 * r);                                 \
                kf__##X##gemm(false, true, rows, r, out, s, dy, out, U1, out, 0, dz, 2 * r);     \
                kf__##X##gemm(false, true, rows, r, out, s, dy, out, S2, out, 0, dz + r, 2 * r); \
                if (dX)                                                                          \
                    kf__##X##gemm(false, true, rows, in, 2 * r, 1, dz, 2 * r, W1, 2 * r, 0,      \
                                  dX + n0 * in, in);                                             \
            }                                                                                    \
        }                                                                                        \
        _Pragma("omp barrier")                                                                   \
        /* Column-wise: dS2 and dbias by output column; dS1 (and, in the wide split, dx) by      \
         * input column. */                                                                      \
        for (int64_t b = tid; skl_block(out, skl_cols(out), b, &o0, &o1); b += nth) {            \
            if (dS2)                                                                             \
                kf__##X##gemm(true, false, r, o1 - o0, N, s, Z + r, 2 * r, DY + o0, out, beta,   \
                              dS2 + o0, out);                                                    \
            if (db) skl_colsum_##X(DY, N, out, o0, o1, db, c->accumulate);                       \
        }                                                                                        \
        for (int64_t b = tid; skl_block(in, skl_cols(in), b, &a0, &a1); b += nth) {              \
            if (dX && lo->wide)                                                                  \
                kf__##X##gemm(false, true, N, a1 - a0, 2 * r, 1, dZ, 2 * r, W1 + a0 * 2 * r,     \
                              2 * r, 0, dX + a0, in);                                            \
            if (!dS1) continue;                                                                  \
            kf__##X##gemm(true, false, a1 - a0, r, N, 1, x + a0, in, dZ, 2 * r, 0, dW1 + a0 * r, \
                          r);                                                                    \
            /* dW1 row a holds the L terms' k columns side by side; dS1 is [L, in, k] */         \
            for (int64_t a = a0; a < a1; ++a)                                                    \
                for (int64_t i = 0; i < p->L; ++i) {                                             \
                    T *d = dS1 + (i * in + a) * k;                                               \
                    const T *g = dW1 + a * r + i * k;                                            \
                    for (int64_t j = 0; j < k; ++j) d[j] = c->accumulate ? d[j] + g[j] : g[j];   \
                }                                                                                \
        }                                                                                        \
    }

KF__SKL_CPU_DEFINE(float, s)
KF__SKL_CPU_DEFINE(double, d)

static kf_status skl_forward(kf_context *ctx, const kf__skl_fwd *c) {
    skl_fwd_call call = {.c = c, .lo = skl_layout_of(c->plan, c->N)};
    kf__cpu_team(skl_team_size(ctx, c->plan, c->N),
                 c->plan->dtype == KF_DTYPE_F64 ? skl_fwd_team_d : skl_fwd_team_s, &call);
    return KF_OK;
}

static kf_status skl_backward(kf_context *ctx, const kf__skl_bwd *c) {
    skl_bwd_call call = {.c = c, .lo = skl_layout_of(c->plan, c->N)};
    kf__cpu_team(skl_team_size(ctx, c->plan, c->N),
                 c->plan->dtype == KF_DTYPE_F64 ? skl_bwd_team_d : skl_bwd_team_s, &call);
    return KF_OK;
}

const kf__skl_ops kf__cpu_skl_ops = {NULL, skl_workspace, skl_forward, skl_backward};

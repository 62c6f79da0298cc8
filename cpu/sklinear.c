/* CPU backend of the sketched linear layer: two GEMMs through the 2r-wide bottleneck (notation
 * of core/sklinear_backend.h), OpenBLAS from the context's own threads, no allocation.
 *
 * The first-stage operand W1 = [S1_1..S1_L | U2_1..U2_L] is packed [in, 2r] into the
 * workspace (the terms interleave in memory, so no single matrix view exists), making the first
 * stage one GEMM of width 2r instead of 2L GEMMs of width k. The second stage reads U1s and S2s
 * in place: each is an [r, out] matrix already.
 *
 * Work is split into fixed blocks: rows of x for the row-wise products, columns of the
 * parameters for the reductions over rows (dS1s, dS2s, dbias). Blocks go round-robin to the
 * threads; every element has one writer, and since the blocks (hence every BLAS call) depend on
 * the shape alone, the bits do not depend on the thread count. */
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
static int64_t skl_cols(int64_t n) {
    int64_t c = (n + 7) / 8;
    return c < 256 ? 256 : c;
}

/* Block b of extent `step` over [0, n): [*lo, *hi), false past the end. */
static bool skl_block(int64_t n, int64_t step, int64_t b, int64_t *lo, int64_t *hi) {
    *lo = b * step;
    *hi = *lo + step < n ? *lo + step : n;
    return *lo < n;
}

typedef struct skl_layout {
    /* byte offsets of W1 [in, 2r], Z [N, 2r], dZ [N, 2r], dW1 [in, r] */
    size_t w1, z, dz, dw1, bytes;
} skl_layout;

static skl_layout skl_layout_of(const struct kf_sklinear_plan *p, int64_t N) {
    skl_layout lo;
    size_t z = kf__align_up((size_t)(N * 2 * p->r) * sizeof(float));
    lo.w1 = 0;
    lo.z = lo.w1 + kf__align_up((size_t)(p->in * 2 * p->r) * sizeof(float));
    lo.dz = lo.z + z;
    lo.dw1 = lo.dz + z;
    lo.bytes = lo.dw1 + kf__align_up((size_t)(p->in * p->r) * sizeof(float));
    return lo;
}

static size_t skl_workspace(const struct kf_sklinear_plan *p, int64_t N) {
    return skl_layout_of(p, N).bytes;
}

static float *skl_at(void *ws, size_t off) { return (float *)(void *)((char *)ws + off); }

static int32_t skl_team_size(const kf_context *ctx, const struct kf_sklinear_plan *p, int64_t N) {
    double flops = (double)N * (double)(p->in + p->out) * 2.0 * (double)p->r;
    return flops < KF__SKL_TEAM_MIN_FLOPS ? 1 : ctx->num_threads;
}

/* Rows [a0, a1) of W1 = [S1_1..S1_L | U2_1..U2_L] (element (a, j): term j / k, column j % k). */
static void skl_pack_w1(const struct kf_sklinear_plan *p, const float *S1, const float *U2,
                        float *W1, int64_t a0, int64_t a1) {
    const int64_t in = p->in, k = p->k, r = p->r;
    for (int64_t a = a0; a < a1; ++a)
        for (int64_t i = 0; i < p->L; ++i) {
            memcpy(W1 + a * 2 * r + i * k, S1 + (i * in + a) * k, (size_t)k * sizeof(float));
            memcpy(W1 + a * 2 * r + r + i * k, U2 + (i * in + a) * k, (size_t)k * sizeof(float));
        }
}

typedef struct skl_fwd_call {
    const kf__skl_fwd *c;
    skl_layout lo;
} skl_fwd_call;

static void skl_fwd_team(void *arg, int tid, int nth) {
    const kf__skl_fwd *c = ((const skl_fwd_call *)arg)->c;
    const skl_layout *lo = &((const skl_fwd_call *)arg)->lo;
    const struct kf_sklinear_plan *p = c->plan;
    const int64_t in = p->in, out = p->out, r = p->r;
    float *W1 = skl_at(c->ws, lo->w1), *Z = skl_at(c->ws, lo->z);
    int64_t a0, a1, n0, n1;
    kf__cpu_share(in, tid, nth, &a0, &a1);
    skl_pack_w1(p, c->S1, c->U2, W1, a0, a1);
#pragma omp barrier
    const float s = 1.0f / (2.0f * (float)p->L);
    for (int64_t b = tid; skl_block(c->N, KF__SKL_ROWS, b, &n0, &n1); b += nth) {
        const int64_t rows = n1 - n0;
        float *y = c->y + n0 * out, *z = Z + n0 * 2 * r;
        kf__sgemm(false, false, rows, 2 * r, in, 1.0f, c->x + n0 * in, in, W1, 2 * r, 0.0f, z,
                  2 * r);
        if (c->bias)
            for (int64_t n = 0; n < rows; ++n)
                memcpy(y + n * out, c->bias, (size_t)out * sizeof(float));
        kf__sgemm(false, false, rows, out, r, s, z, 2 * r, c->U1, out, c->bias ? 1.0f : 0.0f, y,
                  out);
        kf__sgemm(false, false, rows, out, r, s, z + r, 2 * r, c->S2, out, 1.0f, y, out);
    }
}

static kf_status skl_forward(kf_context *ctx, const kf__skl_fwd *c) {
    skl_fwd_call call = {.c = c, .lo = skl_layout_of(c->plan, c->N)};
    kf__cpu_team(skl_team_size(ctx, c->plan, c->N), skl_fwd_team, &call);
    return KF_OK;
}

typedef struct skl_bwd_call {
    const kf__skl_bwd *c;
    skl_layout lo;
} skl_bwd_call;

static void skl_bwd_team(void *arg, int tid, int nth) {
    const kf__skl_bwd *c = ((const skl_bwd_call *)arg)->c;
    const skl_layout *lo = &((const skl_bwd_call *)arg)->lo;
    const struct kf_sklinear_plan *p = c->plan;
    const int64_t in = p->in, out = p->out, r = p->r, k = p->k, N = c->N;
    const float s = 1.0f / (2.0f * (float)p->L), beta = c->accumulate ? 1.0f : 0.0f;
    float *W1 = skl_at(c->ws, lo->w1), *Z = skl_at(c->ws, lo->z), *dZ = skl_at(c->ws, lo->dz),
          *dW1 = skl_at(c->ws, lo->dw1);
    int64_t a0, a1, n0, n1, o0, o1;
    kf__cpu_share(in, tid, nth, &a0, &a1);
    skl_pack_w1(p, c->S1, c->U2, W1, a0, a1);
#pragma omp barrier
    /* Row-wise: the recomputed second half of Z (for dS2), dZ, dx. */
    for (int64_t b = tid; skl_block(N, KF__SKL_ROWS, b, &n0, &n1); b += nth) {
        const int64_t rows = n1 - n0;
        const float *dy = c->dy + n0 * out;
        float *dz = dZ + n0 * 2 * r;
        if (c->dS2)
            kf__sgemm(false, false, rows, r, in, 1.0f, c->x + n0 * in, in, W1 + r, 2 * r, 0.0f,
                      Z + n0 * 2 * r + r, 2 * r);
        kf__sgemm(false, true, rows, r, out, s, dy, out, c->U1, out, 0.0f, dz, 2 * r);
        kf__sgemm(false, true, rows, r, out, s, dy, out, c->S2, out, 0.0f, dz + r, 2 * r);
        if (c->dx)
            kf__sgemm(false, true, rows, in, 2 * r, 1.0f, dz, 2 * r, W1, 2 * r, 0.0f,
                      c->dx + n0 * in, in);
    }
#pragma omp barrier
    /* Column-wise reductions over the N rows: dS2 and dbias by output column, dS1 by input row. */
    for (int64_t b = tid; skl_block(out, skl_cols(out), b, &o0, &o1); b += nth) {
        if (c->dS2)
            kf__sgemm(true, false, r, o1 - o0, N, s, Z + r, 2 * r, c->dy + o0, out, beta,
                      c->dS2 + o0, out);
        for (int64_t o = o0; c->db && o < o1; ++o) {
            double acc = 0.0;
            for (int64_t n = 0; n < N; ++n) acc += c->dy[n * out + o];
            c->db[o] = c->accumulate ? (float)(c->db[o] + acc) : (float)acc;
        }
    }
    for (int64_t b = tid; c->dS1 && skl_block(in, skl_cols(in), b, &a0, &a1); b += nth) {
        kf__sgemm(true, false, a1 - a0, r, N, 1.0f, c->x + a0, in, dZ, 2 * r, 0.0f,
                  dW1 + a0 * r, r);
        for (int64_t a = a0; a < a1; ++a)
            for (int64_t j = 0; j < r; ++j) {
                float *d = c->dS1 + (j / k * in + a) * k + j % k;
                *d = c->accumulate ? *d + dW1[a * r + j] : dW1[a * r + j];
            }
    }
}

static kf_status skl_backward(kf_context *ctx, const kf__skl_bwd *c) {
    skl_bwd_call call = {.c = c, .lo = skl_layout_of(c->plan, c->N)};
    kf__cpu_team(skl_team_size(ctx, c->plan, c->N), skl_bwd_team, &call);
    return KF_OK;
}

const kf__skl_ops kf__cpu_skl_ops = {NULL, skl_workspace, skl_forward, skl_backward};

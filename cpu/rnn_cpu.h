/* Private helpers of the CPU GRU / A-GRU backend (cpu/rnn_fwd.c, cpu/rnn_bwd.c; float64:
 * cpu/rnn_f64.c): the layout of the workspace and the reserve, the per-cell weight view, work
 * partitioning (their vector code, activations and micro-kernel: cpu/rnn_simd.h). Math and
 * derivations: docs/ops/rnn.md.
 *
 * Rows. Every [T*B, .] buffer of a call, ours and the caller's, stores row (t, b) at
 * r(t, b) = t*ts + b*bs, with (ts, bs) = (B, 1), or (1, T) when batch_first: the caller's x, y,
 * dy, dx are used in place and the whole-sequence GEMMs run over T*B contiguous rows.
 *
 * Threads. The recurrence is split into `ns` slices of batch rows (ns = min(num_threads, B));
 * a slice keeps its rows for the whole sequence, so a forward or backward step needs no barrier.
 * An OpenMP team of any size runs slices tid, tid + nthreads, ..., so results never depend on how
 * many threads the runtime actually granted.
 *
 * Reserve (training forward -> backward), per cell c = l*D + d, N = T*B rows:
 *   hp[c]    [N, H]     state before step t of row (t, b) (h0 at the first step)
 *   gates[c] [N, NG*H]  GRU (NG = 4): r, z, n, W_hn h + b_hn; A-GRU (NG = 3): the
 *                       pre-activations a_z, a_r, a_d of z, r, d, from which the backward takes
 *                       each gate and its complement (1 - z, 1 - r, 1 - d^2) without cancellation
 *            (rows with t >= len[b] are not written and never read)
 *   out[l]   [N, D*H]   layer l < L-1 output after dropout = layer l+1's input
 * Workspace (shared by forward and backward; scratch, nothing survives a call):
 *   pack[l]  A-GRU only: W3 = [W_z; W_r; V_h] [3H, I_l], b3 = [b_z; b_r; b_h]
 *   rec[c]   per cell: the recurrent weights as micro-kernel panels (kf__mk), packed once per
 *            call: forward pk[0] = W_hh^T gated r,z,n (GRU) or [U_z; U_r]^T gated z,r (A-GRU),
 *            pk[1] = A^T (A-GRU); backward pk[0] = W_hh (GRU) or [U_z; U_r] (A-GRU), pk[1] = A,
 *            pk[2] = W3 [3H, in] where kf__rnn_dx_fused(in) (room for the widest layer input)
 *   big[0]   [N, 3H]  forward: direction 0's input projection of one step, slice s in rows
 *                     b0.. of its own; backward where not wrec_fused: dG_x (input-side
 *                     pre-activation gradients); only [B, 3H] where wrec_fused
 *   big[1]   [N, 3H]  forward: the same for direction 1; backward where not wrec_fused: GRU
 *                     dG_h (recurrent-side), A-GRU q = r*h [N, H]; [B, 3H] where wrec_fused
 *   seq[2]   [N, D*H] (L > 1) forward inference: layer outputs; backward: d(layer output)
 *   slice[s] per slice: st, t1, t2, each [nb, H]
 *   gmat     A-GRU backward: G = sum da_d^T q [H, H]
 *   epsacc   A-GRU backward: per-slice partial sums of d loss / d eps (double)
 *   wpart[s] backward where wrec_fused: slice s's part [3H, H] of the recurrent side's weight
 *            gradients, accumulated step by step while its rows are in cache: GRU dW_hh =
 *            sum dG_h^T Hp; A-GRU [dU_z; dU_r] = sum [da_z, da_r]^T Hp, then G = sum da_d^T q;
 *            then, aux_step after it, the step's aux rows, dG_h [nbmax, 3H] or q [nbmax, H]
 *            (used within the step only, so big[1] is not); then, win after it, the slice's
 *            part of dW3^T = sum X^T dG_x [in, 3H] (largest layer input); then, dgx_step after
 *            it, the step's dG_x rows [nbmax, 3H] (dX is per step too, so big[0] is not used)
 *   bsum[s]  backward: slice s's bias-gradient sums (double), colsum dG_x [3H] and (GRU) the
 *            colsum of dG_h's n part [H], accumulated step by step (float32 plans only)
 *   views, wide, dwide, xw, dxw  bfloat16 and float16 plans only: their float32 weights, weight
 *            gradients, the backward's x and dX (kf__rnn_cpu_layout); slice[s] adds xs. Such a
 *            plan runs the float32 kernels on them and on float32 buffers everywhere else
 *            (reserve included); only the caller's tensors are in its dtype, and the kernels
 *            read and write those themselves.
 * A float64 plan (cpu/rnn_f64.c) has the same layout in doubles, except: no pack (its GEMMs read
 * the caller's weights in place), and rec[c] is A = W_h - W_h^T - gamma I [H, H] for an A-GRU,
 * nothing for a GRU; big[0] holds the input projection of all rows of the direction in flight,
 * big[1] the slices' recurrent products of one step. */
#ifndef KF_CPU_RNN_CPU_H
#define KF_CPU_RNN_CPU_H

#include "counter_rng.h"
#include "cpu_backend.h"
#include "lowp_simd.h"
#include "team.h"

#include <math.h>
#include <string.h>

/* Instruction sets. This header, rnn_layout.c, rnn_fwd.c and rnn_bwd.c are one source compiled
 * once per instruction set the build has: for the build's baseline (KF_CPU_ARCH, x86-64-v3 by
 * default) and, where CMake's KF_CPU_AVX512 holds, again for x86-64-v4 (AVX-512) by cpu/rnn_v4.c,
 * which defines KF__RNN_V4 and includes the three. Each compilation's cross-file names get the
 * suffix of its ISA, and its op-table entries are gathered in that ISA's op table; the context
 * picks an ISA once, at creation (cpu/isa.c), and a plan takes that ISA's table at its own
 * creation (cpu/backend.c). */
#ifdef KF__RNN_V4
#define KF__RNN_ISA(name) name##_v4
#else
#define KF__RNN_ISA(name) name##_base
#endif
#define kf__rnn_cpu_layout_init KF__RNN_ISA(kf__rnn_cpu_layout_init)
#define kf__rnn_cpu_cell KF__RNN_ISA(kf__rnn_cpu_cell)
#define kf__rnn_cpu_pack KF__RNN_ISA(kf__rnn_cpu_pack)
#define kf__rnn_cpu_low_views KF__RNN_ISA(kf__rnn_cpu_low_views)
#define kf__rnn_cpu_widen KF__RNN_ISA(kf__rnn_cpu_widen)
#define kf__rnn_cpu_narrow KF__RNN_ISA(kf__rnn_cpu_narrow)
#define kf__rnn_cpu_drop_row KF__RNN_ISA(kf__rnn_cpu_drop_row)
#define kf__cpu_rnn_sizes KF__RNN_ISA(kf__cpu_rnn_sizes)
#define kf__cpu_rnn_forward KF__RNN_ISA(kf__cpu_rnn_forward)
#define kf__cpu_rnn_backward KF__RNN_ISA(kf__cpu_rnn_backward)
#define kf__cpu_rnn_isa_ops KF__RNN_ISA(kf__cpu_rnn_ops) /* cpu/cpu_backend.h */

#define kf__rnn_cpu_drop_row_f64 KF__RNN_ISA(kf__rnn_cpu_drop_row_f64)

/* This ISA's op-table entries (cpu/rnn_layout.c, rnn_fwd.c, rnn_bwd.c), gathered in
 * kf__cpu_rnn_isa_ops: float32 plans, and the baseline's sizes for float64 ones too (cpu/rnn_f64.c
 * runs on the baseline's layout; the float64 entries are declared in cpu_backend.h). */
void kf__cpu_rnn_sizes(const struct kf_rnn_plan *p, int64_t T, int64_t B, bool training,
                       size_t *ws_bytes, size_t *reserve_bytes);
kf_status kf__cpu_rnn_forward(kf_context *ctx, const kf__rnn_fwd *c);
kf_status kf__cpu_rnn_backward(kf_context *ctx, const kf__rnn_bwd *c);

typedef struct kf__rnn_cpu_layout {
    int64_t T, B, N, H, D;
    int64_t ts, bs;      /* row strides of (t, b) */
    int32_t ns;          /* batch slices */
    int64_t nbmax;       /* rows of the largest slice */
    int32_t ng;          /* gate vectors saved per row: 4 (GRU) or 3 (A-GRU) */
    bool agru;
    /* workspace offsets (bytes) */
    size_t pack_first, pack_stride; /* pack[l] at l ? pack_first + (l-1)*pack_stride : 0 */
    size_t rec, rec_bytes, rec_pk1, rec_pk2; /* rec[c] at rec + c*rec_bytes; its pk[i] rec_pki
                                              * after it */
    size_t big[2], seq[2], slice0, slice_bytes, slice_buf, gmat, epsacc, wpart, wpart_bytes;
    size_t bsum, bsum_bytes, ws_bytes;
    bool wrec_fused; /* backward: dW_hh (GRU) or dU_z, dU_r, G (A-GRU) by kf__mk_st per step
                      * (wpart), not by GEMMs after the recurrence */
    size_t aux_step; /* where wrec_fused: the step's aux rows (dG_h, q), this far into wpart[s] */
    size_t win;      /* and the part of dW3^T [in, 3H] (rnn_bwd.c: input_side_step), this far */
    size_t dgx_step; /* and the step's dG_x rows [nbmax, 3H], this far */
    /* bfloat16 and float16 plans (low): float32 arithmetic, as a float32 plan's, on float32
     * copies in the workspace of what the kernels read as whole tensors or sum over directions
     * (views: 2 * num_weights pointers, to wide's weights and dwide's gradients; the backward's
     * xw, dxw [N, I]: the layer input and its gradient); the forward's x, and the caller's y, dy,
     * h0, hn, dhn, dh0 are converted per slice and step (kf__rnn_cpu_get, kf__rnn_cpu_put; x into
     * the slice's xs). All 0 for other plans. */
    bool low, bf16;
    size_t views, wide, dwide, xw, dxw;
    /* reserve offsets (bytes) */
    size_t cell_bytes, hp_bytes, out0, out_bytes, reserve_bytes;
} kf__rnn_cpu_layout;

/* Fills `lo` for a call of T steps over B samples. `training` adds the reserve. */
void kf__rnn_cpu_layout_init(kf__rnn_cpu_layout *lo, const struct kf_rnn_plan *p, int64_t T,
                             int64_t B, bool training);

/* The weights of cell (l, d) as the kernels use them. GRU: w3 = weight_ih, b3 = bias_ih,
 * brec = bias_hh; gate blocks r, z, n. A-GRU: the packed copies of the workspace, gate blocks
 * z, r, d; brec = NULL. pk: the recurrent panels of the workspace (rec[c] above), for the
 * direction of the call that packed them. */
typedef struct kf__rnn_cell {
    const float *w3, *b3, *brec, *pk[3];
    float eps;
    int64_t in; /* I_l */
} kf__rnn_cell;

kf__rnn_cell kf__rnn_cpu_cell(const kf__rnn_cpu_layout *lo, const struct kf_rnn_plan *p,
                              const void *const *w, void *ws, int32_t l, int32_t d);

/* Thread `tid` of `nth` does its share of packing, for a forward (bwd false) or a backward call,
 * every cell's recurrent panels and, for an A-GRU, every layer's W3 and b3 into the workspace
 * (the caller puts a barrier after it). */
void kf__rnn_cpu_pack(const kf__rnn_cpu_layout *lo, const struct kf_rnn_plan *p,
                      const void *const *w, void *ws, bool bwd, int tid, int nth);

/* A low plan's float32 views of its weights and weight gradients (lo->views), pointing into the
 * workspace: (*w32)[k] to weight k's float32 copy, (*dw32)[k] to its gradient's float32 block
 * where dw[k] is wanted (NULL otherwise; *dw32 NULL where dw is; dw32 itself NULL in the
 * forward). The calling thread fills them before the team, whose kf__rnn_cpu_widen then fills
 * the copies. */
void kf__rnn_cpu_low_views(const kf__rnn_cpu_layout *lo, const struct kf_rnn_plan *p, void *ws,
                           void *const *dw, const void *const **w32, void *const **dw32);

/* A low plan's call, thread `tid` of `nth`: its share of widening the weights `w` into their
 * copies (views) and, where x is given (the backward), the layer input into lo->xw (the caller
 * puts a barrier after it). */
void kf__rnn_cpu_widen(const kf__rnn_cpu_layout *lo, const struct kf_rnn_plan *p,
                       const void *const *w, const void *x, void *ws, int tid, int nth);

/* A low plan's backward, thread `tid` of `nth`, after the last cell and a barrier: its share of
 * rounding dX (lo->dxw) into dx and each wanted weight gradient's float32 block into dw[k], as
 * round(old + g) where `accumulate`: one rounding per element, as the float32 plan's one sum. */
void kf__rnn_cpu_narrow(const kf__rnn_cpu_layout *lo, const struct kf_rnn_plan *p, void *ws,
                        void *dx, void *const *dw, bool accumulate, int tid, int nth);

/* Dropout between layers: element j of row (t, b) of layer l's output has counter
 * base + ((l*T + t)*B + b)*D*H + j (core/rnn_backend.h). */
typedef struct kf__rnn_drop {
    bool on;
    float p, scale;
    uint64_t seed, base;
} kf__rnn_drop;

/* dst[0:n] = src masked and scaled for the element counters c0 .. c0+n-1 when `dr` is on, else a
 * copy; src NULL reads zeros. The float64 form scales by 1 / (1 - p) in float64. */
void kf__rnn_cpu_drop_row(float *restrict dst, const float *restrict src, int64_t n,
                          const kf__rnn_drop *dr, uint64_t c0);
void kf__rnn_cpu_drop_row_f64(double *restrict dst, const double *restrict src, int64_t n,
                              const kf__rnn_drop *dr, uint64_t c0);

/* Counter of element 0 of direction d's half of row (t, b), layer l. */
static inline uint64_t kf__rnn_drop_counter(const kf__rnn_cpu_layout *lo, const kf__rnn_drop *dr,
                                            int32_t l, int64_t t, int64_t b, int32_t d) {
    return dr->base + (uint64_t)((((int64_t)l * lo->T + t) * lo->B + b) * lo->D * lo->H +
                                 (int64_t)d * lo->H);
}

/* n floats of the caller's tensor `src` from element `off` on (the plan's dtype: float32, or a
 * low plan's, widened) into dst; src NULL reads zeros. */
static inline void kf__rnn_cpu_get(const kf__rnn_cpu_layout *lo, float *dst, const void *src,
                                   int64_t off, int64_t n) {
    if (!src)
        memset(dst, 0, (size_t)n * sizeof(float));
    else if (lo->low)
        kf__lp_load_n(dst, (const uint16_t *)src + off, n, lo->bf16);
    else
        memcpy(dst, (const float *)src + off, (size_t)n * sizeof(float));
}

/* n floats of src into the caller's tensor `dst` from element `off` on (rounded to a low plan's
 * dtype); src NULL writes zeros (+0, all bits clear, in every dtype). */
static inline void kf__rnn_cpu_put(const kf__rnn_cpu_layout *lo, void *dst, int64_t off,
                                   const float *src, int64_t n) {
    const size_t e = lo->low ? sizeof(uint16_t) : sizeof(float);
    if (!src)
        memset((char *)dst + (size_t)off * e, 0, (size_t)n * e);
    else if (lo->low)
        kf__lp_store_n((uint16_t *)dst + off, src, n, false, lo->bf16);
    else
        memcpy((float *)dst + off, src, (size_t)n * sizeof(float));
}

static inline void *kf__at(void *base, size_t off) { return (char *)base + off; }
static inline const void *kf__cat(const void *base, size_t off) { return (const char *)base + off; }

static inline int64_t kf__rnn_row(const kf__rnn_cpu_layout *lo, int64_t t, int64_t b) {
    return t * lo->ts + b * lo->bs;
}

/* [lo, hi) of part i of n items split into `parts` near-equal parts. */
static inline void kf__part(int64_t n, int64_t parts, int64_t i, int64_t *lo, int64_t *hi) {
    *lo = n * i / parts;
    *hi = n * (i + 1) / parts;
}

/* Valid steps of sample b: t < len(b). */
static inline int64_t kf__rnn_len(const int32_t *lengths, int64_t T, int64_t b) {
    return lengths ? (int64_t)lengths[b] : T;
}

/* Per-slice scratch of slice s: three [nbmax, H] buffers (kf__rnn_slice_buf: buffer i of slice
 * s, in the plan's dtype); a low plan's forward adds xs [nbmax, I], a step's rows of x widened. */
typedef struct kf__rnn_slice {
    int64_t b0, nb;
    float *st, *t1, *t2, *xs;
} kf__rnn_slice;

/* Batch rows [*b0, *b0 + *nb) of slice s. */
static inline void kf__rnn_slice_rows(const kf__rnn_cpu_layout *lo, int32_t s, int64_t *b0,
                                      int64_t *nb) {
    int64_t b1;
    kf__part(lo->B, lo->ns, s, b0, &b1);
    *nb = b1 - *b0;
}

static inline void *kf__rnn_slice_buf(const kf__rnn_cpu_layout *lo, void *ws, int32_t s, int i) {
    return (char *)ws + lo->slice0 + (size_t)s * lo->slice_bytes + (size_t)i * lo->slice_buf;
}

static inline kf__rnn_slice kf__rnn_cpu_slice(const kf__rnn_cpu_layout *lo, void *ws, int32_t s) {
    kf__rnn_slice sl;
    kf__rnn_slice_rows(lo, s, &sl.b0, &sl.nb);
    sl.st = kf__rnn_slice_buf(lo, ws, s, 0);
    sl.t1 = kf__rnn_slice_buf(lo, ws, s, 1);
    sl.t2 = kf__rnn_slice_buf(lo, ws, s, 2);
    sl.xs = lo->low ? kf__rnn_slice_buf(lo, ws, s, 3) : NULL;
    return sl;
}

#endif /* KF_CPU_RNN_CPU_H */

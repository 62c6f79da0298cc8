/* The recurrent layer's backend contract: the plan, the validated call records the front end
 * (capi/src/rnn.c) hands to a backend (cpu/rnn_*.c, cuda/rnn_*.cu), and the op table. Backends
 * trust these records: every pointer and extent has been checked, sizes do not overflow, and
 * workspace/reserve are large enough; they do not check them again.
 *
 * Layout conventions every backend follows:
 *  - x is [T, B, I] or, with batch_first, [B, T, I]; element (t, b, i) sits at
 *    x[(t * x_t_stride + b * x_b_stride) * I + i] where (x_t_stride, x_b_stride) = (B, 1) or
 *    (1, T). y and dy use the same row strides with D*H columns; dx with I.
 *  - h0, hn, dhn, dh0 are [L*D, B, H], index l*D + d.
 *  - Weight pointers come in the canonical order of kfuse.h: cell (l, d) starts at index
 *    (l*D + d) * nw. For GRU nw = 4 (w_ih, w_hh, b_ih, b_hh); for A-GRU nw = 10 (W_z, b_z, U_z,
 *    W_r, b_r, U_r, V_h, b_h, W_h, epsilon).
 *  - Dropout after layer l < L-1 (training, p > 0): element (t, b, j) of that layer's [T, B, D*H]
 *    output is kept iff kf__dropout_keep(seed, offset + ((l*T + t)*B + b)*D*H + j, p), and kept
 *    elements are scaled by 1/(1-p) (common/counter_rng.h). Logical (t, b) order, whatever the
 *    memory layout.
 *  - Variable lengths (packed-sequence semantics of torch): for t >= len[b] the state of sample b
 *    does not change and y(t, b, .) = 0; the reverse direction starts at t = len[b]-1.
 *  - Every tensor of a call but the lengths has the plan's dtype (KF_DTYPE_F32, F64, BF16 or
 *    F16, as the backend's select() accepts): the records carry untyped pointers that the
 *    backend reads as that type. */
#ifndef KF_CORE_RNN_BACKEND_H
#define KF_CORE_RNN_BACKEND_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KF__GRU_NW 4
#define KF__AGRU_NW 10

/* Indices inside one cell's weight group. */
enum { KF__GRU_W_IH = 0, KF__GRU_W_HH = 1, KF__GRU_B_IH = 2, KF__GRU_B_HH = 3 };
enum {
    KF__AGRU_W_Z = 0, KF__AGRU_B_Z = 1, KF__AGRU_U_Z = 2,
    KF__AGRU_W_R = 3, KF__AGRU_B_R = 4, KF__AGRU_U_R = 5,
    KF__AGRU_V_H = 6, KF__AGRU_B_H = 7, KF__AGRU_W_H = 8, KF__AGRU_EPS = 9
};

struct kf__rnn_ops;

struct kf_rnn_plan {
    kf_context *ctx;
    const struct kf__rnn_ops *ops; /* the table the backend's select() chose at creation */
    int32_t cell;          /* kf_rnn_cell */
    int32_t L, D;          /* layers, directions */
    int64_t I, H;
    bool batch_first;
    kf_dtype dtype;        /* of every tensor but the lengths */
    float dropout, gamma;
    int32_t nw;            /* weights per (layer, direction) */
    int32_t num_weights;   /* L * D * nw */
    /* Per-call scratch, so a call never allocates: 2 num_weights pointers each, host memory; the
     * first half is the call record's weight (gradient) list, the second the low-precision
     * layer's list of their float32 copies (core/lowp_ops.c). */
    const void **w;
    void **dw;
    /* Weight names, num_weights NUL-terminated strings packed in one block. */
    const char **names;
};

/* Input width of layer l. */
static inline int64_t kf__rnn_layer_input(const struct kf_rnn_plan *p, int32_t l) {
    return l == 0 ? p->I : (int64_t)p->D * p->H;
}

/* Rank and shape of weight j of layer l (any direction); shape has room for 2 entries. */
static inline int32_t kf__rnn_weight_shape(const struct kf_rnn_plan *p, int32_t l, int32_t j,
                                           int64_t *shape) {
    const int64_t in = kf__rnn_layer_input(p, l), H = p->H;
    if (p->cell == KF_RNN_GRU) {
        shape[0] = 3 * H;
        shape[1] = j == KF__GRU_W_IH ? in : H;
        return j <= KF__GRU_W_HH ? 2 : 1;
    }
    switch (j) {
    case KF__AGRU_W_Z: case KF__AGRU_W_R: case KF__AGRU_V_H:
        shape[0] = H; shape[1] = in; return 2;
    case KF__AGRU_U_Z: case KF__AGRU_U_R: case KF__AGRU_W_H:
        shape[0] = H; shape[1] = H; return 2;
    case KF__AGRU_EPS:
        shape[0] = 1; return 1;
    default:
        shape[0] = H; return 1;
    }
}

/* Elements of weight k of the plan's flat canonical order (k = (l*D + d)*nw + j). */
static inline int64_t kf__rnn_weight_elems(const struct kf_rnn_plan *p, int32_t k) {
    int64_t s[2];
    const int32_t nd = kf__rnn_weight_shape(p, k / p->nw / p->D, k % p->nw, s);
    return nd == 2 ? s[0] * s[1] : s[0];
}

typedef struct kf__rnn_fwd {
    const struct kf_rnn_plan *plan;
    int64_t T, B;
    bool training;
    const void *x;
    const void *h0;           /* NULL = zeros */
    const void *const *w;     /* plan->num_weights pointers */
    const int32_t *lengths;   /* NULL = all T */
    uint64_t seed, offset;
    void *y;
    void *hn;                 /* NULL = not wanted */
    void *ws; size_t ws_bytes;
    void *reserve; size_t reserve_bytes; /* training only */
} kf__rnn_fwd;

typedef struct kf__rnn_bwd {
    const struct kf_rnn_plan *plan;
    int64_t T, B;
    const void *x;
    const void *h0;           /* NULL = zeros */
    const void *const *w;
    const int32_t *lengths;   /* NULL = all T */
    uint64_t seed, offset;
    const void *dy;           /* NULL = zeros */
    const void *dhn;          /* NULL = zeros */
    void *dx;                 /* NULL = not wanted */
    void *dh0;                /* NULL = not wanted */
    void *const *dw;          /* plan->num_weights pointers, each may be NULL; or the array NULL */
    bool accumulate;          /* add into dw instead of overwriting */
    void *ws; size_t ws_bytes;
    const void *reserve; size_t reserve_bytes;
} kf__rnn_bwd;

/* The op table a backend provides (rules in core/backend.h). */
typedef struct kf__rnn_ops {
    kf_status (*select)(const struct kf_rnn_plan *p, const char *fn,
                        const struct kf__rnn_ops **ops);
    void (*sizes)(const struct kf_rnn_plan *p, int64_t T, int64_t B, bool training,
                  size_t *ws_bytes, size_t *reserve_bytes);
    kf_status (*forward)(kf_context *ctx, const kf__rnn_fwd *c);
    kf_status (*backward)(kf_context *ctx, const kf__rnn_bwd *c);
} kf__rnn_ops;

#ifdef __cplusplus
}
#endif

#endif /* KF_CORE_RNN_BACKEND_H */

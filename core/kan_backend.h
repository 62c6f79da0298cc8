/* The KAN layers' backend contract: the plan, the validated call records the front ends
 * (capi/src/kan_linear.c, capi/src/kan_conv2d.c) hand to a backend (cpu/kan_linear.c,
 * cuda/kan_linear.cu), and the op table. Backends trust these records: every pointer and extent
 * has been checked, a patch geometry agrees with N and the plan, the grid rows are finite and
 * non-decreasing (CPU contexts), and the workspace is large enough.
 *
 * Notation (kfuse.h, docs/ops/kan.md): N rows, in, out, G grid intervals, k spline order,
 * C = G + k bases per feature, nk = G + 2k + 1 knots per feature, cw = C + 1 columns per feature
 * in the combined operand, K = in * cw. Tensors are row-major: x [N, in], y and dy [N, out],
 * grid [in, nk], base_weight and spline_scaler [out, in], spline_weight [out, in, C].
 * The combined operand of a row holds, per feature i, the cw columns
 *     [ SiLU(x_i) | B_0(x_i) .. B_{C-1}(x_i) ]       (columns i*cw .. i*cw + C)
 * and the combined weight W [out, K] the matching [ base_weight[o, i] | spline_weight[o, i, :] *
 * spline_scaler[o, i] ], so that y = A W^T is one product over K.
 *
 * Every tensor of a call has the plan's dtype (KF_DTYPE_F32, F64, BF16 or F16, as the backend's
 * select() accepts): the records carry untyped pointers that the backend reads as that
 * type. */
#ifndef KF_CORE_KAN_BACKEND_H
#define KF_CORE_KAN_BACKEND_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

struct kf__kan_ops;

struct kf_kan_linear_plan {
    kf_context *ctx;
    const struct kf__kan_ops *ops; /* the table the backend's select() chose at creation */
    int64_t in, out;
    int32_t G, k;
    int64_t C;   /* G + k */
    int64_t nk;  /* G + 2k + 1 */
    int64_t cw;  /* C + 1 */
    int64_t K;   /* in * cw */
    bool scaled; /* standalone_scale: spline_scaler multiplies spline_weight */
    kf_dtype dtype; /* of every parameter, input and output */
};

/* KANConv2d's patches as the rows of the product (capi/src/kan_conv2d.c; kfuse.h): row
 * n = (b Ho + oh) Wo + ow is the patch of image b at output pixel (oh, ow); feature
 * f = (c kh + i) kw + j of it is x[b, c, oh sh - ph + i dh, ow sw - pw + j dw], 0 outside the
 * image. x is [B, Cin, H, W]; y and dy are [B, out, Ho, Wo] (channel-major per image, not
 * [N, out]); dx is x's shape, every element the sum over the patches that read it. */
typedef struct kf__kan_patches {
    int64_t B, Cin, H, W, Ho, Wo;
    int32_t kh, kw, sh, sw, ph, pw, dh, dw;
} kf__kan_patches;

typedef struct kf__kan_fwd {
    const struct kf_kan_linear_plan *plan;
    int64_t N;
    const kf__kan_patches *patches; /* NULL: the rows are x's rows [N, in] and y is [N, out]
                                       (KANLinear); else KANConv2d's patches */
    const void *x, *grid, *base, *spline; /* base NULL: no base term */
    const void *scaler; /* NULL: the plan has none (standalone_scale = 0) */
    void *y;
    /* KANLinear only (patches NULL); both at their defaults take the m = 0 paths: */
    const void *w;  /* NULL, or the per-element input weight [N, in] */
    int32_t order;  /* the derivative order m, 0 .. k + 1 (checked) */
    void *ws; size_t ws_bytes;
} kf__kan_fwd;

typedef struct kf__kan_bwd {
    const struct kf_kan_linear_plan *plan;
    int64_t N;
    const kf__kan_patches *patches;     /* as in kf__kan_fwd */
    const void *x, *grid, *base, *spline; /* base NULL: no base term (dbase then NULL) */
    const void *scaler;                 /* NULL: the plan has none */
    const void *dy;
    void *dx, *dbase, *dspline, *dscaler; /* each NULL = not wanted (dscaler: always NULL when
                                             the plan has no scaler) */
    bool accumulate;                    /* add into the parameter gradients instead of
                                           overwriting (dx: always overwritten) */
    /* KANLinear only (patches NULL); at their defaults (NULL, NULL, 0) the m = 0 paths run: */
    const void *w;                      /* NULL, or the forward's input weight [N, in] */
    void *dw;                           /* NULL, or G_m [N, in] (always overwritten) */
    int32_t order;                      /* m: 0 .. k + 1, and m + 1 <= k + 1 with dx */
    void *ws; size_t ws_bytes;
} kf__kan_bwd;

/* The op table a backend provides (rules in core/backend.h). */
typedef struct kf__kan_ops {
    kf_status (*select)(const struct kf_kan_linear_plan *p, const char *fn,
                        const struct kf__kan_ops **ops);
    size_t (*workspace)(const struct kf_kan_linear_plan *p, int64_t N,
                        const kf__kan_patches *patches);
    kf_status (*forward)(kf_context *ctx, const kf__kan_fwd *c);
    kf_status (*backward)(kf_context *ctx, const kf__kan_bwd *c);
} kf__kan_ops;

#ifdef __cplusplus
}
#endif

#endif /* KF_CORE_KAN_BACKEND_H */

/* The 1.3 shape queries: output shapes of the recurrent layer and of KANConv2d, the parameter
 * lists of SKLinear, KANLinear and KANConv2d, and KF_ALIGN_BYTES. Every expectation is written
 * here from the references' documentation, not from the library's own helpers:
 *  - torch.nn.GRU: output (L, N, D*H_out), or (N, L, D*H_out) with batch_first; h_n
 *    (D*num_layers, N, H_out);
 *  - torch.nn.Conv2d: H_out = floor((H_in + 2 padding - dilation (kernel_size - 1) - 1) / stride
 *    + 1), the same for W;
 *  - Panther's SKLinear: S1s [L, in, k], S2s [L, k, out], buffers U1s [L, k, out],
 *    U2s [L, in, k], bias [out];
 *  - efficient-kan's KANLinear: grid [in, G + 2k + 1], base_weight [out, in],
 *    spline_weight [out, in, G + k], spline_scaler [out, in]. */
#include "kf_test.h"

#include <string.h>

typedef struct expect_param {
    const char *name;
    int32_t ndim;
    int64_t shape[3];
} expect_param;

/* Entry i of a layer's list through `info` equals want[i], for every i < n. */
#define CHECK_PARAMS(info, plan, want, n)                                                     \
    do {                                                                                      \
        for (int32_t i_ = 0; i_ < (n); ++i_) {                                                \
            const char *name_ = NULL;                                                         \
            int32_t nd_ = -1;                                                                 \
            int64_t sh_[KF_MAX_DIMS] = {0};                                                   \
            KF_OK_(info((plan), i_, &name_, &nd_, sh_));                                      \
            cr_expect_str_eq(name_, (want)[i_].name, "entry %d", (int)i_);                    \
            cr_expect_eq(nd_, (want)[i_].ndim, "%s: ndim %d", name_, (int)nd_);               \
            for (int32_t d_ = 0; d_ < nd_ && d_ < 3; ++d_)                                    \
                cr_expect_eq(sh_[d_], (want)[i_].shape[d_], "%s: shape[%d] = %lld", name_,    \
                             (int)d_, (long long)sh_[d_]);                                    \
        }                                                                                     \
    } while (0)

Test(shapes, align_bytes_is_the_documented_granule) {
    cr_expect_eq(KF_ALIGN_BYTES, 64);
    cr_expect_geq(KF_VERSION_MINOR, 3); /* KF_ALIGN_BYTES is there since 1.3 */
    cr_expect_eq(kf_version(), KF_VERSION_NUMBER);
}

Test(shapes, rnn_output_shapes_follow_torch_gru) {
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    const struct { int32_t cell, layers; uint32_t flags; int64_t I, H; } cases[] = {
        {KF_RNN_GRU, 1, 0, 5, 7},
        {KF_RNN_GRU, 2, KF_RNN_BIDIRECTIONAL | KF_RNN_BATCH_FIRST, 3, 4},
        {KF_RNN_AGRU, 3, KF_RNN_BATCH_FIRST, 2, 6},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
        kf_rnn_desc d;
        kf_rnn_desc_init(&d);
        d.cell = cases[c].cell;
        d.num_layers = cases[c].layers;
        d.flags = cases[c].flags;
        d.input_size = cases[c].I;
        d.hidden_size = cases[c].H;
        kf_rnn_plan *p = NULL;
        KF_OK_(kf_rnn_plan_create(ctx, &d, &p));
        const int64_t T = 9, B = 4, D = (d.flags & KF_RNN_BIDIRECTIONAL) ? 2 : 1;
        const int bf = (d.flags & KF_RNN_BATCH_FIRST) != 0;
        int64_t y[3] = {0}, hn[3] = {0};
        KF_OK_(kf_rnn_output_shapes(p, T, B, y, hn));
        cr_expect_eq(y[0], bf ? B : T);
        cr_expect_eq(y[1], bf ? T : B);
        cr_expect_eq(y[2], D * d.hidden_size);
        cr_expect_eq(hn[0], D * d.num_layers);
        cr_expect_eq(hn[1], B);
        cr_expect_eq(hn[2], d.hidden_size);
        KF_OK_(kf_rnn_output_shapes(p, T, B, NULL, NULL));
        EXPECT_FAIL(kf_rnn_output_shapes(p, 0, B, y, hn), KF_ERR_INVALID_ARGUMENT, "T = 0");
        EXPECT_FAIL(kf_rnn_output_shapes(p, T, -1, y, hn), KF_ERR_INVALID_ARGUMENT, "B = -1");
        kf_rnn_plan_destroy(p);
    }
    EXPECT_FAIL(kf_rnn_output_shapes(NULL, 1, 1, NULL, NULL), KF_ERR_INVALID_ARGUMENT, "plan");
    kf_context_destroy(ctx);
}

/* torch.nn.Conv2d's formula, in the test's own words. */
static int64_t conv_out(int64_t n, int64_t k, int64_t s, int64_t p, int64_t d) {
    const int64_t num = n + 2 * p - d * (k - 1) - 1;
    return num < 0 ? 0 : num / s + 1;
}

Test(shapes, kan_conv2d_output_size_follows_torch_conv2d) {
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    for (int32_t k = 1; k <= 4; ++k)
        for (int32_t s = 1; s <= 3; ++s)
            for (int32_t pad = 0; pad <= 2; ++pad)
                for (int32_t dil = 1; dil <= 2; ++dil) {
                    kf_kan_conv2d_desc d;
                    kf_kan_conv2d_desc_init(&d);
                    d.in_channels = 2, d.out_channels = 3;
                    d.kernel_h = k, d.kernel_w = k + 1;
                    d.stride_h = s, d.stride_w = 4 - s;
                    d.pad_h = pad, d.pad_w = 2 - pad;
                    d.dilation_h = dil, d.dilation_w = 3 - dil;
                    kf_kan_conv2d_plan *p = NULL;
                    KF_OK_(kf_kan_conv2d_plan_create(ctx, &d, &p));
                    for (int64_t h = 1; h <= 12; h += 5) {
                        const int64_t w = 13 - h;
                        const int64_t ho = conv_out(h, d.kernel_h, d.stride_h, d.pad_h,
                                                    d.dilation_h),
                                      wo = conv_out(w, d.kernel_w, d.stride_w, d.pad_w,
                                                    d.dilation_w);
                        int64_t gh = -1, gw = -1;
                        kf_status st = kf_kan_conv2d_output_size(p, h, w, &gh, &gw);
                        if (ho >= 1 && wo >= 1) {
                            cr_expect_eq(st, KF_OK, "%s", kf_last_error_message());
                            cr_expect_eq(gh, ho, "h=%lld k=%d s=%d p=%d d=%d", (long long)h, k,
                                         s, pad, dil);
                            cr_expect_eq(gw, wo, "w=%lld", (long long)w);
                        } else {
                            cr_expect_eq(st, KF_ERR_INVALID_ARGUMENT, "empty output accepted");
                        }
                    }
                    kf_kan_conv2d_plan_destroy(p);
                }
    kf_kan_conv2d_desc d;
    kf_kan_conv2d_desc_init(&d);
    d.in_channels = 1, d.out_channels = 1, d.kernel_h = 3, d.kernel_w = 3;
    kf_kan_conv2d_plan *p = NULL;
    KF_OK_(kf_kan_conv2d_plan_create(ctx, &d, &p));
    KF_OK_(kf_kan_conv2d_output_size(p, 5, 5, NULL, NULL));
    EXPECT_FAIL(kf_kan_conv2d_output_size(p, 0, 5, NULL, NULL), KF_ERR_INVALID_ARGUMENT,
                "height = 0");
    EXPECT_FAIL(kf_kan_conv2d_output_size(p, 5, 2, NULL, NULL), KF_ERR_INVALID_ARGUMENT,
                "width = 2");
    EXPECT_FAIL(kf_kan_conv2d_output_size(NULL, 5, 5, NULL, NULL), KF_ERR_INVALID_ARGUMENT,
                "plan");
    kf_kan_conv2d_plan_destroy(p);
    kf_context_destroy(ctx);
}

Test(shapes, sklinear_params_follow_panther) {
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    for (int32_t bias = 0; bias <= 1; ++bias) {
        kf_sklinear_desc d;
        kf_sklinear_desc_init(&d);
        d.in_features = 11, d.out_features = 6, d.num_terms = 2, d.low_rank = 3, d.bias = bias;
        kf_sklinear_plan *p = NULL;
        KF_OK_(kf_sklinear_plan_create(ctx, &d, &p));
        const expect_param want[] = {{"S1s", 3, {2, 11, 3}}, {"S2s", 3, {2, 3, 6}},
                                     {"U1s", 3, {2, 3, 6}},  {"U2s", 3, {2, 11, 3}},
                                     {"bias", 1, {6, 0, 0}}};
        int32_t n = -1;
        KF_OK_(kf_sklinear_param_count(p, &n));
        cr_expect_eq(n, 4 + bias);
        CHECK_PARAMS(kf_sklinear_param_info, p, want, n);
        KF_OK_(kf_sklinear_param_info(p, 0, NULL, NULL, NULL));
        EXPECT_FAIL(kf_sklinear_param_info(p, n, NULL, NULL, NULL), KF_ERR_INVALID_ARGUMENT,
                    "index");
        EXPECT_FAIL(kf_sklinear_param_info(p, -1, NULL, NULL, NULL), KF_ERR_INVALID_ARGUMENT,
                    "index = -1");
        EXPECT_FAIL(kf_sklinear_param_count(p, NULL), KF_ERR_INVALID_ARGUMENT, "count");
        kf_sklinear_plan_destroy(p);
    }
    EXPECT_FAIL(kf_sklinear_param_count(NULL, NULL), KF_ERR_INVALID_ARGUMENT, "plan");
    EXPECT_FAIL(kf_sklinear_param_info(NULL, 0, NULL, NULL, NULL), KF_ERR_INVALID_ARGUMENT,
                "plan");
    kf_context_destroy(ctx);
}

Test(shapes, kan_params_follow_efficient_kan) {
    kf_context *ctx = make_ctx(KF_DEVICE_CPU, 1);
    for (int32_t scaled = 0; scaled <= 1; ++scaled) {
        const int64_t G = 4, k = 2, in = 5, out = 3;
        kf_kan_linear_desc d;
        kf_kan_linear_desc_init(&d);
        d.in_features = in, d.out_features = out, d.grid_size = (int32_t)G;
        d.spline_order = (int32_t)k, d.standalone_scale = scaled;
        kf_kan_linear_plan *p = NULL;
        KF_OK_(kf_kan_linear_plan_create(ctx, &d, &p));
        const expect_param want[] = {{"grid", 2, {in, G + 2 * k + 1, 0}},
                                     {"base_weight", 2, {out, in, 0}},
                                     {"spline_weight", 3, {out, in, G + k}},
                                     {"spline_scaler", 2, {out, in, 0}}};
        int32_t n = -1;
        KF_OK_(kf_kan_linear_param_count(p, &n));
        cr_expect_eq(n, 3 + scaled);
        CHECK_PARAMS(kf_kan_linear_param_info, p, want, n);
        EXPECT_FAIL(kf_kan_linear_param_info(p, n, NULL, NULL, NULL), KF_ERR_INVALID_ARGUMENT,
                    "index");
        kf_kan_linear_plan_destroy(p);

        /* KANConv2d: the per-patch layer over in = C_in kh kw features. */
        kf_kan_conv2d_desc c;
        kf_kan_conv2d_desc_init(&c);
        c.in_channels = 2, c.out_channels = out, c.kernel_h = 3, c.kernel_w = 2;
        c.grid_size = (int32_t)G, c.spline_order = (int32_t)k, c.standalone_scale = scaled;
        kf_kan_conv2d_plan *q = NULL;
        KF_OK_(kf_kan_conv2d_plan_create(ctx, &c, &q));
        const int64_t f = 2 * 3 * 2;
        const expect_param wantc[] = {{"grid", 2, {f, G + 2 * k + 1, 0}},
                                      {"base_weight", 2, {out, f, 0}},
                                      {"spline_weight", 3, {out, f, G + k}},
                                      {"spline_scaler", 2, {out, f, 0}}};
        KF_OK_(kf_kan_conv2d_param_count(q, &n));
        cr_expect_eq(n, 3 + scaled);
        CHECK_PARAMS(kf_kan_conv2d_param_info, q, wantc, n);
        EXPECT_FAIL(kf_kan_conv2d_param_info(q, 7, NULL, NULL, NULL), KF_ERR_INVALID_ARGUMENT,
                    "index = 7");
        kf_kan_conv2d_plan_destroy(q);
    }
    EXPECT_FAIL(kf_kan_linear_param_count(NULL, NULL), KF_ERR_INVALID_ARGUMENT, "plan");
    EXPECT_FAIL(kf_kan_conv2d_param_count(NULL, NULL), KF_ERR_INVALID_ARGUMENT, "plan");
    EXPECT_FAIL(kf_kan_conv2d_param_info(NULL, 0, NULL, NULL, NULL), KF_ERR_INVALID_ARGUMENT,
                "plan");
    kf_context_destroy(ctx);
}

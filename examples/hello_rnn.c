/* hello_rnn.c: the smallest complete kfuse program. One forward pass of a 1-layer A-GRU
 * (T=28 steps, batch 4, input 28, hidden 128) on random data, on the CPU; prints ||y||.
 * Build: cc -std=c11 hello_rnn.c -lkfuse -lm */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kfuse.h"

#define CHECK(call)                                                                      \
    do {                                                                                 \
        kf_status s_ = (call);                                                           \
        if (s_ != KF_OK) {                                                               \
            fprintf(stderr, "%s failed: %s\n  %s\n", #call, kf_status_string(s_),        \
                    kf_last_error_message());                                            \
            return 1;                                                                    \
        }                                                                                \
    } while (0)

static float uniform(float bound) { return bound * (2.0f * (float)rand() / (float)RAND_MAX - 1.0f); }

int main(void) {
    enum { T = 28, B = 4, I = 28, H = 128, MAXW = 16 };
    kf_context_desc cdesc;
    kf_context_desc_init(&cdesc); /* defaults: CPU, all cores, arena grown on demand */
    kf_context *ctx = NULL;
    CHECK(kf_context_create(&cdesc, &ctx));

    kf_rnn_desc desc;
    kf_rnn_desc_init(&desc);
    desc.cell = KF_RNN_AGRU;
    desc.input_size = I;
    desc.hidden_size = H;
    kf_rnn_plan *plan = NULL;
    CHECK(kf_rnn_plan_create(ctx, &desc, &plan));

    /* The weights, in the canonical order the plan reports (reference state_dict names). */
    int32_t nw = 0;
    CHECK(kf_rnn_weight_count(plan, &nw)); /* 10 for a 1-layer A-GRU */
    if (nw > MAXW) return 1;
    kf_tensor w[MAXW];
    for (int32_t k = 0; k < nw; ++k) {
        const char *name;
        int32_t ndim;
        int64_t shape[KF_MAX_DIMS], n = 1;
        CHECK(kf_rnn_weight_info(plan, k, &name, &ndim, shape));
        for (int32_t d = 0; d < ndim; ++d) n *= shape[d];
        float *p = malloc(sizeof(float) * (size_t)n);
        for (int64_t i = 0; i < n; ++i) p[i] = uniform(1.0f / sqrtf((float)H));
        if (n == 1) p[0] = 1.0f; /* cells.0.epsilon */
        CHECK(kf_tensor_init(&w[k], p, KF_DTYPE_F32, ndim, shape));
        if (ndim == 2) printf("weight %2d  %-20s [%lld, %lld]\n", k, name, (long long)shape[0], (long long)shape[1]);
        else printf("weight %2d  %-20s [%lld]\n", k, name, (long long)shape[0]);
    }

    static float x[T * B * I], y[T * B * H];
    for (int i = 0; i < T * B * I; ++i) x[i] = uniform(1.0f);
    kf_rnn_forward_args args;
    kf_rnn_forward_args_init(&args); /* h0 absent = zeros, hn not requested */
    const int64_t xs[3] = {T, B, I}, ys[3] = {T, B, H};
    CHECK(kf_tensor_init(&args.x, x, KF_DTYPE_F32, 3, xs));
    CHECK(kf_tensor_init(&args.y, y, KF_DTYPE_F32, 3, ys));
    args.weights = w;
    args.num_weights = nw;
    /* No workspace given: the context's arena serves. Inference needs no reserve. */
    CHECK(kf_rnn_forward(plan, KF_MODE_INFERENCE, &args, NULL, 0, NULL, 0));

    double s = 0.0;
    for (int i = 0; i < T * B * H; ++i) s += (double)y[i] * y[i];
    printf("kfuse %s: A-GRU forward, y [%d, %d, %d], ||y|| = %.6f\n", kf_version_string(), T, B, H, sqrt(s));

    for (int32_t k = 0; k < nw; ++k) free(w[k].data);
    kf_rnn_plan_destroy(plan);
    kf_context_destroy(ctx);
    return 0;
}

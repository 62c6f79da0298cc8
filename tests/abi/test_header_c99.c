/* kfuse.h is valid C99: this file is compiled with -std=c99 -pedantic -Wall -Wextra -Werror,
 * includes the header first (it must be self-contained) and twice (include guard), links a few
 * trivial calls, and pins the 1.0 struct layouts on LP64 targets (fields are only ever appended,
 * so these offsets never change within KF_ABI_VERSION 1). Exit status 0 = pass. */
#include "kfuse.h"
#include "kfuse.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#if defined(__CUDA_RUNTIME_H__) || defined(__DRIVER_TYPES_H__) || defined(CUDART_VERSION)
#error "kfuse.h must not include CUDA headers"
#endif

/* C99 has no _Static_assert: a negative array size fails the build instead. */
#define KF_TEST_STATIC_ASSERT(name, cond) typedef char kf_test_assert_##name[(cond) ? 1 : -1]

KF_TEST_STATIC_ASSERT(status_values, KF_OK == 0 && KF_ERR_INVALID_ARGUMENT == 1 &&
                      KF_ERR_UNSUPPORTED == 2 && KF_ERR_OUT_OF_MEMORY == 3 &&
                      KF_ERR_WORKSPACE_TOO_SMALL == 4 && KF_ERR_BACKEND_UNAVAILABLE == 5 &&
                      KF_ERR_DEVICE == 6 && KF_ERR_INTERNAL == 7);
KF_TEST_STATIC_ASSERT(dtype_values, KF_DTYPE_F32 == 1 && KF_DTYPE_F64 == 2 && KF_DTYPE_F16 == 3 &&
                      KF_DTYPE_BF16 == 4 && KF_DTYPE_I32 == 5 && KF_DTYPE_I64 == 6);
KF_TEST_STATIC_ASSERT(misc_values, KF_DEVICE_CPU == 1 && KF_DEVICE_CUDA == 2 &&
                      KF_MODE_INFERENCE == 1 && KF_MODE_TRAINING == 2 &&
                      KF_GRAD_OVERWRITE == 1 && KF_GRAD_ACCUMULATE == 2 && KF_RNN_GRU == 1 &&
                      KF_RNN_AGRU == 2 && KF_RNN_BATCH_FIRST == 1u &&
                      KF_RNN_BIDIRECTIONAL == 2u && KF_CONTEXT_FIXED_ARENA == 1u &&
                      KF_MAX_DIMS == 6);
KF_TEST_STATIC_ASSERT(version, KF_ABI_VERSION == KF_VERSION_MAJOR &&
                      KF_VERSION_NUMBER == KF_VERSION_MAJOR * 10000 + KF_VERSION_MINOR * 100 +
                      KF_VERSION_PATCH);
KF_TEST_STATIC_ASSERT(struct_size_first, offsetof(kf_context_desc, struct_size) == 0 &&
                      offsetof(kf_rnn_desc, struct_size) == 0 &&
                      offsetof(kf_rnn_forward_args, struct_size) == 0 &&
                      offsetof(kf_rnn_backward_args, struct_size) == 0);

#if defined(__LP64__) || defined(_LP64)
KF_TEST_STATIC_ASSERT(tensor_layout, sizeof(kf_tensor) == 112 && offsetof(kf_tensor, dtype) == 8 &&
                      offsetof(kf_tensor, ndim) == 12 && offsetof(kf_tensor, shape) == 16 &&
                      offsetof(kf_tensor, strides) == 64);
KF_TEST_STATIC_ASSERT(context_desc_layout, sizeof(kf_context_desc) == 32 &&
                      offsetof(kf_context_desc, device_type) == 8 &&
                      offsetof(kf_context_desc, device_index) == 12 &&
                      offsetof(kf_context_desc, num_threads) == 16 &&
                      offsetof(kf_context_desc, flags) == 20 &&
                      offsetof(kf_context_desc, arena_bytes) == 24);
KF_TEST_STATIC_ASSERT(rnn_desc_layout, sizeof(kf_rnn_desc) == 48 &&
                      offsetof(kf_rnn_desc, cell) == 8 && offsetof(kf_rnn_desc, num_layers) == 12 &&
                      offsetof(kf_rnn_desc, input_size) == 16 &&
                      offsetof(kf_rnn_desc, hidden_size) == 24 &&
                      offsetof(kf_rnn_desc, flags) == 32 && offsetof(kf_rnn_desc, dropout) == 36 &&
                      offsetof(kf_rnn_desc, gamma) == 40 && offsetof(kf_rnn_desc, dtype) == 44);
KF_TEST_STATIC_ASSERT(forward_args_layout, sizeof(kf_rnn_forward_args) == 600 &&
                      offsetof(kf_rnn_forward_args, x) == 8 &&
                      offsetof(kf_rnn_forward_args, h0) == 120 &&
                      offsetof(kf_rnn_forward_args, weights) == 232 &&
                      offsetof(kf_rnn_forward_args, num_weights) == 240 &&
                      offsetof(kf_rnn_forward_args, reserved0) == 244 &&
                      offsetof(kf_rnn_forward_args, lengths) == 248 &&
                      offsetof(kf_rnn_forward_args, dropout_seed) == 360 &&
                      offsetof(kf_rnn_forward_args, dropout_offset) == 368 &&
                      offsetof(kf_rnn_forward_args, y) == 376 &&
                      offsetof(kf_rnn_forward_args, hn) == 488);
KF_TEST_STATIC_ASSERT(backward_args_layout, sizeof(kf_rnn_backward_args) == 840 &&
                      offsetof(kf_rnn_backward_args, x) == 8 &&
                      offsetof(kf_rnn_backward_args, h0) == 120 &&
                      offsetof(kf_rnn_backward_args, weights) == 232 &&
                      offsetof(kf_rnn_backward_args, num_weights) == 240 &&
                      offsetof(kf_rnn_backward_args, reserved0) == 244 &&
                      offsetof(kf_rnn_backward_args, lengths) == 248 &&
                      offsetof(kf_rnn_backward_args, dropout_seed) == 360 &&
                      offsetof(kf_rnn_backward_args, dropout_offset) == 368 &&
                      offsetof(kf_rnn_backward_args, dy) == 376 &&
                      offsetof(kf_rnn_backward_args, dhn) == 488 &&
                      offsetof(kf_rnn_backward_args, dx) == 600 &&
                      offsetof(kf_rnn_backward_args, dh0) == 712 &&
                      offsetof(kf_rnn_backward_args, dweights) == 824 &&
                      offsetof(kf_rnn_backward_args, num_dweights) == 832 &&
                      offsetof(kf_rnn_backward_args, reserved1) == 836);
#endif

int main(void) {
    int failures = 0;
    kf_context_desc cd;
    kf_context *ctx = NULL;
    kf_status s;

    if (kf_version() != KF_VERSION_NUMBER) {
        fprintf(stderr, "kf_version() = %u, header %d\n", (unsigned)kf_version(), KF_VERSION_NUMBER);
        ++failures;
    }
    if (kf_version_string() == NULL || kf_status_string(KF_OK) == NULL ||
        kf_last_error_message() == NULL) {
        fprintf(stderr, "NULL string\n");
        ++failures;
    }
    kf_context_desc_init(&cd);
    s = kf_context_create(&cd, &ctx);
    if (s != KF_OK || ctx == NULL) {
        fprintf(stderr, "kf_context_create: %s (%s)\n", kf_status_string(s),
                kf_last_error_message());
        ++failures;
    }
    kf_context_destroy(ctx);
    if (failures == 0) printf("kfuse.h compiles as C99 (pedantic) and links; kfuse %s\n",
                              kf_version_string());
    return failures == 0 ? 0 : 1;
}

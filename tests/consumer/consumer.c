/* Links an installed kfuse, checks the header and the library agree on the version, and runs one
 * GRU step on the CPU. Exits non-zero on any failure. */
#include <kfuse.h>

#include <stdio.h>

int main(void) {
    if (kf_version() != KF_VERSION_NUMBER) {
        fprintf(stderr, "header %d, library %u\n", KF_VERSION_NUMBER, kf_version());
        return 1;
    }
    kf_context_desc cd;
    kf_context_desc_init(&cd);
    kf_context *ctx = NULL;
    kf_rnn_desc rd;
    kf_rnn_desc_init(&rd);
    rd.input_size = 2;
    rd.hidden_size = 3;
    kf_rnn_plan *plan = NULL;
    float x[2] = {0.5f, -1.0f}, y[3] = {0}, w_ih[18], w_hh[27], b[9];
    for (int i = 0; i < 27; ++i) w_hh[i] = 0.01f * (float)(i % 7) - 0.03f;
    for (int i = 0; i < 18; ++i) w_ih[i] = 0.02f * (float)(i % 5) - 0.04f;
    for (int i = 0; i < 9; ++i) b[i] = 0.1f;
    kf_tensor w[4];
    int64_t s_ih[2] = {9, 2}, s_hh[2] = {9, 3}, s_b[1] = {9}, s_x[3] = {1, 1, 2}, s_y[3] = {1, 1, 3};
    kf_rnn_forward_args a;
    kf_rnn_forward_args_init(&a);
    kf_status s = kf_context_create(&cd, &ctx);
    if (s == KF_OK) s = kf_rnn_plan_create(ctx, &rd, &plan);
    if (s == KF_OK) s = kf_tensor_init(&w[0], w_ih, KF_DTYPE_F32, 2, s_ih);
    if (s == KF_OK) s = kf_tensor_init(&w[1], w_hh, KF_DTYPE_F32, 2, s_hh);
    if (s == KF_OK) s = kf_tensor_init(&w[2], b, KF_DTYPE_F32, 1, s_b);
    if (s == KF_OK) s = kf_tensor_init(&w[3], b, KF_DTYPE_F32, 1, s_b);
    if (s == KF_OK) s = kf_tensor_init(&a.x, x, KF_DTYPE_F32, 3, s_x);
    if (s == KF_OK) s = kf_tensor_init(&a.y, y, KF_DTYPE_F32, 3, s_y);
    a.weights = w;
    a.num_weights = 4;
    if (s == KF_OK) s = kf_rnn_forward(plan, KF_MODE_INFERENCE, &a, NULL, 0, NULL, 0);
    if (s != KF_OK) {
        fprintf(stderr, "%s: %s\n", kf_status_string(s), kf_last_error_message());
        return 1;
    }
    printf("kfuse %s consumer: y = [%f, %f, %f]\n", kf_version_string(), y[0], y[1], y[2]);
    kf_rnn_plan_destroy(plan);
    kf_context_destroy(ctx);
    return (y[0] == y[0] && y[0] != 0.0f) ? 0 : 1;
}

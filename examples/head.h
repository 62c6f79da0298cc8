/* head.h: the classifier head (linear H -> C, softmax cross-entropy) and the Adam optimiser of
 * the Fashion-MNIST example. Plain host code on float arrays; no allocation in the per-batch
 * calls. */
#ifndef KF_EXAMPLES_HEAD_H
#define KF_EXAMPLES_HEAD_H

#include <stddef.h>
#include <stdint.h>

/* logits = h W^T + b with W [C, H], b [C]; loss = mean over the batch of -log softmax(logits)[y].
 * Writes the mean loss to *loss and the gradients of that mean loss: dW [C, H] and db [C]
 * (overwritten) and dh [B, H] (overwritten). `scratch` holds C floats. Returns the number of
 * samples whose arg-max logit equals the label. */
int64_t head_forward_backward(const float *W, const float *b, const float *h, const uint8_t *labels,
                              int64_t B, int64_t H, int64_t C, float *dW, float *db, float *dh,
                              float *scratch, double *loss);

/* Counts the samples whose arg-max logit equals the label (no gradients). */
int64_t head_count_correct(const float *W, const float *b, const float *h, const uint8_t *labels,
                           int64_t B, int64_t H, int64_t C);

/* Adam (Kingma & Ba, as torch.optim.Adam without weight decay or amsgrad). */
typedef struct adam_state {
    size_t n;       /* parameters */
    float *m, *v;   /* first and second moments, n each (caller-provided, zero-initialised) */
    int64_t step;   /* updates taken */
    float lr, beta1, beta2, eps;
} adam_state;

/* Sets the torch defaults (betas 0.9, 0.999, eps 1e-8), zeroes m and v and the step count. */
void adam_init(adam_state *s, size_t n, float *m, float *v, float lr);

/* One update of params[0..n) from grads[0..n). */
void adam_step(adam_state *s, float *params, const float *grads);

#endif

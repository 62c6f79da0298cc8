/* head.c: linear + softmax cross-entropy head and Adam for the Fashion-MNIST example. */
#include "head.h"

#include <math.h>
#include <string.h>

static void logits_row(const float *W, const float *b, const float *hb, int64_t H, int64_t C,
                       float *z) {
    for (int64_t c = 0; c < C; ++c) {
        const float *w = W + c * H;
        float acc = b[c];
        for (int64_t k = 0; k < H; ++k) acc += w[k] * hb[k];
        z[c] = acc;
    }
}

static int64_t argmax(const float *z, int64_t C) {
    int64_t best = 0;
    for (int64_t c = 1; c < C; ++c)
        if (z[c] > z[best]) best = c;
    return best;
}

int64_t head_forward_backward(const float *W, const float *b, const float *h, const uint8_t *labels,
                              int64_t B, int64_t H, int64_t C, float *dW, float *db, float *dh,
                              float *scratch, double *loss) {
    memset(dW, 0, sizeof(float) * (size_t)(C * H));
    memset(db, 0, sizeof(float) * (size_t)C);
    double total = 0.0;
    int64_t correct = 0;
    const float inv_b = 1.0f / (float)B;
    for (int64_t i = 0; i < B; ++i) {
        const float *hb = h + i * H;
        float *z = scratch;
        logits_row(W, b, hb, H, C, z);
        int64_t y = labels[i];
        correct += argmax(z, C) == y;
        float zmax = z[0];
        for (int64_t c = 1; c < C; ++c) zmax = z[c] > zmax ? z[c] : zmax;
        double sum = 0.0;
        for (int64_t c = 0; c < C; ++c) sum += exp((double)(z[c] - zmax));
        double lse = (double)zmax + log(sum);
        total += lse - (double)z[y];
        /* dL/dz = (softmax(z) - onehot(y)) / B; then dW += dz^T h, db += dz, dh = dz W. */
        float *dhb = dh + i * H;
        memset(dhb, 0, sizeof(float) * (size_t)H);
        for (int64_t c = 0; c < C; ++c) {
            float g = ((float)exp((double)z[c] - lse) - (c == y ? 1.0f : 0.0f)) * inv_b;
            db[c] += g;
            float *dw = dW + c * H;
            const float *w = W + c * H;
            for (int64_t k = 0; k < H; ++k) {
                dw[k] += g * hb[k];
                dhb[k] += g * w[k];
            }
        }
    }
    *loss = total / (double)B;
    return correct;
}

int64_t head_count_correct(const float *W, const float *b, const float *h, const uint8_t *labels,
                           int64_t B, int64_t H, int64_t C) {
    float z[256];
    int64_t correct = 0;
    if (C > 256) return -1;
    for (int64_t i = 0; i < B; ++i) {
        logits_row(W, b, h + i * H, H, C, z);
        correct += argmax(z, C) == labels[i];
    }
    return correct;
}

void adam_init(adam_state *s, size_t n, float *m, float *v, float lr) {
    s->n = n;
    s->m = m;
    s->v = v;
    s->step = 0;
    s->lr = lr;
    s->beta1 = 0.9f;
    s->beta2 = 0.999f;
    s->eps = 1e-8f;
    memset(m, 0, n * sizeof(float));
    memset(v, 0, n * sizeof(float));
}

void adam_step(adam_state *s, float *params, const float *grads) {
    s->step += 1;
    const double bc1 = 1.0 - pow((double)s->beta1, (double)s->step);
    const double bc2 = 1.0 - pow((double)s->beta2, (double)s->step);
    /* torch: p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps) */
    const float step_size = (float)((double)s->lr / bc1);
    const float inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
    const float b1 = s->beta1, b2 = s->beta2, eps = s->eps;
    float *m = s->m, *v = s->v;
    for (size_t i = 0; i < s->n; ++i) {
        float g = grads[i];
        m[i] = b1 * m[i] + (1.0f - b1) * g;
        v[i] = b2 * v[i] + (1.0f - b2) * g * g;
        params[i] -= step_size * m[i] / (sqrtf(v[i]) * inv_sqrt_bc2 + eps);
    }
}

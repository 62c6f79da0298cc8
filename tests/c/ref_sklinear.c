#include "ref_sklinear.h"

#define REF_PI 3.14159265358979323846

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Element accessors in the reference layouts. */
#define IK(i, a, c) (((i) * c_->in + (a)) * c_->k + (c))
#define KO(i, c, o) (((i) * c_->k + (c)) * c_->out + (o))

void ref_skl_forward(const ref_skl_cfg *c_, const double *x, const double *S1, const double *S2,
                     const double *U1, const double *U2, const double *b, double *y) {
    double *t1 = malloc((size_t)c_->k * sizeof *t1), *t2 = malloc((size_t)c_->k * sizeof *t2);
    for (int64_t n = 0; n < c_->N; n++) {
        const double *xn = x + n * c_->in;
        double *yn = y + n * c_->out;
        for (int64_t o = 0; o < c_->out; o++) yn[o] = 0.0;
        for (int64_t i = 0; i < c_->L; i++) {
            for (int64_t c = 0; c < c_->k; c++) { /* t1 = x S1_i, t2 = x U2_i */
                double s1 = 0.0, s2 = 0.0;
                for (int64_t a = 0; a < c_->in; a++) {
                    s1 += xn[a] * S1[IK(i, a, c)];
                    s2 += xn[a] * U2[IK(i, a, c)];
                }
                t1[c] = s1, t2[c] = s2;
            }
            for (int64_t o = 0; o < c_->out; o++) {
                double s = 0.0;
                for (int64_t c = 0; c < c_->k; c++) s += t1[c] * U1[KO(i, c, o)] + t2[c] * S2[KO(i, c, o)];
                yn[o] += s;
            }
        }
        for (int64_t o = 0; o < c_->out; o++) yn[o] = yn[o] / (2.0 * (double)c_->L) + (b ? b[o] : 0.0);
    }
    free(t1);
    free(t2);
}

void ref_skl_backward(const ref_skl_cfg *c_, const double *x, const double *S1, const double *S2,
                      const double *U1, const double *U2, const double *dy, double *dx,
                      double *dS1, double *dS2, double *db) {
    const double s = 1.0 / (2.0 * (double)c_->L);
    const int64_t N = c_->N, in = c_->in, out = c_->out, L = c_->L, k = c_->k;
    /* g1[n, i, c] = s * sum_o dy[n, o] U1_i[c, o] (gradient w.r.t. x S1_i), g2 likewise with S2. */
    double *g1 = calloc((size_t)(N * L * k), sizeof *g1), *g2 = calloc((size_t)(N * L * k), sizeof *g2);
    for (int64_t n = 0; n < N; n++)
        for (int64_t i = 0; i < L; i++)
            for (int64_t c = 0; c < k; c++) {
                double a1 = 0.0, a2 = 0.0;
                for (int64_t o = 0; o < out; o++) {
                    a1 += dy[n * out + o] * U1[KO(i, c, o)];
                    a2 += dy[n * out + o] * S2[KO(i, c, o)];
                }
                g1[(n * L + i) * k + c] = s * a1;
                g2[(n * L + i) * k + c] = s * a2;
            }
    if (dx)
        for (int64_t n = 0; n < N; n++)
            for (int64_t a = 0; a < in; a++) {
                double acc = 0.0;
                for (int64_t i = 0; i < L; i++)
                    for (int64_t c = 0; c < k; c++)
                        acc += g1[(n * L + i) * k + c] * S1[IK(i, a, c)] +
                               g2[(n * L + i) * k + c] * U2[IK(i, a, c)];
                dx[n * in + a] = acc;
            }
    if (dS1)
        for (int64_t i = 0; i < L; i++)
            for (int64_t a = 0; a < in; a++)
                for (int64_t c = 0; c < k; c++) {
                    double acc = 0.0;
                    for (int64_t n = 0; n < N; n++) acc += x[n * in + a] * g1[(n * L + i) * k + c];
                    dS1[IK(i, a, c)] = acc;
                }
    if (dS2) {
        /* t2[n, i, c] = (x U2_i)[n, c], formed once (not once per output column) */
        double *t2 = malloc((size_t)(N * L * k) * sizeof *t2);
        for (int64_t n = 0; n < N; n++)
            for (int64_t i = 0; i < L; i++)
                for (int64_t c = 0; c < k; c++) {
                    double acc = 0.0;
                    for (int64_t a = 0; a < in; a++) acc += x[n * in + a] * U2[IK(i, a, c)];
                    t2[(n * L + i) * k + c] = acc;
                }
        for (int64_t i = 0; i < L; i++)
            for (int64_t c = 0; c < k; c++)
                for (int64_t o = 0; o < out; o++) {
                    double acc = 0.0;
                    for (int64_t n = 0; n < N; n++) acc += t2[(n * L + i) * k + c] * dy[n * out + o];
                    dS2[KO(i, c, o)] = s * acc;
                }
        free(t2);
    }
    if (db)
        for (int64_t o = 0; o < out; o++) {
            double acc = 0.0;
            for (int64_t n = 0; n < N; n++) acc += dy[n * out + o];
            db[o] = acc;
        }
    free(g1);
    free(g2);
}

double ref_skl_act(int act, double v) {
    switch (act) {
    case 1: return v > 0 ? v : 0;
    case 2: return v * 0.5 * erfc(-v / sqrt(2.0)); /* x Phi(x) */
    case 3: return 0.5 * v * (1.0 + tanh(sqrt(2.0 / REF_PI) * (v + 0.044715 * v * v * v)));
    case 4: return v / (1.0 + exp(-v));
    default: return v;
    }
}

double ref_skl_act_grad(int act, double v) {
    switch (act) {
    case 1: return v > 0 ? 1 : 0;
    case 2: return 0.5 * erfc(-v / sqrt(2.0)) + v * exp(-0.5 * v * v) / sqrt(2.0 * REF_PI);
    case 3: {
        const double c = sqrt(2.0 / REF_PI), u = c * (v + 0.044715 * v * v * v), t = tanh(u);
        return 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * v * v);
    }
    case 4: {
        const double sg = 1.0 / (1.0 + exp(-v));
        return sg + v * sg * (1.0 - sg);
    }
    default: return 1;
    }
}

static uint64_t ref_splitmix(uint64_t z) {
    z ^= z >> 30;
    z *= 0xBF58476D1CE4E5B9ull;
    z ^= z >> 27;
    z *= 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

int ref_skl_keep(uint64_t seed, uint64_t ctr, float p) {
    const uint64_t z = ref_splitmix(ref_splitmix(seed + 0x9E3779B97F4A7C15ull) ^ ctr);
    return ldexp((double)(z >> 40), -24) >= (double)p;
}

void ref_skl_epilogue(int act, float p, uint64_t seed, uint64_t offset, int64_t n,
                      const double *pre, double *y, const double *dy, double *g) {
    for (int64_t i = 0; i < n; i++) {
        const int keep = p > 0 ? ref_skl_keep(seed, offset + (uint64_t)i, p) : 1;
        const double m = keep ? (p > 0 ? 1.0 / (1.0 - p) : 1.0) : 0.0;
        y[i] = m * ref_skl_act(act, pre[i]);
        if (g) g[i] = dy[i] * m * ref_skl_act_grad(act, pre[i]);
    }
}

#include "ref_kan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void ref_kan_bases(int64_t G, int64_t k, const double *t, double x, double *B, double *dB) {
    const int64_t nk = G + 2 * k + 1;
    double *b = malloc((size_t)nk * sizeof *b), *d = malloc((size_t)nk * sizeof *d);
    /* Order 0: the indicator of each half-open knot interval [t_j, t_{j+1}), j = 0..nk-2. */
    for (int64_t j = 0; j + 1 < nk; j++) {
        b[j] = (x >= t[j] && x < t[j + 1]) ? 1.0 : 0.0;
        d[j] = 0.0;
    }
    /* Order p from order p - 1, indices j = 0..nk-2-p, ascending (b[j + 1] is still order p-1
     * when b[j] is overwritten). */
    for (int64_t p = 1; p <= k; p++)
        for (int64_t j = 0; j + p + 1 < nk; j++) {
            const double w1 = t[j + p] - t[j], w2 = t[j + p + 1] - t[j + 1];
            const double l = w1 != 0.0 ? (x - t[j]) / w1 : 0.0, dl = w1 != 0.0 ? 1.0 / w1 : 0.0;
            const double r = w2 != 0.0 ? (t[j + p + 1] - x) / w2 : 0.0,
                         dr = w2 != 0.0 ? -1.0 / w2 : 0.0;
            const double v = l * b[j] + r * b[j + 1];
            d[j] = dl * b[j] + l * d[j] + dr * b[j + 1] + r * d[j + 1];
            b[j] = v;
        }
    for (int64_t c = 0; c < G + k; c++) {
        B[c] = b[c];
        if (dB) dB[c] = d[c];
    }
    free(b);
    free(d);
}

static double silu(double x) { return x / (1.0 + exp(-x)); }
static double dsilu(double x) {
    const double s = 1.0 / (1.0 + exp(-x));
    return s + x * s * (1.0 - s);
}

/* Bases (and derivatives) of every (row, feature): [N, in, C]. */
static void all_bases(const ref_kan_cfg *c, const double *x, const double *grid, double *B,
                      double *dB) {
    const int64_t C = c->G + c->k, nk = c->G + 2 * c->k + 1;
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t i = 0; i < c->in; i++)
            ref_kan_bases(c->G, c->k, grid + i * nk, x[n * c->in + i], B + (n * c->in + i) * C,
                          dB ? dB + (n * c->in + i) * C : NULL);
}

void ref_kan_forward(const ref_kan_cfg *c, const double *x, const double *grid,
                     const double *base, const double *spline, const double *scaler, double *y) {
    const int64_t N = c->N, in = c->in, out = c->out, C = c->G + c->k;
    double *B = malloc((size_t)(N * in * C) * sizeof *B);
    all_bases(c, x, grid, B, NULL);
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < out; o++) {
            double acc = 0.0;
            for (int64_t i = 0; i < in; i++) {
                acc += silu(x[n * in + i]) * base[o * in + i];
                double s = 0.0;
                for (int64_t q = 0; q < C; q++)
                    s += B[(n * in + i) * C + q] * spline[(o * in + i) * C + q];
                acc += s * (scaler ? scaler[o * in + i] : 1.0);
            }
            y[n * out + o] = acc;
        }
    free(B);
}

void ref_kan_backward(const ref_kan_cfg *c, const double *x, const double *grid,
                      const double *base, const double *spline, const double *scaler,
                      const double *dy, double *dx, double *dbase, double *dspline,
                      double *dscaler) {
    const int64_t N = c->N, in = c->in, out = c->out, C = c->G + c->k;
    double *B = malloc((size_t)(N * in * C) * sizeof *B);
    double *dB = malloc((size_t)(N * in * C) * sizeof *dB);
    all_bases(c, x, grid, B, dB);
    if (dx)
        for (int64_t n = 0; n < N; n++)
            for (int64_t i = 0; i < in; i++) {
                double acc = 0.0;
                for (int64_t o = 0; o < out; o++) {
                    double g = base[o * in + i] * dsilu(x[n * in + i]), s = 0.0;
                    for (int64_t q = 0; q < C; q++)
                        s += spline[(o * in + i) * C + q] * dB[(n * in + i) * C + q];
                    g += s * (scaler ? scaler[o * in + i] : 1.0);
                    acc += dy[n * out + o] * g;
                }
                dx[n * in + i] = acc;
            }
    for (int64_t o = 0; o < out; o++)
        for (int64_t i = 0; i < in; i++) {
            double db = 0.0, dsc = 0.0;
            for (int64_t n = 0; n < N; n++) db += dy[n * out + o] * silu(x[n * in + i]);
            if (dbase) dbase[o * in + i] = db;
            for (int64_t q = 0; q < C; q++) {
                double g = 0.0; /* d loss / d (spline * scaler)[o, i, q] */
                for (int64_t n = 0; n < N; n++) g += dy[n * out + o] * B[(n * in + i) * C + q];
                if (dspline)
                    dspline[(o * in + i) * C + q] = g * (scaler ? scaler[o * in + i] : 1.0);
                dsc += g * spline[(o * in + i) * C + q];
            }
            if (dscaler) dscaler[o * in + i] = dsc;
        }
    free(B);
    free(dB);
}

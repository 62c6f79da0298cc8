// The CUDA backend's B-spline window (kf__bspline_window of common/bspline.h, the code the
// kernels of cuda/kan_cuda.cuh run) equals the vectorised evaluator the CPU backend and the grid
// refit use (kf__bspline_rows_s of the same header), compiled here for the host: on random knot vectors
// with repeated knots, at random points inside and outside the grid, at the knots themselves and
// at NaN, for every spline order the CUDA backend supports. And the derivative rule of the same
// header (kf__bspline_dwindow, KF__BSPLINE_DSTEP), which every backend's dx uses, equals a central
// difference of the float64 bases away from the knots.
#include <criterion/criterion.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "bspline.h"
#include "silu_deriv.h"

namespace {

constexpr int kMaxOrder = 15; // cuda/kan_cuda.cuh's bound

void check_case(std::mt19937 &rng, int G, int k) {
    const int64_t nk = G + 2 * k + 1, C = G + k;
    std::uniform_real_distribution<float> U(-2.0f, 2.0f);
    std::vector<float> t(nk);
    for (auto &v : t) v = U(rng);
    std::sort(t.begin(), t.end());
    if (nk > 3) t[nk / 2] = t[nk / 2 - 1]; // a repeated knot: a zero-width span
    std::vector<float> x;
    for (int n = 0; n < 64; ++n) x.push_back(U(rng) * 1.5f);
    for (float v : t) x.push_back(v);
    x.push_back(NAN);
    const int64_t rows = (int64_t)x.size();
    std::vector<float> inv(k > 0 ? k * nk : 1), xs(rows), S((nk - 1) * rows), full(C * rows);
    kf__bspline_inv_s(t.data(), nk, k, inv.data());
    kf__bspline_rows_s(t.data(), inv.data(), nk, k, x.data(), rows, xs.data(), S.data(),
                       full.data());
    for (int64_t n = 0; n < rows; ++n) {
        float Nw[kMaxOrder + 1];
        const int64_t j = kf__bspline_window<kMaxOrder>(t.data(), inv.data(), nk, k, x[n], Nw);
        std::vector<float> win(C, 0.0f);
        if (j >= 0)
            for (int r = 0; r <= k; ++r) {
                const int64_t c = j - k + r;
                if (c >= 0 && c < C) win[c] = Nw[r];
            }
        for (int64_t c = 0; c < C; ++c)
            cr_assert(std::fabs(win[c] - full[c * rows + n]) <= 1e-6f,
                      "G=%d k=%d x=%g basis %lld: window %.9g, vectorised %.9g", G, k,
                      (double)x[n], (long long)c, (double)win[c], (double)full[c * rows + n]);
    }
}

// nk sorted random knots in [-2, 2], one repeated (a zero-width span) where nk > 3.
std::vector<double> random_knots(std::mt19937 &rng, int64_t nk) {
    std::uniform_real_distribution<double> U(-2.0, 2.0);
    std::vector<double> t(nk);
    for (auto &v : t) v = U(rng);
    std::sort(t.begin(), t.end());
    if (nk > 3) t[nk / 2] = t[nk / 2 - 1];
    return t;
}

// `count` points inside the grid t, at least `gap` from every knot (where the bases are smooth).
std::vector<double> points_off_knots(std::mt19937 &rng, const std::vector<double> &t,
                                     size_t count, double gap) {
    std::uniform_real_distribution<double> U(-2.0, 2.0);
    std::vector<double> x;
    while (x.size() < count) {
        const double v = U(rng);
        bool near = !(v > t.front() && v < t.back());
        for (double tk : t) near = near || std::fabs(v - tk) < gap;
        if (!near) x.push_back(v);
    }
    return x;
}

// d/dx B_{c,k} from the order-(k-1) window against (B_{c,k}(x + h) - B_{c,k}(x - h)) / 2h.
void check_derivative(std::mt19937 &rng, int G, int k) {
    const int64_t nk = G + 2 * k + 1, C = G + k;
    const std::vector<double> t = random_knots(rng, nk), x = points_off_knots(rng, t, 48, 1e-3);
    const double h = 1e-7;
    const int64_t rows = (int64_t)x.size();
    std::vector<double> xp(rows), xm(rows), inv(k * nk), xs(rows), S((nk - 1) * rows),
        Bp(C * rows), Bm(C * rows);
    for (int64_t n = 0; n < rows; ++n) {
        xp[n] = x[n] + h;
        xm[n] = x[n] - h;
    }
    kf__bspline_inv_d(t.data(), nk, k, inv.data());
    kf__bspline_rows_d(t.data(), inv.data(), nk, k, xp.data(), rows, xs.data(), S.data(), Bp.data());
    kf__bspline_rows_d(t.data(), inv.data(), nk, k, xm.data(), rows, xs.data(), S.data(), Bm.data());
    const double *ik = inv.data() + (int64_t)(k - 1) * nk;
    for (int64_t n = 0; n < rows; ++n) {
        double Nw[kMaxOrder + 1];
        const int64_t j = kf__bspline_window<kMaxOrder>(t.data(), inv.data(), nk, k - 1, x[n], Nw);
        cr_assert(j >= 0, "x = %g is inside the grid", x[n]);
        std::vector<double> d(C, 0.0);
        for (int r = 0; r <= k; ++r) {
            const int64_t c = j - k + r;
            if (c >= 0 && c < C) d[c] = kf__bspline_dwindow<kMaxOrder>(ik, j, k, r, Nw);
        }
        for (int64_t c = 0; c < C; ++c) {
            const double fd = (Bp[c * rows + n] - Bm[c * rows + n]) / (2 * h);
            cr_assert(std::fabs(d[c] - fd) <= 1e-5 * (1 + std::fabs(fd)),
                      "G=%d k=%d x=%.17g basis %lld: derivative %.17g, central difference %.17g",
                      G, k, x[n], (long long)c, d[c], fd);
        }
    }
}

// kf__bspline_deriv_rows_d at order m against a central difference of its order m - 1, for
// m = 1..k, order k + 1 exactly 0, and the window form kf__bspline_deriv_window equal to it:
// random knots with a repeated one, points inside the grid away from the knots.
void check_deriv_rows(std::mt19937 &rng, int G, int k) {
    const int64_t nk = G + 2 * k + 1, C = G + k;
    std::vector<double> t = random_knots(rng, nk), x = points_off_knots(rng, t, 32, 1e-2);
    const double h = 1e-6;
    const int64_t rows = (int64_t)x.size();
    std::vector<double> xp(rows), xm(rows), inv(k * nk + 1), xs(rows), D((nk - 1) * rows),
        Dp((nk - 1) * rows), Dm((nk - 1) * rows);
    for (int64_t n = 0; n < rows; ++n) xp[n] = x[n] + h, xm[n] = x[n] - h;
    kf__bspline_inv_d(t.data(), nk, k, inv.data());
    for (int m = 1; m <= k + 1; ++m) {
        kf__bspline_deriv_rows_d(t.data(), inv.data(), nk, k, m, x.data(), rows, xs.data(), D.data());
        kf__bspline_deriv_rows_d(t.data(), inv.data(), nk, k, m - 1, xp.data(), rows, xs.data(),
                                 Dp.data());
        kf__bspline_deriv_rows_d(t.data(), inv.data(), nk, k, m - 1, xm.data(), rows, xs.data(),
                                 Dm.data());
        for (int64_t n = 0; n < rows; ++n) { // the window form: the same values
            double Nw[kMaxOrder + 1];
            const int64_t j = kf__bspline_deriv_window<kMaxOrder>(t.data(), inv.data(), nk, k, m,
                                                                  x[n], Nw);
            for (int64_t c = 0; c < C; ++c) {
                const int64_t r = c - (j - k);
                const double w = j >= 0 && r >= 0 && r <= k ? Nw[r] : 0.0;
                cr_assert(std::fabs(w - D[c * rows + n]) <= 1e-12 * (1 + std::fabs(w)),
                          "G=%d k=%d m=%d basis %lld: window %.17g, rows %.17g", G, k, m,
                          (long long)c, w, D[c * rows + n]);
            }
        }
        for (int64_t c = 0; c < C; ++c)
            for (int64_t n = 0; n < rows; ++n) {
                const double fd = (Dp[c * rows + n] - Dm[c * rows + n]) / (2 * h),
                             d = D[c * rows + n];
                if (m == k + 1) cr_assert(d == 0.0, "B^(k+1) = %g, expected 0", d);
                cr_assert(std::fabs(d - fd) <= 1e-4 * (1 + std::fabs(fd)),
                          "G=%d k=%d m=%d x=%.17g basis %lld: %.17g, central difference %.17g",
                          G, k, m, x[n], (long long)c, d, fd);
            }
    }
}

} // namespace

Test(bspline, deriv_rows_equal_central_differences) {
    std::mt19937 rng(987);
    for (int k = 0; k <= 5; ++k)
        for (int G = 1; G <= 5; ++G) check_deriv_rows(rng, G, k);
}

// SiLU^(m) (common/silu_deriv.h) against a central difference of SiLU^(m-1), m = 1..8, and
// SiLU^(0) = x / (1 + e^-x).
Test(bspline, silu_deriv_equals_central_difference) {
    const double h = 1e-5;
    for (double x = -6.0; x <= 6.0; x += 0.37) {
        cr_assert(std::fabs(kf__silu_deriv(x, 0) - x / (1 + std::exp(-x))) <= 1e-15 * (1 + std::fabs(x)));
        for (int m = 1; m <= 8; ++m) {
            const double fd = (kf__silu_deriv(x + h, m - 1) - kf__silu_deriv(x - h, m - 1)) / (2 * h),
                         d = kf__silu_deriv(x, m);
            cr_assert(std::fabs(d - fd) <= 1e-6 * (1 + std::fabs(fd)), "x=%g m=%d: %.17g vs %.17g", x,
                      m, d, fd);
        }
    }
}

Test(bspline, derivative_equals_central_difference) {
    std::mt19937 rng(4321);
    for (int k = 1; k <= 6; ++k)
        for (int G = 1; G <= 6; ++G) check_derivative(rng, G, k);
}

Test(bspline, cuda_window_equals_vectorised_evaluator) {
    std::mt19937 rng(1234);
    for (int k = 0; k <= kMaxOrder; ++k)
        for (int G = 1; G <= 6; ++G) check_case(rng, G, k);
}

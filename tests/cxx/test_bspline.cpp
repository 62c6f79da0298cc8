// The CUDA backend's B-spline window (kf__bspline_window of common/bspline.h, the code
// cuda/kan_linear.cu runs) equals the vectorised evaluator the CPU backend and the grid refit use
// (kf__bspline_rows_f of the same header), compiled here for the host: on random knot vectors
// with repeated knots, at random points inside and outside the grid, at the knots themselves and
// at NaN, for every spline order the CUDA backend supports.
#include <criterion/criterion.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "bspline.h"

KF__BSPLINE_DEFINE(float, f)

namespace {

constexpr int kMaxOrder = 15; // cuda/kan_linear.cu's bound

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
    kf__bspline_inv_f(t.data(), nk, k, inv.data());
    kf__bspline_rows_f(t.data(), inv.data(), nk, k, x.data(), rows, xs.data(), S.data(),
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

} // namespace

Test(bspline, cuda_window_equals_vectorised_evaluator) {
    std::mt19937 rng(1234);
    for (int k = 0; k <= kMaxOrder; ++k)
        for (int G = 1; G <= 6; ++G) check_case(rng, G, k);
}

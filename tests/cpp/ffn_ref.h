// Double-precision references shared by the FFN C++ tests (test_mlp.cpp, test_moe.cpp): the
// formulas of modeling_glm5_next.py written as plain loops.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "memra/tensor.h"

namespace memra::testing {

inline Weight f32_weight(const std::vector<float>& v, int64_t rows, int64_t cols) {
  return Weight(DType::kF32, {rows, cols}, v.data());
}

inline double sig(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// y [N] = w [N, K] x [K] in double.
inline std::vector<double> matvec(const std::vector<float>& w, const double* x, int N, int K) {
  std::vector<double> y(N, 0.0);
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k) y[n] += double(w[size_t(n) * K + k]) * x[k];
  return y;
}

struct ClampStats {
  int gate_clamped = 0, up_clamped = 0;
};

// Glm5NextTextMLP.forward on one token, in double.
inline std::vector<double> mlp_ref(const float* x, int D, int I, const std::vector<float>& gw,
                                   const std::vector<float>& uw, const std::vector<float>& dw,
                                   double limit, ClampStats* st = nullptr) {
  std::vector<double> xd(x, x + D);
  auto g = matvec(gw, xd.data(), I, D), u = matvec(uw, xd.data(), I, D);
  std::vector<double> h(I);
  for (int i = 0; i < I; ++i) {
    if (st && g[i] > limit) st->gate_clamped++;
    if (st && std::abs(u[i]) > limit) st->up_clamped++;
    const double gc = std::min(g[i], limit), uc = std::max(-limit, std::min(u[i], limit));
    h[i] = gc * sig(gc) * uc;
  }
  return matvec(dw, h.data(), D, I);
}

}  // namespace memra::testing

// y = x w^T (+ bias): the CPU reference (cpu/linear.h).
#include "memra/cpu/linear.h"

#include <vector>

namespace memra::cpu {

void linear(const float* x, int T, const WeightView& w, const float* bias, float* y) {
  const int64_t N = w.rows, K = w.cols;
  std::vector<float> row(static_cast<size_t>(K));
  // Weight-row outer loop: each row is converted from its file dtype once per call and reused
  // for every token (the "converted per tile" rule for the reference backend).
  for (int64_t n = 0; n < N; ++n) {
    w.row_f32(n, row.data());
    for (int t = 0; t < T; ++t) {
      const float* xt = x + static_cast<int64_t>(t) * K;
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) acc += xt[k] * row[k];
      if (bias) acc += bias[n];
      y[static_cast<int64_t>(t) * N + n] = acc;
    }
  }
}

}  // namespace memra::cpu

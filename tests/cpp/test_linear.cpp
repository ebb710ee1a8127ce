// cpu::linear against a double-precision loop written here.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "memra/ops.h"
#include "test_util.h"

namespace memra {
namespace {

using memra::testing::randn;

TEST(Linear, Bf16MatchesDoubleLoop) {
  const int T = 3, N = 5, K = 7;
  auto x = randn(T * K, 1);
  auto wf = randn(N * K, 2);
  std::vector<uint16_t> wb(N * K);
  for (int i = 0; i < N * K; ++i) wb[i] = f32_to_bf16(wf[i]);
  Weight w(DType::kBF16, {N, K}, wb.data());
  auto bias = randn(N, 3);
  std::vector<float> y(T * N);
  cpu::linear(x.data(), T, w, bias.data(), y.data());
  for (int t = 0; t < T; ++t)
    for (int n = 0; n < N; ++n) {
      double acc = bias[n];
      for (int k = 0; k < K; ++k) acc += double(x[t * K + k]) * bf16_to_f32(wb[n * K + k]);
      EXPECT_NEAR(y[t * N + n], acc, 1e-5);
    }
}

}  // namespace
}  // namespace memra

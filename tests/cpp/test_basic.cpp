// Basic CPU ops against double-precision loops written here.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "memra/ops.h"
#include "test_util.h"

namespace memra {
namespace {

using memra::testing::randn;

TEST(Basic, Bf16RoundTripIsNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(3.140625f)), 3.140625f);
  // 1 + 2^-8 is exactly half-way between 1 and 1 + 2^-7: ties go to even (1.0).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
}

TEST(Basic, RopeRejectsOddDim) {
  std::vector<float> x(3, 1.0f);
  int32_t pos = 0;
  EXPECT_EQ(cpu::rope_interleaved(x.data(), &pos, 1, 1, 3, 10000.0f).code, kContractOddRope);
}

TEST(Basic, RmsNormUnweighted) {
  const int T = 2, D = 6;
  auto x = randn(T * D, 4);
  std::vector<float> y(T * D);
  cpu::rms_norm(x.data(), T, D, nullptr, 1e-5f, y.data());
  for (int t = 0; t < T; ++t) {
    double ss = 0;
    for (int i = 0; i < D; ++i) ss += double(x[t * D + i]) * x[t * D + i];
    const double inv = 1.0 / std::sqrt(ss / D + 1e-5);
    for (int i = 0; i < D; ++i) EXPECT_NEAR(y[t * D + i], x[t * D + i] * inv, 1e-6);
  }
}

}  // namespace
}  // namespace memra

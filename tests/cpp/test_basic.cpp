// Basic CPU ops against double-precision loops written here, and op::s CPU branch of the basic
// ops against the reference ops it runs (the same bytes) and the CUDA entries' refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "memra/op/basic.h"
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

// ---------------------------------------------------------------- op:: on the CPU

bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(OpBasic, NormRowsAreTheirOwnCallsAndSkipEmptyRows) {
  const int D0 = 7, D1 = 5, D2 = 9;
  auto x0 = randn(D0, 30), x1 = randn(D1, 31), x2 = randn(D2, 32);
  auto w0 = randn(D0, 33), w2 = randn(D2, 34), b2 = randn(D2, 35);
  std::vector<float> y0(D0), y1(D1), y2(D2), r0(D0), r1(D1), r2(D2);
  const MemraNormRowsParams p{x0.data(), D0, w0.data(), 1e-5f, y0.data(),
                              x1.data(), D1, nullptr,   1e-6f, y1.data(),
                              x2.data(), D2, w2.data(), b2.data(), 1e-6f, y2.data()};
  ASSERT_TRUE(op::norm_rows(op::Backend{}, p).ok());
  cpu::rms_norm(x0.data(), 1, D0, w0.data(), 1e-5f, r0.data());
  cpu::rms_norm(x1.data(), 1, D1, nullptr, 1e-6f, r1.data());
  cpu::layer_norm(x2.data(), 1, D2, w2.data(), b2.data(), 1e-6f, r2.data());
  EXPECT_TRUE(same_bytes(y0, r0) && same_bytes(y1, r1) && same_bytes(y2, r2));
  // A null x skips its row (y untouched); a row that runs without its y is refused.
  MemraNormRowsParams q = p;
  q.x2 = nullptr;
  std::vector<float> keep(D2, -3.0f);
  q.y2 = keep.data();
  ASSERT_TRUE(op::norm_rows(op::Backend{}, q).ok());
  EXPECT_EQ(keep, std::vector<float>(D2, -3.0f));
  q.y1 = nullptr;
  EXPECT_EQ(op::norm_rows(op::Backend{}, q).code, kContractMissing);
  q = p;
  q.w2 = nullptr;
  EXPECT_EQ(op::norm_rows(op::Backend{}, q).code, kContractMissing);
  q = p;
  q.D1 = -1;
  EXPECT_EQ(op::norm_rows(op::Backend{}, q).code, kContractValue);
}

TEST(OpBasic, AddRmsNormIsAddThenRmsNorm) {
  const int T = 3, D = 8;
  auto x = randn(T * D, 40), y = randn(T * D, 41), w = randn(D, 42);
  std::vector<float> sum(T * D), h(T * D), rs(T * D), rh(T * D);
  ASSERT_TRUE(op::add_rms_norm(op::Backend{}, x.data(), y.data(), T, D, w.data(), 1e-6f,
                               sum.data(), h.data()).ok());
  for (int i = 0; i < T * D; ++i) rs[i] = x[i] + y[i];
  cpu::rms_norm(rs.data(), T, D, w.data(), 1e-6f, rh.data());
  EXPECT_TRUE(same_bytes(sum, rs));
  EXPECT_TRUE(same_bytes(h, rh));
}

TEST(OpBasic, SigmoidIsTheLogistic) {
  const std::vector<float> x = {-3.0f, 0.0f, 0.5f, 20.0f};
  std::vector<float> y(x.size());
  ASSERT_TRUE(op::sigmoid(op::Backend{}, x.data(), int64_t(x.size()), y.data()).ok());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(y[i], 1.0 / (1.0 + std::exp(-double(x[i]))), 1e-7);
  }
}

TEST(OpBasic, RefusalsNameTheOpAndFollowTheCudaEntries) {
  std::vector<float> x(6, 1.0f), y(6);
  int32_t pos = 0;
  const Status odd = op::rope_interleaved(op::Backend{}, x.data(), &pos, 1, 1, 3, 10000.0f);
  EXPECT_EQ(odd.code, kContractOddRope);
  EXPECT_NE(odd.message.find("d_rope=3"), std::string::npos);
  EXPECT_EQ(op::rms_norm(op::Backend{}, x.data(), -1, 6, nullptr, 1e-6f, y.data()).code,
            kContractValue);
  EXPECT_EQ(op::rms_norm(op::Backend{}, nullptr, 1, 6, nullptr, 1e-6f, y.data()).code,
            kContractMissing);
  EXPECT_TRUE(op::rms_norm(op::Backend{}, nullptr, 0, 6, nullptr, 1e-6f, nullptr).ok());
  EXPECT_EQ(op::layer_norm(op::Backend{}, x.data(), 1, 6, nullptr, x.data(), 1e-6f, y.data()).code,
            kContractMissing);
  EXPECT_EQ(op::l2norm_heads(op::Backend{}, x.data(), 1, -2, 3, 1e-6f).code, kContractValue);
  EXPECT_EQ(op::sigmoid(op::Backend{}, x.data(), -1, y.data()).code, kContractValue);
  EXPECT_EQ(op::add(op::Backend{}, x.data(), nullptr, 6, y.data()).code, kContractMissing);
  const MemraEmbeddingParams e{x.data(), 0, 3, 2, nullptr, 1, 0, y.data()};
  EXPECT_EQ(op::embedding(op::Backend{}, e).code, kContractValue);  // hc 0
}

}  // namespace
}  // namespace memra

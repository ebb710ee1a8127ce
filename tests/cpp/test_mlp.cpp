// The clamped SwiGLU MLP: cpu::swiglu_mlp against a double-precision loop (the formula of
// modeling_glm5_next.py), and op::swiglu_mlp's CPU branch (the add, the checks in the CUDA entry's
// order).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "ffn_ref.h"
#include "memra/op/mlp.h"
#include "memra/ops.h"
#include "test_util.h"

namespace memra {
namespace {

using memra::testing::ClampStats;
using memra::testing::f32_weight;
using memra::testing::mlp_ref;
using memra::testing::randn;

TEST(FfnSwiglu, MatchesDoubleLoopWithClampEngaged) {
  const int T = 5, D = 13, I = 11;
  const float limit = 1.5f;
  auto x = randn(T * D, 1, 1.0f);
  auto gw = randn(I * D, 2, 0.8f), uw = randn(I * D, 3, 0.8f), dw = randn(D * I, 4, 0.3f);
  std::vector<float> y(T * D);
  cpu::swiglu_mlp(x.data(), T, f32_weight(gw, I, D), f32_weight(uw, I, D), f32_weight(dw, D, I),
                  limit, y.data());
  ClampStats st;
  double max_err = 0;
  for (int t = 0; t < T; ++t) {
    auto ref = mlp_ref(x.data() + t * D, D, I, gw, uw, dw, limit, &st);
    for (int d = 0; d < D; ++d) max_err = std::max(max_err, std::abs(y[t * D + d] - ref[d]));
  }
  EXPECT_LT(max_err, 2e-5);
  EXPECT_GT(st.gate_clamped, 0);  // the clamp must be exercised, in both directions for up
  EXPECT_GT(st.up_clamped, 0);
}

// ---------------------------------------------------------------- op::swiglu_mlp (CPU)

MemraMlpParams mlp_params(const float* x, int T, int D, const std::vector<float>& gw,
                          const std::vector<float>& uw, const std::vector<float>& dw, int I,
                          float limit, const float* add, float* y) {
  MemraMlpParams p{};
  p.x = x;
  p.T = T;
  p.D = D;
  p.gate_w = gw.data();
  p.up_w = uw.data();
  p.down_w = dw.data();
  p.w_dtype = static_cast<int>(DType::kF32);
  p.I = I;
  p.limit = limit;
  p.add = add;
  p.y = y;
  return p;
}

TEST(OpMlp, CpuIsTheReferenceThenTheAdd) {
  const int T = 4, D = 9, I = 6;
  auto x = randn(T * D, 31), add = randn(T * D, 32);
  auto gw = randn(I * D, 33, 0.8f), uw = randn(I * D, 34, 0.8f), dw = randn(D * I, 35, 0.3f);
  std::vector<float> want(T * D), y(T * D), y_add(T * D);
  cpu::swiglu_mlp(x.data(), T, f32_weight(gw, I, D), f32_weight(uw, I, D), f32_weight(dw, D, I),
                  1.5f, want.data());
  ASSERT_TRUE(op::swiglu_mlp({}, mlp_params(x.data(), T, D, gw, uw, dw, I, 1.5f, nullptr,
                                            y.data())).ok());
  EXPECT_EQ(y, want);
  ASSERT_TRUE(op::swiglu_mlp({}, mlp_params(x.data(), T, D, gw, uw, dw, I, 1.5f, add.data(),
                                            y_add.data())).ok());
  for (int i = 0; i < T * D; ++i) EXPECT_EQ(y_add[i], want[i] + add[i]);
}

TEST(OpMlp, CpuChecksAsTheCudaEntry) {
  const int T = 2, D = 3, I = 2;
  auto x = randn(T * D, 36), add = randn(T * D, 37);
  auto gw = randn(I * D, 38), uw = randn(I * D, 39), dw = randn(D * I, 40);
  std::vector<float> y(T * D, 7.0f);
  auto p = mlp_params(x.data(), T, D, gw, uw, dw, I, 1.0f, nullptr, y.data());
  auto code = [](const MemraMlpParams& q) { return op::swiglu_mlp({}, q).code; };
  MemraMlpParams q = p;
  q.I = -1;
  q.w_dtype = 9;  // the value check comes first
  EXPECT_EQ(code(q), kContractValue);
  q = p;
  q.w_dtype = 3;
  EXPECT_EQ(code(q), kContractDType);
  q = p;
  q.limit = 0.0f;
  EXPECT_EQ(code(q), kContractValue);
  q = p;
  q.limit = NAN;
  EXPECT_EQ(code(q), kContractValue);
  q = p;
  q.T = 0;
  q.x = nullptr;  // nothing to do: no pointer is read
  EXPECT_EQ(code(q), kOk);
  q = p;
  q.down_w = nullptr;
  EXPECT_EQ(code(q), kContractMissing);
  EXPECT_EQ(y, std::vector<float>(T * D, 7.0f));  // nothing written on error
  q = p;
  q.I = 0;
  q.gate_w = q.up_w = q.down_w = nullptr;  // an empty MLP: y = add
  q.add = add.data();
  EXPECT_EQ(code(q), kOk);
  EXPECT_EQ(y, add);
}

}  // namespace
}  // namespace memra
